// SPDX-License-Identifier: Apache-2.0
// ExactTcDealtKernel: one-query dot calls without a document mask (the ring kernel's FOLD 1 and 2 calls, exact.cu)
// with too few documents for the ring (under half a pair per ring warp), which went to the one-pair-per-warp
// kernel: one warp per document, each streaming its document alone; and, of the calls the ring would take, those
// whose documents average kDealtMinRingRows tokens or more (the grid takes longer ones and more documents than 32
// per SM's worth, CoopChosen). Here one block of kDealtWarps warps per SM (at
// most one per document), persistent: block b scores documents b, b + B, b + 2B, ... (B blocks, at most
// kDealtMaxDocs each) with all its warps, and deals the steps of that stream (32 tokens each, document after
// document) to its warps round-robin, so each warp's share is even to within one step however the documents'
// lengths fall, and a document of n steps is read by min(n, 12) warps at once. Each warp copies its steps through
// its own ring (kDealtStages x 8 KB: the ring kernel's copies, swizzle, L2 evict-first policy and fold), across
// document boundaries. 12 warps x 2 stages are the ring's 192 KB of stages spread over more warps (one step in
// flight per warp while it folds, 96 KB per SM, against the ring's two, 128 KB): a 300-token document is one step
// per warp, a 1030-token one three at most. The block copies the query once (CopyQueryRows), as the ring's
// one-query launches do, and every warp holds the block's table of documents (one per lane), so moving to the next
// document is a shuffle. Each warp leaves its row maxima per document in shared memory (StageWarpRows); after every
// round of kDealtRound documents (and the last) the block meets at a barrier and warp w < 8 merges document w of
// the round (MergeWarpRows: the larger value, of equal ones the lower token index; by value alone where no argmax
// is asked for, MergeWriteScore) and writes its score and argmax (WriteRows): the ring kernel's bits.
//
// Measured on the H100 (benchmarks/results/gpu-dealt-h100.md). Against the one-pair-per-warp kernel those calls
// took before (8 warps x 3 stages, kernel rows, calls 5-7): one query over 100 documents of 300 tokens 0.0093 ms
// against 0.0362, 100 of 1030 tokens 0.0176 against 0.1039, 500 of 300 tokens 0.0203 against 0.0407. Where the
// ring runs it was slower than the ring from 600 documents on (2.2% at 600, 3.6% at 800, 1.2% at 1000 of 300
// tokens, in the same processes), and 1.4% faster at 528, where the ring starts. So DealtChosen takes it only where
// the ring does not run. A prologue in 32-bit counts without a division by the pair layout, and scores-only merges
// by value, took textual-100 from 0.0107-0.0110 to 0.0102-0.0105 ms and colpali-100 from 0.0175 to 0.0169-0.0170
// (CUDA events, three alternating rounds); 12 x 2 instead of 8 x 3 then colpali-100 to 0.0160-0.0162, 250 of
// 1030 tokens 1.4% and 30 of 300 tokens 3.5% faster, textual-100 and 400 of 300 tokens unchanged, 520 of 300 tokens
// 1% slower (the second study in the results file). With those changes it overtook the ring on 700-4000 documents
// of 300 tokens (1-3%, textual-1k 1-2%), and on 288 tokens at 2500 and 4000 (1%, 1% slower at 1000), but not on
// shorter ones (kDealtMinRingRows: the third study).
#include <math.h>

#include <algorithm>

#include "forward_common.cuh"
#include "ring_common.cuh"

namespace mscuda {
namespace {

constexpr int kDealtWarps = 12;
constexpr int kDealtStages = 2;
constexpr int kDealtDynamicBytes = kDealtWarps * kDealtStages * kRingStageBytes + kRingQueryBytes;
// The documents of a block whose row maxima wait in shared memory at a time: one round, merged together (one
// document per warp) at the round's end.
constexpr int kDealtRound = 8;
static_assert(kDealtRound <= kDealtWarps, "each warp merges at most one document of a round");
// The kernel's static shared memory at most (32 query rows): the round's row maxima and indices, and the merging
// warps' row terms and argmax for WriteRows. With the rings and the query: 226 KB, under the H100's 227.
constexpr int kDealtStaticBytes = 2 * kDealtRound * kDealtWarps * 32 * 4 + 2 * kDealtRound * 32 * 4;

// The block's documents (at most kDealtMaxDocs): lane l of every warp holds document l's first row and length, read
// once at the start, so that moving to the next document costs a shuffle, not a load from global memory. The launch
// is one query's matrix (OneQueryLaunch: pair p is document p), so the block's document l is blockIdx.x + l B; a
// block holds at most 32 documents and a document fewer than 2^32 steps (2^37 rows), so counts are 32-bit.
constexpr uint32_t kDealtMaxDocs = 32;
// Where the ring has documents enough (half a pair per warp), the dealt kernel takes documents of at least this many
// tokens on average (7 steps: a round of 8 documents is about 5 steps per warp between its barriers), the ring
// shorter ones. Measured on the H100 (benchmarks/results/gpu-dealt-h100.md, third study), one query of 32 rows
// against 1000, 2500 and 4000 documents, the dealt kernel against the ring: 64 tokens 7-11% slower, 128 tokens
// 1-5% slower, 200 tokens the same, 288 tokens 1% either way, 300 tokens 1-3% faster (16-row queries 3%).
constexpr uint64_t kDealtMinRingRows = 224;
static_assert(kDealtMaxDocs <= 32, "one document per lane");
struct DealtDocs {
  uint64_t row = 0, len = 0;  // this lane's document
  __device__ DealtDocs(const ForwardArgs& a, uint32_t my_docs) {
    const uint32_t l = threadIdx.x & 31;
    if (l < my_docs) {
      const uint64_t dj = blockIdx.x + static_cast<uint64_t>(l) * gridDim.x;
      row = a.d.Begin(dj);
      len = a.d.End(dj) - row;
    }
  }
  __device__ uint64_t Row(uint32_t i) const { return __shfl_sync(kFull, row, static_cast<int>(i)); }
  __device__ uint64_t Len(uint32_t i) const { return __shfl_sync(kFull, len, static_cast<int>(i)); }
};

__device__ __forceinline__ uint32_t DealtSteps(uint64_t len) {
  return static_cast<uint32_t>((len + kRingStep - 1) / kRingStep);
}

// The producer side: this warp's next step is local step k (tokens [32 k, 32 k + 32)) of document i of the block's
// stream (pair blockIdx.x + i B), which has n steps. The warp's steps are those whose place in the stream is its
// index modulo W. Every lane calls it alike (the shuffles).
template <int W>
struct DealtCursor {
  uint32_t i = 0, k, n = 0;
  uint64_t first_row = 0, len = 0;
  const uint32_t docs;
  const DealtDocs& table;
  __device__ DealtCursor(const DealtDocs& t, uint32_t my_docs, int warp)
      : k(static_cast<uint32_t>(warp)), docs(my_docs), table(t) {
    Load();
    Settle();
  }
  __device__ bool Active() const { return i < docs; }
  __device__ void Load() {
    if (i >= docs) return;
    first_row = table.Row(i);
    len = table.Len(i);
    n = DealtSteps(len);
  }
  __device__ void Settle() {
    while (i < docs && k >= n) {
      k -= n;
      ++i;
      Load();
    }
  }
  __device__ void Advance() {
    k += W;
    Settle();
  }
};

// FOLD 1: values only; 2: with argmax.
template <typename T, int MT, int FOLD>
__global__ void __launch_bounds__(kDealtWarps * 32, 1) ExactTcDealtKernel(const ForwardArgs a) {
  constexpr int W = kDealtWarps, S = kDealtStages, R = kDealtRound;
  extern __shared__ __align__(128) uint8_t dealt_smem[];
  __shared__ float s_v[R][W][MT * 16];
  __shared__ int s_i[R][W][MT * 16];
  __shared__ float s_term[R][MT * 16];
  __shared__ int s_arg[R][MT * 16];
  static_assert(sizeof(s_v) + sizeof(s_i) + sizeof(s_term) + sizeof(s_arg) <= kDealtStaticBytes, "DealtChosen");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // At most kDealtMaxDocs * B documents (LaunchDealtFold), so 32-bit.
  const uint32_t nd = static_cast<uint32_t>(a.pairs.n_pairs), B = gridDim.x;
  uint32_t my_docs = 0;  // documents blockIdx.x + i B < nd: at most 32, so counted rather than divided
  while (blockIdx.x + my_docs * B < nd) ++my_docs;
  if (my_docs == 0) return;  // the whole block
  const uint64_t policy = EvictFirstPolicy();
  const uint32_t dim = a.q.dim;
  const uint64_t drb = a.d.row_bytes;
  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(dealt_smem));
  const uint32_t ring = smem0 + static_cast<uint32_t>(warp) * (S * kRingStageBytes);
  const uint32_t qbuf = smem0 + W * S * kRingStageBytes;
  // The table's loads (a ragged corpus's offsets) are issued first, the query copied while they are in flight (its
  // own cp.async group, as in the ring kernel's one-query launches, exact.cu), and the cursor, the first to use
  // them, made after.
  const DealtDocs docs(a, my_docs);
  const uint64_t qb = a.q.Begin(0), lq = a.q.End(0) - qb;
  CopyQueryRows<MT, W>(a, qb, lq, qbuf);
  CpAsyncCommit();
  DealtCursor<W> cur(docs, my_docs, warp);
  uint32_t produced = 0;
  auto produce = [&]() {
    if (cur.Active()) {
      CopyRingStep(ring + (produced % S) * kRingStageBytes, a.d.orig + cur.first_row * drb,
                   static_cast<uint64_t>(cur.k) * kRingStep, cur.len, drb, dim, policy, lane);
      ++produced;
      cur.Advance();
    }
    CpAsyncCommit();
  };
#pragma unroll 1
  for (int s = 0; s < S - 1; ++s) produce();
  uint4 qa[MT][4], qc[MT][4];
  CpAsyncWait<S - 1>();
  __syncthreads();
  LdsmQueryFragments<MT>(qbuf, lane, qa, qc);

  const bool check = a.bad != nullptr;
  uint32_t consumed = 0;
  uint32_t u0 = 0;  // the stream's place of document i's first step (mod W is all that is used)
  for (uint32_t i = 0; i < my_docs; ++i) {
    const uint64_t db = docs.Row(i), ld = docs.Len(i);
    const uint32_t n = DealtSteps(ld);
    Best<MT> best;
    InitBest(best);
    bool saw_kept = false;
    for (uint32_t k = (static_cast<uint32_t>(warp) + W - u0 % W) % W; k < n; k += W) {
      CpAsyncWait<S - 2>();
      __syncwarp();
      produce();
      const uint32_t st = ring + (consumed % S) * kRingStageBytes;
      ++consumed;
      FoldRingStep<T, MT, FOLD>(a, st, static_cast<uint64_t>(k) * kRingStep, db, ld, qa, qc, true, FOLD == 2, check,
                                best, saw_kept);
    }
    u0 = (u0 + n % W) % W;
    CheckRowMaxima(true, check, saw_kept, best);
    ReportCheck(a, best.chk);
    const uint32_t slot = i % R;
    StageWarpRows<MT, FOLD == 2>(best, s_v[slot][warp], s_i[slot][warp]);
    if (slot != R - 1 && i + 1 != my_docs) continue;
    // The round's end: each warp merges and writes one of its documents, and the next round's rows wait until every
    // warp is done reading these.
    __syncthreads();
    const uint32_t mine = i - slot + static_cast<uint32_t>(warp);
    const uint64_t mine_len = docs.Len(mine < my_docs ? mine : 0);
    if (static_cast<uint32_t>(warp) <= slot) {
      const uint64_t dj = blockIdx.x + static_cast<uint64_t>(mine) * B;  // pair dj: query 0, document dj
      if constexpr (FOLD == 1) {
        MergeWriteScore<MT, W>(a, dj, 0, dj, qb, lq, mine_len > 0, s_v[warp]);
      } else {
        Best<MT> m;  // chk 0: each warp reported its own above
        MergeWarpRows<MT, W>(s_v[warp], s_i[warp], m);
        WriteRows<MT, true>(a, dj, 0, dj, 0, qb, lq, mine_len > 0, m, s_term[warp], s_arg[warp]);
      }
    }
    if (i + 1 != my_docs) __syncthreads();
  }
  CpAsyncWait<0>();
}

template <typename T, int MT, int FOLD>
cudaError_t LaunchDealtFold(const ForwardArgs& a, int sms, cudaStream_t stream) {
  const cudaError_t e = AllowDynamicSmemOnce<ExactTcDealtKernel<T, MT, FOLD>>(kDealtDynamicBytes);
  if (e != cudaSuccess) return e;
  const uint64_t blocks = std::min<uint64_t>(static_cast<uint64_t>(sms), a.pairs.n_pairs);
  if (blocks == 0) return cudaSuccess;
  if (a.pairs.n_pairs > kDealtMaxDocs * blocks) return cudaErrorInvalidValue;  // DealtDocs' table (DealtChosen)
  ExactTcDealtKernel<T, MT, FOLD><<<static_cast<unsigned>(blocks), kDealtWarps * 32, kDealtDynamicBytes, stream>>>(a);
  return cudaGetLastError();
}

template <typename T, int MT>
cudaError_t LaunchDealtT(const ForwardArgs& a, int sms, cudaStream_t stream) {
  return a.pairs.argmax ? LaunchDealtFold<T, MT, 2>(a, sms, stream) : LaunchDealtFold<T, MT, 1>(a, sms, stream);
}

}  // namespace

bool DealtChosen(const ForwardArgs& a, int sms, int optin_bytes) {
  if (!a.sw.pipe || !a.sw.dealt || !OneQueryLaunch(a) || sms <= 0) return false;
  // What its fold and copies take: dot without a document mask, one group of at most 32 query rows, dim <= 128.
  if (a.cosine || a.d.mask != nullptr || a.part.groups != 1 || a.q.dim > 128) return false;
  if (a.pairs.n_pairs > kDealtMaxDocs * static_cast<uint64_t>(sms)) return false;  // DealtDocs' table
  // Where the ring has documents enough, it keeps the short ones.
  if (!a.sw.dealt_always && EnoughPairsForWarpRings(a.pairs.n_pairs, sms) && a.d.MeanRows() < kDealtMinRingRows) {
    return false;
  }
  return kDealtDynamicBytes + kDealtStaticBytes <= optin_bytes;
}

cudaError_t LaunchExactDealt(const ForwardArgs& a, int sms, cudaStream_t stream) {
  if (!OneQueryLaunch(a)) return cudaErrorInvalidValue;  // the kernel takes the document of pair p to be p
  const bool bf16 = a.q.dtype == kBF16;
  if (a.part.group_rows == 16) {
    return bf16 ? LaunchDealtT<__nv_bfloat16, 1>(a, sms, stream) : LaunchDealtT<__half, 1>(a, sms, stream);
  }
  return bf16 ? LaunchDealtT<__nv_bfloat16, 2>(a, sms, stream) : LaunchDealtT<__half, 2>(a, sms, stream);
}

}  // namespace mscuda
