// SPDX-License-Identifier: Apache-2.0
// The real CUDA plugin as the host sees it, on any machine (CI has no GPU): it was built, exports exactly one
// symbol, speaks this library's ABI, loads, and its probe says whether it can run here and why. Without a
// usable GPU (no driver: cudaGetDeviceCount returns 35) the library falls back to the CPU with the same results
// as a CPU-only context, MAXSIM_BACKEND=cuda is an error naming the reason, and device-memory inputs are
// refused with a clear message. On a machine with a GPU the same tests check the available branch instead.
// The GPU conformance suite proper is tests/gpu/ (run on a machine with an NVIDIA GPU by scripts/device/gpu-tests.sh).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "half.h"
#include "host_check.h"
#include "maxsim/maxsim.hpp"
#include "maxsim/plugin.h"
#include "packed.h"
#include "test_util.h"

namespace maxsim::test {
namespace {

const char* kPlugin = MAXSIM_CUDA_PLUGIN_PATH;

struct Probed {
  bool loaded = false;
  bool available = false;
  std::string info;
};

// Loads the plugin directly (as the host does) and runs its probe.
const Probed& ProbeOnce() {
  static const Probed p = [] {
    Probed r;
    void* h = dlopen(kPlugin, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!h) return r;
    auto entry = reinterpret_cast<maxsim_plugin_entry_fn>(dlsym(h, MAXSIM_PLUGIN_ENTRY_SYMBOL));
    if (!entry) return r;
    const maxsim_plugin_api* api = entry();
    if (!api) return r;
    r.loaded = true;
    maxsim_plugin_host host{};
    host.struct_size = sizeof(host);
    host.abi_major = MAXSIM_PLUGIN_ABI_MAJOR;
    host.abi_minor = MAXSIM_PLUGIN_ABI_MINOR;
    host.log = [](void*, maxsim_log_level, const char*) {};
    char info[512] = {};
    r.available = api->probe(&host, info, sizeof(info)) == MAXSIM_OK;
    r.info = info;
    return r;
  }();
  return p;
}

struct Log {
  std::vector<std::string> lines;
  static void Sink(void* user, maxsim_log_level, const char* message) {
    static_cast<Log*>(user)->lines.push_back(message);
  }
};

maxsim_options Options(const char* backend, Log* log) {
  maxsim_options o;
  maxsim_options_init(&o);
  o.plugin_path = kPlugin;
  o.backend = backend;
  o.num_threads = 2;
  o.log = &Log::Sink;
  o.log_user_data = log;
  return o;
}

TEST(CudaPluginHost, ExportsExactlyOneSymbol) {
  const std::string cmd = std::string("nm -D --defined-only '") + kPlugin + "' 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) GTEST_SKIP() << "cannot run nm";
  std::vector<std::string> symbols;
  char line[512];
  while (std::fgets(line, sizeof(line), f)) {
    std::string s(line);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    const size_t sp = s.rfind(' ');
    if (sp != std::string::npos) symbols.push_back(s.substr(sp + 1));
  }
  const int rc = pclose(f);
  if (rc != 0 && symbols.empty()) GTEST_SKIP() << "nm is not available";
  ASSERT_EQ(symbols.size(), 1u) << "the plugin must export exactly one symbol";
  EXPECT_EQ(symbols[0], MAXSIM_PLUGIN_ENTRY_SYMBOL);
}

TEST(CudaPluginHost, NeedsNoCudaRuntimeLibrary) {
  // Static cudart: loading the plugin must not need libcudart.so (CI machines have none).
  const std::string cmd = std::string("ldd '") + kPlugin + "' 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) GTEST_SKIP() << "cannot run ldd";
  std::string out;
  char line[512];
  while (std::fgets(line, sizeof(line), f)) out += line;
  pclose(f);
  if (out.empty()) GTEST_SKIP() << "ldd printed nothing";
  EXPECT_EQ(out.find("libcudart"), std::string::npos) << out;
  EXPECT_EQ(out.find("not found"), std::string::npos) << out;
}

TEST(CudaPluginHost, LoadsWithThisAbiAndProbes) {
  void* h = dlopen(kPlugin, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  ASSERT_NE(h, nullptr) << dlerror();
  auto entry = reinterpret_cast<maxsim_plugin_entry_fn>(dlsym(h, MAXSIM_PLUGIN_ENTRY_SYMBOL));
  ASSERT_NE(entry, nullptr);
  const maxsim_plugin_api* api = entry();
  ASSERT_NE(api, nullptr);
  EXPECT_EQ(api->abi_major, MAXSIM_PLUGIN_ABI_MAJOR);
  EXPECT_GE(api->struct_size, sizeof(maxsim_plugin_api));
  EXPECT_STREQ(api->name, "cuda");
  EXPECT_TRUE(MAXSIM_PLUGIN_HAS(api, train_backward));
  const Probed& p = ProbeOnce();
  ASSERT_TRUE(p.loaded);
  EXPECT_FALSE(p.info.empty()) << "the probe must say what it found or why it cannot run";
  if (!p.available) {
    // This machine has no usable GPU: the reason names the CUDA call and its error code.
    EXPECT_NE(p.info.find("cudaGetDeviceCount"), std::string::npos) << p.info;
  }
}

TEST(CudaPluginHost, ReportAndBackendSelection) {
  const Probed& p = ProbeOnce();
  ASSERT_TRUE(p.loaded);
  Log log;
  maxsim_options o = Options("auto", &log);
  Context ctx(o);
  const std::string report = ctx.Report();
  EXPECT_NE(report.find("cuda"), std::string::npos) << report;
  EXPECT_NE(report.find(kPlugin), std::string::npos) << report;
  if (p.available) {
    EXPECT_EQ(ctx.Backend(), "cuda");
    EXPECT_NE(report.find("auto -> cuda"), std::string::npos) << report;
  } else {
    EXPECT_EQ(ctx.Backend(), "cpu");
    EXPECT_NE(report.find("unavailable"), std::string::npos) << report;
    EXPECT_NE(report.find(p.info), std::string::npos) << report;
    // One log line says the plugin is unavailable and the CPU is used.
    size_t lines = 0;
    for (const auto& l : log.lines) lines += l.find("unavailable") != std::string::npos;
    EXPECT_EQ(lines, 1u);
  }
}

TEST(CudaPluginHost, ForcedCudaWithoutGpuIsAClearError) {
  const Probed& p = ProbeOnce();
  if (p.available) GTEST_SKIP() << "a GPU is available here: " << p.info;
  Log log;
  maxsim_options o = Options("cuda", &log);
  maxsim_context* ctx = nullptr;
  EXPECT_EQ(maxsim_context_create(&o, &ctx), MAXSIM_ERR_BACKEND_UNAVAILABLE);
  EXPECT_EQ(ctx, nullptr);
  const std::string msg = maxsim_last_error();
  EXPECT_NE(msg.find("cuda"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unavailable"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cudaGetDeviceCount"), std::string::npos) << msg;
}

TEST(CudaPluginHost, FallbackGivesTheCpuResults) {
  const Probed& p = ProbeOnce();
  if (p.available) GTEST_SKIP() << "a GPU is available here (tests/gpu checks the GPU results): " << p.info;
  std::mt19937_64 rng(404);
  TokenSets q = Generate(rng, Shape::kUnitGaussian, 3, 0, 12, 64);
  TokenSets d = Generate(rng, Shape::kClustered, 40, 0, 50, 64);
  q.Encode(MAXSIM_BF16);
  d.Encode(MAXSIM_BF16);
  Log log;
  Context with_plugin(Options("auto", &log));
  maxsim_options cpu_only = Options("cpu", &log);
  cpu_only.load_plugins = 0;
  Context cpu(cpu_only);
  for (maxsim_mode mode : {MAXSIM_MODE_EXACT, MAXSIM_MODE_CERTIFIED, MAXSIM_MODE_APPROXIMATE}) {
    ScoreOptions so;
    so.mode = mode;
    Packed pd = Packed::Pack(with_plugin, d.Dense());
    std::vector<float> a(q.n_sets() * d.n_sets()), b(a.size());
    std::vector<int32_t> aa(d.n_sets() * q.rows()), ab(aa.size());
    with_plugin.ScoreMatrix(q.Dense(), pd, a, so, aa.data());
    cpu.ScoreMatrix(q.Dense(), pd, b, so, ab.data());
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "mode " << mode;
    ASSERT_EQ(aa, ab);
    if (mode != MAXSIM_MODE_APPROXIMATE) {
      for (uint64_t i = 0; i < q.n_sets(); ++i) {
        for (uint64_t j = 0; j < d.n_sets(); ++j) {
          const int32_t* am = aa.data() + d.n_sets() * q.offsets[i] + j * q.length(i);
          const std::string err = CheckPair(q, i, d, j, MAXSIM_METRIC_DOT, a[i * d.n_sets() + j], am);
          ASSERT_TRUE(err.empty()) << err;
        }
      }
    }
    TopKResult ta = with_plugin.TopK(q.Dense(), q.n_sets(), pd, 5, so);
    TopKResult tb = cpu.TopK(q.Dense(), q.n_sets(), pd, 5, so);
    EXPECT_EQ(ta.index, tb.index);
  }
}

TEST(CudaPluginHost, DeviceMemoryWithoutGpuIsRefused) {
  const Probed& p = ProbeOnce();
  if (p.available) GTEST_SKIP() << "a GPU is available here: " << p.info;
  Log log;
  Context ctx(Options("auto", &log));
  std::vector<float> data(4 * 8, 0.5f);
  std::vector<uint64_t> off = {0, 4};
  DenseSets q(data.data(), 8, off);
  q.InDeviceMemory();
  std::vector<float> scores(1);
  maxsim_score_options so;
  maxsim_score_options_init(&so);
  maxsim_sets qs{nullptr, q.get()}, ds{nullptr, q.get()};
  EXPECT_EQ(maxsim_score_matrix(ctx.get(), &qs, &ds, &so, scores.data(), nullptr), MAXSIM_ERR_BACKEND_UNAVAILABLE);
  EXPECT_NE(std::string(maxsim_last_error()).find("CUDA memory"), std::string::npos) << maxsim_last_error();
}

// The plugin's host-side check of dense host queries (host_check.h; dot metric) makes the packer's decision for
// every row: f32, bf16 and f16 rows of 1..300 elements with magnitudes from 1e-2 to past the 1e19 norm bound,
// near-bound rows (where the fast bound is inconclusive and the exact double sum decides), non-finite elements.
TEST(CudaPluginHost, HostQueryCheckMakesThePackersDecision) {
  std::mt19937_64 rng(77);
  std::normal_distribution<double> g;
  uint64_t rejected = 0, near = 0, n = 0;
  for (int it = 0; it < 30000; ++it) {
    const uint32_t dim = 1 + static_cast<uint32_t>(rng() % 300);
    // Half the rows sit just around the bound: norm 1e19 * (1 +- 1e-6) before rounding to the element type.
    const bool at_bound = (it & 1) != 0;
    std::vector<double> x(dim);
    double sq = 0;
    for (double& v : x) {
      v = g(rng);
      sq += v * v;
    }
    const double scale = at_bound ? 1e19 / std::sqrt(sq) * (1.0 + (static_cast<double>(rng() % 2001) - 1000) * 1e-9)
                                  : std::pow(10.0, static_cast<double>(rng() % 420) / 10.0 - 2.0) / std::sqrt(dim);
    std::vector<float> f(dim);
    for (uint32_t k = 0; k < dim; ++k) f[k] = static_cast<float>(x[k] * scale);
    if (rng() % 40 == 0) f[rng() % dim] = (rng() & 1) ? std::nanf("") : -INFINITY;
    std::vector<uint16_t> b(dim), h(dim);
    for (uint32_t k = 0; k < dim; ++k) {
      b[k] = F32ToBf16(f[k]);
      h[k] = F32ToF16(f[k]);
    }
    auto packer = [&](auto widen) {
      std::vector<float> w(dim);
      for (uint32_t k = 0; k < dim; ++k) w[k] = widen(k);
      const pack::RowStats st = pack::AnalyzeRowRef(w.data(), dim);
      return st.finite && pack::NormAccepted(st.norm_sq);
    };
    const bool want_f32 = packer([&](uint32_t k) { return f[k]; });
    const bool want_bf16 = packer([&](uint32_t k) { return Bf16ToF32(b[k]); });
    const bool want_f16 = packer([&](uint32_t k) { return F16ToF32(h[k]); });
    ASSERT_EQ(mscuda::QueryRowsAccepted(reinterpret_cast<const uint8_t*>(f.data()), dim * 4, MAXSIM_F32, dim, 1),
              want_f32) << "f32 row " << it << " dim " << dim;
    ASSERT_EQ(mscuda::QueryRowsAccepted(reinterpret_cast<const uint8_t*>(b.data()), dim * 2, MAXSIM_BF16, dim, 1),
              want_bf16) << "bf16 row " << it << " dim " << dim;
    ASSERT_EQ(mscuda::QueryRowsAccepted(reinterpret_cast<const uint8_t*>(h.data()), dim * 2, MAXSIM_F16, dim, 1),
              want_f16) << "f16 row " << it << " dim " << dim;
    rejected += !want_f32 + !want_bf16 + !want_f16;
    near += at_bound;
    n += 3;
  }
  // Both decisions occur often, near the bound too (the test would not notice a check that always says one).
  EXPECT_GT(rejected, n / 10);
  EXPECT_LT(rejected, n * 9 / 10);
  EXPECT_GT(near, 10000u);
  // Several rows: one bad row anywhere rejects them all.
  std::vector<uint16_t> rows(5 * 64, F32ToBf16(0.5f));
  EXPECT_TRUE(mscuda::QueryRowsAccepted(reinterpret_cast<const uint8_t*>(rows.data()), 128, MAXSIM_BF16, 64, 5));
  rows[3 * 64 + 63] = F32ToBf16(std::nanf(""));
  EXPECT_FALSE(mscuda::QueryRowsAccepted(reinterpret_cast<const uint8_t*>(rows.data()), 128, MAXSIM_BF16, 64, 5));
}

}  // namespace
}  // namespace maxsim::test
