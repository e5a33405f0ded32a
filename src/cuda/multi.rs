//! Graphs on several GPUs (issue 16): one [`Gpu`] per rank of the graph's mesh, each holding
//! its rank of an NCCL communicator made by `ncclCommInitAll` (one process, one host thread and
//! one stream per GPU), the same compiled module loaded on every GPU, and the plan's
//! all-reduce steps run as `ncclAllReduce` (sum) on the rank's stream.
//!
//! Every rank runs the same launch plan on its own shards (a µGraph's shapes are per GPU);
//! [`check_ranks`] compares each rank's outputs with the interpreter's
//! ([`crate::graph::interp::evaluate_ranks`]), which is how Mirage checks its multi-GPU
//! graphs too (GPU by GPU).
//!
//! NCCL is loaded at run time (cudarc's `dynamic-loading`): a machine without it gets
//! [`RunError::NoNccl`] before anything is allocated, one with too few devices
//! [`RunError::TooFewGpus`].

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::CudaContext;
use cudarc::nccl::sys as nccl;

use super::data::{self, Comparison};
use super::run::{Buffers, Gpu, Program, RunError, driver_available};
use crate::emit::launch::{AllReduceCall, NcclDataType};
use crate::graph::interp::{self, Array, HostTensor, InputSpec, Rounding};
use crate::graph::{DType, KernelGraph};

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
    /// Aborts the communicator (once): collectives blocked in it return, so the other ranks
    /// of a failed run do not wait forever for the rank that failed.
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
        c.count,
        c.dtype.c_name(),
        r.rank
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
    let devices: Vec<i32> = (first..first + n).map(|d| d as i32).collect();
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
    Ok(others)
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

/// Runs every rank's steps at once, one host thread per GPU (each all-reduce waits for all
/// ranks), waiting for each step ([`Gpu::execute_checked`]). When a rank fails, every
/// communicator is aborted so that the others stop waiting for it (the communicators are then
/// unusable: the error is fatal); the error returned is the first rank's own, not the abort
/// that followed on the others.
pub fn execute_ranks(ranks: &[RankRun<'_>]) -> Result<(), RunError> {
    let abort_all = || {
        for r in ranks {
            if let Some(c) = &r.gpu.nccl {
                c.abort();
            }
        }
    };
    let failed = AtomicBool::new(false);
    let results: Vec<Result<(), RunError>> = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter()
            .map(|r| {
                let (failed, abort_all) = (&failed, &abort_all);
                s.spawn(move || {
                    let res = r
                        .gpu
                        .ctx
                        .bind_to_thread()
                        .map_err(super::run::driver("binding the GPU to its thread"))
                        .and_then(|()| r.gpu.execute_checked(r.prog, r.bufs));
                    // The first failure aborts the communicators; later ones are its echo.
                    let first = res.is_err() && !failed.swap(true, Ordering::SeqCst);
                    if first {
                        abort_all();
                    }
                    (res, first)
                })
            })
            .collect();
        let joined: Vec<(Result<(), RunError>, bool)> = handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    (
                        Err(RunError::Plan("a rank's host thread panicked".into())),
                        true,
                    )
                })
            })
            .collect();
        // The rank that failed first, else any failure, else success for all.
        let first = joined.iter().position(|(r, first)| r.is_err() && *first);
        joined
            .into_iter()
            .enumerate()
            .map(|(i, (r, _))| {
                if first.is_none() || first == Some(i) {
                    r
                } else {
                    Ok(())
                }
            })
            .collect()
    });
    for (r, res) in results.into_iter().enumerate() {
        res.map_err(|e| match e {
            RunError::Plan(m) => RunError::Plan(format!("rank {r}: {m}")),
            other => other,
        })?;
    }
    Ok(())
}

/// Every rank's inputs (global inputs drawn once and sharded by the graph's input maps), the
/// interpreter's per-rank outputs on them, the scale used and why it was lowered.
pub struct RankedDrawn {
    /// `inputs[r]`: rank `r`'s input buffers.
    pub inputs: Vec<Vec<HostTensor>>,
    /// `reference[r][j]`: output `j` as rank `r` computes it (per-GPU shape), in f64.
    pub reference: Vec<Vec<Array>>,
    /// The scale the global inputs were drawn at.
    pub scale: f64,
    /// Why the scale was lowered, if it was.
    pub note: Option<String>,
}

/// Global inputs drawn at `scale` and sharded, with the per-rank reference; the scale is
/// halved while a stored tensor of some rank would leave its dtype's range (as
/// [`super::session::inputs_and_reference`] does on one GPU).
pub fn ranked_inputs_and_reference(
    g: &KernelGraph,
    seed: u64,
    scale: f64,
    budget: &interp::Budget,
) -> Result<RankedDrawn, String> {
    interp::estimate(g).check(g, budget)?;
    let mut scale = scale;
    let mut note = None;
    for _ in 0..12 {
        let global = interp::random_global_inputs(g, InputSpec { seed, scale });
        let inputs = interp::shard_inputs(g, &global).map_err(|e| e.to_string())?;
        let (reference, excess) = interp::evaluate_ranks(g, inputs.clone(), Rounding::Exact)
            .map_err(|e| e.to_string())?;
        match excess.first() {
            None => {
                return Ok(RankedDrawn {
                    inputs,
                    reference,
                    scale,
                    note,
                });
            }
            Some(x) => {
                note = Some(format!(
                    "{} {} would reach |x| = {:.3e} at scale {scale}",
                    x.place,
                    x.dtype.name(),
                    x.max_abs
                ));
                scale /= 2.0;
            }
        }
    }
    Err(format!(
        "stored tensors overflow their dtype even at input scale {scale}"
    ))
}

/// Compares every rank's `outputs[r]` with the reference, widening the bound of outputs that
/// fail by their error alone with their storage-rounding sensitivity (the per-rank reference
/// evaluated again with [`Rounding::Stored`], only when some output needs it).
pub fn check_ranks(
    g: &KernelGraph,
    drawn: &RankedDrawn,
    outputs: &[Vec<(DType, Array)>],
) -> Result<Vec<Vec<Comparison>>, String> {
    let mut cmp: Vec<Vec<Comparison>> = outputs
        .iter()
        .zip(&drawn.reference)
        .map(|(outs, refs)| {
            outs.iter()
                .zip(refs)
                .map(|((dt, got), r)| data::compare(*dt, got, r))
                .collect()
        })
        .collect();
    let needs = |cmp: &[Vec<Comparison>]| {
        cmp.iter().enumerate().any(|(r, row)| {
            row.iter()
                .enumerate()
                .any(|(j, c)| c.worth_widening(outputs[r][j].0))
        })
    };
    if needs(&cmp) {
        let (stored, _) = interp::evaluate_ranks(g, drawn.inputs.clone(), Rounding::Stored)
            .map_err(|e| format!("the storage-rounding reference: {e}"))?;
        for (r, row) in cmp.iter_mut().enumerate() {
            for (j, c) in row.iter_mut().enumerate() {
                if c.worth_widening(outputs[r][j].0) {
                    c.widen(data::sensitivity(&stored[r][j], &drawn.reference[r][j]));
                }
            }
        }
    }
    Ok(cmp)
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
            assert_eq!(format!("{:?}", nccl_type(t)), t.c_name());
        }
    }
}
