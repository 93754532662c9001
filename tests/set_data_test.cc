// SPDX-License-Identifier: Apache-2.0
// Dense sets given with per-set row pointers (maxsim_dense_sets.set_data): every operation, mode, metric, dtype
// and thread count gives the same bits as the same rows concatenated into one array; packing gives the same bytes;
// the backward the same gradients; bad pointers, mixed layouts and device memory are refused with a message; a
// struct of the older size is read without the member.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "maxsim/maxsim.hpp"
#include "test_util.h"

namespace maxsim::test {
namespace {

// Ragged queries and documents with empty sets, near ties and (if masked) a mask on both, in dtype.
struct Data {
  TokenSets q, d;
  Data(uint64_t seed, maxsim_dtype dtype, bool masked) {
    std::mt19937_64 rng(seed);
    q = Generate(rng, Shape::kUnitGaussian, 3, 0, 19, 37);
    d = Generate(rng, Shape::kClustered, 9, 0, 41, 37);
    TokenSets ties = NearTieDocuments(rng, q, 4, 23, 1e-6);
    const uint64_t base = d.rows();
    d.values.insert(d.values.end(), ties.values.begin(), ties.values.end());
    for (uint64_t i = 1; i < ties.offsets.size(); ++i) d.offsets.push_back(base + ties.offsets[i]);
    q.offsets.insert(q.offsets.begin() + 1, q.offsets[1]);  // an empty query set (1) and document (3)
    d.offsets.insert(d.offsets.begin() + 3, d.offsets[3]);
    if (masked) {
      for (TokenSets* t : {&q, &d}) {
        t->mask.assign(t->rows(), 1);
        for (uint64_t r = 0; r < t->rows(); r += 4) t->mask[r] = 0;
      }
    }
    q.Encode(dtype);
    d.Encode(dtype);
  }
};

void ExpectSameFloats(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << what;
}

TEST(SetData, EveryOperationMatchesTheConcatenatedRowsBitForBit) {
  for (maxsim_dtype dtype : {MAXSIM_F32, MAXSIM_F16, MAXSIM_BF16}) {
    for (bool masked : {false, true}) {
      Data data(71 + dtype, dtype, masked);
      const uint64_t nq = data.q.n_sets(), nd = data.d.n_sets();
      const ScatteredSets sq(data.q, 40), sd(data.d);  // queries with a row stride wider than dim
      const DenseSets cq = data.q.Dense(), cd = data.d.Dense(), pq = sq.Dense(), pd = sd.Dense();
      const std::vector<uint64_t> off{0, 4, 4, 9, 11}, cand{12, 0, 3, 3, 1, 2, 11, 5, 8, 13, 3};
      for (int threads : {1, 2}) {
        Context ctx = CpuContext(threads);
        for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
          for (maxsim_mode mode : {MAXSIM_MODE_EXACT, MAXSIM_MODE_CERTIFIED, MAXSIM_MODE_APPROXIMATE}) {
            const std::string what = "dtype " + std::to_string(dtype) + (masked ? " masked" : "") + " threads " +
                                     std::to_string(threads) + " metric " + std::to_string(metric) + " mode " +
                                     std::to_string(mode);
            SCOPED_TRACE(what);
            const ScoreOptions o{metric, mode};
            std::vector<int32_t> a1(nd * data.q.rows()), a2(a1.size()), a3(a1.size());
            const auto m1 = ctx.ScoreMatrix(cq, nq, cd, nd, o, a1.data());
            const auto m2 = ctx.ScoreMatrix(pq, nq, pd, nd, o, a2.data());
            const auto m3 = ctx.ScoreMatrix(cq, nq, pd, nd, o, a3.data());
            ExpectSameFloats(m1, m2, "matrix");
            ExpectSameFloats(m1, m3, "matrix, dense queries");
            EXPECT_EQ(a1, a2);
            EXPECT_EQ(a1, a3);
            if (mode == MAXSIM_MODE_EXACT && dtype == MAXSIM_F32 && !masked) {
              for (uint64_t i = 0; i < nq; ++i) {
                for (uint64_t j = 0; j < nd; ++j) {
                  EXPECT_EQ(CheckPair(data.q, i, data.d, j, metric, m2[i * nd + j], nullptr), "") << i << " " << j;
                }
              }
            }
            std::vector<float> c1(cand.size()), c2(cand.size());
            ctx.ScoreCandidates(cq, cd, off, cand, c1, o);
            ctx.ScoreCandidates(pq, pd, off, cand, c2, o);
            ExpectSameFloats(c1, c2, "candidates");
            const TopKResult t1 = ctx.TopK(cq, nq, cd, 5, o);
            const TopKResult t2 = ctx.TopK(pq, nq, pd, 5, o);
            ExpectSameFloats(t1.scores, t2.scores, "top-k");
            EXPECT_EQ(t1.index, t2.index);
          }
        }
        // Pairs: the first nq documents.
        std::vector<uint64_t> first(data.d.offsets.begin(), data.d.offsets.begin() + nq + 1);
        TokenSets head = data.d;
        head.offsets = first;
        const ScatteredSets sh(head);
        std::vector<float> p1(nq), p2(nq);
        ctx.ScorePairs(cq, head.Dense(), p1);
        ctx.ScorePairs(pq, sh.Dense(), p2);
        ExpectSameFloats(p1, p2, "pairs");
      }
    }
  }
}

TEST(SetData, PackingGivesTheSameBytes) {
  for (maxsim_dtype dtype : {MAXSIM_F32, MAXSIM_BF16}) {
    for (bool masked : {false, true}) {
      Data data(81 + dtype, dtype, masked);
      const ScatteredSets sd(data.d, 48);
      Context ctx = CpuContext(2);
      const Packed a = Packed::Pack(ctx, data.d.Dense());
      const Packed b = Packed::Pack(ctx, sd.Dense());
      const maxsim_packed_desc da = a.Describe(), db = b.Describe();
      ASSERT_EQ(da.size, db.size);
      EXPECT_EQ(std::memcmp(da.data, db.data, da.size), 0) << "dtype " << dtype << (masked ? " masked" : "");
      uint64_t size_a = 0, size_b = 0;
      ASSERT_EQ(maxsim_pack_size(data.d.Dense().get(), 0, &size_a), MAXSIM_OK);
      ASSERT_EQ(maxsim_pack_size(sd.Dense().get(), 0, &size_b), MAXSIM_OK);
      EXPECT_EQ(size_a, size_b);
    }
  }
}

TEST(SetData, BackwardGivesTheSameGradients) {
  Data data(91, MAXSIM_F32, false);
  const uint64_t nq = data.q.n_sets(), nd = data.d.n_sets();
  const ScatteredSets sq(data.q), sd(data.d, 64);
  for (int threads : {1, 2}) {
    Context ctx = CpuContext(threads);
    std::vector<int32_t> argmax(nd * data.q.rows());
    ctx.ScoreMatrix(data.q.Dense(), nq, data.d.Dense(), nd, {}, argmax.data());
    std::vector<float> grad(nq * nd);
    for (size_t i = 0; i < grad.size(); ++i) grad[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
    auto run = [&](const DenseSets& q, const DenseSets& d, std::vector<float>* gq, std::vector<float>* gd) {
      gq->assign(data.q.rows() * data.q.dim, -1.0f);
      gd->assign(data.d.rows() * data.d.dim, -1.0f);
      maxsim_backward_args a;
      maxsim_backward_args_init(&a);
      a.argmax = argmax.data();
      a.grad_scores = grad.data();
      a.grad_queries = gq->data();
      a.grad_documents = gd->data();
      a.deterministic = 1;
      ctx.Backward(q, d, a);
    };
    std::vector<float> gq1, gd1, gq2, gd2;
    run(data.q.Dense(), data.d.Dense(), &gq1, &gd1);
    run(sq.Dense(), sd.Dense(), &gq2, &gd2);
    ExpectSameFloats(gq1, gq2, "grad queries");
    ExpectSameFloats(gd1, gd2, "grad documents");
  }
}

// Status and message of one score_matrix call of `q` against itself.
maxsim_status Score(Context& ctx, const maxsim_dense_sets& q, maxsim_mode mode = MAXSIM_MODE_EXACT) {
  const maxsim_sets s{nullptr, &q};
  maxsim_score_options o;
  maxsim_score_options_init(&o);
  o.mode = mode;
  std::vector<float> out(q.n_sets * q.n_sets);
  return maxsim_score_matrix(ctx.get(), &s, &s, &o, out.data(), nullptr);
}

void ExpectError(maxsim_status got, maxsim_status want, const std::string& part) {
  EXPECT_EQ(got, want) << maxsim_last_error();
  EXPECT_NE(std::string(maxsim_last_error()).find(part), std::string::npos) << maxsim_last_error();
}

TEST(SetData, BadPointersMixedLayoutsAndDeviceMemoryAreRefused) {
  Data data(101, MAXSIM_F32, false);
  const ScatteredSets sd(data.d);
  Context ctx = CpuContext(2);
  const maxsim_dense_sets good = *sd.Dense().get();
  ASSERT_EQ(Score(ctx, good), MAXSIM_OK) << maxsim_last_error();
  uint64_t full = 0;
  while (data.d.length(full) == 0) ++full;
  std::vector<const void*> ptrs(sd.pointers(), sd.pointers() + data.d.n_sets());
  maxsim_dense_sets bad = good;
  bad.set_data = ptrs.data();

  ptrs[full] = nullptr;  // a set with rows and no pointer
  ExpectError(Score(ctx, bad), MAXSIM_ERR_INVALID_ARGUMENT,
              "set_data[" + std::to_string(full) + "] is NULL but set " + std::to_string(full) + " has");
  uint64_t size = 0;
  ExpectError(maxsim_pack_size(&bad, 0, &size), MAXSIM_ERR_INVALID_ARGUMENT, "is NULL");
  ptrs[full] = static_cast<const uint8_t*>(sd.pointers()[full]) + 2;  // not on a 4-byte f32 boundary
  ExpectError(Score(ctx, bad), MAXSIM_ERR_INVALID_ARGUMENT, "is not aligned to its 4-byte elements");
  ptrs[full] = reinterpret_cast<const void*>(std::numeric_limits<uintptr_t>::max() - 63);  // rows wrap around
  ExpectError(Score(ctx, bad), MAXSIM_ERR_INVALID_ARGUMENT, "do not fit in memory");
  ptrs[full] = sd.pointers()[full];
  ASSERT_EQ(Score(ctx, bad), MAXSIM_OK) << maxsim_last_error();

  bad.data = data.d.encoded.data();  // both layouts at once
  ExpectError(Score(ctx, bad), MAXSIM_ERR_INVALID_ARGUMENT, "both data and set_data are set");
  bad.data = nullptr;
  bad.memory = MAXSIM_MEMORY_CUDA;
  ExpectError(Score(ctx, bad), MAXSIM_ERR_UNSUPPORTED, "host memory only");
  bad.memory = MAXSIM_MEMORY_HOST;

  // An empty set's pointer may be NULL (ScatteredSets gives every empty set NULL).
  bool has_empty = false;
  for (uint64_t i = 0; i < data.d.n_sets(); ++i) has_empty |= data.d.length(i) == 0 && ptrs[i] == nullptr;
  EXPECT_TRUE(has_empty) << "the data should hold an empty set";
}

TEST(SetData, ANonFiniteValueIsNamedByItsSetAndToken) {
  Data data(111, MAXSIM_F32, false);
  uint64_t set = data.d.n_sets() - 1;
  while (data.d.length(set) < 3) --set;
  data.d.values[(data.d.offsets[set] + 2) * data.d.dim + 5] = std::numeric_limits<float>::quiet_NaN();
  data.d.Encode(MAXSIM_F32);
  const ScatteredSets sd(data.d);
  const std::string where = "set " + std::to_string(set) + " token 2 has a non-finite value at element 5";
  for (int threads : {1, 2}) {
    Context ctx = CpuContext(threads);
    for (maxsim_mode mode : {MAXSIM_MODE_EXACT, MAXSIM_MODE_CERTIFIED}) {
      ExpectError(Score(ctx, *sd.Dense().get(), mode), MAXSIM_ERR_NON_FINITE, where);
    }
    maxsim_packed* p = nullptr;
    ExpectError(maxsim_pack(ctx.get(), sd.Dense().get(), nullptr, &p), MAXSIM_ERR_NON_FINITE, where);
    EXPECT_EQ(p, nullptr);
  }
}

TEST(SetData, AStructOfTheOlderSizeIsReadWithoutTheMember) {
  Data data(121, MAXSIM_F32, false);
  Context ctx = CpuContext(1);
  maxsim_dense_sets old = *data.d.Dense().get();
  old.struct_size = offsetof(maxsim_dense_sets, set_data);  // what a caller built against the older maxsim.h passes
  old.set_data = reinterpret_cast<const void* const*>(uintptr_t{0xDEAD0});  // beyond its struct: never read
  const uint64_t nd = data.d.n_sets();
  std::vector<float> a(nd * nd), b(nd * nd);
  const DenseSets current = data.d.Dense();
  const maxsim_sets s_old{nullptr, &old}, s_new{nullptr, current.get()};
  maxsim_score_options o;
  maxsim_score_options_init(&o);
  ASSERT_EQ(maxsim_score_matrix(ctx.get(), &s_old, &s_old, &o, a.data(), nullptr), MAXSIM_OK) << maxsim_last_error();
  ASSERT_EQ(maxsim_score_matrix(ctx.get(), &s_new, &s_new, &o, b.data(), nullptr), MAXSIM_OK);
  ExpectSameFloats(a, b, "older struct size");
}

}  // namespace
}  // namespace maxsim::test
