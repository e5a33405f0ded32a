//! Mirage's `op_type` strings, current and legacy spellings, in both directions.

use crate::graph::kernel::KnOpKind;
use crate::graph::ops::{AccumKind, BinaryOp, TbReduction, UnaryOp};
use crate::graph::threadblock::TbOpKind;

/// A unary operator name; the parameterised ones get their parameters from other keys.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UnaryName {
    /// An operator without parameters.
    Plain(UnaryOp),
    /// `clamp` (bounds not serialised by Mirage).
    Clamp,
    /// `mul_scalar` (scalar not serialised by Mirage).
    MulScalar,
}

/// A parsed kernel-level `op_type`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KnName {
    /// `kn_input_op`
    Input,
    /// `kn_output_op`
    Output,
    /// `kn_matmul_op`
    Matmul,
    /// `kn_<unary>_op`
    Unary(UnaryName),
    /// `kn_<binary>_op`
    Binary(BinaryOp),
    /// `kn_reduction_<k>_op`
    Reduction(usize),
    /// `kn_rms_norm_op`
    RmsNorm,
    /// `kn_concat_<k>_op`
    Concat(usize),
    /// `kn_split_<k>_op`
    Split(usize),
    /// `kn_chunk_<k>_op`
    Chunk(usize),
    /// `kn_allreduce_op`
    AllReduce,
    /// `kn_customized_op`
    Customized,
}

/// A parsed threadblock-level `op_type`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TbName {
    /// `tb_input_op`
    Input,
    /// `tb_output_op`
    Output,
    /// `tb_matmul_op`
    Matmul,
    /// `tb_<unary>_op`
    Unary(UnaryName),
    /// `tb_<binary>_op`
    Binary(BinaryOp),
    /// `tb_reduction_<k>[_to_dimx|_max]_op`
    Reduction(usize, TbReduction),
    /// `tb_rms_norm_op`
    RmsNorm,
    /// `tb_concat_<k>_op`
    Concat(usize),
    /// `tb_forloop_accum_*_op` or legacy `tb_accum_*_op`; the flag says legacy spelling.
    Accum(AccumKind, bool),
}

/// Why a name did not parse.
#[derive(Clone, Debug, PartialEq)]
pub enum NameError {
    /// Not an operator of this level.
    Unknown,
    /// A Mirage operator that mucc does not accept (with the reason).
    Unsupported(&'static str),
}

fn unary(s: &str) -> Option<UnaryName> {
    Some(match s {
        "exp" => UnaryName::Plain(UnaryOp::Exp),
        "square" => UnaryName::Plain(UnaryOp::Square),
        "sqrt" => UnaryName::Plain(UnaryOp::Sqrt),
        "silu" => UnaryName::Plain(UnaryOp::Silu),
        "sigmoid" => UnaryName::Plain(UnaryOp::Sigmoid),
        "gelu" => UnaryName::Plain(UnaryOp::Gelu),
        "relu" => UnaryName::Plain(UnaryOp::Relu),
        "log" => UnaryName::Plain(UnaryOp::Log),
        "clamp" => UnaryName::Clamp,
        "mul_scalar" => UnaryName::MulScalar,
        _ => return None,
    })
}

fn binary(s: &str) -> Option<BinaryOp> {
    Some(match s {
        "add" => BinaryOp::Add,
        "sub" => BinaryOp::Sub,
        "mul" => BinaryOp::Mul,
        "div" => BinaryOp::Div,
        "pow" => BinaryOp::Pow,
        _ => return None,
    })
}

/// `prefix<k>suffix` with k a dim index 0..=3.
fn indexed(s: &str, prefix: &str, suffix: &str) -> Option<usize> {
    let k = s.strip_prefix(prefix)?.strip_suffix(suffix)?;
    match k {
        "0" => Some(0),
        "1" => Some(1),
        "2" => Some(2),
        "3" => Some(3),
        _ => None,
    }
}

fn accum(s: &str) -> Option<AccumKind> {
    AccumKind::ALL.into_iter().find(|k| k.name() == s)
}

/// Parses a kernel-level `op_type`.
pub fn parse_kn(s: &str) -> Result<KnName, NameError> {
    let body = s
        .strip_prefix("kn_")
        .and_then(|b| b.strip_suffix("_op"))
        .ok_or(NameError::Unknown)?;
    Ok(match body {
        "input" => KnName::Input,
        "output" => KnName::Output,
        "matmul" => KnName::Matmul,
        "rms_norm" => KnName::RmsNorm,
        "allreduce" => KnName::AllReduce,
        "customized" => KnName::Customized,
        _ => {
            if let Some(u) = unary(body) {
                KnName::Unary(u)
            } else if let Some(b) = binary(body) {
                KnName::Binary(b)
            } else if let Some(k) = indexed(s, "kn_reduction_", "_op") {
                KnName::Reduction(k)
            } else if let Some(k) = indexed(s, "kn_concat_", "_op") {
                KnName::Concat(k)
            } else if let Some(k) = indexed(s, "kn_split_", "_op") {
                KnName::Split(k)
            } else if let Some(k) = indexed(s, "kn_chunk_", "_op") {
                KnName::Chunk(k)
            } else {
                return Err(NameError::Unknown);
            }
        }
    })
}

/// Parses a threadblock-level `op_type`, accepting the legacy accumulator spellings.
pub fn parse_tb(s: &str) -> Result<TbName, NameError> {
    let body = s
        .strip_prefix("tb_")
        .and_then(|b| b.strip_suffix("_op"))
        .ok_or(NameError::Unknown)?;
    Ok(match body {
        "input" => TbName::Input,
        "output" => TbName::Output,
        "matmul" => TbName::Matmul,
        "rms_norm" => TbName::RmsNorm,
        "concat_then_matmul" => {
            return Err(NameError::Unsupported(
                "tb_concat_then_matmul_op is an internal Mirage operator without saved semantics",
            ));
        }
        "customized" => {
            return Err(NameError::Unsupported(
                "nested customized operators (tb_customized_op) are not supported",
            ));
        }
        _ => {
            if let Some(u) = unary(body) {
                TbName::Unary(u)
            } else if let Some(b) = binary(body) {
                TbName::Binary(b)
            } else if let Some(k) = body.strip_prefix("forloop_accum_").and_then(accum) {
                TbName::Accum(k, false)
            } else if let Some(k) = body.strip_prefix("accum_").and_then(accum) {
                TbName::Accum(k, true)
            } else if let Some(k) = indexed(s, "tb_reduction_", "_to_dimx_op") {
                TbName::Reduction(k, TbReduction::ToDimx)
            } else if let Some(k) = indexed(s, "tb_reduction_", "_max_op") {
                TbName::Reduction(k, TbReduction::Max)
            } else if let Some(k) = indexed(s, "tb_reduction_", "_op") {
                TbName::Reduction(k, TbReduction::Sum)
            } else if let Some(k) = indexed(s, "tb_concat_", "_op") {
                TbName::Concat(k)
            } else if indexed(s, "tb_split_", "_op").is_some() {
                return Err(NameError::Unsupported(
                    "threadblock split operators have no saved semantics in Mirage",
                ));
            } else {
                return Err(NameError::Unknown);
            }
        }
    })
}

/// The `op_type` Mirage writes for a kernel operator.
pub fn kn_name(kind: &KnOpKind) -> String {
    match kind {
        KnOpKind::Unary(u) => format!("kn_{}_op", u.name()),
        other => format!("kn_{}_op", other.name()),
    }
}

/// The `op_type` Mirage writes for a threadblock operator; `legacy` selects the pre-2025-03
/// accumulator spellings where one exists.
pub fn tb_name(kind: &TbOpKind, legacy: bool) -> String {
    match kind {
        TbOpKind::Accum(k) => {
            let has_legacy = matches!(
                k,
                AccumKind::Nored
                    | AccumKind::RedLdSum
                    | AccumKind::RedLdMean
                    | AccumKind::RedLdRms
                    | AccumKind::RedtoxLdSum
            );
            if legacy && has_legacy {
                format!("tb_accum_{}_op", k.name())
            } else {
                format!("tb_forloop_accum_{}_op", k.name())
            }
        }
        other => format!("tb_{}_op", other.name()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kn_names() {
        assert_eq!(parse_kn("kn_matmul_op"), Ok(KnName::Matmul));
        assert_eq!(parse_kn("kn_reduction_2_op"), Ok(KnName::Reduction(2)));
        assert_eq!(parse_kn("kn_chunk_1_op"), Ok(KnName::Chunk(1)));
        assert_eq!(
            parse_kn("kn_mul_scalar_op"),
            Ok(KnName::Unary(UnaryName::MulScalar))
        );
        assert_eq!(parse_kn("kn_unkown"), Err(NameError::Unknown));
        assert_eq!(parse_kn("kn_reduction_7_op"), Err(NameError::Unknown));
        assert_eq!(parse_kn("tb_matmul_op"), Err(NameError::Unknown));
        assert_eq!(kn_name(&KnOpKind::Unary(UnaryOp::Exp)), "kn_exp_op");
        assert_eq!(
            kn_name(&KnOpKind::Reduction { dim: 1 }),
            "kn_reduction_1_op"
        );
    }

    #[test]
    fn tb_names() {
        assert_eq!(
            parse_tb("tb_accum_redtox_ld_sum_op"),
            Ok(TbName::Accum(AccumKind::RedtoxLdSum, true))
        );
        assert_eq!(
            parse_tb("tb_forloop_accum_nored_rescale_op"),
            Ok(TbName::Accum(AccumKind::NoredRescale, false))
        );
        assert_eq!(
            parse_tb("tb_reduction_2_to_dimx_op"),
            Ok(TbName::Reduction(2, TbReduction::ToDimx))
        );
        assert_eq!(
            parse_tb("tb_reduction_0_max_op"),
            Ok(TbName::Reduction(0, TbReduction::Max))
        );
        assert!(matches!(
            parse_tb("tb_split_0_op"),
            Err(NameError::Unsupported(_))
        ));
        assert_eq!(parse_tb("tb_unkown"), Err(NameError::Unknown));
        for k in AccumKind::ALL {
            for legacy in [false, true] {
                let name = tb_name(&TbOpKind::Accum(k), legacy);
                assert!(matches!(parse_tb(&name), Ok(TbName::Accum(k2, _)) if k2 == k));
            }
        }
        assert_eq!(
            tb_name(&TbOpKind::Accum(AccumKind::Nored), true),
            "tb_accum_nored_op"
        );
        assert_eq!(
            tb_name(&TbOpKind::Accum(AccumKind::Max), true),
            "tb_forloop_accum_max_op"
        );
    }
}
