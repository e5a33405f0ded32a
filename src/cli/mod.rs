//! Subcommands of the `mucc` binary.

mod bench;
mod build;
mod eval;
mod explain;
mod export;
mod gpu;
mod inspect;
mod out;
mod progress;
mod run;
mod transpile;
mod tune;

use std::io::{self, Write};
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use mucc::graph::DtypeTable;
use mucc::graph::error::clip;
use mucc::{ImportOptions, MirageFile};

/// mucc: a µGraph-to-CUDA transpiler for Mirage µGraphs.
#[derive(Parser, Debug)]
#[command(name = "mucc", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Show the candidates, kernels, operators, shapes, grids, loops and dtypes of a µGraph
    /// file, and whether each graph is valid.
    Inspect(inspect::InspectArgs),
    /// Evaluate graphs on the CPU reference interpreter (f64) with seeded random inputs. With
    /// several graphs, a progress bar on stderr when it is a terminal.
    Eval(eval::EvalArgs),
    /// Write graphs back as Mirage JSON (e.g. convert legacy files to current Mirage).
    Export(export::ExportArgs),
    /// Turn a µGraph into one CUDA C++ file (and its launch plan).
    Transpile(transpile::TranspileArgs),
    /// Show every planning decision for one graph: fusion chains, schedule with barriers,
    /// layouts, strides and swizzles, operator plans, shared-memory and workspace maps.
    Explain(explain::ExplainArgs),
    /// Transpile, compile (NVRTC, cached) and execute graphs on the GPU; with `--check`,
    /// compare every output with the CPU interpreter. With several graphs (`--all`), a progress
    /// bar on stderr when it is a terminal.
    Run(run::RunArgs),
    /// Time graphs on the GPU (CUDA events, CUDA-graph replay, inputs rotated past the L2
    /// cache) against the floor from the GPU's measured bandwidth and matrix rate; `--svg` draws
    /// every candidate (µs against ×floor). With several graphs (`--all`), a progress bar on
    /// stderr when it is a terminal.
    Bench(bench::BenchArgs),
    /// Build one graph into a shared library exposing `mucc_execute`, with a C header.
    Build(build::BuildArgs),
    /// Try every implementation variant of graphs on the GPU (checked, then timed) and keep the
    /// fastest in the tuning cache, which `run`, `bench`, `transpile` and `build` then use.
    /// A progress bar (one tick per variant) on stderr when it is a terminal.
    Tune(tune::TuneArgs),
}

/// Options shared by commands that read a µGraph file.
#[derive(Args, Debug, Clone)]
pub struct InputArgs {
    /// A Mirage µGraph JSON file (a candidate list, a single graph, or a May-2024 checkpoint).
    pub file: PathBuf,
    /// How to read `data_type` codes: legacy (≤ 2025-02-27), mid (2025-02-28 … 06-04) or
    /// current. Detected from the file when absent.
    #[arg(long, value_name = "TABLE", value_parser = parse_table)]
    pub dtype_table: Option<DtypeTable>,
    /// The largest input file to read (bytes; K, M and G suffixes are powers of 1024).
    #[arg(long, value_name = "BYTES", default_value = "64M", value_parser = parse_bytes)]
    pub max_input_bytes: u64,
    /// The most candidate graphs the file may hold.
    #[arg(long, value_name = "N", default_value_t = mucc::graph::mirage_json::DEFAULT_MAX_GRAPHS, value_parser = parse_max_graphs)]
    pub max_graphs: usize,
    /// GPUs the graphs run on (Mirage's JSON does not record it; mucc's export writes it as
    /// `mucc_gpu_dim`, which this replaces). On more than one, every GPU runs the graph on its
    /// shard of the partitioned inputs and `kn_allreduce_op` sums over the GPUs (NCCL on the
    /// GPU, f64 in `eval`; docs/multi-gpu.md).
    #[arg(long, value_name = "N", value_parser = parse_gpus)]
    pub gpus: Option<usize>,
}

/// A candidate count: at least 1.
fn parse_max_graphs(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("`{}` is not a graph count (1 or more)", clip(s))),
    }
}

/// A GPU count: 1 to the most a mesh may have.
fn parse_gpus(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n >= 1 && mucc::graph::GpuMesh::line(n).check().is_ok() => Ok(n),
        _ => Err(format!("`{}` is not a GPU count (1 to 1024)", clip(s))),
    }
}

/// How the random inputs are drawn (`eval`, `run`, `bench`, `tune`).
#[derive(Args, Debug, Clone, Copy)]
pub struct DrawArgs {
    /// Seed of the random inputs (uniform in [−scale, scale), rounded to the input dtype).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Half-width of the input distribution. Where outputs are checked (`run --check`, `bench
    /// --check`, `tune`), halved per graph while a tensor the GPU stores would leave its
    /// dtype's finite range on these inputs; `eval` warns instead.
    #[arg(long, default_value_t = 1.0, value_parser = parse_scale)]
    pub scale: f64,
}

impl DrawArgs {
    /// The inputs a GPU command draws: these, checked against the f64 reference within
    /// `budget` when `check` is set.
    pub fn choice(&self, check: bool, budget: &BudgetArgs) -> mucc::cuda::session::InputChoice {
        mucc::cuda::session::InputChoice {
            seed: self.seed,
            scale: self.scale,
            check,
            budget: budget.budget(),
        }
    }
}

/// Limits of the f64 reference (`mucc eval`, and `--check` of `run` and `bench`).
#[derive(Args, Debug, Clone)]
pub struct BudgetArgs {
    /// Host memory the reference may use (bytes; K, M, G suffixes).
    #[arg(long, value_name = "BYTES", default_value = "8G", value_parser = parse_bytes)]
    pub max_memory: u64,
    /// Operations the reference may take (element operations and multiply-adds; 1e11 is about
    /// a minute).
    #[arg(long, value_name = "OPS", default_value_t = mucc::graph::interp::budget::DEFAULT_MAX_OPS, value_parser = parse_work)]
    pub max_work: f64,
}

impl BudgetArgs {
    /// The budget.
    pub fn budget(&self) -> mucc::graph::interp::Budget {
        mucc::graph::interp::Budget {
            max_bytes: self.max_memory,
            max_ops: self.max_work,
        }
    }
}

fn parse_work(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if x > 0.0 && !x.is_nan() => Ok(x),
        _ => Err(format!(
            "`{}` is not a positive number of operations",
            clip(s)
        )),
    }
}

/// An input scale: a finite number greater than 0.
pub fn parse_scale(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        Ok(_) => Err(format!(
            "the scale must be a finite number above 0, not {}",
            clip(s)
        )),
        Err(_) => Err(format!("`{}` is not a number", clip(s))),
    }
}

/// `--path`: which features threadblock kernels may use.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct PathArg {
    /// Code path of threadblock kernels: auto (every feature of the target: on sm_90a, for-loops
    /// split over clusters, TMA loads, programmatic launches), ampere (sm_80 features only) or
    /// hopper (sm_90a only).
    #[arg(long = "path", value_name = "auto|ampere|hopper", default_value = "auto", value_parser = |s: &str| s.parse::<mucc::sched::PathChoice>())]
    pub choice: mucc::sched::PathChoice,
    /// Launch threadblock kernels programmatically on sm_90a (programmatic dependent launch):
    /// the graph's first one and those after a generated kernel; each waits for the kernel
    /// before (`griddepcontrol.wait`) after prefetching its first TMA boxes into L2, and the
    /// kernel before (the graph's last, for the next execution) triggers it: a threadblock
    /// kernel after its loop, a kernel-level one first thing. Off by default: measured slower
    /// on an H200 before the prefetch.
    #[arg(long = "dependent-launch")]
    pub dependent_launch: bool,
    /// Warps per CTA of threadblock kernels: auto (the planner's cost model), graph (the
    /// µGraph's block_dim) or a number from 1 to 32. Any choice computes the same function.
    #[arg(long = "warps", value_name = "auto|graph|N", default_value = "auto", value_parser = |s: &str| s.parse::<mucc::sched::CtaChoice>())]
    pub warps: mucc::sched::CtaChoice,
    /// Ignore the tuning cache (`mucc tune`). It is also ignored when `--path` names another
    /// path than auto, `--warps` is not auto or `--dependent-launch` is given: options given
    /// win.
    #[arg(long)]
    pub no_tune: bool,
    /// Keep every matmul product in shared memory: no register pipes (a product that another
    /// tensor-core matmul takes as its A operand otherwise stays in registers where the plan
    /// allows; `explain` says which and why). For comparison: both compute the same function.
    #[arg(long)]
    pub no_register_pipes: bool,
    /// Keep every threadblock kernel's tiles in shared memory: no register rows (a kernel whose
    /// operators are all element-wise or row norms over a one-iteration loop otherwise keeps
    /// every tile in registers; `explain` says which and why). For comparison: both compute the
    /// same function.
    #[arg(long)]
    pub no_register_rows: bool,
    /// Run every tensor-core matmul with `mma.sync`: no `wgmma` on the Hopper path (a register
    /// pipe's consumer matmul otherwise issues warpgroup MMAs where its B tile allows; `explain`
    /// says which and why). For comparison: both compute the same function.
    #[arg(long)]
    pub no_wgmma: bool,
    /// Load every for-loop's streamed tiles by `cp.async`: no bulk tensor copies (TMA) on the
    /// Hopper path (`explain` names each input that keeps `cp.async` and why). Some decode
    /// weights stream faster this way (docs/benchmarks.md); `mucc tune` tries it. Both
    /// compute the same function.
    #[arg(long)]
    pub no_tma: bool,
    /// Keep every kernel-level matmul a separate step (a cuBLAS call): a matmul whose product
    /// only one customized operator reads is otherwise computed per tile inside it, where the
    /// rewritten graph plans (`explain` says which and why). For comparison: both compute the
    /// same function.
    #[arg(long)]
    pub no_fuse_matmuls: bool,
    /// Fold a cluster split's partial accumulators by CTA 0's reads through distributed shared
    /// memory, between two cluster barriers: no pushes (the other CTAs otherwise store their
    /// partials into CTA 0's shared memory and leave, where the slots fit; `explain` says
    /// which and why not). For comparison: both compute the same function.
    #[arg(long)]
    pub no_cluster_push: bool,
    /// Run the combining step of split attention in the attention kernel's clusters (sm_90a):
    /// the kernel launches in clusters of its key splits (2 to 8), whose CTAs combine their
    /// partials through distributed shared memory and store the result, instead of a combining
    /// kernel after it (`explain` says where and why not). Off by default: measured slower on
    /// an H200 (docs/benchmarks.md). Both compute the same function up to rounding.
    #[arg(long)]
    pub cluster_combine: bool,
    /// Run the combining step of split attention in the attention kernel's last blocks: each
    /// block stores its key split's partials and arrives on a counter of its group (the blocks
    /// of its query rows); the last to arrive reads the group's partials back, combines them
    /// and stores the rows, instead of a combining kernel after it (`explain` says where and
    /// why not). The counters live at the end of the workspace, which must then be zero before
    /// the first call (each call leaves them zero; `run` and `bench` allocate it zeroed). Off
    /// by default: measured slower on an H100 (docs/benchmarks.md). Both compute the same
    /// function up to rounding.
    #[arg(long)]
    pub last_block_combine: bool,
    /// Split the for-loop of threadblock kernels whose grid leaves SMs idle over CTAs that need
    /// not run at once: each accumulates its share of the iterations, stores its partial
    /// accumulators into the workspace and arrives on its block's counter; the last to arrive
    /// folds every CTA's partials in CTA order and runs the operators after the loop. `N` (2 to
    /// 64): N CTAs per block wherever the rules hold, on either path (it replaces a cluster
    /// split; `explain` says where and why not); `off`: none; `auto` (default): the planner's
    /// rule, which splits on the Ampere path (no clusters there) the kernels whose grid leaves
    /// a quarter of the SMs idle or more. The counters live at the end of the workspace, which
    /// must then be zero before the first call (each call leaves them zero; `run` and `bench`
    /// allocate it zeroed). The function is the same up to rounding.
    #[arg(long = "grid-split", value_name = "auto|off|N", default_value = "auto", value_parser = |s: &str| s.parse::<mucc::sched::GridSplitChoice>())]
    pub grid_split: mucc::sched::GridSplitChoice,
    /// Where split attention kernels compute their softmax online: they keep a running row
    /// max, rescale their sums and write the max, and a combining kernel rescales the partials
    /// of the key splits, so that no exponential overflows. `piped`: where the rewritten
    /// kernel keeps its scores in registers (the rescaling then costs little); `always`: also
    /// through shared memory (slower); `off`: the graph's form everywhere. `explain` says which
    /// kernels and why not. The function is the same up to rounding.
    #[arg(long = "online-softmax", value_name = "off|piped|always", default_value = "piped", value_parser = |s: &str| s.parse::<mucc::sched::softmax::SoftmaxChoice>())]
    pub online_softmax: mucc::sched::softmax::SoftmaxChoice,
    /// Whether split attention runs several key splits one after the other in one block's
    /// for-loop: `N` folds N consecutive splits where N divides them (the splits' count folds
    /// them all: the kernel then divides by the row sums itself and no combining kernel
    /// runs); `off`: every split stays a block; `auto` (default): the planner's rule, which
    /// folds every split on the Hopper path where the blocks without the splits fill the SMs.
    /// `explain` says which kernels and why not. The function is the same up to rounding.
    #[arg(long = "fold-key-splits", value_name = "off|auto|N", default_value = "auto", value_parser = |s: &str| s.parse::<mucc::sched::softmax::KeyFold>())]
    pub fold_key_splits: mucc::sched::softmax::KeyFold,
    /// How a graph on several GPUs runs its all-reduces: `fused`: the kernel writing an
    /// all-reduce's input performs it where `explain` shows the rules hold (its blocks store
    /// their tiles as (value, flag) words into every GPU's exchange buffer, its last blocks
    /// sum them), 2-4 us faster than NCCL on 2 x H100 (docs/multi-gpu.md); `nccl`: an
    /// `ncclAllReduce` step. Default: `fused` for `run` and `bench`, which provide the exchange
    /// buffers; `nccl` for `transpile`, `build` and `explain`, whose host entry would otherwise
    /// take the buffers as an argument. Both compute the same function.
    #[arg(long = "all-reduce", value_name = "nccl|fused", value_parser = |s: &str| s.parse::<mucc::sched::exchange::AllReduceChoice>())]
    pub all_reduce: Option<mucc::sched::exchange::AllReduceChoice>,
    /// The deepest pipeline ring (stages of a for-loop's streamed inputs) a threadblock kernel
    /// may get, 1 to 4 (default: 4, the planner's choice below it; 2 for kernels that keep a
    /// product in registers between two matmuls, a cap this option replaces). A shallower ring
    /// takes less shared memory, so that more CTAs stream at once; `mucc tune` tries 2 and 3.
    /// Any depth computes the same function.
    #[arg(long = "max-stages", value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4))]
    pub max_stages: Option<u32>,
    /// Blocks per SM (1 to 8) to plan every threadblock kernel over shared-memory tiles for:
    /// its ring is sized so that shared memory holds that many, and ptxas is promised as many
    /// as fit (launch bounds), which caps a thread's registers. A for-loop split over a
    /// cluster (sm_90a) counts on that many CTAs per SM as far as shared memory and threads
    /// allow, beyond its own cap of 4 (larger clusters may then fit in one wave). By default
    /// the planner's rule (1 to 3 by block size, grid and the fill of the last wave; `explain`
    /// shows the count). Any count computes the same function.
    #[arg(long = "resident-blocks", value_name = "N", value_parser = clap::value_parser!(u32).range(1..=8))]
    pub resident_blocks: Option<u32>,
    /// Refine customized operators' for-loops by N (1 to 8) where their bodies allow: N times
    /// the iterations over tiles N times thinner along the loop, so that each CTA takes less
    /// shared memory and more of them stream at once (`explain` says which loops and why not;
    /// `mucc tune` tries 2 and 4). By default the planner's rule (Hopper path) refines by 2 the
    /// loops of kernels whose large grid of small blocks shared memory holds one per SM, where
    /// three then fit, and the short loops of small grids that do not pipeline, where they then
    /// do; 1 refines none. The function is the same up to rounding.
    #[arg(long = "refine-loops", value_name = "N", value_parser = clap::value_parser!(u32).range(1..=8))]
    pub refine_loops: Option<u32>,
    /// Coarsen customized operators' for-loops by C (1 to 8) where their bodies allow and C
    /// divides the iterations: 1/C of the iterations over tiles C times thicker along the
    /// loop, so that each iteration's fixed costs (stage wait, barriers, refill) are paid once
    /// for C times the work (`explain` says which loops and why not; `mucc tune` tries 2). Like
    /// `--refine-loops`, it replaces the planner's refinement rule for every kernel. The
    /// function is the same up to rounding.
    #[arg(long = "coarsen-loops", value_name = "C", conflicts_with = "refine_loops", value_parser = clap::value_parser!(u32).range(1..=8))]
    pub coarsen_loops: Option<u32>,
}

impl PathArg {
    /// The loop rewrite asked for (`--refine-loops`, `--coarsen-loops`), else `otherwise`.
    pub fn loop_choice(&self, otherwise: mucc::sched::RefineChoice) -> mucc::sched::RefineChoice {
        mucc::sched::RefineChoice::asked(
            self.refine_loops.map(|r| r as usize),
            self.coarsen_loops.map(|c| c as usize),
            otherwise,
        )
    }

    /// Whether a tuned variant may replace these options: no `--no-tune`, and the defaults.
    pub fn tunable(&self) -> bool {
        !self.no_tune
            && !self.no_register_pipes
            && !self.no_register_rows
            && !self.no_wgmma
            && !self.no_tma
            && !self.no_cluster_push
            && !self.no_fuse_matmuls
            && !self.cluster_combine
            && !self.last_block_combine
            && self.grid_split == mucc::sched::GridSplitChoice::Auto
            && self.online_softmax == mucc::sched::softmax::SoftmaxChoice::default()
            && self.fold_key_splits == mucc::sched::softmax::KeyFold::default()
            && self.max_stages.is_none()
            && self.resident_blocks.is_none()
            && self.refine_loops.is_none()
            && self.coarsen_loops.is_none()
            && mucc::cuda::tune::replaceable(self.choice, self.dependent_launch, self.warps)
    }

    /// The options for `arch` (symbols default), with the cached tuned variant of `g` for
    /// `arch` applied when [`PathArg::tunable`] and the cache has one; says so on stderr.
    pub fn options(
        &self,
        g: &mucc::KernelGraph,
        arch: mucc::target::Arch,
        what: &str,
    ) -> mucc::sched::Options {
        let (mut opts, entry) = mucc::cuda::tune::options_for(
            g,
            arch,
            self.choice,
            self.dependent_launch,
            self.warps,
            self.tunable(),
        );
        opts.register_pipes = !self.no_register_pipes;
        opts.register_rows = !self.no_register_rows;
        opts.wgmma = !self.no_wgmma;
        opts.tma = !self.no_tma;
        opts.cluster_push = !self.no_cluster_push;
        opts.fuse_matmuls = !self.no_fuse_matmuls;
        opts.cluster_combine = self.cluster_combine;
        opts.last_block_combine = self.last_block_combine;
        opts.grid_split = self.grid_split;
        opts.online_softmax = self.online_softmax;
        opts.fold_key_splits = self.fold_key_splits;
        opts.all_reduce = self.all_reduce.unwrap_or_default();
        if let Some(s) = self.max_stages {
            opts.max_stages = Some(s as usize);
        }
        if let Some(r) = self.resident_blocks {
            opts.resident_blocks = Some(r as usize);
        }
        opts.refine_loops = self.loop_choice(opts.refine_loops);
        if let Some(e) = entry {
            eprintln!(
                "{what}: tuned variant {} (mucc tune on {}; --no-tune ignores it)",
                e.best,
                mucc::graph::error::escape(&e.gpu)
            );
        }
        opts
    }
}

/// A path for a message, escaped ([`mucc::graph::error::escape_path`]): a file name can hold a
/// newline or an escape sequence.
pub fn shown(p: &std::path::Path) -> String {
    mucc::graph::error::escape_path(p)
}

/// A byte count: digits with an optional K, M or G suffix (powers of 1024).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (digits, shift) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    let n: u64 = digits.parse().map_err(|_| {
        format!(
            "`{}` is not a byte count (digits with an optional K, M or G)",
            clip(s)
        )
    })?;
    n.checked_shl(shift)
        .filter(|v| v >> shift == n)
        .ok_or_else(|| format!("`{}` is too large", clip(s)))
}

fn parse_table(s: &str) -> Result<DtypeTable, String> {
    s.parse()
}

/// Selection of graphs within a file.
#[derive(Args, Debug, Clone)]
pub struct GraphSelection {
    /// Index of the graph (candidate) in the file.
    #[arg(long, short = 'g', value_name = "N", conflicts_with = "all")]
    pub graph: Option<usize>,
    /// All graphs of the file.
    #[arg(long)]
    pub all: bool,
}

impl GraphSelection {
    /// The indices selected; `default_all` decides what no flag means.
    pub fn indices(&self, file: &MirageFile, default_all: bool) -> Result<Vec<usize>, Failure> {
        let n = file.graphs.len();
        match self.graph {
            Some(g) if g >= n => Err(Failure::User(format!(
                "{}: there is no graph {g}; the file has {n} graph{} (0..={})",
                file.path.as_ref().map_or("input".into(), |p| shown(p)),
                if n == 1 { "" } else { "s" },
                n - 1
            ))),
            Some(g) => Ok(vec![g]),
            None if self.all || default_all => Ok((0..n).collect()),
            None => Ok(vec![0]),
        }
    }
}

/// Why a command failed.
pub enum Failure {
    /// A user error, printed as `error: …`.
    User(String),
    /// A failure already reported on stdout/stderr.
    Quiet,
    /// stdout was closed (e.g. piped into `head`): stop quietly.
    BrokenPipe,
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        if e.kind() == io::ErrorKind::BrokenPipe {
            Failure::BrokenPipe
        } else {
            Failure::User(format!("cannot write output: {e}"))
        }
    }
}

/// Loads a file with the shared options.
pub fn load(args: &InputArgs) -> Result<MirageFile, Failure> {
    let mut file = mucc::read_file(
        &args.file,
        &ImportOptions {
            dtype_table: args.dtype_table,
            max_input_bytes: args.max_input_bytes,
            max_graphs: args.max_graphs,
        },
    )
    .map_err(|e| Failure::User(e.to_string()))?;
    if let Some(n) = args.gpus {
        file.set_gpu_mesh(mucc::graph::GpuMesh::line(n));
    }
    Ok(file)
}

/// The GPU count of the selected graphs (they must agree).
pub fn mesh_size(file: &MirageFile, indices: &[usize]) -> Result<usize, Failure> {
    let n = |i: usize| file.graphs[i].graph.sharding.num_gpus();
    let first = indices.first().map_or(1, |&i| n(i));
    if let Some(&i) = indices.iter().find(|&&i| n(i) != first) {
        return Err(Failure::User(format!(
            "graph {} runs on {first} GPUs and graph {i} on {}: select graphs of one GPU count \
             (--graph N)",
            indices[0],
            n(i)
        )));
    }
    Ok(first)
}

/// Refuses graphs that run on several GPUs in a command that runs one (`what`).
pub fn one_gpu_only(file: &MirageFile, indices: &[usize], what: &str) -> Result<(), Failure> {
    for &i in indices {
        let n = file.graphs[i].graph.sharding.num_gpus();
        if n > 1 {
            return Err(Failure::User(format!(
                "graph {i} runs on {n} GPUs (its mesh); {what} runs graphs on one GPU only so far \
                 (`mucc run --gpus {n}` runs and checks it)"
            )));
        }
    }
    Ok(())
}

/// Prints the file's warnings on stderr.
pub fn print_warnings(file: &MirageFile) {
    for w in &file.warnings {
        eprintln!(
            "warning: {}: {w}",
            file.path.as_ref().map_or("input".into(), |p| shown(p))
        );
    }
}

/// A locked stdout.
pub fn stdout() -> io::StdoutLock<'static> {
    io::stdout().lock()
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> Result<(), Failure> {
    let r = match cli.command {
        Command::Inspect(a) => inspect::run(a),
        Command::Eval(a) => eval::run(a),
        Command::Export(a) => export::run(a),
        Command::Explain(a) => explain::run(a),
        Command::Transpile(a) => transpile::run(a),
        Command::Run(a) => run::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Build(a) => build::run(a),
        Command::Tune(a) => tune::run(a),
    };
    let _ = io::stdout().flush();
    r
}
