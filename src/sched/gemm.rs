//! Kernel-level matmul through cuBLAS: maps C[…, m, n] = A[…, m, k]·B[…, k, n] with any of the
//! layouts the layout pass may choose (each operand row- or column-major in its last two dims,
//! which the solver guarantees) onto `cublasGemmStridedBatchedEx` calls.
//!
//! cuBLAS is column-major. A column-major C is computed as C = op(A)·op(B); a row-major C as
//! Cᵀ = op(Bᵀ)·op(Aᵀ), whose operands are B and A read with the opposite transposition. Batch
//! dims that collapse into one stride for all three tensors become the cuBLAS batch; the others
//! (only possible with user strides) are unrolled into separate calls.

use serde::{Deserialize, Serialize};

use super::plan::Binding;
use crate::graph::dtype::DType;
use crate::graph::shape::{Shape, Strides};

/// cuBLAS's element type of A, B and C (`cudaDataType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CudaDataType {
    /// `CUDA_R_16F`.
    #[serde(rename = "CUDA_R_16F")]
    R16F,
    /// `CUDA_R_16BF`.
    #[serde(rename = "CUDA_R_16BF")]
    R16BF,
    /// `CUDA_R_32F`.
    #[serde(rename = "CUDA_R_32F")]
    R32F,
    /// `CUDA_R_64F`.
    #[serde(rename = "CUDA_R_64F")]
    R64F,
}

/// The element type's name (`f16`, `bf16`, `f32`, `f64`); the C enumerator is spelled by
/// `emit::cxx::cuda_data_type`.
impl std::fmt::Display for CudaDataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CudaDataType::R16F => "f16",
            CudaDataType::R16BF => "bf16",
            CudaDataType::R32F => "f32",
            CudaDataType::R64F => "f64",
        })
    }
}

/// cuBLAS's accumulation type (`cublasComputeType_t`); alpha and beta have its scalar type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CublasCompute {
    /// `CUBLAS_COMPUTE_32F` (float scalars).
    #[serde(rename = "CUBLAS_COMPUTE_32F")]
    F32,
    /// `CUBLAS_COMPUTE_64F` (double scalars).
    #[serde(rename = "CUBLAS_COMPUTE_64F")]
    F64,
}

/// The accumulation type's name (`f32`, `f64`); the C enumerator is spelled by
/// `emit::cxx::cublas_compute`.
impl std::fmt::Display for CublasCompute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CublasCompute::F32 => "f32",
            CublasCompute::F64 => "f64",
        })
    }
}

/// One `cublasGemmStridedBatchedEx` call (column-major, as cuBLAS sees it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GemmCall {
    /// `A` is transposed.
    pub trans_a: bool,
    /// `B` is transposed.
    pub trans_b: bool,
    /// Rows of op(A) and of C.
    pub m: i32,
    /// Columns of op(B) and of C.
    pub n: i32,
    /// Inner dimension.
    pub k: i32,
    /// cuBLAS's A operand.
    pub a: Binding,
    /// Leading dimension of A.
    pub lda: i32,
    /// Batch stride of A (elements).
    pub stride_a: i64,
    /// cuBLAS's B operand.
    pub b: Binding,
    /// Leading dimension of B.
    pub ldb: i32,
    /// Batch stride of B.
    pub stride_b: i64,
    /// The result.
    pub c: Binding,
    /// Leading dimension of C.
    pub ldc: i32,
    /// Batch stride of C.
    pub stride_c: i64,
    /// Batch count.
    pub batch: i32,
    /// Element type of A, B and C.
    pub data_type: CudaDataType,
    /// Accumulation type.
    pub compute_type: CublasCompute,
}

/// One operand as stored.
#[derive(Clone, Debug)]
pub struct Operand<'a> {
    /// Logical shape.
    pub shape: &'a Shape,
    /// Element strides.
    pub strides: &'a Strides,
    /// Where it is.
    pub at: Binding,
}

/// Why a matmul cannot go to cuBLAS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GemmError {
    /// An operand or the product has no unit stride in its last two dims.
    NoUnitStride {
        /// `A`, `B` or `C`.
        operand: &'static str,
        /// Its shape.
        shape: Shape,
        /// Its strides.
        strides: Strides,
    },
    /// An element type cuBLAS does not multiply.
    DType(DType),
    /// A size beyond cuBLAS's 32-bit arguments.
    TooLarge {
        /// What it is (`m`, `lda`, …).
        what: &'static str,
        /// Its value.
        value: usize,
    },
}

impl std::fmt::Display for GemmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GemmError::NoUnitStride {
                operand,
                shape,
                strides,
            } => write!(
                f,
                "{operand} {shape} with strides {strides} has no unit stride in its last two dims"
            ),
            GemmError::DType(d) => write!(
                f,
                "kernel-level matmul of {d} is not supported (cuBLAS covers f16, bf16, f32, f64)"
            ),
            GemmError::TooLarge { what, value } => {
                write!(f, "{what} {value} exceeds cuBLAS's 32-bit limit")
            }
        }
    }
}

/// How a matrix (the last two dims) is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Major {
    Row { ld: usize },
    Col { ld: usize },
}

fn major(s: &Shape, st: &Strides, what: &'static str) -> Result<Major, GemmError> {
    let r = s.rank();
    let (rows, cols) = (s.dim(r - 2), s.dim(r - 1));
    let (sr, sc) = (st.0[r - 2], st.0[r - 1]);
    // A dim of extent 1 may carry any stride: it never constrains the storage order.
    Ok(if sc == 1 {
        Major::Row {
            ld: if rows == 1 { cols } else { sr.max(cols) },
        }
    } else if sr == 1 {
        Major::Col {
            ld: if cols == 1 { rows } else { sc.max(rows) },
        }
    } else if cols == 1 {
        Major::Row { ld: sr.max(1) }
    } else if rows == 1 {
        Major::Col { ld: sc.max(1) }
    } else {
        return Err(GemmError::NoUnitStride {
            operand: what,
            shape: *s,
            strides: st.clone(),
        });
    })
}

/// cuBLAS's element and compute types for products of `d` (f16, bf16, f32, f64).
pub fn cublas_types(d: DType) -> Result<(CudaDataType, CublasCompute), GemmError> {
    Ok(match d {
        DType::F16 => (CudaDataType::R16F, CublasCompute::F32),
        DType::BF16 => (CudaDataType::R16BF, CublasCompute::F32),
        DType::F32 => (CudaDataType::R32F, CublasCompute::F32),
        DType::F64 => (CudaDataType::R64F, CublasCompute::F64),
        other => {
            return Err(GemmError::DType(other));
        }
    })
}

fn int(x: usize, what: &'static str) -> Result<i32, GemmError> {
    i32::try_from(x).map_err(|_| GemmError::TooLarge { what, value: x })
}

/// The calls computing C = A·B, and whether cuBLAS's A operand is the logical B (true when C is
/// row-major and the product is computed transposed).
pub fn gemm_calls(
    a: &Operand,
    b: &Operand,
    c: &Operand,
    dtype: DType,
) -> Result<(Vec<GemmCall>, bool), GemmError> {
    let (data_type, compute_type) = cublas_types(dtype)?;
    let r = c.shape.rank();
    let (m, k, n) = (a.shape.dim(r - 2), a.shape.dim(r - 1), b.shape.dim(r - 1));
    let (ma, mb, mc) = (
        major(a.shape, a.strides, "A")?,
        major(b.shape, b.strides, "B")?,
        major(c.shape, c.strides, "C")?,
    );
    // cuBLAS operands in column-major terms.
    let (trans_a, lda, trans_b, ldb, cm, cn, first, second, ldc);
    match mc {
        Major::Col { ld } => {
            // C = op(A)·op(B).
            (cm, cn, ldc) = (m, n, ld);
            first = a.at;
            second = b.at;
            (trans_a, lda) = match ma {
                Major::Col { ld } => (false, ld),
                Major::Row { ld } => (true, ld),
            };
            (trans_b, ldb) = match mb {
                Major::Col { ld } => (false, ld),
                Major::Row { ld } => (true, ld),
            };
        }
        Major::Row { ld } => {
            // Cᵀ = op(Bᵀ)·op(Aᵀ): a row-major X is a column-major Xᵀ.
            (cm, cn, ldc) = (n, m, ld);
            first = b.at;
            second = a.at;
            (trans_a, lda) = match mb {
                Major::Row { ld } => (false, ld),
                Major::Col { ld } => (true, ld),
            };
            (trans_b, ldb) = match ma {
                Major::Row { ld } => (false, ld),
                Major::Col { ld } => (true, ld),
            };
        }
    }
    let (sa, sb) = if matches!(mc, Major::Col { .. }) {
        (a.strides, b.strides)
    } else {
        (b.strides, a.strides)
    };
    // Batch dims: the longest suffix that collapses into one stride for all three tensors.
    let batch_dims: Vec<usize> = (0..r - 2).collect();
    let collapses = |st: &Strides, from: usize| {
        (from..r - 2).all(|d| {
            d + 1 >= r - 2
                || c.shape.dim(d) == 1
                || c.shape.dim(d + 1) == 1
                || st.0[d] == st.0[d + 1] * c.shape.dim(d + 1)
        })
    };
    let split = batch_dims
        .iter()
        .copied()
        .find(|&d| collapses(a.strides, d) && collapses(b.strides, d) && collapses(c.strides, d))
        .unwrap_or(r - 2);
    let inner_batch: usize = (split..r - 2).map(|d| c.shape.dim(d)).product();
    let batch_stride = |st: &Strides| -> i64 {
        (split..r - 2)
            .filter(|&d| c.shape.dim(d) > 1)
            .map(|d| st.0[d])
            .min()
            .unwrap_or(0) as i64
    };
    let outer: Vec<usize> = (0..split).map(|d| c.shape.dim(d)).collect();
    let outer_count: usize = outer.iter().product();
    let mut calls = Vec::with_capacity(outer_count);
    for o in 0..outer_count {
        // Coordinates of the outer batch dims.
        let mut rem = o;
        let mut coord = vec![0; split];
        for d in (0..split).rev() {
            coord[d] = rem % outer[d];
            rem /= outer[d];
        }
        let off = |st: &Strides| {
            coord
                .iter()
                .enumerate()
                .map(|(d, &x)| x * st.0[d])
                .sum::<usize>()
        };
        calls.push(GemmCall {
            trans_a,
            trans_b,
            m: int(cm, "m")?,
            n: int(cn, "n")?,
            k: int(k, "k")?,
            a: first.offset_by(off(sa)),
            lda: int(lda, "lda")?,
            stride_a: batch_stride(sa),
            b: second.offset_by(off(sb)),
            ldb: int(ldb, "ldb")?,
            stride_b: batch_stride(sb),
            c: c.at.offset_by(off(c.strides)),
            ldc: int(ldc, "ldc")?,
            stride_c: batch_stride(c.strides),
            batch: int(inner_batch, "batch")?,
            data_type,
            compute_type,
        });
    }
    Ok((calls, matches!(mc, Major::Row { .. })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ws(off: usize) -> Binding {
        Binding::Workspace {
            byte_offset: off,
            elem_offset: 0,
            elem_bytes: 2,
        }
    }

    /// An operand of `shape` and `strides` at workspace byte `off`.
    fn op<'a>(shape: &'a Shape, strides: &'a Strides, off: usize) -> Operand<'a> {
        Operand {
            shape,
            strides,
            at: ws(off),
        }
    }

    /// `gemm_calls` of A, B, C given as (shape, strides, workspace byte offset).
    fn gemm_of(
        a: (&Shape, &Strides, usize),
        b: (&Shape, &Strides, usize),
        c: (&Shape, &Strides, usize),
        dtype: DType,
    ) -> Result<(Vec<GemmCall>, bool), GemmError> {
        gemm_calls(
            &op(a.0, a.1, a.2),
            &op(b.0, b.1, b.2),
            &op(c.0, c.1, c.2),
            dtype,
        )
    }

    #[test]
    fn row_major_product_is_a_transposed_column_major_one() {
        let (sa, sb, sc) = (
            Shape::new(&[8, 64]).unwrap(),
            Shape::new(&[64, 32]).unwrap(),
            Shape::new(&[8, 32]).unwrap(),
        );
        let (ta, tb, tc) = (
            sa.row_major_strides(),
            sb.row_major_strides(),
            sc.row_major_strides(),
        );
        let calls = gemm_of(
            (&sa, &ta, 0),
            (&sb, &tb, 1024),
            (&sc, &tc, 8192),
            DType::F16,
        )
        .unwrap()
        .0;
        assert_eq!(calls.len(), 1);
        let g = &calls[0];
        // Cᵀ (32×8) = Bᵀ (32×64) · Aᵀ (64×8), all read without transposition.
        assert_eq!(
            (g.m, g.n, g.k, g.trans_a, g.trans_b),
            (32, 8, 64, false, false)
        );
        assert_eq!((g.lda, g.ldb, g.ldc), (32, 64, 32));
        assert_eq!((g.a, g.b), (ws(1024), ws(0)));
        assert_eq!(g.compute_type, CublasCompute::F32);
    }

    #[test]
    fn batched_and_column_major_operands() {
        // Q [32, 16, 64] row-major · K [32, 64, 4096] column-major in its last two dims.
        let (sa, sb, sc) = (
            Shape::new(&[32, 16, 64]).unwrap(),
            Shape::new(&[32, 64, 4096]).unwrap(),
            Shape::new(&[32, 16, 4096]).unwrap(),
        );
        let ta = sa.row_major_strides();
        let tb = sb.col_major_strides();
        let tc = sc.row_major_strides();
        let calls = gemm_of((&sa, &ta, 0), (&sb, &tb, 0), (&sc, &tc, 0), DType::BF16)
            .unwrap()
            .0;
        let g = &calls[0];
        assert_eq!(g.batch, 32);
        assert_eq!((g.m, g.n, g.k), (4096, 16, 64));
        // Bᵀ of a column-major B is row-major: cuBLAS reads it transposed.
        assert_eq!((g.trans_a, g.lda), (true, 64));
        assert_eq!((g.trans_b, g.ldb), (false, 64));
        assert_eq!(
            (g.stride_a, g.stride_b, g.stride_c),
            (64 * 4096, 16 * 64, 16 * 4096)
        );
        assert_eq!(g.data_type, CudaDataType::R16BF);
    }

    #[test]
    fn uncollapsible_batches_are_unrolled_and_ints_refused() {
        let (sa, sb, sc) = (
            Shape::new(&[2, 3, 4, 5]).unwrap(),
            Shape::new(&[2, 3, 5, 6]).unwrap(),
            Shape::new(&[2, 3, 4, 6]).unwrap(),
        );
        // A's batch dims are swapped in memory: dim 0 inner to dim 1.
        let ta = Strides(vec![20, 40, 5, 1]);
        let (tb, tc) = (sb.row_major_strides(), sc.row_major_strides());
        let calls = gemm_of((&sa, &ta, 0), (&sb, &tb, 0), (&sc, &tc, 0), DType::F32)
            .unwrap()
            .0;
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1].batch, 3);
        assert_eq!(calls[1].c, ws(0).offset_by(72));
        let e = gemm_of((&sa, &ta, 0), (&sb, &tb, 0), (&sc, &tc, 0), DType::I32).unwrap_err();
        assert_eq!(e, GemmError::DType(DType::I32));
        assert!(e.to_string().contains("not supported"));
    }
}
