// SPDX-License-Identifier: Apache-2.0
// The host's value check of dense host queries (the dot metric; corpus.cc runs it while the device scores): the
// CPU packer's decision for every row, fast. Plain C++ (no CUDA), so that tests/cuda_plugin_host_test.cc checks it
// against the packer on machines without a GPU.
#ifndef MAXSIM_PLUGINS_CUDA_HOST_CHECK_H_
#define MAXSIM_PLUGINS_CUDA_HOST_CHECK_H_

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "half.h"
#include "maxsim/maxsim.h"
#include "maxsim/packed_format.h"

namespace mscuda {
namespace host_check {

// The packer's value check of one row (packing/src/quantize_ref.cc): squares summed in double over 8 lanes,
// lane = k mod 8 in k order, the lanes combined as ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)); accepted
// when the sum is at most 1e38 (a NaN or infinite element makes it NaN or infinite, so this also checks that
// every element is finite).
template <typename T, float (*ToF32)(T)>
bool RowAcceptedExact(const T* v, uint32_t dim) {
  double l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (uint32_t k = 0; k < dim; ++k) {
    const double d = ToF32(v[k]);
    l[k % 8] += d * d;
  }
  const double sq = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
  return sq <= MAXSIM_PACK_MAX_NORM * MAXSIM_PACK_MAX_NORM;
}

// The same decision, fast: the largest magnitude from the elements' bits with the sign cleared (an integer
// maximum, which orders magnitudes and puts infinities and NaNs above every finite value). A row whose elements
// are all finite and at most m in magnitude has a sum of squares at most dim * m^2, and the packer's double sum
// of exact squares stays within a factor 1 + dim * 2^-53 of the true one: at most half of the bound means
// accepted. Only rows between that and a non-finite element take the packer's exact sum.
template <typename T, typename Bits, Bits kAbs, Bits kInf, float (*ToF32)(T)>
bool RowAccepted(const uint8_t* row, uint32_t dim) {
  const Bits* bits = reinterpret_cast<const Bits*>(row);
  Bits m = 0;
  for (uint32_t k = 0; k < dim; ++k) m = std::max<Bits>(m, bits[k] & kAbs);
  if (m >= kInf) return false;
  T top;
  std::memcpy(&top, &m, sizeof(top));
  const double x = ToF32(top);
  if (x * x * dim <= 0.5 * MAXSIM_PACK_MAX_NORM * MAXSIM_PACK_MAX_NORM) return true;
  return RowAcceptedExact<T, ToF32>(reinterpret_cast<const T*>(row), dim);
}

inline float F32Value(float x) { return x; }

}  // namespace host_check

// Whether the packer accepts every one of n_rows rows (row_bytes apart) of dim elements of dtype (maxsim_dtype):
// every element finite and the L2 norm at most 1e19, decided as packing/src/quantize_ref.cc decides it.
inline bool QueryRowsAccepted(const uint8_t* rows, uint64_t row_bytes, int dtype, uint32_t dim, uint64_t n_rows) {
  for (uint64_t r = 0; r < n_rows; ++r) {
    const uint8_t* row = rows + r * row_bytes;
    const bool ok = dtype == MAXSIM_F32
                        ? host_check::RowAccepted<float, uint32_t, 0x7fffffffu, 0x7f800000u, host_check::F32Value>(row, dim)
                    : dtype == MAXSIM_BF16 ? host_check::RowAccepted<uint16_t, uint16_t, 0x7fff, 0x7f80, maxsim::Bf16ToF32>(row, dim)
                                           : host_check::RowAccepted<uint16_t, uint16_t, 0x7fff, 0x7c00, maxsim::F16ToF32>(row, dim);
    if (!ok) return false;
  }
  return true;
}

}  // namespace mscuda

#endif  // MAXSIM_PLUGINS_CUDA_HOST_CHECK_H_
