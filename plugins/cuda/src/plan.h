// SPDX-License-Identifier: Apache-2.0
// The forward plan of one call: which kernel runs (exact tensor-core, shared-memory tiled, FFMA, int8 screening,
// wgmma screening), its row groups and partial-result bytes; the argument block of a matrix-layout forward;
// and how a corpus is cut into document chunks (bounded scratch whatever the corpus size).
#ifndef MAXSIM_PLUGINS_CUDA_PLAN_H_
#define MAXSIM_PLUGINS_CUDA_PLAN_H_

#include <cstdint>
#include <vector>

#include "backend.h"

namespace mscuda {

enum class KernelKind { kTc, kTcSmem, kFfma, kScreen, kScreenWgmma };

struct Plan {
  KernelKind kind = KernelKind::kFfma;
  uint32_t rows = kFfmaGroupRows;  // RG
  uint32_t groups = 1;             // G
  bool partials = true;
  uint32_t cand_cap = 0;           // kScreenWgmma: candidate entries per task
  uint64_t max_lq = 0;             // the longest query (LaunchForward: whether the batch kernel takes it)
  bool batch_terms = false;        // the wgmma batch kernel may take the call: room for its per-row terms
  uint64_t PartialBytes(uint64_t n_pairs) const {
    return (partials ? n_pairs * groups * rows * (sizeof(float) + sizeof(int32_t)) : 0) + CandidateBytes(n_pairs) +
           (batch_terms && !partials ? BatchPartialBytes(n_pairs, max_lq) : 0);
  }
  // kScreenWgmma's candidate lists, thresholds and counts (CandidateLists), after the partials.
  uint64_t CandidateBytes(uint64_t n_pairs) const {
    if (kind != KernelKind::kScreenWgmma) return 0;
    return n_pairs * groups * (cand_cap * sizeof(uint4) + kScreenWgmmaRows * sizeof(int32_t) + sizeof(uint32_t)) + 16;
  }
};

// Whether a certified request runs the wgmma screening kernel (plan.cc says when).
bool UseScreenWgmma(const Backend& b, int requested_mode, const DeviceQueries& q, const Corpus& c, int metric,
                    bool argmax);
Plan MakeScreenWgmmaPlan(const Backend& b, uint64_t max_lq);
Plan MakePlan(const Backend& b, const SetsView& q, const SetsView& d, uint64_t max_lq, int mode);

// The arguments of one matrix-layout forward: all nq queries against nd documents (a chunk of a corpus, or all of
// it), scores [nq x nd] at `scores`, argmax (optional) in the matrix layout with nd columns, and the plan's
// partial results at `partials` (PartialBytes(nq * nd) bytes; unused when the plan needs none).
ForwardArgs MatrixForwardArgs(const SetsView& q, const SetsView& d, uint64_t nq, uint64_t nd, int metric, int mode,
                              unsigned long long* counters, float* scores, int32_t* argmax, uint8_t* partials,
                              const Plan& plan);

// Launches the kernels of one forward with the backend's kernel switches (a.part.term/arg must point at
// PartialBytes(n_pairs) when partials). An exact matrix-layout launch of several queries that the wgmma batch
// kernel takes (WgmmaBatchUsable) runs on it instead of the plan's per-pair kernel: the same bits, no partials.
Status LaunchForward(const Backend& b, const Plan& plan, ForwardArgs a, cudaStream_t stream);

// Documents [j0, j1) of a corpus.
struct DocChunk {
  uint64_t j0 = 0, j1 = 0;
};
// At most max_docs documents per chunk; a streamed corpus's chunks also hold at most cap_bytes of rows of
// row_bytes_streamed bytes.
std::vector<DocChunk> MakeChunks(const Corpus& c, uint64_t max_docs, uint64_t row_bytes_streamed, uint64_t cap_bytes);
// Bytes per row a streamed chunk copies (originals, metadata, and codes when screening).
uint64_t StreamedRowBytes(const Corpus& c, bool need_codes);
// Queries and corpus of the same dimension.
Status CheckPair(const PackedInfo& q, const Corpus& c);

}  // namespace mscuda

#endif  // MAXSIM_PLUGINS_CUDA_PLAN_H_
