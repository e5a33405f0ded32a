//! CUDA C++ emission through askama templates against the bundled runtime headers. Not
//! implemented yet: filled by the emission issues.
