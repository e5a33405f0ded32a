//! `mucc run`: transpile, compile (NVRTC, cached), execute on the GPU, and with `--check`
//! compare every output with the CPU interpreter.

use std::io::Write;

use clap::Args;
use mucc::cuda::RunError;
use mucc::cuda::data::Comparison;
use mucc::graph::interp::HostTensor;

use super::gpu::{Drawn, GpuArgs, InputCache, check_outputs};
use super::{Failure, GraphSelection, InputArgs, load, print_warnings, stdout};

/// Arguments of `mucc run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    input: InputArgs,
    #[command(flatten)]
    select: GraphSelection,
    /// Compare every output with the CPU interpreter (f64) and fail on any output beyond its
    /// dtype's bound (f16 5e-3, bf16 3e-2, f32 1e-5, f64 1e-12 relative L2; integers exact) or
    /// with a non-finite or unwritten element.
    #[arg(long)]
    check: bool,
    #[command(flatten)]
    draw: super::DrawArgs,
    #[command(flatten)]
    gpu: GpuArgs,
    #[command(flatten)]
    budget: super::BudgetArgs,
    /// Test hook: moves the first kernel argument of every plan 2⁴⁰ bytes out of its buffer,
    /// so that the kernel faults (to check how a fault is reported).
    #[arg(long, hide = true)]
    inject_fault: bool,
}

/// Moves the first kernel argument of `plan` far out of its buffer.
fn inject_fault(plan: &mut mucc::emit::launch::LaunchPlan) {
    use mucc::emit::launch::{Binding, Step};
    if let Some(Step::Kernel(k)) = plan.steps.iter_mut().find(|s| matches!(s, Step::Kernel(_))) {
        let far = 1usize << 40;
        if let Some(b) = k.args.first_mut() {
            *b = match *b {
                Binding::Workspace {
                    byte_offset,
                    elem_offset,
                    elem_bytes,
                } => Binding::Workspace {
                    byte_offset: byte_offset + far,
                    elem_offset,
                    elem_bytes,
                },
                other => other.offset_by(far),
            };
        }
    }
}

/// What one graph's run reports: per (rank, output index, comparison, description), and a
/// line of timings and notes.
type GraphReport = (Vec<(usize, usize, Comparison, String)>, String);

/// "ok" or "FAIL (bound …)", saying when and why the bound was widened.
fn verdict(c: &Comparison) -> String {
    let widened = c.sensitivity.map(|s| {
        format!(
            "storage rounding alone moves this output by {s:.2e}, bound widened to {:.2e} \
             (see `mucc eval --rounding stored`)",
            c.bound
        )
    });
    match (c.passed(), widened) {
        (true, None) => "ok".to_string(),
        (true, Some(w)) => format!("ok ({w})"),
        (false, None) => format!("FAIL (bound {:e})", c.bound),
        (false, Some(w)) => format!("FAIL (bound {:e}; {w})", c.bound),
    }
}

/// Runs `mucc run`: on one GPU, or on every GPU of the graphs' mesh (one rank per device,
/// `--device` first: the module compiled once and loaded on each, every rank's outputs checked
/// against the interpreter's per-rank reference, global inputs drawn once and sharded by the
/// input maps). One GPU is a mesh of one: the same steps, one rank.
pub fn run(a: RunArgs) -> Result<(), Failure> {
    let file = load(&a.input)?;
    print_warnings(&file);
    let indices = a.select.indices(&file, false)?;
    let gpus = super::mesh_size(&file, &indices)?;
    super::gpu::check_source(&a.gpu, &indices, gpus)?;
    if a.inject_fault && gpus > 1 {
        return Err(Failure::User(
            "--inject-fault runs graphs on one GPU".into(),
        ));
    }
    let (mut session, gpus_line) = super::gpu::open_mesh(&a.gpu, gpus)?;
    let name = a.input.file.display().to_string();
    let mut out = stdout();
    let inputs_line = format!(
        "inputs seed {} scale {}",
        a.draw.seed,
        mucc::graph::interp::format_scale(a.draw.scale)
    );
    if gpus > 1 {
        writeln!(
            out,
            "{gpus_line}; global {inputs_line}, sharded by the input maps"
        )?;
    } else {
        writeln!(out, "{gpus_line}, {inputs_line}")?;
    }
    // Lines are printed through `bar.suspend` while the bar exists (see `super::progress`).
    let (prepared, bar, seconds) = super::gpu::prepare_with_bar(
        &session,
        &file,
        &name,
        &indices,
        a.draw.choice(a.check, &a.budget),
    );
    if indices.len() > 1 {
        bar.suspend(|| {
            writeln!(
                out,
                "{} graphs transpiled and compiled{} in {seconds:.1} s (in parallel)",
                indices.len(),
                if a.check { ", references computed" } else { "" },
            )
        })?;
    }
    let (mut passed, mut failed, mut compiled, mut cached) = (0usize, 0usize, 0usize, 0usize);
    let mut cache = InputCache::default();
    for (&i, prep) in indices.iter().zip(prepared) {
        bar.set_message(format!("graph {i}"));
        let g = &file.graphs[i].graph;
        let result = (|| -> Result<GraphReport, (String, bool)> {
            let plain = |e: String| (e, false);
            let run = |e: RunError| {
                super::gpu::exit_if_stuck(&e);
                (e.to_string(), e.is_fatal())
            };
            let prep = prep.map_err(|e| plain(e.to_string()))?;
            if prep.cubin.cached {
                cached += 1;
            } else {
                compiled += 1;
            }
            let mut info = prep.describe();
            let mut launch = prep.emitted.launch.clone();
            if a.inject_fault {
                inject_fault(&mut launch);
            }
            let drawn = prep.drawn.as_ref();
            if let Some(Drawn {
                scale,
                note: Some(n),
                ..
            }) = drawn
            {
                info.push_str(&format!(
                    "; input scale lowered to {} ({n})",
                    mucc::graph::interp::format_scale(*scale)
                ));
            }
            let cached_inputs;
            let inputs: Vec<&[HostTensor]> = match drawn {
                Some(d) => d.inputs.iter().map(|r| r.as_slice()).collect(),
                None => {
                    cached_inputs = cache.get(g, a.draw.seed, a.draw.scale).map_err(plain)?;
                    cached_inputs.iter().map(Vec::as_slice).collect()
                }
            };
            let outputs = session
                .run(
                    &prep.cubin.bytes,
                    &launch,
                    &inputs,
                    a.gpu.all_reduce_buffers.placement(),
                )
                .map_err(run)?;
            let mut rows = Vec::new();
            let outs = &prep.emitted.launch.outputs;
            let desc = |j: usize| format!("{} {:?}", outs[j].dtype, outs[j].shape);
            match drawn {
                Some(d) => {
                    let cmp = check_outputs(g, d, &outputs).map_err(plain)?;
                    for (r, row) in cmp.into_iter().enumerate() {
                        for (j, c) in row.into_iter().enumerate() {
                            rows.push((r, j, c, desc(j)));
                        }
                    }
                }
                None => {
                    for (r, outs) in outputs.iter().enumerate() {
                        for (j, (_, got)) in outs.iter().enumerate() {
                            let finite = got.data.iter().filter(|x| x.is_finite()).count();
                            let sum: f64 = got.data.iter().filter(|x| x.is_finite()).sum();
                            info.push_str(&format!(
                                "; {}out{j} {}: {finite}/{} finite, sum {sum:.6e}",
                                rank_prefix(gpus, r),
                                desc(j),
                                got.data.len()
                            ));
                        }
                    }
                }
            }
            Ok((rows, info))
        })();
        let mut lines = Vec::new();
        let mut stop = false;
        match result {
            Ok((rows, info)) => {
                lines.push(format!("graph {i}: {info}"));
                for (r, j, c, desc) in &rows {
                    lines.push(format!(
                        "graph {i}: {}out{j} {desc}: rel err {:.2e}, max abs {:.2e}, {} non-finite/unwritten: {}",
                        rank_prefix(gpus, *r),
                        c.rel_l2,
                        c.max_abs,
                        c.non_finite,
                        verdict(c)
                    ));
                }
                if rows.iter().all(|(_, _, c, _)| c.passed()) {
                    passed += 1;
                } else {
                    failed += 1;
                }
            }
            Err((msg, fatal)) => {
                lines.push(format!("graph {i}: FAIL: {msg}"));
                failed += 1;
                if fatal {
                    let left =
                        indices.len() - 1 - indices.iter().position(|&x| x == i).unwrap_or(0);
                    let lost = if gpus > 1 {
                        " (the GPUs' contexts are lost)"
                    } else {
                        ""
                    };
                    lines.push(format!("stopping: {left} graph(s) not run{lost}"));
                    stop = true;
                }
            }
        }
        bar.suspend(|| lines.iter().try_for_each(|l| writeln!(out, "{l}")))?;
        bar.inc(1);
        if stop {
            break;
        }
    }
    bar.finish_and_clear();
    let on = if gpus > 1 {
        format!(" on {gpus} GPUs")
    } else {
        String::new()
    };
    writeln!(
        out,
        "{compiled} compiled, {cached} from the NVRTC cache; {passed} passed, {failed} failed{on}"
    )?;
    if failed > 0 {
        return Err(Failure::Quiet);
    }
    Ok(())
}

/// "rank R " before an output's name on several GPUs; nothing on one.
fn rank_prefix(gpus: usize, r: usize) -> String {
    if gpus > 1 {
        format!("rank {r} ")
    } else {
        String::new()
    }
}
