//! Compilation (NVRTC/nvcc), module cache, launch, timing and verification on a GPU. Not
//! implemented yet: filled by the GPU-run issue.
