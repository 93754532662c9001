// SPDX-License-Identifier: Apache-2.0
#include "baselines.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#ifdef MAXSIM_BENCH_HAVE_OPENBLAS
#include <cblas.h>
#endif
#ifdef MAXSIM_BENCH_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace maxsim::bench {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

float MaxScalar(const float* c, uint64_t n) {
  float m = kNegInf;
  for (uint64_t t = 0; t < n; ++t) m = c[t] > m ? c[t] : m;
  return m;
}

__attribute__((target("avx2"))) float MaxAvx2(const float* c, uint64_t n) {
  __m256 m0 = _mm256_set1_ps(kNegInf), m1 = m0;
  uint64_t t = 0;
  for (; t + 16 <= n; t += 16) {
    m0 = _mm256_max_ps(m0, _mm256_loadu_ps(c + t));
    m1 = _mm256_max_ps(m1, _mm256_loadu_ps(c + t + 8));
  }
  m0 = _mm256_max_ps(m0, m1);
  float lanes[8];
  _mm256_storeu_ps(lanes, m0);
  float m = MaxScalar(c + t, n - t);
  for (float v : lanes) m = v > m ? v : m;
  return m;
}

const bool kHaveAvx2 = __builtin_cpu_supports("avx2");

float RowMax(const float* c, uint64_t n) { return kHaveAvx2 ? MaxAvx2(c, n) : MaxScalar(c, n); }

// Chunks of consecutive documents whose similarity tile (lq x tokens) is about 1 MB.
std::vector<std::pair<uint64_t, uint64_t>> PlanChunks(uint32_t lq, const DocsView& d) {
  const uint64_t budget_tokens = std::max<uint64_t>(1, (1u << 20) / (4ull * lq));
  std::vector<std::pair<uint64_t, uint64_t>> chunks;
  uint64_t j = 0;
  while (j < d.n_docs) {
    uint64_t e = j + 1;
    while (e < d.n_docs && d.offsets[e + 1] - d.offsets[j] <= budget_tokens) ++e;
    chunks.emplace_back(j, e);
    j = e;
  }
  return chunks;
}

// Per document of a chunk: sum over query rows of the max over the document's columns of C [lq, n_cols].
void ReduceChunk(const float* c, uint32_t lq, uint64_t n_cols, const DocsView& d, uint64_t j0, uint64_t j1,
                 int threads, float* scores) {
  const uint64_t base = d.offsets[j0];
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
  for (int64_t jj = static_cast<int64_t>(j0); jj < static_cast<int64_t>(j1); ++jj) {
    const uint64_t j = static_cast<uint64_t>(jj);
    const uint64_t t0 = d.offsets[j] - base, len = d.offsets[j + 1] - d.offsets[j];
    if (len == 0) {
      scores[j] = kNegInf;
      continue;
    }
    float sum = 0;
    for (uint32_t s = 0; s < lq; ++s) sum += RowMax(c + s * n_cols + t0, len);
    scores[j] = sum;
  }
}

#ifdef MAXSIM_BENCH_HAVE_OPENBLAS
class OpenBlasScorer : public GemmScorer {
 public:
  const char* name() const override { return "openblas"; }
  void Prepare(uint32_t lq, const DocsView& d, int threads) override {
    lq_ = lq;
    threads_ = threads;
    chunks_ = PlanChunks(lq, d);
    uint64_t most = 0;
    for (auto [j0, j1] : chunks_) most = std::max(most, d.offsets[j1] - d.offsets[j0]);
    c_.assign(static_cast<size_t>(lq) * most, 0.0f);
    openblas_set_num_threads(threads);
  }
  void Score(const float* q, const DocsView& d, float* scores) override {
    for (auto [j0, j1] : chunks_) {
      const uint64_t n = d.offsets[j1] - d.offsets[j0];
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(lq_), static_cast<int>(n),
                  static_cast<int>(d.dim), 1.0f, q, static_cast<int>(d.dim), d.rows + d.offsets[j0] * d.stride,
                  static_cast<int>(d.stride), 0.0f, c_.data(), static_cast<int>(n));
      ReduceChunk(c_.data(), lq_, n, d, j0, j1, threads_, scores);
    }
  }

 private:
  uint32_t lq_ = 0;
  int threads_ = 1;
  std::vector<std::pair<uint64_t, uint64_t>> chunks_;
  std::vector<float> c_;
};
#endif

#ifdef MAXSIM_BENCH_HAVE_ONEDNN
// oneDNN 2.x matmul: src Q [lq, dim], weights D_chunk^T [dim, n] given as strides {1, stride} over the
// row-major document rows (no copy), dst C [lq, n]. One primitive per distinct chunk width, created in
// Prepare; execution uses OpenMP with `threads` threads.
class OneDnnScorer : public GemmScorer {
 public:
  OneDnnScorer() : eng_(dnnl::engine::kind::cpu, 0), stream_(eng_) {}
  const char* name() const override { return "onednn"; }
  void Prepare(uint32_t lq, const DocsView& d, int threads) override {
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    lq_ = lq;
    threads_ = threads;
    omp_set_num_threads(threads);
    chunks_ = PlanChunks(lq, d);
    prims_.clear();
    uint64_t most = 0;
    for (auto [j0, j1] : chunks_) {
      const uint64_t n = d.offsets[j1] - d.offsets[j0];
      most = std::max(most, n);
      if (prims_.count(n)) continue;
      const auto M = static_cast<dnnl::memory::dim>(lq), K = static_cast<dnnl::memory::dim>(d.dim),
                 N = static_cast<dnnl::memory::dim>(n);
      Prim p;
      p.a_md = dnnl::memory::desc(dims{M, K}, dt::f32, dims{K, 1});
      p.b_md = dnnl::memory::desc(dims{K, N}, dt::f32, dims{1, static_cast<dnnl::memory::dim>(d.stride)});
      p.c_md = dnnl::memory::desc(dims{M, N}, dt::f32, dims{N, 1});
      dnnl::matmul::desc desc(p.a_md, p.b_md, p.c_md);
      p.prim = dnnl::matmul(dnnl::matmul::primitive_desc(desc, eng_));
      prims_.emplace(n, std::move(p));
    }
    c_.assign(static_cast<size_t>(lq) * most, 0.0f);
  }
  void Score(const float* q, const DocsView& d, float* scores) override {
    omp_set_num_threads(threads_);
    for (auto [j0, j1] : chunks_) {
      const uint64_t n = d.offsets[j1] - d.offsets[j0];
      Prim& p = prims_.at(n);
      dnnl::memory a(p.a_md, eng_, const_cast<float*>(q));
      dnnl::memory b(p.b_md, eng_, const_cast<float*>(d.rows + d.offsets[j0] * d.stride));
      dnnl::memory c(p.c_md, eng_, c_.data());
      p.prim.execute(stream_, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
      stream_.wait();
      ReduceChunk(c_.data(), lq_, n, d, j0, j1, threads_, scores);
    }
  }

 private:
  struct Prim {
    dnnl::memory::desc a_md, b_md, c_md;
    dnnl::matmul prim;
  };
  dnnl::engine eng_;
  dnnl::stream stream_;
  uint32_t lq_ = 0;
  int threads_ = 1;
  std::vector<std::pair<uint64_t, uint64_t>> chunks_;
  std::map<uint64_t, Prim> prims_;
  std::vector<float> c_;
};
#endif

}  // namespace

void NaiveScores(const float* q, uint32_t lq, const DocsView& d, int threads, float* scores) {
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
  for (int64_t jj = 0; jj < static_cast<int64_t>(d.n_docs); ++jj) {
    const uint64_t j = static_cast<uint64_t>(jj);
    if (d.offsets[j] == d.offsets[j + 1]) {
      scores[j] = kNegInf;
      continue;
    }
    float total = 0;
    for (uint32_t s = 0; s < lq; ++s) {
      const float* qs = q + static_cast<uint64_t>(s) * d.dim;
      float best = kNegInf;
      for (uint64_t t = d.offsets[j]; t < d.offsets[j + 1]; ++t) {
        const float* dt = d.rows + t * d.stride;
        float dot = 0;
        for (uint32_t k = 0; k < d.dim; ++k) dot += qs[k] * dt[k];
        best = dot > best ? dot : best;
      }
      total += best;
    }
    scores[j] = total;
  }
}

std::unique_ptr<GemmScorer> MakeOpenBlasScorer(std::string* why) {
#ifdef MAXSIM_BENCH_HAVE_OPENBLAS
  (void)why;
  return std::make_unique<OpenBlasScorer>();
#else
  *why = "OpenBLAS was not found at configure time (set MAXSIM_BLAS_DIR and MAXSIM_BLAS_INCLUDE)";
  return nullptr;
#endif
}

std::unique_ptr<GemmScorer> MakeOneDnnScorer(std::string* why) {
#ifdef MAXSIM_BENCH_HAVE_ONEDNN
  try {
    return std::make_unique<OneDnnScorer>();
  } catch (const dnnl::error& e) {
    *why = std::string("oneDNN failed to start: ") + e.what();
    return nullptr;
  }
#else
  *why = "oneDNN was not found at configure time (set MAXSIM_BLAS_DIR and MAXSIM_BLAS_INCLUDE)";
  return nullptr;
#endif
}

}  // namespace maxsim::bench
