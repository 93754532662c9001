// SPDX-License-Identifier: Apache-2.0
// The CPU scoring engine: validates inputs, prepares queries, materialises documents, runs the selected
// kernel over (query, document block) tasks with OpenMP, and turns per-token maxima into scores.
#ifndef MAXSIM_SRC_ENGINE_H_
#define MAXSIM_SRC_ENGINE_H_

#include <cstdint>
#include <vector>

#include "dense.h"
#include "kernels/kernel.h"
#include "maxsim/maxsim.h"
#include "packed.h"
#include "status.h"

struct maxsim_packed;

namespace maxsim {

// A resolved maxsim_sets: packed (validated view) or dense (checked struct; values not yet checked).
struct SetsRef {
  bool is_packed = false;
  const maxsim_packed* handle = nullptr;          // packed: the handle (device caches key on it)
  const maxsim_dense_sets* dense_src = nullptr;   // dense: the caller's struct (handed to plugins)
  pack::PackedView packed;
  DenseView dense;

  uint64_t n_sets() const { return is_packed ? packed.n_sets : dense.n_sets; }
  uint32_t dim() const { return is_packed ? packed.dim : dense.dim; }
  maxsim_dtype dtype() const { return is_packed ? packed.dtype : dense.dtype; }
  maxsim_memory memory() const { return is_packed ? MAXSIM_MEMORY_HOST : dense.memory; }
  // Token positions of set i (dense: masked rows included).
  uint64_t positions(uint64_t i) const {
    return is_packed ? packed.offsets[i + 1] - packed.offsets[i] : dense.length(i);
  }
};

Status ResolveSets(const maxsim_sets* sets, const char* role, SetsRef* out);

// Work requested of one call.
struct ScoreRequest {
  maxsim_metric metric = MAXSIM_METRIC_DOT;
  maxsim_mode mode = MAXSIM_MODE_EXACT;
};

class Engine {
 public:
  // variant: PreparedQuery::variant for every query set (the context's choice among the kernel's variants).
  // Packing work (quantising dense inputs, widening, validation) runs on the widest Highway target the kernel
  // allows (PackingTargetCap).
  Engine(const KernelInfo* kernel, int variant, int threads)
      : kernel_(kernel), variant_(variant), threads_(threads), row_ops_(pack::RowOpsFor(PackingTargetCap(*kernel))) {}

  Status ScoreMatrix(const SetsRef& q, const SetsRef& d, const ScoreRequest& req, float* scores, int32_t* argmax,
                     maxsim_stats* stats) const;
  // Candidates (pairs are candidates with one document each): query i against candidates[cand_offsets[i]..).
  Status ScoreCandidates(const SetsRef& q, const SetsRef& d, const uint64_t* cand_offsets,
                         const uint64_t* candidates, const ScoreRequest& req, float* scores, int32_t* argmax,
                         maxsim_stats* stats) const;
  Status TopK(const SetsRef& q, const SetsRef& d, uint64_t k, const ScoreRequest& req, float* scores,
              uint64_t* doc_index, uint64_t* ids, maxsim_stats* stats) const;
  Status Backward(const DenseView& q, const DenseView& d, const maxsim_backward_args& args) const;

  const KernelInfo* kernel() const { return kernel_; }
  int threads() const { return threads_; }
  const pack::RowOps& row_ops() const { return row_ops_; }

 private:
  const KernelInfo* kernel_;
  int variant_;
  int threads_;
  pack::RowOps row_ops_;
};

// The value check of dense host sets (every kept row finite with an L2 norm <= 1e19), with the CPU's message
// naming the first bad row (role: "queries", "documents"), on the packing target row_ops.
Status CheckDenseValues(const DenseView& v, const char* role, int threads, const pack::RowOps& row_ops);

// Checks a candidate list against Nq and Nd; total = cand_offsets[Nq].
Status CheckCandidates(const uint64_t* cand_offsets, const uint64_t* candidates, uint64_t nq, uint64_t nd,
                       uint64_t* total);

}  // namespace maxsim

#endif  // MAXSIM_SRC_ENGINE_H_
