//! Tensor maps of TMA loads: the driver's `CUtensorMap` of each planned load, encoded over the
//! buffer its binding denotes.

use super::{Bufs, Gpu, Program, RunError, driver};
use crate::emit::launch::TensorMapSpec;

/// A `CUtensorMap` passed by value as a kernel parameter (`__grid_constant__`).
#[repr(transparent)]
pub(super) struct TensorMapArg(cudarc::driver::sys::CUtensorMap);

impl Gpu {
    /// Encodes the tensor map `m` of kernel `kernel` over the buffer its binding denotes.
    pub(super) fn tensor_map(
        &self,
        prog: &Program,
        bufs: Bufs<'_>,
        m: &TensorMapSpec,
        kernel: &str,
    ) -> Result<TensorMapArg, RunError> {
        use cudarc::driver::sys;
        let addr = self.address(prog, bufs, m.binding)?;
        let bad = |why: String| RunError::Plan(format!("tensor map of {kernel}: {why}"));
        let rank = m.dims.len();
        if rank == 0
            || rank > crate::sched::tma::TMA_MAX_RANK
            || m.strides.len() + 1 != rank
            || m.boxes.len() != rank
        {
            return Err(bad(format!("malformed ({rank} dims)")));
        }
        if !addr.is_multiple_of(16) {
            return Err(bad(format!(
                "the tensor's address {addr:#x} is not 16-byte aligned"
            )));
        }
        use crate::sched::tma::TmaDataType as T;
        use sys::CUtensorMapDataType as D;
        let dtype = match m.data_type {
            T::U8 => D::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            T::U16 => D::CU_TENSOR_MAP_DATA_TYPE_UINT16,
            T::U32 => D::CU_TENSOR_MAP_DATA_TYPE_UINT32,
            T::I32 => D::CU_TENSOR_MAP_DATA_TYPE_INT32,
            T::U64 => D::CU_TENSOR_MAP_DATA_TYPE_UINT64,
            T::I64 => D::CU_TENSOR_MAP_DATA_TYPE_INT64,
            T::F16 => D::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            T::F32 => D::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
            T::F64 => D::CU_TENSOR_MAP_DATA_TYPE_FLOAT64,
            T::BF16 => D::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        };
        use sys::CUtensorMapSwizzle as S;
        let swizzle = match m.swizzle {
            crate::sched::tma::TmaSwizzle::None => S::CU_TENSOR_MAP_SWIZZLE_NONE,
            crate::sched::tma::TmaSwizzle::B32 => S::CU_TENSOR_MAP_SWIZZLE_32B,
            crate::sched::tma::TmaSwizzle::B64 => S::CU_TENSOR_MAP_SWIZZLE_64B,
            crate::sched::tma::TmaSwizzle::B128 => S::CU_TENSOR_MAP_SWIZZLE_128B,
        };
        let ones = [1u32; 5];
        let mut map = TensorMapArg(sys::CUtensorMap { opaque: [0; 16] });
        // SAFETY: every array holds `rank` entries (strides rank − 1), as the driver reads them;
        // `map` is a 64-byte aligned CUtensorMap the call writes; the enums are the driver's
        // values.
        let r = unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map.0,
                dtype,
                rank as u32,
                addr as *mut std::ffi::c_void,
                m.dims.as_ptr(),
                m.strides.as_ptr(),
                m.boxes.as_ptr(),
                ones.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                swizzle,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        r.result()
            .map_err(driver(format!("encoding a tensor map of {kernel}")))?;
        Ok(map)
    }
}
