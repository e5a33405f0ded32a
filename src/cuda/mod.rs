//! GPU side: NVRTC compilation with a disk cache ([`compile`]), execution of launch plans
//! through cudarc ([`run`]), timing and ceilings ([`bench`]), and host data conversion and comparison ([`data`]).

pub mod bench;
pub mod compile;
pub mod data;
pub mod run;

pub use compile::{CompileError, Compiler, CompilerOptions, Cubin, Source};
pub use run::{Buffers, Gpu, Program, RunError};
