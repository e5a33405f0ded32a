//! mucc: a µGraph-to-CUDA transpiler.
//!
//! mucc reads µGraphs — Mirage's two-level kernel graphs — from Mirage's saved JSON or from the
//! Rust builder API, validates them, evaluates them on the CPU as a reference, plans them and
//! emits CUDA C++, which it compiles with NVRTC. The pipeline and its stages are described in `DESIGN.md`
//! of the shared project folder; this crate follows its layout:
//!
//! - [`graph`]: IR, Mirage JSON import/export, builder, validation, CPU interpreter;
//! - [`layout`], [`sched`]: planning — every decision, recorded in a typed plan;
//! - [`explain`]: the plan as text; [`emit`]: CUDA C++ printed from the plan;
//! - [`transpile`]: plan then emit; [`cuda`]: NVRTC/nvcc compilation with a disk cache,
//!   execution of launch plans through cudarc, timing;
//! - `buildscript` (feature `buildscript`, on by default): µGraphs compiled into a Rust crate
//!   from its build script, with typed bindings.
//!
//! `ARCHITECTURE.md` in the repository names each stage, its types and the command that shows
//! its result.

#![warn(missing_docs)]
// Loops over the three grid axes and the four padded dims index several arrays at once; an
// index is the clearest way to write them.
#![allow(clippy::needless_range_loop)]

#[cfg(feature = "buildscript")]
pub mod buildscript;
pub mod cuda;
pub mod emit;
pub mod explain;
pub mod graph;
pub mod layout;
pub mod outputs;
pub mod sched;
pub mod target;
pub mod text;
pub mod transpile;

pub use graph::mirage_json::{
    ExportOptions, FileForm, ImportOptions, LoadedGraph, MirageFile, parse_str, read_file,
};
pub use graph::{GraphError, KernelGraph, ValidationErrors, validate};
