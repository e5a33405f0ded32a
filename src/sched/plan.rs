//! The plan: every decision the generated code depends on, as typed data.
//!
//! [`super::plan()`] builds it; `explain` prints it; `emit` prints code from it and decides
//! nothing. A field here is a choice (a CTA shape, a warp grid, an instruction, a pipeline
//! depth, a copy width, a swizzle, an offset); what follows from the graph alone stays in the
//! graph.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::graph::DType;

use serde::{Deserialize, Serialize};

use super::kernel_level::KnOpPlan;
use super::memory::{Buffer, Packing};
use super::ops::OpPlan;
use super::order::Schedule;
use crate::graph::arena::Handle;
use crate::graph::fusion::{FusionPlan, Unfused};
use crate::graph::kernel::{DTensor, KnOp};
use crate::graph::shape::Strides;
use crate::graph::threadblock::{STensor, TbOp};
use crate::layout::solve::{LayoutError, LayoutPlan, SolveOptions};
use crate::layout::swizzle::TileGeometry;
use crate::target::Target;

/// Bytes reserved at the start of shared memory and kept zero: the source of out-of-bounds
/// `ldmatrix` lanes.
pub const ZERO_PAGE: usize = 16;
/// Alignment of workspace buffers.
pub const WORKSPACE_ALIGN: usize = 128;

/// Options of the planner.
#[derive(Clone, Debug)]
pub struct Options {
    /// The target.
    pub target: Target,
    /// Layout solver options.
    pub solve: SolveOptions,
    /// Which architecture's features threadblock kernels may use.
    pub path: PathChoice,
    /// Whether kernels may launch programmatically after the previous kernel (Hopper path,
    /// `--dependent-launch`). Off by default: on the H200 it made the multi-kernel attention
    /// graphs 1–10% slower (docs/benchmarks.md).
    pub dependent_launch: bool,
    /// Names of the generated file's symbols (default: kernels `k<op>_…`, host entry
    /// `mucc_execute`); prefixed so that several generated files link into one program.
    pub symbols: Symbols,
    /// Whether the Hopper path may split a kernel's for-loop over a cluster (on by default; a
    /// tuning variant turns it off).
    pub cluster_split: bool,
    /// Whether a cluster split's CTAs push their partials into CTA 0's shared memory
    /// ([`Gather::Push`]; on by default, `--no-cluster-push` folds them by CTA 0's reads).
    pub cluster_push: bool,
    /// Whether the Hopper path runs the combining step of split attention in the attention
    /// kernel's clusters ([`super::combine`], `--cluster-combine`). Off by default: measured
    /// slower on an H200 (docs/benchmarks.md).
    pub cluster_combine: bool,
    /// Whether split attention kernels run their combining step in the last block of each
    /// group of key splits to finish ([`super::combine::LastBlockCombine`],
    /// `--last-block-combine`; the workspace must then be zero before the first call). Off by
    /// default: measured slower on an H100 (docs/benchmarks.md).
    pub last_block_combine: bool,
    /// Whether kernels split their for-loop over CTAs that fold their partials through the
    /// workspace ([`GridSplit`], `--grid-split`): by default the planner's rule (the Ampere
    /// path's small grids); `Ctas(N)` wherever the rules hold, replacing a cluster split.
    pub grid_split: GridSplitChoice,
    /// Threads per CTA of threadblock kernels (`--warps`): the µGraph's `block_dim` is Mirage's
    /// guess, not semantics, so the planner may choose its own.
    pub cta: CtaChoice,
    /// Whether a matmul's product that another matmul takes as A may stay in registers
    /// ([`RegisterPipe`]; on by default, `--no-register-pipes` turns it off for comparison).
    pub register_pipes: bool,
    /// Whether kernels whose every operator is element-wise or a row norm over a one-iteration
    /// loop may keep every tile in registers ([`super::rows`]; on by default,
    /// `--no-register-rows` turns it off).
    pub register_rows: bool,
    /// Whether the Hopper path may run a register pipe's consumer matmul as `wgmma`
    /// ([`super::ops::MatmulInstr::WgmmaM64K16`]; on by default, `--no-wgmma` turns it off).
    pub wgmma: bool,
    /// Whether the Hopper path may load a for-loop's streamed tiles by bulk tensor copies
    /// ([`super::tma`]; on by default, `--no-tma` and the tuning variant `tma=off` keep every
    /// such tile on `cp.async`, which streams some decode weights faster).
    pub tma: bool,
    /// Whether a kernel-level matmul read only by a customized operator may be computed per
    /// tile inside it ([`super::rewrite`]; on by default, `--no-fuse-matmuls` turns it off).
    pub fuse_matmuls: bool,
    /// Where split attention kernels compute their softmax online, rescaling by a running max
    /// ([`super::softmax`]; by default where the rescaling stays in registers,
    /// `--online-softmax` chooses).
    pub online_softmax: super::softmax::SoftmaxChoice,
    /// Whether the online-softmax rewrite folds key splits into the attention kernel's loop
    /// ([`super::softmax::KeyFold`]; by default the planner's rule, `--fold-key-splits`
    /// chooses).
    pub fold_key_splits: super::softmax::KeyFold,
    /// The deepest pipeline ring (stages) a threadblock kernel may get, below the target's
    /// maximum (`None`: the target's, 4). A tuning variant and `--max-stages` lower it: a
    /// shallower ring takes less shared memory, so more CTAs stream at once.
    pub max_stages: Option<usize>,
    /// Blocks per SM the planner budgets shared memory and registers for in every threadblock
    /// kernel over shared-memory tiles (`--resident-blocks`; `None`: the planner's rule, 1 to
    /// 3 by block size, grid and wave fill). The launch bounds promise ptxas as many as shared
    /// memory holds, which caps a thread's registers.
    pub resident_blocks: Option<usize>,
    /// Which customized operators' for-loops are refined, and by how much ([`super::refine`]:
    /// R times the iterations over tiles R times thinner along the loop). By default the
    /// planner's rule ([`RefineChoice::Auto`]); `--refine-loops` and tuning variants ask for a
    /// factor everywhere the bodies allow.
    pub refine_loops: RefineChoice,
    /// Whether all-reduces stay NCCL calls or are fused into the kernel writing their input
    /// ([`super::exchange`]; NCCL by default: the fused form needs exchange buffers from the
    /// caller).
    pub all_reduce: super::exchange::AllReduceChoice,
}

impl Options {
    /// Default solver options and path for `target`.
    pub fn for_target(target: Target) -> Options {
        Options {
            target,
            solve: SolveOptions::default(),
            path: PathChoice::Auto,
            dependent_launch: false,
            symbols: Symbols::default(),
            cluster_split: true,
            cluster_push: true,
            cluster_combine: false,
            last_block_combine: false,
            grid_split: GridSplitChoice::Auto,
            cta: CtaChoice::Auto,
            register_pipes: true,
            register_rows: true,
            wgmma: true,
            tma: true,
            fuse_matmuls: true,
            online_softmax: super::softmax::SoftmaxChoice::Piped,
            fold_key_splits: super::softmax::KeyFold::Auto,
            all_reduce: super::exchange::AllReduceChoice::Nccl,
            max_stages: None,
            resident_blocks: None,
            refine_loops: RefineChoice::Auto,
        }
    }

    /// These options with the target's pipeline depth capped at [`Options::max_stages`].
    pub fn with_stage_cap(&self) -> Options {
        let mut o = self.clone();
        if let Some(s) = self.max_stages {
            o.target.max_pipeline_stages = o.target.max_pipeline_stages.min(s.max(1));
        }
        o
    }
}

/// Which customized operators' for-loops the planner refines ([`Options::refine_loops`],
/// [`super::refine`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RefineChoice {
    /// The planner's rule ([`super::refine::AUTO_FACTOR`]): a loop is refined where its
    /// kernel's grid has 4 or more blocks per SM but shared memory holds one block of the
    /// µGraph's CTA, and refined by [`super::refine::AUTO_FACTOR`] it holds
    /// [`super::refine::AUTO_BLOCKS`] blocks per SM.
    #[default]
    Auto,
    /// Every loop whose body allows it, by this factor (1: none; `--refine-loops N`).
    Factor(usize),
    /// Every loop whose body allows it and whose iterations the factor divides, coarsened by
    /// it ([`super::refine::LoopScale::Coarsen`]; `--coarsen-loops C`).
    Coarsen(usize),
}

impl RefineChoice {
    /// The choice that a refinement factor or a coarsening factor asks for (the refinement where
    /// both are given), `otherwise` where neither is.
    pub fn asked(refine: Option<usize>, coarsen: Option<usize>, otherwise: RefineChoice) -> Self {
        match (refine, coarsen) {
            (Some(r), _) => RefineChoice::Factor(r),
            (None, Some(c)) => RefineChoice::Coarsen(c),
            (None, None) => otherwise,
        }
    }

    /// The change asked for everywhere, if any (`Auto`: none).
    pub fn scale(self) -> Option<super::refine::LoopScale> {
        use super::refine::LoopScale;
        match self {
            RefineChoice::Auto => None,
            RefineChoice::Factor(f) => Some(LoopScale::Refine(f)),
            RefineChoice::Coarsen(c) => Some(LoopScale::Coarsen(c)),
        }
    }
}

impl fmt::Display for RefineChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RefineChoice::Auto => f.write_str("auto"),
            RefineChoice::Factor(r) => write!(f, "{r}"),
            RefineChoice::Coarsen(c) => write!(f, "1/{c}"),
        }
    }
}

/// The names of a generated file's external symbols: its kernels (`{kernel_prefix}k<op>_…`) and
/// its host entry. Two generated files whose symbols differ link into one program (the
/// build-script API gives each graph its own); the defaults are `k<op>_…` and `mucc_execute`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Symbols {
    kernel_prefix: String,
    entry: String,
}

/// The host entry's name by default.
pub const DEFAULT_ENTRY: &str = "mucc_execute";

impl Default for Symbols {
    fn default() -> Symbols {
        Symbols {
            kernel_prefix: String::new(),
            entry: DEFAULT_ENTRY.to_string(),
        }
    }
}

/// Whether `s` is a C identifier (ASCII letters, digits and `_`, not starting with a digit)
/// that neither holds `__` nor starts with `_` and a capital (names C++ reserves).
pub fn is_c_identifier(s: &str) -> bool {
    let b = s.as_bytes();
    let Some(&first) = b.first() else {
        return false;
    };
    let reserved =
        s.contains("__") || (first == b'_' && b.get(1).is_some_and(u8::is_ascii_uppercase));
    !first.is_ascii_digit()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
        && !reserved
}

impl Symbols {
    /// The longest kernel prefix.
    pub const MAX_KERNEL_PREFIX: usize = 24;
    /// The longest host entry name.
    pub const MAX_ENTRY: usize = 80;

    /// Kernels named `{kernel_prefix}k<op>_…` and the host entry `entry`; both must make C
    /// identifiers (the prefix may be empty), the prefix of at most
    /// [`Symbols::MAX_KERNEL_PREFIX`] characters and the entry of at most
    /// [`Symbols::MAX_ENTRY`] (generated lines stay within 120 characters).
    pub fn new(kernel_prefix: &str, entry: &str) -> Result<Symbols, String> {
        if !kernel_prefix.is_empty() && !is_c_identifier(&format!("{kernel_prefix}k0")) {
            return Err(format!(
                "kernel symbol prefix `{kernel_prefix}` does not make C identifiers"
            ));
        }
        if kernel_prefix.len() > Self::MAX_KERNEL_PREFIX {
            return Err(format!(
                "kernel symbol prefix `{kernel_prefix}` is longer than {} characters",
                Self::MAX_KERNEL_PREFIX
            ));
        }
        if !is_c_identifier(entry) {
            return Err(format!("host entry `{entry}` is not a C identifier"));
        }
        if entry.len() > Self::MAX_ENTRY {
            return Err(format!(
                "host entry `{entry}` is longer than {} characters",
                Self::MAX_ENTRY
            ));
        }
        Ok(Symbols {
            kernel_prefix: kernel_prefix.to_string(),
            entry: entry.to_string(),
        })
    }

    /// The symbol of a kernel whose unprefixed name is `base` (`k3_customized`).
    pub fn kernel(&self, base: &str) -> String {
        format!("{}{base}", self.kernel_prefix)
    }

    /// The kernels' prefix (empty by default).
    pub fn kernel_prefix(&self) -> &str {
        &self.kernel_prefix
    }

    /// The host entry's name.
    pub fn entry(&self) -> &str {
        &self.entry
    }

    /// Whether these are the default names.
    pub fn is_default(&self) -> bool {
        *self == Symbols::default()
    }
}

/// Threads per CTA of threadblock kernels (`--warps`). Any choice computes the same function:
/// every operator plan spreads its work over the CTA's threads, whatever their number.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CtaChoice {
    /// The planner's cost model (`sched::kernel::cta_threads`).
    #[default]
    Auto,
    /// The µGraph's `block_dim`, as Mirage wrote it.
    Graph,
    /// This many warps (1 to 32).
    Warps(usize),
}

/// Most warps a CTA may have (1024 threads).
pub const MAX_WARPS: usize = 32;

/// Most CTAs per block a grid split may have (`--grid-split N`).
pub const MAX_GRID_SPLIT: usize = 64;

/// Whether threadblock kernels split their for-loop over CTAs that fold their partials through
/// the workspace ([`GridSplit`], `--grid-split`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GridSplitChoice {
    /// The planner's rule (`sched::kernel::auto_grid_split`): on the Ampere path, where no
    /// cluster split exists, kernels whose grid leaves a quarter of the SMs idle or more.
    #[default]
    Auto,
    /// No grid split.
    Off,
    /// This many CTAs per block (2 to [`MAX_GRID_SPLIT`]) wherever the rules hold, on either
    /// path (it replaces a cluster split).
    Ctas(usize),
}

impl std::str::FromStr for GridSplitChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(GridSplitChoice::Auto),
            "off" => Ok(GridSplitChoice::Off),
            _ => match s.parse::<usize>() {
                Ok(n) if (2..=MAX_GRID_SPLIT).contains(&n) => Ok(GridSplitChoice::Ctas(n)),
                _ => Err(format!(
                    "unknown grid split `{}` (expected auto, off or a number of CTAs from 2 to \
                     {MAX_GRID_SPLIT})",
                    crate::graph::error::clip(s)
                )),
            },
        }
    }
}

impl fmt::Display for GridSplitChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GridSplitChoice::Auto => f.write_str("auto"),
            GridSplitChoice::Off => f.write_str("off"),
            GridSplitChoice::Ctas(n) => write!(f, "{n}"),
        }
    }
}

impl std::str::FromStr for CtaChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(CtaChoice::Auto),
            "graph" => Ok(CtaChoice::Graph),
            _ => match s.parse::<usize>() {
                Ok(w) if (1..=MAX_WARPS).contains(&w) => Ok(CtaChoice::Warps(w)),
                _ => Err(format!(
                    "unknown warp count `{}` (expected auto, graph or a number of warps from 1 to \
                     {MAX_WARPS})",
                    crate::graph::error::clip(s)
                )),
            },
        }
    }
}

impl fmt::Display for CtaChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CtaChoice::Auto => f.write_str("auto"),
            CtaChoice::Graph => f.write_str("graph"),
            CtaChoice::Warps(w) => write!(f, "{w}"),
        }
    }
}

/// Which features threadblock kernels may use (`--path`): for testing and comparing paths on the
/// same GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PathChoice {
    /// Everything the target has (Hopper features on sm_90a).
    #[default]
    Auto,
    /// Ampere features only, even on sm_90a.
    Ampere,
    /// Hopper features; planning for sm_80 with it is an error.
    Hopper,
}

impl PathChoice {
    /// Whether kernels for `target` may use Hopper features (clusters, distributed shared
    /// memory).
    pub fn hopper(self, target: &Target) -> bool {
        match self {
            PathChoice::Auto | PathChoice::Hopper => target.has_tma_wgmma,
            PathChoice::Ampere => false,
        }
    }
}

impl std::str::FromStr for PathChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(PathChoice::Auto),
            "ampere" => Ok(PathChoice::Ampere),
            "hopper" => Ok(PathChoice::Hopper),
            _ => Err(format!(
                "unknown path `{}` (expected auto, ampere or hopper)",
                crate::graph::error::clip(s)
            )),
        }
    }
}

impl fmt::Display for PathChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PathChoice::Auto => "auto",
            PathChoice::Ampere => "ampere",
            PathChoice::Hopper => "hopper",
        })
    }
}

/// Why a kernel-level operator has no implementation for its operands
/// ([`PlanError::Unsupported`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unsupported {
    /// A matmul cuBLAS cannot compute.
    Gemm(super::gemm::GemmError),
    /// An all-reduce whose input and output have different layouts (NCCL sums flat arrays).
    AllReduceLayouts {
        /// The input's strides.
        input: crate::graph::shape::Strides,
        /// The output's strides.
        output: crate::graph::shape::Strides,
    },
    /// An all-reduce of an element type NCCL does not sum.
    NcclType(DType),
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unsupported::Gemm(e) => write!(f, "{e}"),
            Unsupported::AllReduceLayouts { input, output } => write!(
                f,
                "the all-reduce's input has strides {input} and its output {output}; NCCL sums \
                 flat arrays, so both need one layout"
            ),
            Unsupported::NcclType(d) => {
                write!(f, "NCCL has no element type for {d} (an all-reduce of {d})")
            }
        }
    }
}

/// Why a graph that one of the planner's rewrites built (`sched::softmax`, `sched::shift`) is
/// not used.
#[derive(Clone, Debug, PartialEq)]
pub enum RewriteFailure {
    /// The rewritten graph does not validate (or, while built, a step of it did not).
    Invalid(crate::graph::error::ValidationErrors),
    /// It validates but does not plan.
    Plan(PlanError),
    /// The rewrite could not build it: a case its checks should have ruled out.
    Internal(&'static str),
}

impl fmt::Display for RewriteFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RewriteFailure::Invalid(e) => write!(f, "{e}"),
            RewriteFailure::Plan(e) => write!(f, "{e}"),
            RewriteFailure::Internal(why) => f.write_str(why),
        }
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
    /// The graph's buffers do not fit any GPU of the target.
    #[error(
        "the graph needs {needed} bytes of device memory (inputs {inputs}, outputs {outputs}, workspace {workspace}), more than the largest {arch} part has ({limit})"
    )]
    DeviceMemory {
        /// Bytes of all buffers.
        needed: usize,
        /// Bytes of the inputs.
        inputs: usize,
        /// Bytes of the outputs.
        outputs: usize,
        /// Bytes of the workspace.
        workspace: usize,
        /// The target's limit.
        limit: usize,
        /// The target.
        arch: String,
    },
    /// The requested CTA shape is not one a GPU can launch.
    #[error("{warps} warps per CTA were asked for; a CTA has 1 to {MAX_WARPS} warps")]
    WarpsOutOfRange {
        /// The warps asked for.
        warps: usize,
    },
    /// The requested code path needs features the target lacks.
    #[error("the {path} path needs sm_90a, but the target is {arch}")]
    PathUnavailable {
        /// The path asked for.
        path: String,
        /// The target.
        arch: String,
    },
    /// A kernel-level operator has no implementation for these operands.
    #[error("kernel op {op} ({name}): {reason}")]
    Unsupported {
        /// Kernel op index.
        op: usize,
        /// Mirage name of the operator.
        name: String,
        /// Why.
        reason: Unsupported,
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

/// An address in the caller's buffers: a placement plus an element offset. Serialised as the
/// launch plan's argument bindings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "buffer", rename_all = "snake_case")]
pub enum Binding {
    /// Caller input `index`, plus `elem_offset` elements.
    Input {
        /// Input index.
        index: usize,
        /// Offset in elements.
        elem_offset: usize,
    },
    /// Caller output `index`, plus `elem_offset` elements.
    Output {
        /// Output index.
        index: usize,
        /// Offset in elements.
        elem_offset: usize,
    },
    /// The workspace at `byte_offset` bytes, plus `elem_offset` elements of `elem_bytes` bytes.
    Workspace {
        /// Offset of the tensor in bytes.
        byte_offset: usize,
        /// Offset in elements.
        elem_offset: usize,
        /// Bytes per element of the tensor.
        elem_bytes: usize,
    },
    /// The exchange buffer of GPU `rank` as this GPU addresses it (peer memory for a fused
    /// all-reduce, [`super::exchange`]): the runner or the caller of the host entry provides one
    /// per GPU.
    Exchange {
        /// The GPU whose buffer it is.
        rank: usize,
    },
    /// This GPU's rank in the mesh: a value (passed as a 64-bit integer), not an address.
    Rank,
}

impl Binding {
    /// The start of a tensor placed at `p` with `elem_bytes`-byte elements.
    pub fn of(p: Placement, elem_bytes: usize) -> Binding {
        match p {
            Placement::Input(index) => Binding::Input {
                index,
                elem_offset: 0,
            },
            Placement::Output(index) => Binding::Output {
                index,
                elem_offset: 0,
            },
            Placement::Workspace(byte_offset) => Binding::Workspace {
                byte_offset,
                elem_offset: 0,
                elem_bytes,
            },
        }
    }

    /// The same buffer, `extra` elements further (an exchange buffer or the rank: unchanged).
    pub fn offset_by(self, extra: usize) -> Binding {
        match self {
            Binding::Input { index, elem_offset } => Binding::Input {
                index,
                elem_offset: elem_offset + extra,
            },
            Binding::Output { index, elem_offset } => Binding::Output {
                index,
                elem_offset: elem_offset + extra,
            },
            Binding::Workspace {
                byte_offset,
                elem_offset,
                elem_bytes,
            } => Binding::Workspace {
                byte_offset,
                elem_offset: elem_offset + extra,
                elem_bytes,
            },
            Binding::Exchange { .. } | Binding::Rank => self,
        }
    }

    /// The element offset (0 for an exchange buffer or the rank).
    pub fn elem_offset(self) -> usize {
        match self {
            Binding::Input { elem_offset, .. }
            | Binding::Output { elem_offset, .. }
            | Binding::Workspace { elem_offset, .. } => elem_offset,
            Binding::Exchange { .. } | Binding::Rank => 0,
        }
    }
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

/// A caller buffer: the tensor it holds, its strides and the elements to allocate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IoPlan {
    /// The DTensor.
    pub tensor: Handle<DTensor>,
    /// Element strides in the caller's buffer.
    pub strides: Strides,
    /// Elements the caller allocates (at least 1).
    pub alloc_elems: usize,
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
    /// The output accumulator of a key split ([`RegisterPipe::keys`]): one slice per warp,
    /// each the tile followed by the warp's running max and row sum (fp32 per row), where the
    /// warps' states meet after the loop; the first slice is the tile.
    KeySplit {
        /// The tile.
        tile: usize,
        /// Slices (the warps of the split).
        warps: usize,
        /// Bytes from one slice to the next.
        slice_bytes: usize,
        /// Bytes of the tile (where the maxima start in a slice; the sums follow, 4 bytes a row).
        tile_bytes: usize,
    },
}

impl SmemKind {
    /// The tile the buffer holds.
    pub fn tile(self) -> usize {
        match self {
            SmemKind::Tile { tile, .. }
            | SmemKind::Writeback { tile }
            | SmemKind::KeySplit { tile, .. } => tile,
        }
    }
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

impl SmemPlan {
    /// Whether the kernel raises its dynamic shared-memory limit before its first launch
    /// ([`crate::target::needs_smem_opt_in`] of [`SmemPlan::total`]).
    pub fn opt_in(&self) -> bool {
        crate::target::needs_smem_opt_in(self.total)
    }

    /// Byte offset (from the start of dynamic shared memory) of buffer `b`.
    pub fn offset(&self, b: usize) -> usize {
        self.base + self.packing.offsets[b]
    }

    /// The buffer holding tile `t`, if any.
    pub fn buffer_of(&self, t: usize) -> Option<usize> {
        self.kinds.iter().position(|k| k.tile() == t)
    }

    /// The bytes of dynamic shared memory buffer `b` occupies.
    pub fn bytes(&self, b: usize) -> std::ops::Range<usize> {
        let lo = self.offset(b);
        lo..lo + self.buffers[b].bytes
    }
}

/// The emitter and runtime headers a threadblock kernel is written with (one emitter and one
/// set of runtime headers per path); the features the kernel uses are
/// [`KernelPlan::features`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodePath {
    /// The `emit::threadblock` emitter on `runtime-headers/mucc/arch/sm80.h` (`cp.async`,
    /// `ldmatrix`, `mma.sync`) and, on sm_90a, `sm90.h` (TMA, mbarriers, clusters, programmatic
    /// launches); runs on sm_80 and on sm_90a.
    Sm80,
}

impl fmt::Display for CodePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CodePath::Sm80 => f.write_str("sm80 emitter"),
        }
    }
}

/// An instruction-level feature the code of a threadblock kernel uses, as its plan decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Feature {
    /// `cp.async` copies: of pipelined inputs, or of copies no ring stages
    /// ([`super::ops::CopyEngine::CpAsyncWaited`]).
    CpAsync,
    /// Bulk tensor copies (TMA) completing on mbarriers.
    Tma,
    /// `ldmatrix` operand loads.
    Ldmatrix,
    /// `mma.sync` tensor-core products.
    MmaSync,
    /// `wgmma.mma_async` warpgroup products (Hopper).
    Wgmma,
    /// Matmuls by FMAs, a thread per element.
    FmaMatmul,
    /// A product kept in registers between two matmuls ([`RegisterPipe`]).
    RegisterPipe,
    /// A for-loop split over a thread-block cluster, partials combined through distributed
    /// shared memory.
    Cluster,
    /// A for-loop split over CTAs that fold their partials through the workspace behind an
    /// arrival counter ([`GridSplit`]).
    GridSplit,
    /// Programmatic dependent launch (`griddepcontrol`).
    ProgrammaticLaunch,
    /// Every tile in registers: 16-byte loads and stores, row sums by warp shuffles
    /// ([`Body::Rows`]).
    RegisterRows,
}

/// A part of the runtime the generated file includes beyond its base
/// ([`GraphPlan::runtime_headers`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RuntimeHeader {
    /// Hopper's TMA, mbarriers and programmatic launch.
    Hopper,
    /// Thread-block clusters and distributed shared memory.
    Cluster,
    /// The NCCL declarations of a plan on several GPUs.
    Nccl,
    /// The in-kernel all-reduce through exchange buffers.
    Exchange,
}

impl fmt::Display for RuntimeHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RuntimeHeader::Hopper => "Hopper (TMA, mbarrier, griddepcontrol)",
            RuntimeHeader::Cluster => "clusters",
            RuntimeHeader::Nccl => "NCCL",
            RuntimeHeader::Exchange => "exchange (in-kernel all-reduce)",
        })
    }
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Feature::CpAsync => "cp.async",
            Feature::Tma => "TMA",
            Feature::Ldmatrix => "ldmatrix",
            Feature::MmaSync => "mma.sync",
            Feature::Wgmma => "wgmma",
            Feature::FmaMatmul => "FMA matmuls",
            Feature::RegisterPipe => "register pipe",
            Feature::Cluster => "cluster",
            Feature::GridSplit => "grid split",
            Feature::ProgrammaticLaunch => "griddepcontrol",
            Feature::RegisterRows => "register rows",
        })
    }
}

/// How partial accumulators of the CTAs of a split combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Combine {
    /// Added (sums; mean and RMS add their partial sums before the division and the root).
    Sum,
    /// The larger one.
    Max,
    /// An online-softmax partial (a rescaled row sum or output): each CTA's rows rescaled by
    /// exp(m − M), its running max m (in tile `max_tile`, per row) against the largest M of the
    /// CTAs, then added. These partials are combined before the max tile itself is.
    Rescaled {
        /// The tile of the running max's accumulator.
        max_tile: usize,
    },
}

/// One accumulator tile that the CTAs of a split combine after the loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partial {
    /// The accumulator.
    pub accum: Handle<TbOp>,
    /// Its tile (in shared memory in every CTA, at the same offset).
    pub tile: usize,
    /// How partials combine.
    pub combine: Combine,
}

/// A for-loop split over the CTAs of a cluster (sm_90a): each µGraph block runs as a cluster of
/// `ctas` CTAs along x; CTA r runs iterations [r·iters, (r+1)·iters) into its own accumulators;
/// after the loop CTA 0 combines every CTA's partial accumulators through distributed shared
/// memory and alone runs the post-loop operators.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterSplit {
    /// CTAs per cluster (2, 4 or 8).
    pub ctas: usize,
    /// Iterations per CTA.
    pub iters: usize,
    /// The accumulators combined after the loop.
    pub partials: Vec<Partial>,
    /// CTAs of the kernel one SM can hold (shared memory, threads, and `regs_per_thread`
    /// registers; at most 4 unless `--resident-blocks` asks for more), which bounded `ctas`
    /// (clusters of 4 or 8 count on 90% of the GPU's slots: a cluster fits in one GPC); the
    /// launch bounds promise them.
    pub resident_per_sm: usize,
    /// Registers per thread the residency counts on: ptxas may use up to
    /// 65536 / (threads × `resident_per_sm`) (with `--resident-blocks`, exactly that, in steps
    /// of 8).
    pub regs_per_thread: usize,
    /// How the partials reach CTA 0.
    pub gather: Gather,
}

/// How the CTAs of a [`ClusterSplit`] bring their partial accumulators to CTA 0 after the loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gather {
    /// Behind a cluster barrier CTA 0 reads every CTA's partial tiles through distributed
    /// shared memory and folds them into its own; a second cluster barrier keeps the others'
    /// tiles alive until it has. Why the partials are not pushed.
    Fold(NoPush),
    /// CTAs 1.. store their partial tiles into slots of CTA 0's shared memory (`st.async`, each
    /// store completing its bytes on CTA 0's push mbarrier) and leave; CTA 0 waits on that
    /// mbarrier alone, then folds the slots into its tiles. The only cluster barrier is the one
    /// publishing the mbarrier's initialisation: arrived at before the loop, waited on after.
    Push(PushSlots),
}

impl Gather {
    /// The slots, when the partials are pushed.
    pub fn push(&self) -> Option<&PushSlots> {
        match self {
            Gather::Push(p) => Some(p),
            Gather::Fold(_) => None,
        }
    }
}

/// Where CTA 0 receives the pushed partials ([`Gather::Push`]): shared memory after the
/// kernel's tiles, in every CTA (only CTA 0's is written), live for the whole kernel (the
/// pushes may arrive while CTA 0 is still in its loop).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushSlots {
    /// Byte offset of the push mbarrier.
    pub barrier: usize,
    /// Per partial, in [`ClusterSplit::partials`] order: the byte offset of its first slot.
    /// CTA r's slot is at `offset + (r − 1) · stride`, laid out as the partial's tile.
    pub slots: Vec<usize>,
    /// Bytes between a partial's consecutive slots (per partial, the tile's buffer bytes).
    pub strides: Vec<usize>,
    /// Bytes CTA 0 waits for: (CTAs − 1) × the bytes of the partials' elements.
    pub bytes: usize,
    /// Shared memory the mbarrier and the slots add to the kernel's (included in
    /// [`SmemPlan::total`]).
    pub added: usize,
    /// The CTAs per SM the split counted on before the slots took the room of some of them
    /// (its clusters still fit in one wave of [`ClusterSplit::resident_per_sm`]); `None` when
    /// the slots fit beside them.
    pub resident_before: Option<usize>,
}

/// Why a [`ClusterSplit`]'s partials are folded by CTA 0's reads rather than pushed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoPush {
    /// `--no-cluster-push` (for comparison).
    TurnedOff,
    /// An online-softmax partial: rescaling needs every CTA's running max first.
    Rescaled,
    /// With the slots, too few CTAs fit per SM for the split's clusters to run in one wave, or a
    /// block exceeds its limit.
    DoesNotFit {
        /// The kernel's shared memory with the slots.
        needed: usize,
        /// The CTAs per SM the split counted on.
        resident: usize,
    },
}

impl fmt::Display for NoPush {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoPush::TurnedOff => f.write_str("--no-cluster-push"),
            NoPush::Rescaled => f.write_str(
                "an online-softmax partial is rescaled to the largest of the CTAs' running maxima",
            ),
            NoPush::DoesNotFit { needed, resident } => write!(
                f,
                "with the slots a CTA needs {needed} bytes of shared memory: too few CTAs per SM \
                 fit for the clusters to run in one wave (the split counts on {resident})"
            ),
        }
    }
}

/// A for-loop split over CTAs that need not run at once (`--grid-split N`; sm_80 and sm_90a):
/// each µGraph block runs as `ctas` consecutive CTAs along x; CTA r runs iterations
/// [r·iters, (r+1)·iters) into its own accumulators, stores its partial tiles into its slots in
/// the workspace and arrives on its block's counter (`mucc::tb::arrive_last`); the last CTA to
/// arrive folds every CTA's slots in CTA order (the same rounding whichever CTA is last) into
/// its tiles and alone runs the post-loop operators. No CTA waits for another, so the CTAs may
/// take several waves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GridSplit {
    /// CTAs per µGraph block.
    pub ctas: usize,
    /// Whether `--grid-split N` asked for it (else the planner's rule chose it).
    pub asked: bool,
    /// Iterations per CTA.
    pub iters: usize,
    /// The accumulators combined after the loop (sums and maxima: no rescaled partials).
    pub partials: Vec<Partial>,
    /// CTAs of the kernel one SM holds at once (the launch bounds promise them).
    pub resident_per_sm: usize,
    /// Registers per thread the residency counts on.
    pub regs_per_thread: usize,
    /// µGraph blocks (one counter and `ctas` slots per partial each).
    pub blocks: usize,
    /// Per partial, in [`GridSplit::partials`] order: its slots' elements (the tile's).
    pub slot_elems: Vec<usize>,
    /// Per partial: bytes of an element (the tile's type, f32 or f64).
    pub elem_bytes: Vec<usize>,
    /// Per partial: the byte offset of its slots from [`GridSplit::slots_at`]; block b's CTA
    /// r's slot starts `(b · ctas + r) · elems · bytes` further, the tile's elements in
    /// row-major order.
    pub slot_offsets: Vec<usize>,
    /// Workspace byte offset of the kernel's slots (placed over the whole graph, past its
    /// buffers: [`GraphPlan::split_bytes`]).
    pub slots_at: usize,
    /// Workspace byte offset of the kernel's arrival counters (one u32 per µGraph block, among
    /// [`GraphPlan::counter_bytes`]: zero before the first execution, left zero by each).
    pub counters_at: usize,
}

impl GridSplit {
    /// Bytes of the kernel's slots: the end of the last partial's (each partial's start is
    /// aligned, [`GridSplit::slot_offsets`]).
    pub fn slot_bytes(&self) -> usize {
        (0..self.slot_elems.len())
            .map(|i| {
                self.slot_offsets[i]
                    + self.blocks * self.ctas * self.slot_elems[i] * self.elem_bytes[i]
            })
            .max()
            .unwrap_or(0)
    }

    /// Bytes of the kernel's arrival counters.
    pub fn counter_bytes(&self) -> usize {
        4 * self.blocks
    }
}

/// Why a kernel has no grid split where one was asked for (`--grid-split N`) or the planner's
/// rule considered one (the Ampere path's default) ([`KernelPlan::grid_split_off`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoGridSplit {
    /// Whether `--grid-split N` asked for it (else the planner's rule looked at the kernel).
    pub asked: bool,
    /// Why there is none.
    pub why: GridSplitOff,
}

impl fmt::Display for NoGridSplit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let by = if self.asked {
            "--grid-split"
        } else {
            "the planner's rule"
        };
        write!(f, "grid split ({by}): none ({})", self.why)
    }
}

/// Why a kernel has no grid split ([`NoGridSplit`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GridSplitOff {
    /// N does not divide the loop into shares of 2 iterations or more.
    NotDividing {
        /// Iterations of the loop.
        iterations: usize,
        /// CTAs asked per block.
        ctas: usize,
    },
    /// A rule the cluster split shares (the loop, the grid, the accumulators).
    Split(SplitOff),
    /// An online-softmax partial: it is rescaled to the largest running max of the CTAs, which
    /// only a cluster split combines.
    Rescaled {
        /// The accumulator.
        op: usize,
    },
    /// The planner's rule: the grid fills more than three quarters of the SMs.
    GridLarge {
        /// Blocks of the grid.
        blocks: usize,
        /// SMs of the target.
        sms: usize,
    },
    /// The planner's rule: no CTA count it tries divides the loop into shares long enough to
    /// pipeline.
    NoShares {
        /// Iterations of the loop.
        iterations: usize,
        /// The most CTAs per block the rule gives.
        max_ctas: usize,
        /// The fewest iterations a CTA keeps.
        min_iters: usize,
    },
}

impl fmt::Display for GridSplitOff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GridSplitOff::NotDividing { iterations, ctas } => write!(
                f,
                "{ctas} CTAs do not divide the {iterations} iterations into shares of 2 or more"
            ),
            GridSplitOff::Split(why) => why.fmt(f),
            GridSplitOff::Rescaled { op } => write!(
                f,
                "op {op} is an online-softmax partial (rescaled to the CTAs' largest running max: \
                 only a cluster split combines it)"
            ),
            GridSplitOff::GridLarge { blocks, sms } => write!(
                f,
                "the grid of {blocks} blocks fills more than three quarters of the {sms} SMs"
            ),
            GridSplitOff::NoShares {
                iterations,
                max_ctas,
                min_iters,
            } => write!(
                f,
                "no count of 2 to {max_ctas} CTAs divides its {iterations}-iteration loop into \
                 shares of {min_iters} iterations or more"
            ),
        }
    }
}

/// Programmatic dependent launch of a threadblock kernel (sm_90a): launched with programmatic
/// stream serialisation, so that its CTAs may start while the previous kernel finishes; it waits
/// (`griddepcontrol.wait`) for that kernel's completion and memory before anything else.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DependentLaunch {
    /// A plain launch, and why.
    Off(PlainLaunch),
    /// A programmatic launch after the previous generated kernel, or as the graph's first
    /// launch (after whatever ran before on the stream: a kernel that does not trigger it lets
    /// it start when it completes).
    Programmatic,
}

/// The TMA boxes of a programmatic kernel's first iterations, prefetched into L2 by thread 0
/// before `griddepcontrol.wait` ([`KernelPlan::l2_prefetch`]), so that the kernel streams its
/// inputs from DRAM while the kernel before it finishes and its ring's first loads find them in
/// L2. Nothing read can be stale: a prefetch only brings lines into L2, where the writes of the
/// kernel before land, and the loads themselves still come after the wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct L2Prefetch {
    /// Iterations of the CTA's share (from its first) whose boxes are prefetched: the ring's
    /// stages.
    pub iterations: usize,
}

impl fmt::Display for L2Prefetch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the TMA boxes of its first {} iteration(s) prefetched into L2 \
             (cp.async.bulk.prefetch.tensor)",
            self.iterations
        )
    }
}

/// Why a threadblock kernel is launched plainly ([`DependentLaunch::Off`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlainLaunch {
    /// Not planned yet (the state `plan_kernel` leaves; the graph's planning decides).
    NotPlanned,
    /// The Ampere path.
    Ampere,
    /// Programmatic launches are off by default (`--dependent-launch`).
    OffByDefault,
    /// The previous step is a library call.
    AfterLibrary,
}

impl fmt::Display for PlainLaunch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PlainLaunch::NotPlanned => "not planned",
            PlainLaunch::Ampere => "Ampere path",
            PlainLaunch::OffByDefault => "off by default; --dependent-launch turns it on",
            PlainLaunch::AfterLibrary => "the previous step is a library call (cuBLAS or NCCL)",
        })
    }
}

impl DependentLaunch {
    /// Whether the launch is programmatic.
    pub fn is_programmatic(&self) -> bool {
        matches!(self, DependentLaunch::Programmatic)
    }
}

/// Whether and how a kernel's for-loop is split over several CTAs per µGraph block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Split {
    /// Not split, and why.
    Off(SplitOff),
    /// Split over the CTAs of a cluster (sm_90a).
    Cluster(ClusterSplit),
    /// Split over CTAs that fold their partials through the workspace.
    Grid(GridSplit),
}

/// Why a kernel's for-loop is not split over a cluster ([`Split::Off`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SplitOff {
    /// The Ampere path (no clusters).
    Ampere,
    /// Turned off by a tuning variant.
    TurnedOff,
    /// The kernel's body is register rows.
    RegisterRows,
    /// The loop has one iteration.
    OneIteration,
    /// The grid has a block for every SM already.
    GridFills {
        /// Blocks of the grid.
        blocks: usize,
        /// SMs of the GPU.
        sms: usize,
    },
    /// An online-softmax register pipe whose warps own whole rows (such kernels ran slower
    /// split); `max_op` keeps the running max.
    OnlineRows {
        /// The running max's operator.
        max_op: usize,
    },
    /// An operator keeps a running max across iterations.
    RunningMax {
        /// The operator.
        op: usize,
        /// Its kind's name.
        kind: String,
    },
    /// An output stores inside the loop.
    StoresInLoop {
        /// The operator.
        op: usize,
        /// Its kind's name.
        kind: String,
    },
    /// A rescaling accumulator whose running max's tile is not kept.
    RescaleMaxNotKept {
        /// The accumulator.
        op: usize,
        /// Its kind's name.
        kind: String,
    },
    /// An accumulator rescales its state every iteration (not an online-softmax pipe's).
    Rescales {
        /// The accumulator.
        op: usize,
        /// Its kind's name.
        kind: String,
    },
    /// An accumulator's tile is neither f32 nor f64 (`None`: in registers).
    NarrowPartial {
        /// The accumulator.
        op: usize,
        /// Its kind's name.
        kind: String,
        /// The tile's type.
        dtype: Option<crate::graph::dtype::DType>,
    },
    /// No accumulator has a tile to combine.
    NothingToCombine,
    /// No cluster size divides the loop into shares of 2 or more with every CTA resident.
    NoClusterFits {
        /// Iterations of the loop.
        iterations: usize,
        /// Blocks of the grid.
        blocks: usize,
        /// CTAs the GPU holds at once.
        slots: usize,
    },
}

impl fmt::Display for SplitOff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SplitOff::Ampere => f.write_str("Ampere path"),
            SplitOff::TurnedOff => f.write_str("cluster split turned off (tuning variant)"),
            SplitOff::RegisterRows => f.write_str("register rows"),
            SplitOff::OneIteration => f.write_str("the for-loop has one iteration"),
            SplitOff::GridFills { blocks, sms } => {
                write!(f, "the grid's {blocks} blocks fill the {sms} SMs")
            }
            SplitOff::OnlineRows { max_op } => write!(
                f,
                "its online-softmax register pipe's warps own whole rows (op {max_op} keeps a \
                 running max): such kernels ran 1.4x slower split"
            ),
            SplitOff::RunningMax { op, kind } => {
                write!(f, "op {op} ({kind}) keeps a running max across iterations")
            }
            SplitOff::StoresInLoop { op, kind } => {
                write!(f, "op {op} ({kind}) stores inside the loop")
            }
            SplitOff::RescaleMaxNotKept { op, kind } => write!(
                f,
                "op {op} ({kind}) rescales to a running max whose tile is not kept"
            ),
            SplitOff::Rescales { op, kind } => {
                write!(f, "op {op} ({kind}) rescales its state every iteration")
            }
            SplitOff::NarrowPartial { op, kind, dtype } => write!(
                f,
                "op {op} ({kind}) keeps its tile in {} (partials combine in f32 or f64)",
                dtype.map_or("registers".to_string(), |d| d.to_string())
            ),
            SplitOff::NothingToCombine => f.write_str("no accumulator to combine"),
            SplitOff::NoClusterFits {
                iterations,
                blocks,
                slots,
            } => write!(
                f,
                "no cluster of 2, 4 or 8 CTAs divides the {iterations} iterations into shares of \
                 2 or more with {blocks} × CTAs ≤ {slots} resident CTAs"
            ),
        }
    }
}

/// Why a tensor-core matmul keeps `mma.sync` on the Hopper path instead of `wgmma`
/// ([`KernelPlan::no_wgmma`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WgmmaOff {
    /// `--no-wgmma`.
    TurnedOff,
    /// The product is computed slice by slice, not into one fragment.
    SliceBySlice,
    /// A loads neither from a register pipe nor by `ldmatrix` with K contiguous.
    ALoad,
    /// B is not in shared memory.
    BNotInSharedMemory,
    /// Into a register accumulator's fragment: not yet checked on a GPU.
    AccumulatorUnchecked,
    /// The warps along M are not whole warpgroups (or some are along N).
    NotWarpgroups,
    /// M or K is not a multiple of 16.
    NotMultipleOf16,
    /// A's fragments of every k-step would take more than 32 registers per thread.
    AFragmentRegisters,
    /// B is neither one 128-byte swizzle atom across nor stored in columns of such atoms.
    BLayout,
    /// B's swizzle is not the 128-byte pattern.
    BSwizzle,
    /// B is not loaded by TMA (its slots are not 1024-byte aligned).
    BNotTma,
}

impl fmt::Display for WgmmaOff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WgmmaOff::TurnedOff => "wgmma turned off (--no-wgmma)",
            WgmmaOff::SliceBySlice => {
                "its product is computed slice by slice, not into one fragment"
            }
            WgmmaOff::ALoad => {
                "A loads neither from a register pipe nor by ldmatrix with K contiguous"
            }
            WgmmaOff::BNotInSharedMemory => "B is not in shared memory",
            WgmmaOff::AccumulatorUnchecked => {
                "wgmma into a register accumulator's fragment is not checked on a GPU yet (only \
                 a register pipe's matmuls take it)"
            }
            WgmmaOff::NotWarpgroups => "its warps are not whole warpgroups along M",
            WgmmaOff::NotMultipleOf16 => "M or K is not a multiple of 16",
            WgmmaOff::AFragmentRegisters => {
                "A's fragments of every k-step would take more than 32 registers per thread"
            }
            WgmmaOff::BLayout => {
                "B is neither one 128-byte swizzle atom across (N = 64 contiguous 16-bit \
                 elements per row) nor stored in columns of such atoms"
            }
            WgmmaOff::BSwizzle => "B's swizzle is not the 128-byte pattern",
            WgmmaOff::BNotTma => "B is not loaded by TMA (its slots are not 1024-byte aligned)",
        })
    }
}

impl Split {
    /// The cluster split, if any.
    pub fn cluster(&self) -> Option<&ClusterSplit> {
        match self {
            Split::Cluster(c) => Some(c),
            _ => None,
        }
    }

    /// The grid split, if any.
    pub fn grid(&self) -> Option<&GridSplit> {
        match self {
            Split::Grid(g) => Some(g),
            _ => None,
        }
    }

    /// CTAs per µGraph block and iterations per CTA, under either split.
    pub fn share(&self) -> Option<(usize, usize)> {
        match self {
            Split::Off(_) => None,
            Split::Cluster(c) => Some((c.ctas, c.iters)),
            Split::Grid(g) => Some((g.ctas, g.iters)),
        }
    }

    /// CTAs per µGraph block (1 without a split).
    pub fn ctas(&self) -> usize {
        self.share().map_or(1, |(c, _)| c)
    }

    /// The partial accumulators the CTAs combine (none without a split).
    pub fn partials(&self) -> &[Partial] {
        match self {
            Split::Off(_) => &[],
            Split::Cluster(c) => &c.partials,
            Split::Grid(g) => &g.partials,
        }
    }
}

/// The CTA of a threadblock kernel and how it is launched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cta {
    /// Blocks (x, y, z).
    pub grid: [usize; 3],
    /// Threads (x, y, z).
    pub block: [usize; 3],
    /// Threads per block.
    pub threads: usize,
    /// Why this many threads.
    pub source: CtaSource,
    /// The minimum of resident blocks per SM promised to the compiler (`__launch_bounds__`).
    pub min_blocks_per_sm: usize,
    /// Blocks of this kernel an SM should hold at once (shared memory is budgeted for them).
    pub resident_blocks: usize,
    /// Whether `resident_blocks` was asked for ([`Options::resident_blocks`],
    /// `--resident-blocks`) rather than chosen by the planner's rule.
    pub resident_asked: bool,
}

/// Why a CTA has its number of threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtaSource {
    /// The µGraph's `block_dim` (`--warps graph`).
    Graph,
    /// `--warps N` (or a tuned variant).
    Asked,
    /// The planner's cost model, for this reason.
    Model(CtaWhy),
}

/// Why the cost model chose a kernel's CTA ([`CtaSource::Model`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtaWhy {
    /// A register-rows body: a thread per 16-byte run of a row.
    RegisterRows,
    /// The loop was refined so that more blocks of it fit per SM.
    Refined,
    /// The µGraph's block has as many warps as the grid needs.
    EnoughWarps,
    /// The grid has 4 or more blocks per SM.
    ManyBlocks,
    /// 4 or more blocks per SM, but shared memory holds one block of fewer than 8 warps: 8.
    OneSmallBlock,
    /// Its warps own whole rows of a register pipe, and the grid has a block per SM or more.
    PipeRows,
    /// Its warps split the keys of an online-softmax register pipe.
    OnlineKeys,
    /// Its warps own whole rows of an online-softmax register pipe.
    OnlineRows,
    /// More warps per CTA would shrink the cluster split.
    ClusterShrinks,
    /// The kernel does not plan with more warps.
    NoPlanWithMore,
    /// Few blocks per SM and a loop too short to pipeline: 16 warps.
    ShortLoop,
    /// Few blocks per SM and a longer loop: 8 warps.
    LongLoop,
}

impl fmt::Display for CtaWhy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CtaWhy::RegisterRows => "register rows: a thread per 16-byte run of a row",
            CtaWhy::Refined => {
                "block_dim kept: the loop was refined so that more blocks of it fit per SM"
            }
            CtaWhy::EnoughWarps => "block_dim kept: it has as many warps as the grid needs",
            CtaWhy::ManyBlocks => "block_dim kept: the grid has 4 or more blocks per SM",
            CtaWhy::OneSmallBlock => {
                "the grid has 4 or more blocks per SM, but shared memory holds one block of \
                 fewer than 8 warps"
            }
            CtaWhy::PipeRows => {
                "block_dim kept: its warps own whole rows of a register pipe, which more warps \
                 would turn off (the grid has a block per SM or more)"
            }
            CtaWhy::OnlineKeys => {
                "block_dim kept: its warps split the keys of an online-softmax register pipe, \
                 which do not split over more warps"
            }
            CtaWhy::OnlineRows => {
                "block_dim kept: its warps own whole rows of an online-softmax register pipe, \
                 which more warps would turn off"
            }
            CtaWhy::ClusterShrinks => {
                "block_dim kept: more warps per CTA would shrink the cluster split"
            }
            CtaWhy::NoPlanWithMore => "block_dim kept: the kernel does not plan with more warps",
            CtaWhy::ShortLoop => {
                "the grid leaves SMs short of warps, and a loop of 4 iterations or fewer is too \
                 short to pipeline"
            }
            CtaWhy::LongLoop => {
                "the grid leaves SMs short of warps (8, not 16: a longer loop pipelines its \
                 loads)"
            }
        })
    }
}

impl fmt::Display for CtaSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CtaSource::Graph => f.write_str("the µGraph's block_dim"),
            CtaSource::Asked => f.write_str("asked for (--warps or a tuned variant)"),
            CtaSource::Model(why) => write!(f, "cost model: {why}"),
        }
    }
}

/// How a threadblock kernel's loop body derives the thread's index, warp and lane
/// ([`KernelPlan::loop_indices`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoopIndices {
    /// Re-derived in every iteration from a copy of the thread index the optimiser cannot see
    /// through (`mucc::opaque`): the address arithmetic built on them is recomputed where it is
    /// used instead of being hoisted out of the loop and held in registers across its
    /// iterations, which made large bodies spill.
    Recomputed,
    /// The kernel's own thread index: ptxas may hoist the loop-invariant address arithmetic out
    /// of the loop. For bodies that keep few values live across iterations (at most
    /// [`HOISTED_ACCUM_REGISTERS`] accumulator registers per thread and no register pipe),
    /// where the hoisted addresses fit the registers the launch bounds leave.
    Hoisted {
        /// The accumulator registers per thread the body keeps across iterations.
        accum_registers: usize,
    },
}

/// The most accumulator registers per thread a loop body may keep across iterations and still
/// let ptxas hoist its address arithmetic ([`LoopIndices::Hoisted`]).
pub const HOISTED_ACCUM_REGISTERS: usize = 16;

impl fmt::Display for LoopIndices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoopIndices::Recomputed => f.write_str(
                "recomputed every iteration from an opaque thread index (addresses are not held \
                 across iterations)",
            ),
            LoopIndices::Hoisted { accum_registers } => write!(
                f,
                "the kernel's thread index: addresses may be hoisted out of the loop (the body \
                 keeps {accum_registers} accumulator register(s) per thread across iterations, \
                 at most {HOISTED_ACCUM_REGISTERS}, and no register pipe)"
            ),
        }
    }
}

/// How a chain's approximate `exp` runs ([`ChainPlan::approx_exp`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApproxExp {
    /// `ex2.approx.f32` keeping subnormal results (`mucc::op::exp_approx`): the value is
    /// rounded to bf16, whose range reaches fp32's subnormals.
    Ex2,
    /// `ex2.approx.ftz.f32` (`mucc::op::exp_approx_ftz`: two instructions, against six for the
    /// subnormal-preserving form): the value is rounded to fp16, where every result under
    /// 2^-126 that the instruction flushes to zero rounds to zero anyway (fp16's least
    /// subnormal is 2^-24).
    Ex2FlushToZero,
}

impl ApproxExp {
    /// For a value rounded to `stored` (a 16-bit floating type) right after.
    pub fn for_store(stored: DType) -> ApproxExp {
        if stored == DType::F16 {
            ApproxExp::Ex2FlushToZero
        } else {
            ApproxExp::Ex2
        }
    }
}

impl fmt::Display for ApproxExp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApproxExp::Ex2 => f.write_str("ex2.approx"),
            ApproxExp::Ex2FlushToZero => f.write_str("ex2.approx.ftz"),
        }
    }
}

/// Where a chain's values go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sink {
    /// Stored into a shared-memory tile.
    Tile(Handle<STensor>),
    /// Stored into the device tensor of this output operator.
    Global(Handle<TbOp>),
    /// Accumulated into this accumulator.
    Accum(Handle<TbOp>),
    /// Nothing: the chain is a copy (an input or a lone output), see its operator plan.
    Copy,
}

/// How a chain is carried out: the unary operators applied to its leader's values, where the
/// results go, and the order in which its element loop walks the value space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainPlan {
    /// The unary members applied in registers, in order.
    pub members: Vec<Handle<TbOp>>,
    /// Where the values go.
    pub sink: Sink,
    /// Dims of the walked space, slowest first (consecutive threads take consecutive elements
    /// of the last one).
    pub order: Vec<usize>,
    /// For a chain led by a matmul: how the product is computed and handed to the sink.
    pub matmul: Option<MatmulLowering>,
    /// The chain's last unary operator (its leader, when it has no members) is `exp`, and its
    /// value is rounded to a 16-bit type right after (stored to a 16-bit tile or device tensor,
    /// or packed into a register pipe): it runs as `ex2.approx`, whose relative error (under
    /// 1.3e-5) is far below the rounding's (2^-12 or more); `None`: exp (if any) is exact.
    pub approx_exp: Option<ApproxExp>,
    /// The chain's silu or sigmoid runs on hardware approximations (`mucc::op::silu_approx`,
    /// `sigmoid_approx`: e^-x by `ex2.approx.ftz`, the reciprocal of 1 + e^-x by
    /// `rcp.approx.ftz`; relative error about 1e-5, against 2^-12 or more for the rounding):
    /// its value reaches a 16-bit floating store through products and quotients with other
    /// tiles only, which keep a relative error relative. Not in fp64.
    pub approx_logistic: bool,
    /// Consecutive elements of the walk's last dim a thread takes per step (1: one at a time,
    /// the elements of a thread `threads` apart). With more, each access computes its layout
    /// offset once per step and adds the element's index times the dim's stride
    /// (`sched::kernel::plan_vectors` says when that is exact).
    pub vector: usize,
    /// For an element-wise chain (unary or binary leader, an accumulator written once, or the
    /// row sums of an accumulator) left at one element per step: why.
    pub scalar: Option<ScalarSteps>,
    /// For a chain of [`Self::vector`] > 1: the tiles it reads that are broadcast along the
    /// walk's last dim (extent 1 there), each read once per step by a scalar read; it reads
    /// every other tile by one vector load per step.
    pub broadcast_reads: Vec<usize>,
}

/// Why an element-wise chain takes one element per thread step ([`ChainPlan::vector`] 1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScalarSteps {
    /// It stores to a device tensor whose region would not start every step aligned (the
    /// reason, for the narrowest width); scalar stores of consecutive threads stay coalesced.
    DeviceUnaligned(super::ops::ChunkOff),
    /// It accumulates: its elements keep their threads (and registers) across iterations.
    AccumulatorSink,
    /// Neither 4 nor 2 divides the walk's last extent (a step would cross a row).
    Row {
        /// The extent.
        extent: usize,
    },
    /// Steps of 2 would leave threads without one.
    FewElements {
        /// Elements of the chain.
        elements: usize,
        /// Threads of the CTA.
        threads: usize,
    },
    /// A tile it reads or writes is not contiguous along the walk's last dim.
    Strided {
        /// The tile.
        tile: usize,
        /// Its stride along that dim (elements).
        stride: usize,
    },
    /// A tile it reads or writes would not start every step aligned to the vector (its other
    /// strides or slot size), or its swizzle moves parts of a step.
    Unaligned {
        /// The tile.
        tile: usize,
    },
}

impl fmt::Display for ScalarSteps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScalarSteps::DeviceUnaligned(why) => write!(
                f,
                "it stores to a device tensor whose steps would not start aligned ({why}); \
                 scalar stores stay coalesced across threads"
            ),
            ScalarSteps::AccumulatorSink => f.write_str("it accumulates"),
            ScalarSteps::Row { extent } => {
                write!(f, "neither 4 nor 2 divides its rows of {extent}")
            }
            ScalarSteps::FewElements { elements, threads } => write!(
                f,
                "{elements} elements in steps of 2 would leave some of the {threads} threads idle"
            ),
            ScalarSteps::Strided { tile, stride } => {
                write!(f, "s{tile} has stride {stride} along the walk's last dim")
            }
            ScalarSteps::Unaligned { tile } => write!(
                f,
                "s{tile} would not start every step aligned (strides, slot size or swizzle)"
            ),
        }
    }
}

/// How a matmul-led chain is computed and handed to its sink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulLowering {
    /// FMAs, a thread per element of the product (the instruction is FMA).
    PerElement,
    /// Tensor cores straight into the fragment of a register `accum_nored` (nothing between).
    IntoFragment,
    /// Tensor cores into a temporary fragment, each element then through the chain's members
    /// into the register accumulator's fragment.
    ThroughMembers,
    /// Tensor cores slice by slice (registers bounded for any N), each element through the
    /// members to the sink: stored, or summed into a reducing accumulator by shared-memory
    /// atomics.
    SliceBySlice,
    /// Tensor cores into a fragment that stays in registers: the members transform it in
    /// place, and the tile's readers take it from there ([`RegisterPipe`]).
    Pipe,
}

impl std::fmt::Display for MatmulLowering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MatmulLowering::PerElement => "FMAs, a thread per element",
            MatmulLowering::IntoFragment => "mma straight into the accumulator's fragment",
            MatmulLowering::ThroughMembers => {
                "mma into a fragment, then through the members into the accumulator's"
            }
            MatmulLowering::SliceBySlice => "mma slice by slice, each element to the sink",
            MatmulLowering::Pipe => "mma into a fragment its readers take from registers",
        })
    }
}

/// The plan of one customized operator.
#[derive(Clone, Debug)]
pub struct KernelPlan {
    /// The code path.
    pub path: CodePath,
    /// The CTA.
    pub cta: Cta,
    /// Fusion chains.
    pub fusion: FusionPlan,
    /// Per chain (same order as the fusion plan's chains).
    pub chains: Vec<ChainPlan>,
    /// Schedule.
    pub schedule: Schedule,
    /// Per operator.
    pub ops: Vec<OpPlan>,
    /// Per tile: geometry if it lives in shared memory.
    pub tiles: Vec<Option<TileGeometry>>,
    /// Shared memory.
    pub smem: SmemPlan,
    /// Computed tiles that stay in shared memory although a single operator reads them.
    pub unfused: Vec<Unfused>,
    /// The for-loop split over a cluster, or why there is none.
    pub split: Split,
    /// Pipelined inputs loaded by the bulk tensor copy engine (TMA), and why the others are
    /// not.
    pub tma: super::tma::TmaPlan,
    /// How the kernel is launched after the previous step.
    pub dependent: DependentLaunch,
    /// Whether the kernel lets the next launch start early (`griddepcontrol.launch_dependents`
    /// after its for-loop): the next step is a programmatic launch, or this is the graph's last
    /// kernel and launches are programmatic (the next execution's first kernel is).
    pub triggers_next: bool,
    /// The boxes of its first iterations prefetched into L2 before `griddepcontrol.wait`: a
    /// programmatic kernel with TMA loads.
    pub l2_prefetch: Option<L2Prefetch>,
    /// The body's barriers beyond the schedule's, and where the loop refills its ring.
    pub barriers: BodyBarriers,
    /// Where the loop's ring issues its prologue (the loads of its first iterations).
    pub ring_start: RingStart,
    /// Per threadblock operator: for an input the copies read (every input but TMA loads, which
    /// address the tensor by coordinates) and for an output, where this block's region of its
    /// device tensor starts.
    pub regions: Vec<Option<BlockRegion>>,
    /// Products of one tensor-core matmul that another takes as its A operand: kept in
    /// registers, or why not.
    pub pipes: Vec<PipeDecision>,
    /// Per tensor-core matmul (operator index) on the Hopper path that keeps `mma.sync`: why it
    /// does not take `wgmma` (empty off the Hopper path).
    pub no_wgmma: Vec<(usize, WgmmaOff)>,
    /// The all-reduce this kernel performs itself (multi-GPU plans, [`super::exchange`]).
    pub exchange: Option<super::exchange::Exchange>,
    /// The combining step of split attention this kernel performs in its clusters
    /// ([`super::combine`]).
    pub cluster_combine: Option<super::combine::ClusterCombine>,
    /// The combining step of split attention this kernel performs in the last block of each
    /// group of key splits ([`super::combine`]).
    pub last_block_combine: Option<super::combine::LastBlockCombine>,
    /// Why this kernel has no grid split where one was asked for (`--grid-split N`) or the
    /// planner's rule considered one; `None` when it has one or none was considered.
    pub grid_split_off: Option<NoGridSplit>,
    /// How the body computes: through the schedule's shared-memory tiles, or every tile in
    /// registers ([`super::rows`]).
    pub body: Body,
    /// Whether the loop derives its warp index through a warp shuffle, so that ptxas can prove
    /// it uniform: kernels that issue `wgmma`, which ptxas serialises on a path it considers
    /// divergent (`if (warp >= …) return;` in the runtime's matmuls). H100: mqa_bs8 g12 39.5 →
    /// 35.7 µs, gqa_bs8 g0 27.1 → 26.8 (docs/benchmarks.md).
    pub uniform_warp: bool,
    /// How the loop body derives its thread indices (and whether ptxas may keep loop-invariant
    /// address arithmetic in registers across iterations).
    pub loop_indices: LoopIndices,
    /// The register accumulators that reach shared memory after the loop, in the order the
    /// kernel writes them (behind [`BodyBarriers::before_write_back`] when the body does not
    /// end with a barrier).
    pub write_backs: Vec<WriteBack>,
    /// Where the kernel waits for its `cp.async` copies outside a ring.
    pub copy_waits: CopyWaits,
}

/// Where a threadblock kernel waits for its copies by `cp.async` outside a ring
/// ([`super::ops::CopyEngine::CpAsyncWaited`]), per phase: the indices of the schedule steps
/// it waits before (the first barrier after such a copy, which then publishes its tile), and
/// the phase's step count for a wait at the phase's end (a copy after its last barrier).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CopyWaits {
    /// Before the pre-loop phase's steps at these indices.
    pub pre_loop: Vec<usize>,
    /// Before the loop body's steps at these indices.
    pub body: Vec<usize>,
    /// Before the post-loop phase's steps at these indices.
    pub post_loop: Vec<usize>,
}

impl CopyWaits {
    /// The step indices of phase `ph` the kernel waits before.
    pub fn of(&self, ph: super::order::Phase) -> &[usize] {
        use super::order::Phase;
        match ph {
            Phase::PreLoop => &self.pre_loop,
            Phase::Loop => &self.body,
            Phase::PostLoop => &self.post_loop,
        }
    }

    /// Whether the kernel waits before step `i` of phase `ph` (`i` = the phase's step count:
    /// at its end).
    pub fn before(&self, ph: super::order::Phase, i: usize) -> bool {
        self.of(ph).contains(&i)
    }

    /// The waits in all phases.
    pub fn count(&self) -> usize {
        self.pre_loop.len() + self.body.len() + self.post_loop.len()
    }
}

/// The loop's ring of pipeline stages ([`KernelPlan::ring`]) and the protocol its depth
/// gives: the first `stages − 1` iterations of the CTA's share are loaded before the loop (one
/// `cp.async` group and one TMA stage each); iteration `it` reads slot `(it − it0) mod stages`
/// once its `cp.async` groups (all but the `stages − 2` newest) and its slot's `full` mbarrier
/// (parity: the pass over the ring, `(it − it0) / stages`, mod 2) are complete; after the body's
/// first barrier ([`Prefetch`]) it refills the slot read one iteration before with iteration
/// `it + stages − 1`, when that iteration is in the CTA's share (a `cp.async` group is
/// committed anyway, empty past the end, so that the count of pending groups stays exact).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ring {
    /// Slots of every input of the ring.
    pub stages: usize,
    /// The inputs the threads copy by `cp.async` (threadblock op indices, in op order).
    pub cp_async: Vec<usize>,
    /// The inputs TMA loads (threadblock op indices, in op order), issued by thread 0.
    pub tma: Vec<usize>,
}

impl Ring {
    /// Iterations loaded before the loop.
    pub fn prologue(&self) -> usize {
        self.stages - 1
    }

    /// `cp.async` groups that may still be pending when an iteration waits for its stage.
    pub fn pending_groups(&self) -> usize {
        self.stages - 2
    }

    /// How many iterations ahead the refill loads.
    pub fn refill_distance(&self) -> usize {
        self.stages - 1
    }

    /// Whether threadblock op `op` is one of the ring's inputs.
    pub fn holds(&self, op: usize) -> bool {
        self.cp_async.contains(&op) || self.tma.contains(&op)
    }
}

/// The key split ([`RegisterPipe::keys`] > 1) whose online output accumulator is `acc`, with
/// its online state, among `pipes`.
pub fn key_split_of(
    pipes: &[PipeDecision],
    acc: Handle<crate::graph::threadblock::TbOp>,
) -> Option<(&RegisterPipe, &OnlinePipe)> {
    pipes.iter().filter_map(PipeDecision::on).find_map(|p| {
        p.online
            .as_ref()
            .filter(|o| p.keys > 1 && o.out_acc == acc)
            .map(|o| (p, o))
    })
}

/// A register accumulator written to shared memory after the loop, for the readers of its
/// tile (or the combination of a key split's warps).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteBack {
    /// The registers are stored to the accumulator's buffer: the `mma` fragment of matmul
    /// `fragment_of`, or else each thread's elements of the leader's walk.
    Store {
        /// The accumulator (threadblock op index).
        acc: usize,
        /// The matmul whose fragment the registers follow.
        fragment_of: Option<usize>,
    },
    /// The output accumulator of a key split ([`RegisterPipe::keys`] > 1): the warps' running
    /// maxima, row sums and output fragments combine into the tiles of its pipe's max, sum and
    /// output accumulators, every thread of the block taking part.
    KeySplit {
        /// The output accumulator (threadblock op index).
        acc: usize,
        /// The warps that split the keys.
        warps: usize,
    },
}

impl WriteBack {
    /// The accumulator written back.
    pub fn acc(&self) -> usize {
        match *self {
            WriteBack::Store { acc, .. } | WriteBack::KeySplit { acc, .. } => acc,
        }
    }
}

/// How a threadblock kernel's body computes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// The schedule's chains over shared-memory tiles; why register rows do not apply.
    Tiles(super::rows::RowsOff),
    /// Every tile in registers, one element-to-thread map for all (the schedule, tiles and
    /// operator plans are then not used).
    Rows(super::rows::RegisterRows),
}

impl KernelPlan {
    /// The register-rows form of the body, if it has it.
    pub fn rows(&self) -> Option<&super::rows::RegisterRows> {
        match &self.body {
            Body::Rows(r) => Some(r),
            Body::Tiles(_) => None,
        }
    }

    /// The cluster shape the kernel is compiled with (`__cluster_dims__`): the CTAs of a
    /// cluster split along x ([`Split::Cluster`]), or the key splits of a cluster combine
    /// ([`KernelPlan::cluster_combine`], which a split kernel never gets:
    /// `NoFold::LoopSplit`); `None`: no clusters.
    pub fn cluster_dims(&self) -> Option<[usize; 3]> {
        match (&self.split, &self.cluster_combine) {
            (Split::Cluster(c), _) => Some([c.ctas, 1, 1]),
            (Split::Off(_), Some(c)) => Some(c.dims()),
            (Split::Off(_) | Split::Grid(_), _) => None,
        }
    }
}

impl KernelPlan {
    /// The instruction-level features the kernel's code uses, in a fixed order: each follows
    /// from a plan field (copy engines, TMA loads, operand loads and matmul instructions,
    /// register pipes, the cluster split, the launch).
    pub fn features(&self) -> Vec<Feature> {
        use super::ops::{CopyEngine, MatmulInstr, OperandLoad};
        let mut f = Vec::new();
        if self.rows().is_some() {
            f.push(Feature::RegisterRows);
            if self.dependent.is_programmatic() || self.triggers_next {
                f.push(Feature::ProgrammaticLaunch);
            }
            return f;
        }
        let mut add = |on: bool, x: Feature| {
            if on {
                f.push(x);
            }
        };
        let matmuls = || {
            self.ops.iter().filter_map(|p| match p {
                OpPlan::Matmul { instr, loads, .. } => Some((*instr, *loads)),
                _ => None,
            })
        };
        add(
            self.ops.iter().any(|p| {
                matches!(
                    p,
                    OpPlan::Input {
                        engine: CopyEngine::CpAsync | CopyEngine::CpAsyncWaited,
                        ..
                    }
                )
            }),
            Feature::CpAsync,
        );
        add(!self.tma.loads.is_empty(), Feature::Tma);
        let ldm = |l: OperandLoad| matches!(l, OperandLoad::Ldmatrix | OperandLoad::LdmatrixTrans);
        add(
            matmuls().any(|(i, (a, b))| i.is_mma() && (ldm(a) || ldm(b))),
            Feature::Ldmatrix,
        );
        add(
            matmuls().any(|(i, _)| matches!(i, MatmulInstr::MmaSyncM16N8K16 { .. })),
            Feature::MmaSync,
        );
        add(
            matmuls().any(|(i, _)| matches!(i, MatmulInstr::WgmmaM64K16 { .. })),
            Feature::Wgmma,
        );
        add(matmuls().any(|(i, _)| !i.is_mma()), Feature::FmaMatmul);
        add(
            self.register_pipes().next().is_some(),
            Feature::RegisterPipe,
        );
        add(
            self.split.cluster().is_some() || self.cluster_combine.is_some(),
            Feature::Cluster,
        );
        add(self.split.grid().is_some(), Feature::GridSplit);
        add(
            self.dependent.is_programmatic() || self.triggers_next,
            Feature::ProgrammaticLaunch,
        );
        f
    }

    /// The register pipes (the products that stay in registers).
    pub fn register_pipes(&self) -> impl Iterator<Item = &RegisterPipe> {
        self.pipes.iter().filter_map(PipeDecision::on)
    }

    /// The register pipe chain `c` produces, if any.
    pub fn pipe_from(&self, c: usize) -> Option<&RegisterPipe> {
        self.register_pipes().find(|r| r.producer == c)
    }

    /// The register pipe whose producer runs chain `c` for it (the consumer matmul's chain or a
    /// row sum's), if any.
    pub fn pipe_into(&self, c: usize) -> Option<&RegisterPipe> {
        self.register_pipes()
            .find(|r| r.consumers().any(|o| self.fusion.chain_of[o.index()] == c))
    }
}

/// A product kept in registers between two tensor-core matmuls (attention's P = exp(Q·K) on
/// its way to P·V): the producer's chain computes its matmul into a fragment, applies its
/// unary members in place (rounding to the tile's type, as a store would), sums the rows for
/// the row-summing accumulators over the tile by warp shuffles and feeds the fragment to the
/// consumer matmul as its A operand. Both matmuls run on warps along M only, so that a warp
/// owns whole rows of the product: the `m16n8` accumulator fragment of two adjacent n-tiles is
/// the `m16n8k16` A fragment of one k-step. The tile never reaches shared memory, and the
/// consumers run at the producer's level of the schedule (no barrier between them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisterPipe {
    /// The chain whose matmul produces the tile (its members applied).
    pub producer: usize,
    /// The tile that stays in registers.
    pub tile: usize,
    /// The matmul taking the tile as its A operand; its chain (into a register accumulator's
    /// fragment) runs inside the producer's.
    pub matmul: Handle<TbOp>,
    /// Row-summing accumulators of the tile, summed inside the producer's chain.
    pub row_sums: Vec<Handle<TbOp>>,
    /// Warps along M of both matmuls (one along N) when [`RegisterPipe::keys`] is 1.
    pub warps: usize,
    /// Warps splitting the product's columns (the consumer's K, attention's keys): 1 (whole rows
    /// per warp), or the CTA's warps when its row tiles do not split evenly over them (online
    /// form only): the producer then runs on 1 × `keys` warps, each warp keeps its own running
    /// max, row sum and output fragment over its columns, and the warps combine them after the
    /// loop (`Mma::run_from_keys`, `Mma::combine_keys`).
    pub keys: usize,
    /// The running-max form (the online-softmax rewrite's attention kernel), if it is one.
    pub online: Option<OnlinePipe>,
}

/// A register pipe with a running row max ([`super::softmax`]): the producer's matmul gives the
/// scores S; per row, the warp's lanes meet by shuffles for the max of S, the running max m
/// (kept in registers across the loop, rounded to the tile type as the graph stores it) moves
/// to max(m, rowmax), the product's rows are rescaled by r = exp(m_old − m_new), and the pipe's
/// tile is exp(S − m) (packed in the tile's type, summed per row into l ← l·r + Σ). Every tile
/// between (S, m, m_old − m_new, S − m, r and the consumer's product) stays in registers; l
/// and the final m are written per row by the row's first lane. Its exponentials are
/// `ex2.approx.ftz` of one FFMA each (their values are rounded to the 16-bit tile type right
/// after, or are the rescale factors of fp32 state); the chains of `sub` and of the rescale
/// factor plan none of their own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OnlinePipe {
    /// The running-max reduction (outputs m and m_old − m_new).
    pub max: Handle<TbOp>,
    /// The subtraction S − m, which leads the chain ending in the pipe's exp.
    pub sub: Handle<TbOp>,
    /// exp(m_old − m_new), the rescale factor r.
    pub rescale: Handle<TbOp>,
    /// The max accumulator of m (the final running max, a graph output).
    pub max_acc: Handle<TbOp>,
    /// l ← l·r + Σ (`accum_red_ld_sum_rescale`).
    pub sum_acc: Handle<TbOp>,
    /// O ← O·r + P (`accum_nored_rescale`), in the consumer matmul's fragment.
    pub out_acc: Handle<TbOp>,
    /// Every tile the pipe keeps in registers besides [`RegisterPipe::tile`].
    pub registers: Vec<usize>,
}

impl RegisterPipe {
    /// The operators whose chains run inside the producer's.
    pub fn consumers(&self) -> impl Iterator<Item = Handle<TbOp>> + '_ {
        let online = self
            .online
            .iter()
            .flat_map(|o| [o.max, o.sub, o.rescale, o.max_acc, o.sum_acc, o.out_acc]);
        std::iter::once(self.matmul)
            .chain(self.row_sums.iter().copied())
            .chain(online)
    }

    /// Every tile the pipe keeps in registers.
    pub fn tiles(&self) -> Vec<usize> {
        let mut v = vec![self.tile];
        if let Some(o) = &self.online {
            v.extend(o.registers.iter().copied());
        }
        v
    }
}

/// Whether a matmul's product that another matmul reads as A stays in registers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PipeDecision {
    /// It does.
    On(RegisterPipe),
    /// It goes through shared memory, for this reason.
    Off {
        /// The tile.
        tile: usize,
        /// Why.
        why: PipeOff,
    },
}

impl PipeDecision {
    /// The pipe, when the product stays in registers.
    pub fn on(&self) -> Option<&RegisterPipe> {
        match self {
            PipeDecision::On(p) => Some(p),
            PipeDecision::Off { .. } => None,
        }
    }
}

/// Why a product that a tensor-core matmul takes as A goes through shared memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PipeOff {
    /// `--no-register-pipes` (or `Options::register_pipes` false).
    TurnedOff,
    /// An operator of the producer's chain after its matmul is not unary.
    NotUnary {
        /// The operator.
        op: usize,
        /// Its kind's name.
        kind: String,
    },
    /// The consumer matmul does not run on tensor cores.
    ConsumerNotMma {
        /// The consumer matmul.
        op: usize,
    },
    /// The consumer takes the tile as both operands.
    BothOperands {
        /// The consumer matmul.
        op: usize,
    },
    /// Another operator reads the tile (only row sums can take it from registers).
    OtherReader {
        /// The reader.
        op: usize,
        /// Its kind's name.
        kind: String,
    },
    /// The consumer's product does not go straight into a register accumulator's fragment.
    NotIntoFragment {
        /// The consumer matmul.
        op: usize,
    },
    /// The tile is stored in a wider type than its own.
    Widened,
    /// The consumer's M × K is not the tile's shape.
    ShapeMismatch,
    /// The tile is not made of whole 16 × 16 tiles.
    NotWhole16 {
        /// Rows.
        m: usize,
        /// Columns.
        n: usize,
    },
    /// The row tiles of 16 do not split evenly over the CTA's warps (and, for the online form,
    /// the columns do not split into pairs of 8-column tiles per warp either).
    UnevenRows {
        /// Row tiles of 16.
        row_tiles: usize,
        /// Warps of the CTA.
        warps: usize,
    },
    /// The online form's row tiles do not split evenly over the CTA's warps, and its columns
    /// (the consumer's K) do not split into pairs of 8-column tiles per warp.
    UnevenKeys {
        /// Row tiles of 16.
        row_tiles: usize,
        /// Columns of the product.
        cols: usize,
        /// Warps of the CTA.
        warps: usize,
    },
    /// The two fragments would take more registers than [`crate::sched::pipe::PIPE_REGISTERS`].
    Registers {
        /// fp32 registers per thread they would take.
        regs: usize,
    },
    /// A consumer would still run after the producer's level (it reads another tile written
    /// there, or runs in another phase).
    Late {
        /// The consumer.
        op: usize,
        /// Its kind's name.
        kind: String,
    },
    /// The scores feed a running max, but not in the online-softmax form ([`OnlinePipe`]).
    Online(OnlineShape),
}

/// Where a register pipe's scores that feed a running max depart from the online-softmax form
/// ([`PipeOff::Online`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnlineShape {
    /// The scores are not read by a running max and S - m.
    ScoresReaders,
    /// The scores have other readers.
    ScoresShared,
    /// The running max is not over the rows.
    MaxNotOverRows,
    /// S - m does not lead a chain into exp.
    NoExp,
    /// The running max is not accumulated, or its change is read twice.
    MaxNotAccumulated,
    /// The running max or its change have other readers.
    MaxShared,
    /// exp(S - m) is not read by a matmul and a rescaled row sum.
    ExpReaders,
    /// The product is not accumulated by one `accum_nored_rescale`.
    ProductNotRescaled,
    /// The rescaled accumulator leads a longer chain.
    LongerChain,
}

impl fmt::Display for OnlineShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OnlineShape::ScoresReaders => "the scores are not read by a running max and S - m",
            OnlineShape::ScoresShared => "the scores have other readers",
            OnlineShape::MaxNotOverRows => "the running max is not over the rows",
            OnlineShape::NoExp => "S - m does not lead a chain into exp",
            OnlineShape::MaxNotAccumulated => {
                "the running max is not accumulated, or its change read twice"
            }
            OnlineShape::MaxShared => "the running max or its change have other readers",
            OnlineShape::ExpReaders => "exp(S - m) is not read by a matmul and a rescaled row sum",
            OnlineShape::ProductNotRescaled => {
                "the product is not accumulated by one accum_nored_rescale"
            }
            OnlineShape::LongerChain => "the rescaled accumulator leads a longer chain",
        })
    }
}

impl fmt::Display for PipeOff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PipeOff::TurnedOff => f.write_str("register pipes turned off (--no-register-pipes)"),
            PipeOff::NotUnary { op, kind } => {
                write!(
                    f,
                    "op{op} {kind} between the matmuls is not a unary operator"
                )
            }
            PipeOff::ConsumerNotMma { op } => {
                write!(f, "op{op} matmul does not run on tensor cores")
            }
            PipeOff::BothOperands { op } => {
                write!(f, "op{op} matmul reads the tile as both operands")
            }
            PipeOff::OtherReader { op, kind } => write!(
                f,
                "op{op} {kind} also reads the tile (only row sums can read it from registers)"
            ),
            PipeOff::NotIntoFragment { op } => write!(
                f,
                "op{op} matmul's product does not go straight into a register accumulator"
            ),
            PipeOff::Widened => f.write_str("the tile is stored in a wider type than its own"),
            PipeOff::ShapeMismatch => f.write_str("the consumer's M × K is not the tile's shape"),
            PipeOff::NotWhole16 { m, n } => {
                write!(f, "the tile's {m} × {n} is not made of whole 16 × 16 tiles")
            }
            PipeOff::UnevenRows { row_tiles, warps } => write!(
                f,
                "the {row_tiles} row tiles of 16 do not split evenly over {warps} warps"
            ),
            PipeOff::UnevenKeys {
                row_tiles,
                cols,
                warps,
            } => write!(
                f,
                "the {row_tiles} row tiles of 16 do not split evenly over {warps} warps, nor the \
                 {cols} columns into pairs of 8-column tiles per warp"
            ),
            PipeOff::Registers { regs } => write!(
                f,
                "the two fragments would take {regs} registers per thread (at most {})",
                crate::sched::pipe::PIPE_REGISTERS
            ),
            PipeOff::Late { op, kind } => write!(
                f,
                "op{op} {kind} would still run after the producer's level (it reads another \
                 tile written there, or runs in another phase)"
            ),
            PipeOff::Online(why) => write!(f, "online softmax: {why}"),
        }
    }
}

/// Where a block's region of a device tensor starts: Σ over the steps of the µGraph block index
/// along `axis` × `elems` elements (under a cluster split the CTAs of a cluster share their
/// µGraph block index).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockRegion {
    /// (grid axis, elements per block index), for the axes the operator's map sends to a dim.
    pub steps: Vec<(usize, usize)>,
    /// Elements the region moves per for-loop iteration: the tile's extent along the input's
    /// for-loop dim times the tensor's stride there (0 for outputs and loop-invariant inputs).
    pub per_iter: usize,
}

impl std::fmt::Display for BlockRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut terms: Vec<String> = self
            .steps
            .iter()
            .map(|&(a, e)| format!("{}·{e}", crate::graph::ops::AXIS_NAMES[a]))
            .collect();
        if self.per_iter > 0 {
            terms.push(format!("it·{}", self.per_iter));
        }
        if terms.is_empty() {
            return f.write_str("0");
        }
        f.write_str(&terms.join(" + "))
    }
}

/// Where a kernel issues its ring's prologue ([`Ring::prologue`]: the loads of the first
/// iterations of its share of the loop).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingStart {
    /// No ring: nothing to issue.
    NoRing,
    /// Just before the loop: the kernel has no pre-loop steps.
    AtLoop,
    /// At the start of the kernel, ahead of the pre-loop steps and the accumulators' initial
    /// state, so that the first stages stream while the pre-loop loads (attention's Q tile)
    /// are in flight instead of after them. Its slots share no memory with a tile that dies
    /// before the loop.
    BeforePreLoop,
    /// Just before the loop, after the pre-loop steps: tile `tile`, which dies before the loop,
    /// shares shared memory with the ring's slots.
    AfterPreLoop {
        /// The tile the slots reuse the memory of.
        tile: usize,
    },
    /// Just before the loop, after the pre-loop steps: the ring copies by `cp.async` only, which
    /// every thread issues ahead of its own pre-loop loads (measured slower on an H100:
    /// gqa_bs8 g0 on the Ampere path 1.07× the time).
    CpAsyncOnly,
}

impl std::fmt::Display for RingStart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RingStart::NoRing => write!(f, "no ring"),
            RingStart::AtLoop => write!(f, "issued just before the loop"),
            RingStart::BeforePreLoop => write!(
                f,
                "issued at the kernel's start, ahead of the pre-loop steps, so that it streams \
                 while their loads are in flight"
            ),
            RingStart::AfterPreLoop { tile } => write!(
                f,
                "issued after the pre-loop steps (its slots reuse the shared memory of s{tile}, \
                 which dies before the loop)"
            ),
            RingStart::CpAsyncOnly => write!(
                f,
                "issued after the pre-loop steps: a ring of cp.async copies only, which every \
                 thread would issue ahead of its own pre-loop loads, measured slower"
            ),
        }
    }
}

/// Where the loop body issues the loads of a later pipeline stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prefetch {
    /// No multi-stage ring: nothing to prefetch.
    None,
    /// After the body's first barrier (every thread is done with the oldest stage's slot).
    AfterFirstBarrier,
    /// At the end of a body that has no barrier, behind one of its own
    /// ([`BarrierReason::BeforePrefetch`](super::order::BarrierReason::BeforePrefetch)).
    EndOfBody,
}

/// The barriers of a threadblock kernel's body beyond its schedule's: around the accumulators'
/// initial state, the loop's ring and the write-backs and finalisation after the loop. The
/// emitter prints exactly these (with the schedule's) and decides none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyBarriers {
    /// A barrier after the accumulators' initial state: a tile was filled in shared memory or
    /// the zero page written.
    pub after_initial_state: bool,
    /// Where the loop refills its ring (a barrier of its own at the end of a barrier-free body).
    pub prefetch: Prefetch,
    /// A barrier before register accumulators are written back to shared memory after the
    /// loop (a write-back buffer may share memory with tiles the body reads), when the body
    /// does not end with one.
    pub before_write_back: bool,
    /// A barrier before mean and RMS accumulators are finalised.
    pub before_finalize: bool,
    /// Under a cluster split with rescaled partials ([`Combine::Rescaled`]), which read CTA 0's
    /// max tile: the index in [`ClusterSplit::partials`] of the first fold after them, which
    /// CTA 0 runs behind a barrier (the max tile's own fold among them).
    pub after_rescaled_folds: Option<usize>,
    /// Under a cluster split whose partials are pushed ([`Gather::Push`]) or a grid split
    /// ([`GridSplit`]): a barrier after the write-backs, before the CTAs read their partial
    /// tiles to push or store them.
    pub before_push: bool,
}

impl BodyBarriers {
    /// Whether the loop body, as printed, ends with a barrier (the schedule's last step, or
    /// the one before an end-of-body prefetch).
    pub fn body_ends_with_barrier(&self, schedule: &super::order::Schedule) -> bool {
        self.prefetch == Prefetch::EndOfBody
            || matches!(schedule.body.last(), Some(super::order::Step::Barrier(_)))
    }

    /// The barriers with their reasons, in the order the kernel meets them (the loop's once).
    pub fn reasons(&self) -> Vec<super::order::BarrierReason> {
        use super::order::BarrierReason as R;
        [
            (self.after_initial_state, R::InitialState),
            (self.prefetch == Prefetch::EndOfBody, R::BeforePrefetch),
            (self.before_write_back, R::BeforeWriteBack),
            (self.before_push, R::BeforePush),
            (self.before_finalize, R::BeforeFinalize),
            (self.after_rescaled_folds.is_some(), R::AfterRescaledFolds),
        ]
        .into_iter()
        .filter_map(|(on, r)| on.then_some(r))
        .collect()
    }
}

impl KernelPlan {
    /// The launch grid: the µGraph grid with x multiplied by the CTAs of a cluster split.
    pub fn launch_grid(&self) -> [usize; 3] {
        let [x, y, z] = self.cta.grid;
        [x * self.split.ctas(), y, z]
    }

    /// The loop's ring of pipeline stages, if its inputs have one: every input copied by
    /// `cp.async` or TMA ahead of the iteration that reads it ([`CopyEngine::pipelined`]),
    /// with the depth of [`Self::pipeline_stages`] (more than 1).
    ///
    /// [`CopyEngine::pipelined`]: super::ops::CopyEngine::pipelined
    pub fn ring(&self) -> Option<Ring> {
        use super::ops::CopyEngine;
        let stages = self.pipeline_stages();
        let mut ring = Ring {
            stages,
            cp_async: Vec::new(),
            tma: Vec::new(),
        };
        for (i, p) in self.ops.iter().enumerate() {
            match p {
                OpPlan::Input {
                    engine: CopyEngine::CpAsync,
                    ..
                } => ring.cp_async.push(i),
                OpPlan::Input {
                    engine: CopyEngine::Tma,
                    ..
                } => ring.tma.push(i),
                _ => {}
            }
        }
        (stages > 1 && !(ring.cp_async.is_empty() && ring.tma.is_empty())).then_some(ring)
    }

    /// The shared-memory buffers of the ring's slots (those of its inputs' tiles), in operator
    /// order; empty without a ring.
    pub fn ring_slots(&self, tb: &crate::graph::threadblock::TbGraph) -> Vec<usize> {
        let Some(ring) = self.ring() else {
            return Vec::new();
        };
        tb.ops
            .iter()
            .filter(|(h, _)| ring.holds(h.index()))
            .filter_map(|(_, top)| self.smem.buffer_of(top.outputs.first()?.index()))
            .collect()
    }

    /// Pipeline stages of the loop's `cp.async` ring (1: no ring).
    pub fn pipeline_stages(&self) -> usize {
        self.ops
            .iter()
            .filter_map(|p| match p {
                OpPlan::Input { stages, .. } => Some(*stages),
                _ => None,
            })
            .max()
            .unwrap_or(1)
    }
}

/// An intermediate that makes a round trip through the workspace to its only reader, a
/// kernel-level element-wise operator (kernel-level operators are not fused).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KnUnfused {
    /// The intermediate.
    pub tensor: Handle<DTensor>,
    /// The operator that writes it.
    pub producer: Handle<KnOp>,
    /// Its only reader.
    pub consumer: Handle<KnOp>,
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
    /// The caller's input buffers in order.
    pub inputs: Vec<IoPlan>,
    /// The caller's output buffers in order.
    pub outputs: Vec<IoPlan>,
    /// Per kernel operator (by index): how it runs.
    pub kernel_ops: Vec<KnOpPlan>,
    /// The kernel-level operators whose kernels let the next launch start early
    /// (`griddepcontrol.launch_dependents` first thing): those followed by a programmatic
    /// threadblock kernel, and the graph's last step when it is one and launches are
    /// programmatic (`sched::plan_dependent_launches`).
    pub kernel_level_triggers: std::collections::BTreeSet<usize>,
    /// Per customized operator (by kernel op index).
    pub kernels: BTreeMap<usize, KernelPlan>,
    /// Workspace buffers (intermediate DTensors).
    pub workspace: Vec<Buffer>,
    /// The DTensor of each workspace buffer.
    pub workspace_tensors: Vec<usize>,
    /// Workspace packing.
    pub workspace_packing: Packing,
    /// Intermediates that make a round trip through the workspace to their only reader.
    pub unfused: Vec<KnUnfused>,
    /// Names of the generated file's symbols.
    pub symbols: Symbols,
    /// GPUs of the graph's mesh: every GPU runs this plan on its own shards, and
    /// `kn_allreduce_op`s are NCCL all-reduces across them (1: one GPU, no NCCL).
    pub gpus: usize,
    /// Bytes of the exchange buffer every GPU needs for the all-reduces fused into kernels
    /// ([`super::exchange`]; 0: none).
    pub exchange_bytes: usize,
    /// Bytes of the grid splits' partial slots ([`GridSplit`]), past the workspace's buffers
    /// at [`GraphPlan::splits_at`] (0: none).
    pub split_bytes: usize,
    /// Bytes of arrival counters at the end of the workspace (last-block combines,
    /// [`super::combine::LastBlockCombine`], and grid splits, [`GridSplit`]): zero before the
    /// first execution, and every execution leaves them zero (0: none).
    pub counter_bytes: usize,
    /// The rewrite planned instead of the caller's graph (kernel-level matmuls fused into their
    /// reader), and the matmuls kept and why; every index in the other fields refers to
    /// [`GraphPlan::graph`].
    pub rewrite: super::rewrite::Rewrite,
    /// Time spent planning.
    pub elapsed: Duration,
}

/// Where the grid splits' slots start in a workspace whose buffers take `peak` bytes.
pub fn splits_at(peak: usize) -> usize {
    peak.next_multiple_of(WORKSPACE_ALIGN)
}

/// Where the arrival counters start in a workspace whose buffers take `peak` bytes, followed by
/// `split_bytes` of grid-split slots.
pub fn counters_at(peak: usize, split_bytes: usize) -> usize {
    (splits_at(peak) + split_bytes).next_multiple_of(WORKSPACE_ALIGN)
}

impl GraphPlan {
    /// The graph this plan is for: the rewritten graph ([`GraphPlan::rewrite`]) if the planner
    /// rewrote `original`, else `original` (the graph the plan was made from).
    pub fn graph<'a>(
        &'a self,
        original: &'a crate::graph::kernel::KernelGraph,
    ) -> &'a crate::graph::kernel::KernelGraph {
        self.rewrite.graph.as_deref().unwrap_or(original)
    }

    /// The runtime headers the generated file includes beyond the base runtime, in include
    /// order: Hopper's where a kernel loads by TMA or launches programmatically, the cluster
    /// header where a kernel runs as clusters (a split for-loop, an in-cluster combine), NCCL's
    /// on several GPUs, the exchange header where a kernel all-reduces itself.
    pub fn runtime_headers(&self) -> Vec<RuntimeHeader> {
        let any = |f: fn(&KernelPlan) -> bool| self.kernels.values().any(f);
        let mut v = Vec::new();
        if any(|k| !k.tma.loads.is_empty() || k.dependent.is_programmatic() || k.triggers_next)
            || !self.kernel_level_triggers.is_empty()
        {
            v.push(RuntimeHeader::Hopper);
        }
        if any(|k| k.split.cluster().is_some() || k.cluster_combine.is_some()) {
            v.push(RuntimeHeader::Cluster);
        }
        if self.gpus > 1 {
            v.push(RuntimeHeader::Nccl);
        }
        if any(|k| k.exchange.is_some()) {
            v.push(RuntimeHeader::Exchange);
        }
        v
    }

    /// Workspace bytes: the buffers' peak, then the grid splits' slots
    /// ([`GraphPlan::split_bytes`]), then the arrival counters ([`GraphPlan::counter_bytes`]).
    pub fn workspace_bytes(&self) -> usize {
        match (self.split_bytes, self.counter_bytes) {
            (0, 0) => self.workspace_packing.peak,
            (s, 0) => self.splits_at() + s,
            (_, c) => self.counters_at() + c,
        }
    }

    /// Where the grid splits' slots start in the workspace: past every buffer, aligned.
    pub fn splits_at(&self) -> usize {
        splits_at(self.workspace_packing.peak)
    }

    /// Where the arrival counters start in the workspace: past every buffer and slot, aligned.
    pub fn counters_at(&self) -> usize {
        counters_at(self.workspace_packing.peak, self.split_bytes)
    }

    /// Whether any tensor lives in the workspace.
    pub fn uses_workspace(&self) -> bool {
        self.dtensors
            .iter()
            .any(|d| matches!(d.placement, Placement::Workspace(_)))
    }

    /// Where DTensor `t` starts.
    pub fn binding(&self, t: Handle<DTensor>, elem_bytes: usize) -> Binding {
        Binding::of(self.dtensors[t.index()].placement, elem_bytes)
    }
}
