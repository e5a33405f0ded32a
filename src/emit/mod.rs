//! CUDA C++ emission: askama templates rendered from small view structs, against the bundled
//! runtime headers (`runtime-headers/mucc`).
//!
//! The generated file holds one `extern "C" __global__` kernel per kernel-level operator (stable
//! names: `k{op}_{name}`), and a host entry `mucc_execute` (guarded out under NVRTC) that binds
//! the tensors — caller inputs, caller outputs, workspace offsets — and runs every step on the
//! caller's stream, checking every call. The [`launch::LaunchPlan`] describes the same steps for
//! a runner that loads the kernels itself. Emission is deterministic.

pub mod cublas;
mod kernel_level;
pub mod launch;
mod threadblock;

use askama::Template;

use crate::graph::kernel::KernelGraph;
use crate::pipeline::GraphPlan;

pub use launch::LaunchPlan;

/// Why a planned graph cannot be emitted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EmitError {
    /// A customized operator (threadblock kernels are emitted by a later stage).
    #[error(
        "not yet supported: customized operator (kernel op {op}, kn_customized_op): mucc does not emit threadblock kernels yet"
    )]
    Customized {
        /// Kernel op index.
        op: usize,
    },
    /// An operator mucc cannot emit, with the reason.
    #[error("kernel op {op} ({name}): {reason}")]
    Unsupported {
        /// Kernel op index.
        op: usize,
        /// Mirage name.
        name: String,
        /// Why.
        reason: String,
    },
    /// The template failed to render (a bug).
    #[error("internal: template rendering failed: {0}")]
    Template(String),
}

/// The emitted file and its launch plan.
#[derive(Clone, Debug)]
pub struct Emitted {
    /// CUDA C++ source.
    pub source: String,
    /// How to run it without the host entry.
    pub launch: LaunchPlan,
}

/// A kernel of the generated file.
#[derive(Clone, Debug)]
struct KernelView {
    comment: String,
    name: String,
    /// The arguments of `__launch_bounds__`.
    launch_bounds: String,
    preamble: Vec<String>,
    params: String,
    body: Vec<String>,
}

/// A step of the host entry.
#[derive(Clone, Debug)]
struct HostStep {
    comment: String,
    lines: Vec<String>,
}

#[derive(Template)]
#[template(path = "graph.cu")]
struct FileView {
    version: &'static str,
    source: String,
    arch: String,
    io_lines: Vec<String>,
    kernels: Vec<KernelView>,
    tensors: Vec<String>,
    steps: Vec<HostStep>,
    workspace: usize,
    uses_workspace: bool,
}

/// Emits a planned graph. `source` describes where the graph came from (for the header).
pub fn emit(g: &KernelGraph, plan: &GraphPlan, source: &str) -> Result<Emitted, EmitError> {
    let parts = kernel_level::lower(g, plan)?;
    let view = FileView {
        version: env!("CARGO_PKG_VERSION"),
        source: source.to_string(),
        arch: plan.target.arch.to_string(),
        io_lines: parts.io_lines,
        kernels: parts.kernels,
        tensors: parts.tensors,
        steps: parts.steps,
        workspace: plan.workspace_bytes(),
        uses_workspace: plan
            .dtensors
            .iter()
            .any(|d| matches!(d.placement, crate::pipeline::Placement::Workspace(_))),
    };
    let mut source = view
        .render()
        .map_err(|e| EmitError::Template(e.to_string()))?;
    if !source.ends_with('\n') {
        source.push('\n');
    }
    Ok(Emitted {
        source,
        launch: parts.launch,
    })
}
