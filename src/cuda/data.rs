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

/// How many times its storage-rounding sensitivity a floating-point output may be off.
///
/// The sensitivity of an output is ‖stored − exact‖ / ‖exact‖, where `stored` is the reference
/// that rounds every stored tensor, tile and accumulator to its dtype
/// ([`crate::graph::interp::Rounding::Stored`]) and `exact` the f64 oracle. Generated code
/// rounds at a subset of those places, in another order, so its distance from the oracle is of
/// the same size as the sensitivity when an output is a cancelling sum (observed on an H200:
/// 1.0–1.9 times it for the three generated graphs that failed the plain bound): the bound
/// becomes `max(bound(dt), SENSITIVITY_FACTOR × sensitivity)`, at most [`WIDENED_BOUND_CAP`].
/// Of the 7,473 floating-point outputs of generated graphs 0–2999 (inputs seed 0, scale 1),
/// 10 have a sensitivity of at least half their plain bound, 6,943 under a tenth of it.
pub const SENSITIVITY_FACTOR: f64 = 3.0;

/// The largest bound widening may give: an output whose rounding alone moves it further is
/// dominated by rounding and cannot be checked this way (it fails).
pub const WIDENED_BOUND_CAP: f64 = 0.25;

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
    /// The bound applied (after widening, if any).
    pub bound: f64,
    /// The output's storage-rounding sensitivity, when it was computed (see
    /// [`SENSITIVITY_FACTOR`]); `bound` was widened with it.
    pub sensitivity: Option<f64>,
}

impl Comparison {
    /// Whether the output passes: every element finite and the error within the bound.
    pub fn passed(&self) -> bool {
        self.non_finite == 0 && self.rel_l2 <= self.bound
    }

    /// Whether judging this output again with its storage-rounding sensitivity could change the
    /// verdict: a floating-point output that failed by its error alone (all elements finite).
    pub fn worth_widening(&self, dt: DType) -> bool {
        dt.is_float() && !self.passed() && self.non_finite == 0 && self.sensitivity.is_none()
    }

    /// Records `sensitivity` (‖stored − exact‖ / ‖exact‖) and widens the bound with it; a
    /// non-finite sensitivity (the stored-rounding reference overflowed) widens nothing.
    pub fn widen(&mut self, sensitivity: f64) {
        self.sensitivity = Some(sensitivity);
        if sensitivity.is_finite() {
            self.bound = self
                .bound
                .max((SENSITIVITY_FACTOR * sensitivity).min(WIDENED_BOUND_CAP));
        }
    }
}

/// ‖stored − exact‖ / ‖exact‖ (‖stored − exact‖ when `exact` is all zeros; ∞ when `stored`
/// holds a non-finite value that `exact` does not).
pub fn sensitivity(stored: &Array, exact: &Array) -> f64 {
    let (mut d2, mut e2) = (0.0f64, 0.0f64);
    for (&s, &e) in stored.data.iter().zip(&exact.data) {
        if !e.is_finite() {
            continue;
        }
        if !s.is_finite() {
            return f64::INFINITY;
        }
        d2 += (s - e) * (s - e);
        e2 += e * e;
    }
    if e2 > 0.0 {
        (d2 / e2).sqrt()
    } else {
        d2.sqrt()
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
        sensitivity: None,
    }
}

/// Compares every rank's outputs `outputs[r]` (dtype, values) with `reference[r]`, and widens
/// the bound of each floating-point output that fails by its error alone with its
/// storage-rounding sensitivity against `stored()[r]` (the reference evaluated again rounding
/// every stored value), which is computed only when some output needs it. One GPU is one rank.
pub fn compare_widened<O: AsRef<[(DType, Array)]>, R: AsRef<[Array]>>(
    outputs: &[O],
    reference: &[R],
    stored: impl FnOnce() -> Result<Vec<Vec<Array>>, String>,
) -> Result<Vec<Vec<Comparison>>, String> {
    let outputs: Vec<&[(DType, Array)]> = outputs.iter().map(AsRef::as_ref).collect();
    let reference: Vec<&[Array]> = reference.iter().map(AsRef::as_ref).collect();
    let mut cmp: Vec<Vec<Comparison>> = outputs
        .iter()
        .zip(&reference)
        .map(|(outs, refs)| {
            outs.iter()
                .zip(refs.iter())
                .map(|((dt, got), r)| compare(*dt, got, r))
                .collect()
        })
        .collect();
    let widen = |r: usize, j: usize, c: &Comparison| c.worth_widening(outputs[r][j].0);
    let needed = cmp
        .iter()
        .enumerate()
        .any(|(r, row)| row.iter().enumerate().any(|(j, c)| widen(r, j, c)));
    if needed {
        let stored = stored()?;
        for (r, row) in cmp.iter_mut().enumerate() {
            for (j, c) in row.iter_mut().enumerate() {
                if widen(r, j, c) {
                    c.widen(sensitivity(&stored[r][j], &reference[r][j]));
                }
            }
        }
    }
    Ok(cmp)
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

    #[test]
    fn ranks_are_widened_only_where_an_output_needs_it() {
        let shape = Shape::new(&[2]).unwrap();
        let a = |v: f64| Array::from_vec(shape, vec![v, 0.0]);
        let exact = vec![vec![a(1.0), a(0.05)], vec![a(2.0), a(0.05)]];
        // Rank 0 exact; rank 1's second output 6% off, within its storage-rounding sensitivity.
        let ok = vec![
            vec![(DType::BF16, a(1.0)), (DType::BF16, a(0.05))],
            vec![(DType::BF16, a(2.0)), (DType::BF16, a(0.053))],
        ];
        let mut calls = 0;
        let stored = vec![vec![a(1.0), a(0.05)], vec![a(2.0), a(0.0525)]];
        let cmp = compare_widened(&ok, &exact, || {
            calls += 1;
            Ok(stored.clone())
        })
        .unwrap();
        assert_eq!(calls, 1);
        assert!(cmp.iter().flatten().all(Comparison::passed), "{cmp:?}");
        assert_eq!(
            cmp[1][1].sensitivity.map(|s| (s * 100.0).round()),
            Some(5.0)
        );
        assert!(cmp[0].iter().all(|c| c.sensitivity.is_none()));
        // Nothing fails: the stored-rounding reference is never evaluated.
        let cmp = compare_widened(&ok[..1], &exact[..1], || unreachable!()).unwrap();
        assert!(cmp[0].iter().all(Comparison::passed));
        // Its failure is the caller's error.
        let err = compare_widened(&ok, &exact, || Err("out of memory".into())).unwrap_err();
        assert_eq!(err, "out of memory");
    }

    #[test]
    fn widening_follows_the_sensitivity_and_stops_at_the_cap() {
        let shape = Shape::new(&[2]).unwrap();
        let exact = Array::from_vec(shape, vec![0.05, 0.0]);
        // A cancelling output: 6% off.
        let gpu = Array::from_vec(shape, vec![0.053, 0.0]);
        let mut c = compare(DType::BF16, &gpu, &exact);
        assert!(c.worth_widening(DType::BF16));
        // Storage rounding alone moves it 5%: the bound becomes 15%.
        let stored = Array::from_vec(shape, vec![0.0525, 0.0]);
        c.widen(sensitivity(&stored, &exact));
        assert!((c.bound - 0.15).abs() < 1e-9, "{c:?}");
        assert!(c.passed());
        // A well-conditioned output keeps its bound: 6% fails.
        let mut d = compare(DType::BF16, &gpu, &exact);
        d.widen(sensitivity(
            &Array::from_vec(shape, vec![0.05001, 0.0]),
            &exact,
        ));
        assert_eq!(d.bound, bound(DType::BF16));
        assert!(!d.passed());
        // An output drowned in rounding: the bound stops at the cap, and a wrong value fails.
        let mut e = compare(DType::BF16, &Array::from_vec(shape, vec![0.5, 0.0]), &exact);
        e.widen(sensitivity(
            &Array::from_vec(shape, vec![0.15, 0.0]),
            &exact,
        ));
        assert_eq!(e.bound, WIDENED_BOUND_CAP);
        assert!(!e.passed());
        // A stored-rounding reference that overflowed widens nothing.
        let mut f = compare(DType::F16, &gpu, &exact);
        f.widen(sensitivity(
            &Array::from_vec(shape, vec![f64::INFINITY, 0.0]),
            &exact,
        ));
        assert_eq!(f.bound, bound(DType::F16));
        // Integers are never widened; poisoned outputs are not either.
        assert!(!compare(DType::I32, &gpu, &exact).worth_widening(DType::I32));
        let poisoned = Array::from_vec(shape, vec![f64::NAN, 0.0]);
        assert!(!compare(DType::F16, &poisoned, &exact).worth_widening(DType::F16));
    }
}
