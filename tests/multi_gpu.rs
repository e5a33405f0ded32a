//! Multi-GPU (tensor-parallel) graphs on the CPU: the interpreter against hand-written
//! references, Mirage-JSON import/export of GPU maps and meshes, and malformed multi-GPU files
//! (each error checked for its JSON path and operator). See `docs/multi-gpu.md`.

use mucc::graph::builder::{GraphBuilder, TbGraphBuilder};
use mucc::graph::interp::{self, Array, InputSpec, Rounding};
use mucc::graph::mirage_json::graphs_to_json;
use mucc::graph::workloads::{
    FusedAttentionTiles, FusedMlpTiles, QWEN7B_HEADS, QWEN7B_HIDDEN, QWEN7B_INTERMEDIATE,
    tp_attention, tp_fused_attention, tp_fused_gated_mlp, tp_gated_mlp, tp_graphs,
};
use mucc::graph::{AccumKind, DType, DimMap, ErrorKind, GpuMesh, KernelGraph, Shape};
use mucc::{ExportOptions, GraphError, ImportOptions, MirageFile, parse_str};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// The tensor-parallel MLP

/// Rows of X.
const M: usize = 4;
/// Model width (X's columns, W1's rows).
const K: usize = 32;
/// Hidden width (W1's columns, W2's rows), split across the GPUs.
const H: usize = 64;
/// Output width.
const N: usize = 16;

/// Y = silu(X·W1)·W2 with Megatron-style tensor parallelism on `gpus` GPUs: X replicated, W1
/// split by columns (column-parallel: each GPU computes its slice of the hidden layer in one
/// customized kernel), W2 split by rows (row-parallel: each GPU a partial product), one
/// all-reduce. Outputs: Y (replicated) and the hidden layer (gathered along its columns).
fn tp_mlp(gpus: usize, dtype: DType) -> KernelGraph {
    let mut g = GraphBuilder::new();
    g.set_gpu_mesh(GpuMesh::line(gpus)).unwrap();
    let x = g.new_input_sharded(&[M, K], dtype, [-1, -1, -1]).unwrap();
    let w1 = g.new_input_sharded(&[K, H], dtype, [1, -1, -1]).unwrap();
    let w2 = g.new_input_sharded(&[H, N], dtype, [0, -1, -1]).unwrap();
    // Per GPU: 2 blocks over its H/gpus columns, K walked in 4 steps.
    let mut tb = TbGraphBuilder::new([2, 1, 1], [128, 1, 1], 4);
    let tx = tb.new_input(&g, x, [-1, -1, -1], 1).unwrap();
    let tw = tb.new_input(&g, w1, [1, -1, -1], 0).unwrap();
    let mm = tb.matmul(tx, tw).unwrap();
    let acc = tb.forloop_accum(mm, AccumKind::Nored).unwrap();
    let act = tb.silu(acc).unwrap();
    tb.new_output(act, [1, -1, -1]).unwrap();
    let hidden = g.customized(tb).unwrap()[0];
    let partial = g.matmul(hidden, w2).unwrap();
    let y = g.all_reduce(partial).unwrap();
    g.mark_output_sharded(y, [-1, -1, -1]).unwrap();
    g.mark_output_sharded(hidden, [1, -1, -1]).unwrap();
    g.build().unwrap_or_else(|e| panic!("{e}"))
}

/// The unsharded reference: (Y, silu(X·W1)) with plain loops.
fn tp_mlp_reference(x: &Array, w1: &Array, w2: &Array) -> (Vec<f64>, Vec<f64>) {
    let mut hidden = vec![0.0; M * H];
    for i in 0..M {
        for j in 0..H {
            let mut s = 0.0;
            for k in 0..K {
                s += x.data[i * K + k] * w1.data[k * H + j];
            }
            hidden[i * H + j] = s / (1.0 + (-s).exp());
        }
    }
    let mut y = vec![0.0; M * N];
    for i in 0..M {
        for j in 0..N {
            let mut s = 0.0;
            for k in 0..H {
                s += hidden[i * H + k] * w2.data[k * N + j];
            }
            y[i * N + j] = s;
        }
    }
    (y, hidden)
}

/// ‖got − want‖ / ‖want‖, NaN (an unwritten element) counting as infinitely wrong.
#[track_caller]
fn assert_close(got: &Array, want: &[f64], what: &str) {
    assert_eq!(got.data.len(), want.len(), "{what}: element count");
    assert!(got.data.iter().all(|x| x.is_finite()), "{what}: NaN or inf");
    let num: f64 = got
        .data
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b) * (a - b))
        .sum();
    let den: f64 = want.iter().map(|b| b * b).sum();
    let rel = (num / den).sqrt();
    assert!(rel < 1e-12, "{what}: relative error {rel:e}");
}

fn shape(d: &[usize]) -> Shape {
    Shape::new(d).unwrap()
}

#[test]
fn tensor_parallel_mlp_matches_the_unsharded_reference_on_1_2_and_4_gpus() {
    for gpus in [1, 2, 4] {
        let g = tp_mlp(gpus, DType::F16);
        assert_eq!(g.sharding.num_gpus(), gpus);
        assert_eq!(
            interp::global_input_shapes(&g),
            vec![shape(&[M, K]), shape(&[K, H]), shape(&[H, N])]
        );
        assert_eq!(
            interp::global_output_shapes(&g),
            vec![shape(&[M, N]), shape(&[M, H])]
        );
        let global = interp::random_global_inputs(&g, InputSpec::default());
        let run = interp::evaluate_sharded(&g, &global, Rounding::Exact).unwrap();
        let (y, hidden) = tp_mlp_reference(&global[0], &global[1], &global[2]);
        assert_close(&run.gathered[0], &y, &format!("Y on {gpus} GPUs"));
        assert_close(
            &run.gathered[1],
            &hidden,
            &format!("silu(X·W1) on {gpus} GPUs"),
        );
        assert!(run.excess.is_empty());
        // Every rank holds the same all-reduced Y and its own slice of the hidden layer.
        assert_eq!(run.per_rank.len(), gpus);
        for (r, outs) in run.per_rank.iter().enumerate() {
            assert_eq!(outs[0], run.gathered[0], "rank {r}'s Y");
            assert_eq!(outs[1].shape, shape(&[M, H / gpus]));
            let cols = run.gathered[1].slice(&[0, r * H / gpus], outs[1].shape);
            assert_eq!(outs[1], cols, "rank {r}'s hidden slice");
        }
    }
}

#[test]
fn one_gpu_sharded_run_is_the_single_gpu_interpreter() {
    let g = tp_mlp(1, DType::BF16);
    let spec = InputSpec {
        seed: 7,
        scale: 0.5,
    };
    let single = interp::evaluate(&g, &interp::random_inputs(&g, spec)).unwrap();
    let global = interp::random_global_inputs(&g, spec);
    let run = interp::evaluate_sharded(&g, &global, Rounding::Exact).unwrap();
    assert_eq!(run.gathered, single);
    assert_eq!(run.per_rank, vec![single]);
}

#[test]
fn the_single_gpu_entry_points_refuse_a_multi_gpu_graph() {
    let g = tp_mlp(2, DType::F32);
    let inputs = interp::shard_inputs(&g, &interp::random_global_inputs(&g, InputSpec::default()))
        .unwrap()
        .swap_remove(0);
    let e = interp::evaluate(&g, &inputs).unwrap_err();
    assert!(e.to_string().contains("runs on 2 GPUs"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// Code generation (NCCL all-reduce in the host entry)

fn plan_for(g: &KernelGraph) -> Result<mucc::sched::GraphPlan, mucc::sched::PlanError> {
    mucc::sched::plan(
        g,
        &mucc::sched::Options::for_target(mucc::target::Target::new(mucc::target::Arch::Sm90a)),
    )
}

/// The element counts of the plan's all-reduces, in graph order.
fn all_reduce_counts(p: &mucc::sched::GraphPlan) -> Vec<usize> {
    p.kernel_ops
        .iter()
        .filter_map(|k| match k {
            mucc::sched::KnOpPlan::AllReduce { count, .. } => Some(*count),
            _ => None,
        })
        .collect()
}

#[test]
fn a_multi_gpu_plan_all_reduces_through_nccl_and_its_entry_takes_a_communicator() {
    use mucc::emit::launch::{NcclDataType, Step};
    use mucc::sched::KnOpPlan;
    for (dtype, nccl) in [
        (DType::BF16, NcclDataType::Bfloat16),
        (DType::F16, NcclDataType::Float16),
        (DType::F32, NcclDataType::Float32),
    ] {
        let g = tp_mlp(2, dtype);
        let p = plan_for(&g).unwrap();
        assert_eq!(p.gpus, 2);
        let reduces: Vec<_> = p
            .kernel_ops
            .iter()
            .filter_map(|k| match k {
                KnOpPlan::AllReduce {
                    count, dtype, gpus, ..
                } => Some((*count, *dtype, *gpus)),
                _ => None,
            })
            .collect();
        // Y is [M, N] on every GPU, dense row-major.
        assert_eq!(reduces, vec![(M * N, nccl, 2)]);
        let e = mucc::emit::emit(&g, &p, "tp_mlp").unwrap();
        assert_eq!(e.launch.gpus, 2);
        let steps: Vec<_> = e
            .launch
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::AllReduce(c) => Some(c),
                _ => None,
            })
            .collect();
        assert_eq!(steps.len(), 1);
        assert_eq!((steps[0].count, steps[0].dtype), (M * N, nccl));
        assert!(e.source.contains("#include \"mucc/nccl.h\""));
        assert!(e.source.contains("ncclComm_t comm, cudaStream_t stream) {"));
        let call = format!(
            "MUCC_CHECK_NCCL(ncclAllReduce(buf.ws(0), buf.out(0, 0), {}, {}, ncclSum, comm, stream));",
            M * N,
            mucc::emit::cxx::nccl_data_type(nccl)
        );
        assert!(e.source.contains(&call), "{}", e.source);
        // The launch plan round-trips through JSON with its GPU count.
        let back: mucc::emit::launch::LaunchPlan =
            serde_json::from_str(&serde_json::to_string(&e.launch).unwrap()).unwrap();
        assert_eq!(back, e.launch);
        // The library header of `mucc build` declares the communicator parameter.
        let h = mucc::emit::header::header("TP_H", "tp_mlp", &e.launch);
        assert!(h.contains("#define MUCC_NUM_GPUS 2\n#define MUCC_NCCL_ERROR_BASE 200000\n"));
        assert!(h.contains(
            "int mucc_execute(const void* const* inputs, void* const* outputs, void* workspace, void* comm,\n                 void* stream);"
        ), "{h}");
    }
}

#[test]
fn on_one_gpu_the_all_reduce_is_a_copy_and_no_nccl_appears() {
    let g = tp_mlp(1, DType::BF16);
    let p = plan_for(&g).unwrap();
    assert_eq!(p.gpus, 1);
    assert!(all_reduce_counts(&p).is_empty());
    let e = mucc::emit::emit(&g, &p, "tp_mlp").unwrap();
    assert!(!e.source.contains("nccl") && e.source.contains("_allreduce"));
    assert!(
        e.source
            .contains("void* workspace,\n                            cudaStream_t stream) {")
    );
}

#[test]
fn an_all_reduce_output_takes_its_input_layout_and_other_user_strides_get_a_copy() {
    use mucc::sched::KnOpPlan;
    // Input strides [1, 7] (the caller's, column-major): the output buffer (no user strides)
    // takes them, and the all-reduce writes straight into it.
    let mut g = GraphBuilder::new();
    g.set_gpu_mesh(GpuMesh::line(2)).unwrap();
    let x = g.new_input_strided(&[7, 13], &[1, 7], DType::F32).unwrap();
    let y = g.all_reduce(x).unwrap();
    g.mark_output(y).unwrap();
    let p = plan_for(&g.build().unwrap()).unwrap();
    assert_eq!(p.outputs[0].strides.0, vec![1, 7]);
    assert!(matches!(
        p.kernel_ops[1],
        KnOpPlan::AllReduce { count: 91, .. }
    ));
    assert!(matches!(p.kernel_ops[2], KnOpPlan::Nothing));
    // An output with other user strides (padded rows): the all-reduce sums into the workspace
    // in the input's layout and the output operator copies into the caller's layout.
    let mut g = GraphBuilder::new();
    g.set_gpu_mesh(GpuMesh::line(2)).unwrap();
    let x = g.new_input_strided(&[7, 13], &[1, 7], DType::F32).unwrap();
    let y = g.all_reduce(x).unwrap();
    g.mark_output_strided(y, &[16, 1]).unwrap();
    let g = g.build().unwrap();
    let p = plan_for(&g).unwrap();
    assert_eq!(p.outputs[0].strides.0, vec![16, 1]);
    assert_eq!(p.dtensors[y.index()].strides.0, vec![1, 7]);
    assert!(matches!(
        p.dtensors[y.index()].placement,
        mucc::sched::plan::Placement::Workspace(_)
    ));
    assert!(matches!(
        p.kernel_ops[1],
        KnOpPlan::AllReduce {
            recv: mucc::sched::plan::Binding::Workspace { .. },
            count: 91,
            ..
        }
    ));
    assert!(matches!(p.kernel_ops[2], KnOpPlan::Elementwise { .. }));
    // A computed tensor all-reduced into a column-major output: the solver prefers the
    // caller's innermost dim, the strides match, and the sum lands in the output directly.
    let mut h = GraphBuilder::new();
    h.set_gpu_mesh(GpuMesh::line(2)).unwrap();
    let a = h.new_input(&[8, 32], DType::F16).unwrap();
    let b = h.new_input(&[32, 16], DType::F16).unwrap();
    let c = h.matmul(a, b).unwrap();
    let z = h.all_reduce(c).unwrap();
    h.mark_output_strided(z, &[1, 8]).unwrap();
    let h = h.build().unwrap();
    let p2 = plan_for(&h).unwrap();
    assert_eq!(p2.dtensors[c.index()].strides.0, vec![1, 8]);
    assert_eq!(
        p2.dtensors[z.index()].placement,
        mucc::sched::plan::Placement::Output(0)
    );
    assert!(matches!(p2.kernel_ops[4], KnOpPlan::Nothing));
    // The same graph on one GPU plans as before (a copy into the output).
    let mut one = g.clone();
    one.sharding.mesh = Some(GpuMesh::line(1));
    let p = plan_for(&one).unwrap();
    assert_eq!(p.outputs[0].strides.0, vec![16, 1]);
    assert!(all_reduce_counts(&p).is_empty());
    // NCCL has no 16-bit integers.
    let mut g = GraphBuilder::new();
    g.set_gpu_mesh(GpuMesh::line(2)).unwrap();
    let x = g.new_input(&[8, 16], DType::I16).unwrap();
    let y = g.all_reduce(x).unwrap();
    g.mark_output(y).unwrap();
    let e = plan_for(&g.build().unwrap()).unwrap_err();
    assert!(
        matches!(
            e,
            mucc::sched::PlanError::Unsupported {
                reason: mucc::sched::plan::Unsupported::NcclType(DType::I16),
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains("NCCL has no element type for i16"),
        "{e}"
    );
}

#[test]
fn a_padded_layout_is_summed_over_its_span() {
    // [7, 13] f64 rows are padded to 14 elements (16-byte rows): the all-reduce covers the span.
    let mut g = GraphBuilder::new();
    g.set_gpu_mesh(GpuMesh::line(2)).unwrap();
    let x = g.new_input(&[7, 13], DType::F64).unwrap();
    let e = g.exp(x).unwrap();
    let y = g.all_reduce(e).unwrap();
    g.mark_output(y).unwrap();
    let g = g.build().unwrap();
    let p = plan_for(&g).unwrap();
    let spans: Vec<usize> = all_reduce_counts(&p);
    let y_geo = &p.dtensors[y.index()];
    // From the first element to the last: 6 rows of 14 and one of 13.
    assert_eq!(y_geo.strides.0, vec![14, 1]);
    assert_eq!(spans, vec![6 * 14 + 13]);
    assert!(y_geo.phys_elems >= spans[0]);
    assert_eq!(p.dtensors[e.index()].strides, y_geo.strides);
    // The stride of an extent-1 dim does not count: [1, 50] with strides [50, 1] (the caller's)
    // and [56, 1] (padded) are one layout, summed over its 50 elements.
    let mut g = GraphBuilder::new();
    g.set_gpu_mesh(GpuMesh::line(2)).unwrap();
    let x = g.new_input(&[1, 50], DType::F16).unwrap();
    let y = g.all_reduce(x).unwrap();
    g.mark_output(y).unwrap();
    let g = g.build().unwrap();
    let p = plan_for(&g).unwrap();
    let counts: Vec<usize> = all_reduce_counts(&p);
    assert_eq!(counts, vec![50]);
}

/// The workload graphs of the GPU check (`tp_graphs`): sharded over 2 GPUs they compute what
/// the same graph computes on one GPU (small sizes here; the files use Qwen2.5-7B's).
#[test]
fn tensor_parallel_workloads_equal_their_one_gpu_form() {
    type Make = Box<dyn Fn(usize) -> KernelGraph>;
    let makes: Vec<(&str, Make)> = vec![
        (
            "mlp",
            Box::new(|n| tp_gated_mlp(n, 3, 32, 64, DType::F32).unwrap()),
        ),
        (
            "attention",
            Box::new(|n| tp_attention(n, 2, 16, (4, 8), 24, DType::F32).unwrap()),
        ),
    ];
    for (what, make) in makes {
        let (one, two) = (make(1), make(2));
        let global = interp::random_global_inputs(&two, InputSpec::default());
        let sharded = interp::evaluate_sharded(&two, &global, Rounding::Exact).unwrap();
        let whole = interp::evaluate_sharded(&one, &global, Rounding::Exact).unwrap();
        let (a, b) = (&sharded.gathered[0], &whole.gathered[0]);
        assert_eq!(a.shape, b.shape, "{what}");
        let err = a
            .data
            .iter()
            .zip(&b.data)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max);
        assert!(err < 1e-9, "{what}: max difference {err}");
        // Both ranks hold the sum.
        assert_eq!(sharded.per_rank[0], sharded.per_rank[1], "{what}");
    }
    // Every file of the GPU check plans (kernel-level operators, an NCCL all-reduce each).
    for (name, g) in tp_graphs(2).unwrap() {
        let p = plan_for(&g).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(p.gpus, 2, "{name}");
        assert_eq!(all_reduce_counts(&p).len(), 1, "{name}");
    }
}

// ---------------------------------------------------------------------------------------------
// The fused tensor-parallel workloads (customized operators)

/// Small tiles of the fused MLP for hidden 32, intermediate 64 (1, 2 or 4 GPUs).
const SMALL_MLP_TILES: FusedMlpTiles = FusedMlpTiles {
    inter_cols: 8,
    hidden_step: 8,
    hidden_cols: 8,
    inter_step: 8,
};

/// Small tiles of the fused attention block for 16 keys and 24 output columns.
const SMALL_ATTENTION_TILES: FusedAttentionTiles = FusedAttentionTiles {
    key_splits: 2,
    key_step: 4,
    hidden_cols: 8,
};

/// The largest |a − b| over the largest |b|.
fn max_rel_diff(a: &Array, b: &Array) -> f64 {
    assert_eq!(a.shape, b.shape);
    let scale = b.data.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let diff = a
        .data
        .iter()
        .zip(&b.data)
        .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
    diff / scale
}

/// ‖a − b‖ / ‖b‖ (the measure of `mucc run --check`).
fn rel_l2(a: &Array, b: &Array) -> f64 {
    assert_eq!(a.shape, b.shape);
    let num: f64 = a
        .data
        .iter()
        .zip(&b.data)
        .map(|(x, y)| (x - y) * (x - y))
        .sum();
    let den: f64 = b.data.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

/// The fused MLP and attention blocks, sharded over 1, 2 and 4 GPUs, compute what the
/// kernel-level graphs compute unsharded (small sizes, exact arithmetic): the same function of
/// the same global inputs, every rank holding the all-reduced sum.
#[test]
fn fused_tensor_parallel_workloads_equal_the_kernel_level_ones() {
    type Make = Box<dyn Fn(usize, usize) -> KernelGraph>;
    let makes: Vec<(&str, Vec<usize>, Make, Make)> = vec![
        (
            "mlp",
            vec![1, 3],
            Box::new(|n, m| {
                tp_fused_gated_mlp(n, m, (32, 64), SMALL_MLP_TILES, DType::F32).unwrap()
            }),
            Box::new(|n, m| tp_gated_mlp(n, m, 32, 64, DType::F32).unwrap()),
        ),
        (
            "attention",
            vec![1, 2],
            Box::new(|n, m| {
                tp_fused_attention(n, m, 16, (4, 8), 24, SMALL_ATTENTION_TILES, DType::F32).unwrap()
            }),
            Box::new(|n, m| tp_attention(n, m, 16, (4, 8), 24, DType::F32).unwrap()),
        ),
        (
            "attention with one key split",
            vec![1, 2],
            Box::new(|n, m| {
                let tiles = FusedAttentionTiles {
                    key_splits: 1,
                    ..SMALL_ATTENTION_TILES
                };
                tp_fused_attention(n, m, 16, (4, 8), 24, tiles, DType::F32).unwrap()
            }),
            Box::new(|n, m| tp_attention(n, m, 16, (4, 8), 24, DType::F32).unwrap()),
        ),
    ];
    for (what, ms, fused, plain) in &makes {
        for &m in ms {
            let reference = plain(1, m);
            let global = interp::random_global_inputs(&reference, InputSpec::default());
            let want = interp::evaluate_sharded(&reference, &global, Rounding::Exact).unwrap();
            for gpus in [1, 2, 4] {
                let g = fused(gpus, m);
                assert_eq!(
                    interp::global_input_shapes(&g),
                    interp::global_input_shapes(&reference),
                    "{what} m={m} on {gpus} GPUs"
                );
                let got = interp::evaluate_sharded(&g, &global, Rounding::Exact).unwrap();
                let err = max_rel_diff(&got.gathered[0], &want.gathered[0]);
                assert!(err < 1e-12, "{what} m={m} on {gpus} GPUs: {err:e}");
                assert!(got.per_rank.iter().all(|r| r == &got.per_rank[0]));
            }
        }
    }
}

/// A tile size that does not divide its per-GPU extent is refused with the sizes named.
#[test]
fn fused_workloads_refuse_tiles_that_do_not_divide() {
    let tiles = FusedMlpTiles {
        inter_cols: 24,
        ..SMALL_MLP_TILES
    };
    let e = tp_fused_gated_mlp(2, 1, (32, 64), tiles, DType::F16).unwrap_err();
    assert_eq!(
        e.to_string(),
        "intermediate columns per block: 24 does not divide the per-GPU extent 32"
    );
    let tiles = FusedAttentionTiles {
        key_step: 3,
        ..SMALL_ATTENTION_TILES
    };
    let e = tp_fused_attention(2, 1, 16, (4, 8), 24, tiles, DType::F16).unwrap_err();
    assert_eq!(
        e.to_string(),
        "keys per iteration: 3 does not divide the per-GPU extent 8"
    );
}

/// Every fused file of the GPU check (Qwen2.5-7B sizes) is two customized kernels and one
/// all-reduce per GPU, plans for sm_90a on 2 GPUs and on one (its `tp1_*` twin), and emits code
/// with no cuBLAS call and one NCCL all-reduce of the [m, hidden] partial output.
#[test]
fn fused_tensor_parallel_files_are_customized_kernels_that_plan_and_emit() {
    use mucc::emit::launch::Step;
    use mucc::graph::KnOpKind;
    for gpus in [2, 1] {
        let fused: Vec<_> = tp_graphs(gpus)
            .unwrap()
            .into_iter()
            .filter(|(n, _)| n.contains("_fmlp_") || n.contains("_fattn_"))
            .collect();
        assert_eq!(fused.len(), 8);
        for (name, g) in fused {
            let kinds: Vec<&str> = g
                .ops
                .iter()
                .filter_map(|(_, op)| match &op.kind {
                    KnOpKind::Input { .. } | KnOpKind::Output { .. } => None,
                    KnOpKind::Customized(_) => Some("customized"),
                    KnOpKind::AllReduce { .. } => Some("allreduce"),
                    _ => Some("other"),
                })
                .collect();
            assert_eq!(kinds, ["customized", "customized", "allreduce"], "{name}");
            let m = if name.contains("_m1_") { 1 } else { 8 };
            let p = plan_for(&g).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(p.gpus, gpus, "{name}");
            let reduces = all_reduce_counts(&p);
            if gpus == 1 {
                assert!(reduces.is_empty(), "{name}");
            } else {
                assert_eq!(reduces, vec![m * QWEN7B_HIDDEN], "{name}");
            }
            let e = mucc::emit::emit(&g, &p, &name).unwrap_or_else(|e| panic!("{name}: {e}"));
            let (mut kernels, mut gemms, mut nccl) = (0, 0, 0);
            for s in &e.launch.steps {
                match s {
                    Step::Kernel(_) => kernels += 1,
                    Step::Gemm(_) => gemms += 1,
                    Step::AllReduce(_) => nccl += 1,
                }
            }
            assert_eq!(gemms, 0, "{name}");
            assert!(kernels >= 2, "{name}");
            assert_eq!(nccl, usize::from(gpus > 1), "{name}");
        }
    }
}

/// `--all-reduce fused`: the all-reduce of every fused file moves into the kernel writing its
/// input (no NCCL step; the kernel takes every GPU's exchange buffer and the rank; its output
/// stores are mirrored and its end sums), the host entry takes the exchange buffers, and the
/// launch plan says how many bytes they hold. A kernel-level producer (cuBLAS) keeps NCCL and
/// says why.
#[test]
fn a_fused_all_reduce_runs_in_the_kernel_writing_its_input() {
    use mucc::emit::launch::{Binding, Step};
    use mucc::sched::KnOpPlan;
    use mucc::sched::exchange::{AllReduceChoice, AllReduceForm, NotFused};
    let mut opts =
        mucc::sched::Options::for_target(mucc::target::Target::new(mucc::target::Arch::Sm90a));
    opts.all_reduce = AllReduceChoice::Fused;
    for (name, g) in tp_graphs(2).unwrap() {
        let p = mucc::sched::plan(&g, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        let forms: Vec<&AllReduceForm> = p
            .kernel_ops
            .iter()
            .filter_map(|k| match k {
                KnOpPlan::AllReduce { fused, .. } => Some(fused),
                _ => None,
            })
            .collect();
        assert_eq!(forms.len(), 1, "{name}");
        let e = mucc::emit::emit(&g, &p, &name).unwrap();
        let nccl_steps = e
            .launch
            .steps
            .iter()
            .filter(|s| matches!(s, Step::AllReduce(_)))
            .count();
        if !(name.contains("_fmlp_") || name.contains("_fattn_")) {
            let AllReduceForm::Nccl(why) = forms[0] else {
                panic!("{name}: a cuBLAS product fused");
            };
            assert!(
                matches!(why, NotFused::NotThreadblock { .. }),
                "{name}: {why}"
            );
            assert_eq!((nccl_steps, e.launch.exchange_bytes), (1, 0), "{name}");
            continue;
        }
        let &AllReduceForm::Fused { kernel } = forms[0] else {
            panic!("{name}: not fused: {:?}", forms[0]);
        };
        let x = p.kernels[&kernel].exchange.as_ref().unwrap();
        assert_eq!((x.gpus, x.region), (2, 0), "{name}");
        let m = if name.contains("_m1_") { 1 } else { 8 };
        assert_eq!(x.count, m * QWEN7B_HIDDEN, "{name}");
        // The header, two parities of one slot per GPU.
        assert_eq!(p.exchange_bytes, 256 + 4 * x.slot_bytes, "{name}");
        assert!(
            x.slot_bytes >= x.count * 8 && x.slot_bytes.is_multiple_of(256),
            "{name}"
        );
        assert_eq!(nccl_steps, 0, "{name}");
        assert_eq!(e.launch.exchange_bytes, p.exchange_bytes, "{name}");
        let k = e
            .launch
            .steps
            .iter()
            .find_map(|s| match s {
                Step::Kernel(k) if k.name == format!("k{kernel}_customized") => Some(k),
                _ => None,
            })
            .unwrap();
        let tail = &k.args[k.args.len() - 4..];
        assert_eq!(tail[0], x.recv, "{name}");
        assert_eq!(
            &tail[1..],
            [
                Binding::Exchange { rank: 0 },
                Binding::Exchange { rank: 1 },
                Binding::Rank
            ],
            "{name}"
        );
        for needle in [
            "#include \"mucc/threadblock/exchange.h\"",
            "mucc::xchg::arrive_and_sum<",
            "  mucc::xchg::copy_ll<",
            "void* const* exchange, ncclComm_t comm, cudaStream_t stream) {",
            "MUCC_CHECK_NCCL(ncclCommUserRank(comm, &r));",
            "exchange[0],",
            "mucc::host::value_arg(rank)",
        ] {
            assert!(e.source.contains(needle), "{name}: no {needle}");
        }
        let text = mucc::explain::explain(&g, &p);
        assert!(
            text.contains(&format!(
                "fused into kernel op {kernel} (no step of its own)"
            )),
            "{name}"
        );
        let h = mucc::emit::header::header("TP_H", &name, &e.launch);
        assert!(h.contains(&format!("#define MUCC_EXCHANGE_BYTES {}", p.exchange_bytes)));
        assert!(
            h.contains("void* const* exchange, void* comm, void* stream);"),
            "{h}"
        );
        let back: mucc::emit::launch::LaunchPlan =
            serde_json::from_str(&serde_json::to_string(&e.launch).unwrap()).unwrap();
        assert_eq!(back, e.launch);
    }
}

/// A row-parallel product on 2 GPUs: a customized kernel writes P = X·W (W split by rows), then
/// (`between`: an element-wise step on another input), then P is all-reduced.
fn row_parallel(dtype: DType, between: bool) -> KernelGraph {
    let mut g = GraphBuilder::new();
    g.set_gpu_mesh(GpuMesh::line(2)).unwrap();
    let x = g.new_input_sharded(&[M, H], dtype, [1, -1, -1]).unwrap();
    let w = g.new_input_sharded(&[H, N], dtype, [0, -1, -1]).unwrap();
    let z = g.new_input(&[M, N], dtype).unwrap();
    let mut tb = TbGraphBuilder::new([1, 1, 1], [128, 1, 1], 4);
    let tx = tb.new_input(&g, x, [-1, -1, -1], 1).unwrap();
    let tw = tb.new_input(&g, w, [-1, -1, -1], 0).unwrap();
    let mm = tb.matmul(tx, tw).unwrap();
    let acc = tb.forloop_accum(mm, AccumKind::Nored).unwrap();
    tb.new_output(acc, [-1, -1, -1]).unwrap();
    let p = g.customized(tb).unwrap()[0];
    if between {
        let e = g.unary(mucc::graph::UnaryOp::Exp, z).unwrap();
        g.mark_output(e).unwrap();
    }
    let y = g.all_reduce(p).unwrap();
    g.mark_output_sharded(y, [-1, -1, -1]).unwrap();
    g.build().unwrap_or_else(|e| panic!("{e}"))
}

/// The fused all-reduce's rules, each refusal with its reason on the all-reduce's plan: an
/// unsupported element type, another step between the producing kernel and the all-reduce; and
/// the same graph without that step fuses.
#[test]
fn a_fused_all_reduce_says_why_it_stays_nccl() {
    use mucc::sched::KnOpPlan;
    use mucc::sched::exchange::{AllReduceChoice, AllReduceForm, NotFused};
    let mut opts =
        mucc::sched::Options::for_target(mucc::target::Target::new(mucc::target::Arch::Sm90a));
    opts.all_reduce = AllReduceChoice::Fused;
    let form = |g: &KernelGraph| -> AllReduceForm {
        let p = mucc::sched::plan(g, &opts).unwrap_or_else(|e| panic!("{e}"));
        p.kernel_ops
            .iter()
            .find_map(|k| match k {
                KnOpPlan::AllReduce { fused, .. } => Some(fused.clone()),
                _ => None,
            })
            .unwrap()
    };
    assert!(matches!(
        form(&row_parallel(DType::BF16, false)),
        AllReduceForm::Fused { .. }
    ));
    let why = |f: AllReduceForm| match f {
        AllReduceForm::Nccl(why) => why,
        f => panic!("fused: {f:?}"),
    };
    let w = why(form(&row_parallel(DType::F64, false)));
    assert_eq!(w, NotFused::DType(DType::F64));
    assert!(
        w.to_string().contains("sums f16, bf16 and f32, not f64"),
        "{w}"
    );
    let w = why(form(&row_parallel(DType::F16, true)));
    assert!(matches!(w, NotFused::StepBetween { .. }), "{w}");
    // The default keeps NCCL and says so.
    let p = plan_for(&row_parallel(DType::BF16, false)).unwrap();
    assert!(p.kernel_ops.iter().any(|k| matches!(
        k,
        KnOpPlan::AllReduce {
            fused: AllReduceForm::Nccl(NotFused::Chosen),
            ..
        }
    )));
    assert_eq!(p.exchange_bytes, 0);
}

/// The fused attention files at their real sizes (Qwen2.5-7B, 1024 keys), M = 1 and 8, in both
/// 16-bit types at the check's input scale (1.0): on 2 GPUs with every stored tensor, tile and
/// accumulator rounded to its type, no value leaves the type's range and the gathered output is
/// within the `--check` bound of the exact unsharded twin.
#[test]
fn fused_attention_at_qwen_sizes_matches_its_one_gpu_twin_in_16_bit_storage() {
    for m in [1, 8] {
        for (dtype, bound) in [(DType::F16, 5e-3), (DType::BF16, 3e-2)] {
            let make = |gpus| {
                tp_fused_attention(
                    gpus,
                    m,
                    1024,
                    QWEN7B_HEADS,
                    QWEN7B_HIDDEN,
                    FusedAttentionTiles::qwen7b(),
                    dtype,
                )
                .unwrap()
            };
            let (one, two) = (make(1), make(2));
            assert_twins_agree(
                &one,
                &two,
                InputSpec::default(),
                bound,
                &format!("m={m} {dtype}"),
            );
        }
    }
}

/// Asserts that `two` (on two GPUs, every stored value rounded to its dtype) gathers, on the
/// same global inputs, what its one-GPU twin `one` computes exactly: no overflow, all finite,
/// relative L2 error under `bound`.
fn assert_twins_agree(
    one: &KernelGraph,
    two: &KernelGraph,
    spec: InputSpec,
    bound: f64,
    what: &str,
) {
    let global = interp::random_global_inputs(two, spec);
    let want = interp::evaluate_sharded(one, &global, Rounding::Exact).unwrap();
    let got = interp::evaluate_sharded(two, &global, Rounding::Stored).unwrap();
    assert!(got.excess.is_empty(), "{what}: {:?}", got.excess);
    let y = &got.gathered[0];
    assert!(y.data.iter().all(|x| x.is_finite()), "{what}");
    let err = rel_l2(y, &want.gathered[0]);
    assert!(err < bound, "{what}: relative L2 error {err:e}");
}

/// The fused MLP files at their real sizes (Qwen2.5-7B), M = 1 and 8: as the attention test
/// above, at the input scale `mucc run --check` settles on (fp16 0.5: at 1.0 the output reaches
/// |y| ≈ 9e4, beyond fp16's 65504; bf16 1.0). About 50 s of interpreter time.
#[test]
#[ignore = "slow (about 50 s): cargo test --release --test multi_gpu -- --ignored"]
fn fused_mlp_at_qwen_sizes_matches_its_one_gpu_twin_in_16_bit_storage() {
    for m in [1, 8] {
        for (dtype, bound, scale) in [(DType::F16, 5e-3, 0.5), (DType::BF16, 3e-2, 1.0)] {
            let make = |gpus| {
                tp_fused_gated_mlp(
                    gpus,
                    m,
                    (QWEN7B_HIDDEN, QWEN7B_INTERMEDIATE),
                    FusedMlpTiles::qwen7b(gpus),
                    dtype,
                )
                .unwrap()
            };
            let (one, two) = (make(1), make(2));
            let spec = InputSpec { seed: 0, scale };
            assert_twins_agree(&one, &two, spec, bound, &format!("m={m} {dtype}"));
        }
    }
}

#[test]
fn without_the_all_reduce_each_gpu_holds_a_partial_sum() {
    // The same graph without the all-reduce: rank r's Y is silu(X·W1[:, cols r])·W2[rows r, :].
    let gpus = 2;
    let mut g = GraphBuilder::new();
    g.set_gpu_mesh(GpuMesh::line(gpus)).unwrap();
    let x = g
        .new_input_sharded(&[M, K], DType::F32, [-1, -1, -1])
        .unwrap();
    let w1 = g
        .new_input_sharded(&[K, H], DType::F32, [1, -1, -1])
        .unwrap();
    let w2 = g
        .new_input_sharded(&[H, N], DType::F32, [0, -1, -1])
        .unwrap();
    let h = g.matmul(x, w1).unwrap();
    let h = g.silu(h).unwrap();
    let p = g.matmul(h, w2).unwrap();
    g.mark_output(p).unwrap();
    let g = g.build().unwrap();
    let global = interp::random_global_inputs(&g, InputSpec::default());
    let run = interp::evaluate_sharded(&g, &global, Rounding::Exact).unwrap();
    let (y, _) = tp_mlp_reference(&global[0], &global[1], &global[2]);
    let mut sum = run.per_rank[0][0].clone();
    sum.add_assign(&run.per_rank[1][0]);
    assert_close(&sum, &y, "sum of the partial products");
    // A replicated output is rank 0's copy.
    assert_eq!(run.gathered[0], run.per_rank[0][0]);
}

#[test]
fn two_dimensional_mesh_partitions_gathers_and_all_reduces() {
    // Mesh 2×2: X [4, 6] split by x along its columns, replicated along y.
    let mut g = GraphBuilder::new();
    g.set_gpu_mesh(GpuMesh([2, 2, 1])).unwrap();
    let x = g
        .new_input_sharded(&[4, 6], DType::F32, [1, -1, -1])
        .unwrap();
    assert_eq!(g.shape(x), Some(shape(&[4, 3])));
    let e = g.exp(x).unwrap();
    let s = g.all_reduce(x).unwrap();
    g.mark_output_sharded(e, [1, -1, -1]).unwrap();
    g.mark_output(s).unwrap();
    let g = g.build().unwrap();
    let global = interp::random_global_inputs(&g, InputSpec::default());
    let run = interp::evaluate_sharded(&g, &global, Rounding::Exact).unwrap();
    let want_exp: Vec<f64> = global[0].data.iter().map(|v| v.exp()).collect();
    assert_close(&run.gathered[0], &want_exp, "exp gathered over x");
    // The sum over 4 ranks: each half of X's columns is held by 2 ranks.
    let (left, right) = (
        global[0].slice(&[0, 0], shape(&[4, 3])),
        global[0].slice(&[0, 3], shape(&[4, 3])),
    );
    let want_sum: Vec<f64> = left
        .data
        .iter()
        .zip(&right.data)
        .map(|(a, b)| 2.0 * (a + b))
        .collect();
    assert_close(&run.gathered[1], &want_sum, "all-reduce over a 2×2 mesh");
    // Ranks are numbered with x fastest.
    assert_eq!(run.per_rank[1][0], run.per_rank[3][0]);
    assert_eq!(run.per_rank[1][0].data[0], global[0].data[3].exp());
}

#[test]
fn builder_rejects_bad_partitions() {
    let mut g = GraphBuilder::new();
    let e = g
        .new_input_sharded(&[8, 8], DType::F16, [0, -1, -1])
        .unwrap_err();
    assert!(matches!(e.kind, ErrorKind::GpuCountUnknown(_)), "{e}");
    g.set_gpu_mesh(GpuMesh::line(4)).unwrap();
    let e = g
        .new_input_sharded(&[8, 6], DType::F16, [1, -1, -1])
        .unwrap_err();
    assert!(
        matches!(
            e.kind,
            ErrorKind::NotDivisible {
                dim: 1,
                extent: 6,
                by: 4,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("GPU mesh axis x (4 GPUs) partitions"),
        "{e}"
    );
    let e = g
        .new_input_sharded(&[8, 8], DType::F16, [2, -1, -1])
        .unwrap_err();
    assert!(e.to_string().contains("names dim 2, but the tensor"), "{e}");
    let e = g
        .new_input_sharded(&[8, 8], DType::F16, [1, 1, -1])
        .unwrap_err();
    assert!(
        matches!(e.kind, ErrorKind::MeshAxesShareDim { dim: 1, .. }),
        "{e}"
    );
    g.new_input_sharded(&[8, 8], DType::F16, [0, -1, -1])
        .unwrap();
    let e = g.set_gpu_mesh(GpuMesh::line(2)).unwrap_err();
    assert!(e.to_string().contains("the mesh cannot change"), "{e}");
    assert!(g.set_gpu_mesh(GpuMesh([0, 1, 1])).is_err());
}

// ---------------------------------------------------------------------------------------------
// JSON: export, import, identity, the data file

fn export(g: &KernelGraph) -> Value {
    graphs_to_json([g], &ExportOptions::default()).unwrap()
}

fn import(doc: &Value) -> Result<MirageFile, GraphError> {
    parse_str(&doc.to_string(), None, &ImportOptions::default())
}

#[test]
fn export_writes_the_maps_and_the_mesh() {
    let doc = export(&tp_mlp(2, DType::F16));
    let ops = &doc[0];
    assert_eq!(ops[0]["mucc_gpu_dim"], json!({"x": 2, "y": 1, "z": 1}));
    assert_eq!(ops[0]["input_map"], json!({"x": -1, "y": -1, "z": -1}));
    assert_eq!(ops[1]["input_map"], json!({"x": 1, "y": -1, "z": -1}));
    assert_eq!(ops[2]["input_map"], json!({"x": 0, "y": -1, "z": -1}));
    assert_eq!(ops[5]["op_type"], json!("kn_allreduce_op"));
    assert_eq!(ops[6]["output_map"], json!({"x": -1, "y": -1, "z": -1}));
    assert_eq!(ops[7]["output_map"], json!({"x": 1, "y": -1, "z": -1}));
    // The text dump shows them too.
    let dump = mucc::graph::display::dump(&tp_mlp(2, DType::F16));
    assert!(dump.contains("\ngpu mesh (2, 1, 1)\n"), "{dump}");
    assert!(
        dump.contains("strides [32, 1] input_map (1, -1, -1)\n"),
        "{dump}"
    );
    assert!(
        dump.contains("output %3 strides chosen by mucc output_map (1, -1, -1)"),
        "{dump}"
    );
    // A graph with an unknown mesh writes no mesh key.
    let mut one = GraphBuilder::new();
    let x = one.new_input(&[2, 2], DType::F16).unwrap();
    one.mark_output(x).unwrap();
    assert!(
        export(&one.build().unwrap())[0][0]
            .get("mucc_gpu_dim")
            .is_none()
    );
}

#[test]
fn import_export_import_is_the_identity_on_partitioned_graphs() {
    for gpus in [2, 4] {
        let g = tp_mlp(gpus, DType::F16);
        let v1 = export(&g);
        let g1 = import(&v1).unwrap().graphs.remove(0);
        g1.validate().unwrap();
        let v2 = export(&g1.graph);
        assert_eq!(v1, v2, "export of the re-imported graph");
        let g2 = import(&v2).unwrap().graphs.remove(0).graph;
        assert_eq!(g1.graph, g2);
        let mut stripped = g2.clone();
        stripped.clear_guids();
        assert_eq!(stripped, g, "the imported graph is the built one");
    }
}

/// `tests/data/multi_gpu/tp_mlp_2gpu.json`: the 2-GPU MLP for later GPU work. Re-bless with
/// `MUCC_BLESS=1`.
#[test]
fn data_file_tp_mlp_2gpu() {
    let path = format!(
        "{}/tests/data/multi_gpu/tp_mlp_2gpu.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let g = tp_mlp(2, DType::F16);
    let text = serde_json::to_string_pretty(&export(&g)).unwrap() + "\n";
    if std::env::var_os("MUCC_BLESS").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert_eq!(on_disk, text, "{path} is stale (MUCC_BLESS=1 rewrites it)");
    let file = mucc::read_file(std::path::Path::new(&path), &ImportOptions::default()).unwrap();
    let lg = &file.graphs[0];
    lg.validate().unwrap();
    assert_eq!(lg.graph.sharding.mesh, Some(GpuMesh::line(2)));
    let global = interp::random_global_inputs(&lg.graph, InputSpec::default());
    let run = interp::evaluate_sharded(&lg.graph, &global, Rounding::Exact).unwrap();
    let (y, _) = tp_mlp_reference(&global[0], &global[1], &global[2]);
    assert_close(&run.gathered[0], &y, "Y from the data file");
}

#[test]
fn the_caller_supplies_the_gpu_count_when_the_file_has_none() {
    let mut doc = export(&tp_mlp(2, DType::F16));
    doc[0][0].as_object_mut().unwrap().remove("mucc_gpu_dim");
    let mut file = import(&doc).unwrap();
    assert_eq!(file.graphs[0].graph.sharding.mesh, None);
    assert!(file.graphs[0].validate().is_err());
    file.set_gpu_mesh(GpuMesh::line(2));
    file.graphs[0].validate().unwrap();
    let mut g = file.graphs.remove(0).graph;
    g.clear_guids();
    assert_eq!(g, tp_mlp(2, DType::F16));
}

#[test]
fn an_all_reduce_without_a_gpu_count_is_read_as_one_gpu_with_a_warning() {
    let mut b = GraphBuilder::new();
    let x = b.new_input(&[2, 3], DType::F32).unwrap();
    let y = b.all_reduce(x).unwrap();
    b.mark_output(y).unwrap();
    let g = b.build().unwrap();
    let file = import(&export(&g)).unwrap();
    assert!(
        file.warnings
            .iter()
            .any(|w| w.contains("kn_allreduce_op") && w.contains("one GPU")),
        "{:?}",
        file.warnings
    );
    let lg = &file.graphs[0];
    lg.validate().unwrap();
    let inputs = interp::random_inputs(&lg.graph, InputSpec::default());
    let outs = interp::evaluate(&lg.graph, &inputs).unwrap();
    assert_eq!(outs[0], inputs[0].to_array());
}

// ---------------------------------------------------------------------------------------------
// Malformed multi-GPU files. Operators of the exported 2-GPU MLP: [0][0] X, [0][1] W1, [0][2]
// W2 (inputs), [0][3] customized, [0][4] matmul, [0][5] allreduce, [0][6] Y and [0][7] the
// hidden layer (outputs).

fn tp_doc() -> Value {
    export(&tp_mlp(2, DType::F16))
}

#[track_caller]
fn import_err(doc: &Value) -> GraphError {
    match import(doc) {
        Ok(_) => panic!("the document imported"),
        Err(e) => e,
    }
}

/// All validation errors of a document that imports.
#[track_caller]
fn invalid(doc: &Value) -> Vec<GraphError> {
    let file = import(doc).unwrap_or_else(|e| panic!("import failed: {e}"));
    match file.graphs[0].validate() {
        Ok(()) => panic!("the document validated"),
        Err(e) => e.0,
    }
}

/// Checks the JSON path and the operator, in the error and in its text.
#[track_caller]
fn assert_at(e: &GraphError, path: &str, op: &str) {
    assert_eq!(e.location.graph, Some(0), "graph index of: {e}");
    assert_eq!(
        e.location.json_path.as_deref(),
        Some(path),
        "JSON path of: {e}"
    );
    assert_eq!(e.location.op.as_deref(), Some(op), "operator of: {e}");
    let shown = e.to_string();
    assert!(
        shown.contains(&format!("graph 0, at {path} ({op}")),
        "{shown}"
    );
}

#[track_caller]
fn assert_msg(e: &GraphError, needle: &str) {
    assert!(e.to_string().contains(needle), "`{needle}` not in: {e}");
}

#[test]
fn partition_dim_out_of_range() {
    let mut doc = tp_doc();
    doc[0][1]["input_map"]["x"] = json!(2);
    let e = &invalid(&doc)[0];
    assert_at(e, "[0][1].input_map", "kn_input_op, kernel op 1");
    assert!(matches!(e.kind, ErrorKind::BadValue(_)), "{e}");
    assert_msg(
        e,
        "map entry x = 2 names dim 2, but the tensor [32, 32] has 2 dims",
    );

    let mut doc = tp_doc();
    doc[0][6]["output_map"]["y"] = json!(3);
    let e = &invalid(&doc)[0];
    assert_at(e, "[0][6].output_map", "kn_output_op, kernel op 6");
    assert_msg(e, "map entry y = 3 names dim 3");
}

#[test]
fn map_entry_that_is_not_a_dim_index_is_an_import_error() {
    let mut doc = tp_doc();
    doc[0][2]["input_map"]["z"] = json!(-2);
    let e = import_err(&doc);
    assert_at(&e, "[0][2].input_map.z", "kn_input_op, kernel op 2");
    assert_msg(&e, "map entry -2 is not a dim index");

    let mut doc = tp_doc();
    doc[0][7]["output_map"] = json!([1, -1, -1]);
    let e = import_err(&doc);
    assert_at(&e, "[0][7].output_map", "kn_output_op, kernel op 7");
    assert!(matches!(e.kind, ErrorKind::WrongType { .. }), "{e}");
}

#[test]
fn two_mesh_axes_on_one_dim() {
    let mut doc = tp_doc();
    doc[0][2]["input_map"] = json!({"x": 0, "y": 0, "z": -1});
    let e = &invalid(&doc)[0];
    assert_at(e, "[0][2].input_map", "kn_input_op, kernel op 2");
    assert!(
        matches!(
            e.kind,
            ErrorKind::MeshAxesShareDim {
                a: "x",
                b: "y",
                dim: 0
            }
        ),
        "{e}"
    );
    assert_msg(e, "GPU mesh axes x and y both partition dim 0");

    let mut doc = tp_doc();
    doc[0][7]["output_map"] = json!({"x": 1, "y": -1, "z": 1});
    let e = &invalid(&doc)[0];
    assert_at(e, "[0][7].output_map", "kn_output_op, kernel op 7");
    assert_msg(e, "GPU mesh axes x and z both partition dim 1");
}

#[test]
fn partitioned_graph_without_a_gpu_count() {
    let mut doc = tp_doc();
    doc[0][0].as_object_mut().unwrap().remove("mucc_gpu_dim");
    let errors = invalid(&doc);
    let paths: Vec<&str> = errors
        .iter()
        .map(|e| e.location.json_path.as_deref().unwrap())
        .collect();
    assert_eq!(
        paths,
        ["[0][1].input_map", "[0][2].input_map", "[0][7].output_map"]
    );
    assert!(
        errors
            .iter()
            .all(|e| matches!(e.kind, ErrorKind::GpuCountUnknown(_)))
    );
    assert_at(&errors[0], "[0][1].input_map", "kn_input_op, kernel op 1");
    assert_msg(
        &errors[0],
        "input_map (1, -1, -1) partitions the tensor across GPUs, but the graph's GPU count is unknown",
    );
    assert_at(&errors[2], "[0][7].output_map", "kn_output_op, kernel op 7");
}

#[test]
fn one_gpu_makes_every_partition_whole() {
    // A known mesh of one GPU: the maps are kept and cut nothing (like a grid axis of 1 block).
    let mut doc = tp_doc();
    doc[0][0]["mucc_gpu_dim"] = json!({"x": 1, "y": 1, "z": 1});
    // Per-GPU shapes of the 2-GPU file are then the global shapes of a smaller MLP.
    let file = import(&doc).unwrap();
    let lg = &file.graphs[0];
    lg.validate().unwrap();
    assert_eq!(lg.graph.sharding.num_gpus(), 1);
    assert_eq!(
        interp::global_input_shapes(&lg.graph),
        vec![shape(&[M, K]), shape(&[K, H / 2]), shape(&[H / 2, N])]
    );
}

#[test]
fn bad_gpu_dim_keys() {
    let cases = [
        (
            json!({"x": 0, "y": 1, "z": 1}),
            "[0][0].mucc_gpu_dim.x",
            "GPU count along x 0 is outside 1..=1024",
        ),
        (
            json!({"x": 2, "y": -1, "z": 1}),
            "[0][0].mucc_gpu_dim.y",
            "GPU count along y -1 is outside",
        ),
        (
            json!({"x": 64, "y": 32, "z": 1}),
            "[0][0].mucc_gpu_dim",
            "has 2048 GPUs; mucc accepts at most 1024",
        ),
        (
            json!({"x": 2, "y": 1}),
            "[0][0].mucc_gpu_dim.z",
            "missing key `z`",
        ),
        (
            json!(2),
            "[0][0].mucc_gpu_dim",
            "expected an object, found an integer",
        ),
    ];
    for (v, path, msg) in cases {
        let mut doc = tp_doc();
        doc[0][0]["mucc_gpu_dim"] = v;
        let e = import_err(&doc);
        assert_at(&e, path, "kernel op 0");
        assert_msg(&e, msg);
    }
}

#[test]
fn all_reduce_with_a_different_output_shape() {
    let mut doc = tp_doc();
    // The all-reduce's output and the output operator's copy of it, both [4, 8].
    doc[0][5]["output_tensors"][0]["dim"] = json!([4, 8, 0, 0]);
    doc[0][6]["input_tensors"][0]["dim"] = json!([4, 8, 0, 0]);
    let e = &invalid(&doc)[0];
    assert_at(
        e,
        "[0][5].output_tensors[0]",
        "kn_allreduce_op, kernel op 5",
    );
    assert!(matches!(e.kind, ErrorKind::ShapeMismatch { .. }), "{e}");
    assert_msg(e, "recorded [4, 8], but the operator produces [4, 16]");
}

#[test]
fn all_reduce_with_a_different_output_type() {
    let mut doc = tp_doc();
    doc[0][5]["output_tensors"][0]["data_type"] = json!(950);
    doc[0][6]["input_tensors"][0]["data_type"] = json!(950);
    let e = &invalid(&doc)[0];
    assert_at(
        e,
        "[0][5].output_tensors[0]",
        "kn_allreduce_op, kernel op 5",
    );
    assert!(matches!(e.kind, ErrorKind::DtypeMismatch { .. }), "{e}");
}

#[test]
fn all_reduce_with_two_inputs_or_two_outputs() {
    let mut doc = tp_doc();
    let x = doc[0][5]["input_tensors"][0].clone();
    doc[0][5]["input_tensors"].as_array_mut().unwrap().push(x);
    let e = &invalid(&doc)[0];
    assert_at(e, "[0][5]", "kn_allreduce_op, kernel op 5");
    assert!(
        matches!(
            e.kind,
            ErrorKind::Arity {
                what: "inputs",
                found: 2,
                ..
            }
        ),
        "{e}"
    );

    let mut doc = tp_doc();
    let mut y = doc[0][5]["output_tensors"][0].clone();
    y["guid"] = json!(99_999_999);
    doc[0][5]["output_tensors"].as_array_mut().unwrap().push(y);
    let e = &invalid(&doc)[0];
    assert_at(e, "[0][5]", "kn_allreduce_op, kernel op 5");
    assert!(
        matches!(
            e.kind,
            ErrorKind::Arity {
                what: "outputs",
                found: 2,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn all_reduce_with_a_bad_inplace_flag() {
    let mut doc = tp_doc();
    doc[0][5]["inplace"] = json!("yes");
    let e = import_err(&doc);
    assert_at(&e, "[0][5].inplace", "kn_allreduce_op, kernel op 5");
    assert!(matches!(e.kind, ErrorKind::WrongType { .. }), "{e}");
}

#[test]
fn global_inputs_of_the_wrong_shape_are_refused() {
    let g = tp_mlp(2, DType::F32);
    let mut global = interp::random_global_inputs(&g, InputSpec::default());
    global[1] = Array::full(shape(&[K, H / 2]), 0.0);
    let e = interp::evaluate_sharded(&g, &global, Rounding::Exact).unwrap_err();
    assert!(
        e.to_string()
            .contains("global input 1 has shape [32, 32], the graph expects [32, 64]"),
        "{e}"
    );
    let e = interp::gather_outputs(&g, &[]).unwrap_err();
    assert!(e.to_string().contains("runs on 2 GPUs"), "{e}");
}

#[test]
fn dim_map_of_the_maps() {
    // The maps are Mirage's int3 triples, typed as for threadblock maps.
    let g = tp_mlp(4, DType::F16);
    let maps: Vec<DimMap> = g.sharding.maps.values().copied().collect();
    assert_eq!(
        maps,
        [
            DimMap([Some(1), None, None]),
            DimMap([Some(0), None, None]),
            DimMap([Some(1), None, None])
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// Random sharded graphs (sharded or replicated input, element-wise steps, a reduction, 1–5
// all-reduces, plain, column-major or padded outputs): every one plans, and every all-reduce
// stays inside its buffers, never overlaps partially, and sums every value.

mod random_sharded {
    use super::*;
    use mucc::emit::launch::{AllReduceCall, LaunchPlan, Step};
    use mucc::sched::plan::Binding;
    use proptest::prelude::*;

    /// What follows the input: element-wise steps, a reduction of one dim, an all-reduce.
    #[derive(Clone, Debug)]
    enum Op {
        Exp,
        Silu,
        AddSelf,
        Scale,
        Reduce(usize),
        AllReduce,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            Just(Op::Exp),
            Just(Op::Silu),
            Just(Op::AddSelf),
            Just(Op::Scale),
            (0usize..2).prop_map(Op::Reduce),
            Just(Op::AllReduce),
            Just(Op::AllReduce),
        ]
    }

    #[derive(Clone, Debug)]
    enum Out {
        Plain,
        ColumnMajor,
        PaddedRows(usize),
    }

    #[allow(clippy::too_many_arguments)]
    fn build(
        gpus: usize,
        rows: usize,
        cols: usize,
        dtype: DType,
        split: i32,
        ops: &[Op],
        out: &Out,
    ) -> Option<KernelGraph> {
        let mut g = GraphBuilder::new();
        g.set_gpu_mesh(GpuMesh::line(gpus)).ok()?;
        let mut global = [rows, cols];
        if split >= 0 {
            global[split as usize] *= gpus;
        }
        let x = g.new_input_sharded(&global, dtype, [split, -1, -1]).ok()?;
        let mut t = x;
        let mut reduced = false;
        for o in ops {
            t = match o {
                Op::Exp => g.exp(t),
                Op::Silu => g.silu(t),
                Op::AddSelf => g.add(t, t),
                Op::Scale => g.mul_scalar(t, 0.5),
                Op::Reduce(d) if !reduced => {
                    reduced = true;
                    g.reduction(t, *d)
                }
                Op::Reduce(_) => continue,
                Op::AllReduce => g.all_reduce(t),
            }
            .ok()?;
        }
        let s = g.shape(t)?;
        let (r, c) = (s.dim(0), s.dim(1));
        match out {
            Out::Plain => g.mark_output(t).ok()?,
            Out::ColumnMajor => g.mark_output_strided(t, &[1, r]).ok()?,
            Out::PaddedRows(p) => g.mark_output_strided(t, &[c + p, 1]).ok()?,
        }
        g.build().ok()
    }

    /// The byte range an all-reduce touches through `b`: (buffer, first byte, end).
    fn range(plan: &LaunchPlan, b: Binding, bytes: usize) -> (String, usize, usize) {
        let (buf, off) = plan.resolve(b).expect("a binding of the plan");
        (format!("{buf:?}"), off, off + bytes)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        #[test]
        fn all_reduces_stay_in_their_buffers(
            gpus in 1usize..5,
            rows in 1usize..10,
            cols in 1usize..40,
            dtype in prop_oneof![Just(DType::F16), Just(DType::BF16), Just(DType::F32), Just(DType::F64)],
            split in -1i32..2,
            ops in prop::collection::vec(op(), 1..6),
            out in prop_oneof![Just(Out::Plain), Just(Out::ColumnMajor), (1usize..9).prop_map(Out::PaddedRows)],
        ) {
            let Some(g) = build(gpus, rows, cols, dtype, split, &ops, &out) else {
                return Err(TestCaseError::reject("builder refused the combination"));
            };
            // Every such graph plans: the all-reduce's output takes its input's layout, and
            // other user strides on it get a copy.
            let plan = plan_for(&g).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let e = mucc::emit::emit(&g, &plan, "random").map_err(|e| TestCaseError::fail(e.to_string()))?;
            let calls: Vec<&AllReduceCall> = e.launch.steps.iter().filter_map(|s| match s {
                Step::AllReduce(c) => Some(c),
                _ => None,
            }).collect();
            let planned = ops.iter().filter(|o| matches!(o, Op::AllReduce)).count();
            prop_assert_eq!(calls.len(), if gpus > 1 { planned } else { 0 });
            prop_assert_eq!(e.source.contains("ncclAllReduce"), gpus > 1 && planned > 0);
            for c in calls {
                let bytes = c.count * c.dtype.bytes();
                let (sb, s0, s1) = range(&e.launch, c.send, bytes);
                let (rb, r0, r1) = range(&e.launch, c.recv, bytes);
                // Inside the buffers: the workspace, or the caller's allocation.
                for (buf, end, b) in [(&sb, s1, c.send), (&rb, r1, c.recv)] {
                    let limit = match b {
                        Binding::Input { index, .. } => e.launch.inputs[index].alloc_bytes(),
                        Binding::Output { index, .. } => e.launch.outputs[index].alloc_bytes(),
                        Binding::Workspace { .. } => e.launch.workspace_bytes,
                        Binding::Exchange { .. } | Binding::Rank => 0,
                    };
                    prop_assert!(end <= limit, "{buf}: all-reduce ends at byte {end} of {limit}");
                }
                // In place or apart, never a partial overlap.
                prop_assert!(sb != rb || (s0, s1) == (r0, r1) || s1 <= r0 || r1 <= s0,
                    "send {sb} [{s0}, {s1}) overlaps recv [{r0}, {r1})");
            }
            // Every value is summed: the span covers the tensor.
            for (h, op) in g.ops.iter() {
                if let mucc::sched::KnOpPlan::AllReduce { count, .. } = plan.kernel_ops[h.index()] {
                    let n = g.tensors[op.outputs[0]].shape.numel();
                    prop_assert!(count >= n, "count {count} < {n} elements");
                }
            }
            // The interpreter takes every such graph.
            let global = interp::random_global_inputs(&g, InputSpec::default());
            let run = interp::evaluate_sharded(&g, &global, Rounding::Exact)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(run.per_rank.len(), gpus);
        }
    }
}
