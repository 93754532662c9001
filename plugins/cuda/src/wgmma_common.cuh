// SPDX-License-Identifier: Apache-2.0
// Hopper (sm_90a) building blocks shared by the wgmma kernels (exact_wgmma.cu: exact forward; screen_wgmma.cu:
// certified int8 screening): shared-memory descriptors, wgmma fences and groups, mbarriers, and the persistent
// grid. The device helpers exist only in the sm_90a compilation pass (MAXSIM_HAVE_WGMMA); kernels that use them
// compile to an empty body elsewhere and their host side asks WgmmaAvailable() before launching.
#ifndef MAXSIM_PLUGINS_CUDA_WGMMA_COMMON_CUH_
#define MAXSIM_PLUGINS_CUDA_WGMMA_COMMON_CUH_

#include <stdint.h>

#include <algorithm>

#include "device_common.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MAXSIM_HAVE_WGMMA 1
#endif

namespace mscuda {

#if defined(MAXSIM_HAVE_WGMMA)

// Shared-memory matrix descriptor: 128-byte swizzle, K-major, 8-row groups 1024 bytes apart. Its low word holds
// the address field (addr >> 4) and the leading byte offset, its high word (stride byte offset, swizzle mode) is
// the same for every address: a kernel that steps through a stage adds to the low word alone (exact_wgmma.cu).
constexpr uint32_t kSmemDescHi = 64u | (1u << 30);
__device__ __forceinline__ uint32_t SmemDescLo(uint32_t addr) { return ((addr & 0x3FFFFu) >> 4) | (1u << 16); }
__device__ __forceinline__ uint64_t SmemDesc(uint32_t addr) {
  return (static_cast<uint64_t>(kSmemDescHi) << 32) | SmemDescLo(addr);
}

// cp.async writes through the generic proxy; wgmma reads through the async proxy.
__device__ __forceinline__ void FenceProxyAsync() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void WgFence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void WgCommit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void WgWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// mbarriers (shared::cta): init, arrive, the cp.async arrive (fires when this thread's prior copies land; it
// does not add to the pending count, so the init count includes it), and the parity wait.
__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void MbarArriveCopies(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// The cp.async arrive that first adds one to the pending count (so that it nets out: a warp's lanes each arrive this
// way and one lane then arrives as the producer; exact_wgmma.cu's batch producer).
__device__ __forceinline__ void MbarArriveCopiesInc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Bulk tensor copies (TMA): an arrive that also expects `bytes` of copies to complete on the barrier, and one 2-D
// box of the tensor map at `map` (a __grid_constant__ kernel parameter), x the inner (dimension) coordinate and y
// the row, to shared memory at dst, completing on bar.
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void TmaLoad2d(uint32_t dst, const void* map, int x, int y, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}

// Keeps the compiler from moving accumulator reads across a wgmma wait.
template <int V>
__device__ __forceinline__ void PinAcc(float (&d)[V]) {
#pragma unroll
  for (int i = 0; i < V; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int V>
__device__ __forceinline__ void PinAcc(int (&d)[V]) {
#pragma unroll
  for (int i = 0; i < V; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

// Where the 16-byte piece pc (dims 8pc .. 8pc + 7) of stage token `tok` goes: the natural K-major layout with
// the 128-byte swizzle, in two k regions (dims 0..63 and 64..127) kRegion bytes apart; 16-byte chunk pc % 8 of
// the token's 128-byte row in region pc / 8 is stored at chunk (pc % 8) ^ (tok % 8).
template <uint32_t kRegion>
__device__ __forceinline__ uint32_t PieceOffset(int pc, int tok) {
  return static_cast<uint32_t>(pc >> 3) * kRegion + static_cast<uint32_t>(tok) * 128u +
         (static_cast<uint32_t>((pc & 7) ^ (tok & 7)) << 4);
}
// Copies this thread's share of one stage: 16-byte piece pc of stage tokens tok0, tok0 + kStep, ...
// (kCount of them, kCount * kStep tokens in the stage), i.e. of document rows n0 + tok (drb bytes apart from
// dbase), to PieceOffset<kRegion>(pc, tok) of the stage at st; rows at or past ld and pieces past the dimension
// as zeros, or with kRepeatLast, rows at or past ld as copies of row ld - 1 (ld > n0: a stage starts inside the
// document), so that a fold of maxima over the stage's columns needs no per-column test (exact_wgmma.cu's batch
// and pair kernels; screening keeps zeros). A whole stage (the common case) takes a path without predicates:
// kStep is a multiple of 8, so the swizzle phase tok % 8 is the same for all of a thread's tokens and token
// tok0 + kStep * i lands 128 * kStep * i bytes after token tok0: each copy is one cp.async with an immediate
// shared-memory offset and a strided source (the predicated path of a partial stage too). Used by the producers
// of exact_wgmma.cu (16-bit document rows, two k regions) and screen_wgmma.cu (128-byte int8 code rows: pieces
// 0..7 of one region). (The general path's per-copy index, predicate and swizzle arithmetic made the producer
// warpgroup issue ~1000 instructions per 64 KB stage, and the visual shape several percent slower in gpu_bench.)
template <uint32_t kRegion, int kCount, int kStep, bool kRepeatLast = false>
__device__ __forceinline__ void CopyStagePieces(uint32_t st, int pc, int tok0, bool pc_in_dim, const uint8_t* dbase,
                                                uint64_t drb, uint64_t n0, uint64_t ld) {
  static_assert(kStep % 8 == 0, "a thread's tokens must share the swizzle phase");
  const uint32_t dst = st + PieceOffset<kRegion>(pc, tok0);
  if (pc_in_dim && n0 + kCount * kStep <= ld) {
    const uint8_t* src = dbase + (n0 + tok0) * drb + pc * 16;
#pragma unroll 8
    for (int i = 0; i < kCount; ++i) CpAsync16(dst + 128u * kStep * i, src + i * kStep * drb, true);
  } else if constexpr (kRepeatLast) {
    // A partial stage (or pieces past the dimension): rows last + 1.. of the stage copy row last.
    // Stage-relative row numbers in 32 bits: one minimum and one multiply-add per copy (the empty asm keeps the
    // compiler from folding row0 back into a 64-bit row number and multiplying that per copy).
    const uint32_t last = static_cast<uint32_t>(std::min<uint64_t>(ld - n0, kCount * kStep)) - 1;
    const uint8_t* row0 = dbase + n0 * drb + pc * 16;
    asm("" : "+l"(row0));
#pragma unroll 8
    for (int i = 0; i < kCount; ++i) {
      const uint32_t r = std::min(static_cast<uint32_t>(tok0 + kStep * i), last);
      CpAsync16(dst + 128u * kStep * i, row0 + r * drb, pc_in_dim);
    }
  } else {
#pragma unroll 8
    for (int i = 0; i < kCount; ++i) {
      const uint64_t n = n0 + tok0 + kStep * i;
      const bool pred = pc_in_dim && n < ld;
      CpAsync16(dst + 128u * kStep * i, dbase + (pred ? n * drb + pc * 16 : 0), pred);
    }
  }
}

#endif  // MAXSIM_HAVE_WGMMA

// A position in a ring of S stages: the slot, the mbarrier phase parity of the current lap, and whether a lap
// has been completed (a producer waits for a slot's "empty" barrier only from its second lap on, with parity
// phase ^ 1; a consumer waits for "full" with parity phase). Stepped instead of computed as count % S and
// (count / S) & 1: no 64-bit division per stage, and correct for any number of stages.
struct RingPos {
  uint32_t slot = 0, phase = 0;
  bool lapped = false;
  __device__ __forceinline__ void Advance(uint32_t S) {
    if (++slot == S) {
      slot = 0;
      phase ^= 1;
      lapped = true;
    }
  }
};

// Where the producer of a persistent pair-launch block stands in its stream of stages: stage `tile` of pair `pair`
// (document rows from db, ld tokens), over pairs c0, c0 + cpg, ... with rows in the block's row group grp (r0b: its
// first row), kTokens document tokens per stage. Pairs without rows here and empty documents have no stages and
// are skipped, as the consumers skip them.
template <int kTokens>
struct StageCursor {
  uint64_t pair, tile = 0, tiles = 0, db = 0, ld = 0;
  const uint64_t cpg, units;
  const uint32_t grp, r0b;

  __device__ StageCursor(const ForwardArgs& a, uint64_t c0, uint64_t cpg_, uint32_t grp_, uint32_t r0b_)
      : pair(c0), cpg(cpg_), units(a.Units()), grp(grp_), r0b(r0b_) {
    if (pair < units) tiles = PairTiles(a);
    Skip(a);
  }
  __device__ bool Active(const ForwardArgs&) const { return pair < units; }
  // Moves past the stage just copied.
  __device__ void Advance(const ForwardArgs& a) {
    ++tile;
    Skip(a);
  }

 private:
  __device__ uint64_t PairTiles(const ForwardArgs& a) {
    uint64_t qi = 0, dj = pair;
    a.pairs.Resolve(pair, &qi, &dj);
    db = a.d.Begin(dj);
    ld = a.d.End(dj) - db;
    const uint64_t lq = a.q.End(qi) - a.q.Begin(qi);
    if (grp > 0 && r0b >= lq) return 0;
    return (ld + kTokens - 1) / kTokens;
  }
  __device__ void Skip(const ForwardArgs& a) {
    while (pair < units && tile >= tiles) {
      pair += cpg;
      tile = 0;
      tiles = pair < units ? PairTiles(a) : 0;
    }
  }
};

// The pairs a persistent pair-launch block serves: c0, c0 + cpg, ... below units (BatchItems' interface).
struct PairWalk {
  uint64_t unit, step, units;
  __device__ bool Active() const { return unit < units; }
  __device__ uint64_t Unit() const { return unit; }
  __device__ void Next(const ForwardArgs&) { unit += step; }
};

// The work items of this block in a batch launch (QueryBatch): (row group grp, document Unit()), items
// [b W / B, (b + 1) W / B) of the order range, group, document (W = G x nd items, B = gridDim.x, b = blockIdx.x),
// so the block counts differ by at most one item. The divisions run once, at the block's start; 32-bit state
// (BatchGrid and WgmmaBatchUsable keep the documents and a block's items below 2^32), which keeps the kernel
// within its 128 registers.
struct BatchItems {
  uint32_t doc = 0;    // the current document
  uint32_t start = 0;  // the current range's first document (its end: End)
  uint32_t left = 0;   // items left, the current one included
  uint32_t grp = 0;

  __device__ explicit BatchItems(const ForwardArgs& a) {
    const uint64_t G = a.part.groups, nd = a.pairs.nd, R = a.batch.range;
    if (R == 0) return;  // not a batch launch
    const uint64_t W = G * nd, B = gridDim.x, b = blockIdx.x;
    const uint64_t per = W / B, extra = W % B;
    left = static_cast<uint32_t>(per + (b < extra ? 1 : 0));
    if (left == 0) return;
    const uint64_t w0 = b * per + (b < extra ? b : extra);
    const uint64_t k = w0 / (G * R);
    const uint64_t first = k * R, size = nd - first < R ? nd - first : R;
    const uint64_t rem = w0 - k * G * R;
    grp = static_cast<uint32_t>(rem / size);
    start = static_cast<uint32_t>(first);
    doc = static_cast<uint32_t>(first + (rem - grp * size));
  }
  __device__ bool Active() const { return left > 0; }
  __device__ uint64_t Unit() const { return doc; }  // the document
  __device__ void Next(const ForwardArgs& a) {
    --left;
    const uint32_t nd = static_cast<uint32_t>(a.pairs.nd), r = static_cast<uint32_t>(a.batch.range);
    const uint32_t end = nd - start < r ? nd : start + r;
    if (++doc < end) return;
    if (++grp < a.part.groups) {
      doc = start;
      return;
    }
    grp = 0;
    start = end;
  }
};

// The producer's stream of stages in a batch launch: stage `tile` of the document of the current item (BatchItems;
// the stages of a document do not depend on the row group), empty documents skipped, as the consumers skip them.
template <int kTokens>
struct BatchStageCursor {
  BatchItems items;
  uint64_t db = 0;
  uint32_t tile = 0, ld = 0;

  __device__ explicit BatchStageCursor(const ForwardArgs& a) : items(a) {
    Load(a);
    Skip(a);
  }
  __device__ bool Active(const ForwardArgs&) const { return items.Active(); }
  __device__ void Advance(const ForwardArgs& a) {
    ++tile;
    Skip(a);
  }

 private:
  __device__ void Load(const ForwardArgs& a) {
    tile = 0;
    if (!items.Active()) return;
    db = a.d.Begin(items.Unit());
    ld = static_cast<uint32_t>(a.d.End(items.Unit()) - db);  // a set has fewer than 2^31 tokens (corpus.cc)
  }
  // Past the document's stages (an empty document has none).
  __device__ void Skip(const ForwardArgs& a) {
    while (items.Active() && tile * kTokens >= ld) {
      items.Next(a);
      Load(a);
    }
  }
};

// The persistent grid of the wgmma pair kernels: bps resident blocks per SM, the G row-group blocks of a pair at a
// time (so a document is read from memory once and then from L2); block (c, grp) serves row group grp of pairs c,
// c + cpg, c + 2 cpg, ... False when the grid is too large to launch.
inline bool PersistentGrid(const ForwardArgs& a, int bps, uint64_t* cpg, uint64_t* blocks) {
  const uint64_t G = a.part.groups;
  const uint64_t per_group = std::max<uint64_t>(1, static_cast<uint64_t>(bps) * SmCount() / G);
  *cpg = std::min<uint64_t>(per_group, a.Units());
  *blocks = G * *cpg;
  return *blocks <= 0x7fffffffull;
}

// The grid of a batch launch (QueryBatch, BatchItems): the most blocks, up to bps per SM, that is a multiple of G / q
// for some q <= spread dividing G. Then gcd(B, G) >= G / spread blocks walk each document range at the same time
// (reading a document from memory once and from L2 for the others), each block serving at most about `spread` row
// groups of its range in turn (spread 1: every block one group of one range; the G groups' blocks read each
// document together). 8 groups on 132 SMs: 128 blocks with spread 1, all 132 with spread 2. The ranges: K =
// B / gcd(B, G) of ceil(nd / K) documents, so that the G x K (range, group) runs fall G / gcd(B, G) to a block.
// Without such a multiple (G > bps x SMs): one block per group. Fewer blocks than items: one item a block.
inline bool BatchGrid(const ForwardArgs& a, int bps, uint32_t spread, uint64_t* blocks, uint64_t* range) {
  const uint64_t G = a.part.groups, nd = a.pairs.nd, most = static_cast<uint64_t>(bps) * SmCount();
  uint64_t b = 0;
  for (uint64_t q = 1; q <= std::max<uint32_t>(spread, 1); ++q) {
    if (G % q == 0) b = std::max(b, most / (G / q) * (G / q));
  }
  if (b == 0) b = G;
  b = std::min(b, G * nd);
  uint64_t x = b, y = G;  // gcd(b, G)
  while (y != 0) {
    const uint64_t t = x % y;
    x = y;
    y = t;
  }
  const uint64_t k = b / x;
  *blocks = b;
  *range = std::max<uint64_t>(1, (nd + k - 1) / k);
  return b >= 1 && b <= 0x7fffffffull && nd <= 0xffffffffull && (G * nd + b - 1) / b <= 0xffffffffull;
}

}  // namespace mscuda

#endif  // MAXSIM_PLUGINS_CUDA_WGMMA_COMMON_CUH_
