//! The pipeline, in order, from one place: fusion chains → layouts (Z3) → DTensor strides →
//! per customized operator: schedule → operator plans → swizzles and tile geometry → shared
//! memory (with the pipeline depth the budget allows) → the global workspace.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::{Duration, Instant};

use crate::graph::arena::Handle;
use crate::graph::fusion::{FusionPlan, fuse};
use crate::graph::kernel::{DTensor, KernelGraph, KnOpKind};
use crate::graph::mirage_json::names;
use crate::graph::shape::Strides;
use crate::graph::threadblock::{TbGraph, TbOpKind};
use crate::layout::solve::{
    LayoutError, LayoutPlan, SolveMethod, SolveOptions, TileLayout, resolve,
};
use crate::layout::swizzle::{TileGeometry, plan_tile};
use crate::sched::memory::{self, Buffer, Packing};
use crate::sched::meta::{AccumStorage, Copy, OpPlan, dtensor_strides, elem_bytes, plan_ops};
use crate::sched::order::{Phase, Schedule, Step, schedule};
use crate::target::{RUNTIME_STATIC_SMEM, Target};

/// Bytes reserved at the start of shared memory and kept zero: the source of out-of-bounds
/// `ldmatrix` lanes.
pub const ZERO_PAGE: usize = 16;
/// Alignment of workspace buffers.
pub const WORKSPACE_ALIGN: usize = 128;

/// Options of the pipeline.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// The target.
    pub target: Target,
    /// Layout solver options.
    pub solve: SolveOptions,
}

/// Shared memory the driver reserves per resident block (bytes).
const DRIVER_SMEM_PER_BLOCK: usize = 1024;

/// Blocks of `tb` one SM should hold at once: two when blocks are small (≤ 4 warps) and the
/// grid has at least two per SM of a typical part of the target, so that one block's
/// barriers and memory waits overlap the other's work; else one. Pipeline depth gives way
/// to this (down to two stages), as a deep pipeline in a lone 4-warp block hides less.
fn resident_blocks_wanted(tb: &TbGraph, target: &Target) -> usize {
    let warps = tb.num_threads().div_ceil(32);
    if warps <= 4 && tb.num_blocks() >= 2 * target.typical_sms {
        2
    } else {
        1
    }
}

/// Why a graph cannot be planned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// No layout satisfies the operators' constraints.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// A customized operator needs more shared memory than the target has.
    #[error(
        "kernel op {kernel} (kn_customized_op) needs {needed} bytes of shared memory, but {arch} allows {limit} per block (lower bound of any plan: {lower_bound} bytes)"
    )]
    SharedMemory {
        /// Kernel op index.
        kernel: usize,
        /// Bytes the best plan needs.
        needed: usize,
        /// The target's limit.
        limit: usize,
        /// The lower bound of any packing (+ the zero page).
        lower_bound: usize,
        /// The target.
        arch: String,
    },
}

/// Where a DTensor lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// The caller's input buffer i.
    Input(usize),
    /// The caller's output buffer j.
    Output(usize),
    /// The workspace, at a byte offset.
    Workspace(usize),
}

/// The memory form of a DTensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DTensorGeometry {
    /// Innermost dim.
    pub innermost: usize,
    /// Element strides.
    pub strides: Strides,
    /// Elements the buffer spans.
    pub phys_elems: usize,
    /// Where it lives.
    pub placement: Placement,
}

/// What a shared-memory buffer holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SmemKind {
    /// A tile (with this many pipeline stages).
    Tile {
        /// The tile.
        tile: usize,
        /// Copies of it (pipeline stages).
        stages: usize,
    },
    /// A register accumulator's copy written back after the loop.
    Writeback {
        /// The tile.
        tile: usize,
    },
}

/// The shared-memory plan of a customized operator.
#[derive(Clone, Debug)]
pub struct SmemPlan {
    /// Buffers (offsets relative to the end of the zero page, see `base`).
    pub buffers: Vec<Buffer>,
    /// What each buffer holds.
    pub kinds: Vec<SmemKind>,
    /// The packing.
    pub packing: Packing,
    /// Bytes before the first buffer (the zero page, if any).
    pub base: usize,
    /// Total dynamic shared memory.
    pub total: usize,
}

/// The plan of one customized operator.
#[derive(Clone, Debug)]
pub struct KernelPlan {
    /// Fusion chains.
    pub fusion: FusionPlan,
    /// Schedule.
    pub schedule: Schedule,
    /// Per operator.
    pub ops: Vec<OpPlan>,
    /// Per tile: geometry if it lives in shared memory.
    pub tiles: Vec<Option<TileGeometry>>,
    /// Shared memory.
    pub smem: SmemPlan,
}

/// The plan of a kernel graph.
#[derive(Clone, Debug)]
pub struct GraphPlan {
    /// The target.
    pub target: Target,
    /// Layouts.
    pub layout: LayoutPlan,
    /// Per DTensor.
    pub dtensors: Vec<DTensorGeometry>,
    /// Per customized operator (by kernel op index).
    pub kernels: BTreeMap<usize, KernelPlan>,
    /// Workspace buffers (intermediate DTensors).
    pub workspace: Vec<Buffer>,
    /// The DTensor of each workspace buffer.
    pub workspace_tensors: Vec<usize>,
    /// Workspace packing.
    pub workspace_packing: Packing,
    /// Time spent planning.
    pub elapsed: Duration,
}

impl GraphPlan {
    /// Workspace bytes.
    pub fn workspace_bytes(&self) -> usize {
        self.workspace_packing.peak
    }
}

/// Plans a validated graph.
pub fn plan(g: &KernelGraph, opts: &Options) -> Result<GraphPlan, PlanError> {
    let start = Instant::now();
    let fusion: BTreeMap<usize, FusionPlan> = g
        .customized_ops()
        .map(|(h, tb)| (h.index(), fuse(tb)))
        .collect();
    let layout = resolve(g, &fusion, &opts.solve)?;
    let dtensors = dtensor_geometry(g, &layout);
    let mut kernels = BTreeMap::new();
    for (h, tb) in g.customized_ops() {
        let k = h.index();
        let op = &g.ops[h];
        let kp = plan_kernel(
            g,
            k,
            tb,
            &op.inputs,
            &op.outputs,
            fusion[&k].clone(),
            &layout,
            &dtensors,
            &opts.target,
        )?;
        kernels.insert(k, kp);
    }
    let (workspace, workspace_tensors) = workspace_buffers(g, &dtensors);
    let workspace_packing = memory::pack(&workspace);
    let mut dtensors = dtensors;
    for (b, &t) in workspace_tensors.iter().enumerate() {
        dtensors[t].placement = Placement::Workspace(workspace_packing.offsets[b]);
    }
    Ok(GraphPlan {
        target: opts.target,
        layout,
        dtensors,
        kernels,
        workspace,
        workspace_tensors,
        workspace_packing,
        elapsed: start.elapsed(),
    })
}

fn dtensor_geometry(g: &KernelGraph, layout: &LayoutPlan) -> Vec<DTensorGeometry> {
    let mut placement: Vec<Option<Placement>> = vec![None; g.tensors.len()];
    let mut user: Vec<Option<Strides>> = vec![None; g.tensors.len()];
    for (i, (h, t)) in g.inputs().into_iter().enumerate() {
        placement[t.index()] = Some(Placement::Input(i));
        if let KnOpKind::Input { strides } = &g.ops[h].kind {
            user[t.index()] = Some(strides.clone());
        }
    }
    for (j, (h, t)) in g.outputs().into_iter().enumerate() {
        if placement[t.index()].is_none() {
            placement[t.index()] = Some(Placement::Output(j));
            if let KnOpKind::Output { strides: Some(s) } = &g.ops[h].kind {
                user[t.index()] = Some(s.clone());
            }
        }
    }
    g.tensors
        .iter()
        .map(|(h, d)| {
            let innermost = layout.dtensors[h.index()];
            let (strides, phys_elems) = match &user[h.index()] {
                Some(s) => (s.clone(), s.span(&d.shape).unwrap_or(0)),
                None => dtensor_strides(&d.shape, innermost, d.dtype),
            };
            DTensorGeometry {
                innermost,
                strides,
                phys_elems,
                placement: placement[h.index()].unwrap_or(Placement::Workspace(0)),
            }
        })
        .collect()
}

fn workspace_buffers(g: &KernelGraph, dt: &[DTensorGeometry]) -> (Vec<Buffer>, Vec<usize>) {
    let mut def = vec![usize::MAX; g.tensors.len()];
    let mut last = vec![0usize; g.tensors.len()];
    for (h, op) in g.ops.iter() {
        for &t in &op.outputs {
            def[t.index()] = h.index();
            last[t.index()] = h.index();
        }
        for &t in &op.inputs {
            last[t.index()] = last[t.index()].max(h.index());
        }
    }
    let mut bufs = Vec::new();
    let mut tensors = Vec::new();
    for (h, d) in g.tensors.iter() {
        if matches!(dt[h.index()].placement, Placement::Workspace(_))
            && def[h.index()] != usize::MAX
        {
            let bytes = (dt[h.index()].phys_elems * elem_bytes(d.dtype)).div_ceil(WORKSPACE_ALIGN)
                * WORKSPACE_ALIGN;
            bufs.push(Buffer {
                name: format!("%{} {} {}", h.index(), d.shape, d.dtype),
                bytes,
                start: def[h.index()],
                end: last[h.index()] + 1,
                align: WORKSPACE_ALIGN,
            });
            tensors.push(h.index());
        }
    }
    (bufs, tensors)
}

#[allow(clippy::too_many_arguments)]
fn plan_kernel(
    g: &KernelGraph,
    k: usize,
    tb: &TbGraph,
    ins: &[Handle<DTensor>],
    outs: &[Handle<DTensor>],
    fusion: FusionPlan,
    layout: &LayoutPlan,
    dt: &[DTensorGeometry],
    target: &Target,
) -> Result<KernelPlan, PlanError> {
    let kl = &layout.kernels[&k];
    let sched = schedule(tb, &fusion);
    let side = |hs: &[Handle<DTensor>]| -> Vec<_> {
        hs.iter()
            .map(|&t| {
                (
                    g.tensors[t].shape,
                    dt[t.index()].strides.clone(),
                    dt[t.index()].innermost,
                )
            })
            .collect()
    };
    let mut ops = plan_ops(tb, &fusion, kl, &side(ins), &side(outs), target);
    // Chunk sizes the schedule needs: 16 bytes at chunked-copy endpoints and matmul operands.
    let materialized = fusion.materialized(tb);
    let mut min_chunk = vec![0usize; tb.tensors.len()];
    let mut feeds_mma = vec![false; tb.tensors.len()];
    for (h, op) in tb.ops.iter() {
        match (&op.kind, &ops[h.index()]) {
            (
                TbOpKind::Input { .. },
                OpPlan::Input {
                    copy: Copy::Chunked { .. },
                    ..
                },
            ) => min_chunk[op.outputs[0].index()] = target.max_copy_bytes,
            (
                TbOpKind::Output { .. },
                OpPlan::Output {
                    copy: Some(Copy::Chunked { .. }),
                },
            ) => min_chunk[op.inputs[0].index()] = target.max_copy_bytes,
            (TbOpKind::Matmul, _) => {
                for &t in &op.inputs {
                    min_chunk[t.index()] = target.max_copy_bytes;
                    feeds_mma[t.index()] = true;
                }
                let tail = fusion.chain(h).tail();
                if let Some(&c) = tb.ops[tail].outputs.first() {
                    min_chunk[c.index()] = target.max_copy_bytes;
                }
            }
            _ => {}
        }
    }
    let tiles: Vec<Option<TileGeometry>> = tb
        .tensors
        .iter()
        .map(|(h, s)| {
            if !materialized[h.index()] {
                return None;
            }
            let l = kl.tiles[h.index()].unwrap_or(TileLayout {
                innermost: s.shape.rank() - 1,
                swizzled: None,
            });
            let elem = tile_elem_bytes(tb, h);
            Some(plan_tile(
                &s.shape,
                elem,
                l,
                min_chunk[h.index()].max(elem),
                target,
                feeds_mma[h.index()],
            ))
        })
        .collect();
    // An output of an fp32 accumulator tile converts while it copies: element by element.
    for (h, op) in tb.ops.iter() {
        if let (TbOpKind::Output { .. }, OpPlan::Output { copy: Some(copy) }) =
            (&op.kind, &mut ops[h.index()])
            && copy.is_chunked()
            && tile_elem_bytes(tb, op.inputs[0]) != elem_bytes(tb.tensors[op.inputs[0]].dtype)
        {
            *copy = Copy::Elementwise {
                reason: "the tile holds fp32 accumulator values; the copy converts".into(),
            };
        }
    }
    // Chunk congruence: a 16-byte copy needs the tile's swizzle to keep 16-byte chunks whole.
    for (h, op) in tb.ops.iter() {
        let tile = match &op.kind {
            TbOpKind::Input { .. } => op.outputs[0],
            TbOpKind::Output { .. } => op.inputs[0],
            _ => continue,
        };
        let chunk = tiles[tile.index()].as_ref().map_or(0, |g| g.chunk_bytes);
        let reason = format!("the tile's swizzle keeps only {chunk}-byte chunks whole");
        match &mut ops[h.index()] {
            OpPlan::Input { copy, .. } | OpPlan::Output { copy: Some(copy) }
                if copy.is_chunked() && chunk < target.max_copy_bytes =>
            {
                *copy = Copy::Elementwise { reason };
            }
            _ => {}
        }
    }
    // Pipelined inputs: chunked, in the loop, with a next iteration to prefetch.
    let pipelined: Vec<usize> = tb
        .ops
        .iter()
        .filter(|(h, op)| {
            matches!(
                op.kind,
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
            ) && tb.forloop_range > 1
                && target.has_cp_async
        })
        .map(|(h, _)| h.index())
        .collect();
    let has_matmul = tb
        .ops
        .iter()
        .any(|(_, op)| matches!(op.kind, TbOpKind::Matmul));
    let base = if has_matmul { ZERO_PAGE } else { 0 };
    let max_stages = if pipelined.is_empty() {
        1
    } else {
        tb.forloop_range.min(target.max_pipeline_stages).max(1)
    };
    // Shared memory for each pipeline depth, deepest first.
    let mut attempts: Vec<(usize, SmemPlan)> = Vec::new();
    for stages in (1..=max_stages).rev() {
        for &p in &pipelined {
            if let OpPlan::Input { stages: s, .. } = &mut ops[p] {
                *s = stages;
            }
        }
        attempts.push((stages, smem_plan(tb, &fusion, &sched, &ops, &tiles, base)));
    }
    // The deepest pipeline that keeps the blocks an SM should hold resident (see
    // `resident_blocks_wanted`) and still has two stages; else the deepest that fits at all.
    let wanted = resident_blocks_wanted(tb, target);
    let occupancy_budget = (target.smem_per_sm / wanted)
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
    let (best, smallest) = match chosen {
        Some(i) => (Some(attempts.swap_remove(i)), None),
        None => (None, attempts.pop()),
    };
    let best = best.map(|(stages, plan)| {
        for &p in &pipelined {
            if let OpPlan::Input { stages: s, .. } = &mut ops[p] {
                *s = stages;
            }
        }
        plan
    });
    let smallest = smallest.map(|(_, plan)| plan);
    let smem = match best {
        Some(s) => s,
        None => {
            let s = smallest.expect("at least one attempt");
            return Err(PlanError::SharedMemory {
                kernel: k,
                needed: s.total,
                limit: target.smem_per_block,
                lower_bound: s.packing.lower_bound + s.base,
                arch: target.arch.to_string(),
            });
        }
    };
    Ok(KernelPlan {
        fusion,
        schedule: sched,
        ops,
        tiles,
        smem,
    })
}

/// Shared-memory buffers and their lifetimes in schedule steps (barriers included).
fn smem_plan(
    tb: &TbGraph,
    fusion: &FusionPlan,
    sched: &Schedule,
    ops: &[OpPlan],
    tiles: &[Option<TileGeometry>],
    base: usize,
) -> SmemPlan {
    let steps: Vec<(Phase, &Step)> = sched.steps().collect();
    let total_steps = steps.len();
    let phase_range = |ph: Phase| -> (usize, usize) {
        let idx: Vec<usize> = steps
            .iter()
            .enumerate()
            .filter(|(_, (p, _))| *p == ph)
            .map(|(i, _)| i)
            .collect();
        match (idx.first(), idx.last()) {
            (Some(&a), Some(&b)) => (a, b + 1),
            _ => {
                // An empty phase sits between its neighbours.
                let before = steps.iter().filter(|(p, _)| *p < ph).count();
                (before, before)
            }
        }
    };
    let (loop_start, loop_end) = phase_range(Phase::Loop);
    let (post_start, _) = phase_range(Phase::PostLoop);
    let end_barrier = sched
        .body
        .last()
        .is_some_and(|s| matches!(s, Step::Barrier(_)));
    // Step index of each chain.
    let mut run_at = vec![0usize; fusion.chains.len()];
    for (i, (_, st)) in steps.iter().enumerate() {
        if let Step::Run(c) = st {
            run_at[*c] = i;
        }
    }
    // The first barrier at or after step i, within the same phase, or the phase's end.
    let release = |i: usize| -> usize {
        let ph = steps[i].0;
        for (j, (p, st)) in steps.iter().enumerate().skip(i) {
            if *p != ph {
                return j;
            }
            if matches!(st, Step::Barrier(_)) {
                return j + 1;
            }
        }
        total_steps
    };
    // Readers of each tile: leaders of the chains that take it as input.
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); tb.tensors.len()];
    for (c, chain) in fusion.chains.iter().enumerate() {
        for &t in &tb.ops[chain.leader()].inputs {
            readers[t.index()].push(c);
        }
    }
    let mut buffers = Vec::new();
    let mut kinds = Vec::new();
    for (h, op) in tb.ops.iter() {
        let c = fusion.chain_of[h.index()];
        if fusion.chains[c].tail() != h {
            continue;
        }
        for &t in &op.outputs {
            let Some(geo) = &tiles[t.index()] else {
                continue;
            };
            let ph = sched.phase[c];
            let last_read = readers[t.index()].iter().map(|&r| run_at[r]).max();
            let end_of = |from: usize| last_read.map_or(from + 1, |r| release(r).max(from + 1));
            let name = format!("s{} ({})", t.index(), names::tb_name(&op.kind, false));
            let mut stages = 1;
            let (start, end, kind) = match (&op.kind, &ops[h.index()]) {
                (TbOpKind::Input { .. }, OpPlan::Input { stages: s, .. }) if *s > 1 => {
                    stages = *s;
                    (
                        loop_start,
                        loop_end.max(end_of(loop_start)),
                        SmemKind::Tile {
                            tile: t.index(),
                            stages: *s,
                        },
                    )
                }
                (
                    TbOpKind::Accum(_),
                    OpPlan::Accum {
                        storage: AccumStorage::Registers { .. },
                        ..
                    },
                ) => {
                    if readers[t.index()].is_empty() {
                        continue;
                    }
                    (
                        post_start,
                        end_of(post_start),
                        SmemKind::Writeback { tile: t.index() },
                    )
                }
                (TbOpKind::Accum(_), _) => (
                    loop_start,
                    end_of(loop_start).max(loop_end),
                    SmemKind::Tile {
                        tile: t.index(),
                        stages: 1,
                    },
                ),
                _ => {
                    let def = run_at[c];
                    let (s, e) = match ph {
                        Phase::PreLoop => (
                            def,
                            end_of(def).max(
                                if readers[t.index()]
                                    .iter()
                                    .any(|&r| sched.phase[r] == Phase::Loop)
                                {
                                    loop_end
                                } else {
                                    0
                                },
                            ),
                        ),
                        Phase::Loop if !end_barrier => (loop_start, loop_end),
                        _ => (def, end_of(def)),
                    };
                    (
                        s,
                        e,
                        SmemKind::Tile {
                            tile: t.index(),
                            stages: 1,
                        },
                    )
                }
            };
            let label = if stages > 1 {
                format!("{name} x{stages} stages")
            } else {
                name
            };
            buffers.push(Buffer {
                name: label,
                bytes: geo.bytes * stages,
                start,
                end: end.max(start + 1),
                align: 16,
            });
            kinds.push(kind);
        }
    }
    let packing = memory::pack(&buffers);
    let total = base + packing.peak;
    SmemPlan {
        buffers,
        kinds,
        packing,
        base,
        total,
    }
}

/// The plan as stable text (what `mucc explain` prints).
pub fn explain(g: &KernelGraph, p: &GraphPlan) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "target {}", p.target.arch);
    let method = match &p.layout.report.method {
        SolveMethod::Z3 => "z3 optimum".to_string(),
        SolveMethod::Fallback { reason } => format!("fallback search (z3: {reason})"),
    };
    let _ = writeln!(
        s,
        "layout: {method}, cost {}, {} variables, {} constraints",
        p.layout.cost, p.layout.report.variables, p.layout.report.constraints
    );
    let _ = writeln!(s, "dtensors:");
    for (h, d) in g.tensors.iter() {
        let geo = &p.dtensors[h.index()];
        let place = match geo.placement {
            Placement::Input(i) => format!("input {i}"),
            Placement::Output(j) => format!("output {j}"),
            Placement::Workspace(o) => format!("workspace +{o}"),
        };
        let _ = writeln!(
            s,
            "  %{} {} {}: innermost {} strides {} ({} elements), {place}",
            h.index(),
            d.shape,
            d.dtype,
            geo.innermost,
            geo.strides,
            geo.phys_elems
        );
    }
    for (&k, kp) in &p.kernels {
        let KnOpKind::Customized(tb) = &g.ops[Handle::from_index(k)].kind else {
            continue;
        };
        let _ = writeln!(
            s,
            "kernel op {k} (customized): grid ({}, {}, {}), {} threads, forloop {}",
            tb.grid[0],
            tb.grid[1],
            tb.grid[2],
            tb.num_threads(),
            tb.forloop_range
        );
        for line in kp.fusion.dump(tb).lines() {
            let _ = writeln!(s, "  {line}");
        }
        let _ = writeln!(s, "  schedule: {}", kp.schedule.compact(&kp.fusion));
        for (ph, st) in kp.schedule.steps() {
            match st {
                Step::Barrier(why) => {
                    let _ = writeln!(s, "    {:<9} barrier ({why})", ph.name());
                }
                Step::Run(c) => {
                    let chain = &kp.fusion.chains[*c];
                    let names: Vec<String> = chain
                        .ops
                        .iter()
                        .map(|&o| format!("op{} {}", o.index(), tb.ops[o].kind.name()))
                        .collect();
                    let _ = writeln!(
                        s,
                        "    {:<9} level {}: {}",
                        ph.name(),
                        kp.schedule.level[*c],
                        names.join(" -> ")
                    );
                }
            }
        }
        let _ = writeln!(s, "  operators:");
        for (h, op) in tb.ops.iter() {
            let plan = match &kp.ops[h.index()] {
                OpPlan::Input { copy, stages } => format!(
                    "{}{}",
                    copy_text(copy),
                    if *stages > 1 {
                        format!(", pipelined x{stages}")
                    } else {
                        String::new()
                    }
                ),
                OpPlan::Output { copy: None } => "stored by its chain's leader".into(),
                OpPlan::Output { copy: Some(c) } => copy_text(c),
                OpPlan::Accum { storage, reduce } => format!(
                    "{}, reduce {:?}",
                    match storage {
                        AccumStorage::Registers { per_thread } =>
                            format!("registers ({per_thread} per thread)"),
                        AccumStorage::Shared => "shared memory".into(),
                    },
                    reduce
                ),
                OpPlan::Matmul {
                    warps,
                    instr,
                    mma_per_warp,
                    loads_per_warp,
                } => format!(
                    "{} x {} warps, {instr}, {mma_per_warp} mma + {loads_per_warp} ldmatrix per warp",
                    warps.0, warps.1
                ),
                OpPlan::RowReduce {
                    rows,
                    len,
                    threads_per_row,
                } => {
                    format!("{rows} rows of {len}, {threads_per_row} threads per row")
                }
                OpPlan::Plain => match kp
                    .fusion
                    .is_leader(h)
                    .then(|| p.layout.kernels[&k].iter_dim[h.index()])
                    .flatten()
                {
                    Some(d) => format!("threads along dim {d}"),
                    None => "-".into(),
                },
            };
            let _ = writeln!(s, "    op{} {}: {plan}", h.index(), op.kind.name());
        }
        let _ = writeln!(s, "  tiles:");
        for (h, t) in tb.tensors.iter() {
            match &kp.tiles[h.index()] {
                Some(geo) => {
                    let _ = writeln!(
                        s,
                        "    s{} {} {}: innermost {}{} strides {} swizzle {}{} ({} B)",
                        h.index(),
                        t.shape,
                        t.dtype,
                        geo.layout.innermost,
                        geo.layout
                            .swizzled
                            .map_or(String::new(), |d| format!(" swizzled {d}")),
                        geo.strides,
                        geo.swizzle,
                        geo.hopper_swizzle
                            .map_or(String::new(), |w| format!(" (hopper {w}B)")),
                        geo.bytes
                    );
                }
                None => {
                    let _ = writeln!(
                        s,
                        "    s{} {} {}: in registers (fused)",
                        h.index(),
                        t.shape,
                        t.dtype
                    );
                }
            }
        }
        let sm = &kp.smem;
        let _ = writeln!(
            s,
            "  shared memory: {} B (zero page {} B + peak {} B; lower bound {} B; {})",
            sm.total, sm.base, sm.packing.peak, sm.packing.lower_bound, sm.packing.heuristic
        );
        s.push_str(&memory::dump(&sm.buffers, &sm.packing, sm.base));
    }
    let _ = writeln!(
        s,
        "workspace: {} B (lower bound {} B; {})",
        p.workspace_packing.peak, p.workspace_packing.lower_bound, p.workspace_packing.heuristic
    );
    s.push_str(&memory::dump(&p.workspace, &p.workspace_packing, 0));
    s
}

/// Bytes per element of a tile in shared memory: accumulator results of a loop of two or more
/// iterations, and results of reducing accumulators (row sums, even of one iteration), are kept
/// in the compute type (fp32, or fp64 for fp64 and integer graphs) — a 16-bit row sum of a few
/// thousand terms overflows or loses its low digits; everything else — single-iteration
/// element-wise accumulators included, which sum nothing — in the graph's type.
pub fn tile_elem_bytes(tb: &TbGraph, t: Handle<crate::graph::STensor>) -> usize {
    let dtype = tb.tensors[t].dtype;
    let accum = tb.producer(t).and_then(|p| match tb.ops[p].kind {
        TbOpKind::Accum(k) => Some(k),
        _ => None,
    });
    let wide = accum.is_some_and(|k| tb.forloop_range > 1 || k.reduces_last_dim());
    if wide {
        match dtype {
            crate::graph::DType::F16 | crate::graph::DType::BF16 | crate::graph::DType::F32 => 4,
            _ => 8,
        }
    } else {
        elem_bytes(dtype)
    }
}

fn copy_text(c: &Copy) -> String {
    match c {
        Copy::Chunked { dim, chunk_elems } => {
            format!("chunked copy ({chunk_elems} elements per 16 B along dim {dim})")
        }
        Copy::Elementwise { reason } => format!("element copy ({reason})"),
    }
}

/// Why a graph cannot be transpiled.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TranspileError {
    /// Planning failed.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// Emission failed.
    #[error(transparent)]
    Emit(#[from] crate::emit::EmitError),
}

/// Plans and emits a validated graph; `source` names it in the generated file's header.
pub fn transpile(
    g: &KernelGraph,
    opts: &Options,
    source: &str,
) -> Result<(GraphPlan, crate::emit::Emitted), TranspileError> {
    let p = plan(g, opts)?;
    let e = crate::emit::emit(g, &p, source)?;
    Ok((p, e))
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
        assert_eq!(resident_blocks_wanted(&tb([8, 8, 16], 128), &t), 2);
        // 128 blocks: fewer than two per SM of 132.
        assert_eq!(resident_blocks_wanted(&tb([128, 1, 1], 128), &t), 1);
        // 8-warp blocks already bring enough warps.
        assert_eq!(resident_blocks_wanted(&tb([1024, 1, 1], 256), &t), 1);
    }
}
