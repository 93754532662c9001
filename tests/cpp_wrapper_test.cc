// SPDX-License-Identifier: Apache-2.0
// The C++ wrapper (maxsim.hpp) accepts offsets and candidate indices as users hold them: int64 (numpy, torch),
// uint64, int32, uint32. Every form must give the same bits as the uint64 C call, 32-bit copies must outlive
// their source, and negative values must be refused with the element named. Other element types are a compile
// error at the call site (tests/compile_fail/, checked by CTest).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "test_util.h"

namespace maxsim::test {
namespace {

template <typename T>
std::vector<T> As(const std::vector<uint64_t>& v) {
  return std::vector<T>(v.begin(), v.end());
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class CppWrapper : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937_64 rng(15);
    q_ = Generate(rng, Shape::kUnitGaussian, 5, 0, 9, 33);   // an empty query set is allowed
    d_ = Generate(rng, Shape::kUnitGaussian, 11, 0, 17, 33);  // so is an empty document
    corpus_ = Packed::Pack(ctx_, d_.Dense());
    expected_ = ctx_.ScoreMatrix(q_.Dense(), q_.n_sets(), corpus_, d_.n_sets(), {MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT});
    for (uint64_t i = 0; i < q_.n_sets(); ++i) {
      for (uint64_t j = 0; j < d_.n_sets(); ++j) {
        EXPECT_EQ(CheckPair(q_, i, d_, j, MAXSIM_METRIC_DOT, expected_[i * d_.n_sets() + j], nullptr), "");
      }
    }
  }
  template <typename T>
  std::vector<float> ScoresWith(const std::vector<T>& offsets) {
    return ctx_.ScoreMatrix(DenseSets(q_.values.data(), q_.dim, offsets), q_.n_sets(), corpus_, d_.n_sets(),
                            {MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT});
  }
  Context ctx_;
  TokenSets q_, d_;
  Packed corpus_;
  std::vector<float> expected_;
};

TEST_F(CppWrapper, EveryOffsetTypeGivesTheSameBits) {
  EXPECT_TRUE(SameBits(ScoresWith(q_.offsets), expected_));
  EXPECT_TRUE(SameBits(ScoresWith(As<int64_t>(q_.offsets)), expected_));
  EXPECT_TRUE(SameBits(ScoresWith(As<int32_t>(q_.offsets)), expected_));
  EXPECT_TRUE(SameBits(ScoresWith(As<uint32_t>(q_.offsets)), expected_));
  EXPECT_TRUE(SameBits(ScoresWith(As<long long>(q_.offsets)), expected_));
  const std::vector<int64_t> off64 = As<int64_t>(q_.offsets);
  EXPECT_TRUE(SameBits(ctx_.ScoreMatrix(DenseSets(q_.values.data(), q_.dim, Indices(off64.data(), off64.size())),
                                        q_.n_sets(), corpus_, d_.n_sets()),
                       expected_));
}

TEST_F(CppWrapper, WidenedOffsetsOutliveTheirSource) {
  std::vector<int32_t>* off32 = new std::vector<int32_t>(As<int32_t>(q_.offsets));
  DenseSets q(q_.values.data(), q_.dim, *off32);
  std::fill(off32->begin(), off32->end(), -1);  // neither a later change nor freeing reaches the copy
  delete off32;
  DenseSets copy = q;
  EXPECT_TRUE(SameBits(ctx_.ScoreMatrix(copy, q_.n_sets(), corpus_, d_.n_sets()), expected_));
  EXPECT_EQ(copy.n_sets(), q_.n_sets());
}

TEST_F(CppWrapper, NegativeOffsetsAreRefusedNamingTheElement) {
  std::vector<int64_t> off = As<int64_t>(q_.offsets);
  off[2] = -3;
  try {
    DenseSets q(q_.values.data(), q_.dim, off);
    FAIL() << "a negative offset was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), MAXSIM_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("element 2 is negative (-3)"), std::string::npos) << e.what();
  }
  std::vector<int32_t> off32 = As<int32_t>(q_.offsets);
  off32.back() = -1;
  EXPECT_THROW(DenseSets(q_.values.data(), q_.dim, off32), Error);
}

TEST_F(CppWrapper, CandidatesTakeTheSameIntegerTypes) {
  // Query i is scored against documents (i + c) % n for c < 3: the scores are the matrix's entries.
  const uint64_t nd = d_.n_sets();
  std::vector<uint64_t> cand_off, cand;
  for (uint64_t i = 0; i < q_.n_sets(); ++i) {
    cand_off.push_back(cand.size());
    for (uint64_t c = 0; c < 3; ++c) cand.push_back((i + c * 4) % nd);
  }
  cand_off.push_back(cand.size());
  std::vector<float> want(cand.size());
  for (uint64_t i = 0; i < q_.n_sets(); ++i) {
    for (uint64_t c = cand_off[i]; c < cand_off[i + 1]; ++c) want[c] = expected_[i * nd + cand[c]];
  }
  auto run = [&](const Indices& off, const Indices& idx) {
    std::vector<float> got(cand.size());
    ctx_.ScoreCandidates(q_.Dense(), corpus_, off, idx, got);
    return got;
  };
  EXPECT_TRUE(SameBits(run(cand_off, cand), want));
  EXPECT_TRUE(SameBits(run(As<int64_t>(cand_off), As<int64_t>(cand)), want));
  EXPECT_TRUE(SameBits(run(As<int32_t>(cand_off), As<uint32_t>(cand)), want));
  std::vector<int64_t> bad = As<int64_t>(cand);
  bad[1] = -7;
  EXPECT_THROW(run(cand_off, bad), Error);
}

}  // namespace
}  // namespace maxsim::test
