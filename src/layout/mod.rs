//! Layouts: which dim of each tensor is innermost and which tile dims are swizzled (Z3,
//! [`solve`]), the strides that follow ([`strides`]), and the swizzle and geometry of each
//! shared-memory tile ([`swizzle`], planned after scheduling from the chunk sizes the schedule
//! needs).

pub mod model;
pub mod solve;
pub mod strides;
pub mod swizzle;

pub use solve::{LayoutError, LayoutPlan, SolveOptions, resolve};

/// Threads per row when `threads` threads reduce `rows` rows of `len` elements: rows are
/// spread over threads first; leftover threads join rows in powers of two. Up to a warp, a
/// row's partial sums meet through warp shuffles; more than a warp joins a row (partial sums
/// then also meet in shared memory, between two barriers) only while every thread still gets
/// at least 8 of its elements — e.g. a whole block normalises one 4096-wide row. Shuffles need
/// whole warps: a block whose thread count is not a multiple of 32 reduces a row per thread.
/// The planner splits row reductions by it (`sched::ops::RowSplit`); the solver models their
/// walk from it.
pub fn threads_per_row(rows: usize, len: usize, threads: usize) -> usize {
    if rows >= threads || !threads.is_multiple_of(32) {
        return 1;
    }
    let mut t = 1;
    while rows * t * 2 <= threads && (t < 32 || len >= t * 2 * 8) {
        t *= 2;
    }
    t
}
