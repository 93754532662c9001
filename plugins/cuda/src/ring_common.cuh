// SPDX-License-Identifier: Apache-2.0
// The exact kernels' per-warp rings of 32-token steps (ExactTcPipeKernel in exact.cu, ExactTcCoopKernel in
// exact_coop.cu, ExactTcDealtKernel in exact_dealt.cu): how a step is copied, how a block stores a query in the
// ring's layout for ldmatrix, and how a 16x8 tile or a whole step of similarities folds into the running row maxima
// (FoldTile also serves ExactTcKernel and ExactTcSmemKernel).
#ifndef MAXSIM_PLUGINS_CUDA_RING_COMMON_CUH_
#define MAXSIM_PLUGINS_CUDA_RING_COMMON_CUH_

#include <math.h>

#include "forward_common.cuh"

namespace mscuda {

constexpr int kRingStep = 32;                               // tokens per step
constexpr int kRingStageBytes = kRingStep * kRingRowBytes;  // 8 KB

// A 16-byte cp.async of a whole ring step under an L2 evict-first policy (createpolicy; `policy`): the corpus is
// streamed once, so its lines are the first L2 replaces. Measured on the H100 against the same copies without the
// policy, in one run: textual-10k 0.2611 -> 0.2554 ms, textual-1k 0.0343 -> 0.0336, colpali-rerank 0.0953 ->
// 0.0947 (docs/cuda.md, "Memory-bound shapes"). The .L2::256B prefetch size added nothing.
__device__ __forceinline__ void CpAsync16EvictFirst(uint32_t smem, const void* gmem, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "l"(policy));
}

__device__ __forceinline__ uint64_t EvictFirstPolicy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// Copies tokens [token, token + 32) of a document of `len` rows (row 0 at `doc`, `drb` bytes apart) into ring stage
// `st`; every lane of the warp calls it. Copy i moves 16-byte slot lane % 16 of step token 2i + lane / 16: the same
// slot for every copy of a lane, the token advancing by 2 (so its swizzle, (2i + lane / 16) % 8, repeats every 4
// copies). Rows past `len` and dimensions past `dim` are zero-filled.
__device__ __forceinline__ void CopyRingStep(uint32_t st, const uint8_t* doc, uint64_t token, uint64_t len,
                                             uint64_t drb, uint32_t dim, uint64_t policy, int lane) {
  const uint32_t slot16 = static_cast<uint32_t>(lane) & 15u, half = static_cast<uint32_t>(lane) >> 4;
  const uint8_t* src = doc + (token + half) * drb + slot16 * 16;
  const uint32_t dst = st + half * kRingRowBytes;
  const uint64_t left = len - token;  // rows of the document from this step's first token
  if (left >= kRingStep && dim == 128) {
    // A whole step of whole rows: no predicates, no per-copy 64-bit multiplies.
#pragma unroll
    for (int i = 0; i < kRingStep / 2; ++i) {
      CpAsync16EvictFirst(dst + 2 * i * kRingRowBytes + (RingSlot16(slot16, 2 * i + half) << 4), src + 2 * i * drb,
                          policy);
    }
  } else {
    const bool slot_ok = slot16 * 8 < dim;
#pragma unroll
    for (int i = 0; i < kRingStep / 2; ++i) {
      const bool pred = slot_ok && 2 * i + half < left;
      CpAsync16(dst + 2 * i * kRingRowBytes + (RingSlot16(slot16, 2 * i + half) << 4), pred ? src + 2 * i * drb : doc,
                pred);
    }
  }
}

// The query rows of a pair (rows past lq and dimensions past dim as zeros) stored into `qbuf`, a ring stage, in the
// ring's layout by the NW warps of a block, with plain loads; the caller then waits at a block barrier. The grid's
// StageQuery (exact_coop.cu), where plain loads measured faster than CopyQueryRows below, and its copy-only twin
// (benchmarks/gpu/schedule_read.cu).
template <int MT, int NW>
__device__ __forceinline__ void StoreQueryRows(const ForwardArgs& a, uint64_t qb, uint64_t lq, uint32_t qbuf) {
  const uint8_t* qbase = a.q.orig + qb * a.q.row_bytes;
  for (int e = threadIdx.x; e < MT * 16 * 16; e += NW * 32) {
    const uint32_t row = static_cast<uint32_t>(e) >> 4, slot = static_cast<uint32_t>(e) & 15u;
    uint4 v = Zero4();
    if (row < lq && slot * 8 < a.q.dim) v = Ld16(qbase + row * a.q.row_bytes + slot * 16);
    const uint32_t dst = qbuf + row * kRingRowBytes + (RingSlot16(slot, row) << 4);
    asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
  }
}

// Whether every pair of a launch has query 0 (a matrix launch of one query). The host sizes the ring's shared memory
// by it, the kernel decides by it whether to copy the query once per block.
__host__ __device__ __forceinline__ bool OneQueryLaunch(const ForwardArgs& a) {
  return a.pairs.layout == kPairsMatrix && a.pairs.n_pairs > 0 && a.pairs.n_pairs == a.pairs.nd;
}

// Shared memory for one query's rows (at most 32) in the ring's layout.
constexpr int kRingQueryBytes = 32 * kRingRowBytes;

// The same rows, zero past lq and dim, copied into `qbuf` in the ring's layout with 16-byte cp.async by the NW
// warps of a block: the caller commits them as a group of their own, issued before its rings' first copies so that
// the query is not queued behind them, waits for that group and then at a block barrier. The ring kernel's
// one-query launches (ExactTcPipeKernel, exact.cu) and its copy-only twin (benchmarks/gpu/schedule_read.cu).
template <int MT, int NW>
__device__ __forceinline__ void CopyQueryRows(const ForwardArgs& a, uint64_t qb, uint64_t lq, uint32_t qbuf) {
  const uint8_t* qbase = a.q.orig + qb * a.q.row_bytes;
  for (int e = threadIdx.x; e < MT * 16 * 16; e += NW * 32) {
    const uint32_t row = static_cast<uint32_t>(e) >> 4, slot = static_cast<uint32_t>(e) & 15u;
    const bool pred = row < lq && slot * 8 < a.q.dim;
    CpAsync16(qbuf + row * kRingRowBytes + (RingSlot16(slot, row) << 4),
              pred ? qbase + row * a.q.row_bytes + slot * 16 : a.q.orig, pred);
  }
}

// A warp's A fragments (natural placement, LdFragNatural's words) of the MT x 16 query rows a block stored at
// `qbuf` in the ring's layout (StoreQueryRows or CopyQueryRows, after the block barrier): rows mt x 16 + g in qa,
// + 8 in qc.
template <int MT>
__device__ __forceinline__ void LdsmQueryFragments(uint32_t qbuf, int lane, uint4 (&qa)[MT][4], uint4 (&qc)[MT][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      qa[mt][c] = LdsmFrag16(qbuf, mt * 16, c, lane);
      qc[mt][c] = LdsmFrag16(qbuf, mt * 16 + 8, c, lane);
    }
  }
}

// Folds one 16x8 accumulator tile per m tile into the running max. n0 = first of this lane's two columns. PLAIN:
// the caller knows the launch is dot without a document mask (the same arithmetic, without those branches).
template <int MT, bool PLAIN = false, typename Acc>
__device__ __forceinline__ void FoldTile(const ForwardArgs& a, uint64_t db, uint64_t ld, uint64_t n0,
                                         Acc (&c)[MT][4], Best<MT>& b, bool& saw_kept) {
  const uint64_t n1 = n0 + 1;
  bool v0 = n0 < ld, v1 = n1 < ld;
  if (!PLAIN && a.d.mask) {
    v0 = v0 && a.d.mask[db + n0];
    v1 = v1 && a.d.mask[db + n1];
  }
  saw_kept |= v0 | v1;
  float w0 = 1.0f, w1 = 1.0f;
  if (!PLAIN && a.cosine) {
    w0 = v0 ? InvNorm(RowNorm(a.d, db + n0)) : 0.0f;
    w1 = v1 ? InvNorm(RowNorm(a.d, db + n1)) : 0.0f;
  }
  const bool check = a.bad != nullptr;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float k0 = c[mt][2 * h], k1 = c[mt][2 * h + 1];
      if (check) {
        if (v0) b.chk = MaxNaN(b.chk, fabsf(k0));
        if (v1) b.chk = MaxNaN(b.chk, fabsf(k1));
      }
      if (!PLAIN && a.cosine) {
        k0 *= w0;
        k1 *= w1;
      }
      if (v0 && k0 > b.v[mt][h]) {
        b.v[mt][h] = k0;
        b.i[mt][h] = static_cast<int>(n0);
      }
      if (v1 && k1 > b.v[mt][h]) {
        b.v[mt][h] = k1;
        b.i[mt][h] = static_cast<int>(n1);
      }
    }
  }
}

template <int MT>
__device__ __forceinline__ void InitBest(Best<MT>& best) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    best.v[mt][0] = best.v[mt][1] = -INFINITY;
    best.i[mt][0] = best.i[mt][1] = -1;
  }
}

// One 32-token step of a ring (ldmatrix B fragments from ring stage `st`, tokens base .. base + 31 of a document of
// ld tokens starting at row db) folded into `best`. FOLD: 0 any call (`fast`: dot without a document mask; and
// `want_arg`, chosen per launch), 1 dot without a document mask, scores only, 2 the same with argmax (the caller
// passes the matching constants).
//
// `fast` and a whole step of kept tokens: no per-column tests. With argmax, FoldTile's (value, index) fold (strict >,
// this lane's tokens in increasing order, 32-bit indices); scores only, the row maxima alone (the maximum's value is
// the same whichever of equal keys the strict fold would keep, and -0 or +0 adds the same to a score). The folded
// input check samples: a non-finite element of a row makes every similarity of that row non-finite (0 * inf is NaN),
// so two similarities per lane and tile meet every document row (query row g, columns 2t and 2t + 1), the
// document's first tile meets every query row, and an overflow to +inf elsewhere reaches the row maximum, which the
// caller checks when the pair ends. Otherwise FoldTile per 8 tokens.
template <typename T, int MT, int FOLD>
__device__ __forceinline__ void FoldRingStep(const ForwardArgs& a, uint32_t st, uint64_t base, uint64_t db,
                                             uint64_t ld, const uint4 (&qa)[MT][4], const uint4 (&qc)[MT][4],
                                             bool fast, bool want_arg, bool check, Best<MT>& best, bool& saw_kept) {
  const int lane = threadIdx.x & 31, t = lane & 3;
  auto tile = [&](int u, float (&acc)[MT][4]) {
    uint4 bv[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) bv[c] = LdsmFrag16(st, u * 8, c, lane);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.0f;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) MmaChunk16<T>(acc[mt], qa[mt][c], qc[mt][c], bv[c]);
    }
  };
  if (fast && base + kRingStep <= ld) {
#pragma unroll
    for (int u = 0; u < kRingStep / 8; ++u) {
      float acc[MT][4];
      tile(u, acc);
      if (want_arg) {
        const int n0 = static_cast<int>(base) + u * 8 + 2 * t;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if (acc[mt][2 * h] > best.v[mt][h]) {
              best.v[mt][h] = acc[mt][2 * h];
              best.i[mt][h] = n0;
            }
            if (acc[mt][2 * h + 1] > best.v[mt][h]) {
              best.v[mt][h] = acc[mt][2 * h + 1];
              best.i[mt][h] = n0 + 1;
            }
          }
        }
      } else {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          best.v[mt][0] = fmaxf(best.v[mt][0], fmaxf(acc[mt][0], acc[mt][1]));
          best.v[mt][1] = fmaxf(best.v[mt][1], fmaxf(acc[mt][2], acc[mt][3]));
        }
      }
      if (check) {
        best.chk = MaxNaN(best.chk, MaxNaN(fabsf(acc[0][0]), fabsf(acc[0][1])));
        if (u == 0 && base == 0) {
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) best.chk = MaxNaN(best.chk, fabsf(acc[mt][e]));
          }
        }
      }
    }
    saw_kept = true;
  } else {
#pragma unroll
    for (int u = 0; u < kRingStep / 8; ++u) {
      if (base + u * 8 < ld) {
        float acc[MT][4];
        tile(u, acc);
        FoldTile<MT, FOLD != 0>(a, db, ld, base + u * 8 + 2 * t, acc, best, saw_kept);
      }
    }
  }
}

// The end of a pair of the fast path: the row maxima join the folded input check (an overflow to +inf).
template <int MT>
__device__ __forceinline__ void CheckRowMaxima(bool fast, bool check, bool saw_kept, Best<MT>& best) {
  if (fast && check && saw_kept) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) best.chk = MaxNaN(best.chk, MaxNaN(fabsf(best.v[mt][0]), fabsf(best.v[mt][1])));
  }
}

// The end of a document scored by several warps of a block, each over its own tokens in increasing order. Each warp
// quad-merges its row maxima and leaves them in its row of the block's shared arrays (StageWarpRows); after a block
// barrier one warp merges them over the NW warps (MergeWarpRows): the larger value, of equal ones the lower token
// index, which is what one warp's strict > fold over all the tokens in increasing order keeps, so the bits are the
// ring's. Every lane of a quad takes its rows' merge, so WriteRows<MT, true> needs no quad merge of its own.
// StageWarpRows' ARG false (scores only: the caller writes no argmax) stages the values alone, which MergeWriteScore
// then merges by the larger: the maximum's value is the same whichever of equal keys the merge by index would keep.
template <int MT, bool ARG = true>
__device__ __forceinline__ void StageWarpRows(Best<MT>& best, float* s_v, int* s_i) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  if constexpr (ARG) {
    QuadMergeBest(best);
  } else {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) best.v[mt][h] = QuadMax(best.v[mt][h]);
    }
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (t == 0) {
        s_v[mt * 16 + g + 8 * h] = best.v[mt][h];
        if constexpr (ARG) s_i[mt * 16 + g + 8 * h] = best.i[mt][h];
      }
    }
  }
}

template <int MT, int NW>
__device__ __forceinline__ void MergeWarpRows(const float (*s_v)[MT * 16], const int (*s_i)[MT * 16], Best<MT>& m) {
  const int g = (threadIdx.x & 31) >> 2;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = mt * 16 + g + 8 * h;
      float v = s_v[0][r];
      int i = s_i[0][r];
#pragma unroll
      for (int w = 1; w < NW; ++w) {
        const float ov = s_v[w][r];
        const int oi = s_i[w][r];
        if (ov > v || (ov == v && static_cast<unsigned>(oi) < static_cast<unsigned>(i))) {  // MergeBest's order
          v = ov;
          i = oi;
        }
      }
      m.v[mt][h] = v;
      m.i[mt][h] = i;
    }
  }
}

// The end of a pair of a scores-only launch (FOLD 1) scored by NW warps, by one warp after the block's barrier: lane r
// takes query row r's maximum over the NW warps' staged values (StageWarpRows<MT, false>: fmaxf in warp order) and
// its term (0 past lq and for a masked query row), the warp sums the terms (WarpOrderedSum: OrderedSum's bits) and
// lane 0 writes pair p's score (query qi, document dj, RoundScore): the bits of MergeWarpRows and WriteRows<MT, true>,
// which argmax launches keep, with one row per lane where WriteRows has a quad's leader take four through its
// general branches (cosine, partials, argmax), which is what the dealt kernel's and the grid's short documents pay
// for (benchmarks/results/gpu-dealt-h100.md, fourth study; gpu-grid-end-h100.md). The caller's launch is dot, one
// group (part.groups == 1, lq <= MT x 16). Every lane of the warp calls it.
template <int MT, int NW>
__device__ __forceinline__ void MergeWriteScore(const ForwardArgs& a, uint64_t p, uint64_t qi, uint64_t dj,
                                                uint64_t qb, uint64_t lq, bool doc_nonempty,
                                                const float (*s_v)[MT * 16]) {
  const int lane = threadIdx.x & 31;
  float term = 0.0f;
  if (lane < MT * 16) {
    float v = s_v[0][lane];
#pragma unroll
    for (int w = 1; w < NW; ++w) v = fmaxf(v, s_v[w][lane]);
    if (static_cast<uint64_t>(lane) < lq && a.q.Kept(qb + static_cast<uint64_t>(lane))) term = v;
  }
  const double sum = WarpOrderedSum(term, static_cast<uint32_t>(lq));
  if (lane == 0) *a.pairs.ScorePtr(p, qi, dj) = doc_nonempty ? RoundScore(sum) : -INFINITY;
}

}  // namespace mscuda

#endif  // MAXSIM_PLUGINS_CUDA_RING_COMMON_CUH_
