//! GPU side: NVRTC compilation with a disk cache ([`compile`]), execution of launch plans
//! through cudarc ([`run`]), timing and ceilings ([`mod@bench`]), host data conversion and
//! comparison ([`data`]), a GPU session that prepares graphs for it ([`session`]), verified autotuning with a
//! persistent cache ([`tune`]), nvcc builds of libraries ([`nvcc`]), and graphs on several GPUs
//! through NCCL ([`multi`]).

pub mod bench;
pub mod compile;
pub mod data;
pub mod multi;
pub mod nvcc;
pub mod run;
pub mod session;
pub mod tune;

pub use compile::{CompileError, Compiler, CompilerOptions, Cubin, Source};
pub use run::{Buffers, Gpu, Program, RunError};
