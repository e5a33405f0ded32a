//! What the reference costs before it runs: host memory (every value is an f64) and work
//! (operations), estimated from the validated graph, so that a small file asking for a huge
//! tensor or a long product fails at once with a clear error instead of exhausting the machine.

use crate::graph::arena::Handle;
use crate::graph::kernel::{DTensor, KernelGraph, KnOpKind};
use crate::graph::shape::Shape;
use crate::graph::sharding;
use crate::graph::threadblock::TbOpKind;

/// Limits of one reference evaluation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Budget {
    /// Host memory (bytes).
    pub max_bytes: u64,
    /// Operations (element operations and multiply-adds).
    pub max_ops: f64,
}

/// The default memory limit: 8 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 8 << 30;
/// The default work limit: 10¹¹ operations (about a minute of the interpreter).
pub const DEFAULT_MAX_OPS: f64 = 1e11;

impl Default for Budget {
    fn default() -> Self {
        Budget {
            max_bytes: DEFAULT_MAX_BYTES,
            max_ops: DEFAULT_MAX_OPS,
        }
    }
}

/// The estimated cost of evaluating a graph: on a multi-GPU graph, of every rank together
/// with the global inputs drawn before sharding and the gathered outputs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    /// Host memory at most held at once (bytes): every tensor and every input buffer as f64,
    /// on every rank; on several GPUs also the global inputs and the gathered outputs.
    pub bytes: f64,
    /// Host memory of the input buffers alone (bytes, as f64): on several GPUs, the global
    /// inputs and every rank's buffers.
    pub input_bytes: f64,
    /// Operations.
    pub ops: f64,
    /// The largest single buffer.
    pub largest: Option<Largest>,
    /// The ranks (GPUs) evaluated.
    pub ranks: usize,
}

/// The largest single buffer of an [`Estimate`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Largest {
    /// Its tensor.
    pub tensor: Handle<DTensor>,
    /// Its shape: the per-GPU shape, or the global one for [`Largest::global`].
    pub shape: Shape,
    /// Whether it is the global (whole) value of an input or output of a multi-GPU graph.
    pub global: bool,
    /// Its size (bytes, as f64).
    pub bytes: f64,
}

/// Estimates the cost of evaluating validated graph `g` (every rank of its GPU mesh).
pub fn estimate(g: &KernelGraph) -> Estimate {
    let mut e = estimate_rank(g);
    let mesh = g.sharding.mesh_or_single();
    let n = mesh.num_gpus();
    if n <= 1 {
        return e;
    }
    // Every rank holds its own buffers and tensors; the global inputs are drawn whole before
    // they are sharded, and the outputs are gathered into whole arrays.
    let ranks = n as f64;
    e.bytes *= ranks;
    e.input_bytes *= ranks;
    e.ops *= ranks;
    e.ranks = n;
    let note = |largest: &mut Option<Largest>, candidate: Largest| {
        if largest.is_none_or(|l| candidate.bytes > l.bytes) {
            *largest = Some(candidate);
        }
    };
    let mut largest = e.largest;
    for (is_input, ends) in [(true, g.inputs()), (false, g.outputs())] {
        for (h, t) in ends {
            let local = g.tensors[t].shape;
            let global = sharding::global_shape(&local, g.sharding.map(h), mesh).unwrap_or(local);
            let numel = global.dims().iter().map(|&d| d as f64).product::<f64>();
            let b = numel * 8.0;
            e.bytes += b;
            e.ops += numel;
            if is_input {
                e.input_bytes += b;
            }
            note(
                &mut largest,
                Largest {
                    tensor: t,
                    shape: global,
                    global: true,
                    bytes: b,
                },
            );
        }
    }
    e.largest = largest;
    e
}

/// The cost of evaluating one rank of `g`.
fn estimate_rank(g: &KernelGraph) -> Estimate {
    let mut bytes = 0.0f64;
    let mut largest: Option<Largest> = None;
    let mut note = |t: Handle<DTensor>, shape: Shape, b: f64| {
        if largest.is_none_or(|l| b > l.bytes) {
            largest = Some(Largest {
                tensor: t,
                shape,
                global: false,
                bytes: b,
            });
        }
    };
    for (t, d) in g.tensors.iter() {
        let b = d.shape.numel() as f64 * 8.0;
        bytes += b;
        note(t, d.shape, b);
    }
    // Input buffers are drawn at their strided span, then gathered.
    let mut input_bytes = 0.0f64;
    for (_, op) in g.ops.iter() {
        let (KnOpKind::Input { strides }, Some(&t)) = (&op.kind, op.outputs.first()) else {
            continue;
        };
        let d = &g.tensors[t];
        let span = strides.span(&d.shape).unwrap_or(d.shape.numel());
        let b = span as f64 * 8.0;
        bytes += b;
        input_bytes += b;
        note(t, d.shape, b);
    }
    let mut ops = 0.0f64;
    for (_, op) in g.ops.iter() {
        let out_numel: f64 = op
            .outputs
            .iter()
            .map(|&t| g.tensors[t].shape.numel() as f64)
            .sum();
        let in_numel: f64 = op
            .inputs
            .iter()
            .map(|&t| g.tensors[t].shape.numel() as f64)
            .sum();
        ops += match &op.kind {
            KnOpKind::Matmul => {
                let a = &g.tensors[op.inputs[0]].shape;
                out_numel * a.dim(a.rank() - 1) as f64
            }
            KnOpKind::Customized(tb) => {
                // Every block runs every iteration of the threadblock graph.
                let per_iteration: f64 = tb
                    .ops
                    .iter()
                    .map(|(_, top)| {
                        let out: f64 = top
                            .outputs
                            .iter()
                            .map(|&t| tb.tensors[t].shape.numel() as f64)
                            .sum();
                        let inp: f64 = top
                            .inputs
                            .iter()
                            .map(|&t| tb.tensors[t].shape.numel() as f64)
                            .sum();
                        match &top.kind {
                            TbOpKind::Matmul => {
                                let a = &tb.tensors[top.inputs[0]].shape;
                                out * a.dim(a.rank() - 1) as f64
                            }
                            _ => out.max(inp),
                        }
                    })
                    .sum();
                per_iteration * tb.num_blocks() as f64 * tb.forloop_range as f64
            }
            _ => out_numel.max(in_numel),
        };
    }
    Estimate {
        bytes,
        input_bytes,
        ops,
        largest,
        ranks: 1,
    }
}

/// A byte count for people: binary units (the `K`, `M` and `G` of `--max-memory` and
/// `--max-input-bytes` are powers of 1024) with three significant digits — `512 B`,
/// `1.5 KiB`, `584 MiB`, `8 GiB`, `2 TiB`.
pub fn format_bytes(b: f64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if !b.is_finite() {
        return format!("{b} B");
    }
    if b < 1024.0 {
        return format!("{} B", b.round());
    }
    let mut v = b / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    let decimals = if v < 10.0 {
        2
    } else if v < 100.0 {
        1
    } else {
        0
    };
    let mut s = format!("{v:.decimals$}");
    if s.contains('.') {
        s = s.trim_end_matches('0').trim_end_matches('.').to_string();
    }
    format!("{s} {}", UNITS[unit])
}

/// Two byte counts for "needs A, more than B": with [`format_bytes`], or as exact byte counts
/// where rounding would print them alike.
pub fn format_byte_pair(need: f64, limit: f64) -> (String, String) {
    let (a, b) = (format_bytes(need), format_bytes(limit));
    if a == b {
        (format!("{need:.0} bytes"), format!("{limit:.0} bytes"))
    } else {
        (a, b)
    }
}

impl Estimate {
    /// Whether it fits `budget`; the error says by how much and which option raises the limit.
    pub fn check(&self, g: &KernelGraph, budget: &Budget) -> Result<(), String> {
        let of_ranks = if self.ranks > 1 {
            format!(
                " on {} GPUs (every rank, the global inputs and the gathered outputs)",
                self.ranks
            )
        } else {
            String::new()
        };
        if self.bytes > budget.max_bytes as f64 {
            let largest = self.largest.map_or(String::new(), |l| {
                format!(
                    " ({}%{} {} {} alone: {} as f64)",
                    if l.global { "the global " } else { "" },
                    l.tensor.index(),
                    l.shape,
                    g.tensors[l.tensor].dtype,
                    format_bytes(l.bytes)
                )
            });
            let (need, limit) = format_byte_pair(self.bytes, budget.max_bytes as f64);
            return Err(format!(
                "the f64 reference needs about {need} of host memory{of_ranks}{largest}, more than the limit of {limit} (--max-memory raises it)"
            ));
        }
        if self.ops > budget.max_ops {
            return Err(format!(
                "the f64 reference would take about {:.1e} operations{of_ranks}, more than the limit of {:.1e} (about a minute; --max-work raises it)",
                self.ops, budget.max_ops
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{DType, GraphBuilder};

    #[test]
    fn a_huge_product_is_refused_before_it_runs() {
        let mut g = GraphBuilder::new();
        let a = g.new_input(&[65536, 65536], DType::F32).unwrap();
        let b = g.new_input(&[65536, 65536], DType::F32).unwrap();
        let c = g.matmul(a, b).unwrap();
        g.mark_output(c).unwrap();
        let g = g.build().unwrap();
        let e = estimate(&g);
        assert!(e.bytes > 1e11 && e.ops > 2.8e14);
        let msg = e.check(&g, &Budget::default()).unwrap_err();
        assert!(
            msg.contains("host memory") && msg.contains("--max-memory"),
            "{msg}"
        );
        let roomy = Budget {
            max_bytes: u64::MAX,
            max_ops: f64::INFINITY,
        };
        assert!(e.check(&g, &roomy).is_ok());
        // Small graphs pass.
        let mut s = GraphBuilder::new();
        let x = s.new_input(&[16, 64], DType::F16).unwrap();
        let y = s.exp(x).unwrap();
        s.mark_output(y).unwrap();
        let s = s.build().unwrap();
        assert!(estimate(&s).check(&s, &Budget::default()).is_ok());
    }

    #[test]
    fn a_multi_gpu_estimate_covers_every_rank_and_the_global_arrays() {
        use crate::graph::sharding::GpuMesh;
        let one = |gpus: usize| {
            let mut g = GraphBuilder::new();
            g.set_gpu_mesh(GpuMesh::line(gpus)).unwrap();
            // Global [64 × gpus, 32], partitioned along dim 0; a replicated [8, 32].
            let x = g
                .new_input_sharded(&[64 * gpus, 32], DType::F16, [0, -1, -1])
                .unwrap();
            let w = g.new_input(&[8, 32], DType::F16).unwrap();
            let y = g.exp(x).unwrap();
            g.mark_output_sharded(y, [0, -1, -1]).unwrap();
            g.mark_output(w).unwrap();
            g.build().unwrap()
        };
        let single = estimate(&one(1));
        assert_eq!(single.ranks, 1);
        // Tensors x, w, y and the buffers of x and w, as f64.
        assert_eq!(single.bytes, ((64 * 32) * 3 + 8 * 32 * 2) as f64 * 8.0);
        let g = one(16);
        let e = estimate(&g);
        assert_eq!(e.ranks, 16);
        // Every rank, the global inputs (x whole, w) and the gathered outputs (y whole, w).
        let global = ((64 * 16 * 32) * 2 + 8 * 32 * 2) as f64 * 8.0;
        assert_eq!(e.bytes, 16.0 * single.bytes + global);
        assert_eq!(
            e.input_bytes,
            16.0 * single.input_bytes + ((64 * 16 * 32) + 8 * 32) as f64 * 8.0
        );
        let l = e.largest.unwrap();
        assert!(l.global && l.shape.dims() == [1024, 32], "{l:?}");
        let tight = Budget {
            max_bytes: (e.bytes as u64) - 1,
            max_ops: f64::INFINITY,
        };
        let msg = e.check(&g, &tight).unwrap_err();
        assert!(
            msg.contains("on 16 GPUs") && msg.contains("the global %0 [1024, 32]"),
            "{msg}"
        );
        assert!(e.check(&g, &Budget::default()).is_ok());
    }

    #[test]
    fn byte_counts_read_well() {
        assert_eq!(format_bytes(0.0), "0 B");
        assert_eq!(format_bytes(512.0), "512 B");
        assert_eq!(format_bytes(1536.0), "1.5 KiB");
        assert_eq!(format_bytes(100.0 * 1048576.0), "100 MiB");
        assert_eq!(format_bytes(584e6), "557 MiB");
        assert_eq!(format_bytes((8u64 << 30) as f64), "8 GiB");
        assert_eq!(format_bytes(2.196875771904e12), "2 TiB");
        // Sizes that print alike are shown exactly.
        assert_eq!(
            format_byte_pair(1e6 + 1.0, 1e6),
            ("1000001 bytes".to_string(), "1000000 bytes".to_string())
        );
        assert_eq!(
            format_byte_pair(2048.0, 1024.0),
            ("2 KiB".to_string(), "1 KiB".to_string())
        );
    }
}
