//! Threadblock scheduling ([`order`]), per-operator plans ([`meta`]) and memory planning
//! ([`memory`]): shared memory by DSA heuristics, the global workspace by liveness.

pub mod memory;
pub mod meta;
pub mod order;
