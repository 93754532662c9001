// SPDX-License-Identifier: Apache-2.0
#include "kernel_agree.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kernels/kernel.h"

namespace maxsim::test {

Context KernelContext(const std::string& config, int threads) {
  const size_t slash = config.find('/');
  const std::string kernel = config.substr(0, slash);
  const char* env = nullptr;
  size_t n = 0;
  const KernelInfo* list = KernelList(&n);
  for (size_t i = 0; i < n; ++i) {
    if (kernel == list[i].name && list[i].ops->variants) env = list[i].ops->variants->env;
  }
  if (slash != std::string::npos) {
    EXPECT_NE(env, nullptr) << config;
    if (env) setenv(env, config.substr(slash + 1).c_str(), 1);
  }
  Context ctx = CpuContext(threads, kernel.c_str());
  if (env && slash != std::string::npos) unsetenv(env);
  return ctx;
}

std::vector<std::string> KernelConfigs(bool variants) {
  std::vector<std::string> configs;
  size_t n = 0;
  const KernelInfo* list = KernelList(&n);
  for (size_t i = 0; i < n; ++i) {
    if (KernelExplicitOnly(list[i]) || !KernelAvailable(list[i], nullptr)) continue;
    const KernelVariants* v = list[i].ops->variants;
    if (v == nullptr || !variants) {
      configs.push_back(list[i].name);
      continue;
    }
    for (int j = 0; j < 4 && v->names[j]; ++j) {
      if (v->runs(j, nullptr)) configs.push_back(std::string(list[i].name) + "/" + v->names[j]);
    }
  }
  return configs;
}

TokenSets QueriesOfLengths(std::mt19937_64& rng, const std::vector<uint64_t>& lengths, uint32_t dim,
                           maxsim_dtype dtype) {
  TokenSets q;
  q.dim = dim;
  q.offsets = {0};
  for (uint64_t len : lengths) q.offsets.push_back(q.offsets.back() + len);
  q.values = Generate(rng, Shape::kClustered, 1, q.offsets.back(), q.offsets.back(), dim).values;
  q.Encode(dtype);
  return q;
}

Outcome ScoreMatrixWith(Context& ctx, const TokenSets& q, const TokenSets& d, maxsim_metric metric, maxsim_mode mode,
                        bool packed_documents) {
  Outcome r;
  r.scores.assign(q.n_sets() * d.n_sets(), std::nanf(""));
  r.argmax.assign(d.n_sets() * q.rows(), -7);
  ScoreOptions o;
  o.metric = metric;
  o.mode = mode;
  o.stats = &r.stats;
  const DenseSets qd = q.Dense(), dd = d.Dense();
  if (packed_documents) {
    Packed pd = Packed::Pack(ctx, dd);
    ctx.ScoreMatrix(qd, pd, r.scores, o, r.argmax.data());
  } else {
    ctx.ScoreMatrix(qd, dd, r.scores, o, r.argmax.data());
  }
  return r;
}

void ExpectIdentical(const Outcome& a, const Outcome& b, const std::string& what) {
  ASSERT_EQ(a.scores.size(), b.scores.size()) << what;
  for (size_t i = 0; i < a.scores.size(); ++i) {
    ASSERT_EQ(std::memcmp(&a.scores[i], &b.scores[i], sizeof(float)), 0)
        << what << ": score " << i << " differs: " << a.scores[i] << " vs " << b.scores[i];
  }
  ASSERT_EQ(a.argmax, b.argmax) << what << ": argmax differs";
}

uint64_t Evaluations(const TokenSets& q, const TokenSets& d) {
  uint64_t non_empty = 0;
  for (uint64_t j = 0; j < d.n_sets(); ++j) non_empty += d.length(j) > 0;
  return q.rows() * non_empty;
}

void ExpectSameCandidateSets(const Outcome& scalar, const Outcome& got, const std::string& what,
                             uint64_t min_refined) {
  EXPECT_EQ(got.stats.multi_candidate, scalar.stats.multi_candidate) << what << ": candidate sets differ";
  EXPECT_LE(got.stats.refined, scalar.stats.refined) << what << ": refined more rows than the candidate sets hold";
  EXPECT_GE(got.stats.refined, min_refined) << what << ": fewer refinements than query-token evaluations";
}

void ExpectEveryKernelMatchesScalar(const TokenSets& q, const TokenSets& d, const std::string& label,
                                    const AgreeOptions& options) {
  const std::vector<std::string> configs = KernelConfigs(options.variants);
  for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
    for (maxsim_mode mode : {MAXSIM_MODE_EXACT, MAXSIM_MODE_CERTIFIED, MAXSIM_MODE_APPROXIMATE}) {
      Context ref_ctx = KernelContext("scalar", 1);
      const Outcome ref = ScoreMatrixWith(ref_ctx, q, d, metric, mode);
      const uint64_t min_refined = mode == MAXSIM_MODE_EXACT ? 0 : Evaluations(q, d);
      for (const std::string& k : configs) {
        if (k == "scalar" || (options.repeats && options.repeats(k, mode, d.dtype))) continue;
        Context ctx = KernelContext(k, 2);
        const std::string what = k + " " + label + " metric " + std::to_string(metric) + " mode " + std::to_string(mode);
        const Outcome got = ScoreMatrixWith(ctx, q, d, metric, mode);
        ExpectIdentical(ref, got, what);
        ExpectSameCandidateSets(ref, got, what, min_refined);
        if (options.dense_certified && mode == MAXSIM_MODE_CERTIFIED) {
          const Outcome dense = ScoreMatrixWith(ctx, q, d, metric, mode, false);
          ExpectIdentical(ref, dense, what + " (dense documents)");
          ExpectSameCandidateSets(ref, dense, what + " (dense documents)", min_refined);
        }
      }
    }
  }
}

}  // namespace maxsim::test
