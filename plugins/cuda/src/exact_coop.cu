// SPDX-License-Identifier: Apache-2.0
// ExactTcCoopKernel: dot calls without a document mask (the ring kernel's FOLD 1 and 2 calls, exact.cu) over many
// pairs, as a plain grid that the hardware schedules: block p, of kCoopWarps warps, scores pair p. Warp w takes
// steps w, w + kCoopWarps, ... (32 tokens each) of the pair's document through its own shared-memory ring of
// kCoopStages stages (8 KB each: the ring kernel's copies, swizzle, L2 evict-first policy and fold). The block copies
// the query rows into a ring stage once (the ring's swizzle; ldmatrix gives each warp the ring kernel's
// natural-placement fragments), so the query is read once per block, not once per warp, and takes no shared memory
// of its own. At the end the warps' row maxima meet in shared memory: the larger value, of equal ones the lower token
// index, which is what one warp's strict > fold over the tokens in increasing order keeps; so every score and argmax
// has the ring kernel's bits. Three blocks stay resident per SM and the next block starts on whichever SM frees up
// first, where the ring's static split leaves the SMs that memory serves slower waiting (docs/cuda.md,
// "Memory-bound shapes").
#include <math.h>

#include "forward_common.cuh"
#include "ring_common.cuh"

namespace mscuda {
namespace {

// The grid's shape: 4 warps x 2 stages, three 64 KB blocks per SM. On textual-10k (76 pairs per SM) the shapes
// of one block per pair measured on the H100 came down to resident blocks per SM: 1, 2, 3 and 4 took 0.42, 0.267,
// 0.251 and 0.247 ms (2-warp blocks), and 6 or 8 were slower again (benchmarks/results/gpu-mem-coop-h100.md).
// Then 2x3 at 4 per SM, 4x2 at 3, 4x3 at 2 and 8x2 at 1, in one call, two rounds each
// (benchmarks/results/gpu-mem-coop-colpali-h100.md): on colpali-rerank (1030-token documents, 7.6 pairs per SM)
// 0.0929, 0.0914, 0.0922 and 0.0946 ms against the ring's 0.0934; on textual-10k 0.2480, 0.2469, 0.2545 and 0.3808
// against 0.2530. 4x2 is the one shape that leads on both. Blocks of 1, 2 and 5 warps (2 stages, as many per SM as
// shared memory allows; 2 and 5 split a 300-token document's 10 steps evenly) were no faster on textual-1k
// (0.0325-0.0333 ms, the ring 0.0328) and slower than 4 warps wherever the rule picks the grid
// (benchmarks/results/gpu-coop-warps-h100.md).
constexpr int kCoopWarps = 4;
constexpr int kCoopStages = 2;
constexpr int kCoopBlocksPerSm = 3;  // __launch_bounds__: 64 KB of shared memory each

// The query rows of a pair, zero past lq and dim, into `qbuf` (a free ring stage) in the ring's layout, with plain
// loads (the cp.async groups stay the ring's); then each warp takes its fragments. Every thread of the block calls
// it; the stage may be reused after it returns. The ring kernel's way (CopyQueryRows: the query as the block's first
// cp.async group, ahead of the rings' copies, into 8 KB of its own, one barrier) was slower here, measured on the
// H100 alternating with this: textual-10k 0.2478 against 0.2465 ms, textual-1k with the grid forced 0.0341 against
// 0.0328 (benchmarks/results/gpu-ring-query-h100.md).
template <int MT, int NW>
__device__ __forceinline__ void StageQuery(const ForwardArgs& a, uint64_t qb, uint64_t lq, uint32_t qbuf,
                                           uint4 (&qa)[MT][4], uint4 (&qc)[MT][4]) {
  const int lane = threadIdx.x & 31;
  StoreQueryRows<MT, NW>(a, qb, lq, qbuf);
  __syncthreads();
  LdsmQueryFragments<MT>(qbuf, lane, qa, qc);
  __syncthreads();
}

// The end of a pair scored by NW warps, each over its own tokens in increasing order: the row maxima merge in
// shared memory (StageWarpRows, then MergeWarpRows and WriteRows with argmax, MergeWriteScore for scores only), and
// warp 0 writes the pair's score (and rows).
template <int MT, int NW, bool ARG>
__device__ __forceinline__ void MergeAndWrite(const ForwardArgs& a, uint64_t p, uint64_t qi, uint64_t dj,
                                              uint64_t qb, uint64_t lq, uint64_t ld, bool check, bool saw_kept,
                                              Best<MT>& best) {
  __shared__ float s_v[NW][MT * 16];
  __shared__ int s_i[NW][MT * 16];
  __shared__ float s_term[MT * 16];
  __shared__ int s_arg[MT * 16];
  const int warp = threadIdx.x >> 5;
  CheckRowMaxima(true, check, saw_kept, best);
  StageWarpRows<MT, ARG>(best, s_v[warp], s_i[warp]);
  __syncthreads();
  if (warp != 0 || !ARG) ReportCheck(a, best.chk);
  if (warp != 0) return;
  if constexpr (!ARG) {
    MergeWriteScore<MT, NW>(a, p, qi, dj, qb, lq, ld > 0, s_v);
  } else {
    Best<MT> m;
    m.chk = best.chk;
    MergeWarpRows<MT, NW>(s_v, s_i, m);
    WriteRows<MT, true>(a, p, qi, dj, 0, qb, lq, ld > 0, m, s_term, s_arg);
  }
}

// FOLD 1: values only; 2: with argmax. Block p scores pair p.
template <typename T, int MT, int FOLD>
__global__ void __launch_bounds__(kCoopWarps * 32, kCoopBlocksPerSm) ExactTcCoopKernel(const ForwardArgs a) {
  constexpr int CW = kCoopWarps, S = kCoopStages;
  extern __shared__ __align__(128) uint8_t coop_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint64_t p = blockIdx.x;
  uint64_t qi, dj;
  a.pairs.Resolve(p, &qi, &dj);
  const uint64_t db = a.d.Begin(dj), ld = a.d.End(dj) - db;
  const uint64_t qb = a.q.Begin(qi), lq = a.q.End(qi) - qb;
  const uint64_t policy = EvictFirstPolicy();
  const uint32_t dim = a.q.dim;
  const uint64_t drb = a.d.row_bytes;
  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(coop_smem));
  const uint32_t ring = smem0 + static_cast<uint32_t>(warp) * (S * kRingStageBytes);
  const uint8_t* dbase = a.d.orig + db * drb;

  // The producer: this warp's next step is tokens [next, next + 32).
  uint64_t next = static_cast<uint64_t>(warp) * kRingStep;
  uint32_t produced = 0;
  auto produce = [&]() {
    if (next < ld) {
      CopyRingStep(ring + (produced % S) * kRingStageBytes, dbase, next, ld, drb, dim, policy, lane);
      ++produced;
      next += static_cast<uint64_t>(CW) * kRingStep;
    }
    CpAsyncCommit();
  };
#pragma unroll 1
  for (int s = 0; s < S - 1; ++s) produce();

  // The query into warp 0's last ring stage, which the prologue leaves free, while the prologue's copies are in
  // flight; warp 0's ring reuses the stage after StageQuery's second barrier.
  uint4 qa[MT][4], qc[MT][4];
  StageQuery<MT, CW>(a, qb, lq, smem0 + (S - 1) * kRingStageBytes, qa, qc);
  const bool check = a.bad != nullptr;
  Best<MT> best;
  InitBest(best);
  bool saw_kept = false;
  uint32_t consumed = 0;
  for (uint64_t base = static_cast<uint64_t>(warp) * kRingStep; base < ld; base += CW * kRingStep) {
    CpAsyncWait<S - 2>();
    __syncwarp();
    produce();
    const uint32_t st = ring + (consumed % S) * kRingStageBytes;
    ++consumed;
    FoldRingStep<T, MT, FOLD>(a, st, base, db, ld, qa, qc, true, FOLD == 2, check, best, saw_kept);
  }
  CpAsyncWait<0>();
  MergeAndWrite<MT, CW, FOLD == 2>(a, p, qi, dj, qb, lq, ld, check, saw_kept, best);
}

template <typename T, int MT, int FOLD>
cudaError_t LaunchCoopFold(const ForwardArgs& a, cudaStream_t stream) {
  constexpr int smem = kCoopWarps * kCoopStages * kRingStageBytes;
  const cudaError_t e = AllowDynamicSmemOnce<ExactTcCoopKernel<T, MT, FOLD>>(smem);
  if (e != cudaSuccess) return e;
  if (a.pairs.n_pairs == 0) return cudaSuccess;
  if (a.pairs.n_pairs > 0x7fffffffull) return cudaErrorInvalidConfiguration;
  ExactTcCoopKernel<T, MT, FOLD><<<static_cast<unsigned>(a.pairs.n_pairs), kCoopWarps * 32, smem, stream>>>(a);
  return cudaGetLastError();
}

template <typename T, int MT>
cudaError_t LaunchCoopT(const ForwardArgs& a, cudaStream_t stream) {
  return a.pairs.argmax ? LaunchCoopFold<T, MT, 2>(a, stream) : LaunchCoopFold<T, MT, 1>(a, stream);
}

}  // namespace

bool CoopChosen(const ForwardArgs& a, int sms) {
  if (!a.sw.coop || a.pairs.n_pairs > 0x7fffffffull) return false;  // a grid of at most 2^31 - 1 blocks
  if (a.sw.coop_always) return true;
  // Dim 128 only: below it the grid copies every step through the predicated path, and the ring was faster on every
  // shape measured (dim 64: 10-29%, dim 96: 1-2%; benchmarks/results/gpu-coop-rule-h100.md).
  if (a.q.dim != 128) return false;
  if (a.pairs.n_pairs >= kCoopMinPairsPerSm * static_cast<uint64_t>(sms)) return true;
  // Each document scored once: a one-query matrix launch, or the pairs layout. Candidate lists may name a document
  // for several queries, which then reuse it from L2 as the training forward does, so they keep the ring.
  const bool once = a.pairs.layout == kPairsDiagonal || (a.pairs.layout == kPairsMatrix && a.pairs.n_pairs == a.pairs.nd);
  return once && CoopFitsDocuments(a.d.MeanRows());
}

bool CoopFitsDocuments(uint64_t rows) {
  // From 410 rows on the share below always reaches 4/5, so this line states the measured rule rather than adding
  // to it (the grid was measured faster from 512 tokens on).
  if (rows >= kCoopLongDocRows) return true;
  if (rows < kCoopMinEvenRows) return false;
  // Each warp of a block takes every kCoopWarps-th 32-token step, so the block lasts `rounds` steps of its busiest
  // warp; its warps carry tokens for rows / (32 x kCoopWarps x rounds) of that, which must reach 4/5.
  const uint64_t steps = (rows + kRingStep - 1) / kRingStep, rounds = (steps + kCoopWarps - 1) / kCoopWarps;
  return 5 * rows >= 4 * static_cast<uint64_t>(kRingStep) * kCoopWarps * rounds;
}

int CoopBlocksPerSmGranted() {
  constexpr int smem = kCoopWarps * kCoopStages * kRingStageBytes;
  int n = 0;
  if (AllowDynamicSmemOnce<ExactTcCoopKernel<__nv_bfloat16, 2, 1>>(smem) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, ExactTcCoopKernel<__nv_bfloat16, 2, 1>, kCoopWarps * 32,
                                                    smem) != cudaSuccess) {
    cudaGetLastError();  // a failed query must not surface as a later launch error
    return -1;
  }
  return n;
}

int CoopBlocksPerSmDesigned() { return kCoopBlocksPerSm; }

cudaError_t LaunchExactCoop(const ForwardArgs& a, cudaStream_t stream) {
  const bool bf16 = a.q.dtype == kBF16;
  if (a.part.group_rows == 16) {
    return bf16 ? LaunchCoopT<__nv_bfloat16, 1>(a, stream) : LaunchCoopT<__half, 1>(a, stream);
  }
  return bf16 ? LaunchCoopT<__nv_bfloat16, 2>(a, stream) : LaunchCoopT<__half, 2>(a, stream);
}

}  // namespace mscuda
