// SPDX-License-Identifier: Apache-2.0
// Training backward from the forward's argmax (dot metric):
//   grad_Q[i, s]  = sum over pairs (i, j) of g[i, j] * D[j, argmax[i, j, s]]    (gather: one warp per query row,
//                   pairs in order, f32 FMA: deterministic)
//   grad_D[j, t] += g[i, j] * Q[i, s]  for every (i, s) whose argmax is (j, t)   (scatter), two ways:
//     atomic:        one warp per pair, f32 atomics (vector atomics on sm_90); fast, order not fixed.
//     deterministic: an inverse index of the argmax sorted by destination row (grad_d_sorted.cu), so every
//                    destination element is one fixed sequence of f32 FMAs in (pair, token) order.
#include <math.h>

#include "device_common.cuh"

namespace mscuda {
namespace {

__device__ __forceinline__ uint64_t SetOfRow(const SetsView& s, uint64_t row) {
  if (s.offsets == nullptr) return s.set_length ? row / s.set_length : 0;
  uint64_t lo = 0, hi = s.n_sets;  // find the last i with offsets[i] <= row (sets may be empty)
  while (hi - lo > 1) {
    const uint64_t mid = (lo + hi) / 2;
    if (s.offsets[mid] <= row) lo = mid; else hi = mid;
  }
  return lo;
}

__device__ __forceinline__ void PairRange(const BackwardArgs& a, uint64_t i, uint64_t* p0, uint64_t* p1) {
  if (a.pairs.layout == kPairsMatrix) {
    *p0 = i * a.pairs.nd;
    *p1 = *p0 + a.pairs.nd;
  } else if (a.pairs.layout == kPairsDiagonal) {
    *p0 = i;
    *p1 = i + 1;
  } else {
    *p0 = a.q_pair_start[i];
    *p1 = a.q_pair_start[i + 1];
  }
}

__global__ void BackwardCheckKernel(const BackwardArgs a) {
  const int lane = threadIdx.x & 31;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * (blockDim.x >> 5);
  for (uint64_t p = static_cast<uint64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
       p < a.pairs.n_pairs; p += warps) {
    uint64_t i, j;
    a.pairs.Resolve(p, &i, &j);
    if (lane == 0 && !isfinite(a.grad[p])) atomicMin(&a.flag[1], static_cast<unsigned long long>(p) + 1);
    const uint64_t qb = a.q.Begin(i), lq = a.q.End(i) - qb;
    const uint64_t db = a.d.Begin(j), ld = a.d.End(j) - db;
    const int32_t* am = a.pairs.ArgmaxPtr(p, i, j, qb - a.q.Begin(0), lq);
    for (uint64_t s = lane; s < lq; s += 32) {
      const int32_t t = am[s];
      const bool ok = t == -1 || (t >= 0 && static_cast<uint64_t>(t) < ld && a.d.Kept(db + t));
      if (!ok) atomicMin(&a.flag[0], static_cast<unsigned long long>(am - a.pairs.argmax) + s + 1);
    }
  }
}

// Pairs whose loads are issued together (grad_Q).
constexpr int kGatherBatch = 8;

// One warp per query row; lanes own 4 consecutive dims of a 128-dim chunk.
__global__ void GradQKernel(const BackwardArgs a, uint64_t row_begin, uint64_t row_end) {
  const int lane = threadIdx.x & 31;
  const uint32_t dim = a.q.dim;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * (blockDim.x >> 5);
  for (uint64_t r = row_begin + static_cast<uint64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
       r < row_end; r += warps) {
    float* out = a.grad_q + r * dim;
    if (!a.q.Kept(r)) {
      for (uint32_t k = lane; k < dim; k += 32) out[k] = 0.0f;
      continue;
    }
    const uint64_t i = SetOfRow(a.q, r);
    const uint64_t qb = a.q.Begin(i), lq = a.q.End(i) - qb, s = r - qb, o_i = qb - a.q.Begin(0);
    uint64_t p0, p1;
    PairRange(a, i, &p0, &p1);
    for (uint32_t k0 = 0; k0 < dim; k0 += 128) {
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      // Pairs in order, kGatherBatch at a time: every argmax and document element of a batch is loaded before
      // the first FMA (one memory latency per batch instead of two per pair); the FMAs keep the pair order.
      for (uint64_t pb = p0; pb < p1; pb += kGatherBatch) {
        const uint8_t* drow[kGatherBatch];
        float g[kGatherBatch];
#pragma unroll
        for (int b = 0; b < kGatherBatch; ++b) {
          drow[b] = nullptr;
          g[b] = 0.0f;
          const uint64_t p = pb + b;
          if (p >= p1) continue;
          uint64_t ii, j;
          a.pairs.Resolve(p, &ii, &j);
          const int32_t t = a.pairs.ArgmaxPtr(p, i, j, o_i, lq)[s];
          const uint64_t dbj = a.d.Begin(j), ldj = a.d.End(j) - dbj;
          if (t < 0 || static_cast<uint64_t>(t) >= ldj || !a.d.Kept(dbj + t)) continue;  // reported by the check
          g[b] = a.grad[p];
          drow[b] = a.d.orig + (dbj + t) * a.d.row_bytes;
        }
        float x[kGatherBatch][4];
#pragma unroll
        for (int b = 0; b < kGatherBatch; ++b) {
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const uint32_t k = k0 + lane * 4 + u;
            x[b][u] = drow[b] != nullptr && k < dim ? LoadElem(drow[b], k, a.d.dtype) : 0.0f;
          }
        }
#pragma unroll
        for (int b = 0; b < kGatherBatch; ++b) {
          if (drow[b] == nullptr) continue;
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const uint32_t k = k0 + lane * 4 + u;
            if (k < dim) acc[u] = fmaf(g[b], x[b][u], acc[u]);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const uint32_t k = k0 + lane * 4 + u;
        if (k < dim) out[k] = acc[u];
      }
    }
  }
}

// One warp per pair: for every query token, scatter g * Q[i, s] into grad_D[j, argmax] with atomics.
__global__ void GradDAtomicKernel(const BackwardArgs a, int vec4) {
  const int lane = threadIdx.x & 31;
  const uint32_t dim = a.q.dim;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * (blockDim.x >> 5);
  for (uint64_t p = static_cast<uint64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
       p < a.pairs.n_pairs; p += warps) {
    uint64_t i, j;
    a.pairs.Resolve(p, &i, &j);
    const uint64_t qb = a.q.Begin(i), lq = a.q.End(i) - qb;
    const uint64_t db = a.d.Begin(j), ld = a.d.End(j) - db;
    const int32_t* am = a.pairs.ArgmaxPtr(p, i, j, qb - a.q.Begin(0), lq);
    const float g = a.grad[p];
    // 32 query tokens at a time: lane l loads token s0 + l's argmax, then the warp scatters the hits in order.
    for (uint64_t s0 = 0; s0 < lq; s0 += 32) {
      const uint64_t sl = s0 + lane;
      const int32_t tv = sl < lq ? am[sl] : -1;
      const bool hit = tv >= 0 && static_cast<uint64_t>(tv) < ld && a.d.Kept(db + tv) && a.q.Kept(qb + sl);
      unsigned mask = __ballot_sync(kFull, hit);
      while (mask) {
        const int l = __ffs(mask) - 1;
        mask &= mask - 1;
        const uint64_t s = s0 + l, t = static_cast<uint64_t>(__shfl_sync(kFull, tv, l));
        const uint8_t* qrow = a.q.orig + (qb + s) * a.q.row_bytes;
        float* out = a.grad_d + (db + t) * dim;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if (vec4) {
          for (uint32_t k = lane * 4; k < dim; k += 128) {
            const float4 v = make_float4(g * LoadElem(qrow, k, a.q.dtype), g * LoadElem(qrow, k + 1, a.q.dtype),
                                         g * LoadElem(qrow, k + 2, a.q.dtype), g * LoadElem(qrow, k + 3, a.q.dtype));
            atomicAdd(reinterpret_cast<float4*>(out + k), v);
          }
          continue;
        }
#endif
        for (uint32_t k = lane; k < dim; k += 32) atomicAdd(out + k, g * LoadElem(qrow, k, a.q.dtype));
      }
    }
  }
}

unsigned Grid(uint64_t items, unsigned per_block, unsigned cap) {
  const uint64_t b = (items + per_block - 1) / per_block;
  return static_cast<unsigned>(b == 0 ? 1 : (b > cap ? cap : b));
}

}  // namespace

cudaError_t LaunchBackwardCheck(const BackwardArgs& a, cudaStream_t stream) {
  if (a.pairs.n_pairs == 0) return cudaSuccess;
  BackwardCheckKernel<<<Grid(a.pairs.n_pairs, 8, 1u << 16), 256, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t LaunchGradQ(const BackwardArgs& a, uint64_t row_begin, uint64_t row_end, cudaStream_t stream) {
  if (row_end <= row_begin) return cudaSuccess;
  GradQKernel<<<Grid(row_end - row_begin, 8, 1u << 16), 256, 0, stream>>>(a, row_begin, row_end);
  return cudaGetLastError();
}

cudaError_t LaunchGradDAtomic(const BackwardArgs& a, cudaStream_t stream) {
  if (a.pairs.n_pairs == 0) return cudaSuccess;
  const int vec4 = a.q.dim % 4 == 0 && reinterpret_cast<uintptr_t>(a.grad_d) % 16 == 0;
  GradDAtomicKernel<<<Grid(a.pairs.n_pairs, 8, 1u << 16), 256, 0, stream>>>(a, vec4);
  return cudaGetLastError();
}

}  // namespace mscuda
