//! Matmul chains: tensor-core products through `mucc::tb::Mma` (fragments accumulated in
//! registers, or results stored or reduced slice by slice), FMA products through
//! `mucc::tb::FmaMatmul`, as the matmul's plan says; and the write-back of register
//! accumulators after the loop.

use super::Ctx;
use super::chain::{at, natural, unused};
use crate::emit::EmitError;
use crate::emit::cxx::ctype;
use crate::emit::ir::{self, Expr, Func, Stmt};
use crate::graph::arena::Handle;
use crate::graph::ops::AccumKind;
use crate::graph::threadblock::{TbOp, TbOpKind};
use crate::sched::ops::{OpPlan, OperandLoad};
use crate::sched::plan::{ChainPlan, MatmulLowering, OnlinePipe, RegisterPipe, Sink};

impl Ctx<'_> {
    /// The `Mma` helper type of matmul `mm` (which the plan runs on tensor cores).
    pub(super) fn matmul_type(&mut self, mm: Handle<TbOp>) -> Result<String, EmitError> {
        let lop = &self.tb.ops[mm];
        let (a, b) = (lop.inputs[0], lop.inputs[1]);
        let dtype = self.tb.tensors[a].dtype;
        let (sa, sb) = (self.tb.tensors[a].shape, self.tb.tensors[b].shape);
        let r = sa.rank();
        let (m, k, n) = (sa.dim(r - 2), sa.dim(r - 1), sb.dim(r - 1));
        let OpPlan::Matmul {
            warps: (wm, wn),
            loads: (load_a, load_b),
            walks,
            ..
        } = self.kp.ops[mm.index()]
        else {
            return Err(self.internal(&format!("op{} has no matmul plan", mm.index())));
        };
        let nat = natural(&sa);
        // A piped A operand has no tile: its logical row-major layout only names its shape.
        let la = if load_a == OperandLoad::Fragment {
            let strides = sa.row_major_strides();
            self.alias(crate::emit::cxx::layout(sa.dims(), &strides.0, None))
        } else {
            self.tile_layout(a, &nat)?
        };
        let lb = self.tile_layout(b, &nat)?;
        // The consumer of a key split ([`RegisterPipe::keys`]) runs its K over that many warps.
        let keys = self
            .kp
            .register_pipes()
            .find(|p| p.matmul == mm && p.keys > 1)
            .map_or(String::new(), |p| format!(", {}", p.keys));
        Ok(self.alias(format!(
            "mucc::tb::Mma<{}, {la}, {lb}, {m}, {n}, {k}, {wm}, {wn}, {}, {}, {}, {}, {}{keys}>",
            ctype(dtype),
            crate::emit::cxx::operand_load(load_a),
            crate::emit::cxx::operand_load(load_b),
            walks.a,
            walks.b,
            walks.slice_n_tiles
        )))
    }

    /// A matmul chain.
    pub(super) fn matmul_chain(
        &mut self,
        lead: Handle<TbOp>,
        cp: &ChainPlan,
    ) -> Result<(), EmitError> {
        let lop = self.tb.ops[lead].clone();
        let (a, b, c) = (lop.inputs[0], lop.inputs[1], lop.outputs[0]);
        let (sa, sb, sc) = (
            self.tb.tensors[a].shape,
            self.tb.tensors[b].shape,
            self.tb.tensors[c].shape,
        );
        let r = sa.rank();
        let (m, k, n) = (sa.dim(r - 2), sa.dim(r - 1), sb.dim(r - 1));
        // Validation refuses threadblock matmuls with leading dims above 1.
        if sa.numel() != m * k || sb.numel() != k * n {
            return Err(self.internal(&format!(
                "tb op {} (matmul) of batched tiles ({sa} · {sb})",
                lead.index()
            )));
        }
        let Some(lowering) = cp.matmul else {
            return Err(self.internal(&format!("op{} has no matmul lowering", lead.index())));
        };
        let (pa, pb) = (self.tile_ref(a), self.tile_ref(b));
        let nat = natural(&sc);
        let reducing = matches!(cp.sink, Sink::Accum(acc) if self.accum_reduces(acc));
        // What each element (row, col) of the product becomes.
        let mut each = cp
            .members
            .is_empty()
            .then(Vec::new)
            .map_or_else(|| self.member_stmts(cp, None), Ok)?;
        if lowering == MatmulLowering::PerElement {
            // FMA: a thread per element of C (also when an operand is an fp32 accumulator tile).
            let (la, lb) = (self.tile_layout(a, &nat)?, self.tile_layout(b, &nat)?);
            let (ta, tb) = (self.tile_ctype(a), self.tile_ctype(b));
            let fma = self.alias(format!(
                "mucc::tb::FmaMatmul<{ta}, {tb}, {la}, {lb}, {m}, {n}, {k}>"
            ));
            each.extend(match cp.sink {
                Sink::Accum(acc) if reducing => {
                    self.reduce_atomic(acc, Expr::var("row"), Expr::var("col"))?
                }
                sink => self.sink_stmts(sink, &sc, &nat, &Expr::var("e"), &Expr::var("r"))?,
            });
            let c = self.compute();
            let into_registers =
                matches!(cp.sink, Sink::Accum(acc) if !reducing && self.in_registers(acc));
            let (f, rp) = if into_registers {
                ("for_each_unrolled", "int r")
            } else {
                ("for_each", "int")
            };
            let nt = self.nt;
            self.w.block(
                format!("mucc::tb::{f}<{nt}, {}>(tid, [&](int e, {rp})", m * n),
                ");",
                |w| {
                    w.line(format!("const int row = e / {n}, col = e % {n};"));
                    w.line(format!("{c} v = {fma}::at({pa}, {pb}, row, col);"));
                    ir::print(w, &each);
                },
            );
            return Ok(());
        }
        let mt = self.matmul_type(lead)?;
        let e = Expr::var("row").times(Expr::size(n)).plus(Expr::var("col"));
        match (lowering, cp.sink) {
            (MatmulLowering::IntoFragment, Sink::Accum(acc)) => {
                let i = acc.index();
                self.w
                    .line(format!("{mt}::run(acc{i}, {pa}, {pb}, smem, warp, lane);"));
            }
            (MatmulLowering::ThroughMembers, Sink::Accum(acc)) => {
                let i = acc.index();
                // acc.v[i][j][q]: the accumulator's fragment element.
                let elem = ["i", "j", "q"].iter().fold(
                    Expr::Field(Box::new(Expr::var(format!("acc{i}"))), "v"),
                    |e, x| at(e, Expr::var(*x)),
                );
                each.push(
                    if matches!(self.tb.ops[acc].kind, TbOpKind::Accum(AccumKind::Max)) {
                        Stmt::Assign(
                            elem.clone(),
                            Expr::Call(Func::TbMaxOf, vec![elem, Expr::var("v")]),
                        )
                    } else {
                        Stmt::AddAssign(elem, Expr::var("v"))
                    },
                );
                self.w.block("", "", |w| {
                    w.line(format!("{mt}::Frag c_;"));
                    w.line(format!("{mt}::zero(c_);"));
                    w.line(format!("{mt}::run(c_, {pa}, {pb}, smem, warp, lane);"));
                    w.block(
                        format!("{mt}::each(c_, warp, lane, [&](int row, int col, float v, int i, int j, int q)"),
                        ");",
                        |w| {
                            w.line("(void)row;");
                            w.line("(void)col;");
                            ir::print(w, &each);
                        },
                    );
                });
            }
            (MatmulLowering::SliceBySlice, sink) => {
                each.extend(match sink {
                    Sink::Accum(acc) if reducing => {
                        self.reduce_atomic(acc, Expr::var("row"), Expr::var("col"))?
                    }
                    sink => self.sink_stmts(sink, &sc, &nat, &e, &Expr::size(0))?,
                });
                self.w.block(
                    format!(
                        "{mt}::apply({pa}, {pb}, smem, warp, lane, [&](int row, int col, float v)"
                    ),
                    ");",
                    |w| ir::print(w, &each),
                );
            }
            (l, sink) => {
                return Err(self.internal(&format!("matmul lowering {l:?} into {sink:?}")));
            }
        }
        Ok(())
    }

    /// The producer's chain of a register pipe: its matmul into a fragment, the members applied
    /// and the values packed in the tile's 16-bit type, the row sums of the packed values into
    /// their accumulators, and the consumer matmul with the packed product as its A operand.
    pub(super) fn pipe_chain(
        &mut self,
        lead: Handle<TbOp>,
        cp: &ChainPlan,
        pipe: &RegisterPipe,
    ) -> Result<(), EmitError> {
        if cp.matmul != Some(MatmulLowering::Pipe) {
            return Err(self.internal(&format!(
                "op{} produces a register pipe but is not lowered as one",
                lead.index()
            )));
        }
        if let Some(online) = &pipe.online {
            return self.online_pipe_chain(lead, pipe, online);
        }
        let lop = self.tb.ops[lead].clone();
        let (pa, pb) = (self.tile_ref(lop.inputs[0]), self.tile_ref(lop.inputs[1]));
        let mt = self.matmul_type(lead)?;
        let mt2 = self.matmul_type(pipe.matmul)?;
        let b2 = self.tile_ref(self.tb.ops[pipe.matmul].inputs[1]);
        let acc = self.kp.fusion.chain(pipe.matmul).tail().index();
        let tile = Handle::from_index(pipe.tile);
        let ty = ctype(self.tb.tensors[tile].dtype);
        let c = self.compute();
        let mut each = vec![unused("row"), unused("col")];
        each.extend(self.member_stmts(cp, None)?);
        each.push(Stmt::Return(Some(Expr::var("v"))));
        let mut sums = Vec::new();
        for &r in &pipe.row_sums {
            let name = format!(
                "// op{} {}: row sums by shuffles",
                r.index(),
                self.tb.ops[r].kind.name()
            );
            sums.push((name, self.row_sink(r, &Expr::var("row"))?));
        }
        let (t, m2) = (pipe.tile, pipe.matmul.index());
        self.w.block("", "", |w| {
            w.line(format!(
                "// s{t} stays in registers: the product, through the members, packed in {ty}"
            ));
            w.line(format!("{mt}::Packed pk_;"));
            w.block("", "", |w| {
                w.line(format!("{mt}::Frag p_;"));
                w.line(format!("{mt}::zero(p_);"));
                w.line(format!("{mt}::run(p_, {pa}, {pb}, smem, warp, lane);"));
                w.block(
                    format!("{mt}::pack(pk_, p_, warp, lane, [&](int row, int col, {c} v)"),
                    ");",
                    |w| ir::print(w, &each),
                );
            });
            for (name, sink) in &sums {
                w.line(name);
                w.block(
                    format!("{mt}::row_sums(pk_, warp, lane, [&](int row, {c} s)"),
                    ");",
                    |w| ir::print(w, sink),
                );
            }
            w.line(format!("// op{m2} matmul: A from the packed product"));
            w.line(format!(
                "{mt2}::run_from<{mt}>(acc{acc}, pk_, {b2}, smem, warp, lane);"
            ));
        });
        Ok(())
    }

    /// The producer's chain of an online-softmax register pipe ([`OnlinePipe`]): the scores
    /// into a fragment, the running max, the packed exp(S − m) with its row sums, the rows of
    /// the output accumulator rescaled, l and m written per row, and the consumer matmul.
    fn online_pipe_chain(
        &mut self,
        lead: Handle<TbOp>,
        pipe: &RegisterPipe,
        o: &OnlinePipe,
    ) -> Result<(), EmitError> {
        let lop = self.tb.ops[lead].clone();
        let (pa, pb) = (self.tile_ref(lop.inputs[0]), self.tile_ref(lop.inputs[1]));
        let mt = self.matmul_type(lead)?;
        let mt2 = self.matmul_type(pipe.matmul)?;
        let b2 = self.tile_ref(self.tb.ops[pipe.matmul].inputs[1]);
        let acc = o.out_acc.index();
        let ty = ctype(self.tb.tensors[Handle::from_index(pipe.tile)].dtype);
        let row_store =
            |ctx: &mut Self, a: Handle<TbOp>| -> Result<(usize, String, &'static str), EmitError> {
                let out = ctx.tb.ops[a].outputs[0];
                let s = ctx.tb.tensors[out].shape;
                let l = ctx.tile_layout(out, &natural(&s))?;
                Ok((out.index(), l, ctx.tile_ctype(out)))
            };
        let (ls, ll, lty) = row_store(self, o.sum_acc)?;
        let (ms, ml, mty) = row_store(self, o.max_acc)?;
        let (t, m2, mx) = (pipe.tile, pipe.matmul.index(), o.max.index());
        let (sa, xa) = (o.sum_acc.index(), o.max_acc.index());
        let keys = pipe.keys;
        self.w.block("", "", |w| {
            if keys > 1 {
                w.line(format!(
                    "// s{t} in registers: exp(S - m), m op{mx}'s running max of this warp's keys"
                ));
                w.line(format!("// (the keys split over {keys} warps), packed in {ty}"));
            } else {
                w.line(format!(
                    "// s{t} stays in registers: exp(S - m) with op{mx}'s running max m, packed in {ty}"
                ));
            }
            w.line(format!("{mt}::Packed pk_;"));
            w.line(format!("float r_[{mt}::PM][2], l_[{mt}::PM][2];"));
            w.block("", "", |w| {
                w.line(format!("{mt}::Frag p_;"));
                w.line(format!("{mt}::zero(p_);"));
                w.line(format!("{mt}::run(p_, {pa}, {pb}, smem, warp, lane);"));
                w.line(format!(
                    "{mt}::online_pack(pk_, p_, rm{mx}_, r_, l_, warp, lane);"
                ));
            });
            if keys > 1 {
                // Each warp's l stays in registers; l and m reach their tiles after the loop
                // (`combine_keys`).
                w.line(format!(
                    "// op{acc} accum_nored_rescale: O <- O * r, rows of this warp's fragment"
                ));
                w.line(format!("{mt2}::scale_rows(acc{acc}, r_, warp);"));
                w.line(format!(
                    "// op{sa} accum_red_ld_sum_rescale: this warp's l <- l * r + sum, in registers"
                ));
                w.line("#pragma unroll");
                w.line(format!(
                    "for (int i = 0; i < {mt}::PM; ++i) for (int h = 0; h < 2; ++h) lw{sa}_[i][h] = lw{sa}_[i][h] * r_[i][h] + l_[i][h];"
                ));
                w.line(format!(
                    "// op{m2} matmul: A from the packed product, this warp's keys"
                ));
                w.line(format!(
                    "{mt2}::run_from_keys<{mt}>(acc{acc}, pk_, {b2}, smem, warp, lane);"
                ));
                return;
            }
            w.line(format!("// op{acc} accum_nored_rescale: O <- O * r, rows of the fragment"));
            w.line(format!("{mt2}::scale_rows(acc{acc}, r_, warp);"));
            w.line(format!(
                "// op{sa} accum_red_ld_sum_rescale and op{xa} accum_max: per row, by its first lane"
            ));
            w.block(
                format!("{mt}::each_row(warp, lane, [&](int row, int i, int h)"),
                ");",
                |w| {
                    w.line(format!(
                        "s{ls}[{ll}::offset(row)] = mucc::from_compute<{lty}>(mucc::to_compute(s{ls}[{ll}::offset(row)]) * r_[i][h] + l_[i][h]);"
                    ));
                    w.line(format!(
                        "s{ms}[{ml}::offset(row)] = mucc::from_compute<{mty}>(rm{mx}_[i][h]);"
                    ));
                },
            );
            w.line(format!("// op{m2} matmul: A from the packed product"));
            w.line(format!(
                "{mt2}::run_from<{mt}>(acc{acc}, pk_, {b2}, smem, warp, lane);"
            ));
        });
        Ok(())
    }

    /// After the loop of a key split ([`RegisterPipe::keys`] > 1): the warps' running maxima,
    /// row sums and output fragments combine into the tiles of `o`'s max, sum and output
    /// accumulators (`Mma::combine_keys`, every thread of the block).
    pub(super) fn combine_keys(
        &mut self,
        pipe: &RegisterPipe,
        o: &OnlinePipe,
    ) -> Result<(), EmitError> {
        let mt2 = self.matmul_type(pipe.matmul)?;
        let mut tile = |a: Handle<TbOp>| -> Result<(usize, String, &'static str), EmitError> {
            let out = self.tb.ops[a].outputs[0];
            let s = self.tb.tensors[out].shape;
            let l = self.tile_layout(out, &natural(&s))?;
            Ok((out.index(), l, self.tile_ctype(out)))
        };
        let (ms, ml, _) = tile(o.max_acc)?;
        let (ls, ll, _) = tile(o.sum_acc)?;
        let (os, ol, _) = tile(o.out_acc)?;
        let (mx, sa, acc) = (o.max.index(), o.sum_acc.index(), o.out_acc.index());
        let Some((slice, tile_bytes)) = self.kp.smem.kinds.iter().find_map(|k| match *k {
            crate::sched::plan::SmemKind::KeySplit {
                tile,
                slice_bytes,
                tile_bytes,
                ..
            } if tile == os => Some((slice_bytes, tile_bytes)),
            _ => None,
        }) else {
            return Err(self.internal(&format!("the key split of op{acc} has no buffer of slices")));
        };
        let nt = self.nt;
        self.w.line(format!(
            "// op{}, op{sa} and op{acc}: the {} warps' maxima, sums and output fragments combined",
            o.max_acc.index(),
            pipe.keys
        ));
        self.w.line(format!(
            "{mt2}::combine_keys<{ml}, {ll}, {ol}, {slice}, {tile_bytes}, {nt}>(acc{acc}, rm{mx}_, lw{sa}_, s{ms}, s{ls}, s{os}, tid, warp, lane);"
        ));
        Ok(())
    }

    /// Writes register accumulator `acc` into its shared-memory buffer: from the fragment of
    /// matmul `fragment_of`, or from each thread's share of the leader's walk.
    pub(super) fn write_back(
        &mut self,
        acc: Handle<TbOp>,
        fragment_of: Option<Handle<TbOp>>,
    ) -> Result<(), EmitError> {
        let out = self.tb.ops[acc].outputs[0];
        let s = self.tb.tensors[out].shape;
        let ty = self.tile_ctype(out);
        let (a, o, nt) = (acc.index(), out.index(), self.nt);
        if let Some(mm) = fragment_of {
            let mt = self.matmul_type(mm)?;
            let l = self.tile_layout(out, &natural(&s))?;
            let n = s.dim(s.rank() - 1);
            self.w.block(
                format!(
                    "{mt}::each(acc{a}, warp, lane, [&](int row, int col, float v, int, int, int)"
                ),
                ");",
                |w| {
                    w.line(format!(
                        "s{o}[{l}::offset(row * {n} + col)] = mucc::from_compute<{ty}>(v);"
                    ))
                },
            );
        } else {
            let order = self.order(acc);
            let l = self.tile_layout(out, &order)?;
            let n = s.numel();
            self.w.block(
                format!("mucc::tb::for_each_unrolled<{nt}, {n}>(tid, [&](int e, int r)"),
                ");",
                |w| {
                    w.line(format!(
                        "s{o}[{l}::offset(e)] = mucc::from_compute<{ty}>(acc{a}[r]);"
                    ))
                },
            );
        }
        Ok(())
    }
}
