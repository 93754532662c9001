// SPDX-License-Identifier: Apache-2.0
// Dense host queries with the cosine metric, on the device (plugin ABI 1.2 query_dense): the value check the CPU
// packer makes (every element finite, L2 norm at most 1e19) and the norms the scoring kernels read, both
// computed as the packer computes them (packing/src/quantize_ref.cc): squares summed in double over 8 lanes, lane = k mod 8 in k order,
// the lanes combined as ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), the norm the nearest f32 of the square
// root. Each square of an f32 value is exact in double, so a fused multiply-add gives the same sums. A dense
// query's cosine scores therefore equal those of the same query packed, bit for bit.
#include "backend.h"
#include "device_common.cuh"
#include "maxsim/packed_format.h"

namespace mscuda {
namespace {

// 8 threads per row (4 rows per warp). Every thread of a warp reaches the shuffles; threads past the last row
// add zeros.
__global__ void QueryCheckKernel(const uint8_t* rows, uint64_t row_bytes, int dtype, uint32_t dim, uint64_t n_rows,
                                 float* norms, unsigned int* bad) {
  const uint64_t r = (static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 3;
  const unsigned lane = threadIdx.x & 7u;
  double sq = 0.0;
  int finite = 1;
  if (r < n_rows) {
    const uint8_t* row = rows + r * row_bytes;
    for (uint32_t k = lane; k < dim; k += 8) {
      const float v = LoadElem(row, k, dtype);
      finite &= isfinite(v) ? 1 : 0;
      const double d = v;
      sq += d * d;
    }
  }
  // Lane j of each group of 8 now holds l_j; combine in the packer's order.
  sq += __shfl_down_sync(0xffffffffu, sq, 4, 8);  // j = 0..3: l_j + l_(j+4)
  sq += __shfl_down_sync(0xffffffffu, sq, 2, 8);  // j = 0: (l0 + l4) + (l2 + l6); j = 1: (l1 + l5) + (l3 + l7)
  sq += __shfl_down_sync(0xffffffffu, sq, 1, 8);  // j = 0: the two halves
  finite &= __shfl_down_sync(0xffffffffu, finite, 4, 8);
  finite &= __shfl_down_sync(0xffffffffu, finite, 2, 8);
  finite &= __shfl_down_sync(0xffffffffu, finite, 1, 8);
  if (lane == 0 && r < n_rows) {
    if (!finite || !(sq <= MAXSIM_PACK_MAX_NORM * MAXSIM_PACK_MAX_NORM)) *reinterpret_cast<volatile unsigned int*>(bad) = 1u;
    if (norms) norms[r] = static_cast<float>(sqrt(sq));
  }
}

}  // namespace

cudaError_t LaunchQueryCheck(const uint8_t* rows, uint64_t row_bytes, int dtype, uint32_t dim, uint64_t n_rows,
                             float* norms, unsigned int* bad, cudaStream_t stream) {
  if (n_rows == 0) return cudaSuccess;
  const uint64_t blocks = (n_rows * 8 + 255) / 256;
  if (blocks > 0x7fffffffull) return cudaErrorInvalidValue;
  QueryCheckKernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(rows, row_bytes, dtype, dim, n_rows, norms, bad);
  return cudaGetLastError();
}

}  // namespace mscuda
