// SPDX-License-Identifier: Apache-2.0
#include "test_util.h"

#if !defined(__wasi__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>

#include "half.h"
#include "npy.h"

namespace maxsim::test {

void TokenSets::Encode(maxsim_dtype d) {
  dtype = d;
  const size_t n = values.size();
  if (d == MAXSIM_F32) {
    encoded.resize(n * 4);
    if (n > 0) std::memcpy(encoded.data(), values.data(), n * 4);
    return;
  }
  encoded.resize(n * 2);
  auto* out = reinterpret_cast<uint16_t*>(encoded.data());
  for (size_t i = 0; i < n; ++i) {
    out[i] = d == MAXSIM_F16 ? F32ToF16(values[i]) : F32ToBf16(values[i]);
    values[i] = d == MAXSIM_F16 ? F16ToF32(out[i]) : Bf16ToF32(out[i]);
  }
}

BytesBeforeGuardPage::BytesBeforeGuardPage(size_t bytes) : page_(0) {
#if !defined(__wasi__)  // WASI has no page protection: data() stays NULL
  page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  if (bytes > page_) return;
  void* m = mmap(nullptr, 2 * page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return;
  base_ = static_cast<uint8_t*>(m);
  if (mprotect(base_ + page_, page_, PROT_NONE) == 0) data_ = base_ + page_ - bytes;
#else
  (void)bytes;
#endif
}

BytesBeforeGuardPage::~BytesBeforeGuardPage() {
#if !defined(__wasi__)
  if (base_) munmap(base_, 2 * page_);
#endif
}

Context CpuContext(int threads, const char* isa) {
  maxsim_options o;
  maxsim_options_init(&o);
  o.num_threads = threads;
  o.load_plugins = 0;
  o.backend = "cpu";
  o.isa = isa;
  return Context(o);
}

DenseSets TokenSets::Dense() const {
  DenseSets s(encoded.data(), dtype, dim, Span<const uint64_t>(offsets.data(), offsets.size()));
  if (!mask.empty()) s.WithMask(mask.data());
  return s;
}

ScatteredSets::ScatteredSets(const TokenSets& t, uint32_t stride) : t_(&t), stride_(stride ? stride : t.dim) {
  const size_t elem = t.dtype == MAXSIM_F32 ? 4 : 2;
  for (uint64_t i = 0; i < t.n_sets(); ++i) {
    const uint64_t len = t.length(i);
    if (len == 0) {
      ptrs_.push_back(nullptr);
      continue;
    }
    std::vector<uint8_t> block(len * stride_ * elem, 0xA5);  // the gap between rows is garbage, never read
    for (uint64_t r = 0; r < len; ++r) {
      std::memcpy(block.data() + r * stride_ * elem, t.encoded.data() + (t.offsets[i] + r) * t.dim * elem,
                  t.dim * elem);
    }
    blocks_.push_back(std::move(block));
    ptrs_.push_back(blocks_.back().data());
  }
}

DenseSets ScatteredSets::Dense() const {
  DenseSets s = DenseSets::PerSet(ptrs_.data(), t_->dtype, t_->dim,
                                  Span<const uint64_t>(t_->offsets.data(), t_->offsets.size()));
  s.WithRowStride(stride_);
  if (!t_->mask.empty()) s.WithMask(t_->mask.data());
  return s;
}

const char* ShapeName(Shape s) {
  switch (s) {
    case Shape::kGaussian: return "gaussian";
    case Shape::kUnitGaussian: return "unit-gaussian";
    case Shape::kClustered: return "clustered";
    case Shape::kLargeNorm: return "large-norm";
    case Shape::kTinyNorm: return "tiny-norm";
    case Shape::kNearTies: return "near-ties";
    case Shape::kDuplicates: return "duplicates";
  }
  return "?";
}

namespace {
void Normalize(float* v, uint32_t dim, double to = 1.0) {
  double n = 0;
  for (uint32_t k = 0; k < dim; ++k) n += static_cast<double>(v[k]) * v[k];
  n = std::sqrt(n);
  if (n == 0) return;
  for (uint32_t k = 0; k < dim; ++k) v[k] = static_cast<float>(v[k] / n * to);
}
}  // namespace

TokenSets Generate(std::mt19937_64& rng, Shape shape, uint64_t n_sets, uint64_t min_len, uint64_t max_len,
                   uint32_t dim) {
  TokenSets t;
  t.dim = dim;
  t.offsets.push_back(0);
  std::uniform_int_distribution<uint64_t> len(min_len, max_len);
  for (uint64_t i = 0; i < n_sets; ++i) t.offsets.push_back(t.offsets.back() + len(rng));
  const uint64_t rows = t.offsets.back();
  t.values.resize(rows * dim);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  // A few shared directions for clustered / near-tie data.
  std::vector<float> centers(8 * static_cast<size_t>(dim));
  for (float& c : centers) c = g(rng);
  for (int c = 0; c < 8; ++c) Normalize(centers.data() + c * dim, dim);
  for (uint64_t r = 0; r < rows; ++r) {
    float* v = t.values.data() + r * dim;
    switch (shape) {
      case Shape::kGaussian:
        for (uint32_t k = 0; k < dim; ++k) v[k] = g(rng);
        break;
      case Shape::kUnitGaussian:
        for (uint32_t k = 0; k < dim; ++k) v[k] = g(rng);
        Normalize(v, dim);
        break;
      case Shape::kClustered: {
        const float* c = centers.data() + (rng() % 8) * dim;
        for (uint32_t k = 0; k < dim; ++k) v[k] = c[k] + 0.05f * g(rng);
        Normalize(v, dim);
        break;
      }
      case Shape::kLargeNorm:
        for (uint32_t k = 0; k < dim; ++k) v[k] = g(rng);
        Normalize(v, dim, std::pow(10.0, 3.0 + 12.0 * u(rng)));
        break;
      case Shape::kTinyNorm:
        for (uint32_t k = 0; k < dim; ++k) v[k] = g(rng);
        Normalize(v, dim, std::pow(10.0, -17.0 + 5.0 * u(rng)));
        break;
      case Shape::kNearTies: {
        // Two base directions, perturbed at the 1e-6 level: similarities tie to within f32 rounding.
        const float* c = centers.data() + (rng() % 2) * dim;
        for (uint32_t k = 0; k < dim; ++k) v[k] = c[k] * (1.0f + 1e-6f * g(rng));
        break;
      }
      case Shape::kDuplicates: {
        // Every token is one of 3 vectors: exact ties everywhere; the lowest index must win.
        const float* c = centers.data() + (rng() % 3) * dim;
        std::memcpy(v, c, dim * sizeof(float));
        break;
      }
    }
  }
  t.Encode(MAXSIM_F32);
  return t;
}

TokenSets NearTieDocuments(std::mt19937_64& rng, const TokenSets& q, uint64_t n_sets, uint64_t len, double spread) {
  TokenSets t;
  t.dim = q.dim;
  t.offsets.push_back(0);
  for (uint64_t i = 0; i < n_sets; ++i) t.offsets.push_back(t.offsets.back() + len);
  t.values.resize(t.offsets.back() * q.dim);
  std::normal_distribution<double> g(0.0, 1.0);
  const uint64_t qrows = q.rows();
  for (uint64_t r = 0; r < t.offsets.back(); ++r) {
    const float* src = q.row(rng() % std::max<uint64_t>(1, qrows));
    float* v = t.values.data() + r * q.dim;
    for (uint32_t k = 0; k < q.dim; ++k) v[k] = static_cast<float>(src[k] * (1.0 + spread * g(rng)) + spread * 0.1 * g(rng));
  }
  t.Encode(MAXSIM_F32);
  return t;
}

// ---- reference -----------------------------------------------------------------------------------------------

namespace {
constexpr double kU = 0x1p-24;

double Norm(const float* v, uint32_t dim) {
  double n = 0;
  for (uint32_t k = 0; k < dim; ++k) n += static_cast<double>(v[k]) * v[k];
  return std::sqrt(n);
}
// The library treats vectors whose (f32-rounded) norm is below 2^-126 as zero vectors for cosine.
bool CosineDefined(double norm) { return static_cast<float>(norm) >= 0x1p-126f; }
}  // namespace

double RefSim(const TokenSets& q, uint64_t qi, uint64_t s, const TokenSets& d, uint64_t dj, uint64_t t,
              maxsim_metric metric) {
  const float* a = q.row(q.offsets[qi] + s);
  const float* b = d.row(d.offsets[dj] + t);
  double dot = 0;
  for (uint32_t k = 0; k < q.dim; ++k) dot += static_cast<double>(a[k]) * b[k];
  if (metric == MAXSIM_METRIC_DOT) return dot;
  const double na = Norm(a, q.dim), nb = Norm(b, q.dim);
  return CosineDefined(na) && CosineDefined(nb) ? dot / (na * nb) : 0.0;
}

// Tolerance (why): an exact f32 result computes each similarity as a sequential FMA chain, whose error is at
// most gamma_d * sum_k |q_k d_k| (gamma_d = (d+2)u/(1-(d+2)u), u = 2^-24), plus an absolute d * 2^-148 for
// underflow. Cosine adds ~6 roundings relative to the value (two norms, two reciprocals, two products). The max
// over tokens moves by at most the largest such bound, and the final f32 rounding of the sum adds u|score|.
RefPair Reference(const TokenSets& q, uint64_t qi, const TokenSets& d, uint64_t dj, maxsim_metric metric) {
  RefPair r;
  const uint64_t lq = q.length(qi), ld = d.length(dj);
  r.argmax.assign(lq, -1);
  r.token_best.assign(lq, 0.0);
  r.token_tol.assign(lq, 0.0);
  const double dd = q.dim + 2.0;
  const double gamma = dd * kU / (1.0 - dd * kU);
  bool any_doc = false;
  for (uint64_t t = 0; t < ld; ++t) any_doc |= d.kept(d.offsets[dj] + t);
  if (!any_doc) {
    r.score = -std::numeric_limits<double>::infinity();
    return r;
  }
  double sum = 0, tol = 0;
  for (uint64_t s = 0; s < lq; ++s) {
    if (!q.kept(q.offsets[qi] + s)) continue;
    const float* a = q.row(q.offsets[qi] + s);
    const double na = Norm(a, q.dim);
    double best = -std::numeric_limits<double>::infinity();
    double token_tol = 0;
    for (uint64_t t = 0; t < ld; ++t) {
      if (!d.kept(d.offsets[dj] + t)) continue;
      const float* b = d.row(d.offsets[dj] + t);
      double dot = 0, abs_dot = 0;
      for (uint32_t k = 0; k < q.dim; ++k) {
        dot += static_cast<double>(a[k]) * b[k];
        abs_dot += std::fabs(static_cast<double>(a[k]) * b[k]);
      }
      double sim = dot, bound = gamma * abs_dot + q.dim * 0x1p-148;
      if (metric == MAXSIM_METRIC_COSINE) {
        const double nb = Norm(b, q.dim);
        const bool defined = CosineDefined(na) && CosineDefined(nb);
        sim = defined ? dot / (na * nb) : 0.0;
        bound = defined ? bound / (na * nb) + 8 * kU * std::fabs(sim) : 0.0;
      }
      token_tol = std::max(token_tol, bound);
      if (sim > best) {
        best = sim;
        r.argmax[s] = static_cast<int32_t>(t);
      }
    }
    r.token_best[s] = best;
    r.token_tol[s] = token_tol;
    sum += best;
    tol += token_tol;
  }
  r.score = sum;
  r.tolerance = (tol + 2 * kU * std::fabs(sum)) * 1.01 + 1e-300;
  return r;
}

std::string CheckPair(const TokenSets& q, uint64_t qi, const TokenSets& d, uint64_t dj, maxsim_metric metric,
                      float score, const int32_t* argmax) {
  const RefPair ref = Reference(q, qi, d, dj, metric);
  std::ostringstream err;
  if (std::isinf(ref.score)) {
    if (!(std::isinf(score) && score < 0)) err << "empty document must score -inf, got " << score << "; ";
  } else if (!(std::fabs(static_cast<double>(score) - ref.score) <= ref.tolerance)) {
    err << "score " << score << " vs reference " << ref.score << " (|diff| " << std::fabs(score - ref.score)
        << " > tolerance " << ref.tolerance << "); ";
  }
  if (argmax) {
    for (uint64_t s = 0; s < ref.argmax.size(); ++s) {
      const int32_t got = argmax[s], want = ref.argmax[s];
      if (want < 0 || got < 0) {
        if (got != want) err << "token " << s << ": argmax " << got << ", reference " << want << "; ";
        continue;
      }
      if (got == want) continue;
      if (got >= static_cast<int32_t>(d.length(dj)) || !d.kept(d.offsets[dj] + static_cast<uint64_t>(got))) {
        err << "token " << s << ": argmax " << got << " is not a kept document token; ";
        continue;
      }
      // A different token is right only if its true similarity is within rounding of the true maximum.
      const double diff = ref.token_best[s] - RefSim(q, qi, s, d, dj, static_cast<uint64_t>(got), metric);
      if (diff > 2 * ref.token_tol[s]) {
        err << "token " << s << ": argmax " << got << " (sim " << ref.token_best[s] - diff << ") but reference "
            << want << " (sim " << ref.token_best[s] << ") is better by " << diff << " > 2 x " << ref.token_tol[s]
            << "; ";
      }
    }
  }
  return err.str();
}

AlignedBytes::AlignedBytes(size_t size, uint8_t fill) : size_(size) {
  data_ = static_cast<uint8_t*>(std::aligned_alloc(64, (size + 63) / 64 * 64 + 64));
  std::memset(data_, fill, (size + 63) / 64 * 64 + 64);
}
AlignedBytes::AlignedBytes(const std::vector<uint8_t>& bytes) : AlignedBytes(bytes.size()) {
  if (!bytes.empty()) std::memcpy(data_, bytes.data(), bytes.size());
}
AlignedBytes::~AlignedBytes() { std::free(data_); }

// ---- real embeddings ----------------------------------------------------------------------------------------------

std::string SharedDataDir() {
  std::string dir;
  if (const char* e = std::getenv("MAXSIM_SHARED_DIR")) {
    dir = std::string(e) + "/data/colbert-nanofiqa";
  } else {
    dir = std::string(MAXSIM_SOURCE_DIR) + "/../shared/data/colbert-nanofiqa";
  }
  std::FILE* probe = std::fopen((dir + "/docs_tokens.npy").c_str(), "rb");
  if (probe) std::fclose(probe);
  return probe ? dir : "";
}

namespace {
bool LoadSets(const std::string& tokens_path, const std::string& offsets_path, TokenSets* out, std::string* error) {
  npy::Array tokens, offsets;
  std::string e = npy::Read(tokens_path, &tokens);
  if (e.empty()) e = npy::Read(offsets_path, &offsets);
  if (!e.empty()) {
    *error = e;
    return false;
  }
  if (tokens.dtype != npy::Dtype::kF32 || tokens.shape.size() != 2 || offsets.dtype != npy::Dtype::kI64) {
    *error = "unexpected dtype or shape in " + tokens_path;
    return false;
  }
  out->dim = static_cast<uint32_t>(tokens.shape[1]);
  out->values.resize(tokens.count());
  std::memcpy(out->values.data(), tokens.data.data(), tokens.data.size());
  out->offsets.resize(offsets.count());
  std::memcpy(out->offsets.data(), offsets.data.data(), offsets.data.size());
  out->Encode(MAXSIM_F32);
  return true;
}

std::vector<std::string> ReadLines(const std::string& path) {
  std::vector<std::string> lines;
  // stdio rather than <fstream>: the WebAssembly build's libc++ has no file streams.
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return lines;
  std::string line;
  for (int ch; (ch = std::fgetc(f)) != EOF;) {
    if (ch != '\n') {
      line += static_cast<char>(ch);
    } else if (!line.empty()) {
      lines.push_back(line);
      line.clear();
    }
  }
  if (!line.empty()) lines.push_back(line);
  std::fclose(f);
  return lines;
}
}  // namespace

bool LoadNanoFiqa(TokenSets* queries, TokenSets* docs, std::vector<std::string>* query_ids,
                  std::vector<std::string>* doc_ids, std::string* error) {
  const std::string dir = SharedDataDir();
  if (dir.empty()) {
    *error = "../shared/data/colbert-nanofiqa not found (set MAXSIM_SHARED_DIR to the shared folder)";
    return false;
  }
  if (!LoadSets(dir + "/queries_tokens.npy", dir + "/queries_offsets.npy", queries, error)) return false;
  if (!LoadSets(dir + "/docs_tokens.npy", dir + "/docs_offsets.npy", docs, error)) return false;
  if (query_ids) *query_ids = ReadLines(dir + "/queries_ids.txt");
  if (doc_ids) *doc_ids = ReadLines(dir + "/docs_ids.txt");
  return true;
}

void ReferenceGrads(const TokenSets& q, const TokenSets& d, maxsim_layout layout, const std::vector<uint64_t>& off,
                    const std::vector<uint64_t>& cand, const std::vector<int32_t>& argmax,
                    const std::vector<float>& grad, GradRef* gq, GradRef* gd) {
  const uint32_t dim = q.dim;
  auto init = [&](GradRef* g, uint64_t rows) {
    g->value.assign(rows * dim, 0.0);
    g->abs_sum.assign(rows * dim, 0.0);
    g->count.assign(rows * dim, 0);
  };
  init(gq, q.rows());
  init(gd, d.rows());
  uint64_t base = 0;
  for (uint64_t i = 0; i < q.n_sets(); ++i) {
    const uint64_t lq = q.length(i);
    const uint64_t n = layout == MAXSIM_LAYOUT_MATRIX ? d.n_sets() : layout == MAXSIM_LAYOUT_PAIRS ? 1 : off[i + 1] - off[i];
    for (uint64_t c = 0; c < n; ++c) {
      const uint64_t j = layout == MAXSIM_LAYOUT_MATRIX ? c : layout == MAXSIM_LAYOUT_PAIRS ? i : cand[off[i] + c];
      const uint64_t slot = layout == MAXSIM_LAYOUT_MATRIX ? i * d.n_sets() + c : layout == MAXSIM_LAYOUT_PAIRS ? i : off[i] + c;
      const int32_t* am = layout == MAXSIM_LAYOUT_MATRIX ? argmax.data() + d.n_sets() * q.offsets[i] + c * lq
                                                         : argmax.data() + base + c * lq;
      const double g = grad[slot];
      for (uint64_t s = 0; s < lq; ++s) {
        const int32_t t = am[s];
        if (t < 0 || !q.kept(q.offsets[i] + s)) continue;
        const float* qr = q.row(q.offsets[i] + s);
        const float* dr = d.row(d.offsets[j] + t);
        for (uint32_t k = 0; k < dim; ++k) {
          const uint64_t a = (q.offsets[i] + s) * dim + k, b = (d.offsets[j] + t) * dim + k;
          gq->value[a] += g * dr[k];
          gq->abs_sum[a] += std::fabs(g * dr[k]);
          gq->count[a]++;
          gd->value[b] += g * qr[k];
          gd->abs_sum[b] += std::fabs(g * qr[k]);
          gd->count[b]++;
        }
      }
    }
    if (layout != MAXSIM_LAYOUT_MATRIX) base += n * lq;
  }
}

std::string GradMismatch(const GradRef& ref, const std::vector<float>& got, uint64_t lead_rows, uint32_t dim) {
  const uint64_t skip = lead_rows * dim;
  if (got.size() < skip + ref.value.size()) return "gradient output is too short";
  for (uint64_t e = 0; e < skip; ++e) {
    if (got[e] != 0.0f) return "leading row element " + std::to_string(e) + " is not 0";
  }
  for (uint64_t e = 0; e < ref.value.size(); ++e) {
    const double tol = (ref.count[e] + 4.0) * 0x1p-23 * ref.abs_sum[e] + 1e-30;
    if (std::fabs(got[skip + e] - ref.value[e]) > tol) {
      std::ostringstream m;
      m << "element " << e << " got " << got[skip + e] << " want " << ref.value[e] << " (tolerance " << tol << ")";
      return m.str();
    }
  }
  return "";
}

}  // namespace maxsim::test
