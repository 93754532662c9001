// SPDX-License-Identifier: Apache-2.0
// Real ColBERTv2 embeddings (../shared/data/colbert-nanofiqa: 5 queries x 32 tokens, 35 documents, d = 128).
// Skipped, with a message, where the shared folder is absent (a user's clone).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "maxsim/maxsim.hpp"
#include "test_util.h"

namespace maxsim::test {
namespace {

class RealData : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    if (!LoadNanoFiqa(&q_, &d_, &qids_, &dids_, &error)) GTEST_SKIP() << "real embeddings unavailable: " << error;
    ASSERT_EQ(q_.dim, 128u);
    ASSERT_EQ(q_.n_sets(), 5u);
    ASSERT_EQ(d_.n_sets(), 35u);
  }
  TokenSets q_, d_;
  std::vector<std::string> qids_, dids_;
};

TEST_F(RealData, EveryKernelExactMatchesFloat64AndCertifiedMatchesExact) {
  const uint64_t nq = q_.n_sets(), nd = d_.n_sets();
  for (size_t k = 0; k < maxsim_kernel_count(); ++k) {
    if (!maxsim_kernel_available(k, nullptr)) continue;
    Context ctx = CpuContext(2, maxsim_kernel_name(k));
    Packed corpus = Packed::Pack(ctx, d_.Dense());
    for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
      std::vector<int32_t> ae(nd * q_.rows()), ac(nd * q_.rows());
      maxsim_stats st{};
      const auto exact = ctx.ScoreMatrix(q_.Dense(), nq, corpus, nd, {metric, MAXSIM_MODE_EXACT}, ae.data());
      const auto cert =
          ctx.ScoreMatrix(q_.Dense(), nq, corpus, nd, {metric, MAXSIM_MODE_CERTIFIED, &st}, ac.data());
      EXPECT_EQ(std::memcmp(exact.data(), cert.data(), exact.size() * 4), 0) << maxsim_kernel_name(k);
      EXPECT_EQ(ae, ac) << maxsim_kernel_name(k);
      for (uint64_t i = 0; i < nq; ++i) {
        for (uint64_t j = 0; j < nd; ++j) {
          const std::string err = CheckPair(q_, i, d_, j, metric, exact[i * nd + j], ae.data() + nd * 32 * i + j * 32);
          EXPECT_TRUE(err.empty()) << maxsim_kernel_name(k) << " query " << qids_[i] << " doc " << dids_[j] << ": " << err;
        }
      }
      const double multi = static_cast<double>(st.multi_candidate) / static_cast<double>(st.query_tokens);
      const double refined = static_cast<double>(st.refined) / static_cast<double>(st.query_tokens);
      RecordProperty(std::string("multi_candidate_fraction_") + maxsim_kernel_name(k) + "_m" + std::to_string(metric),
                     std::to_string(multi));
      std::printf("[ real data ] kernel %s metric %s: %.1f%% of query tokens needed more than one refinement; "
                  "%.2f candidates refined per query token per document\n",
                  maxsim_kernel_name(k), metric == MAXSIM_METRIC_DOT ? "dot" : "cosine", 100 * multi, refined);
      EXPECT_LT(refined, 20.0) << "certified screening should leave only a few candidates on real data";
    }
  }
}

TEST_F(RealData, ExactTopKRankingEqualsTheFloat64Ranking) {
  Context ctx;
  Packed corpus = Packed::Pack(ctx, d_.Dense());
  const uint64_t nq = q_.n_sets(), nd = d_.n_sets();
  for (maxsim_mode mode : {MAXSIM_MODE_EXACT, MAXSIM_MODE_CERTIFIED}) {
    const TopKResult top = ctx.TopK(q_.Dense(), nq, corpus, nd, {MAXSIM_METRIC_DOT, mode});
    for (uint64_t i = 0; i < nq; ++i) {
      std::vector<double> ref(nd);
      std::vector<double> tol(nd);
      for (uint64_t j = 0; j < nd; ++j) {
        const RefPair r = Reference(q_, i, d_, j, MAXSIM_METRIC_DOT);
        ref[j] = r.score;
        tol[j] = r.tolerance;
      }
      const std::vector<uint64_t> order = RankDescending(ref.data(), nd);
      for (uint64_t r = 0; r < nd; ++r) {
        if (top.index[i * nd + r] == order[r]) continue;
        // Only a pair of documents whose float64 scores are within the f32 error bound may swap.
        const uint64_t a = top.index[i * nd + r], b = order[r];
        EXPECT_LE(std::fabs(ref[a] - ref[b]), tol[a] + tol[b])
            << "query " << qids_[i] << " rank " << r << ": got doc " << dids_[a] << ", float64 ranking has " << dids_[b];
      }
    }
  }
}

TEST_F(RealData, ApproximateModePicksWrongTokensSometimesButCertifiedNever) {
  Context ctx;
  Packed corpus = Packed::Pack(ctx, d_.Dense());
  const uint64_t nq = q_.n_sets(), nd = d_.n_sets();
  std::vector<int32_t> ae(nd * q_.rows()), aa(nd * q_.rows());
  ctx.ScoreMatrix(q_.Dense(), nq, corpus, nd, {MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT}, ae.data());
  ctx.ScoreMatrix(q_.Dense(), nq, corpus, nd, {MAXSIM_METRIC_DOT, MAXSIM_MODE_APPROXIMATE}, aa.data());
  size_t wrong = 0;
  for (size_t t = 0; t < ae.size(); ++t) wrong += ae[t] != aa[t];
  std::printf("[ real data ] approximate mode picked a different token for %zu of %zu query tokens (%.2f%%)\n", wrong,
              ae.size(), 100.0 * static_cast<double>(wrong) / static_cast<double>(ae.size()));
  EXPECT_LT(wrong, ae.size() / 10);
}

}  // namespace
}  // namespace maxsim::test
