//! Host-side data for GPU runs: f64 values to and from a dtype's bytes, logical arrays from
//! strided caller buffers, and the comparison of a GPU output with the reference.

use crate::graph::DType;
use crate::graph::interp::Array;
pub use crate::graph::interp::gather;

/// `values` in `dt`'s little-endian representation (rounded to nearest even for floats,
/// rounded and saturated for integers, NaN to 0 for integers).
pub fn encode(dt: DType, values: &[f64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * dt.bytes());
    for &x in values {
        let r = dt.round(x);
        match dt {
            DType::F16 => out.extend(half::f16::from_f64(x).to_le_bytes()),
            DType::BF16 => out.extend(half::bf16::from_f64(x).to_le_bytes()),
            DType::F32 => out.extend((x as f32).to_le_bytes()),
            DType::F64 => out.extend(x.to_le_bytes()),
            DType::I8 => out.extend((r as i8).to_le_bytes()),
            DType::U8 => out.extend((r as u8).to_le_bytes()),
            DType::I16 => out.extend((r as i16).to_le_bytes()),
            DType::U16 => out.extend((r as u16).to_le_bytes()),
            DType::I32 => out.extend((r as i32).to_le_bytes()),
            DType::U32 => out.extend((r as u32).to_le_bytes()),
            DType::I64 => out.extend((r as i64).to_le_bytes()),
            DType::U64 => out.extend((r as u64).to_le_bytes()),
            _ => unreachable!("unsupported dtypes are rejected by validation"),
        }
    }
    out
}

/// The values of a buffer of `dt` elements.
pub fn decode(dt: DType, bytes: &[u8]) -> Vec<f64> {
    let n = dt.bytes();
    bytes
        .chunks_exact(n)
        .map(|c| match dt {
            DType::F16 => half::f16::from_le_bytes([c[0], c[1]]).to_f64(),
            DType::BF16 => half::bf16::from_le_bytes([c[0], c[1]]).to_f64(),
            DType::F32 => f64::from(f32::from_le_bytes(c.try_into().expect("4 bytes"))),
            DType::F64 => f64::from_le_bytes(c.try_into().expect("8 bytes")),
            DType::I8 => f64::from(c[0] as i8),
            DType::U8 => f64::from(c[0]),
            DType::I16 => f64::from(i16::from_le_bytes([c[0], c[1]])),
            DType::U16 => f64::from(u16::from_le_bytes([c[0], c[1]])),
            DType::I32 => f64::from(i32::from_le_bytes(c.try_into().expect("4 bytes"))),
            DType::U32 => f64::from(u32::from_le_bytes(c.try_into().expect("4 bytes"))),
            DType::I64 => i64::from_le_bytes(c.try_into().expect("8 bytes")) as f64,
            DType::U64 => u64::from_le_bytes(c.try_into().expect("8 bytes")) as f64,
            _ => unreachable!("unsupported dtypes are rejected by validation"),
        })
        .collect()
}

/// The largest relative L2 error ‖out − ref‖ / ‖ref‖ accepted for an output of `dt`.
///
/// 16-bit floats round every stored intermediate and the inputs of every matmul, so their
/// bounds are loose: f16 5e-3 (about 10 ulps of accumulated rounding), bf16 3e-2 (8 bits of
/// mantissa). fp32 and fp64 are checked near their precision; integers must be exact.
pub fn bound(dt: DType) -> f64 {
    match dt {
        DType::F16 => 5e-3,
        DType::BF16 => 3e-2,
        DType::F32 => 1e-5,
        DType::F64 => 1e-12,
        _ => 0.0,
    }
}

/// How a GPU output compares with the reference.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// ‖out − ref‖₂ / ‖ref‖₂ (‖out − ref‖₂ when the reference is all zeros).
    pub rel_l2: f64,
    /// max |out − ref|.
    pub max_abs: f64,
    /// Elements that are NaN or infinite (the outputs are poisoned with NaN before the run, so
    /// this also counts elements never written).
    pub non_finite: usize,
    /// The bound applied.
    pub bound: f64,
}

impl Comparison {
    /// Whether the output passes: every element finite and the error within the bound.
    pub fn passed(&self) -> bool {
        self.non_finite == 0 && self.rel_l2 <= self.bound
    }
}

/// Compares `out` with `reference` (same shape) under `dt`'s bound.
pub fn compare(dt: DType, out: &Array, reference: &Array) -> Comparison {
    let (mut diff2, mut ref2, mut max_abs, mut non_finite) = (0.0f64, 0.0f64, 0.0f64, 0usize);
    for (&o, &r) in out.data.iter().zip(&reference.data) {
        if !o.is_finite() {
            non_finite += 1;
            continue;
        }
        let d = o - r;
        diff2 += d * d;
        ref2 += r * r;
        max_abs = max_abs.max(d.abs());
    }
    let rel_l2 = if ref2 > 0.0 {
        (diff2 / ref2).sqrt()
    } else {
        diff2.sqrt()
    };
    Comparison {
        rel_l2,
        max_abs,
        non_finite,
        bound: bound(dt),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::shape::{Shape, Strides};

    #[test]
    fn encode_decode_round_trip_every_supported_dtype() {
        let xs: [f64; 5] = [0.0, 1.0, -2.0, 3.5, 100.0];
        for dt in DType::ALL.into_iter().filter(|d| d.is_supported()) {
            let vals: Vec<f64> = xs
                .iter()
                .map(|&x| if dt.is_unsigned() { x.abs() } else { x })
                .collect();
            let bytes = encode(dt, &vals);
            assert_eq!(bytes.len(), vals.len() * dt.bytes(), "{dt:?}");
            let back = decode(dt, &bytes);
            let want: Vec<f64> = vals.iter().map(|&x| dt.round(x)).collect();
            assert_eq!(back, want, "{dt:?}");
        }
        // NaN poison reads back as NaN for floats.
        assert!(decode(DType::F16, &[0xff, 0xff])[0].is_nan());
        assert!(decode(DType::BF16, &[0xff, 0xff])[0].is_nan());
    }

    #[test]
    fn gather_follows_strides() {
        // A 2×3 column-major buffer.
        let shape = Shape::new(&[2, 3]).unwrap();
        let a = gather(shape, &Strides(vec![1, 2]), &[0., 1., 2., 3., 4., 5.]);
        assert_eq!(a.data, vec![0., 2., 4., 1., 3., 5.]);
    }

    #[test]
    fn comparison_counts_poison_and_measures_error() {
        let shape = Shape::new(&[4]).unwrap();
        let r = Array::from_vec(shape, vec![1., 2., 3., 4.]);
        let same = compare(DType::F16, &r, &r);
        assert!(same.passed());
        assert_eq!(same.rel_l2, 0.0);
        let off = Array::from_vec(shape, vec![1., 2., 3., 4.1]);
        let c = compare(DType::F16, &off, &r);
        assert!(!c.passed(), "{c:?}");
        assert!((c.max_abs - 0.1).abs() < 1e-12);
        let poisoned = Array::from_vec(shape, vec![1., f64::NAN, 3., 4.]);
        let p = compare(DType::F32, &poisoned, &r);
        assert_eq!(p.non_finite, 1);
        assert!(!p.passed());
        let exact = compare(DType::I32, &r, &r);
        assert!(exact.passed() && exact.bound == 0.0);
    }
}
