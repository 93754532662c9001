// SPDX-License-Identifier: Apache-2.0
// Several GPUs through the public C API (maxsim.h): one packed corpus, resident on one device and sharded over
// several (maxsim_options.devices), host queries in, host results out, timed with the host clock (each call
// returns when its results are ready). Every timed call's results are compared with the first device list's: the
// scaling holds only where the bits are the same.
//
//   maxsim_multi_gpu_bench [--devices LIST[;LIST...]] [--docs N] [--doc-len L] [--copies C] [--reps R]
//                          [--staged] [--json FILE]
//
// Default shape: textual-10k (10000 documents of 300 bf16 tokens, d = 128) repeated 8 times (80000 documents,
// 8 shards' worth), queries of 32 tokens, one query and a batch of 64; device lists "0" and "0,1". Rows: top-10
// and the score matrix, of one query and of 64, per device list, with the speed-up over the first list. The
// first list also runs every operation on the first half of the corpus (40000 documents, the first shard of two
// devices): full / half is the speed-up that splitting the work over two devices can give at most (the bound
// column), so what two devices miss of it is the cost of running shards, not of the per-call work that does not
// shrink with the corpus. On several devices each shard writes its columns of the caller's score matrix itself
// (plugin ABI 1.3); --staged runs the last device list once more with MAXSIM_CUDA_MATRIX_COLUMNS=0, the host staging
// each shard's matrix and copying its columns into place (the path of older plugins), for comparison in the same
// run. JSON (one object per line) carries the command, the devices' names and the date.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "maxsim/maxsim.h"

namespace {

using gpu_bench_util::Median;
using gpu_bench_util::ToBf16;

FILE* g_json = nullptr;
std::string g_command;

void Die(const char* what) {
  std::fprintf(stderr, "%s failed: %s\n", what, maxsim_last_error());
  std::exit(2);
}
#define CHECK_MS(x) \
  do {              \
    if ((x) != MAXSIM_OK) Die(#x); \
  } while (0)

// Unit-norm bf16 rows from a counter-based hash (fast, reproducible, no RNG state to share between threads).
uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::vector<uint16_t> RandomRows(uint64_t rows, uint32_t dim, uint64_t seed) {
  std::vector<uint16_t> out(rows * dim);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < static_cast<int64_t>(rows); ++r) {
    std::vector<float> v(dim);
    double n = 0;
    for (uint32_t k = 0; k < dim; ++k) {
      // Sum of four uniforms: close enough to Gaussian for a benchmark, never all zero.
      const uint64_t h = Mix(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(r) * dim + k);
      float s = 0;
      for (int u = 0; u < 4; ++u) s += static_cast<float>((h >> (16 * u)) & 0xffff) / 65535.0f - 0.5f;
      v[k] = s;
      n += static_cast<double>(s) * s;
    }
    const float inv = static_cast<float>(1.0 / std::sqrt(n));
    for (uint32_t k = 0; k < dim; ++k) out[static_cast<uint64_t>(r) * dim + k] = ToBf16(v[k] * inv);
  }
  return out;
}

// Median wall time (ms) of `reps` calls after 3 warm-up calls.
double WallIt(int reps, const std::function<void()>& fn) {
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return Median(ms);
}

std::string DeviceNames() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return "no CUDA device";
  std::string names;
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    names += (names.empty() ? "" : "; ") + std::to_string(i) + ": " + p.name;
  }
  return names;
}

struct Row {
  std::string op;
  uint64_t nq = 0;
  double ms = 0;
  double half_ms = 0;  // the first device list only: the same call on the first half of the corpus
  std::vector<float> scores;
  std::vector<uint64_t> index;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> lists = {"0", "0,1"};
  uint64_t docs = 10000, doc_len = 300, copies = 8, q_len = 32;
  int reps = 20;
  bool staged = false;
  const uint32_t dim = 128;
  for (int i = 0; i < argc; ++i) g_command += (i ? " " : "") + std::string(argv[i]);
  for (int i = 1; i < argc; ++i) {
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : ""; };
    if (!std::strcmp(argv[i], "--devices")) {
      lists.clear();
      std::string all = next();
      size_t start = 0;
      while (start <= all.size()) {
        size_t end = all.find(';', start);
        if (end == std::string::npos) end = all.size();
        if (end > start) lists.push_back(all.substr(start, end - start));
        start = end + 1;
      }
    } else if (!std::strcmp(argv[i], "--docs")) docs = std::strtoull(next(), nullptr, 10);
    else if (!std::strcmp(argv[i], "--doc-len")) doc_len = std::strtoull(next(), nullptr, 10);
    else if (!std::strcmp(argv[i], "--copies")) copies = std::strtoull(next(), nullptr, 10);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(next());
    else if (!std::strcmp(argv[i], "--staged")) staged = true;
    else if (!std::strcmp(argv[i], "--json")) g_json = std::fopen(next(), "w");
    else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (lists.empty() || docs == 0 || copies == 0 || reps <= 0) {
    std::fprintf(stderr, "nothing to run\n");
    return 2;
  }
  const std::string devices = DeviceNames();
  char date[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  std::printf("devices: %s\ncorpus: %llu documents x %llu tokens x %u (bf16), %llu copies of %llu; queries of %llu "
              "tokens\n", devices.c_str(), static_cast<unsigned long long>(docs * copies),
              static_cast<unsigned long long>(doc_len), dim, static_cast<unsigned long long>(copies),
              static_cast<unsigned long long>(docs), static_cast<unsigned long long>(q_len));
  // The corpus: `docs` random documents repeated `copies` times (so copies of one document tie exactly, in
  // different shards), packed once by the library.
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<uint16_t> base = RandomRows(docs * doc_len, dim, 2);
  std::vector<uint16_t> all(base.size() * copies);
  for (uint64_t c = 0; c < copies; ++c) std::memcpy(all.data() + c * base.size(), base.data(), base.size() * 2);
  std::vector<uint16_t>().swap(base);
  maxsim_context* cpu = nullptr;
  maxsim_options co;
  maxsim_options_init(&co);
  co.backend = "cpu";
  co.load_plugins = 0;
  CHECK_MS(maxsim_context_create(&co, &cpu));
  const maxsim_dense_sets ds = gpu_bench_util::DenseSets(all.data(), MAXSIM_MEMORY_HOST, docs * copies, doc_len, dim);
  maxsim_packed* corpus = nullptr;
  CHECK_MS(maxsim_pack(cpu, &ds, nullptr, &corpus));
  maxsim_packed* half = nullptr;  // the first nd / 2 documents: the first shard of two devices
  const uint64_t nd = docs * copies, k = 10, nd_half = nd / 2;
  const maxsim_dense_sets hs = gpu_bench_util::DenseSets(all.data(), MAXSIM_MEMORY_HOST, nd_half, doc_len, dim);
  CHECK_MS(maxsim_pack(cpu, &hs, nullptr, &half));
  std::vector<uint16_t>().swap(all);
  maxsim_packed_desc desc{};
  CHECK_MS(maxsim_packed_describe(corpus, &desc));
  std::printf("packed %.2f GB (and its first half) in %.1f s\n", desc.size / 1e9,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  const std::vector<uint16_t> queries = RandomRows(64 * q_len, dim, 1);

  std::vector<std::vector<Row>> results;
  bool all_same = true;
  std::printf("%-10s %-14s %4s %10s %9s %9s %9s %s\n", "devices", "operation", "Nq", "ms", "half ms", "speed-up",
              "bound", "bits vs first");
  // Each run: a device list, and whether the plugin may write the caller's matrix columns itself.
  std::vector<std::pair<std::string, bool>> runs;
  for (const std::string& list : lists) runs.push_back({list, false});
  if (staged && lists.back().find(',') != std::string::npos) runs.push_back({lists.back(), true});
  for (const auto& run : runs) {
    const std::string& list = run.first;
    const bool stage = run.second;
    const std::string label = list + (stage ? " staged" : "");
    maxsim_options o;
    maxsim_options_init(&o);
    o.backend = "cuda";
    o.devices = list.c_str();
    maxsim_context* ctx = nullptr;
    if (stage) setenv("MAXSIM_CUDA_MATRIX_COLUMNS", "0", 1);  // read when the context loads the plugin
    const maxsim_status created = maxsim_context_create(&o, &ctx);
    if (stage) unsetenv("MAXSIM_CUDA_MATRIX_COLUMNS");
    if (created != MAXSIM_OK) {
      std::printf("%-10s skipped: %s\n", label.c_str(), maxsim_last_error());
      continue;
    }
    const bool first_list = results.empty();
    std::vector<Row> rows;
    for (uint64_t nq : {1ull, 64ull}) {
      const maxsim_dense_sets qs = gpu_bench_util::DenseSets(queries.data(), MAXSIM_MEMORY_HOST, nq, q_len, dim);
      const maxsim_sets q{nullptr, &qs};
      const int n_reps = nq == 1 ? reps : std::max(3, reps / 4);
      for (const char* op : {"topk10", "score_matrix"}) {
        Row row;
        row.op = op;
        row.nq = nq;
        const bool top = row.op == "topk10";
        // One call on `docs` documents (the first call on a corpus uploads it; warm-up calls are not timed).
        auto call = [&](maxsim_packed* c, uint64_t n_docs) {
          const maxsim_sets d{c, nullptr};
          if (top) {
            row.scores.resize(nq * k);
            row.index.resize(nq * k);
            CHECK_MS(maxsim_topk(ctx, &q, &d, k, nullptr, row.scores.data(), row.index.data(), nullptr));
          } else {
            row.scores.resize(nq * n_docs);
            CHECK_MS(maxsim_score_matrix(ctx, &q, &d, nullptr, row.scores.data(), nullptr));
          }
        };
        if (first_list) {
          const auto u0 = std::chrono::steady_clock::now();
          call(half, nd_half);
          if (nq == 1 && top) {
            std::printf("%-10s half-corpus upload (first call) %.0f ms\n", label.c_str(),
                        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - u0).count());
          }
          row.half_ms = WallIt(n_reps, [&] { call(half, nd_half); });
        }
        const auto u0 = std::chrono::steady_clock::now();
        call(corpus, nd);
        if (nq == 1 && top) {
          std::printf("%-10s corpus upload (first call) %.0f ms\n", label.c_str(),
                      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - u0).count());
        }
        row.ms = WallIt(n_reps, [&] { call(corpus, nd); });
        rows.push_back(std::move(row));
      }
    }
    for (size_t r = 0; r < rows.size(); ++r) {
      const Row& x = rows[r];
      const Row* first = results.empty() ? nullptr : &results.front()[r];
      const double speedup = first ? first->ms / x.ms : 1.0;
      const double bound = first && first->half_ms > 0 ? first->ms / first->half_ms : 0.0;
      const bool same = !first || (x.index == first->index && x.scores.size() == first->scores.size() &&
                                   std::memcmp(x.scores.data(), first->scores.data(), x.scores.size() * 4) == 0);
      std::printf("%-10s %-14s %4llu %10.4f %9.4f %8.2fx %8.2fx %s\n", label.c_str(), x.op.c_str(),
                  static_cast<unsigned long long>(x.nq), x.ms, x.half_ms, speedup, bound,
                  first ? (same ? "identical" : "DIFFER") : "-");
      if (g_json) {
        std::fprintf(g_json,
                     "{\"devices\": \"%s\", \"matrix_output\": \"%s\", \"op\": \"%s\", \"nq\": %llu, \"lq\": %llu, "
                     "\"nd\": %llu, \"ld\": %llu, \"dim\": %u, \"k\": %llu, \"ms\": %.6f, \"half_corpus_ms\": %.6f, "
                     "\"speedup\": %.4f, \"bound\": %.4f, \"same_bits\": %d, \"command\": \"%s\", \"machine\": \"%s\", "
                     "\"date\": \"%s\"}\n",
                     list.c_str(), list.find(',') == std::string::npos ? "one device" : stage ? "staged" : "columns",
                     x.op.c_str(), static_cast<unsigned long long>(x.nq),
                     static_cast<unsigned long long>(q_len), static_cast<unsigned long long>(nd),
                     static_cast<unsigned long long>(doc_len), dim,
                     static_cast<unsigned long long>(x.op == "topk10" ? k : 0), x.ms, x.half_ms, speedup, bound,
                     same ? 1 : 0, g_command.c_str(), devices.c_str(), date);
        std::fflush(g_json);
      }
      if (!same) {
        std::printf("  results differ from the first device list's\n");
        all_same = false;
      }
    }
    results.push_back(std::move(rows));
    maxsim_context_destroy(ctx);
  }
  // The host copy that --staged adds to the 64-query score matrix on several devices: each shard's columns copied
  // from its staged matrix into the caller's (the bytes once, split over the shard threads).
  {
    std::vector<float> from(64 * nd, 1.0f), to(64 * nd, 0.0f);
    const double ms = WallIt(reps, [&] { std::memcpy(to.data(), from.data(), from.size() * 4); });
    std::printf("host memcpy of the 64-query matrix (%.1f MB, one thread): %.3f ms\n", from.size() * 4 / 1e6, ms);
    if (g_json) {
      std::fprintf(g_json, "{\"op\": \"host_memcpy_64q_matrix\", \"bytes\": %llu, \"ms\": %.6f, \"command\": \"%s\", "
                   "\"machine\": \"%s\", \"date\": \"%s\"}\n", static_cast<unsigned long long>(from.size() * 4), ms,
                   g_command.c_str(), devices.c_str(), date);
    }
  }
  maxsim_packed_release(half);
  maxsim_packed_release(corpus);
  maxsim_context_destroy(cpu);
  if (g_json) std::fclose(g_json);
  return all_same ? 0 : 1;
}
