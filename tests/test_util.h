// SPDX-License-Identifier: Apache-2.0
// Test data and the float64 reference every kernel and backend is checked against.
#ifndef MAXSIM_TESTS_TEST_UTIL_H_
#define MAXSIM_TESTS_TEST_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "maxsim/maxsim.h"
#include "maxsim/maxsim.hpp"

namespace maxsim::test {

// A CPU context (no plugins) with `threads` threads and kernel `isa` (nullptr: the automatic choice).
Context CpuContext(int threads = 2, const char* isa = nullptr);

// Token sets held as f32 values that are exactly representable in `dtype` (so the f32 reference sees exactly
// what the library sees), plus their encoding in that dtype.
struct TokenSets {
  uint32_t dim = 0;
  maxsim_dtype dtype = MAXSIM_F32;
  std::vector<float> values;       // [rows, dim]
  std::vector<uint64_t> offsets;   // n_sets + 1
  std::vector<uint8_t> mask;       // empty, or one byte per row
  std::vector<uint8_t> encoded;    // values in dtype
  uint64_t n_sets() const { return offsets.empty() ? 0 : offsets.size() - 1; }
  uint64_t rows() const { return offsets.empty() ? 0 : offsets.back(); }
  uint64_t length(uint64_t i) const { return offsets[i + 1] - offsets[i]; }
  const float* row(uint64_t r) const { return values.data() + r * dim; }
  bool kept(uint64_t r) const { return mask.empty() || mask[r] != 0; }
  // Rounds values to dtype and fills `encoded`.
  void Encode(maxsim_dtype d);
  DenseSets Dense() const;
};

// The sets of `t` (its encoded rows and mask) copied into one heap allocation per set, rows `stride` elements
// apart (0: dim), described with per-set row pointers (maxsim_dense_sets.set_data; an empty set gets NULL). Keeps
// a pointer to t's offsets and mask: t must outlive it.
class ScatteredSets {
 public:
  ScatteredSets(const TokenSets& t, uint32_t stride = 0);
  DenseSets Dense() const;
  const void* const* pointers() const { return ptrs_.data(); }

 private:
  const TokenSets* t_;
  uint32_t stride_;
  std::vector<std::vector<uint8_t>> blocks_;
  std::vector<const void*> ptrs_;
};

enum class Shape { kGaussian, kUnitGaussian, kClustered, kLargeNorm, kTinyNorm, kNearTies, kDuplicates };
const char* ShapeName(Shape s);

// n sets with lengths uniform in [min_len, max_len] (0 allowed), dimension dim.
TokenSets Generate(std::mt19937_64& rng, Shape shape, uint64_t n_sets, uint64_t min_len, uint64_t max_len,
                   uint32_t dim);
// Documents built to sit near a query: many document tokens with nearly equal similarity to query tokens.
TokenSets NearTieDocuments(std::mt19937_64& rng, const TokenSets& queries, uint64_t n_sets, uint64_t len,
                           double spread);

// ---- float64 reference ----------------------------------------------------------------------------------

struct RefPair {
  double score = 0;                // -inf for an empty document
  double tolerance = 0;            // how far an f32 exact result may lie from `score` (see reference.cc)
  std::vector<int32_t> argmax;     // per query position (-1 for masked tokens / empty documents)
  std::vector<double> token_best;  // per query position: the float64 max similarity
  std::vector<double> token_tol;   // per query position: the f32 error bound of one similarity
};
RefPair Reference(const TokenSets& q, uint64_t qi, const TokenSets& d, uint64_t dj, maxsim_metric metric);
// float64 similarity of query position s of set qi with document position t of set dj.
double RefSim(const TokenSets& q, uint64_t qi, uint64_t s, const TokenSets& d, uint64_t dj, uint64_t t,
              maxsim_metric metric);

// Checks a library result (score, argmax for this pair) against the reference; returns "" or what is wrong.
std::string CheckPair(const TokenSets& q, uint64_t qi, const TokenSets& d, uint64_t dj, maxsim_metric metric,
                      float score, const int32_t* argmax);

// Reference gradients in double from a forward's argmax (the definition in maxsim.h), with the sums of absolute
// terms for the tolerance. `off`/`cand`: the CANDIDATES layout's lists (unused for MATRIX and PAIRS).
struct GradRef {
  std::vector<double> value, abs_sum;
  std::vector<uint32_t> count;
};
void ReferenceGrads(const TokenSets& q, const TokenSets& d, maxsim_layout layout, const std::vector<uint64_t>& off,
                    const std::vector<uint64_t>& cand, const std::vector<int32_t>& argmax,
                    const std::vector<float>& grad, GradRef* gq, GradRef* gd);
// "" if `got` (lead_rows zero rows, then the rows of `ref`) is within (terms + 4) * 2^-23 * sum|term| of the
// reference everywhere, else the first element that is not.
std::string GradMismatch(const GradRef& ref, const std::vector<float>& got, uint64_t lead_rows, uint32_t dim);

// A 64-byte aligned copy of some bytes (packed buffers must be 64-byte aligned to be opened).
class AlignedBytes {
 public:
  AlignedBytes() = default;
  explicit AlignedBytes(size_t size, uint8_t fill = 0);
  explicit AlignedBytes(const std::vector<uint8_t>& bytes);
  AlignedBytes(const AlignedBytes&) = delete;
  AlignedBytes& operator=(const AlignedBytes&) = delete;
  ~AlignedBytes();
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// `bytes` bytes that end where an inaccessible page begins: a read or write past them faults (what a caller's
// struct built against an older maxsim.h, ending at the edge of its memory, meets).
class BytesBeforeGuardPage {
 public:
  explicit BytesBeforeGuardPage(size_t bytes);
  ~BytesBeforeGuardPage();
  BytesBeforeGuardPage(const BytesBeforeGuardPage&) = delete;
  BytesBeforeGuardPage& operator=(const BytesBeforeGuardPage&) = delete;
  uint8_t* data() const { return data_; }  // NULL when the pages could not be made (always under WASI)

 private:
  size_t page_;
  uint8_t* base_ = nullptr;
  uint8_t* data_ = nullptr;
};

// Indices 0..n-1 ordered by value descending, ties by index ascending (the library's top-k order). std::sort
// with the index as the tie-break instead of std::stable_sort, whose libstdc++ 12 buffer call (the deprecated
// get_temporary_buffer) warned under clang 19.
template <typename V>
std::vector<uint64_t> RankDescending(const V* v, uint64_t n) {
  std::vector<uint64_t> order(n);
  for (uint64_t j = 0; j < n; ++j) order[j] = j;
  std::sort(order.begin(), order.end(), [v](uint64_t a, uint64_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  return order;
}

// ---- real embeddings --------------------------------------------------------------------------------------

// ../shared/data/colbert-nanofiqa next to the source tree (or MAXSIM_SHARED_DIR). "" if absent.
std::string SharedDataDir();
bool LoadNanoFiqa(TokenSets* queries, TokenSets* docs, std::vector<std::string>* query_ids,
                  std::vector<std::string>* doc_ids, std::string* error);

}  // namespace maxsim::test

#endif  // MAXSIM_TESTS_TEST_UTIL_H_
