// SPDX-License-Identifier: Apache-2.0
// The CUDA plugin's kernel-choice rules, as host functions (no GPU needed: these are plain C++ over launch
// arguments). The GPU suite checks that every kernel gives the same bits; this checks that each call goes to the
// kernel the measurements chose, so a change to a rule's numbers fails here before it reaches a benchmark.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels.h"
#include "ordered_sum.h"

namespace {

using mscuda::CoopChosen;
using mscuda::CoopFitsDocuments;
using mscuda::DealtChosen;
using mscuda::ForwardArgs;
using mscuda::PipeFitsSharedMemory;
using mscuda::ScreenPipeApplies;

constexpr int kH100Sms = 132;
// cudaDevAttrMaxSharedMemoryPerBlockOptin: what a block may opt into.
constexpr int kH100Smem = 227 * 1024, kA100Smem = 163 * 1024;

// One 32-row query against nd documents of `rows` tokens each (the matrix layout of a one-query call).
ForwardArgs OneQuery(uint64_t nd, uint64_t rows, uint32_t dim = 128) {
  ForwardArgs a;
  a.q.dim = a.d.dim = dim;
  a.q.set_length = 32;
  a.q.n_sets = 1;
  a.d.set_length = rows;
  a.d.n_sets = nd;
  a.pairs.layout = mscuda::kPairsMatrix;
  a.pairs.n_pairs = nd;
  a.pairs.nd = nd;
  return a;
}

TEST(CudaKernelRules, GridTakesDocumentsWhoseStepsSplitEvenlyOverItsWarps) {
  // benchmarks/results/gpu-coop-rule-h100.md: the grid was faster at these mean lengths (224-511 tokens where its
  // four warps carry tokens for 4/5 or more of the busiest warp's steps, and from 512 on) ...
  for (uint64_t rows : {224, 240, 256, 320, 352, 384, 416, 448, 480, 512, 576, 640, 768, 1030, 5000}) {
    EXPECT_TRUE(CoopFitsDocuments(rows)) << rows << " tokens";
  }
  // ... and the ring (or the two within 1%) at these: textual-1k's 300 tokens among them (share 0.78), and 128 and
  // 208, where the share alone would say grid (so would 209-223: the rule starts at 224, kCoopMinEvenRows).
  for (uint64_t rows : {0, 1, 32, 128, 192, 200, 208, 209, 223, 272, 288, 296, 300, 304, 400}) {
    EXPECT_FALSE(CoopFitsDocuments(rows)) << rows << " tokens";
  }
}

TEST(CudaKernelRules, GridForOneQueryCallsByDocumentLength) {
  EXPECT_FALSE(CoopChosen(OneQuery(1000, 300), kH100Sms)) << "textual-1k keeps the ring";
  EXPECT_TRUE(CoopChosen(OneQuery(1000, 1030), kH100Sms)) << "colpali-rerank runs the grid";
  EXPECT_TRUE(CoopChosen(OneQuery(1000, 256), kH100Sms));
  // Below dim 128 the ring was faster everywhere measured (dim 64: 10-29%, dim 96: 1-2%).
  EXPECT_FALSE(CoopChosen(OneQuery(1000, 1030, 64), kH100Sms));
  EXPECT_FALSE(CoopChosen(OneQuery(1000, 1030, 96), kH100Sms));
  // Ragged documents: the mean length decides (offsets given, n_rows the rows of all sets).
  ForwardArgs ragged = OneQuery(1000, 0);
  static const uint64_t offsets[2] = {0, 0};
  ragged.d.offsets = offsets;
  ragged.d.n_rows = 1000 * 1030;
  EXPECT_TRUE(CoopChosen(ragged, kH100Sms));
  ragged.d.n_rows = 0;  // where the host does not know the rows, the ring
  EXPECT_FALSE(CoopChosen(ragged, kH100Sms));
}

TEST(CudaKernelRules, GridFromFortyEightPairsPerSm) {
  // textual-10k's many pairs: 48 per SM or more run the grid whatever the documents' length.
  ForwardArgs a = OneQuery(48 * kH100Sms, 300);
  EXPECT_TRUE(CoopChosen(a, kH100Sms));
  a = OneQuery(48 * kH100Sms - 1, 300);
  EXPECT_FALSE(CoopChosen(a, kH100Sms));
  EXPECT_TRUE(CoopChosen(OneQuery(10000, 300), kH100Sms)) << "textual-10k";
  EXPECT_FALSE(CoopChosen(OneQuery(10000, 300), 2 * kH100Sms)) << "on twice the SMs, 38 pairs per SM";
}

TEST(CudaKernelRules, DocumentsScoredMoreThanOnceKeepTheRing) {
  // Several queries over the same documents (the training forward's kind) or candidate lists reuse documents
  // from L2, which the ring keeps; the pairs layout scores each document once.
  ForwardArgs matrix = OneQuery(1000, 1030);
  matrix.q.n_sets = 2;
  matrix.pairs.n_pairs = 2000;
  EXPECT_FALSE(CoopChosen(matrix, kH100Sms));
  ForwardArgs list = OneQuery(1000, 1030);
  list.pairs.layout = mscuda::kPairsList;
  EXPECT_FALSE(CoopChosen(list, kH100Sms));
  ForwardArgs diagonal = OneQuery(1000, 1030);
  diagonal.pairs.layout = mscuda::kPairsDiagonal;
  EXPECT_TRUE(CoopChosen(diagonal, kH100Sms));
}

TEST(CudaKernelRules, SwitchesOverrideTheRule) {
  ForwardArgs a = OneQuery(1000, 1030);
  a.sw.coop = false;  // MAXSIM_CUDA_NO_COOP
  EXPECT_FALSE(CoopChosen(a, kH100Sms));
  ForwardArgs b = OneQuery(1000, 300, 64);
  b.sw.coop_always = true;  // MAXSIM_CUDA_EXPERIMENTAL=coop-always
  EXPECT_TRUE(CoopChosen(b, kH100Sms));
  b.sw.coop = false;  // NO_COOP wins
  EXPECT_FALSE(CoopChosen(b, kH100Sms));
  ForwardArgs huge = OneQuery(1ull << 31, 1030);
  huge.sw.coop_always = true;  // a grid has at most 2^31 - 1 blocks
  EXPECT_FALSE(CoopChosen(huge, kH100Sms));
}

TEST(CudaKernelRules, DealtKernelWhereTheRingHasTooFewDocumentsOrLongOnes) {
  // benchmarks/results/gpu-dealt-h100.md: one query over 100 and 500 documents, which leave the ring too few pairs
  // (under half a pair per warp: 528 on 132 SMs) and went to the one-pair-per-warp kernel, ran 2-6x faster on the
  // dealt kernel, whatever their length.
  for (uint64_t nd : {1, 7, 100, 131, 132, 500, 527}) {
    EXPECT_TRUE(DealtChosen(OneQuery(nd, 300), kH100Sms, kH100Smem)) << nd << " documents";
    EXPECT_TRUE(DealtChosen(OneQuery(nd, 1030), kH100Sms, kH100Smem)) << nd << " long documents";
    EXPECT_TRUE(DealtChosen(OneQuery(nd, 64), kH100Sms, kH100Smem)) << nd << " short documents";
  }
  // Where the ring runs (its third study): documents of 300 tokens were 1-3% faster on the dealt kernel, 288 within
  // 1% either way, 200 the same, 128 and 64 slower; the rule takes 224 tokens on average and more, up to 32
  // documents per SM.
  for (uint64_t nd : {528, 1000, 2500, 4000, 32 * kH100Sms}) {
    for (uint64_t rows : {224, 288, 300, 480}) {
      EXPECT_TRUE(DealtChosen(OneQuery(nd, rows), kH100Sms, kH100Smem)) << nd << " documents of " << rows;
    }
    for (uint64_t rows : {1, 64, 128, 200, 223}) {
      EXPECT_FALSE(DealtChosen(OneQuery(nd, rows), kH100Sms, kH100Smem)) << nd << " documents of " << rows;
    }
  }
  EXPECT_FALSE(DealtChosen(OneQuery(32 * kH100Sms + 1, 300), kH100Sms, kH100Smem));  // DealtDocs' table
  ForwardArgs ragged = OneQuery(1000, 0);  // 300 tokens on average
  ragged.d.offsets = reinterpret_cast<const uint64_t*>(&ragged);  // not read: MeanRows takes n_rows
  ragged.d.n_rows = 300 * 1000;
  EXPECT_TRUE(DealtChosen(ragged, kH100Sms, kH100Smem));
  ragged.d.n_rows = 200 * 1000;
  EXPECT_FALSE(DealtChosen(ragged, kH100Sms, kH100Smem));
  // One query only (the block shares it); not the pairs layout or candidate lists.
  ForwardArgs two = OneQuery(100, 300);
  two.q.n_sets = 2;
  two.pairs.n_pairs = 200;
  EXPECT_FALSE(DealtChosen(two, kH100Sms, kH100Smem));
  ForwardArgs diagonal = OneQuery(100, 300);
  diagonal.pairs.layout = mscuda::kPairsDiagonal;
  EXPECT_FALSE(DealtChosen(diagonal, kH100Sms, kH100Smem));
  // Only what its fold and copies take: dot without a document mask, one group of query rows, dim <= 128.
  ForwardArgs cosine = OneQuery(100, 300);
  cosine.cosine = 1;
  EXPECT_FALSE(DealtChosen(cosine, kH100Sms, kH100Smem));
  ForwardArgs masked = OneQuery(100, 300);
  static const uint8_t mask[1] = {1};
  masked.d.mask = mask;
  EXPECT_FALSE(DealtChosen(masked, kH100Sms, kH100Smem));
  ForwardArgs groups = OneQuery(100, 300);
  groups.part.groups = 2;
  EXPECT_FALSE(DealtChosen(groups, kH100Sms, kH100Smem));
  EXPECT_FALSE(DealtChosen(OneQuery(100, 300, 160), kH100Sms, kH100Smem));
  EXPECT_TRUE(DealtChosen(OneQuery(100, 300, 64), kH100Sms, kH100Smem));
  // Its block: 12 warps x 2 stages x 8 KB and the query's 8 KB, and 26 KB of row maxima and terms.
  EXPECT_FALSE(DealtChosen(OneQuery(100, 300), kH100Sms, kA100Smem));
  EXPECT_TRUE(DealtChosen(OneQuery(100, 300), kH100Sms, 226 * 1024));
  EXPECT_FALSE(DealtChosen(OneQuery(100, 300), kH100Sms, 226 * 1024 - 1));
  EXPECT_FALSE(DealtChosen(OneQuery(100, 300), kH100Sms, 0));  // the device could not be asked
  // Switches: MAXSIM_CUDA_NO_DEALT, MAXSIM_CUDA_NO_PIPE (the dealt kernel is a ring kernel), and
  // MAXSIM_CUDA_EXPERIMENTAL=dealt-always up to 32 documents per SM (the block's table of its documents).
  ForwardArgs off = OneQuery(100, 300);
  off.sw.dealt = false;
  EXPECT_FALSE(DealtChosen(off, kH100Sms, kH100Smem));
  off = OneQuery(100, 300);
  off.sw.pipe = false;
  EXPECT_FALSE(DealtChosen(off, kH100Sms, kH100Smem));
  ForwardArgs always = OneQuery(1000, 64);
  always.sw.dealt_always = true;
  EXPECT_TRUE(DealtChosen(always, kH100Sms, kH100Smem));
  always = OneQuery(32 * kH100Sms, 300);
  always.sw.dealt_always = true;
  EXPECT_TRUE(DealtChosen(always, kH100Sms, kH100Smem));
  always = OneQuery(32 * kH100Sms + 1, 300);
  always.sw.dealt_always = true;
  EXPECT_FALSE(DealtChosen(always, kH100Sms, kH100Smem));
  always = OneQuery(1000, 300);
  always.sw.dealt_always = true;
  always.sw.dealt = false;  // NO_DEALT wins
  EXPECT_FALSE(DealtChosen(always, kH100Sms, kH100Smem));
}

TEST(CudaKernelRules, RingNeedsADeviceThatGivesABlockItsSharedMemory) {
  // The ring's block: 8 warps x 3 stages x 8 KB, 2 KB of row terms, and in a one-query launch the query's 8 KB.
  const ForwardArgs one = OneQuery(1000, 300);
  ForwardArgs two = one;  // two queries of the matrix layout
  two.q.n_sets = 2;
  two.pairs.n_pairs = 2 * two.pairs.nd;
  EXPECT_TRUE(PipeFitsSharedMemory(one, kH100Smem));
  EXPECT_TRUE(PipeFitsSharedMemory(two, kH100Smem));
  EXPECT_FALSE(PipeFitsSharedMemory(one, kA100Smem));  // such calls take the one-pair-per-warp kernel (or the grid)
  EXPECT_FALSE(PipeFitsSharedMemory(two, kA100Smem));
  EXPECT_FALSE(PipeFitsSharedMemory(one, 0));      // the device could not be asked
  // The query's 8 KB is reserved for one-query launches only.
  EXPECT_TRUE(PipeFitsSharedMemory(two, 194 * 1024));
  EXPECT_FALSE(PipeFitsSharedMemory(one, 194 * 1024));
  EXPECT_TRUE(PipeFitsSharedMemory(one, 202 * 1024));
  EXPECT_FALSE(PipeFitsSharedMemory(one, 202 * 1024 - 1));
}

TEST(CudaKernelRules, ScreeningRingNeedsADeviceThatGivesABlockItsSharedMemory) {
  // 8 warps x 4 stages of 32 tokens' codes and metadata, and 8 warps' candidate lists: 122 KB with 64-byte codes,
  // 186 KB with 128-byte codes.
  const mscuda::KernelSwitches sw;
  const uint64_t pairs = 1000;  // enough for the ring on 132 SMs
  EXPECT_TRUE(ScreenPipeApplies(sw, 1, 64, pairs, kH100Sms, kH100Smem));
  EXPECT_TRUE(ScreenPipeApplies(sw, 1, 128, pairs, kH100Sms, kH100Smem));
  EXPECT_TRUE(ScreenPipeApplies(sw, 1, 64, pairs, 108, kA100Smem));
  EXPECT_FALSE(ScreenPipeApplies(sw, 1, 128, pairs, 108, kA100Smem));
  EXPECT_FALSE(ScreenPipeApplies(sw, 1, 128, pairs, kH100Sms, 186 * 1024 - 1));
  EXPECT_TRUE(ScreenPipeApplies(sw, 1, 128, pairs, kH100Sms, 186 * 1024));
  EXPECT_FALSE(ScreenPipeApplies(sw, 1, 64, pairs, kH100Sms, 0));  // the device could not be asked
}

// The chain every score is (kernels.h): terms in token order, in double, from +0.0.
double Chain(const std::vector<float>& t) {
  double s = 0.0;
  for (float v : t) s += static_cast<double>(v);
  return s;
}

// WarpOrderedSumOf's order (device_common.cuh): lane l adds terms l, l + 32, ...; the lanes meet in a butterfly
// tree; then + 0.0.
double WarpOrder(const std::vector<float>& t) {
  double lanes[32];
  for (size_t l = 0; l < 32; ++l) {
    lanes[l] = 0.0;
    for (size_t r = l; r < t.size(); r += 32) lanes[l] += static_cast<double>(t[r]);
  }
  for (int o = 16; o > 0; o >>= 1) {
    double next[32];
    for (int l = 0; l < 32; ++l) next[l] = lanes[l] + lanes[l ^ o];
    std::memcpy(lanes, next, sizeof(lanes));
  }
  return lanes[0] + 0.0;
}

bool SameBits(double a, double b) { return std::memcmp(&a, &b, 8) == 0; }

// The largest field span ordered_sum.h's rule allows for n terms.
int AllowedSpan(uint64_t n) {
  int s = -1;
  while (s < 254 && mscuda::OrderedSumAnyOrder(100 + s + 1, 100, n)) ++s;
  return s;
}

TEST(CudaOrderedSum, TheRuleAllowsSpansThatKeepEverySumExact) {
  // 29 - ceil(log2 n): 24 for the 32 rows of a warp's terms, 22 for a 128-row query.
  EXPECT_EQ(AllowedSpan(1), 29);
  EXPECT_EQ(AllowedSpan(2), 28);
  EXPECT_EQ(AllowedSpan(32), 24);
  EXPECT_EQ(AllowedSpan(33), 23);
  EXPECT_EQ(AllowedSpan(128), 22);
  EXPECT_EQ(AllowedSpan(1024), 19);
  EXPECT_TRUE(mscuda::OrderedSumAnyOrder(0, 255, 32));     // every term zero
  EXPECT_FALSE(mscuda::OrderedSumAnyOrder(255, 100, 32));  // a non-finite term
  EXPECT_EQ(mscuda::OrderedSumField(0.0f), 0u);
  EXPECT_EQ(mscuda::OrderedSumField(-0.0f), 0u);
  EXPECT_EQ(mscuda::OrderedSumField(1.0f), 127u);
  EXPECT_EQ(mscuda::OrderedSumField(1e-45f), 1u);  // subnormal: the ulp of field 1
  EXPECT_EQ(mscuda::OrderedSumField(std::numeric_limits<float>::infinity()), 255u);
  EXPECT_EQ(mscuda::OrderedSumField(std::numeric_limits<float>::quiet_NaN()), 255u);
}

TEST(CudaOrderedSum, TheRulesLimitIsTightForPowersOfTwo) {
  // n - 2 terms of the largest mantissa at field hi, then two of one ulp at field lo: at the rule's span their chain
  // and WarpOrderedSumOf's order give the same bits; one field more and they do not. So a rule loosened by one
  // field would pass a set whose sum depends on the order, and one tightened by one would refuse a set it could
  // take: the limit is the arithmetic's, not only the formula's.
  for (uint64_t n : {32u, 128u, 1024u}) {
    for (int extra : {0, 1}) {
      const int span = AllowedSpan(n) + extra;
      const uint32_t lo = 60, hi = lo + static_cast<uint32_t>(span);
      const uint32_t big_bits = (hi << 23) | 0x7FFFFFu, tiny_bits = (lo << 23) | 1u;
      float big, tiny;
      std::memcpy(&big, &big_bits, 4);
      std::memcpy(&tiny, &tiny_bits, 4);
      std::vector<float> t(n, big);
      t[n - 2] = t[n - 1] = tiny;
      EXPECT_EQ(mscuda::OrderedSumAnyOrder(hi, lo, n), extra == 0) << n << " terms, span " << span;
      EXPECT_EQ(SameBits(WarpOrder(t), Chain(t)), extra == 0) << n << " terms, span " << span;
    }
  }
}

TEST(CudaOrderedSum, AnyOrderGivesTheChainsBitsWhereTheRuleAllows) {
  // 24,000 sets of terms with random signs and mantissas at fields spread over the allowed span or up to two fields
  // less (both ends present unless the set is small), some zeros of either sign, subnormals where the span starts at
  // field 1; counts from 1 to 1024. Wherever the rule allows any order, WarpOrderedSumOf's order and a shuffled one
  // must give the chain's bits. 6,000 more span 40-99 fields: the rule refuses them, and their orders must be seen to
  // differ now and then, or the comparison could not tell a wrong rule.
  std::mt19937_64 rng(20261128);
  const uint64_t counts[] = {1, 2, 3, 7, 31, 32, 33, 64, 65, 100, 128, 129, 300, 1024};
  uint64_t allowed = 0, differed_outside = 0;
  for (int trial = 0; trial < 30000; ++trial) {
    const uint64_t n = counts[rng() % (sizeof(counts) / sizeof(counts[0]))];
    const bool outside = trial % 5 == 4;
    const int limit = AllowedSpan(n);
    const int span = outside ? 40 + static_cast<int>(rng() % 60) : limit - static_cast<int>(rng() % 3);
    const uint32_t lo = rng() % 4 == 0 ? 1u : 1u + static_cast<uint32_t>(rng() % (254 - span));
    std::vector<float> t(n);
    uint32_t hi_seen = 0, lo_seen = 255;
    for (uint64_t i = 0; i < n; ++i) {
      const uint32_t pick = static_cast<uint32_t>(rng() % 8);
      uint32_t bits;
      if (pick == 0) {
        bits = static_cast<uint32_t>(rng() & 1) << 31;  // +-0
      } else {
        const uint32_t field = pick == 1 ? lo : pick == 2 ? lo + span : lo + static_cast<uint32_t>(rng() % (span + 1));
        bits = (static_cast<uint32_t>(rng() & 1) << 31) | (field << 23) | static_cast<uint32_t>(rng() & 0x7FFFFF);
        if (field == 1 && rng() % 3 == 0) bits &= 0x807FFFFFu;  // subnormal
      }
      std::memcpy(&t[i], &bits, 4);
      const uint32_t e = mscuda::OrderedSumField(t[i]);
      if (e != 0) {
        hi_seen = std::max(hi_seen, e);
        lo_seen = std::min(lo_seen, e);
      }
    }
    const double chain = Chain(t);
    std::vector<float> shuffled = t;
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    const double warp = WarpOrder(t), any = Chain(shuffled) + 0.0;
    const bool all_zero = hi_seen == 0;
    const int seen = all_zero ? 0 : static_cast<int>(hi_seen) - static_cast<int>(lo_seen);
    ASSERT_EQ(mscuda::OrderedSumAnyOrder(hi_seen, lo_seen, n), all_zero || seen <= limit)
        << n << " terms, fields " << lo_seen << ".." << hi_seen;
    if (all_zero || seen <= limit) {
      ++allowed;
      ASSERT_TRUE(SameBits(warp, chain)) << n << " terms, fields " << lo_seen << ".." << hi_seen << ": warp order "
                                         << warp << " vs chain " << chain;
      ASSERT_TRUE(SameBits(any, chain)) << n << " terms, fields " << lo_seen << ".." << hi_seen << ": shuffled "
                                        << any << " vs chain " << chain;
    } else if (seen >= 40) {
      differed_outside += !SameBits(warp, chain) || !SameBits(any, chain);
    }
  }
  EXPECT_GT(allowed, 20000u);
  EXPECT_GT(differed_outside, 100u) << "orders that the rule refuses should give other bits now and then";
}

}  // namespace
