//! Layouts: which dim of each tensor is innermost and which tile dims are swizzled (Z3,
//! [`solve`]), the strides that follow ([`strides`]), and the swizzle and geometry of each
//! shared-memory tile ([`swizzle`], planned after scheduling from the chunk sizes the schedule
//! needs).

pub mod model;
pub mod solve;
pub mod strides;
pub mod swizzle;

pub use solve::{LayoutError, LayoutPlan, SolveOptions, resolve};
