//! CUDA C++ emission from a [`GraphPlan`]: the emitter prints what the plan decided and
//! decides nothing itself.
//!
//! The generated file holds one `extern "C" __global__` kernel per kernel-level operator that
//! runs one (stable names: `k{op}_{name}`), and a host entry `mucc_execute` (guarded out under
//! NVRTC) rendered from the [`launch::LaunchPlan`], which describes the same steps for a runner
//! that loads the kernels itself. Kernel-level operators are printed by `kernel_level`,
//! customized operators by the code path their plan names (`threadblock` for
//! [`crate::sched::plan::CodePath::Sm80`]); C++ is spelled by [`cxx`]. Emission is
//! deterministic.

pub mod cxx;
pub mod header;
pub mod host;
pub mod ir;
mod kernel_level;
pub mod launch;
mod threadblock;

use askama::Template;

use crate::graph::arena::Handle;
use crate::graph::kernel::KernelGraph;
use crate::sched::kernel_level::KnOpPlan;
use crate::sched::plan::{CodePath, GraphPlan};
pub use host::HostStep;
use launch::{Step, TensorDirective};

pub use launch::LaunchPlan;

/// Why a planned graph cannot be emitted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EmitError {
    /// An operator the emitter cannot print, with the reason.
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
    /// A step of the launch plan binds a buffer the plan does not have (a bug).
    #[error(
        "internal: step {step} ({what}) binds {binding:?}, which the launch plan cannot resolve"
    )]
    Unresolved {
        /// Index of the launch-plan step.
        step: usize,
        /// The step: a kernel's name, "cuBLAS" or "NCCL".
        what: String,
        /// The binding.
        binding: launch::Binding,
    },
}

/// The emitted file and its launch plan.
#[derive(Clone, Debug)]
pub struct Emitted {
    /// CUDA C++ source.
    pub source: String,
    /// How to run it without the host entry.
    pub launch: LaunchPlan,
    /// The host entry's steps as statements ([`ir`]), one per launch-plan step (and the rank
    /// query first where a kernel all-reduces).
    pub host: Vec<HostStep>,
    /// The bodies of the kernels as statements, in kernel order: the kernel-level operators'
    /// kernels and the threadblock kernels (their declarations of layout and matmul-class
    /// aliases apart, which are text).
    pub bodies: Vec<ir::KernelBody>,
    /// Per threadblock kernel, in kernel order, its pipeline ring as statements: the prologue's
    /// copies and TMA issue blocks, the loop's waits for the current stage, the refill block
    /// (empty without a ring).
    pub rings: Vec<ir::KernelBody>,
}

/// A kernel of the generated file.
#[derive(Clone, Debug)]
struct KernelView {
    /// `// ` comment lines before it.
    comment: Vec<String>,
    /// Declarations before the kernel (lines, each ending in a newline; may be empty).
    preamble: String,
    /// The signature up to and including the opening brace.
    signature: String,
    /// The body's lines, indented one level, each ending in a newline.
    body: String,
}

impl KernelView {
    /// A kernel `name` with signature `sig` and `body` (lines at level 1).
    fn new(
        comment: &str,
        preamble: String,
        name: &str,
        sig: &ir::Signature,
        body: String,
    ) -> KernelView {
        KernelView {
            comment: cxx::comment(comment, 0),
            preamble,
            signature: cxx::typed_kernel_signature(name, sig),
            body,
        }
    }
}

#[derive(Template)]
#[template(path = "graph.cu")]
struct FileView {
    version: &'static str,
    header: Vec<String>,
    /// Runtime headers beyond `mucc/runtime.h` (Hopper features).
    includes: Vec<&'static str>,
    kernels: Vec<KernelView>,
    steps: Vec<HostStep>,
    workspace: usize,
    /// The host entry's signature up to the opening brace.
    entry_signature: String,
    /// GPUs of the graph's mesh (more than one: the entry takes an NCCL communicator).
    gpus: usize,
    /// Bytes of each GPU's exchange buffer (0: the entry takes none).
    exchange: usize,
    /// Bytes of arrival counters at the end of the workspace (0: none).
    counters: usize,
}

/// The caller's buffers and the workspace, as the header comment lists them, and as launch
/// directives.
fn io(
    g: &KernelGraph,
    plan: &GraphPlan,
) -> (Vec<String>, Vec<TensorDirective>, Vec<TensorDirective>) {
    let mut lines = Vec::new();
    let mut directive = |kind: &str, i: usize, io: &crate::sched::plan::IoPlan| {
        let d = &g.tensors[io.tensor];
        let alloc = if kind == "output" {
            format!(" ({} elements)", io.alloc_elems)
        } else {
            String::new()
        };
        lines.push(format!(
            "{kind} {i}: %{} {} {} strides {}{alloc}",
            io.tensor.index(),
            d.shape,
            d.dtype,
            io.strides
        ));
        TensorDirective {
            shape: d.shape.dims().to_vec(),
            strides: io.strides.0.clone(),
            alloc_elems: io.alloc_elems,
            dtype: d.dtype,
        }
    };
    let inputs: Vec<_> = plan
        .inputs
        .iter()
        .enumerate()
        .map(|(i, io)| directive("input", i, io))
        .collect();
    let outputs: Vec<_> = plan
        .outputs
        .iter()
        .enumerate()
        .map(|(j, io)| directive("output", j, io))
        .collect();
    lines.push(format!("workspace: {} bytes", plan.workspace_bytes()));
    (lines, inputs, outputs)
}

/// Emits a planned graph. `source` describes where the graph came from; it goes into the
/// header comment made safe ([`cxx::comment_safe`]), whatever it holds.
pub fn emit(g: &KernelGraph, plan: &GraphPlan, source: &str) -> Result<Emitted, EmitError> {
    let g = plan.graph(g);
    let (io_lines, inputs, outputs) = io(g, plan);
    let mut kernels = Vec::new();
    let mut bodies = Vec::new();
    let mut rings = Vec::new();
    let mut steps = Vec::new();
    for (h, op) in g.ops.iter() {
        match &plan.kernel_ops[h.index()] {
            KnOpPlan::Customized => {
                let kp = &plan.kernels[&h.index()];
                let k = match kp.path {
                    CodePath::Sm80 => threadblock::emit(g, plan, h, op, kp)?,
                };
                kernels.push(k.view);
                rings.push(k.ring);
                bodies.push(k.body);
                steps.push(Step::Kernel(k.launch));
            }
            other => {
                let triggers = plan.kernel_level_triggers.contains(&h.index());
                let (view, launch) = kernel_level::emit(
                    g,
                    Handle::from_index(h.index()),
                    op,
                    other,
                    &plan.symbols,
                    triggers,
                );
                if let Some((view, body)) = view {
                    kernels.push(view);
                    bodies.push(body);
                }
                steps.extend(launch);
            }
        }
    }
    let launch = LaunchPlan {
        arch: plan.target.arch,
        inputs,
        outputs,
        workspace_bytes: plan.workspace_bytes(),
        steps,
        gpus: plan.gpus,
        exchange_bytes: plan.exchange_bytes,
        counter_bytes: plan.counter_bytes,
        entry: plan.symbols.entry().to_string(),
    };
    // Header comment lines (the template prints "// " before each): wrapped to the line limit,
    // continuation lines indented.
    let mut header = Vec::new();
    for text in [
        format!("source: {}", cxx::comment_safe(source)),
        format!("target: {}", plan.target.arch),
    ]
    .into_iter()
    .chain((plan.gpus > 1).then(|| {
        format!(
            "GPUs: {} (mesh {}); the shapes below are each GPU's shards",
            plan.gpus,
            g.sharding.mesh_or_single()
        )
    }))
    .chain(io_lines)
    {
        for (i, l) in cxx::wrap(&text, cxx::MAX_LINE - 5).into_iter().enumerate() {
            header.push(if i == 0 { l } else { format!("  {l}") });
        }
    }
    let host_steps = host::steps(&launch)?;
    let view = FileView {
        version: env!("CARGO_PKG_VERSION"),
        header,
        includes: plan
            .runtime_headers()
            .into_iter()
            .map(cxx::runtime_header)
            .collect(),
        kernels,
        steps: host_steps.clone(),
        workspace: plan.workspace_bytes(),
        entry_signature: cxx::host_entry_signature(
            &launch.entry,
            launch.uses_nccl(),
            launch.uses_exchange(),
        ),
        gpus: launch.gpus,
        exchange: launch.exchange_bytes,
        counters: launch.counter_bytes,
    };
    let mut source = view
        .render()
        .map_err(|e| EmitError::Template(e.to_string()))?;
    if !source.ends_with('\n') {
        source.push('\n');
    }
    Ok(Emitted {
        source,
        launch,
        host: host_steps,
        bodies,
        rings,
    })
}
