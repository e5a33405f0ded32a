//! Dense row-major f64 arrays and the tensor operations the interpreter needs. Every operation
//! works on any rank from 1 to 4 by viewing shapes as 4-dim with leading 1s.

use rayon::prelude::*;

use crate::graph::ops::BinaryOp;
use crate::graph::shape::{MAX_DIMS, Shape};

/// Work (elements or multiply-adds) above which an operation is split across threads.
const PARALLEL_WORK: usize = 1 << 20;

/// One row of a matmul's result: `c` (n values) += Σₚ `arow`[p] · row p of `bmat` (k × n), the
/// products added in the order of p. With AVX2 where the CPU has it: the same multiplications
/// and additions, each rounded as before (no fused multiply-add), four lanes at a time.
fn matmul_row(arow: &[f64], bmat: &[f64], c: &mut [f64]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { matmul_row_avx2(arow, bmat, c) };
    }
    matmul_row_plain(arow, bmat, c);
}

#[inline(always)]
fn matmul_row_plain(arow: &[f64], bmat: &[f64], c: &mut [f64]) {
    let n = c.len();
    for (p, &x) in arow.iter().enumerate() {
        for (cv, &bv) in c.iter_mut().zip(&bmat[p * n..(p + 1) * n]) {
            *cv += x * bv;
        }
    }
}

/// [`matmul_row_plain`] compiled for AVX2.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn matmul_row_avx2(arow: &[f64], bmat: &[f64], c: &mut [f64]) {
    matmul_row_plain(arow, bmat, c);
}

/// The largest |x| over the finite values of `data`, and `init` (which it returns when there
/// are none). Four running maxima, so that the loop does not wait on one comparison after
/// another: the maximum of a set is the same in any order.
pub fn finite_max_abs(data: &[f64], init: f64) -> f64 {
    let mut m = [init; 4];
    let chunks = data.chunks_exact(4);
    let rest = chunks.remainder();
    for c in chunks {
        for (mi, &x) in m.iter_mut().zip(c) {
            if x.is_finite() {
                *mi = mi.max(x.abs());
            }
        }
    }
    for &x in rest {
        if x.is_finite() {
            m[0] = m[0].max(x.abs());
        }
    }
    m[0].max(m[1]).max(m[2].max(m[3]))
}

/// A dense, row-major array of f64 values.
#[derive(Clone, Debug, PartialEq)]
pub struct Array {
    /// Logical shape.
    pub shape: Shape,
    /// `shape.numel()` values in row-major order.
    pub data: Vec<f64>,
}

/// A shape padded to 4 dims with leading 1s, and its row-major strides.
#[derive(Clone, Copy)]
struct Dims4 {
    ext: [usize; MAX_DIMS],
    stride: [usize; MAX_DIMS],
    /// Number of padding dims in front.
    pad: usize,
}

fn dims4(s: &Shape) -> Dims4 {
    let pad = MAX_DIMS - s.rank();
    let mut ext = [1; MAX_DIMS];
    ext[pad..].copy_from_slice(s.dims());
    let mut stride = [0; MAX_DIMS];
    let mut acc = 1;
    for d in (0..MAX_DIMS).rev() {
        stride[d] = acc;
        acc *= ext[d];
    }
    Dims4 { ext, stride, pad }
}

impl Array {
    /// An array of `shape` filled with `value`.
    pub fn full(shape: Shape, value: f64) -> Array {
        Array {
            shape,
            data: vec![value; shape.numel()],
        }
    }

    /// An array from row-major values (`data.len()` must equal `shape.numel()`).
    pub fn from_vec(shape: Shape, data: Vec<f64>) -> Array {
        debug_assert_eq!(data.len(), shape.numel());
        Array { shape, data }
    }

    /// Applies `f` to every element (across threads for large arrays).
    pub fn map(&self, f: impl Fn(f64) -> f64 + Sync) -> Array {
        let data = if self.data.len() >= PARALLEL_WORK {
            self.data.par_iter().map(|&x| f(x)).collect()
        } else {
            self.data.iter().map(|&x| f(x)).collect()
        };
        Array {
            shape: self.shape,
            data,
        }
    }

    /// Element-wise `op` with broadcasting to `out` (both shapes must broadcast to it).
    pub fn binary(a: &Array, b: &Array, op: BinaryOp, out: Shape) -> Array {
        if a.shape == out && b.shape == out {
            let data = a
                .data
                .iter()
                .zip(&b.data)
                .map(|(&x, &y)| op.apply(x, y))
                .collect();
            return Array { shape: out, data };
        }
        let o = dims4(&out);
        let (da, db) = (dims4(&a.shape), dims4(&b.shape));
        let bstride = |d: &Dims4| -> [usize; MAX_DIMS] {
            let mut s = d.stride;
            for i in 0..MAX_DIMS {
                if d.ext[i] == 1 {
                    s[i] = 0;
                }
            }
            s
        };
        let (sa, sb) = (bstride(&da), bstride(&db));
        let mut data = Vec::with_capacity(out.numel());
        for i0 in 0..o.ext[0] {
            for i1 in 0..o.ext[1] {
                for i2 in 0..o.ext[2] {
                    let ba = i0 * sa[0] + i1 * sa[1] + i2 * sa[2];
                    let bb = i0 * sb[0] + i1 * sb[1] + i2 * sb[2];
                    for i3 in 0..o.ext[3] {
                        data.push(op.apply(a.data[ba + i3 * sa[3]], b.data[bb + i3 * sb[3]]));
                    }
                }
            }
        }
        Array { shape: out, data }
    }

    /// In place: `self = self * r + x` where `r` broadcasts to `self` (rescaled accumulation).
    pub fn rescale_add(&mut self, r: &Array, x: &Array) {
        let scaled = Array::binary(self, r, BinaryOp::Mul, self.shape);
        for ((s, p), q) in self.data.iter_mut().zip(&scaled.data).zip(&x.data) {
            *s = p + q;
        }
    }

    /// In place: `self += x` (equal shapes).
    pub fn add_assign(&mut self, x: &Array) {
        for (s, v) in self.data.iter_mut().zip(&x.data) {
            *s += v;
        }
    }

    /// Splits the array around `dim` into (outer, extent, inner) sizes.
    fn around(&self, dim: usize) -> (usize, usize, usize) {
        let d = self.shape.dims();
        let outer: usize = d[..dim].iter().product();
        let inner: usize = d[dim + 1..].iter().product();
        (outer, d[dim], inner)
    }

    /// Grouped sum over `dim` down to extent `to` (which divides the extent), with the strided
    /// grouping of Mirage's redtox: out[…, j, …] = Σₖ X[…, k·to + j, …]. `to = 1` is a plain sum.
    pub fn sum_to(&self, dim: usize, to: usize) -> Array {
        let (outer, ext, inner) = self.around(dim);
        let mut data = vec![0.0; outer * to * inner];
        for o in 0..outer {
            for e in 0..ext {
                let j = e % to;
                let src = &self.data[(o * ext + e) * inner..][..inner];
                let dst = &mut data[(o * to + j) * inner..][..inner];
                for (d, s) in dst.iter_mut().zip(src) {
                    *d += s;
                }
            }
        }
        Array {
            shape: self.shape.with_dim(dim, to),
            data,
        }
    }

    /// Maximum over each of `groups` contiguous groups of equal length along `dim` (which
    /// becomes `groups`; 1: the maximum over the dim): out[…, j, …] = maxₖ X[…, j·len + k, …].
    pub fn max_over(&self, dim: usize, groups: usize) -> Array {
        let (outer, ext, inner) = self.around(dim);
        let len = ext / groups;
        let mut data = vec![f64::NEG_INFINITY; outer * groups * inner];
        for o in 0..outer {
            for e in 0..ext {
                let src = &self.data[(o * ext + e) * inner..][..inner];
                let dst = &mut data[(o * groups + e / len) * inner..][..inner];
                for (d, &s) in dst.iter_mut().zip(src) {
                    // NaN propagates, as in IEEE max-with-NaN-awareness of a reference.
                    if s > *d || s.is_nan() {
                        *d = s;
                    }
                }
            }
        }
        Array {
            shape: self.shape.with_dim(dim, groups),
            data,
        }
    }

    /// Batched matrix product over the last two dims; leading dims must be equal. Large
    /// products are split over output rows across threads.
    pub fn matmul(a: &Array, b: &Array) -> Array {
        let r = a.shape.rank();
        let (m, k, n) = (a.shape.dim(r - 2), a.shape.dim(r - 1), b.shape.dim(r - 1));
        let batch: usize = a.shape.dims()[..r - 2].iter().product();
        let mut data = vec![0.0; batch * m * n];
        let row = |idx: usize, c: &mut [f64]| {
            let (bt, i) = (idx / m, idx % m);
            let arow = &a.data[bt * m * k + i * k..][..k];
            let bmat = &b.data[bt * k * n..][..k * n];
            matmul_row(arow, bmat, c);
        };
        if n > 0 && batch * m * n * k >= PARALLEL_WORK {
            data.par_chunks_mut(n)
                .enumerate()
                .for_each(|(idx, c)| row(idx, c));
        } else if n > 0 {
            data.chunks_mut(n)
                .enumerate()
                .for_each(|(idx, c)| row(idx, c));
        }
        Array {
            shape: a.shape.with_dim(r - 1, n),
            data,
        }
    }

    /// x / sqrt(mean(x²)) over the trailing `nd` dims (no ε).
    pub fn rms_norm(&self, nd: usize) -> Array {
        let r = self.shape.rank();
        let group: usize = self.shape.dims()[r - nd..].iter().product();
        let mut data = self.data.clone();
        for chunk in data.chunks_mut(group) {
            let ms = chunk.iter().map(|x| x * x).sum::<f64>() / group as f64;
            let rms = ms.sqrt();
            for x in chunk.iter_mut() {
                *x /= rms;
            }
        }
        Array {
            shape: self.shape,
            data,
        }
    }

    /// The combination of split-attention partials ([`KnOpKind::SoftmaxCombine`]): `self` is
    /// O `[…, rows, splits·d]`, `l` and `m` are `[…, rows, splits]`; per row, with M the max of
    /// its m and wₛ = exp(mₛ − M), the result `[…, rows, d]` is Σₛ wₛ·Oₛ / Σₛ wₛ·lₛ.
    ///
    /// [`KnOpKind::SoftmaxCombine`]: crate::graph::kernel::KnOpKind::SoftmaxCombine
    pub fn softmax_combine(&self, l: &Array, m: &Array, splits: usize, out: Shape) -> Array {
        let d = out.dim(out.rank() - 1);
        let rows = out.numel() / d.max(1);
        let mut data = vec![0.0; out.numel()];
        for r in 0..rows {
            let ms = &m.data[r * splits..(r + 1) * splits];
            let ls = &l.data[r * splits..(r + 1) * splits];
            let top = ms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let mut den = 0.0;
            let y = &mut data[r * d..(r + 1) * d];
            for s in 0..splits {
                let w = (ms[s] - top).exp();
                den += w * ls[s];
                let o = &self.data[(r * splits + s) * d..(r * splits + s + 1) * d];
                for (acc, x) in y.iter_mut().zip(o) {
                    *acc += w * x;
                }
            }
            for v in y.iter_mut() {
                *v /= den;
            }
        }
        Array { shape: out, data }
    }

    /// The sub-array of `shape` starting at `origin` (all within bounds).
    pub fn slice(&self, origin: &[usize], shape: Shape) -> Array {
        let src = dims4(&self.shape);
        let dst = dims4(&shape);
        let mut o = [0; MAX_DIMS];
        o[src.pad..].copy_from_slice(origin);
        let mut data = Vec::with_capacity(shape.numel());
        for i0 in 0..dst.ext[0] {
            for i1 in 0..dst.ext[1] {
                for i2 in 0..dst.ext[2] {
                    let base = (o[0] + i0) * src.stride[0]
                        + (o[1] + i1) * src.stride[1]
                        + (o[2] + i2) * src.stride[2]
                        + o[3];
                    data.extend_from_slice(&self.data[base..base + dst.ext[3]]);
                }
            }
        }
        Array { shape, data }
    }

    /// Writes `src` into this array at `origin` (all within bounds).
    pub fn write_slice(&mut self, origin: &[usize], src: &Array) {
        let dst = dims4(&self.shape);
        let s = dims4(&src.shape);
        let mut o = [0; MAX_DIMS];
        o[dst.pad..].copy_from_slice(origin);
        let mut k = 0;
        for i0 in 0..s.ext[0] {
            for i1 in 0..s.ext[1] {
                for i2 in 0..s.ext[2] {
                    let base = (o[0] + i0) * dst.stride[0]
                        + (o[1] + i1) * dst.stride[1]
                        + (o[2] + i2) * dst.stride[2]
                        + o[3];
                    self.data[base..base + s.ext[3]].copy_from_slice(&src.data[k..k + s.ext[3]]);
                    k += s.ext[3];
                }
            }
        }
    }

    /// Concatenation along `dim` (other dims equal).
    pub fn concat(parts: &[&Array], dim: usize, out: Shape) -> Array {
        let mut result = Array::full(out, 0.0);
        let mut offset = 0;
        for p in parts {
            let mut origin = vec![0; out.rank()];
            origin[dim] = offset;
            result.write_slice(&origin, p);
            offset += p.shape.dim(dim);
        }
        result
    }

    /// Euclidean norm.
    pub fn norm2(&self) -> f64 {
        self.data.iter().map(|x| x * x).sum::<f64>().sqrt()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arr(d: &[usize], v: &[f64]) -> Array {
        Array::from_vec(Shape::new(d).unwrap(), v.to_vec())
    }

    #[test]
    fn strided_grouping() {
        // 2 blocks × 3 features side by side: [a0 a1 a2 b0 b1 b2] → [a0+b0, a1+b1, a2+b2].
        let x = arr(&[1, 6], &[1., 2., 3., 10., 20., 30.]);
        assert_eq!(x.sum_to(1, 3).data, vec![11., 22., 33.]);
        assert_eq!(x.sum_to(1, 1).data, vec![66.]);
        let y = arr(&[2, 2], &[1., 2., 3., 4.]);
        assert_eq!(y.sum_to(0, 1).data, vec![4., 6.]);
        assert_eq!(y.max_over(1, 1).data, vec![2., 4.]);
        // Contiguous groups, unlike the sums' strided ones: [1 2 3 | 10 20 30] → [3, 30].
        assert_eq!(x.max_over(1, 2).data, vec![3., 30.]);
        assert_eq!(x.max_over(1, 2).shape.dims(), &[1, 2]);
    }

    #[test]
    fn matmul_and_broadcast() {
        let a = arr(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
        let b = arr(&[3, 1], &[1., 1., 1.]);
        assert_eq!(Array::matmul(&a, &b).data, vec![6., 15.]);
        let r = arr(&[2, 1], &[2., 3.]);
        let q = Array::binary(&a, &r, BinaryOp::Div, a.shape);
        assert_eq!(q.data, vec![0.5, 1., 1.5, 4. / 3., 5. / 3., 2.]);
        let row = arr(&[1, 3], &[1., 0., -1.]);
        let col = arr(&[2, 1], &[1., 2.]);
        let outer = Array::binary(&row, &col, BinaryOp::Mul, Shape::new(&[2, 3]).unwrap());
        assert_eq!(outer.data, vec![1., 0., -1., 2., 0., -2.]);
    }

    #[test]
    fn matmul_rows_round_as_the_plain_loop() {
        // Values whose products and sums round: every element must add its products in the
        // order of p, in every lane.
        let (m, k, n) = (3, 37, 29);
        let val = |i: usize| ((i * 7919 % 1009) as f64 - 504.5) / 97.3;
        let a: Vec<f64> = (0..m * k).map(val).collect();
        let b: Vec<f64> = (0..k * n).map(|i| val(i + 11)).collect();
        let mut want = vec![0.0; m * n];
        for i in 0..m {
            for p in 0..k {
                for j in 0..n {
                    want[i * n + j] += a[i * k + p] * b[p * n + j];
                }
            }
        }
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let got = Array::matmul(&arr(&[m, k], &a), &arr(&[k, n], &b));
        assert_eq!(bits(&got.data), bits(&want));
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            let mut wide = vec![0.0; n];
            // SAFETY: checked just above.
            unsafe { matmul_row_avx2(&a[..k], &b, &mut wide) };
            assert_eq!(bits(&wide), bits(&want[..n]));
        }
    }

    #[test]
    fn finite_max_abs_skips_what_is_not_finite() {
        let v = [
            1.0,
            -7.5,
            f64::NAN,
            f64::INFINITY,
            3.0,
            f64::NEG_INFINITY,
            -2.0,
        ];
        assert_eq!(finite_max_abs(&v, 0.0), 7.5);
        assert_eq!(finite_max_abs(&v, 9.0), 9.0);
        assert_eq!(finite_max_abs(&[f64::NAN, f64::INFINITY], 0.5), 0.5);
        assert_eq!(finite_max_abs(&[], 0.0), 0.0);
        let long: Vec<f64> = (0..37).map(|i| (i as f64 - 20.0) * 0.75).collect();
        assert_eq!(finite_max_abs(&long, 0.0), 15.0);
    }

    #[test]
    fn slices() {
        let a = arr(&[2, 3, 4], &(0..24).map(f64::from).collect::<Vec<_>>());
        let s = a.slice(&[1, 1, 2], Shape::new(&[1, 2, 2]).unwrap());
        assert_eq!(s.data, vec![18., 19., 22., 23.]);
        let mut z = Array::full(a.shape, 0.0);
        z.write_slice(&[1, 1, 2], &s);
        assert_eq!(z.slice(&[1, 1, 2], s.shape), s);
        let c = Array::concat(
            &[&arr(&[1, 2], &[1., 2.]), &arr(&[1, 1], &[3.])],
            1,
            Shape::new(&[1, 3]).unwrap(),
        );
        assert_eq!(c.data, vec![1., 2., 3.]);
        let n = arr(&[1, 2], &[3., 4.]).rms_norm(1);
        let rms = (12.5f64).sqrt();
        assert_eq!(n.data, vec![3. / rms, 4. / rms]);
    }
}
