//! Reading back from emitted code what each kernel passes to the runtime, and comparing it
//! with the plan (used by `tests/plan_code.rs` and `tests/generated.rs`).
#![allow(dead_code)]

use std::collections::BTreeSet;

use mucc::emit::Emitted;
use mucc::emit::cxx::{MAX_LINE, ctype};
use mucc::emit::launch::{KernelLaunch, Step};
use mucc::graph::arena::Handle;
use mucc::graph::kernel::{KernelGraph, KnOpKind};
use mucc::graph::ops::UnaryOp;
use mucc::graph::threadblock::TbOpKind;
use mucc::layout::swizzle::Swizzle;
use mucc::sched::kernel_level::{ElementwiseOp, KnOpPlan, Reduce};
use mucc::sched::ops::{AccumStorage, Copy, CopyEngine, MatmulInstr, OpPlan, OperandLoad};
use mucc::sched::plan::{ApproxExp, GraphPlan, KernelPlan};
use mucc::sched::{Options, plan};
use mucc::target::Target;

/// A register-rows kernel against its plan, read from its statements ([`mucc::emit::ir`]): no
/// dynamic shared memory and no calls but the runs' loads and stores, the block sums (the only
/// barriers, one per row norm) and index casts; one 16-byte load per run of every input and
/// one store per run of every output at the plan's row offsets; the plan's CTA.
fn check_rows(
    tb: &mucc::graph::threadblock::TbGraph,
    e: &Emitted,
    name: &str,
    kp: &KernelPlan,
    r: &mucc::sched::rows::RegisterRows,
    want: &mut impl FnMut(bool, String),
) {
    use mucc::emit::ir::{Expr, Func, Stmt, Storage, TArg, calls, functions};
    let Some(body) = e.bodies.iter().find(|b| b.name == name) else {
        want(
            false,
            format!("no statements of register-rows kernel {name}"),
        );
        return;
    };
    let body = &body.body[..];
    want(
        kp.smem.total == 0 && launch_of(e, name).dynamic_smem == 0,
        "register rows use no dynamic shared memory".into(),
    );
    let allowed = [
        Func::CastToInt,
        Func::CastToI64,
        Func::TbLoadRun,
        Func::TbStoreRun,
        Func::TbBlockSums,
        Func::GridDependencyWait,
        Func::LaunchDependents,
    ];
    let called = functions(body);
    want(
        called.iter().all(|f| allowed.contains(f)),
        format!("register rows: no barrier but the row sums', no tile copies ({called:?})"),
    );
    want(
        kp.cta.threads == r.threads && r.threads * r.runs * r.vec == r.cols,
        format!(
            "{} threads × {} runs × {} = a row of {}",
            r.threads, r.runs, r.vec, r.cols
        ),
    );
    // The row sums' static scratch: the plan's bytes, floats per sum and warp row.
    let scratch: usize = body
        .iter()
        .map(Stmt::unnoted)
        .filter_map(|s| match s {
            Stmt::Array {
                storage: Storage::Shared,
                dims,
                ..
            } => Some(dims.iter().product::<usize>() * 4),
            _ => None,
        })
        .sum();
    want(
        scratch == r.scratch_bytes,
        format!("row sums' scratch {scratch} B, plan {} B", r.scratch_bytes),
    );
    let norms = tb
        .ops
        .iter()
        .filter(|(_, o)| matches!(o.kind, TbOpKind::RmsNorm))
        .count();
    let sums = template_args_of(body, Func::TbBlockSums);
    want(
        r.row_sums == norms
            && sums.len() == norms
            && sums
                .iter()
                .all(|t| *t == [TArg::int(r.threads), TArg::int(r.rows)]),
        format!("{norms} row norms, one block sum each ({sums:?})"),
    );
    // `p + row_at[r] + col`.
    let run_of = |p: String| {
        Expr::var(p)
            .plus(Expr::Index(
                Box::new(Expr::var("row_at")),
                Box::new(Expr::var("r")),
            ))
            .plus(Expr::var("col"))
    };
    for (h, op) in tb.ops.iter() {
        let (func, targs, prefix) = match op.kind {
            TbOpKind::Input { .. } => (
                Func::TbLoadRun,
                vec![TArg::int(r.vec), TArg::Elem(mucc::graph::DType::F32)],
                format!("gi{}", h.index()),
            ),
            TbOpKind::Output { .. } => (
                Func::TbStoreRun,
                vec![TArg::int(r.vec)],
                format!("go{}", h.index()),
            ),
            _ => continue,
        };
        let offsets: Option<Vec<Expr>> = r
            .offsets_of(h.index())
            .map(|o| o.iter().map(|&x| Expr::size(x)).collect());
        // The block that accesses this operator's runs: its row offsets and its one access.
        let access = run_of(prefix);
        let block = body.iter().find_map(|s| match s {
            Stmt::Block(b) if calls(b, func).iter().any(|a| a.first() == Some(&&access)) => Some(b),
            _ => None,
        });
        let ok = block.is_some_and(|b| {
            let rows_at = b.iter().find_map(|s| match s {
                Stmt::Array {
                    name, dims, init, ..
                } if name == "row_at" => Some((dims.clone(), init.clone())),
                _ => None,
            });
            rows_at == Some((vec![r.rows], offsets.clone()))
                && calls(b, func).len() == 1
                && template_args_of(b, func) == [targs.clone()]
        });
        want(
            offsets.is_some() && ok,
            format!(
                "op{} reads or writes its runs at the plan's row offsets",
                h.index()
            ),
        );
    }
    // `col` of every run: consecutive threads' runs are consecutive.
    let col = Expr::var("k")
        .times(Expr::size(r.threads))
        .plus(Expr::var("tid"))
        .paren()
        .times(Expr::size(r.vec));
    let mut cols = Vec::new();
    collect_decls(body, "col", &mut cols);
    want(
        !cols.is_empty() && cols.iter().all(|c| *c == col),
        "runs of consecutive threads are consecutive".into(),
    );
}

/// The values of every declaration of `name` in `stmts`, nested ones included.
fn collect_decls(stmts: &[mucc::emit::ir::Stmt], name: &str, out: &mut Vec<mucc::emit::ir::Expr>) {
    use mucc::emit::ir::{Init, Stmt};
    for s in stmts {
        match s {
            Stmt::Decl {
                name: n,
                init: Init::Assign(e),
                ..
            } if n == name => out.push(e.clone()),
            Stmt::Block(b) | Stmt::If(_, b) | Stmt::For { body: b, .. } => {
                collect_decls(b, name, out)
            }
            Stmt::Noted(..) => collect_decls(std::slice::from_ref(s.unnoted()), name, out),
            _ => {}
        }
    }
}

/// The type and value of the declaration of `name` among the top-level statements of `body`
/// (a note's statement included).
fn decl_of<'a>(
    body: &'a [mucc::emit::ir::Stmt],
    name: &str,
) -> Option<(mucc::emit::ir::Ty, &'a mucc::emit::ir::Expr)> {
    use mucc::emit::ir::{Init, Stmt};
    body.iter().find_map(|s| match s.unnoted() {
        Stmt::Decl {
            ty,
            name: n,
            init: Init::Assign(e),
            ..
        } if n == name => Some((*ty, e)),
        _ => None,
    })
}

/// Whether the prologue zeroes the zero page: `if (tid < 4) reinterpret_cast<unsigned*>(smem)[tid]
/// = 0u;` among the top-level statements.
fn zero_page(body: &[mucc::emit::ir::Stmt]) -> bool {
    use mucc::emit::ir::{Expr, IntType, Stmt, Ty};
    let word = Expr::Index(
        Box::new(Expr::Reinterpret(
            Ty::UnsignedPtr,
            Box::new(Expr::var("smem")),
        )),
        Box::new(Expr::var("tid")),
    );
    let zeroed = Stmt::Assign(word, Expr::Int(0, IntType::Unsigned));
    let cond = Expr::Lt(Box::new(Expr::var("tid")), Box::new(Expr::int(4)));
    body.iter()
        .any(|s| matches!(s.unnoted(), Stmt::IfLine(c, st) if *c == cond && **st == zeroed))
}

/// The bounds of the kernel's for-loop over `it` among the top-level statements of `body`.
fn loop_bounds(
    body: &[mucc::emit::ir::Stmt],
) -> Option<(mucc::emit::ir::Expr, mucc::emit::ir::Expr)> {
    body.iter().find_map(|s| match s {
        mucc::emit::ir::Stmt::For { var, from, to, .. } if var == "it" => {
            Some((from.clone(), to.clone()))
        }
        _ => None,
    })
}

/// The template arguments of every call of `func` in `stmts`, nested ones included.
fn template_args_of(
    stmts: &[mucc::emit::ir::Stmt],
    func: mucc::emit::ir::Func,
) -> Vec<Vec<mucc::emit::ir::TArg>> {
    let mut out = Vec::new();
    mucc::emit::ir::walk(stmts, &mut |e| {
        if let mucc::emit::ir::Expr::TemplateCall(f, t, _) = e
            && *f == func
        {
            out.push(t.clone());
        }
    });
    out
}

/// The types the kernel's statements alias (`using L<n> = …;`), in order.
fn aliases(stmts: &[mucc::emit::ir::Stmt]) -> Vec<&mucc::emit::ir::AliasType> {
    stmts
        .iter()
        .filter_map(|s| match s {
            mucc::emit::ir::Stmt::Using { ty, .. } => Some(ty),
            _ => None,
        })
        .collect()
}

/// The integer template arguments `range` of a call (a test failure names a non-integer).
fn ints(args: &[mucc::emit::ir::TArg], range: std::ops::Range<usize>) -> Vec<usize> {
    args[range]
        .iter()
        .map(|a| match a {
            mucc::emit::ir::TArg::Int(v) => *v as usize,
            other => panic!("not an integer: {other:?} in {args:?}"),
        })
        .collect()
}

/// The thread indices the for-loop's body declares (its first statement): name and value.
fn loop_vars(body: &[mucc::emit::ir::Stmt]) -> Vec<(String, mucc::emit::ir::Expr)> {
    body.iter()
        .find_map(|s| match s {
            mucc::emit::ir::Stmt::For { var, body, .. } if var == "it" => match body.first() {
                Some(mucc::emit::ir::Stmt::DeclMany { vars, .. }) => Some(vars.clone()),
                _ => None,
            },
            _ => None,
        })
        .unwrap_or_default()
}

/// A TMA kernel's prologue against its plan: the dynamic shared memory aligned for the
/// swizzled slots, the `full` mbarriers at the plan's offset, thread 0 initialising one per
/// ring stage and prefetching every tensor map.
fn check_tma_barriers(
    body: &[mucc::emit::ir::Stmt],
    kp: &KernelPlan,
    want: &mut impl FnMut(bool, String),
) {
    use mucc::emit::ir::{Expr, Func, Stmt, Ty, calls};
    let align = body.iter().find_map(|s| match s {
        Stmt::DynamicSmem { align, .. } => Some(*align),
        _ => None,
    });
    want(
        align == Some(mucc::sched::tma::TMA_SLOT_ALIGN),
        format!("dynamic shared memory aligned to {align:?}"),
    );
    let full = Expr::Reinterpret(
        Ty::MuccU64Ptr,
        Box::new(Expr::var("smem").plus(Expr::size(kp.tma.barriers))),
    );
    want(
        decl_of(body, "full") == Some((Ty::MuccU64Ptr, &full)),
        format!("TMA barriers at byte {}", kp.tma.barriers),
    );
    let stages = kp.ring().map_or(1, |r| r.stages);
    let init = body.iter().find_map(|s| match s {
        Stmt::If(_, b) if !calls(b, Func::MbarInit).is_empty() => b.iter().find_map(|x| match x {
            Stmt::For { to, body, .. } if !calls(body, Func::MbarInit).is_empty() => {
                Some((to.clone(), calls(b, Func::PrefetchTensormap).len()))
            }
            _ => None,
        }),
        _ => None,
    });
    want(
        init == Some((Expr::size(stages), kp.tma.map_count())),
        format!(
            "thread 0 initialises {stages} stage barriers and prefetches {} tensor maps: {init:?}",
            kp.tma.map_count()
        ),
    );
}

/// Whether chain `i` (plan `c`) of `kp` ends in an accumulator that sums the rows of its values,
/// or is led by a plain max (a `tb::for_each_row` call either way; strided groups apart).
fn summed_by_rows(
    tb: &mucc::graph::threadblock::TbGraph,
    kp: &mucc::sched::plan::KernelPlan,
    i: usize,
    c: &mucc::sched::plan::ChainPlan,
) -> bool {
    let plain_max = matches!(
        tb.ops[kp.fusion.chains[i].leader()].kind,
        TbOpKind::Reduction {
            kind: mucc::graph::ops::TbReduction::PlainMax,
            ..
        }
    );
    plain_max
        || matches!(c.sink, mucc::sched::plan::Sink::Accum(a)
        if matches!(tb.ops[a].kind, TbOpKind::Accum(k)
            if k.reduces_last_dim() && k != mucc::graph::AccumKind::RedtoxLdSum))
}

fn launch_of<'a>(e: &'a Emitted, name: &str) -> &'a KernelLaunch {
    e.launch
        .steps
        .iter()
        .find_map(|s| match s {
            Step::Kernel(k) if k.name == name => Some(k),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no launch of {name}"))
}

/// Checks one customized kernel against its plan.
pub fn check_kernel(g: &KernelGraph, e: &Emitted, k: usize, kp: &KernelPlan) -> Result<(), String> {
    let KnOpKind::Customized(tb) = &g.ops[Handle::from_index(k)].kind else {
        return Err("not customized".into());
    };
    let name = format!("k{k}_customized");
    let Some((stmts, sig)) = e
        .bodies
        .iter()
        .find(|b| b.name == name)
        .and_then(|b| Some((&b.body[..], b.signature.as_ref()?)))
    else {
        return Err(format!("no statements or signature of kernel {name}"));
    };
    let nt = kp.cta.threads;
    let mut errs = Vec::new();
    let mut want = |ok: bool, what: String| {
        if !ok {
            errs.push(what);
        }
    };
    // CTA and launch.
    let head = match kp.cluster_dims() {
        Some([x, y, z]) => format!(
            "__cluster_dims__({x}, {y}, {z}) __launch_bounds__({nt}, {})",
            kp.cta.min_blocks_per_sm
        ),
        None => format!("__launch_bounds__({nt}, {})", kp.cta.min_blocks_per_sm),
    };

    want(
        e.source.contains(&format!("{head} {name}(")),
        format!("launch bounds {head}"),
    );
    // A kernel that issues wgmma derives its loop's warp index through a shuffle.
    let loop_vars = loop_vars(stmts);
    let uniform = loop_vars.iter().any(|(n, e)| {
        n == "warp"
            && matches!(e, mucc::emit::ir::Expr::Call(f, _) if *f == mucc::emit::ir::Func::ShflSync)
    });
    want(
        uniform == kp.uniform_warp
            && kp.uniform_warp == kp.features().contains(&mucc::sched::plan::Feature::Wgmma),
        format!("uniform warp index {}", kp.uniform_warp),
    );
    // The loop derives its thread index as the plan says (a kernel over register rows has no
    // loop of its own).
    if kp.rows().is_none() {
        let tid_k = mucc::emit::ir::Expr::var("tid_k");
        let opaque_tid =
            mucc::emit::ir::Expr::Call(mucc::emit::ir::Func::Opaque, vec![tid_k.clone()]);
        let tid = loop_vars.iter().find(|(n, _)| n == "tid").map(|(_, e)| e);
        let (opaque, plain) = (tid == Some(&opaque_tid), tid == Some(&tid_k));
        want(
            match kp.loop_indices {
                mucc::sched::plan::LoopIndices::Recomputed => opaque && !plain,
                mucc::sched::plan::LoopIndices::Hoisted { .. } => plain && !opaque,
            },
            format!("loop thread index {:?}", kp.loop_indices),
        );
    }
    let l = launch_of(e, &name);
    want(
        l.grid == kp.launch_grid().map(|x| x as u32)
            && l.block == kp.cta.block.map(|x| x as u32)
            && l.dynamic_smem as usize == kp.smem.total,
        format!(
            "launch {:?} {:?} {} vs plan",
            l.grid, l.block, l.dynamic_smem
        ),
    );
    if let Some(r) = kp.rows() {
        check_rows(tb, e, &name, kp, r, &mut want);
        return if errs.is_empty() {
            Ok(())
        } else {
            Err(errs.join("; "))
        };
    }
    // Barriers: exactly the schedule's and the body's own (each loop barrier once), for the
    // plan's reasons, and no other.
    let (pre, body, post) = kp.schedule.barrier_counts();
    let planned = pre + body + post + kp.barriers.reasons().len();
    let printed = mucc::emit::ir::barriers(stmts).len();
    let mut reasons: Vec<String> = mucc::emit::ir::barriers(stmts)
        .iter()
        .map(|r| format!("{r:?}"))
        .collect();
    let mut planned_reasons: Vec<String> = kp
        .schedule
        .steps()
        .filter_map(|(_, s)| match s {
            mucc::sched::order::Step::Barrier(r) => Some(format!("{r:?}")),
            _ => None,
        })
        .chain(kp.barriers.reasons().iter().map(|r| format!("{r:?}")))
        .collect();
    reasons.sort();
    planned_reasons.sort();
    want(
        printed == planned && reasons == planned_reasons,
        format!(
            "{printed} __syncthreads() printed, {planned} planned (schedule {pre}/{body}/{post}, body {:?}); statements {reasons:?}, plan {planned_reasons:?}",
            kp.barriers.reasons()
        ),
    );
    check_ring_start(tb, stmts, kp, &mut want);
    // The fold CTA 0 of a cluster split runs behind a barrier: the plan's, right after it.
    if let Some(i) = kp.barriers.after_rescaled_folds {
        let why = mucc::sched::order::BarrierReason::AfterRescaledFolds.to_string();
        let tile = kp
            .split
            .cluster()
            .map_or(usize::MAX, |c| c.partials[i].tile);
        // The statement after the barrier is the fold of that tile.
        use mucc::emit::ir::{Expr, Func, Stmt};
        let mut next = None;
        mucc::emit::ir::visit(stmts, &mut |s| {
            if let Stmt::If(_, b) = s
                && let Some(j) = b.iter().position(|x| {
                    matches!(x, Stmt::Barrier { reason, .. }
                        if *reason == mucc::sched::order::BarrierReason::AfterRescaledFolds)
                })
                && let Some(Stmt::Eval(Expr::TemplateCall(f, _, args))) = b.get(j + 1)
                && *f == Func::TbClusterFold
            {
                next = Some(args.clone());
            }
        });
        want(
            next == Some(vec![Expr::var("tid"), Expr::var(format!("s{tile}"))]),
            format!("the fold of s{tile} behind the barrier: {why}"),
        );
    }
    // Waits for `cp.async` copies outside a ring: exactly the plan's, each right before a
    // barrier or at a phase's end.
    {
        let printed = mucc::emit::ir::calls(stmts, mucc::emit::ir::Func::CpAsyncWaitAll).len();
        want(
            printed == kp.copy_waits.count(),
            format!(
                "{printed} cp.async waits printed, {:?} planned",
                kp.copy_waits
            ),
        );
        // Those before a step of the schedule are right before its barrier.
        use mucc::sched::order::Phase;
        let planned: usize = [Phase::PreLoop, Phase::Loop, Phase::PostLoop]
            .into_iter()
            .map(|ph| {
                let n = kp.schedule.phase(ph).len();
                kp.copy_waits.of(ph).iter().filter(|&&i| i < n).count()
            })
            .sum();
        let mut before_barrier = 0;
        let is_wait = |s: &mucc::emit::ir::Stmt| {
            matches!(s, mucc::emit::ir::Stmt::Eval(mucc::emit::ir::Expr::Call(f, _))
                if *f == mucc::emit::ir::Func::CpAsyncWaitAll)
        };
        let mut lists: Vec<&[mucc::emit::ir::Stmt]> = vec![stmts];
        mucc::emit::ir::visit(stmts, &mut |s| {
            if let mucc::emit::ir::Stmt::Block(b)
            | mucc::emit::ir::Stmt::If(_, b)
            | mucc::emit::ir::Stmt::For { body: b, .. } = s
            {
                lists.push(b);
            }
        });
        for l in lists {
            before_barrier += l
                .windows(2)
                .filter(|w| is_wait(&w[0]) && matches!(w[1], mucc::emit::ir::Stmt::Barrier { .. }))
                .count();
        }
        want(
            before_barrier == planned,
            format!("{before_barrier} cp.async waits right before a barrier, {planned} planned"),
        );
    }
    // Matmul lowerings: each chain's way into its sink.
    {
        use mucc::emit::ir::{Method, Nested, Stmt, member_calls, visit};
        use mucc::sched::plan::{MatmulLowering as L, Sink};
        let count = |l: L| kp.chains.iter().filter(|c| c.matmul == Some(l)).count();
        let mut fragments = 0;
        visit(stmts, &mut |s| {
            if let Stmt::NestedDecl {
                ty: Nested::Frag,
                name,
                ..
            } = s
                && name == "c_"
            {
                fragments += 1;
            }
        });
        want(
            member_calls(stmts, Method::Apply).len() == count(L::SliceBySlice)
                && fragments == count(L::ThroughMembers)
                && member_calls(stmts, Method::At).len() == count(L::PerElement),
            format!(
                "matmul lowerings: {} slice by slice, {} through members, {} per element",
                count(L::SliceBySlice),
                count(L::ThroughMembers),
                count(L::PerElement)
            ),
        );
        for (i, c) in kp.chains.iter().enumerate() {
            if c.matmul != Some(L::IntoFragment) {
                continue;
            }
            if let Sink::Accum(acc) = c.sink {
                // A register pipe's consumer takes its A operand from the producer's fragment.
                let acc_var = mucc::emit::ir::Expr::var(format!("acc{}", acc.index()));
                let pk = mucc::emit::ir::Expr::var("pk_");
                let found = if kp.pipe_into(i).is_some() {
                    [Method::RunFrom, Method::RunFromKeys].iter().any(|&m| {
                        member_calls(stmts, m)
                            .iter()
                            .any(|(_, a)| a.len() > 1 && *a[0] == acc_var && *a[1] == pk)
                    })
                } else {
                    member_calls(stmts, Method::Run)
                        .iter()
                        .any(|(_, a)| a.first().is_some_and(|x| **x == acc_var))
                };
                want(
                    found,
                    format!("op{} accumulated straight into its fragment", acc.index()),
                );
            }
        }
    }
    // The features `explain` names are the ones the code uses.
    {
        use mucc::sched::plan::Feature as F;
        let has = kp.features();
        // The A and B loads of every Mma class the kernel aliases.
        let mma_loads: Vec<(OperandLoad, OperandLoad)> = aliases(stmts)
            .into_iter()
            .filter_map(|t| match t {
                mucc::emit::ir::AliasType::Mma(t) => Some(t.loads),
                _ => None,
            })
            .collect();
        let b_loads: Vec<OperandLoad> = mma_loads.iter().map(|l| l.1).collect();
        let wgmma_b = &OperandLoad::WgmmaDescriptor;
        // The functions the kernel's statements and its ring call.
        let ring = e
            .rings
            .iter()
            .find(|r| r.name == name)
            .map_or(&[][..], |r| &r.body[..]);
        let called: Vec<mucc::emit::ir::Func> = mucc::emit::ir::functions(stmts)
            .into_iter()
            .chain(mucc::emit::ir::functions(ring))
            .collect();
        let calls_any = |fs: &[mucc::emit::ir::Func]| fs.iter().any(|f| called.contains(f));
        let uses = |f: F| match f {
            F::CpAsync => calls_any(&[mucc::emit::ir::Func::TbCpAsyncChunks]),
            F::Tma => calls_any(&[mucc::emit::ir::Func::TmaLoad]),
            // `ldmatrix` or `ldmatrix.trans`.
            F::Ldmatrix => mma_loads.iter().any(|l| {
                [l.0, l.1]
                    .iter()
                    .any(|x| matches!(x, OperandLoad::Ldmatrix | OperandLoad::LdmatrixTrans))
            }),
            // Every Mma<…> type whose B is not read by descriptor issues mma.sync.
            F::MmaSync => b_loads.iter().any(|b| b != wgmma_b),
            F::Wgmma => b_loads.iter().any(|b| b == wgmma_b),
            F::FmaMatmul => {
                !mucc::emit::ir::member_calls(stmts, mucc::emit::ir::Method::At).is_empty()
            }
            F::RegisterPipe => [
                mucc::emit::ir::Method::RunFrom,
                mucc::emit::ir::Method::RunFromKeys,
            ]
            .iter()
            .any(|&m| !mucc::emit::ir::member_calls(stmts, m).is_empty()),
            F::Cluster => calls_any(&[
                mucc::emit::ir::Func::ClusterSync,
                mucc::emit::ir::Func::ClusterWait,
            ]),
            F::GridSplit => calls_any(&[
                mucc::emit::ir::Func::TbStorePartial,
                mucc::emit::ir::Func::TbFoldPartials,
            ]),
            F::ProgrammaticLaunch => calls_any(&[
                mucc::emit::ir::Func::GridDependencyWait,
                mucc::emit::ir::Func::LaunchDependents,
            ]),
            // Runs loaded or stored outside the threads' element loops (a chain's vector loads
            // are inside them).
            F::RegisterRows => {
                let outside = functions_outside_lambdas(stmts);
                outside.contains(&mucc::emit::ir::Func::TbLoadRun)
                    || outside.contains(&mucc::emit::ir::Func::TbStoreRun)
            }
        };
        for f in [
            F::CpAsync,
            F::Tma,
            F::Ldmatrix,
            F::MmaSync,
            F::Wgmma,
            F::FmaMatmul,
            F::RegisterPipe,
            F::Cluster,
            F::ProgrammaticLaunch,
            F::RegisterRows,
        ] {
            want(
                has.contains(&f) == uses(f),
                format!(
                    "feature {f}: planned {}, in the code {}",
                    has.contains(&f),
                    uses(f)
                ),
            );
        }
    }
    // exp by ex2.approx exactly where the plan rounds its value to 16 bits right after.
    for (kind, func) in [
        (ApproxExp::Ex2, mucc::emit::ir::Func::ExpApprox),
        (
            ApproxExp::Ex2FlushToZero,
            mucc::emit::ir::Func::ExpApproxFtz,
        ),
    ] {
        let approx = kp
            .chains
            .iter()
            .filter(|c| c.approx_exp == Some(kind))
            .count();
        want(
            mucc::emit::ir::calls(stmts, func).len() == approx,
            format!("{approx} chains with exp by {kind}"),
        );
    }
    // silu and sigmoid by their approximate forms exactly in the chains the plan says: one call
    // per such chain (and none outside them).
    {
        let planned = kp
            .chains
            .iter()
            .enumerate()
            .filter(|(_, c)| c.approx_logistic)
            .map(|(i, _)| {
                kp.fusion.chains[i]
                    .ops
                    .iter()
                    .filter(|&&o| {
                        matches!(
                            tb.ops[o].kind,
                            TbOpKind::Unary(UnaryOp::Silu | UnaryOp::Sigmoid)
                        )
                    })
                    .count()
            })
            .sum::<usize>();
        let found = mucc::emit::ir::calls(stmts, mucc::emit::ir::Func::SiluApprox).len()
            + mucc::emit::ir::calls(stmts, mucc::emit::ir::Func::SigmoidApprox).len();
        want(
            found == planned,
            format!("{found} approximate silu/sigmoid calls, plan {planned}"),
        );
    }
    // Vector steps: one for_each_step<threads, elements, V> per vectorised chain (row sums
    // apart: their for_each_row calls are checked below), with the plan's width; binary
    // members read their side tile (`side<i>`) once per element.
    {
        let mut planned: Vec<usize> = kp
            .chains
            .iter()
            .enumerate()
            .filter(|&(i, c)| c.vector > 1 && !summed_by_rows(tb, kp, i, c))
            .map(|(_, c)| c.vector)
            .collect();
        let mut found: Vec<usize> = Vec::new();
        mucc::emit::ir::walk(stmts, &mut |e| {
            if let mucc::emit::ir::Expr::TemplateCall(mucc::emit::ir::Func::TbForEachStep, t, _) = e
                && let Some(mucc::emit::ir::TArg::Int(v)) = t.get(2)
            {
                found.push(*v as usize);
            }
        });
        planned.sort_unstable();
        found.sort_unstable();
        want(
            planned == found,
            format!("vector steps {planned:?} planned, {found:?} in the code"),
        );
        let binary_members = kp
            .chains
            .iter()
            .flat_map(|c| c.members.iter())
            .filter(|&&m| kp.fusion.side_input(tb, m).is_some())
            .count();
        let mut side_reads = 0;
        mucc::emit::ir::visit(stmts, &mut |s| {
            if let mucc::emit::ir::Stmt::Decl {
                ty: mucc::emit::ir::Ty::ConstElem(_),
                name,
                ..
            } = s
                && name.starts_with("side")
            {
                side_reads += 1;
            }
        });
        want(
            side_reads == binary_members,
            format!("{binary_members} binary chain members, {side_reads} side reads in the code"),
        );
    }
    // Write-backs after the loop: each planned one printed once, and every register
    // accumulator with a buffer (its tile read after the loop) among them.
    {
        use mucc::emit::ir::{Expr, Func, Method, calls, member_calls};
        use mucc::sched::plan::WriteBack;
        // Calls of `m` whose first argument is accumulator `a`'s registers.
        let of_acc = |m: Method, a: usize| {
            let acc = Expr::var(format!("acc{a}"));
            member_calls(stmts, m)
                .iter()
                .filter(|(_, args)| args.first().is_some_and(|x| **x == acc))
                .count()
        };
        for wb in &kp.write_backs {
            let a = wb.acc();
            let printed = match wb {
                WriteBack::Store {
                    fragment_of: Some(_),
                    ..
                } => of_acc(Method::Each, a),
                // Each thread's registers converted into the tile: from_compute(acc[r]).
                WriteBack::Store { .. } => {
                    let reg = Expr::Index(
                        Box::new(Expr::var(format!("acc{a}"))),
                        Box::new(Expr::var("r")),
                    );
                    calls(stmts, Func::FromCompute)
                        .iter()
                        .filter(|args| args.first().is_some_and(|x| **x == reg))
                        .count()
                }
                WriteBack::KeySplit { .. } => of_acc(Method::CombineKeys, a),
            };
            want(
                printed == 1,
                format!("write-back {wb:?} printed {printed} times"),
            );
        }
        let key_splits = kp
            .write_backs
            .iter()
            .filter(|w| matches!(w, WriteBack::KeySplit { .. }))
            .count();
        want(
            member_calls(stmts, Method::CombineKeys).len() == key_splits,
            format!("{key_splits} key splits written back"),
        );
        for (h, _) in tb.ops.iter() {
            let in_registers = matches!(&kp.ops[h.index()],
                OpPlan::Accum { storage, .. } if storage.in_registers());
            let buffered = kp
                .smem
                .buffer_of(tb.ops[h].outputs.first().map_or(usize::MAX, |t| t.index()))
                .is_some();
            want(
                !(in_registers && buffered) || kp.write_backs.iter().any(|w| w.acc() == h.index()),
                format!(
                    "op{}: a register accumulator with a buffer is not written back",
                    h.index()
                ),
            );
        }
    }
    // Register pipes: the tile never in shared memory, the consumer fed from the fragment, one
    // shuffle row sum per row-summing reader; every other candidate goes through shared memory.
    {
        use mucc::sched::plan::PipeDecision;
        let on: Vec<_> = kp.register_pipes().collect();
        let online = on.iter().filter(|p| p.online.is_some()).count();
        // A key split's consumer runs on its warps' keys and combines them after the loop.
        let keys = on.iter().filter(|p| p.keys > 1).count();
        use mucc::emit::ir::{Method, member_calls};
        let n = |m: Method| member_calls(stmts, m).len();
        want(
            n(Method::RunFrom) == on.len() - keys
                && n(Method::RunFromKeys) == keys
                && n(Method::CombineKeys) == keys
                && n(Method::RowSums) == on.iter().map(|p| p.row_sums.len()).sum::<usize>()
                && n(Method::Pack) == on.len() - online
                && n(Method::OnlinePack) == online
                && n(Method::ScaleRows) == online,
            format!(
                "{} register pipes ({online} online, {keys} splitting the keys)",
                on.len()
            ),
        );
        for p in &on {
            for t in p.tiles() {
                want(
                    kp.tiles[t].is_none() && decl_of(stmts, &format!("s{t}")).is_none(),
                    format!("piped s{t} has no shared memory"),
                );
            }
        }
        for d in &kp.pipes {
            if let PipeDecision::Off { tile, .. } = d {
                want(
                    kp.tiles[*tile].is_some(),
                    format!("s{tile}, not piped, lives in shared memory"),
                );
            }
        }
    }
    // The cluster split: this CTA's share of the loop, and a fold per partial accumulator.
    // The grid split: this CTA's share from its place among the block's CTAs, a store and a
    // fold per partial accumulator, one arrival guarding the folds, its two parameters.
    {
        use mucc::emit::ir::{Expr, Func, KernelParam, Stmt, Sym, TArg, Ty, calls};
        let params = |p: KernelParam| sig.params.iter().filter(|&&q| q == p).count();
        let args_of = |f: Func| -> Vec<Vec<Expr>> {
            calls(stmts, f)
                .into_iter()
                .map(|a| a.into_iter().cloned().collect())
                .collect()
        };
        match kp.split.grid() {
            Some(g) => {
                let rank = Expr::Call(
                    Func::CastToInt,
                    vec![Expr::Sym(Sym::BlockIdx(0)).modulo(Expr::size(g.ctas))],
                );
                let share = Expr::var("rsplit").times(Expr::size(g.iters));
                let it0 = Expr::var("it0");
                want(
                    decl_of(stmts, "rsplit") == Some((Ty::ConstInt, &rank))
                        && decl_of(stmts, "it0") == Some((Ty::ConstInt, &share))
                        && loop_bounds(stmts) == Some((it0.clone(), it0.plus(Expr::size(g.iters)))),
                    format!(
                        "a loop share of {} iterations from it0 = (blockIdx.x % {}) · {}",
                        g.iters, g.ctas, g.iters
                    ),
                );
                let (stores, folds) =
                    (args_of(Func::TbStorePartial), args_of(Func::TbFoldPartials));
                let fold_targs = template_args_of(stmts, Func::TbFoldPartials);
                for (i, p) in g.partials.iter().enumerate() {
                    let (tile, base) = (
                        Expr::var(format!("s{}", p.tile)),
                        Expr::var(format!("gs{}", p.tile)),
                    );
                    let n = g.slot_elems[i];
                    want(
                        stores.iter().any(|a| {
                            a[1] == tile
                                && a[2]
                                    == base.clone().plus(Expr::var("rsplit").times(Expr::size(n)))
                        }),
                        format!("a store of s{} into this CTA's slot of {n}", p.tile),
                    );
                    want(
                        folds.iter().any(|a| a[1..] == [tile.clone(), base.clone()])
                            && fold_targs.iter().any(|t| {
                                t[..3] == [TArg::int(nt), TArg::int(n), TArg::int(g.ctas)]
                            }),
                        format!("a fold of the {} slots of s{}", g.ctas, p.tile),
                    );
                }
                let guards: Vec<&Stmt> = stmts
                    .iter()
                    .map(Stmt::unnoted)
                    .filter(|s| {
                        matches!(s, Stmt::IfLine(Expr::Not(a), r)
                            if matches!(**a, Expr::TemplateCall(Func::TbArriveLast, ref t, _)
                                if t[..] == [TArg::int(g.ctas)])
                                && matches!(**r, Stmt::Return(None)))
                    })
                    .collect();
                want(
                    guards.len() == 1
                        && stores.len() == g.partials.len()
                        && folds.len() == g.partials.len(),
                    format!(
                        "one arrival of {} CTAs guarding the folds, one store and fold per partial",
                        g.ctas
                    ),
                );
                // The stores before the arrival, the folds after it.
                let at = |f: &dyn Fn(&Stmt) -> bool| stmts.iter().map(Stmt::unnoted).position(f);
                let guard = at(&|s| matches!(s, Stmt::IfLine(Expr::Not(_), _)));
                let store = at(&|s| {
                    matches!(
                        s,
                        Stmt::Eval(Expr::TemplateCall(Func::TbStorePartial, _, _))
                    )
                });
                let fold = at(&|s| {
                    matches!(
                        s,
                        Stmt::Eval(Expr::TemplateCall(Func::TbFoldPartials, _, _))
                    )
                });
                want(
                    matches!((store, guard, fold), (Some(a), Some(b), Some(c)) if a < b && b < c),
                    "stores, then the arrival, then the folds".into(),
                );
                want(
                    params(KernelParam::SplitSlots) == 1
                        && params(KernelParam::ArrivalCounters) == 1,
                    "the slots and the counters as parameters".into(),
                );
            }
            None => want(
                params(KernelParam::SplitSlots) == 0
                    && args_of(Func::TbStorePartial).is_empty()
                    && args_of(Func::TbFoldPartials).is_empty(),
                "no partial slots without a grid split".into(),
            ),
        }
    }
    match kp.split.cluster() {
        Some(c) => {
            use mucc::emit::ir::{Expr, Func, Ty, calls};
            let share = Expr::Call(Func::CastToInt, vec![Expr::Call(Func::ClusterRank, vec![])])
                .times(Expr::size(c.iters));
            let it0 = Expr::var("it0");
            want(
                decl_of(stmts, "it0") == Some((Ty::ConstInt, &share))
                    && loop_bounds(stmts) == Some((it0.clone(), it0.plus(Expr::size(c.iters)))),
                format!("a loop share of {} iterations from it0", c.iters),
            );
            // Every call of `f` by its arguments (the tile first after `tid`).
            let args_of = |f: Func| -> Vec<Vec<Expr>> {
                calls(stmts, f)
                    .into_iter()
                    .map(|a| a.into_iter().cloned().collect())
                    .collect()
            };
            let count = |f: Func| calls(stmts, f).len();
            if let Some(push) = c.gather.push() {
                let (pushes, folds) = (
                    args_of(Func::TbClusterPush),
                    args_of(Func::TbClusterFoldPushed),
                );
                for (i, p) in c.partials.iter().enumerate() {
                    let (slot, stride) = (push.slots[i], push.strides[i]);
                    let (tile, at) = (
                        Expr::var(format!("s{}", p.tile)),
                        Expr::var("smem").plus(Expr::size(slot)),
                    );
                    want(
                        pushes.iter().any(|a| a[1] == tile && a[2] == at),
                        format!("a push of s{} into the slots at byte {slot}", p.tile),
                    );
                    want(
                        folds.iter().any(|a| a[1..] == [tile.clone(), at.clone()]),
                        format!("a fold of the pushed s{}", p.tile),
                    );
                    let targs = template_args_of(stmts, Func::TbClusterPush);
                    want(
                        targs.iter().any(|t| {
                            t[0] == mucc::emit::ir::TArg::int(nt)
                                && t[2] == mucc::emit::ir::TArg::int(stride)
                        }),
                        format!("a push of s{} at a stride of {stride}", p.tile),
                    );
                }
                let push_at = Expr::Reinterpret(
                    Ty::MuccU64Ptr,
                    Box::new(Expr::var("smem").plus(Expr::size(push.barrier))),
                );
                want(
                    decl_of(stmts, "push") == Some((Ty::MuccU64Ptr, &push_at))
                        && args_of(Func::MbarArriveExpectTx)
                            .contains(&vec![Expr::var("push"), Expr::size(push.bytes)]),
                    format!(
                        "the push barrier at byte {} awaiting {} bytes",
                        push.barrier, push.bytes
                    ),
                );
                want(
                    count(Func::ClusterArriveRelaxed) == 1
                        && count(Func::ClusterWait) == 1
                        && count(Func::ClusterSync) == 0
                        && count(Func::TbClusterFold) == 0,
                    "one cluster barrier (arrive before the loop, wait after), no reads of peers"
                        .into(),
                );
            } else {
                for p in &c.partials {
                    let tile = Expr::var(format!("s{}", p.tile));
                    let found = match p.combine {
                        mucc::sched::plan::Combine::Rescaled { max_tile } => {
                            args_of(Func::TbClusterFoldRescaled).contains(&vec![
                                Expr::var("tid"),
                                tile,
                                Expr::var(format!("s{max_tile}")),
                            ])
                        }
                        _ => args_of(Func::TbClusterFold).contains(&vec![Expr::var("tid"), tile]),
                    };
                    want(found, format!("a fold of s{}", p.tile));
                }
                want(count(Func::ClusterSync) == 2, "two cluster barriers".into());
            }
        }
        None => {
            use mucc::emit::ir::{Expr, Func, Sym, functions, walk};
            let cluster = [
                Func::ClusterRank,
                Func::ClusterSync,
                Func::ClusterWait,
                Func::ClusterArriveRelaxed,
                Func::TbClusterPush,
                Func::TbClusterFold,
                Func::TbClusterFoldPushed,
                Func::TbClusterFoldRescaled,
                Func::TbClusterSoftmaxCombine,
            ];
            let mut block_divided = false;
            walk(stmts, &mut |e| {
                if let Expr::Div(a, _) = e
                    && **a == Expr::Sym(Sym::BlockIdx(0))
                {
                    block_divided = true;
                }
            });
            want(
                !functions(stmts).iter().any(|f| cluster.contains(f))
                    && (!block_divided || kp.split.grid().is_some())
                    && sig.cluster.is_none(),
                "no cluster code without a split".into(),
            )
        }
    }
    // The last-block combine: after every other statement, one arrival on the group's counter
    // (the plan's splits) guarding one combine of the plan's shape, vector and partial steps,
    // and the two parameters it reads; none of them without it.
    {
        use mucc::emit::ir::{Expr, Func, KernelParam, Stmt, TArg, functions, walk};
        let arrivals: Vec<(&[TArg], &Vec<Stmt>)> = stmts
            .iter()
            .filter_map(|s| match s {
                Stmt::If(Expr::TemplateCall(Func::TbArriveLast, t, _), body) => {
                    Some((&t[..], body))
                }
                _ => None,
            })
            .collect();
        let mut anywhere = 0;
        walk(stmts, &mut |e| {
            if let Expr::TemplateCall(Func::TbArriveLast | Func::TbCombineSplits, _, _) = e {
                anywhere += 1;
            }
        });
        let params = |p: KernelParam| sig.params.iter().filter(|&&q| q == p).count();
        match &kp.last_block_combine {
            Some(c) => {
                let last = matches!(
                    stmts.last(),
                    Some(Stmt::If(Expr::TemplateCall(Func::TbArriveLast, _, _), _))
                );
                want(
                    arrivals.len() == 1 && anywhere == 2 && last,
                    "one arrival, last in the body, guarding one combine".into(),
                );
                if let [(t, body)] = arrivals[..] {
                    want(
                        t == [TArg::int(c.splits)],
                        format!("an arrival of {} splits", c.splits),
                    );
                    let combine = body.iter().find_map(|s| match s {
                        Stmt::Eval(Expr::TemplateCall(Func::TbCombineSplits, t, a)) => Some((t, a)),
                        _ => None,
                    });
                    match combine {
                        Some((t, a)) => {
                            let want_ints: Vec<TArg> = [c.rows(), c.d(), c.splits, c.vector]
                                .into_iter()
                                .map(TArg::int)
                                .collect();
                            want(
                                t.len() == 10 && t[1..5] == want_ints[..],
                                format!(
                                    "a combine of {} rows of {}, {} splits, {}-element vectors",
                                    c.rows(),
                                    c.d(),
                                    c.splits,
                                    c.vector
                                ),
                            );
                            let steps: Vec<&Expr> =
                                [2, 4, 6].iter().filter_map(|&i| a.get(i)).collect();
                            let want_steps = [c.o.step, c.l.step, c.m.step].map(Expr::size);
                            want(
                                steps.len() == 3
                                    && steps.iter().zip(&want_steps).all(|(a, b)| *a == b),
                                format!("partial steps {:?}", [c.o.step, c.l.step, c.m.step]),
                            );
                        }
                        None => want(false, "the arrival guards a combine".into()),
                    }
                }
                want(
                    params(KernelParam::CombineOutput) == 1
                        && params(KernelParam::ArrivalCounters) == 1,
                    "the combine's output and the counters as parameters".into(),
                );
                want(
                    kp.cluster_combine.is_none() && sig.cluster.is_none() && kp.split.ctas() == 1,
                    "no cluster beside a last-block combine".into(),
                );
            }
            None => {
                let grid = usize::from(kp.split.grid().is_some());
                want(
                    anywhere == grid
                        && params(KernelParam::ArrivalCounters) == grid
                        && !functions(stmts).contains(&Func::TbCombineSplits),
                    "no arrival without a last-block combine (but a grid split's)".into(),
                )
            }
        }
    }
    // Mean and RMS accumulators finalised with the plan's divisor, element by element.
    for (h, top) in tb.ops.iter() {
        use mucc::emit::ir::{Expr, Func, Stmt};
        use mucc::graph::ops::{AccumKind, UnaryOp};
        let TbOpKind::Accum(kind) = top.kind else {
            continue;
        };
        if !matches!(kind, AccumKind::RedLdMean | AccumKind::RedLdRms) {
            continue;
        }
        let OpPlan::Accum {
            divisor: Some(d), ..
        } = kp.ops[h.index()]
        else {
            want(
                false,
                format!("op{}: a mean or RMS without a divisor", h.index()),
            );
            continue;
        };
        let cd = g.tensors[g.ops[Handle::from_index(k)].outputs[0]]
            .dtype
            .compute();
        let mean = Expr::var("v").over(Expr::Number(d as f64, cd));
        let want_value = match kind {
            AccumKind::RedLdRms => Expr::Unary(UnaryOp::Sqrt, Box::new(mean), cd),
            _ => mean,
        };
        let tile = Expr::var(format!("s{}", top.outputs[0].index()));
        let found = stmts.iter().any(|s| match s {
            Stmt::CallWith {
                call: Expr::TemplateCall(Func::TbForEach, ..),
                lambda,
            } => lambda.body.iter().any(|x| {
                matches!(x, Stmt::Assign(Expr::Index(t, _), Expr::TemplateCall(Func::FromCompute, _, v))
                    if **t == tile && v[..] == [want_value.clone()])
            }),
            _ => false,
        });
        want(
            found,
            format!("op{} finalised with the plan's divisor {d}", h.index()),
        );
    }
    // Tiles at the plan's offsets, in the plan's types; the zero page.
    for (b, kind) in kp.smem.kinds.iter().enumerate() {
        use mucc::emit::ir::{Expr, Ty};
        let t = kind.tile();
        let d = kp.tiles[t].as_ref().unwrap().dtype;
        let at = Expr::Reinterpret(
            Ty::ElemPtr(d),
            Box::new(Expr::var("smem").plus(Expr::size(kp.smem.offset(b)))),
        );
        want(
            decl_of(stmts, &format!("s{t}")) == Some((Ty::ElemPtr(d), &at)),
            format!("tile s{t} at byte {} as {d:?}", kp.smem.offset(b)),
        );
    }
    want(zero_page(stmts) == (kp.smem.base > 0), "zero page".into());
    // Tiles of a line or more start on a 128-byte line; a wgmma B tile (read through a
    // 128-byte-swizzle descriptor) and every stage slot of it on 1024 bytes.
    for (b, kind) in kp.smem.kinds.iter().enumerate() {
        let geo = kp.tiles[kind.tile()].as_ref().unwrap();
        if geo.bytes >= 128 {
            want(
                kp.smem.offset(b).is_multiple_of(128),
                format!("s{} on a 128-byte line", kind.tile()),
            );
        }
    }
    for (h, op) in tb.ops.iter() {
        if let OpPlan::Matmul { loads, .. } = &kp.ops[h.index()]
            && loads.1 == OperandLoad::WgmmaDescriptor
        {
            let t = op.inputs[1].index();
            let b = kp.smem.buffer_of(t);
            want(
                b.is_some_and(|b| kp.smem.offset(b).is_multiple_of(1024))
                    && kp.tiles[t].as_ref().unwrap().bytes.is_multiple_of(1024),
                format!("wgmma B tile s{t} and its stage slots on 1024 bytes"),
            );
        }
    }
    // Row splits: every rms_rows / for_each_row call, against the plan's.
    let mut planned: Vec<(usize, usize, usize)> = Vec::new();
    for p in &kp.ops {
        match p {
            OpPlan::RowReduce(r) | OpPlan::Accum { rows: Some(r), .. } => {
                planned.push((r.threads_per_row, r.rows, r.len))
            }
            _ => {}
        }
    }
    let mut emitted: Vec<(usize, usize, usize)> = Vec::new();
    for f in [
        mucc::emit::ir::Func::TbRmsRows,
        mucc::emit::ir::Func::TbForEachRow,
    ] {
        for a in template_args_of(stmts, f) {
            let v = ints(&a, 0..4);
            want(v[0] == nt, format!("{f:?} with {} threads", v[0]));
            emitted.push((v[1], v[2], v[3]));
        }
    }
    planned.sort();
    emitted.sort();
    want(
        planned == emitted,
        format!("row splits (tpr, rows, len): plan {planned:?}, code {emitted:?}"),
    );
    // Row sums by vectors: each for_each_row's run length (a sixth argument above 1) against
    // the vector widths of the chains summed by rows.
    let mut row_vectors: Vec<usize> = kp
        .chains
        .iter()
        .enumerate()
        .filter(|&(i, c)| summed_by_rows(tb, kp, i, c))
        .map(|(_, c)| c.vector)
        .collect();
    let mut emitted_vectors: Vec<usize> =
        template_args_of(stmts, mucc::emit::ir::Func::TbForEachRow)
            .into_iter()
            .map(|a| match a.get(5) {
                None => 1,
                Some(mucc::emit::ir::TArg::Int(v)) => *v as usize,
                Some(_) => 0,
            })
            .collect();
    // Rows a register pipe sums by shuffles have no for_each_row call.
    row_vectors.retain(|&v| v > 1);
    emitted_vectors.retain(|&v| v != 1);
    row_vectors.sort();
    emitted_vectors.sort();
    want(
        row_vectors == emitted_vectors,
        format!("row-sum vectors: plan {row_vectors:?}, code {emitted_vectors:?}"),
    );
    // Accumulators written once start from nothing: no fill of their tiles.
    for (h, op) in tb.ops.iter() {
        if let OpPlan::Accum {
            storage: AccumStorage::WrittenOnce,
            ..
        } = &kp.ops[h.index()]
        {
            let t = op.outputs[0].index();
            let tile = mucc::emit::ir::Expr::var(format!("s{t}"));
            want(
                !mucc::emit::ir::calls(stmts, mucc::emit::ir::Func::TbFill)
                    .iter()
                    .any(|a| a.get(1).is_some_and(|x| **x == tile)),
                format!("s{t}, an accumulator written once, is filled"),
            );
        }
    }
    // Matmuls: warp grids and operand loads of tensor-core products; FMA products.
    let mut mma_plan = BTreeSet::new();
    let mut fma_plan = BTreeSet::new();
    for (h, op) in tb.ops.iter() {
        if let OpPlan::Matmul {
            warps,
            instr,
            loads,
            walks,
            ..
        } = &kp.ops[h.index()]
        {
            let (a, b) = (
                &tb.tensors[op.inputs[0]].shape,
                &tb.tensors[op.inputs[1]].shape,
            );
            let r = a.rank();
            let mnk = (a.dim(r - 2), b.dim(r - 1), a.dim(r - 1));
            match instr {
                MatmulInstr::MmaSyncM16N8K16 { dtype } | MatmulInstr::WgmmaM64K16 { dtype, .. } => {
                    mma_plan.insert((
                        ctype(*dtype).to_string(),
                        mnk,
                        *warps,
                        mucc::emit::cxx::operand_load(loads.0).to_string(),
                        mucc::emit::cxx::operand_load(loads.1).to_string(),
                        (
                            walks.a.to_string(),
                            walks.b.to_string(),
                            walks.slice_n_tiles,
                        ),
                    ));
                }
                MatmulInstr::Fma => {
                    fma_plan.insert(mnk);
                }
            }
        }
    }
    let mma_code: BTreeSet<_> = aliases(stmts)
        .into_iter()
        .filter_map(|t| match t {
            mucc::emit::ir::AliasType::Mma(t) => Some((
                ctype(t.dtype).to_string(),
                t.mnk,
                t.warps,
                mucc::emit::cxx::operand_load(t.loads.0).to_string(),
                mucc::emit::cxx::operand_load(t.loads.1).to_string(),
                (
                    t.walks.a.to_string(),
                    t.walks.b.to_string(),
                    t.walks.slice_n_tiles,
                ),
            )),
            _ => None,
        })
        .collect();
    want(
        mma_plan == mma_code,
        format!("mma: plan {mma_plan:?}, code {mma_code:?}"),
    );
    let fma_code: BTreeSet<_> = aliases(stmts)
        .into_iter()
        .filter_map(|t| match t {
            mucc::emit::ir::AliasType::Fma { mnk, .. } => Some(*mnk),
            _ => None,
        })
        .collect();
    want(
        fma_plan == fma_code,
        format!("fma: plan {fma_plan:?}, code {fma_code:?}"),
    );
    // Copies: widths and engines.
    let mut copies_plan = BTreeSet::new();
    for (h, op) in tb.ops.iter() {
        let (copy, engine, tile) = match (&op.kind, &kp.ops[h.index()]) {
            (TbOpKind::Input { .. }, OpPlan::Input { copy, engine, .. }) => {
                (copy, *engine, op.outputs[0])
            }
            (TbOpKind::Output { .. }, OpPlan::Output { copy: Some(copy) }) => {
                (copy, CopyEngine::Threads, op.inputs[0])
            }
            _ => continue,
        };
        let n = tb.tensors[tile].shape.numel();
        if engine == CopyEngine::Tma {
            continue; // checked with the ring below
        }
        copies_plan.insert(match (copy, engine) {
            (Copy::Chunked { .. }, CopyEngine::Tma) => unreachable!(),
            (
                Copy::Chunked { chunk_elems, .. },
                CopyEngine::CpAsync | CopyEngine::CpAsyncWaited,
            ) => ("cp_async_chunks", n, *chunk_elems),
            (c @ Copy::Chunked { chunk_elems, .. }, CopyEngine::Threads) if c.converts() => {
                ("copy_chunks_cvt", n, *chunk_elems)
            }
            (Copy::Chunked { chunk_elems, .. }, CopyEngine::Threads) => {
                ("copy_chunks", n, *chunk_elems)
            }
            (Copy::Elementwise { .. }, _) => ("copy_elems", n, 1),
        });
    }
    let mut copies_code = BTreeSet::new();
    for (f, func) in [
        ("cp_async_chunks", mucc::emit::ir::Func::TbCpAsyncChunks),
        ("copy_chunks", mucc::emit::ir::Func::TbCopyChunks),
        ("copy_chunks_cvt", mucc::emit::ir::Func::TbCopyChunksCvt),
        ("copy_elems", mucc::emit::ir::Func::TbCopyElems),
    ] {
        for a in template_args_of(stmts, func) {
            let v = ints(&a, 0..2);
            want(v[0] == nt, format!("{f} with {} threads", v[0]));
            let chunk = if f == "copy_elems" {
                1
            } else {
                ints(&a, 2..3)[0]
            };
            copies_code.insert((f, v[1], chunk));
        }
    }
    want(
        copies_plan == copies_code,
        format!("copies: plan {copies_plan:?}, code {copies_code:?}"),
    );
    // The cp.async ring.
    let stages = kp.pipeline_stages();
    let engines: Vec<CopyEngine> = kp
        .ops
        .iter()
        .filter_map(|p| match p {
            OpPlan::Input { engine, .. } => Some(*engine),
            _ => None,
        })
        .collect();
    let (any_cp_async, any_tma) = (
        engines.contains(&CopyEngine::CpAsync),
        engines.contains(&CopyEngine::Tma),
    );
    want(
        any_tma != kp.tma.loads.is_empty(),
        "TMA engines are the plan's TMA loads".into(),
    );
    // Waited cp.async copies: waited for in the code exactly where the plan has them, and
    // never beside a cp.async ring (whose groups the wait would also wait for).
    let waited = engines.contains(&CopyEngine::CpAsyncWaited);
    want(
        mucc::emit::ir::calls(stmts, mucc::emit::ir::Func::CpAsyncWaitAll).is_empty() != waited,
        format!("cp.async waits: plan {waited}"),
    );
    want(
        !(waited && any_cp_async),
        "waited cp.async copies beside a cp.async ring".into(),
    );
    // TMA loads: their tensor-map parameters, the stage barriers, the bytes each stage announces
    // and one load per iteration and input.
    let tma_loads = mucc::emit::ir::calls(stmts, mucc::emit::ir::Func::TmaLoad);
    for (m, l, _) in kp.tma.maps() {
        use mucc::emit::ir::Expr;
        let map = Expr::var(format!("tm{m}")).addr();
        let loaded = tma_loads.iter().any(|a| {
            a.len() > 2
                && *a[1] == map
                && matches!(a[2], Expr::Add(b, _) if **b == Expr::var("full"))
        });
        want(
            sig.params
                .contains(&mucc::emit::ir::KernelParam::TensorMap(m))
                && loaded,
            format!("tensor map tm{m} of op{}", l.op),
        );
    }
    want(
        !sig.params
            .contains(&mucc::emit::ir::KernelParam::TensorMap(kp.tma.map_count())),
        format!("{} tensor maps", kp.tma.map_count()),
    );
    // The launch encodes the maps in parameter order with each copy's box, every box dim within
    // the engine's 256; a load's copies tile its box exactly, each slab starting on the
    // engine's alignment.
    let specs = &launch_of(e, &name).tensor_maps;
    let maps = kp.tma.maps();
    want(
        specs.len() == maps.len()
            && maps.iter().enumerate().all(|(i, (m, l, b))| {
                *m == i
                    && specs[i].boxes == *b
                    && specs[i].swizzle == l.swizzle
                    && b.iter()
                        .all(|&x| x as usize <= mucc::sched::tma::TMA_MAX_BOX)
            }),
        format!(
            "tensor maps {:?} for the plan's {:?}",
            specs.iter().map(|s| s.boxes.clone()).collect::<Vec<_>>(),
            maps.iter()
                .map(|(m, _, b)| (*m, b.clone()))
                .collect::<Vec<_>>()
        ),
    );
    for l in &kp.tma.loads {
        let elem = l.dtype.bytes();
        let covered: usize = l
            .copies
            .iter()
            .map(|c| l.copy_box(c).iter().map(|&x| x as usize).product::<usize>() * elem)
            .sum();
        let align = if l.swizzle == mucc::sched::tma::TmaSwizzle::None {
            mucc::sched::tma::TMA_SLAB_ALIGN
        } else {
            mucc::sched::tma::TMA_SLOT_ALIGN
        };
        let mut next = 0;
        let contiguous = l.copies.iter().all(|c| {
            let ok = (l.split.is_none() || c.offset == next)
                && (l.copy_elements(c) * elem).is_multiple_of(align);
            next = c.offset + c.extent;
            ok
        });
        want(
            covered == l.bytes && contiguous,
            format!(
                "op{}'s copies {:?} cover {covered} B of its {} B box, in order and aligned: {contiguous}",
                l.op, l.copies, l.bytes
            ),
        );
    }
    // Programmatic dependent launch: the wait and the trigger exactly as planned.
    want(
        mucc::emit::ir::calls(stmts, mucc::emit::ir::Func::GridDependencyWait).len()
            == usize::from(kp.dependent.is_programmatic()),
        format!("dependent launch {:?}", kp.dependent),
    );
    want(
        mucc::emit::ir::calls(stmts, mucc::emit::ir::Func::LaunchDependents).len()
            == usize::from(kp.triggers_next),
        format!("trigger of the next launch: {}", kp.triggers_next),
    );
    // The L2 prefetch: one call per box of an iteration (in a loop over the planned
    // iterations), all before the wait.
    {
        use mucc::emit::ir::{Func, Stmt, calls};
        let boxes: usize = kp.tma.loads.iter().map(|l| l.copies.len()).sum();
        let prefetches = calls(stmts, Func::TmaPrefetchL2).len();
        want(
            prefetches == kp.l2_prefetch.map_or(0, |_| boxes),
            format!(
                "{prefetches} L2 prefetch calls for {:?} of {boxes} boxes per iteration",
                kp.l2_prefetch
            ),
        );
        let at = |f: Func| {
            stmts
                .iter()
                .position(|s| !calls(std::slice::from_ref(s), f).is_empty())
        };
        if let Some(p) = kp.l2_prefetch {
            let at_prefetch = at(Func::TmaPrefetchL2);
            want(
                at_prefetch.is_some() && at_prefetch < at(Func::GridDependencyWait),
                "the L2 prefetch before griddepcontrol.wait".to_string(),
            );
            let bound = at_prefetch.and_then(|i| match &stmts[i] {
                Stmt::If(_, body) => body.iter().find_map(|s| match s {
                    Stmt::For { to, .. } => Some(to.clone()),
                    _ => None,
                }),
                _ => None,
            });
            want(
                bound == Some(mucc::emit::ir::Expr::size(p.iterations)),
                format!(
                    "the L2 prefetch loops over {} iterations: {bound:?}",
                    p.iterations
                ),
            );
        }
    }
    if any_tma {
        use mucc::emit::ir::{Expr, Func, calls};
        let ring = e
            .rings
            .iter()
            .find(|r| r.name == name)
            .map_or(&[][..], |r| &r.body[..]);
        let full0 = Expr::var("full").plus(Expr::int(0));
        let first = calls(ring, Func::MbarArriveExpectTx)
            .into_iter()
            .any(|a| a == [&full0, &Expr::size(kp.tma.bytes_per_stage())]);
        let waits = calls(stmts, Func::MbarWait)
            .into_iter()
            .any(|a| matches!(a[0], Expr::Add(b, _) if **b == Expr::var("full")));
        want(first && waits, "TMA ring barriers".into());
        check_tma_barriers(stmts, kp, &mut want);
    } else {
        want(
            mucc::emit::ir::calls(stmts, mucc::emit::ir::Func::TmaLoad).is_empty(),
            "no TMA load without a plan's".into(),
        );
    }
    if stages > 1 {
        use mucc::emit::ir::{Func, Stmt, TArg, template_args};
        let comment = Stmt::Comment(format!("software pipeline: {stages} stages"));
        let mut announced = false;
        mucc::emit::ir::visit(stmts, &mut |s| announced |= *s == comment);
        let waits = template_args(stmts, Func::CpAsyncWait);
        want(
            announced && waits.iter().any(|t| *t == [TArg::int(stages - 2)]) == any_cp_async,
            format!("pipeline of {stages} stages"),
        );
        for (h, op) in tb.ops.iter() {
            if let OpPlan::Input { engine, .. } = kp.ops[h.index()]
                && engine.pipelined()
            {
                let t = op.outputs[0].index();
                let slot = kp.tiles[t].as_ref().unwrap().phys_elems;
                use mucc::emit::ir::{Expr, Stmt};
                let rel = match kp.split.share() {
                    Some(_) => Expr::var("it").minus(Expr::var("it0")).paren(),
                    None => Expr::var("it"),
                };
                let at = Expr::var(format!("s{t}")).plus(
                    rel.modulo(Expr::size(stages))
                        .paren()
                        .times(Expr::size(slot)),
                );
                let body = stmts.iter().find_map(|s| match s {
                    Stmt::For { var, body, .. } if var == "it" => Some(&body[..]),
                    _ => None,
                });
                let found = body.and_then(|b| decl_of(b, &format!("s{t}_cur")));
                want(
                    found.is_some_and(|(_, e)| *e == at),
                    format!("slot s{t}_cur: {found:?}, the plan's {at}"),
                );
            }
        }
    } else {
        use mucc::emit::ir::{Func, functions};
        let cp_async = [
            Func::TbCpAsyncChunks,
            Func::CpAsyncCommit,
            Func::CpAsyncWait,
            Func::CpAsyncWaitAll,
        ];
        want(
            !functions(stmts).iter().any(|f| cp_async.contains(f)) || waited,
            "no cp.async without a ring or waited copies".into(),
        );
    }
    // Swizzles of the tiles in shared memory.
    let swz_plan: BTreeSet<String> = kp
        .smem
        .kinds
        .iter()
        .filter_map(
            |kind| match kp.tiles[kind.tile()].as_ref().unwrap().swizzle {
                Swizzle::Xor { b, m, s } => Some(format!("{b}, {m}, {s}")),
                _ => None,
            },
        )
        .collect();
    let swz_code: BTreeSet<String> = aliases(stmts)
        .into_iter()
        .filter_map(|t| match t {
            mucc::emit::ir::AliasType::Layout {
                swizzle: Some((b, m, s)),
                ..
            } => Some(format!("{b}, {m}, {s}")),
            _ => None,
        })
        .collect();
    want(
        swz_plan == swz_code,
        format!("swizzles: plan {swz_plan:?}, code {swz_code:?}"),
    );
    // Register accumulators.
    for (h, p) in kp.ops.iter().enumerate() {
        if let OpPlan::Accum {
            storage:
                AccumStorage::Registers {
                    per_thread,
                    fragment_of,
                },
            ..
        } = p
        {
            use mucc::emit::ir::{Nested, Stmt, visit};
            let name = format!("acc{h}");
            let mut found = false;
            visit(stmts, &mut |s| match s {
                Stmt::NestedDecl {
                    ty: Nested::Frag,
                    name: n,
                    ..
                } if fragment_of.is_some() => found |= *n == name,
                Stmt::Array { name: n, dims, .. } if fragment_of.is_none() => {
                    found |= *n == name && dims[..] == [*per_thread]
                }
                _ => {}
            });
            want(
                found,
                format!(
                    "register accumulator {name} ({per_thread} per thread, fragment {fragment_of:?})"
                ),
            );
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(format!("kernel op {k}: {}", errs.join("; ")))
    }
}

/// Checks the kernel-level operators against their plans: each kernel's runtime call, read
/// from its statements ([`mucc::emit::ir`]), takes the plan's element type, layouts and
/// numbers, and its launch the plan's grid and block.
pub fn check_kernel_level(g: &KernelGraph, p: &GraphPlan, e: &Emitted) -> Result<(), String> {
    use mucc::emit::ir::{Func, KernelParam, TArg, template_args};
    let names = |n: usize| (0..n).map(|i| TArg::Name(format!("L{i}")));
    let ints = |v: &[usize]| v.iter().map(|&x| TArg::int(x)).collect::<Vec<_>>();
    for (h, op) in g.ops.iter() {
        let k = h.index();
        let body = |name: &str| {
            e.bodies
                .iter()
                .find(|b| b.name == name)
                .map(|b| &b.body[..])
                .ok_or_else(|| format!("kernel op {k}: no kernel {name}"))
        };
        // The signature of kernel `name`: its launch's threads as launch bounds, no cluster,
        // `elem` the element type, and views v0 (written), v1, … as parameters.
        let signed = |name: &str, elem: Option<&TArg>| {
            let sig = e
                .bodies
                .iter()
                .find(|b| b.name == name)
                .and_then(|b| b.signature.as_ref());
            let l = launch_of(e, name);
            sig.is_some_and(|s| {
                s.bounds == (l.block[0] as usize, None)
                    && s.cluster.is_none()
                    && elem.is_none_or(|t| !matches!(t, TArg::Elem(_)) || *t == TArg::Elem(s.elem))
                    && s.params.iter().enumerate().all(|(i, p)| {
                        *p == KernelParam::View {
                            index: i,
                            written: i == 0,
                        }
                    })
                    && s.params.len() == l.args.len()
            })
        };
        let check = |name: String, f: Func, expect: Vec<TArg>, launch: (u32, u32)| {
            let calls = template_args(body(&name)?, f);
            let l = launch_of(e, &name);
            if calls.len() != 1
                || calls[0].len() < expect.len()
                || calls[0][..expect.len()] != expect[..]
                || (l.grid[0], l.block[0]) != launch
                || !signed(&name, expect.first())
            {
                Err(format!(
                    "kernel op {k} ({name}): {f:?} {calls:?} launch {:?}x{:?}, plan {expect:?} {launch:?}",
                    l.grid, l.block
                ))
            } else {
                Ok(())
            }
        };
        match &p.kernel_ops[k] {
            KnOpPlan::Elementwise {
                op: ew,
                dtype,
                vector,
                launch,
                ..
            } => {
                let (f, suffix) = match (ew, &op.kind) {
                    (ElementwiseOp::Unary(u), _) => (Func::KnUnary, u.name().to_string()),
                    (ElementwiseOp::Binary(b), _) => (Func::KnBinary, b.name().to_string()),
                    (ElementwiseOp::ShiftedExp, _) => (Func::KnBinary, "shifted_exp".into()),
                    (ElementwiseOp::Copy, KnOpKind::Output { .. }) => {
                        (Func::KnCopy, "output_copy".into())
                    }
                    (ElementwiseOp::Copy, _) => (Func::KnCopy, "allreduce".into()),
                };
                check(
                    format!("k{k}_{suffix}"),
                    f,
                    vec![TArg::Elem(*dtype), TArg::int(*vector)],
                    (launch.blocks, launch.threads),
                )?;
            }
            KnOpPlan::Reduction {
                of,
                dtype,
                to,
                k: len,
                inner,
                stride,
                warp_per_output,
                launch,
                ..
            } => {
                let (name, max) = match (&op.kind, of) {
                    (KnOpKind::Reduction { dim }, Reduce::Sum) => {
                        (format!("k{k}_reduction_{dim}"), None)
                    }
                    (KnOpKind::RowMax { .. }, Reduce::Max) => {
                        (format!("k{k}_row_max"), Some(TArg::Bool(true)))
                    }
                    _ => return Err(format!("kernel op {k}: reduction plan")),
                };
                let mut args: Vec<TArg> = std::iter::once(TArg::Elem(*dtype))
                    .chain(names(2))
                    .chain(ints(&[*to, *len, *inner, *stride]))
                    .collect();
                args.push(TArg::Bool(*warp_per_output));
                args.extend(max);
                check(name, Func::KnReduce, args, (launch.blocks, launch.threads))?;
            }
            KnOpPlan::RmsNorm {
                dtype,
                rows,
                group,
                launch,
                ..
            } => check(
                format!("k{k}_rms_norm"),
                Func::KnRmsNorm,
                std::iter::once(TArg::Elem(*dtype))
                    .chain(names(2))
                    .chain(ints(&[*rows, *group]))
                    .collect(),
                (launch.blocks, launch.threads),
            )?,
            KnOpPlan::SoftmaxCombine {
                dtype,
                rows,
                splits,
                d,
                vector,
                group,
                split_lanes,
                launch,
                form: mucc::sched::combine::CombineForm::Kernel(_),
                ..
            } => check(
                format!("k{k}_softmax_combine"),
                Func::KnSoftmaxCombine,
                std::iter::once(TArg::Elem(*dtype))
                    .chain(names(4))
                    .chain(ints(&[*rows, *splits, *d, *vector, *group, *split_lanes]))
                    .collect(),
                (launch.blocks, launch.threads),
            )?,
            KnOpPlan::SoftmaxCombine { .. } => {
                // Performed by the attention kernel (its clusters or last blocks): no kernel of
                // its own.
                if e.bodies
                    .iter()
                    .any(|b| b.name.contains(&format!("k{k}_softmax_combine")))
                {
                    return Err(format!(
                        "kernel op {k}: a combining kernel beside the attention kernel's combine"
                    ));
                }
            }
            KnOpPlan::Parts { parts, concat, .. } => {
                let name = format!("k{k}_{}", op.kind.name());
                let want_params: Vec<KernelParam> =
                    std::iter::once(KernelParam::Whole { written: *concat })
                        .chain((0..parts.len()).map(|index| KernelParam::Part {
                            index,
                            written: !*concat,
                        }))
                        .collect();
                let sig = e
                    .bodies
                    .iter()
                    .find(|b| b.name == name)
                    .and_then(|b| b.signature.as_ref());
                if sig.map(|s| &s.params) != Some(&want_params) {
                    return Err(format!(
                        "kernel op {k}: parameters {sig:?}, plan {want_params:?}"
                    ));
                }
                let calls = template_args(body(&name)?, Func::KnCopy);
                let v: Vec<Option<&TArg>> = calls.iter().map(|a| a.get(1)).collect();
                let want: Vec<TArg> = parts.iter().map(|c| TArg::int(c.vector)).collect();
                if v.len() != want.len() || v.iter().zip(&want).any(|(a, b)| *a != Some(b)) {
                    return Err(format!("kernel op {k}: part vectors {v:?}, plan {want:?}"));
                }
            }
            KnOpPlan::Gemm { calls, .. } => {
                let emitted: Vec<_> = e
                    .launch
                    .steps
                    .iter()
                    .filter_map(|s| match s {
                        Step::Gemm(c) => Some(c),
                        _ => None,
                    })
                    .collect();
                if !calls.iter().all(|c| emitted.contains(&c)) {
                    return Err(format!("kernel op {k}: cuBLAS calls differ from the plan"));
                }
            }
            &KnOpPlan::AllReduce {
                send,
                recv,
                count,
                dtype,
                ..
            } => {
                // One step in the launch plan and one call in the host entry, with the plan's
                // count and type on the caller's communicator.
                let want = Step::AllReduce(mucc::emit::launch::AllReduceCall {
                    send,
                    recv,
                    count,
                    dtype,
                });
                if !e.launch.steps.contains(&want) {
                    return Err(format!("kernel op {k}: no all-reduce step {want:?}"));
                }
                let call = format!(
                    ", {count}, {}, ncclSum, comm, stream));",
                    mucc::emit::cxx::nccl_data_type(dtype)
                );
                if !e.source.contains(&call) {
                    return Err(format!("kernel op {k}: no host call ending {call}"));
                }
            }
            KnOpPlan::Nothing | KnOpPlan::Customized => {}
        }
    }
    // Kernel-level kernels trigger the next launch, first thing, exactly where the plan says.
    for b in &e.bodies {
        let Some(k) = b
            .name
            .strip_prefix('k')
            .and_then(|r| r.split('_').next())
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        if b.name.ends_with("_customized") {
            continue;
        }
        let triggers = mucc::emit::ir::calls(&b.body, Func::LaunchDependents).len();
        let first = b.body.first().is_some_and(|s| {
            !mucc::emit::ir::calls(std::slice::from_ref(s), Func::LaunchDependents).is_empty()
        });
        let planned = p.kernel_level_triggers.contains(&k);
        if triggers != usize::from(planned) || (planned && !first) {
            return Err(format!(
                "kernel op {k} ({}): {triggers} triggers of the next launch (first: {first}), \
                 planned {planned}",
                b.name
            ));
        }
    }
    Ok(())
}

/// Each threadblock kernel's pipeline ring ([`Emitted::rings`], statements) against its plan,
/// by structure: without a ring, no statement; with S stages, the prologue's comment, S − 1
/// groups of copies before the loop and one in the refill (one copy per `cp.async` ring input,
/// one TMA load per planned load, each group's loads in the plan's order with their tensor
/// maps, every stage announcing the plan's bytes), one commit per group where `cp.async`
/// copies, the loop's wait for the stage (`cp_async_wait<S − 2>`, the mbarrier wait) by engine,
/// and the refill of iteration `it + S − 1` guarded by the end of the CTA's loop.
pub fn check_rings(p: &GraphPlan, e: &Emitted) -> Result<(), String> {
    use mucc::emit::ir::{Expr, Func, Init, Stmt, TArg, calls, template_args};
    if e.rings.len() != p.kernels.len() {
        return Err(format!(
            "{} rings for {} threadblock kernels",
            e.rings.len(),
            p.kernels.len()
        ));
    }
    for ((&k, kp), ring) in p.kernels.iter().zip(&e.rings) {
        let body = &ring.body[..];
        let mut errs = Vec::new();
        let mut want = |ok: bool, what: String| {
            if !ok {
                errs.push(what);
            }
        };
        let plan = kp.ring();
        // Every pipelined input is in the ring, at its depth; TMA's inputs are TMA's loads.
        for (i, o) in kp.ops.iter().enumerate() {
            if let OpPlan::Input { engine, stages, .. } = o
                && engine.pipelined()
            {
                want(
                    plan.as_ref()
                        .is_some_and(|r| r.holds(i) && r.stages == *stages),
                    format!("pipelined op{i} ({stages} stages) outside the ring {plan:?}"),
                );
            }
        }
        let tma_ops: Vec<usize> = kp.tma.loads.iter().map(|l| l.op).collect();
        want(
            plan.as_ref()
                .map_or(tma_ops.is_empty(), |r| r.tma == tma_ops),
            format!("TMA loads of {tma_ops:?}, the ring {plan:?}"),
        );
        let stages = plan.as_ref().map_or(1, |r| r.stages);
        let ring_inputs = plan.as_ref().map_or(0, |r| r.cp_async.len());
        let loads = kp.tma.loads.len();
        if plan.is_none() {
            want(
                body.is_empty(),
                format!("ring statements without a ring: {body:?}"),
            );
        } else {
            let comments = body
                .iter()
                .filter(|s| matches!(s, Stmt::Comment(c) if *c == format!("software pipeline: {stages} stages")))
                .count();
            want(comments == 1, format!("prologue comment ({comments})"));
            let copies = [Func::TbCpAsyncChunks, Func::TbCopyChunks, Func::TbCopyElems]
                .iter()
                .map(|&f| calls(body, f).len())
                .sum::<usize>();
            want(
                copies == stages * ring_inputs,
                format!("{copies} ring copies, plan {stages} x {ring_inputs}"),
            );
            let commits = calls(body, Func::CpAsyncCommit).len();
            let groups = if ring_inputs > 0 { stages } else { 0 };
            want(
                commits == groups,
                format!("{commits} commits, plan {groups}"),
            );
            let waits = template_args(body, Func::CpAsyncWait);
            let wait = [TArg::int(plan.as_ref().map_or(0, |r| r.pending_groups()))];
            want(
                if ring_inputs > 0 {
                    waits == [&wait[..]]
                } else {
                    waits.is_empty()
                },
                format!("cp.async waits {waits:?}, plan {stages} stages"),
            );
            let tma = calls(body, Func::TmaLoad);
            // Every stage issues each load's copies (slabs of a split box) in order.
            let copies: Vec<(&mucc::sched::tma::TmaLoad, &mucc::sched::tma::TmaCopy)> = kp
                .tma
                .loads
                .iter()
                .flat_map(|l| l.copies.iter().map(move |c| (l, c)))
                .collect();
            want(
                tma.len() == stages * copies.len(),
                format!(
                    "{} TMA copies, plan {stages} x {} ({loads} loads)",
                    tma.len(),
                    copies.len()
                ),
            );
            for (i, args) in tma.iter().enumerate() {
                let (l, c) = copies[i % copies.len().max(1)];
                let map = Expr::var(format!("tm{}", c.map)).addr();
                want(
                    args.get(1) == Some(&&map) && args.len() == 3 + l.coords.len(),
                    format!("TMA copy {i}: {args:?}, plan map tm{}", c.map),
                );
                if let Some(d) = l.split.filter(|_| c.offset > 0) {
                    let at = Expr::size(l.copy_elements(c));
                    let off = Expr::size(c.offset);
                    // The offset is the coordinate's last term (or all of it where neither
                    // the loop nor the grid walks the dim).
                    let ends_with = |e: Option<&&Expr>, t: &Expr| {
                        matches!(e, Some(Expr::Add(_, b)) if **b == *t) || e == Some(&t)
                    };
                    want(
                        ends_with(args.first(), &at) && ends_with(args.get(3 + d), &off),
                        format!(
                            "TMA copy {i}: {args:?}, slab at element {} (offset {} along box dim {d})",
                            l.copy_elements(c),
                            c.offset
                        ),
                    );
                }
            }
            let announced = calls(body, Func::MbarArriveExpectTx);
            let bytes = Expr::size(kp.tma.bytes_per_stage());
            want(
                announced.len() == if loads > 0 { stages } else { 0 }
                    && announced.iter().all(|a| a.get(1) == Some(&&bytes)),
                format!("stage announcements {announced:?}, plan {bytes}"),
            );
            want(
                calls(body, Func::MbarWait).len() == usize::from(loads > 0),
                "the mbarrier wait of the current stage".into(),
            );
            let refill = body.iter().any(|s| {
                let Stmt::Block(b) = s else { return false };
                let first = Expr::var("it")
                    .plus(Expr::size(plan.as_ref().map_or(0, |r| r.refill_distance())));
                matches!(b.first(), Some(Stmt::Decl { name, init: Init::Assign(e), .. }) if name == "pf" && *e == first)
                    && matches!(b.get(1), Some(Stmt::If(Expr::Lt(a, _), _)) if **a == Expr::var("pf"))
            });
            want(
                refill,
                format!("the refill of iteration it + {}", stages - 1),
            );
        }
        if !errs.is_empty() {
            return Err(format!(
                "kernel op {k} ({}): {}",
                ring.name,
                errs.join("; ")
            ));
        }
    }
    Ok(())
}

/// Plans and emits `g` for `target` and checks the code against the plan.
pub fn check_graph(g: &KernelGraph, target: Target, what: &str) -> Result<Emitted, String> {
    let opts = Options::for_target(target);
    let (p, e) = check_with(g, &opts, what)?;
    // Graphs with a combining step of split attention: also with it in the last blocks.
    let combines = p
        .kernel_ops
        .iter()
        .any(|k| matches!(k, mucc::sched::KnOpPlan::SoftmaxCombine { .. }));
    if combines {
        let last = Options {
            last_block_combine: true,
            ..opts.clone()
        };
        let what = format!("{what}, --last-block-combine on");
        check_with(g, &last, &what)?;
    }
    // Graphs with a kernel whose loop a split may take: also with grid splits of 2.
    let splittable = p.graph(g).ops.iter().any(|(_, op)| {
        matches!(&op.kind, mucc::graph::kernel::KnOpKind::Customized(tb)
            if tb.num_blocks() < target.typical_sms && tb.forloop_range >= 4)
    });
    if splittable {
        let grid = Options {
            grid_split: mucc::sched::GridSplitChoice::Ctas(2),
            ..opts
        };
        let what = format!("{what}, --grid-split 2");
        check_with(g, &grid, &what)?;
    }
    Ok(e)
}

/// [`check_graph`] under `opts` (without its re-checks under other options): the code.
pub fn check_graph_with(g: &KernelGraph, opts: &Options, what: &str) -> Result<Emitted, String> {
    check_with(g, opts, what).map(|(_, e)| e)
}

/// [`check_graph`] under `opts`: the plan and the emitted code.
fn check_with(g: &KernelGraph, opts: &Options, what: &str) -> Result<(GraphPlan, Emitted), String> {
    let target = opts.target;
    let p = plan(g, opts).map_err(|e| format!("{what}: {e}"))?;
    let e = mucc::emit::emit(g, &p, what).map_err(|e| format!("{what}: {e}"))?;
    // The plan's indices refer to the graph it was made for (rewritten or not).
    let g = p.graph(g);
    if let Some(l) = e.source.lines().find(|l| l.len() > MAX_LINE) {
        return Err(format!("{what}: a line of {} characters: {l}", l.len()));
    }
    for (&k, kp) in &p.kernels {
        check_kernel(g, &e, k, kp).map_err(|m| format!("{what} ({}): {m}", target.arch))?;
    }
    check_kernel_level(g, &p, &e).map_err(|m| format!("{what} ({}): {m}", target.arch))?;
    check_rings(&p, &e).map_err(|m| format!("{what} ({}): {m}", target.arch))?;
    check_host(&e).map_err(|m| format!("{what} ({}): {m}", target.arch))?;
    // The file includes the base runtime and exactly the headers the plan lists, in its order.
    let includes: Vec<&str> = e
        .source
        .lines()
        .filter_map(|l| l.strip_prefix("#include \""))
        .filter_map(|l| l.strip_suffix('"'))
        .collect();
    let want: Vec<&str> = std::iter::once("mucc/runtime.h")
        .chain(
            p.runtime_headers()
                .into_iter()
                .map(mucc::emit::cxx::runtime_header),
        )
        .collect();
    if includes != want {
        return Err(format!(
            "{what} ({}): includes {includes:?}, the plan {want:?}",
            target.arch
        ));
    }
    Ok((p, e))
}

/// The host entry's statements ([`mucc::emit::ir`]) against the launch plan, by structure:
/// one host step per plan step (after the rank query where a kernel all-reduces); every
/// kernel step launches its kernel once, programmatically where the plan says so, with the
/// plan's grid, block and shared memory, one argument per binding, the shared-memory opt-in
/// where the kernel needs it and one tensor map per spec (its type and swizzle); every cuBLAS
/// step calls the strided batched GEMM once with the plan's operations and sizes; every
/// all-reduce step calls NCCL once with the plan's count and type.
pub fn check_host(e: &Emitted) -> Result<(), String> {
    use mucc::emit::ir::{Expr, Func, Init, IntType, Stmt, Sym, calls};
    let plan = &e.launch;
    let skip = usize::from(plan.uses_exchange());
    if e.host.len() != plan.steps.len() + skip {
        return Err(format!(
            "{} host steps for {} plan steps",
            e.host.len(),
            plan.steps.len()
        ));
    }
    if skip == 1 && calls(&e.host[0].body, Func::NcclCommUserRank).len() != 1 {
        return Err("the rank query does not ask NCCL for the rank".into());
    }
    let int = |v: i128| Expr::Int(v, IntType::Int);
    let dim3 = |d: [u32; 3]| Expr::Call(Func::Dim3, d.iter().map(|&x| int(x.into())).collect());
    for (n, (step, host)) in plan.steps.iter().zip(&e.host[skip..]).enumerate() {
        let body = &host.body;
        let one = |f: Func| -> Result<Vec<&Expr>, String> {
            let c = calls(body, f);
            match c.len() {
                1 => Ok(c.into_iter().next().unwrap()),
                k => Err(format!("step {n}: {k} calls of {f:?}")),
            }
        };
        match step {
            Step::Kernel(k) => {
                let (f, other) = if k.programmatic {
                    (Func::LaunchProgrammatic, Func::Launch)
                } else {
                    (Func::Launch, Func::LaunchProgrammatic)
                };
                if !calls(body, other).is_empty() {
                    return Err(format!("step {n} ({}): launched with {other:?}", k.name));
                }
                let a = one(f)?;
                let want = [dim3(k.grid), dim3(k.block), int(k.dynamic_smem as i128)];
                if a.len() != 6 + usize::from(!k.tensor_maps.is_empty())
                    || a[1..4].iter().copied().ne(want.iter())
                {
                    return Err(format!("step {n} ({}): launch arguments {a:?}", k.name));
                }
                let args = body.iter().find_map(|s| match s {
                    Stmt::Decl {
                        name,
                        init: Init::Array(v),
                        ..
                    } if name == "args" => Some(v.len()),
                    _ => None,
                });
                if args != Some(k.args.len()) {
                    return Err(format!(
                        "step {n} ({}): {args:?} arguments for {} bindings",
                        k.name,
                        k.args.len()
                    ));
                }
                let opt_in = calls(body, Func::MaxDynamicSmem).len();
                if opt_in != usize::from(k.needs_smem_opt_in()) {
                    return Err(format!(
                        "step {n} ({}): {opt_in} shared-memory opt-ins",
                        k.name
                    ));
                }
                let maps = calls(body, Func::TensorMap);
                if maps.len() != k.tensor_maps.len() {
                    return Err(format!(
                        "step {n} ({}): {} tensor maps encoded for {}",
                        k.name,
                        maps.len(),
                        k.tensor_maps.len()
                    ));
                }
                for (m, spec) in maps.iter().zip(&k.tensor_maps) {
                    if *m[1] != Expr::Sym(Sym::TensorMapDataType(spec.data_type))
                        || *m[6] != Expr::Sym(Sym::TensorMapSwizzle(spec.swizzle))
                    {
                        return Err(format!("step {n} ({}): tensor map {m:?}", k.name));
                    }
                }
            }
            Step::Gemm(c) => {
                let a = one(Func::CublasGemmStridedBatched)?;
                let want = [
                    Expr::Sym(Sym::CublasOp(c.trans_a)),
                    Expr::Sym(Sym::CublasOp(c.trans_b)),
                    int(c.m.into()),
                    int(c.n.into()),
                    int(c.k.into()),
                ];
                if a.len() != 23
                    || a[1..6].iter().copied().ne(want.iter())
                    || *a[20] != int(c.batch.into())
                {
                    return Err(format!("step {n}: cuBLAS arguments {a:?}"));
                }
            }
            Step::AllReduce(c) => {
                let a = one(Func::NcclAllReduce)?;
                if *a[2] != int(c.count as i128) || *a[3] != Expr::Sym(Sym::NcclDataType(c.dtype)) {
                    return Err(format!("step {n}: NCCL arguments {a:?}"));
                }
            }
        }
    }
    Ok(())
}

/// The functions `stmts` call outside lambdas (the runtime's thread loops and the named
/// lambdas of row passes), nested in blocks, loops and conditionals.
fn functions_outside_lambdas(stmts: &[mucc::emit::ir::Stmt]) -> Vec<mucc::emit::ir::Func> {
    use mucc::emit::ir::Stmt;
    let mut out = Vec::new();
    for s in stmts {
        let found = match s.unnoted() {
            Stmt::CallWith { .. } | Stmt::LambdaDecl { .. } => Vec::new(),
            Stmt::Block(b) | Stmt::If(_, b) | Stmt::For { body: b, .. } => {
                functions_outside_lambdas(b)
            }
            other => mucc::emit::ir::functions(std::slice::from_ref(other)),
        };
        for f in found {
            if !out.contains(&f) {
                out.push(f);
            }
        }
    }
    out
}

/// The ring's prologue where the plan issues it ([`RingStart`]): ahead of every barrier of the
/// kernel (so ahead of the pre-loop steps, which end with one) or after the last one before the
/// loop; and a prologue ahead of the pre-loop steps reuses no memory of a tile that dies before
/// the loop.
fn check_ring_start(
    tb: &mucc::graph::threadblock::TbGraph,
    stmts: &[mucc::emit::ir::Stmt],
    kp: &KernelPlan,
    want: &mut impl FnMut(bool, String),
) {
    use mucc::emit::ir::Stmt;
    use mucc::sched::plan::RingStart;
    let at = |f: &dyn Fn(&Stmt) -> bool| stmts.iter().position(f);
    let prologue = at(&|s| matches!(s, Stmt::Comment(c) if c.starts_with("software pipeline")));
    let the_loop = at(&|s| matches!(s, Stmt::For { var, .. } if var == "it"));
    let barriers: Vec<usize> = (0..stmts.len())
        .filter(|&i| matches!(stmts[i], Stmt::Barrier { .. }))
        .collect();
    let ok = match (kp.ring_start, prologue, the_loop) {
        (RingStart::NoRing, None, _) => true,
        (RingStart::BeforePreLoop, Some(p), Some(l)) => {
            barriers.first().is_some_and(|&b| p < b && b < l)
        }
        (
            RingStart::AtLoop | RingStart::AfterPreLoop { .. } | RingStart::CpAsyncOnly,
            Some(p),
            Some(l),
        ) => !barriers.iter().any(|&b| p < b && b < l),
        _ => false,
    };
    want(
        ok,
        format!(
            "ring prologue {:?}: at statement {prologue:?}, loop at {the_loop:?}, barriers at {barriers:?}",
            kp.ring_start
        ),
    );
    if kp.ring_start == RingStart::BeforePreLoop {
        let smem = &kp.smem;
        let slots = kp.ring_slots(tb);
        for &b in &slots {
            let at = smem.bytes(b);
            let reused = (0..smem.buffers.len()).find(|&c| {
                let other = smem.bytes(c);
                !slots.contains(&c)
                    && smem.buffers[c].end <= smem.buffers[b].start
                    && other.start < at.end
                    && at.start < other.end
            });
            want(
                reused.is_none(),
                format!("ring slots issued early over buffer {reused:?}, dead before the loop"),
            );
        }
    }
}
