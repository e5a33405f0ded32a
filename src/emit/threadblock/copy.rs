//! Copies between device tensors and tiles: each input's and output's block pointer, the
//! copies themselves (`mucc::tb::copy_chunks`, `cp_async_chunks`, `copy_elems` with the plan's
//! chunk width and walk order), and the ring of pipelined inputs (prologue, current slots,
//! prefetch) filled by `cp.async` or, for the plan's TMA loads, by thread 0's bulk tensor loads
//! completing on each slot's `full` mbarrier.

use super::{Ctx, Iteration};
use crate::emit::EmitError;
use crate::graph::arena::Handle;
use crate::graph::ops::AXIS_NAMES;
use crate::graph::threadblock::{TbOp, TbOpKind};
use crate::sched::ops::{Copy, CopyEngine, OpPlan};
use crate::sched::order::Phase;
use crate::sched::plan::BlockRegion;

impl Ctx<'_> {
    /// The µGraph block index along grid axis `a` (a C++ expression): under a cluster split the
    /// CTAs of a cluster are consecutive along x.
    fn block_index(&self, a: usize) -> String {
        match self.kp.split.cluster() {
            Some(c) if a == 0 => format!("blockIdx.x / {}", c.ctas),
            _ => format!("blockIdx.{}", AXIS_NAMES[a]),
        }
    }

    /// The element offset of a block's region (a C++ expression) as the plan gives it.
    pub(super) fn block_offset(&self, region: &BlockRegion) -> String {
        if region.steps.is_empty() {
            return "0".into();
        }
        let terms: Vec<String> = region
            .steps
            .iter()
            .map(|&(a, elems)| format!("static_cast<mucc::i64>({}) * {elems}", self.block_index(a)))
            .collect();
        terms.join(" + ")
    }

    /// `gi<op>` and `go<op>`: this block's region of every input and output the plan places
    /// (TMA loads address their tensor by coordinates instead).
    pub(super) fn block_pointers(&mut self) -> Result<(), EmitError> {
        let (tb, t) = (self.tb, self.t());
        for (h, top) in tb.ops.iter() {
            let Some(region) = &self.kp.regions[h.index()] else {
                continue;
            };
            let off = self.block_offset(region);
            match &top.kind {
                TbOpKind::Input { input, .. } => {
                    self.w
                        .line(format!("const {t}* gi{} = in{input} + {off};", h.index()));
                }
                TbOpKind::Output { output, .. } => {
                    self.w
                        .line(format!("{t}* go{} = out{output} + {off};", h.index()));
                }
                _ => return Err(self.internal("a block region of an operator that copies nothing")),
            }
        }
        Ok(())
    }

    /// The copy of input `op`'s tile for iteration `iter` (an expression, or `0`) into `dst`
    /// (a pointer expression), by `cp.async` when `asynchronous`.
    fn input_copy_line(
        &mut self,
        op: Handle<TbOp>,
        dst: &str,
        iter: &Iteration,
        asynchronous: bool,
    ) -> Result<String, EmitError> {
        let top = &self.tb.ops[op];
        let TbOpKind::Input {
            input, forloop_dim, ..
        } = top.kind
        else {
            return Err(self.internal("an input copy of a non-input"));
        };
        let t = top.outputs[0];
        let s = self.tb.tensors[t].shape;
        let dt = self.op.inputs[input];
        let strides = self.plan.dtensors[dt.index()].strides.0.clone();
        let adv = forloop_dim.map_or(0, |f| s.dim(f) * strides[f]);
        let src = match iter {
            _ if adv == 0 => format!("gi{}", op.index()),
            Iteration::First => format!("gi{}", op.index()),
            Iteration::Expr(e) => {
                format!("gi{} + static_cast<mucc::i64>({e}) * {adv}", op.index())
            }
        };
        let order = self.order(op);
        let sl = self.tile_layout(t, &order)?;
        let gl = self.strided_layout(&s, &s, &strides, &order, None);
        let (nt, n) = (self.nt, s.numel());
        Ok(match &self.kp.ops[op.index()] {
            OpPlan::Input {
                copy: Copy::Chunked { chunk_elems, .. },
                ..
            } => {
                let f = if asynchronous {
                    "cp_async_chunks"
                } else {
                    "copy_chunks"
                };
                format!("mucc::tb::{f}<{nt}, {n}, {chunk_elems}, {sl}, {gl}>(tid, {dst}, {src});")
            }
            _ => format!("mucc::tb::copy_elems<{nt}, {n}, {sl}, {gl}>(tid, {dst}, {src});"),
        })
    }

    /// An input copy in the schedule (pipelined inputs are issued ahead instead).
    pub(super) fn input_copy(&mut self, op: Handle<TbOp>, phase: Phase) -> Result<(), EmitError> {
        let t = self.tb.ops[op].outputs[0];
        if self.stages.contains_key(&t.index()) {
            self.w.line("// issued ahead by the pipeline");
            return Ok(());
        }
        let iter = if phase == Phase::Loop {
            Iteration::Expr("it".into())
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
        let line = self.input_copy_line(op, &format!("s{}", t.index()), &iter, waited)?;
        self.w.line(line);
        self.copies_in_flight |= waited;
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
        let src = self.tile_ref(s_t);
        let line = match &self.kp.ops[op.index()] {
            OpPlan::Output {
                copy: Some(c @ Copy::Chunked { chunk_elems, .. }),
            } => {
                let f = if c.converts() {
                    "copy_chunks_cvt"
                } else {
                    "copy_chunks"
                };
                format!("mucc::tb::{f}<{nt}, {n}, {chunk_elems}, {gl}, {sl}>(tid, {p}, {src});")
            }
            _ => format!("mucc::tb::copy_elems<{nt}, {n}, {gl}, {sl}>(tid, {p}, {src});"),
        };
        self.w.line(line);
        if let Some(x) = self
            .kp
            .exchange
            .as_ref()
            .filter(|x| x.output_op == op.index())
        {
            // The same values, with this execution's flag, into this GPU's slot on every GPU
            // (fused all-reduce).
            let t = self.t();
            let TbOpKind::Output { output: j, .. } = self.tb.ops[op].kind else {
                return Err(self.internal("an exchange mirrors an operator that is no output"));
            };
            let peer = format!(
                "mucc::xchg::slot<{}, {}>(xb[r], {}, xe & 1, xr) + ({p} - out{j})",
                x.gpus, x.slot_bytes, x.region
            );
            self.w.line(format!("for (int r = 0; r < {}; ++r)", x.gpus));
            self.w.line(format!(
                "  mucc::xchg::copy_ll<{nt}, {n}, {gl}, {sl}, {t}>(tid, {peer}, {src}, static_cast<unsigned>(xe + 1));"
            ));
        }
        Ok(())
    }

    /// Whether input `op` is loaded by TMA.
    pub(super) fn is_tma(&self, op: Handle<TbOp>) -> bool {
        self.kp.tma.load_of(op.index()).is_some()
    }

    /// Thread 0's TMA loads of iteration `iter` (a C++ expression) into ring slot `slot` (an
    /// expression), announced on the slot's `full` mbarrier: one block of lines.
    fn tma_issue(&self, slot: &str, iter: &str) -> Vec<String> {
        let mut w = crate::emit::cxx::Writer::new();
        let kp = self.kp;
        w.block("if (tid == 0)", "", |w| {
            w.line(format!(
                "mucc::sm90::mbar_arrive_expect_tx(full + {slot}, {});",
                kp.tma.bytes_per_stage()
            ));
            for l in &kp.tma.loads {
                let elems = kp.tiles[l.tile].as_ref().map_or(0, |g| g.phys_elems);
                let mut args = vec![
                    format!("s{} + {slot} * {elems}", l.tile),
                    format!("&tm{}", l.map),
                    format!("full + {slot}"),
                ];
                for c in &l.coords {
                    let mut terms: Vec<String> = c
                        .per_block
                        .iter()
                        .map(|&(a, n)| format!("static_cast<int>({}) * {n}", self.block_index(a)))
                        .collect();
                    if c.per_iter > 0 {
                        terms.push(format!("({iter}) * {}", c.per_iter));
                    }
                    args.push(if terms.is_empty() {
                        "0".into()
                    } else {
                        terms.join(" + ")
                    });
                }
                w.line(format!("mucc::sm90::tma_load({});", args.join(", ")));
            }
        });
        w.finish().lines().map(|l| l.to_string()).collect()
    }

    /// Pipelined inputs in operator order: (op, tile, elements per slot).
    pub(super) fn pipelined(&self) -> Vec<(Handle<TbOp>, usize, usize)> {
        self.tb
            .ops
            .iter()
            .filter_map(|(h, top)| {
                let t = top.outputs.first()?.index();
                self.stages.get(&t)?;
                let slot = self.kp.tiles[t].as_ref().map_or(0, |g| g.phys_elems);
                Some((h, t, slot))
            })
            .collect()
    }

    /// Declarations of the current slot of each pipelined tile: (tile, C++ type, slot size).
    pub(super) fn pipelined_slots(&self) -> Vec<(usize, &'static str, usize)> {
        self.pipelined()
            .into_iter()
            .map(|(_, t, slot)| (t, self.tile_ctype(Handle::from_index(t)), slot))
            .collect()
    }

    /// The ring's prologue: stages − 1 groups of copies (iterations 0 … stages − 2) in flight
    /// before the loop. Returns the stages (1: no ring).
    pub(super) fn pipeline_prologue(&mut self) -> Result<usize, EmitError> {
        let stages = self.kp.pipeline_stages();
        if self.stages.is_empty() || stages <= 1 {
            return Ok(1);
        }
        // The loop this CTA runs: its share of a split for-loop.
        let share = self
            .kp
            .split
            .cluster()
            .map_or(self.tb.forloop_range, |c| c.iters);
        if stages > share {
            return Err(self.internal("a pipeline deeper than the CTA's share of its loop"));
        }
        self.w
            .line(format!("// software pipeline: {stages} stages"));
        let split = self.kp.split.cluster().is_some();
        for s in 0..stages - 1 {
            // The first iterations of this CTA's share.
            let iter = match (split, s) {
                (false, 0) => Iteration::First,
                (false, _) => Iteration::Expr(s.to_string()),
                (true, 0) => Iteration::Expr("it0".into()),
                (true, _) => Iteration::Expr(format!("it0 + {s}")),
            };
            let mut any_cp_async = false;
            for (h, t, slot) in self.pipelined() {
                if self.is_tma(h) {
                    continue;
                }
                any_cp_async = true;
                let line = self.input_copy_line(h, &format!("s{t} + {}", s * slot), &iter, true)?;
                self.w.line(line);
            }
            if !self.kp.tma.loads.is_empty() {
                let lines = self.tma_issue(&s.to_string(), iter.text());
                super::chain::lines(&mut self.w, &lines);
            }
            if any_cp_async {
                self.w.line("mucc::sm80::cp_async_commit();");
            }
        }
        Ok(stages)
    }

    /// Inside the loop, after its first barrier: the copies of iteration it + stages − 1 into
    /// the slot read one iteration ago, then a commit (an empty group past the end).
    pub(super) fn prefetch(&mut self, stages: usize) -> Result<(), EmitError> {
        let hi = self.loop_bounds().1;
        let slot_of = self.ring_slot("pf", stages);
        let mut copies = Vec::new();
        let mut any_cp_async = false;
        for (h, t, slot) in self.pipelined() {
            if self.is_tma(h) {
                continue;
            }
            any_cp_async = true;
            copies.push(self.input_copy_line(
                h,
                &format!("s{t} + {slot_of} * {slot}"),
                &Iteration::Expr("pf".into()),
                true,
            )?);
        }
        if !self.kp.tma.loads.is_empty() {
            copies.extend(self.tma_issue(&slot_of, "pf"));
        }
        self.w.block("", "", |w| {
            w.line(format!("const int pf = it + {};", stages - 1));
            w.block(format!("if (pf < {hi})"), "", |w| {
                super::chain::lines(w, &copies)
            });
            if any_cp_async {
                w.line("mucc::sm80::cp_async_commit();");
            }
        });
        Ok(())
    }
}
