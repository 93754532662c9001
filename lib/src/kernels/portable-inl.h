// SPDX-License-Identifier: Apache-2.0
// Portable kernel body: plain C++ written so that a compiler auto-vectorises it across query tokens (16 lanes,
// 4 document rows per tile). Included twice: by portable_baseline.cc (no ISA assumption) and by
// portable_autovec_avx2.cc (compiled for AVX2+FMA), each inside its own namespace MAXSIM_PORTABLE_NS so that the two
// instantiations never merge at link time.
//
// Exact: for each group of 16 query lanes, every tile of 4 document rows runs the canonical FMA chain over k
// with the document value broadcast and the query read from the transposed layout (lane = query token), then
// folds the 4 rows into the running max in index order. Screened: per query token, exact integer dots against
// every document code row, the certified margin, then the canonical dot for every surviving candidate.
#ifndef MAXSIM_PORTABLE_NS
#error "define MAXSIM_PORTABLE_NS before including portable-inl.h"
#endif

// Every header this body needs is included by the including file *before* any target pragma, so that inline
// functions outside MAXSIM_PORTABLE_NS are compiled for the baseline ISA only (Fma32 comes with screening.h).

namespace maxsim {
namespace MAXSIM_PORTABLE_NS {

constexpr uint32_t kLanes = 16;
constexpr uint32_t kRows = 4;

// Document rows as f32: the originals themselves when they are f32, else widened into scratch.
inline const float* DocRowsF32(const DocRef& d, KernelScratch& scratch, uint64_t* stride) {
  if (d.dtype == MAXSIM_F32) {
    *stride = d.orig_row_bytes / sizeof(float);
    return reinterpret_cast<const float*>(d.originals);
  }
  float* out = KernelScratch::Grow(scratch.rows, static_cast<size_t>(d.n_tokens) * d.dim);
  for (uint32_t t = 0; t < d.n_tokens; ++t) {
    const auto* row = reinterpret_cast<const uint16_t*>(d.originals + t * d.orig_row_bytes);
    float* o = out + static_cast<size_t>(t) * d.dim;
    if (d.dtype == MAXSIM_BF16) {
      for (uint32_t k = 0; k < d.dim; ++k) o[k] = Bf16ToF32(row[k]);
    } else {
      for (uint32_t k = 0; k < d.dim; ++k) o[k] = F16ToF32(row[k]);
    }
  }
  *stride = d.dim;
  return out;
}

inline const float* DocInvNorms(const DocRef& d, maxsim_metric metric, KernelScratch& scratch) {
  if (metric != MAXSIM_METRIC_COSINE) return nullptr;
  float* inv = KernelScratch::Grow(scratch.inv, d.n_tokens);
  for (uint32_t t = 0; t < d.n_tokens; ++t) inv[t] = InvNorm(d.meta[t].norm);
  return inv;
}

inline void FoldRow(const float* acc, float inv, bool cosine, int32_t index, float* best, int32_t* arg) {
  for (uint32_t l = 0; l < kLanes; ++l) {
    const float key = cosine ? acc[l] * inv : acc[l];
    const bool better = key > best[l];
    best[l] = better ? key : best[l];
    arg[l] = better ? index : arg[l];
  }
}

inline void Exact(const PreparedQuery& q, const DocRef& d, maxsim_metric metric, float* best_key,
                  int32_t* best_index, KernelScratch& scratch) {
  const uint32_t dim = d.dim;
  const uint32_t nd = d.n_tokens;
  const bool cosine = metric == MAXSIM_METRIC_COSINE;
  uint64_t stride = 0;
  const float* rows = DocRowsF32(d, scratch, &stride);
  const float* inv = DocInvNorms(d, metric, scratch);
  for (uint32_t g = 0; g < q.n_padded; g += kLanes) {
    float best[kLanes];
    int32_t arg[kLanes];
    for (uint32_t l = 0; l < kLanes; ++l) {
      best[l] = -std::numeric_limits<float>::infinity();
      arg[l] = -1;
    }
    const float* qt = q.qt + g;
    uint32_t j = 0;
    for (; j + kRows <= nd; j += kRows) {
      float acc[kRows][kLanes];
      std::memset(acc, 0, sizeof(acc));
      const float* d0 = rows + (j + 0) * stride;
      const float* d1 = rows + (j + 1) * stride;
      const float* d2 = rows + (j + 2) * stride;
      const float* d3 = rows + (j + 3) * stride;
      for (uint32_t k = 0; k < dim; ++k) {
        const float* qk = qt + static_cast<size_t>(k) * q.lane_stride;
        const float b0 = d0[k], b1 = d1[k], b2 = d2[k], b3 = d3[k];
        for (uint32_t l = 0; l < kLanes; ++l) {
          acc[0][l] = Fma32(qk[l], b0, acc[0][l]);
          acc[1][l] = Fma32(qk[l], b1, acc[1][l]);
          acc[2][l] = Fma32(qk[l], b2, acc[2][l]);
          acc[3][l] = Fma32(qk[l], b3, acc[3][l]);
        }
      }
      for (uint32_t r = 0; r < kRows; ++r) {
        FoldRow(acc[r], cosine ? inv[j + r] : 1.0f, cosine, static_cast<int32_t>(j + r), best, arg);
      }
    }
    for (; j < nd; ++j) {
      float acc[kLanes];
      std::memset(acc, 0, sizeof(acc));
      const float* d0 = rows + j * stride;
      for (uint32_t k = 0; k < dim; ++k) {
        const float* qk = qt + static_cast<size_t>(k) * q.lane_stride;
        const float b0 = d0[k];
        for (uint32_t l = 0; l < kLanes; ++l) acc[l] = Fma32(qk[l], b0, acc[l]);
      }
      FoldRow(acc, cosine ? inv[j] : 1.0f, cosine, static_cast<int32_t>(j), best, arg);
    }
    for (uint32_t l = 0; l < kLanes && g + l < q.n_tokens; ++l) {
      best_key[g + l] = best[l];
      best_index[g + l] = arg[l];
    }
  }
}

// The canonical similarity (kernel.h), compiled for this namespace's ISA.
inline float DotChain(const float* q, const float* d, uint32_t dim) {
  float acc = 0.0f;
  for (uint32_t k = 0; k < dim; ++k) acc = Fma32(q[k], d[k], acc);
  return acc;
}

inline int32_t CodeDot(const int8_t* a, const int8_t* b, uint32_t n) {
  int32_t acc = 0;
  for (uint32_t k = 0; k < n; ++k) acc += static_cast<int32_t>(a[k]) * static_cast<int32_t>(b[k]);
  return acc;
}

inline void Screened(const PreparedQuery& q, const DocRef& d, maxsim_metric metric, maxsim_mode mode,
                     float* best_key, int32_t* best_index, KernelScratch& scratch, ScreenCounters* counters) {
  const uint32_t nd = d.n_tokens;
  const bool cosine = metric == MAXSIM_METRIC_COSINE;
  const ScreenConstants consts(d.dim);
  uint64_t stride = 0;
  const float* rows = DocRowsF32(d, scratch, &stride);
  const float* inv = DocInvNorms(d, metric, scratch);
  float* a_key = KernelScratch::Grow(scratch.work, 2 * static_cast<size_t>(nd));
  float* margin = a_key + nd;
  uint64_t refined = 0, multi = 0;
  for (uint32_t s = 0; s < q.n_tokens; ++s) {
    const int8_t* qc = q.codes + static_cast<size_t>(s) * q.padded_dim;
    const maxsim_vector_meta& qm = q.meta[s];
    float lower = -std::numeric_limits<float>::infinity();
    float top = -std::numeric_limits<float>::infinity();
    uint32_t top_j = 0;
    for (uint32_t j = 0; j < nd; ++j) {
      const int32_t dot = CodeDot(qc, d.codes + static_cast<size_t>(j) * d.padded_dim, d.padded_dim);
      const float a = static_cast<float>(dot) * d.meta[j].scale * qm.scale;
      const float w = cosine ? inv[j] : 1.0f;
      const float ak = cosine ? a * w : a;
      const float m = ScreenMargin(consts, qm, d.meta[j], ak, w);
      a_key[j] = ak;
      margin[j] = m;
      lower = std::fmax(lower, ak - m);
      if (ak > top) {
        top = ak;
        top_j = j;
      }
    }
    const float* qrow = q.rows + static_cast<size_t>(s) * q.dim;
    float best = -std::numeric_limits<float>::infinity();
    int32_t arg = -1;
    if (mode == MAXSIM_MODE_APPROXIMATE) {
      const float e = DotChain(qrow, rows + top_j * stride, d.dim);
      best = cosine ? e * inv[top_j] : e;
      arg = static_cast<int32_t>(top_j);
      refined += 1;
    } else {
      uint32_t candidates = 0;
      for (uint32_t j = 0; j < nd; ++j) {
        if (a_key[j] + margin[j] < lower) continue;
        ++candidates;
        const float e = DotChain(qrow, rows + j * stride, d.dim);
        const float key = cosine ? e * inv[j] : e;
        if (key > best) {
          best = key;
          arg = static_cast<int32_t>(j);
        }
      }
      refined += candidates;
      multi += candidates > 1;
    }
    best_key[s] = best;
    best_index[s] = arg;
  }
  if (counters) {
    counters->refined += refined;
    counters->multi_candidate += multi;
  }
}

}  // namespace MAXSIM_PORTABLE_NS
}  // namespace maxsim
