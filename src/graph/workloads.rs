//! Builder-made µGraphs of workload classes the corpus lacks, for tests, GPU checks and
//! benchmarks: the decode-time gated linear layer (M = 1 or 8 rows) with grids smaller than the
//! GPU, the class the sm_90a cluster split is for; single-kernel attention blocks in the shape
//! register pipes serve (the corpus has them only split over two kernels); and tensor-parallel
//! (multi-GPU) MLP and attention blocks at Qwen2.5-7B sizes, each in two forms: kernel-level
//! operators (cuBLAS matmuls and element-wise kernels) and fused customized operators
//! (threadblock graphs); and row blocks of element-wise operators and RMS norms over a loop of
//! one iteration in the shapes register rows cover (`crate::sched::rows`).

use super::builder::{GraphBuilder, TbGraphBuilder};
use super::ops::{BinaryOp, UnaryOp};
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
    /// A tile size does not divide the per-GPU extent it cuts.
    #[error("{what}: {tile} does not divide the per-GPU extent {extent}")]
    Tile {
        /// Which tile size.
        what: &'static str,
        /// The tile size.
        tile: usize,
        /// The extent it cuts.
        extent: usize,
    },
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

/// One customized operator of attention without the running max (the µGraph form): a grid of
/// `heads` × `row_blocks` blocks of `threads` threads, each owning `rows` query rows of a head;
/// a for-loop of `iters` iterations over blocks of `keys` keys computing S = Q·Kᵀ, P = exp(S),
/// the row sums l += Σ P and O += P·V; after the loop O / l. Q [heads, rows·row_blocks, 64],
/// Kᵀ [heads, 64, keys·iters], V [heads, keys·iters, 64] in `dtype`.
pub fn attention_block(
    heads: usize,
    rows: usize,
    row_blocks: usize,
    keys: usize,
    iters: usize,
    threads: usize,
    dtype: DType,
) -> Result<KernelGraph, WorkloadError> {
    let (d, len) = (64, keys * iters);
    let mut g = GraphBuilder::new();
    let q = g.new_input(&[heads, rows * row_blocks, d], dtype)?;
    let kt = g.new_input(&[heads, d, len], dtype)?;
    let v = g.new_input(&[heads, len, d], dtype)?;
    let mut tb = TbGraphBuilder::new([heads, row_blocks, 1], [threads, 1, 1], iters);
    let tq = tb.new_input(&g, q, [0, 1, -1], -1)?;
    let tk = tb.new_input(&g, kt, [0, -1, -1], 2)?;
    let tv = tb.new_input(&g, v, [0, -1, -1], 1)?;
    let s = tb.matmul(tq, tk)?;
    let p = tb.exp(s)?;
    let l = tb.forloop_accum(p, AccumKind::RedLdSum)?;
    let pv = tb.matmul(p, tv)?;
    let o = tb.forloop_accum(pv, AccumKind::Nored)?;
    let out = tb.div(o, l)?;
    tb.new_output(out, [0, 1, -1])?;
    let outs = g.customized(tb)?;
    g.mark_output(outs[0])?;
    Ok(g.build()?)
}

/// The attention blocks of [`attention_block`] that GPU checks run, as (file stem, graph), in
/// f16 and bf16: (heads, rows, row blocks, keys per iteration, iterations, threads) — 4 warps
/// on 64 rows (one 16-row tile per warp), 4 warps on 128 rows (two per warp), small grids
/// (cluster split on sm_90a), grids of 2–4 blocks per SM.
pub const ATTENTION_BLOCKS: [(usize, usize, usize, usize, usize, usize); 5] = [
    (8, 64, 4, 128, 4, 128),
    (16, 64, 16, 64, 8, 128),
    (32, 128, 8, 64, 4, 128),
    (64, 64, 8, 128, 2, 128),
    (4, 64, 2, 128, 8, 128),
];

/// Every attention block of [`ATTENTION_BLOCKS`] in f16 and bf16: (file stem, graph).
pub fn attention_blocks() -> Result<Vec<(String, KernelGraph)>, WorkloadError> {
    let mut v = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        for (heads, rows, row_blocks, keys, iters, threads) in ATTENTION_BLOCKS {
            let name = format!("attn_{dtype}_h{heads}_r{rows}x{row_blocks}_k{keys}x{iters}");
            v.push((
                name,
                attention_block(heads, rows, row_blocks, keys, iters, threads, dtype)?,
            ));
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

/// How the fused tensor-parallel gated MLP ([`tp_fused_gated_mlp`]) cuts its work: the tile a
/// block owns and the slice one for-loop iteration streams; the grids and for-loops follow from
/// them and the per-GPU extents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FusedMlpTiles {
    /// Kernel 1: columns of the local intermediate slice per block (grid x = local
    /// intermediate / this).
    pub inter_cols: usize,
    /// Kernel 1: rows of W_gate and W_up (hidden) per for-loop iteration.
    pub hidden_step: usize,
    /// Kernel 2: output (hidden) columns per block (grid x = hidden / this).
    pub hidden_cols: usize,
    /// Kernel 2: rows of the local W_down slice per for-loop iteration.
    pub inter_step: usize,
}

impl FusedMlpTiles {
    /// The tiles of the Qwen2.5-7B fused MLP files on `gpus` GPUs, chosen so that every GPU
    /// count runs kernels of the same shape (grids under the 132 SMs of an H100/H200, left to
    /// the sm_90a cluster split as in [`DECODE_SHAPES`]): kernel 1 has 74 blocks of
    /// local-intermediate / 74 columns (256 on one GPU, 128 on each of two) streaming about
    /// 16 KB of each gate/up weight per iteration (32 hidden rows on one GPU, 64 on two);
    /// kernel 2 has 56 blocks of 64 output columns and 148 iterations of local-intermediate /
    /// 148 rows of W_down (128 on one GPU, 64 on two). (Kernel 1 with 128 columns on one GPU
    /// would be 148 blocks, just over the SM count, which sm_90a plans at one CTA per SM: two
    /// waves.)
    pub fn qwen7b(gpus: usize) -> FusedMlpTiles {
        let local = QWEN7B_INTERMEDIATE / gpus.max(1);
        let inter_cols = (local / 74).max(1);
        FusedMlpTiles {
            inter_cols,
            hidden_step: (8192 / inter_cols).clamp(16, 64),
            hidden_cols: 64,
            inter_step: (local / 148).max(1),
        }
    }
}

/// Blocks (or iterations) of `tile` over `extent`.
fn count(what: &'static str, extent: usize, tile: usize) -> Result<usize, WorkloadError> {
    if tile == 0 || !extent.is_multiple_of(tile) {
        return Err(WorkloadError::Tile { what, tile, extent });
    }
    Ok(extent / tile)
}

/// The tensor-parallel gated MLP of [`tp_gated_mlp`] (same inputs, same sharding, same
/// all-reduce, same function) built from two customized operators per GPU:
/// - kernel 1: H = silu(X·W_gate) ⊙ (X·W_up) for the GPU's intermediate slice; a grid over its
///   columns, a for-loop over the hidden rows summing both products into accumulators, the
///   gating applied once after the loop;
/// - kernel 2: the partial output H·W_down [m, hidden]; a grid over the output columns, a
///   for-loop over the rows of the GPU's W_down slice (the form of [`decode_gated_linear`]);
///
/// then one all-reduce of the partial outputs. Blocks of 128 threads; `tiles` sets the tile
/// sizes.
pub fn tp_fused_gated_mlp(
    gpus: usize,
    m: usize,
    (hidden, inter): (usize, usize),
    tiles: FusedMlpTiles,
    dtype: DType,
) -> Result<KernelGraph, WorkloadError> {
    let mut g = GraphBuilder::new();
    g.set_gpu_mesh(super::GpuMesh::line(gpus))?;
    let x = g.new_input_sharded(&[m, hidden], dtype, [-1, -1, -1])?;
    let wg = g.new_input_sharded(&[hidden, inter], dtype, [1, -1, -1])?;
    let wu = g.new_input_sharded(&[hidden, inter], dtype, [1, -1, -1])?;
    let wd = g.new_input_sharded(&[inter, hidden], dtype, [0, -1, -1])?;
    let local = inter / gpus;
    let blocks = count("intermediate columns per block", local, tiles.inter_cols)?;
    let iters = count("hidden rows per iteration", hidden, tiles.hidden_step)?;
    let mut tb = TbGraphBuilder::new([blocks, 1, 1], [128, 1, 1], iters);
    let tx = tb.new_input(&g, x, [-1, -1, -1], 1)?;
    let tg = tb.new_input(&g, wg, [1, -1, -1], 0)?;
    let tu = tb.new_input(&g, wu, [1, -1, -1], 0)?;
    let gate = tb.matmul(tx, tg)?;
    let up = tb.matmul(tx, tu)?;
    let gate = tb.forloop_accum(gate, AccumKind::Nored)?;
    let up = tb.forloop_accum(up, AccumKind::Nored)?;
    let act = tb.silu(gate)?;
    let h = tb.mul(act, up)?;
    tb.new_output(h, [1, -1, -1])?;
    let h = g.customized(tb)?[0];
    let blocks = count("hidden columns per block", hidden, tiles.hidden_cols)?;
    let iters = count("intermediate rows per iteration", local, tiles.inter_step)?;
    let mut tb = TbGraphBuilder::new([blocks, 1, 1], [128, 1, 1], iters);
    let th = tb.new_input(&g, h, [-1, -1, -1], 1)?;
    let tw = tb.new_input(&g, wd, [1, -1, -1], 0)?;
    let c = tb.matmul(th, tw)?;
    let acc = tb.forloop_accum(c, AccumKind::Nored)?;
    tb.new_output(acc, [1, -1, -1])?;
    let partial = g.customized(tb)?[0];
    let y = g.all_reduce(partial)?;
    g.mark_output_sharded(y, [-1, -1, -1])?;
    Ok(g.build()?)
}

/// How the fused tensor-parallel attention block ([`tp_fused_attention`]) cuts its work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FusedAttentionTiles {
    /// Kernel 1: blocks per head along the keys (grid y). With one, kernel 1 divides and
    /// kernel 2 is a plain linear; with more, kernel 2 sums their partial results first.
    pub key_splits: usize,
    /// Kernel 1: keys per for-loop iteration.
    pub key_step: usize,
    /// Kernel 2: output (hidden) columns per block (grid x = hidden / this).
    pub hidden_cols: usize,
}

impl FusedAttentionTiles {
    /// The tiles of the Qwen2.5-7B fused attention files (1024 keys), the same on any number of
    /// GPUs: kernel 1 has one block per head (28 on one GPU, 14 on each of two), 16 iterations
    /// of 64 keys, which the sm_90a plan spreads over a cluster of 8 CTAs; kernel 2 has 56
    /// blocks of 64 output columns looping over the GPU's heads. Measured on 2 × H100 against
    /// key splits (2 or 4 blocks per head, kernel 2 summing them in every block: that kernel
    /// then re-reads all splits' partials per block and did not scale, 20.1 µs on each of two
    /// GPUs against 19.6 on one) and against 16- and 32-key steps (docs/multi-gpu.md §5).
    pub fn qwen7b() -> FusedAttentionTiles {
        FusedAttentionTiles {
            key_splits: 1,
            key_step: 64,
            hidden_cols: 64,
        }
    }
}

/// The tensor-parallel attention block of [`tp_attention`] (same inputs, same sharding, same
/// function: exp without the running max, the µGraph form) built from two customized operators
/// per GPU:
/// - kernel 1: a grid of (local heads, key splits); each block loops over its keys, computing
///   E = exp(Q·Kᵀ/√d) per key tile and accumulating E·V (`Nored`) and ΣE (`RedLdSum`). With one
///   split it divides after the loop and writes the heads' outputs [heads, m, d]; with more,
///   its partial sums land side by side, [heads, m, splits·d] and [heads, m, splits];
/// - kernel 2: a grid over the output columns, a for-loop over the GPU's heads: per head it
///   (with several splits: sums the splits' partials — a reduction to `d` columns and a row
///   sum — and divides, then) multiplies by the head's W_o tile, accumulating the partial
///   output [1, m, hidden];
///
/// then one all-reduce of the partial outputs. Blocks of 128 threads; `tiles` sets the tile
/// sizes.
pub fn tp_fused_attention(
    gpus: usize,
    m: usize,
    len: usize,
    (heads, d): (usize, usize),
    hidden: usize,
    tiles: FusedAttentionTiles,
    dtype: DType,
) -> Result<KernelGraph, WorkloadError> {
    let mut g = GraphBuilder::new();
    g.set_gpu_mesh(super::GpuMesh::line(gpus))?;
    let heads_split = [0, -1, -1];
    let q = g.new_input_sharded(&[heads, m, d], dtype, heads_split)?;
    let kt = g.new_input_sharded(&[heads, d, len], dtype, heads_split)?;
    let v = g.new_input_sharded(&[heads, len, d], dtype, heads_split)?;
    let wo = g.new_input_sharded(&[heads, d, hidden], dtype, heads_split)?;
    let local = heads / gpus;
    let splits = tiles.key_splits;
    let per_block = count("key blocks per head", len, splits)?;
    let iters = count("keys per iteration", per_block, tiles.key_step)?;
    let mut tb = TbGraphBuilder::new([local, splits, 1], [128, 1, 1], iters);
    let tq = tb.new_input(&g, q, [0, -1, -1], -1)?;
    let tk = tb.new_input(&g, kt, [0, 2, -1], 2)?;
    let tv = tb.new_input(&g, v, [0, 1, -1], 1)?;
    let s = tb.matmul(tq, tk)?;
    let s = tb.mul_scalar(s, 1.0 / (d as f64).sqrt())?;
    let e = tb.exp(s)?;
    let sum = tb.forloop_accum(e, AccumKind::RedLdSum)?;
    let o = tb.matmul(e, tv)?;
    let o = tb.forloop_accum(o, AccumKind::Nored)?;
    let blocks = count("hidden columns per block", hidden, tiles.hidden_cols)?;
    // Kernel 2 starts from each head's output: written by kernel 1 (one split: it divides
    // after its loop), or the splits' partials summed and divided here.
    let (mut k2, p) = if splits == 1 {
        let p = tb.div(o, sum)?;
        tb.new_output(p, [0, -1, -1])?;
        let p = g.customized(tb)?[0];
        let mut k2 = TbGraphBuilder::new([blocks, 1, 1], [128, 1, 1], local);
        let tp = k2.new_input(&g, p, [-1, -1, -1], 0)?;
        (k2, tp)
    } else {
        tb.new_output(o, [0, 2, -1])?;
        tb.new_output(sum, [0, 2, -1])?;
        let outs = g.customized(tb)?;
        let mut k2 = TbGraphBuilder::new([blocks, 1, 1], [128, 1, 1], local).with_reduction_dimx(d);
        let to = k2.new_input(&g, outs[0], [-1, -1, -1], 0)?;
        let ts = k2.new_input(&g, outs[1], [-1, -1, -1], 0)?;
        let o = k2.reduction_to_dimx(to, 2)?;
        let sum = k2.reduction(ts, 2)?;
        let p = k2.div(o, sum)?;
        (k2, p)
    };
    let tw = k2.new_input(&g, wo, [2, -1, -1], 0)?;
    let z = k2.matmul(p, tw)?;
    let acc = k2.forloop_accum(z, AccumKind::Nored)?;
    k2.new_output(acc, [2, -1, -1])?;
    let partial = g.customized(k2)?[0];
    let y = g.all_reduce(partial)?;
    g.mark_output_sharded(y, [-1, -1, -1])?;
    Ok(g.build()?)
}

/// The tensor-parallel graphs of the multi-GPU check, on `gpus` GPUs at Qwen2.5-7B sizes:
/// the gated MLP and the attention block (1024 keys) for M ∈ {1, 8}, bf16 and fp16, each with
/// kernel-level operators (`tpN_mlp_*`, `tpN_attention_*`) and fused customized operators
/// (`tpN_fmlp_*`, `tpN_fattn_*`, with [`FusedMlpTiles::qwen7b`] and
/// [`FusedAttentionTiles::qwen7b`]).
pub fn tp_graphs(gpus: usize) -> Result<Vec<(String, KernelGraph)>, WorkloadError> {
    let mut v = Vec::new();
    let mlp = (QWEN7B_HIDDEN, QWEN7B_INTERMEDIATE);
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
            v.push((
                format!("tp{gpus}_fmlp_m{m}_{dtype}"),
                tp_fused_gated_mlp(gpus, m, mlp, FusedMlpTiles::qwen7b(gpus), dtype)?,
            ));
            v.push((
                format!("tp{gpus}_fattn_m{m}_{dtype}"),
                tp_fused_attention(
                    gpus,
                    m,
                    1024,
                    QWEN7B_HEADS,
                    QWEN7B_HIDDEN,
                    FusedAttentionTiles::qwen7b(),
                    dtype,
                )?,
            ));
        }
    }
    Ok(v)
}

/// A row block: inputs A, B of `shape` in `dtype`; one customized operator over `grid` blocks
/// (each grid axis partitions the dim `imap` names) with a loop of one iteration computing
/// rms(mul(unary(rms(A) + B), A)) through a summing accumulator, where `unary` is `op`.
pub fn row_block(
    shape: &[usize],
    grid: [usize; 3],
    imap: [i32; 3],
    op: UnaryOp,
    dtype: DType,
) -> Result<KernelGraph, WorkloadError> {
    let mut g = GraphBuilder::new();
    let a = g.new_input(shape, dtype)?;
    let b = g.new_input(shape, dtype)?;
    let mut tb = TbGraphBuilder::new(grid, [128, 1, 1], 1);
    let ta = tb.new_input(&g, a, imap, -1)?;
    let tbb = tb.new_input(&g, b, imap, -1)?;
    let na = tb.rms_norm(ta)?;
    let x = tb.binary(BinaryOp::Add, na, tbb)?;
    let y = tb.unary(op, x)?;
    let z = tb.binary(BinaryOp::Mul, y, ta)?;
    let w = tb.rms_norm(z)?;
    let acc = tb.forloop_accum(w, AccumKind::Nored)?;
    tb.new_output(acc, imap)?;
    let outs = g.customized(tb)?;
    g.mark_output(outs[0])?;
    Ok(g.build()?)
}

/// (file stem, shape, grid, input and output map, unary operator, element type) of a row block.
type RowCase = (
    &'static str,
    &'static [usize],
    [usize; 3],
    [i32; 3],
    UnaryOp,
    DType,
);

/// The row blocks GPU checks run, as (file stem, graph): one row of 4096 per block (nTrans's
/// shape), two and four rows per block, rows of 16,384 (two 16-byte runs per thread), f32
/// rows (4 elements per run), rank-3 tensors cut along two grid axes, in f16, bf16 and f32.
pub fn row_graphs() -> Result<Vec<(String, KernelGraph)>, WorkloadError> {
    let cases: [RowCase; 7] = [
        (
            "rows_f16_16x4096",
            &[16, 4096],
            [16, 1, 1],
            [0, -1, -1],
            UnaryOp::Silu,
            DType::F16,
        ),
        (
            "rows_bf16_64x2048_r2",
            &[64, 2048],
            [32, 1, 1],
            [0, -1, -1],
            UnaryOp::Sigmoid,
            DType::BF16,
        ),
        (
            "rows_f32_8x4096",
            &[8, 4096],
            [8, 1, 1],
            [0, -1, -1],
            UnaryOp::Square,
            DType::F32,
        ),
        (
            "rows_f16_4x16384",
            &[4, 16384],
            [4, 1, 1],
            [0, -1, -1],
            UnaryOp::Gelu,
            DType::F16,
        ),
        (
            "rows_f16_32x512_r4",
            &[32, 512],
            [8, 1, 1],
            [0, -1, -1],
            UnaryOp::MulScalar(0.5),
            DType::F16,
        ),
        (
            "rows_bf16_4x8x1024",
            &[4, 8, 1024],
            [4, 4, 1],
            [0, 1, -1],
            UnaryOp::Relu,
            DType::BF16,
        ),
        (
            "rows_f16_2x6x768",
            &[2, 6, 768],
            [3, 2, 1],
            [1, 0, -1],
            UnaryOp::Exp,
            DType::F16,
        ),
    ];
    cases
        .into_iter()
        .map(|(name, shape, grid, imap, op, dtype)| {
            Ok((name.to_string(), row_block(shape, grid, imap, op, dtype)?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::KnOpKind;

    /// (grid, for-loop) of each customized operator of `g`, in graph order.
    fn kernel_shapes(g: &KernelGraph) -> Vec<([usize; 3], usize)> {
        g.ops
            .iter()
            .filter_map(|(_, op)| match &op.kind {
                KnOpKind::Customized(tb) => Some((tb.grid, tb.forloop_range)),
                _ => None,
            })
            .collect()
    }

    /// The fused files have the kernel shapes docs/multi-gpu.md lists, for M 1 and 8 and both
    /// 16-bit types, next to the kernel-level files.
    #[test]
    fn fused_files_have_the_documented_kernel_shapes() {
        let expect = |gpus: usize, name: &str| -> Vec<([usize; 3], usize)> {
            match (gpus, name.contains("fmlp")) {
                (2, true) => vec![([74, 1, 1], 56), ([56, 1, 1], 148)],
                (1, true) => vec![([74, 1, 1], 112), ([56, 1, 1], 148)],
                (2, false) => vec![([14, 1, 1], 16), ([56, 1, 1], 14)],
                _ => vec![([28, 1, 1], 16), ([56, 1, 1], 28)],
            }
        };
        for gpus in [1, 2] {
            let all = tp_graphs(gpus).unwrap();
            assert_eq!(all.len(), 16);
            let fused: Vec<_> = all
                .iter()
                .filter(|(n, _)| n.contains("_fmlp_") || n.contains("_fattn_"))
                .collect();
            assert_eq!(fused.len(), 8);
            for (name, g) in fused {
                assert!(name.starts_with(&format!("tp{gpus}_")), "{name}");
                assert_eq!(kernel_shapes(g), expect(gpus, name), "{name}");
                assert_eq!(g.sharding.num_gpus(), gpus, "{name}");
            }
        }
    }
}
