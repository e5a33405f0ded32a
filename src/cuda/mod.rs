//! Compilation (NVRTC, with a disk cache), and later module loading, launch, timing and
//! verification on a GPU (the GPU-run issue).

pub mod compile;

pub use compile::{CompileError, Compiler, CompilerOptions, Cubin, Source};
