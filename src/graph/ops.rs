//! Operator kinds shared by the kernel level and the threadblock level, with their scalar
//! semantics (the CPU interpreter's definition of each element-wise operator).

use std::fmt;

/// An element-wise unary operator.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UnaryOp {
    /// e^x
    Exp,
    /// x²
    Square,
    /// √x
    Sqrt,
    /// x / (1 + e^(−x))
    Silu,
    /// 1 / (1 + e^(−x))
    Sigmoid,
    /// 0.5·x·(1 + erf(x/√2)) (exact GELU)
    Gelu,
    /// max(x, 0)
    Relu,
    /// clamp(x, min, max). Mirage does not serialise the bounds.
    Clamp {
        /// Lower bound.
        min: f64,
        /// Upper bound.
        max: f64,
    },
    /// s·x. Mirage does not serialise the scalar.
    MulScalar(f64),
    /// ln x
    Log,
}

impl UnaryOp {
    /// The operator's name without level prefix (`exp`, `mul_scalar`, …).
    pub fn name(&self) -> &'static str {
        match self {
            UnaryOp::Exp => "exp",
            UnaryOp::Square => "square",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Silu => "silu",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Gelu => "gelu",
            UnaryOp::Relu => "relu",
            UnaryOp::Clamp { .. } => "clamp",
            UnaryOp::MulScalar(_) => "mul_scalar",
            UnaryOp::Log => "log",
        }
    }

    /// Applies the operator to one value.
    pub fn apply(&self, x: f64) -> f64 {
        match *self {
            UnaryOp::Exp => x.exp(),
            UnaryOp::Square => x * x,
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Silu => x / (1.0 + (-x).exp()),
            UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            UnaryOp::Gelu => 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)),
            UnaryOp::Relu => {
                if x > 0.0 || x.is_nan() {
                    x
                } else {
                    0.0
                }
            }
            UnaryOp::Clamp { min, max } => {
                if x.is_nan() {
                    x
                } else {
                    x.max(min).min(max)
                }
            }
            UnaryOp::MulScalar(s) => s * x,
            UnaryOp::Log => x.ln(),
        }
    }
}

impl fmt::Display for UnaryOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnaryOp::Clamp { min, max } => write!(f, "clamp[{min}, {max}]"),
            UnaryOp::MulScalar(s) => write!(f, "mul_scalar[{s}]"),
            other => f.write_str(other.name()),
        }
    }
}

/// An element-wise binary operator with NumPy-style broadcasting (equal ranks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// a + b
    Add,
    /// a − b
    Sub,
    /// a · b
    Mul,
    /// a / b
    Div,
    /// a ^ b
    Pow,
}

impl BinaryOp {
    /// The operator's name without level prefix.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Pow => "pow",
        }
    }

    /// Applies the operator.
    pub fn apply(self, a: f64, b: f64) -> f64 {
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            BinaryOp::Pow => a.powf(b),
        }
    }
}

impl fmt::Display for BinaryOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The kind of a for-loop accumulator (threadblock level). Inputs are in-loop tiles; the output
/// exists after the loop (`after_accum`). "LD" is the tile's last dim; F the loop range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AccumKind {
    /// Σᵢ Xᵢ, element-wise.
    Nored,
    /// Σᵢ Σₗ Xᵢ[…, l]; last dim → 1.
    RedLdSum,
    /// (Σᵢ Σₗ Xᵢ[…, l]) / (L·F); last dim → 1.
    RedLdMean,
    /// sqrt((Σᵢ Σₗ Xᵢ[…, l]²) / (L·F)); last dim → 1. No ε.
    RedLdRms,
    /// out[…, j] = Σᵢ Σₖ Xᵢ[…, k·dimx + j]; last dim → `reduction_dimx` (strided grouping).
    RedtoxLdSum,
    /// A ← A·r + Xᵢ (r = second input, broadcast to X).
    NoredRescale,
    /// A ← A·r + Σₗ Xᵢ[…, l]; last dim → 1.
    RedLdSumRescale,
    /// maxᵢ Xᵢ, element-wise (initial value −∞).
    Max,
}

impl AccumKind {
    /// All kinds.
    pub const ALL: [AccumKind; 8] = [
        AccumKind::Nored,
        AccumKind::RedLdSum,
        AccumKind::RedLdMean,
        AccumKind::RedLdRms,
        AccumKind::RedtoxLdSum,
        AccumKind::NoredRescale,
        AccumKind::RedLdSumRescale,
        AccumKind::Max,
    ];

    /// Short name (`nored`, `red_ld_sum`, …).
    pub fn name(self) -> &'static str {
        match self {
            AccumKind::Nored => "nored",
            AccumKind::RedLdSum => "red_ld_sum",
            AccumKind::RedLdMean => "red_ld_mean",
            AccumKind::RedLdRms => "red_ld_rms",
            AccumKind::RedtoxLdSum => "redtox_ld_sum",
            AccumKind::NoredRescale => "nored_rescale",
            AccumKind::RedLdSumRescale => "red_ld_sum_rescale",
            AccumKind::Max => "max",
        }
    }

    /// Number of inputs (2 for the rescale variants).
    pub fn num_inputs(self) -> usize {
        match self {
            AccumKind::NoredRescale | AccumKind::RedLdSumRescale => 2,
            _ => 1,
        }
    }

    /// Whether the accumulator reduces the tile's last dim.
    pub fn reduces_last_dim(self) -> bool {
        !matches!(
            self,
            AccumKind::Nored | AccumKind::NoredRescale | AccumKind::Max
        )
    }
}

/// The kind of a threadblock-level reduction over one dim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TbReduction {
    /// Sum over the dim; the dim becomes 1.
    Sum,
    /// Strided grouped sum down to `reduction_dimx`: `out[j] = Σₖ X[k·dimx + j]`.
    ToDimx,
    /// Online-softmax helper with two outputs, both with the dim reduced to 1: the running max
    /// over all iterations so far (out0), and previous running max − new running max (out1).
    Max,
    /// The max over the dim of this iteration's tile alone (the dim becomes 1): no state
    /// carries over from one iteration to the next. mucc-internal (the shift of scores whose
    /// block holds whole rows); Mirage's format has no operator for it.
    PlainMax,
}

impl TbReduction {
    /// Short name (`sum`, `to_dimx`, `max`, `plain_max`).
    pub fn name(self) -> &'static str {
        match self {
            TbReduction::Sum => "sum",
            TbReduction::ToDimx => "to_dimx",
            TbReduction::Max => "max",
            TbReduction::PlainMax => "plain_max",
        }
    }
}

/// The partition map of a threadblock input or output: for each grid axis (x, y, z), the tensor
/// dim that axis splits, or `None` (−1 in Mirage's JSON).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct DimMap(pub [Option<usize>; 3]);

impl DimMap {
    /// No axis mapped (Mirage's (−1, −1, −1)).
    pub const NONE: DimMap = DimMap([None, None, None]);

    /// From Mirage's (x, y, z) triple where −1 means unmapped. Negative values other than −1
    /// are not representable and give `None`.
    pub fn from_mirage(v: [i64; 3]) -> Option<DimMap> {
        let mut out = [None; 3];
        for (o, x) in out.iter_mut().zip(v) {
            *o = match x {
                -1 => None,
                x if x >= 0 => Some(usize::try_from(x).ok()?),
                _ => return None,
            };
        }
        Some(DimMap(out))
    }

    /// Mirage's (x, y, z) triple with −1 for unmapped axes.
    pub fn to_mirage(self) -> [i64; 3] {
        self.0.map(|d| d.map_or(-1, |d| d as i64))
    }

    /// The dim split by axis `a` (0 = x, 1 = y, 2 = z).
    pub fn axis(self, a: usize) -> Option<usize> {
        self.0[a]
    }
}

impl From<[i32; 3]> for DimMap {
    /// Mirage's Python-style triple, −1 (or any negative value) meaning unmapped.
    fn from(v: [i32; 3]) -> DimMap {
        DimMap(v.map(|x| usize::try_from(x).ok()))
    }
}

impl fmt::Display for DimMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.to_mirage();
        write!(f, "({}, {}, {})", m[0], m[1], m[2])
    }
}

/// Names of the three grid axes.
pub const AXIS_NAMES: [&str; 3] = ["x", "y", "z"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalar_semantics() {
        assert!((UnaryOp::Silu.apply(1.0) - 0.7310585786300049).abs() < 1e-15);
        assert!((UnaryOp::Gelu.apply(1.0) - 0.8413447460685429).abs() < 1e-15);
        assert_eq!(UnaryOp::Clamp { min: 0.0, max: 1.0 }.apply(3.0), 1.0);
        assert_eq!(UnaryOp::Relu.apply(-2.0), 0.0);
        assert!(UnaryOp::Relu.apply(f64::NAN).is_nan());
        assert_eq!(BinaryOp::Pow.apply(2.0, 10.0), 1024.0);
        assert_eq!(BinaryOp::Sub.apply(2.0, 10.0), -8.0);
    }

    #[test]
    fn dim_maps() {
        let m = DimMap::from_mirage([1, -1, 0]).unwrap();
        assert_eq!(m.0, [Some(1), None, Some(0)]);
        assert_eq!(m.to_mirage(), [1, -1, 0]);
        assert_eq!(DimMap::from_mirage([-2, -1, -1]), None);
        assert_eq!(DimMap::from([1, -1, -1]), DimMap([Some(1), None, None]));
        assert_eq!(m.to_string(), "(1, -1, 0)");
    }
}
