// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the GPU benchmarks (gpu_bench.cc, multi_gpu_bench.cc): f32 -> bf16 rounding, the descriptor of
// uniform bf16 sets, medians.
#ifndef MAXSIM_BENCHMARKS_GPU_BENCH_UTIL_H_
#define MAXSIM_BENCHMARKS_GPU_BENCH_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "maxsim/maxsim.h"

namespace gpu_bench_util {

// Round to nearest even (the inputs are finite).
inline uint16_t ToBf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}

// n_sets sets of `len` bf16 rows of `dim` at `data` (row-major, no offsets, no mask) in `memory`.
inline maxsim_dense_sets DenseSets(const void* data, maxsim_memory memory, uint64_t n_sets, uint64_t len, uint32_t dim) {
  maxsim_dense_sets s{};
  s.struct_size = sizeof(s);
  s.memory = memory;
  s.data = data;
  s.dtype = MAXSIM_BF16;
  s.dim = dim;
  s.n_sets = n_sets;
  s.set_length = len;
  return s;
}

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace gpu_bench_util

#endif  // MAXSIM_BENCHMARKS_GPU_BENCH_UTIL_H_
