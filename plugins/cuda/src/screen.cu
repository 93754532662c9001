// SPDX-License-Identifier: Apache-2.0
// Certified i8 screening and the approximate mode on int8 tensor cores (mma.sync m16n8k32, exact s32 dots).
//
// Two kernels share the per-tile work (ScreenWarp): ScreenKernel, one warp per (pair, group of 16*MT query rows)
// with the document codes and metadata loaded straight into registers (the next 32 tokens' loads in flight while
// the current ones compute), and ScreenPipeKernel, persistent warps streaming many short-query pairs through a
// per-warp shared-memory ring. Both hold the query codes in registers as A fragments. One pass per document:
//   A_j = fl(fl(float(I_j) * s_d) * s_q)  (times inv|d| for cosine), I_j the exact integer dot.
//   Per 8-token tile t the margin is made uniform: M_t = alpha * max_t(|d|) + beta * max_t(resid_d) + s
//   (cosine: of |d|/|d| and resid/|d|), where alpha = resid_q + gamma' |q| and beta = resid_q + |q|
//   (screening.h's bound rearranged: eps + fp = |d| (resid_q + gamma' |q|) + resid_d (resid_q + |q|)), with
//   the rounding of A and of this arithmetic folded in as relative slack. Then per row
//   L = max_t (max_{j in t} A_j - M_t) <= max_j (A_j - m_j), and every j with A_j + M_t >= L may hold the
//   exact maximum. Tokens passing against the running L are appended to a per-warp list with their upper
//   bound; the list is filtered by the final (or current) L and the survivors are refined.
//   Per element that is 4-5 instructions (convert, two scalings, a max, a compare), not ~17.
// Refinement computes each candidate's similarity with exactly the arithmetic of the exact kernels (16-bit:
// the same mma.sync chain over the same k order, one candidate per row of the tile and the diagonal of the
// 16x8 result kept; f32: the canonical FMA chain) and folds it into a per-row (value, lowest index) key with a
// shared-memory atomicMax. So CERTIFIED == EXACT bit for bit. gamma' = kTcGammaFactor * gamma_dim when the
// similarity comes from tensor cores (their f32 accumulation may truncate), gamma_dim for the FMA chain.
// APPROXIMATE: the i8 argmax (A_j ranked with scales; ties to the lower index), that one token refined.
#include <math.h>

#include <cstdlib>

#include "forward_common.cuh"

namespace mscuda {
namespace {

constexpr int kWarps = 8;
constexpr int kTiles = 4;
constexpr int kCap = 512;  // candidate list entries per warp (filtered, and refined if still full, when nearly full)
constexpr float kTcGammaFactor = 4.0f;

struct ScreenConsts {
  float gamma, slack;
};

struct WarpLists {
  uint32_t tok[kCap];
  float hi[kCap];
  unsigned long long best[32];
  float lower[32];
  uint32_t count_per_row[32];
  uint8_t row[kCap];
};

// Refines list entries [0, n) and folds them into best[]. RT: float = f32 FMA chain, else the 16-bit type.
// 16-bit FAST: rounds of 16 candidates (2 mma tiles of 8) with every load of the round issued before the first mma,
// so a round costs one memory latency.
template <typename RT, bool FAST>
__device__ __forceinline__ void Refine(const ForwardArgs& a, uint64_t qb, uint32_t r0, uint64_t db, WarpLists& L, int n) {
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
    if (FAST && nchunks <= 4) {
      for (int b = 0; b < n; b += 16) {
        const uint8_t* qr[2];
        const uint8_t* dr[2];
        uint32_t rows[2], toks[2];
        bool valid[2];
#pragma unroll
        for (int sb = 0; sb < 2; ++sb) {
          const int e = b + 8 * sb + g;
          valid[sb] = e < n;
          rows[sb] = valid[sb] ? L.row[e] : 0;
          toks[sb] = valid[sb] ? L.tok[e] : 0;
          qr[sb] = a.q.orig + (qb + r0 + rows[sb]) * a.q.row_bytes;
          dr[sb] = a.d.orig + (db + toks[sb]) * a.d.row_bytes;
        }
        RefineRound16<RT>(qr, dr, valid, dim, [&](int sb, float e_sim) {
          const float key = a.cosine ? e_sim * InvNorm(a.d.meta[db + toks[sb]].norm) : e_sim;
          atomicMax(&L.best[rows[sb]], PackKey(key, toks[sb]));
        });
      }
    } else {
      for (int b = 0; b < n; b += 8) {
        const int e = b + g;
        const bool valid = e < n;
        const uint32_t row = valid ? L.row[e] : 0, tok = valid ? L.tok[e] : 0;
        const uint8_t* qr = a.q.orig + (qb + r0 + row) * a.q.row_bytes;
        const uint8_t* dr = a.d.orig + (db + tok) * a.d.row_bytes;
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (uint32_t ch = 0; ch < nchunks; ++ch) {
          const uint4 qa = LdFrag16(qr, ch, t, dim, valid);
          const uint4 bv = LdFrag16(dr, ch, t, dim, valid);
          MmaChunk16<RT>(c, qa, Zero4(), bv);
        }
        if (valid && t == (g >> 1)) {
          const float e_sim = (g & 1) ? c[1] : c[0];
          const float key = a.cosine ? e_sim * InvNorm(a.d.meta[db + tok].norm) : e_sim;
          atomicMax(&L.best[row], PackKey(key, tok));
        }
      }
    }
  }
  __syncwarp();
}

// Appends (row, token, hi) for every lane whose pred holds; count is warp-uniform.
__device__ __forceinline__ void Push(WarpLists& L, int& count, bool pred, uint32_t row, uint32_t tok, float hi) {
  const unsigned mask = __ballot_sync(kFull, pred);
  if (pred) {
    const int pos = count + __popc(mask & ((1u << (threadIdx.x & 31)) - 1u));
    L.row[pos] = static_cast<uint8_t>(row);
    L.tok[pos] = tok;
    L.hi[pos] = hi;
  }
  count += __popc(mask);
}

// Keeps the entries whose upper bound reaches their row's lower bound (L.lower), in order.
__device__ void Compact(WarpLists& L, int& count) {
  const int lane = threadIdx.x & 31;
  __syncwarp();
  int out = 0;
  for (int b = 0; b < count; b += 32) {
    const int e = b + lane;
    const bool in = e < count;
    const uint8_t row = in ? L.row[e] : 0;
    const uint32_t tok = in ? L.tok[e] : 0;
    const float hi = in ? L.hi[e] : 0.0f;
    const bool keep = in && hi >= L.lower[row];
    const unsigned mask = __ballot_sync(kFull, keep);
    __syncwarp();
    if (keep) {
      const int pos = out + __popc(mask & ((1u << lane) - 1u));
      L.row[pos] = row;
      L.tok[pos] = tok;
      L.hi[pos] = hi;
    }
    out += __popc(mask);
    __syncwarp();
  }
  count = out;
}

// One warp's screening state for one (query group, document): the per-row constants of the query group, the
// running lower bounds (certified) or i8 argmax (approximate), and the candidate list in shared memory. Both
// kernels below feed it 16x8 tiles of exact int dots with their columns' metadata; they differ only in how the
// document codes reach the registers.
template <typename RT, int MT, bool CERT>
struct ScreenWarp {
  const ForwardArgs& a;
  const ScreenConsts consts;
  WarpLists& L;
  uint64_t qb = 0, db = 0, ld = 0;
  uint32_t r0 = 0;
  float sq[MT][2], al[MT][2], be[MT][2];
  bool rv[MT][2];
  float lower[MT][2], top[MT][2];
  int topi[MT][2];
  int count = 0;
  uint64_t refined = 0;

  __device__ ScreenWarp(const ForwardArgs& a_, ScreenConsts c, WarpLists& l) : a(a_), consts(c), L(l) {}

  // Per row slot (mt, h) -> row r0 + mt*16 + g + 8h: the query scale and the margin coefficients.
  __device__ __forceinline__ void BeginQuery(uint64_t qb_, uint64_t lq, uint32_t r0_) {
    const int g = (threadIdx.x & 31) >> 2;
    qb = qb_;
    r0 = r0_;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint64_t r = r0 + mt * 16 + g + 8 * h;
        rv[mt][h] = r < lq;
        const float4 m = rv[mt][h] ? __ldg(reinterpret_cast<const float4*>(a.q.meta + qb + r)) : make_float4(0, 0, 0, 0);
        // m = {scale, norm, resid, code_sum}. |A| 2^-21 <= 2^-21 (|q| + e_q)(|d| + e_d): folded into alpha, beta.
        const float rel = 1.0f + 0x1p-18f;
        const float abs_a = 0x1p-21f * (m.y + m.z);
        sq[mt][h] = m.x;
        al[mt][h] = (m.z + consts.gamma * m.y + abs_a) * rel;
        be[mt][h] = (m.z + m.y + abs_a) * rel;
      }
    }
  }

  __device__ __forceinline__ void BeginDoc(uint64_t db_, uint64_t ld_) {
    const int lane = threadIdx.x & 31;
    db = db_;
    ld = ld_;
    __syncwarp();
    L.best[lane] = 0ull;
    L.count_per_row[lane] = 0u;
    L.lower[lane] = -INFINITY;
    __syncwarp();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        lower[mt][h] = -INFINITY;
        top[mt][h] = -INFINITY;
        topi[mt][h] = -1;
      }
    }
    count = 0;
  }

  __device__ __forceinline__ void Flush(bool in_loop) {
    if (count == 0) return;
    __syncwarp();
    // The rare in-loop flush (a list still nearly full after filtering) uses the lean variant, so that the main
    // loop keeps its registers.
    if (in_loop) Refine<RT, false>(a, qb, r0, db, L, count);
    else Refine<RT, true>(a, qb, r0, db, L, count);
    refined += static_cast<uint64_t>(count);
    count = 0;
  }

  __device__ __forceinline__ void ShareLower() {
    if constexpr (CERT) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) lower[mt][h] = QuadMax(lower[mt][h]);
      }
    }
  }

  __device__ __forceinline__ void PublishLower() {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if (t == 0) {
        L.lower[mt * 16 + g] = lower[mt][0];
        L.lower[mt * 16 + g + 8] = lower[mt][1];
      }
    }
  }

  // One 16x8 tile per m tile: columns col0 + 2t + e of this lane, m[e] their metadata {scale, norm, resid, sum}.
  __device__ __forceinline__ void Tile(const int (&acc)[MT][4], const float4 (&m)[2], uint64_t col0) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const bool cosine = a.cosine != 0;
    // Per column: the scale (times inv|d| for cosine) and the tile's margin inputs.
    float sc[2], c1 = 0.0f, c2 = 0.0f;
    bool cv[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      cv[e] = col0 + 2 * t + e < ld;
      const float w = cosine ? InvNorm(m[e].y) : 1.0f;
      sc[e] = m[e].x * w;
      if (CERT && cv[e]) {
        c1 = fmaxf(c1, m[e].y * w);
        c2 = fmaxf(c2, m[e].z * w);
      }
    }
    if constexpr (CERT) {
      c1 = QuadMax(c1);
      c2 = QuadMax(c2);
      float mt_m[MT][2];
      bool any = false;
      float xs[MT][2][2];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float M = fmaf(al[mt][h], c1, fmaf(be[mt][h], c2, consts.slack));
          float tmax = -INFINITY;
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float x = static_cast<float>(acc[mt][2 * h + e]) * sc[e] * sq[mt][h];
            xs[mt][h][e] = x;
            if (cv[e]) tmax = fmaxf(tmax, x);
          }
          lower[mt][h] = fmaxf(lower[mt][h], tmax - M);
          mt_m[mt][h] = M;
#pragma unroll
          for (int e = 0; e < 2; ++e) any |= rv[mt][h] && cv[e] && xs[mt][h][e] + M >= lower[mt][h];
        }
      }
      if (__any_sync(kFull, any)) {
        if (count > kCap - 32 * 8) {
          ShareLower();
          PublishLower();
          Compact(L, count);
          if (count > kCap - 32 * 8) Flush(true);
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float hi = xs[mt][h][e] + mt_m[mt][h];
              const bool pred = rv[mt][h] && cv[e] && hi >= lower[mt][h];
              Push(L, count, pred, mt * 16 + g + 8 * h, static_cast<uint32_t>(col0 + 2 * t + e), hi);
            }
          }
        }
      }
    } else {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float x = static_cast<float>(acc[mt][2 * h + e]) * sc[e];
            if (cv[e] && x > top[mt][h]) {
              top[mt][h] = x;
              topi[mt][h] = static_cast<int>(col0 + 2 * t + e);
            }
          }
        }
      }
    }
  }

  // The final filter, refinement and statistics; returns the rows' (value, index) in WriteRows' layout.
  __device__ __forceinline__ Best<MT> EndDoc() {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    if constexpr (CERT) {
      PublishLower();
      Compact(L, count);
      // Per-row candidate counts (statistics) of the final list.
      for (int e = lane; e < count; e += 32) atomicAdd(&L.count_per_row[L.row[e]], 1u);
    } else {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          MergeBest(top[mt][h], topi[mt][h], 1);
          MergeBest(top[mt][h], topi[mt][h], 2);
          const bool pred = t == 0 && rv[mt][h] && topi[mt][h] >= 0;
          Push(L, count, pred, mt * 16 + g + 8 * h, static_cast<uint32_t>(topi[mt][h] < 0 ? 0 : topi[mt][h]), 0.0f);
        }
      }
    }
    Flush(false);
    __syncwarp();
    if (a.counters) {
      uint32_t multi = 0;
      if (CERT) multi = L.count_per_row[lane] > 1 ? 1u : 0u;
      for (int off = 16; off > 0; off >>= 1) multi += __shfl_xor_sync(kFull, multi, off);
      if (lane == 0) {
        atomicAdd(&a.counters[0], static_cast<unsigned long long>(refined));
        atomicAdd(&a.counters[1], static_cast<unsigned long long>(multi));
      }
    }
    refined = 0;
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
    return best;
  }
};

template <int CC>
struct Step {
  uint4 b[kTiles][CC > 0 ? CC : 1];
  float4 m[kTiles][2];  // metadata of this lane's two columns of each tile
};

// One warp per (pair, group of 16*MT query rows); the document's codes and metadata go straight from global
// memory into registers, the next 32 tokens' loads in flight while the current ones compute.
template <typename RT, int MT, int CC, bool CERT>
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
  ScreenWarp<RT, MT, CERT> sw(a, consts, lists[warp]);
  sw.BeginQuery(qb, lq, r0);
  sw.BeginDoc(db, ld);
  const uint32_t cb = a.q.code_bytes;
  const int8_t* qcodes = a.q.codes + qb * cb;
  const int8_t* dcodes = a.d.codes + db * cb;
  const float4* dmeta = reinterpret_cast<const float4*>(a.d.meta + db);

  // CC > 0: the query codes live in registers (code rows of up to 128 bytes); CC == 0: any dimension, A and B
  // reloaded per 64-byte chunk.
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
  const uint32_t nchunks = cb / 64;
  auto load = [&](Step<CC>& st, uint64_t base) {
#pragma unroll
    for (int u = 0; u < kTiles; ++u) {
      const uint64_t n = base + u * 8 + g;
      if constexpr (CC > 0) {
#pragma unroll
        for (int c = 0; c < CC; ++c) st.b[u][c] = n < ld ? Ld16(dcodes + n * cb + 64 * c + 16 * t) : Zero4();
      }
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const uint64_t col = base + u * 8 + 2 * t + e;
        st.m[u][e] = col < ld ? __ldg(dmeta + col) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
  };
  Step<CC> cur;
  if (ld > 0) load(cur, 0);
  for (uint64_t base = 0; base < ld; base += 32) {
    Step<CC> nxt;
    const bool more = base + 32 < ld;
    if (more) load(nxt, base + 32);
#pragma unroll
    for (int u = 0; u < kTiles; ++u) {
      if (base + u * 8 >= ld) break;
      int acc[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0;
      if constexpr (CC > 0) {
#pragma unroll
        for (int c = 0; c < CC; ++c) {
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) MmaChunkI8(acc[mt], qa[mt][c], qc[mt][c], cur.b[u][c]);
        }
      } else {
        const uint64_t n = base + u * 8 + g;
        for (uint32_t c = 0; c < nchunks; ++c) {
          const uint4 bv = n < ld ? Ld16(dcodes + n * cb + 64 * c + 16 * t) : Zero4();
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            const uint64_t ra = r0 + mt * 16 + g, rb = ra + 8;
            const uint4 xa = ra < lq ? Ld16(qcodes + ra * cb + 64 * c + 16 * t) : Zero4();
            const uint4 xc = rb < lq ? Ld16(qcodes + rb * cb + 64 * c + 16 * t) : Zero4();
            MmaChunkI8(acc[mt], xa, xc, bv);
          }
        }
      }
      sw.Tile(acc, cur.m[u], base + u * 8);
    }
    sw.ShareLower();
    if (more) cur = nxt;
  }
  Best<MT> best = sw.EndDoc();
  WriteRows<MT>(a, p, qi, dj, grp, qb, lq, ld > 0, best, s_term[warp], s_arg[warp]);
}

// ---- per-warp cp.async ring (many single-group pairs) -------------------------------------------------
//
// ScreenPipeKernel: persistent warps, each owning a contiguous range of pairs (queries of at most 16*MT rows,
// code rows of CC*64 bytes). A warp copies its documents' code rows and metadata into its own shared-memory
// ring (S stages of 32 tokens: 32 code rows, then 32 metadata entries) with coalesced 16-byte cp.async, S - 1
// steps ahead of the mma work and across document boundaries, so the HBM stream does not stop at a document's
// end or while the warp refines. Per element it is ScreenKernel's arithmetic (the same ScreenWarp), so
// candidate sets, refinement and results are identical to it. With 128-byte code rows the 16-byte slots are
// XOR-swizzled by token parity: a B-fragment read (8 tokens x 4 slots) then touches every bank once per pair of
// tokens instead of 8 tokens on the same 4 banks.

constexpr int kScreenStep = 32;  // tokens per stage

// Bytes of one ring stage: kScreenStep code rows of 64 * CC bytes, then their 16-byte metadata entries.
template <int CC>
constexpr int ScreenStageBytes() {
  return kScreenStep * 64 * CC + kScreenStep * 16;
}

template <int CC>
__device__ __forceinline__ int ScreenSlot(int slot, int tok) {
  return CC == 2 ? (slot ^ ((tok & 1) << 2)) : slot;
}

template <typename RT, int MT, int CC, bool CERT, int W, int S>
__global__ void __launch_bounds__(W * 32, 1) ScreenPipeKernel(const ForwardArgs a, ScreenConsts consts, uint64_t n_warps) {
  constexpr int kCodeBytes = 64 * CC;
  constexpr int kMetaOffset = kScreenStep * kCodeBytes;
  constexpr int kStageBytes = ScreenStageBytes<CC>();
  extern __shared__ __align__(128) uint8_t screen_ring[];
  __shared__ WarpLists lists[W];
  __shared__ float s_term[W][MT * 16];
  __shared__ int s_arg[W][MT * 16];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const uint64_t wid = static_cast<uint64_t>(blockIdx.x) * W + warp;
  if (wid >= n_warps) return;
  const PairRange range(a.pairs.n_pairs, wid, n_warps);
  if (range.begin >= range.end) return;
  const uint32_t ring = static_cast<uint32_t>(__cvta_generic_to_shared(screen_ring)) +
                        static_cast<uint32_t>(warp) * (S * kStageBytes);
  const uint8_t* codes = reinterpret_cast<const uint8_t*>(a.d.codes);
  const uint8_t* meta = reinterpret_cast<const uint8_t*>(a.d.meta);
  StepCursor<kScreenStep> cur(a, range);
  uint32_t produced = 0;
  auto produce = [&]() {
    if (cur.Active()) {
      const uint32_t st = ring + (produced % S) * kStageBytes;
      constexpr int kSlots = kCodeBytes / 16;
#pragma unroll
      for (int i = 0; i < kScreenStep * kSlots / 32; ++i) {
        const int e = lane + 32 * i, tok = e / kSlots, slot = e % kSlots;
        const uint64_t n = cur.token + tok;
        const bool pred = n < cur.len;
        const uint8_t* src = codes + (pred ? (cur.first_row + n) * kCodeBytes + slot * 16 : 0);
        CpAsync16(st + tok * kCodeBytes + (ScreenSlot<CC>(slot, tok) << 4), src, pred);
      }
      {
        const uint64_t n = cur.token + lane;
        const bool pred = n < cur.len;
        CpAsync16(st + kMetaOffset + lane * 16, meta + (pred ? (cur.first_row + n) * 16 : 0), pred);
      }
      ++produced;
      cur.Advance(a);
    }
    CpAsyncCommit();
  };
#pragma unroll
  for (int s = 0; s < S - 1; ++s) produce();

  ScreenWarp<RT, MT, CERT> sw(a, consts, lists[warp]);
  uint4 qa[MT][CC], qc[MT][CC];
  uint64_t loaded_q = ~0ull;
  uint32_t consumed = 0;
  for (uint64_t p = range.begin; p < range.end; ++p) {
    uint64_t qi, dj;
    a.pairs.Resolve(p, &qi, &dj);
    const uint64_t db = a.d.Begin(dj), ld = a.d.End(dj) - db;
    const uint64_t qb = a.q.Begin(qi), lq = a.q.End(qi) - qb;
    if (qi != loaded_q) {
      loaded_q = qi;
      const int8_t* qcodes = a.q.codes + qb * kCodeBytes;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const uint64_t ra = mt * 16 + g, rb = ra + 8;
#pragma unroll
        for (int c = 0; c < CC; ++c) {
          qa[mt][c] = ra < lq ? Ld16(qcodes + ra * kCodeBytes + 64 * c + 16 * t) : Zero4();
          qc[mt][c] = rb < lq ? Ld16(qcodes + rb * kCodeBytes + 64 * c + 16 * t) : Zero4();
        }
      }
      sw.BeginQuery(qb, lq, 0);
    }
    sw.BeginDoc(db, ld);
    for (uint64_t base = 0; base < ld; base += kScreenStep) {
      CpAsyncWait<S - 2>();
      __syncwarp();
      produce();
      const uint32_t st = ring + (consumed % S) * kStageBytes;
      ++consumed;
#pragma unroll
      for (int u = 0; u < kScreenStep / 8; ++u) {
        if (base + u * 8 < ld) {
          const int tok = u * 8 + g;
          uint4 bv[CC];
#pragma unroll
          for (int c = 0; c < CC; ++c) bv[c] = Lds16(st + tok * kCodeBytes + (ScreenSlot<CC>(4 * c + t, tok) << 4));
          int acc[MT][4];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0;
#pragma unroll
          for (int c = 0; c < CC; ++c) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) MmaChunkI8(acc[mt], qa[mt][c], qc[mt][c], bv[c]);
          }
          float4 m[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const uint4 raw = Lds16(st + kMetaOffset + (u * 8 + 2 * t + e) * 16);
            m[e] = make_float4(__uint_as_float(raw.x), __uint_as_float(raw.y), __uint_as_float(raw.z),
                               __uint_as_float(raw.w));
          }
          sw.Tile(acc, m, base + u * 8);
        }
      }
      sw.ShareLower();
    }
    Best<MT> best = sw.EndDoc();
    WriteRows<MT>(a, p, qi, dj, 0, qb, lq, ld > 0, best, s_term[warp], s_arg[warp]);
    __syncwarp();
  }
  CpAsyncWait<0>();
}

template <typename RT, int MT, int CC, bool CERT, int W, int S>
cudaError_t LaunchPipeShape(const ForwardArgs& a, ScreenConsts c, int sms, cudaStream_t stream) {
  const int smem = W * S * ScreenStageBytes<CC>();
  const cudaError_t e = AllowDynamicSmemOnce<ScreenPipeKernel<RT, MT, CC, CERT, W, S>>(smem);
  if (e != cudaSuccess) return e;
  const uint64_t n_warps = static_cast<uint64_t>(sms) * W;
  ScreenPipeKernel<RT, MT, CC, CERT, W, S><<<static_cast<unsigned>(sms), W * 32, smem, stream>>>(a, c, n_warps);
  return cudaGetLastError();
}

// Ring shape (warps per block x stages, one block per SM): 8x4, no slower than 6x6 and 4x8 on the H100 (git
// history keeps those).
constexpr int kScreenPipeWarps = 8, kScreenPipeStages = 4;

template <typename RT, int MT, int CC, bool CERT>
cudaError_t LaunchPipeCC(const ForwardArgs& a, ScreenConsts c, int sms, cudaStream_t stream) {
  return LaunchPipeShape<RT, MT, CC, CERT, kScreenPipeWarps, kScreenPipeStages>(a, c, sms, stream);
}

// The ring's shared memory per block: the stages, and the warps' candidate lists and row terms (32 rows at most).
template <int CC>
constexpr int ScreenPipeSharedBytes() {
  return kScreenPipeWarps * kScreenPipeStages * ScreenStageBytes<CC>() +
         kScreenPipeWarps * static_cast<int>(sizeof(WarpLists) + 32 * (sizeof(float) + sizeof(int)));
}

template <typename RT, int MT>
cudaError_t LaunchMt(const ForwardArgs& a, ScreenConsts c, cudaStream_t stream) {
  const uint64_t tasks = a.pairs.n_pairs * a.part.groups;
  const uint64_t blocks = (tasks + kWarps - 1) / kWarps;
  if (blocks == 0) return cudaSuccess;
  if (blocks > 0x7fffffffull) return cudaErrorInvalidConfiguration;
  const bool cert = a.mode == MAXSIM_MODE_CERTIFIED;
  const int sms = SmCount();
  if (ScreenPipeApplies(a.sw, a.part.groups, a.q.code_bytes, a.pairs.n_pairs, sms, SharedMemoryOptinBytes())) {
    if (a.q.code_bytes == 64) {
      return cert ? LaunchPipeCC<RT, MT, 1, true>(a, c, sms, stream) : LaunchPipeCC<RT, MT, 1, false>(a, c, sms, stream);
    }
    return cert ? LaunchPipeCC<RT, MT, 2, true>(a, c, sms, stream) : LaunchPipeCC<RT, MT, 2, false>(a, c, sms, stream);
  }
  const dim3 grid(static_cast<unsigned>(blocks)), block(kWarps * 32);
  switch (a.q.code_bytes / 64) {
#define MSC_SCREEN_CASE(CC)                                                                   \
  case CC:                                                                                    \
    if (cert) ScreenKernel<RT, MT, CC, true><<<grid, block, 0, stream>>>(a, c);               \
    else ScreenKernel<RT, MT, CC, false><<<grid, block, 0, stream>>>(a, c);                   \
    break;
    MSC_SCREEN_CASE(1)
    MSC_SCREEN_CASE(2)
    default:
      if (cert) ScreenKernel<RT, MT, 0, true><<<grid, block, 0, stream>>>(a, c);
      else ScreenKernel<RT, MT, 0, false><<<grid, block, 0, stream>>>(a, c);
      break;
#undef MSC_SCREEN_CASE
  }
  return cudaGetLastError();
}

template <typename RT>
cudaError_t LaunchRt(const ForwardArgs& a, ScreenConsts c, cudaStream_t stream) {
  return a.part.group_rows == 16 ? LaunchMt<RT, 1>(a, c, stream) : LaunchMt<RT, 2>(a, c, stream);
}

}  // namespace

uint32_t ScreenGroupRows(uint64_t max_lq) { return max_lq <= 16 ? 16 : 32; }

// The ring kernel: queries in one group, code rows of 64 or 128 bytes, and enough pairs (EnoughPairsForWarpRings).
bool ScreenPipeApplies(const KernelSwitches& sw, uint32_t groups, uint32_t code_bytes, uint64_t n_pairs, int sms,
                       int smem_optin) {
  return sw.screen_pipe && groups == 1 && (code_bytes == 64 || code_bytes == 128) &&
         EnoughPairsForWarpRings(n_pairs, sms) &&
         (code_bytes == 64 ? ScreenPipeSharedBytes<1>() : ScreenPipeSharedBytes<2>()) <= smem_optin;
}

ScreenBound ScreenBoundFor(const SetsView& q, const SetsView& d) {
  const bool tc = TcSupported(q, d);
  const double g = (q.dim + 2.0) * 0x1p-24;
  ScreenBound c;
  c.gamma = static_cast<float>(g / (1.0 - g) * (1.0 + 0x1p-20)) * (tc ? kTcGammaFactor : 1.0f);
  c.slack = static_cast<float>((q.dim + 16.0) * 0x1p-124);
  return c;
}

cudaError_t LaunchScreen(const ForwardArgs& a, cudaStream_t stream) {
  const bool tc = TcSupported(a.q, a.d);
  const ScreenBound bound = ScreenBoundFor(a.q, a.d);
  ScreenConsts c;
  c.gamma = bound.gamma;
  c.slack = bound.slack;
  if (!tc) return LaunchRt<float>(a, c, stream);
  return a.q.dtype == kBF16 ? LaunchRt<__nv_bfloat16>(a, c, stream) : LaunchRt<__half>(a, c, stream);
}

}  // namespace mscuda
