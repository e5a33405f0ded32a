//! Compilation targets: the GPU architectures mucc emits code for, with the limits and features
//! that every planning and emission stage reads instead of hard-coding numbers.

use std::fmt;
use std::str::FromStr;

/// A GPU architecture mucc can target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    /// Ampere (A100): cp.async, ldmatrix, mma.sync.
    Sm80,
    /// Hopper (H100/H200) with the architecture-specific features: TMA, mbarrier, wgmma.
    Sm90a,
}

impl Arch {
    /// The name used by nvcc and on the command line (`sm_80`, `sm_90a`).
    pub fn name(self) -> &'static str {
        match self {
            Arch::Sm80 => "sm_80",
            Arch::Sm90a => "sm_90a",
        }
    }
}

impl serde::Serialize for Arch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for Arch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Arch {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sm_80" | "sm80" => Ok(Arch::Sm80),
            "sm_90a" | "sm90a" | "sm_90" | "sm90" => Ok(Arch::Sm90a),
            _ => Err(format!(
                "unsupported architecture `{}` (expected sm_80 or sm_90a)",
                crate::text::clip(s)
            )),
        }
    }
}

/// Limits and features of a target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    /// The architecture.
    pub arch: Arch,
    /// Dynamic shared memory one block may use (bytes, after opting in), less
    /// [`RUNTIME_STATIC_SMEM`] for the runtime's own static shared arrays.
    pub smem_per_block: usize,
    /// Shared memory of one SM (bytes), shared by its resident blocks.
    pub smem_per_sm: usize,
    /// Device memory of the largest part of this architecture (bytes; A100 80 GB, H200 141 GB):
    /// a graph whose buffers exceed it cannot run on any such GPU.
    pub device_memory: usize,
    /// SMs of a typical part of this architecture (A100: 108, H100 SXM/H200: 132); used only by
    /// occupancy heuristics.
    pub typical_sms: usize,
    /// Most stages of a `cp.async` software pipeline (fewer when shared memory is short or the
    /// loop has fewer iterations).
    pub max_pipeline_stages: usize,
    /// 32-bit registers per thread the planner may give to register-resident accumulators.
    pub accum_register_budget: usize,
    /// Shared-memory banks × bank width: the span of one conflict-free row access (bytes).
    pub smem_line_bytes: usize,
    /// Widest single copy (bytes): 16 for `cp.async`/`ld.global.v4`.
    pub max_copy_bytes: usize,
    /// `ldmatrix` is available.
    pub has_ldmatrix: bool,
    /// `cp.async` is available.
    pub has_cp_async: bool,
    /// TMA, mbarrier and wgmma are available.
    pub has_tma_wgmma: bool,
}

/// Bytes of dynamic shared memory every kernel may use without opting in: more needs
/// `cudaFuncAttributeMaxDynamicSharedMemorySize` (up to the target's `smem_per_block`).
pub const DEFAULT_DYNAMIC_SMEM: usize = 48 * 1024;

/// Bytes of static shared memory the runtime headers may declare in a kernel (the partial sums
/// of block-wide row reductions: at most 32 warps × 8 bytes), kept out of the planner's budget.
pub const RUNTIME_STATIC_SMEM: usize = 256;

/// Whether a kernel of `dynamic_smem` bytes of dynamic shared memory must raise its limit
/// (`cudaFuncAttributeMaxDynamicSharedMemorySize`) before its first launch: when its dynamic
/// shared memory plus the runtime's static arrays (at most [`RUNTIME_STATIC_SMEM`]) exceed
/// [`DEFAULT_DYNAMIC_SMEM`]. (A kernel with exactly 48 KB of dynamic shared memory and a static
/// array failed to launch with "invalid argument" when only dynamic shared memory above 48 KB
/// opted in.) The plan shows it (`SmemPlan::opt_in`); the host entry and the runner follow it.
pub fn needs_smem_opt_in(dynamic_smem: usize) -> bool {
    dynamic_smem + RUNTIME_STATIC_SMEM > DEFAULT_DYNAMIC_SMEM
}

impl Target {
    /// The target of an architecture.
    pub fn new(arch: Arch) -> Target {
        // What both architectures share; each arm below says how it differs.
        let ampere = Target {
            arch: Arch::Sm80,
            smem_per_block: 163 * 1024 - RUNTIME_STATIC_SMEM,
            smem_per_sm: 164 * 1024,
            device_memory: 80 << 30,
            typical_sms: 108,
            max_pipeline_stages: 4,
            accum_register_budget: 64,
            smem_line_bytes: 128,
            max_copy_bytes: 16,
            has_ldmatrix: true,
            has_cp_async: true,
            has_tma_wgmma: false,
        };
        match arch {
            Arch::Sm80 => ampere,
            Arch::Sm90a => Target {
                arch,
                smem_per_block: 227 * 1024 - RUNTIME_STATIC_SMEM,
                smem_per_sm: 228 * 1024,
                device_memory: 141 << 30,
                typical_sms: 132,
                has_tma_wgmma: true,
                ..ampere
            },
        }
    }

    /// Both targets mucc supports.
    pub fn all() -> [Target; 2] {
        [Target::new(Arch::Sm80), Target::new(Arch::Sm90a)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits() {
        assert_eq!(
            Target::new(Arch::Sm80).smem_per_block,
            166_912 - RUNTIME_STATIC_SMEM
        );
        assert_eq!(
            Target::new(Arch::Sm90a).smem_per_block,
            232_448 - RUNTIME_STATIC_SMEM
        );
        assert_eq!("sm_90a".parse::<Arch>(), Ok(Arch::Sm90a));
        assert!("sm_70".parse::<Arch>().is_err());
    }
}
