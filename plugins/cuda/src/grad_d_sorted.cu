// SPDX-License-Identifier: Apache-2.0
// Deterministic grad_D through an inverse index of the argmax (dot metric):
//   grad_D[j, t] = sum over every (pair p of document j, query token s) whose argmax is t of g[p] * Q[i, s],
// each element one fixed sequence of f32 FMAs in canonical (p, s) order, starting from 0.
// The argmax array lies in (p, s) order (matrix, diagonal and list layouts all address it pair-major), so a
// stable sort of its entries by destination row leaves each row's contributions in canonical order:
//   1. keys: one per argmax entry, the destination row (db + t), or a sentinel past every row for an entry that
//      contributes nothing (-1, masked query or document token); value: query row << 32 | (p - p0);
//   2. CUB's radix sort (stable, its result fixed by the keys alone);
//   3. gather: a warp takes the runs of equal keys that start in its 32 sorted entries and adds each run into its
//      row in order, 128 dims per pass, lanes owning 4 consecutive dims.
// A call's pairs are taken in chunks of consecutive pairs of at most kIndexEntries argmax entries; a chunk adds
// into what the previous chunks left in grad_D (zeroed first), which continues each element's sequence exactly.
#include <cub/device/device_radix_sort.cuh>

#include "device_common.cuh"

namespace mscuda {
namespace {

__global__ void IndexKeysKernel(const BackwardArgs a, GradDIndex x, uint64_t p0, uint64_t p1) {
  const int lane = threadIdx.x & 31;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * (blockDim.x >> 5);
  for (uint64_t p = p0 + static_cast<uint64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5); p < p1;
       p += warps) {
    uint64_t i, j;
    a.pairs.Resolve(p, &i, &j);
    const uint64_t qb = a.q.Begin(i), lq = a.q.End(i) - qb;
    const uint64_t db = a.d.Begin(j), ld = a.d.End(j) - db;
    const int32_t* am = a.pairs.ArgmaxPtr(p, i, j, qb - a.q.Begin(0), lq);
    const uint64_t e0 = static_cast<uint64_t>(am - a.pairs.argmax) - x.entry0;
    for (uint64_t s = lane; s < lq; s += 32) {
      const int32_t t = am[s];
      const bool hit = t >= 0 && static_cast<uint64_t>(t) < ld && a.d.Kept(db + t) && a.q.Kept(qb + s);
      x.keys[e0 + s] = hit ? static_cast<uint32_t>(db + t) : x.sentinel;
      x.vals[e0 + s] = (qb + s) << 32 | (p - p0);
    }
  }
}

constexpr int kRunBatch = 8;  // contributions whose loads are issued together

__global__ void IndexGatherKernel(const BackwardArgs a, const uint32_t* keys, const uint64_t* vals, uint64_t n,
                                  uint32_t sentinel, uint64_t p0) {
  const int lane = threadIdx.x & 31;
  const uint32_t dim = a.q.dim;
  const bool qvec = RowsVec4(a.q.orig, a.q.row_bytes, dim, a.q.dtype);
  const uint64_t windows = (n + 31) / 32;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * (blockDim.x >> 5);
  for (uint64_t w = static_cast<uint64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5); w < windows;
       w += warps) {
    const uint64_t k = w * 32 + lane;
    const uint32_t key = k < n ? keys[k] : sentinel;
    const bool start = key != sentinel && (k == 0 || keys[k - 1] != key);
    unsigned starts = __ballot_sync(kFull, start);
    while (starts) {
      const int l = __ffs(starts) - 1;
      starts &= starts - 1;
      const uint32_t row = __shfl_sync(kFull, key, l);
      const uint64_t kb = w * 32 + l;
      float* out = a.grad_d + static_cast<uint64_t>(row) * dim;
      for (uint32_t c = 0; c < dim; c += 128) {
        const uint32_t k0 = c + lane * 4;
        float acc[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) acc[u] = k0 + u < dim ? out[k0 + u] : 0.0f;
        // The run's entries kRunBatch at a time: every value, grad and query element of a batch is loaded before
        // the first FMA; the FMAs keep the sorted order.
        for (uint64_t e = kb;; e += kRunBatch) {
          float g[kRunBatch], v[kRunBatch][4];
          bool in_run[kRunBatch];
#pragma unroll
          for (int b = 0; b < kRunBatch; ++b) {
            in_run[b] = e + b < n && keys[e + b] == row;
            g[b] = 0.0f;
            if (in_run[b]) {
              const uint64_t val = vals[e + b];
              g[b] = a.grad[p0 + (val & 0xffffffffu)];
              LoadElems4(a.q.orig + (val >> 32) * a.q.row_bytes, k0, dim, a.q.dtype, qvec, v[b]);
            } else {
#pragma unroll
              for (int u = 0; u < 4; ++u) v[b][u] = 0.0f;
            }
          }
#pragma unroll
          for (int b = 0; b < kRunBatch; ++b) {
            if (!in_run[b]) continue;
#pragma unroll
            for (int u = 0; u < 4; ++u) acc[u] = fmaf(g[b], v[b][u], acc[u]);
          }
          if (!in_run[kRunBatch - 1]) break;
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          if (k0 + u < dim) out[k0 + u] = acc[u];
        }
      }
    }
  }
}

unsigned Blocks(uint64_t warps_needed) {
  const uint64_t b = (warps_needed + 7) / 8;
  return static_cast<unsigned>(b == 0 ? 1 : (b > (1u << 16) ? (1u << 16) : b));
}

int KeyBits(uint32_t sentinel) {
  int bits = 1;
  while (bits < 32 && (sentinel >> bits) != 0) ++bits;
  return bits;
}

}  // namespace

cudaError_t GradDIndexTempBytes(uint64_t max_entries, uint32_t sentinel, size_t* bytes) {
  cub::DoubleBuffer<uint32_t> k(nullptr, nullptr);
  cub::DoubleBuffer<uint64_t> v(nullptr, nullptr);
  *bytes = 0;
  return cub::DeviceRadixSort::SortPairs(nullptr, *bytes, k, v, static_cast<int64_t>(max_entries), 0,
                                         KeyBits(sentinel));
}

cudaError_t LaunchGradDIndexed(const BackwardArgs& a, GradDIndex x, uint64_t p0, uint64_t p1, uint64_t n_entries,
                               cudaStream_t stream) {
  if (p1 <= p0 || n_entries == 0) return cudaSuccess;
  IndexKeysKernel<<<Blocks(p1 - p0), 256, 0, stream>>>(a, x, p0, p1);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  cub::DoubleBuffer<uint32_t> k(x.keys, x.keys_alt);
  cub::DoubleBuffer<uint64_t> v(x.vals, x.vals_alt);
  size_t temp = x.temp_bytes;
  e = cub::DeviceRadixSort::SortPairs(x.temp, temp, k, v, static_cast<int64_t>(n_entries), 0, KeyBits(x.sentinel),
                                      stream);
  if (e != cudaSuccess) return e;
  IndexGatherKernel<<<Blocks((n_entries + 31) / 32), 256, 0, stream>>>(a, k.Current(), v.Current(), n_entries,
                                                                       x.sentinel, p0);
  return cudaGetLastError();
}

}  // namespace mscuda
