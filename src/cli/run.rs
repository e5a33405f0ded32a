//! `mucc run`: transpile, compile (NVRTC, cached), execute on the GPU, and with `--check`
//! compare every output with the CPU interpreter.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use mucc::cuda::data::{self, Comparison};
use mucc::cuda::{Compiler, CompilerOptions, Gpu, Source};
use mucc::graph::interp::{self, Array, HostTensor, InputSpec};
use mucc::graph::{KernelGraph, Shape, Strides};
use mucc::pipeline::{self, Options};
use mucc::target::Target;

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
    /// Half-width of the input distribution (uniform in [−scale, scale)). Halved, per graph,
    /// while a tensor the GPU stores would leave its dtype's finite range on these inputs.
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Runtime headers folder (default: the copy embedded in mucc).
    #[arg(long, value_name = "DIR")]
    runtime_headers: Option<PathBuf>,
    /// Compile without reading or writing the NVRTC cache.
    #[arg(long)]
    no_cache: bool,
}

/// Inputs, reference outputs, the input scale used, and why it was lowered (if it was).
struct Drawn {
    inputs: Vec<HostTensor>,
    reference: Vec<Array>,
    scale: f64,
    note: Option<String>,
}

/// What one graph's run reports: per output (index, comparison, description), and a line of
/// timings and notes.
type GraphReport = (Vec<(usize, Comparison, String)>, String);

/// Inputs drawn at `scale`, halved while the reference overflows a stored tensor's dtype.
fn inputs_and_reference(g: &KernelGraph, seed: u64, scale: f64) -> Result<Drawn, String> {
    let mut scale = scale;
    let mut note = None;
    for _ in 0..12 {
        let inputs = interp::random_inputs(g, InputSpec { seed, scale });
        let (outs, excess) =
            interp::evaluate_ranged(g, inputs.clone()).map_err(|e| e.to_string())?;
        match excess.first() {
            None => {
                return Ok(Drawn {
                    inputs,
                    reference: outs,
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

/// Runs `mucc run`.
pub fn run(a: RunArgs) -> Result<(), Failure> {
    let file = load(&a.input)?;
    print_warnings(&file);
    let indices = a.select.indices(&file, false)?;
    // The GPU first: without one, nothing else is worth doing.
    let mut gpu = Gpu::open(a.device).map_err(|e| Failure::User(e.to_string()))?;
    let compiler = Compiler::new(CompilerOptions {
        runtime_headers: a.runtime_headers.clone(),
        no_cache: a.no_cache,
        ..Default::default()
    })
    .map_err(|e| Failure::User(e.to_string()))?;
    let name = a.input.file.display().to_string();
    let opts = Options {
        target: Target::new(gpu.arch),
        solve: Default::default(),
    };
    let mut out = stdout();
    let (nvrtc_major, nvrtc_minor) = compiler.nvrtc_version();
    writeln!(
        out,
        "GPU: {} ({}), NVRTC {nvrtc_major}.{nvrtc_minor}, inputs seed {} scale {}",
        gpu.name, gpu.arch, a.seed, a.scale
    )?;
    let (mut passed, mut failed, mut compiled, mut cached) = (0usize, 0usize, 0usize, 0usize);
    for &i in &indices {
        let lg = &file.graphs[i];
        let result = (|| -> Result<GraphReport, String> {
            lg.validate().map_err(|e| format!("invalid:\n{e}"))?;
            let t0 = Instant::now();
            let (_, emitted) = pipeline::transpile(&lg.graph, &opts, &format!("{name}, graph {i}"))
                .map_err(|e| e.to_string())?;
            let t_transpile = t0.elapsed().as_secs_f64();
            let path = format!("{name}#graph{i}.{}.cu", gpu.arch);
            let cubin = compiler
                .compile(&Source {
                    path: &path,
                    text: &emitted.source,
                    arch: gpu.arch,
                })
                .map_err(|e| e.to_string())?;
            if cubin.cached {
                cached += 1;
            } else {
                compiled += 1;
            }
            let mut info = format!(
                "transpiled in {:.0} ms, {} in {:.2} s",
                t_transpile * 1e3,
                if cubin.cached {
                    "cache hit"
                } else {
                    "compiled"
                },
                cubin.seconds
            );
            let prog = gpu
                .load(&cubin.bytes, &emitted.launch)
                .map_err(|e| e.to_string())?;
            let mut bufs = gpu.alloc(&prog).map_err(|e| e.to_string())?;
            let (inputs, reference) = if a.check {
                let d = inputs_and_reference(&lg.graph, a.seed, a.scale)?;
                if let Some(n) = d.note {
                    info.push_str(&format!("; input scale lowered to {} ({n})", d.scale));
                }
                (d.inputs, Some(d.reference))
            } else {
                (
                    interp::random_inputs(
                        &lg.graph,
                        InputSpec {
                            seed: a.seed,
                            scale: a.scale,
                        },
                    ),
                    None,
                )
            };
            for (k, (t, d)) in inputs.iter().zip(&emitted.launch.inputs).enumerate() {
                let dt = d.dtype.parse().map_err(|e: String| e)?;
                let mut vals = t.data.clone();
                vals.resize(d.alloc_elems, 0.0);
                let bytes = data::encode(dt, &vals);
                gpu.upload_input(&mut bufs, k, &bytes)
                    .map_err(|e| e.to_string())?;
            }
            gpu.poison_outputs(&mut bufs, 0xff)
                .map_err(|e| e.to_string())?;
            gpu.execute(&prog, &bufs).map_err(|e| e.to_string())?;
            gpu.synchronize().map_err(|e| e.to_string())?;
            let mut rows = Vec::new();
            for (j, d) in emitted.launch.outputs.iter().enumerate() {
                let dt = d.dtype.parse().map_err(|e: String| e)?;
                let bytes = gpu.download_output(&bufs, j).map_err(|e| e.to_string())?;
                let buf = data::decode(dt, &bytes);
                let shape = Shape::new(&d.shape)
                    .ok_or_else(|| format!("bad output shape {:?}", d.shape))?;
                let got = data::gather(shape, &Strides(d.strides.clone()), &buf);
                let desc = format!("{} {:?}", d.dtype, d.shape);
                match &reference {
                    Some(refs) => rows.push((j, data::compare(dt, &got, &refs[j]), desc)),
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
        match result {
            Ok((rows, info)) => {
                let ok = rows.iter().all(|(_, c, _)| c.passed());
                writeln!(out, "graph {i}: {info}")?;
                for (j, c, desc) in &rows {
                    writeln!(
                        out,
                        "graph {i}: out{j} {desc}: rel err {:.2e}, max abs {:.2e}, {} non-finite/unwritten: {}",
                        c.rel_l2,
                        c.max_abs,
                        c.non_finite,
                        if c.passed() {
                            "ok".to_string()
                        } else {
                            format!("FAIL (bound {:e})", c.bound)
                        }
                    )?;
                }
                if ok {
                    passed += 1;
                } else {
                    failed += 1;
                }
            }
            Err(msg) => {
                writeln!(out, "graph {i}: FAIL: {msg}")?;
                failed += 1;
            }
        }
    }
    writeln!(
        out,
        "{compiled} compiled, {cached} from the NVRTC cache; {passed} passed, {failed} failed"
    )?;
    if failed > 0 {
        return Err(Failure::Quiet);
    }
    Ok(())
}
