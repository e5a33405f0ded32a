//! The kernel-level graph: device tensors (DTensors) and kernel operators.

use super::arena::{Arena, Handle};
use super::dtype::DType;
use super::ops::{BinaryOp, UnaryOp};
use super::shape::{Shape, Strides};
use super::sharding::Sharding;
use super::threadblock::TbGraph;

/// A device-memory tensor of the kernel graph. Its memory layout is given by the op that binds it
/// to the caller (input/output strides); intermediates get theirs from the layout pass.
#[derive(Clone, Debug, PartialEq)]
pub struct DTensor {
    /// Logical shape.
    pub shape: Shape,
    /// Element type.
    pub dtype: DType,
    /// The guid recorded in (or written to) Mirage JSON; diagnostic only.
    pub guid: Option<i64>,
}

/// A kernel-level operator kind.
#[derive(Clone, Debug, PartialEq)]
pub enum KnOpKind {
    /// Graph input, bound to caller buffer `i` (the i-th input op) with these element strides.
    Input {
        /// Element strides of the caller's buffer.
        strides: Strides,
    },
    /// Graph output `j` (the j-th output op); `None` lets the transpiler choose the layout.
    Output {
        /// Element strides of the caller's output buffer.
        strides: Option<Strides>,
    },
    /// Batched matrix product over the last two dims.
    Matmul,
    /// Element-wise unary operator.
    Unary(UnaryOp),
    /// Element-wise binary operator with broadcasting.
    Binary(BinaryOp),
    /// Sum over `dim`. The output extent of `dim` is 1, or a divisor s of the input extent, in
    /// which case elements are grouped with stride s: `out[j] = Σₖ X[k·s + j]`.
    Reduction {
        /// The reduced dim.
        dim: usize,
    },
    /// x / sqrt(mean(x²)) over the trailing `normalized_dims` dims; no ε, no weight.
    RmsNorm {
        /// Number of trailing dims normalised together.
        normalized_dims: usize,
    },
    /// Concatenation of all inputs along `dim`.
    Concat {
        /// The concatenated dim.
        dim: usize,
    },
    /// Splits the input along `dim` into consecutive pieces with the outputs' extents.
    Split {
        /// The split dim.
        dim: usize,
    },
    /// Splits the input along `dim` into equal consecutive chunks, one per output.
    Chunk {
        /// The split dim.
        dim: usize,
        /// Mirage's recorded `chunk_size` (kept for export; the outputs' shapes are authoritative).
        chunk_size: usize,
    },
    /// All-reduce across the GPUs of the graph's mesh: every rank's tensor is replaced by the
    /// element-wise sum over all ranks (Mirage's `kn_allreduce_op`); the identity on one GPU.
    AllReduce {
        /// Mirage's `inplace` flag (whether the output reuses the input's buffer; no effect on
        /// the values).
        inplace: bool,
    },
    /// A fused operator whose body is a threadblock graph.
    Customized(Box<TbGraph>),
    /// mucc-internal (never in a Mirage file; the online-softmax rewrite makes it): combines
    /// the partial results of attention split over `splits` key blocks. Inputs O
    /// `[…, rows, splits·d]`, l and m `[…, rows, splits]`; output `[…, rows, d]`: per row, with
    /// `M = maxₛ m[s]` and `wₛ = exp(m[s] − M)`, `y[j] = Σₛ wₛ·O[s·d + j] / Σₛ wₛ·l[s]`.
    SoftmaxCombine {
        /// Key splits.
        splits: usize,
    },
    /// mucc-internal (never in a Mirage file; the score shift of `sched::shift` makes it): the
    /// largest element of each of `groups` contiguous groups of equal length along the last
    /// dim, which the output has at extent `groups` (1: the largest of the whole row).
    RowMax {
        /// Groups per row (dividing the last dim).
        groups: usize,
    },
    /// mucc-internal (the score shift of `sched::shift` makes it): `exp(x − m)` element by
    /// element; with `groups` 1, `m` (the second input) broadcast as in a binary operator, else
    /// `m` has `x`'s shape but `groups` along the last dim, one value per contiguous group.
    ShiftedExp {
        /// Groups of the last dim with their own `m` (1: `m` broadcasts).
        groups: usize,
    },
}

impl KnOpKind {
    /// Mirage-style name of the operator (`input`, `matmul`, `exp`, `customized`, …).
    pub fn name(&self) -> String {
        match self {
            KnOpKind::Input { .. } => "input".into(),
            KnOpKind::Output { .. } => "output".into(),
            KnOpKind::Matmul => "matmul".into(),
            KnOpKind::Unary(u) => u.name().into(),
            KnOpKind::Binary(b) => b.name().into(),
            KnOpKind::Reduction { dim } => format!("reduction_{dim}"),
            KnOpKind::RmsNorm { .. } => "rms_norm".into(),
            KnOpKind::Concat { dim } => format!("concat_{dim}"),
            KnOpKind::Split { dim } => format!("split_{dim}"),
            KnOpKind::Chunk { dim, .. } => format!("chunk_{dim}"),
            KnOpKind::AllReduce { .. } => "allreduce".into(),
            KnOpKind::Customized(_) => "customized".into(),
            KnOpKind::SoftmaxCombine { .. } => "softmax_combine".into(),
            KnOpKind::RowMax { .. } => "row_max".into(),
            KnOpKind::ShiftedExp { .. } => "shifted_exp".into(),
        }
    }
}

/// A kernel-level operator: reads `inputs`, defines `outputs`.
#[derive(Clone, Debug, PartialEq)]
pub struct KnOp {
    /// What the operator computes.
    pub kind: KnOpKind,
    /// Tensors read, in operand order.
    pub inputs: Vec<Handle<DTensor>>,
    /// Tensors defined.
    pub outputs: Vec<Handle<DTensor>>,
}

/// A kernel graph: the unit Mirage's search produces and mucc transpiles.
///
/// `ops` is in construction order, which is a topological order. Graph inputs are the
/// [`KnOpKind::Input`] ops in order; graph outputs are the [`KnOpKind::Output`] ops in order.
///
/// Shapes are per GPU: on a multi-GPU mesh ([`Sharding`]) the graph is what each rank runs.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct KernelGraph {
    /// All device tensors.
    pub tensors: Arena<DTensor>,
    /// All operators, in a topological order.
    pub ops: Arena<KnOp>,
    /// The GPU mesh and the partition maps of inputs and outputs (default: one GPU, nothing
    /// partitioned).
    pub sharding: Sharding,
}

impl KernelGraph {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// The graph inputs in caller order: (input op, tensor).
    pub fn inputs(&self) -> Vec<(Handle<KnOp>, Handle<DTensor>)> {
        self.ops
            .iter()
            .filter(|(_, op)| matches!(op.kind, KnOpKind::Input { .. }))
            .filter_map(|(h, op)| op.outputs.first().map(|&t| (h, t)))
            .collect()
    }

    /// The graph outputs in caller order: (output op, tensor).
    pub fn outputs(&self) -> Vec<(Handle<KnOp>, Handle<DTensor>)> {
        self.ops
            .iter()
            .filter(|(_, op)| matches!(op.kind, KnOpKind::Output { .. }))
            .filter_map(|(h, op)| op.inputs.first().map(|&t| (h, t)))
            .collect()
    }

    /// The strides of graph input `t` if it is one.
    pub fn input_strides(&self, t: Handle<DTensor>) -> Option<&Strides> {
        self.ops.iter().find_map(|(_, op)| match &op.kind {
            KnOpKind::Input { strides } if op.outputs.first() == Some(&t) => Some(strides),
            _ => None,
        })
    }

    /// The graph without the tensors no operator reads or writes, and each tensor's new index
    /// (`None`: dropped); the operators and the sharding stay as they are.
    pub fn without_unused_tensors(&self) -> (KernelGraph, Vec<Option<usize>>) {
        let mut used = vec![false; self.tensors.len()];
        for (_, op) in self.ops.iter() {
            for t in op.inputs.iter().chain(&op.outputs) {
                used[t.index()] = true;
            }
        }
        let mut out = KernelGraph {
            sharding: self.sharding.clone(),
            ..KernelGraph::default()
        };
        let mut map = vec![None; self.tensors.len()];
        for (h, t) in self.tensors.iter() {
            if used[h.index()] {
                map[h.index()] = Some(out.tensors.append(t.clone()).index());
            }
        }
        let at = |t: &Handle<DTensor>| Handle::from_index(map[t.index()].expect("used"));
        for (_, op) in self.ops.iter() {
            out.ops.append(KnOp {
                inputs: op.inputs.iter().map(at).collect(),
                outputs: op.outputs.iter().map(at).collect(),
                ..op.clone()
            });
        }
        (out, map)
    }

    /// The operator that defines `t`, if any.
    pub fn producer(&self, t: Handle<DTensor>) -> Option<Handle<KnOp>> {
        self.ops
            .iter()
            .find(|(_, op)| op.outputs.contains(&t))
            .map(|(h, _)| h)
    }

    /// The customized operators, in order.
    pub fn customized_ops(&self) -> impl Iterator<Item = (Handle<KnOp>, &TbGraph)> {
        self.ops.iter().filter_map(|(h, op)| match &op.kind {
            KnOpKind::Customized(tb) => Some((h, tb.as_ref())),
            _ => None,
        })
    }

    /// Number of operators that become kernels (everything but inputs and outputs).
    pub fn num_kernels(&self) -> usize {
        self.ops
            .iter()
            .filter(|(_, op)| !matches!(op.kind, KnOpKind::Input { .. } | KnOpKind::Output { .. }))
            .count()
    }

    /// Forgets every recorded guid (of DTensors and of every threadblock graph's STensors), so
    /// that graphs can be compared by structure alone.
    pub fn clear_guids(&mut self) {
        let handles: Vec<_> = self.tensors.handles().collect();
        for h in handles {
            self.tensors[h].guid = None;
        }
        let ops: Vec<_> = self.ops.handles().collect();
        for h in ops {
            if let KnOpKind::Customized(tb) = &mut self.ops[h].kind {
                let ts: Vec<_> = tb.tensors.handles().collect();
                for t in ts {
                    tb.tensors[t].guid = None;
                }
            }
        }
    }

    /// The element types used by the graph's tensors, sorted and deduplicated.
    pub fn dtypes(&self) -> Vec<DType> {
        let mut v: Vec<DType> = self.tensors.iter().map(|(_, t)| t.dtype).collect();
        v.sort();
        v.dedup();
        v
    }
}
