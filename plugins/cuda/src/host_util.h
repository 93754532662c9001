// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the CUDA plugin's host-code files (backend.cc, corpus.cc, plan.cc, operations.cc,
// training.cc): CUDA error checks, scratch carving, packed-buffer views. Internal to the plugin.
#ifndef MAXSIM_PLUGINS_CUDA_HOST_UTIL_H_
#define MAXSIM_PLUGINS_CUDA_HOST_UTIL_H_

#include <algorithm>
#include <cstdint>

#include "backend.h"

namespace mscuda {

using ull = unsigned long long;

// A failed CUDA call as a Status (out of memory -> MAXSIM_ERR_OUT_OF_MEMORY, else MAXSIM_ERR_PLUGIN with the
// error's name and the call that failed); clears a non-sticky error so that later calls can proceed.
Status CudaFail(cudaError_t e, const char* what);

#define MSC_CUDA(call)                                   \
  do {                                                   \
    const cudaError_t e_ = (call);                       \
    if (e_ != cudaSuccess) return CudaFail(e_, #call);   \
  } while (0)
#define MSC_RETURN(expr)              \
  do {                                \
    Status s_ = (expr);               \
    if (!s_.ok()) return s_;          \
  } while (0)

constexpr uint64_t kAlign = 256;
inline uint64_t RoundUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// Carves one scratch allocation into 256-byte aligned pieces.
class Carver {
 public:
  uint64_t Add(uint64_t bytes) {
    const uint64_t o = size_;
    size_ += RoundUp(bytes == 0 ? 1 : bytes, kAlign);
    return o;
  }
  uint64_t size() const { return size_; }

 private:
  uint64_t size_ = 0;
};

constexpr uint64_t kOutputBudget = 256ull << 20;  // device bytes for one chunk's outputs + partials

// A device view of a packed buffer whose regions are described by `in`, at device address `base`.
SetsView PackedView(const PackedInfo& in, const uint8_t* base);
// How sets [j0, j1) of a packed buffer described by `in` (its rebased offsets on the host in `offsets`, on the device
// at `dev_offsets`) find their rows in a buffer that holds those sets' rows from its start (a streamed corpus's
// chunk): offsets or set_length, row_base, n_sets and n_rows of a view; the caller sets the rest.
SetsView RowsFromChunkStart(const PackedInfo& in, const uint64_t* offsets, const uint64_t* dev_offsets, uint64_t j0,
                            uint64_t j1);

inline uint64_t MaxLen(const uint64_t* offsets, uint64_t n) {
  uint64_t m = 0;
  for (uint64_t i = 0; i < n; ++i) m = std::max(m, offsets[i + 1] - offsets[i]);
  return m;
}

// Copies `bytes` from host memory to device memory through the pinned stage (stream-ordered). The stage is
// reused by the next call only after the stream synchronises.
Status StageUpload(Backend& b, uint64_t& stage_used, void* dst, const void* src, uint64_t bytes,
                   cudaStream_t stream);
// After a call's StageUpload copies (stage_used > 0): records b.staged on the stream and marks it pending, so that
// the next call's StagesFree waits for those copies if this call returns without synchronising.
Status EndStaging(Backend& b, uint64_t stage_used, cudaStream_t stream);

// Builds a resident corpus's per-document-scale codes once (on b.stream, waited for).
Status EnsureDocScaleCodes(Backend& b, const Corpus& c);

}  // namespace mscuda

#endif  // MAXSIM_PLUGINS_CUDA_HOST_UTIL_H_
