//! `mucc._mucc`: the Rust half of the `mucc` Python package. The Python half (`python/mucc/`)
//! wraps these classes in the documented API (`mucc.load`, the Mirage-style builder,
//! `mucc.compile`, …); nothing here is meant to be called directly.

mod call;

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use mucc::cuda::bench::TimingOptions;
use mucc::cuda::run::{Gpu, Program, RawBuffers};
use mucc::cuda::session::{Candidate, InputChoice, Session, SessionOptions};
use mucc::cuda::{Compiler, CompilerOptions, Source};
use mucc::emit::launch::{LaunchPlan, TensorDirective};
use mucc::graph::SourceMap;
use mucc::graph::interp::{self, HostTensor};
use mucc::graph::{
    AccumKind, BinaryOp, DType, DtypeTable, GraphBuilder, Handle, KernelGraph, Shape,
    TbGraphBuilder, UnaryOp,
};
use mucc::sched::{Options, PathChoice};
use mucc::target::Arch;
use mucc::{ImportOptions, LoadedGraph};

create_exception!(
    _mucc,
    MuccError,
    PyException,
    "Base class of mucc's errors."
);
create_exception!(
    _mucc,
    GraphError,
    MuccError,
    "A graph that cannot be read, built or validated; the message names the file, graph, JSON path and operator."
);
create_exception!(
    _mucc,
    CompileError,
    MuccError,
    "Planning, emitting or compiling a graph failed."
);
create_exception!(
    _mucc,
    CudaError,
    MuccError,
    "The GPU, its driver or a launch failed, or buffers do not fit the plan."
);

fn graph_err(e: impl std::fmt::Display) -> PyErr {
    GraphError::new_err(e.to_string())
}

fn compile_err(e: impl std::fmt::Display) -> PyErr {
    CompileError::new_err(e.to_string())
}

pub(crate) fn cuda_err(e: impl std::fmt::Display) -> PyErr {
    CudaError::new_err(e.to_string())
}

fn parse_arch(arch: &str) -> PyResult<Arch> {
    arch.parse::<Arch>()
        .map_err(|e| PyValueError::new_err(format!("arch: {e}")))
}

fn parse_path(path: &str) -> PyResult<PathChoice> {
    match path {
        "auto" => Ok(PathChoice::Auto),
        "ampere" => Ok(PathChoice::Ampere),
        "hopper" => Ok(PathChoice::Hopper),
        _ => Err(PyValueError::new_err(format!(
            "path: `{path}` is none of auto, ampere, hopper"
        ))),
    }
}

fn parse_dtype(name: &str) -> PyResult<DType> {
    name.parse::<DType>()
        .map_err(|e| PyValueError::new_err(format!("dtype: {e}")))
}

/// A `warps` argument: "auto", "graph" or a number of warps per CTA.
#[derive(FromPyObject)]
enum WarpsArg {
    /// A number of warps.
    Count(usize),
    /// "auto" or "graph" (or a number as text).
    Name(String),
}

fn parse_warps(w: WarpsArg) -> PyResult<mucc::sched::CtaChoice> {
    let text = match w {
        WarpsArg::Count(n) => n.to_string(),
        WarpsArg::Name(s) => s,
    };
    text.parse()
        .map_err(|e: String| PyValueError::new_err(format!("warps: {e}")))
}

/// The planning options for `arch`, `path` and `cta`, with the tuning cache's variant when
/// `tune` (a tuned variant replaces only the defaults: path "auto", warps "auto").
fn options(
    g: &KernelGraph,
    arch: Arch,
    path: PathChoice,
    cta: mucc::sched::CtaChoice,
    tune: bool,
) -> (Options, Option<String>) {
    let (opts, entry) = mucc::cuda::tune::options_for(g, arch, path, false, cta, tune);
    (
        opts,
        entry.map(|e| format!("{} (mucc tune on {})", e.best, e.gpu)),
    )
}

/// (shape, strides, dtype name) of a tensor directive.
type Spec = (Vec<usize>, Vec<usize>, String, usize);

fn spec(d: &TensorDirective) -> Spec {
    (
        d.shape.clone(),
        d.strides.clone(),
        d.dtype.name().to_string(),
        d.alloc_elems,
    )
}

/// A µGraph: read from a file, or a snapshot of one being built.
#[pyclass(module = "mucc", name = "Graph", frozen)]
struct PyGraph {
    lg: Arc<LoadedGraph>,
    /// "FILE, graph N" or "built in Python".
    origin: String,
    file: Option<String>,
    index: Option<usize>,
}

impl PyGraph {
    fn graph(&self) -> &KernelGraph {
        &self.lg.graph
    }

    fn validated(&self) -> PyResult<&KernelGraph> {
        self.lg.validate().map_err(|errs| {
            let lines: Vec<String> = errs.0.iter().map(|e| format!("  {e}")).collect();
            GraphError::new_err(format!(
                "{}: invalid ({} error{}):\n{}",
                self.origin,
                errs.0.len(),
                if errs.0.len() == 1 { "" } else { "s" },
                lines.join("\n")
            ))
        })?;
        Ok(self.graph())
    }

    fn specs(&self, outputs: bool) -> Vec<Spec> {
        let g = self.graph();
        let list = if outputs { g.outputs() } else { g.inputs() };
        list.into_iter()
            .map(|(h, t)| {
                let d = &g.tensors[t];
                let strides = if outputs {
                    match &g.ops[h].kind {
                        mucc::graph::KnOpKind::Output { strides: Some(s) } => s.clone(),
                        _ => d.shape.row_major_strides(),
                    }
                } else {
                    g.input_strides(t)
                        .cloned()
                        .unwrap_or_else(|| d.shape.row_major_strides())
                };
                (
                    d.shape.dims().to_vec(),
                    strides.as_slice().to_vec(),
                    d.dtype.name().to_string(),
                    0,
                )
            })
            .collect()
    }

    fn transpiled(
        &self,
        arch: &str,
        path: &str,
        warps: WarpsArg,
        tune: bool,
    ) -> PyResult<(mucc::sched::GraphPlan, mucc::emit::Emitted, Option<String>)> {
        let g = self.validated()?;
        let cta = parse_warps(warps)?;
        let (opts, tuned) = options(g, parse_arch(arch)?, parse_path(path)?, cta, tune);
        let (p, e) = mucc::transpile::transpile(g, &opts, &self.origin)
            .map_err(|e| compile_err(format!("{}: {e}", self.origin)))?;
        Ok((p, e, tuned))
    }
}

#[pymethods]
impl PyGraph {
    /// Where the graph came from: "FILE, graph N" or "built in Python".
    #[getter]
    fn origin(&self) -> &str {
        &self.origin
    }

    /// The file it was read from, if any.
    #[getter]
    fn file(&self) -> Option<&str> {
        self.file.as_deref()
    }

    /// Its index in that file, if any.
    #[getter]
    fn index(&self) -> Option<usize> {
        self.index
    }

    /// Graph inputs in order: (shape, strides, dtype, 0).
    fn _input_specs(&self) -> Vec<Spec> {
        self.specs(false)
    }

    /// Graph outputs in order: (shape, strides the graph asks for or row-major, dtype, 0).
    fn _output_specs(&self) -> Vec<Spec> {
        self.specs(true)
    }

    /// One line: inputs, outputs and kernels.
    fn summary(&self) -> String {
        mucc::graph::display::summary(self.graph())
    }

    fn __str__(&self) -> String {
        format!("{}: {}", self.origin, self.summary())
    }

    fn __repr__(&self) -> String {
        format!("<mucc.Graph {}>", self.origin)
    }

    /// Every operator with its shapes, then the validation verdict.
    fn inspect(&self) -> String {
        let g = self.graph();
        let mut s = format!("{}: {}\n", self.origin, mucc::graph::display::summary(g));
        for line in mucc::graph::display::dump(g).lines() {
            s.push_str("  ");
            s.push_str(line);
            s.push('\n');
        }
        match self.lg.validate() {
            Ok(()) => s.push_str("validation: ok\n"),
            Err(errs) => {
                s.push_str(&format!("validation: {} error(s)\n", errs.0.len()));
                for e in &errs.0 {
                    s.push_str(&format!("  {e}\n"));
                }
            }
        }
        s
    }

    /// Raises `mucc.GraphError` listing every problem, each located.
    fn validate(&self) -> PyResult<()> {
        self.validated().map(|_| ())
    }

    /// Mirage's JSON of the graph (one graph: an array of operators).
    #[pyo3(signature = (dtype_table = "current"))]
    fn to_json(&self, dtype_table: &str) -> PyResult<String> {
        let table: DtypeTable = dtype_table
            .parse()
            .map_err(|e: String| PyValueError::new_err(format!("dtype_table: {e}")))?;
        let opts = mucc::ExportOptions {
            dtype_table: table,
            ..Default::default()
        };
        let v = mucc::graph::mirage_json::graph_to_json(self.graph(), &opts)
            .map_err(|e| graph_err(format!("{}: {e}", self.origin)))?;
        serde_json::to_string(&v).map_err(graph_err)
    }

    /// The generated CUDA C++ for `arch`; `warps` ("auto", "graph" or a number) is the CTA
    /// shape of threadblock kernels.
    #[pyo3(
        signature = (arch = "sm_90a", path = "auto", tune = true, warps = WarpsArg::Name("auto".into())),
        text_signature = "($self, /, arch='sm_90a', path='auto', tune=True, warps='auto')"
    )]
    fn transpile(
        &self,
        py: Python<'_>,
        arch: &str,
        path: &str,
        tune: bool,
        warps: WarpsArg,
    ) -> PyResult<String> {
        py.detach(|| self.transpiled(arch, path, warps, tune))
            .map(|(_, e, _)| e.source)
    }

    /// The plan for `arch` as text (what `mucc explain` prints).
    #[pyo3(
        signature = (arch = "sm_90a", path = "auto", tune = true, warps = WarpsArg::Name("auto".into())),
        text_signature = "($self, /, arch='sm_90a', path='auto', tune=True, warps='auto')"
    )]
    fn explain(
        &self,
        py: Python<'_>,
        arch: &str,
        path: &str,
        tune: bool,
        warps: WarpsArg,
    ) -> PyResult<String> {
        py.detach(|| {
            let (p, _, tuned) = self.transpiled(arch, path, warps, tune)?;
            let mut s = mucc::explain::explain(self.graph(), &p);
            if let Some(t) = tuned {
                s = format!("tuned variant: {t}\n{s}");
            }
            Ok(s)
        })
    }

    /// The CPU interpreter (exact f64 semantics) on `inputs`, one array-like per graph input
    /// in order (anything `numpy.asarray` takes, of the input's shape); returns one float64
    /// numpy array per output.
    fn eval<'py>(
        &self,
        py: Python<'py>,
        inputs: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let np = py.import("numpy")?;
        let specs = self.specs(false);
        let mut raw = Vec::new();
        for (i, x) in inputs.iter().enumerate() {
            let a = np.call_method1("ascontiguousarray", (x, "float64"))?;
            let shape: Vec<usize> = a.getattr("shape")?.extract()?;
            if let Some((want, _, _, _)) = specs.get(i)
                && *want != shape
            {
                return Err(PyValueError::new_err(format!(
                    "{}: input {i} has shape {shape:?}, the graph expects {want:?}",
                    self.origin
                )));
            }
            raw.push(a.call_method0("tobytes")?.extract::<Vec<u8>>()?);
        }
        self._eval(py, raw)?
            .into_iter()
            .map(|(shape, bytes)| {
                np.call_method1("frombuffer", (bytes, "float64"))?
                    .call_method1("reshape", (shape,))?
                    .call_method0("copy")
            })
            .collect()
    }

    /// The CPU interpreter (f64) on logical row-major inputs given as little-endian f64 bytes;
    /// returns (shape, f64 bytes) per output.
    fn _eval<'py>(
        &self,
        py: Python<'py>,
        inputs: Vec<Vec<u8>>,
    ) -> PyResult<Vec<(Vec<usize>, Bound<'py, PyBytes>)>> {
        let g = self.validated()?;
        let specs = self.specs(false);
        if inputs.len() != specs.len() {
            return Err(PyValueError::new_err(format!(
                "{}: the graph has {} inputs, {} were given",
                self.origin,
                specs.len(),
                inputs.len()
            )));
        }
        interp::estimate(g)
            .check(g, &interp::Budget::default())
            .map_err(|e| PyValueError::new_err(format!("{}: {e}", self.origin)))?;
        let mut hosts = Vec::new();
        for (i, (bytes, (shape, _, _, _))) in inputs.iter().zip(&specs).enumerate() {
            let shape = Shape::new(shape).ok_or_else(|| graph_err("bad input shape"))?;
            let n: usize = shape.dims().iter().product();
            if bytes.len() != n * 8 {
                return Err(PyValueError::new_err(format!(
                    "input {i}: {} values given, shape {shape} needs {n}",
                    bytes.len() / 8
                )));
            }
            let data = bytes
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().expect("chunks of 8")))
                .collect();
            hosts.push(HostTensor {
                shape,
                strides: shape.row_major_strides(),
                data,
            });
        }
        let outs = py
            .detach(|| interp::evaluate_owned(g, hosts))
            .map_err(|e| graph_err(format!("{}: {e}", self.origin)))?;
        Ok(outs
            .into_iter()
            .map(|a| {
                let bytes: Vec<u8> = a.data.iter().flat_map(|x| x.to_le_bytes()).collect();
                (a.shape.dims().to_vec(), PyBytes::new(py, &bytes))
            })
            .collect())
    }
}

/// Reads a Mirage JSON file: every candidate graph, in file order.
#[pyfunction]
#[pyo3(signature = (path, dtype_table = None))]
fn load(path: PathBuf, dtype_table: Option<&str>) -> PyResult<Vec<PyGraph>> {
    let table = match dtype_table {
        Some(t) => Some(
            t.parse::<DtypeTable>()
                .map_err(|e| PyValueError::new_err(format!("dtype_table: {e}")))?,
        ),
        None => None,
    };
    let file = mucc::read_file(
        &path,
        &ImportOptions {
            dtype_table: table,
            ..Default::default()
        },
    )
    .map_err(|e| graph_err(format!("{}: {e}", path.display())))?;
    let name = path.display().to_string();
    Ok(file
        .graphs
        .into_iter()
        .enumerate()
        .map(|(i, lg)| PyGraph {
            lg: Arc::new(lg),
            origin: format!("{name}, graph {i}"),
            file: Some(name.clone()),
            index: Some(i),
        })
        .collect())
}

fn unary_op(name: &str) -> PyResult<UnaryOp> {
    Ok(match name {
        "exp" => UnaryOp::Exp,
        "square" => UnaryOp::Square,
        "sqrt" => UnaryOp::Sqrt,
        "silu" => UnaryOp::Silu,
        "sigmoid" => UnaryOp::Sigmoid,
        "gelu" => UnaryOp::Gelu,
        "relu" => UnaryOp::Relu,
        "log" => UnaryOp::Log,
        _ => {
            return Err(PyValueError::new_err(format!(
                "unknown unary operator `{name}`"
            )));
        }
    })
}

fn binary_op(name: &str) -> PyResult<BinaryOp> {
    Ok(match name {
        "add" => BinaryOp::Add,
        "sub" => BinaryOp::Sub,
        "mul" => BinaryOp::Mul,
        "div" => BinaryOp::Div,
        "pow" => BinaryOp::Pow,
        _ => {
            return Err(PyValueError::new_err(format!(
                "unknown binary operator `{name}`"
            )));
        }
    })
}

/// The kernel-graph builder behind `mucc.KNGraph`; tensors are integer handles.
#[pyclass(module = "mucc", name = "_KernelBuilder")]
struct KernelBuilder {
    b: GraphBuilder,
}

type H = usize;

#[pymethods]
impl KernelBuilder {
    #[new]
    fn new() -> Self {
        KernelBuilder {
            b: GraphBuilder::new(),
        }
    }

    #[pyo3(signature = (dims, strides, dtype))]
    fn new_input(
        &mut self,
        dims: Vec<usize>,
        strides: Option<Vec<usize>>,
        dtype: &str,
    ) -> PyResult<H> {
        let dt = parse_dtype(dtype)?;
        let h = match strides {
            Some(s) => self.b.new_input_strided(&dims, &s, dt),
            None => self.b.new_input(&dims, dt),
        };
        h.map(Handle::index).map_err(graph_err)
    }

    #[pyo3(signature = (t, strides))]
    fn mark_output(&mut self, t: H, strides: Option<Vec<usize>>) -> PyResult<()> {
        let t = Handle::from_index(t);
        match strides {
            Some(s) => self.b.mark_output_strided(t, &s),
            None => self.b.mark_output(t),
        }
        .map_err(graph_err)
    }

    fn matmul(&mut self, a: H, b: H) -> PyResult<H> {
        self.b
            .matmul(Handle::from_index(a), Handle::from_index(b))
            .map(Handle::index)
            .map_err(graph_err)
    }

    fn unary(&mut self, op: &str, x: H) -> PyResult<H> {
        self.b
            .unary(unary_op(op)?, Handle::from_index(x))
            .map(Handle::index)
            .map_err(graph_err)
    }

    fn clamp(&mut self, x: H, min: f64, max: f64) -> PyResult<H> {
        self.b
            .clamp(Handle::from_index(x), min, max)
            .map(Handle::index)
            .map_err(graph_err)
    }

    fn mul_scalar(&mut self, x: H, s: f64) -> PyResult<H> {
        self.b
            .mul_scalar(Handle::from_index(x), s)
            .map(Handle::index)
            .map_err(graph_err)
    }

    fn binary(&mut self, op: &str, a: H, b: H) -> PyResult<H> {
        self.b
            .binary(binary_op(op)?, Handle::from_index(a), Handle::from_index(b))
            .map(Handle::index)
            .map_err(graph_err)
    }

    fn reduction(&mut self, x: H, dim: usize) -> PyResult<H> {
        self.b
            .reduction(Handle::from_index(x), dim)
            .map(Handle::index)
            .map_err(graph_err)
    }

    fn rms_norm(&mut self, x: H, normalized_dims: usize) -> PyResult<H> {
        self.b
            .rms_norm(Handle::from_index(x), normalized_dims)
            .map(Handle::index)
            .map_err(graph_err)
    }

    fn concat(&mut self, parts: Vec<H>, dim: usize) -> PyResult<H> {
        let parts: Vec<_> = parts.into_iter().map(Handle::from_index).collect();
        self.b
            .concat(&parts, dim)
            .map(Handle::index)
            .map_err(graph_err)
    }

    fn shape(&self, t: H) -> PyResult<Vec<usize>> {
        self.b
            .shape(Handle::from_index(t))
            .map(|s| s.dims().to_vec())
            .ok_or_else(|| graph_err(format!("tensor {t} does not belong to this graph")))
    }

    fn dtype(&self, t: H) -> PyResult<String> {
        self.b
            .dtype(Handle::from_index(t))
            .map(|d| d.name().to_string())
            .ok_or_else(|| graph_err(format!("tensor {t} does not belong to this graph")))
    }

    /// Adds the customized operator of `tb` (which is used up) and returns its outputs.
    fn customized(&mut self, tb: &mut TbBuilder) -> PyResult<Vec<H>> {
        let t = tb.take()?;
        self.b
            .customized(t)
            .map(|v| v.into_iter().map(Handle::index).collect())
            .map_err(graph_err)
    }

    /// The DTensor handles the threadblock graph's inputs read, in its `new_input` order.
    fn _tb_inputs(&self, tb: &TbBuilder) -> PyResult<Vec<H>> {
        Ok(tb
            .get()?
            .input_tensors()
            .into_iter()
            .map(Handle::index)
            .collect())
    }

    /// A snapshot of the graph built so far.
    fn graph(&self) -> PyGraph {
        PyGraph {
            lg: Arc::new(LoadedGraph {
                graph: self.b.snapshot(),
                source: SourceMap::default(),
            }),
            origin: "graph built in Python".into(),
            file: None,
            index: None,
        }
    }
}

/// The threadblock-graph builder behind `mucc.TBGraph`; tiles are integer handles.
#[pyclass(module = "mucc", name = "_TbBuilder")]
struct TbBuilder {
    tb: Option<TbGraphBuilder>,
}

impl TbBuilder {
    fn take(&mut self) -> PyResult<TbGraphBuilder> {
        self.tb.take().ok_or_else(used)
    }

    fn get(&self) -> PyResult<&TbGraphBuilder> {
        self.tb.as_ref().ok_or_else(used)
    }

    fn get_mut(&mut self) -> PyResult<&mut TbGraphBuilder> {
        self.tb.as_mut().ok_or_else(used)
    }
}

fn used() -> PyErr {
    graph_err("this threadblock graph was already used by customized(); build a new one")
}

fn tile(t: H) -> Handle<mucc::graph::STensor> {
    Handle::from_index(t)
}

#[pymethods]
impl TbBuilder {
    #[new]
    fn new(
        grid: [usize; 3],
        block: [usize; 3],
        forloop_range: usize,
        reduction_dimx: usize,
    ) -> PyResult<Self> {
        if forloop_range == 0 || reduction_dimx == 0 {
            return Err(graph_err(format!(
                "new_threadblock_graph: forloop_range ({forloop_range}) and reduction_dimx ({reduction_dimx}) must be positive"
            )));
        }
        Ok(TbBuilder {
            tb: Some(
                TbGraphBuilder::new(grid, block, forloop_range).with_reduction_dimx(reduction_dimx),
            ),
        })
    }

    fn new_input(
        &mut self,
        kb: &KernelBuilder,
        t: H,
        imap: [i32; 3],
        forloop_dim: i32,
    ) -> PyResult<H> {
        self.get_mut()?
            .new_input(&kb.b, Handle::from_index(t), imap, forloop_dim)
            .map(Handle::index)
            .map_err(graph_err)
    }

    fn new_output(&mut self, s: H, omap: [i32; 3], forloop_dim: i32) -> PyResult<()> {
        if forloop_dim >= 0 {
            return Err(graph_err(format!(
                "tb_output_op: forloop_dim {forloop_dim}: outputs written every iteration are not supported by mucc (only -1: written once after the loop)"
            )));
        }
        self.get_mut()?.new_output(tile(s), omap).map_err(graph_err)
    }

    fn matmul(&mut self, a: H, b: H) -> PyResult<H> {
        self.get_mut()?
            .matmul(tile(a), tile(b))
            .map(Handle::index)
            .map_err(graph_err)
    }

    fn unary(&mut self, op: &str, x: H) -> PyResult<H> {
        let op = unary_op(op)?;
        self.get_mut()?
            .unary(op, tile(x))
            .map(Handle::index)
            .map_err(graph_err)
    }

    fn clamp(&mut self, x: H, min: f64, max: f64) -> PyResult<H> {
        self.get_mut()?
            .clamp(tile(x), min, max)
            .map(Handle::index)
            .map_err(graph_err)
    }

    fn mul_scalar(&mut self, x: H, s: f64) -> PyResult<H> {
        self.get_mut()?
            .mul_scalar(tile(x), s)
            .map(Handle::index)
            .map_err(graph_err)
    }

    fn binary(&mut self, op: &str, a: H, b: H) -> PyResult<H> {
        let op = binary_op(op)?;
        self.get_mut()?
            .binary(op, tile(a), tile(b))
            .map(Handle::index)
            .map_err(graph_err)
    }

    fn reduction(&mut self, x: H, dim: usize) -> PyResult<H> {
        self.get_mut()?
            .reduction(tile(x), dim)
            .map(Handle::index)
            .map_err(graph_err)
    }

    fn reduction_to_dimx(&mut self, x: H, dim: usize) -> PyResult<H> {
        self.get_mut()?
            .reduction_to_dimx(tile(x), dim)
            .map(Handle::index)
            .map_err(graph_err)
    }

    fn reduction_max(&mut self, x: H, dim: usize) -> PyResult<(H, H)> {
        self.get_mut()?
            .reduction_max(tile(x), dim)
            .map(|(a, b)| (a.index(), b.index()))
            .map_err(graph_err)
    }

    fn rms_norm(&mut self, x: H) -> PyResult<H> {
        self.get_mut()?
            .rms_norm(tile(x))
            .map(Handle::index)
            .map_err(graph_err)
    }

    fn concat(&mut self, a: H, b: H, dim: usize) -> PyResult<H> {
        self.get_mut()?
            .concat(tile(a), tile(b), dim)
            .map(Handle::index)
            .map_err(graph_err)
    }

    #[pyo3(signature = (x, acc = None))]
    fn forloop_accum(&mut self, x: H, acc: Option<&str>) -> PyResult<H> {
        let kind = match acc {
            None => AccumKind::Nored,
            Some("sum") => AccumKind::RedLdSum,
            Some("mean") => AccumKind::RedLdMean,
            Some("rms") => AccumKind::RedLdRms,
            Some("sum_todimx") => AccumKind::RedtoxLdSum,
            Some(o) => {
                return Err(PyValueError::new_err(format!(
                    "forloop_accum: acc `{o}` is none of None, 'sum', 'mean', 'rms', 'sum_todimx'"
                )));
            }
        };
        self.get_mut()?
            .forloop_accum(tile(x), kind)
            .map(Handle::index)
            .map_err(graph_err)
    }

    #[pyo3(signature = (x, rescale, acc = None))]
    fn forloop_accum_rescale(&mut self, x: H, rescale: H, acc: Option<&str>) -> PyResult<H> {
        let kind = match acc {
            None => AccumKind::NoredRescale,
            Some("sum") => AccumKind::RedLdSumRescale,
            Some(o) => {
                return Err(PyValueError::new_err(format!(
                    "forloop_accum_rescale: acc `{o}` is none of None, 'sum'"
                )));
            }
        };
        self.get_mut()?
            .forloop_accum_rescale(tile(x), tile(rescale), kind)
            .map(Handle::index)
            .map_err(graph_err)
    }

    fn tile_shape(&self, s: H) -> PyResult<Vec<usize>> {
        self.get()?
            .tile_shape(tile(s))
            .map(|s| s.dims().to_vec())
            .ok_or_else(|| {
                graph_err(format!(
                    "tile {s} does not belong to this threadblock graph"
                ))
            })
    }

    fn tile_dtype(&self, s: H) -> PyResult<String> {
        self.get()?
            .tile_dtype(tile(s))
            .map(|d| d.name().to_string())
            .ok_or_else(|| {
                graph_err(format!(
                    "tile {s} does not belong to this threadblock graph"
                ))
            })
    }
}

/// A graph compiled for one GPU: launches on caller-owned buffers and streams.
#[pyclass(module = "mucc", name = "_Kernel", unsendable)]
struct Kernel {
    /// The calling state (torch facts, workspaces, captured replays). First, so that the
    /// replays are dropped before the program and the GPU.
    calls: std::cell::RefCell<call::Calls>,
    gpu: Gpu,
    prog: Program,
    source: String,
    explain: String,
    origin: String,
    device: usize,
    tuned: Option<String>,
}

#[pymethods]
impl Kernel {
    /// Inputs in order: (shape, strides, dtype, elements to allocate).
    #[getter]
    fn input_specs(&self) -> Vec<Spec> {
        self.plan().inputs.iter().map(spec).collect()
    }

    /// Outputs in order: (shape, strides, dtype, elements to allocate).
    #[getter]
    fn output_specs(&self) -> Vec<Spec> {
        self.plan().outputs.iter().map(spec).collect()
    }

    /// Bytes of device workspace one execution needs.
    #[getter]
    fn workspace_bytes(&self) -> usize {
        self.plan().workspace_bytes
    }

    /// The CUDA device ordinal.
    #[getter]
    fn device(&self) -> usize {
        self.device
    }

    /// The target (`sm_80`, `sm_90a`).
    #[getter]
    fn arch(&self) -> &'static str {
        self.gpu.arch.name()
    }

    /// The GPU's name.
    #[getter]
    fn gpu_name(&self) -> &str {
        &self.gpu.name
    }

    /// The generated CUDA C++.
    #[getter]
    fn source(&self) -> &str {
        &self.source
    }

    /// The plan as text.
    #[getter]
    fn explain(&self) -> &str {
        &self.explain
    }

    /// Where the graph came from.
    #[getter]
    fn origin(&self) -> &str {
        &self.origin
    }

    /// The tuned variant applied, if any.
    #[getter]
    fn tuned(&self) -> Option<&str> {
        self.tuned.as_deref()
    }

    /// Kernels and cuBLAS calls per execution.
    #[getter]
    fn steps(&self) -> usize {
        self.plan().steps.len()
    }

    /// Queues one execution on `stream` (a `CUstream` address; 0: the legacy default stream)
    /// over device addresses the caller owns (checked by the Python wrapper against the specs).
    fn _launch(
        &self,
        inputs: Vec<u64>,
        outputs: Vec<u64>,
        workspace: u64,
        stream: usize,
    ) -> PyResult<()> {
        let bufs = RawBuffers {
            inputs: &inputs,
            outputs: &outputs,
            workspace,
        };
        // SAFETY: the Python wrapper passes the addresses of live CUDA tensors of this device,
        // of the plan's shapes, strides and sizes (outputs distinct, freshly allocated or
        // checked `out=` tensors), kept alive by the caller's stream-ordered allocator, and the
        // address of a stream of the device's primary context (PyTorch's current stream).
        unsafe {
            self.gpu
                .execute_raw(&self.prog, bufs, stream as cudarc::driver::sys::CUstream)
        }
        .map_err(cuda_err)
    }

    /// Queues one execution over these addresses (checked by the Python wrapper) through the
    /// kernel's launcher: a kept CUDA-graph replay of them, else plain launches, captured
    /// afterwards when `capture` or when the previous call had the same addresses.
    fn _run(
        &self,
        inputs: Vec<u64>,
        outputs: Vec<u64>,
        workspace: u64,
        stream: usize,
        capture: bool,
    ) -> PyResult<()> {
        let bufs = RawBuffers {
            inputs: &inputs,
            outputs: &outputs,
            workspace,
        };
        // SAFETY: as for `_launch`; replays are keyed by their addresses and dropped with the
        // kernel before its program (field order).
        unsafe {
            self.calls.borrow_mut().launcher.run(
                &self.gpu,
                &self.prog,
                bufs,
                stream as cudarc::driver::sys::CUstream,
                capture,
            )
        }
        .map_err(cuda_err)
    }

    /// Records the facts torch calls are compared with: the tensor type, per input and output
    /// (shape tuple, strides tuple, torch dtype, whether the plan writes within that span,
    /// whether the strides are row-major), per output (template tensor, shape tuple, strides
    /// tuple, torch dtype, elements to allocate, dense), the device, the current-stream query,
    /// a `uint8` template for the workspace, and torch's `_empty_strided_cuda` where this torch
    /// has it.
    #[allow(clippy::too_many_arguments)]
    fn _torch_setup(
        &self,
        tensor_type: Py<pyo3::types::PyType>,
        args: Vec<call::ArgTuple>,
        outs: Vec<call::OutTuple>,
        device: i64,
        raw_stream: Py<PyAny>,
        bytes_template: Py<PyAny>,
        empty_strided: Option<Py<PyAny>>,
    ) {
        self.calls.borrow_mut().set_torch(
            tensor_type,
            args,
            outs,
            device,
            bytes_template,
            call::TorchHelpers {
                raw_stream,
                empty_strided,
            },
        );
    }

    /// One call on torch tensors on the fast path (see `call::Calls::call_torch`); `None` when
    /// an argument needs the wrapper's slow path (nothing was queued).
    #[pyo3(signature = (inputs, out, trusted, stream, capture))]
    fn _call_torch<'py>(
        &self,
        py: Python<'py>,
        inputs: &Bound<'py, PyAny>,
        out: Option<&Bound<'py, PyAny>>,
        trusted: bool,
        stream: Option<&Bound<'py, PyAny>>,
        capture: bool,
    ) -> PyResult<Option<Bound<'py, pyo3::types::PyList>>> {
        self.calls.borrow_mut().call_torch(
            py, &self.gpu, &self.prog, inputs, out, trusted, stream, capture,
        )
    }

    /// The workspace's address for `stream` (allocated once per stream; 0 without one).
    fn _workspace(&self, py: Python<'_>, stream: usize) -> PyResult<u64> {
        let (bytes, zeroed) = (self.plan().workspace_bytes, self.plan().counter_bytes > 0);
        self.calls
            .borrow_mut()
            .workspace(py, bytes, zeroed, stream)?
            .ok_or_else(|| {
                cuda_err("the workspace is allocated through torch, which is not set up")
            })
    }

    /// Whether plain calls capture recurring addresses into CUDA graphs (default true).
    #[getter]
    fn get_auto_replay(&self) -> bool {
        self.calls.borrow().launcher.auto
    }

    #[setter]
    fn set_auto_replay(&self, on: bool) {
        let mut c = self.calls.borrow_mut();
        c.launcher.auto = on;
        if on {
            c.launcher.capture_error = None;
        }
    }

    /// How many captures are kept (the most recently used; default 8).
    #[getter]
    fn get_keep(&self) -> usize {
        self.calls.borrow().launcher.keep
    }

    #[setter]
    fn set_keep(&self, keep: usize) {
        self.calls.borrow_mut().launcher.keep = keep.max(1);
    }

    /// Captures kept.
    #[getter]
    fn replays(&self) -> usize {
        self.calls.borrow().launcher.kept()
    }

    /// Captures made so far.
    #[getter]
    fn captures(&self) -> usize {
        self.calls.borrow().launcher.captures
    }

    /// Why a plain call's capture failed, which stopped plain calls capturing.
    #[getter]
    fn capture_error(&self) -> Option<String> {
        self.calls.borrow().launcher.capture_error.clone()
    }

    /// Drops every capture.
    fn _drop_replays(&self) {
        self.calls.borrow_mut().launcher.clear();
    }

    /// Waits for the GPU's work (for errors that surface only when the work ends).
    fn _synchronize(&self) -> PyResult<()> {
        self.gpu.ctx_synchronize().map_err(cuda_err)
    }
}

impl Kernel {
    fn plan(&self) -> &LaunchPlan {
        self.prog.plan()
    }
}

fn open_gpu(device: usize) -> PyResult<Gpu> {
    Gpu::open(device).map_err(cuda_err)
}

/// Validates, plans, emits and compiles `graph` (NVRTC, disk cache) for GPU `device`; `warps`
/// ("auto", "graph" or a number) is the CTA shape of threadblock kernels.
#[pyfunction]
#[pyo3(
    signature = (graph, device = 0, tune = true, path = "auto", warps = WarpsArg::Name("auto".into())),
    text_signature = "(graph, device=0, tune=True, path='auto', warps='auto')"
)]
fn compile(
    py: Python<'_>,
    graph: &PyGraph,
    device: usize,
    tune: bool,
    path: &str,
    warps: WarpsArg,
) -> PyResult<Kernel> {
    let path = parse_path(path)?;
    let cta = parse_warps(warps)?;
    py.detach(|| {
        let g = graph.validated()?;
        let gpus = g.sharding.num_gpus();
        if gpus > 1 {
            return Err(compile_err(format!(
                "{}: the graph runs on {gpus} GPUs (its mesh); the Python package runs graphs on \
                 one GPU only so far (`mucc run --gpus {gpus}` runs and checks it)",
                graph.origin
            )));
        }
        let mut gpu = open_gpu(device)?;
        let (opts, tuned) = options(g, gpu.arch, path, cta, tune);
        let (p, e) = mucc::transpile::transpile(g, &opts, &graph.origin)
            .map_err(|e| compile_err(format!("{}: {e}", graph.origin)))?;
        let compiler = Compiler::new(CompilerOptions::default()).map_err(compile_err)?;
        let name = mucc::emit::cxx::comment_safe(&format!("{}.{}.cu", graph.origin, gpu.arch));
        let cubin = compiler
            .compile(&Source {
                path: &name,
                text: &e.source,
                arch: gpu.arch,
            })
            .map_err(|e| compile_err(format!("{}: {e}", graph.origin)))?;
        let prog = gpu.load(&cubin.bytes, &e.launch).map_err(cuda_err)?;
        Ok(Kernel {
            explain: mucc::explain::explain(g, &p),
            source: e.source,
            gpu,
            prog,
            origin: graph.origin.clone(),
            device,
            tuned,
            calls: Default::default(),
        })
    })
}

/// Checks every graph of `graphs` on the GPU and times those that pass; returns (index, µs or
/// None, note) per graph, fastest verified first. Without `reference` each graph is checked
/// against the interpreter's evaluation of itself; with it, against the evaluation of
/// `reference` on the same inputs (so a candidate passes only if it computes that graph).
#[pyfunction]
#[pyo3(signature = (graphs, reference = None, device = 0, tune = true, seed = 1, scale = 1.0))]
fn _bench(
    py: Python<'_>,
    graphs: Vec<PyRef<'_, PyGraph>>,
    reference: Option<PyRef<'_, PyGraph>>,
    device: usize,
    tune: bool,
    seed: u64,
    scale: f64,
) -> PyResult<Vec<(usize, Option<f64>, String)>> {
    let lgs: Vec<(String, Arc<LoadedGraph>)> = graphs
        .iter()
        .map(|g| (g.origin.clone(), g.lg.clone()))
        .collect();
    let reference = match &reference {
        Some(r) => Some((r.origin.clone(), r.validated()?.clone())),
        None => None,
    };
    py.detach(move || {
        let mut s = Session::open(&SessionOptions {
            device,
            no_tune: !tune,
            ..Default::default()
        })
        .map_err(cuda_err)?;
        let budget = interp::Budget::default();
        let shared = match &reference {
            Some((origin, g)) => Some(
                mucc::cuda::session::inputs_and_reference(g, seed, scale, &budget)
                    .map_err(|e| graph_err(format!("{origin}: {e}")))?,
            ),
            None => None,
        };
        // A Python graph's origin names it ("FILE, graph N" or "graph built in Python").
        let candidates: Vec<Candidate<'_>> = lgs
            .iter()
            .map(|(origin, lg)| Candidate {
                name: origin,
                index: None,
                graph: lg,
            })
            .collect();
        let inputs = InputChoice {
            seed,
            scale,
            check: true,
            budget,
        };
        let ranked = s.rank(
            &candidates,
            inputs,
            shared.as_ref(),
            &TimingOptions::default(),
        );
        Ok(ranked
            .into_iter()
            .map(|r| {
                let origin = &lgs[r.position].0;
                match r.outcome {
                    Ok(m) if m.passed() => {
                        (r.position, Some(m.timing.median_us), "verified".into())
                    }
                    Ok(m)
                        if m.check
                            .as_ref()
                            .is_some_and(|c| c.iter().all(|c| c.passed())) =>
                    {
                        (
                            r.position,
                            None,
                            "its outputs are not all finite after the timed runs".into(),
                        )
                    }
                    Ok(_) if reference.is_some() => (
                        r.position,
                        None,
                        "its outputs differ from the reference graph's".into(),
                    ),
                    Ok(_) => (
                        r.position,
                        None,
                        "failed the check against the interpreter".into(),
                    ),
                    Err(e) => (r.position, None, format!("{origin}: {e}")),
                }
            })
            .collect())
    })
}

/// Whether a CUDA driver library can be loaded on this machine.
#[pyfunction]
fn driver_available() -> bool {
    mucc::cuda::run::driver_available()
}

/// The NVRTC version mucc compiles with, if NVRTC can be loaded.
#[pyfunction]
fn nvrtc_version() -> Option<(i32, i32)> {
    Compiler::new(CompilerOptions::default())
        .ok()
        .map(|c| c.nvrtc_version())
}

#[pymodule]
fn _mucc(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("MuccError", py.get_type::<MuccError>())?;
    m.add("GraphError", py.get_type::<GraphError>())?;
    m.add("CompileError", py.get_type::<CompileError>())?;
    m.add("CudaError", py.get_type::<CudaError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<PyGraph>()?;
    m.add_class::<KernelBuilder>()?;
    m.add_class::<TbBuilder>()?;
    m.add_class::<Kernel>()?;
    m.add_function(wrap_pyfunction!(load, m)?)?;
    m.add_function(wrap_pyfunction!(compile, m)?)?;
    m.add_function(wrap_pyfunction!(_bench, m)?)?;
    m.add_function(wrap_pyfunction!(driver_available, m)?)?;
    m.add_function(wrap_pyfunction!(nvrtc_version, m)?)?;
    Ok(())
}
