//! Kernel-level operators: each plan ([`KnOpPlan`]) becomes a call of a runtime-header kernel
//! (`mucc::kn::*`) over the plan's views, or cuBLAS steps.

use super::KernelView;
use super::cxx::{self, ctype};
use super::launch::{KernelLaunch, Step};
use crate::graph::arena::Handle;
use crate::graph::dtype::DType;
use crate::graph::kernel::{KernelGraph, KnOp, KnOpKind};
use crate::graph::mirage_json::names;
use crate::sched::kernel_level::{ElementwiseOp, GridStride, KnOpPlan, View};

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

/// A kernel over views `v0` (written) and `v1…` (read): layout aliases in a namespace, the
/// typed pointer parameters, and a one-line body.
fn view_kernel(
    name: &str,
    comment: String,
    views: &[&View],
    dtype: DType,
    extra: Option<String>,
    body: String,
) -> KernelView {
    let t = ctype(dtype);
    let mut preamble = vec![format!("namespace {name}_l {{")];
    for (i, v) in views.iter().enumerate() {
        preamble.push(format!("using v{i} = {};", layout(v)));
    }
    preamble.push("}".into());
    preamble.extend(extra);
    let params: Vec<String> = (0..views.len())
        .map(|i| {
            if i == 0 {
                format!("{t}* __restrict__ v0")
            } else {
                format!("const {t}* __restrict__ v{i}")
            }
        })
        .collect();
    KernelView {
        comment,
        name: name.to_string(),
        launch_bounds: crate::sched::kernel_level::THREADS.to_string(),
        preamble,
        params: params.join(", "),
        body: vec![body],
    }
}

fn launch(name: &str, l: GridStride, views: &[&View]) -> Step {
    Step::Kernel(KernelLaunch {
        name: name.to_string(),
        grid: [l.blocks, 1, 1],
        block: [l.threads, 1, 1],
        dynamic_smem: 0,
        args: views.iter().map(|v| v.at).collect(),
    })
}

fn unary_functor(u: &crate::graph::ops::UnaryOp, c: &str) -> String {
    use crate::graph::ops::UnaryOp;
    let lit = |x: f64| {
        let s = format!("{x:?}");
        if s.contains('.') || s.contains('e') || s.contains("inf") || s.contains("NaN") {
            s
        } else {
            format!("{s}.0")
        }
    };
    match *u {
        UnaryOp::Clamp { min, max } => {
            format!("mucc::op::clamp(x, {c}({}), {c}({}))", lit(min), lit(max))
        }
        UnaryOp::MulScalar(s) => format!("x * {c}({})", lit(s)),
        _ => cxx::unary(u, "x", c),
    }
}

/// The kernel (if any) and steps of kernel-level operator `h`.
pub(super) fn emit(
    g: &KernelGraph,
    h: Handle<KnOp>,
    op: &KnOp,
    plan: &KnOpPlan,
) -> (Option<KernelView>, Vec<Step>) {
    let comment = describe(g, h, op);
    let k = h.index();
    match plan {
        KnOpPlan::Nothing | KnOpPlan::Customized => (None, Vec::new()),
        KnOpPlan::Gemm { calls, .. } => (None, calls.iter().cloned().map(Step::Gemm).collect()),
        KnOpPlan::Elementwise {
            op: ew,
            out,
            ins,
            dtype,
            vector,
            launch: l,
        } => {
            let t = ctype(*dtype);
            let views: Vec<&View> = std::iter::once(out).chain(ins).collect();
            let (suffix, functor, body) = match (ew, &op.kind) {
                (ElementwiseOp::Unary(u), _) => {
                    let name = format!("k{k}_{}", u.name());
                    let functor = format!(
                        "struct {name}_op {{\n  __device__ mucc::Compute<{t}> operator()(mucc::Compute<{t}> x) const {{ return {}; }}\n}};",
                        unary_functor(u, &format!("mucc::Compute<{t}>"))
                    );
                    let body = format!(
                        "mucc::kn::unary<{t}, {vector}, {name}_l::v0, {name}_l::v1>(v0, v1, {name}_op{{}});"
                    );
                    (u.name(), Some(functor), body)
                }
                (ElementwiseOp::Binary(b), _) => {
                    let name = format!("k{k}_{}", b.name());
                    let f = cxx::binary(*b, "a", "b");
                    let functor = format!(
                        "struct {name}_op {{\n  __device__ mucc::Compute<{t}> operator()(mucc::Compute<{t}> a, mucc::Compute<{t}> b) const {{ return {f}; }}\n}};"
                    );
                    let body = format!(
                        "mucc::kn::binary<{t}, {vector}, {name}_l::v0, {name}_l::v1, {name}_l::v2>(v0, v1, v2, {name}_op{{}});"
                    );
                    (b.name(), Some(functor), body)
                }
                (ElementwiseOp::Copy, kind) => {
                    let suffix = if matches!(kind, KnOpKind::Output { .. }) {
                        "output_copy"
                    } else {
                        "allreduce"
                    };
                    let name = format!("k{k}_{suffix}");
                    let body = format!(
                        "mucc::kn::copy<{t}, {vector}, {name}_l::v0, {name}_l::v1>(v0, v1);"
                    );
                    (suffix, None, body)
                }
            };
            let name = format!("k{k}_{suffix}");
            let view = view_kernel(&name, comment, &views, *dtype, functor, body);
            (Some(view), vec![launch(&name, *l, &views)])
        }
        KnOpPlan::Reduction {
            out,
            x,
            dtype,
            to,
            k: kk,
            inner,
            stride,
            warp_per_output,
            launch: l,
        } => {
            let KnOpKind::Reduction { dim } = op.kind else {
                unreachable!("a reduction plan belongs to a reduction")
            };
            let t = ctype(*dtype);
            let name = format!("k{k}_reduction_{dim}");
            let body = format!(
                "mucc::kn::reduce<{t}, {name}_l::v0, {name}_l::v1, {to}, {kk}, {inner}, {stride}, {warp_per_output}>(v0, v1);"
            );
            let views = [out, x];
            let view = view_kernel(&name, comment, &views, *dtype, None, body);
            (Some(view), vec![launch(&name, *l, &views)])
        }
        KnOpPlan::RmsNorm {
            out,
            x,
            dtype,
            rows,
            group,
            launch: l,
        } => {
            let t = ctype(*dtype);
            let name = format!("k{k}_rms_norm");
            let body = format!(
                "mucc::kn::rms_norm<{t}, {name}_l::v0, {name}_l::v1, {rows}, {group}>(v0, v1);"
            );
            let views = [out, x];
            let view = view_kernel(&name, comment, &views, *dtype, None, body);
            (Some(view), vec![launch(&name, *l, &views)])
        }
        KnOpPlan::Parts {
            concat,
            whole,
            parts,
            dtype,
            launch: l,
        } => {
            let t = ctype(*dtype);
            let name = format!("k{k}_{}", op.kind.name());
            let mut preamble = vec![format!("namespace {name}_l {{")];
            let mut params = vec![if *concat {
                format!("{t}* __restrict__ whole")
            } else {
                format!("const {t}* __restrict__ whole")
            }];
            let mut body = Vec::new();
            let mut args = vec![whole.at];
            let whole_offset = whole.at.elem_offset();
            for (i, p) in parts.iter().enumerate() {
                preamble.push(format!("using part{i} = {};", layout(&p.part)));
                preamble.push(format!("using whole{i} = {};", layout(&p.whole)));
                let woff = p.whole.at.elem_offset() - whole_offset;
                let v = p.vector;
                if *concat {
                    params.push(format!("const {t}* __restrict__ p{i}"));
                    body.push(format!("mucc::kn::copy<{t}, {v}, {name}_l::whole{i}, {name}_l::part{i}>(whole + {woff}, p{i});"));
                } else {
                    params.push(format!("{t}* __restrict__ p{i}"));
                    body.push(format!("mucc::kn::copy<{t}, {v}, {name}_l::part{i}, {name}_l::whole{i}>(p{i}, whole + {woff});"));
                }
                args.push(p.part.at);
            }
            preamble.push("}".into());
            let view = KernelView {
                comment,
                name: name.clone(),
                launch_bounds: crate::sched::kernel_level::THREADS.to_string(),
                preamble,
                params: params.join(", "),
                body,
            };
            let step = Step::Kernel(KernelLaunch {
                name,
                grid: [l.blocks, 1, 1],
                block: [l.threads, 1, 1],
                dynamic_smem: 0,
                args,
            });
            (Some(view), vec![step])
        }
    }
}
