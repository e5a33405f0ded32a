//! The builder API: µGraphs written in Rust, in the style of Mirage's Python API.
//!
//! ```
//! use mucc::graph::builder::{GraphBuilder, TbGraphBuilder};
//! use mucc::graph::{AccumKind, DType};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // O = silu(X·W1) ⊙ (X·W2), split-K over a 16-iteration loop.
//! let mut g = GraphBuilder::new();
//! let x = g.new_input(&[8, 256], DType::F16)?;
//! let w1 = g.new_input(&[256, 512], DType::F16)?;
//! let w2 = g.new_input(&[256, 512], DType::F16)?;
//! let mut tb = TbGraphBuilder::new([16, 1, 1], [128, 1, 1], 16);
//! let tx = tb.new_input(&g, x, [-1, -1, -1], 1)?;
//! let t1 = tb.new_input(&g, w1, [1, -1, -1], 0)?;
//! let t2 = tb.new_input(&g, w2, [1, -1, -1], 0)?;
//! let m1 = tb.matmul(tx, t1)?;
//! let m2 = tb.matmul(tx, t2)?;
//! let a1 = tb.forloop_accum(m1, AccumKind::Nored)?;
//! let a2 = tb.forloop_accum(m2, AccumKind::Nored)?;
//! let s = tb.silu(a1)?;
//! let o = tb.mul(s, a2)?;
//! tb.new_output(o, [1, -1, -1])?;
//! let outs = g.customized(tb)?;
//! g.mark_output(outs[0])?;
//! let graph = g.build()?;
//! assert_eq!(graph.num_kernels(), 1);
//! # Ok(()) }
//! ```

use super::arena::Handle;
use super::dtype::DType;
use super::error::{ErrorKind, GraphError, Location, ValidationErrors};
use super::infer;
use super::kernel::{DTensor, KernelGraph, KnOp, KnOpKind};
use super::ops::{AccumKind, BinaryOp, DimMap, TbReduction, UnaryOp};
use super::shape::{Shape, Strides};
use super::sharding::{self, GpuMap, GpuMesh};
use super::threadblock::{STensor, TbGraph, TbOp, TbOpKind};
use super::validate::{self, check_strides};

type R<T> = Result<T, GraphError>;

fn err(op: String, kind: ErrorKind) -> GraphError {
    GraphError {
        location: Box::new(Location {
            op: Some(op),
            ..Location::default()
        }),
        kind,
    }
}

/// Builds a [`KernelGraph`]. Every method checks its operands and fails with a located error;
/// [`GraphBuilder::build`] runs full validation.
#[derive(Default)]
pub struct GraphBuilder {
    g: KernelGraph,
}

impl GraphBuilder {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    fn here(&self, name: &str) -> String {
        format!("kn_{name}_op, kernel op {} (builder)", self.g.ops.len())
    }

    fn tensor(&self, t: Handle<DTensor>, name: &str) -> R<&DTensor> {
        self.g.tensors.try_get(t).ok_or_else(|| {
            err(
                self.here(name),
                ErrorKind::Invalid(format!("tensor {t:?} does not belong to this graph")),
            )
        })
    }

    /// The shape of `t`.
    pub fn shape(&self, t: Handle<DTensor>) -> Option<Shape> {
        self.g.tensors.try_get(t).map(|d| d.shape)
    }

    /// The element type of `t`.
    pub fn dtype(&self, t: Handle<DTensor>) -> Option<DType> {
        self.g.tensors.try_get(t).map(|d| d.dtype)
    }

    fn push(
        &mut self,
        kind: KnOpKind,
        inputs: Vec<Handle<DTensor>>,
        outs: Vec<(Shape, DType)>,
    ) -> Vec<Handle<DTensor>> {
        let outputs: Vec<Handle<DTensor>> = outs
            .into_iter()
            .map(|(shape, dtype)| {
                self.g.tensors.append(DTensor {
                    shape,
                    dtype,
                    guid: None,
                })
            })
            .collect();
        self.g.ops.append(KnOp {
            kind,
            inputs,
            outputs: outputs.clone(),
        });
        outputs
    }

    fn same_dtype(&self, name: &str, ts: &[Handle<DTensor>]) -> R<DType> {
        let first = self.tensor(ts[0], name)?.dtype;
        for &t in &ts[1..] {
            let d = self.tensor(t, name)?.dtype;
            if d != first {
                return Err(err(
                    self.here(name),
                    ErrorKind::DtypeMismatch {
                        expected: first,
                        found: d,
                    },
                ));
            }
        }
        Ok(first)
    }

    /// A graph input with row-major strides.
    pub fn new_input(&mut self, dims: &[usize], dtype: DType) -> R<Handle<DTensor>> {
        let shape = Shape::new(dims).ok_or_else(|| {
            err(
                self.here("input"),
                ErrorKind::BadValue(format!("a tensor needs 1 to 4 dims, got {}", dims.len())),
            )
        })?;
        self.new_input_strided(dims, shape.row_major_strides().as_slice(), dtype)
    }

    /// A graph input whose caller buffer has the given element strides (e.g. `[1, rows]` for a
    /// column-major matrix).
    pub fn new_input_strided(
        &mut self,
        dims: &[usize],
        strides: &[usize],
        dtype: DType,
    ) -> R<Handle<DTensor>> {
        let shape = Shape::new(dims).ok_or_else(|| {
            err(
                self.here("input"),
                ErrorKind::BadValue(format!("a tensor needs 1 to 4 dims, got {}", dims.len())),
            )
        })?;
        let strides = Strides(strides.to_vec());
        if let Some(e) = check_strides(&strides, &shape, dtype) {
            return Err(err(self.here("input"), e));
        }
        Ok(self.push(KnOpKind::Input { strides }, vec![], vec![(shape, dtype)])[0])
    }

    /// Sets the GPU mesh the graph runs on (Mirage's `gpu_dim`; `GpuMesh::line(n)` for `n`
    /// GPUs). Needed before [`GraphBuilder::new_input_sharded`]; it cannot change once a
    /// partitioned input has been declared, since the per-GPU shapes depend on it.
    pub fn set_gpu_mesh(&mut self, mesh: GpuMesh) -> R<()> {
        let here = format!("GPU mesh, before kernel op {} (builder)", self.g.ops.len());
        mesh.check().map_err(|e| err(here.clone(), e))?;
        if self.g.sharding.is_partitioned() && self.g.sharding.mesh != Some(mesh) {
            return Err(err(
                here,
                ErrorKind::Invalid(format!(
                    "the graph already partitions tensors over the GPU mesh {}; the mesh cannot change",
                    self.g.sharding.mesh_or_single()
                )),
            ));
        }
        self.g.sharding.mesh = Some(mesh);
        Ok(())
    }

    /// A graph input partitioned across the GPU mesh (Mirage's `input_map`): `global_dims` is
    /// the shape of the whole tensor; mesh axis a with `map[a] = d` (−1: replicated) cuts dim `d`
    /// into equal consecutive pieces, one per GPU along that axis. The graph's tensor is the
    /// per-GPU shard (row-major). Fails if the mesh is unset, a map entry is not a dim, two
    /// axes name one dim, or an axis's GPU count does not divide its dim.
    pub fn new_input_sharded(
        &mut self,
        global_dims: &[usize],
        dtype: DType,
        map: impl Into<GpuMap>,
    ) -> R<Handle<DTensor>> {
        let map = map.into();
        let here = self.here("input");
        let global = Shape::new(global_dims).ok_or_else(|| {
            err(
                here.clone(),
                ErrorKind::BadValue(format!(
                    "a tensor needs 1 to 4 dims, got {}",
                    global_dims.len()
                )),
            )
        })?;
        let Some(mesh) = self.g.sharding.mesh else {
            return Err(err(
                here,
                ErrorKind::GpuCountUnknown(format!(
                    "input_map {map} partitions the tensor across GPUs, but the GPU mesh is not set (call set_gpu_mesh first)"
                )),
            ));
        };
        let local = sharding::local_shape(&global, map, mesh).map_err(|e| err(here, e))?;
        let t = self.new_input(local.dims(), dtype)?;
        let op = Handle::from_index(self.g.ops.len() - 1);
        self.g.sharding.set_map(op, map);
        Ok(t)
    }

    /// Marks `t` as the next graph output, assembled across the GPU mesh by `map` (Mirage's
    /// `output_map`): the per-GPU tensors side by side along the dims `map` names, and along an
    /// unmapped axis (−1) the first GPU's copy.
    pub fn mark_output_sharded(&mut self, t: Handle<DTensor>, map: impl Into<GpuMap>) -> R<()> {
        let map = map.into();
        let d = self.tensor(t, "output")?;
        sharding::check_map(map, &d.shape).map_err(|e| err(self.here("output"), e))?;
        if map != DimMap::NONE && self.g.sharding.mesh.is_none() {
            return Err(err(
                self.here("output"),
                ErrorKind::GpuCountUnknown(format!(
                    "output_map {map} gathers the tensor across GPUs, but the GPU mesh is not set (call set_gpu_mesh first)"
                )),
            ));
        }
        self.mark_output(t)?;
        let op = Handle::from_index(self.g.ops.len() - 1);
        self.g.sharding.set_map(op, map);
        Ok(())
    }

    /// Marks `t` as the next graph output (layout chosen by mucc).
    pub fn mark_output(&mut self, t: Handle<DTensor>) -> R<()> {
        self.tensor(t, "output")?;
        self.push(KnOpKind::Output { strides: None }, vec![t], vec![]);
        Ok(())
    }

    /// Marks `t` as the next graph output, written with the given element strides.
    pub fn mark_output_strided(&mut self, t: Handle<DTensor>, strides: &[usize]) -> R<()> {
        let d = self.tensor(t, "output")?;
        let strides = Strides(strides.to_vec());
        if let Some(e) = check_strides(&strides, &d.shape, d.dtype) {
            return Err(err(self.here("output"), e));
        }
        self.push(
            KnOpKind::Output {
                strides: Some(strides),
            },
            vec![t],
            vec![],
        );
        Ok(())
    }

    /// Batched matrix product A·B over the last two dims.
    pub fn matmul(&mut self, a: Handle<DTensor>, b: Handle<DTensor>) -> R<Handle<DTensor>> {
        let dt = self.same_dtype("matmul", &[a, b])?;
        let s = infer::matmul(&self.g.tensors[a].shape, &self.g.tensors[b].shape, false)
            .map_err(|e| err(self.here("matmul"), e))?;
        Ok(self.push(KnOpKind::Matmul, vec![a, b], vec![(s, dt)])[0])
    }

    /// Any element-wise unary operator.
    pub fn unary(&mut self, op: UnaryOp, x: Handle<DTensor>) -> R<Handle<DTensor>> {
        let d = self.tensor(x, op.name())?.clone();
        Ok(self.push(KnOpKind::Unary(op), vec![x], vec![(d.shape, d.dtype)])[0])
    }

    /// Any element-wise binary operator (broadcasting equal-rank shapes).
    pub fn binary(
        &mut self,
        op: BinaryOp,
        a: Handle<DTensor>,
        b: Handle<DTensor>,
    ) -> R<Handle<DTensor>> {
        let dt = self.same_dtype(op.name(), &[a, b])?;
        let s = infer::binary(&self.g.tensors[a].shape, &self.g.tensors[b].shape)
            .map_err(|e| err(self.here(op.name()), e))?;
        Ok(self.push(KnOpKind::Binary(op), vec![a, b], vec![(s, dt)])[0])
    }

    /// Sum over `dim` (the dim becomes 1).
    pub fn reduction(&mut self, x: Handle<DTensor>, dim: usize) -> R<Handle<DTensor>> {
        self.reduction_to(x, dim, 1)
    }

    /// Grouped sum over `dim` down to extent `to` (strided grouping, as redtox).
    pub fn reduction_to(
        &mut self,
        x: Handle<DTensor>,
        dim: usize,
        to: usize,
    ) -> R<Handle<DTensor>> {
        let name = format!("reduction_{dim}");
        let d = self.tensor(x, &name)?.clone();
        let s = infer::kn_reduction(&d.shape, dim, to).map_err(|e| err(self.here(&name), e))?;
        Ok(self.push(KnOpKind::Reduction { dim }, vec![x], vec![(s, d.dtype)])[0])
    }

    /// x / sqrt(mean(x²)) over the trailing `normalized_dims` dims.
    pub fn rms_norm(&mut self, x: Handle<DTensor>, normalized_dims: usize) -> R<Handle<DTensor>> {
        let d = self.tensor(x, "rms_norm")?.clone();
        if normalized_dims == 0 || normalized_dims > d.shape.rank() {
            return Err(err(
                self.here("rms_norm"),
                ErrorKind::BadValue(format!(
                    "cannot normalise {normalized_dims} trailing dims of {}",
                    d.shape
                )),
            ));
        }
        Ok(self.push(
            KnOpKind::RmsNorm { normalized_dims },
            vec![x],
            vec![(d.shape, d.dtype)],
        )[0])
    }

    /// Concatenation along `dim`.
    pub fn concat(&mut self, parts: &[Handle<DTensor>], dim: usize) -> R<Handle<DTensor>> {
        let name = format!("concat_{dim}");
        if parts.len() < 2 {
            return Err(err(
                self.here(&name),
                ErrorKind::Arity {
                    what: "inputs",
                    expected: "at least 2".into(),
                    found: parts.len(),
                },
            ));
        }
        let dt = self.same_dtype(&name, parts)?;
        let shapes: Vec<Shape> = parts.iter().map(|&p| self.g.tensors[p].shape).collect();
        let s = infer::concat(&shapes, dim).map_err(|e| err(self.here(&name), e))?;
        Ok(self.push(KnOpKind::Concat { dim }, parts.to_vec(), vec![(s, dt)])[0])
    }

    /// Splits `x` along `dim` into consecutive pieces of the given extents.
    pub fn split(
        &mut self,
        x: Handle<DTensor>,
        dim: usize,
        sizes: &[usize],
    ) -> R<Vec<Handle<DTensor>>> {
        let name = format!("split_{dim}");
        let d = self.tensor(x, &name)?.clone();
        infer::check_dim(&d.shape, dim, "split dim").map_err(|e| err(self.here(&name), e))?;
        if sizes.is_empty() || sizes.contains(&0) || sizes.iter().sum::<usize>() != d.shape.dim(dim)
        {
            return Err(err(
                self.here(&name),
                ErrorKind::Operands(format!(
                    "split sizes {sizes:?} do not add up to extent {} of dim {dim}",
                    d.shape.dim(dim)
                )),
            ));
        }
        let outs = sizes
            .iter()
            .map(|&n| (d.shape.with_dim(dim, n), d.dtype))
            .collect();
        Ok(self.push(KnOpKind::Split { dim }, vec![x], outs))
    }

    /// Splits `x` along `dim` into `chunks` equal pieces.
    pub fn chunk(
        &mut self,
        x: Handle<DTensor>,
        dim: usize,
        chunks: usize,
    ) -> R<Vec<Handle<DTensor>>> {
        let name = format!("chunk_{dim}");
        let d = self.tensor(x, &name)?.clone();
        infer::check_dim(&d.shape, dim, "chunk dim").map_err(|e| err(self.here(&name), e))?;
        let e = d.shape.dim(dim);
        if chunks == 0 || e % chunks != 0 {
            return Err(err(
                self.here(&name),
                ErrorKind::NotDivisible {
                    what: "chunk".into(),
                    dim,
                    extent: e,
                    by: chunks,
                },
            ));
        }
        let outs = (0..chunks)
            .map(|_| (d.shape.with_dim(dim, e / chunks), d.dtype))
            .collect();
        Ok(self.push(
            KnOpKind::Chunk {
                dim,
                chunk_size: chunks,
            },
            vec![x],
            outs,
        ))
    }

    /// All-reduce across the GPU mesh: on every GPU, the element-wise sum of `x` over all GPUs
    /// (Mirage's `kn_allreduce_op`; the identity on one GPU).
    pub fn all_reduce(&mut self, x: Handle<DTensor>) -> R<Handle<DTensor>> {
        let d = self.tensor(x, "allreduce")?.clone();
        Ok(self.push(
            KnOpKind::AllReduce { inplace: false },
            vec![x],
            vec![(d.shape, d.dtype)],
        )[0])
    }

    /// A customized operator running `tb`; returns its outputs in `new_output` order.
    pub fn customized(&mut self, tb: TbGraphBuilder) -> R<Vec<Handle<DTensor>>> {
        let here = self.here("customized");
        for &(t, shape, dtype) in &tb.inputs {
            match self.g.tensors.try_get(t) {
                Some(d) if d.shape == shape && d.dtype == dtype => {}
                _ => {
                    return Err(err(
                        here,
                        ErrorKind::Invalid(format!(
                            "the threadblock graph reads tensor {t:?}, which is not a tensor of this graph"
                        )),
                    ));
                }
            }
        }
        if tb.outputs.is_empty() {
            return Err(err(
                here,
                ErrorKind::Arity {
                    what: "outputs",
                    expected: "at least 1".into(),
                    found: 0,
                },
            ));
        }
        let inputs = tb.inputs.iter().map(|&(t, _, _)| t).collect();
        Ok(self.push(KnOpKind::Customized(Box::new(tb.tb)), inputs, tb.outputs))
    }

    /// A copy of the graph built so far, not validated (outputs may still be unmarked).
    pub fn snapshot(&self) -> KernelGraph {
        self.g.clone()
    }

    /// Validates and returns the graph.
    pub fn build(self) -> Result<KernelGraph, ValidationErrors> {
        validate::validate(&self.g, None)?;
        Ok(self.g)
    }
}

macro_rules! unary_methods {
    ($ty:ty, $ret:ty, $($name:ident => $op:expr),* $(,)?) => {
        impl $ty {
            $(
                #[doc = concat!("Element-wise `", stringify!($name), "`.")]
                pub fn $name(&mut self, x: $ret) -> R<$ret> {
                    self.unary($op, x)
                }
            )*
        }
    };
}

macro_rules! binary_methods {
    ($ty:ty, $ret:ty, $($name:ident => $op:expr),* $(,)?) => {
        impl $ty {
            $(
                #[doc = concat!("Element-wise `", stringify!($name), "` with broadcasting.")]
                pub fn $name(&mut self, a: $ret, b: $ret) -> R<$ret> {
                    self.binary($op, a, b)
                }
            )*
        }
    };
}

unary_methods!(GraphBuilder, Handle<DTensor>,
    exp => UnaryOp::Exp, square => UnaryOp::Square, sqrt => UnaryOp::Sqrt, silu => UnaryOp::Silu,
    sigmoid => UnaryOp::Sigmoid, gelu => UnaryOp::Gelu, relu => UnaryOp::Relu, log => UnaryOp::Log);
binary_methods!(GraphBuilder, Handle<DTensor>,
    add => BinaryOp::Add, sub => BinaryOp::Sub, mul => BinaryOp::Mul, div => BinaryOp::Div, pow => BinaryOp::Pow);
unary_methods!(TbGraphBuilder, Handle<STensor>,
    exp => UnaryOp::Exp, square => UnaryOp::Square, sqrt => UnaryOp::Sqrt, silu => UnaryOp::Silu,
    sigmoid => UnaryOp::Sigmoid, gelu => UnaryOp::Gelu, relu => UnaryOp::Relu, log => UnaryOp::Log);
binary_methods!(TbGraphBuilder, Handle<STensor>,
    add => BinaryOp::Add, sub => BinaryOp::Sub, mul => BinaryOp::Mul, div => BinaryOp::Div, pow => BinaryOp::Pow);

impl GraphBuilder {
    /// clamp(x, min, max).
    pub fn clamp(&mut self, x: Handle<DTensor>, min: f64, max: f64) -> R<Handle<DTensor>> {
        self.unary(UnaryOp::Clamp { min, max }, x)
    }

    /// s·x.
    pub fn mul_scalar(&mut self, x: Handle<DTensor>, s: f64) -> R<Handle<DTensor>> {
        self.unary(UnaryOp::MulScalar(s), x)
    }
}

/// Builds the threadblock graph of a customized operator (Mirage's `new_threadblock_graph`).
pub struct TbGraphBuilder {
    tb: TbGraph,
    /// The DTensors read, with the shape and type seen when they were bound.
    inputs: Vec<(Handle<DTensor>, Shape, DType)>,
    /// Shapes and types of the customized operator's outputs.
    outputs: Vec<(Shape, DType)>,
}

impl TbGraphBuilder {
    /// A threadblock graph with `grid` blocks of `block` threads and a loop of `forloop_range`
    /// iterations; `reduction_dimx` is 64 (Mirage's default).
    pub fn new(grid: [usize; 3], block: [usize; 3], forloop_range: usize) -> Self {
        TbGraphBuilder {
            tb: TbGraph::new(grid, block, forloop_range, 64),
            inputs: Vec::new(),
            outputs: Vec::new(),
        }
    }

    /// The threadblock graph built so far.
    pub fn graph(&self) -> &TbGraph {
        &self.tb
    }

    /// The DTensors the threadblock graph's inputs read, in `new_input` order (the operands
    /// of its customized operator).
    pub fn input_tensors(&self) -> Vec<Handle<DTensor>> {
        self.inputs.iter().map(|&(t, _, _)| t).collect()
    }

    /// The element type of tile `t`, if it belongs to this graph.
    pub fn tile_dtype(&self, t: Handle<STensor>) -> Option<DType> {
        self.tb.tensors.try_get(t).map(|s| s.dtype)
    }

    /// The grid.
    pub fn grid(&self) -> [usize; 3] {
        self.tb.grid
    }

    /// The shape of tile `t`, if it belongs to this graph.
    pub fn tile_shape(&self, t: Handle<STensor>) -> Option<Shape> {
        self.tb.tensors.try_get(t).map(|s| s.shape)
    }

    /// Sets the target extent of to-dimx reductions and redtox accumulators.
    pub fn with_reduction_dimx(mut self, dimx: usize) -> Self {
        self.tb.reduction_dimx = dimx;
        self
    }

    fn here(&self, name: &str) -> String {
        format!("tb_{name}_op, operator {} (builder)", self.tb.ops.len())
    }

    fn tile(&self, t: Handle<STensor>, name: &str) -> R<STensor> {
        self.tb.tensors.try_get(t).cloned().ok_or_else(|| {
            err(
                self.here(name),
                ErrorKind::Invalid(format!(
                    "tile {t:?} does not belong to this threadblock graph"
                )),
            )
        })
    }

    fn push(
        &mut self,
        kind: TbOpKind,
        inputs: Vec<Handle<STensor>>,
        outs: Vec<(Shape, DType, bool)>,
    ) -> Vec<Handle<STensor>> {
        let outputs: Vec<Handle<STensor>> = outs
            .into_iter()
            .map(|(shape, dtype, after_accum)| {
                self.tb.tensors.append(STensor {
                    shape,
                    dtype,
                    after_accum,
                    guid: None,
                })
            })
            .collect();
        self.tb.ops.append(TbOp {
            kind,
            inputs,
            outputs: outputs.clone(),
        });
        outputs
    }

    /// Operand tiles with one dtype and one `after_accum` flag.
    fn operands(&self, name: &str, ts: &[Handle<STensor>]) -> R<(Vec<STensor>, DType, bool)> {
        let tiles: Vec<STensor> = ts.iter().map(|&t| self.tile(t, name)).collect::<R<_>>()?;
        let (dt, after) = (tiles[0].dtype, tiles[0].after_accum);
        for t in &tiles[1..] {
            if t.dtype != dt {
                return Err(err(
                    self.here(name),
                    ErrorKind::DtypeMismatch {
                        expected: dt,
                        found: t.dtype,
                    },
                ));
            }
            if t.after_accum != after {
                return Err(err(self.here(name), ErrorKind::MixedAfterAccum));
            }
        }
        Ok((tiles, dt, after))
    }

    /// Loads tiles of `dtensor` (a tensor of `g`): grid axes split the dims `imap` names (−1:
    /// replicated), and the loop walks `forloop_dim` (−1: the same tile every iteration).
    pub fn new_input(
        &mut self,
        g: &GraphBuilder,
        dtensor: Handle<DTensor>,
        imap: impl Into<DimMap>,
        forloop_dim: i32,
    ) -> R<Handle<STensor>> {
        let d = g.tensor(dtensor, "input").map_err(|mut e| {
            e.location.op = Some(self.here("input"));
            e
        })?;
        let imap = imap.into();
        let f = usize::try_from(forloop_dim).ok();
        let s = infer::tb_input(&d.shape, self.tb.grid, imap, f, self.tb.forloop_range)
            .map_err(|e| err(self.here("input"), e))?;
        let input = self.inputs.len();
        self.inputs.push((dtensor, d.shape, d.dtype));
        Ok(self.push(
            TbOpKind::Input {
                input,
                imap,
                forloop_dim: f,
            },
            vec![],
            vec![(s, d.dtype, false)],
        )[0])
    }

    /// Like [`TbGraphBuilder::new_input`] for a tensor given by its shape and type rather than
    /// by a [`GraphBuilder`] (rewrites that build a threadblock graph over an existing kernel
    /// graph; [`TbGraphBuilder::into_parts`] returns what the customized operator reads).
    pub(crate) fn new_input_of(
        &mut self,
        dtensor: Handle<DTensor>,
        shape: Shape,
        dtype: DType,
        imap: DimMap,
        forloop_dim: Option<usize>,
    ) -> R<Handle<STensor>> {
        let s = infer::tb_input(
            &shape,
            self.tb.grid,
            imap,
            forloop_dim,
            self.tb.forloop_range,
        )
        .map_err(|e| err(self.here("input"), e))?;
        let input = self.inputs.len();
        self.inputs.push((dtensor, shape, dtype));
        Ok(self.push(
            TbOpKind::Input {
                input,
                imap,
                forloop_dim,
            },
            vec![],
            vec![(s, dtype, false)],
        )[0])
    }

    /// The threadblock graph, the tensors its inputs read (in input order) and the shapes and
    /// types of its outputs (in output order).
    pub(crate) fn into_parts(self) -> (TbGraph, Vec<Handle<DTensor>>, Vec<(Shape, DType)>) {
        let inputs = self.inputs.iter().map(|&(t, _, _)| t).collect();
        (self.tb, inputs, self.outputs)
    }

    /// Stores the after-loop tile `s`; grid axes place it along the dims `omap` names.
    pub fn new_output(&mut self, s: Handle<STensor>, omap: impl Into<DimMap>) -> R<()> {
        let t = self.tile(s, "output")?;
        if !t.after_accum {
            return Err(err(
                self.here("output"),
                ErrorKind::Invalid(
                    "an output must store an after-loop tile (pass it through forloop_accum)"
                        .into(),
                ),
            ));
        }
        let omap = omap.into();
        let o = infer::tb_output(&t.shape, self.tb.grid, omap)
            .map_err(|e| err(self.here("output"), e))?;
        let output = self.outputs.len();
        self.outputs.push((o, t.dtype));
        self.push(TbOpKind::Output { output, omap }, vec![s], vec![]);
        Ok(())
    }

    /// C = A·B over the last two dims.
    pub fn matmul(&mut self, a: Handle<STensor>, b: Handle<STensor>) -> R<Handle<STensor>> {
        let (t, dt, after) = self.operands("matmul", &[a, b])?;
        let s = infer::matmul(&t[0].shape, &t[1].shape, true)
            .map_err(|e| err(self.here("matmul"), e))?;
        Ok(self.push(TbOpKind::Matmul, vec![a, b], vec![(s, dt, after)])[0])
    }

    /// Any element-wise unary operator.
    pub fn unary(&mut self, op: UnaryOp, x: Handle<STensor>) -> R<Handle<STensor>> {
        let t = self.tile(x, op.name())?;
        Ok(self.push(
            TbOpKind::Unary(op),
            vec![x],
            vec![(t.shape, t.dtype, t.after_accum)],
        )[0])
    }

    /// clamp(x, min, max).
    pub fn clamp(&mut self, x: Handle<STensor>, min: f64, max: f64) -> R<Handle<STensor>> {
        self.unary(UnaryOp::Clamp { min, max }, x)
    }

    /// s·x.
    pub fn mul_scalar(&mut self, x: Handle<STensor>, s: f64) -> R<Handle<STensor>> {
        self.unary(UnaryOp::MulScalar(s), x)
    }

    /// Any element-wise binary operator.
    pub fn binary(
        &mut self,
        op: BinaryOp,
        a: Handle<STensor>,
        b: Handle<STensor>,
    ) -> R<Handle<STensor>> {
        let (t, dt, after) = self.operands(op.name(), &[a, b])?;
        let s =
            infer::binary(&t[0].shape, &t[1].shape).map_err(|e| err(self.here(op.name()), e))?;
        Ok(self.push(TbOpKind::Binary(op), vec![a, b], vec![(s, dt, after)])[0])
    }

    fn reduce(
        &mut self,
        x: Handle<STensor>,
        dim: usize,
        kind: TbReduction,
    ) -> R<Vec<Handle<STensor>>> {
        let name = format!("reduction_{dim}");
        let t = self.tile(x, &name)?;
        let s = infer::tb_reduction(&t.shape, dim, kind, self.tb.reduction_dimx)
            .map_err(|e| err(self.here(&name), e))?;
        let n = if kind == TbReduction::Max { 2 } else { 1 };
        Ok(self.push(
            TbOpKind::Reduction { dim, kind },
            vec![x],
            vec![(s, t.dtype, t.after_accum); n],
        ))
    }

    /// Sum over `dim` (the dim becomes 1).
    pub fn reduction(&mut self, x: Handle<STensor>, dim: usize) -> R<Handle<STensor>> {
        Ok(self.reduce(x, dim, TbReduction::Sum)?[0])
    }

    /// Strided grouped sum over `dim` down to `reduction_dimx`.
    pub fn reduction_to_dimx(&mut self, x: Handle<STensor>, dim: usize) -> R<Handle<STensor>> {
        Ok(self.reduce(x, dim, TbReduction::ToDimx)?[0])
    }

    /// Running max over `dim` across iterations: (new max, previous max − new max).
    pub fn reduction_max(
        &mut self,
        x: Handle<STensor>,
        dim: usize,
    ) -> R<(Handle<STensor>, Handle<STensor>)> {
        let v = self.reduce(x, dim, TbReduction::Max)?;
        Ok((v[0], v[1]))
    }

    /// Max over `dim` of this iteration's tile alone (no state across iterations).
    pub fn reduction_plain_max(&mut self, x: Handle<STensor>, dim: usize) -> R<Handle<STensor>> {
        Ok(self.reduce(x, dim, TbReduction::PlainMax)?[0])
    }

    /// x / sqrt(mean of x² over the tile's last dim).
    pub fn rms_norm(&mut self, x: Handle<STensor>) -> R<Handle<STensor>> {
        let t = self.tile(x, "rms_norm")?;
        Ok(self.push(
            TbOpKind::RmsNorm,
            vec![x],
            vec![(t.shape, t.dtype, t.after_accum)],
        )[0])
    }

    /// A followed by B along `dim`.
    pub fn concat(
        &mut self,
        a: Handle<STensor>,
        b: Handle<STensor>,
        dim: usize,
    ) -> R<Handle<STensor>> {
        let name = format!("concat_{dim}");
        let (t, dt, after) = self.operands(&name, &[a, b])?;
        let s =
            infer::concat(&[t[0].shape, t[1].shape], dim).map_err(|e| err(self.here(&name), e))?;
        Ok(self.push(TbOpKind::Concat { dim }, vec![a, b], vec![(s, dt, after)])[0])
    }

    /// A for-loop accumulator of one input (every kind except the rescale ones).
    pub fn forloop_accum(&mut self, x: Handle<STensor>, kind: AccumKind) -> R<Handle<STensor>> {
        self.accum(kind, &[x])
    }

    /// A rescaling for-loop accumulator: A ← A·r + (reduced) x.
    pub fn forloop_accum_rescale(
        &mut self,
        x: Handle<STensor>,
        r: Handle<STensor>,
        kind: AccumKind,
    ) -> R<Handle<STensor>> {
        self.accum(kind, &[x, r])
    }

    fn accum(&mut self, kind: AccumKind, ins: &[Handle<STensor>]) -> R<Handle<STensor>> {
        let name = format!("forloop_accum_{}", kind.name());
        if ins.len() != kind.num_inputs() {
            return Err(err(
                self.here(&name),
                ErrorKind::Arity {
                    what: "inputs",
                    expected: kind.num_inputs().to_string(),
                    found: ins.len(),
                },
            ));
        }
        let (t, dt, after) = self.operands(&name, ins)?;
        if after {
            return Err(err(
                self.here(&name),
                ErrorKind::Invalid("a for-loop accumulator's inputs must be in-loop tiles".into()),
            ));
        }
        let s = infer::accum(
            kind,
            &t[0].shape,
            t.get(1).map(|r| &r.shape),
            self.tb.reduction_dimx,
        )
        .map_err(|e| err(self.here(&name), e))?;
        Ok(self.push(TbOpKind::Accum(kind), ins.to_vec(), vec![(s, dt, true)])[0])
    }
}
