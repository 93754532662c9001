// SPDX-License-Identifier: Apache-2.0
// When a pair's row terms may be added in any order and still give OrderedSum's double (device_common.cuh): the
// rule behind WarpOrderedSum and WarpOrderedSumOf, as host and device functions, so that the plugin's rule tests
// (tests/cuda_rules_test.cc) check it on the host against the chain in token order.
//
// A score is the sum of its terms in token order, in double, from +0.0 (kernels.h). If no term is non-finite and
// the nonzero terms' exponent fields (subnormals counted as 1) lie within hi - lo <= 29 - ceil(log2 n) of each other,
// every sum of any of the n terms is exact in double: each term is a multiple of the smallest ulp among them,
// 2^(lo - 150), and a sum of at most n terms is below n * 2^(hi - 126), so it is an integer multiple of 2^(lo - 150)
// of at most 2^(ceil(log2 n) + hi - lo + 24) <= 2^53, which a double holds. The chain in token order then rounds
// nowhere, nor does any other order of additions, and all give the exact sum; an exact zero is +0.0 in the chain
// (it starts at +0.0 and x + (-x) is +0.0), which a final + 0.0 gives any other order. 24 for 32 terms, 22 for 128.
#ifndef MAXSIM_PLUGINS_CUDA_ORDERED_SUM_H_
#define MAXSIM_PLUGINS_CUDA_ORDERED_SUM_H_

#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

namespace mscuda {

// A term's exponent field for the rule: 0 for +-0 (no constraint), 255 for a non-finite term, else its field with
// subnormals as 1 (the ulp of a subnormal is that of field 1).
__host__ __device__ inline uint32_t OrderedSumField(float v) {
  uint32_t bits;
  memcpy(&bits, &v, 4);
  if ((bits << 1) == 0u) return 0u;
  const uint32_t field = (bits >> 23) & 0xFFu;
  return field > 1u ? field : 1u;
}

// Whether n terms whose nonzero fields' largest is hi and smallest lo (hi 0 and lo 255: no nonzero term) may be
// added in any order (the rule above).
__host__ __device__ inline bool OrderedSumAnyOrder(uint32_t hi, uint32_t lo, uint64_t n) {
  if (hi == 0u && lo == 255u) return true;  // every term zero
  if (hi == 255u) return false;             // a non-finite term
  int log2n = 0;
  while (log2n < 64 && (uint64_t{1} << log2n) < n) ++log2n;
  return static_cast<int>(hi) - static_cast<int>(lo) <= 29 - log2n;
}

}  // namespace mscuda

#endif  // MAXSIM_PLUGINS_CUDA_ORDERED_SUM_H_
