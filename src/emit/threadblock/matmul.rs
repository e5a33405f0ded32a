//! Matmul chains: tensor-core products through `mucc::tb::Mma` (fragments accumulated in
//! registers, or results stored or reduced slice by slice), FMA products through
//! `mucc::tb::FmaMatmul`, as the matmul's plan says; and the write-back of register
//! accumulators after the loop.

use super::Ctx;
use super::chain::{at, elem_at, int_param, natural, unnamed_int, unused};
use crate::emit::EmitError;
use crate::emit::cxx::ctype;
use crate::emit::ir::{
    AliasType, Expr, Func, Lambda, LoopForm, Method, MmaType, Nested, Param, Stmt, TArg, Ty,
};
use crate::graph::DType;
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
            self.alias(AliasType::layout(sa.dims(), &strides.0, None))
        } else {
            self.tile_layout(a, &nat)?
        };
        let lb = self.tile_layout(b, &nat)?;
        // The consumer of a key split ([`RegisterPipe::keys`]) runs its K over that many warps.
        let keys = self
            .kp
            .register_pipes()
            .find(|p| p.matmul == mm && p.keys > 1)
            .map(|p| p.keys);
        Ok(self.alias(AliasType::Mma(MmaType {
            dtype,
            la,
            lb,
            mnk: (m, n, k),
            warps: (wm, wn),
            loads: (load_a, load_b),
            walks,
            keys,
        })))
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
        let (pa, pb) = (var(&self.tile_ref(a)), var(&self.tile_ref(b)));
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
            let fma = self.alias(AliasType::Fma {
                a: self.tile_dtype(a),
                b: self.tile_dtype(b),
                la,
                lb,
                mnk: (m, n, k),
            });
            each.extend(match cp.sink {
                Sink::Accum(acc) if reducing => self.reduce_atomic(acc, var("row"), var("col"))?,
                sink => self.sink_stmts(sink, &sc, &nat, &var("e"), &var("r"))?,
            });
            let c = self.dtype().compute();
            let into_registers =
                matches!(cp.sink, Sink::Accum(acc) if !reducing && self.in_registers(acc));
            let (f, rp) = if into_registers {
                (Func::TbForEachUnrolled, int_param("r"))
            } else {
                (Func::TbForEach, unnamed_int())
            };
            let mut body = vec![
                Stmt::DeclMany {
                    ty: Ty::ConstInt,
                    vars: vec![
                        ("row".into(), var("e").over(Expr::size(n))),
                        ("col".into(), var("e").modulo(Expr::size(n))),
                    ],
                },
                Stmt::local(
                    Ty::Elem(c),
                    "v",
                    member(&fma, Method::At, vec![pa, pb, var("row"), var("col")]),
                ),
            ];
            body.extend(each);
            self.push(vec![Stmt::thread_loop(
                f,
                vec![TArg::int(self.nt), TArg::int(m * n)],
                vec![int_param("e"), rp],
                body,
            )]);
            return Ok(());
        }
        let mt = self.matmul_type(lead)?;
        let e = var("row").times(Expr::size(n)).plus(var("col"));
        let warp_args = |mut a: Vec<Expr>| {
            a.extend([var("smem"), var("warp"), var("lane")]);
            a
        };
        let stmts = match (lowering, cp.sink) {
            (MatmulLowering::IntoFragment, Sink::Accum(acc)) => {
                let acc = var(&format!("acc{}", acc.index()));
                vec![Stmt::eval(member(
                    &mt,
                    Method::Run,
                    warp_args(vec![acc, pa, pb]),
                ))]
            }
            (MatmulLowering::ThroughMembers, Sink::Accum(acc)) => {
                let i = acc.index();
                // acc.v[i][j][q]: the accumulator's fragment element.
                let elem = ["i", "j", "q"].iter().fold(
                    Expr::Field(Box::new(var(&format!("acc{i}"))), "v"),
                    |e, x| at(e, var(x)),
                );
                each.push(
                    if matches!(self.tb.ops[acc].kind, TbOpKind::Accum(AccumKind::Max)) {
                        Stmt::Assign(
                            elem.clone(),
                            Expr::Call(Func::TbMaxOf, vec![elem, var("v")]),
                        )
                    } else {
                        Stmt::AddAssign(elem, var("v"))
                    },
                );
                let mut body = vec![unused("row"), unused("col")];
                body.extend(each);
                vec![Stmt::Block(vec![
                    nested(&mt, Nested::Frag, "c_"),
                    Stmt::eval(member(&mt, Method::Zero, vec![var("c_")])),
                    Stmt::eval(member(&mt, Method::Run, warp_args(vec![var("c_"), pa, pb]))),
                    Stmt::CallWith {
                        call: member(&mt, Method::Each, vec![var("c_"), var("warp"), var("lane")]),
                        lambda: Lambda::new(
                            vec![
                                int_param("row"),
                                int_param("col"),
                                Param::named(Ty::Elem(DType::F32), "v"),
                                int_param("i"),
                                int_param("j"),
                                int_param("q"),
                            ],
                            body,
                        ),
                    },
                ])]
            }
            (MatmulLowering::SliceBySlice, sink) => {
                each.extend(match sink {
                    Sink::Accum(acc) if reducing => {
                        self.reduce_atomic(acc, var("row"), var("col"))?
                    }
                    sink => self.sink_stmts(sink, &sc, &nat, &e, &Expr::size(0))?,
                });
                vec![Stmt::CallWith {
                    call: member(&mt, Method::Apply, warp_args(vec![pa, pb])),
                    lambda: Lambda::new(
                        vec![
                            int_param("row"),
                            int_param("col"),
                            Param::named(Ty::Elem(DType::F32), "v"),
                        ],
                        each,
                    ),
                }]
            }
            (l, sink) => {
                return Err(self.internal(&format!("matmul lowering {l:?} into {sink:?}")));
            }
        };
        self.push(stmts);
        Ok(())
    }

    /// A register pipe's operands: the producer's A and B tiles, the producer's and the
    /// consumer's matmul classes, and the consumer's B tile (aliased in that order).
    fn pipe_operands(
        &mut self,
        lead: Handle<TbOp>,
        pipe: &RegisterPipe,
    ) -> Result<(Expr, Expr, String, String, Expr), EmitError> {
        let lop = self.tb.ops[lead].clone();
        let (pa, pb) = (
            var(&self.tile_ref(lop.inputs[0])),
            var(&self.tile_ref(lop.inputs[1])),
        );
        let mt = self.matmul_type(lead)?;
        let mt2 = self.matmul_type(pipe.matmul)?;
        let b2 = var(&self.tile_ref(self.tb.ops[pipe.matmul].inputs[1]));
        Ok((pa, pb, mt, mt2, b2))
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
        let (pa, pb, mt, mt2, b2) = self.pipe_operands(lead, pipe)?;
        let acc = self.kp.fusion.chain(pipe.matmul).tail().index();
        let tile = Handle::from_index(pipe.tile);
        let ty = ctype(self.tb.tensors[tile].dtype);
        let c = self.dtype().compute();
        let mut each = vec![unused("row"), unused("col")];
        each.extend(self.member_stmts(cp, None)?);
        each.push(Stmt::Return(Some(var("v"))));
        let mut sums = Vec::new();
        for &r in &pipe.row_sums {
            sums.push(Stmt::Comment(format!(
                "op{} {}: row sums by shuffles",
                r.index(),
                self.tb.ops[r].kind.name()
            )));
            let sink = self.row_sink(r, &var("row"))?;
            sums.push(Stmt::CallWith {
                call: member(
                    &mt,
                    Method::RowSums,
                    vec![var("pk_"), var("warp"), var("lane")],
                ),
                lambda: Lambda::new(vec![int_param("row"), Param::named(Ty::Elem(c), "s")], sink),
            });
        }
        let (t, m2) = (pipe.tile, pipe.matmul.index());
        let mut block = vec![
            Stmt::Comment(format!(
                "s{t} stays in registers: the product, through the members, packed in {ty}"
            )),
            nested(&mt, Nested::Packed, "pk_"),
            Stmt::Block(vec![
                nested(&mt, Nested::Frag, "p_"),
                Stmt::eval(member(&mt, Method::Zero, vec![var("p_")])),
                Stmt::eval(member(&mt, Method::Run, product_args(var("p_"), pa, pb))),
                Stmt::CallWith {
                    call: member(
                        &mt,
                        Method::Pack,
                        vec![var("pk_"), var("p_"), var("warp"), var("lane")],
                    ),
                    lambda: Lambda::new(
                        vec![
                            int_param("row"),
                            int_param("col"),
                            Param::named(Ty::Elem(c), "v"),
                        ],
                        each,
                    ),
                },
            ]),
        ];
        block.extend(sums);
        block.push(Stmt::Comment(format!(
            "op{m2} matmul: A from the packed product"
        )));
        block.push(Stmt::eval(Expr::Member(
            mt2,
            Method::RunFrom,
            vec![TArg::Name(mt)],
            product_args(var(&format!("acc{acc}")), var("pk_"), b2),
        )));
        self.push(vec![Stmt::Block(block)]);
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
        let (pa, pb, mt, mt2, b2) = self.pipe_operands(lead, pipe)?;
        let acc = o.out_acc.index();
        let ty = ctype(self.tb.tensors[Handle::from_index(pipe.tile)].dtype);
        let row_store =
            |ctx: &mut Self, a: Handle<TbOp>| -> Result<(usize, String, DType), EmitError> {
                let out = ctx.tb.ops[a].outputs[0];
                let s = ctx.tb.tensors[out].shape;
                let l = ctx.tile_layout(out, &natural(&s))?;
                Ok((out.index(), l, ctx.tile_dtype(out)))
            };
        let (ls, ll, lty) = row_store(self, o.sum_acc)?;
        let (ms, ml, mty) = row_store(self, o.max_acc)?;
        let (t, m2, mx) = (pipe.tile, pipe.matmul.index(), o.max.index());
        let (sa, xa) = (o.sum_acc.index(), o.max_acc.index());
        let keys = pipe.keys;
        let rows = || Expr::FragmentRows(mt.clone());
        // name[i][h].
        let ih = |name: &str| at(at(var(name), var("i")), var("h"));
        let mut block = if keys > 1 {
            vec![
                Stmt::Comment(format!(
                    "s{t} in registers: exp(S - m), m op{mx}'s running max of this warp's keys"
                )),
                Stmt::Comment(format!(
                    "(the keys split over {keys} warps), packed in {ty}"
                )),
            ]
        } else {
            vec![Stmt::Comment(format!(
                "s{t} stays in registers: exp(S - m) with op{mx}'s running max m, packed in {ty}"
            ))]
        };
        block.extend([
            nested(&mt, Nested::Packed, "pk_"),
            Stmt::Arrays {
                ty: Ty::Elem(DType::F32),
                names: vec!["r_".into(), "l_".into()],
                dims: vec![rows(), Expr::size(2)],
            },
            Stmt::Block(vec![
                nested(&mt, Nested::Frag, "p_"),
                Stmt::eval(member(&mt, Method::Zero, vec![var("p_")])),
                Stmt::eval(member(&mt, Method::Run, product_args(var("p_"), pa, pb))),
                Stmt::eval(member(
                    &mt,
                    Method::OnlinePack,
                    vec![
                        var("pk_"),
                        var("p_"),
                        var(&format!("rm{mx}_")),
                        var("r_"),
                        var("l_"),
                        var("warp"),
                        var("lane"),
                    ],
                )),
            ]),
        ]);
        let acc_v = var(&format!("acc{acc}"));
        let scale_rows = Stmt::eval(member(
            &mt2,
            Method::ScaleRows,
            vec![acc_v.clone(), var("r_"), var("warp")],
        ));
        // What differs with a key split: each warp's l stays in registers (l and m reach their
        // tiles after the loop, `combine_keys`) and the consumer runs on the warp's keys.
        let (rows_of, sums_note, sums, consumer, of_keys) = if keys > 1 {
            let lw = format!("lw{sa}_");
            (
                "rows of this warp's fragment",
                format!(
                    "op{sa} accum_red_ld_sum_rescale: this warp's l <- l * r + sum, in registers"
                ),
                Stmt::For {
                    var: "i".into(),
                    from: Expr::size(0),
                    to: rows(),
                    unroll: true,
                    form: LoopForm::SameLine,
                    body: vec![Stmt::for_inline(
                        "h",
                        Expr::size(2),
                        false,
                        vec![Stmt::Assign(
                            ih(&lw),
                            ih(&lw).times(ih("r_")).plus(ih("l_")),
                        )],
                    )],
                },
                Method::RunFromKeys,
                ", this warp's keys",
            )
        } else {
            let sum_slot = elem_at(&format!("s{ls}"), ll, var("row"));
            let max_slot = elem_at(&format!("s{ms}"), ml, var("row"));
            let store = |slot: Expr, ty: DType, v: Expr| {
                Stmt::Assign(
                    slot,
                    Expr::TemplateCall(Func::FromCompute, vec![TArg::Elem(ty)], vec![v]),
                )
            };
            let sum = Expr::Call(Func::ToCompute, vec![sum_slot.clone()])
                .times(ih("r_"))
                .plus(ih("l_"));
            (
                "rows of the fragment",
                format!(
                    "op{sa} accum_red_ld_sum_rescale and op{xa} accum_max: per row, by its first lane"
                ),
                Stmt::CallWith {
                    call: member(&mt, Method::EachRow, vec![var("warp"), var("lane")]),
                    lambda: Lambda::new(
                        vec![int_param("row"), int_param("i"), int_param("h")],
                        vec![
                            store(sum_slot, lty, sum),
                            store(max_slot, mty, ih(&format!("rm{mx}_"))),
                        ],
                    ),
                },
                Method::RunFrom,
                "",
            )
        };
        block.extend([
            Stmt::Comment(format!(
                "op{acc} accum_nored_rescale: O <- O * r, {rows_of}"
            )),
            scale_rows,
            Stmt::Comment(sums_note),
            sums,
            Stmt::Comment(format!("op{m2} matmul: A from the packed product{of_keys}")),
            Stmt::eval(Expr::Member(
                mt2,
                consumer,
                vec![TArg::Name(mt)],
                product_args(acc_v, var("pk_"), b2),
            )),
        ]);
        self.push(vec![Stmt::Block(block)]);
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
        let mut tile = |a: Handle<TbOp>| -> Result<(usize, String), EmitError> {
            let out = self.tb.ops[a].outputs[0];
            let s = self.tb.tensors[out].shape;
            let l = self.tile_layout(out, &natural(&s))?;
            Ok((out.index(), l))
        };
        let (ms, ml) = tile(o.max_acc)?;
        let (ls, ll) = tile(o.sum_acc)?;
        let (os, ol) = tile(o.out_acc)?;
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
        let comment = Stmt::Comment(format!(
            "op{}, op{sa} and op{acc}: the {} warps' maxima, sums and output fragments combined",
            o.max_acc.index(),
            pipe.keys
        ));
        let combine = Expr::Member(
            mt2,
            Method::CombineKeys,
            vec![
                TArg::Name(ml),
                TArg::Name(ll),
                TArg::Name(ol),
                TArg::int(slice),
                TArg::int(tile_bytes),
                TArg::int(nt),
            ],
            [
                format!("acc{acc}"),
                format!("rm{mx}_"),
                format!("lw{sa}_"),
                format!("s{ms}"),
                format!("s{ls}"),
                format!("s{os}"),
                "tid".into(),
                "warp".into(),
                "lane".into(),
            ]
            .iter()
            .map(|n| var(n))
            .collect(),
        );
        self.push(vec![comment, Stmt::eval(combine)]);
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
        let ty = self.tile_dtype(out);
        let (a, o, nt) = (acc.index(), out.index(), self.nt);
        let store = |e: Expr, v: Expr, l: String| {
            Stmt::Assign(
                elem_at(&format!("s{o}"), l, e),
                Expr::TemplateCall(Func::FromCompute, vec![TArg::Elem(ty)], vec![v]),
            )
        };
        let stmt = if let Some(mm) = fragment_of {
            let mt = self.matmul_type(mm)?;
            let l = self.tile_layout(out, &natural(&s))?;
            let n = s.dim(s.rank() - 1);
            let e = var("row").times(Expr::size(n)).plus(var("col"));
            Stmt::CallWith {
                call: member(
                    &mt,
                    Method::Each,
                    vec![var(&format!("acc{a}")), var("warp"), var("lane")],
                ),
                lambda: Lambda::new(
                    vec![
                        int_param("row"),
                        int_param("col"),
                        Param::named(Ty::Elem(DType::F32), "v"),
                        unnamed_int(),
                        unnamed_int(),
                        unnamed_int(),
                    ],
                    vec![store(e, var("v"), l)],
                ),
            }
        } else {
            let order = self.order(acc);
            let l = self.tile_layout(out, &order)?;
            Stmt::thread_loop(
                Func::TbForEachUnrolled,
                vec![TArg::int(nt), TArg::int(s.numel())],
                vec![int_param("e"), int_param("r")],
                vec![store(var("e"), at(var(&format!("acc{a}")), var("r")), l)],
            )
        };
        self.push(vec![stmt]);
        Ok(())
    }
}

/// A variable.
fn var(name: &str) -> Expr {
    Expr::var(name)
}

/// `Class::method(args)` without template arguments.
fn member(class: &str, m: Method, args: Vec<Expr>) -> Expr {
    Expr::Member(class.into(), m, Vec::new(), args)
}

/// `Class::Nested name;`.
fn nested(class: &str, ty: Nested, name: &str) -> Stmt {
    Stmt::NestedDecl {
        class: class.into(),
        ty,
        name: name.into(),
    }
}

/// The arguments of a product into `c` from `a` and `b`: `c, a, b, smem, warp, lane`.
fn product_args(c: Expr, a: Expr, b: Expr) -> Vec<Expr> {
    vec![c, a, b, var("smem"), var("warp"), var("lane")]
}
