// SPDX-License-Identifier: Apache-2.0
// A CPU-implemented plugin that proves the plugin host. Built several times with TEST_PLUGIN_VARIANT:
//   0 "testcpu"             works: reads the packed format, scores with the canonical FMA chain (so its exact
//                           results equal the CPU engine's bit for bit), training forward/backward on "device"
//                           memory (host memory here)
//   1 "testcpu-badabi"      reports plugin ABI 99.0
//   2 (no entry symbol)     exports something else
//   3 "testcpu-noprobe"     probe fails like a machine without a driver
//   4 "testcpu-failcreate"  probe succeeds, create fails
//   5 "testcpu-small"       its function table is too small for ABI 1.0
// It marks every maxsim_stats it fills with docs_pruned = kMarker + (corpora alive) so tests can see where a call
// ran and that uploaded corpora are freed.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "maxsim/packed_format.h"
#include "maxsim/plugin.h"

#ifndef TEST_PLUGIN_VARIANT
#define TEST_PLUGIN_VARIANT 0
#endif

#define EXPORT extern "C" __attribute__((visibility("default")))

namespace {

constexpr uint64_t kMarker = 0xC0FFEE00ull;
int g_live_corpora = 0;

struct Sets {
  uint32_t dim = 0;
  uint64_t n_sets = 0;
  std::vector<uint64_t> offsets;
  std::vector<float> rows;  // widened to f32
  const uint64_t* ids = nullptr;
};

float Widen(const uint8_t* p, uint8_t dtype) {
  if (dtype == MAXSIM_PACK_F32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  uint32_t bits;
  if (dtype == MAXSIM_PACK_BF16) {
    bits = static_cast<uint32_t>(h) << 16;
  } else {  // f16
    const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
    if (exp == 0) {
      const float m = static_cast<float>(man) * 5.9604644775390625e-8f;
      return sign ? -m : m;
    }
    bits = exp == 31 ? (sign | 0x7F800000u | (man << 13)) : (sign | ((exp + 112) << 23) | (man << 13));
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

Sets ReadPacked(const void* buffer) {
  const auto* b = static_cast<const uint8_t*>(buffer);
  maxsim_pack_header h;
  std::memcpy(&h, b, sizeof(h));
  Sets s;
  s.dim = h.dim;
  s.n_sets = h.n_sets;
  const auto* off = reinterpret_cast<const uint64_t*>(b + h.regions[MAXSIM_REGION_OFFSETS].offset);
  s.offsets.assign(off, off + h.n_sets + 1);
  s.rows.resize(h.n_vectors * h.dim);
  const uint8_t* orig = b + h.regions[MAXSIM_REGION_ORIGINALS].offset;
  const uint32_t elem = h.orig_dtype == MAXSIM_PACK_F32 ? 4 : 2;
  for (uint64_t r = 0; r < h.n_vectors; ++r) {
    for (uint32_t k = 0; k < h.dim; ++k) s.rows[r * h.dim + k] = Widen(orig + r * h.orig_row_bytes + k * elem, h.orig_dtype);
  }
  return s;
}

Sets ReadDense(const maxsim_dense_sets* d) {
  Sets s;
  s.dim = d->dim;
  s.n_sets = d->n_sets;
  s.offsets.resize(d->n_sets + 1);
  for (uint64_t i = 0; i <= d->n_sets; ++i) s.offsets[i] = d->offsets ? d->offsets[i] : i * d->set_length;
  const uint64_t stride = d->row_stride ? d->row_stride : d->dim;
  const uint32_t elem = d->dtype == MAXSIM_F32 ? 4 : 2;
  const uint64_t rows = s.offsets.back();
  s.rows.resize(rows * d->dim);
  for (uint64_t r = 0; r < rows; ++r) {
    for (uint32_t k = 0; k < d->dim; ++k) {
      s.rows[r * d->dim + k] =
          Widen(static_cast<const uint8_t*>(d->data) + (r * stride + k) * elem, static_cast<uint8_t>(d->dtype));
    }
  }
  return s;
}

float Norm(const float* v, uint32_t dim) {
  double n = 0;
  for (uint32_t k = 0; k < dim; ++k) n += static_cast<double>(v[k]) * v[k];
  return static_cast<float>(std::sqrt(n));
}

// Same conventions and arithmetic as the CPU engine (exact mode).
float ScorePair(const Sets& q, uint64_t i, const Sets& d, uint64_t j, maxsim_metric metric, int32_t* argmax) {
  const uint64_t q0 = q.offsets[i], lq = q.offsets[i + 1] - q0, d0 = d.offsets[j], ld = d.offsets[j + 1] - d0;
  if (ld == 0 || lq == 0) {
    if (argmax) for (uint64_t s = 0; s < lq; ++s) argmax[s] = -1;
    return ld == 0 ? -std::numeric_limits<float>::infinity() : 0.0f;
  }
  double sum = 0;
  for (uint64_t s = 0; s < lq; ++s) {
    const float* qv = &q.rows[(q0 + s) * q.dim];
    float best = -std::numeric_limits<float>::infinity();
    int32_t arg = -1;
    for (uint64_t t = 0; t < ld; ++t) {
      const float* dv = &d.rows[(d0 + t) * d.dim];
      float acc = 0.0f;
      for (uint32_t k = 0; k < q.dim; ++k) acc = std::fma(qv[k], dv[k], acc);
      if (metric == MAXSIM_METRIC_COSINE) {
        const float n = Norm(dv, d.dim);
        acc = acc * (n >= 0x1p-126f ? 1.0f / n : 0.0f);
      }
      if (acc > best) {
        best = acc;
        arg = static_cast<int32_t>(t);
      }
    }
    if (metric == MAXSIM_METRIC_COSINE) {
      const float n = Norm(qv, q.dim);
      best = best * (n >= 0x1p-126f ? 1.0f / n : 0.0f);
    }
    sum += best;
    if (argmax) argmax[s] = arg;
  }
  return static_cast<float>(sum);
}

void Mark(maxsim_stats* st) {
  if (st) {
    std::memset(st, 0, sizeof(*st));
    st->docs_pruned = kMarker + static_cast<uint64_t>(g_live_corpora);
  }
}

struct Backend {
  int calls = 0;
};

maxsim_status Probe(const maxsim_plugin_host* host, char* info, size_t cap) {
  if (TEST_PLUGIN_VARIANT == 3) {
    std::snprintf(info, cap, "no test device (simulated: driver missing)");
    return MAXSIM_ERR_BACKEND_UNAVAILABLE;
  }
  std::snprintf(info, cap, "test device (host memory), variant %d", TEST_PLUGIN_VARIANT);
  return MAXSIM_OK;
}

maxsim_status Create(const maxsim_plugin_host* host, maxsim_plugin_backend** out, char* err, size_t cap) {
  if (TEST_PLUGIN_VARIANT == 4) {
    std::snprintf(err, cap, "simulated device initialisation failure");
    return MAXSIM_ERR_PLUGIN;
  }
  host->log(host->host_data, MAXSIM_LOG_DEBUG, "test plugin: backend created");
  *out = reinterpret_cast<maxsim_plugin_backend*>(new Backend);
  return MAXSIM_OK;
}

void Destroy(maxsim_plugin_backend* b) { delete reinterpret_cast<Backend*>(b); }

uint64_t MinAutoOps(maxsim_plugin_backend*) { return 1000; }

maxsim_status Upload(maxsim_plugin_backend*, const void* packed, uint64_t size, maxsim_plugin_corpus** out, char*, size_t) {
  *out = reinterpret_cast<maxsim_plugin_corpus*>(new Sets(ReadPacked(packed)));
  ++g_live_corpora;
  return MAXSIM_OK;
}

void FreeCorpus(maxsim_plugin_backend*, maxsim_plugin_corpus* c) {
  delete reinterpret_cast<Sets*>(c);
  --g_live_corpora;
}

maxsim_status Matrix(maxsim_plugin_backend*, const maxsim_plugin_score_args* a, char*, size_t) {
  const Sets q = ReadPacked(a->queries);
  const Sets& d = *reinterpret_cast<const Sets*>(a->corpus);
  uint64_t o = 0;
  for (uint64_t i = 0; i < q.n_sets; ++i) {
    const uint64_t lq = q.offsets[i + 1] - q.offsets[i];
    for (uint64_t j = 0; j < d.n_sets; ++j) {
      a->scores[i * d.n_sets + j] = ScorePair(q, i, d, j, a->metric, a->argmax ? a->argmax + d.n_sets * o + j * lq : nullptr);
    }
    o += lq;
  }
  Mark(a->stats);
  return MAXSIM_OK;
}

maxsim_status Candidates(maxsim_plugin_backend*, const maxsim_plugin_score_args* a, char*, size_t) {
  const Sets q = ReadPacked(a->queries);
  const Sets& d = *reinterpret_cast<const Sets*>(a->corpus);
  uint64_t base = 0;
  for (uint64_t i = 0; i < q.n_sets; ++i) {
    const uint64_t lq = q.offsets[i + 1] - q.offsets[i];
    for (uint64_t c = a->cand_offsets[i]; c < a->cand_offsets[i + 1]; ++c) {
      a->scores[c] = ScorePair(q, i, d, a->candidates[c], a->metric,
                               a->argmax ? a->argmax + base + (c - a->cand_offsets[i]) * lq : nullptr);
    }
    base += (a->cand_offsets[i + 1] - a->cand_offsets[i]) * lq;
  }
  Mark(a->stats);
  return MAXSIM_OK;
}

maxsim_status TopK(maxsim_plugin_backend*, const maxsim_plugin_score_args* a, char* err, size_t cap) {
  const Sets q = ReadPacked(a->queries);
  const Sets& d = *reinterpret_cast<const Sets*>(a->corpus);
  for (uint64_t i = 0; i < q.n_sets; ++i) {
    std::vector<std::pair<float, uint64_t>> all;
    for (uint64_t j = 0; j < d.n_sets; ++j) all.push_back({ScorePair(q, i, d, j, a->metric, nullptr), j});
    for (uint64_t r = 0; r < a->k; ++r) {
      // selection: best remaining by (score desc, index asc)
      size_t best = all.size();
      for (size_t e = 0; e < all.size(); ++e) {
        if (all[e].second == UINT64_MAX) continue;
        if (best == all.size() || all[e].first > all[best].first) best = e;
      }
      if (best == all.size()) {
        a->scores[i * a->k + r] = -std::numeric_limits<float>::infinity();
        a->topk_index[i * a->k + r] = UINT64_MAX;
      } else {
        a->scores[i * a->k + r] = all[best].first;
        a->topk_index[i * a->k + r] = all[best].second;
        all[best].second = UINT64_MAX;
      }
    }
  }
  Mark(a->stats);
  return MAXSIM_OK;
}

maxsim_status TrainForward(maxsim_plugin_backend*, const maxsim_plugin_train_args* a, char* err, size_t cap) {
  if (a->queries->mask || a->documents->mask) {
    std::snprintf(err, cap, "the test plugin does not implement masks");
    return MAXSIM_ERR_UNSUPPORTED;
  }
  const Sets q = ReadDense(a->queries), d = ReadDense(a->documents);
  uint64_t o = 0, base = 0;
  for (uint64_t i = 0; i < q.n_sets; ++i) {
    const uint64_t lq = q.offsets[i + 1] - q.offsets[i];
    if (a->layout == MAXSIM_LAYOUT_MATRIX) {
      for (uint64_t j = 0; j < d.n_sets; ++j) {
        a->scores[i * d.n_sets + j] = ScorePair(q, i, d, j, a->metric, a->argmax ? a->argmax + d.n_sets * o + j * lq : nullptr);
      }
    } else {
      for (uint64_t c = a->cand_offsets[i]; c < a->cand_offsets[i + 1]; ++c) {
        a->scores[c] = ScorePair(q, i, d, a->candidates[c], a->metric,
                                 a->argmax ? a->argmax + base + (c - a->cand_offsets[i]) * lq : nullptr);
      }
      base += (a->cand_offsets[i + 1] - a->cand_offsets[i]) * lq;
    }
    o += lq;
  }
  if (a->peak_extra_bytes) *a->peak_extra_bytes = 0;
  return MAXSIM_OK;
}

maxsim_status TrainBackward(maxsim_plugin_backend*, const maxsim_plugin_train_args* a, char* err, size_t cap) {
  if (a->layout != MAXSIM_LAYOUT_MATRIX) {
    std::snprintf(err, cap, "the test plugin's backward implements the matrix layout only");
    return MAXSIM_ERR_UNSUPPORTED;
  }
  const Sets q = ReadDense(a->queries), d = ReadDense(a->documents);
  const uint32_t dim = q.dim;
  std::vector<double> gq(q.rows.size(), 0.0), gd(d.rows.size(), 0.0);
  uint64_t o = 0;
  for (uint64_t i = 0; i < q.n_sets; ++i) {
    const uint64_t lq = q.offsets[i + 1] - q.offsets[i];
    for (uint64_t j = 0; j < d.n_sets; ++j) {
      const double g = a->grad_scores[i * d.n_sets + j];
      for (uint64_t s = 0; s < lq; ++s) {
        const int32_t t = a->argmax[d.n_sets * o + j * lq + s];
        if (t < 0) continue;
        const uint64_t qr = q.offsets[i] + s, dr = d.offsets[j] + static_cast<uint64_t>(t);
        for (uint32_t k = 0; k < dim; ++k) {
          gq[qr * dim + k] += g * d.rows[dr * dim + k];
          gd[dr * dim + k] += g * q.rows[qr * dim + k];
        }
      }
    }
    o += lq;
  }
  if (a->grad_queries) for (size_t e = 0; e < gq.size(); ++e) a->grad_queries[e] = static_cast<float>(gq[e]);
  if (a->grad_documents) for (size_t e = 0; e < gd.size(); ++e) a->grad_documents[e] = static_cast<float>(gd[e]);
  return MAXSIM_OK;
}

const maxsim_plugin_api kApi = {
    TEST_PLUGIN_VARIANT == 1 ? 99u : MAXSIM_PLUGIN_ABI_MAJOR,
    MAXSIM_PLUGIN_ABI_MINOR,
    TEST_PLUGIN_VARIANT == 5 ? 16u : static_cast<uint32_t>(sizeof(maxsim_plugin_api)),
    TEST_PLUGIN_VARIANT == 1   ? "testcpu-badabi"
    : TEST_PLUGIN_VARIANT == 3 ? "testcpu-noprobe"
    : TEST_PLUGIN_VARIANT == 4 ? "testcpu-failcreate"
    : TEST_PLUGIN_VARIANT == 5 ? "testcpu-small"
                               : "testcpu",
    "CPU test plugin",
    &Probe,
    &Create,
    &Destroy,
    &MinAutoOps,
    &Upload,
    &FreeCorpus,
    &Matrix,
    &Candidates,
    &TopK,
    &TrainForward,
    &TrainBackward,
};

}  // namespace

#if TEST_PLUGIN_VARIANT == 2
EXPORT const maxsim_plugin_api* not_the_entry_point(void) { return &kApi; }
#else
EXPORT const maxsim_plugin_api* maxsim_plugin_entry(void) { return &kApi; }
#endif
