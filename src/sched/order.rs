//! Threadblock scheduling: the order in which each block runs its chains, and where it needs
//! `__syncthreads()`.
//!
//! - **Phases.** Loop-invariant inputs (no for-loop dim) are copied once before the loop
//!   (*pre-loop*); chains on in-loop tiles, accumulators included, run every iteration (*loop*);
//!   chains on after-loop tiles run once after it (*post-loop*).
//! - **Depth rule.** Within a phase a chain's level is 0 if it is an input, or if everything it
//!   reads comes from an earlier phase; otherwise it is one more than the deepest producer of the
//!   tiles it reads in the same phase (its leader's inputs and its binary members' side tiles;
//!   fused members share their leader's level). Chains run by
//!   level, and one barrier separates consecutive levels — none elsewhere. This gives the fewest
//!   barriers any order can have, since a level-ℓ chain depends on a chain of level ℓ−1.
//! - **Phase boundaries.** A barrier ends the pre-loop phase (its tiles are read by other
//!   threads), and one starts the post-loop phase (accumulators are complete).
//! - **End of the loop body.** Iteration i+1 overwrites the tiles written at level 0 (input
//!   copies, and pipelined prefetches into the slot read one iteration earlier) while slow warps
//!   may still read them at the last level of iteration i. If any tile written at level 0 is read
//!   at the last level, a barrier ends the body (Mirage omits it). Reads at earlier levels are
//!   separated from the next iteration's writes by the level barriers already in place.

use std::fmt::Write;

use crate::graph::arena::Handle;
use crate::graph::fusion::FusionPlan;
use crate::graph::threadblock::{TbGraph, TbOp, TbOpKind};

/// When a chain runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// Once, before the loop.
    PreLoop,
    /// Every iteration.
    Loop,
    /// Once, after the loop.
    PostLoop,
}

impl Phase {
    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Phase::PreLoop => "pre-loop",
            Phase::Loop => "loop",
            Phase::PostLoop => "post-loop",
        }
    }
}

/// Why a threadblock kernel waits for all its threads (`__syncthreads()`): the schedule's
/// barriers and those of the kernel body around the loop ([`crate::sched::plan::BodyBarriers`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarrierReason {
    /// Between two levels of one phase: the next level reads tiles the previous one wrote.
    NextLevel,
    /// After the pre-loop phase: its tiles are ready for the loop.
    LoopInvariantTiles,
    /// First step after the loop: the accumulators are complete.
    AccumulatorsComplete,
    /// End of the loop body: the next iteration overwrites tiles read at the last level.
    EndOfBody,
    /// After the accumulators' initial state was written to shared memory (or the zero page).
    InitialState,
    /// End of a loop body without a barrier, before the loads of a later pipeline stage.
    BeforePrefetch,
    /// After the loop, before register accumulators are written back to shared memory.
    BeforeWriteBack,
    /// After the loop, before mean and RMS accumulators are divided (and rooted).
    BeforeFinalize,
    /// In CTA 0 of a cluster split, after the rescaled partials' folds read its max tile and
    /// before that tile is folded.
    AfterRescaledFolds,
    /// Under a cluster split with pushes, after the loop: the partial tiles are complete before
    /// the CTAs read them to push or fold.
    BeforePush,
}

impl std::fmt::Display for BarrierReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BarrierReason::NextLevel => "next level reads tiles of the previous one",
            BarrierReason::LoopInvariantTiles => "loop-invariant tiles ready",
            BarrierReason::AccumulatorsComplete => "accumulators complete",
            BarrierReason::EndOfBody => {
                "the next iteration overwrites tiles read at the last level"
            }
            BarrierReason::InitialState => {
                "the accumulators' initial state and the zero page are written"
            }
            BarrierReason::BeforePrefetch => {
                "the body's reads of the oldest stage finish before it is refilled"
            }
            BarrierReason::BeforeWriteBack => "the loop body's reads finish before write-backs",
            BarrierReason::BeforeFinalize => {
                "accumulators complete before mean and RMS are finalised"
            }
            BarrierReason::AfterRescaledFolds => "the rescaled partials have read the max tile",
            BarrierReason::BeforePush => "the partial tiles are complete before they are pushed",
        })
    }
}

/// One step of a phase.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Run a chain (index into the fusion plan's chains).
    Run(usize),
    /// `__syncthreads()`, with the reason.
    Barrier(BarrierReason),
}

/// The schedule of one threadblock graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Steps before the loop.
    pub pre_loop: Vec<Step>,
    /// Steps of the loop body (the end-of-body barrier included, when needed).
    pub body: Vec<Step>,
    /// Steps after the loop.
    pub post_loop: Vec<Step>,
    /// Phase of each chain.
    pub phase: Vec<Phase>,
    /// Level of each chain within its phase.
    pub level: Vec<usize>,
}

impl Schedule {
    /// The steps of phase `ph`.
    pub fn phase(&self, ph: Phase) -> &[Step] {
        match ph {
            Phase::PreLoop => &self.pre_loop,
            Phase::Loop => &self.body,
            Phase::PostLoop => &self.post_loop,
        }
    }

    /// All steps in execution order with their phase.
    pub fn steps(&self) -> impl Iterator<Item = (Phase, &Step)> {
        self.pre_loop
            .iter()
            .map(|s| (Phase::PreLoop, s))
            .chain(self.body.iter().map(|s| (Phase::Loop, s)))
            .chain(self.post_loop.iter().map(|s| (Phase::PostLoop, s)))
    }

    /// Number of barriers in one execution of each phase (pre, body, post).
    pub fn barrier_counts(&self) -> (usize, usize, usize) {
        let n = |v: &[Step]| v.iter().filter(|s| matches!(s, Step::Barrier(_))).count();
        (n(&self.pre_loop), n(&self.body), n(&self.post_loop))
    }

    /// Compact form: chains by leader op index (`,` between chains of one level), a space for
    /// each barrier, phases separated by ` | `, `-` for an empty phase — e.g. `0 | 1,2 3 | 5`.
    pub fn compact(&self, plan: &FusionPlan) -> String {
        let render = |steps: &[Step]| {
            let mut s = String::new();
            for st in steps {
                match st {
                    Step::Run(c) => {
                        if !s.is_empty() && !s.ends_with(' ') {
                            s.push(',');
                        }
                        let _ = write!(s, "{}", plan.chains[*c].leader().index());
                    }
                    Step::Barrier(_) => s.push(' '),
                }
            }
            let s = s.trim().to_string();
            if s.is_empty() { "-".to_string() } else { s }
        };
        [
            render(&self.pre_loop),
            render(&self.body),
            render(&self.post_loop),
        ]
        .join(" | ")
    }
}

/// Phase of the chain `ops` (leader first).
fn chain_phase(tb: &TbGraph, leader: Handle<TbOp>) -> Phase {
    let op = &tb.ops[leader];
    match &op.kind {
        TbOpKind::Input {
            forloop_dim: None, ..
        } => Phase::PreLoop,
        TbOpKind::Input { .. } => Phase::Loop,
        _ => {
            if op.inputs.iter().any(|&t| tb.tensors[t].after_accum) {
                Phase::PostLoop
            } else {
                Phase::Loop
            }
        }
    }
}

/// Schedules a validated threadblock graph.
pub fn schedule(tb: &TbGraph, plan: &FusionPlan) -> Schedule {
    schedule_with_pipes(tb, plan, &[])
}

/// Schedules a validated threadblock graph in which the tiles `piped` stay in registers
/// ([`crate::sched::plan::RegisterPipe`]): a chain reading one runs at its producer's level
/// (inside the producer's chain), not after a barrier.
pub fn schedule_with_pipes(tb: &TbGraph, plan: &FusionPlan, piped: &[usize]) -> Schedule {
    let n = plan.chains.len();
    let phase: Vec<Phase> = plan
        .chains
        .iter()
        .map(|c| chain_phase(tb, c.leader()))
        .collect();
    // The chains a chain reads from (tile, producing chain). Chains are in the order of their
    // leaders, which is topological for leaders' inputs; a binary member's side tile may come
    // from a chain led later, so levels are relaxed until nothing changes (at most n rounds:
    // the chains form a DAG).
    let producers = tb.producers();
    let reads: Vec<Vec<(usize, usize)>> = (0..n)
        .map(|c| {
            if matches!(tb.ops[plan.chains[c].leader()].kind, TbOpKind::Input { .. }) {
                return Vec::new();
            }
            plan.reads(tb, c)
                .into_iter()
                .filter_map(|t| producers[t.index()].map(|p| (t.index(), plan.chain_of[p.index()])))
                .filter(|&(_, pc)| pc != c && phase[pc] == phase[c])
                .collect()
        })
        .collect();
    let mut level = vec![0usize; n];
    for _ in 0..=n {
        let mut changed = false;
        for c in 0..n {
            let l = reads[c]
                .iter()
                .map(|&(t, pc)| level[pc] + usize::from(!piped.contains(&t)))
                .max()
                .unwrap_or(0);
            if l != level[c] {
                level[c] = l;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let steps_of = |ph: Phase| -> Vec<Step> {
        let mut chains: Vec<usize> = (0..n).filter(|&c| phase[c] == ph).collect();
        chains.sort_by_key(|&c| (level[c], plan.chains[c].leader()));
        let mut steps = Vec::new();
        let mut last: Option<usize> = None;
        for c in chains {
            if last.is_some_and(|l| l != level[c]) {
                steps.push(Step::Barrier(BarrierReason::NextLevel));
            }
            last = Some(level[c]);
            steps.push(Step::Run(c));
        }
        steps
    };
    let mut pre_loop = steps_of(Phase::PreLoop);
    let mut body = steps_of(Phase::Loop);
    let mut post_loop = steps_of(Phase::PostLoop);
    if !pre_loop.is_empty() {
        pre_loop.push(Step::Barrier(BarrierReason::LoopInvariantTiles));
    }
    if !post_loop.is_empty() && (!body.is_empty() || !pre_loop.is_empty()) {
        post_loop.insert(0, Step::Barrier(BarrierReason::AccumulatorsComplete));
    }
    if tb.forloop_range > 1 && needs_end_barrier(&phase, &level, &reads) {
        body.push(Step::Barrier(BarrierReason::EndOfBody));
    }
    Schedule {
        pre_loop,
        body,
        post_loop,
        phase,
        level,
    }
}

/// Whether a tile written at loop level 0 is read at the loop's last level.
fn needs_end_barrier(phase: &[Phase], level: &[usize], reads: &[Vec<(usize, usize)>]) -> bool {
    let last = (0..phase.len())
        .filter(|&c| phase[c] == Phase::Loop)
        .map(|c| level[c])
        .max();
    let Some(last) = last else { return false };
    // `reads` lists only producers in the reader's own phase.
    (0..phase.len())
        .filter(|&c| phase[c] == Phase::Loop && level[c] == last)
        .any(|c| reads[c].iter().any(|&(_, pc)| level[pc] == 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::builder::{GraphBuilder, TbGraphBuilder};
    use crate::graph::fusion::fuse;
    use crate::graph::{AccumKind, DType, KernelGraph};

    fn tb_of(g: &KernelGraph) -> &TbGraph {
        g.customized_ops().next().unwrap().1
    }

    /// The example of Mirage's transpiler document: A, B → 5; C, D → 6; 5, 6 → 7. The depth
    /// rule runs `1234 56 7` (two barriers), not `12 534 6 7` (three). 7 stays out of 5's and
    /// 6's chains: joining would run the chain one level later, where it reads input tiles at
    /// the last level (an end-of-body barrier more).
    #[test]
    fn depth_rule_picks_the_two_barrier_schedule() {
        let mut g = GraphBuilder::new();
        let ins: Vec<_> = (0..4)
            .map(|_| g.new_input(&[16, 64], DType::F16).unwrap())
            .collect();
        let mut tb = TbGraphBuilder::new([1, 1, 1], [128, 1, 1], 4);
        let t: Vec<_> = ins
            .iter()
            .map(|&x| tb.new_input(&g, x, [-1, -1, -1], 1).unwrap())
            .collect();
        let e = tb.add(t[0], t[1]).unwrap(); // op 4 ("5")
        let f = tb.mul(t[2], t[3]).unwrap(); // op 5 ("6")
        let h = tb.sub(e, f).unwrap(); // op 6 ("7")
        let acc = tb.forloop_accum(h, AccumKind::Nored).unwrap();
        tb.new_output(acc, [-1, -1, -1]).unwrap();
        let outs = g.customized(tb).unwrap();
        g.mark_output(outs[0]).unwrap();
        let g = g.build().unwrap();
        let tb = tb_of(&g);
        let plan = fuse(tb);
        let s = schedule(tb, &plan);
        assert_eq!(s.compact(&plan), "- | 0,1,2,3 4,5 6 | 8");
        // Body: 3 levels, 2 barriers; level-0 tiles are not read at the last level, so no
        // end-of-body barrier.
        assert_eq!(s.barrier_counts(), (0, 2, 1));
    }

    #[test]
    fn end_of_body_barrier_when_the_last_level_reads_level_0_tiles() {
        let mut g = GraphBuilder::new();
        let a = g.new_input(&[16, 64], DType::F16).unwrap();
        let b = g.new_input(&[64, 32], DType::F16).unwrap();
        let mut tb = TbGraphBuilder::new([1, 1, 1], [128, 1, 1], 4);
        let ta = tb.new_input(&g, a, [-1, -1, -1], 1).unwrap();
        let tbb = tb.new_input(&g, b, [-1, -1, -1], 0).unwrap();
        let m = tb.matmul(ta, tbb).unwrap();
        let acc = tb.forloop_accum(m, AccumKind::Nored).unwrap();
        let s = tb.silu(acc).unwrap();
        tb.new_output(s, [-1, -1, -1]).unwrap();
        let outs = g.customized(tb).unwrap();
        g.mark_output(outs[0]).unwrap();
        let g = g.build().unwrap();
        let tb = tb_of(&g);
        let plan = fuse(tb);
        let sch = schedule(tb, &plan);
        assert_eq!(sch.compact(&plan), "- | 0,1 2 | 4");
        assert_eq!(
            sch.body.last(),
            Some(&Step::Barrier(BarrierReason::EndOfBody))
        );
        assert_eq!(sch.barrier_counts(), (0, 2, 1));
    }

    #[test]
    fn loop_invariant_inputs_are_hoisted() {
        let mut g = GraphBuilder::new();
        let q = g.new_input(&[16, 64], DType::F16).unwrap();
        let k = g.new_input(&[64, 256], DType::F16).unwrap();
        let mut tb = TbGraphBuilder::new([1, 1, 1], [128, 1, 1], 4);
        let tq = tb.new_input(&g, q, [-1, -1, -1], -1).unwrap();
        let tk = tb.new_input(&g, k, [-1, -1, -1], 1).unwrap();
        let m = tb.matmul(tq, tk).unwrap();
        let e = tb.exp(m).unwrap();
        let acc = tb.forloop_accum(e, AccumKind::RedLdSum).unwrap();
        tb.new_output(acc, [-1, -1, -1]).unwrap();
        let outs = g.customized(tb).unwrap();
        g.mark_output(outs[0]).unwrap();
        let g = g.build().unwrap();
        let tb = tb_of(&g);
        let plan = fuse(tb);
        let sch = schedule(tb, &plan);
        assert_eq!(sch.compact(&plan), "0 | 1 2 | 5");
        assert_eq!(sch.phase[0], Phase::PreLoop);
        assert_eq!(sch.barrier_counts(), (1, 2, 1));
    }
}
