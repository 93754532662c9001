// SPDX-License-Identifier: Apache-2.0
// Plugin ABI 1.4 on the host side, with the test plugin's ABI variants (test-plugins-abi/, built by
// plugins/CMakeLists.txt): ABI 1.0, 1.1 and 1.2 tables keep loading and working; a table that leaves one member
// NULL is never called through it (a named backend reports MAXSIM_ERR_UNSUPPORTED naming the member, auto runs the
// call on the CPU); memory kinds a plugin does not accept are refused; several devices shard a corpus and give the
// CPU's bits, a 1.3 plugin writing its columns of the caller's score matrix itself.
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "maxsim/maxsim.hpp"
#include "plugin_test_util.h"
#include "test_util.h"

namespace maxsim::test {
namespace {

constexpr uint64_t kMarker = kPluginMarker;

// The test plugin's file: one of its ABI variants, or "testcpu", the plugin itself.
std::string VariantPath(const std::string& name) {
  if (name == "testcpu") return std::string(MAXSIM_TEST_PLUGIN_DIR) + "/libmaxsim-plugin-testcpu.so";
  return std::string(MAXSIM_TEST_PLUGIN_ABI_DIR) + "/libmaxsim-plugin-" + name + ".so";
}

// A context that loads exactly one plugin file (debug lines kept: the test plugin logs device creation).
maxsim_options Options(const std::string& path, const char* backend, Log* log) {
  log->min_level = MAXSIM_LOG_DEBUG;
  return PluginOptions(path, backend, log);
}

maxsim_options CpuOptions(Log* log) {
  static const std::string kNoPath;
  maxsim_options o = PluginOptions(kNoPath, "cpu", log);
  o.load_plugins = 0;
  return o;
}

struct Data {
  TokenSets q, d;
  explicit Data(uint64_t seed = 71, uint64_t nd = 12) {
    std::mt19937_64 rng(seed);
    q = Generate(rng, Shape::kUnitGaussian, 3, 0, 16, 32);
    d = Generate(rng, Shape::kGaussian, nd, 0, 30, 32);
  }
};

// What one context computes for every host operation (and whether each call reached the plugin).
struct Results {
  maxsim_status matrix = MAXSIM_OK, candidates = MAXSIM_OK, topk = MAXSIM_OK;
  std::string matrix_error, candidates_error, topk_error;
  std::vector<float> scores, cand_scores, top_scores;
  std::vector<int32_t> argmax, cand_argmax;
  std::vector<uint64_t> top_index;
  bool matrix_on_plugin = false, candidates_on_plugin = false, topk_on_plugin = false;
};

const std::vector<uint64_t> kCandOffsets{0, 2, 2, 6};
const std::vector<uint64_t> kCandidates{3, 1, 0, 11, 3, 7};

Results RunAll(maxsim_context* ctx, const Data& data, const maxsim_packed* corpus, maxsim_metric metric, uint64_t k) {
  Results r;
  const uint64_t nq = data.q.n_sets(), nd = data.d.n_sets();
  const DenseSets qd = data.q.Dense();
  maxsim_sets qs{nullptr, qd.get()}, ds{corpus, nullptr};
  maxsim_stats st{};
  maxsim_score_options o;
  maxsim_score_options_init(&o);
  o.metric = metric;
  o.stats = &st;
  r.scores.assign(nq * nd, 0.0f);
  r.argmax.assign(nd * data.q.rows(), 0);
  r.matrix = maxsim_score_matrix(ctx, &qs, &ds, &o, r.scores.data(), r.argmax.data());
  if (r.matrix != MAXSIM_OK) r.matrix_error = maxsim_last_error();
  r.matrix_on_plugin = st.docs_pruned >= kMarker;
  st = {};
  r.cand_scores.assign(kCandidates.size(), 0.0f);
  uint64_t am = 0;
  for (uint64_t i = 0; i < nq; ++i) am += (kCandOffsets[i + 1] - kCandOffsets[i]) * data.q.length(i);
  r.cand_argmax.assign(am, 0);
  r.candidates = maxsim_score_candidates(ctx, &qs, &ds, kCandOffsets.data(), kCandidates.data(), &o,
                                         r.cand_scores.data(), r.cand_argmax.data());
  if (r.candidates != MAXSIM_OK) r.candidates_error = maxsim_last_error();
  r.candidates_on_plugin = st.docs_pruned >= kMarker;
  st = {};
  r.top_scores.assign(nq * k, 0.0f);
  r.top_index.assign(nq * k, 0);
  r.topk = maxsim_topk(ctx, &qs, &ds, k, &o, r.top_scores.data(), r.top_index.data(), nullptr);
  if (r.topk != MAXSIM_OK) r.topk_error = maxsim_last_error();
  r.topk_on_plugin = st.docs_pruned >= kMarker;
  return r;
}

void ExpectSameBits(const Results& a, const Results& b, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(a.matrix, MAXSIM_OK);
  ASSERT_EQ(b.matrix, MAXSIM_OK) << b.matrix_error;
  EXPECT_EQ(std::memcmp(a.scores.data(), b.scores.data(), a.scores.size() * 4), 0);
  EXPECT_EQ(a.argmax, b.argmax);
  ASSERT_EQ(b.candidates, MAXSIM_OK) << b.candidates_error;
  EXPECT_EQ(std::memcmp(a.cand_scores.data(), b.cand_scores.data(), a.cand_scores.size() * 4), 0);
  EXPECT_EQ(a.cand_argmax, b.cand_argmax);
  ASSERT_EQ(b.topk, MAXSIM_OK) << b.topk_error;
  EXPECT_EQ(std::memcmp(a.top_scores.data(), b.top_scores.data(), a.top_scores.size() * 4), 0);
  EXPECT_EQ(a.top_index, b.top_index);
}

Results OnCpu(const Data& data, const maxsim_packed* corpus, maxsim_metric metric, uint64_t k) {
  Log log;
  Context cpu(CpuOptions(&log));
  return RunAll(cpu.get(), data, corpus, metric, k);
}

TEST(PluginAbi, AnAbi10PluginKeepsLoadingAndRunsEveryOperation) {
  Data data;
  Log log;
  Context ctx(Options(VariantPath("testcpu-v10"), "testcpu-v10", &log));
  EXPECT_NE(ctx.Report().find("ABI 1.0"), std::string::npos) << ctx.Report();
  Packed corpus = Packed::Pack(ctx, data.d.Dense());
  for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
    const Results cpu = OnCpu(data, corpus.get(), metric, 5);
    const Results plug = RunAll(ctx.get(), data, corpus.get(), metric, 5);
    ExpectSameBits(cpu, plug, "ABI 1.0 plugin");
    EXPECT_TRUE(plug.matrix_on_plugin && plug.candidates_on_plugin && plug.topk_on_plugin);
  }
}

// One NULL member per variant: which host operation it takes away.
struct NullCase {
  const char* variant;
  const char* member;  // as the error names it
  bool matrix, candidates, topk;  // the host operations the variant still implements
};

class NullMember : public ::testing::TestWithParam<NullCase> {};

TEST_P(NullMember, NamedBackendSaysUnsupportedAndAutoRunsOnTheCpu) {
  const NullCase& c = GetParam();
  Data data;
  Log log;
  Context named(Options(VariantPath(c.variant), c.variant, &log));
  Packed corpus = Packed::Pack(named, data.d.Dense());
  const Results cpu = OnCpu(data, corpus.get(), MAXSIM_METRIC_DOT, 4);
  const Results n = RunAll(named.get(), data, corpus.get(), MAXSIM_METRIC_DOT, 4);
  const bool implemented[3] = {c.matrix, c.candidates, c.topk};
  const maxsim_status got[3] = {n.matrix, n.candidates, n.topk};
  const std::string* errors[3] = {&n.matrix_error, &n.candidates_error, &n.topk_error};
  const bool on_plugin[3] = {n.matrix_on_plugin, n.candidates_on_plugin, n.topk_on_plugin};
  for (int op = 0; op < 3; ++op) {
    SCOPED_TRACE(op);
    if (implemented[op]) {
      EXPECT_EQ(got[op], MAXSIM_OK) << *errors[op];
      EXPECT_TRUE(on_plugin[op]);
    } else {
      EXPECT_EQ(got[op], MAXSIM_ERR_UNSUPPORTED);
      EXPECT_NE(errors[op]->find(c.member), std::string::npos) << *errors[op];
      EXPECT_NE(errors[op]->find(c.variant), std::string::npos) << *errors[op];
    }
  }
  // Auto: the CPU takes what the plugin lacks, with the CPU's bits; the plugin keeps the rest.
  Context autoctx(Options(VariantPath(c.variant), "auto", &log));
  const Results a = RunAll(autoctx.get(), data, corpus.get(), MAXSIM_METRIC_DOT, 4);
  ExpectSameBits(cpu, a, std::string("auto with ") + c.variant);
  EXPECT_EQ(a.matrix_on_plugin, c.matrix);
  EXPECT_EQ(a.candidates_on_plugin, c.candidates);
  EXPECT_EQ(a.topk_on_plugin, c.topk);
  EXPECT_NE(named.Report().find(std::string("not implemented: ") + c.member), std::string::npos) << named.Report();
}

INSTANTIATE_TEST_SUITE_P(
    PluginAbi, NullMember,
    ::testing::Values(NullCase{"testcpu-no-upload", "corpus_upload", false, false, false},
                      NullCase{"testcpu-no-free", "corpus_upload", false, false, false},
                      NullCase{"testcpu-no-matrix", "score_matrix", false, true, true},
                      NullCase{"testcpu-no-candidates", "score_candidates", true, false, true},
                      NullCase{"testcpu-no-topk", "topk", true, true, false}),
    [](const ::testing::TestParamInfo<NullCase>& i) {
      std::string n = i.param.variant + std::strlen("testcpu-");
      for (char& ch : n) ch = ch == '-' ? '_' : ch;
      return n;
    });

// Device tensors ("device" memory is host memory for the test plugin, labelled MAXSIM_MEMORY_CUDA).
struct DeviceInputs {
  Data data;
  DenseSets q, d;
  std::vector<float> scores;
  std::vector<int32_t> argmax;
  DeviceInputs() : q(data.q.Dense()), d(data.d.Dense()) {
    q.InDeviceMemory();
    d.InDeviceMemory();
    scores.assign(data.q.n_sets() * data.d.n_sets(), 0.0f);
    argmax.assign(data.d.n_sets() * data.q.rows(), 0);
  }
  std::vector<float> grad_scores, grad_q, grad_d;
  maxsim_status Forward(Context& ctx, uint32_t flags = 0) {
    maxsim_sets qs{nullptr, q.get()}, ds{nullptr, d.get()};
    maxsim_score_options o;
    maxsim_score_options_init(&o);
    o.flags = flags;
    return maxsim_score_matrix(ctx.get(), &qs, &ds, &o, scores.data(), argmax.data());
  }
  maxsim_status Backward(Context& ctx, uint32_t flags = 0) {
    if (grad_scores.size() != scores.size()) grad_scores.assign(scores.size(), 0.5f);
    grad_q.assign(data.q.rows() * 32, 0.0f);
    grad_d.assign(data.d.rows() * 32, 0.0f);
    maxsim_backward_args args;
    maxsim_backward_args_init(&args);
    args.argmax = argmax.data();
    args.grad_scores = grad_scores.data();
    args.grad_queries = grad_q.data();
    args.grad_documents = grad_d.data();
    args.flags = flags;
    return maxsim_backward(ctx.get(), q.get(), d.get(), &args);
  }
  // Query row `row`'s first element becomes NaN (the rows are f32: the encoded bytes are the values).
  void PoisonQueryRow(uint64_t row) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(data.q.encoded.data() + row * 32 * 4, &nan, 4);
  }
};

TEST(PluginAbi, NullTrainingMembersAreUnsupportedForDeviceTensors) {
  for (const char* backend : {"auto", "named"}) {
    SCOPED_TRACE(backend);
    Log log;
    const bool named = std::strcmp(backend, "named") == 0;
    {
      Context ctx(Options(VariantPath("testcpu-no-trainfwd"), named ? "testcpu-no-trainfwd" : "auto", &log));
      DeviceInputs in;
      EXPECT_EQ(in.Forward(ctx), MAXSIM_ERR_UNSUPPORTED);
      EXPECT_NE(std::string(maxsim_last_error()).find("train_forward"), std::string::npos) << maxsim_last_error();
    }
    {
      Context ctx(Options(VariantPath("testcpu-no-trainbwd"), named ? "testcpu-no-trainbwd" : "auto", &log));
      DeviceInputs in;
      EXPECT_EQ(in.Forward(ctx), MAXSIM_OK) << maxsim_last_error();
      EXPECT_EQ(in.Backward(ctx), MAXSIM_ERR_UNSUPPORTED);
      EXPECT_NE(std::string(maxsim_last_error()).find("train_backward"), std::string::npos) << maxsim_last_error();
    }
    {
      // accepted_memory = 0: the plugin takes no device memory at all.
      Context ctx(Options(VariantPath("testcpu-no-devmem"), named ? "testcpu-no-devmem" : "auto", &log));
      DeviceInputs in;
      EXPECT_EQ(in.Forward(ctx), MAXSIM_ERR_UNSUPPORTED);
      EXPECT_NE(std::string(maxsim_last_error()).find("does not take"), std::string::npos) << maxsim_last_error();
      EXPECT_EQ(in.Backward(ctx), MAXSIM_ERR_UNSUPPORTED);
    }
  }
}

TEST(PluginAbi, OptionalHooksMayBeMissing) {
  Data data;
  Log log;
  {
    // No min_auto_ops: auto never routes host work to the plugin, a named backend still runs it.
    Context a(Options(VariantPath("testcpu-no-minops"), "auto", &log));
    Packed corpus = Packed::Pack(a, data.d.Dense());
    const Results r = RunAll(a.get(), data, corpus.get(), MAXSIM_METRIC_DOT, 3);
    EXPECT_FALSE(r.matrix_on_plugin || r.candidates_on_plugin || r.topk_on_plugin);
    EXPECT_NE(a.Report().find("the plugin gives no threshold"), std::string::npos) << a.Report();
    Context n(Options(VariantPath("testcpu-no-minops"), "testcpu-no-minops", &log));
    const Results rn = RunAll(n.get(), data, corpus.get(), MAXSIM_METRIC_DOT, 3);
    EXPECT_TRUE(rn.matrix_on_plugin && rn.candidates_on_plugin && rn.topk_on_plugin);
  }
  {
    // describe: its lines appear in the report; without it, none, and nothing breaks.
    Context with(Options(std::string(MAXSIM_TEST_PLUGIN_DIR) + "/libmaxsim-plugin-testcpu.so", "testcpu", &log));
    EXPECT_NE(with.Report().find("    test device 0 of 1 (MAXSIM_TEST_PLUGIN_DEVICES)"), std::string::npos)
        << with.Report();
    Context without(Options(VariantPath("testcpu-no-describe"), "testcpu-no-describe", &log));
    EXPECT_EQ(without.Report().find("MAXSIM_TEST_PLUGIN_DEVICES"), std::string::npos) << without.Report();
    Packed corpus = Packed::Pack(without, data.d.Dense());
    const Results r = RunAll(without.get(), data, corpus.get(), MAXSIM_METRIC_DOT, 3);
    EXPECT_TRUE(r.matrix_on_plugin);
  }
  {
    Context ctx(Options(VariantPath("testcpu-no-memhooks"), "testcpu-no-memhooks", &log));
    EXPECT_NE(ctx.Report().find("not implemented: mem_alloc/mem_free/mem_copy"), std::string::npos) << ctx.Report();
  }
}

// Sharding over simulated devices: every operation with the CPU's bits, argmax included, for corpora with more,
// as many and fewer sets than devices (empty shards), empty documents, masks and k beyond the corpus.
TEST(PluginAbi, SeveralDevicesShardTheCorpusAndMergeExactly) {
  Log log;
  Context two(Options(VariantPath("testcpu-2dev"), "testcpu-2dev", &log));
  EXPECT_EQ(log.Count("backend created on device 1 of 2"), 1u);
  EXPECT_NE(two.Report().find("testcpu-2dev on 2 devices"), std::string::npos) << two.Report();
  EXPECT_NE(two.Report().find("  device 1:"), std::string::npos) << two.Report();
  for (uint64_t nd : {1u, 2u, 3u, 12u, 40u}) {
    Data data(90 + nd, nd);
    Packed corpus = Packed::Pack(two, data.d.Dense());
    // Every operation where the corpus holds the documents kCandidates names (up to 11).
    for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
      for (uint64_t k : {1u, 5u, 50u}) {
        if (nd < 12) continue;
        const Results cpu = OnCpu(data, corpus.get(), metric, k);
        const Results sharded = RunAll(two.get(), data, corpus.get(), metric, k);
        ExpectSameBits(cpu, sharded, "nd " + std::to_string(nd) + " k " + std::to_string(k));
        EXPECT_TRUE(sharded.matrix_on_plugin && sharded.candidates_on_plugin && sharded.topk_on_plugin);
      }
    }
    // Matrix and top-k at every size.
    std::vector<float> s1(data.q.n_sets() * nd), s2(s1.size());
    std::vector<int32_t> a1(nd * data.q.rows()), a2(a1.size());
    Context cpu(CpuOptions(&log));
    cpu.ScoreMatrix(data.q.Dense(), corpus, s1, {}, a1.data());
    two.ScoreMatrix(data.q.Dense(), corpus, s2, {}, a2.data());
    EXPECT_EQ(std::memcmp(s1.data(), s2.data(), s1.size() * 4), 0) << nd;
    EXPECT_EQ(a1, a2) << nd;
    // One query: each shard writes its own columns of the caller's scores and argmax in place.
    std::mt19937_64 rng1(nd);
    const TokenSets q1 = Generate(rng1, Shape::kUnitGaussian, 1, 1, 16, 32);
    std::vector<float> o1(nd), o2(nd, -5.0f);
    std::vector<int32_t> b1(nd * q1.rows()), b2(b1.size(), -7);
    cpu.ScoreMatrix(q1.Dense(), corpus, o1, {}, b1.data());
    two.ScoreMatrix(q1.Dense(), corpus, o2, {}, b2.data());
    EXPECT_EQ(std::memcmp(o1.data(), o2.data(), o1.size() * 4), 0) << nd;
    EXPECT_EQ(b1, b2) << nd;
    const TopKResult t1 = cpu.TopK(data.q.Dense(), data.q.n_sets(), corpus, 3);
    const TopKResult t2 = two.TopK(data.q.Dense(), data.q.n_sets(), corpus, 3);
    EXPECT_EQ(t1.index, t2.index) << nd;
    EXPECT_EQ(std::memcmp(t1.scores.data(), t2.scores.data(), t1.scores.size() * 4), 0) << nd;
  }
}

TEST(PluginAbi, ShardedCallsWithMasksAndTiesMatchTheCpu) {
  // Masked dense documents (packed per call, argmax remapped) and duplicated documents (exact score ties across
  // shards: top-k must keep the lower index) on three simulated devices.
  setenv("MAXSIM_TEST_PLUGIN_DEVICES", "3", 1);
  Log log;
  Context three(Options(std::string(MAXSIM_TEST_PLUGIN_DIR) + "/libmaxsim-plugin-testcpu.so", "testcpu", &log));
  unsetenv("MAXSIM_TEST_PLUGIN_DEVICES");
  EXPECT_NE(three.Report().find("on 3 devices"), std::string::npos) << three.Report();
  std::mt19937_64 rng(5);
  TokenSets q = Generate(rng, Shape::kUnitGaussian, 2, 1, 9, 16);
  TokenSets base = Generate(rng, Shape::kGaussian, 4, 1, 12, 16);
  TokenSets d;  // the 4 documents three times over: documents j, j + 4 and j + 8 tie exactly
  d.dim = 16;
  d.offsets = {0};
  for (int copy = 0; copy < 3; ++copy) {
    for (uint64_t j = 0; j < base.n_sets(); ++j) {
      for (uint64_t r = base.offsets[j]; r < base.offsets[j + 1]; ++r) {
        d.values.insert(d.values.end(), base.row(r), base.row(r) + 16);
      }
      d.offsets.push_back(d.offsets.back() + base.length(j));
    }
  }
  d.mask.assign(d.rows(), 1);
  for (size_t r = 0; r < d.mask.size(); r += 5) d.mask[r] = 0;
  d.Encode(MAXSIM_BF16);
  q.Encode(MAXSIM_BF16);
  Context cpu(CpuOptions(&log));
  const uint64_t nq = q.n_sets(), nd = d.n_sets();
  std::vector<int32_t> a1(nd * q.rows()), a2(a1.size());
  const auto s1 = cpu.ScoreMatrix(q.Dense(), nq, d.Dense(), nd, {}, a1.data());
  const auto s2 = three.ScoreMatrix(q.Dense(), nq, d.Dense(), nd, {}, a2.data());
  EXPECT_EQ(std::memcmp(s1.data(), s2.data(), s1.size() * 4), 0);
  EXPECT_EQ(a1, a2);
  Packed corpus = Packed::Pack(cpu, d.Dense());
  const TopKResult t1 = cpu.TopK(q.Dense(), nq, corpus, 7);
  const TopKResult t2 = three.TopK(q.Dense(), nq, corpus, 7);
  EXPECT_EQ(t1.index, t2.index);
  EXPECT_EQ(std::memcmp(t1.scores.data(), t2.scores.data(), t1.scores.size() * 4), 0);
}

// ABI 1.2: unmasked dense host queries reach a plugin whose dense_query_modes lists the mode as they are (no
// packing per call); other modes, masked queries and a 1.1 table get them packed. The CPU's bits either way.
constexpr uint64_t kDenseMarker = 0xD15Eull;  // multi_candidate of a call whose queries arrived dense

TEST(PluginAbi, DenseHostQueriesReachAPluginThatTakesThem) {
  Data data;
  Log log;
  Context ctx(Options(std::string(MAXSIM_TEST_PLUGIN_DIR) + "/libmaxsim-plugin-testcpu.so", "testcpu", &log));
  EXPECT_NE(ctx.Report().find("dense host queries (dense_query_modes)"), std::string::npos) << ctx.Report();
  Packed corpus = Packed::Pack(ctx, data.d.Dense());
  const uint64_t nq = data.q.n_sets(), nd = data.d.n_sets();
  for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
    const Results cpu = OnCpu(data, corpus.get(), metric, 5);
    const Results plug = RunAll(ctx.get(), data, corpus.get(), metric, 5);
    ExpectSameBits(cpu, plug, "dense host queries");
    EXPECT_TRUE(plug.matrix_on_plugin && plug.candidates_on_plugin && plug.topk_on_plugin);
  }
  for (maxsim_mode mode : {MAXSIM_MODE_EXACT, MAXSIM_MODE_CERTIFIED, MAXSIM_MODE_APPROXIMATE}) {
    for (bool masked : {false, true}) {
      SCOPED_TRACE(std::to_string(mode) + (masked ? " masked" : ""));
      std::vector<uint8_t> mask(data.q.rows(), 1);
      for (size_t r = 0; r < mask.size(); r += 3) mask[r] = 0;
      DenseSets q = data.q.Dense();
      if (masked) q.WithMask(mask.data());
      maxsim_sets qs{nullptr, q.get()}, ds{corpus.get(), nullptr};
      maxsim_stats st{};
      maxsim_score_options o;
      maxsim_score_options_init(&o);
      o.mode = mode;
      o.stats = &st;
      std::vector<float> got(nq * nd), want(nq * nd);
      std::vector<int32_t> got_arg(nd * data.q.rows()), want_arg(got_arg.size());
      ASSERT_EQ(maxsim_score_matrix(ctx.get(), &qs, &ds, &o, got.data(), got_arg.data()), MAXSIM_OK) << maxsim_last_error();
      EXPECT_GE(st.docs_pruned, kMarker);
      // The test plugin takes dense queries in exact and certified modes; masked ones are always packed.
      EXPECT_EQ(st.multi_candidate == kDenseMarker, !masked && mode != MAXSIM_MODE_APPROXIMATE);
      Context cpu(CpuOptions(&log));
      o.stats = nullptr;
      o.mode = MAXSIM_MODE_EXACT;  // the plugin's scores are exact in every mode
      ASSERT_EQ(maxsim_score_matrix(cpu.get(), &qs, &ds, &o, want.data(), want_arg.data()), MAXSIM_OK);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0);
      EXPECT_EQ(got_arg, want_arg);
    }
  }
}

// Per-set row pointers (maxsim_dense_sets.set_data) never reach a plugin: the ABI's dense sets address rows from
// data only, so the host packs such queries and documents for it. The CPU's bits.
TEST(PluginAbi, SetsWithPerSetRowPointersArePackedForThePlugin) {
  Data data;
  Log log;
  Context ctx(Options(std::string(MAXSIM_TEST_PLUGIN_DIR) + "/libmaxsim-plugin-testcpu.so", "testcpu", &log));
  Context cpu(CpuOptions(&log));
  Packed corpus = Packed::Pack(cpu, data.d.Dense());
  const ScatteredSets sq(data.q), sd(data.d);
  const uint64_t nq = data.q.n_sets(), nd = data.d.n_sets();
  std::vector<int32_t> want_arg(nd * data.q.rows()), got_arg(want_arg.size());
  const auto want = cpu.ScoreMatrix(data.q.Dense(), nq, corpus, nd, {}, want_arg.data());
  for (maxsim_mode mode : {MAXSIM_MODE_EXACT, MAXSIM_MODE_CERTIFIED}) {  // the modes it takes dense queries in
    SCOPED_TRACE(mode);
    maxsim_stats st{};
    const auto got = ctx.ScoreMatrix(sq.Dense(), nq, corpus, nd, {MAXSIM_METRIC_DOT, mode, &st}, got_arg.data());
    EXPECT_GE(st.docs_pruned, kMarker) << "the call did not reach the plugin";
    EXPECT_NE(st.multi_candidate, kDenseMarker) << "the plugin was handed the sets as they are";
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0);
    EXPECT_EQ(got_arg, want_arg);
    st = {};
    const auto both = ctx.ScoreMatrix(sq.Dense(), nq, sd.Dense(), nd, {MAXSIM_METRIC_DOT, mode, &st});
    EXPECT_GE(st.docs_pruned, kMarker);
    EXPECT_EQ(std::memcmp(both.data(), want.data(), both.size() * 4), 0);
  }
}

TEST(PluginAbi, AnAbi11PluginGetsPackedQueries) {
  Data data;
  Log log;
  Context ctx(Options(VariantPath("testcpu-v11"), "testcpu-v11", &log));
  EXPECT_NE(ctx.Report().find("ABI 1.1"), std::string::npos) << ctx.Report();
  EXPECT_EQ(ctx.Report().find("dense host queries"), std::string::npos) << ctx.Report();
  Packed corpus = Packed::Pack(ctx, data.d.Dense());
  for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
    ExpectSameBits(OnCpu(data, corpus.get(), metric, 5), RunAll(ctx.get(), data, corpus.get(), metric, 5),
                   "ABI 1.1 plugin");
  }
}

// A bad dense host query: the plugin fails the call, the host names the token as the CPU does, and no output is
// written (every operation, on one and on two devices).
TEST(PluginAbi, ANonFiniteDenseQueryFailsWithNothingWritten) {
  Data data;
  const uint64_t nq = data.q.n_sets(), nd = data.d.n_sets();
  for (const char* variant : {"testcpu", "testcpu-2dev"}) {
    Log log;
    Context ctx(Options(VariantPath(variant), variant, &log));
    Context cpu(CpuOptions(&log));
    Packed corpus = Packed::Pack(ctx, data.d.Dense());
    // The last token of the last non-empty query set, then a row with a norm above 1e19.
    uint64_t set = nq;
    while (set > 0 && data.q.length(set - 1) == 0) --set;
    ASSERT_GT(set, 0u);
    --set;
    const uint64_t row = data.q.offsets[set + 1] - 1;
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 3e19f}) {
      SCOPED_TRACE(std::string(variant) + " value " + std::to_string(bad));
      TokenSets q = data.q;
      for (uint32_t k = 0; k < q.dim; ++k) q.values[row * q.dim + k] = k == 0 || bad > 1e19f ? bad : q.values[row * q.dim + k];
      q.Encode(MAXSIM_F32);
      const DenseSets qd = q.Dense();
      maxsim_sets qs{nullptr, qd.get()}, ds{corpus.get(), nullptr};
      maxsim_score_options o;
      maxsim_score_options_init(&o);
      const float poison = -12345.0f;
      std::vector<float> scores(nq * nd, poison), cand(kCandidates.size(), poison), top(nq * 3, poison);
      std::vector<int32_t> argmax(nd * q.rows(), -7);
      std::vector<uint64_t> index(nq * 3, 77);
      ASSERT_EQ(maxsim_score_matrix(cpu.get(), &qs, &ds, &o, scores.data(), nullptr), MAXSIM_ERR_NON_FINITE);
      const std::string cpu_message = maxsim_last_error();
      EXPECT_EQ(maxsim_score_matrix(ctx.get(), &qs, &ds, &o, scores.data(), argmax.data()), MAXSIM_ERR_NON_FINITE);
      EXPECT_EQ(maxsim_last_error(), cpu_message);
      EXPECT_NE(cpu_message.find("set " + std::to_string(set) + " token " + std::to_string(q.length(set) - 1)),
                std::string::npos) << cpu_message;
      EXPECT_EQ(maxsim_score_candidates(ctx.get(), &qs, &ds, kCandOffsets.data(), kCandidates.data(), &o, cand.data(),
                                        nullptr), MAXSIM_ERR_NON_FINITE);
      EXPECT_EQ(maxsim_last_error(), cpu_message);
      EXPECT_EQ(maxsim_topk(ctx.get(), &qs, &ds, 3, &o, top.data(), index.data(), nullptr), MAXSIM_ERR_NON_FINITE);
      EXPECT_EQ(maxsim_last_error(), cpu_message);
      for (float v : scores) ASSERT_EQ(v, poison);
      for (float v : cand) ASSERT_EQ(v, poison);
      for (float v : top) ASSERT_EQ(v, poison);
      for (int32_t v : argmax) ASSERT_EQ(v, -7);
      for (uint64_t v : index) ASSERT_EQ(v, 77u);
    }
  }
}

// ABI 1.3 output_layouts: on several devices, a plugin that takes column ranges writes each shard's part of the
// caller's score matrix itself (one query or many; stats.refined counts the shards that did, in the test plugin),
// while ABI 1.1 and 1.2 tables get dense per-shard matrices that the host places; every one gives the CPU's bits.
TEST(PluginAbi, ShardedMatrixGoesIntoTheCallersColumnsWhereThePluginTakesThem) {
  Data data(90, 40);
  std::mt19937_64 rng(8);
  const TokenSets q1 = Generate(rng, Shape::kUnitGaussian, 1, 1, 16, 32);
  for (const char* variant : {"testcpu-2dev", "testcpu-v12", "testcpu-v11"}) {
    SCOPED_TRACE(variant);
    const bool columns = std::strcmp(variant, "testcpu-2dev") == 0;
    Log log;
    const std::string path = VariantPath(variant);
    maxsim_options o = Options(path, variant, &log);
    o.devices = "0,1";
    Context two(o);
    EXPECT_NE(two.Report().find("on 2 devices"), std::string::npos) << two.Report();
    EXPECT_EQ(two.Report().find("score matrix into columns") != std::string::npos, columns) << two.Report();
    Packed corpus = Packed::Pack(two, data.d.Dense());
    for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
      ExpectSameBits(OnCpu(data, corpus.get(), metric, 5), RunAll(two.get(), data, corpus.get(), metric, 5), variant);
    }
    Context cpu(CpuOptions(&log));
    for (const TokenSets* q : {static_cast<const TokenSets*>(&data.q), &q1}) {
      const uint64_t nq = q->n_sets(), nd = data.d.n_sets();
      std::vector<float> s1(nq * nd), s2(nq * nd, -5.0f);
      std::vector<int32_t> a1(nd * q->rows()), a2(a1.size(), -7);
      maxsim_stats st{};
      maxsim_score_options so;
      maxsim_score_options_init(&so);
      so.stats = &st;
      cpu.ScoreMatrix(q->Dense(), corpus, s1, {}, a1.data());
      const DenseSets qd = q->Dense();
      const maxsim_sets qs{nullptr, qd.get()}, ds{corpus.get(), nullptr};
      ASSERT_EQ(maxsim_score_matrix(two.get(), &qs, &ds, &so, s2.data(), a2.data()), MAXSIM_OK) << maxsim_last_error();
      EXPECT_EQ(std::memcmp(s1.data(), s2.data(), s1.size() * 4), 0) << nq;
      EXPECT_EQ(a1, a2) << nq;
      EXPECT_GE(st.docs_pruned, kMarker);
      EXPECT_EQ(st.refined, columns ? 2u : 0u) << nq;
    }
  }
}

// The column-range check of the conformance suite fails a plugin that writes one column beyond its range (and
// passes the same plugin without that write).
TEST(PluginAbi, AScoreMatrixWrittenOutsideItsColumnsIsCaught) {
  Data data(93, 17);
  Log log;
  for (const char* variant : {"testcpu-spill", "testcpu-2dev"}) {
    Context ctx(Options(VariantPath(variant), variant, &log));
    Packed corpus = Packed::Pack(ctx, data.d.Dense());
    Packed queries = Packed::Pack(ctx, data.q.Dense());
    bool takes = false;
    const std::string m =
        MatrixColumnsMismatch(ctx.get(), queries.get(), corpus.get(), MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT, &takes);
    EXPECT_TRUE(takes) << variant;
    if (std::strcmp(variant, "testcpu-spill") == 0) {
      EXPECT_NE(m.find("outside columns [3, 20) was written"), std::string::npos) << m;
    } else {
      EXPECT_EQ(m, "");
    }
  }
}

// maxsim_options.devices: the context's device list, handed to the plugin (ABI 1.2 maxsim_plugin_host.devices):
// one backend per entry, the CPU's bits; a malformed list is refused; a list of several devices needs a plugin
// that runs on several.
TEST(PluginAbi, TheContextOptionPicksTheDevices) {
  Data data(90, 40);
  Log log;
  const std::string testcpu = std::string(MAXSIM_TEST_PLUGIN_DIR) + "/libmaxsim-plugin-testcpu.so";
  const std::string v10_path = VariantPath("testcpu-v10");
  maxsim_options o = Options(testcpu, "testcpu", &log);
  o.devices = "0,0,1";
  Context three(o);
  EXPECT_NE(three.Report().find("testcpu on 3 devices"), std::string::npos) << three.Report();
  EXPECT_EQ(log.Count("backend created on device 2 of 3"), 1u);
  Packed corpus = Packed::Pack(three, data.d.Dense());
  for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
    ExpectSameBits(OnCpu(data, corpus.get(), metric, 7), RunAll(three.get(), data, corpus.get(), metric, 7),
                   "devices 0,0,1");
  }
  for (const char* bad : {"x", "0,", ",1", "0,,1", "-1", "1024", "0;1", "99999999999"}) {
    o.devices = bad;
    maxsim_context* ctx = nullptr;
    EXPECT_EQ(maxsim_context_create(&o, &ctx), MAXSIM_ERR_INVALID_ARGUMENT) << bad;
    EXPECT_EQ(ctx, nullptr);
    EXPECT_NE(std::string(maxsim_last_error()).find("maxsim_options.devices"), std::string::npos) << maxsim_last_error();
  }
  // An ABI 1.0 plugin runs on one device: asked for two, the named backend cannot start.
  maxsim_options v10 = Options(v10_path, "testcpu-v10", &log);
  v10.devices = "0,1";
  maxsim_context* ctx = nullptr;
  EXPECT_EQ(maxsim_context_create(&v10, &ctx), MAXSIM_ERR_BACKEND_UNAVAILABLE);
  EXPECT_NE(std::string(maxsim_last_error()).find("runs on one device"), std::string::npos) << maxsim_last_error();
  // A program built against an older maxsim.h (struct_size without `devices`) keeps the backend's default.
  maxsim_options old = Options(testcpu, "testcpu", &log);
  old.devices = "0,0";
  old.struct_size = static_cast<uint32_t>(offsetof(maxsim_options, devices));
  Context one(old);
  EXPECT_EQ(one.Report().find("on 2 devices"), std::string::npos) << one.Report();
}

// MAXSIM_CALL_STREAM_ORDERED (ABI 1.4): a plugin with synchronize may defer its value checks. A flagged call
// gives the synchronous call's bits; a flagged call with a bad value returns OK with NaN / -1 outputs, and
// maxsim_synchronize (or the next call, which then does nothing) reports the synchronous message naming the call,
// once. A plugin without synchronize is never asked to defer: the flagged call fails at once.
TEST(PluginAbi, StreamOrderedCallsDeferTheValueChecksToSynchronize) {
  Log log;
  const std::string testcpu = std::string(MAXSIM_TEST_PLUGIN_DIR) + "/libmaxsim-plugin-testcpu.so";
  Context ctx(Options(testcpu, "testcpu", &log));
  EXPECT_NE(ctx.Report().find("stream-ordered calls (synchronize)"), std::string::npos) << ctx.Report();
  EXPECT_EQ(maxsim_synchronize(ctx.get()), MAXSIM_OK) << maxsim_last_error();  // nothing enqueued yet
  DeviceInputs sync_in, ordered;
  ASSERT_EQ(sync_in.Forward(ctx), MAXSIM_OK) << maxsim_last_error();
  ASSERT_EQ(ordered.Forward(ctx, MAXSIM_CALL_STREAM_ORDERED), MAXSIM_OK) << maxsim_last_error();
  EXPECT_EQ(std::memcmp(sync_in.scores.data(), ordered.scores.data(), sync_in.scores.size() * 4), 0);
  EXPECT_EQ(sync_in.argmax, ordered.argmax);
  ASSERT_EQ(sync_in.Backward(ctx), MAXSIM_OK) << maxsim_last_error();
  ASSERT_EQ(ordered.Backward(ctx, MAXSIM_CALL_STREAM_ORDERED), MAXSIM_OK) << maxsim_last_error();
  EXPECT_EQ(std::memcmp(sync_in.grad_q.data(), ordered.grad_q.data(), sync_in.grad_q.size() * 4), 0);
  EXPECT_EQ(std::memcmp(sync_in.grad_d.data(), ordered.grad_d.data(), sync_in.grad_d.size() * 4), 0);
  EXPECT_EQ(maxsim_synchronize(ctx.get()), MAXSIM_OK) << maxsim_last_error();

  // A NaN in query row 5: the synchronous message, then the deferred one.
  DeviceInputs bad;
  bad.PoisonQueryRow(5);
  ASSERT_EQ(bad.Forward(ctx), MAXSIM_ERR_NON_FINITE);
  const std::string sync_message = maxsim_last_error();
  uint64_t set = 0;
  while (bad.data.q.offsets[set + 1] <= 5) ++set;
  const std::string where = "queries: set " + std::to_string(set) + " token " +
                            std::to_string(5 - bad.data.q.offsets[set]) + " has a non-finite value";
  EXPECT_NE(sync_message.find(where), std::string::npos) << sync_message;
  std::fill(bad.scores.begin(), bad.scores.end(), 1.0f);
  std::fill(bad.argmax.begin(), bad.argmax.end(), 3);
  ASSERT_EQ(bad.Forward(ctx, MAXSIM_CALL_STREAM_ORDERED), MAXSIM_OK) << maxsim_last_error();
  for (float v : bad.scores) EXPECT_TRUE(std::isnan(v));
  for (int32_t v : bad.argmax) EXPECT_EQ(v, -1);
  EXPECT_EQ(maxsim_synchronize(ctx.get()), MAXSIM_ERR_NON_FINITE);
  std::string deferred = maxsim_last_error();
  EXPECT_NE(deferred.find("maxsim_score_matrix (stream-ordered): "), std::string::npos) << deferred;
  const std::string tail = sync_message.substr(sync_message.find("queries: "));
  EXPECT_NE(deferred.find(tail), std::string::npos) << deferred << " vs " << sync_message;
  EXPECT_EQ(maxsim_synchronize(ctx.get()), MAXSIM_OK) << maxsim_last_error();  // reported once

  // The next call reports it (and does nothing); the one after runs.
  ASSERT_EQ(bad.Forward(ctx, MAXSIM_CALL_STREAM_ORDERED), MAXSIM_OK);
  DeviceInputs next;
  std::fill(next.scores.begin(), next.scores.end(), 7.0f);
  EXPECT_EQ(next.Forward(ctx), MAXSIM_ERR_NON_FINITE);
  EXPECT_NE(std::string(maxsim_last_error()).find("maxsim_score_matrix (stream-ordered)"), std::string::npos)
      << maxsim_last_error();
  for (float v : next.scores) EXPECT_EQ(v, 7.0f);
  ASSERT_EQ(next.Forward(ctx), MAXSIM_OK) << maxsim_last_error();
  EXPECT_EQ(std::memcmp(sync_in.scores.data(), next.scores.data(), next.scores.size() * 4), 0);

  // Backward: a non-finite score gradient leaves NaN gradients and a deferred error naming maxsim_backward.
  ordered.grad_scores.assign(ordered.scores.size(), 0.5f);
  ordered.grad_scores[4] = std::numeric_limits<float>::infinity();
  ASSERT_EQ(ordered.Backward(ctx), MAXSIM_ERR_NON_FINITE);
  const std::string grad_message = maxsim_last_error();
  ASSERT_EQ(ordered.Backward(ctx, MAXSIM_CALL_STREAM_ORDERED), MAXSIM_OK) << maxsim_last_error();
  for (float v : ordered.grad_q) EXPECT_TRUE(std::isnan(v));
  for (float v : ordered.grad_d) EXPECT_TRUE(std::isnan(v));
  EXPECT_EQ(maxsim_synchronize(ctx.get()), MAXSIM_ERR_NON_FINITE);
  deferred = maxsim_last_error();
  EXPECT_NE(deferred.find("maxsim_backward (stream-ordered): grad_scores[4] is not finite"), std::string::npos)
      << deferred << " vs " << grad_message;

  // Without the synchronize member the host never asks for deferral: the flagged call fails at once.
  Context no_sync(Options(VariantPath("testcpu-no-sync"), "testcpu-no-sync", &log));
  EXPECT_EQ(no_sync.Report().find("stream-ordered calls"), std::string::npos) << no_sync.Report();
  EXPECT_EQ(bad.Forward(no_sync, MAXSIM_CALL_STREAM_ORDERED), MAXSIM_ERR_NON_FINITE);
  EXPECT_NE(std::string(maxsim_last_error()).find(tail), std::string::npos) << maxsim_last_error();
  EXPECT_EQ(std::string(maxsim_last_error()).find("stream-ordered"), std::string::npos) << maxsim_last_error();
  EXPECT_EQ(maxsim_synchronize(no_sync.get()), MAXSIM_OK) << maxsim_last_error();
  // An ABI 1.3 table's size (no synchronize): likewise, and its calls still run.
  Context v12(Options(VariantPath("testcpu-v12"), "testcpu-v12", &log));
  EXPECT_EQ(bad.Forward(v12, MAXSIM_CALL_STREAM_ORDERED), MAXSIM_ERR_NON_FINITE);
  EXPECT_EQ(maxsim_synchronize(v12.get()), MAXSIM_OK) << maxsim_last_error();
}

// A host-input call while a stream-ordered call's deferred error is pending, which the plugin's next operation
// reports instead of running: a bad dense host query of the call's own fails it as on the CPU without reaching the
// plugin, so that the deferred error is still reported afterwards (by maxsim_synchronize, or by the next call that
// reaches the plugin, which then does nothing), naming the stream-ordered call.
void HostCallAfterADeferredError(const char* variant) {
  Log log;
  Context ctx(Options(VariantPath(variant), variant, &log));
  Context cpu(CpuOptions(&log));
  DeviceInputs bad;
  bad.PoisonQueryRow(5);
  const Data data;  // DeviceInputs' sets, in host memory
  Packed corpus = Packed::Pack(ctx, data.d.Dense());
  const DenseSets bad_q = bad.data.q.Dense(), good_q = data.q.Dense();
  maxsim_sets bad_qs{nullptr, bad_q.get()}, good_qs{nullptr, good_q.get()}, ds{corpus.get(), nullptr};
  maxsim_score_options o;
  maxsim_score_options_init(&o);
  const size_t n = data.q.n_sets() * data.d.n_sets();
  std::vector<float> want(n), scores(n);
  ASSERT_EQ(maxsim_score_matrix(cpu.get(), &good_qs, &ds, &o, want.data(), nullptr), MAXSIM_OK) << maxsim_last_error();
  ASSERT_EQ(maxsim_score_matrix(cpu.get(), &bad_qs, &ds, &o, scores.data(), nullptr), MAXSIM_ERR_NON_FINITE);
  const std::string cpu_message = maxsim_last_error();
  for (bool synchronize : {true, false}) {
    SCOPED_TRACE(synchronize ? "then maxsim_synchronize" : "then a host call");
    ASSERT_EQ(bad.Forward(ctx, MAXSIM_CALL_STREAM_ORDERED), MAXSIM_OK) << maxsim_last_error();
    EXPECT_EQ(maxsim_score_matrix(ctx.get(), &bad_qs, &ds, &o, scores.data(), nullptr), MAXSIM_ERR_NON_FINITE);
    EXPECT_EQ(maxsim_last_error(), cpu_message);
    if (synchronize) {
      EXPECT_EQ(maxsim_synchronize(ctx.get()), MAXSIM_ERR_NON_FINITE);
      EXPECT_NE(std::string(maxsim_last_error()).find("maxsim_score_matrix (stream-ordered): "), std::string::npos)
          << maxsim_last_error();
    } else {
      std::fill(scores.begin(), scores.end(), 7.0f);
      EXPECT_EQ(maxsim_score_matrix(ctx.get(), &good_qs, &ds, &o, scores.data(), nullptr), MAXSIM_ERR_NON_FINITE);
      EXPECT_NE(std::string(maxsim_last_error()).find("maxsim_score_matrix (stream-ordered): "), std::string::npos)
          << maxsim_last_error();
      // One device: that call did nothing. Sharded, the other shard's backend had nothing to report and ran.
      if (std::string(variant) == "testcpu") {
        for (float v : scores) EXPECT_EQ(v, 7.0f);
      }
      ASSERT_EQ(maxsim_score_matrix(ctx.get(), &good_qs, &ds, &o, scores.data(), nullptr), MAXSIM_OK)
          << maxsim_last_error();
      EXPECT_EQ(std::memcmp(scores.data(), want.data(), n * sizeof(float)), 0);
    }
    EXPECT_EQ(maxsim_synchronize(ctx.get()), MAXSIM_OK) << maxsim_last_error();  // reported once
  }
  // Nothing pending after maxsim_synchronize: the plugin checks the queries, the host names the row as before.
  EXPECT_EQ(maxsim_score_matrix(ctx.get(), &bad_qs, &ds, &o, scores.data(), nullptr), MAXSIM_ERR_NON_FINITE);
  EXPECT_EQ(maxsim_last_error(), cpu_message);
}

TEST(PluginAbi, AHostCallsOwnBadQueryDoesNotHideADeferredError) {
  for (const char* variant : {"testcpu", "testcpu-2dev"}) {
    SCOPED_TRACE(variant);
    HostCallAfterADeferredError(variant);
  }
}

// The flag's validation: known bits only, device tensors only (host memory and packed corpora are refused, on
// every backend), read only where struct_size covers it; maxsim_synchronize needs a context and has nothing to
// wait for on the CPU.
TEST(PluginAbi, TheStreamOrderedFlagIsChecked) {
  Log log;
  const std::string testcpu = std::string(MAXSIM_TEST_PLUGIN_DIR) + "/libmaxsim-plugin-testcpu.so";
  Context ctx(Options(testcpu, "testcpu", &log));
  Context cpu(CpuOptions(&log));
  EXPECT_EQ(maxsim_synchronize(nullptr), MAXSIM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(maxsim_synchronize(cpu.get()), MAXSIM_OK) << maxsim_last_error();
  DeviceInputs in;
  EXPECT_EQ(in.Forward(ctx, 0x2u), MAXSIM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(maxsim_last_error()).find("maxsim_score_options.flags is 0x2"), std::string::npos)
      << maxsim_last_error();
  EXPECT_EQ(in.Backward(ctx, 0x3u), MAXSIM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(maxsim_last_error()).find("maxsim_backward_args.flags is 0x3"), std::string::npos)
      << maxsim_last_error();
  // Host tensors and packed corpora, on the plugin's context and on the CPU.
  Data data;
  const DenseSets qd = data.q.Dense(), dd = data.d.Dense();
  for (Context* c : {&ctx, &cpu}) {
    Packed corpus = Packed::Pack(*c, dd);
    maxsim_score_options o;
    maxsim_score_options_init(&o);
    o.flags = MAXSIM_CALL_STREAM_ORDERED;
    std::vector<float> scores(data.q.n_sets() * data.d.n_sets());
    maxsim_sets qs{nullptr, qd.get()}, ds{nullptr, dd.get()}, ps{corpus.get(), nullptr};
    EXPECT_EQ(maxsim_score_matrix(c->get(), &qs, &ds, &o, scores.data(), nullptr), MAXSIM_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(maxsim_last_error()).find("MAXSIM_CALL_STREAM_ORDERED needs dense device tensors"),
              std::string::npos) << maxsim_last_error();
    EXPECT_EQ(maxsim_score_matrix(c->get(), &qs, &ps, &o, scores.data(), nullptr), MAXSIM_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(maxsim_last_error()).find("packed"), std::string::npos) << maxsim_last_error();
    std::vector<uint64_t> top(data.q.n_sets());
    EXPECT_EQ(maxsim_topk(c->get(), &qs, &ps, 1, &o, scores.data(), top.data(), nullptr), MAXSIM_ERR_INVALID_ARGUMENT);
    std::vector<int32_t> am(data.d.n_sets() * data.q.rows(), -1);
    std::vector<float> g(scores.size(), 1.0f), gq(data.q.rows() * 32);
    maxsim_backward_args b;
    maxsim_backward_args_init(&b);
    b.argmax = am.data();
    b.grad_scores = g.data();
    b.grad_queries = gq.data();
    b.flags = MAXSIM_CALL_STREAM_ORDERED;
    EXPECT_EQ(maxsim_backward(c->get(), qd.get(), dd.get(), &b), MAXSIM_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(maxsim_last_error()).find("MAXSIM_CALL_STREAM_ORDERED"), std::string::npos)
        << maxsim_last_error();
    // A caller built against the older header: the bytes past its struct_size are not read.
    o.struct_size = static_cast<uint32_t>(offsetof(maxsim_score_options, flags));
    EXPECT_EQ(maxsim_score_matrix(c->get(), &qs, &ds, &o, scores.data(), nullptr), MAXSIM_OK) << maxsim_last_error();
    b.struct_size = static_cast<uint32_t>(offsetof(maxsim_backward_args, flags));
    EXPECT_EQ(maxsim_backward(c->get(), qd.get(), dd.get(), &b), MAXSIM_OK) << maxsim_last_error();
    // Such a struct may end where the caller's memory ends: nothing past its struct_size is read.
    BytesBeforeGuardPage short_o(o.struct_size), short_b(b.struct_size);
    ASSERT_NE(short_o.data(), nullptr);
    ASSERT_NE(short_b.data(), nullptr);
    std::memcpy(short_o.data(), &o, o.struct_size);
    std::memcpy(short_b.data(), &b, b.struct_size);
    EXPECT_EQ(maxsim_score_matrix(c->get(), &qs, &ds, reinterpret_cast<const maxsim_score_options*>(short_o.data()),
                                  scores.data(), nullptr), MAXSIM_OK) << maxsim_last_error();
    EXPECT_EQ(maxsim_backward(c->get(), qd.get(), dd.get(), reinterpret_cast<const maxsim_backward_args*>(short_b.data())),
              MAXSIM_OK) << maxsim_last_error();
  }
}

}  // namespace
}  // namespace maxsim::test
