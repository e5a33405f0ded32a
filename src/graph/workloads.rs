//! Builder-made µGraphs of workload classes the corpus lacks, for tests, GPU checks and
//! benchmarks: the decode-time gated linear layer (M = 1 or 8 rows) with grids smaller than the
//! GPU, the class the sm_90a cluster split is for.

use super::builder::{GraphBuilder, TbGraphBuilder};
use super::{AccumKind, DType, GraphError, KernelGraph, ValidationErrors};

/// Why a workload graph could not be built (a bug in this module, not a user error).
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// A builder call failed.
    #[error(transparent)]
    Build(#[from] GraphError),
    /// The finished graph is invalid.
    #[error("{0}")]
    Invalid(#[from] ValidationErrors),
}

/// Decode-time linear layers at Qwen2.5 sizes: (K, N, blocks) with N / blocks columns per block
/// and grids of 32–86 blocks (fewer than the 132 SMs of an H100/H200).
pub const DECODE_SHAPES: [(usize, usize, usize); 4] = [
    (2048, 22016, 86),
    (18944, 3584, 56),
    (11008, 2048, 32),
    (3584, 4608, 72),
];

/// Iterations of the decode graphs' for-loop (over K).
pub const DECODE_FORLOOP: usize = 64;

/// (silu(X) ⊙ Y) · W for X, Y [m, k] and W [k, n] in `dtype`: one customized operator of `blocks`
/// blocks of 128 threads, each owning n / blocks columns, its for-loop of `forloop` iterations
/// streaming k / forloop columns of X and Y and rows of W into a summing accumulator.
pub fn decode_gated_linear(
    m: usize,
    k: usize,
    n: usize,
    blocks: usize,
    forloop: usize,
    dtype: DType,
) -> Result<KernelGraph, WorkloadError> {
    let mut g = GraphBuilder::new();
    let x = g.new_input(&[m, k], dtype)?;
    let y = g.new_input(&[m, k], dtype)?;
    let w = g.new_input(&[k, n], dtype)?;
    let mut tb = TbGraphBuilder::new([blocks, 1, 1], [128, 1, 1], forloop);
    let tx = tb.new_input(&g, x, [-1, -1, -1], 1)?;
    let ty = tb.new_input(&g, y, [-1, -1, -1], 1)?;
    let tw = tb.new_input(&g, w, [1, -1, -1], 0)?;
    let s = tb.silu(tx)?;
    let p = tb.mul(s, ty)?;
    let c = tb.matmul(p, tw)?;
    let acc = tb.forloop_accum(c, AccumKind::Nored)?;
    tb.new_output(acc, [1, -1, -1])?;
    let outs = g.customized(tb)?;
    g.mark_output(outs[0])?;
    Ok(g.build()?)
}

/// Every decode graph: (file stem, graph) for M ∈ {1, 8}, bf16 and fp16, and [`DECODE_SHAPES`].
pub fn decode_graphs() -> Result<Vec<(String, KernelGraph)>, WorkloadError> {
    let mut v = Vec::new();
    for m in [1, 8] {
        for dtype in [DType::BF16, DType::F16] {
            for (k, n, blocks) in DECODE_SHAPES {
                let name = format!("decode_m{m}_{dtype}_{k}x{n}");
                v.push((
                    name,
                    decode_gated_linear(m, k, n, blocks, DECODE_FORLOOP, dtype)?,
                ));
            }
        }
    }
    Ok(v)
}
