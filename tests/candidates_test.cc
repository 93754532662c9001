// SPDX-License-Identifier: Apache-2.0
// Candidate lists over a large dense corpus: the listed documents (the first and last ones, repeats, empty and
// masked ones) score the same bits as a corpus holding only them, and the float64 reference; only the listed
// documents are read and checked, so a bad value elsewhere in the corpus is not an error, and a bad listed one is
// named by the first rejected row in document order, whatever the list order and the thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "maxsim/maxsim.hpp"
#include "test_util.h"

namespace maxsim::test {
namespace {

// The documents `list` names, in list order (repeats included), as sets of their own.
TokenSets Subset(const TokenSets& d, const std::vector<uint64_t>& list) {
  TokenSets s;
  s.dim = d.dim;
  s.offsets = {0};
  for (uint64_t j : list) {
    for (uint64_t r = d.offsets[j]; r < d.offsets[j + 1]; ++r) {
      s.values.insert(s.values.end(), d.row(r), d.row(r) + d.dim);
      if (!d.mask.empty()) s.mask.push_back(d.mask[r]);
    }
    s.offsets.push_back(s.offsets.back() + d.length(j));
  }
  return s;
}

// A corpus of 20000 documents (0-10 tokens, some empty, every 7th row masked) and 3 queries.
struct Corpus {
  TokenSets q, d;
  Corpus() {
    std::mt19937_64 rng(77);
    q = Generate(rng, Shape::kUnitGaussian, 3, 1, 12, 40);
    d = Generate(rng, Shape::kClustered, 20000, 0, 10, 40);
    d.mask.assign(d.rows(), 1);
    for (uint64_t r = 3; r < d.rows(); r += 7) d.mask[r] = 0;
  }
  // The first document at or after j with at least n tokens.
  uint64_t WithTokens(uint64_t j, uint64_t n) const {
    while (d.length(j) < n) ++j;
    return j;
  }
};

TEST(Candidates, FewOfALargeDenseCorpusScoreAsACorpusOfTheirOwn) {
  const Corpus c;
  const uint64_t nd = c.d.n_sets();
  uint64_t empty = 0;
  while (c.d.length(empty) != 0) ++empty;
  // Query 0: both ends and a repeat; query 1: none; query 2: the last document twice, an empty one, the first.
  const std::vector<uint64_t> off{0, 4, 4, 9};
  const std::vector<uint64_t> cand{0, nd - 1, 5000, 0, nd - 1, 12345, empty, nd - 1, 1};
  std::vector<uint64_t> base{0};  // argmax base of each query (K_i * Lq_i)
  for (uint64_t i = 0; i < 3; ++i) base.push_back(base.back() + (off[i + 1] - off[i]) * c.q.length(i));
  for (maxsim_dtype dtype : {MAXSIM_F32, MAXSIM_BF16}) {
    TokenSets q = c.q, d = c.d;
    q.Encode(dtype);
    d.Encode(dtype);
    TokenSets own = Subset(d, cand);
    own.Encode(dtype);
    const DenseSets qd = q.Dense(), dd = d.Dense(), od = own.Dense();
    for (int threads : {1, 2}) {
      Context ctx = CpuContext(threads);
      for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
        for (maxsim_mode mode : {MAXSIM_MODE_EXACT, MAXSIM_MODE_CERTIFIED, MAXSIM_MODE_APPROXIMATE}) {
          const std::string what = "dtype " + std::to_string(dtype) + " threads " + std::to_string(threads) +
                                   " metric " + std::to_string(metric) + " mode " + std::to_string(mode);
          const ScoreOptions o{metric, mode};
          std::vector<float> got(cand.size(), 7.0f);
          std::vector<int32_t> got_am(base.back(), -9);
          ctx.ScoreCandidates(qd, dd, off, cand, got, o, got_am.data());
          // Every query against the listed documents as a corpus: the candidates' entries of that matrix.
          const uint64_t n_own = own.n_sets();
          std::vector<int32_t> am(n_own * q.rows());
          const std::vector<float> matrix = ctx.ScoreMatrix(qd, 3, od, n_own, o, am.data());
          for (uint64_t i = 0; i < 3; ++i) {
            const uint64_t lq = q.length(i);
            for (uint64_t k = off[i]; k < off[i + 1]; ++k) {
              ASSERT_EQ(std::memcmp(&got[k], &matrix[i * n_own + k], 4), 0)
                  << what << " query " << i << " candidate " << k << ": " << got[k] << " vs " << matrix[i * n_own + k];
              const int32_t* a = got_am.data() + base[i] + (k - off[i]) * lq;
              for (uint64_t s = 0; s < lq; ++s) {
                ASSERT_EQ(a[s], am[n_own * q.offsets[i] + k * lq + s]) << what << " query " << i << " candidate " << k;
              }
              if (mode != MAXSIM_MODE_APPROXIMATE) {
                const std::string bad = CheckPair(q, i, d, cand[k], metric, got[k], a);
                ASSERT_TRUE(bad.empty()) << what << " query " << i << " document " << cand[k] << ": " << bad;
              }
            }
          }
        }
      }
    }
  }
}

TEST(Candidates, OnlyTheListedDenseDocumentsAreChecked) {
  const Corpus c;
  const uint64_t nd = c.d.n_sets();
  const uint64_t low = c.WithTokens(100, 3), high = c.WithTokens(15000, 2);
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  TokenSets d = c.d;
  uint64_t bad_low = d.offsets[low] + 2;  // a kept row of `low`
  if (!d.kept(bad_low)) --bad_low;
  d.values[bad_low * d.dim + 5] = kNaN;
  // Finite elements, but a norm of 1.04e19 (three elements of 6e18): above the accepted 1e19.
  uint64_t bad_high = d.offsets[high];
  if (!d.kept(bad_high)) ++bad_high;
  for (uint32_t k = 0; k < 3; ++k) d.values[bad_high * d.dim + k] = 6e18f;
  // A NaN in a masked row of a listed document is never read (a document of 7 tokens has a masked row).
  const uint64_t listed_masked = c.WithTokens(12000, 7);
  uint64_t masked = d.offsets[listed_masked];
  while (d.kept(masked)) ++masked;
  d.values[masked * d.dim] = kNaN;
  d.Encode(MAXSIM_F32);
  const DenseSets qd = c.q.Dense(), dd = d.Dense();
  const maxsim_sets qs{nullptr, qd.get()}, ds{nullptr, dd.get()};
  for (int threads : {1, 2}) {
    Context ctx = CpuContext(threads);
    for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
      for (maxsim_mode mode : {MAXSIM_MODE_EXACT, MAXSIM_MODE_CERTIFIED, MAXSIM_MODE_APPROXIMATE}) {
        maxsim_score_options o;
        maxsim_score_options_init(&o);
        o.metric = metric;
        o.mode = mode;
        const std::string what = "threads " + std::to_string(threads) + " metric " + std::to_string(metric) +
                                 " mode " + std::to_string(mode);
        // Bad values outside the list: accepted, and the same bits as the clean corpus.
        const std::vector<uint64_t> off{0, 2, 3, 5}, cand{0, nd - 1, listed_masked, nd - 1, low - 1};
        std::vector<float> got(cand.size()), clean(cand.size());
        ASSERT_EQ(maxsim_score_candidates(ctx.get(), &qs, &ds, off.data(), cand.data(), &o, got.data(), nullptr),
                  MAXSIM_OK) << what << ": " << maxsim_last_error();
        const DenseSets cd = c.d.Dense();
        const maxsim_sets cs{nullptr, cd.get()};
        ASSERT_EQ(maxsim_score_candidates(ctx.get(), &qs, &cs, off.data(), cand.data(), &o, clean.data(), nullptr),
                  MAXSIM_OK) << what << ": " << maxsim_last_error();
        EXPECT_EQ(std::memcmp(got.data(), clean.data(), got.size() * sizeof(float)), 0) << what;
        // Both bad documents listed, the later one first: the error names the earlier one's row, whatever the
        // list order and the schedule; with only the later one listed, that one.
        const std::vector<uint64_t> both{nd - 1, high, 7, high, low, 0}, later{3, high};
        const std::vector<uint64_t> off_both{0, 3, 6, 6}, off_later{0, 1, 2, 2};
        std::vector<float> out(both.size());
        const std::string low_row = "documents: set " + std::to_string(low) + " token " +
                                    std::to_string(bad_low - d.offsets[low]) + " ";
        const std::string high_row = "documents: set " + std::to_string(high) + " token " +
                                     std::to_string(bad_high - d.offsets[high]) + " ";
        ASSERT_EQ(maxsim_score_candidates(ctx.get(), &qs, &ds, off_both.data(), both.data(), &o, out.data(), nullptr),
                  MAXSIM_ERR_NON_FINITE) << what;
        EXPECT_NE(std::string(maxsim_last_error()).find(low_row), std::string::npos) << what << ": " << maxsim_last_error();
        ASSERT_EQ(maxsim_score_candidates(ctx.get(), &qs, &ds, off_later.data(), later.data(), &o, out.data(), nullptr),
                  MAXSIM_ERR_NON_FINITE) << what;
        EXPECT_NE(std::string(maxsim_last_error()).find(high_row), std::string::npos) << what << ": " << maxsim_last_error();
        // An index past the corpus is refused before anything is scored; repeats are allowed (above).
        const std::vector<uint64_t> past{0, nd};
        const std::vector<uint64_t> off_past{0, 2, 2, 2};
        ASSERT_EQ(maxsim_score_candidates(ctx.get(), &qs, &ds, off_past.data(), past.data(), &o, out.data(), nullptr),
                  MAXSIM_ERR_INVALID_ARGUMENT) << what;
        EXPECT_NE(std::string(maxsim_last_error()).find("candidates[1] = " + std::to_string(nd)), std::string::npos)
            << maxsim_last_error();
      }
    }
  }
}

}  // namespace
}  // namespace maxsim::test
