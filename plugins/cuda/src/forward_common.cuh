// SPDX-License-Identifier: Apache-2.0
// Per-row results of the forward kernels: the running best and how a warp writes its rows.
#ifndef MAXSIM_PLUGINS_CUDA_FORWARD_COMMON_CUH_
#define MAXSIM_PLUGINS_CUDA_FORWARD_COMMON_CUH_

#include <math.h>

#include "device_common.cuh"

namespace mscuda {

// Exact similarities of up to 8 NSUB candidates (query row, document row), 8 per sub-round sb < NSUB: lane
// (g, t) loads candidate 8 sb + g's two rows (LdFrag16, quad-contiguous placement) and one m16n8 tile per
// sub-round takes the candidates' query rows as A rows g (rows g + 8 zero) and their document rows as B columns
// g, so the diagonal (g, g) is candidate 8 sb + g's similarity, computed with exactly the exact kernels'
// arithmetic (the same mma.sync chain over the same k steps). emit(sb, sim) runs on the lane that holds it
// (t == g / 2), for valid candidates only. Every global load of the round is issued before the first mma, so a
// round costs one memory latency. 16-bit rows, dim <= 128. kQueryShared: the query rows are in shared memory
// (plain loads, issued just before their mma instead of with the global loads: fewer live registers).
template <typename RT, bool kQueryShared = false, int NSUB = 2, typename Emit>
__device__ __forceinline__ void RefineRound16(const uint8_t* const (&qr)[NSUB], const uint8_t* const (&dr)[NSUB],
                                              const bool (&valid)[NSUB], uint32_t dim, Emit&& emit) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const uint32_t nchunks = (dim + 31) / 32;
  auto q_frag = [&](int sb, int c) -> uint4 {
    const bool ok = valid[sb] && c < static_cast<int>(nchunks);
    if constexpr (kQueryShared) {
      const uint32_t lo = 32 * c + 4 * t, hi = lo + 16;
      const uint2 x = ok && lo < dim ? *reinterpret_cast<const uint2*>(qr[sb] + 2 * lo) : make_uint2(0u, 0u);
      const uint2 z = ok && hi < dim ? *reinterpret_cast<const uint2*>(qr[sb] + 2 * hi) : make_uint2(0u, 0u);
      return make_uint4(x.x, x.y, z.x, z.y);
    } else {
      return LdFrag16(qr[sb], c, t, dim, ok);
    }
  };
  uint4 qa[kQueryShared ? 1 : NSUB][4], bv[NSUB][4];
#pragma unroll
  for (int sb = 0; sb < NSUB; ++sb) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const bool ok = valid[sb] && c < static_cast<int>(nchunks);
      if constexpr (!kQueryShared) qa[sb][c] = q_frag(sb, c);
      bv[sb][c] = LdFrag16(dr[sb], c, t, dim, ok);
    }
  }
#pragma unroll
  for (int sb = 0; sb < NSUB; ++sb) {
    float c4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      if (c < static_cast<int>(nchunks)) {
        const uint4 a = kQueryShared ? q_frag(sb, c) : qa[kQueryShared ? 0 : sb][c];
        MmaChunk16<RT>(c4, a, Zero4(), bv[sb][c]);
      }
    }
    if (valid[sb] && t == (g >> 1)) emit(sb, (g & 1) ? c4[1] : c4[0]);
  }
}

template <int MT>
struct Best {
  float v[MT][2];
  int i[MT][2];
  float chk = 0.0f;  // the folded input check (ForwardArgs::bad): MaxNaN of |kept similarity|
};

// The quad merge: every lane of a quad (lanes 4g .. 4g + 3, which fold the same rows over different columns) takes
// its rows' best over the quad (MergeBest).
template <int MT>
__device__ __forceinline__ void QuadMergeBest(Best<MT>& b) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      MergeBest(b.v[mt][h], b.i[mt][h], 1);
      MergeBest(b.v[mt][h], b.i[mt][h], 2);
    }
  }
}

// Ends the folded input check of one lane: flags the call when its check value is not finite.
__device__ __forceinline__ void ReportCheck(const ForwardArgs& a, float chk) {
  if (a.bad != nullptr && NotFinite(chk)) *a.bad = 1u;
}

// After the quad merge, lane t == 0 of group g holds rows mt*16 + g (+8). Writes the warp's rows: directly into
// scores/argmax when one group covers the query (G == 1), else into the partials. MERGED: the caller has already
// given every lane of a quad its rows' merged maxima (the grid's MergeAndWrite), so the quad merge is skipped.
template <int MT, bool MERGED = false>
__device__ __forceinline__ void WriteRows(const ForwardArgs& a, uint64_t p, uint64_t qi, uint64_t dj,
                                          uint32_t grp, uint64_t qb, uint64_t lq, bool doc_nonempty,
                                          Best<MT>& b, float* s_term, int* s_arg) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const uint32_t r0 = grp * MT * 16;
  ReportCheck(a, b.chk);
  if constexpr (!MERGED) QuadMergeBest(b);
  if (t == 0) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t rl = mt * 16 + g + 8 * h;
        const uint64_t r = r0 + rl;
        float term = 0.0f;
        int arg = -1;
        if (r < lq && a.q.Kept(qb + r)) {
          term = a.cosine ? b.v[mt][h] * InvNorm(RowNorm(a.q, qb + r)) : b.v[mt][h];
          arg = b.i[mt][h];
        }
        if (a.part.groups == 1) {
          s_term[rl] = term;
          s_arg[rl] = arg;
        } else if (r < lq) {
          const uint64_t slot = (p * a.part.groups + grp) * a.part.group_rows + rl;
          a.part.term[slot] = term;
          a.part.arg[slot] = arg;
        }
      }
    }
  }
  if (a.part.groups != 1) return;
  __syncwarp();
  const uint64_t o_i = qb - a.q.Begin(0);
  if (lane == 0) {
    const double sum = OrderedSum(s_term, lq);
    *a.pairs.ScorePtr(p, qi, dj) = doc_nonempty ? RoundScore(sum) : -INFINITY;
  }
  int32_t* am = a.pairs.ArgmaxPtr(p, qi, dj, o_i, lq);
  if (am) {
    for (uint64_t r = lane; r < lq; r += 32) am[r] = doc_nonempty ? s_arg[r] : -1;
  }
}

// ---- per-warp rings over a contiguous range of pairs (ExactTcPipeKernel, ScreenPipeKernel) -------------------

// Warp `wid` of `n_warps` owns pairs [begin, end) of an even split.
struct PairRange {
  uint64_t begin = 0, end = 0;
  __device__ PairRange(uint64_t n_pairs, uint64_t wid, uint64_t n_warps)
      : begin(wid * n_pairs / n_warps), end((wid + 1) * n_pairs / n_warps) {}
};

// The producer side of such a ring: the next step of `Step` tokens to copy is tokens [token, token + Step) of
// pair `pair`'s document (rows [first_row, first_row + len) of the document sets); empty documents are skipped,
// so the copies run on across document boundaries. Done when pair == end.
template <int Step>
struct StepCursor {
  uint64_t pair, end, token = 0, len = 0, first_row = 0;
  __device__ StepCursor(const ForwardArgs& a, const PairRange& r) : pair(r.begin), end(r.end) { SkipEmpty(a); }
  __device__ bool Active() const { return pair < end; }
  __device__ void SkipEmpty(const ForwardArgs& a) {
    for (; pair < end; ++pair) {
      uint64_t qi, dj;
      a.pairs.Resolve(pair, &qi, &dj);
      first_row = a.d.Begin(dj);
      len = a.d.End(dj) - first_row;
      if (len > 0) return;
    }
  }
  __device__ void Advance(const ForwardArgs& a) {
    token += Step;
    if (token >= len) {
      token = 0;
      ++pair;
      SkipEmpty(a);
    }
  }
};

}  // namespace mscuda

#endif  // MAXSIM_PLUGINS_CUDA_FORWARD_COMMON_CUH_
