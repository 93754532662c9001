// SPDX-License-Identifier: Apache-2.0
// The shared half of the SVE kernels (screen_sve.cc: SDOT, screen_sve_i8mm.cc: SMMLA): the document view the i8
// tiles read, the keys of a tile, the row loop, the ComputeKeysFn that feeds the screening pipeline
// (kernels/pipeline.h, Highway NEON target: W = 4 query lanes per group) and the KernelOps entry points. The
// exact path is exact_sve.cc's. Each kernel file supplies Impl: its i8 tile (Impl::Tile), how many document rows
// one vector of it covers, and the document layout it reads.
//
// Vector-length agnostic by putting document rows, not query lanes, across the 128-bit segments of a vector. The
// pipeline wants keys as [row][4 lanes] per query group (its W = 4), and SDOT / SMMLA by segment give exactly
// that: with the group's query codes replicated into every segment (LD1RQB) and segment s of the document
// operand holding row j + s, one instruction computes 4 query lanes x (VL / 128) rows, and the result vector is
// the keys block of those rows as the pipeline stores it (one predicated ST1W). So a tile uses every lane at every
// vector length, whatever the query length, and a 128-bit core runs it as NEON's tile shape. Rows beyond the
// document in a vector's last segments are computed on zero codes and never stored (WHILELT on 4 nd).
//
// Included by each kernel file after its target pragma and <arm_sve.h>, so these functions are compiled for that
// file's instructions. They sit in an unnamed namespace: every file gets its own copies, and the linker can never
// merge an SVE-compiled copy into code that runs on other cores.
#include <arm_neon.h>

#include <cstddef>
#include <cstdint>
#include <limits>

#include "hwy/detect_targets.h"  // HWY_NEON: the Highway target whose screening pipeline the SVE kernels feed
#include "kernels/arm/sve_kernels.h"
#include "kernels/pipeline.h"

namespace maxsim {
namespace arm {
namespace sve {
namespace {

constexpr uint32_t kW = 4;  // query lanes per group of the NEON pipeline = f32 lanes of one 128-bit segment

// A document as the i8 tiles read it: the code bytes of the vector whose first row is j, at chunk c (a chunk =
// the k range one instruction covers per segment), are codes + j * row_stride + c * chunk_stride. sd4 / inv4
// repeat each row's s_d and 1/||d|| (cosine) for its 4 lanes, zero past the document (nd_pad rows).
struct DocView {
  const int8_t* codes = nullptr;
  size_t row_stride = 0;
  size_t chunk_stride = 0;
  uint32_t nd = 0;
  const float* sd4 = nullptr;
  const float* inv4 = nullptr;  // cosine only
};

// The query side of a tile: the signed I8QueryLayout at group g0 (16 bytes = 4 lanes x 4 codes per k-group,
// qstride bytes apart) and, for SMMLA, I8PairLayout at g0 (16 bytes = 2 lanes x 8 codes per lane pair, own_stride
// bytes per 8 k).
struct QueryArgs {
  const int8_t* ql = nullptr;
  size_t qstride = 0;
  const int8_t* own = nullptr;
  size_t own_stride = 0;
  uint32_t groups4 = 0;  // k-groups of 4 covering dim
};

// Per-call state (ScreenCall::ctx): the current document's view, re-made when the document changes. Its bytes
// live in KernelScratch::i32, which the pipeline leaves to the kernel.
struct CallState {
  KernelScratch* scratch = nullptr;
  const int8_t* codes = nullptr;  // the document the view is of (codes, metadata, length, metric)
  const maxsim_vector_meta* meta = nullptr;
  uint32_t nd = 0;
  bool cosine = false;
  DocView view;
};

template <typename Impl>
const DocView& PrepareDoc(const ScreenJob& job) {
  CallState& st = *static_cast<CallState*>(job.ctx);
  const DocRef& d = *job.d;
  if (st.codes == d.codes && st.meta == d.meta && st.nd == d.n_tokens && st.cosine == job.cosine) return st.view;
  const uint32_t per_vec = Impl::RowsPerVector();
  const size_t nd_pad = (static_cast<size_t>(d.n_tokens) + per_vec - 1) / per_vec * per_vec;
  const uint32_t groups4 = static_cast<uint32_t>(I8QueryLayout::Groups4(d.dim));
  const size_t code_bytes = (Impl::LayoutBytes(d, groups4, nd_pad) + 63) / 64 * 64;
  const size_t lanes = nd_pad * kW;
  const size_t bytes = code_bytes + lanes * sizeof(float) * (job.cosine ? 2 : 1) + 64;
  int32_t* mem = KernelScratch::Grow(st.scratch->i32, bytes / 4 + 1);
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(mem) + 63) & ~uintptr_t{63});
  DocView& v = st.view;
  v = DocView{};
  v.nd = d.n_tokens;
  Impl::Layout(d, groups4, nd_pad, reinterpret_cast<int8_t*>(base), &v);
  float* sd4 = reinterpret_cast<float*>(base + code_bytes);
  float* inv4 = job.cosine ? sd4 + lanes : nullptr;
  for (size_t r = 0; r < nd_pad; ++r) {
    const float s = r < d.n_tokens ? d.meta[r].scale : 0.0f;
    const float w = r < d.n_tokens && inv4 ? job.inv[r] : 0.0f;
    for (uint32_t l = 0; l < kW; ++l) {
      sd4[r * kW + l] = s;
      if (inv4) inv4[r * kW + l] = w;
    }
  }
  v.sd4 = sd4;
  v.inv4 = inv4;
  st.codes = d.codes;
  st.meta = d.meta;
  st.nd = d.n_tokens;
  st.cosine = job.cosine;
  return v;
}

// The keys of the rows [row, row + VL / 128) a vector of exact i32 dots I covers (segment s = row + s, lane l of
// the segment = query lane l): fl(fl(float(I) * s_d) * s_q) (cosine: then * 1/||d||), the portable kernel's
// expression, stored as the pipeline's [row][4] block (rows past the document not stored), and folded into the
// running per-lane maximum `top` with FMAXNM (a NaN key is ignored, as NEON's vmaxnmq).
template <bool kCos>
inline void PutKeys(svint32_t dots, uint32_t row, const DocView& v, svfloat32_t sq, float* K, svfloat32_t& top) {
  const svbool_t pt = svptrue_b32();
  const svbool_t pr = svwhilelt_b32(static_cast<uint64_t>(row) * kW, static_cast<uint64_t>(v.nd) * kW);
  const size_t at = static_cast<size_t>(row) * kW;
  svfloat32_t a = svmul_f32_x(pt, svmul_f32_x(pt, svcvt_f32_s32_x(pt, dots), svld1_f32(pt, v.sd4 + at)), sq);
  if (kCos) a = svmul_f32_x(pt, a, svld1_f32(pt, v.inv4 + at));
  svst1_f32(pr, K + at, a);
  top = svmaxnm_f32_m(pr, top, a);
}

// The per-lane maximum over the segments of `top` (the same rows' lanes l in every segment), FMAXNM as above.
inline void StoreTop(svfloat32_t top, float* out) {
  alignas(64) float buf[64];  // 2048 bits, the architectural maximum vector length
  svst1_f32(svptrue_b32(), buf, top);
  float32x4_t m = vld1q_f32(buf);
  for (uint64_t s = kW; s < svcntw(); s += kW) m = vmaxnmq_f32(m, vld1q_f32(buf + s));
  vst1q_f32(out, m);
}

// Every document row: tiles of Impl::kVectors vectors (each covering Impl::RowsPerVector() rows), then 4, 2, 1.
// pf_doc: the document whose code rows the tiles read in place (prefetched a few tiles ahead), else nullptr.
template <typename Impl, int NQ, bool kCos>
inline void RowsKeys(const QueryArgs& a, const DocView& v, const DocRef* pf_doc, const float* sq_lanes, float* K,
                     size_t gs, float* top_out, PrefetchQueue* pf) {
  constexpr int kV = Impl::kVectors;
  const svbool_t pt = svptrue_b32();
  const svfloat32_t sq0 = svld1rq_f32(pt, sq_lanes);
  const svfloat32_t sq1 = NQ > 1 ? svld1rq_f32(pt, sq_lanes + kW) : sq0;
  svfloat32_t top0 = svdup_n_f32(-std::numeric_limits<float>::infinity());
  svfloat32_t top1 = top0;
  const uint32_t per_vec = Impl::RowsPerVector();
  const uint32_t nvec = (v.nd + per_vec - 1) / per_vec;
  uint32_t w = 0;
  if (pf_doc) PrefetchCodes(*pf_doc, 0, 2 * kV * per_vec);
  for (; w + kV <= nvec; w += kV) {
    if (pf_doc) PrefetchCodes(*pf_doc, (w + 2 * kV) * per_vec, (w + 3 * kV) * per_vec);
    if (pf) pf->Step();
    Impl::template Tile<NQ, kV, kCos>(a, v, w * per_vec, sq0, sq1, K, gs, top0, top1);
  }
  if (kV > 4 && w + 4 <= nvec) {
    Impl::template Tile<NQ, 4, kCos>(a, v, w * per_vec, sq0, sq1, K, gs, top0, top1);
    w += 4;
  }
  if (w + 2 <= nvec) {
    Impl::template Tile<NQ, 2, kCos>(a, v, w * per_vec, sq0, sq1, K, gs, top0, top1);
    w += 2;
  }
  if (w < nvec) Impl::template Tile<NQ, 1, kCos>(a, v, w * per_vec, sq0, sq1, K, gs, top0, top1);
  StoreTop(top0, top_out);
  if (NQ > 1) StoreTop(top1, top_out + kW);
}

// ComputeKeysFn (kernels/pipeline.h) of an SVE kernel: query groups [g0, g0 + ng), ng <= 2.
template <typename Impl>
void Keys(const ScreenJob& job, uint32_t g0, uint32_t ng, float* K, size_t k_stride, float* top) {
  const PreparedQuery& q = *job.q;
  const DocView& v = PrepareDoc<Impl>(job);
  const int8_t* layout = static_cast<const int8_t*>(job.layout);
  QueryArgs a;
  a.qstride = static_cast<size_t>(q.lane_stride) * 4;
  a.ql = layout + static_cast<size_t>(g0) * kW * 4;
  a.groups4 = static_cast<uint32_t>(I8QueryLayout::Groups4(q.dim));
  if (Impl::kPairLayout) {
    a.own = layout + I8QueryLayout::Bytes(q) + static_cast<size_t>(g0) * kW * 8;
    a.own_stride = I8PairLayout::StepBytes(q);
  }
  const DocRef* pf_doc = v.codes == job.d->codes ? job.d : nullptr;
  const float* sq = job.lanes.sq + static_cast<size_t>(g0) * kW;
  if (ng == 2) {
    job.cosine ? RowsKeys<Impl, 2, true>(a, v, pf_doc, sq, K, k_stride, top, job.pf)
               : RowsKeys<Impl, 2, false>(a, v, pf_doc, sq, K, k_stride, top, job.pf);
  } else {
    job.cosine ? RowsKeys<Impl, 1, true>(a, v, pf_doc, sq, K, k_stride, top, job.pf)
               : RowsKeys<Impl, 1, false>(a, v, pf_doc, sq, K, k_stride, top, job.pf);
  }
}

template <typename Impl>
void ScreenedBatch(const PreparedQuery& q, const DocRef* docs, size_t n, maxsim_metric metric, maxsim_mode mode,
                   float* best_key, int32_t* best_index, KernelScratch& scratch, ScreenCounters* counters,
                   const ScreenPrune* prune) {
  CallState st;
  st.scratch = &scratch;
  ScreenCall c =
      MakeScreenCall(q, docs, n, metric, mode, best_key, best_index, scratch, counters, prune, &Keys<Impl>);
  c.ctx = &st;
  c.pf_rows_per_step = Impl::kVectors * Impl::RowsPerVector();  // RowsKeys steps once per full tile
  HwyTargetOps(HWY_NEON)->screen(c);
}

template <typename Impl>
void Screened(const PreparedQuery& q, const DocRef& d, maxsim_metric metric, maxsim_mode mode, float* best_key,
              int32_t* best_index, KernelScratch& scratch, ScreenCounters* counters) {
  ScreenedBatch<Impl>(q, &d, 1, metric, mode, best_key, best_index, scratch, counters, nullptr);
}

// The query layout: the signed I8QueryLayout (codes, then QueryLanes, which the pipeline reads), then, for
// SMMLA, I8PairLayout.
template <typename Impl>
size_t QueryLayoutBytes(const PreparedQuery& q, maxsim_mode mode) {
  if (mode == MAXSIM_MODE_EXACT) return 0;
  return I8QueryLayout::Bytes(q) + (Impl::kPairLayout ? I8PairLayout::Bytes(q) : 0);
}

template <typename Impl>
void PrepareQuery(const PreparedQuery& q, maxsim_mode mode, void* out) {
  if (mode == MAXSIM_MODE_EXACT) return;
  I8QueryLayout::Write(q, 0, out);
  if (Impl::kPairLayout) I8PairLayout::Write(q, static_cast<int8_t*>(out) + I8QueryLayout::Bytes(q));
}

template <typename Impl>
constexpr KernelOps Ops() {
  return KernelOps{&SveExact, &Screened<Impl>, &QueryLayoutBytes<Impl>, &PrepareQuery<Impl>,
                   &ScreenedBatch<Impl>};
}

}  // namespace
}  // namespace sve
}  // namespace arm
}  // namespace maxsim
