//! The launch plan: everything a runner needs to execute the generated code without its host
//! entry (NVRTC compiles no host code): kernels with their launch configurations and argument
//! bindings, cuBLAS calls, the buffers of inputs and outputs, and the workspace size.

use serde::Serialize;

/// A buffer a kernel argument or cuBLAS operand points into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "buffer", rename_all = "snake_case")]
pub enum Binding {
    /// Caller input `index`, plus `elem_offset` elements.
    Input {
        /// Input index.
        index: usize,
        /// Offset in elements.
        elem_offset: usize,
    },
    /// Caller output `index`, plus `elem_offset` elements.
    Output {
        /// Output index.
        index: usize,
        /// Offset in elements.
        elem_offset: usize,
    },
    /// The workspace at `byte_offset` bytes, plus `elem_offset` elements of `elem_bytes` bytes.
    Workspace {
        /// Offset of the tensor in bytes.
        byte_offset: usize,
        /// Offset in elements.
        elem_offset: usize,
        /// Bytes per element of the tensor.
        elem_bytes: usize,
    },
}

impl Binding {
    /// The same buffer, `extra` elements further.
    pub fn offset_by(self, extra: usize) -> Binding {
        match self {
            Binding::Input { index, elem_offset } => Binding::Input {
                index,
                elem_offset: elem_offset + extra,
            },
            Binding::Output { index, elem_offset } => Binding::Output {
                index,
                elem_offset: elem_offset + extra,
            },
            Binding::Workspace {
                byte_offset,
                elem_offset,
                elem_bytes,
            } => Binding::Workspace {
                byte_offset,
                elem_offset: elem_offset + extra,
                elem_bytes,
            },
        }
    }
}

/// One kernel launch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
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
}

/// One `cublasGemmStridedBatchedEx` call (column-major, as cuBLAS sees it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
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
    /// `cudaDataType` name of A, B and C (`CUDA_R_16F`, …).
    pub data_type: &'static str,
    /// `cublasComputeType_t` name (`CUBLAS_COMPUTE_32F`, …).
    pub compute_type: &'static str,
}

/// A step of the plan, in execution order on one stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Step {
    /// Launch a kernel of the generated module.
    Kernel(KernelLaunch),
    /// Call cuBLAS.
    Gemm(GemmCall),
}

/// Shape and memory of a caller buffer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TensorDirective {
    /// Logical shape.
    pub shape: Vec<usize>,
    /// Element strides.
    pub strides: Vec<usize>,
    /// Elements to allocate.
    pub alloc_elems: usize,
    /// Element type (`f16`, …).
    pub dtype: String,
}

/// The launch plan of a generated file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LaunchPlan {
    /// Target architecture.
    pub arch: String,
    /// Inputs in order.
    pub inputs: Vec<TensorDirective>,
    /// Outputs in order.
    pub outputs: Vec<TensorDirective>,
    /// Workspace bytes (128-byte aligned offsets inside).
    pub workspace_bytes: usize,
    /// Steps in order.
    pub steps: Vec<Step>,
}
