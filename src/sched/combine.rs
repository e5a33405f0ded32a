//! Split attention combined by its own kernel: the kernel-level `softmax_combine` that the
//! online-softmax rewrite ([`super::softmax`]) places after a split attention kernel, performed
//! by that kernel instead of a launch of its own.
//!
//! The rewritten kernel's blocks each hold one key split of a block of query rows, and write
//! three partials (O, l, m) that the combining step reads back: a second launch, and a round
//! trip of the partials through device memory. Two forms fold that step into the attention
//! kernel ([`CombineForm`]):
//!
//! * **In the last block** ([`LastBlockCombine`], `--last-block-combine`): every block stores
//!   its partials as before, then arrives on a counter of its group (the blocks that share its
//!   query rows, one per key split; [`LastBlockCombine::counters`] in the workspace). The block
//!   that arrives last, seeing every other block's partials behind the counter's release and
//!   acquire, reads the group's partials back (from L2, where they were just written), combines
//!   them as `softmax_combine` does (M the largest m, wₛ = exp(mₛ − M), Σ wₛ·Oₛ / Σ wₛ·lₛ) and
//!   stores the rows, and sets the counter back to zero. No block waits for another. The
//!   counters are the workspace's last bytes: zero before the first execution (the caller's
//!   contract, `LaunchPlan::counter_bytes`), zero again after every one. Runtime:
//!   `mucc::tb::arrive_last` and `mucc::tb::combine_splits` (`mucc/threadblock/arrival.h`). Off
//!   by default: on an NVIDIA H100 the attention kernels took 3–8.5 µs longer than with the
//!   combining kernel (2.8–3.5 µs) they saved — the last block of each group combines alone,
//!   after every load of its group is done (docs/benchmarks.md, "Not adopted").
//! * **In its clusters** ([`ClusterCombine`], sm_90a, `--cluster-combine`): where the key
//!   splits are 2 to [`MAX_CTAS`] blocks along one grid axis, the kernel is launched with
//!   clusters of exactly those blocks (`__cluster_dims__` along that axis). After the loop each
//!   CTA's partials are in its shared memory in f32 (the accumulators' tiles); behind a cluster
//!   barrier, CTA r of the cluster reads every CTA's rows [r·R/S, (r + 1)·R/S) of them through
//!   distributed shared memory, combines them and stores them; a second barrier keeps every
//!   CTA's shared memory alive until the others have read it. The partial outputs are not
//!   written. Runtime: `mucc::tb::cluster_softmax_combine` (`mucc/threadblock/cluster.h`). Off
//!   by default: on an NVIDIA H200 the attention kernels launched in clusters took longer than
//!   the combining kernel they saved (docs/benchmarks.md, "Not adopted").
//!
//! Where a rule does not hold the combining kernel stays, and the plan says why ([`NoFold`]).

use std::collections::BTreeMap;
use std::fmt;

use crate::graph::arena::Handle;
use crate::graph::dtype::DType;
use crate::graph::kernel::{KernelGraph, KnOpKind};
use crate::graph::ops::{AXIS_NAMES, AccumKind};
use crate::graph::threadblock::{TbGraph, TbOpKind};

use super::kernel_level::KnOpPlan;
use super::order::Step;
use super::plan::{Binding, BlockRegion, DTensorGeometry, KernelPlan, Placement};

/// Most CTAs of a cluster that combines (the portable cluster size; more key splits keep the
/// combining kernel).
pub const MAX_CTAS: usize = 8;

/// How a `softmax_combine` runs ([`KnOpPlan::SoftmaxCombine`]'s `form`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CombineForm {
    /// A kernel of its own (`mucc::kn::softmax_combine`), and why the attention kernel's
    /// clusters do not combine.
    Kernel(NoFold),
    /// Performed by the clusters of kernel operator `kernel` ([`KernelPlan::cluster_combine`]);
    /// no launch of its own.
    InCluster {
        /// The attention kernel (kernel operator index).
        kernel: usize,
    },
    /// Performed by the last block of each group of kernel operator `kernel` to finish
    /// ([`KernelPlan::last_block_combine`]); no launch of its own.
    LastBlock {
        /// The attention kernel (kernel operator index).
        kernel: usize,
    },
}

impl CombineForm {
    /// The attention kernel that performs the combining step, if one does.
    pub fn folded_into(&self) -> Option<usize> {
        match self {
            CombineForm::Kernel(_) => None,
            CombineForm::InCluster { kernel } | CombineForm::LastBlock { kernel } => Some(*kernel),
        }
    }
}

/// Where a partial of a last-block combine is read back: the tensor its writer stores it into,
/// the block's region of it (the key-split axis left out) and the elements between consecutive
/// key splits' tiles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartialRead {
    /// The kernel output (index among the kernel's outputs) that holds the partial.
    pub output: usize,
    /// The partial tensor's element strides, per dim of its tile.
    pub strides: Vec<usize>,
    /// Where split 0's tile of this block's rows starts.
    pub region: BlockRegion,
    /// Elements from one key split's tile to the next.
    pub step: usize,
}

/// The combining step a split attention kernel performs in the last block of each group of
/// blocks that share their query rows (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LastBlockCombine {
    /// The `softmax_combine` it performs (kernel operator index).
    pub combine: usize,
    /// The grid axis of the key splits: a group is the blocks along it.
    pub axis: usize,
    /// Blocks per group: the key splits.
    pub splits: usize,
    /// The shape of the O tile, whose rows the partials' and the output's layouts walk
    /// ([`LastBlockCombine::rows`] rows of [`LastBlockCombine::d`]).
    pub tile: crate::graph::Shape,
    /// The partial outputs O, row sums l and row maxima m, as stored by the kernel.
    pub o: PartialRead,
    /// See `o`.
    pub l: PartialRead,
    /// See `o`.
    pub m: PartialRead,
    /// Elements per load of O and per store of the output (8, 4, 2 or 1: the widest that the
    /// rows, strides, regions and split steps allow, at most 16 bytes).
    pub vector: usize,
    /// The combining step's output.
    pub out: Binding,
    /// Its element strides, per dim of the O tile.
    pub out_strides: Vec<usize>,
    /// Where this block's rows of it start (the key-split axis does not step).
    pub region: BlockRegion,
    /// The workspace byte offset of the kernel's `u32` counters, one per group: this block's
    /// group's is element `counter_index`.
    pub counters: usize,
    /// This block's group among the kernel's groups (the block index along the other axes,
    /// as an element offset into the counters).
    pub counter_index: BlockRegion,
    /// Groups: counters the kernel uses.
    pub groups: usize,
}

/// The combining step a split attention kernel performs in its clusters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterCombine {
    /// The `softmax_combine` it performs (kernel operator index).
    pub combine: usize,
    /// The grid axis of the key splits: the cluster's CTAs are consecutive along it.
    pub axis: usize,
    /// CTAs per cluster: the key splits.
    pub ctas: usize,
    /// The tiles of the partial output O (`rows × d`), of the row sums l and of the running
    /// row maxima m (one element per row), in shared memory in f32 after the loop.
    pub o_tile: usize,
    /// See `o_tile`.
    pub l_tile: usize,
    /// See `o_tile`.
    pub m_tile: usize,
    /// The block's rows (elements of the O tile over its last dim).
    pub rows: usize,
    /// Elements per row (the O tile's last dim, the output's last dim).
    pub d: usize,
    /// Rows each CTA combines and stores (⌈rows / ctas⌉; CTA r takes rows from r times this).
    pub rows_per_cta: usize,
    /// The threadblock output operators that no longer run (they wrote O, l and m).
    pub skipped: Vec<usize>,
    /// The combining step's output.
    pub out: Binding,
    /// Its element strides, per dim of the O tile.
    pub out_strides: Vec<usize>,
    /// Where this block's rows of it start (the key-split axis does not step).
    pub region: BlockRegion,
}

impl ClusterCombine {
    /// The cluster's shape (`__cluster_dims__`): `ctas` along [`ClusterCombine::axis`].
    pub fn dims(&self) -> [usize; 3] {
        let mut d = [1; 3];
        d[self.axis] = self.ctas;
        d
    }
}

/// Why a `softmax_combine` keeps its own kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoFold {
    /// Not the Hopper path, and the last-block form is off by default (`--last-block-combine`).
    Off,
    /// Not the Hopper path (clusters are sm_90a), and the last-block form is off.
    NotHopper,
    /// Both forms are off by default (`--last-block-combine`, `--cluster-combine`; sm_90a).
    OffByDefault,
    /// Its partials are not all written by one threadblock kernel.
    NotOneKernel,
    /// A step runs between the attention kernel and the combining step.
    StepBetween {
        /// That kernel operator.
        op: usize,
    },
    /// A partial is read by another operator too, or is a graph output.
    PartialReadElsewhere {
        /// The partial's DTensor.
        tensor: usize,
    },
    /// The output is no caller buffer (a workspace tensor written earlier than planned could
    /// overlap tensors that are still live).
    OutputInWorkspace,
    /// The kernel's for-loop is split over a cluster already.
    LoopSplit,
    /// The kernel performs a fused all-reduce.
    Exchange,
    /// The kernel keeps every tile in registers (register rows).
    RegisterRows,
    /// More key splits than a portable cluster holds.
    TooManySplits {
        /// The key splits.
        splits: usize,
    },
    /// No single grid axis of the splits' extent steps the partials' last dim, in the tiles
    /// of an accumulator of the expected kind.
    Shape(&'static str),
    /// A partial's tile is not kept in shared memory in f32 or f64.
    PartialTile {
        /// The tile.
        tile: usize,
    },
    /// The kernel runs other steps after its loop than the three partials' outputs.
    OtherPostLoopSteps,
}

impl fmt::Display for NoFold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoFold::Off => f.write_str(
                "off by default, measured slower (--last-block-combine: its last block per \
                 group of key splits combines; clusters are sm_90a)",
            ),
            NoFold::NotHopper => {
                f.write_str("clusters are sm_90a (Hopper path), and --last-block-combine is off")
            }
            NoFold::OffByDefault => f.write_str(
                "off by default, both forms measured slower (--last-block-combine: its last \
                 block per group of key splits combines; --cluster-combine: its clusters)",
            ),
            NoFold::NotOneKernel => {
                f.write_str("its partials are not all written by one threadblock kernel")
            }
            NoFold::StepBetween { op } => write!(
                f,
                "kernel op {op} runs between the attention kernel and the combining step"
            ),
            NoFold::PartialReadElsewhere { tensor } => write!(
                f,
                "the partial %{tensor} is also read elsewhere (or is a graph output)"
            ),
            NoFold::OutputInWorkspace => f.write_str(
                "its output is an intermediate in the workspace (written by the attention \
                 kernel, it could overlap tensors still live there)",
            ),
            NoFold::LoopSplit => {
                f.write_str("the attention kernel's for-loop is split over several CTAs already")
            }
            NoFold::Exchange => f.write_str("the attention kernel performs a fused all-reduce"),
            NoFold::RegisterRows => {
                f.write_str("the attention kernel keeps its tiles in registers (register rows)")
            }
            NoFold::TooManySplits { splits } => write!(
                f,
                "{splits} key splits: a portable cluster holds at most {MAX_CTAS} CTAs"
            ),
            NoFold::Shape(why) => write!(f, "the partials' shape: {why}"),
            NoFold::PartialTile { tile } => write!(
                f,
                "the partial tile s{tile} is not kept in shared memory in f32 or f64"
            ),
            NoFold::OtherPostLoopSteps => f.write_str(
                "the attention kernel runs other steps after its loop than the partials' outputs",
            ),
        }
    }
}

/// Which forms of folding [`fuse_softmax_combines`] may choose.
#[derive(Clone, Copy, Debug)]
pub(super) struct FoldChoice {
    /// The Hopper path (clusters).
    pub hopper: bool,
    /// `--cluster-combine`.
    pub cluster: bool,
    /// `--last-block-combine`.
    pub last_block: bool,
    /// Where the arrival counters start: the workspace's byte offset past every buffer.
    pub counters_at: usize,
}

/// Decides, for every `softmax_combine` of a plan, whether the attention kernel performs it —
/// in its clusters where asked for and possible, else in its last blocks where asked for and
/// possible — records the decision in the combine's `form` and the kernel's
/// [`KernelPlan::cluster_combine`] or [`KernelPlan::last_block_combine`], and drops a cluster
/// combine's partial outputs from its kernel's schedule. Returns the bytes of arrival counters
/// placed from `choice.counters_at` (0: none).
pub(super) fn fuse_softmax_combines(
    g: &KernelGraph,
    dt: &[DTensorGeometry],
    kernel_ops: &mut [KnOpPlan],
    kernels: &mut BTreeMap<usize, KernelPlan>,
    choice: FoldChoice,
) -> usize {
    let mut counters = 0usize;
    for i in 0..kernel_ops.len() {
        if !matches!(kernel_ops[i], KnOpPlan::SoftmaxCombine { .. }) {
            continue;
        }
        let in_cluster = if choice.cluster && choice.hopper {
            decide(g, dt, kernel_ops, kernels, i)
        } else if choice.cluster {
            Err(NoFold::NotHopper)
        } else {
            Err(NoFold::OffByDefault)
        };
        let form = match in_cluster {
            Ok((k, c)) => {
                if let Some(kp) = kernels.get_mut(&k) {
                    kp.schedule.post_loop.clear();
                    for &o in &c.skipped {
                        kp.regions[o] = None;
                    }
                    kp.cluster_combine = Some(c);
                }
                CombineForm::InCluster { kernel: k }
            }
            Err(_) if choice.last_block => {
                let at = choice.counters_at + counters * 4;
                match decide_last_block(g, dt, kernel_ops, kernels, i, at) {
                    Ok((k, c)) => {
                        counters += c.groups;
                        if let Some(kp) = kernels.get_mut(&k) {
                            kp.last_block_combine = Some(c);
                        }
                        CombineForm::LastBlock { kernel: k }
                    }
                    Err(why) => CombineForm::Kernel(why),
                }
            }
            Err(why) if choice.cluster => CombineForm::Kernel(why),
            Err(_) if !choice.hopper => CombineForm::Kernel(NoFold::Off),
            Err(why) => CombineForm::Kernel(why),
        };
        if let KnOpPlan::SoftmaxCombine { form: f, .. } = &mut kernel_ops[i] {
            *f = form;
        }
    }
    (counters * 4).next_multiple_of(super::plan::WORKSPACE_ALIGN) * usize::from(counters > 0)
}

/// What both forms of folding need of a combining step and its attention kernel: they are
/// found, or the reason why the step keeps its kernel.
struct Found {
    /// The attention kernel (kernel operator index).
    k: usize,
    /// Key splits.
    splits: usize,
    /// The threadblock outputs writing O, l and m.
    writers: [usize; 3],
    /// The accumulator tiles they copy.
    tiles: [usize; 3],
    /// The kernel outputs (indices among the kernel's outputs) holding O, l and m.
    outputs: [usize; 3],
    /// The partial tensors O, l and m.
    partials: [usize; 3],
    /// Rows and elements per row of the O tile.
    rows: usize,
    d: usize,
    /// The key-split grid axis.
    axis: usize,
    /// The dim map of O's writer (an output operator).
    omap: crate::graph::ops::DimMap,
    /// The combining step's output tensor.
    y: usize,
}

/// The checks both forms share (see [`Found`]).
fn locate(
    g: &KernelGraph,
    dt: &[DTensorGeometry],
    kernel_ops: &[KnOpPlan],
    kernels: &BTreeMap<usize, KernelPlan>,
    i: usize,
) -> Result<Found, NoFold> {
    let op = &g.ops[Handle::from_index(i)];
    let KnOpKind::SoftmaxCombine { splits } = op.kind else {
        return Err(NoFold::NotOneKernel);
    };
    let [o, l, m] = op.inputs[..] else {
        return Err(NoFold::NotOneKernel);
    };
    let [y] = op.outputs[..] else {
        return Err(NoFold::NotOneKernel);
    };
    let k = g.producer(o).map(|h| h.index());
    if k.is_none()
        || [l, m]
            .iter()
            .any(|&t| g.producer(t).map(|h| h.index()) != k)
    {
        return Err(NoFold::NotOneKernel);
    }
    let k = k.unwrap_or_default();
    let kop = &g.ops[Handle::from_index(k)];
    let (Some(kp), KnOpKind::Customized(tb)) = (kernels.get(&k), &kop.kind) else {
        return Err(NoFold::NotOneKernel);
    };
    if let Some(j) = (k + 1..i).find(|&j| !matches!(kernel_ops[j], KnOpPlan::Nothing)) {
        return Err(NoFold::StepBetween { op: j });
    }
    for t in [o, l, m] {
        let elsewhere = g
            .ops
            .iter()
            .any(|(h, r)| h.index() != i && r.inputs.contains(&t));
        if elsewhere {
            return Err(NoFold::PartialReadElsewhere { tensor: t.index() });
        }
    }
    if !matches!(dt[y.index()].placement, Placement::Output(_)) {
        return Err(NoFold::OutputInWorkspace);
    }
    if kp.split.ctas() > 1 {
        return Err(NoFold::LoopSplit);
    }
    if kp.exchange.is_some() {
        return Err(NoFold::Exchange);
    }
    if kp.rows().is_some() {
        return Err(NoFold::RegisterRows);
    }
    if splits < 2 {
        return Err(NoFold::Shape("one key split: nothing to combine"));
    }
    // The threadblock outputs writing each partial, and the accumulator tiles they copy.
    let writer = |t| -> Result<(usize, usize, usize), NoFold> {
        let j = kop.outputs.iter().position(|&x| x == t);
        let ws = j.map(|j| tb.output_writers(j)).unwrap_or_default();
        match (&ws[..], j) {
            ([w], Some(j)) => Ok((w.index(), tb.ops[*w].inputs[0].index(), j)),
            _ => Err(NoFold::Shape(
                "a partial is not written by exactly one threadblock output",
            )),
        }
    };
    let (wo, o_tile, jo) = writer(o)?;
    let (wl, l_tile, jl) = writer(l)?;
    let (wm, m_tile, jm) = writer(m)?;
    let os = tb.tensors[Handle::from_index(o_tile)].shape;
    let rank = os.rank();
    let d = os.dim(rank - 1);
    let rows = os.numel() / d.max(1);
    // l and m: O's tile with its last dim 1 (the same rows, in the same dims).
    let row_tile = |t: usize| tb.tensors[Handle::from_index(t)].shape == os.with_dim(rank - 1, 1);
    if !row_tile(l_tile) || !row_tile(m_tile) {
        return Err(NoFold::Shape("l and m are not one element per row of O"));
    }
    let ys = g.tensors[y].shape;
    if ys.rank() != rank || ys.dim(rank - 1) != d || g.tensors[y].dtype != g.tensors[o].dtype {
        return Err(NoFold::Shape("the output's rows are not the O tile's"));
    }
    // The key-split axis: the one grid axis that steps O's, l's and m's last dim.
    let omap = |w: usize| match tb.ops[Handle::from_index(w)].kind {
        TbOpKind::Output { omap, .. } => Some(omap),
        _ => None,
    };
    let (Some(mo), Some(ml), Some(mm)) = (omap(wo), omap(wl), omap(wm)) else {
        return Err(NoFold::Shape("a partial's writer is no output"));
    };
    let last = rank - 1;
    let axes: Vec<usize> = (0..3)
        .filter(|&a| tb.grid[a] > 1 && mo.axis(a) == Some(last))
        .collect();
    let [axis] = axes[..] else {
        return Err(NoFold::Shape(
            "not exactly one grid axis steps O's last dim",
        ));
    };
    let same = (0..3).all(|a| ml.axis(a) == mo.axis(a) && mm.axis(a) == mo.axis(a));
    if tb.grid[axis] != splits || !same {
        return Err(NoFold::Shape(
            "the key-split axis does not step l and m as it steps O, or its extent is not the \
             splits'",
        ));
    }
    Ok(Found {
        k,
        splits,
        writers: [wo, wl, wm],
        tiles: [o_tile, l_tile, m_tile],
        outputs: [jo, jl, jm],
        partials: [o.index(), l.index(), m.index()],
        rows,
        d,
        axis,
        omap: mo,
        y: y.index(),
    })
}

/// The kernel that performs combining step `i` in its last blocks, and how; or why none does.
/// Its group counters start at workspace byte `counters_at`.
fn decide_last_block(
    g: &KernelGraph,
    dt: &[DTensorGeometry],
    kernel_ops: &[KnOpPlan],
    kernels: &BTreeMap<usize, KernelPlan>,
    i: usize,
    counters_at: usize,
) -> Result<(usize, LastBlockCombine), NoFold> {
    let f = locate(g, dt, kernel_ops, kernels, i)?;
    let KnOpKind::Customized(tb) = &g.ops[Handle::from_index(f.k)].kind else {
        return Err(NoFold::NotOneKernel);
    };
    let kp = &kernels[&f.k];
    let tile = tb.tensors[Handle::from_index(f.tiles[0])].shape;
    let read = |n: usize| -> Result<PartialRead, NoFold> {
        let Some(region) = &kp.regions[f.writers[n]] else {
            return Err(NoFold::Shape("a partial's writer has no block region"));
        };
        let Some(step) = region
            .steps
            .iter()
            .find(|&&(a, _)| a == f.axis)
            .map(|&(_, e)| e)
            .filter(|&e| e > 0)
        else {
            return Err(NoFold::Shape(
                "the key-split axis does not move a partial's block region",
            ));
        };
        Ok(PartialRead {
            output: f.outputs[n],
            strides: dt[f.partials[n]].strides.0.clone(),
            region: BlockRegion {
                steps: region
                    .steps
                    .iter()
                    .copied()
                    .filter(|&(a, _)| a != f.axis)
                    .collect(),
                per_iter: 0,
            },
            step,
        })
    };
    let (o, l, m) = (read(0)?, read(1)?, read(2)?);
    let out_strides = dt[f.y].strides.0.clone();
    let region = super::kernel::output_region(tb, f.omap, &tile, &out_strides, Some(f.axis));
    let out = Binding::of(
        dt[f.y].placement,
        g.tensors[Handle::from_index(f.y)].dtype.bytes(),
    );
    let elem = g.tensors[Handle::from_index(f.y)].dtype.bytes();
    let last = tile.rank() - 1;
    // The widest vector (≤ 16 bytes) that every row of O and of the output starts at, and
    // whose elements are consecutive in both.
    let vector = [8usize, 4, 2]
        .into_iter()
        .find(|&v| {
            let ok = |strides: &[usize], region: &BlockRegion, step: usize| {
                strides[last] == 1
                    && strides[..last].iter().all(|s| s.is_multiple_of(v))
                    && region.steps.iter().all(|&(_, e)| e.is_multiple_of(v))
                    && step.is_multiple_of(v)
            };
            v * elem <= 16
                && f.d.is_multiple_of(v)
                && ok(&o.strides, &o.region, o.step)
                && ok(&out_strides, &region, 0)
        })
        .unwrap_or(1);
    // A group per block index along the other axes, numbered x fastest.
    let mut steps = Vec::new();
    let mut groups = 1;
    for a in (0..3).filter(|&a| a != f.axis) {
        if tb.grid[a] > 1 {
            steps.push((a, groups));
        }
        groups *= tb.grid[a];
    }
    Ok((
        f.k,
        LastBlockCombine {
            combine: i,
            axis: f.axis,
            splits: f.splits,
            tile,
            o,
            l,
            m,
            vector,
            out,
            out_strides,
            region,
            counters: counters_at,
            counter_index: BlockRegion { steps, per_iter: 0 },
            groups,
        },
    ))
}

/// The kernel that performs combining step `i` in its clusters, and how; or why none does.
fn decide(
    g: &KernelGraph,
    dt: &[DTensorGeometry],
    kernel_ops: &[KnOpPlan],
    kernels: &BTreeMap<usize, KernelPlan>,
    i: usize,
) -> Result<(usize, ClusterCombine), NoFold> {
    let f = locate(g, dt, kernel_ops, kernels, i)?;
    let KnOpKind::Customized(tb) = &g.ops[Handle::from_index(f.k)].kind else {
        return Err(NoFold::NotOneKernel);
    };
    let kp = &kernels[&f.k];
    if f.splits > MAX_CTAS {
        return Err(NoFold::TooManySplits { splits: f.splits });
    }
    let [o_tile, l_tile, m_tile] = f.tiles;
    let kinds = [
        (o_tile, AccumKind::NoredRescale),
        (l_tile, AccumKind::RedLdSumRescale),
        (m_tile, AccumKind::Max),
    ];
    for (tile, kind) in kinds {
        if accumulator_kind(tb, tile) != Some(kind) {
            return Err(NoFold::Shape(
                "a partial's tile is not the accumulator of its kind (O: accum_nored_rescale, \
                 l: accum_red_ld_sum_rescale, m: accum_max)",
            ));
        }
        let kept = kp.smem.buffer_of(tile).is_some()
            && matches!(
                kp.tiles[tile].as_ref().map(|t| t.dtype),
                Some(DType::F32 | DType::F64)
            );
        if !kept {
            return Err(NoFold::PartialTile { tile });
        }
    }
    let os = tb.tensors[Handle::from_index(o_tile)].shape;
    let out_strides = dt[f.y].strides.0.clone();
    let region = super::kernel::output_region(tb, f.omap, &os, &out_strides, Some(f.axis));
    let post_only_outputs = kp.schedule.post_loop.iter().all(|s| match s {
        Step::Barrier(_) => true,
        Step::Run(c) => {
            let members = &kp.fusion.chains[*c].ops;
            members.len() == 1 && f.writers.contains(&members[0].index())
        }
    });
    if !post_only_outputs {
        return Err(NoFold::OtherPostLoopSteps);
    }
    let y = Handle::from_index(f.y);
    let out = Binding::of(dt[f.y].placement, g.tensors[y].dtype.bytes());
    Ok((
        f.k,
        ClusterCombine {
            combine: i,
            axis: f.axis,
            ctas: f.splits,
            o_tile,
            l_tile,
            m_tile,
            rows: f.rows,
            d: f.d,
            rows_per_cta: f.rows.div_ceil(f.splits),
            skipped: f.writers.to_vec(),
            out,
            out_strides,
            region,
        },
    ))
}

/// The kind of the accumulator whose output is tile `t`, if an accumulator writes it.
fn accumulator_kind(tb: &TbGraph, t: usize) -> Option<AccumKind> {
    match tb.ops[tb.producer(Handle::from_index(t))?].kind {
        TbOpKind::Accum(kind) => Some(kind),
        _ => None,
    }
}

impl fmt::Display for ClusterCombine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [x, y, z] = self.dims();
        write!(
            f,
            "kernel op {} (softmax_combine) runs in this kernel's clusters: __cluster_dims__({x}, \
             {y}, {z}), the {} CTAs along {} (its key splits) read each other's partials (s{}, \
             s{}, s{}) through distributed shared memory between two cluster barriers; CTA r \
             stores rows [r·{}, (r + 1)·{}) of the block's {} × {} output at {}; the outputs of \
             ops {} do not run",
            self.combine,
            self.ctas,
            AXIS_NAMES[self.axis],
            self.o_tile,
            self.l_tile,
            self.m_tile,
            self.rows_per_cta,
            self.rows_per_cta,
            self.rows,
            self.d,
            self.region,
            self.skipped
                .iter()
                .map(|o| o.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        )
    }
}

impl LastBlockCombine {
    /// Elements per row: the O tile's last dim (the output's last dim).
    pub fn d(&self) -> usize {
        self.tile.dim(self.tile.rank() - 1)
    }

    /// The block's rows: the O tile's elements over its last dim.
    pub fn rows(&self) -> usize {
        self.tile.numel() / self.d().max(1)
    }

    /// Where the kernel's counters are (its launch argument).
    pub fn counter_binding(&self) -> Binding {
        Binding::Workspace {
            byte_offset: self.counters,
            elem_offset: 0,
            elem_bytes: 4,
        }
    }
}

impl fmt::Display for LastBlockCombine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "kernel op {} (softmax_combine) runs in this kernel's last blocks: the {} blocks \
             along {} (its key splits) of each of the {} groups store their partials, then \
             arrive on the group's counter ({} u32 at workspace +{}, + {}; zero before the first call, \
             set back to zero by the last to arrive); the last reads the {} splits' O (out{} at \
             {}, + split·{}), l (out{} at {}, + split·{}) and m (out{} at {}, + split·{}) back \
             and stores the block's {} × {} output at {}, {}-element vectors",
            self.combine,
            self.splits,
            AXIS_NAMES[self.axis],
            self.groups,
            self.groups,
            self.counters,
            self.counter_index,
            self.splits,
            self.o.output,
            self.o.region,
            self.o.step,
            self.l.output,
            self.l.region,
            self.l.step,
            self.m.output,
            self.m.region,
            self.m.step,
            self.rows(),
            self.d(),
            self.region,
            self.vector,
        )
    }
}
