// mucc runtime, host side, for graphs that run on several GPUs: the error check of the NCCL
// all-reduce steps of mucc_execute. Generated files include it only when their graph's mesh
// has more than one GPU; it needs NCCL's nccl.h on the include path. Not compiled under NVRTC
// (the Rust runner calls NCCL itself).
#pragma once

#ifndef __CUDACC_RTC__
#include <nccl.h>

// mucc_execute returns MUCC_NCCL_ERROR_BASE + an ncclResult_t when an NCCL call fails.
#define MUCC_NCCL_ERROR_BASE 200000

#define MUCC_CHECK_NCCL(expr)                                                    \
  do {                                                                           \
    ncclResult_t mucc_nr_ = (expr);                                              \
    if (mucc_nr_ != ncclSuccess) return MUCC_NCCL_ERROR_BASE + (int)mucc_nr_;    \
  } while (0)
#endif
