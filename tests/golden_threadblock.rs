//! Golden emission of threadblock kernels (customized operators): corpus graphs that together
//! use every threadblock operator kind of the corpus, and builder-made graphs for what the corpus
//! lacks — odd tiles (1×296 · 296×24, 3×50 · 50×13, 7×13), column-major inputs, bf16, fp32 FMA
//! matmuls, loops of 1 and 64 iterations, the online-softmax operators. For each graph the golden
//! folder keeps the generated file (`golden/threadblock/NAME.sm_80.cu`) and its launch plan
//! (`NAME.sm_80.plan.json`); builder graphs also keep their Mirage JSON (`NAME.json`), which
//! `scripts/gpu/check_graphs.sh` runs on a GPU. `tests/cuda_compile.rs` compiles every golden
//! `.cu` with nvcc and NVRTC. Re-bless with `MUCC_BLESS=1`.

mod common;

use common::golden;
use mucc::graph::mirage_json::{ExportOptions, graph_to_json};
use mucc::graph::ops::AccumKind;
use mucc::graph::{DType, GraphBuilder, KernelGraph, TbGraphBuilder};
use mucc::sched::Options;
use mucc::target::{Arch, Target};
use mucc::{ImportOptions, parse_str};

type Build = fn() -> KernelGraph;

/// One row times a 296×24 tile per block: M = 1 (zero-page rows), K = 296, N = 24.
fn matmul_1x296x24_f16() -> KernelGraph {
    let mut g = GraphBuilder::new();
    let x = g.new_input(&[1, 296], DType::F16).unwrap();
    let w = g.new_input(&[296, 96], DType::F16).unwrap();
    let mut tb = TbGraphBuilder::new([4, 1, 1], [128, 1, 1], 1);
    let tx = tb.new_input(&g, x, [-1, -1, -1], -1).unwrap();
    let tw = tb.new_input(&g, w, [1, -1, -1], -1).unwrap();
    let y = tb.matmul(tx, tw).unwrap();
    let a = tb.forloop_accum(y, AccumKind::Nored).unwrap();
    let s = tb.silu(a).unwrap();
    tb.new_output(s, [1, -1, -1]).unwrap();
    let outs = g.customized(tb).unwrap();
    g.mark_output(outs[0]).unwrap();
    g.build().unwrap()
}

/// 3×50 · 50×13 tiles over two iterations, bf16: no dim is a multiple of the MMA tile and K is
/// not a whole number of 16-byte chunks, so operands load element by element.
fn matmul_3x50x13_bf16() -> KernelGraph {
    let mut g = GraphBuilder::new();
    let a = g.new_input(&[6, 100], DType::BF16).unwrap();
    let b = g.new_input(&[100, 26], DType::BF16).unwrap();
    let mut tb = TbGraphBuilder::new([2, 2, 1], [64, 1, 1], 2);
    let ta = tb.new_input(&g, a, [0, -1, -1], 1).unwrap();
    let tbb = tb.new_input(&g, b, [-1, 1, -1], 0).unwrap();
    let c = tb.matmul(ta, tbb).unwrap();
    let acc = tb.forloop_accum(c, AccumKind::Nored).unwrap();
    tb.new_output(acc, [0, 1, -1]).unwrap();
    let outs = g.customized(tb).unwrap();
    g.mark_output(outs[0]).unwrap();
    g.build().unwrap()
}

/// 7×13 fp32 tiles: element-wise chain, rms_norm, a row sum, an FMA matmul (7×13 · 13×5).
fn tiles_7x13_f32() -> KernelGraph {
    tiles_7x13_f32_with(96)
}

/// The same with 100 threads, not a whole number of warps: rows are reduced one per thread (warp
/// shuffles need whole warps), and explain says so.
fn tiles_7x13_f32_100t() -> KernelGraph {
    tiles_7x13_f32_with(100)
}

fn tiles_7x13_f32_with(threads: usize) -> KernelGraph {
    let mut g = GraphBuilder::new();
    let x = g.new_input(&[14, 26], DType::F32).unwrap();
    let y = g.new_input(&[14, 26], DType::F32).unwrap();
    let w = g.new_input(&[13, 5], DType::F32).unwrap();
    let mut tb = TbGraphBuilder::new([2, 2, 1], [threads, 1, 1], 1);
    let tx = tb.new_input(&g, x, [0, 1, -1], -1).unwrap();
    let ty = tb.new_input(&g, y, [0, 1, -1], -1).unwrap();
    let tw = tb.new_input(&g, w, [-1, -1, -1], -1).unwrap();
    let e = tb.exp(tx).unwrap();
    // An unbounded clamp fused after exp: the runtime's infinity, not a C++ `-inf` literal.
    let e = tb.clamp(e, f64::NEG_INFINITY, 4.0).unwrap();
    let m = tb.mul(e, ty).unwrap();
    let n = tb.rms_norm(m).unwrap();
    let an = tb.forloop_accum(n, AccumKind::Nored).unwrap();
    let sum = tb.forloop_accum(m, AccumKind::RedLdSum).unwrap();
    let p = tb.matmul(tx, tw).unwrap();
    let ap = tb.forloop_accum(p, AccumKind::Nored).unwrap();
    tb.new_output(an, [0, 1, -1]).unwrap();
    tb.new_output(sum, [0, 1, -1]).unwrap();
    tb.new_output(ap, [0, 1, -1]).unwrap();
    let outs = g.customized(tb).unwrap();
    for o in outs {
        g.mark_output(o).unwrap();
    }
    g.build().unwrap()
}

/// Column-major A (M contiguous: `ldmatrix.trans`) and B (K contiguous: plain `ldmatrix`) over
/// four iterations, with a column-major output.
fn matmul_colmajor_f16() -> KernelGraph {
    let mut g = GraphBuilder::new();
    let a = g
        .new_input_strided(&[64, 256], &[1, 64], DType::F16)
        .unwrap();
    let b = g
        .new_input_strided(&[256, 128], &[1, 256], DType::F16)
        .unwrap();
    let mut tb = TbGraphBuilder::new([2, 1, 1], [128, 1, 1], 4);
    let ta = tb.new_input(&g, a, [-1, -1, -1], 1).unwrap();
    let tbb = tb.new_input(&g, b, [1, -1, -1], 0).unwrap();
    let c = tb.matmul(ta, tbb).unwrap();
    let acc = tb.forloop_accum(c, AccumKind::Nored).unwrap();
    tb.new_output(acc, [1, -1, -1]).unwrap();
    let outs = g.customized(tb).unwrap();
    g.mark_output_strided(outs[0], &[1, 64]).unwrap();
    g.build().unwrap()
}

/// 64 iterations (a software-pipelined K loop) with a row mean next to the matmul, bf16.
fn forloop_64_bf16() -> KernelGraph {
    let mut g = GraphBuilder::new();
    let x = g.new_input(&[16, 4096], DType::BF16).unwrap();
    let w = g.new_input(&[4096, 128], DType::BF16).unwrap();
    let mut tb = TbGraphBuilder::new([2, 1, 1], [128, 1, 1], 64);
    let tx = tb.new_input(&g, x, [-1, -1, -1], 1).unwrap();
    let tw = tb.new_input(&g, w, [1, -1, -1], 0).unwrap();
    let y = tb.matmul(tx, tw).unwrap();
    let acc = tb.forloop_accum(y, AccumKind::Nored).unwrap();
    let mean = tb.forloop_accum(tx, AccumKind::RedLdMean).unwrap();
    let o = tb.sub(acc, mean).unwrap();
    tb.new_output(o, [1, -1, -1]).unwrap();
    let outs = g.customized(tb).unwrap();
    g.mark_output(outs[0]).unwrap();
    g.build().unwrap()
}

/// The decode linear (silu(X) ⊙ Y) · W at M = 1, K = 18944, N = 3584 (56 blocks, 64
/// iterations), bf16: tiles of 296 rows of W and rows of 296 elements of X and Y, longer than a
/// TMA box dim, which sm_90a copies in slabs.
fn decode_m1_18944x3584_bf16() -> KernelGraph {
    mucc::graph::workloads::decode_gated_linear(1, 18944, 3584, 56, 64, DType::BF16).unwrap()
}

/// Attention with the online-softmax operators (running max, both rescaling accumulators) and
/// a strided to-dimx reduction, f16.
fn online_softmax_f16() -> KernelGraph {
    let (s, d, n, f) = (16, 64, 256, 4);
    let mut g = GraphBuilder::new();
    let q = g.new_input(&[2, s, d], DType::F16).unwrap();
    let k = g.new_input(&[2, d, n], DType::F16).unwrap();
    let v = g.new_input(&[2, n, d], DType::F16).unwrap();
    let mut tb = TbGraphBuilder::new([2, 1, 1], [128, 1, 1], f).with_reduction_dimx(16);
    let tq = tb.new_input(&g, q, [0, -1, -1], -1).unwrap();
    let tk = tb.new_input(&g, k, [0, -1, -1], 2).unwrap();
    let tv = tb.new_input(&g, v, [0, -1, -1], 1).unwrap();
    let sc = tb.matmul(tq, tk).unwrap();
    let (m, diff) = tb.reduction_max(sc, 2).unwrap();
    let centred = tb.sub(sc, m).unwrap();
    let p = tb.exp(centred).unwrap();
    let r = tb.exp(diff).unwrap();
    let l = tb
        .forloop_accum_rescale(p, r, AccumKind::RedLdSumRescale)
        .unwrap();
    let pv = tb.matmul(p, tv).unwrap();
    let o = tb
        .forloop_accum_rescale(pv, r, AccumKind::NoredRescale)
        .unwrap();
    let out = tb.div(o, l).unwrap();
    tb.new_output(out, [0, -1, -1]).unwrap();
    let pd = tb.reduction_to_dimx(p, 2).unwrap();
    let sx = tb.forloop_accum(pd, AccumKind::Nored).unwrap();
    tb.new_output(sx, [0, -1, -1]).unwrap();
    let outs = g.customized(tb).unwrap();
    for o in outs {
        g.mark_output(o).unwrap();
    }
    g.build().unwrap()
}

/// Every builder-made golden graph: (name, builder).
pub const GRAPHS: &[(&str, Build)] = &[
    ("matmul_1x296x24_f16", matmul_1x296x24_f16),
    ("matmul_3x50x13_bf16", matmul_3x50x13_bf16),
    ("tiles_7x13_f32", tiles_7x13_f32),
    ("tiles_7x13_f32_100t", tiles_7x13_f32_100t),
    ("matmul_colmajor_f16", matmul_colmajor_f16),
    ("forloop_64_bf16", forloop_64_bf16),
    ("online_softmax_f16", online_softmax_f16),
    ("decode_m1_18944x3584_bf16", decode_m1_18944x3584_bf16),
];

/// Corpus graphs with golden emission: (file, graph, what it covers). Together they use every
/// threadblock operator kind of the corpus.
pub const CORPUS: &[(&str, usize, &str)] = &[
    (
        "single_gated_mlp.json",
        0,
        "matmul, silu, nored accumulators, 64-iteration pipeline",
    ),
    ("gated_mlp.json", 2, "tb mul of two matmul accumulators"),
    ("lora.json", 0, "tb add"),
    (
        "legacy_checkpoint_lora.json",
        1,
        "tb concat (dims 0 and 1), May-2024 schema",
    ),
    ("gqa_bs1.json", 0, "exp, red_ld_sum, strided redtox, div"),
    ("mha_bs1.json", 0, "attention, two kernels"),
    ("mqa_bs1.json", 0, "attention"),
    ("single_mqa_bs1.json", 0, "attention, single candidate"),
    (
        "mqa_bs8.json",
        3,
        "register pipe: exp(Q·K) packed in registers into ·V, row sums by shuffles",
    ),
    ("ntrans_bs1.json", 0, "rms_norm"),
    ("ntrans_bs1.json", 2, "red_ld_rms"),
    (
        "rmsnorm_bs1.json",
        0,
        "red_ld_rms beside a matmul, final division",
    ),
    (
        "qknorm_gqa_bs1.json",
        0,
        "rms_norm into reductions, post-loop matmul of 4096 columns",
    ),
];

/// Hopper goldens (`NAME.sm_90a.*`): kernels whose for-loop splits over a cluster (with TMA
/// loads where the tiles allow), and a programmatic dependent launch — (file or builder graph,
/// graph, CTAs per cluster of one kernel, what it covers). Planned with `--dependent-launch`
/// (off by default; it changes only multi-kernel graphs).
pub const HOPPER: &[(&str, usize, usize, &str)] = &[
    (
        "rmsnorm_bs1.json",
        2,
        2,
        "cluster split: RMS and matmul partials summed before the root",
    ),
    (
        "gated_mlp.json",
        0,
        2,
        "cluster split: two register accumulators written back, then folded",
    ),
    (
        "forloop_64_bf16",
        0,
        8,
        "cluster split of 8 CTAs: nored and mean partials, the mean divided after the fold",
    ),
    (
        "mha_bs1.json",
        1,
        2,
        "two threadblock kernels: the first triggers, the second launches programmatically and \
         waits; K tiles by TMA, V tiles keep cp.async (their swizzle has no TMA mode)",
    ),
    (
        "mqa_bs8.json",
        3,
        1,
        "a register pipe beside TMA loads (3 resident CTAs), no cluster split",
    ),
    (
        "decode_m1_18944x3584_bf16",
        0,
        4,
        "TMA boxes over 256 copied in slabs: 296 rows of W as 256 + 40 under the 128-byte \
         swizzle, rows of 296 elements as 256 + 40, two tensor maps each",
    ),
];

fn opts(arch: Arch) -> Options {
    Options {
        target: Target::new(arch),
        solve: Default::default(),
        path: Default::default(),
        dependent_launch: true,
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
    }
}

fn emit_golden(name: &str, g: &KernelGraph, what: &str) {
    emit_golden_for(name, g, what, Arch::Sm80);
}

fn emit_golden_for(name: &str, g: &KernelGraph, what: &str, arch: Arch) {
    emit_golden_with(name, g, what, &opts(arch));
}

fn emit_golden_with(name: &str, g: &KernelGraph, what: &str, o: &Options) {
    let arch = o.target.arch;
    let (p, e) = mucc::transpile::transpile(g, o, what).unwrap_or_else(|e| panic!("{name}: {e}"));
    golden(
        &format!("threadblock/{name}.{arch}.explain.txt"),
        &mucc::explain::explain(g, &p),
    );
    golden(&format!("threadblock/{name}.{arch}.cu"), &e.source);
    golden(
        &format!("threadblock/{name}.{arch}.plan.json"),
        &(serde_json::to_string_pretty(&e.launch).unwrap() + "\n"),
    );
    // Emission is deterministic.
    let (_, again) = mucc::transpile::transpile(g, o, what).unwrap();
    assert_eq!(
        again.source, e.source,
        "{name}: emission is not deterministic"
    );
}

#[test]
fn builder_threadblock_goldens() {
    for &(name, build) in GRAPHS {
        let g = build();
        let json =
            serde_json::to_string_pretty(&graph_to_json(&g, &ExportOptions::default()).unwrap())
                .unwrap()
                + "\n";
        golden(&format!("threadblock/{name}.json"), &json);
        let back = parse_str(&json, None, &ImportOptions::default()).unwrap();
        back.graphs[0].validate().unwrap();
        emit_golden(
            name,
            &back.graphs[0].graph,
            &format!("golden/threadblock/{name}.json, graph 0"),
        );
    }
}

#[test]
fn corpus_threadblock_goldens() {
    for &(file, graph, _) in CORPUS {
        let f =
            mucc::read_file(&common::corpus_dir().join(file), &ImportOptions::default()).unwrap();
        let name = format!("{}.g{graph}", file.trim_end_matches(".json"));
        emit_golden(
            &name,
            &f.graphs[graph].graph,
            &format!("{file}, graph {graph}"),
        );
    }
}

#[test]
fn hopper_threadblock_goldens() {
    for &(source, graph, ctas, what) in HOPPER {
        let g = match GRAPHS.iter().find(|(n, _)| *n == source) {
            Some((_, build)) => build(),
            None => mucc::read_file(
                &common::corpus_dir().join(source),
                &ImportOptions::default(),
            )
            .unwrap()
            .graphs[graph]
                .graph
                .clone(),
        };
        let name = format!("{}.g{graph}", source.trim_end_matches(".json"));
        let (p, _) = mucc::transpile::transpile(&g, &opts(Arch::Sm90a), what).unwrap();
        let split: Vec<usize> = p.kernels.values().map(|k| k.split.ctas()).collect();
        assert!(
            split.contains(&ctas),
            "{name}: splits {split:?}, expected {ctas} CTAs ({what})"
        );
        emit_golden_for(&name, &g, what, Arch::Sm90a);
    }
}

/// Split attention combined in its clusters (`--cluster-combine`, off by default): mha_bs8's
/// graph 25 launches its attention kernel in clusters of its 4 key splits, which store the
/// combined output themselves; no combining kernel follows.
#[test]
fn cluster_combine_golden() {
    let f = mucc::read_file(
        &common::corpus_dir().join("mha_bs8.json"),
        &ImportOptions::default(),
    )
    .unwrap();
    let g = &f.graphs[25].graph;
    let mut o = opts(Arch::Sm90a);
    o.cluster_combine = true;
    // Folded key splits leave nothing to combine.
    o.fold_key_splits = mucc::sched::softmax::KeyFold::Off;
    let (p, e) = mucc::transpile::transpile(g, &o, "mha_bs8.json, graph 25").unwrap();
    let combined: Vec<_> = p
        .kernels
        .values()
        .filter_map(|k| k.cluster_combine.as_ref())
        .collect();
    assert_eq!(combined.len(), 1, "one kernel combines in its clusters");
    assert_eq!((combined[0].ctas, combined[0].axis), (4, 1));
    assert!(
        e.source.contains("__cluster_dims__(1, 4, 1)")
            && e.source.contains("mucc::tb::cluster_softmax_combine<")
            && !e.source.contains("mucc::kn::softmax_combine<"),
        "the attention kernel combines; no combining kernel"
    );
    emit_golden_with(
        "mha_bs8.g25.cluster_combine",
        g,
        "mha_bs8.json, graph 25",
        &o,
    );
}

/// Split attention combined in its last blocks (`--last-block-combine on`): mha_bs8's graph 30
/// stores its 4 key splits' partials, and the last block of each group of 4 combines them and
/// stores the output; no combining kernel follows. On both targets.
#[test]
fn last_block_combine_golden() {
    let f = mucc::read_file(
        &common::corpus_dir().join("mha_bs8.json"),
        &ImportOptions::default(),
    )
    .unwrap();
    let g = &f.graphs[30].graph;
    for arch in [Arch::Sm80, Arch::Sm90a] {
        let mut o = opts(arch);
        o.last_block_combine = true;
        o.fold_key_splits = mucc::sched::softmax::KeyFold::Off;
        let (p, e) = mucc::transpile::transpile(g, &o, "mha_bs8.json, graph 30").unwrap();
        let combined: Vec<_> = p
            .kernels
            .values()
            .filter_map(|k| k.last_block_combine.as_ref())
            .collect();
        assert_eq!(combined.len(), 1, "one kernel combines in its last blocks");
        assert_eq!(
            (combined[0].splits, combined[0].axis, combined[0].groups),
            (4, 1, 256)
        );
        assert!(p.counter_bytes >= 1024 && e.launch.counter_bytes == p.counter_bytes);
        assert!(
            e.source.contains("mucc::tb::arrive_last<4>(")
                && e.source.contains("mucc::tb::combine_splits<")
                && !e.source.contains("mucc::kn::softmax_combine<")
                && e.source
                    .contains("arrival counters: zero before the first call"),
            "the attention kernel combines; no combining kernel; the contract is stated"
        );
        emit_golden_with(
            "mha_bs8.g30.last_block_combine",
            g,
            "mha_bs8.json, graph 30",
            &o,
        );
    }
}

/// The decode linear 18944×3584 of `golden/threadblock` (graph 0).
fn decode_golden_graph() -> KernelGraph {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/threadblock");
    let f = mucc::read_file(
        &dir.join("decode_m1_18944x3584_bf16.json"),
        &ImportOptions::default(),
    )
    .unwrap();
    f.graphs.into_iter().next().unwrap().graph
}

/// A for-loop split over CTAs that fold through the workspace (`--grid-split 8 --warps 4`): the
/// decode linear 18944×3584 (56 blocks of a 64-iteration loop) runs 448 CTAs of 8 iterations;
/// each stores its partial accumulator into its slot and arrives on its block's counter, and
/// the last of each block folds the 8 slots and stores the output. On both targets (no
/// cluster on either).
#[test]
fn grid_split_golden() {
    let g = &decode_golden_graph();
    for arch in [Arch::Sm80, Arch::Sm90a] {
        let mut o = opts(arch);
        o.grid_split = mucc::sched::GridSplitChoice::Ctas(8);
        o.cta = mucc::sched::CtaChoice::Warps(4);
        let (p, e) = mucc::transpile::transpile(g, &o, "decode_m1_18944x3584_bf16.json").unwrap();
        let splits: Vec<_> = p.kernels.values().filter_map(|k| k.split.grid()).collect();
        assert_eq!(splits.len(), 1, "one kernel splits over the grid");
        let gs = splits[0];
        assert_eq!((gs.ctas, gs.iters, gs.blocks), (8, 8, 56));
        // One f32 slot of the 64-column accumulator per CTA, then one counter per block.
        assert_eq!(p.split_bytes, (56 * 8 * 64 * 4usize).next_multiple_of(128));
        assert_eq!(p.counter_bytes, 56 * 4);
        assert_eq!(gs.counters_at, p.counters_at());
        assert!(p.kernels.values().all(|k| k.cluster_dims().is_none()));
        assert_eq!(e.launch.counter_bytes, p.counter_bytes);
        assert!(
            e.source.contains("mucc::tb::store_partial<")
                && e.source.contains("mucc::tb::arrive_last<8>(")
                && e.source.contains("mucc::tb::fold_partials<")
                && e.source.contains("blockIdx.x % 8")
                && !e.source.contains("__cluster_dims__"),
            "stores, an arrival of 8 CTAs, folds; no cluster"
        );
        emit_golden_with(
            "decode_m1_18944x3584_bf16.grid_split",
            g,
            "decode_m1_18944x3584_bf16.json",
            &o,
        );
    }
}

/// A programmatic launch (`--dependent-launch`, which these goldens plan with; sm_90a): the
/// decode linear 18944×3584 (golden `decode_m1_18944x3584_bf16.g0.sm_90a`), the graph's first
/// and last kernel, prefetches the TMA boxes of its cluster CTA's first iterations into L2,
/// then waits with `griddepcontrol.wait`, and triggers the next launch after its loop.
#[test]
fn dependent_launch_prefetches_before_the_wait() {
    let g = &decode_golden_graph();
    let o = opts(Arch::Sm90a);
    assert!(o.dependent_launch);
    let (p, e) = mucc::transpile::transpile(g, &o, "decode_m1_18944x3584_bf16.json").unwrap();
    let kp = p.kernels.values().next().unwrap();
    assert!(kp.dependent.is_programmatic() && kp.triggers_next);
    assert_eq!(
        kp.l2_prefetch.map(|p| p.iterations),
        Some(kp.pipeline_stages())
    );
    let prefetch = e.source.find("mucc::sm90::tma_prefetch_l2(").unwrap();
    let wait = e.source.find("mucc::sm90::grid_dependency_wait()").unwrap();
    assert!(prefetch < wait, "the prefetch before the wait");
    assert!(e.source.contains("mucc::sm90::launch_dependents()"));
    assert!(e.launch.steps.iter().all(|s| match s {
        mucc::emit::launch::Step::Kernel(k) => k.programmatic,
        _ => true,
    }));
}

/// The corpus goldens use every threadblock operator kind that occurs in the corpus.
#[test]
fn corpus_goldens_cover_every_corpus_operator_kind() {
    use std::collections::BTreeSet;
    let kinds = |g: &KernelGraph| -> BTreeSet<String> {
        g.customized_ops()
            .flat_map(|(_, tb)| tb.ops.iter().map(|(_, o)| o.kind.name().to_string()))
            .collect()
    };
    let mut all = BTreeSet::new();
    for p in common::corpus_files() {
        let f = mucc::read_file(&p, &ImportOptions::default()).unwrap();
        for g in &f.graphs {
            all.extend(kinds(&g.graph));
        }
    }
    let mut covered = BTreeSet::new();
    for &(file, graph, _) in CORPUS {
        let f =
            mucc::read_file(&common::corpus_dir().join(file), &ImportOptions::default()).unwrap();
        covered.extend(kinds(&f.graphs[graph].graph));
    }
    let missing: Vec<&String> = all.difference(&covered).collect();
    assert!(
        missing.is_empty(),
        "not covered by a corpus golden: {missing:?}"
    );
    assert!(all.len() >= 12, "{all:?}");
}

/// Split attention with its key splits folded into the loop (the planner's rule on sm_90a):
/// mha_bs8's graph 30 runs its 4 key splits in one block's loop of 16 iterations, divides O by
/// l after the loop and stores the output; no combining kernel follows.
#[test]
fn folded_key_splits_golden() {
    let f = mucc::read_file(
        &common::corpus_dir().join("mha_bs8.json"),
        &ImportOptions::default(),
    )
    .unwrap();
    let g = &f.graphs[30].graph;
    let o = opts(Arch::Sm90a);
    let (p, e) = mucc::transpile::transpile(g, &o, "mha_bs8.json, graph 30").unwrap();
    let a = &p.rewrite.softmax.applied[0];
    assert!(
        matches!(
            a.fold,
            mucc::sched::softmax::SplitFold::Folded {
                factor: 4,
                left: 1,
                ..
            }
        ),
        "{}",
        a.fold
    );
    assert!(
        !e.source.contains("softmax_combine"),
        "the attention kernel divides; no combining kernel"
    );
    emit_golden_with("mha_bs8.g30.folded", g, "mha_bs8.json, graph 30", &o);
}
