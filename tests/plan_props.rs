//! Property tests of the planners on random valid threadblock graphs, and the solver's error and
//! fallback paths.

use mucc::graph::builder::{GraphBuilder, TbGraphBuilder};
use mucc::graph::{AccumKind, DType, Handle, KernelGraph, STensor};
use mucc::layout::solve::SolveMethod;
use mucc::layout::{SolveOptions, resolve};
use mucc::sched::order::Step;
use mucc::sched::{Options, PlanError};
use mucc::target::{Arch, Target};
use proptest::prelude::*;

/// One step of a random program over in-loop tiles [16, 32] (pool A) and [32, 32] (pool W).
#[derive(Clone, Debug)]
enum Op {
    Unary(u8, usize),
    Binary(u8, usize, usize),
    Matmul(usize, usize),
    RowSumThenDiv(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..4, 0usize..64).prop_map(|(k, a)| Op::Unary(k, a)),
        (0u8..4, 0usize..64, 0usize..64).prop_map(|(k, a, b)| Op::Binary(k, a, b)),
        (0usize..64, 0usize..64).prop_map(|(a, w)| Op::Matmul(a, w)),
        (0usize..64).prop_map(Op::RowSumThenDiv),
    ]
}

/// A random valid graph: `n_in` inputs streamed over the loop, random ops, 1–3 accumulators of
/// random kinds, optional after-loop ops, every after-loop leaf stored.
fn build(
    grid_x: usize,
    f: usize,
    n_in: usize,
    ops: &[Op],
    accs: &[(usize, u8)],
    post: &[(u8, usize)],
) -> Option<KernelGraph> {
    let mut g = GraphBuilder::new();
    let mut tb = TbGraphBuilder::new([grid_x, 1, 1], [128, 1, 1], f);
    let mut a_pool: Vec<Handle<STensor>> = Vec::new();
    let mut w_pool: Vec<Handle<STensor>> = Vec::new();
    for i in 0..n_in {
        let x = g.new_input(&[16, 32 * f * grid_x], DType::F16).ok()?;
        a_pool.push(tb.new_input(&g, x, [1, -1, -1], 1).ok()?);
        if i % 2 == 0 {
            let w = g.new_input(&[32 * f, 32 * grid_x], DType::F16).ok()?;
            w_pool.push(tb.new_input(&g, w, [1, -1, -1], 0).ok()?);
        }
    }
    for o in ops {
        let pick = |pool: &Vec<Handle<STensor>>, i: usize| pool[i % pool.len()];
        let t = match *o {
            Op::Unary(k, a) => {
                let x = pick(&a_pool, a);
                match k {
                    0 => tb.exp(x),
                    1 => tb.silu(x),
                    2 => tb.square(x),
                    _ => tb.mul_scalar(x, 0.5),
                }
            }
            Op::Binary(k, a, b) => {
                let (x, y) = (pick(&a_pool, a), pick(&a_pool, b));
                match k {
                    0 => tb.add(x, y),
                    1 => tb.mul(x, y),
                    2 => tb.sub(x, y),
                    _ => tb.div(x, y),
                }
            }
            Op::Matmul(a, w) => tb.matmul(pick(&a_pool, a), pick(&w_pool, w)),
            Op::RowSumThenDiv(a) => {
                let x = pick(&a_pool, a);
                let r = tb.reduction(x, 1).ok()?;
                tb.div(x, r)
            }
        };
        a_pool.push(t.ok()?);
    }
    let kinds = [
        AccumKind::Nored,
        AccumKind::Max,
        AccumKind::RedLdSum,
        AccumKind::RedLdRms,
        AccumKind::RedLdMean,
    ];
    let mut after: Vec<Handle<STensor>> = Vec::new();
    for &(i, k) in accs {
        let x = a_pool[a_pool.len() - 1 - i % a_pool.len()];
        let kind = kinds[k as usize % kinds.len()];
        after.push(tb.forloop_accum(x, kind).ok()?);
    }
    let mut leaves = after.clone();
    for &(k, i) in post {
        let x = after[i % after.len()];
        let y = match k {
            0 => tb.sqrt(x),
            1 => tb.exp(x),
            _ => tb.add(x, x),
        };
        leaves.push(y.ok()?);
    }
    for t in leaves {
        tb.new_output(t, [1, -1, -1]).ok()?;
    }
    let outs = g.customized(tb).ok()?;
    for o in outs {
        g.mark_output(o).ok()?;
    }
    g.build().ok()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// On random graphs: every chain runs after its producers with a barrier in between, no two
    /// live shared-memory buffers overlap, and planning is deterministic.
    #[test]
    fn random_graphs_plan_soundly(
        grid_x in 1usize..3,
        f in prop_oneof![Just(1usize), Just(2), Just(4)],
        n_in in 1usize..4,
        ops in prop::collection::vec(op(), 0..8),
        accs in prop::collection::vec((0usize..8, 0u8..5), 1..4),
        post in prop::collection::vec((0u8..3, 0usize..4), 0..3),
        arch in prop_oneof![Just(Arch::Sm80), Just(Arch::Sm90a)],
    ) {
        let Some(g) = build(grid_x, f, n_in, &ops, &accs, &post) else {
            return Err(TestCaseError::reject("builder refused the combination"));
        };
        let opts = Options { target: Target::new(arch), solve: SolveOptions::default(), path: Default::default(), dependent_launch: false, symbols: Default::default(), cluster_split: true, cluster_push: true, cluster_combine: false, last_block_combine: false, grid_split: Default::default(), cta: Default::default(), register_pipes: true, register_rows: true, wgmma: true, tma: true, fuse_matmuls: true, online_softmax: Default::default(), fold_key_splits: Default::default(), all_reduce: Default::default(), max_stages: None, resident_blocks: None, refine_loops: Default::default() };
        let plan = mucc::sched::plan(&g, &opts).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let (_, tb) = g.customized_ops().next().unwrap();
        let kp = plan.kernels.values().next().unwrap();
        // Order and barriers.
        let steps: Vec<_> = kp.schedule.steps().collect();
        let pos = |c: usize| steps.iter().position(|(_, s)| **s == Step::Run(c)).unwrap();
        for (c, chain) in kp.fusion.chains.iter().enumerate() {
            for &t in &tb.ops[chain.leader()].inputs {
                let p = kp.fusion.chain_of[tb.producer(t).unwrap().index()];
                prop_assert!(pos(p) < pos(c));
                prop_assert!(steps[pos(p)..pos(c)].iter().any(|(_, s)| matches!(s, Step::Barrier(_))));
            }
        }
        // Memory.
        let b = &kp.smem.buffers;
        let off = &kp.smem.packing.offsets;
        for i in 0..b.len() {
            for j in i + 1..b.len() {
                let time = b[i].start < b[j].end && b[j].start < b[i].end;
                let space = off[i] < off[j] + b[j].bytes && off[j] < off[i] + b[i].bytes;
                prop_assert!(!(time && space), "{} and {} overlap", b[i].name, b[j].name);
            }
        }
        prop_assert!(kp.smem.packing.peak >= kp.smem.packing.lower_bound);
        // Determinism.
        let again = mucc::sched::plan(&g, &opts).unwrap();
        prop_assert_eq!(mucc::explain::explain(&g, &plan), mucc::explain::explain(&g, &again));
    }
}

/// A kernel-level matmul whose operand's contiguous dim is its batch dim cannot be laid out for
/// cuBLAS: the error names both constraints in conflict.
#[test]
fn unsatisfiable_layouts_name_the_conflicting_operators() {
    let mut g = GraphBuilder::new();
    // [4, 8, 16] stored batch-innermost.
    let a = g
        .new_input_strided(&[4, 8, 16], &[1, 64, 4], DType::F16)
        .unwrap();
    let b = g.new_input(&[4, 16, 8], DType::F16).unwrap();
    let c = g.matmul(a, b).unwrap();
    g.mark_output(c).unwrap();
    let g = g.build().unwrap();
    let opts = Options {
        target: Target::new(Arch::Sm80),
        solve: SolveOptions::default(),
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
    let e = mucc::sched::plan(&g, &opts).unwrap_err();
    let PlanError::Layout(le) = &e else {
        panic!("{e}")
    };
    let text = e.to_string();
    assert!(
        le.conflict
            .iter()
            .any(|c| c
                .contains("kernel op 0 (kn_input_op): the caller's strides make dim 0 innermost")),
        "{text}"
    );
    assert!(
        le.conflict.iter().any(|c| c
            .contains("kernel op 2 (kn_matmul_op): A's innermost dim must be one of its last two")),
        "{text}"
    );
}

/// The fallback search (used when Z3 gives up) finds layouts satisfying every constraint; on
/// the corpus-like gated MLP its cost is no better than Z3's optimum.
#[test]
fn fallback_search_finds_feasible_layouts() {
    let f = mucc::read_file(
        std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../shared/corpus/mirage-benchmarks/gqa_bs1.json"
        )),
        &Default::default(),
    )
    .unwrap();
    for lg in f.graphs.iter().take(5) {
        let g = &lg.graph;
        let fusion = g
            .customized_ops()
            .map(|(h, tb)| (h.index(), mucc::graph::fusion::fuse(tb)))
            .collect();
        let z3 = resolve(g, &fusion, &SolveOptions::default()).unwrap();
        let fb = resolve(
            g,
            &fusion,
            &SolveOptions {
                force_fallback: true,
                ..SolveOptions::default()
            },
        )
        .unwrap();
        assert_eq!(z3.report.method, SolveMethod::Z3);
        assert!(matches!(fb.report.method, SolveMethod::Fallback { .. }));
        // Z3's resource budget, not the clock, sends a graph to the fallback: the same layout
        // on every machine.
        let starved = SolveOptions {
            rlimit: 1000,
            ..SolveOptions::default()
        };
        let a = resolve(g, &fusion, &starved).unwrap();
        let b = resolve(g, &fusion, &starved).unwrap();
        assert!(
            matches!(&a.report.method, SolveMethod::Fallback { .. }),
            "{:?}",
            a.report.method
        );
        assert_eq!(
            (a.cost, a.report.method.clone()),
            (b.cost, b.report.method.clone())
        );
        assert!(fb.cost >= z3.cost, "z3 {} fallback {}", z3.cost, fb.cost);
    }
}

/// A tile too large for shared memory is a clear error with the lower bound.
#[test]
fn shared_memory_overflow_is_an_error() {
    let mut g = GraphBuilder::new();
    let x = g.new_input(&[256, 512], DType::F32).unwrap();
    let mut tb = TbGraphBuilder::new([1, 1, 1], [128, 1, 1], 1);
    // A 512 KiB tile, and an accumulator of the same size (too big for registers).
    let t = tb.new_input(&g, x, [-1, -1, -1], -1).unwrap();
    let a = tb.forloop_accum(t, AccumKind::Nored).unwrap();
    tb.new_output(a, [-1, -1, -1]).unwrap();
    let o = g.customized(tb).unwrap();
    g.mark_output(o[0]).unwrap();
    let g = g.build().unwrap();
    let e = mucc::sched::plan(
        &g,
        &Options {
            target: Target::new(Arch::Sm90a),
            solve: SolveOptions::default(),
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
        },
    )
    .unwrap_err();
    assert!(
        matches!(e, PlanError::SharedMemory { limit: 232_192, .. }),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("kernel op 1 (kn_customized_op) needs"),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("lower bound of any plan: 1048576 bytes"),
        "{e}"
    );
}

/// Intermediate DTensors share workspace once dead (Mirage never reuses): a chain of four
/// kernels needs two buffers, not three. Buffers are 128-byte aligned.
#[test]
fn workspace_reuses_dead_intermediates() {
    let mut g = GraphBuilder::new();
    let x = g.new_input(&[3, 50], DType::F32).unwrap();
    let a = g.exp(x).unwrap();
    let b = g.exp(a).unwrap();
    let c = g.exp(b).unwrap();
    let d = g.exp(c).unwrap();
    g.mark_output(d).unwrap();
    let g = g.build().unwrap();
    let p = mucc::sched::plan(
        &g,
        &Options {
            target: Target::new(Arch::Sm80),
            solve: SolveOptions::default(),
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
        },
    )
    .unwrap();
    assert_eq!(p.workspace.len(), 3);
    // [3, 50] f32 rows padded to 52: 624 bytes, 640 with 128-byte alignment.
    assert!(p.workspace.iter().all(|b| b.bytes == 640));
    assert_eq!(p.workspace_bytes(), 1280);
    assert_eq!(p.workspace_packing.lower_bound, 1280);
    assert!(p.workspace_packing.offsets.iter().all(|o| o % 128 == 0));
}

/// Tiles written between the same two barriers run concurrently: their buffers never share
/// memory, even when one of them is never read (found by generated-graph testing on a GPU: an
/// unread input tile copied over a live one). And a running max's state lives through the
/// loop.
#[test]
fn concurrent_tiles_and_loop_state_never_share_memory() {
    let mut g = GraphBuilder::new();
    let a = g.new_input(&[32, 13], DType::F32).unwrap();
    let b = g.new_input(&[32, 13], DType::F32).unwrap();
    let c = g.new_input(&[32, 26], DType::F32).unwrap();
    let mut tb = TbGraphBuilder::new([1, 1, 1], [128, 1, 1], 2);
    let _unread = tb.new_input(&g, a, [-1, -1, -1], -1).unwrap();
    let tb_b = tb.new_input(&g, b, [-1, -1, -1], -1).unwrap();
    let tc = tb.new_input(&g, c, [-1, -1, -1], 1).unwrap();
    let (_, diff) = tb.reduction_max(tc, 1).unwrap();
    let scale = tb.exp(diff).unwrap();
    let e = tb.exp(tb_b).unwrap();
    let acc = tb.forloop_accum(e, AccumKind::Nored).unwrap();
    let r = tb
        .forloop_accum_rescale(tc, scale, AccumKind::RedLdSumRescale)
        .unwrap();
    tb.new_output(acc, [-1, -1, -1]).unwrap();
    tb.new_output(r, [-1, -1, -1]).unwrap();
    let outs = g.customized(tb).unwrap();
    for o in outs {
        g.mark_output(o).unwrap();
    }
    let g = g.build().unwrap();
    for arch in [Arch::Sm80, Arch::Sm90a] {
        let plan = mucc::sched::plan(&g, &Options::for_target(Target::new(arch))).unwrap();
        let kp = plan.kernels.values().next().unwrap();
        let sm = &kp.smem;
        let range = |tile: usize| {
            let b = sm.buffer_of(tile).unwrap();
            (sm.offset(b), sm.offset(b) + sm.buffers[b].bytes, b)
        };
        // s0 (unread) and s1 are copied in the same interval.
        let (a0, a1, _) = range(0);
        let (b0, b1, _) = range(1);
        assert!(
            a1 <= b0 || b1 <= a0,
            "{arch}: s0 [{a0}, {a1}) overlaps s1 [{b0}, {b1})"
        );
        // The running max's state (s3) is live over the whole loop.
        let (_, _, st) = range(3);
        let steps = kp.schedule.steps().count();
        let loop_steps: Vec<usize> = kp
            .schedule
            .steps()
            .enumerate()
            .filter(|(_, (ph, _))| *ph == mucc::sched::order::Phase::Loop)
            .map(|(i, _)| i)
            .collect();
        let buf = &sm.buffers[st];
        assert!(
            buf.start <= loop_steps[0] && buf.end > *loop_steps.last().unwrap() && buf.end <= steps,
            "{arch}: running-max state lives [{}, {}) but the loop is {loop_steps:?}",
            buf.start,
            buf.end
        );
    }
}

/// x [rows, 64·f] · w [64·f, 64·grid] with the for-loop over K, on `grid` blocks; accumulators of
/// `kind` (a second input r [rows, 64·grid] rescales for the rescaling kinds).
fn decode_like(grid: usize, f: usize, kind: AccumKind) -> KernelGraph {
    let mut g = GraphBuilder::new();
    let x = g.new_input(&[16, 64 * f], DType::F16).unwrap();
    let w = g.new_input(&[64 * f, 64 * grid], DType::F16).unwrap();
    let mut tb = TbGraphBuilder::new([grid, 1, 1], [128, 1, 1], f);
    let tx = tb.new_input(&g, x, [-1, -1, -1], 1).unwrap();
    let tw = tb.new_input(&g, w, [1, -1, -1], 0).unwrap();
    let y = tb.matmul(tx, tw).unwrap();
    let a = match kind {
        AccumKind::NoredRescale => {
            let r = g.new_input(&[16, 64 * grid], DType::F16).unwrap();
            let tr = tb.new_input(&g, r, [1, -1, -1], -1).unwrap();
            tb.forloop_accum_rescale(y, tr, kind).unwrap()
        }
        _ => tb.forloop_accum(y, kind).unwrap(),
    };
    tb.new_output(a, [1, -1, -1]).unwrap();
    let outs = g.customized(tb).unwrap();
    g.mark_output(outs[0]).unwrap();
    g.build().unwrap()
}

fn plan_for(
    g: &KernelGraph,
    arch: Arch,
    path: mucc::sched::PathChoice,
) -> Result<mucc::sched::GraphPlan, PlanError> {
    let opts = Options {
        target: Target::new(arch),
        solve: SolveOptions::default(),
        path,
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
    mucc::sched::plan(g, &opts)
}

/// The cluster split: taken on sm_90a when the grid leaves SMs idle, with the largest cluster
/// that divides the loop and keeps every CTA resident; off (with the reason) on the Ampere path,
/// for grids that fill the GPU and for accumulators that cannot combine after the fact.
#[test]
fn cluster_split_follows_grid_path_and_accumulators() {
    use mucc::sched::PathChoice;
    use mucc::sched::plan::{Combine, Split, SplitOff};
    let one = |g: &KernelGraph, arch, path| -> Split {
        let p = plan_for(g, arch, path).unwrap();
        assert_eq!(p.kernels.len(), 1);
        p.kernels.values().next().unwrap().split.clone()
    };
    let small = decode_like(4, 64, AccumKind::Nored);
    let Split::Cluster(c) = one(&small, Arch::Sm90a, PathChoice::Auto) else {
        panic!("4 blocks of a 64-iteration loop should split")
    };
    assert_eq!((c.ctas, c.iters), (8, 8));
    assert_eq!(c.partials.len(), 1);
    assert_eq!(c.partials[0].combine, Combine::Sum);
    let p = plan_for(&small, Arch::Sm90a, PathChoice::Auto).unwrap();
    let kp = p.kernels.values().next().unwrap();
    assert_eq!(kp.launch_grid(), [32, 1, 1]);
    assert!(kp.pipeline_stages() <= c.iters);
    // The same graph on the Ampere path, and on sm_80: no cluster split; the planner's grid
    // split over the most CTAs that keep 4 iterations each (4 blocks launch fewer than 1.5 CTAs
    // per SM at any count); none with `--grid-split off`.
    for arch in [Arch::Sm90a, Arch::Sm80] {
        let path = if arch == Arch::Sm90a {
            PathChoice::Ampere
        } else {
            PathChoice::Auto
        };
        let Split::Grid(g) = one(&small, arch, path) else {
            panic!("{arch}: the Ampere path's rule should split 4 blocks over the grid")
        };
        assert_eq!((g.ctas, g.iters, g.asked), (16, 4, false), "{arch}");
        let off = Options {
            path,
            grid_split: mucc::sched::GridSplitChoice::Off,
            ..Options::for_target(Target::new(arch))
        };
        let p = mucc::sched::plan(&small, &off).unwrap();
        assert_eq!(
            p.kernels.values().next().unwrap().split,
            Split::Off(SplitOff::Ampere)
        );
    }
    // The Hopper path on sm_80 is an error, not a silent fallback.
    let e = plan_for(&small, Arch::Sm80, PathChoice::Hopper).unwrap_err();
    assert!(matches!(e, PlanError::PathUnavailable { .. }), "{e}");
    // A max accumulator combines by max.
    let Split::Cluster(m) = one(
        &decode_like(4, 64, AccumKind::Max),
        Arch::Sm90a,
        PathChoice::Auto,
    ) else {
        panic!("a max accumulator should split")
    };
    assert_eq!(m.partials[0].combine, Combine::Max);
    // A rescaling accumulator cannot be split; a grid that fills the GPU need not be.
    match one(
        &decode_like(4, 64, AccumKind::NoredRescale),
        Arch::Sm90a,
        PathChoice::Auto,
    ) {
        Split::Off(why) => assert!(matches!(why, SplitOff::Rescales { .. }), "{why}"),
        s => panic!("rescale split: {s:?}"),
    }
    match one(
        &decode_like(256, 4, AccumKind::Nored),
        Arch::Sm90a,
        PathChoice::Auto,
    ) {
        Split::Off(why) => assert!(matches!(why, SplitOff::GridFills { .. }), "{why}"),
        s => panic!("a full grid split: {s:?}"),
    }
    // Every CTA resident at once: blocks × CTAs ≤ SMs × CTAs per SM.
    for grid in [1, 2, 3, 5, 16, 33, 64, 100, 131] {
        if let Split::Cluster(c) = one(
            &decode_like(grid, 64, AccumKind::Nored),
            Arch::Sm90a,
            PathChoice::Auto,
        ) {
            assert!(
                grid * c.ctas <= 132 * c.resident_per_sm,
                "grid {grid}: {c:?}"
            );
            assert_eq!(c.iters * c.ctas, 64);
        }
    }
}

/// The builder-made decode graphs (M ∈ {1, 8}, bf16/fp16, Qwen2.5 sizes, grids of 32–86 blocks)
/// plan for both targets, and every one splits its for-loop over a cluster on sm_90a.
#[test]
fn decode_graphs_plan_and_split_on_sm90a() {
    use mucc::sched::PathChoice;
    let graphs = mucc::graph::workloads::decode_graphs().unwrap();
    assert_eq!(graphs.len(), 16);
    for (name, g) in &graphs {
        plan_for(g, Arch::Sm80, PathChoice::Auto).unwrap_or_else(|e| panic!("{name}: {e}"));
        let p =
            plan_for(g, Arch::Sm90a, PathChoice::Auto).unwrap_or_else(|e| panic!("{name}: {e}"));
        for kp in p.kernels.values() {
            assert!(kp.split.cluster().is_some(), "{name}: {:?}", kp.split);
        }
    }
}

/// Programmatic dependent launch: only with `dependent_launch` on the Hopper path, for a
/// threadblock kernel that follows a generated kernel (mha_bs1 graph 1: cuBLAS, then two
/// threadblock kernels; the first triggers the second).
#[test]
fn dependent_launch_follows_option_path_and_previous_step() {
    use mucc::sched::plan::DependentLaunch;
    let f = mucc::read_file(
        std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../shared/corpus/mirage-benchmarks/mha_bs1.json"
        )),
        &Default::default(),
    )
    .unwrap();
    let g = &f.graphs[1].graph;
    let with = |path: mucc::sched::PathChoice, on: bool, arch: Arch| {
        let opts = Options {
            target: Target::new(arch),
            solve: SolveOptions::default(),
            path,
            dependent_launch: on,
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
            // The first kernel follows a cuBLAS call: the matmul stays one.
            fuse_matmuls: false,
            online_softmax: Default::default(),
            fold_key_splits: Default::default(),
            all_reduce: Default::default(),
            max_stages: None,
            resident_blocks: None,
            refine_loops: Default::default(),
        };
        mucc::sched::plan(g, &opts).unwrap()
    };
    let p = with(mucc::sched::PathChoice::Auto, true, Arch::Sm90a);
    let k: Vec<_> = p.kernels.iter().collect();
    assert_eq!(k.len(), 2);
    let (first, second) = (k[0].1, k[1].1);
    assert!(matches!(
        &first.dependent,
        DependentLaunch::Off(mucc::sched::plan::PlainLaunch::AfterLibrary)
    ));
    assert!(first.triggers_next);
    assert_eq!(second.dependent, DependentLaunch::Programmatic);
    assert!(!second.triggers_next);
    for p in [
        with(mucc::sched::PathChoice::Auto, false, Arch::Sm90a),
        with(mucc::sched::PathChoice::Ampere, true, Arch::Sm90a),
        with(mucc::sched::PathChoice::Auto, true, Arch::Sm80),
    ] {
        assert!(
            p.kernels
                .values()
                .all(|k| !k.dependent.is_programmatic() && !k.triggers_next)
        );
    }
}
