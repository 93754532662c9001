// Streaming top-k on the device: the corpus is scored in chunks of documents and each chunk's scores are
// merged into a running list of k keys per query (one block per query: an exact radix select of the k-th
// largest 64-bit key over the running list and the chunk, 8 passes of 8 bits, then a compaction). Keys are
// unique (they carry the document index), so exactly k survive. The full score matrix never exists; the host
// sorts the final k keys per query.
#include "device_common.cuh"

namespace mscuda {
namespace {

constexpr int kThreads = 512;

__device__ __forceinline__ unsigned long long KeyAt(const float* scores, const unsigned long long* run_in,
                                                     uint64_t have, uint64_t doc0, uint64_t e) {
  return e < have ? run_in[e] : PackKey(scores[e - have], static_cast<uint32_t>(doc0 + (e - have)));
}

__global__ void __launch_bounds__(kThreads) TopkMergeKernel(const float* scores, uint64_t stride, uint64_t n,
                                                            uint64_t doc0, const unsigned long long* running_in,
                                                            unsigned long long* running_out, uint64_t have,
                                                            uint64_t k) {
  __shared__ unsigned int hist[256];
  __shared__ unsigned long long s_prefix;
  __shared__ unsigned long long s_want;
  __shared__ unsigned long long s_out;
  const uint64_t i = blockIdx.x;
  const float* sc = scores + i * stride;
  const unsigned long long* in = running_in + i * k;
  unsigned long long* out = running_out + i * k;
  const uint64_t total = have + n;
  if (threadIdx.x == 0) s_out = 0;
  if (total <= k) {
    for (uint64_t e = threadIdx.x; e < total; e += kThreads) out[e] = KeyAt(sc, in, have, doc0, e);
    return;
  }
  unsigned long long prefix = 0, pmask = 0;
  if (threadIdx.x == 0) s_want = k;
  for (int pass = 0; pass < 8; ++pass) {
    const int shift = 56 - 8 * pass;
    for (int b = threadIdx.x; b < 256; b += kThreads) hist[b] = 0;
    __syncthreads();
    for (uint64_t e = threadIdx.x; e < total; e += kThreads) {
      const unsigned long long x = KeyAt(sc, in, have, doc0, e);
      if ((x & pmask) == prefix) atomicAdd(&hist[(x >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned long long want = s_want, cum = 0;
      int sel = 0;
      for (int b = 255; b >= 0; --b) {
        if (cum + hist[b] >= want) {
          sel = b;
          break;
        }
        cum += hist[b];
      }
      s_want = want - cum;
      s_prefix = prefix | (static_cast<unsigned long long>(sel) << shift);
    }
    __syncthreads();
    prefix = s_prefix;
    pmask |= 255ull << shift;
  }
  const unsigned long long kth = prefix;
  for (uint64_t e = threadIdx.x; e < total; e += kThreads) {
    const unsigned long long x = KeyAt(sc, in, have, doc0, e);
    if (x >= kth) out[atomicAdd(&s_out, 1ull)] = x;
  }
}

}  // namespace

cudaError_t LaunchTopkMerge(const float* scores, uint64_t stride, uint64_t n, uint64_t doc0, uint64_t nq,
                            const unsigned long long* running_in, unsigned long long* running_out, uint64_t have,
                            uint64_t k, cudaStream_t stream) {
  if (nq == 0) return cudaSuccess;
  if (nq > 0x7fffffffull) return cudaErrorInvalidConfiguration;
  TopkMergeKernel<<<static_cast<unsigned>(nq), kThreads, 0, stream>>>(scores, stride, n, doc0, running_in,
                                                                     running_out, have, k);
  return cudaGetLastError();
}

}  // namespace mscuda
