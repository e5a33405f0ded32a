//! One pass per chain: the leader computes a value (element-wise operators, a row of rms_norm,
//! a reduction; matmuls in [`super::matmul`], copies in [`super::copy`]), the fused unary
//! operators transform it in registers, and the sink stores or accumulates it, as the chain's
//! plan says. Every pass is built as statements ([`crate::emit::ir`]).

use super::Ctx;
use crate::emit::EmitError;
use crate::emit::ir::{Expr, Func, Init, LoopForm, Param, Stmt, TArg, Ty};
use crate::graph::DType;
use crate::graph::arena::Handle;
use crate::graph::ops::{AccumKind, TbReduction};
use crate::graph::shape::Shape;
use crate::graph::threadblock::{TbOp, TbOpKind};
use crate::sched::ops::{OpPlan, RowSplit};
use crate::sched::order::Phase;
use crate::sched::plan::{ApproxExp, ChainPlan, Sink};

/// Natural (row-major) order of a shape's dims.
pub(super) fn natural(s: &Shape) -> Vec<usize> {
    (0..s.rank()).collect()
}

/// A variable.
fn var(name: &str) -> Expr {
    Expr::var(name)
}

/// An integer constant.
fn int(v: usize) -> Expr {
    Expr::size(v)
}

/// `base[index]`.
pub(super) fn at(base: Expr, index: Expr) -> Expr {
    Expr::Index(Box::new(base), Box::new(index))
}

/// `p[L::offset(e)]`: element `e` of a tile or tensor `p` through layout `l`.
pub(super) fn elem_at(p: &str, l: String, e: Expr) -> Expr {
    at(var(p), Expr::LayoutOffset(l, Box::new(e)))
}

/// `(void)name;`.
pub(super) fn unused(name: &str) -> Stmt {
    Stmt::Eval(Expr::Void(Box::new(var(name))))
}

/// An `int` parameter.
pub(super) fn int_param(name: &str) -> Param {
    Param::named(Ty::Int, name)
}

/// An `int` parameter the lambda ignores.
pub(super) fn unnamed_int() -> Param {
    Param {
        ty: Ty::Int,
        name: None,
    }
}

/// `call(args);` as a statement.
fn call(f: Func, args: Vec<Expr>) -> Stmt {
    Stmt::Eval(Expr::Call(f, args))
}

/// The first element of a run read by [`Ctx::tile_read`] (`in0_[j]` → `in0_[0]`); a broadcast
/// read is the same for every element.
fn first_of_run(e: &Expr) -> Expr {
    match e {
        Expr::Index(b, j) if **j == var("j") => at((**b).clone(), int(0)),
        other => other.clone(),
    }
}

impl Ctx<'_> {
    /// Emits chain `c`, which runs in `phase`.
    pub(super) fn chain(&mut self, c: usize, phase: Phase) -> Result<(), EmitError> {
        let chain = self.kp.fusion.chains[c].clone();
        let lead = chain.leader();
        let lop = self.tb.ops[lead].clone();
        let cp = self.kp.chains[c].clone();
        let names: Vec<String> = chain
            .ops
            .iter()
            .map(|&o| format!("op{} {}", o.index(), self.tb.ops[o].kind.name()))
            .collect();
        self.push(vec![Stmt::Remark(names.join(" -> "))]);
        if let Some(p) = self.kp.pipe_into(c) {
            let producer = self.kp.fusion.chains[p.producer].leader().index();
            self.push(vec![Stmt::Comment(format!(
                "runs in op{producer}'s chain: s{} stays in registers (register pipe)",
                p.tile
            ))]);
            return Ok(());
        }
        if let Some(p) = self.kp.pipe_from(c).cloned() {
            return self.pipe_chain(lead, &cp, &p);
        }
        let stmts = match &lop.kind {
            TbOpKind::Input { .. } => return self.input_copy(lead, phase),
            TbOpKind::Output { .. } => return self.output_copy(lead),
            TbOpKind::Matmul => return self.matmul_chain(lead, &cp),
            TbOpKind::RmsNorm => self.rms_chain(lead, &lop, &cp)?,
            TbOpKind::Reduction {
                dim,
                kind: TbReduction::Max,
            } => self.running_max(&lop, *dim)?,
            TbOpKind::Reduction { dim, kind } => {
                self.reduction_chain(lead, &lop, *dim, *kind, &cp)?
            }
            _ => self.elementwise_chain(&lop, &cp)?,
        };
        self.push(stmts);
        Ok(())
    }

    /// `v = u(v);` for each unary member of chain plan `cp` (the last one's `exp`
    /// approximate where the plan says so), `v = b(v, side);` (or `b(side, v)`) for each
    /// binary member, its side tile read at element `at.2` of `at.0` walked in `at.1` (chains
    /// with binary members are element-wise, so their emitters pass `at`).
    pub(super) fn member_stmts(
        &mut self,
        cp: &ChainPlan,
        at: Option<(&Shape, &[usize], &Expr)>,
    ) -> Result<Vec<Stmt>, EmitError> {
        let c = self.dtype().compute();
        let n = cp.members.len();
        let mut out = Vec::new();
        for (i, &m) in cp.members.iter().enumerate() {
            match &self.tb.ops[m].kind {
                TbOpKind::Unary(u) => {
                    let approx = cp.approx_exp.filter(|_| i + 1 == n);
                    out.push(Stmt::Assign(
                        var("v"),
                        unary(u, approx, cp.approx_logistic, c),
                    ));
                }
                TbOpKind::Binary(b) => {
                    let (Some((value, side)), Some((space, order, e))) =
                        (self.kp.fusion.side_input(self.tb, m), at)
                    else {
                        return Err(self.internal(&format!(
                            "binary op{} fused where no element index is known",
                            m.index()
                        )));
                    };
                    let x = self.tile_read(side, space, order, e)?;
                    let name = format!("side{i}");
                    out.push(Stmt::local(Ty::ConstElem(c), name.clone(), x));
                    let (l, r) = if value == 0 {
                        (var("v"), var(&name))
                    } else {
                        (var(&name), var("v"))
                    };
                    out.push(Stmt::Assign(
                        var("v"),
                        Expr::Binary(*b, Box::new(l), Box::new(r)),
                    ));
                }
                _ => {}
            }
        }
        Ok(out)
    }

    /// The plan's row split of `op` (a row-reducing operator or accumulator).
    fn row_split(&self, op: Handle<TbOp>) -> Result<RowSplit, EmitError> {
        match &self.kp.ops[op.index()] {
            OpPlan::RowReduce(split)
            | OpPlan::Accum {
                rows: Some(split), ..
            } => Ok(*split),
            _ => Err(self.internal(&format!("op{} has no row split", op.index()))),
        }
    }

    /// Statements storing or accumulating `v` (compute type) at element `e` of the chain's
    /// space `space` walked in `order`; `r` is the per-thread register slot.
    pub(super) fn sink_stmts(
        &mut self,
        sink: Sink,
        space: &Shape,
        order: &[usize],
        e: &Expr,
        r: &Expr,
    ) -> Result<Vec<Stmt>, EmitError> {
        Ok(match sink {
            Sink::Tile(t) => {
                let l = self.tile_layout(t, order)?;
                let ty = self.tile_dtype(t);
                let p = self.tile_ref(t);
                let v = self.stored_value(t, var("v"));
                vec![Stmt::Assign(
                    elem_at(&p, l, e.clone()),
                    Expr::TemplateCall(Func::FromCompute, vec![TArg::Elem(ty)], vec![v]),
                )]
            }
            Sink::Global(o) => {
                let (p, l) = self.global_out(o, space, order)?;
                vec![Stmt::Assign(
                    elem_at(&p, l, e.clone()),
                    Expr::TemplateCall(
                        Func::FromCompute,
                        vec![TArg::Elem(self.dtype())],
                        vec![var("v")],
                    ),
                )]
            }
            Sink::Copy => return Err(self.internal("a copy chain has no value sink")),
            Sink::Accum(a) if self.accum_reduces(a) => {
                let len = int(space.dim(space.rank() - 1));
                let row = e.clone().paren().over(len.clone());
                let col = e.clone().paren().modulo(len);
                self.reduce_atomic(a, row, col)?
            }
            Sink::Accum(a) => self.accum_stmts(a, space, order, e, r)?,
        })
    }

    /// Statements accumulating `v` into element-wise accumulator `a`.
    fn accum_stmts(
        &mut self,
        a: Handle<TbOp>,
        space: &Shape,
        order: &[usize],
        e: &Expr,
        r: &Expr,
    ) -> Result<Vec<Stmt>, EmitError> {
        let TbOpKind::Accum(kind) = self.tb.ops[a].kind else {
            return Err(self.internal("an accumulator sink names a non-accumulator"));
        };
        let i = a.index();
        if self.in_registers(a) {
            let reg = at(var(&format!("acc{i}")), r.clone());
            return match kind {
                AccumKind::Max => Ok(vec![Stmt::Assign(
                    reg.clone(),
                    Expr::Call(Func::TbMaxOf, vec![reg, var("v")]),
                )]),
                AccumKind::Nored => Ok(vec![Stmt::AddAssign(reg, var("v"))]),
                _ => Err(self.internal(&format!("accumulator op{i} cannot live in registers"))),
            };
        }
        let out = self.tb.ops[a].outputs[0];
        let l = self.tile_layout(out, order)?;
        let slot = elem_at(&self.tile_ref(out), l, e.clone());
        Ok(match kind {
            AccumKind::Max => vec![call(Func::TbAccMax, vec![slot, var("v")])],
            AccumKind::Nored => vec![call(Func::TbAccAdd, vec![slot, var("v")])],
            AccumKind::NoredRescale => {
                let scale = self.tb.ops[a].inputs[1];
                let read = self.tile_read(scale, space, order, e)?;
                vec![
                    Stmt::local(Ty::ConstElem(self.dtype().compute()), "scale", read),
                    call(Func::TbAccRescale, vec![slot, var("scale"), var("v")]),
                ]
            }
            _ => return Err(self.internal(&format!("accumulator op{i} reduces"))),
        })
    }

    /// Statements adding `v` at (`row`, `col`) of the space into reducing accumulator `a` with
    /// shared-memory atomics (its tile holds the compute type).
    pub(super) fn reduce_atomic(
        &mut self,
        a: Handle<TbOp>,
        row: Expr,
        col: Expr,
    ) -> Result<Vec<Stmt>, EmitError> {
        let TbOpKind::Accum(kind) = self.tb.ops[a].kind else {
            return Err(self.internal("an accumulator sink names a non-accumulator"));
        };
        let out = self.tb.ops[a].outputs[0];
        let os = self.tb.tensors[out].shape;
        let l = self.tile_layout(out, &natural(&os))?;
        let p = self.tile_ref(out);
        let n = int(os.dim(os.rank() - 1));
        let (index, value) = match kind {
            AccumKind::RedLdSum | AccumKind::RedLdMean => (row, var("v")),
            AccumKind::RedLdRms => (row, var("v").times(var("v"))),
            AccumKind::RedtoxLdSum => (
                row.paren().times(n.clone()).plus(col.paren().modulo(n)),
                var("v"),
            ),
            // Fusion never makes a rescaling accumulator a chain's sink (`graph::fusion`, rule 1:
            // it has a second input), so every reducing sink is one of the kinds above.
            _ => {
                return Err(self.internal(&format!(
                    "accumulator {} as the sink of a chain",
                    kind.name()
                )));
            }
        };
        Ok(vec![call(
            Func::AtomicAdd,
            vec![elem_at(&p, l, index).addr(), value],
        )])
    }

    /// Statements adding row sum `s` of row `row` into reducing accumulator `a`.
    pub(super) fn row_sink(&mut self, a: Handle<TbOp>, row: &Expr) -> Result<Vec<Stmt>, EmitError> {
        let out = self.tb.ops[a].outputs[0];
        let os = self.tb.tensors[out].shape;
        let natural = natural(&os);
        let l = self.tile_layout(out, &natural)?;
        let slot = elem_at(&self.tile_ref(out), l, row.clone());
        Ok(match self.tb.ops[a].kind {
            TbOpKind::Accum(AccumKind::RedLdSumRescale) => {
                let scale = self.tb.ops[a].inputs[1];
                let read = self.tile_read(scale, &os, &natural, row)?;
                vec![
                    Stmt::local(Ty::ConstElem(self.dtype().compute()), "scale", read),
                    call(Func::TbAccRescale, vec![slot, var("scale"), var("s")]),
                ]
            }
            _ => vec![call(Func::TbAccAdd, vec![slot, var("s")])],
        })
    }

    /// Statements declaring `v`, the leader's value at element `e` of `space` (walked in
    /// `order`), with the members applied.
    fn value_stmts(
        &mut self,
        lop: &TbOp,
        space: &Shape,
        order: &[usize],
        e: &Expr,
        cp: &ChainPlan,
    ) -> Result<Vec<Stmt>, EmitError> {
        let c = self.dtype().compute();
        let mut out = Vec::new();
        match &lop.kind {
            TbOpKind::Unary(u) => {
                let x = self.tile_read(lop.inputs[0], space, order, e)?;
                out.push(Stmt::local(Ty::Elem(c), "v", x));
                let approx = cp.approx_exp.filter(|_| cp.members.is_empty());
                out.push(Stmt::Assign(
                    var("v"),
                    unary(u, approx, cp.approx_logistic, c),
                ));
            }
            TbOpKind::Binary(b) => {
                let x = self.tile_read(lop.inputs[0], space, order, e)?;
                let y = self.tile_read(lop.inputs[1], space, order, e)?;
                out.push(Stmt::local(Ty::ConstElem(c), "x0", x));
                out.push(Stmt::local(Ty::ConstElem(c), "x1", y));
                out.push(Stmt::local(
                    Ty::Elem(c),
                    "v",
                    Expr::Binary(*b, Box::new(var("x0")), Box::new(var("x1"))),
                ));
            }
            TbOpKind::Concat { dim } => {
                let (a, b) = (lop.inputs[0], lop.inputs[1]);
                let (sa, sb) = (self.tb.tensors[a].shape, self.tb.tensors[b].shape);
                let inner: usize = space.dims()[dim + 1..].iter().product();
                let (eo, ea, eb) = (space.dim(*dim), sa.dim(*dim), sb.dim(*dim));
                let nat = natural(&sa);
                // (outer_ · e + mid_) · inner + in_, with `mid_` less A's extent for B.
                let element = |mid: Expr, extent: usize| {
                    var("outer_")
                        .times(int(extent))
                        .plus(mid)
                        .paren()
                        .times(int(inner))
                        .plus(var("in_"))
                };
                let ra = self.tile_read(a, &sa, &nat, &element(var("mid_"), ea))?;
                let rb = self.tile_read(b, &sb, &nat, &element(var("mid_").minus(int(ea)), eb))?;
                let e = e.clone().paren();
                out.push(Stmt::DeclMany {
                    ty: Ty::ConstInt,
                    vars: vec![
                        ("outer_".into(), e.clone().over(int(eo * inner))),
                        (
                            "mid_".into(),
                            e.clone().over(int(inner)).paren().modulo(int(eo)),
                        ),
                        ("in_".into(), e.modulo(int(inner))),
                    ],
                });
                out.push(Stmt::Decl {
                    storage: crate::emit::ir::Storage::Auto,
                    ty: Ty::Elem(c),
                    name: "v".into(),
                    init: Init::None,
                });
                out.push(Stmt::IfElseLine(
                    Expr::Lt(Box::new(var("mid_")), Box::new(int(ea))),
                    Box::new(Stmt::Assign(var("v"), ra)),
                    Box::new(Stmt::Assign(var("v"), rb)),
                ));
            }
            TbOpKind::Accum(_) => {
                let x = self.tile_read(lop.inputs[0], space, order, e)?;
                out.push(Stmt::local(Ty::Elem(c), "v", x));
            }
            // `chain` sends only these kinds here (inputs, outputs, matmuls, rms_norm and
            // reductions have passes of their own).
            other => {
                return Err(self.internal(&format!(
                    "{} as the leader of an element-wise chain",
                    other.name()
                )));
            }
        }
        out.extend(self.member_stmts(cp, Some((space, order, e)))?);
        Ok(out)
    }

    /// The value statements of a run of `v` elements starting at element `e` (each tile read
    /// by one vector load, the element `j` of the run in the statements' loop) and those loads.
    fn vector_values(
        &mut self,
        lop: &TbOp,
        space: &Shape,
        order: &[usize],
        cp: &ChainPlan,
        v: usize,
    ) -> Result<(Vec<Stmt>, Vec<Stmt>), EmitError> {
        self.vector_loads = Some((v, Vec::new()));
        self.broadcast_reads = cp.broadcast_reads.clone();
        let body = self.value_stmts(lop, space, order, &var("e"), cp);
        let loads = self.vector_loads.take().map(|(_, l)| l).unwrap_or_default();
        self.broadcast_reads.clear();
        Ok((loads, body?))
    }

    /// An element-wise chain (unary, binary, concat leaders, or an accumulator as leader).
    fn elementwise_chain(&mut self, lop: &TbOp, cp: &ChainPlan) -> Result<Vec<Stmt>, EmitError> {
        let (nt, c) = (self.nt, self.dtype().compute());
        // The space the leader produces (an accumulator leader: its input's).
        let space = match &lop.kind {
            TbOpKind::Accum(_) => self.tb.tensors[lop.inputs[0]].shape,
            _ => self.tb.tensors[lop.outputs[0]].shape,
        };
        let order = cp.order.clone();
        if let Sink::Accum(a) = cp.sink
            && self.accum_reduces(a)
        {
            if matches!(self.tb.ops[a].kind, TbOpKind::Accum(AccumKind::RedtoxLdSum)) {
                return self.redtox_chain(a, lop, &space, &order, cp);
            }
            // Row sums, by the accumulator's row split.
            let split = self.row_split(a)?;
            let (rows, len, tpr) = (split.rows, split.len, split.threads_per_row);
            let rms = matches!(self.tb.ops[a].kind, TbOpKind::Accum(AccumKind::RedLdRms));
            let term = if rms {
                var("v").times(var("v"))
            } else {
                var("v")
            };
            let done = self.row_sink(a, &var("row"))?;
            let sink = Stmt::lambda(
                "sink",
                vec![int_param("row"), Param::named(Ty::Elem(c), "s")],
                done,
            );
            let mut targs = vec![
                TArg::int(nt),
                TArg::int(tpr),
                TArg::int(rows),
                TArg::int(len),
                TArg::Elem(c),
            ];
            let v = cp.vector;
            let elem = if v > 1 {
                // A run of v elements per call: one vector load per tile, the run's sum.
                let (loads, mut body) = self.vector_values(lop, &space, &order, cp, v)?;
                body.push(Stmt::AddAssign(var("s_"), term));
                targs.push(TArg::int(v));
                let mut elem = vec![Stmt::local(
                    Ty::ConstInt,
                    "e",
                    var("row").times(int(len)).plus(var("j0")),
                )];
                elem.extend(loads);
                elem.push(Stmt::local(Ty::Elem(c), "s_", Expr::Number(0.0, c)));
                elem.push(Stmt::for_block("j", int(v), true, body));
                elem.push(Stmt::Return(Some(var("s_"))));
                Stmt::lambda("elem", vec![int_param("row"), int_param("j0")], elem)
            } else {
                let e = var("row").times(int(len)).plus(var("j"));
                let mut elem = self.value_stmts(lop, &space, &order, &e, cp)?;
                elem.push(Stmt::Return(Some(term)));
                Stmt::lambda("elem", vec![int_param("row"), int_param("j")], elem)
            };
            return Ok(vec![Stmt::Block(vec![
                elem,
                sink,
                Stmt::eval(Expr::TemplateCall(
                    Func::TbForEachRow,
                    targs,
                    vec![var("tid"), var("elem"), var("sink")],
                )),
            ])]);
        }
        if cp.vector > 1 {
            return self.vector_chain(lop, cp, &space, &order);
        }
        let mut body = self.value_stmts(lop, &space, &order, &var("e"), cp)?;
        body.extend(self.sink_stmts(cp.sink, &space, &order, &var("e"), &var("r"))?);
        let unrolled = matches!(cp.sink, Sink::Accum(a) if self.in_registers(a));
        let (f, r) = if unrolled {
            (Func::TbForEachUnrolled, int_param("r"))
        } else {
            (Func::TbForEach, unnamed_int())
        };
        Ok(vec![Stmt::thread_loop(
            f,
            vec![TArg::int(nt), TArg::int(space.numel())],
            vec![int_param("e"), r],
            body,
        )])
    }

    /// A vectorised element-wise chain ([`crate::sched::ChainPlan::vector`] V > 1, a tile or
    /// device-tensor sink): each thread step loads V consecutive elements of every tile it reads
    /// with one vector load (a tile broadcast along the step: one scalar), computes them in
    /// registers and stores them with one vector store.
    fn vector_chain(
        &mut self,
        lop: &TbOp,
        cp: &ChainPlan,
        space: &Shape,
        order: &[usize],
    ) -> Result<Vec<Stmt>, EmitError> {
        let (p, l) = match cp.sink {
            Sink::Tile(sink) => (self.tile_ref(sink), self.tile_layout(sink, order)?),
            Sink::Global(o) => self.global_out(o, space, order)?,
            _ => {
                return Err(self.internal(
                    "a vectorised chain that stores to neither a tile nor a device tensor",
                ));
            }
        };
        let (nt, c, v) = (self.nt, self.dtype().compute(), cp.vector);
        let (loads, mut body) = self.vector_values(lop, space, order, cp, v)?;
        let value = match cp.sink {
            Sink::Tile(t) => self.stored_value(t, var("v")),
            _ => var("v"),
        };
        body.push(Stmt::Assign(at(var("out_"), var("j")), value));
        let mut step = loads;
        step.push(Stmt::array(Ty::Elem(c), "out_", vec![v]));
        step.push(Stmt::for_block("j", int(v), true, body));
        step.push(Stmt::eval(Expr::TemplateCall(
            Func::TbStoreRun,
            vec![TArg::int(v)],
            vec![
                var(&p).plus(Expr::LayoutOffset(l, Box::new(var("e")))),
                var("out_"),
            ],
        )));
        Ok(vec![Stmt::thread_loop(
            Func::TbForEachStep,
            vec![TArg::int(nt), TArg::int(space.numel()), TArg::int(v)],
            vec![int_param("e")],
            step,
        )])
    }

    /// A chain into a strided-group accumulator: each output element sums its group.
    fn redtox_chain(
        &mut self,
        a: Handle<TbOp>,
        lop: &TbOp,
        space: &Shape,
        order: &[usize],
        cp: &ChainPlan,
    ) -> Result<Vec<Stmt>, EmitError> {
        let (nt, c) = (self.nt, self.dtype().compute());
        let out = self.tb.ops[a].outputs[0];
        let os = self.tb.tensors[out].shape;
        let dimx = self.tb.reduction_dimx;
        let len = space.dim(space.rank() - 1);
        let k = len / dimx;
        // (o / dimx) · len + kk · dimx + o % dimx.
        let e = var("o")
            .over(int(dimx))
            .paren()
            .times(int(len))
            .plus(var("kk").times(int(dimx)))
            .plus(var("o").modulo(int(dimx)));
        let mut value = self.value_stmts(lop, space, order, &e, cp)?;
        value.push(Stmt::AddAssign(var("s"), var("v")));
        let l = self.tile_layout(out, &natural(&os))?;
        let p = self.tile_ref(out);
        Ok(vec![Stmt::thread_loop(
            Func::TbForEach,
            vec![TArg::int(nt), TArg::int(os.numel())],
            vec![int_param("o"), unnamed_int()],
            vec![
                Stmt::local(Ty::Elem(c), "s", Expr::Number(0.0, c)),
                Stmt::for_block("kk", int(k), false, value),
                call(Func::TbAccAdd, vec![elem_at(&p, l, var("o")), var("s")]),
            ],
        )])
    }

    /// rms_norm rows: the normalised values go through the members to the sink; a row-summing
    /// accumulator takes each row's total.
    fn rms_chain(
        &mut self,
        lead: Handle<TbOp>,
        lop: &TbOp,
        cp: &ChainPlan,
    ) -> Result<Vec<Stmt>, EmitError> {
        let (nt, c) = (self.nt, self.dtype().compute());
        let x = lop.inputs[0];
        let s = self.tb.tensors[x].shape;
        let split = self.row_split(lead)?;
        let (rows, len, tpr) = (split.rows, split.len, split.threads_per_row);
        let nat = natural(&s);
        let e = var("row").times(int(len)).plus(var("j"));
        let xr = self.tile_read(x, &s, &nat, &e)?;
        let mut out = vec![unused("row"), unused("j")];
        out.extend(self.member_stmts(cp, None)?);
        let mut done = vec![unused("row"), unused("s")];
        let total = match cp.sink {
            Sink::Accum(a)
                if self.accum_reduces(a)
                    && !matches!(self.tb.ops[a].kind, TbOpKind::Accum(AccumKind::RedtoxLdSum)) =>
            {
                let rms = matches!(self.tb.ops[a].kind, TbOpKind::Accum(AccumKind::RedLdRms));
                out.push(Stmt::Return(Some(if rms {
                    var("v").times(var("v"))
                } else {
                    var("v")
                })));
                done.extend(self.row_sink(a, &var("row"))?);
                true
            }
            sink => {
                out.extend(self.sink_stmts(sink, &s, &nat, &e, &int(0))?);
                out.push(Stmt::Return(Some(Expr::Number(0.0, c))));
                false
            }
        };
        Ok(vec![Stmt::Block(vec![
            Stmt::lambda(
                "x",
                vec![int_param("row"), int_param("j")],
                vec![Stmt::Return(Some(xr))],
            ),
            Stmt::lambda(
                "out",
                vec![
                    int_param("row"),
                    int_param("j"),
                    Param::named(Ty::Elem(c), "v"),
                ],
                out,
            ),
            Stmt::lambda(
                "done",
                vec![int_param("row"), Param::named(Ty::Elem(c), "s")],
                done,
            ),
            Stmt::eval(Expr::TemplateCall(
                Func::TbRmsRows,
                vec![
                    TArg::int(nt),
                    TArg::int(tpr),
                    TArg::int(rows),
                    TArg::int(len),
                    TArg::Bool(total),
                    TArg::Elem(c),
                ],
                vec![var("tid"), var("x"), var("out"), var("done")],
            )),
        ])])
    }

    /// A sum (or strided grouped sum) over one dim: a row per output element.
    fn reduction_chain(
        &mut self,
        lead: Handle<TbOp>,
        lop: &TbOp,
        dim: usize,
        kind: TbReduction,
        cp: &ChainPlan,
    ) -> Result<Vec<Stmt>, EmitError> {
        let (nt, c) = (self.nt, self.dtype().compute());
        let x = lop.inputs[0];
        let xs = self.tb.tensors[x].shape;
        let os = self.tb.tensors[lop.outputs[0]].shape;
        let to = if kind == TbReduction::ToDimx {
            self.tb.reduction_dimx
        } else {
            1
        };
        let inner: usize = os.dims()[dim + 1..].iter().product();
        let split = self.row_split(lead)?;
        // The elements reduced per row: the plan's (a dim, or a dim / dimx for to-dimx).
        let (rows, tpr, k) = (split.rows, split.threads_per_row, split.len);
        // The element function: one element, or (a plain max by vectors, the plan's width) a
        // run of v elements of a row by one vector load, the run's max.
        let v = cp.vector;
        let by_vectors = v > 1;
        if by_vectors && !(kind == TbReduction::PlainMax && inner == 1) {
            return Err(self.internal(&format!(
                "op{} reduces by vectors of {v}, which only a plain max over the last dim does",
                lead.index()
            )));
        }
        let elem = if by_vectors {
            self.vector_loads = Some((v, Vec::new()));
            self.broadcast_reads = cp.broadcast_reads.clone();
            let x0 = self.tile_read(x, &xs, &natural(&xs), &var("e"));
            let mut elem = vec![Stmt::local(
                Ty::ConstInt,
                "e",
                var("row").times(int(k)).plus(var("j0")),
            )];
            elem.extend(self.vector_loads.take().map(|(_, l)| l).unwrap_or_default());
            self.broadcast_reads.clear();
            let x0 = x0?;
            elem.push(Stmt::local(Ty::Elem(c), "s_", first_of_run(&x0)));
            elem.push(Stmt::For {
                var: "j".into(),
                from: int(1),
                to: int(v),
                unroll: true,
                form: LoopForm::Block,
                body: vec![Stmt::Assign(
                    var("s_"),
                    Expr::Call(Func::TbMaxJoin, vec![var("s_"), x0]),
                )],
            });
            elem.push(Stmt::Return(Some(var("s_"))));
            Stmt::lambda("elem", vec![int_param("row"), int_param("j0")], elem)
        } else {
            // (row / (to · inner)) · (to · k · inner) + (j · to + (row / inner) % to) · inner
            // + row % inner.
            let idx = var("row")
                .over(int(to * inner))
                .paren()
                .times(int(to * k * inner))
                .plus(
                    var("j")
                        .times(int(to))
                        .plus(var("row").over(int(inner)).paren().modulo(int(to)))
                        .paren()
                        .times(int(inner)),
                )
                .plus(var("row").modulo(int(inner)));
            let xr = self.tile_read(x, &xs, &natural(&xs), &idx)?;
            Stmt::lambda(
                "elem",
                vec![int_param("row"), int_param("j")],
                vec![Stmt::Return(Some(xr))],
            )
        };
        let mut sink = vec![Stmt::local(Ty::Elem(c), "v", var("s"))];
        sink.extend(self.member_stmts(cp, None)?);
        sink.extend(self.sink_stmts(cp.sink, &os, &natural(&os), &var("row"), &int(0))?);
        let mut targs = vec![
            TArg::int(nt),
            TArg::int(tpr),
            TArg::int(rows),
            TArg::int(k),
            TArg::Elem(c),
        ];
        // The combining operation: a sum unless the plain max, with its run length.
        if kind == TbReduction::PlainMax {
            targs.push(TArg::int(if by_vectors { v } else { 1 }));
            targs.push(TArg::MaxFunctor);
        }
        Ok(vec![Stmt::Block(vec![
            elem,
            Stmt::lambda(
                "sink",
                vec![int_param("row"), Param::named(Ty::Elem(c), "s")],
                sink,
            ),
            Stmt::eval(Expr::TemplateCall(
                Func::TbForEachRow,
                targs,
                vec![var("tid"), var("elem"), var("sink")],
            )),
        ])])
    }

    /// Running max over the iterations (out0, the state) and previous − new (out1).
    fn running_max(&mut self, lop: &TbOp, dim: usize) -> Result<Vec<Stmt>, EmitError> {
        let nt = self.nt;
        let x = lop.inputs[0];
        let (o0, o1) = (lop.outputs[0], lop.outputs[1]);
        let xs = self.tb.tensors[x].shape;
        let os = self.tb.tensors[o0].shape;
        let inner: usize = os.dims()[dim + 1..].iter().product();
        let k = xs.dim(dim);
        let nat = natural(&xs);
        let lx = self.tile_layout(x, &nat)?;
        let l0 = self.tile_layout(o0, &nat)?;
        let l1 = self.tile_layout(o1, &nat)?;
        let (px, p0, p1) = (self.tile_ref(x), self.tile_ref(o0), self.tile_ref(o1));
        Ok(vec![Stmt::eval(Expr::TemplateCall(
            Func::TbRunningMax,
            vec![
                TArg::int(nt),
                TArg::int(os.numel()),
                TArg::int(k),
                TArg::int(inner),
                TArg::Name(lx),
                TArg::Name(l0),
                TArg::Name(l1),
            ],
            vec![var("tid"), var(&px), var(&p0), var(&p1)],
        ))])
    }
}

/// `u(v)` in compute type `c`; `exp` through `ex2.approx` as `approx` says (the plan's
/// [`ChainPlan::approx_exp`]), silu and sigmoid by their approximate forms where `logistic`
/// ([`ChainPlan::approx_logistic`]).
fn unary(
    u: &crate::graph::ops::UnaryOp,
    approx: Option<ApproxExp>,
    logistic: bool,
    c: DType,
) -> Expr {
    use crate::graph::ops::UnaryOp;
    let f = match (u, approx) {
        (UnaryOp::Exp, Some(ApproxExp::Ex2)) => Func::ExpApprox,
        (UnaryOp::Exp, Some(ApproxExp::Ex2FlushToZero)) => Func::ExpApproxFtz,
        (UnaryOp::Silu, _) if logistic => Func::SiluApprox,
        (UnaryOp::Sigmoid, _) if logistic => Func::SigmoidApprox,
        (u, _) => return Expr::Unary(*u, Box::new(var("v")), c),
    };
    Expr::Call(f, vec![var("v")])
}
