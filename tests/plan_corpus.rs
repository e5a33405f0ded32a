//! Every corpus graph gets a complete plan for sm_80 and sm_90a, and the plans keep their
//! invariants: shared memory within the target's limit, no two live buffers overlapping, every
//! chain scheduled after the chains it reads with a barrier in between, deterministic output.

mod common;

use std::time::{Duration, Instant};

use common::corpus_files;
use mucc::graph::fusion::FusionPlan;
use mucc::graph::{KnOpKind, TbGraph};
use mucc::sched::memory::Buffer;
use mucc::sched::order::{Schedule, Step};
use mucc::sched::{GraphPlan, Options};
use mucc::target::Target;
use mucc::{ImportOptions, read_file};
use rayon::prelude::*;

fn no_overlap(bufs: &[Buffer], offsets: &[usize]) -> Result<(), String> {
    for i in 0..bufs.len() {
        for j in i + 1..bufs.len() {
            let (a, b) = (&bufs[i], &bufs[j]);
            let time = a.start < b.end && b.start < a.end;
            let space = offsets[i] < offsets[j] + b.bytes && offsets[j] < offsets[i] + a.bytes;
            if time && space {
                return Err(format!("{} and {} overlap", a.name, b.name));
            }
        }
    }
    Ok(())
}

/// Every chain runs after the chains producing its inputs, with a barrier between them unless
/// they are in different phases (phase boundaries have their own barriers) or the input is a
/// register pipe's tile (`piped`): its reader runs inside the producer's chain, at the same
/// level, and the value never passes through shared memory.
fn ordered(tb: &TbGraph, f: &FusionPlan, s: &Schedule, piped: &[usize]) -> Result<(), String> {
    let steps: Vec<_> = s.steps().collect();
    let pos = |c: usize| {
        steps
            .iter()
            .position(|(_, st)| **st == Step::Run(c))
            .expect("every chain runs")
    };
    for (c, chain) in f.chains.iter().enumerate() {
        for &t in &tb.ops[chain.leader()].inputs {
            let p = f.chain_of[tb.producer(t).expect("defined").index()];
            let (pp, pc) = (pos(p), pos(c));
            if pp >= pc {
                return Err(format!("chain {c} runs before its producer {p}"));
            }
            if piped.contains(&t.index()) {
                if (s.phase[p], s.level[p]) != (s.phase[c], s.level[c]) {
                    return Err(format!("piped s{} read at another level", t.index()));
                }
                continue;
            }
            if !steps[pp..pc]
                .iter()
                .any(|(_, st)| matches!(st, Step::Barrier(_)))
            {
                return Err(format!("no barrier between chain {p} and its reader {c}"));
            }
        }
    }
    Ok(())
}

fn check(g: &mucc::KernelGraph, p: &GraphPlan) -> Result<(), String> {
    let g = p.graph(g);
    for (&k, kp) in &p.kernels {
        let KnOpKind::Customized(tb) = &g.ops[mucc::graph::Handle::from_index(k)].kind else {
            return Err("not customized".into());
        };
        if kp.smem.total > p.target.smem_per_block {
            return Err("over the shared-memory limit".into());
        }
        no_overlap(&kp.smem.buffers, &kp.smem.packing.offsets)?;
        let piped: Vec<usize> = kp.register_pipes().flat_map(|p| p.tiles()).collect();
        ordered(tb, &kp.fusion, &kp.schedule, &piped)?;
        if kp.smem.packing.peak < kp.smem.packing.lower_bound {
            return Err("peak below the lower bound".into());
        }
    }
    no_overlap(&p.workspace, &p.workspace_packing.offsets)
}

#[test]
fn every_corpus_graph_plans_for_both_targets() {
    let files = corpus_files();
    let graphs: Vec<(String, usize, mucc::KernelGraph)> = files
        .iter()
        .flat_map(|f| {
            let name = f.file_name().unwrap().to_string_lossy().into_owned();
            read_file(f, &ImportOptions::default())
                .unwrap()
                .graphs
                .into_iter()
                .enumerate()
                .map(move |(i, g)| (name.clone(), i, g.graph))
        })
        .collect();
    assert_eq!(graphs.len(), 604);
    let start = Instant::now();
    let results: Vec<(Duration, f64, Result<(), String>)> = graphs
        .par_iter()
        .flat_map(|(name, i, g)| {
            Target::all()
                .into_iter()
                .map(|target| {
                    let opts = Options {
                        target,
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
                    match mucc::sched::plan(g, &opts) {
                        Ok(p) => {
                            let ratio = p
                                .kernels
                                .values()
                                .map(|k| {
                                    k.smem.packing.peak as f64
                                        / k.smem.packing.lower_bound.max(1) as f64
                                })
                                .fold(1.0, f64::max);
                            let r = check(g, &p)
                                .map_err(|e| format!("{name} graph {i} {}: {e}", target.arch));
                            (p.layout.report.elapsed, ratio, r)
                        }
                        Err(e) => (
                            Duration::ZERO,
                            1.0,
                            Err(format!("{name} graph {i} {}: {e}", target.arch)),
                        ),
                    }
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let wall = start.elapsed();
    let errors: Vec<&String> = results
        .iter()
        .filter_map(|(_, _, r)| r.as_ref().err())
        .collect();
    assert!(
        errors.is_empty(),
        "{} failures:\n{}",
        errors.len(),
        errors
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    let mut times: Vec<Duration> = results.iter().map(|r| r.0).collect();
    times.sort();
    let worst = results.iter().map(|r| r.1).fold(1.0, f64::max);
    eprintln!(
        "planned {} graph×target pairs in {:.1} s wall; layout solve median {:.1} ms, max {:.1} ms; worst smem peak / lower bound {:.3}",
        results.len(),
        wall.as_secs_f64(),
        times[times.len() / 2].as_secs_f64() * 1e3,
        times[times.len() - 1].as_secs_f64() * 1e3,
        worst
    );
}

#[test]
fn plans_are_deterministic() {
    let f = read_file(
        &common::corpus_dir().join("gqa_bs1.json"),
        &ImportOptions::default(),
    )
    .unwrap();
    for lg in f.graphs.iter().take(4) {
        for target in Target::all() {
            let opts = Options {
                target,
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
            let a =
                mucc::explain::explain(&lg.graph, &mucc::sched::plan(&lg.graph, &opts).unwrap());
            let b =
                mucc::explain::explain(&lg.graph, &mucc::sched::plan(&lg.graph, &opts).unwrap());
            assert_eq!(a, b);
        }
    }
}

/// The split attention candidates hand their partial products to a division kernel through a
/// workspace; its layout keeps the split dim innermost, so that each block of that kernel reads
/// whole rows (`TB_INPUT_SHORT_RUNS`), not 16-byte pieces 2 KB apart (mqa_bs8 g3's division
/// took 12.9 µs on an H100 that way; with the rows, mqa_bs8 0.87× and gqa_bs8 0.83× the time).
#[test]
fn split_attention_workspaces_keep_the_split_dim_innermost() {
    for (file, graph, shape) in [
        ("mqa_bs8.json", 3, [8, 1024, 512]),
        ("gqa_bs8.json", 8, [16, 256, 1024]),
    ] {
        let f = read_file(&common::corpus_dir().join(file), &ImportOptions::default()).unwrap();
        let g = &f.graphs[graph].graph;
        let p = mucc::sched::plan(
            g,
            &Options::for_target(Target::new(mucc::target::Arch::Sm90a)),
        )
        .unwrap();
        let (h, _) = g
            .tensors
            .iter()
            .find(|(_, t)| t.shape.dims() == shape)
            .unwrap_or_else(|| panic!("{file} g{graph} has a {shape:?} tensor"));
        assert_eq!(p.dtensors[h.index()].innermost, 2, "{file} g{graph}");
    }
}

/// A kernel with a register pipe gets rings of at most 2 stages on the Hopper path (gqa_bs8's
/// online-softmax attention: 4 stages of 16 KB otherwise, one block per SM fewer), and keeps
/// its deeper ring without the pipe and on the Ampere path.
#[test]
fn piped_kernels_keep_rings_of_two_stages_on_hopper() {
    use mucc::target::Arch;
    let f = read_file(
        &common::corpus_dir().join("gqa_bs8.json"),
        &ImportOptions::default(),
    )
    .unwrap();
    let g = &f.graphs[0].graph;
    let stages = |opts: &Options| {
        let p = mucc::sched::plan(g, opts).unwrap();
        let (piped, kp) = p
            .kernels
            .values()
            .map(|kp| (kp.register_pipes().next().is_some(), kp))
            .max_by_key(|(_, kp)| kp.pipeline_stages())
            .unwrap();
        (piped, kp.pipeline_stages(), kp.smem.total)
    };
    let hopper = Options::for_target(Target::new(Arch::Sm90a));
    let (piped, two, small) = stages(&hopper);
    assert!(piped);
    assert_eq!(two, 2);
    let no_pipe = Options {
        register_pipes: false,
        ..hopper.clone()
    };
    let (piped, deep, _) = stages(&no_pipe);
    assert!(!piped && deep > 2);
    let (piped, deep, large) = stages(&Options::for_target(Target::new(Arch::Sm80)));
    assert!(
        piped && deep > 2 && large > small,
        "{deep} stages, {large} B"
    );
}

/// An output of an fp32 accumulator tile copies in chunks that convert in registers: mqa_bs8's
/// attention O (64 × 64 fp32 in shared memory, f16 in the workspace) in chunks of 4 elements,
/// 16 bytes read from the tile and 8 written to the tensor, on both paths; the per-row sums and
/// maxima, whose tile rows run across the tensor's contiguous dim, stay element copies.
#[test]
fn accumulator_outputs_copy_in_converting_chunks() {
    use mucc::graph::threadblock::TbOpKind;
    use mucc::sched::ops::{Copy, OpPlan};
    use mucc::target::Arch;
    let f = read_file(
        &common::corpus_dir().join("mqa_bs8.json"),
        &ImportOptions::default(),
    )
    .unwrap();
    let g = &f.graphs[13].graph;
    for arch in [Arch::Sm80, Arch::Sm90a] {
        let p = mucc::sched::plan(g, &Options::for_target(Target::new(arch))).unwrap();
        let planned = p.graph(g);
        let mut converting = 0;
        for (k, tb) in planned.customized_ops() {
            let kp = &p.kernels[&k.index()];
            for (h, op) in tb.ops.iter() {
                let (TbOpKind::Output { .. }, OpPlan::Output { copy: Some(c) }) =
                    (&op.kind, &kp.ops[h.index()])
                else {
                    continue;
                };
                let tile = &kp.tiles[op.inputs[0].index()];
                let wide = tile
                    .as_ref()
                    .is_some_and(|t| t.dtype != tb.tensors[op.inputs[0]].dtype);
                if tb.tensors[op.inputs[0]].shape.numel() == 64 * 64 {
                    assert!(wide, "{arch:?}: the O tile is stored in fp32");
                    assert_eq!(
                        *c,
                        Copy::Chunked {
                            dim: 2,
                            chunk_elems: 4,
                            bytes: 8,
                            tile_bytes: 16
                        },
                        "{arch:?}"
                    );
                    assert!(c.converts());
                    converting += 1;
                } else {
                    assert!(matches!(c, Copy::Elementwise { .. }), "{arch:?}: {c:?}");
                }
            }
        }
        assert_eq!(converting, 1, "{arch:?}");
    }
}

/// The attention candidates that exponentiate loaded scores (mha_bs1's graph-form candidates
/// and qknorm's softmaxes over whole rows) take them less their row max (`sched::shift`):
/// the planned graph computes the graph's function (the f64 interpreter, inputs at scale 1/4,
/// where nothing overflows), and at input scale 1, where the graph's own exponentials leave
/// f16's range, none of the planned graph's tensors or tiles does. qknorm's blocks hold whole
/// rows or groups of keys, so every one takes the max itself (no row max operator); mha_bs1's
/// shifted candidates also exponentiate S at kernel level, so they keep the row max operator.
#[test]
fn shifted_scores_compute_the_graphs_function_within_range() {
    use mucc::graph::interp::{InputSpec, evaluate, evaluate_ranged, random_inputs};
    use mucc::target::Arch;
    let mut shifted = 0;
    // qknorm_gqa_bs1's first 48 candidates (of 190, every one shifted: some by groups of keys,
    // some with their exponentials moved out of the kernel writing them) keep the test short.
    let mut grouped = 0;
    // (file, graphs checked, shifted among them, shifted by groups of keys among those, with
    // the max taken in the blocks among those)
    for (name, first, expected, by_groups, in_block) in [
        ("mha_bs1.json", 21, 7, 0, 0),
        ("qknorm_gqa_bs1.json", 48, 48, 14, 48),
    ] {
        let f = read_file(&common::corpus_dir().join(name), &ImportOptions::default()).unwrap();
        let here: (usize, usize, usize) = f.graphs[..first]
            .par_iter()
            .enumerate()
            .map(|(i, c)| {
                let g = &c.graph;
                let opts = Options::for_target(Target::new(Arch::Sm90a));
                let p = mucc::sched::plan(g, &opts).unwrap();
                if p.rewrite.shift.applied.is_empty() {
                    return (0, 0, 0);
                }
                let planned = p.graph(g);
                let small = random_inputs(
                    g,
                    InputSpec {
                        seed: 7,
                        scale: 0.25,
                    },
                );
                let a = evaluate(g, &small).unwrap();
                let b = evaluate(planned, &small).unwrap();
                for (x, y) in a.iter().zip(&b) {
                    let d: f64 = x
                        .data
                        .iter()
                        .zip(&y.data)
                        .map(|(u, v)| (u - v).powi(2))
                        .sum();
                    let rel = (d / x.norm2().powi(2)).sqrt();
                    assert!(rel < 1e-9, "{name} graph {i}: relative difference {rel}");
                }
                let big = random_inputs(
                    g,
                    InputSpec {
                        seed: 7,
                        scale: 1.0,
                    },
                );
                let (_, over) = evaluate_ranged(planned, big).unwrap();
                assert!(over.is_empty(), "{name} graph {i}: {:?}", over.first());
                let applied = &p.rewrite.shift.applied;
                let groups = applied.iter().any(|a| a.groups > 1);
                // In the blocks: no row max operator, and the planned graph has none.
                let own = applied
                    .iter()
                    .all(|a| a.row_max.is_none() && !a.in_block.is_empty());
                let row_max_ops = planned
                    .ops
                    .iter()
                    .filter(|(_, o)| matches!(o.kind, mucc::graph::kernel::KnOpKind::RowMax { .. }))
                    .count();
                assert_eq!(own, row_max_ops == 0, "{name} graph {i}");
                (1, usize::from(groups), usize::from(own))
            })
            .reduce(|| (0, 0, 0), |a, b| (a.0 + b.0, a.1 + b.1, a.2 + b.2));
        assert_eq!(here, (expected, by_groups, in_block), "{name}");
        shifted += here.0;
        grouped += here.1;
    }
    assert_eq!((shifted, grouped), (55, 14));
}

/// With `--last-block-combine on`, every `softmax_combine` of the attention files is performed
/// by its attention kernel's last blocks on both targets, except behind the for-loops split
/// over a cluster on sm_90a (mha_bs1), which keep the combining kernel and say why. The plan's
/// group counters fit the counters' bytes past every workspace buffer, one per group, and the
/// kernel's grid holds `groups × splits` blocks.
#[test]
fn last_block_combine_where_its_rules_hold() {
    use mucc::sched::KnOpPlan;
    use mucc::sched::combine::{CombineForm, NoFold};
    use mucc::target::Arch;
    // (file, last-block combines on sm_90a, on sm_80).
    let expected = [
        ("mha_bs8.json", 24, 24),
        ("mqa_bs8.json", 17, 17),
        ("gqa_bs8.json", 10, 10),
        ("mqa_bs1.json", 12, 12),
        ("gqa_bs1.json", 28, 28),
        ("mha_bs1.json", 0, 14),
        ("single_mqa_bs1.json", 1, 1),
    ];
    for (file, on90, on80) in expected {
        let f = read_file(&common::corpus_dir().join(file), &ImportOptions::default()).unwrap();
        for (arch, want) in [(Arch::Sm90a, on90), (Arch::Sm80, on80)] {
            let mut folded = 0;
            for (i, lg) in f.graphs.iter().enumerate() {
                // Key splits kept as blocks: folded, some have nothing to combine.
                let opts = Options {
                    last_block_combine: true,
                    fold_key_splits: mucc::sched::softmax::KeyFold::Off,
                    ..Options::for_target(Target::new(arch))
                };
                let p = mucc::sched::plan(&lg.graph, &opts).unwrap();
                let g = p.graph(&lg.graph);
                let mut counters = 0;
                for (c, k) in p.kernel_ops.iter().enumerate() {
                    let KnOpPlan::SoftmaxCombine { form, splits, .. } = k else {
                        continue;
                    };
                    match form {
                        CombineForm::LastBlock { kernel } => {
                            folded += 1;
                            let kp = &p.kernels[kernel];
                            let lb = kp.last_block_combine.as_ref().expect("the kernel combines");
                            assert_eq!((lb.combine, lb.splits), (c, *splits), "{file} g{i}");
                            let KnOpKind::Customized(tb) =
                                &g.ops[mucc::graph::arena::Handle::from_index(*kernel)].kind
                            else {
                                panic!("{file} g{i}: kernel op {kernel} is not customized");
                            };
                            assert_eq!(tb.grid[lb.axis], lb.splits, "{file} g{i}");
                            assert_eq!(
                                lb.groups * lb.splits,
                                tb.grid.iter().product::<usize>(),
                                "{file} g{i}"
                            );
                            assert!(lb.counters >= p.workspace_packing.peak, "{file} g{i}");
                            assert!(
                                lb.counters + 4 * lb.groups <= p.workspace_bytes(),
                                "{file} g{i}: counters past the workspace"
                            );
                            assert!(kp.cluster_combine.is_none() && kp.split.cluster().is_none());
                            assert!(
                                !kp.schedule.post_loop.is_empty(),
                                "{file} g{i}: the partials are still stored"
                            );
                            counters += lb.groups;
                        }
                        CombineForm::Kernel(why) => assert!(
                            arch == Arch::Sm90a && *why == NoFold::LoopSplit,
                            "{file} g{i} {arch}: {why}"
                        ),
                        CombineForm::InCluster { .. } => panic!("{file} g{i}: in a cluster"),
                    }
                }
                assert!(p.counter_bytes >= 4 * counters, "{file} g{i}");
                assert_eq!(p.counter_bytes == 0, counters == 0, "{file} g{i}");
            }
            assert_eq!(folded, want, "{file} {arch}");
        }
    }
}

/// `--cluster-combine` on sm_90a: the combining step of every split attention candidate whose
/// key splits are 2 to 8 blocks of a kernel without a loop split runs in that kernel's clusters
/// (the partial outputs leave its schedule, their block regions go, the kernel's cluster is its
/// key splits along their axis); 16 splits and loop-split kernels keep the combining kernel and
/// say why; off by default and on sm_80 none does.
#[test]
fn cluster_combine_where_its_rules_hold() {
    use mucc::sched::KnOpPlan;
    use mucc::sched::combine::{CombineForm, NoFold};
    use mucc::target::Arch;
    // (file, combines in clusters, combining kernels kept) with the option on, sm_90a.
    let expected = [
        ("mha_bs8.json", 24, 0),
        ("mqa_bs8.json", 17, 0),
        ("mqa_bs1.json", 12, 0),
        ("gqa_bs1.json", 16, 12),
        ("gqa_bs8.json", 0, 10),
        ("mha_bs1.json", 0, 14),
    ];
    for (file, in_cluster, kept) in expected {
        let f = read_file(&common::corpus_dir().join(file), &ImportOptions::default()).unwrap();
        let mut counts = (0, 0);
        for (i, lg) in f.graphs.iter().enumerate() {
            // Key splits kept as blocks: folded, some have nothing to combine.
            let mut opts = Options {
                fold_key_splits: mucc::sched::softmax::KeyFold::Off,
                ..Options::for_target(Target::new(Arch::Sm90a))
            };
            let default = mucc::sched::plan(&lg.graph, &opts).unwrap();
            opts.cluster_combine = true;
            let p = mucc::sched::plan(&lg.graph, &opts).unwrap();
            let mut sm80 = Options::for_target(Target::new(Arch::Sm80));
            sm80.cluster_combine = true;
            let p80 = mucc::sched::plan(&lg.graph, &sm80).unwrap();
            let forms = |p: &GraphPlan| -> Vec<CombineForm> {
                p.kernel_ops
                    .iter()
                    .filter_map(|k| match k {
                        KnOpPlan::SoftmaxCombine { form, .. } => Some(form.clone()),
                        _ => None,
                    })
                    .collect()
            };
            for (what, q, why) in [
                ("default", &default, NoFold::OffByDefault),
                ("sm_80", &p80, NoFold::NotHopper),
            ] {
                assert!(
                    forms(q)
                        .iter()
                        .all(|f| *f == CombineForm::Kernel(why.clone())),
                    "{file} g{i} {what}: {:?}",
                    forms(q)
                );
                assert!(q.kernels.values().all(|k| k.cluster_combine.is_none()));
            }
            let g = p.graph(&lg.graph);
            for (c, form) in p
                .kernel_ops
                .iter()
                .enumerate()
                .filter_map(|(c, k)| match k {
                    KnOpPlan::SoftmaxCombine { form, .. } => Some((c, form)),
                    _ => None,
                })
            {
                let KnOpKind::SoftmaxCombine { splits } =
                    g.ops[mucc::graph::arena::Handle::from_index(c)].kind
                else {
                    panic!("{file} g{i}: op {c} is no softmax_combine");
                };
                match form {
                    CombineForm::InCluster { kernel } => {
                        counts.0 += 1;
                        let kp = &p.kernels[kernel];
                        let cc = kp.cluster_combine.as_ref().expect("the kernel combines");
                        assert_eq!((cc.combine, cc.ctas), (c, splits), "{file} g{i}");
                        assert_eq!(cc.dims()[cc.axis], splits);
                        assert!(kp.split.cluster().is_none());
                        assert!(kp.schedule.post_loop.is_empty(), "{file} g{i}");
                        assert_eq!(cc.skipped.len(), 3);
                        assert!(cc.skipped.iter().all(|&o| kp.regions[o].is_none()));
                        assert!(cc.rows_per_cta * cc.ctas >= cc.rows);
                    }
                    CombineForm::Kernel(why) => {
                        counts.1 += 1;
                        assert!(
                            matches!(
                                why,
                                NoFold::TooManySplits { splits: 16 } | NoFold::LoopSplit
                            ),
                            "{file} g{i}: {why}"
                        );
                    }
                    CombineForm::LastBlock { .. } => panic!("{file} g{i}: in the last blocks"),
                }
            }
        }
        assert_eq!(counts, (in_cluster, kept), "{file}");
    }
}
