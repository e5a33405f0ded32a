//! Element types and Mirage's three generations of `data_type` codes.
//!
//! Mirage writes a tensor's element type as a bare integer whose meaning changed twice (see
//! `mirage-graph-format.md` §2.6.1). [`DtypeTable`] names the three generations;
//! [`DtypeTable::decode`] and [`DtypeTable::encode`] translate between codes and [`DType`].

use std::fmt;
use std::str::FromStr;

/// Element type of a device or shared-memory tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE binary16.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE binary32.
    F32,
    /// IEEE binary64.
    F64,
    /// Signed 8-bit integer (storage type).
    I8,
    /// Unsigned 8-bit integer (storage type).
    U8,
    /// Signed 16-bit integer (storage type).
    I16,
    /// Unsigned 16-bit integer (storage type).
    U16,
    /// Signed 32-bit integer (storage type).
    I32,
    /// Unsigned 32-bit integer (storage type).
    U32,
    /// Signed 64-bit integer (storage type).
    I64,
    /// Unsigned 64-bit integer (storage type).
    U64,
    /// 8-bit float (Mirage does not say which variant); recognised, not supported.
    F8,
    /// 4-bit float; recognised, not supported.
    F4,
    /// Signed 4-bit integer; recognised, not supported.
    I4,
    /// Unsigned 4-bit integer; recognised, not supported.
    U4,
}

impl DType {
    /// Every element type, in declaration order.
    pub const ALL: [DType; 16] = [
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::I8,
        DType::U8,
        DType::I16,
        DType::U16,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::U64,
        DType::F8,
        DType::F4,
        DType::I4,
        DType::U4,
    ];

    /// Short lowercase name (`f16`, `bf16`, `i8`, …), as printed by `mucc inspect`.
    pub fn name(self) -> &'static str {
        match self {
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I16 => "i16",
            DType::U16 => "u16",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::I64 => "i64",
            DType::U64 => "u64",
            DType::F8 => "f8",
            DType::F4 => "f4",
            DType::I4 => "i4",
            DType::U4 => "u4",
        }
    }

    /// Size of one element in bits.
    pub fn bits(self) -> u32 {
        match self {
            DType::F4 | DType::I4 | DType::U4 => 4,
            DType::I8 | DType::U8 | DType::F8 => 8,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 16,
            DType::F32 | DType::I32 | DType::U32 => 32,
            DType::F64 | DType::I64 | DType::U64 => 64,
        }
    }

    /// Bytes of one element (sub-byte types count as one byte: mucc never stores them).
    pub fn bytes(self) -> usize {
        (self.bits() as usize).div_ceil(8)
    }

    /// Whether mucc can store tensors of this type (everything but the sub-byte and fp8 types,
    /// whose encodings Mirage's files do not pin down).
    pub fn is_supported(self) -> bool {
        !matches!(self, DType::F8 | DType::F4 | DType::I4 | DType::U4)
    }

    /// The type arithmetic on this type runs in (the runtime's `mucc::Compute<T>`): fp32 for
    /// 16-bit floats and fp32, fp64 otherwise.
    pub fn compute(self) -> DType {
        match self {
            DType::F16 | DType::BF16 | DType::F32 => DType::F32,
            _ => DType::F64,
        }
    }

    /// Whether this is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DType::F16 | DType::BF16 | DType::F32 | DType::F64 | DType::F8 | DType::F4
        )
    }

    /// Whether this is an unsigned integer type.
    pub fn is_unsigned(self) -> bool {
        matches!(
            self,
            DType::U8 | DType::U16 | DType::U32 | DType::U64 | DType::U4
        )
    }

    /// The largest finite value of a 16- or 32-bit floating-point type (where an f64 reference
    /// can be finite while the stored tensor overflows); `None` for other types.
    pub fn max_finite(self) -> Option<f64> {
        match self {
            DType::F16 => Some(half::f16::MAX.to_f64()),
            DType::BF16 => Some(half::bf16::MAX.to_f64()),
            DType::F32 => Some(f64::from(f32::MAX)),
            _ => None,
        }
    }

    /// Rounds `x` to the nearest value representable in this type (round to nearest even for
    /// floats; round and saturate for integers). Unsupported types return `x` unchanged.
    pub fn round(self, x: f64) -> f64 {
        fn int(x: f64, lo: f64, hi: f64) -> f64 {
            if x.is_nan() {
                0.0
            } else {
                x.round_ties_even().clamp(lo, hi)
            }
        }
        match self {
            DType::F16 => half::f16::from_f64(x).to_f64(),
            DType::BF16 => half::bf16::from_f64(x).to_f64(),
            DType::F32 => x as f32 as f64,
            DType::F64 => x,
            DType::I8 => int(x, i8::MIN as f64, i8::MAX as f64),
            DType::U8 => int(x, 0.0, u8::MAX as f64),
            DType::I16 => int(x, i16::MIN as f64, i16::MAX as f64),
            DType::U16 => int(x, 0.0, u16::MAX as f64),
            DType::I32 => int(x, i32::MIN as f64, i32::MAX as f64),
            DType::U32 => int(x, 0.0, u32::MAX as f64),
            DType::I64 => int(x, i64::MIN as f64, i64::MAX as f64),
            DType::U64 => int(x, 0.0, u64::MAX as f64),
            DType::F8 | DType::F4 | DType::I4 | DType::U4 => x,
        }
    }
}

impl serde::Serialize for DType {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for DType {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        DType::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| format!("unknown dtype `{}`", super::error::clip(s)))
    }
}

/// One of Mirage's three `data_type` code tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DtypeTable {
    /// Mirage up to 2025-02-27 (all benchmark files; 921 = fp16).
    Legacy,
    /// Mirage 2025-02-28 … 2025-06-04 (Qwen2.5 demo caches; 940 = bf16, 941 = fp16).
    Mid,
    /// Mirage from 2025-06-04 on (940 = fp16, 941 = bf16).
    Current,
}

impl DtypeTable {
    /// All tables.
    pub const ALL: [DtypeTable; 3] = [DtypeTable::Legacy, DtypeTable::Mid, DtypeTable::Current];

    /// The name used on the command line (`legacy`, `mid`, `current`).
    pub fn name(self) -> &'static str {
        match self {
            DtypeTable::Legacy => "legacy",
            DtypeTable::Mid => "mid",
            DtypeTable::Current => "current",
        }
    }

    fn codes(self) -> &'static [(i64, DType)] {
        match self {
            DtypeTable::Legacy => &[
                (900, DType::I8),
                (910, DType::U16),
                (920, DType::BF16),
                (921, DType::F16),
                (930, DType::F32),
                (940, DType::F64),
            ],
            DtypeTable::Mid => &[
                (920, DType::I4),
                (930, DType::F8),
                (935, DType::I8),
                (940, DType::BF16),
                (941, DType::F16),
                (945, DType::U16),
                (950, DType::F32),
                (960, DType::F64),
            ],
            DtypeTable::Current => &[
                (920, DType::F4),
                (925, DType::I4),
                (926, DType::U4),
                (930, DType::F8),
                (935, DType::I8),
                (936, DType::U8),
                (940, DType::F16),
                (941, DType::BF16),
                (945, DType::I16),
                (946, DType::U16),
                (950, DType::F32),
                (955, DType::I32),
                (956, DType::U32),
                (960, DType::F64),
                (965, DType::I64),
                (966, DType::U64),
            ],
        }
    }

    /// The element type of `code` in this table; `None` if the table has no such code
    /// (999, Mirage's "unknown", is never a valid element type).
    pub fn decode(self, code: i64) -> Option<DType> {
        self.codes()
            .iter()
            .find(|(c, _)| *c == code)
            .map(|&(_, d)| d)
    }

    /// The code of `dtype` in this table; `None` if the table cannot express it.
    pub fn encode(self, dtype: DType) -> Option<i64> {
        self.codes()
            .iter()
            .find(|(_, d)| *d == dtype)
            .map(|&(c, _)| c)
    }

    /// Whether `code` means the same type under `self` and `other` (or is invalid in both).
    pub fn agrees_with(self, other: DtypeTable, code: i64) -> bool {
        self.decode(code) == other.decode(code)
    }
}

impl fmt::Display for DtypeTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DtypeTable {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        DtypeTable::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown dtype table `{}` (expected legacy, mid or current)",
                    super::error::clip(s)
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_round_trip() {
        for table in DtypeTable::ALL {
            for &(code, dtype) in table.codes() {
                assert_eq!(table.decode(code), Some(dtype));
                assert_eq!(table.encode(dtype), Some(code));
            }
            assert_eq!(table.decode(999), None);
        }
    }

    #[test]
    fn the_famous_traps() {
        assert_eq!(DtypeTable::Legacy.decode(921), Some(DType::F16));
        assert_eq!(DtypeTable::Mid.decode(940), Some(DType::BF16));
        assert_eq!(DtypeTable::Current.decode(940), Some(DType::F16));
        assert_eq!(DtypeTable::Legacy.decode(930), Some(DType::F32));
        assert_eq!(DtypeTable::Current.decode(930), Some(DType::F8));
        assert!(DtypeTable::Mid.agrees_with(DtypeTable::Current, 950));
        assert!(!DtypeTable::Mid.agrees_with(DtypeTable::Current, 941));
    }

    #[test]
    fn rounding() {
        assert_eq!(DType::F16.round(1.0 + 1e-5), 1.0);
        assert_eq!(DType::BF16.round(1.0 + 1e-3), 1.0);
        assert_eq!(DType::I8.round(300.0), 127.0);
        assert_eq!(DType::U8.round(-3.0), 0.0);
        assert_eq!(DType::I32.round(2.5), 2.0);
        assert_eq!("bf16".parse::<DType>(), Ok(DType::BF16));
        assert!("bf17".parse::<DType>().is_err());
    }
}
