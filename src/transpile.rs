//! The transpiler, top to bottom: plan ([`crate::sched::plan()`]), then emit
//! ([`crate::emit::emit`]).

use crate::emit::{EmitError, Emitted};
use crate::graph::kernel::KernelGraph;
use crate::sched::{GraphPlan, Options, PlanError};

/// Why a graph cannot be transpiled.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TranspileError {
    /// Planning failed.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// Emission failed.
    #[error(transparent)]
    Emit(#[from] EmitError),
}

/// Plans and emits a validated graph; `source` names it in the generated file's header.
pub fn transpile(
    g: &KernelGraph,
    opts: &Options,
    source: &str,
) -> Result<(GraphPlan, Emitted), TranspileError> {
    let p = crate::sched::plan(g, opts)?;
    let e = crate::emit::emit(g, &p, source)?;
    Ok((p, e))
}
