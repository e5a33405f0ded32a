//! The threadblock graph of a customized operator: shared-memory tiles (STensors) and the
//! per-block operators that run over a for-loop.

use super::arena::{Arena, Handle};
use super::dtype::DType;
use super::ops::{AccumKind, BinaryOp, DimMap, TbReduction, UnaryOp};
use super::shape::Shape;

/// A shared-memory tile.
#[derive(Clone, Debug, PartialEq)]
pub struct STensor {
    /// Per-block tile shape (same rank as the DTensor it derives from).
    pub shape: Shape,
    /// Element type.
    pub dtype: DType,
    /// Whether the tile exists after the for-loop (produced by an accumulator, or computed from
    /// such tiles), as opposed to once per iteration.
    pub after_accum: bool,
    /// The guid recorded in (or written to) Mirage JSON; diagnostic only.
    pub guid: Option<i64>,
}

/// A threadblock operator kind.
#[derive(Clone, Debug, PartialEq)]
pub enum TbOpKind {
    /// Loads a tile of the customized operator's input `input` (position in its input list).
    Input {
        /// Which input of the customized operator is read.
        input: usize,
        /// For each grid axis, the dim it partitions.
        imap: DimMap,
        /// The dim the for-loop walks, or `None` for a loop-invariant tile.
        forloop_dim: Option<usize>,
    },
    /// Stores an after-loop tile into the customized operator's output `output`.
    Output {
        /// Which output of the customized operator is written.
        output: usize,
        /// For each grid axis, the dim of the output it partitions.
        omap: DimMap,
    },
    /// C = A·B over the last two dims (all leading dims are 1).
    Matmul,
    /// Element-wise unary operator.
    Unary(UnaryOp),
    /// Element-wise binary operator with broadcasting.
    Binary(BinaryOp),
    /// A reduction over `dim`.
    Reduction {
        /// The reduced dim.
        dim: usize,
        /// Sum, strided to-dimx sum, or running max.
        kind: TbReduction,
    },
    /// x / sqrt(mean over the tile's last dim of x²); no ε, no weight.
    RmsNorm,
    /// A followed by B along `dim`.
    Concat {
        /// The concatenated dim.
        dim: usize,
    },
    /// A for-loop accumulator.
    Accum(AccumKind),
}

impl TbOpKind {
    /// Mirage-style name without the `tb_` prefix (`input`, `matmul`, `accum_nored`, …).
    pub fn name(&self) -> String {
        match self {
            TbOpKind::Input { .. } => "input".into(),
            TbOpKind::Output { .. } => "output".into(),
            TbOpKind::Matmul => "matmul".into(),
            TbOpKind::Unary(u) => u.name().into(),
            TbOpKind::Binary(b) => b.name().into(),
            TbOpKind::Reduction { dim, kind } => match kind {
                TbReduction::Sum => format!("reduction_{dim}"),
                TbReduction::ToDimx => format!("reduction_{dim}_to_dimx"),
                TbReduction::Max => format!("reduction_{dim}_max"),
                TbReduction::PlainMax => format!("reduction_{dim}_plain_max"),
            },
            TbOpKind::RmsNorm => "rms_norm".into(),
            TbOpKind::Concat { dim } => format!("concat_{dim}"),
            TbOpKind::Accum(k) => format!("accum_{}", k.name()),
        }
    }
}

/// A threadblock operator.
#[derive(Clone, Debug, PartialEq)]
pub struct TbOp {
    /// What the operator computes.
    pub kind: TbOpKind,
    /// Tiles read.
    pub inputs: Vec<Handle<STensor>>,
    /// Tiles defined.
    pub outputs: Vec<Handle<STensor>>,
}

/// The body of a customized operator: one CUDA thread block per grid point, each running the
/// operators over `forloop_range` iterations (see `mirage-graph-format.md` §4.3).
#[derive(Clone, Debug, PartialEq)]
pub struct TbGraph {
    /// Number of thread blocks along x, y, z.
    pub grid: [usize; 3],
    /// Threads per block along x, y, z (no semantic effect).
    pub block: [usize; 3],
    /// Number of for-loop iterations F ≥ 1.
    pub forloop_range: usize,
    /// Target extent of `*_to_dimx` reductions and redtox accumulators.
    pub reduction_dimx: usize,
    /// All tiles.
    pub tensors: Arena<STensor>,
    /// All operators, in a topological order.
    pub ops: Arena<TbOp>,
}

impl TbGraph {
    /// An empty threadblock graph.
    pub fn new(
        grid: [usize; 3],
        block: [usize; 3],
        forloop_range: usize,
        reduction_dimx: usize,
    ) -> Self {
        TbGraph {
            grid,
            block,
            forloop_range,
            reduction_dimx,
            tensors: Arena::new(),
            ops: Arena::new(),
        }
    }

    /// Total number of thread blocks (saturating).
    pub fn num_blocks(&self) -> usize {
        self.grid.iter().fold(1usize, |a, &b| a.saturating_mul(b))
    }

    /// Threads per block (saturating).
    pub fn num_threads(&self) -> usize {
        self.block.iter().fold(1usize, |a, &b| a.saturating_mul(b))
    }

    /// The operator that defines tile `t`, if any (a walk over the operators: code that asks
    /// for many tiles takes [`TbGraph::producers`] once).
    pub fn producer(&self, t: Handle<STensor>) -> Option<Handle<TbOp>> {
        self.ops
            .iter()
            .find(|(_, op)| op.outputs.contains(&t))
            .map(|(h, _)| h)
    }

    /// The output operators that write the kernel's output `j`, in order.
    pub fn output_writers(&self, j: usize) -> Vec<Handle<TbOp>> {
        self.ops
            .iter()
            .filter(|(_, op)| matches!(op.kind, TbOpKind::Output { output, .. } if output == j))
            .map(|(h, _)| h)
            .collect()
    }

    /// For every tile (by index), the operators that read it, in order, each once.
    pub fn readers(&self) -> Vec<Vec<Handle<TbOp>>> {
        let mut r = vec![Vec::new(); self.tensors.len()];
        for (h, op) in self.ops.iter() {
            for t in &op.inputs {
                if let Some(v) = r.get_mut(t.index())
                    && !v.contains(&h)
                {
                    v.push(h);
                }
            }
        }
        r
    }

    /// For every tile (by index), the operator that defines it — the first, as
    /// [`TbGraph::producer`] answers — in one pass over the operators.
    pub fn producers(&self) -> Vec<Option<Handle<TbOp>>> {
        let mut p = vec![None; self.tensors.len()];
        for (h, op) in self.ops.iter() {
            for &t in &op.outputs {
                if let Some(slot @ None) = p.get_mut(t.index()) {
                    *slot = Some(h);
                }
            }
        }
        p
    }
}
