// mucc runtime: the header every generated file includes. Header-only, no CUTLASS, no C++
// standard library; compiles under nvcc and NVRTC.
//
//   types.h               element types, compute types, Vec<T, N>
//   layout.h              Shape, Stride, Layout, Swizzle, SwizzledLayout
//   ops.h                 scalar operators (op::exp, op::silu, op::gelu, …)
//   kernel/elementwise.h  kn::unary, kn::binary, kn::copy
//   kernel/reduction.h    kn::reduce, kn::rms_norm, kn::softmax_combine
//   arch/sm80.h           cp.async, mma.sync m16n8k16 (fp32 accumulators)
//   arch/sm90.h           Hopper: mbarriers, TMA loads/stores/multicast, clusters, setmaxnreg,
//                         programmatic dependent launch (sm_90a only: not included here;
//                         Hopper code includes it itself)
//   threadblock/cluster.h sm_90a: partial accumulators of a cluster folded into CTA 0 (not
//                         included here either)
//   threadblock/loops.h   tb::for_each, for_each_unrolled, group_sum, block_sums, for_each_row (tb::Add, tb::Max), rms_rows
//   threadblock/copy.h    tb::copy_chunks, cp_async_chunks, copy_elems (tile <-> device tensor)
//   threadblock/accum.h   tb::acc_add, acc_max, acc_rescale, max_of, fill, running_max
//   threadblock/matmul.h  tb::Mma (tensor cores), tb::FmaMatmul
//   threadblock/arrival.h tb::arrive_last, combine_splits (the last block of a group combines)
//   host.h                error checks and cuBLAS (host only, not under NVRTC)
//   nccl.h                NCCL error checks for multi-GPU graphs (host only; included by
//                         generated files whose graph runs on several GPUs)
#pragma once

#include "types.h"
#include "layout.h"
#include "ops.h"
#include "kernel/elementwise.h"
#include "kernel/reduction.h"
#include "arch/sm80.h"
#include "threadblock/loops.h"
#include "threadblock/copy.h"
#include "threadblock/accum.h"
#include "threadblock/matmul.h"
#include "threadblock/arrival.h"
#include "host.h"
