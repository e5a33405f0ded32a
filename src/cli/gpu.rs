//! The options of the commands that run on a GPU, and opening a [`Session`] from them.

use std::path::PathBuf;

use clap::Args;
use mucc::cuda::session::{Session, SessionOptions};

use super::Failure;

pub use mucc::cuda::session::{Drawn, InputCache, InputChoice, Prepared, check_outputs};

/// Options of the commands that run on a GPU.
#[derive(Args, Debug, Clone)]
pub struct GpuArgs {
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Runtime headers folder (default: the copy embedded in mucc).
    #[arg(long, value_name = "DIR")]
    pub runtime_headers: Option<PathBuf>,
    /// Compile without reading or writing the NVRTC cache.
    #[arg(long)]
    pub no_cache: bool,
    /// The most device memory one graph's buffers may take (bytes; K, M, G suffixes; default:
    /// what the GPU has free).
    #[arg(long, value_name = "BYTES", value_parser = super::parse_bytes)]
    pub max_device_memory: Option<u64>,
    #[command(flatten)]
    pub path: super::PathArg,
    /// With --gpus N: where the outputs and workspace that all-reduces read and write are
    /// allocated — `symmetric`: one NCCL symmetric window per rank (NCCL 2.27+), which lets
    /// NCCL use its low-latency kernels; `plain`: ordinary allocations.
    #[arg(long, value_enum, default_value_t = AllReduceBuffersArg::Symmetric)]
    pub all_reduce_buffers: AllReduceBuffersArg,
    /// Compile this CUDA file instead of the graph's generated source: an edited copy of
    /// `mucc transpile`'s output (made with the same planning options), run, checked and timed
    /// under the graph's own launch plan, so it must keep the kernels' names, parameters,
    /// grids and shared-memory sizes. The tuning cache is not applied. For trying a change to a
    /// kernel by hand; one graph on one GPU.
    #[arg(long, value_name = "FILE")]
    pub source: Option<PathBuf>,
}

/// `--all-reduce-buffers`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllReduceBuffersArg {
    /// NCCL symmetric windows (plain allocations where NCCL cannot make them; the bench says so).
    Symmetric,
    /// Ordinary device allocations.
    Plain,
}

impl AllReduceBuffersArg {
    /// The runner's setting.
    pub fn placement(self) -> mucc::cuda::multi::AllReduceBuffers {
        match self {
            AllReduceBuffersArg::Symmetric => mucc::cuda::multi::AllReduceBuffers::Symmetric,
            AllReduceBuffersArg::Plain => mucc::cuda::multi::AllReduceBuffers::Plain,
        }
    }
}

/// [`Session::prepare`] of `indices` behind a progress bar (the bar is returned to count the
/// graphs as they run; lines are printed through its `suspend` while it exists), and the
/// seconds it took.
pub fn prepare_with_bar(
    session: &Session,
    file: &mucc::MirageFile,
    name: &str,
    indices: &[usize],
    choice: InputChoice,
) -> (
    Vec<Result<Prepared, mucc::cuda::session::PrepareError>>,
    indicatif::ProgressBar,
    f64,
) {
    let bar = super::progress::bar(
        indices.len() as u64,
        "graphs",
        format!("compiling {} graphs", indices.len()),
    );
    let t0 = std::time::Instant::now();
    let prepared = session.prepare(file, name, indices, choice);
    (prepared, bar, t0.elapsed().as_secs_f64())
}

/// Opens the GPU and the compiler `a` names, with `--source`'s text when given.
pub fn open(a: &GpuArgs) -> Result<Session, Failure> {
    let source = a.source.as_deref().map(read_source).transpose()?;
    let mut session = open_plain(a)?;
    if source.is_some() {
        // The edited source was transpiled with the command line's options: plan with them
        // too, not with a tuning cache's.
        session.tune = None;
    }
    session.source = source;
    Ok(session)
}

/// The text of a `--source` file.
fn read_source(p: &std::path::Path) -> Result<String, Failure> {
    std::fs::read_to_string(p)
        .map_err(|e| Failure::User(format!("--source {}: {e}", super::shown(p))))
}

/// Refuses `--source` unless `indices` are one graph of one GPU (`gpus`: its mesh size).
pub fn check_source(a: &GpuArgs, indices: &[usize], gpus: usize) -> Result<(), Failure> {
    if a.source.is_none() {
        return Ok(());
    }
    if indices.len() != 1 || gpus != 1 {
        return Err(Failure::User(format!(
            "--source replaces one graph's generated code: select one graph (--graph N) of one GPU ({} selected{})",
            indices.len(),
            if gpus > 1 {
                format!(", on {gpus} GPUs")
            } else {
                String::new()
            }
        )));
    }
    Ok(())
}

/// Opens the GPU and the compiler `a` names.
fn open_plain(a: &GpuArgs) -> Result<Session, Failure> {
    Session::open(&SessionOptions {
        device: a.device,
        runtime_headers: a.runtime_headers.clone(),
        no_cache: a.no_cache,
        max_device_memory: a.max_device_memory.map(|b| b as usize),
        path: a.path.choice,
        dependent_launch: a.path.dependent_launch,
        cta: a.path.warps,
        no_tune: !a.path.tunable(),
        no_register_pipes: a.path.no_register_pipes,
        no_register_rows: a.path.no_register_rows,
        no_wgmma: a.path.no_wgmma,
        no_tma: a.path.no_tma,
        no_fuse_matmuls: a.path.no_fuse_matmuls,
        no_cluster_push: a.path.no_cluster_push,
        cluster_combine: a.path.cluster_combine,
        last_block_combine: a.path.last_block_combine,
        grid_split: a.path.grid_split,
        online_softmax: a.path.online_softmax,
        fold_key_splits: a.path.fold_key_splits,
        // The runner provides the exchange buffers the fused form needs.
        all_reduce: a
            .path
            .all_reduce
            .unwrap_or(mucc::sched::exchange::AllReduceChoice::Fused),
        max_stages: a.path.max_stages.map(|s| s as usize),
        resident_blocks: a.path.resident_blocks.map(|s| s as usize),
        refine_loops: a.path.loop_choice(mucc::sched::RefineChoice::Auto),
    })
    .map_err(|e| Failure::User(e.to_string()))
}

/// The GPUs of a command on `n` GPUs (one is a mesh of one): the session, its GPU rank 0
/// (device `a.device`) and, on several, the other ranks joined by NCCL
/// ([`Session::join_ranks`]); and a line naming them.
pub fn open_mesh(a: &GpuArgs, n: usize) -> Result<(Session, String), Failure> {
    use mucc::cuda::multi;
    let mut session = open(a)?;
    if n <= 1 {
        let line = format!("GPU: {}", session.describe());
        return Ok((session, line));
    }
    session.join_ranks(a.device, n).map_err(|e| {
        exit_if_stuck(&e);
        Failure::User(e.to_string())
    })?;
    let mut line = format!(
        "GPUs: {n} x {} (devices {}..{}), NCCL {}",
        session.describe(),
        a.device,
        a.device + n - 1,
        multi::nccl_version().unwrap_or_else(|| "(version unknown)".into()),
    );
    // The fused all-reduce needs every GPU to address the others' memory; without that, the
    // default falls back to NCCL (an explicit --all-reduce fused fails with the reason later).
    if a.path.all_reduce.is_none() {
        let all: Vec<&mucc::cuda::Gpu> = std::iter::once(&session.gpu)
            .chain(&session.others)
            .collect();
        let missing = multi::missing_peer_access(&all).map_err(|e| Failure::User(e.to_string()))?;
        if let Some((i, j)) = missing {
            session.opts.all_reduce = mucc::sched::exchange::AllReduceChoice::Nccl;
            line.push_str(&format!(
                "; all-reduces through NCCL (rank {i}'s GPU cannot address rank {j}'s memory)"
            ));
        }
    }
    Ok((session, line))
}

/// Ends the process at once when some GPU's work never finishes (`RunError::is_stuck`):
/// releasing its buffers or module could block forever, so nothing is released.
pub fn exit_if_stuck(e: &mucc::cuda::RunError) {
    if e.is_stuck() {
        use std::io::Write;
        let _ = std::io::stdout().flush();
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
