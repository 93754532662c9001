// SPDX-License-Identifier: Apache-2.0
// Training backward from the forward's argmax (dot metric):
//   grad_Q[i, s]  = sum over pairs (i, j) of g[i, j] * D[j, argmax[i, j, s]]    (gather: one warp per query row,
//                   pairs in order, f32 FMA: deterministic)
//   grad_D[j, t] += g[i, j] * Q[i, s]  for every (i, s) whose argmax is (j, t)   (scatter), three ways:
//     atomic:        one warp per pair, f32 atomics (vector atomics on sm_90); fast, order not fixed.
//     deterministic: every destination element one fixed sequence of f32 FMAs in (pair, token) order, either
//                    per document in one launch with grad_Q and the check (BackwardDocKernel: matrix and pairs
//                    layouts), or through an inverse index of the argmax sorted by destination row in device
//                    memory (grad_d_sorted.cu: any layout). Both give the same bits.
#include <math.h>

#include "device_common.cuh"
#include "row_check.cuh"

namespace mscuda {
namespace {

// A bad entry: flag[which] keeps the smallest (1 + index) reported, and the host's mapped word (when given) says
// that there is one.
__device__ __forceinline__ void ReportBad(const BackwardArgs& a, int which, unsigned long long index) {
  atomicMin(&a.flag[which], index);
  if (a.bad_host) *reinterpret_cast<volatile unsigned int*>(a.bad_host) = 1u;
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
    if (lane == 0 && !isfinite(a.grad[p])) ReportBad(a, 1, static_cast<unsigned long long>(p) + 1);
    const uint64_t qb = a.q.Begin(i), lq = a.q.End(i) - qb;
    const uint64_t db = a.d.Begin(j), ld = a.d.End(j) - db;
    const int32_t* am = a.pairs.ArgmaxPtr(p, i, j, qb - a.q.Begin(0), lq);
    for (uint64_t s = lane; s < lq; s += 32) {
      const int32_t t = am[s];
      const bool ok = t == -1 || (t >= 0 && static_cast<uint64_t>(t) < ld && a.d.Kept(db + t));
      if (!ok) ReportBad(a, 0, static_cast<unsigned long long>(am - a.pairs.argmax) + s + 1);
    }
  }
}

// grad_Q row r (one warp; lanes own 4 consecutive dims of a 128-dim chunk): the pairs of its query set in order,
// each adding g[p] * D[j, argmax] by one f32 FMA per element, from 0 (deterministic). Lane l resolves pair pc + l of
// each 32 (its argmax, document row and gradient: one memory latency per 32 pairs), then the document elements are
// loaded kGatherBatch pairs at a time before the first FMA of the batch; the FMAs keep the pair order.
template <int kGatherBatch>
__device__ void GradQRow(const BackwardArgs& a, uint64_t r, int lane) {
  const uint32_t dim = a.q.dim;
  float* out = a.grad_q + r * dim;
  if (!a.q.Kept(r)) {
    for (uint32_t k = lane; k < dim; k += 32) out[k] = 0.0f;
    return;
  }
  const uint64_t i = SetOfRow(a.q, r);
  const uint64_t qb = a.q.Begin(i), lq = a.q.End(i) - qb, s = r - qb, o_i = qb - a.q.Begin(0);
  uint64_t p0, p1;
  PairRange(a, i, &p0, &p1);
  const bool vec = RowsVec4(a.d.orig, a.d.row_bytes, dim, a.d.dtype);
  for (uint32_t k0 = 0; k0 < dim; k0 += 128) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (uint64_t pc = p0; pc < p1; pc += 32) {
      unsigned long long my_row = 0;  // 0: the pair adds nothing (argmax -1, or bad: reported by the check)
      float my_g = 0.0f;
      if (pc + lane < p1) {
        const uint64_t p = pc + lane;
        uint64_t ii, j;
        a.pairs.Resolve(p, &ii, &j);
        const int32_t t = a.pairs.ArgmaxPtr(p, i, j, o_i, lq)[s];
        const uint64_t dbj = a.d.Begin(j), ldj = a.d.End(j) - dbj;
        if (t >= 0 && static_cast<uint64_t>(t) < ldj && a.d.Kept(dbj + t)) {
          my_g = a.grad[p];
          my_row = reinterpret_cast<unsigned long long>(a.d.orig + (dbj + t) * a.d.row_bytes);
        }
      }
      const uint32_t n = static_cast<uint32_t>(p1 - pc < 32 ? p1 - pc : 32);
      for (uint32_t b0 = 0; b0 < n; b0 += kGatherBatch) {
        const uint8_t* drow[kGatherBatch];
        float g[kGatherBatch];
#pragma unroll
        for (int b = 0; b < kGatherBatch; ++b) {
          const int src = static_cast<int>(b0) + b;
          const unsigned long long pr = __shfl_sync(kFull, my_row, src & 31);
          g[b] = __shfl_sync(kFull, my_g, src & 31);
          drow[b] = static_cast<uint32_t>(src) < n ? reinterpret_cast<const uint8_t*>(pr) : nullptr;
        }
        float x[kGatherBatch][4];
#pragma unroll
        for (int b = 0; b < kGatherBatch; ++b) {
          if (drow[b] != nullptr) {
            LoadElems4(drow[b], k0 + lane * 4, dim, a.d.dtype, vec, x[b]);
          } else {
#pragma unroll
            for (int u = 0; u < 4; ++u) x[b][u] = 0.0f;
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
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const uint32_t k = k0 + lane * 4 + u;
      if (k < dim) out[k] = acc[u];
    }
  }
}

__global__ void GradQKernel(const BackwardArgs a, uint64_t row_begin, uint64_t row_end) {
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * (blockDim.x >> 5);
  for (uint64_t r = row_begin + static_cast<uint64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
       r < row_end; r += warps) {
    GradQRow<16>(a, r, threadIdx.x & 31);
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
    const bool qvec = RowsVec4(a.q.orig, a.q.row_bytes, dim, a.q.dtype);
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
            float x[4];
            LoadElems4(qrow, k, dim, a.q.dtype, qvec, x);
            atomicAdd(reinterpret_cast<float4*>(out + k), make_float4(g * x[0], g * x[1], g * x[2], g * x[3]));
          }
          continue;
        }
#endif
        for (uint32_t k = lane; k < dim; k += 32) atomicAdd(out + k, g * LoadElem(qrow, k, a.q.dtype));
      }
    }
  }
}

// ---- the per-document backward: grad_Q, grad_D and the check in one launch (matrix and diagonal layouts) ----
// Blocks [0, q_blocks) compute grad_Q rows (GradQRow, a warp per row); every other block takes tasks (document j,
// rows [t0, t0 + kDocRows) of it). A task reads the argmax entries of its document in canonical (pair, token)
// order (matrix: the pairs (i, j) for i = 0, 1, ..., so entry e is query position e; diagonal: the pair (j, j)), in
// chunks of kDocChunk, and sorts each chunk by destination row with a stable counting sort in shared memory:
//   A. warp w takes a contiguous segment of the chunk, 32 entries at a time: the key (row - t0, or kDocRows when
//      the entry adds nothing to these rows), and the key counts of its segment (__match_any_sync: one adder per key);
//   B. each key's start over the chunk, and where each warp's entries of that key begin;
//   C. each warp places its entries again in segment order, ranked among equal keys of the same 32 by lane.
// Each row's contributions then lie in canonical order; a warp per row adds them by f32 FMAs (128 dims per pass,
// lanes owning 4 consecutive dims) onto 0 (first chunk) or onto what the previous chunk left, and writes the row
// once: the chain of the sorted index (grad_d_sorted.cu), bit for bit, with no zeroing pass, no atomics and no
// global index. The first task of each document also checks its entries and its pairs' gradients (the check
// kernel's flags: every pair belongs to one document).
constexpr int kDocRows = 64;  // rows per task (a multiple of 32, at most 255); 32 measured slower
constexpr int kDocWarps = 8;
constexpr uint32_t kDocChunk = 2048;
constexpr int kDocTiles = kDocChunk / (kDocWarps * 32);  // 32-entry tiles of a warp's segment
constexpr int kRowBatch = 8;  // contributions whose loads are issued together

struct DocShared {
  uint8_t key[kDocChunk];
  uint16_t sorted[kDocChunk];            // chunk entries in (row, canonical) order
  uint32_t set[kDocChunk];               // query set of each chunk entry
  uint32_t count[kDocWarps][kDocRows];   // per warp and key: count (A), then where its next entry goes (B, C)
  uint32_t start[kDocRows + 1];          // where each row's contributions begin in `sorted`
};

__device__ void DocTask(const BackwardArgs& a, DocShared& sm, uint64_t j, uint64_t t0, bool report) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint32_t dim = a.q.dim;
  const bool diag = a.pairs.layout == kPairsDiagonal;
  const uint64_t nd = a.pairs.nd, qb0 = a.q.Begin(0);
  const uint64_t db = a.d.Begin(j), ld = a.d.End(j) - db;
  // Entries of this document: query positions [e_base, e_base + n_entries).
  const uint64_t e_base = diag ? a.q.Begin(j) - qb0 : 0;
  const uint64_t n_entries = diag ? a.q.End(j) - a.q.Begin(j) : (a.q.n_sets ? a.q.End(a.q.n_sets - 1) - qb0 : 0);
  if (report) {
    const uint64_t n_q = diag ? 1 : a.q.n_sets;
    for (uint64_t i = threadIdx.x; i < n_q; i += blockDim.x) {
      const uint64_t p = diag ? j : i * nd + j;
      if (!isfinite(a.grad[p])) ReportBad(a, 1, static_cast<unsigned long long>(p) + 1);
    }
  }
  const uint32_t rows = t0 < ld ? static_cast<uint32_t>(ld - t0 < kDocRows ? ld - t0 : kDocRows) : 0;
  const bool qvec = RowsVec4(a.q.orig, a.q.row_bytes, dim, a.q.dtype);
  for (uint64_t c0 = 0; c0 == 0 || c0 < n_entries; c0 += kDocChunk) {
    const uint32_t n = static_cast<uint32_t>(n_entries - c0 < kDocChunk ? n_entries - c0 : kDocChunk);
    for (uint32_t k = threadIdx.x; k < kDocWarps * kDocRows; k += blockDim.x) (&sm.count[0][0])[k] = 0;
    __syncthreads();
    // A. Keys and per-warp counts; the check. The segment's argmax entries are all loaded first.
    const uint32_t seg = (n + kDocWarps * 32 - 1) / (kDocWarps * 32) * 32;
    const uint32_t s0 = warp * seg, s1 = s0 + seg < n ? s0 + seg : n;
    int32_t tok[kDocTiles];
    uint32_t set_of[kDocTiles];
#pragma unroll
    for (int tt = 0; tt < kDocTiles; ++tt) {
      const uint32_t el = s0 + tt * 32 + lane;
      tok[tt] = -1;
      set_of[tt] = 0;
      if (el < s1) {
        const uint64_t row = qb0 + e_base + c0 + el;
        const uint64_t i = diag ? j : SetOfRow(a.q, row);
        const uint64_t qb = a.q.Begin(i);
        set_of[tt] = static_cast<uint32_t>(i);
        tok[tt] = a.pairs.ArgmaxPtr(diag ? j : i * nd + j, i, j, qb - qb0, a.q.End(i) - qb)[row - qb];
      }
    }
#pragma unroll
    for (int tt = 0; tt < kDocTiles; ++tt) {
      const uint32_t el = s0 + tt * 32 + lane;
      if (s0 + tt * 32 >= s1) break;  // warp-uniform
      uint32_t key = kDocRows;
      if (el < s1) {
        const uint64_t row = qb0 + e_base + c0 + el, i = set_of[tt];
        const int32_t t = tok[tt];
        const bool ok = t == -1 || (t >= 0 && static_cast<uint64_t>(t) < ld && a.d.Kept(db + t));
        if (!ok && report) {
          const uint64_t qb = a.q.Begin(i);
          const int32_t* am = a.pairs.ArgmaxPtr(diag ? j : i * nd + j, i, j, qb - qb0, a.q.End(i) - qb);
          ReportBad(a, 0, static_cast<unsigned long long>(am - a.pairs.argmax) + (row - qb) + 1);
        }
        if (ok && t >= 0 && a.q.Kept(row) && static_cast<uint64_t>(t) >= t0 && static_cast<uint64_t>(t) - t0 < rows) {
          key = static_cast<uint32_t>(t - t0);
        }
        sm.key[el] = static_cast<uint8_t>(key);
        sm.set[el] = set_of[tt];
      }
      const unsigned peers = __match_any_sync(kFull, key);
      if (key < kDocRows && lane == __ffs(peers) - 1) sm.count[warp][key] += __popc(peers);
      __syncwarp();
    }
    __syncthreads();
    // B. Starts: warp 0, lane l owning keys kPer * l + u.
    if (warp == 0) {
      constexpr int kPer = kDocRows / 32;  // keys per lane
      uint32_t total[kPer];
#pragma unroll
      for (int u = 0; u < kPer; ++u) {
        const int k = kPer * lane + u;
        uint32_t run = 0;
        for (int w = 0; w < kDocWarps; ++w) {
          const uint32_t c = sm.count[w][k];
          sm.count[w][k] = run;
          run += c;
        }
        total[u] = run;
      }
      uint32_t mine = 0;
#pragma unroll
      for (int u = 0; u < kPer; ++u) mine += total[u];
      uint32_t incl = mine;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const uint32_t o = __shfl_up_sync(kFull, incl, off);
        if (lane >= off) incl += o;
      }
      uint32_t base = incl - mine;
      if (lane == 31) sm.start[kDocRows] = incl;
#pragma unroll
      for (int u = 0; u < kPer; ++u) {
        sm.start[kPer * lane + u] = base;
        for (int w = 0; w < kDocWarps; ++w) sm.count[w][kPer * lane + u] += base;
        base += total[u];
      }
    }
    __syncthreads();
    // C. Stable placement.
    for (uint32_t b = s0; b < s1; b += 32) {
      const uint32_t el = b + lane;
      const uint32_t key = el < s1 ? sm.key[el] : kDocRows;
      const unsigned peers = __match_any_sync(kFull, key);
      if (key < kDocRows) sm.sorted[sm.count[warp][key] + __popc(peers & ((1u << lane) - 1u))] = static_cast<uint16_t>(el);
      __syncwarp();
      if (key < kDocRows && lane == __ffs(peers) - 1) sm.count[warp][key] += __popc(peers);
      __syncwarp();
    }
    __syncthreads();
    // D. A warp per row: its contributions in order, onto 0 or onto the previous chunks' sum.
    for (uint32_t k = warp; k < rows; k += kDocWarps) {
      const uint32_t r0 = sm.start[k], r1 = sm.start[k + 1];
      if (c0 > 0 && r0 == r1) continue;
      float* out = a.grad_d + (db + t0 + k) * dim;
      for (uint32_t kc = 0; kc < dim; kc += 128) {
        const uint32_t k0 = kc + lane * 4;
        float acc[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) acc[u] = c0 > 0 && k0 + u < dim ? out[k0 + u] : 0.0f;
        for (uint32_t e = r0; e < r1; e += kRowBatch) {
          float g[kRowBatch], v[kRowBatch][4];
#pragma unroll
          for (int b = 0; b < kRowBatch; ++b) {
            g[b] = 0.0f;
            if (e + b < r1) {
              const uint32_t el = sm.sorted[e + b];
              const uint64_t i = sm.set[el];
              g[b] = a.grad[diag ? j : i * nd + j];
              LoadElems4(a.q.orig + (qb0 + e_base + c0 + el) * a.q.row_bytes, k0, dim, a.q.dtype, qvec, v[b]);
            } else {
#pragma unroll
              for (int u = 0; u < 4; ++u) v[b][u] = 0.0f;
            }
          }
#pragma unroll
          for (int b = 0; b < kRowBatch; ++b) {
            if (e + b >= r1) break;
#pragma unroll
            for (int u = 0; u < 4; ++u) acc[u] = fmaf(g[b], v[b][u], acc[u]);
          }
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          if (k0 + u < dim) out[k0 + u] = acc[u];
        }
      }
    }
    __syncthreads();  // the next chunk reuses the shared arrays
  }
}

// 3 blocks per SM (80 registers): faster than 2 (121 registers, no spills) on the H100.
__global__ void __launch_bounds__(kDocWarps * 32, 3) BackwardDocKernel(const BackwardArgs a, uint32_t q_blocks,
                                                                      uint64_t q_row_begin, uint64_t q_row_end,
                                                                      uint64_t row_tasks) {
  if (blockIdx.x < q_blocks) {
    const uint64_t warps = static_cast<uint64_t>(q_blocks) * kDocWarps;
    for (uint64_t r = q_row_begin + static_cast<uint64_t>(blockIdx.x) * kDocWarps + (threadIdx.x >> 5); r < q_row_end;
         r += warps) {
      GradQRow<8>(a, r, threadIdx.x & 31);
    }
    return;
  }
  __shared__ DocShared sm;
  const uint64_t n_tasks = a.pairs.nd * row_tasks;
  for (uint64_t task = blockIdx.x - q_blocks; task < n_tasks; task += gridDim.x - q_blocks) {
    const uint64_t j = task / row_tasks, t0 = (task - j * row_tasks) * kDocRows;
    const uint64_t ld = a.d.End(j) - a.d.Begin(j);
    if (t0 > 0 && t0 >= ld) continue;  // a shorter document than the longest (uniform for the block)
    DocTask(a, sm, j, t0, t0 == 0);
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

cudaError_t LaunchBackwardDoc(const BackwardArgs& a, uint64_t q_row_begin, uint64_t q_row_end, uint64_t max_doc_len,
                              cudaStream_t stream) {
  const uint64_t row_tasks = max_doc_len == 0 ? 1 : (max_doc_len + kDocRows - 1) / kDocRows;
  const uint64_t q_rows = a.grad_q != nullptr && q_row_end > q_row_begin ? q_row_end - q_row_begin : 0;
  const unsigned q_blocks = q_rows ? Grid(q_rows, kDocWarps, 1u << 15) : 0;
  const unsigned doc_blocks = a.pairs.nd ? Grid(a.pairs.nd * row_tasks, 1, 1u << 15) : 0;
  if (doc_blocks + q_blocks == 0) return cudaSuccess;
  BackwardDocKernel<<<q_blocks + doc_blocks, kDocWarps * 32, 0, stream>>>(a, q_blocks, q_row_begin, q_row_end, row_tasks);
  return cudaGetLastError();
}

cudaError_t LaunchGradDAtomic(const BackwardArgs& a, cudaStream_t stream) {
  if (a.pairs.n_pairs == 0) return cudaSuccess;
  const int vec4 = a.q.dim % 4 == 0 && reinterpret_cast<uintptr_t>(a.grad_d) % 16 == 0;
  GradDAtomicKernel<<<Grid(a.pairs.n_pairs, 8, 1u << 16), 256, 0, stream>>>(a, vec4);
  return cudaGetLastError();
}

}  // namespace mscuda
