//! Builder-made µGraphs of workload classes the corpus lacks, for tests, GPU checks and
//! benchmarks: the decode-time gated linear layer (M = 1 or 8 rows) with grids smaller than the
//! GPU, the class the sm_90a cluster split is for; and tensor-parallel (multi-GPU) MLP and
//! attention blocks at Qwen2.5-7B sizes.

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

/// Qwen2.5-7B's model width (hidden size).
pub const QWEN7B_HIDDEN: usize = 3584;
/// Qwen2.5-7B's MLP width (intermediate size).
pub const QWEN7B_INTERMEDIATE: usize = 18944;
/// Qwen2.5-7B's attention heads and head size.
pub const QWEN7B_HEADS: (usize, usize) = (28, 128);

/// A tensor-parallel gated MLP (Megatron style) on `gpus` GPUs, kernel-level operators only:
/// X [m, hidden] replicated, W_gate and W_up [hidden, inter] split by columns, W_down
/// [inter, hidden] by rows; every GPU computes its slice (silu(X·W_gate) ⊙ (X·W_up))·W_down and
/// one all-reduce sums the slices, so that every GPU holds Y = the unsharded MLP.
pub fn tp_gated_mlp(
    gpus: usize,
    m: usize,
    hidden: usize,
    inter: usize,
    dtype: DType,
) -> Result<KernelGraph, WorkloadError> {
    let mut g = GraphBuilder::new();
    g.set_gpu_mesh(super::GpuMesh::line(gpus))?;
    let x = g.new_input_sharded(&[m, hidden], dtype, [-1, -1, -1])?;
    let wg = g.new_input_sharded(&[hidden, inter], dtype, [1, -1, -1])?;
    let wu = g.new_input_sharded(&[hidden, inter], dtype, [1, -1, -1])?;
    let wd = g.new_input_sharded(&[inter, hidden], dtype, [0, -1, -1])?;
    let gate = g.matmul(x, wg)?;
    let up = g.matmul(x, wu)?;
    let act = g.silu(gate)?;
    let h = g.mul(act, up)?;
    let partial = g.matmul(h, wd)?;
    let y = g.all_reduce(partial)?;
    g.mark_output_sharded(y, [-1, -1, -1])?;
    Ok(g.build()?)
}

/// A tensor-parallel attention block on `gpus` GPUs, heads split across them: per head, scores
/// S = Q·Kᵀ scaled by 1/√d, P = exp(S) / Σ exp(S) over the `len` keys (the µGraph form, without
/// the running max), O = P·V, each head's share of the output projection O·W_o, summed over
/// the GPU's heads and then over the GPUs by one all-reduce. Q [heads, m, d], Kᵀ [heads, d, len],
/// V [heads, len, d] and W_o [heads, d, hidden] are split along the heads.
pub fn tp_attention(
    gpus: usize,
    m: usize,
    len: usize,
    (heads, d): (usize, usize),
    hidden: usize,
    dtype: DType,
) -> Result<KernelGraph, WorkloadError> {
    let mut g = GraphBuilder::new();
    g.set_gpu_mesh(super::GpuMesh::line(gpus))?;
    let heads_split = [0, -1, -1];
    let q = g.new_input_sharded(&[heads, m, d], dtype, heads_split)?;
    let kt = g.new_input_sharded(&[heads, d, len], dtype, heads_split)?;
    let v = g.new_input_sharded(&[heads, len, d], dtype, heads_split)?;
    let wo = g.new_input_sharded(&[heads, d, hidden], dtype, heads_split)?;
    let s = g.matmul(q, kt)?;
    let s = g.mul_scalar(s, 1.0 / (d as f64).sqrt())?;
    let e = g.exp(s)?;
    let sum = g.reduction(e, 2)?;
    let p = g.div(e, sum)?;
    let o = g.matmul(p, v)?;
    let z = g.matmul(o, wo)?;
    let local = g.reduction(z, 0)?;
    let y = g.all_reduce(local)?;
    g.mark_output_sharded(y, [-1, -1, -1])?;
    Ok(g.build()?)
}

/// The tensor-parallel graphs of the multi-GPU check, on `gpus` GPUs at Qwen2.5-7B sizes:
/// the gated MLP and the attention block (1024 keys) for M ∈ {1, 8}, bf16 and fp16.
pub fn tp_graphs(gpus: usize) -> Result<Vec<(String, KernelGraph)>, WorkloadError> {
    let mut v = Vec::new();
    for m in [1, 8] {
        for dtype in [DType::BF16, DType::F16] {
            v.push((
                format!("tp{gpus}_mlp_m{m}_{dtype}"),
                tp_gated_mlp(gpus, m, QWEN7B_HIDDEN, QWEN7B_INTERMEDIATE, dtype)?,
            ));
            v.push((
                format!("tp{gpus}_attention_m{m}_{dtype}"),
                tp_attention(gpus, m, 1024, QWEN7B_HEADS, QWEN7B_HIDDEN, dtype)?,
            ));
        }
    }
    Ok(v)
}
