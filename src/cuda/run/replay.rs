//! Replays: one execution of a plan over fixed caller-owned buffers, captured once into a CUDA
//! graph and then launched on any stream of the device with one driver call, however many
//! kernels and cuBLAS calls the plan has (the Python package's graphed mode).

use std::sync::Arc;

use cudarc::driver::sys::{self, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, result};

use super::{Bufs, Gpu, Program, RawBuffers, RunError, driver};

/// One execution of a plan over fixed buffer addresses as an instantiated CUDA graph
/// ([`Gpu::capture_raw`]). Launching it needs the buffers it was captured over to be alive
/// and the plan's module (the [`Program`]) to be loaded.
pub struct Replay {
    ctx: Arc<CudaContext>,
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

// SAFETY: the graph handles are the driver's, usable from any thread once the context is bound
// (every method binds it); `Replay` is not `Sync`, so no two threads use one at a time, as the
// driver requires of a graph and its executable.
unsafe impl Send for Replay {}

impl std::fmt::Debug for Replay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replay").finish_non_exhaustive()
    }
}

impl Gpu {
    /// Captures one execution of `prog` over `bufs` into a CUDA graph on this GPU's own stream
    /// (thread-local capture: other threads are not disturbed), instantiates it and uploads it
    /// on `stream`. Nothing runs. Call it after a plain execution of the same program (say
    /// [`Gpu::execute_raw`]), so that lazy module loading and cuBLAS's set-up never happen
    /// under capture.
    ///
    /// # Safety
    /// As for [`Gpu::execute_raw`]; in addition, the returned replay may be launched only
    /// while every address of `bufs` still points at buffers of the plan's specs, and while
    /// `prog` lives.
    pub unsafe fn capture_raw(
        &self,
        prog: &Program,
        bufs: RawBuffers<'_>,
        stream: sys::CUstream,
    ) -> Result<Replay, RunError> {
        super::check_raw(&prog.plan, bufs)?;
        self.ctx
            .bind_to_thread()
            .map_err(driver("capturing the plan into a CUDA graph"))?;
        // This thread's capture interaction mode is thread-local while it captures: another
        // thread's global-mode capture (torch.cuda.graph's default) neither fails this
        // capture's calls nor is invalidated by them; this capture still guards itself.
        let mut mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: `mode` is a valid mode the call swaps with the thread's.
        unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }
            .result()
            .map_err(driver("setting the thread's capture mode"))?;
        // SAFETY: per this function's contract.
        let captured = unsafe { self.capture_now(prog, bufs, stream) };
        // SAFETY: restores the mode swapped out above.
        let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        captured
    }

    /// [`Gpu::capture_raw`] once the thread's capture mode is set.
    unsafe fn capture_now(
        &self,
        prog: &Program,
        bufs: RawBuffers<'_>,
        stream: sys::CUstream,
    ) -> Result<Replay, RunError> {
        let own = self.stream.cu_stream();
        // SAFETY: `own` is this GPU's live stream; the capture is ended below on every path.
        unsafe {
            result::stream::begin_capture(
                own,
                CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .map_err(driver("starting a CUDA-graph capture"))?;
        let queued = self.execute_steps(prog, Bufs::Raw(bufs), 0..prog.plan.steps.len(), own);
        // SAFETY: the capture begun above on `own`.
        let ended = unsafe { result::stream::end_capture(own) };
        let graph = ended.map_err(driver("capturing the plan into a CUDA graph"))?;
        if let Err(e) = queued {
            if !graph.is_null() {
                // SAFETY: a graph the capture returned and nothing else holds.
                let _ = unsafe { result::graph::destroy(graph) };
            }
            return Err(e);
        }
        if graph.is_null() {
            return Err(RunError::Plan("the CUDA-graph capture was empty".into()));
        }
        // SAFETY: `graph` is the captured graph; on failure it is destroyed here.
        let exec =
            match unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) } {
                Ok(exec) => exec,
                Err(source) => {
                    // SAFETY: as above.
                    let _ = unsafe { result::graph::destroy(graph) };
                    return Err(RunError::Driver {
                        what: "instantiating the captured CUDA graph".into(),
                        source,
                    });
                }
            };
        let replay = Replay {
            ctx: self.ctx.clone(),
            graph,
            exec,
        };
        // SAFETY: a live executable graph and the caller's live stream.
        unsafe { result::graph::upload(replay.exec, stream) }
            .map_err(driver("uploading the captured CUDA graph"))?;
        Ok(replay)
    }
}

impl Gpu {
    /// Whether `stream` is capturing into a CUDA graph (someone else's capture, say
    /// `torch.cuda.graph`): work queued on it then joins that graph instead of running.
    ///
    /// # Safety
    /// `stream` must be a live stream of this device's primary context (or null).
    pub unsafe fn is_capturing(&self, stream: sys::CUstream) -> Result<bool, RunError> {
        self.ctx
            .bind_to_thread()
            .map_err(driver("asking whether a stream is capturing"))?;
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: a live stream per the caller's contract; `status` is written by the call.
        unsafe { sys::cuStreamIsCapturing(stream, &mut status) }
            .result()
            .map_err(driver("asking whether a stream is capturing"))?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }
}

impl Replay {
    /// Queues the captured execution on `stream` (`cuGraphLaunch`) without waiting.
    ///
    /// # Safety
    /// `stream` must be a live stream of the device's primary context (or null), and the
    /// buffers and program the replay was captured over must still be alive
    /// ([`Gpu::capture_raw`]).
    pub unsafe fn launch(&self, stream: sys::CUstream) -> Result<(), RunError> {
        self.ctx
            .bind_to_thread()
            .map_err(driver("replaying the captured CUDA graph"))?;
        // SAFETY: a live executable graph; the stream per the caller's contract.
        unsafe { result::graph::launch(self.exec, stream) }
            .map_err(driver("replaying the captured CUDA graph"))
    }
}

impl Drop for Replay {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_err() {
            return;
        }
        // SAFETY: the executable graph and the graph this replay owns, destroyed once. Errors
        // cannot be reported from a destructor; the context records sticky ones itself.
        unsafe {
            let _ = result::graph::exec_destroy(self.exec);
            let _ = result::graph::destroy(self.graph);
        }
    }
}
