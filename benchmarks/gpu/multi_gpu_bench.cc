// SPDX-License-Identifier: Apache-2.0
// Several GPUs through the public C API (maxsim.h): one packed corpus, resident on one device and sharded over
// several (maxsim_options.devices), host queries in, host results out, timed with the host clock (each call
// returns when its results are ready). Every timed call's results are compared with the first device list's: the
// scaling holds only where the bits are the same.
//
//   maxsim_multi_gpu_bench [--devices LIST[;LIST...]] [--docs N] [--doc-len L] [--copies C] [--reps R]
//                          [--json FILE]
//
// Default shape: textual-10k (10000 documents of 300 bf16 tokens, d = 128) repeated 8 times (80000 documents,
// 8 shards' worth), queries of 32 tokens, one query and a batch of 64; device lists "0" and "0,1". Rows: top-10
// (one query, 64 queries) and the score matrix of one query, per device list, with the speed-up over the first
// list. JSON (one object per line) carries the command, the devices' names and the date.
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

#include "maxsim/maxsim.h"

namespace {

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

uint16_t ToBf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
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

maxsim_dense_sets Dense(const void* data, uint64_t n_sets, uint64_t len, uint32_t dim) {
  maxsim_dense_sets s{};
  s.struct_size = sizeof(s);
  s.memory = MAXSIM_MEMORY_HOST;
  s.data = data;
  s.dtype = MAXSIM_BF16;
  s.dim = dim;
  s.n_sets = n_sets;
  s.set_length = len;
  return s;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
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
  std::vector<float> scores;
  std::vector<uint64_t> index;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> lists = {"0", "0,1"};
  uint64_t docs = 10000, doc_len = 300, copies = 8, q_len = 32;
  int reps = 20;
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
  const maxsim_dense_sets ds = Dense(all.data(), docs * copies, doc_len, dim);
  maxsim_packed* corpus = nullptr;
  CHECK_MS(maxsim_pack(cpu, &ds, nullptr, &corpus));
  std::vector<uint16_t>().swap(all);
  maxsim_packed_desc desc{};
  CHECK_MS(maxsim_packed_describe(corpus, &desc));
  std::printf("packed %.2f GB in %.1f s\n", desc.size / 1e9,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  const uint64_t nd = docs * copies, k = 10;
  const std::vector<uint16_t> queries = RandomRows(64 * q_len, dim, 1);

  std::vector<std::vector<Row>> results;
  bool all_same = true;
  std::printf("%-10s %-22s %4s %10s %9s %s\n", "devices", "operation", "Nq", "ms", "speed-up", "bits vs first");
  for (const std::string& list : lists) {
    maxsim_options o;
    maxsim_options_init(&o);
    o.backend = "cuda";
    o.devices = list.c_str();
    maxsim_context* ctx = nullptr;
    if (maxsim_context_create(&o, &ctx) != MAXSIM_OK) {
      std::printf("%-10s skipped: %s\n", list.c_str(), maxsim_last_error());
      continue;
    }
    const auto u0 = std::chrono::steady_clock::now();
    std::vector<Row> rows;
    const maxsim_sets d{corpus, nullptr};
    for (uint64_t nq : {1ull, 64ull}) {
      const maxsim_dense_sets qs = Dense(queries.data(), nq, q_len, dim);
      const maxsim_sets q{nullptr, &qs};
      Row top;
      top.op = "topk10";
      top.nq = nq;
      top.scores.resize(nq * k);
      top.index.resize(nq * k);
      // The first call uploads the corpus (one shard per device list entry); warm-up calls are not timed.
      CHECK_MS(maxsim_topk(ctx, &q, &d, k, nullptr, top.scores.data(), top.index.data(), nullptr));
      if (nq == 1) {
        std::printf("%-10s corpus upload (first call) %.0f ms\n", list.c_str(),
                    std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - u0).count());
      }
      top.ms = WallIt(nq == 1 ? reps : std::max(3, reps / 4), [&] {
        CHECK_MS(maxsim_topk(ctx, &q, &d, k, nullptr, top.scores.data(), top.index.data(), nullptr));
      });
      rows.push_back(top);
      if (nq == 1) {
        Row mat;
        mat.op = "score_matrix";
        mat.nq = nq;
        mat.scores.resize(nq * nd);
        mat.ms = WallIt(reps, [&] { CHECK_MS(maxsim_score_matrix(ctx, &q, &d, nullptr, mat.scores.data(), nullptr)); });
        rows.push_back(mat);
      }
    }
    for (size_t r = 0; r < rows.size(); ++r) {
      const Row& x = rows[r];
      const Row* first = results.empty() ? nullptr : &results.front()[r];
      const double speedup = first ? first->ms / x.ms : 1.0;
      const bool same = !first || (x.index == first->index && x.scores.size() == first->scores.size() &&
                                   std::memcmp(x.scores.data(), first->scores.data(), x.scores.size() * 4) == 0);
      std::printf("%-10s %-22s %4llu %10.4f %8.2fx %s\n", list.c_str(), x.op.c_str(),
                  static_cast<unsigned long long>(x.nq), x.ms, speedup, first ? (same ? "identical" : "DIFFER") : "-");
      if (g_json) {
        std::fprintf(g_json,
                     "{\"devices\": \"%s\", \"op\": \"%s\", \"nq\": %llu, \"lq\": %llu, \"nd\": %llu, \"ld\": %llu, "
                     "\"dim\": %u, \"k\": %llu, \"ms\": %.6f, \"speedup\": %.4f, \"same_bits\": %d, "
                     "\"command\": \"%s\", \"machine\": \"%s\", \"date\": \"%s\"}\n",
                     list.c_str(), x.op.c_str(), static_cast<unsigned long long>(x.nq),
                     static_cast<unsigned long long>(q_len), static_cast<unsigned long long>(nd),
                     static_cast<unsigned long long>(doc_len), dim,
                     static_cast<unsigned long long>(x.op == "topk10" ? k : 0), x.ms, speedup, same ? 1 : 0,
                     g_command.c_str(), devices.c_str(), date);
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
  maxsim_packed_release(corpus);
  maxsim_context_destroy(cpu);
  if (g_json) std::fclose(g_json);
  return all_same ? 0 : 1;
}
