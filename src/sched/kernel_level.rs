//! Plans of kernel-level operators: which runtime kernel or cuBLAS call carries each one out,
//! how it walks its tensors, its vector width and its launch.
//!
//! Element-wise kernels iterate over the result's shape with its dims of extent 1 dropped and
//! its innermost dim last, so consecutive threads touch consecutive result elements; every
//! operand is addressed through a view over that same iteration space (broadcast dims get
//! stride 0). They use 16-byte vectors when every tensor has stride 1 along the last iteration
//! dim, that dim's extent and every other stride are multiples of the vector length, and every
//! base offset is too (buffers are 16-byte aligned: caller buffers by contract, the workspace by
//! plan). Matmuls go to cuBLAS ([`super::gemm`]).

use super::gemm::{GemmCall, Operand, gemm_calls};
use super::plan::{Binding, DTensorGeometry, IoPlan, PlanError};
use crate::graph::arena::Handle;
use crate::graph::dtype::DType;
use crate::graph::kernel::{DTensor, KernelGraph, KnOp, KnOpKind};
use crate::graph::mirage_json::names;
use crate::graph::ops::{BinaryOp, UnaryOp};
use crate::graph::shape::Shape;
use crate::target::Target;
use serde::{Deserialize, Serialize};

/// Threads per block of kernel-level kernels.
pub const THREADS: u32 = 256;
/// Threads per block of the softmax combination (smaller blocks than [`THREADS`] spread its
/// rows over more SMs).
const COMBINE_THREADS: u32 = 128;
/// The softmax combination's split lanes double while its threads stay within this many per
/// SM (half the resident maximum). H100, combine alone (µs) for 1, 2 and 4 lanes: gqa_bs8 g8
/// (4096 rows × 8 threads, 16 splits) 5.0, 3.6, 3.5; mqa_bs8 g4 (8192 rows, 8 splits) 3.8,
/// 3.5, 4.2 (4 lanes: 2 threads per SM slot, over the limit); gqa_bs1 g19 (512 rows) 4.6, 2.8,
/// 2.1; mqa_bs1 g3 (1024 rows) 3.2, 2.0, 1.8.
const COMBINE_THREADS_PER_SM: usize = 1024;
/// Most blocks a grid-stride kernel launches.
const MAX_BLOCKS: usize = 65535;
/// Reduction lengths from which a warp (not a thread) computes each output.
const WARP_REDUCTION_LEN: usize = 64;

/// A tensor as a kernel walks it: the dims of the iteration space, slowest first, the
/// tensor's element strides over them (0: broadcast), and where it starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    /// Extents in walk order.
    pub dims: Vec<usize>,
    /// Element strides in walk order.
    pub strides: Vec<usize>,
    /// The first element.
    pub at: Binding,
}

/// A grid-stride launch: `blocks` blocks of `threads` threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GridStride {
    /// Blocks.
    pub blocks: u32,
    /// Threads per block.
    pub threads: u32,
}

impl GridStride {
    /// A launch for `work` items (one per thread), capped at [`MAX_BLOCKS`] blocks.
    fn for_work(work: usize) -> GridStride {
        GridStride {
            blocks: work.div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS) as u32,
            threads: THREADS,
        }
    }
}

/// What an element-wise kernel computes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ElementwiseOp {
    /// out = u(in0).
    Unary(UnaryOp),
    /// out = b(in0, in1).
    Binary(BinaryOp),
    /// out = in0 (output copies, single-GPU allreduce).
    Copy,
    /// out = exp(in0 − in1) ([`KnOpKind::ShiftedExp`]).
    ShiftedExp,
}

/// How a kernel-level reduction combines the elements of a group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduce {
    /// Their sum ([`KnOpKind::Reduction`]).
    Sum,
    /// Their largest ([`KnOpKind::RowMax`]).
    Max,
}

impl std::fmt::Display for Reduce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Reduce::Sum => "sum",
            Reduce::Max => "max",
        })
    }
}

/// An element type of NCCL (`ncclDataType_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NcclDataType {
    /// `ncclInt8`.
    Int8,
    /// `ncclUint8`.
    Uint8,
    /// `ncclInt32`.
    Int32,
    /// `ncclUint32`.
    Uint32,
    /// `ncclInt64`.
    Int64,
    /// `ncclUint64`.
    Uint64,
    /// `ncclFloat16`.
    Float16,
    /// `ncclBfloat16`.
    Bfloat16,
    /// `ncclFloat32`.
    Float32,
    /// `ncclFloat64`.
    Float64,
}

/// The element type's name (`f16`, `i32`, …); the C enumerator is spelled by
/// `emit::cxx::nccl_data_type`.
impl std::fmt::Display for NcclDataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NcclDataType::Int8 => "i8",
            NcclDataType::Uint8 => "u8",
            NcclDataType::Int32 => "i32",
            NcclDataType::Uint32 => "u32",
            NcclDataType::Int64 => "i64",
            NcclDataType::Uint64 => "u64",
            NcclDataType::Float16 => "f16",
            NcclDataType::Bfloat16 => "bf16",
            NcclDataType::Float32 => "f32",
            NcclDataType::Float64 => "f64",
        })
    }
}

impl NcclDataType {
    /// NCCL's type for `dt`, if it has one (none for 16-bit integers and fp8).
    pub fn of(dt: DType) -> Option<NcclDataType> {
        Some(match dt {
            DType::I8 => NcclDataType::Int8,
            DType::U8 => NcclDataType::Uint8,
            DType::I32 => NcclDataType::Int32,
            DType::U32 => NcclDataType::Uint32,
            DType::I64 => NcclDataType::Int64,
            DType::U64 => NcclDataType::Uint64,
            DType::F16 => NcclDataType::Float16,
            DType::BF16 => NcclDataType::Bfloat16,
            DType::F32 => NcclDataType::Float32,
            DType::F64 => NcclDataType::Float64,
            _ => return None,
        })
    }

    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            NcclDataType::Int8 | NcclDataType::Uint8 => 1,
            NcclDataType::Float16 | NcclDataType::Bfloat16 => 2,
            NcclDataType::Int32 | NcclDataType::Uint32 | NcclDataType::Float32 => 4,
            NcclDataType::Int64 | NcclDataType::Uint64 | NcclDataType::Float64 => 8,
        }
    }
}

/// One part of a concat, split or chunk: the part and the whole tensor's region it maps to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartCopy {
    /// The part tensor.
    pub part: View,
    /// The whole tensor's region, over the part's iteration space.
    pub whole: View,
    /// Vector width (elements).
    pub vector: usize,
    /// Where the part starts in the whole tensor: elements from the whole tensor's first.
    pub whole_offset: usize,
}

/// How a kernel-level operator runs.
#[derive(Clone, Debug, PartialEq)]
pub enum KnOpPlan {
    /// Nothing runs: a graph input, or an output whose tensor already lives in its buffer.
    Nothing,
    /// A customized operator: see [`super::plan::GraphPlan::kernels`].
    Customized,
    /// An element-wise kernel (`mucc::kn::unary`, `binary`, `copy`).
    Elementwise {
        /// What it computes.
        op: ElementwiseOp,
        /// The result.
        out: View,
        /// The operands.
        ins: Vec<View>,
        /// Per operand of a shifted exponential: broadcast along the last iteration dim (stride
        /// 0 there), so one element serves a whole vector and takes no part in the vector
        /// width (all false for other operators).
        splat: Vec<bool>,
        /// Element type.
        dtype: DType,
        /// Vector width (elements).
        vector: usize,
        /// Launch.
        launch: GridStride,
    },
    /// A sum over groups along `dim`, or a max (`mucc::kn::reduce`).
    Reduction {
        /// What combines the elements.
        of: Reduce,
        /// The result.
        out: View,
        /// The operand.
        x: View,
        /// Element type.
        dtype: DType,
        /// Results along the reduced dim whose groups interleave (Mirage's strided grouping of
        /// a sum); 1 for a max, whose groups along the last dim are contiguous.
        to: usize,
        /// Elements combined per result.
        k: usize,
        /// Elements after the reduced dim.
        inner: usize,
        /// Stride of the reduced dim in the operand.
        stride: usize,
        /// A warp per result (long sums) instead of a thread.
        warp_per_output: bool,
        /// Launch.
        launch: GridStride,
    },
    /// RMS normalisation of groups (`mucc::kn::rms_norm`), a warp per group.
    RmsNorm {
        /// The result.
        out: View,
        /// The operand.
        x: View,
        /// Element type.
        dtype: DType,
        /// Groups.
        rows: usize,
        /// Elements per group.
        group: usize,
        /// Launch.
        launch: GridStride,
    },
    /// The online-softmax combination of split-attention partials
    /// (`mucc::kn::softmax_combine`, [`KnOpKind::SoftmaxCombine`]): `group` threads per row,
    /// each summing `vector`-element slices of the row's `d` outputs over the splits from
    /// registers, with no shared memory and no barrier.
    SoftmaxCombine {
        /// The result `[…, rows, d]`.
        out: View,
        /// The partial outputs O `[…, rows, splits·d]`.
        o: View,
        /// The partial sums l `[…, rows, splits]`.
        l: View,
        /// The partial maxima m `[…, rows, splits]`.
        m: View,
        /// Element type.
        dtype: DType,
        /// Rows (the product of every dim but the last).
        rows: usize,
        /// Key splits.
        splits: usize,
        /// Outputs per row.
        d: usize,
        /// Vector width (elements) of the O loads and the stores.
        vector: usize,
        /// Threads per row that share its outputs (`vector` elements each at a time).
        group: usize,
        /// Groups per row that share its key splits (split p, p + this, …), their sums added
        /// by warp shuffles: the largest power of two dividing `splits` with `group` × this ≤ 32
        /// and at most 1024 threads per SM in all (`COMBINE_THREADS_PER_SM`; 1 when `group` is no
        /// power of two).
        split_lanes: usize,
        /// Launch.
        launch: GridStride,
        /// A kernel of its own, or performed by the attention kernel's clusters
        /// ([`super::combine`], which decides it after the kernels are planned).
        form: super::combine::CombineForm,
    },
    /// Concat (parts → whole) or split/chunk (whole → parts): one copy per part.
    Parts {
        /// Concat: the whole tensor is written.
        concat: bool,
        /// The whole tensor.
        whole: View,
        /// The parts.
        parts: Vec<PartCopy>,
        /// Element type.
        dtype: DType,
        /// Launch.
        launch: GridStride,
    },
    /// An all-reduce across the graph's GPUs (more than one): `ncclAllReduce` with `ncclSum`
    /// from the input tensor's buffer into the output's, which have the same dense layout, so
    /// the sum runs over their memory as one flat array.
    AllReduce {
        /// The input tensor's first element.
        send: Binding,
        /// The output tensor's first element.
        recv: Binding,
        /// Elements: the span of the tensors' shared layout (from the first element to the
        /// last, padding between rows included).
        count: usize,
        /// NCCL's element type.
        dtype: NcclDataType,
        /// GPUs taking part.
        gpus: usize,
        /// Whether the kernel writing the input performs the all-reduce itself (then this
        /// operator runs no step), or why it stays an NCCL call.
        fused: super::exchange::AllReduceForm,
    },
    /// cuBLAS calls.
    Gemm {
        /// The calls, in order.
        calls: Vec<GemmCall>,
        /// cuBLAS's A is the logical B (a row-major C is computed transposed).
        transposed: bool,
    },
}

/// Vector length (elements) usable by all `views`, all over the same iteration dims.
fn vector_len(views: &[&View], dtype: DType) -> usize {
    let mut v = (16 / dtype.bytes()).max(1);
    while v > 1 {
        let ok = views.iter().all(|w| {
            let last = w.dims.len() - 1;
            w.dims[last] % v == 0
                && w.strides[last] == 1
                && w.at.elem_offset() % v == 0
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

struct Planner<'a> {
    g: &'a KernelGraph,
    dt: &'a [DTensorGeometry],
    outputs: &'a [IoPlan],
    /// GPUs of the graph's mesh.
    gpus: usize,
    /// SMs of the target.
    sms: usize,
}

impl Planner<'_> {
    fn at(&self, t: Handle<DTensor>) -> Binding {
        Binding::of(
            self.dt[t.index()].placement,
            self.g.tensors[t].dtype.bytes(),
        )
    }

    /// A view of tensor `t` over `shape`'s dims in `order` (dims where `t` has extent 1 but
    /// `shape` does not are broadcast: stride 0), shifted by `offset` elements.
    fn view(&self, t: Handle<DTensor>, shape: &Shape, order: &[usize], offset: usize) -> View {
        let geo = &self.dt[t.index()];
        let ts = self.g.tensors[t].shape;
        View {
            dims: order.iter().map(|&d| shape.dim(d)).collect(),
            strides: order
                .iter()
                .map(|&d| {
                    if ts.dim(d) == 1 && shape.dim(d) > 1 {
                        0
                    } else {
                        geo.strides.0[d]
                    }
                })
                .collect(),
            at: self.at(t).offset_by(offset),
        }
    }

    fn full_view(&self, t: Handle<DTensor>) -> View {
        let s = self.g.tensors[t].shape;
        let order: Vec<usize> = (0..s.rank()).collect();
        self.view(t, &s, &order, 0)
    }

    fn elementwise(&self, op: ElementwiseOp, out: View, ins: Vec<View>, dtype: DType) -> KnOpPlan {
        // Only the shifted exponential reads its broadcast operand one element per vector: for
        // the graphs' own binary operators it measured no faster (H100, ntrans_bs1 g2's division
        // 4.59 → 4.69 µs, qknorm_gqa_bs1 g111 18.1 → 18.4: a quarter of the blocks), while
        // shifted_exp went from 51.8 µs (one element per thread) to 24.2 on mha_bs8 g1.
        let splats = matches!(op, ElementwiseOp::ShiftedExp);
        let splat: Vec<bool> = ins
            .iter()
            .map(|v| {
                splats && v.strides.last() == Some(&0) && v.dims.last().is_some_and(|&d| d > 1)
            })
            .collect();
        let refs: Vec<&View> = std::iter::once(&out)
            .chain(ins.iter().zip(&splat).filter(|(_, s)| !**s).map(|(v, _)| v))
            .collect();
        let vector = vector_len(&refs, dtype);
        let work = out.dims.iter().product::<usize>() / vector;
        KnOpPlan::Elementwise {
            op,
            out,
            ins,
            splat,
            dtype,
            vector,
            launch: GridStride::for_work(work),
        }
    }

    /// An element-wise operator writing `y` from `xs` over `y`'s shape.
    fn map(&self, op: ElementwiseOp, y: Handle<DTensor>, xs: &[Handle<DTensor>]) -> KnOpPlan {
        let s = self.g.tensors[y].shape;
        let order = iteration_order(&s, self.dt[y.index()].innermost);
        let ins = xs.iter().map(|&x| self.view(x, &s, &order, 0)).collect();
        self.elementwise(
            op,
            self.view(y, &s, &order, 0),
            ins,
            self.g.tensors[y].dtype,
        )
    }

    /// A shifted exponential whose `m` holds one value per contiguous group of `groups` along
    /// the last dim: every view walks that dim as (groups, length), `m` with stride 0 along the
    /// length (so that it is read one element per vector).
    fn map_grouped(&self, op: &KnOp, groups: usize) -> KnOpPlan {
        let (y, x, m) = (op.outputs[0], op.inputs[0], op.inputs[1]);
        let s = self.g.tensors[y].shape;
        let last = s.rank() - 1;
        let len = s.dim(last) / groups;
        let order = iteration_order(&s, self.dt[y.index()].innermost);
        let split = |t: Handle<DTensor>, of_m: bool| {
            let st = &self.dt[t.index()].strides.0;
            let (mut dims, mut strides) = (Vec::new(), Vec::new());
            for &d in &order {
                if d == last {
                    dims.extend([groups, len]);
                    strides.extend(if of_m {
                        [st[d], 0]
                    } else {
                        [len * st[d], st[d]]
                    });
                } else {
                    dims.push(s.dim(d));
                    strides.push(st[d]);
                }
            }
            View {
                dims,
                strides,
                at: self.at(t),
            }
        };
        self.elementwise(
            ElementwiseOp::ShiftedExp,
            split(y, false),
            vec![split(x, false), split(m, true)],
            self.g.tensors[y].dtype,
        )
    }

    fn plan(&self, h: Handle<KnOp>, op: &KnOp) -> Result<KnOpPlan, PlanError> {
        let g = self.g;
        Ok(match &op.kind {
            KnOpKind::Input { .. } => KnOpPlan::Nothing,
            KnOpKind::Customized(_) => KnOpPlan::Customized,
            KnOpKind::Output { .. } => {
                let t = op.inputs[0];
                let j = g.outputs().iter().position(|&(o, _)| o == h).unwrap_or(0);
                if self.dt[t.index()].placement == super::plan::Placement::Output(j) {
                    return Ok(KnOpPlan::Nothing);
                }
                // The tensor lives elsewhere (a graph input, or another output): copy it.
                let s = g.tensors[t].shape;
                let strides = &self.outputs[j].strides;
                let order = iteration_order(&s, strides.innermost_dim(&s).unwrap_or(s.rank() - 1));
                let dst = View {
                    dims: order.iter().map(|&d| s.dim(d)).collect(),
                    strides: order.iter().map(|&d| strides.0[d]).collect(),
                    at: Binding::Output {
                        index: j,
                        elem_offset: 0,
                    },
                };
                let src = self.view(t, &s, &order, 0);
                self.elementwise(ElementwiseOp::Copy, dst, vec![src], g.tensors[t].dtype)
            }
            KnOpKind::Unary(u) => self.map(ElementwiseOp::Unary(*u), op.outputs[0], &op.inputs),
            KnOpKind::Binary(b) => self.map(ElementwiseOp::Binary(*b), op.outputs[0], &op.inputs),
            KnOpKind::ShiftedExp { groups: 1 } => {
                self.map(ElementwiseOp::ShiftedExp, op.outputs[0], &op.inputs)
            }
            KnOpKind::ShiftedExp { groups } => self.map_grouped(op, *groups),
            KnOpKind::AllReduce { .. } if self.gpus <= 1 => {
                self.map(ElementwiseOp::Copy, op.outputs[0], &op.inputs[..1])
            }
            KnOpKind::AllReduce { .. } => self.all_reduce(h, op)?,
            KnOpKind::Matmul => {
                let operand = |t: Handle<DTensor>| Operand {
                    shape: &g.tensors[t].shape,
                    strides: &self.dt[t.index()].strides,
                    at: self.at(t),
                };
                let (a, b, c) = (op.inputs[0], op.inputs[1], op.outputs[0]);
                let (calls, transposed) =
                    gemm_calls(&operand(a), &operand(b), &operand(c), g.tensors[c].dtype).map_err(
                        |e| PlanError::Unsupported {
                            op: h.index(),
                            name: names::kn_name(&op.kind),
                            reason: super::plan::Unsupported::Gemm(e),
                        },
                    )?;
                KnOpPlan::Gemm { calls, transposed }
            }
            KnOpKind::Reduction { dim } => self.reduction(op, *dim, Reduce::Sum),
            KnOpKind::RowMax { .. } => {
                let rank = g.tensors[op.inputs[0]].shape.rank();
                self.reduction(op, rank - 1, Reduce::Max)
            }
            KnOpKind::RmsNorm { normalized_dims } => {
                let (x, y) = (op.inputs[0], op.outputs[0]);
                let s = g.tensors[y].shape;
                let group: usize = s.dims()[s.rank() - normalized_dims..].iter().product();
                let rows = s.numel() / group;
                KnOpPlan::RmsNorm {
                    out: self.full_view(y),
                    x: self.full_view(x),
                    dtype: g.tensors[y].dtype,
                    rows,
                    group,
                    launch: GridStride::for_work(rows * 32),
                }
            }
            KnOpKind::Concat { dim } | KnOpKind::Split { dim } | KnOpKind::Chunk { dim, .. } => {
                self.parts(op, *dim)
            }
            KnOpKind::SoftmaxCombine { splits } => {
                let y = op.outputs[0];
                let ys = g.tensors[y].shape;
                let d = ys.dim(ys.rank() - 1);
                let out = self.full_view(y);
                let o = self.full_view(op.inputs[0]);
                let dtype = g.tensors[y].dtype;
                let vector = vector_len(&[&out, &o], dtype);
                let group = (d / vector).clamp(1, 32);
                let rows = ys.numel() / d;
                let mut split_lanes = 1;
                while group.is_power_of_two()
                    && group * split_lanes * 2 <= 32
                    && splits.is_multiple_of(split_lanes * 2)
                    && rows * group * split_lanes * 2 <= self.sms * COMBINE_THREADS_PER_SM
                {
                    split_lanes *= 2;
                }
                KnOpPlan::SoftmaxCombine {
                    out,
                    o,
                    l: self.full_view(op.inputs[1]),
                    m: self.full_view(op.inputs[2]),
                    dtype,
                    rows,
                    splits: *splits,
                    d,
                    vector,
                    group,
                    split_lanes,
                    launch: GridStride {
                        blocks: (rows * group * split_lanes)
                            .div_ceil(COMBINE_THREADS as usize)
                            .clamp(1, MAX_BLOCKS) as u32,
                        threads: COMBINE_THREADS,
                    },
                    form: super::combine::CombineForm::Kernel(super::combine::NoFold::NotHopper),
                }
            }
        })
    }

    /// A reduction over `dim` (its extent in the result: groups of Mirage's strided grouping
    /// for a sum, contiguous groups for a max).
    fn reduction(&self, op: &KnOp, dim: usize, of: Reduce) -> KnOpPlan {
        let g = self.g;
        let (x, y) = (op.inputs[0], op.outputs[0]);
        let (xs, ys) = (g.tensors[x].shape, g.tensors[y].shape);
        let k = xs.dim(dim) / ys.dim(dim);
        // A max over contiguous groups of the last dim: result j of a row starts at its
        // element j·k, which the runtime's index (o / TO)·TO·K + o % TO gives with TO = 1.
        let to = match of {
            Reduce::Sum => ys.dim(dim),
            Reduce::Max => 1,
        };
        let warp = k >= WARP_REDUCTION_LEN;
        KnOpPlan::Reduction {
            of,
            out: self.full_view(y),
            x: self.full_view(x),
            dtype: g.tensors[y].dtype,
            to,
            k,
            inner: ys.dims()[dim + 1..].iter().product(),
            stride: self.dt[x.index()].strides.0[dim],
            warp_per_output: warp,
            launch: GridStride::for_work(ys.numel() * if warp { 32 } else { 1 }),
        }
    }

    /// One kernel with a copy per part; the whole tensor is addressed at the part's offset
    /// along `dim`.
    fn parts(&self, op: &KnOp, dim: usize) -> KnOpPlan {
        let concat = matches!(op.kind, KnOpKind::Concat { .. });
        let (whole, parts) = if concat {
            (op.outputs[0], &op.inputs)
        } else {
            (op.inputs[0], &op.outputs)
        };
        let dtype = self.g.tensors[whole].dtype;
        let wstrides = &self.dt[whole.index()].strides.0;
        let mut offset = 0usize;
        let mut work = 0usize;
        let mut copies = Vec::new();
        for &p in parts {
            let ps = self.g.tensors[p].shape;
            let order = iteration_order(&ps, self.dt[p.index()].innermost);
            let part = self.view(p, &ps, &order, 0);
            let mut wpart = self.view(whole, &ps, &order, offset * wstrides[dim]);
            // The whole tensor's extent-1 dims are not broadcast.
            wpart.strides = order.iter().map(|&d| wstrides[d]).collect();
            let vector = vector_len(&[&part, &wpart], dtype);
            work = work.max(ps.numel() / vector);
            let whole_offset = offset * wstrides[dim];
            offset += ps.dim(dim);
            copies.push(PartCopy {
                part,
                whole: wpart,
                vector,
                whole_offset,
            });
        }
        KnOpPlan::Parts {
            concat,
            whole: self.full_view(whole),
            parts: copies,
            dtype,
            launch: GridStride::for_work(work),
        }
    }

    /// An all-reduce over the mesh: NCCL sums flat arrays, so the input and the output must
    /// have the same strides. `sched::dtensors` gives the output its input's strides (and the
    /// layout solver both one innermost dim, constraint 6 of [`crate::layout::solve`]), so the
    /// check below is a safety net. Padding between rows is summed along with the values:
    /// nothing reads it.
    fn all_reduce(&self, h: Handle<KnOp>, op: &KnOp) -> Result<KnOpPlan, PlanError> {
        let (x, y) = (op.inputs[0], op.outputs[0]);
        let (gx, gy) = (&self.dt[x.index()], &self.dt[y.index()]);
        let refuse = |reason: super::plan::Unsupported| PlanError::Unsupported {
            op: h.index(),
            name: names::kn_name(&op.kind),
            reason,
        };
        // One layout: equal strides wherever a dim has more than one element (the stride of
        // an extent-1 dim is never stepped over), hence the same element offsets.
        let shape = self.g.tensors[y].shape;
        let same =
            (0..shape.rank()).all(|d| shape.dim(d) == 1 || gx.strides.0[d] == gy.strides.0[d]);
        let span = gx.strides.span(&shape);
        let (true, Some(span)) = (same, span) else {
            return Err(refuse(super::plan::Unsupported::AllReduceLayouts {
                input: gx.strides.clone(),
                output: gy.strides.clone(),
            }));
        };
        let dt = self.g.tensors[y].dtype;
        let dtype =
            NcclDataType::of(dt).ok_or_else(|| refuse(super::plan::Unsupported::NcclType(dt)))?;
        Ok(KnOpPlan::AllReduce {
            send: self.at(x),
            recv: self.at(y),
            count: span,
            dtype,
            gpus: self.gpus,
            fused: super::exchange::AllReduceForm::Nccl(super::exchange::NotFused::Undecided),
        })
    }
}

/// Plans every kernel-level operator of `g` (customized operators are planned apart).
pub(super) fn plan_kernel_ops(
    g: &KernelGraph,
    dt: &[DTensorGeometry],
    outputs: &[IoPlan],
    target: &Target,
) -> Result<Vec<KnOpPlan>, PlanError> {
    let gpus = g.sharding.num_gpus();
    let p = Planner {
        g,
        dt,
        outputs,
        gpus,
        sms: target.typical_sms,
    };
    g.ops.iter().map(|(h, op)| p.plan(h, op)).collect()
}
