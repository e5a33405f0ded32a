//! The body of a register-rows kernel ([`crate::sched::rows`]): every tile a per-thread
//! register array `v<tile>[rows × runs × vec]` (element `j` of run `k` of row `r` at
//! `(r·runs + k)·vec + j`, column `(k·threads + tid)·vec + j`), filled by one 16-byte load per
//! run of an input, transformed operator by operator, and stored by one 16-byte store per run
//! of an output. Row norms sum through `mucc::tb::block_sums` (one barrier each).

use super::Ctx;
use crate::emit::EmitError;
use crate::emit::cxx;
use crate::graph::threadblock::TbOpKind;
use crate::sched::rows::RegisterRows;

impl Ctx<'_> {
    /// Emits the whole body of a register-rows kernel.
    pub(super) fn rows_body(&mut self, r: &RegisterRows) -> Result<(), EmitError> {
        let (tb, kp, c) = (self.tb, self.kp, self.compute());
        let (rows, runs, vec, nt) = (r.rows, r.runs, r.vec, r.threads);
        let n = rows * runs * vec;
        self.w
            .line("const int tid = static_cast<int>(threadIdx.x);");
        if kp.dependent.is_programmatic() {
            self.w.line(
                "mucc::sm90::grid_dependency_wait();  // the previous kernel's results are visible",
            );
        }
        self.block_pointers()?;
        if r.row_sums > 0 {
            if r.scratch_bytes != r.row_sums * rows * (nt / 32) * std::mem::size_of::<f32>()
                || c != "float"
            {
                return Err(self.internal("the row sums' scratch is not the plan's"));
            }
            self.w.line(format!(
                "__shared__ {c} row_sums[{}][{}];  // per row norm: the warps' partial sums",
                r.row_sums,
                rows * nt / 32
            ));
        }
        // Run k of row r of a tile: its first register and its first column.
        let each_run = |w: &mut cxx::Writer, body: &mut dyn FnMut(&mut cxx::Writer)| {
            w.line("#pragma unroll");
            w.block(format!("for (int r = 0; r < {rows}; ++r)"), "", |w| {
                w.line("#pragma unroll");
                w.block(format!("for (int k = 0; k < {runs}; ++k)"), "", |w| {
                    w.line(format!("const int at = (r * {runs} + k) * {vec};"));
                    w.line(format!("const mucc::i64 col = (k * {nt} + tid) * {vec};"));
                    body(w);
                });
            });
        };
        let mut norms = 0;
        for (h, op) in tb.ops.iter() {
            self.w
                .line(format!("// op{} {}", h.index(), op.kind.name()));
            let offsets = |h: usize| -> Result<String, EmitError> {
                let o = r
                    .offsets_of(h)
                    .ok_or_else(|| self.internal(&format!("op{h} has no row offsets")))?;
                Ok(cxx::list(o))
            };
            match &op.kind {
                TbOpKind::Input { .. } => {
                    let v = op.outputs[0].index();
                    let o = offsets(h.index())?;
                    self.w.line(format!("{c} v{v}[{n}];"));
                    self.w.block("", "", |w| {
                        w.line(format!("constexpr mucc::i64 row_at[{rows}] = {{{o}}};"));
                        each_run(w, &mut |w| {
                            w.line(format!(
                                "const auto x = mucc::tb::load_run<{vec}, {c}>(gi{} + row_at[r] + col);",
                                h.index()
                            ));
                            w.line("#pragma unroll");
                            w.line(format!("for (int j = 0; j < {vec}; ++j) v{v}[at + j] = x[j];"));
                        });
                    });
                }
                TbOpKind::Output { .. } => {
                    let v = op.inputs[0].index();
                    let o = offsets(h.index())?;
                    if kp.triggers_next && h.index() == r.first_output {
                        self.w.line(
                            "mucc::sm90::launch_dependents();  // every input is read: the next \
                             kernel may launch",
                        );
                    }
                    self.w.block("", "", |w| {
                        w.line(format!("constexpr mucc::i64 row_at[{rows}] = {{{o}}};"));
                        each_run(w, &mut |w| {
                            w.line(format!("{c} y[{vec}];"));
                            w.line("#pragma unroll");
                            w.line(format!(
                                "for (int j = 0; j < {vec}; ++j) y[j] = v{v}[at + j];"
                            ));
                            w.line(format!(
                                "mucc::tb::store_run<{vec}>(go{} + row_at[r] + col, y);",
                                h.index()
                            ));
                        });
                    });
                }
                TbOpKind::Unary(u) => {
                    let (a, v) = (op.inputs[0].index(), op.outputs[0].index());
                    let f = cxx::unary(u, "x", c);
                    self.w.line(format!("{c} v{v}[{n}];"));
                    self.w.line("#pragma unroll");
                    self.w.line(format!(
                        "for (int i = 0; i < {n}; ++i) {{ const {c} x = v{a}[i]; v{v}[i] = {f}; }}"
                    ));
                }
                TbOpKind::Binary(b) => {
                    let (a, bb, v) = (
                        op.inputs[0].index(),
                        op.inputs[1].index(),
                        op.outputs[0].index(),
                    );
                    let f = cxx::binary(*b, &format!("v{a}[i]"), &format!("v{bb}[i]"));
                    self.w.line(format!("{c} v{v}[{n}];"));
                    self.w.line("#pragma unroll");
                    self.w
                        .line(format!("for (int i = 0; i < {n}; ++i) v{v}[i] = {f};"));
                }
                TbOpKind::Accum(_) => {
                    // One iteration: the accumulator holds its only input.
                    let (a, v) = (op.inputs[0].index(), op.outputs[0].index());
                    self.w.line(format!("auto& v{v} = v{a};"));
                }
                TbOpKind::RmsNorm => {
                    let (a, v) = (op.inputs[0].index(), op.outputs[0].index());
                    let cols = r.cols;
                    let slot = norms;
                    norms += 1;
                    self.w.line(format!("{c} v{v}[{n}];"));
                    self.w.block("", "", |w| {
                        w.line(format!("{c} ss[{rows}];"));
                        w.line("#pragma unroll");
                        w.block(format!("for (int r = 0; r < {rows}; ++r)"), "", |w| {
                            w.line(format!("ss[r] = {c}(0);"));
                            w.line("#pragma unroll");
                            w.line(format!(
                                "for (int i = 0; i < {}; ++i) ss[r] += v{a}[r * {} + i] * v{a}[r * {} + i];",
                                runs * vec,
                                runs * vec,
                                runs * vec
                            ));
                        });
                        w.line(format!(
                            "mucc::tb::block_sums<{nt}, {rows}>(ss, row_sums[{slot}], tid);"
                        ));
                        w.line("#pragma unroll");
                        w.block(format!("for (int r = 0; r < {rows}; ++r)"), "", |w| {
                            w.line(format!(
                                "const {c} scale = {c}(1) / mucc::op::sqrt(ss[r] / {c}({cols}));"
                            ));
                            w.line("#pragma unroll");
                            w.line(format!(
                                "for (int i = 0; i < {}; ++i) v{v}[r * {} + i] = v{a}[r * {} + i] * scale;",
                                runs * vec,
                                runs * vec,
                                runs * vec
                            ));
                        });
                    });
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
        Ok(())
    }
}
