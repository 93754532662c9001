// SPDX-License-Identifier: Apache-2.0
// The public API: operations and their layouts (matrix, pairs, candidates, top-k) agree with each other and
// with the reference; conventions (empty sets, masks, ties); thread-count invariance for every mode; context
// options and the environment; and bad input giving a status and a message, never a crash.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#if !defined(__wasm__) || defined(_REENTRANT)
#include <thread>
#endif
#include <vector>

#include "maxsim/maxsim.hpp"
#include "test_util.h"

namespace maxsim::test {
namespace {

const maxsim_mode kModes[] = {MAXSIM_MODE_EXACT, MAXSIM_MODE_CERTIFIED, MAXSIM_MODE_APPROXIMATE};
const maxsim_metric kMetrics[] = {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE};

struct Fixture {
  TokenSets q, d;
  Fixture(uint64_t seed, uint64_t nq = 4, uint64_t nd = 30, uint32_t dim = 64) {
    std::mt19937_64 rng(seed);
    q = Generate(rng, Shape::kUnitGaussian, nq, 0, 20, dim);
    d = Generate(rng, Shape::kClustered, nd, 0, 50, dim);
  }
};

TEST(Api, MatrixPairsCandidatesAndTopKAgree) {
  Fixture f(31, 5, 40);
  Context ctx = CpuContext();
  Packed pd = Packed::Pack(ctx, f.d.Dense());
  const uint64_t nq = f.q.n_sets(), nd = f.d.n_sets();
  for (maxsim_metric metric : kMetrics) {
    for (maxsim_mode mode : kModes) {
      ScoreOptions o{metric, mode};
      std::vector<int32_t> am(nd * f.q.rows());
      const auto matrix = ctx.ScoreMatrix(f.q.Dense(), nq, pd, nd, o, am.data());
      // Candidates: each query gets a different list with repeats; scores and argmax equal the matrix entries.
      std::vector<uint64_t> off{0}, cand;
      for (uint64_t i = 0; i < nq; ++i) {
        for (uint64_t c = 0; c < 3 + i; ++c) cand.push_back((7 * i + 3 * c) % nd);
        cand.push_back(cand.back());  // a repeat
        off.push_back(cand.size());
      }
      std::vector<float> cs(cand.size());
      uint64_t cam_size = 0;
      for (uint64_t i = 0; i < nq; ++i) cam_size += (off[i + 1] - off[i]) * f.q.length(i);
      std::vector<int32_t> cam(cam_size, -9);
      ctx.ScoreCandidates(f.q.Dense(), pd, off, cand, cs, o, cam.data());
      uint64_t base = 0;
      for (uint64_t i = 0; i < nq; ++i) {
        const uint64_t lq = f.q.length(i);
        for (uint64_t c = off[i]; c < off[i + 1]; ++c) {
          const uint64_t j = cand[c];
          EXPECT_EQ(std::memcmp(&cs[c], &matrix[i * nd + j], 4), 0);
          for (uint64_t s = 0; s < lq; ++s) {
            EXPECT_EQ(cam[base + (c - off[i]) * lq + s], am[nd * f.q.offsets[i] + j * lq + s]);
          }
        }
        base += (off[i + 1] - off[i]) * lq;
      }
      // Pairs: query i with document i.
      TokenSets d5 = f.d;
      d5.offsets.resize(nq + 1);
      d5.values.resize(d5.offsets.back() * d5.dim);
      d5.Encode(MAXSIM_F32);
      std::vector<float> ps(nq);
      std::vector<int32_t> pam(f.q.rows());
      ctx.ScorePairs(f.q.Dense(), d5.Dense(), ps, o, pam.data());
      for (uint64_t i = 0; i < nq; ++i) {
        EXPECT_EQ(std::memcmp(&ps[i], &matrix[i * nd + i], 4), 0);
        for (uint64_t s = 0; s < f.q.length(i); ++s) {
          EXPECT_EQ(pam[f.q.offsets[i] + s], am[nd * f.q.offsets[i] + i * f.q.length(i) + s]);
        }
      }
      // Top-k: the matrix rows sorted by (score desc, index asc).
      for (uint64_t k : {uint64_t{1}, uint64_t{7}, nd, nd + 5}) {
        const TopKResult top = ctx.TopK(f.q.Dense(), nq, pd, k, o);
        for (uint64_t i = 0; i < nq; ++i) {
          const std::vector<uint64_t> order = RankDescending(matrix.data() + i * nd, nd);
          for (uint64_t r = 0; r < k; ++r) {
            if (r < nd) {
              EXPECT_EQ(top.index[i * k + r], order[r]) << "query " << i << " rank " << r;
              EXPECT_EQ(top.scores[i * k + r], matrix[i * nd + order[r]]);
            } else {
              EXPECT_EQ(top.index[i * k + r], UINT64_MAX);
              EXPECT_EQ(top.scores[i * k + r], -std::numeric_limits<float>::infinity());
            }
          }
        }
      }
    }
  }
}

TEST(Api, ResultsAreBitIdenticalWhateverTheThreadCount) {
  Fixture f(32, 6, 150, 96);
  Context one = CpuContext(1);
  Packed pd = Packed::Pack(one, f.d.Dense());
  const uint64_t nq = f.q.n_sets(), nd = f.d.n_sets();
  for (maxsim_mode mode : kModes) {
    ScoreOptions o{MAXSIM_METRIC_DOT, mode};
    std::vector<int32_t> am1(nd * f.q.rows());
    const auto s1 = one.ScoreMatrix(f.q.Dense(), nq, pd, nd, o, am1.data());
    const TopKResult t1 = one.TopK(f.q.Dense(), nq, pd, 10, o);
    for (int threads : {2, 3, 8}) {
      Context ctx = CpuContext(threads);
      std::vector<int32_t> am(nd * f.q.rows());
      const auto s = ctx.ScoreMatrix(f.q.Dense(), nq, pd, nd, o, am.data());
      EXPECT_EQ(std::memcmp(s.data(), s1.data(), s.size() * 4), 0) << threads << " threads, mode " << mode;
      EXPECT_EQ(am, am1);
      const TopKResult t = ctx.TopK(f.q.Dense(), nq, pd, 10, o);
      EXPECT_EQ(t.index, t1.index);
      EXPECT_EQ(std::memcmp(t.scores.data(), t1.scores.data(), t.scores.size() * 4), 0);
    }
  }
}

TEST(Api, EmptySetsFollowTheConventions) {
  // Queries: [2 tokens], [0 tokens]; documents: [0 tokens], [3 tokens].
  TokenSets q, d;
  q.dim = d.dim = 3;
  q.values = {1, 0, 0, 0, -1, 0};
  q.offsets = {0, 2, 2};
  d.values = {-1, -1, -1, -2, -2, -2, 0.5f, -3, 0};
  d.offsets = {0, 0, 3};
  q.Encode(MAXSIM_F32);
  d.Encode(MAXSIM_F32);
  Context ctx = CpuContext();
  Packed pd = Packed::Pack(ctx, d.Dense());
  for (maxsim_mode mode : kModes) {
    for (maxsim_metric metric : kMetrics) {
      std::vector<int32_t> am(2 * 2, 77);
      const auto s = ctx.ScoreMatrix(q.Dense(), 2, pd, 2, {metric, mode}, am.data());
      EXPECT_EQ(s[0], -std::numeric_limits<float>::infinity()) << "empty document scores -inf";
      EXPECT_EQ(am[0], -1);
      EXPECT_EQ(am[1], -1);
      // Token (1,0,0): best is doc token 2 (0.5); token (0,-1,0): best is doc token 2 (3). All negative
      // similarities elsewhere must not be beaten by a 0 from padding.
      EXPECT_EQ(am[2], 2);
      EXPECT_EQ(am[3], 2);
      if (metric == MAXSIM_METRIC_DOT) EXPECT_FLOAT_EQ(s[1], 3.5f);
      EXPECT_EQ(s[2], -std::numeric_limits<float>::infinity()) << "empty doc beats nothing, even for an empty query";
      EXPECT_EQ(s[3], 0.0f) << "an empty query scores 0";
    }
  }
  // Nq = 0 or Nd = 0: nothing to do, success.
  TokenSets none;
  none.dim = 3;
  none.offsets = {0};
  none.Encode(MAXSIM_F32);
  std::vector<float> out(1, 5.0f);
  ctx.ScoreMatrix(none.Dense(), pd, out);
  ctx.ScoreMatrix(q.Dense(), none.Dense(), out);
  EXPECT_EQ(out[0], 5.0f);
}

TEST(Api, AllNegativeSimilaritiesAreNotBeatenByPadding) {
  // ColBERT issue #62: padding must be excluded as -inf, never scored as 0.
  TokenSets q, d;
  q.dim = d.dim = 2;
  q.values = {1, 0};
  q.offsets = {0, 1};
  d.values = {-1, 0, 0, 0, -2, 0};  // the middle (padding) row is masked
  d.offsets = {0, 3};
  d.mask = {1, 0, 1};
  q.Encode(MAXSIM_F32);
  d.Encode(MAXSIM_F32);
  Context ctx = CpuContext();
  for (maxsim_mode mode : kModes) {
    int32_t am = 9;
    float s = 0;
    ctx.ScoreMatrix(q.Dense(), d.Dense(), Span<float>(&s, 1), {MAXSIM_METRIC_DOT, mode}, &am);
    EXPECT_EQ(s, -1.0f);
    EXPECT_EQ(am, 0);
  }
}

TEST(Api, CosineTreatsSubnormalNormsAsZeroVectors) {
  // 1 / ||d|| would overflow f32 for ||d|| < 2^-126; such a vector has cosine 0 with anything (not inf or NaN).
  TokenSets q, d;
  q.dim = d.dim = 2;
  q.values = {1, 0};
  q.offsets = {0, 1};
  d.values = {1e-39f, 0, -1, 0, 3e-38f, 0};
  d.offsets = {0, 2, 3};
  q.Encode(MAXSIM_F32);
  d.Encode(MAXSIM_F32);
  Context ctx = CpuContext();
  Packed pd = Packed::Pack(ctx, d.Dense());
  for (maxsim_mode mode : kModes) {
    std::vector<int32_t> am(3);
    const auto s = ctx.ScoreMatrix(q.Dense(), 1, pd, 2, {MAXSIM_METRIC_COSINE, mode}, am.data());
    EXPECT_EQ(s[0], 0.0f) << "mode " << mode;  // the tiny token counts as zero: cos 0 beats cos -1
    EXPECT_EQ(am[0], 0);
    EXPECT_FLOAT_EQ(s[1], 1.0f) << "a small but normal norm (3e-38) still has a cosine";
    for (uint64_t j = 0; j < 2; ++j) {
      const std::string err = CheckPair(q, 0, d, j, MAXSIM_METRIC_COSINE, s[j], am.data() + j);
      EXPECT_TRUE(err.empty()) << err;
    }
  }
}

TEST(Api, MasksEqualCompaction) {
  std::mt19937_64 rng(33);
  TokenSets q = Generate(rng, Shape::kUnitGaussian, 3, 5, 12, 32);
  TokenSets d = Generate(rng, Shape::kUnitGaussian, 8, 0, 30, 32);
  q.mask.resize(q.rows());
  d.mask.resize(d.rows());
  for (auto& m : q.mask) m = rng() % 4 != 0;
  for (auto& m : d.mask) m = rng() % 3 != 0;
  auto compact = [](const TokenSets& t, std::vector<std::vector<uint32_t>>* pos) {
    TokenSets c;
    c.dim = t.dim;
    c.offsets.push_back(0);
    pos->assign(t.n_sets(), {});
    for (uint64_t i = 0; i < t.n_sets(); ++i) {
      for (uint64_t r = t.offsets[i]; r < t.offsets[i + 1]; ++r) {
        if (!t.mask[r]) continue;
        c.values.insert(c.values.end(), t.row(r), t.row(r) + t.dim);
        (*pos)[i].push_back(static_cast<uint32_t>(r - t.offsets[i]));
      }
      c.offsets.push_back(c.values.size() / t.dim);
    }
    c.Encode(MAXSIM_F32);
    return c;
  };
  std::vector<std::vector<uint32_t>> qpos, dpos;
  const TokenSets qc = compact(q, &qpos), dc = compact(d, &dpos);
  Context ctx = CpuContext();
  const uint64_t nq = q.n_sets(), nd = d.n_sets();
  for (maxsim_metric metric : kMetrics) {
    for (maxsim_mode mode : kModes) {
      std::vector<int32_t> am(nd * q.rows()), amc(nd * qc.rows());
      const auto s = ctx.ScoreMatrix(q.Dense(), nq, d.Dense(), nd, {metric, mode}, am.data());
      const auto sc = ctx.ScoreMatrix(qc.Dense(), nq, dc.Dense(), nd, {metric, mode}, amc.data());
      EXPECT_EQ(std::memcmp(s.data(), sc.data(), s.size() * 4), 0);
      for (uint64_t i = 0; i < nq; ++i) {
        for (uint64_t j = 0; j < nd; ++j) {
          const int32_t* a = am.data() + nd * q.offsets[i] + j * q.length(i);
          const int32_t* ac = amc.data() + nd * qc.offsets[i] + j * qc.length(i);
          size_t kept = 0;
          for (uint64_t s_ = 0; s_ < q.length(i); ++s_) {
            if (!q.mask[q.offsets[i] + s_]) {
              EXPECT_EQ(a[s_], -1) << "masked query token";
              continue;
            }
            const int32_t want = ac[kept++];
            EXPECT_EQ(a[s_], want < 0 ? -1 : static_cast<int32_t>(dpos[j][static_cast<size_t>(want)]));
          }
        }
      }
      // And the masked result matches the float64 reference (which honours masks itself).
      for (uint64_t i = 0; i < nq; ++i) {
        for (uint64_t j = 0; j < nd; ++j) {
          if (mode == MAXSIM_MODE_APPROXIMATE) continue;
          const std::string err =
              CheckPair(q, i, d, j, metric, s[i * nd + j], am.data() + nd * q.offsets[i] + j * q.length(i));
          EXPECT_TRUE(err.empty()) << err;
        }
      }
    }
  }
}

TEST(Api, UniformSetsRowStrideAndDtypes) {
  // A padded batch [N, L, dim] with a row stride wider than dim, in bf16.
  std::mt19937_64 rng(34);
  const uint32_t dim = 24, stride = 40, L = 7, N = 3;
  std::vector<float> wide(N * L * stride, 0.0f);
  std::normal_distribution<float> g;
  for (float& x : wide) x = g(rng);
  TokenSets dense;
  dense.dim = dim;
  dense.offsets = {0};
  for (uint32_t i = 0; i < N; ++i) dense.offsets.push_back((i + 1) * L);
  for (uint32_t r = 0; r < N * L; ++r) dense.values.insert(dense.values.end(), &wide[r * stride], &wide[r * stride] + dim);
  dense.Encode(MAXSIM_BF16);
  std::vector<uint16_t> wide_bf16(wide.size(), 0);
  for (uint32_t r = 0; r < N * L; ++r) {
    std::memcpy(&wide_bf16[r * stride], dense.encoded.data() + r * dim * 2, dim * 2);
  }
  DenseSets strided = DenseSets::Uniform(wide_bf16.data(), MAXSIM_BF16, dim, N, L).WithRowStride(stride);
  Context ctx = CpuContext();
  const auto a = ctx.ScoreMatrix(strided, N, strided, N);
  const auto b = ctx.ScoreMatrix(dense.Dense(), N, dense.Dense(), N);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
}

TEST(Api, StatsAreReported) {
  Fixture f(35, 3, 20, 128);
  Context ctx = CpuContext();
  Packed pd = Packed::Pack(ctx, f.d.Dense());
  maxsim_stats st{};
  ctx.ScoreMatrix(f.q.Dense(), f.q.n_sets(), pd, f.d.n_sets(), {MAXSIM_METRIC_DOT, MAXSIM_MODE_CERTIFIED, &st});
  EXPECT_EQ(st.pairs, f.q.n_sets() * f.d.n_sets());
  EXPECT_GT(st.query_tokens, 0u);
  EXPECT_GE(st.refined, st.multi_candidate);
  EXPECT_GT(st.refined, 0u);
}

TEST(Api, BadInputGivesStatusAndMessage) {
  Fixture f(36);
  Context ctx = CpuContext();
  const DenseSets q = f.q.Dense(), d = f.d.Dense();
  maxsim_sets qs{nullptr, q.get()}, ds{nullptr, d.get()};
  std::vector<float> out(f.q.n_sets() * f.d.n_sets());
  auto expect = [](maxsim_status got, maxsim_status want, const char* part) {
    EXPECT_EQ(got, want) << maxsim_last_error();
    EXPECT_NE(std::string(maxsim_last_error()).find(part), std::string::npos) << maxsim_last_error();
  };
  expect(maxsim_score_matrix(nullptr, &qs, &ds, nullptr, out.data(), nullptr), MAXSIM_ERR_INVALID_ARGUMENT, "context");
  expect(maxsim_score_matrix(ctx.get(), nullptr, &ds, nullptr, out.data(), nullptr), MAXSIM_ERR_INVALID_ARGUMENT, "queries");
  expect(maxsim_score_matrix(ctx.get(), &qs, &ds, nullptr, nullptr, nullptr), MAXSIM_ERR_INVALID_ARGUMENT, "scores");
  maxsim_sets both{nullptr, nullptr};
  expect(maxsim_score_matrix(ctx.get(), &both, &ds, nullptr, out.data(), nullptr), MAXSIM_ERR_INVALID_ARGUMENT, "exactly one");
  maxsim_score_options o;
  maxsim_score_options_init(&o);
  o.mode = static_cast<maxsim_mode>(5);
  expect(maxsim_score_matrix(ctx.get(), &qs, &ds, &o, out.data(), nullptr), MAXSIM_ERR_INVALID_ARGUMENT, "mode");
  o.mode = MAXSIM_MODE_EXACT;
  o.metric = static_cast<maxsim_metric>(-1);
  expect(maxsim_score_matrix(ctx.get(), &qs, &ds, &o, out.data(), nullptr), MAXSIM_ERR_INVALID_ARGUMENT, "metric");
  o.metric = MAXSIM_METRIC_DOT;
  o.struct_size = 3;
  expect(maxsim_score_matrix(ctx.get(), &qs, &ds, &o, out.data(), nullptr), MAXSIM_ERR_INVALID_ARGUMENT, "struct_size");
  o.struct_size = sizeof(o);
  // Dimension mismatch.
  std::mt19937_64 rng(1);
  TokenSets other = Generate(rng, Shape::kGaussian, 2, 1, 3, 63);
  const DenseSets od = other.Dense();
  maxsim_sets os{nullptr, od.get()};
  expect(maxsim_score_matrix(ctx.get(), &qs, &os, nullptr, out.data(), nullptr), MAXSIM_ERR_DIM_MISMATCH, "dim 63");
  // NaN in the documents and in the queries: named by set and token.
  for (bool in_queries : {false, true}) {
    TokenSets bad = in_queries ? f.q : f.d;
    uint64_t set = 0;
    while (bad.length(set) < 2) ++set;
    bad.values[(bad.offsets[set] + 1) * bad.dim + 3] = std::numeric_limits<float>::quiet_NaN();
    bad.Encode(MAXSIM_F32);
    const DenseSets bd = bad.Dense();
    maxsim_sets bs{nullptr, bd.get()};
    const std::string where = "set " + std::to_string(set) + " token 1";
    for (maxsim_mode mode : kModes) {
      o.mode = mode;
      expect(maxsim_score_matrix(ctx.get(), in_queries ? &bs : &qs, in_queries ? &ds : &bs, &o, out.data(), nullptr),
             MAXSIM_ERR_NON_FINITE, where.c_str());
    }
    o.mode = MAXSIM_MODE_EXACT;
  }
  // Candidates out of range, bad offsets.
  std::vector<uint64_t> coff(f.q.n_sets() + 1, 0), cand{999};
  coff.back() = 1;
  expect(maxsim_score_candidates(ctx.get(), &qs, &ds, coff.data(), cand.data(), nullptr, out.data(), nullptr),
         MAXSIM_ERR_INVALID_ARGUMENT, "candidates[0] = 999");
  coff[0] = 1;
  expect(maxsim_score_candidates(ctx.get(), &qs, &ds, coff.data(), cand.data(), nullptr, out.data(), nullptr),
         MAXSIM_ERR_INVALID_ARGUMENT, "cand_offsets[0]");
  // Pairs need equal counts; top-k needs k > 0 and ids only from packed corpora with ids.
  expect(maxsim_score_pairs(ctx.get(), &qs, &ds, nullptr, out.data(), nullptr), MAXSIM_ERR_INVALID_ARGUMENT, "pairs");
  std::vector<uint64_t> idx(100), ids(100);
  expect(maxsim_topk(ctx.get(), &qs, &ds, 0, nullptr, out.data(), idx.data(), nullptr), MAXSIM_ERR_INVALID_ARGUMENT, "k is 0");
  expect(maxsim_topk(ctx.get(), &qs, &ds, 2, nullptr, out.data(), idx.data(), ids.data()), MAXSIM_ERR_INVALID_ARGUMENT, "ids");
  // Device memory without a GPU backend.
  maxsim_dense_sets dev = *q.get();
  dev.memory = MAXSIM_MEMORY_CUDA;
  maxsim_sets devs{nullptr, &dev};
  expect(maxsim_score_matrix(ctx.get(), &devs, &ds, nullptr, out.data(), nullptr), MAXSIM_ERR_BACKEND_UNAVAILABLE, "CUDA");
  // The C++ wrapper turns statuses into exceptions carrying them (builds without exceptions: an abort).
#if defined(__cpp_exceptions)
  try {
    ctx.ScoreMatrix(f.q.Dense(), od, out);
    FAIL() << "expected an exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), MAXSIM_ERR_DIM_MISMATCH);
    EXPECT_NE(std::string(e.what()).find("MAXSIM_ERR_DIM_MISMATCH"), std::string::npos);
  }
#endif
}

TEST(Api, ContextOptionsAndEnvironment) {
  maxsim_options o;
  maxsim_options_init(&o);
  o.load_plugins = 0;
  maxsim_context* ctx = nullptr;
  o.isa = "no-such-kernel";
  EXPECT_EQ(maxsim_context_create(&o, &ctx), MAXSIM_ERR_INVALID_ARGUMENT);
  std::string msg = maxsim_last_error();
  EXPECT_NE(msg.find("no-such-kernel"), std::string::npos) << msg;
  EXPECT_NE(msg.find("scalar"), std::string::npos) << "the message lists the known kernels: " << msg;
  EXPECT_EQ(ctx, nullptr);
  for (size_t k = 0; k < maxsim_kernel_count(); ++k) {
    const char* reason = nullptr;
    o.isa = maxsim_kernel_name(k);
    const maxsim_status st = maxsim_context_create(&o, &ctx);
    if (maxsim_kernel_available(k, &reason)) {
      ASSERT_EQ(st, MAXSIM_OK) << maxsim_last_error();
      EXPECT_STREQ(maxsim_context_kernel(ctx), maxsim_kernel_name(k));
      maxsim_context_destroy(ctx);
    } else {
      EXPECT_EQ(st, MAXSIM_ERR_BACKEND_UNAVAILABLE);
      EXPECT_NE(std::string(maxsim_last_error()).find(reason), std::string::npos);
    }
  }
  o.isa = nullptr;
  o.num_threads = -2;
  EXPECT_EQ(maxsim_context_create(&o, &ctx), MAXSIM_ERR_INVALID_ARGUMENT);
  o.num_threads = 0;
  setenv("MAXSIM_NUM_THREADS", "three", 1);
  EXPECT_EQ(maxsim_context_create(&o, &ctx), MAXSIM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(maxsim_last_error()).find("MAXSIM_NUM_THREADS='three'"), std::string::npos);
  setenv("MAXSIM_NUM_THREADS", "3", 1);
  ASSERT_EQ(maxsim_context_create(&o, &ctx), MAXSIM_OK);
  EXPECT_EQ(maxsim_context_num_threads(ctx), 3);
  maxsim_context_destroy(ctx);
  unsetenv("MAXSIM_NUM_THREADS");
  setenv("MAXSIM_ISA", "scalar", 1);
  ASSERT_EQ(maxsim_context_create(&o, &ctx), MAXSIM_OK);
  EXPECT_STREQ(maxsim_context_kernel(ctx), "scalar");
  size_t needed = 0;
  EXPECT_EQ(maxsim_context_report(ctx, nullptr, 0, &needed), MAXSIM_ERR_BUFFER_TOO_SMALL);
  std::string report(needed, '\0');
  ASSERT_EQ(maxsim_context_report(ctx, report.data(), report.size(), nullptr), MAXSIM_OK);
  EXPECT_NE(report.find("forced, set by MAXSIM_ISA=scalar"), std::string::npos) << report;
  EXPECT_NE(report.find("selected"), std::string::npos);
  maxsim_context_destroy(ctx);
  unsetenv("MAXSIM_ISA");
  setenv("MAXSIM_BACKEND", "cuda", 1);
  EXPECT_EQ(maxsim_context_create(&o, &ctx), MAXSIM_ERR_BACKEND_UNAVAILABLE);
  EXPECT_NE(std::string(maxsim_last_error()).find("cuda"), std::string::npos);
  unsetenv("MAXSIM_BACKEND");
  o.struct_size = 8;
  EXPECT_EQ(maxsim_context_create(&o, &ctx), MAXSIM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(maxsim_context_create(nullptr, nullptr), MAXSIM_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(maxsim_status_name(MAXSIM_ERR_NON_FINITE), "MAXSIM_ERR_NON_FINITE");
  // The library reports the version the headers were generated with (CMake's project(VERSION)), in both forms.
  EXPECT_EQ(maxsim_version(), static_cast<uint32_t>(MAXSIM_VERSION_MAJOR * 10000 + MAXSIM_VERSION_MINOR * 100 +
                                                    MAXSIM_VERSION_PATCH));
  EXPECT_STREQ(maxsim_version_string(), MAXSIM_PROJECT_VERSION);
}


// maxsim_set_progress: the callback runs on the calling thread only, sees monotonic counts of the call's total,
// leaves results unchanged, and cancels with MAXSIM_ERR_CANCELLED when it returns non-zero.
#if defined(__wasm__) && !defined(_REENTRANT)  // WebAssembly without threads: the calling thread is the only one
using ThreadId = int;
ThreadId CurrentThread() { return 0; }
#else
using ThreadId = std::thread::id;
ThreadId CurrentThread() { return std::this_thread::get_id(); }
#endif

struct ProgressRecord {
  ThreadId caller = CurrentThread();
  int calls = 0;
  int cancel_at = -1;  // cancel on this call (1-based), -1: never
  bool off_thread = false, monotonic = true;
  uint64_t last = 0, total = 0;
};

int RecordProgress(void* user, uint64_t done, uint64_t total) {
  auto* r = static_cast<ProgressRecord*>(user);
  ++r->calls;
  if (CurrentThread() != r->caller) r->off_thread = true;
  if (done < r->last || done > total) r->monotonic = false;
  r->last = done;
  r->total = total;
  return r->cancel_at == r->calls ? 1 : 0;
}

TEST(Api, ProgressCallbackReportsOnTheCallingThreadAndCancels) {
  std::mt19937_64 rng(99);
  // ~0.1-0.5 s of exact scoring on 2 threads: long enough to cross the 50 ms reporting interval. WebAssembly's
  // exact kernels are several times slower (the SIMD128 module emulates the fused multiply-add), so a fifth of
  // the corpus still crosses it there.
#if defined(__wasm__)
  constexpr uint64_t kDocs = 600;
#else
  constexpr uint64_t kDocs = 3000;
#endif
  const TokenSets q = Generate(rng, Shape::kGaussian, 16, 32, 32, 128);
  const TokenSets d = Generate(rng, Shape::kGaussian, kDocs, 100, 100, 128);
  Context ctx = CpuContext(2);
  const uint64_t nq = q.n_sets(), nd = d.n_sets();
  const ScoreOptions exact{MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT};
  const auto plain = ctx.ScoreMatrix(q.Dense(), nq, d.Dense(), nd, exact);

  ProgressRecord rec;
  maxsim_set_progress(RecordProgress, &rec);
  const auto with = ctx.ScoreMatrix(q.Dense(), nq, d.Dense(), nd, exact);
  maxsim_set_progress(nullptr, nullptr);
  EXPECT_GE(rec.calls, 1);
  EXPECT_FALSE(rec.off_thread);
  EXPECT_TRUE(rec.monotonic);
  EXPECT_EQ(rec.total, nq * nd);
  ASSERT_EQ(with.size(), plain.size());
  EXPECT_EQ(0, std::memcmp(with.data(), plain.data(), plain.size() * sizeof(float)));

  // Cancel on the first report: score matrix, top-k and candidates stop with MAXSIM_ERR_CANCELLED.
  maxsim_score_options o;
  maxsim_score_options_init(&o);
  const DenseSets qd = q.Dense(), dd = d.Dense();
  const maxsim_sets qs{nullptr, qd.get()}, ds{nullptr, dd.get()};
  std::vector<float> scores(nq * nd);
  ProgressRecord cancel;
  cancel.cancel_at = 1;
  maxsim_set_progress(RecordProgress, &cancel);
  EXPECT_EQ(MAXSIM_ERR_CANCELLED, maxsim_score_matrix(ctx.get(), &qs, &ds, &o, scores.data(), nullptr));
  EXPECT_NE(std::string(maxsim_last_error()).find("cancelled"), std::string::npos) << maxsim_last_error();
  EXPECT_EQ(cancel.calls, 1);
  cancel.calls = 0;
  std::vector<uint64_t> index(nq * 5);
  EXPECT_EQ(MAXSIM_ERR_CANCELLED, maxsim_topk(ctx.get(), &qs, &ds, 5, &o, scores.data(), index.data(), nullptr));
  cancel.calls = 0;
  std::vector<uint64_t> coff(nq + 1), cand(nq * nd);
  for (uint64_t i = 0; i <= nq; ++i) coff[i] = i * nd;
  for (uint64_t c = 0; c < nq * nd; ++c) cand[c] = c % nd;
  EXPECT_EQ(MAXSIM_ERR_CANCELLED, maxsim_score_candidates(ctx.get(), &qs, &ds, coff.data(), cand.data(), &o,
                                                          scores.data(), nullptr));
  EXPECT_STREQ(maxsim_status_name(MAXSIM_ERR_CANCELLED), "MAXSIM_ERR_CANCELLED");

  // Removed: no more calls.
  maxsim_set_progress(nullptr, nullptr);
  cancel.calls = 0;
  EXPECT_EQ(MAXSIM_OK, maxsim_score_matrix(ctx.get(), &qs, &ds, &o, scores.data(), nullptr));
  EXPECT_EQ(cancel.calls, 0);
}


// Dense documents are checked as each one is scored (exact dot: after its scores, from cache; other modes and
// metrics: before quantising it). Whatever the thread count and schedule, a rejected document fails the call
// with the message naming the first rejected row of all documents, as the up-front check of candidate scoring
// does; masked rows are never checked; a row with one element above the compare-only bound but a norm within
// 1e19 is accepted and scored like its packed copy.
// Certified mode on dense documents quantises each document per call; with fewer than 256 query tokens against
// each document the engine runs the exact path instead (nothing refined), at 256 or more it screens (documents
// refined). The same bits as exact either way; packed documents always screen.
TEST(Api, DenseCertifiedScreensOnlyWhenEnoughQueryTokensShareEachDocument) {
  std::mt19937_64 rng(43);
  TokenSets d = Generate(rng, Shape::kClustered, 40, 0, 50, 64);
  d.mask.assign(d.rows(), 1);
  for (uint64_t r = 1; r < d.rows(); r += 5) d.mask[r] = 0;
  const TokenSets few = Generate(rng, Shape::kUnitGaussian, 3, 10, 20, 64);    // < 256 tokens
  const TokenSets many = Generate(rng, Shape::kUnitGaussian, 20, 16, 16, 64);  // 320 tokens
  const TokenSets one_long = Generate(rng, Shape::kUnitGaussian, 1, 300, 300, 64);
  const DenseSets dd = d.Dense();
  for (int threads : {1, 2}) {
    Context ctx = CpuContext(threads);
    Packed pd = Packed::Pack(ctx, dd);
    for (maxsim_metric metric : kMetrics) {
      for (const TokenSets* q : {&few, &many, &one_long}) {
        const bool screens = q->rows() >= 256;
        SCOPED_TRACE(std::to_string(q->rows()) + " query tokens, threads " + std::to_string(threads));
        const uint64_t nq = q->n_sets(), nd = d.n_sets();
        std::vector<int32_t> a_exact(nd * q->rows()), a_cert(a_exact.size());
        maxsim_stats st{};
        const auto exact = ctx.ScoreMatrix(q->Dense(), nq, dd, nd, {metric, MAXSIM_MODE_EXACT}, a_exact.data());
        const auto cert = ctx.ScoreMatrix(q->Dense(), nq, dd, nd, {metric, MAXSIM_MODE_CERTIFIED, &st}, a_cert.data());
        EXPECT_EQ(std::memcmp(exact.data(), cert.data(), exact.size() * 4), 0);
        EXPECT_EQ(a_exact, a_cert);
        EXPECT_EQ(st.refined > 0, screens) << st.refined;
        st = {};
        const TopKResult te = ctx.TopK(q->Dense(), nq, dd, 5, {metric, MAXSIM_MODE_EXACT});
        const TopKResult tc = ctx.TopK(q->Dense(), nq, dd, 5, {metric, MAXSIM_MODE_CERTIFIED, &st});
        EXPECT_EQ(std::memcmp(te.scores.data(), tc.scores.data(), te.scores.size() * 4), 0);
        EXPECT_EQ(te.index, tc.index);
        EXPECT_EQ(st.refined > 0, screens);
        // Candidates: each candidate meets one query, so the longest query set decides.
        std::vector<uint64_t> off{0}, cand;
        for (uint64_t i = 0; i < nq; ++i) {
          for (uint64_t j = i % 3; j < nd; j += 3) cand.push_back(j);
          off.push_back(cand.size());
        }
        std::vector<float> ce(cand.size()), cc(cand.size());
        st = {};
        ctx.ScoreCandidates(q->Dense(), dd, off, cand, ce, {metric, MAXSIM_MODE_EXACT});
        ctx.ScoreCandidates(q->Dense(), dd, off, cand, cc, {metric, MAXSIM_MODE_CERTIFIED, &st});
        EXPECT_EQ(std::memcmp(ce.data(), cc.data(), ce.size() * 4), 0);
        EXPECT_EQ(st.refined > 0, q == &one_long);
        st = {};
        const auto packed = ctx.ScoreMatrix(q->Dense(), nq, pd, nd, {metric, MAXSIM_MODE_CERTIFIED, &st});
        EXPECT_EQ(std::memcmp(exact.data(), packed.data(), exact.size() * 4), 0);
        EXPECT_GT(st.refined, 0u);
      }
    }
  }
}

TEST(Api, DenseDocumentChecksNameTheFirstRejectedRowOnEveryPath) {
  std::mt19937_64 rng(41);
  const TokenSets q = Generate(rng, Shape::kUnitGaussian, 3, 1, 12, 40);
  TokenSets good = Generate(rng, Shape::kUnitGaussian, 300, 0, 30, 40);
  good.mask.assign(good.rows(), 1);
  uint64_t first = 5, later = 250;
  while (good.length(first) < 3) ++first;
  while (good.length(later) < 2) ++later;
  const uint64_t masked_row = good.offsets[later] + 1;
  good.mask[masked_row] = 0;
  const float kNaN = std::numeric_limits<float>::quiet_NaN(), kInf = std::numeric_limits<float>::infinity();
  for (maxsim_dtype dtype : {MAXSIM_F32, MAXSIM_F16, MAXSIM_BF16}) {
    for (int threads : {1, 2}) {
      Context ctx = CpuContext(threads);
      TokenSets qs = q;
      qs.Encode(dtype);
      const DenseSets qd = qs.Dense();
      const maxsim_sets qsets{nullptr, qd.get()};
      const uint64_t nq = q.n_sets(), nd = good.n_sets();
      std::vector<float> out(nq * nd), top_s(nq * 4);
      std::vector<uint64_t> top_i(nq * 4), coff(nq + 1), cand;
      for (uint64_t i = 0; i < nq; ++i) {
        for (uint64_t j = 0; j < nd; ++j) cand.push_back(j);
        coff[i + 1] = cand.size();
      }
      std::vector<float> cout_(cand.size());
      for (int bad_kind = 0; bad_kind < 3; ++bad_kind) {
        TokenSets d = good;
        // Bad values in a later document (found first by some schedules), then the first one, then a masked row.
        d.values[(d.offsets[later]) * d.dim + 7] = kNaN;
        const float bad = bad_kind == 0 ? kNaN : bad_kind == 1 ? -kInf : 6e18f;  // 6e18 in two elements: norm 8.5e18
        float* row = d.values.data() + (d.offsets[first] + 2) * d.dim;
        row[3] = bad;
        if (bad_kind == 2) row[9] = 6e18f;
        d.values[masked_row * d.dim + 1] = kNaN;
        d.Encode(dtype);
        const DenseSets dd = d.Dense();
        const maxsim_sets dsets{nullptr, dd.get()};
        // bf16 rounds 6e18 to 5.99e18: still a norm below 1e19 in every dtype except f16 (Inf: rejected).
        const bool huge_ok = bad_kind == 2 && dtype != MAXSIM_F16;
        const std::string where = "set " + std::to_string(huge_ok ? later : first) + " token " +
                                  std::to_string(huge_ok ? 0 : 2);
        for (maxsim_metric metric : kMetrics) {
          for (maxsim_mode mode : kModes) {
            maxsim_score_options o;
            maxsim_score_options_init(&o);
            o.metric = metric;
            o.mode = mode;
            const std::string what = std::string("dtype ") + std::to_string(dtype) + " threads " +
                                     std::to_string(threads) + " kind " + std::to_string(bad_kind) + " metric " +
                                     std::to_string(metric) + " mode " + std::to_string(mode) + ": ";
            for (int call = 0; call < 3; ++call) {
              const maxsim_status st =
                  call == 0 ? maxsim_score_matrix(ctx.get(), &qsets, &dsets, &o, out.data(), nullptr)
                  : call == 1 ? maxsim_topk(ctx.get(), &qsets, &dsets, 4, &o, top_s.data(), top_i.data(), nullptr)
                              : maxsim_score_candidates(ctx.get(), &qsets, &dsets, coff.data(), cand.data(), &o,
                                                        cout_.data(), nullptr);
              ASSERT_EQ(st, MAXSIM_ERR_NON_FINITE) << what << call << " " << maxsim_last_error();
              EXPECT_NE(std::string(maxsim_last_error()).find("documents: " + where), std::string::npos)
                  << what << call << " " << maxsim_last_error();
            }
          }
        }
      }
      // No bad value outside masked rows, one row with one element above the bound: accepted, and the dense
      // scores equal the packed corpus' scores bit for bit in every mode and metric.
      TokenSets d = good;
      d.values[masked_row * d.dim + 1] = kNaN;
      float* row = d.values.data() + (d.offsets[first] + 2) * d.dim;
      row[3] = 6e18f;
      d.Encode(dtype);
      if (dtype == MAXSIM_F16) continue;  // 6e18 is Inf in f16
      const DenseSets dd = d.Dense();
      const maxsim_sets dsets{nullptr, dd.get()};
      Packed pd = Packed::Pack(ctx, dd);
      const maxsim_sets psets{pd.get(), nullptr};
      for (maxsim_metric metric : kMetrics) {
        for (maxsim_mode mode : {MAXSIM_MODE_EXACT, MAXSIM_MODE_CERTIFIED}) {
          maxsim_score_options o;
          maxsim_score_options_init(&o);
          o.metric = metric;
          o.mode = mode;
          std::vector<float> dense(nq * nd), packed(nq * nd);
          ASSERT_EQ(maxsim_score_matrix(ctx.get(), &qsets, &dsets, &o, dense.data(), nullptr), MAXSIM_OK)
              << maxsim_last_error();
          ASSERT_EQ(maxsim_score_matrix(ctx.get(), &qsets, &psets, &o, packed.data(), nullptr), MAXSIM_OK)
              << maxsim_last_error();
          EXPECT_EQ(std::memcmp(dense.data(), packed.data(), dense.size() * 4), 0) << "metric " << metric << " mode " << mode;
          ASSERT_EQ(maxsim_topk(ctx.get(), &qsets, &dsets, 4, &o, top_s.data(), top_i.data(), nullptr), MAXSIM_OK)
              << maxsim_last_error();
        }
      }
    }
  }
  // No query sets: the documents are still checked (up front), as before any scoring.
  TokenSets d = good;
  d.values[(d.offsets[first] + 2) * d.dim] = std::numeric_limits<float>::quiet_NaN();
  d.Encode(MAXSIM_F32);
  const DenseSets dd = d.Dense();
  const maxsim_sets dsets{nullptr, dd.get()};
  const std::vector<uint64_t> no_offsets{0};
  const DenseSets none(q.encoded.data(), MAXSIM_F32, q.dim, Span<const uint64_t>(no_offsets.data(), 1));
  const maxsim_sets nsets{nullptr, none.get()};
  Context ctx = CpuContext(2);
  float dummy = 0;
  uint64_t dummy_i = 0;
  EXPECT_EQ(maxsim_score_matrix(ctx.get(), &nsets, &dsets, nullptr, &dummy, nullptr), MAXSIM_ERR_NON_FINITE);
  EXPECT_EQ(maxsim_topk(ctx.get(), &nsets, &dsets, 1, nullptr, &dummy, &dummy_i, nullptr), MAXSIM_ERR_NON_FINITE);
  // Queries checked by several threads, bad values in an early and a late set: the early one is named.
  TokenSets many = Generate(rng, Shape::kUnitGaussian, 100, 10, 10, 40);
  many.values[(many.offsets[90] + 4) * many.dim] = std::numeric_limits<float>::quiet_NaN();
  many.values[(many.offsets[3] + 6) * many.dim + 1] = std::numeric_limits<float>::infinity();
  many.Encode(MAXSIM_F32);
  const DenseSets md = many.Dense(), gd = good.Dense();
  const maxsim_sets msets{nullptr, md.get()}, gsets{nullptr, gd.get()};
  std::vector<float> big(many.n_sets() * good.n_sets());
  for (int rep = 0; rep < 20; ++rep) {
    ASSERT_EQ(maxsim_score_matrix(ctx.get(), &msets, &gsets, nullptr, big.data(), nullptr), MAXSIM_ERR_NON_FINITE);
    ASSERT_NE(std::string(maxsim_last_error()).find("queries: set 3 token 6"), std::string::npos) << maxsim_last_error();
  }
}

// maxsim_options and maxsim_score_options as the first released maxsim.h laid them out: what a binary built
// against it passes (and what a ctypes user who declared those fields passes).
struct OptionsV1 {
  uint32_t struct_size;
  int32_t num_threads;
  const char* backend;
  const char* isa;
  const char* plugin_path;
  uint32_t load_plugins;
  maxsim_log_fn log;
  void* log_user_data;
};
struct ScoreOptionsV1 {
  uint32_t struct_size;
  maxsim_metric metric;
  maxsim_mode mode;
  maxsim_stats* stats;
  void* cuda_stream;
};
static_assert(offsetof(OptionsV1, log_user_data) == offsetof(maxsim_options, log_user_data), "first layout");
static_assert(offsetof(ScoreOptionsV1, cuda_stream) == offsetof(maxsim_score_options, cuda_stream), "first layout");
static_assert(sizeof(OptionsV1) < sizeof(maxsim_options) && sizeof(ScoreOptionsV1) < sizeof(maxsim_score_options),
              "fields were appended since");

constexpr uint8_t kPoison = 0xA5;

// Runs init on `size` bytes followed by poison, which must be left alone, and (where pages can be protected, and
// `size` keeps the struct aligned there) on `size` bytes that end at an inaccessible page, which must end the
// same. Returns the `size` bytes it wrote.
template <typename F>
std::vector<uint8_t> InitInto(size_t size, F&& init) {
  std::vector<uint8_t> buf(size + 64, kPoison);
  init(buf.data());
  for (size_t i = size; i < buf.size(); ++i) {
    EXPECT_EQ(buf[i], kPoison) << "byte " << i << " of a " << size << "-byte struct";
  }
  if (size % alignof(void*) != 0) {  // both structs hold pointers: a caller's struct is never placed so
    buf.resize(size);
    return buf;
  }
  BytesBeforeGuardPage guarded(size);
#if !defined(__wasi__)
  EXPECT_NE(guarded.data(), nullptr);
#endif
  if (guarded.data()) {
    std::memset(guarded.data(), kPoison, size);
    init(guarded.data());
    EXPECT_EQ(std::memcmp(guarded.data(), buf.data(), size), 0);
  }
  buf.resize(size);
  return buf;
}

// InitInto's callables for an init function of struct S: the exported first-layout one (f), and a _sized one (g)
// at `size` bytes.
template <typename S>
auto Exported(void (*f)(S*)) {
  return [f](uint8_t* p) { f(reinterpret_cast<S*>(p)); };
}
template <typename S>
auto Sized(void (*g)(S*, size_t), size_t size) {
  return [g, size](uint8_t* p) { g(reinterpret_cast<S*>(p), size); };
}

template <typename T>
T As(const std::vector<uint8_t>& bytes) {
  T t;
  std::memset(&t, 0, sizeof(t));
  std::memcpy(&t, bytes.data(), std::min(sizeof(t), bytes.size()));
  return t;
}

uint32_t StructSize(const std::vector<uint8_t>& bytes) { return As<uint32_t>(bytes); }

// The exported maxsim_score_options_init / maxsim_options_init (the name in parentheses is the function, not the
// macro: what an older binary or ctypes calls) fill the first released layout only; the *_sized functions fill
// the caller's size and never write past it; the macros fill the caller's whole struct. A struct filled by any of
// them scores / creates a context with what it holds, and a too-small size leaves a struct_size the call refuses.
TEST(Api, StructInitsWriteOnlyTheCallersSize) {
  const auto score_init = Exported(&maxsim_score_options_init);
  const auto options_init = Exported(&maxsim_options_init);
  auto score_sized = [](size_t size) { return Sized(&maxsim_score_options_init_sized, size); };
  auto options_sized = [](size_t size) { return Sized(&maxsim_options_init_sized, size); };
  const std::vector<uint8_t> score_v1 = InitInto(sizeof(ScoreOptionsV1), score_init);
  const ScoreOptionsV1 s1 = As<ScoreOptionsV1>(score_v1);
  EXPECT_EQ(s1.struct_size, sizeof(ScoreOptionsV1));
  EXPECT_EQ(s1.metric, MAXSIM_METRIC_DOT);
  EXPECT_EQ(s1.mode, MAXSIM_MODE_EXACT);
  EXPECT_EQ(s1.stats, nullptr);
  EXPECT_EQ(s1.cuda_stream, nullptr);
  EXPECT_EQ(InitInto(sizeof(ScoreOptionsV1), score_sized(sizeof(ScoreOptionsV1))), score_v1);
  const std::vector<uint8_t> options_v1 = InitInto(sizeof(OptionsV1), options_init);
  const OptionsV1 o1 = As<OptionsV1>(options_v1);
  EXPECT_EQ(o1.struct_size, sizeof(OptionsV1));
  EXPECT_EQ(o1.num_threads, 0);
  EXPECT_EQ(o1.backend, nullptr);
  EXPECT_EQ(o1.load_plugins, 1u);
  EXPECT_EQ(o1.log, nullptr);
  EXPECT_EQ(InitInto(sizeof(OptionsV1), options_sized(sizeof(OptionsV1))), options_v1);

  // The macros: the whole struct of this header.
  maxsim_score_options full;
  std::memset(&full, kPoison, sizeof(full));
  maxsim_score_options_init(&full);
  EXPECT_EQ(full.struct_size, sizeof(full));
  EXPECT_EQ(full.flags, 0u);
  EXPECT_EQ(full.mode, MAXSIM_MODE_EXACT);
  maxsim_options full_options;
  std::memset(&full_options, kPoison, sizeof(full_options));
  maxsim_options_init(&full_options);
  EXPECT_EQ(full_options.struct_size, sizeof(full_options));
  EXPECT_EQ(full_options.devices, nullptr);
  EXPECT_EQ(full_options.load_plugins, 1u);

  // Below the first layout: struct_size 0 only (nothing at all below 4 bytes). Above this library's struct (a newer
  // header): this library's fields, struct_size its sizeof, the bytes past it left alone.
  for (size_t size : {size_t{4}, size_t{16}, sizeof(ScoreOptionsV1) - 1}) {
    const std::vector<uint8_t> b = InitInto(size, score_sized(size));
    EXPECT_EQ(StructSize(b), 0u) << size;
    for (size_t i = 4; i < size; ++i) EXPECT_EQ(b[i], kPoison) << size;
  }
  EXPECT_EQ(StructSize(InitInto(sizeof(OptionsV1) - 8, options_sized(sizeof(OptionsV1) - 8))), 0u);
  EXPECT_EQ(InitInto(3, score_sized(3)), std::vector<uint8_t>(3, kPoison));
  EXPECT_EQ(InitInto(2, options_sized(2)), std::vector<uint8_t>(2, kPoison));
  const std::vector<uint8_t> newer = InitInto(sizeof(full) + 24, score_sized(sizeof(full) + 24));
  EXPECT_EQ(StructSize(newer), sizeof(full));
  for (size_t i = sizeof(full); i < newer.size(); ++i) EXPECT_EQ(newer[i], kPoison);
  EXPECT_EQ(As<maxsim_score_options>(newer).flags, 0u);
  const size_t newer_size = sizeof(full_options) + 8;
  const std::vector<uint8_t> newer_options = InitInto(newer_size, options_sized(newer_size));
  EXPECT_EQ(StructSize(newer_options), sizeof(full_options));
  maxsim_score_options_init_sized(nullptr, sizeof(full));  // NULL: nothing, no crash
  maxsim_options_init_sized(nullptr, sizeof(full_options));
  (maxsim_score_options_init)(nullptr);
  (maxsim_options_init)(nullptr);

  // Scoring with them. The first-layout struct (at the end of its memory where pages can be protected) reads its
  // fields: cosine gives the full struct's cosine bits.
  Fixture f(41);
  Context ctx = CpuContext();
  const DenseSets q = f.q.Dense(), d = f.d.Dense();
  maxsim_sets qs{nullptr, q.get()}, ds{nullptr, d.get()};
  const size_t n = f.q.n_sets() * f.d.n_sets();
  std::vector<float> want(n), got(n, -1.0f);
  full.metric = MAXSIM_METRIC_COSINE;
  ASSERT_EQ(maxsim_score_matrix(ctx.get(), &qs, &ds, &full, want.data(), nullptr), MAXSIM_OK) << maxsim_last_error();
  ScoreOptionsV1 cosine_v1 = s1;
  cosine_v1.metric = MAXSIM_METRIC_COSINE;
  BytesBeforeGuardPage at_edge(sizeof(cosine_v1));
  std::vector<uint8_t> heap(sizeof(cosine_v1));
  uint8_t* where = at_edge.data() ? at_edge.data() : heap.data();
  std::memcpy(where, &cosine_v1, sizeof(cosine_v1));
  ASSERT_EQ(maxsim_score_matrix(ctx.get(), &qs, &ds, reinterpret_cast<const maxsim_score_options*>(where), got.data(),
                                nullptr), MAXSIM_OK) << maxsim_last_error();
  EXPECT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0);
  // The exported function on a whole struct: the appended flags are not read (a stream-ordered flag on host
  // tensors would fail the call); from the macro's struct they are.
  maxsim_score_options first;
  std::memset(&first, kPoison, sizeof(first));
  (maxsim_score_options_init)(&first);
  first.flags = MAXSIM_CALL_STREAM_ORDERED;
  EXPECT_EQ(maxsim_score_matrix(ctx.get(), &qs, &ds, &first, got.data(), nullptr), MAXSIM_OK) << maxsim_last_error();
  full.flags = MAXSIM_CALL_STREAM_ORDERED;
  EXPECT_EQ(maxsim_score_matrix(ctx.get(), &qs, &ds, &full, got.data(), nullptr), MAXSIM_ERR_INVALID_ARGUMENT);
  // A too-small size: the call names struct_size.
  maxsim_score_options small;
  std::memset(&small, kPoison, sizeof(small));
  maxsim_score_options_init_sized(&small, 16);
  EXPECT_EQ(maxsim_score_matrix(ctx.get(), &qs, &ds, &small, got.data(), nullptr), MAXSIM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(maxsim_last_error()).find("maxsim_score_options.struct_size is 0"), std::string::npos)
      << maxsim_last_error();

  // A context from the first-layout options, at the end of its memory: its fields are read.
  OptionsV1 cpu_v1 = o1;
  cpu_v1.backend = "cpu";
  cpu_v1.num_threads = 1;
  cpu_v1.load_plugins = 0;
  BytesBeforeGuardPage options_edge(sizeof(cpu_v1));
  std::vector<uint8_t> options_heap(sizeof(cpu_v1));
  uint8_t* at = options_edge.data() ? options_edge.data() : options_heap.data();
  std::memcpy(at, &cpu_v1, sizeof(cpu_v1));
  maxsim_context* made = nullptr;
  ASSERT_EQ(maxsim_context_create(reinterpret_cast<const maxsim_options*>(at), &made), MAXSIM_OK)
      << maxsim_last_error();
  EXPECT_EQ(maxsim_context_num_threads(made), 1);
  EXPECT_STREQ(maxsim_context_backend(made), "cpu");
  maxsim_context_destroy(made);
  maxsim_options small_options;
  std::memset(&small_options, kPoison, sizeof(small_options));
  maxsim_options_init_sized(&small_options, 8);
  made = nullptr;
  EXPECT_EQ(maxsim_context_create(&small_options, &made), MAXSIM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(made, nullptr);
  EXPECT_NE(std::string(maxsim_last_error()).find("maxsim_options.struct_size is 0"), std::string::npos)
      << maxsim_last_error();
}

// maxsim_backward_args has the same three ways in: the exported function (first layout, up to cuda_stream), the
// _sized function (never past the caller's size) and the macro (this header's whole struct).
struct BackwardArgsV1 {
  uint32_t struct_size;
  maxsim_layout layout;
  const uint64_t* cand_offsets;
  const uint64_t* candidates;
  const int32_t* argmax;
  const float* grad_scores;
  float* grad_queries;
  float* grad_documents;
  int deterministic;
  void* cuda_stream;
};
static_assert(offsetof(BackwardArgsV1, cuda_stream) == offsetof(maxsim_backward_args, cuda_stream), "first layout");
static_assert(sizeof(BackwardArgsV1) < sizeof(maxsim_backward_args), "flags were appended since");

TEST(Api, BackwardArgsInitWritesOnlyTheCallersSize) {
  const auto exported = Exported(&maxsim_backward_args_init);
  auto sized = [](size_t size) { return Sized(&maxsim_backward_args_init_sized, size); };
  const std::vector<uint8_t> v1 = InitInto(sizeof(BackwardArgsV1), exported);
  const BackwardArgsV1 a1 = As<BackwardArgsV1>(v1);
  EXPECT_EQ(a1.struct_size, sizeof(BackwardArgsV1));
  EXPECT_EQ(a1.layout, MAXSIM_LAYOUT_MATRIX);
  EXPECT_EQ(a1.cand_offsets, nullptr);
  EXPECT_EQ(a1.candidates, nullptr);
  EXPECT_EQ(a1.argmax, nullptr);
  EXPECT_EQ(a1.grad_scores, nullptr);
  EXPECT_EQ(a1.grad_queries, nullptr);
  EXPECT_EQ(a1.grad_documents, nullptr);
  EXPECT_EQ(a1.deterministic, 0);
  EXPECT_EQ(a1.cuda_stream, nullptr);
  EXPECT_EQ(InitInto(sizeof(BackwardArgsV1), sized(sizeof(BackwardArgsV1))), v1);

  maxsim_backward_args full;
  std::memset(&full, kPoison, sizeof(full));
  maxsim_backward_args_init(&full);
  EXPECT_EQ(full.struct_size, sizeof(full));
  EXPECT_EQ(full.flags, 0u);
  EXPECT_EQ(full.layout, MAXSIM_LAYOUT_MATRIX);
  EXPECT_EQ(std::memcmp(reinterpret_cast<const uint8_t*>(&full) + 4, v1.data() + 4, sizeof(BackwardArgsV1) - 4), 0);

  for (size_t size : {size_t{4}, size_t{16}, sizeof(BackwardArgsV1) - 1}) {
    const std::vector<uint8_t> b = InitInto(size, sized(size));
    EXPECT_EQ(StructSize(b), 0u) << size;
    for (size_t i = 4; i < size; ++i) EXPECT_EQ(b[i], kPoison) << size;
  }
  EXPECT_EQ(InitInto(3, sized(3)), std::vector<uint8_t>(3, kPoison));
  const std::vector<uint8_t> newer = InitInto(sizeof(full) + 16, sized(sizeof(full) + 16));
  EXPECT_EQ(StructSize(newer), sizeof(full));
  for (size_t i = sizeof(full); i < newer.size(); ++i) EXPECT_EQ(newer[i], kPoison);
  maxsim_backward_args_init_sized(nullptr, sizeof(full));  // NULL: nothing, no crash
  (maxsim_backward_args_init)(nullptr);
}

}  // namespace
}  // namespace maxsim::test
