// The ISA-independent part of certified/approximate screening, shared by the AVX2, AVX-512 VNNI and AMX
// kernels. It is a template over an ISA policy and carries no target attribute itself (it is compiled for the
// baseline ISA and calls the policy's functions, which carry theirs, once per document or per query group).
//
// Per document and per block of query groups (a group = the policy's W query tokens, one vector of lanes):
//   phase 1 (policy, SIMD): B[j][l] = fl(float(I) * s_d[j]) for every document row j, with I the exact i8 dot,
//            and topP[l] = max_j P[j][l], P = B (dot) or fl(B * inv_j) (cosine). Since s_q > 0 is constant
//            per lane, A = fl(B * s_q) (and the cosine key fl(A * inv_j)) is, up to 3 roundings, P * s_q.
//   prefilter (here): per lane a threshold tp such that every row with P < tp provably is neither a candidate
//            nor the row that fixes max_k (A_k - m_k) (derivation at Threshold below), so only the few rows
//            that pass get the exact per-pair margin of screening.h.
//   scan (policy, SIMD): the rows where some lane has !(P < tp) (NaN keys survive, as in the portable
//            kernel), with their lane masks.
//   exact candidate test (here, scalar, same formulas and order as the portable kernel): lower = max over
//            the survivors of fl(A - m), candidates = survivors with A + m >= lower (approximate mode: the
//            first row of maximal A). The candidate sets are therefore identical to the portable kernel's,
//            so multi_candidate agrees across kernels (tests check this).
//   refinement (Highway exact tiles, x86_kernels.h), in two phases: first each token's top row t (first row
//            of maximal A), which gives its exact key E_t; then, only for tokens with another candidate j
//            whose upper bound A_j + m_j still reaches E_t, those rows and t again, folded in row order.
//            Rows with A_j + m_j < E_t cannot win (their E_j is below E_t), so the result is the exact
//            path's while far fewer rows are refined than the candidate set holds (stats.refined counts
//            the rows actually refined; it is therefore below the portable kernel's).
//            The canonical chain for each row against the group's query vector, folded lane-masked in row
//            order, gives exactly the exact path's values.
#ifndef MAXSIM_SRC_KERNELS_X86_SCREEN_DRIVER_INL_H_
#define MAXSIM_SRC_KERNELS_X86_SCREEN_DRIVER_INL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/kernel.h"
#include "kernels/screening.h"
#include "kernels/x86/x86_kernels.h"

namespace maxsim {
namespace x86 {

// What a policy's phase 1 needs for one (query, document) pair.
struct ScreenJob {
  const PreparedQuery* q = nullptr;
  const DocRef* d = nullptr;
  const void* layout = nullptr;  // the kernel's query layout (PreparedQuery::layout)
  const float* inv = nullptr;    // per document row 1/||d|| (cosine), else nullptr
  bool cosine = false;
};

// Per-document maxima of the quantities in the margin (screening.h), for the prefilter bound.
struct DocBound {
  double max_dnr = 0, max_dr = 0, max_dn = 0, max_inv = 1;
};

inline DocBound ComputeDocBound(const DocRef& d, const float* inv) {
  DocBound b;
  float dnr = 0, dr = 0, dn = 0, iv = 0;
  for (uint32_t j = 0; j < d.n_tokens; ++j) {
    const maxsim_vector_meta& m = d.meta[j];
    dnr = std::max(dnr, m.norm + m.resid_norm);
    dr = std::max(dr, m.resid_norm);
    dn = std::max(dn, m.norm);
    if (inv) iv = std::max(iv, inv[j]);
  }
  b.max_dnr = dnr;
  b.max_dr = dr;
  b.max_dn = dn;
  b.max_inv = inv ? iv : 1.0;
  return b;
}

// Prefilter threshold in P units for one query token (s_q > 0). Notation: a_j the key the portable kernel
// computes (A_j or A_j * inv_j in f32), m_j its margin, t = argmax a. With Mb >= every m_j - 2^-21 |a_j|
// (the margin without its |a| term, from the per-document maxima, rounded up generously):
//   lower >= fl(a_t - m_t) >= top_a - Mb - 2^-20.9 |top_a|            (m_t <= Mb + 2^-21 |a_t|, one rounding)
//   fl(a_j + m_j) <= a_j + 2^-20 |a_j| + Mb                              (both signs of a_j)
// so row j is not a candidate when a_j + 2^-20 |a_j| < top_a - 2 Mb - 2^-20.9 |top_a|, and then it cannot fix
// lower either (fl(a_j - m_j) <= a_j < fl(a_t - m_t)). a_j is P_j s_q up to three f32 roundings (relative
// 2^-22.4) plus, for subnormal intermediates, an absolute error below kAbs. Everything below is computed in
// double with slack factors of 2^-17 and more, far above the f32 and double roundings they must absorb; the
// threshold is finally rounded down to f32. A looser threshold only costs a few more exact margins, never a
// wrong result.
inline float Threshold(const ScreenConstants& c, const maxsim_vector_meta& qm, const DocBound& b, float top_p) {
  const double sq = qm.scale;
  if (!(sq > 0)) return -std::numeric_limits<float>::infinity();  // zero vector: test every row exactly
  const double qn = qm.norm, qr = qm.resid_norm;
  const double eps = qr * b.max_dnr + qn * b.max_dr + 0x1p-126;
  const double fp = static_cast<double>(c.gamma) * qn * b.max_dn;
  const double mb = ((eps + fp) * b.max_inv * (1.0 + 0x1p-20) + c.abs_slack) * (1.0 + 0x1p-16);
  const double k_abs = 0x1p-146 * (1.0 + sq) * (1.0 + b.max_inv);
  const double top = static_cast<double>(top_p) * sq;
  const double t1 = top - 2.0 * mb - 0x1p-17 * (std::fabs(top) + mb) - 2.0 * k_abs;
  const double t2 = t1 - 0x1p-17 * std::fabs(t1);  // the 2^-20 |a_j| term and the P -> a roundings
  double tp = t2 / sq;
  tp -= 0x1p-17 * std::fabs(tp);
  // Not finite (a cosine key of a document whose 1/||d|| overflows f32 is +-inf or NaN; max() over NaN may
  // have dropped values, but only ever downwards): no prefilter, every row gets the exact test.
  if (!(std::fabs(tp) <= static_cast<double>(std::numeric_limits<float>::max()))) {
    return -std::numeric_limits<float>::infinity();
  }
  float f = static_cast<float>(tp);
  if (static_cast<double>(f) > tp) f = std::nextafter(f, -std::numeric_limits<float>::infinity());
  return f;
}

// Scratch layout inside KernelScratch::work (floats) and ::i32.
template <class Isa>
void ScreenedDriver(const PreparedQuery& q, const DocRef& d, maxsim_metric metric, maxsim_mode mode,
                    float* best_key, int32_t* best_index, KernelScratch& scratch, ScreenCounters* counters) {
  constexpr uint32_t W = Isa::kLanes;
  const HwyExactOps& hwy = Isa::Exact();
  const uint32_t nd = d.n_tokens;
  const bool cosine = metric == MAXSIM_METRIC_COSINE;
  const ScreenConstants consts(d.dim);

  // Document rows in f32 for the refinement (the exact path widens the same way).
  uint64_t stride = 0;
  const float* rows = RowsF32(hwy, d, scratch, &stride);
  const uint32_t n_groups = q.n_padded / W;
  const uint32_t block_groups = std::min<uint32_t>(Isa::kGroupsPerBlock, n_groups);
  const size_t nd_pad = (static_cast<size_t>(nd) + 15) / 16 * 16;
  const size_t b_size = static_cast<size_t>(block_groups) * nd_pad * W;
  // work (floats): [inv nd_pad][B b_size, 64-byte aligned][topP bg*W][ak nd_pad*W][m nd_pad*W][tp bg*W][best 2W]
  float* work = KernelScratch::Grow(scratch.work, nd_pad + 16 + b_size + 2 * static_cast<size_t>(block_groups) * W +
                                                      2 * nd_pad * W + 2 * W + 16);
  float* inv = work;
  float* B = inv + nd_pad;
  B = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(B) + 63) & ~static_cast<uintptr_t>(63));
  float* top_p = B + b_size;
  float* ak = top_p + static_cast<size_t>(block_groups) * W;
  float* mg = ak + nd_pad * W;
  float* tp = mg + nd_pad * W;
  float* best = tp + static_cast<size_t>(block_groups) * W;
  float* best2 = best + W;
  // i32: [survivor rows bg*nd_pad][their lane masks bg*nd_pad][refine rows nd_pad][refine masks nd_pad][arg 2W]
  int32_t* i32 = KernelScratch::Grow(scratch.i32, 2 * static_cast<size_t>(block_groups) * nd_pad + 2 * nd_pad + 2 * W);
  uint32_t* scan_rows = reinterpret_cast<uint32_t*>(i32);
  uint32_t* scan_masks = scan_rows + static_cast<size_t>(block_groups) * nd_pad;
  uint32_t* ref_rows = scan_masks + static_cast<size_t>(block_groups) * nd_pad;
  uint32_t* ref_masks = ref_rows + nd_pad;
  int32_t* arg = reinterpret_cast<int32_t*>(ref_masks + nd_pad);
  int32_t* arg2 = arg + W;

  if (cosine) {
    for (uint32_t j = 0; j < nd; ++j) inv[j] = InvNorm(d.meta[j].norm);
  }
  const DocBound bound = ComputeDocBound(d, cosine ? inv : nullptr);
  ScreenJob job;
  job.q = &q;
  job.d = &d;
  job.layout = q.layout;
  job.inv = cosine ? inv : nullptr;
  job.cosine = cosine;
  const size_t row_bytes = static_cast<size_t>(d.dim) * sizeof(float);

  uint64_t refined = 0, multi = 0;
  size_t n_scan[Isa::kGroupsPerBlock];
  for (uint32_t g0 = 0; g0 < n_groups; g0 += block_groups) {
    const uint32_t ng = std::min(block_groups, n_groups - g0);
    Isa::ComputeB(job, g0, ng, B, nd_pad, top_p);
    // Scan every group of the block first and prefetch the originals of each lane's likely top row (the first
    // survivor with P = topP, which phase 1 refines), so the DRAM latency of the refinement overlaps the
    // scalar candidate work below. Only those: prefetching every survivor (~1.8x as many rows, most of them
    // never refined) saturates the line-fill buffers and stalls on the prefetches themselves (measured).
    for (uint32_t gl = 0; gl < ng; ++gl) {
      const uint32_t s0 = (g0 + gl) * W;
      const uint32_t lanes = s0 < q.n_tokens ? std::min<uint32_t>(W, q.n_tokens - s0) : 0;
      float* t = tp + static_cast<size_t>(gl) * W;
      for (uint32_t l = 0; l < W; ++l) {
        t[l] = l < lanes ? Threshold(consts, q.meta[s0 + l], bound, top_p[gl * W + l])
                         : std::numeric_limits<float>::infinity();
      }
      uint32_t* sr = scan_rows + static_cast<size_t>(gl) * nd_pad;
      n_scan[gl] = lanes ? Isa::Scan(B + static_cast<size_t>(gl) * nd_pad * W, nd, job.inv, t, sr,
                                     scan_masks + static_cast<size_t>(gl) * nd_pad)
                         : 0;
      const uint32_t* sm = scan_masks + static_cast<size_t>(gl) * nd_pad;
      const float* Bg = B + static_cast<size_t>(gl) * nd_pad * W;
      uint32_t pending = 0;  // lanes whose top row is not prefetched yet
      for (uint32_t l = 0; l < lanes; ++l) pending |= 1u << l;
      for (size_t e = 0; e < n_scan[gl] && pending; ++e) {
        const uint32_t j = sr[e];
        uint32_t hit = 0;
        for (uint32_t bits = sm[e] & pending; bits; bits &= bits - 1) {
          const uint32_t l = static_cast<uint32_t>(__builtin_ctz(bits));
          const float pj = cosine ? Bg[static_cast<size_t>(j) * W + l] * inv[j] : Bg[static_cast<size_t>(j) * W + l];
          if (pj == top_p[gl * W + l]) hit |= 1u << l;
        }
        if (hit) {
          pending &= ~hit;
          const char* row = reinterpret_cast<const char*>(rows + j * stride);
          for (size_t off = 0; off < row_bytes; off += 64) __builtin_prefetch(row + off, 0, 3);
        }
      }
    }
    for (uint32_t gl = 0; gl < ng; ++gl) {
      const uint32_t s0 = (g0 + gl) * W;
      if (s0 >= q.n_tokens) break;
      const uint32_t lanes = std::min<uint32_t>(W, q.n_tokens - s0);
      const float* Bg = B + static_cast<size_t>(gl) * nd_pad * W;
      const uint32_t* list = scan_rows + static_cast<size_t>(gl) * nd_pad;
      const uint32_t* masks = scan_masks + static_cast<size_t>(gl) * nd_pad;
      const size_t ns = n_scan[gl];
      // Exact keys and margins of the survivors (same expressions as the portable kernel), then lower.
      float lower[W];
      float top[W];
      uint32_t top_j[W];
      for (uint32_t l = 0; l < W; ++l) {
        lower[l] = -std::numeric_limits<float>::infinity();
        top[l] = -std::numeric_limits<float>::infinity();
        top_j[l] = 0;
      }
      for (size_t e = 0; e < ns; ++e) {
        const uint32_t j = list[e];
        const float w = cosine ? inv[j] : 1.0f;
        for (uint32_t bits = masks[e]; bits; bits &= bits - 1) {
          const uint32_t l = static_cast<uint32_t>(__builtin_ctz(bits));
          const maxsim_vector_meta& qm = q.meta[s0 + l];
          const float a = Bg[static_cast<size_t>(j) * W + l] * qm.scale;
          const float key = cosine ? a * w : a;
          const float m = ScreenMargin(consts, qm, d.meta[j], key, w);
          ak[e * W + l] = key;
          mg[e * W + l] = m;
          lower[l] = std::fmax(lower[l], key - m);
          if (key > top[l]) {
            top[l] = key;
            top_j[l] = j;
          }
        }
      }
      // Candidates (the certified set: identical in every kernel) counted per lane.
      uint32_t n_cand[W] = {};
      if (mode != MAXSIM_MODE_APPROXIMATE) {
        for (size_t e = 0; e < ns; ++e) {
          for (uint32_t bits = masks[e]; bits; bits &= bits - 1) {
            const uint32_t l = static_cast<uint32_t>(__builtin_ctz(bits));
            n_cand[l] += !(ak[e * W + l] + mg[e * W + l] < lower[l]);
          }
        }
      }
      // Refinement, phase 1: each lane's first row of maximal A (always a candidate; the approximate answer).
      size_t n1 = 0;
      for (uint32_t l = 0; l < lanes; ++l) {
        size_t pos = 0;
        while (pos < n1 && ref_rows[pos] < top_j[l]) ++pos;
        if (pos < n1 && ref_rows[pos] == top_j[l]) {
          ref_masks[pos] |= 1u << l;
          continue;
        }
        for (size_t m = n1; m > pos; --m) {
          ref_rows[m] = ref_rows[m - 1];
          ref_masks[m] = ref_masks[m - 1];
        }
        ref_rows[pos] = top_j[l];
        ref_masks[pos] = 1u << l;
        ++n1;
      }
      for (uint32_t l = 0; l < W; ++l) {
        best[l] = -std::numeric_limits<float>::infinity();
        arg[l] = -1;
      }
      const float* qt = q.qt + static_cast<size_t>(s0);
      hwy.refine(qt, q.n_padded, q.dim, rows, stride, ref_rows, ref_masks, n1, job.inv, best, arg);
      refined += lanes;
      // Phase 2 (certified): a candidate j can still win only if its upper bound A_j + m_j reaches the exact
      // key E_t just computed for the lane's top row t (E_j <= A_j + m_j < E_t means j loses, ties included).
      // Lanes with such rows are refined again over those rows and t, in row order from -inf, so that ties
      // still go to the lowest row; all other lanes keep t.
      if (mode != MAXSIM_MODE_APPROXIMATE) {
        size_t n2 = 0;
        uint32_t again = 0;
        for (size_t e = 0; e < ns; ++e) {
          const uint32_t j = list[e];
          uint32_t keep = 0;
          for (uint32_t bits = masks[e]; bits; bits &= bits - 1) {
            const uint32_t l = static_cast<uint32_t>(__builtin_ctz(bits));
            const float up = ak[e * W + l] + mg[e * W + l];
            if (up < lower[l]) continue;  // not a candidate
            if (j == top_j[l] || !(up < best[l])) keep |= 1u << l;
            if (j != top_j[l] && !(up < best[l])) again |= 1u << l;
          }
          ref_rows[n2] = j;
          ref_masks[n2] = keep;
          n2 += keep != 0;
        }
        if (again) {
          // Only the lanes that need it; the others drop out of the masks.
          size_t n = 0;
          for (size_t e = 0; e < n2; ++e) {
            const uint32_t m = ref_masks[e] & again;
            ref_rows[n] = ref_rows[e];
            ref_masks[n] = m;
            n += m != 0;
            for (uint32_t bits = m; bits; bits &= bits - 1) {
              const uint32_t l = static_cast<uint32_t>(__builtin_ctz(bits));
              refined += ref_rows[e] != top_j[l];
            }
          }
          for (uint32_t l = 0; l < W; ++l) {
            best2[l] = -std::numeric_limits<float>::infinity();
            arg2[l] = -1;
          }
          hwy.refine(qt, q.n_padded, q.dim, rows, stride, ref_rows, ref_masks, n, job.inv, best2, arg2);
          for (uint32_t bits = again; bits; bits &= bits - 1) {
            const uint32_t l = static_cast<uint32_t>(__builtin_ctz(bits));
            best[l] = best2[l];
            arg[l] = arg2[l];
          }
        }
      }
      for (uint32_t l = 0; l < lanes; ++l) {
        best_key[s0 + l] = best[l];
        best_index[s0 + l] = arg[l];
        if (mode != MAXSIM_MODE_APPROXIMATE) multi += n_cand[l] > 1;
      }
    }
  }
  if (counters) {
    counters->refined += refined;
    counters->multi_candidate += multi;
  }
}

}  // namespace x86
}  // namespace maxsim

#endif  // MAXSIM_SRC_KERNELS_X86_SCREEN_DRIVER_INL_H_
