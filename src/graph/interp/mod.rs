//! The CPU reference interpreter: evaluates a validated kernel graph on host arrays in f64 with
//! the exact semantics of `mirage-graph-format.md` §4 — threadblock graphs block by block and
//! iteration by iteration, strided `redtox`, RMS without ε or weight, input strides honoured.
//! It is the oracle every later stage is checked against.

pub mod array;
pub mod budget;
mod inputs;
mod sharded;
mod threadblock;

pub use array::Array;
pub use budget::{Budget, Estimate, estimate};
pub use inputs::{InputSpec, format_scale, random_inputs};
pub use sharded::{
    ShardedRun, evaluate_ranks, evaluate_sharded, gather_outputs, global_input_shapes,
    global_output_shapes, random_global_inputs, shard_inputs,
};

use std::sync::Arc;

use crate::graph::arena::Handle;
use crate::graph::dtype::DType;
use crate::graph::error::{ErrorKind, GraphError};
use crate::graph::kernel::{DTensor, KernelGraph, KnOp, KnOpKind};
use crate::graph::ops::BinaryOp;
use crate::graph::shape::{Shape, Strides};

/// A caller buffer: values in physical order, addressed through `strides`.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    /// Logical shape.
    pub shape: Shape,
    /// Element strides.
    pub strides: Strides,
    /// The buffer (at least `strides.span(&shape)` elements).
    pub data: Vec<f64>,
}

impl HostTensor {
    /// The logical (row-major) array this buffer holds.
    pub fn to_array(&self) -> Array {
        if self.strides == self.shape.row_major_strides() && self.data.len() == self.shape.numel() {
            return Array::from_vec(self.shape, self.data.clone());
        }
        gather(self.shape, &self.strides, &self.data)
    }

    /// A row-major buffer holding `a`.
    pub fn from_array(a: &Array) -> HostTensor {
        HostTensor {
            shape: a.shape,
            strides: a.shape.row_major_strides(),
            data: a.data.clone(),
        }
    }
}

/// The logical (row-major) arrays of caller buffers, shareable by [`evaluate_shared`].
pub fn logical_arrays(inputs: &[HostTensor]) -> Vec<Arc<Array>> {
    inputs.iter().map(|h| Arc::new(h.to_array())).collect()
}

/// The logical (row-major) array held by `buffer`, a strided buffer of `shape`.
pub fn gather(shape: Shape, strides: &Strides, buffer: &[f64]) -> Array {
    let dims = shape.dims();
    let mut out = Vec::with_capacity(shape.numel());
    let mut idx = vec![0usize; dims.len()];
    for _ in 0..shape.numel() {
        let off: usize = idx.iter().zip(&strides.0).map(|(i, s)| i * s).sum();
        out.push(buffer[off]);
        for d in (0..dims.len()).rev() {
            idx[d] += 1;
            if idx[d] < dims[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    Array::from_vec(shape, out)
}

/// A tensor of the graph whose finite reference values do not fit its element type: the f64
/// reference stays finite there, but a compiled graph that stores the tensor in that type
/// overflows. (Values that are infinite in the reference itself are not counted.)
#[derive(Clone, Debug, PartialEq)]
pub struct RangeExcess {
    /// The kernel-level tensor, or the customized operator producing the tile.
    pub place: RangePlace,
    /// Its element type.
    pub dtype: DType,
    /// The largest magnitude among its reference values.
    pub max_abs: f64,
    /// The largest finite value of `dtype`.
    pub limit: f64,
}

/// Where a [`RangeExcess`] was seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RangePlace {
    /// A kernel-level tensor.
    Tensor(Handle<DTensor>),
    /// STensor `tile` (index in its threadblock graph) of the customized operator `op`. The
    /// interpreter does not know which tiles the generated code keeps in fp32 registers, so this
    /// is conservative: such a tile may overflow only in the graph's dtype, not on the GPU.
    Tile {
        /// The customized kernel operator.
        op: Handle<KnOp>,
        /// The STensor index.
        tile: usize,
    },
}

impl std::fmt::Display for RangePlace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RangePlace::Tensor(t) => write!(f, "%{}", t.index()),
            RangePlace::Tile { op, tile } => write!(f, "tile s{tile} of kernel op {}", op.index()),
        }
    }
}

/// Where the reference rounds to the graph's element types.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Rounding {
    /// Nowhere: every value is computed in f64 from the (already rounded) inputs. The oracle.
    #[default]
    Exact,
    /// Wherever a value is stored: every kernel-level tensor and every threadblock tile when it
    /// is written, and every accumulator after each update, is rounded to its dtype. Generated
    /// code rounds at a subset of these places (fused chains and register accumulators stay in
    /// fp32), so how far this reference moves from the exact one measures how sensitive an
    /// output is to storage rounding (used to judge cancellation in `mucc run --check`).
    Stored,
}

/// Evaluates `g` (which must have passed [`crate::graph::validate()`]) on `inputs`, one per graph
/// input in order. Returns the graph outputs in order, as logical arrays.
pub fn evaluate(g: &KernelGraph, inputs: &[HostTensor]) -> Result<Vec<Array>, GraphError> {
    evaluate_owned(g, inputs.to_vec())
}

/// Like [`evaluate`], on logical (row-major) input arrays that the walk shares instead of
/// copying: evaluating many graphs with the same inputs (a file's candidates) converts and
/// allocates the inputs once. Exact rounding (the oracle).
pub fn evaluate_shared(g: &KernelGraph, inputs: &[Arc<Array>]) -> Result<Vec<Array>, GraphError> {
    evaluate_shared_ranged(g, inputs).map(|(outs, _)| outs)
}

/// Like [`evaluate_shared`], and also reports the range excesses as [`evaluate_ranged`] does.
pub fn evaluate_shared_ranged(
    g: &KernelGraph,
    inputs: &[Arc<Array>],
) -> Result<(Vec<Array>, Vec<RangeExcess>), GraphError> {
    one_gpu(g)?;
    check_counts(g, inputs.len())?;
    for (i, (given, &(_, t))) in inputs.iter().zip(&g.inputs()).enumerate() {
        check_shape(i, given.shape, g.tensors[t].shape)?;
    }
    one_rank(
        g,
        inputs.iter().cloned().map(Given::Shared).collect(),
        Rounding::Exact,
    )
}

/// Refuses a graph whose mesh has more than one GPU (its all-reduces combine the ranks).
fn one_gpu(g: &KernelGraph) -> Result<(), GraphError> {
    let n = g.sharding.num_gpus();
    if n > 1 {
        return Err(GraphError::new(ErrorKind::Invalid(format!(
            "the graph runs on {n} GPUs (mesh {}); evaluate it per rank with interp::evaluate_sharded",
            g.sharding.mesh_or_single()
        ))));
    }
    Ok(())
}

/// Like [`evaluate`], but takes the inputs by value, so that dense row-major buffers become the
/// interpreter's arrays without a copy (the large attention inputs are hundreds of MB in f64).
pub fn evaluate_owned(g: &KernelGraph, inputs: Vec<HostTensor>) -> Result<Vec<Array>, GraphError> {
    evaluate_ranged(g, inputs).map(|(outs, _)| outs)
}

/// Like [`evaluate_owned`], and also reports every tensor computed by the graph (not the inputs)
/// whose values exceed the finite range of its 16/32-bit float type, in graph order.
pub fn evaluate_ranged(
    g: &KernelGraph,
    inputs: Vec<HostTensor>,
) -> Result<(Vec<Array>, Vec<RangeExcess>), GraphError> {
    evaluate_rounded(g, inputs, Rounding::Exact)
}

/// Like [`evaluate_ranged`], rounding as `rounding` says.
///
/// One GPU only: a graph whose mesh has more GPUs is evaluated with [`evaluate_sharded`] (or
/// [`evaluate_ranks`]), since its all-reduces combine the ranks.
pub fn evaluate_rounded(
    g: &KernelGraph,
    inputs: Vec<HostTensor>,
    rounding: Rounding,
) -> Result<(Vec<Array>, Vec<RangeExcess>), GraphError> {
    one_gpu(g)?;
    check_inputs(g, &inputs)?;
    one_rank(g, inputs.into_iter().map(Given::Host).collect(), rounding)
}

/// The walk of a one-GPU graph over checked inputs.
fn one_rank(
    g: &KernelGraph,
    inputs: Vec<Given>,
    rounding: Rounding,
) -> Result<(Vec<Array>, Vec<RangeExcess>), GraphError> {
    let walk = Walk::new(g, rounding);
    let mut rank = RankState::new(g, inputs);
    let mut excess = Vec::new();
    for (h, op) in g.ops.iter() {
        walk.step(h, op, &mut rank, &mut excess);
    }
    Ok((rank.outputs, excess))
}

/// The largest relative difference between the outputs of `g` and `g2` (graphs with the same
/// inputs and outputs, such as a graph and the planner's rewrite of it) on the same random
/// inputs (`seed`, scale 0.5), rounded as `rounding` says: |a − b| / max(|a|, 10⁻³), 0 where
/// both are equal (infinities too) or both NaN. For the rewrites' tests.
#[cfg(test)]
pub(crate) fn output_difference(
    g: &KernelGraph,
    g2: &KernelGraph,
    seed: u64,
    rounding: Rounding,
) -> f64 {
    let inputs = random_inputs(g, InputSpec { seed, scale: 0.5 });
    let (want, _) = evaluate_rounded(g, inputs.clone(), rounding).expect("g evaluates");
    let (got, _) = evaluate_rounded(g2, inputs, rounding).expect("g2 evaluates");
    assert_eq!(want.len(), got.len(), "output counts");
    let mut worst: f64 = 0.0;
    for (w, o) in want.iter().zip(&got) {
        assert_eq!(w.shape, o.shape, "output shapes");
        for (a, b) in w.data.iter().zip(&o.data) {
            if a == b || (a.is_nan() && b.is_nan()) {
                continue;
            }
            worst = worst.max((a - b).abs() / a.abs().max(1e-3));
        }
    }
    worst
}

/// Checks the number of inputs given against the graph's.
fn check_counts(g: &KernelGraph, given: usize) -> Result<(), GraphError> {
    let want = g.inputs().len();
    if given != want {
        return Err(GraphError::new(ErrorKind::Invalid(format!(
            "the graph has {want} inputs but {given} were given"
        ))));
    }
    Ok(())
}

/// Checks the shape of input `i` against the graph's.
fn check_shape(i: usize, given: Shape, want: Shape) -> Result<(), GraphError> {
    if given != want {
        return Err(GraphError::new(ErrorKind::Invalid(format!(
            "input {i} has shape {given}, the graph expects {want}"
        ))));
    }
    Ok(())
}

/// Checks the caller's buffers for one rank against the graph's inputs.
fn check_inputs(g: &KernelGraph, inputs: &[HostTensor]) -> Result<(), GraphError> {
    check_counts(g, inputs.len())?;
    for (i, (given, &(_, t))) in inputs.iter().zip(&g.inputs()).enumerate() {
        check_shape(i, given.shape, g.tensors[t].shape)?;
        match given.strides.span(&given.shape) {
            Some(n) if n <= given.data.len() => {}
            _ => {
                return Err(GraphError::new(ErrorKind::Invalid(format!(
                    "input {i}: a buffer of {} elements is too small for strides {}",
                    given.data.len(),
                    given.strides
                ))));
            }
        }
    }
    Ok(())
}

/// An input as the caller gave it.
enum Given {
    /// A (possibly strided) buffer, owned by the walk.
    Host(HostTensor),
    /// A logical array shared with the caller.
    Shared(Arc<Array>),
}

/// What one rank (GPU) holds while the interpreter walks the graph.
struct RankState {
    /// The rank's inputs not yet bound, in input order.
    pending: std::vec::IntoIter<Given>,
    /// The value of every live tensor.
    values: Vec<Option<Arc<Array>>>,
    /// The graph outputs produced so far.
    outputs: Vec<Array>,
}

impl RankState {
    fn new(g: &KernelGraph, inputs: Vec<Given>) -> Self {
        RankState {
            pending: inputs.into_iter(),
            values: vec![None; g.tensors.len()],
            outputs: Vec::new(),
        }
    }

    fn val(&self, t: Handle<DTensor>) -> Arc<Array> {
        self.values[t.index()]
            .clone()
            .expect("validated graphs define tensors before use")
    }
}

/// The walk over a graph's operators, shared by all ranks.
struct Walk<'g> {
    g: &'g KernelGraph,
    rounding: Rounding,
    /// Index of the last operator reading each tensor (each tensor is freed after it).
    last_use: Vec<usize>,
}

impl<'g> Walk<'g> {
    fn new(g: &'g KernelGraph, rounding: Rounding) -> Self {
        let mut last_use = vec![usize::MAX; g.tensors.len()];
        for (h, op) in g.ops.iter() {
            for &t in &op.inputs {
                last_use[t.index()] = h.index();
            }
        }
        Walk {
            g,
            rounding,
            last_use,
        }
    }

    /// Runs operator `h` on one rank. An all-reduce is the identity here (one GPU); several
    /// ranks combine theirs in [`evaluate_ranks`].
    fn step(
        &self,
        h: Handle<KnOp>,
        op: &KnOp,
        rank: &mut RankState,
        excess: &mut Vec<RangeExcess>,
    ) {
        let g = self.g;
        let rounding = self.rounding;
        let shape = |k: usize| g.tensors[op.outputs[k]].shape;
        let val = |t: Handle<DTensor>| rank.val(t);
        let result: Vec<Array> = match &op.kind {
            KnOpKind::Input { .. } => match rank.pending.next().expect("counted by check_inputs") {
                Given::Host(given) => {
                    let dense = given.shape.row_major_strides() == given.strides
                        && given.data.len() == given.shape.numel();
                    if dense {
                        vec![Array::from_vec(given.shape, given.data)]
                    } else {
                        vec![given.to_array()]
                    }
                }
                Given::Shared(a) if rounding == Rounding::Exact => {
                    self.check_range(op.outputs[0], &a, excess);
                    rank.values[op.outputs[0].index()] = Some(a);
                    vec![]
                }
                Given::Shared(a) => vec![Arc::unwrap_or_clone(a)],
            },
            KnOpKind::Output { .. } => {
                let v = val(op.inputs[0]);
                rank.outputs.push(Arc::unwrap_or_clone(v));
                vec![]
            }
            KnOpKind::Matmul => vec![Array::matmul(&val(op.inputs[0]), &val(op.inputs[1]))],
            KnOpKind::Unary(u) => vec![val(op.inputs[0]).map(|x| u.apply(x))],
            KnOpKind::Binary(b) => vec![Array::binary(
                &val(op.inputs[0]),
                &val(op.inputs[1]),
                *b,
                shape(0),
            )],
            KnOpKind::Reduction { dim } => {
                vec![val(op.inputs[0]).sum_to(*dim, shape(0).dim(*dim))]
            }
            KnOpKind::RmsNorm { normalized_dims } => {
                vec![val(op.inputs[0]).rms_norm(*normalized_dims)]
            }
            KnOpKind::ShiftedExp { groups } if *groups > 1 => {
                let (x, m) = (val(op.inputs[0]), val(op.inputs[1]));
                // Row-major: element i of x falls in group i / len of the flattened m.
                let len = x.shape.dim(x.shape.rank() - 1) / groups;
                let data = x
                    .data
                    .iter()
                    .enumerate()
                    .map(|(i, v)| (v - m.data[i / len]).exp())
                    .collect();
                vec![Array::from_vec(x.shape, data)]
            }
            KnOpKind::ShiftedExp { .. } => vec![
                Array::binary(
                    &val(op.inputs[0]),
                    &val(op.inputs[1]),
                    BinaryOp::Sub,
                    shape(0),
                )
                .map(f64::exp),
            ],
            KnOpKind::RowMax { groups } => {
                let x = val(op.inputs[0]);
                vec![x.max_over(x.shape.rank() - 1, *groups)]
            }
            KnOpKind::SoftmaxCombine { splits } => vec![val(op.inputs[0]).softmax_combine(
                &val(op.inputs[1]),
                &val(op.inputs[2]),
                *splits,
                shape(0),
            )],
            KnOpKind::Concat { dim } => {
                let parts: Vec<Arc<Array>> = op.inputs.iter().map(|&t| val(t)).collect();
                let refs: Vec<&Array> = parts.iter().map(|p| p.as_ref()).collect();
                vec![Array::concat(&refs, *dim, shape(0))]
            }
            KnOpKind::Split { dim } | KnOpKind::Chunk { dim, .. } => {
                let x = val(op.inputs[0]);
                let mut offset = 0;
                (0..op.outputs.len())
                    .map(|k| {
                        let s = shape(k);
                        let mut origin = vec![0; s.rank()];
                        origin[*dim] = offset;
                        offset += s.dim(*dim);
                        x.slice(&origin, s)
                    })
                    .collect()
            }
            KnOpKind::AllReduce { .. } => {
                // The identity on one GPU: share the input's array.
                rank.values[op.outputs[0].index()] = Some(val(op.inputs[0]));
                vec![]
            }
            KnOpKind::Customized(tb) => {
                let ins: Vec<Arc<Array>> = op.inputs.iter().map(|&t| val(t)).collect();
                let refs: Vec<&Array> = ins.iter().map(|p| p.as_ref()).collect();
                let shapes: Vec<Shape> = (0..op.outputs.len()).map(shape).collect();
                let (outs, tile_max) = threadblock::run(tb, &refs, &shapes, rounding);
                for (t, &max_abs) in tile_max.iter().enumerate() {
                    let dtype = tb.tensors.iter().nth(t).map(|(_, s)| s.dtype);
                    if let Some((dtype, limit)) = dtype.and_then(|d| d.max_finite().map(|l| (d, l)))
                        && max_abs > limit
                    {
                        excess.push(RangeExcess {
                            place: RangePlace::Tile { op: h, tile: t },
                            dtype,
                            max_abs,
                            limit,
                        });
                    }
                }
                outs
            }
        };
        for (&t, a) in op.outputs.iter().zip(result) {
            rank.values[t.index()] = Some(self.store(t, a, excess));
        }
        self.free(h, op, rank);
    }

    /// Rounds a computed value of tensor `t` as the walk's rounding says and notes whether it
    /// exceeds the range of `t`'s element type.
    fn store(&self, t: Handle<DTensor>, mut a: Array, excess: &mut Vec<RangeExcess>) -> Arc<Array> {
        let dtype = self.g.tensors[t].dtype;
        if self.rounding == Rounding::Stored {
            a.data.iter_mut().for_each(|x| *x = dtype.round(*x));
        }
        self.check_range(t, &a, excess);
        Arc::new(a)
    }

    /// Notes whether value `a` of tensor `t` exceeds the range of `t`'s element type.
    fn check_range(&self, t: Handle<DTensor>, a: &Array, excess: &mut Vec<RangeExcess>) {
        let dtype = self.g.tensors[t].dtype;
        if let Some(limit) = dtype.max_finite() {
            // Infinite reference values are infinite in the compiled code too.
            let max_abs = array::finite_max_abs(&a.data, 0.0);
            if max_abs > limit {
                excess.push(RangeExcess {
                    place: RangePlace::Tensor(t),
                    dtype,
                    max_abs,
                    limit,
                });
            }
        }
    }

    /// Frees the inputs of operator `h` that nobody reads later.
    fn free(&self, h: Handle<KnOp>, op: &KnOp, rank: &mut RankState) {
        for &t in &op.inputs {
            if self.last_use[t.index()] == h.index() {
                rank.values[t.index()] = None;
            }
        }
    }
}
