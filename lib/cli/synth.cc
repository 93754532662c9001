// SPDX-License-Identifier: Apache-2.0
// The synthetic ColBERT-like corpus of `demo` and `bench`, and the naive baseline scorer.
#include <algorithm>
#include <cmath>
#include <limits>

#include "cli.h"

namespace maxsim::cli {
namespace {

uint64_t SplitMix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// xoshiro256**: small, fast, and the same sequence on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (uint64_t& w : s_) w = seed = SplitMix(seed);
  }
  uint64_t Next() {
    const uint64_t r = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return r;
  }
  // Uniform in [0, n).
  uint64_t Below(uint64_t n) { return static_cast<uint64_t>((static_cast<unsigned __int128>(Next()) * n) >> 64); }
  // Approximately standard normal: Irwin-Hall sum of four uniforms, rescaled. Uses only + and * so that the
  // corpus is bit-identical everywhere (no libm transcendental whose last bit may differ between systems).
  float Normalish() {
    const uint64_t r = Next();
    float sum = 0;
    for (int i = 0; i < 4; ++i) sum += static_cast<float>((r >> (16 * i)) & 0xFFFF) * (1.0f / 65536.0f);
    return (sum - 2.0f) * 1.7320508f;
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

void Normalize(float* v, uint32_t dim) {
  double n = 0;
  for (uint32_t k = 0; k < dim; ++k) n += static_cast<double>(v[k]) * v[k];
  if (n == 0) return;
  const double inv = 1.0 / std::sqrt(n);
  for (uint32_t k = 0; k < dim; ++k) v[k] = static_cast<float>(v[k] * inv);
}

// Runs fn(begin, end) over [0, n) split into contiguous chunks on up to `threads` threads.
template <typename Fn>
void ParallelChunks(uint64_t n, int threads, Fn fn) {
  threads = static_cast<int>(std::max<uint64_t>(1, std::min<uint64_t>(static_cast<uint64_t>(threads), n)));
  if (threads <= 1) {
    fn(uint64_t{0}, n);
    return;
  }
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    const uint64_t b = n * t / threads, e = n * (t + 1) / threads;
    pool.emplace_back([=] { fn(b, e); });
  }
  for (std::thread& th : pool) th.join();
}

}  // namespace

SynthData MakeSynthetic(const SynthSpec& spec, Progress* progress) {
  SynthData s;
  const uint32_t dim = spec.dim;
  s.dim = dim;
  constexpr float kDocNoise = 0.08f;    // ||noise|| ~ 0.9: a token's cosine with its topic ~ 0.74
  constexpr float kQueryNoise = 0.05f;  // ||noise|| ~ 0.57 around a token of the source document
  constexpr int kTopicsPerDoc = 4;

  std::vector<float> topics(static_cast<size_t>(spec.n_topics) * dim);
  {
    Rng rng(SplitMix(spec.seed ^ 0x746F70696373ull));
    for (float& x : topics) x = rng.Normalish();
    for (uint32_t t = 0; t < spec.n_topics; ++t) Normalize(topics.data() + static_cast<size_t>(t) * dim, dim);
  }
  // Lengths first (one stream), so each document's slice is known before the parallel fill.
  s.doc_offsets.assign(1, 0);
  {
    Rng rng(SplitMix(spec.seed ^ 0x6C656E67746873ull));
    for (uint64_t j = 0; j < spec.n_docs; ++j) {
      const uint64_t len = spec.fixed_len ? spec.max_len : spec.min_len + rng.Below(spec.max_len - spec.min_len + 1);
      s.doc_offsets.push_back(s.doc_offsets.back() + len);
    }
  }
  s.docs.resize(s.doc_offsets.back() * dim);
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ParallelChunks(spec.n_docs, threads, [&](uint64_t begin, uint64_t end) {
    for (uint64_t j = begin; j < end; ++j) {
      Rng rng(SplitMix(spec.seed * 0x100000001B3ull + j));
      uint32_t mine[kTopicsPerDoc];
      for (uint32_t& t : mine) t = static_cast<uint32_t>(rng.Below(spec.n_topics));
      for (uint64_t r = s.doc_offsets[j]; r < s.doc_offsets[j + 1]; ++r) {
        float* v = s.docs.data() + r * dim;
        const float* c = topics.data() + static_cast<size_t>(mine[rng.Below(kTopicsPerDoc)]) * dim;
        for (uint32_t k = 0; k < dim; ++k) v[k] = c[k] + kDocNoise * rng.Normalish();
        Normalize(v, dim);
      }
      if (progress) progress->Add(1);
    }
  });
  Rng qrng(SplitMix(spec.seed ^ 0x71756572696573ull));
  s.query_offsets.assign(1, 0);
  s.queries.resize(spec.n_queries * spec.query_len * dim);
  for (uint64_t i = 0; i < spec.n_queries; ++i) {
    const uint64_t src = qrng.Below(spec.n_docs);
    s.query_source.push_back(src);
    const uint64_t len = s.doc_offsets[src + 1] - s.doc_offsets[src];
    for (uint32_t t = 0; t < spec.query_len; ++t) {
      float* v = s.queries.data() + (i * spec.query_len + t) * dim;
      if (len == 0) {
        for (uint32_t k = 0; k < dim; ++k) v[k] = qrng.Normalish();
      } else {
        const float* d = s.docs.data() + (s.doc_offsets[src] + qrng.Below(len)) * dim;
        for (uint32_t k = 0; k < dim; ++k) v[k] = d[k] + kQueryNoise * qrng.Normalish();
      }
      Normalize(v, dim);
    }
    s.query_offsets.push_back(s.query_offsets.back() + spec.query_len);
  }
  return s;
}

void NaiveScores(const float* q, uint64_t lq, const float* docs, const uint64_t* offsets, uint64_t n_docs,
                 uint32_t dim, int threads, float* scores) {
  ParallelChunks(n_docs, threads, [&](uint64_t begin, uint64_t end) {
    for (uint64_t j = begin; j < end; ++j) {
      const uint64_t first = offsets[j], last = offsets[j + 1];
      if (first == last) {
        scores[j] = -std::numeric_limits<float>::infinity();
        continue;
      }
      float total = 0;
      for (uint64_t s = 0; s < lq; ++s) {
        const float* qs = q + s * dim;
        float best = -std::numeric_limits<float>::infinity();
        for (uint64_t t = first; t < last; ++t) {
          const float* dt = docs + t * dim;
          float dot = 0;
          for (uint32_t k = 0; k < dim; ++k) dot += qs[k] * dt[k];
          if (dot > best) best = dot;
        }
        total += best;
      }
      scores[j] = total;
    }
  });
}

}  // namespace maxsim::cli
