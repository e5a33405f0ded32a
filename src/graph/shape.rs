//! Shapes (1 to 4 dims, outermost first) and element strides.

use std::fmt;

/// Largest number of dims a tensor may have (Mirage's `MAX_TENSOR_DIMS`).
pub const MAX_DIMS: usize = 4;

/// A tensor shape: 1 to [`MAX_DIMS`] extents, outermost first (row-major logical order).
///
/// A `Shape` may hold any extents, including 0; validation rejects empty tensors.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    dims: [usize; MAX_DIMS],
    rank: u8,
}

impl Shape {
    /// A shape from its extents. Returns `None` unless `1 <= dims.len() <= 4`.
    pub fn new(dims: &[usize]) -> Option<Shape> {
        if dims.is_empty() || dims.len() > MAX_DIMS {
            return None;
        }
        let mut d = [0; MAX_DIMS];
        d[..dims.len()].copy_from_slice(dims);
        Some(Shape {
            dims: d,
            rank: dims.len() as u8,
        })
    }

    /// Number of dims.
    pub fn rank(&self) -> usize {
        self.rank as usize
    }

    /// The extents.
    pub fn dims(&self) -> &[usize] {
        &self.dims[..self.rank()]
    }

    /// Extent of dim `d` (panics if `d >= rank`).
    pub fn dim(&self, d: usize) -> usize {
        self.dims()[d]
    }

    /// Number of elements (saturating).
    pub fn numel(&self) -> usize {
        self.dims()
            .iter()
            .fold(1usize, |acc, &x| acc.saturating_mul(x))
    }

    /// The same shape with dim `d` set to `extent`.
    pub fn with_dim(&self, d: usize, extent: usize) -> Shape {
        let mut s = *self;
        s.dims[d] = extent;
        s
    }

    /// Row-major (C order) element strides of this shape.
    pub fn row_major_strides(&self) -> Strides {
        let mut st = vec![0; self.rank()];
        let mut acc = 1usize;
        for d in (0..self.rank()).rev() {
            st[d] = acc;
            acc = acc.saturating_mul(self.dims[d]);
        }
        Strides(st)
    }

    /// Column-major strides for the last two dims (dims before them row-major outside): the
    /// layout of a transposed matrix or batch of matrices.
    pub fn col_major_strides(&self) -> Strides {
        let r = self.rank();
        if r < 2 {
            return self.row_major_strides();
        }
        let mut st = vec![0; r];
        st[r - 2] = 1;
        st[r - 1] = self.dims[r - 2];
        let mut acc = self.dims[r - 2].saturating_mul(self.dims[r - 1]);
        for d in (0..r - 2).rev() {
            st[d] = acc;
            acc = acc.saturating_mul(self.dims[d]);
        }
        Strides(st)
    }

    /// NumPy-style broadcast of two shapes of equal rank (no rank extension): every dim must be
    /// equal or 1 in one of them.
    pub fn broadcast(&self, other: &Shape) -> Option<Shape> {
        if self.rank != other.rank {
            return None;
        }
        let mut out = *self;
        for d in 0..self.rank() {
            let (a, b) = (self.dims[d], other.dims[d]);
            out.dims[d] = if a == b || b == 1 {
                a
            } else if a == 1 {
                b
            } else {
                return None;
            };
        }
        Some(out)
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[")?;
        for (i, d) in self.dims().iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{d}")?;
        }
        write!(f, "]")
    }
}

/// Element strides, one per dim, outermost first (as in Mirage's `input_strides`).
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Strides(pub Vec<usize>);

impl Strides {
    /// The strides as a slice.
    pub fn as_slice(&self) -> &[usize] {
        &self.0
    }

    /// Number of elements a buffer with these strides must hold for `shape`: one past the
    /// largest offset (0 for an empty shape). `None` on overflow or rank mismatch.
    pub fn span(&self, shape: &Shape) -> Option<usize> {
        if self.0.len() != shape.rank() {
            return None;
        }
        if shape.numel() == 0 {
            return Some(0);
        }
        let mut last = 0usize;
        for (&s, &e) in self.0.iter().zip(shape.dims()) {
            last = last.checked_add(s.checked_mul(e - 1)?)?;
        }
        last.checked_add(1)
    }

    /// The dim with stride 1 and extent > 1, if any (the "innermost" dim).
    pub fn innermost_dim(&self, shape: &Shape) -> Option<usize> {
        (0..shape.rank())
            .rev()
            .find(|&d| self.0[d] == 1 && shape.dim(d) > 1)
    }

    /// Whether distinct coordinates of `shape` map to distinct offsets, by the sufficient rule
    /// used throughout mucc: ordering the dims of extent > 1 by stride, each stride is at least
    /// the previous stride times the previous extent, and the smallest is at least 1. Dims of
    /// extent 1 may have any stride.
    pub fn is_non_overlapping(&self, shape: &Shape) -> bool {
        if self.0.len() != shape.rank() {
            return false;
        }
        let mut dims: Vec<(usize, usize)> = (0..shape.rank())
            .filter(|&d| shape.dim(d) > 1)
            .map(|d| (self.0[d], shape.dim(d)))
            .collect();
        dims.sort_unstable();
        let mut need = 1usize;
        for (stride, extent) in dims {
            if stride < need {
                return false;
            }
            match stride.checked_mul(extent) {
                Some(n) => need = n,
                None => return false,
            }
        }
        true
    }
}

impl fmt::Debug for Strides {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Strides {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{d}")?;
        }
        write!(f, "]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides() {
        let s = Shape::new(&[3, 50, 783]).unwrap();
        assert_eq!(s.row_major_strides().0, vec![39150, 783, 1]);
        assert_eq!(s.col_major_strides().0, vec![39150, 1, 50]);
        assert_eq!(s.row_major_strides().span(&s), Some(3 * 50 * 783));
        assert!(s.row_major_strides().is_non_overlapping(&s));
        assert!(s.col_major_strides().is_non_overlapping(&s));
        assert!(!Strides(vec![783, 783, 1]).is_non_overlapping(&s));
        assert!(Strides(vec![800 * 50, 800, 1]).is_non_overlapping(&s));
        assert_eq!(s.row_major_strides().innermost_dim(&s), Some(2));
        assert_eq!(s.col_major_strides().innermost_dim(&s), Some(1));
        let one = Shape::new(&[1, 8]).unwrap();
        assert!(Strides(vec![0, 1]).is_non_overlapping(&one));
    }

    #[test]
    fn broadcast() {
        let a = Shape::new(&[32, 16, 64]).unwrap();
        let b = Shape::new(&[32, 16, 1]).unwrap();
        assert_eq!(a.broadcast(&b), Some(a));
        assert_eq!(b.broadcast(&a), Some(a));
        let c = Shape::new(&[16, 64]).unwrap();
        assert_eq!(a.broadcast(&c), None);
        let d = Shape::new(&[1, 1, 4096]).unwrap();
        let e = Shape::new(&[1, 4, 1]).unwrap();
        assert_eq!(d.broadcast(&e), Shape::new(&[1, 4, 4096]));
        assert!(Shape::new(&[]).is_none());
        assert!(Shape::new(&[1, 2, 3, 4, 5]).is_none());
    }
}
