// SPDX-License-Identifier: Apache-2.0
// The contract between the scoring engine and the CPU kernels.
//
// A kernel scores one prepared query set against one document set and returns, for every query token, the
// best "key" over the document tokens and its index:
//   key(q, d) = E(q, d)                   (dot)
//   key(q, d) = fl(E(q, d) * inv_norm(d)) (cosine; inv_norm = 1/||d|| in f32, 0 for a zero vector)
// where E(q, d) is THE canonical similarity: the sequential f32 fused multiply-add chain
//   acc = +0; for k in 0..dim-1: acc = fma(q[k], d[k], acc)
// on inputs widened exactly to f32. Every kernel must compute exactly this value for every pair it reports
// (vectorise across tokens, never across k), so exact results are bit-identical across kernels, ISAs and
// thread counts, and certified refinement reproduces the exact path bit for bit. Ties: the lowest document
// index wins (strict > while scanning in index order). The engine turns keys into scores (cosine: times the
// query token's inverse norm) and sums them.
//
// Assumptions every kernel may rely on (the engine guarantees them):
//   - the document has >= 1 token; the query has >= 1 token;
//   - every value is finite and every vector's norm <= 1e19 (validated), so no dot product overflows;
//   - for CERTIFIED/APPROXIMATE, codes and metadata are present and consistent with the originals (packed by
//     this library, or validated);
//   - q.qt has q.n_padded (a multiple of 16) lanes per k, its k rows q.lane_stride floats apart; lanes >=
//     n_tokens are zero.
#ifndef MAXSIM_SRC_KERNELS_KERNEL_H_
#define MAXSIM_SRC_KERNELS_KERNEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "maxsim/maxsim.h"
#include "maxsim/packed_format.h"

namespace maxsim {

// The row stride (in 4-byte lanes) of every transposed query layout: qt, the i8 interleaved layout, the bf16 pair
// layout. Why not n_padded: the kernels read one row per k (or k group) of a 16- or 32-lane block, and with
// n_padded * 4 bytes a multiple of 4 KB (Lq = 1024) every row of a block falls into the same L1 set (64 sets of
// 64-byte lines), 128 rows into 12 ways: each query load came from L2. An odd number of cache lines per row
// spreads consecutive rows over all 64 sets. Short queries (under 8 lines a row) keep n_padded: their whole
// block sits in consecutive lines anyway.
inline uint32_t LaneStride(uint32_t n_padded) {
  const uint32_t lines = n_padded / 16;
  return lines >= 8 && lines % 2 == 0 ? n_padded + 16 : n_padded;
}

// One query set, prepared once per call in layouts every kernel can read.
struct PreparedQuery {
  uint32_t n_tokens = 0;     // kept (unmasked) tokens
  uint32_t n_padded = 0;     // n_tokens rounded up to 16
  uint32_t lane_stride = 0;  // LaneStride(n_padded): distance between consecutive k rows of qt (floats) and k
                             // groups of the kernels' interleaved layouts (lanes of 4 bytes)
  uint32_t dim = 0;
  uint32_t padded_dim = 0;   // code row bytes (multiple of 64)
  const float* qt = nullptr;               // [dim][lane_stride] f32, transposed, zero padding lanes
  const float* rows = nullptr;             // [n_tokens][dim] f32, row-major
  const int8_t* codes = nullptr;           // [n_tokens][padded_dim], present for CERTIFIED/APPROXIMATE
  const maxsim_vector_meta* meta = nullptr;  // [n_tokens]: norm always; scale/resid/code_sum with codes
  // The kernel's own query layout (KernelOps::prepare), 64-byte aligned; nullptr when it has no hook.
  const void* layout = nullptr;
  // Which of the kernel's variants (KernelOps::variants) the context chose; 0 for kernels without variants.
  int variant = 0;
};

// One document set as a kernel sees it.
struct DocRef {
  uint32_t n_tokens = 0;
  uint32_t dim = 0;
  maxsim_dtype dtype = MAXSIM_F32;
  const uint8_t* originals = nullptr;  // row t at originals + t * orig_row_bytes, dim values of dtype
  uint64_t orig_row_bytes = 0;
  const int8_t* codes = nullptr;       // row t at codes + t * padded_dim (CERTIFIED/APPROXIMATE)
  uint32_t padded_dim = 0;
  const maxsim_vector_meta* meta = nullptr;  // norms (cosine) and quantisation metadata (screening)
  // Nonzero: identifies this document within one engine call (the engine sets document index + 1), so a
  // kernel may reuse per-document work across consecutive calls (KernelScratch::cache_*). 0: no reuse.
  uint64_t serial = 0;
};

// Kernel-owned per-thread state kept in KernelScratch::state (created by the kernel on first use).
struct KernelState {
  virtual ~KernelState() = default;
};

// Per-thread scratch memory a kernel may grow and reuse across calls.
struct KernelScratch {
  std::vector<float> rows;     // document rows widened to f32
  std::vector<float> inv;      // per document token 1/||d|| (cosine)
  std::vector<float> work;     // kernel-specific (screening keys and margins, tiles)
  std::vector<int32_t> i32;    // kernel-specific
  // Per-document cache: work derived from the document with DocRef::serial == cache_serial (widened rows,
  // re-laid-out rows, facts such as a minimum exponent), valid only for the kernel code that wrote cache_kind.
  // Scratch lives for one engine call, during which a document's bytes cannot change.
  uint64_t cache_serial = 0;
  uint32_t cache_kind = 0;
  int32_t cache_i32 = 0;
  std::vector<float> cache;
  std::unique_ptr<KernelState> state;  // kernel-specific (e.g. the screening pipeline's buffers)
  template <typename T>
  static T* Grow(std::vector<T>& v, size_t n) {
    if (v.size() < n) v.resize(n);
    return v.data();
  }
};

// Counters for certified/approximate runs (per thread, summed by the engine).
struct ScreenCounters {
  uint64_t refined = 0;          // document tokens whose exact similarity was computed
  uint64_t multi_candidate = 0;  // query tokens whose candidate set had more than one token
};

// Top-k pruning for KernelOps::screened_batch: a document whose certified upper bound on its score is strictly
// below `below` cannot enter the top-k, so the kernel skips its refinement. The score the engine computes is
// the double sum, in token order, of fl(key_s * weight_s) (weight = the query token's 1/||q|| for cosine, else
// key_s itself), rounded once to f32; the kernel bounds it with the same operations applied to each token's
// upper bound max_j fl(A_j + m_j) (every f32/double rounding is monotone, so the bound stays an upper bound).
// In APPROXIMATE mode the bound is that of the refined top row, which bounds the approximate score too.
struct ScreenPrune {
  const float* token_weight = nullptr;  // per query token (cosine: 1/||q||); nullptr: keys are scores
  float below = 0.0f;                   // prune documents whose bound is < below (-inf: never)
  uint8_t* pruned = nullptr;            // [n] out: 1 = pruned (its outputs are not written), else 0
};

// Paths of one kernel that give the same bits and differ only in speed on a given core (vdpbf16ps or FMA for
// exact bf16 in "avx512-bf16" and "amx"). The context chooses once, at creation: `env` names one (an unknown
// name, or one that cannot run here, is an error), else decide() does (timing allowed; the kernel caches it per
// process). `maxsim info` prints the choice and why; PreparedQuery::variant carries it to the kernel.
struct KernelVariants {
  const char* env;       // e.g. "MAXSIM_BF16_DOT"
  const char* what;      // what is chosen, for the report: "exact bf16 dot products"
  const char* names[4];  // variant i's name; nullptr ends the list
  int (*decide)(std::string* why);            // the variant when not forced, and why
  bool (*runs)(int variant, std::string* why);  // whether variant can run here; if not, why
};

struct KernelOps {
  // best_key[s], best_index[s] for s < q.n_tokens.
  void (*exact)(const PreparedQuery& q, const DocRef& d, maxsim_metric metric, float* best_key,
                int32_t* best_index, KernelScratch& scratch);
  // CERTIFIED: identical output to exact(). APPROXIMATE: i8 argmax (scales applied), that token refined.
  void (*screened)(const PreparedQuery& q, const DocRef& d, maxsim_metric metric, maxsim_mode mode,
                   float* best_key, int32_t* best_index, KernelScratch& scratch, ScreenCounters* counters);
  // Optional query-preparation hook, run once per query set and call (not per document): layout_bytes says
  // how much memory the kernel wants for `mode` (0: none), prepare writes it (64-byte aligned, zero-filled
  // beforehand) from the fields above; exact/screened then find it in PreparedQuery::layout. Kernels use it
  // for interleaved i8 / pair-swapped bf16 query layouts. Both must be set, or neither.
  size_t (*layout_bytes)(const PreparedQuery& q, maxsim_mode mode) = nullptr;
  void (*prepare)(const PreparedQuery& q, maxsim_mode mode, void* layout) = nullptr;
  // Optional: screened() for one query set against n documents (each with >= 1 token, all valid for the whole
  // call: packed documents), writing best_key/best_index[i * q.n_tokens + s] for document i. The kernel may
  // overlap one document's refinement with the next one's screening, and with `prune` skip documents that
  // cannot enter a top-k (see ScreenPrune). Outputs of unpruned documents equal screened()'s.
  void (*screened_batch)(const PreparedQuery& q, const DocRef* docs, size_t n, maxsim_metric metric,
                         maxsim_mode mode, float* best_key, int32_t* best_index, KernelScratch& scratch,
                         ScreenCounters* counters, const ScreenPrune* prune) = nullptr;
  // Optional: same-bits variants the context chooses between (see KernelVariants).
  const KernelVariants* variants = nullptr;
};

// One entry of the kernel list (kernels/kernel_list.inc).
struct KernelInfo {
  const char* name;          // what MAXSIM_ISA takes
  uint64_t required;         // CpuFeature bits
  int priority;              // higher wins; < 0: explicit only (never auto-selected, see KernelExplicitOnly)
  const char* description;
  const KernelOps* ops;
};

// The kernel list, highest priority first, including kernels this machine cannot run.
const KernelInfo* KernelList(size_t* count);
// Whether this machine runs kernel k; if not, why ("needs avx512vnni, which this CPU lacks").
bool KernelAvailable(const KernelInfo& k, std::string* reason);
// The widest Highway target packing may use under kernel k (a cap for pack::RowOpsFor): the one k's required CPU
// features cover, so that a kernel chosen to stay off an ISA (MAXSIM_ISA=avx2 on an AVX-512 machine) keeps
// packing's quantisation, widening and checksums off it too. "scalar" allows only the scalar/emulated target
// (where none is compiled, as on AArch64 whose baseline is NEON, RowOpsFor takes the narrowest there is).
int64_t PackingTargetCap(const KernelInfo& k);
// A row with a negative priority is selected only when named (MAXSIM_ISA / maxsim_options::isa), never by
// "auto": a kernel whose instructions no test here can validate as a whole (e.g. `sme`, checked only under an
// emulator) is offered for trying on hardware without ever being chosen for a user who did not ask for it.
inline bool KernelExplicitOnly(const KernelInfo& k) { return k.priority < 0; }

// 1/||d|| as the cosine key uses it. A vector whose norm is below the smallest normal f32 (2^-126) counts as
// a zero vector (cosine 0 with anything): its reciprocal would overflow f32, and no embedding model produces it.
inline float InvNorm(float norm) { return norm >= 0x1p-126f ? 1.0f / norm : 0.0f; }

// The start value of an unsigned-biased i8 dot product (vpdpbusd on q + 128): -128 * code_sum, in the
// accumulator's modulo-2^32 arithmetic. A validated code_sum (|sum| <= 127 * dim) never wraps; a FAST-validated
// (trusted) buffer may hold any value, and the product must not be signed-overflow UB even then.
inline int32_t CodeSumBias(int32_t code_sum) {
  return static_cast<int32_t>(0u - 128u * static_cast<uint32_t>(code_sum));
}

}  // namespace maxsim

#endif  // MAXSIM_SRC_KERNELS_KERNEL_H_
