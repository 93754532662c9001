// SPDX-License-Identifier: Apache-2.0
// The plugin host, proved with the CPU-implemented test plugin (tests/plugins/test_plugin.cc) built in working
// and broken variants into one folder, plus a file that is not a shared library at all.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "maxsim/maxsim.hpp"
#include "plugin_host.h"
#include "plugin_test_util.h"
#include "test_util.h"

namespace maxsim::test {
namespace {

constexpr uint64_t kMarker = kPluginMarker;

// A folder holding every test plugin variant and one garbage .so.
const std::string& PluginDir() {
  static const std::string dir = [] {
    const std::string garbage = std::string(MAXSIM_TEST_PLUGIN_DIR) + "/libmaxsim-plugin-garbage.so";
    std::ofstream(garbage) << "this is not an ELF file\n";
    return std::string(MAXSIM_TEST_PLUGIN_DIR);
  }();
  return dir;
}

maxsim_options Options(const char* backend, Log* log) { return PluginOptions(PluginDir(), backend, log); }

struct Data {
  TokenSets q, d;
  Data() {
    std::mt19937_64 rng(51);
    q = Generate(rng, Shape::kUnitGaussian, 3, 0, 16, 32);
    d = Generate(rng, Shape::kGaussian, 12, 0, 30, 32);
  }
};

TEST(PluginHost, DiscoveryLoadsGoodPluginsAndSkipsBadOnesWithOneLineEach) {
  Log log;
  const maxsim_options o = Options("cpu", &log);
  Context ctx(o);
  EXPECT_EQ(ctx.Backend(), "cpu");
  // One line per plugin that cannot be used, naming the reason.
  EXPECT_EQ(log.Count("libmaxsim-plugin-testcpu-badabi.so skipped: built for plugin ABI 99.0"), 1u);
  EXPECT_EQ(log.Count("libmaxsim-plugin-testcpu-nosymbol.so skipped: it does not export maxsim_plugin_entry"), 1u);
  EXPECT_EQ(log.Count("libmaxsim-plugin-testcpu-small.so skipped: its function table is 16 bytes"), 1u);
  EXPECT_EQ(log.Count("libmaxsim-plugin-garbage.so skipped: dlopen failed"), 1u);
  EXPECT_EQ(log.Count("plugin testcpu-noprobe"), 1u);
  EXPECT_EQ(log.Count("no test device (simulated: driver missing)"), 1u);
  const std::string report = ctx.Report();
  EXPECT_NE(report.find("testcpu  "), std::string::npos) << report;
  EXPECT_NE(report.find("available: test device"), std::string::npos) << report;
  EXPECT_NE(report.find("unavailable: no test device"), std::string::npos) << report;
  EXPECT_NE(report.find("skipped"), std::string::npos) << report;
  EXPECT_NE(report.find("Backend: cpu"), std::string::npos) << report;
}

// With no plugin path, the host looks beside the library (<its folder>/maxsim/plugins, then its folder); a
// default folder that does not exist is searched silently (no warning, no "skipped" entry).
TEST(PluginHost, DefaultFoldersBesideTheLibraryAreSearchedSilentlyWhenAbsent) {
  unsetenv("MAXSIM_PLUGIN_PATH");
  Log log;
  maxsim_options o;
  maxsim_options_init(&o);
  o.log = &Log::Sink;
  o.log_user_data = &log;
  maxsim_context* ctx = nullptr;
  ASSERT_EQ(maxsim_context_create(&o, &ctx), MAXSIM_OK) << maxsim_last_error();
  size_t needed = 0;
  maxsim_context_report(ctx, nullptr, 0, &needed);
  std::string report(needed, '\0');
  ASSERT_EQ(maxsim_context_report(ctx, report.data(), report.size(), &needed), MAXSIM_OK);
  maxsim_context_destroy(ctx);
  const std::string libdir = LibraryDirectory();
  ASSERT_FALSE(libdir.empty());
  EXPECT_NE(report.find("searched " + libdir + "/maxsim/plugins:" + libdir + ")"), std::string::npos) << report;
  EXPECT_EQ(report.find("skipped"), std::string::npos) << report;
  EXPECT_EQ(log.Count("skipped"), 0u);
}

TEST(PluginHost, NamedBackendRunsEveryOperationOnThePluginWithIdenticalResults) {
  Data data;
  Log log;
  Context cpu(Options("cpu", &log));
  Context plug(Options("testcpu", &log));
  EXPECT_EQ(plug.Backend(), "testcpu");
  Packed corpus = Packed::Pack(cpu, data.d.Dense());
  const uint64_t nq = data.q.n_sets(), nd = data.d.n_sets();
  for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
    maxsim_stats st{};
    std::vector<int32_t> a1(nd * data.q.rows()), a2(a1.size());
    const auto s1 = cpu.ScoreMatrix(data.q.Dense(), nq, corpus, nd, {metric}, a1.data());
    const auto s2 = plug.ScoreMatrix(data.q.Dense(), nq, corpus, nd, {metric, MAXSIM_MODE_EXACT, &st}, a2.data());
    EXPECT_GE(st.docs_pruned, kMarker) << "the call did not reach the plugin";
    EXPECT_EQ(std::memcmp(s1.data(), s2.data(), s1.size() * 4), 0);
    EXPECT_EQ(a1, a2);
    // Dense host documents are packed and uploaded for the call, then freed.
    st = {};
    const auto s3 = plug.ScoreMatrix(data.q.Dense(), nq, data.d.Dense(), nd, {metric, MAXSIM_MODE_EXACT, &st});
    EXPECT_GE(st.docs_pruned, kMarker);
    EXPECT_EQ(std::memcmp(s1.data(), s3.data(), s1.size() * 4), 0);
    // Candidates and top-k.
    std::vector<uint64_t> off{0, 2, 2, 5}, cand{3, 1, 0, 11, 3};
    std::vector<float> c1(cand.size()), c2(cand.size());
    cpu.ScoreCandidates(data.q.Dense(), corpus, off, cand, c1, {metric});
    st = {};
    plug.ScoreCandidates(data.q.Dense(), corpus, off, cand, c2, {metric, MAXSIM_MODE_EXACT, &st});
    EXPECT_GE(st.docs_pruned, kMarker);
    EXPECT_EQ(std::memcmp(c1.data(), c2.data(), c1.size() * 4), 0);
    const TopKResult t1 = cpu.TopK(data.q.Dense(), nq, corpus, 4, {metric});
    const TopKResult t2 = plug.TopK(data.q.Dense(), nq, corpus, 4, {metric});
    EXPECT_EQ(t1.index, t2.index);
    EXPECT_EQ(std::memcmp(t1.scores.data(), t2.scores.data(), t1.scores.size() * 4), 0);
  }
}

TEST(PluginHost, UploadedCorporaAreCachedAndFreedWithTheirHandle) {
  Data data;
  Log log;
  Context plug(Options("testcpu", &log));
  std::vector<float> out(data.q.n_sets() * data.d.n_sets());
  maxsim_stats st{};
  uint64_t live_before = 0;
  {
    Packed corpus = Packed::Pack(plug, data.d.Dense());
    plug.ScoreMatrix(data.q.Dense(), corpus, out, {MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT, &st});
    live_before = st.docs_pruned - kMarker;
    EXPECT_GE(live_before, 1u);
    plug.ScoreMatrix(data.q.Dense(), corpus, out, {MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT, &st});
    EXPECT_EQ(st.docs_pruned - kMarker, live_before) << "a second call must reuse the device copy";
  }  // the handle is released here: its device copy must go too
  Packed other = Packed::Pack(plug, data.d.Dense());
  plug.ScoreMatrix(data.q.Dense(), other, out, {MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT, &st});
  EXPECT_EQ(st.docs_pruned - kMarker, live_before) << "released corpus still alive on the device";
}

TEST(PluginHost, AutoRoutesLargePackedWorkToThePluginAndSmallOrDenseWorkToTheCpu) {
  Data data;
  Log log;
  Context ctx(Options("auto", &log));
  EXPECT_EQ(ctx.Backend(), "testcpu") << ctx.Report();
  EXPECT_NE(ctx.Report().find("auto -> testcpu"), std::string::npos);
  // The failing-create plugin sorts first; auto must have logged it and moved on.
  EXPECT_EQ(log.Count("plugin testcpu-failcreate failed to start: simulated device initialisation failure"), 1u);
  Packed corpus = Packed::Pack(ctx, data.d.Dense());
  std::vector<float> out(data.q.n_sets() * data.d.n_sets());
  maxsim_stats st{};
  ctx.ScoreMatrix(data.q.Dense(), corpus, out, {MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT, &st});
  EXPECT_GE(st.docs_pruned, kMarker) << "large packed work goes to the plugin";
  st = {};
  ctx.ScoreMatrix(data.q.Dense(), data.d.Dense(), out, {MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT, &st});
  EXPECT_EQ(st.docs_pruned, 0u) << "dense host documents stay on the CPU under auto";
  // Tiny work (below the plugin's min_auto_ops = 1000) stays on the CPU too.
  TokenSets one;
  one.dim = 32;
  one.values.assign(32, 0.5f);
  one.offsets = {0, 1};
  one.Encode(MAXSIM_F32);
  Packed tiny = Packed::Pack(ctx, one.Dense());
  float s = 0;
  st = {};
  ctx.ScoreMatrix(one.Dense(), tiny, Span<float>(&s, 1), {MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT, &st});
  EXPECT_EQ(st.docs_pruned, 0u);
}

TEST(PluginHost, UnavailableOrFailingNamedBackendsAreErrors) {
  Log log;
  maxsim_context* ctx = nullptr;
  maxsim_options o = Options("testcpu-noprobe", &log);
  EXPECT_EQ(maxsim_context_create(&o, &ctx), MAXSIM_ERR_BACKEND_UNAVAILABLE);
  EXPECT_NE(std::string(maxsim_last_error()).find("no test device (simulated: driver missing)"), std::string::npos)
      << maxsim_last_error();
  o = Options("testcpu-failcreate", &log);
  EXPECT_EQ(maxsim_context_create(&o, &ctx), MAXSIM_ERR_BACKEND_UNAVAILABLE);
  EXPECT_NE(std::string(maxsim_last_error()).find("simulated device initialisation failure"), std::string::npos);
  o = Options("testcpu-badabi", &log);
  EXPECT_EQ(maxsim_context_create(&o, &ctx), MAXSIM_ERR_BACKEND_UNAVAILABLE);
  EXPECT_NE(std::string(maxsim_last_error()).find("ABI 99.0"), std::string::npos) << maxsim_last_error();
  o = Options("nonesuch", &log);
  EXPECT_EQ(maxsim_context_create(&o, &ctx), MAXSIM_ERR_BACKEND_UNAVAILABLE);
  EXPECT_NE(std::string(maxsim_last_error()).find("testcpu"), std::string::npos) << "lists the known backends";
  EXPECT_EQ(ctx, nullptr);
  // With plugin loading disabled nothing is dlopened and a named plugin is unknown.
  o = Options("testcpu", &log);
  o.load_plugins = 0;
  EXPECT_EQ(maxsim_context_create(&o, &ctx), MAXSIM_ERR_BACKEND_UNAVAILABLE);
}

TEST(PluginHost, DeviceMemoryInputsGoToTheTrainingEntryPoints) {
  // The test plugin's "device" is host memory, so this exercises the routing of MAXSIM_MEMORY_CUDA inputs.
  Data data;
  Log log;
  Context cpu(Options("cpu", &log));
  Context plug(Options("testcpu", &log));
  const uint64_t nq = data.q.n_sets(), nd = data.d.n_sets();
  DenseSets qd = data.q.Dense(), dd = data.d.Dense();
  std::vector<int32_t> a1(nd * data.q.rows()), a2(a1.size());
  const auto s1 = cpu.ScoreMatrix(qd, nq, dd, nd, {}, a1.data());
  DenseSets qdev = data.q.Dense(), ddev = data.d.Dense();
  qdev.InDeviceMemory();
  ddev.InDeviceMemory();
  const auto s2 = plug.ScoreMatrix(qdev, nq, ddev, nd, {}, a2.data());
  EXPECT_EQ(std::memcmp(s1.data(), s2.data(), s1.size() * 4), 0);
  EXPECT_EQ(a1, a2);
  std::vector<float> g(nq * nd), gq1(data.q.rows() * 32), gd1(data.d.rows() * 32), gq2(gq1.size()), gd2(gd1.size());
  for (size_t i = 0; i < g.size(); ++i) g[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
  maxsim_backward_args args;
  maxsim_backward_args_init(&args);
  args.argmax = a1.data();
  args.grad_scores = g.data();
  args.grad_queries = gq1.data();
  args.grad_documents = gd1.data();
  cpu.Backward(qd, dd, args);
  args.grad_queries = gq2.data();
  args.grad_documents = gd2.data();
  plug.Backward(qdev, ddev, args);
  EXPECT_EQ(gq1, gq2);
  EXPECT_EQ(gd1, gd2);
  // Certified mode needs packed buffers; device tensors say so.
  std::vector<float> out(nq * nd);
  try {
    plug.ScoreMatrix(qdev, ddev, out, {MAXSIM_METRIC_DOT, MAXSIM_MODE_CERTIFIED});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), MAXSIM_ERR_UNSUPPORTED);
  }
}

}  // namespace
}  // namespace maxsim::test
