// SPDX-License-Identifier: Apache-2.0
// Every kernel in the kernel list, on every input shape the issue names, against the float64 reference; and
// the two exactness contracts: certified == exact bit for bit, and exact results identical across kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernel_agree.h"
#include "kernels/kernel.h"
#include "maxsim/maxsim.hpp"
#include "test_util.h"

namespace maxsim::test {
namespace {

std::vector<size_t> AllKernels() {
  std::vector<size_t> ids;
  for (size_t i = 0; i < maxsim_kernel_count(); ++i) ids.push_back(i);
  return ids;
}

void ExpectMatchesReference(const TokenSets& q, const TokenSets& d, maxsim_metric metric, const Outcome& r,
                            const std::string& what) {
  const uint64_t nd = d.n_sets();
  for (uint64_t i = 0; i < q.n_sets(); ++i) {
    for (uint64_t j = 0; j < nd; ++j) {
      const int32_t* am = r.argmax.data() + nd * q.offsets[i] + j * q.length(i);
      const std::string err = CheckPair(q, i, d, j, metric, r.scores[i * nd + j], am);
      ASSERT_TRUE(err.empty()) << what << " query " << i << " doc " << j << ": " << err;
    }
  }
}

class KernelTest : public ::testing::TestWithParam<size_t> {
 protected:
  void SetUp() override {
    const char* reason = nullptr;
    name_ = maxsim_kernel_name(GetParam());
    if (!maxsim_kernel_available(GetParam(), &reason)) {
      GTEST_SKIP() << "kernel " << name_ << " unavailable here: " << reason;
    }
  }
  std::string name_;
};

const uint32_t kDims[] = {1, 7, 48, 64, 96, 128, 200, 768};
const maxsim_dtype kDtypes[] = {MAXSIM_F32, MAXSIM_F16, MAXSIM_BF16};
const maxsim_metric kMetrics[] = {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE};

TEST_P(KernelTest, ExactAndCertifiedMatchReferenceAcrossDimsAndDtypes) {
  Context ctx = KernelContext(name_.c_str(), 2);
  std::mt19937_64 rng(1234 + GetParam());
  for (uint32_t dim : kDims) {
    for (maxsim_dtype dtype : kDtypes) {
      const uint64_t max_len = dim >= 200 ? 24 : 40;
      TokenSets q = Generate(rng, Shape::kUnitGaussian, 3, 1, 33, dim);
      TokenSets d = Generate(rng, Shape::kGaussian, 7, 0, max_len, dim);  // ragged, some empty
      q.Encode(dtype);
      d.Encode(dtype);
      for (maxsim_metric metric : kMetrics) {
        const std::string what = "kernel " + name_ + " dim " + std::to_string(dim) + " dtype " +
                                 std::to_string(dtype) + " metric " + std::to_string(metric);
        const Outcome exact = ScoreMatrixWith(ctx, q, d, metric, MAXSIM_MODE_EXACT, false);
        ExpectMatchesReference(q, d, metric, exact, what + " exact/dense");
        const Outcome exact_packed = ScoreMatrixWith(ctx, q, d, metric, MAXSIM_MODE_EXACT, true);
        ExpectIdentical(exact, exact_packed, what + " exact dense vs packed");
        const Outcome certified = ScoreMatrixWith(ctx, q, d, metric, MAXSIM_MODE_CERTIFIED, true);
        ExpectIdentical(exact, certified, what + " certified vs exact");
        const Outcome certified_dense = ScoreMatrixWith(ctx, q, d, metric, MAXSIM_MODE_CERTIFIED, false);
        ExpectIdentical(exact, certified_dense, what + " certified(dense) vs exact");
      }
    }
  }
}

TEST_P(KernelTest, AdversarialShapes) {
  Context ctx = KernelContext(name_.c_str(), 2);
  std::mt19937_64 rng(99 + GetParam());
  const Shape shapes[] = {Shape::kGaussian,  Shape::kUnitGaussian, Shape::kClustered, Shape::kLargeNorm,
                          Shape::kTinyNorm, Shape::kNearTies,     Shape::kDuplicates};
  for (Shape shape : shapes) {
    for (uint32_t dim : {5u, 64u, 128u}) {
      TokenSets q = Generate(rng, shape, 4, 0, 40, dim);
      TokenSets d = Generate(rng, shape, 9, 0, 70, dim);
      for (maxsim_metric metric : kMetrics) {
        const std::string what = std::string("kernel ") + name_ + " shape " + ShapeName(shape) + " dim " +
                                 std::to_string(dim) + " metric " + std::to_string(metric);
        const Outcome exact = ScoreMatrixWith(ctx, q, d, metric, MAXSIM_MODE_EXACT, true);
        ExpectMatchesReference(q, d, metric, exact, what);
        const Outcome certified = ScoreMatrixWith(ctx, q, d, metric, MAXSIM_MODE_CERTIFIED, true);
        ExpectIdentical(exact, certified, what + " certified vs exact");
      }
    }
  }
}

TEST_P(KernelTest, NearTieDocumentsBuiltAroundTheQuery) {
  // Document tokens are perturbed copies of query tokens, so several document tokens compete for each query
  // token at every scale from 1e-3 down to below f32 resolution.
  Context ctx = KernelContext(name_.c_str(), 2);
  std::mt19937_64 rng(7 + GetParam());
  for (double spread : {1e-3, 1e-5, 1e-7, 1e-9}) {
    TokenSets q = Generate(rng, Shape::kUnitGaussian, 3, 8, 32, 128);
    TokenSets d = NearTieDocuments(rng, q, 6, 64, spread);
    for (maxsim_metric metric : kMetrics) {
      const std::string what = "kernel " + name_ + " spread " + std::to_string(spread);
      const Outcome exact = ScoreMatrixWith(ctx, q, d, metric, MAXSIM_MODE_EXACT, true);
      ExpectMatchesReference(q, d, metric, exact, what);
      const Outcome certified = ScoreMatrixWith(ctx, q, d, metric, MAXSIM_MODE_CERTIFIED, true);
      ExpectIdentical(exact, certified, what + " certified vs exact");
      EXPECT_GT(certified.stats.multi_candidate, 0u) << what << ": near ties should leave several candidates";
    }
  }
}

// The exact contract at the level of single roundings (kernel.h): one fused multiply-add per k, in increasing k,
// from +0, whatever the kernel's instructions (FMLA, FMOPA into ZA, wasm's emulated fma, ...). Query token t and
// its trap document token j(t) share 6 coordinates no other token uses, so every other similarity is exactly +0,
// and hold one of two traps:
//   even t: 1 x -(1 + 2^-11), then (1 + 2^-12) x (1 + 2^-12): fused, E = 2^-24; with the product rounded, 0;
//   odd t:  2^30 x 1, 1 x 1, -2^30 x 1, 1 x 2^-20: in k order the 1 is absorbed by 2^30 and E = 2^-20; another
//           order, or a wider accumulator, leaves about 1.
// Only the canonical chain makes j(t) the unique maximum of token t; otherwise the +0 of document token 0 wins.
TEST_P(KernelTest, ExactIsOneFusedMultiplyAddPerKInOrderFromPositiveZero) {
  constexpr uint32_t kQ = 37, kD = 45, kShort = 7, kDim = 6 * kQ + 1;
  const auto trap = [](uint32_t t) { return 1 + (7 * t) % (kD - 1); };  // distinct for t < 44, never 0
  TokenSets q, d;
  q.dim = d.dim = kDim;
  q.offsets = {0, kQ};
  d.offsets = {0, kD, kD + kShort};  // and a short document: the trap rows of the last kShort tokens
  q.values.assign(static_cast<size_t>(kQ) * kDim, 0.0f);
  d.values.assign(static_cast<size_t>(kD + kShort) * kDim, 0.0f);
  std::vector<float> expect_key(kQ);
  for (uint32_t t = 0; t < kQ; ++t) {
    float* qv = &q.values[static_cast<size_t>(t) * kDim + 6 * t];
    float* dv = &d.values[static_cast<size_t>(trap(t)) * kDim + 6 * t];
    if (t % 2 == 0) {
      qv[0] = 1.0f, dv[0] = -(1.0f + 0x1p-11f);
      qv[1] = dv[1] = 1.0f + 0x1p-12f;
      expect_key[t] = 0x1p-24f;
    } else {
      qv[0] = 0x1p30f, dv[0] = 1.0f;
      qv[1] = 1.0f, dv[1] = 1.0f;
      qv[2] = -0x1p30f, dv[2] = 1.0f;
      qv[3] = 1.0f, dv[3] = 0x1p-20f;
      expect_key[t] = 0x1p-20f;
    }
    float chain = 0.0f;  // the construction itself: the canonical chain gives the trap's value
    for (uint32_t k = 0; k < kDim; ++k) {
      chain = std::fma(q.values[static_cast<size_t>(t) * kDim + k], d.values[static_cast<size_t>(trap(t)) * kDim + k], chain);
    }
    ASSERT_EQ(chain, expect_key[t]) << "token " << t;
  }
  for (uint32_t r = 0; r < kShort; ++r) {
    std::copy_n(&d.values[static_cast<size_t>(trap(kQ - kShort + r)) * kDim], kDim,
                &d.values[static_cast<size_t>(kD + r) * kDim]);
  }
  q.Encode(MAXSIM_F32);
  d.Encode(MAXSIM_F32);
  Context ctx = KernelContext(name_.c_str(), 2);
  Context scalar = KernelContext("scalar", 2);
  for (maxsim_metric metric : kMetrics) {
    const std::string what = "kernel " + name_ + " metric " + std::to_string(metric);
    const Outcome exact = ScoreMatrixWith(ctx, q, d, metric, MAXSIM_MODE_EXACT, true);
    for (uint32_t t = 0; t < kQ; ++t) {
      ASSERT_EQ(exact.argmax[t], static_cast<int32_t>(trap(t))) << what << ": query token " << t;
      const int32_t in_short = t >= kQ - kShort ? static_cast<int32_t>(t - (kQ - kShort)) : 0;
      ASSERT_EQ(exact.argmax[kQ + t], in_short) << what << ": query token " << t << " in the short document";
    }
    if (metric == MAXSIM_METRIC_DOT) {
      double sum = 0.0;
      for (float k : expect_key) sum += k;
      EXPECT_EQ(exact.scores[0], static_cast<float>(sum)) << what;
    }
    ExpectIdentical(ScoreMatrixWith(scalar, q, d, metric, MAXSIM_MODE_EXACT, true), exact, what + " vs scalar");
    ExpectIdentical(exact, ScoreMatrixWith(ctx, q, d, metric, MAXSIM_MODE_CERTIFIED, true), what + " certified vs exact");
  }
}

TEST_P(KernelTest, ApproximateRefinesItsOwnChoice) {
  // Approximate mode is allowed to pick a worse token, but the value it reports is that token's exact
  // similarity: never above the exact maximum, and close to it.
  Context ctx = KernelContext(name_.c_str(), 2);
  std::mt19937_64 rng(5 + GetParam());
  TokenSets q = Generate(rng, Shape::kUnitGaussian, 4, 1, 32, 128);
  TokenSets d = Generate(rng, Shape::kClustered, 20, 1, 120, 128);
  for (maxsim_metric metric : kMetrics) {
    const Outcome exact = ScoreMatrixWith(ctx, q, d, metric, MAXSIM_MODE_EXACT, true);
    const Outcome approx = ScoreMatrixWith(ctx, q, d, metric, MAXSIM_MODE_APPROXIMATE, true);
    for (size_t p = 0; p < exact.scores.size(); ++p) {
      EXPECT_LE(approx.scores[p], exact.scores[p]);
      EXPECT_GE(approx.scores[p], exact.scores[p] - 0.05f * std::fabs(exact.scores[p]) - 0.05f);
    }
    for (size_t a = 0; a < exact.argmax.size(); ++a) {
      EXPECT_GE(approx.argmax[a], exact.argmax[a] < 0 ? -1 : 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllKernels, KernelTest, ::testing::ValuesIn(AllKernels()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           std::string n = maxsim_kernel_name(info.param);
                           for (char& c : n) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return n;
                         });

TEST(KernelsAgree, ExactResultsAreBitIdenticalAcrossKernelsAndThreadCounts) {
  std::mt19937_64 rng(2024);
  TokenSets q = Generate(rng, Shape::kUnitGaussian, 5, 0, 40, 96);
  TokenSets d = Generate(rng, Shape::kClustered, 40, 0, 90, 96);
  std::vector<Outcome> results;
  std::vector<std::string> names;
  for (size_t k = 0; k < maxsim_kernel_count(); ++k) {
    if (!maxsim_kernel_available(k, nullptr)) continue;
    for (int threads : {1, 2, 3}) {
      Context ctx = KernelContext(maxsim_kernel_name(k), threads);
      for (maxsim_metric metric : kMetrics) {
        results.push_back(ScoreMatrixWith(ctx, q, d, metric, MAXSIM_MODE_EXACT, true));
        names.push_back(std::string(maxsim_kernel_name(k)) + "/" + std::to_string(threads) + "t/m" +
                        std::to_string(metric));
      }
    }
  }
  for (size_t r = 2; r < results.size(); ++r) {
    ExpectIdentical(results[r % 2], results[r], names[r % 2] + " vs " + names[r]);
  }
}

// "auto" takes the highest-priority available kernel that is not explicit-only; an explicit-only kernel (a
// negative priority: `sme`, never validated on hardware) runs only when named.
TEST(KernelList, AutoNeverSelectsAnExplicitOnlyKernel) {
  size_t n = 0;
  const KernelInfo* list = KernelList(&n);
  const KernelInfo* expect = nullptr;
  for (size_t i = 0; i < n && !expect; ++i) {
    if (i > 0) EXPECT_GE(list[i - 1].priority, list[i].priority) << "the list is in priority order at " << list[i].name;
    if (!KernelExplicitOnly(list[i]) && KernelAvailable(list[i], nullptr)) expect = &list[i];
  }
  ASSERT_NE(expect, nullptr);
  maxsim_options o;
  maxsim_options_init(&o);
  o.isa = "auto";
  o.load_plugins = 0;
  maxsim_context* ctx = nullptr;
  ASSERT_EQ(maxsim_context_create(&o, &ctx), MAXSIM_OK) << maxsim_last_error();
  EXPECT_STREQ(maxsim_context_kernel(ctx), expect->name);
  maxsim_context_destroy(ctx);
  for (size_t i = 0; i < n; ++i) {
    if (!KernelExplicitOnly(list[i]) || !KernelAvailable(list[i], nullptr)) continue;
    o.isa = list[i].name;  // named, it runs
    ASSERT_EQ(maxsim_context_create(&o, &ctx), MAXSIM_OK) << maxsim_last_error();
    EXPECT_STREQ(maxsim_context_kernel(ctx), list[i].name);
    maxsim_context_destroy(ctx);
  }
}

// Every automatically selectable kernel against scalar in every mode, candidate sets included
// (ExpectEveryKernelMatchesScalar; the explicit-only `sme` kernel has its own tests). Query lengths straddle
// every vector a kernel may fill (4 to 64 f32 lanes: NEON, AVX2, AVX-512, SVE from 128 to 2048 bits, one vector
// or two), document lengths every row tile and every remainder of the SVE kernels' rows-per-vector (1 to 32),
// dims with and without k tails, and near-tie documents (several tokens within 1e-6 of the best for each query
// token: many candidates). x86_kernel_test.cc runs the same comparison over the x86 tile shapes, 16-bit inputs
// and every kernel variant.
TEST(KernelsAgree, EveryModeAndCandidateSetMatchScalarAcrossVectorRemainders) {
  std::mt19937_64 rng(4242);
  const std::vector<uint64_t> lengths = {1, 3, 5, 17, 33, 65, 100};
  for (uint32_t dim : {5u, 130u}) {
    const TokenSets q = QueriesOfLengths(rng, lengths, dim, MAXSIM_F32);
    std::vector<TokenSets> doc_sets = {Generate(rng, Shape::kClustered, 12, 0, 70, dim)};
    if (dim > 64) doc_sets.push_back(NearTieDocuments(rng, q, 3, 45, 1e-6));
    for (size_t set = 0; set < doc_sets.size(); ++set) {
      const TokenSets& d = doc_sets[set];
      ExpectEveryKernelMatchesScalar(q, d, "dim " + std::to_string(dim) + (set ? " near-tie" : " clustered"), {});
      if (set == 1) {
        Context scalar = KernelContext("scalar", 1);
        EXPECT_GT(ScoreMatrixWith(scalar, q, d, MAXSIM_METRIC_DOT, MAXSIM_MODE_CERTIFIED).stats.multi_candidate, 0u)
            << "near ties should leave several candidates";
      }
    }
  }
}

}  // namespace
}  // namespace maxsim::test
