//! The calling path of a compiled kernel: torch arguments compared with facts computed once per
//! kernel, outputs allocated from template tensors, the workspace cached per stream, and the
//! execution queued either as plain launches or as the replay of a CUDA graph captured over the
//! same addresses (see `Launcher`).
//!
//! Everything here only accepts what the Python wrapper's slow path would accept unchanged;
//! anything else (a `__dlpack__` object, a size-1 dim's other stride, a misaligned view, an
//! `out=` tensor that needs its storage measured) makes [`Calls::call_torch`] return `None`
//! before anything is queued, and the Python wrapper takes its slow path, which converts or
//! raises the located error.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple, PyType};

use mucc::cuda::run::{Gpu, Program, RawBuffers, Replay, RunError};

/// What one torch argument must be: its shape and strides (plain tuples) and torch dtype; for
/// an output, whether the plan writes only within the span of that shape and those strides.
pub(crate) struct ArgFacts {
    shape: Py<PyAny>,
    strides: Py<PyAny>,
    dtype: Py<PyAny>,
    roomy: bool,
    /// The strides are row-major: `is_contiguous()` (one flag read, which also ignores the
    /// strides of size-1 dims, as the slow path does) replaces comparing `stride()`.
    row_major: bool,
}

/// How one output is allocated: when dense, by torch's allocation helper
/// (`TorchHelpers::empty_strided`) or `template.new_empty(shape)`; else a flat
/// `new_empty((elements,))` viewed with the plan's strides.
pub(crate) struct OutAlloc {
    template: Py<PyAny>,
    shape: Py<PyAny>,
    strides: Py<PyAny>,
    dtype: Py<PyAny>,
    elements: usize,
    dense: bool,
}

/// An input's or output's facts as the wrapper passes them: (shape tuple, strides tuple, torch
/// dtype, writes within the span, row-major strides).
pub(crate) type ArgTuple = (Py<PyAny>, Py<PyAny>, Py<PyAny>, bool, bool);

/// An output's allocation as the wrapper passes it: (template tensor, shape tuple, strides
/// tuple, torch dtype, elements, dense).
pub(crate) type OutTuple = (Py<PyAny>, Py<PyAny>, Py<PyAny>, Py<PyAny>, usize, bool);

/// The torch functions a call uses besides the tensors' methods.
pub(crate) struct TorchHelpers {
    /// `torch._C._cuda_getCurrentRawStream` (or a function of the device doing the same).
    pub(crate) raw_stream: Py<PyAny>,
    /// `torch._C._dynamo.guards._empty_strided_cuda(shape, strides, dtype)`, one of torch's
    /// C-level helpers for compiled code: a tensor on torch's current CUDA device from its
    /// caching allocator without the dispatcher (≈ 0.5 µs less host time than `new_empty` on an
    /// H100 host). `None` where this torch lacks it, and for a kernel once it allocated on
    /// another device: outputs then come from `new_empty`.
    pub(crate) empty_strided: Option<Py<PyAny>>,
}

/// The facts a torch call is compared with, computed once by the Python wrapper.
pub(crate) struct TorchFacts {
    tensor_type: Py<PyType>,
    args: Vec<ArgFacts>,
    outs: Vec<OutAlloc>,
    device: i64,
    /// A `uint8` tensor of the device: the workspace's template.
    bytes_template: Py<PyAny>,
    helpers: TorchHelpers,
}

/// Captured executions and the policy that makes them.
///
/// A plain call captures an execution when the previous call used the same addresses (inputs,
/// outputs, workspace): a loop over the same buffers, or one whose fresh outputs the caching
/// allocator hands back at the same address, then runs as one `cuGraphLaunch` per call. A
/// replay is the same kernels over the same buffers, so the result is the same. A graphed
/// call (`Graphed`) captures at once. The `keep` most recently used captures are kept.
pub(crate) struct Launcher {
    replays: Vec<(Vec<u64>, Replay)>,
    last: Vec<u64>,
    key: Vec<u64>,
    /// Plain calls capture recurring addresses.
    pub(crate) auto: bool,
    pub(crate) keep: usize,
    pub(crate) captures: usize,
    /// Why a plain call's capture failed (plain calls then stop capturing).
    pub(crate) capture_error: Option<String>,
}

impl Default for Launcher {
    fn default() -> Self {
        Launcher {
            replays: Vec::new(),
            last: Vec::new(),
            key: Vec::new(),
            auto: true,
            keep: 8,
            captures: 0,
            capture_error: None,
        }
    }
}

impl Launcher {
    /// Queues one execution over `bufs` on `stream`: a kept replay of these addresses, else a
    /// plain execution, captured afterwards when `capture` or (plain calls) when the previous
    /// call had the same addresses. On a stream that is capturing (someone else's capture,
    /// say `torch.cuda.graph`) always a plain execution, which joins that capture.
    ///
    /// # Safety
    /// As for [`Gpu::execute_raw`]: live buffers of the plan's specs, a live stream of the
    /// device. Replays are launched only over the addresses they were captured over, and must
    /// be dropped before `prog` ([`Launcher::clear`]).
    pub(crate) unsafe fn run(
        &mut self,
        gpu: &Gpu,
        prog: &Program,
        bufs: RawBuffers<'_>,
        stream: cudarc::driver::sys::CUstream,
        capture: bool,
    ) -> Result<(), RunError> {
        // SAFETY: per this function's contract.
        if unsafe { gpu.is_capturing(stream) }? {
            // SAFETY: as above.
            return unsafe { gpu.execute_raw(prog, bufs, stream) };
        }
        self.key.clear();
        self.key.extend_from_slice(bufs.inputs);
        self.key.extend_from_slice(bufs.outputs);
        self.key.push(bufs.workspace);
        if let Some(i) = self.replays.iter().rposition(|(k, _)| *k == self.key) {
            let last = self.replays.len() - 1;
            self.replays.swap(i, last);
            // SAFETY: captured over exactly these addresses, which the caller vouches for.
            return unsafe { self.replays[last].1.launch(stream) };
        }
        // SAFETY: as above.
        unsafe { gpu.execute_raw(prog, bufs, stream) }?;
        let recurring = self.auto && self.last == self.key;
        std::mem::swap(&mut self.last, &mut self.key);
        if !(capture || recurring) {
            return Ok(());
        }
        // SAFETY: as above; the replay is keyed by the addresses it was captured over.
        match unsafe { gpu.capture_raw(prog, bufs, stream) } {
            Ok(replay) => {
                if self.replays.len() >= self.keep.max(1) {
                    self.replays.remove(0);
                }
                self.replays.push((self.last.clone(), replay));
                self.captures += 1;
                Ok(())
            }
            // The execution itself was queued; a plain call just stops capturing.
            Err(e) if !capture => {
                self.auto = false;
                self.capture_error = Some(e.to_string());
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Captures kept.
    pub(crate) fn kept(&self) -> usize {
        self.replays.len()
    }

    /// Drops every capture.
    pub(crate) fn clear(&mut self) {
        self.replays.clear();
        self.last.clear();
    }
}

/// The calling state of one kernel: torch facts once set up, the workspaces per stream, the
/// launcher.
#[derive(Default)]
pub(crate) struct Calls {
    pub(crate) torch: Option<TorchFacts>,
    /// (stream, workspace tensor, its address).
    workspaces: Vec<(usize, Py<PyAny>, u64)>,
    pub(crate) launcher: Launcher,
}

/// `Some(x)` or return `Ok(None)` (off the fast path).
macro_rules! or_slow {
    ($e:expr) => {
        match $e {
            Some(v) => v,
            None => return Ok(None),
        }
    };
}

impl Calls {
    /// Records the facts torch calls are compared with (`_TorchFacts` of the wrapper).
    pub(crate) fn set_torch(
        &mut self,
        tensor_type: Py<PyType>,
        args: Vec<ArgTuple>,
        outs: Vec<OutTuple>,
        device: i64,
        bytes_template: Py<PyAny>,
        helpers: TorchHelpers,
    ) {
        self.torch = Some(TorchFacts {
            tensor_type,
            args: args
                .into_iter()
                .map(|(shape, strides, dtype, roomy, row_major)| ArgFacts {
                    shape,
                    strides,
                    dtype,
                    roomy,
                    row_major,
                })
                .collect(),
            outs: outs
                .into_iter()
                .map(
                    |(template, shape, strides, dtype, elements, dense)| OutAlloc {
                        template,
                        shape,
                        strides,
                        dtype,
                        elements,
                        dense,
                    },
                )
                .collect(),
            device,
            bytes_template,
            helpers,
        });
    }

    /// The stream a call runs on: `stream` (a torch stream, or a `CUstream` address), or
    /// torch's current stream of the device.
    pub(crate) fn stream(
        &self,
        py: Python<'_>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<usize>> {
        let t = or_slow!(self.torch.as_ref());
        Ok(Some(match stream {
            None => t
                .helpers
                .raw_stream
                .bind(py)
                .call1((t.device,))?
                .extract()?,
            Some(s) => match s.getattr_opt(intern!(py, "cuda_stream"))? {
                Some(v) => v.extract()?,
                None => s.extract()?,
            },
        }))
    }

    /// The workspace's address for `stream` (allocated once per stream through torch), 0 when
    /// the plan needs none.
    pub(crate) fn workspace(
        &mut self,
        py: Python<'_>,
        bytes: usize,
        zeroed: bool,
        stream: usize,
    ) -> PyResult<Option<u64>> {
        if bytes == 0 {
            return Ok(Some(0));
        }
        if let Some((_, _, p)) = self.workspaces.iter().find(|(s, _, _)| *s == stream) {
            return Ok(Some(*p));
        }
        let t = or_slow!(self.torch.as_ref());
        let buf = t
            .bytes_template
            .bind(py)
            .call_method1(intern!(py, "new_empty"), ((bytes,),))?;
        let p: u64 = buf.call_method0(intern!(py, "data_ptr"))?.extract()?;
        if zeroed {
            // Arrival counters (grid splits, last-block combines) start at zero; every
            // execution leaves them so. Zeroed on the stream the executions use, ahead of them.
            // SAFETY: `p` is a live allocation of `bytes` bytes of this device, `stream` a live
            // stream of it (the caller's).
            unsafe {
                cudarc::driver::result::memset_d8_async(
                    p,
                    0,
                    bytes,
                    stream as cudarc::driver::sys::CUstream,
                )
            }
            .map_err(|e| crate::cuda_err(format!("zeroing the workspace: {e}")))?;
        }
        self.workspaces.push((stream, buf.unbind(), p));
        Ok(Some(p))
    }

    /// The address of argument `i` (inputs first, then outputs) when `t` is a torch tensor of
    /// exactly the facts' dtype, shape, device and strides, 16-byte aligned.
    fn address(&self, py: Python<'_>, i: usize, t: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
        let f = or_slow!(self.torch.as_ref());
        let a = &f.args[i];
        if !t.is_instance(f.tensor_type.bind(py))?
            || !t.getattr(intern!(py, "dtype"))?.is(a.dtype.bind(py))
            || !t.getattr(intern!(py, "shape"))?.eq(a.shape.bind(py))?
            || t.call_method0(intern!(py, "get_device"))?
                .extract::<i64>()?
                != f.device
            || !(if a.row_major {
                t.call_method0(intern!(py, "is_contiguous"))?.is_truthy()?
            } else {
                t.call_method0(intern!(py, "stride"))?
                    .eq(a.strides.bind(py))?
            })
        {
            return Ok(None);
        }
        let p: u64 = t.call_method0(intern!(py, "data_ptr"))?.extract()?;
        Ok(p.is_multiple_of(16).then_some(p))
    }

    /// A new output `j`: dense ones by torch's allocation helper where it allocates on this
    /// kernel's device (else the helper is turned off for this kernel), or from the template.
    fn allocate<'py>(&mut self, py: Python<'py>, j: usize) -> PyResult<Bound<'py, PyAny>> {
        let f = self.torch.as_mut().expect("called with torch facts");
        let a = &f.outs[j];
        if !a.dense {
            return a
                .template
                .bind(py)
                .call_method1(intern!(py, "new_empty"), ((a.elements.max(1),),))?
                .call_method1(
                    intern!(py, "as_strided"),
                    (a.shape.bind(py), a.strides.bind(py)),
                );
        }
        if let Some(empty) = &f.helpers.empty_strided {
            let t =
                empty
                    .bind(py)
                    .call1((a.shape.bind(py), a.strides.bind(py), a.dtype.bind(py)))?;
            if t.call_method0(intern!(py, "get_device"))?
                .extract::<i64>()?
                == f.device
            {
                return Ok(t);
            }
            // torch's current device is another one: allocate from the template from now on.
            f.helpers.empty_strided = None;
        }
        a.template
            .bind(py)
            .call_method1(intern!(py, "new_empty"), (a.shape.bind(py),))
    }

    /// One torch call on the fast path: checks `inputs` (a tuple or a list; and `out`, unless
    /// `trusted`: tensors
    /// this package allocated for this kernel), allocates outputs when `out` is `None`, and
    /// queues the execution (`capture`: capture it now if it is not kept yet). `None` when an
    /// argument is off the fast path; nothing has been queued then.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn call_torch<'py>(
        &mut self,
        py: Python<'py>,
        gpu: &Gpu,
        prog: &Program,
        inputs: &Bound<'py, PyAny>,
        out: Option<&Bound<'py, PyAny>>,
        trusted: bool,
        stream: Option<&Bound<'py, PyAny>>,
        capture: bool,
    ) -> PyResult<Option<Bound<'py, PyList>>> {
        let plan = prog.plan();
        let (n_in, n_out) = (plan.inputs.len(), plan.outputs.len());
        if self.torch.is_none() {
            return Ok(None);
        }
        let mut ptrs = Vec::with_capacity(n_in);
        if let Ok(t) = inputs.cast::<PyTuple>() {
            if t.len() != n_in {
                return Ok(None);
            }
            for (i, x) in t.iter().enumerate() {
                ptrs.push(or_slow!(self.address(py, i, &x)?));
            }
        } else if let Ok(l) = inputs.cast::<PyList>() {
            if l.len() != n_in {
                return Ok(None);
            }
            for (i, x) in l.iter().enumerate() {
                ptrs.push(or_slow!(self.address(py, i, &x)?));
            }
        } else {
            return Ok(None);
        }
        let s = or_slow!(self.stream(py, stream)?);
        let outs = match out {
            Some(o) => {
                let list = PyList::new(py, o.try_iter()?.collect::<PyResult<Vec<_>>>()?)?;
                if list.len() != n_out {
                    return Ok(None);
                }
                list
            }
            None => {
                let list = PyList::empty(py);
                for j in 0..n_out {
                    list.append(self.allocate(py, j)?)?;
                }
                list
            }
        };
        let mut optrs = Vec::with_capacity(n_out);
        for (j, t) in outs.iter().enumerate() {
            if out.is_some() && !trusted {
                let f = self.torch.as_ref().expect("checked above");
                if !f.args[n_in + j].roomy {
                    return Ok(None);
                }
                optrs.push(or_slow!(self.address(py, n_in + j, &t)?));
            } else {
                optrs.push(t.call_method0(intern!(py, "data_ptr"))?.extract()?);
            }
        }
        let ws = or_slow!(self.workspace(py, plan.workspace_bytes, plan.counter_bytes > 0, s)?);
        let bufs = RawBuffers {
            inputs: &ptrs,
            outputs: &optrs,
            workspace: ws,
        };
        // SAFETY: every address is a live CUDA tensor of this device with the plan's dtype,
        // shape and strides (checked above, or allocated here from the plan's specs), outputs
        // freshly allocated or checked to be writable within their span; `s` is the caller's
        // stream of this device (torch's current stream or one the caller passed).
        unsafe {
            self.launcher
                .run(gpu, prog, bufs, s as cudarc::driver::sys::CUstream, capture)
        }
        .map_err(crate::cuda_err)?;
        Ok(Some(outs))
    }
}
