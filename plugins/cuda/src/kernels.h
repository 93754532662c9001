// SPDX-License-Identifier: Apache-2.0
// Internal interface between the CUDA plugin's host code (backend.h and the *.cc files) and its kernels (*.cu).
// Plain structs passed by value to kernels; every pointer in them is device memory unless its comment says
// otherwise.
//
// Conventions shared by every kernel (they implement maxsim.h's contract):
//  - A "pair" is (query set i, document set j). Per query token s the kernels find the best key over the
//    document's kept tokens (ties: lowest token index) and its index; key = sim (dot) or fl(sim * inv|d|)
//    (cosine), term = key (dot) or fl(key * inv|q|) (cosine); score = sum of terms over kept query tokens in
//    token order, in double, rounded once to f32. No kept document token: score -inf, every argmax -1.
//    Masked query tokens: term 0, argmax -1.
//  - sim for 16-bit inputs is computed on tensor cores (mma.sync m16n8k16, or wgmma m64n128k16 on sm_90a, f32
//    accumulation) as 8 k16 steps with one fixed set of dimensions per step (device_common.cuh) in every kernel
//    that computes it, so certified refinement reproduces the exact kernels' values bit for bit. sim for f32 (or unaligned) inputs is the CPU's canonical sequential f32
//    FMA chain over k from +0 (bit-identical to the CPU).
#ifndef MAXSIM_PLUGINS_CUDA_KERNELS_H_
#define MAXSIM_PLUGINS_CUDA_KERNELS_H_

#include <cuda_runtime.h>
#include <stdint.h>

#include "maxsim/maxsim.h"
#include "maxsim/packed_format.h"

namespace mscuda {

enum Dtype : int { kF32 = 1, kF16 = 2, kBF16 = 3 };

// A collection of token sets in device memory (a packed buffer's regions, a streamed chunk of one, or dense
// tensors). Set i owns rows [Begin(i), End(i)).
struct SetsView {
  const uint8_t* orig = nullptr;             // originals: row r at orig + r * row_bytes
  uint64_t row_bytes = 0;
  int dtype = kBF16;
  uint32_t dim = 0;
  const int8_t* codes = nullptr;             // packed: row r at codes + r * code_bytes (else null)
  uint32_t code_bytes = 0;                   // padded_dim (multiple of 64)
  const maxsim_vector_meta* meta = nullptr;  // packed: per row (else null)
  const float* norms = nullptr;              // dense + cosine: per row L2 norm (else null: meta->norm)
  const uint64_t* offsets = nullptr;         // n_sets + 1 (null: uniform set_length)
  uint64_t set_length = 0;
  uint64_t row_base = 0;                     // subtracted from offsets[i] or i * set_length (a chunk: Sets)
  const uint8_t* mask = nullptr;             // dense: per row, 0 = padding token (else null)
  uint64_t n_sets = 0;
  // Rows of the n_sets sets (offsets[n_sets] - offsets[0]) where the host knows them, for launch choices only
  // (MeanRows); 0 where it was not set.
  uint64_t n_rows = 0;
  // Per-document-scale codes of a resident corpus (screen_wgmma.cu), once built: row r at dscodes + r * 128,
  // and per set {scale, max norm, max residual norm, 0} at dsinfo[i] (else null).
  const int8_t* dscodes = nullptr;
  const float4* dsinfo = nullptr;

  __host__ __device__ uint64_t Begin(uint64_t i) const {
    return (offsets ? offsets[i] : i * set_length) - row_base;
  }
  __host__ __device__ uint64_t End(uint64_t i) const {
    return (offsets ? offsets[i + 1] : (i + 1) * set_length) - row_base;
  }
  __host__ __device__ bool Kept(uint64_t row) const { return mask == nullptr || mask[row] != 0; }
  // Host: sets [j0, j1) as a view of their own (its set i is set j0 + i here; n_rows is left to the caller). Uniform
  // sets have no offsets to advance: row_base takes off the rows before set j0 instead (unsigned, so subtracting it
  // in Begin adds them back).
  __host__ SetsView Sets(uint64_t j0, uint64_t j1) const {
    SetsView v = *this;
    if (offsets) v.offsets += j0; else v.row_base -= j0 * set_length;
    if (dsinfo) v.dsinfo += j0;
    v.n_sets = j1 - j0;
    return v;
  }
  // Host: the sets' mean length in rows (0 where n_rows was not set on ragged sets).
  __host__ uint64_t MeanRows() const { return offsets ? (n_sets ? n_rows / n_sets : 0) : set_length; }
};

enum PairLayout : int {
  kPairsMatrix = 0,  // pair p = (query p / nd, doc p % nd)
  kPairsDiagonal = 1,  // pair p = (query p, doc p)
  kPairsList = 2     // pair p = (query pq[p], doc pd[p])
};

// Which pairs to score and where results go.
struct PairSpec {
  int layout = kPairsMatrix;
  uint64_t n_pairs = 0;
  uint64_t nd = 0;                 // matrix: documents in this launch
  const uint32_t* pq = nullptr;    // list
  const uint32_t* pd = nullptr;    // list
  // Scores: matrix: scores[i * score_stride + score_col0 + j]; diagonal / list: scores[score_col0 + p]
  float* scores = nullptr;
  uint64_t score_stride = 0;
  uint64_t score_col0 = 0;
  // Argmax (optional): matrix: argmax[am_rows * o_i + (am_col0 + j) * Lq_i + s] with o_i the query positions
  // before set i; diagonal: argmax[o_i + s]; list: argmax[am_base[p] + s].
  int32_t* argmax = nullptr;
  uint64_t am_rows = 0;
  uint64_t am_col0 = 0;
  const uint64_t* am_base = nullptr;
  const uint64_t* pslot = nullptr;  // list (optional): score slot of pair p (default score_col0 + p)

  __device__ void Resolve(uint64_t p, uint64_t* i, uint64_t* j) const {
    if (layout == kPairsMatrix) {
      *i = p / nd;
      *j = p - *i * nd;
    } else if (layout == kPairsDiagonal) {
      *i = p;
      *j = p;
    } else {
      *i = pq[p];
      *j = pd[p];
    }
  }
  __device__ float* ScorePtr(uint64_t p, uint64_t i, uint64_t j) const {
    if (layout == kPairsMatrix) return scores + i * score_stride + score_col0 + j;
    return scores + (pslot ? pslot[p] : score_col0 + p);
  }
  // o_i: query positions (masked included) before set i.
  __device__ int32_t* ArgmaxPtr(uint64_t p, uint64_t i, uint64_t j, uint64_t o_i, uint64_t lq) const {
    if (argmax == nullptr) return nullptr;
    if (layout == kPairsMatrix) return argmax + am_rows * o_i + (am_col0 + j) * lq;
    if (layout == kPairsDiagonal) return argmax + o_i;
    return argmax + am_base[p];
  }
};

// Per-row partial results when a query set is split over several warps/blocks (G row groups of RG rows):
// slot (p * G + g) * RG + r. finalize turns them into scores and argmax.
struct Partials {
  float* term = nullptr;
  int32_t* arg = nullptr;
  uint32_t groups = 1;       // G
  uint32_t group_rows = 0;   // RG
};

// Candidate records of the wgmma screening kernel, per task (pair p, row group grp) = p * G + grp: up to `cap`
// records {row << 24 | first column, 32-bit mask of flagged columns first + 8 (i / 2) + i % 2, the largest int8
// dot among the lane's columns, 0} at list + task * cap, the number written at count[task] (more than cap: the
// task is refined over every token), and per row of the group the final integer threshold at
// threshold[task * 256 + row].
struct CandidateLists {
  uint4* list = nullptr;
  int32_t* threshold = nullptr;
  uint32_t* count = nullptr;
  uint32_t cap = 0;
};

// Default kernels a backend may switch off, read once when it is created (backend.h, Tuning) so that tests can
// check each one against the general kernel it replaces, bit for bit.
struct KernelSwitches {
  bool pipe = true;                // exact: per-warp cp.async ring for many short-query pairs
  bool screen_pipe = true;         // screening: its per-warp ring
  bool wgmma = true;               // exact: Hopper wgmma for long values-only queries
  bool batch = true;               // exact: Hopper wgmma for query batches (needs wgmma too)
  bool screen_wgmma = true;        // screening of long queries with wgmma, where screening runs
  uint32_t screen_wgmma_cap = 12;  // the wgmma screening kernel's candidate records per row (1..64)
  // The query-batch kernel's shape (exact_wgmma.cu): stages copied ahead (1..stages - 1; 0: by document length,
  // BatchAhead), its row groups
  // (128 or 256; 0: 128 when the whole batch fits one, else 256), and how many row groups one block may serve
  // (1 or 2; 0: 2): more blocks when the row groups do not divide the resident blocks (LaunchExactWgmmaBatch).
  uint32_t batch_ahead = 0;
  uint32_t batch_rows = 0;
  uint32_t batch_spread = 0;
  // Its copies: bulk tensor copies (TMA), one warp per warpgroup issuing them, where the driver encodes the tensor
  // map; false: every thread's cp.async copies.
  bool batch_tma = true;
  // The long-query (pair) wgmma kernel (exact_wgmma.cu): its row maxima by 3-input integer maxima (TreeMaxInt;
  // MAXSIM_CUDA_WGMMA_INT_FOLD=0: by FMNMX pairs, TreeMax; the batch kernel always folds by TreeMax), and its
  // copies in 256-row groups by the batch kernel's bulk tensor copies (MAXSIM_CUDA_WGMMA_TMA=0: every thread's
  // cp.async copies, which 128-row groups always take).
  bool wgmma_int_fold = true;
  bool wgmma_tma = true;
  // exact: the ring kernel's dot calls without a document mask run as a hardware-scheduled grid of one block per
  // pair where CoopChosen says so (exact_coop.cu); coop_always (MAXSIM_CUDA_EXPERIMENTAL=coop-always): on every
  // such call, whatever its rule says, for measuring the rule at its boundaries (coop false wins)
  bool coop = true;
  bool coop_always = false;
  // exact: one-query dot calls without a document mask run the dealt kernel where DealtChosen says so
  // (exact_dealt.cu; MAXSIM_CUDA_NO_DEALT=1 switches it off, and so does pipe off); dealt_always
  // (MAXSIM_CUDA_EXPERIMENTAL=dealt-always): also on short documents where the ring has enough of them (not where
  // the grid runs, and at most 32 documents per SM), for measuring the rule at its boundary (dealt false wins)
  bool dealt = true;
  bool dealt_always = false;
};

// The batch kernel's default stages copied ahead (KernelSwitches::batch_ahead 0): 3 where a block's first document
// has more than this many tokens, else 2 (exact_wgmma.cu, BatchAhead).
constexpr uint32_t kBatchAheadLongDoc = 640;

// A query batch scored by the wgmma batch kernel (exact_wgmma.cu): the matrix layout's nq queries, each in a slot
// of `slot` rows (a multiple of 16, at least its length), `per_group` slots per block row group, the block groups
// (Partials::groups) covering all queries. slot == 0: not a batch launch. The work items, (row group, document),
// run in document ranges of `range` documents (the last one shorter): range by range, in each range group by
// group, and in each group document by document; block b of B serves items [b W / B, (b + 1) W / B) of that
// order (W = groups x documents; BatchItems in wgmma_common.cuh).
struct QueryBatch {
  uint32_t slot = 0;
  uint32_t per_group = 0;
  uint64_t nq = 0;
  uint64_t range = 0;
};

struct ForwardArgs {
  SetsView q, d;
  PairSpec pairs;
  QueryBatch batch;          // set by LaunchExactWgmmaBatch only
  Partials part;             // used when part.groups > 1 (tensor-core kernel) and always by the FFMA kernel
  CandidateLists cand;       // the wgmma screening kernel's
  int cosine = 0;
  int mode = 0;              // maxsim_mode (screening kernel)
  unsigned long long* counters = nullptr;  // optional [2]: refined, multi_candidate (screening)
  KernelSwitches sw;         // read by the launchers only
  // Dense inputs: the input check folded into the exact kernels. When set, every kernel that computes kept
  // similarities keeps the NaN-propagating maximum of their magnitudes (the wgmma kernel: of a sample that meets
  // every kept row and of the row maxima, which an overflow to +inf reaches, exact_wgmma.cu; the ring kernel on
  // whole steps without a document mask: of such a sample and of the row maxima, exact.cu) and writes 1 here if one was NaN or infinite
  // (a non-finite input element in a kept row, or an overflow); the host then locates the offending token
  // (LaunchRowCheck) and fails the call.
  // Null: no check (packed buffers are validated when loaded).
  unsigned int* bad = nullptr;
  // Whether d.orig is plain device memory, not pinned host or managed memory (callers may pass those as
  // MAXSIM_MEMORY_CUDA; the wgmma kernels' bulk copies take plain device memory only): 1 or 0 where the host
  // already knows (a corpus is the plugin's own device memory; CheckCallerTensors asked the driver about a
  // caller's documents), -1 where it does not (the launcher asks the driver).
  int d_device_memory = -1;

  // What a persistent wgmma block iterates over: (query, document) pairs, or the documents of a batch launch.
  __host__ __device__ uint64_t Units() const { return batch.slot ? pairs.nd : pairs.n_pairs; }
};

// ---- launchers (return the launch error; all work is enqueued on `stream`) ----------------------------

// Tensor-core exact forward: q and d 16-bit of the same dtype, rows 16-byte aligned, dim % 8 == 0.
bool TcSupported(const SetsView& q, const SetsView& d);
// Rows per group the tensor-core kernel uses for queries of at most max_lq tokens (16 or 32).
uint32_t TcGroupRows(uint64_t max_lq);
cudaError_t LaunchExactTc(const ForwardArgs& a, cudaStream_t stream);
// The cooperative grid (exact_coop.cu): the ring kernel's dot calls without a document mask (group_rows 16 or 32,
// dim <= 128), one block per pair. The ring streams across document boundaries; the grid fills its rings at every
// pair but lets the hardware give the next pair to whichever SM frees up first. Measured on the H100
// (benchmarks/results/gpu-mem-coop-h100.md, gpu-mem-coop-colpali-h100.md), against the ring:
//  - textual-10k, 76 pairs per SM of 300-token documents: 2.4% faster;
//  - colpali-rerank, 7.6 pairs per SM of 1030-token documents, each scored once: 2.1% faster;
//  - textual-1k, 7.6 pairs per SM of 300-token documents: 1.8% slower;
//  - the training forward, 31 pairs per SM, 64 pairs per 300-token document (in L2): 45% slower.
// So the grid runs at dim 128, from kCoopMinPairsPerSm pairs per SM, or where every document is scored once (a
// one-query matrix launch or the pairs layout; not candidate lists, which may repeat a document) and the documents
// fit the grid (CoopFitsDocuments, on SetsView::MeanRows; 0 where the host does not know).
// Around that rule (benchmarks/results/gpu-coop-rule-h100.md, 1000 documents, one query, the ring and the grid
// forced, four calls): the grid was faster from 512 tokens (2.5-4.7%), at 600 pairs of 1030 tokens (3.4%) and for
// 16-row queries (1.2-3.4%). Under 512 tokens it won where its four warps' steps came out even: each warp folds
// every fourth 32-token step, so a block lasts its busiest warp's steps, and the share of those warp-steps that
// carry tokens is rows / (128 x rounds). From 4/5 of that the grid was faster: 224 tokens (7/8) by 4.1-4.8%, 240
// (15/16) by 3.0%, 256 and 384 (1) by 5.8-7.1% and 4.1-5.2%, 320 (5/6) by 2.5-3.2%, 352 (11/12) by 2.5-3.4%, 416
// (13/16) by 1.1%, 448 (7/8) by 2.5-3.0%, 480 (15/16) by 3.0%; under it the ring was, or the two were within 1%:
// 192 (3/4) 1.2-1.3%, 272 (0.71) and 288 (3/4) 0-2.3%, 296-304 (textual-1k's 300: 0.78) 0.5-2.3%, 400 (0.78)
// 0.9%. At 128 tokens (one step per warp) the ring was faster by 9-10%, and at 200 and 208 (0.78, 0.81) by 3.4%
// and 3.9%, so the grid starts at kCoopMinEvenRows. The share is taken of the mean length: every shape timed had
// documents of one length, and ragged corpora, which mix shares, were not timed on either side of the rule. At
// 15-30 pairs per SM of 300-token documents the grid was 0.7-1.9% faster, which the rule leaves to the ring (the
// training forward, 31 pairs per SM that repeat each document 64 times, was 45% faster there). Below dim 128 the
// ring was faster everywhere: dim 64 by 10% (1030-token documents), 15% (512) and 29% (10000 x 300), dim 96 by
// 1.9% and 0.9%.
constexpr uint64_t kCoopMinPairsPerSm = 48;
constexpr uint64_t kCoopLongDocRows = 512;
constexpr uint64_t kCoopMinEvenRows = 224;
// Whether documents of `rows` tokens on average suit the grid where each is scored once: from kCoopLongDocRows,
// or from kCoopMinEvenRows where the block's warps carry tokens for 4/5 of its busiest warp's steps.
bool CoopFitsDocuments(uint64_t rows);
// Whether the ring kernel's shared memory for launch `a` fits one block on a device that lets a block opt into
// `optin_bytes` (cudaDevAttrMaxSharedMemoryPerBlockOptin): 200 KB + 2 KB for a one-query launch, 192 KB + 2 KB
// for others (exact.cu). The H100 allows 227 KB; where a device allows less (the A100: 163 KB), such calls take
// the one-pair-per-warp kernel, or the grid where CoopChosen picks it.
bool PipeFitsSharedMemory(const ForwardArgs& a, int optin_bytes);
// Whether a ring launch of `a` (on a device of `sms` SMs) runs the grid: never where a.sw.coop is off, always
// (below 2^31 pairs) where a.sw.coop_always is on, else by the rule above.
bool CoopChosen(const ForwardArgs& a, int sms);
cudaError_t LaunchExactCoop(const ForwardArgs& a, cudaStream_t stream);
// The dealt kernel (exact_dealt.cu): one-query dot calls without a document mask (group_rows 16 or 32, dim <= 128),
// one block per SM scoring documents b, b + B, ... one at a time with all its warps. DealtChosen (for a launch the
// caller gives the tensor-core kernels, TcSupported): with a.sw.pipe and a.sw.dealt on, a one-query matrix launch of
// such a call with at most 32 documents per SM, on a device that gives a block its 226 KB (`optin_bytes`): with too
// few documents for the ring (EnoughPairsForWarpRings false), or documents of 224 tokens or more on average (any
// with a.sw.dealt_always). The caller asks only where the grid does not run (CoopChosen).
bool DealtChosen(const ForwardArgs& a, int sms, int optin_bytes);
cudaError_t LaunchExactDealt(const ForwardArgs& a, int sms, cudaStream_t stream);
// The grid's resident blocks per SM on the current device as the driver grants them (occupancy query of the bf16,
// 32-row, values-only kernel with its shared memory; -1 if the query fails), and as the kernel was designed and
// measured (kCoopBlocksPerSm: a lower grant would be a slower grid). maxsim info shows both.
int CoopBlocksPerSmGranted();
int CoopBlocksPerSmDesigned();
// Shared-memory tiled tensor-core forward for long queries (max_lq > 32, 96 < dim <= 128): blocks of
// TcSmemGroupRows(max_lq) query rows (64, 128 or 256) share each document tile.
bool TcSmemSupported(const SetsView& q, const SetsView& d, uint64_t max_lq);
uint32_t TcSmemGroupRows(uint64_t max_lq);
cudaError_t LaunchExactTcSmem(const ForwardArgs& a, cudaStream_t stream);
// Hopper wgmma variant of the above (exact_wgmma.cu): used by LaunchExactTcSmem for values-only requests on an
// sm_90 device when the module loaded for it was built for sm_90a (and a.sw.wgmma).
bool WgmmaUsable(const ForwardArgs& a);
bool WgmmaAvailable(int device);  // device is sm_90 and the loaded module has the sm_90a code
cudaError_t LaunchExactWgmma(const ForwardArgs& a, cudaStream_t stream);
// The query-batch kernel (exact_wgmma.cu): a matrix-layout launch of nq >= 2 queries of at most 128 tokens,
// values only, scored as one block row group of several queries per document, so each document tile is read once
// (from memory; the other groups' blocks read it from L2 at the same time) for all queries of a group. Same
// bits as every other 16-bit kernel. max_lq: the longest query.
// The batch kernel writes each row's term to a.part.term (BatchPartialBytes(n_pairs, max_lq) bytes; without them
// the pair kernels run) and FinalizeKernel sums them after it.
bool WgmmaBatchUsable(const ForwardArgs& a, uint64_t max_lq);
cudaError_t LaunchExactWgmmaBatch(const ForwardArgs& a, uint64_t max_lq, cudaStream_t stream);
uint64_t BatchPartialBytes(uint64_t n_pairs, uint64_t max_lq);
// FFMA exact forward (any dtype / layout): always writes partials with group_rows = kFfmaGroupRows.
constexpr uint32_t kFfmaGroupRows = 32;
cudaError_t LaunchExactFfma(const ForwardArgs& a, cudaStream_t stream);
// i8 screening (CERTIFIED / APPROXIMATE) on packed q and d; refinement with the exact kernels' arithmetic.
uint32_t ScreenGroupRows(uint64_t max_lq);
// Whether LaunchScreen uses its per-warp ring kernel (ScreenPipeKernel) for this launch, on a device of `sms` SMs
// that lets a block opt into `smem_optin` bytes of shared memory (cudaDevAttrMaxSharedMemoryPerBlockOptin; the
// ring's block takes 122 KB with 64-byte codes and 186 KB with 128-byte codes, so on the A100's 163 KB the latter
// screen without the ring).
bool ScreenPipeApplies(const KernelSwitches& sw, uint32_t groups, uint32_t code_bytes, uint64_t n_pairs, int sms,
                       int smem_optin);
cudaError_t LaunchScreen(const ForwardArgs& a, cudaStream_t stream);
// The screening bound's constants for similarities computed as the exact kernels compute them: relative error
// factor gamma' of a similarity (times |q| |d|) and an absolute slack for underflow (screen.cu).
struct ScreenBound {
  float gamma = 0.0f, slack = 0.0f;
};
ScreenBound ScreenBoundFor(const SetsView& q, const SetsView& d);

// Certified screening for long queries on Hopper (screen_wgmma.cu): int8 wgmma over per-document-scale codes
// (built once per resident corpus by LaunchDocScaleCodes), candidates compared in the integer domain, then an
// exact refinement kernel. Scope: dot, values only, 16-bit originals of 96 < dim <= 128 (128-byte code rows),
// documents of < 2^24 tokens, 256-row groups; ScreenWgmmaSupported says whether a request fits.
constexpr uint32_t kScreenWgmmaRows = 256;
bool ScreenWgmmaSupported(const KernelSwitches& sw, const SetsView& q, int dtype_d, uint32_t code_bytes_d,
                          uint64_t max_ld);
uint64_t DocScaleCodeBytes(uint64_t n_vectors, uint64_t n_sets);  // device bytes LaunchDocScaleCodes writes
// d: the whole packed corpus; out: DocScaleCodeBytes(...) bytes (codes, then the 16-byte-aligned set info).
cudaError_t LaunchDocScaleCodes(const SetsView& d, uint64_t n_vectors, uint8_t* out, const int8_t** codes,
                                const float4** info, cudaStream_t stream);
// Candidate records per task for a group of 256 rows (sw.screen_wgmma_cap per row, clamped to 1..64).
uint32_t ScreenWgmmaCap(const KernelSwitches& sw);
cudaError_t LaunchScreenWgmma(const ForwardArgs& a, cudaStream_t stream);

// Partials -> scores + argmax.
cudaError_t LaunchFinalize(const ForwardArgs& a, cudaStream_t stream);

// Per-row L2 norms (double accumulation, rounded to f32) of dense sets, and the value check of maxsim.h
// (finite, norm <= 1e19) of rows [row_begin, row_end) (masked rows skipped, norm 0): flag[0] = min over
// offending rows of 1 + row (atomicMin; the caller initialises it to ~0).
cudaError_t LaunchRowCheck(const SetsView& s, uint64_t row_begin, uint64_t row_end, float* norms,
                           unsigned long long* flag, cudaStream_t stream);

// ---- training backward ------------------------------------------------------------------------------

struct BackwardArgs {
  SetsView q, d;             // dense
  PairSpec pairs;            // layout + pair lists; argmax addressing as in the forward
  const int32_t* argmax = nullptr;
  const float* grad = nullptr;              // per pair (score index: matrix i*nd+j, else p)
  float* grad_q = nullptr;                  // [q rows, dim] or null
  float* grad_d = nullptr;                  // [d rows, dim] or null
  const uint64_t* q_pair_start = nullptr;   // list layout: pairs of query i are [start[i], start[i+1])
  unsigned long long* flag = nullptr;       // [2]: bad argmax (1 + flat index), bad grad (1 + pair)
  // Optional: a word of mapped pinned host memory that a bad entry also sets to 1 (a plain store), so that the host
  // knows after its synchronisation whether `flag` needs reading, without a copy on the good path.
  unsigned int* bad_host = nullptr;
};

cudaError_t LaunchBackwardCheck(const BackwardArgs& a, cudaStream_t stream);
// grad_Q rows [row_begin, row_end) (every kept row written, masked rows zeroed).
cudaError_t LaunchGradQ(const BackwardArgs& a, uint64_t row_begin, uint64_t row_end, cudaStream_t stream);
// Matrix and diagonal layouts with grad_D: grad_Q rows [q_row_begin, q_row_end) (when a.grad_q is set), every
// document row of grad_D (rows before the first document are not written) and the check of LaunchBackwardCheck,
// in one launch; grad_D has the bits of LaunchGradDIndexed (the ordered FMA chain). max_doc_len: the longest document.
cudaError_t LaunchBackwardDoc(const BackwardArgs& a, uint64_t q_row_begin, uint64_t q_row_end, uint64_t max_doc_len,
                              cudaStream_t stream);
// grad_D must be zeroed first.
cudaError_t LaunchGradDAtomic(const BackwardArgs& a, cudaStream_t stream);

// The deterministic grad_D's inverse index of one chunk of pairs (grad_d_sorted.cu): sort buffers of at least the
// chunk's argmax entries each, and CUB's temporary storage.
struct GradDIndex {
  uint32_t* keys = nullptr;      // destination row, or `sentinel` (no contribution)
  uint32_t* keys_alt = nullptr;
  uint64_t* vals = nullptr;      // query row << 32 | (pair - first pair of the chunk)
  uint64_t* vals_alt = nullptr;
  void* temp = nullptr;
  size_t temp_bytes = 0;
  uint32_t sentinel = 0;         // the number of document rows (< 2^32 - 1)
  uint64_t entry0 = 0;           // argmax index of the chunk's first entry
};
// Argmax entries a chunk may hold (GradDIndex: 24 bytes each): bounds the index at 12 MiB plus CUB's storage.
constexpr uint64_t kIndexEntries = 1ull << 19;
// CUB's temporary storage for chunks of up to max_entries.
cudaError_t GradDIndexTempBytes(uint64_t max_entries, uint32_t sentinel, size_t* bytes);
// Adds the contributions of pairs [p0, p1) (argmax entries [x.entry0, x.entry0 + n_entries), fewer than 2^32
// pairs) into grad_D in canonical (pair, token) order: zero grad_D first, then call it for consecutive chunks.
cudaError_t LaunchGradDIndexed(const BackwardArgs& a, GradDIndex x, uint64_t p0, uint64_t p1, uint64_t n_entries,
                               cudaStream_t stream);

// ---- top-k --------------------------------------------------------------------------------------------

// For each query i: the k best of running_in[i*k .. i*k + have) and scores[i * stride + c] (c < n, document
// index doc0 + c) are written to running_out[i*k ..] (unordered, min(k, have + n) entries). Keys are
// (ordered score bits << 32) | (0xFFFFFFFF - doc index): larger key = better (higher score, lower index).
cudaError_t LaunchTopkMerge(const float* scores, uint64_t stride, uint64_t n, uint64_t doc0, uint64_t nq,
                            const unsigned long long* running_in, unsigned long long* running_out, uint64_t have,
                            uint64_t k, cudaStream_t stream);

}  // namespace mscuda

#endif  // MAXSIM_PLUGINS_CUDA_KERNELS_H_
