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

// Ends the folded input check of one lane: flags the call when its check value is not finite.
__device__ __forceinline__ void ReportCheck(const ForwardArgs& a, float chk) {
  if (a.bad != nullptr && NotFinite(chk)) *a.bad = 1u;
}

// After the quad merge, lane t == 0 of group g holds rows mt*16 + g (+8). Writes the warp's rows: directly into
// scores/argmax when one group covers the query (G == 1), else into the partials.
template <int MT>
__device__ __forceinline__ void WriteRows(const ForwardArgs& a, uint64_t p, uint64_t qi, uint64_t dj,
                                          uint32_t grp, uint64_t qb, uint64_t lq, bool doc_nonempty,
                                          Best<MT>& b, float* s_term, int* s_arg) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const uint32_t r0 = grp * MT * 16;
  ReportCheck(a, b.chk);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      MergeBest(b.v[mt][h], b.i[mt][h], 1);
      MergeBest(b.v[mt][h], b.i[mt][h], 2);
    }
  }
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

// A position in the stream of a launch's work: token `token` of pair `pair` (lexicographic order).
struct PiecePos {
  uint64_t pair = 0, token = 0;
  __device__ bool operator<(const PiecePos& o) const { return pair < o.pair || (pair == o.pair && token < o.token); }
};

// Warp `wid` of `n_warps` owns the positions [begin, end), one of two ways:
//  * whole pairs: an even split of the pairs (begin.token = end.token = 0);
//  * split pairs (ExactTcPipeKernel with RingMergeSlots): warp w starts at w * n_pairs / n_warps pairs, the
//    fraction carried into the pair as a token offset rounded up to a multiple of Step (rounded up to the next pair
//    when it reaches the document's end), so every warp gets the same share of a launch of equal documents
//    and no warp runs a pair longer than the others. Warp w starts at or before token 0 of pair p exactly when
//    w * n_pairs <= p * n_warps, so the warp holding token 0 of a non-empty pair is p * n_warps / n_pairs
//    (SplitOwner).
struct PairRange {
  PiecePos begin, end;
  PairRange() = default;
  __device__ PairRange(uint64_t n_pairs, uint64_t wid, uint64_t n_warps)
      : begin{wid * n_pairs / n_warps, 0}, end{(wid + 1) * n_pairs / n_warps, 0} {}
  template <int Step>
  __device__ static PairRange Split(const ForwardArgs& a, uint64_t wid, uint64_t n_warps) {
    PairRange r;
    r.begin = SplitStart<Step>(a, wid, n_warps);
    r.end = SplitStart<Step>(a, wid + 1, n_warps);
    return r;
  }
  __device__ bool Empty() const { return !(begin < end); }

 private:
  template <int Step>
  __device__ static PiecePos SplitStart(const ForwardArgs& a, uint64_t w, uint64_t n_warps) {
    const uint64_t n = a.pairs.n_pairs;
    if (w >= n_warps) return {n, 0};
    const uint64_t x = w * n, p = x / n_warps, rem = x - p * n_warps;
    if (rem == 0 || p >= n) return {p, 0};
    uint64_t qi, dj;
    a.pairs.Resolve(p, &qi, &dj);
    const uint64_t ld = a.d.End(dj) - a.d.Begin(dj);
    const uint64_t o = (rem * ld + n_warps - 1) / n_warps;  // ceil(rem / n_warps * ld)
    const uint64_t step_o = (o + Step - 1) / Step * Step;
    return step_o >= ld ? PiecePos{p + 1, 0} : PiecePos{p, step_o};
  }
};

// The warp of a split launch that holds token 0 of non-empty pair p (PairRange::Split).
__device__ __forceinline__ uint64_t SplitOwner(uint64_t p, uint64_t n_pairs, uint64_t n_warps) {
  return p * n_warps / n_pairs;
}

// The producer side of such a ring: the next step of `Step` tokens to copy is tokens [token, token + Step) of
// pair `pair`'s document (rows [first_row, first_row + len) of the document sets); pairs with nothing to copy
// in the range are skipped, so the copies run on across document boundaries. Done at the range's end.
template <int Step>
struct StepCursor {
  uint64_t pair, token, len = 0, first_row = 0;
  PiecePos stop;
  __device__ StepCursor(const ForwardArgs& a, const PairRange& r) : pair(r.begin.pair), token(r.begin.token), stop(r.end) {
    Load(a);
  }
  __device__ bool Active() const { return PiecePos{pair, token} < stop; }
  // The end of this pair's tokens in the range.
  __device__ uint64_t Limit() const { return pair == stop.pair ? stop.token : len; }
  __device__ void Load(const ForwardArgs& a) {
    for (; Active(); ++pair, token = 0) {
      uint64_t qi, dj;
      a.pairs.Resolve(pair, &qi, &dj);
      first_row = a.d.Begin(dj);
      len = a.d.End(dj) - first_row;
      if (token < Limit()) return;
    }
  }
  __device__ void Advance(const ForwardArgs& a) {
    token += Step;
    if (token >= Limit()) {
      token = 0;
      ++pair;
      Load(a);
    }
  }
};

// Ends a piece [tb, te) of pair p that a split launch cut between warps (the consumer side of PairRange::Split):
// the piece's per-row bests go into the pair's RingMergeSlot as (value, index) keys by atomicMax (higher value,
// then lower index: the order the whole-pair fold keeps, so the merged best is the one a single warp would find;
// -0 and +0 tie, which changes no score); `tokens` counts the tokens merged so far, and the piece that completes
// the document takes the keys (resetting the slot to zero for the next launch) and writes the pair's score and
// argmax as WriteRows does for a whole pair.
template <int MT>
__device__ __forceinline__ void MergePiece(const ForwardArgs& a, RingMergeSlot* slot, uint64_t p, uint64_t qi,
                                           uint64_t dj, uint64_t qb, uint64_t lq, uint64_t ld, uint64_t piece_tokens,
                                           bool saw_kept, Best<MT>& b, float* s_term, int* s_arg) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  ReportCheck(a, b.chk);
  b.chk = 0.0f;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      MergeBest(b.v[mt][h], b.i[mt][h], 1);
      MergeBest(b.v[mt][h], b.i[mt][h], 2);
      // A row with a best (an index, or a value only where the kernel folds values alone).
      if (t == 0 && (b.i[mt][h] >= 0 || b.v[mt][h] > -INFINITY)) {
        const uint32_t idx = b.i[mt][h] >= 0 ? static_cast<uint32_t>(b.i[mt][h]) : 0u;
        atomicMax(&slot->key[mt * 16 + g + 8 * h], PackKey(b.v[mt][h], idx));
      }
    }
  }
  if (a.d.mask && __any_sync(kFull, saw_kept) && lane == 0) atomicOr(&slot->kept, 1u);
  __threadfence();
  __syncwarp();
  unsigned long long merged = 0;
  if (lane == 0) merged = atomicAdd(&slot->tokens, static_cast<unsigned long long>(piece_tokens)) + piece_tokens;
  merged = __shfl_sync(kFull, merged, 0);
  if (merged != ld) return;
  __threadfence();
  // Lanes t == 0 take the merged keys; lanes 1-3 of the quad still hold this piece's best, which WriteRows' quad
  // merge combines with them (the merged key is at least as good).
  if (t == 0) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const unsigned long long k = atomicExch(&slot->key[mt * 16 + g + 8 * h], 0ull);
        b.v[mt][h] = k ? KeyValue(k) : -INFINITY;
        b.i[mt][h] = k ? static_cast<int>(KeyIndex(k)) : -1;
      }
    }
  }
  unsigned int kept = 0;
  if (lane == 0) {
    kept = a.d.mask ? atomicExch(&slot->kept, 0u) : 1u;
    atomicExch(&slot->tokens, 0ull);
  }
  const bool doc_nonempty = a.d.mask ? __shfl_sync(kFull, kept, 0) != 0 : ld > 0;
  WriteRows<MT>(a, p, qi, dj, 0, qb, lq, doc_nonempty, b, s_term, s_arg);
}

}  // namespace mscuda

#endif  // MAXSIM_PLUGINS_CUDA_FORWARD_COMMON_CUH_
