//! Copies between device tensors and tiles: each input's and output's block pointer, the
//! copies themselves (`mucc::tb::copy_chunks`, `cp_async_chunks`, `copy_elems` with the plan's
//! chunk width and walk order), and the ring of pipelined inputs (prologue, current slots,
//! prefetch) filled by `cp.async` or, for the plan's TMA loads, by thread 0's bulk tensor loads
//! completing on each slot's `full` mbarrier.

use super::{Ctx, Iteration};
use crate::emit::EmitError;
use crate::emit::ir::{Expr, Func, LoopForm, Stmt, Sym, TArg, Ty};
use crate::graph::arena::Handle;
use crate::graph::threadblock::{TbOp, TbOpKind};
use crate::sched::ops::{Copy, CopyEngine, OpPlan};
use crate::sched::order::Phase;
use crate::sched::plan::BlockRegion;

impl Ctx<'_> {
    /// The µGraph block index along grid axis `a`: under a split the CTAs of a block are
    /// consecutive along x.
    fn block_index(&self, a: usize) -> Expr {
        let b = Expr::Sym(Sym::BlockIdx(a));
        match self.kp.split.share() {
            Some((ctas, _)) if a == 0 => b.over(Expr::size(ctas)),
            _ => b,
        }
    }

    /// The element offset of a block's region as the plan gives it.
    pub(super) fn block_offset(&self, region: &BlockRegion) -> Expr {
        let terms = region
            .steps
            .iter()
            .map(|&(a, elems)| {
                Expr::Call(Func::CastToI64, vec![self.block_index(a)]).times(Expr::size(elems))
            })
            .collect();
        Expr::sum(terms).unwrap_or(Expr::int(0))
    }

    /// `gi<op>` and `go<op>`: this block's region of every input and output the plan places
    /// (TMA loads address their tensor by coordinates instead).
    pub(super) fn block_pointers(&self) -> Result<Vec<Stmt>, EmitError> {
        let (tb, d) = (self.tb, self.dtype());
        let mut out = Vec::new();
        for (h, top) in tb.ops.iter() {
            let Some(region) = &self.kp.regions[h.index()] else {
                continue;
            };
            let off = self.block_offset(region);
            out.push(match &top.kind {
                TbOpKind::Input { input, .. } => Stmt::local(
                    Ty::ConstElemPtr(d),
                    format!("gi{}", h.index()),
                    Expr::var(format!("in{input}")).plus(off),
                ),
                TbOpKind::Output { output, .. } => Stmt::local(
                    Ty::ElemPtr(d),
                    format!("go{}", h.index()),
                    Expr::var(format!("out{output}")).plus(off),
                ),
                _ => return Err(self.internal("a block region of an operator that copies nothing")),
            });
        }
        Ok(out)
    }

    /// The copy of input `op`'s tile for iteration `iter` into `dst` (a pointer expression),
    /// by `cp.async` when `asynchronous`.
    fn input_copy_stmt(
        &mut self,
        op: Handle<TbOp>,
        dst: Expr,
        iter: &Iteration,
        asynchronous: bool,
    ) -> Result<Stmt, EmitError> {
        let top = &self.tb.ops[op];
        let TbOpKind::Input { input, .. } = top.kind else {
            return Err(self.internal("an input copy of a non-input"));
        };
        let t = top.outputs[0];
        let s = self.tb.tensors[t].shape;
        let dt = self.op.inputs[input];
        let strides = self.plan.dtensors[dt.index()].strides.0.clone();
        let Some(region) = &self.kp.regions[op.index()] else {
            return Err(self.internal("a copied input without its block region"));
        };
        let adv = region.per_iter;
        let base = Expr::var(format!("gi{}", op.index()));
        let src = match iter {
            _ if adv == 0 => base,
            Iteration::First => base,
            Iteration::Expr(e) => {
                base.plus(Expr::Call(Func::CastToI64, vec![e.clone()]).times(Expr::size(adv)))
            }
        };
        let order = self.order(op);
        let sl = self.tile_layout(t, &order)?;
        let gl = self.strided_layout(&s, &s, &strides, &order, None);
        let (nt, n) = (self.nt, s.numel());
        let (f, mut targs) = match &self.kp.ops[op.index()] {
            OpPlan::Input {
                copy: Copy::Chunked { chunk_elems, .. },
                ..
            } => {
                let f = if asynchronous {
                    Func::TbCpAsyncChunks
                } else {
                    Func::TbCopyChunks
                };
                (
                    f,
                    vec![TArg::int(nt), TArg::int(n), TArg::int(*chunk_elems)],
                )
            }
            _ => (Func::TbCopyElems, vec![TArg::int(nt), TArg::int(n)]),
        };
        targs.extend([TArg::Name(sl), TArg::Name(gl)]);
        Ok(Stmt::Eval(Expr::TemplateCall(
            f,
            targs,
            vec![Expr::var("tid"), dst, src],
        )))
    }

    /// An input copy in the schedule (pipelined inputs are issued ahead instead).
    pub(super) fn input_copy(&mut self, op: Handle<TbOp>, phase: Phase) -> Result<(), EmitError> {
        let t = self.tb.ops[op].outputs[0];
        if self.ring_tiles.contains(&t.index()) {
            self.push(vec![Stmt::Comment("issued ahead by the pipeline".into())]);
            return Ok(());
        }
        let iter = if phase == Phase::Loop {
            Iteration::Expr(Expr::var("it"))
        } else {
            Iteration::First
        };
        let waited = matches!(
            self.kp.ops[op.index()],
            OpPlan::Input {
                engine: CopyEngine::CpAsyncWaited,
                ..
            }
        );
        let copy = self.input_copy_stmt(op, Expr::var(format!("s{}", t.index())), &iter, waited)?;
        self.push(vec![copy]);
        Ok(())
    }

    /// The copy of an output's tile to this block's region of its device tensor.
    pub(super) fn output_copy(&mut self, op: Handle<TbOp>) -> Result<(), EmitError> {
        let s_t = self.tb.ops[op].inputs[0];
        let s = self.tb.tensors[s_t].shape;
        let order = self.order(op);
        let sl = self.tile_layout(s_t, &order)?;
        let (p, gl) = self.global_out(op, &s, &order)?;
        let (nt, n) = (self.nt, s.numel());
        let src = Expr::var(self.tile_ref(s_t));
        let (f, mut targs) = match &self.kp.ops[op.index()] {
            OpPlan::Output {
                copy: Some(c @ Copy::Chunked { chunk_elems, .. }),
            } => (
                if c.converts() {
                    Func::TbCopyChunksCvt
                } else {
                    Func::TbCopyChunks
                },
                vec![TArg::int(nt), TArg::int(n), TArg::int(*chunk_elems)],
            ),
            _ => (Func::TbCopyElems, vec![TArg::int(nt), TArg::int(n)]),
        };
        targs.extend([TArg::Name(gl.clone()), TArg::Name(sl.clone())]);
        let mut out = vec![Stmt::Eval(Expr::TemplateCall(
            f,
            targs,
            vec![Expr::var("tid"), Expr::var(&p), src.clone()],
        ))];
        if let Some(x) = self
            .kp
            .exchange
            .as_ref()
            .filter(|x| x.output_op == op.index())
        {
            // The same values, with this execution's flag, into this GPU's slot on every GPU
            // (fused all-reduce).
            let TbOpKind::Output { output: j, .. } = self.tb.ops[op].kind else {
                return Err(self.internal("an exchange mirrors an operator that is no output"));
            };
            // slot<gpus, slot bytes>(xb[r], region, xe & 1, xr) + (p - out_j).
            let slot = Expr::TemplateCall(
                Func::XchgSlot,
                vec![TArg::int(x.gpus), TArg::int(x.slot_bytes)],
                vec![
                    Expr::Index(Box::new(Expr::var("xb")), Box::new(Expr::var("r"))),
                    Expr::size(x.region),
                    Expr::BitAnd(Box::new(Expr::var("xe")), Box::new(Expr::int(1))),
                    Expr::var("xr"),
                ],
            );
            let peer = slot.plus(Expr::var(&p).minus(Expr::var(format!("out{j}"))).paren());
            let flag = Expr::Call(
                Func::CastToUnsigned,
                vec![Expr::var("xe").plus(Expr::int(1))],
            );
            out.push(Stmt::For {
                var: "r".into(),
                from: Expr::int(0),
                to: Expr::size(x.gpus),
                unroll: false,
                form: LoopForm::NextLine,
                body: vec![Stmt::Eval(Expr::TemplateCall(
                    Func::XchgCopyLl,
                    vec![
                        TArg::int(nt),
                        TArg::int(n),
                        TArg::Name(gl),
                        TArg::Name(sl),
                        TArg::Elem(self.dtype()),
                    ],
                    vec![Expr::var("tid"), peer, src, flag],
                ))],
            });
        }
        self.push(out);
        Ok(())
    }

    /// Thread 0's TMA loads of iteration `iter` into ring slot `slot`, announced on the slot's
    /// `full` mbarrier.
    fn tma_issue(&self, slot: &Expr, iter: &Expr) -> Stmt {
        let kp = self.kp;
        let full = Expr::var("full").plus(slot.clone());
        let mut body = vec![Stmt::Eval(Expr::Call(
            Func::MbarArriveExpectTx,
            vec![full.clone(), Expr::size(kp.tma.bytes_per_stage())],
        ))];
        for (l, copy, coords) in self.tma_boxes(iter) {
            let elems = kp.tiles[l.tile].as_ref().map_or(0, |g| g.phys_elems);
            let slot_start =
                Expr::var(format!("s{}", l.tile)).plus(slot.clone().times(Expr::size(elems)));
            // A slab starts further into the slot.
            let at = l.copy_elements(copy);
            let dst = if at > 0 {
                slot_start.plus(Expr::size(at))
            } else {
                slot_start
            };
            let mut args = vec![
                dst,
                Expr::var(format!("tm{}", copy.map)).addr(),
                full.clone(),
            ];
            args.extend(coords);
            body.push(Stmt::Eval(Expr::Call(Func::TmaLoad, args)));
        }
        Stmt::If(
            Expr::Eq(Box::new(Expr::var("tid")), Box::new(Expr::size(0))),
            body,
        )
    }

    /// Every box the TMA loads of iteration `iter` copy: the load, the copy (a slab of it) and
    /// the box's coordinates.
    fn tma_boxes<'b>(
        &'b self,
        iter: &Expr,
    ) -> Vec<(
        &'b crate::sched::tma::TmaLoad,
        &'b crate::sched::tma::TmaCopy,
        Vec<Expr>,
    )> {
        let mut out = Vec::new();
        for l in &self.kp.tma.loads {
            // Each coordinate's terms: the block's offset, then the iteration's.
            let coords: Vec<Vec<Expr>> = l
                .coords
                .iter()
                .map(|c| {
                    let mut terms: Vec<Expr> = c
                        .per_block
                        .iter()
                        .map(|&(a, n)| {
                            Expr::Call(Func::CastToInt, vec![self.block_index(a)])
                                .times(Expr::size(n))
                        })
                        .collect();
                    if c.per_iter > 0 {
                        terms.push(iter.clone().paren().times(Expr::size(c.per_iter)));
                    }
                    terms
                })
                .collect();
            // A slab starts further along the split dim.
            for copy in &l.copies {
                let args = coords
                    .iter()
                    .enumerate()
                    .map(|(d, terms)| {
                        let mut terms = terms.clone();
                        if l.split == Some(d) && copy.offset > 0 {
                            terms.push(Expr::size(copy.offset));
                        }
                        Expr::sum(terms).unwrap_or(Expr::size(0))
                    })
                    .collect();
                out.push((l, copy, args));
            }
        }
        out
    }

    /// Thread 0's L2 prefetches of the boxes of the CTA's first iterations, before
    /// `griddepcontrol.wait` ([`crate::sched::plan::L2Prefetch`]); `first` is the CTA's first
    /// iteration.
    pub(super) fn l2_prefetch(&self, p: &crate::sched::plan::L2Prefetch, first: Expr) -> Stmt {
        let iter = Expr::var("pf0").plus(Expr::var("i"));
        let body = self
            .tma_boxes(&iter)
            .into_iter()
            .map(|(_, copy, coords)| {
                let mut args = vec![Expr::var(format!("tm{}", copy.map)).addr()];
                args.extend(coords);
                Stmt::Eval(Expr::Call(Func::TmaPrefetchL2, args))
            })
            .collect();
        Stmt::If(
            Expr::Eq(Box::new(Expr::var("tid")), Box::new(Expr::size(0))),
            vec![
                Stmt::local(Ty::ConstInt, "pf0", first),
                Stmt::For {
                    var: "i".into(),
                    from: Expr::int(0),
                    to: Expr::size(p.iterations),
                    unroll: false,
                    form: LoopForm::Block,
                    body,
                },
            ],
        )
    }

    /// The ring's inputs in operator order: (op, tile, elements per slot).
    pub(super) fn pipelined(&self) -> Vec<(Handle<TbOp>, usize, usize)> {
        let Some(ring) = &self.ring_plan else {
            return Vec::new();
        };
        self.tb
            .ops
            .iter()
            .filter(|(h, _)| ring.holds(h.index()))
            .filter_map(|(h, top)| {
                let t = top.outputs.first()?.index();
                let slot = self.kp.tiles[t].as_ref().map_or(0, |g| g.phys_elems);
                Some((h, t, slot))
            })
            .collect()
    }

    /// The ring's `cp.async` inputs in operator order: (op, tile, elements per slot).
    fn cp_async_inputs(&self) -> Vec<(Handle<TbOp>, usize, usize)> {
        let Some(ring) = &self.ring_plan else {
            return Vec::new();
        };
        self.pipelined()
            .into_iter()
            .filter(|(h, _, _)| ring.cp_async.contains(&h.index()))
            .collect()
    }

    /// The ring's prologue ([`Ring::prologue`] iterations: one group of copies and one TMA
    /// stage each) in flight before the loop.
    pub(super) fn pipeline_prologue(&mut self) -> Result<(), EmitError> {
        let Some(r) = self.ring_plan.clone() else {
            return Ok(());
        };
        // The loop this CTA runs: its share of a split for-loop.
        let share = self
            .kp
            .split
            .share()
            .map_or(self.tb.forloop_range, |(_, iters)| iters);
        if r.stages > share {
            return Err(self.internal("a pipeline deeper than the CTA's share of its loop"));
        }
        let mut ring = vec![Stmt::Comment(format!(
            "software pipeline: {} stages",
            r.stages
        ))];
        let start = self.loop_start();
        for s in 0..r.prologue() {
            // The first iterations of this CTA's share.
            let iter = match (&start, s) {
                (None, 0) => Iteration::First,
                (None, _) => Iteration::Expr(Expr::size(s)),
                (Some(lo), 0) => Iteration::Expr(lo.clone()),
                (Some(lo), _) => Iteration::Expr(lo.clone().plus(Expr::size(s))),
            };
            for (h, t, slot) in self.cp_async_inputs() {
                let dst = Expr::var(format!("s{t}")).plus(Expr::size(s * slot));
                ring.push(self.input_copy_stmt(h, dst, &iter, true)?);
            }
            if !r.tma.is_empty() {
                ring.push(self.tma_issue(&Expr::size(s), &iter.expr()));
            }
            if !r.cp_async.is_empty() {
                ring.push(Stmt::Eval(Expr::Call(Func::CpAsyncCommit, vec![])));
            }
        }
        self.ring.extend(ring.iter().cloned());
        self.push(ring);
        Ok(())
    }

    /// Inside the loop, after its first barrier: the copies of iteration
    /// it + [`Ring::refill_distance`] into the slot read one iteration ago, then a commit (an
    /// empty group past the end).
    pub(super) fn prefetch(&mut self) -> Result<(), EmitError> {
        let Some(r) = self.ring_plan.clone() else {
            return Err(self.internal("a ring refill without a ring"));
        };
        let hi = self.loop_bounds().1;
        let slot_of = self.ring_slot("pf", r.stages);
        let mut copies = Vec::new();
        for (h, t, slot) in self.cp_async_inputs() {
            let dst = Expr::var(format!("s{t}")).plus(slot_of.clone().times(Expr::size(slot)));
            copies.push(self.input_copy_stmt(h, dst, &Iteration::Expr(Expr::var("pf")), true)?);
        }
        if !r.tma.is_empty() {
            copies.push(self.tma_issue(&slot_of, &Expr::var("pf")));
        }
        let mut block = vec![
            Stmt::local(
                Ty::ConstInt,
                "pf",
                Expr::var("it").plus(Expr::size(r.refill_distance())),
            ),
            Stmt::If(Expr::Lt(Box::new(Expr::var("pf")), Box::new(hi)), copies),
        ];
        if !r.cp_async.is_empty() {
            block.push(Stmt::Eval(Expr::Call(Func::CpAsyncCommit, vec![])));
        }
        let block = Stmt::Block(block);
        self.ring.push(block.clone());
        self.push(vec![block]);
        Ok(())
    }
}
