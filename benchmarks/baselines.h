// SPDX-License-Identifier: Apache-2.0
// In-run baselines for the MaxSim benchmarks: the same scores computed by naive loops, by OpenBLAS sgemm +
// row max, and by oneDNN matmul + row max, reading the very same document rows as the library (the originals
// region of the packed corpus).
#ifndef MAXSIM_BENCHMARKS_BASELINES_H_
#define MAXSIM_BENCHMARKS_BASELINES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace maxsim::bench {

// Row-major f32 document tokens: token row r at rows + r * stride; document j owns rows
// [offsets[j], offsets[j+1]) (contiguous documents, as in a packed corpus).
struct DocsView {
  const float* rows = nullptr;
  uint64_t stride = 0;  // floats between rows (>= dim)
  const uint64_t* offsets = nullptr;
  uint64_t n_docs = 0;
  uint32_t dim = 0;
};

// The textbook loops (a dot product per token pair, running max, sum), OpenMP over documents.
void NaiveScores(const float* q, uint32_t lq, const DocsView& d, int threads, float* scores);

// A GEMM library used as MaxSim: documents are taken in chunks of consecutive documents (~1 MB of
// similarities per chunk, so the result tile stays in L2), C = Q x D_chunk^T by one GEMM call, then the max
// over each document's columns per query row (AVX2 when available), summed per document.
class GemmScorer {
 public:
  virtual ~GemmScorer() = default;
  virtual const char* name() const = 0;
  // Plans chunks and creates whatever the library needs for this shape and thread count (not timed).
  virtual void Prepare(uint32_t lq, const DocsView& d, int threads) = 0;
  // Scores one query [lq, dim] row-major against d (same offsets and n_docs as prepared; rows may differ).
  virtual void Score(const float* q, const DocsView& d, float* scores) = 0;
};

// nullptr (and *why) when this build has no OpenBLAS / oneDNN.
std::unique_ptr<GemmScorer> MakeOpenBlasScorer(std::string* why);
std::unique_ptr<GemmScorer> MakeOneDnnScorer(std::string* why);

}  // namespace maxsim::bench

#endif  // MAXSIM_BENCHMARKS_BASELINES_H_
