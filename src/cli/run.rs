//! `mucc run`: transpile, compile (NVRTC, cached), execute on the GPU, and with `--check`
//! compare every output with the CPU interpreter.

use std::io::Write;

use clap::Args;
use mucc::MirageFile;
use mucc::cuda::data::Comparison;
use mucc::cuda::{Gpu, RunError, multi};
use mucc::graph::interp::{self, InputSpec};

use super::gpu::{
    Drawn, GpuArgs, InputCache, InputChoice, check_outputs, read_outputs, upload_inputs,
};
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
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Half-width of the input distribution (uniform in [−scale, scale)). With `--check`,
    /// halved per graph while a tensor the GPU stores would leave its dtype's finite range on
    /// these inputs.
    #[arg(long, default_value_t = 1.0, value_parser = super::parse_scale)]
    scale: f64,
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

/// What one graph's run reports: per output (index, comparison, description), and a line of
/// timings and notes.
type GraphReport = (Vec<(usize, Comparison, String)>, String);

/// The same on several GPUs: per (rank, output index, comparison, description).
type RanksReport = (Vec<(usize, usize, Comparison, String)>, String);

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

/// Runs `mucc run`.
pub fn run(a: RunArgs) -> Result<(), Failure> {
    let file = load(&a.input)?;
    print_warnings(&file);
    let indices = a.select.indices(&file, false)?;
    let gpus = super::mesh_size(&file, &indices)?;
    super::gpu::check_source(&a.gpu, &indices, gpus)?;
    if gpus > 1 {
        return run_ranks(&a, &file, &indices, gpus);
    }
    let mut session = super::gpu::open(&a.gpu)?;
    let name = a.input.file.display().to_string();
    let mut out = stdout();
    writeln!(
        out,
        "GPU: {}, inputs seed {} scale {}",
        session.describe(),
        a.seed,
        mucc::graph::interp::format_scale(a.scale)
    )?;
    // Lines are printed through `bar.suspend` while the bar exists (see `super::progress`).
    let (prepared, bar, seconds) = super::gpu::prepare_with_bar(
        &session,
        &file,
        &name,
        &indices,
        InputChoice {
            seed: a.seed,
            scale: a.scale,
            check: a.check,
            budget: a.budget.budget(),
        },
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
        let gpu = &mut session.gpu;
        let result = (|| -> Result<GraphReport, (String, bool)> {
            let plain = |e: String| (e, false);
            let run = |e: RunError| {
                super::gpu::exit_if_stuck(&e);
                (e.to_string(), e.is_fatal())
            };
            let prep = prep.map_err(|e| plain(e.to_string()))?;
            let (emitted, cubin) = (&prep.emitted, &prep.cubin);
            if cubin.cached {
                cached += 1;
            } else {
                compiled += 1;
            }
            let mut info = prep.describe();
            let mut launch = emitted.launch.clone();
            if a.inject_fault {
                inject_fault(&mut launch);
            }
            let prog = gpu.load(&cubin.bytes, &launch).map_err(run)?;
            let mut bufs = gpu.alloc(&prog).map_err(run)?;
            let shared;
            let (inputs, drawn): (&[_], _) = match &prep.drawn {
                Some(
                    d @ Drawn {
                        inputs,
                        scale,
                        note,
                        ..
                    },
                ) => {
                    if let Some(n) = note {
                        info.push_str(&format!(
                            "; input scale lowered to {} ({n})",
                            mucc::graph::interp::format_scale(*scale)
                        ));
                    }
                    (inputs, Some(d))
                }
                None => {
                    shared = cache.get(&file.graphs[i].graph, a.seed, a.scale);
                    (&shared, None)
                }
            };
            upload_inputs(gpu, &mut bufs, &emitted.launch, inputs).map_err(plain)?;
            gpu.poison_outputs(&mut bufs, 0xff).map_err(run)?;
            gpu.execute_checked(&prog, &bufs).map_err(run)?;
            let mut rows = Vec::new();
            let outputs = read_outputs(gpu, &bufs, &emitted.launch).map_err(plain)?;
            let checked = match drawn {
                Some(d) => Some(check_outputs(&file.graphs[i].graph, d, &outputs).map_err(plain)?),
                None => None,
            };
            for (j, ((_, got), d)) in outputs.iter().zip(&emitted.launch.outputs).enumerate() {
                let desc = format!("{} {:?}", d.dtype, d.shape);
                match &checked {
                    Some(c) => rows.push((j, c[j].clone(), desc)),
                    None => {
                        let finite = got.data.iter().filter(|x| x.is_finite()).count();
                        let sum: f64 = got.data.iter().filter(|x| x.is_finite()).sum();
                        info.push_str(&format!(
                            "; out{j} {desc}: {finite}/{} finite, sum {sum:.6e}",
                            got.data.len()
                        ));
                    }
                }
            }
            Ok((rows, info))
        })();
        let mut lines = Vec::new();
        let mut stop = false;
        match result {
            Ok((rows, info)) => {
                let ok = rows.iter().all(|(_, c, _)| c.passed());
                lines.push(format!("graph {i}: {info}"));
                for (j, c, desc) in &rows {
                    lines.push(format!(
                        "graph {i}: out{j} {desc}: rel err {:.2e}, max abs {:.2e}, {} non-finite/unwritten: {}",
                        c.rel_l2,
                        c.max_abs,
                        c.non_finite,
                        verdict(c)
                    ));
                }
                if ok {
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
                    lines.push(format!("stopping: {left} graph(s) not run"));
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
    writeln!(
        out,
        "{compiled} compiled, {cached} from the NVRTC cache; {passed} passed, {failed} failed"
    )?;
    if failed > 0 {
        return Err(Failure::Quiet);
    }
    Ok(())
}

/// `mucc run` of graphs on `n` GPUs: one rank per device (`--device` first), the module
/// compiled once and loaded on each, every rank's outputs checked against the interpreter's
/// per-rank reference (global inputs drawn once and sharded by the input maps).
fn run_ranks(a: &RunArgs, file: &MirageFile, indices: &[usize], n: usize) -> Result<(), Failure> {
    if a.inject_fault {
        return Err(Failure::User(
            "--inject-fault runs graphs on one GPU".into(),
        ));
    }
    let (mut session, mut others, gpus_line) = super::gpu::open_ranks(&a.gpu, n)?;
    let name = a.input.file.display().to_string();
    let mut out = stdout();
    writeln!(
        out,
        "{gpus_line}; global inputs seed {} scale {}, sharded by the input maps",
        a.seed,
        mucc::graph::interp::format_scale(a.scale)
    )?;
    let budget = a.budget.budget();
    let prepared = super::gpu::prepare_ranks(&session, file, &name, indices, &budget);
    let (mut passed, mut failed) = (0usize, 0usize);
    for (&i, prep) in indices.iter().zip(prepared) {
        let g = &file.graphs[i].graph;
        let mut gpus: Vec<&mut Gpu> = std::iter::once(&mut session.gpu)
            .chain(others.iter_mut())
            .collect();
        let result = (|| -> Result<RanksReport, (String, bool)> {
            let plain = |e: String| (e, false);
            let run = |e: RunError| {
                super::gpu::exit_if_stuck(&e);
                (e.to_string(), e.is_fatal())
            };
            let prep = prep.map_err(|e| plain(e.to_string()))?;
            let launch = &prep.emitted.launch;
            let mut info = prep.describe();
            let drawn = if a.check {
                let d = multi::ranked_inputs_and_reference(g, a.seed, a.scale, &budget)
                    .map_err(plain)?;
                if let Some(note) = &d.note {
                    info.push_str(&format!(
                        "; input scale lowered to {} ({note})",
                        mucc::graph::interp::format_scale(d.scale)
                    ));
                }
                Some(d)
            } else {
                None
            };
            let inputs = match &drawn {
                Some(d) => d.inputs.clone(),
                None => {
                    let spec = InputSpec {
                        seed: a.seed,
                        scale: a.scale,
                    };
                    interp::shard_inputs(g, &interp::random_global_inputs(g, spec))
                        .map_err(|e| plain(e.to_string()))?
                }
            };
            let outputs = multi::run_on_ranks(
                &mut gpus,
                &prep.cubin.bytes,
                launch,
                &inputs,
                a.gpu.all_reduce_buffers.placement(),
            )
            .map_err(run)?;
            let mut rows = Vec::new();
            match &drawn {
                Some(d) => {
                    let cmp = multi::check_ranks(g, d, &outputs).map_err(plain)?;
                    for (r, row) in cmp.into_iter().enumerate() {
                        for (j, c) in row.into_iter().enumerate() {
                            let o = &launch.outputs[j];
                            rows.push((r, j, c, format!("{} {:?}", o.dtype, o.shape)));
                        }
                    }
                }
                None => {
                    for (r, outs) in outputs.iter().enumerate() {
                        for (j, (_, got)) in outs.iter().enumerate() {
                            let finite = got.data.iter().filter(|x| x.is_finite()).count();
                            let sum: f64 = got.data.iter().filter(|x| x.is_finite()).sum();
                            info.push_str(&format!(
                                "; rank {r} out{j}: {finite}/{} finite, sum {sum:.6e}",
                                got.data.len()
                            ));
                        }
                    }
                }
            }
            Ok((rows, info))
        })();
        match result {
            Ok((rows, info)) => {
                writeln!(out, "graph {i}: {info}")?;
                for (r, j, c, desc) in &rows {
                    writeln!(
                        out,
                        "graph {i}: rank {r} out{j} {desc}: rel err {:.2e}, max abs {:.2e}, {} non-finite/unwritten: {}",
                        c.rel_l2,
                        c.max_abs,
                        c.non_finite,
                        verdict(c)
                    )?;
                }
                if rows.iter().all(|(_, _, c, _)| c.passed()) {
                    passed += 1;
                } else {
                    failed += 1;
                }
            }
            Err((msg, fatal)) => {
                writeln!(out, "graph {i}: FAIL: {msg}")?;
                failed += 1;
                if fatal {
                    writeln!(out, "stopping: the GPUs' contexts are lost")?;
                    break;
                }
            }
        }
    }
    writeln!(out, "on {n} GPUs: {passed} passed, {failed} failed")?;
    if failed > 0 {
        return Err(Failure::Quiet);
    }
    Ok(())
}
