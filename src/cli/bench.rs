//! `mucc bench`: time graphs on the GPU and compare them with the floor of the GPU they run on.
//!
//! Per graph: median µs per execution (CUDA events; CUDA-graph replay by default; buffer sets
//! rotated so that the working set exceeds twice the L2 cache), achieved GB/s (input bytes
//! read once plus output bytes written once, over the time) and TFLOP/s (matrix products), and
//! the ratio to the floor from the bandwidth and matrix rate measured once per run. The fastest
//! graph that ran cleanly (and passed `--check`, when given) is marked. `--svg FILE` also draws
//! every candidate (µs against ×floor) into an SVG chart ([`chart`]).

mod chart;

use std::io::Write;

use clap::{Args, ValueEnum};
use mucc::cuda::bench::{Ceilings, Launch, TimingOptions};
use mucc::cuda::data::Comparison;
use mucc::graph::DType;
use mucc::graph::cost::{self, Work};
use serde_json::{Value, json};

use mucc::cuda::session::{Measurement, fastest};

use super::gpu::{GpuArgs, InputCache, Prepared, check_outputs};
use super::{Failure, GraphSelection, InputArgs, load, print_warnings, stdout};
use mucc::cuda::session::Session;

/// How executions are launched while timing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LaunchArg {
    /// Captured once into a CUDA graph and replayed.
    Graph,
    /// Launched one by one on the stream.
    Stream,
}

/// Arguments of `mucc bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    input: InputArgs,
    #[command(flatten)]
    select: GraphSelection,
    /// Timed samples per graph (the median is reported). In graph mode a sample is one replay
    /// of at least 10 executions (one per buffer set, rounded up), in stream mode one execution.
    #[arg(long, default_value_t = 50)]
    iters: usize,
    /// Untimed samples before the timed ones.
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// Replay a CUDA graph of the executions, or launch each on the stream.
    #[arg(long, value_enum, default_value_t = LaunchArg::Graph)]
    launch: LaunchArg,
    /// Also time every step of each graph alone (kernels, cuBLAS calls, all-reduces) the same
    /// way, and print them under the graph's row (and in the JSON document).
    #[arg(long)]
    steps: bool,
    /// Check every graph against the CPU interpreter first, as `mucc run --check` does; only a
    /// graph that passes can be marked fastest.
    #[arg(long)]
    check: bool,
    #[command(flatten)]
    draw: super::DrawArgs,
    /// Print one JSON document instead of the table.
    #[arg(long, conflicts_with = "json_out")]
    json: bool,
    /// Also write the JSON document to this file (the table still goes to stdout).
    #[arg(long, value_name = "FILE")]
    json_out: Option<std::path::PathBuf>,
    /// Also draw every candidate into this SVG chart: x = median µs, y = time over the floor,
    /// one marker per candidate labelled with its graph index, the fastest in red, unverified
    /// ones hollow; failed and unverified ones are listed below the plot with their reasons.
    #[arg(long, value_name = "FILE")]
    svg: Option<std::path::PathBuf>,
    /// Overwrite the `--json-out` or `--svg` file if it exists.
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    gpu: GpuArgs,
    #[command(flatten)]
    budget: super::BudgetArgs,
}

/// What was measured for one graph.
struct Row {
    graph: usize,
    result: Result<Measured, String>,
}

struct Measured {
    /// Timing, check (`None` without `--check`), finiteness and step times.
    run: Measurement,
    work: Work,
    steps: usize,
    compile: String,
    cached: bool,
}

/// µs of the floor, and which term sets it.
fn floor(ceil: &Ceilings, w: &Work) -> (f64, &'static str) {
    let (seconds, bound) = ceil.floor(w);
    (seconds * 1e6, bound.name())
}

/// How `a` asks for executions to be timed.
fn timing_options(a: &BenchArgs) -> TimingOptions {
    TimingOptions {
        samples: a.iters.max(1),
        warmup: a.warmup,
        launch: match a.launch {
            LaunchArg::Graph => Launch::Graph,
            LaunchArg::Stream => Launch::Stream,
        },
        per_step: a.steps,
        ..Default::default()
    }
}

fn measure(
    session: &mut Session,
    prep: &Prepared,
    a: &BenchArgs,
    graph: &mucc::graph::KernelGraph,
    cache: &mut InputCache,
) -> Result<Measured, String> {
    let shared;
    let inputs: &[_] = match &prep.drawn {
        Some(d) => d.first_rank(),
        None => {
            shared = cache.get(graph, a.draw.seed, a.draw.scale)?;
            shared.first().map_or(&[], Vec::as_slice)
        }
    };
    let m = session.measure(
        &prep.emitted,
        &prep.cubin,
        graph,
        inputs,
        prep.drawn.as_ref(),
        &timing_options(a),
    )?;
    Ok(Measured {
        run: m,
        work: cost::work(graph),
        steps: prep.emitted.launch.steps.len(),
        compile: prep.describe(),
        cached: prep.cubin.cached,
    })
}

/// Runs `mucc bench`.
pub fn run(a: BenchArgs) -> Result<(), Failure> {
    let file = load(&a.input)?;
    print_warnings(&file);
    let indices = a.select.indices(&file, false)?;
    let gpus = super::mesh_size(&file, &indices)?;
    super::gpu::check_source(&a.gpu, &indices, gpus)?;
    if gpus > 1 {
        return bench_ranks(&a, &file, &indices, gpus);
    }
    // The files written at the end are checked now, before any GPU work.
    let outputs: Vec<std::path::PathBuf> = a.json_out.iter().chain(&a.svg).cloned().collect();
    super::out::check(&outputs, &[a.input.file.as_path()], a.force)?;
    let mut session = super::gpu::open(&a.gpu)?;
    let name = a.input.file.display().to_string();
    let (prepared, bar, prepare_seconds) = super::gpu::prepare_with_bar(
        &session,
        &file,
        &name,
        &indices,
        a.draw.choice(a.check, &a.budget),
    );
    // The ceilings, once: bandwidth, and the matrix rate of every operand type the graphs use.
    let mut dtypes: Vec<DType> = indices
        .iter()
        .flat_map(|&i| cost::work(&file.graphs[i].graph).matmul_flops)
        .map(|(d, _)| d)
        .collect();
    dtypes.sort();
    dtypes.dedup();
    bar.set_message("measuring the GPU's ceilings");
    let ceilings = session
        .gpu
        .measure_ceilings(&dtypes)
        .map_err(|e| Failure::User(format!("measuring the GPU's ceilings: {e}")))?;
    let mut rows = Vec::new();
    let mut cache = InputCache::default();
    for (&i, prep) in indices.iter().zip(prepared) {
        bar.set_message(format!("graph {i}"));
        let result = prep
            .map_err(|e| e.to_string())
            .and_then(|p| measure(&mut session, &p, &a, &file.graphs[i].graph, &mut cache));
        rows.push(Row { graph: i, result });
        bar.inc(1);
    }
    bar.finish_and_clear();
    let fastest = fastest(
        rows.iter()
            .filter_map(|r| r.result.as_ref().ok().map(|m| (r.graph, &m.run))),
    );
    let failed = rows
        .iter()
        .filter(|r| !r.result.as_ref().is_ok_and(|m| m.run.passed()))
        .count();
    let mut out = stdout();
    let doc = json_report(&a, &session, &ceilings, &rows, fastest, prepare_seconds);
    let text = serde_json::to_string_pretty(&doc).expect("JSON values serialise");
    if let Some(p) = &a.json_out {
        super::out::write(p, format!("{text}\n"), a.force)?;
    }
    if let Some(p) = &a.svg {
        let svg = svg_chart(&a, &session, &ceilings, &rows, fastest)
            .map_err(|e| Failure::User(format!("{}: {e}", super::shown(p))))?;
        super::out::write(p, svg, a.force)?;
    }
    if a.json {
        writeln!(out, "{text}")?;
    } else {
        table(
            &mut out,
            &a,
            &session,
            &ceilings,
            &rows,
            fastest,
            prepare_seconds,
        )?;
    }
    if let (Some(p), false) = (&a.svg, a.json) {
        writeln!(out, "chart: {}", super::shown(p))?;
    }
    if failed > 0 {
        return Err(Failure::Quiet);
    }
    Ok(())
}

/// Why a graph that ran may not be the fastest (empty when it may).
fn problems(m: &Measured) -> Vec<String> {
    let mut v = Vec::new();
    if let Some(c) = &m.run.check
        && !c.iter().all(Comparison::passed)
    {
        let worst = c.iter().map(|c| c.rel_l2).fold(0.0, f64::max);
        v.push(format!("CHECK FAILED (rel err {worst:.1e})"));
    }
    if !m.run.finite {
        v.push("NON-FINITE OUTPUT".into());
    }
    v
}

/// The `--svg` chart of the rows.
fn svg_chart(
    a: &BenchArgs,
    session: &Session,
    ceilings: &Ceilings,
    rows: &[Row],
    fastest: Option<usize>,
) -> Result<String, String> {
    let points: Vec<chart::Point> = rows
        .iter()
        .map(|r| chart::Point {
            graph: r.graph,
            outcome: match &r.result {
                Ok(m) => {
                    let (f, _) = floor(ceilings, &m.work);
                    let ratio = m.run.timing.median_us / f;
                    let problems = problems(m);
                    chart::Outcome::Timed {
                        us: m.run.timing.median_us,
                        ratio: (ratio.is_finite() && ratio > 0.0).then_some(ratio),
                        problem: (!problems.is_empty()).then(|| problems.join(", ")),
                    }
                }
                Err(e) => chart::Outcome::Failed(format!("FAILED: {e}")),
            },
        })
        .collect();
    let mut notes = vec![format!(
        "mucc bench: {}, median of {} samples, inputs seed {} scale {}{}",
        launch_name(a.launch),
        a.iters.max(1),
        a.draw.seed,
        mucc::graph::interp::format_scale(a.draw.scale),
        if a.check { ", checked" } else { "" }
    )];
    let ceilings_note = format!("ceilings (measured): {}", describe_ceilings(ceilings));
    notes.push(match rows.iter().find_map(|r| r.result.as_ref().ok()) {
        Some(m) => {
            let (f, bound) = floor(ceilings, &m.work);
            format!("floor {f:.2} µs ({bound}); {ceilings_note}")
        }
        None => ceilings_note,
    });
    let file = a.input.file.display().to_string();
    let gpu = format!("{} ({})", session.gpu.name, session.gpu.arch);
    chart::render(&chart::Chart {
        file: &file,
        gpu: &gpu,
        notes: &notes,
        points: &points,
        fastest,
    })
}

fn launch_name(l: LaunchArg) -> &'static str {
    match l {
        LaunchArg::Graph => "CUDA-graph replay",
        LaunchArg::Stream => "stream launches",
    }
}

fn describe_ceilings(c: &Ceilings) -> String {
    let mut s = format!("copy {:.2} TB/s", c.copy_bytes_per_s / 1e12);
    for (dt, r) in &c.matmul_flops_per_s {
        s.push_str(&format!("; {} matmul {:.1} TFLOP/s", dt.name(), r / 1e12));
    }
    s
}

fn table(
    out: &mut impl Write,
    a: &BenchArgs,
    session: &Session,
    ceilings: &Ceilings,
    rows: &[Row],
    fastest: Option<usize>,
    prepare_seconds: f64,
) -> Result<(), Failure> {
    writeln!(
        out,
        "GPU: {}; {}, median of {} samples, inputs seed {} scale {}",
        session.describe(),
        launch_name(a.launch),
        a.iters.max(1),
        a.draw.seed,
        mucc::graph::interp::format_scale(a.draw.scale)
    )?;
    writeln!(out, "ceilings (measured): {}", describe_ceilings(ceilings))?;
    writeln!(
        out,
        "{}: {} graph{} transpiled and compiled{} in {prepare_seconds:.1} s",
        super::shown(&a.input.file),
        rows.len(),
        if rows.len() == 1 { "" } else { "s" },
        if a.check { ", references computed" } else { "" }
    )?;
    if let Some(m) = rows.iter().find_map(|r| r.result.as_ref().ok()) {
        let (f, bound) = floor(ceilings, &m.work);
        writeln!(
            out,
            "work: {:.3} MB read, {:.3} MB written, {:.3} GFLOP in matrix products; floor {f:.2} µs ({bound})",
            m.work.input_bytes as f64 / 1e6,
            m.work.output_bytes as f64 / 1e6,
            m.work.flops() / 1e9
        )?;
    }
    writeln!(
        out,
        "  graph      µs   ×floor     GB/s  TFLOP/s  sets  steps  notes"
    )?;
    for r in rows {
        let mark = if Some(r.graph) == fastest { "*" } else { " " };
        match &r.result {
            Ok(m) => {
                let (f, _) = floor(ceilings, &m.work);
                let t = m.run.timing.median_us;
                let mut notes = vec![if m.cached {
                    "cached".to_string()
                } else {
                    "compiled".to_string()
                }];
                if let Some(c) = &m.run.check {
                    let worst = c.iter().map(|c| c.rel_l2).fold(0.0, f64::max);
                    notes.push(if c.iter().all(Comparison::passed) {
                        format!("check ok (rel err {worst:.1e})")
                    } else {
                        format!("CHECK FAILED (rel err {worst:.1e})")
                    });
                }
                if !m.run.finite {
                    notes.push("NON-FINITE OUTPUT".into());
                }
                writeln!(
                    out,
                    "{mark} {:>5} {:>7.2} {:>8.2} {:>8.0} {:>8.2} {:>5} {:>6}  {}",
                    r.graph,
                    t,
                    t / f,
                    m.work.bytes() as f64 / (t * 1e-6) / 1e9,
                    m.work.flops() / (t * 1e-6) / 1e12,
                    m.run.timing.sets,
                    m.steps,
                    notes.join(", ")
                )?;
                for (name, us) in &m.run.steps {
                    writeln!(out, "  {:>13.2}  alone: {name}", us)?;
                }
            }
            Err(e) => {
                let first = e.lines().next().unwrap_or("");
                writeln!(out, "{mark} {:>5}  FAILED: {first}", r.graph)?;
                for l in e.lines().skip(1) {
                    writeln!(out, "          {l}")?;
                }
            }
        }
    }
    match fastest.and_then(|g| {
        rows.iter()
            .find(|r| r.graph == g)
            .and_then(|r| r.result.as_ref().ok())
            .map(|m| (g, m))
    }) {
        Some((g, m)) => {
            let (f, _) = floor(ceilings, &m.work);
            writeln!(
                out,
                "fastest: graph {g}, {:.2} µs, {:.2}× the floor (compile: {})",
                m.run.timing.median_us,
                m.run.timing.median_us / f,
                m.compile
            )?;
        }
        None => writeln!(out, "fastest: none (no graph ran cleanly)")?,
    }
    Ok(())
}

fn json_report(
    a: &BenchArgs,
    session: &Session,
    ceilings: &Ceilings,
    rows: &[Row],
    fastest: Option<usize>,
    prepare_seconds: f64,
) -> Value {
    let (major, minor) = session.compiler.nvrtc_version();
    let rates: serde_json::Map<String, Value> = ceilings
        .matmul_flops_per_s
        .iter()
        .map(|(d, r)| (d.name().to_string(), json!(r)))
        .collect();
    let graphs: Vec<Value> = rows
        .iter()
        .map(|r| match &r.result {
            Ok(m) => {
                let (f, bound) = floor(ceilings, &m.work);
                let t = m.run.timing.median_us;
                json!({
                    "graph": r.graph,
                    "ok": m.run.passed(),
                    "median_us": t,
                    "min_us": m.run.timing.min_us,
                    "max_us": m.run.timing.max_us,
                    "samples": m.run.timing.samples,
                    "executions_per_sample": m.run.timing.executions_per_sample,
                    "sets": m.run.timing.sets,
                    "steps": m.steps,
                    "input_bytes": m.work.input_bytes,
                    "output_bytes": m.work.output_bytes,
                    "flops": m.work.flops(),
                    "floor_us": f,
                    "floor_bound": bound,
                    "ratio_to_floor": t / f,
                    "achieved_gbps": m.work.bytes() as f64 / (t * 1e-6) / 1e9,
                    "achieved_tflops": m.work.flops() / (t * 1e-6) / 1e12,
                    "outputs_finite": m.run.finite,
                    "cache_hit": m.cached,
                    "check": m.run.check.as_ref().map(|c| c.iter().map(|c| json!({
                        "rel_l2": c.rel_l2,
                        "max_abs": c.max_abs,
                        "non_finite": c.non_finite,
                        "bound": c.bound,
                        "passed": c.passed(),
                    })).collect::<Vec<_>>()),
                    "step_us": (!m.run.steps.is_empty()).then(|| m.run.steps.iter().map(|(name, us)| json!({
                        "step": name,
                        "median_us": us,
                    })).collect::<Vec<_>>()),
                    "fastest": Some(r.graph) == fastest,
                })
            }
            Err(e) => json!({"graph": r.graph, "ok": false, "error": e, "fastest": false}),
        })
        .collect();
    json!({
        "file": a.input.file.display().to_string(),
        "gpu": {"name": session.gpu.name, "arch": session.gpu.arch.name(), "l2_bytes": session.gpu.l2_bytes},
        "nvrtc": format!("{major}.{minor}"),
        "ceilings": {"copy_bytes_per_s": ceilings.copy_bytes_per_s, "matmul_flops_per_s": rates},
        "options": {
            "launch": match a.launch { LaunchArg::Graph => "graph", LaunchArg::Stream => "stream" },
            "iters": a.iters.max(1),
            "warmup": a.warmup,
            "seed": a.draw.seed,
            "scale": a.draw.scale,
            "check": a.check,
        },
        "prepare_seconds": prepare_seconds,
        "graphs": graphs,
        "fastest": fastest,
    })
}

/// `mucc bench` of graphs on `n` GPUs: every rank on its own GPU (each rank's executions, NCCL
/// calls included, captured into a CUDA graph and replayed, or `--launch stream`), the time of
/// one execution as the slowest rank sees it, the all-reduce steps alone, and their bandwidth;
/// with `--check`, every rank checked first as `mucc run --check` does.
fn bench_ranks(
    a: &BenchArgs,
    file: &mucc::MirageFile,
    indices: &[usize],
    n: usize,
) -> Result<(), Failure> {
    use mucc::cuda::{RunError, multi};
    use mucc::graph::interp::HostTensor;
    if a.json || a.json_out.is_some() || a.svg.is_some() {
        return Err(Failure::User(
            "--json, --json-out and --svg describe one-GPU runs; a graph on several GPUs prints \
             its table only"
                .into(),
        ));
    }
    let (mut session, gpus_line) = super::gpu::open_mesh(&a.gpu, n)?;
    let name = a.input.file.display().to_string();
    let mut out = stdout();
    writeln!(
        out,
        "{gpus_line}; {}, median of {} after {} warm-up (an execution's time is its slowest \
         rank's)",
        launch_name(a.launch),
        a.iters,
        a.warmup
    )?;
    writeln!(
        out,
        "{:>5}  {:>10}  {:>24}  {:>12}  {:>10}  {:>10}  check",
        "graph", "us", "per rank us", "all-red. us", "algbw GB/s", "busbw GB/s"
    )?;
    let (prepared, bar, _) = super::gpu::prepare_with_bar(
        &session,
        file,
        &name,
        indices,
        a.draw.choice(a.check, &a.budget),
    );
    bar.finish_and_clear();
    let mut failed = 0usize;
    let mut cache = InputCache::default();
    for (&i, prep) in indices.iter().zip(prepared) {
        let g = &file.graphs[i].graph;
        let result = (|| -> Result<(multi::RankTiming, String), (String, bool)> {
            let plain = |e: String| (e, false);
            let run = |e: RunError| {
                super::gpu::exit_if_stuck(&e);
                (e.to_string(), e.is_fatal())
            };
            let prep = prep.map_err(|e| plain(e.to_string()))?;
            let launch = &prep.emitted.launch;
            let placement = a.gpu.all_reduce_buffers.placement();
            let cached_inputs;
            let (inputs, verdict): (Vec<&[HostTensor]>, String) = match &prep.drawn {
                Some(d) => {
                    let inputs: Vec<&[HostTensor]> =
                        d.inputs.iter().map(|r| r.as_slice()).collect();
                    let outs = session
                        .run(&prep.cubin.bytes, launch, &inputs, placement)
                        .map_err(run)?;
                    let cmp = check_outputs(g, d, &outs).map_err(plain)?;
                    let worst = cmp
                        .iter()
                        .flatten()
                        .map(|c| c.rel_l2)
                        .fold(0.0f64, f64::max);
                    let ok = cmp.iter().flatten().all(Comparison::passed);
                    let v = format!(
                        "{} (worst rel err {worst:.2e})",
                        if ok { "ok" } else { "FAIL" }
                    );
                    (inputs, v)
                }
                None => {
                    cached_inputs = cache.get(g, a.draw.seed, a.draw.scale).map_err(plain)?;
                    let inputs = cached_inputs.iter().map(Vec::as_slice).collect();
                    (inputs, "unchecked".to_string())
                }
            };
            let t = multi::time_on_ranks(
                &mut session.gpus(),
                &prep.cubin.bytes,
                launch,
                &inputs,
                &timing_options(a),
                placement,
            )
            .map_err(run)?;
            Ok((t, verdict))
        })();
        match result {
            Ok((t, mut verdict)) => {
                if verdict.starts_with("FAIL") {
                    failed += 1;
                }
                if t.non_finite > 0 {
                    verdict.push_str(&format!(
                        "; {} output elements not finite after the timed runs (lower --scale)",
                        t.non_finite
                    ));
                }
                let per: Vec<String> = t.per_rank_us.iter().map(|u| format!("{u:.2}")).collect();
                let (alg, bus) = match t.bandwidths(n) {
                    Some((a, b)) => (format!("{a:.1}"), format!("{b:.1}")),
                    None => ("-".into(), "-".into()),
                };
                writeln!(
                    out,
                    "{i:>5}  {:>10.2}  {:>24}  {:>12}  {alg:>10}  {bus:>10}  {verdict}",
                    t.median_us,
                    per.join(" "),
                    t.all_reduce_us.map_or("-".to_string(), |u| format!(
                        "{u:.2} ({} B)",
                        t.all_reduce_bytes
                    )),
                )?;
                writeln!(out, "{:>5}  all-reduce buffers: {}", "", t.buffers)?;
                for (step, per_rank) in &t.steps {
                    let per: Vec<String> = per_rank.iter().map(|u| format!("{u:.2}")).collect();
                    writeln!(
                        out,
                        "{:>5}  {:>10}  {:>24}  alone: {step}",
                        "",
                        "",
                        per.join(" ")
                    )?;
                }
            }
            Err((msg, fatal)) => {
                failed += 1;
                writeln!(out, "{i:>5}  FAIL: {msg}")?;
                if fatal {
                    writeln!(
                        out,
                        "stopping: the GPUs' contexts or communicators are lost"
                    )?;
                    break;
                }
            }
        }
    }
    if failed > 0 {
        return Err(Failure::Quiet);
    }
    Ok(())
}
