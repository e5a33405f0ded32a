//! Swizzle planning and tile geometry.
//!
//! A tile whose swizzled dim is walked by threads (or read 8 rows at a time by `ldmatrix`) gets
//! its rows spread over the shared-memory banks, in units of the tile's *chunk* — the widest
//! access the schedule makes to it (16 bytes for 16-byte copies and `ldmatrix`, otherwise the
//! element size, at least 4 bytes, the bank width):
//! - **XOR** (`Swizzle<B, M, S>` on element offsets: bits [M+S, M+S+B) are XORed into
//!   [M, M+B)) when a row is a power-of-two number of chunks: M = log2(chunk elements); if a row
//!   has more chunks than a 128-byte line, B = log2(chunks per line) and S = log2(chunks per
//!   row) (the low row bits permute the chunks), otherwise B = log2(chunks per row) and
//!   S = log2(chunks per line) (the line index permutes them). No memory overhead.
//! - **Shift** otherwise: the row stride grows to the next number of chunks coprime with the
//!   chunks per line (an odd number), so consecutive rows start in different banks.
//!
//! Rows of one chunk need neither.

use super::solve::TileLayout;
use super::strides::{dim_order, padded_strides};
use crate::graph::dtype::DType;
use crate::graph::shape::{Shape, Strides};
use crate::target::Target;

/// How a tile's addresses are permuted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Swizzle {
    /// Plain strides.
    None,
    /// `Swizzle<b, m, s>` on element offsets.
    Xor {
        /// Bits permuted.
        b: u32,
        /// Bits of a chunk.
        m: u32,
        /// Shift of the permuting bits.
        s: u32,
    },
    /// Rows padded to `row_chunks` chunks (odd).
    Shift {
        /// Chunks per padded row.
        row_chunks: usize,
    },
}

impl std::fmt::Display for Swizzle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Swizzle::None => f.write_str("none"),
            Swizzle::Xor { b, m, s } => write!(f, "xor<{b},{m},{s}>"),
            Swizzle::Shift { row_chunks } => write!(f, "shift (rows of {row_chunks} chunks)"),
        }
    }
}

/// A tile whose contiguous dim is stored in columns (`sched` plans them for the B operand of
/// a Hopper `wgmma`, whose descriptor reads whole 128-byte swizzle atoms): element `i` of dim
/// `dim` lies in column `i / width` at offset `i % width` (stride 1 inside a column), and
/// columns are `stride` elements apart; the other dims keep their strides inside a column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AtomColumns {
    /// The dim split into columns (the tile's innermost).
    pub dim: usize,
    /// Elements of `dim` per column.
    pub width: usize,
    /// Element stride from one column to the next.
    pub stride: usize,
}

/// The physical form of a shared-memory tile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TileGeometry {
    /// Innermost and swizzled dims.
    pub layout: TileLayout,
    /// Element strides (before any XOR permutation).
    pub strides: Strides,
    /// Elements allocated.
    pub phys_elems: usize,
    /// Bytes allocated (a multiple of 16).
    pub bytes: usize,
    /// Swizzle.
    pub swizzle: Swizzle,
    /// Chunk size the swizzle preserves (bytes).
    pub chunk_bytes: usize,
    /// The element type the tile stores (the graph's type, or the compute type for the wide
    /// accumulator tiles of `sched`).
    pub dtype: DType,
    /// The innermost dim stored in columns (`strides` then hold the strides inside a column);
    /// `None` for the plain strided form.
    pub columns: Option<AtomColumns>,
}

impl TileGeometry {
    /// The extents and element strides of the tile's dims walked in `order` (slowest first)
    /// as the runtime's layout sees them: a dim stored in columns becomes two, the column
    /// index (extent / width, the column stride) then the offset inside it (width, stride 1),
    /// which keeps the row-major linear index of the dims in `order`.
    pub fn layout_dims(
        &self,
        shape: &crate::graph::shape::Shape,
        order: &[usize],
    ) -> (Vec<usize>, Vec<usize>) {
        let (mut dims, mut strides) = (Vec::new(), Vec::new());
        for &d in order {
            match self.columns {
                Some(c) if c.dim == d => {
                    dims.extend([shape.dim(d) / c.width, c.width]);
                    strides.extend([c.stride, self.strides.0[d]]);
                }
                _ => {
                    dims.push(shape.dim(d));
                    strides.push(self.strides.0[d]);
                }
            }
        }
        (dims, strides)
    }
}

/// Plans the geometry of a tile of `shape` storing `dtype` elements whose widest access is
/// `min_chunk_bytes`.
pub fn plan_tile(
    shape: &Shape,
    dtype: DType,
    layout: TileLayout,
    min_chunk_bytes: usize,
    target: &Target,
) -> TileGeometry {
    let elem = dtype.bytes();
    let (mut strides, mut phys) = padded_strides(shape, layout.innermost, layout.swizzled, elem);
    let mut chunk = min_chunk_bytes
        .max(elem)
        .next_power_of_two()
        .max(4)
        .min(target.max_copy_bytes);
    let mut swizzle = Swizzle::None;
    let inner_ext = shape.dim(layout.innermost);
    let row_elems = strides
        .0
        .get(layout.swizzled.unwrap_or(layout.innermost))
        .copied()
        .unwrap_or(1);
    if let Some(sw) = layout
        .swizzled
        .filter(|&sw| shape.dim(sw) > 1 && inner_ext > 1 && sw != layout.innermost)
    {
        let row_bytes = row_elems * elem;
        while chunk > 4 && !row_bytes.is_multiple_of(chunk) {
            chunk /= 2;
        }
        let chunk_elems = (chunk / elem).max(1);
        let n_row = row_bytes / chunk;
        let n_line = target.smem_line_bytes / chunk;
        if n_row > 1 {
            if n_row.is_power_of_two() {
                let m = chunk_elems.trailing_zeros();
                let (b, s) = if n_row > n_line {
                    (n_line.trailing_zeros(), n_row.trailing_zeros())
                } else {
                    (n_row.trailing_zeros(), n_line.trailing_zeros())
                };
                swizzle = Swizzle::Xor { b, m, s };
            } else {
                let n2 = if !n_row.is_multiple_of(2) {
                    n_row
                } else {
                    n_row + 1
                };
                swizzle = Swizzle::Shift { row_chunks: n2 };
                let mut st = vec![0; shape.rank()];
                let mut run = 1;
                for (i, d) in dim_order(shape.rank(), layout.innermost, Some(sw))
                    .into_iter()
                    .enumerate()
                {
                    st[d] = run;
                    run = if i == 0 {
                        n2 * chunk_elems
                    } else {
                        run * shape.dim(d)
                    };
                }
                strides = Strides(st);
                phys = run;
            }
        }
    }
    let bytes = (phys * elem).div_ceil(16) * 16;
    TileGeometry {
        layout,
        strides,
        phys_elems: phys,
        bytes,
        swizzle,
        chunk_bytes: chunk,
        dtype,
        columns: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::{Arch, Target};

    fn t() -> Target {
        Target::new(Arch::Sm80)
    }

    fn l(innermost: usize, swizzled: Option<usize>) -> TileLayout {
        TileLayout {
            innermost,
            swizzled,
        }
    }

    /// A tile in atom columns shows the runtime its split dim as (column, offset): the row-major
    /// index of [64, 128] maps to column · 4096 + row · 64 + offset.
    #[test]
    fn atom_columns_split_the_dim_for_the_runtime() {
        let shape = Shape::new(&[1, 64, 128]).unwrap();
        let mut g = plan_tile(&shape, DType::F16, l(2, Some(1)), 16, &t());
        g.strides = Strides(vec![8192, 64, 1]);
        g.columns = Some(AtomColumns {
            dim: 2,
            width: 64,
            stride: 4096,
        });
        assert_eq!(
            g.layout_dims(&shape, &[0, 1, 2]),
            (vec![1, 64, 2, 64], vec![8192, 64, 4096, 1])
        );
        g.columns = None;
        assert_eq!(
            g.layout_dims(&shape, &[0, 1, 2]),
            (vec![1, 64, 128], vec![8192, 64, 1])
        );
    }

    #[test]
    fn xor_for_power_of_two_rows() {
        // 64×64 fp16: rows of 8 chunks of 16 B = one 128-B line → Swizzle<3,3,3>.
        let g = plan_tile(
            &Shape::new(&[64, 64]).unwrap(),
            DType::F16,
            l(1, Some(0)),
            16,
            &t(),
        );
        assert_eq!(g.swizzle, Swizzle::Xor { b: 3, m: 3, s: 3 });
        assert_eq!(g.bytes, 8192);
        // 8×32 fp16: rows of 4 chunks; the line index permutes them.
        let g = plan_tile(
            &Shape::new(&[8, 32]).unwrap(),
            DType::F16,
            l(1, Some(0)),
            16,
            &t(),
        );
        assert_eq!(g.swizzle, Swizzle::Xor { b: 2, m: 3, s: 3 });
        // 16×128 fp16: rows of 16 chunks; the low row bits permute them.
        let g = plan_tile(
            &Shape::new(&[16, 128]).unwrap(),
            DType::F16,
            l(1, Some(0)),
            16,
            &t(),
        );
        assert_eq!(g.swizzle, Swizzle::Xor { b: 3, m: 3, s: 4 });
    }

    #[test]
    fn shift_for_other_rows() {
        // 46×47 fp16: rows padded to 48 = 6 chunks, shifted to 7 chunks (56 elements).
        let g = plan_tile(
            &Shape::new(&[46, 47]).unwrap(),
            DType::F16,
            l(1, Some(0)),
            16,
            &t(),
        );
        assert_eq!(g.swizzle, Swizzle::Shift { row_chunks: 7 });
        assert_eq!(g.strides, Strides(vec![56, 1]));
        assert_eq!(g.phys_elems, 46 * 56);
        // One-chunk rows need nothing.
        let g = plan_tile(
            &Shape::new(&[64, 8]).unwrap(),
            DType::F16,
            l(1, Some(0)),
            16,
            &t(),
        );
        assert_eq!(g.swizzle, Swizzle::None);
        // Element-wise access of fp32 columns: 4-byte chunks.
        let g = plan_tile(
            &Shape::new(&[32, 32]).unwrap(),
            DType::F32,
            l(1, Some(0)),
            4,
            &t(),
        );
        assert_eq!(g.swizzle, Swizzle::Xor { b: 5, m: 0, s: 5 });
    }
}
