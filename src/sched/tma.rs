//! Bulk tensor copies (TMA) of pipelined input tiles on the Hopper path.
//!
//! A pipelined input (an in-loop tile with 16-byte chunked rows, see [`super::ops`]) is loaded
//! by the copy engine instead of `cp.async` when its shared-memory tile is exactly the dense box
//! the engine writes: the tile's dims in the device tensor's stride order (innermost first),
//! packed without padding, unswizzled or swizzled with one of the engine's three patterns
//! (32, 64 or 128 bytes, the XOR of the 16-byte chunk index with the 128-byte line index,
//! which the tile planner's XOR swizzle produces for rows of that many bytes). The device
//! tensor must have 16-byte multiple strides, no broadcast dims, at most five dims of extent
//! above one and extents below 2³²; every box dim is at most 256 elements. A box whose outermost
//! dim of extent above one is longer is copied in slabs along that dim ([`TmaLoad::copies`]):
//! each slab is a contiguous part of the dense tile, every slab but the last of the most rows
//! up to 256 that keep the next slab's start on the engine's alignment (1024 bytes under a
//! swizzle, 128 without), the last the remainder, each extent through its own tensor map. What
//! fails keeps the `cp.async` ring, with the reason shown by `explain`.
//!
//! One thread issues every load of an iteration and announces the bytes on the stage's
//! mbarrier (`full`); every thread waits on it before the iteration reads the stage. The
//! mbarriers live at [`TmaPlan::barriers`] in the zero-page region of shared memory, and each
//! TMA stage slot starts on a 1024-byte boundary (the swizzle patterns repeat every 1024 bytes
//! and follow the address), so its tile's bytes are padded to a multiple of 1024.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::ops::{Copy, OpPlan};
use crate::graph::dtype::DType;
use crate::graph::shape::{Shape, Strides};
use crate::graph::threadblock::{TbGraph, TbOpKind};
use crate::layout::swizzle::{AtomColumns, Swizzle, TileGeometry};

/// Alignment (bytes) of a TMA stage slot and of the dynamic shared memory of a kernel with one.
pub const TMA_SLOT_ALIGN: usize = 1024;
/// The largest extent of a box dim.
pub const TMA_MAX_BOX: usize = 256;
/// Alignment (bytes) of an unswizzled box's shared-memory destination.
pub const TMA_SLAB_ALIGN: usize = 128;
/// The most dims a tensor map has.
pub const TMA_MAX_RANK: usize = 5;

/// The shared-memory swizzle the copy engine applies (`CUtensorMapSwizzle`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TmaSwizzle {
    /// Dense rows as they are.
    None,
    /// 16-byte chunks permuted within 32-byte rows.
    B32,
    /// Within 64-byte rows.
    B64,
    /// Within 128-byte rows.
    B128,
}

impl TmaSwizzle {
    /// Bytes of a swizzled row (the box's innermost dim must be exactly this), `None` for none.
    pub fn span(self) -> Option<usize> {
        match self {
            TmaSwizzle::None => None,
            TmaSwizzle::B32 => Some(32),
            TmaSwizzle::B64 => Some(64),
            TmaSwizzle::B128 => Some(128),
        }
    }
}

impl std::fmt::Display for TmaSwizzle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.span() {
            None => f.write_str("none"),
            Some(b) => write!(f, "{b}B"),
        }
    }
}

/// The element types of a tensor map (the driver's `CUtensorMapDataType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TmaDataType {
    /// 8-bit integers.
    U8,
    /// 16-bit integers.
    U16,
    /// 32-bit unsigned integers.
    U32,
    /// 32-bit signed integers.
    I32,
    /// 64-bit unsigned integers.
    U64,
    /// 64-bit signed integers.
    I64,
    /// IEEE binary16.
    F16,
    /// IEEE binary32.
    F32,
    /// IEEE binary64.
    F64,
    /// bfloat16.
    #[serde(rename = "bf16")]
    BF16,
}

impl TmaDataType {
    /// The tensor-map type of `dtype` (element size is all a load needs; floats keep their own
    /// types), `None` for types mucc does not run.
    pub fn of(dtype: DType) -> Option<TmaDataType> {
        use TmaDataType as T;
        Some(match dtype {
            DType::U8 | DType::I8 => T::U8,
            DType::U16 | DType::I16 => T::U16,
            DType::U32 => T::U32,
            DType::I32 => T::I32,
            DType::U64 => T::U64,
            DType::I64 => T::I64,
            DType::F16 => T::F16,
            DType::F32 => T::F32,
            DType::F64 => T::F64,
            DType::BF16 => T::BF16,
            DType::F8 | DType::F4 | DType::I4 | DType::U4 => return None,
        })
    }
}

/// One coordinate of a box: the block's offset plus the iteration's, in elements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TmaCoord {
    /// The graph dim of the device tensor this coordinate indexes.
    pub dim: usize,
    /// (grid axis, elements per block index) for each grid axis that partitions the dim.
    pub per_block: Vec<(usize, usize)>,
    /// Elements per for-loop iteration (0: the loop does not walk this dim).
    pub per_iter: usize,
}

/// One bulk copy of a [`TmaLoad`]: the whole box, or a slab of it along [`TmaLoad::split`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TmaCopy {
    /// Index of its tensor map among the kernel's (parameter `tm<map>`).
    pub map: usize,
    /// Elements of the split box dim before the slab (0 for the whole box).
    pub offset: usize,
    /// The slab's extent along the split box dim (for a whole box, the extent of its outermost
    /// dim).
    pub extent: usize,
}

/// The bulk tensor load of one pipelined input tile per iteration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TmaLoad {
    /// The threadblock input operator.
    pub op: usize,
    /// The tile it fills.
    pub tile: usize,
    /// The customized operator's input it reads.
    pub input: usize,
    /// The box dim (index into [`TmaLoad::boxes`]) copied in slabs, `None` when one copy takes
    /// the whole box.
    pub split: Option<usize>,
    /// The copies of every iteration, in order (one when not split); slabs of one extent share
    /// a tensor map.
    pub copies: Vec<TmaCopy>,
    /// Element type.
    pub dtype: DType,
    /// Its tensor-map type.
    pub data_type: TmaDataType,
    /// Extents of the device tensor, innermost first (dims of extent 1 left out).
    pub dims: Vec<u64>,
    /// Byte strides of `dims[1..]`.
    pub strides: Vec<u64>,
    /// The box (the tile), innermost first; a split dim may exceed [`TMA_MAX_BOX`].
    pub boxes: Vec<u32>,
    /// The swizzle the engine applies (the tile's).
    pub swizzle: TmaSwizzle,
    /// Each box coordinate, innermost first.
    pub coords: Vec<TmaCoord>,
    /// Bytes one load writes (the box).
    pub bytes: usize,
}

impl TmaLoad {
    /// The box dims of copy `c` (the slab's extent along the split dim).
    pub fn copy_box(&self, c: &TmaCopy) -> Vec<u32> {
        let mut b = self.boxes.clone();
        if let Some(d) = self.split {
            b[d] = c.extent as u32;
        }
        b
    }

    /// The tensor maps of the load: (map index, box), each once, in map order.
    pub fn maps(&self) -> Vec<(usize, Vec<u32>)> {
        let mut maps: Vec<(usize, Vec<u32>)> = Vec::new();
        for c in &self.copies {
            if maps.iter().all(|(m, _)| *m != c.map) {
                maps.push((c.map, self.copy_box(c)));
            }
        }
        maps
    }

    /// Elements of the tile before copy `c`'s slab (its offset times the box dims inside the
    /// split dim).
    pub fn copy_elements(&self, c: &TmaCopy) -> usize {
        let inner: usize = self
            .split
            .map_or(0, |d| self.boxes[..d].iter().map(|&b| b as usize).product());
        c.offset * inner
    }
}

/// The TMA loads of a kernel's pipelined inputs, and why the other pipelined inputs keep
/// `cp.async`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TmaPlan {
    /// Loads (in operator order); empty when the kernel has none.
    pub loads: Vec<TmaLoad>,
    /// (input operator, why not by TMA) for the other in-loop chunked inputs.
    pub off: Vec<(usize, TmaOff)>,
    /// Shared-memory byte offset of the stages' `full` mbarriers (8 bytes each).
    pub barriers: usize,
}

impl TmaPlan {
    /// The load of input operator `op`, if it is loaded by TMA.
    pub fn load_of(&self, op: usize) -> Option<&TmaLoad> {
        self.loads.iter().find(|l| l.op == op)
    }

    /// Bytes every iteration's loads announce on the stage's mbarrier.
    pub fn bytes_per_stage(&self) -> usize {
        self.loads.iter().map(|l| l.bytes).sum()
    }

    /// The kernel's tensor maps: (map index, the load, its box) in map order.
    pub fn maps(&self) -> Vec<(usize, &TmaLoad, Vec<u32>)> {
        self.loads
            .iter()
            .flat_map(|l| l.maps().into_iter().map(move |(m, b)| (m, l, b)))
            .collect()
    }

    /// How many tensor maps the kernel takes.
    pub fn map_count(&self) -> usize {
        self.loads.iter().map(|l| l.maps().len()).sum()
    }
}

/// Why an in-loop chunked input keeps `cp.async` instead of a TMA load ([`TmaPlan::off`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TmaOff {
    /// The tile's XOR swizzle has no TMA mode (its `b` is not 1, 2 or 3).
    NoSwizzleMode {
        /// The swizzle's (b, m, s).
        xor: (u32, u32, u32),
    },
    /// The tile's XOR swizzle permutes other bits than the TMA mode of its width.
    SwizzleBits {
        /// The swizzle's (b, m, s).
        xor: (u32, u32, u32),
        /// The TMA mode of its width.
        mode: TmaSwizzle,
    },
    /// The box's rows are not the swizzle mode's rows.
    SwizzleRows {
        /// Bytes of a box row.
        row_bytes: usize,
        /// The TMA mode.
        mode: TmaSwizzle,
    },
    /// The tile's rows are padded (shift swizzle).
    PaddedRows,
    /// TMA has no type of this width.
    NoType(DType),
    /// The device tensor has one element.
    OneElement,
    /// The device tensor has more dims of extent above 1 than TMA takes.
    TooManyDims {
        /// Its dims of extent above 1.
        dims: usize,
    },
    /// The device tensor's innermost dim is not contiguous.
    InnermostStrided,
    /// A dim of the device tensor overlaps the dims inside it.
    Overlap {
        /// The dim.
        dim: usize,
    },
    /// A dim's stride is no multiple of 16 bytes below 2^40.
    StrideBytes {
        /// The dim.
        dim: usize,
        /// Its stride in bytes.
        bytes: usize,
    },
    /// An extent of the device tensor reaches 2^32.
    HugeExtent,
    /// The tile is larger than the device tensor along a dim.
    TileLarger,
    /// A box dim exceeds TMA's largest and cannot be copied in slabs (it is not the box's
    /// outermost dim of extent above 1, or another dim exceeds it too).
    BoxTooLarge {
        /// Its elements.
        elements: usize,
    },
    /// The tile is not the dense box.
    NotDense {
        /// The dim.
        dim: usize,
        /// Its stride in shared memory.
        stride: usize,
        /// The box's stride for it.
        dense: usize,
    },
    /// The box's rows are no multiple of 16 bytes.
    RowBytes {
        /// Bytes of a box row.
        row_bytes: usize,
    },
    /// A tile in atom columns without exactly two dims of extent above 1.
    ColumnsShape,
    /// The columns' dim is not the device tensor's innermost.
    ColumnsNotInnermost,
    /// Split into columns, the device tensor's dims exceed TMA's.
    ColumnsTooManyDims {
        /// Its dims of extent above 1.
        dims: usize,
    },
    /// The device tensor's innermost dim is not cut into whole columns.
    ColumnsNotWhole {
        /// Elements per column.
        width: usize,
    },
    /// The columns are not the dense box.
    ColumnsNotDense,
    /// One pipeline stage fits: no ring to load into.
    NoRing,
    /// TMA is turned off (`Options::tma`: `--no-tma`, the tuning variant `tma=off`).
    TurnedOff,
}

impl fmt::Display for TmaOff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TmaOff::NoSwizzleMode { xor: (b, m, s) } => {
                write!(f, "its swizzle xor<{b},{m},{s}> is no TMA pattern")
            }
            TmaOff::SwizzleBits {
                xor: (b, m, s),
                mode,
            } => write!(
                f,
                "its swizzle xor<{b},{m},{s}> permutes other bits than TMA's {mode} pattern"
            ),
            TmaOff::SwizzleRows { row_bytes, mode } => {
                write!(
                    f,
                    "its rows of {row_bytes} B are not the {mode} swizzle's rows"
                )
            }
            TmaOff::PaddedRows => f.write_str("its rows are padded (shift swizzle)"),
            TmaOff::NoType(d) => write!(f, "TMA has no {d} type"),
            TmaOff::OneElement => f.write_str("the device tensor has one element"),
            TmaOff::TooManyDims { dims } => write!(
                f,
                "the device tensor has {dims} dims of extent above 1 (TMA takes {TMA_MAX_RANK})"
            ),
            TmaOff::InnermostStrided => {
                f.write_str("the device tensor's innermost dim is not contiguous")
            }
            TmaOff::Overlap { dim } => {
                write!(
                    f,
                    "dim {dim} of the device tensor overlaps the dims inside it"
                )
            }
            TmaOff::StrideBytes { dim, bytes } => write!(
                f,
                "dim {dim}'s stride of {bytes} B is no multiple of 16 below 2^40"
            ),
            TmaOff::HugeExtent => f.write_str("an extent of the device tensor reaches 2^32"),
            TmaOff::TileLarger => {
                f.write_str("the tile is larger than the device tensor along a dim")
            }
            TmaOff::BoxTooLarge { elements } => write!(
                f,
                "a box dim of {elements} elements exceeds TMA's {TMA_MAX_BOX}, and box dims \
                 above 1 lie outside it (its slabs would not be contiguous in the tile)"
            ),
            TmaOff::NotDense { dim, stride, dense } => write!(
                f,
                "the tile is not the dense box (dim {dim} has stride {stride} in shared memory, \
                 the box {dense})"
            ),
            TmaOff::RowBytes { row_bytes } => {
                write!(f, "the box's rows of {row_bytes} B are no multiple of 16")
            }
            TmaOff::ColumnsShape => {
                f.write_str("a tile in atom columns must have two dims of extent above 1")
            }
            TmaOff::ColumnsNotInnermost => {
                f.write_str("the columns' dim is not the device tensor's innermost")
            }
            TmaOff::ColumnsTooManyDims { dims } => write!(
                f,
                "the device tensor has {dims} dims of extent above 1; split into columns they \
                 exceed TMA's {TMA_MAX_RANK}"
            ),
            TmaOff::ColumnsNotWhole { width } => write!(
                f,
                "the device tensor's innermost dim is not cut into whole columns of {width}"
            ),
            TmaOff::ColumnsNotDense => f.write_str("the columns are not the dense box"),
            TmaOff::NoRing => f.write_str("one pipeline stage fits: no ring to load into"),
            TmaOff::TurnedOff => f.write_str("TMA is turned off (--no-tma)"),
        }
    }
}

/// The TMA swizzle equal to a tile's swizzle for elements of `elem` bytes and rows of
/// `row_bytes`, or why none is.
fn engine_swizzle(sw: Swizzle, elem: usize, row_bytes: usize) -> Result<TmaSwizzle, TmaOff> {
    match sw {
        Swizzle::None => Ok(TmaSwizzle::None),
        Swizzle::Xor { b, m, s } => {
            let m_bytes = m + elem.trailing_zeros();
            let mode = match b {
                1 => TmaSwizzle::B32,
                2 => TmaSwizzle::B64,
                3 => TmaSwizzle::B128,
                _ => return Err(TmaOff::NoSwizzleMode { xor: (b, m, s) }),
            };
            if m_bytes != 4 || s != 3 {
                return Err(TmaOff::SwizzleBits {
                    xor: (b, m, s),
                    mode,
                });
            }
            if Some(row_bytes) != mode.span() {
                return Err(TmaOff::SwizzleRows { row_bytes, mode });
            }
            Ok(mode)
        }
        Swizzle::Shift { .. } => Err(TmaOff::PaddedRows),
    }
}

/// The load of input `op`'s tile, or why there is none.
#[allow(clippy::too_many_arguments)]
fn plan_load(
    tb: &TbGraph,
    op: usize,
    tile: usize,
    input: usize,
    imap: crate::graph::ops::DimMap,
    forloop_dim: Option<usize>,
    device: (&Shape, &Strides),
    geo: &TileGeometry,
) -> Result<TmaLoad, TmaOff> {
    let (dshape, dstrides) = device;
    let elem = geo.dtype.bytes();
    let shape = tb.tensors[crate::graph::arena::Handle::from_index(tile)].shape;
    let Some(data_type) = TmaDataType::of(geo.dtype) else {
        return Err(TmaOff::NoType(geo.dtype));
    };
    // Dims of the device tensor in stride order, innermost first; extent-1 dims left out.
    let mut order: Vec<usize> = (0..dshape.rank()).filter(|&d| dshape.dim(d) > 1).collect();
    order.sort_by_key(|&d| dstrides.0[d]);
    if order.is_empty() {
        return Err(TmaOff::OneElement);
    }
    if order.len() > TMA_MAX_RANK {
        return Err(TmaOff::TooManyDims { dims: order.len() });
    }
    if dstrides.0[order[0]] != 1 {
        return Err(TmaOff::InnermostStrided);
    }
    let mut strides = Vec::new();
    let mut span = dshape.dim(order[0]);
    for &d in &order[1..] {
        let st = dstrides.0[d];
        if st < span {
            return Err(TmaOff::Overlap { dim: d });
        }
        let bytes = st * elem;
        if !bytes.is_multiple_of(16) || bytes >= 1 << 40 {
            return Err(TmaOff::StrideBytes { dim: d, bytes });
        }
        strides.push(bytes as u64);
        span = st * dshape.dim(d);
    }
    if order.iter().any(|&d| dshape.dim(d) >= 1 << 32) {
        return Err(TmaOff::HugeExtent);
    }
    // The tile's dims of extent 1 that the device tensor lacks cannot be boxed (never the case
    // for a tile of a partition, kept as a guard).
    if (0..shape.rank()).any(|d| shape.dim(d) > 1 && dshape.dim(d) == 1) {
        return Err(TmaOff::TileLarger);
    }
    let coord = |d: usize, unit: usize| TmaCoord {
        dim: d,
        per_block: (0..3)
            .filter(|&a| tb.grid[a] > 1 && imap.axis(a) == Some(d))
            .map(|a| (a, dshape.dim(d) / tb.grid[a] / unit))
            .collect(),
        per_iter: if forloop_dim == Some(d) {
            shape.dim(d) / unit
        } else {
            0
        },
    };
    if let Some(c) = geo.columns {
        return columns_load(
            (op, tile, input),
            &shape,
            (dshape, &order, &strides),
            geo,
            c,
            data_type,
            coord,
        );
    }
    let boxes: Vec<usize> = order.iter().map(|&d| shape.dim(d)).collect();
    // The tile must be the dense box: stride of each dim (of extent above 1) the product of
    // the box dims inside it.
    let mut dense = 1;
    for (j, &d) in order.iter().enumerate() {
        if boxes[j] > 1 && geo.strides.0[d] != dense {
            return Err(TmaOff::NotDense {
                dim: d,
                stride: geo.strides.0[d],
                dense,
            });
        }
        dense *= boxes[j];
    }
    let row_bytes = boxes[0] * elem;
    if !row_bytes.is_multiple_of(16) {
        return Err(TmaOff::RowBytes { row_bytes });
    }
    let swizzle = engine_swizzle(geo.swizzle, elem, row_bytes)?;
    let (split, copies) = slabs(&boxes, elem, swizzle)?;
    let coords = order.iter().map(|&d| coord(d, 1)).collect();
    Ok(TmaLoad {
        op,
        tile,
        input,
        split,
        copies,
        dtype: geo.dtype,
        data_type,
        dims: order.iter().map(|&d| dshape.dim(d) as u64).collect(),
        strides,
        boxes: boxes.iter().map(|&b| b as u32).collect(),
        swizzle,
        coords,
        bytes: dense * elem,
    })
}

/// The copies of a dense box (innermost dim first) of `elem`-byte elements under the engine's
/// `swizzle`: one for a box within [`TMA_MAX_BOX`] (map 0, extent of the outermost dim), else
/// the slabs of its outermost dim of extent above 1 (maps 0 and 1: the full slabs' extent and
/// the remainder's), or why it cannot be split. A slab starts on the engine's alignment for the
/// swizzle (the pattern follows the address); a slab of the innermost dim keeps 16-byte rows.
fn slabs(
    boxes: &[usize],
    elem: usize,
    swizzle: TmaSwizzle,
) -> Result<(Option<usize>, Vec<TmaCopy>), TmaOff> {
    let whole = |extent| {
        vec![TmaCopy {
            map: 0,
            offset: 0,
            extent,
        }]
    };
    let Some(d) = boxes.iter().position(|&b| b > TMA_MAX_BOX) else {
        return Ok((None, whole(*boxes.last().expect("a box dim"))));
    };
    let b = boxes[d];
    if boxes[d + 1..].iter().any(|&e| e > 1) {
        return Err(TmaOff::BoxTooLarge { elements: b });
    }
    let unit: usize = boxes[..d].iter().product::<usize>() * elem;
    let align = if swizzle == TmaSwizzle::None {
        TMA_SLAB_ALIGN
    } else {
        TMA_SLOT_ALIGN
    };
    // Slab rows keep the next slab's start aligned: a multiple of align / gcd(unit, align), a
    // power of two at most 128 (unswizzled) or 32 (swizzled rows of at least 32 bytes), so
    // whole slabs are 256 long in practice.
    let step = align / gcd(unit, align);
    let full = TMA_MAX_BOX / step * step;
    if full == 0 {
        return Err(TmaOff::BoxTooLarge { elements: b });
    }
    let rest = b % full;
    if d == 0 && !(rest * elem).is_multiple_of(16) {
        return Err(TmaOff::RowBytes {
            row_bytes: rest * elem,
        });
    }
    let mut copies: Vec<TmaCopy> = (0..b / full)
        .map(|i| TmaCopy {
            map: 0,
            offset: i * full,
            extent: full,
        })
        .collect();
    if rest > 0 {
        copies.push(TmaCopy {
            map: 1,
            offset: b - rest,
            extent: rest,
        });
    }
    Ok((Some(d), copies))
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The load of a tile stored in atom columns ([`AtomColumns`]): the device tensor's innermost
/// dim (the tile's split dim, contiguous) is mapped as two, the offset inside a column (extent
/// and box `width`, coordinate 0) and the column index (extent / `width`, stride `width`
/// elements, coordinate in columns), with the tile's other dim of extent above 1 between them:
/// the box (width, K, N / width, 1, …) lands in shared memory as the columns one after another,
/// each K rows of `width` elements under the 128-byte swizzle. `device` holds the device
/// tensor's shape, its dims of extent above 1 innermost first, and their byte strides (of
/// `order[1..]`), checked by the caller; `coord(d, unit)` is dim `d`'s coordinate in units of
/// `unit` elements.
fn columns_load(
    (op, tile, input): (usize, usize, usize),
    shape: &Shape,
    (dshape, order, strides): (&Shape, &[usize], &[u64]),
    geo: &TileGeometry,
    c: AtomColumns,
    data_type: TmaDataType,
    coord: impl Fn(usize, usize) -> TmaCoord,
) -> Result<TmaLoad, TmaOff> {
    let elem = geo.dtype.bytes();
    let n_dim = c.dim;
    let tiled: Vec<usize> = (0..shape.rank()).filter(|&d| shape.dim(d) > 1).collect();
    let [k_dim, n] = tiled[..] else {
        return Err(TmaOff::ColumnsShape);
    };
    if n != n_dim || order.first() != Some(&n_dim) {
        return Err(TmaOff::ColumnsNotInnermost);
    }
    if order.len() + 1 > TMA_MAX_RANK {
        return Err(TmaOff::ColumnsTooManyDims { dims: order.len() });
    }
    let (k, w) = (shape.dim(k_dim), c.width);
    let per_block_ok = coord(n_dim, 1)
        .per_block
        .iter()
        .all(|&(_, e)| e.is_multiple_of(w));
    if !dshape.dim(n_dim).is_multiple_of(w) || !shape.dim(n_dim).is_multiple_of(w) || !per_block_ok
    {
        return Err(TmaOff::ColumnsNotWhole { width: w });
    }
    if c.stride != k * w || k > TMA_MAX_BOX || shape.dim(n_dim) / w > TMA_MAX_BOX {
        return Err(TmaOff::ColumnsNotDense);
    }
    let swizzle = engine_swizzle(geo.swizzle, elem, w * elem)?;
    // Map dims: inside a column, K, the column index, then the rest in stride order.
    let stride_of = |d: usize| strides[order.iter().position(|&o| o == d).expect("a dim") - 1];
    let rest: Vec<usize> = order[1..].iter().copied().filter(|&d| d != k_dim).collect();
    let mut dims = vec![
        w as u64,
        dshape.dim(k_dim) as u64,
        (dshape.dim(n_dim) / w) as u64,
    ];
    let mut map_strides = vec![stride_of(k_dim), (w * elem) as u64];
    let mut boxes = vec![w as u32, k as u32, (shape.dim(n_dim) / w) as u32];
    let mut coords = vec![
        TmaCoord {
            dim: n_dim,
            per_block: Vec::new(),
            per_iter: 0,
        },
        coord(k_dim, 1),
        coord(n_dim, w),
    ];
    for d in rest {
        dims.push(dshape.dim(d) as u64);
        map_strides.push(stride_of(d));
        boxes.push(1);
        coords.push(coord(d, 1));
    }
    Ok(TmaLoad {
        op,
        tile,
        input,
        split: None,
        copies: vec![TmaCopy {
            map: 0,
            offset: 0,
            extent: *boxes.last().expect("a box dim") as usize,
        }],
        dtype: geo.dtype,
        data_type,
        dims,
        strides: map_strides,
        boxes,
        swizzle,
        coords,
        bytes: k * shape.dim(n_dim) * elem,
    })
}

/// The TMA loads of the in-loop chunked inputs of `tb` (candidates for the pipeline), given
/// the device tensors of the operator's inputs; with `enabled` false none, each candidate
/// marked [`TmaOff::TurnedOff`]. `barriers` is set by the caller.
pub fn plan_tma(
    tb: &TbGraph,
    ops: &[OpPlan],
    tiles: &[Option<TileGeometry>],
    ins: &super::kernel::Side,
    enabled: bool,
) -> TmaPlan {
    let mut plan = TmaPlan::default();
    if tb.forloop_range < 2 {
        return plan;
    }
    for (h, top) in tb.ops.iter() {
        let TbOpKind::Input {
            input,
            imap,
            forloop_dim: Some(f),
        } = top.kind
        else {
            continue;
        };
        if !matches!(
            ops[h.index()],
            OpPlan::Input {
                copy: Copy::Chunked { .. },
                ..
            }
        ) {
            continue;
        }
        let tile = top.outputs[0].index();
        let Some(geo) = tiles[tile].as_ref() else {
            continue;
        };
        if !enabled {
            plan.off.push((h.index(), TmaOff::TurnedOff));
            continue;
        }
        let (dshape, dstrides, _) = &ins[input];
        match plan_load(
            tb,
            h.index(),
            tile,
            input,
            imap,
            Some(f),
            (dshape, dstrides),
            geo,
        ) {
            Ok(mut l) => {
                // Number the load's maps after the kernel's earlier ones.
                let first = plan.map_count();
                for c in &mut l.copies {
                    c.map += first;
                }
                plan.loads.push(l);
            }
            Err(why) => plan.off.push((h.index(), why)),
        }
    }
    plan
}

/// Pads the tiles TMA loads to whole 1024-byte slots (the stage slots of a ring follow each
/// other at the tile's size).
pub fn pad_slots(plan: &TmaPlan, tiles: &mut [Option<TileGeometry>]) {
    for l in &plan.loads {
        if let Some(geo) = tiles[l.tile].as_mut() {
            let elem = geo.dtype.bytes();
            geo.bytes = geo.bytes.next_multiple_of(TMA_SLOT_ALIGN);
            geo.phys_elems = geo.bytes / elem;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::workloads::decode_gated_linear;
    use crate::sched::ops::CopyEngine;
    use crate::sched::plan::{Options, PathChoice};
    use crate::target::{Arch, Target};

    #[test]
    fn engine_swizzles_are_the_planners_xor_patterns() {
        // bf16 rows of 128 B: xor<3,3,3> on element offsets is the 128-byte pattern.
        assert_eq!(
            engine_swizzle(Swizzle::Xor { b: 3, m: 3, s: 3 }, 2, 128),
            Ok(TmaSwizzle::B128)
        );
        // f32 rows of 64 B: xor<2,2,3>.
        assert_eq!(
            engine_swizzle(Swizzle::Xor { b: 2, m: 2, s: 3 }, 4, 64),
            Ok(TmaSwizzle::B64)
        );
        assert_eq!(engine_swizzle(Swizzle::None, 2, 48), Ok(TmaSwizzle::None));
        // Rows longer than a line permute by the row's low bits: no engine pattern.
        assert!(engine_swizzle(Swizzle::Xor { b: 3, m: 3, s: 4 }, 2, 256).is_err());
        assert!(engine_swizzle(Swizzle::Shift { row_chunks: 9 }, 2, 144).is_err());
    }

    #[test]
    fn long_outermost_box_dims_are_copied_in_aligned_slabs() {
        let at = |c: &[TmaCopy]| -> Vec<(usize, usize, usize)> {
            c.iter().map(|c| (c.map, c.offset, c.extent)).collect()
        };
        // Within the limit: one copy of the whole box.
        let (split, c) = slabs(&[64, 172], 2, TmaSwizzle::B128).unwrap();
        assert_eq!((split, at(&c)), (None, vec![(0, 0, 172)]));
        // 296 rows of 128 swizzled bytes: 256 rows (32 KB, 1024-byte aligned) and 40.
        let (split, c) = slabs(&[64, 296], 2, TmaSwizzle::B128).unwrap();
        assert_eq!((split, at(&c)), (Some(1), vec![(0, 0, 256), (1, 256, 40)]));
        // A row of 296 bf16: 512 bytes, then 80 (16-byte rows).
        let (split, c) = slabs(&[296], 2, TmaSwizzle::None).unwrap();
        assert_eq!((split, at(&c)), (Some(0), vec![(0, 0, 256), (1, 256, 40)]));
        // Full slabs share a map; the remainder has its own.
        let (_, c) = slabs(&[32, 600, 1], 2, TmaSwizzle::None).unwrap();
        assert_eq!(at(&c), vec![(0, 0, 256), (0, 256, 256), (1, 512, 88)]);
        // Rows of 48 unswizzled bytes: slabs of a multiple of 8 rows keep 128-byte starts.
        let (_, c) = slabs(&[24, 300], 2, TmaSwizzle::None).unwrap();
        assert_eq!(at(&c), vec![(0, 0, 256), (1, 256, 44)]);
        // Rows of 32 swizzled bytes: the second slab starts 8 KB in, on the pattern's 1024.
        let (_, c) = slabs(&[16, 300], 2, TmaSwizzle::B32).unwrap();
        assert_eq!(at(&c), vec![(0, 0, 256), (1, 256, 44)]);
        // Not the outermost dim above 1: slabs would interleave.
        assert_eq!(
            slabs(&[296, 8], 2, TmaSwizzle::None),
            Err(TmaOff::BoxTooLarge { elements: 296 })
        );
        // An innermost remainder of 44 bf16 (88 bytes) breaks the 16-byte rows.
        assert_eq!(
            slabs(&[300], 2, TmaSwizzle::None),
            Err(TmaOff::RowBytes { row_bytes: 88 })
        );
    }

    #[test]
    fn decode_weights_of_more_than_256_rows_stream_in_slabs() {
        use crate::sched::plan::Ring;
        // K = 18944 over 64 iterations: 296 rows of W and X, Y rows of 296 elements.
        let g = decode_gated_linear(1, 18944, 3584, 56, 64, DType::BF16).unwrap();
        let p = crate::sched::plan(&g, &Options::for_target(Target::new(Arch::Sm90a))).unwrap();
        let kp = p.kernels.values().next().unwrap();
        assert!(kp.tma.off.is_empty(), "{:?}", kp.tma.off);
        let w = kp.tma.loads.iter().find(|l| l.input == 2).unwrap();
        assert_eq!((w.boxes.clone(), w.split), (vec![64, 296], Some(1)));
        assert_eq!(w.copy_elements(&w.copies[1]), 256 * 64);
        let maps: Vec<(usize, Vec<u32>)> =
            kp.tma.maps().into_iter().map(|(m, _, b)| (m, b)).collect();
        assert_eq!(
            maps,
            vec![
                (0, vec![256]),
                (1, vec![40]),
                (2, vec![256]),
                (3, vec![40]),
                (4, vec![64, 256]),
                (5, vec![64, 40])
            ]
        );
        assert_eq!(kp.tma.map_count(), 6);
        // The whole boxes' bytes are announced: X and Y rows of 296, W's 296 × 64.
        assert_eq!(kp.tma.bytes_per_stage(), (296 + 296 + 296 * 64) * 2);
        assert!(matches!(kp.ring(), Some(Ring { cp_async, .. }) if cp_async.is_empty()));
        // M = 8: X and Y tiles [8, 296] cannot be slabs of their rows; W still is.
        let g = decode_gated_linear(8, 18944, 3584, 56, 64, DType::BF16).unwrap();
        let p = crate::sched::plan(&g, &Options::for_target(Target::new(Arch::Sm90a))).unwrap();
        let kp = p.kernels.values().next().unwrap();
        assert_eq!(kp.tma.loads.len(), 1);
        assert_eq!(kp.tma.map_count(), 2);
        assert_eq!(
            kp.tma
                .off
                .iter()
                .map(|(_, w)| w.clone())
                .collect::<Vec<_>>(),
            vec![TmaOff::BoxTooLarge { elements: 296 }; 2]
        );
    }

    #[test]
    fn decode_weights_stream_by_tma_on_sm90a_only() {
        let g = decode_gated_linear(1, 11008, 2048, 32, 64, DType::BF16).unwrap();
        let opts = Options::for_target(Target::new(Arch::Sm90a));
        let p = crate::sched::plan(&g, &opts).unwrap();
        let kp = p.kernels.values().next().unwrap();
        assert_eq!(kp.tma.loads.len(), 1);
        let l = &kp.tma.loads[0];
        assert_eq!((l.input, l.dims.clone()), (2, vec![2048, 11008]));
        assert_eq!(
            (l.boxes.clone(), l.strides.clone()),
            (vec![64, 172], vec![4096])
        );
        assert_eq!((l.swizzle, l.bytes), (TmaSwizzle::B128, 64 * 172 * 2));
        assert_eq!(l.coords[0].per_block, vec![(0, 64)]);
        assert_eq!((l.coords[0].per_iter, l.coords[1].per_iter), (0, 172));
        assert!(matches!(
            kp.ops[l.op],
            OpPlan::Input {
                engine: CopyEngine::Tma,
                ..
            }
        ));
        // Slots on 1024-byte boundaries, barriers after the zero page.
        let b = kp.smem.buffer_of(l.tile).unwrap();
        assert_eq!(kp.smem.offset(b) % TMA_SLOT_ALIGN, 0);
        assert_eq!(kp.tiles[l.tile].as_ref().unwrap().bytes % TMA_SLOT_ALIGN, 0);
        assert_eq!(kp.tma.barriers, crate::sched::plan::ZERO_PAGE);
        assert!(kp.smem.base >= kp.tma.barriers + 8 * kp.pipeline_stages());
        // The Ampere path and sm_80 keep cp.async.
        for opts in [
            Options {
                path: PathChoice::Ampere,
                ..opts
            },
            Options::for_target(Target::new(Arch::Sm80)),
        ] {
            let p = crate::sched::plan(&g, &opts).unwrap();
            let kp = p.kernels.values().next().unwrap();
            assert!(kp.tma.loads.is_empty() && kp.tma.off.is_empty());
        }
    }

    #[test]
    fn tma_turned_off_keeps_every_streamed_tile_on_cp_async_and_says_so() {
        let g = decode_gated_linear(1, 11008, 2048, 32, 64, DType::BF16).unwrap();
        let opts = Options {
            tma: false,
            ..Options::for_target(Target::new(Arch::Sm90a))
        };
        let p = crate::sched::plan(&g, &opts).unwrap();
        let kp = p.kernels.values().next().unwrap();
        assert!(kp.tma.loads.is_empty());
        // X, its gate and W: every in-loop chunked input names the option.
        assert_eq!(
            kp.tma.off,
            vec![
                (0, TmaOff::TurnedOff),
                (1, TmaOff::TurnedOff),
                (2, TmaOff::TurnedOff)
            ]
        );
        assert!(kp.ops.iter().all(|o| !matches!(
            o,
            OpPlan::Input {
                engine: CopyEngine::Tma,
                ..
            }
        )));
        // The rest of the Hopper plan stays: the cluster split and a ring of cp.async stages.
        assert!(matches!(kp.split, crate::sched::plan::Split::Cluster(_)));
        assert!(kp.pipeline_stages() >= 2);
        assert_eq!(
            TmaOff::TurnedOff.to_string(),
            "TMA is turned off (--no-tma)"
        );
    }
}
