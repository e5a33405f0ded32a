//! `mucc tune`: per graph, every implementation variant ([`mucc::cuda::tune::variants`]) is
//! transpiled and compiled (in parallel), checked against the interpreter, and the verified ones
//! are timed; the fastest goes into the tuning cache, which `run`, `bench`, `transpile` and
//! `build` then use. A graph already in the cache (same content, GPU and mucc version) is not
//! tuned again unless `--retune`.

use std::io::Write;
use std::time::Instant;

use clap::Args;
use indicatif::ProgressBar;
use mucc::cuda::bench::{Ceilings, Launch, TimingOptions};
use mucc::cuda::session::{Session, inputs_and_reference};
use mucc::cuda::tune::{self, TuneCache, TuneEntry, Variant, VariantResult, best_of, graph_hash};
use mucc::graph::DType;
use mucc::graph::cost;
use mucc::sched::Options;
use mucc::target::Target;
use rayon::prelude::*;
use serde_json::json;

use super::gpu::GpuArgs;
use super::{Failure, GraphSelection, InputArgs, load, print_warnings, stdout};

/// Arguments of `mucc tune`.
#[derive(Args, Debug)]
pub struct TuneArgs {
    #[command(flatten)]
    input: InputArgs,
    #[command(flatten)]
    select: GraphSelection,
    /// Timed samples per variant (CUDA-graph replays; the median is kept).
    #[arg(long, default_value_t = 30)]
    iters: usize,
    /// Untimed samples before the timed ones.
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    #[command(flatten)]
    draw: super::DrawArgs,
    /// Tune again even when the cache has this graph for this GPU and mucc version.
    #[arg(long)]
    retune: bool,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    gpu: GpuArgs,
    #[command(flatten)]
    budget: super::BudgetArgs,
}

/// One graph's outcome.
struct Row {
    graph: usize,
    result: Result<(TuneEntry, bool), String>,
    floor_us: f64,
}

/// Tunes graph `i`: every variant compiled in parallel, then checked and timed one by one.
fn tune_graph(
    session: &mut Session,
    a: &TuneArgs,
    name: &str,
    i: usize,
    g: &mucc::graph::KernelGraph,
    hash: &str,
    bar: &ProgressBar,
) -> Result<TuneEntry, String> {
    let drawn = inputs_and_reference(g, a.draw.seed, a.draw.scale, &a.budget.budget())?;
    let base = Options::for_target(Target::new(session.gpu.arch));
    let variants = tune::variants(session.gpu.arch);
    let compiled: Vec<_> = {
        let s: &Session = session;
        variants
            .par_iter()
            .map(|v| s.compile_with(g, name, Some(i), &v.apply(&base)))
            .collect()
    };
    let timing = TimingOptions {
        samples: a.iters.max(1),
        warmup: a.warmup,
        launch: Launch::Graph,
        ..Default::default()
    };
    let mut results: Vec<VariantResult> = Vec::new();
    // Variants that plan to the same code share one measurement.
    let mut seen: Vec<(String, Variant)> = Vec::new();
    for (v, c) in variants.iter().zip(compiled) {
        bar.inc(1);
        let (us, note) = match c {
            Err(e) => (None, Some(format!("does not compile: {e}"))),
            Ok((emitted, cubin, _, _)) => {
                let key = format!(
                    "{}\n{}",
                    emitted.source,
                    serde_json::to_string(&emitted.launch).unwrap_or_default()
                );
                if let Some((_, same)) = seen.iter().find(|(k, _)| *k == key) {
                    let t = results
                        .iter()
                        .find(|r| r.variant == *same)
                        .and_then(|r| r.us);
                    (t, Some(format!("same code as {same}")))
                } else {
                    seen.push((key, *v));
                    match session.measure(
                        &emitted,
                        &cubin,
                        g,
                        drawn.first_rank(),
                        Some(&drawn),
                        &timing,
                    ) {
                        Err(e) => (None, Some(format!("failed to run: {e}"))),
                        Ok(m) if !m.passed() => (None, Some("failed the check".into())),
                        Ok(m) => (Some(m.timing.median_us), None),
                    }
                }
            }
        };
        results.push(VariantResult {
            variant: *v,
            us,
            note,
        });
    }
    // A variant that shares code with a faster-listed one is not the "best" itself.
    let distinct: Vec<VariantResult> = results
        .iter()
        .filter(|r| {
            !r.note
                .as_deref()
                .is_some_and(|n| n.starts_with("same code"))
        })
        .cloned()
        .collect();
    let best = best_of(&distinct).ok_or("no variant passed the check")?;
    Ok(TuneEntry {
        mucc_version: tune::PLANNER.into(),
        gpu: session.gpu.name.clone(),
        arch: session.gpu.arch,
        graph_hash: hash.to_string(),
        best,
        results,
        source: format!("{name}, graph {i}"),
    })
}

/// Runs `mucc tune`.
pub fn run(a: TuneArgs) -> Result<(), Failure> {
    let p = &a.gpu.path;
    if !p.tunable() {
        return Err(Failure::User(
            "mucc tune tries the variants of the default plan itself: --path, --warps, \
             --dependent-launch, --no-tune and the options that change the plan (--no-*, \
             --cluster-combine, --last-block-combine, --online-softmax, --max-stages, \
             --resident-blocks, --refine-loops, --coarsen-loops) do not apply to it"
                .into(),
        ));
    }
    if a.gpu.source.is_some() {
        return Err(Failure::User(
            "mucc tune compiles the variants it plans; --source (one edited kernel source) does not apply to it"
                .into(),
        ));
    }
    let file = load(&a.input)?;
    print_warnings(&file);
    let indices = a.select.indices(&file, false)?;
    super::one_gpu_only(&file, &indices, "mucc tune")?;
    let mut session = super::gpu::open(&a.gpu)?;
    let cache = TuneCache::default_location();
    let name = a.input.file.display().to_string();
    let t0 = Instant::now();
    let mut dtypes: Vec<DType> = indices
        .iter()
        .flat_map(|&i| cost::work(&file.graphs[i].graph).matmul_flops)
        .map(|(d, _)| d)
        .collect();
    dtypes.sort();
    dtypes.dedup();
    let ceilings: Ceilings = session
        .gpu
        .measure_ceilings(&dtypes)
        .map_err(|e| Failure::User(format!("measuring the GPU's ceilings: {e}")))?;
    let per_graph = tune::variants(session.gpu.arch).len() as u64;
    let bar = super::progress::bar(indices.len() as u64 * per_graph, "variants", "");
    let mut rows = Vec::new();
    for &i in &indices {
        let lg = &file.graphs[i];
        bar.set_message(format!("graph {i}"));
        let floor_us = ceilings.floor(&cost::work(&lg.graph)).0 * 1e6;
        let result = lg
            .validate()
            .map_err(|e| format!("invalid:\n{e}"))
            .and_then(|_| graph_hash(&lg.graph))
            .and_then(
                |hash| match bar.suspend(|| cache.lookup(&hash, &session.gpu.name)) {
                    Some(e) if !a.retune => {
                        bar.inc(per_graph);
                        Ok((e, true))
                    }
                    _ => {
                        let e = tune_graph(&mut session, &a, &name, i, &lg.graph, &hash, &bar)?;
                        cache.store(&e)?;
                        Ok((e, false))
                    }
                },
            );
        rows.push(Row {
            graph: i,
            result,
            floor_us,
        });
    }
    bar.finish_and_clear();
    let seconds = t0.elapsed().as_secs_f64();
    let mut out = stdout();
    if a.json {
        let doc = json!({
            "gpu": session.gpu.name,
            "arch": session.gpu.arch.to_string(),
            "file": name,
            "seconds": seconds,
            "graphs": rows.iter().map(|r| match &r.result {
                Ok((e, cached)) => json!({
                    "graph": r.graph,
                    "from_cache": cached,
                    "best": e.best,
                    "best_us": e.time_of(e.best),
                    "default_us": e.time_of(Variant::DEFAULT),
                    "floor_us": r.floor_us,
                    "speedup": e.speedup(),
                    "results": e.results,
                }),
                Err(err) => json!({"graph": r.graph, "error": err}),
            }).collect::<Vec<_>>(),
        });
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&doc).expect("JSON values serialise")
        )?;
    } else {
        writeln!(
            out,
            "GPU: {}; {} variants per graph, median of {} CUDA-graph replays, checked first",
            session.describe(),
            per_graph,
            a.iters.max(1)
        )?;
        writeln!(
            out,
            "{}: {} graph{} in {seconds:.1} s; cache {}",
            super::shown(&a.input.file),
            rows.len(),
            if rows.len() == 1 { "" } else { "s" },
            super::shown(&cache.path("<graph>", &session.gpu.name))
        )?;
        writeln!(
            out,
            "  graph  default µs  best µs  ×floor  speed-up  best variant"
        )?;
        for r in &rows {
            match &r.result {
                Ok((e, cached)) => {
                    let fmt = |t: Option<f64>| t.map_or("-".to_string(), |t| format!("{t:.2}"));
                    let best = e.time_of(e.best);
                    writeln!(
                        out,
                        "  {:>5}  {:>10}  {:>7}  {:>6}  {:>8}  {}{}",
                        r.graph,
                        fmt(e.time_of(Variant::DEFAULT)),
                        fmt(best),
                        best.map_or("-".into(), |b| format!("{:.2}", b / r.floor_us)),
                        e.speedup().map_or("-".into(), |s| format!("{s:.2}×")),
                        e.best,
                        if *cached { " (from the cache)" } else { "" }
                    )?;
                    for v in &e.results {
                        if let Some(n) = &v.note {
                            writeln!(
                                out,
                                "         {}: {}",
                                v.variant,
                                mucc::graph::error::escape(n)
                            )?;
                        }
                    }
                }
                Err(err) => writeln!(out, "  {:>5}  FAILED: {err}", r.graph)?,
            }
        }
    }
    if rows.iter().any(|r| r.result.is_err()) {
        return Err(Failure::Quiet);
    }
    Ok(())
}
