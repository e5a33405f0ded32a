//! Threadblock kernels: one `__global__` kernel per customized operator, following its plan.
//!
//! The kernel declares its shared-memory tiles at the offsets of the memory plan, computes each
//! input's and output's block offset from the grid maps and the DTensor strides, initialises the
//! accumulators (registers or shared memory), then runs the schedule: the pre-loop steps, the
//! for-loop (with a `cp.async` multi-stage pipeline for pipelined inputs), register write-backs
//! and accumulator finalisation, and the post-loop steps, with `__syncthreads()` exactly where
//! the schedule puts barriers.
//!
//! A chain is emitted as one pass over its elements: the leader computes a value (element-wise
//! operators, a matmul fragment, a row of rms_norm, a reduction), the fused unary operators
//! transform it in registers, and the tail stores it (to a tile or straight to global memory)
//! or accumulates it. Every tile access goes through the tile's compile-time layout (its
//! strides and swizzle), walked in the order the layout plan chose (the iteration dim last, so
//! consecutive threads touch consecutive elements).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::cxx::ctype;
use super::launch::{Binding, KernelLaunch};
use super::{EmitError, KernelView};
use crate::graph::arena::Handle;
use crate::graph::dtype::DType;
use crate::graph::kernel::{KernelGraph, KnOp};
use crate::graph::ops::{AXIS_NAMES, AccumKind, BinaryOp, TbReduction, UnaryOp};
use crate::graph::shape::Shape;
use crate::graph::threadblock::{STensor, TbGraph, TbOp, TbOpKind};
use crate::layout::swizzle::Swizzle;
use crate::sched::ops::{AccumStorage, Copy, CopyEngine, OpPlan};
use crate::sched::order::{Phase, Step};
use crate::sched::plan::{GraphPlan, KernelPlan, Sink};

struct Ctx<'a> {
    g: &'a KernelGraph,
    plan: &'a GraphPlan,
    kn: Handle<KnOp>,
    op: &'a KnOp,
    tb: &'a TbGraph,
    kp: &'a KernelPlan,
    nt: usize,
    lines: Vec<String>,
    /// Type string → alias name.
    aliases: BTreeMap<String, String>,
    alias_defs: Vec<String>,
    /// Pipeline stages of pipelined input tiles.
    stages: BTreeMap<usize, usize>,
    /// The matmul helper type of each matmul op.
    mma: BTreeMap<usize, String>,
}

fn fmt_list(v: &[usize]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn f64_lit(x: f64) -> String {
    let s = format!("{x:?}");
    if s.contains('.') || s.contains('e') {
        s
    } else {
        format!("{s}.0")
    }
}

impl Ctx<'_> {
    fn err(&self, reason: String) -> EmitError {
        EmitError::Unsupported {
            op: self.kn.index(),
            name: "kn_customized_op".into(),
            reason,
        }
    }

    fn line(&mut self, s: impl Into<String>) {
        self.lines.push(s.into());
    }

    fn alias(&mut self, ty: String) -> String {
        if let Some(a) = self.aliases.get(&ty) {
            return a.clone();
        }
        let name = format!("L{}", self.aliases.len());
        self.alias_defs.push(format!("  using {name} = {ty};"));
        self.aliases.insert(ty, name.clone());
        name
    }

    fn dtype(&self) -> DType {
        self.g.tensors[self.op.outputs[0]].dtype
    }

    fn t(&self) -> &'static str {
        ctype(self.dtype())
    }

    fn compute(&self) -> &'static str {
        match self.dtype() {
            DType::F16 | DType::BF16 | DType::F32 => "float",
            _ => "double",
        }
    }

    /// The C++ type tile `t` is stored in (the plan's).
    fn tile_ctype(&self, t: Handle<STensor>) -> &'static str {
        ctype(
            self.kp.tiles[t.index()]
                .as_ref()
                .map_or(self.tb.tensors[t].dtype, |g| g.dtype),
        )
    }

    fn tile_ref(&self, t: Handle<STensor>) -> String {
        if self.stages.contains_key(&t.index()) {
            format!("s{}_cur", t.index())
        } else {
            format!("s{}", t.index())
        }
    }

    /// The layout of tile `t` walked in `order`.
    fn tile_layout(&mut self, t: Handle<STensor>, order: &[usize]) -> Result<String, EmitError> {
        let geo = self.kp.tiles[t.index()].as_ref().ok_or_else(|| {
            self.err(format!(
                "internal: tile s{} has no shared-memory layout",
                t.index()
            ))
        })?;
        let shape = self.tb.tensors[t].shape;
        let dims: Vec<usize> = order.iter().map(|&d| shape.dim(d)).collect();
        let strides: Vec<usize> = order.iter().map(|&d| geo.strides.0[d]).collect();
        let base = format!(
            "mucc::Layout<mucc::Shape<{}>, mucc::Stride<{}>>",
            fmt_list(&dims),
            fmt_list(&strides)
        );
        let ty = match geo.swizzle {
            Swizzle::Xor { b, m, s } => {
                format!("mucc::SwizzledLayout<{base}, mucc::Swizzle<{b}, {m}, {s}>>")
            }
            _ => base,
        };
        Ok(self.alias(ty))
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
        let base = format!(
            "mucc::Layout<mucc::Shape<{}>, mucc::Stride<{}>>",
            fmt_list(&dims),
            fmt_list(&st)
        );
        let ty = match swizzle {
            Some(Swizzle::Xor { b, m, s }) => {
                format!("mucc::SwizzledLayout<{base}, mucc::Swizzle<{b}, {m}, {s}>>")
            }
            _ => base,
        };
        self.alias(ty)
    }

    /// A tile read over `space` in `order` (broadcast where the tile has extent 1).
    fn tile_read(
        &mut self,
        t: Handle<STensor>,
        space: &Shape,
        order: &[usize],
        e: &str,
    ) -> Result<String, EmitError> {
        let geo = self.kp.tiles[t.index()].as_ref().ok_or_else(|| {
            self.err(format!(
                "internal: tile s{} has no shared-memory layout",
                t.index()
            ))
        })?;
        let (strides, swz) = (geo.strides.0.clone(), geo.swizzle);
        let shape = self.tb.tensors[t].shape;
        let l = self.strided_layout(space, &shape, &strides, order, Some(swz));
        Ok(format!(
            "mucc::to_compute({}[{l}::offset({e})])",
            self.tile_ref(t)
        ))
    }

    /// The walk order the plan gives the chain led by `lead`.
    fn order(&self, lead: Handle<TbOp>) -> Vec<usize> {
        self.kp.chains[self.kp.fusion.chain_of[lead.index()]]
            .order
            .clone()
    }

    /// Global base pointer and layout of a threadblock output's DTensor region.
    fn global_out(
        &mut self,
        out: Handle<TbOp>,
        space: &Shape,
        order: &[usize],
    ) -> (String, String) {
        let TbOpKind::Output { output, .. } = self.tb.ops[out].kind else {
            unreachable!("a Global sink is an output operator")
        };
        let dt = self.op.outputs[output];
        let strides = self.plan.dtensors[dt.index()].strides.0.clone();
        let l = self.strided_layout(space, space, &strides, order, None);
        (format!("go{}", out.index()), l)
    }

    fn unary_expr(&self, u: &UnaryOp, v: &str) -> String {
        let c = self.compute();
        match *u {
            UnaryOp::Exp => format!("mucc::op::exp({v})"),
            UnaryOp::Square => format!("mucc::op::square({v})"),
            UnaryOp::Sqrt => format!("mucc::op::sqrt({v})"),
            UnaryOp::Silu => format!("mucc::op::silu({v})"),
            UnaryOp::Sigmoid => format!("mucc::op::sigmoid({v})"),
            UnaryOp::Gelu => format!("mucc::op::gelu({v})"),
            UnaryOp::Relu => format!("mucc::op::relu({v})"),
            UnaryOp::Log => format!("mucc::op::log({v})"),
            UnaryOp::Clamp { min, max } => format!(
                "mucc::op::clamp({v}, {c}({}), {c}({}))",
                f64_lit(min),
                f64_lit(max)
            ),
            UnaryOp::MulScalar(s) => format!("({v} * {c}({}))", f64_lit(s)),
        }
    }

    fn binary_fn(b: BinaryOp) -> &'static str {
        match b {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Pow => "pow",
        }
    }

    /// The unary members of a chain applied to `v`.
    fn members(&self, members: &[Handle<TbOp>], v: &str) -> String {
        let mut e = v.to_string();
        for &m in members {
            if let TbOpKind::Unary(u) = &self.tb.ops[m].kind {
                e = self.unary_expr(u, &e);
            }
        }
        e
    }

    /// Statement storing or accumulating value `v` (compute type) at element `e` of the chain's
    /// output space `space` (walked in `order`); `r` is the per-thread slot index.
    fn sink_stmt(
        &mut self,
        sink: Sink,
        space: &Shape,
        order: &[usize],
        e: &str,
        r: &str,
        v: &str,
    ) -> Result<String, EmitError> {
        Ok(match sink {
            Sink::Tile(t) => {
                let l = self.tile_layout(t, order)?;
                let ty = self.tile_ctype(t);
                format!(
                    "{}[{l}::offset({e})] = mucc::from_compute<{ty}>({v});",
                    self.tile_ref(t)
                )
            }
            Sink::Global(o) => {
                let (p, l) = self.global_out(o, space, order);
                format!(
                    "{p}[{l}::offset({e})] = mucc::from_compute<{}>({v});",
                    self.t()
                )
            }
            Sink::Copy => {
                return Err(self.err("internal: a copy chain has no value sink".into()));
            }
            Sink::Accum(a) => {
                let TbOpKind::Accum(kind) = self.tb.ops[a].kind else {
                    unreachable!()
                };
                let out = self.tb.ops[a].outputs[0];
                match (&self.kp.ops[a.index()], kind) {
                    (OpPlan::Accum { storage, .. }, AccumKind::Max) if storage.in_registers() => {
                        format!(
                            "acc{}[{r}] = acc{}[{r}] > ({v}) ? acc{}[{r}] : ({v});",
                            a.index(),
                            a.index(),
                            a.index()
                        )
                    }
                    (OpPlan::Accum { storage, .. }, _) if storage.in_registers() => {
                        format!("acc{}[{r}] += {v};", a.index())
                    }
                    (_, AccumKind::Max) => {
                        let l = self.tile_layout(out, order)?;
                        let p = self.tile_ref(out);
                        format!(
                            "{{ const {c} x_ = {v}; {p}[{l}::offset({e})] = {p}[{l}::offset({e})] > x_ ? {p}[{l}::offset({e})] : x_; }}",
                            c = self.compute()
                        )
                    }
                    (_, AccumKind::Nored) => {
                        let l = self.tile_layout(out, order)?;
                        format!("{}[{l}::offset({e})] += {v};", self.tile_ref(out))
                    }
                    (_, AccumKind::NoredRescale) => {
                        let l = self.tile_layout(out, order)?;
                        let rt = self.tb.ops[a].inputs[1];
                        let rv = self.tile_read(rt, space, order, e)?;
                        let p = self.tile_ref(out);
                        format!("{p}[{l}::offset({e})] = {p}[{l}::offset({e})] * {rv} + ({v});")
                    }
                    _ => {
                        return Err(self.err(format!(
                            "internal: accumulator op{} is not element-wise",
                            a.index()
                        )));
                    }
                }
            }
        })
    }

    /// Emits one chain.
    fn chain(&mut self, c: usize, phase: Phase) -> Result<(), EmitError> {
        let chain = self.kp.fusion.chains[c].clone();
        let lead = chain.leader();
        let lop = self.tb.ops[lead].clone();
        let cp = self.kp.chains[c].clone();
        let (members, sink) = (cp.members, cp.sink);
        let names: Vec<String> = chain
            .ops
            .iter()
            .map(|&o| format!("op{} {}", o.index(), self.tb.ops[o].kind.name()))
            .collect();
        self.line(format!("// {}", names.join(" -> ")));
        let nt = self.nt;
        let cty = self.compute();
        match &lop.kind {
            TbOpKind::Input { .. } => self.input_copy(lead, phase)?,
            TbOpKind::Output { .. } => self.output_copy(lead)?,
            TbOpKind::Matmul => self.matmul_chain(lead, &members, sink)?,
            TbOpKind::RmsNorm => {
                let x = lop.inputs[0];
                let s = self.tb.tensors[x].shape;
                let split = self.row_split(lead)?;
                let (rows, len, tpr) = (split.rows, split.len, split.threads_per_row);
                let natural: Vec<usize> = (0..s.rank()).collect();
                let xr = self.tile_read(x, &s, &natural, &format!("row * {len} + j"))?;
                let out_v = self.members(&members, "v");
                let (per_elem, done) = match sink {
                    Sink::Accum(a) if self.accum_reduces(a) => {
                        let done = self.row_sink(a, "row", "s")?;
                        (format!("return {out_v};"), done)
                    }
                    _ => {
                        let st = self.sink_stmt(
                            sink,
                            &s,
                            &natural,
                            &format!("row * {len} + j"),
                            "0",
                            &out_v,
                        )?;
                        (format!("{st} return {cty}(0);"), String::new())
                    }
                };
                let total = !done.is_empty();
                self.line(format!(
                    "mucc::tb::rms_rows<{nt}, {tpr}, {rows}, {len}, {total}, {cty}>(tid, [&](int row, int j) {{ return {xr}; }}, [&](int row, int j, {cty} v) {{ (void)row; (void)j; {per_elem} }}, [&](int row, {cty} s) {{ (void)row; (void)s; {done} }});"
                ));
            }
            TbOpKind::Reduction {
                dim,
                kind: TbReduction::Max,
            } => {
                // Running max over iterations (out0, the state) and previous − new (out1).
                let x = lop.inputs[0];
                let (o0, o1) = (lop.outputs[0], lop.outputs[1]);
                let xs = self.tb.tensors[x].shape;
                let os = self.tb.tensors[o0].shape;
                let inner: usize = os.dims()[dim + 1..].iter().product();
                let k = xs.dim(*dim);
                let natural: Vec<usize> = (0..xs.rank()).collect();
                let lx = self.tile_layout(x, &natural)?;
                let l0 = self.tile_layout(o0, &natural)?;
                let l1 = self.tile_layout(o1, &natural)?;
                let (px, p0, p1) = (self.tile_ref(x), self.tile_ref(o0), self.tile_ref(o1));
                let (t0, t1) = (self.tile_ctype(o0), self.tile_ctype(o1));
                self.line(format!(
                    "mucc::tb::for_each<{nt}, {}>(tid, [&](int o, int) {{ const int base = (o / {inner}) * {} + o % {inner}; {cty} m = mucc::neg_inf<{cty}>(); for (int k = 0; k < {k}; ++k) {{ const {cty} x = mucc::to_compute({px}[{lx}::offset(base + k * {inner})]); m = x > m || x != x ? x : m; }} const {cty} old = mucc::to_compute({p0}[{l0}::offset(o)]); const {cty} nw = m > old || m != m ? m : old; {p0}[{l0}::offset(o)] = mucc::from_compute<{t0}>(nw); {p1}[{l1}::offset(o)] = mucc::from_compute<{t1}>(old == nw ? {cty}(0) : old - nw); }});",
                    os.numel(),
                    k * inner
                ));
            }
            TbOpKind::Reduction { dim, kind } => {
                let x = lop.inputs[0];
                let xs = self.tb.tensors[x].shape;
                let os = self.tb.tensors[lop.outputs[0]].shape;
                let to = if *kind == TbReduction::ToDimx {
                    self.tb.reduction_dimx
                } else {
                    1
                };
                let k = xs.dim(*dim) / to;
                let inner: usize = os.dims()[dim + 1..].iter().product();
                let natural: Vec<usize> = (0..xs.rank()).collect();
                let idx = format!(
                    "(row / {ti}) * {tki} + (j * {to} + (row / {inner}) % {to}) * {inner} + row % {inner}",
                    ti = to * inner,
                    tki = to * k * inner
                );
                let xr = self.tile_read(x, &xs, &natural, &idx)?;
                let v = self.members(&members, "s");
                let st = self.sink_stmt(sink, &os, &natural, "row", "0", &v)?;
                let split = self.row_split(lead)?;
                let (rows, tpr) = (split.rows, split.threads_per_row);
                self.line(format!(
                    "mucc::tb::for_each_row<{nt}, {tpr}, {rows}, {k}, {cty}>(tid, [&](int row, int j) {{ return {xr}; }}, [&](int row, {cty} s) {{ {st} }});"
                ));
            }
            _ => self.elementwise_chain(lead, &lop, &members, sink)?,
        }
        Ok(())
    }

    /// The plan's row split of row-reducing operator `op`.
    fn row_split(&self, op: Handle<TbOp>) -> Result<crate::sched::ops::RowSplit, EmitError> {
        match &self.kp.ops[op.index()] {
            OpPlan::RowReduce(split)
            | OpPlan::Accum {
                rows: Some(split), ..
            } => Ok(*split),
            _ => Err(self.err(format!("internal: op{} has no row split", op.index()))),
        }
    }

    fn accum_reduces(&self, a: Handle<TbOp>) -> bool {
        matches!(self.tb.ops[a].kind, TbOpKind::Accum(k) if k.reduces_last_dim())
    }

    /// Statement adding row sum `s` of row `row` into reducing accumulator `a`.
    fn row_sink(&mut self, a: Handle<TbOp>, row: &str, s: &str) -> Result<String, EmitError> {
        let TbOpKind::Accum(kind) = self.tb.ops[a].kind else {
            unreachable!()
        };
        let out = self.tb.ops[a].outputs[0];
        let os = self.tb.tensors[out].shape;
        let natural: Vec<usize> = (0..os.rank()).collect();
        let l = self.tile_layout(out, &natural)?;
        let p = self.tile_ref(out);
        Ok(match kind {
            AccumKind::RedLdSumRescale => {
                let rt = self.tb.ops[a].inputs[1];
                let rv = self.tile_read(rt, &os, &natural, row)?;
                format!("{p}[{l}::offset({row})] = {p}[{l}::offset({row})] * {rv} + {s};")
            }
            _ => format!("{p}[{l}::offset({row})] += {s};"),
        })
    }

    /// An element-wise chain (unary, binary, concat leaders, or an accumulator as leader).
    fn elementwise_chain(
        &mut self,
        lead: Handle<TbOp>,
        lop: &TbOp,
        members: &[Handle<TbOp>],
        sink: Sink,
    ) -> Result<(), EmitError> {
        let nt = self.nt;
        let cty = self.compute();
        // The space the leader produces (an accumulator leader: its input's).
        let space = match &lop.kind {
            TbOpKind::Accum(_) => self.tb.tensors[lop.inputs[0]].shape,
            _ => self.tb.tensors[lop.outputs[0]].shape,
        };
        let reducing = matches!(sink, Sink::Accum(a) if self.accum_reduces(a));
        let redtox = matches!(sink, Sink::Accum(a) if matches!(self.tb.ops[a].kind, TbOpKind::Accum(AccumKind::RedtoxLdSum)));
        let order = self.order(lead);
        let value = |ctx: &mut Self, e: &str| -> Result<String, EmitError> {
            let v = match &lop.kind {
                TbOpKind::Unary(u) => {
                    let x = ctx.tile_read(lop.inputs[0], &space, &order, e)?;
                    ctx.unary_expr(u, &x)
                }
                TbOpKind::Binary(b) => {
                    let x = ctx.tile_read(lop.inputs[0], &space, &order, e)?;
                    let y = ctx.tile_read(lop.inputs[1], &space, &order, e)?;
                    format!("mucc::op::{}({x}, {y})", Self::binary_fn(*b))
                }
                TbOpKind::Concat { dim } => {
                    let (a, b) = (lop.inputs[0], lop.inputs[1]);
                    let (sa, sb) = (ctx.tb.tensors[a].shape, ctx.tb.tensors[b].shape);
                    let inner: usize = space.dims()[dim + 1..].iter().product();
                    let (eo, ea, eb) = (space.dim(*dim), sa.dim(*dim), sb.dim(*dim));
                    let nat_a: Vec<usize> = (0..sa.rank()).collect();
                    let ia = format!(
                        "((({e}) / {}) * {ea} + (({e}) / {inner}) % {eo}) * {inner} + ({e}) % {inner}",
                        eo * inner
                    );
                    let ib = format!(
                        "((({e}) / {}) * {eb} + (({e}) / {inner}) % {eo} - {ea}) * {inner} + ({e}) % {inner}",
                        eo * inner
                    );
                    let ra = ctx.tile_read(a, &sa, &nat_a, &ia)?;
                    let rb = ctx.tile_read(b, &sb, &nat_a, &ib)?;
                    format!("((({e}) / {inner}) % {eo} < {ea} ? {ra} : {rb})")
                }
                TbOpKind::Accum(_) => ctx.tile_read(lop.inputs[0], &space, &order, e)?,
                other => {
                    return Err(ctx.err(format!(
                        "not yet supported: threadblock operator {} as a chain leader",
                        other.name()
                    )));
                }
            };
            Ok(ctx.members(members, &v))
        };
        if redtox {
            let Sink::Accum(a) = sink else { unreachable!() };
            let out = self.tb.ops[a].outputs[0];
            let os = self.tb.tensors[out].shape;
            let dimx = self.tb.reduction_dimx;
            let len = space.dim(space.rank() - 1);
            let k = len / dimx;
            let e = format!("(o / {dimx}) * {len} + kk * {dimx} + o % {dimx}");
            let v = value(self, &e)?;
            let natural: Vec<usize> = (0..os.rank()).collect();
            let l = self.tile_layout(out, &natural)?;
            let p = self.tile_ref(out);
            self.line(format!(
                "mucc::tb::for_each<{nt}, {}>(tid, [&](int o, int) {{ {cty} s = 0; for (int kk = 0; kk < {k}; ++kk) s += {v}; {p}[{l}::offset(o)] += s; }});",
                os.numel()
            ));
            return Ok(());
        }
        if reducing {
            let Sink::Accum(a) = sink else { unreachable!() };
            let TbOpKind::Accum(kind) = self.tb.ops[a].kind else {
                unreachable!()
            };
            let split = self.row_split(a)?;
            let (rows, len, tpr) = (split.rows, split.len, split.threads_per_row);
            let v = value(self, &format!("row * {len} + j"))?;
            let elem = if kind == AccumKind::RedLdRms {
                format!("{{ const {cty} x_ = {v}; return x_ * x_; }}")
            } else {
                format!("return {v};")
            };
            let done = self.row_sink(a, "row", "s")?;
            self.line(format!(
                "mucc::tb::for_each_row<{nt}, {tpr}, {rows}, {len}, {cty}>(tid, [&](int row, int j) {{ {elem} }}, [&](int row, {cty} s) {{ {done} }});"
            ));
            return Ok(());
        }
        let v = value(self, "e")?;
        let st = self.sink_stmt(sink, &space, &order, "e", "r", &v)?;
        let unrolled = matches!(sink, Sink::Accum(a) if matches!(self.kp.ops[a.index()], OpPlan::Accum { storage: AccumStorage::Registers { .. }, .. }));
        let f = if unrolled {
            "for_each_unrolled"
        } else {
            "for_each"
        };
        self.line(format!(
            "mucc::tb::{f}<{nt}, {}>(tid, [&](int e, int r) {{ (void)r; {st} }});",
            space.numel()
        ));
        Ok(())
    }

    /// A matmul chain.
    fn matmul_chain(
        &mut self,
        lead: Handle<TbOp>,
        members: &[Handle<TbOp>],
        sink: Sink,
    ) -> Result<(), EmitError> {
        let lop = &self.tb.ops[lead];
        let (a, b, c) = (lop.inputs[0], lop.inputs[1], lop.outputs[0]);
        let (sa, sb, sc) = (
            self.tb.tensors[a].shape,
            self.tb.tensors[b].shape,
            self.tb.tensors[c].shape,
        );
        let r = sa.rank();
        let (m, k, n) = (sa.dim(r - 2), sa.dim(r - 1), sb.dim(r - 1));
        let natural: Vec<usize> = (0..r).collect();
        let la = self.tile_layout(a, &natural)?;
        let lb = self.tile_layout(b, &natural)?;
        let (pa, pb) = (self.tile_ref(a), self.tile_ref(b));
        let cty = self.compute();
        let dtype = self.tb.tensors[a].dtype;
        let e = format!("row * {n} + col");
        if sa.numel() != m * k || sb.numel() != k * n {
            return Err(self.err(format!(
                "not yet supported: tb op {} (matmul) multiplies batched tiles ({sa} · {sb}); only the last two dims may exceed 1",
                lead.index()
            )));
        }
        let (ta, tb) = (self.tile_ctype(a), self.tile_ctype(b));
        let mma = plan_uses_mma(self.kp, lead);
        let (wm, wn) = match &self.kp.ops[lead.index()] {
            OpPlan::Matmul { warps, .. } => *warps,
            _ => return Err(self.err(format!("internal: op{} has no matmul plan", lead.index()))),
        };
        if !mma {
            // FMA: a thread per element of C (also when an operand is an fp32 accumulator tile).
            let fma = self.alias(format!(
                "mucc::tb::FmaMatmul<{ta}, {tb}, {la}, {lb}, {m}, {n}, {k}>"
            ));
            let v = self.members(members, "v");
            let st = match sink {
                Sink::Accum(acc) if self.accum_reduces(acc) => {
                    self.matmul_reduce_sink(acc, "row", "col", &v)?
                }
                _ => self.sink_stmt(sink, &sc, &natural, &e, "r", &v)?,
            };
            let unrolled = matches!(sink, Sink::Accum(acc) if matches!(self.kp.ops[acc.index()], OpPlan::Accum { storage: AccumStorage::Registers { .. }, .. }));
            let f = if unrolled {
                "for_each_unrolled"
            } else {
                "for_each"
            };
            self.line(format!(
                "mucc::tb::{f}<{nt}, {}>(tid, [&](int e, int r) {{ (void)r; const int row = e / {n}, col = e % {n}; const {cty} v = {fma}::at({pa}, {pb}, row, col); {st} }});",
                m * n,
                nt = self.nt
            ));
            return Ok(());
        }
        let mt = self.alias(format!(
            "mucc::tb::Mma<{}, {la}, {lb}, {m}, {n}, {k}, {wm}, {wn}>",
            ctype(dtype)
        ));
        self.mma.insert(lead.index(), mt.clone());
        // Accumulating straight into a register fragment when nothing comes between.
        if let Sink::Accum(acc) = sink
            && members.is_empty()
            && matches!(self.tb.ops[acc].kind, TbOpKind::Accum(AccumKind::Nored))
            && matches!(
                self.kp.ops[acc.index()],
                OpPlan::Accum {
                    storage: AccumStorage::Registers { .. },
                    ..
                }
            )
        {
            self.line(format!(
                "{mt}::run(acc{}, {pa}, {pb}, smem, warp, lane);",
                acc.index()
            ));
            return Ok(());
        }
        let v = self.members(members, "v");
        let into_fragment = matches!(sink, Sink::Accum(acc) if !self.accum_reduces(acc) && matches!(self.kp.ops[acc.index()], OpPlan::Accum { storage: AccumStorage::Registers { .. }, .. }));
        if !into_fragment {
            // Stored or reduced: computed slice by slice (bounded registers for any N).
            let st = match sink {
                Sink::Accum(acc) if self.accum_reduces(acc) => {
                    self.matmul_reduce_sink(acc, "row", "col", &v)?
                }
                _ => self.sink_stmt(sink, &sc, &natural, &e, "0", &v)?,
            };
            self.line(format!("{mt}::apply({pa}, {pb}, smem, warp, lane, [&](int row, int col, float v) {{ {st} }});"));
            return Ok(());
        }
        let st = match sink {
            Sink::Accum(acc)
                if matches!(
                    self.kp.ops[acc.index()],
                    OpPlan::Accum {
                        storage: AccumStorage::Registers { .. },
                        ..
                    }
                ) =>
            {
                let op = if matches!(self.tb.ops[acc].kind, TbOpKind::Accum(AccumKind::Max)) {
                    "max"
                } else {
                    "add"
                };
                let ai = acc.index();
                if op == "max" {
                    format!(
                        "{{ const float x_ = {v}; acc{ai}.v[i][j][q] = acc{ai}.v[i][j][q] > x_ ? acc{ai}.v[i][j][q] : x_; }}"
                    )
                } else {
                    format!("acc{ai}.v[i][j][q] += {v};")
                }
            }
            _ => self.sink_stmt(sink, &sc, &natural, &e, "0", &v)?,
        };
        self.line(format!(
            "{{ {mt}::Frag c_; {mt}::zero(c_); {mt}::run(c_, {pa}, {pb}, smem, warp, lane); {mt}::each(c_, warp, lane, [&](int row, int col, float v, int i, int j, int q) {{ (void)i; (void)j; (void)q; {st} }}); }}"
        ));
        Ok(())
    }

    /// A matmul element accumulated into a reducing accumulator (shared-memory atomics).
    fn matmul_reduce_sink(
        &mut self,
        acc: Handle<TbOp>,
        row: &str,
        col: &str,
        v: &str,
    ) -> Result<String, EmitError> {
        let TbOpKind::Accum(kind) = self.tb.ops[acc].kind else {
            unreachable!()
        };
        let out = self.tb.ops[acc].outputs[0];
        let os = self.tb.tensors[out].shape;
        let natural: Vec<usize> = (0..os.rank()).collect();
        let l = self.tile_layout(out, &natural)?;
        let p = self.tile_ref(out);
        let n = os.dim(os.rank() - 1);
        Ok(match kind {
            AccumKind::RedLdSum | AccumKind::RedLdMean => {
                format!("atomicAdd(&{p}[{l}::offset({row})], {v});")
            }
            AccumKind::RedLdRms => {
                format!("{{ const float x_ = {v}; atomicAdd(&{p}[{l}::offset({row})], x_ * x_); }}")
            }
            AccumKind::RedtoxLdSum => {
                format!("atomicAdd(&{p}[{l}::offset({row} * {n} + {col} % {n})], {v});")
            }
            _ => {
                return Err(self.err(format!(
                    "not yet supported: accumulator {} after a matmul",
                    kind.name()
                )));
            }
        })
    }

    /// Block offset (elements) of the region of DTensor strides `strides` a map selects, with
    /// per-block extents `per_block` along mapped dims.
    fn block_offset(
        &self,
        map: crate::graph::ops::DimMap,
        strides: &[usize],
        per_block: impl Fn(usize) -> usize,
    ) -> String {
        let mut terms = Vec::new();
        for a in 0..3 {
            if let (true, Some(d)) = (self.tb.grid[a] > 1, map.axis(a)) {
                terms.push(format!(
                    "static_cast<mucc::i64>(blockIdx.{}) * {}",
                    AXIS_NAMES[a],
                    per_block(d) * strides[d]
                ));
            }
        }
        if terms.is_empty() {
            "0".into()
        } else {
            terms.join(" + ")
        }
    }

    /// The copy of one input tile; `slot` is the destination pointer expression and `iter` the
    /// iteration expression (or "0").
    fn input_copy_stmt(
        &mut self,
        op: Handle<TbOp>,
        dst: &str,
        iter: &str,
        asynchronous: bool,
    ) -> Result<String, EmitError> {
        let top = &self.tb.ops[op];
        let TbOpKind::Input {
            input, forloop_dim, ..
        } = top.kind
        else {
            unreachable!()
        };
        let t = top.outputs[0];
        let s = self.tb.tensors[t].shape;
        let dt = self.op.inputs[input];
        let dst_strides = self.plan.dtensors[dt.index()].strides.0.clone();
        let adv = forloop_dim.map_or(0, |f| s.dim(f) * dst_strides[f]);
        let src = if adv == 0 || iter == "0" {
            format!("gi{}", op.index())
        } else {
            format!("gi{} + static_cast<mucc::i64>({iter}) * {adv}", op.index())
        };
        let ty = ctype(self.tb.tensors[t].dtype);
        let nt = self.nt;
        Ok(match &self.kp.ops[op.index()] {
            OpPlan::Input {
                copy: Copy::Chunked { chunk_elems, .. },
                ..
            } => {
                let order = self.order(op);
                let sl = self.tile_layout(t, &order)?;
                let gl = self.strided_layout(&s, &s, &dst_strides, &order, None);
                let n = s.numel() / chunk_elems;
                if asynchronous {
                    format!(
                        "{{ const {ty}* src_ = {src}; mucc::tb::for_each<{nt}, {n}>(tid, [&](int c, int) {{ const int i = c * {chunk_elems}; mucc::sm80::cp_async_16({dst} + {sl}::offset(i), src_ + {gl}::offset(i)); }}); }}"
                    )
                } else {
                    format!(
                        "{{ const {ty}* src_ = {src}; mucc::tb::for_each<{nt}, {n}>(tid, [&](int c, int) {{ const int i = c * {chunk_elems}; *reinterpret_cast<mucc::Vec<{ty}, {chunk_elems}>*>({dst} + {sl}::offset(i)) = *reinterpret_cast<const mucc::Vec<{ty}, {chunk_elems}>*>(src_ + {gl}::offset(i)); }}); }}"
                    )
                }
            }
            _ => {
                let order = self.order(op);
                let sl = self.tile_layout(t, &order)?;
                let gl = self.strided_layout(&s, &s, &dst_strides, &order, None);
                format!(
                    "{{ const {ty}* src_ = {src}; mucc::tb::for_each<{nt}, {}>(tid, [&](int e, int) {{ {dst}[{sl}::offset(e)] = src_[{gl}::offset(e)]; }}); }}",
                    s.numel()
                )
            }
        })
    }

    fn input_copy(&mut self, op: Handle<TbOp>, phase: Phase) -> Result<(), EmitError> {
        let t = self.tb.ops[op].outputs[0];
        if self.stages.contains_key(&t.index()) {
            // Pipelined: issued ahead by the prologue and the prefetch step.
            return Ok(());
        }
        let iter = if phase == Phase::Loop { "it" } else { "0" };
        let dst = format!("s{}", t.index());
        let st = self.input_copy_stmt(op, &dst, iter, false)?;
        self.line(st);
        Ok(())
    }

    fn output_copy(&mut self, op: Handle<TbOp>) -> Result<(), EmitError> {
        let s_t = self.tb.ops[op].inputs[0];
        let s = self.tb.tensors[s_t].shape;
        let order = self.order(op);
        let chunk = match &self.kp.ops[op.index()] {
            OpPlan::Output {
                copy: Some(Copy::Chunked { chunk_elems, .. }),
            } => *chunk_elems,
            _ => 1,
        };
        let sl = self.tile_layout(s_t, &order)?;
        let (p, gl) = self.global_out(op, &s, &order);
        let nt = self.nt;
        let ty = self.t();
        let src = self.tile_ref(s_t);
        if chunk > 1 {
            self.line(format!(
                "mucc::tb::for_each<{nt}, {}>(tid, [&](int c, int) {{ const int i = c * {chunk}; *reinterpret_cast<mucc::Vec<{ty}, {chunk}>*>({p} + {gl}::offset(i)) = *reinterpret_cast<const mucc::Vec<{ty}, {chunk}>*>({src} + {sl}::offset(i)); }});",
                s.numel() / chunk
            ));
        } else {
            self.line(format!(
                "mucc::tb::for_each<{nt}, {}>(tid, [&](int e, int) {{ {p}[{gl}::offset(e)] = mucc::from_compute<{ty}>(mucc::to_compute({src}[{sl}::offset(e)])); }});",
                s.numel()
            ));
        }
        Ok(())
    }
}

/// Emits the kernel of customized operator `kn` (plan `kp`) and its launch-plan entry.
pub(super) fn emit(
    g: &KernelGraph,
    plan: &GraphPlan,
    kn: Handle<KnOp>,
    op: &KnOp,
    kp: &KernelPlan,
) -> Result<(KernelView, KernelLaunch), EmitError> {
    let crate::graph::kernel::KnOpKind::Customized(tb) = &op.kind else {
        return Err(EmitError::Unsupported {
            op: kn.index(),
            name: op.kind.name(),
            reason: "internal: a threadblock plan for an operator without a threadblock graph"
                .into(),
        });
    };
    let nt = kp.cta.threads;
    let mut ctx = Ctx {
        g,
        plan,
        kn,
        op,
        tb,
        kp,
        nt,
        lines: Vec::new(),
        aliases: BTreeMap::new(),
        alias_defs: Vec::new(),
        stages: BTreeMap::new(),
        mma: BTreeMap::new(),
    };
    for (h, top) in tb.ops.iter() {
        if let (
            TbOpKind::Input { .. },
            OpPlan::Input {
                stages,
                engine: CopyEngine::CpAsync,
                ..
            },
        ) = (&top.kind, &kp.ops[h.index()])
        {
            ctx.stages.insert(top.outputs[0].index(), *stages);
        }
    }
    let name = format!("k{}_customized", kn.index());
    let t = ctx.t();
    let cty = ctx.compute();
    let mut params = Vec::new();
    let mut args = Vec::new();
    for (j, &o) in op.outputs.iter().enumerate() {
        params.push(format!("{t}* __restrict__ out{j}"));
        args.push(plan.binding(o, g.tensors[o].dtype.bytes()));
    }
    for (i, &x) in op.inputs.iter().enumerate() {
        params.push(format!("const {t}* __restrict__ in{i}"));
        args.push(plan.binding(x, g.tensors[x].dtype.bytes()));
    }
    // Prologue: thread index, tiles, block offsets.
    ctx.line("extern __shared__ __align__(128) unsigned char smem[];");
    ctx.line("const int tid_k = static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));");
    ctx.line("const int tid = tid_k;");
    ctx.line("const int warp = tid / 32, lane = tid % 32;");
    ctx.line("(void)warp; (void)lane;");
    if kp.smem.base > 0 {
        ctx.line("if (tid < 4) reinterpret_cast<unsigned*>(smem)[tid] = 0u;  // zero page");
    }
    for (b, kind) in kp.smem.kinds.iter().enumerate() {
        let tile = kind.tile();
        let th = Handle::<STensor>::from_index(tile);
        let ty = ctx.tile_ctype(th);
        let off = kp.smem.offset(b);
        ctx.line(format!(
            "{ty}* s{tile} = reinterpret_cast<{ty}*>(smem + {off});  // {}",
            kp.smem.buffers[b].name
        ));
    }
    for (h, top) in tb.ops.iter() {
        match &top.kind {
            TbOpKind::Input { input, imap, .. } => {
                let d = g.tensors[op.inputs[*input]].shape;
                let st = plan.dtensors[op.inputs[*input].index()].strides.0.clone();
                let off = ctx.block_offset(*imap, &st, |dim| {
                    let a = (0..3)
                        .find(|&a| tb.grid[a] > 1 && imap.axis(a) == Some(dim))
                        .unwrap_or(0);
                    d.dim(dim) / tb.grid[a]
                });
                ctx.line(format!("const {t}* gi{} = in{input} + {off};", h.index()));
            }
            TbOpKind::Output { output, omap } => {
                let s = tb.tensors[top.inputs[0]].shape;
                let st = plan.dtensors[op.outputs[*output].index()].strides.0.clone();
                let off = ctx.block_offset(*omap, &st, |dim| s.dim(dim));
                ctx.line(format!("{t}* go{} = out{output} + {off};", h.index()));
            }
            _ => {}
        }
    }
    // Accumulator state.
    let mut smem_init = false;
    for (h, top) in tb.ops.iter() {
        let TbOpKind::Accum(kind) = top.kind else {
            continue;
        };
        let init = if kind == AccumKind::Max {
            format!("mucc::neg_inf<{cty}>()")
        } else {
            format!("{cty}(0)")
        };
        let out = top.outputs[0];
        match &kp.ops[h.index()] {
            OpPlan::Accum {
                storage:
                    AccumStorage::Registers {
                        per_thread,
                        fragment_of,
                    },
                ..
            } => {
                if let Some(mm) = *fragment_of {
                    let mt = matmul_type(&mut ctx, mm)?;
                    ctx.line(format!("{mt}::Frag acc{};", h.index()));
                    ctx.line(format!("for (int i = 0; i < {mt}::PM; ++i) for (int j = 0; j < {mt}::PN; ++j) for (int q = 0; q < 4; ++q) acc{}.v[i][j][q] = {init};", h.index()));
                } else {
                    let r = *per_thread;
                    ctx.line(format!("{cty} acc{}[{r}];", h.index()));
                    ctx.line(format!(
                        "#pragma unroll\nfor (int r = 0; r < {r}; ++r) acc{}[r] = {init};",
                        h.index()
                    ));
                }
            }
            _ => {
                let s = tb.tensors[out].shape;
                let natural: Vec<usize> = (0..s.rank()).collect();
                let l = ctx.tile_layout(out, &natural)?;
                let ty = ctx.tile_ctype(out);
                ctx.line(format!("mucc::tb::for_each<{nt}, {}>(tid, [&](int e, int) {{ s{}[{l}::offset(e)] = mucc::from_compute<{ty}>({init}); }});", s.numel(), out.index()));
                smem_init = true;
            }
        }
    }
    // reduction_max states start at −∞.
    for (_, top) in tb.ops.iter() {
        if let TbOpKind::Reduction {
            kind: TbReduction::Max,
            ..
        } = top.kind
        {
            let o0 = top.outputs[0];
            let s = tb.tensors[o0].shape;
            let natural: Vec<usize> = (0..s.rank()).collect();
            let l = ctx.tile_layout(o0, &natural)?;
            let ty = ctx.tile_ctype(o0);
            ctx.line(format!("mucc::tb::for_each<{nt}, {}>(tid, [&](int e, int) {{ s{}[{l}::offset(e)] = mucc::from_compute<{ty}>(mucc::neg_inf<{cty}>()); }});", s.numel(), o0.index()));
            smem_init = true;
        }
    }
    if smem_init || kp.smem.base > 0 {
        ctx.line("__syncthreads();");
    }
    // Pre-loop.
    let sched = &kp.schedule;
    for st in sched.pre_loop.clone() {
        match st {
            Step::Barrier(_) => ctx.line("__syncthreads();"),
            Step::Run(c) => ctx.chain(c, Phase::PreLoop)?,
        }
    }
    // Pipeline prologue.
    let f = tb.forloop_range;
    let pipelined: Vec<(Handle<TbOp>, usize, usize)> = tb
        .ops
        .iter()
        .filter_map(|(h, top)| {
            let t = top.outputs.first()?.index();
            ctx.stages.get(&t).map(|&s| (h, t, s))
        })
        .collect();
    let stages = pipelined.first().map_or(1, |p| p.2);
    let slot_elems = |ctx: &Ctx, t: usize| ctx.kp.tiles[t].as_ref().map_or(0, |g| g.phys_elems);
    if !pipelined.is_empty() {
        ctx.line(format!("// software pipeline: {stages} stages"));
        for s in 0..stages - 1 {
            let mut body = Vec::new();
            for &(h, t, _) in &pipelined {
                let dst = format!("s{t} + {}", s * slot_elems(&ctx, t));
                body.push(ctx.input_copy_stmt(h, &dst, &s.to_string(), true)?);
            }
            ctx.line(format!("if ({s} < {f}) {{ {} }}", body.join(" ")));
            ctx.line("mucc::sm80::cp_async_commit();");
        }
    }
    // The loop.
    ctx.line(format!("for (int it = 0; it < {f}; ++it) {{"));
    // Thread indices re-derived in every iteration, opaque to the optimiser: address arithmetic
    // is then recomputed where it is used instead of being hoisted out of the loop and held in
    // registers across iterations (which made large bodies spill).
    ctx.line("  const int tid = mucc::opaque(tid_k), warp = tid / 32, lane = tid % 32;");
    ctx.line("  (void)warp; (void)lane;");
    if !pipelined.is_empty() {
        for &(_, t, _) in &pipelined {
            let ty = ctx.tile_ctype(Handle::from_index(t));
            ctx.line(format!(
                "  {ty}* s{t}_cur = s{t} + (it % {stages}) * {};",
                slot_elems(&ctx, t)
            ));
        }
        ctx.line(format!("  mucc::sm80::cp_async_wait<{}>();", stages - 2));
    }
    let mut prefetched = pipelined.is_empty();
    let prefetch = |ctx: &mut Ctx| -> Result<(), EmitError> {
        let mut body = Vec::new();
        for &(h, t, _) in &pipelined {
            let dst = format!("s{t} + (pf % {stages}) * {}", slot_elems(ctx, t));
            body.push(ctx.input_copy_stmt(h, &dst, "pf", true)?);
        }
        ctx.line(format!(
            "  {{ const int pf = it + {}; if (pf < {f}) {{ {} }} mucc::sm80::cp_async_commit(); }}",
            stages - 1,
            body.join(" ")
        ));
        Ok(())
    };
    let mut body_ends_with_barrier = false;
    for st in sched.body.clone() {
        body_ends_with_barrier = matches!(st, Step::Barrier(_));
        match st {
            Step::Barrier(_) => {
                ctx.line("  __syncthreads();");
                if !prefetched {
                    prefetch(&mut ctx)?;
                    prefetched = true;
                }
            }
            Step::Run(c) => {
                let before = ctx.lines.len();
                ctx.chain(c, Phase::Loop)?;
                for l in &mut ctx.lines[before..] {
                    l.insert_str(0, "  ");
                }
            }
        }
    }
    if !prefetched {
        ctx.line("  __syncthreads();");
        prefetch(&mut ctx)?;
        body_ends_with_barrier = true;
    }
    ctx.line("}");
    // After the loop: register write-backs and accumulator finalisation. A write-back buffer may
    // share memory with tiles the loop body reads, so it waits for every thread to leave the
    // body unless the body already ends with a barrier.
    let mut wrote_barrier = body_ends_with_barrier;
    let mut finalize = Vec::new();
    for (h, top) in tb.ops.iter() {
        let TbOpKind::Accum(kind) = top.kind else {
            continue;
        };
        let out = top.outputs[0];
        let has_buffer =
            kp.tiles[out.index()].is_some() && kp.smem.buffer_of(out.index()).is_some();
        if let OpPlan::Accum {
            storage: AccumStorage::Registers { fragment_of, .. },
            ..
        } = &kp.ops[h.index()]
        {
            if !has_buffer {
                continue;
            }
            if !wrote_barrier {
                ctx.line("__syncthreads();  // the loop body's reads finish before write-backs");
                wrote_barrier = true;
            }
            let s = tb.tensors[out].shape;
            let natural: Vec<usize> = (0..s.rank()).collect();
            let ty = ctx.tile_ctype(out);
            let leader = kp.fusion.chain(h).leader();
            if let Some(mm) = *fragment_of {
                let mt = matmul_type(&mut ctx, mm)?;
                let l = ctx.tile_layout(out, &natural)?;
                let n = s.dim(s.rank() - 1);
                ctx.line(format!("{mt}::each(acc{}, warp, lane, [&](int row, int col, float v, int, int, int) {{ s{}[{l}::offset(row * {n} + col)] = mucc::from_compute<{ty}>(v); }});", h.index(), out.index()));
            } else {
                let order = ctx.order(leader);
                let l = ctx.tile_layout(out, &order)?;
                ctx.line(format!("mucc::tb::for_each_unrolled<{nt}, {}>(tid, [&](int e, int r) {{ s{}[{l}::offset(e)] = mucc::from_compute<{ty}>(acc{}[r]); }});", s.numel(), out.index(), h.index()));
            }
        }
        let lf = (tb.tensors[top.inputs[0]]
            .shape
            .dims()
            .last()
            .copied()
            .unwrap_or(1)
            * f) as f64;
        match kind {
            AccumKind::RedLdMean => finalize.push((out, format!("v / {cty}({})", f64_lit(lf)))),
            AccumKind::RedLdRms => {
                finalize.push((out, format!("mucc::op::sqrt(v / {cty}({}))", f64_lit(lf))))
            }
            _ => {}
        }
    }
    let post = sched.post_loop.clone();
    let post_iter = post.into_iter();
    // The first post-loop barrier (accumulators complete) comes before the finalisation.
    if !finalize.is_empty() {
        ctx.line("__syncthreads();");
        for (out, expr) in &finalize {
            let s = tb.tensors[*out].shape;
            let natural: Vec<usize> = (0..s.rank()).collect();
            let l = ctx.tile_layout(*out, &natural)?;
            let ty = ctx.tile_ctype(*out);
            ctx.line(format!("mucc::tb::for_each<{nt}, {}>(tid, [&](int e, int) {{ const {cty} v = mucc::to_compute(s{o}[{l}::offset(e)]); s{o}[{l}::offset(e)] = mucc::from_compute<{ty}>({expr}); }});", s.numel(), o = out.index()));
        }
    }
    for st in post_iter {
        match st {
            Step::Barrier(_) => ctx.line("__syncthreads();"),
            Step::Run(c) => ctx.chain(c, Phase::PostLoop)?,
        }
    }
    let mut body: Vec<String> = ctx
        .alias_defs
        .iter()
        .map(|a| a.trim_start().to_string())
        .collect();
    body.extend(
        ctx.lines
            .iter()
            .flat_map(|l| l.lines().map(str::to_string).collect::<Vec<_>>()),
    );
    let smem = kp.smem.total;
    let mut comment = format!(
        "kernel op {}: kn_customized_op grid ({}, {}, {}), block ({}, {}, {}), forloop {}, {smem} bytes of shared memory",
        kn.index(),
        tb.grid[0],
        tb.grid[1],
        tb.grid[2],
        tb.block[0],
        tb.block[1],
        tb.block[2],
        f
    );
    let _ = write!(comment, "; schedule {}", kp.schedule.compact(&kp.fusion));
    let view = KernelView {
        comment,
        name: name.clone(),
        launch_bounds: format!("{nt}, {}", kp.cta.min_blocks_per_sm),
        preamble: Vec::new(),
        params: params.join(", "),
        body,
    };
    let launch = KernelLaunch {
        name,
        grid: kp.cta.grid.map(|x| x as u32),
        block: kp.cta.block.map(|x| x as u32),
        dynamic_smem: smem as u32,
        args: args.into_iter().collect::<Vec<Binding>>(),
    };
    Ok((view, launch))
}

/// Whether the plan carries this matmul out with `mma.sync` (otherwise FMAs).
fn plan_uses_mma(kp: &KernelPlan, matmul: Handle<TbOp>) -> bool {
    matches!(&kp.ops[matmul.index()], OpPlan::Matmul { instr, .. } if instr.is_mma())
}

/// The `Mma` helper type of matmul `leader` (which the plan runs on tensor cores).
fn matmul_type(ctx: &mut Ctx, leader: Handle<TbOp>) -> Result<String, EmitError> {
    let lop = &ctx.tb.ops[leader];
    let (a, b) = (lop.inputs[0], lop.inputs[1]);
    let dtype = ctx.tb.tensors[a].dtype;
    let (sa, sb) = (ctx.tb.tensors[a].shape, ctx.tb.tensors[b].shape);
    let r = sa.rank();
    let (m, k, n) = (sa.dim(r - 2), sa.dim(r - 1), sb.dim(r - 1));
    let natural: Vec<usize> = (0..r).collect();
    let la = ctx.tile_layout(a, &natural)?;
    let lb = ctx.tile_layout(b, &natural)?;
    let (wm, wn) = match &ctx.kp.ops[leader.index()] {
        OpPlan::Matmul { warps, .. } => *warps,
        _ => (1, 1),
    };
    Ok(ctx.alias(format!(
        "mucc::tb::Mma<{}, {la}, {lb}, {m}, {n}, {k}, {wm}, {wn}>",
        ctype(dtype)
    )))
}
