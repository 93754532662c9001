// SPDX-License-Identifier: Apache-2.0
// Device helpers on the rows of dense sets shared by the input checks: the set holding a row, and the value check
// of maxsim.h (every element finite, L2 norm at most 1e19) of one row by one warp. Internal to the plugin.
#ifndef MAXSIM_PLUGINS_CUDA_ROW_CHECK_CUH_
#define MAXSIM_PLUGINS_CUDA_ROW_CHECK_CUH_

#include <math.h>

#include "device_common.cuh"

namespace mscuda {

// The set holding row `row` of dense sets (row_base 0: training's views of the caller's tensors, never a chunk's),
// the last i with Begin(i) <= row (sets may be empty).
__device__ __forceinline__ uint64_t SetOfRow(const SetsView& s, uint64_t row) {
  if (s.offsets == nullptr) return s.set_length ? row / s.set_length : 0;
  uint64_t lo = 0, hi = s.n_sets;
  while (hi - lo > 1) {
    const uint64_t mid = (lo + hi) / 2;
    if (s.offsets[mid] <= row) lo = mid; else hi = mid;
  }
  return lo;
}

// Row r of s checked by the calling warp (every lane calls it; the result is the same in every lane): true when
// the row is kept and has a non-finite element or a squared norm above 1e38. *sq gets the squared norm (summed in
// double, in every lane); a masked row is not checked (false, *sq = 0).
__device__ __forceinline__ bool RowFails(const SetsView& s, uint64_t r, int lane, double* sq) {
  *sq = 0.0;
  if (!s.Kept(r)) return false;
  const uint8_t* row = s.orig + r * s.row_bytes;
  double acc = 0.0;
  bool finite = true;
  for (uint32_t k = lane; k < s.dim; k += 32) {
    const float v = LoadElem(row, k, s.dtype);
    finite = finite && isfinite(v);
    acc += static_cast<double>(v) * v;
  }
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(kFull, acc, off);
  finite = __all_sync(kFull, finite);
  *sq = acc;
  return !finite || !(acc <= 1e38);
}

}  // namespace mscuda

#endif  // MAXSIM_PLUGINS_CUDA_ROW_CHECK_CUH_
