//! The launch plan: everything a runner needs to execute the generated code without its host
//! entry (NVRTC compiles no host code): kernels with their launch configurations and argument
//! bindings, cuBLAS calls, the buffers of inputs and outputs, and the workspace size. The host
//! entry `mucc_execute` of the generated file is rendered from this same plan (see
//! [`super::host`]), and `mucc run` executes it through cudarc: both read the same typed steps.

use serde::{Deserialize, Serialize};

pub use crate::sched::gemm::{CublasCompute, CudaDataType, GemmCall};
pub use crate::sched::kernel_level::NcclDataType;
pub use crate::sched::plan::Binding;

use crate::graph::dtype::DType;
pub use crate::sched::tma::{TmaDataType, TmaSwizzle};
use crate::target::Arch;

/// One kernel launch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelLaunch {
    /// `extern "C"` name of the kernel.
    pub name: String,
    /// Grid (x, y, z).
    pub grid: [u32; 3],
    /// Block (x, y, z).
    pub block: [u32; 3],
    /// Dynamic shared memory in bytes.
    pub dynamic_smem: u32,
    /// Pointer arguments in order.
    pub args: Vec<Binding>,
    /// Tensor-map arguments, after the pointers, in order (sm_90a bulk tensor loads).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tensor_maps: Vec<TensorMapSpec>,
    /// Launched with programmatic stream serialisation (sm_90a): the kernel may start while
    /// the previous one finishes, and waits for it itself.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub programmatic: bool,
}

impl KernelLaunch {
    /// Whether the generated host code and the runner raise the kernel's shared-memory limit
    /// before its first launch: the plan's rule ([`crate::target::needs_smem_opt_in`]) of its
    /// dynamic shared memory.
    pub fn needs_smem_opt_in(&self) -> bool {
        crate::target::needs_smem_opt_in(self.dynamic_smem as usize)
    }
}

/// A tensor map the host encodes (`cuTensorMapEncodeTiled`) and passes by value: a tiled view
/// of a device tensor, whose boxes the kernel loads with the bulk tensor copy engine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorMapSpec {
    /// The device tensor's first element.
    pub binding: Binding,
    /// Element type.
    pub data_type: TmaDataType,
    /// Extents, innermost first.
    pub dims: Vec<u64>,
    /// Byte strides of `dims[1..]`.
    pub strides: Vec<u64>,
    /// Box extents, innermost first.
    pub boxes: Vec<u32>,
    /// Shared-memory swizzle.
    pub swizzle: TmaSwizzle,
}

/// A step of the plan, in execution order on one stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Step {
    /// Launch a kernel of the generated module.
    Kernel(KernelLaunch),
    /// Call cuBLAS.
    Gemm(GemmCall),
    /// Sum a buffer over the graph's GPUs (`ncclAllReduce` on the plan's stream).
    AllReduce(AllReduceCall),
}

/// An all-reduce (sum) across the GPUs of a multi-GPU plan, from `send` into `recv` (which may
/// be the same address): `count` elements of `dtype`, dense.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllReduceCall {
    /// The buffer summed.
    pub send: Binding,
    /// The buffer receiving the sum.
    pub recv: Binding,
    /// Elements.
    pub count: usize,
    /// Element type.
    pub dtype: NcclDataType,
}

/// Shape and memory of a caller buffer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorDirective {
    /// Logical shape.
    pub shape: Vec<usize>,
    /// Element strides.
    pub strides: Vec<usize>,
    /// Elements to allocate.
    pub alloc_elems: usize,
    /// Element type.
    pub dtype: DType,
}

impl TensorDirective {
    /// Bytes to allocate (at least 1).
    pub fn alloc_bytes(&self) -> usize {
        (self.alloc_elems * self.dtype.bytes()).max(1)
    }
}

/// A caller buffer a binding points into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferRef {
    /// Input i.
    Input(usize),
    /// Output j.
    Output(usize),
    /// The workspace.
    Workspace,
    /// GPU `rank`'s exchange buffer as this GPU addresses it (fused all-reduces).
    Exchange(usize),
    /// Not a buffer: this GPU's rank, passed as a 64-bit value.
    Rank,
}

/// The launch plan of a generated file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchPlan {
    /// Target architecture.
    pub arch: Arch,
    /// Inputs in order.
    pub inputs: Vec<TensorDirective>,
    /// Outputs in order.
    pub outputs: Vec<TensorDirective>,
    /// Workspace bytes (128-byte aligned offsets inside).
    pub workspace_bytes: usize,
    /// Steps in order.
    pub steps: Vec<Step>,
    /// GPUs the plan runs on, each on its own shards (more than one: the host entry takes an
    /// NCCL communicator and the all-reduce steps use it).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub gpus: usize,
    /// Bytes of the exchange buffer every GPU provides for the all-reduces fused into kernels
    /// (zeroed before the first execution, used by nothing else; 0: none). The host entry then
    /// takes every GPU's buffer, as this GPU addresses it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub exchange_bytes: usize,
    /// Bytes at the end of the workspace that hold arrival counters (last-block combines): zero
    /// before the first execution, and every execution leaves them zero, so the caller
    /// allocates the workspace zeroed once and keeps it for this plan (0: none, the workspace
    /// may hold anything before a call).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub counter_bytes: usize,
    /// The host entry's name in the generated file (`mucc_execute` unless the plan's symbols
    /// say otherwise).
    #[serde(default = "default_entry", skip_serializing_if = "is_default_entry")]
    pub entry: String,
}

fn one() -> usize {
    1
}

fn is_one(n: &usize) -> bool {
    *n == 1
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn default_entry() -> String {
    crate::sched::plan::DEFAULT_ENTRY.to_string()
}

fn is_default_entry(e: &str) -> bool {
    e == crate::sched::plan::DEFAULT_ENTRY
}

impl LaunchPlan {
    /// The buffer and byte offset a binding denotes; `None` for a binding the plan does not
    /// have (an input or output index out of range).
    pub fn resolve(&self, b: Binding) -> Option<(BufferRef, usize)> {
        Some(match b {
            Binding::Input { index, elem_offset } => (
                BufferRef::Input(index),
                elem_offset * self.inputs.get(index)?.dtype.bytes(),
            ),
            Binding::Output { index, elem_offset } => (
                BufferRef::Output(index),
                elem_offset * self.outputs.get(index)?.dtype.bytes(),
            ),
            Binding::Workspace {
                byte_offset,
                elem_offset,
                elem_bytes,
            } => (BufferRef::Workspace, byte_offset + elem_offset * elem_bytes),
            Binding::Exchange { rank } if rank < self.gpus && self.exchange_bytes > 0 => {
                (BufferRef::Exchange(rank), 0)
            }
            Binding::Exchange { .. } => return None,
            Binding::Rank => (BufferRef::Rank, 0),
        })
    }

    /// Whether any step calls cuBLAS.
    pub fn uses_cublas(&self) -> bool {
        self.steps.iter().any(|s| matches!(s, Step::Gemm(_)))
    }

    /// Whether the plan runs on several GPUs (its host entry takes an NCCL communicator).
    pub fn uses_nccl(&self) -> bool {
        self.gpus > 1
    }

    /// Whether a kernel performs an all-reduce itself (its host entry takes the exchange
    /// buffers of every GPU).
    pub fn uses_exchange(&self) -> bool {
        self.exchange_bytes > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The runtime's static arrays count against the 48 KB that needs no opt-in: a kernel with
    /// exactly 48 KB of dynamic shared memory opts in (ntrans_bs1 graph 0 once failed to launch
    /// without).
    #[test]
    fn shared_memory_opt_in_counts_the_static_arrays() {
        let k = |dynamic_smem: usize| KernelLaunch {
            name: "k".into(),
            grid: [1, 1, 1],
            block: [128, 1, 1],
            dynamic_smem: dynamic_smem as u32,
            args: Vec::new(),
            tensor_maps: Vec::new(),
            programmatic: false,
        };
        let limit = crate::target::DEFAULT_DYNAMIC_SMEM;
        assert!(k(limit).needs_smem_opt_in());
        assert!(k(limit - crate::target::RUNTIME_STATIC_SMEM + 1).needs_smem_opt_in());
        assert!(!k(limit - crate::target::RUNTIME_STATIC_SMEM).needs_smem_opt_in());
        assert!(!k(0).needs_smem_opt_in());
    }
}
