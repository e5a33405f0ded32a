//! What the reference costs before it runs: host memory (every value is an f64) and work
//! (operations), estimated from the validated graph, so that a small file asking for a huge
//! tensor or a long product fails at once with a clear error instead of exhausting the machine.

use crate::graph::arena::Handle;
use crate::graph::kernel::{DTensor, KernelGraph, KnOpKind};
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

/// The estimated cost of evaluating a graph.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    /// Host memory at most held at once (bytes): every tensor and every input buffer as f64.
    pub bytes: f64,
    /// Host memory of the input buffers alone (bytes, as f64).
    pub input_bytes: f64,
    /// Operations.
    pub ops: f64,
    /// The largest single buffer: its tensor and bytes.
    pub largest: Option<(Handle<DTensor>, f64)>,
}

/// Estimates the cost of evaluating validated graph `g`.
pub fn estimate(g: &KernelGraph) -> Estimate {
    let mut bytes = 0.0f64;
    let mut largest: Option<(Handle<DTensor>, f64)> = None;
    let mut note = |t: Handle<DTensor>, b: f64| {
        if largest.is_none_or(|(_, l)| b > l) {
            largest = Some((t, b));
        }
    };
    for (t, d) in g.tensors.iter() {
        let b = d.shape.numel() as f64 * 8.0;
        bytes += b;
        note(t, b);
    }
    // Input buffers are drawn at their strided span, then gathered.
    let mut input_bytes = 0.0f64;
    for (_, t) in g.inputs() {
        let d = &g.tensors[t];
        let span = g
            .input_strides(t)
            .and_then(|s| s.span(&d.shape))
            .unwrap_or(d.shape.numel());
        let b = span as f64 * 8.0;
        bytes += b;
        input_bytes += b;
        note(t, b);
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
    }
}

fn gb(b: f64) -> String {
    format!("{:.1} GB", b / 1e9)
}

impl Estimate {
    /// Whether it fits `budget`; the error says by how much and which option raises the limit.
    pub fn check(&self, g: &KernelGraph, budget: &Budget) -> Result<(), String> {
        if self.bytes > budget.max_bytes as f64 {
            let largest = self.largest.map_or(String::new(), |(t, b)| {
                let d = &g.tensors[t];
                format!(
                    " (%{} {} {} alone: {} as f64)",
                    t.index(),
                    d.shape,
                    d.dtype,
                    gb(b)
                )
            });
            return Err(format!(
                "the f64 reference needs about {} of host memory{largest}, more than the limit of {} (--max-memory raises it)",
                gb(self.bytes),
                gb(budget.max_bytes as f64)
            ));
        }
        if self.ops > budget.max_ops {
            return Err(format!(
                "the f64 reference would take about {:.1e} operations, more than the limit of {:.1e} (about a minute; --max-work raises it)",
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
}
