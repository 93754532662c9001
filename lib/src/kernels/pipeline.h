// SPDX-License-Identifier: Apache-2.0
// The screening pipeline's contract, ISA-free: what a kernel's i8 phase (ComputeKeysFn / ComputeSurvivorsFn)
// receives and produces, the per-call and per-thread state of the pipeline, the shared i8 query layout, and the
// entry points of the Highway code (exact_hwy.cc + screen_hwy-inl.h), compiled for every target Highway builds
// on this architecture and looked up by target (HwyTargetOps). Nothing here assumes an instruction set; the
// per-architecture folders (x86/, arm/) hold only the i8 tiles, asm and matrix-unit code behind these hooks.
#ifndef MAXSIM_SRC_KERNELS_PIPELINE_H_
#define MAXSIM_SRC_KERNELS_PIPELINE_H_

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/kernel.h"

#ifndef MAXSIM_PF_HINT
#define MAXSIM_PF_HINT 2
#endif

// llvm-mca regions: one iteration of a tile's k loop, named "tile" + its shape (scripts/arm-mca.py compiles the
// kernel sources with -DMAXSIM_MCA and feeds the region to llvm-mca). Nothing in every real build.
#ifdef MAXSIM_MCA
#define MAXSIM_MCA_BEGIN(shape) __asm__ volatile("# LLVM-MCA-BEGIN tile%c0" ::"i"(shape))
#define MAXSIM_MCA_END() __asm__ volatile("# LLVM-MCA-END")
#else
#define MAXSIM_MCA_BEGIN(shape) ((void)0)
#define MAXSIM_MCA_END() ((void)0)
#endif

namespace maxsim {

// Per-lane query data of the screening kernels, written by the layout hook after the interleaved i8 codes (see
// I8QueryLayout): n_padded floats each, zero for padding lanes.
struct QueryLanes {
  const float* sq = nullptr;  // s_q, the query token's quantisation scale
  const float* qn = nullptr;  // ||q||
  const float* qr = nullptr;  // ||e_q||, the quantisation residual's norm
  const float* gq = nullptr;  // fl(gamma_dim * ||q||), the first product of the margin's f32 rounding term
};

// Cache lines to prefetch a few at a time while an i8 phase runs: the originals of the previous document's
// candidate rows (read by its refinement, which runs after this i8 phase). Issued in one burst, hundreds of
// DRAM prefetches stall on the line-fill buffers (measured: 44% of the selection time); spread over the i8
// tiles they overlap with arithmetic. Into L2 (prefetcht1): the i8 phase streams its own data through L1.
struct PrefetchQueue {
  std::vector<const char*> rows;  // first cache line of each row
  std::vector<const char*> pages;  // one line per 4 KB page of the next document's codes and metadata
  size_t lines_per_row = 0;
  size_t pos = 0, line = 1;  // next row, next line within it (line 0 of every row goes first, see Step)
  size_t per_step = 0;       // lines per Step()
  bool primed = false;       // line 0 of every row issued
  // The first step issues line 0 of every row at once: each row's first prefetch usually misses the TLB too
  // (rows of a document ~17 4 KB pages per Lq = 32 document), and issued one row after another those page walks
  // stalled the i8 loop one at a time (the walk holds the prefetch, and retirement, a few hundred cycles in a
  // VM). Back to back they overlap; the other lines of the rows then find their translations.
  void Step() {
    size_t n = per_step;
    if (!primed) Prime(&n);
    for (; n > 0 && pos < rows.size(); --n) {
      __builtin_prefetch(rows[pos] + 64 * line, 0, MAXSIM_PF_HINT);
      if (++line >= lines_per_row) {
        line = 1;
        ++pos;
      }
    }
  }
  void Flush() {
    if (!primed) Prime(nullptr);
    for (; pos < rows.size(); ++pos, line = 1) {
      for (; line < lines_per_row; ++line) __builtin_prefetch(rows[pos] + 64 * line, 0, MAXSIM_PF_HINT);
    }
  }
  void Reset() {
    pos = 0;
    line = 1;
    primed = false;
  }

 private:
  void Prime(size_t* budget) {
    for (const char* r : rows) __builtin_prefetch(r, 0, MAXSIM_PF_HINT);
    for (const char* r : pages) __builtin_prefetch(r, 0, MAXSIM_PF_HINT);
    primed = true;
    if (lines_per_row <= 1) pos = rows.size();
    if (budget) *budget = *budget > rows.size() ? *budget - rows.size() : 0;
  }
};

// What the ISA-specific i8 phase of screening needs for one (query, document) pair.
struct ScreenJob {
  const PreparedQuery* q = nullptr;
  const DocRef* d = nullptr;
  const void* layout = nullptr;  // the kernel's query layout (PreparedQuery::layout)
  QueryLanes lanes;
  const float* inv = nullptr;    // per document row 1/||d|| (cosine), else nullptr
  bool cosine = false;
  PrefetchQueue* pf = nullptr;   // call pf->Step() once per tile of rows (see ScreenCall::pf_rows_per_step)
  void* ctx = nullptr;           // ScreenCall::ctx: the kernel's own per-call state
};

// The ISA-specific i8 phase: for the query groups [g0, g0 + ng) (a group = W query tokens, one vector of the
// Highway target the kernel pairs it with) and every document row j, the approximate keys
//   K[gl * k_stride + j * W + l] = fl(fl(float(I) * s_d[j]) * s_q[l])   (cosine: then fl(... * inv[j]))
// with I the exact integer dot of the codes, the same expression as the portable kernel, and
//   top[gl * W + l] = max over j of those keys (NaN keys ignored; -inf when every key is NaN).
using ComputeKeysFn = void (*)(const ScreenJob& job, uint32_t g0, uint32_t ng, float* K, size_t k_stride,
                               float* top);

// A fused i8 phase (ComputeSurvivorsFn) keeps, per lane, a running threshold rt from the running maximum key a:
//   rt = fl(fl(a - c1) - fl(fl(|a| + c3) 2^-13)), clamped to [lo, hi]   (CERTIFIED)
//   rt = a, clamped to [lo, hi]                                          (APPROXIMATE)
// with per-lane constants from the pipeline (screen_hwy-inl.h, MakeRunningRule): c1 = fl(2.5 mb), c3 = fl(3 mb)
// of the lane's final threshold tk (Threshold); lo = hi = -inf for lanes whose tk is -inf whatever the keys
// (every row is kept there), lo = hi = +inf for padding lanes, else lo = -inf, hi = +inf. The doubled relative
// term (2^-13 against tk's 2^-14) absorbs every f32 rounding, so rt(a) <= tk(b) whenever a <= b and tk(b) is
// finite (proof at MakeRunningRule): a row whose key is below rt in a lane is below the final tk there.
struct RunningRule {
  const float* c1 = nullptr;  // W floats each, per lane of the group
  const float* c3 = nullptr;
  const float* lo = nullptr;
  const float* hi = nullptr;
  bool approximate = false;
};

// One query group's survivors of a fused i8 phase: every row that some lane kept (key >= rt there, or rt NaN),
// rows increasing, with its keys (the ComputeKeysFn expression, W floats per row).
struct SurvivorList {
  uint32_t* rows = nullptr;  // capacity: the document's rows
  float* keys = nullptr;     // [capacity][W], 64-byte aligned
  size_t n = 0;
};

// The fused i8 phase: like ComputeKeysFn for groups [g0, g0 + ng), but instead of storing every row's keys it
// keeps a running threshold per lane (rules[gl]) and stores only the rows some lane keeps (out[gl]); top as
// for ComputeKeysFn. The kept rows are a superset of the rows the selection keeps with the final threshold,
// as long as the final threshold of every lane that was not -inf from the start is finite (the pipeline checks
// that and otherwise redoes the block with ComputeKeysFn).
using ComputeSurvivorsFn = void (*)(const ScreenJob& job, uint32_t g0, uint32_t ng, const RunningRule* rules,
                                    SurvivorList* out, float* top);

// Tests only: make the pipeline treat every fused block as incomplete (it then redoes the block with
// ComputeKeysFn), so the fallback path runs on inputs where it would not be needed (pipeline.cc).
void ForceFusedFallbackForTest(bool on);
bool FusedFallbackForced();

// One screened call: one query set against n documents (KernelOps::screened_batch).
struct ScreenCall {
  const PreparedQuery* q = nullptr;
  const DocRef* docs = nullptr;
  size_t n = 0;
  maxsim_metric metric = MAXSIM_METRIC_DOT;
  maxsim_mode mode = MAXSIM_MODE_CERTIFIED;
  float* best_key = nullptr;     // [n][q->n_tokens]
  int32_t* best_index = nullptr;
  KernelScratch* scratch = nullptr;
  ScreenCounters* counters = nullptr;
  const ScreenPrune* prune = nullptr;
  ComputeKeysFn keys = nullptr;
  // Optional fused i8 phase (AMX); when set, the pipeline uses it and falls back to `keys` per block of groups
  // where a lane's final threshold is not finite.
  ComputeSurvivorsFn survivors = nullptr;
  uint32_t groups_per_block = 2;  // query groups per ComputeKeysFn call (at most 2)
  // How often `keys` calls ScreenJob::pf->Step(): at least once per pf_rows_per_step rows of every block of
  // groups, or (pf_skip_first_block) of every block but a document's first when it has several. The pipeline
  // spreads the prefetches over that many steps.
  uint32_t pf_rows_per_step = 16;
  bool pf_skip_first_block = false;
  // Per-call state of the kernel that owns `keys` (e.g. the avx2 sign table), handed to it unchanged in every
  // ScreenJob; the pipeline never reads it. nullptr when the kernel needs none.
  void* ctx = nullptr;
};

// Prefetches the codes and metadata of document rows [j0, j1) (the i8 tiles read a few rows as short streams,
// which the hardware prefetchers pick up too late when documents come from DRAM). ISA-free.
inline void PrefetchCodes(const DocRef& d, uint32_t j0, uint32_t j1) {
  if (j1 > d.n_tokens) j1 = d.n_tokens;
  for (uint32_t j = j0; j < j1; ++j) {
    const char* p = reinterpret_cast<const char*>(d.codes) + static_cast<size_t>(j) * d.padded_dim;
    for (uint32_t off = 0; off < d.padded_dim; off += 64) __builtin_prefetch(p + off, 0, 3);
    __builtin_prefetch(d.meta + j, 0, 3);
  }
}

// A ScreenCall for one screened_batch entry point: its arguments plus the ISA's i8 key function.
inline ScreenCall MakeScreenCall(const PreparedQuery& q, const DocRef* docs, size_t n, maxsim_metric metric,
                                 maxsim_mode mode, float* best_key, int32_t* best_index, KernelScratch& scratch,
                                 ScreenCounters* counters, const ScreenPrune* prune, ComputeKeysFn keys) {
  ScreenCall c;
  c.q = &q;
  c.docs = docs;
  c.n = n;
  c.metric = metric;
  c.mode = mode;
  c.best_key = best_key;
  c.best_index = best_index;
  c.scratch = &scratch;
  c.counters = counters;
  c.prune = prune;
  c.keys = keys;
  return c;
}

// Per-thread buffers of the screening pipeline (KernelScratch::state).
struct ScreenState : KernelState {
  // One document in flight: its candidate rows ("entries", grouped by query group, rows increasing), per entry
  // the lanes for which it is a certified candidate (cm), the lanes whose top row it is (tm), and its upper
  // bounds fl(A + m) for every lane (W floats).
  struct Doc {
    size_t n = 0;  // entries (the vectors below are capacity)
    std::vector<uint32_t> row, cm, tm;
    std::vector<float> up;
    std::vector<uint32_t> group_begin;  // n_groups + 1 entry offsets
    std::vector<float> inv;             // cosine: 1/||d|| per row
    std::vector<float> ub;              // per query token: upper bound on its key
    bool pruned = false;
  };
  Doc doc[2];
  std::vector<float> keys, top, scan_up;
  std::vector<uint32_t> scan_rows;
  std::vector<uint32_t> surv_rows;  // fused i8 phase: survivor rows of two groups, then
  std::vector<float> surv_keys;     // their keys (64-byte aligned inside), and
  std::vector<float> rule;          // the running-threshold constants of two groups (RunningRule, 4 x 2W)
  std::vector<float> widened;  // f16/bf16 rows of the refinement, widened to f32
  std::vector<uint8_t> items;  // refinement item lists (target-specific layout)
  std::vector<uint8_t> pairs;  // refinement (query lane, row) pairs of the pair-per-lane tile (target-specific)
  PrefetchQueue pf;                // the previous document's rows, drained during this document's i8 phase
  std::vector<uint32_t> pf_next;     // this document's rows to prefetch, with repeats (pf_next_n of them; the
  size_t pf_next_n = 0;              // vector only grows)
  std::vector<uint64_t> pf_seen;     // one bit per row of the document: already in pf.rows
};

// Entry points of exact_hwy.cc for one Highway target. lanes is the f32 vector width W of the pipeline (4 on
// NEON, 8 on AVX2, 16 on AVX-512; at most 16: lane masks are 16-bit).
struct HwyExactOps {
  size_t lanes;
  // Canonical E for every (query token, document row) and the running max / first argmax per query token.
  // rows: nd rows of dim f32, `stride` floats apart. inv: per row 1/||d|| (cosine) or nullptr (dot).
  void (*exact_f32)(const PreparedQuery& q, const float* rows, uint64_t stride, uint32_t nd, const float* inv,
                    float* best_key, int32_t* best_index);
  // f16/bf16 originals -> f32 rows of `dim` floats (stride dim).
  void (*widen)(const DocRef& d, float* out);
  // Certified/approximate screening of one query set against call.n documents (screen_hwy-inl.h): the i8 phase
  // through call.keys, then candidate selection, top-k pruning and refinement in this target's vectors.
  void (*screen)(const ScreenCall& call);
};

// The entry points compiled for Highway target `target` (HWY_AVX2, HWY_AVX3, HWY_NEON, ...; see
// hwy/detect_targets.h); nullptr when this build did not compile that target. Kernels name their target
// explicitly instead of Highway's own dispatch: the kernel list is the one dispatcher, and MAXSIM_ISA=avx2 on an
// AVX-512 machine must run the AVX2 code.
const HwyExactOps* HwyTargetOps(int64_t target);

// Document rows as f32: the originals when they are f32, else widened once per document into scratch.cache.
const float* RowsF32(const HwyExactOps& ops, const DocRef& d, KernelScratch& scratch, uint64_t* stride);

// The shared exact entry (KernelOps::exact) for a Highway target: widens f16/bf16 into scratch, computes
// cosine inverse norms, calls ops.exact_f32.
void ExactWithHwy(const HwyExactOps& ops, const PreparedQuery& q, const DocRef& d, maxsim_metric metric,
                  float* best_key, int32_t* best_index, KernelScratch& scratch);

// Query layouts shared by the screening kernels, written by the per-kernel prepare hook into one block:
//   i8 interleaved:  [padded_dim / 4][lane_stride][4] int8: lane s holds q8[s][4g .. 4g+3] (zero codes beyond
//                    dim). AVX2, AMX (as the B tile, 16 groups per tile) and the Arm dot-product kernels read it
//                    signed; VNNI reads it with a +128 bias (xor 0x80) as unsigned. The SIMD loops stop after Groups4(dim) groups.
//   then QueryLanes:  sq, qn, qr, gq, n_padded floats each (64-byte aligned: n_padded is a multiple of 16).
struct I8QueryLayout {
  static size_t Groups4(uint32_t dim) { return (dim + 3) / 4; }
  static size_t CodeBytes(const PreparedQuery& q) {
    return static_cast<size_t>(q.padded_dim / 4) * q.lane_stride * 4;
  }
  static size_t Bytes(const PreparedQuery& q) { return CodeBytes(q) + 4 * sizeof(float) * q.n_padded; }
  // Writes the layout; xor_bias = 0x80 gives the biased unsigned form.
  static void Write(const PreparedQuery& q, uint8_t xor_bias, void* out);
  static QueryLanes Lanes(const PreparedQuery& q, const void* layout) {
    const float* f = reinterpret_cast<const float*>(static_cast<const uint8_t*>(layout) + CodeBytes(q));
    QueryLanes l;
    l.sq = f;
    l.qn = f + q.n_padded;
    l.qr = f + 2 * static_cast<size_t>(q.n_padded);
    l.gq = f + 3 * static_cast<size_t>(q.n_padded);
    return l;
  }
};

// The i8 pair layout of the SMMLA kernels (neon-i8mm, sve-i8mm), stored by them after I8QueryLayout: SMMLA takes
// 8 consecutive codes of two query lanes, [padded_dim / 8][n_padded / 2 lane pairs][2 lanes][8 codes] int8, zero
// beyond dim and for padding lanes. Signed (the canonical codes go in unchanged).
struct I8PairLayout {
  static size_t StepBytes(const PreparedQuery& q) { return static_cast<size_t>(q.n_padded) * 8; }  // per 8 k
  static size_t Bytes(const PreparedQuery& q) { return static_cast<size_t>(q.padded_dim / 8) * StepBytes(q); }
  // `out` is zero-filled beforehand (KernelOps::prepare): only kept tokens' codes up to dim are written.
  static void Write(const PreparedQuery& q, int8_t* out);
};

}  // namespace maxsim

#endif  // MAXSIM_SRC_KERNELS_PIPELINE_H_
