//! Golden emission of builder-made kernel-level graphs: every kernel operator, odd shapes,
//! broadcasting, non-contiguous strides, fp16/bf16/fp32/fp64/i32. For each graph the golden
//! folder keeps its Mirage JSON (`golden/kernel/NAME.json`), the generated file
//! (`NAME.sm_80.cu`) and the launch plan (`NAME.sm_80.plan.json`); `tests/cuda_compile.rs`
//! compiles every golden `.cu` with nvcc and NVRTC. Re-bless with `MUCC_BLESS=1`.

mod common;

use common::golden;
use mucc::graph::mirage_json::{ExportOptions, graph_to_json};
use mucc::graph::{DType, GraphBuilder, KernelGraph};
use mucc::sched::Options;
use mucc::target::{Arch, Target};
use mucc::{ImportOptions, parse_str};

type Build = fn() -> KernelGraph;

fn unary_chain_f16() -> KernelGraph {
    let mut g = GraphBuilder::new();
    let x = g.new_input(&[3, 50, 783], DType::F16).unwrap();
    let a = g.exp(x).unwrap();
    let b = g.square(a).unwrap();
    let c = g.sqrt(b).unwrap();
    let d = g.silu(c).unwrap();
    let e = g.sigmoid(d).unwrap();
    let f = g.gelu(e).unwrap();
    let h = g.relu(f).unwrap();
    let i = g.clamp(h, 0.25, 0.75).unwrap();
    let j = g.mul_scalar(i, 1.5).unwrap();
    let k = g.log(j).unwrap();
    // An unbounded side: spelled as the runtime's infinity, not a C++ `-inf` literal.
    let l = g.clamp(k, f64::NEG_INFINITY, 0.0).unwrap();
    g.mark_output(l).unwrap();
    g.mark_output(d).unwrap();
    g.build().unwrap()
}

fn binary_broadcast_bf16() -> KernelGraph {
    let mut g = GraphBuilder::new();
    let a = g.new_input(&[32, 16, 64], DType::BF16).unwrap();
    let b = g.new_input(&[32, 16, 1], DType::BF16).unwrap();
    let c = g.new_input(&[1, 16, 64], DType::BF16).unwrap();
    let s = g.add(a, b).unwrap();
    let t = g.sub(s, c).unwrap();
    let u = g.mul(t, b).unwrap();
    let v = g.div(u, b).unwrap();
    // A positive base, so that pow is defined everywhere.
    let e = g.exp(v).unwrap();
    let w = g.pow(e, c).unwrap();
    g.mark_output(w).unwrap();
    g.build().unwrap()
}

fn outer_product_f32() -> KernelGraph {
    let mut g = GraphBuilder::new();
    let a = g.new_input(&[1, 1, 4096], DType::F32).unwrap();
    let b = g.new_input(&[1, 4, 1], DType::F32).unwrap();
    let c = g.mul(a, b).unwrap();
    g.mark_output(c).unwrap();
    g.build().unwrap()
}

fn reductions_f16() -> KernelGraph {
    let mut g = GraphBuilder::new();
    let x = g.new_input(&[3, 50, 783], DType::F16).unwrap();
    let r0 = g.reduction(x, 0).unwrap();
    let r1 = g.reduction(x, 1).unwrap();
    let r2 = g.reduction(x, 2).unwrap();
    let y = g.new_input(&[4, 16, 512], DType::F16).unwrap();
    let r3 = g.reduction_to(y, 2, 64).unwrap();
    for t in [r0, r1, r2, r3] {
        g.mark_output(t).unwrap();
    }
    g.build().unwrap()
}

fn rms_norm_f32() -> KernelGraph {
    let mut g = GraphBuilder::new();
    let x = g.new_input(&[16, 4096], DType::F32).unwrap();
    let y = g.new_input(&[4, 8, 60], DType::F32).unwrap();
    let a = g.rms_norm(x, 1).unwrap();
    let b = g.rms_norm(y, 2).unwrap();
    g.mark_output(a).unwrap();
    g.mark_output(b).unwrap();
    g.build().unwrap()
}

fn concat_split_chunk_f16() -> KernelGraph {
    let mut g = GraphBuilder::new();
    let a = g.new_input(&[16, 256], DType::F16).unwrap();
    let b = g.new_input(&[16, 16], DType::F16).unwrap();
    let c = g.concat(&[a, b], 1).unwrap(); // [16, 272]
    let parts = g.split(c, 1, &[100, 172]).unwrap();
    let chunks = g.chunk(c, 0, 4).unwrap(); // 4 × [4, 272]
    let d = g.concat(&[chunks[3], chunks[0]], 0).unwrap(); // [8, 272]
    g.mark_output(parts[1]).unwrap();
    g.mark_output(d).unwrap();
    g.build().unwrap()
}

fn matmul_f16() -> KernelGraph {
    let mut g = GraphBuilder::new();
    let x = g.new_input(&[8, 512], DType::F16).unwrap();
    let w = g.new_input(&[512, 256], DType::F16).unwrap();
    let y = g.matmul(x, w).unwrap();
    g.mark_output(y).unwrap();
    g.build().unwrap()
}

fn matmul_batched_colmajor_bf16() -> KernelGraph {
    let mut g = GraphBuilder::new();
    let q = g.new_input(&[32, 16, 64], DType::BF16).unwrap();
    // K stored column-major in its matrix dims, as the Qwen weights are.
    let k = g
        .new_input_strided(&[32, 64, 1024], &[65536, 1, 64], DType::BF16)
        .unwrap();
    let s = g.matmul(q, k).unwrap();
    g.mark_output(s).unwrap();
    g.build().unwrap()
}

fn matmul_odd_f32() -> KernelGraph {
    let mut g = GraphBuilder::new();
    let a = g.new_input(&[3, 50], DType::F32).unwrap();
    let b = g.new_input(&[50, 783], DType::F32).unwrap();
    let c = g.matmul(a, b).unwrap();
    g.mark_output_strided(c, &[1, 3]).unwrap();
    g.build().unwrap()
}

fn strided_io_f16() -> KernelGraph {
    let mut g = GraphBuilder::new();
    // Padded rows, and a column-major input.
    let a = g.new_input_strided(&[3, 50], &[64, 1], DType::F16).unwrap();
    let b = g.new_input_strided(&[3, 50], &[1, 3], DType::F16).unwrap();
    let c = g.add(a, b).unwrap();
    let d = g.exp(c).unwrap();
    g.mark_output_strided(d, &[56, 1]).unwrap();
    g.build().unwrap()
}

fn attention_f16() -> KernelGraph {
    // exp(Q·K) / Σ exp(Q·K) · V (mha_bs1 written with kernel operators).
    let mut g = GraphBuilder::new();
    let q = g.new_input(&[32, 16, 64], DType::F16).unwrap();
    let k = g.new_input(&[32, 64, 4096], DType::F16).unwrap();
    let v = g.new_input(&[32, 4096, 64], DType::F16).unwrap();
    let s = g.matmul(q, k).unwrap();
    let e = g.exp(s).unwrap();
    let d = g.reduction(e, 2).unwrap();
    let o = g.matmul(e, v).unwrap();
    let r = g.div(o, d).unwrap();
    g.mark_output(r).unwrap();
    g.build().unwrap()
}

fn gated_mlp_bf16() -> KernelGraph {
    let mut g = GraphBuilder::new();
    let x = g.new_input(&[8, 512], DType::BF16).unwrap();
    let w1 = g.new_input(&[512, 1024], DType::BF16).unwrap();
    let w2 = g.new_input(&[512, 1024], DType::BF16).unwrap();
    let a = g.matmul(x, w1).unwrap();
    let b = g.matmul(x, w2).unwrap();
    let s = g.silu(a).unwrap();
    let o = g.mul(s, b).unwrap();
    g.mark_output(o).unwrap();
    g.build().unwrap()
}

fn aliases_and_allreduce_f64() -> KernelGraph {
    let mut g = GraphBuilder::new();
    let x = g.new_input(&[7, 13], DType::F64).unwrap();
    let e = g.exp(x).unwrap();
    let y = g.all_reduce(e).unwrap();
    // An input as an output, one tensor as two outputs, an identity all-reduce.
    g.mark_output(x).unwrap();
    g.mark_output(y).unwrap();
    g.mark_output_strided(y, &[1, 7]).unwrap();
    g.build().unwrap()
}

fn integers_i32() -> KernelGraph {
    let mut g = GraphBuilder::new();
    let a = g.new_input(&[5, 40], DType::I32).unwrap();
    let b = g.new_input(&[5, 1], DType::I32).unwrap();
    let c = g.mul(a, b).unwrap();
    let d = g.relu(c).unwrap();
    let e = g.reduction(d, 1).unwrap();
    g.mark_output(e).unwrap();
    g.build().unwrap()
}

/// A tensor-parallel MLP on 2 GPUs, kernel-level only: X replicated, W1 split by columns, W2
/// by rows, Y = allreduce(silu(X·W1)·W2). The host entry takes an NCCL communicator.
fn tensor_parallel_mlp_2gpu_bf16() -> KernelGraph {
    let mut g = GraphBuilder::new();
    g.set_gpu_mesh(mucc::graph::GpuMesh::line(2)).unwrap();
    let x = g
        .new_input_sharded(&[8, 256], DType::BF16, [-1, -1, -1])
        .unwrap();
    let w1 = g
        .new_input_sharded(&[256, 512], DType::BF16, [1, -1, -1])
        .unwrap();
    let w2 = g
        .new_input_sharded(&[512, 256], DType::BF16, [0, -1, -1])
        .unwrap();
    let h = g.matmul(x, w1).unwrap();
    let a = g.silu(h).unwrap();
    let p = g.matmul(a, w2).unwrap();
    let y = g.all_reduce(p).unwrap();
    g.mark_output(y).unwrap();
    g.build().unwrap()
}

/// Every golden graph: (name, builder).
pub const GRAPHS: &[(&str, Build)] = &[
    ("unary_chain_f16", unary_chain_f16),
    ("binary_broadcast_bf16", binary_broadcast_bf16),
    ("outer_product_f32", outer_product_f32),
    ("reductions_f16", reductions_f16),
    ("rms_norm_f32", rms_norm_f32),
    ("concat_split_chunk_f16", concat_split_chunk_f16),
    ("matmul_f16", matmul_f16),
    ("matmul_batched_colmajor_bf16", matmul_batched_colmajor_bf16),
    ("matmul_odd_f32", matmul_odd_f32),
    ("strided_io_f16", strided_io_f16),
    ("attention_f16", attention_f16),
    ("gated_mlp_bf16", gated_mlp_bf16),
    ("aliases_and_allreduce_f64", aliases_and_allreduce_f64),
    ("integers_i32", integers_i32),
    (
        "tensor_parallel_mlp_2gpu_bf16",
        tensor_parallel_mlp_2gpu_bf16,
    ),
];

#[test]
fn kernel_level_goldens() {
    for &(name, build) in GRAPHS {
        let g = build();
        // The JSON input, and the emission from it (so the golden pair stands on its own).
        let json =
            serde_json::to_string_pretty(&graph_to_json(&g, &ExportOptions::default()).unwrap())
                .unwrap()
                + "\n";
        golden(&format!("kernel/{name}.json"), &json);
        let back = parse_str(&json, None, &ImportOptions::default()).unwrap();
        let g = &back.graphs[0].graph;
        back.graphs[0].validate().unwrap();
        let opts = Options {
            target: Target::new(Arch::Sm80),
            solve: Default::default(),
            path: Default::default(),
            dependent_launch: false,
            symbols: Default::default(),
            cluster_split: true,
            cluster_push: true,
            cluster_combine: false,
            last_block_combine: false,
            grid_split: Default::default(),
            cta: Default::default(),
            register_pipes: true,
            register_rows: true,
            wgmma: true,
            tma: true,
            fuse_matmuls: true,
            online_softmax: Default::default(),
            fold_key_splits: Default::default(),
            all_reduce: Default::default(),
            max_stages: None,
            resident_blocks: None,
            refine_loops: Default::default(),
        };
        let (_, e) =
            mucc::transpile::transpile(g, &opts, &format!("golden/kernel/{name}.json, graph 0"))
                .unwrap();
        golden(&format!("kernel/{name}.sm_80.cu"), &e.source);
        golden(
            &format!("kernel/{name}.sm_80.plan.json"),
            &(serde_json::to_string_pretty(&e.launch).unwrap() + "\n"),
        );
        // Emission is deterministic.
        let (_, again) =
            mucc::transpile::transpile(g, &opts, &format!("golden/kernel/{name}.json, graph 0"))
                .unwrap();
        assert_eq!(again.source, e.source);
    }
}

#[test]
fn a_long_source_name_keeps_the_line_limit() {
    // The header comment names the source; a long path wraps instead of passing the limit.
    let source = format!(
        "/{}/graphs.json, graph 12",
        "very_long_directory_name/".repeat(12)
    );
    let opts = Options::for_target(Target::new(Arch::Sm90a));
    let (_, e) = mucc::transpile::transpile(&unary_chain_f16(), &opts, &source).unwrap();
    let limit = mucc::emit::cxx::MAX_LINE;
    assert!(e.source.lines().all(|l| l.len() <= limit), "{}", e.source);
    let header: String = e
        .source
        .lines()
        .take_while(|l| !l.starts_with("// target:"))
        .skip(1)
        .map(|l| l.trim_start_matches("// source:").trim_start_matches("//"))
        .collect();
    // Nothing of the name is lost (breaks at spaces drop the space).
    assert_eq!(header.replace(' ', ""), source.replace(' ', ""));
}
