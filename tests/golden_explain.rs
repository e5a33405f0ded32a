//! Golden `mucc explain` dumps of corpus graphs covering every operator kind of the corpus
//! (re-bless with `MUCC_BLESS=1`).

mod common;

use common::{corpus_dir, golden};
use mucc::sched::Options;
use mucc::target::{Arch, Target};
use mucc::{ImportOptions, read_file};

fn explain(file: &str, graph: usize, arch: Arch) -> String {
    let f = read_file(&corpus_dir().join(file), &ImportOptions::default()).unwrap();
    let g = &f.graphs[graph].graph;
    let opts = Options {
        target: Target::new(arch),
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
    let plan = mucc::sched::plan(g, &opts).unwrap();
    format!("{file} graph {graph}\n{}", mucc::explain::explain(g, &plan))
}

/// (file, graph, what it covers)
const CASES: &[(&str, usize, &str)] = &[
    (
        "single_gated_mlp.json",
        0,
        "matmul, accum_nored, silu, kn mul, pipelined inputs",
    ),
    ("gated_mlp.json", 2, "binary mul fused into a store"),
    ("lora.json", 0, "add, loop of 1"),
    (
        "legacy_checkpoint_lora.json",
        1,
        "concat, May-2024 accumulating output",
    ),
    (
        "gqa_bs1.json",
        0,
        "exp, red_ld_sum, redtox, div, loop-invariant input",
    ),
    ("mha_bs1.json", 0, "kn matmul, kn exp, kn div"),
    ("ntrans_bs1.json", 0, "rms_norm, add, mul"),
    ("rmsnorm_bs1.json", 0, "red_ld_rms"),
    (
        "qknorm_gqa_bs1.json",
        0,
        "qknorm: rms_norm with matmul and sqrt",
    ),
    ("single_mqa_bs1.json", 0, "two customized kernels"),
];

#[test]
fn explain_dumps_match_the_goldens() {
    for &(file, graph, _) in CASES {
        let stem = file.trim_end_matches(".json");
        golden(
            &format!("explain/{stem}.{graph}.sm_80.txt"),
            &explain(file, graph, Arch::Sm80),
        );
    }
    golden(
        "explain/single_gated_mlp.0.sm_90a.txt",
        &explain("single_gated_mlp.json", 0, Arch::Sm90a),
    );
}
