//! The plan of one customized operator, in order: schedule → operator plans → tile geometry
//! (swizzles) → copies the geometry cannot serve → pipeline depth and shared memory → how each
//! chain runs → the CTA.

use super::ops::{
    AccumStorage, Copy, CopyEngine, MatmulInstr, OpPlan, OperandLoad, operand_loads, plan_ops,
    tile_dtypes,
};
use super::order::{Phase, Schedule, Step};
use super::pipe::plan_pipes;
use super::plan::{
    ApproxExp, BlockRegion, BodyBarriers, ChainPlan, ClusterSplit, CodePath, Combine, CopyWaits,
    Cta, CtaChoice, CtaSource, CtaWhy, DTensorGeometry, DependentLaunch, Gather, GridSplit,
    GridSplitChoice, GridSplitOff, HOISTED_ACCUM_REGISTERS, KernelPlan, LoopIndices,
    MatmulLowering, NoGridSplit, NoPush, Options, Partial, PipeDecision, PlanError, Prefetch,
    PushSlots, RingStart, Sink, SmemPlan, Split, SplitOff, WgmmaOff, WriteBack, ZERO_PAGE,
};
use super::smem::{SMEM_LINE, smem_plan};
use super::tma::{TmaPlan, pad_slots, plan_tma};
use crate::graph::arena::Handle;
use crate::graph::dtype::DType;
use crate::graph::fusion::{FusionPlan, NotFused};
use crate::graph::kernel::{DTensor, KernelGraph};
use crate::graph::ops::{AccumKind, BinaryOp, TbReduction, UnaryOp};
use crate::graph::shape::Shape;
use crate::graph::threadblock::{TbGraph, TbOp, TbOpKind};
use crate::layout::solve::{KernelLayout, TileLayout};
use crate::layout::swizzle::{Swizzle, TileGeometry, plan_tile};
use crate::target::{RUNTIME_STATIC_SMEM, Target};
use std::collections::BTreeMap;

/// Shared memory the driver reserves per resident block (bytes).
const DRIVER_SMEM_PER_BLOCK: usize = 1024;

/// Blocks of `tb` one SM should hold at once: two when blocks are small (≤ 4 warps) and the
/// grid has at least two per SM of a typical part of the target, so that one block's
/// barriers and memory waits overlap the other's work; three when such a kernel keeps a
/// product in registers between two matmuls (`piped`: its warps issue tensor-core work back
/// to back and need more warps per scheduler to hide the latency), the grid has three per SM
/// and its last wave stays nearly as full as with two ([`wave_fill`] at least
/// [`THIRD_BLOCK_MIN_FILL`] of two's); else one. Pipeline depth gives way to this (down to
/// two stages), as a deep pipeline in a lone 4-warp block hides less. Measured (docs/
/// benchmarks.md): the piped attention kernels of mqa_bs8 and gqa_bs8 (1024 blocks of 4
/// warps) took 0.89× and 0.99× the time with three resident blocks instead of two on an H200,
/// mqa_bs8 g3 0.90× on an H100 once ptxas was promised the three (launch bounds); an attention
/// block of 512 blocks and 2 iterations took 1.11× the time with three (H100: 396 slots leave
/// the second wave a third full); four (registers capped at 128) made mqa_bs8 1.49× slower.
fn resident_blocks_wanted(tb: &TbGraph, threads: usize, target: &Target, piped: bool) -> usize {
    let warps = threads.div_ceil(32);
    let (blocks, sms) = (tb.num_blocks(), target.typical_sms);
    if warps > 4 {
        1
    } else if piped
        && blocks >= 3 * sms
        && wave_fill(blocks, 3 * sms) >= THIRD_BLOCK_MIN_FILL * wave_fill(blocks, 2 * sms)
    {
        3
    } else if blocks >= 2 * sms {
        2
    } else {
        1
    }
}

/// The deepest ring of a kernel with a register pipe. Measured (H100, `mucc bench FILE --all
/// --max-stages 2` against the default's 4 stages, one run, docs/benchmarks.md): gqa_bs8's piped
/// attention kernels (1024 blocks, 4 iterations of 16 KB stages: 74.7 KB → 42 KB per block, so
/// that a fourth block fits beside the three budgeted) took 0.87× the time; the piped
/// candidates of gqa_bs1 (0.99×) and mqa_bs1 (1.00×) did not move, mqa_bs8's had 2 already.
const PIPED_MAX_STAGES: usize = 2;

/// Bytes a small grid's ring keeps in flight ahead of the stage its CTA reads: its depth is the
/// fewest stages that hold this much beyond one. Measured (H100, `--max-stages`, docs/
/// benchmarks.md "Ring depth"): decode layers with 17–22 KB stages took 0.90–0.95× the time with
/// 2 stages instead of 3–4, those with 9 KB stages were fastest with 3 (2: 1.15×).
const RING_BYTES_AHEAD: usize = 16 * 1024;

/// The share of a piped kernel's waves a third resident block must keep filled, relative to
/// two blocks' (its gain per block measured at about 10%: 0.89–0.90× the time).
const THIRD_BLOCK_MIN_FILL: f64 = 0.85;

/// The fraction of `slots` block slots that `blocks` blocks fill over their waves.
fn wave_fill(blocks: usize, slots: usize) -> f64 {
    blocks as f64 / (blocks.div_ceil(slots.max(1)) * slots.max(1)) as f64
}

/// The device tensors on one side of a customized operator: shape, strides, innermost dim.
pub(super) type Side = Vec<(Shape, crate::graph::shape::Strides, usize)>;

fn side(g: &KernelGraph, dt: &[DTensorGeometry], hs: &[Handle<DTensor>]) -> Side {
    hs.iter()
        .map(|&t| {
            (
                g.tensors[t].shape,
                dt[t.index()].strides.clone(),
                dt[t.index()].innermost,
            )
        })
        .collect()
}

/// Plans customized operator `k` (threadblock graph `tb`) for `opts`' target and path, with
/// the CTA `opts.cta` asks for; with [`CtaChoice::Auto`], the µGraph's CTA is planned first and
/// the kernel planned again with the warps [`more_warps`] asks for, if any (the first plan is
/// kept when the second fails, e.g. on shared memory).
///
/// `occupancy`: the kernel's loop was refined by the planner's rule ([`super::refine`],
/// [`rule_refinement`]) so that [`super::refine::AUTO_BLOCKS`] blocks of the µGraph's CTA
/// fit per SM; it is planned for that many.
#[allow(clippy::too_many_arguments)]
pub(super) fn plan_kernel(
    g: &KernelGraph,
    k: usize,
    tb: &TbGraph,
    fusion: FusionPlan,
    kl: &KernelLayout,
    dt: &[DTensorGeometry],
    opts: &Options,
    occupancy: bool,
) -> Result<KernelPlan, PlanError> {
    let op = &g.ops[Handle::from_index(k)];
    let geometry = |hs: &[Handle<DTensor>]| -> Vec<&DTensorGeometry> {
        hs.iter().map(|t| &dt[t.index()]).collect()
    };
    // Register rows load nothing by TMA: every input and output has its block region.
    let regions = plan_regions(g, op, tb, dt, &TmaPlan::default());
    let rows = if g.sharding.num_gpus() > 1 {
        Err(super::rows::RowsOff::SeveralGpus)
    } else if opts.cta != CtaChoice::Auto {
        Err(super::rows::RowsOff::CtaAsked)
    } else if !opts.register_rows {
        Err(super::rows::RowsOff::TurnedOff)
    } else {
        super::rows::plan_rows(
            tb,
            &regions,
            &geometry(&op.inputs),
            &geometry(&op.outputs),
            g.tensors[op.outputs[0]].dtype,
        )
    };
    let rows = match rows {
        Ok(rows) => rows,
        Err(why) => {
            let mut p = plan_kernel_tiles(g, k, tb, fusion, kl, dt, opts, occupancy)?;
            p.body = super::plan::Body::Tiles(why);
            return Ok(p);
        }
    };
    let why = CtaWhy::RegisterRows;
    // The tile plan only fills the fields the body does not use (its shared memory may well
    // exceed the GPU's: the rows need none).
    let mut p = plan_kernel_with(
        g,
        k,
        tb,
        fusion,
        kl,
        dt,
        opts,
        rows.threads,
        CtaSource::Model(why),
        true,
        None,
    )?;
    p.tiles = vec![None; p.tiles.len()];
    p.smem = SmemPlan {
        buffers: Vec::new(),
        kinds: Vec::new(),
        packing: super::memory::pack(&[]),
        base: 0,
        total: 0,
    };
    p.unfused.clear();
    p.split = Split::Off(SplitOff::RegisterRows);
    p.tma = TmaPlan::default();
    p.regions = regions;
    p.cta.min_blocks_per_sm = 1;
    p.cta.resident_blocks = 1;
    p.cta.resident_asked = false;
    p.write_backs.clear();
    p.copy_waits = CopyWaits::default();
    p.body = super::plan::Body::Rows(rows);
    Ok(p)
}

/// [`plan_kernel`] over shared-memory tiles: the CTA shape by the cost model (or as asked).
#[allow(clippy::too_many_arguments)]
fn plan_kernel_tiles(
    g: &KernelGraph,
    k: usize,
    tb: &TbGraph,
    fusion: FusionPlan,
    kl: &KernelLayout,
    dt: &[DTensorGeometry],
    opts: &Options,
    occupancy: bool,
) -> Result<KernelPlan, PlanError> {
    let with = |fusion: FusionPlan, threads: usize, source: CtaSource| {
        plan_kernel_with(g, k, tb, fusion, kl, dt, opts, threads, source, false, None)
    };
    let graph = tb.num_threads().max(1);
    match opts.cta {
        CtaChoice::Warps(w) => return with(fusion, w * 32, CtaSource::Asked),
        CtaChoice::Graph => return with(fusion, graph, CtaSource::Graph),
        CtaChoice::Auto if occupancy => {
            let why = CtaWhy::Refined;
            let resident = Some(super::refine::AUTO_BLOCKS);
            return plan_kernel_with(
                g,
                k,
                tb,
                fusion,
                kl,
                dt,
                opts,
                graph,
                CtaSource::Model(why),
                false,
                resident,
            );
        }
        CtaChoice::Auto => {}
    }
    let kept = |mut p: KernelPlan, why: CtaWhy| {
        p.cta.source = CtaSource::Model(why);
        p
    };
    let (warps, why) = match more_warps(tb, &opts.target) {
        Ok((w, _)) if w * 32 <= graph => {
            return with(fusion, graph, CtaSource::Model(CtaWhy::EnoughWarps));
        }
        Ok(want) => want,
        Err(why) => {
            let first = with(fusion.clone(), graph, CtaSource::Model(why))?;
            // A large grid gives an SM as many warps as it holds blocks: where shared memory
            // holds one block of fewer than 8 warps, the SM idles on every stall. mha_bs8's
            // fused attention (1024 blocks of 4 warps, 208 KB each) took 108.09 µs with 4 warps
            // per CTA, 103.98 with 8 and 105.58 with 16 (H100, same run, docs/benchmarks.md).
            // Measured on the Hopper path only; the Ampere path keeps the µGraph's CTA.
            let hopper = opts.path.hopper(&opts.target);
            let one_small = first.cta.min_blocks_per_sm == 1 && graph < MIN_RESIDENT_WARPS * 32;
            if !hopper || !one_small {
                return Ok(first);
            }
            let why = CtaSource::Model(CtaWhy::OneSmallBlock);
            return Ok(match with(fusion, MIN_RESIDENT_WARPS * 32, why) {
                Ok(p) if p.cta.min_blocks_per_sm >= first.cta.min_blocks_per_sm => p,
                _ => first,
            });
        }
    };
    let first = with(fusion.clone(), graph, CtaSource::Graph)?;
    // A register pipe needs its warps to own whole rows: more warps than row tiles turn it
    // off. Where the grid has a block per SM or more, the pipe on the µGraph's warps wins
    // (H200, builder attention blocks of 256–512 blocks: 0.76–0.93× the time of 8 or 16 warps
    // without the pipe); smaller grids keep the extra warps (8 and 32 blocks: 16 warps without
    // the pipe 0.77–0.85× the pipe's time).
    let piped = first.register_pipes().any(|p| p.keys == 1);
    if piped && tb.num_blocks() >= opts.target.typical_sms {
        return Ok(kept(first, CtaWhy::PipeRows));
    }
    // Without its pipe, an online-softmax kernel rescales through shared memory, several times
    // the instructions (H100: 1.8-5x the time): the pipe wins at any grid size. A key split
    // keeps its pipe on more warps where its keys split over them.
    let online = |p: &KernelPlan| p.register_pipes().any(|r| r.online.is_some());
    let more = with(fusion, warps * 32, CtaSource::Model(why));
    if online(&first) && !matches!(&more, Ok(p) if online(p)) {
        let why = if first.register_pipes().any(|p| p.keys > 1) {
            CtaWhy::OnlineKeys
        } else {
            CtaWhy::OnlineRows
        };
        return Ok(kept(first, why));
    }
    match more {
        // A loop longer than a pipeline's worth pays for its split: more warps must not shrink
        // the cluster (measured 1.06–3.19× slower where they did).
        Ok(p) if tb.forloop_range > SHORT_LOOP && p.split.ctas() < first.split.ctas() => {
            Ok(kept(first, CtaWhy::ClusterShrinks))
        }
        Ok(p) => Ok(p),
        Err(_) => Ok(kept(first, CtaWhy::NoPlanWithMore)),
    }
}

/// Warps an SM should hold at least: a kernel whose large grid leaves fewer resident (shared
/// memory holding one small block) gets CTAs of this many warps.
const MIN_RESIDENT_WARPS: usize = 8;

/// Whether the planner's loop-refinement rule ([`super::refine`], [`Options::refine_loops`]
/// auto) asks for kernel `tb`, planned as `kp` with its loop as the µGraph writes it, and why.
/// Only on the Hopper path with the CTA left to the cost model (measured there), for two
/// shapes:
/// - [`RuleRefinement::Occupancy`]: a grid of 4 or more blocks per SM (where [`more_warps`]
///   keeps the µGraph's CTA) whose blocks of fewer than 8 warps shared memory holds only one of
///   per SM. Measured (H100, `mucc bench`, docs/benchmarks.md): mha_bs8 graph 25's fused
///   attention, 1024 blocks of 4 warps holding 208 KB, took 100.06 µs as one 8-warp CTA per SM,
///   98.43 refined by 2 (two blocks of 3 stages), 95.11 refined by 2 in three blocks of 2
///   stages, 104.52 by 4 with 2 stages;
/// - [`RuleRefinement::Pipeline`]: a grid of fewer than 4 blocks per SM whose loop of at most
///   [`SHORT_LOOP`] iterations is planned without a ring (too short to pipeline), and refined
///   runs more than [`SHORT_LOOP`]: mha_bs1's attention candidates (64 blocks, 4 iterations)
///   took 0.85–0.87× the time refined by 2 with rings of 2 (22.11 → 19.07 µs for graph 10).
///
/// - [`RuleRefinement::Folded`] (`folded`): a split attention kernel whose every key split was
///   folded into its loop keeps the shape of the large grid it came from: mha_bs8 graph 30
///   folded, 256 blocks, took 92.25 µs as one 8-warp CTA per SM over tiles of 256 keys and
///   90.2 refined by 2 as blocks of the µGraph's 4 warps (H100, docs/benchmarks.md).
///
/// The loops of kernels that hold several blocks per SM or pipeline already lost when refined
/// (gated_mlp, rmsnorm, decode linears: 1.01–1.77×).
pub(super) fn rule_refinement(
    tb: &TbGraph,
    kp: &KernelPlan,
    opts: &Options,
    folded: bool,
) -> Result<super::refine::RuleRefinement, super::refine::RuleKept> {
    use super::refine::{AUTO_FACTOR, RuleKept, RuleRefinement};
    let target = &opts.target;
    let warps = tb.num_threads().div_ceil(32);
    if !opts.path.hopper(target) {
        return Err(RuleKept::AmperePath);
    }
    if opts.cta != CtaChoice::Auto {
        return Err(RuleKept::CtaAsked);
    }
    if folded {
        return Ok(RuleRefinement::Folded);
    }
    if tb.num_blocks() < 4 * target.typical_sms {
        if kp.pipeline_stages() > 1 {
            return Err(RuleKept::Pipelined {
                blocks: tb.num_blocks(),
            });
        }
        if tb.forloop_range > SHORT_LOOP {
            return Err(RuleKept::NotShort {
                forloop: tb.forloop_range,
            });
        }
        if tb.forloop_range * AUTO_FACTOR <= SHORT_LOOP {
            return Err(RuleKept::TooShort {
                forloop: tb.forloop_range,
            });
        }
        return Ok(RuleRefinement::Pipeline);
    }
    if warps >= MIN_RESIDENT_WARPS {
        return Err(RuleKept::WideCta { warps });
    }
    let fit = blocks_by_smem(target, kp.smem.total);
    if fit > 1 {
        return Err(RuleKept::Resident { blocks: fit });
    }
    Ok(RuleRefinement::Occupancy)
}

/// How many blocks of `smem_total` bytes of dynamic shared memory an SM of `target` holds
/// (the runtime's static arrays and the driver's reservation counted per block).
pub(crate) fn blocks_by_smem(target: &Target, smem_total: usize) -> usize {
    target.smem_per_sm / (smem_total + DRIVER_SMEM_PER_BLOCK + RUNTIME_STATIC_SMEM).max(1)
}

/// Iterations of a loop too short to pipeline its loads (the cost model gives such kernels 16
/// warps, and lets them drop a cluster split).
const SHORT_LOOP: usize = 4;

/// Warps per CTA the cost model wants for a kernel, and why; `Err(why)` keeps the µGraph's CTA
/// ([`plan_kernel`] also keeps it where the plan with more warps shrinks the cluster split of a
/// loop longer than [`SHORT_LOOP`]). The µGraph's
/// `block_dim` (128 threads in every corpus graph) leaves an SM with 4–8 warps when the grid is
/// small, too few to hide the latency of loads and barriers. Measured on an H200 (`mucc tune`,
/// docs/benchmarks.md), grids under 4 blocks per SM: 16 warps made kernels with loops of at most
/// 4 iterations 0.59–0.97× the time (attention, nTrans, LoRA; a cluster split of 2 given up);
/// 8 warps made longer loops 0.78–1.02× where the cluster split kept its size (decode
/// 18944×3584, gated MLP, RMSNorm + linear; 16 warps there were up to 1.18× slower) and
/// 1.06–3.19× where it shrank; grids of 4 blocks per SM or more gained nothing (1.01–1.15×).
fn more_warps(tb: &TbGraph, target: &Target) -> Result<(usize, CtaWhy), CtaWhy> {
    if tb.num_blocks() >= 4 * target.typical_sms {
        return Err(CtaWhy::ManyBlocks);
    }
    if tb.forloop_range <= SHORT_LOOP {
        Ok((16, CtaWhy::ShortLoop))
    } else {
        Ok((8, CtaWhy::LongLoop))
    }
}

/// [`plan_kernel`] for CTAs of `threads` threads; for a register-rows body (`rows`), shared
/// memory that the tiles would overflow is no error (the rows keep none of them). `resident`:
/// the blocks per SM to plan for, instead of [`resident_blocks_wanted`]'s.
#[allow(clippy::too_many_arguments)]
fn plan_kernel_with(
    g: &KernelGraph,
    k: usize,
    tb: &TbGraph,
    fusion: FusionPlan,
    kl: &KernelLayout,
    dt: &[DTensorGeometry],
    opts: &Options,
    threads: usize,
    source: CtaSource,
    rows: bool,
    resident: Option<usize>,
) -> Result<KernelPlan, PlanError> {
    let target = &opts.target;
    let hopper = opts.path.hopper(target);
    let op = &g.ops[Handle::from_index(k)];
    let (ins, outs) = (side(g, dt, &op.inputs), side(g, dt, &op.outputs));
    let mut ops = plan_ops(tb, threads, &fusion, kl, &ins, &outs, target);
    let (pipes, sched) = plan_pipes(tb, &fusion, &mut ops, threads, opts.register_pipes);
    // The output accumulators of key splits, whose write-back holds a slice per warp.
    let key_splits: BTreeMap<usize, usize> = pipes
        .iter()
        .filter_map(PipeDecision::on)
        .filter(|p| p.keys > 1)
        .filter_map(|p| Some((p.online.as_ref()?.out_acc.index(), p.keys)))
        .collect();
    let mut tiles = plan_tiles(tb, &fusion, kl, &ops, target);
    // A piped tile never reaches shared memory.
    for p in pipes.iter().filter_map(PipeDecision::on) {
        for t in p.tiles() {
            tiles[t] = None;
        }
    }
    demote_copies(tb, &tiles, &mut ops);
    // The consumers of key splits load B for their warp's share of K.
    let k_splits: BTreeMap<usize, usize> = pipes
        .iter()
        .filter_map(PipeDecision::on)
        .filter(|p| p.keys > 1)
        .map(|p| (p.matmul.index(), p.keys))
        .collect();
    plan_operand_loads(tb, &tiles, &mut ops, target, &k_splits);
    let columns = if hopper && opts.wgmma {
        plan_atom_columns(tb, &fusion, &ops, &pipes, &mut tiles)
    } else {
        Vec::new()
    };
    let mut tma = if hopper {
        plan_tma(tb, &ops, &tiles, &ins, opts.tma)
    } else {
        TmaPlan::default()
    };
    // A tile in atom columns that TMA does not load goes back to its rows (wgmma reads only
    // TMA-loaded tiles), and the loads are planned again.
    let unloaded: Vec<_> = columns
        .into_iter()
        .filter(|(t, _)| tma.loads.iter().all(|l| l.tile != *t))
        .collect();
    if !unloaded.is_empty() {
        for (t, rows) in unloaded {
            tiles[t] = Some(rows);
        }
        tma = plan_tma(tb, &ops, &tiles, &ins, opts.tma);
    }
    pad_slots(&tma, &mut tiles);
    pad_ring_slots(tb, &ops, &mut tiles, target);
    let piped = pipes.iter().any(|p| p.on().is_some());
    let mut resident_blocks = opts
        .resident_blocks
        .or(resident)
        .unwrap_or_else(|| resident_blocks_wanted(tb, threads, target, piped));
    // A register pipe's kernel issues its matmuls and softmax back to back (issue-bound): a ring
    // deeper than [`PIPED_MAX_STAGES`] only takes shared memory another block could use
    // (measured on the Hopper path). A depth asked for (`--max-stages`) replaces this cap.
    let mut ring_target = *target;
    if piped && hopper && opts.max_stages.is_none() {
        ring_target.max_pipeline_stages = ring_target.max_pipeline_stages.min(PIPED_MAX_STAGES);
    }
    // A small grid's kernel (whose loop a cluster may split) gets the fewest stages that keep
    // [`RING_BYTES_AHEAD`] in flight ahead of the stage being read; a deeper ring only takes
    // shared memory that more CTAs per SM, or a larger cluster, could use.
    // Grids of at most three quarters of the SMs: a cluster may split their loops.
    let small_grid = hopper && opts.cluster_split && tb.num_blocks() * 4 <= target.typical_sms * 3;
    if small_grid && !piped && opts.max_stages.is_none() {
        let stage_bytes: usize = ring_inputs(tb, &ops, target)
            .into_iter()
            .flat_map(|op| &tb.ops[Handle::from_index(op)].outputs)
            .filter_map(|t| tiles[t.index()].as_ref().map(|g| g.bytes))
            .sum();
        if stage_bytes > 0 {
            let depth = RING_BYTES_AHEAD.div_ceil(stage_bytes) + 1;
            ring_target.max_pipeline_stages = ring_target.max_pipeline_stages.min(depth.max(2));
        }
    }
    // The pipeline may be planned again for more resident CTAs (below): keep what it changes.
    let (ops_before, tma_before) = (ops.clone(), tma.clone());
    let mut smem = match plan_pipeline(
        tb,
        &fusion,
        &sched,
        &mut ops,
        &tiles,
        &mut tma,
        resident_blocks,
        &ring_target,
        &key_splits,
    ) {
        Err(s) if rows => Ok(s),
        planned => planned,
    }
    .map_err(|s| PlanError::SharedMemory {
        kernel: k,
        needed: s.total,
        limit: target.smem_per_block,
        lower_bound: s.packing.lower_bound + s.base,
        arch: target.arch.to_string(),
    })?;
    let mut chains = plan_chains(tb, &fusion, kl, &ops, &ins, &outs);
    plan_vectors(tb, &mut chains, &fusion, &ops, &tiles, threads, &outs);
    // (Its `approx_exp` needs no change: the fragment is packed into the tile's type, which
    // `plan_chains` already takes as the store's.)
    for p in pipes.iter().filter_map(PipeDecision::on) {
        chains[p.producer].matmul = Some(MatmulLowering::Pipe);
        if let Some(o) = &p.online {
            // The consumer's product goes straight into the rescaled accumulator's fragment;
            // the exponentials are the pipe's own (`Mma::online_pack`), not chain members.
            let c2 = fusion.chain_of[p.matmul.index()];
            chains[c2].matmul = Some(MatmulLowering::IntoFragment);
            chains[c2].sink = super::plan::Sink::Accum(o.out_acc);
            for op in [o.sub, o.rescale] {
                chains[fusion.chain_of[op.index()]].approx_exp = None;
            }
        }
    }
    // An accumulator in shared memory keeps its state there anyway; one in registers makes a
    // round trip (write-back, then its reader loads it) that a direct store would avoid.
    let unfused = crate::graph::fusion::unfused(tb, &fusion)
        .into_iter()
        .filter(|u| u.reason != NotFused::Accumulator || accum_in_registers(&ops, u.producer))
        .collect();
    let base = SplitBase {
        tb,
        threads,
        fusion: &fusion,
        sched: &sched,
        tiles: &tiles,
        target,
        pipes: &pipes,
    };
    let mut split = if hopper && opts.cluster_split {
        plan_split(&base.with(&ops, &smem, opts.resident_blocks))
    } else if hopper {
        Split::Off(SplitOff::TurnedOff)
    } else {
        Split::Off(SplitOff::Ampere)
    };
    // An asked count (`--resident-blocks`) is kept.
    if small_grid && opts.resident_blocks.is_none() {
        // A ring deep enough to keep one CTA per SM can cap the cluster (its CTAs must all be
        // resident at once): a shallower ring that fits more CTAs per SM may let more SMs
        // stream the loop. Take it when the split then launches more CTAs, for grids that
        // leave a quarter of the SMs idle or more. Measured on an H200 (docs/benchmarks.md):
        // decode graphs of 32 and 56 blocks 0.36–0.70× the time, rmsnorm_bs8 (96 blocks)
        // 0.80×; grids of 128 blocks mostly slower (gated_mlp 1.23×, mqa_bs1 up to 1.45×;
        // rmsnorm_bs8 g3 gained, 0.84×: a tuning variant could take such cases).
        let ctas = |s: &Split| s.cluster().map_or(1, |c| c.ctas);
        for r in resident_blocks + 1..=SPLIT_MAX_RESIDENT {
            let (mut ops_r, mut tma_r) = (ops_before.clone(), tma_before.clone());
            let Ok(smem_r) = plan_pipeline(
                tb,
                &fusion,
                &sched,
                &mut ops_r,
                &tiles,
                &mut tma_r,
                r,
                &ring_target,
                &key_splits,
            ) else {
                break;
            };
            let split_r = plan_split(&base.with(&ops_r, &smem_r, None));
            if ctas(&split_r) > ctas(&split) {
                (ops, tma, smem, split, resident_blocks) = (ops_r, tma_r, smem_r, split_r, r);
            }
        }
    }
    // A grid split asked for replaces the cluster split where its rules hold; by the planner's
    // rule, the Ampere path splits small grids. Either says why a kernel has none.
    let split_asked = matches!(opts.grid_split, GridSplitChoice::Ctas(_));
    let grid_ctas = match opts.grid_split {
        GridSplitChoice::Ctas(n) => Some(Ok(n)),
        GridSplitChoice::Auto if !hopper => Some(auto_grid_split(tb, target)),
        _ => None,
    };
    let grid_split = grid_ctas.map(|n| {
        n.and_then(|n| {
            plan_grid_split(
                &base.with(&ops, &smem, opts.resident_blocks),
                n,
                split_asked,
            )
        })
    });
    let grid_split_off = match grid_split {
        Some(Ok(g)) => {
            split = Split::Grid(g);
            None
        }
        Some(Err(why)) => Some(NoGridSplit {
            asked: split_asked,
            why,
        }),
        None => None,
    };
    // The resident blocks wanted, as far as shared memory holds them, promised to ptxas so
    // that it keeps registers for them too: without the promise, mqa_bs8 g3's piped kernel
    // took 169 registers on the GPU's NVRTC and fit two blocks per SM instead of the three
    // planned (ncu, H100); with it ptxas stays at 164. Three blocks of 4 warps cap a thread at
    // 168 registers; one or two blocks of up to 4 warps leave the limit at 255.
    let smem_fit = blocks_by_smem(target, smem.total);
    let mut min_blocks_per_sm = resident_blocks.min(smem_fit).max(1);
    if let Split::Cluster(c) = &mut split {
        c.gather = plan_gather(tb, c, &mut smem, &tiles, target, opts.cluster_push);
    }
    let counted = match &split {
        Split::Cluster(c) => Some((
            c.resident_per_sm,
            c.iters,
            // The slots took the room of some of the CTAs counted on.
            c.gather.push().is_some_and(|p| p.resident_before.is_some()),
        )),
        Split::Grid(g) => Some((g.resident_per_sm, g.iters, false)),
        Split::Off(_) => None,
    };
    if let Some((resident, iters, pushed_out)) = counted {
        // The CTAs per SM the split counted on, promised to ptxas (it keeps registers for them).
        min_blocks_per_sm = resident;
        resident_blocks = if pushed_out {
            resident
        } else {
            resident_blocks.max(resident)
        };
        // A CTA's share of the loop bounds its ring (the slots stay allocated).
        for p in &mut ops {
            if let OpPlan::Input { stages, .. } = p {
                *stages = (*stages).min(iters);
            }
        }
    }
    plan_waited_copies(tb, &mut ops, &fusion, &sched, threads, target);
    let no_wgmma = if hopper {
        plan_wgmma(tb, &mut ops, &tiles, &fusion, &chains, opts.wgmma)
    } else {
        Vec::new()
    };
    plan_walks(tb, &mut ops, &tiles);
    let write_backs = plan_write_backs(tb, &ops, &smem, &pipes);
    let copy_waits = plan_copy_waits(&fusion, &ops, &sched);
    let mut barriers = plan_body_barriers(tb, &ops, &smem, &sched, &write_backs);
    barriers.after_rescaled_folds = split.cluster().and_then(after_rescaled_folds);
    barriers.before_push = match &split {
        Split::Cluster(c) => matches!(c.gather, Gather::Push(_)),
        Split::Grid(_) => true,
        Split::Off(_) => false,
    };
    let regions = plan_regions(g, op, tb, dt, &tma);
    let uniform_warp = ops.iter().any(|o| {
        matches!(
            o,
            OpPlan::Matmul {
                instr: MatmulInstr::WgmmaM64K16 { .. },
                ..
            }
        )
    });
    let loop_indices = plan_loop_indices(&ops, &pipes);
    let mut kp = KernelPlan {
        barriers,
        ring_start: RingStart::NoRing,
        regions,
        split,
        tma,
        // Decided over the whole graph (`sched::plan_dependent_launches`).
        dependent: DependentLaunch::Off(super::plan::PlainLaunch::NotPlanned),
        triggers_next: false,
        l2_prefetch: None,
        path: CodePath::Sm80,
        cta: Cta {
            grid: tb.grid,
            block: [threads, 1, 1],
            threads,
            source,
            // At least one block per SM (without the minimum ptxas sometimes capped a kernel
            // at 32 registers and spilled): the resident blocks budgeted, or for a split
            // kernel the CTAs per SM its cluster size was chosen for.
            min_blocks_per_sm,
            resident_blocks,
            resident_asked: opts.resident_blocks.is_some(),
        },
        fusion,
        chains,
        schedule: sched,
        ops,
        tiles,
        smem,
        unfused,
        pipes,
        no_wgmma,
        exchange: None,
        cluster_combine: None,
        last_block_combine: None,
        grid_split_off,
        body: super::plan::Body::Tiles(super::rows::RowsOff::NotPlanned),
        uniform_warp,
        loop_indices,
        write_backs,
        copy_waits,
    };
    kp.ring_start = plan_ring_start(tb, &kp);
    Ok(kp)
}

/// Where the ring's prologue is issued ([`RingStart`]): ahead of the pre-loop steps where the
/// kernel has some, the ring loads by TMA (one thread hands the stage to the copy engine and
/// the threads' own pre-loop loads go out at once), and no tile that dies before the loop
/// shares memory with the ring's slots (tiles alive in the loop never do: the packing keeps
/// live buffers apart). Measured on an H100 (docs/benchmarks.md): the split attention kernels,
/// whose Q load otherwise delays every CTA's first stage by a load's latency, 0.93–0.99× the
/// time on the Hopper path; rings of `cp.async` copies only (the Ampere path) 0.99–1.07×.
pub(super) fn plan_ring_start(tb: &TbGraph, kp: &KernelPlan) -> RingStart {
    let Some(ring) = kp.ring() else {
        return RingStart::NoRing;
    };
    if !kp
        .schedule
        .phase(Phase::PreLoop)
        .iter()
        .any(|s| matches!(s, Step::Run(_)))
    {
        return RingStart::AtLoop;
    }
    if ring.tma.is_empty() {
        return RingStart::CpAsyncOnly;
    }
    let smem = &kp.smem;
    let slots = kp.ring_slots(tb);
    for &b in &slots {
        let (born, at) = (smem.buffers[b].start, smem.bytes(b));
        for (c, buf) in smem.buffers.iter().enumerate() {
            let other = smem.bytes(c);
            if !slots.contains(&c)
                && buf.end <= born
                && other.start < at.end
                && at.start < other.end
            {
                return RingStart::AfterPreLoop {
                    tile: smem.kinds[c].tile(),
                };
            }
        }
    }
    RingStart::BeforePreLoop
}

/// Re-plans in atom columns ([`super::ops::in_atom_columns`]) the B tile of each register
/// pipe's producer that `wgmma` can read in that form and not otherwise (N a multiple of 64
/// above 64: attention's K tile of 128 keys): A by `ldmatrix`, B filled by a pipelined
/// chunked input and read by this matmul only. Returns (tile, its geometry before), so that
/// the caller can restore a tile TMA then does not load.
fn plan_atom_columns(
    tb: &TbGraph,
    fusion: &FusionPlan,
    ops: &[OpPlan],
    pipes: &[PipeDecision],
    tiles: &mut [Option<TileGeometry>],
) -> Vec<(usize, TileGeometry)> {
    let mut changed = Vec::new();
    for p in pipes.iter().filter_map(PipeDecision::on) {
        let mm = fusion.chains[p.producer].leader();
        let top = &tb.ops[mm];
        let OpPlan::Matmul {
            warps,
            loads,
            instr: MatmulInstr::MmaSyncM16N8K16 { .. },
            ..
        } = &ops[mm.index()]
        else {
            continue;
        };
        let (a, b) = (top.inputs[0], top.inputs[1]);
        let from_ring = tb
            .producer(b)
            .is_some_and(|h| chunked_loop_input(tb, ops, h));
        let readers = tb.ops.iter().filter(|(_, o)| o.inputs.contains(&b)).count();
        if loads.0 != OperandLoad::Ldmatrix || !from_ring || readers != 1 {
            continue;
        }
        let Some(rows) = tiles[b.index()].as_ref() else {
            continue;
        };
        let shape = tb.tensors[b].shape;
        let Some(cols) = super::ops::in_atom_columns(&shape, rows) else {
            continue;
        };
        let sa = &tb.tensors[a].shape;
        let mnk = (
            sa.dim(sa.rank() - 2),
            shape.dim(shape.rank() - 1),
            sa.dim(sa.rank() - 1),
        );
        if super::ops::wgmma_b(mnk, *warps, &cols, true, loads.0).is_none() {
            changed.push((b.index(), rows.clone()));
            tiles[b.index()] = Some(cols);
        }
    }
    changed
}

/// Runs tensor-core matmuls as `wgmma` where [`super::ops::wgmma_b`] allows (`allowed`: the
/// options'): the consumer of a register pipe (A from the producer's registers) and its
/// producer (A by `ldmatrix`); returns, per tensor-core matmul that keeps `mma.sync`, why.
fn plan_wgmma(
    tb: &TbGraph,
    ops: &mut [OpPlan],
    tiles: &[Option<TileGeometry>],
    fusion: &FusionPlan,
    chains: &[ChainPlan],
    allowed: bool,
) -> Vec<(usize, WgmmaOff)> {
    let mut off = Vec::new();
    for (c, chain) in fusion.chains.iter().enumerate() {
        let mm = chain.leader();
        let top = &tb.ops[mm];
        if !matches!(top.kind, TbOpKind::Matmul) {
            continue;
        }
        let (a, b) = (top.inputs[0], top.inputs[1]);
        let (sa, sb) = (&tb.tensors[a].shape, &tb.tensors[b].shape);
        let r = sa.rank();
        let mnk = (sa.dim(r - 2), sb.dim(r - 1), sa.dim(r - 1));
        // B's tile comes from an input operator: TMA-loaded tiles sit on 1024-byte slots.
        let b_by_tma = tb.producer(b).is_some_and(|h| {
            matches!(
                ops[h.index()],
                OpPlan::Input {
                    engine: CopyEngine::Tma,
                    ..
                }
            )
        });
        let OpPlan::Matmul {
            warps,
            instr,
            loads,
            mma_per_warp,
            load_instrs,
            ..
        } = &mut ops[mm.index()]
        else {
            continue;
        };
        let MatmulInstr::MmaSyncM16N8K16 { dtype } = *instr else {
            continue;
        };
        // `Mma::run`'s warpgroup path serves every fragment lowering alike, but only a pipe's
        // producer has run it on a GPU: no corpus, builder or generated graph has a matmul
        // into or through to a register accumulator that wgmma could take (`warp_grid` gives
        // such matmuls warps along N, or their fragment exceeds the register budget and they
        // go slice by slice), so those keep mma.sync until a GPU round checks one.
        let lowering = chains[c].matmul;
        let to_accumulator = matches!(
            lowering,
            Some(MatmulLowering::IntoFragment | MatmulLowering::ThroughMembers)
        );
        let why = if !allowed {
            Some(WgmmaOff::TurnedOff)
        } else if loads.0 != OperandLoad::Fragment
            && lowering != Some(MatmulLowering::Pipe)
            && !to_accumulator
        {
            Some(WgmmaOff::SliceBySlice)
        } else if !matches!(loads.0, OperandLoad::Fragment | OperandLoad::Ldmatrix) {
            Some(WgmmaOff::ALoad)
        } else {
            match tiles[b.index()].as_ref() {
                Some(gb) => super::ops::wgmma_b(mnk, *warps, gb, b_by_tma, loads.0),
                None => Some(WgmmaOff::BNotInSharedMemory),
            }
            .or_else(|| {
                (loads.0 != OperandLoad::Fragment && to_accumulator)
                    .then_some(WgmmaOff::AccumulatorUnchecked)
            })
        };
        match why {
            Some(w) => off.push((mm.index(), w)),
            None => {
                // One m64n64k16 per atom column of B (one column when N is 64).
                *instr = MatmulInstr::WgmmaM64K16 { dtype, n: 64 };
                loads.1 = OperandLoad::WgmmaDescriptor;
                // A warp takes part in one instruction per m-tile of its own, k-step and column.
                *mma_per_warp =
                    mnk.0.div_ceil(16 * warps.0) * mnk.2.div_ceil(16) * mnk.1.div_ceil(64);
                *load_instrs = super::ops::operand_load_count(mnk, *warps, *loads);
            }
        }
    }
    off.sort_unstable_by_key(|&(op, _)| op);
    off
}

/// Where each block's region starts for the inputs copied by threads or `cp.async` (a block
/// index steps by the block's extent along the mapped dim: the tensor's extent over the grid)
/// and for the outputs (by the tile's extent), in elements of the device tensor.
fn plan_regions(
    g: &KernelGraph,
    op: &crate::graph::kernel::KnOp,
    tb: &TbGraph,
    dt: &[DTensorGeometry],
    tma: &TmaPlan,
) -> Vec<Option<BlockRegion>> {
    let steps = |map: crate::graph::ops::DimMap,
                 strides: &[usize],
                 extent: &dyn Fn(usize, usize) -> usize| {
        BlockRegion {
            steps: (0..3)
                .filter_map(|a| {
                    let d = map.axis(a).filter(|_| tb.grid[a] > 1)?;
                    Some((a, extent(a, d) * strides[d]))
                })
                .collect(),
            per_iter: 0,
        }
    };
    tb.ops
        .iter()
        .map(|(h, top)| match &top.kind {
            TbOpKind::Input { .. } if tma.load_of(h.index()).is_some() => None,
            TbOpKind::Input {
                input,
                imap,
                forloop_dim,
            } => {
                let t = op.inputs[*input];
                let shape = g.tensors[t].shape;
                let strides = &dt[t.index()].strides.0;
                // The first grid axis that maps to the dim sets the block's extent.
                let extent = |_: usize, d: usize| {
                    let a = (0..3)
                        .find(|&a| tb.grid[a] > 1 && imap.axis(a) == Some(d))
                        .unwrap_or(0);
                    shape.dim(d) / tb.grid[a]
                };
                let tile = tb.tensors[top.outputs[0]].shape;
                Some(BlockRegion {
                    per_iter: forloop_dim.map_or(0, |f| tile.dim(f) * strides[f]),
                    ..steps(*imap, strides, &extent)
                })
            }
            TbOpKind::Output { output, omap } => {
                let s = tb.tensors[top.inputs[0]].shape;
                let t = op.outputs[*output];
                Some(output_region(tb, *omap, &s, &dt[t.index()].strides.0, None))
            }
            _ => None,
        })
        .collect()
}

/// Where a block's region of an output starts: per grid axis the output's map sends to a dim
/// (but `skip`), the tile's extent along that dim times the tensor's stride there.
pub(super) fn output_region(
    tb: &TbGraph,
    omap: crate::graph::ops::DimMap,
    tile: &crate::graph::Shape,
    strides: &[usize],
    skip: Option<usize>,
) -> BlockRegion {
    BlockRegion {
        steps: (0..3)
            .filter(|&a| Some(a) != skip && tb.grid[a] > 1)
            .filter_map(|a| omap.axis(a).map(|d| (a, tile.dim(d) * strides[d])))
            .collect(),
        per_iter: 0,
    }
}

/// The barriers of the kernel body beyond the schedule's (see [`BodyBarriers`]), from the final
/// operator plans (pipeline depths after any cluster split) and shared-memory plan.
/// The fold CTA 0 of a cluster split runs behind a barrier: the first after the rescaled
/// partials (sorted first, [`plan_split`]), which read its max tile; none without them.
fn after_rescaled_folds(c: &ClusterSplit) -> Option<usize> {
    let rescaled = |p: &Partial| matches!(p.combine, Combine::Rescaled { .. });
    let first_plain = c.partials.iter().position(|p| !rescaled(p))?;
    (first_plain > 0).then_some(first_plain)
}

/// How a cluster split's partials reach CTA 0 ([`Gather`]): pushed into slots of CTA 0's
/// shared memory, added after the kernel's tiles (`smem.total` grows by them), unless an
/// online-softmax partial needs the CTAs' maxima first, the option turns pushes off, or the
/// slots leave room for too few CTAs per SM: fewer than the split counted on are taken when its
/// clusters still fit in one wave of them ([`cluster_fits`]; `c.resident_per_sm` becomes that
/// count, and [`PushSlots::resident_before`] says what it was).
///
/// Measured on an H100 (docs/benchmarks.md, "Cluster split"): the pushes and one barrier
/// in place of CTA 0's reads between two barriers took decode m8 11008×2048 from 22.0–22.5 µs
/// to 20.4, m8 3584×4608 from 16.2–16.4 to 15.1 and m1 11008×2048 from 18.5 to 17.6.
fn plan_gather(
    tb: &TbGraph,
    c: &mut ClusterSplit,
    smem: &mut SmemPlan,
    tiles: &[Option<TileGeometry>],
    target: &Target,
    push: bool,
) -> Gather {
    if !push {
        return Gather::Fold(NoPush::TurnedOff);
    }
    if c.partials
        .iter()
        .any(|p| matches!(p.combine, Combine::Rescaled { .. }))
    {
        return Gather::Fold(NoPush::Rescaled);
    }
    let barrier = smem.total.next_multiple_of(16);
    let mut end = barrier + 8;
    let (mut slots, mut strides, mut bytes) = (Vec::new(), Vec::new(), 0);
    for p in &c.partials {
        let b = smem
            .buffer_of(p.tile)
            .expect("a cluster split's partials live in shared memory");
        let buf = &smem.buffers[b];
        let offset = end.next_multiple_of(buf.align.max(16));
        slots.push(offset);
        strides.push(buf.bytes);
        end = offset + (c.ctas - 1) * buf.bytes;
        let elem = tiles[p.tile].as_ref().map_or(4, |g| g.dtype.bytes());
        bytes += (c.ctas - 1) * tb.tensors[Handle::from_index(p.tile)].shape.numel() * elem;
    }
    let needed = end.next_multiple_of(16);
    let per_sm = needed + DRIVER_SMEM_PER_BLOCK + RUNTIME_STATIC_SMEM;
    let room = (target.smem_per_sm / per_sm).min(c.resident_per_sm);
    if needed > target.smem_per_block
        || room == 0
        || !cluster_fits(tb.num_blocks(), c.ctas, room, target)
    {
        return Gather::Fold(NoPush::DoesNotFit {
            needed,
            resident: c.resident_per_sm,
        });
    }
    let resident_before = (room < c.resident_per_sm).then_some(c.resident_per_sm);
    c.resident_per_sm = room;
    let added = needed - smem.total;
    smem.total = needed;
    Gather::Push(PushSlots {
        barrier,
        slots,
        strides,
        bytes,
        added,
        resident_before,
    })
}

/// Whether `blocks` clusters of `ctas` CTAs run in one wave at `resident` CTAs per SM: all of
/// their CTAs must be resident at once, and clusters of 4 or 8 count on [`CLUSTER_PACKING`] of
/// the slots (a cluster fits in one GPC).
fn cluster_fits(blocks: usize, ctas: usize, resident: usize, target: &Target) -> bool {
    let slots = target.typical_sms * resident;
    let usable = if ctas > 2 {
        (slots as f64 * CLUSTER_PACKING) as usize
    } else {
        slots
    };
    blocks * ctas <= usable
}

/// The register accumulators written to shared memory after the loop, in operator order: a
/// key split's output accumulator (its warps combine there), and every other register
/// accumulator that has a buffer (its tile is read after the loop).
fn plan_write_backs(
    tb: &TbGraph,
    ops: &[OpPlan],
    smem: &SmemPlan,
    pipes: &[PipeDecision],
) -> Vec<WriteBack> {
    tb.ops
        .iter()
        .filter(|(_, op)| matches!(op.kind, TbOpKind::Accum(_)))
        .filter_map(|(h, op)| {
            let OpPlan::Accum {
                storage: AccumStorage::Registers { fragment_of, .. },
                ..
            } = &ops[h.index()]
            else {
                return None;
            };
            match super::plan::key_split_of(pipes, h) {
                Some((p, _)) => Some(WriteBack::KeySplit {
                    acc: h.index(),
                    warps: p.keys,
                }),
                None => smem
                    .buffer_of(op.outputs[0].index())
                    .is_some()
                    .then(|| WriteBack::Store {
                        acc: h.index(),
                        fragment_of: fragment_of.map(|m| m.index()),
                    }),
            }
        })
        .collect()
}

/// Where the kernel waits for its `cp.async` copies outside a ring: before the first barrier
/// of the phase after such a copy (the barrier publishes its tile), or at the phase's end.
fn plan_copy_waits(fusion: &FusionPlan, ops: &[OpPlan], sched: &Schedule) -> CopyWaits {
    let waits = |steps: &[Step]| -> Vec<usize> {
        let mut at = Vec::new();
        let mut pending = false;
        for (i, st) in steps.iter().enumerate() {
            match st {
                Step::Run(c) => {
                    pending |= matches!(
                        ops[fusion.chains[*c].leader().index()],
                        OpPlan::Input {
                            engine: CopyEngine::CpAsyncWaited,
                            ..
                        }
                    )
                }
                Step::Barrier(_) if pending => {
                    at.push(i);
                    pending = false;
                }
                Step::Barrier(_) => {}
            }
        }
        if pending {
            at.push(steps.len());
        }
        at
    };
    CopyWaits {
        pre_loop: waits(sched.phase(Phase::PreLoop)),
        body: waits(sched.phase(Phase::Loop)),
        post_loop: waits(sched.phase(Phase::PostLoop)),
    }
}

fn plan_body_barriers(
    tb: &TbGraph,
    ops: &[OpPlan],
    smem: &SmemPlan,
    sched: &Schedule,
    write_backs: &[WriteBack],
) -> BodyBarriers {
    // The initial state: a running max or an accumulator kept in shared memory is filled there.
    let filled = tb
        .ops
        .iter()
        .any(|(h, op)| match (&op.kind, &ops[h.index()]) {
            (TbOpKind::Accum(_), OpPlan::Accum { storage, .. }) => *storage == AccumStorage::Shared,
            (TbOpKind::Accum(_), _)
            | (
                TbOpKind::Reduction {
                    kind: TbReduction::Max,
                    ..
                },
                _,
            ) => true,
            _ => false,
        });
    // A multi-stage ring refills a slot once every thread is done with it: after the body's
    // first barrier, or behind a barrier of its own at the end of a body without one.
    let pipelined = ops
        .iter()
        .any(|p| matches!(p, OpPlan::Input { engine, .. } if engine.pipelined()));
    let stages = ops
        .iter()
        .filter_map(|p| match p {
            OpPlan::Input { stages, .. } => Some(*stages),
            _ => None,
        })
        .max()
        .unwrap_or(1);
    let prefetch = if !pipelined || stages <= 1 {
        Prefetch::None
    } else if sched.body.iter().any(|s| matches!(s, Step::Barrier(_))) {
        Prefetch::AfterFirstBarrier
    } else {
        Prefetch::EndOfBody
    };
    let mut b = BodyBarriers {
        after_initial_state: filled || smem.base > 0,
        prefetch,
        before_write_back: false,
        before_finalize: false,
        after_rescaled_folds: None,
        before_push: false,
    };
    // Register accumulators written back to a shared-memory buffer may share memory with tiles
    // the body reads.
    b.before_write_back = !write_backs.is_empty() && !b.body_ends_with_barrier(sched);
    b.before_finalize = tb.ops.iter().any(|(_, op)| {
        matches!(
            op.kind,
            TbOpKind::Accum(AccumKind::RedLdMean | AccumKind::RedLdRms)
        )
    });
    b
}

/// How the loop body derives its thread indices ([`LoopIndices`]): hoistable where the body
/// keeps few registers across iterations (no register pipe, at most
/// [`HOISTED_ACCUM_REGISTERS`] accumulator registers per thread), recomputed otherwise.
fn plan_loop_indices(ops: &[OpPlan], pipes: &[PipeDecision]) -> LoopIndices {
    if pipes.iter().any(|p| matches!(p, PipeDecision::On(_))) {
        return LoopIndices::Recomputed;
    }
    let accum_registers = ops
        .iter()
        .map(|o| match o {
            OpPlan::Accum {
                storage: AccumStorage::Registers { per_thread, .. },
                ..
            } => *per_thread,
            _ => 0,
        })
        .sum::<usize>();
    if accum_registers <= HOISTED_ACCUM_REGISTERS {
        LoopIndices::Hoisted { accum_registers }
    } else {
        LoopIndices::Recomputed
    }
}

/// CTAs per cluster tried by [`plan_split`], largest first (8 is the portable maximum).
const CLUSTER_SIZES: [usize; 3] = [8, 4, 2];

/// Registers per thread a split kernel keeps at least when its launch bounds promise several
/// resident CTAs per SM (ptxas then caps it at 65536 / (threads × CTAs)); kernels of the corpus
/// use 40–130 without spilling at this cap (the corpus compile check verifies no spills). A
/// smaller budget for kernels with small accumulators (80) let the decode graphs' 8-warp CTAs
/// keep clusters of 8 and was slower where it changed the plan (H200, `mucc bench --warps 4`
/// against `--warps 8`: decode_m1_bf16_11008x2048 19.5 against 24.9 µs, 3584×4608 13.1
/// against 15.4; the 8-warp kernels execute 1.56× the instructions).
const SPLIT_REGS_PER_THREAD: usize = 128;

/// Resident CTAs per SM a split kernel promises at most (unless asked for more).
const SPLIT_MAX_RESIDENT: usize = 4;

/// 32-bit registers of one SM (sm_80 and sm_90a alike).
const REGS_PER_SM: usize = 64 * 1024;

/// Registers per thread ptxas can give `threads`-thread CTAs when `resident` of them share an
/// SM's [`REGS_PER_SM`]: it allocates them in steps of 8 per thread, 255 at most.
fn split_regs_at(threads: usize, resident: usize) -> usize {
    (REGS_PER_SM / (threads.max(1) * resident.max(1)) / 8 * 8).min(255)
}

/// Share of the GPU's CTA slots clusters of 4 or 8 CTAs can fill at once: a cluster must fit in
/// one GPC, so a GPC's leftover slots stay empty (H200, 2 CTAs per SM: 30 clusters of 8 at most,
/// ncu "Max Active Clusters", i.e. 240 of 264 slots).
const CLUSTER_PACKING: f64 = 0.9;

/// Whether to split the for-loop of `tb` over a cluster, and how. A split pays when the grid
/// leaves SMs idle: each µGraph block becomes a cluster of C CTAs that share its iterations, so
/// C times as many SMs stream its inputs. It needs a loop whose iterations only feed
/// accumulators that combine after the fact (sums, mean and RMS before their division, max),
/// with every read accumulator in shared memory in the compute type; C divides the loop, leaves
/// each CTA two iterations or more (its pipeline gets at most as many stages as iterations),
/// and all CTAs fit on the GPU at once (one wave). `asked` (`--resident-blocks`) replaces the
/// CTAs per SM the split counts on (at most what shared memory and threads allow; the
/// registers per thread follow from it instead of bounding it).
fn plan_split(inputs: &SplitInputs) -> Split {
    let basis = match split_basis(inputs) {
        Ok(b) => b,
        Err(why) => return Split::Off(why),
    };
    let (tb, target) = (inputs.tb, inputs.target);
    let (f, blocks) = (tb.forloop_range, tb.num_blocks());
    let slots = target.typical_sms * basis.resident_per_sm;
    for ctas in CLUSTER_SIZES {
        if f.is_multiple_of(ctas)
            && f / ctas >= 2
            && cluster_fits(blocks, ctas, basis.resident_per_sm, target)
        {
            return Split::Cluster(ClusterSplit {
                ctas,
                iters: f / ctas,
                partials: basis.partials,
                resident_per_sm: basis.resident_per_sm,
                regs_per_thread: basis.regs_per_thread,
                // Decided once the split is final (`plan_gather`).
                gather: Gather::Fold(NoPush::TurnedOff),
            });
        }
    }
    Split::Off(SplitOff::NoClusterFits {
        iterations: f,
        blocks,
        slots,
    })
}

/// What every split of a kernel's loop is planned from and no replanning changes.
#[derive(Clone, Copy)]
struct SplitBase<'a> {
    /// The threadblock graph.
    tb: &'a TbGraph,
    /// Threads per CTA.
    threads: usize,
    /// Its fusion chains.
    fusion: &'a FusionPlan,
    /// Its schedule.
    sched: &'a Schedule,
    /// Tile geometries by tensor index.
    tiles: &'a [Option<TileGeometry>],
    /// The target.
    target: &'a Target,
    /// Register-pipe decisions.
    pipes: &'a [PipeDecision],
}

impl<'a> SplitBase<'a> {
    /// The inputs of a split of the kernel planned with `ops` and `smem`, counting on the CTAs
    /// per SM `asked` (`--resident-blocks`).
    fn with<'b>(
        self,
        ops: &'b [OpPlan],
        smem: &'b SmemPlan,
        asked: Option<usize>,
    ) -> SplitInputs<'b>
    where
        'a: 'b,
    {
        let SplitBase {
            tb,
            threads,
            fusion,
            sched,
            tiles,
            target,
            pipes,
        } = self;
        SplitInputs {
            tb,
            threads,
            fusion,
            sched,
            ops,
            tiles,
            smem,
            target,
            pipes,
            asked,
        }
    }
}

/// What a split of a kernel's loop is planned from: the kernel as planned so far.
struct SplitInputs<'a> {
    /// The threadblock graph.
    tb: &'a TbGraph,
    /// Threads per CTA.
    threads: usize,
    /// Its fusion chains.
    fusion: &'a FusionPlan,
    /// Its schedule.
    sched: &'a Schedule,
    /// Per-operator plans.
    ops: &'a [OpPlan],
    /// Tile geometries by tensor index.
    tiles: &'a [Option<TileGeometry>],
    /// The shared-memory plan.
    smem: &'a SmemPlan,
    /// The target.
    target: &'a Target,
    /// Register-pipe decisions.
    pipes: &'a [PipeDecision],
    /// CTAs per SM asked for (`--resident-blocks`).
    asked: Option<usize>,
}

/// What any split of a kernel's loop combines, and the CTAs per SM it counts on.
struct SplitBasis {
    /// The accumulators combined after the loop (rescaled ones first).
    partials: Vec<Partial>,
    /// CTAs per SM (see [`ClusterSplit::resident_per_sm`]).
    resident_per_sm: usize,
    /// Registers per thread at that residency.
    regs_per_thread: usize,
}

/// The rules every split of the loop shares (two iterations or more, a grid that leaves SMs
/// idle, accumulators that combine after the fact: [`split_partials`]) and the residency it
/// counts on: at most [`SPLIT_MAX_RESIDENT`] CTAs per SM at [`SPLIT_REGS_PER_THREAD`]
/// registers, or the `asked` count as far as shared memory and threads allow.
fn split_basis(inputs: &SplitInputs) -> Result<SplitBasis, SplitOff> {
    let SplitInputs {
        tb,
        threads,
        fusion,
        sched,
        ops,
        tiles,
        smem,
        target,
        pipes,
        asked,
    } = *inputs;
    let blocks = tb.num_blocks();
    // An online-softmax register pipe's running max, rescaled sums and max accumulator combine
    // as one: the sums rescaled to the CTAs' largest max, then the max. Only for a split of the
    // keys over the warps (mha_bs1 on an H100: 19.90 µs split, 20.24 not); kernels whose warps
    // own whole rows ran 1.4x slower split (gqa_bs1's 9.1 -> 14.4 µs, mqa_bs1's 11.2 -> 15.8).
    let piped = pipes.iter().filter_map(PipeDecision::on);
    let online = piped
        .clone()
        .filter(|p| p.keys > 1)
        .find_map(|p| p.online.as_ref());
    if tb.forloop_range < 2 {
        return Err(SplitOff::OneIteration);
    }
    if blocks >= target.typical_sms {
        return Err(SplitOff::GridFills {
            blocks,
            sms: target.typical_sms,
        });
    }
    if let Some(p) = piped.clone().find(|p| p.keys == 1 && p.online.is_some()) {
        return Err(SplitOff::OnlineRows {
            max_op: p.online.as_ref().map_or(0, |o| o.max.index()),
        });
    }
    let mut partials = split_partials(tb, fusion, sched, ops, tiles, smem, online)?;
    // Rescaled partials read every CTA's max tile: they combine before it does.
    partials.sort_by_key(|p| !matches!(p.combine, Combine::Rescaled { .. }));
    let by_smem = target.smem_per_sm / (smem.total + DRIVER_SMEM_PER_BLOCK);
    let by_threads = 2048 / threads.max(1);
    let (resident_per_sm, regs_per_thread) = match asked {
        Some(n) => {
            let r = by_smem.min(by_threads).min(n).max(1);
            (r, split_regs_at(threads, r))
        }
        None => {
            let by_regs = REGS_PER_SM / (threads.max(1) * SPLIT_REGS_PER_THREAD);
            let r = by_smem
                .min(by_threads)
                .min(by_regs)
                .clamp(1, SPLIT_MAX_RESIDENT);
            (r, SPLIT_REGS_PER_THREAD)
        }
    };
    Ok(SplitBasis {
        partials,
        resident_per_sm,
        regs_per_thread,
    })
}

/// Iterations a CTA of a grid split the planner's rule makes keeps at least (its ring
/// pipelines them).
const GRID_SPLIT_MIN_ITERS: usize = 4;

/// Most CTAs per block the planner's rule gives a grid split.
const GRID_SPLIT_MAX_CTAS: usize = 16;

/// CTAs per block of the planner's grid split ([`GridSplitChoice::Auto`], the Ampere path: no
/// cluster split there), for a grid that leaves a quarter of the SMs idle or more: the fewest
/// that launch 1.5 CTAs per SM or more, among the divisors of the loop that leave each CTA
/// [`GRID_SPLIT_MIN_ITERS`] iterations or more (at most [`GRID_SPLIT_MAX_CTAS`]); the most of
/// them when none does. Measured on an H100 with `--path ampere --warps 4` (docs/benchmarks.md):
/// the decode linears of 32 blocks 3.4-4.7x faster split over 8 CTAs (over 4 or 16: slower
/// than 8), of 56 and 72 blocks 1.4-1.8x over 4 (over 8: slower than 4).
fn auto_grid_split(tb: &TbGraph, target: &Target) -> Result<usize, GridSplitOff> {
    let (blocks, f, sms) = (tb.num_blocks(), tb.forloop_range, target.typical_sms);
    if blocks * 4 > sms * 3 {
        return Err(GridSplitOff::GridLarge { blocks, sms });
    }
    let candidates: Vec<usize> = (2..=GRID_SPLIT_MAX_CTAS)
        .filter(|&n| f.is_multiple_of(n) && f / n >= GRID_SPLIT_MIN_ITERS)
        .collect();
    candidates
        .iter()
        .copied()
        .find(|&n| 2 * blocks * n >= 3 * sms)
        .or(candidates.last().copied())
        .ok_or(GridSplitOff::NoShares {
            iterations: f,
            max_ctas: GRID_SPLIT_MAX_CTAS,
            min_iters: GRID_SPLIT_MIN_ITERS,
        })
}

/// A grid split of the loop over `ctas` CTAs per block (`--grid-split`, [`GridSplit`]), where
/// the rules every split shares hold ([`split_basis`]), `ctas` divides the loop into shares of
/// two iterations or more, and no partial is rescaled (only CTAs of a cluster see each other's
/// running maxima). Its workspace offsets are placed over the whole graph later.
fn plan_grid_split(
    inputs: &SplitInputs,
    ctas: usize,
    by_option: bool,
) -> Result<GridSplit, GridSplitOff> {
    let (tb, tiles) = (inputs.tb, inputs.tiles);
    let f = tb.forloop_range;
    let basis = split_basis(inputs).map_err(GridSplitOff::Split)?;
    if ctas < 2 || !f.is_multiple_of(ctas) || f / ctas < 2 {
        return Err(GridSplitOff::NotDividing {
            iterations: f,
            ctas,
        });
    }
    if let Some(p) = basis
        .partials
        .iter()
        .find(|p| matches!(p.combine, Combine::Rescaled { .. }))
    {
        return Err(GridSplitOff::Rescaled {
            op: p.accum.index(),
        });
    }
    let mut slot_elems = Vec::new();
    let mut elem_bytes = Vec::new();
    let mut slot_offsets = Vec::new();
    let blocks = tb.num_blocks();
    let mut at = 0;
    for p in &basis.partials {
        let t = Handle::from_index(p.tile);
        let n = tb.tensors[t].shape.numel();
        let b = tiles[p.tile].as_ref().map_or(4, |g| g.dtype.bytes());
        slot_offsets.push(at);
        slot_elems.push(n);
        elem_bytes.push(b);
        at = (at + blocks * ctas * n * b).next_multiple_of(16);
    }
    Ok(GridSplit {
        ctas,
        asked: by_option,
        iters: f / ctas,
        partials: basis.partials,
        resident_per_sm: basis.resident_per_sm,
        regs_per_thread: basis.regs_per_thread,
        blocks,
        slot_elems,
        elem_bytes,
        slot_offsets,
        // Placed over the whole graph (`sched::place_grid_split_slots`).
        slots_at: 0,
        counters_at: 0,
    })
}

/// The accumulators the CTAs of a split loop combine after it (in operator order), or why the
/// loop cannot be split: `online` is the online-softmax pipe whose rescaled partials combine.
fn split_partials(
    tb: &TbGraph,
    fusion: &FusionPlan,
    sched: &Schedule,
    ops: &[OpPlan],
    tiles: &[Option<TileGeometry>],
    smem: &SmemPlan,
    online: Option<&super::plan::OnlinePipe>,
) -> Result<Vec<Partial>, SplitOff> {
    let mut partials = Vec::new();
    for (h, op) in tb.ops.iter() {
        let name = op.kind.name();
        match (&op.kind, &ops[h.index()]) {
            (
                TbOpKind::Reduction {
                    kind: TbReduction::Max,
                    ..
                },
                OpPlan::RunningMax,
            ) if online.is_none_or(|o| o.max != h) => {
                return Err(SplitOff::RunningMax {
                    op: h.index(),
                    kind: name,
                });
            }
            (TbOpKind::Output { .. }, _)
                if sched.phase[fusion.chain_of[h.index()]] == Phase::Loop =>
            {
                return Err(SplitOff::StoresInLoop {
                    op: h.index(),
                    kind: name,
                });
            }
            (TbOpKind::Accum(kind), _) => {
                let combine = match kind {
                    AccumKind::Nored
                    | AccumKind::RedLdSum
                    | AccumKind::RedLdMean
                    | AccumKind::RedLdRms
                    | AccumKind::RedtoxLdSum => Combine::Sum,
                    AccumKind::Max => Combine::Max,
                    AccumKind::NoredRescale | AccumKind::RedLdSumRescale => match online {
                        Some(o) if h == o.out_acc || h == o.sum_acc => {
                            let max_tile = tb.ops[o.max_acc].outputs[0].index();
                            if smem.buffer_of(max_tile).is_none() {
                                return Err(SplitOff::RescaleMaxNotKept {
                                    op: h.index(),
                                    kind: name,
                                });
                            }
                            Combine::Rescaled { max_tile }
                        }
                        _ => {
                            return Err(SplitOff::Rescales {
                                op: h.index(),
                                kind: name,
                            });
                        }
                    },
                };
                let tile = op.outputs[0].index();
                if smem.buffer_of(tile).is_none() {
                    // Nothing reads it: nothing to combine.
                    continue;
                }
                let dtype = tiles[tile].as_ref().map(|g| g.dtype);
                if !matches!(dtype, Some(DType::F32 | DType::F64)) {
                    return Err(SplitOff::NarrowPartial {
                        op: h.index(),
                        kind: name,
                        dtype,
                    });
                }
                partials.push(Partial {
                    accum: h,
                    tile,
                    combine,
                });
            }
            _ => {}
        }
    }
    if partials.is_empty() {
        return Err(SplitOff::NothingToCombine);
    }
    Ok(partials)
}

/// Geometry of every tile that lives in shared memory, with the chunk sizes its accesses need:
/// the copy's chunk at chunked-copy endpoints, 16 bytes at matmul operands and results.
fn plan_tiles(
    tb: &TbGraph,
    fusion: &FusionPlan,
    kl: &KernelLayout,
    ops: &[OpPlan],
    target: &Target,
) -> Vec<Option<TileGeometry>> {
    let materialized = fusion.materialized(tb);
    let mut min_chunk = vec![0usize; tb.tensors.len()];
    for (h, op) in tb.ops.iter() {
        match (&op.kind, &ops[h.index()]) {
            (
                TbOpKind::Input { .. },
                OpPlan::Input {
                    copy: Copy::Chunked { bytes, .. },
                    ..
                },
            ) => {
                let m = &mut min_chunk[op.outputs[0].index()];
                *m = (*m).max(*bytes);
            }
            (
                TbOpKind::Output { .. },
                OpPlan::Output {
                    copy: Some(Copy::Chunked { bytes, .. }),
                },
            ) => {
                let m = &mut min_chunk[op.inputs[0].index()];
                *m = (*m).max(*bytes);
            }
            (TbOpKind::Matmul, _) => {
                for &t in &op.inputs {
                    min_chunk[t.index()] = target.max_copy_bytes;
                }
                let tail = fusion.chain(h).tail();
                if let Some(&c) = tb.ops[tail].outputs.first() {
                    min_chunk[c.index()] = target.max_copy_bytes;
                }
            }
            _ => {}
        }
    }
    let stored = tile_dtypes(tb);
    tb.tensors
        .iter()
        .map(|(h, s)| {
            if !materialized[h.index()] {
                return None;
            }
            let l = kl.tiles[h.index()].unwrap_or(TileLayout {
                innermost: s.shape.rank() - 1,
                swizzled: None,
            });
            let dtype = stored[h.index()];
            Some(plan_tile(
                &s.shape,
                dtype,
                l,
                min_chunk[h.index()].max(dtype.bytes()),
                target,
            ))
        })
        .collect()
}

/// Widest chunk a converting copy reads from its tile: one 16-byte vector load (every tile
/// starts on 16 bytes).
pub const MAX_TILE_CHUNK_BYTES: usize = 16;

/// Chunked copies the tiles cannot serve become element copies: a chunked copy needs the
/// tile's swizzle to keep its chunks whole. An output of a tile stored wider than its tensor
/// (fp32 accumulator values) converts each chunk in registers between one vector load from the
/// tile and one vector store: its chunks are narrowed so that a chunk takes at most
/// [`MAX_TILE_CHUNK_BYTES`] of the tile (`tile_bytes`), aligned to its size in an unswizzled
/// tile and kept whole by a swizzled one.
fn demote_copies(tb: &TbGraph, tiles: &[Option<TileGeometry>], ops: &mut [OpPlan]) {
    let stored = tile_dtypes(tb);
    for (h, op) in tb.ops.iter() {
        let TbOpKind::Output { .. } = op.kind else {
            continue;
        };
        let OpPlan::Output {
            copy: Some(copy @ Copy::Chunked { .. }),
        } = &mut ops[h.index()]
        else {
            continue;
        };
        let Copy::Chunked {
            dim, chunk_elems, ..
        } = *copy
        else {
            continue;
        };
        let t = op.inputs[0];
        let (wide, narrow) = (stored[t.index()], tb.tensors[t].dtype);
        if wide == narrow {
            continue;
        }
        let Some(g) = &tiles[t.index()] else {
            continue;
        };
        // The widest power-of-two chunk (bytes in the tile) that its rows keep whole and aligned.
        // An unswizzled tile's `chunk_bytes` was planned for accesses of its own type, not for
        // a chunk of the tensor's elements widened to it, so its strides are checked here
        // (taking `chunk_bytes` alone would chunk 180 more files, none checked on a GPU).
        let shape = tb.tensors[t].shape;
        let whole = |c: usize| {
            let elems = c / wide.bytes();
            match g.swizzle {
                Swizzle::None => {
                    (0..shape.rank()).all(|d| {
                        shape.dim(d) == 1
                            || d == g.layout.innermost
                            || g.strides.0[d].is_multiple_of(elems)
                    }) && shape.dim(g.layout.innermost).is_multiple_of(elems)
                        && g.strides.0[g.layout.innermost] == 1
                }
                _ => c <= g.chunk_bytes,
            }
        };
        let fits = (1..=chunk_elems)
            .rev()
            .filter(|e| e.is_power_of_two() && *e >= 2)
            .map(|e| e * wide.bytes())
            .find(|&c| c <= MAX_TILE_CHUNK_BYTES && whole(c));
        match fits {
            Some(c) => {
                let e = c / wide.bytes();
                *copy = Copy::Chunked {
                    dim,
                    chunk_elems: e,
                    bytes: e * narrow.bytes(),
                    tile_bytes: c,
                };
            }
            None => {
                *copy = Copy::Elementwise {
                    reason: super::ops::ChunkOff::WideValues { dtype: wide },
                };
            }
        }
    }
    for (h, op) in tb.ops.iter() {
        let tile = match &op.kind {
            TbOpKind::Input { .. } => op.outputs[0],
            TbOpKind::Output { .. } => op.inputs[0],
            _ => continue,
        };
        let chunk = tiles[tile.index()].as_ref().map_or(0, |g| g.chunk_bytes);
        let reason = super::ops::ChunkOff::Swizzle { kept: chunk };
        match &mut ops[h.index()] {
            OpPlan::Input { copy, .. } | OpPlan::Output { copy: Some(copy) }
                if copy.is_chunked() && chunk < copy.tile_chunk_bytes() =>
            {
                *copy = Copy::Elementwise { reason };
            }
            _ => {}
        }
    }
}

/// How the operands of each tensor-core matmul load, from their tiles' geometry.
fn plan_operand_loads(
    tb: &TbGraph,
    tiles: &[Option<TileGeometry>],
    ops: &mut [OpPlan],
    target: &Target,
    k_splits: &BTreeMap<usize, usize>,
) {
    for (h, op) in tb.ops.iter() {
        let OpPlan::Matmul {
            instr,
            loads,
            warps,
            load_instrs,
            ..
        } = &mut ops[h.index()]
        else {
            continue;
        };
        let (a, b) = (op.inputs[0], op.inputs[1]);
        // A piped A operand comes from registers: only B loads from its tile.
        let piped = loads.0 == OperandLoad::Fragment;
        let gb = tiles[b.index()].as_ref();
        let ga = if piped { gb } else { tiles[a.index()].as_ref() };
        if let (true, Some(ga), Some(gb)) = (instr.is_mma(), ga, gb) {
            let (sa, sb) = (&tb.tensors[a].shape, &tb.tensors[b].shape);
            let r = sa.rank();
            let mnk = (sa.dim(r - 2), sb.dim(r - 1), sa.dim(r - 1));
            *loads = operand_loads((mnk.0, mnk.2, mnk.1), ga, gb, target);
            if piped {
                loads.0 = OperandLoad::Fragment;
            }
            let k = mnk
                .2
                .div_ceil(k_splits.get(&h.index()).copied().unwrap_or(1));
            *load_instrs = super::ops::operand_load_count((mnk.0, mnk.1, k), *warps, *loads);
        }
    }
}

/// Every tensor-core matmul's [`super::ops::MatmulWalks`], from its final operand loads and
/// tiles (after the wgmma and atom-column decisions).
fn plan_walks(tb: &TbGraph, ops: &mut [OpPlan], tiles: &[Option<TileGeometry>]) {
    for (h, op) in tb.ops.iter() {
        let OpPlan::Matmul {
            instr,
            loads,
            warps,
            walks,
            ..
        } = &mut ops[h.index()]
        else {
            continue;
        };
        if !instr.is_mma() {
            continue;
        }
        let (a, b) = (op.inputs[0], op.inputs[1]);
        let sb = &tb.tensors[b].shape;
        *walks = super::ops::matmul_walks(
            sb.dim(sb.rank() - 1),
            *warps,
            *loads,
            tiles[a.index()].as_ref(),
            tiles[b.index()].as_ref(),
        );
    }
}

/// Whether operator `h` is an input copied in chunks along the for-loop (what a pipeline ring
/// stages, when the loop has two iterations or more).
fn chunked_loop_input(tb: &TbGraph, ops: &[OpPlan], h: Handle<TbOp>) -> bool {
    matches!(
        tb.ops[h].kind,
        TbOpKind::Input {
            forloop_dim: Some(_),
            ..
        }
    ) && matches!(
        ops[h.index()],
        OpPlan::Input {
            copy: Copy::Chunked { .. },
            ..
        }
    )
}

/// The inputs a pipeline ring may stage (chunked copies along the for-loop, on targets with
/// `cp.async`), as operator indices.
fn ring_inputs(tb: &TbGraph, ops: &[OpPlan], target: &Target) -> Vec<usize> {
    tb.ops
        .iter()
        .filter(|(h, _)| {
            chunked_loop_input(tb, ops, *h) && tb.forloop_range > 1 && target.has_cp_async
        })
        .map(|(h, _)| h.index())
        .collect()
}

/// Pads the tiles a ring may stage to whole shared-memory lines ([`SMEM_LINE`] bytes) when they
/// are a line or more: a ring's stage slots follow each other at the tile's size, and each
/// slot then starts on a line as the first does (the tiles of TMA loads are padded further, by
/// [`pad_slots`]).
fn pad_ring_slots(
    tb: &TbGraph,
    ops: &[OpPlan],
    tiles: &mut [Option<TileGeometry>],
    target: &Target,
) {
    for op in ring_inputs(tb, ops, target) {
        for &t in &tb.ops[Handle::from_index(op)].outputs {
            if let Some(geo) = tiles[t.index()].as_mut()
                && geo.bytes >= SMEM_LINE
            {
                geo.bytes = geo.bytes.next_multiple_of(SMEM_LINE);
                geo.phys_elems = geo.bytes / geo.dtype.bytes();
            }
        }
    }
}

/// Chooses the pipeline depth of the in-loop chunked inputs (with a next iteration to
/// prefetch, on targets with `cp.async`) together with the shared-memory plan: the deepest
/// pipeline that keeps `resident` blocks per SM and still has two stages, else the deepest
/// that fits at all. Sets the inputs' stages and engines (TMA for the loads of `tma`, whose
/// mbarriers it places after the zero page; a load left without a ring moves to `tma.off`).
/// `Err`: the smallest plan, which does not fit.
#[allow(clippy::too_many_arguments)]
fn plan_pipeline(
    tb: &TbGraph,
    fusion: &FusionPlan,
    sched: &super::order::Schedule,
    ops: &mut [OpPlan],
    tiles: &[Option<TileGeometry>],
    tma: &mut TmaPlan,
    resident: usize,
    target: &Target,
    key_splits: &BTreeMap<usize, usize>,
) -> Result<SmemPlan, SmemPlan> {
    let pipelined = ring_inputs(tb, ops, target);
    let has_matmul = tb
        .ops
        .iter()
        .any(|(_, op)| matches!(op.kind, TbOpKind::Matmul));
    let max_stages = if pipelined.is_empty() {
        1
    } else {
        tb.forloop_range.min(target.max_pipeline_stages).max(1)
    };
    // The zero page, then (with TMA loads) one `full` mbarrier per stage.
    let base = if !tma.loads.is_empty() {
        tma.barriers = ZERO_PAGE;
        ZERO_PAGE + (8 * max_stages).next_multiple_of(16)
    } else if has_matmul {
        ZERO_PAGE
    } else {
        0
    };
    let set_stages = |ops: &mut [OpPlan], stages: usize| {
        for &p in &pipelined {
            if let OpPlan::Input {
                stages: s, engine, ..
            } = &mut ops[p]
            {
                *s = stages;
                *engine = match (stages > 1, tma.load_of(p).is_some()) {
                    (false, _) => CopyEngine::Threads,
                    (true, false) => CopyEngine::CpAsync,
                    (true, true) => CopyEngine::Tma,
                };
            }
        }
    };
    // Shared memory for each pipeline depth, deepest first.
    let mut attempts: Vec<(usize, SmemPlan)> = Vec::new();
    for stages in (1..=max_stages).rev() {
        set_stages(ops, stages);
        attempts.push((
            stages,
            smem_plan(
                tb,
                fusion,
                sched,
                ops,
                tiles,
                base,
                target.smem_per_block,
                key_splits,
            ),
        ));
    }
    let occupancy_budget = (target.smem_per_sm / resident)
        .saturating_sub(DRIVER_SMEM_PER_BLOCK + RUNTIME_STATIC_SMEM)
        .min(target.smem_per_block);
    let chosen = attempts
        .iter()
        .position(|(st, p)| p.total <= occupancy_budget && (*st >= 2 || max_stages == 1))
        .or_else(|| {
            attempts
                .iter()
                .position(|(_, p)| p.total <= target.smem_per_block)
        });
    match chosen {
        Some(i) => {
            let (stages, plan) = attempts.swap_remove(i);
            set_stages(ops, stages);
            if stages < 2 {
                for l in tma.loads.drain(..) {
                    tma.off.push((l.op, super::tma::TmaOff::NoRing));
                }
            }
            Ok(plan)
        }
        None => Err(attempts.pop().expect("at least one attempt").1),
    }
}

/// The order in which an element-by-element copy between a tile and a device tensor with
/// `strides` walks the tile's dims (the last the fastest): the device tensor's smallest stride
/// last, so that consecutive threads touch consecutive device addresses (a column-major
/// intermediate copied in row-major order would make every 2-byte access its own 32-byte
/// sector). Dims of extent 1 go first; ties keep the natural order (row-major stays natural).
fn coalescing_order(shape: &Shape, strides: &[usize]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..shape.rank()).collect();
    order.sort_by_key(|&d| (shape.dim(d) > 1, std::cmp::Reverse(strides[d])));
    order
}

/// The walk order of a copy: a chunked copy walks its chunk dim last; an element copy (or an
/// output with no copy of its own) coalesces on the device side.
fn copy_order(copy: Option<&Copy>, shape: &Shape, device_strides: &[usize]) -> Vec<usize> {
    match copy {
        Some(Copy::Chunked { dim, .. }) => {
            let mut o: Vec<usize> = (0..shape.rank()).filter(|d| d != dim).collect();
            o.push(*dim);
            o
        }
        Some(Copy::Elementwise { .. }) | None => coalescing_order(shape, device_strides),
    }
}

/// How each chain runs: its members, its sink and its walk order.
fn plan_chains(
    tb: &TbGraph,
    fusion: &FusionPlan,
    kl: &KernelLayout,
    ops: &[OpPlan],
    ins: &Side,
    outs: &Side,
) -> Vec<ChainPlan> {
    let stored = tile_dtypes(tb);
    fusion
        .chains
        .iter()
        .map(|chain| {
            let lead = chain.leader();
            let lop = &tb.ops[lead];
            let tail = chain.tail();
            let natural = |s: &Shape| (0..s.rank()).collect::<Vec<usize>>();
            // Copies.
            match (&lop.kind, &ops[lead.index()]) {
                (TbOpKind::Input { input, .. }, OpPlan::Input { copy, .. }) => {
                    let s = tb.tensors[lop.outputs[0]].shape;
                    return ChainPlan {
                        members: Vec::new(),
                        sink: Sink::Copy,
                        order: copy_order(Some(copy), &s, &ins[*input].1.0),
                        matmul: None,
                        approx_exp: None,
                        approx_logistic: false,
                        vector: 1,
                        scalar: None,
                        broadcast_reads: Vec::new(),
                    };
                }
                (TbOpKind::Output { output, .. }, OpPlan::Output { copy }) => {
                    let s = tb.tensors[lop.inputs[0]].shape;
                    return ChainPlan {
                        members: Vec::new(),
                        sink: Sink::Copy,
                        order: copy_order(copy.as_ref(), &s, &outs[*output].1.0),
                        matmul: None,
                        approx_exp: None,
                        approx_logistic: false,
                        vector: 1,
                        scalar: None,
                        broadcast_reads: Vec::new(),
                    };
                }
                _ => {}
            }
            let (members, sink) = match &tb.ops[tail].kind {
                TbOpKind::Output { .. } if tail != lead => (
                    chain.ops[1..chain.ops.len() - 1].to_vec(),
                    Sink::Global(tail),
                ),
                TbOpKind::Accum(_) if tail != lead => (
                    chain.ops[1..chain.ops.len() - 1].to_vec(),
                    Sink::Accum(tail),
                ),
                // A lone accumulator accumulates its own input.
                TbOpKind::Accum(_) => (Vec::new(), Sink::Accum(tail)),
                _ => (chain.ops[1..].to_vec(), Sink::Tile(tb.ops[tail].outputs[0])),
            };
            // An accumulator written once takes the chain's values as a tile does.
            let sink = match sink {
                Sink::Accum(a)
                    if matches!(
                        ops[a.index()],
                        OpPlan::Accum {
                            storage: AccumStorage::WrittenOnce,
                            ..
                        }
                    ) =>
                {
                    Sink::Tile(tb.ops[a].outputs[0])
                }
                other => other,
            };
            // The space the leader produces (an accumulator leader: its input's).
            let space = match &lop.kind {
                TbOpKind::Accum(_) => tb.tensors[lop.inputs[0]].shape,
                _ => tb.tensors[lop.outputs[0]].shape,
            };
            let reducing = matches!(sink, Sink::Accum(a)
                if matches!(tb.ops[a].kind, TbOpKind::Accum(k) if k.reduces_last_dim()));
            let order = match &lop.kind {
                TbOpKind::Matmul | TbOpKind::RmsNorm | TbOpKind::Reduction { .. } => {
                    natural(&space)
                }
                // Row sinks and concat need the natural order.
                TbOpKind::Concat { .. } => natural(&space),
                _ if reducing => natural(&space),
                // The planned iteration dim last.
                _ => match kl.iter_dim[lead.index()] {
                    Some(it) => {
                        let mut o: Vec<usize> = (0..space.rank()).filter(|&d| d != it).collect();
                        o.push(it);
                        o
                    }
                    None => natural(&space),
                },
            };
            let matmul = match &ops[lead.index()] {
                OpPlan::Matmul { instr, .. } => {
                    Some(matmul_lowering(tb, ops, *instr, &members, sink))
                }
                _ => None,
            };
            // A 16-bit floating store right after the chain's last exp.
            let rounds_to = match sink {
                Sink::Tile(t) => Some(stored[t.index()]),
                Sink::Global(o) => Some(tb.tensors[tb.ops[o].inputs[0]].dtype),
                _ => None,
            }
            .filter(|&d| is_float16(d));
            let approx_exp = rounds_to
                .filter(|_| last_value_is_exp(tb, &chain.ops, sink))
                .map(ApproxExp::for_store);
            let approx_logistic =
                rounds_to.is_some() && logistic_reaches_store_by_products(tb, &chain.ops, sink);
            ChainPlan {
                members,
                sink,
                order,
                matmul,
                approx_exp,
                approx_logistic,
                vector: 1,
                scalar: None,
                broadcast_reads: Vec::new(),
            }
        })
        .collect()
}

/// Elements per thread step ([`ChainPlan::vector`]) tried, largest first, for chains into
/// tiles.
const VECTOR_WIDTHS: [usize; 2] = [4, 2];

/// The same for chains into device tensors (up to one 16-byte store per step: 8 16-bit
/// elements).
const DEVICE_VECTOR_WIDTHS: [usize; 3] = [8, 4, 2];

/// The same for chains summed by rows into an accumulator (`tb::for_each_row`): the tiles'
/// reads only, up to one 16-byte load per step (8 16-bit elements).
const ROW_VECTOR_WIDTHS: [usize; 3] = [8, 4, 2];

/// Gives element-wise chains (a unary or binary leader, element-wise members, a tile sink) a vector
/// width V ([`ChainPlan::vector`]) where each of a thread's steps is one vector access per
/// tile: V divides the walk's last extent (a step never crosses a row) and leaves every thread
/// a step (elements / V ≥ threads); every tile read or written is contiguous along that dim
/// (stride 1, or broadcast along it: read once per step), its other strides are multiples of V
/// and its slot size a multiple of the vector's bytes (≤ 16), so every step starts aligned;
/// it is unswizzled, padded (a shift), or keeps V-element chunks whole (an XOR swizzle of
/// 2^m-element chunks, m ≥ log2 V). Consecutive threads then take consecutive vectors (no more bank conflicts than
/// scalar accesses). A chain into a device tensor takes up to 16 bytes per step (8 16-bit
/// elements) where the tensor's region is contiguous along the walk's last dim and every step
/// starts aligned (the conditions of a chunked copy: its strides, block offsets and row length
/// are multiples of V; device buffers start 16-byte aligned).
/// A chain whose row sums an accumulator takes (`sum`, `mean` and `rms` accumulators over the
/// last dim, led by an element-wise operator or by the accumulator itself) reads up to 16 bytes
/// per step along its rows, under the same conditions on its tiles, with no bound from the
/// threads (a row's steps are spread over its group of threads).
/// An element-wise chain left scalar gets the reason of the narrowest width
/// ([`ChainPlan::scalar`]).
fn plan_vectors(
    tb: &TbGraph,
    chains: &mut [ChainPlan],
    fusion: &FusionPlan,
    ops: &[OpPlan],
    tiles: &[Option<TileGeometry>],
    threads: usize,
    outs: &Side,
) {
    use super::plan::ScalarSteps;
    use crate::layout::swizzle::Swizzle;
    for (c, cp) in chains.iter_mut().enumerate() {
        let lead = fusion.chains[c].leader();
        let lop = &tb.ops[lead];
        // Row sums (`tb::for_each_row`): a reducing accumulator that is not a strided group's,
        // with a row split of the CTA (a register pipe's warps sum theirs by shuffles).
        let row_sums = match cp.sink {
            Sink::Accum(a) => {
                let summed = matches!(
                    tb.ops[a].kind,
                    TbOpKind::Accum(k) if k.reduces_last_dim() && k != AccumKind::RedtoxLdSum
                );
                if summed && !matches!(ops[a.index()], OpPlan::Accum { rows: Some(_), .. }) {
                    continue;
                }
                summed
            }
            _ => false,
        };
        // A plain max over the last dim (`tb::for_each_row` with the max): its input's rows
        // are read like row sums'.
        let plain_max = matches!(
            lop.kind,
            TbOpKind::Reduction {
                kind: TbReduction::PlainMax,
                dim,
            } if dim + 1 == tb.tensors[lop.inputs[0]].shape.rank()
        ) && matches!(ops[lead.index()], OpPlan::RowReduce(_));
        let row_reads = row_sums || plain_max;
        let space = match lop.kind {
            TbOpKind::Unary(_) | TbOpKind::Binary(_) => tb.tensors[lop.outputs[0]].shape,
            TbOpKind::Reduction { .. } if plain_max => tb.tensors[lop.inputs[0]].shape,
            // Row sums of an accumulator's input, or an accumulator written once (its input
            // stored to its tile).
            TbOpKind::Accum(_) if row_sums || matches!(cp.sink, Sink::Tile(_)) => {
                tb.tensors[lop.inputs[0]].shape
            }
            _ => continue,
        };
        let Some(&last) = cp.order.last() else {
            continue;
        };
        if row_reads && last + 1 != space.rank() {
            continue;
        }
        let mut touched: Vec<usize> = fusion.reads(tb, c).iter().map(|t| t.index()).collect();
        // The device tensor a chain stores to: its region must start every step aligned.
        let mut device = None;
        let widths: &[usize] = match cp.sink {
            _ if row_reads => &ROW_VECTOR_WIDTHS,
            Sink::Tile(t) => {
                touched.push(t.index());
                &VECTOR_WIDTHS
            }
            Sink::Global(o) => {
                let TbOpKind::Output { output, omap } = tb.ops[o].kind else {
                    continue;
                };
                device = Some((
                    &outs[output],
                    omap,
                    tb.tensors[tb.ops[o].inputs[0]].dtype.bytes(),
                ));
                &DEVICE_VECTOR_WIDTHS
            }
            _ => {
                cp.scalar = Some(ScalarSteps::AccumulatorSink);
                continue;
            }
        };
        // Why width `v` does not fit, if it does not.
        let misfit = |v: usize| -> Option<ScalarSteps> {
            if !space.dim(last).is_multiple_of(v) {
                return Some(ScalarSteps::Row {
                    extent: space.dim(last),
                });
            }
            if !row_reads && space.numel() / v < threads {
                return Some(ScalarSteps::FewElements {
                    elements: space.numel(),
                    threads,
                });
            }
            if let Some(((ds, dst, dinner), omap, elem)) = device {
                let bytes = v * elem;
                if bytes > 16 {
                    return Some(ScalarSteps::DeviceUnaligned(
                        super::ops::ChunkOff::WiderThan16 { elements: v },
                    ));
                }
                if let Err(why) = super::ops::chunk_fits(
                    ds, dst, *dinner, &space, last, omap, tb.grid, None, v, bytes,
                ) {
                    return Some(ScalarSteps::DeviceUnaligned(why));
                }
            }
            touched.iter().find_map(|&t| {
                let Some(g) = tiles[t].as_ref() else {
                    return Some(ScalarSteps::Unaligned { tile: t });
                };
                let shape = tb.tensors[Handle::from_index(t)].shape;
                if shape.dim(last) == 1 {
                    // Broadcast along the step: one scalar read.
                    return None;
                }
                if g.strides.0[last] != 1 {
                    return Some(ScalarSteps::Strided {
                        tile: t,
                        stride: g.strides.0[last],
                    });
                }
                let bytes = v * g.dtype.bytes();
                // A shift only pads rows (its strides say it all).
                let chunks_whole = match g.swizzle {
                    Swizzle::None | Swizzle::Shift { .. } => true,
                    Swizzle::Xor { m, .. } => (1usize << m) >= v,
                };
                let aligned = bytes <= 16
                    && g.bytes.is_multiple_of(bytes)
                    && (0..shape.rank()).all(|d| {
                        d == last || shape.dim(d) == 1 || g.strides.0[d].is_multiple_of(v)
                    });
                (!(chunks_whole && aligned)).then_some(ScalarSteps::Unaligned { tile: t })
            })
        };
        let mut why = None;
        for &v in widths {
            match misfit(v) {
                None => {
                    cp.vector = v;
                    why = None;
                    break;
                }
                Some(w) => why = Some(w),
            }
        }
        cp.scalar = why;
        // The tiles the chain reads that are broadcast along the step: one scalar read each.
        if cp.vector > 1 {
            cp.broadcast_reads = fusion
                .reads(tb, c)
                .into_iter()
                .map(|t| t.index())
                .filter(|&t| tb.tensors[Handle::from_index(t)].shape.dim(last) == 1)
                .collect();
        }
    }
}

/// Chunks per thread up to which the copies of one schedule level stay with the threads' loads
/// (`tb::copy_chunks` unrolls its loop 4 times, and consecutive copies overlap): measured on an
/// H100 (docs/benchmarks.md, "Copies no ring stages"), `cp.async` made mqa_bs8 g0 (4 chunks
/// per thread) 2.7% and lora g1 (5) 4% slower, qknorm_gqa_bs8 g54 (9 and 20) 1.2× faster.
const THREAD_COPY_IN_FLIGHT: usize = 8;

/// Chunked input copies that no ring stages go by `cp.async` ([`CopyEngine::CpAsyncWaited`])
/// where the target has it, no input of the kernel fills a `cp.async` ring (whose groups the
/// wait would also wait for), and the copies of one schedule level take a thread more than
/// [`THREAD_COPY_IN_FLIGHT`] chunks: the threads' loads would then wait for each other in
/// turns, `cp.async` keeps every chunk in flight at once (qknorm_gqa_bs8 g54's two kernels of
/// 9 and 20 chunks per thread: 27.1 → 23.3 and 30.5 → 23.8 µs on an H100).
fn plan_waited_copies(
    tb: &TbGraph,
    ops: &mut [OpPlan],
    fusion: &FusionPlan,
    sched: &super::order::Schedule,
    threads: usize,
    target: &Target,
) {
    let ring = ops.iter().any(|p| {
        matches!(
            p,
            OpPlan::Input {
                engine: CopyEngine::CpAsync,
                ..
            }
        )
    });
    if !target.has_cp_async || ring {
        return;
    }
    // Chunks per thread and the inputs of each (phase, level).
    let mut levels: BTreeMap<(super::order::Phase, usize), (usize, Vec<usize>)> = BTreeMap::new();
    for (h, op) in tb.ops.iter() {
        if let OpPlan::Input {
            copy: Copy::Chunked { chunk_elems, .. },
            engine: CopyEngine::Threads,
            ..
        } = &ops[h.index()]
        {
            let c = fusion.chain_of[h.index()];
            let chunks = tb.tensors[op.outputs[0]].shape.numel() / chunk_elems;
            let e = levels.entry((sched.phase[c], sched.level[c])).or_default();
            e.0 += chunks.div_ceil(threads.max(1));
            e.1.push(h.index());
        }
    }
    for (per_thread, inputs) in levels.into_values() {
        if per_thread <= THREAD_COPY_IN_FLIGHT {
            continue;
        }
        for i in inputs {
            if let OpPlan::Input { engine, .. } = &mut ops[i] {
                *engine = CopyEngine::CpAsyncWaited;
            }
        }
    }
}

/// Whether `d` is a 16-bit floating type.
fn is_float16(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16)
}

/// The operators of a chain (`ops`, leader first) that compute its value: all but the sink's
/// own operator (an output or accumulator) where the chain ends in one.
fn computing_ops(ops: &[Handle<TbOp>], sink: Sink) -> &[Handle<TbOp>] {
    match sink {
        Sink::Global(_) | Sink::Accum(_) => &ops[..ops.len() - 1],
        _ => ops,
    }
}

/// Whether the last operator of a chain (`ops`, leader first) that computes its value — the
/// operator before a store or accumulator sink, else the tail — is `exp`.
fn last_value_is_exp(tb: &TbGraph, ops: &[Handle<TbOp>], sink: Sink) -> bool {
    computing_ops(ops, sink)
        .last()
        .is_some_and(|&o| matches!(tb.ops[o].kind, TbOpKind::Unary(UnaryOp::Exp)))
}

/// Whether the chain `ops` computes a silu or sigmoid whose value reaches `sink` through
/// products and quotients with side tiles only ([`ChainPlan::approx_logistic`]): the first such
/// operator is followed by binary `mul` and `div` members alone (the sink's own operator, an
/// output or accumulator, aside).
fn logistic_reaches_store_by_products(tb: &TbGraph, ops: &[Handle<TbOp>], sink: Sink) -> bool {
    let computed = computing_ops(ops, sink);
    let Some(first) = computed.iter().position(|&o| {
        matches!(
            tb.ops[o].kind,
            TbOpKind::Unary(UnaryOp::Silu | UnaryOp::Sigmoid)
        )
    }) else {
        return false;
    };
    computed[first + 1..].iter().all(|&o| {
        matches!(
            tb.ops[o].kind,
            TbOpKind::Binary(BinaryOp::Mul | BinaryOp::Div)
        )
    })
}

/// How a matmul-led chain with `members` and `sink` is lowered ([`MatmulLowering`]).
fn matmul_lowering(
    tb: &TbGraph,
    ops: &[OpPlan],
    instr: MatmulInstr,
    members: &[Handle<crate::graph::threadblock::TbOp>],
    sink: Sink,
) -> MatmulLowering {
    if !instr.is_mma() {
        return MatmulLowering::PerElement;
    }
    match sink {
        Sink::Accum(acc) => {
            let kind = match tb.ops[acc].kind {
                TbOpKind::Accum(k) => Some(k),
                _ => None,
            };
            let reducing = kind.is_some_and(AccumKind::reduces_last_dim);
            if reducing || !accum_in_registers(ops, acc) {
                MatmulLowering::SliceBySlice
            } else if members.is_empty() && kind == Some(AccumKind::Nored) {
                MatmulLowering::IntoFragment
            } else {
                MatmulLowering::ThroughMembers
            }
        }
        _ => MatmulLowering::SliceBySlice,
    }
}

/// Whether accumulator `a` keeps its state in registers.
pub fn accum_in_registers(ops: &[OpPlan], a: Handle<crate::graph::threadblock::TbOp>) -> bool {
    matches!(&ops[a.index()], OpPlan::Accum { storage, .. } if storage.in_registers())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::Arch;

    #[test]
    fn two_resident_blocks_for_large_grids_of_small_blocks() {
        let t = Target::new(Arch::Sm90a);
        let tb = |grid: [usize; 3], threads: usize| TbGraph::new(grid, [threads, 1, 1], 4, 64);
        // 1024 blocks of 4 warps (mqa_bs8): two per SM.
        assert_eq!(
            resident_blocks_wanted(&tb([8, 8, 16], 128), 128, &t, false),
            2
        );
        // With a register pipe, three.
        assert_eq!(
            resident_blocks_wanted(&tb([8, 8, 16], 128), 128, &t, true),
            3
        );
        // 512 piped blocks: three per SM (396 slots) would leave the second wave a third
        // full; two.
        assert_eq!(
            resident_blocks_wanted(&tb([512, 1, 1], 128), 128, &t, true),
            2
        );
        // 300 piped blocks: two per SM, not three.
        assert_eq!(
            resident_blocks_wanted(&tb([300, 1, 1], 128), 128, &t, true),
            2
        );
        // 128 blocks: fewer than two per SM of 132.
        assert_eq!(
            resident_blocks_wanted(&tb([128, 1, 1], 128), 128, &t, false),
            1
        );
        // 8-warp blocks already bring enough warps.
        assert_eq!(
            resident_blocks_wanted(&tb([1024, 1, 1], 256), 256, &t, true),
            1
        );
        // The CTA's threads count, not the µGraph's block.
        assert_eq!(
            resident_blocks_wanted(&tb([1024, 1, 1], 128), 256, &t, false),
            1
        );
    }

    /// The CTA shape of the cost model: more warps for small grids without a cluster split of 4
    /// or more (16 for short loops, 8 for longer ones), the µGraph's block otherwise; `--warps`
    /// and `--warps graph` win; every choice says why.
    #[test]
    fn the_cta_shape_follows_the_grid_the_loop_and_the_split() {
        use crate::graph::dtype::DType;
        use crate::graph::workloads::decode_gated_linear;
        use crate::sched::plan::{CtaChoice, Options};
        let plan = |g: &KernelGraph, arch: Arch, cta: CtaChoice| {
            let opts = Options {
                cta,
                ..Options::for_target(Target::new(arch))
            };
            let p = crate::sched::plan(g, &opts).unwrap();
            let kp = p.kernels.values().next().unwrap().clone();
            (kp.cta.threads, kp.cta.source, kp.cta.block, kp.split.ctas())
        };
        // Decode (32 blocks, loop 64): 8 warps would shrink its clusters of 8 on sm_90a, so it
        // keeps 4; 56 blocks keep clusters of 4 with 8 warps, and take them; without the split
        // (sm_80) the small grid and long loop get 8.
        let g = decode_gated_linear(8, 11008, 2048, 32, 64, DType::BF16).unwrap();
        let (threads, source, _, ctas) = plan(&g, Arch::Sm90a, CtaChoice::Auto);
        assert_eq!((threads, ctas), (128, 8));
        assert!(matches!(source, CtaSource::Model(CtaWhy::ClusterShrinks)));
        let g56 = decode_gated_linear(8, 18944, 3584, 56, 64, DType::BF16).unwrap();
        assert_eq!(plan(&g56, Arch::Sm90a, CtaChoice::Auto).0, 256);
        assert_eq!(plan(&g56, Arch::Sm90a, CtaChoice::Auto).3, 4);
        let (threads, source, block, _) = plan(&g, Arch::Sm80, CtaChoice::Auto);
        assert_eq!((threads, block), (256, [256, 1, 1]));
        assert!(matches!(source, CtaSource::Model(CtaWhy::LongLoop)));
        // A short loop (4 iterations) on a small grid: 16 warps.
        let g = decode_gated_linear(8, 256, 2048, 32, 4, DType::F16).unwrap();
        let (threads, _, _, _) = plan(&g, Arch::Sm80, CtaChoice::Auto);
        assert_eq!(threads, 512);
        // Explicit choices win.
        let (threads, source, _, _) = plan(&g, Arch::Sm80, CtaChoice::Warps(2));
        assert_eq!((threads, source), (64, CtaSource::Asked));
        let (threads, source, _, _) = plan(&g, Arch::Sm80, CtaChoice::Graph);
        assert_eq!((threads, source), (128, CtaSource::Graph));
        // Warp counts no CTA can have are refused (a tuning cache once asked for 0 and 2³²).
        for warps in [0, 33, 1 << 32] {
            let opts = Options {
                cta: CtaChoice::Warps(warps),
                ..Options::for_target(Target::new(Arch::Sm80))
            };
            let e = crate::sched::plan(&g, &opts).unwrap_err();
            assert!(e.to_string().contains("1 to 32 warps"), "{e}");
        }
        // A grid of 4 blocks per SM or more keeps the µGraph's block.
        let g = decode_gated_linear(8, 256, 16384, 1024, 4, DType::F16).unwrap();
        let (threads, source, _, _) = plan(&g, Arch::Sm80, CtaChoice::Auto);
        assert_eq!(threads, 128);
        assert!(matches!(source, CtaSource::Model(CtaWhy::ManyBlocks)));
    }

    /// silu runs approximately where its value reaches a 16-bit store through products only:
    /// silu(X) ⊙ Y stored as bf16 or fp16, not in fp32, and not when a sum follows.
    #[test]
    fn silu_is_approximate_where_only_products_reach_a_16_bit_store() {
        use crate::graph::builder::{GraphBuilder, TbGraphBuilder};
        use crate::graph::ops::BinaryOp;
        use crate::sched::plan::Options;
        use crate::target::Arch;
        let graph = |dtype: DType, then: BinaryOp| {
            let mut g = GraphBuilder::new();
            let x = g.new_input(&[8, 256], dtype).unwrap();
            let y = g.new_input(&[8, 256], dtype).unwrap();
            let w = g.new_input(&[256, 64], dtype).unwrap();
            let mut tb = TbGraphBuilder::new([2, 1, 1], [128, 1, 1], 4);
            let tx = tb.new_input(&g, x, [-1, -1, -1], 1).unwrap();
            let ty = tb.new_input(&g, y, [-1, -1, -1], 1).unwrap();
            let tw = tb.new_input(&g, w, [1, -1, -1], 0).unwrap();
            let s = tb.silu(tx).unwrap();
            let p = tb.binary(then, s, ty).unwrap();
            let c = tb.matmul(p, tw).unwrap();
            let acc = tb.forloop_accum(c, AccumKind::Nored).unwrap();
            tb.new_output(acc, [1, -1, -1]).unwrap();
            let outs = g.customized(tb).unwrap();
            g.mark_output(outs[0]).unwrap();
            g.build().unwrap()
        };
        for arch in [Arch::Sm80, Arch::Sm90a] {
            let opts = Options::for_target(Target::new(arch));
            let approx = |dtype, then| {
                let g = graph(dtype, then);
                let p = crate::sched::plan(&g, &opts).unwrap();
                let kp = p.kernels.values().next().unwrap();
                kp.chains.iter().filter(|c| c.approx_logistic).count()
            };
            assert_eq!(approx(DType::BF16, BinaryOp::Mul), 1, "{arch:?}");
            assert_eq!(approx(DType::F16, BinaryOp::Div), 1, "{arch:?}");
            assert_eq!(approx(DType::F32, BinaryOp::Mul), 0, "{arch:?}");
            assert_eq!(approx(DType::BF16, BinaryOp::Add), 0, "{arch:?}");
        }
    }

    /// A decode kernel (8 accumulator registers per thread, no register pipe) lets ptxas hoist
    /// its loop's address arithmetic; an attention block with a register pipe recomputes it.
    #[test]
    fn small_bodies_hoist_their_loop_indices_and_register_pipes_do_not() {
        use crate::graph::DType;
        use crate::graph::workloads::{attention_block, decode_gated_linear};
        use crate::sched::plan::{LoopIndices, Options, PipeDecision};
        use crate::target::Arch;
        for arch in [Arch::Sm80, Arch::Sm90a] {
            let opts = Options::for_target(Target::new(arch));
            let plan = |g: &KernelGraph| {
                let p = crate::sched::plan(g, &opts).unwrap();
                p.kernels.values().next().unwrap().clone()
            };
            // 4 warps under the sm_90a cluster split, 8 without it (each thread then keeps half
            // the fragment).
            let kp = plan(&decode_gated_linear(8, 3584, 4608, 72, 64, DType::BF16).unwrap());
            let accum_registers = 32 / kp.cta.threads.div_ceil(32);
            assert_eq!(
                kp.loop_indices,
                LoopIndices::Hoisted { accum_registers },
                "{arch:?}"
            );
            let kp = plan(&attention_block(16, 64, 16, 64, 8, 128, DType::F16).unwrap());
            assert!(matches!(kp.pipes.as_slice(), [PipeDecision::On(_)]));
            assert_eq!(kp.loop_indices, LoopIndices::Recomputed, "{arch:?}");
        }
    }

    /// Attention blocks whose µGraph CTA keeps a register pipe keep it on grids of a block per
    /// SM or more; smaller grids take the extra warps (and lose the pipe).
    #[test]
    fn a_register_pipe_keeps_its_warps_on_grids_that_fill_the_gpu() {
        use crate::graph::DType;
        use crate::graph::workloads::attention_block;
        use crate::sched::plan::{Options, PipeDecision};
        use crate::target::Arch;
        let opts = Options::for_target(Target::new(Arch::Sm90a));
        let plan = |g: &KernelGraph| {
            let p = crate::sched::plan(g, &opts).unwrap();
            p.kernels.values().next().unwrap().clone()
        };
        // 16 heads × 16 row blocks = 256 blocks.
        let kp = plan(&attention_block(16, 64, 16, 64, 8, 128, DType::F16).unwrap());
        assert_eq!(kp.cta.threads, 128);
        assert!(matches!(kp.cta.source, CtaSource::Model(CtaWhy::PipeRows)));
        assert!(matches!(kp.pipes.as_slice(), [PipeDecision::On(_)]));
        // 64 × 16 = 1024 blocks: three per SM, promised to ptxas (registers for all three).
        let kp = plan(&attention_block(64, 64, 16, 64, 8, 128, DType::F16).unwrap());
        assert!(matches!(kp.pipes.as_slice(), [PipeDecision::On(_)]));
        assert_eq!((kp.cta.resident_blocks, kp.cta.min_blocks_per_sm), (3, 3));
        // 8 × 4 = 32 blocks: 16 warps, no pipe.
        let kp = plan(&attention_block(8, 64, 4, 128, 4, 128, DType::F16).unwrap());
        assert_eq!(kp.cta.threads, 512);
        assert!(matches!(kp.pipes.as_slice(), [PipeDecision::Off { .. }]));
    }

    /// `Options::resident_blocks` replaces the planner's count (`--resident-blocks`), and an
    /// asked ring depth (`--max-stages`) replaces the 2-stage cap of piped kernels: the piped
    /// attention block of 1024 blocks gets 2 stages and 3 blocks by default, 3 stages when
    /// asked, and 4 blocks promised to ptxas where shared memory holds them.
    #[test]
    fn asked_residency_and_ring_depth_replace_the_planners() {
        use crate::graph::DType;
        use crate::graph::workloads::attention_block;
        use crate::sched::plan::Options;
        use crate::target::Arch;
        let g = attention_block(64, 64, 16, 64, 8, 128, DType::F16).unwrap();
        let plan = |resident_blocks: Option<usize>, max_stages: Option<usize>| {
            let o = Options {
                resident_blocks,
                max_stages,
                ..Options::for_target(Target::new(Arch::Sm90a))
            };
            let p = crate::sched::plan(&g, &o).unwrap();
            p.kernels.values().next().unwrap().clone()
        };
        let base = plan(None, None);
        assert_eq!(base.pipeline_stages(), PIPED_MAX_STAGES);
        assert_eq!(
            (base.cta.resident_blocks, base.cta.min_blocks_per_sm),
            (3, 3)
        );
        let deep = plan(None, Some(3));
        assert_eq!(deep.pipeline_stages(), 3);
        let four = plan(Some(4), None);
        assert_eq!(
            (four.cta.resident_blocks, four.cta.min_blocks_per_sm),
            (4, 4)
        );
        let sm = Target::new(Arch::Sm90a).smem_per_sm;
        assert!(4 * (four.smem.total + DRIVER_SMEM_PER_BLOCK) <= sm);
        // One block per SM: the ring may take all the shared memory a block gets.
        let one = plan(Some(1), Some(4));
        assert_eq!((one.cta.resident_blocks, one.cta.min_blocks_per_sm), (1, 1));
        assert_eq!(one.pipeline_stages(), 4);
    }

    /// An asked residency (`--resident-blocks`) is also what a cluster split counts on, beyond
    /// the split's own cap of 4 CTAs per SM and its 128-register budget: the decode graph of 72
    /// blocks (3584 × 4608) splits over clusters of 4 at 4 CTAs per SM by default, over clusters
    /// of 8 (576 CTAs, one wave only at 5 per SM) at 96 registers per thread when 5 are asked;
    /// shared memory still bounds the count.
    #[test]
    fn asked_residency_reaches_the_cluster_split() {
        use crate::graph::DType;
        use crate::graph::workloads::decode_gated_linear;
        use crate::sched::plan::{CtaChoice, Options};
        use crate::target::Arch;
        let g = decode_gated_linear(1, 3584, 4608, 72, 64, DType::BF16).unwrap();
        let split = |resident_blocks: Option<usize>| {
            let o = Options {
                resident_blocks,
                cta: CtaChoice::Warps(4),
                ..Options::for_target(Target::new(Arch::Sm90a))
            };
            let p = crate::sched::plan(&g, &o).unwrap();
            let kp = p.kernels.values().next().unwrap().clone();
            let Split::Cluster(c) = &kp.split else {
                panic!("no cluster split: {:?}", kp.split)
            };
            (
                c.ctas,
                c.resident_per_sm,
                c.regs_per_thread,
                kp.cta.min_blocks_per_sm,
            )
        };
        assert_eq!(split(None), (4, 4, SPLIT_REGS_PER_THREAD, 4));
        assert_eq!(split(Some(5)), (8, 5, 96, 5));
        assert_eq!(split_regs_at(128, 5), 96);
        // 12 would need 12 × 128 threads and more shared memory than an SM has for 12: 7 fit
        // by shared memory (about 30 KB each), 16 by threads; 7 are counted on.
        let (_, resident, regs, _) = split(Some(12));
        assert_eq!((resident, regs), (7, 72));
    }

    /// A grid split's slot bytes end at its last partial's slots, past the alignment padding
    /// between partials (3 blocks × 2 CTAs × 1 f32 = 24 bytes, the next partial at 32).
    #[test]
    fn grid_split_slots_count_their_padding() {
        let g = GridSplit {
            ctas: 2,
            asked: true,
            iters: 2,
            partials: Vec::new(),
            resident_per_sm: 1,
            regs_per_thread: 128,
            blocks: 3,
            slot_elems: vec![1, 4],
            elem_bytes: vec![4, 4],
            slot_offsets: vec![0, 32],
            slots_at: 0,
            counters_at: 0,
        };
        assert_eq!(g.slot_bytes(), 32 + 3 * 2 * 4 * 4);
        assert_eq!(g.counter_bytes(), 12);
    }

    /// `--grid-split N` replaces the cluster split of a decode linear (72 blocks, 64 iterations)
    /// on both targets where N divides the loop into shares of two or more, with the residency
    /// the split counts on; otherwise the kernel keeps its plan and says why. A grid of a block
    /// per SM or more is not split.
    #[test]
    fn grid_split_where_its_rules_hold() {
        use crate::graph::DType;
        use crate::graph::workloads::decode_gated_linear;
        use crate::sched::plan::{CtaChoice, GridSplitChoice, GridSplitOff, NoGridSplit, Options};
        use crate::target::Arch;
        let plan = |g: &crate::graph::kernel::KernelGraph, arch, n| {
            let o = Options {
                grid_split: GridSplitChoice::Ctas(n),
                cta: CtaChoice::Warps(4),
                ..Options::for_target(Target::new(arch))
            };
            let p = crate::sched::plan(g, &o).unwrap();
            let kp = p.kernels.values().next().unwrap().clone();
            (p, kp)
        };
        let g = decode_gated_linear(1, 3584, 4608, 72, 64, DType::BF16).unwrap();
        for arch in [Arch::Sm80, Arch::Sm90a] {
            let (p, kp) = plan(&g, arch, 16);
            let gs = kp.split.grid().expect("a grid split");
            assert_eq!((gs.ctas, gs.iters, gs.blocks), (16, 4, 72));
            assert_eq!(kp.launch_grid(), [72 * 16, 1, 1]);
            assert_eq!(kp.cta.min_blocks_per_sm, gs.resident_per_sm);
            assert!(kp.grid_split_off.is_none() && kp.cluster_dims().is_none());
            // One f32 slot of the 64-column accumulator per CTA past the (empty) buffers, one
            // counter per block after them; the launch binds both.
            assert_eq!(
                (&gs.slot_elems[..], &gs.elem_bytes[..]),
                (&[64][..], &[4][..])
            );
            assert_eq!(gs.slots_at, p.splits_at());
            assert_eq!(p.split_bytes, 72 * 16 * 64 * 4);
            assert_eq!((gs.counters_at, p.counter_bytes), (p.counters_at(), 72 * 4));
            assert_eq!(p.workspace_bytes(), p.counters_at() + 72 * 4);
            assert!(kp.barriers.before_push);
            // A CTA's share bounds its ring.
            assert!(kp.ops.iter().all(|o| match o {
                OpPlan::Input { stages, .. } => *stages <= 4,
                _ => true,
            }));
            let (p, kp) = plan(&g, arch, 3);
            assert_eq!(
                kp.grid_split_off,
                Some(NoGridSplit {
                    asked: true,
                    why: GridSplitOff::NotDividing {
                        iterations: 64,
                        ctas: 3
                    }
                })
            );
            assert_eq!((p.split_bytes, kp.split.grid()), (0, None));
            let (_, kp) = plan(&g, arch, 64);
            assert!(matches!(
                kp.grid_split_off,
                Some(NoGridSplit {
                    why: GridSplitOff::NotDividing { .. },
                    ..
                })
            ));
        }
        // 264 blocks fill the 132 SMs.
        let g = decode_gated_linear(1, 3584, 264 * 16, 264, 64, DType::BF16).unwrap();
        let (_, kp) = plan(&g, Arch::Sm90a, 4);
        assert!(matches!(
            kp.grid_split_off,
            Some(NoGridSplit {
                why: GridSplitOff::Split(SplitOff::GridFills { blocks: 264, .. }),
                ..
            })
        ));
        // The planner's rule (the Ampere path) says why it leaves a kernel whole: a grid of
        // more than three quarters of the SMs, or a loop too short for shares of 4.
        let auto = |g: &crate::graph::kernel::KernelGraph| {
            let o = Options {
                cta: CtaChoice::Warps(4),
                ..Options::for_target(Target::new(Arch::Sm80))
            };
            let p = crate::sched::plan(g, &o).unwrap();
            p.kernels.values().next().unwrap().grid_split_off.clone()
        };
        assert_eq!(
            auto(&g),
            Some(NoGridSplit {
                asked: false,
                why: GridSplitOff::GridLarge {
                    blocks: 264,
                    sms: Target::new(Arch::Sm80).typical_sms
                }
            })
        );
        let g = decode_gated_linear(1, 3072, 4608, 72, 6, DType::BF16).unwrap();
        assert!(matches!(
            auto(&g),
            Some(NoGridSplit {
                asked: false,
                why: GridSplitOff::NoShares { iterations: 6, .. }
            })
        ));
    }

    /// Attention over 64 keys per iteration on sm_90a: both matmuls of the register pipe run as
    /// wgmma — Q·K with A (Q) by ldmatrix and B (K's 64 × 64 tile, one swizzle atom across,
    /// TMA-loaded) by descriptor, P·V with A from the pipe — and nothing keeps mma.sync.
    #[test]
    fn attention_over_64_keys_takes_wgmma_for_both_matmuls() {
        use crate::graph::DType;
        use crate::graph::workloads::attention_block;
        use crate::sched::ops::{MatmulInstr, OperandLoad};
        use crate::sched::plan::Options;
        use crate::target::Arch;
        let g = attention_block(32, 64, 16, 64, 8, 128, DType::F16).unwrap();
        let p = crate::sched::plan(&g, &Options::for_target(Target::new(Arch::Sm90a))).unwrap();
        let kp = p.kernels.values().next().unwrap();
        let matmuls: Vec<_> = kp
            .ops
            .iter()
            .filter_map(|o| match o {
                OpPlan::Matmul {
                    instr,
                    loads,
                    mma_per_warp,
                    ..
                } => Some((*instr, *loads, *mma_per_warp)),
                _ => None,
            })
            .collect();
        let w = MatmulInstr::WgmmaM64K16 {
            dtype: DType::F16,
            n: 64,
        };
        assert_eq!(
            matmuls,
            [
                (w, (OperandLoad::Ldmatrix, OperandLoad::WgmmaDescriptor), 4),
                (w, (OperandLoad::Fragment, OperandLoad::WgmmaDescriptor), 4),
            ]
        );
        assert!(kp.no_wgmma.is_empty(), "{:?}", kp.no_wgmma);
    }

    /// exp runs as ex2.approx exactly where its value is rounded to a 16-bit float right
    /// after: stored to an f16/bf16 device tensor, not an fp32 one, not summed into an
    /// accumulator, not followed by another operator.
    #[test]
    fn exp_is_approximate_only_before_a_16_bit_rounding() {
        use crate::graph::builder::{GraphBuilder, TbGraphBuilder};
        use crate::graph::{AccumKind, DType};
        use crate::sched::plan::Options;
        use crate::target::Arch;
        // (dtype, then) → whether the exp chain is approximate.
        let approx = |dtype: DType, then: &str| {
            let mut g = GraphBuilder::new();
            let x = g.new_input(&[64, 64], dtype).unwrap();
            let y = g.new_input(&[64, 64], dtype).unwrap();
            let mut tb = TbGraphBuilder::new([1, 1, 1], [128, 1, 1], 2);
            let tx = tb.new_input(&g, x, [-1, -1, -1], 1).unwrap();
            let ty = tb.new_input(&g, y, [-1, -1, -1], 0).unwrap();
            let e = tb.exp(tx).unwrap();
            let v = match then {
                // exp's tile feeds a matmul: stored in the graph's type.
                "store" => {
                    let m = tb.matmul(e, ty).unwrap();
                    tb.forloop_accum(m, AccumKind::Nored).unwrap()
                }
                "scale" => {
                    let s = tb.mul_scalar(e, 0.5).unwrap();
                    let m = tb.matmul(s, ty).unwrap();
                    tb.forloop_accum(m, AccumKind::Nored).unwrap()
                }
                "sum" => tb.forloop_accum(e, AccumKind::RedLdSum).unwrap(),
                _ => unreachable!(),
            };
            tb.new_output(v, [-1, -1, -1]).unwrap();
            let outs = g.customized(tb).unwrap();
            g.mark_output(outs[0]).unwrap();
            let g = g.build().unwrap();
            let p = crate::sched::plan(&g, &Options::for_target(Target::new(Arch::Sm80))).unwrap();
            let kp = p.kernels.values().next().unwrap();
            let chain = kp.fusion.chain_of[kp
                .fusion
                .chains
                .iter()
                .flat_map(|c| c.ops.iter())
                .find(|&&o| matches!(tb_kind(&g, o), Some(true)))
                .unwrap()
                .index()];
            kp.chains[chain].approx_exp
        };
        // fp16 flushes results under 2^-126 (they round to zero in fp16 anyway); bf16, whose
        // range reaches fp32's subnormals, keeps them.
        assert_eq!(approx(DType::F16, "store"), Some(ApproxExp::Ex2FlushToZero));
        assert_eq!(approx(DType::BF16, "store"), Some(ApproxExp::Ex2));
        assert_eq!(approx(DType::F32, "store"), None);
        assert_eq!(approx(DType::F16, "scale"), None);
        assert_eq!(approx(DType::F16, "sum"), None);
    }

    /// Vector steps go to element-wise chains into a tile that every access reads contiguously
    /// (the exp feeding a matmul: 4 per step) and into a device tensor whose rows keep every
    /// step aligned (up to 16 bytes: 8 per step); a chain with too few elements to give every
    /// thread a step keeps scalar steps.
    #[test]
    fn vector_steps_need_contiguous_tiles_and_a_step_per_thread() {
        use crate::graph::builder::{GraphBuilder, TbGraphBuilder};
        use crate::graph::{AccumKind, DType};
        use crate::sched::plan::Options;
        let vectors = |rows: usize, to_matmul: bool, out_stride: Option<usize>| {
            let mut g = GraphBuilder::new();
            let x = g.new_input(&[rows, 64], DType::F16).unwrap();
            let y = g.new_input(&[64, 64], DType::F16).unwrap();
            let mut tb = TbGraphBuilder::new([1, 1, 1], [128, 1, 1], 1);
            let tx = tb.new_input(&g, x, [-1, -1, -1], -1).unwrap();
            let ty = tb.new_input(&g, y, [-1, -1, -1], -1).unwrap();
            let v = if to_matmul {
                let e = tb.exp(tx).unwrap();
                let m = tb.matmul(e, ty).unwrap();
                tb.forloop_accum(m, AccumKind::Nored).unwrap()
            } else {
                // exp of the accumulated tile, stored straight to the device tensor.
                let a = tb.forloop_accum(tx, AccumKind::Nored).unwrap();
                tb.exp(a).unwrap()
            };
            tb.new_output(v, [-1, -1, -1]).unwrap();
            let outs = g.customized(tb).unwrap();
            match out_stride {
                Some(s) => g.mark_output_strided(outs[0], &[s, 1]).unwrap(),
                None => g.mark_output(outs[0]).unwrap(),
            }
            let g = g.build().unwrap();
            let p = crate::sched::plan(&g, &Options::for_target(Target::new(Arch::Sm80))).unwrap();
            let kp = p.kernels.values().next().unwrap().clone();
            let exp = kp
                .fusion
                .chains
                .iter()
                .position(|c| matches!(tb_kind(&g, c.leader()), Some(true)))
                .unwrap();
            (kp.chains[exp].vector, kp.chains[exp].scalar.clone(), kp)
        };
        use crate::sched::plan::ScalarSteps;
        let (v, why, kp) = vectors(64, true, None);
        assert_eq!((v, why), (4, None));
        let Sink::Tile(t) = kp.chains[kp.chains.iter().position(|c| c.vector > 1).unwrap()].sink
        else {
            panic!("a vectorised chain stores to a tile");
        };
        let g = kp.tiles[t.index()].as_ref().unwrap();
        assert_eq!(g.strides.0[1], 1);
        // Into a device tensor of rows 128 bytes apart: one 16-byte store per step.
        let (v, why, kp) = vectors(64, false, None);
        assert_eq!((v, why), (8, None));
        assert!(kp.chains.iter().any(|c| matches!(c.sink, Sink::Global(_))));
        // Rows 72 elements apart: every step of 8 starts aligned again.
        assert_eq!(vectors(64, false, Some(72)).0, 8);
        // 68 apart: steps of 4; 65 apart (odd): no step stays aligned, scalar stores.
        assert_eq!(vectors(64, false, Some(68)).0, 4);
        let (v, why, _) = vectors(64, false, Some(65));
        assert_eq!(v, 1);
        assert!(
            matches!(
                &why,
                Some(ScalarSteps::DeviceUnaligned(
                    super::super::ops::ChunkOff::Stride { stride: 65, .. }
                ))
            ),
            "{why:?}"
        );
        // 2 × 64 elements: 32 steps of 4, 64 of 2 — neither gives each of the CTA's threads
        // (128 or more) a step.
        let (v, why, kp) = vectors(2, true, None);
        assert_eq!(
            (v, why),
            (
                1,
                Some(ScalarSteps::FewElements {
                    elements: 128,
                    threads: kp.cta.threads
                })
            )
        );
    }

    /// Copies no ring stages go by `cp.async` where a thread would copy more than
    /// [`THREAD_COPY_IN_FLIGHT`] chunks of its level, and stay with the threads' loads below.
    #[test]
    fn large_unstaged_copies_go_by_cp_async() {
        use crate::graph::DType;
        use crate::graph::builder::{GraphBuilder, TbGraphBuilder};
        use crate::sched::plan::Options;
        let engine = |rows: usize| {
            let mut g = GraphBuilder::new();
            let x = g.new_input(&[rows, 512], DType::F16).unwrap();
            let mut tb = TbGraphBuilder::new([1, 1, 1], [128, 1, 1], 1);
            let tx = tb.new_input(&g, x, [-1, -1, -1], -1).unwrap();
            let a = tb.forloop_accum(tx, AccumKind::Nored).unwrap();
            let e = tb.exp(a).unwrap();
            tb.new_output(e, [-1, -1, -1]).unwrap();
            let outs = g.customized(tb).unwrap();
            g.mark_output(outs[0]).unwrap();
            let g = g.build().unwrap();
            let p = crate::sched::plan(&g, &Options::for_target(Target::new(Arch::Sm80))).unwrap();
            let kp = p.kernels.values().next().unwrap().clone();
            let per_thread = (rows * 512 / 8).div_ceil(kp.cta.threads);
            let engine = kp.ops.iter().find_map(|o| match o {
                OpPlan::Input { engine, .. } => Some(*engine),
                _ => None,
            });
            (per_thread, engine.unwrap())
        };
        let (n, e) = engine(72);
        assert!(n > THREAD_COPY_IN_FLIGHT, "{n} chunks per thread");
        assert_eq!(e, CopyEngine::CpAsyncWaited);
        let (n, e) = engine(8);
        assert!(n <= THREAD_COPY_IN_FLIGHT, "{n} chunks per thread");
        assert_eq!(e, CopyEngine::Threads);
    }

    /// A plain sum over a loop of one iteration is written once (its chain stores to its tile,
    /// by vectors where the tiles allow); over two iterations it accumulates. Row sums read
    /// their rows by runs of 8 16-bit elements (one 16-byte load per tile and step).
    #[test]
    fn one_iteration_sums_are_written_once_and_rows_read_by_vectors() {
        use crate::graph::DType;
        use crate::graph::builder::{GraphBuilder, TbGraphBuilder};
        use crate::sched::plan::Options;
        let plan = |iterations: usize| {
            let mut g = GraphBuilder::new();
            let x = g.new_input(&[64, 64 * iterations], DType::F16).unwrap();
            let mut tb = TbGraphBuilder::new([1, 1, 1], [128, 1, 1], iterations);
            let fd = if iterations > 1 { 1 } else { -1 };
            let tx = tb.new_input(&g, x, [-1, -1, -1], fd).unwrap();
            let a = tb.forloop_accum(tx, AccumKind::Nored).unwrap();
            let r = tb.forloop_accum(tx, AccumKind::RedLdSum).unwrap();
            tb.new_output(a, [-1, -1, -1]).unwrap();
            tb.new_output(r, [-1, -1, -1]).unwrap();
            let outs = g.customized(tb).unwrap();
            for o in outs {
                g.mark_output(o).unwrap();
            }
            let g = g.build().unwrap();
            let p = crate::sched::plan(&g, &Options::for_target(Target::new(Arch::Sm80))).unwrap();
            let kp = p.kernels.values().next().unwrap().clone();
            let (_, tb) = g.customized_ops().next().unwrap();
            let accs: Vec<_> = tb
                .ops
                .iter()
                .filter(|(_, o)| matches!(o.kind, TbOpKind::Accum(_)))
                .map(|(h, o)| (h, o.kind.clone(), o.outputs[0]))
                .collect();
            (kp, accs)
        };
        let (kp, accs) = plan(1);
        for (h, kind, out) in &accs {
            let chain = &kp.chains[kp.fusion.chain_of[h.index()]];
            let OpPlan::Accum { storage, .. } = &kp.ops[h.index()] else {
                panic!("op{} has no accumulator plan", h.index());
            };
            if *kind == TbOpKind::Accum(AccumKind::Nored) {
                assert_eq!(*storage, AccumStorage::WrittenOnce);
                assert_eq!(chain.sink, Sink::Tile(*out));
                assert_eq!((chain.vector, chain.scalar.clone()), (4, None));
            } else {
                assert_eq!(*storage, AccumStorage::Shared);
                assert_eq!(chain.sink, Sink::Accum(*h));
                assert_eq!((chain.vector, chain.scalar.clone()), (8, None));
            }
        }
        let (kp, accs) = plan(2);
        for (h, kind, _) in &accs {
            let OpPlan::Accum { storage, .. } = &kp.ops[h.index()] else {
                panic!("op{} has no accumulator plan", h.index());
            };
            assert_ne!(*storage, AccumStorage::WrittenOnce, "{kind:?}");
            assert_eq!(
                kp.chains[kp.fusion.chain_of[h.index()]].sink,
                Sink::Accum(*h)
            );
        }
    }

    /// Whether op `o` of the graph's customized operator is an exp.
    fn tb_kind(g: &KernelGraph, o: Handle<crate::graph::threadblock::TbOp>) -> Option<bool> {
        let (_, tb) = g.customized_ops().next()?;
        Some(matches!(tb.ops[o].kind, TbOpKind::Unary(UnaryOp::Exp)))
    }

    /// A ring deep enough for one CTA per SM capped the split of decode_m8 11008×2048 at
    /// clusters of 2 (64 CTAs on 132 SMs); a shallower one fits 3 CTAs per SM and clusters of 8.
    #[test]
    fn a_shallower_ring_lets_the_cluster_grow() {
        use crate::graph::dtype::DType;
        use crate::graph::workloads::decode_gated_linear;
        use crate::sched::plan::Options;
        use crate::target::Arch;
        let g = decode_gated_linear(8, 11008, 2048, 32, 64, DType::BF16).unwrap();
        let opts = Options::for_target(Target::new(Arch::Sm90a));
        let p = crate::sched::plan(&g, &opts).unwrap();
        let kp = p.kernels.values().next().unwrap();
        let c = kp.split.cluster().expect("split");
        assert_eq!((c.ctas, c.iters, c.resident_per_sm), (8, 8, 3));
        assert_eq!(kp.cta.resident_blocks, 3);
        assert!(kp.smem.total + DRIVER_SMEM_PER_BLOCK <= Target::new(Arch::Sm90a).smem_per_sm / 3);
        // Without the split the ring keeps its depth for one CTA per SM.
        let off = Options {
            cluster_split: false,
            ..opts
        };
        let p = crate::sched::plan(&g, &off).unwrap();
        let kp = p.kernels.values().next().unwrap();
        assert_eq!(kp.cta.resident_blocks, 1);
        assert_eq!(kp.pipeline_stages(), 4);
    }

    /// decode_m8 11008×2048's split pushes its one partial (8 × 64 f32) into 7 slots of CTA 0
    /// after the kernel's tiles, with the mbarrier before them, and still fits 3 CTAs per SM;
    /// `--no-cluster-push` folds, without the slots; partials rescaled by an online softmax
    /// are folded whatever the option.
    #[test]
    fn a_split_pushes_its_partials_where_the_slots_fit() {
        use crate::graph::workloads::decode_gated_linear;
        use crate::sched::plan::{Gather, NoPush, Options};
        use crate::target::Arch;
        let target = Target::new(Arch::Sm90a);
        let g = decode_gated_linear(8, 11008, 2048, 32, 64, DType::BF16).unwrap();
        let opts = Options::for_target(target);
        let plan_with = |push: bool| {
            let o = Options {
                cluster_push: push,
                ..opts.clone()
            };
            let p = crate::sched::plan(&g, &o).unwrap();
            p.kernels.values().next().unwrap().clone()
        };
        let (on, off) = (plan_with(true), plan_with(false));
        let c = on.split.cluster().expect("split");
        let Gather::Push(p) = &c.gather else {
            panic!("{:?}", c.gather)
        };
        let tile = c.partials[0].tile;
        let buf = &on.smem.buffers[on.smem.buffer_of(tile).unwrap()];
        assert_eq!(buf.bytes, 8 * 64 * 4);
        assert_eq!(p.strides, vec![buf.bytes]);
        assert_eq!(p.bytes, 7 * 8 * 64 * 4);
        assert_eq!(p.barrier, off.smem.total.next_multiple_of(16));
        assert!(p.slots[0] >= p.barrier + 8 && p.slots[0] % 16 == 0);
        assert_eq!(on.smem.total, p.slots[0] + 7 * buf.bytes);
        assert_eq!(on.smem.total, off.smem.total + p.added);
        assert!(on.barriers.before_push && !off.barriers.before_push);
        assert_eq!(c.resident_per_sm, 3);
        assert!(
            3 * (on.smem.total + DRIVER_SMEM_PER_BLOCK + RUNTIME_STATIC_SMEM) <= target.smem_per_sm
        );
        let c_off = off.split.cluster().expect("split");
        assert_eq!(c_off.gather, Gather::Fold(NoPush::TurnedOff));
        assert_eq!((c_off.ctas, c_off.iters), (c.ctas, c.iters));
        // An online-softmax split (mha_bs1's attention kernel) folds.
        let f = crate::read_file(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../shared/corpus/mirage-benchmarks/mha_bs1.json"),
            &Default::default(),
        )
        .unwrap();
        let p = crate::sched::plan(&f.graphs[1].graph, &opts).unwrap();
        let rescaled = p
            .kernels
            .values()
            .filter_map(|kp| kp.split.cluster())
            .map(|c| c.gather.clone())
            .collect::<Vec<_>>();
        assert_eq!(rescaled, vec![Gather::Fold(NoPush::Rescaled)]);
    }

    /// decode_m8 2048×22016's split (clusters of 4 over 86 blocks, 4 CTAs per SM counted on)
    /// has no room for its 24 KB of slots beside 4 CTAs; 344 CTAs still run in one wave of 3 per
    /// SM, so it pushes at 3.
    #[test]
    fn pushes_may_take_the_room_of_a_ctas_per_sm_that_one_wave_does_not_need() {
        use crate::graph::workloads::decode_gated_linear;
        use crate::sched::plan::{Gather, NoPush, Options};
        use crate::target::Arch;
        let target = Target::new(Arch::Sm90a);
        let g = decode_gated_linear(8, 2048, 22016, 86, 64, DType::BF16).unwrap();
        let opts = Options::for_target(target);
        let p = crate::sched::plan(&g, &opts).unwrap();
        let kp = p.kernels.values().next().unwrap();
        let c = kp.split.cluster().expect("split");
        let push = c.gather.push().expect("pushed");
        assert_eq!(
            (c.ctas, c.resident_per_sm, push.resident_before),
            (4, 3, Some(4))
        );
        assert_eq!((kp.cta.min_blocks_per_sm, kp.cta.resident_blocks), (3, 3));
        assert!(cluster_fits(86, 4, 3, &target) && !cluster_fits(86, 4, 2, &target));
        assert!(
            4 * (kp.smem.total + DRIVER_SMEM_PER_BLOCK + RUNTIME_STATIC_SMEM) > target.smem_per_sm
        );
        let off = Options {
            cluster_push: false,
            ..opts
        };
        let p = crate::sched::plan(&g, &off).unwrap();
        let c = p
            .kernels
            .values()
            .next()
            .unwrap()
            .split
            .cluster()
            .unwrap()
            .clone();
        assert_eq!(
            (c.resident_per_sm, c.gather),
            (4, Gather::Fold(NoPush::TurnedOff))
        );
    }

    /// The decode kernel of 2048 × 22016 (17 KB stages) gets the 2 stages that keep
    /// [`RING_BYTES_AHEAD`] in flight; an asked depth (`--max-stages`, a tuning variant)
    /// replaces the rule: 3 or 4 stages (the target's deepest) when asked, with more shared
    /// memory.
    #[test]
    fn max_stages_caps_the_ring() {
        use crate::graph::workloads::decode_gated_linear;
        use crate::sched::plan::Options;
        use crate::target::Arch;
        let g = decode_gated_linear(8, 2048, 22016, 86, 64, DType::BF16).unwrap();
        let opts = Options::for_target(Target::new(Arch::Sm90a));
        let plan_with = |s: Option<usize>| {
            let o = Options {
                max_stages: s,
                ..opts.clone()
            };
            let p = crate::sched::plan(&g, &o).unwrap();
            p.kernels.values().next().unwrap().clone()
        };
        let (base, two, three) = (plan_with(None), plan_with(Some(2)), plan_with(Some(3)));
        assert_eq!(base.pipeline_stages(), 2);
        assert_eq!(two.pipeline_stages(), 2);
        assert_eq!(three.pipeline_stages(), 3);
        let four = plan_with(Some(4));
        assert_eq!(four.pipeline_stages(), 4);
        // (Less the slots of a split's pushes, which only the shallowest ring has room for.)
        let tiles = |kp: &KernelPlan| {
            kp.smem.total
                - kp.split
                    .cluster()
                    .and_then(|c| c.gather.push())
                    .map_or(0, |p| p.added)
        };
        assert!(tiles(&two) < tiles(&three) && tiles(&three) < tiles(&four));
        assert_eq!(plan_with(Some(9)).pipeline_stages(), 4);
    }

    /// The ring depth of small grids: the fewest stages that keep [`RING_BYTES_AHEAD`] in flight
    /// ahead of the stage being read — 2 for the 22 KB stages of decode_m1 11008 × 2048, 3 for
    /// the 9 KB stages of 3584 × 4608 (measured 0.90× and 0.98× the time of 3 and 4 stages, H100).
    #[test]
    fn a_small_grid_keeps_sixteen_kilobytes_in_flight() {
        use crate::graph::dtype::DType;
        use crate::graph::workloads::decode_gated_linear;
        use crate::sched::plan::Options;
        use crate::target::Arch;
        let opts = Options::for_target(Target::new(Arch::Sm90a));
        for ((m, k, n, blocks), stages) in [((1, 11008, 2048, 32), 2), ((1, 3584, 4608, 72), 3)] {
            let g = decode_gated_linear(m, k, n, blocks, 64, DType::BF16).unwrap();
            let p = crate::sched::plan(&g, &opts).unwrap();
            let kp = p.kernels.values().next().unwrap();
            assert_eq!(kp.pipeline_stages(), stages, "{k} x {n}");
            assert!(kp.split.cluster().is_some());
        }
    }

    /// Decode at M = 8: silu ⊙ Y is one fused chain into the matmul's A tile, which the layout
    /// lays out by rows (`TB_FEW_ROWS_A_BY_COLUMNS`), so the pass takes vector steps and A
    /// loads by 32-bit pairs.
    #[test]
    fn decode_m8_fuses_its_gate_and_vectorises_it_into_a_row_major_a() {
        use crate::graph::dtype::DType;
        use crate::graph::workloads::decode_gated_linear;
        use crate::sched::plan::Options;
        let g = decode_gated_linear(8, 11008, 2048, 32, 64, DType::BF16).unwrap();
        let p = crate::sched::plan(&g, &Options::for_target(Target::new(Arch::Sm90a))).unwrap();
        let kp = p.kernels.values().next().unwrap();
        let (tb, _) = g.customized_ops().next().map(|(k, tb)| (tb, k)).unwrap();
        let gate = kp
            .fusion
            .chains
            .iter()
            .position(|c| c.ops.len() == 2 && matches!(tb.ops[c.leader()].kind, TbOpKind::Unary(_)))
            .expect("silu -> mul");
        let Sink::Tile(a) = kp.chains[gate].sink else {
            panic!("the gate stores the A tile");
        };
        assert_eq!(kp.tiles[a.index()].as_ref().unwrap().strides.0[1], 1);
        assert_eq!(kp.chains[gate].vector, 4);
        assert!(kp.ops.iter().any(|o| matches!(
            o,
            OpPlan::Matmul { loads, .. } if loads.0 == OperandLoad::Pairs
        )));
    }
}
