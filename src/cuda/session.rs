//! A GPU session: a GPU, NVRTC with its cache, and the planning options of the GPU's target;
//! validating, transpiling and compiling graphs for it in parallel ([`Session::prepare`]);
//! drawing inputs and references, uploading inputs and reading outputs. `mucc run` and
//! `mucc bench` are built on it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rayon::prelude::*;

use super::bench::{Timing, TimingOptions, rotation_sets};
use super::data;
use super::multi;
use super::tune::{TuneCache, TuneEntry, tuned_options};
use super::{Buffers, CompileError, Compiler, CompilerOptions, Cubin, Gpu, RunError, Source};
use crate::MirageFile;
use crate::emit::Emitted;
use crate::emit::launch::LaunchPlan;
use crate::graph::interp::{self, Array, HostTensor, InputSpec};
use crate::graph::{DType, KernelGraph, Shape, Strides};
use crate::sched::Options;
use crate::target::Target;
use crate::transpile::TranspileError;

/// How to open a session.
#[derive(Clone, Debug, Default)]
pub struct SessionOptions {
    /// CUDA device ordinal.
    pub device: usize,
    /// Runtime headers folder (default: the copy embedded in mucc).
    pub runtime_headers: Option<PathBuf>,
    /// Compile without reading or writing the NVRTC cache.
    pub no_cache: bool,
    /// The most device memory one graph's buffers may take (`None`: what is free).
    pub max_device_memory: Option<usize>,
    /// Code path of threadblock kernels.
    pub path: crate::sched::PathChoice,
    /// Whether kernels may launch programmatically (sm_90a).
    pub dependent_launch: bool,
    /// Threads per CTA of threadblock kernels.
    pub cta: crate::sched::CtaChoice,
    /// Ignore the tuning cache ([`super::tune`]): plan every graph with the options above.
    pub no_tune: bool,
    /// Keep every matmul product in shared memory (no register pipes, for comparison).
    pub no_register_pipes: bool,
    /// Keep every threadblock kernel's tiles in shared memory (no register rows, for
    /// comparison).
    pub no_register_rows: bool,
    /// Run every tensor-core matmul with `mma.sync` (no `wgmma`, for comparison).
    pub no_wgmma: bool,
    /// Load every streamed tile by `cp.async` (no TMA on the Hopper path).
    pub no_tma: bool,
    /// Keep every kernel-level matmul a separate step (no fusion into its reader, for
    /// comparison).
    pub no_fuse_matmuls: bool,
    /// Fold a cluster split's partials by CTA 0's reads instead of pushing them
    /// (`--no-cluster-push`, for comparison).
    pub no_cluster_push: bool,
    /// Run the combining step of split attention in the attention kernel's clusters
    /// (`--cluster-combine`; off by default).
    pub cluster_combine: bool,
    /// Run the combining step of split attention in the last block of each group of key
    /// splits (`--last-block-combine`; off by default; the session allocates the workspace
    /// zeroed, as the counters need).
    pub last_block_combine: bool,
    /// CTAs per block of a grid split of kernels' for-loops (`--grid-split`; off by default;
    /// the session allocates the workspace zeroed, as its counters need).
    pub grid_split: crate::sched::GridSplitChoice,
    /// Where attention kernels compute their softmax online (`--online-softmax`).
    pub online_softmax: crate::sched::softmax::SoftmaxChoice,
    /// Whether split attention's key splits fold into the kernel's loop (`--fold-key-splits`).
    pub fold_key_splits: crate::sched::softmax::KeyFold,
    /// How multi-GPU plans run their all-reduces (`--all-reduce`).
    pub all_reduce: crate::sched::exchange::AllReduceChoice,
    /// The deepest pipeline ring a threadblock kernel may get (`--max-stages`).
    pub max_stages: Option<usize>,
    /// Blocks per SM planned for in threadblock kernels (`--resident-blocks`).
    pub resident_blocks: Option<usize>,
    /// Which customized operators' loops are refined, and by how much (`--refine-loops`).
    pub refine_loops: crate::sched::RefineChoice,
}

/// Why a session could not open.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// No GPU, or the driver failed.
    #[error(transparent)]
    Gpu(#[from] RunError),
    /// NVRTC or its cache could not be set up.
    #[error(transparent)]
    Compiler(#[from] CompileError),
}

/// Why one graph could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The graph is not valid.
    #[error("invalid:\n{0}")]
    Invalid(crate::ValidationErrors),
    /// Planning or emission failed.
    #[error(transparent)]
    Transpile(#[from] TranspileError),
    /// NVRTC failed.
    #[error(transparent)]
    Compile(#[from] CompileError),
    /// The reference could not be computed.
    #[error("{0}")]
    Reference(String),
}

/// An open GPU, a compiler for it, and the planning options for its target.
pub struct Session {
    /// The GPU (rank 0 of a multi-GPU run).
    pub gpu: Gpu,
    /// The other ranks' GPUs, joined by NCCL ([`Session::join_ranks`]); empty on one GPU.
    pub others: Vec<Gpu>,
    /// NVRTC with its cache.
    pub compiler: Compiler,
    /// Planning options for the GPU's target.
    pub opts: Options,
    /// The tuning cache whose results [`Session::prepare`] applies (`None`: `--no-tune`).
    pub tune: Option<TuneCache>,
    /// CUDA source compiled in place of every graph's generated source (`--source FILE`: an
    /// edited copy of `mucc transpile`'s output, timed and checked under the graph's own launch
    /// plan, whose kernels, parameters, grids and shared-memory sizes it must keep). `None`:
    /// the generated source.
    pub source: Option<String>,
}

impl Session {
    /// Opens the GPU first (without one nothing else is worth doing), then the compiler.
    pub fn open(a: &SessionOptions) -> Result<Session, SessionError> {
        let mut gpu = Gpu::open(a.device)?;
        gpu.max_memory = a.max_device_memory;
        let compiler = Compiler::new(CompilerOptions {
            runtime_headers: a.runtime_headers.clone(),
            no_cache: a.no_cache,
            ..Default::default()
        })?;
        let opts = Options {
            target: Target::new(gpu.arch),
            solve: Default::default(),
            path: a.path,
            dependent_launch: a.dependent_launch,
            symbols: Default::default(),
            cluster_split: true,
            cluster_push: !a.no_cluster_push,
            cluster_combine: a.cluster_combine,
            last_block_combine: a.last_block_combine,
            grid_split: a.grid_split,
            cta: a.cta,
            register_pipes: !a.no_register_pipes,
            register_rows: !a.no_register_rows,
            wgmma: !a.no_wgmma,
            tma: !a.no_tma,
            fuse_matmuls: !a.no_fuse_matmuls,
            online_softmax: a.online_softmax,
            fold_key_splits: a.fold_key_splits,
            all_reduce: a.all_reduce,
            max_stages: a.max_stages,
            resident_blocks: a.resident_blocks,
            refine_loops: a.refine_loops,
        };
        Ok(Session {
            gpu,
            others: Vec::new(),
            compiler,
            opts,
            tune: (!a.no_tune).then(TuneCache::default_location),
            source: None,
        })
    }

    /// Opens the GPUs of ranks 1 to `n` − 1 (devices `device + 1` on) and joins every rank,
    /// the session's GPU as rank 0, by NCCL ([`multi::open_ranks`]); on one GPU nothing.
    pub fn join_ranks(&mut self, device: usize, n: usize) -> Result<(), RunError> {
        if n > 1 {
            self.others = multi::open_ranks(&mut self.gpu, device, n)?;
        }
        Ok(())
    }

    /// Every rank's GPU, rank 0 first.
    pub fn gpus(&mut self) -> Vec<&mut Gpu> {
        std::iter::once(&mut self.gpu)
            .chain(self.others.iter_mut())
            .collect()
    }

    /// Runs a compiled graph once on every rank ([`multi::run_on_ranks`]; one GPU is a mesh of
    /// one) on `inputs[r]`, and returns every rank's outputs.
    pub fn run(
        &mut self,
        cubin: &[u8],
        launch: &LaunchPlan,
        inputs: &[&[HostTensor]],
        placement: multi::AllReduceBuffers,
    ) -> Result<Vec<Vec<(DType, Array)>>, RunError> {
        multi::run_on_ranks(&mut self.gpus(), cubin, launch, inputs, placement)
    }

    /// One line naming the GPU and the compiler.
    pub fn describe(&self) -> String {
        let (major, minor) = self.compiler.nvrtc_version();
        format!(
            "{} ({}), NVRTC {major}.{minor}",
            self.gpu.name, self.gpu.arch
        )
    }

    /// Validates, transpiles and compiles the graphs `indices` of `file`, and draws their inputs
    /// (with the interpreter's reference when `inputs.check`), on all cores — with a check, in
    /// groups of as many graphs as the budget's memory holds references of at once
    /// ([`concurrent_references`]); results in the order of `indices`.
    pub fn prepare(
        &self,
        file: &MirageFile,
        name: &str,
        indices: &[usize],
        inputs: InputChoice,
    ) -> Vec<Result<Prepared, PrepareError>> {
        let candidates: Vec<Candidate<'_>> = indices
            .iter()
            .map(|&index| Candidate {
                name,
                index: Some(index),
                graph: &file.graphs[index],
            })
            .collect();
        self.prepare_candidates(&candidates, inputs)
    }

    /// [`Session::prepare`] of graphs that need not come from one file; results in the order
    /// of `candidates`.
    pub fn prepare_candidates(
        &self,
        candidates: &[Candidate<'_>],
        inputs: InputChoice,
    ) -> Vec<Result<Prepared, PrepareError>> {
        // Candidates of one file share their input signature: one copy of the inputs per
        // signature and scale, not one per graph (mha_bs8's 38 candidates would hold 41 GB).
        let pool = InputPool::default();
        let width = if inputs.check {
            // Only graphs that validate are estimated (the others fail at once).
            let valid = candidates
                .iter()
                .filter(|c| c.graph.validate().is_ok())
                .map(|c| &c.graph.graph);
            concurrent_references(valid, &inputs.budget, rayon::current_num_threads())
        } else {
            candidates.len()
        };
        candidates
            .chunks(width.max(1))
            .flat_map(|group| self.prepare_group(group, inputs, &pool))
            .collect()
    }

    /// [`Session::prepare_candidates`] of one group of graphs, in parallel.
    fn prepare_group(
        &self,
        candidates: &[Candidate<'_>],
        inputs: InputChoice,
        pool: &InputPool,
    ) -> Vec<Result<Prepared, PrepareError>> {
        candidates
            .par_iter()
            .map(|c| {
                let lg = c.graph;
                lg.validate().map_err(PrepareError::Invalid)?;
                // Without a check, inputs depend only on the input signature: drawn later, once
                // for all candidates that share it (InputCache).
                if !inputs.check {
                    // Inputs are drawn on the host as f64 even without a reference.
                    let e = interp::estimate(&lg.graph);
                    if e.input_bytes > inputs.budget.max_bytes as f64 {
                        let (need, limit) = interp::budget::format_byte_pair(
                            e.input_bytes,
                            inputs.budget.max_bytes as f64,
                        );
                        let of_ranks = if e.ranks > 1 {
                            format!(" on {} GPUs (the global inputs and every rank's)", e.ranks)
                        } else {
                            String::new()
                        };
                        return Err(PrepareError::Reference(format!(
                            "drawing the inputs needs about {need} of host memory{of_ranks}, more than the limit of {limit} (--max-memory raises it)"
                        )));
                    }
                }
                let (opts, tuned) = tuned_options(
                    self.tune.as_ref(),
                    &lg.graph,
                    Some(&self.gpu.name),
                    &self.opts,
                );
                let (emitted, cubin, transpile_seconds, runs) =
                    self.compile_with(&lg.graph, c.name, c.index, &opts)?;
                let drawn = if inputs.check {
                    Some(
                        drawn_with(
                            &lg.graph,
                            runs.as_deref(),
                            inputs.seed,
                            inputs.scale,
                            &inputs.budget,
                            Some(pool),
                        )
                        .map_err(PrepareError::Reference)?,
                    )
                } else {
                    None
                };
                Ok(Prepared {
                    emitted,
                    cubin,
                    transpile_seconds,
                    drawn,
                    tuned,
                })
            })
            .collect()
    }

    /// Prepares `candidates` ([`Session::prepare_candidates`]), then runs and times each on
    /// the GPU: checked against its own reference when `inputs.check`, against `shared` (one
    /// reference graph's inputs and outputs, which every candidate must reproduce) when given,
    /// only for finite outputs otherwise. Returns one [`Ranked`] per candidate in
    /// [`by_speed`] order: those that passed, fastest first, then the others in their order.
    pub fn rank(
        &mut self,
        candidates: &[Candidate<'_>],
        inputs: InputChoice,
        shared: Option<&Drawn>,
        timing: &TimingOptions,
    ) -> Vec<Ranked> {
        let choice = InputChoice {
            check: inputs.check && shared.is_none(),
            ..inputs
        };
        let prepared = self.prepare_candidates(candidates, choice);
        let mut cache = InputCache::default();
        let mut rows: Vec<Ranked> = prepared
            .into_iter()
            .zip(candidates)
            .enumerate()
            .map(|(position, (p, c))| {
                let outcome = p.map_err(|e| e.to_string()).and_then(|p| {
                    let g = &c.graph.graph;
                    let drawn = p.drawn.as_ref().or(shared);
                    let own;
                    let inputs: &[HostTensor] = match drawn {
                        Some(d) => d.first_rank(),
                        None => {
                            own = cache.get(g, inputs.seed, inputs.scale)?;
                            own.first().map_or(&[], Vec::as_slice)
                        }
                    };
                    self.measure(&p.emitted, &p.cubin, g, inputs, drawn, timing)
                });
                Ranked { position, outcome }
            })
            .collect();
        rows.sort_by(|a, b| {
            by_speed(
                (a.position, a.outcome.as_ref().ok()),
                (b.position, b.outcome.as_ref().ok()),
            )
        });
        rows
    }
}

/// One graph for [`Session::prepare_candidates`] or [`Session::rank`]: the name its messages
/// and compiled source carry (a file, say), its index there, and the graph as loaded.
#[derive(Clone, Copy)]
pub struct Candidate<'a> {
    /// What messages name the graph by (with its index, if any).
    pub name: &'a str,
    /// The graph's index in `name` (`None`: `name` names the graph alone).
    pub index: Option<usize>,
    /// The graph.
    pub graph: &'a crate::LoadedGraph,
}

/// What [`Session::rank`] found for one candidate.
pub struct Ranked {
    /// The candidate's position in the slice given to [`Session::rank`].
    pub position: usize,
    /// Its measurement, or why it was not measured (it did not validate, plan, compile or
    /// run).
    pub outcome: Result<Measurement, String>,
}

/// The order candidates are ranked in, each given as (position, measurement if any): those
/// whose measurement [passed](Measurement::passed), fastest first, then the others by
/// position. The fastest candidate of a list is its first in this order, if it passed.
pub fn by_speed(
    a: (usize, Option<&Measurement>),
    b: (usize, Option<&Measurement>),
) -> std::cmp::Ordering {
    let time = |m: Option<&Measurement>| m.filter(|m| m.passed()).map(|m| m.timing.median_us);
    match (time(a.1), time(b.1)) {
        (Some(x), Some(y)) => x.total_cmp(&y).then(a.0.cmp(&b.0)),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => a.0.cmp(&b.0),
    }
}

/// The fastest of `rows` (position, measurement) that passed, by [`by_speed`].
pub fn fastest<'a>(rows: impl IntoIterator<Item = (usize, &'a Measurement)>) -> Option<usize> {
    rows.into_iter()
        .filter(|(_, m)| m.passed())
        .min_by(|a, b| by_speed((a.0, Some(a.1)), (b.0, Some(b.1))))
        .map(|(i, _)| i)
}

impl Session {
    /// Transpiles graph `i` of `name` (`name` itself when `i` is `None`) with `opts` and
    /// compiles it for the session's GPU; also returns the seconds spent planning and
    /// emitting, and the graph the planner rewrote `g` into, if it did.
    pub fn compile_with(
        &self,
        g: &KernelGraph,
        name: &str,
        i: Option<usize>,
        opts: &Options,
    ) -> Result<Compiled, PrepareError> {
        let arch = self.gpu.arch;
        let (label, file) = match i {
            Some(i) => (format!("{name}, graph {i}"), format!("{name}#graph{i}")),
            None => (name.to_string(), name.to_string()),
        };
        let t0 = Instant::now();
        let (plan, emitted) = crate::transpile::transpile(g, opts, &label)?;
        let transpile_seconds = t0.elapsed().as_secs_f64();
        let path = crate::emit::cxx::comment_safe(&format!("{file}.{arch}.cu"));
        let cubin = self.compiler.compile(&Source {
            path: &path,
            text: self.source.as_deref().unwrap_or(&emitted.source),
            arch,
        })?;
        Ok((emitted, cubin, transpile_seconds, plan.rewrite.graph))
    }

    /// Runs a compiled graph on `inputs`: with `drawn`, once checked against its reference;
    /// then timed over enough buffer sets to exceed twice the L2 cache ([`rotation_sets`]),
    /// and every set's outputs read back to see that they are all finite.
    pub fn measure(
        &mut self,
        emitted: &Emitted,
        cubin: &Cubin,
        g: &KernelGraph,
        inputs: &[HostTensor],
        drawn: Option<&Drawn>,
        timing: &TimingOptions,
    ) -> Result<Measurement, String> {
        let gpu = &mut self.gpu;
        let launch = &emitted.launch;
        let prog = gpu.load(&cubin.bytes, launch).map_err(|e| e.to_string())?;
        let mut first = gpu.alloc(&prog).map_err(|e| e.to_string())?;
        upload_inputs(gpu, &mut first, launch, inputs)?;
        gpu.poison_outputs(&mut first, 0xff)
            .map_err(|e| e.to_string())?;
        let check = match drawn {
            Some(drawn) => {
                gpu.execute_checked(&prog, &first)
                    .map_err(|e| e.to_string())?;
                let outs = read_outputs(gpu, &first, launch)?;
                let cmp = check_outputs(g, drawn, &[outs])?.pop().unwrap_or_default();
                gpu.poison_outputs(&mut first, 0xff)
                    .map_err(|e| e.to_string())?;
                Some(cmp)
            }
            None => None,
        };
        let (free, _) = gpu.memory_info().map_err(|e| e.to_string())?;
        let n = rotation_sets(first.io_bytes(), gpu.l2_bytes, (free / 4).min(8 << 30));
        let mut sets = vec![first];
        for _ in 1..n {
            let mut s = gpu
                .alloc_sharing_workspace(&prog, Some(&sets[0]))
                .map_err(|e| e.to_string())?;
            gpu.copy_inputs(&sets[0], &mut s)
                .map_err(|e| e.to_string())?;
            gpu.poison_outputs(&mut s, 0xff)
                .map_err(|e| e.to_string())?;
            sets.push(s);
        }
        let timing_opts = timing;
        let timing = gpu.time(&prog, &sets, timing).map_err(|e| e.to_string())?;
        // Every set was executed: its outputs must all be written and finite.
        let mut finite = true;
        for s in &sets {
            for (_, got) in read_outputs(gpu, s, launch)? {
                finite &= got.data.iter().all(|x| x.is_finite());
            }
        }
        // After the outputs were read: a step that works in place runs several times over.
        let steps = if timing_opts.per_step {
            gpu.time_each_step(&prog, &sets, timing_opts)
                .map_err(|e| e.to_string())?
        } else {
            Vec::new()
        };
        Ok(Measurement {
            timing,
            check,
            finite,
            steps,
        })
    }
}

/// What [`Session::measure`] found.
pub struct Measurement {
    /// The timing.
    pub timing: Timing,
    /// Per output, the comparison with the reference (`None` without one).
    pub check: Option<Vec<data::Comparison>>,
    /// Every output element of every buffer set finite after the timed runs.
    pub finite: bool,
    /// With [`TimingOptions::per_step`]: every step's name and median µs alone.
    pub steps: Vec<(String, f64)>,
}

impl Measurement {
    /// Finite, and passed the check when there was one.
    pub fn passed(&self) -> bool {
        self.finite
            && self
                .check
                .as_ref()
                .is_none_or(|c| c.iter().all(data::Comparison::passed))
    }
}

/// A graph transpiled and compiled for the session's GPU.
pub struct Prepared {
    /// The source and its launch plan.
    pub emitted: Emitted,
    /// The compiled module.
    pub cubin: Cubin,
    /// Seconds spent planning and emitting.
    pub transpile_seconds: f64,
    /// Its inputs and reference outputs, when checking.
    pub drawn: Option<Drawn>,
    /// The tuning entry whose best variant planned it, if the cache had one.
    pub tuned: Option<TuneEntry>,
}

/// What [`Session::compile_with`] returns: the generated code, its binary, the seconds spent
/// planning and emitting, and the graph the planner rewrote the caller's into (if it did).
pub type Compiled = (Emitted, Cubin, f64, Option<Box<KernelGraph>>);

/// Inputs drawn once for consecutive graphs with the same input signature (shapes, dtypes,
/// strides), as the candidates of one file have: drawing them is the costliest host step of
/// a run without `--check` on large graphs. Every rank's ([`draw_inputs`]).
#[derive(Default)]
pub struct InputCache {
    key: Option<(Signature, usize)>,
    inputs: Rc<Vec<Vec<HostTensor>>>,
}

impl InputCache {
    /// Every rank's inputs of `g` drawn at `seed` and `scale` (the same for every call of one
    /// cache).
    pub fn get(
        &mut self,
        g: &KernelGraph,
        seed: u64,
        scale: f64,
    ) -> Result<Rc<Vec<Vec<HostTensor>>>, String> {
        let key = Some((signature(g), g.sharding.num_gpus()));
        if key != self.key {
            self.inputs = Rc::new(draw_inputs(g, InputSpec { seed, scale })?);
            self.key = key;
        }
        Ok(self.inputs.clone())
    }
}

/// How many of `graphs` may evaluate their references at once: as many as the budget's
/// memory holds of the largest one's estimate (inputs included), at least one and at most
/// `threads`. Each evaluation stays within the budget alone (it is refused otherwise); all at
/// once they would multiply it by the cores.
pub fn concurrent_references<'a>(
    graphs: impl IntoIterator<Item = &'a KernelGraph>,
    budget: &interp::Budget,
    threads: usize,
) -> usize {
    let largest = graphs
        .into_iter()
        .map(|g| interp::estimate(g).bytes)
        .fold(0.0, f64::max);
    let fit = if largest > 0.0 {
        (budget.max_bytes as f64 / largest).floor() as usize
    } else {
        threads
    };
    fit.clamp(1, threads.max(1))
}

/// A graph's input signature: per input its shape, dtype and strides.
type Signature = Vec<(Vec<usize>, DType, Vec<usize>)>;

fn signature(g: &KernelGraph) -> Signature {
    g.inputs()
        .into_iter()
        .map(|(_, t)| {
            let d = &g.tensors[t];
            let strides = g.input_strides(t).map(|s| s.0.clone()).unwrap_or_default();
            (d.shape.dims().to_vec(), d.dtype, strides)
        })
        .collect()
}

/// Drawn inputs by (seed, scale's bits, input signature).
type Pooled = HashMap<(u64, u64, Signature), Arc<Vec<HostTensor>>>;

/// The logical arrays of drawn inputs, keyed as [`Pooled`].
type PooledArrays = HashMap<(u64, u64, Signature), Arc<Vec<Arc<Array>>>>;

/// Inputs drawn once per (seed, scale, input signature) and shared by the graphs prepared
/// together (they are a function of these alone), across threads; and, for the references,
/// their logical arrays, converted once.
#[derive(Default)]
pub struct InputPool {
    drawn: Mutex<Pooled>,
    arrays: Mutex<PooledArrays>,
}

impl InputPool {
    /// The inputs of `g` drawn as `spec` says, shared with every earlier caller of the same
    /// seed, scale and signature.
    pub fn get(&self, g: &KernelGraph, spec: InputSpec) -> Arc<Vec<HostTensor>> {
        cached(&self.drawn, pool_key(g, spec), || {
            Arc::new(interp::random_inputs(g, spec))
        })
    }

    /// The logical (row-major) arrays of [`InputPool::get`]'s inputs, converted once per
    /// seed, scale and signature: the interpreter shares them instead of copying the inputs
    /// for every reference.
    pub fn arrays(&self, g: &KernelGraph, spec: InputSpec) -> Arc<Vec<Arc<Array>>> {
        cached(&self.arrays, pool_key(g, spec), || {
            Arc::new(interp::logical_arrays(&self.get(g, spec)))
        })
    }
}

/// The pool's key of `g`'s inputs drawn as `spec` says.
fn pool_key(g: &KernelGraph, spec: InputSpec) -> (u64, u64, Signature) {
    (spec.seed, spec.scale.to_bits(), signature(g))
}

/// The value of `key` in `map`, made by `make` when absent. It is made outside the lock (two
/// threads may make the same value; the first kept wins). A panic elsewhere cannot leave the
/// map half-written (entries are inserted whole), so a poisoned lock is taken as it is.
fn cached<V: Clone>(
    map: &Mutex<HashMap<(u64, u64, Signature), V>>,
    key: (u64, u64, Signature),
    make: impl FnOnce() -> V,
) -> V {
    let lock = || map.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(x) = lock().get(&key) {
        return x.clone();
    }
    let x = make();
    lock().entry(key).or_insert(x).clone()
}

/// How inputs are drawn.
#[derive(Clone, Copy, Debug)]
pub struct InputChoice {
    /// Seed of the random inputs.
    pub seed: u64,
    /// Half-width of their distribution.
    pub scale: f64,
    /// Compute the interpreter's reference (and lower the scale while a stored tensor would
    /// overflow).
    pub check: bool,
    /// Limits of the reference evaluation.
    pub budget: interp::Budget,
}

impl Prepared {
    /// "transpiled in … ms, compiled in … s" (or "cache hit"), and the tuned variant if any.
    pub fn describe(&self) -> String {
        let tuned = match &self.tuned {
            Some(e) => format!(
                ", tuned: {} (on {})",
                e.best,
                crate::graph::error::escape(&e.gpu)
            ),
            None => String::new(),
        };
        format!(
            "transpiled in {:.0} ms, {} in {:.2} s{tuned}",
            self.transpile_seconds * 1e3,
            if self.cubin.cached {
                "cache hit"
            } else {
                "compiled"
            },
            self.cubin.seconds
        )
    }
}

/// Every rank's inputs, the interpreter's outputs on them, the input scale used, and why it
/// was lowered (if it was). A graph on one GPU is a mesh of one rank; a graph on several has
/// its global inputs drawn once and sharded by its input maps.
pub struct Drawn {
    /// `inputs[r]`: rank `r`'s input buffers (on one GPU, shared with the other graphs of a
    /// [`Session::prepare`] drawn alike).
    pub inputs: Vec<Arc<Vec<HostTensor>>>,
    /// `reference[r][j]`: output `j` as rank `r` computes it (per-GPU shape), in f64.
    pub reference: Vec<Vec<Array>>,
    /// The scale the inputs were drawn at.
    pub scale: f64,
    /// Why the scale was lowered, if it was.
    pub note: Option<String>,
}

impl Drawn {
    /// Rank 0's inputs (a one-GPU graph's).
    pub fn first_rank(&self) -> &[HostTensor] {
        self.inputs.first().map_or(&[], |r| r.as_slice())
    }

    /// Rank `r`'s inputs, copied (as [`interp`] and the GPU's buffers take them).
    pub fn rank_inputs(&self) -> Vec<Vec<HostTensor>> {
        self.inputs.iter().map(|i| i.to_vec()).collect()
    }
}

/// Inputs drawn at `scale`, halved while the reference overflows a stored tensor's dtype.
pub fn inputs_and_reference(
    g: &KernelGraph,
    seed: u64,
    scale: f64,
    budget: &interp::Budget,
) -> Result<Drawn, String> {
    inputs_and_reference_for(g, None, seed, scale, budget)
}

/// Like [`inputs_and_reference`] for a graph the planner rewrote into `runs`
/// ([`crate::sched::GraphPlan::graph`]): the reference is still `g`'s, but the scale is halved
/// only while a tensor of `runs` (what the GPU stores) would overflow: the online-softmax
/// rewrite stores bounded values where `g` stores exponentials that overflow.
pub fn inputs_and_reference_for(
    g: &KernelGraph,
    runs: Option<&KernelGraph>,
    seed: u64,
    scale: f64,
    budget: &interp::Budget,
) -> Result<Drawn, String> {
    drawn_with(g, runs, seed, scale, budget, None)
}

/// Every rank's inputs of `g` drawn as `spec` says, without a reference: on one GPU its own
/// inputs, on several the global inputs sharded by the input maps.
pub fn draw_inputs(g: &KernelGraph, spec: InputSpec) -> Result<Vec<Vec<HostTensor>>, String> {
    if g.sharding.num_gpus() > 1 {
        interp::shard_inputs(g, &interp::random_global_inputs(g, spec)).map_err(|e| e.to_string())
    } else {
        Ok(vec![interp::random_inputs(g, spec)])
    }
}

/// [`inputs_and_reference_for`] with a one-GPU graph's inputs taken from `pool` when given.
fn drawn_with(
    g: &KernelGraph,
    runs: Option<&KernelGraph>,
    seed: u64,
    scale: f64,
    budget: &interp::Budget,
    pool: Option<&InputPool>,
) -> Result<Drawn, String> {
    interp::estimate(g).check(g, budget)?;
    if let Some(r) = runs {
        interp::estimate(r).check(r, budget)?;
    }
    let ((inputs, reference), scale, note) = if g.sharding.num_gpus() > 1 {
        draw_in_range(scale, |scale| {
            let inputs = draw_inputs(g, InputSpec { seed, scale })?;
            let evaluate = |g: &KernelGraph| {
                interp::evaluate_ranks(g, inputs.clone(), interp::Rounding::Exact)
            };
            let (reference, mut excess) = evaluate(g).map_err(|e| e.to_string())?;
            if let Some(r) = runs {
                excess = evaluate(r)
                    .map_err(|e| format!("the rewritten graph: {e}"))?
                    .1;
            }
            let inputs = inputs.into_iter().map(Arc::new).collect();
            Ok(((inputs, reference), excess))
        })?
    } else {
        draw_in_range(scale, |scale| {
            let spec = InputSpec { seed, scale };
            let (inputs, arrays) = match pool {
                Some(p) => (p.get(g, spec), p.arrays(g, spec)),
                None => {
                    let inputs = Arc::new(interp::random_inputs(g, spec));
                    let arrays = Arc::new(interp::logical_arrays(&inputs));
                    (inputs, arrays)
                }
            };
            let (outs, mut excess) =
                interp::evaluate_shared_ranged(g, &arrays).map_err(|e| e.to_string())?;
            if let Some(r) = runs {
                excess = interp::evaluate_shared_ranged(r, &arrays)
                    .map_err(|e| format!("the rewritten graph: {e}"))?
                    .1;
            }
            Ok(((vec![inputs], vec![outs]), excess))
        })?
    };
    Ok(Drawn {
        inputs,
        reference,
        scale,
        note,
    })
}

/// Calls `attempt` (inputs drawn and evaluated at a scale) from `scale` down, halving while a
/// stored tensor would leave its dtype's range (at most 12 times); returns the result, the
/// scale it was drawn at, and why the scale was lowered (if it was).
pub(crate) fn draw_in_range<T>(
    scale: f64,
    mut attempt: impl FnMut(f64) -> Result<(T, Vec<interp::RangeExcess>), String>,
) -> Result<(T, f64, Option<String>), String> {
    let mut scale = scale;
    let mut note = None;
    for _ in 0..12 {
        let (value, excess) = attempt(scale)?;
        match excess.first() {
            None => return Ok((value, scale, note)),
            Some(x) => {
                note = Some(format!(
                    "{} {} would reach |x| = {:.3e} at scale {}",
                    x.place,
                    x.dtype.name(),
                    x.max_abs,
                    interp::format_scale(scale)
                ));
                scale /= 2.0;
            }
        }
    }
    Err(format!(
        "stored tensors overflow their dtype even at input scale {}",
        interp::format_scale(scale)
    ))
}

/// Compares every rank's outputs (`outputs[r]`, as the GPU wrote them) with `drawn`'s exact
/// reference; per rank, per output. Floating-point outputs that fail by their error alone are
/// judged again with their storage-rounding sensitivity ([`data::SENSITIVITY_FACTOR`]): the
/// reference is evaluated a second time, rounding every stored value
/// ([`interp::Rounding::Stored`]), only when some output needs it.
pub fn check_outputs(
    g: &KernelGraph,
    drawn: &Drawn,
    outputs: &[Vec<(DType, Array)>],
) -> Result<Vec<Vec<data::Comparison>>, String> {
    // One GPU is a mesh of one rank: `evaluate_ranks` walks it as `evaluate_rounded` would.
    let stored = || {
        interp::evaluate_ranks(g, drawn.rank_inputs(), interp::Rounding::Stored)
            .map(|(stored, _)| stored)
            .map_err(|e| format!("the storage-rounding reference: {e}"))
    };
    data::compare_widened(outputs, &drawn.reference, stored)
}

/// Runs a compiled graph once on one GPU: loads it, allocates its buffers, uploads `inputs`,
/// poisons the outputs (so that an unwritten element shows), runs every step waiting for each
/// (a failure names its step), and reads the outputs back.
pub fn run_once(
    gpu: &mut Gpu,
    cubin: &[u8],
    launch: &LaunchPlan,
    inputs: &[HostTensor],
) -> Result<Vec<(DType, Array)>, RunError> {
    let prog = gpu.load(cubin, launch)?;
    let mut bufs = gpu.alloc(&prog)?;
    upload_inputs(gpu, &mut bufs, launch, inputs).map_err(RunError::Plan)?;
    gpu.poison_outputs(&mut bufs, 0xff)?;
    gpu.execute_checked(&prog, &bufs)?;
    read_outputs(gpu, &bufs, launch).map_err(RunError::Plan)
}

/// Copies `inputs` into the input buffers of `bufs` (padded to each buffer's size).
pub fn upload_inputs(
    gpu: &Gpu,
    bufs: &mut Buffers,
    launch: &LaunchPlan,
    inputs: &[HostTensor],
) -> Result<(), String> {
    for (k, (t, d)) in inputs.iter().zip(&launch.inputs).enumerate() {
        let dt = d.dtype;
        let bytes = if t.data.len() == d.alloc_elems {
            data::encode(dt, &t.data)
        } else {
            let mut vals = t.data.clone();
            vals.resize(d.alloc_elems, 0.0);
            data::encode(dt, &vals)
        };
        gpu.upload_input(bufs, k, &bytes)
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The logical values of every output of `bufs`, with their dtypes.
pub fn read_outputs(
    gpu: &Gpu,
    bufs: &Buffers,
    launch: &LaunchPlan,
) -> Result<Vec<(DType, Array)>, String> {
    launch
        .outputs
        .iter()
        .enumerate()
        .map(|(j, d)| {
            let dt = d.dtype;
            let bytes = gpu.download_output(bufs, j).map_err(|e| e.to_string())?;
            let buf = data::decode(dt, &bytes);
            let shape =
                Shape::new(&d.shape).ok_or_else(|| format!("bad output shape {:?}", d.shape))?;
            Ok((dt, data::gather(shape, &Strides(d.strides.clone()), &buf)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::GraphBuilder;

    fn measured(us: f64, finite: bool, rel_l2: Option<f64>) -> Measurement {
        Measurement {
            timing: Timing {
                median_us: us,
                min_us: us,
                max_us: us,
                samples: 1,
                executions_per_sample: 1,
                sets: 1,
            },
            check: rel_l2.map(|e| {
                vec![data::Comparison {
                    rel_l2: e,
                    max_abs: e,
                    non_finite: 0,
                    bound: 5e-3,
                    sensitivity: None,
                }]
            }),
            finite,
            steps: Vec::new(),
        }
    }

    #[test]
    fn candidates_rank_passed_fastest_first_then_the_rest_by_position() {
        let rows = [
            (0, Some(measured(9.0, true, None))),
            (1, None),
            (2, Some(measured(3.0, false, None))),
            (3, Some(measured(5.0, true, Some(1e-4)))),
            (4, Some(measured(2.0, true, Some(0.5)))),
            (5, Some(measured(5.0, true, None))),
        ];
        let mut order: Vec<(usize, Option<&Measurement>)> =
            rows.iter().map(|(i, m)| (*i, m.as_ref())).collect();
        order.sort_by(|a, b| by_speed(*a, *b));
        let order: Vec<usize> = order.iter().map(|r| r.0).collect();
        // 3 and 5 tie on time: position decides; 2 (non-finite) and 4 (failed check) are not
        // ranked by their faster times.
        assert_eq!(order, [3, 5, 0, 1, 2, 4]);
        let passed = rows.iter().filter_map(|(i, m)| m.as_ref().map(|m| (*i, m)));
        assert_eq!(fastest(passed), Some(3));
        let none = rows[1..3]
            .iter()
            .filter_map(|(i, m)| m.as_ref().map(|m| (*i, m)));
        assert_eq!(fastest(none), None);
    }

    fn graph(rows: usize, exp: bool) -> KernelGraph {
        let mut b = GraphBuilder::new();
        let x = b.new_input(&[rows, 64], DType::F16).unwrap();
        let y = if exp {
            b.exp(x).unwrap()
        } else {
            b.sqrt(x).unwrap()
        };
        b.mark_output(y).unwrap();
        b.build().unwrap()
    }

    #[test]
    fn references_run_as_many_at_once_as_the_budget_holds() {
        let (small, large) = (graph(8, true), graph(4096, true));
        let each = interp::estimate(&large).bytes;
        let budget = |bytes: f64| interp::Budget {
            max_bytes: bytes as u64,
            ..interp::Budget::default()
        };
        assert_eq!(
            concurrent_references([&small, &large], &budget(each * 3.5), 16),
            3
        );
        assert_eq!(
            concurrent_references([&large], &budget(each * 100.0), 16),
            16
        );
        assert_eq!(concurrent_references([&large], &budget(each / 2.0), 16), 1);
        assert_eq!(concurrent_references([], &budget(1.0), 8), 8);
    }

    #[test]
    fn graphs_of_one_signature_share_their_drawn_inputs() {
        let pool = InputPool::default();
        let (a, b, c) = (graph(8, true), graph(8, false), graph(16, true));
        let spec = InputSpec {
            seed: 5,
            scale: 0.5,
        };
        let (ia, ib) = (pool.get(&a, spec), pool.get(&b, spec));
        assert!(Arc::ptr_eq(&ia, &ib), "same signature, seed and scale");
        assert_eq!(*ia, interp::random_inputs(&a, spec));
        assert!(!Arc::ptr_eq(&ia, &pool.get(&c, spec)), "another shape");
        let half = InputSpec {
            scale: 0.25,
            ..spec
        };
        assert!(!Arc::ptr_eq(&ia, &pool.get(&a, half)), "another scale");
        // Drawn through the pool: the same inputs, each graph its own reference.
        let budget = interp::Budget::default();
        let da = drawn_with(&a, None, 5, 0.5, &budget, Some(&pool)).unwrap();
        let db = drawn_with(&b, None, 5, 0.5, &budget, Some(&pool)).unwrap();
        assert_eq!(
            (da.inputs.len(), da.reference.len()),
            (1, 1),
            "a mesh of one"
        );
        assert!(Arc::ptr_eq(&da.inputs[0], &db.inputs[0]));
        assert_ne!(da.reference[0][0].data, db.reference[0][0].data);
        let alone = inputs_and_reference(&a, 5, 0.5, &budget).unwrap();
        assert_eq!(alone.first_rank(), da.first_rank());
        assert_eq!(alone.reference[0][0].data, da.reference[0][0].data);
        // The references share one conversion of the inputs, and equal the walk over copies.
        assert!(Arc::ptr_eq(&pool.arrays(&a, spec), &pool.arrays(&b, spec)));
        assert_eq!(
            da.reference[0],
            interp::evaluate(&a, da.first_rank()).unwrap(),
            "shared arrays, copied buffers"
        );
    }

    /// The storage-rounding reference `check_outputs` takes for every mesh: on one GPU it is
    /// the one-rank walk's.
    #[test]
    fn one_gpu_is_a_mesh_of_one_rank_for_the_rounded_reference() {
        let g = graph(8, true);
        let inputs = interp::random_inputs(
            &g,
            InputSpec {
                seed: 3,
                scale: 1.0,
            },
        );
        let (ranks, _) =
            interp::evaluate_ranks(&g, vec![inputs.clone()], interp::Rounding::Stored).unwrap();
        let (one, _) = interp::evaluate_rounded(&g, inputs, interp::Rounding::Stored).unwrap();
        assert_eq!(ranks, vec![one]);
    }
}
