// SPDX-License-Identifier: Apache-2.0
// Inputs at the edge of what is accepted, and trusted (FAST) buffers that lie: no accepted input scores a
// non-finite value other than -inf for an empty document, top-k never orders a NaN above a number, and lying
// metadata in a trusted buffer is never undefined behaviour in a kernel (the sanitize lane runs these under UBSan).
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "maxsim/maxsim.hpp"
#include "packed.h"
#include "reference_packer.h"
#include "test_util.h"

namespace maxsim::test {
namespace {

const maxsim_mode kModes[] = {MAXSIM_MODE_EXACT, MAXSIM_MODE_CERTIFIED, MAXSIM_MODE_APPROXIMATE};

// One context per CPU kernel this machine runs.
std::vector<std::string> AvailableKernels() {
  std::vector<std::string> names;
  for (size_t i = 0; i < maxsim_kernel_count(); ++i) {
    if (maxsim_kernel_available(i, nullptr)) names.push_back(maxsim_kernel_name(i));
  }
  return names;
}

// A packed buffer's bytes, copied into 64-byte aligned memory the test may edit.
struct Editable {
  AlignedBytes bytes;
  pack::PackedView view;
  explicit Editable(const Packed& p) : bytes(ToVector(p)) {
    if (!pack::Validate(bytes.data(), bytes.size(), MAXSIM_VALIDATE_FAST, &view).ok()) ADD_FAILURE();
  }
  static std::vector<uint8_t> ToVector(const Packed& p) {
    const maxsim_packed_desc d = p.Describe();
    const auto* b = static_cast<const uint8_t*>(d.data);
    return std::vector<uint8_t>(b, b + d.size);
  }
  maxsim_vector_meta* meta(uint64_t row) { return const_cast<maxsim_vector_meta*>(view.meta) + row; }
  float* f32(uint64_t row) { return reinterpret_cast<float*>(const_cast<uint8_t*>(view.originals) + row * view.orig_row_bytes); }
};

// Dot products near the 1e38 limit (norms just under 1e19) summed over 8 query tokens exceed FLT_MAX: the score
// saturates to +-FLT_MAX in every mode and on every kernel, and an empty document still ranks below it.
TEST(Hostile, SumsBeyondTheF32RangeSaturate) {
  const uint32_t dim = 4;
  const float big = 9.9e18f;
  std::vector<float> q(8 * dim, 0.0f), d(2 * dim, 0.0f);
  for (int s = 0; s < 8; ++s) q[s * dim] = big;
  d[0] = big;                // document 0: +9.8e37 per query token
  d[dim] = -big;             // document 1: -9.8e37 per query token
  const std::vector<uint64_t> qoff{0, 8}, doff{0, 1, 2, 2};  // document 2 is empty
  const DenseSets Q(q.data(), dim, qoff), D(d.data(), dim, doff);
  for (const std::string& isa : AvailableKernels()) {
    Context ctx = CpuContext(1, isa.c_str());
    Packed pd = Packed::Pack(ctx, D);
    for (maxsim_mode mode : kModes) {
      for (int packed = 0; packed < 2; ++packed) {
        const std::string what = isa + " mode " + std::to_string(mode) + (packed ? " packed" : " dense");
        const Sets docs = packed ? Sets(pd) : Sets(D);
        const auto s = ctx.ScoreMatrix(Q, 1, docs, 3, {MAXSIM_METRIC_DOT, mode});
        EXPECT_EQ(s[0], std::numeric_limits<float>::max()) << what;
        EXPECT_EQ(s[1], -std::numeric_limits<float>::max()) << what;
        EXPECT_EQ(s[2], -std::numeric_limits<float>::infinity()) << what;
        const TopKResult top = ctx.TopK(Q, 1, docs, 3, {MAXSIM_METRIC_DOT, mode});
        EXPECT_EQ(top.index, (std::vector<uint64_t>{0, 1, 2})) << what;
      }
    }
  }
}

// A trusted (FAST) buffer whose originals hold an infinity scores NaN for that document (+inf from one query
// token, -inf from the other), but top-k ranks it below every number, the empty document's -inf included,
// whatever the thread count.
TEST(Hostile, TopKRanksANanBelowEveryNumber) {
  const uint32_t dim = 8;
  std::vector<float> d(3 * dim, 0.5f), q(2 * dim, 0.25f);
  for (uint32_t k = 0; k < dim; ++k) d[2 * dim + k] = 0.75f;
  q[0] = 1.0f;
  q[dim] = -1.0f;
  const std::vector<uint64_t> doff{0, 1, 2, 2, 3}, qoff{0, 2};  // document 2 is empty
  Context ctx = CpuContext(2);
  Packed clean = Packed::Pack(ctx, DenseSets(d.data(), dim, doff));
  Editable e(clean);
  e.f32(0)[0] = std::numeric_limits<float>::infinity();  // document 0's only token
  Packed hostile = Packed::Open(e.bytes.data(), e.bytes.size(), MAXSIM_VALIDATE_FAST);
  const DenseSets Q(q.data(), dim, qoff);
  for (int threads : {1, 2}) {
    Context c = CpuContext(threads);
    EXPECT_TRUE(std::isnan(c.ScoreMatrix(Q, 1, hostile, 4)[0]));
    const TopKResult top = c.TopK(Q, 1, hostile, 4);
    EXPECT_EQ(top.index, (std::vector<uint64_t>{3, 1, 2, 0})) << threads << " threads";
    EXPECT_EQ(top.scores[2], -std::numeric_limits<float>::infinity());
    EXPECT_TRUE(std::isnan(top.scores[3]));
    for (uint64_t k : {1, 2, 3}) {
      const TopKResult t = c.TopK(Q, 1, hostile, k);
      EXPECT_EQ(t.index, std::vector<uint64_t>(top.index.begin(), top.index.begin() + k)) << k;
    }
  }
}

// code_sum feeds the unsigned-bias start value of the VNNI kernels (-128 * code_sum). In a trusted buffer it
// may hold anything: INT32_MAX / INT32_MIN must not be signed-overflow UB on any kernel, in any screened mode.
TEST(Hostile, TrustedBuffersWithExtremeCodeSumsAreNotUndefinedBehaviour) {
  std::mt19937_64 rng(61);
  TokenSets q = Generate(rng, Shape::kUnitGaussian, 2, 1, 9, 96);
  TokenSets d = Generate(rng, Shape::kUnitGaussian, 6, 1, 12, 96);
  Context ctx0 = CpuContext(1);
  Packed clean = Packed::Pack(ctx0, d.Dense());
  Editable e(clean);
  for (uint64_t r = 0; r < e.view.n_vectors; ++r) e.meta(r)->code_sum = r % 2 ? INT32_MAX : INT32_MIN;
  Packed hostile = Packed::Open(e.bytes.data(), e.bytes.size(), MAXSIM_VALIDATE_FAST);
  const DenseSets qd = q.Dense();
  const maxsim_sets Q{nullptr, qd.get()}, D{hostile.get(), nullptr};
  for (const std::string& isa : AvailableKernels()) {
    Context ctx = CpuContext(1, isa.c_str());
    for (maxsim_mode mode : {MAXSIM_MODE_CERTIFIED, MAXSIM_MODE_APPROXIMATE}) {
      std::vector<float> s(q.n_sets() * d.n_sets());
      const maxsim_score_options o = ScoreOptions{MAXSIM_METRIC_DOT, mode}.c();
      EXPECT_EQ(maxsim_score_matrix(ctx.get(), &Q, &D, &o, s.data(), nullptr), MAXSIM_OK)
          << isa << ": " << maxsim_last_error();
    }
  }
}

// The trust model (trust.cc): a buffer whose codes or metadata were edited and both checksums recomputed passes
// STANDARD. Opened or loaded at STANDARD, it scores in exact mode but its first certified use DEEP-validates it
// and refuses it (never a silently non-exact "certified" answer); at DEEP it is refused when opened; at FAST the
// caller vouches for it. A consistent buffer opened at STANDARD scores certified == exact, bit for bit.
TEST(Hostile, CertifiedModeRefusesResealedStaleCodesAndMetadata) {
  std::mt19937_64 rng(71);
  TokenSets q = Generate(rng, Shape::kUnitGaussian, 3, 1, 8, 64);
  TokenSets d = Generate(rng, Shape::kClustered, 12, 1, 16, 64);
  const std::vector<uint8_t> good = ReferencePack(d, nullptr);
  AlignedBytes ga(good);
  pack::PackedView v;
  ASSERT_TRUE(pack::Validate(ga.data(), good.size(), MAXSIM_VALIDATE_STANDARD, &v).ok());
  const size_t codes = static_cast<size_t>(reinterpret_cast<const uint8_t*>(v.codes) - v.base);
  const size_t meta = static_cast<size_t>(reinterpret_cast<const uint8_t*>(v.meta) - v.base);
  const uint64_t last = v.n_vectors - 1;
  struct Lie {
    const char* name;
    std::function<void(std::vector<uint8_t>&)> edit;
  };
  const std::vector<Lie> lies = {
      {"a code moved by one", [&](auto& b) {
         const size_t at = codes + last * v.padded_dim;
         const int8_t c = static_cast<int8_t>(b[at]);
         b[at] = static_cast<uint8_t>(c == 127 ? 126 : c + 1);
       }},
      {"residual norm understated", [&](auto& b) { Put<float>(b, meta + 16 * last + 8, 0.0f); }},
      {"code sum off by one", [&](auto& b) { Put<int32_t>(b, meta + 16 * last + 12, Get<int32_t>(b, meta + 16 * last + 12) + 1); }},
  };
  Context ctx = CpuContext(2);
  const DenseSets Q = q.Dense();
  const uint64_t nq = q.n_sets(), nd = d.n_sets();
  char tmpl[] = "/tmp/maxsim-trust-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string file = std::string(tmpl) + "/lie.maxsim";
  for (const Lie& lie : lies) {
    std::vector<uint8_t> b = good;
    lie.edit(b);
    Reseal(b);
    AlignedBytes a(b);
    ASSERT_EQ(maxsim_validate(a.data(), b.size(), MAXSIM_VALIDATE_STANDARD), MAXSIM_OK) << lie.name;
    maxsim_packed* p = nullptr;
    EXPECT_EQ(maxsim_packed_open(a.data(), b.size(), MAXSIM_VALIDATE_DEEP, &p), MAXSIM_ERR_INVALID_BUFFER) << lie.name;
    Packed opened = Packed::Open(a.data(), b.size(), MAXSIM_VALIDATE_STANDARD);
    opened.Save(file);
    Packed loaded = Packed::Load(file, MAXSIM_VALIDATE_STANDARD);
    for (const Packed* h : {&opened, &loaded}) {
      const maxsim_sets QS{nullptr, Q.get()}, DS{h->get(), nullptr};
      std::vector<float> s(nq * nd);
      EXPECT_EQ(maxsim_score_matrix(ctx.get(), &QS, &DS, nullptr, s.data(), nullptr), MAXSIM_OK) << lie.name;
      maxsim_score_options o;
      maxsim_score_options_init(&o);
      o.mode = MAXSIM_MODE_CERTIFIED;
      for (int call = 0; call < 2; ++call) {  // refused again on a later call, not only the first
        EXPECT_EQ(maxsim_score_matrix(ctx.get(), &QS, &DS, &o, s.data(), nullptr), MAXSIM_ERR_INVALID_BUFFER) << lie.name;
        EXPECT_NE(std::string(maxsim_last_error()).find("certified"), std::string::npos) << maxsim_last_error();
        std::vector<uint64_t> idx(nq);
        EXPECT_EQ(maxsim_topk(ctx.get(), &QS, &DS, 1, &o, s.data(), idx.data(), nullptr), MAXSIM_ERR_INVALID_BUFFER);
      }
      // The same lie as packed queries.
      const maxsim_sets QP{h->get(), nullptr}, DD{nullptr, Q.get()};
      std::vector<float> s2(nd * nq);
      EXPECT_EQ(maxsim_score_matrix(ctx.get(), &QP, &DD, &o, s2.data(), nullptr), MAXSIM_ERR_INVALID_BUFFER) << lie.name;
    }
    Packed trusted = Packed::Open(a.data(), b.size(), MAXSIM_VALIDATE_FAST);
    (void)ctx.ScoreMatrix(Q, nq, trusted, nd, {MAXSIM_METRIC_DOT, MAXSIM_MODE_CERTIFIED});  // the caller's word
  }
  std::system((std::string("rm -rf ") + tmpl).c_str());
  Packed clean = Packed::Open(ga.data(), good.size(), MAXSIM_VALIDATE_STANDARD);
  for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
    std::vector<int32_t> ae(nd * q.rows()), ac(nd * q.rows());
    const auto exact = ctx.ScoreMatrix(Q, nq, clean, nd, {metric, MAXSIM_MODE_EXACT}, ae.data());
    const auto cert = ctx.ScoreMatrix(Q, nq, clean, nd, {metric, MAXSIM_MODE_CERTIFIED}, ac.data());
    EXPECT_EQ(std::memcmp(exact.data(), cert.data(), exact.size() * 4), 0);
    EXPECT_EQ(ae, ac);
  }
}

}  // namespace
}  // namespace maxsim::test
