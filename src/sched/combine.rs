//! Split attention combined in its own clusters (sm_90a): the kernel-level `softmax_combine`
//! that the online-softmax rewrite ([`super::softmax`]) places after a split attention kernel,
//! performed by that kernel instead.
//!
//! The rewritten kernel's blocks each hold one key split of a block of query rows, and write
//! three partials (O, l, m) that the combining step reads back: a second launch, and a round
//! trip of the partials through device memory. Where the key splits are 2 to [`MAX_CTAS`]
//! blocks along one grid axis, the kernel is launched with clusters of exactly those blocks
//! (`__cluster_dims__` along that axis). After the loop each CTA's partials are in its shared
//! memory in f32 (the accumulators' tiles); behind a cluster barrier, CTA r of the cluster reads
//! every CTA's rows [r·R/S, (r + 1)·R/S) of them through distributed shared memory, combines
//! them as `softmax_combine` does (M the largest m, wₛ = exp(mₛ − M), Σ wₛ·Oₛ / Σ wₛ·lₛ) and
//! stores them into the combining step's output; a second barrier keeps every CTA's shared
//! memory alive until the others have read it. The partial outputs are not written, and the
//! combining step launches nothing ([`CombineForm::InCluster`]). Runtime:
//! `mucc::tb::cluster_softmax_combine` (`mucc/threadblock/cluster.h`).
//!
//! Off by default (`--cluster-combine` turns it on): on an NVIDIA H200 the attention kernels
//! launched in clusters took longer than the combining kernel they saved (docs/benchmarks.md,
//! "Split attention combined in its clusters"). Where a rule does not hold the combining kernel
//! stays, and the plan says why ([`NoClusterCombine`]).

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
    Kernel(NoClusterCombine),
    /// Performed by the clusters of kernel operator `kernel` ([`KernelPlan::cluster_combine`]);
    /// no launch of its own.
    InCluster {
        /// The attention kernel (kernel operator index).
        kernel: usize,
    },
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
pub enum NoClusterCombine {
    /// Not the Hopper path (clusters are sm_90a).
    NotHopper,
    /// Off by default (`--cluster-combine` turns it on).
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

impl fmt::Display for NoClusterCombine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoClusterCombine::NotHopper => f.write_str("clusters are sm_90a (Hopper path)"),
            NoClusterCombine::OffByDefault => f.write_str(
                "off by default, measured slower on an H200 (--cluster-combine turns it on)",
            ),
            NoClusterCombine::NotOneKernel => {
                f.write_str("its partials are not all written by one threadblock kernel")
            }
            NoClusterCombine::StepBetween { op } => write!(
                f,
                "kernel op {op} runs between the attention kernel and the combining step"
            ),
            NoClusterCombine::PartialReadElsewhere { tensor } => write!(
                f,
                "the partial %{tensor} is also read elsewhere (or is a graph output)"
            ),
            NoClusterCombine::OutputInWorkspace => f.write_str(
                "its output is an intermediate in the workspace (written by the attention \
                 kernel, it could overlap tensors still live there)",
            ),
            NoClusterCombine::LoopSplit => {
                f.write_str("the attention kernel's for-loop is split over a cluster already")
            }
            NoClusterCombine::Exchange => {
                f.write_str("the attention kernel performs a fused all-reduce")
            }
            NoClusterCombine::RegisterRows => {
                f.write_str("the attention kernel keeps its tiles in registers (register rows)")
            }
            NoClusterCombine::TooManySplits { splits } => write!(
                f,
                "{splits} key splits: a portable cluster holds at most {MAX_CTAS} CTAs"
            ),
            NoClusterCombine::Shape(why) => write!(f, "the partials' shape: {why}"),
            NoClusterCombine::PartialTile { tile } => write!(
                f,
                "the partial tile s{tile} is not kept in shared memory in f32 or f64"
            ),
            NoClusterCombine::OtherPostLoopSteps => f.write_str(
                "the attention kernel runs other steps after its loop than the partials' outputs",
            ),
        }
    }
}

/// Decides, for every `softmax_combine` of a plan, whether the attention kernel's clusters
/// perform it: records the decision in the combine's `form` and the kernel's
/// [`KernelPlan::cluster_combine`], and drops the kernel's partial outputs from its schedule.
pub(super) fn fuse_softmax_combines(
    g: &KernelGraph,
    dt: &[DTensorGeometry],
    kernel_ops: &mut [KnOpPlan],
    kernels: &mut BTreeMap<usize, KernelPlan>,
    hopper: bool,
    on: bool,
) {
    for i in 0..kernel_ops.len() {
        if !matches!(kernel_ops[i], KnOpPlan::SoftmaxCombine { .. }) {
            continue;
        }
        let decided = if !hopper {
            Err(NoClusterCombine::NotHopper)
        } else if !on {
            Err(NoClusterCombine::OffByDefault)
        } else {
            decide(g, dt, kernel_ops, kernels, i)
        };
        let form = match decided {
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
            Err(why) => CombineForm::Kernel(why),
        };
        if let KnOpPlan::SoftmaxCombine { form: f, .. } = &mut kernel_ops[i] {
            *f = form;
        }
    }
}

/// The kernel that performs combining step `i` in its clusters, and how; or why none does.
fn decide(
    g: &KernelGraph,
    dt: &[DTensorGeometry],
    kernel_ops: &[KnOpPlan],
    kernels: &BTreeMap<usize, KernelPlan>,
    i: usize,
) -> Result<(usize, ClusterCombine), NoClusterCombine> {
    let op = &g.ops[Handle::from_index(i)];
    let KnOpKind::SoftmaxCombine { splits } = op.kind else {
        return Err(NoClusterCombine::NotOneKernel);
    };
    let [o, l, m] = op.inputs[..] else {
        return Err(NoClusterCombine::NotOneKernel);
    };
    let [y] = op.outputs[..] else {
        return Err(NoClusterCombine::NotOneKernel);
    };
    let k = g.producer(o).map(|h| h.index());
    if k.is_none()
        || [l, m]
            .iter()
            .any(|&t| g.producer(t).map(|h| h.index()) != k)
    {
        return Err(NoClusterCombine::NotOneKernel);
    }
    let k = k.unwrap_or_default();
    let kop = &g.ops[Handle::from_index(k)];
    let (Some(kp), KnOpKind::Customized(tb)) = (kernels.get(&k), &kop.kind) else {
        return Err(NoClusterCombine::NotOneKernel);
    };
    if let Some(j) = (k + 1..i).find(|&j| !matches!(kernel_ops[j], KnOpPlan::Nothing)) {
        return Err(NoClusterCombine::StepBetween { op: j });
    }
    for t in [o, l, m] {
        let elsewhere = g
            .ops
            .iter()
            .any(|(h, r)| h.index() != i && r.inputs.contains(&t));
        if elsewhere {
            return Err(NoClusterCombine::PartialReadElsewhere { tensor: t.index() });
        }
    }
    if !matches!(dt[y.index()].placement, Placement::Output(_)) {
        return Err(NoClusterCombine::OutputInWorkspace);
    }
    if kp.split.cluster().is_some() {
        return Err(NoClusterCombine::LoopSplit);
    }
    if kp.exchange.is_some() {
        return Err(NoClusterCombine::Exchange);
    }
    if kp.rows().is_some() {
        return Err(NoClusterCombine::RegisterRows);
    }
    if splits > MAX_CTAS {
        return Err(NoClusterCombine::TooManySplits { splits });
    }
    if splits < 2 {
        return Err(NoClusterCombine::Shape("one key split: nothing to combine"));
    }
    // The threadblock outputs writing each partial, and the accumulator tiles they copy.
    let writer = |t| -> Result<(usize, usize), NoClusterCombine> {
        let ws = kop
            .outputs
            .iter()
            .position(|&x| x == t)
            .map(|j| tb.output_writers(j))
            .unwrap_or_default();
        match ws[..] {
            [w] => Ok((w.index(), tb.ops[w].inputs[0].index())),
            _ => Err(NoClusterCombine::Shape(
                "a partial is not written by exactly one threadblock output",
            )),
        }
    };
    let (wo, o_tile) = writer(o)?;
    let (wl, l_tile) = writer(l)?;
    let (wm, m_tile) = writer(m)?;
    let kinds = [
        (o_tile, AccumKind::NoredRescale),
        (l_tile, AccumKind::RedLdSumRescale),
        (m_tile, AccumKind::Max),
    ];
    for (tile, kind) in kinds {
        if accumulator_kind(tb, tile) != Some(kind) {
            return Err(NoClusterCombine::Shape(
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
            return Err(NoClusterCombine::PartialTile { tile });
        }
    }
    let os = tb.tensors[Handle::from_index(o_tile)].shape;
    let rank = os.rank();
    let d = os.dim(rank - 1);
    let rows = os.numel() / d.max(1);
    let row_tile = |t: usize| {
        let s = tb.tensors[Handle::from_index(t)].shape;
        s.rank() == rank && s.dim(rank - 1) == 1 && s.numel() == rows
    };
    if !row_tile(l_tile) || !row_tile(m_tile) {
        return Err(NoClusterCombine::Shape(
            "l and m are not one element per row of O",
        ));
    }
    let ys = g.tensors[y].shape;
    if ys.rank() != rank || ys.dim(rank - 1) != d || g.tensors[y].dtype != g.tensors[o].dtype {
        return Err(NoClusterCombine::Shape(
            "the output's rows are not the O tile's",
        ));
    }
    // The key-split axis: the one grid axis that steps O's, l's and m's last dim.
    let omap = |w: usize| match tb.ops[Handle::from_index(w)].kind {
        TbOpKind::Output { omap, .. } => Some(omap),
        _ => None,
    };
    let (Some(mo), Some(ml), Some(mm)) = (omap(wo), omap(wl), omap(wm)) else {
        return Err(NoClusterCombine::Shape("a partial's writer is no output"));
    };
    let last = rank - 1;
    let axes: Vec<usize> = (0..3)
        .filter(|&a| tb.grid[a] > 1 && mo.axis(a) == Some(last))
        .collect();
    let [axis] = axes[..] else {
        return Err(NoClusterCombine::Shape(
            "not exactly one grid axis steps O's last dim",
        ));
    };
    let same = (0..3).all(|a| ml.axis(a) == mo.axis(a) && mm.axis(a) == mo.axis(a));
    if tb.grid[axis] != splits || !same {
        return Err(NoClusterCombine::Shape(
            "the key-split axis does not step l and m as it steps O, or its extent is not the \
             splits'",
        ));
    }
    let out_strides = dt[y.index()].strides.0.clone();
    let region = super::kernel::output_region(tb, mo, &os, &out_strides, Some(axis));
    let post_only_outputs = kp.schedule.post_loop.iter().all(|s| match s {
        Step::Barrier(_) => true,
        Step::Run(c) => {
            let members = &kp.fusion.chains[*c].ops;
            members.len() == 1 && [wo, wl, wm].contains(&members[0].index())
        }
    });
    if !post_only_outputs {
        return Err(NoClusterCombine::OtherPostLoopSteps);
    }
    let out = Binding::of(dt[y.index()].placement, g.tensors[y].dtype.bytes());
    let rows_per_cta = rows.div_ceil(splits);
    Ok((
        k,
        ClusterCombine {
            combine: i,
            axis,
            ctas: splits,
            o_tile,
            l_tile,
            m_tile,
            rows,
            d,
            rows_per_cta,
            skipped: vec![wo, wl, wm],
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
