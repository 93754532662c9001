// SPDX-License-Identifier: Apache-2.0
// What the plugin tests share: a log sink that keeps the library's lines, context options that load plugins from
// one path, and the check of a score matrix written into a column range (ABI 1.3).
#ifndef MAXSIM_TESTS_PLUGIN_TEST_UTIL_H_
#define MAXSIM_TESTS_PLUGIN_TEST_UTIL_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "maxsim/maxsim.h"
#include "maxsim/plugin.h"

namespace maxsim::test {

// docs_pruned = kPluginMarker + (corpora alive) in every maxsim_stats the test plugin fills.
constexpr uint64_t kPluginMarker = 0xC0FFEE00ull;

struct Log {
  maxsim_log_level min_level = MAXSIM_LOG_INFO;
  std::vector<std::string> lines;
  static void Sink(void* user, maxsim_log_level level, const char* message) {
    Log* log = static_cast<Log*>(user);
    if (level >= log->min_level) log->lines.push_back(message);
  }
  size_t Count(const std::string& part) const {
    size_t n = 0;
    for (const auto& l : lines) n += l.find(part) != std::string::npos;
    return n;
  }
};

// Options loading plugins from `path` (':'-separated folders or files; must outlive the context's creation).
inline maxsim_options PluginOptions(const std::string& path, const char* backend, Log* log) {
  maxsim_options o;
  maxsim_options_init(&o);
  o.plugin_path = path.c_str();
  o.backend = backend;
  o.num_threads = 2;
  o.log = &Log::Sink;
  o.log_user_data = log;
  return o;
}

// ABI 1.3 column ranges (MAXSIM_PLUGIN_OUTPUT_MATRIX_COLUMNS), as every device of a sharded call writes its part
// of the caller's matrix: calls the plugin's own score_matrix on device slot 0 of `ctx` (a context running on a
// plugin) for `queries` against `corpus`, once into a dense matrix and once into columns [3, 3 + nd) of a matrix
// of nd + 7 columns whose scores and argmax are pre-filled with sentinels. Returns "" when those columns hold the
// dense call's bits and every other element still holds its sentinel, else what differs. *takes says whether the
// plugin declares the layout (nothing runs when it does not).
inline std::string MatrixColumnsMismatch(maxsim_context* ctx, const maxsim_packed* queries, const maxsim_packed* corpus,
                                         maxsim_metric metric, maxsim_mode mode, bool* takes) {
  *takes = false;
  const maxsim_plugin_api* api = nullptr;
  maxsim_plugin_backend* backend = nullptr;
  if (maxsim_context_plugin(ctx, 0, &api, &backend) != MAXSIM_OK) return std::string("no plugin: ") + maxsim_last_error();
  *takes = MAXSIM_PLUGIN_HAS_FIELD(api, output_layouts) &&
           (api->output_layouts & MAXSIM_PLUGIN_OUTPUT_MATRIX_COLUMNS) != 0;
  if (!*takes) return "";
  if (!MAXSIM_PLUGIN_HAS(api, corpus_upload_view) || api->corpus_free == nullptr || api->score_matrix == nullptr) {
    return "the plugin declares column ranges but lacks corpus_upload_view, corpus_free or score_matrix";
  }
  maxsim_packed_desc qd{}, dd{};
  maxsim_packed_view qv{}, dv{};
  if (maxsim_packed_describe(queries, &qd) != MAXSIM_OK || maxsim_packed_describe(corpus, &dd) != MAXSIM_OK ||
      maxsim_packed_plugin_view(queries, 0, qd.n_sets, &qv) != MAXSIM_OK ||
      maxsim_packed_plugin_view(corpus, 0, dd.n_sets, &dv) != MAXSIM_OK) {
    return std::string("views: ") + maxsim_last_error();
  }
  char err[1024] = {};
  maxsim_plugin_corpus* pc = nullptr;
  if (api->corpus_upload_view(backend, &dv, &pc, err, sizeof(err)) != MAXSIM_OK) {
    return std::string("corpus_upload_view: ") + err;
  }
  const uint64_t nq = qv.n_sets, nd = dv.n_sets, rows = qv.n_rows, c0 = 3, ld = nd + 7;
  maxsim_plugin_score_args a{};
  a.struct_size = sizeof(a);
  a.metric = metric;
  a.mode = mode;
  a.queries = qd.data;
  a.queries_size = qd.size;
  a.corpus = pc;
  a.query_view = &qv;
  std::vector<float> dense(nq * nd);
  std::vector<int32_t> dense_am(rows * nd);
  a.scores = dense.data();
  a.argmax = dense_am.data();
  std::string out;
  if (api->score_matrix(backend, &a, err, sizeof(err)) != MAXSIM_OK) out = std::string("dense call: ") + err;
  float fill;
  const uint32_t fill_bits = 0x7FC5EA7Du;  // a NaN no plugin writes
  std::memcpy(&fill, &fill_bits, 4);
  const int32_t afill = 0x5EA7ED;
  std::vector<float> wide(nq * ld, fill);
  std::vector<int32_t> wide_am(rows * ld, afill);
  a.scores = wide.data();
  a.argmax = wide_am.data();
  a.matrix_columns = ld;
  a.matrix_first_column = c0;
  if (out.empty() && api->score_matrix(backend, &a, err, sizeof(err)) != MAXSIM_OK) out = std::string("columns call: ") + err;
  api->corpus_free(backend, pc);
  if (!out.empty()) return out;
  uint64_t o = 0;  // query tokens before set i
  for (uint64_t i = 0; i < nq; ++i) {
    const uint64_t lq = qv.offsets[i + 1] - qv.offsets[i];
    for (uint64_t col = 0; col < ld; ++col) {
      const bool mine = col >= c0 && col < c0 + nd;
      const float* want = mine ? &dense[i * nd + col - c0] : &fill;
      if (std::memcmp(&wide[i * ld + col], want, 4) != 0) {
        return "score of query " + std::to_string(i) + " in column " + std::to_string(col) + " of " +
               std::to_string(ld) + (mine ? " differs from the dense call's" : " outside columns [3, " +
                                                   std::to_string(c0 + nd) + ") was written");
      }
      for (uint64_t s = 0; s < lq; ++s) {
        const int32_t got = wide_am[ld * o + col * lq + s];
        if (got != (mine ? dense_am[nd * o + (col - c0) * lq + s] : afill)) {
          return "argmax of query " + std::to_string(i) + " token " + std::to_string(s) + " in column " +
                 std::to_string(col) + (mine ? " differs from the dense call's" : " outside its columns was written");
        }
      }
    }
    o += lq;
  }
  return "";
}

}  // namespace maxsim::test

#endif  // MAXSIM_TESTS_PLUGIN_TEST_UTIL_H_
