// SPDX-License-Identifier: Apache-2.0
// Exact forward kernels.
//
// ExactTcKernel (16-bit originals, tensor cores): one warp per (pair, group of 16*MT query rows). The warp holds
// its query rows as mma A fragments in registers (KC 32-dimension chunks, dims <= 128) and streams the
// document's rows straight from global memory into B fragments (two 8-byte loads per 32-dim chunk in the k order
// of device_common.cuh, 32 tokens per step, the next step's loads in flight while the current one computes).
// Each 16x8 tile of similarities is folded into a per-row running max in registers (strict >, tokens in
// increasing order per lane, then a quad merge with ties to the lower index), so nothing of size Lq x Ld ever
// leaves the register file. KC = 0 is the any-dimension variant: A and B are reloaded per 32-dim chunk.
// Ragged sets cost nothing beyond rounding each document up to 8 tokens; masked or padding tokens are
// excluded in the epilogue.
//
// ExactFfmaKernel (f32, mixed dtypes, unaligned dense tensors): a 256-thread block per (pair, 32 query rows),
// 64-token tiles and 32-dimension chunks through shared memory; each thread runs the CPU's canonical
// sequential f32 FMA chain for 1 row x 8 tokens, so results are bit-identical to the CPU's exact path.
#include <math.h>

#include <cstdlib>

#include "forward_common.cuh"
#include "ring_common.cuh"
#include "row_check.cuh"

namespace mscuda {
namespace {

constexpr int kTcWarps = 8;
constexpr int kTcTiles = 4;  // n8 tiles per pipeline step (32 tokens)

template <typename T, int MT, int KC>
__global__ void __launch_bounds__(kTcWarps * 32, 1) ExactTcKernel(const ForwardArgs a) {
  __shared__ float s_term[kTcWarps][MT * 16];
  __shared__ int s_arg[kTcWarps][MT * 16];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const uint32_t G = a.part.groups;
  const uint64_t task = static_cast<uint64_t>(blockIdx.x) * kTcWarps + warp;
  if (task >= a.pairs.n_pairs * G) return;
  const uint64_t p = task / G;
  const uint32_t grp = static_cast<uint32_t>(task - p * G);
  uint64_t qi, dj;
  a.pairs.Resolve(p, &qi, &dj);
  const uint64_t qb = a.q.Begin(qi), lq = a.q.End(qi) - qb;
  const uint64_t db = a.d.Begin(dj), ld = a.d.End(dj) - db;
  const uint32_t r0 = grp * MT * 16;
  if (grp > 0 && r0 >= lq) return;
  const uint32_t dim = a.q.dim;
  const uint8_t* qbase = a.q.orig + qb * a.q.row_bytes;
  const uint8_t* dbase = a.d.orig + db * a.d.row_bytes;
  const uint64_t qrb = a.q.row_bytes, drb = a.d.row_bytes;

  Best<MT> best;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    best.v[mt][0] = best.v[mt][1] = -INFINITY;
    best.i[mt][0] = best.i[mt][1] = -1;
  }
  bool saw_kept = false;

  if constexpr (KC > 0) {
    uint4 qa[MT][KC], qc[MT][KC];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const uint64_t ra = r0 + mt * 16 + g, rb = ra + 8;
#pragma unroll
      for (int c = 0; c < KC; ++c) {
        qa[mt][c] = LdFrag16(qbase + ra * qrb, c, t, dim, ra < lq);
        qc[mt][c] = LdFrag16(qbase + rb * qrb, c, t, dim, rb < lq);
      }
    }
    uint4 cur[kTcTiles][KC];
    auto load = [&](uint4 (&buf)[kTcTiles][KC], uint64_t base) {
#pragma unroll
      for (int u = 0; u < kTcTiles; ++u) {
        const uint64_t n = base + u * 8 + g;
        const uint8_t* row = dbase + n * drb;
#pragma unroll
        for (int c = 0; c < KC; ++c) {
          buf[u][c] = LdFrag16(row, c, t, dim, n < ld);
        }
      }
    };
    if (ld > 0) load(cur, 0);
    for (uint64_t base = 0; base < ld; base += 32) {
      uint4 nxt[kTcTiles][KC];
      const bool more = base + 32 < ld;
      if (more) load(nxt, base + 32);
#pragma unroll
      for (int u = 0; u < kTcTiles; ++u) {
        if (base + u * 8 < ld) {
          float acc[MT][4];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.0f;
#pragma unroll
          for (int c = 0; c < KC; ++c) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) MmaChunk16<T>(acc[mt], qa[mt][c], qc[mt][c], cur[u][c]);
          }
          FoldTile<MT>(a, db, ld, base + u * 8 + 2 * t, acc, best, saw_kept);
        }
      }
      if (more) {
#pragma unroll
        for (int u = 0; u < kTcTiles; ++u) {
#pragma unroll
          for (int c = 0; c < KC; ++c) cur[u][c] = nxt[u][c];
        }
      }
    }
  } else {
    const uint32_t nchunks = (dim + 31) / 32;
    for (uint64_t base = 0; base < ld; base += 32) {
      float acc[kTcTiles][MT][4];
#pragma unroll
      for (int u = 0; u < kTcTiles; ++u) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) acc[u][mt][0] = acc[u][mt][1] = acc[u][mt][2] = acc[u][mt][3] = 0.0f;
      }
      for (uint32_t c = 0; c < nchunks; ++c) {
        uint4 qa[MT], qc[MT], bv[kTcTiles];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const uint64_t ra = r0 + mt * 16 + g, rb = ra + 8;
          qa[mt] = LdFrag16(qbase + ra * qrb, c, t, dim, ra < lq);
          qc[mt] = LdFrag16(qbase + rb * qrb, c, t, dim, rb < lq);
        }
#pragma unroll
        for (int u = 0; u < kTcTiles; ++u) {
          const uint64_t n = base + u * 8 + g;
          bv[u] = LdFrag16(dbase + n * drb, c, t, dim, n < ld);
        }
#pragma unroll
        for (int u = 0; u < kTcTiles; ++u) {
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) MmaChunk16<T>(acc[u][mt], qa[mt], qc[mt], bv[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < kTcTiles; ++u) {
        if (base + u * 8 < ld) FoldTile<MT>(a, db, ld, base + u * 8 + 2 * t, acc[u], best, saw_kept);
      }
    }
  }
  const bool doc_nonempty = a.d.mask ? __any_sync(kFull, saw_kept) : ld > 0;
  WriteRows<MT>(a, p, qi, dj, grp, qb, lq, doc_nonempty, best, s_term[warp], s_arg[warp]);
}

template <typename T, int MT>
cudaError_t LaunchPipe(const ForwardArgs& a, int sms, bool coop, cudaStream_t stream);

template <typename T, int MT>
cudaError_t LaunchTcMt(const ForwardArgs& a, cudaStream_t stream) {
  const uint64_t tasks = a.pairs.n_pairs * a.part.groups;
  const uint64_t blocks = (tasks + kTcWarps - 1) / kTcWarps;
  if (blocks == 0) return cudaSuccess;
  if (blocks > 0x7fffffffull) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(blocks)), block(kTcWarps * 32);
  const uint32_t chunks = (a.q.dim + 31) / 32;
  // Many single-group pairs (at least half a pair per resident warp): the per-warp cp.async pipeline, where the
  // device gives a block the ring's shared memory (or the call takes the grid, whose blocks are smaller). One-query
  // dot calls with too few documents for it: the dealt kernel (DealtChosen).
  const int sms = SmCount();
  const bool rings = a.sw.pipe && a.part.groups == 1 && chunks <= 4 && EnoughPairsForWarpRings(a.pairs.n_pairs, sms);
  const bool coop = rings && !a.cosine && a.d.mask == nullptr && CoopChosen(a, sms);
  if (!coop && DealtChosen(a, sms, SharedMemoryOptinBytes())) return LaunchExactDealt(a, sms, stream);
  if (rings && (coop || PipeFitsSharedMemory(a, SharedMemoryOptinBytes()))) {
    return LaunchPipe<T, MT>(a, sms, coop, stream);
  }
  switch (chunks) {
    case 1: ExactTcKernel<T, MT, 1><<<grid, block, 0, stream>>>(a); break;
    case 2: ExactTcKernel<T, MT, 2><<<grid, block, 0, stream>>>(a); break;
    case 3: ExactTcKernel<T, MT, 3><<<grid, block, 0, stream>>>(a); break;
    case 4: ExactTcKernel<T, MT, 4><<<grid, block, 0, stream>>>(a); break;
    default: ExactTcKernel<T, MT, 0><<<grid, block, 0, stream>>>(a); break;
  }
  return cudaGetLastError();
}

// ---- shared-memory tiled variant for long queries (d in (96, 128]) ----------------------------------------
//
// ExactTcSmemKernel: one block of W warps per (pair, block of 32*W query rows). Each warp keeps its 32 rows as A
// fragments in registers; the document streams through shared memory in 64-token tiles (a 3-stage cp.async
// pipeline, 16 KB per stage), so every document byte is read from global memory once per block instead of once
// per warp. The 16-byte slots of a token row are XOR-swizzled by token (RingSlot16) so that the B-fragment
// reads (ldmatrix, natural placement) are conflict-free. Same k steps and the same per-element arithmetic as
// ExactTcKernel (a row's similarity is the same mma chain from a zero accumulator), so results are identical to
// it and to certified refinement. ARGMAX = false folds values only (one max per element).

constexpr int kSmemTile = 64;    // tokens per stage (default shape)
constexpr int kSmemStages = 3;
constexpr int kRowBytes = kRingRowBytes;  // 128 dims x 2 bytes (device_common.cuh: RingSlot16, LdsmFrag16)

// TILE tokens per stage x STAGES stages (64 x 3 or 128 x 2, chosen in LaunchSmemA).
template <typename T, int W, bool ARGMAX, int TILE, int STAGES>
__global__ void __launch_bounds__(W * 32) ExactTcSmemKernel(const ForwardArgs a) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ float s_term[W * 32];
  __shared__ int s_arg[W * 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const uint32_t G = a.part.groups;
  const uint64_t task = blockIdx.x;
  const uint64_t p = task / G;
  const uint32_t grp = static_cast<uint32_t>(task - p * G);
  uint64_t qi, dj;
  a.pairs.Resolve(p, &qi, &dj);
  const uint64_t qb = a.q.Begin(qi), lq = a.q.End(qi) - qb;
  const uint64_t db = a.d.Begin(dj), ld = a.d.End(dj) - db;
  const uint32_t r0b = grp * W * 32;            // first row of the block
  if (grp > 0 && r0b >= lq) return;             // uniform over the block
  const uint32_t r0 = r0b + warp * 32;           // first row of this warp
  const uint32_t dim = a.q.dim;
  const uint8_t* qbase = a.q.orig + qb * a.q.row_bytes;
  const uint8_t* dbase = a.d.orig + db * a.d.row_bytes;
  const uint64_t qrb = a.q.row_bytes, drb = a.d.row_bytes;

  uint4 qa[2][4], qc[2][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    const uint64_t ra = r0 + mt * 16 + g, rb = ra + 8;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      qa[mt][c] = LdFragNaturalShfl(qbase + ra * qrb, c, t, dim, ra < lq);
      qc[mt][c] = LdFragNaturalShfl(qbase + rb * qrb, c, t, dim, rb < lq);
    }
  }
  const uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint64_t ntiles = (ld + TILE - 1) / TILE;
  auto load_tile = [&](uint64_t tile) {
    if (tile < ntiles) {
      const uint32_t st = sbase + static_cast<uint32_t>(tile % STAGES) * (TILE * kRowBytes);
      for (int e = threadIdx.x; e < TILE * 16; e += W * 32) {
        const int tok = e >> 4, slot = e & 15;
        const uint64_t n = tile * TILE + tok;
        const bool pred = n < ld && static_cast<uint32_t>(slot) * 8 < dim;
        const uint8_t* src = dbase + (pred ? n : 0) * drb + (pred ? slot * 16 : 0);
        CpAsync16(st + tok * kRowBytes + (RingSlot16(slot, tok) << 4), src, pred);
      }
    }
    CpAsyncCommit();
  };
  Best<2> best;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    best.v[mt][0] = best.v[mt][1] = -INFINITY;
    best.i[mt][0] = best.i[mt][1] = -1;
  }
  bool saw_kept = false;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) load_tile(s);
  for (uint64_t tile = 0; tile < ntiles; ++tile) {
    CpAsyncWait<STAGES - 2>();
    __syncthreads();
    load_tile(tile + STAGES - 1);
    const uint32_t st = sbase + static_cast<uint32_t>(tile % STAGES) * (TILE * kRowBytes);
    const uint64_t base = tile * TILE;
    // Full tiles (all but a document's last) run without the per-step bound check, so that the unrolled
    // steps' independent mma chains can interleave.
    const int steps = base + TILE <= ld ? TILE / 8 : static_cast<int>((ld - base + 7) / 8);
#pragma unroll 2
    for (int u = 0; u < steps; ++u) {
      uint4 bv[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) bv[c] = LdsmFrag16(st, u * 8, c, lane);
      float acc[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.0f;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) MmaChunk16<T>(acc[mt], qa[mt][c], qc[mt][c], bv[c]);
      }
      const uint64_t n0 = base + u * 8 + 2 * t;
      if constexpr (ARGMAX) {
        FoldTile<2>(a, db, ld, n0, acc, best, saw_kept);
      } else {
        const bool full = base + u * 8 + 8 <= ld && a.d.mask == nullptr;
        if (full && !a.cosine) {
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            best.v[mt][0] = fmaxf(best.v[mt][0], fmaxf(acc[mt][0], acc[mt][1]));
            best.v[mt][1] = fmaxf(best.v[mt][1], fmaxf(acc[mt][2], acc[mt][3]));
            if (a.bad != nullptr) {
#pragma unroll
              for (int e = 0; e < 4; ++e) best.chk = MaxNaN(best.chk, fabsf(acc[mt][e]));
            }
          }
          saw_kept = true;
        } else {
          FoldTile<2>(a, db, ld, n0, acc, best, saw_kept);
        }
      }
    }
  }
  CpAsyncWait<0>();
  const bool doc_nonempty = a.d.mask ? __syncthreads_or(saw_kept) != 0 : ld > 0;
  // Quad merge, then the block's rows go through shared memory.
  QuadMergeBest(best);
  ReportCheck(a, best.chk);
  if (t == 0) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t rl = warp * 32 + mt * 16 + g + 8 * h;
        const uint64_t r = r0b + rl;
        float term = 0.0f;
        int arg = -1;
        if (r < lq && a.q.Kept(qb + r)) {
          term = a.cosine ? best.v[mt][h] * InvNorm(RowNorm(a.q, qb + r)) : best.v[mt][h];
          arg = best.i[mt][h];
        }
        s_term[rl] = term;
        s_arg[rl] = arg;
      }
    }
  }
  __syncthreads();
  const uint64_t rows = lq - r0b < static_cast<uint64_t>(W * 32) ? lq - r0b : W * 32;
  if (G == 1) {
    if (threadIdx.x == 0) {
      const double sum = OrderedSum(s_term, lq);
      *a.pairs.ScorePtr(p, qi, dj) = doc_nonempty ? RoundScore(sum) : -INFINITY;
    }
    int32_t* am = a.pairs.ArgmaxPtr(p, qi, dj, qb - a.q.Begin(0), lq);
    if (am) {
      for (uint64_t r = threadIdx.x; r < lq; r += W * 32) am[r] = doc_nonempty ? s_arg[r] : -1;
    }
  } else {
    for (uint64_t r = threadIdx.x; r < rows; r += W * 32) {
      const uint64_t slot = (p * G + grp) * a.part.group_rows + r;
      a.part.term[slot] = s_term[r];
      a.part.arg[slot] = s_arg[r];
    }
  }
}

template <typename T, int W, bool ARGMAX, int TILE, int STAGES>
cudaError_t LaunchSmemShape(const ForwardArgs& a, uint64_t tasks, cudaStream_t stream) {
  const int smem = STAGES * TILE * kRowBytes;
  const cudaError_t e = AllowDynamicSmemOnce<ExactTcSmemKernel<T, W, ARGMAX, TILE, STAGES>>(smem);
  if (e != cudaSuccess) return e;
  ExactTcSmemKernel<T, W, ARGMAX, TILE, STAGES><<<static_cast<unsigned>(tasks), W * 32, smem, stream>>>(a);
  return cudaGetLastError();
}

// Stage shapes (H100, bf16; docs/cuda.md): 8-warp blocks (queries > 128 rows, compute-bound) take 128-token x
// 2-stage tiles, the fastest of 64 x 3, 64 x 4 and 32 x 6 on the visual shape; 2- and 4-warp blocks keep 64 x 3,
// the fastest on q128.
template <typename T, int W, bool ARGMAX>
cudaError_t LaunchSmemA(const ForwardArgs& a, uint64_t tasks, cudaStream_t stream) {
  if constexpr (W == 8) {
    return LaunchSmemShape<T, W, ARGMAX, 128, 2>(a, tasks, stream);
  } else {
    return LaunchSmemShape<T, W, ARGMAX, kSmemTile, kSmemStages>(a, tasks, stream);
  }
}

template <typename T, int W>
cudaError_t LaunchSmemW(const ForwardArgs& a, cudaStream_t stream) {
  const uint64_t tasks = a.pairs.n_pairs * a.part.groups;
  if (tasks == 0) return cudaSuccess;
  if (tasks > 0x7fffffffull) return cudaErrorInvalidConfiguration;
  if (W >= 4 && WgmmaUsable(a)) return LaunchExactWgmma(a, stream);
  return a.pairs.argmax ? LaunchSmemA<T, W, true>(a, tasks, stream) : LaunchSmemA<T, W, false>(a, tasks, stream);
}

template <typename T>
cudaError_t LaunchSmemT(const ForwardArgs& a, cudaStream_t stream) {
  switch (a.part.group_rows) {
    case 64: return LaunchSmemW<T, 2>(a, stream);
    case 128: return LaunchSmemW<T, 4>(a, stream);
    default: return LaunchSmemW<T, 8>(a, stream);
  }
}

// ---- per-warp cp.async pipeline for many short-query pairs (G == 1, dim <= 128) --------------------------
//
// ExactTcPipeKernel: each warp walks a contiguous range of pairs as one stream of 32-token steps. A step's
// document rows are copied into the warp's own shared-memory ring (kPipeStages x 8 KB) with fully coalesced
// 16-byte cp.async (each instruction moves two whole 256-byte rows), kPipeStages - 1 steps ahead of the mma
// work, across document boundaries; B fragments are read back with the same swizzle as the tiled kernel
// (RingSlot16).
// The ring is private to the warp (cp.async.wait_group + __syncwarp); the one block barrier is at the start of a
// one-query launch, where the block shares the query it copied once (below). Per element it is exactly
// ExactTcKernel's arithmetic. Whole steps are copied under an L2 evict-first policy.

constexpr int kPipeStep = kRingStep;
constexpr int kPipeStageBytes = kRingStageBytes;

// FOLD: 0 any call (the fold chosen per launch); 1 dot without a document mask, scores only; 2 the same with
// argmax (LaunchPipe). ONEQ: a one-query launch (OneQueryLaunch), compiled apart so that launches of several
// queries keep their own code (a runtime branch cost the training step, forward and backward, about 1% on the
// H100).
template <typename T, int MT, int kPipeWarps, int kPipeStages, int FOLD, bool ONEQ>
__global__ void __launch_bounds__(kPipeWarps * 32, 1) ExactTcPipeKernel(const ForwardArgs a, uint64_t n_warps) {
  extern __shared__ __align__(128) uint8_t ring_all[];
  __shared__ float s_term[kPipeWarps][MT * 16];
  __shared__ int s_arg[kPipeWarps][MT * 16];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const uint64_t wid = static_cast<uint64_t>(blockIdx.x) * kPipeWarps + warp;
  const PairRange range(a.pairs.n_pairs, wid, n_warps);
  const bool has_pairs = range.begin < range.end;
  if constexpr (!ONEQ) {
    if (!has_pairs) return;
  }  // else every warp stays to the query barrier below
  const uint64_t policy = EvictFirstPolicy();
  const uint32_t dim = a.q.dim;
  const uint64_t qrb = a.q.row_bytes, drb = a.d.row_bytes;
  const uint32_t ring = static_cast<uint32_t>(__cvta_generic_to_shared(ring_all)) +
                        static_cast<uint32_t>(warp) * (kPipeStages * kPipeStageBytes);
  StepCursor<kPipeStep> cur(a, range);
  uint32_t produced = 0;
  auto produce = [&]() {
    if (cur.Active()) {
      CopyRingStep(ring + (produced % kPipeStages) * kPipeStageBytes, a.d.orig + cur.first_row * drb, cur.token,
                   cur.len, drb, dim, policy, lane);
      ++produced;
      cur.Advance(a);
    }
    CpAsyncCommit();
  };
  // Every pair of a one-query launch has query 0: the block copies its rows once, behind the rings, as a cp.async
  // group issued before the rings' first copies (so it is not queued behind them), and each warp takes its fragments
  // with ldmatrix (LdFragNatural's fragments, as in the grid kernel). The query then crosses from L2 once per block
  // instead of once per warp. On the H100, alternating with the build before (gpu_bench kernel rows, four rounds):
  // textual-1k 0.0324 against 0.0329 ms; each warp's own LdFragNatural loads of the query, issued after the
  // prologue, had cost about 1 us per launch (benchmarks/results/gpu-ring-query-h100.md). Other launches load
  // the query per warp when it changes (below).
  const uint32_t qbuf = static_cast<uint32_t>(__cvta_generic_to_shared(ring_all)) +
                        kPipeWarps * kPipeStages * kPipeStageBytes;
  uint64_t loaded_q = ~0ull;
  if constexpr (ONEQ) {
    const uint64_t qb = a.q.Begin(0);
    CopyQueryRows<MT, kPipeWarps>(a, qb, a.q.End(0) - qb, qbuf);
    CpAsyncCommit();
  }
  if (has_pairs) {
    if constexpr (FOLD == 0) {
#pragma unroll
      for (int s = 0; s < kPipeStages - 1; ++s) produce();
    } else {  // one copy of produce() for the prologue (LaunchPipe)
#pragma unroll 1
      for (int s = 0; s < kPipeStages - 1; ++s) produce();
    }
  }

  uint4 qa[MT][4], qc[MT][4];
  if constexpr (ONEQ) {
    // The query's group is the oldest: it is complete once at most the prologue's groups are pending (a warp
    // without pairs committed none).
    if (has_pairs) {
      CpAsyncWait<kPipeStages - 1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    LdsmQueryFragments<MT>(qbuf, lane, qa, qc);
  }
  if (!has_pairs) return;
  uint32_t consumed = 0;
  // Dot, no document mask: whole steps skip FoldTile's per-column tests (below), and fold values alone unless
  // the call asks for argmax.
  const bool fast = FOLD != 0 || (!a.cosine && a.d.mask == nullptr);
  const bool want_arg = FOLD == 0 ? a.pairs.argmax != nullptr : FOLD == 2;
  const bool check = a.bad != nullptr;
  for (uint64_t p = range.begin; p < range.end; ++p) {
    uint64_t qi, dj;
    a.pairs.Resolve(p, &qi, &dj);
    const uint64_t db = a.d.Begin(dj), ld = a.d.End(dj) - db;
    const uint64_t qb = a.q.Begin(qi), lq = a.q.End(qi) - qb;
    if (!ONEQ && qi != loaded_q) {
      loaded_q = qi;
      const uint8_t* qbase = a.q.orig + qb * qrb;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const uint64_t ra = mt * 16 + g, rb = ra + 8;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          qa[mt][c] = LdFragNatural(qbase + ra * qrb, c, t, dim, ra < lq);
          qc[mt][c] = LdFragNatural(qbase + rb * qrb, c, t, dim, rb < lq);
        }
      }
    }
    Best<MT> best;
    InitBest(best);
    bool saw_kept = false;
    for (uint64_t base = 0; base < ld; base += kPipeStep) {
      CpAsyncWait<kPipeStages - 2>();
      __syncwarp();
      produce();
      const uint32_t st = ring + (consumed % kPipeStages) * kPipeStageBytes;
      ++consumed;
      FoldRingStep<T, MT, FOLD>(a, st, base, db, ld, qa, qc, fast, want_arg, check, best, saw_kept);
    }
    CheckRowMaxima(fast, check, saw_kept, best);
    const bool doc_nonempty = FOLD == 0 && a.d.mask ? __any_sync(kFull, saw_kept) : ld > 0;
    WriteRows<MT>(a, p, qi, dj, 0, qb, lq, doc_nonempty, best, s_term[warp], s_arg[warp]);
    __syncwarp();
  }
  CpAsyncWait<0>();
}

// The ring's shared memory: W x S stages, and the query's rows behind them in a one-query launch only (other
// launches leave that 8 KB to L1, which their per-warp query loads go through).
constexpr int kPipeWarpsUsed = 8, kPipeStagesUsed = 3;  // LaunchPipe's shape (its comment says why)
constexpr int kPipeStaticBytes = kPipeWarpsUsed * 32 * (4 + 4);  // s_term and s_arg, 32 rows at most
constexpr int PipeDynamicBytes(bool one_query) {
  return kPipeWarpsUsed * kPipeStagesUsed * kPipeStageBytes + (one_query ? kRingQueryBytes : 0);
}

template <typename T, int MT, int W, int S, int FOLD, bool ONEQ>
cudaError_t LaunchPipeWSQ(const ForwardArgs& a, int sms, cudaStream_t stream) {
  static_assert(W == kPipeWarpsUsed && S == kPipeStagesUsed, "PipeDynamicBytes sizes LaunchPipe's shape");
  constexpr int smem = PipeDynamicBytes(ONEQ);  // PipeFitsSharedMemory admitted it
  const cudaError_t e = AllowDynamicSmemOnce<ExactTcPipeKernel<T, MT, W, S, FOLD, ONEQ>>(smem);
  if (e != cudaSuccess) return e;
  const uint64_t n_warps = static_cast<uint64_t>(sms) * W;
  ExactTcPipeKernel<T, MT, W, S, FOLD, ONEQ><<<static_cast<unsigned>(sms), W * 32, smem, stream>>>(a, n_warps);
  return cudaGetLastError();
}

template <typename T, int MT, int W, int S, int FOLD>
cudaError_t LaunchPipeWS(const ForwardArgs& a, int sms, cudaStream_t stream) {
  return OneQueryLaunch(a) ? LaunchPipeWSQ<T, MT, W, S, FOLD, true>(a, sms, stream)
                           : LaunchPipeWSQ<T, MT, W, S, FOLD, false>(a, sms, stream);
}

// Ring shape (warps per block x stages of 8 KB, one block per SM): 8x3, the fastest of 8x3, 6x4, 4x7 and 5x5 on
// textual-10k on the H100 (git history keeps the others). The ring streams across document boundaries; a grid of
// one block per pair (the peers' kind of grid) fills its rings at every pair, which only enough pairs per SM or long
// documents hide: dot calls without a document mask that CoopChosen picks (kernels.h; the caller's `coop`) run that
// grid (exact_coop.cu), the others keep the ring.
//
// Dot calls without a document mask (the memory-bound shapes' calls) run a kernel compiled for their fold (FOLD 1
// or 2: no cosine or mask branches, values only or with argmax; the same arithmetic, so the same bits) with one copy
// of produce() in its prologue: 3,632 SASS instructions against the general kernel's 4,688 (bf16, 32 query rows;
// counted before one-query launches copied their query once per block).
// In one H100 call, alternating with the build before it (gpu_bench kernel rows, two rounds each): textual-1k
// 0.0328 / 0.0329 ms against 0.0337 / 0.0336, textual-10k 0.2533 / 0.2531 against 0.2561 / 0.2560,
// colpali-rerank 0.0932 / 0.0934 against 0.0942 / 0.0943; with the prologue unrolled (means of two rounds) 0.0328 /
// 0.2541 / 0.0935 (benchmarks/results/gpu-mem-ring-h100.md). Other calls (cosine, a document mask) keep the general
// kernel.
template <typename T, int MT>
cudaError_t LaunchPipe(const ForwardArgs& a, int sms, bool coop, cudaStream_t stream) {
  constexpr int W = kPipeWarpsUsed, S = kPipeStagesUsed;
  if (coop) return LaunchExactCoop(a, stream);  // never cosine or masked
  if (a.cosine || a.d.mask != nullptr) return LaunchPipeWS<T, MT, W, S, 0>(a, sms, stream);
  return a.pairs.argmax ? LaunchPipeWS<T, MT, W, S, 2>(a, sms, stream) : LaunchPipeWS<T, MT, W, S, 1>(a, sms, stream);
}

}  // namespace

bool PipeFitsSharedMemory(const ForwardArgs& a, int optin_bytes) {
  return PipeDynamicBytes(OneQueryLaunch(a)) + kPipeStaticBytes <= optin_bytes;
}

namespace {

// ---- FFMA ---------------------------------------------------------------------------------------------

constexpr int kFfmaTile = 64;

__global__ void __launch_bounds__(256) ExactFfmaKernel(const ForwardArgs a) {
  __shared__ float sq[32][33];
  __shared__ float sd[kFfmaTile][33];
  const int tid = threadIdx.x, r = tid >> 3, tl = tid & 7;
  const uint32_t G = a.part.groups;
  const uint64_t total = a.pairs.n_pairs * G;
  const uint32_t dim = a.q.dim;
  for (uint64_t task = blockIdx.x; task < total; task += gridDim.x) {
    const uint64_t p = task / G;
    const uint32_t grp = static_cast<uint32_t>(task - p * G);
    uint64_t qi, dj;
    a.pairs.Resolve(p, &qi, &dj);
    const uint64_t qb = a.q.Begin(qi), lq = a.q.End(qi) - qb;
    const uint64_t db = a.d.Begin(dj), ld = a.d.End(dj) - db;
    const uint64_t r0 = static_cast<uint64_t>(grp) * 32;
    if (grp > 0 && r0 >= lq) continue;
    const uint8_t* qbase = a.q.orig + (qb + r0) * a.q.row_bytes;
    const uint8_t* dbase = a.d.orig + db * a.d.row_bytes;
    float best = -INFINITY, chk = 0.0f;
    int idx = -1;
    for (uint64_t tile = 0; tile < ld; tile += kFfmaTile) {
      float acc[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) acc[u] = 0.0f;
      for (uint32_t k0 = 0; k0 < dim; k0 += 32) {
        const uint32_t kn = min(32u, dim - k0);
        __syncthreads();
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const int e = tid + 256 * m, rr = e >> 5, kk = e & 31;
          sq[rr][kk] = (r0 + rr < lq && static_cast<uint32_t>(kk) < kn)
                           ? LoadElem(qbase + rr * a.q.row_bytes, k0 + kk, a.q.dtype)
                           : 0.0f;
        }
#pragma unroll
        for (int m = 0; m < 8; ++m) {
          const int e = tid + 256 * m, rr = e >> 5, kk = e & 31;
          sd[rr][kk] = (tile + rr < ld && static_cast<uint32_t>(kk) < kn)
                           ? LoadElem(dbase + (tile + rr) * a.d.row_bytes, k0 + kk, a.d.dtype)
                           : 0.0f;
        }
        __syncthreads();
        for (uint32_t kk = 0; kk < kn; ++kk) {
          const float qv = sq[r][kk];
#pragma unroll
          for (int u = 0; u < 8; ++u) acc[u] = fmaf(qv, sd[tl + 8 * u][kk], acc[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const uint64_t n = tile + tl + 8 * u;
        if (n < ld && a.d.Kept(db + n)) {
          chk = MaxNaN(chk, fabsf(acc[u]));
          const float key = a.cosine ? acc[u] * InvNorm(RowNorm(a.d, db + n)) : acc[u];
          if (key > best) {
            best = key;
            idx = static_cast<int>(n);
          }
        }
      }
    }
    MergeBest(best, idx, 1);
    MergeBest(best, idx, 2);
    MergeBest(best, idx, 4);
    ReportCheck(a, chk);
    const uint64_t row = r0 + r;
    if (tl == 0 && row < lq) {
      float term = 0.0f;
      int arg = -1;
      if (a.q.Kept(qb + row)) {
        term = a.cosine ? best * InvNorm(RowNorm(a.q, qb + row)) : best;
        arg = idx;
      }
      const uint64_t slot = (p * G + grp) * a.part.group_rows + r;
      a.part.term[slot] = term;
      a.part.arg[slot] = arg;
    }
  }
}

// ---- finalize: partials -> scores, argmax ---------------------------------------------------------------

__global__ void FinalizeKernel(const ForwardArgs a) {
  const int lane = threadIdx.x & 31;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * (blockDim.x >> 5);
  for (uint64_t p = static_cast<uint64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
       p < a.pairs.n_pairs; p += warps) {
    uint64_t qi, dj;
    a.pairs.Resolve(p, &qi, &dj);
    const uint64_t qb = a.q.Begin(qi), lq = a.q.End(qi) - qb;
    const uint64_t db = a.d.Begin(dj), ld = a.d.End(dj) - db;
    bool nonempty = ld > 0;
    if (nonempty && a.d.mask) {
      bool any = false;
      for (uint64_t r = lane; r < ld && !any; r += 32) any = a.d.mask[db + r] != 0;
      nonempty = __any_sync(kFull, any);
    }
    const uint64_t slot0 = p * a.part.groups * a.part.group_rows;
    // The pair's score is its row terms summed in double in token order (OrderedSum, the CPU). Lane l first adds
    // terms l, l + 32, ... (eight loads in flight), noting their exponent fields (TermSpan); where ordered_sum.h's
    // rule holds, every order of addition gives the token-order double, so the lanes' sums meet in a tree
    // (WarpTreeSum). Else every lane runs the chain in token order: rows past lq count as +0.0, which changes no sum
    // (the sum starts at +0 and can never be -0, and x + 0 == x for every other x), so every chunk is a full,
    // unrolled 32 whose shuffles do not wait on the chain, with the next chunk's load in flight meanwhile.
    const float* term = a.part.term + slot0;
    TermSpan span;
    double part = 0.0;
    uint64_t r = lane;
    for (; r + 7 * 32 < lq; r += 8 * 32) {
      float v[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = term[r + 32 * k];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        span.Add(v[k]);
        part += static_cast<double>(v[k]);
      }
    }
    for (; r < lq; r += 32) {
      const float v = term[r];
      span.Add(v);
      part += static_cast<double>(v);
    }
    double sum = 0.0;
    if (span.Exact(lq)) {
      sum = WarpTreeSum(part);
    } else {
      float v = lane < lq ? term[lane] : 0.0f;
      for (uint64_t s0 = 0; s0 < lq; s0 += 32) {
        const float next = s0 + 32 + lane < lq ? term[s0 + 32 + lane] : 0.0f;
#pragma unroll
        for (int k = 0; k < 32; ++k) sum += static_cast<double>(__shfl_sync(kFull, v, k));
        v = next;
      }
    }
    if (lane == 0) *a.pairs.ScorePtr(p, qi, dj) = nonempty ? RoundScore(sum) : -INFINITY;
    int32_t* am = a.pairs.ArgmaxPtr(p, qi, dj, qb - a.q.Begin(0), lq);
    if (am) {
      for (uint64_t s = lane; s < lq; s += 32) am[s] = nonempty ? a.part.arg[slot0 + s] : -1;
    }
  }
}

// ---- dense row check + norms --------------------------------------------------------------------------

__global__ void RowCheckKernel(const SetsView s, uint64_t row_begin, uint64_t row_end, float* norms,
                               unsigned long long* flag) {
  const int lane = threadIdx.x & 31;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * (blockDim.x >> 5);
  for (uint64_t r = row_begin + static_cast<uint64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
       r < row_end; r += warps) {
    double sq = 0.0;
    const bool bad = RowFails(s, r, lane, &sq);
    if (lane == 0) {
      if (bad) atomicMin(flag, static_cast<unsigned long long>(r) + 1);
      if (norms) norms[r] = static_cast<float>(sqrt(sq));
    }
  }
}

unsigned GridFor(uint64_t items, unsigned per_block, unsigned cap = 65535u * 4) {
  const uint64_t b = (items + per_block - 1) / per_block;
  return static_cast<unsigned>(b == 0 ? 1 : (b > cap ? cap : b));
}

}  // namespace

bool TcSupported(const SetsView& q, const SetsView& d) {
  if (q.dtype != d.dtype || q.dtype == kF32 || q.dim != d.dim || q.dim % 8 != 0) return false;
  auto aligned = [](const SetsView& s) {
    return (reinterpret_cast<uintptr_t>(s.orig) % 16) == 0 && s.row_bytes % 16 == 0;
  };
  return aligned(q) && aligned(d);
}

uint32_t TcGroupRows(uint64_t max_lq) { return max_lq <= 16 ? 16 : 32; }

bool TcSmemSupported(const SetsView& q, const SetsView& d, uint64_t max_lq) {
  return TcSupported(q, d) && q.dim > 96 && q.dim <= 128 && max_lq > 32;
}

uint32_t TcSmemGroupRows(uint64_t max_lq) { return max_lq <= 64 ? 64 : max_lq <= 128 ? 128 : 256; }

cudaError_t LaunchExactTcSmem(const ForwardArgs& a, cudaStream_t stream) {
  return a.q.dtype == kBF16 ? LaunchSmemT<__nv_bfloat16>(a, stream) : LaunchSmemT<__half>(a, stream);
}

cudaError_t LaunchExactTc(const ForwardArgs& a, cudaStream_t stream) {
  const bool bf16 = a.q.dtype == kBF16;
  if (a.part.group_rows == 16) {
    return bf16 ? LaunchTcMt<__nv_bfloat16, 1>(a, stream) : LaunchTcMt<__half, 1>(a, stream);
  }
  return bf16 ? LaunchTcMt<__nv_bfloat16, 2>(a, stream) : LaunchTcMt<__half, 2>(a, stream);
}

cudaError_t LaunchExactFfma(const ForwardArgs& a, cudaStream_t stream) {
  const uint64_t tasks = a.pairs.n_pairs * a.part.groups;
  if (tasks == 0) return cudaSuccess;
  ExactFfmaKernel<<<GridFor(tasks, 1, 1u << 20), 256, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t LaunchFinalize(const ForwardArgs& a, cudaStream_t stream) {
  if (a.pairs.n_pairs == 0) return cudaSuccess;
  FinalizeKernel<<<GridFor(a.pairs.n_pairs, 8, 1u << 20), 256, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t LaunchRowCheck(const SetsView& s, uint64_t row_begin, uint64_t row_end, float* norms,
                           unsigned long long* flag, cudaStream_t stream) {
  if (row_end <= row_begin) return cudaSuccess;
  RowCheckKernel<<<GridFor(row_end - row_begin, 8, 1u << 16), 256, 0, stream>>>(s, row_begin, row_end, norms,
                                                                                flag);
  return cudaGetLastError();
}

}  // namespace mscuda
