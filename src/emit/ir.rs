//! A typed form of generated C++: statements and expressions that the emitter builds and
//! [`print()`] writes, with every spelling (types, functions, enumerators, check macros) taken
//! from [`super::cxx`]. Tests compare what the emitter built by structure instead of grepping
//! its text.
//!
//! The host entry's steps ([`super::host`]), the kernel-level operators' kernels, the
//! register-rows kernels and the threadblock kernels' pipeline rings are built in this form.

use std::fmt::{self, Write as _};

use super::cxx::{self, Writer};
use crate::graph::DType;
use crate::graph::ops::{BinaryOp, UnaryOp};
use crate::layout::swizzle::Swizzle;
use crate::sched::ops::{MatmulWalks, OperandLoad};
use crate::sched::order::BarrierReason;

/// A C++ type the generated code declares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    /// `const void*`.
    ConstVoidPtr,
    /// `void* const`.
    VoidPtrConst,
    /// `const CUtensorMap* const`.
    ConstTensorMapPtrConst,
    /// `const cuuint64_t`.
    ConstU64,
    /// `const cuuint64_t* const`.
    ConstU64PtrConst,
    /// `const cuuint32_t`.
    ConstU32,
    /// `std::atomic<unsigned long long>`.
    AtomicU64,
    /// `mucc::host::CachedTensorMap`.
    CachedTensorMap,
    /// `cublasHandle_t`.
    CublasHandle,
    /// `int`.
    Int,
    /// `const int`.
    ConstInt,
    /// A scalar of cuBLAS's compute type, `const`.
    ConstCublasScalar(crate::sched::gemm::CublasCompute),
    /// An element type (a compute type too: `float`, `double`).
    Elem(DType),
    /// `const` element type.
    ConstElem(DType),
    /// Pointer to elements.
    ElemPtr(DType),
    /// Pointer to `const` elements.
    ConstElemPtr(DType),
    /// `const auto`.
    ConstAuto,
    /// `auto&`: another name of an existing variable.
    AutoRef,
    /// `const mucc::i64`: a 64-bit element offset.
    ConstI64,
    /// `constexpr mucc::i64`.
    ConstexprI64,
    /// `const mucc::u64`.
    ConstMuccU64,
    /// `unsigned char* const`: a byte address in shared memory or a peer's buffer.
    BytePtrConst,
    /// `mucc::u64*`: mbarriers in shared memory.
    MuccU64Ptr,
    /// `unsigned*`.
    UnsignedPtr,
}

/// Where a declared variable lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    /// A local.
    Auto,
    /// `static`.
    Static,
    /// `static thread_local`.
    StaticThreadLocal,
    /// `__shared__`: the block's static shared memory.
    Shared,
}

/// A function (or function-like construct) the generated code calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Func {
    /// `mucc::host::launch`: a kernel launch.
    Launch,
    /// `mucc::host::launch_programmatic`: a launch that may start before its predecessor ends.
    LaunchProgrammatic,
    /// `mucc::host::max_dynamic_smem`: the dynamic shared-memory opt-in, once per device.
    MaxDynamicSmem,
    /// `mucc::host::tensor_map`: encodes a cached tensor map.
    TensorMap,
    /// `mucc::host::value_arg`: a kernel argument passed by value.
    ValueArg,
    /// `mucc::host::cublas_handle`: the calling thread's cuBLAS handle.
    CublasHandle,
    /// `cublasSetStream`.
    CublasSetStream,
    /// `cublasGemmStridedBatchedEx`.
    CublasGemmStridedBatched,
    /// `ncclCommUserRank`.
    NcclCommUserRank,
    /// `ncclAllReduce`.
    NcclAllReduce,
    /// `dim3`.
    Dim3,
    /// `reinterpret_cast<const void*>`.
    CastToConstVoidPtr,
    /// `static_cast<unsigned long long>`.
    CastToU64,
    /// `mucc::kn::unary`: an element-wise kernel of one input.
    KnUnary,
    /// `mucc::kn::binary`: an element-wise kernel of two inputs.
    KnBinary,
    /// `mucc::kn::copy`: a copy between two views.
    KnCopy,
    /// `mucc::kn::reduce`: a sum or max over one dimension.
    KnReduce,
    /// `mucc::kn::rms_norm`: rows divided by their root mean square.
    KnRmsNorm,
    /// `mucc::kn::softmax_combine`: split attention's partial results combined.
    KnSoftmaxCombine,
    /// `static_cast<int>`.
    CastToInt,
    /// `static_cast<mucc::i64>`: 64-bit element offsets.
    CastToI64,
    /// `static_cast<unsigned>`.
    CastToUnsigned,
    /// `mucc::tb::copy_chunks`: a tile copied by 16-byte (or narrower) chunks.
    TbCopyChunks,
    /// `mucc::tb::cp_async_chunks`: the same by `cp.async`.
    TbCpAsyncChunks,
    /// `mucc::tb::copy_elems`: a tile copied element by element.
    TbCopyElems,
    /// `mucc::sm80::cp_async_commit`: closes a group of `cp.async` copies.
    CpAsyncCommit,
    /// `mucc::sm80::cp_async_wait`: waits until at most N groups are pending.
    CpAsyncWait,
    /// `mucc::sm90::mbar_arrive_expect_tx`: announces a stage's bytes on its mbarrier.
    MbarArriveExpectTx,
    /// `mucc::sm90::mbar_wait`: waits for an mbarrier's phase.
    MbarWait,
    /// `mucc::sm90::tma_load`: a bulk tensor load completing on an mbarrier.
    TmaLoad,
    /// `mucc::sm90::tma_prefetch_l2`: a bulk tensor prefetch of one box into L2.
    TmaPrefetchL2,
    /// `mucc::tb::load_run`: one run of a row into registers (16 bytes where it can).
    TbLoadRun,
    /// `mucc::tb::store_run`: one run of registers to a row.
    TbStoreRun,
    /// `mucc::tb::block_sums`: per-row sums over the block (one barrier).
    TbBlockSums,
    /// `mucc::sm90::grid_dependency_wait`: waits for the previous kernel's results.
    GridDependencyWait,
    /// `mucc::sm90::launch_dependents`: lets the next kernel launch.
    LaunchDependents,
    /// `__trap`.
    Trap,
    /// `mucc::sm80::cp_async_wait_all`: waits for every `cp.async` copy of the thread.
    CpAsyncWaitAll,
    /// `mucc::sm90::smem_u32`: a shared-memory address as the 32-bit value PTX takes.
    SmemU32,
    /// `mucc::sm90::mbar_init`: initialises an mbarrier for N arrivals.
    MbarInit,
    /// `mucc::sm90::fence_mbarrier_init`: makes initialised mbarriers visible to the copy engine
    /// and the cluster.
    FenceMbarrierInit,
    /// `mucc::sm90::prefetch_tensormap`: brings a tensor map's descriptor into the cache.
    PrefetchTensormap,
    /// `mucc::xchg::epoch`: the epoch of this execution of a fused all-reduce.
    ExchangeEpoch,
    /// `mucc::sm90::cluster_rank`: this CTA's rank in its cluster.
    ClusterRank,
    /// `mucc::sm90::cluster_arrive_relaxed`: arrives at the cluster barrier without ordering.
    ClusterArriveRelaxed,
    /// `mucc::sm90::cluster_wait`: waits at the cluster barrier.
    ClusterWait,
    /// `mucc::sm90::cluster_sync`: a cluster barrier, arrive and wait.
    ClusterSync,
    /// `mucc::opaque`: a value the compiler may not see through (kept in a register).
    Opaque,
    /// `__shfl_sync`: a value from another lane of the warp.
    ShflSync,
    /// `mucc::tb::cluster_push`: a CTA's partial tile stored into CTA 0's slot.
    TbClusterPush,
    /// `mucc::tb::cluster_fold_pushed`: CTA 0 folds the pushed partials into its tile.
    TbClusterFoldPushed,
    /// `mucc::tb::cluster_fold`: CTA 0 folds its peers' partial tiles (distributed shared
    /// memory).
    TbClusterFold,
    /// `mucc::tb::cluster_fold_rescaled`: the same for online-softmax partials.
    TbClusterFoldRescaled,
    /// `mucc::tb::for_each`: the block's threads share a tile's elements.
    TbForEach,
    /// `mucc::to_compute`: a stored value in its compute type.
    ToCompute,
    /// `mucc::from_compute`: a computed value in a stored type.
    FromCompute,
    /// `mucc::tb::for_each_unrolled`: [`Func::TbForEach`] with the per-thread register slot
    /// of each element a compile-time index.
    TbForEachUnrolled,
    /// `mucc::tb::for_each_step`: the block's threads share a tile's runs of consecutive
    /// elements.
    TbForEachStep,
    /// `mucc::tb::for_each_row`: rows of a tile summed (or folded) by groups of threads.
    TbForEachRow,
    /// `mucc::tb::rms_rows`: rows of rms_norm, normalised values and row totals.
    TbRmsRows,
    /// `mucc::tb::running_max`: a running max over the iterations and its change.
    TbRunningMax,
    /// `mucc::tb::acc_add`: adds into a shared-memory accumulator element.
    TbAccAdd,
    /// `mucc::tb::acc_max`: the maximum into a shared-memory accumulator element.
    TbAccMax,
    /// `mucc::tb::acc_rescale`: rescales a shared-memory accumulator element and adds.
    TbAccRescale,
    /// `mucc::tb::max_of`: the larger of two values.
    TbMaxOf,
    /// `mucc::tb::Max::join`: the larger of two values as the max functor folds them.
    TbMaxJoin,
    /// `atomicAdd`.
    AtomicAdd,
    /// `mucc::op::exp_approx`: exp through `ex2.approx`.
    ExpApprox,
    /// `mucc::op::exp_approx_ftz`: the same, flushing subnormals to zero.
    ExpApproxFtz,
    /// `mucc::op::silu_approx`: silu through `ex2.approx` and `rcp.approx`.
    SiluApprox,
    /// `mucc::op::sigmoid_approx`: sigmoid through `ex2.approx` and `rcp.approx`.
    SigmoidApprox,
    /// `mucc::tb::fill`: every element of a tile set to a value.
    TbFill,
    /// `mucc::tb::copy_chunks_cvt`: [`Func::TbCopyChunks`] converting each chunk's elements.
    TbCopyChunksCvt,
    /// `mucc::tb::cluster_softmax_combine`: the CTAs of a cluster combine their key splits.
    TbClusterSoftmaxCombine,
    /// `mucc::tb::arrive_last`: a block arrives on its group's counter; true in the last one.
    TbArriveLast,
    /// `mucc::tb::store_partial`: a grid split's CTA stores a partial tile into its slot.
    TbStorePartial,
    /// `mucc::tb::fold_partials`: a grid split's last CTA folds every CTA's slot into its tile.
    TbFoldPartials,
    /// `mucc::tb::combine_splits`: the last block of a group combines the key splits' partials.
    TbCombineSplits,
    /// `mucc::xchg::arrive_and_sum`: the fused all-reduce's last blocks sum the GPUs' slots.
    XchgArriveAndSum,
    /// `mucc::xchg::slot`: a GPU's slot of an exchange region.
    XchgSlot,
    /// `mucc::xchg::copy_ll`: a tile copied into a peer's slot with its flag.
    XchgCopyLl,
}

/// A template argument of a runtime call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TArg {
    /// An element type.
    Elem(crate::graph::DType),
    /// An integer.
    Int(i128),
    /// A boolean.
    Bool(bool),
    /// A type or value the generated code declares (a layout alias, a functor).
    Name(String),
    /// How the runtime folds partial accumulators.
    Fold(Fold),
    /// The runtime's max functor (`mucc::tb::Max`), which row folds take.
    MaxFunctor,
}

/// A fold of partial accumulators into one (`mucc::tb::FoldSum`, `FoldMax`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fold {
    /// Summed.
    Sum,
    /// Their maximum.
    Max,
}

impl TArg {
    /// An integer argument (a size, a count).
    pub fn int(v: usize) -> TArg {
        TArg::Int(v as i128)
    }
}

/// A static member function of the runtime's matmul classes (`mucc::tb::Mma`,
/// `mucc::tb::FmaMatmul`), called through the kernel's alias of the class (`L3::run(…)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// The product of two tiles into a fragment.
    Run,
    /// A fragment set to zero.
    Zero,
    /// A fragment set to a value.
    Fill,
    /// Each element of a fragment, with its row and column.
    Each,
    /// The product slice by slice, each element with its row and column.
    Apply,
    /// A fragment's values through a function, packed in the 16-bit type.
    Pack,
    /// The rows of a packed fragment summed by warp shuffles.
    RowSums,
    /// The product with a packed fragment as the A operand.
    RunFrom,
    /// The same over a warp's share of a key split.
    RunFromKeys,
    /// exp(S − m) packed, with the running max, its rescaling factors and the row sums.
    OnlinePack,
    /// The rows of a fragment scaled.
    ScaleRows,
    /// Each fragment row a thread holds first.
    EachRow,
    /// The warps of a key split combined into the accumulators' tiles.
    CombineKeys,
    /// One element of an FMA product.
    At,
}

/// A type a kernel names through an alias (`using L3 = …;`), which the kernel's code then uses
/// as a template argument, a layout (`L3::offset`) or a class (`L3::run`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AliasType {
    /// `mucc::Layout<Shape<dims…>, Stride<strides…>>`, inside `mucc::SwizzledLayout` with the
    /// XOR swizzle (b, m, s) where there is one.
    Layout {
        /// Extents.
        dims: Vec<usize>,
        /// Strides in elements.
        strides: Vec<usize>,
        /// The XOR swizzle's bits, chunk bits and shift.
        swizzle: Option<(u32, u32, u32)>,
    },
    /// `mucc::tb::Mma<…>`: a tensor-core product.
    Mma(MmaType),
    /// `mucc::tb::FmaMatmul<…>`: a product by FMA, a thread per element.
    Fma {
        /// A's stored type.
        a: DType,
        /// B's stored type.
        b: DType,
        /// A's layout alias.
        la: String,
        /// B's layout alias.
        lb: String,
        /// M, N and K.
        mnk: (usize, usize, usize),
    },
}

impl AliasType {
    /// A layout over `dims` with `strides`, swizzled where `swizzle` is an XOR swizzle (the
    /// others are in the strides).
    pub fn layout(dims: &[usize], strides: &[usize], swizzle: Option<Swizzle>) -> AliasType {
        AliasType::Layout {
            dims: dims.to_vec(),
            strides: strides.to_vec(),
            swizzle: match swizzle {
                Some(Swizzle::Xor { b, m, s }) => Some((b, m, s)),
                _ => None,
            },
        }
    }
}

/// The template arguments of a `mucc::tb::Mma` class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MmaType {
    /// The operands' element type.
    pub dtype: DType,
    /// A's layout alias.
    pub la: String,
    /// B's layout alias.
    pub lb: String,
    /// M, N and K.
    pub mnk: (usize, usize, usize),
    /// Warps along M and N.
    pub warps: (usize, usize),
    /// How A and B reach the tensor cores.
    pub loads: (OperandLoad, OperandLoad),
    /// The address walks and the slice width.
    pub walks: MatmulWalks,
    /// The warps a key split runs K over (`None`: no split).
    pub keys: Option<usize>,
}

/// An fp32 constant of the register states' initial values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum F32Const {
    /// Zero.
    Zero,
    /// −∞ (from its bit pattern).
    NegInfinity,
}

/// A type member of the runtime's matmul classes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nested {
    /// The accumulator fragment of a warp.
    Frag,
    /// A fragment packed in the 16-bit type.
    Packed,
}

/// A method of `mucc::host::Buffers` (the host entry's `buf`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferMethod {
    /// `in(i, offset)`: the caller's input `i`.
    Input,
    /// `out(j, offset)`: the caller's output `j`.
    Output,
    /// `ws(offset)`: the workspace.
    Workspace,
}

/// An enumerator or named constant of CUDA, cuBLAS or NCCL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sym {
    /// `nullptr`.
    Null,
    /// `CUBLAS_OP_N` or (`true`) `CUBLAS_OP_T`.
    CublasOp(bool),
    /// `CUBLAS_GEMM_DEFAULT`.
    CublasGemmDefault,
    /// A `cudaDataType` enumerator.
    CudaDataType(crate::sched::gemm::CudaDataType),
    /// A `cublasComputeType_t` enumerator.
    CublasCompute(crate::sched::gemm::CublasCompute),
    /// A `CUtensorMapDataType` enumerator.
    TensorMapDataType(crate::sched::tma::TmaDataType),
    /// A `CUtensorMapSwizzle` enumerator.
    TensorMapSwizzle(crate::sched::tma::TmaSwizzle),
    /// An `ncclDataType_t` enumerator.
    NcclDataType(crate::sched::kernel_level::NcclDataType),
    /// `ncclSum`.
    NcclSum,
    /// `blockIdx.x`, `.y` or `.z` (grid axis 0, 1, 2).
    BlockIdx(usize),
    /// `threadIdx.x`, `.y` or `.z`.
    ThreadIdx(usize),
    /// `blockDim.x`, `.y` or `.z`.
    BlockDim(usize),
    /// `mucc::xchg::HEADER`: the runtime's header bytes of an exchange region.
    ExchangeHeader,
    /// `0xffffffffu`: every lane of a warp.
    FullWarpMask,
}

/// The suffix of an integer literal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntType {
    /// `int` (no suffix).
    Int,
    /// `unsigned` (`u`).
    Unsigned,
    /// `long long` (`LL`).
    LongLong,
    /// `unsigned long long` (`ull`).
    UnsignedLongLong,
}

/// An expression.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// An integer literal.
    Int(i128, IntType),
    /// A variable or parameter of the generated code by name.
    Var(String),
    /// An enumerator or named constant.
    Sym(Sym),
    /// A call.
    Call(Func, Vec<Expr>),
    /// A call with template arguments.
    TemplateCall(Func, Vec<TArg>, Vec<Expr>),
    /// `a + b`.
    Add(Box<Expr>, Box<Expr>),
    /// `T{}`: a value-initialised object of a type the generated code declares.
    Object(String),
    /// A call whose arguments form groups (an operand's address, type, leading dimension and
    /// stride, say): as the expression of a statement it prints one group per line.
    GroupedCall(Func, Vec<Vec<Expr>>),
    /// A call of a method of the host entry's `buf`.
    Buffer(BufferMethod, Vec<Expr>),
    /// `base[index]`.
    Index(Box<Expr>, Box<Expr>),
    /// `base.field`.
    Field(Box<Expr>, &'static str),
    /// `&e`.
    AddrOf(Box<Expr>),
    /// `a - b`.
    Sub(Box<Expr>, Box<Expr>),
    /// `a * b`.
    Mul(Box<Expr>, Box<Expr>),
    /// `a / b`.
    Div(Box<Expr>, Box<Expr>),
    /// `a % b`.
    Rem(Box<Expr>, Box<Expr>),
    /// `a & b`.
    BitAnd(Box<Expr>, Box<Expr>),
    /// `a < b`.
    Lt(Box<Expr>, Box<Expr>),
    /// `a == b`.
    Eq(Box<Expr>, Box<Expr>),
    /// `a != b`.
    Ne(Box<Expr>, Box<Expr>),
    /// `!e` (the builder parenthesises an `e` that needs it).
    Not(Box<Expr>),
    /// `(e)`: the printer adds no parentheses of its own, so the builder places them.
    Paren(Box<Expr>),
    /// An operator of the graph on one value of the given compute type (the runtime's
    /// `mucc::op` functions).
    Unary(UnaryOp, Box<Expr>, DType),
    /// An operator of the graph on two values.
    Binary(BinaryOp, Box<Expr>, Box<Expr>),
    /// `T(e)`: a value converted to element type `T`.
    Construct(DType, Box<Expr>),
    /// `reinterpret_cast<T>(e)`.
    Reinterpret(Ty, Box<Expr>),
    /// `(void)e`: a value marked used.
    Void(Box<Expr>),
    /// A floating-point constant of a compute type (`float(256.0)`, the runtime's infinities).
    Number(f64, DType),
    /// `L::offset(e)`: the element offset of index `e` in the layout the generated code
    /// declares as `L`.
    LayoutOffset(String, Box<Expr>),
    /// `Class::method<targs>(args)`: a static member of a runtime class through the kernel's
    /// alias `Class` (template arguments printed only when there are some).
    Member(String, Method, Vec<TArg>, Vec<Expr>),
    /// `Class::PM`: fragment rows a thread holds in a matmul class.
    FragmentRows(String),
    /// `a = b` as an expression (the value of a chained assignment).
    Assign(Box<Expr>, Box<Expr>),
    /// An fp32 constant in the spelling the register states start from.
    F32(F32Const),
}

impl Expr {
    /// A variable.
    pub fn var(name: impl Into<String>) -> Expr {
        Expr::Var(name.into())
    }

    /// An `int` literal.
    pub fn int(v: impl Into<i128>) -> Expr {
        Expr::Int(v.into(), IntType::Int)
    }

    /// `&self`.
    pub fn addr(self) -> Expr {
        Expr::AddrOf(Box::new(self))
    }

    /// `self + b`.
    pub fn plus(self, b: Expr) -> Expr {
        Expr::Add(Box::new(self), Box::new(b))
    }

    /// `self - b`.
    pub fn minus(self, b: Expr) -> Expr {
        Expr::Sub(Box::new(self), Box::new(b))
    }

    /// `self * b`.
    pub fn times(self, b: Expr) -> Expr {
        Expr::Mul(Box::new(self), Box::new(b))
    }

    /// `self / b`.
    pub fn over(self, b: Expr) -> Expr {
        Expr::Div(Box::new(self), Box::new(b))
    }

    /// `self % b`.
    pub fn modulo(self, b: Expr) -> Expr {
        Expr::Rem(Box::new(self), Box::new(b))
    }

    /// `(self)`.
    pub fn paren(self) -> Expr {
        Expr::Paren(Box::new(self))
    }

    /// An unsuffixed literal of a size or count.
    pub fn size(v: usize) -> Expr {
        Expr::Int(v as i128, IntType::Int)
    }

    /// `self` with `terms` added in order (`self` alone without terms).
    pub fn sum(terms: Vec<Expr>) -> Option<Expr> {
        terms.into_iter().reduce(Expr::plus)
    }
}

/// How a failing call makes the host entry return (the runtime's checking macros).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// `MUCC_CHECK`: a `cudaError_t`.
    Cuda,
    /// `MUCC_CHECK_CUBLAS`: a `cublasStatus_t`.
    Cublas,
    /// `MUCC_CHECK_NCCL`: an `ncclResult_t`.
    Nccl,
}

/// How a declaration initialises its variable.
#[derive(Clone, Debug, PartialEq)]
pub enum Init {
    /// None.
    None,
    /// `= e`.
    Assign(Expr),
    /// `{e}`.
    Brace(Expr),
    /// An array: `name[] = {e, …}`, on one line when it fits, else one element per line.
    Array(Vec<Expr>),
}

/// A parameter of a lambda: its type and name (none for a parameter the body ignores).
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    /// The type.
    pub ty: Ty,
    /// The name.
    pub name: Option<String>,
}

impl Param {
    /// A named parameter.
    pub fn named(ty: Ty, name: &str) -> Param {
        Param {
            ty,
            name: Some(name.into()),
        }
    }
}

/// A lambda capturing by reference: `[&](params) { body }`.
#[derive(Clone, Debug, PartialEq)]
pub struct Lambda {
    /// Its parameters.
    pub params: Vec<Param>,
    /// Its body.
    pub body: Vec<Stmt>,
}

impl Lambda {
    /// A lambda of `params` running `body`.
    pub fn new(params: Vec<Param>, body: Vec<Stmt>) -> Lambda {
        Lambda { params, body }
    }
}

/// Where a loop's body goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoopForm {
    /// In a block: `for (…) {`, the body, `}`.
    Block,
    /// On the loop's line (`{ a; b; }` for several statements).
    SameLine,
    /// One level deeper on the lines after the loop's, without braces (one statement).
    NextLine,
}

/// A statement.
#[derive(Clone, Debug, PartialEq)]
pub enum Stmt {
    /// A declaration.
    Decl {
        /// Static or automatic.
        storage: Storage,
        /// The type.
        ty: Ty,
        /// The name.
        name: String,
        /// The initialiser.
        init: Init,
    },
    /// Several declarations of one type sharing a statement: `ty a = x, b = y;`.
    DeclMany {
        /// The type.
        ty: Ty,
        /// Each name with its value.
        vars: Vec<(String, Expr)>,
    },
    /// `target = value;`.
    Assign(Expr, Expr),
    /// A call whose failure returns from the host entry.
    Checked(Check, Expr),
    /// `{ … }`.
    Block(Vec<Stmt>),
    /// An expression evaluated for its effect: `e;`.
    Eval(Expr),
    /// `using namespace name;`.
    UsingNamespace(String),
    /// `if (cond) { … }`.
    If(Expr, Vec<Stmt>),
    /// `// text`.
    Comment(String),
    /// An array: `ty name[d0][d1]…`, with `= {e, …}` on one line when it has values.
    Array {
        /// Static shared memory or a local.
        storage: Storage,
        /// The element type.
        ty: Ty,
        /// The name.
        name: String,
        /// Its extents.
        dims: Vec<usize>,
        /// Its values (one dimension).
        init: Option<Vec<Expr>>,
    },
    /// `for (int var = from; var < to; ++var)`.
    For {
        /// The loop variable.
        var: String,
        /// Its first value.
        from: Expr,
        /// Its bound.
        to: Expr,
        /// Preceded by `#pragma unroll`.
        unroll: bool,
        /// Where the body goes.
        form: LoopForm,
        /// The body.
        body: Vec<Stmt>,
    },
    /// `target += value;`.
    AddAssign(Expr, Expr),
    /// A one-line statement followed by `  // text`.
    Noted(Box<Stmt>, String),
    /// `if (cond) stmt` on one line.
    IfLine(Expr, Box<Stmt>),
    /// `return;`, or `return e;`.
    Return(Option<Expr>),
    /// `if (cond) a` and `else b` on two lines.
    IfElseLine(Expr, Box<Stmt>, Box<Stmt>),
    /// A call whose last argument is a lambda written after the call's own arguments:
    /// `f(args…, [&](params) { … });` (the runtime's thread loops, the matmul's element walks).
    CallWith {
        /// The call without the lambda ([`Expr::Call`] or [`Expr::TemplateCall`]).
        call: Expr,
        /// The lambda.
        lambda: Lambda,
    },
    /// `auto name = [&](params) { … };`.
    LambdaDecl {
        /// Its name.
        name: String,
        /// The lambda.
        lambda: Lambda,
    },
    /// A comment broken into `// ` lines that fit the line width at the level it is printed.
    Remark(String),
    /// `Class::Nested name;`: an object of a runtime class's member type.
    NestedDecl {
        /// The kernel's alias of the class.
        class: String,
        /// The member type.
        ty: Nested,
        /// The object's name.
        name: String,
    },
    /// `using name = ty;`: an alias of a runtime type.
    Using {
        /// The alias.
        name: String,
        /// The type.
        ty: AliasType,
    },
    /// `ty a[d0][d1], b[d0][d1];`: local arrays of one type and extents given by expressions.
    Arrays {
        /// The element type.
        ty: Ty,
        /// Each array's name.
        names: Vec<String>,
        /// Their extents.
        dims: Vec<Expr>,
    },
    /// `static_assert(cond, "message");`.
    StaticAssert(Expr, String),
    /// `extern __shared__ __align__(align) unsigned char name[];`: the dynamic shared memory.
    DynamicSmem {
        /// Its alignment in bytes.
        align: usize,
        /// Its name.
        name: String,
    },
    /// `__syncthreads();` for the plan's reason, which a note after it names where `noted`.
    Barrier {
        /// Why the block waits here.
        reason: BarrierReason,
        /// Whether the line says why.
        noted: bool,
    },
}

impl Stmt {
    /// A loop over `var` from 0 to `to` (unrolled where `unroll`), its body in a block.
    pub fn for_block(var: &str, to: Expr, unroll: bool, body: Vec<Stmt>) -> Stmt {
        Stmt::For {
            var: var.into(),
            from: Expr::int(0),
            to,
            unroll,
            form: LoopForm::Block,
            body,
        }
    }

    /// The same loop with its body on its line.
    pub fn for_inline(var: &str, to: Expr, unroll: bool, body: Vec<Stmt>) -> Stmt {
        Stmt::For {
            var: var.into(),
            from: Expr::int(0),
            to,
            unroll,
            form: LoopForm::SameLine,
            body,
        }
    }

    /// A local array `ty name[dims…];` without values.
    pub fn array(ty: Ty, name: impl Into<String>, dims: Vec<usize>) -> Stmt {
        Stmt::Array {
            storage: Storage::Auto,
            ty,
            name: name.into(),
            dims,
            init: None,
        }
    }

    /// `self  // text`.
    pub fn noted(self, text: impl Into<String>) -> Stmt {
        Stmt::Noted(Box::new(self), text.into())
    }

    /// The statement a note follows (`self` without a note).
    pub fn unnoted(&self) -> &Stmt {
        match self {
            Stmt::Noted(inner, _) => inner,
            other => other,
        }
    }

    /// `func<targs>(tid, [&](params) { body });`: one of the runtime's loops that share work
    /// among the block's threads.
    pub fn thread_loop(func: Func, targs: Vec<TArg>, params: Vec<Param>, body: Vec<Stmt>) -> Stmt {
        Stmt::CallWith {
            call: Expr::TemplateCall(func, targs, vec![Expr::var("tid")]),
            lambda: Lambda::new(params, body),
        }
    }

    /// `auto name = [&](params) { body };`.
    pub fn lambda(name: &str, params: Vec<Param>, body: Vec<Stmt>) -> Stmt {
        Stmt::LambdaDecl {
            name: name.into(),
            lambda: Lambda::new(params, body),
        }
    }

    /// `e;`.
    pub fn eval(e: Expr) -> Stmt {
        Stmt::Eval(e)
    }

    /// A local declaration `ty name = init;`.
    pub fn local(ty: Ty, name: impl Into<String>, init: Expr) -> Stmt {
        Stmt::Decl {
            storage: Storage::Auto,
            ty,
            name: name.into(),
            init: Init::Assign(init),
        }
    }
}

/// Writes `stmts` at `w`'s level.
pub fn print(w: &mut Writer, stmts: &[Stmt]) {
    for s in stmts {
        print_stmt(w, s);
    }
}

/// The text of a statement that takes one line (before the writer breaks a long one), `None`
/// for blocks, loops with block bodies and declarations of arrays that may take several.
fn line_of(s: &Stmt) -> Option<String> {
    Some(match s {
        Stmt::Decl {
            storage,
            ty,
            name,
            init,
        } => {
            let head = format!("{}{} {name}", cxx::storage(*storage), cxx::ir_type(*ty));
            match init {
                Init::None => format!("{head};"),
                Init::Assign(e) => format!("{head} = {e};"),
                Init::Brace(e) => format!("{head}{{{e}}};"),
                Init::Array(_) => return None,
            }
        }
        Stmt::DeclMany { ty, vars } => {
            let vars: Vec<String> = vars.iter().map(|(n, e)| format!("{n} = {e}")).collect();
            format!("{} {};", cxx::ir_type(*ty), vars.join(", "))
        }
        Stmt::Assign(t, v) => format!("{t} = {v};"),
        Stmt::AddAssign(t, v) => format!("{t} += {v};"),
        Stmt::Checked(_, Expr::GroupedCall(..)) => return None,
        Stmt::Checked(c, e) => format!("{}({e});", cxx::check_macro(*c)),
        Stmt::Eval(e) => format!("{e};"),
        Stmt::UsingNamespace(n) => format!("using namespace {n};"),
        Stmt::Comment(text) => format!("// {text}"),
        Stmt::Array {
            storage,
            ty,
            name,
            dims,
            init,
        } => {
            let mut head = format!("{}{} {name}", cxx::storage(*storage), cxx::ir_type(*ty));
            for d in dims {
                let _ = write!(head, "[{d}]");
            }
            match init {
                None => format!("{head};"),
                Some(v) => {
                    let v: Vec<String> = v.iter().map(Expr::to_string).collect();
                    format!("{head} = {{{}}};", v.join(", "))
                }
            }
        }
        Stmt::For {
            form: LoopForm::SameLine,
            body,
            ..
        } => {
            let parts = body.iter().map(line_of).collect::<Option<Vec<String>>>()?;
            match &parts[..] {
                [one] => format!("{} {one}", for_head(s)),
                _ => format!("{} {{ {} }}", for_head(s), parts.join(" ")),
            }
        }
        Stmt::Noted(inner, text) => format!("{}  // {text}", line_of(inner)?),
        Stmt::IfLine(cond, inner) => format!("if ({cond}) {}", line_of(inner)?),
        Stmt::StaticAssert(cond, msg) => format!("static_assert({cond}, \"{msg}\");"),
        Stmt::DynamicSmem { align, name } => {
            format!("extern __shared__ __align__({align}) unsigned char {name}[];")
        }
        Stmt::Using { name, ty } => format!("using {name} = {};", cxx::alias_type(ty)),
        Stmt::NestedDecl { class, ty, name } => {
            format!("{class}::{} {name};", cxx::nested(*ty))
        }
        Stmt::Arrays { ty, names, dims } => {
            let extents: String = dims.iter().map(|d| format!("[{d}]")).collect();
            let arrays: Vec<String> = names.iter().map(|n| format!("{n}{extents}")).collect();
            format!("{} {};", cxx::ir_type(*ty), arrays.join(", "))
        }
        Stmt::Return(None) => "return;".into(),
        Stmt::Return(Some(e)) => format!("return {e};"),
        Stmt::Barrier { reason, noted } => {
            let b = cxx::BLOCK_BARRIER;
            if *noted {
                format!("{b}  // {reason}")
            } else {
                b.to_string()
            }
        }
        Stmt::Block(_)
        | Stmt::If(..)
        | Stmt::For { .. }
        | Stmt::IfElseLine(..)
        | Stmt::CallWith { .. }
        | Stmt::LambdaDecl { .. }
        | Stmt::Remark(_) => return None,
    })
}

/// `for (int v = from; v < to; ++v)` of a loop.
fn for_head(s: &Stmt) -> String {
    match s {
        Stmt::For { var, from, to, .. } => {
            format!("for (int {var} = {from}; {var} < {to}; ++{var})")
        }
        _ => String::new(),
    }
}

/// `[&](params)` of a lambda.
fn lambda_head(l: &Lambda) -> String {
    let params: Vec<String> = l
        .params
        .iter()
        .map(|p| match &p.name {
            Some(n) => format!("{} {n}", cxx::ir_type(p.ty)),
            None => cxx::ir_type(p.ty).into_owned(),
        })
        .collect();
    format!("[&]({})", params.join(", "))
}

fn print_stmt(w: &mut Writer, s: &Stmt) {
    if let Stmt::For { unroll: true, .. } = s {
        w.line("#pragma unroll");
    }
    if let Some(line) = line_of(s) {
        w.line(line);
        return;
    }
    match s {
        Stmt::Decl {
            storage,
            ty,
            name,
            init: Init::Array(items),
        } => {
            let head = format!("{}{} {name}", cxx::storage(*storage), cxx::ir_type(*ty));
            let items: Vec<String> = items.iter().map(Expr::to_string).collect();
            let one = format!("{head}[] = {{{}}};", items.join(", "));
            if 2 * w.level() + one.len() <= cxx::MAX_LINE {
                w.line(one);
            } else {
                w.open(format!("{head}[] ="));
                for (i, a) in items.iter().enumerate() {
                    let sep = if i + 1 < items.len() { "," } else { "" };
                    w.line(format!("{a}{sep}"));
                }
                w.close(";");
            }
        }
        Stmt::Checked(c, Expr::GroupedCall(f, groups)) => {
            w.line(format!("{}({}(", cxx::check_macro(*c), cxx::function(*f)));
            w.indented(|w| {
                for (i, g) in groups.iter().enumerate() {
                    let g: Vec<String> = g.iter().map(Expr::to_string).collect();
                    let end = if i + 1 < groups.len() { "," } else { "));" };
                    w.line(format!("{}{end}", g.join(", ")));
                }
            });
        }
        Stmt::Block(body) => w.block("", "", |w| print(w, body)),
        Stmt::If(cond, body) => w.block(format!("if ({cond})"), "", |w| print(w, body)),
        Stmt::For {
            form: LoopForm::NextLine,
            body,
            ..
        } => {
            w.line(for_head(s));
            w.indented(|w| print(w, body));
        }
        Stmt::For { body, .. } => w.block(for_head(s), "", |w| print(w, body)),
        Stmt::IfElseLine(cond, a, b) => {
            if let (Some(a), Some(b)) = (line_of(a), line_of(b)) {
                w.line(format!("if ({cond}) {a}"));
                w.line(format!("else {b}"));
            }
        }
        Stmt::CallWith { call, lambda } => {
            let text = call.to_string();
            let head = text.strip_suffix(')').unwrap_or(&text);
            let sep = if head.ends_with('(') { "" } else { ", " };
            w.block(format!("{head}{sep}{}", lambda_head(lambda)), ");", |w| {
                print(w, &lambda.body)
            })
        }
        Stmt::LambdaDecl { name, lambda } => {
            w.block(format!("auto {name} = {}", lambda_head(lambda)), ";", |w| {
                print(w, &lambda.body)
            })
        }
        Stmt::Remark(text) => {
            for l in cxx::comment(text, 2 * w.level()) {
                w.line(l);
            }
        }
        // A note on a statement of several lines goes on a line of its own before it.
        Stmt::Noted(inner, text) => {
            w.line(format!("// {text}"));
            print_stmt(w, inner);
        }
        _ => {}
    }
}

/// Template arguments separated by commas.
fn template_args_text(f: &mut fmt::Formatter<'_>, targs: &[TArg]) -> fmt::Result {
    for (i, t) in targs.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        match t {
            TArg::Elem(d) => f.write_str(cxx::ctype(*d))?,
            TArg::Int(v) => write!(f, "{v}")?,
            TArg::Bool(b) => write!(f, "{b}")?,
            TArg::Name(n) => f.write_str(n)?,
            TArg::Fold(c) => f.write_str(cxx::fold(*c))?,
            TArg::MaxFunctor => f.write_str(cxx::MAX_FUNCTOR)?,
        }
    }
    Ok(())
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let args = |f: &mut fmt::Formatter<'_>, v: &[Expr]| -> fmt::Result {
            for (i, a) in v.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{a}")?;
            }
            Ok(())
        };
        match self {
            Expr::Int(v, t) => write!(f, "{v}{}", cxx::int_suffix(*t)),
            Expr::Var(n) => f.write_str(n),
            Expr::Sym(s) => f.write_str(cxx::symbol(*s)),
            Expr::Call(func, a) => {
                write!(f, "{}(", cxx::function(*func))?;
                args(f, a)?;
                f.write_char(')')
            }
            Expr::TemplateCall(func, targs, a) => {
                write!(f, "{}<", cxx::function(*func))?;
                template_args_text(f, targs)?;
                f.write_str(">(")?;
                args(f, a)?;
                f.write_char(')')
            }
            Expr::Add(a, b) => write!(f, "{a} + {b}"),
            Expr::Object(t) => write!(f, "{t}{{}}"),
            Expr::GroupedCall(func, groups) => {
                write!(f, "{}(", cxx::function(*func))?;
                args(f, &groups.concat())?;
                f.write_char(')')
            }
            Expr::Buffer(m, a) => {
                write!(f, "buf.{}(", cxx::buffer_method(*m))?;
                args(f, a)?;
                f.write_char(')')
            }
            Expr::Index(b, i) => write!(f, "{b}[{i}]"),
            Expr::Field(b, name) => write!(f, "{b}.{name}"),
            Expr::AddrOf(e) => write!(f, "&{e}"),
            Expr::Sub(a, b) => write!(f, "{a} - {b}"),
            Expr::Mul(a, b) => write!(f, "{a} * {b}"),
            Expr::Div(a, b) => write!(f, "{a} / {b}"),
            Expr::Rem(a, b) => write!(f, "{a} % {b}"),
            Expr::BitAnd(a, b) => write!(f, "{a} & {b}"),
            Expr::Lt(a, b) => write!(f, "{a} < {b}"),
            Expr::Eq(a, b) => write!(f, "{a} == {b}"),
            Expr::Ne(a, b) => write!(f, "{a} != {b}"),
            Expr::Not(e) => write!(f, "!{e}"),
            Expr::Paren(e) => write!(f, "({e})"),
            Expr::Unary(u, e, d) => f.write_str(&cxx::unary(u, &e.to_string(), cxx::ctype(*d))),
            Expr::Binary(b, x, y) => f.write_str(&cxx::binary(*b, &x.to_string(), &y.to_string())),
            Expr::Construct(d, e) => write!(f, "{}({e})", cxx::ctype(*d)),
            Expr::Reinterpret(t, e) => write!(f, "reinterpret_cast<{}>({e})", cxx::ir_type(*t)),
            Expr::Void(e) => write!(f, "(void){e}"),
            Expr::Number(x, d) => f.write_str(&cxx::number(*x, cxx::ctype(*d))),
            Expr::LayoutOffset(l, e) => write!(f, "{l}::offset({e})"),
            Expr::Member(class, m, targs, a) => {
                write!(f, "{class}::{}", cxx::method(*m))?;
                if !targs.is_empty() {
                    f.write_char('<')?;
                    template_args_text(f, targs)?;
                    f.write_char('>')?;
                }
                f.write_char('(')?;
                args(f, a)?;
                f.write_char(')')
            }
            Expr::FragmentRows(class) => write!(f, "{class}::{}", cxx::FRAGMENT_ROWS),
            Expr::Assign(a, b) => write!(f, "{a} = {b}"),
            Expr::F32(c) => f.write_str(cxx::f32_const(*c)),
        }
    }
}

/// Visits every expression of `stmts` (nested in blocks, loops and notes), each before its
/// operands and arguments.
pub fn walk<'a>(stmts: &'a [Stmt], f: &mut dyn FnMut(&'a Expr)) {
    fn expr<'a>(e: &'a Expr, f: &mut dyn FnMut(&'a Expr)) {
        f(e);
        match e {
            Expr::Call(_, a)
            | Expr::TemplateCall(_, _, a)
            | Expr::Buffer(_, a)
            | Expr::Member(_, _, _, a) => a.iter().for_each(|x| expr(x, f)),
            Expr::GroupedCall(_, groups) => groups.iter().flatten().for_each(|x| expr(x, f)),
            Expr::Add(a, b)
            | Expr::Sub(a, b)
            | Expr::Mul(a, b)
            | Expr::Div(a, b)
            | Expr::Rem(a, b)
            | Expr::BitAnd(a, b)
            | Expr::Lt(a, b)
            | Expr::Eq(a, b)
            | Expr::Ne(a, b)
            | Expr::Index(a, b)
            | Expr::Assign(a, b)
            | Expr::Binary(_, a, b) => {
                expr(a, f);
                expr(b, f);
            }
            Expr::Field(b, _)
            | Expr::AddrOf(b)
            | Expr::Not(b)
            | Expr::Paren(b)
            | Expr::Unary(_, b, _)
            | Expr::Construct(_, b)
            | Expr::Reinterpret(_, b)
            | Expr::Void(b)
            | Expr::LayoutOffset(_, b) => expr(b, f),
            Expr::Int(..)
            | Expr::Var(_)
            | Expr::Sym(_)
            | Expr::Object(_)
            | Expr::Number(..)
            | Expr::F32(_)
            | Expr::FragmentRows(_) => {}
        }
    }
    fn stmt<'a>(s: &'a Stmt, f: &mut dyn FnMut(&'a Expr)) {
        match s {
            Stmt::Decl { init, .. } => match init {
                Init::None => {}
                Init::Assign(e) | Init::Brace(e) => expr(e, f),
                Init::Array(v) => v.iter().for_each(|x| expr(x, f)),
            },
            Stmt::DeclMany { vars, .. } => vars.iter().for_each(|(_, e)| expr(e, f)),
            Stmt::Assign(t, v) | Stmt::AddAssign(t, v) => {
                expr(t, f);
                expr(v, f);
            }
            Stmt::Checked(_, e) | Stmt::Eval(e) => expr(e, f),
            Stmt::Block(b) => b.iter().for_each(|x| stmt(x, f)),
            Stmt::If(c, b) => {
                expr(c, f);
                b.iter().for_each(|x| stmt(x, f));
            }
            Stmt::For { from, to, body, .. } => {
                expr(from, f);
                expr(to, f);
                body.iter().for_each(|x| stmt(x, f));
            }
            Stmt::CallWith { call, lambda } => {
                expr(call, f);
                lambda.body.iter().for_each(|x| stmt(x, f));
            }
            Stmt::LambdaDecl { lambda, .. } => lambda.body.iter().for_each(|x| stmt(x, f)),
            Stmt::Return(e) => e.iter().for_each(|x| expr(x, f)),
            Stmt::IfElseLine(c, a, b) => {
                expr(c, f);
                stmt(a, f);
                stmt(b, f);
            }
            Stmt::Array { init, .. } => init.iter().flatten().for_each(|x| expr(x, f)),
            Stmt::Noted(s, _) => stmt(s, f),
            Stmt::IfLine(c, s) => {
                expr(c, f);
                stmt(s, f);
            }
            Stmt::StaticAssert(c, _) => expr(c, f),
            Stmt::UsingNamespace(_)
            | Stmt::Comment(_)
            | Stmt::DynamicSmem { .. }
            | Stmt::Remark(_)
            | Stmt::NestedDecl { .. }
            | Stmt::Using { .. }
            | Stmt::Barrier { .. } => {}
            Stmt::Arrays { dims, .. } => dims.iter().for_each(|x| expr(x, f)),
        }
    }
    stmts.iter().for_each(|s| stmt(s, f));
}

/// Calls of `func` anywhere in `stmts` (checked or not, nested in blocks and arguments), in
/// order, each as its arguments (a grouped call's groups as one list): what a test looks for
/// instead of the call's spelling.
pub fn calls(stmts: &[Stmt], func: Func) -> Vec<Vec<&Expr>> {
    let mut out = Vec::new();
    walk(stmts, &mut |e| match e {
        Expr::Call(f, a) | Expr::TemplateCall(f, _, a) if *f == func => {
            out.push(a.iter().collect())
        }
        Expr::GroupedCall(f, groups) if *f == func => out.push(groups.iter().flatten().collect()),
        _ => {}
    });
    out
}

/// Calls of `method` of a runtime class anywhere in `stmts` (lambda calls included), in
/// order, each as its template arguments and arguments.
pub fn member_calls(stmts: &[Stmt], method: Method) -> Vec<(&[TArg], Vec<&Expr>)> {
    let mut out = Vec::new();
    walk(stmts, &mut |e| {
        if let Expr::Member(_, m, t, a) = e
            && *m == method
        {
            out.push((&t[..], a.iter().collect()))
        }
    });
    out
}

/// Every function `stmts` call, in order of first call.
pub fn functions(stmts: &[Stmt]) -> Vec<Func> {
    let mut out = Vec::new();
    walk(stmts, &mut |e| {
        if let Expr::Call(f, _) | Expr::TemplateCall(f, _, _) | Expr::GroupedCall(f, _) = e
            && !out.contains(f)
        {
            out.push(*f);
        }
    });
    out
}

/// Every barrier of `stmts` (nested in blocks, loops and conditionals), in order: its reason.
pub fn barriers(stmts: &[Stmt]) -> Vec<BarrierReason> {
    let mut out = Vec::new();
    visit(stmts, &mut |s| {
        if let Stmt::Barrier { reason, .. } = s {
            out.push(*reason);
        }
    });
    out
}

/// Visits every statement of `stmts`, nested ones after the statement holding them.
pub fn visit<'a>(stmts: &'a [Stmt], f: &mut dyn FnMut(&'a Stmt)) {
    for s in stmts {
        f(s);
        match s {
            Stmt::Block(b)
            | Stmt::If(_, b)
            | Stmt::For { body: b, .. }
            | Stmt::CallWith {
                lambda: Lambda { body: b, .. },
                ..
            }
            | Stmt::LambdaDecl {
                lambda: Lambda { body: b, .. },
                ..
            } => visit(b, f),
            Stmt::Noted(inner, _) | Stmt::IfLine(_, inner) => visit(std::slice::from_ref(inner), f),
            Stmt::IfElseLine(_, a, b) => {
                visit(std::slice::from_ref(a), f);
                visit(std::slice::from_ref(b), f);
            }
            _ => {}
        }
    }
}

/// The template arguments of every call of `func` with template arguments in `stmts` (not
/// nested in other calls), in order.
pub fn template_args(stmts: &[Stmt], func: Func) -> Vec<&[TArg]> {
    let mut out = Vec::new();
    for s in stmts {
        match s {
            Stmt::Eval(Expr::TemplateCall(f, t, _)) if *f == func => out.push(&t[..]),
            Stmt::Block(b) | Stmt::If(_, b) | Stmt::For { body: b, .. } => {
                out.extend(template_args(b, func))
            }
            Stmt::Noted(s, _) => out.extend(template_args(std::slice::from_ref(s), func)),
            _ => {}
        }
    }
    out
}

/// A kernel whose body was built as statements, by name.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelBody {
    /// The kernel's name.
    pub name: String,
    /// Its signature (every kernel's; none on the view of a kernel's ring statements,
    /// `Emitted::rings`).
    pub signature: Option<Signature>,
    /// Its body.
    pub body: Vec<Stmt>,
}

/// A parameter of a kernel, in the element type of the kernel's device tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelParam {
    /// View `index` of a kernel-level operator: `[const] T* __restrict__ v<index>` (view 0 is
    /// the one written).
    View {
        /// The view.
        index: usize,
        /// Whether the kernel writes it.
        written: bool,
    },
    /// The whole tensor of a concat (written) or split (read): `[const] T* __restrict__ whole`.
    Whole {
        /// Whether the kernel writes it.
        written: bool,
    },
    /// Part `index` of a concat (read) or split (written): `[const] T* __restrict__ p<index>`.
    Part {
        /// The part.
        index: usize,
        /// Whether the kernel writes it.
        written: bool,
    },
    /// Output `j`: `T* __restrict__ out<j>`.
    Output(usize),
    /// Input `i`: `const T* __restrict__ in<i>`.
    Input(usize),
    /// The output of a combine in the kernel's clusters or last blocks: `T* __restrict__ ycomb`.
    CombineOutput,
    /// The arrival counters of a last-block combine or a grid split:
    /// `unsigned* __restrict__ arrivals`.
    ArrivalCounters,
    /// A grid split's partial slots: `unsigned char* __restrict__ slots`.
    SplitSlots,
    /// The fused all-reduce's result: `T* xrecv`.
    ExchangeResult,
    /// GPU `r`'s exchange buffer: `unsigned char* x<r>`.
    ExchangeBuffer(usize),
    /// This GPU's rank: `unsigned long long xrank`.
    Rank,
    /// Tensor map `m`: `const __grid_constant__ mucc::sm90::TensorMap tm<m>`.
    TensorMap(usize),
}

/// The signature of a kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    /// Threads per CTA and the CTAs per SM the launch bounds promise (threadblock kernels;
    /// kernel-level kernels promise none).
    pub bounds: (usize, Option<usize>),
    /// `__cluster_dims__`, where the kernel is launched in clusters.
    pub cluster: Option<[usize; 3]>,
    /// The element type of the device tensors.
    pub elem: DType,
    /// The parameters, in order.
    pub params: Vec<KernelParam>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_print_with_the_spellings_of_cxx() {
        let mut w = Writer::at(1);
        print(
            &mut w,
            &[
                Stmt::Decl {
                    storage: Storage::Static,
                    ty: Ty::AtomicU64,
                    name: "s".into(),
                    init: Init::Brace(Expr::int(0)),
                },
                Stmt::Checked(
                    Check::Cublas,
                    Expr::Call(
                        Func::CublasSetStream,
                        vec![Expr::var("h"), Expr::var("stream")],
                    ),
                ),
                Stmt::Block(vec![Stmt::Decl {
                    storage: Storage::Auto,
                    ty: Ty::ConstU32,
                    name: "box".into(),
                    init: Init::Array(vec![
                        Expr::Int(64, IntType::Unsigned),
                        Expr::Int(8, IntType::Unsigned),
                    ]),
                }]),
                Stmt::Assign(
                    Expr::var("rank"),
                    Expr::Call(Func::CastToU64, vec![Expr::var("r")]),
                ),
            ],
        );
        assert_eq!(
            w.finish(),
            "  static std::atomic<unsigned long long> s{0};\n  \
             MUCC_CHECK_CUBLAS(cublasSetStream(h, stream));\n  {\n    \
             const cuuint32_t box[] = {64u, 8u};\n  }\n  \
             rank = static_cast<unsigned long long>(r);\n"
        );
    }

    #[test]
    fn loops_arrays_and_notes_print_as_kernel_code() {
        let x = |i: &str| Expr::Index(Box::new(Expr::var("x")), Box::new(Expr::var(i)));
        let mut w = Writer::at(1);
        print(
            &mut w,
            &[
                Stmt::Array {
                    storage: Storage::Shared,
                    ty: Ty::Elem(DType::F32),
                    name: "sums".into(),
                    dims: vec![2, 4],
                    init: None,
                }
                .noted("scratch"),
                Stmt::Array {
                    storage: Storage::Auto,
                    ty: Ty::ConstexprI64,
                    name: "at".into(),
                    dims: vec![2],
                    init: Some(vec![Expr::size(0), Expr::size(64)]),
                },
                Stmt::for_block(
                    "r",
                    Expr::size(2),
                    true,
                    vec![
                        Stmt::local(
                            Ty::ConstElem(DType::F32),
                            "y",
                            Expr::Unary(UnaryOp::Exp, Box::new(x("r")), DType::F32),
                        ),
                        Stmt::for_inline(
                            "i",
                            Expr::size(4),
                            false,
                            vec![Stmt::AddAssign(
                                x("i"),
                                Expr::Construct(DType::BF16, Box::new(Expr::var("y"))),
                            )],
                        ),
                        Stmt::for_inline(
                            "j",
                            Expr::size(4),
                            true,
                            vec![
                                Stmt::local(Ty::ConstAuto, "a", x("j")),
                                Stmt::Assign(
                                    x("j"),
                                    Expr::Binary(
                                        BinaryOp::Mul,
                                        Box::new(Expr::var("a")),
                                        Box::new(Expr::var("a")),
                                    ),
                                ),
                            ],
                        ),
                    ],
                ),
            ],
        );
        assert_eq!(
            w.finish(),
            "  __shared__ float sums[2][4];  // scratch\n  \
             constexpr mucc::i64 at[2] = {0, 64};\n  \
             #pragma unroll\n  \
             for (int r = 0; r < 2; ++r) {\n    \
             const float y = mucc::op::exp(x[r]);\n    \
             for (int i = 0; i < 4; ++i) x[i] += mucc::bf16(y);\n    \
             #pragma unroll\n    \
             for (int j = 0; j < 4; ++j) { const auto a = x[j]; x[j] = mucc::op::mul(a, a); }\n  \
             }\n"
        );
        let body = [Stmt::for_block(
            "r",
            Expr::size(2),
            false,
            vec![Stmt::Eval(Expr::Call(Func::LaunchDependents, vec![])).noted("n")],
        )];
        assert_eq!(functions(&body), [Func::LaunchDependents]);
        assert_eq!(calls(&body, Func::LaunchDependents).len(), 1);
    }

    #[test]
    fn kernel_statements_print_with_their_notes_and_lambdas() {
        let mut w = Writer::at(1);
        let elem = Expr::Index(
            Box::new(Expr::var("s3")),
            Box::new(Expr::LayoutOffset("L0".into(), Box::new(Expr::var("e")))),
        );
        let body = [
            Stmt::DynamicSmem {
                align: 1024,
                name: "smem_1024".into(),
            },
            Stmt::IfLine(
                Expr::Ne(
                    Box::new(Expr::Call(Func::ClusterRank, vec![])),
                    Box::new(Expr::int(0)),
                ),
                Box::new(Stmt::Return(None)),
            ),
            Stmt::Barrier {
                reason: BarrierReason::BeforeWriteBack,
                noted: true,
            },
            Stmt::Barrier {
                reason: BarrierReason::EndOfBody,
                noted: false,
            },
            Stmt::thread_loop(
                Func::TbForEach,
                vec![TArg::int(128), TArg::int(64)],
                vec![
                    Param::named(Ty::Int, "e"),
                    Param {
                        ty: Ty::Int,
                        name: None,
                    },
                ],
                vec![Stmt::Assign(
                    elem.clone(),
                    Expr::TemplateCall(
                        Func::FromCompute,
                        vec![TArg::Elem(DType::BF16)],
                        vec![
                            Expr::Call(Func::ToCompute, vec![elem])
                                .over(Expr::Number(256.0, DType::F32)),
                        ],
                    ),
                )],
            ),
            Stmt::Remark("op3 silu -> op4 mul -> op5 div -> op6 sqrt -> op7 output, a chain of five operators whose names make a line too long to print on one".into()),
            Stmt::Block(vec![
                Stmt::lambda(
                    "elem",
                    vec![Param::named(Ty::Int, "row"), Param::named(Ty::Int, "j")],
                    vec![
                        Stmt::Decl {
                            storage: Storage::Auto,
                            ty: Ty::Elem(DType::F32),
                            name: "v".into(),
                            init: Init::None,
                        },
                        Stmt::IfElseLine(
                            Expr::Lt(Box::new(Expr::var("j")), Box::new(Expr::int(8))),
                            Box::new(Stmt::Assign(Expr::var("v"), Expr::var("a"))),
                            Box::new(Stmt::Assign(Expr::var("v"), Expr::var("b"))),
                        ),
                        Stmt::Return(Some(Expr::var("v").times(Expr::var("v")))),
                    ],
                ),
                Stmt::Eval(Expr::TemplateCall(
                    Func::TbForEachRow,
                    vec![TArg::int(128), TArg::int(2), TArg::int(4), TArg::int(16), TArg::Elem(DType::F32), TArg::int(1), TArg::MaxFunctor],
                    vec![Expr::var("tid"), Expr::var("elem"), Expr::var("sink")],
                )),
            ]),
        ];
        print(&mut w, &body);
        assert_eq!(
            w.finish(),
            "  extern __shared__ __align__(1024) unsigned char smem_1024[];\n  \
             if (mucc::sm90::cluster_rank() != 0) return;\n  \
             __syncthreads();  // the loop body's reads finish before write-backs\n  \
             __syncthreads();\n  \
             mucc::tb::for_each<128, 64>(tid, [&](int e, int) {\n    \
             s3[L0::offset(e)] = mucc::from_compute<mucc::bf16>(mucc::to_compute(s3[L0::offset(e)]) / float(256.0));\n  \
             });\n  \
             // op3 silu -> op4 mul -> op5 div -> op6 sqrt -> op7 output, a chain of five operators whose names make a line too\n  \
             // long to print on one\n  \
             {\n    \
             auto elem = [&](int row, int j) {\n      \
             float v;\n      \
             if (j < 8) v = a;\n      \
             else v = b;\n      \
             return v * v;\n    \
             };\n    \
             mucc::tb::for_each_row<128, 2, 4, 16, float, 1, mucc::tb::Max>(tid, elem, sink);\n  \
             }\n"
        );
        assert_eq!(
            barriers(&body),
            [BarrierReason::BeforeWriteBack, BarrierReason::EndOfBody]
        );
    }

    #[test]
    fn a_long_array_takes_one_element_per_line() {
        let items: Vec<Expr> = (0..12)
            .map(|i| Expr::Buffer(BufferMethod::Input, vec![Expr::int(i), Expr::int(123456)]))
            .collect();
        let mut w = Writer::at(2);
        print(
            &mut w,
            &[Stmt::Decl {
                storage: Storage::Auto,
                ty: Ty::VoidPtrConst,
                name: "args".into(),
                init: Init::Array(items),
            }],
        );
        let text = w.finish();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "    void* const args[] = {");
        assert_eq!(lines[1], "      buf.in(0, 123456),");
        assert_eq!(lines[12], "      buf.in(11, 123456)");
        assert_eq!(lines[13], "    };");
        assert!(lines.iter().all(|l| l.len() <= cxx::MAX_LINE));
    }

    #[test]
    fn calls_are_found_inside_blocks_and_arguments() {
        let launch = Expr::Call(
            Func::Launch,
            vec![Expr::Call(
                Func::Dim3,
                vec![Expr::int(1), Expr::int(2), Expr::int(3)],
            )],
        );
        let stmts = [Stmt::Block(vec![Stmt::Checked(Check::Cuda, launch)])];
        assert_eq!(calls(&stmts, Func::Launch).len(), 1);
        let dims = calls(&stmts, Func::Dim3);
        assert_eq!(dims, [vec![&Expr::int(1), &Expr::int(2), &Expr::int(3)]]);
        assert!(calls(&stmts, Func::NcclAllReduce).is_empty());
    }
}
