// SPDX-License-Identifier: Apache-2.0
// Certified screening for long queries on Hopper (sm_90a): int8 wgmma over per-document-scale codes, candidates
// chosen in the integer domain, then exact refinement in a second kernel. Same results as the exact kernels, bit
// for bit (CERTIFIED == EXACT).
//
// Why a second code layout. The packed buffer quantises every token with its own scale s_j, so ranking a query
// row's int8 dots needs one float scaling per element (convert, multiply, compare, plus per-tile margins: ~24
// instructions per element in ScreenKernel, which made the visual shape several times slower than exact). Here a
// resident corpus gets, once, a second int8 copy quantised with one scale S per document (DocScaleCodesKernel:
// S = max |v| / 127 over the document, codes round(v / S), and per document the largest norm |d| and the largest
// residual norm r = ||v - S c||, both computed in double and rounded up). Within a document the dots I_j of one
// query row are then directly comparable: with the query's own codes (scale s_q, residual e_q) and M the bound
// below, the exact kernels' similarity v_j satisfies |v_j - s_q S I_j| <= M for every token j, so
//   the exact maximum's token can only be a j with I_j >= max_k I_k - 2M / (s_q S)  =: max_k I_k - delta,
// an integer test. M = max|d| (e_q + gamma' |q|) + max r (e_q + |q|) (+ slack): the packed-format bound
// |<q,d> - s_q S <q8, c>| <= e_q ||S c|| + |q| r <= e_q (|d| + r) + |q| r, plus the exact kernels' own rounding
// gamma' |q| |d| (ScreenBoundFor), with relative slack for the float evaluation; delta is rounded up.
//
// ScreenWgmmaKernel (one block per 256-row group of a pair, persistent, as ExactWgmmaKernel): warpgroups hold
// their 64-row query sets as wgmma A fragments (int8 codes, 16 registers a set) and the document's codes stream
// through an mbarrier-guarded ring of 128-token stages (16 KB). Per stage and row: the stage maximum (quad
// shuffles), the running maximum, and the threshold max - delta; every lane sets one flag bit per column that
// reaches it (no branches) and a lane with flags appends one record {row, first column, flags, its largest dot}
// to the task's list in global memory (one shared atomic per warp and stage). At the end of a pair the rows'
// final thresholds are stored.
// ScreenWgmmaRefineKernel (one block per task): expands the records whose largest dot reaches the row's final
// threshold (with their other flagged columns: a few extra refinements), computes those similarities with the
// exact kernels' arithmetic (RefineRound16) against the group's query rows in shared memory, and folds
// (value, lowest index) keys per row; then scores or partial terms exactly as the exact kernels write them. A
// task whose records overflowed (more than cap: near-ties, duplicates, zero vectors) is refined over every
// token instead, which is slow but exact.
#include <math.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "forward_common.cuh"
#include "wgmma_common.cuh"

namespace mscuda {
namespace {

constexpr int kSwTokens = 128;                   // document tokens per stage (wgmma N)
constexpr int kSwCodeBytes = 128;                // int8 code row (dims <= 128)
constexpr int kSwStageBytes = kSwTokens * kSwCodeBytes;
constexpr int kSwWarpgroups = 4;                 // one 64-row set each: 256 rows per block
constexpr int kSwThreads = kSwWarpgroups * 128;
constexpr int kSwStages = 6;

// ---- per-document-scale codes ------------------------------------------------------------------------------

__device__ __forceinline__ float RoundUpNorm(double sum_sq) {
  return __double2float_ru(sqrt(sum_sq) * (1.0 + 0x1p-40));
}

// One block per document (grid-stride): pass 1 finds S, pass 2 writes one warp per token (lane l: dims 4l..4l+3).
__global__ void __launch_bounds__(256) DocScaleCodesKernel(const SetsView d, int8_t* codes, float4* info) {
  __shared__ float s_red[8];
  __shared__ float s_nmax[8], s_rmax[8];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint32_t dim = d.dim;
  for (uint64_t j = blockIdx.x; j < d.n_sets; j += gridDim.x) {
    const uint64_t b = d.Begin(j), len = d.End(j) - b;
    float m = 0.0f;
    for (uint64_t r = warp; r < len; r += 8) {
      const uint8_t* row = d.orig + (b + r) * d.row_bytes;
      for (uint32_t k = lane; k < dim; k += 32) m = fmaxf(m, fabsf(LoadElem(row, k, d.dtype)));
    }
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(kFull, m, off));
    if (lane == 0) s_red[warp] = m;
    __syncthreads();
    float mx = 0.0f;
    for (int w = 0; w < 8; ++w) mx = fmaxf(mx, s_red[w]);
    float S = mx / 127.0f;
    if (!(S >= 0x1p-126f)) S = 1.0f;  // an all-zero (or denormal) document: codes 0, residuals = the vectors
    float nmax = 0.0f, rmax = 0.0f;
    for (uint64_t r = warp; r < len; r += 8) {
      const uint8_t* row = d.orig + (b + r) * d.row_bytes;
      double sn = 0.0, sr = 0.0;
      uint32_t word = 0;
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const uint32_t k = 4 * lane + u;
        int c = 0;
        if (k < dim) {
          const float v = LoadElem(row, k, d.dtype);
          c = static_cast<int>(rintf(v / S));
          c = c > 127 ? 127 : (c < -127 ? -127 : c);
          const double e = static_cast<double>(v) - static_cast<double>(S) * c;
          sn += static_cast<double>(v) * v;
          sr += e * e;
        }
        word |= (static_cast<uint32_t>(c) & 0xffu) << (8 * u);
      }
      reinterpret_cast<uint32_t*>(codes + (b + r) * kSwCodeBytes)[lane] = word;
      for (int off = 16; off > 0; off >>= 1) {
        sn += __shfl_xor_sync(kFull, sn, off);
        sr += __shfl_xor_sync(kFull, sr, off);
      }
      nmax = fmaxf(nmax, RoundUpNorm(sn));
      rmax = fmaxf(rmax, RoundUpNorm(sr));
    }
    if (lane == 0) {
      s_nmax[warp] = nmax;
      s_rmax[warp] = rmax;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < 8; ++w) {
        nmax = fmaxf(nmax, s_nmax[w]);
        rmax = fmaxf(rmax, s_rmax[w]);
      }
      info[j] = make_float4(S, nmax, rmax, 0.0f);
    }
    __syncthreads();
  }
}

#if defined(MAXSIM_HAVE_WGMMA)

constexpr int kDeltaNone = 1 << 30;  // "every token is a candidate"

// D (64 x 128 s32: this thread's 64 values) = A (registers: 4 x 4 int8) x B (shared-memory descriptor: 128
// tokens x 32 int8) + D, or A x B when sd == 0.
#define MAXSIM_R8(i) "+r"(d[i]), "+r"(d[i + 1]), "+r"(d[i + 2]), "+r"(d[i + 3]), "+r"(d[i + 4]), "+r"(d[i + 5]), \
                     "+r"(d[i + 6]), "+r"(d[i + 7])
__device__ __forceinline__ void WgmmaS8(int (&d)[64], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                        uint64_t desc, int sd) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p;\n}\n"
      : MAXSIM_R8(0), MAXSIM_R8(8), MAXSIM_R8(16), MAXSIM_R8(24), MAXSIM_R8(32), MAXSIM_R8(40), MAXSIM_R8(48),
        MAXSIM_R8(56)
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(sd));
}
#undef MAXSIM_R8

// The query codes of rows g (qa) and g + 8 (qc) of this warp's 16 rows as A fragments of the 4 k32 steps: step s
// takes bytes [32s + 4t, +4) (a0 / a1) and [32s + 16 + 4t, +4) (a2 / a3), the layout of mma.m16n8k32's A. The
// stage rows hold the document codes in natural order, so logical k = code byte (integer dots: any order would
// do as long as A and B agree).
__device__ __forceinline__ void LoadCodeFragments(const int8_t* codes, uint32_t cb, uint64_t ra, bool ra_ok,
                                                  uint64_t rc, bool rc_ok, uint32_t (&qa)[4][2],
                                                  uint32_t (&qc)[4][2]) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int s = 0; s < 4; ++s) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t off = 32 * s + 16 * h + 4 * t;
      qa[s][h] = ra_ok ? __ldg(reinterpret_cast<const uint32_t*>(codes + ra * cb + off)) : 0u;
      qc[s][h] = rc_ok ? __ldg(reinterpret_cast<const uint32_t*>(codes + rc * cb + off)) : 0u;
    }
  }
}

// Integer rows of a finished 64 x 128 tile: lane (g, t) holds, for n8 block j, columns 8j + 2t + e of rows g
// (d[4j + e]) and g + 8 (d[4j + 2 + e]).
__device__ __forceinline__ void TileRowMax(const int (&d)[64], int& m0, int& m1) {
  int a0 = d[0], b0 = d[1], a1 = d[2], b1 = d[3];
#pragma unroll
  for (int j = 1; j < 16; ++j) {
    a0 = __vimax3_s32(a0, d[4 * j], b0);
    b0 = d[4 * j + 1];
    a1 = __vimax3_s32(a1, d[4 * j + 2], b1);
    b1 = d[4 * j + 3];
  }
  m0 = max(a0, b0);
  m1 = max(a1, b1);
}

#endif  // MAXSIM_HAVE_WGMMA

// One block per 256-row group of a pair (persistent: block (c, grp) serves group grp of pairs c, c + cpg, ...).
// All threads copy their share of each stage S - 1 stages ahead, across pairs; each warpgroup issues its set's
// 4 wgmma steps on a stage, copies, waits, frees the stage and screens the tile.
template <int S>
__global__ void __launch_bounds__(kSwThreads, 1)
    ScreenWgmmaKernel(const ForwardArgs a, ScreenBound bound, uint32_t cpg) {
#if defined(MAXSIM_HAVE_WGMMA)
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t s_full[S], s_empty[S];
  __shared__ uint32_t s_count;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wq = warp & 3, g = lane >> 2, t = lane & 3;
  const uint32_t G = a.part.groups;
  const uint32_t grp = blockIdx.x % G;
  const uint64_t c0 = blockIdx.x / G;
  const uint32_t r0b = grp * kScreenWgmmaRows;
  const uint32_t full0 = static_cast<uint32_t>(__cvta_generic_to_shared(s_full));
  const uint32_t empty0 = static_cast<uint32_t>(__cvta_generic_to_shared(s_empty));
  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      MbarInit(full0 + 8 * s, kSwThreads);
      MbarInit(empty0 + 8 * s, kSwThreads);
    }
    s_count = 0;
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const uint32_t sraw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t sbase = (sraw + 1023u) & ~1023u;  // the 128-byte swizzle repeats every 1024 bytes
  // Producer (StageCursor, CopyStagePieces): thread tid moves 16-byte piece tid % 8 of tokens tid / 8 + 64 i of
  // each stage; a warp copies 4 whole 128-byte code rows per instruction. Piece pc of token tok sits at chunk
  // pc ^ (tok % 8).
  StageCursor<kSwTokens> cur(a, c0, cpg, grp, r0b);
  RingPos produced;
  auto produce = [&]() {
    if (!cur.Active(a)) return;
    const uint32_t s = produced.slot;
    if (produced.lapped) MbarWait(empty0 + 8 * s, produced.phase ^ 1);
    const uint32_t st = sbase + s * kSwStageBytes;
    // Code rows are 128 bytes: pieces 0..7 of one k region (kRegion is never reached), no piece past the row.
    CopyStagePieces<kSwStageBytes, kSwTokens * 8 / kSwThreads, kSwThreads / 8>(
        st, tid & 7, tid >> 3, true, reinterpret_cast<const uint8_t*>(a.d.dscodes + cur.db * kSwCodeBytes),
        kSwCodeBytes, cur.tile * kSwTokens, cur.ld);
    MbarArriveCopies(full0 + 8 * s);
    produced.Advance(S);
    cur.Advance(a);
  };
#pragma unroll 1
  for (int s = 0; s < S - 1; ++s) produce();

  int acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0;  // never read (scale-d = 0), but defined
  uint32_t qa[4][2], qc[4][2];
  uint64_t loaded_q = ~0ull;
  RingPos consumed;
  const uint32_t rl0 = wg * 64 + wq * 16 + g;  // this lane's local rows rl0 (h = 0) and rl0 + 8 (h = 1)
  for (uint64_t p = c0; p < a.pairs.n_pairs; p += cpg) {
    uint64_t qi, dj;
    a.pairs.Resolve(p, &qi, &dj);
    const uint64_t qb = a.q.Begin(qi), lq = a.q.End(qi) - qb;
    if (grp > 0 && r0b >= lq) continue;  // no rows here (the producer skipped it too)
    const uint64_t db = a.d.Begin(dj), ld = a.d.End(dj) - db;
    const uint64_t task = p * G + grp;
    if (qi != loaded_q) {
      // Every wgmma that read the previous fragments has completed (each tile ends with wait_group 0).
      const uint64_t ra = r0b + rl0, rc = ra + 8;
      LoadCodeFragments(a.q.codes + qb * a.q.code_bytes, a.q.code_bytes, ra, ra < lq, rc, rc < lq, qa, qc);
      loaded_q = qi;
    }
    // Per row: delta (the integer margin) and the running maximum. Rows past the query never pass.
    int delta[2], run[2] = {INT_MIN, INT_MIN};
    const float4 di = ld > 0 ? __ldg(a.d.dsinfo + dj) : make_float4(1.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint64_t r = r0b + rl0 + 8 * h;
      if (r >= lq) {
        delta[h] = -kDeltaNone;
        continue;
      }
      const maxsim_vector_meta m = a.q.meta[qb + r];
      const float rel = 1.0f + 0x1p-18f;
      const float al = (m.resid_norm + bound.gamma * m.norm) * rel;
      const float be = (m.resid_norm + m.norm) * rel;
      const float M = fmaf(al, di.y, fmaf(be, di.z, bound.slack)) * rel;
      const double den = static_cast<double>(m.scale) * static_cast<double>(di.x);
      const double dd = den > 0.0 ? 2.0 * static_cast<double>(M) / den * (1.0 + 0x1p-40) : INFINITY;
      delta[h] = dd < static_cast<double>(kDeltaNone - 2) ? static_cast<int>(ceil(dd)) + 1 : kDeltaNone;
    }
    uint4* list = a.cand.list + task * a.cand.cap;
    const uint32_t cap = a.cand.cap;
    const uint64_t ntiles = (ld + kSwTokens - 1) / kSwTokens;
    for (uint64_t tile = 0; tile < ntiles; ++tile, consumed.Advance(S)) {
      const uint32_t s = consumed.slot;
      MbarWait(full0 + 8 * s, consumed.phase);
      FenceProxyAsync();  // the copies (generic proxy) before this thread's wgmma reads (async proxy)
      const uint32_t st = sbase + s * kSwStageBytes;
      WgFence();
#pragma unroll
      for (int k = 0; k < 4; ++k) WgmmaS8(acc, qa[k][0], qc[k][0], qa[k][1], qc[k][1], SmemDesc(st + 32 * k), k > 0);
      WgCommit();
      PinAcc(acc);
      produce();
      WgWait<0>();
      PinAcc(acc);
      MbarArrive(empty0 + 8 * s);  // this thread's reads of the stage are done
      const uint64_t base = tile * kSwTokens;
      if (base + kSwTokens > ld) {
        // The last, partial stage: columns past the document never pass (their codes were zero-filled).
#pragma unroll
        for (int j = 0; j < 16; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            if (base + 8 * j + 2 * t + e >= ld) acc[4 * j + e] = acc[4 * j + 2 + e] = INT_MIN;
          }
        }
      }
      int m[2];
      TileRowMax(acc, m[0], m[1]);
      int th[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        int q = max(m[h], __shfl_xor_sync(kFull, m[h], 1));
        q = max(q, __shfl_xor_sync(kFull, q, 2));
        run[h] = max(run[h], q);
        th[h] = delta[h] < 0 ? INT_MAX : run[h] - delta[h];  // run >= -2^21 here: no overflow
      }
      // Flag the columns that reach the threshold (a bit per column, no branches), then one record per lane and
      // row with flags: {row, first column, flags, the lane's largest dot m}. m is the refinement's filter: a
      // record whose m is below the row's final threshold holds no candidate. One shared atomic per warp.
      uint32_t flags[2] = {0u, 0u};
#pragma unroll
      for (int j = 0; j < 16; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int e = 0; e < 2; ++e) flags[h] |= (acc[4 * j + 2 * h + e] >= th[h] ? 1u : 0u) << (2 * j + e);
        }
      }
      const unsigned b0 = __ballot_sync(kFull, flags[0] != 0u), b1 = __ballot_sync(kFull, flags[1] != 0u);
      if ((b0 | b1) != 0u) {
        uint32_t first = 0;
        if (lane == 0) first = atomicAdd(&s_count, static_cast<uint32_t>(__popc(b0) + __popc(b1)));
        first = __shfl_sync(kFull, first, 0);
        const unsigned lt = (1u << lane) - 1u;
        const uint32_t col0 = static_cast<uint32_t>(base) + 2 * t;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (flags[h] != 0u) {
            const uint32_t pos = first + (h ? __popc(b0) + __popc(b1 & lt) : __popc(b0 & lt));
            if (pos < cap) {
              list[pos] = make_uint4(((rl0 + 8 * h) << 24) | col0, flags[h], static_cast<uint32_t>(m[h]), 0u);
            }
          }
        }
      }
    }
    // The rows' final thresholds (quad-uniform), then the list length; s_count is reset for the next pair.
    if (t == 0 && ld > 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (delta[h] >= 0) a.cand.threshold[task * kScreenWgmmaRows + rl0 + 8 * h] = run[h] - delta[h];
      }
    }
    __syncthreads();
    if (tid == 0) {
      a.cand.count[task] = s_count;
      s_count = 0;
    }
    __syncthreads();
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");  // no copy outlives its thread
#endif
}

// Query rows of the refinement kernel in shared memory: 256 bytes + 16 of padding, so that the 8 candidates of a
// sub-round (rows g) and the 4 lanes of a quad (8 bytes at 8t) hit 32 distinct banks.
constexpr uint32_t kRefineRowStride = 272;

// One block per task: filter, refine, write. Dynamic shared memory: the group's query rows, then 2 cap entries.
template <typename RT>
__global__ void __launch_bounds__(256, 2) ScreenWgmmaRefineKernel(const ForwardArgs a) {
  extern __shared__ __align__(16) uint8_t s_dyn[];
  uint8_t* s_q = s_dyn;
  uint32_t* s_ent = reinterpret_cast<uint32_t*>(s_dyn + kScreenWgmmaRows * kRefineRowStride);
  __shared__ unsigned long long s_best[kScreenWgmmaRows];
  __shared__ int32_t s_th[kScreenWgmmaRows];
  __shared__ uint32_t s_rowc[kScreenWgmmaRows];
  __shared__ float s_term[kScreenWgmmaRows];
  __shared__ uint32_t s_n, s_multi;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2;
  const uint32_t G = a.part.groups;
  const uint64_t task = blockIdx.x;
  const uint64_t p = task / G;
  const uint32_t grp = static_cast<uint32_t>(task - p * G);
  uint64_t qi, dj;
  a.pairs.Resolve(p, &qi, &dj);
  const uint64_t qb = a.q.Begin(qi), lq = a.q.End(qi) - qb;
  const uint32_t r0b = grp * kScreenWgmmaRows;
  if (grp > 0 && r0b >= lq) return;
  const uint64_t db = a.d.Begin(dj), ld = a.d.End(dj) - db;
  const uint32_t rows = static_cast<uint32_t>(std::min<uint64_t>(kScreenWgmmaRows, lq - r0b));
  const uint32_t cap = a.cand.cap;
  const uint32_t count = ld > 0 ? a.cand.count[task] : 0;
  const bool overflow = count > cap;
  for (uint32_t r = tid; r < kScreenWgmmaRows; r += blockDim.x) {
    s_best[r] = 0ull;
    s_rowc[r] = 0u;
    s_th[r] = r < rows && ld > 0 ? a.cand.threshold[task * kScreenWgmmaRows + r] : INT_MAX;
  }
  if (tid == 0) {
    s_n = 0;
    s_multi = 0;
  }
  // The group's query rows, once (16-byte pieces; dims past dim are never read).
  const uint32_t qrow_bytes = a.q.dim * 2;
  for (uint32_t e = tid; e < rows * (qrow_bytes / 16); e += blockDim.x) {
    const uint32_t r = e / (qrow_bytes / 16), pc = e - r * (qrow_bytes / 16);
    *reinterpret_cast<uint4*>(s_q + r * kRefineRowStride + pc * 16) =
        Ld16(a.q.orig + (qb + r0b + r) * a.q.row_bytes + pc * 16);
  }
  __syncthreads();
  // Expand the records whose largest dot reaches the row's final threshold (their other flagged columns come
  // along: a few extra refinements, no extra pass) into s_ent, up to 2 cap entries; more: refine every token.
  uint64_t n = 0;
  bool all_tokens = overflow;
  if (!overflow) {
    const uint4* list = a.cand.list + task * cap;
    for (uint32_t e = tid; e < count; e += blockDim.x) {
      const uint4 x = list[e];
      const uint32_t row = x.x >> 24, col0 = x.x & 0xffffffu;
      if (static_cast<int32_t>(x.z) >= s_th[row]) {
        const uint32_t k = static_cast<uint32_t>(__popc(x.y));
        const uint32_t pos = atomicAdd(&s_n, k);
        atomicAdd(&s_rowc[row], k);
        for (uint32_t f = x.y, i = 0; f != 0u; f &= f - 1u, ++i) {
          const uint32_t bit = static_cast<uint32_t>(__ffs(f) - 1);
          if (pos + i < 2 * cap) s_ent[pos + i] = (row << 24) | (col0 + 8 * (bit >> 1) + (bit & 1u));
        }
      }
    }
    __syncthreads();
    n = s_n;
    if (n > 2 * cap) all_tokens = true;
  }
  if (all_tokens) n = static_cast<uint64_t>(rows) * ld;  // every (row, token)
  const uint32_t dim = a.q.dim;
  // Rounds of 8 kRefineSub candidates per warp (on the H100's visual shape 2 sub-rounds beat 4).
  constexpr int kRefineSub = 2;
  for (uint64_t b = static_cast<uint64_t>(warp) * 8 * kRefineSub; b < n; b += 8 * kRefineSub * (blockDim.x / 32)) {
    const uint8_t* qr[kRefineSub];
    const uint8_t* dr[kRefineSub];
    uint32_t rr[kRefineSub], tk[kRefineSub];
    bool valid[kRefineSub];
#pragma unroll
    for (int sb = 0; sb < kRefineSub; ++sb) {
      const uint64_t e = b + 8 * sb + g;
      valid[sb] = e < n;
      if (!all_tokens) {
        const uint32_t key = valid[sb] ? s_ent[e] : 0u;
        rr[sb] = key >> 24;
        tk[sb] = key & 0xffffffu;
      } else {
        rr[sb] = valid[sb] ? static_cast<uint32_t>(e / ld) : 0u;
        tk[sb] = valid[sb] ? static_cast<uint32_t>(e - static_cast<uint64_t>(rr[sb]) * ld) : 0u;
      }
      qr[sb] = s_q + rr[sb] * kRefineRowStride;
      dr[sb] = a.d.orig + (db + tk[sb]) * a.d.row_bytes;
    }
    RefineRound16<RT, true, kRefineSub>(qr, dr, valid, dim,
                                        [&](int sb, float sim) { atomicMax(&s_best[rr[sb]], PackKey(sim, tk[sb])); });
  }
  __syncthreads();
  // Statistics: candidates refined, and query tokens with more than one.
  if (a.counters) {
    for (uint32_t r = tid; r < rows; r += blockDim.x) {
      if (all_tokens ? ld > 1 : s_rowc[r] > 1) atomicAdd(&s_multi, 1u);
    }
    __syncthreads();
    if (tid == 0) {
      atomicAdd(&a.counters[0], static_cast<unsigned long long>(n));
      atomicAdd(&a.counters[1], static_cast<unsigned long long>(s_multi));
    }
  }
  // As ExactWgmmaKernel's FinishPair for dot products without masks: term = the row's maximum (+0 for -0).
  for (uint32_t r = tid; r < rows; r += blockDim.x) {
    const unsigned long long k = s_best[r];
    const float v = k ? KeyValue(k) + 0.0f : -INFINITY;
    if (G == 1) {
      s_term[r] = v;
    } else {
      const uint64_t slot = (p * G + grp) * a.part.group_rows + r;
      a.part.term[slot] = v;
      a.part.arg[slot] = -1;
    }
  }
  if (G == 1) {
    __syncthreads();
    if (tid == 0) {
      const double sum = OrderedSum(s_term, rows);
      *a.pairs.ScorePtr(p, qi, dj) = ld > 0 ? RoundScore(sum) : -INFINITY;
    }
  }
}

}  // namespace

bool ScreenWgmmaSupported(const KernelSwitches& sw, const SetsView& q, int dtype_d, uint32_t code_bytes_d,
                          uint64_t max_ld) {
  if (!sw.screen_wgmma) return false;
  if (q.dtype != dtype_d || (q.dtype != kBF16 && q.dtype != kF16)) return false;
  if (q.dim <= 96 || q.dim > 128 || q.code_bytes != 128 || code_bytes_d != 128) return false;
  if (max_ld >= (1ull << 24)) return false;
  int dev = 0;
  return cudaGetDevice(&dev) == cudaSuccess && WgmmaAvailable(dev);
}

uint64_t DocScaleCodeBytes(uint64_t n_vectors, uint64_t n_sets) {
  return (n_vectors * kSwCodeBytes + 255) / 256 * 256 + n_sets * sizeof(float4);
}

cudaError_t LaunchDocScaleCodes(const SetsView& d, uint64_t n_vectors, uint8_t* out, const int8_t** codes,
                                const float4** info, cudaStream_t stream) {
  int8_t* c = reinterpret_cast<int8_t*>(out);
  float4* in = reinterpret_cast<float4*>(out + (n_vectors * kSwCodeBytes + 255) / 256 * 256);
  *codes = c;
  *info = in;
  if (d.n_sets == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(std::min<uint64_t>(d.n_sets, 8192));
  DocScaleCodesKernel<<<blocks, 256, 0, stream>>>(d, c, in);
  return cudaGetLastError();
}

uint32_t ScreenWgmmaCap(const KernelSwitches& sw) {
  return std::min<uint32_t>(64, std::max<uint32_t>(1, sw.screen_wgmma_cap)) * kScreenWgmmaRows;
}

cudaError_t LaunchScreenWgmma(const ForwardArgs& a, cudaStream_t stream) {
  const uint64_t tasks = a.pairs.n_pairs * a.part.groups;
  if (tasks == 0) return cudaSuccess;
  if (tasks > 0x7fffffffull || a.part.group_rows != kScreenWgmmaRows) return cudaErrorInvalidConfiguration;
  const ScreenBound bound = ScreenBoundFor(a.q, a.d);
  constexpr int S = kSwStages;
  const int smem = S * kSwStageBytes + 1024;  // + alignment slack for the 1024-byte swizzle period
  cudaError_t e = AllowDynamicSmemOnce<ScreenWgmmaKernel<S>>(smem);
  if (e != cudaSuccess) return e;
  uint64_t cpg = 0, blocks = 0;
  if (!PersistentGrid(a, 1, &cpg, &blocks)) return cudaErrorInvalidConfiguration;
  ScreenWgmmaKernel<S><<<static_cast<unsigned>(blocks), kSwThreads, smem, stream>>>(a, bound,
                                                                                    static_cast<uint32_t>(cpg));
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const int qsmem = static_cast<int>(kScreenWgmmaRows * kRefineRowStride);
  const int rsmem = qsmem + static_cast<int>(2 * a.cand.cap * sizeof(uint32_t));
  const int rsmem_max = qsmem + 2 * 64 * kScreenWgmmaRows * 4;  // ScreenWgmmaCap's largest
  if (a.q.dtype == kBF16) {
    e = AllowDynamicSmemOnce<ScreenWgmmaRefineKernel<__nv_bfloat16>>(rsmem_max);
    if (e != cudaSuccess) return e;
    ScreenWgmmaRefineKernel<__nv_bfloat16><<<static_cast<unsigned>(tasks), 256, rsmem, stream>>>(a);
  } else {
    e = AllowDynamicSmemOnce<ScreenWgmmaRefineKernel<__half>>(rsmem_max);
    if (e != cudaSuccess) return e;
    ScreenWgmmaRefineKernel<__half><<<static_cast<unsigned>(tasks), 256, rsmem, stream>>>(a);
  }
  return cudaGetLastError();
}

}  // namespace mscuda
