//! Per-operator plans: how each threadblock operator will be carried out.
//!
//! - **Inputs and outputs**: a chunked copy of the widest chunk (16 bytes, else 8 or 4, at least
//!   two elements) such that the tile and the DTensor share their innermost dim, the tile's rows
//!   are a whole number of chunks, and every row start — DTensor strides, block offsets,
//!   per-iteration offsets — is chunk-aligned; an element copy otherwise (never a chunk that
//!   crosses a row end, so no read or write past a tile). In-loop
//!   chunked inputs on targets with `cp.async` are software-pipelined; the stage count is chosen
//!   later from the shared-memory budget.
//! - **Accumulators** accumulate in fp32 (fp64 for fp64 and integer graphs). Element-wise kinds
//!   (nored, max) stay in registers when the per-thread cost fits the target's budget (exact MMA
//!   fragment sizes after a matmul, ⌈elements / threads⌉ otherwise) and, unless a matmul feeds
//!   them, the loop runs more than once; reducing kinds reduce every
//!   iteration's tile (row sums by groups of threads, or shared-memory atomics from a matmul's
//!   fragment) into a small shared-memory state; rescaling kinds live in shared memory.
//! - **Matmuls**: the warp grid (warps along M × warps along N) that minimises the per-warp
//!   instruction count (MMA calls plus `ldmatrix` loads), ties broken toward more warps; fp16 and
//!   bf16 use `mma.sync m16n8k16` with fp32 accumulation, other types FMA.
//! - **Row reductions** (tb reductions, rms_norm): threads per row from [`threads_per_row`].

use std::fmt;

use super::plan::WgmmaOff;
use crate::graph::arena::Handle;
use crate::graph::dtype::DType;
use crate::graph::fusion::FusionPlan;
use crate::graph::ops::{AccumKind, DimMap, TbReduction};
use crate::graph::shape::{Shape, Strides};
use crate::graph::threadblock::{STensor, TbGraph, TbOp, TbOpKind};
use crate::layout::solve::KernelLayout;
use crate::layout::strides::padded_strides;
use crate::layout::swizzle::{AtomColumns, Swizzle, TileGeometry};
use crate::target::Target;

/// How a tile moves between global and shared memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Copy {
    /// Chunks of `bytes` bytes (16, else 8 or 4) along `dim`.
    Chunked {
        /// The shared innermost dim.
        dim: usize,
        /// Elements per chunk.
        chunk_elems: usize,
        /// Bytes per chunk in the device tensor: the width of each load, store or `cp.async`
        /// there.
        bytes: usize,
        /// Bytes per chunk in the tile: `bytes`, or more where an output's tile holds a wider
        /// type (fp32 accumulator values) and each chunk converts in registers between one
        /// vector load and one vector store.
        tile_bytes: usize,
    },
    /// One element at a time.
    Elementwise {
        /// Why not chunked.
        reason: ChunkOff,
    },
}

/// Why a copy or a vector step cannot move chunks of several elements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChunkOff {
    /// Elements are as wide as the widest chunk.
    WideElements,
    /// The tile's innermost dim is not the device tensor's contiguous dim.
    NotContiguous {
        /// The tile's innermost dim.
        dim: usize,
    },
    /// Rows are no whole number of chunks.
    PartialChunks {
        /// Elements per row.
        row: usize,
        /// Bytes per chunk.
        bytes: usize,
    },
    /// A dim's stride is no multiple of the chunk.
    Stride {
        /// The dim.
        dim: usize,
        /// Its stride in elements.
        stride: usize,
        /// Elements per chunk.
        chunk: usize,
    },
    /// The blocks' offsets along a dim are not chunk-aligned.
    BlockOffsets {
        /// The dim.
        dim: usize,
        /// The offset in elements.
        offset: usize,
        /// Bytes per chunk.
        bytes: usize,
    },
    /// The iterations' offsets along a dim are not chunk-aligned.
    IterationOffsets {
        /// The dim.
        dim: usize,
        /// The offset in elements.
        offset: usize,
        /// Bytes per chunk.
        bytes: usize,
    },
    /// A step wider than 16 bytes.
    WiderThan16 {
        /// Elements per step.
        elements: usize,
    },
    /// An accumulator tile of wider values whose rows keep no chunk of two or more whole.
    WideValues {
        /// The tile's type.
        dtype: DType,
    },
    /// The tile's swizzle keeps smaller chunks whole.
    Swizzle {
        /// Bytes it keeps whole.
        kept: usize,
    },
}

impl fmt::Display for ChunkOff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChunkOff::WideElements => f.write_str("elements are as wide as a chunk"),
            ChunkOff::NotContiguous { dim } => write!(
                f,
                "the tile's innermost dim {dim} is not the tensor's contiguous dim"
            ),
            ChunkOff::PartialChunks { row, bytes } => write!(
                f,
                "rows of {row} elements are not a whole number of {bytes}-byte chunks"
            ),
            ChunkOff::Stride { dim, stride, chunk } => write!(
                f,
                "stride {stride} of dim {dim} is not a multiple of {chunk} elements"
            ),
            ChunkOff::BlockOffsets { dim, offset, bytes } => write!(
                f,
                "block offsets along dim {dim} ({offset} elements) are not {bytes}-byte aligned"
            ),
            ChunkOff::IterationOffsets { dim, offset, bytes } => write!(
                f,
                "iteration offsets along dim {dim} ({offset} elements) are not {bytes}-byte \
                 aligned"
            ),
            ChunkOff::WiderThan16 { elements } => {
                write!(f, "a step of {elements} elements is wider than 16 bytes")
            }
            ChunkOff::WideValues { dtype } => write!(
                f,
                "the tile holds {dtype} accumulator values in rows that keep no chunk of two or \
                 more of them whole"
            ),
            ChunkOff::Swizzle { kept } => {
                write!(f, "the tile's swizzle keeps only {kept}-byte chunks whole")
            }
        }
    }
}

impl Copy {
    /// Whether this is a chunked copy.
    pub fn is_chunked(&self) -> bool {
        matches!(self, Copy::Chunked { .. })
    }

    /// The bytes per chunk of a chunked copy in the device tensor (0 for an element copy).
    pub fn chunk_bytes(&self) -> usize {
        match self {
            Copy::Chunked { bytes, .. } => *bytes,
            Copy::Elementwise { .. } => 0,
        }
    }

    /// The bytes per chunk of a chunked copy in the tile (0 for an element copy).
    pub fn tile_chunk_bytes(&self) -> usize {
        match self {
            Copy::Chunked { tile_bytes, .. } => *tile_bytes,
            Copy::Elementwise { .. } => 0,
        }
    }

    /// Whether a chunked copy converts between a wider tile type and the tensor's.
    pub fn converts(&self) -> bool {
        matches!(self, Copy::Chunked { bytes, tile_bytes, .. } if tile_bytes != bytes)
    }
}

/// Who moves a tile from global to shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyEngine {
    /// The threads, with loads and stores (waited for before the next barrier).
    Threads,
    /// `cp.async` into a ring of pipeline stages, issued ahead of the iteration that reads it.
    CpAsync,
    /// `cp.async` into a tile no ring stages (loaded before the loop, or in the iteration that
    /// reads it), in a kernel with no `cp.async` ring, where the copies of its schedule level
    /// take a thread more chunks than its loads keep in flight: every chunk in flight at once,
    /// without a round trip through registers; waited for (`cp.async.wait_all`) right before
    /// the next barrier of its phase (or at the phase's end, where nothing reads it): see
    /// [`super::plan::CopyWaits`].
    CpAsyncWaited,
    /// The bulk tensor copy engine (TMA, sm_90a) into a ring of pipeline stages, one thread
    /// issuing each iteration's load ahead of it (see [`super::tma`]).
    Tma,
}

impl CopyEngine {
    /// Whether the copies are issued ahead into a ring of stages.
    pub fn pipelined(self) -> bool {
        matches!(self, CopyEngine::CpAsync | CopyEngine::Tma)
    }
}

/// Where an accumulator lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccumStorage {
    /// In registers across the loop (32-bit registers per thread).
    Registers {
        /// Registers per thread.
        per_thread: usize,
        /// The matmul whose `mma` fragment the registers follow (each thread keeps the
        /// elements its fragment holds); `None`: each thread keeps elements tid + r·threads of
        /// the leader's walk.
        fragment_of: Option<Handle<TbOp>>,
    },
    /// In shared memory.
    Shared,
    /// In shared memory, written once: a plain sum (`accum_nored`, not after a matmul) over a
    /// loop of one iteration holds 0 + its input, which its chain stores to the tile (as
    /// `v + 0`, so that −0 becomes +0 as in the sum) — no initial fill, no read-modify-write.
    WrittenOnce,
}

impl AccumStorage {
    /// Whether the accumulator lives in registers.
    pub fn in_registers(self) -> bool {
        matches!(self, AccumStorage::Registers { .. })
    }
}

/// The instruction a matmul runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulInstr {
    /// `mma.sync.aligned.m16n8k16` with fp32 accumulators, operands by `ldmatrix` where the
    /// tile layout allows; `dtype` is f16 or bf16.
    MmaSyncM16N8K16 {
        /// Operand type.
        dtype: DType,
    },
    /// `wgmma.mma_async.sync.aligned.m64nNk16` (Hopper, `sm_90a`) with fp32 accumulators in
    /// registers: the consumer of a register pipe whose B tile is one 128-byte swizzle atom wide
    /// (see [`wgmma_b`]); each warpgroup of the warps along M issues one instruction per
    /// 64 rows and k-step, A from the packed product, B by a shared-memory descriptor.
    WgmmaM64K16 {
        /// Operand type.
        dtype: DType,
        /// The instruction's N (64: B is read in columns of 64, one instruction each).
        n: usize,
    },
    /// One thread per element of C, fp32 (or fp64) FMAs.
    Fma,
}

impl MatmulInstr {
    /// Whether this runs on tensor cores.
    pub fn is_mma(self) -> bool {
        matches!(
            self,
            MatmulInstr::MmaSyncM16N8K16 { .. } | MatmulInstr::WgmmaM64K16 { .. }
        )
    }
}

impl fmt::Display for MatmulInstr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MatmulInstr::MmaSyncM16N8K16 { dtype } => {
                write!(f, "mma.sync.m16n8k16.f32.{dtype}.{dtype}.f32")
            }
            MatmulInstr::WgmmaM64K16 { dtype, n } => {
                write!(f, "wgmma.mma_async.m64n{n}k16.f32.{dtype}.{dtype}")
            }
            MatmulInstr::Fma => f.write_str("fma.f32"),
        }
    }
}

/// When a reducing accumulator reduces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccumReduce {
    /// No reduction (element-wise kinds).
    None,
    /// Each iteration's tile is reduced, then accumulated.
    EachIteration,
    /// The whole tile is accumulated and reduced once after the loop.
    AfterLoop,
}

/// How a tensor-core matmul operand reaches registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperandLoad {
    /// `ldmatrix` (rows of 16 bytes along K).
    Ldmatrix,
    /// `ldmatrix.trans` (rows of 16 bytes along M for A, along N for B).
    LdmatrixTrans,
    /// Two K-consecutive elements per 32-bit load (K contiguous and even, the other stride
    /// even, 2-element chunks kept whole), where `ldmatrix` cannot serve.
    Pairs,
    /// Element by element (the tile keeps no whole 16-byte rows in a usable direction).
    Elements,
    /// From registers: A is the fp32 fragment of the matmul that produced it, rounded to the
    /// operand type (a [register pipe](super::plan::RegisterPipe); no shared memory).
    Fragment,
    /// B of a [`MatmulInstr::WgmmaM64K16`]: the tensor cores read the tile through a
    /// shared-memory matrix descriptor (128-byte swizzle, N-major), no load instruction.
    WgmmaDescriptor,
}

impl fmt::Display for OperandLoad {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OperandLoad::Ldmatrix => "ldmatrix",
            OperandLoad::LdmatrixTrans => "ldmatrix.trans",
            OperandLoad::Pairs => "pair loads",
            OperandLoad::Elements => "element loads",
            OperandLoad::Fragment => "the producer's registers",
            OperandLoad::WgmmaDescriptor => "a wgmma shared-memory descriptor",
        })
    }
}

/// How the runtime's `mma.sync` loops (`mucc::tb::Mma`) go through a matmul's k-steps and its
/// N: the emitter prints these as `Mma`'s template arguments, which the runtime checks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MatmulWalks {
    /// A's `ldmatrix` lane addresses are computed once and advanced by a fixed step per whole
    /// k-step (instead of computed per k-step).
    pub a: bool,
    /// The same for B; B's n-tiles then load in pairs (one `ldmatrix.x4` per two).
    pub b: bool,
    /// n-tiles per slice of a product computed slice by slice ([`super::plan::MatmulLowering`]),
    /// which bounds its accumulators at 8 n-tiles (32 registers).
    pub slice_n_tiles: usize,
}

/// The most n-tiles a slice of a slice-by-slice product holds (32 fp32 accumulators a thread).
pub const SLICE_MAX_N_TILES: usize = 8;

/// [`MatmulWalks`] of a tensor-core matmul of N columns on `warps` with operands loaded as
/// `loads` from tiles `a` and `b`: an operand loaded by `ldmatrix` walks its k-steps when 16
/// times its K stride is a multiple of its swizzle's period (an XOR swizzle reads only offset
/// bits below the period, so such a step stays an addition; padded rows and plain strides have
/// no period); a slice holds the warp's n-tiles, at most [`SLICE_MAX_N_TILES`].
pub fn matmul_walks(
    n: usize,
    warps: (usize, usize),
    loads: (OperandLoad, OperandLoad),
    a: Option<&TileGeometry>,
    b: Option<&TileGeometry>,
) -> MatmulWalks {
    let period = |g: &TileGeometry| match g.swizzle {
        Swizzle::Xor { b, m, s } => 1usize << (b + m + s),
        Swizzle::None | Swizzle::Shift { .. } => 1,
    };
    let walks = |load: OperandLoad, g: Option<&TileGeometry>, k_dim_from_end: usize| {
        let ldmatrix = matches!(load, OperandLoad::Ldmatrix | OperandLoad::LdmatrixTrans);
        g.is_some_and(|g| {
            let r = g.strides.0.len();
            ldmatrix
                && g.columns.is_none()
                && r >= k_dim_from_end
                && (16 * g.strides.0[r - k_dim_from_end]).is_multiple_of(period(g))
        })
    };
    let per_warp = n.div_ceil(8).div_ceil(warps.1.max(1));
    MatmulWalks {
        // A is [M, K]: K is the last dim; B is [K, N]: K the one before.
        a: walks(loads.0, a, 1),
        b: walks(loads.1, b, 2),
        slice_n_tiles: per_warp.clamp(1, SLICE_MAX_N_TILES),
    }
}

/// How the operands of an `m×k · k×n` tensor-core matmul load, from the geometry of their
/// tiles: `ldmatrix` needs 16-bit elements, whole 16-byte chunks (a swizzle that moves
/// 8-element chunks or more) along the contiguous dim, that dim's extent a multiple of 8 and
/// the other dim's stride a multiple of 8 (K contiguous first, then `.trans`); otherwise
/// 32-bit loads of K-consecutive pairs where K is contiguous and even, the other stride even
/// and the swizzle keeps 2-element chunks whole (a 16-bit type); element loads last.
pub fn operand_loads(
    (m, k, n): (usize, usize, usize),
    a: &TileGeometry,
    b: &TileGeometry,
    target: &Target,
) -> (OperandLoad, OperandLoad) {
    let kept = |g: &TileGeometry| match g.swizzle {
        Swizzle::Xor { m, .. } => m as usize,
        _ => 62,
    };
    let two_dims = |g: &TileGeometry| {
        let r = g.strides.0.len();
        (g.strides.0[r - 2], g.strides.0[r - 1])
    };
    let pick = |g: &TileGeometry,
                (outer, outer_stride): (usize, usize),
                (inner, inner_stride): (usize, usize),
                k_inner: bool| {
        let chunks = target.has_ldmatrix && g.dtype.bytes() == 2 && kept(g) >= 3;
        // The operand's K dim is `inner` for A and `outer` for B.
        let (kd, ks, od, os) = if k_inner {
            (inner, inner_stride, outer, outer_stride)
        } else {
            (outer, outer_stride, inner, inner_stride)
        };
        if chunks && ks == 1 && kd.is_multiple_of(8) && (od == 1 || os.is_multiple_of(8)) {
            OperandLoad::Ldmatrix
        } else if chunks && os == 1 && od.is_multiple_of(8) && (kd == 1 || ks.is_multiple_of(8)) {
            OperandLoad::LdmatrixTrans
        } else if g.dtype.bytes() == 2
            && kept(g) >= 1
            && ks == 1
            && kd.is_multiple_of(2)
            && (od == 1 || os.is_multiple_of(2))
        {
            OperandLoad::Pairs
        } else {
            OperandLoad::Elements
        }
    };
    let (a_sm, a_sk) = two_dims(a);
    let (b_sk, b_sn) = two_dims(b);
    (
        pick(a, (m, a_sm), (k, a_sk), true),
        pick(b, (k, b_sk), (n, b_sn), false),
    )
}

/// How the rows of a row reduction are spread over the block's threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowSplit {
    /// Independent rows.
    pub rows: usize,
    /// Elements reduced per row.
    pub len: usize,
    /// Threads cooperating on one row (see [`threads_per_row`]).
    pub threads_per_row: usize,
}

impl RowSplit {
    /// `rows` rows of `len` elements over `threads` threads.
    pub fn new(rows: usize, len: usize, threads: usize) -> RowSplit {
        RowSplit {
            rows,
            len,
            threads_per_row: threads_per_row(rows, len, threads),
        }
    }
}

/// The plan of an operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpPlan {
    /// A threadblock input.
    Input {
        /// The copy.
        copy: Copy,
        /// Who copies.
        engine: CopyEngine,
        /// Pipeline stages (1 = not pipelined; more only with [`CopyEngine::CpAsync`] or
        /// [`CopyEngine::Tma`]).
        stages: usize,
    },
    /// A threadblock output.
    Output {
        /// The copy; `None` when the chain's leader stores directly from registers.
        copy: Option<Copy>,
    },
    /// A for-loop accumulator.
    Accum {
        /// Storage.
        storage: AccumStorage,
        /// Reduction timing.
        reduce: AccumReduce,
        /// For an accumulator that sums the rows of an element-wise chain's values itself:
        /// how those rows are spread over the threads.
        rows: Option<RowSplit>,
        /// For mean and RMS: the number of values summed (the input's last dim × the loop's
        /// iterations), which the sum is divided by after the loop.
        divisor: Option<usize>,
    },
    /// A matmul.
    Matmul {
        /// Warps along M and N (their product is at most the block's warps).
        warps: (usize, usize),
        /// The instruction.
        instr: MatmulInstr,
        /// How A and B reach registers (tensor cores only; set once the tiles are planned).
        loads: (OperandLoad, OperandLoad),
        /// MMA calls per warp per execution.
        mma_per_warp: usize,
        /// Load instructions per warp per execution for A and for B, as the operand loads
        /// issue them (see [`operand_load_count`]).
        load_instrs: (usize, usize),
        /// How the `mma.sync` loops walk the operands' addresses and slice N (set once the
        /// loads and tiles are final, [`matmul_walks`]).
        walks: MatmulWalks,
    },
    /// A reduction over rows (tb reductions and rms_norm); rms_norm then scales its row in a
    /// second pass.
    RowReduce(RowSplit),
    /// A running max over the loop (`reduction_max`): a thread per output element keeps the
    /// maximum so far and the change of this iteration.
    RunningMax,
    /// Anything else.
    Plain,
}

/// The planner's row split rule, which the layout solver's walk model shares.
pub use crate::layout::threads_per_row;

/// The type a tile is stored in: accumulator results of a loop of two or more iterations, and
/// results of reducing accumulators (row sums, even of one iteration), are kept in the compute
/// type (fp32, or fp64 for fp64 and integer graphs) — a 16-bit row sum of a few thousand terms
/// overflows or loses its low digits; everything else — single-iteration element-wise
/// accumulators included, which sum nothing — in the graph's type.
pub fn tile_dtype(tb: &TbGraph, t: Handle<STensor>) -> DType {
    stored_dtype(tb, t, tb.producer(t))
}

/// [`tile_dtype`] of every tile (by index), in one pass over the graph.
pub fn tile_dtypes(tb: &TbGraph) -> Vec<DType> {
    let producers = tb.producers();
    tb.tensors
        .iter()
        .map(|(t, _)| stored_dtype(tb, t, producers[t.index()]))
        .collect()
}

/// The type tile `t`, defined by `producer`, is stored in (see [`tile_dtype`]).
fn stored_dtype(tb: &TbGraph, t: Handle<STensor>, producer: Option<Handle<TbOp>>) -> DType {
    let dtype = tb.tensors[t].dtype;
    let accum = producer.and_then(|p| match tb.ops[p].kind {
        TbOpKind::Accum(k) => Some(k),
        _ => None,
    });
    let wide = accum.is_some_and(|k| tb.forloop_range > 1 || k.reduces_last_dim());
    match dtype {
        _ if !wide => dtype,
        DType::F16 | DType::BF16 | DType::F32 => DType::F32,
        _ => DType::F64,
    }
}

/// Whether tile `t` is stored wider than its graph type (see [`tile_dtype`]).
pub fn tile_is_wide(tb: &TbGraph, t: Handle<STensor>) -> bool {
    tile_dtype(tb, t) != tb.tensors[t].dtype
}

/// A G↔S copy plan for a tile of `tile` (innermost `tile_inner`) inside a DTensor of `d`
/// (innermost `d_inner`, strides `d_strides`), with the offsets the grid and the loop add.
#[allow(clippy::too_many_arguments)]
pub fn copy_plan(
    d: &Shape,
    d_strides: &Strides,
    d_inner: usize,
    tile: &Shape,
    tile_inner: usize,
    map: DimMap,
    grid: [usize; 3],
    forloop_dim: Option<usize>,
    elem: usize,
    target: &Target,
) -> Copy {
    // The widest chunk every row start and row end allows: 16 bytes (cp.async.cg, vector
    // loads), else 8 or 4 (rows of 172 bf16 elements, say), as long as a chunk holds two
    // elements or more.
    let mut reason = ChunkOff::WideElements;
    for bytes in [target.max_copy_bytes, 8, 4] {
        if bytes > target.max_copy_bytes || bytes / elem <= 1 {
            continue;
        }
        match chunk_fits(
            d,
            d_strides,
            d_inner,
            tile,
            tile_inner,
            map,
            grid,
            forloop_dim,
            bytes / elem,
            bytes,
        ) {
            Ok(()) => {
                return Copy::Chunked {
                    dim: tile_inner,
                    chunk_elems: bytes / elem,
                    bytes,
                    tile_bytes: bytes,
                };
            }
            Err(why) => reason = why,
        }
    }
    Copy::Elementwise { reason }
}

/// Whether chunks of `chunk` elements (`bytes` bytes) serve the copy of [`copy_plan`]: `Err`
/// says why not.
#[allow(clippy::too_many_arguments)]
pub(super) fn chunk_fits(
    d: &Shape,
    d_strides: &Strides,
    d_inner: usize,
    tile: &Shape,
    tile_inner: usize,
    map: DimMap,
    grid: [usize; 3],
    forloop_dim: Option<usize>,
    chunk: usize,
    bytes: usize,
) -> Result<(), ChunkOff> {
    if d_inner != tile_inner || d_strides.0[d_inner] != 1 {
        return Err(ChunkOff::NotContiguous { dim: tile_inner });
    }
    if !tile.dim(tile_inner).is_multiple_of(chunk) {
        return Err(ChunkOff::PartialChunks {
            row: tile.dim(tile_inner),
            bytes,
        });
    }
    for dim in 0..d.rank() {
        if dim != d_inner && tile.dim(dim) > 1 && !d_strides.0[dim].is_multiple_of(chunk) {
            return Err(ChunkOff::Stride {
                dim,
                stride: d_strides.0[dim],
                chunk,
            });
        }
    }
    for a in 0..3 {
        if let (true, Some(dim)) = (grid[a] > 1, map.axis(a)) {
            let off = d.dim(dim) / grid[a] * d_strides.0[dim];
            if !off.is_multiple_of(chunk) {
                return Err(ChunkOff::BlockOffsets {
                    dim,
                    offset: off,
                    bytes,
                });
            }
        }
    }
    if let Some(f) = forloop_dim {
        let off = tile.dim(f) * d_strides.0[f];
        if !off.is_multiple_of(chunk) {
            return Err(ChunkOff::IterationOffsets {
                dim: f,
                offset: off,
                bytes,
            });
        }
    }
    Ok(())
}

/// Chooses the warp grid of a matmul C[m, n] = A[m, k]·B[k, n].
pub fn warp_grid(m: usize, n: usize, k: usize, warps: usize) -> ((usize, usize), usize, usize) {
    let (mt, nt, kt) = (m.div_ceil(16), n.div_ceil(8), k.div_ceil(16));
    let mut best: Option<((usize, usize), usize, usize, usize)> = None;
    for wm in 1..=warps {
        for wn in 1..=warps / wm {
            let (pm, pn) = (mt.div_ceil(wm), nt.div_ceil(wn));
            // Useless warps (no tile to work on) are not counted as parallelism.
            if (wm > 1 && pm * (wm - 1) >= mt) || (wn > 1 && pn * (wn - 1) >= nt) {
                continue;
            }
            let mma = pm * pn * kt;
            // ldmatrix.x4 loads a 16×16 A fragment or two 16×8 B fragments.
            let loads = pm * kt + pn.div_ceil(2) * kt;
            let cost = mma + loads;
            let better = match best {
                None => true,
                Some((_, c, _, _)) => {
                    cost < c || (cost == c && wm * wn > best.map_or(0, |b| b.0.0 * b.0.1))
                }
            };
            if better {
                best = Some(((wm, wn), cost, mma, loads));
            }
        }
    }
    let (w, _, mma, loads) =
        best.unwrap_or(((1, 1), 0, mt * nt * kt, mt * kt + nt.div_ceil(2) * kt));
    (w, mma, loads)
}

/// Load instructions per warp per execution of an `m16n8k16` matmul of M×K by K×N on a
/// `warps` grid, for A and for B, with the runtime's operand loads (`mucc::tb::Mma`): per
/// k-step and warp tile, A takes one `ldmatrix.x4`, four 32-bit pair loads (two when M ≤ 8:
/// rows 8–15 are zero) or eight element loads (four); B one n-tile of `ldmatrix` (the walking
/// path pairs two into an `.x4`), two pair loads or
/// four element loads.
pub fn operand_load_count(
    (m, n, k): (usize, usize, usize),
    warps: (usize, usize),
    loads: (OperandLoad, OperandLoad),
) -> (usize, usize) {
    let kt = k.div_ceil(16);
    let pm = m.div_ceil(16).div_ceil(warps.0.max(1));
    let pn = n.div_ceil(8).div_ceil(warps.1.max(1));
    let short = m <= 8;
    let a = match loads.0 {
        OperandLoad::Ldmatrix | OperandLoad::LdmatrixTrans => 1,
        OperandLoad::Pairs if short => 2,
        OperandLoad::Pairs => 4,
        OperandLoad::Elements if short => 4,
        OperandLoad::Elements => 8,
        OperandLoad::Fragment | OperandLoad::WgmmaDescriptor => 0,
    };
    let b = match loads.1 {
        OperandLoad::Ldmatrix | OperandLoad::LdmatrixTrans => 1,
        OperandLoad::Pairs => 2,
        OperandLoad::Elements => 4,
        OperandLoad::Fragment | OperandLoad::WgmmaDescriptor => 0,
    };
    (pm * kt * a, pn * kt * b)
}

impl OperandLoad {
    /// What one load of this kind is called in `explain`, for operand A (`true`) or B.
    pub fn instr_name(self, a: bool) -> &'static str {
        match (self, a) {
            (OperandLoad::Ldmatrix, true) => "ldmatrix.x4",
            (OperandLoad::LdmatrixTrans, true) => "ldmatrix.x4.trans",
            (OperandLoad::Ldmatrix, false) => "n-tiles by ldmatrix",
            (OperandLoad::LdmatrixTrans, false) => "n-tiles by ldmatrix.trans",
            (OperandLoad::Pairs, _) => "32-bit loads",
            (OperandLoad::Elements, _) => "element loads",
            (OperandLoad::Fragment, _) => "register moves",
            (OperandLoad::WgmmaDescriptor, _) => "loads (the tensor cores read the tile)",
        }
    }
}

/// Why a tensor-core matmul keeps `mma.sync` on the Hopper path, or `None` when it takes
/// `wgmma` ([`MatmulInstr::WgmmaM64K16`]): the tensor cores read B through descriptors of the
/// canonical N-major layout with the 128-byte swizzle, so B must be a TMA-loaded tile
/// (1024-byte aligned slots) of 64-element columns of 16-bit elements, each column 128-byte
/// rows with their chunks permuted by `Swizzle<3,3,3>`: one such atom across (N = 64, rows of
/// 64 elements), or N a multiple of 64 stored in columns ([`AtomColumns`] of width 64, 1024-byte
/// multiples apart; one m64n64k16 per column and k-step); K a multiple of 16. A sits in the
/// warps' registers in the m64 fragment layout when the warps along M form whole warpgroups
/// and none is along N: the packed product of a register pipe (`a` is
/// [`OperandLoad::Fragment`]), or fragments loaded by `ldmatrix` (`a` is
/// [`OperandLoad::Ldmatrix`]), all k-steps' before the first wgmma, so at most 8 per warp
/// (m-tiles × k-steps; 32 registers).
pub fn wgmma_b(
    (m, n, k): (usize, usize, usize),
    warps: (usize, usize),
    b: &TileGeometry,
    b_by_tma: bool,
    a: OperandLoad,
) -> Option<WgmmaOff> {
    let r = b.strides.0.len();
    let (sk, sn) = (b.strides.0[r - 2], b.strides.0[r - 1]);
    let columns_ok = match b.columns {
        None => n == 64,
        Some(c) => {
            c.dim == r - 1
                && c.width == 64
                && n.is_multiple_of(64)
                && (c.stride * b.dtype.bytes()).is_multiple_of(1024)
        }
    };
    if warps.1 != 1 || !warps.0.is_multiple_of(4) {
        Some(WgmmaOff::NotWarpgroups)
    } else if !m.is_multiple_of(16) || !k.is_multiple_of(16) {
        Some(WgmmaOff::NotMultipleOf16)
    } else if a == OperandLoad::Ldmatrix && m.div_ceil(16 * warps.0) * (k / 16) > 8 {
        Some(WgmmaOff::AFragmentRegisters)
    } else if b.dtype.bytes() != 2 || !columns_ok || sn != 1 || sk != 64 {
        Some(WgmmaOff::BLayout)
    } else if b.swizzle != (Swizzle::Xor { b: 3, m: 3, s: 3 }) {
        Some(WgmmaOff::BSwizzle)
    } else if !b_by_tma {
        Some(WgmmaOff::BNotTma)
    } else {
        None
    }
}

/// `B` of a matmul stored in 64-element columns of 128-byte swizzle atoms ([`AtomColumns`]),
/// the form [`wgmma_b`] reads when N is a multiple of 64 above 64: `geo` (the tile of shape
/// `shape`, N contiguous in rows of exactly N elements, every dim before K and N of extent 1)
/// re-planned, or `None` when it is not of that kind.
pub fn in_atom_columns(shape: &Shape, geo: &TileGeometry) -> Option<TileGeometry> {
    let r = shape.rank();
    if r < 2 || geo.dtype.bytes() != 2 || geo.columns.is_some() {
        return None;
    }
    let (k, n) = (shape.dim(r - 2), shape.dim(r - 1));
    let lead_ones = (0..r - 2).all(|d| shape.dim(d) == 1);
    if !lead_ones
        || n <= 64
        || !n.is_multiple_of(64)
        || geo.strides.0[r - 1] != 1
        || geo.strides.0[r - 2] != n
    {
        return None;
    }
    let mut strides = geo.strides.clone();
    strides.0[r - 2] = 64;
    for d in 0..r - 2 {
        strides.0[d] = k * n;
    }
    Some(TileGeometry {
        layout: crate::layout::solve::TileLayout {
            innermost: r - 1,
            swizzled: Some(r - 2),
        },
        strides,
        phys_elems: k * n,
        bytes: k * n * geo.dtype.bytes(),
        swizzle: Swizzle::Xor { b: 3, m: 3, s: 3 },
        chunk_bytes: 16,
        dtype: geo.dtype,
        columns: Some(AtomColumns {
            dim: r - 1,
            width: 64,
            stride: k * 64,
        }),
    })
}

/// `m16n8k16` MMAs per warp of an M×K by K×N matmul on a `warps` grid (as [`warp_grid`] counts).
pub fn mma_per_warp(m: usize, n: usize, k: usize, warps: (usize, usize)) -> usize {
    m.div_ceil(16).div_ceil(warps.0.max(1))
        * n.div_ceil(8).div_ceil(warps.1.max(1))
        * k.div_ceil(16)
}

/// Per-thread registers of a matmul's fp32 accumulator fragment.
pub fn fragment_registers(m: usize, n: usize, warps: (usize, usize)) -> usize {
    m.div_ceil(16 * warps.0) * n.div_ceil(8 * warps.1) * 4
}

/// Plans every operator of a threadblock graph for a CTA of `threads` threads, except the
/// pipeline stage counts (1 here).
pub fn plan_ops(
    tb: &TbGraph,
    threads: usize,
    fusion: &FusionPlan,
    layout: &KernelLayout,
    kn_ins: &[(Shape, Strides, usize)],
    kn_outs: &[(Shape, Strides, usize)],
    target: &Target,
) -> Vec<OpPlan> {
    let threads = threads.max(1);
    let warps = (threads / 32).max(1);
    let mut regs_left = target.accum_register_budget;
    let stored = tile_dtypes(tb);
    let mut plans = Vec::with_capacity(tb.ops.len());
    for (h, op) in tb.ops.iter() {
        let chain = fusion.chain(h);
        let plan = match &op.kind {
            TbOpKind::Input {
                input,
                imap,
                forloop_dim,
            } => {
                let (ds, dst, dinner) = &kn_ins[*input];
                let s = &tb.tensors[op.outputs[0]];
                let tl =
                    layout.tiles[op.outputs[0].index()].map_or(s.shape.rank() - 1, |l| l.innermost);
                let copy = copy_plan(
                    ds,
                    dst,
                    *dinner,
                    &s.shape,
                    tl,
                    *imap,
                    tb.grid,
                    *forloop_dim,
                    s.dtype.bytes(),
                    target,
                );
                OpPlan::Input {
                    copy,
                    engine: CopyEngine::Threads,
                    stages: 1,
                }
            }
            TbOpKind::Output { output, omap } => {
                if chain.ops.len() > 1 {
                    OpPlan::Output { copy: None }
                } else {
                    let (ds, dst, dinner) = &kn_outs[*output];
                    let s = &tb.tensors[op.inputs[0]];
                    let tl = layout.tiles[op.inputs[0].index()]
                        .map_or(s.shape.rank() - 1, |l| l.innermost);
                    let copy = copy_plan(
                        ds,
                        dst,
                        *dinner,
                        &s.shape,
                        tl,
                        *omap,
                        tb.grid,
                        None,
                        s.dtype.bytes(),
                        target,
                    );
                    OpPlan::Output { copy: Some(copy) }
                }
            }
            TbOpKind::Matmul => {
                let (a, b) = (
                    &tb.tensors[op.inputs[0]].shape,
                    &tb.tensors[op.inputs[1]].shape,
                );
                let r = a.rank();
                let (m, k, n) = (a.dim(r - 2), a.dim(r - 1), b.dim(r - 1));
                let (w, mma, _) = warp_grid(m, n, k, warps);
                // An operand kept wide (an accumulator's fp32 result) goes through FMAs.
                let wide = op
                    .inputs
                    .iter()
                    .any(|&t| stored[t.index()] != tb.tensors[t].dtype);
                let instr = match tb.tensors[op.inputs[0]].dtype {
                    _ if wide || !threads.is_multiple_of(32) => MatmulInstr::Fma,
                    dtype @ (DType::F16 | DType::BF16) => MatmulInstr::MmaSyncM16N8K16 { dtype },
                    _ => MatmulInstr::Fma,
                };
                OpPlan::Matmul {
                    warps: w,
                    instr,
                    loads: (OperandLoad::Elements, OperandLoad::Elements),
                    mma_per_warp: mma,
                    load_instrs: operand_load_count(
                        (m, n, k),
                        w,
                        (OperandLoad::Elements, OperandLoad::Elements),
                    ),
                    walks: MatmulWalks::default(),
                }
            }
            TbOpKind::Accum(kind) => {
                let leader = &tb.ops[chain.leader()];
                let after_matmul = matches!(leader.kind, TbOpKind::Matmul);
                let reduce = if kind.reduces_last_dim() {
                    AccumReduce::EachIteration
                } else {
                    AccumReduce::None
                };
                // Element-wise kinds may live in registers: each thread owns fixed elements (a
                // matmul's fragment, or a thread-strided share of the tile). Reducing and
                // rescaling kinds keep their (small) state in shared memory.
                // Row-based leaders (rms_norm, reductions) map elements to threads by rows.
                let row_leader =
                    matches!(leader.kind, TbOpKind::RmsNorm | TbOpKind::Reduction { .. });
                // With a single iteration an element-wise accumulator is a plain store: registers
                // would only add a write-back.
                let single_pass = tb.forloop_range <= 1 && !after_matmul;
                let regs = if reduce != AccumReduce::None
                    || matches!(kind, AccumKind::NoredRescale)
                    || row_leader
                    || single_pass
                {
                    None
                } else if let Some(OpPlan::Matmul { warps, instr, .. }) =
                    plans.get(chain.leader().index()).filter(|_| after_matmul)
                    && instr.is_mma()
                {
                    let c = &tb.tensors[leader.outputs[0]].shape;
                    let r = c.rank();
                    Some((
                        fragment_registers(c.dim(r - 2), c.dim(r - 1), *warps),
                        Some(chain.leader()),
                    ))
                } else {
                    Some((
                        tb.tensors[op.outputs[0]].shape.numel().div_ceil(threads),
                        None,
                    ))
                };
                let storage = match regs {
                    Some((n, fragment_of)) if n <= regs_left => {
                        regs_left -= n;
                        AccumStorage::Registers {
                            per_thread: n,
                            fragment_of,
                        }
                    }
                    _ if single_pass && *kind == AccumKind::Nored => AccumStorage::WrittenOnce,
                    _ => AccumStorage::Shared,
                };
                // A row-summing accumulator after an element-wise leader sums the rows of the
                // leader's values (an accumulator leading its own chain: of its input).
                let elementwise_leader = matches!(
                    leader.kind,
                    TbOpKind::Unary(_)
                        | TbOpKind::Binary(_)
                        | TbOpKind::Concat { .. }
                        | TbOpKind::Accum(_)
                );
                let rows = (reduce == AccumReduce::EachIteration
                    && *kind != AccumKind::RedtoxLdSum
                    && elementwise_leader)
                    .then(|| {
                        let space = match leader.kind {
                            TbOpKind::Accum(_) => &tb.tensors[leader.inputs[0]].shape,
                            _ => &tb.tensors[leader.outputs[0]].shape,
                        };
                        let len = space.dim(space.rank() - 1);
                        RowSplit::new(space.numel() / len.max(1), len, threads)
                    });
                let divisor =
                    matches!(kind, AccumKind::RedLdMean | AccumKind::RedLdRms).then(|| {
                        tb.tensors[op.inputs[0]]
                            .shape
                            .dims()
                            .last()
                            .copied()
                            .unwrap_or(1)
                            * tb.forloop_range
                    });
                OpPlan::Accum {
                    storage,
                    reduce,
                    rows,
                    divisor,
                }
            }
            TbOpKind::Reduction {
                kind: TbReduction::Max,
                ..
            } => OpPlan::RunningMax,
            TbOpKind::Reduction { .. } => {
                // Each output element sums `len` inputs (a dim, or a dim / dimx for to-dimx).
                let rows = tb.tensors[op.outputs[0]].shape.numel().max(1);
                let len = tb.tensors[op.inputs[0]].shape.numel() / rows;
                OpPlan::RowReduce(RowSplit::new(rows, len, threads))
            }
            TbOpKind::RmsNorm => {
                let x = &tb.tensors[op.inputs[0]].shape;
                let len = x.dim(x.rank() - 1);
                let rows = x.numel() / len.max(1);
                OpPlan::RowReduce(RowSplit::new(rows, len, threads))
            }
            _ => OpPlan::Plain,
        };
        plans.push(plan);
    }
    plans
}

/// Strides and physical size of an intermediate DTensor with this innermost dim.
pub fn dtensor_strides(shape: &Shape, innermost: usize, dtype: DType) -> (Strides, usize) {
    padded_strides(shape, innermost, None, dtype.bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::Arch;

    #[test]
    fn chunked_copies_need_aligned_rows() {
        let t = Target::new(Arch::Sm80);
        let d = Shape::new(&[4096, 4096]).unwrap();
        let st = d.row_major_strides();
        let tile = Shape::new(&[64, 32]).unwrap();
        let c = copy_plan(
            &d,
            &st,
            1,
            &tile,
            1,
            DimMap::from([1, -1, -1]),
            [128, 1, 1],
            Some(0),
            2,
            &t,
        );
        assert_eq!(
            c,
            Copy::Chunked {
                dim: 1,
                chunk_elems: 8,
                bytes: 16,
                tile_bytes: 16
            }
        );
        // A column-major tile of a row-major tensor cannot use 16-byte chunks.
        let c = copy_plan(
            &d,
            &st,
            1,
            &tile,
            0,
            DimMap::from([1, -1, -1]),
            [128, 1, 1],
            Some(0),
            2,
            &t,
        );
        assert!(!c.is_chunked());
        // Rows of 20 fp16 elements are not whole 16-byte chunks: 8-byte ones; rows of 21 fit none.
        let d2 = Shape::new(&[8, 4800]).unwrap();
        let rows = |n: usize, grid: usize| {
            copy_plan(
                &d2,
                &d2.row_major_strides(),
                1,
                &Shape::new(&[8, n]).unwrap(),
                1,
                DimMap::from([1, -1, -1]),
                [grid, 1, 1],
                None,
                2,
                &t,
            )
        };
        assert_eq!(
            rows(20, 240),
            Copy::Chunked {
                dim: 1,
                chunk_elems: 4,
                bytes: 8,
                tile_bytes: 8
            }
        );
        // 4800 / 160 = 30 elements per block: rows and offsets of 4-byte chunks.
        assert_eq!(rows(30, 160).chunk_bytes(), 4);
        assert!(matches!(
            rows(25, 192),
            Copy::Elementwise {
                reason: ChunkOff::PartialChunks { row: 25, bytes: 4 }
            }
        ));
        // An odd row stride of the source (50 elements: 4-byte chunks at most); 49: none.
        for (cols, want) in [(50, 4), (49, 0)] {
            let d3 = Shape::new(&[8, cols]).unwrap();
            let c = copy_plan(
                &d3,
                &d3.row_major_strides(),
                1,
                &Shape::new(&[8, 16]).unwrap(),
                1,
                DimMap::NONE,
                [1, 1, 1],
                Some(1),
                2,
                &t,
            );
            assert_eq!(c.chunk_bytes(), want, "{cols}: {c:?}");
        }
    }

    #[test]
    fn operands_walk_when_a_k_step_is_a_whole_swizzle_period() {
        use crate::layout::solve::TileLayout;
        let geo = |strides: [usize; 2], swizzle: Swizzle| TileGeometry {
            layout: TileLayout {
                innermost: 1,
                swizzled: None,
            },
            strides: Strides(strides.to_vec()),
            phys_elems: 64 * 64,
            bytes: 64 * 64 * 2,
            swizzle,
            chunk_bytes: 16,
            dtype: DType::F16,
            columns: None,
        };
        let xor = Swizzle::Xor { b: 3, m: 3, s: 3 };
        let (ld, tr) = (OperandLoad::Ldmatrix, OperandLoad::LdmatrixTrans);
        // A [64, 64] K-contiguous under a 512-element period: a k-step moves 16 elements, not
        // a whole period; B [64, 64] N-contiguous: a k-step moves 16 rows of 64 = 2 periods.
        let (a, b) = (geo([64, 1], xor), geo([64, 1], xor));
        let w = matmul_walks(64, (4, 1), (ld, tr), Some(&a), Some(&b));
        assert_eq!((w.a, w.b), (false, true));
        // Plain strides and padded rows have no period: both walk.
        let (a, b) = (
            geo([72, 1], Swizzle::None),
            geo([72, 1], Swizzle::Shift { row_chunks: 9 }),
        );
        let w = matmul_walks(64, (4, 1), (ld, tr), Some(&a), Some(&b));
        assert_eq!((w.a, w.b), (true, true));
        // Loads other than ldmatrix, and an A from registers (no tile), never walk.
        let w = matmul_walks(
            64,
            (1, 4),
            (OperandLoad::Pairs, OperandLoad::WgmmaDescriptor),
            Some(&a),
            Some(&b),
        );
        assert_eq!((w.a, w.b), (false, false));
        let w = matmul_walks(64, (4, 1), (OperandLoad::Fragment, tr), None, Some(&b));
        assert!(!w.a && w.b);
        // A slice holds a warp's n-tiles, at most 8.
        let slice = |n, wn| matmul_walks(n, (1, wn), (ld, tr), None, None).slice_n_tiles;
        assert_eq!(
            (slice(64, 4), slice(256, 4), slice(1024, 1), slice(4, 1)),
            (2, 8, 8, 1)
        );
    }

    #[test]
    fn operand_load_counts_follow_the_runtime() {
        let (ld, tr) = (OperandLoad::Ldmatrix, OperandLoad::LdmatrixTrans);
        // The decode tile: 8×64 by a 296-deep product on 1×4 warps: 19 k-steps, 1 m-tile and
        // 2 n-tiles per warp.
        assert_eq!(operand_load_count((8, 64, 296), (1, 4), (ld, tr)), (19, 38));
        // Pairs and elements: M ≤ 8 halves A's loads (rows 8–15 are zero).
        let (p, e) = (OperandLoad::Pairs, OperandLoad::Elements);
        assert_eq!(
            operand_load_count((3, 13, 50), (1, 2), (p, e)),
            (4 * 2, 4 * 4)
        );
        assert_eq!(
            operand_load_count((32, 16, 32), (2, 2), (e, p)),
            (2 * 8, 2 * 2)
        );
        assert_eq!(OperandLoad::Pairs.instr_name(true), "32-bit loads");
        assert_eq!(tr.instr_name(false), "n-tiles by ldmatrix.trans");
    }

    #[test]
    fn warp_grids() {
        // 8×32 (gated MLP tile, 4 warps): 1 M tile, 4 N tiles → warps split N.
        assert_eq!(warp_grid(8, 32, 64, 4).0, (1, 4));
        // 64×64: 4×8 tiles.
        let (w, mma, _) = warp_grid(64, 64, 64, 4);
        assert_eq!(w.0 * w.1, 4);
        assert_eq!(mma, 4 * 8 * 4 / 4);
        // A 1×24 result of a 296-deep product on 4 warps.
        let (w, _, _) = warp_grid(1, 24, 296, 4);
        assert_eq!(w, (1, 3));
        assert_eq!(fragment_registers(8, 32, (1, 4)), 4);
        // rms_norm of one 4096-long row on 128 threads: a warp per row; 16 rows: 8 threads each.
        assert_eq!(threads_per_row(1, 64, 128), 32);
        assert_eq!(threads_per_row(1, 4096, 128), 128);
        assert_eq!(threads_per_row(2, 4096, 128), 64);
        assert_eq!(threads_per_row(1, 4096, 96), 64);
        assert_eq!(threads_per_row(1, 800, 128), 64);
        assert_eq!(threads_per_row(16, 4096, 128), 8);
        assert_eq!(threads_per_row(64, 64, 128), 2);
        assert_eq!(threads_per_row(256, 64, 128), 1);
        assert_eq!(fragment_registers(64, 64, (2, 2)), 2 * 4 * 4);
    }
}
