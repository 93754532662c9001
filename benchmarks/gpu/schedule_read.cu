// SPDX-License-Identifier: Apache-2.0
// Copy-only twins of the exact ring kernels: the documents read with the scoring kernel's own schedule, nothing
// computed. If a twin takes about as long as its kernel, that kernel's time on the shape is bounded by the
// schedule and the bandwidth it gets, not by its arithmetic; if the twin is much faster, the arithmetic or the
// fold is what costs. The dealt kernel's twin (LaunchDealtScheduleRead) is read the same way, and so are schedules
// that no kernel runs, as ceilings for one (LaunchSpreadScheduleRead).
//
// The ring's and the grid's twins run the plugin's own device code for what they keep: the pair split
// (PairRange), the step cursor across document boundaries (StepCursor), the 16-byte cp.async copies of a 32-token
// step under the L2 evict-first policy (CopyRingStep, EvictFirstPolicy), and the same waits
// (cp.async.wait_group S - 2 and __syncwarp before each step, a copy issued before the step is used, wait_group 0
// at the end). What differs from the scoring kernels, and nothing else:
//  - in place of a step's ldmatrix fragments, mma and fold, each lane reads one 4-byte word of the stage (row
//    `lane`, a conflict-free word) and XORs it into a running word, a dependency on the copied bytes;
//  - the query: the ring twin takes it as the ring does: in a one-query launch the block copies it once into
//    shared memory (CopyQueryRows, its own cp.async group ahead of the rings', one block barrier) and each lane
//    reads one word back in place of the ldmatrix fragments; otherwise each warp loads its fragments from global
//    memory (LdFragNatural, once per query) and XORs them in. The grid twin stages it into warp 0's free stage
//    with StageQuery's loads, stores and two block barriers, and reads one word per lane back in place of the
//    ldmatrix fragments;
//  - the end of a pair: the ring twin's lane 0 writes the running word as one float at the pair's score slot (the
//    ring: a quad merge, the ordered double sum of the row terms, the same one store); the grid twin's warps meet
//    at one block barrier (MergeAndWrite's) and thread 0 writes one float.
// The shapes are restated here (they live in exact.cu's LaunchPipe and exact_coop.cu's constants): keep them equal.
#include <stdint.h>

#include <algorithm>

#include "forward_common.cuh"
#include "ring_common.cuh"
#include "schedule_read.h"

namespace {

using mscuda::ForwardArgs;
using mscuda::kRingQueryBytes;
using mscuda::kRingStageBytes;
using mscuda::kRingStep;

constexpr int kRingWarps = 8, kRingStages = 3;                    // exact.cu: LaunchPipeWS<T, MT, 8, 3, FOLD>
constexpr int kGridWarps = 4, kGridStages = 2, kGridPerSm = 3;  // exact_coop.cu: kCoopWarps, kCoopStages, ...
constexpr int kDealtWarps = 12, kDealtStages = 2, kDealtRound = 8;  // exact_dealt.cu: kDealtWarps, ...

// One word of row `lane` of a stage (word `lane`, so the 32 lanes hit 32 banks).
__device__ __forceinline__ uint32_t TouchStage(uint32_t stage, int lane) {
  uint32_t v;
  const uint32_t addr = stage + static_cast<uint32_t>(lane) * (mscuda::kRingRowBytes + 4);
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}

// One step of a ring's consumer, as both kernels take it: wait for the oldest copy group but S - 2, __syncwarp,
// issue the next step's copies (into the stage consumed last), then use this step's stage (TouchStage).
template <int S, typename Produce>
__device__ __forceinline__ uint32_t ConsumeStep(uint32_t ring, uint32_t& consumed, Produce& produce, int lane) {
  mscuda::CpAsyncWait<S - 2>();
  __syncwarp();
  produce();
  const uint32_t st = ring + (consumed % S) * kRingStageBytes;
  ++consumed;
  return TouchStage(st, lane);
}

__device__ __forceinline__ uint32_t Xor4(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

template <int MT, int W, int S>
__global__ void __launch_bounds__(W * 32, 1) RingScheduleKernel(const ForwardArgs a, uint64_t n_warps) {
  extern __shared__ __align__(128) uint8_t ring_all[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const uint64_t wid = static_cast<uint64_t>(blockIdx.x) * W + warp;
  const mscuda::PairRange range(a.pairs.n_pairs, wid, n_warps);
  const bool has_pairs = range.begin < range.end;
  const uint64_t policy = mscuda::EvictFirstPolicy();
  const uint32_t dim = a.q.dim;
  const uint64_t qrb = a.q.row_bytes, drb = a.d.row_bytes;
  const uint32_t ring = static_cast<uint32_t>(__cvta_generic_to_shared(ring_all)) +
                        static_cast<uint32_t>(warp) * (S * kRingStageBytes);
  mscuda::StepCursor<kRingStep> cur(a, range);
  uint32_t produced = 0;
  auto produce = [&]() {
    if (cur.Active()) {
      mscuda::CopyRingStep(ring + (produced % S) * kRingStageBytes, a.d.orig + cur.first_row * drb, cur.token,
                           cur.len, drb, dim, policy, lane);
      ++produced;
      cur.Advance(a);
    }
    mscuda::CpAsyncCommit();
  };
  const bool one_query = mscuda::OneQueryLaunch(a);
  const uint32_t qbuf = static_cast<uint32_t>(__cvta_generic_to_shared(ring_all)) + W * S * kRingStageBytes;
  if (one_query) {
    const uint64_t qb = a.q.Begin(0);
    mscuda::CopyQueryRows<MT, W>(a, qb, a.q.End(0) - qb, qbuf);
    mscuda::CpAsyncCommit();
  }
  if (has_pairs) {
#pragma unroll 1
    for (int s = 0; s < S - 1; ++s) produce();
  }
  uint32_t acc = 0, consumed = 0;
  uint64_t loaded_q = ~0ull;
  if (one_query) {
    if (has_pairs) {
      mscuda::CpAsyncWait<S - 1>();
    } else {
      mscuda::CpAsyncWait<0>();
    }
    __syncthreads();
    acc = TouchStage(qbuf, lane);
    loaded_q = 0;
  }
  if (!has_pairs) return;
  for (uint64_t p = range.begin; p < range.end; ++p) {
    uint64_t qi, dj;
    a.pairs.Resolve(p, &qi, &dj);
    const uint64_t ld = a.d.End(dj) - a.d.Begin(dj);
    if (qi != loaded_q) {
      loaded_q = qi;
      const uint64_t qb = a.q.Begin(qi), lq = a.q.End(qi) - qb;
      const uint8_t* qbase = a.q.orig + qb * qrb;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const uint64_t ra = mt * 16 + g, rb = ra + 8;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          acc ^= Xor4(mscuda::LdFragNatural(qbase + ra * qrb, c, t, dim, ra < lq)) ^
                 Xor4(mscuda::LdFragNatural(qbase + rb * qrb, c, t, dim, rb < lq));
        }
      }
    }
    for (uint64_t base = 0; base < ld; base += kRingStep) {
      acc ^= ConsumeStep<S>(ring, consumed, produce, lane);
    }
    if (lane == 0) *a.pairs.ScorePtr(p, qi, dj) = __uint_as_float(acc);
    __syncwarp();
  }
  mscuda::CpAsyncWait<0>();
}

// The ring kernels' tensor-core instructions on one 32-token step, without their ldmatrix fragments or merges (the
// with_mma twins: LaunchDealtScheduleRead's and LaunchGridScheduleRead's), in FoldRingStep's order: per tile of 8
// tokens, MT accumulators from zero, 4 chunks of 32 dimensions x 2 mma.sync m16n8k16 each (bf16, f32; 8 per chain, as
// the ring's 256-byte rows always take), then the scores-only fold (fmaxf of the tile into the row maxima): 64 mma
// per step for a 32-row query.
// A is per-lane constants near 1 (in place of the query fragments the kernel holds in registers); B is the stage's
// word (the copied bytes, in place of the ldmatrix fragments), so the instructions wait on the copy as the kernel's do.
template <int MT>
__device__ __forceinline__ void StepMma(float (&best)[MT][2], uint32_t word, int lane) {
  const uint32_t a = 0x3F803F80u ^ (static_cast<uint32_t>(lane) << 4);
  constexpr int kChunks = static_cast<int>(mscuda::kRingRowBytes) / 64;  // 32 dimensions each
#pragma unroll
  for (int u = 0; u < mscuda::kRingStep / 8; ++u) {
    float acc[MT][4] = {};
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const uint32_t b = word ^ static_cast<uint32_t>((u * kChunks + c) << 7);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mscuda::Mma16<__nv_bfloat16>::Run(acc[mt], a ^ mt, a ^ 0x10u, a ^ 0x20u, a ^ 0x30u, b, b ^ 0x100u);
        mscuda::Mma16<__nv_bfloat16>::Run(acc[mt], a ^ 0x40u, a ^ 0x50u, a ^ 0x60u, a ^ mt, b ^ 0x200u, b ^ 0x300u);
      }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      best[mt][0] = fmaxf(best[mt][0], fmaxf(acc[mt][0], acc[mt][1]));
      best[mt][1] = fmaxf(best[mt][1], fmaxf(acc[mt][2], acc[mt][3]));
    }
  }
}

// A with_mma twin's row maxima over one pair's (or document's) steps: StepMma on each step's word, and the maxima's
// words for the pair's word, so that the instructions are not dead code. MMA_MT 0: nothing (the copy-only twins).
template <int MMA_MT>
struct MmaFold {
  float best[MMA_MT > 0 ? MMA_MT : 1][2];
  __device__ MmaFold() {
#pragma unroll
    for (auto& r : best) r[0] = r[1] = -INFINITY;
  }
  __device__ __forceinline__ void Step(uint32_t word, int lane) {
    if constexpr (MMA_MT > 0) StepMma<MMA_MT>(best, word, lane);
  }
  __device__ __forceinline__ uint32_t Word() const {
    uint32_t w = 0;
    if constexpr (MMA_MT > 0) {
#pragma unroll
      for (const auto& r : best) w ^= __float_as_uint(r[0]) ^ __float_as_uint(r[1]);
    }
    return w;
  }
};

// StageQuery's reads of the query (exact_coop.cu): rows into `qbuf` in the ring's layout, two block barriers;
// returns one word per lane of it in place of the ldmatrix fragments.
template <int MT, int NW>
__device__ __forceinline__ uint32_t StageQueryWord(const ForwardArgs& a, uint64_t qb, uint64_t lq, uint32_t qbuf) {
  mscuda::StoreQueryRows<MT, NW>(a, qb, lq, qbuf);
  __syncthreads();
  const uint32_t w = TouchStage(qbuf, threadIdx.x & 31);
  __syncthreads();
  return w;
}

// MMA_MT > 0: StepMma on every step for a query of up to 16 * MMA_MT rows (MmaFold).
template <int MT, int CW, int S, int BPS, int MMA_MT>
__global__ void __launch_bounds__(CW * 32, BPS) GridScheduleKernel(const ForwardArgs a) {
  extern __shared__ __align__(128) uint8_t grid_smem[];
  __shared__ uint32_t s_acc[CW];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint64_t p = blockIdx.x;
  uint64_t qi, dj;
  a.pairs.Resolve(p, &qi, &dj);
  const uint64_t db = a.d.Begin(dj), ld = a.d.End(dj) - db;
  const uint64_t qb = a.q.Begin(qi), lq = a.q.End(qi) - qb;
  const uint64_t policy = mscuda::EvictFirstPolicy();
  const uint32_t dim = a.q.dim;
  const uint64_t drb = a.d.row_bytes;
  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(grid_smem));
  const uint32_t ring = smem0 + static_cast<uint32_t>(warp) * (S * kRingStageBytes);
  const uint8_t* dbase = a.d.orig + db * drb;
  uint64_t next = static_cast<uint64_t>(warp) * kRingStep;
  uint32_t produced = 0;
  auto produce = [&]() {
    if (next < ld) {
      mscuda::CopyRingStep(ring + (produced % S) * kRingStageBytes, dbase, next, ld, drb, dim, policy, lane);
      ++produced;
      next += static_cast<uint64_t>(CW) * kRingStep;
    }
    mscuda::CpAsyncCommit();
  };
#pragma unroll 1
  for (int s = 0; s < S - 1; ++s) produce();
  uint32_t acc = StageQueryWord<MT, CW>(a, qb, lq, smem0 + (S - 1) * kRingStageBytes);
  uint32_t consumed = 0;
  MmaFold<MMA_MT> fold;
  for (uint64_t base = static_cast<uint64_t>(warp) * kRingStep; base < ld; base += CW * kRingStep) {
    const uint32_t word = ConsumeStep<S>(ring, consumed, produce, lane);
    acc ^= word;
    fold.Step(word, lane);
  }
  mscuda::CpAsyncWait<0>();
  acc ^= fold.Word();
  if (lane == 0) s_acc[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t x = 0;
#pragma unroll
    for (int w = 0; w < CW; ++w) x ^= s_acc[w];
    *a.pairs.ScorePtr(p, qi, dj) = __uint_as_float(x);
  }
}

// LaunchSpreadScheduleRead's kernels (schedule_read.h), over the launch's steps (document k / steps per document),
// spread over all its warps:
//  kCyclic       step k to warp k % W; the warp that reads a document's first step writes the document's word;
//  kCyclicMerge  the same, and after each step the warp merges its stand-in row maxima (one word per lane) into the
//                document's 32 words of `scratch` (atomicMax), fences, and counts the step in the document's counter;
//                the warp that counts the last step takes the 32 words back (atomicExch, leaving zeros), sums them
//                in order, writes the document's word and zeroes the counter: the protocol a scoring kernel on this
//                schedule would run, so the twin costs what its merges cost;
//  kBalanced     warp w the contiguous steps [w N / W', (w + 1) N / W') of the launch's N steps (W' warps in all),
//                so every SM reads as many steps to within one per warp, with no merges (a ceiling).
template <int W, int S, int DEAL>
__global__ void __launch_bounds__(W * 32, 1) SpreadScheduleKernel(const ForwardArgs a, uint64_t ld, uint64_t n_warps,
                                                                 uint32_t* scratch) {
  extern __shared__ __align__(128) uint8_t ring_all[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint64_t wid = static_cast<uint64_t>(blockIdx.x) * W + warp;
  const uint64_t nd = a.pairs.nd, r0 = a.d.Begin(0);
  const uint64_t spd = (ld + kRingStep - 1) / kRingStep, n_steps = nd * spd;
  const bool balanced = DEAL == kBalanced;
  const uint64_t first = balanced ? wid * n_steps / n_warps : wid;
  const uint64_t end = balanced ? (wid + 1) * n_steps / n_warps : n_steps;
  const uint64_t stride = balanced ? 1 : n_warps;
  if (first >= end) return;
  const uint64_t policy = mscuda::EvictFirstPolicy();
  const uint32_t dim = a.q.dim;
  const uint64_t drb = a.d.row_bytes;
  const uint32_t ring = static_cast<uint32_t>(__cvta_generic_to_shared(ring_all)) +
                        static_cast<uint32_t>(warp) * (S * kRingStageBytes);
  uint64_t next = first;
  uint32_t produced = 0;
  auto produce = [&]() {
    if (next < end) {
      const uint64_t p = next / spd, tok = (next - p * spd) * kRingStep;
      mscuda::CopyRingStep(ring + (produced % S) * kRingStageBytes, a.d.orig + (r0 + p * ld) * drb, tok, ld, drb,
                           dim, policy, lane);
      ++produced;
      next += stride;
    }
    mscuda::CpAsyncCommit();
  };
#pragma unroll 1
  for (int s = 0; s < S - 1; ++s) produce();
  uint32_t acc = 0, consumed = 0;
  for (uint64_t k = first; k < end; k += stride) {
    acc ^= ConsumeStep<S>(ring, consumed, produce, lane);
    const uint64_t p = k / spd;
    if constexpr (DEAL == kCyclicMerge) {
      uint32_t* mx = scratch + p * 32;
      uint32_t* count = scratch + nd * 32 + p;
      atomicMax(mx + lane, acc >> 1);
      __threadfence();
      __syncwarp();
      uint32_t last = 0;
      if (lane == 0) last = atomicAdd(count, 1u) == spd - 1;
      if (__shfl_sync(0xffffffffu, last, 0)) {
        __threadfence();
        const uint32_t v = atomicExch(mx + lane, 0u);
        double sum = 0;
#pragma unroll
        for (int r = 0; r < 32; ++r) sum += static_cast<double>(__shfl_sync(0xffffffffu, v, r));
        if (lane == 0) {
          *a.pairs.ScorePtr(p, 0, p) = static_cast<float>(sum);
          *count = 0;
        }
      }
    } else {
      if (lane == 0 && k == p * spd) *a.pairs.ScorePtr(p, 0, p) = __uint_as_float(acc);
    }
  }
  mscuda::CpAsyncWait<0>();
}

// LaunchDealtScheduleRead's kernel (schedule_read.h): the dealt kernel's schedule (exact_dealt.cu: W warps x S
// stages = 12 x 2, rounds of R = 8 documents, one block per SM, at most 32 documents per block): block b of B takes
// documents b, b + B, ..., and the steps of that stream, document after document, go to its warps round-robin
// (step u to warp u % W). Each warp leaves one word per document in shared memory; at the end of every round of R
// documents (and the last) the warps meet at a block barrier, warp w < R writes the XOR of document w's words, and a
// second barrier lets the next round reuse the slots: where the kernel merges its row maxima. Unlike the kernel it
// copies no query (the kernel's query copy is one cp.async group ahead of the rings', and one more barrier), so it
// is a slight ceiling for it. MMA_MT > 0 adds the kernel's tensor-core instructions for a query of up to 16 * MMA_MT
// rows to every step (MmaFold).
template <int W, int S, int R, int MMA_MT>
__global__ void __launch_bounds__(W * 32, 1) DealtScheduleKernel(const ForwardArgs a, uint64_t ld) {
  static_assert(R <= W, "each warp writes at most one document of a round");
  extern __shared__ __align__(128) uint8_t ring_all[];
  __shared__ uint32_t s_word[R][W];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint64_t B = gridDim.x, nd = a.pairs.nd, r0 = a.d.Begin(0);
  const uint64_t spd = (ld + kRingStep - 1) / kRingStep;
  const uint64_t my_docs = nd > blockIdx.x ? (nd - blockIdx.x + B - 1) / B : 0, total = my_docs * spd;
  if (my_docs == 0) return;  // the whole block
  const uint64_t policy = mscuda::EvictFirstPolicy();
  const uint32_t dim = a.q.dim;
  const uint64_t drb = a.d.row_bytes;
  const uint32_t ring = static_cast<uint32_t>(__cvta_generic_to_shared(ring_all)) +
                        static_cast<uint32_t>(warp) * (S * kRingStageBytes);
  uint64_t next = warp;
  uint32_t produced = 0;
  auto produce = [&]() {
    if (next < total) {
      const uint64_t i = next / spd, tok = (next - i * spd) * kRingStep;
      mscuda::CopyRingStep(ring + (produced % S) * kRingStageBytes, a.d.orig + (r0 + (blockIdx.x + i * B) * ld) * drb,
                           tok, ld, drb, dim, policy, lane);
      ++produced;
      next += W;
    }
    mscuda::CpAsyncCommit();
  };
#pragma unroll 1
  for (int s = 0; s < S - 1; ++s) produce();
  uint32_t consumed = 0;
  uint64_t u = warp;
  for (uint64_t i = 0; i < my_docs; ++i) {
    uint32_t acc = 0;
    MmaFold<MMA_MT> fold;
    for (; u < (i + 1) * spd; u += W) {
      const uint32_t word = ConsumeStep<S>(ring, consumed, produce, lane);
      acc ^= word;
      fold.Step(word, lane);
    }
    acc ^= fold.Word();
    const int slot = static_cast<int>(i % R);
    if (lane == 0) s_word[slot][warp] = acc;
    if (slot != R - 1 && i + 1 != my_docs) continue;
    __syncthreads();
    if (warp <= slot && lane == 0) {
      uint32_t x = 0;
#pragma unroll
      for (int w = 0; w < W; ++w) x ^= s_word[warp][w];
      const uint64_t d = blockIdx.x + (i - slot + warp) * B;
      *a.pairs.ScorePtr(d, 0, d) = __uint_as_float(x);
    }
    if (i + 1 != my_docs) __syncthreads();
  }
  mscuda::CpAsyncWait<0>();
}

template <int MMA_MT>
cudaError_t LaunchDealtSchedule(const ForwardArgs& a, uint64_t doc_rows, int sms, cudaStream_t stream) {
  constexpr auto kernel = &DealtScheduleKernel<kDealtWarps, kDealtStages, kDealtRound, MMA_MT>;
  constexpr int smem = kDealtWarps * kDealtStages * kRingStageBytes;
  const cudaError_t e = mscuda::AllowDynamicSmemOnce<kernel>(smem);
  if (e != cudaSuccess) return e;
  const uint64_t blocks = std::min<uint64_t>(static_cast<uint64_t>(sms), a.pairs.nd);
  kernel<<<static_cast<unsigned>(blocks), kDealtWarps * 32, smem, stream>>>(a, doc_rows);
  return cudaGetLastError();
}

// kCyclicMerge's scratch: 32 words and a counter per document, zeroed once and left zeroed by every launch; one
// buffer for the process (gpu_bench's one device).
cudaError_t MergeScratch(uint64_t nd, uint32_t** out) {
  static uint32_t* buf = nullptr;
  static uint64_t have = 0;
  if (nd > have) {
    if (buf) cudaFree(buf);
    buf = nullptr;
    have = 0;
    cudaError_t e = cudaMalloc(&buf, nd * 33 * 4);
    if (e == cudaSuccess) e = cudaMemset(buf, 0, nd * 33 * 4);
    if (e != cudaSuccess) return e;
    have = nd;
  }
  *out = buf;
  return cudaSuccess;
}

template <int DEAL>
cudaError_t LaunchSpread(const ForwardArgs& a, uint64_t doc_rows, int sms, cudaStream_t stream) {
  constexpr auto kernel = &SpreadScheduleKernel<kRingWarps, kRingStages, DEAL>;
  constexpr int smem = kRingWarps * kRingStages * kRingStageBytes;
  cudaError_t e = mscuda::AllowDynamicSmemOnce<kernel>(smem);
  uint32_t* scratch = nullptr;
  if (e == cudaSuccess && DEAL == kCyclicMerge) e = MergeScratch(a.pairs.nd, &scratch);
  if (e != cudaSuccess) return e;
  const uint64_t n_warps = static_cast<uint64_t>(sms) * kRingWarps;
  kernel<<<static_cast<unsigned>(sms), kRingWarps * 32, smem, stream>>>(a, doc_rows, n_warps, scratch);
  return cudaGetLastError();
}

template <int MT>
cudaError_t LaunchRing(const ForwardArgs& a, int sms, cudaStream_t stream) {
  constexpr auto kernel = &RingScheduleKernel<MT, kRingWarps, kRingStages>;
  constexpr int most = kRingWarps * kRingStages * kRingStageBytes + kRingQueryBytes;
  const int smem = most - (mscuda::OneQueryLaunch(a) ? 0 : kRingQueryBytes);  // as exact.cu's PipeDynamicBytes
  const cudaError_t e = mscuda::AllowDynamicSmemOnce<kernel>(most);
  if (e != cudaSuccess) return e;
  const uint64_t n_warps = static_cast<uint64_t>(sms) * kRingWarps;
  kernel<<<static_cast<unsigned>(sms), kRingWarps * 32, smem, stream>>>(a, n_warps);
  return cudaGetLastError();
}

template <int MT, int MMA_MT>
cudaError_t LaunchGrid(const ForwardArgs& a, cudaStream_t stream) {
  constexpr auto kernel = &GridScheduleKernel<MT, kGridWarps, kGridStages, kGridPerSm, MMA_MT>;
  constexpr int smem = kGridWarps * kGridStages * kRingStageBytes;
  const cudaError_t e = mscuda::AllowDynamicSmemOnce<kernel>(smem);
  if (e != cudaSuccess) return e;
  if (a.pairs.n_pairs == 0) return cudaSuccess;
  if (a.pairs.n_pairs > 0x7fffffffull) return cudaErrorInvalidConfiguration;
  kernel<<<static_cast<unsigned>(a.pairs.n_pairs), kGridWarps * 32, smem, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

bool ScheduleReadApplies(const ForwardArgs& a, uint64_t max_lq) {
  return mscuda::TcSupported(a.q, a.d) && a.q.dim <= 128 && max_lq <= 32 && a.d.mask == nullptr &&
         a.pairs.scores != nullptr;
}

const char* ExactScheduleName(const ForwardArgs& a, uint64_t max_lq, int sms) {
  if (!ScheduleReadApplies(a, max_lq) || a.cosine) return "other";
  const bool rings = a.sw.pipe && mscuda::EnoughPairsForWarpRings(a.pairs.n_pairs, sms);
  const bool grid = rings && mscuda::CoopChosen(a, sms);
  if (!grid && mscuda::DealtChosen(a, sms, mscuda::SharedMemoryOptinBytes())) return "dealt";
  if (!rings) return "other";
  return grid ? "grid" : "ring";
}

cudaError_t LaunchRingScheduleRead(const ForwardArgs& a, uint64_t max_lq, int sms, cudaStream_t stream) {
  if (!ScheduleReadApplies(a, max_lq) || sms <= 0) return cudaErrorInvalidValue;
  return max_lq <= 16 ? LaunchRing<1>(a, sms, stream) : LaunchRing<2>(a, sms, stream);
}

cudaError_t LaunchGridScheduleRead(const ForwardArgs& a, uint64_t max_lq, bool with_mma, cudaStream_t stream) {
  if (!ScheduleReadApplies(a, max_lq)) return cudaErrorInvalidValue;
  if (max_lq <= 16) return with_mma ? LaunchGrid<1, 1>(a, stream) : LaunchGrid<1, 0>(a, stream);
  return with_mma ? LaunchGrid<2, 2>(a, stream) : LaunchGrid<2, 0>(a, stream);
}

namespace {

// The one-query launches whose documents are all doc_rows long, as far as the view says.
bool EvenOneQueryLaunch(const ForwardArgs& a, uint64_t max_lq, uint64_t doc_rows, int sms) {
  return ScheduleReadApplies(a, max_lq) && sms > 0 && a.pairs.layout == mscuda::kPairsMatrix &&
         a.pairs.n_pairs == a.pairs.nd && a.pairs.nd != 0 && doc_rows != 0 &&
         (a.d.n_rows == 0 || a.d.n_rows == a.pairs.nd * doc_rows) &&
         (a.d.offsets != nullptr || a.d.set_length == doc_rows);
}

}  // namespace

cudaError_t LaunchDealtScheduleRead(const ForwardArgs& a, uint64_t max_lq, uint64_t doc_rows, int sms,
                                    bool with_mma, cudaStream_t stream) {
  if (!EvenOneQueryLaunch(a, max_lq, doc_rows, sms) || a.pairs.nd > 32ull * static_cast<uint64_t>(sms)) {
    return cudaErrorInvalidValue;
  }
  if (!with_mma) return LaunchDealtSchedule<0>(a, doc_rows, sms, stream);
  return max_lq <= 16 ? LaunchDealtSchedule<1>(a, doc_rows, sms, stream)
                      : LaunchDealtSchedule<2>(a, doc_rows, sms, stream);
}

cudaError_t LaunchSpreadScheduleRead(const ForwardArgs& a, uint64_t max_lq, uint64_t doc_rows, int sms,
                                     SpreadSchedule deal, cudaStream_t stream) {
  if (!EvenOneQueryLaunch(a, max_lq, doc_rows, sms)) return cudaErrorInvalidValue;
  switch (deal) {
    case kCyclic: return LaunchSpread<kCyclic>(a, doc_rows, sms, stream);
    case kCyclicMerge: return LaunchSpread<kCyclicMerge>(a, doc_rows, sms, stream);
    case kBalanced: return LaunchSpread<kBalanced>(a, doc_rows, sms, stream);
    default: return cudaErrorInvalidValue;
  }
}
