//! Generated-graph differential testing on the CPU: random valid µGraphs
//! (`mucc::graph::random`, covering every threadblock operator, accumulator and dtype) go
//! through the whole pipeline — validation, the f64 interpreter (finite references), a Mirage
//! JSON round trip, planning and emission for sm_80 and sm_90a with the emitted code checked
//! against its plan, and NVRTC compilation. `MUCC_GENERATED_CASES` sets how many graphs (CI:
//! 200; long runs by hand); `MUCC_GENERATED_FIRST` the first seed. The GPU half (`mucc run
//! --check` on the same graphs) is in `scripts/gpu-test.sh` (step `generated`).

mod common;

use std::collections::BTreeSet;

use common::plan_check::check_graph;
use mucc::cuda::{Compiler, CompilerOptions, Source};
use mucc::graph::interp::{self, InputSpec};
use mucc::graph::mirage_json::{ExportOptions, graph_to_json};
use mucc::graph::random::{GenConfig, graph};
use mucc::graph::{KernelGraph, KnOpKind};
use mucc::target::Target;
use mucc::{ImportOptions, parse_str};
use rayon::prelude::*;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The emitted source for each target.
type Sources = Vec<(Target, String)>;

/// Everything but compilation; returns the emitted sources.
fn pipeline(seed: u64, g: &KernelGraph) -> Result<Sources, String> {
    let what = format!("seed {seed}");
    mucc::validate(g, None).map_err(|e| format!("{what}: invalid: {e}"))?;
    interp::estimate(g)
        .check(g, &Default::default())
        .map_err(|e| format!("{what}: {e}"))?;
    let inputs = interp::random_inputs(g, InputSpec { seed, scale: 1.0 });
    let (outs, _) = interp::evaluate_ranged(g, inputs).map_err(|e| format!("{what}: {e}"))?;
    if outs.iter().any(|o| o.data.iter().any(|x| !x.is_finite())) {
        return Err(format!("{what}: a non-finite reference value"));
    }
    let json = graph_to_json(g, &ExportOptions::default())
        .map_err(|e| format!("{what}: export: {e}"))?
        .to_string();
    let back = parse_str(&json, None, &ImportOptions::default())
        .map_err(|e| format!("{what}: re-import: {e}"))?;
    let again = graph_to_json(&back.graphs[0].graph, &ExportOptions::default())
        .map_err(|e| format!("{what}: export: {e}"))?
        .to_string();
    if again != json {
        return Err(format!("{what}: the JSON round trip changed the graph"));
    }
    Target::all()
        .into_iter()
        .map(|t| check_graph(g, t, &what).map(|e| (t, e.source)))
        .collect()
}

#[test]
fn generated_graphs_go_through_the_whole_pipeline() {
    let n = env_usize("MUCC_GENERATED_CASES", 200);
    let first = env_usize("MUCC_GENERATED_FIRST", 0) as u64;
    let cfg = GenConfig::default();
    let seeds: Vec<u64> = (first..first + n as u64).collect();
    let results: Vec<(u64, KernelGraph, Result<Sources, String>)> = seeds
        .par_iter()
        .map(|&s| {
            let g = graph(s, &cfg);
            let r = pipeline(s, &g);
            (s, g, r)
        })
        .collect();
    // Coverage: operator kinds and dtypes seen.
    let mut kinds = BTreeSet::new();
    let mut dtypes = BTreeSet::new();
    for (_, g, _) in &results {
        for (_, op) in g.ops.iter() {
            kinds.insert(op.kind.name());
            if let KnOpKind::Customized(tb) = &op.kind {
                for (_, t) in tb.ops.iter() {
                    kinds.insert(format!("tb {}", t.kind.name()));
                }
            }
        }
        for (_, t) in g.tensors.iter() {
            dtypes.insert(t.dtype);
        }
    }
    let failures: Vec<&String> = results
        .iter()
        .filter_map(|(_, _, r)| r.as_ref().err())
        .collect();
    println!(
        "{n} generated graphs (seeds {first}..{}): {} failed validate/eval/round-trip/transpile/plan check; {} operator kinds, dtypes {dtypes:?}",
        first + n as u64,
        failures.len(),
        kinds.len()
    );
    assert!(
        failures.is_empty(),
        "{}",
        failures
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    // Every threadblock operator and accumulator kind, with a few hundred graphs.
    for k in [
        "tb matmul",
        "tb rms_norm",
        "tb reduction_",
        "tb concat_",
        "tb exp",
        "tb square",
        "tb sqrt",
        "tb silu",
        "tb sigmoid",
        "tb gelu",
        "tb relu",
        "tb log",
        "tb clamp",
        "tb mul_scalar",
        "tb add",
        "tb sub",
        "tb mul",
        "tb div",
        "tb pow",
        "tb accum_nored",
        "tb accum_max",
        "tb accum_red_ld_sum",
        "tb accum_red_ld_mean",
        "tb accum_red_ld_rms",
        "tb accum_redtox_ld_sum",
        "tb accum_nored_rescale",
        "tb accum_red_ld_sum_rescale",
    ] {
        assert!(
            n < 200 || kinds.iter().any(|x| x.starts_with(k)),
            "{k} never generated: {kinds:?}"
        );
    }
    assert!(
        n < 200
            || kinds
                .iter()
                .any(|x| x.starts_with("tb reduction_") && x.ends_with("_max")),
        "no running max generated"
    );
    assert!(
        n < 200 || kinds.iter().any(|x| x.ends_with("_to_dimx")),
        "no to-dimx reduction generated"
    );
    if std::env::var_os("MUCC_SKIP_CUDA").is_some_and(|v| v == "1") {
        return;
    }
    // NVRTC compiles every emitted file.
    let compiler = Compiler::new(CompilerOptions {
        no_cache: true,
        ..Default::default()
    })
    .expect("NVRTC and the CUDA headers (source scripts/cuda-toolchain.sh)");
    let units: Vec<(u64, Target, &String)> = results
        .iter()
        .flat_map(|(s, _, r)| {
            r.as_ref()
                .unwrap()
                .iter()
                .map(move |(t, src)| (*s, *t, src))
        })
        .collect();
    let t0 = std::time::Instant::now();
    let errors: Vec<String> = units
        .par_iter()
        .filter_map(|(s, t, src)| {
            compiler
                .compile(&Source {
                    path: &format!("generated-{s}.{}.cu", t.arch),
                    text: src,
                    arch: t.arch,
                })
                .err()
                .map(|e| format!("seed {s} ({}): {e}", t.arch))
        })
        .collect();
    println!(
        "nvrtc: {} files in {:.1} s, {} failed",
        units.len(),
        t0.elapsed().as_secs_f64(),
        errors.len()
    );
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}
