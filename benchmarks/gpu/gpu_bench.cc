// SPDX-License-Identifier: Apache-2.0
// GPU benchmark of the CUDA plugin (a machine with an NVIDIA GPU: scripts/device/gpu-bench.sh).
//
// Each shape is packed once (bf16 originals + int8 codes, the library's packer), uploaded as a device-resident
// corpus, and scored by queries already on the device; every call is timed with CUDA events around exactly
// the plugin's device work (the same code the plugin runs, linked directly), after a warm-up, and the median
// is reported. Shapes whose corpus is under 200 MB rotate among copies (more than 200 MB in all) so that repeated
// calls do not measure the cache. Also measured in the same run: the read ceiling (read_bw.cu: the fastest of several
// read kernels, over 2 GiB and, per one-query shape, over the shape's own document bytes), device-to-device copy
// bandwidth (bytes read + written), and the end-to-end latency of the public call (host queries in, host scores
// out) for one shape. MAXSIM_GPU_BENCH_ROWS (below) keeps some rows only.
// Usage (Usage() prints it; a bad argument exits 2, naming what is wrong):
//   maxsim_gpu_bench [--json FILE] [--only NAME,...] [--shape NAME=nq,lq,nd,ld[,dim]]...
//   --only runs the named shapes (built-in, added by --shape, and "train"); --shape adds a shape to the built-in
//   list (repeatable; dim 128 by default), scored as the built-in retrieval shapes are (bf16, the certified rows),
//   e.g. --shape l512=1,32,1000,512 for the rule of the one-block-per-pair grid (scripts/device/gpu-coop-rule.sh).
// cuBLAS and the naive PyTorch baseline are measured by baselines.py in the same run; report.py
// joins everything into one table.
//
// Data: unit-norm Gaussian token vectors (ColBERT-like norms; certified candidate sets of ~2 tokens).
// Output: one JSON object per line (--json FILE), and a readable log on stdout.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend.h"
#include "bench_util.h"
#include "plan.h"
#include "read_bw.h"
#include "schedule_read.h"
#include "sm_clock.h"
#include "maxsim/maxsim.h"
#include "maxsim/packed_format.h"

namespace {

using mscuda::Backend;
using mscuda::Corpus;
using mscuda::DeviceQueries;
using gpu_bench_util::DenseSets;
using gpu_bench_util::Median;
using gpu_bench_util::ToBf16;

FILE* g_json = nullptr;
maxsim_context* g_cpu = nullptr;  // packs the benchmark's data (CPU, all threads)
maxsim_context* g_api = nullptr;  // the public API's context (backend "cuda"); NULL when it cannot be created
// MAXSIM_GPU_BENCH_ROWS=api: per shape only the rows of the public path (exact, steps, plugin and API calls, the
// candidate-list comparison), for scripts/device/gpu-api.sh. =kernel: per shape the "exact" row and its read
// ceilings (read-same-bytes, read-ring-schedule, read-grid-schedule), for scripts/device/gpu-mem.sh and
// gpu-schedule.sh. =dense: per shape the "exact" row on the packed corpus and the same scores from dense device
// tensors (api-dense, dense-kernels), for the packed/dense comparison of scripts/device/gpu-visual.sh.
bool g_api_rows_only = false;
bool g_kernel_only = false;
bool g_dense_rows = false;

#define CHECK_CUDA(x)                                                                     \
  do {                                                                                    \
    cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorString(e_));                \
      std::exit(2);                                                                       \
    }                                                                                     \
  } while (0)
#define CHECK_ST(x)                                                                       \
  do {                                                                                    \
    mscuda::Status s_ = (x);                                                              \
    if (!s_.ok()) {                                                                       \
      std::fprintf(stderr, "%s failed: %s\n", #x, s_.message.c_str());                    \
      std::exit(2);                                                                       \
    }                                                                                     \
  } while (0)
#define CHECK_MS(x)                                                                       \
  do {                                                                                    \
    maxsim_status s_ = (x);                                                               \
    if (s_ != MAXSIM_OK) {                                                                \
      std::fprintf(stderr, "%s failed: %s\n", #x, maxsim_last_error());                   \
      std::exit(2);                                                                       \
    }                                                                                     \
  } while (0)

// n_sets uniform sets of `len` unit-norm Gaussian vectors, bf16 (row-major [n_sets * len, dim]).
std::vector<uint16_t> RandomBf16(uint64_t n_sets, uint64_t len, uint32_t dim, uint64_t seed) {
  const uint64_t rows = n_sets * len;
  std::vector<uint16_t> data(rows * dim);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < static_cast<int64_t>(rows); ++r) {
    std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(r));
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<float> v(dim);
    double n = 0;
    for (uint32_t k = 0; k < dim; ++k) {
      v[k] = g(rng);
      n += static_cast<double>(v[k]) * v[k];
    }
    const float inv = static_cast<float>(1.0 / std::sqrt(n));
    for (uint32_t k = 0; k < dim; ++k) data[r * dim + k] = ToBf16(v[k] * inv);
  }
  return data;
}

// The sets packed by the library (an owned, validated handle).
maxsim_packed* PackHandle(const std::vector<uint16_t>& data, uint64_t n_sets, uint64_t len, uint32_t dim) {
  const maxsim_dense_sets s = DenseSets(data.data(), MAXSIM_MEMORY_HOST, n_sets, len, dim);
  maxsim_packed* p = nullptr;
  CHECK_MS(maxsim_pack(g_cpu, &s, nullptr, &p));
  return p;
}

// Packed sets: the owned handle, its bytes and the view the host hands a plugin.
struct PackedData {
  maxsim_packed* handle = nullptr;
  const uint8_t* base = nullptr;
  uint64_t size = 0;
  maxsim_packed_view view{};
  PackedData(const std::vector<uint16_t>& data, uint64_t n_sets, uint64_t len, uint32_t dim)
      : handle(PackHandle(data, n_sets, len, dim)) {
    maxsim_packed_desc desc{};
    CHECK_MS(maxsim_packed_describe(handle, &desc));
    base = static_cast<const uint8_t*>(desc.data);
    size = desc.size;
    CHECK_MS(maxsim_packed_plugin_view(handle, 0, n_sets, &view));
  }
  PackedData(const PackedData&) = delete;
  PackedData& operator=(const PackedData&) = delete;
  ~PackedData() { maxsim_packed_release(handle); }
};

// Median of event-timed calls (ms) after `warmup` calls. fn(i) enqueues the work of call i on `stream`.
// The median device time of a call: CUDA events before and after each of `iters` calls, enqueued back to back
// (no host synchronisation between calls: the host enqueues ahead while the device works, as
// triton.testing.do_bench times the published kernels), after `warmup` calls. sync_each = true synchronises
// after every call instead, so that each interval also holds the host's enqueue work and the launch latency of
// the call's first kernel: the latency of one call issued on an idle device.
// A named point on the timeline of benchmarks/gpu/cupti_trace.cc when the CUDA driver has loaded it
// (CUDA_INJECTION64_PATH); nothing otherwise. The timed loops mark each call they time.
void TraceMark(const char* name) {
  using MarkFn = void (*)(const char*);
  static const MarkFn fn = [] {
    const char* path = std::getenv("CUDA_INJECTION64_PATH");
    void* h = path && path[0] ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : nullptr;
    return h ? reinterpret_cast<MarkFn>(dlsym(h, "maxsim_trace_mark")) : nullptr;
  }();
  if (fn && name) fn(name);
}

// MAXSIM_GPU_BENCH_ITERS=N: the rows timed by a shape's run() (exact, and without MAXSIM_GPU_BENCH_ROWS=kernel the
// other modes and kernel variants too) and the copy-only twins run N calls instead of their own count, so that a row
// lasts long enough for the GPU's clock and power, sampled by nvidia-smi, to be read per row
// (scripts/device/gpu-clock.sh, which sets MAXSIM_GPU_BENCH_ROWS=kernel); the read ceilings' sweeps of variants keep
// theirs.
int g_iters = 0;
int RowIters(int n) { return g_iters > 0 ? g_iters : n; }

double TimeIt(cudaStream_t stream, int warmup, int iters, const std::function<void(int)>& fn, bool sync_each = false,
              const char* mark = nullptr) {
  std::vector<cudaEvent_t> ev(2 * static_cast<size_t>(iters));
  for (cudaEvent_t& e : ev) CHECK_CUDA(cudaEventCreate(&e));
  for (int i = 0; i < warmup; ++i) fn(i);
  CHECK_CUDA(cudaStreamSynchronize(stream));
  for (int i = 0; i < iters; ++i) {
    TraceMark(mark);
    CHECK_CUDA(cudaEventRecord(ev[2 * i], stream));
    fn(i);
    CHECK_CUDA(cudaEventRecord(ev[2 * i + 1], stream));
    if (sync_each) CHECK_CUDA(cudaEventSynchronize(ev[2 * i + 1]));
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, ev[2 * i], ev[2 * i + 1]));
    ms.push_back(t);
  }
  CHECK_CUDA(cudaGetLastError());
  for (cudaEvent_t e : ev) cudaEventDestroy(e);
  return Median(ms);
}

void Emit(const std::string& name, const std::string& mode, double ms, double flops, double bytes,
          const std::string& extra = "") {
  std::printf("%-16s %-10s %9.4f ms  %8.1f TFLOP/s  %8.1f GB/s %s\n", name.c_str(), mode.c_str(), ms,
              flops / ms / 1e9, bytes / ms / 1e6, extra.c_str());
  if (g_json) {
    std::fprintf(g_json, "{\"shape\": \"%s\", \"mode\": \"%s\", \"ms\": %.6f, \"flops\": %.6e, \"bytes\": %.6e%s%s}\n",
                 name.c_str(), mode.c_str(), ms, flops, bytes, extra.empty() ? "" : ", ", extra.c_str());
    std::fflush(g_json);
  }
}

struct Shape {
  const char* name;
  uint64_t nq, lq, nd, ld;
  uint32_t dim;
  bool certified;
  bool topk;
};

// `problem` and the usage on stderr, then exit status 2 (as a failed CUDA or plugin call).
[[noreturn]] void Usage(const std::string& problem) {
  std::fprintf(stderr,
               "maxsim_gpu_bench: %s\n"
               "usage: maxsim_gpu_bench [--json FILE] [--only NAME,...] [--shape NAME=nq,lq,nd,ld[,dim]]...\n"
               "  --json FILE    one JSON object per row into FILE\n"
               "  --only LIST    only these shapes: built-in, added by --shape, or \"train\"\n"
               "  --shape SPEC   add a shape (repeatable): NAME (letters, digits, '-', '_'), then queries, query\n"
               "                 tokens, documents, document tokens, dimension (default 128), all positive\n",
               problem.c_str());
  std::exit(2);
}

// One positive decimal number of at most `max`, for field `what` of --shape `spec`.
uint64_t ShapeNumber(const std::string& text, uint64_t max, const char* what, const std::string& spec) {
  const bool digits = !text.empty() && text.size() <= 19 && text.find_first_not_of("0123456789") == std::string::npos;
  const uint64_t v = digits ? std::strtoull(text.c_str(), nullptr, 10) : 0;
  if (v == 0 || v > max) {
    Usage("--shape " + spec + ": " + what + " '" + text + "' is not a number in 1.." + std::to_string(max));
  }
  return v;
}

// --shape NAME=nq,lq,nd,ld[,dim] into a Shape named by *name (kept by the caller; `taken` holds the names in use).
Shape ParseShape(const std::string& spec, const std::deque<std::string>& taken, std::string* name) {
  const size_t eq = spec.find('=');
  *name = spec.substr(0, eq == std::string::npos ? 0 : eq);
  const char* allowed = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_";
  if (eq == std::string::npos || name->empty() || name->size() > 32 ||
      name->find_first_not_of(allowed) != std::string::npos) {
    Usage("--shape " + spec + ": expected NAME=nq,lq,nd,ld[,dim] with a NAME of 1-32 letters, digits, '-' or '_'");
  }
  if (std::find(taken.begin(), taken.end(), *name) != taken.end()) {
    Usage("--shape " + spec + ": the name '" + *name + "' is taken (a built-in shape, \"train\" or another --shape)");
  }
  std::vector<std::string> f;
  for (size_t start = eq + 1;;) {
    const size_t comma = spec.find(',', start);
    f.push_back(spec.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (f.size() != 4 && f.size() != 5) {
    Usage("--shape " + spec + ": expected 4 or 5 numbers after '=' (nq,lq,nd,ld[,dim]), got " +
          std::to_string(f.size()));
  }
  const uint64_t nq = ShapeNumber(f[0], 1ull << 20, "nq", spec), lq = ShapeNumber(f[1], 1ull << 20, "lq", spec);
  const uint64_t nd = ShapeNumber(f[2], 1ull << 32, "nd", spec), ld = ShapeNumber(f[3], 1ull << 20, "ld", spec);
  const uint64_t dim = f.size() == 5 ? ShapeNumber(f[4], MAXSIM_PACK_MAX_DIM, "dim", spec) : 128;
  // In long double: no product overflows.
  const long double doc_bytes = static_cast<long double>(nd) * ld * dim * 2, query_bytes = 2.0L * nq * lq * dim;
  if (doc_bytes > (16ull << 30) || query_bytes > (1ull << 30) || static_cast<long double>(nq) * nd > (1ull << 31)) {
    Usage("--shape " + spec + ": too large (at most 16 GiB of bf16 documents, 1 GiB of queries, 2^31 scores)");
  }
  return Shape{nullptr, nq, lq, nd, ld, static_cast<uint32_t>(dim), true, false};
}

void HostLog(void*, maxsim_log_level, const char*) {}

// Rounds in which a public-API row and the kernel row it is compared with are timed alternately.
constexpr int kApiRounds = 3;

// Runs fn(i) (device work enqueued on `stream`) for at least `ms` milliseconds of wall time. The GPU lowers its
// clocks within 0.1-0.2 s of idling (nvidia-smi in the gpu-trace section: 1980 MHz to 345-510 MHz), and uploads,
// packing and allocations leave it idle that long: the public rows, whose warm-up is a few calls, run after this.
void KeepBusy(cudaStream_t stream, double ms, const std::function<void(int)>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() < ms; ++i) {
    fn(i);
    if (i % 8 == 7) CHECK_CUDA(cudaStreamSynchronize(stream));
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
}

// Median wall time (ms) of fn(i) over `iters` calls after `warmup` calls: for public calls, which return when
// their results are ready.
double WallIt(int warmup, int iters, const std::function<void(int)>& fn, const char* mark = nullptr) {
  for (int i = 0; i < warmup; ++i) fn(i);
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    TraceMark(mark);
    const auto t0 = std::chrono::steady_clock::now();
    fn(i);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return Median(ms);
}

// Per-call wall time (ms) of `n` stream-ordered public calls fn(i) (MAXSIM_CALL_STREAM_ORDERED) enqueued back to
// back and the one maxsim_synchronize after them, after `warmup` calls and a synchronize: what a caller who orders
// its calls on a stream pays per call, to set beside the kernel rows (CUDA events around the same device work
// enqueued back to back).
double OrderedWall(int warmup, int n, const std::function<void(int)>& fn, const char* mark = nullptr) {
  for (int i = 0; i < warmup; ++i) fn(i);
  CHECK_MS(maxsim_synchronize(g_api));
  TraceMark(mark);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) fn(i);
  CHECK_MS(maxsim_synchronize(g_api));
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / n;
}
constexpr int kOrderedCalls = 20;

// Elements of a and b whose bits differ.
uint64_t BitsDiffer(const std::vector<float>& a, const std::vector<float>& b) {
  uint64_t n = a.size() == b.size() ? 0 : std::max(a.size(), b.size());
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) n += std::memcmp(&a[i], &b[i], 4) != 0;
  return n;
}

// The public C API (maxsim.h), what users call, on the same data as the kernel rows: dense device tensors in,
// device scores out ("api-dense"); a resident packed corpus with a dense host query in, host scores out
// ("api-resident", "api-resident-certified"). Each call returns when its results are ready, so it is timed
// with the host clock. "same_bits" counts scores that differ from the kernel rows' (expected: 0).
void RunApi(Backend& b, const Shape& s, const std::vector<uint16_t>& qdata, const std::vector<uint16_t>& ddata,
            maxsim_packed* dpacked, uint64_t copies, double flops, double bytes, cudaStream_t stream,
            const std::vector<float>& kernel_scores) {
  if (!g_api) return;
  const uint64_t nq = s.nq, nd = s.nd;
  std::vector<void*> qd(copies), dd(copies);
  for (uint64_t c = 0; c < copies; ++c) {
    CHECK_CUDA(cudaMalloc(&qd[c], qdata.size() * 2));
    CHECK_CUDA(cudaMalloc(&dd[c], ddata.size() * 2));
    CHECK_CUDA(cudaMemcpy(qd[c], qdata.data(), qdata.size() * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dd[c], ddata.data(), ddata.size() * 2, cudaMemcpyHostToDevice));
  }
  float* scores = nullptr;
  CHECK_CUDA(cudaMalloc(&scores, nq * nd * 4));
  std::vector<float> out(nq * nd);
  auto extra = [&](const std::vector<float>& got) {
    return "\"same_bits\": " + std::to_string(BitsDiffer(got, kernel_scores) == 0 ? 1 : 0) +
           ", \"differing\": " + std::to_string(BitsDiffer(got, kernel_scores));
  };
  maxsim_score_options o;
  maxsim_score_options_init(&o);
  o.cuda_stream = stream;
  {
    // api-dense: the public call. dense-kernels: the device work of the same call (the plugin's forward on the same
    // tensors, with its folded input check), CUDA events around calls enqueued back to back; api-dense minus
    // dense-kernels is the public call's overhead. The two are timed in alternating rounds (medians of the rounds'
    // medians), so that a change of the GPU's clocks during the run affects both alike.
    maxsim_plugin_train_args ta{};
    ta.struct_size = sizeof(ta);
    ta.metric = MAXSIM_METRIC_DOT;
    ta.layout = MAXSIM_LAYOUT_MATRIX;
    ta.scores = scores;
    ta.stream = b.stream;
    std::vector<double> api_ms, kernel_ms, ordered_ms;
    maxsim_score_options oo = o;
    oo.flags = MAXSIM_CALL_STREAM_ORDERED;
    std::vector<float> ordered_out(nq * nd);
    auto dense_call = [&](int i) {
      const maxsim_dense_sets qs = DenseSets(qd[i % copies], MAXSIM_MEMORY_CUDA, nq, s.lq, s.dim);
      const maxsim_dense_sets ds = DenseSets(dd[i % copies], MAXSIM_MEMORY_CUDA, nd, s.ld, s.dim);
      ta.queries = &qs;
      ta.documents = &ds;
      // The documents' memory kind as the public call's pointer check finds it (cudaMalloc: plain device memory),
      // so that the launch does what the public call's does.
      CHECK_ST(mscuda::TrainForward(b, ta, 1));
    };
    b.sync_calls = false;
    KeepBusy(b.stream, 50, dense_call);
    b.sync_calls = true;
    // The public call on the i-th copy of the tensors, with options `opt`.
    auto public_call = [&](const maxsim_score_options& opt) {
      return [&, opt](int i) {
        const maxsim_dense_sets qs = DenseSets(qd[i % copies], MAXSIM_MEMORY_CUDA, nq, s.lq, s.dim);
        const maxsim_dense_sets ds = DenseSets(dd[i % copies], MAXSIM_MEMORY_CUDA, nd, s.ld, s.dim);
        const maxsim_sets qa{nullptr, &qs}, da{nullptr, &ds};
        CHECK_MS(maxsim_score_matrix(g_api, &qa, &da, &opt, scores, nullptr));
      };
    };
    for (int round = 0; round < kApiRounds; ++round) {
      api_ms.push_back(WallIt(3, 10, public_call(o), (std::string(s.name) + " api-dense").c_str()));
      if (round == 0) CHECK_CUDA(cudaMemcpy(out.data(), scores, nq * nd * 4, cudaMemcpyDeviceToHost));
      b.sync_calls = false;
      kernel_ms.push_back(TimeIt(b.stream, 3, 10, dense_call, false, (std::string(s.name) + " dense-kernels").c_str()));
      b.sync_calls = true;
      // api-dense-ordered: the same public call, stream-ordered, kOrderedCalls back to back + one synchronize.
      CHECK_CUDA(cudaMemset(scores, 0, nq * nd * 4));
      ordered_ms.push_back(
          OrderedWall(3, kOrderedCalls, public_call(oo), (std::string(s.name) + " api-dense-ordered").c_str()));
      if (round == 0) CHECK_CUDA(cudaMemcpy(ordered_out.data(), scores, nq * nd * 4, cudaMemcpyDeviceToHost));
    }
    Emit(s.name, "api-dense", Median(api_ms), flops, bytes, extra(out));
    Emit(s.name, "dense-kernels", Median(kernel_ms), flops, bytes);
    Emit(s.name, "api-dense-ordered", Median(ordered_ms), flops, bytes,
         extra(ordered_out) + ", \"calls\": " + std::to_string(kOrderedCalls));
    if (g_dense_rows) {
      for (uint64_t c = 0; c < copies; ++c) {
        cudaFree(qd[c]);
        cudaFree(dd[c]);
      }
      cudaFree(scores);
      return;
    }
    // What the plugin's check of the caller's device pointers adds to a dense call (caller_memory.cc).
    const maxsim_dense_sets qs = DenseSets(qd[0], MAXSIM_MEMORY_CUDA, nq, s.lq, s.dim);
    const maxsim_dense_sets ds = DenseSets(dd[0], MAXSIM_MEMORY_CUDA, nd, s.ld, s.dim);
    ta.queries = &qs;
    ta.documents = &ds;
    Emit(s.name, "step-pointer-check", WallIt(5, 200, [&](int) { CHECK_ST(mscuda::CheckCallerTensors(b, ta)); }), flops,
         bytes);
  }
  // Resident corpora: one handle per copy (each uploaded by its first call).
  std::vector<maxsim_packed*> handles{dpacked};
  for (uint64_t c = 1; c < copies; ++c) handles.push_back(PackHandle(ddata, nd, s.ld, s.dim));
  const maxsim_dense_sets hq = DenseSets(qdata.data(), MAXSIM_MEMORY_HOST, nq, s.lq, s.dim);
  for (maxsim_mode mode : {MAXSIM_MODE_EXACT, MAXSIM_MODE_CERTIFIED}) {
    maxsim_score_options ho;
    maxsim_score_options_init(&ho);
    ho.mode = mode;
    auto call = [&](int i) {
      const maxsim_sets qa{nullptr, &hq}, da{handles[i % copies], nullptr};
      CHECK_MS(maxsim_score_matrix(g_api, &qa, &da, &ho, out.data(), nullptr));
    };
    for (uint64_t c = 0; c < copies; ++c) call(static_cast<int>(c));  // each corpus uploaded once
    KeepBusy(b.stream, 50, call);
    const double ms = WallIt(5, 30, call,
                             (std::string(s.name) + (mode == MAXSIM_MODE_EXACT ? " api-resident" : " api-resident-certified")).c_str());
    Emit(s.name, mode == MAXSIM_MODE_EXACT ? "api-resident" : "api-resident-certified", ms, flops, bytes, extra(out));
  }
  for (uint64_t c = 1; c < copies; ++c) maxsim_packed_release(handles[c]);
  for (uint64_t c = 0; c < copies; ++c) {
    cudaFree(qd[c]);
    cudaFree(dd[c]);
  }
  cudaFree(scores);
}

// Where a resident call's time goes (one query; host queries in, host scores out): each step is a synchronous
// round trip on the backend's stream, timed with the host clock like the public rows, so that the steps and
// api-resident compare directly. "kernel-wall" (the scoring kernel + one synchronisation) is the floor of any
// call that runs it; "plugin-resident" is the plugin's whole call without the library in front of it.
void RunSteps(Backend& b, const Shape& s, const std::vector<uint16_t>& qdata, const std::vector<Corpus*>& corpora,
              double flops, double bytes) {
  const uint64_t copies = corpora.size(), out_bytes = s.nq * s.nd * 4, q_bytes = qdata.size() * 2;
  const maxsim_dense_sets hq = DenseSets(qdata.data(), MAXSIM_MEMORY_HOST, s.nq, s.lq, s.dim);
  DeviceQueries q;
  CHECK_ST(mscuda::UploadDenseQueries(b, hq, false, b.qbuf, &q));
  CHECK_CUDA(cudaStreamSynchronize(b.stream));
  CHECK_ST(mscuda::QueryValues(b, q));
  uint8_t* dev = nullptr;
  CHECK_CUDA(cudaMalloc(&dev, std::max(out_bytes, q_bytes)));
  CHECK_ST(b.stage.Reserve(std::max(out_bytes, q_bytes), "benchmark staging"));
  auto sync = [&] { CHECK_CUDA(cudaStreamSynchronize(b.stream)); };
  auto step = [&](const char* name, const std::function<void(int)>& fn) {
    Emit(s.name, name, WallIt(5, 30, fn, (std::string(s.name) + " " + name).c_str()), flops, bytes);
  };
  step("step-sync", [&](int) { sync(); });
  step("step-query-stage", [&](int) {
    CHECK_ST(mscuda::UploadDenseQueries(b, hq, false, b.qbuf, &q));
    sync();
  });
  step("step-query-check", [&](int) {
    q.host_checked = false;
    CHECK_ST(mscuda::QueryValues(b, q));
  });
  step("step-query-h2d", [&](int) {
    std::memcpy(b.stage.data(), qdata.data(), q_bytes);
    CHECK_CUDA(cudaMemcpyAsync(dev, b.stage.data(), q_bytes, cudaMemcpyHostToDevice, b.stream));
    sync();
  });
  step("step-query-h2d-pageable", [&](int) {  // straight from the caller's memory (the driver stages it)
    CHECK_CUDA(cudaMemcpyAsync(dev, qdata.data(), q_bytes, cudaMemcpyHostToDevice, b.stream));
    sync();
  });
  step("step-scores-d2h", [&](int) {
    CHECK_CUDA(cudaMemcpyAsync(b.stage.data(), dev, out_bytes, cudaMemcpyDeviceToHost, b.stream));
    sync();
  });
  CHECK_ST(mscuda::UploadDenseQueries(b, hq, false, b.qbuf, &q));
  sync();
  CHECK_ST(mscuda::QueryValues(b, q));
  for (bool mapped : {false, true}) {
    float* out = reinterpret_cast<float*>(mapped ? b.stage.device_data() : dev);
    step(mapped ? "kernel-wall-mapped" : "kernel-wall", [&](int i) {
      CHECK_ST(mscuda::ScoreMatrixDevice(b, q, *corpora[static_cast<size_t>(i) % copies], MAXSIM_METRIC_DOT,
                                         MAXSIM_MODE_EXACT, out, nullptr, nullptr, b.stream));
      sync();
    });
  }
  std::vector<float> host(s.nq * s.nd);
  maxsim_plugin_score_args a{};
  a.struct_size = sizeof(a);
  a.metric = MAXSIM_METRIC_DOT;
  a.mode = MAXSIM_MODE_EXACT;
  a.query_dense = &hq;
  a.scores = host.data();
  step("plugin-resident", [&](int i) {
    a.corpus = reinterpret_cast<const maxsim_plugin_corpus*>(corpora[static_cast<size_t>(i) % copies]);
    CHECK_ST(mscuda::ScoreMatrix(b, a));
  });
  cudaFree(dev);
}

// Candidate lists score pair by pair (docs/cuda.md, Operations): the same work as the matrix when every query lists
// every document. "plugin-matrix" and "plugin-candidates-all" are the plugin's two calls on it (packed queries in,
// host scores out, wall clock), and "same_bits" says whether the candidate scores equal the matrix's.
void RunCandidatesAll(Backend& b, const Shape& s, const maxsim_packed_view& qview, const Corpus& c,
                      const std::vector<float>& kernel_scores, double flops, double bytes) {
  maxsim_plugin_score_args a{};
  a.struct_size = sizeof(a);
  a.metric = MAXSIM_METRIC_DOT;
  a.mode = MAXSIM_MODE_EXACT;
  a.query_view = &qview;
  a.corpus = reinterpret_cast<const maxsim_plugin_corpus*>(&c);
  std::vector<float> out(s.nq * s.nd);
  a.scores = out.data();
  Emit(s.name, "plugin-matrix", WallIt(2, 10, [&](int) { CHECK_ST(mscuda::ScoreMatrix(b, a)); }), flops, bytes);
  std::vector<uint64_t> offsets(s.nq + 1), cands(s.nq * s.nd);
  for (uint64_t i = 0; i <= s.nq; ++i) offsets[i] = i * s.nd;
  for (uint64_t e = 0; e < cands.size(); ++e) cands[e] = e % s.nd;
  a.cand_offsets = offsets.data();
  a.candidates = cands.data();
  std::fill(out.begin(), out.end(), 0.0f);
  const double ms = WallIt(2, 10, [&](int) { CHECK_ST(mscuda::ScoreCandidates(b, a)); });
  Emit(s.name, "plugin-candidates-all", ms, flops, bytes, "\"same_bits\": " + std::to_string(BitsDiffer(out, kernel_scores) == 0 ? 1 : 0));
}

void ReadSameBytes(Backend& b, const Shape& s, uint64_t copies, double flops);
void ScheduleReads(Backend& b, const Shape& s, const DeviceQueries& q, const std::vector<Corpus*>& corpora,
                   double flops);

// Whether `name` is selected by --only (empty: every shape; else a comma-separated list of names).
bool Selected(const std::string& only, const std::string& name) {
  return only.empty() || ("," + only + ",").find("," + name + ",") != std::string::npos;
}

// The SM clock a timed row's calls ran at (sm_clock.h), as JSON members for its line: 5 rounds, each a pair of
// stamps around a batch of the row's calls back to back, half a millisecond of them at the row's median `ms` but at
// least 10 and at most 400. Also the batch's own time per call (sm_ns_per_call), which has no events between calls.
std::string ClockOf(Backend& b, double ms, const std::function<void(int)>& fn) {
  const int calls = std::clamp(static_cast<int>(0.5 / std::max(ms, 1e-4)), 10, 400);
  SmClock c;
  CHECK_CUDA(MeasureSmClock(b.stream, b.prop.multiProcessorCount, 5, calls, fn, &c));
  return c.Json();
}

// Joins JSON members (either may be empty).
std::string Members(const std::string& a, const std::string& b) {
  return a.empty() ? b : b.empty() ? a : a + ", " + b;
}

void RunShape(Backend& b, const Shape& s, const std::string& only) {
  if (!Selected(only, s.name)) return;
  std::printf("-- %s: Nq=%llu Lq=%llu Nd=%llu Ld=%llu d=%u\n", s.name, (unsigned long long)s.nq,
              (unsigned long long)s.lq, (unsigned long long)s.nd, (unsigned long long)s.ld, s.dim);
  const std::vector<uint16_t> qdata = RandomBf16(s.nq, s.lq, s.dim, 1);
  const std::vector<uint16_t> ddata = RandomBf16(s.nd, s.ld, s.dim, 2);
  const PackedData qbuf(qdata, s.nq, s.lq, s.dim), dbuf(ddata, s.nd, s.ld, s.dim);
  // Copies to rotate among so that repeated calls stream from HBM, not L2 (50 MB): more than 200 MB in all, up to
  // 32 copies (peers.py rotates the same way). Fewer would leave a small shape's inputs in L2, where the peers'
  // normal loads hit them and the plugin's evict-first copies do not.
  const uint64_t copies = std::max<uint64_t>(1, std::min<uint64_t>(32, (200ull << 20) / dbuf.size + 1));
  std::vector<Corpus*> corpora(copies, nullptr);
  for (uint64_t c = 0; c < copies; ++c) CHECK_ST(mscuda::UploadCorpus(b, dbuf.view, &corpora[c]));
  mscuda::DeviceBuffer qdev;
  DeviceQueries q;
  CHECK_ST(mscuda::UploadQueriesTo(b, qbuf.view, qdev, &q));
  float* scores = nullptr;
  unsigned long long* counters = nullptr;
  CHECK_CUDA(cudaMalloc(&scores, s.nq * s.nd * 4));
  CHECK_CUDA(cudaMalloc(&counters, 16));
  const double flops = 2.0 * s.nq * s.lq * s.nd * s.ld * s.dim;
  const double exact_bytes = static_cast<double>(s.nd) * s.ld * s.dim * 2 + s.nq * s.lq * s.dim * 2.0 + s.nq * s.nd * 4.0;
  const double padded = (s.dim + 63) / 64 * 64;
  const double cert_bytes = static_cast<double>(s.nd) * s.ld * (padded + 16) + s.nq * s.lq * (padded + 16 + s.dim * 2.0) +
                            s.nq * s.nd * 4.0;
  const int iters = RowIters(30), warm = 5;
  auto call = [&](int mode) {
    return [&, mode](int i) {
      CHECK_ST(mscuda::ScoreMatrixDevice(b, q, *corpora[static_cast<size_t>(i) % copies], MAXSIM_METRIC_DOT, mode,
                                         scores, nullptr, mode == MAXSIM_MODE_EXACT ? nullptr : counters, b.stream));
    };
  };
  auto run = [&](int mode, bool sync_each = false) { return TimeIt(b.stream, warm, iters, call(mode), sync_each); };
  const mscuda::Tuning tuning_set = b.tuning;  // as read from the environment; the variants below change it
  const double exact_ms = run(MAXSIM_MODE_EXACT);
  Emit(s.name, "exact", exact_ms, flops, exact_bytes, ClockOf(b, exact_ms, call(MAXSIM_MODE_EXACT)));
  std::vector<float> kernel_scores(s.nq * s.nd);
  CHECK_CUDA(cudaMemcpy(kernel_scores.data(), scores, s.nq * s.nd * 4, cudaMemcpyDeviceToHost));
  if (s.nq == 1 && !g_api_rows_only && !g_dense_rows) {
    ReadSameBytes(b, s, copies, flops);
    ScheduleReads(b, s, q, corpora, flops);
  }
  if (g_kernel_only || g_dense_rows) {
    for (Corpus* c : corpora) mscuda::FreeCorpus(b, c);
    cudaFree(scores);
    cudaFree(counters);
    if (g_dense_rows) RunApi(b, s, qdata, ddata, dbuf.handle, copies, flops, exact_bytes, b.stream, kernel_scores);
    return;
  }
  // The same calls one at a time on an idle device: adds the host's enqueue work and the first launch's latency.
  if (!g_api_rows_only) Emit(s.name, "exact-synced", run(MAXSIM_MODE_EXACT, true), flops, exact_bytes);
  if (!g_api_rows_only && s.lq > 64 && s.dim > 96 && s.dim <= 128) {
    // The long-query mma.sync kernel, for comparison with the wgmma kernel that "exact" runs on sm_90.
    b.tuning.kernels.wgmma = false;
    Emit(s.name, "exact-mma", run(MAXSIM_MODE_EXACT), flops, exact_bytes);
    b.tuning = tuning_set;
  }
  if (!g_api_rows_only && s.nq > 1) {
    // Without the batch kernel (each (query, document) pair on its own, a document read once per query), and
    // whether its scores have the batch kernel's bits.
    b.tuning.kernels.batch = false;
    const double ms = run(MAXSIM_MODE_EXACT);
    b.tuning = tuning_set;
    std::vector<float> pair_scores(s.nq * s.nd);
    CHECK_CUDA(cudaMemcpy(pair_scores.data(), scores, s.nq * s.nd * 4, cudaMemcpyDeviceToHost));
    const uint64_t differ = BitsDiffer(pair_scores, kernel_scores);
    char extra[80];
    std::snprintf(extra, sizeof(extra), "\"scores_with_other_bits\": %llu", static_cast<unsigned long long>(differ));
    Emit(s.name, "exact-nobatch", ms, flops, exact_bytes, extra);
    // The batch kernel's other schedules (KernelSwitches): 1 or 3 stages copied ahead, every thread's cp.async
    // copies instead of bulk tensor copies.
    for (uint32_t ahead : {1u, 3u}) {
      b.tuning.kernels.batch_ahead = ahead;
      Emit(s.name, ahead == 1 ? "exact-ahead1" : "exact-ahead3", run(MAXSIM_MODE_EXACT), flops, exact_bytes);
      b.tuning = tuning_set;
    }
    b.tuning.kernels.batch_tma = false;
    Emit(s.name, "exact-cpasync", run(MAXSIM_MODE_EXACT), flops, exact_bytes);
    b.tuning = tuning_set;
  }
  if (!g_api_rows_only && (std::string(s.name) == "textual-1k" || std::string(s.name) == "colpali-rerank")) {
    // The one-pair-per-warp kernel (register double buffering) for comparison with the pipeline kernel.
    b.tuning.kernels.pipe = false;
    Emit(s.name, "exact-nopipe", run(MAXSIM_MODE_EXACT), flops, exact_bytes);
    b.tuning = tuning_set;
  }
  if (!g_api_rows_only && s.certified) {
    // "certified" / "approximate" are what a request gets by default (certified: the exact kernel, same bits;
    // approximate: the screening kernel where its per-warp ring applies, else the exact kernel; see docs/cuda.md);
    // "certified-screen" / "approximate-screen" always run the int8 screening kernel (MAXSIM_CUDA_CERTIFIED=screen).
    const auto route_before = b.screen_route;
    b.screen_route = mscuda::Backend::ScreenRoute::kAuto;
    // Bytes for GB/s: what the route the backend picks must read (codes + metadata when it screens).
    auto routed_bytes = [&](int mode) {
      return b.KernelMode(mode, q.view, q.max_len, s.nq * s.nd) == MAXSIM_MODE_EXACT ? exact_bytes : cert_bytes;
    };
    Emit(s.name, "certified", run(MAXSIM_MODE_CERTIFIED), flops, routed_bytes(MAXSIM_MODE_CERTIFIED));
    if (s.lq > 64) {
      // The wgmma screening kernel (screen_wgmma.cu: forced screening's long-query kernel; opt-in on the default
      // route), here for every query length, with its candidate statistics.
      b.tuning.screen_wgmma_min_lq = 1;
      b.tuning.experimental_screen_wgmma = true;
      CHECK_CUDA(cudaMemset(counters, 0, 16));
      const double wms = run(MAXSIM_MODE_CERTIFIED);
      b.tuning = tuning_set;
      unsigned long long wc[2];
      CHECK_CUDA(cudaMemcpy(wc, counters, 16, cudaMemcpyDeviceToHost));
      const double wevals = static_cast<double>(iters + warm) * s.nq * s.lq * s.nd;
      // Bytes: the per-document-scale codes + the query (the refined originals come on top).
      const double wbytes = static_cast<double>(s.nd) * s.ld * 128 + s.nq * s.lq * (128 + 16 + s.dim * 2.0) + s.nq * s.nd * 4.0;
      char wextra[160];
      std::snprintf(wextra, sizeof(wextra), "\"refined_per_token\": %.3f, \"multi_fraction\": %.4f", wc[0] / wevals,
                    wc[1] / wevals);
      Emit(s.name, "certified-wgmma", wms, flops, wbytes, wextra);
    }
    b.screen_route = mscuda::Backend::ScreenRoute::kScreen;
    CHECK_CUDA(cudaMemset(counters, 0, 16));
    const double ms = run(MAXSIM_MODE_CERTIFIED);
    unsigned long long c[2];
    CHECK_CUDA(cudaMemcpy(c, counters, 16, cudaMemcpyDeviceToHost));
    const double evals = static_cast<double>(iters + warm) * s.nq * s.lq * s.nd;
    char extra[160];
    std::snprintf(extra, sizeof(extra), "\"refined_per_token\": %.3f, \"multi_fraction\": %.4f", c[0] / evals,
                  c[1] / evals);
    Emit(s.name, "certified-screen", ms, flops, cert_bytes, extra);
    Emit(s.name, "approximate-screen", run(MAXSIM_MODE_APPROXIMATE), flops, cert_bytes);
    b.screen_route = mscuda::Backend::ScreenRoute::kAuto;
    Emit(s.name, "approximate", run(MAXSIM_MODE_APPROXIMATE), flops, routed_bytes(MAXSIM_MODE_APPROXIMATE));
    if (std::string(s.name) == "textual-10k") {
      // The screening kernel's per-warp ring against its one-pair-per-warp kernel.
      b.screen_route = mscuda::Backend::ScreenRoute::kScreen;
      b.tuning.kernels.screen_pipe = false;
      Emit(s.name, "certified-screen-noring", run(MAXSIM_MODE_CERTIFIED), flops, cert_bytes);
      Emit(s.name, "approximate-screen-noring", run(MAXSIM_MODE_APPROXIMATE), flops, cert_bytes);
      b.tuning = tuning_set;
    }
    b.screen_route = route_before;
  }
  if (!g_api_rows_only && s.topk && copies == 1) {
    // Public-call top-k (host queries in, host results out), wall clock: what an application sees.
    for (int mode : {MAXSIM_MODE_EXACT, MAXSIM_MODE_CERTIFIED}) {
      maxsim_plugin_score_args a{};
      a.struct_size = sizeof(a);
      a.metric = MAXSIM_METRIC_DOT;
      a.mode = static_cast<maxsim_mode>(mode);
      a.queries = qbuf.base;
      a.queries_size = qbuf.size;
      a.query_view = &qbuf.view;
      a.corpus = reinterpret_cast<const maxsim_plugin_corpus*>(corpora[0]);
      a.k = 10;
      std::vector<float> ts(s.nq * 10);
      std::vector<uint64_t> ti(s.nq * 10);
      a.scores = ts.data();
      a.topk_index = ti.data();
      std::vector<double> ms;
      for (int i = 0; i < 25; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        CHECK_ST(mscuda::TopK(b, a));
        const auto t1 = std::chrono::steady_clock::now();
        if (i >= 5) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      }
      Emit(s.name, mode == MAXSIM_MODE_EXACT ? "topk10-e2e" : "topk10c-e2e", Median(ms), flops, exact_bytes);
    }
  }
  if (!g_api_rows_only && std::string(s.name) == "textual-1k") {
    // End-to-end public-call latency of the score matrix (host queries in, host scores out).
    maxsim_plugin_score_args a{};
    a.struct_size = sizeof(a);
    a.metric = MAXSIM_METRIC_DOT;
    a.mode = MAXSIM_MODE_EXACT;
    a.queries = qbuf.base;
    a.queries_size = qbuf.size;
    a.query_view = &qbuf.view;
    a.corpus = reinterpret_cast<const maxsim_plugin_corpus*>(corpora[0]);
    std::vector<float> hs(s.nq * s.nd);
    a.scores = hs.data();
    std::vector<double> ms;
    for (int i = 0; i < 40; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      CHECK_ST(mscuda::ScoreMatrix(b, a));
      const auto t1 = std::chrono::steady_clock::now();
      if (i >= 10) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    Emit(s.name, "exact-e2e", Median(ms), flops, exact_bytes);
  }
  if (s.nq == 1) RunSteps(b, s, qdata, corpora, flops, exact_bytes);
  if (s.nq > 1) RunCandidatesAll(b, s, qbuf.view, *corpora[0], kernel_scores, flops, exact_bytes);
  for (Corpus* c : corpora) mscuda::FreeCorpus(b, c);
  cudaFree(scores);
  cudaFree(counters);
  RunApi(b, s, qdata, ddata, dbuf.handle, copies, flops, exact_bytes, b.stream, kernel_scores);
}

// In-batch training step: forward (scores + argmax) + backward (grad_Q, grad_D), bf16 device tensors.
void RunTrain(Backend& b, uint64_t nq, uint64_t nd, uint64_t lq, uint64_t ld, uint32_t dim) {
  std::printf("-- train in-batch: Nq=%llu Nd=%llu Lq=%llu Ld=%llu d=%u\n", (unsigned long long)nq,
              (unsigned long long)nd, (unsigned long long)lq, (unsigned long long)ld, dim);
  std::mt19937_64 rng(7);
  std::normal_distribution<float> g(0.0f, 0.09f);
  std::vector<uint16_t> hq(nq * lq * dim), hd(nd * ld * dim);
  for (auto& v : hq) v = ToBf16(g(rng));
  for (auto& v : hd) v = ToBf16(g(rng));
  void *dq, *dd;
  float *scores, *grad, *gq, *gd;
  int32_t* argmax;
  CHECK_CUDA(cudaMalloc(&dq, hq.size() * 2));
  CHECK_CUDA(cudaMalloc(&dd, hd.size() * 2));
  CHECK_CUDA(cudaMemcpy(dq, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dd, hd.data(), hd.size() * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMalloc(&scores, nq * nd * 4));
  CHECK_CUDA(cudaMalloc(&grad, nq * nd * 4));
  CHECK_CUDA(cudaMalloc(&argmax, nq * nd * lq * 4));
  CHECK_CUDA(cudaMalloc(&gq, nq * lq * dim * 4));
  CHECK_CUDA(cudaMalloc(&gd, nd * ld * dim * 4));
  std::vector<float> hg(nq * nd);
  for (auto& v : hg) v = g(rng);
  CHECK_CUDA(cudaMemcpy(grad, hg.data(), hg.size() * 4, cudaMemcpyHostToDevice));
  const maxsim_dense_sets sq = DenseSets(dq, MAXSIM_MEMORY_CUDA, nq, lq, dim);
  const maxsim_dense_sets sd = DenseSets(dd, MAXSIM_MEMORY_CUDA, nd, ld, dim);
  uint64_t extra_f = 0, extra_b = 0;
  maxsim_plugin_train_args a{};
  a.struct_size = sizeof(a);
  a.metric = MAXSIM_METRIC_DOT;
  a.layout = MAXSIM_LAYOUT_MATRIX;
  a.queries = &sq;
  a.documents = &sd;
  a.scores = scores;
  a.argmax = argmax;
  a.grad_scores = grad;
  a.grad_queries = gq;
  a.grad_documents = gd;
  a.stream = b.stream;
  const double flops = 2.0 * nq * nd * lq * ld * dim;
  const double bytes = (hq.size() + hd.size()) * 2.0 * 2 + (nq * lq + nd * ld) * dim * 4.0;
  // The public calls of a training step (maxsim_score_matrix with argmax, then maxsim_backward) on the same device
  // tensors and stream, each returning when its stream has finished, are timed in rounds alternating with the
  // kernel rows (the plugin's calls enqueued back to back, CUDA events), so that both see the same clocks.
  maxsim_score_options o;
  maxsim_score_options_init(&o);
  o.cuda_stream = b.stream;
  const maxsim_sets qa{nullptr, &sq}, da{nullptr, &sd};
  maxsim_score_options oo = o;
  oo.flags = MAXSIM_CALL_STREAM_ORDERED;
  std::vector<double> api_fwd;
  b.sync_calls = false;
  KeepBusy(b.stream, 50, [&](int) {
    CHECK_ST(mscuda::TrainForward(b, a));
    CHECK_ST(mscuda::TrainBackward(b, a));
  });
  b.sync_calls = true;
  for (int det : {1, 0}) {
    a.deterministic = det;
    maxsim_backward_args ba;
    maxsim_backward_args_init(&ba);
    ba.argmax = argmax;
    ba.grad_scores = grad;
    ba.grad_queries = gq;
    ba.grad_documents = gd;
    ba.deterministic = det;
    ba.cuda_stream = b.stream;
    maxsim_backward_args bo = ba;
    bo.flags = MAXSIM_CALL_STREAM_ORDERED;
    std::vector<double> step_ms, fwd_ms, api_step, ordered_step;
    // One training step through the public API with the given forward options and backward arguments.
    auto public_step = [&](const maxsim_score_options& fwd_opt, const maxsim_backward_args& bwd_args) {
      return [&, fwd_opt, bwd_args](int) {
        CHECK_MS(maxsim_score_matrix(g_api, &qa, &da, &fwd_opt, scores, argmax));
        CHECK_MS(maxsim_backward(g_api, &sq, &sd, &bwd_args));
      };
    };
    for (int round = 0; round < kApiRounds; ++round) {
      b.sync_calls = false;
      step_ms.push_back(TimeIt(b.stream, 3, 10, [&](int) {
        a.peak_extra_bytes = &extra_f;
        CHECK_ST(mscuda::TrainForward(b, a));
        a.peak_extra_bytes = &extra_b;
        CHECK_ST(mscuda::TrainBackward(b, a));
      }, false, det ? "train fwd+bwd-det" : "train fwd+bwd-atomic"));
      fwd_ms.push_back(TimeIt(b.stream, 3, 10, [&](int) { CHECK_ST(mscuda::TrainForward(b, a)); }));
      b.sync_calls = true;
      if (!g_api) continue;
      api_step.push_back(WallIt(3, 10, public_step(o, ba), det ? "train api-fwd+bwd-det" : "train api-fwd+bwd-atomic"));
      api_fwd.push_back(WallIt(3, 10, [&](int) { CHECK_MS(maxsim_score_matrix(g_api, &qa, &da, &o, scores, argmax)); },
                               "train api-fwd"));
      // The same step stream-ordered: kOrderedCalls steps back to back, one synchronize.
      ordered_step.push_back(OrderedWall(3, kOrderedCalls, public_step(oo, bo),
                                         det ? "train api-fwd+bwd-det-ordered" : "train api-fwd+bwd-atomic-ordered"));
    }
    CHECK_ST(mscuda::TrainForward(b, a));  // with its checks, once
    CHECK_ST(mscuda::TrainBackward(b, a));
    char extra[200];
    // Extra memory: the plugin's scratch (peak of the two calls); outputs (scores, argmax, grads) excluded.
    std::snprintf(extra, sizeof(extra), "\"extra_mb\": %.3f, \"fwd_ms\": %.4f",
                  std::max(extra_f, extra_b) / 1048576.0, Median(fwd_ms));
    Emit("train-inbatch", det ? "fwd+bwd-det" : "fwd+bwd-atomic", Median(step_ms), flops, bytes, extra);
    if (g_api) Emit("train-inbatch", det ? "api-fwd+bwd-det" : "api-fwd+bwd-atomic", Median(api_step), flops, bytes);
    if (g_api) {
      Emit("train-inbatch", det ? "api-fwd+bwd-det-ordered" : "api-fwd+bwd-atomic-ordered", Median(ordered_step),
           flops, bytes, "\"calls\": " + std::to_string(kOrderedCalls));
    }
  }
  if (g_api) Emit("train-inbatch", "api-fwd", Median(api_fwd), flops, bytes);
  cudaFree(dq);
  cudaFree(dd);
  cudaFree(scores);
  cudaFree(grad);
  cudaFree(argmax);
  cudaFree(gq);
  cudaFree(gd);
}

// The grids a read variant is timed with (read_bw.h): persistent variants at 2, 4 and 8 blocks per SM (bulk
// variants one per SM); the others size their own grid.
std::vector<int> ReadGrids(const Backend& b, int v) {
  const int sms = b.prop.multiProcessorCount;
  if (!ReadVariantPersistent(v)) return {0};
  if (ReadVariantOneBlockPerSm(v)) return {sms};
  return {2 * sms, 4 * sms, 8 * sms};
}

// The device's read ceiling (read_bw.cu): every read variant at its grids over 2 GiB, each as a "read-variant" row;
// the fastest is the "read" row, which names it.
void ReadBandwidth(Backend& b) {
  const uint64_t bytes = 2ull << 30;
  void* x;
  uint32_t* sink;
  CHECK_CUDA(cudaMalloc(&x, bytes));
  CHECK_CUDA(cudaMalloc(&sink, 4));
  CHECK_CUDA(cudaMemset(x, 1, bytes));
  double best = 0;  // GB/s
  int best_v = 0, best_blocks = 0;
  for (int v = 0; v < ReadVariantCount(); ++v) {
    if (!ReadVariantSupported(v) || ReadVariantBytes(v, bytes) == 0) continue;
    for (int blocks : ReadGrids(b, v)) {
      const double ms = TimeIt(b.stream, 3, 10, [&](int) { CHECK_CUDA(LaunchReadBandwidth(v, x, bytes, blocks, sink, b.stream)); });
      const double read = static_cast<double>(ReadVariantBytes(v, bytes)), gbs = read / ms / 1e6;
      std::printf("read variant %-12s blocks %5d: %.1f GB/s\n", ReadVariantName(v), blocks, gbs);
      if (g_json) {
        std::fprintf(g_json, "{\"shape\": \"read-variant\", \"mode\": \"%s\", \"ms\": %.6f, \"bytes\": %.6e, \"blocks\": %d}\n",
                     ReadVariantName(v), ms, read, blocks);
      }
      if (gbs > best) best = gbs, best_v = v, best_blocks = blocks;
    }
  }
  // The SM clock of the best read, and of SMs left idle while one block spins for 100 us: whether an idle SM's
  // counter keeps the clock's pace, i.e. whether the gaps and tails in the rows' windows count at full rate.
  const std::string clock = ClockOf(b, bytes / best / 1e6, [&](int) {
    CHECK_CUDA(LaunchReadBandwidth(best_v, x, bytes, best_blocks, sink, b.stream));
  });
  SmClock idle;
  CHECK_CUDA(MeasureSmClock(b.stream, b.prop.multiProcessorCount, 5, 5,
                            [&](int) { CHECK_CUDA(LaunchSpin(100000, b.stream)); }, &idle));
  // And the global timer's rate against the host's clock over a 50 ms spin (the MHz above are cycles per its ns).
  double timer_over_host = 0;
  CHECK_CUDA(TimerAgainstHost(b.stream, 50000000ull, &timer_over_host));
  char timer[64];
  std::snprintf(timer, sizeof(timer), "\"timer_over_host\": %.5f", timer_over_host);
  const std::string idle_json = Members(idle.Json(), timer);
  std::printf("device read: %.1f GB/s (%s, %d blocks) %s\n", best, ReadVariantName(best_v), best_blocks, clock.c_str());
  std::printf("idle SMs (one block spinning): %s\n", idle_json.c_str());
  if (g_json) {
    const std::string read = Members(std::string("\"variant\": \"") + ReadVariantName(best_v) + "\", \"blocks\": " +
                                         std::to_string(best_blocks), clock);
    std::fprintf(g_json, "{\"shape\": \"read\", \"mode\": \"read\", \"ms\": %.6f, \"bytes\": %.6e, %s}\n", bytes / best / 1e6,
                 1.0 * bytes, read.c_str());
    std::fprintf(g_json, "{\"shape\": \"sm-clock\", \"mode\": \"idle\", \"ms\": 0.1, %s}\n", idle_json.c_str());
  }
  cudaFree(x);
  cudaFree(sink);
}

// The shape's own ceiling: the fastest read variant (every variant and grid, as for the "read" row) over the
// shape's document bytes, rotating among as many copies as the kernel rows do, timed the same way (CUDA events
// around launches enqueued back to back), so that the launch, ramp-up and tail of a read of that size are in it
// as they are in the kernel rows.
void ReadSameBytes(Backend& b, const Shape& s, uint64_t copies, double flops) {
  const uint64_t bytes = s.nd * s.ld * s.dim * 2ull / 16 * 16;
  std::vector<void*> bufs(copies);
  uint32_t* sink;
  CHECK_CUDA(cudaMalloc(&sink, 4));
  for (void*& p : bufs) {
    CHECK_CUDA(cudaMalloc(&p, bytes));
    CHECK_CUDA(cudaMemset(p, 1, bytes));
  }
  double best = 0;  // bytes per ms
  double best_ms = 0, best_bytes = 0;
  int best_v = 0, best_blocks = 0;
  for (int v = 0; v < ReadVariantCount(); ++v) {
    if (!ReadVariantSupported(v) || ReadVariantBytes(v, bytes) == 0) continue;
    for (int blocks : ReadGrids(b, v)) {
      const double ms = TimeIt(b.stream, 5, 30, [&](int i) {
        CHECK_CUDA(LaunchReadBandwidth(v, bufs[static_cast<size_t>(i) % copies], bytes, blocks, sink, b.stream));
      });
      const double read = static_cast<double>(ReadVariantBytes(v, bytes));
      if (read / ms > best) best = read / ms, best_ms = ms, best_bytes = read, best_v = v, best_blocks = blocks;
    }
  }
  // The time to read all of the shape's bytes at that rate (bulk variants leave out a partial 32 KB chunk).
  const double ms = best_ms * static_cast<double>(bytes) / best_bytes;
  const std::string clock = ClockOf(b, best_ms, [&](int i) {
    CHECK_CUDA(LaunchReadBandwidth(best_v, bufs[static_cast<size_t>(i) % copies], bytes, best_blocks, sink, b.stream));
  });
  Emit(s.name, "read-same-bytes", ms, flops, static_cast<double>(bytes),
       Members(std::string("\"variant\": \"") + ReadVariantName(best_v) + "\"", clock));
  for (void* p : bufs) cudaFree(p);
  cudaFree(sink);
}

// The shape's ceiling under the scoring kernels' own schedules (schedule_read.cu): the copy-only twins of the ring
// kernel ("read-ring-schedule": 8 warps x 3 stages per SM, each warp a contiguous range of pairs) and of the
// one-block-per-pair grid ("read-grid-schedule": 4 warps x 2 stages, 3 blocks per SM), over the same corpus copies
// as the exact row, with the same arguments block (the exact plan's), timed the same way. Which of the two the
// exact row runs is the plugin's choice (CoopChosen); both are measured on every shape they apply to.
void ScheduleReads(Backend& b, const Shape& s, const DeviceQueries& q, const std::vector<Corpus*>& corpora,
                   double flops) {
  const mscuda::SetsView d0 = corpora[0]->View();
  const mscuda::Plan plan = mscuda::MakePlan(b, q.view, d0, q.max_len, MAXSIM_MODE_EXACT);
  float* out = nullptr;
  CHECK_CUDA(cudaMalloc(&out, s.nq * s.nd * 4));
  std::vector<mscuda::ForwardArgs> args;
  for (const Corpus* c : corpora) {
    mscuda::ForwardArgs a = mscuda::MatrixForwardArgs(q.view, c->View(), s.nq, s.nd, MAXSIM_METRIC_DOT,
                                                      MAXSIM_MODE_EXACT, nullptr, out, nullptr, nullptr, plan);
    a.sw = b.tuning.kernels;  // as LaunchForward sets them
    a.part.groups = 1;
    a.part.group_rows = plan.rows;
    args.push_back(a);
  }
  if (plan.kind != mscuda::KernelKind::kTc || plan.groups != 1 || !ScheduleReadApplies(args[0], q.max_len)) {
    std::printf("%-16s schedule reads skipped: the exact call does not run the ring or the grid\n", s.name);
    cudaFree(out);
    return;
  }
  const double bytes = static_cast<double>(s.nd) * s.ld * s.dim * 2;
  const int sms = b.prop.multiProcessorCount;
  const size_t n = args.size();
  // Which of the two the exact row ran (this process's kernel switches, e.g. MAXSIM_CUDA_NO_COOP).
  const std::string ran = std::string("\"exact_ran\": \"") + ExactScheduleName(args[0], q.max_len, sms) + "\"";
  // Every pair's slot written once by one launch (all ones before it: a word the XOR leaves there by chance is
  // counted as missed, about once in 2^32 pairs), so that a twin that skipped pairs would show.
  auto missed = [&](const std::function<void()>& launch) {
    CHECK_CUDA(cudaMemsetAsync(out, 0xFF, s.nq * s.nd * 4, b.stream));
    launch();
    std::vector<uint32_t> w(s.nq * s.nd);
    CHECK_CUDA(cudaMemcpyAsync(w.data(), out, w.size() * 4, cudaMemcpyDeviceToHost, b.stream));
    CHECK_CUDA(cudaStreamSynchronize(b.stream));
    return std::to_string(std::count(w.begin(), w.end(), 0xFFFFFFFFu));
  };
  auto ring = [&](int i) {
    CHECK_CUDA(LaunchRingScheduleRead(args[static_cast<size_t>(i) % n], q.max_len, sms, b.stream));
  };
  auto grid = [&](int i) {
    CHECK_CUDA(LaunchGridScheduleRead(args[static_cast<size_t>(i) % n], q.max_len, false, b.stream));
  };
  // The grid's twin with the kernel's tensor-core instructions (read-grid-schedule-mma: the copies, the mma chains on
  // the copied bytes and the scores-only fold; no ldmatrix fragments, query fragments or merges).
  auto grid_mma = [&](int i) {
    CHECK_CUDA(LaunchGridScheduleRead(args[static_cast<size_t>(i) % n], q.max_len, true, b.stream));
  };
  const std::string ring_missed = missed([&] { ring(0); }), grid_missed = missed([&] { grid(0); });
  // A twin's row: its time, and the SM clock its calls ran at.
  auto twin = [&](const char* row, const std::function<void(int)>& fn, const std::string& pairs_missed) {
    const double ms = TimeIt(b.stream, 5, RowIters(30), fn);
    Emit(s.name, row, ms, flops, bytes, Members(ran + ", \"pairs_missed\": " + pairs_missed, ClockOf(b, ms, fn)));
  };
  twin("read-ring-schedule", ring, ring_missed);
  twin("read-grid-schedule", grid, grid_missed);
  twin("read-grid-schedule-mma", grid_mma, missed([&] { grid_mma(0); }));
  // On one-query shapes, schedules no kernel runs, as ceilings for one: the launch's steps dealt out round-robin to
  // all warps (with and without the global-memory merges a kernel on it would need), or in balanced contiguous
  // ranges; and the dealt kernel's schedule (exact_dealt.cu, 12 warps x 2 stages), where its table of documents
  // allows it.
  if (s.nq == 1) {
    for (const auto& [deal, row] : {std::pair{kCyclic, "read-cyclic-schedule"},
                                    std::pair{kCyclicMerge, "read-cyclic-merge-schedule"},
                                    std::pair{kBalanced, "read-balanced-schedule"}}) {
      auto spread = [&, deal = deal](int i) {
        CHECK_CUDA(LaunchSpreadScheduleRead(args[static_cast<size_t>(i) % n], q.max_len, s.ld, sms, deal, b.stream));
      };
      const std::string spread_missed = missed([&] { spread(0); });
      twin(row, spread, spread_missed);
    }
    if (s.nd <= 32ull * static_cast<uint64_t>(sms)) {  // the dealt kernel's twin (its table of documents)
      // Without and with the kernel's tensor-core instructions (read-dealt-schedule-mma: the copies, the mma chains
      // on the copied bytes and the scores-only fold; no ldmatrix fragments, query copy or merges), each with the SM
      // clock its calls ran at.
      for (const bool with_mma : {false, true}) {
        auto dealt = [&, with_mma](int i) {
          CHECK_CUDA(LaunchDealtScheduleRead(args[static_cast<size_t>(i) % n], q.max_len, s.ld, sms, with_mma, b.stream));
        };
        twin(with_mma ? "read-dealt-schedule-mma" : "read-dealt-schedule", dealt, missed([&] { dealt(0); }));
      }
    }
  }
  cudaFree(out);
}

void CopyBandwidth(Backend& b) {
  const uint64_t bytes = 2ull << 30;
  void *x, *y;
  CHECK_CUDA(cudaMalloc(&x, bytes));
  CHECK_CUDA(cudaMalloc(&y, bytes));
  CHECK_CUDA(cudaMemset(x, 1, bytes));
  const double ms = TimeIt(b.stream, 3, 10, [&](int) {
    CHECK_CUDA(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, b.stream));
  });
  std::printf("device copy: %.1f GB/s (read + write)\n", 2.0 * bytes / ms / 1e6);
  if (g_json) std::fprintf(g_json, "{\"shape\": \"copy\", \"mode\": \"d2d\", \"ms\": %.6f, \"bytes\": %.6e}\n", ms, 2.0 * bytes);
  cudaFree(x);
  cudaFree(y);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each row when it is measured (device scripts time-stamp the lines)
  std::string only;
  const char* rows = std::getenv("MAXSIM_GPU_BENCH_ROWS");
  g_api_rows_only = rows != nullptr && std::strcmp(rows, "api") == 0;
  g_kernel_only = rows != nullptr && std::strcmp(rows, "kernel") == 0;
  g_dense_rows = rows != nullptr && std::strcmp(rows, "dense") == 0;
  if (const char* it = std::getenv("MAXSIM_GPU_BENCH_ITERS")) g_iters = std::max(0, std::atoi(it));
  std::vector<Shape> shapes = {
      {"textual-100", 1, 32, 100, 300, 128, true, false},
      {"colpali-100", 1, 32, 100, 1030, 128, true, false},
      {"textual-1k", 1, 32, 1000, 300, 128, true, false},
      {"textual-10k", 1, 32, 10000, 300, 128, true, true},
      {"colpali-rerank", 1, 32, 1000, 1030, 128, true, false},
      {"q128", 1, 128, 1000, 1030, 128, true, false},
      {"visual", 1, 1024, 1000, 1024, 128, true, false},
      // Serving: queries arrive in batches.
      {"serve-textual-10k-64q", 64, 32, 10000, 300, 128, false, false},
      {"serve-colpali-16q", 16, 32, 1000, 1030, 128, false, false},
  };
  // Every shape's name; the custom ones' storage (a deque: the shapes point into it, and it never moves them).
  std::deque<std::string> names = {"train"};
  for (const Shape& s : shapes) names.push_back(s.name);
  const char* json = nullptr;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg != "--json" && arg != "--only" && arg != "--shape") Usage("unknown argument '" + arg + "'");
    if (i + 1 >= argc) Usage(arg + " needs a value");
    const std::string value = argv[++i];
    if (arg == "--json") {
      json = argv[i];
    } else if (arg == "--only") {
      only = value;
    } else {
      std::string name;
      Shape s = ParseShape(value, names, &name);
      names.push_back(name);
      s.name = names.back().c_str();
      shapes.push_back(s);
    }
  }
  for (size_t start = 0; !only.empty() && start <= only.size();) {
    const size_t comma = std::min(only.find(',', start), only.size());
    const std::string name = only.substr(start, comma - start);
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      Usage("--only " + only + ": no shape '" + name + "' (built-in, added by --shape, or \"train\")");
    }
    start = comma + 1;
  }
  if (json != nullptr && (g_json = std::fopen(json, "w")) == nullptr) {
    Usage(std::string("--json ") + json + ": cannot open it for writing: " + std::strerror(errno));
  }
  maxsim_plugin_host host{};
  host.struct_size = sizeof(host);
  host.log = &HostLog;
  Backend* b = nullptr;
  CHECK_ST(mscuda::CreateBackend(&host, &b));
  std::printf("device: %s, %d SMs, L2 %d MB\n", b->prop.name, b->prop.multiProcessorCount, b->prop.l2CacheSize >> 20);
  maxsim_options co;
  maxsim_options_init(&co);
  co.load_plugins = 0;
  co.backend = "cpu";
  CHECK_MS(maxsim_context_create(&co, &g_cpu));
  maxsim_options ao;
  maxsim_options_init(&ao);
  ao.backend = "cuda";
  if (maxsim_context_create(&ao, &g_api) != MAXSIM_OK) {
    std::printf("public API rows skipped: %s\n", maxsim_last_error());
    g_api = nullptr;
  }
  if (only.empty()) CopyBandwidth(*b);
  if (!g_dense_rows) ReadBandwidth(*b);
  for (const Shape& s : shapes) RunShape(*b, s, only);
  if (Selected(only, "train")) RunTrain(*b, 64, 64, 32, 300, 128);
  mscuda::DestroyBackend(b);
  if (g_api) maxsim_context_destroy(g_api);
  maxsim_context_destroy(g_cpu);
  if (g_json) std::fclose(g_json);
  return 0;
}
