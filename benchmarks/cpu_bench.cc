// SPDX-License-Identifier: Apache-2.0
// cpu_bench: the libmaxsim CPU benchmarks (Google Benchmark). docs/benchmarks.md explains every figure;
// result files (--benchmark_out=F --benchmark_out_format=json) live in benchmarks/results/, and
// scripts/bench-table.py renders them as markdown.
//
//   cpu_bench [--threads=1,2] [--kernels=a,b] [--replicas=N] [--note=TEXT] [google benchmark flags]
//
// The JSON context holds what Google Benchmark records (date, host, CPUs, caches, load) plus the command line,
// the CPU model and features, the kernel the library selects, the cores online, the measured peaks and --note
// (e.g. "shared machine: other builds were running").
//
// Families, in the order they run (so that the baselines of a shape are measured before its kernels and each
// kernel's line can print its ratio to them):
//   peak/<loop>/threads:T                           f32 FMA and int8 multiply-add peaks of this CPU
//   pack/one_doc_Ld180_d128/threads:1               maxsim_pack_into of one 180 x 128 f32 document
//   pack/corpus_Ld180x1000_d128/threads:T           maxsim_pack_into of a 1000-document corpus
//   maxsim/<shape>/<impl>/<mode>/threads:T          one query against a corpus: impl is naive, openblas, onednn
//                                                   or a kernel of the kernel list (forced with options.isa)
//   maxsim/<shape>/dense/<mode>/threads:T           the same call with dense f32 documents (no packed corpus):
//                                                   the selected kernel plus the per-call checks / quantisation
//   candidates/<corpus>/dense/<mode>/threads:T      maxsim_score_candidates of one query against K candidates
//                                                   of a large dense f32 corpus (reranking without packing): what
//                                                   the call costs beyond scoring the K documents
// Counters: docs_per_s, GSO_per_s (2*Lq*Ld*d operations per pair), pct_peak (% of the f32 FMA peak measured at
// start-up for the same thread count: the kernel's own vector width for library kernels, the widest for the
// baselines), pct_i8_peak for certified/approximate, x_naive / x_openblas / x_onednn (ratio of GSO/s to the
// baseline measured earlier in this run, same shape and threads), refined_per_qtok and multi_per_qtok.
//
// Cache state (docs/benchmarks.md): the query (a few KB to 512 KB) stays in cache, as it would in a search.
// The corpus is replicated and each iteration scores the next replica, with enough replicas that the bytes a
// mode reads (i8 codes for certified/approximate, f32 originals for exact and the baselines) exceed 3x the
// last-level cache: documents come from DRAM, as in a search over a corpus larger than the cache.
// Every timed call's output is checked after the loop (exact and certified: bit-identical to the exact
// scores; approximate: at most the exact score and within 2% of it; baselines: within 1e-4 relative), so a
// benchmark cannot silently skip work.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

#include "baselines.h"
#include "cli.h"  // the synthetic ColBERT-like corpus of `maxsim demo` / `maxsim bench`
#include "cpu_features.h"
#include "kernels/kernel.h"
#include "maxsim/maxsim.h"
#include "maxsim/packed_format.h"
#include "peak.h"

namespace maxsim::bench {
namespace {

using Clock = std::chrono::steady_clock;

// ---- configuration ------------------------------------------------------------------------------------------

struct Config {
  std::vector<int> threads = {1, 2};
  std::vector<std::string> kernels;  // empty: every available kernel
  int replicas = 0;                  // 0: enough to exceed 3x the last-level cache
  std::string note;                  // --note: free text for the result file's context
  std::string command;               // the command line as given
};
Config g_cfg;

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= s.size()) {
    const size_t e = s.find(sep, b);
    const std::string item = s.substr(b, e == std::string::npos ? std::string::npos : e - b);
    if (!item.empty()) out.push_back(item);
    if (e == std::string::npos) break;
    b = e + 1;
  }
  return out;
}

// Removes our own flags from argv (Google Benchmark rejects flags it does not know).
bool ParseOwnFlags(int* argc, char** argv) {
  for (int i = 0; i < *argc; ++i) g_cfg.command += (i ? " " : "") + std::string(argv[i]);
  int w = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> const char* {
      const size_t n = std::strlen(flag);
      return a.compare(0, n, flag) == 0 ? argv[i] + n : nullptr;
    };
    if (const char* v = value("--threads=")) {
      g_cfg.threads.clear();
      for (const std::string& t : Split(v, ',')) {
        const int n = std::atoi(t.c_str());
        if (n < 1 || n > 4096) {
          std::fprintf(stderr, "cpu_bench: --threads=%s: every entry must be a thread count from 1 to 4096\n", v);
          return false;
        }
        g_cfg.threads.push_back(n);
      }
    } else if (const char* v = value("--kernels=")) {
      g_cfg.kernels = Split(v, ',');
    } else if (const char* v = value("--note=")) {
      g_cfg.note = v;
    } else if (const char* v = value("--replicas=")) {
      g_cfg.replicas = std::atoi(v);
      if (g_cfg.replicas < 0 || g_cfg.replicas > 1024) {
        std::fprintf(stderr, "cpu_bench: --replicas=%s must be 0 (auto) to 1024\n", v);
        return false;
      }
    } else {
      argv[w++] = argv[i];
    }
  }
  *argc = w;
  return true;
}

uint64_t LastLevelCacheBytes() {
  // sysfs is right inside VMs where sysconf(_SC_LEVEL3_CACHE_SIZE) sometimes reports the host package.
  uint64_t best = 0;
  for (int i = 0; i < 8; ++i) {
    const std::string base = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream level(base + "level"), size(base + "size");
    int l = 0;
    std::string s;
    if (!(level >> l) || !(size >> s) || s.empty()) continue;
    uint64_t v = std::strtoull(s.c_str(), nullptr, 10);
    if (s.back() == 'K') v <<= 10;
    if (s.back() == 'M') v <<= 20;
    if (l >= 2) best = std::max(best, v);
  }
  if (best == 0) {
    const long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
    best = v > 0 ? static_cast<uint64_t>(v) : 32ull << 20;
  }
  return best;
}

// ---- machine peaks (measured once at start-up, per thread count) -----------------------------------------

std::map<std::pair<Peak, int>, double> g_peak;  // ops/s

double PeakOps(Peak p, int threads) {
  auto it = g_peak.find({p, threads});
  return it == g_peak.end() ? 0.0 : it->second;
}

// The widest f32 FMA peak of this CPU (for the baselines, which dispatch to the widest ISA themselves).
Peak BestF32Peak() {
  return PeakAvailable(Peak::kFmaAvx512, nullptr) ? Peak::kFmaAvx512 : Peak::kFmaAvx2;
}

// The peaks a kernel is measured against: its own vector width (f32) and its int8 instruction sequence.
struct KernelPeaks {
  Peak f32 = Peak::kFmaAvx2;
  bool has_i8 = true;
  Peak i8 = Peak::kI8Avx2;
};
KernelPeaks PeaksOfKernel(const std::string& name) {
  KernelPeaks k;
  size_t n = 0;
  const KernelInfo* list = KernelList(&n);
  for (size_t i = 0; i < n; ++i) {
    if (name != list[i].name) continue;
    const uint64_t r = list[i].required;
    if (r & kCpuAVX512F) k.f32 = Peak::kFmaAvx512;
    if (r & (kCpuAMXInt8 | kCpuAMXBF16 | kCpuAMXTile)) {
      k.has_i8 = false;  // no AMX peak loop: pct_i8_peak is not reported for AMX kernels
    } else if (r & kCpuAVX512VNNI) {
      k.i8 = Peak::kI8Avx512Vnni;
    } else if (r & kCpuAVXVNNI) {
      k.i8 = Peak::kI8AvxVnni;
    }
  }
  return k;
}

// ---- shapes and their data -------------------------------------------------------------------------------

struct Shape {
  std::string name;
  uint32_t lq, ld, nd, dim;
  double OpsPerCall() const { return 2.0 * lq * ld * dim * nd; }
};
const std::vector<Shape>& Shapes() {
  static const std::vector<Shape> kShapes = {
      {"Lq32_Ld180_N1000_d128", 32, 180, 1000, 128},  {"Lq32_Ld300_N1000_d128", 32, 300, 1000, 128},
      {"Lq1024_Ld1024_N16_d128", 1024, 1024, 16, 128}, {"Lq32_Ld180_N1000_d64", 32, 180, 1000, 64},
      {"Lq32_Ld180_N1000_d96", 32, 180, 1000, 96},
  };
  return kShapes;
}

struct Packed {
  maxsim_packed* p = nullptr;
  Packed() = default;
  Packed(const Packed&) = delete;
  Packed& operator=(const Packed&) = delete;
  ~Packed() { maxsim_packed_release(p); }
};

struct ShapeData {
  const Shape* shape = nullptr;
  cli::SynthData synth;
  std::vector<std::unique_ptr<Packed>> corpus;  // replicas of the same documents
  std::vector<DocsView> views;                   // their originals regions, for the baselines
  Packed query;
  std::vector<float> reference;                  // exact scores
  uint64_t codes_bytes = 0, originals_bytes = 0;
};
std::unique_ptr<ShapeData> g_data;

maxsim_context* NewContext(const char* isa, int threads) {
  maxsim_options o;
  maxsim_options_init(&o);
  o.isa = isa;
  o.num_threads = threads;
  o.backend = "cpu";
  o.load_plugins = 0;
  maxsim_context* ctx = nullptr;
  if (maxsim_context_create(&o, &ctx) != MAXSIM_OK) return nullptr;
  return ctx;
}

// One context per (kernel, threads), created outside any timing.
std::map<std::pair<std::string, int>, maxsim_context*> g_contexts;
maxsim_context* Ctx(const std::string& kernel, int threads) {
  auto& c = g_contexts[{kernel, threads}];
  if (!c) c = NewContext(kernel.empty() ? nullptr : kernel.c_str(), threads);
  return c;
}

// The synthetic corpus of nd documents of ld tokens each and one query of lq tokens.
cli::SynthData Synthetic(uint64_t nd, uint32_t ld, uint32_t dim, uint32_t lq, uint64_t seed) {
  cli::SynthSpec spec;
  spec.n_docs = nd;
  spec.min_len = spec.max_len = ld;
  spec.fixed_len = true;
  spec.dim = dim;
  spec.n_queries = 1;
  spec.query_len = lq;
  spec.seed = seed;
  return cli::MakeSynthetic(spec);
}

// Builds (or returns) the data of a shape; the previous shape's data is released first.
ShapeData* Data(const Shape& s, std::string* error) {
  if (g_data && g_data->shape == &s) return g_data.get();
  g_data.reset();
  auto d = std::make_unique<ShapeData>();
  d->shape = &s;
  d->synth = Synthetic(s.nd, s.ld, s.dim, s.lq, 2026);
  maxsim_context* ctx = Ctx("", 0);
  maxsim_dense_sets docs{};
  docs.struct_size = sizeof(docs);
  docs.data = d->synth.docs.data();
  docs.dtype = MAXSIM_F32;
  docs.dim = s.dim;
  docs.n_sets = s.nd;
  docs.offsets = d->synth.doc_offsets.data();
  maxsim_dense_sets q = docs;
  q.data = d->synth.queries.data();
  q.n_sets = 1;
  q.offsets = d->synth.query_offsets.data();
  if (maxsim_pack(ctx, &q, nullptr, &d->query.p) != MAXSIM_OK) {
    *error = std::string("packing the query: ") + maxsim_last_error();
    return nullptr;
  }
  const uint64_t padded = (s.dim + 63) / 64 * 64;
  d->codes_bytes = static_cast<uint64_t>(s.nd) * s.ld * padded;
  d->originals_bytes = static_cast<uint64_t>(s.nd) * s.ld * ((s.dim * 4 + 63) / 64 * 64);
  int replicas = g_cfg.replicas;
  if (replicas == 0) {
    replicas = static_cast<int>((3 * LastLevelCacheBytes() + d->codes_bytes - 1) / d->codes_bytes);
    replicas = std::min(64, std::max(1, replicas));
  }
  for (int r = 0; r < replicas; ++r) {
    auto p = std::make_unique<Packed>();
    if (maxsim_pack(ctx, &docs, nullptr, &p->p) != MAXSIM_OK) {
      *error = std::string("packing the corpus: ") + maxsim_last_error();
      return nullptr;
    }
    maxsim_packed_desc desc{};
    maxsim_packed_describe(p->p, &desc);
    const auto* h = static_cast<const maxsim_pack_header*>(desc.data);
    DocsView v;
    v.rows = reinterpret_cast<const float*>(static_cast<const uint8_t*>(desc.data) +
                                            h->regions[MAXSIM_REGION_ORIGINALS].offset);
    v.stride = h->orig_row_bytes / 4;
    v.offsets = desc.offsets;
    v.n_docs = desc.n_sets;
    v.dim = desc.dim;
    d->views.push_back(v);
    d->corpus.push_back(std::move(p));
  }
  d->reference.resize(s.nd);
  maxsim_sets qs{d->query.p, nullptr}, ds{d->corpus[0]->p, nullptr};
  maxsim_score_options so;
  maxsim_score_options_init(&so);
  if (maxsim_score_matrix(ctx, &qs, &ds, &so, d->reference.data(), nullptr) != MAXSIM_OK) {
    *error = std::string("reference scores: ") + maxsim_last_error();
    return nullptr;
  }
  g_data = std::move(d);
  return g_data.get();
}

// GSO/s of the baselines measured so far in this run: (shape, threads, baseline) -> GSO/s.
std::map<std::tuple<std::string, int, std::string>, double> g_baseline;

// ---- the timed loop ----------------------------------------------------------------------------------------

// Runs fn(replica, out) once per iteration, cycling through replicas and per-replica output buffers, and
// sets the rate counters from its own wall-clock measurement of the loop.
template <typename Fn>
double TimedLoop(benchmark::State& state, ShapeData& d, std::vector<std::vector<float>>* outs, Fn fn) {
  const size_t r = d.corpus.size();
  outs->assign(r, std::vector<float>(d.shape->nd, std::nanf("")));
  size_t i = 0;
  const auto t0 = Clock::now();
  for (auto _ : state) {
    const size_t rep = i++ % r;
    float* out = (*outs)[rep].data();
    fn(rep, out);
    benchmark::DoNotOptimize(out);
    benchmark::ClobberMemory();
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const double calls = static_cast<double>(state.iterations());
  state.counters["docs_per_s"] = d.shape->nd * calls / secs;
  const double gso = d.shape->OpsPerCall() * calls / secs / 1e9;
  state.counters["GSO_per_s"] = gso;
  return gso;
}

// Checks every replica's last output against the exact reference: bit-identical, or within rel_tol.
bool CheckOutputs(benchmark::State& state, const ShapeData& d, const std::vector<std::vector<float>>& outs,
                  double rel_tol, const char* what) {
  const size_t used = std::min<size_t>(outs.size(), static_cast<size_t>(state.iterations()));
  for (size_t r = 0; r < used; ++r) {
    for (uint32_t j = 0; j < d.shape->nd; ++j) {
      const float a = outs[r][j], b = d.reference[j];
      const bool ok = rel_tol == 0 ? std::memcmp(&a, &b, 4) == 0
                                   : std::fabs(static_cast<double>(a) - b) <= rel_tol * (std::fabs(b) + 1.0);
      if (!ok) {
        char msg[256];
        std::snprintf(msg, sizeof(msg), "%s: document %u scored %.9g but exact is %.9g (replica %zu)", what, j, a,
                      b, r);
        state.SkipWithError(msg);
        return false;
      }
    }
  }
  return true;
}

// Approximate refines one token per query token with the exact similarity, so its score never exceeds the
// exact one and stays close to it (a check that the work was done, not a quality measure).
bool CheckApproximate(benchmark::State& state, const ShapeData& d, const std::vector<std::vector<float>>& outs) {
  const size_t used = std::min<size_t>(outs.size(), static_cast<size_t>(state.iterations()));
  for (size_t r = 0; r < used; ++r) {
    for (uint32_t j = 0; j < d.shape->nd; ++j) {
      const double a = outs[r][j], b = d.reference[j];
      if (!(a <= b && a >= b - 0.02 * (std::fabs(b) + 1.0))) {
        char msg[256];
        std::snprintf(msg, sizeof(msg), "approximate: document %u scored %.9g, exact is %.9g (replica %zu)", j, a, b,
                      r);
        state.SkipWithError(msg);
        return false;
      }
    }
  }
  return true;
}

void SetRatios(benchmark::State& state, const Shape& s, int threads, double gso, const std::string& self) {
  for (const char* b : {"naive", "openblas", "onednn"}) {
    if (self == b) continue;
    auto it = g_baseline.find({s.name, threads, b});
    if (it != g_baseline.end() && it->second > 0) state.counters[std::string("x_") + b] = gso / it->second;
  }
}

// ---- benchmark bodies ----------------------------------------------------------------------------------------

void BM_Kernel(benchmark::State& state, const Shape* s, std::string kernel, maxsim_mode mode) {
  const int threads = static_cast<int>(state.range(0));
  std::string error;
  ShapeData* d = Data(*s, &error);
  maxsim_context* ctx = Ctx(kernel, threads);
  if (!d || !ctx) {
    state.SkipWithError(d ? "cannot create the context" : error.c_str());
    return;
  }
  maxsim_score_options so;
  maxsim_score_options_init(&so);
  so.mode = mode;
  maxsim_sets qs{d->query.p, nullptr};
  std::vector<std::vector<float>> outs;
  maxsim_status failed = MAXSIM_OK;
  const double gso = TimedLoop(state, *d, &outs, [&](size_t rep, float* out) {
    maxsim_sets ds{d->corpus[rep]->p, nullptr};
    const maxsim_status st = maxsim_score_matrix(ctx, &qs, &ds, &so, out, nullptr);
    if (st != MAXSIM_OK) failed = st;
  });
  if (failed != MAXSIM_OK) {
    state.SkipWithError((std::string("maxsim_score_matrix: ") + maxsim_last_error()).c_str());
    return;
  }
  if (mode != MAXSIM_MODE_APPROXIMATE && !CheckOutputs(state, *d, outs, 0.0, "not bit-identical to exact")) return;
  if (mode == MAXSIM_MODE_APPROXIMATE && !CheckApproximate(state, *d, outs)) return;
  const KernelPeaks kp = PeaksOfKernel(kernel);
  if (const double p = PeakOps(kp.f32, threads); p > 0) state.counters["pct_peak"] = 100.0 * gso * 1e9 / p;
  if (mode != MAXSIM_MODE_EXACT) {
    if (const double p = PeakOps(kp.i8, threads); kp.has_i8 && p > 0) {
      state.counters["pct_i8_peak"] = 100.0 * gso * 1e9 / p;
    }
    // Screening counters, from one more (untimed) call.
    maxsim_stats stats{};
    so.stats = &stats;
    maxsim_sets ds{d->corpus[0]->p, nullptr};
    if (maxsim_score_matrix(ctx, &qs, &ds, &so, outs[0].data(), nullptr) == MAXSIM_OK && stats.query_tokens) {
      state.counters["refined_per_qtok"] = static_cast<double>(stats.refined) / stats.query_tokens;
      state.counters["multi_per_qtok"] = static_cast<double>(stats.multi_candidate) / stats.query_tokens;
    }
  }
  SetRatios(state, *s, threads, gso, kernel);
}

// The same call with the documents as dense f32 sets (maxsim_dense_sets over the replica's rows, which the
// library reads in place): what a caller pays for not packing, i.e. the per-call checks (and, in certified and
// approximate mode, the per-call quantisation), with the selected kernel.
void BM_Dense(benchmark::State& state, const Shape* s, maxsim_mode mode) {
  const int threads = static_cast<int>(state.range(0));
  std::string error;
  ShapeData* d = Data(*s, &error);
  maxsim_context* ctx = Ctx("", threads);
  if (!d || !ctx) {
    state.SkipWithError(d ? "cannot create the context" : error.c_str());
    return;
  }
  maxsim_score_options so;
  maxsim_score_options_init(&so);
  so.mode = mode;
  maxsim_sets qs{d->query.p, nullptr};
  std::vector<maxsim_dense_sets> dense(d->views.size());
  for (size_t r = 0; r < dense.size(); ++r) {
    const DocsView& v = d->views[r];
    dense[r].struct_size = sizeof(maxsim_dense_sets);
    dense[r].data = v.rows;
    dense[r].dtype = MAXSIM_F32;
    dense[r].dim = v.dim;
    dense[r].row_stride = v.stride;
    dense[r].n_sets = v.n_docs;
    dense[r].offsets = v.offsets;
  }
  std::vector<std::vector<float>> outs;
  maxsim_status failed = MAXSIM_OK;
  const double gso = TimedLoop(state, *d, &outs, [&](size_t rep, float* out) {
    maxsim_sets ds{nullptr, &dense[rep]};
    const maxsim_status st = maxsim_score_matrix(ctx, &qs, &ds, &so, out, nullptr);
    if (st != MAXSIM_OK) failed = st;
  });
  if (failed != MAXSIM_OK) {
    state.SkipWithError((std::string("maxsim_score_matrix: ") + maxsim_last_error()).c_str());
    return;
  }
  if (mode != MAXSIM_MODE_APPROXIMATE && !CheckOutputs(state, *d, outs, 0.0, "not bit-identical to exact")) return;
  if (mode == MAXSIM_MODE_APPROXIMATE && !CheckApproximate(state, *d, outs)) return;
  SetRatios(state, *s, threads, gso, "dense");
}

// ---- candidates on a large dense corpus ---------------------------------------------------------------------

// A corpus far larger than the candidates it is reranked for: the call's cost should follow the K candidates
// (their checks, quantisation and scoring), not the corpus.
struct RerankShape {
  std::string name = "N32768_Ld16_d128_K64";
  uint64_t nd = 32768;
  uint32_t ld = 16, dim = 128, lq = 32, k = 64;
};
struct RerankData {
  cli::SynthData synth;
  std::vector<uint64_t> cand_offsets, candidates;  // one query; the first and last documents and a repeat
  std::vector<float> reference;                    // exact scores of the candidates (a dense set of only them)
};
std::unique_ptr<RerankData> g_rerank;

RerankData* Rerank(const RerankShape& s, std::string* error) {
  if (g_rerank) return g_rerank.get();
  auto r = std::make_unique<RerankData>();
  r->synth = Synthetic(s.nd, s.ld, s.dim, s.lq, 2027);
  r->candidates = {0, s.nd - 1};
  for (uint64_t c = 2; c + 1 < s.k; ++c) r->candidates.push_back((c * 7919) % s.nd);
  r->candidates.push_back(r->candidates[2]);
  r->cand_offsets = {0, r->candidates.size()};
  // Reference: the candidates' rows copied into a corpus of their own, scored as a matrix.
  std::vector<float> rows;
  std::vector<uint64_t> offsets{0};
  for (uint64_t j : r->candidates) {
    const uint64_t b = r->synth.doc_offsets[j], e = r->synth.doc_offsets[j + 1];
    rows.insert(rows.end(), r->synth.docs.begin() + b * s.dim, r->synth.docs.begin() + e * s.dim);
    offsets.push_back(offsets.back() + (e - b));
  }
  maxsim_dense_sets small = r->synth.DocSets();
  small.data = rows.data();
  small.n_sets = r->candidates.size();
  small.offsets = offsets.data();
  const maxsim_dense_sets q = r->synth.QuerySets(1);
  const maxsim_sets qs{nullptr, &q}, ds{nullptr, &small};
  r->reference.resize(r->candidates.size());
  if (maxsim_score_matrix(Ctx("", 0), &qs, &ds, nullptr, r->reference.data(), nullptr) != MAXSIM_OK) {
    *error = std::string("reference scores: ") + maxsim_last_error();
    return nullptr;
  }
  g_rerank = std::move(r);
  return g_rerank.get();
}

void BM_RerankDense(benchmark::State& state, const RerankShape* s, maxsim_mode mode) {
  const int threads = static_cast<int>(state.range(0));
  std::string error;
  RerankData* r = Rerank(*s, &error);
  maxsim_context* ctx = Ctx("", threads);
  if (!r || !ctx) {
    state.SkipWithError(r ? "cannot create the context" : error.c_str());
    return;
  }
  maxsim_score_options so;
  maxsim_score_options_init(&so);
  so.mode = mode;
  const maxsim_dense_sets q = r->synth.QuerySets(1), docs = r->synth.DocSets();
  const maxsim_sets qs{nullptr, &q}, ds{nullptr, &docs};
  std::vector<float> out(r->candidates.size(), std::nanf(""));
  maxsim_status failed = MAXSIM_OK;
  const auto t0 = Clock::now();
  for (auto _ : state) {
    const maxsim_status st = maxsim_score_candidates(ctx, &qs, &ds, r->cand_offsets.data(), r->candidates.data(),
                                                     &so, out.data(), nullptr);
    if (st != MAXSIM_OK) failed = st;
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (failed != MAXSIM_OK) {
    state.SkipWithError((std::string("maxsim_score_candidates: ") + maxsim_last_error()).c_str());
    return;
  }
  if (std::memcmp(out.data(), r->reference.data(), out.size() * sizeof(float)) != 0) {
    state.SkipWithError("candidate scores are not bit-identical to the exact scores of the same documents");
    return;
  }
  state.counters["calls_per_s"] = static_cast<double>(state.iterations()) / secs;
  state.counters["corpus_MB"] = static_cast<double>(r->synth.docs.size() * sizeof(float)) / 1e6;
}

void BM_Naive(benchmark::State& state, const Shape* s) {
  const int threads = static_cast<int>(state.range(0));
  std::string error;
  ShapeData* d = Data(*s, &error);
  if (!d) {
    state.SkipWithError(error.c_str());
    return;
  }
  const float* q = d->synth.queries.data();
  std::vector<std::vector<float>> outs;
  const double gso = TimedLoop(state, *d, &outs, [&](size_t rep, float* out) {
    NaiveScores(q, s->lq, d->views[rep], threads, out);
  });
  if (!CheckOutputs(state, *d, outs, 1e-4, "naive loops differ from exact")) return;
  if (const double p = PeakOps(BestF32Peak(), threads); p > 0) state.counters["pct_peak"] = 100.0 * gso * 1e9 / p;
  g_baseline[{s->name, threads, "naive"}] = gso;
  SetRatios(state, *s, threads, gso, "naive");
}

void BM_Gemm(benchmark::State& state, const Shape* s, GemmScorer* g) {
  const int threads = static_cast<int>(state.range(0));
  std::string error;
  ShapeData* d = Data(*s, &error);
  if (!d) {
    state.SkipWithError(error.c_str());
    return;
  }
  const float* q = d->synth.queries.data();
  g->Prepare(s->lq, d->views[0], threads);
  std::vector<std::vector<float>> outs;
  const double gso = TimedLoop(state, *d, &outs, [&](size_t rep, float* out) { g->Score(q, d->views[rep], out); });
  if (!CheckOutputs(state, *d, outs, 1e-4, "GEMM baseline differs from exact")) return;
  if (const double p = PeakOps(BestF32Peak(), threads); p > 0) state.counters["pct_peak"] = 100.0 * gso * 1e9 / p;
  g_baseline[{s->name, threads, g->name()}] = gso;
  SetRatios(state, *s, threads, gso, g->name());
}

void BM_Peak(benchmark::State& state, Peak p) {
  const int threads = static_cast<int>(state.range(0));
  int64_t iters = 1 << 18;
  double ops = 0;
  const auto t0 = Clock::now();
  for (auto _ : state) ops += RunPeak(p, threads, iters);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  state.counters["G_ops_per_s"] = ops / secs / 1e9;
  state.counters["startup_G_ops_per_s"] = PeakOps(p, threads) / 1e9;
}

// maxsim_pack_into of docs into one preallocated buffer per iteration (its first touch outside the timing);
// the last output must be valid at `level`. Seconds per call, or 0 after SkipWithError.
double TimedPack(benchmark::State& state, maxsim_context* ctx, const maxsim_dense_sets& docs,
                 maxsim_validation level) {
  uint64_t size = 0;
  maxsim_pack_size(&docs, 0, &size);
  void* out = std::aligned_alloc(64, (size + 63) / 64 * 64);
  std::memset(out, 0, size);
  uint64_t written = 0;
  maxsim_status st = MAXSIM_OK;
  const auto t0 = Clock::now();
  for (auto _ : state) {
    st = maxsim_pack_into(ctx, &docs, nullptr, out, size, &written);
    benchmark::DoNotOptimize(out);
    benchmark::ClobberMemory();
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const bool ok = st == MAXSIM_OK && written == size && maxsim_validate(out, size, level) == MAXSIM_OK;
  std::free(out);
  if (!ok) {
    state.SkipWithError((std::string("packing failed or produced an invalid buffer: ") + maxsim_last_error()).c_str());
    return 0;
  }
  return secs / static_cast<double>(state.iterations());
}

// One document of 180 x 128 f32 tokens packed into a preallocated buffer (what an indexer pays per document).
// The input (92 KB) and the output stay in L2, as when a document is packed right after it is encoded.
void BM_PackOneDoc(benchmark::State& state) {
  const cli::SynthData data = Synthetic(1, 180, 128, 32, 42);
  const double secs = TimedPack(state, Ctx("", 1), data.DocSets(), MAXSIM_VALIDATE_DEEP);
  if (secs == 0) return;
  state.counters["us_per_doc"] = secs * 1e6;
  state.counters["vectors_per_s"] = 180.0 / secs;
}

// The 1000-document corpus (Ld = 180, d = 128: 92 MB of f32, read from DRAM) packed with T threads.
void BM_PackCorpus(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  std::string error;
  ShapeData* d = Data(Shapes()[0], &error);
  if (!d) {
    state.SkipWithError(error.c_str());
    return;
  }
  const double secs = TimedPack(state, Ctx("", threads), d->synth.DocSets(), MAXSIM_VALIDATE_STANDARD);
  if (secs == 0) return;
  state.counters["docs_per_s"] = d->shape->nd / secs;
  state.counters["us_per_doc"] = secs / d->shape->nd * 1e6;
  state.counters["input_GB_per_s"] = static_cast<double>(d->synth.docs.size()) * 4 / secs / 1e9;
}

// ---- registration ------------------------------------------------------------------------------------------

std::vector<std::unique_ptr<GemmScorer>> g_gemms;

void Register() {
  auto with_threads = [](benchmark::internal::Benchmark* b, bool all_threads) {
    b->UseRealTime()->ArgName("threads");
    if (all_threads) {
      for (int t : g_cfg.threads) b->Arg(t);
    } else {
      b->Arg(1);
    }
  };
  for (const PeakInfo& p : AllPeaks()) {
    std::string why;
    if (!PeakAvailable(p.peak, &why)) {
      std::fprintf(stderr, "cpu_bench: note: peak loop %s skipped: %s\n", p.name, why.c_str());
      benchmark::AddCustomContext(std::string("peak_") + p.name, "skipped: " + why);
      continue;
    }
    with_threads(benchmark::RegisterBenchmark((std::string("peak/") + p.name).c_str(), BM_Peak, p.peak), true);
  }
  with_threads(benchmark::RegisterBenchmark("pack/one_doc_Ld180_d128", BM_PackOneDoc), false);
  with_threads(benchmark::RegisterBenchmark("pack/corpus_Ld180x1000_d128", BM_PackCorpus), true);

  // Kernels: every available one (or those named by --kernels).
  std::vector<std::string> kernels;
  for (size_t i = 0; i < maxsim_kernel_count(); ++i) {
    const char* name = maxsim_kernel_name(i);
    const char* why = nullptr;
    const bool wanted = g_cfg.kernels.empty() ||
                        std::find(g_cfg.kernels.begin(), g_cfg.kernels.end(), name) != g_cfg.kernels.end();
    if (!wanted) continue;
    if (!maxsim_kernel_available(i, &why)) {
      std::fprintf(stderr, "cpu_bench: note: kernel %s skipped: %s\n", name, why ? why : "unavailable");
      benchmark::AddCustomContext(std::string("kernel_") + name, std::string("skipped: ") + (why ? why : ""));
      continue;
    }
    benchmark::AddCustomContext(std::string("kernel_") + name, "benchmarked");
    kernels.push_back(name);
  }
  for (const std::string& k : g_cfg.kernels) {
    bool known = false;
    for (size_t i = 0; i < maxsim_kernel_count(); ++i) known = known || k == maxsim_kernel_name(i);
    if (!known) std::fprintf(stderr, "cpu_bench: note: --kernels names '%s', which is not in the kernel list\n", k.c_str());
  }
  for (auto make : {MakeOpenBlasScorer, MakeOneDnnScorer}) {
    std::string why;
    std::unique_ptr<GemmScorer> g = make(&why);
    if (g) {
      benchmark::AddCustomContext(std::string("baseline_") + g->name(), "yes");
      g_gemms.push_back(std::move(g));
    } else {
      std::fprintf(stderr, "cpu_bench: note: baseline skipped: %s\n", why.c_str());
      benchmark::AddCustomContext(make == MakeOpenBlasScorer ? "baseline_openblas" : "baseline_onednn",
                                  "skipped: " + why);
    }
  }
  const char* modes[] = {"exact", "certified", "approximate"};
  const maxsim_mode mode_ids[] = {MAXSIM_MODE_EXACT, MAXSIM_MODE_CERTIFIED, MAXSIM_MODE_APPROXIMATE};
  for (const Shape& s : Shapes()) {
    const std::string base = "maxsim/" + s.name + "/";
    with_threads(benchmark::RegisterBenchmark((base + "naive/exact").c_str(), BM_Naive, &s), true);
    for (auto& g : g_gemms) {
      with_threads(benchmark::RegisterBenchmark((base + g->name() + "/exact").c_str(), BM_Gemm, &s, g.get()), true);
    }
    for (const std::string& k : kernels) {
      for (int m = 0; m < 3; ++m) {
        with_threads(
            benchmark::RegisterBenchmark((base + k + "/" + modes[m]).c_str(), BM_Kernel, &s, k, mode_ids[m]), true);
      }
    }
    for (int m = 0; m < 2; ++m) {  // exact and certified from dense f32 documents, the selected kernel
      with_threads(benchmark::RegisterBenchmark((base + "dense/" + modes[m]).c_str(), BM_Dense, &s, mode_ids[m]),
                   true);
    }
  }
  static const RerankShape kRerank;
  for (int m = 0; m < 2; ++m) {
    const std::string name = "candidates/" + kRerank.name + "/dense/" + modes[m];
    with_threads(benchmark::RegisterBenchmark(name.c_str(), BM_RerankDense, &kRerank, mode_ids[m]), true);
  }
}

void MeasurePeaksAndDescribe() {
  const CpuInfo& cpu = GetCpuInfo();
  benchmark::AddCustomContext("command", g_cfg.command);
  if (!g_cfg.note.empty()) benchmark::AddCustomContext("note", g_cfg.note);
  benchmark::AddCustomContext("cores_online", std::to_string(sysconf(_SC_NPROCESSORS_ONLN)));
  benchmark::AddCustomContext("cpu_brand", cpu.brand);
  benchmark::AddCustomContext("cpu_features", FeatureNames(cpu.features));
  benchmark::AddCustomContext("libmaxsim", maxsim_version_string());
  if (maxsim_context* c = Ctx("", 0)) benchmark::AddCustomContext("kernel_selected", maxsim_context_kernel(c));
  benchmark::AddCustomContext("llc_bytes", std::to_string(LastLevelCacheBytes()));
  std::string threads;
  for (int t : g_cfg.threads) threads += (threads.empty() ? "" : ",") + std::to_string(t);
  benchmark::AddCustomContext("threads", threads);
  benchmark::AddCustomContext("replicas", g_cfg.replicas ? std::to_string(g_cfg.replicas) : "auto (3x LLC)");
  for (const PeakInfo& p : AllPeaks()) {
    if (!PeakAvailable(p.peak, nullptr)) continue;
    for (int t : g_cfg.threads) {
      const double ops = MeasurePeak(p.peak, t);
      g_peak[{p.peak, t}] = ops;
      char v[64];
      std::snprintf(v, sizeof(v), "%.1f", ops / 1e9);
      benchmark::AddCustomContext(std::string("peak_") + p.name + "_t" + std::to_string(t), v);
      std::fprintf(stderr, "cpu_bench: peak %-22s %2d thread%s %8.1f %s\n", p.name, t, t == 1 ? " " : "s", ops / 1e9,
                   p.unit);
    }
  }
  // Contention guard: T threads of independent FMA chains should reach ~T times one thread. If they do not,
  // the cores are shared with other work (or fewer than T exist) and multi-thread figures are not the machine's.
  const Peak f = BestF32Peak();
  const double one = PeakOps(f, 1) > 0 ? PeakOps(f, 1) : MeasurePeak(f, 1);
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  for (int t : g_cfg.threads) {
    const double scaling = PeakOps(f, t) / one;
    if (t > 1 && one > 0 && scaling < 0.8 * std::min<long>(t, cores)) {
      char msg[256];
      std::snprintf(msg, sizeof(msg),
                    "the FMA peak loop reached only %.2fx one thread with %d threads (%ld cores online): the cores "
                    "are busy with other work, so %d-thread figures do not show what this machine can do",
                    scaling, t, cores, t);
      std::fprintf(stderr, "cpu_bench: warning: %s\n", msg);
      benchmark::AddCustomContext("warning_threads_" + std::to_string(t), msg);
    }
  }
}

// Releases what the benchmarks hold before exit: libmaxsim's own globals may be gone by the time static
// destructors of this file would run.
void Cleanup() {
  g_data.reset();
  g_rerank.reset();
  for (auto& kv : g_contexts) maxsim_context_destroy(kv.second);
  g_contexts.clear();
  g_gemms.clear();
}

}  // namespace
}  // namespace maxsim::bench

int main(int argc, char** argv) {
  using namespace maxsim::bench;
  if (!ParseOwnFlags(&argc, argv)) return 2;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  MeasurePeaksAndDescribe();
  Register();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  Cleanup();
  return 0;
}
