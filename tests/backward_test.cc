// SPDX-License-Identifier: Apache-2.0
// The CPU training backward (the reference the GPU plugin is tested against): float64 gradients from the same
// argmax, a finite-difference check of the forward, every layout, masks, determinism across thread counts, and
// argument errors.
#include <gtest/gtest.h>

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

struct Layout {
  maxsim_layout layout;
  std::vector<uint64_t> cand_offsets, candidates;
  // (query, slot) -> document, score index, argmax base
  uint64_t count(uint64_t i, uint64_t nd) const {
    return layout == MAXSIM_LAYOUT_MATRIX ? nd : layout == MAXSIM_LAYOUT_PAIRS ? 1 : cand_offsets[i + 1] - cand_offsets[i];
  }
  uint64_t doc(uint64_t i, uint64_t c) const {
    return layout == MAXSIM_LAYOUT_MATRIX ? c : layout == MAXSIM_LAYOUT_PAIRS ? i : candidates[cand_offsets[i] + c];
  }
  uint64_t score_index(uint64_t i, uint64_t c, uint64_t nd) const {
    return layout == MAXSIM_LAYOUT_MATRIX ? i * nd + c : layout == MAXSIM_LAYOUT_PAIRS ? i : cand_offsets[i] + c;
  }
};

struct Forward {
  std::vector<float> scores;
  std::vector<int32_t> argmax;
  std::vector<uint64_t> base;  // argmax base per query
};

Forward RunForward(Context& ctx, const TokenSets& q, const TokenSets& d, const Layout& l) {
  Forward f;
  const uint64_t nq = q.n_sets(), nd = d.n_sets();
  f.base.assign(nq + 1, 0);
  for (uint64_t i = 0; i < nq; ++i) f.base[i + 1] = f.base[i] + l.count(i, nd) * q.length(i);
  f.argmax.assign(f.base[nq], -5);
  ScoreOptions o;
  if (l.layout == MAXSIM_LAYOUT_MATRIX) {
    f.scores.resize(nq * nd);
    ctx.ScoreMatrix(q.Dense(), d.Dense(), f.scores, o, f.argmax.data());
  } else if (l.layout == MAXSIM_LAYOUT_PAIRS) {
    f.scores.resize(nq);
    ctx.ScorePairs(q.Dense(), d.Dense(), f.scores, o, f.argmax.data());
  } else {
    f.scores.resize(l.candidates.size());
    ctx.ScoreCandidates(q.Dense(), d.Dense(), l.cand_offsets, l.candidates, f.scores, o, f.argmax.data());
  }
  return f;
}

struct Grads {
  std::vector<float> q, d;
};

Grads RunBackward(Context& ctx, const TokenSets& q, const TokenSets& d, const Layout& l, const Forward& f,
                  const std::vector<float>& g) {
  Grads out;
  out.q.assign(q.rows() * q.dim, std::nanf(""));
  out.d.assign(d.rows() * d.dim, std::nanf(""));
  maxsim_backward_args a;
  maxsim_backward_args_init(&a);
  a.layout = l.layout;
  a.cand_offsets = l.cand_offsets.empty() ? nullptr : l.cand_offsets.data();
  a.candidates = l.candidates.empty() ? nullptr : l.candidates.data();
  a.argmax = f.argmax.data();
  a.grad_scores = g.data();
  a.grad_queries = out.q.data();
  a.grad_documents = out.d.data();
  a.deterministic = 1;
  ctx.Backward(q.Dense(), d.Dense(), a);
  return out;
}

// float64 gradients from the same argmax.
void ReferenceGrads(const TokenSets& q, const TokenSets& d, const Layout& l, const Forward& f,
                    const std::vector<float>& g, std::vector<double>* gq, std::vector<double>* gd,
                    std::vector<double>* scale_q, std::vector<double>* scale_d) {
  const uint64_t nq = q.n_sets(), nd = d.n_sets();
  const uint32_t dim = q.dim;
  gq->assign(q.rows() * dim, 0.0);
  gd->assign(d.rows() * dim, 0.0);
  scale_q->assign(q.rows() * dim, 0.0);
  scale_d->assign(d.rows() * dim, 0.0);
  for (uint64_t i = 0; i < nq; ++i) {
    const uint64_t lq = q.length(i);
    for (uint64_t c = 0; c < l.count(i, nd); ++c) {
      const uint64_t j = l.doc(i, c);
      const double gij = g[l.score_index(i, c, nd)];
      for (uint64_t s = 0; s < lq; ++s) {
        const int32_t t = f.argmax[f.base[i] + c * lq + s];
        if (t < 0) continue;
        const uint64_t qr = q.offsets[i] + s, dr = d.offsets[j] + static_cast<uint64_t>(t);
        for (uint32_t k = 0; k < dim; ++k) {
          (*gq)[qr * dim + k] += gij * d.values[dr * dim + k];
          (*scale_q)[qr * dim + k] += std::fabs(gij * d.values[dr * dim + k]);
          (*gd)[dr * dim + k] += gij * q.values[qr * dim + k];
          (*scale_d)[dr * dim + k] += std::fabs(gij * q.values[qr * dim + k]);
        }
      }
    }
  }
}

void ExpectClose(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& scale,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    // Double accumulation, one rounding to f32: within an ulp of the float64 sum (plus its own tiny error).
    const double tol = std::fabs(want[i]) * 0x1p-23 + scale[i] * 1e-15;
    ASSERT_LE(std::fabs(got[i] - want[i]), tol) << what << " element " << i << ": " << got[i] << " vs " << want[i];
  }
}

std::vector<Layout> AllLayouts(uint64_t nq, uint64_t nd) {
  std::vector<Layout> out;
  out.push_back({MAXSIM_LAYOUT_MATRIX, {}, {}});
  out.push_back({MAXSIM_LAYOUT_PAIRS, {}, {}});
  Layout kd{MAXSIM_LAYOUT_CANDIDATES, {0}, {}};
  for (uint64_t i = 0; i < nq; ++i) {
    for (uint64_t c = 0; c < 4; ++c) kd.candidates.push_back((i * 3 + c * 5) % nd);
    kd.candidates.push_back(kd.candidates.back());  // a repeated document: gradients add up
    kd.cand_offsets.push_back(kd.candidates.size());
  }
  out.push_back(kd);
  return out;
}

TEST(Backward, MatchesFloat64GradientsForEveryLayout) {
  std::mt19937_64 rng(41);
  for (maxsim_dtype dtype : {MAXSIM_F32, MAXSIM_BF16}) {
    TokenSets q = Generate(rng, Shape::kUnitGaussian, 6, 0, 16, 48);
    TokenSets d = Generate(rng, Shape::kClustered, 6, 0, 30, 48);
    q.mask.resize(q.rows());
    for (auto& m : q.mask) m = rng() % 5 != 0;
    d.mask.resize(d.rows());
    for (auto& m : d.mask) m = rng() % 4 != 0;
    q.Encode(dtype);
    d.Encode(dtype);
    Context ctx = CpuContext();
    for (const Layout& l : AllLayouts(q.n_sets(), d.n_sets())) {
      const Forward f = RunForward(ctx, q, d, l);
      std::vector<float> g(f.scores.size());
      std::normal_distribution<float> gd(0.0f, 1.0f);
      for (float& x : g) x = gd(rng);
      const Grads got = RunBackward(ctx, q, d, l, f, g);
      std::vector<double> wq, wd, sq, sd;
      ReferenceGrads(q, d, l, f, g, &wq, &wd, &sq, &sd);
      const std::string what = "layout " + std::to_string(l.layout) + " dtype " + std::to_string(dtype);
      ExpectClose(got.q, wq, sq, what + " grad_Q");
      ExpectClose(got.d, wd, sd, what + " grad_D");
      // Masked rows get exactly zero.
      for (uint64_t r = 0; r < q.rows(); ++r) {
        if (!q.mask[r]) {
          for (uint32_t k = 0; k < q.dim; ++k) ASSERT_EQ(got.q[r * q.dim + k], 0.0f);
        }
      }
    }
  }
}

TEST(Backward, GradientMatchesFiniteDifferencesOfTheForward) {
  // MaxSim is piecewise linear; away from ties the analytic gradient is exact. Check it against central
  // differences of the float64 reference score for a few coordinates.
  std::mt19937_64 rng(42);
  TokenSets q = Generate(rng, Shape::kGaussian, 2, 4, 8, 16);
  TokenSets d = Generate(rng, Shape::kGaussian, 3, 5, 12, 16);
  Context ctx = CpuContext();
  const Layout l{MAXSIM_LAYOUT_MATRIX, {}, {}};
  const Forward f = RunForward(ctx, q, d, l);
  std::vector<float> g = {0.7f, -1.3f, 0.4f, 2.0f, -0.5f, 1.1f};
  const Grads got = RunBackward(ctx, q, d, l, f, g);
  auto loss = [&](const TokenSets& qq, const TokenSets& dd) {
    double sum = 0;
    for (uint64_t i = 0; i < qq.n_sets(); ++i) {
      for (uint64_t j = 0; j < dd.n_sets(); ++j) sum += g[i * dd.n_sets() + j] * Reference(qq, i, dd, j, MAXSIM_METRIC_DOT).score;
    }
    return sum;
  };
  const double h = 1e-3;
  for (int trial = 0; trial < 20; ++trial) {
    const bool on_q = trial % 2 == 0;
    TokenSets a = on_q ? q : d, b = a;
    const size_t idx = rng() % a.values.size();
    a.values[idx] += static_cast<float>(h);
    b.values[idx] -= static_cast<float>(h);
    const double fd = on_q ? (loss(a, d) - loss(b, d)) / (a.values[idx] - b.values[idx])
                           : (loss(q, a) - loss(q, b)) / (a.values[idx] - b.values[idx]);
    const double analytic = on_q ? got.q[idx] : got.d[idx];
    EXPECT_NEAR(analytic, fd, 1e-3 * (1 + std::fabs(fd))) << (on_q ? "Q" : "D") << "[" << idx << "]";
  }
}

TEST(Backward, BitIdenticalAcrossThreadCounts) {
  std::mt19937_64 rng(43);
  TokenSets q = Generate(rng, Shape::kUnitGaussian, 16, 8, 32, 64);
  TokenSets d = Generate(rng, Shape::kDuplicates, 16, 8, 60, 64);  // heavy contention on few document tokens
  Context one = CpuContext(1);
  for (const Layout& l : AllLayouts(q.n_sets(), d.n_sets())) {
    const Forward f = RunForward(one, q, d, l);
    std::vector<float> g(f.scores.size());
    for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(static_cast<float>(i));
    const Grads a = RunBackward(one, q, d, l, f, g);
    for (int threads : {2, 7}) {
      Context ctx = CpuContext(threads);
      const Grads b = RunBackward(ctx, q, d, l, f, g);
      EXPECT_EQ(std::memcmp(a.q.data(), b.q.data(), a.q.size() * 4), 0);
      EXPECT_EQ(std::memcmp(a.d.data(), b.d.data(), a.d.size() * 4), 0);
    }
  }
}

TEST(Backward, RejectsBadArguments) {
  std::mt19937_64 rng(44);
  TokenSets q = Generate(rng, Shape::kGaussian, 2, 3, 3, 8);
  TokenSets d = Generate(rng, Shape::kGaussian, 2, 4, 4, 8);
  Context ctx = CpuContext();
  const Layout l{MAXSIM_LAYOUT_MATRIX, {}, {}};
  Forward f = RunForward(ctx, q, d, l);
  std::vector<float> g(4, 1.0f), gq(q.rows() * 8), gdd(d.rows() * 8);
  maxsim_backward_args a;
  maxsim_backward_args_init(&a);
  a.argmax = f.argmax.data();
  a.grad_scores = g.data();
  a.grad_queries = gq.data();
  a.grad_documents = gdd.data();
  const DenseSets qd = q.Dense(), dd = d.Dense();
  auto expect = [&](maxsim_status want, const char* part) {
    EXPECT_EQ(maxsim_backward(ctx.get(), qd.get(), dd.get(), &a), want);
    EXPECT_NE(std::string(maxsim_last_error()).find(part), std::string::npos) << maxsim_last_error();
  };
  EXPECT_EQ(maxsim_backward(ctx.get(), qd.get(), dd.get(), &a), MAXSIM_OK) << maxsim_last_error();
  f.argmax[3] = 4;  // document 1 has 4 tokens: 0..3
  expect(MAXSIM_ERR_INVALID_ARGUMENT, "argmax");
  f.argmax[3] = -2;
  expect(MAXSIM_ERR_INVALID_ARGUMENT, "argmax");
  f.argmax[3] = 0;
  g[1] = std::numeric_limits<float>::infinity();
  expect(MAXSIM_ERR_NON_FINITE, "grad_scores[1]");
  g[1] = 1;
  a.layout = static_cast<maxsim_layout>(9);
  expect(MAXSIM_ERR_INVALID_ARGUMENT, "layout");
  a.layout = MAXSIM_LAYOUT_CANDIDATES;
  expect(MAXSIM_ERR_INVALID_ARGUMENT, "cand_offsets");
  a.layout = MAXSIM_LAYOUT_MATRIX;
  a.argmax = nullptr;
  expect(MAXSIM_ERR_INVALID_ARGUMENT, "argmax");
  a.argmax = f.argmax.data();
  // The exported init fills the first layout: flags past it are not read (a stream-ordered flag on host tensors
  // would fail the call); from the macro's struct they are. A too-small size names struct_size.
  a.flags = MAXSIM_CALL_STREAM_ORDERED;
  expect(MAXSIM_ERR_INVALID_ARGUMENT, "MAXSIM_CALL_STREAM_ORDERED");
  maxsim_backward_args first;
  (maxsim_backward_args_init)(&first);
  first.argmax = f.argmax.data();
  first.grad_scores = g.data();
  first.grad_queries = gq.data();
  first.flags = MAXSIM_CALL_STREAM_ORDERED;
  EXPECT_EQ(maxsim_backward(ctx.get(), qd.get(), dd.get(), &first), MAXSIM_OK) << maxsim_last_error();
  maxsim_backward_args_init_sized(&a, 16);
  expect(MAXSIM_ERR_INVALID_ARGUMENT, "maxsim_backward_args.struct_size is 0; call maxsim_backward_args_init");
}

}  // namespace
}  // namespace maxsim::test
