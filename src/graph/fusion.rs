//! Epilogue fusion chains of a threadblock graph.
//!
//! A chain is a leading operator followed by element-wise unary operators, optionally ended by
//! a for-loop accumulator (store-and-accumulate) or an output (store). The tiles between chain
//! members are never materialised: each element flows through the chain in registers. The chains
//! are a property of the graph, so both the layout solver and the scheduler read them.
//!
//! An operator F joins the chain of the producer P of its (first) input when all hold:
//! 1. F is a unary operator, a one-input accumulator (every kind but the rescaling ones), or an
//!    output;
//! 2. that input is P's only output, and F is its only consumer;
//! 3. P is not an input, output or accumulator (inputs are copies; accumulators and outputs end a
//!    chain), and P has not already been closed by an accumulator or output;
//! 4. F runs in P's phase (an accumulator consumes in-loop tiles and an output after-loop tiles,
//!    which validation guarantees; unary ops share their input's phase by definition).
//!
//! A binary operator F also joins when one of its inputs (the chain's value) meets 2–4 and:
//! 5. the chain's leader is element-wise (unary or binary), so that every member walks the same
//!    element space, and F's output has the shape of that input (the value is not broadcast);
//! 6. F's other input (the *side* tile) is complete when the chain runs: a tile of another
//!    chain, in shared memory, not an after-loop tile read by an in-loop chain, whose producer
//!    runs at a shallower depth than the chain's leader (depth: 0 for inputs, else one more than
//!    the deepest chain its leader reads), so that joining does not delay the chain to a later
//!    level of the schedule, which could cost a barrier. (Depth counts producers in every
//!    phase and the scheduler's levels only those in the chain's own, so an after-loop chain
//!    can still move by a level; in the corpus, generated, decode and attention graphs no
//!    kernel gained a barrier when binary operators started joining chains.)
//!
//! The side tile is read at the element the chain computes; the scheduler runs the chain after
//! its producer ([`FusionPlan::reads`]).
//!
//! This covers Mirage's rule (unary ops and `accum_nored` fused onto a single-consumer producer)
//! and extends it to every one-input accumulator and to stores; unlike Mirage's emitter, nothing
//! fused after a matmul is dropped: every member is applied.

use std::fmt::Write;

use super::arena::Handle;
use super::ops::AccumKind;
use super::threadblock::{STensor, TbGraph, TbOp, TbOpKind};

/// One chain: the leader first, then the fused operators in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    /// Members, leader first.
    pub ops: Vec<Handle<TbOp>>,
}

impl Chain {
    /// The leading operator.
    pub fn leader(&self) -> Handle<TbOp> {
        self.ops[0]
    }

    /// The last operator.
    pub fn tail(&self) -> Handle<TbOp> {
        self.ops[self.ops.len() - 1]
    }
}

/// The chains of a threadblock graph; every operator is in exactly one chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FusionPlan {
    /// Chains in the order of their leaders.
    pub chains: Vec<Chain>,
    /// For each operator, the index of its chain.
    pub chain_of: Vec<usize>,
}

impl FusionPlan {
    /// The chain containing `op`.
    pub fn chain(&self, op: Handle<TbOp>) -> &Chain {
        &self.chains[self.chain_of[op.index()]]
    }

    /// Whether `op` leads its chain.
    pub fn is_leader(&self, op: Handle<TbOp>) -> bool {
        self.chain(op).leader() == op
    }

    /// Whether `op` was fused onto the operator before it in its chain.
    pub fn is_fused(&self, op: Handle<TbOp>) -> bool {
        !self.is_leader(op)
    }

    /// For each tile of `tb`: whether it exists in shared memory, i.e. whether its producer ends
    /// its chain (tiles passed between chain members live in registers).
    pub fn materialized(&self, tb: &TbGraph) -> Vec<bool> {
        let mut m = vec![false; tb.tensors.len()];
        for (h, op) in tb.ops.iter() {
            if self.chain(h).tail() == h {
                for &t in &op.outputs {
                    m[t.index()] = true;
                }
            }
        }
        m
    }

    /// The tiles chain `c` reads from outside itself: its leader's inputs, then the side tile of
    /// each binary member (rule 6 of the module documentation).
    pub fn reads(&self, tb: &TbGraph, c: usize) -> Vec<Handle<STensor>> {
        let chain = &self.chains[c];
        let mut t = tb.ops[chain.leader()].inputs.clone();
        t.extend(
            chain.ops[1..]
                .iter()
                .filter_map(|&m| self.side_input(tb, m).map(|(_, s)| s)),
        );
        t
    }

    /// For a binary operator fused into a chain: which of its inputs carries the chain's value
    /// (0 or 1), and its other (side) tile; `None` for any other operator.
    pub fn side_input(&self, tb: &TbGraph, op: Handle<TbOp>) -> Option<(usize, Handle<STensor>)> {
        if !matches!(tb.ops[op].kind, TbOpKind::Binary(_)) || self.is_leader(op) {
            return None;
        }
        let chain = self.chain(op);
        let k = chain.ops.iter().position(|&o| o == op)?;
        let value = *tb.ops[chain.ops[k - 1]].outputs.first()?;
        let ins = &tb.ops[op].inputs;
        let i = ins.iter().position(|&t| t == value)?;
        Some((i, ins[1 - i]))
    }

    /// A stable text form: one line per chain of two or more operators.
    pub fn dump(&self, tb: &TbGraph) -> String {
        let mut s = String::new();
        for c in self.chains.iter().filter(|c| c.ops.len() > 1) {
            let names: Vec<String> = c
                .ops
                .iter()
                .map(|&h| format!("op{} {}", h.index(), tb.ops[h].kind.name()))
                .collect();
            let _ = writeln!(s, "chain {}", names.join(" -> "));
        }
        if s.is_empty() {
            s.push_str("no fused chains\n");
        }
        s
    }
}

fn can_follow(kind: &TbOpKind) -> bool {
    match kind {
        TbOpKind::Unary(_) | TbOpKind::Output { .. } => true,
        TbOpKind::Accum(k) => !matches!(k, AccumKind::NoredRescale | AccumKind::RedLdSumRescale),
        _ => false,
    }
}

fn ends_chain(kind: &TbOpKind) -> bool {
    matches!(kind, TbOpKind::Accum(_) | TbOpKind::Output { .. })
}

fn can_lead_into(kind: &TbOpKind) -> bool {
    !matches!(
        kind,
        TbOpKind::Input { .. } | TbOpKind::Output { .. } | TbOpKind::Accum(_)
    )
}

/// Why a tile with a single consumer was not fused into it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotFused {
    /// The consumer combines several tiles (binary, concat, matmul).
    SeveralInputs,
    /// The consumer reduces rows (rms_norm, reductions): it leads a chain of its own.
    ReducesRows,
    /// The consumer is a rescaling accumulator, which takes a second tile.
    Rescales,
    /// The producer has two outputs (reduction_max).
    TwoOutputs,
    /// The producer is an accumulator: its value is complete only after the loop, and its
    /// reader is not fused onto it.
    Accumulator,
}

impl std::fmt::Display for NotFused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NotFused::SeveralInputs => {
                "the consumer combines several tiles; a chain continues only through unary operators, one-input accumulators, outputs, and binary operators after an element-wise leader whose other tile is complete"
            }
            NotFused::ReducesRows => "the consumer reduces rows and leads a chain of its own",
            NotFused::Rescales => "the consumer is a rescaling accumulator, which reads a second tile",
            NotFused::TwoOutputs => "the producer has two outputs",
            NotFused::Accumulator => {
                "the accumulator's registers are written back to shared memory after the loop and read from there (a store straight from registers is not implemented)"
            }
        })
    }
}

/// A tile that stays in shared memory although a single operator reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unfused {
    /// The tile.
    pub tile: Handle<STensor>,
    /// Its producer.
    pub producer: Handle<TbOp>,
    /// Its only consumer.
    pub consumer: Handle<TbOp>,
    /// Why the consumer did not join the producer's chain.
    pub reason: NotFused,
}

/// Tiles computed in the block (not input copies) that stay materialised although a single
/// operator reads them, with the reason the fusion rules give.
pub fn unfused(tb: &TbGraph, plan: &FusionPlan) -> Vec<Unfused> {
    let mut readers: Vec<Vec<Handle<TbOp>>> = vec![Vec::new(); tb.tensors.len()];
    for (h, op) in tb.ops.iter() {
        for &t in &op.inputs {
            readers[t.index()].push(h);
        }
    }
    let materialized = plan.materialized(tb);
    let producers = tb.producers();
    let mut out = Vec::new();
    for (t, _) in tb.tensors.iter() {
        let (Some(p), [f]) = (producers[t.index()], readers[t.index()].as_slice()) else {
            continue;
        };
        let prod = &tb.ops[p];
        if !materialized[t.index()] || matches!(prod.kind, TbOpKind::Input { .. }) {
            continue;
        }
        let cons = &tb.ops[*f];
        let reason = match (&prod.kind, &cons.kind) {
            (TbOpKind::Accum(_), _) => NotFused::Accumulator,
            _ if prod.outputs.len() > 1 => NotFused::TwoOutputs,
            (_, TbOpKind::Accum(AccumKind::NoredRescale | AccumKind::RedLdSumRescale)) => {
                NotFused::Rescales
            }
            (_, TbOpKind::RmsNorm | TbOpKind::Reduction { .. }) => NotFused::ReducesRows,
            (_, k) if !can_follow(k) => NotFused::SeveralInputs,
            // Fusable by the rules, yet materialised: not expected; say nothing wrong.
            _ => continue,
        };
        out.push(Unfused {
            tile: t,
            producer: p,
            consumer: *f,
            reason,
        });
    }
    out
}

/// Computes the fusion chains of a validated threadblock graph.
pub fn fuse(tb: &TbGraph) -> FusionPlan {
    let mut consumers = vec![0usize; tb.tensors.len()];
    for (_, op) in tb.ops.iter() {
        for &t in &op.inputs {
            consumers[t.index()] += 1;
        }
    }
    let producers = tb.producers();
    let mut chains: Vec<Chain> = Vec::new();
    let mut chain_of = vec![usize::MAX; tb.ops.len()];
    // Depth of each chain (rule 6): 0 for inputs, else 1 + the deepest chain its leader reads.
    let mut depth: Vec<usize> = Vec::new();
    let depth_of = |t: Handle<STensor>, chain_of: &[usize], depth: &[usize]| {
        producers
            .get(t.index())
            .copied()
            .flatten()
            .map_or(0, |p| depth[chain_of[p.index()]])
    };
    for (h, op) in tb.ops.iter() {
        let binary = matches!(op.kind, TbOpKind::Binary(_));
        // The chain whose open end produces input `i` of `op`, if `op` may join it there.
        let join_at = |i: usize| -> Option<usize> {
            let input = *op.inputs.get(i)?;
            if consumers[input.index()] != 1 {
                return None;
            }
            let p = (*producers.get(input.index())?)?;
            let prod = &tb.ops[p];
            if prod.outputs.len() != 1 || !can_lead_into(&prod.kind) {
                return None;
            }
            let c = chain_of[p.index()];
            let chain = &chains[c];
            // P must be the open end of its chain.
            if chain.tail() != p || ends_chain(&tb.ops[chain.tail()].kind) {
                return None;
            }
            if binary {
                let leader = &tb.ops[chain.leader()];
                let side = op.inputs[1 - i];
                let post_loop = leader.inputs.iter().any(|&t| tb.tensors[t].after_accum);
                let elementwise = matches!(leader.kind, TbOpKind::Unary(_) | TbOpKind::Binary(_));
                if !elementwise
                    || tb.tensors[op.outputs[0]].shape != tb.tensors[input].shape
                    || (tb.tensors[side].after_accum && !post_loop)
                    || depth_of(side, &chain_of, &depth) >= depth[c]
                {
                    return None;
                }
            }
            Some(c)
        };
        let joined = if binary && op.inputs.len() == 2 {
            join_at(0).or_else(|| join_at(1))
        } else if can_follow(&op.kind) {
            join_at(0)
        } else {
            None
        };
        match joined {
            Some(c) => {
                chains[c].ops.push(h);
                chain_of[h.index()] = c;
            }
            None => {
                chain_of[h.index()] = chains.len();
                chains.push(Chain { ops: vec![h] });
                depth.push(match op.kind {
                    TbOpKind::Input { .. } => 0,
                    _ => {
                        1 + op
                            .inputs
                            .iter()
                            .map(|&t| depth_of(t, &chain_of, &depth))
                            .max()
                            .unwrap_or(0)
                    }
                });
            }
        }
    }
    FusionPlan { chains, chain_of }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::builder::{GraphBuilder, TbGraphBuilder};
    use crate::graph::{DType, KnOpKind};

    fn tb_of(g: &crate::graph::KernelGraph) -> &TbGraph {
        g.customized_ops().next().unwrap().1
    }

    #[test]
    fn gated_mlp_chains() {
        let mut g = GraphBuilder::new();
        let x = g.new_input(&[8, 256], DType::F16).unwrap();
        let w1 = g.new_input(&[256, 512], DType::F16).unwrap();
        let w2 = g.new_input(&[256, 512], DType::F16).unwrap();
        let mut tb = TbGraphBuilder::new([16, 1, 1], [128, 1, 1], 4);
        let tx = tb.new_input(&g, x, [-1, -1, -1], 1).unwrap();
        let t1 = tb.new_input(&g, w1, [1, -1, -1], 0).unwrap();
        let t2 = tb.new_input(&g, w2, [1, -1, -1], 0).unwrap();
        let m1 = tb.matmul(tx, t1).unwrap();
        let m2 = tb.matmul(tx, t2).unwrap();
        let a1 = tb.forloop_accum(m1, AccumKind::Nored).unwrap();
        let a2 = tb.forloop_accum(m2, AccumKind::Nored).unwrap();
        let s = tb.silu(a1).unwrap();
        let o = tb.mul(s, a2).unwrap();
        tb.new_output(o, [1, -1, -1]).unwrap();
        let outs = g.customized(tb).unwrap();
        g.mark_output(outs[0]).unwrap();
        let g = g.build().unwrap();
        let tb = tb_of(&g);
        let plan = fuse(tb);
        assert_eq!(
            plan.dump(tb),
            "chain op3 matmul -> op5 accum_nored\nchain op4 matmul -> op6 accum_nored\nchain op7 silu -> op8 mul -> op9 output\n"
        );
        // silu reads an accumulator's tile: it leads its own chain, which the mul joins, reading
        // the other accumulator's tile at each element (both after the loop).
        assert!(plan.is_leader(Handle::from_index(7)));
        assert_eq!(plan.chains.len(), 6);
        let c = plan.chain_of[7];
        assert_eq!(
            plan.reads(tb, c),
            vec![Handle::from_index(5), Handle::from_index(6)]
        );
        assert_eq!(
            plan.side_input(tb, Handle::from_index(8)),
            Some((0, Handle::from_index(6)))
        );
    }

    #[test]
    fn unary_ops_after_a_matmul_stay_in_the_chain() {
        // Mirage's emitter drops every fused unary but exp after a matmul; here all are kept.
        let mut g = GraphBuilder::new();
        let a = g.new_input(&[16, 64], DType::F16).unwrap();
        let b = g.new_input(&[64, 16], DType::F16).unwrap();
        let mut tb = TbGraphBuilder::new([1, 1, 1], [128, 1, 1], 2);
        let ta = tb.new_input(&g, a, [-1, -1, -1], 1).unwrap();
        let tbb = tb.new_input(&g, b, [-1, -1, -1], 0).unwrap();
        let m = tb.matmul(ta, tbb).unwrap();
        let e = tb.silu(m).unwrap();
        let sc = tb.mul_scalar(e, 0.5).unwrap();
        let acc = tb.forloop_accum(sc, AccumKind::RedLdSum).unwrap();
        let sq = tb.sqrt(acc).unwrap();
        tb.new_output(sq, [-1, -1, -1]).unwrap();
        let outs = g.customized(tb).unwrap();
        g.mark_output(outs[0]).unwrap();
        let g = g.build().unwrap();
        let plan = fuse(tb_of(&g));
        assert_eq!(
            plan.dump(tb_of(&g)),
            "chain op2 matmul -> op3 silu -> op4 mul_scalar -> op5 accum_red_ld_sum\nchain op6 sqrt -> op7 output\n"
        );
    }

    #[test]
    fn shared_tiles_and_two_output_ops_are_not_fused() {
        let mut g = GraphBuilder::new();
        let a = g.new_input(&[4, 64], DType::F32).unwrap();
        let mut tb = TbGraphBuilder::new([1, 1, 1], [128, 1, 1], 1);
        let t = tb.new_input(&g, a, [-1, -1, -1], -1).unwrap();
        let e = tb.exp(t).unwrap(); // input op: not a leader to fuse onto
        let (mx, _diff) = tb.reduction_max(e, 1).unwrap();
        let n = tb.exp(mx).unwrap(); // producer has two outputs
        let s1 = tb.square(n).unwrap(); // n has two consumers
        let s2 = tb.sqrt(n).unwrap();
        let sum = tb.add(s1, s2).unwrap();
        let acc = tb.forloop_accum(sum, AccumKind::Nored).unwrap();
        tb.new_output(acc, [-1, -1, -1]).unwrap();
        let outs = g.customized(tb).unwrap();
        g.mark_output(outs[0]).unwrap();
        let g = g.build().unwrap();
        let plan = fuse(tb_of(&g));
        assert_eq!(plan.dump(tb_of(&g)), "chain op6 add -> op7 accum_nored\n");
        // exp feeds a row reduction; the reduction's running max has two outputs; the add reads
        // two tiles of the same depth (joining either chain would delay it); the accumulator's
        // tile is stored after the loop.
        let why: Vec<(usize, usize, NotFused)> = unfused(tb_of(&g), &plan)
            .iter()
            .map(|u| (u.producer.index(), u.consumer.index(), u.reason))
            .collect();
        assert_eq!(
            why,
            vec![
                (1, 2, NotFused::ReducesRows),
                (2, 3, NotFused::TwoOutputs),
                (4, 6, NotFused::SeveralInputs),
                (5, 6, NotFused::SeveralInputs),
                (7, 8, NotFused::Accumulator),
            ]
        );
        assert!(matches!(
            g.ops.iter().nth(1).unwrap().1.kind,
            KnOpKind::Customized(_)
        ));
    }
}
