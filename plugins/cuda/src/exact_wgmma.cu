// SPDX-License-Identifier: Apache-2.0
// Hopper (sm_90a) exact forward for long queries: wgmma with the query stationary in registers.
//
// ExactWgmmaKernel: persistent blocks of WGS warpgroups; a block owns one row group (WGS x QS x 64 query rows)
// of a strided list of pairs. Each warpgroup holds QS sets of 64 query rows as wgmma A fragments in registers
// (loaded once per query); the document streams through shared memory in 128-token stages and every stage
// feeds wgmma.m64n128k16 (B = 128 document tokens from shared memory, 8 k steps for d <= 128). The row max of
// each 64 x 128 accumulator tile is folded into a running max per query row; nothing of size Lq x Ld leaves
// the register file. The stages arrive by bulk tensor copies (TMA, one thread per warpgroup; batch launches and
// 256-row pair launches) where the documents are plain device memory, else by every thread's cp.async copies. The stage ring is guarded by mbarriers (full:
// a stage's copies landed; empty: every warp's wgmma reading it finished), so warpgroups are not kept in step and
// one warpgroup's fold overlaps the others' tensor-core work.
//
// Numbers: the same bits as every other 16-bit kernel (kernels.h). A similarity is the chain of 8 k16
// tensor-core steps from a +0 start, and wgmma step s sums exactly the dimensions that mma.sync step s sums in
// device_common.cuh's fixed k order: the 16 contiguous dimensions [16s, 16s + 16), in the natural placement
// (dimension 16s + k at logical k: the K-major layout, so that document rows are copied in whole 16-byte
// pieces), as in the ldmatrix ring kernels; ExactTcKernel and certified refinement use the quad-contiguous
// placement of the same steps. (A k order whose steps take 4 of every 8 dimensions allows only 8-byte copies,
// which gpu_bench shows to be about 10% slower on the visual and q128 shapes.) That a k16 step
// does not depend on the order of its 16 products is what the tensor cores do, not something PTX promises:
// gpu_conformance_test (LongQueryWgmmaKernelEqualsMmaSync) checks the bits against the mma.sync kernel
// (MAXSIM_CUDA_WGMMA=0), against the argmax path and against certified refinement on random, clustered,
// near-tie, duplicate and large-norm data, every run.
//
// Scope: bf16/f16, 96 < dim <= 128, 128- or 256-row groups, values only (argmax requests, i.e. the training
// forward, use ExactTcSmemKernel), dot or cosine, with or without a document mask. Compiled only for sm_90a;
// elsewhere the kernel body is empty and WgmmaUsable() says no.
#include <cuda.h>
#include <math.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <type_traits>

#include "backend.h"
#include "forward_common.cuh"
#include "wgmma_common.cuh"

namespace mscuda {
namespace {

// 1 in the module compiled for sm_90a, 0 in the others: read back by the host to learn what the loaded module
// can do (a PTX JIT for a later GPU, or a build without sm_90a, must not launch the kernel).
__device__ int g_wgmma_compiled =
#if defined(MAXSIM_HAVE_WGMMA)
    1;
#else
    0;
#endif

constexpr int kWgTokens = 128;                      // document tokens per stage (wgmma N)
constexpr int kWgRegionBytes = kWgTokens * 128;     // 64 logical k positions x 2 bytes per token
constexpr int kWgStageBytes = 2 * kWgRegionBytes;   // 128 logical k positions
// The rows of the kernel's tensor map (EncodeDocMap): its row coordinates are signed 32-bit numbers.
// Its copies stay inside documents (TmaTileCopy), so the map need not know where the rows end.
constexpr uint32_t kTmaRows = 0x7fffffffu;

#if defined(MAXSIM_HAVE_WGMMA)  // the device helpers exist only in the sm_90a pass

// D (64 x N f32: this thread's N/2 values) = A (registers, 4 x 32 bits) x B (shared-memory descriptor: its low
// word dlo, its high word kSmemDescHi) + D, or A x B when sd == 0. TY: the 16-bit input type's PTX name. The
// operand lists are spelled out because inline asm takes no arrays.
#define MAXSIM_D8(i) MAXSIM_ACC(d[i]), MAXSIM_ACC(d[i + 1]), MAXSIM_ACC(d[i + 2]), MAXSIM_ACC(d[i + 3]), \
                     MAXSIM_ACC(d[i + 4]), MAXSIM_ACC(d[i + 5]), MAXSIM_ACC(d[i + 6]), MAXSIM_ACC(d[i + 7])
#define MAXSIM_D64(i) MAXSIM_D8(i), MAXSIM_D8(i + 8), MAXSIM_D8(i + 16), MAXSIM_D8(i + 24), MAXSIM_D8(i + 32), \
                      MAXSIM_D8(i + 40), MAXSIM_D8(i + 48), MAXSIM_D8(i + 56)
#define MAXSIM_R10(b) "%" #b "0, %" #b "1, %" #b "2, %" #b "3, %" #b "4, %" #b "5, %" #b "6, %" #b "7, " \
                      "%" #b "8, %" #b "9, "
#define MAXSIM_WGMMA_M64N128K16(TY) \
  asm volatile( \
      "{\n.reg .pred p;\n.reg .b64 dsc;\nsetp.ne.b32 p, %69, 0;\nmov.b64 dsc, {%68, %70};\n" \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " \
      "{" \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" \
      "}, {%64, %65, %66, %67}, dsc, p, 1, 1, 0;\n}\n" \
      : MAXSIM_D64(0) \
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(dlo), "r"(sd), "r"(kSmemDescHi))
#define MAXSIM_WGMMA_M64N256K16(TY) \
  asm volatile( \
      "{\n.reg .pred p;\n.reg .b64 dsc;\nsetp.ne.b32 p, %133, 0;\nmov.b64 dsc, {%132, %134};\n" \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " " \
      "{" \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, " MAXSIM_R10(1) MAXSIM_R10(2) MAXSIM_R10(3) MAXSIM_R10(4) \
      MAXSIM_R10(5) MAXSIM_R10(6) MAXSIM_R10(7) MAXSIM_R10(8) MAXSIM_R10(9) MAXSIM_R10(10) MAXSIM_R10(11) \
      "%120, %121, %122, %123, %124, %125, %126, %127" \
      "}, {%128, %129, %130, %131}, dsc, p, 1, 1, 0;\n}\n" \
      : MAXSIM_D64(0), MAXSIM_D64(64) \
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(dlo), "r"(sd), "r"(kSmemDescHi))

#define MAXSIM_WGMMA_M64N64K16(TY) \
  asm volatile( \
      "{\n.reg .pred p;\n.reg .b64 dsc;\nsetp.ne.b32 p, %37, 0;\nmov.b64 dsc, {%36, %38};\n" \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, dsc, p, 1, 1, 0;\n}\n" \
      : MAXSIM_D8(0), MAXSIM_D8(8), MAXSIM_D8(16), MAXSIM_D8(24) \
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(dlo), "r"(sd), "r"(kSmemDescHi))

// N = 64 (a document's last, partial tile) writes the first N / 2 of the V accumulator registers; each output
// element depends only on its own A row, B column and accumulator, so the tile width changes no value.
// WgmmaFirst: the first k step, D = A*B (scale-d = 0): the accumulators are outputs only, so their previous
// values are dead between tiles.
// The body of both: the instruction for N and T (MAXSIM_ACC, defined before each, says how the accumulators are
// bound).
#define MAXSIM_WGMMA_CASE(NN)             \
  if constexpr (N == NN) {                \
    if constexpr (kBf16) {                \
      MAXSIM_WGMMA_M64N##NN##K16("bf16"); \
    } else {                              \
      MAXSIM_WGMMA_M64N##NN##K16("f16");  \
    }                                     \
  }
#define MAXSIM_WGMMA_BODY                                                                \
  static_assert((N == 64 || N == 128 || N == 256) && N / 2 <= V, "wgmma N");              \
  constexpr bool kBf16 = std::is_same<T, __nv_bfloat16>::value;                           \
  MAXSIM_WGMMA_CASE(64)                                                                   \
  MAXSIM_WGMMA_CASE(128)                                                                  \
  MAXSIM_WGMMA_CASE(256)
#define MAXSIM_ACC(x) "+f"(x)
template <typename T, int N, int V>
__device__ __forceinline__ void Wgmma(float (&d)[V], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                      uint32_t dlo, int sd) {
  MAXSIM_WGMMA_BODY
}
#undef MAXSIM_ACC
#define MAXSIM_ACC(x) "=f"(x)
template <typename T, int N, int V>
__device__ __forceinline__ void WgmmaFirst(float (&d)[V], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                           uint32_t dlo) {
  const int sd = 0;
  MAXSIM_WGMMA_BODY
}
#undef MAXSIM_ACC
#undef MAXSIM_WGMMA_BODY
#undef MAXSIM_WGMMA_CASE
#undef MAXSIM_WGMMA_M64N128K16
#undef MAXSIM_WGMMA_M64N256K16
#undef MAXSIM_WGMMA_M64N64K16
#undef MAXSIM_R10
#undef MAXSIM_D64
#undef MAXSIM_D8

// One 64 x N tile: 8 k steps over the stage at `stage`, whose two 64-dimension k regions are kWgRegionBytes
// apart (PieceOffset); N < kWgTokens reads the stage's first N tokens (a document's partial last tile). qa / qc: rows g / g+8 of this warp's 16 rows, 32-dimension chunk c as one uint4
// (LoadQueryFragments: step 2c uses .x/.y, step 2c+1 .z/.w). Step 0 runs with scale-d = 0 (D = A*B, WgmmaFirst)
// instead of adding a zeroed accumulator: the same value as mma.sync's +0 start except that an exact zero may come out as
// -0 (where the +0 start gives +0); the folds map -0 back to +0 (below).
template <typename T, int N, int V>
__device__ __forceinline__ void IssueTile(float (&d)[V], const uint4 (&qa)[4], const uint4 (&qc)[4],
                                          uint32_t stage) {
  constexpr uint32_t kRegion = kWgRegionBytes;
  // The descriptor's address field is addr >> 4 (SmemDesc); stage + offset stays below 2^18, so step s's
  // descriptor is the stage's plus offset >> 4: one 32-bit add to the low word per step (no carry reaches the
  // high word) instead of the address arithmetic.
  const uint32_t desc0 = SmemDescLo(stage);
  WgFence();
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    const int c = s >> 1;
    const uint32_t a0 = (s & 1) ? qa[c].z : qa[c].x, a1 = (s & 1) ? qc[c].z : qc[c].x;
    const uint32_t a2 = (s & 1) ? qa[c].w : qa[c].y, a3 = (s & 1) ? qc[c].w : qc[c].y;
    const uint32_t desc = desc0 + (((s >> 2) * kRegion + (s & 3) * 32) >> 4);
    if (s == 0) {
      WgmmaFirst<T, N>(d, a0, a1, a2, a3, desc);
    } else {
      Wgmma<T, N>(d, a0, a1, a2, a3, desc, 1);
    }
  }
  WgCommit();
  PinAcc(d);
}

// One level of a reduction tree per instantiation (W, W/2, ..., 1): constant indices, so that the partial maxima
// stay in registers (nvcc 13 does not unroll a loop over levels and puts them in local memory: gigabytes of
// local traffic through L2 per visual call, and a much slower kernel).
template <int W>
__device__ __forceinline__ void TreeLevels(float* m, float* n) {
  if constexpr (W >= 1) {
#pragma unroll
    for (int j = 0; j < W; ++j) {
      m[j] = fmaxf(m[j], m[j + W]);
      n[j] = fmaxf(n[j], n[j + W]);
    }
    TreeLevels<W / 2>(m, n);
  }
}

// The maxima of rows g (into ra) and g+8 (into rb) over a 64 x N tile: two independent log-depth reduction
// trees instead of an N/4-long chain. Lane (g, t) holds, for n8 block j, columns 8j + 2t and 8j + 2t + 1 of
// rows g (d[4j], d[4j+1]) and g+8 (d[4j+2], d[4j+3]).
template <int N, int V>
__device__ __forceinline__ void TreeMax(const float (&d)[V], float& ra, float& rb) {
  constexpr int kB = N / 16;
  float m[kB], n[kB];
#pragma unroll
  for (int j = 0; j < kB; ++j) {
    m[j] = fmaxf(fmaxf(d[4 * j], d[4 * j + 1]), fmaxf(d[4 * j + N / 4], d[4 * j + N / 4 + 1]));
    n[j] = fmaxf(fmaxf(d[4 * j + 2], d[4 * j + 3]), fmaxf(d[4 * j + N / 4 + 2], d[4 * j + N / 4 + 3]));
  }
  TreeLevels<kB / 2>(m, n);
  ra = fmaxf(ra, m[0]);
  rb = fmaxf(rb, n[0]);
}

// The maximum of v[0..K) by 3-input maxima (VIMNMX3), one level per instantiation (constant indices, as
// TreeLevels).
template <int K>
__device__ __forceinline__ int Max3Tree(int* v) {
  if constexpr (K == 1) {
    return v[0];
  } else if constexpr (K == 2) {
    return max(v[0], v[1]);
  } else {
    constexpr int M = (K + 2) / 3;
#pragma unroll
    for (int i = 0; i < M; ++i) {
      if (3 * i + 2 < K) {
        v[i] = __vimax3_s32(v[3 * i], v[3 * i + 1], v[3 * i + 2]);
      } else if (3 * i + 1 < K) {
        v[i] = max(v[3 * i], v[3 * i + 1]);
      } else {
        v[i] = v[3 * i];
      }
    }
    return Max3Tree<M>(v);
  }
}

// TreeMax by integer maxima of the float bits, 3 inputs per instruction (half the instructions of FMNMX pairs):
// the bits of floats >= +0 order as signed integers do, and every negative float's bits are a negative integer,
// so where a row's values include one >= +0 the integer maximum is the float maximum, the same value. When some
// lane's row has none (every similarity negative), the warp folds the tile by TreeMax instead. A positive NaN bit
// pattern wins here, and the running maximum's fmaxf then drops the lane's whole tile for that row (TreeMax drops
// only the NaN). A NaN similarity comes only from a non-finite element, which the folded check flags (a packed
// corpus has none), or from vectors above the 1e19 norm limit whose products overflow to both infinities, whose
// scores the GPU does not promise outside the check's sample (docs/cuda.md).
template <int N, int V>
__device__ __forceinline__ void TreeMaxInt(const float (&d)[V], float& ra, float& rb) {
  constexpr int K = N / 4;            // a lane's columns of each row: column k of row g is d[4 (k / 2) + k % 2]
  constexpr int M = (K + 2) / 3;      // the first level reads the accumulators directly (no copy of them stays
  int x[M], y[M];                     // live beside them: that spilled)
  auto col = [&](int k, int h) { return __float_as_int(d[4 * (k >> 1) + 2 * h + (k & 1)]); };
#pragma unroll
  for (int i = 0; i < M; ++i) {
    if (3 * i + 2 < K) {
      x[i] = __vimax3_s32(col(3 * i, 0), col(3 * i + 1, 0), col(3 * i + 2, 0));
      y[i] = __vimax3_s32(col(3 * i, 1), col(3 * i + 1, 1), col(3 * i + 2, 1));
    } else if (3 * i + 1 < K) {
      x[i] = max(col(3 * i, 0), col(3 * i + 1, 0));
      y[i] = max(col(3 * i, 1), col(3 * i + 1, 1));
    } else {
      x[i] = col(3 * i, 0);
      y[i] = col(3 * i, 1);
    }
  }
  const int mx = Max3Tree<M>(x), my = Max3Tree<M>(y);
  if (__any_sync(kFull, (mx | my) < 0)) {
    TreeMax<N>(d, ra, rb);
    return;
  }
  ra = fmaxf(ra, __int_as_float(mx));
  rb = fmaxf(rb, __int_as_float(my));
}

// The folded input check's share of one tile (FoldTileMax): none, the warp's query rows (each against one column),
// the tile's document columns (each against one query row), or both.
constexpr uint32_t kCheckRows = 1, kCheckColumns = 2;

// Folds one finished 64 x N tile (document tokens base .. base + N - 1) into the running maxima of rows g (ra)
// and g+8 (rb), reading the document's mask and norms per column where needed. check (kCheckRows,
// kCheckColumns): the similarities the folded input check takes into chk.
template <int N, int V>
__device__ __forceinline__ void FoldTileMax(const ForwardArgs& a, const float (&d)[V], uint64_t db, uint64_t ld,
                                            uint64_t base, bool plain, float& ra, float& rb, bool& saw_kept,
                                            uint32_t check, float& chk) {
  const int t = threadIdx.x & 3;
  if (plain) {
    // Without a mask or weights every column below ld is kept, and the columns at or past ld (a document's last,
    // partial tile) repeat column ld - 1 (their stage rows are copies of row ld - 1: CopyStagePieces with
    // kRepeatLast; under bulk tensor copies such a tile overlaps the tile before it instead, TileAt), so the
    // maximum over all N columns is the maximum over the document's: one tree, no per-column test. The check sees the same values. A non-finite element makes every similarity of its row
    // non-finite, so one similarity per row is enough: the warp's rows g and g+8 against the lane's first column
    // (every row of the warp), and row g against every column (the lanes of one g hold all N columns: every
    // document row of the tile). Four chains instead of one: the checking warp's fold is not lengthened by a
    // chain of dependent maxima.
    if (check & kCheckColumns) {
      float c[4] = {chk, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int j = 0; j < N / 8; ++j) c[j & 3] = MaxNaN(c[j & 3], MaxNaN(fabsf(d[4 * j]), fabsf(d[4 * j + 1])));
      chk = MaxNaN(MaxNaN(c[0], c[1]), MaxNaN(c[2], c[3]));
    }
    if (check & kCheckRows) chk = MaxNaN(chk, MaxNaN(fabsf(d[0]), fabsf(d[2])));
    if (a.sw.wgmma_int_fold) {
      TreeMaxInt<N>(d, ra, rb);
    } else {
      TreeMax<N>(d, ra, rb);
    }
    saw_kept = true;
    return;
  }
#pragma unroll
  for (int j = 0; j < N / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const uint64_t col = base + 8 * j + 2 * t + e;
      const bool keep = col < ld && a.d.Kept(db + col);
      if (keep) {
        if (check) chk = MaxNaN(chk, MaxNaN(fabsf(d[4 * j + e]), fabsf(d[4 * j + 2 + e])));
        const float w = a.cosine ? InvNorm(RowNorm(a.d, db + col)) : 1.0f;
        // + 0.0f: -0 -> +0 before the weight (scale-d = 0 start, IssueTile), so keys match the mma.sync chain's.
        const float va = a.cosine ? (d[4 * j + e] + 0.0f) * w : d[4 * j + e];
        const float vb = a.cosine ? (d[4 * j + 2 + e] + 0.0f) * w : d[4 * j + 2 + e];
        ra = fmaxf(ra, va);
        rb = fmaxf(rb, vb);
        saw_kept = true;
      }
    }
  }
}

// This warp's query rows as wgmma A fragments: for set qs, rows row0 + qs*64 (qa: lane row g) and + 8 (qc),
// rows at or past lq and dimensions past dim as zeros, in the natural placement of the copies (PieceOffset):
// qa[qs][c] = {step 2c a0, step 2c a2, step 2c+1 a0, step 2c+1 a2} (IssueTile's order; LdFragNatural).
template <int QS>
__device__ __forceinline__ void LoadQueryFragments(const uint8_t* qbase, uint64_t qrb, uint64_t lq, uint32_t dim,
                                                   uint64_t row0, uint4 (&qa)[QS][4], uint4 (&qc)[QS][4]) {
  const int t = threadIdx.x & 3;
  auto frag = [&](uint64_t r, int c) -> uint4 { return LdFragNatural(qbase + r * qrb, c, t, dim, r < lq); };
#pragma unroll
  for (int qs = 0; qs < QS; ++qs) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      qa[qs][c] = frag(row0 + qs * 64, c);
      qc[qs][c] = frag(row0 + qs * 64 + 8, c);
    }
  }
}

// The block-wide barrier of the per-pair epilogue.
struct BlockBarrier {
  __device__ __forceinline__ void Sync() const { __syncthreads(); }
  __device__ __forceinline__ bool SyncOr(bool v) const { return __syncthreads_or(v) != 0; }
};

// The start of a pair's (or a batch document's) end: the folded input check's flag, and each row's running
// maximum merged over the quad that holds the row's columns.
template <int QS>
__device__ __forceinline__ void QuadMaxRows(const ForwardArgs& a, float (&run)[QS][2], float chk) {
  if (a.bad != nullptr && NotFinite(chk)) *a.bad = 1u;
#pragma unroll
  for (int qs = 0; qs < QS; ++qs) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float v = run[qs][h];
      // A maximum of +inf is an overflow (finite rows above the norm limit) or an infinite element, wherever the
      // sample did not look: the call is checked as when the sample fires. NaN too (the folds' fmaxf drop NaN
      // similarities, so it is not expected here), tested per lane, before the merge would drop it.
      if (a.bad != nullptr && v != -INFINITY && !(v < INFINITY)) *a.bad = 1u;
      v = QuadMax(v);
      // A dot-product maximum of -0 is the mma.sync chain's +0 (IssueTile); cosine keys were fixed per element.
      run[qs][h] = a.cosine ? v : v + 0.0f;
    }
  }
}

// The end of pair p for the threads that computed it (`bar` spans them all; `first` is lane 0 of one of their
// warps): the quad max of each row's running maximum, then either the score (one group covers the query: these
// threads leave its rows' terms in s_term, and after two barriers the warp of `first` sums them, WarpOrderedSumOf)
// or this group's partial terms (finalize sums the groups and decides emptiness from the mask). run[qs][h]: this
// lane's maximum of local row row0 + qs*64 + 8h (row0 = warp rows + g).
template <int QS, class Barrier>
__device__ __forceinline__ void FinishPair(const ForwardArgs& a, const Barrier& bar, bool first, float* s_term,
                                           float (&run)[QS][2], uint32_t row0, uint32_t grp, uint32_t r0b,
                                           uint64_t p, uint64_t qi, uint64_t dj, uint64_t qb, uint64_t lq,
                                           uint64_t ld, bool saw_kept, float chk) {
  const int t = threadIdx.x & 3;
  const uint32_t G = a.part.groups;
  QuadMaxRows<QS>(a, run, chk);
  auto term_of = [&](uint64_t r, float v) -> float {
    if (!a.q.Kept(qb + r)) return 0.0f;
    return a.cosine ? v * InvNorm(RowNorm(a.q, qb + r)) : v;
  };
  if (G == 1) {
    const bool doc_nonempty = a.d.mask ? bar.SyncOr(saw_kept) : (bar.Sync(), ld > 0);
    if (t == 0) {
#pragma unroll
      for (int qs = 0; qs < QS; ++qs) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t r = row0 + qs * 64 + 8 * h;
          s_term[r] = r < lq ? term_of(r, run[qs][h]) : 0.0f;
        }
      }
    }
    bar.Sync();
    if (__any_sync(kFull, first)) {  // the warp of `first` sums the terms; lane 0, `first`, has the sum
      const double sum = WarpOrderedSumOf(s_term, lq);
      if (first) *a.pairs.ScorePtr(p, qi, dj) = doc_nonempty ? RoundScore(sum) : -INFINITY;
    }
  } else if (t == 0) {
#pragma unroll
    for (int qs = 0; qs < QS; ++qs) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t rl = row0 + qs * 64 + 8 * h;
        const uint64_t r = r0b + rl;
        if (r < lq) {
          const uint64_t slot = (p * G + grp) * a.part.group_rows + rl;
          a.part.term[slot] = term_of(r, run[qs][h]);
          a.part.arg[slot] = -1;
        }
      }
    }
  }
}

// The rows of a batch launch's warp (ForwardArgs::batch; block row group grp holds queries grp * per_group + q,
// in slots of `slot` rows): its 16 rows from local row `wrow` are tokens tok .. tok + 15 of the query in slot
// wrow / slot (rows qb.. of the query sets, lq tokens; has_query false: past the batch or the group's slots).
// Recomputed where needed rather than kept in registers, which the accumulators and query fragments fill.
struct BatchRows {
  uint64_t qb = 0, lq = 0;
  uint32_t tok = 0;
  bool has_query = false;
  __device__ __forceinline__ BatchRows(const ForwardArgs& a, uint32_t grp, uint32_t wrow) {
    const uint32_t qslot = wrow / a.batch.slot;
    const uint64_t qi = static_cast<uint64_t>(grp) * a.batch.per_group + qslot;
    tok = wrow - qslot * a.batch.slot;
    has_query = qslot < a.batch.per_group && qi < a.batch.nq;
    if (has_query) {
      qb = a.q.Begin(qi);
      lq = a.q.End(qi) - qb;
    }
  }
};

// The end of document dj in a batch launch: every row's term (zero for masked rows; nothing for rows past its
// query's length and slots without a query) goes to the partial results, terms[(qi * nd + dj) * slot + token], and
// FinalizeKernel sums each (query, document) in token order after the kernel (the same ordered double sum as
// every other kernel's, and the document's emptiness from its mask). No block barrier: the warpgroups run on
// into the next document.
// A batch warp's rows as FinishDocBatch needs them, worked out when the block takes up a row group (BatchRows) and
// kept in shared memory: the query's first partial-result slot for document 0 (qi * nd * slot), its first row qb,
// its length lq (0: the warp has no query) and the warp's first token tok.
struct BatchWarpRows {
  uint64_t out0, qb;
  uint32_t lq, tok;
};

__device__ __forceinline__ void FinishDocBatch(const ForwardArgs& a, float (&run)[1][2], const BatchWarpRows& wr,
                                               uint64_t dj, float chk) {
  QuadMaxRows<1>(a, run, chk);
  if ((threadIdx.x & 3) == 0) {
    const uint32_t lq = wr.lq, tok = wr.tok;
    const uint32_t g = (threadIdx.x & 31) >> 2;
    if (tok + g >= lq) return;
    const uint64_t qb = wr.qb;
    float* out = a.part.term + wr.out0 + dj * a.batch.slot;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t r = tok + g + 8 * h;
      if (r >= lq) continue;
      float term = 0.0f;
      if (a.q.Kept(qb + r)) term = a.cosine ? run[0][h] * InvNorm(RowNorm(a.q, qb + r)) : run[0][h];
      out[r] = term;
    }
  }
}

// A tile under bulk tensor copies (kTma): the tile of a document of ld tokens that starts at token tb in the
// cp.async kernel, tb + 128 < ld for every tile but the last, is `width` tokens wide: 128, or in batch launches
// (narrow) 64 for a last tile of at most 64 tokens (the consumer's choice, below); pair launches always compute
// 128-token tiles. A last tile that is not whole starts where it ends with the document, overlapping the tile
// before it (those columns are folded twice, which leaves every maximum unchanged), so that no copy reads past a
// document; a document shorter than its tile starts at 0 (TmaTileCopy then repeats its last row).
struct TileSpan {
  uint32_t start, width;
};
__device__ __forceinline__ TileSpan TileAt(uint32_t tb, uint32_t ld, bool narrow) {
  const uint32_t w = !narrow || ld - tb > 64 ? kWgTokens : 64;
  return {tb + w < ld ? tb : ld >= w ? ld - w : 0, w};
}

// The producer's copy, by warp wq of warpgroup wg (lane), of the warpgroup's share of the stage at st (stage
// tokens wg * kBox .. wg * kBox + kBox - 1, kBox = 128 / WGS) for the tile at tb of the document of ld tokens from
// row db (TileAt); every warp arrives on `full` once. Warp 0's lane 0 arrives expecting the bytes of two bulk
// tensor copies of the share, dimensions 0..63 and 64..127 (past dim: zeros), which the tensor map's 128-byte
// swizzle lays out as PieceOffset does, and issues them; the other warps' lanes 0 arrive, and so do warp 0's of
// the shares past a 64-token tile (their rows would lie past the document's end). A document shorter than
// its tile (or rows past the map) is copied by cp.async instead, kBox / 4 tokens per warp, rows past the
// document's end as copies of its last row (CopyStagePieces' kRepeatLast): each lane arrives through its copies and
// lane 0 for the warp. Every warp takes the same branches (a producer warp branching alone made ptxas spill).
template <int WGS, bool kNarrow = true>
__device__ __forceinline__ void TmaTileCopy(const ForwardArgs& a, const void* map, uint32_t st, uint32_t full,
                                            uint64_t db, uint32_t ld, uint32_t tb, int wg, int wq, int lane,
                                            uint32_t dim) {
  constexpr uint32_t kBox = kWgTokens / WGS;
  const TileSpan span = TileAt(tb, ld, kNarrow);
  const uint32_t start = span.start, w = span.width;
  const uint32_t first = static_cast<uint32_t>(wg) * kBox;
  if (ld >= w && db + ld <= kTmaRows) {
    if (lane == 0) {
      if (wq == 0 && first < w) {  // a 64-token tile's wgmma reads stage tokens 0..63 only
        const int y = static_cast<int>(db + start + first);
        MbarArriveExpectTx(full, 2u * kBox * 128u);
        TmaLoad2d(st + first * 128u, map, 0, y, full);
        TmaLoad2d(st + kWgRegionBytes + first * 128u, map, 64, y, full);
      } else {
        MbarArrive(full);
      }
    }
    return;
  }
  // Lane: token lane / 4 (+ 8, ... for kBox > 32) of this warp's kBox / 4, pieces lane % 4 + 4j.
  const uint32_t last = ld - start - 1;
#pragma unroll 1
  for (uint32_t i = 0; i < kBox / 32; ++i) {
    const uint32_t tok = first + static_cast<uint32_t>(wq) * (kBox / 4) + 8 * i + (static_cast<uint32_t>(lane) >> 2);
    const uint8_t* src = a.d.orig + (db + start + std::min(tok, last)) * a.d.row_bytes;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int pc = (lane & 3) + 4 * j;
      CpAsync16(st + PieceOffset<kWgRegionBytes>(pc, static_cast<int>(tok)), src + pc * 16,
                static_cast<uint32_t>(8 * pc) < dim);
    }
  }
  MbarArriveCopiesInc(full);
  __syncwarp();
  if (lane == 0) MbarArrive(full);
}

#endif  // MAXSIM_HAVE_WGMMA

// The batch kernel's stages copied ahead by default, chosen per block from the length ld of its first document: 3
// for documents of more than kBatchAheadLongDoc tokens (kernels.h), else 2 (at most S - 1). With 2, a warpgroup may
// start a tile before the slowest one has finished the tile before it (S - 1 ahead keeps every warpgroup within one
// tile of the slowest). gpu_bench, one H100, 7 alternating rounds each: 300-token documents
// (serve-textual-10k-64q) medians 2.72 ms with 2 ahead against 2.78 with 3; 1030-token documents
// (serve-colpali-16q) 3 ahead faster in every round (about 2%). The threshold lies between the two lengths
// measured.
__device__ __forceinline__ int BatchAhead(uint32_t ld, int S) {
  return std::min(S - 1, ld > kBatchAheadLongDoc ? 3 : 2);
}

// Persistent. Pair launches: grid = G x CPG blocks; block (c, grp) serves row group grp of pairs c, c + CPG,
// c + 2 CPG, ...; the G blocks of a pair run at about the same time, so a document is read from memory once and
// then from L2. Batch launches (kBatch): grp is a group of whole queries and the units are documents; block b serves
// the (row group, document) items of BatchItems (BatchGrid: every SM busy where the groups allow), the blocks of a
// document range walking it at about the same time.
// The warpgroups are not kept in step: the stage ring is guarded by mbarriers (full: every thread's copies
// of the tile landed; empty: every thread's wgmma reading it finished), so one warpgroup's folds overlap the
// other's tensor-core work. Every thread copies its share of each tile `ahead` tiles ahead, across units (batch
// launches with ahead 0: BatchAhead of the block's first document).
// In batch launches a document's last tile of at most 64 tokens runs as a 64-token wgmma.
// kTma: the stages arrive by bulk tensor copies through tmap (TmaTileCopy: one thread per warpgroup issues two
// per stage) instead of every thread's cp.async copies, and both barriers count one arrival per warp. Every warp
// still runs the producer's cursor and waits for a free stage before it arrives.
template <typename T, int WGS, int QS, int S, int BPS, bool kBatch, bool kTma>
__global__ void __launch_bounds__(WGS * 128, BPS)
    ExactWgmmaKernel(const ForwardArgs a, uint32_t cpg, int ahead, const __grid_constant__ CUtensorMap tmap) {
#if defined(MAXSIM_HAVE_WGMMA)
  static_assert(!kBatch || QS == 1, "a batch launch holds one 64-row set per warpgroup");
  static_assert(QS == 1 || !kTma, "bulk tensor copies: one set per warpgroup");
  extern __shared__ uint8_t smem_raw[];
  constexpr int kThreads = WGS * 128, kRows = WGS * QS * 64;
  __shared__ float s_term[kBatch ? 1 : kRows];
  __shared__ BatchWarpRows s_rows[kBatch ? kThreads / 32 : 1];
  __shared__ __align__(8) uint64_t s_full[S], s_empty[S];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wq = warp & 3;
  const int g = lane >> 2;
  // Pair launches: the block's row group and first pair (batch launches: BatchItems, a row group per item).
  const uint32_t G = a.part.groups;
  const uint32_t grp = blockIdx.x % G;
  const uint64_t c0 = blockIdx.x / G;
  const uint32_t r0b = grp * kRows;
  const uint32_t dim = a.q.dim;
  const uint64_t qrb = a.q.row_bytes, drb = a.d.row_bytes;
  const uint64_t units = a.Units();
  const uint32_t full0 = static_cast<uint32_t>(__cvta_generic_to_shared(s_full));
  const uint32_t empty0 = static_cast<uint32_t>(__cvta_generic_to_shared(s_empty));
  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      // kTma: one arrival per warp on each (TmaTileCopy; consumers after their wgmma).
      MbarInit(full0 + 8 * s, kTma ? kThreads / 32 : kThreads);
      MbarInit(empty0 + 8 * s, kTma ? kThreads / 32 : kThreads);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  const uint32_t sraw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t sbase = (sraw + 1023u) & ~1023u;  // the 128-byte swizzle repeats every 1024 bytes
  // Producer cursor (StageCursor). Copy assignment: thread tid always moves 16-byte piece pc (dims 8pc .. 8pc + 7)
  // of tokens tok0, tok0 + kThreads / 16, ... (a warp copies two whole 256-byte rows per instruction).
  const int pc = tid & 15, tok0 = tid >> 4;
  const bool pc_in_dim = static_cast<uint32_t>(8 * pc) < dim;
  auto cur = [&] {
    if constexpr (kBatch) {
      return BatchStageCursor<kWgTokens>(a);
    } else {
      return StageCursor<kWgTokens>(a, c0, cpg, grp, r0b);
    }
  }();
  RingPos produced;
  auto produce = [&]() {
    if (!cur.Active(a)) return;
    const uint32_t s = produced.slot;
    if (produced.lapped) MbarWait(empty0 + 8 * s, produced.phase ^ 1);
    const uint32_t st = sbase + s * kWgStageBytes;
    if constexpr (kTma) {
      TmaTileCopy<WGS, kBatch>(a, &tmap, st, full0 + 8 * s, cur.db, static_cast<uint32_t>(cur.ld),
                               static_cast<uint32_t>(cur.tile * kWgTokens), wg, wq, lane, dim);
    } else {
      CopyStagePieces<kWgRegionBytes, kWgTokens * 16 / kThreads, kThreads / 16, true>(
          st, pc, tok0, pc_in_dim, a.d.orig + cur.db * drb, drb, cur.tile * kWgTokens, cur.ld);
      MbarArriveCopies(full0 + 8 * s);
    }
    produced.Advance(S);
    cur.Advance(a);
  };
  int fill = ahead;
  if constexpr (kBatch) {
    if (fill == 0) fill = BatchAhead(cur.ld, S);
  }
#pragma unroll 1
  for (int s = 0; s < fill; ++s) produce();

  const bool plain = a.d.mask == nullptr && !a.cosine;
  float acc0[64], acc1[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc0[i] = acc1[i] = 0.0f;  // never read (WgmmaFirst), but defined
  uint4 qa[QS][4], qc[QS][4];
  uint64_t loaded_q = ~0ull;      // pair launches: the query in the fragments
  uint32_t loaded_grp = ~0u;      // batch launches: the row group in them
  RingPos consumed;
  // The folded input check (below): the warp that checks every document column of a unit, the block's warps in
  // turn (the extra folds spread over the SM's schedulers instead of all on warp 0's), and whether this warp has
  // yet to check its query rows (on the first tile it computes after loading them).
  int check_warp = 0;
  bool rows_unchecked = true;
  using Walk = std::conditional_t<kBatch, BatchItems, PairWalk>;
  for (Walk w = [&] {
         if constexpr (kBatch) {
           return BatchItems(a);
         } else {
           return PairWalk{c0, cpg, units};
         }
       }();
       w.Active(); w.Next(a)) {
    const uint64_t p = w.Unit();
    uint64_t qi = 0, dj = p, qb = 0, lq = 0;
    if constexpr (kBatch) {
      if (w.grp != loaded_grp) {
        // A new row group (once, or a few times, per block): this warp's rows (BatchRows, kept in s_rows for
        // FinishDocBatch) and query fragments, loaded after every wgmma that read the previous ones has completed
        // (each tile ends with wait_group 0); the warp checks its new query rows on its next tile.
        const BatchRows br(a, w.grp, wg * 64 + wq * 16);
        __syncwarp();  // the warp's reads of s_rows[warp] for the previous document are done
        if (lane == 0) {
          const uint64_t qw = static_cast<uint64_t>(w.grp) * a.batch.per_group + (wg * 64 + wq * 16) / a.batch.slot;
          const uint32_t wlq = br.has_query ? static_cast<uint32_t>(br.lq) : 0u;
          s_rows[warp] = BatchWarpRows{qw * a.pairs.nd * a.batch.slot, br.qb, wlq, br.tok};
        }
        __syncwarp();
        LoadQueryFragments<QS>(a.q.orig + br.qb * qrb, qrb, br.lq, dim, br.tok + g, qa, qc);
        loaded_grp = w.grp;
        rows_unchecked = true;
      }
    }
    if constexpr (!kBatch) {
      a.pairs.Resolve(p, &qi, &dj);
      qb = a.q.Begin(qi);
      lq = a.q.End(qi) - qb;
      if (grp > 0 && r0b >= lq) continue;  // no rows here (the producer skipped it too)
    }
    const uint64_t db = a.d.Begin(dj), ld = a.d.End(dj) - db;
    if constexpr (!kBatch) {
      if (qi != loaded_q) {
        // This warpgroup's sets: rows r0b + wg*QS*64 + qs*64 + wq*16 + g (+8). Every wgmma that read the previous
        // fragments has completed (each tile ends with wait_group 0).
        LoadQueryFragments<QS>(a.q.orig + qb * qrb, qrb, lq, dim, r0b + wg * QS * 64 + wq * 16 + g, qa, qc);
        loaded_q = qi;
        rows_unchecked = true;
      }
    }
    float run[QS][2];
#pragma unroll
    for (int qs = 0; qs < QS; ++qs) run[qs][0] = run[qs][1] = -INFINITY;
    bool saw_kept = false;
    float chk = 0.0f;
    // The folded input check's share of this unit's tiles (below), worked out once per unit. The document columns:
    // pair launches check them in one row group's block (each of a query's groups sees the whole document; the
    // pairs spread over the groups that have rows), batch launches in every item.
    bool columns_here = true;
    if constexpr (!kBatch) {
      const uint64_t row_groups = std::max<uint64_t>(1, std::min<uint64_t>(G, (lq + kRows - 1) / kRows));
      columns_here = static_cast<uint32_t>(p) % static_cast<uint32_t>(row_groups) == grp;
    }
    const bool checker = columns_here && warp == check_warp;
    if (columns_here) check_warp = check_warp + 1 == kThreads / 32 ? 0 : check_warp + 1;
    const uint32_t check_unit = a.bad == nullptr ? 0u : !plain ? kCheckRows | kCheckColumns
                                : checker && columns_here ? kCheckColumns : 0u;
    bool check_rows = a.bad != nullptr && rows_unchecked;
    // Tile numbers in 32 bits: a document of 2^32 tiles would be 2^46 bytes of 16-bit rows.
    const uint32_t ntiles = static_cast<uint32_t>((ld + kWgTokens - 1) / kWgTokens);
    for (uint32_t tile = 0; tile < ntiles; ++tile, consumed.Advance(S)) {
      const uint32_t s = consumed.slot;
      MbarWait(full0 + 8 * s, consumed.phase);
      FenceProxyAsync();  // the copies (generic proxy) before this thread's wgmma reads (async proxy)
      const uint32_t st = sbase + s * kWgStageBytes;
      // The folded input check (ForwardArgs::bad) on a share of the tiles that still sees every kept query and
      // document row: a non-finite element makes every similarity of its row non-finite, whatever the other row
      // (NaN * x = NaN, Inf * 0 = NaN), so one warp checking every column of a unit covers every document row, and
      // every warp checking the first tile it computes with its query rows covers every query row (without a mask
      // every column of it below ld is kept; masked documents are checked whole on every tile by every warp). The
      // condition is uniform across the warp: a per-thread one (divergent control flow around the accumulators)
      // slowed the kernel down.
      const uint32_t check = check_unit | (check_rows ? kCheckRows : 0u);
      check_rows = false;
      rows_unchecked = false;
      // kTma: a last tile starts where it ends with the document (TileAt).
      const uint64_t base = kTma ? TileAt(tile * kWgTokens, static_cast<uint32_t>(ld), kBatch).start
                                 : static_cast<uint64_t>(tile) * kWgTokens;
      // Both row sets are issued, the next copies go out while they run, then set 0 is folded during set 1.
      // (Folding set 1 of the previous tile during set 0 of this one, across iterations, makes ptxas
      // serialise every wgmma: ptxas report C7514.)
      if constexpr (QS == 2) {
        IssueTile<T, kWgTokens>(acc0, qa[0], qc[0], st);
        IssueTile<T, kWgTokens>(acc1, qa[QS - 1], qc[QS - 1], st);
        produce();
        WgWait<1>();
        PinAcc(acc0);
        FoldTileMax<kWgTokens>(a, acc0, db, ld, base, plain, run[0][0], run[0][1], saw_kept, check, chk);
        WgWait<0>();
        PinAcc(acc1);
        MbarArrive(empty0 + 8 * s);  // this thread's reads of the stage are done
        FoldTileMax<kWgTokens>(a, acc1, db, ld, base, plain, run[1][0], run[1][1], saw_kept, check, chk);
      } else {
        auto run_tile = [&](auto width) {
          constexpr int N = decltype(width)::value;
          IssueTile<T, N>(acc0, qa[0], qc[0], st);
          produce();
          WgWait<0>();
          PinAcc(acc0);
          // This thread's (kTma: this warp's) reads of the stage are done.
          if (!kTma || lane == 0) MbarArrive(empty0 + 8 * s);
          FoldTileMax<N>(a, acc0, db, ld, base, plain, run[0][0], run[0][1], saw_kept, check, chk);
        };
        // Batch launches: a document's last tile of at most 64 tokens runs as a 64-token wgmma (documents of 300
        // tokens: 320 columns computed instead of 384). This width in pair launches exceeds the register budget
        // (ptxas then serialises the wgmma pipeline: C7511). The narrowest multiple of 16 instead (16 .. 112 columns)
        // compiled without spills but made the batch kernel 11-21% slower on both serving shapes in gpu_bench
        // (more code in the loop; not profiled).
        if (!kBatch || ld - base > 64) {
          run_tile(std::integral_constant<int, 128>{});
        } else {
          run_tile(std::integral_constant<int, 64>{});
        }
      }
    }
    if constexpr (kBatch) {
      FinishDocBatch(a, run, s_rows[warp], dj, chk);
    } else {
      FinishPair<QS>(a, BlockBarrier{}, tid == 0, s_term, run, wg * QS * 64 + wq * 16 + g, grp, r0b, p, qi, dj,
                     qb, lq, ld, saw_kept, chk);
    }
  }
#endif
}

template <typename T, int WGS, int QS, int S, int BPS, bool kBatch, bool kTma>
cudaError_t LaunchWgmmaShape(const ForwardArgs& a, cudaStream_t stream, int ahead, const CUtensorMap& map) {
  const int smem = S * kWgStageBytes + 1024;  // + alignment slack for the 1024-byte swizzle period
  const cudaError_t e = AllowDynamicSmemOnce<ExactWgmmaKernel<T, WGS, QS, S, BPS, kBatch, kTma>>(smem);
  if (e != cudaSuccess) return e;
  // Stages copied ahead: S - 1 by default (all but the one being read; producing waits for the stage of the tile
  // before), faster than S - 2 on both q128 and visual on the H100. Fewer (the batch kernel's
  // KernelSwitches::batch_ahead) let a warpgroup run S - ahead - 1 tiles ahead of the slowest one. Batch launches
  // pass 0 for BatchAhead's choice.
  if ((!kBatch && ahead < 1) || ahead > S - 1) ahead = S - 1;
  ForwardArgs la = a;
  uint64_t cpg = 0, blocks = 0;
  if (kBatch) {
    if (!BatchGrid(a, BPS, a.sw.batch_spread ? a.sw.batch_spread : 2, &blocks, &la.batch.range)) {
      return cudaErrorInvalidConfiguration;
    }
  } else if (!PersistentGrid(a, BPS, &cpg, &blocks)) {
    return cudaErrorInvalidConfiguration;
  }
  ExactWgmmaKernel<T, WGS, QS, S, BPS, kBatch, kTma>
      <<<static_cast<unsigned>(blocks), WGS * 128, smem, stream>>>(la, static_cast<uint32_t>(cpg), ahead, map);
  return cudaGetLastError();
}

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The kernel's tensor map (kTma) over the document rows from a.d.orig: 16-bit elements, dim of them per row
// (the dimensions past dim read as zeros), rows a.d.row_bytes apart (a multiple of 16, from a 16-byte aligned
// start: TcSupported), kTmaRows of them; boxes of 64 dimensions x box_rows rows, 128-byte swizzled. False where
// the driver has no encoder or refuses the map (the kernel then copies with cp.async), and where the rows are
// not plain device memory (ForwardArgs::d_device_memory, else one driver query): callers may pass pinned host or
// managed tensors as CUDA memory, and the bulk copies are only measured and tested on device memory, so those keep
// the ordinary cp.async loads.
bool EncodeDocMap(const ForwardArgs& a, uint32_t box_rows, CUtensorMap* map) {
  static const EncodeTiledFn encode = reinterpret_cast<EncodeTiledFn>(DriverEntry("cuTensorMapEncodeTiled"));
  const bool device = a.d_device_memory < 0 ? IsDeviceMemory(a.d.orig) : a.d_device_memory == 1;
  if (encode == nullptr || !device) return false;
  const cuuint64_t gdim[2] = {a.d.dim, kTmaRows};
  const cuuint64_t gstride[1] = {a.d.row_bytes};
  const cuuint32_t box[2] = {64, box_rows}, estride[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, const_cast<uint8_t*>(a.d.orig), gdim, gstride, box, estride,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Block shapes (H100, bf16): 256-row groups run 4 warpgroups of one 64-row set that all copy and compute, 4 stages
// of 128 tokens (129 KB, 128 registers); 128-row groups 2 warpgroups of one set, 3 stages of 128 tokens (97 KB,
// two blocks per SM). Other shapes measured slower or no faster on the visual and q128 shapes (a warp-specialised
// producer/consumer kernel, two sets per warpgroup; git history keeps them), and so did 5 stages (all but one
// copied ahead) and 6 stages with 3 copied ahead on visual. Bulk tensor copies where the tensor map encodes: batch
// launches (KernelSwitches::batch_tma) and pair launches of 256-row groups (wgmma_tma; visual 4.7% faster than by
// cp.async). Pair launches of 128-row groups keep cp.async: with bulk copies q128 measured the same on a packed
// corpus and 1% slower from dense tensors.
template <typename T, bool kBatch>
cudaError_t LaunchWgmmaT(const ForwardArgs& a, cudaStream_t stream) {
  // Batch launches: KernelSwitches::batch_ahead stages copied ahead (1..S - 1), or 0: by document length
  // (BatchAhead).
  const int ahead = !kBatch ? 0 : static_cast<int>(a.sw.batch_ahead);
  const bool wide = a.part.group_rows == 128;  // 2 warpgroups: each copies 64 rows of a stage
  CUtensorMap map;
  std::memset(&map, 0, sizeof(map));
  if (kBatch && a.sw.batch_tma && EncodeDocMap(a, wide ? 64 : 32, &map)) {
    if (wide) return LaunchWgmmaShape<T, 2, 1, 3, 2, true, true>(a, stream, ahead, map);
    return LaunchWgmmaShape<T, 4, 1, 4, 1, true, true>(a, stream, ahead, map);
  }
  if (!kBatch && !wide && a.sw.wgmma_tma && EncodeDocMap(a, 32, &map)) {
    return LaunchWgmmaShape<T, 4, 1, 4, 1, false, true>(a, stream, ahead, map);
  }
  if (wide) return LaunchWgmmaShape<T, 2, 1, 3, 2, kBatch, false>(a, stream, ahead, map);
  return LaunchWgmmaShape<T, 4, 1, 4, 1, kBatch, false>(a, stream, ahead, map);
}

// The inputs every wgmma kernel takes: 16-bit originals of one dtype, 96 < dim <= 128 (8 k16 steps), an sm_90
// device whose loaded module has the sm_90a code.
bool WgmmaInputsFit(const ForwardArgs& a) {
  if (a.q.dtype != a.d.dtype || (a.q.dtype != kBF16 && a.q.dtype != kF16)) return false;
  if (a.q.dim <= 96 || a.q.dim > 128) return false;
  int dev = 0;
  return cudaGetDevice(&dev) == cudaSuccess && WgmmaAvailable(dev);
}

}  // namespace

bool WgmmaAvailable(int dev) {
  // What the module loaded for the device was compiled for, cached per device (0 = not yet asked).
  static std::atomic<int> cached[64];
  if (dev < 0 || dev >= 64) return false;
  int v = cached[dev].load();
  if (v == 0) {
    int major = 0, minor = 0, compiled = 0, current = 0;
    const bool hopper = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
                        major == 9 && minor == 0;
    if (hopper && cudaGetDevice(&current) == cudaSuccess) {
      if (current == dev || cudaSetDevice(dev) == cudaSuccess) {
        if (cudaMemcpyFromSymbol(&compiled, g_wgmma_compiled, sizeof(int)) != cudaSuccess) compiled = 0;
        if (current != dev) cudaSetDevice(current);
      }
    }
    cudaGetLastError();  // a failed query above must not surface as a later launch error
    v = hopper && compiled == 1 ? 1 : 2;
    cached[dev].store(v);
  }
  return v == 1;
}

bool WgmmaUsable(const ForwardArgs& a) {
  if (!a.sw.wgmma) return false;
  if (a.pairs.argmax != nullptr) return false;
  if (a.part.group_rows != 256 && a.part.group_rows != 128) return false;
  return WgmmaInputsFit(a);
}

cudaError_t LaunchExactWgmma(const ForwardArgs& a, cudaStream_t stream) {
  const uint64_t tasks = a.pairs.n_pairs * a.part.groups;
  if (tasks == 0) return cudaSuccess;
  if (tasks > 0x7fffffffull) return cudaErrorInvalidConfiguration;
  return a.q.dtype == kBF16 ? LaunchWgmmaT<__nv_bfloat16, false>(a, stream) : LaunchWgmmaT<__half, false>(a, stream);
}

// Batches: queries of up to 128 tokens (a slot of 16..128 rows; longer queries fill a row group on their own and
// run as pairs), at least two of them, matrix layout, values only.
bool WgmmaBatchUsable(const ForwardArgs& a, uint64_t max_lq) {
  if (!a.sw.wgmma || !a.sw.batch) return false;
  if (a.pairs.layout != kPairsMatrix || a.pairs.argmax != nullptr || a.pairs.nd == 0) return false;
  if (a.part.term == nullptr) return false;  // the per-row terms go through the partial results (BatchPartialBytes)
  if (a.pairs.n_pairs / a.pairs.nd < 2 || max_lq > 128) return false;
  if (a.pairs.nd > 0xffffffffull) return false;  // BatchItems counts documents in 32 bits
  return WgmmaInputsFit(a);
}

// Slots of max_lq rounded up to 16 rows (a warp's rows then belong to one query); 128-row groups (two blocks per
// SM) when the whole batch fits one, else 256-row groups.
cudaError_t LaunchExactWgmmaBatch(const ForwardArgs& in, uint64_t max_lq, cudaStream_t stream) {
  ForwardArgs a = in;
  a.sw.wgmma_int_fold = false;  // TreeMax: integer row maxima (TreeMaxInt) have not been timed on the serving shapes
  const uint64_t nq = a.pairs.nd ? a.pairs.n_pairs / a.pairs.nd : 0;
  if (nq == 0) return cudaSuccess;
  const uint32_t slot = static_cast<uint32_t>(std::max<uint64_t>(16, (max_lq + 15) / 16 * 16));
  const uint32_t rows = a.sw.batch_rows ? a.sw.batch_rows : nq * slot <= 128 ? 128 : 256;
  a.batch.slot = slot;
  a.batch.per_group = rows / slot;
  a.batch.nq = nq;
  const uint64_t groups = (nq + a.batch.per_group - 1) / a.batch.per_group;
  if (groups > 0x7fffffffull) return cudaErrorInvalidConfiguration;
  a.part.groups = static_cast<uint32_t>(groups);
  a.part.group_rows = rows;
  a.part.arg = nullptr;
  const cudaError_t e =
      a.q.dtype == kBF16 ? LaunchWgmmaT<__nv_bfloat16, true>(a, stream) : LaunchWgmmaT<__half, true>(a, stream);
  if (e != cudaSuccess) return e;
  // The scores: each (query, document) pair's slot of terms summed in token order.
  ForwardArgs f = in;
  f.part.groups = 1;
  f.part.group_rows = slot;
  f.part.arg = nullptr;
  return LaunchFinalize(f, stream);
}

uint64_t BatchPartialBytes(uint64_t n_pairs, uint64_t max_lq) {
  return max_lq > 128 ? 0 : n_pairs * std::max<uint64_t>(16, (max_lq + 15) / 16 * 16) * sizeof(float);
}

}  // namespace mscuda
