// SPDX-License-Identifier: Apache-2.0
// Backend-neutral plugin conformance: every plugin this build made runs the same checks against the float64
// reference (tests/test_util.cc), through the public C API, with device tensors allocated and copied through the
// plugin's own ABI hooks (mem_alloc / mem_copy / mem_free) in the memory kind it declares (accepted_memory):
// nothing here knows which device is behind a plugin. A new backend gets these checks by adding its plugin file
// to Plugins() below.
//   - packed corpora: score matrix with argmax (dot and cosine), candidates and top-k over random and adversarial
//     data (near ties, empty sets, huge and tiny norms, odd dimensions, f32 / f16 / bf16);
//   - certified results bit-identical to the plugin's own exact ones; approximate within the reference bound;
//   - top-k equal to the ranking of the plugin's own score matrix (ties to the lower index);
//   - a score matrix written into a column range of a wider one (ABI 1.3, how each device of a sharded call
//     writes the caller's matrix) holds the plugin's own bits there and leaves every other element untouched;
//   - device tensors: the forward (matrix and candidates) against the reference, and the backward against the
//     float64 gradients of the forward's argmax;
//   - stream-ordered calls (ABI 1.4): the synchronous bits, and deferred failures reported by maxsim_synchronize.
// A plugin whose probe fails here (no device) is skipped with its reason.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "maxsim/maxsim.hpp"
#include "maxsim/plugin.h"
#include "plugin_test_util.h"
#include "test_util.h"

namespace maxsim::test {
namespace {

struct PluginCase {
  std::string name, path;
};

std::vector<PluginCase> Plugins() {
  std::vector<PluginCase> v;
#ifdef MAXSIM_TEST_PLUGIN_DIR
  v.push_back({"testcpu", std::string(MAXSIM_TEST_PLUGIN_DIR) + "/libmaxsim-plugin-testcpu.so"});
#endif
#ifdef MAXSIM_TEST_PLUGIN_ABI_DIR
  v.push_back({"testcpu-2dev", std::string(MAXSIM_TEST_PLUGIN_ABI_DIR) + "/libmaxsim-plugin-testcpu-2dev.so"});
#endif
#ifdef MAXSIM_CUDA_PLUGIN_PATH
  v.push_back({"cuda", MAXSIM_CUDA_PLUGIN_PATH});
#endif
  return v;
}

maxsim_options CpuOptions() {
  maxsim_options o;
  maxsim_options_init(&o);
  o.backend = "cpu";
  o.load_plugins = 0;
  return o;
}

// Device memory through the plugin's hooks.
class DeviceBuffer {
 public:
  DeviceBuffer(maxsim_context* ctx, uint64_t bytes) {
    if (maxsim_context_plugin(ctx, 0, &api_, &backend_) != MAXSIM_OK) {
      status_ = MAXSIM_ERR_BACKEND_UNAVAILABLE;
      error_ = maxsim_last_error();
      return;
    }
    char err[256] = {};
    status_ = api_->mem_alloc(backend_, bytes, &p_, err, sizeof(err));
    error_ = err;
  }
  ~DeviceBuffer() {
    if (p_) api_->mem_free(backend_, p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return p_; }
  bool ok() const { return status_ == MAXSIM_OK; }
  const std::string& error() const { return error_; }
  void Up(const void* src, uint64_t bytes) { Copy(p_, src, bytes, MAXSIM_COPY_HOST_TO_DEVICE); }
  void Down(void* dst, uint64_t bytes) const { Copy(dst, p_, bytes, MAXSIM_COPY_DEVICE_TO_HOST); }

 private:
  void Copy(void* dst, const void* src, uint64_t bytes, maxsim_plugin_copy_kind kind) const {
    char err[256] = {};
    ASSERT_EQ(api_->mem_copy(backend_, dst, src, bytes, kind, err, sizeof(err)), MAXSIM_OK) << err;
  }
  const maxsim_plugin_api* api_ = nullptr;
  maxsim_plugin_backend* backend_ = nullptr;
  void* p_ = nullptr;
  maxsim_status status_ = MAXSIM_OK;
  std::string error_;
};

// Encoded token sets q and d uploaded through the plugin's hooks, as dense sets of memory kind `mem`: the C structs
// directly, whatever the plugin's memory kind is.
struct DeviceInputs {
  DeviceInputs(maxsim_context* ctx, const TokenSets& q, const TokenSets& d, maxsim_dtype dtype, uint32_t dim,
               maxsim_memory mem)
      : dq(ctx, q.encoded.size()), dd(ctx, d.encoded.size()) {
    if (!ok()) return;
    dq.Up(q.encoded.data(), q.encoded.size());
    dd.Up(d.encoded.data(), d.encoded.size());
    rq = *DenseSets(dq.get(), dtype, dim, q.offsets).get();
    rd = *DenseSets(dd.get(), dtype, dim, d.offsets).get();
    rq.memory = mem;
    rd.memory = mem;
  }
  bool ok() const { return dq.ok() && dd.ok(); }
  std::string error() const { return dq.error() + dd.error(); }
  DeviceBuffer dq, dd;
  maxsim_dense_sets rq{}, rd{};
  const maxsim_sets qs{nullptr, &rq}, ds{nullptr, &rd};
};

// The matrix layout's backward over device buffers: the forward's argmax, the score gradients, both outputs.
maxsim_backward_args MatrixBackwardArgs(const DeviceBuffer& argmax, const DeviceBuffer& grad_scores,
                                        const DeviceBuffer& grad_queries, const DeviceBuffer& grad_documents,
                                        int deterministic) {
  maxsim_backward_args args;
  maxsim_backward_args_init(&args);
  args.argmax = static_cast<const int32_t*>(argmax.get());
  args.grad_scores = static_cast<const float*>(grad_scores.get());
  args.grad_queries = static_cast<float*>(grad_queries.get());
  args.grad_documents = static_cast<float*>(grad_documents.get());
  args.deterministic = deterministic;
  return args;
}

class PluginConformance : public ::testing::TestWithParam<PluginCase> {
 protected:
  void SetUp() override {
    maxsim_options o;
    maxsim_options_init(&o);
    o.plugin_path = GetParam().path.c_str();
    o.backend = GetParam().name.c_str();
    try {
      ctx_ = std::make_unique<Context>(o);
    } catch (const Error& e) {
      GTEST_SKIP() << GetParam().name << " is not usable here: " << e.what();
    }
  }
  maxsim_context* ctx() const { return ctx_->get(); }
  // The device memory kind the plugin takes (HOST if none, or no hooks to reach it).
  maxsim_memory DeviceMemory() const {
    const maxsim_plugin_api* api = nullptr;
    maxsim_plugin_backend* backend = nullptr;
    if (maxsim_context_plugin(ctx(), 0, &api, &backend) != MAXSIM_OK) return MAXSIM_MEMORY_HOST;
    if (!MAXSIM_PLUGIN_HAS(api, mem_alloc) || !MAXSIM_PLUGIN_HAS(api, mem_free) || !MAXSIM_PLUGIN_HAS(api, mem_copy) ||
        !MAXSIM_PLUGIN_HAS_FIELD(api, accepted_memory)) {
      return MAXSIM_MEMORY_HOST;
    }
    for (int m = 1; m < 64; ++m) {
      if (api->accepted_memory & MAXSIM_MEMORY_BIT(m)) return static_cast<maxsim_memory>(m);
    }
    return MAXSIM_MEMORY_HOST;
  }
  std::unique_ptr<Context> ctx_;
  Context cpu_{CpuOptions()};
};

struct Case {
  Shape shape;
  maxsim_dtype dtype;
  uint32_t dim;
  uint64_t nq, nd, max_lq, max_ld;
};

std::string Describe(const Case& c, maxsim_metric metric) {
  return std::string(ShapeName(c.shape)) + " dtype " + std::to_string(c.dtype) + " dim " + std::to_string(c.dim) +
         (metric == MAXSIM_METRIC_COSINE ? " cosine" : " dot");
}

const Case kCases[] = {
    {Shape::kUnitGaussian, MAXSIM_BF16, 128, 4, 23, 32, 60},
    {Shape::kGaussian, MAXSIM_F16, 96, 3, 17, 20, 40},
    {Shape::kGaussian, MAXSIM_F32, 17, 3, 9, 7, 13},
    {Shape::kNearTies, MAXSIM_BF16, 64, 3, 11, 16, 30},
    {Shape::kDuplicates, MAXSIM_BF16, 128, 2, 9, 12, 20},
    {Shape::kLargeNorm, MAXSIM_F32, 33, 2, 7, 9, 11},
    {Shape::kTinyNorm, MAXSIM_F32, 48, 2, 7, 9, 11},
    {Shape::kClustered, MAXSIM_F16, 100, 3, 12, 40, 70},
};

// A case's queries and documents, drawn with rng, encoded, and packed by the CPU context.
struct CaseData {
  TokenSets q, d;
  Packed queries, corpus;
};

CaseData Draw(std::mt19937_64& rng, const Case& c, Context& cpu) {
  TokenSets q = Generate(rng, c.shape, c.nq, 0, c.max_lq, c.dim);
  TokenSets d = Generate(rng, c.shape, c.nd, 0, c.max_ld, c.dim);
  q.Encode(c.dtype);
  d.Encode(c.dtype);
  Packed corpus = Packed::Pack(cpu, d.Dense());
  Packed queries = Packed::Pack(cpu, q.Dense());
  return {std::move(q), std::move(d), std::move(queries), std::move(corpus)};
}

TEST_P(PluginConformance, PackedCorporaMatchTheReference) {
  std::mt19937_64 rng(2024);
  for (const Case& c : kCases) {
    const CaseData data = Draw(rng, c, cpu_);
    const TokenSets &q = data.q, &d = data.d;
    const Packed &queries = data.queries, &corpus = data.corpus;
    const uint64_t nq = q.n_sets(), nd = d.n_sets();
    for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
      const std::string what = Describe(c, metric);
      SCOPED_TRACE(what);
      std::vector<int32_t> am(nd * q.rows());
      const std::vector<float> exact = ctx_->ScoreMatrix(queries, nq, corpus, nd, {metric}, am.data());
      for (uint64_t i = 0; i < nq; ++i) {
        for (uint64_t j = 0; j < nd; ++j) {
          const std::string m =
              CheckPair(q, i, d, j, metric, exact[i * nd + j], am.data() + nd * q.offsets[i] + j * q.length(i));
          ASSERT_EQ(m, "") << "pair " << i << "," << j;
        }
      }
      const std::vector<float> cert = ctx_->ScoreMatrix(queries, nq, corpus, nd, {metric, MAXSIM_MODE_CERTIFIED});
      ASSERT_EQ(std::memcmp(cert.data(), exact.data(), exact.size() * 4), 0) << "certified differs from exact";
      const std::vector<float> approx = ctx_->ScoreMatrix(queries, nq, corpus, nd, {metric, MAXSIM_MODE_APPROXIMATE});
      // Approximate: one refined token per query token, so never above the reference beyond rounding.
      for (uint64_t p = 0; p < approx.size(); ++p) {
        const RefPair r = Reference(q, p / nd, d, p % nd, metric);
        if (std::isinf(r.score)) {
          ASSERT_TRUE(std::isinf(approx[p]) && approx[p] < 0) << "approximate pair " << p;
        } else {
          ASSERT_LE(static_cast<double>(approx[p]), r.score + 2 * r.tolerance) << "approximate pair " << p;
        }
      }
      // Candidates (every document of query 0, the odd ones of the others) and top-k against the plugin's matrix.
      std::vector<uint64_t> off{0}, cand;
      for (uint64_t i = 0; i < nq; ++i) {
        for (uint64_t j = i == 0 ? 0 : 1; j < nd; j += i == 0 ? 1 : 2) cand.push_back(j);
        off.push_back(cand.size());
      }
      std::vector<float> cs(cand.size());
      ctx_->ScoreCandidates(queries, corpus, off, cand, cs, {metric});
      for (uint64_t i = 0; i < nq; ++i) {
        for (uint64_t e = off[i]; e < off[i + 1]; ++e) {
          ASSERT_EQ(std::memcmp(&cs[e], &exact[i * nd + cand[e]], 4), 0) << "candidate " << e;
        }
      }
      const uint64_t k = std::min<uint64_t>(5, nd + 1);
      const TopKResult top = ctx_->TopK(queries, nq, corpus, k, {metric});
      for (uint64_t i = 0; i < nq; ++i) {
        const std::vector<uint64_t> order = RankDescending(exact.data() + i * nd, nd);
        for (uint64_t r = 0; r < k; ++r) {
          if (r < nd) {
            ASSERT_EQ(top.index[i * k + r], order[r]) << "query " << i << " rank " << r;
            ASSERT_EQ(std::memcmp(&top.scores[i * k + r], &exact[i * nd + order[r]], 4), 0);
          } else {
            ASSERT_EQ(top.index[i * k + r], UINT64_MAX);
          }
        }
      }
    }
  }
}

TEST_P(PluginConformance, ScoreMatrixIntoColumnsTouchesOnlyItsColumns) {
  std::mt19937_64 rng(31);
  for (const Case& c : kCases) {
    const CaseData data = Draw(rng, c, cpu_);
    for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
      for (maxsim_mode mode : {MAXSIM_MODE_EXACT, MAXSIM_MODE_CERTIFIED}) {
        bool takes = false;
        const std::string m =
            MatrixColumnsMismatch(ctx(), data.queries.get(), data.corpus.get(), metric, mode, &takes);
        if (!takes) GTEST_SKIP() << GetParam().name << " does not declare MAXSIM_PLUGIN_OUTPUT_MATRIX_COLUMNS";
        ASSERT_EQ(m, "") << Describe(c, metric) << " mode " << mode;
      }
    }
  }
}

TEST_P(PluginConformance, DeviceTensorsThroughThePluginsMemoryHooks) {
  const maxsim_memory mem = DeviceMemory();
  if (mem == MAXSIM_MEMORY_HOST) GTEST_SKIP() << GetParam().name << " takes no device memory or has no memory hooks";
  std::mt19937_64 rng(77);
  for (const Case& c : {kCases[0], kCases[2], kCases[3]}) {
    TokenSets q = Generate(rng, c.shape, c.nq, 1, c.max_lq, c.dim);
    TokenSets d = Generate(rng, c.shape, c.nd, 0, c.max_ld, c.dim);
    q.Encode(c.dtype);
    d.Encode(c.dtype);
    const uint64_t nq = q.n_sets(), nd = d.n_sets();
    const DeviceInputs in(ctx(), q, d, c.dtype, c.dim, mem);
    ASSERT_TRUE(in.ok()) << in.error();
    const maxsim_sets &qs = in.qs, &ds = in.ds;
    const maxsim_dense_sets &rq = in.rq, &rd = in.rd;
    maxsim_score_options so;
    maxsim_score_options_init(&so);
    const std::string what = Describe(c, MAXSIM_METRIC_DOT);
    SCOPED_TRACE(what);
    // Forward, matrix layout: outputs in device memory too.
    DeviceBuffer o_scores(ctx(), nq * nd * 4), o_argmax(ctx(), nd * q.rows() * 4);
    ASSERT_EQ(maxsim_score_matrix(ctx(), &qs, &ds, &so, static_cast<float*>(o_scores.get()),
                                  static_cast<int32_t*>(o_argmax.get())),
              MAXSIM_OK)
        << maxsim_last_error();
    std::vector<float> scores(nq * nd);
    std::vector<int32_t> argmax(nd * q.rows());
    o_scores.Down(scores.data(), scores.size() * 4);
    o_argmax.Down(argmax.data(), argmax.size() * 4);
    for (uint64_t i = 0; i < nq; ++i) {
      for (uint64_t j = 0; j < nd; ++j) {
        ASSERT_EQ(CheckPair(q, i, d, j, MAXSIM_METRIC_DOT, scores[i * nd + j],
                            argmax.data() + nd * q.offsets[i] + j * q.length(i)),
                  "")
            << "pair " << i << "," << j;
      }
    }
    // Candidates: the same values as the matrix.
    std::vector<uint64_t> off{0}, cand;
    for (uint64_t i = 0; i < nq; ++i) {
      for (uint64_t j = i % 2; j < nd; j += 2) cand.push_back(j);
      off.push_back(cand.size());
    }
    DeviceBuffer o_cand(ctx(), cand.size() * 4 + 4);
    ASSERT_EQ(maxsim_score_candidates(ctx(), &qs, &ds, off.data(), cand.data(), &so,
                                      static_cast<float*>(o_cand.get()), nullptr),
              MAXSIM_OK)
        << maxsim_last_error();
    std::vector<float> cs(cand.size());
    o_cand.Down(cs.data(), cs.size() * 4);
    for (uint64_t i = 0; i < nq; ++i) {
      for (uint64_t e = off[i]; e < off[i + 1]; ++e) {
        ASSERT_EQ(CheckPair(q, i, d, cand[e], MAXSIM_METRIC_DOT, cs[e], nullptr), "") << "candidate " << e;
      }
    }
    // Backward of the matrix forward, against the float64 gradients of its argmax.
    std::vector<float> grad(nq * nd);
    std::normal_distribution<float> g(0.0f, 1.0f);
    for (float& x : grad) x = g(rng);
    DeviceBuffer d_grad(ctx(), grad.size() * 4), o_gq(ctx(), q.rows() * c.dim * 4), o_gd(ctx(), d.rows() * c.dim * 4);
    d_grad.Up(grad.data(), grad.size() * 4);
    for (int deterministic = 0; deterministic < 2; ++deterministic) {
      const maxsim_backward_args args = MatrixBackwardArgs(o_argmax, d_grad, o_gq, o_gd, deterministic);
      ASSERT_EQ(maxsim_backward(ctx(), &rq, &rd, &args), MAXSIM_OK) << maxsim_last_error();
      std::vector<float> gq(q.rows() * c.dim), gd(d.rows() * c.dim);
      o_gq.Down(gq.data(), gq.size() * 4);
      o_gd.Down(gd.data(), gd.size() * 4);
      GradRef rq, rd;
      ReferenceGrads(q, d, MAXSIM_LAYOUT_MATRIX, {}, {}, argmax, grad, &rq, &rd);
      ASSERT_EQ(GradMismatch(rq, gq, 0, c.dim), "") << "grad_Q, deterministic " << deterministic;
      ASSERT_EQ(GradMismatch(rd, gd, 0, c.dim), "") << "grad_D, deterministic " << deterministic;
    }
  }
}

// Stream-ordered calls (MAXSIM_CALL_STREAM_ORDERED, ABI 1.4) on the default stream: the synchronous calls' bits
// after maxsim_synchronize; a non-finite query element leaves NaN scores and -1 argmax and is reported by
// maxsim_synchronize with the synchronous message naming the call (a plugin without synchronize: by the call
// itself), a non-finite score gradient likewise with NaN gradients.
TEST_P(PluginConformance, StreamOrderedCallsMatchSynchronousOnes) {
  const maxsim_memory mem = DeviceMemory();
  if (mem == MAXSIM_MEMORY_HOST) GTEST_SKIP() << GetParam().name << " takes no device memory or has no memory hooks";
  const maxsim_plugin_api* api = nullptr;
  maxsim_plugin_backend* backend = nullptr;
  ASSERT_EQ(maxsim_context_plugin(ctx(), 0, &api, &backend), MAXSIM_OK) << maxsim_last_error();
  const bool defers = MAXSIM_PLUGIN_HAS(api, synchronize);
  std::mt19937_64 rng(78);
  const Case& c = kCases[0];
  TokenSets q = Generate(rng, c.shape, c.nq, 1, c.max_lq, c.dim);
  TokenSets d = Generate(rng, c.shape, c.nd, 1, c.max_ld, c.dim);
  q.Encode(c.dtype);
  d.Encode(c.dtype);
  const uint64_t nq = q.n_sets(), nd = d.n_sets();
  DeviceInputs in(ctx(), q, d, c.dtype, c.dim, mem);
  ASSERT_TRUE(in.ok()) << in.error();
  const maxsim_sets &qs = in.qs, &ds = in.ds;
  const maxsim_dense_sets &rq = in.rq, &rd = in.rd;
  DeviceBuffer o_scores(ctx(), nq * nd * 4), o_argmax(ctx(), nd * q.rows() * 4);
  // The matrix forward with argmax, flags as given; its outputs (host copies) and status.
  auto forward = [&](uint32_t flags, std::vector<float>* scores, std::vector<int32_t>* argmax) {
    maxsim_score_options so;
    maxsim_score_options_init(&so);
    so.flags = flags;
    const maxsim_status st = maxsim_score_matrix(ctx(), &qs, &ds, &so, static_cast<float*>(o_scores.get()),
                                                 static_cast<int32_t*>(o_argmax.get()));
    if (flags && st == MAXSIM_OK) EXPECT_EQ(maxsim_synchronize(ctx()), MAXSIM_OK) << maxsim_last_error();
    scores->resize(nq * nd);
    argmax->resize(nd * q.rows());
    o_scores.Down(scores->data(), scores->size() * 4);
    o_argmax.Down(argmax->data(), argmax->size() * 4);
    return st;
  };
  std::vector<float> s_sync, s_ordered;
  std::vector<int32_t> a_sync, a_ordered;
  ASSERT_EQ(forward(0, &s_sync, &a_sync), MAXSIM_OK) << maxsim_last_error();
  ASSERT_EQ(forward(MAXSIM_CALL_STREAM_ORDERED, &s_ordered, &a_ordered), MAXSIM_OK) << maxsim_last_error();
  ASSERT_EQ(std::memcmp(s_sync.data(), s_ordered.data(), s_sync.size() * 4), 0);
  ASSERT_EQ(a_sync, a_ordered);
  // The backward (deterministic: the same bits; atomic: grad_Q's bits), then a non-finite gradient.
  std::vector<float> grad(nq * nd, 0.5f);
  DeviceBuffer d_grad(ctx(), grad.size() * 4), o_gq(ctx(), q.rows() * c.dim * 4), o_gd(ctx(), d.rows() * c.dim * 4);
  auto backward = [&](int deterministic, uint32_t flags, std::vector<float>* gq, std::vector<float>* gd) {
    d_grad.Up(grad.data(), grad.size() * 4);
    maxsim_backward_args args = MatrixBackwardArgs(o_argmax, d_grad, o_gq, o_gd, deterministic);
    args.flags = flags;
    const maxsim_status st = maxsim_backward(ctx(), &rq, &rd, &args);
    gq->resize(q.rows() * c.dim);
    gd->resize(d.rows() * c.dim);
    o_gq.Down(gq->data(), gq->size() * 4);
    o_gd.Down(gd->data(), gd->size() * 4);
    return st;
  };
  for (int det = 0; det < 2; ++det) {
    std::vector<float> gq0, gd0, gq1, gd1;
    ASSERT_EQ(backward(det, 0, &gq0, &gd0), MAXSIM_OK) << maxsim_last_error();
    ASSERT_EQ(backward(det, MAXSIM_CALL_STREAM_ORDERED, &gq1, &gd1), MAXSIM_OK) << maxsim_last_error();
    ASSERT_EQ(maxsim_synchronize(ctx()), MAXSIM_OK) << maxsim_last_error();
    ASSERT_EQ(std::memcmp(gq0.data(), gq1.data(), gq0.size() * 4), 0) << "grad_Q, deterministic " << det;
    if (det) ASSERT_EQ(std::memcmp(gd0.data(), gd1.data(), gd0.size() * 4), 0) << "grad_D";
  }
  // After the backward's synchronous reference (o_argmax is still the forward's), failures.
  auto after_prefix = [](const std::string& m) { return m.substr(m.find(": ") + 2); };  // "backend NAME: ..."
  grad[3] = INFINITY;
  std::vector<float> gq, gd;
  ASSERT_EQ(backward(1, 0, &gq, &gd), MAXSIM_ERR_NON_FINITE);
  const std::string grad_message = after_prefix(maxsim_last_error());
  const maxsim_status bst = backward(1, MAXSIM_CALL_STREAM_ORDERED, &gq, &gd);
  if (defers) {
    ASSERT_EQ(bst, MAXSIM_OK) << maxsim_last_error();
    ASSERT_EQ(maxsim_synchronize(ctx()), MAXSIM_ERR_NON_FINITE);
    EXPECT_NE(std::string(maxsim_last_error()).find("maxsim_backward (stream-ordered): " + grad_message),
              std::string::npos) << maxsim_last_error();
    for (float v : gq) ASSERT_TRUE(std::isnan(v)) << "a query gradient survived: " << v;
    for (float v : gd) ASSERT_TRUE(std::isnan(v)) << "a document gradient survived: " << v;
  } else {
    ASSERT_EQ(bst, MAXSIM_ERR_NON_FINITE);
  }
  TokenSets bad = q;
  bad.values[(bad.offsets[nq - 1]) * bad.dim + 1] = std::nanf("");
  bad.Encode(c.dtype);
  in.dq.Up(bad.encoded.data(), bad.encoded.size());
  ASSERT_EQ(forward(0, &s_sync, &a_sync), MAXSIM_ERR_NON_FINITE);
  const std::string message = after_prefix(maxsim_last_error());
  maxsim_score_options so;
  maxsim_score_options_init(&so);
  so.flags = MAXSIM_CALL_STREAM_ORDERED;
  const maxsim_status st = maxsim_score_matrix(ctx(), &qs, &ds, &so, static_cast<float*>(o_scores.get()),
                                               static_cast<int32_t*>(o_argmax.get()));
  if (!defers) {
    ASSERT_EQ(st, MAXSIM_ERR_NON_FINITE);
    return;
  }
  ASSERT_EQ(st, MAXSIM_OK) << maxsim_last_error();
  ASSERT_EQ(maxsim_synchronize(ctx()), MAXSIM_ERR_NON_FINITE);
  EXPECT_NE(std::string(maxsim_last_error()).find("maxsim_score_matrix (stream-ordered): " + message),
            std::string::npos) << maxsim_last_error() << " vs " << message;
  o_scores.Down(s_ordered.data(), s_ordered.size() * 4);
  o_argmax.Down(a_ordered.data(), a_ordered.size() * 4);
  for (float v : s_ordered) ASSERT_TRUE(std::isnan(v)) << "a score survived a failed call: " << v;
  for (int32_t v : a_ordered) ASSERT_EQ(v, -1) << "an argmax survived a failed call";
  ASSERT_EQ(maxsim_synchronize(ctx()), MAXSIM_OK) << "reported twice: " << maxsim_last_error();
}

INSTANTIATE_TEST_SUITE_P(Plugins, PluginConformance, ::testing::ValuesIn(Plugins()),
                         [](const ::testing::TestParamInfo<PluginCase>& i) {
                           std::string n = i.param.name;
                           for (char& ch : n) ch = ch == '-' ? '_' : ch;
                           return n;
                         });

}  // namespace
}  // namespace maxsim::test
