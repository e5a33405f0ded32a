//! The µGraph IR and everything that works on it before planning: Mirage JSON import/export,
//! the builder API, validation and shape inference, and the CPU reference interpreter.
//!
//! A [`KernelGraph`] owns device tensors ([`DTensor`]) and kernel operators ([`KnOp`]) in
//! arenas; each customized operator owns its [`TbGraph`] (shared-memory tiles and threadblock
//! operators, grid, block and for-loop). Front ends produce this IR; [`validate()`] decides
//! whether it is well formed; later stages assume that it is.

pub mod arena;
pub mod builder;
pub mod cost;
pub mod display;
pub mod dtype;
pub mod error;
pub mod fusion;
pub mod infer;
pub mod interp;
pub mod kernel;
pub mod mirage_json;
pub mod ops;
pub mod random;
pub mod shape;
pub mod sharding;
pub mod source;
pub mod threadblock;
pub mod validate;
pub mod workloads;

pub use arena::{Arena, Handle};
pub use builder::{GraphBuilder, TbGraphBuilder};
pub use dtype::{DType, DtypeTable};
pub use error::{ErrorKind, GraphError, Location, ValidationErrors};
pub use kernel::{DTensor, KernelGraph, KnOp, KnOpKind};
pub use ops::{AccumKind, BinaryOp, DimMap, TbReduction, UnaryOp};
pub use shape::{Shape, Strides};
pub use sharding::{GpuMap, GpuMesh, Sharding};
pub use source::SourceMap;
pub use threadblock::{STensor, TbGraph, TbOp, TbOpKind};
pub use validate::validate;
