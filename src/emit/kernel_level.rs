//! Kernel-level operators: each plan ([`KnOpPlan`]) becomes a call of a runtime-header kernel
//! (`mucc::kn::*`) over the plan's views, or cuBLAS steps.

use super::KernelView;
use super::cxx::{self, Writer, ctype};
use super::ir::{self, Expr, Func, KernelBody, KernelParam, Signature, Stmt, TArg};
use super::launch::{AllReduceCall, KernelLaunch, Step};
use crate::graph::arena::Handle;
use crate::graph::dtype::DType;
use crate::graph::kernel::{KernelGraph, KnOp, KnOpKind};
use crate::graph::mirage_json::names;
use crate::sched::kernel_level::{ElementwiseOp, GridStride, KnOpPlan, PartCopy, Reduce, View};
use crate::sched::plan::Symbols;

fn layout(v: &View) -> String {
    cxx::layout(&v.dims, &v.strides, None)
}

/// `kernel op N: name(%a, %b) -> %c shape dtype`.
fn describe(g: &KernelGraph, h: Handle<KnOp>, op: &KnOp) -> String {
    let ins: Vec<String> = op
        .inputs
        .iter()
        .map(|t| format!("%{}", t.index()))
        .collect();
    let outs: Vec<String> = op
        .outputs
        .iter()
        .map(|&t| {
            format!(
                "%{} {} {}",
                t.index(),
                g.tensors[t].shape,
                g.tensors[t].dtype
            )
        })
        .collect();
    format!(
        "kernel op {}: {}({}) -> {}",
        h.index(),
        names::kn_name(&op.kind),
        ins.join(", "),
        outs.join(", ")
    )
}

/// The layout aliases of a kernel's views, in `namespace NAME_l`, each `using ALIAS = …;`.
fn aliases(w: &mut Writer, name: &str, views: &[(String, &View)]) {
    w.block(format!("namespace {name}_l"), "", |w| {
        for (alias, v) in views {
            w.line(format!("using {alias} ="));
            w.indented(|w| w.line(format!("{};", layout(v))));
        }
    });
}

/// The launch of a grid-stride kernel over `args`.
fn launch(name: &str, l: GridStride, args: Vec<crate::sched::plan::Binding>) -> Step {
    Step::Kernel(KernelLaunch {
        name: name.to_string(),
        grid: [l.blocks, 1, 1],
        block: [l.threads, 1, 1],
        dynamic_smem: 0,
        args,
        tensor_maps: Vec::new(),
        programmatic: false,
    })
}

/// The signature of a kernel-level kernel of `threads` threads over `params` in `dtype`.
fn signature(threads: u32, dtype: DType, params: Vec<KernelParam>) -> Signature {
    Signature {
        bounds: (threads as usize, None),
        cluster: None,
        elem: dtype,
        params,
    }
}

/// Typed pointer parameters `v0` (written) and `v1…` (read).
fn view_params(n: usize) -> Vec<KernelParam> {
    (0..n)
        .map(|index| KernelParam::View {
            index,
            written: index == 0,
        })
        .collect()
}

/// The functor of an element-wise kernel (`NAME_op`), if it needs one.
fn functor(w: &mut Writer, name: &str, op: ElementwiseOp, dtype: DType) {
    let c = format!("mucc::Compute<{}>", ctype(dtype));
    let (params, expr) = match op {
        ElementwiseOp::Unary(u) => (format!("{c} x"), cxx::unary(&u, "x", &c)),
        ElementwiseOp::Binary(b) => (format!("{c} a, {c} b"), cxx::binary(b, "a", "b")),
        ElementwiseOp::ShiftedExp => (
            format!("{c} a, {c} b"),
            cxx::unary(
                &crate::graph::ops::UnaryOp::Exp,
                &cxx::binary(crate::graph::ops::BinaryOp::Sub, "a", "b"),
                &c,
            ),
        ),
        ElementwiseOp::Copy => return,
    };
    w.block(format!("struct {name}_op"), ";", |w| {
        w.block(
            format!("__device__ {c} operator()({params}) const"),
            "",
            |w| {
                w.line(format!("return {expr};"));
            },
        );
    });
}

/// The fields of a [`KnOpPlan::Elementwise`].
struct Elementwise<'a> {
    op: &'a ElementwiseOp,
    out: &'a View,
    ins: &'a [View],
    splat: &'a [bool],
    dtype: &'a DType,
    vector: &'a usize,
    launch: &'a GridStride,
}

/// An element-wise kernel: `kn::unary`, `kn::binary` or `kn::copy` over the views.
fn elementwise(name: &str, comment: String, e: Elementwise<'_>) -> (KernelView, KernelBody, Step) {
    let Elementwise {
        op,
        out,
        ins,
        splat,
        dtype,
        vector,
        launch: l,
    } = e;
    let views: Vec<&View> = std::iter::once(out).chain(ins).collect();
    let mut pre = view_aliases(name, &views);
    functor(&mut pre, name, *op, *dtype);
    let functor_name = format!("{name}_op");
    let layouts = |n: usize| (0..n).map(|i| TArg::Name(format!("L{i}")));
    let vars = |n: usize| (0..n).map(|i| Expr::var(format!("v{i}")));
    let mut targs = vec![TArg::Elem(*dtype), TArg::int(*vector)];
    let (f, mut args) = match op {
        ElementwiseOp::Unary(_) => {
            targs.extend(layouts(2));
            (Func::KnUnary, vars(2).collect::<Vec<_>>())
        }
        ElementwiseOp::Binary(_) | ElementwiseOp::ShiftedExp => {
            targs.extend(layouts(3));
            if splat.iter().any(|&s| s) {
                targs.push(TArg::Name(functor_name.clone()));
                targs.extend(splat.iter().map(|&s| TArg::Bool(s)));
            }
            (Func::KnBinary, vars(3).collect())
        }
        ElementwiseOp::Copy => {
            targs.extend(layouts(2));
            (Func::KnCopy, vars(2).collect())
        }
    };
    if *op != ElementwiseOp::Copy {
        args.push(Expr::Object(functor_name));
    }
    let stmts = vec![
        Stmt::UsingNamespace(format!("{name}_l")),
        Stmt::Eval(Expr::TemplateCall(f, targs, args)),
    ];
    let params = (l.threads, *dtype, view_params(views.len()));
    let (view, body) = kernel(name, &comment, pre, stmts, params);
    (
        view,
        body,
        launch(name, *l, views.iter().map(|v| v.at).collect()),
    )
}

/// The kernel `name` of `threads` threads in `dtype` over `params`: its view (the comment,
/// the declarations `pre` before it, the signature and `stmts` printed) and its statements.
fn kernel(
    name: &str,
    comment: &str,
    pre: Writer,
    stmts: Vec<Stmt>,
    (threads, dtype, params): (u32, DType, Vec<KernelParam>),
) -> (KernelView, KernelBody) {
    let mut body = Writer::at(1);
    ir::print(&mut body, &stmts);
    let sig = signature(threads, dtype, params);
    let view = KernelView::new(comment, pre.finish(), name, &sig, body.finish());
    let body = KernelBody {
        name: name.to_string(),
        signature: Some(sig),
        body: stmts,
    };
    (view, body)
}

/// The declarations before a kernel over `views`: their layouts `L0, L1, …` in namespace
/// `<name>_l`.
fn view_aliases(name: &str, views: &[&View]) -> Writer {
    let named: Vec<(String, &View)> = views
        .iter()
        .enumerate()
        .map(|(i, v)| (format!("L{i}"), *v))
        .collect();
    let mut pre = Writer::new();
    aliases(&mut pre, name, &named);
    pre
}

/// A concat (parts → whole) or split/chunk (whole → parts) kernel: one copy per part.
fn parts(
    name: &str,
    comment: String,
    concat: bool,
    whole: &View,
    parts: &[PartCopy],
    dtype: DType,
    l: GridStride,
) -> (KernelView, KernelBody, Step) {
    let mut named = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        named.push((format!("Part{i}"), &p.part));
        named.push((format!("Whole{i}"), &p.whole));
    }
    let mut pre = Writer::new();
    aliases(&mut pre, name, &named);
    let mut params = vec![KernelParam::Whole { written: concat }];
    let mut stmts = vec![Stmt::UsingNamespace(format!("{name}_l"))];
    let mut args = vec![whole.at];
    for (i, p) in parts.iter().enumerate() {
        let at_whole = Expr::var("whole").plus(Expr::size(p.whole_offset));
        let part = Expr::var(format!("p{i}"));
        let (whole_l, part_l) = (format!("Whole{i}"), format!("Part{i}"));
        let (targs, call_args) = if concat {
            params.push(KernelParam::Part {
                index: i,
                written: false,
            });
            ([whole_l, part_l], vec![at_whole, part])
        } else {
            params.push(KernelParam::Part {
                index: i,
                written: true,
            });
            ([part_l, whole_l], vec![part, at_whole])
        };
        let mut targs: Vec<TArg> = targs.into_iter().map(TArg::Name).collect();
        targs.splice(0..0, [TArg::Elem(dtype), TArg::int(p.vector)]);
        stmts.push(Stmt::Eval(Expr::TemplateCall(
            Func::KnCopy,
            targs,
            call_args,
        )));
        args.push(p.part.at);
    }
    let (view, body) = kernel(name, &comment, pre, stmts, (l.threads, dtype, params));
    (view, body, launch(name, l, args))
}

/// A kernel over `views` (the first written, the others read) whose body is one runtime call
/// on `v0, v1, …` with layouts `L0, L1, …`.
fn views_kernel(
    name: &str,
    comment: String,
    views: &[&View],
    dtype: DType,
    l: GridStride,
    call: (Func, Vec<TArg>),
) -> (KernelView, KernelBody, Step) {
    let pre = view_aliases(name, views);
    let (f, mut targs) = call;
    // The element type, then the views' layouts, then the call's own arguments.
    let layouts = (0..views.len()).map(|i| TArg::Name(format!("L{i}")));
    targs.splice(0..0, std::iter::once(TArg::Elem(dtype)).chain(layouts));
    let args = (0..views.len())
        .map(|i| Expr::var(format!("v{i}")))
        .collect();
    let stmts = vec![
        Stmt::UsingNamespace(format!("{name}_l")),
        Stmt::Eval(Expr::TemplateCall(f, targs, args)),
    ];
    let params = (l.threads, dtype, view_params(views.len()));
    let (view, body) = kernel(name, &comment, pre, stmts, params);
    (
        view,
        body,
        launch(name, l, views.iter().map(|v| v.at).collect()),
    )
}

/// The kernel (if any) and steps of kernel-level operator `h`; with `triggers`, the kernel lets
/// the next launch start first thing (`GraphPlan::kernel_level_triggers`).
pub(super) fn emit(
    g: &KernelGraph,
    h: Handle<KnOp>,
    op: &KnOp,
    plan: &KnOpPlan,
    symbols: &Symbols,
    triggers: bool,
) -> (Option<(KernelView, KernelBody)>, Vec<Step>) {
    let comment = describe(g, h, op);
    let k = h.index();
    let (view, body, step) = match plan {
        KnOpPlan::Nothing | KnOpPlan::Customized => return (None, Vec::new()),
        // The kernel writing the input performs it.
        KnOpPlan::AllReduce {
            fused: crate::sched::exchange::AllReduceForm::Fused { .. },
            ..
        } => return (None, Vec::new()),
        // The attention kernel performs it (in its clusters or its last blocks).
        KnOpPlan::SoftmaxCombine { form, .. } if form.folded_into().is_some() => {
            return (None, Vec::new());
        }
        KnOpPlan::Gemm { calls, .. } => {
            return (None, calls.iter().cloned().map(Step::Gemm).collect());
        }
        &KnOpPlan::AllReduce {
            send,
            recv,
            count,
            dtype,
            ..
        } => {
            let call = AllReduceCall {
                send,
                recv,
                count,
                dtype,
            };
            return (None, vec![Step::AllReduce(call)]);
        }
        KnOpPlan::Elementwise {
            op: ew,
            out,
            ins,
            splat,
            dtype,
            vector,
            launch: l,
        } => {
            let suffix = match (ew, &op.kind) {
                (ElementwiseOp::Unary(u), _) => u.name(),
                (ElementwiseOp::Binary(b), _) => b.name(),
                (ElementwiseOp::ShiftedExp, _) => "shifted_exp",
                (ElementwiseOp::Copy, KnOpKind::Output { .. }) => "output_copy",
                (ElementwiseOp::Copy, _) => "allreduce",
            };
            let fields = Elementwise {
                op: ew,
                out,
                ins,
                splat,
                dtype,
                vector,
                launch: l,
            };
            elementwise(&symbols.kernel(&format!("k{k}_{suffix}")), comment, fields)
        }
        KnOpPlan::Reduction {
            of,
            out,
            x,
            dtype,
            to,
            k: len,
            inner,
            stride,
            warp_per_output,
            launch: l,
        } => {
            let (name, max) = match (of, &op.kind) {
                (Reduce::Sum, KnOpKind::Reduction { dim }) => {
                    (format!("k{k}_reduction_{dim}"), false)
                }
                (Reduce::Sum, _) => (format!("k{k}_reduction_0"), false),
                (Reduce::Max, _) => (format!("k{k}_row_max"), true),
            };
            let name = symbols.kernel(&name);
            let mut targs = vec![
                TArg::int(*to),
                TArg::int(*len),
                TArg::int(*inner),
                TArg::int(*stride),
                TArg::Bool(*warp_per_output),
            ];
            targs.extend(max.then_some(TArg::Bool(true)));
            let call = (Func::KnReduce, targs);
            views_kernel(&name, comment, &[out, x], *dtype, *l, call)
        }
        KnOpPlan::RmsNorm {
            out,
            x,
            dtype,
            rows,
            group,
            launch: l,
        } => {
            let name = symbols.kernel(&format!("k{k}_rms_norm"));
            let call = (Func::KnRmsNorm, vec![TArg::int(*rows), TArg::int(*group)]);
            views_kernel(&name, comment, &[out, x], *dtype, *l, call)
        }
        KnOpPlan::SoftmaxCombine {
            out,
            o,
            l,
            m,
            dtype,
            rows,
            splits,
            d,
            vector,
            group,
            split_lanes,
            launch,
            // A kernel of its own: the folded forms returned above.
            form: _,
        } => {
            let name = symbols.kernel(&format!("k{k}_softmax_combine"));
            let call = (
                Func::KnSoftmaxCombine,
                [*rows, *splits, *d, *vector, *group, *split_lanes]
                    .into_iter()
                    .map(TArg::int)
                    .collect(),
            );
            views_kernel(&name, comment, &[out, o, l, m], *dtype, *launch, call)
        }
        KnOpPlan::Parts {
            concat,
            whole,
            parts: ps,
            dtype,
            launch: l,
        } => {
            let name = symbols.kernel(&format!("k{k}_{}", op.kind.name()));
            parts(&name, comment, *concat, whole, ps, *dtype, *l)
        }
    };
    let (mut view, mut body) = (view, body);
    if triggers {
        // The next kernel (a programmatic launch) waits for this one's completion itself.
        body.body.insert(
            0,
            Stmt::Eval(Expr::Call(Func::LaunchDependents, vec![]))
                .noted("the next kernel may launch: it waits for this one"),
        );
        let mut text = Writer::at(1);
        ir::print(&mut text, &body.body);
        view.body = text.finish();
    }
    (Some((view, body)), vec![step])
}
