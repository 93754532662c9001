// SPDX-License-Identifier: Apache-2.0
// The WebAssembly module's exports for JavaScript (web/maxsim.mjs): the C API with flat arguments (no structs
// to lay out from JavaScript), plus 64-byte aligned allocation. Only these names are exported, so the linker
// drops everything they do not reach. Every function returns a maxsim_status; the message is maxsim_last_error.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "maxsim/maxsim.h"

#define MJS_EXPORT(name) extern "C" __attribute__((export_name(#name), visibility("default")))

namespace {

maxsim_dense_sets Dense(const void* data, int32_t dtype, uint32_t dim, uint32_t n_sets, const uint64_t* offsets) {
  maxsim_dense_sets d;
  std::memset(&d, 0, sizeof(d));
  d.struct_size = sizeof(d);
  d.memory = MAXSIM_MEMORY_HOST;
  d.data = data;
  d.dtype = static_cast<maxsim_dtype>(dtype);
  d.dim = dim;
  d.n_sets = n_sets;
  d.offsets = offsets;
  return d;
}

maxsim_score_options Options(int32_t metric, int32_t mode, maxsim_stats* stats) {
  maxsim_score_options o;
  maxsim_score_options_init(&o);
  o.metric = static_cast<maxsim_metric>(metric);
  o.mode = static_cast<maxsim_mode>(mode);
  o.stats = stats;
  return o;
}

}  // namespace

MJS_EXPORT(mjs_alloc) void* mjs_alloc(uint32_t bytes) {
  return std::aligned_alloc(64, (static_cast<size_t>(bytes) + 63) / 64 * 64 + (bytes == 0 ? 64 : 0));
}
MJS_EXPORT(mjs_free) void mjs_free(void* p) { std::free(p); }
MJS_EXPORT(mjs_last_error) const char* mjs_last_error() { return maxsim_last_error(); }
MJS_EXPORT(mjs_version) const char* mjs_version() { return maxsim_version_string(); }

// isa: NULL or "" for the best kernel this module offers.
MJS_EXPORT(mjs_context_create) int32_t mjs_context_create(const char* isa, maxsim_context** out) {
  maxsim_options o;
  maxsim_options_init(&o);
  o.num_threads = 1;
  o.backend = "cpu";  // plugins: the stub host, so that the report says "no plugins in this build"
  o.isa = isa;
  return maxsim_context_create(&o, out);
}
MJS_EXPORT(mjs_context_destroy) void mjs_context_destroy(maxsim_context* ctx) { maxsim_context_destroy(ctx); }
MJS_EXPORT(mjs_context_kernel) const char* mjs_context_kernel(const maxsim_context* ctx) {
  return maxsim_context_kernel(ctx);
}
// The context's report in a buffer the caller frees with mjs_free (*out; NULL on failure).
MJS_EXPORT(mjs_context_report) int32_t mjs_context_report(const maxsim_context* ctx, char** out) {
  size_t needed = 0;
  *out = nullptr;
  maxsim_status s = maxsim_context_report(ctx, nullptr, 0, &needed);
  if (s != MAXSIM_OK && s != MAXSIM_ERR_BUFFER_TOO_SMALL) return s;
  char* text = static_cast<char*>(std::malloc(needed));
  if (!text) return MAXSIM_ERR_OUT_OF_MEMORY;
  s = maxsim_context_report(ctx, text, needed, nullptr);
  if (s != MAXSIM_OK) {
    std::free(text);
    return s;
  }
  *out = text;
  return MAXSIM_OK;
}
MJS_EXPORT(mjs_kernel_count) uint32_t mjs_kernel_count() { return static_cast<uint32_t>(maxsim_kernel_count()); }
MJS_EXPORT(mjs_kernel_name) const char* mjs_kernel_name(uint32_t i) { return maxsim_kernel_name(i); }
MJS_EXPORT(mjs_kernel_available) int32_t mjs_kernel_available(uint32_t i, const char** reason) {
  return maxsim_kernel_available(i, reason);
}

MJS_EXPORT(mjs_pack) int32_t mjs_pack(maxsim_context* ctx, const void* data, int32_t dtype, uint32_t dim,
                                      uint32_t n_sets, const uint64_t* offsets, const uint64_t* ids,
                                      maxsim_packed** out) {
  const maxsim_dense_sets d = Dense(data, dtype, dim, n_sets, offsets);
  return maxsim_pack(ctx, &d, ids, out);
}
// Validates and wraps `buffer` (64-byte aligned, from mjs_alloc), which the caller keeps until release.
MJS_EXPORT(mjs_open) int32_t mjs_open(const void* buffer, uint32_t size, int32_t level, maxsim_packed** out) {
  return maxsim_packed_open(buffer, size, static_cast<maxsim_validation>(level), out);
}
MJS_EXPORT(mjs_release) void mjs_release(maxsim_packed* p) { maxsim_packed_release(p); }
// out[0..8]: n_sets, n_vectors, dim, dtype, has_ids, size, data, offsets, ids (pointers as addresses).
MJS_EXPORT(mjs_describe) int32_t mjs_describe(const maxsim_packed* p, double* out) {
  maxsim_packed_desc d;
  const maxsim_status s = maxsim_packed_describe(p, &d);
  if (s != MAXSIM_OK) return s;
  out[0] = static_cast<double>(d.n_sets);
  out[1] = static_cast<double>(d.n_vectors);
  out[2] = d.dim;
  out[3] = d.dtype;
  out[4] = d.has_ids;
  out[5] = static_cast<double>(d.size);
  out[6] = static_cast<double>(reinterpret_cast<uintptr_t>(d.data));
  out[7] = static_cast<double>(reinterpret_cast<uintptr_t>(d.offsets));
  out[8] = static_cast<double>(reinterpret_cast<uintptr_t>(d.ids));
  return MAXSIM_OK;
}

// Queries are dense sets (n_queries sets given by offsets); documents a packed corpus. stats: NULL or 5 u64.
MJS_EXPORT(mjs_topk) int32_t mjs_topk(maxsim_context* ctx, const void* q, int32_t dtype, uint32_t dim,
                                      uint32_t n_queries, const uint64_t* q_offsets, const maxsim_packed* corpus,
                                      uint32_t k, int32_t metric, int32_t mode, float* scores, uint64_t* index,
                                      uint64_t* ids, maxsim_stats* stats) {
  const maxsim_dense_sets qd = Dense(q, dtype, dim, n_queries, q_offsets);
  const maxsim_sets qs{nullptr, &qd}, ds{corpus, nullptr};
  const maxsim_score_options o = Options(metric, mode, stats);
  return maxsim_topk(ctx, &qs, &ds, k, &o, scores, index, ids);
}
MJS_EXPORT(mjs_score_matrix) int32_t mjs_score_matrix(maxsim_context* ctx, const void* q, int32_t dtype,
                                                      uint32_t dim, uint32_t n_queries, const uint64_t* q_offsets,
                                                      const maxsim_packed* corpus, int32_t metric, int32_t mode,
                                                      float* scores, maxsim_stats* stats) {
  const maxsim_dense_sets qd = Dense(q, dtype, dim, n_queries, q_offsets);
  const maxsim_sets qs{nullptr, &qd}, ds{corpus, nullptr};
  const maxsim_score_options o = Options(metric, mode, stats);
  return maxsim_score_matrix(ctx, &qs, &ds, &o, scores, nullptr);
}
