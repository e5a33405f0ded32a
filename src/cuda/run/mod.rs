//! Executing a launch plan on a GPU through cudarc: the device, its buffers, the generated
//! kernels (from a cubin) and the plan's cuBLAS calls, all on one stream, every result checked.
//!
//! cudarc loads the driver and cuBLAS dynamically and panics when a library is missing, so
//! [`Gpu::open`] probes for them first: a machine without a driver gets
//! [`RunError::NoDriver`], one without a device [`RunError::NoDevice`].

use std::sync::Arc;

use cudarc::driver::DriverError;
use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr};

mod blas;
mod replay;
mod tensor_map;

pub(crate) use blas::{Blas, Product, compute_type, cuda_data_type};
pub use replay::Replay;
use tensor_map::TensorMapArg;

use crate::emit::launch::{Binding, BufferRef, LaunchPlan, Step, TensorDirective};
use crate::target::Arch;

/// Why a plan could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No CUDA driver library.
    #[error(
        "no CUDA driver found (libcuda.so.1 could not be loaded): running needs an NVIDIA GPU and its driver"
    )]
    NoDriver,
    /// The driver loaded but offers no usable device.
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    /// A GPU mucc does not compile for.
    #[error(
        "{name} has compute capability {major}.{minor}; mucc targets sm_80 (compute capability 8.x) and sm_90a (9.0)"
    )]
    UnsupportedGpu {
        /// Device name.
        name: String,
        /// Compute capability, major.
        major: i32,
        /// Compute capability, minor.
        minor: i32,
    },
    /// Fewer devices than the graph's mesh needs.
    #[error(
        "the graph runs on {needed} GPUs (devices {first}..{last}) but this machine has {found}"
    , last = first + needed - 1)]
    TooFewGpus {
        /// GPUs the graph needs.
        needed: usize,
        /// The first device asked for.
        first: usize,
        /// Devices present.
        found: usize,
    },
    /// libnccl could not be loaded although the graph runs on several GPUs.
    #[error(
        "the graph runs on {0} GPUs, which needs NCCL, but libnccl.so could not be loaded: install \
         NCCL or put its lib folder on LD_LIBRARY_PATH (pip's nvidia-nccl-cu13 ships only \
         libnccl.so.2: link it as libnccl.so in a folder of LD_LIBRARY_PATH)"
    )]
    NoNccl(usize),
    /// The GPUs of one run are not all of one architecture.
    #[error(
        "device {ordinal} ({name}, {arch}) differs from device {first} ({first_arch}): the ranks of a graph share one compiled module"
    )]
    MixedGpus {
        /// The odd device.
        ordinal: usize,
        /// Its name.
        name: String,
        /// Its architecture.
        arch: Arch,
        /// The first device.
        first: usize,
        /// The first device's architecture.
        first_arch: Arch,
    },
    /// One rank of a multi-GPU run failed; the other ranks were stopped and every NCCL
    /// communicator aborted, so nothing further can run on these GPUs in this process.
    #[error(
        "rank {rank}: {source}; the other ranks were stopped and the NCCL communicators \
         aborted, so nothing further can run on these GPUs in this process{}",
        if stuck.is_empty() { String::new() } else {
            format!(" (the streams of ranks {stuck:?} did not drain within 10 s: a kernel that \
                     never finishes; the process must exit)")
        }
    )]
    RankFailed {
        /// The rank (GPU of the run) that failed first.
        rank: usize,
        /// Its error.
        source: Box<RunError>,
        /// Ranks whose streams would not drain after the abort (their work never finishes;
        /// releasing their buffers could block, so the caller should exit).
        stuck: Vec<usize>,
    },
    /// An NCCL call failed.
    #[error("{what}: NCCL returned {result}")]
    Nccl {
        /// What was being done.
        what: String,
        /// The result code.
        result: String,
    },
    /// libcublas could not be loaded although the plan calls cuBLAS.
    #[error("the plan calls cuBLAS but libcublas.so.13 could not be loaded")]
    NoCublas,
    /// A driver call failed.
    #[error("{what}: {source}")]
    Driver {
        /// What was being done.
        what: String,
        /// The driver's error.
        source: DriverError,
    },
    /// A cuBLAS call failed.
    #[error("{what}: cuBLAS returned {status}")]
    Cublas {
        /// What was being done.
        what: String,
        /// The status.
        status: String,
    },
    /// The plan or the data given does not fit.
    #[error("{0}")]
    Plan(String),
    /// A step failed while it ran (a kernel fault: an illegal address, a trap). CUDA keeps the
    /// error in the context: nothing else can run in this process.
    #[error(
        "{step} failed on the GPU: {source}; the GPU context is lost (CUDA keeps the error), so nothing further can run in this process"
    )]
    Fault {
        /// The step: the kernel's name or the cuBLAS call, and its position in the plan.
        step: String,
        /// The driver's error.
        source: DriverError,
    },
    /// The plan's buffers do not fit the device memory this process may use.
    #[error(
        "the plan needs {needed} bytes of device memory (inputs, outputs and workspace) but {available} are available ({why})"
    )]
    OutOfMemory {
        /// Bytes of all buffers.
        needed: usize,
        /// Bytes free (or allowed).
        available: usize,
        /// Where the limit comes from.
        why: String,
    },
}

impl RunError {
    /// Whether some GPU's work never finishes after this error: the process should exit
    /// without releasing anything (a release could block).
    pub fn is_stuck(&self) -> bool {
        matches!(self, RunError::RankFailed { stuck, .. } if !stuck.is_empty())
    }

    /// Whether the GPU context is unusable after this error.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            RunError::Fault { .. } | RunError::Nccl { .. } | RunError::RankFailed { .. }
        )
    }
}

/// Step `i` of `prog` as an error names it: "kernel NAME (step i of n)", "a cuBLAS call …".
pub(crate) fn step_name(prog: &Program, i: usize) -> String {
    let n = prog.plan.steps.len();
    match &prog.plan.steps[i] {
        Step::Kernel(k) => format!("kernel {} (step {} of {n})", k.name, i + 1),
        Step::Gemm(_) => format!("a cuBLAS call (step {} of {n})", i + 1),
        Step::AllReduce(_) => format!("an NCCL all-reduce (step {} of {n})", i + 1),
    }
}

/// Wraps a driver error with what was being done.
pub(crate) fn driver(what: impl Into<String>) -> impl FnOnce(DriverError) -> RunError {
    let what = what.into();
    move |source| RunError::Driver { what, source }
}

/// One GPU and a stream on it.
pub struct Gpu {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    /// The device's name.
    pub name: String,
    /// The target its code is compiled for.
    pub arch: Arch,
    /// Bytes of L2 cache.
    pub l2_bytes: usize,
    pub(crate) blas: Option<Blas>,
    /// This GPU's rank in an NCCL communicator (graphs on several GPUs; see
    /// [`super::multi`]).
    pub(crate) nccl: Option<super::multi::NcclRank>,
    /// The most device memory this process allocates for one plan's buffers (`None`: what the
    /// device has free).
    pub max_memory: Option<usize>,
}

/// Device addresses of buffers the caller owns (a PyTorch tensor's `data_ptr()`, say), for
/// one execution of a plan with [`Gpu::execute_raw`].
#[derive(Clone, Copy, Debug)]
pub struct RawBuffers<'a> {
    /// Input i's address, in the plan's order.
    pub inputs: &'a [u64],
    /// Output j's address, in the plan's order.
    pub outputs: &'a [u64],
    /// The workspace's address (ignored when the plan needs none).
    pub workspace: u64,
}

/// The buffers of one execution: allocated by [`Gpu::alloc`] or the caller's.
#[derive(Clone, Copy)]
pub(crate) enum Bufs<'a> {
    Owned(&'a Buffers),
    Raw(RawBuffers<'a>),
}

/// Bytes of the cuBLAS workspace (what PyTorch gives cuBLAS on Hopper).
const CUBLAS_WORKSPACE_BYTES: usize = 32 << 20;

impl Drop for Gpu {
    fn drop(&mut self) {
        // The communicator goes first, while the context and stream it was made on are alive.
        self.nccl = None;
    }
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("name", &self.name)
            .field("arch", &self.arch)
            .finish()
    }
}

/// Whether the CUDA driver library can be loaded.
pub fn driver_available() -> bool {
    // SAFETY: only probes for the library.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// A loaded module: the plan's kernels, resolved.
pub struct Program {
    _module: Arc<CudaModule>,
    functions: Vec<Option<CudaFunction>>,
    plan: LaunchPlan,
}

/// Device buffers for one execution of a plan.
pub struct Buffers {
    inputs: Vec<CudaSlice<u8>>,
    outputs: Vec<CudaSlice<u8>>,
    workspace: Option<Arc<CudaSlice<u8>>>,
    /// The outputs and the workspace lie in memory the caller owns ([`Gpu::alloc_placed`]):
    /// they are never freed here.
    placed: bool,
    /// For a plan with fused all-reduces: every GPU's exchange buffer as this GPU addresses it
    /// (rank order) and this GPU's rank ([`super::multi`] sets them).
    pub(crate) exchange: Option<(Vec<u64>, usize)>,
}

impl Drop for Buffers {
    fn drop(&mut self) {
        if !self.placed {
            return;
        }
        for s in self.outputs.drain(..) {
            s.leak();
        }
        if let Some(w) = self.workspace.take() {
            match Arc::try_unwrap(w) {
                Ok(s) => {
                    s.leak();
                }
                // Still shared: never released.
                Err(w) => std::mem::forget(w),
            }
        }
    }
}

/// Bytes a region needs to hold `plan`'s outputs and workspace for [`Gpu::alloc_placed`]: each
/// at an offset aligned to `align` bytes, in plan order, the workspace last.
pub(crate) fn placed_bytes(plan: &LaunchPlan, align: usize) -> usize {
    plan.outputs
        .iter()
        .map(TensorDirective::alloc_bytes)
        .chain(std::iter::once(plan.workspace_bytes))
        .map(|b| b.next_multiple_of(align))
        .sum()
}

impl Buffers {
    /// Bytes of the caller buffers (inputs and outputs; not the workspace).
    pub fn io_bytes(&self) -> usize {
        self.inputs
            .iter()
            .chain(&self.outputs)
            .map(|b| b.len())
            .sum()
    }
}

impl Program {
    /// The launch plan the program executes.
    pub fn plan(&self) -> &LaunchPlan {
        &self.plan
    }
}

impl Gpu {
    /// Opens device `ordinal` and a stream on it.
    pub fn open(ordinal: usize) -> Result<Gpu, RunError> {
        if !driver_available() {
            return Err(RunError::NoDriver);
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| RunError::NoDevice(e.to_string()))?;
        let name = ctx.name().map_err(driver("reading the device name"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(driver("reading the compute capability"))?;
        let arch = match (major, minor) {
            (8, _) => Arch::Sm80,
            (9, 0) => Arch::Sm90a,
            _ => return Err(RunError::UnsupportedGpu { name, major, minor }),
        };
        let l2_bytes = ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
            .map_err(driver("reading the L2 cache size"))?
            .max(0) as usize;
        // One stream of our own (the legacy default stream cannot be captured into a CUDA
        // graph). Everything runs on it, so cudarc's cross-stream event tracking is not needed
        // (and its event records would get in the way of stream capture).
        // SAFETY: no buffer is ever used on another stream.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(driver("creating a stream"))?;
        Ok(Gpu {
            ctx,
            stream,
            name,
            arch,
            l2_bytes,
            blas: None,
            nccl: None,
            max_memory: None,
        })
    }

    /// Loads `cubin` and resolves the kernels of `plan`, setting their dynamic shared-memory
    /// limits.
    pub fn load(&mut self, cubin: &[u8], plan: &LaunchPlan) -> Result<Program, RunError> {
        let module = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(cubin.to_vec()))
            .map_err(driver("loading the compiled module"))?;
        let mut functions = Vec::new();
        for step in &plan.steps {
            match step {
                Step::Kernel(k) => {
                    let f = module
                        .load_function(&k.name)
                        .map_err(driver(format!("finding kernel {}", k.name)))?;
                    if k.needs_smem_opt_in() {
                        f.set_attribute(
                            CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                            k.dynamic_smem as i32,
                        )
                        .map_err(driver(format!(
                            "allowing {} bytes of dynamic shared memory for {}",
                            k.dynamic_smem, k.name
                        )))?;
                    }
                    functions.push(Some(f));
                }
                Step::Gemm(_) => {
                    self.ensure_blas()?;
                    functions.push(None);
                }
                Step::AllReduce(_) => {
                    super::multi::check_rank(self.nccl.as_ref(), plan.gpus)?;
                    functions.push(None);
                }
            }
        }
        Ok(Program {
            _module: module,
            functions,
            plan: plan.clone(),
        })
    }

    /// Allocates (zeroed) buffers for `prog`'s inputs, outputs and workspace.
    pub fn alloc(&self, prog: &Program) -> Result<Buffers, RunError> {
        self.alloc_sharing_workspace(prog, None)
    }

    /// Allocates (zeroed) inputs and outputs for `prog`, and the workspace of `share` if given
    /// (a caller executing one plan on several buffer sets in turn needs one workspace).
    pub fn alloc_sharing_workspace(
        &self,
        prog: &Program,
        share: Option<&Buffers>,
    ) -> Result<Buffers, RunError> {
        let plan = &prog.plan;
        let workspace = if share.is_some() {
            0
        } else {
            plan.workspace_bytes
        };
        let needed = plan
            .inputs
            .iter()
            .chain(&plan.outputs)
            .map(TensorDirective::alloc_bytes)
            .fold(workspace, usize::saturating_add);
        // The free memory of this GPU: its context must be the current one.
        self.ctx
            .bind_to_thread()
            .map_err(driver("binding the GPU's context"))?;
        let (free, _) = cudarc::driver::result::mem_get_info()
            .map_err(driver("reading the free device memory"))?;
        let (available, why) = match self.max_memory {
            Some(m) if m < free => (m, "the limit given with --max-device-memory".to_string()),
            _ => (free, format!("free on {}", self.name)),
        };
        if needed > available {
            return Err(RunError::OutOfMemory {
                needed,
                available,
                why,
            });
        }
        let alloc = |d: &TensorDirective| -> Result<CudaSlice<u8>, RunError> {
            let n = d.alloc_bytes();
            self.stream.alloc_zeros::<u8>(n).map_err(|e| match e.0 {
                cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => RunError::OutOfMemory {
                    needed,
                    available: free,
                    why: format!("cudaMalloc of {n} bytes failed"),
                },
                _ => RunError::Driver {
                    what: format!("allocating {n} bytes"),
                    source: e,
                },
            })
        };
        let inputs = prog
            .plan
            .inputs
            .iter()
            .map(alloc)
            .collect::<Result<_, _>>()?;
        let outputs = prog
            .plan
            .outputs
            .iter()
            .map(alloc)
            .collect::<Result<_, _>>()?;
        let workspace = match (prog.plan.workspace_bytes, share) {
            (0, _) => None,
            (_, Some(s)) => s.workspace.clone(),
            (n, None) => {
                Some(Arc::new(self.stream.alloc_zeros::<u8>(n).map_err(
                    driver(format!("allocating {n} bytes of workspace")),
                )?))
            }
        };
        Ok(Buffers {
            inputs,
            outputs,
            workspace,
            placed: false,
            exchange: None,
        })
    }

    /// Allocates `prog`'s inputs as [`Gpu::alloc`] does and places its outputs and workspace in
    /// `region` (zeroed here), at the offsets [`placed_bytes`] counts.
    ///
    /// # Safety
    /// `region` must be device memory of this GPU of at least `placed_bytes(plan, align)` bytes
    /// that outlives the returned buffers and that nothing else uses meanwhile.
    pub(crate) unsafe fn alloc_placed(
        &self,
        prog: &Program,
        region: cudarc::driver::sys::CUdeviceptr,
        align: usize,
    ) -> Result<Buffers, RunError> {
        let plan = &prog.plan;
        // Inputs as usual; the outputs and workspace allocated here are replaced below.
        let mut b = self.alloc_sharing_workspace(prog, None)?;
        b.outputs.clear();
        b.workspace = None;
        b.placed = true;
        let mut at = region;
        let mut take = |n: usize| -> Result<CudaSlice<u8>, RunError> {
            // SAFETY: inside the region the caller vouches for; leaked, never freed, on drop.
            let s = unsafe { self.stream.upgrade_device_ptr::<u8>(at, n) };
            at += n.next_multiple_of(align) as u64;
            Ok(s)
        };
        for d in &plan.outputs {
            b.outputs.push(take(d.alloc_bytes())?);
        }
        if plan.workspace_bytes > 0 {
            b.workspace = Some(Arc::new(take(plan.workspace_bytes)?));
        }
        let total = placed_bytes(plan, align);
        // SAFETY: the region holds `total` bytes (the caller's promise).
        unsafe {
            cudarc::driver::result::memset_d8_async(region, 0, total, self.stream.cu_stream())
        }
        .map_err(driver("zeroing the placed buffers"))?;
        Ok(b)
    }

    /// Copies `bytes` (the whole caller buffer of input `i`) to the device.
    pub fn upload_input(&self, bufs: &mut Buffers, i: usize, bytes: &[u8]) -> Result<(), RunError> {
        let dst = bufs
            .inputs
            .get_mut(i)
            .ok_or_else(|| RunError::Plan(format!("no input {i}")))?;
        if bytes.len() != dst.len() {
            return Err(RunError::Plan(format!(
                "input {i}: {} bytes given, the buffer holds {}",
                bytes.len(),
                dst.len()
            )));
        }
        self.stream
            .memcpy_htod(bytes, dst)
            .map_err(driver(format!("copying input {i} to the device")))
    }

    /// Copies every input buffer of `from` into `to` (on the device).
    pub fn copy_inputs(&self, from: &Buffers, to: &mut Buffers) -> Result<(), RunError> {
        for (i, (src, dst)) in from.inputs.iter().zip(to.inputs.iter_mut()).enumerate() {
            self.stream
                .memcpy_dtod(src, dst)
                .map_err(driver(format!("copying input {i} on the device")))?;
        }
        Ok(())
    }

    /// Fills every output buffer with `byte` (0xFF: NaN for floats, -1 for signed integers).
    pub fn poison_outputs(&self, bufs: &mut Buffers, byte: u8) -> Result<(), RunError> {
        for (j, o) in bufs.outputs.iter_mut().enumerate() {
            let host = vec![byte; o.len()];
            self.stream
                .memcpy_htod(&host, o)
                .map_err(driver(format!("poisoning output {j}")))?;
        }
        Ok(())
    }

    /// Copies output `j`'s whole buffer back.
    pub fn download_output(&self, bufs: &Buffers, j: usize) -> Result<Vec<u8>, RunError> {
        let src = bufs
            .outputs
            .get(j)
            .ok_or_else(|| RunError::Plan(format!("no output {j}")))?;
        self.stream
            .clone_dtoh(src)
            .map_err(driver(format!("copying output {j} back")))
    }

    /// Waits for everything queued on the device by this process (every stream, the callers'
    /// too).
    pub fn ctx_synchronize(&self) -> Result<(), RunError> {
        self.ctx.synchronize().map_err(driver(
            "waiting for the device (a kernel faulted or a launch failed)",
        ))
    }

    /// Waits for everything queued on the stream.
    pub fn synchronize(&self) -> Result<(), RunError> {
        self.stream.synchronize().map_err(driver(
            "running the plan (a kernel faulted or a launch failed)",
        ))
    }

    /// Launches `k` on `stream` (`cuLaunchKernelEx`); a programmatic kernel may start before
    /// the previous kernel on the stream ends and waits for it itself.
    fn launch(
        &self,
        f: &CudaFunction,
        k: &crate::emit::launch::KernelLaunch,
        args: &[u64],
        maps: &[TensorMapArg],
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<(), RunError> {
        use cudarc::driver::sys;
        let mut params: Vec<*mut std::ffi::c_void> = args
            .iter()
            .map(|a| a as *const u64 as *mut std::ffi::c_void)
            .chain(
                maps.iter()
                    .map(|m| m as *const TensorMapArg as *mut std::ffi::c_void),
            )
            .collect();
        // SAFETY: a zeroed attribute is a valid plain-data value; id and value are set below.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let cfg = sys::CUlaunchConfig {
            gridDimX: k.grid[0],
            gridDimY: k.grid[1],
            gridDimZ: k.grid[2],
            blockDimX: k.block[0],
            blockDimY: k.block[1],
            blockDimZ: k.block[2],
            sharedMemBytes: k.dynamic_smem,
            hStream: stream,
            attrs: &mut attr,
            numAttrs: u32::from(k.programmatic),
        };
        self.ctx
            .bind_to_thread()
            .map_err(driver(format!("launching {}", k.name)))?;
        // SAFETY: `params` points at the kernel's arguments in order (pointers, then tensor
        // maps), alive for the call, as the emitter declared them; `cfg` describes the launch.
        let r = unsafe {
            sys::cuLaunchKernelEx(
                &cfg,
                f.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        r.result().map_err(driver(if k.programmatic {
            format!("launching {} (programmatic)", k.name)
        } else {
            format!("launching {}", k.name)
        }))
    }

    fn address(&self, prog: &Program, bufs: Bufs<'_>, b: Binding) -> Result<u64, RunError> {
        let (buffer, offset) = prog.plan.resolve(b).ok_or_else(|| {
            RunError::Plan(format!("the plan binds a buffer it does not have: {b:?}"))
        })?;
        let missing = || RunError::Plan(format!("no buffer given for {buffer:?}"));
        let no_exchange = || {
            RunError::Plan(
                "the plan fuses an all-reduce into a kernel, which needs every GPU's exchange \
                 buffer: run it with --gpus N (or plan it with --all-reduce nccl)"
                    .into(),
            )
        };
        let base = match bufs {
            Bufs::Owned(bufs) => {
                let base = |s: &CudaSlice<u8>| -> u64 {
                    let (p, _sync) = s.device_ptr(&self.stream);
                    p
                };
                match buffer {
                    BufferRef::Input(i) => base(bufs.inputs.get(i).ok_or_else(missing)?),
                    BufferRef::Output(j) => base(bufs.outputs.get(j).ok_or_else(missing)?),
                    BufferRef::Workspace => base(bufs.workspace.as_ref().ok_or_else(|| {
                        RunError::Plan("the plan binds the workspace but has none".into())
                    })?),
                    BufferRef::Exchange(r) => match &bufs.exchange {
                        Some((ptrs, _)) => *ptrs.get(r).ok_or_else(missing)?,
                        None => return Err(no_exchange()),
                    },
                    BufferRef::Rank => match &bufs.exchange {
                        Some((_, rank)) => *rank as u64,
                        None => return Err(no_exchange()),
                    },
                }
            }
            Bufs::Raw(r) => match buffer {
                BufferRef::Input(i) => *r.inputs.get(i).ok_or_else(missing)?,
                BufferRef::Output(j) => *r.outputs.get(j).ok_or_else(missing)?,
                BufferRef::Workspace => r.workspace,
                BufferRef::Exchange(_) | BufferRef::Rank => return Err(no_exchange()),
            },
        };
        Ok(base + offset as u64)
    }

    /// Runs every step of `prog` and waits for each: a failure names the step that failed
    /// ([`RunError::Fault`]). For checks; [`Gpu::execute`] queues without waiting.
    pub fn execute_checked(&self, prog: &Program, bufs: &Buffers) -> Result<(), RunError> {
        for i in 0..prog.plan.steps.len() {
            self.queue_step(prog, bufs, i)?;
            self.stream
                .synchronize()
                .map_err(|source| RunError::Fault {
                    step: step_name(prog, i),
                    source,
                })?;
        }
        Ok(())
    }

    /// Queues step `i` of `prog` on the stream without waiting (see [`step_name`]).
    pub(crate) fn queue_step(
        &self,
        prog: &Program,
        bufs: &Buffers,
        i: usize,
    ) -> Result<(), RunError> {
        self.execute_steps(prog, Bufs::Owned(bufs), i..i + 1, self.stream.cu_stream())
    }

    /// Queues every step of `prog` on the stream (call [`Gpu::synchronize`] to wait).
    pub fn execute(&self, prog: &Program, bufs: &Buffers) -> Result<(), RunError> {
        self.execute_steps(
            prog,
            Bufs::Owned(bufs),
            0..prog.plan.steps.len(),
            self.stream.cu_stream(),
        )
    }

    /// Queues every step of `prog` on `stream`, a stream of this GPU's primary context that the
    /// caller owns (PyTorch's current stream, say), over buffers the caller owns; returns
    /// without waiting. The queued work can be captured into a CUDA graph.
    ///
    /// # Safety
    /// `stream` must be a live stream of this device's primary context (or null: the legacy
    /// default stream). Every address in `bufs` must point to device memory of this device
    /// holding at least the plan's `alloc_bytes()` of that input or output (the workspace at
    /// least `workspace_bytes`), laid out with the plan's strides, and stay allocated until the
    /// queued work has finished; outputs must not overlap inputs or each other.
    pub unsafe fn execute_raw(
        &self,
        prog: &Program,
        bufs: RawBuffers<'_>,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<(), RunError> {
        check_raw(&prog.plan, bufs)?;
        self.execute_steps(prog, Bufs::Raw(bufs), 0..prog.plan.steps.len(), stream)
    }

    pub(crate) fn execute_steps(
        &self,
        prog: &Program,
        bufs: Bufs<'_>,
        range: std::ops::Range<usize>,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<(), RunError> {
        for (step, f) in prog.plan.steps[range.clone()]
            .iter()
            .zip(&prog.functions[range])
        {
            match (step, f) {
                (Step::Kernel(k), Some(f)) => {
                    let args: Vec<u64> = k
                        .args
                        .iter()
                        .map(|&b| self.address(prog, bufs, b))
                        .collect::<Result<_, _>>()?;
                    let maps: Vec<TensorMapArg> = k
                        .tensor_maps
                        .iter()
                        .map(|m| self.tensor_map(prog, bufs, m, &k.name))
                        .collect::<Result<_, _>>()?;
                    self.launch(f, k, &args, &maps, stream)?;
                }
                (Step::Gemm(g), None) => self.gemm(prog, bufs, g, stream)?,
                (Step::AllReduce(c), None) => {
                    let send = self.address(prog, bufs, c.send)?;
                    let recv = self.address(prog, bufs, c.recv)?;
                    super::multi::all_reduce(self.nccl.as_ref(), c, send, recv, stream)?;
                }
                _ => unreachable!("functions are resolved per step in load"),
            }
        }
        Ok(())
    }
}

/// The checks every execution over caller-owned addresses passes: one address per input and
/// output, none null, and a workspace where the plan needs one.
pub(super) fn check_raw(plan: &LaunchPlan, bufs: RawBuffers<'_>) -> Result<(), RunError> {
    if bufs.inputs.len() != plan.inputs.len() || bufs.outputs.len() != plan.outputs.len() {
        return Err(RunError::Plan(format!(
            "{} inputs and {} outputs given, the plan has {} and {}",
            bufs.inputs.len(),
            bufs.outputs.len(),
            plan.inputs.len(),
            plan.outputs.len()
        )));
    }
    if plan.workspace_bytes > 0 && bufs.workspace == 0 {
        return Err(RunError::Plan(format!(
            "the plan needs {} bytes of workspace and none was given",
            plan.workspace_bytes
        )));
    }
    if let Some(i) = bufs.inputs.iter().chain(bufs.outputs).position(|&a| a == 0) {
        return Err(RunError::Plan(format!("buffer {i} has a null address")));
    }
    Ok(())
}
