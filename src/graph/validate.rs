//! Validation: the one pass that decides whether a kernel graph is well formed. Front ends (the
//! JSON importer, the builder) may be permissive; every later stage assumes a graph that passed
//! [`validate`] and never re-checks what it guarantees:
//!
//! - handles refer to existing tensors; every tensor is defined exactly once, before any use;
//! - element types are supported and equal across each operator;
//! - shapes have 1–4 dims, every extent ≥ 1, and each result's recorded shape is the shape its
//!   operator computes (§4 of the format reference);
//! - input and output strides have one entry per dim and never alias two elements;
//! - threadblock graphs: grid/block within CUDA limits, for-loop ≥ 1, partitions divide their
//!   extents, no two grid axes split one dim, every grid axis with more than one block is mapped
//!   by every output map, each customized input/output is bound by exactly one input/output
//!   operator of matching type, `after_accum` flags are consistent and never mixed;
//! - there is at least one graph output;
//! - multi-GPU: the GPU mesh has 1 to [`sharding::MAX_GPUS`] GPUs; only graph inputs and
//!   outputs carry GPU maps; each map names dims of its tensor, no two mesh axes name one dim,
//!   and a graph that partitions a tensor has a known mesh.

use petgraph::algo::toposort;
use petgraph::graphmap::DiGraphMap;

use super::arena::Handle;
use super::dtype::DType;
use super::error::{ErrorKind, GraphError, Location, ValidationErrors};
use super::infer;
use super::kernel::{DTensor, KernelGraph, KnOp, KnOpKind};
use super::ops::{DimMap, TbReduction, UnaryOp};
use super::shape::{Shape, Strides};
use super::sharding::{self, GpuMesh};
use super::source::{Slot, SourceMap, bgraph_location, err_at, kn_location, tb_location};
use super::threadblock::{STensor, TbGraph, TbOp, TbOpKind};

/// Largest number of bytes one tensor may span (2⁴⁰); guards index arithmetic everywhere.
pub const MAX_TENSOR_BYTES: usize = 1 << 40;

/// CUDA's grid limits (x, y, z).
pub const MAX_GRID: [usize; 3] = [(1 << 31) - 1, 65535, 65535];
/// CUDA's block limits (x, y, z) and threads per block.
pub const MAX_BLOCK: [usize; 3] = [1024, 1024, 64];
/// CUDA's limit on threads per block.
pub const MAX_THREADS: usize = 1024;

/// Validates `g`; `src` (if the graph came from a file) lets errors name JSON paths.
pub fn validate(g: &KernelGraph, src: Option<&SourceMap>) -> Result<(), ValidationErrors> {
    let mut v = Validator {
        g,
        src,
        errors: Vec::new(),
    };
    v.run();
    if v.errors.is_empty() {
        Ok(())
    } else {
        Err(ValidationErrors(v.errors))
    }
}

struct Validator<'a> {
    g: &'a KernelGraph,
    src: Option<&'a SourceMap>,
    errors: Vec<GraphError>,
}

/// Checks common to DTensors and STensors.
fn check_tensor(shape: &Shape, dtype: DType) -> Option<ErrorKind> {
    if !dtype.is_supported() {
        return Some(ErrorKind::UnsupportedDtype(dtype));
    }
    if let Some(d) = shape.dims().iter().position(|&e| e == 0) {
        return Some(ErrorKind::BadValue(format!(
            "dim {d} of shape {shape} is 0 (empty tensors are not allowed)"
        )));
    }
    let bytes = shape.numel().saturating_mul(dtype.bytes());
    if bytes > MAX_TENSOR_BYTES {
        return Some(ErrorKind::BadValue(format!(
            "shape {shape} is too large ({bytes} bytes; the limit is 2^40)"
        )));
    }
    None
}

/// Checks user strides for `shape`.
pub fn check_strides(strides: &Strides, shape: &Shape, dtype: DType) -> Option<ErrorKind> {
    let bad = |reason: String| {
        Some(ErrorKind::BadStrides {
            strides: strides.to_string(),
            reason,
        })
    };
    if strides.0.len() != shape.rank() {
        return bad(format!(
            "{} strides for a {}-dim tensor {shape}",
            strides.0.len(),
            shape.rank()
        ));
    }
    match strides.span(shape) {
        Some(n) if n.saturating_mul(dtype.bytes()) <= MAX_TENSOR_BYTES => {}
        _ => return bad("the buffer they describe is larger than 2^40 bytes".into()),
    }
    if !strides.is_non_overlapping(shape) {
        return bad(format!(
            "two elements of {shape} would share an address (ordered by stride, each stride must be at least the previous stride times its extent)"
        ));
    }
    None
}

impl<'a> Validator<'a> {
    fn push(&mut self, location: Location, kind: ErrorKind) {
        self.errors.push(err_at(location, kind));
    }

    fn kn_loc(&self, op: Handle<KnOp>, slot: Slot) -> Location {
        kn_location(self.g, self.src, op, slot)
    }

    fn run(&mut self) {
        let g = self.g;
        let n = g.tensors.len();
        let mut defined = vec![false; n];
        let mut dangling = false;
        for (h, op) in g.ops.iter() {
            for (k, &t) in op.inputs.iter().enumerate() {
                if t.index() >= n {
                    self.push(
                        self.kn_loc(h, Slot::Input(k)),
                        ErrorKind::Invalid("input refers to a tensor that does not exist".into()),
                    );
                    dangling = true;
                } else if !defined[t.index()] {
                    self.push(
                        self.kn_loc(h, Slot::Input(k)),
                        ErrorKind::Invalid(
                            "input is not defined by an earlier operator (graphs must be in topological order)"
                                .into(),
                        ),
                    );
                    dangling = true;
                }
            }
            for (k, &t) in op.outputs.iter().enumerate() {
                if t.index() >= n {
                    self.push(
                        self.kn_loc(h, Slot::Output(k)),
                        ErrorKind::Invalid("output refers to a tensor that does not exist".into()),
                    );
                    dangling = true;
                } else if defined[t.index()] {
                    self.push(
                        self.kn_loc(h, Slot::Output(k)),
                        ErrorKind::Invalid("tensor is defined twice".into()),
                    );
                    dangling = true;
                } else {
                    defined[t.index()] = true;
                    let d = &g.tensors[t];
                    if let Some(e) = check_tensor(&d.shape, d.dtype) {
                        self.push(self.kn_loc(h, Slot::Output(k)), e);
                    }
                }
            }
        }
        if dangling {
            // Per-operator checks would index missing tensors.
            return;
        }
        for (h, op) in g.ops.iter() {
            self.kn_op(h, op);
        }
        if g.outputs().is_empty() {
            self.push(
                self.graph_loc(),
                ErrorKind::Invalid("the graph has no outputs".into()),
            );
        }
        self.sharding();
    }

    /// The location of the graph as a whole.
    fn graph_loc(&self) -> Location {
        Location {
            file: self.src.and_then(|s| s.file.clone()),
            graph: self.src.and_then(|s| s.graph),
            json_path: self.src.and_then(|s| s.graph_path.clone()),
            ..Location::default()
        }
    }

    /// The GPU mesh, and GPU maps only on graph inputs and outputs (the maps themselves are
    /// checked with their operators).
    fn sharding(&mut self) {
        let g = self.g;
        if let Some(Err(e)) = g.sharding.mesh.map(GpuMesh::check) {
            self.push(self.graph_loc(), e);
        }
        for (&h, map) in &g.sharding.maps {
            match g.ops.try_get(h) {
                None => self.push(
                    self.graph_loc(),
                    ErrorKind::Invalid(format!(
                        "GPU map {map} for kernel operator {}, which does not exist",
                        h.index()
                    )),
                ),
                Some(op) if !matches!(op.kind, KnOpKind::Input { .. } | KnOpKind::Output { .. }) => {
                    self.push(
                        self.kn_loc(h, Slot::Op),
                        ErrorKind::Invalid(format!(
                            "GPU map {map} on a {} operator; only graph inputs and outputs are partitioned across GPUs",
                            op.kind.name()
                        )),
                    )
                }
                Some(_) => {}
            }
        }
    }

    /// Checks the GPU map of input/output operator `h` (stored under `key` in Mirage's JSON)
    /// over the per-rank shape `shape`.
    fn gpu_map(&mut self, h: Handle<KnOp>, key: &'static str, shape: &Shape, dtype: DType) {
        let map = self.g.sharding.map(h);
        if map == DimMap::NONE {
            return;
        }
        let loc = self.kn_loc(h, Slot::Key(key));
        if let Err(e) = sharding::check_map(map, shape) {
            self.push(loc, e);
            return;
        }
        let Some(mesh) = self.g.sharding.mesh else {
            self.push(
                loc,
                ErrorKind::GpuCountUnknown(format!(
                    "{key} {map} partitions the tensor across GPUs, but the graph's GPU count is unknown (Mirage's JSON does not record gpu_dim); give the GPU mesh (MirageFile::set_gpu_mesh, GraphBuilder::set_gpu_mesh, or the mucc_gpu_dim key)"
                )),
            );
            return;
        };
        let global = sharding::global_shape(shape, map, mesh);
        let bytes = global.map_or(usize::MAX, |s| s.numel().saturating_mul(dtype.bytes()));
        if bytes > MAX_TENSOR_BYTES {
            self.push(
                loc,
                ErrorKind::BadValue(format!(
                    "the global tensor ({shape} per GPU, {key} {map} over the GPU mesh {mesh}) is larger than 2^40 bytes"
                )),
            );
        }
    }

    fn arity(
        &mut self,
        h: Handle<KnOp>,
        op: &KnOp,
        ins: (usize, usize),
        outs: (usize, usize),
    ) -> bool {
        let fmt = |(lo, hi): (usize, usize)| {
            if lo == hi {
                lo.to_string()
            } else if hi == usize::MAX {
                format!("at least {lo}")
            } else {
                format!("{lo} to {hi}")
            }
        };
        let mut ok = true;
        if op.inputs.len() < ins.0 || op.inputs.len() > ins.1 {
            self.push(
                self.kn_loc(h, Slot::Op),
                ErrorKind::Arity {
                    what: "inputs",
                    expected: fmt(ins),
                    found: op.inputs.len(),
                },
            );
            ok = false;
        }
        if op.outputs.len() < outs.0 || op.outputs.len() > outs.1 {
            self.push(
                self.kn_loc(h, Slot::Op),
                ErrorKind::Arity {
                    what: "outputs",
                    expected: fmt(outs),
                    found: op.outputs.len(),
                },
            );
            ok = false;
        }
        ok
    }

    /// Compares the recorded shape of output `k` with `inferred`.
    fn expect_shape(
        &mut self,
        h: Handle<KnOp>,
        k: usize,
        t: &DTensor,
        inferred: Result<Shape, ErrorKind>,
    ) {
        match inferred {
            Ok(s) if s == t.shape => {}
            Ok(s) => self.push(
                self.kn_loc(h, Slot::Output(k)),
                ErrorKind::ShapeMismatch {
                    recorded: t.shape,
                    inferred: s,
                },
            ),
            Err(e) => self.push(self.kn_loc(h, Slot::Op), e),
        }
    }

    fn kn_op(&mut self, h: Handle<KnOp>, op: &'a KnOp) {
        let g = self.g;
        let t = |x: Handle<DTensor>| &g.tensors[x];
        // One element type per operator.
        let all: Vec<(Slot, Handle<DTensor>)> = op
            .inputs
            .iter()
            .enumerate()
            .map(|(k, &x)| (Slot::Input(k), x))
            .chain(
                op.outputs
                    .iter()
                    .enumerate()
                    .map(|(k, &x)| (Slot::Output(k), x)),
            )
            .collect();
        if let Some(&(_, first)) = all.first() {
            let dt = t(first).dtype;
            if let Some(&(slot, x)) = all.iter().find(|(_, x)| t(*x).dtype != dt) {
                self.push(
                    self.kn_loc(h, slot),
                    ErrorKind::DtypeMismatch {
                        expected: dt,
                        found: t(x).dtype,
                    },
                );
            }
        }
        match &op.kind {
            KnOpKind::Input { strides } => {
                if self.arity(h, op, (0, 0), (1, 1)) {
                    let d = t(op.outputs[0]);
                    if let Some(e) = check_strides(strides, &d.shape, d.dtype) {
                        self.push(self.kn_loc(h, Slot::Key("input_strides")), e);
                    }
                    self.gpu_map(h, "input_map", &d.shape, d.dtype);
                }
            }
            KnOpKind::Output { strides } => {
                if self.arity(h, op, (1, 1), (0, 0)) {
                    let d = t(op.inputs[0]);
                    if let Some(st) = strides
                        && let Some(e) = check_strides(st, &d.shape, d.dtype)
                    {
                        self.push(self.kn_loc(h, Slot::Key("output_strides")), e);
                    }
                    self.gpu_map(h, "output_map", &d.shape, d.dtype);
                }
            }
            KnOpKind::Matmul => {
                if self.arity(h, op, (2, 2), (1, 1)) {
                    let r = infer::matmul(&t(op.inputs[0]).shape, &t(op.inputs[1]).shape, false);
                    self.expect_shape(h, 0, t(op.outputs[0]), r);
                }
            }
            KnOpKind::Unary(u) => {
                if self.arity(h, op, (1, 1), (1, 1)) {
                    if let Some(e) = check_unary(u) {
                        self.push(self.kn_loc(h, Slot::Op), e);
                    }
                    self.expect_shape(h, 0, t(op.outputs[0]), Ok(t(op.inputs[0]).shape));
                }
            }
            KnOpKind::AllReduce { .. } => {
                if self.arity(h, op, (1, 1), (1, 1)) {
                    self.expect_shape(h, 0, t(op.outputs[0]), Ok(t(op.inputs[0]).shape));
                }
            }
            KnOpKind::ShiftedExp { groups } if *groups != 1 => {
                if self.arity(h, op, (2, 2), (1, 1)) {
                    let (x, m) = (t(op.inputs[0]).shape, t(op.inputs[1]).shape);
                    let last = x.rank().max(1) - 1;
                    let r = if x.rank() == 0
                        || *groups == 0
                        || !x.dim(last).is_multiple_of(*groups)
                        || m != x.with_dim(last, *groups)
                    {
                        Err(ErrorKind::BadValue(format!(
                            "shifted_exp in {groups} groups takes m {m} for x {x}"
                        )))
                    } else {
                        Ok(x)
                    };
                    self.expect_shape(h, 0, t(op.outputs[0]), r);
                }
            }
            KnOpKind::Binary(_) | KnOpKind::ShiftedExp { .. } => {
                if self.arity(h, op, (2, 2), (1, 1)) {
                    let r = infer::binary(&t(op.inputs[0]).shape, &t(op.inputs[1]).shape);
                    self.expect_shape(h, 0, t(op.outputs[0]), r);
                }
            }
            KnOpKind::Reduction { dim } => {
                if self.arity(h, op, (1, 1), (1, 1)) {
                    let x = t(op.inputs[0]).shape;
                    let y = t(op.outputs[0]).shape;
                    let to = if *dim < y.rank() { y.dim(*dim) } else { 1 };
                    let r = infer::kn_reduction(&x, *dim, to);
                    self.expect_shape(h, 0, t(op.outputs[0]), r);
                }
            }
            KnOpKind::RowMax { groups } => {
                if self.arity(h, op, (1, 1), (1, 1)) {
                    let x = t(op.inputs[0]).shape;
                    let r = if x.rank() == 0 {
                        Err(ErrorKind::BadValue("row_max of a scalar".into()))
                    } else if *groups == 0 || !x.dim(x.rank() - 1).is_multiple_of(*groups) {
                        Err(ErrorKind::BadValue(format!(
                            "row_max in {groups} groups of a last dim of {}",
                            x.dim(x.rank() - 1)
                        )))
                    } else {
                        Ok(x.with_dim(x.rank() - 1, *groups))
                    };
                    self.expect_shape(h, 0, t(op.outputs[0]), r);
                }
            }
            KnOpKind::SoftmaxCombine { splits } => {
                if self.arity(h, op, (3, 3), (1, 1)) {
                    let (o, l, m) = (
                        t(op.inputs[0]).shape,
                        t(op.inputs[1]).shape,
                        t(op.inputs[2]).shape,
                    );
                    let r = o.rank();
                    let d = o.dim(r - 1) / (*splits).max(1);
                    let fits = *splits >= 1
                        && o.dim(r - 1) == splits * d
                        && l == o.with_dim(r - 1, *splits)
                        && m == l;
                    if fits {
                        self.expect_shape(h, 0, t(op.outputs[0]), Ok(o.with_dim(r - 1, d)));
                    } else {
                        self.push(
                            self.kn_loc(h, Slot::Op),
                            ErrorKind::BadValue(format!(
                                "softmax_combine of {splits} splits takes O [.., rows, splits·d] \
                                 and l, m [.., rows, splits]; got {o}, {l}, {m}"
                            )),
                        );
                    }
                }
            }
            KnOpKind::RmsNorm { normalized_dims } => {
                if self.arity(h, op, (1, 1), (1, 1)) {
                    let x = t(op.inputs[0]).shape;
                    if *normalized_dims == 0 || *normalized_dims > x.rank() {
                        self.push(
                            self.kn_loc(h, Slot::Op),
                            ErrorKind::BadValue(format!(
                                "rms_norm over {normalized_dims} trailing dims of a {}-dim tensor",
                                x.rank()
                            )),
                        );
                    }
                    self.expect_shape(h, 0, t(op.outputs[0]), Ok(x));
                }
            }
            KnOpKind::Concat { dim } => {
                if self.arity(h, op, (2, usize::MAX), (1, 1)) {
                    let parts: Vec<Shape> = op.inputs.iter().map(|&x| t(x).shape).collect();
                    let r = infer::concat(&parts, *dim);
                    self.expect_shape(h, 0, t(op.outputs[0]), r);
                }
            }
            KnOpKind::Split { dim } | KnOpKind::Chunk { dim, .. } => {
                if self.arity(h, op, (1, 1), (1, usize::MAX)) {
                    let x = t(op.inputs[0]).shape;
                    let parts: Vec<Shape> = op.outputs.iter().map(|&y| t(y).shape).collect();
                    let concatenated = match infer::concat(&parts, *dim) {
                        Ok(s) if s == x => true,
                        Ok(s) => {
                            self.push(
                                self.kn_loc(h, Slot::Op),
                                ErrorKind::Operands(format!(
                                    "the outputs together have shape {s}, but the input is {x}"
                                )),
                            );
                            false
                        }
                        Err(e) => {
                            self.push(self.kn_loc(h, Slot::Op), e);
                            false
                        }
                    };
                    // The outputs tile the input along `dim`: now check equal chunks.
                    if let KnOpKind::Chunk { chunk_size, .. } = op.kind
                        && concatenated
                    {
                        let n = parts.len();
                        let each = parts[0].dim(*dim);
                        if parts.iter().any(|p| p.dim(*dim) != each) {
                            self.push(
                                self.kn_loc(h, Slot::Op),
                                ErrorKind::Operands("chunks must have equal extents".into()),
                            );
                        } else if chunk_size != n && chunk_size != each {
                            self.push(
                                self.kn_loc(h, Slot::Key("chunk_size")),
                                ErrorKind::BadValue(format!(
                                    "chunk_size {chunk_size} is neither the number of chunks ({n}) nor their extent ({each})"
                                )),
                            );
                        }
                    }
                }
            }
            KnOpKind::Customized(tb) => self.customized(h, op, tb),
        }
    }

    fn customized(&mut self, h: Handle<KnOp>, op: &'a KnOp, tb: &'a TbGraph) {
        let g = self.g;
        if op.outputs.is_empty() {
            self.push(
                self.kn_loc(h, Slot::Op),
                ErrorKind::Arity {
                    what: "outputs",
                    expected: "at least 1".into(),
                    found: 0,
                },
            );
        }
        // Launch configuration.
        for a in 0..3 {
            if tb.grid[a] == 0 || tb.grid[a] > MAX_GRID[a] {
                self.push(
                    bgraph_location(
                        g,
                        self.src,
                        h,
                        &format!("grid_dim.{}", super::ops::AXIS_NAMES[a]),
                    ),
                    ErrorKind::LaunchLimit(format!(
                        "grid_dim {} = {} is outside 1..={}",
                        super::ops::AXIS_NAMES[a],
                        tb.grid[a],
                        MAX_GRID[a]
                    )),
                );
            }
            if tb.block[a] == 0 || tb.block[a] > MAX_BLOCK[a] {
                self.push(
                    bgraph_location(
                        g,
                        self.src,
                        h,
                        &format!("block_dim.{}", super::ops::AXIS_NAMES[a]),
                    ),
                    ErrorKind::LaunchLimit(format!(
                        "block_dim {} = {} is outside 1..={}",
                        super::ops::AXIS_NAMES[a],
                        tb.block[a],
                        MAX_BLOCK[a]
                    )),
                );
            }
        }
        let threads: u128 = tb.block.iter().map(|&b| b as u128).product();
        if threads > MAX_THREADS as u128 {
            self.push(
                bgraph_location(g, self.src, h, "block_dim"),
                ErrorKind::LaunchLimit(format!(
                    "block_dim has {threads} threads; CUDA allows at most {MAX_THREADS}"
                )),
            );
        }
        if tb.forloop_range == 0 {
            self.push(
                bgraph_location(g, self.src, h, "forloop_range"),
                ErrorKind::BadValue("forloop_range must be at least 1".into()),
            );
        }
        if tb.reduction_dimx == 0 {
            self.push(
                bgraph_location(g, self.src, h, "reduction_dimx"),
                ErrorKind::BadValue("reduction_dimx must be at least 1".into()),
            );
        }
        if tb.grid.contains(&0) || tb.forloop_range == 0 {
            return;
        }
        TbValidator {
            v: self,
            kn: h,
            kn_op: op,
            tb,
        }
        .run();
    }
}

fn check_unary(u: &UnaryOp) -> Option<ErrorKind> {
    match *u {
        UnaryOp::Clamp { min, max } if min.partial_cmp(&max).is_none_or(|o| o.is_gt()) => {
            Some(ErrorKind::BadValue(format!(
                "clamp bounds [{min}, {max}] are empty or not numbers"
            )))
        }
        UnaryOp::MulScalar(s) if !s.is_finite() => Some(ErrorKind::BadValue(format!(
            "mul_scalar scalar {s} is not finite"
        ))),
        _ => None,
    }
}

struct TbValidator<'v, 'a> {
    v: &'v mut Validator<'a>,
    kn: Handle<KnOp>,
    kn_op: &'a KnOp,
    tb: &'a TbGraph,
}

impl TbValidator<'_, '_> {
    fn loc(&self, op: Handle<TbOp>, slot: Slot) -> Location {
        tb_location(self.tb, self.v.src, self.kn, op, slot)
    }

    fn push(&mut self, op: Handle<TbOp>, slot: Slot, kind: ErrorKind) {
        let l = self.loc(op, slot);
        self.v.push(l, kind);
    }

    fn run(&mut self) {
        let tb = self.tb;
        let n = tb.tensors.len();
        let mut defined = vec![false; n];
        let mut broken = false;
        for (h, op) in tb.ops.iter() {
            for (k, &t) in op.inputs.iter().enumerate() {
                if t.index() >= n || !defined[t.index()] {
                    self.push(
                        h,
                        Slot::Input(k),
                        ErrorKind::Invalid(
                            "input tile is not defined by an earlier operator of this threadblock graph"
                                .into(),
                        ),
                    );
                    broken = true;
                }
            }
            for (k, &t) in op.outputs.iter().enumerate() {
                if t.index() >= n || defined[t.index()] {
                    self.push(
                        h,
                        Slot::Output(k),
                        ErrorKind::Invalid("output tile is missing or defined twice".into()),
                    );
                    broken = true;
                } else {
                    defined[t.index()] = true;
                    let s = &tb.tensors[t];
                    if let Some(e) = check_tensor(&s.shape, s.dtype) {
                        self.push(h, Slot::Output(k), e);
                    }
                }
            }
        }
        if broken {
            return;
        }
        // The dependency graph must be acyclic (it is, given definition before use, but the
        // check is cheap and keeps the invariant explicit for later stages).
        let producers = tb.producers();
        let mut deps: DiGraphMap<usize, ()> = DiGraphMap::new();
        for (h, op) in tb.ops.iter() {
            deps.add_node(h.index());
            for &t in &op.inputs {
                if let Some(p) = producers[t.index()] {
                    deps.add_edge(p.index(), h.index(), ());
                }
            }
        }
        if toposort(&deps, None).is_err() {
            self.v.push(
                kn_location(self.v.g, self.v.src, self.kn, Slot::Op),
                ErrorKind::Invalid("the threadblock graph has a cycle".into()),
            );
            return;
        }
        let mut bound_in = vec![0usize; self.kn_op.inputs.len()];
        let mut bound_out = vec![0usize; self.kn_op.outputs.len()];
        for (h, op) in tb.ops.iter() {
            self.op(h, op, &mut bound_in, &mut bound_out);
        }
        for (i, &c) in bound_in.iter().enumerate() {
            if c != 1 {
                self.v.push(
                    kn_location(self.v.g, self.v.src, self.kn, Slot::Input(i)),
                    ErrorKind::Invalid(format!(
                        "customized input {i} is read by {c} tb_input_ops (expected exactly 1)"
                    )),
                );
            }
        }
        for (j, &c) in bound_out.iter().enumerate() {
            if c != 1 {
                self.v.push(
                    kn_location(self.v.g, self.v.src, self.kn, Slot::Output(j)),
                    ErrorKind::Invalid(format!(
                        "customized output {j} is written by {c} tb_output_ops (expected exactly 1)"
                    )),
                );
            }
        }
    }

    fn arity(&mut self, h: Handle<TbOp>, op: &TbOp, ins: usize, outs: usize) -> bool {
        let mut ok = true;
        if op.inputs.len() != ins {
            self.push(
                h,
                Slot::Op,
                ErrorKind::Arity {
                    what: "inputs",
                    expected: ins.to_string(),
                    found: op.inputs.len(),
                },
            );
            ok = false;
        }
        if op.outputs.len() != outs {
            self.push(
                h,
                Slot::Op,
                ErrorKind::Arity {
                    what: "outputs",
                    expected: outs.to_string(),
                    found: op.outputs.len(),
                },
            );
            ok = false;
        }
        ok
    }

    fn expect(
        &mut self,
        h: Handle<TbOp>,
        k: usize,
        s: &STensor,
        inferred: Result<Shape, ErrorKind>,
        after: bool,
    ) {
        match inferred {
            Ok(x) if x == s.shape => {}
            Ok(x) => self.push(
                h,
                Slot::Output(k),
                ErrorKind::ShapeMismatch {
                    recorded: s.shape,
                    inferred: x,
                },
            ),
            Err(e) => self.push(h, Slot::Op, e),
        }
        if s.after_accum != after {
            self.push(
                h,
                Slot::Output(k),
                ErrorKind::AfterAccumMismatch {
                    recorded: s.after_accum,
                    inferred: after,
                },
            );
        }
    }

    fn op(&mut self, h: Handle<TbOp>, op: &TbOp, bound_in: &mut [usize], bound_out: &mut [usize]) {
        let tb = self.tb;
        let g = self.v.g;
        let st = |x: Handle<STensor>| &tb.tensors[x];
        // One element type per operator.
        let slots: Vec<(Slot, DType)> = op
            .inputs
            .iter()
            .enumerate()
            .map(|(k, &x)| (Slot::Input(k), st(x).dtype))
            .chain(
                op.outputs
                    .iter()
                    .enumerate()
                    .map(|(k, &x)| (Slot::Output(k), st(x).dtype)),
            )
            .collect();
        if let Some(&(_, dt)) = slots.first()
            && let Some(&(slot, found)) = slots.iter().find(|(_, d)| *d != dt)
        {
            self.push(
                h,
                slot,
                ErrorKind::DtypeMismatch {
                    expected: dt,
                    found,
                },
            );
        }
        // after_accum of the inputs (all equal unless mixed).
        let flags: Vec<bool> = op.inputs.iter().map(|&x| st(x).after_accum).collect();
        let after = flags.first().copied().unwrap_or(false);
        let mixed = flags.iter().any(|&f| f != after);
        match &op.kind {
            TbOpKind::Input {
                input,
                imap,
                forloop_dim,
            } => {
                if !self.arity(h, op, 0, 1) {
                    return;
                }
                let Some(&dt) = self.kn_op.inputs.get(*input) else {
                    self.push(
                        h,
                        Slot::DTensor,
                        ErrorKind::Invalid(format!(
                            "reads customized input {input}, but the customized operator has {} inputs",
                            self.kn_op.inputs.len()
                        )),
                    );
                    return;
                };
                bound_in[*input] += 1;
                let d = &g.tensors[dt];
                let s = st(op.outputs[0]);
                if d.dtype != s.dtype {
                    self.push(
                        h,
                        Slot::Output(0),
                        ErrorKind::DtypeMismatch {
                            expected: d.dtype,
                            found: s.dtype,
                        },
                    );
                }
                // Partition errors point at the map or the loop dim that causes them.
                let r = match infer::tb_input_grid(&d.shape, tb.grid, *imap) {
                    Err(e) => {
                        self.push(h, Slot::Key("input_map"), e);
                        return;
                    }
                    Ok(per_block) => {
                        match infer::tb_input_loop(&per_block, *forloop_dim, tb.forloop_range) {
                            Err(e) => {
                                self.push(h, Slot::Key("forloop_dim"), e);
                                return;
                            }
                            Ok(tile) => tile,
                        }
                    }
                };
                self.expect(h, 0, s, Ok(r), false);
            }
            TbOpKind::Output { output, omap } => {
                if !self.arity(h, op, 1, 0) {
                    return;
                }
                let s = st(op.inputs[0]);
                if !s.after_accum {
                    self.push(
                        h,
                        Slot::Input(0),
                        ErrorKind::Invalid(
                            "an output must store an after-loop tile (pass it through a for-loop accumulator, even when forloop_range is 1)"
                                .into(),
                        ),
                    );
                }
                let Some(&dt) = self.kn_op.outputs.get(*output) else {
                    self.push(
                        h,
                        Slot::DTensor,
                        ErrorKind::Invalid(format!(
                            "writes customized output {output}, but the customized operator has {} outputs",
                            self.kn_op.outputs.len()
                        )),
                    );
                    return;
                };
                bound_out[*output] += 1;
                let d = &g.tensors[dt];
                if d.dtype != s.dtype {
                    self.push(
                        h,
                        Slot::DTensor,
                        ErrorKind::DtypeMismatch {
                            expected: s.dtype,
                            found: d.dtype,
                        },
                    );
                }
                match infer::tb_output(&s.shape, tb.grid, *omap) {
                    Ok(o) if o == d.shape => {}
                    Ok(o) => self.push(
                        h,
                        Slot::DTensor,
                        ErrorKind::ShapeMismatch {
                            recorded: d.shape,
                            inferred: o,
                        },
                    ),
                    Err(e) => self.push(h, Slot::Key("output_map"), e),
                }
            }
            TbOpKind::Matmul => {
                if self.arity(h, op, 2, 1) {
                    let r = infer::matmul(&st(op.inputs[0]).shape, &st(op.inputs[1]).shape, true);
                    self.mixed_then(h, mixed, op, r, after);
                }
            }
            TbOpKind::Unary(u) => {
                if self.arity(h, op, 1, 1) {
                    if let Some(e) = check_unary(u) {
                        self.push(h, Slot::Op, e);
                    }
                    let r = Ok(st(op.inputs[0]).shape);
                    self.expect(h, 0, st(op.outputs[0]), r, after);
                }
            }
            TbOpKind::RmsNorm => {
                if self.arity(h, op, 1, 1) {
                    let r = Ok(st(op.inputs[0]).shape);
                    self.expect(h, 0, st(op.outputs[0]), r, after);
                }
            }
            TbOpKind::Binary(_) => {
                if self.arity(h, op, 2, 1) {
                    let r = infer::binary(&st(op.inputs[0]).shape, &st(op.inputs[1]).shape);
                    self.mixed_then(h, mixed, op, r, after);
                }
            }
            TbOpKind::Concat { dim } => {
                if self.arity(h, op, 2, 1) {
                    let parts = [st(op.inputs[0]).shape, st(op.inputs[1]).shape];
                    let r = infer::concat(&parts, *dim);
                    self.mixed_then(h, mixed, op, r, after);
                }
            }
            TbOpKind::Reduction { dim, kind } => {
                let outs = if *kind == TbReduction::Max { 2 } else { 1 };
                if self.arity(h, op, 1, outs) {
                    let r = infer::tb_reduction(
                        &st(op.inputs[0]).shape,
                        *dim,
                        *kind,
                        tb.reduction_dimx,
                    );
                    for k in 0..outs {
                        self.expect(h, k, st(op.outputs[k]), r.clone(), after);
                    }
                }
            }
            TbOpKind::Accum(kind) => {
                if !self.arity(h, op, kind.num_inputs(), 1) {
                    return;
                }
                for (k, &f) in flags.iter().enumerate() {
                    if f {
                        self.push(
                            h,
                            Slot::Input(k),
                            ErrorKind::Invalid(
                                "a for-loop accumulator's inputs must be in-loop tiles (after_accum = false)"
                                    .into(),
                            ),
                        );
                    }
                }
                let x = st(op.inputs[0]).shape;
                let r = op.inputs.get(1).map(|&r| st(r).shape);
                let out = infer::accum(*kind, &x, r.as_ref(), tb.reduction_dimx);
                self.expect(h, 0, st(op.outputs[0]), out, true);
            }
        }
    }

    fn mixed_then(
        &mut self,
        h: Handle<TbOp>,
        mixed: bool,
        op: &TbOp,
        r: Result<Shape, ErrorKind>,
        after: bool,
    ) {
        if mixed {
            self.push(h, Slot::Op, ErrorKind::MixedAfterAccum);
            return;
        }
        let s = &self.tb.tensors[op.outputs[0]];
        self.expect(h, 0, s, r, after);
    }
}
