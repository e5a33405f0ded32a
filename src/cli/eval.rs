//! `mucc eval`.

use std::collections::HashMap;
use std::io::Write;
use std::time::Instant;

use clap::Args;
use mucc::graph::interp::{self, Array, HostTensor, InputSpec};
use mucc::graph::{DType, KernelGraph, Shape, Strides};

use super::{Failure, GraphSelection, InputArgs, load, print_warnings, stdout};

/// Arguments of `mucc eval`.
#[derive(Args, Debug)]
pub struct EvalArgs {
    #[command(flatten)]
    input: InputArgs,
    #[command(flatten)]
    select: GraphSelection,
    #[command(flatten)]
    draw: super::DrawArgs,
    /// Write the inputs and reference outputs of the (single) evaluated graph into this
    /// directory: `in<i>.bin` (the caller buffer, strides applied, as little-endian f64; padding
    /// is NaN), `ref<j>.bin` (logical row-major f64) and `manifest.json` (shapes, strides, dtypes).
    #[arg(long, value_name = "DIR", conflicts_with = "all")]
    dump: Option<std::path::PathBuf>,
    /// Overwrite files of an earlier `--dump` in DIR.
    #[arg(long, requires = "dump")]
    force: bool,
    /// Where the reference rounds: `exact` (nowhere: f64 from the rounded inputs, the oracle
    /// `mucc run --check` compares with) or `stored` (every stored tensor, tile and accumulator
    /// rounded to its dtype, as generated code rounds at most).
    #[arg(long, value_enum, default_value_t = RoundingArg::Exact)]
    rounding: RoundingArg,
    #[command(flatten)]
    budget: super::BudgetArgs,
}

/// `--rounding`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum RoundingArg {
    Exact,
    Stored,
}

impl From<RoundingArg> for interp::Rounding {
    fn from(r: RoundingArg) -> Self {
        match r {
            RoundingArg::Exact => interp::Rounding::Exact,
            RoundingArg::Stored => interp::Rounding::Stored,
        }
    }
}

fn write_f64(path: &std::path::Path, data: &[f64], force: bool) -> Result<(), Failure> {
    let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
    super::out::write(path, bytes, force)
}

/// The files `--dump DIR` writes for `g`.
fn dump_paths(dir: &std::path::Path, g: &KernelGraph) -> Vec<std::path::PathBuf> {
    let mut v: Vec<std::path::PathBuf> = (0..g.inputs().len())
        .map(|i| dir.join(format!("in{i}.bin")))
        .collect();
    v.extend((0..g.outputs().len()).map(|j| dir.join(format!("ref{j}.bin"))));
    v.push(dir.join("manifest.json"));
    v
}

fn dump(
    dir: &std::path::Path,
    g: &KernelGraph,
    inputs: &[HostTensor],
    outputs: &[Array],
    spec: InputSpec,
    force: bool,
) -> Result<(), Failure> {
    let mut ins = Vec::new();
    for (i, (h, t)) in inputs.iter().zip(g.inputs()).enumerate() {
        write_f64(&dir.join(format!("in{i}.bin")), &h.data, force)?;
        ins.push(serde_json::json!({
            "file": format!("in{i}.bin"),
            "shape": h.shape.dims(),
            "strides": h.strides.0,
            "elems": h.data.len(),
            "dtype": g.tensors[t.1].dtype.to_string(),
        }));
    }
    let mut outs = Vec::new();
    for (j, (o, (_, t))) in outputs.iter().zip(g.outputs()).enumerate() {
        write_f64(&dir.join(format!("ref{j}.bin")), &o.data, force)?;
        outs.push(serde_json::json!({
            "file": format!("ref{j}.bin"),
            "shape": o.shape.dims(),
            "dtype": g.tensors[t].dtype.to_string(),
        }));
    }
    let manifest =
        serde_json::json!({"seed": spec.seed, "scale": spec.scale, "inputs": ins, "outputs": outs});
    super::out::write(
        &dir.join("manifest.json"),
        serde_json::to_string_pretty(&manifest).unwrap_or_default() + "\n",
        force,
    )
}

/// The number of infinite values in each buffer (NaN padding is not counted).
fn infinite_counts<'a>(buffers: impl Iterator<Item = &'a [f64]>) -> Vec<usize> {
    buffers
        .map(|b| b.iter().filter(|x| x.is_infinite()).count())
        .collect()
}

/// Statistics of one output.
struct Stats {
    shape: Shape,
    checksum: f64,
    l1: f64,
    l2: f64,
    max_abs: f64,
    non_finite: usize,
}

fn stats(a: &Array) -> Stats {
    let mut s = Stats {
        shape: a.shape,
        checksum: 0.0,
        l1: 0.0,
        l2: 0.0,
        max_abs: 0.0,
        non_finite: 0,
    };
    for &x in &a.data {
        if !x.is_finite() {
            s.non_finite += 1;
            continue;
        }
        s.checksum += x;
        s.l1 += x.abs();
        s.l2 += x * x;
        s.max_abs = s.max_abs.max(x.abs());
    }
    s.l2 = s.l2.sqrt();
    s
}

/// ‖a − b‖ / max(‖a‖, ‖b‖) (0 when both are 0; ∞ for different shapes or non-finite values).
pub fn relative_difference(a: &Array, b: &Array) -> f64 {
    if a.shape != b.shape {
        return f64::INFINITY;
    }
    let (mut d, mut na, mut nb) = (0.0, 0.0, 0.0);
    for (&x, &y) in a.data.iter().zip(&b.data) {
        d += (x - y) * (x - y);
        na += x * x;
        nb += y * y;
    }
    let denom = f64::max(na, nb).sqrt();
    if !d.is_finite() || !denom.is_finite() {
        f64::INFINITY
    } else if denom == 0.0 {
        if d == 0.0 { 0.0 } else { f64::INFINITY }
    } else {
        d.sqrt() / denom
    }
}

type Signature = Vec<(Shape, Strides, DType)>;

fn signature(g: &KernelGraph) -> Signature {
    g.inputs()
        .into_iter()
        .map(|(_, t)| {
            let d = &g.tensors[t];
            (
                d.shape,
                g.input_strides(t).cloned().unwrap_or_default(),
                d.dtype,
            )
        })
        .collect()
}

/// Runs `mucc eval`.
pub fn run(a: EvalArgs) -> Result<(), Failure> {
    let file = load(&a.input)?;
    print_warnings(&file);
    let indices = a.select.indices(&file, false)?;
    // Validate first: the interpreter assumes valid graphs. Then the cost: a small file may
    // ask for terabytes.
    let budget = a.budget.budget();
    for &i in &indices {
        if let Err(e) = file.graphs[i].validate() {
            return Err(Failure::User(format!("graph {i} is invalid:\n{e}")));
        }
        let g = &file.graphs[i].graph;
        interp::estimate(g)
            .check(g, &budget)
            .map_err(|e| Failure::User(format!("graph {i}: {e}")))?;
    }
    if let Some(dir) = &a.dump {
        let g = &file.graphs[indices[0]].graph;
        if g.sharding.num_gpus() > 1 {
            return Err(Failure::User(format!(
                "graph {}: --dump writes one GPU's buffers; the graph runs on {} GPUs",
                indices[0],
                g.sharding.num_gpus()
            )));
        }
        std::fs::create_dir_all(dir)
            .map_err(|e| Failure::User(format!("cannot create {}: {e}", super::shown(dir))))?;
        let g = &file.graphs[indices[0]].graph;
        super::out::check(&dump_paths(dir, g), &[a.input.file.as_path()], a.force)?;
    }
    let spec = InputSpec {
        seed: a.draw.seed,
        scale: a.draw.scale,
    };
    let mut out = stdout();
    writeln!(
        out,
        "inputs: uniform in [-{s}, {s}), seed {}, rounded to each input's dtype{}",
        a.draw.seed,
        if a.rounding == RoundingArg::Stored {
            "; every stored tensor, tile and accumulator rounded to its dtype"
        } else {
            ""
        },
        s = interp::format_scale(a.draw.scale)
    )?;
    let bar = super::progress::bar(indices.len() as u64, "graphs", "");
    // Candidates of one file share their inputs: draw them once per signature.
    // Per input signature: the drawn buffers and their logical arrays, which exact walks share.
    type Drawn = (Vec<HostTensor>, Vec<std::sync::Arc<interp::Array>>);
    let mut cache: HashMap<Signature, Drawn> = HashMap::new();
    let mut results: Vec<(usize, Vec<Array>)> = Vec::new();
    for &i in &indices {
        bar.set_message(format!("graph {i}"));
        let g = &file.graphs[i].graph;
        let t0 = Instant::now();
        // Inputs drawn beyond their dtype's range are infinite (a --scale above 65504 in f16).
        let infinite: Vec<usize>;
        let (outs, excess) = if g.sharding.num_gpus() > 1 {
            // Whole inputs, sharded per rank; the outputs gathered.
            let global = interp::random_global_inputs(g, spec);
            infinite = infinite_counts(global.iter().map(|a| a.data.as_slice()));
            let r = interp::evaluate_sharded(g, &global, a.rounding.into())
                .map_err(|e| Failure::User(format!("graph {i}: {e}")))?;
            bar.suspend(|| {
                writeln!(
                    out,
                    "graph {i}: {} GPUs (mesh {}): every rank interpreted on its shard, outputs gathered",
                    r.mesh.num_gpus(),
                    r.mesh
                )
            })?;
            (r.gathered, r.excess)
        } else if let Some(dir) = &a.dump {
            let inputs = interp::random_inputs(g, spec);
            infinite = infinite_counts(inputs.iter().map(|h| h.data.as_slice()));
            let (outs, excess) = interp::evaluate_rounded(g, inputs.clone(), a.rounding.into())
                .map_err(|e| Failure::User(format!("graph {i}: {e}")))?;
            dump(dir, g, &inputs, &outs, spec, a.force)?;
            (outs, excess)
        } else {
            let rounding: interp::Rounding = a.rounding.into();
            let r = if indices.len() == 1 {
                let inputs = interp::random_inputs(g, spec);
                infinite = infinite_counts(inputs.iter().map(|h| h.data.as_slice()));
                interp::evaluate_rounded(g, inputs, rounding)
            } else {
                let (inputs, arrays) = cache.entry(signature(g)).or_insert_with(|| {
                    let inputs = interp::random_inputs(g, spec);
                    let arrays = interp::logical_arrays(&inputs);
                    (inputs, arrays)
                });
                infinite = infinite_counts(inputs.iter().map(|h| h.data.as_slice()));
                match rounding {
                    interp::Rounding::Exact => interp::evaluate_shared_ranged(g, arrays),
                    interp::Rounding::Stored => {
                        interp::evaluate_rounded(g, inputs.clone(), rounding)
                    }
                }
            };
            r.map_err(|e| Failure::User(format!("graph {i}: {e}")))?
        };
        let secs = t0.elapsed().as_secs_f64();
        bar.suspend(|| {
            let inputs = g.inputs();
            for (k, &n) in infinite.iter().enumerate().filter(|(_, n)| **n > 0) {
                let dtype = inputs.get(k).map(|&(_, t)| g.tensors[t].dtype);
                let limit = dtype.and_then(|d| d.max_finite());
                eprintln!(
                    "warning: graph {i}: {n} values of input {k}{} are infinite: --scale {} is beyond the largest finite {}{}, so every result that depends on them is infinite or NaN; lower --scale",
                    dtype.map_or(String::new(), |d| format!(" ({})", d.name())),
                    interp::format_scale(a.draw.scale),
                    dtype.map_or("value".into(), |d| d.name().to_string()),
                    limit.map_or(String::new(), |l| format!(" ({l:.4e})")),
                );
            }
            // A few warnings per graph, then a count: a long chain can overflow everywhere.
            const SHOWN: usize = 4;
            if excess.len() > SHOWN {
                eprintln!(
                    "warning: graph {i}: {} tensors or tiles exceed their dtype's finite range on these inputs (the first {SHOWN} follow); lower --scale",
                    excess.len()
                );
            }
            for x in excess.iter().take(SHOWN) {
                let shape = match x.place {
                    interp::RangePlace::Tensor(t) => format!(" {}", g.tensors[t].shape),
                    interp::RangePlace::Tile { .. } => String::new(),
                };
                eprintln!(
                    "warning: graph {i}: {}{shape} {} reaches |x| = {:.3e}, beyond the largest finite {} ({:.4e}): compiled code that stores it overflows where this f64 reference does not; lower --scale",
                    x.place,
                    x.dtype.name(),
                    x.max_abs,
                    x.dtype.name(),
                    x.limit
                );
            }
        });
        bar.suspend(|| -> Result<(), std::io::Error> {
            for (j, o) in outs.iter().enumerate() {
                let s = stats(o);
                write!(
                    out,
                    "graph {i}: output {j}: shape {} checksum {:.12e} l1 {:.6e} l2 {:.6e} max|x| {:.6e}",
                    s.shape, s.checksum, s.l1, s.l2, s.max_abs
                )?;
                if s.non_finite > 0 {
                    write!(out, " NON-FINITE {}", s.non_finite)?;
                }
                writeln!(out, " ({secs:.2} s)")?;
            }
            Ok(())
        })?;
        bar.inc(1);
        results.push((i, outs));
    }
    bar.finish_and_clear();
    if results.len() > 1 {
        // Largest pairwise relative difference over all candidate pairs and outputs.
        let mut worst = (-1.0f64, 0, 0, 0);
        for x in 0..results.len() {
            for y in x + 1..results.len() {
                let ((gi, oi), (gj, oj)) = (&results[x], &results[y]);
                for k in 0..oi.len().max(oj.len()) {
                    let d = match (oi.get(k), oj.get(k)) {
                        (Some(p), Some(q)) => relative_difference(p, q),
                        _ => f64::INFINITY,
                    };
                    if d > worst.0 {
                        worst = (d, *gi, *gj, k);
                    }
                }
            }
        }
        writeln!(
            out,
            "candidates agree: {} (largest pairwise relative difference {:.3e}, graphs {} and {}, output {})",
            if worst.0 < 1e-9 { "yes" } else { "NO" },
            worst.0,
            worst.1,
            worst.2,
            worst.3
        )?;
    }
    Ok(())
}
