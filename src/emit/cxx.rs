//! C++ spelling, in one place: element and compute types, literals (finite and infinite),
//! operator calls, layout types, the runtime's constants, and the enumerators of cuBLAS, NCCL
//! and the driver's tensor maps; and [`Writer`], which writes lines at a typed indentation.

use std::fmt::Write as _;

use crate::graph::dtype::DType;
use crate::graph::ops::{BinaryOp, UnaryOp};
use crate::layout::swizzle::Swizzle;

/// The longest line of C++ the emitter writes.
pub const MAX_LINE: usize = 120;

/// A barrier of the block's threads.
pub const BLOCK_BARRIER: &str = "__syncthreads();";

/// The runtime's constant for how a tensor-core matmul operand loads (`mucc::tb::Load`).
pub fn operand_load(l: crate::sched::ops::OperandLoad) -> &'static str {
    use crate::sched::ops::OperandLoad;
    match l {
        OperandLoad::Ldmatrix => "mucc::tb::Load::Ldmatrix",
        OperandLoad::LdmatrixTrans => "mucc::tb::Load::LdmatrixTrans",
        OperandLoad::Pairs => "mucc::tb::Load::Pairs",
        OperandLoad::Elements => "mucc::tb::Load::Elements",
        OperandLoad::Fragment => "mucc::tb::Load::Fragment",
        OperandLoad::WgmmaDescriptor => "mucc::tb::Load::Wgmma",
    }
}

/// cuBLAS's `cudaDataType` enumerator of a matmul's element type.
pub fn cuda_data_type(t: crate::sched::gemm::CudaDataType) -> &'static str {
    use crate::sched::gemm::CudaDataType as T;
    match t {
        T::R16F => "CUDA_R_16F",
        T::R16BF => "CUDA_R_16BF",
        T::R32F => "CUDA_R_32F",
        T::R64F => "CUDA_R_64F",
    }
}

/// cuBLAS's `cublasComputeType_t` enumerator.
pub fn cublas_compute(c: crate::sched::gemm::CublasCompute) -> &'static str {
    use crate::sched::gemm::CublasCompute as C;
    match c {
        C::F32 => "CUBLAS_COMPUTE_32F",
        C::F64 => "CUBLAS_COMPUTE_64F",
    }
}

/// The C++ type of cuBLAS's alpha and beta for an accumulation type.
pub fn cublas_scalar(c: crate::sched::gemm::CublasCompute) -> &'static str {
    use crate::sched::gemm::CublasCompute as C;
    match c {
        C::F32 => "float",
        C::F64 => "double",
    }
}

/// The driver's `CUtensorMapSwizzle` enumerator.
pub fn tensor_map_swizzle(s: crate::sched::tma::TmaSwizzle) -> &'static str {
    use crate::sched::tma::TmaSwizzle as S;
    match s {
        S::None => "CU_TENSOR_MAP_SWIZZLE_NONE",
        S::B32 => "CU_TENSOR_MAP_SWIZZLE_32B",
        S::B64 => "CU_TENSOR_MAP_SWIZZLE_64B",
        S::B128 => "CU_TENSOR_MAP_SWIZZLE_128B",
    }
}

/// The driver's `CUtensorMapDataType` enumerator.
pub fn tensor_map_data_type(t: crate::sched::tma::TmaDataType) -> &'static str {
    use crate::sched::tma::TmaDataType as T;
    match t {
        T::U8 => "CU_TENSOR_MAP_DATA_TYPE_UINT8",
        T::U16 => "CU_TENSOR_MAP_DATA_TYPE_UINT16",
        T::U32 => "CU_TENSOR_MAP_DATA_TYPE_UINT32",
        T::I32 => "CU_TENSOR_MAP_DATA_TYPE_INT32",
        T::U64 => "CU_TENSOR_MAP_DATA_TYPE_UINT64",
        T::I64 => "CU_TENSOR_MAP_DATA_TYPE_INT64",
        T::F16 => "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
        T::F32 => "CU_TENSOR_MAP_DATA_TYPE_FLOAT32",
        T::F64 => "CU_TENSOR_MAP_DATA_TYPE_FLOAT64",
        T::BF16 => "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16",
    }
}

/// NCCL's `ncclDataType_t` enumerator.
pub fn nccl_data_type(t: crate::sched::kernel_level::NcclDataType) -> &'static str {
    use crate::sched::kernel_level::NcclDataType as T;
    match t {
        T::Int8 => "ncclInt8",
        T::Uint8 => "ncclUint8",
        T::Int32 => "ncclInt32",
        T::Uint32 => "ncclUint32",
        T::Int64 => "ncclInt64",
        T::Uint64 => "ncclUint64",
        T::Float16 => "ncclFloat16",
        T::Bfloat16 => "ncclBfloat16",
        T::Float32 => "ncclFloat32",
        T::Float64 => "ncclFloat64",
    }
}

/// The include path of a runtime header the plan asks for.
pub fn runtime_header(h: crate::sched::plan::RuntimeHeader) -> &'static str {
    use crate::sched::plan::RuntimeHeader as H;
    match h {
        H::Hopper => "mucc/arch/sm90.h",
        H::Cluster => "mucc/threadblock/cluster.h",
        H::Nccl => "mucc/nccl.h",
        H::Exchange => "mucc/threadblock/exchange.h",
    }
}

/// The spelling of a type a kernel aliases.
pub fn alias_type(t: &super::ir::AliasType) -> String {
    use super::ir::AliasType;
    match t {
        AliasType::Layout {
            dims,
            strides,
            swizzle,
        } => layout(
            dims,
            strides,
            swizzle.map(|(b, m, s)| Swizzle::Xor { b, m, s }),
        ),
        AliasType::Mma(t) => {
            let keys = t.keys.map_or(String::new(), |k| format!(", {k}"));
            format!(
                "mucc::tb::Mma<{}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}{keys}>",
                ctype(t.dtype),
                t.la,
                t.lb,
                t.mnk.0,
                t.mnk.1,
                t.mnk.2,
                t.warps.0,
                t.warps.1,
                operand_load(t.loads.0),
                operand_load(t.loads.1),
                t.walks.a,
                t.walks.b,
                t.walks.slice_n_tiles
            )
        }
        AliasType::Fma { a, b, la, lb, mnk } => format!(
            "mucc::tb::FmaMatmul<{}, {}, {la}, {lb}, {}, {}, {}>",
            ctype(*a),
            ctype(*b),
            mnk.0,
            mnk.1,
            mnk.2
        ),
    }
}

/// A static member function of the runtime's matmul classes.
pub fn method(m: super::ir::Method) -> &'static str {
    use super::ir::Method as M;
    match m {
        M::Run => "run",
        M::Zero => "zero",
        M::Fill => "fill",
        M::Each => "each",
        M::Apply => "apply",
        M::Pack => "pack",
        M::RowSums => "row_sums",
        M::RunFrom => "run_from",
        M::RunFromKeys => "run_from_keys",
        M::OnlinePack => "online_pack",
        M::ScaleRows => "scale_rows",
        M::EachRow => "each_row",
        M::CombineKeys => "combine_keys",
        M::At => "at",
    }
}

/// A type member of the runtime's matmul classes.
pub fn nested(n: super::ir::Nested) -> &'static str {
    match n {
        super::ir::Nested::Frag => "Frag",
        super::ir::Nested::Packed => "Packed",
    }
}

/// An fp32 constant of the register states' initial values.
pub fn f32_const(c: super::ir::F32Const) -> &'static str {
    match c {
        super::ir::F32Const::Zero => "0.0f",
        super::ir::F32Const::NegInfinity => "-__int_as_float(0x7f800000)",
    }
}

/// The matmul classes' count of fragment rows a thread holds.
pub const FRAGMENT_ROWS: &str = "PM";

/// The runtime's max functor, a template argument of row folds.
pub const MAX_FUNCTOR: &str = "mucc::tb::Max";

/// The runtime's fold of partial accumulators.
pub fn fold(f: super::ir::Fold) -> &'static str {
    match f {
        super::ir::Fold::Sum => "mucc::tb::FoldSum",
        super::ir::Fold::Max => "mucc::tb::FoldMax",
    }
}

/// The storage class of a declaration of [`super::ir`], with its trailing space.
pub fn storage(s: super::ir::Storage) -> &'static str {
    use super::ir::Storage as S;
    match s {
        S::Auto => "",
        S::Static => "static ",
        S::StaticThreadLocal => "static thread_local ",
        S::Shared => "__shared__ ",
    }
}

/// A type of [`super::ir`].
pub fn ir_type(t: super::ir::Ty) -> std::borrow::Cow<'static, str> {
    use super::ir::Ty;
    use crate::sched::gemm::CublasCompute as C;
    let fixed = match t {
        Ty::ConstVoidPtr => "const void*",
        Ty::VoidPtrConst => "void* const",
        Ty::ConstTensorMapPtrConst => "const CUtensorMap* const",
        Ty::ConstU64 => "const cuuint64_t",
        Ty::ConstU64PtrConst => "const cuuint64_t* const",
        Ty::ConstU32 => "const cuuint32_t",
        Ty::AtomicU64 => "std::atomic<unsigned long long>",
        Ty::CachedTensorMap => "mucc::host::CachedTensorMap",
        Ty::CublasHandle => "cublasHandle_t",
        Ty::Int => "int",
        Ty::ConstInt => "const int",
        Ty::ConstCublasScalar(C::F32) => "const float",
        Ty::ConstCublasScalar(C::F64) => "const double",
        Ty::ConstAuto => "const auto",
        Ty::AutoRef => "auto&",
        Ty::ConstI64 => "const mucc::i64",
        Ty::ConstexprI64 => "constexpr mucc::i64",
        Ty::ConstMuccU64 => "const mucc::u64",
        Ty::BytePtrConst => "unsigned char* const",
        Ty::MuccU64Ptr => "mucc::u64*",
        Ty::UnsignedPtr => "unsigned*",
        Ty::Elem(d) => ctype(d),
        Ty::ConstElem(d) => return format!("const {}", ctype(d)).into(),
        Ty::ElemPtr(d) => return format!("{}*", ctype(d)).into(),
        Ty::ConstElemPtr(d) => return format!("const {}*", ctype(d)).into(),
    };
    fixed.into()
}

/// A function of [`super::ir`].
pub fn function(f: super::ir::Func) -> &'static str {
    use super::ir::Func as F;
    match f {
        F::Launch => "mucc::host::launch",
        F::LaunchProgrammatic => "mucc::host::launch_programmatic",
        F::MaxDynamicSmem => "mucc::host::max_dynamic_smem",
        F::TensorMap => "mucc::host::tensor_map",
        F::ValueArg => "mucc::host::value_arg",
        F::CublasHandle => "mucc::host::cublas_handle",
        F::CublasSetStream => "cublasSetStream",
        F::CublasGemmStridedBatched => "cublasGemmStridedBatchedEx",
        F::NcclCommUserRank => "ncclCommUserRank",
        F::NcclAllReduce => "ncclAllReduce",
        F::Dim3 => "dim3",
        F::CastToConstVoidPtr => "reinterpret_cast<const void*>",
        F::CastToU64 => "static_cast<unsigned long long>",
        F::KnUnary => "mucc::kn::unary",
        F::KnBinary => "mucc::kn::binary",
        F::KnCopy => "mucc::kn::copy",
        F::KnReduce => "mucc::kn::reduce",
        F::KnRmsNorm => "mucc::kn::rms_norm",
        F::KnSoftmaxCombine => "mucc::kn::softmax_combine",
        F::CastToInt => "static_cast<int>",
        F::CastToI64 => "static_cast<mucc::i64>",
        F::CastToUnsigned => "static_cast<unsigned>",
        F::TbCopyChunks => "mucc::tb::copy_chunks",
        F::TbCpAsyncChunks => "mucc::tb::cp_async_chunks",
        F::TbCopyElems => "mucc::tb::copy_elems",
        F::CpAsyncCommit => "mucc::sm80::cp_async_commit",
        F::CpAsyncWait => "mucc::sm80::cp_async_wait",
        F::MbarArriveExpectTx => "mucc::sm90::mbar_arrive_expect_tx",
        F::MbarWait => "mucc::sm90::mbar_wait",
        F::TmaLoad => "mucc::sm90::tma_load",
        F::TmaPrefetchL2 => "mucc::sm90::tma_prefetch_l2",
        F::TbLoadRun => "mucc::tb::load_run",
        F::TbStoreRun => "mucc::tb::store_run",
        F::TbBlockSums => "mucc::tb::block_sums",
        F::GridDependencyWait => "mucc::sm90::grid_dependency_wait",
        F::LaunchDependents => "mucc::sm90::launch_dependents",
        F::Trap => "__trap",
        F::CpAsyncWaitAll => "mucc::sm80::cp_async_wait_all",
        F::SmemU32 => "mucc::sm90::smem_u32",
        F::MbarInit => "mucc::sm90::mbar_init",
        F::FenceMbarrierInit => "mucc::sm90::fence_mbarrier_init",
        F::PrefetchTensormap => "mucc::sm90::prefetch_tensormap",
        F::ExchangeEpoch => "mucc::xchg::epoch",
        F::ClusterRank => "mucc::sm90::cluster_rank",
        F::ClusterArriveRelaxed => "mucc::sm90::cluster_arrive_relaxed",
        F::ClusterWait => "mucc::sm90::cluster_wait",
        F::ClusterSync => "mucc::sm90::cluster_sync",
        F::Opaque => "mucc::opaque",
        F::ShflSync => "__shfl_sync",
        F::TbClusterPush => "mucc::tb::cluster_push",
        F::TbClusterFoldPushed => "mucc::tb::cluster_fold_pushed",
        F::TbClusterFold => "mucc::tb::cluster_fold",
        F::TbClusterFoldRescaled => "mucc::tb::cluster_fold_rescaled",
        F::TbForEach => "mucc::tb::for_each",
        F::ToCompute => "mucc::to_compute",
        F::FromCompute => "mucc::from_compute",
        F::TbForEachUnrolled => "mucc::tb::for_each_unrolled",
        F::TbForEachStep => "mucc::tb::for_each_step",
        F::TbForEachRow => "mucc::tb::for_each_row",
        F::TbRmsRows => "mucc::tb::rms_rows",
        F::TbRunningMax => "mucc::tb::running_max",
        F::TbAccAdd => "mucc::tb::acc_add",
        F::TbAccMax => "mucc::tb::acc_max",
        F::TbAccRescale => "mucc::tb::acc_rescale",
        F::TbMaxOf => "mucc::tb::max_of",
        F::TbMaxJoin => "mucc::tb::Max::join",
        F::AtomicAdd => "atomicAdd",
        F::ExpApprox => "mucc::op::exp_approx",
        F::ExpApproxFtz => "mucc::op::exp_approx_ftz",
        F::SiluApprox => "mucc::op::silu_approx",
        F::SigmoidApprox => "mucc::op::sigmoid_approx",
        F::TbFill => "mucc::tb::fill",
        F::TbCopyChunksCvt => "mucc::tb::copy_chunks_cvt",
        F::TbClusterSoftmaxCombine => "mucc::tb::cluster_softmax_combine",
        F::TbArriveLast => "mucc::tb::arrive_last",
        F::TbStorePartial => "mucc::tb::store_partial",
        F::TbFoldPartials => "mucc::tb::fold_partials",
        F::TbCombineSplits => "mucc::tb::combine_splits",
        F::XchgArriveAndSum => "mucc::xchg::arrive_and_sum",
        F::XchgSlot => "mucc::xchg::slot",
        F::XchgCopyLl => "mucc::xchg::copy_ll",
    }
}

/// A method of the host entry's `mucc::host::Buffers`.
pub fn buffer_method(m: super::ir::BufferMethod) -> &'static str {
    use super::ir::BufferMethod as M;
    match m {
        M::Input => "in",
        M::Output => "out",
        M::Workspace => "ws",
    }
}

/// An enumerator or named constant of [`super::ir`].
pub fn symbol(s: super::ir::Sym) -> &'static str {
    use super::ir::Sym;
    match s {
        Sym::Null => "nullptr",
        Sym::CublasOp(false) => "CUBLAS_OP_N",
        Sym::CublasOp(true) => "CUBLAS_OP_T",
        Sym::CublasGemmDefault => "CUBLAS_GEMM_DEFAULT",
        Sym::CudaDataType(t) => cuda_data_type(t),
        Sym::CublasCompute(c) => cublas_compute(c),
        Sym::TensorMapDataType(t) => tensor_map_data_type(t),
        Sym::TensorMapSwizzle(t) => tensor_map_swizzle(t),
        Sym::NcclDataType(t) => nccl_data_type(t),
        Sym::NcclSum => "ncclSum",
        Sym::BlockIdx(0) => "blockIdx.x",
        Sym::BlockIdx(1) => "blockIdx.y",
        Sym::BlockIdx(_) => "blockIdx.z",
        Sym::ThreadIdx(0) => "threadIdx.x",
        Sym::ThreadIdx(1) => "threadIdx.y",
        Sym::ThreadIdx(_) => "threadIdx.z",
        Sym::BlockDim(0) => "blockDim.x",
        Sym::BlockDim(1) => "blockDim.y",
        Sym::BlockDim(_) => "blockDim.z",
        Sym::ExchangeHeader => "mucc::xchg::HEADER",
        Sym::FullWarpMask => "0xffffffffu",
    }
}

/// The suffix of an integer literal of [`super::ir`].
pub fn int_suffix(t: super::ir::IntType) -> &'static str {
    use super::ir::IntType as I;
    match t {
        I::Int => "",
        I::Unsigned => "u",
        I::LongLong => "LL",
        I::UnsignedLongLong => "ull",
    }
}

/// The runtime's checking macro of [`super::ir::Check`].
pub fn check_macro(c: super::ir::Check) -> &'static str {
    use super::ir::Check;
    match c {
        Check::Cuda => "MUCC_CHECK",
        Check::Cublas => "MUCC_CHECK_CUBLAS",
        Check::Nccl => "MUCC_CHECK_NCCL",
    }
}

/// C++ element type of a dtype.
pub fn ctype(d: DType) -> &'static str {
    match d {
        DType::F16 => "mucc::f16",
        DType::BF16 => "mucc::bf16",
        DType::F32 => "float",
        DType::F64 => "double",
        DType::I8 => "mucc::i8",
        DType::U8 => "mucc::u8",
        DType::I16 => "mucc::i16",
        DType::U16 => "mucc::u16",
        DType::I32 => "mucc::i32",
        DType::U32 => "mucc::u32",
        DType::I64 => "mucc::i64",
        DType::U64 => "mucc::u64",
        // Validation rejects these.
        DType::F8 | DType::F4 | DType::I4 | DType::U4 => "void",
    }
}

/// A value of compute type `c` (`float` or `double`) equal to `x`: a literal that reads back as
/// exactly `x`, or the runtime's infinity and NaN helpers.
pub fn number(x: f64, c: &str) -> String {
    if x.is_nan() {
        format!("mucc::nan<{c}>()")
    } else if x == f64::INFINITY {
        format!("mucc::inf<{c}>()")
    } else if x == f64::NEG_INFINITY {
        format!("mucc::neg_inf<{c}>()")
    } else {
        let s = format!("{x:?}");
        let lit = if s.contains('.') || s.contains('e') {
            s
        } else {
            format!("{s}.0")
        };
        format!("{c}({lit})")
    }
}

/// `u(v)` in compute type `c`.
pub fn unary(u: &UnaryOp, v: &str, c: &str) -> String {
    match *u {
        UnaryOp::Exp => format!("mucc::op::exp({v})"),
        UnaryOp::Square => format!("mucc::op::square({v})"),
        UnaryOp::Sqrt => format!("mucc::op::sqrt({v})"),
        UnaryOp::Silu => format!("mucc::op::silu({v})"),
        UnaryOp::Sigmoid => format!("mucc::op::sigmoid({v})"),
        UnaryOp::Gelu => format!("mucc::op::gelu({v})"),
        UnaryOp::Relu => format!("mucc::op::relu({v})"),
        UnaryOp::Log => format!("mucc::op::log({v})"),
        UnaryOp::Clamp { min, max } => {
            format!(
                "mucc::op::clamp({v}, {}, {})",
                number(min, c),
                number(max, c)
            )
        }
        UnaryOp::MulScalar(s) => format!("mucc::op::mul({v}, {})", number(s, c)),
    }
}

/// `b(x, y)`.
pub fn binary(b: BinaryOp, x: &str, y: &str) -> String {
    let f = match b {
        BinaryOp::Add => "add",
        BinaryOp::Sub => "sub",
        BinaryOp::Mul => "mul",
        BinaryOp::Div => "div",
        BinaryOp::Pow => "pow",
    };
    format!("mucc::op::{f}({x}, {y})")
}

/// `a, b, c`.
pub fn list<T: std::fmt::Display>(v: &[T]) -> String {
    let mut s = String::new();
    for (i, x) in v.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        let _ = write!(s, "{x}");
    }
    s
}

/// A compile-time layout type: extents and strides (slowest dim first), optionally XOR-swizzled
/// (other swizzles are in the strides already).
pub fn layout(dims: &[usize], strides: &[usize], swizzle: Option<Swizzle>) -> String {
    let base = format!(
        "mucc::Layout<mucc::Shape<{}>, mucc::Stride<{}>>",
        list(dims),
        list(strides)
    );
    match swizzle {
        Some(Swizzle::Xor { b, m, s }) => {
            format!("mucc::SwizzledLayout<{base}, mucc::Swizzle<{b}, {m}, {s}>>")
        }
        _ => base,
    }
}

/// `text` made safe for one line of a `//` or `/* */` comment, whatever it holds (a file name
/// may hold anything): control characters (line breaks included: `\n`, `\r`, form feed,
/// vertical tab, NEL, U+2028, U+2029), backslashes (a trailing one would continue the comment
/// onto the next line) and `%` are written as `%XX` escapes of their UTF-8 bytes, and so are the
/// `/` of `*/` and the second `?` of `??` (no trigraph). Printable text is kept.
pub fn comment_safe(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut prev = '\0';
    for ch in text.chars() {
        let escape = ch.is_control()
            || matches!(ch, '\\' | '%' | '\u{2028}' | '\u{2029}')
            || (ch == '/' && prev == '*')
            || (ch == '?' && prev == '?');
        if escape {
            let mut buf = [0u8; 4];
            for b in ch.encode_utf8(&mut buf).bytes() {
                let _ = write!(out, "%{b:02X}");
            }
        } else {
            out.push(ch);
        }
        prev = ch;
    }
    out
}

/// `text` as `// ` comment lines of at most `MAX_LINE - indent` characters, broken at spaces
/// (a word longer than a line stays whole).
pub fn comment(text: &str, indent: usize) -> Vec<String> {
    let width = MAX_LINE.saturating_sub(indent + 3).max(20);
    wrap(text, width)
        .into_iter()
        .map(|l| format!("// {l}"))
        .collect()
}

/// `text` in lines of at most `width` bytes (at least one line): broken at spaces, and a word
/// longer than `width` (a long path) broken at character boundaries.
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let width = width.max(8);
    let mut lines = Vec::new();
    let mut cur = String::new();
    for word in text.split(' ') {
        if !cur.is_empty() && cur.len() + 1 + word.len() > width {
            lines.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        for c in word.chars() {
            if cur.len() + c.len_utf8() > width {
                lines.push(std::mem::take(&mut cur));
            }
            cur.push(c);
        }
    }
    if !cur.is_empty() || lines.is_empty() {
        lines.push(cur);
    }
    lines
}

/// A kernel's signature up to the opening brace: on one line when it fits, else one parameter
/// per line.
fn kernel_signature(launch_bounds: &str, name: &str, params: &[String]) -> String {
    let head = format!("extern \"C\" __global__ void __launch_bounds__({launch_bounds}) {name}(");
    signature(head, params)
}

/// A kernel's parameter in element type `t`.
pub fn kernel_param(p: super::ir::KernelParam, t: DType) -> String {
    use super::ir::KernelParam as P;
    let t = ctype(t);
    let written = |w: bool| if w { "" } else { "const " };
    match p {
        P::View { index, written: w } => format!("{}{t}* __restrict__ v{index}", written(w)),
        P::Whole { written: w } => format!("{}{t}* __restrict__ whole", written(w)),
        P::Part { index, written: w } => format!("{}{t}* __restrict__ p{index}", written(w)),
        P::Output(j) => format!("{t}* __restrict__ out{j}"),
        P::Input(i) => format!("const {t}* __restrict__ in{i}"),
        P::CombineOutput => format!("{t}* __restrict__ ycomb"),
        P::ArrivalCounters => "unsigned* __restrict__ arrivals".into(),
        P::SplitSlots => "unsigned char* __restrict__ slots".into(),
        P::ExchangeResult => format!("{t}* xrecv"),
        P::ExchangeBuffer(r) => format!("unsigned char* x{r}"),
        P::Rank => "unsigned long long xrank".into(),
        P::TensorMap(m) => format!("const __grid_constant__ mucc::sm90::TensorMap tm{m}"),
    }
}

/// A kernel's signature up to the opening brace.
pub fn typed_kernel_signature(name: &str, s: &super::ir::Signature) -> String {
    let bounds = match s.bounds {
        (threads, Some(blocks)) => format!("{threads}, {blocks}"),
        (threads, None) => threads.to_string(),
    };
    let params: Vec<String> = s.params.iter().map(|p| kernel_param(*p, s.elem)).collect();
    match s.cluster {
        Some(dims) => cluster_kernel_signature(dims, &bounds, name, &params),
        None => kernel_signature(&bounds, name, &params),
    }
}

/// [`kernel_signature`] of a kernel launched as clusters of `dims` CTAs (`__cluster_dims__`:
/// the launch needs no cluster attribute).
fn cluster_kernel_signature(
    dims: [usize; 3],
    launch_bounds: &str,
    name: &str,
    params: &[String],
) -> String {
    let [x, y, z] = dims;
    let head = format!(
        "extern \"C\" __global__ void __cluster_dims__({x}, {y}, {z}) __launch_bounds__({launch_bounds}) {name}("
    );
    signature(head, params)
}

/// The host entry's signature up to the opening brace (lines at level 0): the parameters
/// continue under the parenthesis when the first line fits, else on the next line. `nccl`:
/// the graph runs on several GPUs and the entry takes the caller's NCCL communicator;
/// `exchange`: a kernel performs an all-reduce and the entry also takes every GPU's exchange
/// buffer.
pub fn host_entry_signature(entry: &str, nccl: bool, exchange: bool) -> String {
    let head = format!("extern \"C\" int {entry}(");
    let last = match (nccl, exchange) {
        (true, true) => "void* const* exchange, ncclComm_t comm, cudaStream_t stream) {",
        (true, false) => "ncclComm_t comm, cudaStream_t stream) {",
        _ => "cudaStream_t stream) {",
    };
    let first = format!("{head}const void* const* inputs, void* const* outputs, void* workspace,");
    if first.len() <= MAX_LINE {
        format!("{first}\n{}{last}", " ".repeat(head.len()))
    } else {
        let rest =
            format!("const void* const* inputs, void* const* outputs, void* workspace, {last}");
        if rest.len() + 4 <= MAX_LINE {
            format!("{head}\n    {rest}")
        } else {
            format!(
                "{head}\n    const void* const* inputs, void* const* outputs, void* workspace,\n    {last}"
            )
        }
    }
}

fn signature(head: String, params: &[String]) -> String {
    let one = format!("{head}{}) {{", params.join(", "));
    if one.len() <= MAX_LINE {
        return one;
    }
    let mut s = head;
    for (i, p) in params.iter().enumerate() {
        let sep = if i + 1 < params.len() { "," } else { ") {" };
        let _ = write!(s, "\n    {p}{sep}");
    }
    s
}

/// Lines of C++ at an indentation level (two spaces per level).
#[derive(Debug, Default)]
pub struct Writer {
    out: String,
    level: usize,
}

impl Writer {
    /// An empty writer at level 0.
    pub fn new() -> Writer {
        Writer::default()
    }

    /// A writer whose lines start at `level`.
    pub fn at(level: usize) -> Writer {
        Writer {
            out: String::new(),
            level,
        }
    }

    /// One line; a statement longer than [`MAX_LINE`] with its indentation is broken after
    /// commas (or before a `+`), its continuation lines indented two levels deeper.
    pub fn line(&mut self, text: impl AsRef<str>) {
        let text = text.as_ref();
        if text.is_empty() {
            self.out.push('\n');
            return;
        }
        let indent = 2 * self.level;
        if indent + text.len() <= MAX_LINE || text.starts_with("//") || text.starts_with('#') {
            self.raw(indent, text);
            return;
        }
        let mut rest = text;
        let mut first = true;
        while !rest.is_empty() {
            let ind = if first { indent } else { indent + 4 };
            let room = MAX_LINE.saturating_sub(ind);
            if rest.len() <= room {
                self.raw(ind, rest);
                break;
            }
            // The last ", " that keeps the line within its room, else the last " + ", else the
            // first of either.
            let mut end = room;
            while !rest.is_char_boundary(end) {
                end -= 1;
            }
            let head = &rest[..end];
            let cut = head
                .rfind(", ")
                .map(|i| i + 1)
                .or_else(|| head.rfind(" + "))
                .or_else(|| rest.find(", ").map(|i| i + 1))
                .or_else(|| rest.find(" + "));
            match cut {
                Some(i) => {
                    self.raw(ind, &rest[..i]);
                    rest = rest[i..].trim_start();
                }
                None => {
                    self.raw(ind, rest);
                    break;
                }
            }
            first = false;
        }
    }

    fn raw(&mut self, indent: usize, text: &str) {
        for _ in 0..indent {
            self.out.push(' ');
        }
        self.out.push_str(text);
        self.out.push('\n');
    }

    /// `head {`, then one level deeper.
    pub fn open(&mut self, head: impl AsRef<str>) {
        let head = head.as_ref();
        if head.is_empty() {
            self.line("{");
        } else {
            self.line(format!("{head} {{"));
        }
        self.level += 1;
    }

    /// One level up, then `}` followed by `tail` (`;`, `);`, `  // …`).
    pub fn close(&mut self, tail: impl AsRef<str>) {
        self.level = self.level.saturating_sub(1);
        self.line(format!("}}{}", tail.as_ref()));
    }

    /// `head {`, the lines `body` writes one level deeper, `}` + `tail`.
    pub fn block(&mut self, head: impl AsRef<str>, tail: &str, body: impl FnOnce(&mut Writer)) {
        self.open(head);
        body(self);
        self.close(tail);
    }

    /// The lines `body` writes, one level deeper, without braces (continuation lines).
    pub fn indented(&mut self, body: impl FnOnce(&mut Writer)) {
        self.level += 1;
        body(self);
        self.level -= 1;
    }

    /// The lines written so far.
    pub fn finish(self) -> String {
        self.out
    }

    /// The current level.
    pub fn level(&self) -> usize {
        self.level
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_breaks_at_spaces_and_inside_long_words() {
        assert_eq!(wrap("", 20), [""]);
        assert_eq!(wrap("a bc defg", 8), ["a bc", "defg"]);
        let path = format!("source: /{}/x.json, graph 3", "d".repeat(30));
        let lines = wrap(&path, 12);
        assert!(lines.iter().all(|l| l.len() <= 12), "{lines:?}");
        assert_eq!(lines.concat().replace(' ', ""), path.replace(' ', ""));
        assert!(wrap("µµµµµµµµµµ", 9).iter().all(|l| l.len() <= 9));
        assert!(
            comment(&"w ".repeat(200), 4)
                .iter()
                .all(|l| l.len() + 4 <= MAX_LINE)
        );
    }

    #[test]
    fn numbers_read_back_exactly_and_infinities_are_c_plus_plus() {
        assert_eq!(number(2.0, "float"), "float(2.0)");
        assert_eq!(number(0.1, "double"), "double(0.1)");
        assert_eq!(number(1e-30, "float"), "float(1e-30)");
        assert_eq!(number(f64::NEG_INFINITY, "float"), "mucc::neg_inf<float>()");
        assert_eq!(number(f64::INFINITY, "double"), "mucc::inf<double>()");
        assert_eq!(number(f64::NAN, "float"), "mucc::nan<float>()");
        let clamp = UnaryOp::Clamp {
            min: f64::NEG_INFINITY,
            max: 6.0,
        };
        assert_eq!(
            unary(&clamp, "v", "float"),
            "mucc::op::clamp(v, mucc::neg_inf<float>(), float(6.0))"
        );
    }

    #[test]
    fn comment_text_cannot_end_or_continue_a_comment() {
        let hostile = "pwn\n__attribute__((constructor)) static void f(void){}\r#define X */ \\\u{2028}??/ 100%";
        let safe = comment_safe(hostile);
        assert!(!safe.contains(['\n', '\r', '\\', '\u{2028}']), "{safe}");
        assert!(!safe.contains("*/") && !safe.contains("??"), "{safe}");
        assert_eq!(
            safe,
            "pwn%0A__attribute__((constructor)) static void f(void){}%0D#define X *%2F %5C%E2%80%A8?%3F/ 100%25"
        );
        assert_eq!(
            comment_safe("gated_mlp.json, graph 3"),
            "gated_mlp.json, graph 3"
        );
    }

    #[test]
    fn comments_wrap_and_signatures_break() {
        let long = "word ".repeat(40);
        for l in comment(long.trim(), 4) {
            assert!(l.len() + 4 <= MAX_LINE && l.starts_with("// "), "{l}");
        }
        let params: Vec<String> = (0..6)
            .map(|i| format!("const mucc::f16* __restrict__ in{i}"))
            .collect();
        let sig = kernel_signature("128, 1", "k3_customized", &params);
        assert!(sig.lines().all(|l| l.len() <= MAX_LINE), "{sig}");
        assert!(sig.ends_with("in5) {"));
        let short = kernel_signature("256", "k1_exp", &params[..1]);
        assert_eq!(short.lines().count(), 1);
    }

    #[test]
    fn long_statements_break_after_commas() {
        let mut w = Writer::at(2);
        let args: Vec<String> = (0..30).map(|i| format!("argument_{i}")).collect();
        w.line(format!("f({});", args.join(", ")));
        let text = w.finish();
        assert!(text.lines().count() > 1);
        assert!(text.lines().all(|l| l.len() <= MAX_LINE), "{text}");
        let joined: String = text.lines().map(str::trim).collect::<Vec<_>>().join(" ");
        assert_eq!(joined, format!("f({});", args.join(", ")));
    }

    #[test]
    fn writer_indents_blocks() {
        let mut w = Writer::new();
        w.block("for (int i = 0; i < 4; ++i)", "", |w| {
            w.line("f(i);");
            w.block("", "", |w| w.line("g();"));
        });
        assert_eq!(
            w.finish(),
            "for (int i = 0; i < 4; ++i) {\n  f(i);\n  {\n    g();\n  }\n}\n"
        );
    }
}
