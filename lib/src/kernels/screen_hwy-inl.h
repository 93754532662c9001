// SPDX-License-Identifier: Apache-2.0
// Certified / approximate screening after the i8 phase, written once with Highway and compiled (through
// exact_hwy.cc, which includes this file per target) for every target it builds: AVX2 (W = 8 lanes), AVX3
// (W = 16), NEON (W = 4). The ISA-specific i8 phase (x86/screen_*.cc, arm/screen_*.cc) is called through
// ScreenCall::keys once per block of one or two query groups; everything else is here and is vectorised across
// the W query tokens of a group (lanes), the layout the i8 phase leaves its keys in.
//
// Per document and query group (ScreenDoc):
//   1. threshold (per lane, f32 vectors): tk = top - 2.5 mb - 2^-14 (|top| + 3 mb) with mb >= every margin's
//      |A|-free part (from per-document maxima of the norms, coefficients rounded up). A row whose key is < tk
//      in a lane is provably neither a candidate there nor the row that fixes max_k fl(A_k - m_k) (derivation at
//      Threshold). APPROXIMATE: tk = top (only the first row of maximal key matters).
//   2. scan: one vector compare per row; rows below tk in every lane are dropped (branch-free list).
//   3. exact test on the survivors, vectorised over lanes with the portable kernel's f32 expressions
//      (screening.h): m, lower = max fl(A - m), up = fl(A + m), the first row of maximal A per lane, then the
//      candidate lanes !(up < lower) of every survivor. Lanes where a survivor row is below tk get the same
//      exact test; it can only say "not a candidate", so the candidate sets are the portable kernel's exactly
//      (multi_candidate agrees across kernels; tests check it).
//   4. the candidate rows are kept with their lane masks and up vectors, and their originals prefetched.
//   5. top-k (ScreenPrune): per token the bound max_j up_j (APPROXIMATE: up of the top row), summed as the
//      engine sums scores; a document whose bound is below the current k-th score is never refined.
// Refinement (RefineDoc) runs one document behind the screening, so the originals of a document's candidate
// rows arrive from DRAM while the next document's i8 phase runs:
//   round 1: every lane's top row, folded into every lane for which it is a candidate (any candidate row folded
//            in is legitimate); this gives each lane an exact key best1 >= E(top row).
//   round 2 (CERTIFIED): the other candidate rows of the lanes where their bound fl(A + m) still reaches best1
//            (E <= fl(A + m) < best1 cannot win, ties included), folded in row order and merged with round 1 by
//            (key, lowest row): the result is the exact path's max and first argmax.
// Two refinement tiles, both computing the canonical chain (k sequential from +0, the exact path's arithmetic,
// so certified == exact bit for bit): RefineTile, one document row against a whole group's query vector (lanes
// = query tokens; 8 (group, row) items from at most two groups per tile), for rows folded into many lanes; and
// (AVX2/AVX3) the pair-per-lane PairTile, one (query lane, row) pair per vector lane, for the usual rows that
// serve one to three lanes (RefineRound splits a round's items between them by lane count).
//
// Included by exact_hwy.cc once per Highway target (per-target include guard below).
#if defined(MAXSIM_SRC_KERNELS_SCREEN_HWY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MAXSIM_SRC_KERNELS_SCREEN_HWY_INL_H_
#undef MAXSIM_SRC_KERNELS_SCREEN_HWY_INL_H_
#else
#define MAXSIM_SRC_KERNELS_SCREEN_HWY_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "hwy/highway.h"
#include "kernels/chain_fma-inl.h"  // ChainMulAdd: the canonical chain's step on this target
#include "kernels/screening.h"
#include "kernels/pipeline.h"

HWY_BEFORE_NAMESPACE();
namespace maxsim {
namespace HWY_NAMESPACE {
namespace screen {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using VF = hn::Vec<DF>;
using VI = hn::Vec<DI>;
using MF = hn::Mask<DF>;

constexpr size_t kSlots = 8;  // items per refinement tile
constexpr float kInf = std::numeric_limits<float>::infinity();

// One refinement item: a document row (f32, `dim` values) against one group's query vector, folded into the
// lanes whose bit is set in `mask`.
struct Item {
  const float* ptr;
  uint32_t idx;
  uint32_t mask;
};

HWY_INLINE uint32_t Bits(MF m) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  return static_cast<uint32_t>(m.raw);  // the k-register itself (StoreMaskBits goes through bytes)
#else
  const DF df;
  uint8_t b[8] = {};
  hn::StoreMaskBits(df, m, b);
  return static_cast<uint32_t>(b[0]) | (static_cast<uint32_t>(b[1]) << 8);
#endif
}

HWY_INLINE MF FromBits(const uint32_t& bits) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  return MF{static_cast<__mmask16>(bits)};
#else
  const DF df;
  return hn::LoadMaskBits(df, reinterpret_cast<const uint8_t*>(&bits));
#endif
}

// K0 items of the first group, then kSlots - K0 of the second. best/arg hold both groups (2 W lanes).
template <size_t K0, bool kCos>
HWY_NOINLINE void RefineTile(const float* HWY_RESTRICT q0, const float* HWY_RESTRICT q1, size_t qstride,
                             uint32_t dim, const Item* it, const float* inv, float* HWY_RESTRICT best,
                             int32_t* HWY_RESTRICT arg) {
  const DF df;
  const DI di;
  const size_t N = hn::Lanes(df);
  const float* p[kSlots];
  VF acc[kSlots];
  for (size_t r = 0; r < kSlots; ++r) {
    p[r] = it[r].ptr;
    acc[r] = hn::Zero(df);
  }
  for (uint32_t k = 0; k < dim; ++k) {
    const VF a = K0 > 0 ? hn::LoadU(df, q0 + static_cast<size_t>(k) * qstride) : hn::Zero(df);
    const VF b = K0 < kSlots ? hn::LoadU(df, q1 + static_cast<size_t>(k) * qstride) : hn::Zero(df);
    for (size_t r = 0; r < kSlots; ++r) acc[r] = ChainMulAdd(r < K0 ? a : b, hn::Set(df, p[r][k]), acc[r]);
  }
  VF bv[2] = {hn::LoadU(df, best), hn::LoadU(df, best + N)};
  VI av[2] = {hn::LoadU(di, arg), hn::LoadU(di, arg + N)};
  for (size_t r = 0; r < kSlots; ++r) {
    const size_t g = r < K0 ? 0 : 1;
    VF key = acc[r];
    if (kCos) key = hn::Mul(key, hn::Set(df, inv[it[r].idx]));
    const MF gt = hn::And(hn::Gt(key, bv[g]), FromBits(it[r].mask));
    bv[g] = hn::IfThenElse(gt, key, bv[g]);
    av[g] = hn::IfThenElse(hn::RebindMask(di, gt), hn::Set(di, static_cast<int32_t>(it[r].idx)), av[g]);
  }
  hn::StoreU(bv[0], df, best);
  hn::StoreU(bv[1], df, best + N);
  hn::StoreU(av[0], di, arg);
  hn::StoreU(av[1], di, arg + N);
}

template <bool kCos>
void RefineLists(const float* q0, const float* q1, size_t qstride, uint32_t dim, const Item* l0, size_t n0,
                 const Item* l1, size_t n1, const float* inv, float* best, int32_t* arg) {
  size_t i0 = 0, i1 = 0;
  Item t[kSlots];
  while (i0 < n0 || i1 < n1) {
    const size_t k0 = std::min(n0 - i0, kSlots);
    for (size_t r = 0; r < k0; ++r) t[r] = l0[i0 + r];
    const size_t k1 = std::min(n1 - i1, kSlots - k0);
    for (size_t r = 0; r < k1; ++r) t[k0 + r] = l1[i1 + r];
    for (size_t r = k0 + k1; r < kSlots; ++r) t[r] = Item{t[0].ptr, t[0].idx, 0u};  // padding: folds nothing
    switch (k0) {
      case 0: RefineTile<0, kCos>(q0, q1, qstride, dim, t, inv, best, arg); break;
      case 1: RefineTile<1, kCos>(q0, q1, qstride, dim, t, inv, best, arg); break;
      case 2: RefineTile<2, kCos>(q0, q1, qstride, dim, t, inv, best, arg); break;
      case 3: RefineTile<3, kCos>(q0, q1, qstride, dim, t, inv, best, arg); break;
      case 4: RefineTile<4, kCos>(q0, q1, qstride, dim, t, inv, best, arg); break;
      case 5: RefineTile<5, kCos>(q0, q1, qstride, dim, t, inv, best, arg); break;
      case 6: RefineTile<6, kCos>(q0, q1, qstride, dim, t, inv, best, arg); break;
      case 7: RefineTile<7, kCos>(q0, q1, qstride, dim, t, inv, best, arg); break;
      default: RefineTile<8, kCos>(q0, q1, qstride, dim, t, inv, best, arg); break;
    }
    i0 += k0;
    i1 += k1;
  }
}

// ---- Pair-per-lane refinement tile (AVX2, AVX3) ----
// A row-masked item computes all W lanes but serves ~1.3 of them on average (1.6-1.7 refined pairs per query
// token, ~44 items of W lanes per Lq=32 document). Here every vector lane holds one (query lane, document row)
// pair: acc_l = fma(q_{t_l}[k], d_{r_l}[k], acc_l), k = 0..dim-1 in order from +0, i.e. the same canonical
// chain per pair. Per W k's a tile transposes the W rows of each pair vector (AVX3: 16 x 16 in 64 shuffles,
// AVX2: 8 x 8 in 24) and picks each lane's query value from the group pair's transposed query at k with one
// two-table permute (AVX3 vpermt2ps; AVX2 two vpermps and a blend). About 5 shuffles per W pairs and k instead
// of W/1.3 FMA lanes per pair, so the tile is shuffle-bound (ports 1/2 on Zen 5, port 5 on SPR).
// The fold is scalar and order-free: a key replaces (best, arg) when it is greater, or equal with a lower row.
// With (best, arg) starting at (-inf, -1), NaN keys never folded and -inf keys never taken, that is the
// row-ordered strict-> fold of RefineTile (max key, first row of it), so pairs may be folded in any order and
// on top of RefineTile's results.
#undef MAXSIM_SCREEN_PAIR_TILE  // per target
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2
#define MAXSIM_SCREEN_PAIR_TILE 1

struct Pair {
  const float* ptr;  // the row's f32 values
  int32_t row;
  uint32_t lane;  // 0 .. 2W-1 within the group pair (W.. = second group)
};

#include "kernels/x86/pair_tile-inl.h"  // RawF, kPW and the x86 transposes

constexpr size_t kPfLines = 3;  // lines per row prefetched ahead of the transposes
// Pair vectors per tile. The tile is not latency-bound (4 to 8 vectors measured the same, Zen 5, AVX2 and
// AVX3); 4 keeps padding low for the short lists of Lq = 32 (~50 pairs per document).
constexpr size_t kPairVecs = 4;

// NV pair vectors (NV * kPW pairs, the unused ones pointing at pair 0) against the group pair's query: the
// canonical chain per pair into keys[v * kPW + l].
template <size_t NV>
HWY_NOINLINE void PairTile(const float* HWY_RESTRICT q0, const float* HWY_RESTRICT q1, size_t qstride,
                           uint32_t dim, const Pair* pr, size_t np, float* HWY_RESTRICT keys) {
  const float* p[NV][kPW];
  alignas(64) uint32_t lanes[NV][kPW];
  LaneSel sel[NV];
  RawF acc[NV];
  for (size_t v = 0; v < NV; ++v) {
    for (size_t l = 0; l < kPW; ++l) {
      const size_t j = v * kPW + l;
      p[v][l] = j < np ? pr[j].ptr : pr[0].ptr;
      lanes[v][l] = j < np ? pr[j].lane : pr[0].lane;
    }
    sel[v] = MakeSel(lanes[v]);
    acc[v] = ZeroF();
  }
  // The rows come from L2 or further (prefetched during the i8 phase, or not at all) and each block of k reads
  // one line of every row: without prefetching a few blocks ahead, every block waits for its lines.
  constexpr size_t kAhead = 64 / sizeof(float);  // floats per line
  for (size_t v = 0; v < NV; ++v) {
    for (size_t l = 0; l < kPW; ++l) {
      for (size_t a = 0; a < kPfLines; ++a) __builtin_prefetch(p[v][l] + a * kAhead, 0, 3);
    }
  }
  // Per block of kPW k's: transpose every pair vector's rows into T (stores), then the FMAs with the pair
  // vectors innermost, so the NV chains interleave and each query row is loaded once per k.
  alignas(64) float T[NV][kPW][kPW];
  for (size_t k0 = 0; k0 < dim; k0 += kPW) {
    const size_t nk = std::min<size_t>(kPW, dim - k0);
    const auto m = TailMask(nk);
#pragma GCC unroll 4
    for (size_t v = 0; v < NV; ++v) {
      RawF col[kPW];
      for (size_t l = 0; l < kPW; ++l) __builtin_prefetch(p[v][l] + k0 + kPfLines * kAhead, 0, 3);
      // the last dim % kPW values: masked row loads (never past the row), FMAs only for k < dim
      if (nk == kPW) {
        TransposeRowsFull(p[v], k0, col);
      } else {
        TransposeRows(p[v], k0, &m, col);
      }
      for (size_t b = 0; b < kPW; ++b) StoreF(col[b], T[v][b]);
    }
    for (size_t b = 0; b < nk; ++b) {
      const size_t off = (k0 + b) * qstride;
#pragma GCC unroll 4
      for (size_t v = 0; v < NV; ++v) acc[v] = Fma(QueryAt(q0 + off, q1 + off, sel[v]), LoadF(T[v][b]), acc[v]);
    }
  }
  for (size_t v = 0; v < NV; ++v) StoreF(acc[v], keys + v * kPW);
}

// Every pair's canonical E (times inv[row] for cosine), folded into best/arg (2W lanes of the group pair).
template <bool kCos>
void RefinePairs(const float* q0, const float* q1, size_t qstride, uint32_t dim, const Pair* pr, size_t np,
                 const float* inv, float* HWY_RESTRICT best, int32_t* HWY_RESTRICT arg) {
  constexpr size_t kTile = kPairVecs * kPW;
  alignas(64) float keys[kTile];
  for (size_t i = 0; i < np; i += kTile) {
    const size_t n = std::min(np - i, kTile);
    switch ((n + kPW - 1) / kPW) {
      case 1: PairTile<1>(q0, q1, qstride, dim, pr + i, n, keys); break;
      case 2: PairTile<2>(q0, q1, qstride, dim, pr + i, n, keys); break;
      case 3: PairTile<3>(q0, q1, qstride, dim, pr + i, n, keys); break;
      default: PairTile<4>(q0, q1, qstride, dim, pr + i, n, keys); break;
    }
    for (size_t j = 0; j < n; ++j) {
      const Pair& e = pr[i + j];
      float key = keys[j];
      if (kCos) key = key * inv[e.row];
      const float b = best[e.lane];
      const int32_t a = arg[e.lane];
      const bool take = key > b || (key == b && e.row < a);
      best[e.lane] = take ? key : b;
      arg[e.lane] = take ? e.row : a;
    }
  }
}
#endif  // pair tile

#ifdef MAXSIM_SCREEN_PAIR_TILE
// Items serving at least this many lanes go through RefineTile (8 items per tile, one FMA per W lanes and k), the
// rest are split into pairs for the pair tile. Crossover measured on Zen 5 (a microbenchmark timing both tiles
// on the same items, dim 128, rows in L2): per refined pair the pair tile costs the same whatever the mask
// (AVX3 ~23 ns, AVX2 ~40 ns per pair), RefineTile ~1/p of its item cost for p lanes per item. AVX3: pairs
// 3.5x faster at p = 1, 1.85x at 2, 1.2x at 3, 0.95x at 4; AVX2: 1.9x at 1, 0.95x at 2, 0.63x at 3.
constexpr uint32_t kTileLanes = kPW == 16 ? 4 : 3;
#endif

// One refinement round of a group pair: items l0 (first group) and l1 (second), `pairs` lanes in all, folded
// into best/arg (2W lanes). The item lists are reused as scratch.
template <bool kCos>
void RefineRound(ScreenState& st, const float* q0, const float* q1, size_t qstride, uint32_t dim, Item* l0,
                 size_t n0, Item* l1, size_t n1, size_t pairs, const float* inv, float* best, int32_t* arg) {
#ifdef MAXSIM_SCREEN_PAIR_TILE
  const DF df;
  const uint32_t W = static_cast<uint32_t>(hn::Lanes(df));
  if (st.pairs.size() < pairs * sizeof(Pair) + 64) st.pairs.resize(pairs * sizeof(Pair) + 64);
  Pair* pr = reinterpret_cast<Pair*>((reinterpret_cast<uintptr_t>(st.pairs.data()) + 63) & ~uintptr_t{63});
  size_t np = 0;
  Item* l[2] = {l0, l1};
  const size_t n[2] = {n0, n1};
  size_t kept[2] = {0, 0};
  for (uint32_t g = 0; g < 2; ++g) {
    for (size_t i = 0; i < n[g]; ++i) {
      const Item it = l[g][i];
      if (static_cast<uint32_t>(__builtin_popcount(it.mask)) >= kTileLanes) {
        l[g][kept[g]++] = it;  // order kept: RefineTile folds rows in order
        continue;
      }
      for (uint32_t m = it.mask; m != 0; m &= m - 1) {
        pr[np++] = Pair{it.ptr, static_cast<int32_t>(it.idx), g * W + static_cast<uint32_t>(__builtin_ctz(m))};
      }
    }
  }
  if (kept[0] + kept[1]) RefineLists<kCos>(q0, q1, qstride, dim, l0, kept[0], l1, kept[1], inv, best, arg);
  if (np) RefinePairs<kCos>(q0, q1, qstride, dim, pr, np, inv, best, arg);
#else
  (void)st;
  (void)pairs;
  RefineLists<kCos>(q0, q1, qstride, dim, l0, n0, l1, n1, inv, best, arg);
#endif
}

// One f16/bf16 row widened to f32 (exact).
HWY_INLINE void WidenRow(const uint8_t* row, maxsim_dtype dtype, uint32_t dim, float* o) {
  const DF df;
  const size_t N = hn::Lanes(df);
  uint32_t k = 0;
  const auto* bits = reinterpret_cast<const uint16_t*>(row);
  if (dtype == MAXSIM_BF16) {
    const hn::Rebind<hwy::bfloat16_t, DF> db;
    const auto* in = reinterpret_cast<const hwy::bfloat16_t*>(row);
    for (; k + N <= dim; k += N) hn::StoreU(hn::PromoteTo(df, hn::LoadU(db, in + k)), df, o + k);
    for (; k < dim; ++k) {
      const uint32_t b = static_cast<uint32_t>(bits[k]) << 16;
      std::memcpy(o + k, &b, 4);
    }
  } else {
    const hn::Rebind<hwy::float16_t, DF> dh;
    const auto* in = reinterpret_cast<const hwy::float16_t*>(row);
    for (; k + N <= dim; k += N) hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, in + k)), df, o + k);
    if (k < dim) {
      alignas(64) uint16_t tmp[16] = {};
      std::memcpy(tmp, bits + k, (dim - k) * 2);
      alignas(64) float wide[16];
      hn::Store(hn::PromoteTo(df, hn::Load(dh, reinterpret_cast<const hwy::float16_t*>(tmp))), df, wide);
      std::memcpy(o + k, wide, (dim - k) * 4);
    }
  }
}

// f32 rounded up (x >= 0; +inf when it does not fit).
inline float RoundUp(double x) {
  if (!(x <= static_cast<double>(std::numeric_limits<float>::max()))) return kInf;
  float f = static_cast<float>(x);
  if (static_cast<double>(f) < x) f = std::nextafter(f, kInf);
  return f;
}

// Threshold coefficients of one document: for every lane, mb = fl(fl(fl(qr X) + fl(qn Y)) + C) bounds the
// |A|-free part of every margin of that lane in this document (see Threshold).
struct DocCoef {
  float x, y, c;
};

// Per-document maxima of ||d||, ||e_d|| and 1/||d|| (cosine), then the coefficients. The margin (screening.h)
// is m = fl(fl(fl(T * w) * (1 + 2^-20)) + fl(|A| 2^-21)) + abs_slack with T = eps + fp,
//   eps = qr (dn + dr) + qn dr + 2^-126,  fp = gamma qn dn,   w = 1/||d|| (cosine) or 1,
// so its |A|-free part is at most (qr X0 + qn Y0 + 2^-126) W (1 + 2^-20) + abs_slack, up to the f32 roundings
// of m (below 2^-21 relative in all) with X0 = max(dn) + max(dr) >= max(dn + dr), Y0 = max(dr) + gamma
// max(dn), W = max(w). The coefficients carry a factor (1 + 2^-16) for those roundings and (1 + 2^-18) for the
// roundings of mb itself (three f32 operations on non-negative terms, each below 2^-24 relative; underflow in
// them is absolute, below 2^-149, and C >= abs_slack >= 2^-120 absorbs it).
inline DocCoef Coefficients(const DocRef& d, const float* inv, float gamma, float abs_slack) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const uint32_t nd = d.n_tokens;
  const float* m = reinterpret_cast<const float*>(d.meta);
  // Lanes 1 and 2 of every 4 hold norm and resid_norm (maxsim_vector_meta); max over records.
  VF acc = hn::Zero(df);
  size_t i = 0;
  const size_t nf = static_cast<size_t>(nd) * 4;
  for (; i + N <= nf; i += N) acc = hn::Max(acc, hn::LoadU(df, m + i));
  alignas(64) float lanes[16];
  hn::Store(acc, df, lanes);
  float dn = 0, dr = 0;
  for (size_t l = 0; l < N; l += 4) {
    dn = std::max(dn, lanes[l + 1]);
    dr = std::max(dr, lanes[l + 2]);
  }
  for (size_t r = i / 4; r < nd; ++r) {
    dn = std::max(dn, d.meta[r].norm);
    dr = std::max(dr, d.meta[r].resid_norm);
  }
  double w = 1.0;
  if (inv) {
    VF iv = hn::Zero(df);
    uint32_t j = 0;
    for (; j + N <= nd; j += N) iv = hn::Max(iv, hn::LoadU(df, inv + j));
    float mx = hn::GetLane(hn::MaxOfLanes(df, iv));
    for (; j < nd; ++j) mx = std::max(mx, inv[j]);
    w = mx;
  }
  const double f = w * (1.0 + 0x1p-20) * (1.0 + 0x1p-16) * (1.0 + 0x1p-18);
  DocCoef c;
  c.x = RoundUp((static_cast<double>(dn) + dr) * f);
  c.y = RoundUp((static_cast<double>(dr) + static_cast<double>(gamma) * dn) * f);
  c.c = RoundUp((0x1p-126 * w * (1.0 + 0x1p-20) + abs_slack) * (1.0 + 0x1p-16) * (1.0 + 0x1p-18));
  return c;
}

// mb = fl(fl(fl(qr X) + fl(qn Y)) + C) per lane: bounds the |A|-free part of every margin of the lane in this
// document (Coefficients). Threshold and the fused i8 phase's running rule (MakeRunningRule) both start from it.
HWY_INLINE VF MarginBound(VF qr, VF qn, const DocCoef& c) {
  const DF df;
  return hn::Add(hn::Add(hn::Mul(qr, hn::Set(df, c.x)), hn::Mul(qn, hn::Set(df, c.y))), hn::Set(df, c.c));
}

// Threshold tk per lane. Notation: a_j the key (f32, the portable kernel's), m_j its margin, t the first row of
// maximal key (top = a_t), L = max_j fl(a_j - m_j), Mb >= m_j - 2^-21 |a_j| for every row (mb above bounds it
// with room to spare). Then (the first-round driver's derivation): L >= fl(a_t - m_t) >= top - Mb - 2^-20.9 |top|
// and fl(a_j + m_j) <= a_j + 2^-20 |a_j| + Mb, so row j is not a candidate when
//   a_j + 2^-20 |a_j| < t1 := top - 2 Mb - 2^-17 (|top| + Mb),
// which holds whenever a_j < t2 := t1 - 2^-17 |t1|; nor can it fix L (fl(a_j - m_j) <= a_j < t1 < L). In f32:
//   tk = fl(fl(top - fl(2.5 mb)) - fl(fl(|top| + fl(3 mb)) 2^-14))
// is below t2: the five roundings move it by less than 2^-22 (|top| + 3 mb), far inside the extra 0.5 mb +
// 2^-15 (|top| + mb) it subtracts (and 0.5 mb >= 2^-121 covers the one possibly subnormal product). When top,
// mb or tk are not finite, or s_q is not positive (a zero query vector), tk = -inf: every row gets the exact
// test. Padding lanes get +inf (no row survives for them).
HWY_INLINE VF Threshold(VF top, VF qr, VF qn, VF sq, const DocCoef& c, MF valid) {
  const DF df;
  const VF mb = MarginBound(qr, qn, c);
  const VF t = hn::Sub(hn::Sub(top, hn::Mul(mb, hn::Set(df, 2.5f))),
                       hn::Mul(hn::Add(hn::Abs(top), hn::Mul(mb, hn::Set(df, 3.0f))), hn::Set(df, 0x1p-14f)));
  const MF ok = hn::And(hn::And(hn::IsFinite(t), hn::IsFinite(top)),
                        hn::And(hn::IsFinite(mb), hn::Gt(sq, hn::Zero(df))));
  const VF tk = hn::IfThenElse(ok, t, hn::Set(df, -kInf));
  return hn::IfThenElse(valid, tk, hn::Set(df, kInf));
}

struct DocCtx {
  const ScreenCall* c;
  const DocRef* d;
  ScreenState* st;
  ScreenState::Doc* doc;
  QueryLanes lanes;
  ScreenConstants consts;
  DocCoef coef;
  bool cosine, certified;
  uint64_t multi;
};

// Steps 1-4 for one query group g whose keys are K ([n_in][W]) with per-lane maximum top (NaN keys ignored):
// K[i] holds the keys of row rows_in[i] (rows increasing), or of row i when rows_in is nullptr (n_in = nd, every
// row). With a list, it must hold every row that some lane keeps at the final threshold (a fused i8 phase's
// survivors: a superset; the scan below drops the rest, so the result is the same as with every row).
// Appends the group's entries at doc.n (capacity for nd more is reserved by the caller).
HWY_INLINE void SelectGroup(DocCtx& x, uint32_t g, const float* HWY_RESTRICT K, const uint32_t* rows_in,
                            size_t n_in, const float* top_p) {
  const DF df;
  const DI di;
  const size_t W = hn::Lanes(df);
  const PreparedQuery& q = *x.c->q;
  const DocRef& d = *x.d;
  ScreenState& st = *x.st;
  ScreenState::Doc& doc = *x.doc;
  const uint32_t s0 = g * static_cast<uint32_t>(W);
  const size_t lanes = std::min<size_t>(W, q.n_tokens - s0);
  const MF valid = hn::FirstN(df, lanes);
  const VF sq = hn::LoadU(df, x.lanes.sq + s0);
  const VF qn = hn::LoadU(df, x.lanes.qn + s0);
  const VF qr = hn::LoadU(df, x.lanes.qr + s0);
  const VF gq = hn::LoadU(df, x.lanes.gq + s0);
  const VF top = hn::LoadU(df, top_p);
  const VF inf = hn::Set(df, kInf);
  VF tk;
  if (x.certified) {
    tk = Threshold(top, qr, qn, sq, x.coef, valid);
  } else {
    tk = hn::IfThenElse(valid, hn::IfThenElse(hn::IsFinite(top), top, hn::Neg(inf)), inf);
  }
  // 2. scan (branch-free list of the rows that some lane keeps; entries index K).
  uint32_t* HWY_RESTRICT list = st.scan_rows.data();
  size_t n = 0;
  for (uint32_t i = 0; i < n_in; ++i) {
    const MF below = hn::Lt(hn::LoadU(df, K + static_cast<size_t>(i) * W), tk);
    list[n] = i;
    n += !hn::AllTrue(df, below);
  }
  // 3. exact margins on the survivors (screening.h, the same f32 operations in the same order), lower, and
  // the first row of maximal key per lane: the portable kernel's strict > scan picks the first row whose key
  // equals the maximum over non-NaN keys (top), never a -inf or NaN key, and row 0 when there is none. In
  // reverse row order that is a plain overwrite (no loop-carried compare).
  float* HWY_RESTRICT ups = st.scan_up.data();
  VF lower = hn::Neg(inf);
  VI best_j = hn::Zero(di);
  const VF tiny = hn::Set(df, 0x1p-126f);
  const VF c20 = hn::Set(df, 1.0f + 0x1p-20f);
  const VF c21 = hn::Set(df, 0x1p-21f);
  const VF slack = hn::Set(df, x.consts.abs_slack);
  const MF top_ok = hn::Gt(top, hn::Neg(inf));
  const float* inv = x.cosine ? doc.inv.data() : nullptr;
  for (size_t e = n; e-- > 0;) {
    const uint32_t i = list[e];
    const uint32_t j = rows_in ? rows_in[i] : i;
    const maxsim_vector_meta& dm = d.meta[j];
    const VF key = hn::LoadU(df, K + static_cast<size_t>(i) * W);
    const VF eps = hn::Add(
        hn::Add(hn::Mul(qr, hn::Set(df, dm.norm + dm.resid_norm)), hn::Mul(qn, hn::Set(df, dm.resid_norm))), tiny);
    const VF fp = hn::Mul(gq, hn::Set(df, dm.norm));
    VF t = hn::Add(eps, fp);
    if (inv) t = hn::Mul(t, hn::Set(df, inv[j]));
    const VF m = hn::Add(hn::Add(hn::Mul(t, c20), hn::Mul(hn::Abs(key), c21)), slack);
    lower = hn::Max(hn::Sub(key, m), lower);  // a NaN difference is ignored, as std::fmax does
    hn::StoreU(hn::Add(key, m), df, ups + e * W);
    const MF at_top = hn::And(hn::Eq(key, top), top_ok);
    best_j = hn::IfThenElse(hn::RebindMask(di, at_top), hn::Set(di, static_cast<int32_t>(j)), best_j);
  }
  // 4. candidate lanes, top-row lanes, the kept entries and the per-lane bound; branch-free.
  size_t out = doc.n;
  uint32_t* HWY_RESTRICT rows_out = doc.row.data();
  uint32_t* HWY_RESTRICT cm_out = doc.cm.data();
  uint32_t* HWY_RESTRICT tm_out = doc.tm.data();
  float* HWY_RESTRICT up_out = doc.up.data();
  uint32_t* HWY_RESTRICT pf = st.pf_next.data();
  size_t npf = st.pf_next_n;
  const size_t pf_cap = st.pf_next.size() - 1;
  VI ncand = hn::Zero(di);
  const VI one = hn::Set(di, 1);
  VF ub = hn::Neg(inf);
  for (size_t e = 0; e < n; ++e) {
    const uint32_t j = rows_in ? rows_in[list[e]] : list[e];
    const VF up = hn::LoadU(df, ups + e * W);
    const MF cand = hn::And(hn::Not(hn::Lt(up, lower)), valid);
    const MF is_top = hn::And(hn::RebindMask(df, hn::Eq(best_j, hn::Set(di, static_cast<int32_t>(j)))), valid);
    const VF upn = hn::IfThenElse(hn::IsNaN(up), inf, up);
    const uint32_t tm = Bits(is_top);
    uint32_t keep;
    if (x.certified) {
      ncand = hn::Add(ncand, hn::IfThenElseZero(hn::RebindMask(di, cand), one));
      ub = hn::IfThenElse(cand, hn::Max(upn, ub), ub);
      keep = Bits(cand);
    } else {
      ub = hn::IfThenElse(is_top, upn, ub);
      keep = tm;
    }
    rows_out[out] = j;
    cm_out[out] = keep;
    tm_out[out] = tm;
    hn::StoreU(up, df, up_out + out * W);
    out += keep != 0;
    // Prefetch (during the next document's i8 phase) the rows the refinement will most likely read: top rows,
    // and candidates whose bound reaches the lane's top key (round 2 needs it to reach E of the top row).
    const bool want = (tm | (keep & Bits(hn::Not(hn::Lt(up, top))))) != 0;
    pf[npf] = j;
    npf += want && npf < pf_cap;
  }
  doc.n = out;
  st.pf_next_n = npf;
  if (x.certified) {
    x.multi += hn::CountTrue(df, hn::And(hn::RebindMask(df, hn::Gt(ncand, one)), valid));
  }
  hn::StoreU(ub, df, doc.ub.data() + s0);
}

// RunningRule constants of query group g (pipeline.h) into rule[0..4W): c1, c3, lo, hi.
// Why rt(a) <= tk(b) for every running maximum a <= final maximum b with tk(b) finite (then tk(b) is Threshold's
// t(b), and c1 = fl(2.5 mb), c3 = fl(3 mb) are the same f32 values Threshold uses). Write
// E_s(y) = y - c1 - 2^-s (|y| + c3) in real arithmetic. Each of the two expressions is E_s of its argument up to
// its f32 roundings (two subtractions, an addition; the product by a power of two is exact but for underflow):
// |t(b) - E_14(b)| <= 2^-22 (|b| + c3) + 2^-150 and |rt(a) - E_13(a)| <= 2^-22 (|a| + c3) + 2^-150 (c1 < c3).
// With |b| <= |a| + (b - a) and E_14(b) - E_14(a) >= (1 - 2^-14)(b - a):
//   t(b) - rt(a) >= (1 - 2^-14 - 2^-22)(b - a) + (2^-14 - 2^-21)(|a| + c3) - 2^-149 > 0,
// because c3 >= 3 mb >= 3 abs_slack > 2^-120. Lanes whose tk is -inf whatever the keys (mb not finite, s_q not
// positive: a zero query vector) keep every row (lo = hi = -inf); padding lanes keep none (lo = hi = +inf). A
// finite a with a later +inf or non-finite t(b) is the one case the bound does not cover: FusedComplete catches
// it. APPROXIMATE: rt = a <= b = tk(b).
HWY_INLINE void MakeRunningRule(const DocCtx& x, uint32_t g, float* HWY_RESTRICT rule) {
  const DF df;
  const size_t W = hn::Lanes(df);
  const uint32_t s0 = g * static_cast<uint32_t>(W);
  const MF valid = hn::FirstN(df, std::min<size_t>(W, x.c->q->n_tokens - s0));
  const VF inf = hn::Set(df, kInf);
  VF c1 = hn::Zero(df), c3 = hn::Zero(df), lo = hn::Neg(inf), hi = inf;
  if (x.certified) {
    const VF mb = MarginBound(hn::LoadU(df, x.lanes.qr + s0), hn::LoadU(df, x.lanes.qn + s0), x.coef);
    c1 = hn::Mul(mb, hn::Set(df, 2.5f));
    c3 = hn::Mul(mb, hn::Set(df, 3.0f));
    const MF can = hn::And(hn::IsFinite(mb), hn::Gt(hn::LoadU(df, x.lanes.sq + s0), hn::Zero(df)));
    hi = hn::IfThenElse(can, inf, hn::Neg(inf));
    c1 = hn::IfThenElseZero(can, c1);
    c3 = hn::IfThenElseZero(can, c3);
  }
  lo = hn::IfThenElse(valid, lo, inf);
  hi = hn::IfThenElse(valid, hi, inf);
  hn::StoreU(c1, df, rule);
  hn::StoreU(c3, df, rule + W);
  hn::StoreU(lo, df, rule + 2 * W);
  hn::StoreU(hi, df, rule + 3 * W);
}

// Whether a fused i8 phase's survivors of group g are complete: every lane that could have a finite threshold
// (hi = +inf and valid) has one at the final maximum top.
HWY_INLINE bool FusedComplete(const DocCtx& x, uint32_t g, const float* top_p, const float* rule) {
  const DF df;
  const size_t W = hn::Lanes(df);
  const uint32_t s0 = g * static_cast<uint32_t>(W);
  const MF valid = hn::FirstN(df, std::min<size_t>(W, x.c->q->n_tokens - s0));
  const VF top = hn::LoadU(df, top_p);
  VF tk;
  if (x.certified) {
    tk = Threshold(top, hn::LoadU(df, x.lanes.qr + s0), hn::LoadU(df, x.lanes.qn + s0),
                   hn::LoadU(df, x.lanes.sq + s0), x.coef, valid);
  } else {
    tk = hn::IfThenElse(hn::IsFinite(top), top, hn::Set(df, -kInf));
  }
  const MF could = hn::And(valid, hn::Eq(hn::LoadU(df, rule + 3 * W), hn::Set(df, kInf)));
  return hn::AllFalse(df, hn::And(could, hn::Not(hn::Gt(tk, hn::Set(df, -kInf)))));
}

// Screens one document: i8 phase per block of groups, selection per group, bound, prefetch of candidate rows.
void ScreenDoc(const ScreenCall& c, const DocRef& d, const DocRef* next, ScreenState& st, ScreenState::Doc& doc) {
  const DF df;
  const size_t W = hn::Lanes(df);
  const PreparedQuery& q = *c.q;
  const uint32_t nd = d.n_tokens;
  const bool cosine = c.metric == MAXSIM_METRIC_COSINE;
  DocCtx x{&c, &d, &st, &doc, I8QueryLayout::Lanes(q, q.layout), ScreenConstants(d.dim), DocCoef{},
           cosine, c.mode == MAXSIM_MODE_CERTIFIED, 0};
  if (cosine) {
    if (doc.inv.size() < nd) doc.inv.resize(nd);
    for (uint32_t j = 0; j < nd; ++j) doc.inv[j] = InvNorm(d.meta[j].norm);
  }
  const uint32_t n_groups = q.n_padded / static_cast<uint32_t>(W);
  const uint32_t gpb = std::max<uint32_t>(1, std::min<uint32_t>(c.groups_per_block, 2));
  const size_t nd_pad = (static_cast<size_t>(nd) + 15) / 16 * 16;
  if (st.keys.size() < gpb * nd_pad * W + 16) st.keys.resize(gpb * nd_pad * W + 16);
  if (st.top.size() < 2 * W) st.top.resize(2 * W);
  if (st.scan_rows.size() < nd) st.scan_rows.resize(nd);
  if (st.scan_up.size() < nd_pad * W) st.scan_up.resize(nd_pad * W);
  if (doc.ub.size() < q.n_padded) doc.ub.resize(q.n_padded);
  if (doc.group_begin.size() < n_groups + 1) doc.group_begin.resize(n_groups + 1);
  doc.n = 0;
  // 64-byte aligned key block for the i8 phase.
  float* K = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(st.keys.data()) + 63) & ~uintptr_t{63});
  ScreenJob job;
  job.q = &q;
  job.d = &d;
  job.layout = q.layout;
  job.lanes = x.lanes;
  job.inv = cosine ? doc.inv.data() : nullptr;
  job.cosine = cosine;
  job.pf = &st.pf;
  job.ctx = c.ctx;
  // Spread the previous document's prefetches over this i8 phase: the kernel steps at least once per
  // c.pf_rows_per_step rows and block of groups (all blocks, or all but the first: ScreenCall).
  const size_t blocks = (n_groups + gpb - 1) / gpb;
  const size_t step_blocks = blocks > 1 && c.pf_skip_first_block ? blocks - 1 : blocks;
  const size_t steps = std::max<size_t>(1, (nd / std::max<uint32_t>(1, c.pf_rows_per_step)) * step_blocks);
  st.pf.per_step = (st.pf.rows.size() * st.pf.lines_per_row + steps - 1) / steps;
  // The next document's code and metadata pages, so that its first block's code prefetches find their
  // translations (they waited for page walks there: the i8 loop stalled on them).
  st.pf.pages.clear();
  if (next) {
    const auto add = [&](const void* base, size_t bytes) {
      const uintptr_t b = reinterpret_cast<uintptr_t>(base);
      for (uintptr_t a = b & ~uintptr_t{4095}; a < b + bytes; a += 4096) {
        st.pf.pages.push_back(reinterpret_cast<const char*>(std::max(a, b & ~uintptr_t{63})));
      }
    };
    add(next->codes, static_cast<size_t>(next->n_tokens) * next->padded_dim);
    add(next->meta, static_cast<size_t>(next->n_tokens) * sizeof(maxsim_vector_meta));
  }
  if (st.pf_next.size() < 2 * static_cast<size_t>(nd) + 1) st.pf_next.resize(2 * static_cast<size_t>(nd) + 1);
  st.pf_next_n = 0;
  bool have_coef = !x.certified;
  // A fused i8 phase needs the thresholds' constants before it starts (one pass over the metadata).
  const bool fused = c.survivors != nullptr;
  float* surv_keys = nullptr;
  if (fused) {
    if (!have_coef) {
      x.coef = Coefficients(d, cosine ? doc.inv.data() : nullptr, x.consts.gamma, x.consts.abs_slack);
      have_coef = true;
    }
    if (st.surv_rows.size() < 2 * static_cast<size_t>(nd)) st.surv_rows.resize(2 * static_cast<size_t>(nd));
    if (st.surv_keys.size() < 2 * nd_pad * W + 16) st.surv_keys.resize(2 * nd_pad * W + 16);
    if (st.rule.size() < 8 * W) st.rule.resize(8 * W);
    surv_keys = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(st.surv_keys.data()) + 63) & ~uintptr_t{63});
  }
  for (uint32_t g0 = 0; g0 < n_groups; g0 += gpb) {
    const uint32_t ng = std::min(gpb, n_groups - g0);
    // Groups made only of padding lanes (AVX2: 8-lane groups past the last token) need nothing.
    if (g0 * W >= q.n_tokens) {
      for (uint32_t gl = 0; gl < ng; ++gl) doc.group_begin[g0 + gl] = static_cast<uint32_t>(doc.n);
      continue;
    }
    const uint32_t live =
        std::min<uint32_t>(ng, static_cast<uint32_t>((q.n_tokens - g0 * W + W - 1) / W));
    SurvivorList surv[2];
    bool full = !fused;
    if (fused) {
      RunningRule rules[2];
      for (uint32_t gl = 0; gl < live; ++gl) {
        float* r = st.rule.data() + gl * 4 * W;
        MakeRunningRule(x, g0 + gl, r);
        rules[gl].c1 = r;
        rules[gl].c3 = r + W;
        rules[gl].lo = r + 2 * W;
        rules[gl].hi = r + 3 * W;
        rules[gl].approximate = !x.certified;
        surv[gl].rows = st.surv_rows.data() + static_cast<size_t>(gl) * nd;
        surv[gl].keys = surv_keys + gl * nd_pad * W;
        surv[gl].n = 0;
      }
      c.survivors(job, g0, live, rules, surv, st.top.data());
      for (uint32_t gl = 0; gl < live; ++gl) {
        if (!FusedComplete(x, g0 + gl, st.top.data() + gl * W, st.rule.data() + gl * 4 * W)) full = true;
      }
      if (FusedFallbackForced()) full = true;
    }
    if (full) c.keys(job, g0, live, K, nd_pad * W, st.top.data());
    if (!have_coef) {  // after the first i8 phase: the metadata is in cache by now
      x.coef = Coefficients(d, cosine ? doc.inv.data() : nullptr, x.consts.gamma, x.consts.abs_slack);
      have_coef = true;
    }
    for (uint32_t gl = 0; gl < ng; ++gl) {
      doc.group_begin[g0 + gl] = static_cast<uint32_t>(doc.n);
      if (gl >= live) continue;
      if (doc.row.size() < doc.n + nd) {  // room for every row of this group
        const size_t cap = std::max(doc.n + nd, 2 * doc.row.size());
        doc.row.resize(cap);
        doc.cm.resize(cap);
        doc.tm.resize(cap);
        doc.up.resize(cap * W);
      }
      if (full) {
        SelectGroup(x, g0 + gl, K + gl * nd_pad * W, nullptr, nd, st.top.data() + gl * W);
      } else {
        SelectGroup(x, g0 + gl, surv[gl].keys, surv[gl].rows, surv[gl].n, st.top.data() + gl * W);
      }
    }
  }
  doc.group_begin[n_groups] = static_cast<uint32_t>(doc.n);
  if (c.counters) c.counters->multi_candidate += x.multi;
  // Top-k: the bound on the score, computed as the engine computes scores.
  doc.pruned = false;
  if (c.prune) {
    double sum = 0.0;
    const float* w = c.prune->token_weight;
    for (uint32_t s = 0; s < q.n_tokens; ++s) {
      const float v = w ? doc.ub[s] * w[s] : doc.ub[s];
      sum += static_cast<double>(v);
    }
    const float bound = static_cast<float>(sum);
    doc.pruned = bound < c.prune->below;  // NaN never prunes
  }
  // The previous document's rows are all on their way; this document's go next (none when pruned).
  st.pf.Flush();
  // Each row once: groups share top rows (the list holds the rows of every group), and the cut-off below is
  // about rows. Branch-free over the list (tens of entries at Lq = 32); the bit test-and-set goes through memory,
  // which is why it is not done per entry in SelectGroup (a store-to-load chain over every scanned row there
  // cost more than the rest of the selection's list building).
  st.pf_seen.assign((static_cast<size_t>(nd) + 63) / 64, 0);
  if (st.pf.rows.size() < st.pf_next_n) st.pf.rows.resize(st.pf_next_n);
  size_t n_rows = 0;
  if (!doc.pruned) {
    uint64_t* HWY_RESTRICT seen = st.pf_seen.data();
    const char** HWY_RESTRICT rows = st.pf.rows.data();
    for (size_t i = 0; i < st.pf_next_n; ++i) {
      const uint32_t j = st.pf_next[i];
      const uint64_t bit = uint64_t{1} << (j & 63);
      const bool fresh = (seen[j >> 6] & bit) == 0;
      seen[j >> 6] |= bit;
      rows[n_rows] = reinterpret_cast<const char*>(
          reinterpret_cast<uintptr_t>(d.originals + static_cast<size_t>(j) * d.orig_row_bytes) & ~uintptr_t{63});
      n_rows += fresh;
    }
  }
  // Only when the refinement reads a small part of the document: when most rows are candidates (long queries:
  // Lq = Ld = 1024, where 2/3 of the rows are wanted), the prefetches stall the next i8 phase on the line-fill
  // buffers (measured on Sapphire Rapids: +600K cycles per 1024 x 1024 document) and the refinement reads the
  // rows in order anyway. The cut-off used to be nd / 4 entries counted with repeats: at Lq = 32, Ld = 180 that
  // is 45 against ~46 entries (~41 distinct rows) per document, so about half of the documents got no
  // prefetch at all and their refinement tiles waited on DRAM (avx2: 6.1K against 4.5K TSC ticks per document).
  const bool few = n_rows <= std::max<size_t>(16, nd / 3);
  if (few || doc.pruned) {
    st.pf.rows.resize(few ? n_rows : 0);
    st.pf.lines_per_row = (static_cast<size_t>(d.dim) * (d.dtype == MAXSIM_F32 ? 4 : 2) + 63) / 64 +
                          ((reinterpret_cast<uintptr_t>(d.originals) | d.orig_row_bytes) % 64 != 0);
  } else {
    // Most rows wanted: the whole document as one sequential region, a few lines per step of the next i8
    // phase (one line at the start, not line 0 of every row at once: that burst stalled the i8 loop on the
    // line fill buffers). The refinement then finds its rows in L2 instead of waiting on DRAM row by row.
    const uintptr_t b = reinterpret_cast<uintptr_t>(d.originals) & ~uintptr_t{63};
    const uintptr_t e = reinterpret_cast<uintptr_t>(d.originals) + static_cast<uintptr_t>(nd) * d.orig_row_bytes;
    st.pf.rows.assign(1, reinterpret_cast<const char*>(b));
    st.pf.lines_per_row = (e - b + 63) / 64;
  }
  st.pf.Reset();
}

// The f32 rows of n refinement items: the originals, or (f16/bf16) rows widened into `wide`.
HWY_INLINE void SetRowPtrs(const DocRef& d, Item* items, size_t n, float* wide) {
  if (d.dtype == MAXSIM_F32) {
    for (size_t i = 0; i < n; ++i) items[i].ptr = reinterpret_cast<const float*>(d.originals + items[i].idx * d.orig_row_bytes);
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    WidenRow(d.originals + items[i].idx * d.orig_row_bytes, d.dtype, d.dim, wide);
    items[i].ptr = wide;
    wide += d.dim;
  }
}

template <bool kCos>
void RefineDocT(const ScreenCall& c, const DocRef& d, ScreenState& st, const ScreenState::Doc& doc, float* best_key,
                int32_t* best_index) {
  const DF df;
  const DI di;
  const size_t W = hn::Lanes(df);
  const PreparedQuery& q = *c.q;
  const uint32_t n_groups = q.n_padded / static_cast<uint32_t>(W);
  const bool certified = c.mode == MAXSIM_MODE_CERTIFIED;
  const float* inv = kCos ? doc.inv.data() : nullptr;
  // Items: at most every entry of two groups per round.
  size_t max_pair = 0;
  for (uint32_t g = 0; g < n_groups; g += 2) {
    const uint32_t g1 = std::min(g + 2, n_groups);
    max_pair = std::max<size_t>(max_pair, doc.group_begin[g1] - doc.group_begin[g]);
  }
  if (st.items.size() < max_pair * sizeof(Item) + 64) st.items.resize(max_pair * sizeof(Item) + 64);
  Item* items = reinterpret_cast<Item*>((reinterpret_cast<uintptr_t>(st.items.data()) + 63) & ~uintptr_t{63});
  if (d.dtype != MAXSIM_F32 && st.widened.size() < max_pair * d.dim) st.widened.resize(max_pair * d.dim);
  uint64_t refined = 0;
  alignas(64) float b1[32], b2[32];
  alignas(64) int32_t a1[32], a2[32];
  for (uint32_t g = 0; g < n_groups; g += 2) {
    const uint32_t ng = std::min<uint32_t>(2, n_groups - g);
    const uint32_t s0 = g * static_cast<uint32_t>(W);
    if (s0 >= q.n_tokens) break;
    const float* q0 = q.qt + s0;
    const float* q1 = ng == 2 ? q.qt + s0 + W : q0;
    // Round 1: the top rows.
    float* wide = st.widened.data();  // f16/bf16 rows (each round's at most max_pair rows)
    size_t n[2] = {0, 0};
    uint64_t round_pairs = refined;
    Item* lists[2] = {items, nullptr};
    for (uint32_t gl = 0; gl < ng; ++gl) {
      if (gl == 1) lists[1] = items + n[0];
      // Branch-free (whether an entry is a top row is unpredictable); an entry is written one past the list.
      const uint32_t* HWY_RESTRICT tmv = doc.tm.data();
      const uint32_t* HWY_RESTRICT cmv = certified ? doc.cm.data() : doc.tm.data();
      const uint32_t* HWY_RESTRICT rv = doc.row.data();
      Item* HWY_RESTRICT li = lists[gl];
      size_t cnt = 0;
      for (uint32_t e = doc.group_begin[g + gl]; e < doc.group_begin[g + gl + 1]; ++e) {
        const uint32_t mask = cmv[e] & (0u - static_cast<uint32_t>(tmv[e] != 0));
        li[cnt] = Item{nullptr, rv[e], mask};
        cnt += mask != 0;
        refined += static_cast<uint64_t>(__builtin_popcount(mask));
      }
      n[gl] = cnt;
    }
    if (!lists[1]) lists[1] = items + n[0];
    SetRowPtrs(d, items, n[0] + n[1], wide);
    for (size_t l = 0; l < 2 * W; ++l) {
      b1[l] = -kInf;
      a1[l] = -1;
    }
    if (n[0] + n[1]) {
      RefineRound<kCos>(st, q0, q1, q.lane_stride, d.dim, lists[0], n[0], lists[1], n[1], refined - round_pairs, inv,
                        b1, a1);
    }
    // Round 2 (certified): the other candidates whose bound still reaches the lane's round-1 key.
    if (certified) {
      n[0] = n[1] = 0;
      round_pairs = refined;
      lists[1] = nullptr;
      for (uint32_t gl = 0; gl < ng; ++gl) {
        if (gl == 1) lists[1] = items + n[0];
        const VF bv = hn::Load(df, b1 + gl * W);
        const uint32_t* HWY_RESTRICT tmv = doc.tm.data();
        const uint32_t* HWY_RESTRICT cmv = doc.cm.data();
        const uint32_t* HWY_RESTRICT rv = doc.row.data();
        const float* HWY_RESTRICT upv = doc.up.data();
        Item* HWY_RESTRICT li = lists[gl];
        size_t cnt = 0;
        for (uint32_t e = doc.group_begin[g + gl]; e < doc.group_begin[g + gl + 1]; ++e) {
          const MF reach = hn::Not(hn::Lt(hn::LoadU(df, upv + static_cast<size_t>(e) * W), bv));
          const uint32_t mask = cmv[e] & Bits(reach) & (0u - static_cast<uint32_t>(tmv[e] == 0));
          li[cnt] = Item{nullptr, rv[e], mask};
          cnt += mask != 0;
          refined += static_cast<uint64_t>(__builtin_popcount(mask));
        }
        n[gl] = cnt;
      }
      if (!lists[1]) lists[1] = items + n[0];
      SetRowPtrs(d, items, n[0] + n[1], wide);
      if (n[0] + n[1]) {
        for (size_t l = 0; l < 2 * W; ++l) {
          b2[l] = -kInf;
          a2[l] = -1;
        }
        RefineRound<kCos>(st, q0, q1, q.lane_stride, d.dim, lists[0], n[0], lists[1], n[1], refined - round_pairs,
                          inv, b2, a2);
        for (uint32_t gl = 0; gl < ng; ++gl) {
          const VF x1 = hn::Load(df, b1 + gl * W), x2 = hn::Load(df, b2 + gl * W);
          const VI i1 = hn::Load(di, a1 + gl * W), i2 = hn::Load(di, a2 + gl * W);
          const MF take = hn::Or(hn::Gt(x2, x1), hn::And(hn::Eq(x2, x1), hn::RebindMask(df, hn::Lt(i2, i1))));
          hn::Store(hn::IfThenElse(take, x2, x1), df, b1 + gl * W);
          hn::Store(hn::IfThenElse(hn::RebindMask(di, take), i2, i1), di, a1 + gl * W);
        }
      }
    }
    const size_t lanes = std::min<size_t>(ng * W, q.n_tokens - s0);
    std::memcpy(best_key + s0, b1, lanes * sizeof(float));
    std::memcpy(best_index + s0, a1, lanes * sizeof(int32_t));
  }
  if (c.counters) c.counters->refined += refined;
}

void Screen(const ScreenCall& c) {
  KernelScratch& scratch = *c.scratch;
  ScreenState* st = dynamic_cast<ScreenState*>(scratch.state.get());
  if (st == nullptr) {
    scratch.state.reset(new ScreenState());
    st = static_cast<ScreenState*>(scratch.state.get());
  }
  const uint32_t nt = c.q->n_tokens;
  const bool cosine = c.metric == MAXSIM_METRIC_COSINE;
  auto refine = [&](size_t i) {
    const ScreenState::Doc& doc = st->doc[i & 1];
    if (c.prune) c.prune->pruned[i] = doc.pruned ? 1 : 0;
    if (doc.pruned) return;
    float* bk = c.best_key + i * nt;
    int32_t* bi = c.best_index + i * nt;
    if (cosine) {
      RefineDocT<true>(c, c.docs[i], *st, doc, bk, bi);
    } else {
      RefineDocT<false>(c, c.docs[i], *st, doc, bk, bi);
    }
  };
  for (size_t i = 0; i < c.n; ++i) {
    ScreenDoc(c, c.docs[i], i + 1 < c.n ? &c.docs[i + 1] : nullptr, *st, st->doc[i & 1]);
    if (i + 1 < c.n) {
      // The next document's first code rows, while the previous one is refined.
      const DocRef& nx = c.docs[i + 1];
      const char* p = reinterpret_cast<const char*>(nx.codes);
      const size_t bytes = static_cast<size_t>(std::min<uint32_t>(nx.n_tokens, 16)) * nx.padded_dim;
      for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 3);
      // and its metadata (scales, norms: read before and during its i8 phase), up to 4 KB.
      const char* m = reinterpret_cast<const char*>(nx.meta);
      const size_t mbytes = std::min<size_t>(static_cast<size_t>(nx.n_tokens) * sizeof(maxsim_vector_meta), 4096);
      for (size_t off = 0; off < mbytes; off += 64) __builtin_prefetch(m + off, 0, 3);
    }
    if (i > 0) refine(i - 1);
  }
  if (c.n > 0) {
    st->pf.Flush();
    refine(c.n - 1);
  }
  st->pf.rows.clear();
  st->pf.Reset();
}

}  // namespace screen
// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace maxsim
HWY_AFTER_NAMESPACE();

#endif  // MAXSIM_SRC_KERNELS_SCREEN_HWY_INL_H_ per-target guard
