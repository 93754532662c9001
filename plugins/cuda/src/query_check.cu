// SPDX-License-Identifier: Apache-2.0
// Host queries onto the device. Small query images travel inside kernel launches (ParamCopyKernel): the launch
// carries the bytes, so the scoring kernel that follows on the stream waits for no copy engine.
// Dense host queries with the cosine metric, on the device (plugin ABI 1.2 query_dense): the value check the CPU
// packer makes (every element finite, L2 norm at most 1e19) and the norms the scoring kernels read, both
// computed as the packer computes them (packing/src/quantize_ref.cc): squares summed in double over 8 lanes, lane = k mod 8 in k order,
// the lanes combined as ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), the norm the nearest f32 of the square
// root. Each square of an f32 value is exact in double, so a fused multiply-add gives the same sums. A dense
// query's cosine scores therefore equal those of the same query packed, bit for bit.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#include "backend.h"
#include "device_common.cuh"
#include "maxsim/packed_format.h"

namespace mscuda {
namespace {

// One launch's parameters: a destination and up to N 16-byte words. The largest (N = 2032: 32,528 bytes in all)
// stays under the 32,764 bytes of parameters a kernel takes from CUDA 12.1 on; smaller sizes keep a small query's
// launch small (the driver copies the whole parameter block). __grid_constant__ keeps them in the constant bank,
// indexed by thread without a copy to local memory.
template <uint32_t N>
struct ParamWords {
  uint4* dst;
  uint64_t n;
  uint4 data[N];
};
constexpr uint32_t kParamVecs = 2032;
static_assert(sizeof(ParamWords<kParamVecs>) <= 32764, "kernel parameters are limited to 32,764 bytes");

template <uint32_t N>
__global__ void __launch_bounds__(256) ParamCopyKernel(const __grid_constant__ ParamWords<N> p) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < p.n) p.dst[i] = p.data[i];
}

// Launches ParamCopyKernel<N> on the parameters at p (n <= N words).
template <uint32_t N>
cudaError_t LaunchParamWords(void* p, uint64_t n, cudaStream_t stream) {
  static_assert(offsetof(ParamWords<N>, data) == sizeof(uint4), "ParamWords: one header word");
  void* args[] = {p};
  return cudaLaunchKernel(reinterpret_cast<const void*>(&ParamCopyKernel<N>), dim3(static_cast<unsigned>((n + 255) / 256)),
                          dim3(256), args, 0, stream);
}

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

uint64_t ParamCopyPieceBytes() { return kParamVecs * sizeof(uint4); }

cudaError_t LaunchParamCopy(std::vector<uint4>& buffer, uint8_t* dst, const uint8_t* src, uint64_t bytes,
                            cudaStream_t stream) {
  if (bytes % sizeof(uint4) != 0 || reinterpret_cast<uintptr_t>(dst) % sizeof(uint4) != 0) return cudaErrorInvalidValue;
  // The parameters are built in `buffer` (grow-only: a call allocates nothing once it has grown): word 0 holds dst
  // and n, the data follow. The launch copies them, so the buffer and src may be reused as soon as it returns.
  buffer.resize(1 + kParamVecs);
  for (uint64_t at = 0; at < bytes; at += ParamCopyPieceBytes()) {
    const uint64_t n = std::min<uint64_t>(kParamVecs, (bytes - at) / sizeof(uint4));
    uint4* p = buffer.data();
    uint4* const to = reinterpret_cast<uint4*>(dst + at);
    std::memcpy(&p[0].x, &to, sizeof(to));
    std::memcpy(&p[0].z, &n, sizeof(n));
    std::memcpy(p + 1, src + at, n * sizeof(uint4));
    const cudaError_t e = n <= 256    ? LaunchParamWords<256>(p, n, stream)
                          : n <= 512  ? LaunchParamWords<512>(p, n, stream)
                          : n <= 1024 ? LaunchParamWords<1024>(p, n, stream)
                                      : LaunchParamWords<kParamVecs>(p, n, stream);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t LaunchQueryCheck(const uint8_t* rows, uint64_t row_bytes, int dtype, uint32_t dim, uint64_t n_rows,
                             float* norms, unsigned int* bad, cudaStream_t stream) {
  if (n_rows == 0) return cudaSuccess;
  const uint64_t blocks = (n_rows * 8 + 255) / 256;
  if (blocks > 0x7fffffffull) return cudaErrorInvalidValue;
  QueryCheckKernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(rows, row_bytes, dtype, dim, n_rows, norms, bad);
  return cudaGetLastError();
}

}  // namespace mscuda
