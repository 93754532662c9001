// SPDX-License-Identifier: Apache-2.0
// The settle kernel of a stream-ordered call (deferred.h): the host's synchronisation and flag reads of the
// synchronous path, done on the device in stream order.
#include "deferred.h"
#include "row_check.cuh"

namespace mscuda {
namespace {

constexpr unsigned long long kClear = ~0ull;

__global__ void __launch_bounds__(1024) SettleKernel(const SettleArgs a) {
  volatile DeferredDevice* dv = a.dev;
  const bool gate = dv->gate != 0u;
  unsigned long long f[2] = {dv->flags[0], dv->flags[1]};
  if (!gate && f[0] == kClear && f[1] == kClear) return;  // the good path: nothing fired
  if (gate && a.locate_rows) {
    const int lane = threadIdx.x & 31;
    const uint64_t warps = blockDim.x >> 5;
    for (int side = 0; side < 2; ++side) {
      const SetsView& s = side == 0 ? a.q : a.d;
      const uint64_t end = side == 0 ? a.q_end : a.d_end;
      for (uint64_t r = (side == 0 ? a.q_begin : a.d_begin) + (threadIdx.x >> 5); r < end; r += warps) {
        double sq;
        if (RowFails(s, r, lane, &sq) && lane == 0) atomicMin(&a.dev->flags[side], static_cast<unsigned long long>(r) + 1);
      }
    }
    __syncthreads();
    f[0] = dv->flags[0];
    f[1] = dv->flags[1];
  }
  __syncthreads();  // every thread has read the device words before thread 0 clears them
  if (f[0] != kClear || f[1] != kClear) {
    for (int k = 0; k < 3; ++k) {
      for (uint64_t e = threadIdx.x; e < a.fill_words[k]; e += blockDim.x) a.fill[k][e] = 0xffffffffu;
    }
    if (threadIdx.x == 0) {
      volatile DeferredWords* w = a.words;
      for (int side = 0; side < 2; ++side) {
        w->flags[side] = f[side];
        if (a.name_rows && f[side] != kClear) {
          const SetsView& s = side == 0 ? a.q : a.d;
          const uint64_t row = f[side] - 1, set = SetOfRow(s, row);
          w->set[side] = set;
          w->token[side] = row - s.Begin(set);
        }
      }
      __threadfence_system();
      w->failed = 1u;
    }
  }
  if (threadIdx.x == 0) {
    dv->gate = 0u;
    dv->flags[0] = kClear;
    dv->flags[1] = kClear;
  }
}

}  // namespace

cudaError_t LaunchSettle(const SettleArgs& a, cudaStream_t stream) {
  SettleKernel<<<1, 1024, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace mscuda
