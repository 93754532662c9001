// Certified i8 screening and the approximate mode on int8 tensor cores (mma.sync m16n8k32, exact s32 dots).
//
// One warp per (pair, group of 16*MT query rows), query codes in registers as A fragments, document codes
// streamed into B fragments in the 64-byte-chunk k order of device_common.cuh, 32 tokens per step.
//   pass 1: A_j = fl(fl(float(I_j) * s_d) * s_q) (times inv|d| for cosine) and its margin m_j per element;
//           per row L = max_j (A_j - m_j) (certified) or the i8 argmax (approximate; ties to the lower index).
//   pass 2 (certified): every j with A_j + m_j >= L is a candidate (it may hold the exact maximum); candidates
//           go to a per-warp list in shared memory.
//   refine: each candidate's similarity is computed with exactly the arithmetic of the exact kernels
//           (16-bit: the same mma.sync chain over the same k order, one candidate per row of the tile and the
//           diagonal of the 16x8 result kept; f32: the canonical FMA chain), and folded into a per-row
//           (value, lowest index) key with a shared-memory atomicMax. So CERTIFIED == EXACT bit for bit.
// The margin is the CPU's (screening.h) with the f32 rounding term gamma_dim ||q|| ||d|| multiplied by
// kTcGammaFactor when the similarity comes from tensor cores (their f32 accumulation may truncate), which
// bounds |computed - true| for the exact kernel's own arithmetic.
#include <math.h>

#include "forward_common.cuh"

namespace mscuda {
namespace {

constexpr int kWarps = 8;
constexpr int kTiles = 4;
constexpr int kCap = 512;  // candidate list entries per warp; flushed (refined) whenever a tile might overflow it
constexpr float kTcGammaFactor = 4.0f;

struct MetaF {
  float scale, norm, resid;
};

__device__ __forceinline__ MetaF LoadMeta(const maxsim_vector_meta* m, uint64_t row) {
  const float4 v = __ldg(reinterpret_cast<const float4*>(m + row));
  return MetaF{v.x, v.y, v.z};
}

struct ScreenConsts {
  float gamma, slack;
};

// Approximation key and margin of one element (screening.h: ScreenMargin).
__device__ __forceinline__ void KeyMargin(int dot, const MetaF& q, const MetaF& d, bool cosine,
                                          const ScreenConsts& c, float* ak, float* m) {
  const float a = static_cast<float>(dot) * d.scale * q.scale;
  const float w = cosine ? InvNorm(d.norm) : 1.0f;
  const float k = cosine ? a * w : a;
  const float eps = q.resid * (d.norm + d.resid) + q.norm * d.resid;
  const float fp = c.gamma * q.norm * d.norm;
  *ak = k;
  *m = (eps + fp) * w * (1.0f + 0x1p-20f) + fabsf(k) * 0x1p-21f + c.slack;
}

struct WarpLists {
  uint32_t tok[kCap];
  unsigned long long best[32];
  uint32_t count_per_row[32];
  uint8_t row[kCap];
};

// Refines list entries [0, n) and folds them into best[]. RT: 0 = f32 FMA chain, else the 16-bit type.
template <typename RT>
__device__ void Refine(const ForwardArgs& a, uint64_t qb, uint32_t r0, uint64_t db, WarpLists& L, int n) {
  const int lane = threadIdx.x & 31;
  const uint32_t dim = a.q.dim;
  if constexpr (sizeof(RT) == 4) {
    for (int b = 0; b < n; b += 32) {
      const int e = b + lane;
      if (e < n) {
        const uint32_t row = L.row[e], tok = L.tok[e];
        const uint8_t* qr = a.q.orig + (qb + r0 + row) * a.q.row_bytes;
        const uint8_t* dr = a.d.orig + (db + tok) * a.d.row_bytes;
        float acc = 0.0f;
        for (uint32_t k = 0; k < dim; ++k) acc = fmaf(LoadElem(qr, k, a.q.dtype), LoadElem(dr, k, a.d.dtype), acc);
        const float key = a.cosine ? acc * InvNorm(a.d.meta[db + tok].norm) : acc;
        atomicMax(&L.best[row], PackKey(key, tok));
      }
    }
  } else {
    const int g = lane >> 2, t = lane & 3;
    const uint32_t nchunks = (dim + 31) / 32;
    for (int b = 0; b < n; b += 8) {
      const int e = b + g;
      const bool valid = e < n;
      const uint32_t row = valid ? L.row[e] : 0, tok = valid ? L.tok[e] : 0;
      const uint8_t* qr = a.q.orig + (qb + r0 + row) * a.q.row_bytes;
      const uint8_t* dr = a.d.orig + (db + tok) * a.d.row_bytes;
      float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (uint32_t ch = 0; ch < nchunks; ++ch) {
        const uint32_t off = 32 * ch + 8 * t;
        const uint4 qa = (valid && off < dim) ? Ld16(qr + off * 2) : Zero4();
        const uint4 bv = (valid && off < dim) ? Ld16(dr + off * 2) : Zero4();
        MmaChunk16<RT>(c, qa, Zero4(), bv);
      }
      if (valid && t == (g >> 1)) {
        const float e_sim = (g & 1) ? c[1] : c[0];
        const float key = a.cosine ? e_sim * InvNorm(a.d.meta[db + tok].norm) : e_sim;
        atomicMax(&L.best[row], PackKey(key, tok));
      }
    }
  }
  __syncwarp();
}

// Appends (row, token) for every lane whose pred holds; count is warp-uniform.
__device__ __forceinline__ void Push(WarpLists& L, int& count, bool pred, uint32_t row, uint32_t tok) {
  const unsigned mask = __ballot_sync(kFull, pred);
  if (pred) {
    const int pos = count + __popc(mask & ((1u << (threadIdx.x & 31)) - 1u));
    L.row[pos] = static_cast<uint8_t>(row);
    L.tok[pos] = tok;
    atomicAdd(&L.count_per_row[row], 1u);
  }
  count += __popc(mask);
}

template <typename RT, int MT, int CC>
__global__ void __launch_bounds__(kWarps * 32, 1) ScreenKernel(const ForwardArgs a, ScreenConsts consts) {
  __shared__ WarpLists lists[kWarps];
  __shared__ float s_term[kWarps][MT * 16];
  __shared__ int s_arg[kWarps][MT * 16];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const uint32_t G = a.part.groups;
  const uint64_t task = static_cast<uint64_t>(blockIdx.x) * kWarps + warp;
  if (task >= a.pairs.n_pairs * G) return;
  const uint64_t p = task / G;
  const uint32_t grp = static_cast<uint32_t>(task - p * G);
  uint64_t qi, dj;
  a.pairs.Resolve(p, &qi, &dj);
  const uint64_t qb = a.q.Begin(qi), lq = a.q.End(qi) - qb;
  const uint64_t db = a.d.Begin(dj), ld = a.d.End(dj) - db;
  const uint32_t r0 = grp * MT * 16;
  if (grp > 0 && r0 >= lq) return;
  WarpLists& L = lists[warp];
  for (int r = lane; r < 32; r += 32) {
    L.best[r] = 0ull;
    L.count_per_row[r] = 0u;
  }
  __syncwarp();
  const bool cosine = a.cosine != 0;
  const bool certified = a.mode == 1;
  const uint32_t cb = a.q.code_bytes;
  const uint32_t nchunks = cb / 64;
  const int8_t* qcodes = a.q.codes + qb * cb;
  const int8_t* dcodes = a.d.codes + db * cb;

  // Query rows of this lane: (mt, h) -> row r0 + mt*16 + g + 8h.
  MetaF qm[MT][2];
  bool rv[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint64_t r = r0 + mt * 16 + g + 8 * h;
      rv[mt][h] = r < lq;
      qm[mt][h] = rv[mt][h] ? LoadMeta(a.q.meta, qb + r) : MetaF{0.0f, 0.0f, 0.0f};
    }
  }
  constexpr int KCR = CC > 0 ? CC : 1;
  uint4 qa[MT][KCR], qc[MT][KCR];
  if constexpr (CC > 0) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const uint64_t ra = r0 + mt * 16 + g, rb = ra + 8;
#pragma unroll
      for (int c = 0; c < CC; ++c) {
        qa[mt][c] = ra < lq ? Ld16(qcodes + ra * cb + 64 * c + 16 * t) : Zero4();
        qc[mt][c] = rb < lq ? Ld16(qcodes + rb * cb + 64 * c + 16 * t) : Zero4();
      }
    }
  }
  // Integer dots of one step (4 tiles of 8 tokens) for every m tile.
  auto dots = [&](uint64_t base, int (&acc)[kTiles][MT][4]) {
#pragma unroll
    for (int u = 0; u < kTiles; ++u) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) acc[u][mt][0] = acc[u][mt][1] = acc[u][mt][2] = acc[u][mt][3] = 0;
    }
    if constexpr (CC > 0) {
      uint4 bv[kTiles][CC];
#pragma unroll
      for (int u = 0; u < kTiles; ++u) {
        const uint64_t n = base + u * 8 + g;
#pragma unroll
        for (int c = 0; c < CC; ++c) bv[u][c] = n < ld ? Ld16(dcodes + n * cb + 64 * c + 16 * t) : Zero4();
      }
#pragma unroll
      for (int u = 0; u < kTiles; ++u) {
#pragma unroll
        for (int c = 0; c < CC; ++c) {
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) MmaChunkI8(acc[u][mt], qa[mt][c], qc[mt][c], bv[u][c]);
        }
      }
    } else {
      for (uint32_t c = 0; c < nchunks; ++c) {
        uint4 xa[MT], xc[MT], bv[kTiles];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const uint64_t ra = r0 + mt * 16 + g, rb = ra + 8;
          xa[mt] = ra < lq ? Ld16(qcodes + ra * cb + 64 * c + 16 * t) : Zero4();
          xc[mt] = rb < lq ? Ld16(qcodes + rb * cb + 64 * c + 16 * t) : Zero4();
        }
#pragma unroll
        for (int u = 0; u < kTiles; ++u) {
          const uint64_t n = base + u * 8 + g;
          bv[u] = n < ld ? Ld16(dcodes + n * cb + 64 * c + 16 * t) : Zero4();
        }
#pragma unroll
        for (int u = 0; u < kTiles; ++u) {
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) MmaChunkI8(acc[u][mt], xa[mt], xc[mt], bv[u]);
        }
      }
    }
  };

  float lower[MT][2], top[MT][2];
  int topi[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      lower[mt][h] = -INFINITY;
      top[mt][h] = -INFINITY;
      topi[mt][h] = -1;
    }
  }
  // pass 1
  for (uint64_t base = 0; base < ld; base += 32) {
    int acc[kTiles][MT][4];
    dots(base, acc);
#pragma unroll
    for (int u = 0; u < kTiles; ++u) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const uint64_t n = base + u * 8 + 2 * t + e;
        if (n >= ld) continue;
        const MetaF dm = LoadMeta(a.d.meta, db + n);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float ak, m;
            KeyMargin(acc[u][mt][2 * h + e], qm[mt][h], dm, cosine, consts, &ak, &m);
            lower[mt][h] = fmaxf(lower[mt][h], ak - m);
            if (ak > top[mt][h]) {
              top[mt][h] = ak;
              topi[mt][h] = static_cast<int>(n);
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      lower[mt][h] = fmaxf(lower[mt][h], __shfl_xor_sync(kFull, lower[mt][h], 1));
      lower[mt][h] = fmaxf(lower[mt][h], __shfl_xor_sync(kFull, lower[mt][h], 2));
      MergeBest(top[mt][h], topi[mt][h], 1);
      MergeBest(top[mt][h], topi[mt][h], 2);
    }
  }
  int count = 0;
  uint64_t refined = 0;
  auto flush = [&]() {
    if (count == 0) return;
    __syncwarp();
    Refine<RT>(a, qb, r0, db, L, count);
    refined += static_cast<uint64_t>(count);
    count = 0;
  };
  if (certified) {
    // pass 2: candidates
    for (uint64_t base = 0; base < ld; base += 32) {
      int acc[kTiles][MT][4];
      dots(base, acc);
#pragma unroll
      for (int u = 0; u < kTiles; ++u) {
        if (count > kCap - 32 * 8) flush();
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const uint64_t n = base + u * 8 + 2 * t + e;
          const bool nv = n < ld;
          const MetaF dm = nv ? LoadMeta(a.d.meta, db + n) : MetaF{0.0f, 0.0f, 0.0f};
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              float ak, m;
              KeyMargin(acc[u][mt][2 * h + e], qm[mt][h], dm, cosine, consts, &ak, &m);
              const bool pred = nv && rv[mt][h] && ak + m >= lower[mt][h];
              Push(L, count, pred, mt * 16 + g + 8 * h, static_cast<uint32_t>(n));
            }
          }
        }
      }
    }
  } else {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const bool pred = t == 0 && rv[mt][h] && topi[mt][h] >= 0;
        Push(L, count, pred, mt * 16 + g + 8 * h, static_cast<uint32_t>(topi[mt][h] < 0 ? 0 : topi[mt][h]));
      }
    }
  }
  flush();
  __syncwarp();
  if (a.counters && certified) {
    uint32_t multi = 0;
    for (int r = lane; r < MT * 16; r += 32) multi += L.count_per_row[r] > 1 ? 1u : 0u;
    for (int off = 16; off > 0; off >>= 1) multi += __shfl_xor_sync(kFull, multi, off);
    if (lane == 0) {
      atomicAdd(&a.counters[0], static_cast<unsigned long long>(refined));
      atomicAdd(&a.counters[1], static_cast<unsigned long long>(multi));
    }
  } else if (a.counters && lane == 0) {
    atomicAdd(&a.counters[0], static_cast<unsigned long long>(refined));
  }
  Best<MT> best;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const unsigned long long k = L.best[mt * 16 + g + 8 * h];
      best.v[mt][h] = k ? KeyValue(k) : -INFINITY;
      best.i[mt][h] = k ? static_cast<int>(KeyIndex(k)) : -1;
    }
  }
  WriteRows<MT>(a, p, qi, dj, grp, qb, lq, ld > 0, best, s_term[warp], s_arg[warp]);
}

template <typename RT, int MT>
cudaError_t LaunchMt(const ForwardArgs& a, ScreenConsts c, cudaStream_t stream) {
  const uint64_t tasks = a.pairs.n_pairs * a.part.groups;
  const uint64_t blocks = (tasks + kWarps - 1) / kWarps;
  if (blocks == 0) return cudaSuccess;
  if (blocks > 0x7fffffffull) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(blocks)), block(kWarps * 32);
  switch (a.q.code_bytes / 64) {
    case 1: ScreenKernel<RT, MT, 1><<<grid, block, 0, stream>>>(a, c); break;
    case 2: ScreenKernel<RT, MT, 2><<<grid, block, 0, stream>>>(a, c); break;
    default: ScreenKernel<RT, MT, 0><<<grid, block, 0, stream>>>(a, c); break;
  }
  return cudaGetLastError();
}

template <typename RT>
cudaError_t LaunchRt(const ForwardArgs& a, ScreenConsts c, cudaStream_t stream) {
  return a.part.group_rows == 16 ? LaunchMt<RT, 1>(a, c, stream) : LaunchMt<RT, 2>(a, c, stream);
}

}  // namespace

uint32_t ScreenGroupRows(uint64_t max_lq) { return max_lq <= 16 ? 16 : 32; }

cudaError_t LaunchScreen(const ForwardArgs& a, cudaStream_t stream) {
  const bool tc = TcSupported(a.q, a.d);
  const double g = (a.q.dim + 2.0) * 0x1p-24;
  ScreenConsts c;
  c.gamma = static_cast<float>(g / (1.0 - g) * (1.0 + 0x1p-20)) * (tc ? kTcGammaFactor : 1.0f);
  c.slack = static_cast<float>((a.q.dim + 16.0) * 0x1p-124);
  if (!tc) return LaunchRt<float>(a, c, stream);
  return a.q.dtype == kBF16 ? LaunchRt<__nv_bfloat16>(a, c, stream) : LaunchRt<__half>(a, c, stream);
}

}  // namespace mscuda
