// mucc runtime, threadblock level: C[M, N] (+)= A[M, K]·B[K, N] on shared-memory tiles with
// mma.sync m16n8k16 and fp32 accumulators (fp16 and bf16), or with FMAs (other types).
#pragma once

#include "../arch/sm80.h"
#include "../layout.h"

namespace mucc {
namespace tb {

// A warp grid of WM × WN warps covers the ⌈M/16⌉ × ⌈N/8⌉ MMA tiles; warp (wm, wn) takes m-tiles
// wm, wm+WM, … and n-tiles wn, wn+WN, …; `Frag` holds its fp32 accumulators. Elements outside
// M, N or K read as zero (any shape is correct); warps beyond WM·WN do nothing.
//
// LOAD_A and LOAD_B say how the operands load (the plan decides, see sched::ops::operand_loads;
// a static_assert checks that the tile allows it): `ldmatrix` needs whole 16-byte chunks along
// one of the tile's two matrix dims (that dim contiguous and a multiple of 8 elements, the other
// stride a multiple of 8, a swizzle that moves chunks only); A and B with K contiguous load
// plainly, A with M contiguous and B with N contiguous with `.trans`. A lane whose 16-byte row
// lies outside the matrix points at `zero`, 16 zero bytes of shared memory (the zero page), so
// partial MMA tiles need no masking around `ldmatrix`. Tiles with K contiguous and even (the other
// stride even, 2-element chunks kept whole) load K-consecutive pairs with one 32-bit load
// (`Pairs`); other tiles load element by element. With M ≤ 8 the A fragment's rows 8–15 are
// zero without a load.
// `ldmatrix` and `mma.sync` are `.aligned`: every lane of the warp must execute the same
// instruction together. Element loads and the zero-page selects may leave the warp diverged
// (independent thread scheduling does not promise reconvergence), so a `__syncwarp()` precedes
// each of them. Addresses are selected without branches (`chunk_addr`, `a_at`, `b_at`): with
// `cond ? tile + offset : zero` the compiler fed ldmatrix from a branch-dependent register and
// the sm_80/sm_90a code read wrong addresses (out of bounds in gated_mlp graph 23, wrong values
// with both operands by ldmatrix); docs/gpu-checks.md has the history.
// Preconditions: T is f16 or bf16; the block has at least WM·WN full warps; tile pointers and
// `zero` are 16-byte aligned shared memory; the leading (batch) dims of the tiles are 1.
// How an operand reaches registers.
struct Load {
  static constexpr int Ldmatrix = 0;
  static constexpr int LdmatrixTrans = 1;
  static constexpr int Elements = 2;
  static constexpr int Pairs = 3;
};

template <class T, class LA, class LB, i64 M, i64 N, i64 K, int WM, int WN, int LOAD_A, int LOAD_B>
struct Mma {
  static constexpr int MT = static_cast<int>((M + 15) / 16);
  static constexpr int NT8 = static_cast<int>((N + 7) / 8);
  static constexpr int PM = (MT + WM - 1) / WM;
  static constexpr int PN = (NT8 + WN - 1) / WN;
  struct Frag {
    float v[PM][PN][4];
  };

  using TA = LayoutTraits<LA>;
  using TB = LayoutTraits<LB>;
  static constexpr i64 a_sm = TA::template stride<LA::rank - 2>, a_sk = TA::template stride<LA::rank - 1>;
  static constexpr i64 b_sk = TB::template stride<LB::rank - 2>, b_sn = TB::template stride<LB::rank - 1>;
  static constexpr bool a_chunks = sizeof(T) == 2 && TA::kept_chunk_log2 >= 3;
  static constexpr bool b_chunks = sizeof(T) == 2 && TB::kept_chunk_log2 >= 3;
  // A by ldmatrix with K contiguous, or with M contiguous (.trans).
  static constexpr bool a_k = LOAD_A == Load::Ldmatrix;
  static constexpr bool a_m = LOAD_A == Load::LdmatrixTrans;
  static_assert(!a_k || (a_chunks && a_sk == 1 && K % 8 == 0 && (M == 1 || a_sm % 8 == 0)),
                "A cannot load by ldmatrix with this layout");
  static_assert(!a_m || (a_chunks && a_sm == 1 && M % 8 == 0 && (K == 1 || a_sk % 8 == 0)),
                "A cannot load by ldmatrix.trans with this layout");
  // B by ldmatrix with K contiguous, or with N contiguous (.trans).
  static constexpr bool b_k = LOAD_B == Load::Ldmatrix;
  static constexpr bool b_n = LOAD_B == Load::LdmatrixTrans;
  static_assert(!b_k || (b_chunks && b_sk == 1 && K % 8 == 0 && (N == 1 || b_sn % 8 == 0)),
                "B cannot load by ldmatrix with this layout");
  static_assert(!b_n || (b_chunks && b_sn == 1 && N % 8 == 0 && (K == 1 || b_sk % 8 == 0)),
                "B cannot load by ldmatrix.trans with this layout");
  // A or B by 32-bit loads of K-consecutive pairs.
  static constexpr bool a_pairs = LOAD_A == Load::Pairs;
  static constexpr bool b_pairs = LOAD_B == Load::Pairs;
  static_assert(!a_pairs || (sizeof(T) == 2 && TA::kept_chunk_log2 >= 1 && a_sk == 1 && K % 2 == 0 &&
                             (M == 1 || a_sm % 2 == 0)),
                "A cannot load by pairs with this layout");
  static_assert(!b_pairs || (sizeof(T) == 2 && TB::kept_chunk_log2 >= 1 && b_sk == 1 && K % 2 == 0 &&
                             (N == 1 || b_sn % 2 == 0)),
                "B cannot load by pairs with this layout");

  __device__ __forceinline__ static void fill(Frag& f, float x) {
#pragma unroll
    for (int i = 0; i < PM; ++i)
#pragma unroll
      for (int j = 0; j < PN; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) f.v[i][j][q] = x;
  }
  __device__ __forceinline__ static void zero(Frag& f) { fill(f, 0.0f); }

  // Element loads, also branch-free: an index outside the tile reads element 0 and yields zero.
  __device__ __forceinline__ static T a_at(const T* a, int r, int c) {
    const bool in = r < M && c < K;
    const T v = a[LA::offset(in ? r * static_cast<int>(K) + c : 0)];
    return in ? v : T(0.0f);
  }
  __device__ __forceinline__ static T b_at(const T* b, int k, int n) {
    const bool in = k < K && n < N;
    const T v = b[LB::offset(in ? k * static_cast<int>(N) + n : 0)];
    return in ? v : T(0.0f);
  }

  // Elements (r, c) and (r, c + 1) of A (c even) as one 32-bit word, zero outside the tile (K is
  // even: c < K means c + 1 < K); branch-free like a_at.
  __device__ __forceinline__ static unsigned a_pair(const T* a, int r, int c) {
    const bool in = r < M && c < K;
    const unsigned v = *reinterpret_cast<const unsigned*>(a + LA::offset(in ? r * static_cast<int>(K) + c : 0));
    return in ? v : 0u;
  }
  // Elements (k, n) and (k + 1, n) of B (k even) as one 32-bit word.
  __device__ __forceinline__ static unsigned b_pair(const T* b, int k, int n) {
    const bool in = k < K && n < N;
    const unsigned v = *reinterpret_cast<const unsigned*>(b + LB::offset(in ? k * static_cast<int>(N) + n : 0));
    return in ? v : 0u;
  }

  // The shared address of element (i, j) of a tile, or of the zero page when (i, j) is outside
  // I × J: computed without a branch (clamped index, then a select), so the ldmatrix that uses
  // it is not fed by a branch-dependent pointer.
  template <class L, i64 I, i64 J>
  __device__ __forceinline__ static unsigned chunk_addr(const T* t, const T* zero, int i, int j) {
    const bool in = i < I && j < J;
    const int e = in ? i * static_cast<int>(J) + j : 0;
    const unsigned p = sm80::smem_addr(t + L::offset(e));
    const unsigned z = sm80::smem_addr(zero);
    return in ? p : z;
  }

  __device__ __forceinline__ static void load_a(unsigned (&af)[4], const T* a, const T* zero, int mb, int k0, int lane) {
    if constexpr (a_k) {
      const int r = mb + (lane & 15), c = k0 + (lane >> 4) * 8;
      __syncwarp();
      sm80::ldmatrix_x4<false>(af, chunk_addr<LA, M, K>(a, zero, r, c));
    } else if constexpr (a_m) {
      const int q = lane >> 3;
      const int r = mb + (q & 1) * 8, c = k0 + (q >> 1) * 8 + (lane & 7);
      __syncwarp();
      sm80::ldmatrix_x4<true>(af, chunk_addr<LA, M, K>(a, zero, r, c));
    } else if constexpr (a_pairs) {
      const int r = mb + (lane >> 2), c = k0 + (lane & 3) * 2;
      af[0] = a_pair(a, r, c);
      af[2] = a_pair(a, r, c + 8);
      if constexpr (M <= 8) {
        af[1] = 0u;
        af[3] = 0u;
      } else {
        af[1] = a_pair(a, r + 8, c);
        af[3] = a_pair(a, r + 8, c + 8);
      }
    } else {
      const int r = mb + (lane >> 2), c = k0 + (lane & 3) * 2;
      af[0] = sm80::pack(a_at(a, r, c), a_at(a, r, c + 1));
      af[2] = sm80::pack(a_at(a, r, c + 8), a_at(a, r, c + 9));
      if constexpr (M <= 8) {
        af[1] = 0u;
        af[3] = 0u;
      } else {
        af[1] = sm80::pack(a_at(a, r + 8, c), a_at(a, r + 8, c + 1));
        af[3] = sm80::pack(a_at(a, r + 8, c + 8), a_at(a, r + 8, c + 9));
      }
    }
  }

  __device__ __forceinline__ static void load_b(unsigned (&bf)[2], const T* b, const T* zero, int nb, int k0, int lane) {
    if constexpr (b_k) {
      const int n = nb + (lane & 7), k = k0 + ((lane >> 3) & 1) * 8;
      __syncwarp();
      sm80::ldmatrix_x2<false>(bf, chunk_addr<LB, K, N>(b, zero, k, n));
    } else if constexpr (b_n) {
      const int k = k0 + (lane & 15);
      __syncwarp();
      sm80::ldmatrix_x2<true>(bf, chunk_addr<LB, K, N>(b, zero, k, nb));
    } else if constexpr (b_pairs) {
      const int n = nb + (lane >> 2), k = k0 + (lane & 3) * 2;
      bf[0] = b_pair(b, k, n);
      bf[1] = b_pair(b, k + 8, n);
    } else {
      const int n = nb + (lane >> 2), k = k0 + (lane & 3) * 2;
      bf[0] = sm80::pack(b_at(b, k, n), b_at(b, k + 1, n));
      bf[1] = sm80::pack(b_at(b, k + 8, n), b_at(b, k + 9, n));
    }
  }

  // Whole k-steps of 16 (the K % 16 tail, if any, takes the bounds-checked step), and whether an
  // operand loaded by ldmatrix may walk them by address increments: its K stride times 16 is a
  // multiple of its swizzle's period, so every lane's ldmatrix address moves by the same number
  // of bytes per step (none for a lane that reads the zero page).
  static constexpr int KF = static_cast<int>(K / 16) * 16;
  static constexpr bool a_walk = (a_k || a_m) && (16 * a_sk) % (1LL << TA::period_log2) == 0;
  static constexpr bool b_walk = (b_k || b_n) && (16 * b_sk) % (1LL << TB::period_log2) == 0;

  // This lane's ldmatrix address of A's m-tile at row mb in k-step 0, and its bytes per step.
  __device__ __forceinline__ static void a_lane(const T* a, const T* zero, int mb, int lane, unsigned& addr,
                                                unsigned& step) {
    int r, c;
    if constexpr (a_k) {
      r = mb + (lane & 15);
      c = (lane >> 4) * 8;
    } else {
      const int q = lane >> 3;
      r = mb + (q & 1) * 8;
      c = (q >> 1) * 8 + (lane & 7);
    }
    addr = chunk_addr<LA, M, K>(a, zero, r, c);
    step = r < M ? static_cast<unsigned>(16 * a_sk * static_cast<i64>(sizeof(T))) : 0u;
  }
  // This lane's ldmatrix address of B's n-tile at column nb in k-step 0, and its bytes per step.
  __device__ __forceinline__ static void b_lane(const T* b, const T* zero, int nb, int lane, unsigned& addr,
                                                unsigned& step) {
    int k, n;
    if constexpr (b_k) {
      n = nb + (lane & 7);
      k = ((lane >> 3) & 1) * 8;
    } else {
      n = nb;
      k = lane & 15;
    }
    addr = chunk_addr<LB, K, N>(b, zero, k, n);
    step = n < N ? static_cast<unsigned>(16 * b_sk * static_cast<i64>(sizeof(T))) : 0u;
  }

  // One k-step at k0 with every operand loaded by its bounds-checked path.
  __device__ __forceinline__ static void step(Frag& f, const T* a, const T* b, const T* z, int wm, int wn, int k0,
                                              int lane) {
    unsigned af[PM][4];
    unsigned bf[PN][2];
#pragma unroll
    for (int i = 0; i < PM; ++i) load_a(af[i], a, z, (wm + i * WM) * 16, k0, lane);
#pragma unroll
    for (int j = 0; j < PN; ++j) load_b(bf[j], b, z, (wn + j * WN) * 8, k0, lane);
    __syncwarp();
#pragma unroll
    for (int i = 0; i < PM; ++i)
#pragma unroll
      for (int j = 0; j < PN; ++j)
        if ((wm + i * WM) < MT && (wn + j * WN) < NT8) sm80::mma(f.v[i][j], af[i], bf[j], T());
  }

  // f += A·B for this warp's tiles; `zero` is the zero page.
  __device__ __forceinline__ static void run(Frag& f, const T* a, const T* b, const void* zero, int warp, int lane) {
    if (warp >= WM * WN) return;
    const T* z = static_cast<const T*>(zero);
    const int wm = warp / WN, wn = warp % WN;
    if constexpr (a_walk && b_walk && KF > 0) {
      // The whole k-steps: each lane's addresses are computed once, then advanced.
      unsigned aa[PM], as[PM], ba[PN], bs[PN];
#pragma unroll
      for (int i = 0; i < PM; ++i) a_lane(a, z, (wm + i * WM) * 16, lane, aa[i], as[i]);
#pragma unroll
      for (int j = 0; j < PN; ++j) b_lane(b, z, (wn + j * WN) * 8, lane, ba[j], bs[j]);
      for (int k0 = 0; k0 < KF; k0 += 16) {
        unsigned af[PM][4];
        unsigned bf[PN][2];
        __syncwarp();
#pragma unroll
        for (int i = 0; i < PM; ++i) {
          sm80::ldmatrix_x4<a_m>(af[i], aa[i]);
          aa[i] += as[i];
        }
#pragma unroll
        for (int j = 0; j < PN; ++j) {
          sm80::ldmatrix_x2<b_n>(bf[j], ba[j]);
          ba[j] += bs[j];
        }
        __syncwarp();
#pragma unroll
        for (int i = 0; i < PM; ++i)
#pragma unroll
          for (int j = 0; j < PN; ++j)
            if ((wm + i * WM) < MT && (wn + j * WN) < NT8) sm80::mma(f.v[i][j], af[i], bf[j], T());
      }
      if constexpr (KF < K) step(f, a, b, z, wm, wn, KF, lane);
    } else {
      for (int k0 = 0; k0 < K; k0 += 16) step(f, a, b, z, wm, wn, k0, lane);
    }
  }

  // g(row, col, value) for every element of A·B inside M × N in this warp's tiles, computed in
  // slices of one m-tile by up to 8 n-tiles, so registers stay bounded for any N (for results
  // that are stored or reduced rather than kept in a fragment).
  template <class G> __device__ __forceinline__ static void apply(const T* a, const T* b, const void* zero, int warp, int lane, G g) {
    if (warp >= WM * WN) return;
    constexpr int JC = PN < 8 ? PN : 8;
    const T* z = static_cast<const T*>(zero);
    const int wm = warp / WN, wn = warp % WN;
    const int gid = lane >> 2, tig = lane & 3;
    for (int i = 0; i < PM; ++i) {
      const int mt = wm + i * WM;
      if (mt >= MT) break;
      for (int j0 = 0; j0 < PN; j0 += JC) {
        float acc[JC][4];
#pragma unroll
        for (int jj = 0; jj < JC; ++jj)
#pragma unroll
          for (int q = 0; q < 4; ++q) acc[jj][q] = 0.0f;
        for (int k0 = 0; k0 < K; k0 += 16) {
          unsigned af[4];
          load_a(af, a, z, mt * 16, k0, lane);
#pragma unroll
          for (int jj = 0; jj < JC; ++jj) {
            const int nt = wn + (j0 + jj) * WN;
            if (j0 + jj < PN && nt < NT8) {
              unsigned bf[2];
              load_b(bf, b, z, nt * 8, k0, lane);
              __syncwarp();
              sm80::mma(acc[jj], af, bf, T());
            }
          }
        }
#pragma unroll
        for (int jj = 0; jj < JC; ++jj)
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int row = mt * 16 + gid + (q >= 2 ? 8 : 0);
            const int col = (wn + (j0 + jj) * WN) * 8 + tig * 2 + (q & 1);
            if (j0 + jj < PN && row < M && col < N) g(row, col, acc[jj][q]);
          }
      }
    }
  }

  // g(row, col, value, i, j, q) for every element of this warp's tiles inside M × N.
  template <class G> __device__ __forceinline__ static void each(Frag& f, int warp, int lane, G g) {
    if (warp >= WM * WN) return;
    const int wm = warp / WN, wn = warp % WN;
    const int gid = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int i = 0; i < PM; ++i)
#pragma unroll
      for (int j = 0; j < PN; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int row = (wm + i * WM) * 16 + gid + (q >= 2 ? 8 : 0);
          const int col = (wn + j * WN) * 8 + tig * 2 + (q & 1);
          if (row < M && col < N) g(row, col, f.v[i][j][q], i, j, q);
        }
  }
};

// C[e] = Σ_k A[row, k]·B[k, col] in the compute type, a thread per element of C (any types;
// the operands may differ, e.g. an fp32 accumulator tile times an fp16 tile).
template <class TA, class TB, class LA, class LB, i64 M, i64 N, i64 K> struct FmaMatmul {
  using C = decltype(to_compute(TA()) * to_compute(TB()));
  __device__ static C at(const TA* a, const TB* b, int row, int col) {
    C s = C(0);
    for (int k = 0; k < K; ++k) s += to_compute(a[LA::offset(row * K + k)]) * to_compute(b[LB::offset(k * N + col)]);
    return s;
  }
};

}  // namespace tb
}  // namespace mucc
