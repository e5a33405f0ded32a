//! Kernel-level operators: each plan ([`KnOpPlan`]) becomes a call of a runtime-header kernel
//! (`mucc::kn::*`) over the plan's views, or cuBLAS steps.

use super::KernelView;
use super::cxx::{self, Writer, ctype};
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

/// Typed pointer parameters `v0` (written) and `v1…` (read).
fn view_params(t: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            if i == 0 {
                format!("{t}* __restrict__ v0")
            } else {
                format!("const {t}* __restrict__ v{i}")
            }
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

/// An element-wise kernel: `kn::unary`, `kn::binary` or `kn::copy` over the views.
fn elementwise(name: &str, comment: String, plan: &KnOpPlan) -> (KernelView, Step) {
    let KnOpPlan::Elementwise {
        op,
        out,
        ins,
        splat,
        dtype,
        vector,
        launch: l,
    } = plan
    else {
        unreachable!("called with an element-wise plan")
    };
    let t = ctype(*dtype);
    let views: Vec<&View> = std::iter::once(out).chain(ins).collect();
    let named: Vec<(String, &View)> = views
        .iter()
        .enumerate()
        .map(|(i, v)| (format!("L{i}"), *v))
        .collect();
    let mut pre = Writer::new();
    aliases(&mut pre, name, &named);
    functor(&mut pre, name, *op, *dtype);
    let splats = if splat.iter().any(|&s| s) {
        let flags: Vec<&str> = splat
            .iter()
            .map(|&s| if s { "true" } else { "false" })
            .collect();
        format!(", {name}_op, {}", flags.join(", "))
    } else {
        String::new()
    };
    let (f, args, tail) = match op {
        ElementwiseOp::Unary(_) => (
            "unary",
            "L0, L1".to_string(),
            format!("v0, v1, {name}_op{{}}"),
        ),
        ElementwiseOp::Binary(_) | ElementwiseOp::ShiftedExp => (
            "binary",
            format!("L0, L1, L2{splats}"),
            format!("v0, v1, v2, {name}_op{{}}"),
        ),
        ElementwiseOp::Copy => ("copy", "L0, L1".to_string(), "v0, v1".to_string()),
    };
    let mut body = Writer::at(1);
    body.line(format!("using namespace {name}_l;"));
    body.line(format!("mucc::kn::{f}<{t}, {vector}, {args}>({tail});"));
    let params = view_params(t, views.len());
    let threads = l.threads.to_string();
    let view = KernelView::new(
        &comment,
        pre.finish(),
        &threads,
        name,
        &params,
        body.finish(),
    );
    let step = launch(name, *l, views.iter().map(|v| v.at).collect());
    (view, step)
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
) -> (KernelView, Step) {
    let t = ctype(dtype);
    let mut named = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        named.push((format!("Part{i}"), &p.part));
        named.push((format!("Whole{i}"), &p.whole));
    }
    let mut pre = Writer::new();
    aliases(&mut pre, name, &named);
    let mut params = vec![if concat {
        format!("{t}* __restrict__ whole")
    } else {
        format!("const {t}* __restrict__ whole")
    }];
    let mut body = Writer::at(1);
    body.line(format!("using namespace {name}_l;"));
    let mut args = vec![whole.at];
    for (i, p) in parts.iter().enumerate() {
        let woff = p.whole.at.elem_offset() - whole.at.elem_offset();
        let v = p.vector;
        if concat {
            params.push(format!("const {t}* __restrict__ p{i}"));
            body.line(format!(
                "mucc::kn::copy<{t}, {v}, Whole{i}, Part{i}>(whole + {woff}, p{i});"
            ));
        } else {
            params.push(format!("{t}* __restrict__ p{i}"));
            body.line(format!(
                "mucc::kn::copy<{t}, {v}, Part{i}, Whole{i}>(p{i}, whole + {woff});"
            ));
        }
        args.push(p.part.at);
    }
    let threads = l.threads.to_string();
    let view = KernelView::new(
        &comment,
        pre.finish(),
        &threads,
        name,
        &params,
        body.finish(),
    );
    (view, launch(name, l, args))
}

/// A kernel over `views` (the first written, the others read) whose body is one runtime call
/// on `v0, v1, …` with layouts `L0, L1, …`.
fn views_kernel(
    name: &str,
    comment: String,
    views: &[&View],
    dtype: DType,
    l: GridStride,
    call: String,
) -> (KernelView, Step) {
    let named: Vec<(String, &View)> = views
        .iter()
        .enumerate()
        .map(|(i, v)| (format!("L{i}"), *v))
        .collect();
    let mut pre = Writer::new();
    aliases(&mut pre, name, &named);
    let mut body = Writer::at(1);
    body.line(format!("using namespace {name}_l;"));
    body.line(call);
    let params = view_params(ctype(dtype), views.len());
    let threads = l.threads.to_string();
    let view = KernelView::new(
        &comment,
        pre.finish(),
        &threads,
        name,
        &params,
        body.finish(),
    );
    (view, launch(name, l, views.iter().map(|v| v.at).collect()))
}

/// The kernel (if any) and steps of kernel-level operator `h`.
pub(super) fn emit(
    g: &KernelGraph,
    h: Handle<KnOp>,
    op: &KnOp,
    plan: &KnOpPlan,
    symbols: &Symbols,
) -> (Option<KernelView>, Vec<Step>) {
    let comment = describe(g, h, op);
    let k = h.index();
    let (view, step) = match plan {
        KnOpPlan::Nothing | KnOpPlan::Customized => return (None, Vec::new()),
        // The kernel writing the input performs it.
        KnOpPlan::AllReduce {
            fused: crate::sched::exchange::AllReduceForm::Fused { .. },
            ..
        } => return (None, Vec::new()),
        // The attention kernel's clusters perform it.
        KnOpPlan::SoftmaxCombine {
            form: crate::sched::combine::CombineForm::InCluster { .. },
            ..
        } => return (None, Vec::new()),
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
        KnOpPlan::Elementwise { op: ew, .. } => {
            let suffix = match (ew, &op.kind) {
                (ElementwiseOp::Unary(u), _) => u.name(),
                (ElementwiseOp::Binary(b), _) => b.name(),
                (ElementwiseOp::ShiftedExp, _) => "shifted_exp",
                (ElementwiseOp::Copy, KnOpKind::Output { .. }) => "output_copy",
                (ElementwiseOp::Copy, _) => "allreduce",
            };
            elementwise(&symbols.kernel(&format!("k{k}_{suffix}")), comment, plan)
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
                (Reduce::Sum, KnOpKind::Reduction { dim }) => (format!("k{k}_reduction_{dim}"), ""),
                (Reduce::Sum, _) => (format!("k{k}_reduction_0"), ""),
                (Reduce::Max, _) => (format!("k{k}_row_max"), ", true"),
            };
            let name = symbols.kernel(&name);
            let t = ctype(*dtype);
            let call = format!(
                "mucc::kn::reduce<{t}, L0, L1, {to}, {len}, {inner}, {stride}, {warp_per_output}{max}>(v0, v1);"
            );
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
            let t = ctype(*dtype);
            let call = format!("mucc::kn::rms_norm<{t}, L0, L1, {rows}, {group}>(v0, v1);");
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
            form: crate::sched::combine::CombineForm::Kernel(_),
        } => {
            let name = symbols.kernel(&format!("k{k}_softmax_combine"));
            let t = ctype(*dtype);
            let call = format!(
                "mucc::kn::softmax_combine<{t}, L0, L1, L2, L3, {rows}, {splits}, {d}, {vector}, \
                 {group}, {split_lanes}>(v0, v1, v2, v3);"
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
    (Some(view), vec![step])
}
