// SPDX-License-Identifier: Apache-2.0
// Tests for the x86 SIMD kernels (lib/src/kernels/x86/) beyond the generic kernel suite (kernel_test.cc):
// cross-kernel bit identity on 16-bit inputs and on every tile/remainder shape, identical candidate sets
// (counters) and approximate choices across kernels, the vdpbf16ps path (taken where it applies, identical to
// the FMA path, including where its guard must refuse), and certified == exact at extreme scales.
// Kernels this CPU cannot run are skipped with the registry's reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu_features.h"
#include "half.h"
#include "kernel_agree.h"
#include "kernels/kernel.h"
#include "kernels/x86/x86_kernels.h"
#include "maxsim/maxsim.hpp"
#include "test_util.h"

namespace maxsim::test {
namespace {

// The bf16 dot variants differ only in the exact path on bf16 documents (vdpbf16ps); elsewhere a "/vdpbf16ps"
// config runs the same code as "/fma", so the long tile-shape sweeps skip it there.
bool RepeatsFma(const std::string& config, maxsim_mode mode, maxsim_dtype dtype) {
  return config.find("/vdpbf16ps") != std::string::npos && (mode != MAXSIM_MODE_EXACT || dtype != MAXSIM_BF16);
}

bool Has(const std::string& name) {
  for (const std::string& n : KernelConfigs(true)) {
    if (n.substr(0, n.find('/')) == name) return true;
  }
  return false;
}

// Every kernel and every variant of it against scalar (ExpectEveryKernelMatchesScalar), except a bf16 dot
// variant where it runs the same code as the fma one.
void ExpectEveryConfigMatchesScalar(const TokenSets& q, const TokenSets& d, const std::string& label,
                                    bool dense_certified) {
  AgreeOptions o;
  o.variants = true;
  o.dense_certified = dense_certified;
  o.repeats = RepeatsFma;
  ExpectEveryKernelMatchesScalar(q, d, label, o);
}

// Every kernel and variant against the scalar kernel, every mode, on the x86 tile shapes, in f32, bf16 and f16
// (the ISA-neutral KernelsAgree test covers the vector remainders of every ISA and near ties, in f32).
TEST(X86Kernels, EveryKernelMatchesScalarBitForBitOnEveryTileShape) {
  std::mt19937_64 rng(31337);
  // Query lengths around the 8/16/32-lane groups, document lengths around the 1/2/4/6/8/12/16/32-row tiles.
  const std::vector<uint64_t> lq_lengths = {1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 48, 49, 64, 65, 100};
  for (uint32_t dim : {5u, 48u, 64u, 96u, 128u, 130u, 256u}) {
    for (maxsim_dtype dtype : {MAXSIM_F32, MAXSIM_BF16, MAXSIM_F16}) {
      const TokenSets q = QueriesOfLengths(rng, lq_lengths, dim, dtype);
      TokenSets d = Generate(rng, Shape::kClustered, 24, 0, 70, dim);
      d.Encode(dtype);
      ExpectEveryConfigMatchesScalar(q, d, "dim " + std::to_string(dim) + " dtype " + std::to_string(dtype), true);
    }
  }
}

// Queries of 128 tokens and more: their transposed layouts (qt, the i8 interleaved layout, the bf16 pairs) use a
// padded row stride (LaneStride) so that a block's rows do not share one L1 set; every kernel must still equal
// the scalar kernel bit for bit, candidate sets included.
TEST(X86Kernels, LongQueriesWithPaddedLayoutsMatchScalarBitForBit) {
  std::mt19937_64 rng(4242);
  EXPECT_EQ(LaneStride(16), 16u);
  EXPECT_EQ(LaneStride(112), 112u);
  EXPECT_EQ(LaneStride(128), 144u);  // 8 lines -> 9
  EXPECT_EQ(LaneStride(144), 144u);  // already odd
  EXPECT_EQ(LaneStride(1024), 1040u);
  const std::vector<uint64_t> lq_lengths = {113, 128, 129, 200, 1024};
  for (uint32_t dim : {64u, 128u, 130u}) {
    for (maxsim_dtype dtype : {MAXSIM_F32, MAXSIM_BF16}) {
      const TokenSets q = QueriesOfLengths(rng, lq_lengths, dim, dtype);
      TokenSets d = Generate(rng, Shape::kClustered, 6, 0, 40, dim);
      d.Encode(dtype);
      ExpectEveryConfigMatchesScalar(q, d, "dim " + std::to_string(dim) + " dtype " + std::to_string(dtype), false);
    }
  }
}

// The amx kernel's fused i8 phase (survivors against a running threshold) falls back to storing every key when
// a lane's final threshold is not finite; with validated inputs that does not happen, so the test forces the
// fallback on every block and expects the same bits as scalar, and (unforced) as the fused path itself.
TEST(X86Kernels, AmxFusedScreeningAndItsFallbackMatchScalar) {
  if (!Has("amx")) GTEST_SKIP() << "kernel amx unavailable here";
  struct ForceFallback {
    ForceFallback() { ForceFusedFallbackForTest(true); }
    ~ForceFallback() { ForceFusedFallbackForTest(false); }
  };
  std::mt19937_64 rng(777);
  for (uint32_t dim : {64u, 128u, 200u}) {
    TokenSets q = Generate(rng, Shape::kClustered, 5, 1, 80, dim);
    TokenSets d = Generate(rng, Shape::kClustered, 9, 0, 150, dim);
    for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
      for (maxsim_mode mode : {MAXSIM_MODE_CERTIFIED, MAXSIM_MODE_APPROXIMATE}) {
        Context ref_ctx = KernelContext("scalar", 1);
        const Outcome ref = ScoreMatrixWith(ref_ctx, q, d, metric, mode);
        Context ctx = KernelContext("amx", 2);
        const std::string what = "dim " + std::to_string(dim) + " metric " + std::to_string(metric) + " mode " +
                                 std::to_string(mode);
        const Outcome fused = ScoreMatrixWith(ctx, q, d, metric, mode);
        ExpectIdentical(ref, fused, what + " (fused)");
        ExpectSameCandidateSets(ref, fused, what + " (fused)", Evaluations(q, d));
        ForceFallback force;
        const Outcome fallback = ScoreMatrixWith(ctx, q, d, metric, mode);
        ExpectIdentical(ref, fallback, what + " (fallback)");
        ExpectSameCandidateSets(ref, fallback, what + " (fallback)", Evaluations(q, d));
      }
    }
  }
}

// Many queries against the same documents (the engine reuses per-document work across queries: widened rows,
// re-laid-out bf16 rows): results must not depend on which query came first.
TEST(X86Kernels, PerDocumentCachesDoNotLeakAcrossQueriesOrDocuments) {
  std::mt19937_64 rng(99);
  TokenSets q = Generate(rng, Shape::kUnitGaussian, 9, 1, 40, 64);
  TokenSets d = Generate(rng, Shape::kUnitGaussian, 30, 1, 50, 64);
  // Every third query has a value that is not a bf16 number: the bf16 path must refuse it, the next query
  // must take it again.
  for (maxsim_dtype dtype : {MAXSIM_BF16, MAXSIM_F16}) {
    TokenSets qq = q, dd = d;
    qq.Encode(dtype);
    dd.Encode(dtype);
    TokenSets qf = qq;  // the same values as f32, with a few perturbed off the bf16 grid
    qf.Encode(MAXSIM_F32);
    for (uint64_t i = 0; i < qf.n_sets(); i += 3) qf.values[qf.offsets[i] * qf.dim] += 1e-6f;
    qf.Encode(MAXSIM_F32);
    for (const std::string& k : KernelConfigs(true)) {
      Context ctx = KernelContext(k, 1);
      Context ref_ctx = KernelContext("scalar", 1);
      for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
        for (const TokenSets* qs : {&qq, &qf}) {
          const Outcome all = ScoreMatrixWith(ctx, *qs, dd, metric, MAXSIM_MODE_EXACT);
          ExpectIdentical(ScoreMatrixWith(ref_ctx, *qs, dd, metric, MAXSIM_MODE_EXACT), all, k + " batched");
        }
      }
    }
  }
}

// Top-k with certified / approximate screening prunes documents by their certified upper bound (the x86
// kernels' batched entry): the pruning must actually happen, and the top-k must be exactly the exact top-k
// (certified) or the approximate matrix's own ranking (approximate), whatever the thread count, on random,
// clustered and real data.
void ExpectTopKEqual(const TopKResult& a, const TopKResult& b, const std::string& what) {
  ASSERT_EQ(a.index, b.index) << what;
  ASSERT_EQ(std::memcmp(a.scores.data(), b.scores.data(), a.scores.size() * 4), 0) << what;
}

TopKResult RankMatrix(const std::vector<float>& m, uint64_t nq, uint64_t nd, uint64_t k) {
  TopKResult r;
  r.k = k;
  for (uint64_t i = 0; i < nq; ++i) {
    const std::vector<uint64_t> order = RankDescending(m.data() + i * nd, nd);
    for (uint64_t r2 = 0; r2 < k; ++r2) {
      r.index.push_back(r2 < nd ? order[r2] : UINT64_MAX);
      r.scores.push_back(r2 < nd ? m[i * nd + order[r2]] : -std::numeric_limits<float>::infinity());
    }
  }
  return r;
}

void CheckPruning(const TokenSets& q, const TokenSets& d, const std::string& data, bool expect_pruning) {
  const uint64_t nq = q.n_sets(), nd = d.n_sets();
  for (const std::string& k : KernelConfigs(true)) {
    if (k == "scalar" || k == "autovec-avx2") continue;  // no batched entry: no pruning
    for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
      uint64_t pruned_total = 0;
      for (int threads : {1, 2}) {
        Context ctx = KernelContext(k, threads);
        Packed pd = Packed::Pack(ctx, d.Dense());
        for (uint64_t topk : {uint64_t{1}, uint64_t{5}, nd + 2}) {
          const std::string what = data + " " + k + " metric " + std::to_string(metric) + " threads " +
                                   std::to_string(threads) + " k " + std::to_string(topk);
          maxsim_stats se{}, sc{}, sa{};
          const TopKResult exact = ctx.TopK(q.Dense(), nq, pd, topk, {metric, MAXSIM_MODE_EXACT, &se});
          const TopKResult cert = ctx.TopK(q.Dense(), nq, pd, topk, {metric, MAXSIM_MODE_CERTIFIED, &sc});
          const TopKResult appr = ctx.TopK(q.Dense(), nq, pd, topk, {metric, MAXSIM_MODE_APPROXIMATE, &sa});
          ExpectTopKEqual(exact, cert, what + " certified vs exact");
          const std::vector<float> am = ctx.ScoreMatrix(q.Dense(), nq, pd, nd, {metric, MAXSIM_MODE_APPROXIMATE});
          ExpectTopKEqual(RankMatrix(am, nq, nd, topk), appr, what + " approximate vs its matrix");
          EXPECT_EQ(se.docs_pruned, 0u) << what;
          EXPECT_EQ(sc.pairs, nq * nd) << what;
          if (topk >= nd) {
            EXPECT_EQ(sc.docs_pruned, 0u) << what << ": every document is in the top-k";
          }
          if (topk <= 5) pruned_total += sc.docs_pruned + sa.docs_pruned;
          if (topk == 5 && threads == 1) {
            std::printf("[ pruning  ] %s %s %s top-5: certified pruned %llu of %llu (query, document) pairs, "
                        "approximate %llu\n", data.c_str(), k.c_str(), metric == MAXSIM_METRIC_DOT ? "dot" : "cosine",
                        static_cast<unsigned long long>(sc.docs_pruned), static_cast<unsigned long long>(nq * nd),
                        static_cast<unsigned long long>(sa.docs_pruned));
          }
        }
      }
      if (expect_pruning) {
        EXPECT_GT(pruned_total, 0u) << data << " " << k << " metric " << metric << ": nothing was pruned";
      }
    }
  }
}

TEST(X86Kernels, TopKPrunesByTheCertifiedBoundAndEqualsExactTopK) {
  std::mt19937_64 rng(4242);
  for (Shape shape : {Shape::kUnitGaussian, Shape::kClustered}) {
    const TokenSets q = Generate(rng, shape, 3, 20, 40, 64);
    const TokenSets d = Generate(rng, shape, 300, 10, 60, 64);
    CheckPruning(q, d, ShapeName(shape), true);
  }
  // Near-ties built around the queries: bounds overlap, little or nothing can be pruned; still exact.
  const TokenSets q = Generate(rng, Shape::kUnitGaussian, 2, 16, 16, 48);
  CheckPruning(q, NearTieDocuments(rng, q, 60, 30, 1e-3), "near ties", false);
}

TEST(X86Kernels, TopKPruningOnRealEmbeddings) {
  TokenSets q, d;
  std::vector<std::string> qids, dids;
  std::string error;
  if (!LoadNanoFiqa(&q, &d, &qids, &dids, &error)) GTEST_SKIP() << "real embeddings unavailable: " << error;
  CheckPruning(q, d, "nanofiqa", true);
}

// Build a PreparedQuery/DocRef pair by hand to call the vdpbf16ps path directly.
struct Direct {
  std::vector<float> rows, qt;
  std::vector<maxsim_vector_meta> qmeta, dmeta;
  std::vector<uint16_t> doc;  // bf16, rows padded to 64 bytes
  std::vector<uint8_t> layout_storage;
  PreparedQuery q;
  DocRef d;
  Direct(const std::vector<float>& qv, uint32_t lq, const std::vector<float>& dv, uint32_t ld, uint32_t dim,
         int variant = x86::kBf16DotVdpbf16ps) {
    q.variant = variant;
    q.n_tokens = lq;
    q.n_padded = (lq + 15) / 16 * 16;
    q.lane_stride = LaneStride(q.n_padded);
    q.dim = dim;
    q.padded_dim = (dim + 63) / 64 * 64;
    rows = qv;
    qt.assign(static_cast<size_t>(q.lane_stride) * dim, 0.0f);
    for (uint32_t s = 0; s < lq; ++s) {
      for (uint32_t k = 0; k < dim; ++k) qt[static_cast<size_t>(k) * q.lane_stride + s] = qv[s * dim + k];
    }
    q.rows = rows.data();
    q.qt = qt.data();
    qmeta.assign(lq, maxsim_vector_meta{0, 1, 0, 0});
    q.meta = qmeta.data();
    const uint32_t row_elems = (dim * 2 + 63) / 64 * 32;
    doc.assign(static_cast<size_t>(ld) * row_elems, 0);
    for (uint32_t t = 0; t < ld; ++t) {
      for (uint32_t k = 0; k < dim; ++k) doc[t * row_elems + k] = F32ToBf16(dv[t * dim + k]);
    }
    dmeta.assign(ld, maxsim_vector_meta{0, 1, 0, 0});
    d.n_tokens = ld;
    d.dim = dim;
    d.dtype = MAXSIM_BF16;
    d.originals = reinterpret_cast<const uint8_t*>(doc.data());
    d.orig_row_bytes = row_elems * 2;
    d.meta = dmeta.data();
    layout_storage.assign(x86::Bf16LayoutBytes(q) + 64, 0);
    uint8_t* base = layout_storage.data();
    base += (64 - reinterpret_cast<uintptr_t>(base) % 64) % 64;
    x86::Bf16Prepare(q, base);
    q.layout = base;
  }
};

std::vector<float> Bf16Values(std::mt19937_64& rng, size_t n, int emin, int emax) {
  std::uniform_int_distribution<int> e(emin, emax), m(0, 127), s(0, 1);
  std::vector<float> v(n);
  for (float& x : v) {
    const uint32_t bits = (static_cast<uint32_t>(s(rng)) << 31) | (static_cast<uint32_t>(127 + e(rng)) << 23) |
                          (static_cast<uint32_t>(m(rng)) << 16);
    std::memcpy(&x, &bits, 4);
  }
  return v;
}

TEST(X86Kernels, VdpBf16PathIsTakenWhereItAppliesAndEqualsTheCanonicalChain) {
  if (!Has("avx512-bf16")) GTEST_SKIP() << "kernel avx512-bf16 unavailable here";
  std::printf("vdpbf16ps self-test on this CPU: %s\n", x86::Bf16DpSelfTest().c_str());
  std::mt19937_64 rng(5);
  const uint32_t dim = 128, lq = 33, ld = 77;
  for (int trial = 0; trial < 4; ++trial) {
    // Exponents from 2^-40 to 2^3: every partial sum stays far from the denormals, so the path must apply.
    Direct x(Bf16Values(rng, lq * dim, -40, 3), lq, Bf16Values(rng, ld * dim, -40, 3), ld, dim);
    std::vector<float> key(lq), key_ref(lq);
    std::vector<int32_t> arg(lq), arg_ref(lq);
    KernelScratch scratch, scratch_ref;
    const bool taken = x86::ExactBf16Dp(x.q, x.d, MAXSIM_METRIC_DOT, key.data(), arg.data(), scratch);
    if (!x86::kBf16DotVariants.runs(x86::kBf16DotVdpbf16ps, nullptr)) {  // the self-test found no canonical order
      EXPECT_FALSE(taken);
      continue;
    }
    ASSERT_TRUE(taken) << "the vdpbf16ps path refused a pair inside its guard";
    ExactWithHwy(*HwyTargetOps(HWY_AVX3), x.q, x.d, MAXSIM_METRIC_DOT, key_ref.data(), arg_ref.data(),
                      scratch_ref);
    for (uint32_t s = 0; s < lq; ++s) {
      ASSERT_EQ(std::memcmp(&key[s], &key_ref[s], 4), 0) << "token " << s << ": " << key[s] << " vs " << key_ref[s];
      ASSERT_EQ(arg[s], arg_ref[s]) << "token " << s;
    }
  }
  // Outside the guard (products reach the denormal range): the path must refuse.
  Direct tiny(Bf16Values(rng, lq * dim, -70, -50), lq, Bf16Values(rng, ld * dim, -70, -50), ld, dim);
  std::vector<float> key(lq);
  std::vector<int32_t> arg(lq);
  KernelScratch scratch;
  EXPECT_FALSE(x86::ExactBf16Dp(tiny.q, tiny.d, MAXSIM_METRIC_DOT, key.data(), arg.data(), scratch));
  // A query that is not exactly bf16: refused too.
  std::vector<float> qv = Bf16Values(rng, lq * dim, -10, 0);
  qv[5] = std::nextafter(qv[5], 10.0f);
  Direct off(qv, lq, Bf16Values(rng, ld * dim, -10, 0), ld, dim);
  EXPECT_FALSE(x86::ExactBf16Dp(off.q, off.d, MAXSIM_METRIC_DOT, key.data(), arg.data(), scratch));
  // The fma variant never takes it, even inside the guard.
  Direct fma(Bf16Values(rng, lq * dim, -10, 0), lq, Bf16Values(rng, ld * dim, -10, 0), ld, dim, x86::kBf16DotFma);
  EXPECT_FALSE(x86::ExactBf16Dp(fma.q, fma.d, MAXSIM_METRIC_DOT, key.data(), arg.data(), scratch));
}

// MAXSIM_BF16_DOT: the context reports the variant it chose and why (the rate check's figures, or "forced"),
// takes a forced one, and refuses an unknown name with a message naming the known ones.
TEST(X86Kernels, Bf16DotVariantIsReportedAndForceable) {
  for (const char* kernel : {"avx512-bf16", "amx"}) {
    if (!Has(kernel)) continue;
    maxsim_options o;
    maxsim_options_init(&o);
    o.isa = kernel;
    o.load_plugins = 0;
    auto report = [&](const char* env) {
      if (env) setenv("MAXSIM_BF16_DOT", env, 1);
      maxsim_context* ctx = nullptr;
      const maxsim_status st = maxsim_context_create(&o, &ctx);
      unsetenv("MAXSIM_BF16_DOT");
      if (st != MAXSIM_OK) return std::string("error: ") + maxsim_last_error();
      char text[8192];
      size_t needed = 0;
      EXPECT_EQ(maxsim_context_report(ctx, text, sizeof(text), &needed), MAXSIM_OK);
      maxsim_context_destroy(ctx);
      return std::string(text);
    };
    const std::string chosen = report(nullptr);
    EXPECT_NE(chosen.find("exact bf16 dot products: "), std::string::npos) << chosen;
    EXPECT_NE(chosen.find("chosen by speed"), std::string::npos) << chosen;
    EXPECT_NE(chosen.find("vdpbf16ps needs 1.2x; self-test: vdpbf16ps consumes"), std::string::npos) << chosen;
    const std::string fma = report("fma");
    EXPECT_NE(fma.find("exact bf16 dot products: fma (forced, set by MAXSIM_BF16_DOT=fma)"), std::string::npos) << fma;
    const std::string dp = report("VDPBF16PS");
    if (x86::kBf16DotVariants.runs(x86::kBf16DotVdpbf16ps, nullptr)) {
      EXPECT_NE(dp.find("exact bf16 dot products: vdpbf16ps (forced"), std::string::npos) << dp;
    } else {
      EXPECT_NE(dp.find("error: vdpbf16ps (set by MAXSIM_BF16_DOT=VDPBF16PS) cannot run here"), std::string::npos) << dp;
    }
    const std::string bad = report("avx");
    EXPECT_NE(bad.find("error: 'avx' (set by MAXSIM_BF16_DOT=avx) is not a path for exact bf16 dot products"), std::string::npos) << bad;
    EXPECT_NE(bad.find("known: auto, fma, vdpbf16ps"), std::string::npos) << bad;
  }
  // Kernels without variants report none.
  Context scalar = KernelContext("scalar", 1);
  EXPECT_EQ(scalar.Report().find("bf16 dot"), std::string::npos);
}

// Through the API: bf16 data with tiny and huge exponents, where products and partial sums hit the denormal
// range for some pairs (the vdpbf16ps guard refuses those) and not for others.
TEST(X86Kernels, Bf16ExtremeExponentsGiveIdenticalResultsOnEveryKernel) {
  std::mt19937_64 rng(8);
  for (int lo : {-60, -40, -20}) {
    TokenSets q, d;
    q.dim = d.dim = 64;
    q.offsets = {0, 16, 40};
    d.offsets = {0, 10, 30, 31, 60};
    q.values = Bf16Values(rng, q.offsets.back() * 64, lo, lo + 8);
    d.values = Bf16Values(rng, d.offsets.back() * 64, lo, lo + 8);
    q.Encode(MAXSIM_BF16);
    d.Encode(MAXSIM_BF16);
    Context ref_ctx = KernelContext("scalar", 1);
    for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
      const Outcome ref = ScoreMatrixWith(ref_ctx, q, d, metric, MAXSIM_MODE_EXACT);
      for (const std::string& k : KernelConfigs(true)) {
        Context ctx = KernelContext(k, 2);
        ExpectIdentical(ref, ScoreMatrixWith(ctx, q, d, metric, MAXSIM_MODE_EXACT),
                        k + " exponents from " + std::to_string(lo));
        ExpectIdentical(ref, ScoreMatrixWith(ctx, q, d, metric, MAXSIM_MODE_CERTIFIED),
                        k + " certified, exponents from " + std::to_string(lo));
      }
    }
  }
}

// Huge query norms against documents whose values are denormal f32 numbers (the extremes of the margin's
// scaled and absolute terms, and cosine keys whose 1/||d|| overflows f32): certified must still equal exact.
TEST(X86Kernels, CertifiedEqualsExactWithHugeQueriesAndDenormalDocuments) {
  std::mt19937_64 rng(77);
  std::normal_distribution<float> g(0.0f, 1.0f);
  TokenSets q, d;
  q.dim = d.dim = 32;
  q.offsets = {0, 20};
  d.offsets = {0, 40, 80};
  q.values.resize(20 * 32);
  d.values.resize(80 * 32);
  for (size_t s = 0; s < 20; ++s) {
    for (size_t k = 0; k < 32; ++k) q.values[s * 32 + k] = g(rng) * 1e17f;  // norms ~ 6e17 (limit 1e19)
  }
  for (float& x : d.values) x = g(rng) * 1e-41f;  // denormal f32 values
  // Near-ties: every second document row is a tiny perturbation of the previous one.
  for (size_t t = 1; t < 80; t += 2) {
    for (size_t k = 0; k < 32; ++k) d.values[t * 32 + k] = d.values[(t - 1) * 32 + k] + (k == t % 32 ? 1e-45f : 0.0f);
  }
  q.Encode(MAXSIM_F32);
  d.Encode(MAXSIM_F32);
  for (const std::string& k : KernelConfigs(true)) {
    Context ctx = KernelContext(k, 1);
    for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
      const Outcome exact = ScoreMatrixWith(ctx, q, d, metric, MAXSIM_MODE_EXACT);
      const Outcome cert = ScoreMatrixWith(ctx, q, d, metric, MAXSIM_MODE_CERTIFIED);
      ExpectIdentical(exact, cert, k + " certified vs exact, metric " + std::to_string(metric));
    }
  }
}

TEST(X86Kernels, RegistryExplainsUnavailableKernels) {
  for (size_t i = 0; i < maxsim_kernel_count(); ++i) {
    const char* reason = nullptr;
    if (!maxsim_kernel_available(i, &reason)) {
      ASSERT_NE(reason, nullptr);
      EXPECT_GT(std::strlen(reason), 10u) << maxsim_kernel_name(i);
      std::printf("%-12s unavailable: %s\n", maxsim_kernel_name(i), reason);
    } else {
      std::printf("%-12s available\n", maxsim_kernel_name(i));
    }
  }
}

}  // namespace
}  // namespace maxsim::test
