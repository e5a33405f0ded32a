//! Planning: every decision the generated code depends on, made here and recorded in a typed
//! [`GraphPlan`] ([`mod@plan`] module) that `explain` prints and `emit` prints code from.
//!
//! The stages, in the order [`plan()`] runs them:
//!
//! 1. fusion chains of each threadblock graph ([`crate::graph::fusion`]);
//! 2. layouts of every tensor, jointly, with Z3 ([`crate::layout::solve`]);
//! 3. DTensor strides and placement ([`dtensors`]);
//! 4. per customized operator ([`kernel`]): schedule ([`order`]), operator plans ([`ops`]), tile
//!    geometry and swizzles ([`crate::layout::swizzle`]), pipeline depth with the shared-memory
//!    plan ([`smem`], packed by [`memory`]), how each chain runs, the CTA;
//! 5. the workspace of intermediates (liveness, packed by [`memory`]);
//! 6. kernel-level operators: runtime kernels with their vector widths and launches, cuBLAS
//!    calls ([`kernel_level`], [`gemm`]).

pub mod combine;
pub mod dtensors;
pub mod exchange;
pub mod gemm;
pub mod kernel;
pub mod kernel_level;
pub mod memory;
pub mod ops;
pub mod order;
pub mod pipe;
pub mod plan;
pub mod refine;
pub mod rewrite;
pub mod rows;
pub mod shift;
pub mod smem;
pub mod softmax;
pub mod tma;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use crate::graph::fusion::{FusionPlan, fuse};
use crate::graph::kernel::KernelGraph;
use crate::layout::solve::resolve;

pub use kernel_level::KnOpPlan;
pub use plan::{
    CtaChoice, GraphPlan, GridSplitChoice, KernelPlan, Options, PathChoice, PlanError, RefineChoice,
};

/// Places the partial slots of every grid split ([`plan::GridSplit`]) one kernel after the
/// other from workspace byte `at` (each kernel's aligned); returns their bytes.
fn place_grid_split_slots(kernels: &mut BTreeMap<usize, plan::KernelPlan>, at: usize) -> usize {
    let mut end = at;
    for kp in kernels.values_mut() {
        if let plan::Split::Grid(gs) = &mut kp.split {
            gs.slots_at = end;
            end = (end + gs.slot_bytes()).next_multiple_of(plan::WORKSPACE_ALIGN);
        }
    }
    end - at
}

/// Places the arrival counters of every grid split from workspace byte `at` (after the
/// last-block combines' counters); returns their bytes.
fn place_grid_split_counters(kernels: &mut BTreeMap<usize, plan::KernelPlan>, at: usize) -> usize {
    let mut end = at;
    for kp in kernels.values_mut() {
        if let plan::Split::Grid(gs) = &mut kp.split {
            gs.counters_at = end;
            end += gs.counter_bytes();
        }
    }
    end - at
}

/// Which threadblock kernels launch programmatically (sm_90a, Hopper path, with
/// [`Options::dependent_launch`]): those whose previous step is a generated kernel or the
/// graph's start (a cuBLAS or NCCL call keeps a plain launch). The kernel before one triggers
/// it — a threadblock kernel after its loop, a kernel-level one first thing (returned) — and so
/// does the graph's last kernel (for the next execution's first). A programmatic kernel with TMA
/// loads prefetches its first iterations' boxes into L2 before it waits ([`plan::L2Prefetch`]).
fn plan_dependent_launches(
    kernel_ops: &[kernel_level::KnOpPlan],
    kernels: &mut BTreeMap<usize, KernelPlan>,
    opts: &Options,
) -> BTreeSet<usize> {
    use kernel_level::KnOpPlan;
    use plan::{DependentLaunch, PlainLaunch};
    /// The step before: the graph's start, a library call, or a generated kernel (a threadblock
    /// kernel or a kernel-level one, by operator index).
    #[derive(Clone, Copy)]
    enum Prev {
        Start,
        Library,
        Threadblock(usize),
        KernelLevel(usize),
    }
    let hopper = opts.path.hopper(&opts.target);
    let mut prev = Prev::Start;
    let mut kernel_level_triggers = BTreeSet::new();
    // The kernel `prev` names lets the next launch start early.
    let trigger = |prev: Prev,
                   kernels: &mut BTreeMap<usize, KernelPlan>,
                   kl: &mut BTreeSet<usize>| {
        match prev {
            Prev::Threadblock(j) => {
                if let Some(kp) = kernels.get_mut(&j) {
                    kp.triggers_next = true;
                }
            }
            Prev::KernelLevel(j) => {
                kl.insert(j);
            }
            Prev::Start | Prev::Library => {}
        }
    };
    let off = DependentLaunch::Off;
    for (i, op) in kernel_ops.iter().enumerate() {
        match op {
            KnOpPlan::Nothing => {}
            KnOpPlan::Gemm { calls, .. } if calls.is_empty() => {}
            KnOpPlan::AllReduce {
                fused: exchange::AllReduceForm::Fused { .. },
                ..
            } => {}
            // Performed by the attention kernel: no launch of its own.
            KnOpPlan::SoftmaxCombine { form, .. } if form.folded_into().is_some() => {}
            KnOpPlan::Gemm { .. } | KnOpPlan::AllReduce { .. } => prev = Prev::Library,
            KnOpPlan::Customized => {
                let Some(kp) = kernels.get_mut(&i) else {
                    continue;
                };
                kp.dependent = match (hopper, prev) {
                    (false, _) => off(PlainLaunch::Ampere),
                    _ if !opts.dependent_launch => off(PlainLaunch::OffByDefault),
                    (true, Prev::Library) => off(PlainLaunch::AfterLibrary),
                    (true, _) => DependentLaunch::Programmatic,
                };
                if kp.dependent.is_programmatic() && !kp.tma.loads.is_empty() {
                    kp.l2_prefetch = Some(plan::L2Prefetch {
                        iterations: kp.pipeline_stages().max(1),
                    });
                }
                if kp.dependent.is_programmatic() {
                    trigger(prev, kernels, &mut kernel_level_triggers);
                }
                prev = Prev::Threadblock(i);
            }
            _ => prev = Prev::KernelLevel(i),
        }
    }
    // The last kernel lets the next execution's first kernel (a programmatic launch) start.
    if hopper && opts.dependent_launch {
        trigger(prev, kernels, &mut kernel_level_triggers);
    }
    kernel_level_triggers
}

/// Plans a validated graph. Kernel-level matmuls whose only reader is a customized operator
/// are first fused into it where that plans ([`rewrite::fuse_matmuls`], unless
/// [`Options::fuse_matmuls`] is off), then split attention kernels compute their softmax online
/// where that plans ([`softmax::online_softmax`], unless [`Options::online_softmax`] is off),
/// then loops are refined where asked ([`refine::refine_loops`], [`Options::refine_loops`]);
/// the plan is that of the rewritten graph ([`GraphPlan::rewrite`], [`GraphPlan::graph`]).
pub fn plan(g: &KernelGraph, opts: &Options) -> Result<GraphPlan, PlanError> {
    let start = Instant::now();
    let capped = opts.with_stage_cap();
    let opts = &capped;
    let mut rw = rewrite::fuse_matmuls(g, opts.fuse_matmuls);
    if let Some(g2) = rw.graph.take() {
        match plan_with_softmax(&g2, opts) {
            Ok((mut p, sm, g3)) => {
                rw.graph = Some(g3.unwrap_or(g2));
                rw.softmax = sm;
                rw.loops = std::mem::take(&mut p.rewrite.loops);
                rw.shift = std::mem::take(&mut p.rewrite.shift);
                p.rewrite = rw;
                p.elapsed = start.elapsed();
                return Ok(p);
            }
            Err(e) => rw.undo(rewrite::KeptMatmul::Plan(plan::RewriteFailure::Plan(e))),
        }
    }
    let (mut p, sm, g3) = plan_with_softmax(g, opts)?;
    rw.graph = g3;
    rw.softmax = sm;
    rw.loops = std::mem::take(&mut p.rewrite.loops);
    rw.shift = std::mem::take(&mut p.rewrite.shift);
    p.rewrite = rw;
    p.elapsed = start.elapsed();
    Ok(p)
}

/// Plans `g` with its attention kernels' softmax computed online where that plans (and, with
/// [`softmax::SoftmaxChoice::Piped`], where the rewritten kernel keeps its scores in a register
/// pipe), else `g` as it is, each with its loops refined where asked ([`plan_refined`]);
/// returns the plan, what the softmax rewrite did and the graph planned if it is not `g`.
fn plan_with_softmax(
    g: &KernelGraph,
    opts: &Options,
) -> Result<(GraphPlan, softmax::SoftmaxRewrite, Option<Box<KernelGraph>>), PlanError> {
    use softmax::{NoOnlineSoftmax, SoftmaxChoice, SplitFold, SplitsKept};
    let on = opts.online_softmax != SoftmaxChoice::Off;
    let mut ask = softmax::FoldAsk {
        choice: opts.fold_key_splits,
        hopper: opts.path.hopper(&opts.target),
        sms: opts.target.typical_sms,
        resident: BTreeMap::new(),
    };
    // Recognised and checked once: the rewrite is tried again below with other choices.
    let rec = softmax::recognise_attention(g, on);
    let mut sm = softmax::online_softmax_from(g, &rec, &ask, &|_| None);
    // The graph with the splits kept, planned to measure the blocks per SM, and its plan: the
    // plan is taken as it is where the rule then folds nothing.
    let mut kept: Option<Unfolded> = None;
    if sm
        .applied
        .iter()
        .any(|a| a.fold == SplitFold::Kept(SplitsKept::Unmeasured))
    {
        let (resident, planned) = resident_unfolded(g, &rec, &ask, opts);
        ask.resident = resident;
        kept = planned;
        sm = softmax::online_softmax_from(g, &rec, &ask, &|_| None);
    }
    let mut vetoed: BTreeMap<usize, NoOnlineSoftmax> = BTreeMap::new();
    // Why folded key splits were given up (the folded graph did not plan).
    let mut unfolded: Option<SplitsKept> = None;
    let mut was_folded: Vec<usize> = Vec::new();
    // At most three times: again without folded key splits where the folded graph did not
    // plan, and without the kernels that did not pipe.
    for _ in 0..3 {
        let Some(g3) = sm.graph.take() else { break };
        let folded: BTreeSet<usize> = sm
            .applied
            .iter()
            .filter(|a| a.combine.is_none())
            .map(|a| a.rewritten)
            .collect();
        let planned = match kept.take() {
            Some((g0, planned)) if *g0 == *g3 => Ok(planned),
            _ => plan_refined(&g3, opts, &folded),
        };
        let (p, g4) = match planned {
            Ok(p) => p,
            Err(e) => {
                let folded: Vec<usize> = sm
                    .applied
                    .iter()
                    .filter(|a| matches!(a.fold, SplitFold::Folded { .. }))
                    .map(|a| a.kernel)
                    .collect();
                if !folded.is_empty() && unfolded.is_none() {
                    was_folded = folded;
                    unfolded = Some(SplitsKept::Plan(plan::RewriteFailure::Plan(e)));
                    ask.choice = softmax::KeyFold::Off;
                    sm = softmax::online_softmax_from(g, &rec, &ask, &|k| vetoed.get(&k).cloned());
                    continue;
                }
                sm.undo(NoOnlineSoftmax::Plan(plan::RewriteFailure::Plan(e)));
                break;
            }
        };
        if opts.online_softmax == SoftmaxChoice::Piped {
            for a in &sm.applied {
                if let Some(why) = not_piped(&p, a.rewritten) {
                    vetoed.insert(a.kernel, NoOnlineSoftmax::NotPiped(why));
                }
            }
            if !vetoed.is_empty() {
                sm = softmax::online_softmax_from(g, &rec, &ask, &|k| vetoed.get(&k).cloned());
                continue;
            }
        }
        if let Some(why) = &unfolded {
            for a in &mut sm.applied {
                if was_folded.contains(&a.kernel) {
                    a.fold = SplitFold::Kept(why.clone());
                }
            }
        }
        return Ok((p, sm, Some(g4.unwrap_or(g3))));
    }
    let (p, g4) = plan_shifted(g, opts)?;
    Ok((p, sm, g4))
}

/// A graph rewritten with its key splits kept, and its plan ([`plan_refined`]'s result).
type Unfolded = (Box<KernelGraph>, (GraphPlan, Option<Box<KernelGraph>>));

/// For the key-fold rule ([`softmax::fold_rule`]): per attention kernel the online-softmax
/// rewrite applies to (its index in `g`), the blocks an SM holds by the shared memory of that
/// kernel planned with its key splits kept (empty where that graph does not plan); and that
/// graph with its plan, which the caller reuses where the rule folds nothing.
fn resident_unfolded(
    g: &KernelGraph,
    rec: &softmax::Recognised,
    ask: &softmax::FoldAsk,
    opts: &Options,
) -> (BTreeMap<usize, usize>, Option<Unfolded>) {
    let kept = softmax::FoldAsk {
        choice: softmax::KeyFold::Off,
        ..ask.clone()
    };
    let mut sm = softmax::online_softmax_from(g, rec, &kept, &|_| None);
    let Some(g3) = sm.graph.take() else {
        return (BTreeMap::new(), None);
    };
    let Ok(planned) = plan_refined(&g3, opts, &BTreeSet::new()) else {
        return (BTreeMap::new(), None);
    };
    let resident = sm
        .applied
        .iter()
        .filter_map(|a| {
            let kp = planned.0.kernels.get(&a.rewritten)?;
            Some((
                a.kernel,
                kernel::blocks_by_smem(&opts.target, kp.smem.total),
            ))
        })
        .collect();
    (resident, Some((g3, planned)))
}

/// Plans `g` with the exponentials of its loaded scores taken less their row max where that
/// computes the same function and plans ([`shift::shift_scores`], unless
/// [`Options::online_softmax`] is off), else `g` as it is, each with its loops refined where
/// asked ([`plan_refined`]); what the shift did goes to the plan's [`GraphPlan::rewrite`].
fn plan_shifted(
    g: &KernelGraph,
    opts: &Options,
) -> Result<(GraphPlan, Option<Box<KernelGraph>>), PlanError> {
    let on = opts.online_softmax != softmax::SoftmaxChoice::Off;
    let mut sh = shift::shift_scores(g, on);
    if let Some(g2) = sh.graph.take() {
        match plan_refined(&g2, opts, &BTreeSet::new()) {
            Ok((mut p, g3)) => {
                p.rewrite.shift = sh;
                return Ok((p, Some(g3.unwrap_or(g2))));
            }
            Err(e) => sh.undo(shift::NoShift::Plan(plan::RewriteFailure::Plan(e))),
        }
    }
    let (mut p, g3) = plan_refined(g, opts, &BTreeSet::new())?;
    p.rewrite.shift = sh;
    Ok((p, g3))
}

/// Plans `g` with its customized operators' loops refined by [`Options::refine_loops`] where
/// their bodies allow and the refined graph plans ([`refine::refine_loops`]), else as it is;
/// returns the plan (what was refined in its [`GraphPlan::rewrite`]'s `loops`) and the refined
/// graph if one was planned. `folded`: the kernels whose every key split the softmax rewrite
/// folded into the loop (for the planner's rule, [`refine::RuleRefinement::Folded`]).
fn plan_refined(
    g: &KernelGraph,
    opts: &Options,
    folded: &BTreeSet<usize>,
) -> Result<(GraphPlan, Option<Box<KernelGraph>>), PlanError> {
    let none = BTreeMap::new();
    let Some(scale) = opts.refine_loops.scale() else {
        return plan_auto_refined(g, opts, folded);
    };
    let mut lr = refine::rescale_loops(g, scale);
    if let Some(g2) = lr.graph.take() {
        match plan_graph(&g2, opts, &none) {
            Ok(mut p) => {
                p.rewrite.loops = lr;
                return Ok((p, Some(g2)));
            }
            Err(e) => lr.undo(refine::NotRefined::Plan(plan::RewriteFailure::Plan(e))),
        }
    }
    let mut p = plan_graph(g, opts, &none)?;
    p.rewrite.loops = lr;
    Ok((p, None))
}

/// [`plan_refined`] by the planner's rule ([`plan::RefineChoice::Auto`]): `g` is planned as
/// it is, then the loops of the kernels [`kernel::rule_refinement`] asks for are refined by
/// [`refine::AUTO_FACTOR`] and the refined graph planned with each such kernel as its reason
/// wants ([`plan_graph`]'s `rules`). A refined kernel that does not get what the rule refined
/// it for ([`refine::AUTO_BLOCKS`] blocks per SM; a ring) keeps its loop, and the others are
/// refined and planned again without it.
fn plan_auto_refined(
    g: &KernelGraph,
    opts: &Options,
    folded: &BTreeSet<usize>,
) -> Result<(GraphPlan, Option<Box<KernelGraph>>), PlanError> {
    use refine::{NotRefined, RuleKept, RuleRefinement};
    let mut p = plan_graph(g, opts, &BTreeMap::new())?;
    let mut vetoed: BTreeMap<usize, RuleKept> = BTreeMap::new();
    // Each round refines fewer kernels (those vetoed stay), so the loop ends.
    loop {
        let rule = |k: usize| -> Result<Option<RuleRefinement>, NotRefined> {
            if let Some(why) = vetoed.get(&k) {
                return Err(NotRefined::Rule(why.clone()));
            }
            // Every customized operator of `g` has a kernel plan in `p`; the rule refines none
            // without one.
            let unplanned = || NotRefined::NoKernelPlan { kernel: k };
            let crate::graph::kernel::KnOpKind::Customized(tb) =
                &g.ops[crate::graph::arena::Handle::from_index(k)].kind
            else {
                return Err(unplanned());
            };
            let Some(kp) = p.kernels.get(&k) else {
                return Err(unplanned());
            };
            kernel::rule_refinement(tb, kp, opts, folded.contains(&k))
                .map(Some)
                .map_err(NotRefined::Rule)
        };
        let mut lr =
            refine::refine_loops_where(g, refine::LoopScale::Refine(refine::AUTO_FACTOR), &rule);
        lr.rule = true;
        let Some(g2) = lr.graph.take() else {
            p.rewrite.loops = lr;
            return Ok((p, None));
        };
        let rules: BTreeMap<usize, RuleRefinement> = lr
            .refined
            .iter()
            .filter_map(|r| Some((r.kernel, r.rule?)))
            .collect();
        let mut p2 = match plan_graph(&g2, opts, &rules) {
            Ok(p2) => p2,
            Err(e) => {
                lr.undo(NotRefined::Plan(plan::RewriteFailure::Plan(e)));
                p.rewrite.loops = lr;
                return Ok((p, None));
            }
        };
        let short: Vec<(usize, RuleKept)> = rules
            .iter()
            .filter_map(|(&k, why)| {
                let kp = p2.kernels.get(&k)?;
                match why {
                    RuleRefinement::Occupancy | RuleRefinement::Folded
                        if kp.cta.min_blocks_per_sm < refine::AUTO_BLOCKS =>
                    {
                        let blocks = kp.cta.min_blocks_per_sm;
                        Some((k, RuleKept::TooFew { blocks }))
                    }
                    RuleRefinement::Pipeline if kp.pipeline_stages() < 2 => {
                        Some((k, RuleKept::NoRing))
                    }
                    _ => None,
                }
            })
            .collect();
        if short.is_empty() {
            p2.rewrite.loops = lr;
            return Ok((p2, Some(g2)));
        }
        // The kernels that got what they were refined for are refined again without the others.
        vetoed.extend(short);
    }
}

/// Why kernel `k` of plan `p` does not keep its rescaled scores in an online register pipe,
/// or `None` when it does.
fn not_piped(p: &GraphPlan, k: usize) -> Option<softmax::NotPiped> {
    let Some(kp) = p.kernels.get(&k) else {
        return Some(softmax::NotPiped::NotThreadblock);
    };
    if kp.register_pipes().any(|r| r.online.is_some()) {
        return None;
    }
    Some(
        kp.pipes
            .iter()
            .find_map(|d| match d {
                plan::PipeDecision::Off { why, .. } => Some(softmax::NotPiped::Pipe(why.clone())),
                plan::PipeDecision::On(_) => None,
            })
            .unwrap_or(softmax::NotPiped::NoRunningMax),
    )
}

/// Plans a validated graph as it is; the kernels in `rules` had their loops refined by the planner's rule, and are
/// planned for what it refined them for: [`refine::AUTO_BLOCKS`] blocks per SM of the µGraph's
/// CTA ([`kernel::plan_kernel`]'s `occupancy`), or rings of at most
/// [`refine::AUTO_PIPELINE_STAGES`] stages.
fn plan_graph(
    g: &KernelGraph,
    opts: &Options,
    rules: &BTreeMap<usize, refine::RuleRefinement>,
) -> Result<GraphPlan, PlanError> {
    let start = Instant::now();
    let target = &opts.target;
    let gpus = g.sharding.num_gpus();
    if let plan::CtaChoice::Warps(w) = opts.cta
        && !(1..=plan::MAX_WARPS).contains(&w)
    {
        return Err(PlanError::WarpsOutOfRange { warps: w });
    }
    if opts.path == plan::PathChoice::Hopper && !target.has_tma_wgmma {
        return Err(PlanError::PathUnavailable {
            path: opts.path.to_string(),
            arch: target.arch.to_string(),
        });
    }
    let fusion: BTreeMap<usize, FusionPlan> = g
        .customized_ops()
        .map(|(h, tb)| (h.index(), fuse(tb)))
        .collect();
    let layout = resolve(g, &fusion, &opts.solve)?;
    let mut dt = dtensors::dtensor_geometry(g, &layout);
    let mut kernels = BTreeMap::new();
    for (h, tb) in g.customized_ops() {
        let k = h.index();
        let fusion = fusion[&k].clone();
        let kl = &layout.kernels[&k];
        let kp = match rules.get(&k) {
            None => kernel::plan_kernel(g, k, tb, fusion, kl, &dt, opts, false)?,
            Some(refine::RuleRefinement::Occupancy | refine::RuleRefinement::Folded) => {
                kernel::plan_kernel(g, k, tb, fusion, kl, &dt, opts, true)?
            }
            Some(refine::RuleRefinement::Pipeline) => {
                let mut capped = opts.clone();
                let stages = &mut capped.target.max_pipeline_stages;
                *stages = (*stages).min(refine::AUTO_PIPELINE_STAGES);
                kernel::plan_kernel(g, k, tb, fusion, kl, &dt, &capped, false)?
            }
        };
        kernels.insert(k, kp);
    }
    let (workspace, workspace_tensors) = dtensors::workspace_buffers(g, &dt);
    let workspace_packing = memory::pack(&workspace);
    for (b, &t) in workspace_tensors.iter().enumerate() {
        dt[t].placement = plan::Placement::Workspace(workspace_packing.offsets[b]);
    }
    let (inputs, outputs) = dtensors::io_plans(g, &dt);
    let bytes = |io: &[plan::IoPlan]| -> usize {
        io.iter()
            .map(|b| {
                b.alloc_elems
                    .saturating_mul(g.tensors[b.tensor].dtype.bytes())
            })
            .fold(0usize, usize::saturating_add)
    };
    let (in_bytes, out_bytes) = (bytes(&inputs), bytes(&outputs));
    let needed = in_bytes
        .saturating_add(out_bytes)
        .saturating_add(workspace_packing.peak);
    if needed > target.device_memory {
        return Err(PlanError::DeviceMemory {
            needed,
            inputs: in_bytes,
            outputs: out_bytes,
            workspace: workspace_packing.peak,
            limit: target.device_memory,
            arch: target.arch.to_string(),
        });
    }
    let mut kernel_ops = kernel_level::plan_kernel_ops(g, &dt, &outputs, target)?;
    let exchange_bytes =
        exchange::fuse_all_reduces(g, &mut kernel_ops, &mut kernels, opts.all_reduce);
    let split_bytes = place_grid_split_slots(&mut kernels, plan::splits_at(workspace_packing.peak));
    let counters_at = plan::counters_at(workspace_packing.peak, split_bytes);
    let mut counter_bytes = combine::fuse_softmax_combines(
        g,
        &dt,
        &mut kernel_ops,
        &mut kernels,
        combine::FoldChoice {
            hopper: opts.path.hopper(target),
            cluster: opts.cluster_combine,
            last_block: opts.last_block_combine,
            counters_at,
        },
    );
    counter_bytes += place_grid_split_counters(&mut kernels, counters_at + counter_bytes);
    let kernel_level_triggers = plan_dependent_launches(&kernel_ops, &mut kernels, opts);
    let unfused = dtensors::unfused(g, &dt);
    Ok(GraphPlan {
        target: *target,
        layout,
        dtensors: dt,
        inputs,
        outputs,
        kernel_ops,
        kernel_level_triggers,
        kernels,
        workspace,
        workspace_tensors,
        workspace_packing,
        unfused,
        symbols: opts.symbols.clone(),
        gpus,
        exchange_bytes,
        split_bytes,
        counter_bytes,
        rewrite: rewrite::Rewrite::default(),
        elapsed: start.elapsed(),
    })
}
