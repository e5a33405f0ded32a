//! The body of a register-rows kernel ([`crate::sched::rows`]): every tile a per-thread
//! register array `v<tile>[rows × runs × vec]` (element `j` of run `k` of row `r` at
//! `(r·runs + k)·vec + j`, column `(k·threads + tid)·vec + j`), filled by one 16-byte load per
//! run of an input, transformed operator by operator, and stored by one 16-byte store per run
//! of an output. Row norms sum through `mucc::tb::block_sums` (one barrier each).

use super::Ctx;
use crate::emit::EmitError;
use crate::emit::ir::{Expr, Func, Stmt, Storage, Sym, TArg, Ty};
use crate::graph::DType;
use crate::graph::threadblock::TbOpKind;
use crate::sched::rows::RegisterRows;

/// `c v[n];` and an unrolled loop over its elements `i` running `body`: one element-wise
/// operator of a register row.
fn each_element(c: DType, v: &str, n: usize, body: Vec<Stmt>) -> [Stmt; 2] {
    [
        Stmt::array(Ty::Elem(c), v, vec![n]),
        Stmt::for_inline("i", Expr::size(n), true, body),
    ]
}

/// `base[index]`.
fn at(base: &str, index: Expr) -> Expr {
    Expr::Index(Box::new(Expr::var(base)), Box::new(index))
}

impl Ctx<'_> {
    /// The whole body of a register-rows kernel, as statements.
    pub(super) fn rows_body(&self, r: &RegisterRows) -> Result<Vec<Stmt>, EmitError> {
        let (tb, kp) = (self.tb, self.kp);
        let c = self.dtype().compute();
        let (rows, runs, vec, nt) = (r.rows, r.runs, r.vec, r.threads);
        let n = rows * runs * vec;
        let int = Expr::size;
        let var = Expr::var;
        let mut out = vec![Stmt::local(
            Ty::ConstInt,
            "tid",
            Expr::Call(Func::CastToInt, vec![Expr::Sym(Sym::ThreadIdx(0))]),
        )];
        if kp.dependent.is_programmatic() {
            out.push(
                Stmt::Eval(Expr::Call(Func::GridDependencyWait, vec![]))
                    .noted("the previous kernel's results are visible"),
            );
        }
        out.extend(self.block_pointers()?);
        if r.row_sums > 0 {
            if r.scratch_bytes != r.row_sums * rows * (nt / 32) * std::mem::size_of::<f32>()
                || c != crate::graph::DType::F32
            {
                return Err(self.internal("the row sums' scratch is not the plan's"));
            }
            out.push(
                Stmt::Array {
                    storage: Storage::Shared,
                    ty: Ty::Elem(c),
                    name: "row_sums".into(),
                    dims: vec![r.row_sums, rows * nt / 32],
                    init: None,
                }
                .noted("per row norm: the warps' partial sums"),
            );
        }
        // Run k of row r of a tile: its first register `at` and its first column `col`.
        // `(a · n + b) · vec`.
        let runs_of = |a: &str, n: usize, b: &str| {
            Expr::var(a)
                .times(int(n))
                .plus(Expr::var(b))
                .paren()
                .times(int(vec))
        };
        let each_run = |body: Vec<Stmt>| {
            let mut inner = vec![
                Stmt::local(Ty::ConstInt, "at", runs_of("r", runs, "k")),
                Stmt::local(Ty::ConstI64, "col", runs_of("k", nt, "tid")),
            ];
            inner.extend(body);
            Stmt::for_block(
                "r",
                int(rows),
                true,
                vec![Stmt::for_block("k", int(runs), true, inner)],
            )
        };
        // The plan's row offsets of op `h`'s tensor, as `row_at`.
        let row_at = |h: usize| -> Result<Stmt, EmitError> {
            let o = r
                .offsets_of(h)
                .ok_or_else(|| self.internal(&format!("op{h} has no row offsets")))?;
            Ok(Stmt::Array {
                storage: Storage::Auto,
                ty: Ty::ConstexprI64,
                name: "row_at".into(),
                dims: vec![rows],
                init: Some(o.iter().map(|&x| int(x)).collect()),
            })
        };
        // `p + row_at[r] + col`: run k of row r of a tile at pointer p.
        let run_of = |p: String| Expr::var(p).plus(at("row_at", var("r"))).plus(var("col"));
        let mut norms = 0;
        for (h, op) in tb.ops.iter() {
            out.push(Stmt::Comment(format!("op{} {}", h.index(), op.kind.name())));
            match &op.kind {
                TbOpKind::Input { .. } => {
                    let v = format!("v{}", op.outputs[0].index());
                    out.push(Stmt::array(Ty::Elem(c), &v, vec![n]));
                    let load = Expr::TemplateCall(
                        Func::TbLoadRun,
                        vec![TArg::int(vec), TArg::Elem(c)],
                        vec![run_of(format!("gi{}", h.index()))],
                    );
                    out.push(Stmt::Block(vec![
                        row_at(h.index())?,
                        each_run(vec![
                            Stmt::local(Ty::ConstAuto, "x", load),
                            Stmt::for_inline(
                                "j",
                                int(vec),
                                true,
                                vec![Stmt::Assign(
                                    at(&v, var("at").plus(var("j"))),
                                    at("x", var("j")),
                                )],
                            ),
                        ]),
                    ]));
                }
                TbOpKind::Output { .. } => {
                    let v = format!("v{}", op.inputs[0].index());
                    if kp.triggers_next && h.index() == r.first_output {
                        out.push(
                            Stmt::Eval(Expr::Call(Func::LaunchDependents, vec![]))
                                .noted("every input is read: the next kernel may launch"),
                        );
                    }
                    let store = Expr::TemplateCall(
                        Func::TbStoreRun,
                        vec![TArg::int(vec)],
                        vec![run_of(format!("go{}", h.index())), var("y")],
                    );
                    out.push(Stmt::Block(vec![
                        row_at(h.index())?,
                        each_run(vec![
                            Stmt::array(Ty::Elem(c), "y", vec![vec]),
                            Stmt::for_inline(
                                "j",
                                int(vec),
                                true,
                                vec![Stmt::Assign(
                                    at("y", var("j")),
                                    at(&v, var("at").plus(var("j"))),
                                )],
                            ),
                            Stmt::Eval(store),
                        ]),
                    ]));
                }
                TbOpKind::Unary(u) => {
                    let (a, v) = (
                        format!("v{}", op.inputs[0].index()),
                        format!("v{}", op.outputs[0].index()),
                    );
                    out.extend(each_element(
                        c,
                        &v,
                        n,
                        vec![
                            Stmt::local(Ty::ConstElem(c), "x", at(&a, var("i"))),
                            Stmt::Assign(at(&v, var("i")), Expr::Unary(*u, Box::new(var("x")), c)),
                        ],
                    ));
                }
                TbOpKind::Binary(b) => {
                    let (a, bb, v) = (
                        format!("v{}", op.inputs[0].index()),
                        format!("v{}", op.inputs[1].index()),
                        format!("v{}", op.outputs[0].index()),
                    );
                    out.extend(each_element(
                        c,
                        &v,
                        n,
                        vec![Stmt::Assign(
                            at(&v, var("i")),
                            Expr::Binary(
                                *b,
                                Box::new(at(&a, var("i"))),
                                Box::new(at(&bb, var("i"))),
                            ),
                        )],
                    ));
                }
                TbOpKind::Accum(_) => {
                    // One iteration: the accumulator holds its only input.
                    out.push(Stmt::local(
                        Ty::AutoRef,
                        format!("v{}", op.outputs[0].index()),
                        Expr::var(format!("v{}", op.inputs[0].index())),
                    ));
                }
                TbOpKind::RmsNorm => {
                    let (a, v) = (
                        format!("v{}", op.inputs[0].index()),
                        format!("v{}", op.outputs[0].index()),
                    );
                    let slot = norms;
                    norms += 1;
                    // Element i of row r of a tile.
                    let elem = |t: &str| at(t, var("r").times(int(runs * vec)).plus(var("i")));
                    let sums = Expr::TemplateCall(
                        Func::TbBlockSums,
                        vec![TArg::int(nt), TArg::int(rows)],
                        vec![var("ss"), at("row_sums", int(slot)), var("tid")],
                    );
                    // 1 / sqrt(mean of the squares): the row's length is the plan's.
                    let scale = Expr::Construct(c, Box::new(int(1))).over(Expr::Unary(
                        crate::graph::ops::UnaryOp::Sqrt,
                        Box::new(
                            at("ss", var("r")).over(Expr::Construct(c, Box::new(int(r.cols)))),
                        ),
                        c,
                    ));
                    out.push(Stmt::array(Ty::Elem(c), &v, vec![n]));
                    out.push(Stmt::Block(vec![
                        Stmt::array(Ty::Elem(c), "ss", vec![rows]),
                        Stmt::for_block(
                            "r",
                            int(rows),
                            true,
                            vec![
                                Stmt::Assign(
                                    at("ss", var("r")),
                                    Expr::Construct(c, Box::new(int(0))),
                                ),
                                Stmt::for_inline(
                                    "i",
                                    int(runs * vec),
                                    true,
                                    vec![Stmt::AddAssign(
                                        at("ss", var("r")),
                                        elem(&a).times(elem(&a)),
                                    )],
                                ),
                            ],
                        ),
                        Stmt::Eval(sums),
                        Stmt::for_block(
                            "r",
                            int(rows),
                            true,
                            vec![
                                Stmt::local(Ty::ConstElem(c), "scale", scale),
                                Stmt::for_inline(
                                    "i",
                                    int(runs * vec),
                                    true,
                                    vec![Stmt::Assign(elem(&v), elem(&a).times(var("scale")))],
                                ),
                            ],
                        ),
                    ]));
                }
                _ => {
                    return Err(self.internal(&format!(
                        "op{} {} in a register-rows kernel",
                        h.index(),
                        op.kind.name()
                    )));
                }
            }
        }
        Ok(out)
    }
}
