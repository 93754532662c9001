// SPDX-License-Identifier: Apache-2.0
// A CPU-implemented plugin that proves the plugin host. Built several times (plugins/CMakeLists.txt) with
// TEST_PLUGIN_VARIANT:
//   0 "testcpu"             works: scores the decoded packed views with the canonical FMA chain (so its exact
//                           results equal the CPU engine's bit for bit), training forward/backward on "device"
//                           memory (host memory labelled MAXSIM_MEMORY_CUDA), device-memory hooks (malloc),
//                           describe, and MAXSIM_TEST_PLUGIN_DEVICES simulated devices (default 1)
//   1 "testcpu-badabi"      reports plugin ABI 99.0
//   2 (no entry symbol)     exports something else
//   3 "testcpu-noprobe"     probe fails like a machine without a driver
//   4 "testcpu-failcreate"  probe succeeds, create fails
//   5 "testcpu-small"       its function table is too small for ABI 1.0
//   6 "testcpu-v10"         an ABI 1.0 table (no 1.1 members; parses the packed header itself, as 1.0 plugins do)
//   7 "testcpu-2dev"        as 0, on two simulated devices (the host shards corpora over them)
//   8 "testcpu-v11"         an ABI 1.1 table (no dense_query_modes: queries always arrive packed)
//   9 "testcpu-v12"         an ABI 1.2 table (no output_layouts: the host stages a sharded score matrix)
//  10 "testcpu-spill"       as 0, but a score matrix written into a column range also writes its last column's
//                           scores one column too far (an off-by-one the conformance checks must catch)
// Every 1.4 variant defers the value check of a stream-ordered training call (MAXSIM_CALL_STREAM_ORDERED): NaN
// scores / -1 argmax / NaN gradients and OK, the error kept for synchronize or the backend's next call.
// Every variant from 1.2 takes dense host queries in exact and certified modes (dense_query_modes); every 1.3
// variant writes a score matrix into a column range of a wider one (output_layouts).
// and with TEST_PLUGIN_NULL = one of the kNull* values below: as 0 with that member left NULL ("testcpu-no-*").
// It marks every maxsim_stats it fills with docs_pruned = kMarker + (corpora alive) so tests can see where a call
// ran and that uploaded corpora are freed, and with refined = 1 when a score matrix went into a column range.
#include <cmath>
#include <cstddef>
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
#ifndef TEST_PLUGIN_NULL
#define TEST_PLUGIN_NULL 0
#endif
// Members a "testcpu-no-*" variant leaves NULL.
#define kNullUpload 1          // corpus_upload and corpus_upload_view
#define kNullFree 2            // corpus_free
#define kNullMatrix 3
#define kNullCandidates 4
#define kNullTopK 5
#define kNullTrainForward 6
#define kNullTrainBackward 7
#define kNullMinOps 8          // min_auto_ops
#define kNullMemory 9          // accepted_memory = 0 (takes no device memory)
#define kNullDeviceMemory 10   // mem_alloc, mem_free, mem_copy
#define kNullDescribe 11
#define kNullSynchronize 12  // synchronize: the host never asks for a stream-ordered call
#define IF_PRESENT(id, fn) (TEST_PLUGIN_NULL == (id) ? nullptr : (fn))

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

// The 1.0 way: parse the (host-validated) header. ABI 1.1 plugins get a decoded maxsim_packed_view instead.
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

// Sets of a decoded view (which may be a shard: rows [offsets[0], offsets[n_sets]), rebased to 0 here).
Sets FromView(const maxsim_packed_view* v) {
  Sets s;
  s.dim = v->dim;
  s.n_sets = v->n_sets;
  const uint64_t r0 = v->offsets[0];
  s.offsets.resize(v->n_sets + 1);
  for (uint64_t i = 0; i <= v->n_sets; ++i) s.offsets[i] = v->offsets[i] - r0;
  s.rows.resize(v->n_rows * v->dim);
  const uint32_t elem = v->orig_dtype == MAXSIM_PACK_F32 ? 4 : 2;
  for (uint64_t r = 0; r < v->n_rows; ++r) {
    const uint8_t* row = v->originals + (r0 + r) * v->orig_row_bytes;
    for (uint32_t k = 0; k < v->dim; ++k) s.rows[r * v->dim + k] = Widen(row + k * elem, static_cast<uint8_t>(v->orig_dtype));
  }
  return s;
}

Sets ReadDense(const maxsim_dense_sets* d);

Sets Queries(const maxsim_plugin_score_args* a) {
  if (TEST_PLUGIN_VARIANT == 6) return ReadPacked(a->queries);
  if (TEST_PLUGIN_VARIANT != 8 && a->query_dense) return ReadDense(a->query_dense);
  return FromView(a->query_view);  // the 1.1 variant reads only what a 1.1 table is given
}

// ABI 1.2 dense host queries are value-unchecked: a non-finite element or a norm above 1e19 fails the call.
bool QueriesBad(const maxsim_plugin_score_args* a, const Sets& q) {
  if (TEST_PLUGIN_VARIANT == 6 || TEST_PLUGIN_VARIANT == 8 || a->query_dense == nullptr) return false;
  for (uint64_t r = 0; r < q.offsets.back(); ++r) {
    double n = 0;
    for (uint32_t k = 0; k < q.dim; ++k) {
      const float v = q.rows[r * q.dim + k];
      if (!std::isfinite(v)) return true;
      n += static_cast<double>(v) * v;
    }
    if (!(n <= 1e38)) return true;
  }
  return false;
}

Sets ReadDense(const maxsim_dense_sets* d) {
  Sets s;
  s.dim = d->dim;
  s.n_sets = d->n_sets;
  s.offsets.resize(d->n_sets + 1);
  for (uint64_t i = 0; i <= d->n_sets; ++i) s.offsets[i] = d->offsets ? d->offsets[i] : i * d->set_length;
  const uint64_t stride = d->row_stride ? d->row_stride : d->dim;
  const uint32_t elem = d->dtype == MAXSIM_F32 ? 4 : 2;
  // Rows [offsets[0], offsets[n_sets]), rebased to 0.
  const uint64_t first = s.offsets[0];
  for (uint64_t& o : s.offsets) o -= first;
  const uint64_t rows = s.offsets.back();
  s.rows.resize(rows * d->dim);
  for (uint64_t r = 0; r < rows; ++r) {
    for (uint32_t k = 0; k < d->dim; ++k) {
      s.rows[r * d->dim + k] = Widen(static_cast<const uint8_t*>(d->data) + ((first + r) * stride + k) * elem,
                                     static_cast<uint8_t>(d->dtype));
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

// Marks a call's stats: docs_pruned = kMarker + (corpora alive); multi_candidate = kDenseMarker when the queries
// arrived dense (ABI 1.2 query_dense), else 0; refined = 1 when a score matrix went into a column range.
constexpr uint64_t kDenseMarker = 0xD15Eull;
void Mark(const maxsim_plugin_score_args* a, bool columns = false) {
  if (maxsim_stats* st = a->stats) {
    std::memset(st, 0, sizeof(*st));
    st->docs_pruned = kMarker + static_cast<uint64_t>(g_live_corpora);
    if (TEST_PLUGIN_VARIANT != 6 && a->query_dense) st->multi_candidate = kDenseMarker;
    st->refined = columns ? 1 : 0;
  }
}

// ABI 1.3: the column range of a wider matrix that score_matrix writes (a table that declares output_layouts
// and arguments that carry the fields; the older variants read only what their ABI has).
constexpr bool kTakesColumns = TEST_PLUGIN_VARIANT != 6 && TEST_PLUGIN_VARIANT != 8 && TEST_PLUGIN_VARIANT != 9;
bool MatrixColumns(const maxsim_plugin_score_args* a, uint64_t nd, uint64_t* ld, uint64_t* c0) {
  *ld = nd;
  *c0 = 0;
  if (!kTakesColumns ||
      a->struct_size < offsetof(maxsim_plugin_score_args, matrix_first_column) + sizeof(a->matrix_first_column) ||
      a->matrix_columns == 0) {
    return false;
  }
  *ld = a->matrix_columns;
  *c0 = a->matrix_first_column;
  return true;
}

struct Backend {
  uint32_t device = 0, devices = 1;
  maxsim_status deferred = MAXSIM_OK;  // the first failed stream-ordered call's error, not yet reported
  char deferred_message[512] = {};
};

// Whether a training call may defer its value check (the host sets the flag only where synchronize exists).
bool StreamOrdered(const maxsim_plugin_train_args* a) {
  return a->struct_size >= offsetof(maxsim_plugin_train_args, call) + sizeof(a->call) &&
         (a->flags & MAXSIM_CALL_STREAM_ORDERED) != 0;
}

// Hands over (once) the error a stream-ordered call left: what synchronize and every operation do first.
maxsim_status TakeDeferred(maxsim_plugin_backend* backend, char* err, size_t cap) {
  Backend* b = reinterpret_cast<Backend*>(backend);
  const maxsim_status code = b->deferred;
  if (code != MAXSIM_OK) std::snprintf(err, cap, "%s", b->deferred_message);
  b->deferred = MAXSIM_OK;
  return code;
}

// A failed value check: returned now, or for a stream-ordered call kept (the first one) with the call named.
maxsim_status FailValues(maxsim_plugin_backend* backend, const maxsim_plugin_train_args* a, maxsim_status code,
                         const char* message, char* err, size_t cap) {
  if (!StreamOrdered(a)) {
    std::snprintf(err, cap, "%s", message);
    return code;
  }
  Backend* b = reinterpret_cast<Backend*>(backend);
  if (b->deferred == MAXSIM_OK) {
    b->deferred = code;
    std::snprintf(b->deferred_message, sizeof(b->deferred_message), "%s (stream-ordered): %s",
                  a->call ? a->call : "a call", message);
  }
  return MAXSIM_OK;
}

// The first row of s with a non-finite element or an L2 norm above 1e19, as "set S token T"; false when none.
bool FirstBadRow(const Sets& s, const char* role, char* out, size_t cap) {
  for (uint64_t i = 0; i < s.n_sets; ++i) {
    for (uint64_t r = s.offsets[i]; r < s.offsets[i + 1]; ++r) {
      double n = 0;
      bool finite = true;
      for (uint32_t k = 0; k < s.dim; ++k) {
        const float v = s.rows[r * s.dim + k];
        finite = finite && std::isfinite(v);
        n += static_cast<double>(v) * v;
      }
      if (!finite || !(n <= 1e38)) {
        std::snprintf(out, cap, "%s: set %llu token %llu has a non-finite value or an L2 norm above 1e19", role,
                      static_cast<unsigned long long>(i), static_cast<unsigned long long>(r - s.offsets[i]));
        return true;
      }
    }
  }
  return false;
}

// Simulated devices: the entries of the context's device list (maxsim_options.devices), else
// MAXSIM_TEST_PLUGIN_DEVICES (default 1), or 2 for the "testcpu-2dev" variant.
uint32_t DeviceCount(const maxsim_plugin_host* host) {
  if (host->struct_size >= offsetof(maxsim_plugin_host, devices) + sizeof(host->devices) && host->devices &&
      host->devices[0]) {
    uint32_t n = 1;
    for (const char* p = host->devices; *p; ++p) n += *p == ',';
    return n;
  }
  if (TEST_PLUGIN_VARIANT == 7) return 2;
  const char* e = std::getenv("MAXSIM_TEST_PLUGIN_DEVICES");
  const long n = e ? std::strtol(e, nullptr, 10) : 1;
  return n < 1 ? 1u : n > 16 ? 16u : static_cast<uint32_t>(n);
}

maxsim_status Probe(const maxsim_plugin_host* host, char* info, size_t cap) {
  if (TEST_PLUGIN_VARIANT == 3) {
    std::snprintf(info, cap, "no test device (simulated: driver missing)");
    return MAXSIM_ERR_BACKEND_UNAVAILABLE;
  }
  std::snprintf(info, cap, "test device (host memory), variant %d", TEST_PLUGIN_VARIANT);
  return MAXSIM_OK;
}

maxsim_status CreateDevice(const maxsim_plugin_host* host, uint32_t index, maxsim_plugin_backend** out, char* err,
                           size_t cap) {
  if (TEST_PLUGIN_VARIANT == 4) {
    std::snprintf(err, cap, "simulated device initialisation failure");
    return MAXSIM_ERR_PLUGIN;
  }
  const uint32_t n = DeviceCount(host);
  if (index >= n) {
    std::snprintf(err, cap, "device slot %u of %u", index, n);
    return MAXSIM_ERR_INVALID_ARGUMENT;
  }
  char line[80];
  std::snprintf(line, sizeof(line), "test plugin: backend created on device %u of %u", index, n);
  host->log(host->host_data, MAXSIM_LOG_DEBUG, line);
  *out = reinterpret_cast<maxsim_plugin_backend*>(new Backend{index, n});
  return MAXSIM_OK;
}

maxsim_status Create(const maxsim_plugin_host* host, maxsim_plugin_backend** out, char* err, size_t cap) {
  return CreateDevice(host, 0, out, err, cap);
}

void Destroy(maxsim_plugin_backend* b) { delete reinterpret_cast<Backend*>(b); }

uint64_t MinAutoOps(maxsim_plugin_backend*) { return 1000; }

// Exact and certified scores are the FMA chain's on the originals either way: both take dense host queries.
uint32_t DenseQueryModes(maxsim_plugin_backend*) { return (1u << MAXSIM_MODE_EXACT) | (1u << MAXSIM_MODE_CERTIFIED); }

maxsim_status Upload(maxsim_plugin_backend*, const void* packed, uint64_t size, maxsim_plugin_corpus** out, char*, size_t) {
  *out = reinterpret_cast<maxsim_plugin_corpus*>(new Sets(ReadPacked(packed)));
  ++g_live_corpora;
  return MAXSIM_OK;
}

maxsim_status UploadView(maxsim_plugin_backend*, const maxsim_packed_view* v, maxsim_plugin_corpus** out, char* err,
                         size_t cap) {
  if (v->struct_size < sizeof(maxsim_packed_view)) {
    std::snprintf(err, cap, "maxsim_packed_view.struct_size %u is too small", v->struct_size);
    return MAXSIM_ERR_INVALID_ARGUMENT;
  }
  *out = reinterpret_cast<maxsim_plugin_corpus*>(new Sets(FromView(v)));
  ++g_live_corpora;
  return MAXSIM_OK;
}

void FreeCorpus(maxsim_plugin_backend*, maxsim_plugin_corpus* c) {
  delete reinterpret_cast<Sets*>(c);
  --g_live_corpora;
}

// "Device" memory is host memory here; the hooks still go through the ABI as a real device's would.
maxsim_status MemAlloc(maxsim_plugin_backend*, uint64_t bytes, void** out, char* err, size_t cap) {
  *out = std::malloc(bytes ? bytes : 1);
  if (*out == nullptr) {
    std::snprintf(err, cap, "cannot allocate %llu bytes", static_cast<unsigned long long>(bytes));
    return MAXSIM_ERR_OUT_OF_MEMORY;
  }
  return MAXSIM_OK;
}

void MemFree(maxsim_plugin_backend*, void* p) { std::free(p); }

maxsim_status MemCopy(maxsim_plugin_backend*, void* dst, const void* src, uint64_t bytes, maxsim_plugin_copy_kind,
                      char*, size_t) {
  if (bytes) std::memcpy(dst, src, bytes);
  return MAXSIM_OK;
}

void Describe(maxsim_plugin_backend* b, char* out, size_t cap) {
  const Backend* be = reinterpret_cast<const Backend*>(b);
  std::snprintf(out, cap, "test device %u of %u (MAXSIM_TEST_PLUGIN_DEVICES)\nrows scored with the f32 FMA chain",
                be->device, be->devices);
}

maxsim_status Matrix(maxsim_plugin_backend* b, const maxsim_plugin_score_args* a, char* err, size_t cap) {
  if (const maxsim_status d = TakeDeferred(b, err, cap); d != MAXSIM_OK) return d;
  const Sets q = Queries(a);
  if (QueriesBad(a, q)) {
    std::snprintf(err, cap, "queries: a token is non-finite or its norm exceeds 1e19");
    return MAXSIM_ERR_NON_FINITE;
  }
  const Sets& d = *reinterpret_cast<const Sets*>(a->corpus);
  uint64_t ld, c0;
  const bool columns = MatrixColumns(a, d.n_sets, &ld, &c0);
  if (c0 > ld || d.n_sets > ld - c0) {
    std::snprintf(err, cap, "columns [%llu, +%llu) of a %llu-column matrix", static_cast<unsigned long long>(c0),
                  static_cast<unsigned long long>(d.n_sets), static_cast<unsigned long long>(ld));
    return MAXSIM_ERR_INVALID_ARGUMENT;
  }
  uint64_t o = 0;
  for (uint64_t i = 0; i < q.n_sets; ++i) {
    const uint64_t lq = q.offsets[i + 1] - q.offsets[i];
    for (uint64_t j = 0; j < d.n_sets; ++j) {
      a->scores[i * ld + c0 + j] =
          ScorePair(q, i, d, j, a->metric, a->argmax ? a->argmax + ld * o + (c0 + j) * lq : nullptr);
    }
    if (TEST_PLUGIN_VARIANT == 10 && columns && d.n_sets > 0 && c0 + d.n_sets < ld) {
      a->scores[i * ld + c0 + d.n_sets] = a->scores[i * ld + c0 + d.n_sets - 1];
    }
    o += lq;
  }
  Mark(a, columns);
  return MAXSIM_OK;
}

maxsim_status Candidates(maxsim_plugin_backend* b, const maxsim_plugin_score_args* a, char* err, size_t cap) {
  if (const maxsim_status d = TakeDeferred(b, err, cap); d != MAXSIM_OK) return d;
  const Sets q = Queries(a);
  if (QueriesBad(a, q)) {
    std::snprintf(err, cap, "queries: a token is non-finite or its norm exceeds 1e19");
    return MAXSIM_ERR_NON_FINITE;
  }
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
  Mark(a);
  return MAXSIM_OK;
}

maxsim_status TopK(maxsim_plugin_backend* b, const maxsim_plugin_score_args* a, char* err, size_t cap) {
  if (const maxsim_status d = TakeDeferred(b, err, cap); d != MAXSIM_OK) return d;
  const Sets q = Queries(a);
  if (QueriesBad(a, q)) {
    std::snprintf(err, cap, "queries: a token is non-finite or its norm exceeds 1e19");
    return MAXSIM_ERR_NON_FINITE;
  }
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
  Mark(a);
  return MAXSIM_OK;
}

maxsim_status TrainForward(maxsim_plugin_backend* b, const maxsim_plugin_train_args* a, char* err, size_t cap) {
  if (const maxsim_status code = TakeDeferred(b, err, cap); code != MAXSIM_OK) return code;
  if (a->queries->mask || a->documents->mask) {
    std::snprintf(err, cap, "the test plugin does not implement masks");
    return MAXSIM_ERR_UNSUPPORTED;
  }
  const Sets q = ReadDense(a->queries), d = ReadDense(a->documents);
  char bad[256];
  if (FirstBadRow(q, "queries", bad, sizeof(bad)) || FirstBadRow(d, "documents", bad, sizeof(bad))) {
    // Nothing the caller could take for an answer: scores NaN, argmax -1 (the layout's sizes).
    uint64_t pairs = 0, entries = 0;
    for (uint64_t i = 0; i < q.n_sets; ++i) {
      const uint64_t docs = a->layout == MAXSIM_LAYOUT_MATRIX ? d.n_sets : a->cand_offsets[i + 1] - a->cand_offsets[i];
      pairs += docs;
      entries += docs * (q.offsets[i + 1] - q.offsets[i]);
    }
    for (uint64_t e = 0; e < pairs; ++e) a->scores[e] = std::numeric_limits<float>::quiet_NaN();
    if (a->argmax) for (uint64_t e = 0; e < entries; ++e) a->argmax[e] = -1;
    return FailValues(b, a, MAXSIM_ERR_NON_FINITE, bad, err, cap);
  }
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

maxsim_status TrainBackward(maxsim_plugin_backend* b, const maxsim_plugin_train_args* a, char* err, size_t cap) {
  if (const maxsim_status code = TakeDeferred(b, err, cap); code != MAXSIM_OK) return code;
  if (a->layout != MAXSIM_LAYOUT_MATRIX) {
    std::snprintf(err, cap, "the test plugin's backward implements the matrix layout only");
    return MAXSIM_ERR_UNSUPPORTED;
  }
  const Sets q = ReadDense(a->queries), d = ReadDense(a->documents);
  const uint32_t dim = q.dim;
  for (uint64_t p = 0; p < q.n_sets * d.n_sets; ++p) {
    if (std::isfinite(a->grad_scores[p])) continue;
    // No gradient the caller could take for one: both outputs NaN.
    const float nan = std::numeric_limits<float>::quiet_NaN();
    if (a->grad_queries) for (size_t e = 0; e < q.rows.size(); ++e) a->grad_queries[e] = nan;
    if (a->grad_documents) for (size_t e = 0; e < d.rows.size(); ++e) a->grad_documents[e] = nan;
    char bad[64];
    std::snprintf(bad, sizeof(bad), "grad_scores[%llu] is not finite", static_cast<unsigned long long>(p));
    return FailValues(b, a, MAXSIM_ERR_NON_FINITE, bad, err, cap);
  }
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

constexpr const char* Name() {
  switch (TEST_PLUGIN_VARIANT) {
    case 1: return "testcpu-badabi";
    case 3: return "testcpu-noprobe";
    case 4: return "testcpu-failcreate";
    case 5: return "testcpu-small";
    case 6: return "testcpu-v10";
    case 7: return "testcpu-2dev";
    case 8: return "testcpu-v11";
    case 9: return "testcpu-v12";
    case 10: return "testcpu-spill";
    default: break;
  }
  switch (TEST_PLUGIN_NULL) {
    case kNullUpload: return "testcpu-no-upload";
    case kNullFree: return "testcpu-no-free";
    case kNullMatrix: return "testcpu-no-matrix";
    case kNullCandidates: return "testcpu-no-candidates";
    case kNullTopK: return "testcpu-no-topk";
    case kNullTrainForward: return "testcpu-no-trainfwd";
    case kNullTrainBackward: return "testcpu-no-trainbwd";
    case kNullMinOps: return "testcpu-no-minops";
    case kNullMemory: return "testcpu-no-devmem";
    case kNullDeviceMemory: return "testcpu-no-memhooks";
    case kNullDescribe: return "testcpu-no-describe";
    case kNullSynchronize: return "testcpu-no-sync";
    default: return "testcpu";
  }
}

// The ABI 1.0, 1.1 and 1.2 table sizes: what plugins built against those plugin.h versions report.
constexpr uint32_t kAbi10Size = offsetof(maxsim_plugin_api, train_backward) + sizeof(void*);
constexpr uint32_t kAbi11Size = offsetof(maxsim_plugin_api, create_device) + sizeof(void*);
constexpr uint32_t kAbi12Size = offsetof(maxsim_plugin_api, dense_query_modes) + sizeof(void*);

const maxsim_plugin_api kApi = {
    TEST_PLUGIN_VARIANT == 1 ? 99u : MAXSIM_PLUGIN_ABI_MAJOR,
    TEST_PLUGIN_VARIANT == 1 || TEST_PLUGIN_VARIANT == 6 ? 0u
    : TEST_PLUGIN_VARIANT == 8                           ? 1u
    : TEST_PLUGIN_VARIANT == 9                           ? 2u
                                                         : MAXSIM_PLUGIN_ABI_MINOR,
    TEST_PLUGIN_VARIANT == 5   ? 16u
    : TEST_PLUGIN_VARIANT == 6 ? kAbi10Size
    : TEST_PLUGIN_VARIANT == 8 ? kAbi11Size
    : TEST_PLUGIN_VARIANT == 9 ? kAbi12Size
                               : static_cast<uint32_t>(sizeof(maxsim_plugin_api)),
    Name(),
    "CPU test plugin",
    &Probe,
    &Create,
    &Destroy,
    IF_PRESENT(kNullMinOps, &MinAutoOps),
    // 1.1 plugins take views (corpus_upload_view); 1.0 ones the raw buffer.
    TEST_PLUGIN_VARIANT == 6 ? &Upload : nullptr,
    IF_PRESENT(kNullFree, &FreeCorpus),
    IF_PRESENT(kNullMatrix, &Matrix),
    IF_PRESENT(kNullCandidates, &Candidates),
    IF_PRESENT(kNullTopK, &TopK),
    IF_PRESENT(kNullTrainForward, &TrainForward),
    IF_PRESENT(kNullTrainBackward, &TrainBackward),
    // ---- ABI 1.1 (beyond struct_size for the 1.0 variant: the host must not read them) ----
    TEST_PLUGIN_NULL == kNullMemory ? 0ull : MAXSIM_MEMORY_BIT(MAXSIM_MEMORY_CUDA),
    IF_PRESENT(kNullUpload, &UploadView),
    IF_PRESENT(kNullDeviceMemory, &MemAlloc),
    IF_PRESENT(kNullDeviceMemory, &MemFree),
    IF_PRESENT(kNullDeviceMemory, &MemCopy),
    IF_PRESENT(kNullDescribe, &Describe),
    &DeviceCount,
    &CreateDevice,
    // ---- ABI 1.2 (beyond struct_size for the 1.0 and 1.1 variants) ----
    &DenseQueryModes,
    // ---- ABI 1.3 (beyond struct_size for the 1.0, 1.1 and 1.2 variants) ----
    kTakesColumns ? MAXSIM_PLUGIN_OUTPUT_MATRIX_COLUMNS : 0ull,
    // ---- ABI 1.4 (beyond struct_size for the 1.0 to 1.2 variants) ----
    IF_PRESENT(kNullSynchronize, &TakeDeferred),
};

}  // namespace

#if TEST_PLUGIN_VARIANT == 2
EXPORT const maxsim_plugin_api* not_the_entry_point(void) { return &kApi; }
#else
EXPORT const maxsim_plugin_api* maxsim_plugin_entry(void) { return &kApi; }
#endif
