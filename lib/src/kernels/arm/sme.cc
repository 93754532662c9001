// SPDX-License-Identifier: Apache-2.0
// Kernel "sme": AArch64 with the Scalable Matrix Extension (FEAT_SME: Apple M4, Arm C1 cores). Explicit only
// (a negative priority in kernel_list.inc): it has run only under qemu, never on SME silicon, so it is never
// auto-selected; MAXSIM_ISA=sme asks for it. Compiled by clang (GCC 12 has no SME; CMakeLists.txt says how the
// object joins the g++ build); SME is enabled per function (MAXSIM_SME_FN, on the streaming functions only), so
// everything else here, including the standard-library code this file instantiates, is baseline AArch64.
//
// Exact path: FMOPA f32 outer products into ZA. One k step of a block is
//   ZA_t[i][j] = fma(q_t[i], d_t[j], ZA_t[i][j])   for every active query lane i and document column j
// (four 32-bit tiles, 2 query vectors x 2 document vectors of SVL/32 lanes: 32 x 32 tokens at 512-bit SVL).
// Why the results are the canonical E bit for bit (kernel.h): the Arm ARM defines the non-widening FMOPA
// element operation as FPMulAdd_ZA(acc, n, m), which is FPMulAdd (one product, one addition, ONE rounding: a
// fused multiply-add) with FPCR.DN forced to 1 and exceptions not raised. Default NaN and exception flags do not
// matter here (inputs are finite and no dot product overflows, kernel.h); the rounding mode and FZ are the
// FPCR's, the same as for every other kernel's FMLA. ZERO {ZA} makes every element +0, and the tile takes one
// FMOPA per k in increasing k, so each element runs exactly acc = +0; acc = fma(q[k], d[k], acc) for k = 0..dim-1
// (fma is symmetric in its two factors). Inactive lanes (predicates) leave their elements untouched and are never
// read. The column scan reads each tile column (svread_ver: all query lanes of one document token) in document
// order, cosine multiplies by 1/||d|| (one f32 rounding, as everywhere), and keeps the first maximum (strict >).
// tests/kernel_test.cc (float64 reference, adversarial inputs) and tests/cross_isa_test.cc (bits committed on
// x86-64) check this under qemu at 128- to 2048-bit vector lengths; qemu 7.2 computes f32 FMOPA and the ZA
// reads correctly (checked against std::fma element by element).
//
// Documents: the f32 rows transposed once per document to [dim][nd rounded up to 16] (scratch.cache), so that
// one k step loads 2 contiguous document vectors; the query is PreparedQuery::qt ([dim][lane_stride], already
// one contiguous vector of query lanes per k).
//
// Certified / approximate: the shared screening pipeline (screen_hwy-inl.h, Highway NEON target: W = 4 query
// lanes per group; candidate selection and refinement with the canonical chain), with the i8 keys computed in
// streaming SVE by SDOT by element: per document row, one LD1RQB replicates 16 code bytes (4 k-groups) into
// every 128-bit segment, and for each of the 4 groups, SDOT (index T) adds the 4-code dot of every query lane
// (the signed I8QueryLayout: 4 lanes x 4 codes per segment, SVL/32 lanes per vector) into that lane's i32: the
// exact integer dot I (|4-product sum| <= 4 * 128 * 127, no wrap in any order). Not int8 SMOPA: qemu 7.2
// computes the int8 outer products wrongly, so an SMOPA tile could not be validated here and is left out.
#if !defined(__clang__) || !defined(__aarch64__)
#error "kernels/arm/sme.cc is compiled by clang for AArch64 only (CMakeLists.txt, MAXSIM_SME)"
#endif

#include <arm_sme.h>

#include <cstddef>
#include <cstdint>
#include <limits>

#include "hwy/detect_targets.h"  // HWY_NEON: the Highway target of the shared pipeline on AArch64
#include "kernels/pipeline.h"

namespace maxsim {
namespace arm {
namespace {

// SME code is enabled on the streaming functions only; the rest of the file is baseline AArch64.
#define MAXSIM_SME_FN __attribute__((target("sme")))

// ---- exact: FMOPA tiles ----------------------------------------------------------------------------------------

struct ExactArgs {
  const float* qt = nullptr;  // PreparedQuery::qt
  size_t qstride = 0;         // floats between k rows of qt
  uint32_t nq = 0;            // query tokens
  const float* dt = nullptr;  // the document transposed: [dim][dstride]
  size_t dstride = 0;
  uint32_t nd = 0;
  uint32_t dim = 0;
  const float* inv = nullptr;  // cosine: 1/||d|| per document token
  float* best_key = nullptr;
  int32_t* best_index = nullptr;
};

// Columns [0, n) of tile kTile (document tokens j0 .. j0 + n - 1) into the running max / first argmax of one
// query vector.
template <int kTile, bool kCos>
MAXSIM_SME_FN inline void ScanColumns(svbool_t pq, uint32_t n, uint32_t j0, const float* inv, svfloat32_t& best,
                        svint32_t& arg) __arm_streaming __arm_in("za") {
  for (uint32_t c = 0; c < n; ++c) {
    svfloat32_t e = svread_ver_za32_f32_m(svdup_n_f32(0.0f), pq, kTile, c);
    if (kCos) e = svmul_n_f32_x(pq, e, inv[j0 + c]);
    const svbool_t gt = svcmpgt_f32(pq, e, best);
    best = svsel_f32(gt, e, best);
    arg = svsel_s32(gt, svdup_n_s32(static_cast<int32_t>(j0 + c)), arg);
  }
}

// One block of up to 2 x 2 tiles; kTwoQ: the second query vector has active lanes (else tiles 1 and 3 idle).
template <bool kTwoQ>
MAXSIM_SME_FN inline void BlockProducts(const ExactArgs& a, const float* q, const float* d, svbool_t pq0, svbool_t pq1,
                          svbool_t pd0, svbool_t pd1) __arm_streaming __arm_inout("za") {
  svzero_za();
  for (uint32_t k = 0; k < a.dim; ++k) {
    const float* qk = q + k * a.qstride;
    const float* dk = d + k * a.dstride;
    const svfloat32_t q0 = svld1_f32(pq0, qk);
    const svfloat32_t d0 = svld1_f32(pd0, dk);
    const svfloat32_t d1 = svld1_vnum_f32(pd1, dk, 1);
    svmopa_za32_f32_m(0, pq0, pd0, q0, d0);
    svmopa_za32_f32_m(2, pq0, pd1, q0, d1);
    if (kTwoQ) {
      const svfloat32_t q1 = svld1_vnum_f32(pq1, qk, 1);
      svmopa_za32_f32_m(1, pq1, pd0, q1, d0);
      svmopa_za32_f32_m(3, pq1, pd1, q1, d1);
    }
  }
}

template <bool kCos>
MAXSIM_SME_FN __arm_new("za") __arm_locally_streaming void ExactTiles(const ExactArgs& a) {
  const uint32_t n = static_cast<uint32_t>(svcntw());
  for (uint32_t qb = 0; qb < a.nq; qb += 2 * n) {
    const svbool_t pq0 = svwhilelt_b32_u32(qb, a.nq);
    const svbool_t pq1 = svwhilelt_b32_u32(qb + n, a.nq);
    const bool two_q = qb + n < a.nq;
    svfloat32_t best0 = svdup_n_f32(-std::numeric_limits<float>::infinity()), best1 = best0;
    svint32_t arg0 = svdup_n_s32(-1), arg1 = arg0;
    for (uint32_t jb = 0; jb < a.nd; jb += 2 * n) {
      const svbool_t pd0 = svwhilelt_b32_u32(jb, a.nd);
      const svbool_t pd1 = svwhilelt_b32_u32(jb + n, a.nd);
      const uint32_t left = a.nd - jb;
      const uint32_t n0 = left < n ? left : n;
      const uint32_t n1 = left - n0 < n ? left - n0 : n;
      if (two_q) {
        BlockProducts<true>(a, a.qt + qb, a.dt + jb, pq0, pq1, pd0, pd1);
      } else {
        BlockProducts<false>(a, a.qt + qb, a.dt + jb, pq0, pq1, pd0, pd1);
      }
      // Document order per query lane: tile 0 (columns jb ..), then tile 2 (columns jb + n ..).
      ScanColumns<0, kCos>(pq0, n0, jb, a.inv, best0, arg0);
      ScanColumns<2, kCos>(pq0, n1, jb + n, a.inv, best0, arg0);
      if (two_q) {
        ScanColumns<1, kCos>(pq1, n0, jb, a.inv, best1, arg1);
        ScanColumns<3, kCos>(pq1, n1, jb + n, a.inv, best1, arg1);
      }
    }
    svst1_f32(pq0, a.best_key + qb, best0);
    svst1_s32(pq0, a.best_index + qb, arg0);
    if (two_q) {
      svst1_vnum_f32(pq1, a.best_key + qb, 1, best1);
      svst1_vnum_s32(pq1, a.best_index + qb, 1, arg1);
    }
  }
}

void Exact(const PreparedQuery& q, const DocRef& d, maxsim_metric metric, float* best_key, int32_t* best_index,
           KernelScratch& scratch) {
  const uint32_t nd = d.n_tokens, dim = d.dim;
  const size_t dstride = (static_cast<size_t>(nd) + 15) & ~static_cast<size_t>(15);
  constexpr uint32_t kKind = 0x534d4501;  // "SME" 1: the document's f32 rows transposed to [dim][dstride]
  if (d.serial == 0 || scratch.cache_serial != d.serial || scratch.cache_kind != kKind) {
    const float* rows = reinterpret_cast<const float*>(d.originals);
    size_t stride = d.orig_row_bytes / sizeof(float);
    if (d.dtype != MAXSIM_F32) {  // widened exactly, as every kernel does
      float* w = KernelScratch::Grow(scratch.rows, static_cast<size_t>(nd) * dim + 16);
      HwyTargetOps(HWY_NEON)->widen(d, w);
      rows = w;
      stride = dim;
    }
    float* dt = KernelScratch::Grow(scratch.cache, dim * dstride);
    for (uint32_t j = 0; j < nd; ++j) {
      const float* r = rows + j * stride;
      for (uint32_t k = 0; k < dim; ++k) dt[k * dstride + j] = r[k];
    }
    scratch.cache_serial = d.serial;
    scratch.cache_kind = kKind;
  }
  ExactArgs a;
  a.qt = q.qt;
  a.qstride = q.lane_stride;
  a.nq = q.n_tokens;
  a.dt = scratch.cache.data();
  a.dstride = dstride;
  a.nd = nd;
  a.dim = dim;
  a.best_key = best_key;
  a.best_index = best_index;
  if (metric == MAXSIM_METRIC_COSINE) {
    float* w = KernelScratch::Grow(scratch.inv, nd);
    for (uint32_t t = 0; t < nd; ++t) w[t] = InvNorm(d.meta[t].norm);
    a.inv = w;
    ExactTiles<true>(a);
  } else {
    ExactTiles<false>(a);
  }
}

// ---- screening: i8 keys with SDOT in streaming SVE -------------------------------------------------------------

constexpr uint32_t kW = 4;       // query lanes per group of the Highway NEON pipeline
constexpr uint32_t kChunk = 64;  // document rows per streaming call (the prefetch queue steps between calls)

struct KeyArgs {
  const int8_t* ql = nullptr;  // I8QueryLayout codes (signed) at the first lane of the call's groups
  size_t qstride = 0;          // bytes between k-groups of ql
  uint32_t nl = 0;             // query lanes of the call (4 per group)
  uint32_t groups4 = 0;        // k-groups of 4 codes covering dim (query codes beyond dim are zero)
  const int8_t* codes = nullptr;
  uint32_t padded_dim = 0;
  const maxsim_vector_meta* meta = nullptr;
  const float* inv = nullptr;  // cosine: 1/||d|| per row
  const float* sq = nullptr;   // per lane s_q
  float* K = nullptr;          // ComputeKeysFn's K and k_stride
  size_t k_stride = 0;
  float* top = nullptr;        // per lane running max, read and written by every chunk
};

// The keys of row j for the lanes [l0, l0 + svcntw()) of the call (ComputeKeysFn's expression): each group's 4
// lanes go to K[group * k_stride + j * 4 + l] by one store predicated to those lanes, its base moved back by the
// lanes before them (inactive lanes access no memory).
template <bool kCos>
MAXSIM_SME_FN inline void StoreKeys(const KeyArgs& a, uint32_t j, uint32_t l0, svbool_t pl, svint32_t acc, svfloat32_t sq,
                      svfloat32_t& top) __arm_streaming {
  svfloat32_t key = svmul_f32_x(pl, svmul_n_f32_x(pl, svcvt_f32_s32_x(pl, acc), a.meta[j].scale), sq);
  if (kCos) key = svmul_n_f32_x(pl, key, a.inv[j]);
  top = svmaxnm_f32_m(pl, top, key);
  const uint32_t n = static_cast<uint32_t>(svcntw());
  for (uint32_t l = 0; l < n && l0 + l < a.nl; l += kW) {
    const svbool_t p4 = svbic_b_z(svptrue_b32(), svwhilelt_b32_u32(0, l + kW), svwhilelt_b32_u32(0, l));
    const uintptr_t dst = reinterpret_cast<uintptr_t>(a.K + (l0 + l) / kW * a.k_stride + static_cast<size_t>(j) * kW);
    svst1_f32(p4, reinterpret_cast<float*>(dst - l * sizeof(float)), key);
  }
}

// SDOT by element T of one row's replicated 16 code bytes, for the lanes of qv.
#define MAXSIM_SME_DOT4(T)                                            \
  {                                                                   \
    const svint8_t qv = svld1_s8(pb, ql + (g + T) * a.qstride);       \
    acc0 = svdot_lane_s32(acc0, qv, d0, T);                           \
    acc1 = svdot_lane_s32(acc1, qv, d1, T);                           \
    acc2 = svdot_lane_s32(acc2, qv, d2, T);                           \
    acc3 = svdot_lane_s32(acc3, qv, d3, T);                           \
  }
#define MAXSIM_SME_DOT1(T)                                                                   \
  acc0 = svdot_lane_s32(acc0, svld1_s8(pb, ql + (g + T) * a.qstride), d0, T);

template <bool kCos>
MAXSIM_SME_FN __arm_locally_streaming void KeysRows(const KeyArgs& a, uint32_t j0, uint32_t j1) {
  const uint32_t n = static_cast<uint32_t>(svcntw());
  const svbool_t all = svptrue_b8();
  for (uint32_t l0 = 0; l0 < a.nl; l0 += n) {
    const svbool_t pl = svwhilelt_b32_u32(l0, a.nl);
    const svbool_t pb = svwhilelt_b8_u32(4 * l0, 4 * a.nl);
    const int8_t* ql = a.ql + 4 * static_cast<size_t>(l0);
    const svfloat32_t sq = svld1_f32(pl, a.sq + l0);
    svfloat32_t top = svld1_f32(pl, a.top + l0);
    uint32_t j = j0;
    for (; j + 4 <= j1; j += 4) {
      const int8_t* r0 = a.codes + static_cast<size_t>(j) * a.padded_dim;
      const int8_t* r1 = r0 + a.padded_dim;
      const int8_t* r2 = r1 + a.padded_dim;
      const int8_t* r3 = r2 + a.padded_dim;
      svint32_t acc0 = svdup_n_s32(0), acc1 = acc0, acc2 = acc0, acc3 = acc0;
      for (uint32_t g = 0; g < a.groups4; g += 4) {
        const svint8_t d0 = svld1rq_s8(all, r0 + 4 * g);
        const svint8_t d1 = svld1rq_s8(all, r1 + 4 * g);
        const svint8_t d2 = svld1rq_s8(all, r2 + 4 * g);
        const svint8_t d3 = svld1rq_s8(all, r3 + 4 * g);
        MAXSIM_SME_DOT4(0)
        MAXSIM_SME_DOT4(1)
        MAXSIM_SME_DOT4(2)
        MAXSIM_SME_DOT4(3)
      }
      StoreKeys<kCos>(a, j, l0, pl, acc0, sq, top);
      StoreKeys<kCos>(a, j + 1, l0, pl, acc1, sq, top);
      StoreKeys<kCos>(a, j + 2, l0, pl, acc2, sq, top);
      StoreKeys<kCos>(a, j + 3, l0, pl, acc3, sq, top);
    }
    for (; j < j1; ++j) {
      const int8_t* r0 = a.codes + static_cast<size_t>(j) * a.padded_dim;
      svint32_t acc0 = svdup_n_s32(0);
      for (uint32_t g = 0; g < a.groups4; g += 4) {
        const svint8_t d0 = svld1rq_s8(all, r0 + 4 * g);
        MAXSIM_SME_DOT1(0)
        MAXSIM_SME_DOT1(1)
        MAXSIM_SME_DOT1(2)
        MAXSIM_SME_DOT1(3)
      }
      StoreKeys<kCos>(a, j, l0, pl, acc0, sq, top);
    }
    svst1_f32(pl, a.top + l0, top);
  }
}
#undef MAXSIM_SME_DOT4
#undef MAXSIM_SME_DOT1

// ComputeKeysFn (kernels/pipeline.h): query groups [g0, g0 + ng), every document row, in chunks of kChunk rows
// with the prefetch queue stepped between them (outside streaming mode).
void Keys(const ScreenJob& job, uint32_t g0, uint32_t ng, float* K, size_t k_stride, float* top) {
  const PreparedQuery& q = *job.q;
  const DocRef& d = *job.d;
  KeyArgs a;
  a.ql = static_cast<const int8_t*>(job.layout) + static_cast<size_t>(g0) * kW * 4;
  a.qstride = static_cast<size_t>(q.lane_stride) * 4;
  a.nl = ng * kW;
  a.groups4 = static_cast<uint32_t>(I8QueryLayout::Groups4(q.dim));
  a.codes = d.codes;
  a.padded_dim = d.padded_dim;
  a.meta = d.meta;
  a.inv = job.inv;
  a.sq = job.lanes.sq + static_cast<size_t>(g0) * kW;
  a.K = K;
  a.k_stride = k_stride;
  a.top = top;
  for (uint32_t l = 0; l < a.nl; ++l) top[l] = -std::numeric_limits<float>::infinity();
  PrefetchCodes(d, 0, kChunk);
  for (uint32_t j0 = 0; j0 < d.n_tokens; j0 += kChunk) {
    const uint32_t j1 = d.n_tokens - j0 > kChunk ? j0 + kChunk : d.n_tokens;
    if (job.pf) job.pf->Step();
    PrefetchCodes(d, j1, j1 + kChunk);
    job.cosine ? KeysRows<true>(a, j0, j1) : KeysRows<false>(a, j0, j1);
  }
}

void ScreenedBatch(const PreparedQuery& q, const DocRef* docs, size_t n, maxsim_metric metric, maxsim_mode mode,
                   float* best_key, int32_t* best_index, KernelScratch& scratch, ScreenCounters* counters,
                   const ScreenPrune* prune) {
  ScreenCall c = MakeScreenCall(q, docs, n, metric, mode, best_key, best_index, scratch, counters, prune, &Keys);
  c.pf_rows_per_step = kChunk;  // Keys steps the prefetch queue once per chunk
  HwyTargetOps(HWY_NEON)->screen(c);
}

void Screened(const PreparedQuery& q, const DocRef& d, maxsim_metric metric, maxsim_mode mode, float* best_key,
              int32_t* best_index, KernelScratch& scratch, ScreenCounters* counters) {
  ScreenedBatch(q, &d, 1, metric, mode, best_key, best_index, scratch, counters, nullptr);
}

// The signed I8QueryLayout (codes, then the QueryLanes the pipeline reads).
size_t LayoutBytes(const PreparedQuery& q, maxsim_mode mode) {
  return mode == MAXSIM_MODE_EXACT ? 0 : I8QueryLayout::Bytes(q);
}

void Prepare(const PreparedQuery& q, maxsim_mode mode, void* out) {
  if (mode != MAXSIM_MODE_EXACT) I8QueryLayout::Write(q, 0, out);
}

#undef MAXSIM_SME_FN

}  // namespace
}  // namespace arm

extern const KernelOps kOpsSme = {&arm::Exact, &arm::Screened, &arm::LayoutBytes, &arm::Prepare,
                                  &arm::ScreenedBatch};

}  // namespace maxsim
