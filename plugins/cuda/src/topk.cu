// SPDX-License-Identifier: Apache-2.0
// Streaming top-k on the device: the corpus is scored in chunks of documents and each chunk's scores are
// merged into a running list of k keys per query (one block per query: an exact radix select of the k-th
// largest 64-bit key over the running list and the chunk, up to 8 passes of 8 bits, then a compaction). Keys are
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
  __shared__ int s_done;
  const uint64_t i = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31;
  const float* sc = scores + i * stride;
  const unsigned long long* in = running_in + i * k;
  unsigned long long* out = running_out + i * k;
  const uint64_t total = have + n;
  if (tid == 0) s_out = 0;
  if (total <= k) {
    for (uint64_t e = tid; e < total; e += kThreads) out[e] = KeyAt(sc, in, have, doc0, e);
    return;
  }
  unsigned long long prefix = 0, pmask = 0;
  if (tid == 0) {
    s_want = k;
    s_done = 0;
  }
  for (int pass = 0; pass < 8; ++pass) {
    const int shift = 56 - 8 * pass;
    for (int b = tid; b < 256; b += kThreads) hist[b] = 0;
    __syncthreads();
    // The histogram of this byte over the keys that still match the prefix. Lanes of a warp that hit the same
    // bin add once (__match_any_sync): the first passes see nearly all keys in one or two bins (scores of
    // similar magnitude), where one shared atomic per key serialised the whole block.
    for (uint64_t e0 = 0; e0 < total; e0 += kThreads) {
      const uint64_t e = e0 + tid;
      unsigned long long x = 0;
      bool live = e < total;
      if (live) {
        x = KeyAt(sc, in, have, doc0, e);
        live = (x & pmask) == prefix;
      }
      const unsigned active = __ballot_sync(kFull, live);
      if (live) {
        const unsigned bin = static_cast<unsigned>(x >> shift) & 255u;
        const unsigned peers = __match_any_sync(active, bin);
        if (__ffs(peers) - 1 == lane) atomicAdd(&hist[bin], static_cast<unsigned>(__popc(peers)));
      }
    }
    __syncthreads();
    // Warp 0 finds the bin that holds the want-th largest key: lane l owns bins 255 - 8l .. 248 - 8l (from the
    // top), a warp scan gives the keys above each lane's bins, and the one lane whose range holds want picks.
    if (tid < 32) {
      unsigned c[8], sum = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        c[j] = hist[255 - 8 * lane - j];
        sum += c[j];
      }
      unsigned incl = sum;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const unsigned t = __shfl_up_sync(kFull, incl, off);
        if (lane >= off) incl += t;
      }
      const unsigned long long want = s_want, excl = incl - sum;
      if (excl < want && want <= incl) {
        unsigned long long cum = excl;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (cum + c[j] >= want) {
            const unsigned sel = 255u - 8u * lane - j;
            s_want = want - cum;
            s_prefix = prefix | (static_cast<unsigned long long>(sel) << shift);
            // The whole bin is taken: every key with the new prefix is in, so the prefix (lower bytes zero)
            // already separates exactly k keys and the remaining passes are not needed.
            s_done = c[j] == want - cum;
            break;
          }
          cum += c[j];
        }
      }
    }
    __syncthreads();
    prefix = s_prefix;
    pmask |= 255ull << shift;
    if (s_done) break;
  }
  // Exactly k keys are >= kth: the k-th largest key itself after 8 passes, or a prefix below it with no other key
  // in between after an early stop.
  const unsigned long long kth = prefix;
  for (uint64_t e = tid; e < total; e += kThreads) {
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
