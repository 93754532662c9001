// SPDX-License-Identifier: Apache-2.0
// GPU conformance suite for the CUDA plugin (run on a machine with an NVIDIA GPU by scripts/device/gpu-tests.sh; not part
// of the CPU CI, which has no GPU). Every GPU operation is checked against the CPU float64 reference
// (tests/test_util.cc: the f32 error bound of every similarity, argmax up to true near-ties) and, for the
// training backward, against the CPU backward (maxsim_backward on host copies). Also: certified == exact bit for
// bit on the GPU, f32 inputs bit-identical to the CPU (same FMA chain), streamed corpora identical to resident
// ones, deterministic backward bit-identical across runs, masks, ragged and empty sets, offsets[0] > 0 and row
// strides, adversarial near-ties, the real ColBERT embeddings, and error statuses.
//
// Data are fresh random draws: the seed comes from MAXSIM_TEST_SEED or std::random_device and is printed.
// Without a usable GPU every test is skipped (or fails, if MAXSIM_GPU_TESTS_REQUIRE=1, as scripts/device/gpu-tests.sh sets it).
#include <cuda.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../../plugins/cuda/src/ordered_sum.h"
#include "maxsim/maxsim.hpp"
#include "test_util.h"

namespace maxsim::test {
namespace {

uint64_t Seed() {
  static const uint64_t seed = [] {
    if (const char* e = std::getenv("MAXSIM_TEST_SEED")) return static_cast<uint64_t>(std::strtoull(e, nullptr, 10));
    std::random_device rd;
    const uint64_t s = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    std::printf("gpu tests: MAXSIM_TEST_SEED=%llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

std::mt19937_64 Rng(uint64_t salt) { return std::mt19937_64(Seed() * 1000003ull + salt); }

// By default certified requests run the exact kernel (bit-identical on the GPU, and faster) and approximate ones
// screen only where the screening kernel's ring applies; every certified and approximate test below exercises the
// screening kernel at every shape instead, set before the first context (and backend) exists.
// ScreeningRoutesByModeAndShape checks the default routes.
const bool kScreenCertified = [] {
  setenv("MAXSIM_CUDA_CERTIFIED", "screen", 0);
  return true;
}();

Context CudaContext();

// An environment variable set to `value` (nullptr: unset) while this lives (the plugin reads its settings once,
// when a backend is created), then given back the value it had before, or unset (at Restore() or at the end of the
// scope): a run with the variable set for the whole suite keeps it for the tests after this one.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* before = std::getenv(name);
    had_ = before != nullptr;
    if (had_) saved_ = before;
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() { Restore(); }
  void Restore() {
    if (restored_) return;
    restored_ = true;
    if (had_) {
      setenv(name_.c_str(), saved_.c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_, saved_;
  bool had_ = false, restored_ = false;
};

// fn(ctx) on a CUDA context created while the environment variable `name` is `value` (ScopedEnv: nullptr unsets
// it; packed handles work in any context).
template <typename F>
auto WithEnv(const char* name, const char* value, F&& fn) {
  Context ctx = [&] {
    ScopedEnv env(name, value);
    return CudaContext();
  }();
  return fn(ctx);
}

// A CUDA context created while the environment variable `name` is `value` (the backend reads its settings then).
Context CudaContextWithEnv(const char* name, const char* value) {
  return WithEnv(name, value, [](Context& g) { return std::move(g); });
}

maxsim_options Options(const char* backend) {
  maxsim_options o;
  maxsim_options_init(&o);
  o.backend = backend;
  o.plugin_path = MAXSIM_CUDA_PLUGIN_PATH;
  o.num_threads = 8;
  if (std::strcmp(backend, "cpu") == 0) o.load_plugins = 0;
  return o;
}

Context CudaContext() { return Context(Options("cuda")); }

const std::string& GpuUnavailable() {
  static const std::string why = [] {
    maxsim_options o = Options("cuda");
    maxsim_context* ctx = nullptr;
    if (maxsim_context_create(&o, &ctx) != MAXSIM_OK) return std::string(maxsim_last_error());
    maxsim_context_destroy(ctx);
    return std::string();
  }();
  return why;
}

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    Seed();
    if (!GpuUnavailable().empty()) {
      if (std::getenv("MAXSIM_GPU_TESTS_REQUIRE")) FAIL() << "the CUDA backend is required here: " << GpuUnavailable();
      GTEST_SKIP() << "no usable GPU: " << GpuUnavailable();
    }
  }
};

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x << ": " << cudaGetErrorString(cudaGetLastError())

// ---- device memory ------------------------------------------------------------------------------------------

template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  Dev() = default;
  explicit Dev(size_t count) : n(count) {
    if (cudaMalloc(&p, std::max<size_t>(1, count) * sizeof(T)) != cudaSuccess) p = nullptr;
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  Dev& operator=(Dev&& o) noexcept {
    std::swap(p, o.p);
    std::swap(n, o.n);
    return *this;
  }
  ~Dev() {
    if (p) cudaFree(p);
  }
  void Up(const T* src) { cudaMemcpy(p, src, n * sizeof(T), cudaMemcpyHostToDevice); }
  std::vector<T> Down() const {
    std::vector<T> v(n);
    cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
  void Fill(unsigned char byte) { cudaMemset(p, byte, std::max<size_t>(1, n) * sizeof(T)); }
};

// Token sets copied to device memory, optionally behind `lead` garbage rows (offsets[0] > 0) and with
// `pad` garbage elements after each row (row_stride > dim). The garbage is NaN: reading it would show.
struct DeviceSets {
  Dev<uint8_t> data, mask;
  std::vector<uint64_t> offsets;
  maxsim_dense_sets s{};
  uint64_t lead = 0;
  DeviceSets(const TokenSets& t, uint64_t lead_rows = 0, uint32_t pad = 0) : lead(lead_rows) {
    const uint32_t elem = t.dtype == MAXSIM_F32 ? 4 : 2;
    const uint64_t stride = t.dim + pad, rows = t.rows() + lead_rows;
    std::vector<uint8_t> host(std::max<uint64_t>(1, rows * stride * elem));
    const float nan = std::nanf("");
    for (uint64_t e = 0; e < rows * stride; ++e) {
      if (elem == 4) std::memcpy(&host[e * 4], &nan, 4);
      else { const uint16_t h = t.dtype == MAXSIM_BF16 ? 0x7fc0 : 0x7e00; std::memcpy(&host[e * 2], &h, 2); }
    }
    for (uint64_t r = 0; r < t.rows(); ++r) {
      std::memcpy(&host[((r + lead_rows) * stride) * elem], &t.encoded[r * t.dim * elem], t.dim * elem);
    }
    data = Dev<uint8_t>(host.size());
    data.Up(host.data());
    offsets = t.offsets;
    for (uint64_t& o : offsets) o += lead_rows;
    s.struct_size = sizeof(s);
    s.memory = MAXSIM_MEMORY_CUDA;
    s.data = data.p;
    s.dtype = t.dtype;
    s.dim = t.dim;
    s.row_stride = pad ? stride : 0;
    s.n_sets = t.n_sets();
    s.offsets = offsets.data();
    if (!t.mask.empty()) {
      std::vector<uint8_t> m(std::max<uint64_t>(1, rows), 0);
      std::copy(t.mask.begin(), t.mask.end(), m.begin() + lead_rows);
      mask = Dev<uint8_t>(m.size());
      mask.Up(m.data());
      s.mask = mask.p;
    }
  }
};

void RandomMask(std::mt19937_64& rng, TokenSets& t, double p_masked) {
  std::bernoulli_distribution keep(1.0 - p_masked);
  t.mask.resize(t.rows());
  for (auto& m : t.mask) m = keep(rng) ? 1 : 0;
}

TokenSets Encoded(TokenSets t, maxsim_dtype dtype) {
  t.Encode(dtype);
  return t;
}

// ---- checks ---------------------------------------------------------------------------------------------------

struct Matrix {
  std::vector<float> scores;
  std::vector<int32_t> argmax;
};

Matrix ScoreMatrix(Context& ctx, const Sets& q, uint64_t nq, uint64_t q_positions, const Sets& d, uint64_t nd,
                   maxsim_metric metric, maxsim_mode mode, maxsim_stats* stats = nullptr) {
  Matrix m;
  m.scores.assign(nq * nd, std::nanf(""));
  m.argmax.assign(nd * q_positions, -7);
  ScoreOptions o;
  o.metric = metric;
  o.mode = mode;
  o.stats = stats;
  ctx.ScoreMatrix(q, d, m.scores, o, m.argmax.data());
  return m;
}

void ExpectReference(const TokenSets& q, const TokenSets& d, maxsim_metric metric, const Matrix& m,
                     const std::string& what, uint64_t max_pairs = UINT64_MAX) {
  const uint64_t nd = d.n_sets();
  uint64_t checked = 0;
  for (uint64_t i = 0; i < q.n_sets(); ++i) {
    for (uint64_t j = 0; j < nd && checked < max_pairs; ++j, ++checked) {
      const int32_t* am = m.argmax.data() + nd * q.offsets[i] + j * q.length(i);
      const std::string err = CheckPair(q, i, d, j, metric, m.scores[i * nd + j], am);
      ASSERT_TRUE(err.empty()) << what << " query " << i << " doc " << j << ": " << err;
    }
  }
}

void ExpectSameBits(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(0, std::memcmp(&a[i], &b[i], 4)) << what << ": score " << i << " differs: " << a[i] << " vs " << b[i];
  }
}

void ExpectIdentical(const Matrix& a, const Matrix& b, const std::string& what) {
  ExpectSameBits(a.scores, b.scores, what);
  if (::testing::Test::HasFatalFailure()) return;
  for (size_t i = 0; i < a.argmax.size(); ++i) ASSERT_EQ(a.argmax[i], b.argmax[i]) << what << ": argmax " << i;
}

// Approximate mode: every argmax is a kept token (or -1 where exact has -1) and no score exceeds exact's by more
// than the rounding bound.
void ExpectApproximate(const TokenSets& q, const TokenSets& d, maxsim_metric metric, const Matrix& approx,
                       const Matrix& exact, const std::string& what) {
  const uint64_t nd = d.n_sets();
  for (uint64_t i = 0; i < q.n_sets(); ++i) {
    for (uint64_t j = 0; j < nd; ++j) {
      const float a = approx.scores[i * nd + j], e = exact.scores[i * nd + j];
      if (std::isinf(e)) {
        ASSERT_TRUE(std::isinf(a) && a < 0) << what;
        continue;
      }
      const RefPair ref = Reference(q, i, d, j, metric);
      ASSERT_LE(static_cast<double>(a), ref.score + 2 * ref.tolerance) << what << " query " << i << " doc " << j;
      for (uint64_t s = 0; s < q.length(i); ++s) {
        const int32_t t = approx.argmax[nd * q.offsets[i] + j * q.length(i) + s];
        ASSERT_TRUE(t >= 0 && static_cast<uint64_t>(t) < d.length(j)) << what;
      }
    }
  }
}

// ---- scoring on packed corpora --------------------------------------------------------------------------

struct Case {
  maxsim_dtype dtype;
  uint32_t dim;
  Shape shape;
};

TEST_F(Gpu, PackedMatrixAllModesMatchReference) {
  Context gpu(Options("cuda"));
  const Case cases[] = {
      {MAXSIM_BF16, 128, Shape::kUnitGaussian}, {MAXSIM_BF16, 128, Shape::kClustered},
      {MAXSIM_F16, 128, Shape::kGaussian},      {MAXSIM_BF16, 64, Shape::kDuplicates},
      {MAXSIM_BF16, 48, Shape::kNearTies},      {MAXSIM_F16, 96, Shape::kClustered},
      {MAXSIM_BF16, 200, Shape::kGaussian},     {MAXSIM_BF16, 256, Shape::kUnitGaussian},
      {MAXSIM_F16, 768, Shape::kUnitGaussian},  {MAXSIM_BF16, 1024, Shape::kClustered},
      {MAXSIM_BF16, 8, Shape::kGaussian},       {MAXSIM_BF16, 7, Shape::kGaussian},
      {MAXSIM_F32, 128, Shape::kUnitGaussian},  {MAXSIM_F32, 7, Shape::kGaussian},
      {MAXSIM_BF16, 64, Shape::kLargeNorm},      {MAXSIM_BF16, 96, Shape::kTinyNorm},
  };
  uint64_t salt = 0;
  for (const Case& c : cases) {
    for (int qlen : {12, 40}) {
      auto rng = Rng(++salt);
      const TokenSets q = Encoded(Generate(rng, c.shape, 4, 0, qlen, c.dim), c.dtype);
      const TokenSets d = Encoded(Generate(rng, c.shape, 30, 0, 70, c.dim), c.dtype);
      Packed pq = Packed::Pack(gpu, q.Dense());
      Packed pd = Packed::Pack(gpu, d.Dense());
      for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
        const std::string what = std::string("dtype ") + std::to_string(c.dtype) + " dim " + std::to_string(c.dim) +
                                 " " + ShapeName(c.shape) + " Lq<=" + std::to_string(qlen) +
                                 (metric == MAXSIM_METRIC_DOT ? " dot" : " cosine");
        const Matrix exact = ScoreMatrix(gpu, pq, q.n_sets(), q.rows(), pd, d.n_sets(), metric, MAXSIM_MODE_EXACT);
        ExpectReference(q, d, metric, exact, what + " exact");
        maxsim_stats st{};
        const Matrix cert =
            ScoreMatrix(gpu, pq, q.n_sets(), q.rows(), pd, d.n_sets(), metric, MAXSIM_MODE_CERTIFIED, &st);
        ExpectIdentical(cert, exact, what + " certified vs exact");
        EXPECT_EQ(st.pairs, q.n_sets() * d.n_sets());
        // Dense host queries (packed temporarily by the library) give the same results.
        const Matrix exact_dense =
            ScoreMatrix(gpu, q.Dense(), q.n_sets(), q.rows(), pd, d.n_sets(), metric, MAXSIM_MODE_EXACT);
        ExpectIdentical(exact_dense, exact, what + " dense host queries");
        const Matrix approx =
            ScoreMatrix(gpu, pq, q.n_sets(), q.rows(), pd, d.n_sets(), metric, MAXSIM_MODE_APPROXIMATE);
        ExpectApproximate(q, d, metric, approx, exact, what + " approximate");
      }
    }
  }
}

TEST_F(Gpu, ScreeningRoutesByModeAndShape) {
  // Without MAXSIM_CUDA_CERTIFIED a certified request runs the exact kernel, and an approximate one screens only
  // where the screening kernel's per-warp ring applies (short queries, many pairs); MAXSIM_CUDA_CERTIFIED=exact
  // never screens, =screen always does. Certified gives exact's bits on every route; the refinement counters
  // tell the routes apart.
  ASSERT_TRUE(kScreenCertified);
  Context routed = CudaContextWithEnv("MAXSIM_CUDA_CERTIFIED", nullptr);
  Context never = CudaContextWithEnv("MAXSIM_CUDA_CERTIFIED", "exact");
  Context screened = CudaContextWithEnv("MAXSIM_CUDA_CERTIFIED", "screen");
  struct RouteCase {
    uint64_t nd, lq;
    bool approx_screens;  // by default
  };
  for (const RouteCase& rc : {RouteCase{40, 32, false}, RouteCase{40, 300, false}, RouteCase{800, 32, true},
                              RouteCase{800, 100, false}}) {
    auto rng = Rng(90 + rc.lq + rc.nd);
    // Query lengths: a long case must stay longer than 32 tokens (the route depends on the longest query).
    const uint64_t min_lq = rc.lq > 32 ? 33 : 1;
    const TokenSets q = Encoded(Generate(rng, Shape::kUnitGaussian, 2, min_lq, rc.lq, 128), MAXSIM_BF16);
    const TokenSets d = Encoded(Generate(rng, Shape::kClustered, rc.nd, 0, 120, 128), MAXSIM_BF16);
    Packed pq = Packed::Pack(routed, q.Dense());
    Packed pd = Packed::Pack(routed, d.Dense());
    for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
      const std::string what = "Nd " + std::to_string(rc.nd) + " Lq " + std::to_string(rc.lq) +
                               (metric == MAXSIM_METRIC_DOT ? " dot" : " cosine");
      const uint64_t nq = q.n_sets(), rows = q.rows(), nd = d.n_sets();
      maxsim_stats st_routed{}, st_never{}, st_screened{}, st_ar{}, st_an{}, st_as{};
      const Matrix exact = ScoreMatrix(routed, pq, nq, rows, pd, nd, metric, MAXSIM_MODE_EXACT);
      const Matrix cert = ScoreMatrix(routed, pq, nq, rows, pd, nd, metric, MAXSIM_MODE_CERTIFIED, &st_routed);
      const Matrix cert_never = ScoreMatrix(never, pq, nq, rows, pd, nd, metric, MAXSIM_MODE_CERTIFIED, &st_never);
      const Matrix screen = ScoreMatrix(screened, pq, nq, rows, pd, nd, metric, MAXSIM_MODE_CERTIFIED, &st_screened);
      ExpectIdentical(cert, exact, what + " routed certified vs exact");
      ExpectIdentical(cert_never, exact, what + " certified (never screened) vs exact");
      ExpectIdentical(screen, exact, what + " screened certified vs exact");
      EXPECT_EQ(st_routed.refined, 0u) << what;
      EXPECT_EQ(st_never.refined, 0u) << what;
      EXPECT_GT(st_screened.refined, 0u) << what;
      const Matrix ap_routed = ScoreMatrix(routed, pq, nq, rows, pd, nd, metric, MAXSIM_MODE_APPROXIMATE, &st_ar);
      const Matrix ap_never = ScoreMatrix(never, pq, nq, rows, pd, nd, metric, MAXSIM_MODE_APPROXIMATE, &st_an);
      const Matrix ap_screen = ScoreMatrix(screened, pq, nq, rows, pd, nd, metric, MAXSIM_MODE_APPROXIMATE, &st_as);
      ExpectIdentical(ap_never, exact, what + " approximate (never screened) vs exact");
      EXPECT_EQ(st_an.refined, 0u) << what;
      EXPECT_GT(st_as.refined, 0u) << what;
      if (rc.approx_screens) {
        ExpectIdentical(ap_routed, ap_screen, what + " routed approximate vs screened");
        EXPECT_EQ(st_ar.refined, st_as.refined) << what;
      } else {
        ExpectIdentical(ap_routed, exact, what + " routed approximate vs exact");
        EXPECT_EQ(st_ar.refined, 0u) << what;
      }
    }
  }
}

TEST_F(Gpu, F32IsBitIdenticalToTheCpu) {
  // f32 originals run the CPU's canonical sequential FMA chain on the GPU: same bits as the CPU's exact path.
  Context gpu(Options("cuda"));
  Context cpu(Options("cpu"));
  for (uint32_t dim : {7u, 64u, 128u, 300u}) {
    auto rng = Rng(100 + dim);
    const TokenSets q = Generate(rng, Shape::kUnitGaussian, 3, 0, 40, dim);
    const TokenSets d = Generate(rng, Shape::kClustered, 25, 0, 60, dim);
    Packed pq = Packed::Pack(gpu, q.Dense());
    Packed pd = Packed::Pack(gpu, d.Dense());
    for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
      for (maxsim_mode mode : {MAXSIM_MODE_EXACT, MAXSIM_MODE_CERTIFIED}) {
        const Matrix g = ScoreMatrix(gpu, pq, q.n_sets(), q.rows(), pd, d.n_sets(), metric, mode);
        const Matrix c = ScoreMatrix(cpu, pq, q.n_sets(), q.rows(), pd, d.n_sets(), metric, mode);
        ExpectIdentical(g, c, "f32 dim " + std::to_string(dim) + " GPU vs CPU");
      }
    }
  }
}

TEST_F(Gpu, ManyPairsPipelineKernel) {
  // Enough short-query pairs to engage the per-warp cp.async pipeline kernel (>= 2 x resident warps): it must
  // equal the one-pair-per-warp kernel bit for bit (same arithmetic), the reference, and certified.
  Context gpu(Options("cuda"));
  for (uint32_t dim : {128u, 64u, 96u}) {
    auto rng = Rng(150 + dim);
    const TokenSets q = Encoded(Generate(rng, Shape::kUnitGaussian, 2, 1, 32, dim), MAXSIM_BF16);
    const TokenSets d = Encoded(Generate(rng, Shape::kClustered, 1700, 0, 90, dim), MAXSIM_BF16);
    Packed pq = Packed::Pack(gpu, q.Dense());
    Packed pd = Packed::Pack(gpu, d.Dense());
    for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
      const std::string what = "pipeline dim " + std::to_string(dim) + (metric == MAXSIM_METRIC_DOT ? " dot" : " cosine");
      const Matrix pipe = ScoreMatrix(gpu, pq, q.n_sets(), q.rows(), pd, d.n_sets(), metric, MAXSIM_MODE_EXACT);
      const Matrix plain = WithEnv("MAXSIM_CUDA_NO_PIPE", "1", [&](Context& gpu) {
        return ScoreMatrix(gpu, pq, q.n_sets(), q.rows(), pd, d.n_sets(), metric, MAXSIM_MODE_EXACT);
      });
      ExpectIdentical(pipe, plain, what + " vs one pair per warp");
      ExpectReference(q, d, metric, pipe, what, 500);
      maxsim_stats st_pipe{}, st_plain{};
      const Matrix cert =
          ScoreMatrix(gpu, pq, q.n_sets(), q.rows(), pd, d.n_sets(), metric, MAXSIM_MODE_CERTIFIED, &st_pipe);
      ExpectIdentical(cert, pipe, what + " certified vs exact");
      // The screening kernel's per-warp ring (ScreenPipeKernel) against its one-pair-per-warp kernel: the same
      // candidate sets (so the same refinement counts) and the same bits, certified and approximate.
      const Matrix approx = ScoreMatrix(gpu, pq, q.n_sets(), q.rows(), pd, d.n_sets(), metric, MAXSIM_MODE_APPROXIMATE);
      Context no_ring = CudaContextWithEnv("MAXSIM_CUDA_NO_SCREEN_PIPE", "1");
      const Matrix cert_plain =
          ScoreMatrix(no_ring, pq, q.n_sets(), q.rows(), pd, d.n_sets(), metric, MAXSIM_MODE_CERTIFIED, &st_plain);
      const Matrix approx_plain =
          ScoreMatrix(no_ring, pq, q.n_sets(), q.rows(), pd, d.n_sets(), metric, MAXSIM_MODE_APPROXIMATE);
      ExpectIdentical(cert, cert_plain, what + " certified: screening ring vs one pair per warp");
      ExpectIdentical(approx, approx_plain, what + " approximate: screening ring vs one pair per warp");
      if (kScreenCertified) {
        EXPECT_GT(st_pipe.refined, 0u) << what;
        EXPECT_EQ(st_pipe.refined, st_plain.refined) << what;
        EXPECT_EQ(st_pipe.multi_candidate, st_plain.multi_candidate) << what;
      }
      for (uint64_t j = 0; j < 300; ++j) {
        const RefPair ref = Reference(q, 0, d, j, metric);
        const float a = approx.scores[j];
        if (!std::isinf(a)) ASSERT_LE(static_cast<double>(a), ref.score + 2 * ref.tolerance) << what << " approx doc " << j;
      }
    }
  }
}

TEST_F(Gpu, LongQueriesAndDocuments) {
  Context gpu(Options("cuda"));
  for (uint64_t lq : {300ull, 1024ull}) {
    auto rng = Rng(200 + lq);
    const TokenSets q = Encoded(Generate(rng, Shape::kUnitGaussian, 2, lq - 7, lq, 128), MAXSIM_BF16);
    const TokenSets d = Encoded(Generate(rng, Shape::kClustered, 5, 900, 2100, 128), MAXSIM_BF16);
    Packed pq = Packed::Pack(gpu, q.Dense());
    Packed pd = Packed::Pack(gpu, d.Dense());
    const Matrix exact = ScoreMatrix(gpu, pq, q.n_sets(), q.rows(), pd, d.n_sets(), MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT);
    ExpectReference(q, d, MAXSIM_METRIC_DOT, exact, "Lq " + std::to_string(lq));
    const Matrix cert = ScoreMatrix(gpu, pq, q.n_sets(), q.rows(), pd, d.n_sets(), MAXSIM_METRIC_DOT, MAXSIM_MODE_CERTIFIED);
    ExpectIdentical(cert, exact, "Lq " + std::to_string(lq) + " certified vs exact");
  }
}

// Scores only (no argmax requested): the request the wgmma long-query kernel serves on sm_90 devices.
std::vector<float> ScoreValues(Context& ctx, const Sets& q, uint64_t nq, const Sets& d, uint64_t nd,
                               maxsim_metric metric, maxsim_mode mode) {
  ScoreOptions o;
  o.metric = metric;
  o.mode = mode;
  return ctx.ScoreMatrix(q, nq, d, nd, o);
}

// The same on dense device tensors (masks reach the kernels: host dense inputs are packed without masked rows).
std::vector<float> DeviceScoreValues(Context& ctx, const DeviceSets& q, const DeviceSets& d, maxsim_metric metric) {
  Dev<float> out(q.s.n_sets * d.s.n_sets);
  maxsim_score_options o;
  maxsim_score_options_init(&o);
  o.metric = metric;
  maxsim_sets qs{nullptr, &q.s}, ds{nullptr, &d.s};
  EXPECT_EQ(maxsim_score_matrix(ctx.get(), &qs, &ds, &o, out.p, nullptr), MAXSIM_OK) << maxsim_last_error();
  return out.Down();
}

// Masked dense device tensors (bf16 and f16, dot and cosine; the query and document masks reach the kernels):
// scores only must have the same bits as with the environment variable name=value (the kernel it replaces), and
// each must be within the float64 reference's bound, as must the argmax path's.
void ExpectMaskedDeviceValues(Context& gpu, uint64_t& salt, uint64_t nq, uint64_t lq_min, uint64_t lq_max,
                              uint64_t nd, uint64_t ld_max, const char* name, const char* value,
                              const std::string& label) {
  for (maxsim_dtype dtype : {MAXSIM_BF16, MAXSIM_F16}) {
    auto rng = Rng(++salt);
    TokenSets q = Encoded(Generate(rng, Shape::kUnitGaussian, nq, lq_min, lq_max, 128), dtype);
    TokenSets d = Encoded(Generate(rng, Shape::kClustered, nd, 0, ld_max, 128), dtype);
    RandomMask(rng, q, 0.2);
    RandomMask(rng, d, 0.35);
    const DeviceSets dq(q), dd(d);
    for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
      const std::string what = label + " dtype " + std::to_string(dtype) + (metric == MAXSIM_METRIC_DOT ? " dot" : " cosine");
      const std::vector<float> values = DeviceScoreValues(gpu, dq, dd, metric);
      const std::vector<float> other = WithEnv(name, value, [&](Context& gpu) {
        return DeviceScoreValues(gpu, dq, dd, metric);
      });
      ExpectSameBits(values, other, what + " vs " + name + "=" + value);
      const Matrix ref = ScoreMatrix(gpu, q.Dense(), q.n_sets(), q.rows(), d.Dense(), d.n_sets(), metric,
                                     MAXSIM_MODE_EXACT);
      ExpectReference(q, d, metric, ref, what + " reference");
      for (size_t i = 0; i < values.size(); ++i) {
        const uint64_t qi = i / d.n_sets(), dj = i % d.n_sets();
        const std::string err = CheckPair(q, qi, d, dj, metric, values[i], nullptr);
        ASSERT_TRUE(err.empty()) << what << " query " << qi << " doc " << dj << ": " << err;
      }
    }
  }
}

// Whether device 0 is the sm_90 GPU that the Hopper-only (wgmma) kernels need; elsewhere prints that `what` does
// not run here, so that a run on another GPU says which comparisons it made.
bool Sm90(const char* what) {
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  if (major == 9 && minor == 0) return true;
  std::printf("gpu tests: compute capability %d.%d: %s\n", major, minor, what);
  return false;
}

// One case of the kernel-agreement tests below: nq queries of lq_min..lq_max tokens and nd documents of
// ld_min..ld_max tokens drawn with `shape`, encoded as dtype; zero_rows sets every 7th query row and all of document
// 1 to zero first (int8 scale 0: every token a screening candidate); signed makes every query value non-negative
// and every value of the odd documents non-positive (all their similarities <= 0: row maxima below zero).
struct KernelCase {
  maxsim_dtype dtype;
  uint32_t dim;
  uint64_t nq, lq_min, lq_max, nd, ld_min, ld_max;
  Shape shape;
  bool zero_rows = false;
  bool signed_sets = false;
};

// fn(q, d, pq, pd, metric, what) for every case and metric: each case's data drawn afresh (Rng(++*salt)) and packed;
// `what` names the case and the metric. Stops at the first fatal failure.
template <typename F>
void ForEachKernelCase(Context& gpu, const std::vector<KernelCase>& cases, std::initializer_list<maxsim_metric> metrics,
                       uint64_t* salt, F&& fn) {
  for (const KernelCase& c : cases) {
    auto rng = Rng(++*salt);
    TokenSets q0 = Generate(rng, c.shape, c.nq, c.lq_min, c.lq_max, c.dim);
    TokenSets d0 = Generate(rng, c.shape, c.nd, c.ld_min, c.ld_max, c.dim);
    if (c.zero_rows) {
      for (uint64_t r = 0; r < q0.rows(); r += 7) std::fill_n(q0.values.begin() + r * c.dim, c.dim, 0.0);
      for (uint64_t r = d0.offsets[1]; r < d0.offsets[2]; ++r) std::fill_n(d0.values.begin() + r * c.dim, c.dim, 0.0);
    }
    if (c.signed_sets) {
      for (auto& v : q0.values) v = std::fabs(v);
      for (uint64_t j = 0; j < d0.n_sets(); ++j) {
        for (uint64_t i = d0.offsets[j] * c.dim; i < d0.offsets[j + 1] * c.dim; ++i) {
          d0.values[i] = j % 2 ? -std::fabs(d0.values[i]) : std::fabs(d0.values[i]);
        }
      }
    }
    const TokenSets q = Encoded(q0, c.dtype), d = Encoded(d0, c.dtype);
    Packed pq = Packed::Pack(gpu, q.Dense());
    Packed pd = Packed::Pack(gpu, d.Dense());
    for (maxsim_metric metric : metrics) {
      const std::string what = "dtype " + std::to_string(c.dtype) + " dim " + std::to_string(c.dim) + " Nq " +
                               std::to_string(c.nq) + " Lq " + std::to_string(c.lq_min) + ".." +
                               std::to_string(c.lq_max) + " Nd " + std::to_string(c.nd) + " Ld " +
                               std::to_string(c.ld_min) + ".." + std::to_string(c.ld_max) + " " + ShapeName(c.shape) +
                               (c.zero_rows ? " zero rows" : "") + (c.signed_sets ? " signed" : "") + (metric == MAXSIM_METRIC_DOT ? " dot" : " cosine");
      fn(q, d, pq, pd, metric, what);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

// Scores only (the request the kernel under test serves) must have the bits of the same request with the
// environment variable name=value (the kernels it replaces), of the request with argmax (served by the pair
// kernels, checked against the float64 reference) and of certified mode (screening's refinement). Returns them.
std::vector<float> ExpectKernelAgreement(Context& gpu, const TokenSets& q, const TokenSets& d, const Packed& pq,
                                         const Packed& pd, maxsim_metric metric, const char* name, const char* value,
                                         const std::string& what) {
  const Matrix with_argmax = ScoreMatrix(gpu, pq, q.n_sets(), q.rows(), pd, d.n_sets(), metric, MAXSIM_MODE_EXACT);
  ExpectReference(q, d, metric, with_argmax, what + " (with argmax)");
  const std::vector<float> values = ScoreValues(gpu, pq, q.n_sets(), pd, d.n_sets(), metric, MAXSIM_MODE_EXACT);
  const std::vector<float> other = WithEnv(name, value, [&](Context& gpu) {
    return ScoreValues(gpu, pq, q.n_sets(), pd, d.n_sets(), metric, MAXSIM_MODE_EXACT);
  });
  ExpectSameBits(values, other, what + " scores only vs " + name + "=" + value);
  ExpectSameBits(values, with_argmax.scores, what + " scores only vs with argmax");
  const std::vector<float> cert = ScoreValues(gpu, pq, q.n_sets(), pd, d.n_sets(), metric, MAXSIM_MODE_CERTIFIED);
  ExpectSameBits(cert, values, what + " certified vs exact");
  return values;
}

TEST_F(Gpu, LongQueryWgmmaKernelEqualsMmaSync) {
  // Long queries (more than 64 rows, 96 < dim <= 128) asked for scores only run the wgmma kernel on an sm_90
  // device. Its scores must be the mma.sync kernels' bits: the long-query mma.sync kernel (MAXSIM_CUDA_WGMMA=0),
  // the same request with argmax (which that kernel serves, checked against the float64 reference) and certified
  // screening's refinement. Ragged and empty documents, lengths off the 128-token stage, partial row blocks,
  // dot and cosine, bf16 and f16, masked device tensors.
  Context gpu(Options("cuda"));
  const std::string report = gpu.Report();
  // The suite forces screening (kScreenCertified), and the report says so.
  EXPECT_NE(report.find("certified and approximate: int8 screening (forced, set by MAXSIM_CUDA_CERTIFIED=screen)"),
            std::string::npos)
      << report;
  if (Sm90("the wgmma kernel does not run here; comparing mma.sync paths")) {
    EXPECT_NE(report.find("long queries: wgmma kernel"), std::string::npos) << report;
  }
  const std::vector<KernelCase> cases = {
      {MAXSIM_BF16, 128, 3, 65, 128, 14, 0, 700, Shape::kUnitGaussian},
      {MAXSIM_BF16, 128, 3, 129, 256, 14, 0, 700, Shape::kClustered},
      {MAXSIM_F16, 104, 3, 129, 300, 14, 0, 700, Shape::kGaussian},
      {MAXSIM_BF16, 128, 3, 1000, 1024, 14, 0, 700, Shape::kClustered},
      {MAXSIM_BF16, 120, 3, 300, 520, 14, 0, 700, Shape::kNearTies},
      {MAXSIM_BF16, 128, 3, 90, 128, 14, 0, 700, Shape::kLargeNorm},
      {MAXSIM_BF16, 112, 3, 257, 700, 14, 0, 700, Shape::kDuplicates},
      {MAXSIM_BF16, 128, 3, 200, 600, 8, 100, 700, Shape::kUnitGaussian, false, true},
      // 80 pairs of 4 row groups, documents of 0..3 tiles.
      {MAXSIM_BF16, 128, 2, 700, 1024, 40, 0, 300, Shape::kUnitGaussian},
  };
  uint64_t salt = 700;
  ForEachKernelCase(gpu, cases, {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}, &salt,
                    [&](const TokenSets& q, const TokenSets& d, const Packed& pq, const Packed& pd,
                        maxsim_metric metric, const std::string& what) {
    const std::vector<float> values =
        ExpectKernelAgreement(gpu, q, d, pq, pd, metric, "MAXSIM_CUDA_WGMMA", "0", what);
    // The kernel's other settings: row maxima by FMNMX pairs, copies by cp.async instead of bulk tensor copies.
    for (const auto& [name, value] : {std::pair<const char*, const char*>{"MAXSIM_CUDA_WGMMA_INT_FOLD", "0"},
                                      std::pair<const char*, const char*>{"MAXSIM_CUDA_WGMMA_TMA", "0"}}) {
      const std::vector<float> other = WithEnv(name, value, [&](Context& gpu) {
        return ScoreValues(gpu, pq, q.n_sets(), pd, d.n_sets(), metric, MAXSIM_MODE_EXACT);
      });
      ExpectSameBits(values, other, what + " vs " + name + "=" + value);
    }
  });
  // Masked dense device tensors: the document mask and query mask reach the kernel.
  ExpectMaskedDeviceValues(gpu, salt, 3, 100, 400, 10, 500, "MAXSIM_CUDA_WGMMA", "0", "masked device tensors");
}

TEST_F(Gpu, QueryBatchKernelEqualsPairKernels) {
  // Several queries of at most 128 tokens asked for scores only run the wgmma batch kernel on an sm_90 device:
  // one block holds a group of whole queries and reads each document tile once for all of them. Its scores must
  // be the per-pair kernels' bits (MAXSIM_CUDA_NO_BATCH=1; the same request with argmax, which the pair kernels
  // serve and which is checked against the float64 reference; certified screening's refinement) and top-k over a
  // resident corpus must rank by them. Ragged and empty queries and documents, slots of 16..128 rows (full and
  // partial groups, unused rows), documents around the 64- and 128-token tile widths (1-token documents, lengths
  // either side of 128, last tiles either side of 64 tokens), queries of different lengths in one batch, dot and
  // cosine, bf16 and f16, dims 104..128, masked device tensors; blocks whose items (row group, document) start or
  // end inside a group's document range and cross into the next group or range, ranges of unequal length, fewer
  // items than blocks; and the batch kernel's other schedules (MAXSIM_CUDA_BATCH_AHEAD=1 and 3,
  // MAXSIM_CUDA_BATCH_ROWS=128, MAXSIM_CUDA_BATCH_SPREAD=1: one row group per block, MAXSIM_CUDA_BATCH_TMA=0: every
  // thread's cp.async copies instead of bulk tensor copies) against its default, bit for bit.
  Context gpu(Options("cuda"));
  if (Sm90("the batch kernel does not run here; comparing pair kernels")) {
    const std::string report = gpu.Report();
    EXPECT_NE(report.find("query batches: wgmma batch kernel"), std::string::npos) << report;
  }
  const std::vector<KernelCase> cases = {
      {MAXSIM_BF16, 128, 64, 32, 32, 40, 0, 300, Shape::kUnitGaussian},  // 8 full groups of 8 queries
      {MAXSIM_F16, 104, 9, 0, 16, 30, 1, 200, Shape::kClustered},        // 16-row slots, empty queries
      {MAXSIM_BF16, 120, 2, 1, 32, 50, 100, 160, Shape::kNearTies},     // one 128-row group
      {MAXSIM_BF16, 128, 5, 33, 64, 25, 0, 700, Shape::kDuplicates},    // 64-row slots, two groups
      {MAXSIM_BF16, 128, 3, 100, 128, 12, 60, 140, Shape::kLargeNorm},  // 128-row slots
      {MAXSIM_BF16, 112, 17, 20, 48, 30, 63, 65, Shape::kGaussian},     // 48-row slots: 16 unused rows a group
      {MAXSIM_F16, 128, 16, 32, 32, 20, 1000, 1030, Shape::kUnitGaussian},
      {MAXSIM_BF16, 128, 12, 1, 32, 40, 1, 1, Shape::kGaussian},        // 1-token documents
      {MAXSIM_BF16, 128, 20, 5, 64, 60, 120, 136, Shape::kNearTies},    // ending just before or after a whole tile
      {MAXSIM_F16, 128, 8, 32, 32, 50, 188, 196, Shape::kUnitGaussian},  // last tiles of 60..68 tokens
      // 8 groups over 200 documents on 132 SMs: 132 blocks of 12 or 13 items across ranges of 7 documents (the
      // last of 4), two groups per range and block, empty documents among them.
      {MAXSIM_BF16, 128, 64, 1, 32, 200, 0, 24, Shape::kGaussian},
      {MAXSIM_BF16, 128, 16, 20, 32, 30, 50, 300, Shape::kUnitGaussian, false, true},  // row maxima below zero
  };
  uint64_t salt = 900;
  ForEachKernelCase(gpu, cases, {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}, &salt,
                    [&](const TokenSets& q, const TokenSets& d, const Packed& pq, const Packed& pd,
                        maxsim_metric metric, const std::string& what) {
    const std::vector<float> values =
        ExpectKernelAgreement(gpu, q, d, pq, pd, metric, "MAXSIM_CUDA_NO_BATCH", "1", what);
    // The batch kernel's other schedules: 1 or 3 stages copied ahead, 128-row groups, one row group per block,
    // cp.async copies.
    const std::pair<const char*, const char*> schedules[] = {
        {"MAXSIM_CUDA_BATCH_AHEAD", "1"}, {"MAXSIM_CUDA_BATCH_AHEAD", "3"}, {"MAXSIM_CUDA_BATCH_ROWS", "128"},
        {"MAXSIM_CUDA_BATCH_SPREAD", "1"}, {"MAXSIM_CUDA_BATCH_TMA", "0"}};
    for (const auto& [name, value] : schedules) {
      const std::vector<float> other = WithEnv(name, value, [&](Context& gpu) {
        return ScoreValues(gpu, pq, q.n_sets(), pd, d.n_sets(), metric, MAXSIM_MODE_EXACT);
      });
      ExpectSameBits(values, other, what + " batch vs " + name + "=" + value);
    }
    if (::testing::Test::HasFatalFailure()) return;
    // Top-k over the resident corpus for the whole batch: the batch scores' k best, same bits.
    const uint64_t k = 7;
    ScoreOptions o;
    o.metric = metric;
    o.mode = MAXSIM_MODE_EXACT;
    TopKResult top = gpu.TopK(pq, q.n_sets(), pd, k, o);
    const uint64_t kk = std::min<uint64_t>(k, d.n_sets());
    for (uint64_t i = 0; i < q.n_sets(); ++i) {
      const std::vector<uint64_t> order = RankDescending(values.data() + i * d.n_sets(), d.n_sets());
      for (uint64_t r = 0; r < kk; ++r) {
        ASSERT_EQ(top.index[i * k + r], order[r]) << what << " top-k query " << i << " rank " << r;
        ASSERT_EQ(0, std::memcmp(&top.scores[i * k + r], &values[i * d.n_sets() + order[r]], 4)) << what;
      }
    }
  });
  // Masked dense device tensors: the query and document masks reach the batch kernel.
  ExpectMaskedDeviceValues(gpu, salt, 6, 0, 32, 15, 260, "MAXSIM_CUDA_NO_BATCH", "1", "batch, masked device tensors");
}

TEST_F(Gpu, CertifiedWgmmaScreeningEqualsExact) {
  // Certified requests for long queries on an sm_90 device screen with int8 wgmma over per-document-scale codes
  // (screen_wgmma.cu) and refine exactly: the scores must be the exact kernel's bits. Random, clustered, near-tie,
  // duplicate, large-norm and zero-vector data; ragged and empty documents; query lengths off the 256-row group;
  // bf16 and f16; dims 104..128. Also: tiny candidate lists (MAXSIM_CUDA_SCREEN_WGMMA_CAP=1: most tasks overflow
  // and are refined over every token), short queries forced onto the kernel (MAXSIM_CUDA_SCREEN_WGMMA_MIN_LQ=1),
  // the kernel switched off (MAXSIM_CUDA_SCREEN_WGMMA=0: the mma.sync screening kernel) and certified top-k.
  Context gpu(Options("cuda"));
  Sm90("the wgmma screening kernel does not run here");
  const std::vector<KernelCase> cases = {
      {MAXSIM_BF16, 128, 3, 256, 1100, 12, 0, 600, Shape::kUnitGaussian},
      {MAXSIM_BF16, 128, 3, 300, 600, 12, 0, 600, Shape::kClustered},
      {MAXSIM_F16, 104, 3, 256, 520, 12, 0, 600, Shape::kGaussian},
      {MAXSIM_BF16, 120, 3, 256, 400, 12, 0, 600, Shape::kNearTies},
      {MAXSIM_BF16, 112, 3, 257, 700, 12, 0, 600, Shape::kDuplicates},
      {MAXSIM_BF16, 128, 3, 256, 300, 12, 0, 600, Shape::kLargeNorm, true},
  };
  uint64_t salt = 900;
  ForEachKernelCase(gpu, cases, {MAXSIM_METRIC_DOT}, &salt,
                    [&](const TokenSets& q, const TokenSets& d, const Packed& pq, const Packed& pd,
                        maxsim_metric metric, const std::string& what) {
    const std::vector<float> exact = ScoreValues(gpu, pq, q.n_sets(), pd, d.n_sets(), metric, MAXSIM_MODE_EXACT);
    for (uint64_t i = 0; i < q.n_sets(); ++i) {
      for (uint64_t j = 0; j < d.n_sets(); ++j) {
        const std::string err = CheckPair(q, i, d, j, metric, exact[i * d.n_sets() + j], nullptr);
        ASSERT_TRUE(err.empty()) << what << " exact query " << i << " doc " << j << ": " << err;
      }
    }
    maxsim_stats st{};
    ScoreOptions o;
    o.metric = metric;
    o.mode = MAXSIM_MODE_CERTIFIED;
    o.stats = &st;
    const std::vector<float> cert = gpu.ScoreMatrix(pq, q.n_sets(), pd, d.n_sets(), o);
    ExpectSameBits(cert, exact, what + " certified vs exact");
    EXPECT_GT(st.refined, 0u) << what;
    const std::vector<float> tiny = WithEnv("MAXSIM_CUDA_SCREEN_WGMMA_CAP", "1", [&](Context& gpu) {
      return ScoreValues(gpu, pq, q.n_sets(), pd, d.n_sets(), metric, MAXSIM_MODE_CERTIFIED);
    });
    ExpectSameBits(tiny, exact, what + " certified with 1-record-per-row candidate lists vs exact");
    const std::vector<float> old = WithEnv("MAXSIM_CUDA_SCREEN_WGMMA", "0", [&](Context& gpu) {
      return ScoreValues(gpu, pq, q.n_sets(), pd, d.n_sets(), metric, MAXSIM_MODE_CERTIFIED);
    });
    ExpectSameBits(old, exact, what + " certified (mma.sync screening) vs exact");
    if (::testing::Test::HasFatalFailure()) return;
    // Certified top-k: the exact matrix's k best, same bits.
    o.stats = nullptr;
    TopKResult top = gpu.TopK(pq, q.n_sets(), pd, 5, o);
    for (uint64_t i = 0; i < q.n_sets(); ++i) {
      const std::vector<uint64_t> order = RankDescending(exact.data() + i * d.n_sets(), d.n_sets());
      for (uint64_t r = 0; r < 5; ++r) {
        ASSERT_EQ(top.index[i * 5 + r], order[r]) << what << " top-k query " << i << " rank " << r;
        ASSERT_EQ(0, std::memcmp(&top.scores[i * 5 + r], &exact[i * d.n_sets() + order[r]], 4)) << what;
      }
    }
  });
  // Short queries forced onto the kernel: most of each 256-row group is past the query.
  Context short_gpu = CudaContextWithEnv("MAXSIM_CUDA_SCREEN_WGMMA_MIN_LQ", "1");
  for (maxsim_dtype dtype : {MAXSIM_BF16, MAXSIM_F16}) {
    Context& gpu = short_gpu;
    auto rng = Rng(++salt);
    const TokenSets q = Encoded(Generate(rng, Shape::kUnitGaussian, 5, 0, 70, 128), dtype);
    const TokenSets d = Encoded(Generate(rng, Shape::kClustered, 20, 0, 300, 128), dtype);
    Packed pq = Packed::Pack(gpu, q.Dense());
    Packed pd = Packed::Pack(gpu, d.Dense());
    const std::vector<float> exact = ScoreValues(gpu, pq, q.n_sets(), pd, d.n_sets(), MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT);
    const std::vector<float> cert = ScoreValues(gpu, pq, q.n_sets(), pd, d.n_sets(), MAXSIM_METRIC_DOT, MAXSIM_MODE_CERTIFIED);
    ExpectSameBits(cert, exact, "short queries dtype " + std::to_string(dtype) + " certified vs exact");
  }
}

TEST_F(Gpu, AdversarialNearTies) {
  Context gpu(Options("cuda"));
  for (double spread : {1e-2, 1e-4, 1e-6, 0.0}) {
    for (maxsim_dtype dtype : {MAXSIM_BF16, MAXSIM_F16, MAXSIM_F32}) {
      auto rng = Rng(300 + static_cast<uint64_t>(dtype) * 10 + static_cast<uint64_t>(-std::log10(spread + 1e-300)));
      const TokenSets q0 = Generate(rng, Shape::kUnitGaussian, 3, 1, 32, 128);
      const TokenSets q = Encoded(q0, dtype);
      const TokenSets d = Encoded(NearTieDocuments(rng, q, 20, 150, spread), dtype);
      Packed pq = Packed::Pack(gpu, q.Dense());
      Packed pd = Packed::Pack(gpu, d.Dense());
      const std::string what = "spread " + std::to_string(spread) + " dtype " + std::to_string(dtype);
      for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
        const Matrix exact = ScoreMatrix(gpu, pq, q.n_sets(), q.rows(), pd, d.n_sets(), metric, MAXSIM_MODE_EXACT);
        ExpectReference(q, d, metric, exact, what);
        maxsim_stats st{};
        const Matrix cert = ScoreMatrix(gpu, pq, q.n_sets(), q.rows(), pd, d.n_sets(), metric, MAXSIM_MODE_CERTIFIED, &st);
        ExpectIdentical(cert, exact, what + " certified vs exact");
        EXPECT_GT(st.refined, 0u);
      }
    }
  }
}

TEST_F(Gpu, CandidatesPairsAndTopK) {
  Context gpu(Options("cuda"));
  auto rng = Rng(400);
  const TokenSets q = Encoded(Generate(rng, Shape::kUnitGaussian, 5, 0, 40, 128), MAXSIM_BF16);
  const TokenSets d = Encoded(Generate(rng, Shape::kClustered, 60, 0, 90, 128), MAXSIM_BF16);
  std::vector<uint64_t> ids(d.n_sets());
  for (uint64_t j = 0; j < ids.size(); ++j) ids[j] = 1000 + 7 * j;
  Packed pq = Packed::Pack(gpu, q.Dense());
  Packed pd = Packed::Pack(gpu, d.Dense(), ids.data());
  // Candidate lists with repeats and an empty list.
  std::vector<uint64_t> off = {0}, cand;
  std::uniform_int_distribution<uint64_t> pick(0, d.n_sets() - 1);
  for (uint64_t i = 0; i < q.n_sets(); ++i) {
    const uint64_t k = i == 2 ? 0 : 1 + rng() % 12;
    for (uint64_t c = 0; c < k; ++c) cand.push_back(pick(rng));
    off.push_back(cand.size());
  }
  for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
    const Matrix full = ScoreMatrix(gpu, pq, q.n_sets(), q.rows(), pd, d.n_sets(), metric, MAXSIM_MODE_EXACT);
    for (maxsim_mode mode : {MAXSIM_MODE_EXACT, MAXSIM_MODE_CERTIFIED}) {
      ScoreOptions o;
      o.metric = metric;
      o.mode = mode;
      std::vector<float> sc(cand.size(), std::nanf(""));
      uint64_t am_size = 0;
      for (uint64_t i = 0; i < q.n_sets(); ++i) am_size += (off[i + 1] - off[i]) * q.length(i);
      std::vector<int32_t> am(am_size, -7);
      gpu.ScoreCandidates(pq, pd, off, cand, sc, o, am.data());
      uint64_t base = 0;
      for (uint64_t i = 0; i < q.n_sets(); ++i) {
        for (uint64_t c = off[i]; c < off[i + 1]; ++c) {
          const uint64_t j = cand[c];
          // Same kernel arithmetic as the matrix: identical bits.
          ASSERT_EQ(0, std::memcmp(&sc[c], &full.scores[i * d.n_sets() + j], 4)) << "candidate " << c;
          const int32_t* a = am.data() + base + (c - off[i]) * q.length(i);
          const int32_t* b = full.argmax.data() + d.n_sets() * q.offsets[i] + j * q.length(i);
          for (uint64_t s = 0; s < q.length(i); ++s) ASSERT_EQ(a[s], b[s]);
          const std::string err = CheckPair(q, i, d, j, metric, sc[c], a);
          ASSERT_TRUE(err.empty()) << err;
        }
        base += (off[i + 1] - off[i]) * q.length(i);
      }
      // Top-k: the k best of the GPU's own matrix (score descending, ties to the lower index), same bits.
      for (uint64_t k : {1ull, 7ull, 75ull}) {
        TopKResult top = gpu.TopK(pq, q.n_sets(), pd, k, o, true);
        for (uint64_t i = 0; i < q.n_sets(); ++i) {
          const float* row = full.scores.data() + i * d.n_sets();
          const std::vector<uint64_t> order = RankDescending(row, d.n_sets());
          for (uint64_t r = 0; r < k; ++r) {
            if (r < d.n_sets()) {
              ASSERT_EQ(top.index[i * k + r], order[r]) << "query " << i << " rank " << r << " k " << k;
              ASSERT_EQ(0, std::memcmp(&top.scores[i * k + r], &row[order[r]], 4));
              ASSERT_EQ(top.ids[i * k + r], ids[order[r]]);
            } else {
              ASSERT_EQ(top.index[i * k + r], UINT64_MAX);
              ASSERT_TRUE(std::isinf(top.scores[i * k + r]) && top.scores[i * k + r] < 0);
            }
          }
        }
      }
    }
  }
  // Pairs (query i against document i).
  const TokenSets d5 = Encoded(Generate(rng, Shape::kClustered, q.n_sets(), 0, 50, 128), MAXSIM_BF16);
  Packed pd5 = Packed::Pack(gpu, d5.Dense());
  std::vector<float> ps(q.n_sets());
  std::vector<int32_t> pa(q.rows(), -7);
  gpu.ScorePairs(pq, pd5, ps, {}, pa.data());
  for (uint64_t i = 0; i < q.n_sets(); ++i) {
    const std::string err = CheckPair(q, i, d5, i, MAXSIM_METRIC_DOT, ps[i], pa.data() + q.offsets[i]);
    ASSERT_TRUE(err.empty()) << "pair " << i << ": " << err;
  }
}

TEST_F(Gpu, MaskedDenseHostInputsKeepPositions) {
  // Dense host inputs with masks are packed without the masked rows; the argmax must still be positions.
  Context gpu(Options("cuda"));
  auto rng = Rng(450);
  TokenSets q = Encoded(Generate(rng, Shape::kUnitGaussian, 4, 0, 30, 64), MAXSIM_BF16);
  TokenSets d = Encoded(Generate(rng, Shape::kGaussian, 20, 0, 60, 64), MAXSIM_BF16);
  RandomMask(rng, q, 0.3);
  RandomMask(rng, d, 0.4);
  const Matrix m = ScoreMatrix(gpu, q.Dense(), q.n_sets(), q.rows(), d.Dense(), d.n_sets(), MAXSIM_METRIC_DOT,
                               MAXSIM_MODE_EXACT);
  ExpectReference(q, d, MAXSIM_METRIC_DOT, m, "masked dense host");
}

TEST_F(Gpu, StreamedCorpusEqualsResident) {
  // A corpus streamed in chunks of 64 KB (several per call) against the same corpus resident: the same bits in every
  // mode and operation. Ragged sets find their rows through the offsets, sets of one length (queries and documents
  // of 96 tokens) through that length: a chunk's view takes the rows before its first document off again
  // (RowsFromChunkStart).
  Context resident(Options("cuda"));
  Context streamed = [] {
    ScopedEnv stream("MAXSIM_CUDA_STREAM", "1"), chunk("MAXSIM_CUDA_STREAM_CHUNK_BYTES", "65536");
    return Context(Options("cuda"));
  }();
  auto rng = Rng(500);
  for (const bool uniform : {false, true}) {
    const std::string what = uniform ? "sets of one length" : "ragged sets";
    const TokenSets q = uniform ? Encoded(Generate(rng, Shape::kUnitGaussian, 3, 32, 32, 128), MAXSIM_BF16)
                                : Encoded(Generate(rng, Shape::kUnitGaussian, 3, 0, 40, 128), MAXSIM_BF16);
    const TokenSets d = uniform ? Encoded(Generate(rng, Shape::kClustered, 300, 96, 96, 128), MAXSIM_BF16)
                                : Encoded(Generate(rng, Shape::kClustered, 300, 0, 120, 128), MAXSIM_BF16);
    Packed pq = Packed::Pack(resident, q.Dense());
    Packed pd = Packed::Pack(resident, d.Dense());
    std::vector<uint64_t> off = {0, 5, 5, 17}, cand;
    for (int c = 0; c < 17; ++c) cand.push_back(rng() % d.n_sets());
    for (maxsim_mode mode : {MAXSIM_MODE_EXACT, MAXSIM_MODE_CERTIFIED, MAXSIM_MODE_APPROXIMATE}) {
      const std::string m = what + ", mode " + std::to_string(mode);
      const Matrix a = ScoreMatrix(resident, pq, q.n_sets(), q.rows(), pd, d.n_sets(), MAXSIM_METRIC_DOT, mode);
      const Matrix b = ScoreMatrix(streamed, pq, q.n_sets(), q.rows(), pd, d.n_sets(), MAXSIM_METRIC_DOT, mode);
      ExpectIdentical(a, b, "streamed matrix, " + m);
      if (mode == MAXSIM_MODE_EXACT) ExpectReference(q, d, MAXSIM_METRIC_DOT, b, "streamed, " + what);
      ScoreOptions o;
      o.mode = mode;
      std::vector<float> ca(cand.size()), cb(cand.size());
      resident.ScoreCandidates(pq, pd, off, cand, ca, o);
      streamed.ScoreCandidates(pq, pd, off, cand, cb, o);
      ASSERT_EQ(0, std::memcmp(ca.data(), cb.data(), ca.size() * 4)) << m;
      TopKResult ta = resident.TopK(pq, q.n_sets(), pd, 9, o);
      TopKResult tb = streamed.TopK(pq, q.n_sets(), pd, 9, o);
      ASSERT_EQ(ta.index, tb.index) << m;
      ASSERT_EQ(0, std::memcmp(ta.scores.data(), tb.scores.data(), ta.scores.size() * 4)) << m;
    }
  }
}

// ---- dense device tensors: training forward and backward --------------------------------------------------

struct DenseCase {
  maxsim_dtype dtype;
  uint32_t dim;
  bool masks;
  uint64_t lead;
  uint32_t pad;
};

// Forward on device tensors in the given layout; returns scores and argmax (host copies).
Matrix DeviceForward(Context& gpu, const DeviceSets& q, const DeviceSets& d, maxsim_layout layout,
                     const std::vector<uint64_t>& off, const std::vector<uint64_t>& cand, uint64_t argmax_size,
                     maxsim_metric metric, maxsim_status* status = nullptr) {
  const uint64_t n_scores = layout == MAXSIM_LAYOUT_MATRIX ? q.s.n_sets * d.s.n_sets
                          : layout == MAXSIM_LAYOUT_PAIRS  ? q.s.n_sets
                                                           : cand.size();
  Dev<float> sc(n_scores);
  Dev<int32_t> am(argmax_size);
  sc.Fill(0xff);
  am.Fill(0xcd);
  maxsim_score_options o;
  maxsim_score_options_init(&o);
  o.metric = metric;
  maxsim_sets qs{nullptr, &q.s}, ds{nullptr, &d.s};
  maxsim_status st;
  if (layout == MAXSIM_LAYOUT_MATRIX) {
    st = maxsim_score_matrix(gpu.get(), &qs, &ds, &o, sc.p, am.p);
  } else if (layout == MAXSIM_LAYOUT_PAIRS) {
    st = maxsim_score_pairs(gpu.get(), &qs, &ds, &o, sc.p, am.p);
  } else {
    st = maxsim_score_candidates(gpu.get(), &qs, &ds, off.data(), cand.data(), &o, sc.p, am.p);
  }
  if (status) *status = st;
  else EXPECT_EQ(st, MAXSIM_OK) << maxsim_last_error();
  Matrix m;
  m.scores = sc.Down();
  m.argmax = am.Down();
  return m;
}

TEST_F(Gpu, DeviceTensorsForwardAllLayouts) {
  Context gpu(Options("cuda"));
  const DenseCase cases[] = {
      {MAXSIM_BF16, 128, false, 0, 0}, {MAXSIM_F16, 128, true, 3, 0},  {MAXSIM_F32, 128, true, 0, 0},
      {MAXSIM_BF16, 64, true, 2, 8},   {MAXSIM_BF16, 48, false, 0, 3}, {MAXSIM_F32, 33, false, 1, 1},
      {MAXSIM_BF16, 384, true, 0, 0},
  };
  uint64_t salt = 600;
  for (const DenseCase& c : cases) {
    auto rng = Rng(++salt);
    TokenSets q = Encoded(Generate(rng, Shape::kUnitGaussian, 6, 0, 40, c.dim), c.dtype);
    TokenSets d = Encoded(Generate(rng, Shape::kClustered, 6, 0, 80, c.dim), c.dtype);
    if (c.masks) {
      RandomMask(rng, q, 0.25);
      RandomMask(rng, d, 0.3);
    }
    const DeviceSets dq(q, c.lead, c.pad), dd(d, c.lead + 1, c.pad);
    const std::string what = "dtype " + std::to_string(c.dtype) + " dim " + std::to_string(c.dim) +
                             (c.masks ? " masked" : "") + " lead " + std::to_string(c.lead) + " pad " +
                             std::to_string(c.pad);
    for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
      const Matrix m = DeviceForward(gpu, dq, dd, MAXSIM_LAYOUT_MATRIX, {}, {}, d.n_sets() * q.rows(), metric);
      ExpectReference(q, d, metric, m, what + " matrix");
      // KD candidates and pairs.
      std::vector<uint64_t> off = {0}, cand;
      for (uint64_t i = 0; i < q.n_sets(); ++i) {
        for (int k = 0; k < 4; ++k) cand.push_back(rng() % d.n_sets());
        off.push_back(cand.size());
      }
      uint64_t am_size = 0;
      for (uint64_t i = 0; i < q.n_sets(); ++i) am_size += 4 * q.length(i);
      const Matrix kd = DeviceForward(gpu, dq, dd, MAXSIM_LAYOUT_CANDIDATES, off, cand, am_size, metric);
      uint64_t base = 0;
      for (uint64_t i = 0; i < q.n_sets(); ++i) {
        for (uint64_t c2 = off[i]; c2 < off[i + 1]; ++c2) {
          const std::string err = CheckPair(q, i, d, cand[c2], metric, kd.scores[c2],
                                            kd.argmax.data() + base + (c2 - off[i]) * q.length(i));
          ASSERT_TRUE(err.empty()) << what << " KD " << c2 << ": " << err;
        }
        base += (off[i + 1] - off[i]) * q.length(i);
      }
      const Matrix pr = DeviceForward(gpu, dq, dd, MAXSIM_LAYOUT_PAIRS, {}, {}, q.rows(), metric);
      for (uint64_t i = 0; i < q.n_sets(); ++i) {
        const std::string err = CheckPair(q, i, d, i, metric, pr.scores[i], pr.argmax.data() + q.offsets[i]);
        ASSERT_TRUE(err.empty()) << what << " pair " << i << ": " << err;
      }
    }
  }
}

TEST_F(Gpu, ManyPairsPipelineKernelDeviceTensors) {
  // Dense device tensors, masked, in-batch 48 x 48 (2304 pairs: the pipeline kernel).
  Context gpu(Options("cuda"));
  auto rng = Rng(160);
  TokenSets q = Encoded(Generate(rng, Shape::kUnitGaussian, 48, 0, 32, 128), MAXSIM_BF16);
  TokenSets d = Encoded(Generate(rng, Shape::kClustered, 48, 0, 120, 128), MAXSIM_BF16);
  RandomMask(rng, q, 0.2);
  RandomMask(rng, d, 0.2);
  const DeviceSets dq(q), dd(d, 2, 0);
  const Matrix m = DeviceForward(gpu, dq, dd, MAXSIM_LAYOUT_MATRIX, {}, {}, d.n_sets() * q.rows(), MAXSIM_METRIC_DOT);
  ExpectReference(q, d, MAXSIM_METRIC_DOT, m, "pipeline device tensors", 600);
  // Scores and argmax with the bits of the one-pair-per-warp kernel.
  for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
    const Matrix ring = DeviceForward(gpu, dq, dd, MAXSIM_LAYOUT_MATRIX, {}, {}, d.n_sets() * q.rows(), metric);
    const Matrix plain = WithEnv("MAXSIM_CUDA_NO_PIPE", "1", [&](Context& g) {
      return DeviceForward(g, dq, dd, MAXSIM_LAYOUT_MATRIX, {}, {}, d.n_sets() * q.rows(), metric);
    });
    ExpectIdentical(ring, plain, std::string("pipeline device tensors vs one pair per warp") +
                                     (metric == MAXSIM_METRIC_DOT ? " dot" : " cosine"));
  }
}

TEST_F(Gpu, ManyPairsPipelineKernelUnmaskedDeviceTensors) {
  // Unmasked dense device tensors, dot: the ring kernel folds whole steps without per-column tests (by value
  // alone for scores only) and samples the folded input check (exact.cu). It must give the one-pair-per-warp kernel's bits, and a non-finite value
  // anywhere in a document row or a query row must fail the call naming its token. Both contexts are made with
  // MAXSIM_CUDA_NO_BATCH=1: on an sm_90 device these scores-only calls (3 queries, dim 128) would otherwise run the
  // wgmma batch kernel in both.
  ScopedEnv no_batch("MAXSIM_CUDA_NO_BATCH", "1");
  Context gpu(Options("cuda"));
  Context one = CudaContextWithEnv("MAXSIM_CUDA_NO_PIPE", "1");
  no_batch.Restore();
  auto rng = Rng(161);
  const TokenSets q = Encoded(Generate(rng, Shape::kUnitGaussian, 3, 1, 32, 128), MAXSIM_BF16);
  const TokenSets d = Encoded(Generate(rng, Shape::kClustered, 700, 0, 200, 128), MAXSIM_BF16);
  const DeviceSets dq(q), dd(d);
  const std::vector<float> plain = DeviceScoreValues(one, dq, dd, MAXSIM_METRIC_DOT);
  const Matrix ref = ScoreMatrix(gpu, q.Dense(), q.n_sets(), q.rows(), d.Dense(), d.n_sets(), MAXSIM_METRIC_DOT,
                                 MAXSIM_MODE_EXACT);
  ExpectReference(q, d, MAXSIM_METRIC_DOT, ref, "values-only reference");
  ExpectSameBits(DeviceScoreValues(gpu, dq, dd, MAXSIM_METRIC_DOT), plain, "values-only ring vs one pair per warp");
  // With argmax (the training forward's whole steps fold (value, index) without per-column tests): the same
  // scores and argmax as the one-pair-per-warp kernel, on these documents and on documents of duplicated tokens
  // (equal similarities: the lowest token index must win).
  const TokenSets dup = Encoded(Generate(rng, Shape::kDuplicates, 700, 0, 200, 128), MAXSIM_BF16);
  for (const TokenSets* docs : {&d, &dup}) {
    const DeviceSets xd(*docs);
    const uint64_t am = docs->n_sets() * q.rows();
    const Matrix ring = DeviceForward(gpu, dq, xd, MAXSIM_LAYOUT_MATRIX, {}, {}, am, MAXSIM_METRIC_DOT);
    const Matrix per_warp = DeviceForward(one, dq, xd, MAXSIM_LAYOUT_MATRIX, {}, {}, am, MAXSIM_METRIC_DOT);
    ExpectIdentical(ring, per_warp, docs == &d ? "argmax ring vs one pair per warp" : "argmax ring, duplicated tokens");
    ExpectReference(q, *docs, MAXSIM_METRIC_DOT, ring, "argmax ring reference", 300);
  }
  // Non-finite values: a document token in the middle of a long document (a step that is neither its first nor
  // its last), its last token, a first token, query tokens; NaN and both infinities.
  uint64_t long_doc = 0;
  for (uint64_t j = 0; j < d.n_sets(); ++j) {
    if (d.length(j) > d.length(long_doc)) long_doc = j;
  }
  struct Bad {
    bool query;
    uint64_t set, token;
    uint32_t k;
    float value;
  };
  const Bad bads[] = {{false, long_doc, d.length(long_doc) / 2 + 3, 17, std::nanf("")},
                      {false, long_doc, d.length(long_doc) - 1, 100, INFINITY},
                      {false, 5, 0, 0, -INFINITY},
                      {true, 1, q.length(1) - 1, 64, INFINITY},
                      {true, 2, 0, 3, std::nanf("")}};
  {
    Context& g = gpu;
    const std::string variant = "values-only ring";
    for (const Bad& b : bads) {
      TokenSets bq = q, bd = d;
      TokenSets& t = b.query ? bq : bd;
      if (t.length(b.set) == 0) continue;
      t.values[(t.offsets[b.set] + b.token) * t.dim + b.k] = b.value;
      t.Encode(MAXSIM_BF16);
      const DeviceSets xq(bq), xd(bd);
      Dev<float> out(q.n_sets() * d.n_sets());
      maxsim_score_options o;
      maxsim_score_options_init(&o);
      maxsim_sets qs{nullptr, &xq.s}, ds{nullptr, &xd.s};
      const maxsim_status st = maxsim_score_matrix(g.get(), &qs, &ds, &o, out.p, nullptr);
      const std::string want = std::string(b.query ? "queries" : "documents") + ": set " + std::to_string(b.set) +
                               " token " + std::to_string(b.token) + " ";
      const std::string msg = st == MAXSIM_OK ? "" : maxsim_last_error();
      EXPECT_EQ(st, MAXSIM_ERR_NON_FINITE) << variant << ": " << want;
      EXPECT_NE(msg.find(want), std::string::npos) << variant << ": '" << msg << "' does not name " << want;
    }
  }
}

// The devices a context made without maxsim_options.devices shards a corpus over, as the CUDA plugin reads them
// (MAXSIM_CUDA_DEVICES, a comma-separated list of ordinals that may repeat one; else MAXSIM_CUDA_DEVICE, default 0):
// how many backends, and the most SMs any of them has (0 if a device cannot be asked).
struct ShardDevices {
  uint64_t count = 0;
  uint64_t max_sms = 0;
};
ShardDevices ContextDevices() {
  std::vector<int> list;
  const char* e = std::getenv("MAXSIM_CUDA_DEVICES");
  if (e != nullptr && e[0] != '\0') {
    for (const char* p = e; *p;) {
      char* end = nullptr;
      list.push_back(static_cast<int>(std::strtol(p, &end, 10)));
      if (end == p) return {};
      p = *end == ',' ? end + 1 : end;
    }
  } else {
    const char* one = std::getenv("MAXSIM_CUDA_DEVICE");
    list.push_back(one != nullptr && one[0] != '\0' ? std::atoi(one) : 0);
  }
  ShardDevices r;
  r.count = list.size();
  for (int dev : list) {
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0) return {};
    r.max_sms = std::max<uint64_t>(r.max_sms, static_cast<uint64_t>(sms));
  }
  return r;
}

// One designed query row of the cross-warp tie case: the row is s * e_k, so its similarity with a document token is
// s * token[k], exact in every kernel (one nonzero product). Every document token's element k is s times a
// background similarity drawn from [lo, hi], except at the listed tokens (where the document is that long), whose
// similarity is the listed value. In the grid's 4-warp blocks warp w holds the 32-token steps w, w + 4, ...
// (tokens [32 step, 32 step + 32)); each row puts its maximum in steps of different warps.
struct TiePattern {
  uint32_t k;
  float s, lo, hi;
  std::vector<std::pair<uint64_t, float>> at;  // (token, similarity)
};

const std::vector<TiePattern>& TiePatterns() {
  static const std::vector<TiePattern> p = {
      // First in warp 1's step 1, again in warp 2's step 2 and warp 0's step 4: 37.
      {9, 1.0f, -2.0f, 2.5f, {{37, 3.0f}, {95, 3.0f}, {130, 3.0f}}},
      // First at warp 3's step 3, again at the end of warp 0's step 4; a lower value at token 0: 96.
      {22, 1.0f, -2.0f, 2.0f, {{0, 2.5f}, {96, 2.75f}, {159, 2.75f}}},
      // Lower values in every warp's first step; first in warp 0's step 4, again in warp 1's step 5 and warp 3's
      // step 7; a negative query element: 140.
      {35, -1.0f, -2.0f, 3.0f,
       {{10, 3.5f}, {40, 3.9375f}, {70, 3.75f}, {100, 3.875f}, {140, 4.0f}, {170, 4.0f}, {250, 4.0f}}},
      // The maximum is 0, from elements -0 and +0: first in warp 1 (-0), then warps 2, 3 and 0's step 4: 50.
      {48, 1.0f, -3.0f, -0.5f, {{50, -0.0f}, {66, 0.0f}, {100, 0.0f}, {135, -0.0f}}},
      // The same with a negative query element (products -0 and +0): first in warp 1, then warp 2 and warp 0: 33.
      {61, -1.0f, -3.0f, -0.5f, {{33, 0.0f}, {65, -0.0f}, {129, 0.0f}}},
      // A negative maximum: first in warp 2's step 2, again in warp 3's step 3, warp 0's step 4, warp 2's step 6: 80.
      {74, 1.0f, -6.0f, -1.25f, {{80, -1.0f}, {110, -1.0f}, {131, -1.0f}, {200, -1.0f}}},
      // First at the start of warp 2's step 2, again in warp 1's step 5: 64.
      {87, 1.0f, -2.0f, 4.5f, {{64, 5.0f}, {170, 5.0f}, {191, 5.0f}}},
      // First at the end of warp 0's step 0, again at the start of every other warp's step and warp 0's step 4: 31.
      {100, -1.0f, -1.0f, 1.5f, {{31, 2.0f}, {32, 2.0f}, {64, 2.0f}, {96, 2.0f}, {128, 2.0f}}},
  };
  return p;
}

// nd bf16 documents of dim 128 for TiePatterns(): lengths 160-280 (every designed token of most rows present), and
// every 16th 0-159 (some designed tokens cut off, empty documents); other elements Gaussian.
TokenSets TieDocuments(std::mt19937_64& rng, uint64_t nd) {
  TokenSets d;
  d.dim = 128;
  d.offsets.assign(1, 0);
  std::uniform_int_distribution<uint64_t> long_len(160, 280), short_len(0, 159);
  for (uint64_t j = 0; j < nd; ++j) {
    d.offsets.push_back(d.offsets.back() + (j % 16 == 5 ? short_len(rng) : long_len(rng)));
  }
  d.values.resize(d.rows() * d.dim);
  std::normal_distribution<float> g(0.0f, 0.25f);
  for (float& v : d.values) v = g(rng);
  for (const TiePattern& p : TiePatterns()) {
    std::uniform_real_distribution<float> bg(p.lo, p.hi);
    for (uint64_t j = 0; j < nd; ++j) {
      for (uint64_t t = 0; t < d.length(j); ++t) d.values[(d.offsets[j] + t) * d.dim + p.k] = p.s * bg(rng);
      for (const auto& [t, v] : p.at) {
        if (t < d.length(j)) d.values[(d.offsets[j] + t) * d.dim + p.k] = p.s * v;
      }
    }
  }
  d.Encode(MAXSIM_BF16);  // lo, hi and every listed value are bf16 numbers: rounding keeps the design
  return d;
}

// nq bf16 queries of max_lq rows (one of them shorter, max_lq - 5), Gaussian rows except that pattern p of
// TiePatterns() is row (3 + 5 p + 7 i) % lq of query i (distinct rows: 5 is prime to every lq used). *pattern_row[i]
// lists query i's designed rows (pattern p at entry p).
TokenSets TieQueries(std::mt19937_64& rng, uint64_t nq, uint64_t max_lq,
                     std::vector<std::vector<uint64_t>>* pattern_row) {
  const std::vector<TiePattern>& pats = TiePatterns();
  TokenSets q;
  q.dim = 128;
  q.offsets.assign(1, 0);
  for (uint64_t i = 0; i < nq; ++i) q.offsets.push_back(q.offsets.back() + (i == 3 ? max_lq - 5 : max_lq));
  q.values.resize(q.rows() * q.dim);
  std::normal_distribution<float> g(0.0f, 0.25f);
  for (float& v : q.values) v = g(rng);
  pattern_row->assign(nq, {});
  for (uint64_t i = 0; i < nq; ++i) {
    const uint64_t lq = q.length(i);
    for (uint64_t p = 0; p < pats.size(); ++p) {
      const uint64_t r = (3 + 5 * p + 7 * i) % lq;
      (*pattern_row)[i].push_back(r);
      float* row = q.values.data() + (q.offsets[i] + r) * q.dim;
      std::fill(row, row + q.dim, 0.0f);
      row[pats[p].k] = pats[p].s;
    }
  }
  q.Encode(MAXSIM_BF16);
  return q;
}

// The grid (exact_coop.cu) against the ring and the one-pair-per-warp kernel: contexts made with
// MAXSIM_CUDA_NO_BATCH=1 (scores-only matrix calls of several queries at 96 < dim <= 128 would otherwise run the
// wgmma batch kernel on an sm_90 device, WgmmaBatchUsable, and the grid's values-only fold, FOLD 1, would meet only
// dim 64): `one` with MAXSIM_CUDA_NO_PIPE=1 and the sides, here the grid (as built, or forced by
// MAXSIM_CUDA_EXPERIMENTAL=coop-always) and the ring (MAXSIM_CUDA_NO_COOP=1).
struct CoopSide {
  Context* ctx;
  const char* name;
};
using ArgmaxCheck = std::function<void(const Matrix&, const std::string&)>;

// The one-pair kernel's results for queries q over documents d (pd, dd: d packed and on the device), checked
// against the float64 reference on 400 pairs; each side's four calls (packed and dense inputs, with argmax and
// scores only) must have their bits. check(m, label), where given, runs on every argmax result too.
void ExpectCoopSidesAgree(Context& one, const std::vector<CoopSide>& sides, const TokenSets& q, const TokenSets& d,
                          const Packed& pd, const DeviceSets& dd, const std::string& what, const ArgmaxCheck& check) {
  const Packed pq = Packed::Pack(one, q.Dense());
  const DeviceSets dq(q);
  const uint64_t nq = q.n_sets(), ndocs = d.n_sets();
  const Matrix want = ScoreMatrix(one, pq, nq, q.rows(), pd, ndocs, MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT);
  ExpectReference(q, d, MAXSIM_METRIC_DOT, want, what + " one pair per warp", 400);
  if (check) check(want, what + " one pair per warp");
  const std::vector<float> want_values = ScoreValues(one, pq, nq, pd, ndocs, MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT);
  for (const CoopSide& s : sides) {
    Context& ctx = *s.ctx;
    const std::string side = what + " " + s.name;
    const Matrix packed = ScoreMatrix(ctx, pq, nq, q.rows(), pd, ndocs, MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT);
    if (check) check(packed, side);
    ExpectIdentical(packed, want, side);
    ExpectSameBits(ScoreValues(ctx, pq, nq, pd, ndocs, MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT), want_values,
                   side + " scores only");
    const Matrix dense = DeviceForward(ctx, dq, dd, MAXSIM_LAYOUT_MATRIX, {}, {}, ndocs * q.rows(), MAXSIM_METRIC_DOT);
    if (check) check(dense, side + " dense");
    ExpectIdentical(dense, want, side + " dense");
    ExpectSameBits(DeviceScoreValues(ctx, dq, dd, MAXSIM_METRIC_DOT), want_values, side + " dense scores only");
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// Exact ties across the grid's warps, by design (TiePatterns): for 8 rows of every query the largest similarity
// is reached by tokens in steps that different warps hold, so the warps' row maxima are equal and only the
// merge's lowest-index rule picks the argmax. tnq = 32 queries of 32 rows (two m tiles) and of 16 rows (one) over
// tnd documents (ExpectCoopSidesAgree's contexts). The argmax of those rows must be the host's: the lowest token
// index of the float64 maximum over the bf16 values; and every side's bits must be the one-pair kernel's.
void ExpectCrossWarpTies(Context& one, const std::vector<CoopSide>& sides, std::mt19937_64& trng, uint64_t tnq,
                         uint64_t tnd) {
  const std::vector<TiePattern>& pats = TiePatterns();
  const TokenSets d = TieDocuments(trng, tnd);
  // The host's expectation per (pattern, document), and how many documents tie the maximum across warps.
  std::vector<int32_t> expect(pats.size() * tnd, -1);
  for (uint64_t p = 0; p < pats.size(); ++p) {
    TokenSets row;  // the pattern's query row alone
    row.dim = d.dim;
    row.offsets = {0, 1};
    row.values.assign(d.dim, 0.0f);
    row.values[pats[p].k] = pats[p].s;
    uint64_t across = 0;
    for (uint64_t j = 0; j < tnd; ++j) {
      double best = -std::numeric_limits<double>::infinity();
      uint32_t warps = 0;  // bit w: warp w holds a token of the maximum
      for (uint64_t t = 0; t < d.length(j); ++t) {
        const double v = RefSim(row, 0, 0, d, j, t, MAXSIM_METRIC_DOT);
        if (v > best) {
          best = v;
          expect[p * tnd + j] = static_cast<int32_t>(t);
          warps = 0;
        }
        if (v == best) warps |= 1u << ((t / 32) % 4);
      }
      across += __builtin_popcount(warps) >= 2;
    }
    ASSERT_GE(across, tnd / 2) << "pattern " << p << " ties across warps in only " << across << " documents";
  }
  const Packed pd = Packed::Pack(one, d.Dense());
  const DeviceSets dd(d);
  for (uint64_t max_lq : {32, 16}) {
    std::vector<std::vector<uint64_t>> prow;
    const TokenSets q = TieQueries(trng, tnq, max_lq, &prow);
    auto expect_host = [&](const Matrix& m, const std::string& side) {
      for (uint64_t i = 0; i < tnq; ++i) {
        for (uint64_t j = 0; j < tnd; ++j) {
          const int32_t* am = m.argmax.data() + tnd * q.offsets[i] + j * q.length(i);
          for (uint64_t p = 0; p < pats.size(); ++p) {
            ASSERT_EQ(am[prow[i][p]], expect[p * tnd + j])
                << side << ": query " << i << " row " << prow[i][p] << " (pattern " << p << ") doc " << j;
          }
        }
      }
    };
    ExpectCoopSidesAgree(one, sides, q, d, pd, dd, "cross-warp ties lq <= " + std::to_string(max_lq), expect_host);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST_F(Gpu, OneQueryRingLaunchesShareTheQuery) {
  // A launch of one query on the ring kernel copies the query into shared memory once per block (its own cp.async
  // group, one block barrier) and each warp takes its fragments with ldmatrix; launches of several queries load
  // them per warp. It must give the one-pair-per-warp kernel's bits and the reference: 1-, 16- and 29-row queries
  // (one and two m tiles, and the rows past the query that the copy fills), dims 64, 96 and 128, dot with and
  // without argmax and cosine, ragged documents with empty ones, with fewer pairs than warps (idle warps at the
  // barrier) and with several pairs per warp. Bits catch a wrong layout, swizzle or fragment; a missing wait or
  // barrier would be a race that they catch only by chance: scripts/device/gpu-tests.sh runs this test under
  // compute-sanitizer racecheck and synccheck for that. Dense inputs with the folded check: ManyPairsCoopKernel's
  // long documents. MAXSIM_CUDA_NO_COOP keeps dim 128 on the ring.
  const ShardDevices dev = ContextDevices();
  ASSERT_GT(dev.max_sms, 0u) << "cannot read the SM count of the devices in MAXSIM_CUDA_DEVICES / MAXSIM_CUDA_DEVICE";
  const uint64_t sms = dev.max_sms, devices = dev.count;
  Context ring = CudaContextWithEnv("MAXSIM_CUDA_NO_COOP", "1");
  Context one = CudaContextWithEnv("MAXSIM_CUDA_NO_PIPE", "1");
  struct Case {
    uint32_t dim;
    uint64_t lq;
    Shape docs;
  };
  const Case cases[] = {{128, 29, Shape::kClustered}, {128, 16, Shape::kDuplicates}, {96, 1, Shape::kClustered},
                        {64, 29, Shape::kNearTies}};
  uint64_t salt = 190;
  // 5 documents per SM: the ring engages (half a pair per warp, 8 warps per SM) with 3 of 8 warps idle; 24: 3 pairs
  // per warp. 16 documents to spare per shard for the spread of a shard's count.
  for (uint64_t per_sm : {5ull, 24ull}) {
    const uint64_t nd = (per_sm * sms + 16) * devices + 3;
    for (const Case& c : cases) {
      auto rng = Rng(++salt);
      const TokenSets q = Encoded(Generate(rng, Shape::kUnitGaussian, 1, c.lq, c.lq, c.dim), MAXSIM_BF16);
      const TokenSets d = Encoded(Generate(rng, c.docs, nd, 0, 170, c.dim), MAXSIM_BF16);
      Packed pq = Packed::Pack(ring, q.Dense());
      Packed pd = Packed::Pack(ring, d.Dense());
      for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
        const std::string what = std::to_string(per_sm) + " per SM, dim " + std::to_string(c.dim) + ", " +
                                 std::to_string(c.lq) + " query rows" + (metric == MAXSIM_METRIC_DOT ? " dot" : " cosine");
        const Matrix a = ScoreMatrix(ring, pq, 1, q.rows(), pd, nd, metric, MAXSIM_MODE_EXACT);
        const Matrix b = ScoreMatrix(one, pq, 1, q.rows(), pd, nd, metric, MAXSIM_MODE_EXACT);
        ExpectIdentical(a, b, what + ": ring vs one pair per warp");
        if (::testing::Test::HasFatalFailure()) return;
        ExpectReference(q, d, metric, a, what, 400);
        if (metric == MAXSIM_METRIC_DOT) {  // scores only: the values-only fold
          ScoreOptions o;
          const std::vector<float> sa = ring.ScoreMatrix(pq, 1, pd, nd, o), sb = one.ScoreMatrix(pq, 1, pd, nd, o);
          ExpectSameBits(sa, a.scores, what + ": scores only vs with argmax");
          ExpectSameBits(sb, a.scores, what + ": scores only, one pair per warp");
        }
      }
    }
  }
}

// One non-finite element: in the queries (else the documents), set `set`, token `token`, dimension k.
struct BadElement {
  bool query;
  uint64_t set, token;
  uint32_t k;
  float value;
};

// Each bad element in turn, written into copies of the bf16 sets q and d, must fail ctx's score matrix of their
// device tensors (the folded input check) with MAXSIM_ERR_NON_FINITE naming its set and token, scores only and with
// argmax, and leave every score NaN: nothing a caller could take for an answer.
void ExpectFoldedCheckFails(Context& ctx, const TokenSets& q, const TokenSets& d, const std::vector<BadElement>& bads) {
  const uint64_t nd = d.n_sets();
  for (const BadElement& b : bads) {
    TokenSets bq = q, bd = d;
    TokenSets& t = b.query ? bq : bd;
    t.values[(t.offsets[b.set] + b.token) * t.dim + b.k] = b.value;
    t.Encode(MAXSIM_BF16);
    const DeviceSets xq(bq), xd(bd);
    const std::string want = std::string(b.query ? "queries" : "documents") + ": set " + std::to_string(b.set) +
                             " token " + std::to_string(b.token) + " ";
    for (bool argmax : {false, true}) {
      Dev<float> sc(q.n_sets() * nd);
      Dev<int32_t> am(nd * q.rows());
      sc.Fill(0);  // finite: a partial result would show
      maxsim_score_options o;
      maxsim_score_options_init(&o);
      maxsim_sets qs{nullptr, &xq.s}, ds{nullptr, &xd.s};
      const maxsim_status st = maxsim_score_matrix(ctx.get(), &qs, &ds, &o, sc.p, argmax ? am.p : nullptr);
      const std::string msg = st == MAXSIM_OK ? "" : maxsim_last_error();
      EXPECT_EQ(st, MAXSIM_ERR_NON_FINITE) << want << (argmax ? "argmax" : "scores only");
      EXPECT_NE(msg.find(want), std::string::npos) << "'" << msg << "' does not name " << want;
      for (float v : sc.Down()) ASSERT_TRUE(std::isnan(v)) << want << ": a score survived a failed call: " << v;
    }
  }
}

TEST_F(Gpu, ManyPairsCoopKernel) {
  // Enough short-query dot pairs for the one-block-per-pair grid (exact_coop.cu: 48 pairs per SM; a block of 4
  // warps per pair, warp w folding steps w, w + 4, ... and the warps' row maxima merged by value, then the lowest
  // index), and one query over long documents (the grid's other rule: 512+ tokens on average, one pair per
  // document): it must give the ring kernel's and the one-pair-per-warp kernel's bits, scores only and with argmax,
  // packed and dense device inputs (the folded input check on), over ragged documents with empty ones and lengths
  // that are no multiple of 32 (and shorter than one step per warp), duplicated tokens and near ties (equal
  // similarities: the lowest token index wins across the warps), 16- and 32-row queries, dims 128 and 64
  // (predicated copies). Exact ties between tokens of different warps' steps, by design (TiePatterns), where the
  // argmax must also be the host's. A non-finite value in a document step of any warp or in a query fails the call.
  // The three contexts are made with MAXSIM_CUDA_NO_BATCH=1 (ExpectCoopSidesAgree); the grid's forces the grid with
  // MAXSIM_CUDA_EXPERIMENTAL=coop-always, since the rule keeps dim 64 on the ring. Documents are sized for every
  // device a context shards them over (MAXSIM_CUDA_DEVICES), each taken to have the most SMs of any of them, with
  // room for shards cut by token counts (ShardBounds) to hold fewer documents than an even split.
  const ShardDevices dev = ContextDevices();
  ASSERT_GT(dev.max_sms, 0u) << "cannot read the SM count of the devices in MAXSIM_CUDA_DEVICES / MAXSIM_CUDA_DEVICE";
  const uint64_t sms = dev.max_sms, devices = dev.count;
  // 3 queries: 48 pairs per SM on every shard, 12.5% over (a shard's count of 0-170-token documents varies by ~30)
  const uint64_t nd = 18 * sms * devices + 17;
  ScopedEnv no_batch("MAXSIM_CUDA_NO_BATCH", "1");
  Context grid = CudaContextWithEnv("MAXSIM_CUDA_EXPERIMENTAL", "coop-always");
  Context ring = CudaContextWithEnv("MAXSIM_CUDA_NO_COOP", "1");
  Context one = CudaContextWithEnv("MAXSIM_CUDA_NO_PIPE", "1");
  no_batch.Restore();
  const std::vector<CoopSide> sides = {{&grid, "grid"}, {&ring, "ring"}};
  struct Case {
    uint32_t dim;
    uint64_t max_lq;
    Shape docs;
  };
  const Case cases[] = {{128, 32, Shape::kClustered}, {128, 16, Shape::kDuplicates}, {64, 32, Shape::kNearTies},
                        {128, 32, Shape::kDuplicates}};
  uint64_t salt = 170;
  for (const Case& c : cases) {
    auto rng = Rng(++salt);
    const TokenSets q = Encoded(Generate(rng, Shape::kUnitGaussian, 3, 1, c.max_lq, c.dim), MAXSIM_BF16);
    const TokenSets d = Encoded(Generate(rng, c.docs, nd, 0, 170, c.dim), MAXSIM_BF16);
    const std::string what = "dim " + std::to_string(c.dim) + " lq <= " + std::to_string(c.max_lq) + " docs " +
                             std::to_string(static_cast<int>(c.docs));
    ExpectCoopSidesAgree(one, sides, q, d, Packed::Pack(grid, d.Dense()), DeviceSets(d), what, {});
    if (::testing::Test::HasFatalFailure()) return;
  }
  // One query over long documents (colpali-rerank's kind: 4 pairs per SM and more on every shard, so that the ring,
  // and so the grid, is chosen at all (EnoughPairsForWarpRings), with 64 documents to spare per shard (a shard's
  // count varies by ~15); 0-1400 tokens, about 700 on average, so every warp folds several steps and wraps its
  // ring), ragged with empty ones and duplicated tokens.
  {
    auto lrng = Rng(178);
    const uint64_t ndl = (4 * sms + 64) * devices + 37;
    const TokenSets q = Encoded(Generate(lrng, Shape::kUnitGaussian, 1, 20, 32, 128), MAXSIM_BF16);
    const TokenSets d = Encoded(Generate(lrng, Shape::kDuplicates, ndl, 0, 1400, 128), MAXSIM_BF16);
    ASSERT_GE(d.rows(), 600 * ndl) << "the long-document case must average well over 512 tokens";
    ExpectCoopSidesAgree(one, sides, q, d, Packed::Pack(grid, d.Dense()), DeviceSets(d), "long documents", {});
    if (::testing::Test::HasFatalFailure()) return;
  }
  // Exact ties across the grid's warps (ExpectCrossWarpTies): 32 queries, 48 pairs per SM on every shard and 25%
  // over (the documents' lengths vary little).
  {
    auto trng = Rng(180);
    const uint64_t tnq = 32;
    ExpectCrossWarpTies(one, sides, trng, tnq, (48 * sms * 5 / 4 + tnq - 1) / tnq * devices + 13);
    if (::testing::Test::HasFatalFailure()) return;
  }
  // The folded input check on the grid: a document token in the first step of warps 1, 2 and 3 and in warp 0's
  // second, a document's last token, query tokens; NaN and both infinities. Scores only and with argmax.
  auto rng = Rng(179);
  const TokenSets q = Encoded(Generate(rng, Shape::kUnitGaussian, 3, 32, 32, 128), MAXSIM_BF16);
  const TokenSets d = Encoded(Generate(rng, Shape::kClustered, nd, 100, 170, 128), MAXSIM_BF16);
  uint64_t long_set = 0;  // a document with a fifth step (tokens 128-159: warp 0's second)
  while (d.length(long_set) <= 140) ++long_set;
  const std::vector<BadElement> bads = {{false, 7, 40, 17, std::nanf("")},
                      {false, nd / 2, 70, 0, INFINITY},
                      {false, nd / 3, 99, 5, -INFINITY},
                      {false, long_set, 140, 9, std::nanf("")},
                      {false, nd - 1, d.length(nd - 1) - 1, 127, -INFINITY},
                      {true, 1, 31, 64, INFINITY},
                      {true, 2, 0, 3, std::nanf("")}};
  ExpectFoldedCheckFails(grid, q, d, bads);
}

TEST_F(Gpu, DealtKernelMatchesTheRing) {
  // The dealt kernel (exact_dealt.cu), forced by MAXSIM_CUDA_EXPERIMENTAL=dealt-always onto one-query dot calls
  // without a document mask of up to 32 documents per SM (as built: too few documents for the ring, under 4 per SM,
  // or documents of 224+ tokens on average): block b of one per SM scores documents b, b + B, ..., each with all its
  // warps, the steps of its stream dealt to the warps round-robin across document boundaries; each warp leaves its
  // row maxima in one of 8 shared-memory slots, and at the end of every round of 8 documents (two barriers) warp w
  // merges and writes document w of the round. It must give the one-pair-per-warp kernel's bits, and the ring's
  // where the ring runs, packed and dense (the folded input check on), scores only and with argmax: fewer documents
  // than blocks, one round per block and several (9, 18 and 32 documents per block: slots reused, the whole
  // table), ragged with empty documents (no steps in the stream), lengths no multiple of 32, long documents (each
  // warp wraps its ring within a document), 1-, 16-, 29- and 32-row queries (one and two m tiles), dims 64, 96 and
  // 128 (predicated copies). Exact ties between tokens of different steps, which the block deals to different warps (TiePatterns),
  // where the argmax must also be the host's. A non-finite element in any step, or in the query, fails the call.
  // MAXSIM_CUDA_NO_COOP=1 keeps the grid off whatever its rule says, so that every case reaches the dealt kernel;
  // the `ring` side also sets MAXSIM_CUDA_NO_DEALT=1 (the ring, or the one-pair-per-warp kernel below 4 documents
  // per SM). scripts/device/gpu-tests.sh runs this test under compute-sanitizer racecheck and synccheck.
  int optin = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0), cudaSuccess);
  if (optin < 226 * 1024) {
    GTEST_SKIP() << "the dealt kernel needs 226 KB of shared memory per block; this device gives " << optin;
  }
  const ShardDevices dev = ContextDevices();
  ASSERT_GT(dev.max_sms, 0u) << "cannot read the SM count of the devices in MAXSIM_CUDA_DEVICES / MAXSIM_CUDA_DEVICE";
  const uint64_t sms = dev.max_sms, devices = dev.count;
  ScopedEnv no_coop("MAXSIM_CUDA_NO_COOP", "1");
  Context dealt = CudaContextWithEnv("MAXSIM_CUDA_EXPERIMENTAL", "dealt-always");
  Context ring = CudaContextWithEnv("MAXSIM_CUDA_NO_DEALT", "1");
  no_coop.Restore();
  Context one = CudaContextWithEnv("MAXSIM_CUDA_NO_PIPE", "1");
  const std::vector<CoopSide> sides = {{&dealt, "dealt"}, {&ring, "ring"}};
  struct Case {
    uint64_t nd;  // per device
    uint64_t lq;
    uint32_t dim;
    Shape docs;
    uint64_t max_len;
  };
  const Case cases[] = {{7, 32, 128, Shape::kClustered, 1400},          {sms / 2 + 3, 29, 128, Shape::kNearTies, 300},
                        {3 * sms + 5, 16, 128, Shape::kDuplicates, 170}, {5 * sms + 16, 32, 128, Shape::kClustered, 330},
                        {2 * sms + 9, 1, 96, Shape::kClustered, 600},    {4 * sms + 16, 29, 64, Shape::kNearTies, 250},
                        {9 * sms - 5, 32, 128, Shape::kDuplicates, 100}, {18 * sms - 3, 16, 128, Shape::kClustered, 64},
                        {32 * sms - 1, 32, 64, Shape::kNearTies, 40}};
  uint64_t salt = 230;
  for (const Case& c : cases) {
    auto rng = Rng(++salt);
    const uint64_t nd = c.nd * devices + 1;  // at most 32 documents per SM on one device
    const TokenSets q = Encoded(Generate(rng, Shape::kUnitGaussian, 1, c.lq, c.lq, c.dim), MAXSIM_BF16);
    const TokenSets d = Encoded(Generate(rng, c.docs, nd, 0, c.max_len, c.dim), MAXSIM_BF16);
    const std::string what = std::to_string(nd) + " documents of 0-" + std::to_string(c.max_len) + " tokens, dim " +
                             std::to_string(c.dim) + ", " + std::to_string(c.lq) + " query rows";
    ExpectCoopSidesAgree(one, sides, q, d, Packed::Pack(one, d.Dense()), DeviceSets(d), what, {});
    if (::testing::Test::HasFatalFailure()) return;
  }
  // A masked query over unmasked documents (DealtChosen refuses document masks only): its masked rows add nothing
  // to a score. Dense device tensors, scores only, 32-row group: the bits of the `ring` context, which at 2
  // documents per SM (under the ring's 4) runs the one-pair-per-warp kernel, and the float64 reference.
  {
    auto mrng = Rng(250);
    TokenSets q = Encoded(Generate(mrng, Shape::kUnitGaussian, 1, 29, 29, 128), MAXSIM_BF16);
    RandomMask(mrng, q, 0.3);
    const TokenSets d = Encoded(Generate(mrng, Shape::kClustered, 2 * sms * devices + 7, 0, 330, 128), MAXSIM_BF16);
    const DeviceSets dq(q), dd(d);
    const std::vector<float> got = DeviceScoreValues(dealt, dq, dd, MAXSIM_METRIC_DOT);
    ExpectSameBits(got, DeviceScoreValues(ring, dq, dd, MAXSIM_METRIC_DOT), "masked query, dealt against one pair per warp");
    for (uint64_t j = 0; j < d.n_sets(); ++j) {
      const std::string err = CheckPair(q, 0, d, j, MAXSIM_METRIC_DOT, got[j], nullptr);
      ASSERT_TRUE(err.empty()) << "masked query, dealt, document " << j << ": " << err;
    }
  }
  // Exact ties across steps, one query at a time (each call a one-query launch).
  {
    auto trng = Rng(240);
    const std::vector<TiePattern>& pats = TiePatterns();
    const uint64_t tnd = 3 * sms * devices + 11;
    const TokenSets d = TieDocuments(trng, tnd);
    std::vector<std::vector<uint64_t>> prow;
    const TokenSets qs = TieQueries(trng, 5, 32, &prow);
    const Packed pd = Packed::Pack(one, d.Dense());
    const DeviceSets dd(d);
    for (uint64_t i = 0; i < qs.n_sets(); ++i) {
      TokenSets q;
      q.dim = qs.dim;
      q.offsets = {0, qs.length(i)};
      q.values.assign(qs.values.begin() + qs.offsets[i] * qs.dim, qs.values.begin() + qs.offsets[i + 1] * qs.dim);
      q.Encode(MAXSIM_BF16);
      auto expect_host = [&](const Matrix& m, const std::string& side) {
        for (uint64_t j = 0; j < tnd; ++j) {
          for (uint64_t p = 0; p < pats.size(); ++p) {
            TokenSets row;
            row.dim = d.dim;
            row.offsets = {0, 1};
            row.values.assign(d.dim, 0.0f);
            row.values[pats[p].k] = pats[p].s;
            double best = -std::numeric_limits<double>::infinity();
            int32_t want = -1;
            for (uint64_t t = 0; t < d.length(j); ++t) {
              const double v = RefSim(row, 0, 0, d, j, t, MAXSIM_METRIC_DOT);
              if (v > best) {
                best = v;
                want = static_cast<int32_t>(t);
              }
            }
            ASSERT_EQ(m.argmax[j * q.length(0) + prow[i][p]], want)
                << side << ": row " << prow[i][p] << " (pattern " << p << ") doc " << j;
          }
        }
      };
      ExpectCoopSidesAgree(one, sides, q, d, pd, dd, "ties, query " + std::to_string(i), expect_host);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  // The folded input check: a document token in a step of each of several warps, a document's last token, a query
  // token; NaN and both infinities. Scores only and with argmax.
  auto rng = Rng(241);
  const uint64_t nd = 2 * sms * devices + 5;
  const TokenSets q = Encoded(Generate(rng, Shape::kUnitGaussian, 1, 32, 32, 128), MAXSIM_BF16);
  const TokenSets d = Encoded(Generate(rng, Shape::kClustered, nd, 100, 400, 128), MAXSIM_BF16);
  const std::vector<BadElement> bads = {{false, 7, 40, 17, std::nanf("")},
                      {false, nd / 2, 70, 0, INFINITY},
                      {false, nd / 3, 99, 5, -INFINITY},
                      {false, nd - 1, d.length(nd - 1) - 1, 127, std::nanf("")},
                      {true, 0, 31, 64, INFINITY}};
  ExpectFoldedCheckFails(dealt, q, d, bads);
}

TEST_F(Gpu, CoopAlwaysBelowTheRule) {
  // MAXSIM_CUDA_EXPERIMENTAL=coop-always runs the one-block-per-pair grid on the calls its rule (CoopChosen) leaves
  // on the ring, so that scripts/device/gpu-coop-rule.sh can time both sides of the rule. Here the calls the rule
  // sends to the ring: short documents (0-170 tokens, under 224 on average; TieDocuments' 0-280) and 4 to 48
  // pairs per SM on every shard (the ring, and so CoopChosen, is asked only from 4, EnoughPairsForWarpRings; the
  // rule takes the grid from 48): one query over ~6.5 pairs per SM (each document scored once, as on
  // colpali-rerank, but short), 3 queries over ~12, and 32 queries over ~12 with exact ties across the grid's
  // warps (ExpectCrossWarpTies). The forced grid must give the ring's (MAXSIM_CUDA_NO_COOP=1) and the one-pair-per-
  // warp kernel's bits, scores only and with argmax, packed and dense, over ragged documents with empty ones,
  // duplicated tokens and near ties, 16- and 32-row queries, dims 128 and 64. Sized per shard as
  // ManyPairsCoopKernel is. MAXSIM_CUDA_NO_COOP=1 wins over coop-always: with it set for the whole run there is
  // no grid to force, and the test is skipped.
  const char* no_coop = std::getenv("MAXSIM_CUDA_NO_COOP");
  if (no_coop != nullptr && no_coop[0] != '\0' && std::strcmp(no_coop, "0") != 0) {
    GTEST_SKIP() << "MAXSIM_CUDA_NO_COOP is set: the grid is off, coop-always has nothing to force";
  }
  const ShardDevices dev = ContextDevices();
  ASSERT_GT(dev.max_sms, 0u) << "cannot read the SM count of the devices in MAXSIM_CUDA_DEVICES / MAXSIM_CUDA_DEVICE";
  const uint64_t sms = dev.max_sms, devices = dev.count;
  ScopedEnv no_batch("MAXSIM_CUDA_NO_BATCH", "1");
  Context forced = CudaContextWithEnv("MAXSIM_CUDA_EXPERIMENTAL", "coop-always");
  Context ring = CudaContextWithEnv("MAXSIM_CUDA_NO_COOP", "1");
  Context one = CudaContextWithEnv("MAXSIM_CUDA_NO_PIPE", "1");
  no_batch.Restore();
  // The backend read the option (its settings, in the context's report): else the forced side would be the ring.
  const std::string report = forced.Report();
  ASSERT_NE(report.find("every one: MAXSIM_CUDA_EXPERIMENTAL=coop-always"), std::string::npos) << report;
  // With both set, MAXSIM_CUDA_NO_COOP wins, and the settings say so.
  const std::string both = [] {
    ScopedEnv no_coop("MAXSIM_CUDA_NO_COOP", "1");
    return WithEnv("MAXSIM_CUDA_EXPERIMENTAL", "coop-always", [](Context& g) { return g.Report(); });
  }();
  EXPECT_NE(both.find("coop-always ignored: MAXSIM_CUDA_NO_COOP wins"), std::string::npos) << both;
  const std::vector<CoopSide> sides = {{&forced, "forced grid"}, {&ring, "ring"}};
  struct Case {
    uint32_t dim;
    uint64_t nq, max_lq;
    Shape docs;
    uint64_t nd;  // documents per shard, before the spare ones
  };
  // 1 query: 6 pairs per SM per shard and 64 documents to spare (a shard's count of 0-170-token documents varies
  // by ~30); 3 queries: 12 per SM, three times the ring's 4.
  const Case cases[] = {{128, 1, 32, Shape::kClustered, 6 * sms + 64},
                        {128, 3, 16, Shape::kDuplicates, 4 * sms},
                        {64, 3, 32, Shape::kNearTies, 4 * sms}};
  uint64_t salt = 190;
  for (const Case& c : cases) {
    auto rng = Rng(++salt);
    const uint64_t nd = c.nd * devices + 17;
    const TokenSets q = Encoded(Generate(rng, Shape::kUnitGaussian, c.nq, 1, c.max_lq, c.dim), MAXSIM_BF16);
    const TokenSets d = Encoded(Generate(rng, c.docs, nd, 0, 170, c.dim), MAXSIM_BF16);
    ASSERT_LT(d.rows(), 224 * nd) << "below the rule: documents of under 224 tokens on average";
    const std::string what = "below the rule: " + std::to_string(c.nq) + " queries dim " + std::to_string(c.dim) +
                             " lq <= " + std::to_string(c.max_lq) + " docs " + ShapeName(c.docs);
    ExpectCoopSidesAgree(one, sides, q, d, Packed::Pack(one, d.Dense()), DeviceSets(d), what, {});
    if (::testing::Test::HasFatalFailure()) return;
  }
  // 32 queries over 12 pairs per SM on every shard (the documents' lengths vary little).
  auto trng = Rng(195);
  const uint64_t tnq = 32;
  ExpectCrossWarpTies(one, sides, trng, tnq, (12 * sms + tnq - 1) / tnq * devices + 13);
}

// nq queries of lq rows (bf16) with one nonzero dimension per row over nd one-token documents, so that each row term
// is one product of two bf16 values, exact in f32, and the host knows every term and the token-order chain's score
// bits (`want`, query-major) and the terms' exponent fields (`inside`: the pairs where ordered_sum.h's rule lets any
// order give the chain's double). spread: rows 0, 1 and 2 are 2^50 a e_k, b e_j and -2^50 a e_k: in token order b's
// low bits are lost against 2^50 a and what is left after the cancellation is b rounded to a multiple of 2^50 a's
// ulp, where a tree that cancels rows 0 and 2 first keeps b whole; so a kernel that took the tree where the rule
// refuses it (the terms span some 50 exponents) gives other bits. The other rows are random (some zero): Gaussian
// values; without spread, rows 0-2 too and every value +-[0.5, 2), so that the terms span at most 4 exponents and
// every pair with a nonzero term falls inside the rule however long the query.
struct ChainOracle {
  TokenSets q, d;
  std::vector<float> want;
  uint64_t inside = 0;
};
ChainOracle MakeChainOracle(std::mt19937_64& rng, uint64_t lq, uint64_t nd, uint64_t nq = 1, bool spread = true) {
  ChainOracle o;
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  auto g = [&]() {
    if (spread) return gauss(rng);
    const float mantissa = 1.0f + static_cast<float>(rng() % 256) / 256.0f;
    const int scale = -static_cast<int>(rng() % 2);
    const float m = std::ldexp(mantissa, scale);
    return rng() % 2 ? m : -m;
  };
  const uint32_t dim = 128;
  o.q.dim = o.d.dim = dim;
  o.q.offsets.resize(nq + 1);
  for (uint64_t i = 0; i <= nq; ++i) o.q.offsets[i] = i * lq;
  o.q.values.assign(nq * lq * dim, 0.0f);
  for (uint64_t i = 0; i < nq; ++i) {
    float* qv = o.q.values.data() + i * lq * dim;
    uint64_t r = 0;
    if (spread) {
      const uint32_t k = static_cast<uint32_t>(rng() % dim), j = (k + 1 + static_cast<uint32_t>(rng() % (dim - 1))) % dim;
      const float a = std::ldexp(1.0f + static_cast<float>(rng() % 128) / 128.0f, 50);
      qv[0 * dim + k] = a;
      if (lq > 1) qv[1 * dim + j] = g();
      if (lq > 2) qv[2 * dim + k] = -a;
      r = 3;
    }
    for (; r < lq; ++r) {
      if (rng() % 5 != 0) qv[r * dim + rng() % dim] = g();
    }
  }
  o.q.Encode(MAXSIM_BF16);
  o.d.offsets.resize(nd + 1);
  for (uint64_t t = 0; t <= nd; ++t) o.d.offsets[t] = t;
  o.d.values.resize(nd * dim);
  for (float& v : o.d.values) v = g();
  o.d.Encode(MAXSIM_BF16);
  o.want.resize(nq * nd);
  for (uint64_t i = 0; i < nq; ++i) {
    const float* qv = o.q.values.data() + i * lq * dim;
    for (uint64_t t = 0; t < nd; ++t) {
      double sum = 0.0;
      uint32_t hi = 0, lo = 255;
      for (uint64_t r = 0; r < lq; ++r) {
        float term = 0.0f;  // the row's one product (exact in f32), or +0 for a zero row
        for (uint32_t c = 0; c < dim; ++c) {
          if (qv[r * dim + c] != 0.0f) term = qv[r * dim + c] * o.d.values[t * dim + c];
        }
        sum += static_cast<double>(term);
        const uint32_t e = mscuda::OrderedSumField(term);
        if (e != 0) hi = std::max(hi, e), lo = std::min(lo, e);
      }
      o.want[i * nd + t] = static_cast<float>(sum);
      o.inside += mscuda::OrderedSumAnyOrder(hi, lo, lq);
    }
  }
  return o;
}

// Each context's scores of the oracle's queries over its documents, packed, must be the chain's bits.
void ExpectChainBits(const std::vector<CoopSide>& ctxs, const ChainOracle& o, const std::string& what) {
  for (const CoopSide& c : ctxs) {
    const Packed pq = Packed::Pack(*c.ctx, o.q.Dense()), pd = Packed::Pack(*c.ctx, o.d.Dense());
    ExpectSameBits(ScoreValues(*c.ctx, pq, o.q.n_sets(), pd, o.d.n_sets(), MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT), o.want,
                   what + ", " + c.name + ": the token-order chain's bits (host)");
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// The span of binary exponents of one-query pair (0, j)'s nonzero row terms, estimated on the host from the float64
// similarity at m's argmax (m: a one-query matrix with argmax); -1 for an empty document or no nonzero term. Within
// a unit or two of the span of the kernels' f32 terms' exponent fields, which is what ordered_sum.h's rule reads.
int EstimatedTermSpan(const TokenSets& q, const TokenSets& d, const Matrix& m, uint64_t j) {
  const uint64_t lq = q.length(0);
  int hi = INT32_MIN, lo = INT32_MAX;
  for (uint64_t r = 0; r < lq && d.length(j) > 0; ++r) {
    const int32_t t = m.argmax[j * lq + r];
    if (t < 0) continue;
    const double v = RefSim(q, 0, r, d, j, static_cast<uint64_t>(t), MAXSIM_METRIC_DOT);
    if (v == 0.0) continue;
    int e = 0;
    std::frexp(v, &e);
    hi = std::max(hi, e);
    lo = std::min(lo, e);
  }
  return hi < lo ? -1 : hi - lo;
}

TEST_F(Gpu, ScoresOnlyEndsSumTheRowsInTokenOrder) {
  // The dealt kernel's and the grid's scores-only ends (MergeWriteScore) sum a pair's row terms with
  // WarpOrderedSum: a tree over the warp's lanes where ordered_sum.h's rule allows it (the terms' exponent fields
  // within 29 - ceil(log2 lq): 24 for 32 rows, 25 for 16; then every partial sum is exact, so any order gives
  // OrderedSum's double), else the chain in token order. Both must give the one-pair-per-warp kernel's bits
  // (OrderedSum on one lane), packed and dense: query rows scaled by powers of two so that the terms' exponent
  // fields span 0 to about 112 (around the rule's limit on either side by document), negative and tiny row maxima
  // (documents of 1-3 tokens), and rows in +- pairs over one-token documents, whose terms cancel to an exact zero.
  // The host estimates each pair's span from the float64 similarity at the one-pair kernel's argmax and requires
  // pairs well inside and well outside the limit. Scores rounded to f32 hide most differences between sums in
  // double, so the host also computes the chain's bits where it knows every term (MakeChainOracle), with terms
  // whose tree sum would give other f32 bits.
  const ShardDevices dev = ContextDevices();
  ASSERT_GT(dev.max_sms, 0u) << "cannot read the SM count of the devices in MAXSIM_CUDA_DEVICES / MAXSIM_CUDA_DEVICE";
  const uint64_t sms = dev.max_sms, devices = dev.count;
  ScopedEnv no_coop("MAXSIM_CUDA_NO_COOP", "1");
  Context dealt = CudaContextWithEnv("MAXSIM_CUDA_EXPERIMENTAL", "dealt-always");
  no_coop.Restore();
  ScopedEnv no_batch("MAXSIM_CUDA_NO_BATCH", "1");
  Context grid = CudaContextWithEnv("MAXSIM_CUDA_EXPERIMENTAL", "coop-always");
  no_batch.Restore();
  Context one = CudaContextWithEnv("MAXSIM_CUDA_NO_PIPE", "1");
  std::vector<CoopSide> sides = {{&dealt, "dealt"}};
  const char* nc = std::getenv("MAXSIM_CUDA_NO_COOP");
  if (nc == nullptr || nc[0] == '\0' || std::strcmp(nc, "0") == 0) sides.push_back({&grid, "forced grid"});
  // Documents per shard: 5 per SM, in the dealt kernel's range (at most 32) and past the grid's forcing floor (4).
  const uint64_t nd = (5 * sms + 16) * devices + 7;
  uint64_t inside = 0, outside = 0;  // pairs whose estimated span is <= 22 / >= 27
  auto spans = [&](const TokenSets& q, const TokenSets& d, const Matrix& m) {
    for (uint64_t j = 0; j < d.n_sets(); ++j) {
      const int span = EstimatedTermSpan(q, d, m, j);
      inside += span >= 0 && span <= 22;
      outside += span >= 27;
    }
  };
  struct Case {
    uint64_t lq, max_len;
    std::vector<int> scale;  // row r is multiplied by 2^scale[r % size]
  };
  const Case cases[] = {{32, 400, {0}},
                        {32, 400, {24, 0, 0, 0, 0, 0, 0, 0}},
                        {29, 300, {0, 0, 22, 0, 0, -3, 0}},
                        {16, 300, {-25, 0, 0, 0}},
                        {32, 3, {40, -40, 0, 12}},
                        {32, 400, {56, -56}}};
  uint64_t salt = 260;
  for (const Case& c : cases) {
    auto rng = Rng(++salt);
    TokenSets q = Generate(rng, Shape::kUnitGaussian, 1, c.lq, c.lq, 128);
    for (uint64_t r = 0; r < c.lq; ++r) {
      for (uint32_t k = 0; k < q.dim; ++k) q.values[r * q.dim + k] = std::ldexp(q.values[r * q.dim + k], c.scale[r % c.scale.size()]);
    }
    q.Encode(MAXSIM_BF16);
    const TokenSets d = Encoded(Generate(rng, Shape::kClustered, nd, 0, c.max_len, 128), MAXSIM_BF16);
    std::string scales;
    for (int e : c.scale) scales += " " + std::to_string(e);
    const std::string what = std::to_string(c.lq) + " query rows scaled by 2^(" + scales + " ), documents of 0-" +
                             std::to_string(c.max_len) + " tokens";
    const Packed pd = Packed::Pack(one, d.Dense());
    ExpectCoopSidesAgree(one, sides, q, d, pd, DeviceSets(d), what,
                         [&](const Matrix& m, const std::string& side) {
                           if (side == what + " one pair per warp") spans(q, d, m);
                         });
    if (::testing::Test::HasFatalFailure()) return;
  }
  EXPECT_GT(inside, 100u) << "pairs whose terms span at most 22 exponents (the tree)";
  EXPECT_GT(outside, 100u) << "pairs whose terms span 27 exponents or more (the chain)";
  // The host's chain: terms spanning some 50 exponents, whose tree sum would differ.
  {
    auto orng = Rng(275);
    std::vector<CoopSide> ctxs = sides;
    ctxs.push_back({&one, "one pair per warp"});
    for (uint64_t lq : {32ull, 29ull, 16ull, 3ull}) {
      ExpectChainBits(ctxs, MakeChainOracle(orng, lq, nd), std::to_string(lq) + " rows of one product each");
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  // Rows in +- pairs over one-token documents: each pair of terms cancels exactly, the score is +0.
  auto rng = Rng(270);
  TokenSets q = Generate(rng, Shape::kUnitGaussian, 1, 32, 32, 128);
  for (uint64_t r = 1; r < 32; r += 2) {
    for (uint32_t k = 0; k < q.dim; ++k) q.values[r * q.dim + k] = -q.values[(r - 1) * q.dim + k];
  }
  q.Encode(MAXSIM_BF16);
  const TokenSets d = Encoded(Generate(rng, Shape::kClustered, nd, 1, 1, 128), MAXSIM_BF16);
  const Packed pq = Packed::Pack(one, q.Dense()), pd = Packed::Pack(one, d.Dense());
  const std::vector<float> want = ScoreValues(one, pq, 1, pd, nd, MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT);
  for (uint64_t j = 0; j < nd; ++j) {
    ASSERT_EQ(0u, (uint32_t)std::signbit(want[j]) + (want[j] != 0.0f)) << "document " << j << ": " << want[j];
  }
  for (const CoopSide& side : sides) {
    ExpectSameBits(ScoreValues(*side.ctx, pq, 1, pd, nd, MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT), want,
                   std::string("+- rows over one-token documents, ") + side.name);
  }
}

TEST_F(Gpu, LongQueryPairEndsSumTheRowsInTokenOrder) {
  // The wgmma kernel's pair end for a query that one row group covers (65-128 rows here: FinishPair) sums the row
  // terms with WarpOrderedSumOf: lanes add every 32nd term and meet in a tree where the terms' exponent fields span at
  // most 29 - ceil(log2 lq) (22 for 128 terms), else lane 0 adds them in token order. Its scores must be the
  // long-query mma.sync kernel's bits (MAXSIM_CUDA_WGMMA=0: one thread's OrderedSum in token order), packed and
  // dense, with query rows scaled by powers of two on both sides of the span and rows in +- pairs over one-token
  // documents (an exact zero). The host estimates each pair's span (float64 similarity at the mma.sync kernel's
  // argmax) and requires pairs well inside and well outside it; and the host's chain bits where it knows every term
  // (MakeChainOracle), for both kernels.
  if (!Sm90("the wgmma kernel does not run here")) GTEST_SKIP() << "the wgmma kernel needs sm_90";
  Context gpu(Options("cuda"));
  Context mma = CudaContextWithEnv("MAXSIM_CUDA_WGMMA", "0");
  const ShardDevices dev = ContextDevices();
  ASSERT_GT(dev.max_sms, 0u) << "cannot read the SM count of the devices in MAXSIM_CUDA_DEVICES / MAXSIM_CUDA_DEVICE";
  const uint64_t nd = (2 * dev.max_sms + 5) * dev.count;
  uint64_t inside = 0, outside = 0;  // pairs whose estimated span is <= 19 / >= 25
  struct Case {
    uint64_t lq, max_len;
    std::vector<int> scale;  // row r is multiplied by 2^scale[r % size]
    bool pm = false;         // rows in +- pairs, over one-token documents
  };
  const Case cases[] = {{128, 600, {0}},
                        {128, 600, {22, 0, 0, 0, 0, 0, 0}},
                        {100, 500, {0, -21, 0, 0, 0}},
                        {65, 3, {40, -40, 0, 12}},
                        {128, 600, {56, -56}},
                        {128, 1, {0, 3, -5}, true}};
  uint64_t salt = 280;
  for (const Case& c : cases) {
    auto rng = Rng(++salt);
    TokenSets q = Generate(rng, Shape::kUnitGaussian, 1, c.lq, c.lq, 128);
    for (uint64_t r = 0; r < c.lq; ++r) {
      for (uint32_t k = 0; k < q.dim; ++k) {
        float& v = q.values[r * q.dim + k];
        v = c.pm && r % 2 == 1 ? -q.values[(r - 1) * q.dim + k] : std::ldexp(v, c.scale[r % c.scale.size()]);
      }
    }
    q.Encode(MAXSIM_BF16);
    const TokenSets d = Encoded(Generate(rng, Shape::kClustered, nd, c.pm ? 1 : 0, c.max_len, 128), MAXSIM_BF16);
    std::string scales;
    for (int e : c.scale) scales += " " + std::to_string(e);
    const std::string what = std::to_string(c.lq) + " query rows scaled by 2^(" + scales + " )" +
                             (c.pm ? " in +- pairs" : "") + ", documents of 0-" + std::to_string(c.max_len) + " tokens";
    const Packed pq = Packed::Pack(gpu, q.Dense()), pd = Packed::Pack(gpu, d.Dense());
    const std::vector<float> want = ScoreValues(mma, pq, 1, pd, nd, MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT);
    ExpectSameBits(ScoreValues(gpu, pq, 1, pd, nd, MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT), want, what + ": wgmma");
    const DeviceSets dq(q), dd(d);
    ExpectSameBits(DeviceScoreValues(gpu, dq, dd, MAXSIM_METRIC_DOT), want, what + ": wgmma, dense");
    if (::testing::Test::HasFatalFailure()) return;
    if (c.pm) {
      for (uint64_t j = 0; j < nd; ++j) {
        ASSERT_TRUE(want[j] == 0.0f && !std::signbit(want[j])) << what << ": document " << j << " scored " << want[j];
      }
      continue;
    }
    const Matrix m = ScoreMatrix(mma, pq, 1, q.rows(), pd, nd, MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT);
    ExpectReference(q, d, MAXSIM_METRIC_DOT, m, what + ": mma.sync", 200);
    ExpectSameBits(m.scores, want, what + ": mma.sync with argmax");
    if (::testing::Test::HasFatalFailure()) return;
    for (uint64_t j = 0; j < nd; ++j) {
      const int span = EstimatedTermSpan(q, d, m, j);
      inside += span >= 0 && span <= 19;
      outside += span >= 25;
    }
  }
  // The host's chain: terms spanning some 50 exponents, whose tree sum would differ.
  auto orng = Rng(290);
  for (uint64_t lq : {128ull, 100ull, 65ull}) {
    ExpectChainBits({{&gpu, "wgmma"}, {&mma, "mma.sync"}}, MakeChainOracle(orng, lq, nd),
                    std::to_string(lq) + " rows of one product each");
    if (::testing::Test::HasFatalFailure()) return;
  }
  EXPECT_GT(inside, 50u) << "pairs whose terms span at most 19 exponents (the tree)";
  EXPECT_GT(outside, 50u) << "pairs whose terms span 25 exponents or more (the chain)";
}

TEST_F(Gpu, FinalizeSumsTheRowsInTokenOrder) {
  // FinalizeKernel sums a pair's row terms from the partial results after the kernels that leave them there: the
  // wgmma pair kernel for queries of several 256-row groups, the wgmma batch kernel (several queries of at most 128
  // rows, scores only) and the long-query mma.sync kernel (MAXSIM_CUDA_WGMMA=0) with several row groups. Its lanes
  // add every 32nd term and meet in a tree where the terms' exponent fields span at most 29 - ceil(log2 lq), else
  // every lane runs the chain in token order. On rows of one product each over one-token documents the host knows
  // every term: every pair's score must be the host chain's bits, with the terms spread over some 50 exponents (the
  // chain) and over at most 4 (the tree: the host counts the pairs inside the rule).
  Context gpu(Options("cuda"));
  Context mma = CudaContextWithEnv("MAXSIM_CUDA_WGMMA", "0");
  const ShardDevices dev = ContextDevices();
  ASSERT_GT(dev.max_sms, 0u) << "cannot read the SM count of the devices in MAXSIM_CUDA_DEVICES / MAXSIM_CUDA_DEVICE";
  const uint64_t nd = (dev.max_sms + 7) * dev.count;
  const std::vector<CoopSide> ctxs = {{&gpu, "default kernels"}, {&mma, "mma.sync"}};
  struct Case {
    uint64_t lq, nq;
  };
  // 1024, 1000 and 300 rows: both pair kernels with 4, 4 and 2 row groups; Finalize's lanes take 4 chunks of eight
  // loads each (1024), 4 on lanes 0-7 and 3 and a tail on the others (1000), one chunk and a tail (300). 4 x 100,
  // 8 x 32 and 2 x 33 rows: the batch kernel on sm_90 (in-kernel sums elsewhere and with mma.sync), tails only.
  const Case cases[] = {{1024, 1}, {1000, 1}, {300, 1}, {100, 4}, {32, 8}, {33, 2}};
  auto rng = Rng(310);
  uint64_t inside = 0, pairs = 0;
  for (const Case& c : cases) {
    for (bool spread : {true, false}) {
      const ChainOracle o = MakeChainOracle(rng, c.lq, nd, c.nq, spread);
      ExpectChainBits(ctxs, o, std::to_string(c.nq) + " x " + std::to_string(c.lq) + " rows of one product each" +
                                  (spread ? ", spread over 50 exponents" : ""));
      if (::testing::Test::HasFatalFailure()) return;
      if (!spread) inside += o.inside, pairs += c.nq * nd;
      if (spread) EXPECT_EQ(o.inside, 0u) << c.lq << " rows: every spread pair is outside the rule";
    }
  }
  EXPECT_GT(inside, pairs * 9 / 10) << "pairs inside the rule (the tree), of " << pairs;
}

// maxsim_backward's arguments; the candidate lists are passed for the candidates layout only.
maxsim_backward_args BackwardCall(maxsim_layout layout, const int32_t* argmax, const float* grad, float* grad_q,
                                  float* grad_d, int deterministic, const std::vector<uint64_t>* off = nullptr,
                                  const std::vector<uint64_t>* cand = nullptr) {
  maxsim_backward_args a;
  maxsim_backward_args_init(&a);
  a.layout = layout;
  if (layout == MAXSIM_LAYOUT_CANDIDATES) {
    a.cand_offsets = off->data();
    a.candidates = cand->data();
  }
  a.argmax = argmax;
  a.grad_scores = grad;
  a.grad_queries = grad_q;
  a.grad_documents = grad_d;
  a.deterministic = deterministic;
  return a;
}

// Element-wise bound for an f32 accumulation of `terms` products against a double reference.
void ExpectGrad(const GradRef& ref, const std::vector<float>& got, uint64_t lead_rows, uint32_t dim,
                const std::string& what) {
  ASSERT_EQ(GradMismatch(ref, got, lead_rows, dim), "") << what;
}

TEST_F(Gpu, BackwardMatchesCpuAndIsDeterministic) {
  Context gpu(Options("cuda"));
  Context cpu(Options("cpu"));
  const DenseCase cases[] = {
      {MAXSIM_BF16, 128, false, 0, 0}, {MAXSIM_F16, 64, true, 2, 0}, {MAXSIM_F32, 96, true, 0, 4},
      {MAXSIM_BF16, 160, false, 1, 0},
  };
  uint64_t salt = 700;
  for (const DenseCase& c : cases) {
    for (maxsim_layout layout : {MAXSIM_LAYOUT_MATRIX, MAXSIM_LAYOUT_CANDIDATES, MAXSIM_LAYOUT_PAIRS}) {
      auto rng = Rng(++salt);
      TokenSets q = Encoded(Generate(rng, Shape::kUnitGaussian, 8, 0, 36, c.dim), c.dtype);
      TokenSets d = Encoded(Generate(rng, Shape::kClustered, 8, 0, 70, c.dim), c.dtype);
      if (c.masks) {
        RandomMask(rng, q, 0.2);
        RandomMask(rng, d, 0.2);
      }
      const DeviceSets dq(q, c.lead, c.pad), dd(d, c.lead, c.pad);
      std::vector<uint64_t> off = {0}, cand;
      if (layout == MAXSIM_LAYOUT_CANDIDATES) {
        for (uint64_t i = 0; i < q.n_sets(); ++i) {
          for (int k = 0; k < 5; ++k) cand.push_back(rng() % d.n_sets());  // repeats: contended destinations
          off.push_back(cand.size());
        }
      }
      uint64_t n_scores = 0, am_size = 0;
      for (uint64_t i = 0; i < q.n_sets(); ++i) {
        const uint64_t n = layout == MAXSIM_LAYOUT_MATRIX ? d.n_sets() : layout == MAXSIM_LAYOUT_PAIRS ? 1 : off[i + 1] - off[i];
        n_scores += n;
        am_size += n * q.length(i);
      }
      const Matrix fwd = DeviceForward(gpu, dq, dd, layout, off, cand, am_size, MAXSIM_METRIC_DOT);
      std::vector<float> grad(n_scores);
      std::normal_distribution<float> gn(0.0f, 1.0f);
      for (float& g : grad) g = gn(rng);
      Dev<int32_t> d_am(am_size);
      d_am.Up(fwd.argmax.data());
      Dev<float> d_grad(n_scores);
      d_grad.Up(grad.data());
      const uint64_t qrows = dq.offsets.back(), drows = dd.offsets.back();
      auto run = [&](int deterministic, std::vector<float>* gq, std::vector<float>* gd) {
        Dev<float> o_q(qrows * c.dim), o_d(drows * c.dim);
        o_q.Fill(0x7f);
        o_d.Fill(0x7f);
        const maxsim_backward_args a = BackwardCall(layout, d_am.p, d_grad.p, o_q.p, o_d.p, deterministic, &off, &cand);
        ASSERT_EQ(maxsim_backward(gpu.get(), &dq.s, &dd.s, &a), MAXSIM_OK) << maxsim_last_error();
        *gq = o_q.Down();
        *gd = o_d.Down();
      };
      const std::string what = "dtype " + std::to_string(c.dtype) + " dim " + std::to_string(c.dim) + " layout " +
                               std::to_string(layout) + (c.masks ? " masked" : "");
      std::vector<float> gq1, gd1, gq2, gd2, gqa, gda;
      run(1, &gq1, &gd1);
      run(1, &gq2, &gd2);
      run(0, &gqa, &gda);
      ASSERT_EQ(0, std::memcmp(gq1.data(), gq2.data(), gq1.size() * 4)) << what << ": grad_Q not deterministic";
      ASSERT_EQ(0, std::memcmp(gd1.data(), gd2.data(), gd1.size() * 4)) << what << ": grad_D not deterministic";
      GradRef rq, rd;
      ReferenceGrads(q, d, layout, off, cand, fwd.argmax, grad, &rq, &rd);
      ExpectGrad(rq, gq1, c.lead, c.dim, what + " grad_Q");
      ExpectGrad(rd, gd1, c.lead, c.dim, what + " grad_D deterministic");
      ExpectGrad(rd, gda, c.lead, c.dim, what + " grad_D atomic");
      // The CPU backward on host copies agrees within the same bounds.
      std::vector<float> cq(q.rows() * c.dim), cd(d.rows() * c.dim);
      const maxsim_backward_args ca =
          BackwardCall(layout, fwd.argmax.data(), grad.data(), cq.data(), cd.data(), 1, &off, &cand);
      const DenseSets hq = q.Dense(), hd = d.Dense();
      ASSERT_EQ(maxsim_backward(cpu.get(), hq.get(), hd.get(), &ca), MAXSIM_OK) << maxsim_last_error();
      ExpectGrad(rq, cq, 0, c.dim, what + " CPU grad_Q");
      ExpectGrad(rd, cd, 0, c.dim, what + " CPU grad_D");
    }
  }
}

// The deterministic grad_D of every layout, bit for bit: each element is the f32 FMA chain, from 0, over its
// contributions in (pair, query token) order; and grad_Q, whose rows are the chain over their pairs in order. Many
// query tokens on one document token (long runs, over several sort chunks of the one-launch backward and two index
// chunks of the sorted index), ties from duplicated document tokens, masks, -1 entries, ragged sets with empty and
// one-token sets, documents over several row blocks, uniform sets (no offsets), rows before the first set, 8 to 160
// dims (30: not a multiple of 4). Each case runs on the default route (the one-launch backward for the matrix and
// pairs layouts, the sorted index for candidates) and on the separate kernels (MAXSIM_CUDA_NO_DOC_BACKWARD=1: the
// sorted index everywhere); with deterministic = 0 (grad_D by atomics) grad_Q keeps its bits.
TEST_F(Gpu, DeterministicGradDIsTheOrderedFmaChain) {
  Context gpu(Options("cuda"));
  Context separate = CudaContextWithEnv("MAXSIM_CUDA_NO_DOC_BACKWARD", "1");
  struct Case {
    maxsim_layout layout;
    uint64_t nq, nd, lq, ld;
    uint32_t dim;
    bool from_forward, masks;
    uint64_t lead;
    bool ragged, uniform;
  };
  const Case cases[] = {
      {MAXSIM_LAYOUT_MATRIX, 48, 6, 40, 30, 160, false, true, 1, false, false},
      {MAXSIM_LAYOUT_CANDIDATES, 40, 9, 33, 20, 64, false, false, 0, true, false},
      {MAXSIM_LAYOUT_PAIRS, 30, 30, 70, 5, 96, false, true, 0, true, false},
      {MAXSIM_LAYOUT_MATRIX, 20, 12, 32, 24, 128, true, false, 0, false, false},
      // 160 x 128 pairs x 32 tokens: more argmax entries than one index chunk holds (kIndexEntries), and 5120
      // entries per document (several sort chunks of the one-launch backward).
      {MAXSIM_LAYOUT_MATRIX, 160, 128, 32, 8, 32, false, false, 2, false, false},
      // Ragged queries (empty and one-token sets) and documents of up to 150 tokens (several row blocks), masks.
      {MAXSIM_LAYOUT_MATRIX, 37, 7, 45, 150, 96, false, true, 3, true, false},
      // Queries of 0 or 1 token against documents of up to 200 tokens.
      {MAXSIM_LAYOUT_PAIRS, 50, 50, 1, 200, 128, false, false, 0, true, false},
      // The training benchmark's sets (uniform, no offsets), argmax from the forward on duplicated tokens (ties).
      {MAXSIM_LAYOUT_MATRIX, 64, 16, 32, 300, 128, true, false, 0, false, true},
      {MAXSIM_LAYOUT_MATRIX, 1, 3, 1, 1, 8, false, false, 0, false, true},
      // 30 dims: rows read element by element (no 8-byte loads), documents over two row blocks.
      {MAXSIM_LAYOUT_MATRIX, 12, 5, 9, 70, 30, false, true, 0, true, false},
  };
  uint64_t salt = 900;
  for (const Case& c : cases) {
    auto rng = Rng(++salt);
    TokenSets q = Encoded(Generate(rng, Shape::kUnitGaussian, c.nq, c.ragged ? 0 : c.lq, c.lq, c.dim), MAXSIM_BF16);
    TokenSets d = Encoded(Generate(rng, c.from_forward ? Shape::kDuplicates : Shape::kGaussian, c.nd,
                                   c.ragged ? 0 : c.ld, c.ld, c.dim), MAXSIM_BF16);
    if (c.masks) {
      RandomMask(rng, q, 0.2);
      RandomMask(rng, d, 0.2);
    }
    std::vector<uint64_t> off = {0}, cand;
    if (c.layout == MAXSIM_LAYOUT_CANDIDATES) {
      for (uint64_t i = 0; i < c.nq; ++i) {
        for (int k = 0; k < 4; ++k) cand.push_back(rng() % 3);  // repeats, few documents: contended rows
        off.push_back(cand.size());
      }
    }
    // Pairs in pair order: (query, document, argmax base).
    struct P { uint64_t i, j, base; };
    std::vector<P> pairs;
    uint64_t base = 0;
    for (uint64_t i = 0; i < c.nq; ++i) {
      if (c.layout == MAXSIM_LAYOUT_MATRIX) {
        for (uint64_t j = 0; j < c.nd; ++j) pairs.push_back({i, j, c.nd * q.offsets[i] + j * q.length(i)});
      } else if (c.layout == MAXSIM_LAYOUT_PAIRS) {
        pairs.push_back({i, i, q.offsets[i]});
      } else {
        for (uint64_t e = off[i]; e < off[i + 1]; ++e, base += q.length(i)) pairs.push_back({i, cand[e], base});
      }
    }
    const uint64_t am_size = c.layout == MAXSIM_LAYOUT_MATRIX ? c.nd * q.rows() : c.layout == MAXSIM_LAYOUT_PAIRS ? q.rows() : base;
    DeviceSets dq(q, 0, 0), dd(d, c.lead, 0);
    if (c.uniform) {  // the same sets addressed by their length
      dq.s.offsets = nullptr;
      dq.s.set_length = c.lq;
      dd.s.offsets = nullptr;
      dd.s.set_length = c.ld;
    }
    std::vector<int32_t> argmax(am_size, -1);
    if (c.from_forward) {
      argmax = DeviceForward(gpu, dq, dd, c.layout, off, cand, am_size, MAXSIM_METRIC_DOT).argmax;
    } else {
      // Most tokens on the document's first kept token, the rest on any kept token or -1.
      std::uniform_real_distribution<double> u(0.0, 1.0);
      for (const P& p : pairs) {
        std::vector<int32_t> kept;
        for (uint64_t t = 0; t < d.length(p.j); ++t) {
          if (d.kept(d.offsets[p.j] + t)) kept.push_back(static_cast<int32_t>(t));
        }
        for (uint64_t s = 0; s < q.length(p.i); ++s) {
          const double r = u(rng);
          argmax[p.base + s] = kept.empty() || r < 0.05 ? -1 : r < 0.7 ? kept[0] : kept[rng() % kept.size()];
        }
      }
    }
    std::vector<float> grad(pairs.size());
    std::normal_distribution<float> gn(0.0f, 1.0f);
    for (float& g : grad) g = gn(rng);
    // The ordered FMA chains on the host: grad_D over (pair, token), grad_Q over each row's pairs.
    const uint64_t drows = c.lead + d.rows();
    std::vector<float> want(drows * c.dim, 0.0f), want_q(q.rows() * c.dim, 0.0f);
    for (uint64_t p = 0; p < pairs.size(); ++p) {
      const P& x = pairs[p];
      for (uint64_t s = 0; s < q.length(x.i); ++s) {
        const int32_t t = argmax[x.base + s];
        const uint64_t qr = q.offsets[x.i] + s;
        if (t < 0 || !q.kept(qr)) continue;
        float* out = &want[(c.lead + d.offsets[x.j] + t) * c.dim];
        float* out_q = &want_q[qr * c.dim];
        const float* drow = d.row(d.offsets[x.j] + t);
        for (uint32_t k = 0; k < c.dim; ++k) {
          out[k] = std::fmaf(grad[p], q.row(qr)[k], out[k]);
          out_q[k] = std::fmaf(grad[p], drow[k], out_q[k]);
        }
      }
    }
    Dev<int32_t> d_am(am_size);
    d_am.Up(argmax.data());
    Dev<float> d_grad(grad.size());
    d_grad.Up(grad.data());
    auto check = [&](Context& ctx, int deterministic, bool exact_d, const std::string& what) {
      Dev<float> o_d(drows * c.dim), o_q(q.rows() * c.dim);
      o_d.Fill(0x7f);
      o_q.Fill(0x7f);
      const maxsim_backward_args a = BackwardCall(c.layout, d_am.p, d_grad.p, o_q.p, o_d.p, deterministic, &off, &cand);
      ASSERT_EQ(maxsim_backward(ctx.get(), &dq.s, &dd.s, &a), MAXSIM_OK) << maxsim_last_error();
      const std::string where = what + ", layout " + std::to_string(c.layout) + " dim " + std::to_string(c.dim) +
                                " nq " + std::to_string(c.nq) + " ld " + std::to_string(c.ld);
      for (int side = exact_d ? 0 : 1; side < 2; ++side) {
        const std::vector<float> got = side == 0 ? o_d.Down() : o_q.Down();
        const std::vector<float>& ref = side == 0 ? want : want_q;
        for (uint64_t e = 0; e < ref.size(); ++e) {
          uint32_t w, g;
          std::memcpy(&w, &ref[e], 4);
          std::memcpy(&g, &got[e], 4);
          ASSERT_EQ(w, g) << where << ": " << (side == 0 ? "grad_D" : "grad_Q") << " row " << e / c.dim << " element "
                          << e % c.dim << " is " << got[e] << ", the ordered chain gives " << ref[e];
        }
      }
    };
    check(gpu, 1, true, "deterministic");
    check(gpu, 0, false, "deterministic = 0 (grad_D by atomics)");
    check(separate, 1, true, "separate kernels, deterministic");
  }
}

// The backward's check names the first bad argmax entry and the first non-finite gradient, the same on the
// one-launch backward (where each document's first block checks its entries) and on the separate check kernel.
TEST_F(Gpu, BackwardCheckNamesTheFirstBadEntry) {
  Context gpu(Options("cuda"));
  Context separate = CudaContextWithEnv("MAXSIM_CUDA_NO_DOC_BACKWARD", "1");
  auto rng = Rng(950);
  TokenSets q = Encoded(Generate(rng, Shape::kGaussian, 9, 0, 20, 64), MAXSIM_BF16);
  TokenSets d = Encoded(Generate(rng, Shape::kGaussian, 9, 0, 90, 64), MAXSIM_BF16);
  RandomMask(rng, d, 0.2);
  const DeviceSets dq(q), dd(d);
  for (maxsim_layout layout : {MAXSIM_LAYOUT_MATRIX, MAXSIM_LAYOUT_PAIRS}) {
    const uint64_t nd = layout == MAXSIM_LAYOUT_MATRIX ? d.n_sets() : 1;
    const uint64_t am_size = nd * q.rows(), n_scores = layout == MAXSIM_LAYOUT_MATRIX ? q.n_sets() * d.n_sets() : q.n_sets();
    const std::vector<int32_t> good = DeviceForward(gpu, dq, dd, layout, {}, {}, am_size, MAXSIM_METRIC_DOT).argmax;
    std::vector<float> grad(n_scores, 0.5f);
    // A good backward on a context: its grad_Q then grad_D (the call must succeed).
    Dev<int32_t> d_good(good.size());
    d_good.Up(good.data());
    Dev<float> d_good_grad(grad.size());
    d_good_grad.Up(grad.data());
    auto good_call = [&](Context& ctx) {
      Dev<float> o_q(q.rows() * 64), o_d(d.rows() * 64);
      o_q.Fill(0);
      o_d.Fill(0);
      const maxsim_backward_args a = BackwardCall(layout, d_good.p, d_good_grad.p, o_q.p, o_d.p, 1);
      EXPECT_EQ(maxsim_backward(ctx.get(), &dq.s, &dd.s, &a), MAXSIM_OK) << maxsim_last_error();
      std::vector<float> out = o_q.Down(), gd = o_d.Down();
      out.insert(out.end(), gd.begin(), gd.end());
      return out;
    };
    const std::vector<float> clean[2] = {good_call(gpu), good_call(separate)};
    struct Bad {
      std::vector<uint64_t> entries;  // argmax entries set to a token that is not a kept token
      int64_t grad_pair;              // -1: none
      maxsim_status want;
      std::string names;
    };
    // An out-of-range token late in the array and an earlier one: the earlier is named.
    const uint64_t late = am_size - 1, early = am_size / 3;
    const Bad bads[] = {{{late, early}, -1, MAXSIM_ERR_INVALID_ARGUMENT, "argmax[" + std::to_string(early) + "]"},
                        {{}, static_cast<int64_t>(n_scores / 2), MAXSIM_ERR_NON_FINITE,
                         "grad_scores[" + std::to_string(n_scores / 2) + "]"}};
    for (const Bad& b : bads) {
      std::vector<int32_t> am = good;
      for (uint64_t e : b.entries) am[e] = 100000;
      std::vector<float> g = grad;
      if (b.grad_pair >= 0) g[b.grad_pair] = std::nanf("");
      Dev<int32_t> d_am(am.size());
      d_am.Up(am.data());
      Dev<float> d_grad(g.size()), o_q(q.rows() * 64), o_d(d.rows() * 64);
      d_grad.Up(g.data());
      for (Context* ctx : {&gpu, &separate}) {
        const maxsim_backward_args a = BackwardCall(layout, d_am.p, d_grad.p, o_q.p, o_d.p, 1);
        const maxsim_status st = maxsim_backward(ctx->get(), &dq.s, &dd.s, &a);
        const std::string msg = st == MAXSIM_OK ? "" : maxsim_last_error();
        const std::string what = std::string(ctx == &gpu ? "one launch" : "separate kernels") + ", layout " +
                                 std::to_string(layout);
        EXPECT_EQ(st, b.want) << what << ": " << msg;
        EXPECT_NE(msg.find(b.names), std::string::npos) << what << ": '" << msg << "' does not name " << b.names;
      }
    }
    // The check flags are cleared again after a reported entry (the plugin keeps them between calls): a good call
    // then succeeds with the bits of the one before the errors, twice (the second without clearing them).
    for (int rep = 0; rep < 2; ++rep) {
      const std::string when = ", layout " + std::to_string(layout) + ", good call " + std::to_string(rep) + " after errors";
      ExpectSameBits(good_call(gpu), clean[0], "one launch" + when);
      ExpectSameBits(good_call(separate), clean[1], "separate kernels" + when);
    }
  }
}

TEST_F(Gpu, ErrorsAreStatuses) {
  Context gpu(Options("cuda"));
  auto rng = Rng(800);
  TokenSets q = Encoded(Generate(rng, Shape::kGaussian, 2, 1, 8, 64), MAXSIM_BF16);
  TokenSets d = Encoded(Generate(rng, Shape::kGaussian, 2, 1, 8, 64), MAXSIM_BF16);
  TokenSets d32 = Encoded(Generate(rng, Shape::kGaussian, 2, 1, 8, 32), MAXSIM_BF16);
  // Dimension mismatch.
  Packed pq = Packed::Pack(gpu, q.Dense());
  Packed p32 = Packed::Pack(gpu, d32.Dense());
  std::vector<float> sc(4);
  maxsim_score_options o;
  maxsim_score_options_init(&o);
  maxsim_sets qs{pq.get(), nullptr}, ds{p32.get(), nullptr};
  EXPECT_EQ(maxsim_score_matrix(gpu.get(), &qs, &ds, &o, sc.data(), nullptr), MAXSIM_ERR_DIM_MISMATCH);
  // A NaN in a device tensor.
  TokenSets bad = q;
  bad.values[3] = std::nanf("");
  bad.Encode(MAXSIM_BF16);
  const DeviceSets dbad(bad), dd(d);
  maxsim_status st = MAXSIM_OK;
  DeviceForward(gpu, dbad, dd, MAXSIM_LAYOUT_MATRIX, {}, {}, d.n_sets() * q.rows(), MAXSIM_METRIC_DOT, &st);
  EXPECT_EQ(st, MAXSIM_ERR_NON_FINITE) << maxsim_last_error();
  // A corrupted argmax in the backward.
  const DeviceSets dq(q);
  const Matrix fwd = DeviceForward(gpu, dq, dd, MAXSIM_LAYOUT_MATRIX, {}, {}, d.n_sets() * q.rows(), MAXSIM_METRIC_DOT);
  std::vector<int32_t> am = fwd.argmax;
  am[0] = 1000;
  Dev<int32_t> d_am(am.size());
  d_am.Up(am.data());
  std::vector<float> grad(q.n_sets() * d.n_sets(), 1.0f);
  Dev<float> d_grad(grad.size()), o_q(q.rows() * 64), o_d(d.rows() * 64);
  d_grad.Up(grad.data());
  const maxsim_backward_args a = BackwardCall(MAXSIM_LAYOUT_MATRIX, d_am.p, d_grad.p, o_q.p, o_d.p, 0);
  EXPECT_EQ(maxsim_backward(gpu.get(), &dq.s, &dd.s, &a), MAXSIM_ERR_INVALID_ARGUMENT) << maxsim_last_error();
  // The context still works after the errors.
  const Matrix again = DeviceForward(gpu, dq, dd, MAXSIM_LAYOUT_MATRIX, {}, {}, d.n_sets() * q.rows(), MAXSIM_METRIC_DOT);
  ExpectReference(q, d, MAXSIM_METRIC_DOT, again, "after errors");
}

// Dense device inputs are not read a second time to check them: the value check is folded into the scoring
// kernels (a non-finite kept similarity sets a flag read back with the results; only then does a check pass name
// the token). Every kernel family is covered (short queries, long queries with argmax and values-only (wgmma on
// sm_90), f32 / FFMA), with uniform sets (no offsets) and offsets: a non-finite element in a kept query or
// document row is MAXSIM_ERR_NON_FINITE naming the set and token, and the outputs then hold nothing that could be
// taken for an answer (scores NaN, argmax -1); non-finite values in masked rows are never read as errors.
TEST_F(Gpu, FoldedInputCheckOnDeviceTensors) {
  Context gpu(Options("cuda"));
  struct Case {
    maxsim_dtype dtype;
    uint64_t lq;
    bool argmax, uniform;
    uint64_t nd = 5;
  };
  // The 600-document case has more documents than an H100 runs blocks, so that a block of the batch kernel
  // computes several: its warps check their query rows on their first tile only, and the warp that checks a
  // document's every column takes turns (exact_wgmma.cu). The 1024-token case runs the wgmma pair kernel with 4 row
  // groups, of which one block per pair checks the document's columns.
  const Case cases[] = {{MAXSIM_BF16, 32, false, true},  {MAXSIM_BF16, 32, true, false}, {MAXSIM_F16, 20, false, false},
                        {MAXSIM_BF16, 300, false, true}, {MAXSIM_BF16, 300, true, true}, {MAXSIM_F16, 130, false, false},
                        {MAXSIM_F32, 24, true, true},    {MAXSIM_BF16, 32, false, false, 600},
                        {MAXSIM_BF16, 1024, false, true, 80}};
  struct Bad {
    bool query;
    uint64_t set, token;
    uint32_t k;
    float value;
  };
  // Sets past the last and tokens past a set's end are clamped to the last. Long queries: query token 100 is in
  // no warp that checks every similarity (the wgmma kernel checks a sample, exact_wgmma.cu), document token 299
  // in no pair's first tile; the last document's last token: in a block's third document with 600 of them.
  const Bad bads[] = {{true, 1, 5, 3, std::nanf("")},  {false, 2, 7, 0, INFINITY},
                      {false, 4, 0, 127, -INFINITY},   {true, 2, 100, 64, -INFINITY},
                      {false, 1, 299, 9, std::nanf("")}, {false, 599, 299, 77, INFINITY}};
  uint64_t salt = 1800;
  for (const Case& c : cases) {
    auto rng = Rng(++salt);
    const std::string what = "dtype " + std::to_string(c.dtype) + " lq " + std::to_string(c.lq) +
                             (c.argmax ? " argmax" : " values") + (c.uniform ? " uniform" : " offsets") + " nd " +
                             std::to_string(c.nd);
    const TokenSets q = Encoded(Generate(rng, Shape::kUnitGaussian, 3, c.lq, c.lq, 128), c.dtype);
    const TokenSets d = Encoded(Generate(rng, Shape::kUnitGaussian, c.nd, c.uniform ? 300 : 40, 300, 128), c.dtype);
    auto run = [&](const TokenSets& tq, const TokenSets& td, maxsim_status* st, Matrix* m) {
      DeviceSets dq(tq), dd(td);
      if (c.uniform) {  // uniform sets are passed without offsets
        dq.s.offsets = nullptr;
        dq.s.set_length = tq.length(0);
        dd.s.offsets = nullptr;
        dd.s.set_length = td.length(0);
      }
      Dev<float> sc(q.n_sets() * d.n_sets());
      Dev<int32_t> am(d.n_sets() * q.rows());
      sc.Fill(0);  // finite: a partial result would show
      am.Fill(0);
      maxsim_score_options o;
      maxsim_score_options_init(&o);
      maxsim_sets qs{nullptr, &dq.s}, ds{nullptr, &dd.s};
      *st = maxsim_score_matrix(gpu.get(), &qs, &ds, &o, sc.p, c.argmax ? am.p : nullptr);
      m->scores = sc.Down();
      m->argmax = am.Down();
    };
    for (const Bad& b : bads) {
      TokenSets bq = q, bd = d;
      TokenSets& t = b.query ? bq : bd;
      const uint64_t set = std::min<uint64_t>(b.set, t.n_sets() - 1);
      const uint64_t token = std::min<uint64_t>(b.token, t.length(set) - 1);
      t.values[(t.offsets[set] + token) * t.dim + b.k] = b.value;
      t.Encode(c.dtype);
      maxsim_status st = MAXSIM_OK;
      Matrix m;
      run(bq, bd, &st, &m);
      const std::string want = std::string(b.query ? "queries" : "documents") + ": set " + std::to_string(set) +
                               " token " + std::to_string(token) + " ";
      const std::string msg = st == MAXSIM_OK ? "" : maxsim_last_error();
      EXPECT_EQ(st, MAXSIM_ERR_NON_FINITE) << what << ": " << want;
      EXPECT_NE(msg.find(want), std::string::npos) << what << ": message '" << msg << "' does not name " << want;
      for (float v : m.scores) ASSERT_TRUE(std::isnan(v)) << what << ": a score survived a failed call: " << v;
      if (c.argmax) {
        for (int32_t v : m.argmax) ASSERT_EQ(v, -1) << what << ": an argmax survived a failed call";
      }
    }
    // Finite rows above the 1e19 norm limit whose one similarity overflows to +inf: query token 100 (no warp of
    // the wgmma kernel's sample checks it) against a document's last token (in no pair's first tile). The kernels
    // that check a sample also check their row maxima, which the overflow reaches (f16 holds no 1e20: there the
    // elements are infinite).
    {
      TokenSets oq = q, od = d;
      const uint64_t qt = std::min<uint64_t>(100, oq.length(2) - 1), dt = od.length(1) - 1;
      oq.values[(oq.offsets[2] + qt) * oq.dim + 64] = 1e20f;
      od.values[(od.offsets[1] + dt) * od.dim + 64] = 1e20f;
      oq.Encode(c.dtype);
      od.Encode(c.dtype);
      maxsim_status st = MAXSIM_OK;
      Matrix m;
      run(oq, od, &st, &m);
      const std::string want = "queries: set 2 token " + std::to_string(qt) + " ";
      const std::string msg = st == MAXSIM_OK ? "" : maxsim_last_error();
      EXPECT_EQ(st, MAXSIM_ERR_NON_FINITE) << what << ": overflow";
      EXPECT_NE(msg.find(want), std::string::npos) << what << ": message '" << msg << "' does not name " << want;
      for (float v : m.scores) ASSERT_TRUE(std::isnan(v)) << what << ": a score survived an overflow: " << v;
    }
    // Non-finite values in masked rows (one query token, one document token) are not errors.
    TokenSets mq = q, md = d;
    mq.mask.assign(mq.rows(), 1);
    md.mask.assign(md.rows(), 1);
    mq.mask[mq.offsets[1] + 2] = 0;
    md.mask[md.offsets[3] + 1] = 0;
    TokenSets nq = mq, nd = md;
    nq.values[(nq.offsets[1] + 2) * nq.dim] = std::nanf("");
    nd.values[(nd.offsets[3] + 1) * nd.dim + 5] = INFINITY;
    nq.Encode(c.dtype);
    nd.Encode(c.dtype);
    maxsim_status st = MAXSIM_OK;
    Matrix m;
    run(nq, nd, &st, &m);
    ASSERT_EQ(st, MAXSIM_OK) << what << " masked: " << maxsim_last_error();
    for (uint64_t i = 0; i < q.n_sets(); ++i) {
      for (uint64_t j = 0; j < d.n_sets(); ++j) {
        const int32_t* am = c.argmax ? m.argmax.data() + d.n_sets() * mq.offsets[i] + j * mq.length(i) : nullptr;
        const std::string err = CheckPair(mq, i, md, j, MAXSIM_METRIC_DOT, m.scores[i * d.n_sets() + j], am);
        ASSERT_TRUE(err.empty()) << what << " masked: query " << i << " doc " << j << ": " << err;
      }
    }
    // And clean inputs right after the failures.
    run(q, d, &st, &m);
    ASSERT_EQ(st, MAXSIM_OK) << what << ": " << maxsim_last_error();
    for (uint64_t i = 0; i < q.n_sets(); ++i) {
      for (uint64_t j = 0; j < d.n_sets(); ++j) {
        const int32_t* am = c.argmax ? m.argmax.data() + d.n_sets() * q.offsets[i] + j * q.length(i) : nullptr;
        const std::string err = CheckPair(q, i, d, j, MAXSIM_METRIC_DOT, m.scores[i * d.n_sets() + j], am);
        ASSERT_TRUE(err.empty()) << what << ": query " << i << " doc " << j << ": " << err;
      }
    }
  }
}

// ---- dense host queries on a resident corpus (plugin ABI 1.2 query_dense) --------------------------------------

// Token sets in host memory behind `lead` rows (offsets[0] > 0) with `pad` elements after each row (row_stride >
// dim), the lead rows and padding NaN: the plugin copies and checks only the rows the sets own.
struct HostSets {
  std::vector<uint8_t> data;
  std::vector<uint64_t> offsets;
  maxsim_dense_sets s{};
  HostSets(const TokenSets& t, uint64_t lead, uint32_t pad, bool uniform = false) {
    const uint32_t elem = t.dtype == MAXSIM_F32 ? 4 : 2;
    const uint64_t stride = t.dim + pad, rows = t.rows() + lead;
    data.resize(std::max<uint64_t>(1, rows * stride * elem));
    const float nan = std::nanf("");
    for (uint64_t e = 0; e < rows * stride; ++e) {
      if (elem == 4) std::memcpy(&data[e * 4], &nan, 4);
      else { const uint16_t h = t.dtype == MAXSIM_BF16 ? 0x7fc0 : 0x7e00; std::memcpy(&data[e * 2], &h, 2); }
    }
    for (uint64_t r = 0; r < t.rows(); ++r) {
      std::memcpy(&data[(r + lead) * stride * elem], &t.encoded[r * t.dim * elem], t.dim * elem);
    }
    offsets = t.offsets;
    for (uint64_t& o : offsets) o += lead;
    s.struct_size = sizeof(s);
    s.memory = MAXSIM_MEMORY_HOST;
    s.data = data.data() + (uniform ? lead * stride * elem : 0);
    s.dtype = t.dtype;
    s.dim = t.dim;
    s.row_stride = pad ? stride : 0;
    s.n_sets = t.n_sets();
    if (uniform) {
      s.set_length = t.n_sets() ? t.length(0) : 0;
    } else {
      s.offsets = offsets.data();
    }
  }
  maxsim_sets sets() const { return {nullptr, &s}; }
};

// Every operation on a resident corpus: matrix (scores + argmax), candidates, top-k.
struct AllOps {
  Matrix m;
  std::vector<float> cand_scores, top_scores;
  std::vector<int32_t> cand_argmax;
  std::vector<uint64_t> top_index;
};

AllOps RunOps(maxsim_context* ctx, const maxsim_sets& q, uint64_t nq, uint64_t q_positions,
              const std::vector<uint64_t>& q_lengths, const maxsim_packed* corpus, uint64_t nd,
              const std::vector<uint64_t>& off, const std::vector<uint64_t>& cand, maxsim_metric metric,
              maxsim_mode mode, uint64_t k) {
  AllOps r;
  maxsim_sets d{corpus, nullptr};
  maxsim_score_options o;
  maxsim_score_options_init(&o);
  o.metric = metric;
  o.mode = mode;
  r.m.scores.assign(nq * nd, std::nanf(""));
  r.m.argmax.assign(nd * q_positions, -7);
  EXPECT_EQ(maxsim_score_matrix(ctx, &q, &d, &o, r.m.scores.data(), r.m.argmax.data()), MAXSIM_OK) << maxsim_last_error();
  uint64_t am = 0;
  for (uint64_t i = 0; i < nq; ++i) am += (off[i + 1] - off[i]) * q_lengths[i];
  r.cand_scores.assign(cand.size(), std::nanf(""));
  r.cand_argmax.assign(am, -7);
  EXPECT_EQ(maxsim_score_candidates(ctx, &q, &d, off.data(), cand.data(), &o, r.cand_scores.data(), r.cand_argmax.data()),
            MAXSIM_OK) << maxsim_last_error();
  r.top_scores.assign(nq * k, std::nanf(""));
  r.top_index.assign(nq * k, 77);
  EXPECT_EQ(maxsim_topk(ctx, &q, &d, k, &o, r.top_scores.data(), r.top_index.data(), nullptr), MAXSIM_OK)
      << maxsim_last_error();
  return r;
}

void ExpectSameOps(const AllOps& a, const AllOps& b, const std::string& what) {
  ExpectIdentical(a.m, b.m, what + " matrix");
  ExpectSameBits(a.cand_scores, b.cand_scores, what + " candidates");
  EXPECT_EQ(a.cand_argmax, b.cand_argmax) << what << " candidates argmax";
  ExpectSameBits(a.top_scores, b.top_scores, what + " top-k");
  EXPECT_EQ(a.top_index, b.top_index) << what << " top-k index";
}

std::vector<uint64_t> Lengths(const TokenSets& t) {
  std::vector<uint64_t> l(t.n_sets());
  for (uint64_t i = 0; i < l.size(); ++i) l[i] = t.length(i);
  return l;
}

// Candidate lists with repeats and an empty list.
void RandomCandidates(std::mt19937_64& rng, uint64_t nq, uint64_t nd, std::vector<uint64_t>* off,
                      std::vector<uint64_t>* cand) {
  off->assign(1, 0);
  cand->clear();
  for (uint64_t i = 0; i < nq; ++i) {
    const uint64_t k = i == 1 ? 0 : 1 + rng() % 9;
    for (uint64_t c = 0; c < k; ++c) cand->push_back(rng() % nd);
    off->push_back(cand->size());
  }
}

// Dense host queries reach the plugin as they are (no packing per call): rows copied through the pinned stage,
// checked and (cosine) normed on the GPU as the packer does. Every operation gives the bits of the same queries
// packed, and certified mode on the default route (the exact kernel) the same bits again.
TEST_F(Gpu, DenseHostQueriesEqualPackedQueries) {
  Context gpu = CudaContext();  // MAXSIM_CUDA_CERTIFIED=screen (see kScreenCertified): certified queries packed
  // The default route: certified queries dense too.
  Context def = CudaContextWithEnv("MAXSIM_CUDA_CERTIFIED", "auto");
  const struct {
    maxsim_dtype dtype;
    uint32_t dim;
    Shape shape;
    uint64_t max_lq;
    uint32_t pad;
    bool uniform;
  } cases[] = {{MAXSIM_BF16, 128, Shape::kUnitGaussian, 32, 0, true},  {MAXSIM_BF16, 128, Shape::kClustered, 40, 3, false},
               {MAXSIM_F16, 96, Shape::kGaussian, 20, 0, false},      {MAXSIM_F32, 72, Shape::kGaussian, 24, 1, false},
               {MAXSIM_BF16, 7, Shape::kLargeNorm, 16, 0, false},     {MAXSIM_F32, 128, Shape::kTinyNorm, 16, 0, true},
               {MAXSIM_BF16, 128, Shape::kUnitGaussian, 300, 0, false}, {MAXSIM_F16, 1024, Shape::kNearTies, 12, 8, false}};
  uint64_t salt = 2600;
  for (const auto& c : cases) {
    auto rng = Rng(++salt);
    const uint64_t min_lq = c.uniform ? c.max_lq : 0;
    const TokenSets q = Encoded(Generate(rng, c.shape, 5, min_lq, c.max_lq, c.dim), c.dtype);
    const TokenSets d = Encoded(Generate(rng, c.shape, 40, 0, 80, c.dim), c.dtype);
    Packed pq = Packed::Pack(gpu, q.Dense());
    Packed pd = Packed::Pack(gpu, d.Dense());
    const HostSets hq(q, c.uniform ? 2 : 3, c.pad, c.uniform);
    std::vector<uint64_t> off, cand;
    RandomCandidates(rng, q.n_sets(), d.n_sets(), &off, &cand);
    const maxsim_sets packed_q{pq.get(), nullptr};
    for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
      const std::string what = "dtype " + std::to_string(c.dtype) + " dim " + std::to_string(c.dim) + " " +
                               ShapeName(c.shape) + " Lq<=" + std::to_string(c.max_lq) + (c.uniform ? " uniform" : "") +
                               (metric == MAXSIM_METRIC_DOT ? " dot" : " cosine");
      const AllOps want = RunOps(gpu.get(), packed_q, q.n_sets(), q.rows(), Lengths(q), pd.get(), d.n_sets(), off,
                                 cand, metric, MAXSIM_MODE_EXACT, 7);
      ExpectReference(q, d, metric, want.m, what + " packed");
      const AllOps dense = RunOps(gpu.get(), hq.sets(), q.n_sets(), q.rows(), Lengths(q), pd.get(), d.n_sets(), off,
                                  cand, metric, MAXSIM_MODE_EXACT, 7);
      ExpectSameOps(want, dense, what + " dense exact");
      const AllOps cert = RunOps(def.get(), hq.sets(), q.n_sets(), q.rows(), Lengths(q), pd.get(), d.n_sets(), off,
                                 cand, metric, MAXSIM_MODE_CERTIFIED, 7);
      ExpectSameOps(want, cert, what + " dense certified (default route)");
      if (HasFatalFailure()) return;
    }
  }
}

// A non-finite value or a norm above 1e19 in a GPU input: MAXSIM_ERR_NON_FINITE naming the token, and nothing
// the caller could take for an answer. Dense host queries on a resident corpus (every operation, one and two
// device backends): the CPU's message, every output untouched. Dense device tensors (pairs and candidates; the
// matrix is FoldedInputCheckOnDeviceTensors'): every score NaN.
TEST_F(Gpu, NonFiniteInputsFailEveryOperation) {
  Context cpu(Options("cpu"));
  Context one = CudaContext();
  maxsim_options o2 = Options("cuda");
  o2.devices = "0,0";
  Context two(o2);
  auto rng = Rng(2700);
  const TokenSets q = Encoded(Generate(rng, Shape::kUnitGaussian, 4, 1, 40, 128), MAXSIM_BF16);
  const TokenSets d = Encoded(Generate(rng, Shape::kClustered, 30, 1, 60, 128), MAXSIM_BF16);
  Packed pd = Packed::Pack(cpu, d.Dense());
  std::vector<uint64_t> off, cand;
  RandomCandidates(rng, q.n_sets(), d.n_sets(), &off, &cand);
  const uint64_t nq = q.n_sets(), nd = d.n_sets();
  const struct {
    uint64_t set;
    uint32_t k;
    float value;
  } bads[] = {{2, 5, std::nanf("")}, {3, 127, -INFINITY}, {1, 0, 3e19f}};
  for (const auto& b : bads) {
    for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
      TokenSets bq = q;
      const uint64_t row = bq.offsets[b.set + 1] - 1;
      if (std::isfinite(b.value)) {
        for (uint32_t k = 0; k < bq.dim; ++k) bq.values[row * bq.dim + k] = b.value;  // norm above 1e19
      } else {
        bq.values[row * bq.dim + b.k] = b.value;
      }
      bq.Encode(MAXSIM_BF16);
      const std::string what = "set " + std::to_string(b.set) + " value " + std::to_string(b.value) +
                               (metric == MAXSIM_METRIC_DOT ? " dot" : " cosine");
      const HostSets hq(bq, 1, 0);
      const maxsim_sets qs = hq.sets(), ds{pd.get(), nullptr};
      maxsim_score_options o;
      maxsim_score_options_init(&o);
      o.metric = metric;
      std::vector<float> scores(nq * nd, -5.0f);
      ASSERT_EQ(maxsim_score_matrix(cpu.get(), &qs, &ds, &o, scores.data(), nullptr), MAXSIM_ERR_NON_FINITE) << what;
      const std::string want = maxsim_last_error();
      EXPECT_NE(want.find("queries: set " + std::to_string(b.set) + " token " + std::to_string(bq.length(b.set) - 1)),
                std::string::npos) << want;
      for (Context* ctx : {&one, &two}) {
        const std::string where = what + (ctx == &one ? " one device" : " two devices");
        for (maxsim_mode mode : {MAXSIM_MODE_EXACT, MAXSIM_MODE_CERTIFIED, MAXSIM_MODE_APPROXIMATE}) {
          o.mode = mode;
          std::vector<float> sc(nq * nd, -5.0f), cs(cand.size(), -5.0f), ts(nq * 3, -5.0f);
          std::vector<int32_t> am(nd * bq.rows(), -7);
          std::vector<uint64_t> ti(nq * 3, 77);
          EXPECT_EQ(maxsim_score_matrix(ctx->get(), &qs, &ds, &o, sc.data(), am.data()), MAXSIM_ERR_NON_FINITE) << where;
          EXPECT_EQ(std::string(maxsim_last_error()), want) << where << " mode " << mode;
          EXPECT_EQ(maxsim_score_candidates(ctx->get(), &qs, &ds, off.data(), cand.data(), &o, cs.data(), nullptr),
                    MAXSIM_ERR_NON_FINITE) << where;
          EXPECT_EQ(std::string(maxsim_last_error()), want) << where << " mode " << mode;
          EXPECT_EQ(maxsim_topk(ctx->get(), &qs, &ds, 3, &o, ts.data(), ti.data(), nullptr), MAXSIM_ERR_NON_FINITE) << where;
          EXPECT_EQ(std::string(maxsim_last_error()), want) << where << " mode " << mode;
          for (float v : sc) ASSERT_EQ(v, -5.0f) << where << ": a matrix score was written";
          for (int32_t v : am) ASSERT_EQ(v, -7) << where << ": an argmax was written";
          for (float v : cs) ASSERT_EQ(v, -5.0f) << where << ": a candidate score was written";
          for (float v : ts) ASSERT_EQ(v, -5.0f) << where << ": a top-k score was written";
          for (uint64_t v : ti) ASSERT_EQ(v, 77u) << where << ": a top-k index was written";
        }
      }
      // The same queries as device tensors: pairs and candidates (outputs filled with finite values first: a
      // partial result would show).
      if (!std::isfinite(b.value)) {
        const TokenSets d4 = Encoded(Generate(rng, Shape::kClustered, nq, 1, 50, 128), MAXSIM_BF16);
        const DeviceSets dq(bq), dd(d4), dd_all(d);
        o.mode = MAXSIM_MODE_EXACT;  // device tensors score in exact mode
        for (bool pairs : {true, false}) {
          const uint64_t n = pairs ? nq : cand.size();
          Dev<float> sc(n);
          sc.Fill(0);
          maxsim_sets dqs{nullptr, &dq.s}, dds{nullptr, pairs ? &dd.s : &dd_all.s};
          const maxsim_status st = pairs ? maxsim_score_pairs(one.get(), &dqs, &dds, &o, sc.p, nullptr)
                                         : maxsim_score_candidates(one.get(), &dqs, &dds, off.data(), cand.data(), &o,
                                                                   sc.p, nullptr);
          const std::string where = what + (pairs ? " device pairs" : " device candidates");
          EXPECT_EQ(st, MAXSIM_ERR_NON_FINITE) << where;
          EXPECT_NE(std::string(maxsim_last_error()).find("queries: set " + std::to_string(b.set)), std::string::npos)
              << where << ": " << maxsim_last_error();
          for (float v : sc.Down()) ASSERT_TRUE(std::isnan(v)) << where << ": a score survived a failed call: " << v;
        }
      }
    }
  }
  // Clean queries right after the failures, on both contexts: the same bits.
  const HostSets hq(q, 0, 0);
  const AllOps a = RunOps(one.get(), hq.sets(), nq, q.rows(), Lengths(q), pd.get(), nd, off, cand, MAXSIM_METRIC_DOT,
                          MAXSIM_MODE_EXACT, 5);
  const AllOps b2 = RunOps(two.get(), hq.sets(), nq, q.rows(), Lengths(q), pd.get(), nd, off, cand, MAXSIM_METRIC_DOT,
                           MAXSIM_MODE_EXACT, 5);
  ExpectReference(q, d, MAXSIM_METRIC_DOT, a.m, "after failures");
  ExpectSameOps(a, b2, "after failures, two devices");
}

// Several device backends on one GPU (maxsim_options.devices = "0,0" / "0,0,0": the corpus sharded over backends
// with their own streams, results merged on the host) give one backend's bits: every operation, packed and dense
// queries, exact, certified and approximate, argmax, ties across shards (repeated documents) and k beyond the
// corpus; score matrices written into the caller's columns by each backend (ABI 1.3) and staged by the host
// (MAXSIM_CUDA_MATRIX_COLUMNS=0) alike.
TEST_F(Gpu, SeveralDeviceBackendsEqualOne) {
  Context one = CudaContext();
  maxsim_options o2 = Options("cuda"), o3 = Options("cuda");
  o2.devices = "0,0";
  o3.devices = "0,0,0";
  Context two(o2), three(o3);
  Context staged = [&] {
    ScopedEnv columns("MAXSIM_CUDA_MATRIX_COLUMNS", "0");  // read when the context loads the plugin
    return Context(o2);
  }();
  EXPECT_NE(two.Report().find("cuda on 2 devices"), std::string::npos) << two.Report();
  EXPECT_NE(three.Report().find("cuda on 3 devices"), std::string::npos) << three.Report();
  EXPECT_NE(two.Report().find("score matrix into columns"), std::string::npos) << two.Report();
  EXPECT_EQ(staged.Report().find("score matrix into columns"), std::string::npos) << staged.Report();
  auto rng = Rng(2800);
  const TokenSets q = Encoded(Generate(rng, Shape::kUnitGaussian, 6, 0, 40, 128), MAXSIM_BF16);
  TokenSets base = Encoded(Generate(rng, Shape::kClustered, 25, 0, 70, 128), MAXSIM_BF16);
  TokenSets d = base;  // the documents twice over: document j and j + 25 tie exactly, in different shards
  for (uint64_t j = 0; j < base.n_sets(); ++j) {
    d.values.insert(d.values.end(), base.row(base.offsets[j]), base.row(base.offsets[j + 1]));
    d.offsets.push_back(d.offsets.back() + base.length(j));
  }
  d.Encode(MAXSIM_BF16);
  Packed pq = Packed::Pack(one, q.Dense());
  Packed pd = Packed::Pack(one, d.Dense());
  std::vector<uint64_t> off, cand;
  RandomCandidates(rng, q.n_sets(), d.n_sets(), &off, &cand);
  const HostSets hq(q, 0, 0);
  const maxsim_sets packed_q{pq.get(), nullptr}, dense_q = hq.sets();
  for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
    for (maxsim_mode mode : {MAXSIM_MODE_EXACT, MAXSIM_MODE_CERTIFIED, MAXSIM_MODE_APPROXIMATE}) {
      for (uint64_t k : {5ull, 60ull}) {
        const std::string what = std::string(metric == MAXSIM_METRIC_DOT ? "dot" : "cosine") + " mode " +
                                 std::to_string(mode) + " k " + std::to_string(k);
        for (const maxsim_sets* qs : {&packed_q, &dense_q}) {
          const AllOps a = RunOps(one.get(), *qs, q.n_sets(), q.rows(), Lengths(q), pd.get(), d.n_sets(), off, cand,
                                  metric, mode, k);
          if (mode != MAXSIM_MODE_APPROXIMATE) ExpectReference(q, d, metric, a.m, what);
          ExpectSameOps(a, RunOps(two.get(), *qs, q.n_sets(), q.rows(), Lengths(q), pd.get(), d.n_sets(), off, cand,
                                  metric, mode, k), what + " two backends");
          ExpectSameOps(a, RunOps(three.get(), *qs, q.n_sets(), q.rows(), Lengths(q), pd.get(), d.n_sets(), off, cand,
                                  metric, mode, k), what + " three backends");
          ExpectSameOps(a, RunOps(staged.get(), *qs, q.n_sets(), q.rows(), Lengths(q), pd.get(), d.n_sets(), off,
                                  cand, metric, mode, k), what + " two backends, staged matrix");
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// A context on several devices leaves the calling thread's current device as it was (the plugin selects each
// backend's device for its own work), and device tensors on a device other than the context's first are refused
// with a status naming both devices instead of faulting. With one GPU only the first half runs (devices "0,0").
TEST_F(Gpu, CallerDeviceIsKeptAndForeignDeviceTensorsAreRefused) {
  int n_gpus = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n_gpus), cudaSuccess);
  const int other = n_gpus > 1 ? 1 : 0;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  maxsim_options o = Options("cuda");
  const std::string list = "0," + std::to_string(other);
  o.devices = list.c_str();
  Context two(o);
  int now = -1;
  ASSERT_EQ(cudaGetDevice(&now), cudaSuccess);
  EXPECT_EQ(now, 0) << "creating a context on devices " << list << " changed the caller's device";
  auto rng = Rng(2900);
  const TokenSets q = Encoded(Generate(rng, Shape::kUnitGaussian, 2, 1, 20, 64), MAXSIM_BF16);
  const TokenSets d = Encoded(Generate(rng, Shape::kClustered, 9, 0, 30, 64), MAXSIM_BF16);
  Packed pd = Packed::Pack(two, d.Dense());
  const HostSets hq(q, 0, 0);
  std::vector<uint64_t> off, cand;
  RandomCandidates(rng, q.n_sets(), d.n_sets(), &off, &cand);
  const AllOps a = RunOps(two.get(), hq.sets(), q.n_sets(), q.rows(), Lengths(q), pd.get(), d.n_sets(), off, cand,
                          MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT, 4);
  ExpectReference(q, d, MAXSIM_METRIC_DOT, a.m, "devices " + list);
  ASSERT_EQ(cudaGetDevice(&now), cudaSuccess);
  EXPECT_EQ(now, 0) << "a call on devices " << list << " changed the caller's device";
  if (n_gpus < 2) {
    std::printf("gpu tests: one GPU: tensors on a second device not tried\n");
    return;
  }
  // Device tensors on device 1, a context whose first device is 0: refused, nothing written, the device usable.
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  {
    const DeviceSets dq(q), dd(d);
    Dev<float> sc(q.n_sets() * d.n_sets());
    sc.Fill(0);
    maxsim_options o0 = Options("cuda");
    o0.devices = "0";
    Context first(o0);
    maxsim_sets qs{nullptr, &dq.s}, ds{nullptr, &dd.s};
    EXPECT_EQ(maxsim_score_matrix(first.get(), &qs, &ds, nullptr, sc.p, nullptr), MAXSIM_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(maxsim_last_error()).find("are on CUDA device 1 but this context computes device tensors "
                                                    "on device 0"), std::string::npos) << maxsim_last_error();
    for (float v : sc.Down()) ASSERT_EQ(v, 0.0f) << "a score was written";
  }
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const AllOps b = RunOps(two.get(), hq.sets(), q.n_sets(), q.rows(), Lengths(q), pd.get(), d.n_sets(), off, cand,
                          MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT, 4);
  ExpectSameOps(a, b, "after the refused call");
}

// A C caller's device pointers are checked where they enter the plugin (one GPU; the two-device case is
// CallerDeviceIsKeptAndForeignDeviceTensorsAreRefused): pageable host memory or a freed allocation passed as CUDA
// memory, and a scores buffer that ends before the matrix does, are refused with a message naming the argument,
// nothing is written, and the device stays usable. Pinned host memory, which the device reaches through its
// mapping, is CUDA memory and gives the same bits.
TEST_F(Gpu, CallerPointersAreChecked) {
  Context gpu(Options("cuda"));
  auto rng = Rng(2970);
  const TokenSets q = Encoded(Generate(rng, Shape::kUnitGaussian, 2, 1, 20, 64), MAXSIM_BF16);
  const TokenSets d = Encoded(Generate(rng, Shape::kClustered, 9, 0, 30, 64), MAXSIM_BF16);
  const DeviceSets dq(q), dd(d);
  const uint64_t n = q.n_sets() * d.n_sets();
  Dev<float> sc(n);
  Dev<int32_t> am(d.n_sets() * q.rows());
  maxsim_sets qs{nullptr, &dq.s}, ds{nullptr, &dd.s};
  ASSERT_EQ(maxsim_score_matrix(gpu.get(), &qs, &ds, nullptr, sc.p, am.p), MAXSIM_OK) << maxsim_last_error();
  const Matrix good{sc.Down(), am.Down()};
  ExpectReference(q, d, MAXSIM_METRIC_DOT, good, "device tensors");
  auto refused = [&](const maxsim_dense_sets& qset, const maxsim_dense_sets& dset, float* scores, const std::string& part,
                     const std::string& what) {
    sc.Fill(0);
    maxsim_sets a{nullptr, &qset}, b{nullptr, &dset};
    EXPECT_EQ(maxsim_score_matrix(gpu.get(), &a, &b, nullptr, scores, nullptr), MAXSIM_ERR_INVALID_ARGUMENT) << what;
    EXPECT_NE(std::string(maxsim_last_error()).find(part), std::string::npos) << what << ": " << maxsim_last_error();
    for (float v : sc.Down()) ASSERT_EQ(v, 0.0f) << what << ": a score was written";
  };
  // Queries in pageable host memory.
  std::vector<uint8_t> pageable(q.rows() * q.dim * 2);
  std::memcpy(pageable.data(), q.encoded.data(), pageable.size());
  maxsim_dense_sets host_q = dq.s;
  host_q.data = pageable.data();
  refused(host_q, dd.s, sc.p, "queries at ", "pageable queries");
  EXPECT_NE(std::string(maxsim_last_error()).find("not CUDA memory"), std::string::npos) << maxsim_last_error();
  // Documents in a freed allocation (checked first to be unknown to CUDA: a kernel reading it would fault).
  void* stale = nullptr;
  {
    Dev<uint8_t> gone(dd.data.n);
    gone.Fill(0);
    stale = gone.p;
  }
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, stale), cudaSuccess);
  ASSERT_EQ(attr.type, cudaMemoryTypeUnregistered) << "a freed allocation is still described by the runtime";
  maxsim_dense_sets freed_d = dd.s;
  freed_d.data = stale;
  refused(dq.s, freed_d, sc.p, "documents at ", "freed documents");
  // Scores that would run 4 bytes past the end of their allocation (2 MiB, a multiple of any allocation granule).
  Dev<float> big((2u << 20) / sizeof(float));
  big.Fill(0);
  refused(dq.s, dd.s, big.p + big.n - (n - 1), "the scores: ", "short scores");
  for (float v : big.Down()) ASSERT_EQ(v, 0.0f) << "short scores: a score was written";
  // Pinned host memory is CUDA memory: queries read and scores written through the mapping, the same bits.
  uint8_t* pinned_q = nullptr;
  float* pinned_s = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned_q), pageable.size()), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned_s), n * sizeof(float)), cudaSuccess);
  std::memcpy(pinned_q, pageable.data(), pageable.size());
  maxsim_dense_sets pq = dq.s;
  pq.data = pinned_q;
  maxsim_sets pqs{nullptr, &pq};
  EXPECT_EQ(maxsim_score_matrix(gpu.get(), &pqs, &ds, nullptr, pinned_s, nullptr), MAXSIM_OK) << maxsim_last_error();
  EXPECT_EQ(std::memcmp(pinned_s, good.scores.data(), n * sizeof(float)), 0) << "pinned tensors: other bits";
  cudaFreeHost(pinned_q);
  cudaFreeHost(pinned_s);
  // The device is still usable.
  ASSERT_EQ(maxsim_score_matrix(gpu.get(), &qs, &ds, nullptr, sc.p, am.p), MAXSIM_OK) << maxsim_last_error();
  const Matrix again{sc.Down(), am.Down()};
  EXPECT_EQ(again.scores, good.scores);
  EXPECT_EQ(again.argmax, good.argmax);
}

// A call that fails in the plugin returns only once the work on its stream is done (the plugin settles every failed
// operation), so that no later call's writes to the plugin's pinned stages, scratch or persistent flags can meet the
// copies and kernels of a call that failed after enqueueing them. The caller's stream holds milliseconds of its own
// work when each call starts: a failure that returned at once would find it still busy. Forward and backward, each
// refused by the plugin's pointer check; then good calls on the same stream give the bits of a good call before.
TEST_F(Gpu, FailedCallsReturnWithTheirStreamIdle) {
  Context gpu(Options("cuda"));
  auto rng = Rng(2975);
  const TokenSets q = Encoded(Generate(rng, Shape::kUnitGaussian, 2, 1, 20, 64), MAXSIM_BF16);
  const TokenSets d = Encoded(Generate(rng, Shape::kClustered, 9, 0, 30, 64), MAXSIM_BF16);
  const DeviceSets dq(q), dd(d);
  const uint64_t n = q.n_sets() * d.n_sets(), positions = d.n_sets() * q.rows();
  Dev<float> sc(n), grad(n), gq(q.rows() * q.dim), gd(d.rows() * d.dim);
  Dev<int32_t> am(positions);
  std::vector<float> ones(n, 1.0f);
  grad.Up(ones.data());
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  maxsim_score_options o;
  maxsim_score_options_init(&o);
  o.cuda_stream = stream;
  maxsim_sets qs{nullptr, &dq.s}, ds{nullptr, &dd.s};
  ASSERT_EQ(maxsim_score_matrix(gpu.get(), &qs, &ds, &o, sc.p, am.p), MAXSIM_OK) << maxsim_last_error();
  const Matrix good{sc.Down(), am.Down()};
  ExpectReference(q, d, MAXSIM_METRIC_DOT, good, "device tensors on a caller stream");
  maxsim_backward_args ba = BackwardCall(MAXSIM_LAYOUT_MATRIX, am.p, grad.p, gq.p, gd.p, 1);
  ba.cuda_stream = stream;
  ASSERT_EQ(maxsim_backward(gpu.get(), &dq.s, &dd.s, &ba), MAXSIM_OK) << maxsim_last_error();
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const std::vector<float> good_gq = gq.Down(), good_gd = gd.Down();
  // Queries in pageable host memory passed as CUDA memory: refused by the plugin (not by the library in front).
  std::vector<uint8_t> pageable(q.rows() * q.dim * 2);
  std::memcpy(pageable.data(), q.encoded.data(), pageable.size());
  maxsim_dense_sets host_q = dq.s;
  host_q.data = pageable.data();
  maxsim_sets bad_qs{nullptr, &host_q};
  Dev<uint8_t> busy(256ull << 20);
  ASSERT_NE(busy.p, nullptr);
  auto keep_busy = [&] {
    for (int i = 0; i < 16; ++i) ASSERT_EQ(cudaMemsetAsync(busy.p, i, busy.n, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamQuery(stream), cudaErrorNotReady) << "the stream's own work ended before the call";
  };
  for (int round = 0; round < 2; ++round) {
    keep_busy();
    EXPECT_EQ(maxsim_score_matrix(gpu.get(), &bad_qs, &ds, &o, sc.p, am.p), MAXSIM_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(maxsim_last_error()).find("not CUDA memory"), std::string::npos) << maxsim_last_error();
    EXPECT_EQ(cudaStreamQuery(stream), cudaSuccess) << "a failed forward returned with work on its stream";
    keep_busy();
    EXPECT_EQ(maxsim_backward(gpu.get(), &host_q, &dd.s, &ba), MAXSIM_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(maxsim_last_error()).find("not CUDA memory"), std::string::npos) << maxsim_last_error();
    EXPECT_EQ(cudaStreamQuery(stream), cudaSuccess) << "a failed backward returned with work on its stream";
    ASSERT_EQ(maxsim_score_matrix(gpu.get(), &qs, &ds, &o, sc.p, am.p), MAXSIM_OK) << maxsim_last_error();
    const Matrix again{sc.Down(), am.Down()};
    EXPECT_EQ(again.scores, good.scores) << "round " << round;
    EXPECT_EQ(again.argmax, good.argmax) << "round " << round;
    ASSERT_EQ(maxsim_backward(gpu.get(), &dq.s, &dd.s, &ba), MAXSIM_OK) << maxsim_last_error();
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    ExpectSameBits(gq.Down(), good_gq, "grad_queries, round " + std::to_string(round));
    ExpectSameBits(gd.Down(), good_gd, "grad_documents, round " + std::to_string(round));
  }
  cudaStreamDestroy(stream);
}

// Documents a caller passes as MAXSIM_MEMORY_CUDA in pinned host or managed memory, on shapes that run the wgmma
// kernels on sm_90a (96 < dim <= 128, no argmax): the batch kernel (several queries of at most 128 tokens) and the
// pair kernel in both row-group shapes (one query of 100 tokens: a 128-row group; of 300: two 256-row groups). The
// bulk tensor copies (batch launches, 256-row pair launches) are kept to plain device memory and these take the
// cp.async copies; every kind gives the bits of device memory, which match the reference. Ragged documents: shorter than a tile, a 64-token and a partial
// last tile, several tiles.
TEST_F(Gpu, WgmmaShapesOverPinnedAndManagedDocuments) {
  Context gpu(Options("cuda"));
  auto rng = Rng(2990);
  const TokenSets d = Encoded(Generate(rng, Shape::kClustered, 24, 1, 300, 128), MAXSIM_BF16);
  const DeviceSets dd(d);
  const uint64_t bytes = dd.data.n;
  const std::vector<uint8_t> rows = dd.data.Down();
  struct QueryShape {
    uint64_t n, min_len, max_len;
    const char* what;
  };
  for (const QueryShape& qshape : {QueryShape{3, 8, 32, "batch"}, QueryShape{1, 100, 100, "pairs, 128 rows"},
                                   QueryShape{1, 300, 300, "pairs, 2 x 256 rows"}}) {
    const TokenSets q =
        Encoded(Generate(rng, Shape::kUnitGaussian, qshape.n, qshape.min_len, qshape.max_len, 128), MAXSIM_BF16);
    const DeviceSets dq(q);
    const uint64_t n = q.n_sets() * d.n_sets();
    Dev<float> sc(n);
    maxsim_sets qs{nullptr, &dq.s}, ds{nullptr, &dd.s};
    ASSERT_EQ(maxsim_score_matrix(gpu.get(), &qs, &ds, nullptr, sc.p, nullptr), MAXSIM_OK) << maxsim_last_error();
    const std::vector<float> good = sc.Down();
    for (uint64_t i = 0; i < q.n_sets(); ++i) {
      for (uint64_t j = 0; j < d.n_sets(); ++j) {
        const std::string err = CheckPair(q, i, d, j, MAXSIM_METRIC_DOT, good[i * d.n_sets() + j], nullptr);
        ASSERT_TRUE(err.empty()) << qshape.what << ", device documents, query " << i << " doc " << j << ": " << err;
      }
    }
    for (const bool managed : {false, true}) {
      void* p = nullptr;
      ASSERT_EQ(managed ? cudaMallocManaged(&p, bytes) : cudaMallocHost(&p, bytes), cudaSuccess);
      std::memcpy(p, rows.data(), bytes);
      maxsim_dense_sets other = dd.s;
      other.data = p;
      maxsim_sets os{nullptr, &other};
      sc.Fill(0);
      EXPECT_EQ(maxsim_score_matrix(gpu.get(), &qs, &os, nullptr, sc.p, nullptr), MAXSIM_OK) << maxsim_last_error();
      ExpectSameBits(sc.Down(), good, std::string(qshape.what) + (managed ? ", managed" : ", pinned") + " documents");
      managed ? cudaFree(p) : cudaFreeHost(p);
    }
  }
}

// A thread that never used CUDA calls the API (every operation, the corpus uploaded by its first call) and is left
// with no current CUDA context, as it started: the plugin restores the driver's current context, not a device
// number (restoring "device 0" would create and keep device 0's primary context current in that thread).
TEST_F(Gpu, FreshThreadKeepsNoCudaContext) {
  Context gpu(Options("cuda"));
  auto rng = Rng(2950);
  const TokenSets q = Encoded(Generate(rng, Shape::kUnitGaussian, 3, 1, 20, 64), MAXSIM_BF16);
  const TokenSets d = Encoded(Generate(rng, Shape::kClustered, 11, 0, 30, 64), MAXSIM_BF16);
  Packed pd = Packed::Pack(gpu, d.Dense());
  const HostSets hq(q, 0, 0);
  std::vector<uint64_t> off, cand;
  RandomCandidates(rng, q.n_sets(), d.n_sets(), &off, &cand);
  CUcontext before = reinterpret_cast<CUcontext>(1), after = reinterpret_cast<CUcontext>(1);
  CUresult r0 = CUDA_ERROR_UNKNOWN, r1 = CUDA_ERROR_UNKNOWN;
  AllOps a;
  std::thread t([&] {
    r0 = cuCtxGetCurrent(&before);
    a = RunOps(gpu.get(), hq.sets(), q.n_sets(), q.rows(), Lengths(q), pd.get(), d.n_sets(), off, cand,
               MAXSIM_METRIC_COSINE, MAXSIM_MODE_EXACT, 4);
    r1 = cuCtxGetCurrent(&after);
  });
  t.join();
  ASSERT_EQ(r0, CUDA_SUCCESS);
  ASSERT_EQ(r1, CUDA_SUCCESS);
  EXPECT_EQ(before, nullptr) << "a new thread started with a current CUDA context";
  EXPECT_EQ(after, nullptr) << "the API left a CUDA context current in a thread that had none";
  ExpectReference(q, d, MAXSIM_METRIC_COSINE, a.m, "from a fresh thread");
}

// ---- real embeddings ----------------------------------------------------------------------------------------

TEST_F(Gpu, RealEmbeddings) {
  TokenSets q, d;
  std::string error;
  if (!LoadNanoFiqa(&q, &d, nullptr, nullptr, &error)) GTEST_SKIP() << error;
  Context gpu(Options("cuda"));
  Context cpu(Options("cpu"));
  for (maxsim_dtype dtype : {MAXSIM_BF16, MAXSIM_F16, MAXSIM_F32}) {
    const TokenSets qe = Encoded(q, dtype), de = Encoded(d, dtype);
    Packed pq = Packed::Pack(gpu, qe.Dense());
    Packed pd = Packed::Pack(gpu, de.Dense());
    const std::string what = "nanofiqa dtype " + std::to_string(dtype);
    const Matrix exact = ScoreMatrix(gpu, pq, qe.n_sets(), qe.rows(), pd, de.n_sets(), MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT);
    ExpectReference(qe, de, MAXSIM_METRIC_DOT, exact, what);
    maxsim_stats st{};
    const Matrix cert =
        ScoreMatrix(gpu, pq, qe.n_sets(), qe.rows(), pd, de.n_sets(), MAXSIM_METRIC_DOT, MAXSIM_MODE_CERTIFIED, &st);
    ExpectIdentical(cert, exact, what + " certified vs exact");
    std::printf("%s: certified refined %.2f document tokens per query token and document (%llu evaluations)\n",
                what.c_str(), static_cast<double>(st.refined) / std::max<uint64_t>(1, st.query_tokens),
                static_cast<unsigned long long>(st.query_tokens));
    if (dtype == MAXSIM_F32) {
      const Matrix c = ScoreMatrix(cpu, pq, qe.n_sets(), qe.rows(), pd, de.n_sets(), MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT);
      ExpectIdentical(exact, c, what + " GPU vs CPU");
    }
    // The exact top-10 ranking equals the float64 ranking wherever the float64 scores are separated by more
    // than their tolerance.
    ScoreOptions o;
    TopKResult top = gpu.TopK(pq, qe.n_sets(), pd, 10, o);
    for (uint64_t i = 0; i < qe.n_sets(); ++i) {
      std::vector<std::pair<double, uint64_t>> ref;
      double tol = 0;
      for (uint64_t j = 0; j < de.n_sets(); ++j) {
        const RefPair r = Reference(qe, i, de, j, MAXSIM_METRIC_DOT);
        ref.push_back({r.score, j});
        tol = std::max(tol, r.tolerance);
      }
      std::stable_sort(ref.begin(), ref.end(), [](auto& x, auto& y) { return x.first > y.first; });
      for (uint64_t r = 0; r < 10 && r < ref.size(); ++r) {
        if (top.index[i * 10 + r] == ref[r].second) continue;
        const double other = Reference(qe, i, de, top.index[i * 10 + r], MAXSIM_METRIC_DOT).score;
        ASSERT_LE(std::fabs(other - ref[r].first), 2 * tol) << what << " query " << i << " rank " << r;
      }
    }
  }
}

// ---- a small case of every operation, for compute-sanitizer ----------------------------------------------------

// ---- stream-ordered calls (MAXSIM_CALL_STREAM_ORDERED) ----------------------------------------------------------

// A non-blocking CUDA stream for the test's calls.
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() {
    if (s) {
      cudaStreamSynchronize(s);
      cudaStreamDestroy(s);
    }
  }
};

// One forward through the public API in `layout` on `stream` with `flags`, into the caller's device outputs.
maxsim_status EnqueueForward(Context& gpu, const DeviceSets& q, const DeviceSets& d, maxsim_layout layout,
                             const std::vector<uint64_t>& off, const std::vector<uint64_t>& cand, maxsim_metric metric,
                             cudaStream_t stream, uint32_t flags, float* scores, int32_t* argmax) {
  maxsim_score_options o;
  maxsim_score_options_init(&o);
  o.metric = metric;
  o.cuda_stream = stream;
  o.flags = flags;
  maxsim_sets qs{nullptr, &q.s}, ds{nullptr, &d.s};
  if (layout == MAXSIM_LAYOUT_MATRIX) return maxsim_score_matrix(gpu.get(), &qs, &ds, &o, scores, argmax);
  if (layout == MAXSIM_LAYOUT_PAIRS) return maxsim_score_pairs(gpu.get(), &qs, &ds, &o, scores, argmax);
  return maxsim_score_candidates(gpu.get(), &qs, &ds, off.data(), cand.data(), &o, scores, argmax);
}

// The outputs of one stream-ordered forward call (device memory, read back after maxsim_synchronize).
struct OrderedForward {
  Dev<float> sc;
  Dev<int32_t> am;
  OrderedForward(uint64_t n_scores, uint64_t argmax_size) : sc(n_scores), am(argmax_size) {
    sc.Fill(0);
    am.Fill(0);
    cudaDeviceSynchronize();  // the fills ran on the legacy stream, which the test's non-blocking streams do not wait for
  }
  Matrix Down() const { return Matrix{sc.Down(), am.Down()}; }
};

// A layout's candidate lists (4 per query, repeats allowed; pairs and matrix: none), score count and argmax size.
struct LayoutShape {
  std::vector<uint64_t> off, cand;
  uint64_t n_scores = 0, am_size = 0;
  LayoutShape(std::mt19937_64& rng, const TokenSets& q, const TokenSets& d, maxsim_layout layout) {
    off.push_back(0);
    for (uint64_t i = 0; i < q.n_sets(); ++i) {
      uint64_t n = layout == MAXSIM_LAYOUT_MATRIX ? d.n_sets() : 1;
      if (layout == MAXSIM_LAYOUT_CANDIDATES) {
        for (int k = 0; k < 4; ++k) cand.push_back(rng() % d.n_sets());
        off.push_back(cand.size());
        n = 4;
      }
      n_scores += n;
      am_size += n * q.length(i);
    }
  }
};

// Every operation that takes device tensors (matrix, pairs, candidates; dot and cosine; the backward atomic and
// deterministic) gives the synchronous call's bits when stream-ordered: calls alternate between two streams back
// to back with different shapes (the backend's scratch reused across streams), a synchronous call on a third
// stream in between, and one maxsim_synchronize at the end.
TEST_F(Gpu, StreamOrderedCallsGiveTheSynchronousBits) {
  Context gpu(Options("cuda"));
  Stream s1, s2, s3;
  const DenseCase cases[] = {{MAXSIM_BF16, 128, false, 0, 0}, {MAXSIM_F16, 64, true, 2, 0}, {MAXSIM_F32, 96, true, 0, 4},
                             {MAXSIM_BF16, 128, true, 1, 0}};
  uint64_t salt = 2400;
  for (const DenseCase& c : cases) {
    const std::string what = "dtype " + std::to_string(c.dtype) + " dim " + std::to_string(c.dim) +
                             (c.masks ? " masked" : "");
    auto rng = Rng(++salt);
    // Two input sets of different shapes (as many documents as queries, for the pairs layout), so that consecutive
    // calls carve the backend's scratch differently.
    TokenSets q[2], d[2];
    for (int v = 0; v < 2; ++v) {
      q[v] = Encoded(Generate(rng, Shape::kUnitGaussian, 6 + 2 * v, 0, 30 + 40 * v, c.dim), c.dtype);
      d[v] = Encoded(Generate(rng, Shape::kClustered, 6 + 2 * v, 0, 60 + 50 * v, c.dim), c.dtype);
      if (c.masks) {
        RandomMask(rng, q[v], 0.2);
        RandomMask(rng, d[v], 0.25);
      }
    }
    const DeviceSets dq0(q[0], c.lead, c.pad), dd0(d[0], c.lead + 1, c.pad), dq1(q[1], c.lead, c.pad),
        dd1(d[1], c.lead, c.pad);
    const DeviceSets* dq[2] = {&dq0, &dq1};
    const DeviceSets* dd[2] = {&dd0, &dd1};
    CUDA_OK(cudaDeviceSynchronize());  // the uploads, before calls on non-blocking streams
    for (maxsim_layout layout : {MAXSIM_LAYOUT_MATRIX, MAXSIM_LAYOUT_PAIRS, MAXSIM_LAYOUT_CANDIDATES}) {
      for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
        const std::string w = what + " layout " + std::to_string(layout) + " metric " + std::to_string(metric);
        std::vector<LayoutShape> shapes;
        std::vector<Matrix> want;
        for (int v = 0; v < 2; ++v) {
          shapes.emplace_back(rng, q[v], d[v], layout);
          OrderedForward out(shapes[v].n_scores, shapes[v].am_size);
          ASSERT_EQ(EnqueueForward(gpu, *dq[v], *dd[v], layout, shapes[v].off, shapes[v].cand, metric, s3.s, 0,
                                   out.sc.p, out.am.p), MAXSIM_OK) << w << ": " << maxsim_last_error();
          want.push_back(out.Down());
        }
        // 6 calls alternating inputs, two by two on s1 and s2, the fourth synchronous on s3.
        std::vector<std::unique_ptr<OrderedForward>> outs;
        for (int k = 0; k < 6; ++k) {
          const int v = k % 2;
          const bool ordered = k != 3;
          outs.push_back(std::make_unique<OrderedForward>(shapes[v].n_scores, shapes[v].am_size));
          ASSERT_EQ(EnqueueForward(gpu, *dq[v], *dd[v], layout, shapes[v].off, shapes[v].cand, metric,
                                   !ordered ? s3.s : (k / 2) % 2 ? s2.s : s1.s,
                                   ordered ? MAXSIM_CALL_STREAM_ORDERED : 0u, outs.back()->sc.p, outs.back()->am.p),
                    MAXSIM_OK) << w << " call " << k << ": " << maxsim_last_error();
        }
        ASSERT_EQ(maxsim_synchronize(gpu.get()), MAXSIM_OK) << w << ": " << maxsim_last_error();
        for (int k = 0; k < 6; ++k) ExpectIdentical(want[k % 2], outs[k]->Down(), w + " call " + std::to_string(k));
        if (HasFatalFailure()) return;
      }
    }
    // Backward (dot), every layout, atomic and deterministic: deterministic gradients and every grad_Q keep their
    // bits; atomic grad_D within the reference's bound.
    for (maxsim_layout layout : {MAXSIM_LAYOUT_MATRIX, MAXSIM_LAYOUT_PAIRS, MAXSIM_LAYOUT_CANDIDATES}) {
      const TokenSets& tq = q[0];
      const TokenSets& td = d[0];
      const DeviceSets& docs = dd0;
      LayoutShape shape(rng, tq, td, layout);
      OrderedForward fwd(shape.n_scores, shape.am_size);
      ASSERT_EQ(EnqueueForward(gpu, dq0, docs, layout, shape.off, shape.cand, MAXSIM_METRIC_DOT, s1.s,
                               MAXSIM_CALL_STREAM_ORDERED, fwd.sc.p, fwd.am.p), MAXSIM_OK) << maxsim_last_error();
      std::vector<float> grad(shape.n_scores);
      std::normal_distribution<float> gn(0.0f, 1.0f);
      for (float& g : grad) g = gn(rng);
      Dev<float> d_grad(grad.size());
      d_grad.Up(grad.data());
      CUDA_OK(cudaDeviceSynchronize());
      const uint64_t qrows = dq0.offsets.back(), drows = dd0.offsets.back();
      for (int det : {1, 0}) {
        const std::string w = what + " backward layout " + std::to_string(layout) + " deterministic " + std::to_string(det);
        Dev<float> sq(qrows * c.dim), sd(drows * c.dim), oq(qrows * c.dim), od(drows * c.dim);
        sq.Fill(0x7f);
        sd.Fill(0x7f);
        oq.Fill(0x7f);
        od.Fill(0x7f);
        CUDA_OK(cudaDeviceSynchronize());
        maxsim_backward_args a = BackwardCall(layout, fwd.am.p, d_grad.p, sq.p, sd.p, det, &shape.off, &shape.cand);
        a.cuda_stream = s1.s;
        ASSERT_EQ(maxsim_backward(gpu.get(), &dq0.s, &docs.s, &a), MAXSIM_OK) << w << ": " << maxsim_last_error();
        a = BackwardCall(layout, fwd.am.p, d_grad.p, oq.p, od.p, det, &shape.off, &shape.cand);
        a.cuda_stream = s2.s;  // another stream than the call before
        a.flags = MAXSIM_CALL_STREAM_ORDERED;
        ASSERT_EQ(maxsim_backward(gpu.get(), &dq0.s, &docs.s, &a), MAXSIM_OK) << w << ": " << maxsim_last_error();
        ASSERT_EQ(maxsim_synchronize(gpu.get()), MAXSIM_OK) << w << ": " << maxsim_last_error();
        ExpectSameBits(sq.Down(), oq.Down(), w + " grad_Q");
        if (det) {
          ExpectSameBits(sd.Down(), od.Down(), w + " grad_D");
        } else {
          GradRef rq, rd;
          ReferenceGrads(tq, td, layout, shape.off, shape.cand, fwd.Down().argmax, grad, &rq, &rd);
          ExpectGrad(rd, od.Down(), c.lead + 1, c.dim, w + " grad_D atomic");
        }
        if (HasFatalFailure()) return;
      }
    }
  }
}

// A stream-ordered call whose inputs fail the value check returns MAXSIM_OK; once its stream has run, its scores
// are NaN and its argmax -1, and maxsim_synchronize returns the synchronous call's status and message with the call
// named, once. The next call reports it as soon as the failure is recorded (after the stream has run) and does
// nothing. A non-finite value in a masked row is no error. The backward's non-finite gradient and bad argmax
// entry likewise, with NaN gradients.
TEST_F(Gpu, StreamOrderedFailuresAreReportedBySynchronizeAndTheNextCall) {
  Context gpu(Options("cuda"));
  Stream s1, s2;
  struct Case {
    maxsim_dtype dtype;
    uint64_t lq;
    bool uniform;
    maxsim_metric metric;
  };
  // Dot: the folded check (ring, FFMA and wgmma kernels), located by the settle kernel; cosine: the row check.
  const Case cases[] = {{MAXSIM_BF16, 32, true, MAXSIM_METRIC_DOT},     {MAXSIM_BF16, 300, true, MAXSIM_METRIC_DOT},
                        {MAXSIM_F16, 20, false, MAXSIM_METRIC_DOT},     {MAXSIM_F32, 24, false, MAXSIM_METRIC_COSINE},
                        {MAXSIM_BF16, 32, false, MAXSIM_METRIC_COSINE}};
  const std::string prefix = "backend cuda: ";
  uint64_t salt = 2500;
  for (const Case& c : cases) {
    auto rng = Rng(++salt);
    const std::string what = "dtype " + std::to_string(c.dtype) + " lq " + std::to_string(c.lq) +
                             (c.uniform ? " uniform" : " offsets") + " metric " + std::to_string(c.metric);
    const TokenSets q = Encoded(Generate(rng, Shape::kUnitGaussian, 3, c.lq, c.lq, 128), c.dtype);
    const TokenSets d = Encoded(Generate(rng, Shape::kUnitGaussian, 5, c.uniform ? 120 : 20, 120, 128), c.dtype);
    // One matrix call on `stream` with `flags` into outputs filled with zeros (a partial result would show).
    auto call = [&](const TokenSets& tq, const TokenSets& td, cudaStream_t stream, uint32_t flags, OrderedForward* out,
                    std::unique_ptr<DeviceSets>* keep) {
      keep[0] = std::make_unique<DeviceSets>(tq);
      keep[1] = std::make_unique<DeviceSets>(td);
      if (c.uniform) {
        for (int k = 0; k < 2; ++k) {
          keep[k]->s.offsets = nullptr;
          keep[k]->s.set_length = (k ? td : tq).length(0);
        }
      }
      cudaDeviceSynchronize();  // the uploads ran on the legacy stream
      return EnqueueForward(gpu, *keep[0], *keep[1], MAXSIM_LAYOUT_MATRIX, {}, {}, c.metric, stream, flags, out->sc.p,
                            out->am.p);
    };
    const uint64_t n_scores = q.n_sets() * d.n_sets(), am_size = d.n_sets() * q.rows();
    for (bool query : {true, false}) {
      TokenSets bq = q, bd = d;
      TokenSets& t = query ? bq : bd;
      const uint64_t set = query ? 1 : 2, token = query ? 5 : 7;
      t.values[(t.offsets[set] + token) * t.dim + (query ? 3 : 0)] = query ? INFINITY : std::nanf("");
      t.Encode(c.dtype);
      const std::string w = what + (query ? " bad query" : " bad document");
      std::unique_ptr<DeviceSets> keep[2];
      OrderedForward sync_out(n_scores, am_size), out(n_scores, am_size);
      ASSERT_EQ(call(bq, bd, s1.s, 0, &sync_out, keep), MAXSIM_ERR_NON_FINITE) << w;
      const std::string sync_msg = maxsim_last_error();
      ASSERT_EQ(sync_msg.rfind(prefix, 0), 0u) << sync_msg;
      EXPECT_NE(sync_msg.find(std::string(query ? "queries" : "documents") + ": set " + std::to_string(set) +
                              " token " + std::to_string(token) + " "), std::string::npos) << w << ": " << sync_msg;
      ASSERT_EQ(call(bq, bd, s1.s, MAXSIM_CALL_STREAM_ORDERED, &out, keep), MAXSIM_OK) << w << ": " << maxsim_last_error();
      ASSERT_EQ(maxsim_synchronize(gpu.get()), MAXSIM_ERR_NON_FINITE) << w;
      EXPECT_EQ(std::string(maxsim_last_error()),
                prefix + "maxsim_score_matrix (stream-ordered): " + sync_msg.substr(prefix.size())) << w;
      const Matrix m = out.Down();
      for (float v : m.scores) ASSERT_TRUE(std::isnan(v)) << w << ": a score survived a failed call: " << v;
      for (int32_t v : m.argmax) ASSERT_EQ(v, -1) << w << ": an argmax survived a failed call";
      ASSERT_EQ(maxsim_synchronize(gpu.get()), MAXSIM_OK) << w << ": reported twice: " << maxsim_last_error();
      // The next call reports it (its outputs untouched), the one after runs.
      ASSERT_EQ(call(bq, bd, s1.s, MAXSIM_CALL_STREAM_ORDERED, &out, keep), MAXSIM_OK) << w << ": " << maxsim_last_error();
      CUDA_OK(cudaStreamSynchronize(s1.s));
      std::unique_ptr<DeviceSets> keep2[2];
      OrderedForward next(n_scores, am_size);
      ASSERT_EQ(call(q, d, s2.s, 0, &next, keep2), MAXSIM_ERR_NON_FINITE) << w;
      EXPECT_NE(std::string(maxsim_last_error()).find("maxsim_score_matrix (stream-ordered): "), std::string::npos)
          << w << ": " << maxsim_last_error();
      for (float v : next.sc.Down()) ASSERT_EQ(v, 0.0f) << w << ": the reporting call wrote a score";
      ASSERT_EQ(call(q, d, s2.s, 0, &next, keep2), MAXSIM_OK) << w << ": " << maxsim_last_error();
      const Matrix good = next.Down();
      for (uint64_t i = 0; i < q.n_sets(); ++i) {
        for (uint64_t j = 0; j < d.n_sets(); ++j) {
          const std::string err = CheckPair(q, i, d, j, c.metric, good.scores[i * d.n_sets() + j],
                                            good.argmax.data() + d.n_sets() * q.offsets[i] + j * q.length(i));
          ASSERT_TRUE(err.empty()) << w << ": after the failure: query " << i << " doc " << j << ": " << err;
        }
      }
    }
    // A NaN in a masked query row and an infinity in a masked document row: no error, the synchronous bits.
    TokenSets mq = q, md = d;
    mq.mask.assign(mq.rows(), 1);
    md.mask.assign(md.rows(), 1);
    mq.mask[mq.offsets[1] + 2] = 0;
    md.mask[md.offsets[3] + 1] = 0;
    mq.values[(mq.offsets[1] + 2) * mq.dim] = std::nanf("");
    md.values[(md.offsets[3] + 1) * md.dim + 5] = INFINITY;
    mq.Encode(c.dtype);
    md.Encode(c.dtype);
    std::unique_ptr<DeviceSets> keep[2];
    OrderedForward sync_out(n_scores, am_size), out(n_scores, am_size);
    ASSERT_EQ(call(mq, md, s1.s, 0, &sync_out, keep), MAXSIM_OK) << what << " masked: " << maxsim_last_error();
    ASSERT_EQ(call(mq, md, s2.s, MAXSIM_CALL_STREAM_ORDERED, &out, keep), MAXSIM_OK) << what << " masked: "
                                                                                    << maxsim_last_error();
    ASSERT_EQ(maxsim_synchronize(gpu.get()), MAXSIM_OK) << what << " masked: " << maxsim_last_error();
    ExpectIdentical(sync_out.Down(), out.Down(), what + " masked");
  }
  // The backward: a non-finite score gradient, then an argmax entry past its document.
  auto rng = Rng(2599);
  const TokenSets q = Encoded(Generate(rng, Shape::kUnitGaussian, 4, 1, 30, 64), MAXSIM_BF16);
  const TokenSets d = Encoded(Generate(rng, Shape::kClustered, 6, 1, 50, 64), MAXSIM_BF16);
  const DeviceSets dq(q, 1, 0), dd(d, 0, 0);
  CUDA_OK(cudaDeviceSynchronize());
  OrderedForward fwd(q.n_sets() * d.n_sets(), d.n_sets() * q.rows());
  ASSERT_EQ(EnqueueForward(gpu, dq, dd, MAXSIM_LAYOUT_MATRIX, {}, {}, MAXSIM_METRIC_DOT, s1.s, 0, fwd.sc.p, fwd.am.p),
            MAXSIM_OK) << maxsim_last_error();
  std::vector<float> grad(q.n_sets() * d.n_sets(), 0.25f);
  std::vector<int32_t> argmax = fwd.Down().argmax;
  for (int bad = 0; bad < 2; ++bad) {
    for (int det : {0, 1}) {
      const std::string w = std::string(bad ? "bad argmax" : "bad gradient") + " deterministic " + std::to_string(det);
      std::vector<float> g = grad;
      std::vector<int32_t> am = argmax;
      if (bad == 0) g[5] = INFINITY;
      else am[d.n_sets() * q.offsets[1] + 2 * q.length(1)] = 9999;
      Dev<float> d_grad(g.size());
      Dev<int32_t> d_am(am.size());
      d_grad.Up(g.data());
      d_am.Up(am.data());
      Dev<float> oq(dq.offsets.back() * 64), od(dd.offsets.back() * 64);
      oq.Fill(0);
      od.Fill(0);
      CUDA_OK(cudaDeviceSynchronize());
      maxsim_backward_args a = BackwardCall(MAXSIM_LAYOUT_MATRIX, d_am.p, d_grad.p, oq.p, od.p, det);
      a.cuda_stream = s2.s;
      const maxsim_status want = bad ? MAXSIM_ERR_INVALID_ARGUMENT : MAXSIM_ERR_NON_FINITE;
      ASSERT_EQ(maxsim_backward(gpu.get(), &dq.s, &dd.s, &a), want) << w;
      const std::string sync_msg = maxsim_last_error();
      a.flags = MAXSIM_CALL_STREAM_ORDERED;
      ASSERT_EQ(maxsim_backward(gpu.get(), &dq.s, &dd.s, &a), MAXSIM_OK) << w << ": " << maxsim_last_error();
      ASSERT_EQ(maxsim_synchronize(gpu.get()), want) << w;
      EXPECT_EQ(std::string(maxsim_last_error()),
                prefix + "maxsim_backward (stream-ordered): " + sync_msg.substr(prefix.size())) << w;
      for (float v : oq.Down()) ASSERT_TRUE(std::isnan(v)) << w << ": a query gradient survived: " << v;
      for (float v : od.Down()) ASSERT_TRUE(std::isnan(v)) << w << ": a document gradient survived: " << v;
    }
  }
}

TEST_F(Gpu, SanitizeSmallEveryOperation) {
  Context gpu(Options("cuda"));
  auto rng = Rng(900);
  TokenSets q = Encoded(Generate(rng, Shape::kUnitGaussian, 3, 0, 20, 64), MAXSIM_BF16);
  TokenSets d = Encoded(Generate(rng, Shape::kClustered, 9, 0, 40, 64), MAXSIM_BF16);
  Packed pq = Packed::Pack(gpu, q.Dense());
  Packed pd = Packed::Pack(gpu, d.Dense());
  for (maxsim_mode mode : {MAXSIM_MODE_EXACT, MAXSIM_MODE_CERTIFIED, MAXSIM_MODE_APPROXIMATE}) {
    const Matrix m = ScoreMatrix(gpu, pq, q.n_sets(), q.rows(), pd, d.n_sets(), MAXSIM_METRIC_COSINE, mode);
    if (mode != MAXSIM_MODE_APPROXIMATE) ExpectReference(q, d, MAXSIM_METRIC_COSINE, m, "small");
    ScoreOptions o;
    o.mode = mode;
    TopKResult t = gpu.TopK(pq, q.n_sets(), pd, 4, o);
    (void)t;
  }
  // A query batch at dim 128, scores only (on sm_90a the wgmma batch kernel: bulk tensor copies, documents shorter
  // than their tile copied by cp.async, last tiles overlapping the tile before; and with cp.async copies), the bits
  // of the argmax request's scores, which the reference checks.
  {
    const TokenSets bq = Encoded(Generate(rng, Shape::kUnitGaussian, 4, 1, 32, 128), MAXSIM_BF16);
    const TokenSets bd = Encoded(Generate(rng, Shape::kClustered, 12, 0, 300, 128), MAXSIM_BF16);
    const Packed pbq = Packed::Pack(gpu, bq.Dense()), pbd = Packed::Pack(gpu, bd.Dense());
    const Matrix m = ScoreMatrix(gpu, pbq, bq.n_sets(), bq.rows(), pbd, bd.n_sets(), MAXSIM_METRIC_DOT,
                                 MAXSIM_MODE_EXACT);
    ExpectReference(bq, bd, MAXSIM_METRIC_DOT, m, "small batch");
    ExpectSameBits(m.scores,
                   ScoreValues(gpu, pbq, bq.n_sets(), pbd, bd.n_sets(), MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT),
                   "small batch, scores only");
    ExpectSameBits(m.scores, WithEnv("MAXSIM_CUDA_BATCH_TMA", "0", [&](Context& other) {
                     return ScoreValues(other, pbq, bq.n_sets(), pbd, bd.n_sets(), MAXSIM_METRIC_DOT,
                                        MAXSIM_MODE_EXACT);
                   }),
                   "small batch, scores only, cp.async copies");
  }
  // Dense host queries (copied, checked and normed on the GPU), every operation.
  {
    const HostSets hq(q, 1, 3);
    std::vector<uint64_t> off, cand;
    RandomCandidates(rng, q.n_sets(), d.n_sets(), &off, &cand);
    const AllOps a = RunOps(gpu.get(), hq.sets(), q.n_sets(), q.rows(), Lengths(q), pd.get(), d.n_sets(), off, cand,
                            MAXSIM_METRIC_COSINE, MAXSIM_MODE_EXACT, 4);
    ExpectReference(q, d, MAXSIM_METRIC_COSINE, a.m, "small dense host queries");
  }
  RandomMask(rng, q, 0.2);
  RandomMask(rng, d, 0.2);
  const DeviceSets dq(q, 1, 0), dd(d, 0, 2);
  const Matrix f = DeviceForward(gpu, dq, dd, MAXSIM_LAYOUT_MATRIX, {}, {}, d.n_sets() * q.rows(), MAXSIM_METRIC_DOT);
  ExpectReference(q, d, MAXSIM_METRIC_DOT, f, "small device");
  Dev<int32_t> d_am(f.argmax.size());
  d_am.Up(f.argmax.data());
  std::vector<float> grad(q.n_sets() * d.n_sets(), 0.5f);
  Dev<float> d_grad(grad.size()), o_q(dq.offsets.back() * 64), o_d(dd.offsets.back() * 64);
  d_grad.Up(grad.data());
  for (int det : {0, 1}) {
    maxsim_backward_args a;
    maxsim_backward_args_init(&a);
    a.argmax = d_am.p;
    a.grad_scores = d_grad.p;
    a.grad_queries = o_q.p;
    a.grad_documents = o_d.p;
    a.deterministic = det;
    ASSERT_EQ(maxsim_backward(gpu.get(), &dq.s, &dd.s, &a), MAXSIM_OK) << maxsim_last_error();
  }
  // Stream-ordered: forward and backward on two streams, a failing call (its settle kernel locating the row and
  // filling the outputs), and maxsim_synchronize.
  {
    Stream s1, s2;
    OrderedForward of(f.scores.size(), f.argmax.size());
    ASSERT_EQ(EnqueueForward(gpu, dq, dd, MAXSIM_LAYOUT_MATRIX, {}, {}, MAXSIM_METRIC_DOT, s1.s,
                             MAXSIM_CALL_STREAM_ORDERED, of.sc.p, of.am.p), MAXSIM_OK) << maxsim_last_error();
    for (int det : {0, 1}) {
      maxsim_backward_args a = BackwardCall(MAXSIM_LAYOUT_MATRIX, of.am.p, d_grad.p, o_q.p, o_d.p, det);
      a.cuda_stream = det ? s1.s : s2.s;
      a.flags = MAXSIM_CALL_STREAM_ORDERED;
      ASSERT_EQ(maxsim_backward(gpu.get(), &dq.s, &dd.s, &a), MAXSIM_OK) << maxsim_last_error();
    }
    TokenSets bq = q;
    bq.values[bq.rows() / 2 * bq.dim + 2] = std::nanf("");
    bq.mask.assign(bq.rows(), 1);
    bq.Encode(MAXSIM_BF16);
    const DeviceSets dbq(bq, 1, 0);
    CUDA_OK(cudaDeviceSynchronize());
    ASSERT_EQ(EnqueueForward(gpu, dbq, dd, MAXSIM_LAYOUT_MATRIX, {}, {}, MAXSIM_METRIC_DOT, s2.s,
                             MAXSIM_CALL_STREAM_ORDERED, of.sc.p, of.am.p), MAXSIM_OK) << maxsim_last_error();
    ASSERT_EQ(maxsim_synchronize(gpu.get()), MAXSIM_ERR_NON_FINITE);
    ASSERT_EQ(maxsim_synchronize(gpu.get()), MAXSIM_OK) << maxsim_last_error();
  }
  // Enough short-query pairs for the screening kernel's per-warp ring (ScreenPipeKernel), ragged and empty
  // documents, code rows of 128 and 64 bytes.
  for (uint32_t dim : {128u, 64u}) {
    TokenSets sq = Encoded(Generate(rng, Shape::kUnitGaussian, 1, 1, 32, dim), MAXSIM_BF16);
    TokenSets sd = Encoded(Generate(rng, Shape::kClustered, 700, 0, 45, dim), MAXSIM_BF16);
    Packed spq = Packed::Pack(gpu, sq.Dense());
    Packed spd = Packed::Pack(gpu, sd.Dense());
    for (maxsim_mode mode : {MAXSIM_MODE_CERTIFIED, MAXSIM_MODE_APPROXIMATE}) {
      const Matrix m = ScoreMatrix(gpu, spq, sq.n_sets(), sq.rows(), spd, sd.n_sets(), MAXSIM_METRIC_DOT, mode);
      if (mode == MAXSIM_MODE_CERTIFIED) ExpectReference(sq, sd, MAXSIM_METRIC_DOT, m, "small screening ring", 50);
    }
  }
  // Long queries, scores only: the wgmma kernel on sm_90 (256- and 128-row groups, ragged documents with a partial
  // last stage, an empty document), packed and as masked device tensors.
  for (uint64_t lq : {300ull, 100ull}) {
    TokenSets lq_q = Encoded(Generate(rng, Shape::kUnitGaussian, 2, lq - 20, lq, 128), MAXSIM_BF16);
    TokenSets lq_d = Encoded(Generate(rng, Shape::kClustered, 5, 0, 200, 128), MAXSIM_BF16);
    Packed lpq = Packed::Pack(gpu, lq_q.Dense());
    Packed lpd = Packed::Pack(gpu, lq_d.Dense());
    const std::vector<float> v = ScoreValues(gpu, lpq, lq_q.n_sets(), lpd, lq_d.n_sets(), MAXSIM_METRIC_DOT,
                                             MAXSIM_MODE_EXACT);
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string err = CheckPair(lq_q, i / lq_d.n_sets(), lq_d, i % lq_d.n_sets(), MAXSIM_METRIC_DOT, v[i],
                                        nullptr);
      ASSERT_TRUE(err.empty()) << "small long-query " << i << ": " << err;
    }
    RandomMask(rng, lq_q, 0.2);
    RandomMask(rng, lq_d, 0.3);
    const DeviceSets lq_dq(lq_q), lq_dd(lq_d);
    const std::vector<float> dv = DeviceScoreValues(gpu, lq_dq, lq_dd, MAXSIM_METRIC_COSINE);
    ASSERT_EQ(dv.size(), v.size());
  }
}

}  // namespace
}  // namespace maxsim::test
