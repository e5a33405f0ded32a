//! Graphs on several GPUs (issue 16): one [`Gpu`] per rank of the graph's mesh, each holding
//! its rank of an NCCL communicator made by `ncclCommInitAll` (one process, one host thread and
//! one stream per GPU), the same compiled module loaded on every GPU, and the plan's
//! all-reduce steps run as `ncclAllReduce` (sum) on the rank's stream.
//!
//! Every rank runs the same launch plan on its own shards (a µGraph's shapes are per GPU);
//! [`super::session::check_outputs`] compares each rank's outputs with the interpreter's
//! ([`crate::graph::interp::evaluate_ranks`]), which is how Mirage checks its multi-GPU
//! graphs too (GPU by GPU). One GPU is a mesh of one: [`run_on_ranks`] runs a one-GPU graph
//! by [`super::session::run_once`], and [`super::session::Drawn`] holds one rank.
//!
//! NCCL is loaded at run time (cudarc's `dynamic-loading`): a machine without it gets
//! [`RunError::NoNccl`] before anything is allocated, one with too few devices
//! [`RunError::TooFewGpus`].

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cudarc::driver::CudaContext;
use cudarc::nccl::sys as nccl;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};

use super::bench::{Launch, TimingOptions, median};
use super::run::{Buffers, Gpu, Program, RunError, driver_available, step_name};
use crate::emit::launch::{AllReduceCall, NcclDataType};
use crate::graph::DType;
use crate::graph::interp::{Array, HostTensor};

/// A GPU's rank in a communicator (destroyed with it).
pub struct NcclRank {
    comm: nccl::ncclComm_t,
    /// Set once the communicator has been aborted (it is then neither used nor destroyed).
    aborted: AtomicBool,
    /// This GPU's rank.
    pub rank: usize,
    /// Ranks of the communicator.
    pub ranks: usize,
}

// SAFETY: an NCCL communicator may be used from any host thread, one call at a time; mucc
// uses each rank's communicator only from the thread that runs that rank's steps.
unsafe impl Send for NcclRank {}
// SAFETY: as above; shared references only read `rank` and `ranks`, and calls on the
// communicator are made by one thread at a time (the rank's).
unsafe impl Sync for NcclRank {}

impl Drop for NcclRank {
    fn drop(&mut self) {
        if self.aborted.load(Ordering::SeqCst) {
            return;
        }
        // SAFETY: the communicator was created by ncclCommInitAll and is destroyed once.
        unsafe {
            let _ = cudarc::nccl::result::comm_destroy(self.comm);
        }
    }
}

impl NcclRank {
    /// Whether the communicator has been aborted (it can no longer be used).
    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    /// An error NCCL reports asynchronously (a failed transport, say), if any.
    fn async_error(&self) -> Result<(), RunError> {
        let mut result = nccl::ncclResult_t::ncclSuccess;
        // SAFETY: the communicator is live (checked by the caller: not aborted).
        let status = unsafe { nccl::ncclCommGetAsyncError(self.comm, &mut result) };
        match (status, result) {
            (nccl::ncclResult_t::ncclSuccess, nccl::ncclResult_t::ncclSuccess)
            | (nccl::ncclResult_t::ncclSuccess, nccl::ncclResult_t::ncclInProgress) => Ok(()),
            (nccl::ncclResult_t::ncclSuccess, r) | (r, _) => Err(RunError::Nccl {
                what: format!("rank {}: an asynchronous NCCL error", self.rank),
                result: format!("{r:?}"),
            }),
        }
    }

    /// Aborts the communicator (once). Called only when no host thread is inside an NCCL call
    /// on any rank: aborting the last communicator of an `ncclCommInitAll` group frees them all.
    fn abort(&self) {
        if !self.aborted.swap(true, Ordering::SeqCst) {
            // SAFETY: the communicator is live (not yet aborted or destroyed);
            // ncclCommAbort may be called while other threads are blocked in it.
            unsafe {
                let _ = cudarc::nccl::result::comm_abort(self.comm);
            }
        }
    }
}

impl std::fmt::Debug for NcclRank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NCCL rank {} of {}", self.rank, self.ranks)
    }
}

fn nccl_error(what: impl Into<String>) -> impl FnOnce(cudarc::nccl::result::NcclError) -> RunError {
    let what = what.into();
    move |e| RunError::Nccl {
        what,
        result: format!("{:?}", e.0),
    }
}

fn nccl_type(t: NcclDataType) -> nccl::ncclDataType_t {
    use nccl::ncclDataType_t as T;
    match t {
        NcclDataType::Int8 => T::ncclInt8,
        NcclDataType::Uint8 => T::ncclUint8,
        NcclDataType::Int32 => T::ncclInt32,
        NcclDataType::Uint32 => T::ncclUint32,
        NcclDataType::Int64 => T::ncclInt64,
        NcclDataType::Uint64 => T::ncclUint64,
        NcclDataType::Float16 => T::ncclFloat16,
        NcclDataType::Bfloat16 => T::ncclBfloat16,
        NcclDataType::Float32 => T::ncclFloat32,
        NcclDataType::Float64 => T::ncclFloat64,
    }
}

/// Whether libnccl can be loaded.
pub fn nccl_available() -> bool {
    // SAFETY: only probes for the library.
    unsafe { nccl::is_culib_present() }
}

/// NCCL's version ("2.27.7"), if the library loads.
pub fn nccl_version() -> Option<String> {
    if !nccl_available() {
        return None;
    }
    let v = cudarc::nccl::result::get_nccl_version().ok()?;
    // NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch (since 2.9).
    Some(format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100))
}

/// Checks that a GPU can run a plan of `gpus` GPUs: with more than one, it must hold a rank
/// of a communicator of exactly that many.
pub(crate) fn check_rank(rank: Option<&NcclRank>, gpus: usize) -> Result<(), RunError> {
    match rank {
        Some(r) if r.is_aborted() => Err(RunError::Plan(format!(
            "{r:?}: its communicator was aborted after an earlier failure; nothing further can \
             run on these GPUs in this process"
        ))),
        Some(r) if r.ranks == gpus => Ok(()),
        Some(r) => Err(RunError::Plan(format!(
            "the plan runs on {gpus} GPUs but this GPU is {r:?}"
        ))),
        None => Err(RunError::Plan(format!(
            "the plan runs on {gpus} GPUs (it all-reduces across them) and needs an NCCL \
             communicator: run it with --gpus {gpus}"
        ))),
    }
}

/// Queues the all-reduce `c` from device address `send` into `recv` on `stream`.
pub(crate) fn all_reduce(
    rank: Option<&NcclRank>,
    c: &AllReduceCall,
    send: u64,
    recv: u64,
    stream: cudarc::driver::sys::CUstream,
) -> Result<(), RunError> {
    let r =
        rank.ok_or_else(|| RunError::Plan("an all-reduce step without a communicator".into()))?;
    // SAFETY: `send` and `recv` are device buffers of this GPU holding `count` elements of
    // `dtype` (the plan's bindings, resolved against buffers of the plan's sizes), and the
    // stream belongs to this GPU's context.
    unsafe {
        cudarc::nccl::result::all_reduce(
            send as usize as *const c_void,
            recv as usize as *mut c_void,
            c.count,
            nccl_type(c.dtype),
            nccl::ncclRedOp_t::ncclSum,
            r.comm,
            stream as nccl::cudaStream_t,
        )
    }
    .map_err(nccl_error(format!(
        "ncclAllReduce of {} {} elements on rank {}",
        c.count, c.dtype, r.rank
    )))?;
    Ok(())
}

/// Opens devices `first + 1 .. first + n` next to `gpu0` (device `first`) and gives every one
/// its rank of one communicator (`ncclCommInitAll`); returns the other ranks' GPUs. Checks the
/// device count, that NCCL loads, and that all GPUs share `gpu0`'s architecture, before
/// creating anything.
pub fn open_ranks(gpu0: &mut Gpu, first: usize, n: usize) -> Result<Vec<Gpu>, RunError> {
    if n <= 1 {
        return Ok(Vec::new());
    }
    if !driver_available() {
        return Err(RunError::NoDriver);
    }
    let found = CudaContext::device_count().map_err(|e| RunError::NoDevice(e.to_string()))?;
    let found = found.max(0) as usize;
    if first + n > found {
        return Err(RunError::TooFewGpus {
            needed: n,
            first,
            found,
        });
    }
    if !nccl_available() {
        return Err(RunError::NoNccl(n));
    }
    let mut others = Vec::new();
    for d in first + 1..first + n {
        let g = Gpu::open(d)?;
        if g.arch != gpu0.arch {
            return Err(RunError::MixedGpus {
                ordinal: d,
                name: g.name.clone(),
                arch: g.arch,
                first,
                first_arch: gpu0.arch,
            });
        }
        others.push(g);
    }
    for g in &mut others {
        g.max_memory = gpu0.max_memory;
    }
    let devices: Vec<i32> = (first..first + n).map(|d| d as i32).collect();
    // Every connection made at initialisation rather than lazily by the first all-reduce (a
    // lazy setup waits for the peers inside the host call, where a failed peer cannot be
    // noticed); the caller's setting wins.
    if std::env::var_os("NCCL_RUNTIME_CONNECT").is_none() {
        // SAFETY: no thread of mucc reads or writes the environment meanwhile (rank threads
        // start later; NCCL reads it during the initialisation below, on this thread). The
        // CUDA driver's own threads exist by now; they are not known to read it.
        unsafe { std::env::set_var("NCCL_RUNTIME_CONNECT", "0") };
    }
    let mut comms: Vec<nccl::ncclComm_t> = vec![std::ptr::null_mut(); n];
    // SAFETY: `comms` has room for `n` communicators and `devices` lists `n` device ordinals.
    unsafe { cudarc::nccl::result::comm_init_all(comms.as_mut_ptr(), n as i32, devices.as_ptr()) }
        .map_err(nccl_error(format!(
            "ncclCommInitAll over devices {devices:?}"
        )))?;
    for (r, comm) in comms.into_iter().enumerate() {
        let rank = NcclRank {
            comm,
            aborted: AtomicBool::new(false),
            rank: r,
            ranks: n,
        };
        if r == 0 {
            gpu0.nccl = Some(rank);
        } else {
            others[r - 1].nccl = Some(rank);
        }
    }
    let mut all: Vec<&Gpu> = vec![gpu0];
    all.extend(others.iter());
    if let Err(e) = self_test(&all) {
        // Communicators that failed their first all-reduce are aborted, not destroyed (a
        // destroy waits for work that may never finish), and no GPU keeps one.
        let stuck = abort_all(&all).err().unwrap_or_default();
        gpu0.nccl = None;
        for g in &mut others {
            g.nccl = None;
        }
        return Err(RunError::RankFailed {
            rank: 0,
            source: Box::new(e),
            stuck,
        });
    }
    Ok(others)
}

/// Sums each rank's number (rank + 1) over the communicators once, all ranks from this thread
/// in one NCCL group, waits by polling (a deadline and NCCL's asynchronous errors, as for a
/// graph) and checks the result on every GPU: a communicator that cannot all-reduce fails
/// here, before any graph runs.
fn self_test(gpus: &[&Gpu]) -> Result<(), RunError> {
    let n = gpus.len();
    let mut bufs = PerRank { items: Vec::new() };
    for (r, g) in gpus.iter().enumerate() {
        let b = g
            .stream
            .clone_htod(&[(r + 1) as f32])
            .map_err(super::run::driver("allocating the NCCL self-test buffer"))?;
        bufs.items.push((g.ctx.clone(), b));
    }
    cudarc::nccl::result::group_start().map_err(nccl_error("ncclGroupStart"))?;
    let mut queued = Ok(());
    for (g, (_, b)) in gpus.iter().zip(&bufs.items) {
        let (ptr, _sync) = cudarc::driver::DevicePtr::device_ptr(b, &g.stream);
        let at = crate::sched::plan::Binding::Workspace {
            byte_offset: 0,
            elem_offset: 0,
            elem_bytes: 4,
        };
        let call = AllReduceCall {
            send: at,
            recv: at,
            count: 1,
            dtype: NcclDataType::Float32,
        };
        queued = all_reduce(g.nccl.as_ref(), &call, ptr, ptr, g.stream.cu_stream());
        if queued.is_err() {
            break;
        }
    }
    let ended = cudarc::nccl::result::group_end().map_err(nccl_error("ncclGroupEnd"));
    queued?;
    ended?;
    let never = AtomicBool::new(false);
    for g in gpus {
        make_current(&g.ctx);
        wait(g, &never, step_deadline(), "the NCCL all-reduce self-test").map_err(|s| match s {
            Stop::Failed(e) => e,
            Stop::Cancelled => RunError::Plan("the self-test was cancelled".into()),
        })?;
    }
    let want = (n * (n + 1) / 2) as f32;
    for (r, (g, (_, b))) in gpus.iter().zip(&bufs.items).enumerate() {
        let got = g
            .stream
            .clone_dtoh(b)
            .map_err(super::run::driver("reading the NCCL self-test result"))?;
        if got != [want] {
            return Err(RunError::Nccl {
                what: format!("the all-reduce self-test on rank {r}"),
                result: format!("{got:?} where the sum is {want}"),
            });
        }
    }
    Ok(())
}

/// One rank's part of a run: its GPU, its loaded program and its buffers.
pub struct RankRun<'a> {
    /// The GPU.
    pub gpu: &'a Gpu,
    /// The program loaded on it.
    pub prog: &'a Program,
    /// Its buffers (inputs uploaded).
    pub bufs: &'a Buffers,
}

/// How long one step of a multi-GPU run may go without finishing before the run is abandoned
/// (a rank waiting forever in an all-reduce for a peer that never arrives): `MUCC_NCCL_TIMEOUT`
/// seconds, 300 by default.
fn step_deadline() -> Duration {
    let secs = std::env::var("MUCC_NCCL_TIMEOUT")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&s| s > 0)
        .unwrap_or(300);
    Duration::from_secs(secs)
}

/// Why a rank stopped: its own failure, or the cancellation that another rank's failure asked
/// for.
enum Stop {
    Failed(RunError),
    Cancelled,
}

/// Waits for `gpu`'s queued work by polling its stream (never blocking in the driver, so that
/// a rank whose peer failed can leave): until the work is done, another rank cancels the run,
/// NCCL reports an asynchronous error, or `timeout` passes.
fn wait(gpu: &Gpu, cancel: &AtomicBool, timeout: Duration, what: &str) -> Result<(), Stop> {
    use cudarc::driver::sys::CUresult;
    let start = Instant::now();
    let mut pause = Duration::from_micros(5);
    loop {
        // SAFETY: the stream is live and belongs to the context bound to this thread.
        match unsafe { cudarc::driver::sys::cuStreamQuery(gpu.stream.cu_stream()) } {
            CUresult::CUDA_SUCCESS => return Ok(()),
            CUresult::CUDA_ERROR_NOT_READY => {}
            other => {
                return Err(Stop::Failed(RunError::Fault {
                    step: what.to_string(),
                    source: cudarc::driver::DriverError(other),
                }));
            }
        }
        if cancel.load(Ordering::SeqCst) {
            return Err(Stop::Cancelled);
        }
        if let Some(r) = &gpu.nccl {
            r.async_error().map_err(Stop::Failed)?;
        }
        if start.elapsed() > timeout {
            return Err(Stop::Failed(RunError::Nccl {
                what: format!("{what}: not finished after {} s", timeout.as_secs()),
                result: "a timeout (MUCC_NCCL_TIMEOUT sets it; a peer rank may never have \
                         arrived at the all-reduce)"
                    .into(),
            }));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    }
}

/// What a rank's job may do besides queuing work: wait for its stream (polling, see [`wait`])
/// and see whether another rank has failed.
struct RankControl<'a> {
    cancel: &'a AtomicBool,
    timeout: Duration,
}

impl RankControl<'_> {
    /// Waits until `gpu`'s queued work (described by `what`) is done.
    fn wait(&self, gpu: &Gpu, what: &str) -> Result<(), Stop> {
        wait(gpu, self.cancel, self.timeout, what)
    }

    /// Leaves when another rank has failed.
    fn check(&self) -> Result<(), Stop> {
        if self.cancel.load(Ordering::SeqCst) {
            Err(Stop::Cancelled)
        } else {
            Ok(())
        }
    }
}

/// Runs `job` for every rank at once, one host thread per GPU (its context bound), and returns
/// the ranks' results in order.
///
/// When a rank fails, the others are cancelled: they poll their streams rather than block
/// (see [`wait`]), notice, and leave without another NCCL call. Once every thread has
/// returned — so that no host thread is inside NCCL — every communicator is aborted (which
/// makes the NCCL kernels still waiting for the failed rank exit) and the streams drained.
/// The communicators are then unusable: the error ([`RunError::RankFailed`]) is fatal.
fn on_every_rank<T: Send>(
    ranks: &[RankRun<'_>],
    job: impl Fn(&RankRun<'_>, &RankControl<'_>) -> Result<T, Stop> + Sync,
) -> Result<Vec<T>, RunError> {
    let cancel = AtomicBool::new(false);
    let control = RankControl {
        cancel: &cancel,
        timeout: step_deadline(),
    };
    let results: Vec<Result<T, Stop>> = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter()
            .map(|r| {
                let (control, job) = (&control, &job);
                s.spawn(move || {
                    let body = || -> Result<T, Stop> {
                        make_current(&r.gpu.ctx);
                        job(r, control)
                    };
                    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body))
                        .unwrap_or_else(|_| {
                            Err(Stop::Failed(RunError::Plan(
                                "the rank's host thread panicked".into(),
                            )))
                        });
                    if matches!(res, Err(Stop::Failed(_))) {
                        control.cancel.store(true, Ordering::SeqCst);
                    }
                    res
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Stop::Failed(RunError::Plan(
                        "the rank's host thread panicked".into(),
                    )))
                })
            })
            .collect()
    });
    let mut values = Vec::new();
    let mut failure = None;
    for (rank, r) in results.into_iter().enumerate() {
        match r {
            Ok(v) => values.push(v),
            Err(Stop::Failed(e)) if failure.is_none() => failure = Some((rank, e)),
            Err(_) => {}
        }
    }
    let Some((rank, source)) = failure else {
        return Ok(values);
    };
    let gpus: Vec<&Gpu> = ranks.iter().map(|r| r.gpu).collect();
    let stuck = abort_all(&gpus).err().unwrap_or_default();
    Err(RunError::RankFailed {
        rank,
        source: Box::new(source),
        stuck,
    })
}

/// Runs every rank's steps at once (each all-reduce waits for all ranks), each step waited
/// for so that a failure names its step and rank; see `on_every_rank` for failures.
pub fn execute_ranks(ranks: &[RankRun<'_>]) -> Result<(), RunError> {
    on_every_rank(ranks, |r, c| {
        for i in 0..r.prog.plan().steps.len() {
            c.check()?;
            r.gpu.queue_step(r.prog, r.bufs, i).map_err(Stop::Failed)?;
            c.wait(r.gpu, &step_name(r.prog, i))?;
        }
        Ok(())
    })
    .map(|_| ())
}

/// Times `steps` of every rank, `o.warmup` untimed and `o.samples` timed samples queued back to
/// back, each between two events on the rank's stream, then waited for once (so that the
/// ranks' all-reduces keep them in step, as `nccl-tests` does, and no host wake-up lands in a
/// sample). With [`Launch::Stream`] a sample is one execution launched step by step; with
/// [`Launch::Graph`] every rank captures `o.min_executions_per_sample` executions (its NCCL
/// calls included) into a CUDA graph after one plain execution, and a sample is one replay.
/// Returns per rank the timed samples in microseconds per execution.
fn time_steps(
    ranks: &[RankRun<'_>],
    steps: &[usize],
    o: &TimingOptions,
) -> Result<Vec<Vec<f64>>, RunError> {
    on_every_rank(ranks, |r, c| {
        let failed = |what: &str| {
            let what = what.to_string();
            move |e: cudarc::driver::DriverError| Stop::Failed(super::run::driver(what)(e))
        };
        let event = || {
            r.gpu
                .stream
                .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(failed("recording an event"))
        };
        let queue = || -> Result<(), Stop> {
            for &i in steps {
                r.gpu.queue_step(r.prog, r.bufs, i).map_err(Stop::Failed)?;
            }
            Ok(())
        };
        let samples = o.samples.max(1);
        let mut marks = Vec::with_capacity(samples);
        let per = match o.launch {
            Launch::Stream => {
                for k in 0..o.warmup + samples {
                    c.check()?;
                    let start = (k >= o.warmup).then(event).transpose()?;
                    queue()?;
                    if let Some(start) = start {
                        marks.push((start, event()?));
                    }
                }
                c.wait(r.gpu, "the timed executions")?;
                1
            }
            Launch::Graph => {
                // Module loading, cuBLAS's and NCCL's lazy set-up must not happen under capture.
                queue()?;
                c.wait(r.gpu, "the execution before the capture")?;
                let per = o.min_executions_per_sample.max(1);
                r.gpu
                    .stream
                    .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                    .map_err(failed("starting a CUDA-graph capture"))?;
                let queued = (0..per).try_for_each(|_| queue());
                let captured = r.gpu.stream.end_capture(CUgraphInstantiate_flags(0));
                queued?;
                let graph = captured
                    .map_err(failed(
                        "capturing the plan (NCCL calls included) into a CUDA graph",
                    ))?
                    .ok_or_else(|| {
                        Stop::Failed(RunError::Plan("the CUDA-graph capture was empty".into()))
                    })?;
                graph.upload().map_err(failed("uploading the CUDA graph"))?;
                let replay = || graph.launch().map_err(failed("replaying the CUDA graph"));
                for _ in 0..o.warmup.max(1) {
                    c.check()?;
                    replay()?;
                }
                for _ in 0..samples {
                    c.check()?;
                    let start = event()?;
                    replay()?;
                    marks.push((start, event()?));
                }
                c.wait(r.gpu, "the timed replays")?;
                per
            }
        };
        marks
            .iter()
            .map(|(start, end)| {
                start
                    .elapsed_ms(end)
                    .map(|ms| f64::from(ms) * 1e3 / per as f64)
                    .map_err(failed("reading the event times"))
            })
            .collect()
    })
}

/// What `mucc bench --gpus N` measures for one graph.
#[derive(Clone, Debug)]
pub struct RankTiming {
    /// Median over the samples of the slowest rank's time for one execution (µs).
    pub median_us: f64,
    /// Each rank's own median (µs).
    pub per_rank_us: Vec<f64>,
    /// Median time of the plan's all-reduce steps alone, back to back (µs), if it has any.
    pub all_reduce_us: Option<f64>,
    /// Bytes every rank all-reduces per execution.
    pub all_reduce_bytes: usize,
    /// Output elements, over all ranks, that are not finite after the timed executions.
    pub non_finite: usize,
    /// With [`TimingOptions::per_step`]: per step, its name and every rank's median µs alone.
    pub steps: Vec<(String, Vec<f64>)>,
    /// Where the outputs and workspace were (NCCL symmetric windows, or why plain ones).
    pub buffers: String,
}

impl RankTiming {
    /// The all-reduce's algorithm bandwidth (bytes / time) and bus bandwidth (algorithm
    /// bandwidth × 2(n − 1)/n, the figure `nccl-tests` reports for a ring), GB/s.
    pub fn bandwidths(&self, gpus: usize) -> Option<(f64, f64)> {
        let us = self.all_reduce_us?;
        let alg = self.all_reduce_bytes as f64 / (us * 1e3);
        Some((alg, alg * 2.0 * (gpus as f64 - 1.0) / gpus as f64))
    }
}

/// Per sample, the slowest rank's time (the ranks meet in the all-reduce).
fn slowest(per_rank: &[Vec<f64>]) -> Vec<f64> {
    let n = per_rank.iter().map(Vec::len).min().unwrap_or(0);
    (0..n)
        .map(|k| per_rank.iter().map(|t| t[k]).fold(0.0, f64::max))
        .collect()
}

/// Times one compiled graph on every rank as `opts` says (CUDA-graph replays or stream
/// launches, see `time_steps`): the whole plan, then its all-reduce steps alone, then with
/// [`TimingOptions::per_step`] every step alone; loads, allocates and uploads like
/// [`run_on_ranks`].
pub fn time_on_ranks(
    gpus: &mut [&mut Gpu],
    cubin: &[u8],
    launch: &crate::emit::launch::LaunchPlan,
    inputs: &[&[HostTensor]],
    opts: &TimingOptions,
    placement: AllReduceBuffers,
) -> Result<RankTiming, RunError> {
    use crate::emit::launch::Step;
    with_ranks(gpus, cubin, launch, inputs, placement, |ranks, placed| {
        let all: Vec<usize> = (0..launch.steps.len()).collect();
        let per_rank = time_steps(ranks, &all, opts)?;
        let median_us = median(&slowest(&per_rank));
        // Read before anything runs again: a step that works in place, repeated alone, would
        // change them.
        let mut non_finite = 0;
        for (r, rr) in ranks.iter().enumerate() {
            let outs = super::session::read_outputs(rr.gpu, rr.bufs, launch)
                .map_err(|e| RunError::Plan(format!("rank {r}: {e}")))?;
            non_finite += outs
                .iter()
                .map(|(_, a)| a.data.iter().filter(|x| !x.is_finite()).count())
                .sum::<usize>();
        }
        let reduces: Vec<usize> = launch
            .steps
            .iter()
            .enumerate()
            .filter(|(_, s)| matches!(s, Step::AllReduce(_)))
            .map(|(i, _)| i)
            .collect();
        let all_reduce_bytes = launch
            .steps
            .iter()
            .map(|s| match s {
                Step::AllReduce(c) => c.count * c.dtype.bytes(),
                _ => 0,
            })
            .sum();
        let all_reduce_us = if reduces.is_empty() {
            None
        } else {
            let t = time_steps(ranks, &reduces, opts)?;
            Some(median(&slowest(&t)))
        };
        let mut steps = Vec::new();
        if opts.per_step {
            for i in 0..launch.steps.len() {
                let t = time_steps(ranks, &[i], opts)?;
                steps.push((
                    step_name(ranks[0].prog, i),
                    t.iter().map(|s| median(s)).collect(),
                ));
            }
        }
        Ok(RankTiming {
            median_us,
            per_rank_us: per_rank.iter().map(|t| median(t)).collect(),
            all_reduce_us,
            all_reduce_bytes,
            non_finite,
            steps,
            buffers: placed.to_string(),
        })
    })
}

/// Makes `ctx` current on this thread even when an earlier asynchronous error is pending in it
/// (cudarc's `bind_to_thread` reports such an error instead of binding).
fn make_current(ctx: &CudaContext) {
    // SAFETY: the context is alive (borrowed) and made current on this thread only.
    let _ = unsafe { cudarc::driver::result::ctx::set_current(ctx.cu_ctx()) };
}

/// Drains every rank's stream by polling, for at most `limit`; the ranks whose streams did not
/// drain (a kernel that never finishes: nothing in this process can stop it).
fn drain(gpus: &[&Gpu], limit: Duration) -> Vec<usize> {
    use cudarc::driver::sys::CUresult;
    let start = Instant::now();
    let mut stuck = Vec::new();
    for (r, g) in gpus.iter().enumerate() {
        make_current(&g.ctx);
        loop {
            // SAFETY: the stream is live and its context current.
            match unsafe { cudarc::driver::sys::cuStreamQuery(g.stream.cu_stream()) } {
                CUresult::CUDA_ERROR_NOT_READY if start.elapsed() < limit => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                CUresult::CUDA_ERROR_NOT_READY => {
                    stuck.push(r);
                    break;
                }
                // Done, or failed (a faulted context reports its fault here again).
                _ => break,
            }
        }
    }
    stuck
}

/// Aborts every communicator of `gpus` (no host thread may be inside NCCL) and drains their
/// streams; `Err` names the ranks that would not drain.
fn abort_all(gpus: &[&Gpu]) -> Result<(), Vec<usize>> {
    for g in gpus {
        if let Some(c) = &g.nccl {
            make_current(&g.ctx);
            c.abort();
        }
    }
    let stuck = drain(gpus, Duration::from_secs(10));
    if stuck.is_empty() { Ok(()) } else { Err(stuck) }
}

/// Values of several GPUs, each dropped with its GPU's context current (cudarc frees device
/// memory and unloads modules without making the owning context current).
struct PerRank<T> {
    items: Vec<(Arc<CudaContext>, T)>,
}

impl<T> Drop for PerRank<T> {
    fn drop(&mut self) {
        for (ctx, v) in self.items.drain(..) {
            make_current(&ctx);
            drop(v);
        }
    }
}

/// Where the runner puts the buffers that a plan's all-reduces read and write (its outputs
/// and workspace).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AllReduceBuffers {
    /// In one NCCL symmetric window per rank (`ncclMemAlloc`, `ncclCommWindowRegister` with
    /// `NCCL_WIN_COLL_SYMMETRIC`, NCCL 2.27 or newer), at the same offset on every rank, so
    /// that NCCL can take its low-latency symmetric kernels; plain allocations where that is
    /// not possible (the reason is reported).
    #[default]
    Symmetric,
    /// Plain device allocations.
    Plain,
}

/// Alignment of the buffers placed in a window (`NCCL_WIN_REQUIRED_ALIGNMENT`).
const WINDOW_ALIGN: usize = 4096;
/// `NCCL_WIN_COLL_SYMMETRIC`.
const WIN_COLL_SYMMETRIC: i32 = 1;

/// One NCCL window per rank, holding that rank's outputs and workspace; deregistered (all
/// ranks in one NCCL group, from this thread) and freed when dropped, after the buffers in it.
struct Windows {
    items: Vec<(
        Arc<CudaContext>,
        nccl::ncclComm_t,
        *mut c_void,
        nccl::ncclWindow_t,
    )>,
    /// Set when every communicator is still usable: only then is deregistering safe.
    deregister: bool,
}

impl Windows {
    /// Allocates and registers `bytes` on every rank of `gpus` (one NCCL group), or says why
    /// it cannot.
    fn open(gpus: &[&mut Gpu], bytes: usize) -> Result<Windows, String> {
        let version = cudarc::nccl::result::get_nccl_version().map_err(|e| format!("{e:?}"))?;
        if version < 22700 {
            return Err(format!(
                "NCCL {}.{} has no symmetric windows (2.27 or newer)",
                version / 10000,
                version / 100 % 100
            ));
        }
        let mut w = Windows {
            items: Vec::new(),
            deregister: false,
        };
        for g in gpus {
            let comm = g.nccl.as_ref().ok_or("a rank without a communicator")?.comm;
            make_current(&g.ctx);
            let mut p: *mut c_void = std::ptr::null_mut();
            // SAFETY: allocates on the current device (this rank's).
            let r = unsafe { nccl::ncclMemAlloc(&mut p, bytes) };
            if r != nccl::ncclResult_t::ncclSuccess || p.is_null() {
                return Err(format!("ncclMemAlloc of {bytes} bytes: {r:?}"));
            }
            w.items.push((g.ctx.clone(), comm, p, std::ptr::null_mut()));
        }
        let mut group = || -> Result<(), String> {
            cudarc::nccl::result::group_start().map_err(|e| format!("ncclGroupStart: {e:?}"))?;
            let mut failed = None;
            for (ctx, comm, p, win) in &mut w.items {
                make_current(ctx);
                // SAFETY: `p` holds `bytes` from ncclMemAlloc on this rank's device; every
                // rank registers in this one group (the call is collective).
                let r = unsafe {
                    nccl::ncclCommWindowRegister(*comm, *p, bytes, win, WIN_COLL_SYMMETRIC)
                };
                if r != nccl::ncclResult_t::ncclSuccess {
                    failed.get_or_insert(format!("ncclCommWindowRegister: {r:?}"));
                }
            }
            cudarc::nccl::result::group_end().map_err(|e| format!("ncclGroupEnd: {e:?}"))?;
            failed.map_or(Ok(()), Err)
        };
        group()?;
        w.deregister = true;
        Ok(w)
    }
}

impl Drop for Windows {
    fn drop(&mut self) {
        if self.deregister && self.items.iter().all(|(_, _, _, win)| !win.is_null()) {
            // SAFETY: every communicator is live and not aborted (`deregister`); all ranks
            // deregister their window in one group, as the collective call requires.
            unsafe {
                let _ = cudarc::nccl::result::group_start();
                for (ctx, comm, _, win) in &self.items {
                    make_current(ctx);
                    let _ = nccl::ncclCommWindowDeregister(*comm, *win);
                }
                let _ = cudarc::nccl::result::group_end();
            }
        }
        for (ctx, _, p, _) in &self.items {
            make_current(ctx);
            // SAFETY: allocated by ncclMemAlloc on this device; the buffers placed in it were
            // dropped before (declared after the windows) and the streams are idle.
            unsafe {
                let _ = nccl::ncclMemFree(*p);
            }
        }
    }
}

/// The first pair of GPUs (ranks, in order) where one cannot address the other's memory, or
/// `None` when every GPU can address every other's (what a fused all-reduce needs).
pub fn missing_peer_access(gpus: &[&Gpu]) -> Result<Option<(usize, usize)>, RunError> {
    for (i, a) in gpus.iter().enumerate() {
        for (j, b) in gpus.iter().enumerate() {
            if i == j {
                continue;
            }
            let mut can = 0;
            // SAFETY: both devices are open; `can` is written by the call.
            unsafe {
                cudarc::driver::sys::cuDeviceCanAccessPeer(
                    &mut can,
                    a.ctx.cu_device(),
                    b.ctx.cu_device(),
                )
            }
            .result()
            .map_err(super::run::driver("asking for peer access"))?;
            if can == 0 {
                return Ok(Some((i, j)));
            }
        }
    }
    Ok(None)
}

/// The exchange buffers of a plan's fused all-reduces: one zeroed buffer per rank, which every
/// rank addresses directly (peer access between every pair of GPUs; one process, one address
/// space).
struct ExchangeBuffers {
    /// Rank r's buffer, in rank order (the same address from every GPU).
    addresses: Vec<u64>,
    _buffers: PerRank<DeviceAlloc>,
}

/// Device memory from `cuMemAlloc` (not the stream-ordered pool cudarc allocates from, whose
/// memory other GPUs cannot address without pool access rights), freed on drop with its
/// context current ([`PerRank`]).
struct DeviceAlloc(cudarc::driver::sys::CUdeviceptr);

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAlloc in the current context; no work uses it any more
        // (the ranks' streams are idle when the buffers go).
        let _ = unsafe { cudarc::driver::sys::cuMemFree_v2(self.0) };
    }
}

/// Allocates `bytes` of zeroed exchange buffer on every rank and lets every GPU address the
/// others' memory; `None` when the plan needs none.
fn exchange_buffers(gpus: &[&mut Gpu], bytes: usize) -> Result<Option<ExchangeBuffers>, RunError> {
    use cudarc::driver::sys::{self, CUresult};
    if bytes == 0 {
        return Ok(None);
    }
    let all: Vec<&Gpu> = gpus.iter().map(|g| &**g).collect();
    if let Some((i, j)) = missing_peer_access(&all)? {
        return Err(RunError::Plan(format!(
            "rank {i}'s GPU cannot address rank {j}'s memory (no peer access), which a fused \
             all-reduce needs: run with --all-reduce nccl"
        )));
    }
    for (i, a) in gpus.iter().enumerate() {
        for (j, b) in gpus.iter().enumerate() {
            if i == j {
                continue;
            }
            make_current(&a.ctx);
            // SAFETY: `b`'s context is alive; enabling access twice is reported and ignored.
            let r = unsafe { sys::cuCtxEnablePeerAccess(b.ctx.cu_ctx(), 0) };
            if r != CUresult::CUDA_SUCCESS && r != CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
            {
                return Err(RunError::Plan(format!(
                    "enabling rank {i}'s access to rank {j}'s memory: {r:?}"
                )));
            }
        }
    }
    let mut buffers = PerRank { items: Vec::new() };
    let mut addresses = Vec::new();
    for (r, gpu) in gpus.iter().enumerate() {
        make_current(&gpu.ctx);
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: the rank's context is current; `p` is written by the call.
        unsafe { sys::cuMemAlloc_v2(&mut p, bytes) }
            .result()
            .map_err(super::run::driver(format!(
                "allocating rank {r}'s exchange buffer ({bytes} bytes)"
            )))?;
        buffers.items.push((gpu.ctx.clone(), DeviceAlloc(p)));
        // SAFETY: `p` holds `bytes` bytes of this context's memory. Synchronous: zeroed before
        // any rank's kernel stores into it.
        unsafe { sys::cuMemsetD8_v2(p, 0, bytes) }
            .result()
            .map_err(super::run::driver("zeroing an exchange buffer"))?;
        addresses.push(p);
    }
    Ok(Some(ExchangeBuffers {
        addresses,
        _buffers: buffers,
    }))
}

/// Loads `cubin` on every GPU, allocates its buffers (outputs and workspace in NCCL windows
/// when `placement` asks for it and the plan all-reduces), uploads `inputs[r]` to rank `r` and
/// poisons the outputs, then calls `f` with the ranks and a description of where the
/// all-reduce buffers are. Each rank's module and buffers are released with that GPU's context
/// current, whether `f` succeeds or fails.
fn with_ranks<T>(
    gpus: &mut [&mut Gpu],
    cubin: &[u8],
    launch: &crate::emit::launch::LaunchPlan,
    inputs: &[&[HostTensor]],
    placement: AllReduceBuffers,
    f: impl FnOnce(&[RankRun<'_>], &str) -> Result<T, RunError>,
) -> Result<T, RunError> {
    if inputs.len() != gpus.len() {
        return Err(RunError::Plan(format!(
            "{} ranks of inputs for {} GPUs",
            inputs.len(),
            gpus.len()
        )));
    }
    let reduces = launch
        .steps
        .iter()
        .any(|s| matches!(s, crate::emit::launch::Step::AllReduce(_)));
    // Declared first, dropped last: the windows after the buffers in them, the buffers before
    // the modules.
    let (windows, placed) = match (placement, reduces) {
        (AllReduceBuffers::Symmetric, true) => {
            let bytes = super::run::placed_bytes(launch, WINDOW_ALIGN).max(WINDOW_ALIGN);
            match Windows::open(gpus, bytes) {
                Ok(w) => (Some(w), "NCCL symmetric windows".to_string()),
                Err(why) => (None, format!("plain allocations (no NCCL window: {why})")),
            }
        }
        (AllReduceBuffers::Symmetric, false) => (None, "no NCCL all-reduce step".to_string()),
        (AllReduceBuffers::Plain, _) => (None, "plain allocations".to_string()),
    };
    let mut windows = windows;
    // Before the buffers, dropped after them: the fused all-reduces' exchange buffers.
    let exchange = exchange_buffers(gpus, launch.exchange_bytes)?;
    let mut progs = PerRank { items: Vec::new() };
    let mut bufs = PerRank { items: Vec::new() };
    for (r, gpu) in gpus.iter_mut().enumerate() {
        let prog = gpu.load(cubin, launch)?;
        progs.items.push((gpu.ctx.clone(), prog));
        let prog = &progs.items[r].1;
        let mut b = match &windows {
            // SAFETY: the window holds `placed_bytes` of this rank's device memory, outlives
            // the buffers (dropped after them) and holds nothing else.
            Some(w) => unsafe { gpu.alloc_placed(prog, w.items[r].2 as u64, WINDOW_ALIGN)? },
            None => gpu.alloc(prog)?,
        };
        super::session::upload_inputs(gpu, &mut b, launch, inputs[r])
            .map_err(|e| RunError::Plan(format!("rank {r}: {e}")))?;
        gpu.poison_outputs(&mut b, 0xff)?;
        if let Some(x) = &exchange {
            b.exchange = Some((x.addresses.clone(), r));
        }
        bufs.items.push((gpu.ctx.clone(), b));
    }
    let ranks: Vec<RankRun<'_>> = gpus
        .iter()
        .zip(&progs.items)
        .zip(&bufs.items)
        .map(|((gpu, (_, prog)), (_, bufs))| RankRun { gpu, prog, bufs })
        .collect();
    let placed = match &exchange {
        Some(_) => format!(
            "{placed}; all-reduce fused into a kernel, through exchange buffers of {} bytes per \
             GPU (peer access)",
            launch.exchange_bytes
        ),
        None => placed,
    };
    let result = f(&ranks, &placed);
    let usable = ranks
        .iter()
        .all(|r| r.gpu.nccl.as_ref().is_some_and(|n| !n.is_aborted()));
    drop(ranks);
    drop(bufs);
    if let Some(w) = &mut windows {
        w.deregister &= usable;
    }
    result
}

/// Runs one compiled graph once on every rank and reads every rank's outputs back: on one GPU
/// [`super::session::run_once`], on several [`execute_ranks`] after `with_ranks`'s setup.
pub fn run_on_ranks(
    gpus: &mut [&mut Gpu],
    cubin: &[u8],
    launch: &crate::emit::launch::LaunchPlan,
    inputs: &[&[HostTensor]],
    placement: AllReduceBuffers,
) -> Result<Vec<Vec<(DType, Array)>>, RunError> {
    if let ([gpu], [inputs]) = (&mut *gpus, inputs) {
        return super::session::run_once(gpu, cubin, launch, inputs).map(|o| vec![o]);
    }
    with_ranks(gpus, cubin, launch, inputs, placement, |ranks, _| {
        execute_ranks(ranks)?;
        ranks
            .iter()
            .enumerate()
            .map(|(r, rr)| {
                super::session::read_outputs(rr.gpu, rr.bufs, launch)
                    .map_err(|e| RunError::Plan(format!("rank {r}: {e}")))
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_of_several_gpus_needs_a_matching_communicator() {
        let e = check_rank(None, 2).unwrap_err().to_string();
        assert!(
            e.contains("needs an NCCL communicator: run it with --gpus 2"),
            "{e}"
        );
        let r = NcclRank {
            comm: std::ptr::null_mut(),
            aborted: AtomicBool::new(false),
            rank: 0,
            ranks: 4,
        };
        let e = check_rank(Some(&r), 2).unwrap_err().to_string();
        assert!(
            e.contains("runs on 2 GPUs but this GPU is NCCL rank 0 of 4"),
            "{e}"
        );
        std::mem::forget(r); // no communicator to destroy
    }

    #[test]
    fn missing_devices_and_nccl_are_named() {
        let e = RunError::TooFewGpus {
            needed: 2,
            first: 0,
            found: 1,
        }
        .to_string();
        assert_eq!(
            e,
            "the graph runs on 2 GPUs (devices 0..1) but this machine has 1"
        );
        let e = RunError::NoNccl(2).to_string();
        assert!(e.contains("libnccl.so could not be loaded"), "{e}");
    }

    #[test]
    fn every_nccl_type_has_its_enumerator() {
        for t in [
            NcclDataType::Int8,
            NcclDataType::Uint8,
            NcclDataType::Int32,
            NcclDataType::Uint32,
            NcclDataType::Int64,
            NcclDataType::Uint64,
            NcclDataType::Float16,
            NcclDataType::Bfloat16,
            NcclDataType::Float32,
            NcclDataType::Float64,
        ] {
            // The C name and cudarc's enumerator agree (ncclFloat16 = ncclHalf, …).
            assert_eq!(
                format!("{:?}", nccl_type(t)),
                crate::emit::cxx::nccl_data_type(t)
            );
        }
    }
}
