//! cuBLAS: the handle of a GPU (created once, with a workspace of its own, bound to the
//! caller's stream per call) and the plan's batched GEMM steps.

use cudarc::driver::{CudaSlice, DevicePtr};

use super::{Bufs, CUBLAS_WORKSPACE_BYTES, Gpu, Program, RunError, driver};
use crate::emit::launch::{CublasCompute, CudaDataType, GemmCall};

/// A cuBLAS handle on the GPU's stream with a workspace of its own, so that its calls need no
/// allocation (and can be captured in a CUDA graph).
pub(crate) struct Blas {
    pub(crate) handle: cudarc::cublas::CudaBlas,
    _workspace: CudaSlice<u8>,
    /// The workspace's device address (set again whenever the handle changes stream:
    /// `cublasSetStream` resets it to cuBLAS's own pool, which is not capturable).
    workspace_ptr: u64,
    /// The address of the stream the handle is bound to now; held while a call is queued, so
    /// that threads queueing on different streams take turns.
    bound: std::sync::Mutex<usize>,
}

/// One cuBLAS product, column-major as cuBLAS counts: for each of `batch` matrices,
/// C = op(A)·op(B) with alpha 1 and beta 0 in the compute type's precision. Addresses are
/// device pointers.
pub(crate) struct Product {
    pub(crate) trans_a: bool,
    pub(crate) trans_b: bool,
    pub(crate) m: i32,
    pub(crate) n: i32,
    pub(crate) k: i32,
    pub(crate) a: u64,
    pub(crate) lda: i32,
    pub(crate) stride_a: i64,
    pub(crate) b: u64,
    pub(crate) ldb: i32,
    pub(crate) stride_b: i64,
    pub(crate) c: u64,
    pub(crate) ldc: i32,
    pub(crate) stride_c: i64,
    pub(crate) batch: i32,
    pub(crate) data_type: cudarc::cublas::sys::cudaDataType,
    pub(crate) compute: cudarc::cublas::sys::cublasComputeType_t,
}

impl Blas {
    /// Queues `p` on `stream` (the one place mucc calls cuBLAS's matrix product) and returns
    /// cuBLAS's status.
    ///
    /// # Safety
    /// `p`'s addresses must point into live device buffers large enough for its dimensions,
    /// leading dimensions, strides and batch, until the product has run.
    pub(crate) unsafe fn product(
        &self,
        p: &Product,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<cudarc::cublas::sys::cublasStatus_t, RunError> {
        use cudarc::cublas::sys;
        let _bound = self.bind(stream)?;
        let (one64, zero64, one32, zero32) = (1.0f64, 0.0f64, 1.0f32, 0.0f32);
        let (alpha, beta): (*const std::ffi::c_void, *const std::ffi::c_void) =
            if p.compute == sys::cublasComputeType_t::CUBLAS_COMPUTE_64F {
                (
                    (&one64 as *const f64).cast(),
                    (&zero64 as *const f64).cast(),
                )
            } else {
                (
                    (&one32 as *const f32).cast(),
                    (&zero32 as *const f32).cast(),
                )
            };
        let op = |t: bool| {
            if t {
                sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        // SAFETY: the handle is bound to this stream; the caller vouches for the operands;
        // alpha/beta outlive the call (cuBLAS reads host scalars before returning).
        Ok(unsafe {
            sys::cublasGemmStridedBatchedEx(
                *self.handle.handle(),
                op(p.trans_a),
                op(p.trans_b),
                p.m,
                p.n,
                p.k,
                alpha,
                p.a as *const std::ffi::c_void,
                p.data_type,
                p.lda,
                p.stride_a,
                p.b as *const std::ffi::c_void,
                p.data_type,
                p.ldb,
                p.stride_b,
                beta,
                p.c as *mut std::ffi::c_void,
                p.data_type,
                p.ldc,
                p.stride_c,
                p.batch,
                p.compute,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        })
    }

    /// Binds the handle to `stream` (and sets its workspace again) unless it is bound to it;
    /// the guard keeps it bound until the caller has queued its call.
    pub(super) fn bind(
        &self,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<std::sync::MutexGuard<'_, usize>, RunError> {
        use cudarc::cublas::sys;
        let mut bound = self.bound.lock().unwrap_or_else(|e| e.into_inner());
        if *bound == stream as usize {
            return Ok(bound);
        }
        let check = |status: sys::cublasStatus_t, what: &str| {
            if status == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                Ok(())
            } else {
                Err(RunError::Cublas {
                    what: what.into(),
                    status: format!("{status:?}"),
                })
            }
        };
        // SAFETY: the handle is live; the stream is the caller's (see `Gpu::execute_raw`); the
        // workspace lives as long as the handle.
        unsafe {
            check(
                sys::cublasSetStream_v2(*self.handle.handle(), stream as sys::cudaStream_t),
                "binding the cuBLAS handle to the caller's stream",
            )?;
            check(
                sys::cublasSetWorkspace_v2(
                    *self.handle.handle(),
                    self.workspace_ptr as *mut std::ffi::c_void,
                    CUBLAS_WORKSPACE_BYTES,
                ),
                "setting the cuBLAS workspace",
            )?;
        }
        *bound = stream as usize;
        Ok(bound)
    }
}

/// cuBLAS's `cudaDataType` for a plan's element type.
pub(crate) fn cuda_data_type(t: CudaDataType) -> cudarc::cublas::sys::cudaDataType {
    use cudarc::cublas::sys::cudaDataType as D;
    match t {
        CudaDataType::R16F => D::CUDA_R_16F,
        CudaDataType::R16BF => D::CUDA_R_16BF,
        CudaDataType::R32F => D::CUDA_R_32F,
        CudaDataType::R64F => D::CUDA_R_64F,
    }
}

/// cuBLAS's `cublasComputeType_t` for a plan's compute type.
pub(crate) fn compute_type(t: CublasCompute) -> cudarc::cublas::sys::cublasComputeType_t {
    use cudarc::cublas::sys::cublasComputeType_t as C;
    match t {
        CublasCompute::F32 => C::CUBLAS_COMPUTE_32F,
        CublasCompute::F64 => C::CUBLAS_COMPUTE_64F,
    }
}

impl Gpu {
    /// Creates the cuBLAS handle (once), bound to the GPU's stream and given its own workspace.
    pub(crate) fn ensure_blas(&mut self) -> Result<(), RunError> {
        if self.blas.is_some() {
            return Ok(());
        }
        // SAFETY: only probes for the library.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(RunError::NoCublas);
        }
        let handle =
            cudarc::cublas::CudaBlas::new(self.stream.clone()).map_err(|e| RunError::Cublas {
                what: "creating a cuBLAS handle".into(),
                status: format!("{e:?}"),
            })?;
        let workspace = self
            .stream
            .alloc_zeros::<u8>(CUBLAS_WORKSPACE_BYTES)
            .map_err(driver("allocating the cuBLAS workspace"))?;
        let ptr = {
            let (p, _sync) = workspace.device_ptr(&self.stream);
            p
        };
        // SAFETY: the workspace lives as long as the handle (both in `Blas`).
        let status = unsafe {
            cudarc::cublas::sys::cublasSetWorkspace_v2(
                *handle.handle(),
                ptr as *mut std::ffi::c_void,
                CUBLAS_WORKSPACE_BYTES,
            )
        };
        if status != cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(RunError::Cublas {
                what: "setting the cuBLAS workspace".into(),
                status: format!("{status:?}"),
            });
        }
        self.blas = Some(Blas {
            handle,
            _workspace: workspace,
            workspace_ptr: ptr,
            bound: std::sync::Mutex::new(self.stream.cu_stream() as usize),
        });
        Ok(())
    }

    pub(super) fn gemm(
        &self,
        prog: &Program,
        bufs: Bufs<'_>,
        g: &GemmCall,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<(), RunError> {
        let b = self
            .blas
            .as_ref()
            .expect("created in load for plans with gemms");
        let product = Product {
            trans_a: g.trans_a,
            trans_b: g.trans_b,
            m: g.m,
            n: g.n,
            k: g.k,
            a: self.address(prog, bufs, g.a)?,
            lda: g.lda,
            stride_a: g.stride_a,
            b: self.address(prog, bufs, g.b)?,
            ldb: g.ldb,
            stride_b: g.stride_b,
            c: self.address(prog, bufs, g.c)?,
            ldc: g.ldc,
            stride_c: g.stride_c,
            batch: g.batch,
            data_type: cuda_data_type(g.data_type),
            compute: compute_type(g.compute_type),
        };
        // SAFETY: the operands point into live buffers of the sizes the plan computed for these
        // dimensions and strides.
        let status = unsafe { b.product(&product, stream)? };
        if status != cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(RunError::Cublas {
                what: format!("gemm {}x{}x{} (batch {})", g.m, g.n, g.k, g.batch),
                status: format!("{status:?}"),
            });
        }
        Ok(())
    }
}
