//! Threadblock scheduling and memory planning (depth-topo order, barriers, op metadata,
//! shared-memory DSA, workspace reuse). Not implemented yet: filled by the planning issue.
