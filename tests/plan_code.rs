//! The generated code follows the plan: for every corpus graph and every golden input, for both
//! targets, the numbers the emitted kernels pass to the runtime (threads, row splits, warp
//! grids, operand loads, copy widths, pipeline depth, tile offsets and types, swizzles, register
//! accumulators, vector widths, launches) are read back from the kernels' statements
//! (`mucc::emit::ir`) and compared with the plan's fields. A disagreement like an explain that says 8 threads per row while the code
//! uses 1 fails here. Also: no generated line is longer than 120 characters.

mod common;

use std::path::{Path, PathBuf};

use common::corpus_files;
use common::plan_check::{
    check_graph, check_graph_with, check_host, check_kernel, check_kernel_level, check_rings,
};
use mucc::sched::{Options, plan};
use mucc::target::Target;
use mucc::{ImportOptions, read_file};
use rayon::prelude::*;

/// Graph 0 of every corpus file, planned and emitted for sm_90a: (file, graph, plan, code).
fn graph0_emitted() -> Vec<(
    PathBuf,
    mucc::KernelGraph,
    mucc::sched::GraphPlan,
    mucc::emit::Emitted,
)> {
    let target = Target::new(mucc::target::Arch::Sm90a);
    corpus_files()
        .into_iter()
        .map(|f| {
            let file = read_file(&f, &ImportOptions::default()).unwrap();
            let g = file.graphs[0].graph.clone();
            let p = plan(&g, &Options::for_target(target)).unwrap();
            let e = mucc::emit::emit(&g, &p, "test").unwrap();
            (f, g, p, e)
        })
        .collect()
}

/// Applies `edit` to the first statement of `body` it accepts, nested ones included (blocks,
/// conditionals, loops and lambdas' bodies), in order: whether one was edited.
fn edit_first(
    body: &mut [mucc::emit::ir::Stmt],
    edit: &mut dyn FnMut(&mut mucc::emit::ir::Stmt) -> bool,
) -> bool {
    use mucc::emit::ir::{Lambda, Stmt};
    for s in body {
        if edit(s) {
            return true;
        }
        let done = match s {
            Stmt::Block(b)
            | Stmt::If(_, b)
            | Stmt::For { body: b, .. }
            | Stmt::CallWith {
                lambda: Lambda { body: b, .. },
                ..
            }
            | Stmt::LambdaDecl {
                lambda: Lambda { body: b, .. },
                ..
            } => edit_first(b, edit),
            _ => false,
        };
        if done {
            return true;
        }
    }
    false
}

/// Calls `f` with the kernel check of each threadblock kernel of graph 0 of every corpus file
/// on sm_90a (which passes for the plan as made) and that kernel's plan, to be mutated.
fn each_graph0_kernel(
    mut f: impl FnMut(&Path, usize, &mucc::sched::KernelPlan, &dyn Fn(&mucc::sched::KernelPlan) -> bool),
) {
    for (file, g, p, e) in graph0_emitted() {
        let g = p.graph(&g);
        for (&k, kp) in &p.kernels {
            let passes = |plan: &mucc::sched::KernelPlan| check_kernel(g, &e, k, plan).is_ok();
            assert!(
                passes(kp),
                "{}: kernel {k} fails as planned",
                file.display()
            );
            f(&file, k, kp, &passes);
        }
    }
}

fn golden_inputs() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("golden");
    let mut v = Vec::new();
    for dir in ["kernel", "threadblock"] {
        for e in std::fs::read_dir(root.join(dir)).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if name.ends_with(".json") && !name.ends_with(".plan.json") {
                v.push(p);
            }
        }
    }
    v.sort();
    v
}

#[test]
fn every_kernel_follows_its_plan() {
    let files: Vec<PathBuf> = corpus_files().into_iter().chain(golden_inputs()).collect();
    let mut jobs = Vec::new();
    for f in &files {
        let file = read_file(f, &ImportOptions::default()).unwrap();
        for (i, lg) in file.graphs.into_iter().enumerate() {
            lg.validate().unwrap();
            for target in Target::all() {
                jobs.push((f.clone(), i, lg.graph.clone(), target));
            }
        }
    }
    let failures: Vec<String> = jobs
        .par_iter()
        .filter_map(|(f, i, g, target)| {
            let what = format!("{}, graph {i}", f.file_name().unwrap().to_string_lossy());
            check_graph(g, *target, &what).err()
        })
        .collect();
    println!("{} graph/target pairs checked", jobs.len());
    assert!(jobs.len() >= 1208, "only {} pairs", jobs.len());
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The check fails when code and plan disagree: the 96-thread 7×13 golden with its statements
/// edited to reduce rows one per thread while the plan says eight.
#[test]
fn a_disagreement_fails_the_check() {
    use mucc::emit::ir::{Expr, Func, Stmt, TArg};
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/threadblock/tiles_7x13_f32.json");
    let file = read_file(&path, &ImportOptions::default()).unwrap();
    let g = &file.graphs[0].graph;
    // The µGraph's 96-thread CTA (the cost model would plan 16 warps for this one-block grid).
    let opts = Options {
        cta: mucc::sched::CtaChoice::Graph,
        ..Options::for_target(Target::all()[0])
    };
    let p = plan(g, &opts).unwrap();
    let mut e = mucc::emit::emit(g, &p, "test").unwrap();
    let (&k, kp) = p.kernels.iter().next().unwrap();
    check_kernel(g, &e, k, kp).unwrap();
    // The rms_rows call (in the chain's block) with one thread per row.
    let mut edit = |s: &mut Stmt| match s {
        Stmt::Eval(Expr::TemplateCall(Func::TbRmsRows, t, _)) => {
            assert_eq!(t[..4], [96, 8, 7, 13].map(TArg::int));
            t[1] = TArg::int(1);
            true
        }
        _ => false,
    };
    assert!(
        e.bodies
            .iter_mut()
            .any(|b| edit_first(&mut b.body, &mut edit))
    );
    let err = check_kernel(g, &e, k, kp).unwrap_err();
    assert!(err.contains("row splits"), "{err}");
}

/// The host entry's check fails when its statements and the launch plan disagree: a launch with
/// another grid, a cuBLAS call with another size, a missing tensor map.
#[test]
fn a_host_disagreement_fails_the_check() {
    use mucc::emit::ir::{Expr, Func, IntType, Stmt};
    let corpus = common::corpus_dir();
    let load = |p: &Path| read_file(p, &ImportOptions::default()).unwrap();
    // gqa_bs1 graph 0 on sm_90a: cuBLAS steps and TMA kernels with tensor maps.
    let file = load(&corpus.join("gqa_bs1.json"));
    let g = &file.graphs[0].graph;
    let target = Target::new(mucc::target::Arch::Sm90a);
    let p = plan(g, &Options::for_target(target)).unwrap();
    let e = mucc::emit::emit(g, &p, "test").unwrap();
    check_host(&e).unwrap();
    // Every kernel launch and GEMM call edited in turn: each edit must fail.
    fn edit(s: &mut Stmt, f: &mut dyn FnMut(&mut Expr) -> bool) -> bool {
        match s {
            Stmt::Checked(_, e) => f(e),
            Stmt::Block(b) => b.iter_mut().any(|s| edit(s, f)),
            _ => false,
        }
    }
    let mut edits = 0;
    for (i, step) in e.host.iter().enumerate() {
        for (j, _) in step.body.iter().enumerate() {
            let mut bad = e.clone();
            let changed = edit(&mut bad.host[i].body[j], &mut |x| match x {
                Expr::Call(Func::Launch | Func::LaunchProgrammatic, a) => {
                    a[1] = Expr::Call(Func::Dim3, vec![Expr::Int(7, IntType::Int); 3]);
                    true
                }
                Expr::GroupedCall(Func::CublasGemmStridedBatched, groups) => {
                    groups[0][3] = Expr::Int(3, IntType::Int);
                    true
                }
                _ => false,
            });
            if changed {
                edits += 1;
                assert!(check_host(&bad).is_err(), "step {i}, statement {j}");
            }
        }
    }
    assert!(edits >= 2, "{edits} edits");
    // A tensor map dropped from a launch that has one.
    let (i, j) = e
        .host
        .iter()
        .enumerate()
        .find_map(|(i, s)| {
            s.body
                .iter()
                .position(|x| {
                    !mucc::emit::ir::calls(std::slice::from_ref(x), Func::TensorMap).is_empty()
                })
                .map(|j| (i, j))
        })
        .expect("a TMA kernel");
    let mut bad = e.clone();
    bad.host[i].body.remove(j);
    let err = check_host(&bad).unwrap_err();
    assert!(err.contains("tensor maps"), "{err}");
}

/// The kernel-level check fails when a kernel's runtime call and its plan disagree: every
/// integer template argument of every kernel-level kernel of graph 0 of every corpus file,
/// changed in turn, is caught.
#[test]
fn a_kernel_level_disagreement_fails_the_check() {
    use mucc::emit::ir::{Expr, Stmt, TArg};
    let mut edits = 0;
    for (f, g, p, e) in graph0_emitted() {
        let pg = p.graph(&g);
        check_kernel_level(pg, &p, &e).unwrap();
        for (b, body) in e.bodies.iter().enumerate() {
            if body.name.contains("_customized") {
                // A threadblock kernel's statements: the kernel check reads them.
                continue;
            }
            for (s, stmt) in body.body.iter().enumerate() {
                let Stmt::Eval(Expr::TemplateCall(_, targs, _)) = stmt else {
                    continue;
                };
                for (t, arg) in targs.iter().enumerate() {
                    let TArg::Int(v) = arg else { continue };
                    let mut bad = e.clone();
                    let Stmt::Eval(Expr::TemplateCall(_, targs, _)) = &mut bad.bodies[b].body[s]
                    else {
                        unreachable!()
                    };
                    targs[t] = TArg::Int(v + 1);
                    edits += 1;
                    assert!(
                        check_kernel_level(pg, &p, &bad).is_err(),
                        "{}: kernel {}, argument {t}",
                        f.display(),
                        body.name
                    );
                }
            }
        }
    }
    assert!(edits >= 20, "{edits} edits");
}

/// The register-rows check reads the kernel's statements: in every register-rows kernel of
/// graph 0 of every corpus file on sm_90a, moving one row offset of an access, widening one
/// run, or dropping a block sum is caught.
#[test]
fn a_register_rows_disagreement_fails_the_check() {
    use mucc::emit::ir::{Expr, Func, Stmt, TArg};
    let mut kernels = 0;
    let mut applied = [0; 3];
    for (f, g, p, e) in graph0_emitted() {
        let pg = p.graph(&g);
        for (&k, kp) in &p.kernels {
            if kp.rows().is_none() {
                continue;
            }
            let name = format!("k{k}_customized");
            let b = e.bodies.iter().position(|b| b.name == name).unwrap();
            check_kernel(pg, &e, k, kp).unwrap();
            kernels += 1;
            let edits: [&mut dyn FnMut(&mut Stmt) -> bool; 3] = [
                &mut |s| match s {
                    Stmt::Array {
                        name,
                        init: Some(v),
                        ..
                    } if name == "row_at" => {
                        v[0] = Expr::size(7);
                        true
                    }
                    _ => false,
                },
                &mut |s| match s {
                    Stmt::Eval(Expr::TemplateCall(Func::TbStoreRun, t, _)) => {
                        t[0] = TArg::int(1);
                        true
                    }
                    _ => false,
                },
                &mut |s| match s {
                    Stmt::Block(b) => {
                        let n = b.len();
                        b.retain(|x| {
                            !matches!(x, Stmt::Eval(Expr::TemplateCall(Func::TbBlockSums, ..)))
                        });
                        b.len() < n
                    }
                    _ => false,
                },
            ];
            for (i, edit) in edits.into_iter().enumerate() {
                let mut bad = e.clone();
                if !edit_first(&mut bad.bodies[b].body, edit) {
                    continue;
                }
                applied[i] += 1;
                assert!(
                    check_kernel(pg, &bad, k, kp).is_err(),
                    "{}: {name}, edit {i} not caught",
                    f.display()
                );
            }
        }
    }
    assert!(
        kernels >= 2 && applied.iter().all(|&n| n > 0),
        "{kernels} register-rows kernels, edits applied {applied:?}"
    );
}

/// The chain, matmul and signature checks read the kernel's statements: in the tile kernels of
/// graph 0 of every corpus file on sm_90a, another warp grid in an `Mma` class, another row
/// split in a row pass, another vector width in a vector step, a product no longer run into its
/// accumulator's fragment, a register accumulator under another name, a cluster attribute
/// without a split or a tensor-map parameter dropped is caught.
#[test]
fn a_chain_matmul_or_signature_disagreement_fails_the_check() {
    use mucc::emit::ir::{AliasType, Expr, Func, Method, Nested, Stmt, TArg};
    let bump = |t: &mut TArg| match t {
        TArg::Int(v) => {
            *v += 1;
            true
        }
        _ => false,
    };
    let mut applied = [0; 7];
    for (f, g, p, e) in graph0_emitted() {
        let pg = p.graph(&g);
        for (&k, kp) in &p.kernels {
            if kp.rows().is_some() {
                continue;
            }
            let name = format!("k{k}_customized");
            let b = e.bodies.iter().position(|b| b.name == name).unwrap();
            check_kernel(pg, &e, k, kp).unwrap();
            let edits: [&mut dyn FnMut(&mut Stmt) -> bool; 5] = [
                &mut |s| match s {
                    Stmt::Using {
                        ty: AliasType::Mma(t),
                        ..
                    } => {
                        t.warps.0 += 1;
                        true
                    }
                    _ => false,
                },
                &mut |s| match s {
                    Stmt::Eval(Expr::TemplateCall(Func::TbForEachRow | Func::TbRmsRows, t, _)) => {
                        bump(&mut t[1])
                    }
                    _ => false,
                },
                &mut |s| match s {
                    Stmt::CallWith {
                        call: Expr::TemplateCall(Func::TbForEachStep, t, _),
                        ..
                    } => bump(&mut t[2]),
                    _ => false,
                },
                &mut |s| match s {
                    Stmt::Eval(Expr::Member(_, m @ Method::Run, _, a)) if matches!(a.first(), Some(Expr::Var(n)) if n.starts_with("acc")) =>
                    {
                        *m = Method::Zero;
                        true
                    }
                    _ => false,
                },
                &mut |s| match s {
                    Stmt::NestedDecl {
                        ty: Nested::Frag,
                        name,
                        ..
                    }
                    | Stmt::Array { name, .. }
                        if name.starts_with("acc") =>
                    {
                        name.push('x');
                        true
                    }
                    _ => false,
                },
            ];
            for (i, edit) in edits.into_iter().enumerate() {
                let mut bad = e.clone();
                if !edit_first(&mut bad.bodies[b].body, edit) {
                    continue;
                }
                applied[i] += 1;
                assert!(
                    check_kernel(pg, &bad, k, kp).is_err(),
                    "{}: {name}, edit {i} not caught",
                    f.display()
                );
            }
            // The signature: clusters without a split, a tensor map dropped.
            fn sig(bad: &mut mucc::emit::Emitted, b: usize) -> &mut mucc::emit::ir::Signature {
                bad.bodies[b].signature.as_mut().unwrap()
            }
            if kp.split.cluster().is_none() {
                let mut bad = e.clone();
                sig(&mut bad, b).cluster = Some([2, 1, 1]);
                applied[5] += 1;
                assert!(
                    check_kernel(pg, &bad, k, kp).is_err(),
                    "{}: {name}, cluster dims not caught",
                    f.display()
                );
            }
            if kp.tma.map_count() > 0 {
                let mut bad = e.clone();
                sig(&mut bad, b).params.pop();
                applied[6] += 1;
                assert!(
                    check_kernel(pg, &bad, k, kp).is_err(),
                    "{}: {name}, a dropped tensor map not caught",
                    f.display()
                );
            }
        }
    }
    assert!(applied.iter().all(|&n| n > 0), "edits applied {applied:?}");
}

/// The prologue check reads the kernel's statements: in every threadblock kernel of graph 0
/// of every corpus file on sm_90a, moving a tile pointer, dropping or adding the zero page,
/// misaligning the dynamic shared memory of a TMA kernel or dropping a tensor-map prefetch is
/// caught.
#[test]
fn a_prologue_disagreement_fails_the_check() {
    use mucc::emit::ir::{Expr, Func, IntType, Stmt, Ty};
    let mut applied = [0; 4];
    for (f, g, p, e) in graph0_emitted() {
        let pg = p.graph(&g);
        for (&k, kp) in &p.kernels {
            if kp.rows().is_some() {
                continue;
            }
            let name = format!("k{k}_customized");
            let b = e.bodies.iter().position(|b| b.name == name).unwrap();
            check_kernel(pg, &e, k, kp).unwrap();
            let body = &e.bodies[b].body;
            let mut edits: Vec<(usize, Vec<Stmt>)> = Vec::new();
            // A tile pointer one element on.
            if let Some(i) = body.iter().position(|s| {
                matches!(s.unnoted(), Stmt::Decl { name, .. } if name.starts_with('s') && name[1..].parse::<usize>().is_ok())
            }) {
                let mut v = body.clone();
                if let Stmt::Decl { init, .. } = &mut v[i] {
                    *init = mucc::emit::ir::Init::Assign(Expr::var("smem"));
                } else if let Stmt::Noted(inner, _) = &mut v[i]
                    && let Stmt::Decl { init, .. } = &mut **inner
                {
                    *init = mucc::emit::ir::Init::Assign(Expr::var("smem"));
                }
                edits.push((0, v));
            }
            // The zero page dropped, or added where the plan has none.
            let zero = body
                .iter()
                .position(|s| matches!(s.unnoted(), Stmt::IfLine(..)));
            let mut v = body.clone();
            match zero {
                Some(i) => {
                    v.remove(i);
                }
                None => v.insert(
                    1,
                    Stmt::IfLine(
                        Expr::Lt(Box::new(Expr::var("tid")), Box::new(Expr::int(4))),
                        Box::new(Stmt::Assign(
                            Expr::Index(
                                Box::new(Expr::Reinterpret(
                                    Ty::UnsignedPtr,
                                    Box::new(Expr::var("smem")),
                                )),
                                Box::new(Expr::var("tid")),
                            ),
                            Expr::Int(0, IntType::Unsigned),
                        )),
                    ),
                ),
            }
            edits.push((1, v));
            if !kp.tma.loads.is_empty() {
                let mut v = body.clone();
                if let Some(Stmt::DynamicSmem { align, .. }) =
                    v.iter_mut().find(|s| matches!(s, Stmt::DynamicSmem { .. }))
                {
                    *align = 128;
                    edits.push((2, v));
                }
                let mut v = body.clone();
                for s in v.iter_mut() {
                    if let Stmt::If(_, b) = s
                        && let Some(j) = b.iter().position(|x| {
                            matches!(x, Stmt::Eval(Expr::Call(Func::PrefetchTensormap, _)))
                        })
                    {
                        b.remove(j);
                        edits.push((3, v));
                        break;
                    }
                }
            }
            for (kind, v) in edits {
                let mut bad = e.clone();
                bad.bodies[b].body = v;
                applied[kind] += 1;
                assert!(
                    check_kernel(pg, &bad, k, kp).is_err(),
                    "{}: {name}, edit {kind} not caught",
                    f.display()
                );
            }
        }
    }
    assert!(applied.iter().all(|&n| n > 0), "edits applied {applied:?}");
}

/// The barrier check reads the kernel's statements: in every threadblock kernel of graph 0 of
/// every corpus file on sm_90a that has barriers, dropping one or giving one another reason is
/// caught.
#[test]
fn a_barrier_disagreement_fails_the_check() {
    use mucc::emit::ir::Stmt;
    use mucc::sched::order::BarrierReason;
    // Applies `edit` to the first barrier in `body` (nested ones included).
    fn first_barrier(body: &mut Vec<Stmt>, edit: &mut dyn FnMut(&mut Vec<Stmt>, usize)) -> bool {
        if let Some(i) = body.iter().position(|s| matches!(s, Stmt::Barrier { .. })) {
            edit(body, i);
            return true;
        }
        body.iter_mut().any(|s| match s {
            Stmt::Block(b) | Stmt::If(_, b) | Stmt::For { body: b, .. } => first_barrier(b, edit),
            _ => false,
        })
    }
    let mut kernels = 0;
    for (f, g, p, e) in graph0_emitted() {
        let pg = p.graph(&g);
        for (&k, kp) in &p.kernels {
            let name = format!("k{k}_customized");
            let b = e.bodies.iter().position(|b| b.name == name).unwrap();
            if mucc::emit::ir::barriers(&e.bodies[b].body).is_empty() {
                continue;
            }
            kernels += 1;
            let mut dropped = e.clone();
            assert!(first_barrier(&mut dropped.bodies[b].body, &mut |v, i| {
                v.remove(i);
            }));
            let mut other = e.clone();
            assert!(first_barrier(&mut other.bodies[b].body, &mut |v, i| {
                if let Stmt::Barrier { reason, .. } = &mut v[i] {
                    *reason = if *reason == BarrierReason::BeforePush {
                        BarrierReason::InitialState
                    } else {
                        BarrierReason::BeforePush
                    };
                }
            }));
            for (what, bad) in [("dropped", dropped), ("another reason", other)] {
                assert!(
                    check_kernel(pg, &bad, k, kp).is_err(),
                    "{}: {name}, a barrier {what} is not caught",
                    f.display()
                );
            }
        }
    }
    assert!(kernels >= 10, "{kernels} kernels with barriers");
}

/// The finalisation check compares the code's divisor with the plan's: for every mean or RMS
/// accumulator of the threadblock kernels of graph 0 of every corpus file on sm_90a, a plan
/// whose divisor is one more fails the check.
#[test]
fn a_divisor_disagreement_fails_the_check() {
    use mucc::sched::ops::OpPlan;
    let mut tried = 0;
    each_graph0_kernel(|f, k, kp, passes| {
        for (i, op) in kp.ops.iter().enumerate() {
            let OpPlan::Accum {
                divisor: Some(d), ..
            } = op
            else {
                continue;
            };
            let mut bad = kp.clone();
            if let OpPlan::Accum { divisor, .. } = &mut bad.ops[i] {
                *divisor = Some(d + 1);
            }
            tried += 1;
            assert!(
                !passes(&bad),
                "{}: kernel {k}, op{i}: a divisor of {} passes",
                f.display(),
                d + 1
            );
        }
    });
    assert!(
        tried > 0,
        "no mean or RMS accumulator in graph 0 of the corpus"
    );
}

/// The kernel check fails when the plan's write-backs and the code disagree: for graph 0 of
/// every corpus file on sm_90a, dropping any one write-back from a kernel's plan, or changing a
/// fragment store into an element store, is caught.
#[test]
fn a_write_back_disagreement_fails_the_check() {
    use mucc::sched::plan::WriteBack;
    let mut tried = 0;
    each_graph0_kernel(|f, k, kp, passes| {
        for i in 0..kp.write_backs.len() {
            let mut dropped = kp.clone();
            dropped.write_backs.remove(i);
            assert!(
                !passes(&dropped),
                "{}: kernel {k} without write-back {i} passed",
                f.display()
            );
            let mut changed = kp.clone();
            if let WriteBack::Store { fragment_of, .. } = &mut changed.write_backs[i]
                && fragment_of.is_some()
            {
                *fragment_of = None;
                assert!(
                    !passes(&changed),
                    "{}: kernel {k} with an element store passed",
                    f.display()
                );
            }
            tried += 1;
        }
    });
    assert!(tried >= 10, "{tried} write-backs tried");
}

/// The kernel check fails when the plan's waits for `cp.async` copies and the code disagree:
/// for graph 0 of every corpus file on sm_90a, dropping any one wait from a kernel's plan is
/// caught.
#[test]
fn a_copy_wait_disagreement_fails_the_check() {
    let mut tried = 0;
    each_graph0_kernel(|f, k, kp, passes| {
        let w = &kp.copy_waits;
        for (phase, n) in [w.pre_loop.len(), w.body.len(), w.post_loop.len()]
            .into_iter()
            .enumerate()
        {
            for i in 0..n {
                let mut dropped = kp.clone();
                let d = &mut dropped.copy_waits;
                [&mut d.pre_loop, &mut d.body, &mut d.post_loop][phase].remove(i);
                assert!(
                    !passes(&dropped),
                    "{}: kernel {k} without wait {i} of phase {phase} passed",
                    f.display()
                );
                tried += 1;
            }
        }
    });
    assert!(tried >= 3, "{tried} waits tried");
}

/// The kernel check fails when a last-block combine and its code disagree: mha_bs8 g30 and
/// gqa_bs8 g0 on both targets with `--last-block-combine on`, their arrival's split count, the
/// combine's vector or a partial's step edited, the guarded combine or the whole arrival
/// removed, and the plan without the combine.
#[test]
fn a_ring_prologue_off_its_planned_place_fails_the_check() {
    use mucc::sched::plan::RingStart;
    use mucc::target::Arch;
    // mha_bs8 g30 and gqa_bs8 g0 load Q before their loop: on sm_90a the ring loads by TMA and
    // its prologue goes ahead of the Q load; on sm_80 it copies by cp.async only and stays.
    for (file, graph) in [("mha_bs8.json", 30), ("gqa_bs8.json", 0)] {
        let f = read_file(&common::corpus_dir().join(file), &ImportOptions::default()).unwrap();
        let g = &f.graphs[graph].graph;
        for target in Target::all() {
            let p = plan(g, &Options::for_target(target)).unwrap();
            let e = mucc::emit::emit(g, &p, "test").unwrap();
            let pg = p.graph(g);
            let (k, kp) = p
                .kernels
                .iter()
                .find(|(_, kp)| kp.ring().is_some())
                .unwrap_or_else(|| panic!("{file} g{graph}: no ring"));
            let want = match target.arch {
                Arch::Sm90a => RingStart::BeforePreLoop,
                _ => RingStart::CpAsyncOnly,
            };
            assert_eq!(kp.ring_start, want, "{file} g{graph} {target:?}");
            check_kernel(pg, &e, *k, kp).unwrap();
            // The same code against a plan that puts the prologue at the other place, and the
            // plan's own place against code printed for the other.
            let other = |s: RingStart| match s {
                RingStart::BeforePreLoop => RingStart::AfterPreLoop { tile: 0 },
                _ => RingStart::BeforePreLoop,
            };
            let mut moved = kp.clone();
            moved.ring_start = other(kp.ring_start);
            let err = check_kernel(pg, &e, *k, &moved).unwrap_err();
            assert!(err.contains("ring prologue"), "{file} g{graph}: {err}");
            let mut p_moved = p.clone();
            for (_, kp) in p_moved.kernels.iter_mut() {
                kp.ring_start = other(kp.ring_start);
            }
            let e_moved = mucc::emit::emit(g, &p_moved, "test").unwrap();
            let err = check_kernel(pg, &e_moved, *k, kp).unwrap_err();
            assert!(err.contains("ring prologue"), "{file} g{graph}: {err}");
            check_kernel(pg, &e_moved, *k, &moved).unwrap();
        }
    }
}

#[test]
fn a_last_block_combine_disagreement_fails_the_check() {
    use mucc::emit::ir::{Expr, Func, Stmt, TArg};
    for (file, graph) in [("mha_bs8.json", 30), ("gqa_bs8.json", 0)] {
        let f = read_file(&common::corpus_dir().join(file), &ImportOptions::default()).unwrap();
        let g = &f.graphs[graph].graph;
        for target in Target::all() {
            // Folded key splits need no combining step; this test wants one.
            let opts = Options {
                last_block_combine: true,
                fold_key_splits: mucc::sched::softmax::KeyFold::Off,
                ..Options::for_target(target)
            };
            let p = plan(g, &opts).unwrap();
            let e = mucc::emit::emit(g, &p, "test").unwrap();
            let pg = p.graph(g);
            let (k, kp) = p
                .kernels
                .iter()
                .find(|(_, kp)| kp.last_block_combine.is_some())
                .unwrap_or_else(|| panic!("{file} g{graph}: no last-block combine"));
            check_kernel(pg, &e, *k, kp).unwrap();
            let name = format!("k{k}_customized");
            let edited = |edit: &mut dyn FnMut(&mut Stmt) -> bool| {
                let mut bad = e.clone();
                let body = &mut bad.bodies.iter_mut().find(|b| b.name == name).unwrap().body;
                assert!(edit_first(body, edit), "{file} g{graph}: nothing to edit");
                bad
            };
            type Edit = Box<dyn FnMut(&mut Stmt) -> bool>;
            let edits: Vec<(&str, Edit)> = vec![
                (
                    "split count",
                    Box::new(|s: &mut Stmt| match s {
                        Stmt::If(Expr::TemplateCall(Func::TbArriveLast, t, _), _) => {
                            t[0] = TArg::int(99);
                            true
                        }
                        _ => false,
                    }),
                ),
                (
                    "vector",
                    Box::new(|s: &mut Stmt| match s {
                        Stmt::Eval(Expr::TemplateCall(Func::TbCombineSplits, t, _)) => {
                            t[4] = TArg::int(1);
                            true
                        }
                        _ => false,
                    }),
                ),
                (
                    "O step",
                    Box::new(|s: &mut Stmt| match s {
                        Stmt::Eval(Expr::TemplateCall(Func::TbCombineSplits, _, a)) => {
                            a[2] = Expr::size(7);
                            true
                        }
                        _ => false,
                    }),
                ),
                (
                    "combine",
                    Box::new(|s: &mut Stmt| match s {
                        Stmt::If(Expr::TemplateCall(Func::TbArriveLast, _, _), b) => {
                            b.clear();
                            true
                        }
                        _ => false,
                    }),
                ),
                (
                    "arrival",
                    Box::new(|s: &mut Stmt| match s {
                        Stmt::If(Expr::TemplateCall(Func::TbArriveLast, _, _), _) => {
                            *s = Stmt::Comment("gone".into());
                            true
                        }
                        _ => false,
                    }),
                ),
            ];
            for (what, mut edit) in edits {
                let bad = edited(&mut *edit);
                assert!(
                    check_kernel(pg, &bad, *k, kp).is_err(),
                    "{file} g{graph} {}: edited {what} passed",
                    target.arch
                );
            }
            let mut other = kp.clone();
            other.last_block_combine = None;
            assert!(
                check_kernel(pg, &e, *k, &other).is_err(),
                "{file} g{graph} {}: the plan without the combine passed",
                target.arch
            );
        }
    }
}

/// The kernel check fails when the fold CTA 0 runs behind the after-rescaled-folds barrier is
/// not the plan's, or the plan has no such barrier: mha_bs1 g8 on sm_90a (a cluster split whose
/// rescaled partials read the max tile).
#[test]
fn a_fold_barrier_disagreement_fails_the_check() {
    let path = common::corpus_dir().join("mha_bs1.json");
    let file = read_file(&path, &ImportOptions::default()).unwrap();
    let g = &file.graphs[8].graph;
    let p = plan(
        g,
        &Options::for_target(Target::new(mucc::target::Arch::Sm90a)),
    )
    .unwrap();
    let e = mucc::emit::emit(g, &p, "test").unwrap();
    let g = p.graph(g);
    let (k, kp) = p
        .kernels
        .iter()
        .find(|(_, kp)| kp.barriers.after_rescaled_folds.is_some())
        .expect("a kernel with rescaled cluster folds");
    check_kernel(g, &e, *k, kp).unwrap();
    let i = kp.barriers.after_rescaled_folds.unwrap();
    for wrong in [None, Some(i - 1)] {
        let mut other = kp.clone();
        other.barriers.after_rescaled_folds = wrong;
        assert!(
            check_kernel(g, &e, *k, &other).is_err(),
            "fold barrier at {wrong:?} passed"
        );
    }
}

/// The ring check fails when a kernel's pipeline and its plan disagree: for graph 0 of every
/// corpus file on sm_90a, each ring's stage announcement, its loop wait, a dropped TMA load or
/// copy and the refill distance, changed in turn, are caught.
#[test]
fn a_ring_disagreement_fails_the_check() {
    use mucc::emit::ir::{Expr, Func, Init, Stmt, TArg};
    type Mutation = fn(&mut Vec<Stmt>) -> bool;
    fn edit(stmts: &mut Vec<Stmt>, f: &mut dyn FnMut(&mut Vec<Stmt>) -> bool) -> bool {
        if f(stmts) {
            return true;
        }
        stmts.iter_mut().any(|s| match s {
            Stmt::Block(b) | Stmt::If(_, b) => edit(b, f),
            _ => false,
        })
    }
    let mut edits = 0;
    for (f, _, p, e) in graph0_emitted() {
        check_rings(&p, &e).unwrap();
        for r in 0..e.rings.len() {
            // Each edit: a function that changes the first statement it applies to.
            let mutations: [Mutation; 4] = [
                (|v: &mut Vec<Stmt>| {
                    v.iter_mut().any(|s| match s {
                        Stmt::Eval(Expr::Call(Func::MbarArriveExpectTx, a)) => {
                            a[1] = Expr::size(1);
                            true
                        }
                        _ => false,
                    })
                }) as Mutation,
                (|v: &mut Vec<Stmt>| {
                    v.iter_mut().any(|s| match s {
                        Stmt::Eval(Expr::TemplateCall(Func::CpAsyncWait, t, _)) => {
                            t[0] = TArg::int(7);
                            true
                        }
                        _ => false,
                    })
                }) as Mutation,
                (|v: &mut Vec<Stmt>| {
                    let i = v.iter().position(|s| {
                        matches!(
                            s,
                            Stmt::Eval(Expr::Call(Func::TmaLoad, _))
                                | Stmt::Eval(Expr::TemplateCall(Func::TbCpAsyncChunks, ..))
                        )
                    });
                    i.map(|i| v.remove(i)).is_some()
                }) as Mutation,
                (|v: &mut Vec<Stmt>| {
                    v.iter_mut().any(|s| match s {
                        Stmt::Decl {
                            name,
                            init: Init::Assign(e),
                            ..
                        } if name == "pf" => {
                            *e = Expr::var("it").plus(Expr::size(9));
                            true
                        }
                        _ => false,
                    })
                }) as Mutation,
            ];
            for m in &mutations {
                let mut bad = e.clone();
                if edit(&mut bad.rings[r].body, &mut |v| m(v)) {
                    edits += 1;
                    assert!(
                        check_rings(&p, &bad).is_err(),
                        "{}: ring of {}",
                        f.display(),
                        bad.rings[r].name
                    );
                }
            }
        }
    }
    assert!(edits >= 20, "{edits} edits");
}

/// Every builder-made attention block (`graph::workloads::attention_blocks`) keeps exp(Q·Kᵀ)
/// in registers when planned on the µGraph's 4 warps, on both targets, and its code follows the
/// plan; with the default CTA too.
#[test]
fn attention_blocks_follow_their_plan_with_register_pipes() {
    use mucc::sched::plan::{CtaChoice, PipeDecision};
    let blocks = mucc::graph::workloads::attention_blocks().unwrap();
    assert_eq!(
        blocks.len(),
        2 * mucc::graph::workloads::ATTENTION_BLOCKS.len()
    );
    let mut wgmma = 0;
    for (name, g) in &blocks {
        for target in Target::all() {
            let opts = Options {
                cta: CtaChoice::Graph,
                ..Options::for_target(target)
            };
            let p = mucc::sched::plan(g, &opts).unwrap();
            let e = mucc::emit::emit(g, &p, name).unwrap();
            for (&k, kp) in &p.kernels {
                if kp.features().contains(&mucc::sched::plan::Feature::Wgmma) {
                    assert_eq!(target.arch, mucc::target::Arch::Sm90a, "{name}");
                    wgmma += 1;
                }
                assert!(
                    matches!(kp.pipes.as_slice(), [PipeDecision::On(_)]),
                    "{name} {}: {:?}",
                    target.arch,
                    kp.pipes
                );
                check_kernel(g, &e, k, kp).unwrap_or_else(|m| panic!("{name}: {m}"));
            }
            check_graph(g, target, name).unwrap();
        }
    }
    // P·V by wgmma on sm_90a: every block's V is one 128-byte swizzle atom across (head dim
    // 64), TMA-loaded, on the µGraph's 4 warps — all ten, fp16 and bf16.
    assert_eq!(wgmma, blocks.len(), "attention blocks with wgmma");
}

/// Every builder-made row block (`graph::workloads::row_graphs`) keeps its tiles in registers
/// on both targets and its code follows the plan; with `--no-register-rows` the same graphs
/// plan over shared-memory tiles and say so.
#[test]
fn row_blocks_follow_their_plan_in_registers() {
    use mucc::sched::plan::Body;
    let graphs = mucc::graph::workloads::row_graphs().unwrap();
    for (name, g) in &graphs {
        for target in Target::all() {
            let p = plan(g, &Options::for_target(target)).unwrap();
            let e = mucc::emit::emit(g, &p, name).unwrap();
            for (&k, kp) in &p.kernels {
                let r = kp
                    .rows()
                    .unwrap_or_else(|| panic!("{name} {}: {:?}", target.arch, kp.body));
                assert_eq!(kp.smem.total, 0, "{name}");
                assert!(r.threads * r.runs * r.vec == r.cols && r.threads.is_multiple_of(32));
                check_kernel(g, &e, k, kp).unwrap_or_else(|m| panic!("{name}: {m}"));
            }
            check_graph(g, target, name).unwrap();
            let off = Options {
                register_rows: false,
                ..Options::for_target(target)
            };
            let p = plan(g, &off).unwrap();
            for kp in p.kernels.values() {
                assert!(
                    matches!(&kp.body, Body::Tiles(mucc::sched::rows::RowsOff::TurnedOff)),
                    "{name}: {:?}",
                    kp.body
                );
            }
            check_graph(g, target, name).unwrap();
        }
    }
}

/// mha_bs8 g30's four key splits fold into its loop on sm_90a (the planner's rule: 256 blocks
/// without them fill the 132 SMs): no combining step, the attention kernel stores the graph's
/// output and follows its plan; `--fold-key-splits off` and sm_80 keep the combining kernel.
#[test]
fn folded_key_splits_leave_no_combining_step() {
    use mucc::sched::KnOpPlan;
    use mucc::sched::softmax::{KeyFold, SplitFold};
    use mucc::target::Arch;
    let f = read_file(
        &common::corpus_dir().join("mha_bs8.json"),
        &ImportOptions::default(),
    )
    .unwrap();
    let g = &f.graphs[30].graph;
    for (arch, fold, folded) in [
        (Arch::Sm90a, KeyFold::Auto, true),
        (Arch::Sm90a, KeyFold::Off, false),
        (Arch::Sm80, KeyFold::Auto, false),
        (Arch::Sm80, KeyFold::By(4), true),
    ] {
        let opts = Options {
            fold_key_splits: fold,
            ..Options::for_target(Target::new(arch))
        };
        let p = plan(g, &opts).unwrap();
        let a = &p.rewrite.softmax.applied[0];
        let what = format!("{arch:?} {fold}");
        assert_eq!(
            matches!(a.fold, SplitFold::Folded { left: 1, .. }),
            folded,
            "{what}: {}",
            a.fold
        );
        let combines = p
            .kernel_ops
            .iter()
            .filter(|k| matches!(k, KnOpPlan::SoftmaxCombine { .. }))
            .count();
        assert_eq!(combines, usize::from(!folded), "{what}");
        assert_eq!(a.combine.is_none(), folded, "{what}");
        let e = mucc::emit::emit(g, &p, "test").unwrap();
        let pg = p.graph(g);
        let kp = &p.kernels[&a.rewritten];
        check_kernel(pg, &e, a.rewritten, kp).unwrap();
    }
}

/// With `--dependent-launch` on sm_90a, every decode graph's kernel (the graph's first launch)
/// launches programmatically, prefetches the TMA boxes of its ring's stages into L2 before its
/// `griddepcontrol.wait` and, as the graph's last kernel, triggers the next launch; graph 0 of
/// every corpus file follows its plan so too. A kernel whose prefetch goes fails the check.
#[test]
fn programmatic_launches_prefetch_into_l2_before_they_wait() {
    use mucc::emit::ir::{Func, calls};
    let opts = Options {
        dependent_launch: true,
        ..Options::for_target(Target::new(mucc::target::Arch::Sm90a))
    };
    for (name, g) in mucc::graph::workloads::decode_graphs().unwrap() {
        let p = plan(&g, &opts).unwrap();
        let e = check_graph_with(&g, &opts, &name).unwrap();
        let (&k, kp) = p.kernels.iter().next().unwrap();
        assert!(kp.dependent.is_programmatic() && kp.triggers_next, "{name}");
        assert!(!kp.tma.loads.is_empty(), "{name}");
        assert_eq!(
            kp.l2_prefetch.map(|p| p.iterations),
            Some(kp.pipeline_stages()),
            "{name}"
        );
        // Without its prefetch the kernel no longer follows the plan.
        let mut bad = e.clone();
        let body = &mut bad
            .bodies
            .iter_mut()
            .find(|b| b.name == format!("k{k}_customized"))
            .unwrap()
            .body;
        body.retain(|s| calls(std::slice::from_ref(s), Func::TmaPrefetchL2).is_empty());
        let err = check_kernel(p.graph(&g), &bad, k, kp).unwrap_err();
        assert!(err.contains("L2 prefetch"), "{name}: {err}");
    }
    let files = corpus_files();
    let failures: Vec<String> = files
        .par_iter()
        .filter_map(|f| {
            let file = read_file(f, &ImportOptions::default()).unwrap();
            let g = &file.graphs[0].graph;
            let what = format!("{} g0 --dependent-launch", f.display());
            check_graph_with(g, &opts, &what).err()
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // gated_mlp g0 ends in a kernel-level multiplication: it triggers the next execution's
    // first kernel, the customized one, first thing; without the trigger the check fails.
    let f = read_file(
        &common::corpus_dir().join("gated_mlp.json"),
        &ImportOptions::default(),
    )
    .unwrap();
    let g = &f.graphs[0].graph;
    let p = plan(g, &opts).unwrap();
    let last = p.kernel_ops.len() - 1;
    let mul = (0..p.kernel_ops.len())
        .rev()
        .find(|&k| !matches!(p.kernel_ops[k], mucc::sched::KnOpPlan::Nothing))
        .unwrap();
    assert!(mul <= last);
    assert_eq!(
        p.kernel_level_triggers.iter().copied().collect::<Vec<_>>(),
        vec![mul]
    );
    let e = check_graph_with(g, &opts, "gated_mlp g0").unwrap();
    let mut bad = e.clone();
    for b in &mut bad.bodies {
        b.body
            .retain(|s| calls(std::slice::from_ref(s), Func::LaunchDependents).is_empty());
    }
    let err = check_kernel_level(g, &p, &bad).unwrap_err();
    assert!(err.contains("triggers of the next launch"), "{err}");
}
