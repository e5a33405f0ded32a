//! The host entry `mucc_execute`, rendered from the typed [`LaunchPlan`] alone: each kernel
//! step becomes a `cudaLaunchKernel` through `mucc::host::launch` with the argument addresses
//! its bindings denote, each cuBLAS step a `cublasGemmStridedBatchedEx` call, each all-reduce
//! step (graphs on several GPUs) an `ncclAllReduce` on the caller's communicator. The runner of
//! `mucc run` interprets the same plan ([`LaunchPlan::resolve`] gives both the addresses).

use super::cxx::{self, Writer};
use super::launch::{
    AllReduceCall, Binding, BufferRef, GemmCall, KernelLaunch, LaunchPlan, Step, TensorMapSpec,
};

/// Value `mucc_execute` adds to a `cublasStatus_t` it returns (the runtime's
/// `MUCC_CUBLAS_ERROR_BASE`, and the generated library header's).
pub const CUBLAS_ERROR_BASE: i32 = 100_000;

/// Value `mucc_execute` adds to an `ncclResult_t` it returns (the runtime's
/// `MUCC_NCCL_ERROR_BASE`, and the generated library header's).
pub const NCCL_ERROR_BASE: i32 = 200_000;

/// A step of the host entry: a comment and its lines (at the entry's indentation).
#[derive(Clone, Debug)]
pub struct HostStep {
    /// What the step does.
    pub comment: String,
    /// Its C++ lines.
    pub lines: Vec<String>,
}

/// The device address a binding denotes, as a `void*` expression over `buf`
/// (a `mucc::host::Buffers`).
fn address(plan: &LaunchPlan, b: Binding) -> String {
    match plan.resolve(b) {
        Some((BufferRef::Input(i), off)) => format!("buf.in({i}, {off})"),
        Some((BufferRef::Output(j), off)) => format!("buf.out({j}, {off})"),
        Some((BufferRef::Workspace, off)) => format!("buf.ws({off})"),
        Some((BufferRef::Exchange(r), _)) => format!("exchange[{r}]"),
        Some((BufferRef::Rank, _)) => "mucc::host::value_arg(rank)".into(),
        // The emitter only binds buffers the plan has.
        None => "nullptr".into(),
    }
}

fn kernel_step(plan: &LaunchPlan, k: &KernelLaunch) -> Vec<String> {
    let mut w = Writer::new();
    let [gx, gy, gz] = k.grid;
    let [bx, by, bz] = k.block;
    w.line(format!(
        "const void* kernel = reinterpret_cast<const void*>(&{});",
        k.name
    ));
    if k.needs_smem_opt_in() {
        // Once per device, safe from several host threads (mucc::host::max_dynamic_smem).
        w.line("static std::atomic<unsigned long long> smem_set{0};");
        w.line(format!(
            "MUCC_CHECK(mucc::host::max_dynamic_smem(kernel, {}, smem_set));",
            k.dynamic_smem
        ));
    }
    let args: Vec<String> = k.args.iter().map(|b| address(plan, *b)).collect();
    let one_line = format!("void* const args[] = {{{}}};", args.join(", "));
    if one_line.len() + 4 <= super::cxx::MAX_LINE {
        w.line(one_line);
    } else {
        w.open("void* const args[] =");
        for (i, a) in args.iter().enumerate() {
            let sep = if i + 1 < args.len() { "," } else { "" };
            w.line(format!("{a}{sep}"));
        }
        w.close(";");
    }
    let f = if k.programmatic {
        "launch_programmatic"
    } else {
        "launch"
    };
    if k.tensor_maps.is_empty() {
        w.line(format!(
            "MUCC_CHECK(mucc::host::{f}(kernel, dim3({gx}, {gy}, {gz}), dim3({bx}, {by}, {bz}), {}, stream, args));",
            k.dynamic_smem
        ));
    } else {
        let mut maps = Vec::new();
        for (i, m) in k.tensor_maps.iter().enumerate() {
            tensor_map(&mut w, plan, m, i);
            maps.push(format!("&tm{i}.map"));
        }
        w.line(format!(
            "const CUtensorMap* const maps[] = {{{}}};",
            maps.join(", ")
        ));
        w.line(format!(
            "MUCC_CHECK(mucc::host::{f}(kernel, dim3({gx}, {gy}, {gz}), dim3({bx}, {by}, {bz}), {}, stream, args, maps));",
            k.dynamic_smem
        ));
    }
    w.finish().lines().map(str::to_string).collect()
}

/// Lines encoding tensor map `i` of a launch (cached per call site and host thread, encoded
/// again when the buffer's address changes).
fn tensor_map(w: &mut Writer, plan: &LaunchPlan, m: &TensorMapSpec, i: usize) {
    let list = |v: &[String]| v.join(", ");
    let dims: Vec<String> = m.dims.iter().map(|d| format!("{d}ull")).collect();
    let boxes: Vec<String> = m.boxes.iter().map(|b| format!("{b}u")).collect();
    let strides: Vec<String> = m.strides.iter().map(|s| format!("{s}ull")).collect();
    let dtype = cxx::tensor_map_data_type(m.data_type);
    let swizzle = cxx::tensor_map_swizzle(m.swizzle);
    w.line(format!(
        "static thread_local mucc::host::CachedTensorMap tm{i};"
    ));
    w.block("", "", |w| {
        w.line(format!("const cuuint64_t dims[] = {{{}}};", list(&dims)));
        if strides.is_empty() {
            w.line("const cuuint64_t* const strides = nullptr;");
        } else {
            w.line(format!(
                "const cuuint64_t strides[] = {{{}}};",
                list(&strides)
            ));
        }
        w.line(format!("const cuuint32_t box[] = {{{}}};", list(&boxes)));
        w.line(format!(
            "MUCC_CHECK(mucc::host::tensor_map(tm{i}, {dtype}, {}, dims, strides, box,",
            address(plan, m.binding)
        ));
        w.line(format!("    {swizzle}));"));
    });
}

fn gemm_step(plan: &LaunchPlan, c: &GemmCall) -> Vec<String> {
    let mut w = Writer::new();
    let op = |t: bool| if t { "CUBLAS_OP_T" } else { "CUBLAS_OP_N" };
    let scalar = cxx::cublas_scalar(c.compute_type);
    let dt = cxx::cuda_data_type(c.data_type);
    w.line("cublasHandle_t handle;");
    w.line("MUCC_CHECK_CUBLAS(mucc::host::cublas_handle(&handle));");
    w.line("MUCC_CHECK_CUBLAS(cublasSetStream(handle, stream));");
    w.line(format!("const {scalar} alpha = 1, beta = 0;"));
    w.line("MUCC_CHECK_CUBLAS(cublasGemmStridedBatchedEx(");
    w.indented(|w| {
        w.line(format!(
            "handle, {}, {}, {}, {}, {}, &alpha,",
            op(c.trans_a),
            op(c.trans_b),
            c.m,
            c.n,
            c.k
        ));
        let operand = |b: Binding, ld: i32, stride: i64| {
            format!("{}, {dt}, {ld}, {stride}LL,", address(plan, b))
        };
        w.line(operand(c.a, c.lda, c.stride_a));
        w.line(format!("{} &beta,", operand(c.b, c.ldb, c.stride_b)));
        w.line(operand(c.c, c.ldc, c.stride_c));
        w.line(format!(
            "{}, {}, CUBLAS_GEMM_DEFAULT));",
            c.batch,
            cxx::cublas_compute(c.compute_type)
        ));
    });
    w.finish().lines().map(str::to_string).collect()
}

fn all_reduce_step(plan: &LaunchPlan, c: &AllReduceCall) -> Vec<String> {
    vec![format!(
        "MUCC_CHECK_NCCL(ncclAllReduce({}, {}, {}, {}, ncclSum, comm, stream));",
        address(plan, c.send),
        address(plan, c.recv),
        c.count,
        cxx::nccl_data_type(c.dtype)
    )]
}

/// The steps of the host entry, one per launch-plan step (first this GPU's rank, when a
/// kernel performs an all-reduce).
pub fn steps(plan: &LaunchPlan) -> Vec<HostStep> {
    let rank = plan.uses_exchange().then(|| HostStep {
        comment: "this GPU's rank (kernels that all-reduce exchange tiles with the others)".into(),
        lines: vec![
            "int r = 0;".into(),
            "MUCC_CHECK_NCCL(ncclCommUserRank(comm, &r));".into(),
            "rank = static_cast<unsigned long long>(r);".into(),
        ],
    });
    rank.into_iter()
        .chain(plan.steps.iter().map(|s| match s {
            Step::Kernel(k) => HostStep {
                comment: format!("launch {}", k.name),
                lines: kernel_step(plan, k),
            },
            Step::Gemm(c) => HostStep {
                comment: format!(
                    "cuBLAS: {} product(s) of {}x{} by {}x{}",
                    c.batch, c.m, c.k, c.k, c.n
                ),
                lines: gemm_step(plan, c),
            },
            Step::AllReduce(c) => HostStep {
                comment: format!(
                    "NCCL: sum of {} {} elements over the {} GPUs",
                    c.count,
                    cxx::nccl_data_type(c.dtype),
                    plan.gpus
                ),
                lines: all_reduce_step(plan, c),
            },
        }))
        .collect()
}
