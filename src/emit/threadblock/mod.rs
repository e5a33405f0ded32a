//! Threadblock kernels of the [`CodePath::Sm80`](crate::sched::plan::CodePath::Sm80) path:
//! one `__global__` kernel per customized operator, printed from its [`KernelPlan`].
//!
//! The kernel declares its shared-memory tiles at the plan's offsets, computes each input's and
//! output's block offset from the grid maps and the DTensor strides, initialises the
//! accumulators (registers or shared memory), then runs the schedule: the pre-loop steps, the
//! for-loop (with the plan's `cp.async` ring for pipelined inputs), register write-backs and
//! accumulator finalisation, and the post-loop steps, with `__syncthreads()` exactly where the
//! schedule puts barriers ([`chain`]: one pass per chain; [`matmul`]: tensor-core and FMA
//! products; [`copy`]: tile copies).
//!
//! Every tile access goes through the tile's compile-time layout (its strides and swizzle),
//! walked in the order the plan gives the chain.

mod chain;
mod copy;
mod matmul;
mod rows;

use std::collections::BTreeSet;

use super::cxx::{self, Writer};
use super::ir::{
    AliasType, Expr, F32Const, Fold, Func, IntType, KernelParam, LoopForm, Method, Nested, Param,
    Signature, Stmt, Sym, TArg, Ty,
};
use super::launch::{KernelLaunch, TensorMapSpec};
use super::{EmitError, KernelView};
use crate::graph::arena::Handle;
use crate::graph::kernel::{KernelGraph, KnOp, KnOpKind};
use crate::graph::ops::{AccumKind, TbReduction, UnaryOp};
use crate::graph::shape::Shape;
use crate::graph::threadblock::{STensor, TbGraph, TbOp, TbOpKind};
use crate::layout::swizzle::Swizzle;
use crate::sched::ops::{AccumStorage, OpPlan};
use crate::sched::order::{BarrierReason, Phase, Step};
use crate::sched::plan::{
    GraphPlan, GridSplit, KernelPlan, LoopIndices, Prefetch, Ring, RingStart, Split, WriteBack,
};

/// What the printing of one kernel needs: the graph and plan, the body being written, and the
/// layout aliases declared so far.
pub(super) struct Ctx<'a> {
    g: &'a KernelGraph,
    plan: &'a GraphPlan,
    kn: Handle<KnOp>,
    op: &'a KnOp,
    tb: &'a TbGraph,
    kp: &'a KernelPlan,
    /// Threads per block.
    nt: usize,
    /// Type → alias name.
    aliases: Vec<(AliasType, String)>,
    /// The loop's ring of pipeline stages ([`KernelPlan::ring`]).
    ring_plan: Option<Ring>,
    /// The tiles of the ring's inputs (read through their current slot, `s<t>_cur`).
    ring_tiles: BTreeSet<usize>,
    /// While a vectorised chain is emitted ([`crate::sched::ChainPlan::vector`]): the vector
    /// loads of its step (tile reads then name element `j` of them).
    vector_loads: Option<(usize, Vec<Stmt>)>,
    /// While a vectorised chain is emitted: the tiles it reads once per step
    /// ([`crate::sched::ChainPlan::broadcast_reads`]).
    broadcast_reads: Vec<usize>,
    /// The statements of the body (of the loop while [`Ctx::nested`] builds it).
    body: Vec<Stmt>,
    /// The pipeline ring's statements as printed: the prologue, the loop's waits for the
    /// current stage, the refill block ([`crate::emit::Emitted::rings`]).
    ring: Vec<Stmt>,
}

impl Ctx<'_> {
    /// Step `i` of phase `ph`'s schedule (`i` = the phase's step count: its end): first the
    /// wait for `cp.async` copies the plan puts there ([`crate::sched::plan::CopyWaits`]), then
    /// the step's barrier.
    fn step_barrier(
        &mut self,
        ph: Phase,
        i: usize,
        barrier: Option<BarrierReason>,
    ) -> Result<(), EmitError> {
        let mut out = Vec::new();
        if self.kp.copy_waits.before(ph, i) {
            out.push(Stmt::Eval(Expr::Call(Func::CpAsyncWaitAll, vec![])));
        }
        if let Some(reason) = barrier {
            out.push(Stmt::Barrier {
                reason,
                noted: false,
            });
        }
        self.push(out);
        Ok(())
    }

    fn err(&self, reason: String) -> EmitError {
        EmitError::Unsupported {
            op: self.kn.index(),
            name: "kn_customized_op".into(),
            reason,
        }
    }

    fn internal(&self, what: &str) -> EmitError {
        self.err(format!("internal: {what}"))
    }

    /// An alias `Ln` for type `ty` (declared once at the top of the kernel).
    fn alias(&mut self, ty: AliasType) -> String {
        if let Some((_, a)) = self.aliases.iter().find(|(t, _)| *t == ty) {
            return a.clone();
        }
        let name = format!("L{}", self.aliases.len());
        self.aliases.push((ty, name.clone()));
        name
    }

    /// The element type of the device tensors.
    fn dtype(&self) -> crate::graph::DType {
        self.g.tensors[self.op.outputs[0]].dtype
    }

    /// The element type tile `t` is stored in (the plan's).
    fn tile_dtype(&self, t: Handle<STensor>) -> crate::graph::DType {
        self.kp.tiles[t.index()]
            .as_ref()
            .map_or(self.tb.tensors[t].dtype, |g| g.dtype)
    }

    /// Appends statements to the body.
    pub(super) fn push(&mut self, stmts: Vec<Stmt>) {
        self.body.extend(stmts);
    }

    /// The statements `f` adds: the body of a loop or a conditional.
    fn nested(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<(), EmitError>,
    ) -> Result<Vec<Stmt>, EmitError> {
        let outer = std::mem::take(&mut self.body);
        let done = f(self);
        let inner = std::mem::replace(&mut self.body, outer);
        done.map(|()| inner)
    }

    /// A barrier for `reason` (its note printed where `noted`).
    fn barrier(&mut self, reason: BarrierReason, noted: bool) -> Result<(), EmitError> {
        self.push(vec![Stmt::Barrier { reason, noted }]);
        Ok(())
    }

    /// The pointer of tile `t` (the current pipeline slot for pipelined inputs).
    fn tile_ref(&self, t: Handle<STensor>) -> String {
        if self.ring_tiles.contains(&t.index()) {
            format!("s{}_cur", t.index())
        } else {
            format!("s{}", t.index())
        }
    }

    /// The layout of tile `t` walked in `order`.
    fn tile_layout(&mut self, t: Handle<STensor>, order: &[usize]) -> Result<String, EmitError> {
        let geo = self.kp.tiles[t.index()]
            .as_ref()
            .ok_or_else(|| self.internal(&format!("tile s{} has no shared memory", t.index())))?;
        let shape = self.tb.tensors[t].shape;
        let (dims, strides) = geo.layout_dims(&shape, order);
        let swizzle = geo.swizzle;
        Ok(self.alias(AliasType::layout(&dims, &strides, Some(swizzle))))
    }

    /// A layout over `space` (in `order`) for an operand of shape `shape` with `strides`:
    /// dims where the operand has extent 1 but the space does not are broadcast (stride 0).
    fn strided_layout(
        &mut self,
        space: &Shape,
        shape: &Shape,
        strides: &[usize],
        order: &[usize],
        swizzle: Option<Swizzle>,
    ) -> String {
        let dims: Vec<usize> = order.iter().map(|&d| space.dim(d)).collect();
        let st: Vec<usize> = order
            .iter()
            .map(|&d| {
                if shape.dim(d) == 1 && space.dim(d) > 1 {
                    0
                } else {
                    strides[d]
                }
            })
            .collect();
        self.alias(AliasType::layout(&dims, &st, swizzle))
    }

    /// The compute-type value of tile `t` at element `e` of `space` walked in `order`
    /// (broadcast where the tile has extent 1).
    fn tile_read(
        &mut self,
        t: Handle<STensor>,
        space: &Shape,
        order: &[usize],
        e: &Expr,
    ) -> Result<Expr, EmitError> {
        let geo = self.kp.tiles[t.index()]
            .as_ref()
            .ok_or_else(|| self.internal(&format!("tile s{} has no shared memory", t.index())))?;
        let (strides, swizzle) = (geo.strides.0.clone(), geo.swizzle);
        let shape = self.tb.tensors[t].shape;
        let l = self.strided_layout(space, &shape, &strides, order, Some(swizzle));
        let (p, c) = (Expr::var(self.tile_ref(t)), self.dtype().compute());
        let broadcast = self.broadcast_reads.contains(&t.index());
        if self.vector_loads.is_some()
            && broadcast
                != order
                    .last()
                    .is_some_and(|&d| shape.dim(d) == 1 && space.dim(d) > 1)
        {
            return Err(self.internal(&format!(
                "the plan's broadcast reads {:?} disagree with tile s{}'s shape",
                self.broadcast_reads,
                t.index()
            )));
        }
        if let Some((v, loads)) = self.vector_loads.as_mut()
            && !broadcast
        {
            // One vector load per step (the plan made every step contiguous and aligned).
            let name = format!("in{}_", loads.len());
            loads.push(Stmt::local(
                Ty::ConstAuto,
                name.clone(),
                Expr::TemplateCall(
                    Func::TbLoadRun,
                    vec![TArg::int(*v), TArg::Elem(c)],
                    vec![p.plus(Expr::LayoutOffset(l, Box::new(Expr::var("e"))))],
                ),
            ));
            return Ok(Expr::Index(
                Box::new(Expr::var(name)),
                Box::new(Expr::var("j")),
            ));
        }
        Ok(Expr::Call(
            Func::ToCompute,
            vec![Expr::Index(
                Box::new(p),
                Box::new(Expr::LayoutOffset(l, Box::new(e.clone()))),
            )],
        ))
    }

    /// The walk order the plan gives the chain containing `op`.
    fn order(&self, op: Handle<TbOp>) -> Vec<usize> {
        self.kp.chains[self.kp.fusion.chain_of[op.index()]]
            .order
            .clone()
    }

    /// Global base pointer and layout of a threadblock output's DTensor region over `space`.
    fn global_out(
        &mut self,
        out: Handle<TbOp>,
        space: &Shape,
        order: &[usize],
    ) -> Result<(String, String), EmitError> {
        let TbOpKind::Output { output, .. } = self.tb.ops[out].kind else {
            return Err(self.internal("a global store names an operator that is no output"));
        };
        let dt = self.op.outputs[output];
        let strides = self.plan.dtensors[dt.index()].strides.0.clone();
        let l = self.strided_layout(space, space, &strides, order, None);
        Ok((format!("go{}", out.index()), l))
    }

    /// Whether accumulator `a` keeps its state in registers.
    fn in_registers(&self, a: Handle<TbOp>) -> bool {
        matches!(&self.kp.ops[a.index()], OpPlan::Accum { storage, .. } if storage.in_registers())
    }

    /// Whether accumulator `a` reduces its tile's last dim.
    /// The value a chain stores into tile `t`: `v`, or `v + 0` where `t` is an accumulator's
    /// tile written once (the sum 0 + v, which turns −0 into +0).
    fn stored_value(&self, t: Handle<STensor>, v: Expr) -> Expr {
        let once = self.tb.producer(t).is_some_and(|p| {
            matches!(
                self.kp.ops[p.index()],
                OpPlan::Accum {
                    storage: AccumStorage::WrittenOnce,
                    ..
                }
            )
        });
        if once {
            v.plus(Expr::Number(0.0, self.dtype().compute()))
        } else {
            v
        }
    }

    fn accum_reduces(&self, a: Handle<TbOp>) -> bool {
        matches!(self.tb.ops[a].kind, TbOpKind::Accum(k) if k.reduces_last_dim())
    }
}

/// A threadblock kernel as printed: its text, its launch, its pipeline ring as statements, and
/// its body as statements (the parts still written as lines among them as text).
pub(super) struct ThreadblockKernel {
    pub view: KernelView,
    pub launch: KernelLaunch,
    pub ring: super::ir::KernelBody,
    pub body: super::ir::KernelBody,
}

/// Emits the kernel of customized operator `kn` (plan `kp`), its launch-plan entry and its
/// pipeline ring's statements.
pub(super) fn emit(
    g: &KernelGraph,
    plan: &GraphPlan,
    kn: Handle<KnOp>,
    op: &KnOp,
    kp: &KernelPlan,
) -> Result<ThreadblockKernel, EmitError> {
    let KnOpKind::Customized(tb) = &op.kind else {
        return Err(EmitError::Unsupported {
            op: kn.index(),
            name: op.kind.name(),
            reason: "internal: a threadblock plan for an operator without a threadblock graph"
                .into(),
        });
    };
    let mut ctx = Ctx {
        g,
        plan,
        kn,
        op,
        tb,
        kp,
        nt: kp.cta.threads,
        aliases: Vec::new(),
        ring_plan: kp.ring(),
        ring_tiles: BTreeSet::new(),
        vector_loads: None,
        broadcast_reads: Vec::new(),
        ring: Vec::new(),
        body: Vec::new(),
    };
    if let Some(r) = &ctx.ring_plan {
        for op in r.cp_async.iter().chain(&r.tma) {
            ctx.ring_tiles
                .insert(tb.ops[Handle::from_index(*op)].outputs[0].index());
        }
    }
    let (params, args) = signature(&ctx);
    if let Some(r) = kp.rows() {
        let stmts = ctx.rows_body(r)?;
        ctx.push(stmts);
    } else {
        tile_body(&mut ctx)?;
    }
    let name = plan.symbols.kernel(&format!("k{}_customized", kn.index()));
    // The aliases first, in the order the body asked for them.
    let mut stmts: Vec<Stmt> = std::mem::take(&mut ctx.aliases)
        .into_iter()
        .map(|(ty, name)| Stmt::Using { name, ty })
        .collect();
    stmts.append(&mut ctx.body);
    let mut text = Writer::at(1);
    super::ir::print(&mut text, &stmts);
    let text = text.finish();
    let comment = format!(
        "kernel op {}: kn_customized_op grid ({}, {}, {}), block ({}, {}, {}), forloop {}, {} bytes of shared memory",
        kn.index(),
        kp.cta.grid[0],
        kp.cta.grid[1],
        kp.cta.grid[2],
        kp.cta.block[0],
        kp.cta.block[1],
        kp.cta.block[2],
        tb.forloop_range,
        kp.smem.total,
    );
    let sig = Signature {
        bounds: (kp.cta.threads, Some(kp.cta.min_blocks_per_sm)),
        cluster: kp.cluster_dims(),
        elem: ctx.dtype(),
        params,
    };
    let mut view = KernelView {
        comment: cxx::comment(&comment, 0),
        preamble: String::new(),
        signature: cxx::typed_kernel_signature(&name, &sig),
        body: text,
    };
    view.comment.extend(cxx::comment(
        &format!("schedule {}", kp.schedule.compact(&kp.fusion)),
        0,
    ));
    let tensor_maps = kp
        .tma
        .maps()
        .into_iter()
        .map(|(_, l, boxes)| TensorMapSpec {
            binding: plan.binding(op.inputs[l.input], l.dtype.bytes()),
            data_type: l.data_type,
            dims: l.dims.clone(),
            strides: l.strides.clone(),
            boxes,
            swizzle: l.swizzle,
        })
        .collect();
    let launch = KernelLaunch {
        name,
        grid: kp.launch_grid().map(|x| x as u32),
        block: kp.cta.block.map(|x| x as u32),
        dynamic_smem: kp.smem.total as u32,
        args,
        tensor_maps,
        programmatic: kp.dependent.is_programmatic(),
    };
    let ring = super::ir::KernelBody {
        name: launch.name.clone(),
        signature: None,
        body: ctx.ring,
    };
    let body = super::ir::KernelBody {
        name: launch.name.clone(),
        signature: Some(sig),
        body: stmts,
    };
    Ok(ThreadblockKernel {
        view,
        launch,
        ring,
        body,
    })
}

/// The body over the schedule's shared-memory tiles: prologue, pre-loop steps, accumulators,
/// the for-loop, and the post-loop steps; the ring's prologue ahead of the pre-loop steps
/// where the plan puts it there ([`RingStart::BeforePreLoop`]), else before the loop.
fn tile_body(ctx: &mut Ctx) -> Result<(), EmitError> {
    let kp = ctx.kp;
    prologue(ctx)?;
    if kp.ring_start == RingStart::BeforePreLoop {
        ctx.push(first_iteration(&kp.split));
        ctx.pipeline_prologue()?;
    }
    for (i, st) in kp.schedule.pre_loop.iter().enumerate() {
        match *st {
            Step::Barrier(r) => ctx.step_barrier(Phase::PreLoop, i, Some(r))?,
            Step::Run(c) => ctx.chain(c, Phase::PreLoop)?,
        }
    }
    ctx.step_barrier(Phase::PreLoop, kp.schedule.pre_loop.len(), None)?;
    // After the pre-loop phase: the memory of tiles that died there may hold loop state.
    accumulator_state(ctx)?;
    ctx.for_loop()?;
    if kp.triggers_next {
        ctx.push(vec![
            Stmt::Eval(Expr::Call(Func::LaunchDependents, vec![]))
                .noted("the loop is done: the next kernel may launch"),
        ]);
    }
    after_loop(ctx)?;
    if let Some(c) = &kp.cluster_combine {
        cluster_combine(ctx, c)?;
    }
    for (i, st) in kp.schedule.post_loop.iter().enumerate() {
        match *st {
            Step::Barrier(r) => ctx.step_barrier(Phase::PostLoop, i, Some(r))?,
            Step::Run(c) => ctx.chain(c, Phase::PostLoop)?,
        }
    }
    ctx.step_barrier(Phase::PostLoop, kp.schedule.post_loop.len(), None)?;
    if let Some(c) = &kp.last_block_combine {
        last_block_combine(ctx, c);
    }
    if let Some(x) = &kp.exchange {
        let end = exchange_end(ctx, x);
        ctx.push(end);
    }
    Ok(())
}

/// Parameters (outputs, then inputs, as typed pointers) and their launch bindings.
fn signature(ctx: &Ctx) -> (Vec<KernelParam>, Vec<crate::sched::plan::Binding>) {
    let (g, plan, op) = (ctx.g, ctx.plan, ctx.op);
    let mut params = Vec::new();
    let mut args = Vec::new();
    for (j, &o) in op.outputs.iter().enumerate() {
        params.push(KernelParam::Output(j));
        args.push(plan.binding(o, g.tensors[o].dtype.bytes()));
    }
    for (i, &x) in op.inputs.iter().enumerate() {
        params.push(KernelParam::Input(i));
        args.push(plan.binding(x, g.tensors[x].dtype.bytes()));
    }
    if let Some(c) = &ctx.kp.cluster_combine {
        params.push(KernelParam::CombineOutput);
        args.push(c.out);
    }
    if let Some(c) = &ctx.kp.last_block_combine {
        params.push(KernelParam::CombineOutput);
        args.push(c.out);
        params.push(KernelParam::ArrivalCounters);
        args.push(c.counter_binding());
    }
    if let Some(g) = ctx.kp.split.grid() {
        use crate::sched::plan::Binding;
        params.push(KernelParam::SplitSlots);
        args.push(Binding::Workspace {
            byte_offset: g.slots_at,
            elem_offset: 0,
            elem_bytes: 1,
        });
        params.push(KernelParam::ArrivalCounters);
        args.push(Binding::Workspace {
            byte_offset: g.counters_at,
            elem_offset: 0,
            elem_bytes: 4,
        });
    }
    if let Some(x) = &ctx.kp.exchange {
        use crate::sched::plan::Binding;
        params.push(KernelParam::ExchangeResult);
        args.push(x.recv);
        for r in 0..x.gpus {
            params.push(KernelParam::ExchangeBuffer(r));
            args.push(Binding::Exchange { rank: r });
        }
        params.push(KernelParam::Rank);
        args.push(Binding::Rank);
    }
    for (m, _, _) in ctx.kp.tma.maps() {
        params.push(KernelParam::TensorMap(m));
    }
    (params, args)
}

/// The exchange's names for a kernel performing an all-reduce (`mucc/threadblock/exchange.h`):
/// every GPU's buffer, this GPU's rank and the epoch of this execution.
fn exchange_start(x: &crate::sched::exchange::Exchange) -> Vec<Stmt> {
    vec![
        Stmt::Comment(format!(
            "all-reduce op {} fused: every GPU's exchange buffer, this GPU's rank, the epoch",
            x.all_reduce
        )),
        Stmt::Array {
            storage: super::ir::Storage::Auto,
            ty: Ty::BytePtrConst,
            name: "xb".into(),
            dims: vec![x.gpus],
            init: Some((0..x.gpus).map(|r| Expr::var(format!("x{r}"))).collect()),
        },
        Stmt::local(
            Ty::ConstInt,
            "xr",
            Expr::Call(Func::CastToInt, vec![Expr::var("xrank")]),
        ),
        // The plan sized the regions with its header size; the runtime places slots after its
        // own.
        Stmt::StaticAssert(
            Expr::Eq(
                Box::new(Expr::Sym(Sym::ExchangeHeader)),
                Box::new(Expr::size(crate::sched::exchange::HEADER)),
            ),
            "the plan's exchange layout".into(),
        ),
        Stmt::local(
            Ty::ConstMuccU64,
            "xe",
            Expr::TemplateCall(
                Func::ExchangeEpoch,
                vec![TArg::int(x.blocks)],
                vec![Expr::var("xb"), Expr::var("xr"), Expr::size(x.region)],
            ),
        ),
    ]
}

/// The end of a kernel performing an all-reduce: the last block to finish on this GPU meets
/// the other GPUs' last blocks and sums.
fn exchange_end(ctx: &Ctx, x: &crate::sched::exchange::Exchange) -> Vec<Stmt> {
    vec![
        Stmt::Comment(format!(
            "all-reduce op {}: the last {} blocks sum the {} GPUs' {} elements into its output",
            x.all_reduce, x.helpers, x.gpus, x.count
        )),
        Stmt::Eval(Expr::TemplateCall(
            Func::XchgArriveAndSum,
            vec![
                TArg::Elem(ctx.dtype()),
                TArg::int(x.gpus),
                TArg::int(ctx.nt),
                TArg::int(x.blocks),
                TArg::int(x.helpers),
                TArg::int(x.count),
                TArg::int(x.slot_bytes),
            ],
            vec![
                Expr::var("tid"),
                Expr::var("xb"),
                Expr::var("xr"),
                Expr::size(x.region),
                Expr::var("xe"),
                Expr::var("xrecv"),
            ],
        )),
    ]
}

/// Thread indices, the zero page, tile pointers at the plan's offsets, block offsets of every
/// input and output.
fn prologue(ctx: &mut Ctx) -> Result<(), EmitError> {
    let kp = ctx.kp;
    let mut out = Vec::new();
    if kp.tma.loads.is_empty() {
        out.push(Stmt::DynamicSmem {
            align: 128,
            name: "smem".into(),
        });
    } else {
        // Its own name: one translation unit may declare the dynamic shared memory with both
        // alignments (kernels with and without TMA), which one name may not.
        let a = crate::sched::tma::TMA_SLOT_ALIGN;
        out.push(Stmt::DynamicSmem {
            align: a,
            name: format!("smem_{a}"),
        });
        out.push(Stmt::local(
            Ty::BytePtrConst,
            "smem",
            Expr::var(format!("smem_{a}")),
        ));
    }
    let (tx, bd) = (
        |a| Expr::Sym(Sym::ThreadIdx(a)),
        |a| Expr::Sym(Sym::BlockDim(a)),
    );
    let linear = tx(0).plus(bd(0).times(tx(1).plus(bd(1).times(tx(2))).paren()));
    out.push(Stmt::local(
        Ty::ConstInt,
        "tid_k",
        Expr::Call(Func::CastToInt, vec![linear]),
    ));
    out.push(Stmt::local(Ty::ConstInt, "tid", Expr::var("tid_k")));
    out.push(Stmt::DeclMany {
        ty: Ty::ConstInt,
        vars: vec![
            ("warp".into(), Expr::var("tid").over(Expr::int(32))),
            ("lane".into(), Expr::var("tid").modulo(Expr::int(32))),
        ],
    });
    for v in ["warp", "lane"] {
        out.push(Stmt::Eval(Expr::Void(Box::new(Expr::var(v)))));
    }
    if let Some(p) = &kp.l2_prefetch {
        out.push(Stmt::Comment(format!(
            "L2 prefetch of the boxes of the CTA's first {} iteration(s), before the wait: a \
             prefetch reads nothing stale",
            p.iterations
        )));
        out.push(ctx.l2_prefetch(p, share_start(&kp.split)));
    }
    if kp.dependent.is_programmatic() {
        out.push(
            Stmt::Eval(Expr::Call(Func::GridDependencyWait, vec![]))
                .noted("the previous kernel's results are visible"),
        );
    }
    if kp.smem.base > 0 {
        let word = Expr::Index(
            Box::new(Expr::Reinterpret(
                Ty::UnsignedPtr,
                Box::new(Expr::var("smem")),
            )),
            Box::new(Expr::var("tid")),
        );
        out.push(
            Stmt::IfLine(
                Expr::Lt(Box::new(Expr::var("tid")), Box::new(Expr::int(4))),
                Box::new(Stmt::Assign(word, Expr::Int(0, IntType::Unsigned))),
            )
            .noted("zero page"),
        );
    }
    if !kp.tma.loads.is_empty() {
        out.extend(tma_barriers(kp));
    }
    if let Some(p) = kp.split.cluster().and_then(|c| c.gather.push()) {
        out.extend(push_barrier(p));
    }
    if let Some(x) = &kp.exchange {
        out.extend(exchange_start(x));
    }
    for (b, kind) in kp.smem.kinds.iter().enumerate() {
        let tile = kind.tile();
        let d = ctx.tile_dtype(Handle::from_index(tile));
        out.push(
            Stmt::local(
                Ty::ElemPtr(d),
                format!("s{tile}"),
                Expr::Reinterpret(
                    Ty::ElemPtr(d),
                    Box::new(Expr::var("smem").plus(Expr::size(kp.smem.offset(b)))),
                ),
            )
            .noted(kp.smem.buffers[b].name.clone()),
        );
    }
    out.extend(ctx.block_pointers()?);
    ctx.push(out);
    Ok(())
}

/// `name = reinterpret_cast<mucc::u64*>(smem + offset)`: mbarriers in shared memory.
fn mbarriers(name: &str, offset: usize) -> Stmt {
    Stmt::local(
        Ty::MuccU64Ptr,
        name,
        Expr::Reinterpret(
            Ty::MuccU64Ptr,
            Box::new(Expr::var("smem").plus(Expr::size(offset))),
        ),
    )
}

/// `if (tid == 0) { … }`.
fn thread0(body: Vec<Stmt>) -> Stmt {
    Stmt::If(
        Expr::Eq(Box::new(Expr::var("tid")), Box::new(Expr::int(0))),
        body,
    )
}

/// The `full` mbarriers of the TMA ring (one arrival each: thread 0's, with the stage's bytes),
/// initialised by thread 0 and fenced for the copy engine; the barrier after the accumulators'
/// initial state publishes them. A stage slot must start on a 1024-byte boundary (the swizzle
/// follows the address): a misaligned dynamic shared memory traps instead of loading wrongly.
fn tma_barriers(kp: &KernelPlan) -> Vec<Stmt> {
    let stages = kp.ring().map_or(1, |r| r.stages);
    let misaligned = Expr::Call(Func::SmemU32, vec![Expr::var("smem")])
        .modulo(Expr::size(crate::sched::tma::TMA_SLOT_ALIGN));
    let mut init = vec![
        Stmt::IfLine(
            Expr::Ne(Box::new(misaligned), Box::new(Expr::int(0))),
            Box::new(Stmt::Eval(Expr::Call(Func::Trap, vec![]))),
        ),
        Stmt::for_inline(
            "s",
            Expr::size(stages),
            false,
            vec![Stmt::Eval(Expr::Call(
                Func::MbarInit,
                vec![Expr::var("full").plus(Expr::var("s")), Expr::int(1)],
            ))],
        ),
        Stmt::Eval(Expr::Call(Func::FenceMbarrierInit, vec![])),
    ];
    for (m, _, _) in kp.tma.maps() {
        init.push(Stmt::Eval(Expr::Call(
            Func::PrefetchTensormap,
            vec![Expr::var(format!("tm{m}")).addr()],
        )));
    }
    vec![
        mbarriers("full", kp.tma.barriers).noted("TMA stage barriers"),
        thread0(init),
    ]
}

/// Under a cluster split with pushes: the push mbarrier (one arrival: CTA 0's thread 0, with the
/// pushed bytes), initialised by thread 0 of every CTA (only CTA 0's is used) and fenced for the
/// cluster; the cluster arrival before the loop publishes it.
fn push_barrier(p: &crate::sched::plan::PushSlots) -> Vec<Stmt> {
    vec![
        mbarriers("push", p.barrier).noted("cluster split: CTA 0's push barrier"),
        thread0(vec![
            Stmt::Eval(Expr::Call(
                Func::MbarInit,
                vec![Expr::var("push"), Expr::int(1)],
            )),
            Stmt::Eval(Expr::Call(Func::FenceMbarrierInit, vec![])),
        ]),
    ]
}

/// Initial accumulator state (registers, fragments or tiles) and running-max states, then the
/// plan's barrier when shared memory was written.
fn accumulator_state(ctx: &mut Ctx) -> Result<(), EmitError> {
    let (tb, kp, nt, cty) = (ctx.tb, ctx.kp, ctx.nt, ctx.dtype().compute());
    let mut out = Vec::new();
    for p in kp.register_pipes() {
        if let Some(o) = &p.online {
            let mt = ctx.matmul_type(kp.fusion.chains[p.producer].leader())?;
            let mx = o.max.index();
            out.push(Stmt::Comment(format!(
                "op{mx} reduction_max: the running max of each fragment row, in registers"
            )));
            out.extend(fragment_row_state(
                &mt,
                &format!("rm{mx}_"),
                F32Const::NegInfinity,
            ));
            if p.keys > 1 {
                let sa = o.sum_acc.index();
                out.push(Stmt::Comment(format!(
                    "op{sa} accum_red_ld_sum_rescale: this warp's row sums, in registers (a key split)"
                )));
                out.extend(fragment_row_state(&mt, &format!("lw{sa}_"), F32Const::Zero));
            }
        }
    }
    for (h, top) in tb.ops.iter() {
        if kp
            .register_pipes()
            .any(|p| p.online.as_ref().is_some_and(|o| o.max == h))
        {
            continue;
        }
        let init = match top.kind {
            TbOpKind::Accum(AccumKind::Max)
            | TbOpKind::Reduction {
                kind: TbReduction::Max,
                ..
            } => Expr::Number(f64::NEG_INFINITY, cty),
            TbOpKind::Accum(_) => Expr::Number(0.0, cty),
            _ => continue,
        };
        let out_t = top.outputs[0];
        match (&top.kind, &kp.ops[h.index()]) {
            // Its chain stores its value; nothing to start from.
            (
                TbOpKind::Accum(_),
                OpPlan::Accum {
                    storage: AccumStorage::WrittenOnce,
                    ..
                },
            ) => {}
            (
                TbOpKind::Accum(_),
                OpPlan::Accum {
                    storage:
                        AccumStorage::Registers {
                            per_thread,
                            fragment_of,
                        },
                    ..
                },
            ) => {
                let acc = format!("acc{}", h.index());
                if let Some(mm) = *fragment_of {
                    let mt = ctx.matmul_type(mm)?;
                    out.push(Stmt::NestedDecl {
                        class: mt.clone(),
                        ty: Nested::Frag,
                        name: acc.clone(),
                    });
                    out.push(Stmt::Eval(Expr::Member(
                        mt,
                        Method::Fill,
                        Vec::new(),
                        vec![Expr::var(acc), init],
                    )));
                } else {
                    out.push(Stmt::array(Ty::Elem(cty), acc.clone(), vec![*per_thread]));
                    out.push(Stmt::for_inline(
                        "r",
                        Expr::size(*per_thread),
                        true,
                        vec![Stmt::Assign(
                            Expr::Index(Box::new(Expr::var(acc)), Box::new(Expr::var("r"))),
                            init,
                        )],
                    ));
                }
            }
            _ => {
                let s = tb.tensors[out_t].shape;
                let natural: Vec<usize> = (0..s.rank()).collect();
                let l = ctx.tile_layout(out_t, &natural)?;
                out.push(Stmt::Eval(Expr::TemplateCall(
                    Func::TbFill,
                    vec![TArg::int(nt), TArg::int(s.numel()), TArg::Name(l)],
                    vec![
                        Expr::var("tid"),
                        Expr::var(format!("s{}", out_t.index())),
                        init,
                    ],
                )));
            }
        }
    }
    ctx.push(out);
    if kp.barriers.after_initial_state {
        ctx.barrier(BarrierReason::InitialState, false)?;
    }
    Ok(())
}

/// Under a cluster split: this CTA's first iteration `it0`, which the ring's prologue and the
/// loop start from.
fn first_iteration(split: &Split) -> Vec<Stmt> {
    match split {
        Split::Off(_) => Vec::new(),
        Split::Cluster(c) => vec![
            Stmt::Comment(format!(
                "cluster split: CTA r of the cluster runs iterations [r·{0}, (r + 1)·{0})",
                c.iters
            )),
            Stmt::local(Ty::ConstInt, "it0", share_start(split)),
        ],
        Split::Grid(g) => vec![
            Stmt::Comment(format!(
                "grid split: CTA r (blockIdx.x % {0}) of the block's {0} runs iterations \
                 [r·{1}, (r + 1)·{1})",
                g.ctas, g.iters
            )),
            Stmt::local(Ty::ConstInt, "rsplit", grid_split_rank(g)),
            Stmt::local(
                Ty::ConstInt,
                "it0",
                Expr::var("rsplit").times(Expr::size(g.iters)),
            ),
        ],
    }
}

/// The first iteration of this CTA's share of the loop: 0 unsplit, `rank · iters` under a split
/// (the cluster rank, or the CTA's place among its block's under a grid split).
fn share_start(split: &Split) -> Expr {
    match split {
        Split::Off(_) => Expr::int(0),
        Split::Cluster(c) => {
            Expr::Call(Func::CastToInt, vec![Expr::Call(Func::ClusterRank, vec![])])
                .times(Expr::size(c.iters))
        }
        Split::Grid(g) => grid_split_rank(g).times(Expr::size(g.iters)),
    }
}

/// `(int)(blockIdx.x % ctas)`: this CTA's place among its block's CTAs under a grid split.
fn grid_split_rank(g: &GridSplit) -> Expr {
    Expr::Call(
        Func::CastToInt,
        vec![Expr::Sym(Sym::BlockIdx(0)).modulo(Expr::size(g.ctas))],
    )
}

/// `float name[Class::PM][2];` and a loop setting every element to `init`: a per-row state of
/// a matmul fragment (its running max or its row sums).
fn fragment_row_state(class: &str, name: &str, init: F32Const) -> Vec<Stmt> {
    let rows = Expr::FragmentRows(class.into());
    let row = |h: usize| {
        Expr::Index(
            Box::new(Expr::Index(
                Box::new(Expr::var(name)),
                Box::new(Expr::var("i")),
            )),
            Box::new(Expr::size(h)),
        )
    };
    vec![
        Stmt::Arrays {
            ty: Ty::Elem(crate::graph::DType::F32),
            names: vec![name.into()],
            dims: vec![rows.clone(), Expr::size(2)],
        },
        Stmt::for_inline(
            "i",
            rows,
            false,
            vec![Stmt::Assign(
                row(0),
                Expr::Assign(Box::new(row(1)), Box::new(Expr::F32(init))),
            )],
        ),
    ]
}

/// After the loop: register write-backs and the finalisation of mean and RMS accumulators, each
/// behind the barrier the plan gives it ([`crate::sched::plan::BodyBarriers`]).
fn after_loop(ctx: &mut Ctx) -> Result<(), EmitError> {
    let (tb, kp, nt) = (ctx.tb, ctx.kp, ctx.nt);
    let cd = ctx.dtype().compute();
    if kp.barriers.before_write_back && !kp.write_backs.is_empty() {
        ctx.barrier(BarrierReason::BeforeWriteBack, true)?;
    }
    for wb in &kp.write_backs {
        let h = Handle::from_index(wb.acc());
        match *wb {
            WriteBack::KeySplit { .. } => {
                let (p, o) = crate::sched::plan::key_split_of(&kp.pipes, h)
                    .ok_or_else(|| ctx.internal(&format!("op{} has no key split", h.index())))?;
                let buffered = [o.out_acc, o.sum_acc, o.max_acc]
                    .iter()
                    .all(|a| kp.smem.buffer_of(tb.ops[*a].outputs[0].index()).is_some());
                if !buffered {
                    return Err(ctx.internal(&format!(
                        "the key split of op{} combines into tiles without buffers",
                        h.index()
                    )));
                }
                ctx.combine_keys(p, o)?
            }
            WriteBack::Store { fragment_of, .. } => {
                ctx.write_back(h, fragment_of.map(Handle::from_index))?
            }
        }
    }
    let mut finalize = Vec::new();
    for (h, top) in tb.ops.iter() {
        let TbOpKind::Accum(kind) = top.kind else {
            continue;
        };
        let out = top.outputs[0];
        let divisor = match &kp.ops[h.index()] {
            OpPlan::Accum { divisor, .. } => *divisor,
            _ => None,
        };
        let mean = |d: Option<usize>| -> Result<Expr, EmitError> {
            let d = d.ok_or_else(|| ctx.internal(&format!("op{} has no divisor", h.index())))?;
            Ok(Expr::var("v").over(Expr::Number(d as f64, cd)))
        };
        match kind {
            AccumKind::RedLdMean => finalize.push((out, mean(divisor)?)),
            AccumKind::RedLdRms => finalize.push((
                out,
                Expr::Unary(UnaryOp::Sqrt, Box::new(mean(divisor)?), cd),
            )),
            _ => {}
        }
    }
    combine_partials(ctx)?;
    if kp.barriers.before_finalize {
        ctx.barrier(BarrierReason::BeforeFinalize, false)?;
    }
    for (out, expr) in finalize {
        let s = tb.tensors[out].shape;
        let natural: Vec<usize> = (0..s.rank()).collect();
        let l = ctx.tile_layout(out, &natural)?;
        let ty = ctx.tile_dtype(out);
        let elem = Expr::Index(
            Box::new(Expr::var(format!("s{}", out.index()))),
            Box::new(Expr::LayoutOffset(l, Box::new(Expr::var("e")))),
        );
        ctx.push(vec![Stmt::thread_loop(
            Func::TbForEach,
            vec![TArg::int(nt), TArg::int(s.numel())],
            vec![
                Param::named(Ty::Int, "e"),
                Param {
                    ty: Ty::Int,
                    name: None,
                },
            ],
            vec![
                Stmt::local(
                    Ty::ConstElem(cd),
                    "v",
                    Expr::Call(Func::ToCompute, vec![elem.clone()]),
                ),
                Stmt::Assign(
                    elem,
                    Expr::TemplateCall(Func::FromCompute, vec![TArg::Elem(ty)], vec![expr]),
                ),
            ],
        )]);
    }
    Ok(())
}

/// The combining step of split attention in the kernel's clusters ([`crate::sched::combine`]):
/// behind a cluster barrier each CTA combines its share of the block's rows from every CTA's
/// partials and stores them; a second barrier keeps its partials alive until the others have
/// read them.
fn cluster_combine(
    ctx: &mut Ctx,
    c: &crate::sched::combine::ClusterCombine,
) -> Result<(), EmitError> {
    let (tb, nt) = (ctx.tb, ctx.nt);
    let tile = |ctx: &mut Ctx, t: usize| -> Result<String, EmitError> {
        let h = Handle::from_index(t);
        let s = tb.tensors[h].shape;
        ctx.tile_layout(h, &(0..s.rank()).collect::<Vec<_>>())
    };
    let (lo, ll, lm) = (
        tile(ctx, c.o_tile)?,
        tile(ctx, c.l_tile)?,
        tile(ctx, c.m_tile)?,
    );
    let s = tb.tensors[Handle::from_index(c.o_tile)].shape;
    let natural: Vec<usize> = (0..s.rank()).collect();
    let ly = ctx.strided_layout(&s, &s, &c.out_strides, &natural, None);
    let ty = ctx.tile_dtype(Handle::from_index(c.o_tile));
    let off = ctx.block_offset(&c.region);
    let (rows, d, ctas, rpc) = (c.rows, c.d, c.ctas, c.rows_per_cta);
    let sync = || Stmt::Eval(Expr::Call(Func::ClusterSync, vec![]));
    let tile = |t: usize| Expr::var(format!("s{t}"));
    ctx.push(vec![
        Stmt::Comment(format!(
            "kernel op {} (softmax_combine): the {ctas} CTAs of the cluster, its key splits,",
            c.combine
        )),
        Stmt::Comment(format!(
            "combine their partials; CTA r stores rows [r·{rpc}, (r + 1)·{rpc}) of the output"
        )),
        sync().noted("every CTA's partials are complete"),
        Stmt::Eval(Expr::TemplateCall(
            Func::TbClusterSoftmaxCombine,
            vec![
                TArg::int(nt),
                TArg::int(rows),
                TArg::int(d),
                TArg::int(ctas),
                TArg::int(rpc),
                TArg::Name(lo),
                TArg::Name(ll),
                TArg::Name(lm),
                TArg::Name(ly),
                TArg::Elem(ty),
                TArg::Elem(ctx.dtype()),
            ],
            vec![
                Expr::var("tid"),
                tile(c.o_tile),
                tile(c.l_tile),
                tile(c.m_tile),
                Expr::var("ycomb").plus(off),
            ],
        )),
        sync().noted("the others have read this CTA's partials"),
    ]);
    Ok(())
}

/// The combining step of split attention in the kernel's last blocks
/// ([`crate::sched::combine::LastBlockCombine`]): after its partials are stored, the block
/// arrives on its group's counter; the last of the group reads the group's partials back,
/// combines them and stores the block's rows of the output.
fn last_block_combine(ctx: &mut Ctx, c: &crate::sched::combine::LastBlockCombine) {
    let (nt, ty) = (ctx.nt, ctx.dtype());
    let natural: Vec<usize> = (0..c.tile.rank()).collect();
    let rows = c.tile.with_dim(c.tile.rank() - 1, 1);
    let lo = ctx.strided_layout(&c.tile, &c.tile, &c.o.strides, &natural, None);
    let ll = ctx.strided_layout(&rows, &rows, &c.l.strides, &natural, None);
    let lm = ctx.strided_layout(&rows, &rows, &c.m.strides, &natural, None);
    let ly = ctx.strided_layout(&c.tile, &c.tile, &c.out_strides, &natural, None);
    let partial = |ctx: &Ctx, p: &crate::sched::combine::PartialRead| {
        [
            Expr::var(format!("out{}", p.output)).plus(ctx.block_offset(&p.region)),
            Expr::size(p.step),
        ]
    };
    let [o, os] = partial(ctx, &c.o);
    let [l, ls] = partial(ctx, &c.l);
    let [m, ms] = partial(ctx, &c.m);
    let arrive = Expr::TemplateCall(
        Func::TbArriveLast,
        vec![TArg::int(c.splits)],
        vec![
            Expr::var("tid"),
            Expr::var("arrivals").plus(ctx.block_offset(&c.counter_index)),
        ],
    );
    let combine = Stmt::Eval(Expr::TemplateCall(
        Func::TbCombineSplits,
        vec![
            TArg::int(nt),
            TArg::int(c.rows()),
            TArg::int(c.d()),
            TArg::int(c.splits),
            TArg::int(c.vector),
            TArg::Name(lo),
            TArg::Name(ll),
            TArg::Name(lm),
            TArg::Name(ly),
            TArg::Elem(ty),
        ],
        vec![
            Expr::var("tid"),
            o,
            os,
            l,
            ls,
            m,
            ms,
            Expr::var("ycomb").plus(ctx.block_offset(&c.region)),
        ],
    ));
    ctx.push(vec![
        Stmt::Comment(format!(
            "kernel op {} (softmax_combine): the last of the {} key-split blocks of these rows",
            c.combine, c.splits
        )),
        Stmt::Comment("to store its partials combines the group's".into()),
        Stmt::If(arrive, vec![combine]),
    ]);
}

/// The runtime's fold of partials combined by `c`; a rescaled combine has a function of its own.
fn fold_of(c: crate::sched::plan::Combine) -> Option<Fold> {
    use crate::sched::plan::Combine;
    match c {
        Combine::Sum => Some(Fold::Sum),
        Combine::Max => Some(Fold::Max),
        Combine::Rescaled { .. } => None,
    }
}

/// `mucc::sm90::cluster_rank() != 0`: the CTAs other than CTA 0.
fn others() -> Expr {
    Expr::Ne(
        Box::new(Expr::Call(Func::ClusterRank, vec![])),
        Box::new(Expr::int(0)),
    )
}

/// "CTA 1 pushes its partial accumulators", or for larger clusters "CTAs 1..N push their …".
fn others_push(ctas: usize) -> String {
    match ctas {
        2 => "CTA 1 pushes its partial accumulators".to_string(),
        n => format!("CTAs 1..{} push their partial accumulators", n - 1),
    }
}

/// Under a cluster split with pushes ([`crate::sched::plan::Gather::Push`]): the other CTAs
/// store their partial accumulators into CTA 0's slots and leave; CTA 0 waits for their bytes
/// and folds the slots into its own tiles, then alone runs the post-loop operators.
fn push_partials(
    ctx: &mut Ctx,
    c: &crate::sched::plan::ClusterSplit,
    p: &crate::sched::plan::PushSlots,
) -> Result<(), EmitError> {
    let (tb, nt, ctas) = (ctx.tb, ctx.nt, c.ctas);
    ctx.push(vec![
        Stmt::Comment(format!(
            "cluster split: {} into CTA 0's shared memory",
            others_push(ctas)
        )),
        Stmt::Eval(Expr::Call(Func::ClusterWait, vec![]))
            .noted("CTA 0's push barrier is initialised"),
        Stmt::Barrier {
            reason: BarrierReason::BeforePush,
            noted: true,
        },
    ]);
    let mut pushes = Vec::new();
    let mut folds = Vec::new();
    for (i, part) in c.partials.iter().enumerate() {
        let t = Handle::from_index(part.tile);
        let s = tb.tensors[t].shape;
        let l = ctx.tile_layout(t, &(0..s.rank()).collect::<Vec<_>>())?;
        let ty = ctx.tile_dtype(t);
        let Some(f) = fold_of(part.combine) else {
            return Err(ctx.internal("a rescaled partial is pushed"));
        };
        let (slot, stride, n, tile) = (p.slots[i], p.strides[i], s.numel(), part.tile);
        let (tile, at) = (
            Expr::var(format!("s{tile}")),
            Expr::var("smem").plus(Expr::size(slot)),
        );
        pushes.push(Stmt::Eval(Expr::TemplateCall(
            Func::TbClusterPush,
            vec![
                TArg::int(nt),
                TArg::int(n),
                TArg::int(stride),
                TArg::Name(l.clone()),
                TArg::Elem(ty),
            ],
            vec![
                Expr::var("tid"),
                tile.clone(),
                at.clone(),
                Expr::var("push"),
                Expr::Call(Func::ClusterRank, vec![]),
            ],
        )));
        folds.push(Stmt::Eval(Expr::TemplateCall(
            Func::TbClusterFoldPushed,
            vec![
                TArg::int(nt),
                TArg::int(n),
                TArg::int(ctas),
                TArg::int(stride),
                TArg::Fold(f),
                TArg::Name(l),
                TArg::Elem(ty),
            ],
            vec![Expr::var("tid"), tile, at],
        )));
    }
    pushes.push(Stmt::Return(None));
    let mut out = vec![Stmt::If(others(), pushes)];
    out.push(
        Stmt::IfLine(
            Expr::Eq(Box::new(Expr::var("tid")), Box::new(Expr::int(0))),
            Box::new(Stmt::Eval(Expr::Call(
                Func::MbarArriveExpectTx,
                vec![Expr::var("push"), Expr::size(p.bytes)],
            ))),
        )
        .noted("the pushed bytes"),
    );
    out.push(Stmt::Eval(Expr::Call(
        Func::MbarWait,
        vec![Expr::var("push"), Expr::int(0)],
    )));
    out.extend(folds);
    ctx.push(out);
    Ok(())
}

/// Under a cluster split: the partial accumulators of its CTAs reach CTA 0, pushed
/// ([`push_partials`]) or folded by CTA 0 (between two cluster barriers: the partials are
/// complete before, read after), then the other CTAs leave and CTA 0 alone runs the post-loop
/// operators.
fn combine_partials(ctx: &mut Ctx) -> Result<(), EmitError> {
    if let Some(g) = ctx.kp.split.grid() {
        return grid_partials(ctx, g);
    }
    let Some(c) = ctx.kp.split.cluster() else {
        return Ok(());
    };
    if let Some(p) = c.gather.push() {
        return push_partials(ctx, c, p);
    }
    let (tb, nt, ctas) = (ctx.tb, ctx.nt, c.ctas);
    ctx.push(vec![
        Stmt::Comment(format!(
            "cluster split: CTA 0 combines the partial accumulators of the {ctas} CTAs"
        )),
        Stmt::Eval(Expr::Call(Func::ClusterSync, vec![]))
            .noted("every CTA's partials are complete"),
    ]);
    let mut folds = Vec::new();
    for (i, p) in c.partials.iter().enumerate() {
        if ctx.kp.barriers.after_rescaled_folds == Some(i) {
            folds.push(Stmt::Barrier {
                reason: BarrierReason::AfterRescaledFolds,
                noted: true,
            });
        }
        use crate::sched::plan::Combine;
        let t = Handle::from_index(p.tile);
        let s = tb.tensors[t].shape;
        let natural: Vec<usize> = (0..s.rank()).collect();
        let l = ctx.tile_layout(t, &natural)?;
        let ty = ctx.tile_dtype(t);
        let tile = Expr::var(format!("s{}", p.tile));
        if let Combine::Rescaled { max_tile } = p.combine {
            let mt = Handle::from_index(max_tile);
            let ms = tb.tensors[mt].shape;
            let lm = ctx.tile_layout(mt, &(0..ms.rank()).collect::<Vec<_>>())?;
            folds.push(Stmt::Eval(Expr::TemplateCall(
                Func::TbClusterFoldRescaled,
                vec![
                    TArg::int(nt),
                    TArg::int(s.numel()),
                    TArg::int(s.dim(s.rank() - 1)),
                    TArg::int(ctas),
                    TArg::Name(l),
                    TArg::Name(lm),
                    TArg::Elem(ty),
                ],
                vec![Expr::var("tid"), tile, Expr::var(format!("s{max_tile}"))],
            )));
            continue;
        }
        let Some(f) = fold_of(p.combine) else {
            return Err(ctx.internal("a rescaled partial without its fold"));
        };
        folds.push(Stmt::Eval(Expr::TemplateCall(
            Func::TbClusterFold,
            vec![
                TArg::int(nt),
                TArg::int(s.numel()),
                TArg::int(ctas),
                TArg::Fold(f),
                TArg::Name(l),
                TArg::Elem(ty),
            ],
            vec![Expr::var("tid"), tile],
        )));
    }
    let rank0 = Expr::Eq(
        Box::new(Expr::Call(Func::ClusterRank, vec![])),
        Box::new(Expr::int(0)),
    );
    ctx.push(vec![
        Stmt::If(rank0, folds),
        Stmt::Eval(Expr::Call(Func::ClusterSync, vec![]))
            .noted("CTA 0 has read the partials: the others may leave"),
        Stmt::IfLine(others(), Box::new(Stmt::Return(None))),
    ]);
    Ok(())
}

/// Under a grid split: every CTA stores its partial accumulators into its slots and arrives on
/// its block's counter; the others leave, and the last to arrive folds every CTA's slots into
/// its tiles and alone runs the post-loop operators.
fn grid_partials(ctx: &mut Ctx, g: &GridSplit) -> Result<(), EmitError> {
    let (tb, nt) = (ctx.tb, ctx.nt);
    let mut out = vec![Stmt::Comment(format!(
        "grid split: the {} CTAs of a block store their partials; the last to arrive folds them",
        g.ctas
    ))];
    if ctx.kp.barriers.before_push {
        out.push(Stmt::Barrier {
            reason: BarrierReason::BeforePush,
            noted: true,
        });
    }
    let mut folds = Vec::new();
    for (i, part) in g.partials.iter().enumerate() {
        let t = Handle::from_index(part.tile);
        let s = tb.tensors[t].shape;
        let l = ctx.tile_layout(t, &(0..s.rank()).collect::<Vec<_>>())?;
        let ty = ctx.tile_dtype(t);
        let Some(f) = fold_of(part.combine) else {
            return Err(ctx.internal("a rescaled partial under a grid split"));
        };
        let n = g.slot_elems[i];
        if n != s.numel() || g.elem_bytes[i] != ty.bytes() {
            return Err(ctx.internal("a grid split's slot does not match its tile"));
        }
        // This block's slots of the partial: `ctas` of `n` elements.
        let block = ctx.block_offset(&grid_block_region(ctx, g.ctas * n));
        let base = format!("gs{}", part.tile);
        out.push(Stmt::local(
            Ty::ElemPtr(ty),
            base.clone(),
            Expr::Reinterpret(
                Ty::ElemPtr(ty),
                Box::new(Expr::var("slots").plus(Expr::size(g.slot_offsets[i]))),
            )
            .plus(block),
        ));
        let tile = Expr::var(format!("s{}", part.tile));
        out.push(Stmt::Eval(Expr::TemplateCall(
            Func::TbStorePartial,
            vec![
                TArg::int(nt),
                TArg::int(n),
                TArg::Name(l.clone()),
                TArg::Elem(ty),
            ],
            vec![
                Expr::var("tid"),
                tile.clone(),
                Expr::var(base.clone()).plus(Expr::var("rsplit").times(Expr::size(n))),
            ],
        )));
        folds.push(Stmt::Eval(Expr::TemplateCall(
            Func::TbFoldPartials,
            vec![
                TArg::int(nt),
                TArg::int(n),
                TArg::int(g.ctas),
                TArg::Fold(f),
                TArg::Name(l),
                TArg::Elem(ty),
            ],
            vec![Expr::var("tid"), tile, Expr::var(base)],
        )));
    }
    let arrive = Expr::TemplateCall(
        Func::TbArriveLast,
        vec![TArg::int(g.ctas)],
        vec![
            Expr::var("tid"),
            Expr::var("arrivals").plus(ctx.block_offset(&grid_block_region(ctx, 1))),
        ],
    );
    out.push(
        Stmt::IfLine(Expr::Not(Box::new(arrive)), Box::new(Stmt::Return(None)))
            .noted("the block's other CTAs have stored theirs"),
    );
    out.extend(folds);
    ctx.push(out);
    Ok(())
}

/// The µGraph block's linear index times `elems` as a block region: x, then y, then z.
fn grid_block_region(ctx: &Ctx, elems: usize) -> crate::sched::plan::BlockRegion {
    let [gx, gy, gz] = ctx.kp.cta.grid;
    let steps = [(0, elems), (1, gx * elems), (2, gx * gy * elems)]
        .into_iter()
        .zip([gx, gy, gz])
        .filter(|&(_, n)| n > 1)
        .map(|(s, _)| s)
        .collect();
    crate::sched::plan::BlockRegion { steps, per_iter: 0 }
}

/// A loop iteration in a copy: the first (the tile at the block's region itself) or an
/// expression.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Iteration {
    /// Iteration 0.
    First,
    /// An iteration given by an expression (`it`, `pf`, `it0 + 1`, `2`).
    Expr(Expr),
}

impl Iteration {
    /// The iteration as an expression.
    pub(super) fn expr(&self) -> Expr {
        match self {
            Iteration::First => Expr::size(0),
            Iteration::Expr(e) => e.clone(),
        }
    }
}

impl Ctx<'_> {
    /// This CTA's first iteration, when it is not 0: `it0` (declared before the pipeline
    /// prologue) under a cluster split.
    fn loop_start(&self) -> Option<Expr> {
        self.kp.split.share().map(|_| Expr::var("it0"))
    }

    /// The first iteration of this CTA and the end of its share: the whole loop, or under a
    /// cluster split `it0` onwards.
    pub(super) fn loop_bounds(&self) -> (Expr, Expr) {
        match self.kp.split.share() {
            Some((_, iters)) => (Expr::var("it0"), Expr::var("it0").plus(Expr::size(iters))),
            None => (Expr::size(0), Expr::size(self.tb.forloop_range)),
        }
    }

    /// The ring slot of iteration `var` (a variable of the generated code): counted from this
    /// CTA's first iteration, which is 0 without a cluster split.
    pub(super) fn ring_slot(&self, var: &str, stages: usize) -> Expr {
        let rel = match self.loop_start() {
            None => Expr::var(var),
            Some(lo) => Expr::var(var).minus(lo).paren(),
        };
        rel.modulo(Expr::size(stages)).paren()
    }

    /// The for-loop: the pipeline prologue, then per iteration the current slots, the wait for
    /// the oldest pending stage, the body with its barriers, and the refill of the ring where
    /// the plan puts it ([`crate::sched::plan::Prefetch`]).
    fn for_loop(&mut self) -> Result<(), EmitError> {
        let early = self.kp.ring_start == RingStart::BeforePreLoop;
        let mut out = Vec::new();
        if self
            .kp
            .split
            .cluster()
            .is_some_and(|c| c.gather.push().is_some())
        {
            out.push(
                Stmt::Eval(Expr::Call(Func::ClusterArriveRelaxed, vec![]))
                    .noted("CTA 0's push barrier is initialised"),
            );
        }
        if !early {
            out.extend(first_iteration(&self.kp.split));
        }
        self.push(out);
        let (lo, hi) = self.loop_bounds();
        if !early {
            self.pipeline_prologue()?;
        }
        let ring = self.ring_plan.clone();
        let stages = ring.as_ref().map_or(1, |r| r.stages);
        let body = self.nested(|s| s.loop_body(ring, stages))?;
        self.push(vec![Stmt::For {
            var: "it".into(),
            from: lo,
            to: hi,
            unroll: false,
            form: LoopForm::Block,
            body,
        }]);
        Ok(())
    }

    /// One iteration of the for-loop: its thread indices, the current stage's slots and waits,
    /// the loop's steps and the ring's refill.
    fn loop_body(&mut self, ring: Option<Ring>, stages: usize) -> Result<(), EmitError> {
        // Thread indices as the plan says: re-derived in every iteration from an opaque copy,
        // or the kernel's own (`LoopIndices`).
        let tid_k = Expr::var("tid_k");
        let tid = match self.kp.loop_indices {
            LoopIndices::Recomputed => Expr::Call(Func::Opaque, vec![tid_k]),
            LoopIndices::Hoisted { .. } => tid_k,
        };
        let mut warp = Expr::var("tid").over(Expr::int(32));
        if self.kp.uniform_warp {
            warp = Expr::Call(
                Func::ShflSync,
                vec![Expr::Sym(Sym::FullWarpMask), warp, Expr::int(0)],
            );
        }
        let mut head = vec![
            Stmt::DeclMany {
                ty: Ty::ConstInt,
                vars: vec![
                    ("tid".into(), tid),
                    ("warp".into(), warp),
                    ("lane".into(), Expr::var("tid").modulo(Expr::int(32))),
                ],
            },
            Stmt::Eval(Expr::Void(Box::new(Expr::var("warp")))),
            Stmt::Eval(Expr::Void(Box::new(Expr::var("lane")))),
        ];
        if let Some(ring) = &ring {
            let slot_of = self.ring_slot("it", stages);
            for (t, slot) in self.pipelined().into_iter().map(|(_, t, slot)| (t, slot)) {
                head.push(Stmt::local(
                    Ty::ElemPtr(self.tile_dtype(Handle::from_index(t))),
                    format!("s{t}_cur"),
                    Expr::var(format!("s{t}")).plus(slot_of.clone().times(Expr::size(slot))),
                ));
            }
            let mut waits = Vec::new();
            if !ring.cp_async.is_empty() {
                waits.push(Stmt::Eval(Expr::TemplateCall(
                    Func::CpAsyncWait,
                    vec![TArg::int(ring.pending_groups())],
                    vec![],
                )));
            }
            if !ring.tma.is_empty() {
                // The stage's phase: which pass over the ring this iteration is.
                let rel = match self.loop_start() {
                    None => Expr::var("it"),
                    Some(lo) => Expr::var("it").minus(lo).paren(),
                };
                let pass = Expr::Call(Func::CastToUnsigned, vec![rel.over(Expr::size(stages))]);
                let parity = Expr::BitAnd(
                    Box::new(pass),
                    Box::new(Expr::Int(1, crate::emit::ir::IntType::Unsigned)),
                );
                waits.push(Stmt::Eval(Expr::Call(
                    Func::MbarWait,
                    vec![Expr::var("full").plus(slot_of), parity],
                )));
            }
            self.ring.extend(waits.iter().cloned());
            head.extend(waits);
        }
        self.push(head);
        let prefetch = self.kp.barriers.prefetch;
        if (prefetch == Prefetch::None) != ring.is_none() {
            return Err(self.internal("the plan's ring refill does not match its pipeline"));
        }
        let mut pending = prefetch == Prefetch::AfterFirstBarrier;
        let kp = self.kp;
        for (i, st) in kp.schedule.body.iter().enumerate() {
            match *st {
                Step::Barrier(r) => {
                    self.step_barrier(Phase::Loop, i, Some(r))?;
                    if pending {
                        self.prefetch()?;
                        pending = false;
                    }
                }
                Step::Run(c) => self.chain(c, Phase::Loop)?,
            }
        }
        if prefetch == Prefetch::EndOfBody {
            self.barrier(BarrierReason::BeforePrefetch, false)?;
            self.prefetch()?;
        }
        self.step_barrier(Phase::Loop, kp.schedule.body.len(), None)
    }
}
