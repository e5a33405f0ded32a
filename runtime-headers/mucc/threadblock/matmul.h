// mucc runtime, threadblock level: C[M, N] (+)= A[M, K]·B[K, N] on shared-memory tiles with
// mma.sync m16n8k16 and fp32 accumulators (fp16 and bf16), or with FMAs (other types).
#pragma once

#include "../arch/sm80.h"
#include "../arch/sm90_wgmma.h"
#include "../layout.h"
#include "../ops.h"

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
  // A only: the fp32 fragment of the matmul that produced it, in registers (`run_from`).
  static constexpr int Fragment = 4;
  // B only: wgmma reads the tile through a shared-memory descriptor (sm_90a; the warpgroup
  // paths of `run`, with A by ldmatrix, and of `run_from`).
  static constexpr int Wgmma = 5;
};

// WK > 1 (only with A in registers, `run_from_keys`): WK warps split K, each computing the whole
// M × N product of its share of K into its own `Frag`; `combine_keys` sums them after the loop.
// Whether an operand of layout L loaded as LOAD with K stride SK may walk its ldmatrix lane
// addresses over whole k-steps: 16·SK a multiple of the swizzle's period, so every lane's
// address moves by the same number of bytes per step (sched::ops::matmul_walks decides).
template <class L, int LOAD> __host__ __device__ constexpr bool walkable(i64 sk) {
  return (LOAD == Load::Ldmatrix || LOAD == Load::LdmatrixTrans) &&
         (16 * sk) % (1LL << LayoutTraits<L>::period_log2) == 0;
}

// WALK_A, WALK_B and JC are the plan's (sched::ops::MatmulWalks): whether A's and B's ldmatrix
// addresses walk the whole k-steps, and the n-tiles of a slice of `apply`.
template <class T, class LA, class LB, i64 M, i64 N, i64 K, int WM, int WN, int LOAD_A, int LOAD_B, bool WALK_A,
          bool WALK_B, int JC, int WK = 1>
struct Mma {
  static constexpr int MT = static_cast<int>((M + 15) / 16);
  static constexpr int NT8 = static_cast<int>((N + 7) / 8);
  static constexpr int PM = (MT + WM - 1) / WM;
  static constexpr int PN = (NT8 + WN - 1) / WN;
  struct Frag {
    float v[PM][PN][4];
  };
  static constexpr int kWM = WM, kWN = WN, kWK = WK;
  static_assert(WK == 1 || (WM == 1 && WN == 1 && LOAD_A == Load::Fragment),
                "a split of K over warps takes A from registers on one warp along M and N");
  static constexpr i64 kM = M, kN = N;

  using TA = LayoutTraits<LA>;
  using TB = LayoutTraits<LB>;
  static constexpr i64 a_sm = TA::template stride<LA::rank - 2>, a_sk = TA::template stride<LA::rank - 1>;
  // B in atom columns (sched's AtomColumns): its layout has one dim more than A's, N split
  // into (column, offset in the column); b_col is the column stride. wgmma alone reads it.
  static constexpr bool b_columns = LB::rank == LA::rank + 1;
  static constexpr i64 b_col = b_columns ? TB::template stride<LB::rank - 2> : 0;
  static constexpr i64 b_sk = TB::template stride<LB::rank - (b_columns ? 3 : 2)>,
                       b_sn = TB::template stride<LB::rank - 1>;
  static_assert(!b_columns || LOAD_B == Load::Wgmma, "B in atom columns is read by wgmma only");
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
    static_assert(LOAD_A != Load::Fragment, "A is in registers: use run_from");
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
  static constexpr bool a_walk = WALK_A;
  static constexpr bool b_walk = WALK_B;
  static_assert(!WALK_A || walkable<LA, LOAD_A>(a_sk), "A's ldmatrix addresses cannot walk the k-steps");
  static_assert(!WALK_B || walkable<LB, LOAD_B>(b_sk), "B's ldmatrix addresses cannot walk the k-steps");

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

  // B's ldmatrix addresses for the whole k-steps of P n-tiles of a warp, wn, wn + wns, …:
  // one ldmatrix.x4 per pair of n-tiles (lanes 0–15 address the first, 16–31 the second), an
  // ldmatrix.x2 for an odd last one; each address advances by its step per k-step. An n-tile
  // outside N reads the zero page (its step is 0).
  template <int P> struct BWalkN {
    unsigned a4[P / 2 > 0 ? P / 2 : 1], s4[P / 2 > 0 ? P / 2 : 1], a2, s2;
  };
  using BWalk = BWalkN<PN>;
  template <int P>
  __device__ __forceinline__ static void b_walk_init(BWalkN<P>& w, const T* b, const T* zero, int wn, int wns, int lane) {
#pragma unroll
    for (int jp = 0; jp < P / 2; ++jp) {
      const int nb = (wn + (2 * jp + (lane >> 4)) * wns) * 8;
      int k, n;
      if constexpr (b_k) {
        n = nb + (lane & 7);
        k = ((lane >> 3) & 1) * 8;
      } else {
        n = nb;
        k = lane & 15;
      }
      w.a4[jp] = chunk_addr<LB, K, N>(b, zero, k, n);
      w.s4[jp] = n < N ? static_cast<unsigned>(16 * b_sk * static_cast<i64>(sizeof(T))) : 0u;
    }
    if constexpr (P % 2 == 1) b_lane(b, zero, (wn + (P - 1) * wns) * 8, lane, w.a2, w.s2);
  }
  template <int P> __device__ __forceinline__ static void b_walk_load(BWalkN<P>& w, unsigned (&bf)[P][2]) {
#pragma unroll
    for (int jp = 0; jp < P / 2; ++jp) {
      unsigned r[4];
      sm80::ldmatrix_x4<b_n>(r, w.a4[jp]);
      w.a4[jp] += w.s4[jp];
      bf[2 * jp][0] = r[0];
      bf[2 * jp][1] = r[1];
      bf[2 * jp + 1][0] = r[2];
      bf[2 * jp + 1][1] = r[3];
    }
    if constexpr (P % 2 == 1) {
      sm80::ldmatrix_x2<b_n>(bf[P - 1], w.a2);
      w.a2 += w.s2;
    }
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

  // The warpgroup path of `run` (LOAD_B == Load::Wgmma, sm_90a): whole warpgroups along M, the
  // i-th m-tiles of a warpgroup's four warps being 64 consecutive rows; A by ldmatrix (K
  // contiguous) into the m16n8k16 A fragments, which are wgmma's register A layout; B read
  // through descriptors as in `run_from`: one 128-byte swizzle atom across (N = 64), or N / 64
  // atom columns b_col elements apart, one m64n64k16 per column and k-step into the column's
  // 8 n-tiles of the fragment. Every A fragment is loaded before the fence that orders register
  // writes before the wgmmas (a fragment rewritten while an earlier wgmma may still read it
  // would be a hazard), hence the bound on m-tiles × k-steps (the plan checks it too:
  // sched::ops::wgmma_b).
  static constexpr int KS = static_cast<int>(K / 16);
  static constexpr int NC = static_cast<int>(N / 64);
  __device__ __forceinline__ static void run_wgmma(Frag& f, const T* a, const T* b, const T* z, int wm, int lane) {
    static_assert(a_k && WM % 4 == 0 && WN == 1 && N % 64 == 0 && (N == 64 || b_columns) && K % 16 == 0 &&
                      b_sn == 1 && b_sk == 64 && (b_col * 2) % 1024 == 0 && TB::kept_chunk_log2 == 3 &&
                      TB::period_log2 == 9 && sizeof(T) == 2,
                  "this matmul is not a wgmma with A by ldmatrix and B in 128-byte swizzle atoms");
    static_assert(PM * KS <= 8, "A's fragments of every k-step would take more than 32 registers");
    unsigned af[KS][PM][4];
    if constexpr (a_walk) {
#pragma unroll
      for (int i = 0; i < PM; ++i) {
        unsigned addr, st;
        a_lane(a, z, (wm + i * WM) * 16, lane, addr, st);
#pragma unroll
        for (int s = 0; s < KS; ++s) sm80::ldmatrix_x4<false>(af[s][i], addr + s * st);
      }
    } else {
#pragma unroll
      for (int s = 0; s < KS; ++s)
#pragma unroll
        for (int i = 0; i < PM; ++i) load_a(af[s][i], a, z, (wm + i * WM) * 16, s * 16, lane);
    }
    sm90::wgmma_fence();
#pragma unroll
    for (int s = 0; s < KS; ++s)
#pragma unroll
      for (int i = 0; i < PM; ++i)
#pragma unroll
        for (int c = 0; c < NC; ++c)
          sm90::wgmma_m64n64k16_rs<T>(reinterpret_cast<float(&)[32]>(f.v[i][8 * c]), af[s][i],
                                      sm90::wgmma_desc_sw128(b + c * b_col + s * 16 * 64, 16, 1024));
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
  }

  // f += A·B for this warp's tiles; `zero` is the zero page.
  __device__ __forceinline__ static void run(Frag& f, const T* a, const T* b, const void* zero, int warp, int lane) {
    if (warp >= WM * WN) return;
    const T* z = static_cast<const T*>(zero);
    const int wm = warp / WN, wn = warp % WN;
    if constexpr (LOAD_B == Load::Wgmma) {
      (void)wn;
      __syncwarp();
      run_wgmma(f, a, b, z, wm, lane);
    } else if constexpr ((a_walk || b_walk) && KF > 0) {
      // The whole k-steps: a walking operand's lane addresses are computed once, then
      // advanced; the other operand computes its addresses per k-step.
      unsigned aa[PM], as[PM];
      if constexpr (a_walk) {
#pragma unroll
        for (int i = 0; i < PM; ++i) a_lane(a, z, (wm + i * WM) * 16, lane, aa[i], as[i]);
      }
      BWalk bw;
      if constexpr (b_walk) b_walk_init(bw, b, z, wn, WN, lane);
      for (int k0 = 0; k0 < KF; k0 += 16) {
        unsigned af[PM][4];
        unsigned bf[PN][2];
        __syncwarp();
#pragma unroll
        for (int i = 0; i < PM; ++i) {
          if constexpr (a_walk) {
            sm80::ldmatrix_x4<a_m>(af[i], aa[i]);
            aa[i] += as[i];
          } else {
            load_a(af[i], a, z, (wm + i * WM) * 16, k0, lane);
          }
        }
        if constexpr (b_walk) {
          b_walk_load(bw, bf);
        } else {
#pragma unroll
          for (int j = 0; j < PN; ++j) load_b(bf[j], b, z, (wn + j * WN) * 8, k0, lane);
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

  // One k-step at k0 of `apply`'s slice (m-tile mt, n-tiles wn + (j0 + jj)·WN for jj < JC)
  // with every operand loaded by its bounds-checked path.
  __device__ __forceinline__ static void slice_step(float (&acc)[JC][4], const T* a, const T* b, const T* z, int mt,
                                                    int wn, int j0, int k0, int lane) {
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

  // g(row, col, value) for every element of A·B inside M × N in this warp's tiles, computed in
  // slices of one m-tile by up to 8 n-tiles, so registers stay bounded for any N (for results
  // that are stored or reduced rather than kept in a fragment).
  template <class G> __device__ __forceinline__ static void apply(const T* a, const T* b, const void* zero, int warp, int lane, G g) {
    static_assert(LOAD_B != Load::Wgmma, "slice-by-slice products take mma.sync");
    if (warp >= WM * WN) return;
    static_assert(JC >= 1 && JC <= 8, "a slice holds 1 to 8 n-tiles");
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
        if constexpr (b_walk && KF > 0) {
          // The slice's B addresses are computed once and advanced per whole k-step; A (one
          // m-tile) by its walk or per step.
          unsigned aa = 0, as = 0;
          if constexpr (a_walk) a_lane(a, z, mt * 16, lane, aa, as);
          BWalkN<JC> bw;
          b_walk_init(bw, b, z, wn + j0 * WN, WN, lane);
          for (int k0 = 0; k0 < KF; k0 += 16) {
            unsigned af[4];
            unsigned bf[JC][2];
            if constexpr (a_walk) {
              __syncwarp();
              sm80::ldmatrix_x4<a_m>(af, aa);
              aa += as;
            } else {
              load_a(af, a, z, mt * 16, k0, lane);
            }
            __syncwarp();
            b_walk_load(bw, bf);
            __syncwarp();
#pragma unroll
            for (int jj = 0; jj < JC; ++jj) {
              const int nt = wn + (j0 + jj) * WN;
              if (j0 + jj < PN && nt < NT8) sm80::mma(acc[jj], af, bf[jj], T());
            }
          }
          if constexpr (KF < K) slice_step(acc, a, b, z, mt, wn, j0, KF, lane);
        } else {
          for (int k0 = 0; k0 < K; k0 += 16) slice_step(acc, a, b, z, mt, wn, j0, k0, lane);
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

  // Register pipes (the plan's RegisterPipe): a product kept in registers for the next matmul,
  // rounded to T, two column-adjacent values per 32-bit word (the C fragment's pairs {0, 1}
  // and {2, 3}, i.e. rows gid and gid + 8).
  struct Packed {
    unsigned v[PM][PN][2];
  };

  // p = T(fn(row, col, v)) for every element of this warp's tiles (0 outside M × N).
  template <class F>
  __device__ __forceinline__ static void pack(Packed& p, const Frag& f, int warp, int lane, F fn) {
    if (warp >= WM * WN) return;
    const int wm = warp / WN, wn = warp % WN;
    const int gid = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int i = 0; i < PM; ++i)
#pragma unroll
      for (int j = 0; j < PN; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = (wm + i * WM) * 16 + gid + h * 8;
          const int col = (wn + j * WN) * 8 + tig * 2;
          const float a = row < M && col < N ? fn(row, col, f.v[i][j][2 * h]) : 0.0f;
          const float b = row < M && col + 1 < N ? fn(row, col + 1, f.v[i][j][2 * h + 1]) : 0.0f;
          p.v[i][j][h] = sm80::pack2<T>(a, b);
        }
  }

  // g(row, s) once per row inside M, s the row's sum (fp32) of the packed values, on a grid of
  // one warp along N (a warp owns whole rows): each lane sums its values, the four lanes of a
  // row meet by shuffles, and the row's first lane calls g.
  template <class G> __device__ __forceinline__ static void row_sums(const Packed& p, int warp, int lane, G g) {
    static_assert(WN == 1, "row sums need whole rows per warp");
    if (warp >= WM) return;
    const int gid = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int i = 0; i < PM; ++i) {
      float lo = 0.0f, hi = 0.0f;
#pragma unroll
      for (int j = 0; j < PN; ++j) {
        const float2 a = sm80::unpack2<T>(p.v[i][j][0]);
        const float2 b = sm80::unpack2<T>(p.v[i][j][1]);
        lo += a.x + a.y;
        hi += b.x + b.y;
      }
      lo += __shfl_xor_sync(0xffffffffu, lo, 1);
      lo += __shfl_xor_sync(0xffffffffu, lo, 2);
      hi += __shfl_xor_sync(0xffffffffu, hi, 1);
      hi += __shfl_xor_sync(0xffffffffu, hi, 2);
      const int row = (warp + i * WM) * 16 + gid;
      if (tig == 0) {
        if (row < M) g(row, lo);
        if (row + 8 < M) g(row + 8, hi);
      }
    }
  }

  // Online softmax over this warp's columns of its rows (the plan's OnlinePipe: whole rows with
  // WN == 1; with WN > 1, a key split, each warp's running state covers its own columns). Per
  // fragment row (i, h: row (wm + i·WM)·16 + gid + 8h), the row's four lanes meet by shuffles
  // for the max of f; the running max m moves to max(m, T(rowmax)) (rounded to T as the graph
  // stores m), r = exp(m_old − m_new) (0 while m_old is −∞), p = T(exp(f − m_new)) packed as
  // `pack` does, and s = the row sum of the packed values. Every lane of a row holds m, r, s.
  __device__ __forceinline__ static void online_pack(Packed& p, const Frag& f, float (&m)[PM][2], float (&r)[PM][2],
                                                     float (&s)[PM][2], int warp, int lane) {
    if (warp >= WM * WN) return;
    const int wm = warp / WN, wn = warp % WN;
    const int gid = lane >> 2, tig = lane & 3;
    const float ninf = -__int_as_float(0x7f800000);
#pragma unroll
    for (int i = 0; i < PM; ++i) {
      float mx[2] = {ninf, ninf};
#pragma unroll
      for (int j = 0; j < PN; ++j) {
        const int col = (wn + j * WN) * 8 + tig * 2;
#pragma unroll
        for (int q = 0; q < 4; ++q)
          if (col + (q & 1) < N) mx[q >> 1] = fmaxf(mx[q >> 1], f.v[i][j][q]);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        const float mn = fmaxf(m[i][h], to_compute(from_compute<T>(mx[h])));
        r[i][h] = m[i][h] == ninf ? 0.0f : op::exp_approx_ftz(m[i][h] - mn);
        m[i][h] = mn;
      }
      float sum[2] = {0.0f, 0.0f};
      // exp(v − m) = 2^(v·log2 e − m·log2 e): one FFMA and one MUFU.EX2 per value (results
      // under 2^-126 flush to zero; they round to zero in T anyway).
      const float ml[2] = {m[i][0] * 1.44269504088896341f, m[i][1] * 1.44269504088896341f};
      const auto ex = [](float v, float mlh) {
        float y;
        asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(fmaf(v, 1.44269504088896341f, -mlh)));
        return y;
      };
#pragma unroll
      for (int j = 0; j < PN; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = (wm + i * WM) * 16 + gid + h * 8;
          const int col = (wn + j * WN) * 8 + tig * 2;
          const float a = row < M && col < N ? ex(f.v[i][j][2 * h], ml[h]) : 0.0f;
          const float b = row < M && col + 1 < N ? ex(f.v[i][j][2 * h + 1], ml[h]) : 0.0f;
          p.v[i][j][h] = sm80::pack2<T>(a, b);
          const float2 u = sm80::unpack2<T>(p.v[i][j][h]);
          sum[h] += u.x + u.y;
        }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 1);
        sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 2);
        s[i][h] = sum[h];
      }
    }
  }

  // f's rows times r (the fragment rows of `online_pack` on the same warps along M).
  __device__ __forceinline__ static void scale_rows(Frag& f, const float (&r)[PM][2], int warp) {
    static_assert(WN == 1, "row scaling needs whole rows per warp");
    if (warp >= WM * WK) return;
#pragma unroll
    for (int i = 0; i < PM; ++i)
#pragma unroll
      for (int j = 0; j < PN; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) f.v[i][j][q] *= r[i][q >> 1];
  }

  // g(row, i, h) once per fragment row inside M, by the row's first lane (whole rows per warp).
  template <class G> __device__ __forceinline__ static void each_row(int warp, int lane, G g) {
    static_assert(WN == 1, "rows need whole rows per warp");
    if (warp >= WM || (lane & 3) != 0) return;
#pragma unroll
    for (int i = 0; i < PM; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = (warp + i * WM) * 16 + (lane >> 2) + h * 8;
        if (row < M) g(row, i, h);
      }
  }

  // f += the k-step s of the packed product `p` (n-tiles 2s and 2s + 1 of type `P`, the
  // m16n8k16 A fragment) times B's fragments `bf` of that k-step.
  template <class P>
  __device__ __forceinline__ static void packed_step(Frag& f, const typename P::Packed& p, int s,
                                                     const unsigned (&bf)[PN][2]) {
#pragma unroll
    for (int i = 0; i < PM; ++i) {
      const unsigned af[4] = {p.v[i][2 * s][0], p.v[i][2 * s][1], p.v[i][2 * s + 1][0], p.v[i][2 * s + 1][1]};
#pragma unroll
      for (int j = 0; j < PN; ++j)
        if (j < NT8) sm80::mma(f.v[i][j], af, bf[j], T());
    }
  }

  // f += P·B, where P (M × K) is the packed product `p` of matmul type `P` on the same warps
  // along M and one along N, whose N is this K: the words of n-tiles 2s and 2s + 1 are the
  // m16n8k16 A fragment of k-step s (rows gid and gid + 8, columns 2·tig, 2·tig + 1 and 8
  // more), so no value leaves the lane. B loads two n-tiles per ldmatrix.x4 where it can.
  template <class P>
  __device__ __forceinline__ static void run_from(Frag& f, const typename P::Packed& p, const T* b, const void* zero,
                                                  int warp, int lane) {
    static_assert(LOAD_A == Load::Fragment, "A is not planned from registers");
    static_assert(WK == 1, "a split of K over warps runs run_from_keys");
    static_assert(WN == 1 && P::kWN == 1 && P::kWM == WM && P::kM == M && P::kN == K && K % 16 == 0 && M % 16 == 0,
                  "the producer's fragment is not this matmul's A operand");
    if (warp >= WM) return;
    if constexpr (LOAD_B == Load::Wgmma) {
      // Whole warpgroups along M: the i-th m-tiles of a warpgroup's four warps are 64
      // consecutive rows, one m64n64k16 per k-step; B is one 128-byte swizzle atom across
      // (N = 64 contiguous 16-bit elements per row, Swizzle<3,3,3>, 1024-byte aligned), so
      // k-step s starts 16 rows (2048 bytes) further and groups of 8 rows are 1024 bytes apart.
      static_assert(WM % 4 == 0 && N == 64 && b_sn == 1 && b_sk == 64 && TB::kept_chunk_log2 == 3 &&
                        TB::period_log2 == 9 && sizeof(T) == 2,
                    "B is not a wgmma operand of one 128-byte swizzle atom");
      (void)zero;
      (void)lane;
      sm90::wgmma_fence();
#pragma unroll
      for (int i = 0; i < PM; ++i)
#pragma unroll
        for (int s = 0; s < static_cast<int>(K / 16); ++s) {
          const unsigned af[4] = {p.v[i][2 * s][0], p.v[i][2 * s][1], p.v[i][2 * s + 1][0], p.v[i][2 * s + 1][1]};
          sm90::wgmma_m64n64k16_rs<T>(reinterpret_cast<float(&)[32]>(f.v[i]), af,
                                      sm90::wgmma_desc_sw128(b + s * 16 * 64, 16, 1024));
        }
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      return;
    }
    const T* z = static_cast<const T*>(zero);
    BWalk bw;
    if constexpr (b_walk) b_walk_init(bw, b, z, 0, 1, lane);
#pragma unroll
    for (int s = 0; s < static_cast<int>(K / 16); ++s) {
      unsigned bf[PN][2];
      if constexpr (b_walk) {
        b_walk_load(bw, bf);
      } else {
#pragma unroll
        for (int j = 0; j < PN; ++j) load_b(bf[j], b, z, j * 8, s * 16, lane);
      }
      __syncwarp();
      packed_step<P>(f, p, s, bf);
    }
  }

  // The key split (WK warps along K): f += P·B over this warp's share of K, where P is the packed
  // product of matmul type `P` on one warp along M and WK along N (this K): warp w holds P's
  // n-tiles w, w + WK, w + 2·WK, …, so its k-step s pairs n-tiles 2s and 2s + 1, i.e. the keys
  // (w + 2s·WK)·8 + [0, 8) and (w + (2s + 1)·WK)·8 + [0, 8). The words of the pair are the
  // m16n8k16 A fragment as in `run_from`; B's lanes address those rows (ldmatrix, one per pair
  // of n-tiles, or pairs and elements), so the product is the same sum over K in another order.
  template <class P>
  __device__ __forceinline__ static void run_from_keys(Frag& f, const typename P::Packed& p, const T* b,
                                                       const void* zero, int warp, int lane) {
    static_assert(LOAD_A == Load::Fragment && WK > 1 && P::kWM == 1 && P::kWN == WK && P::kM == M && P::kN == K &&
                      K % (16 * WK) == 0 && M % 16 == 0 && P::PN == static_cast<int>(K / (8 * WK)),
                  "the producer's fragment is not this key split's A operand");
    if (warp >= WK) return;
    const T* z = static_cast<const T*>(zero);
#pragma unroll
    for (int s = 0; s < static_cast<int>(K / (16 * WK)); ++s) {
      const int klo = (warp + 2 * s * WK) * 8, khi = (warp + (2 * s + 1) * WK) * 8;
      unsigned bf[PN][2];
      __syncwarp();
      if constexpr (!b_n && !b_k) {
        // B by pairs or elements: this lane's k rows 2·tig, 2·tig + 1 of each half.
        const int k = (lane & 3) * 2;
#pragma unroll
        for (int j = 0; j < PN; ++j) {
          const int n = j * 8 + (lane >> 2);
          if constexpr (b_pairs) {
            bf[j][0] = b_pair(b, klo + k, n);
            bf[j][1] = b_pair(b, khi + k, n);
          } else {
            bf[j][0] = sm80::pack(b_at(b, klo + k, n), b_at(b, klo + k + 1, n));
            bf[j][1] = sm80::pack(b_at(b, khi + k, n), b_at(b, khi + k + 1, n));
          }
        }
      }
      // This lane's ldmatrix row of the n-tile at column nb: lanes 0–7 (and 16–23) address
      // the keys at klo, 8–15 (and 24–31) those at khi.
      const auto addr = [&](int nb) {
        if constexpr (b_n) return chunk_addr<LB, K, N>(b, z, ((lane & 8) ? khi : klo) + (lane & 7), nb);
        return chunk_addr<LB, K, N>(b, z, ((lane >> 3) & 1) ? khi : klo, nb + (lane & 7));
      };
#pragma unroll
      for (int jp = 0; jp < (b_n || b_k ? PN / 2 : 0); ++jp) {
        unsigned r[4];
        sm80::ldmatrix_x4<b_n>(r, addr((2 * jp + (lane >> 4)) * 8));
        bf[2 * jp][0] = r[0];
        bf[2 * jp][1] = r[1];
        bf[2 * jp + 1][0] = r[2];
        bf[2 * jp + 1][1] = r[3];
      }
      if constexpr ((b_n || b_k) && PN % 2 == 1) sm80::ldmatrix_x2<b_n>(bf[PN - 1], addr((PN - 1) * 8));
      __syncwarp();
      packed_step<P>(f, p, s, bf);
    }
  }

  // After the loop of a key split: the WK warps' online-softmax states (per fragment row the
  // running max m and sum l every lane of the row holds, the output partial in f) combine into
  // the tiles: mt[row] = M = max over the warps of m, lt[row] = Σ l·exp(m − M) and
  // ot[row, col] = Σ f·exp(m − M). `ot` is the first of WK slices of SLICE bytes, each the tile
  // (layout LO, TILE bytes) followed by a warp's m and l (fp32 per row): every warp stores its
  // m and l, then (a barrier) its rescaled fragment into its slice, the first warp l and M, then
  // (a barrier) the NT threads sum the slices into the first. Every thread of the block calls it.
  template <class LM, class LL, class LO, int SLICE, int TILE, int NT, class TM, class TL, class TO>
  __device__ __forceinline__ static void combine_keys(const Frag& f, const float (&m)[PM][2], const float (&l)[PM][2],
                                                      TM* mt, TL* lt, TO* ot, int tid, int warp, int lane) {
    static_assert(WK > 1 && SLICE % 16 == 0 && TILE + 8 * M <= SLICE, "combine_keys follows run_from_keys");
    const int gid = lane >> 2, tig = lane & 3;
    const float ninf = -__int_as_float(0x7f800000);
    unsigned char* base = reinterpret_cast<unsigned char*>(ot);
    const auto slice_m = [&](int w) { return reinterpret_cast<float*>(base + w * SLICE + TILE); };
    const auto slice_l = [&](int w) { return reinterpret_cast<float*>(base + w * SLICE + TILE) + M; };
    if (warp < WK && tig == 0) {
#pragma unroll
      for (int i = 0; i < PM; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = i * 16 + gid + h * 8;
          if (row < M) {
            slice_m(warp)[row] = m[i][h];
            slice_l(warp)[row] = l[i][h];
          }
        }
    }
    __syncthreads();
    if (warp < WK) {
      float sc[PM][2];
#pragma unroll
      for (int i = 0; i < PM; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = i * 16 + gid + h * 8;
          float mx = ninf;
          if (row < M)
            for (int w = 0; w < WK; ++w) mx = fmaxf(mx, slice_m(w)[row]);
          sc[i][h] = m[i][h] == ninf ? 0.0f : op::exp_approx_ftz(m[i][h] - mx);
          if (warp == 0 && tig == 0 && row < M) {
            float s = 0.0f;
            for (int w = 0; w < WK; ++w) {
              const float mw = slice_m(w)[row];
              s += mw == ninf ? 0.0f : slice_l(w)[row] * op::exp_approx_ftz(mw - mx);
            }
            lt[LL::offset(row)] = from_compute<TL>(s);
            mt[LM::offset(row)] = from_compute<TM>(mx);
          }
        }
      TO* o = reinterpret_cast<TO*>(base + warp * SLICE);
#pragma unroll
      for (int i = 0; i < PM; ++i)
#pragma unroll
        for (int j = 0; j < PN; ++j)
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int row = i * 16 + gid + (q >= 2 ? 8 : 0);
            const int col = j * 8 + tig * 2 + (q & 1);
            if (row < M && col < N) o[LO::offset(row * static_cast<int>(N) + col)] = f.v[i][j][q] * sc[i][q >> 1];
          }
    }
    __syncthreads();
    for (int e = tid; e < static_cast<int>(M * N); e += NT) {
      const int at = LO::offset(e);
      float s = 0.0f;
#pragma unroll
      for (int w = 0; w < WK; ++w) s += to_compute(reinterpret_cast<const TO*>(base + w * SLICE)[at]);
      ot[at] = from_compute<TO>(s);
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

// Mma with the walks and slice width that sched::ops::matmul_walks would plan, for hand-written
// kernels (the GPU self-tests); generated code passes the plan's values.
template <class T, class LA, class LB, i64 M, i64 N, i64 K, int WM, int WN, int LOAD_A, int LOAD_B, int WK = 1>
using MmaAuto =
    Mma<T, LA, LB, M, N, K, WM, WN, LOAD_A, LOAD_B,
        walkable<LA, LOAD_A>(LayoutTraits<LA>::template stride<LA::rank - 1>),
        walkable<LB, LOAD_B>(LayoutTraits<LB>::template stride<LB::rank - 2>),
        static_cast<int>(((N + 7) / 8 + WN - 1) / WN < 8 ? ((N + 7) / 8 + WN - 1) / WN : 8), WK>;

}  // namespace tb
}  // namespace mucc
