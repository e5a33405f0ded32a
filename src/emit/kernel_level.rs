//! Lowering of kernel-level operators to runtime-header kernels and cuBLAS calls.
//!
//! Element-wise kernels iterate over the result's shape with its dims of extent 1 dropped and
//! its innermost dim last, so consecutive threads touch consecutive result elements; every
//! operand is addressed through a layout over that same iteration space (broadcast dims get
//! stride 0). They use 16-byte vectors when every tensor has stride 1 along the last iteration
//! dim, that dim's extent and every other stride are multiples of the vector length, and every
//! base offset is too (buffers are 16-byte aligned: caller buffers by contract, the workspace by
//! plan).

use super::cublas::{Operand, gemm_calls};
use super::launch::{Binding, GemmCall, KernelLaunch, LaunchPlan, Step, TensorDirective};
use super::{EmitError, HostStep, KernelView};
use crate::graph::arena::Handle;
use crate::graph::dtype::DType;
use crate::graph::kernel::{DTensor, KernelGraph, KnOp, KnOpKind};
use crate::graph::mirage_json::names;
use crate::graph::ops::{BinaryOp, UnaryOp};
use crate::graph::shape::{Shape, Strides};
use crate::layout::strides::padded_strides;
use crate::pipeline::{GraphPlan, Placement};

/// Threads per block of kernel-level kernels.
const THREADS: u32 = 256;
/// Most blocks a grid-stride kernel launches.
const MAX_BLOCKS: usize = 65535;

/// The pieces of the file.
pub(super) struct Parts {
    pub io_lines: Vec<String>,
    pub kernels: Vec<KernelView>,
    pub tensors: Vec<String>,
    pub steps: Vec<HostStep>,
    pub launch: LaunchPlan,
}

/// C++ element type.
pub fn ctype(d: DType) -> &'static str {
    match d {
        DType::F16 => "mucc::f16",
        DType::BF16 => "mucc::bf16",
        DType::F32 => "float",
        DType::F64 => "double",
        DType::I8 => "mucc::i8",
        DType::U8 => "mucc::u8",
        DType::I16 => "mucc::i16",
        DType::U16 => "mucc::u16",
        DType::I32 => "mucc::i32",
        DType::U32 => "mucc::u32",
        DType::I64 => "mucc::i64",
        DType::U64 => "mucc::u64",
        // Validation rejects these.
        DType::F8 | DType::F4 | DType::I4 | DType::U4 => "void",
    }
}

fn elem(d: DType) -> usize {
    (d.bits() as usize / 8).max(1)
}

/// A tensor view for one operand: its dims (in iteration order) and strides, and where it is.
#[derive(Clone, Debug)]
struct View {
    dims: Vec<usize>,
    strides: Vec<usize>,
    at: Binding,
    /// Host expression of the base pointer.
    ptr: String,
}

impl View {
    fn layout(&self) -> String {
        let j = |v: &[usize]| {
            v.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "mucc::Layout<mucc::Shape<{}>, mucc::Stride<{}>>",
            j(&self.dims),
            j(&self.strides)
        )
    }
}

struct Lowerer<'a> {
    g: &'a KernelGraph,
    plan: &'a GraphPlan,
    kernels: Vec<KernelView>,
    steps: Vec<HostStep>,
    launch_steps: Vec<Step>,
}

pub(super) fn binding(p: Placement, dtype: DType) -> Binding {
    match p {
        Placement::Input(index) => Binding::Input {
            index,
            elem_offset: 0,
        },
        Placement::Output(index) => Binding::Output {
            index,
            elem_offset: 0,
        },
        Placement::Workspace(byte_offset) => Binding::Workspace {
            byte_offset,
            elem_offset: 0,
            elem_bytes: elem(dtype),
        },
    }
}

fn blocks(work: usize) -> u32 {
    work.div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS) as u32
}

/// Vector length (elements) usable by all `views`, all over the same iteration dims.
fn vector_len(views: &[&View], dtype: DType) -> usize {
    let mut v = (16 / elem(dtype)).max(1);
    while v > 1 {
        let ok = views.iter().all(|w| {
            let last = w.dims.len() - 1;
            let off = match w.at {
                Binding::Input { elem_offset, .. }
                | Binding::Output { elem_offset, .. }
                | Binding::Workspace { elem_offset, .. } => elem_offset,
            };
            w.dims[last] % v == 0
                && w.strides[last] == 1
                && off % v == 0
                && (0..last).all(|d| w.dims[d] == 1 || w.strides[d] % v == 0)
        });
        if ok {
            break;
        }
        v /= 2;
    }
    v
}

/// Iteration order of a shape: dims of extent > 1, with `inner` last (if it is one of them).
fn iteration_order(shape: &Shape, inner: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..shape.rank())
        .filter(|&d| shape.dim(d) > 1 && d != inner)
        .collect();
    if shape.dim(inner) > 1 {
        order.push(inner);
    }
    if order.is_empty() {
        order.push(shape.rank() - 1);
    }
    order
}

impl Lowerer<'_> {
    fn tensor(&self, t: Handle<DTensor>) -> &DTensor {
        &self.g.tensors[t]
    }

    fn ptr(&self, t: Handle<DTensor>) -> String {
        format!("d{}", t.index())
    }

    /// A view of tensor `t` over `shape`'s dims in `order` (dims where `t` has extent 1 but
    /// `shape` does not are broadcast: stride 0), shifted by `offset` elements.
    fn view(&self, t: Handle<DTensor>, shape: &Shape, order: &[usize], offset: usize) -> View {
        let geo = &self.plan.dtensors[t.index()];
        let ts = self.tensor(t).shape;
        let dims = order.iter().map(|&d| shape.dim(d)).collect();
        let strides = order
            .iter()
            .map(|&d| {
                if ts.dim(d) == 1 && shape.dim(d) > 1 {
                    0
                } else {
                    geo.strides.0[d]
                }
            })
            .collect();
        let ptr = if offset == 0 {
            self.ptr(t)
        } else {
            format!("{} + {offset}", self.ptr(t))
        };
        View {
            dims,
            strides,
            at: binding(geo.placement, self.tensor(t).dtype).offset_by(offset),
            ptr,
        }
    }

    fn full_view(&self, t: Handle<DTensor>) -> View {
        let s = self.tensor(t).shape;
        let order: Vec<usize> = (0..s.rank()).collect();
        self.view(t, &s, &order, 0)
    }

    fn push_kernel(
        &mut self,
        k: KernelView,
        work: usize,
        args: Vec<(String, Binding)>,
        comment: String,
    ) {
        let grid = blocks(work);
        let ptrs: Vec<String> = args.iter().map(|(p, _)| p.clone()).collect();
        self.steps.push(HostStep {
            comment,
            lines: vec![
                format!(
                    "{}<<<{grid}, {THREADS}, 0, stream>>>({});",
                    k.name,
                    ptrs.join(", ")
                ),
                "MUCC_CHECK_LAUNCH();".into(),
            ],
        });
        self.launch_steps.push(Step::Kernel(KernelLaunch {
            name: k.name.clone(),
            grid: [grid, 1, 1],
            block: [THREADS, 1, 1],
            dynamic_smem: 0,
            args: args.into_iter().map(|(_, b)| b).collect(),
        }));
        self.kernels.push(k);
    }

    fn describe(&self, h: Handle<KnOp>, op: &KnOp) -> String {
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
                    self.tensor(t).shape,
                    self.tensor(t).dtype
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

    /// A kernel applying `call` (a device statement using `out`, `in0`, `in1`, … and the
    /// layout aliases) with the given views; views[0] is written, the others read.
    #[allow(clippy::too_many_arguments)]
    fn elementwise(
        &mut self,
        h: Handle<KnOp>,
        op: &KnOp,
        suffix: &str,
        views: Vec<View>,
        dtype: DType,
        functor: Option<String>,
        call: impl Fn(usize, &str) -> String,
    ) {
        let name = format!("k{}_{suffix}", h.index());
        let t = ctype(dtype);
        let refs: Vec<&View> = views.iter().collect();
        let vec = vector_len(&refs, dtype);
        let mut preamble = vec![format!("namespace {name}_l {{")];
        for (i, v) in views.iter().enumerate() {
            preamble.push(format!("using v{i} = {};", v.layout()));
        }
        preamble.push("}".into());
        if let Some(f) = functor {
            preamble.push(f);
        }
        let params: Vec<String> = (0..views.len())
            .map(|i| {
                if i == 0 {
                    format!("{t}* __restrict__ v0")
                } else {
                    format!("const {t}* __restrict__ v{i}")
                }
            })
            .collect();
        let work: usize = views[0].dims.iter().product::<usize>() / vec;
        let args = views.iter().map(|v| (v.ptr.clone(), v.at)).collect();
        let comment = self.describe(h, op);
        self.push_kernel(
            KernelView {
                comment: comment.clone(),
                name: name.clone(),
                launch_bounds: THREADS.to_string(),
                preamble,
                params: params.join(", "),
                body: vec![call(vec, &format!("{name}_l"))],
            },
            work,
            args,
            comment,
        );
    }

    fn lower_op(&mut self, h: Handle<KnOp>, op: &KnOp) -> Result<(), EmitError> {
        let g = self.g;
        let unsupported = |reason: String| EmitError::Unsupported {
            op: h.index(),
            name: names::kn_name(&op.kind),
            reason,
        };
        match &op.kind {
            KnOpKind::Input { .. } => {}
            KnOpKind::Output { .. } => {
                let t = op.inputs[0];
                let j = g.outputs().iter().position(|&(o, _)| o == h).unwrap_or(0);
                if self.plan.dtensors[t.index()].placement != Placement::Output(j) {
                    // The tensor lives elsewhere (a graph input, or another output): copy it.
                    let s = self.tensor(t).shape;
                    let (strides, _) = output_strides(g, self.plan, h, t);
                    let order = iteration_order(&s, innermost(&strides, &s));
                    let dst = View {
                        dims: order.iter().map(|&d| s.dim(d)).collect(),
                        strides: order.iter().map(|&d| strides.0[d]).collect(),
                        at: Binding::Output {
                            index: j,
                            elem_offset: 0,
                        },
                        ptr: format!("o{j}"),
                    };
                    let src = self.view(t, &s, &order, 0);
                    let t_c = ctype(self.tensor(t).dtype);
                    self.steps.push(HostStep {
                        comment: format!("output {j} is a copy of %{}", t.index()),
                        lines: vec![format!("{t_c}* o{j} = static_cast<{t_c}*>(outputs[{j}]);")],
                    });
                    self.elementwise(
                        h,
                        op,
                        "output_copy",
                        vec![dst, src],
                        self.tensor(t).dtype,
                        None,
                        |v, l| format!("mucc::kn::copy<{t_c}, {v}, {l}::v0, {l}::v1>(v0, v1);"),
                    );
                }
            }
            KnOpKind::Matmul => {
                let (a, b, c) = (op.inputs[0], op.inputs[1], op.outputs[0]);
                let mk = |t: Handle<DTensor>| {
                    (
                        self.tensor(t).shape,
                        self.plan.dtensors[t.index()].strides.clone(),
                        binding(
                            self.plan.dtensors[t.index()].placement,
                            self.tensor(t).dtype,
                        ),
                    )
                };
                let (sa, ta, ba) = mk(a);
                let (sb, tb, bb) = mk(b);
                let (sc, tc, bc) = mk(c);
                let (calls, swapped) = gemm_calls(
                    &Operand {
                        shape: &sa,
                        strides: &ta,
                        at: ba,
                    },
                    &Operand {
                        shape: &sb,
                        strides: &tb,
                        at: bb,
                    },
                    &Operand {
                        shape: &sc,
                        strides: &tc,
                        at: bc,
                    },
                    self.tensor(c).dtype,
                )
                .map_err(|e| unsupported(e.0))?;
                let scalar = if self.tensor(c).dtype == DType::F64 {
                    "double"
                } else {
                    "float"
                };
                let mut lines = vec![
                    "{".to_string(),
                    "  cublasHandle_t handle;".into(),
                    "  MUCC_CHECK_CUBLAS(mucc::host::cublas_handle(&handle));".into(),
                    "  MUCC_CHECK_CUBLAS(cublasSetStream(handle, stream));".into(),
                    format!("  const {scalar} alpha = 1, beta = 0;"),
                ];
                let ptr_of = |at: &Binding, t: Handle<DTensor>| -> String {
                    let off = match at {
                        Binding::Input { elem_offset, .. }
                        | Binding::Output { elem_offset, .. }
                        | Binding::Workspace { elem_offset, .. } => *elem_offset,
                    };
                    let base = format!("d{}", t.index());
                    if off == 0 {
                        base
                    } else {
                        format!("{base} + {off}")
                    }
                };
                let (first, second) = if swapped { (b, a) } else { (a, b) };
                for call in &calls {
                    lines.push(gemm_line(
                        call,
                        &ptr_of(&call.a, first),
                        &ptr_of(&call.b, second),
                        &ptr_of(&call.c, c),
                    ));
                }
                lines.push("}".into());
                self.steps.push(HostStep {
                    comment: format!("{} (cuBLAS)", self.describe(h, op)),
                    lines,
                });
                self.launch_steps.extend(calls.into_iter().map(Step::Gemm));
            }
            KnOpKind::Unary(u) => {
                let (x, y) = (op.inputs[0], op.outputs[0]);
                let s = self.tensor(y).shape;
                let order = iteration_order(&s, self.plan.dtensors[y.index()].innermost);
                let views = vec![self.view(y, &s, &order, 0), self.view(x, &s, &order, 0)];
                let dtype = self.tensor(y).dtype;
                let t = ctype(dtype);
                let name = format!("k{}_{}", h.index(), u.name());
                let functor = format!(
                    "struct {name}_op {{\n  __device__ mucc::Compute<{t}> operator()(mucc::Compute<{t}> x) const {{ return {}; }}\n}};",
                    unary_expr(u, &format!("mucc::Compute<{t}>"))
                );
                self.elementwise(h, op, u.name(), views, dtype, Some(functor), |v, l| {
                    format!("mucc::kn::unary<{t}, {v}, {l}::v0, {l}::v1>(v0, v1, {name}_op{{}});")
                });
            }
            KnOpKind::Binary(b) => {
                let (x, z, y) = (op.inputs[0], op.inputs[1], op.outputs[0]);
                let s = self.tensor(y).shape;
                let order = iteration_order(&s, self.plan.dtensors[y.index()].innermost);
                let views = vec![
                    self.view(y, &s, &order, 0),
                    self.view(x, &s, &order, 0),
                    self.view(z, &s, &order, 0),
                ];
                let dtype = self.tensor(y).dtype;
                let t = ctype(dtype);
                let name = format!("k{}_{}", h.index(), b.name());
                let functor = format!(
                    "struct {name}_op {{\n  __device__ mucc::Compute<{t}> operator()(mucc::Compute<{t}> a, mucc::Compute<{t}> b) const {{ return mucc::op::{}(a, b); }}\n}};",
                    binary_fn(*b)
                );
                self.elementwise(h, op, b.name(), views, dtype, Some(functor), |v, l| {
                    format!("mucc::kn::binary<{t}, {v}, {l}::v0, {l}::v1, {l}::v2>(v0, v1, v2, {name}_op{{}});")
                });
            }
            KnOpKind::AllReduce { .. } => {
                let (x, y) = (op.inputs[0], op.outputs[0]);
                let s = self.tensor(y).shape;
                let order = iteration_order(&s, self.plan.dtensors[y.index()].innermost);
                let views = vec![self.view(y, &s, &order, 0), self.view(x, &s, &order, 0)];
                let dtype = self.tensor(y).dtype;
                let t = ctype(dtype);
                self.elementwise(h, op, "allreduce", views, dtype, None, |v, l| {
                    format!("mucc::kn::copy<{t}, {v}, {l}::v0, {l}::v1>(v0, v1);")
                });
            }
            KnOpKind::Reduction { dim } => {
                let (x, y) = (op.inputs[0], op.outputs[0]);
                let (xs, ys) = (self.tensor(x).shape, self.tensor(y).shape);
                let to = ys.dim(*dim);
                let k = xs.dim(*dim) / to;
                let inner: usize = ys.dims()[dim + 1..].iter().product();
                let rstride = self.plan.dtensors[x.index()].strides.0[*dim];
                let warp = k >= 64;
                let (vy, vx) = (self.full_view(y), self.full_view(x));
                let dtype = self.tensor(y).dtype;
                let t = ctype(dtype);
                let name = format!("k{}_reduction_{dim}", h.index());
                let comment = self.describe(h, op);
                let work = ys.numel() * if warp { 32 } else { 1 };
                let args = vec![(vy.ptr.clone(), vy.at), (vx.ptr.clone(), vx.at)];
                self.push_kernel(
                    KernelView {
                        comment: comment.clone(),
                        name: name.clone(),
                        launch_bounds: THREADS.to_string(),
                        preamble: vec![
                            format!("namespace {name}_l {{"),
                            format!("using v0 = {};", vy.layout()),
                            format!("using v1 = {};", vx.layout()),
                            "}".into(),
                        ],
                        params: format!("{t}* __restrict__ v0, const {t}* __restrict__ v1"),
                        body: vec![format!(
                            "mucc::kn::reduce<{t}, {name}_l::v0, {name}_l::v1, {to}, {k}, {inner}, {rstride}, {warp}>(v0, v1);"
                        )],
                    },
                    work,
                    args,
                    comment,
                );
            }
            KnOpKind::RmsNorm { normalized_dims } => {
                let (x, y) = (op.inputs[0], op.outputs[0]);
                let s = self.tensor(y).shape;
                let group: usize = s.dims()[s.rank() - normalized_dims..].iter().product();
                let rows = s.numel() / group;
                let (vy, vx) = (self.full_view(y), self.full_view(x));
                let dtype = self.tensor(y).dtype;
                let t = ctype(dtype);
                let name = format!("k{}_rms_norm", h.index());
                let comment = self.describe(h, op);
                let args = vec![(vy.ptr.clone(), vy.at), (vx.ptr.clone(), vx.at)];
                self.push_kernel(
                    KernelView {
                        comment: comment.clone(),
                        name: name.clone(),
                        launch_bounds: THREADS.to_string(),
                        preamble: vec![
                            format!("namespace {name}_l {{"),
                            format!("using v0 = {};", vy.layout()),
                            format!("using v1 = {};", vx.layout()),
                            "}".into(),
                        ],
                        params: format!("{t}* __restrict__ v0, const {t}* __restrict__ v1"),
                        body: vec![format!("mucc::kn::rms_norm<{t}, {name}_l::v0, {name}_l::v1, {rows}, {group}>(v0, v1);")],
                    },
                    rows * 32,
                    args,
                    comment,
                );
            }
            KnOpKind::Concat { dim } | KnOpKind::Split { dim } | KnOpKind::Chunk { dim, .. } => {
                // One kernel with a copy per part; the big tensor is addressed at the part's
                // offset along `dim`.
                let concat = matches!(op.kind, KnOpKind::Concat { .. });
                let (whole, parts): (Handle<DTensor>, Vec<Handle<DTensor>>) = if concat {
                    (op.outputs[0], op.inputs.clone())
                } else {
                    (op.inputs[0], op.outputs.clone())
                };
                let dtype = self.tensor(whole).dtype;
                let t = ctype(dtype);
                let name = format!("k{}_{}", h.index(), op.kind.name());
                let wstride = self.plan.dtensors[whole.index()].strides.0[*dim];
                let mut preamble = vec![format!("namespace {name}_l {{")];
                let mut params = Vec::new();
                let mut body = Vec::new();
                let mut args = Vec::new();
                let mut offset = 0usize;
                let mut work = 0usize;
                let whole_param = if concat {
                    format!("{t}* __restrict__ whole")
                } else {
                    format!("const {t}* __restrict__ whole")
                };
                params.push(whole_param);
                let wv = self.full_view(whole);
                args.push((wv.ptr.clone(), wv.at));
                for (i, &p) in parts.iter().enumerate() {
                    let ps = self.tensor(p).shape;
                    let order = iteration_order(&ps, self.plan.dtensors[p.index()].innermost);
                    let pv = self.view(p, &ps, &order, 0);
                    let mut wpart = self.view(whole, &ps, &order, offset * wstride);
                    // The whole tensor's extent-1 dims are not broadcast.
                    wpart.strides = order
                        .iter()
                        .map(|&d| self.plan.dtensors[whole.index()].strides.0[d])
                        .collect();
                    let refs = [&pv, &wpart];
                    let vec = vector_len(&refs, dtype);
                    preamble.push(format!("using part{i} = {};", pv.layout()));
                    preamble.push(format!("using whole{i} = {};", wpart.layout()));
                    let woff = offset * wstride;
                    if concat {
                        params.push(format!("const {t}* __restrict__ p{i}"));
                        body.push(format!("mucc::kn::copy<{t}, {vec}, {name}_l::whole{i}, {name}_l::part{i}>(whole + {woff}, p{i});"));
                    } else {
                        params.push(format!("{t}* __restrict__ p{i}"));
                        body.push(format!("mucc::kn::copy<{t}, {vec}, {name}_l::part{i}, {name}_l::whole{i}>(p{i}, whole + {woff});"));
                    }
                    args.push((pv.ptr.clone(), pv.at));
                    work = work.max(ps.numel() / vec);
                    offset += ps.dim(*dim);
                }
                preamble.push("}".into());
                let comment = self.describe(h, op);
                self.push_kernel(
                    KernelView {
                        comment: comment.clone(),
                        name,
                        launch_bounds: THREADS.to_string(),
                        preamble,
                        params: params.join(", "),
                        body,
                    },
                    work,
                    args,
                    comment,
                );
            }
            KnOpKind::Customized(tb) => {
                let (view, host, launch) = super::threadblock::emit(g, self.plan, h, op, tb)?;
                self.kernels.push(view);
                self.steps.push(host);
                self.launch_steps.push(Step::Kernel(launch));
            }
        }
        Ok(())
    }
}

fn gemm_line(c: &GemmCall, a: &str, b: &str, out: &str) -> String {
    let op = |t: bool| if t { "CUBLAS_OP_T" } else { "CUBLAS_OP_N" };
    format!(
        "  MUCC_CHECK_CUBLAS(cublasGemmStridedBatchedEx(handle, {}, {}, {}, {}, {}, &alpha, {a}, {dt}, {}, {}LL, {b}, {dt}, {}, {}LL, &beta, {out}, {dt}, {}, {}LL, {}, {}, CUBLAS_GEMM_DEFAULT));",
        op(c.trans_a),
        op(c.trans_b),
        c.m,
        c.n,
        c.k,
        c.lda,
        c.stride_a,
        c.ldb,
        c.stride_b,
        c.ldc,
        c.stride_c,
        c.batch,
        c.compute_type,
        dt = c.data_type
    )
}

fn unary_expr(u: &UnaryOp, c: &str) -> String {
    match *u {
        UnaryOp::Exp => "mucc::op::exp(x)".into(),
        UnaryOp::Square => "mucc::op::square(x)".into(),
        UnaryOp::Sqrt => "mucc::op::sqrt(x)".into(),
        UnaryOp::Silu => "mucc::op::silu(x)".into(),
        UnaryOp::Sigmoid => "mucc::op::sigmoid(x)".into(),
        UnaryOp::Gelu => "mucc::op::gelu(x)".into(),
        UnaryOp::Relu => "mucc::op::relu(x)".into(),
        UnaryOp::Log => "mucc::op::log(x)".into(),
        UnaryOp::Clamp { min, max } => format!(
            "mucc::op::clamp(x, {c}({}), {c}({}))",
            float_lit(min),
            float_lit(max)
        ),
        UnaryOp::MulScalar(s) => format!("x * {c}({})", float_lit(s)),
    }
}

fn binary_fn(b: BinaryOp) -> &'static str {
    match b {
        BinaryOp::Add => "add",
        BinaryOp::Sub => "sub",
        BinaryOp::Mul => "mul",
        BinaryOp::Div => "div",
        BinaryOp::Pow => "pow",
    }
}

/// A C++ double literal that reads back as exactly `x`.
fn float_lit(x: f64) -> String {
    let s = format!("{x:?}");
    if s.contains('.') || s.contains('e') || s.contains("inf") || s.contains("NaN") {
        s
    } else {
        format!("{s}.0")
    }
}

/// The innermost dim of strides over a shape (stride 1 and extent > 1, else the last dim).
fn innermost(st: &Strides, s: &Shape) -> usize {
    st.innermost_dim(s).unwrap_or(s.rank() - 1)
}

/// Strides and allocation of output `j` (op `h`, tensor `t`).
fn output_strides(
    g: &KernelGraph,
    plan: &GraphPlan,
    h: Handle<KnOp>,
    t: Handle<DTensor>,
) -> (Strides, usize) {
    let d = &g.tensors[t];
    if let KnOpKind::Output { strides: Some(s) } = &g.ops[h].kind {
        return (s.clone(), s.span(&d.shape).unwrap_or(0));
    }
    let j = g.outputs().iter().position(|&(o, _)| o == h).unwrap_or(0);
    if plan.dtensors[t.index()].placement == Placement::Output(j) {
        let geo = &plan.dtensors[t.index()];
        return (geo.strides.clone(), geo.phys_elems);
    }
    padded_strides(
        &d.shape,
        plan.dtensors[t.index()].innermost,
        None,
        elem(d.dtype),
    )
}

/// Lowers every kernel-level operator of `g`.
pub(super) fn lower(g: &KernelGraph, plan: &GraphPlan) -> Result<Parts, EmitError> {
    let mut io_lines = Vec::new();
    let mut inputs = Vec::new();
    for (i, (_, t)) in g.inputs().into_iter().enumerate() {
        let d = &g.tensors[t];
        let st = &plan.dtensors[t.index()].strides;
        io_lines.push(format!(
            "input {i}: %{} {} {} strides {st}",
            t.index(),
            d.shape,
            d.dtype
        ));
        inputs.push(TensorDirective {
            shape: d.shape.dims().to_vec(),
            strides: st.0.clone(),
            alloc_elems: st.span(&d.shape).unwrap_or(0),
            dtype: d.dtype.to_string(),
        });
    }
    let mut outputs = Vec::new();
    for (j, (h, t)) in g.outputs().into_iter().enumerate() {
        let d = &g.tensors[t];
        let (st, alloc) = output_strides(g, plan, h, t);
        io_lines.push(format!(
            "output {j}: %{} {} {} strides {st} ({alloc} elements)",
            t.index(),
            d.shape,
            d.dtype
        ));
        outputs.push(TensorDirective {
            shape: d.shape.dims().to_vec(),
            strides: st.0.clone(),
            alloc_elems: alloc.max(1),
            dtype: d.dtype.to_string(),
        });
    }
    io_lines.push(format!("workspace: {} bytes", plan.workspace_bytes()));
    // Host pointers of every tensor some operator touches.
    let mut tensors = Vec::new();
    for (h, d) in g.tensors.iter() {
        let t = ctype(d.dtype);
        let decl = match plan.dtensors[h.index()].placement {
            Placement::Input(i) => format!(
                "const {t}* d{} = static_cast<const {t}*>(inputs[{i}]);",
                h.index()
            ),
            Placement::Output(j) => {
                format!("{t}* d{} = static_cast<{t}*>(outputs[{j}]);", h.index())
            }
            Placement::Workspace(o) => {
                format!("{t}* d{} = reinterpret_cast<{t}*>(ws + {o});", h.index())
            }
        };
        tensors.push(format!(
            "{decl} (void)d{};  // %{} {} {}",
            h.index(),
            h.index(),
            d.shape,
            d.dtype
        ));
    }
    let mut l = Lowerer {
        g,
        plan,
        kernels: Vec::new(),
        steps: Vec::new(),
        launch_steps: Vec::new(),
    };
    for (h, op) in g.ops.iter() {
        l.lower_op(h, op)?;
    }
    Ok(Parts {
        io_lines,
        kernels: l.kernels,
        tensors,
        steps: l.steps,
        launch: LaunchPlan {
            arch: plan.target.arch.to_string(),
            inputs,
            outputs,
            workspace_bytes: plan.workspace_bytes(),
            steps: l.launch_steps,
        },
    })
}
