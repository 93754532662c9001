// SPDX-License-Identifier: Apache-2.0
// The exact path of the SVE kernels (`sve`, `sve-i8mm`): f32 FMLA tiles, vector-length agnostic (any SVE length
// from 128 to 2048 bits; the lane count is svcntw() at run time).
//
// Instructions: LD1W of the transposed query (PreparedQuery::qt, lane = query token; the last vector of a query
// predicated by WHILELT on n_padded), LD1RQW of 4 consecutive elements of a document row (replicated into every
// 128-bit segment), FMLA by element (svmla_lane_f32: lane t of each segment = the row's element k + t), FCMGT + SEL
// for the running max / first argmax. Tile: 2 query vectors x 8 document rows = 16 accumulators + 8 row + 2 query
// registers of 32; per 4 k: 8 query loads, 8 row loads, 64 FMLAs (NEON's Highway tile: 8 loads per 12 FMLAs).
// Rows beyond full tiles use tiles of 4, 2, 1, and k beyond a multiple of 4 a broadcast (DUP) and FMLA.
//
// Why it is exact: every accumulator lane is one (query token, row) pair and runs k = 0..dim-1 in order from +0,
// each step one fused multiply-add (FMLA, by element or by vector, rounds once): the canonical chain (kernel.h),
// so the results are the same bits as every other kernel's. The fold is the Highway tile's (exact_hwy.cc):
// strict >, rows in order, so the lowest index wins. Sizeless SVE types cannot be array elements (why Highway's
// SVE targets, whose tiles are arrays, are not compiled here), so the accumulators are named variables, written
// out by the MAXSIM_SVE_ROWS8 macro and pruned by `if constexpr` for the smaller tiles.
//
// Compiled under `#pragma GCC target("arch=armv8.2-a+sve")` (clang: target("sve")); every header that defines
// templates or inline functions shared with other files is included before the pragma, so no SVE-compiled copy
// of them can be merged into code that runs on cores without SVE. Only the kernel list calls in here, and only
// on a CPU that reports SVE.
#include <cstddef>
#include <cstdint>
#include <limits>

#include "hwy/detect_targets.h"  // HWY_NEON: the Highway target that widens f16/bf16 rows
#include "kernels/arm/sve_kernels.h"
#include "kernels/pipeline.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("sve"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+sve")
#endif

#include <arm_sve.h>

// X(r) for r = 0..7: one tile row each (named accumulators instead of arrays, see above).
#define MAXSIM_SVE_ROWS8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

namespace maxsim {
namespace arm {
namespace {

// One tile: NQ query vectors (lanes [v0, v0 + NQ VL) of qt, loads predicated by p0 / p1) against rows
// [j, j + R), folded into the running best / argmax b0 / i0 (b1 / i1 for the second query vector).
template <int NQ, int R, bool kCos>
inline void Tile(const float* qt, size_t qs, svbool_t p0, svbool_t p1, const float* rows, uint64_t stride,
                 uint32_t j, uint32_t dim, const float* inv, svfloat32_t& b0, svint32_t& i0, svfloat32_t& b1,
                 svint32_t& i1) {
  const svbool_t pt = svptrue_b32();
  const uint64_t vl = svcntw();
#define MAXSIM_SVE_DECL(r)                                             \
  [[maybe_unused]] svfloat32_t a0_##r = svdup_n_f32(0.0f);             \
  [[maybe_unused]] svfloat32_t a1_##r = svdup_n_f32(0.0f);             \
  [[maybe_unused]] const float* rp_##r = rows + ((r) < R ? j + (r) : j) * stride;
  MAXSIM_SVE_ROWS8(MAXSIM_SVE_DECL)
#undef MAXSIM_SVE_DECL
  uint32_t k = 0;
  for (; k + 4 <= dim; k += 4) {
    MAXSIM_MCA_BEGIN(NQ * 100 + R);
#define MAXSIM_SVE_LOAD(r) \
  [[maybe_unused]] const svfloat32_t d_##r = (r) < R ? svld1rq_f32(pt, rp_##r + k) : svdup_n_f32(0.0f);
    MAXSIM_SVE_ROWS8(MAXSIM_SVE_LOAD)
#undef MAXSIM_SVE_LOAD
#define MAXSIM_SVE_FMLA(r)                                                     \
  if constexpr ((r) < R) {                                                     \
    a0_##r = svmla_lane_f32(a0_##r, q0, d_##r, kT);                            \
    if constexpr (NQ > 1) a1_##r = svmla_lane_f32(a1_##r, q1, d_##r, kT);      \
  }
#define MAXSIM_SVE_STEP(t)                                                     \
  {                                                                            \
    constexpr int kT = t;                                                      \
    const float* qk = qt + static_cast<size_t>(k + kT) * qs;                   \
    const svfloat32_t q0 = svld1_f32(p0, qk);                                  \
    const svfloat32_t q1 = NQ > 1 ? svld1_f32(p1, qk + vl) : q0;               \
    MAXSIM_SVE_ROWS8(MAXSIM_SVE_FMLA)                                          \
  }
    MAXSIM_SVE_STEP(0)
    MAXSIM_SVE_STEP(1)
    MAXSIM_SVE_STEP(2)
    MAXSIM_SVE_STEP(3)
#undef MAXSIM_SVE_STEP
#undef MAXSIM_SVE_FMLA
    MAXSIM_MCA_END();
  }
  for (; k < dim; ++k) {
    const float* qk = qt + static_cast<size_t>(k) * qs;
    const svfloat32_t q0 = svld1_f32(p0, qk);
    const svfloat32_t q1 = NQ > 1 ? svld1_f32(p1, qk + vl) : q0;
#define MAXSIM_SVE_FMA1(r)                                                     \
  if constexpr ((r) < R) {                                                     \
    const svfloat32_t d = svdup_n_f32(rp_##r[k]);                              \
    a0_##r = svmla_f32_x(pt, a0_##r, q0, d);                                   \
    if constexpr (NQ > 1) a1_##r = svmla_f32_x(pt, a1_##r, q1, d);             \
  }
    MAXSIM_SVE_ROWS8(MAXSIM_SVE_FMA1)
#undef MAXSIM_SVE_FMA1
  }
  // Keys (cosine: fl(E * inv)) folded into the running max in row order with strict >.
#define MAXSIM_SVE_FOLD(r)                                                               \
  if constexpr ((r) < R) {                                                               \
    const svint32_t ix = svdup_n_s32(static_cast<int32_t>(j + (r)));                     \
    svfloat32_t k0 = a0_##r;                                                             \
    if (kCos) k0 = svmul_n_f32_x(pt, k0, inv[j + (r)]);                                  \
    const svbool_t g0 = svcmpgt_f32(p0, k0, b0);                                         \
    b0 = svsel_f32(g0, k0, b0);                                                          \
    i0 = svsel_s32(g0, ix, i0);                                                          \
    if constexpr (NQ > 1) {                                                              \
      svfloat32_t k1 = a1_##r;                                                           \
      if (kCos) k1 = svmul_n_f32_x(pt, k1, inv[j + (r)]);                                \
      const svbool_t g1 = svcmpgt_f32(p1, k1, b1);                                       \
      b1 = svsel_f32(g1, k1, b1);                                                        \
      i1 = svsel_s32(g1, ix, i1);                                                        \
    }                                                                                    \
  }
  MAXSIM_SVE_ROWS8(MAXSIM_SVE_FOLD)
#undef MAXSIM_SVE_FOLD
}

// Every row against NQ query vectors: tiles of 8 rows, then 4, 2, 1.
template <int NQ, bool kCos>
inline void RunRows(const float* qt, size_t qs, svbool_t p0, svbool_t p1, const float* rows, uint64_t stride,
                    uint32_t nd, uint32_t dim, const float* inv, svfloat32_t& b0, svint32_t& i0, svfloat32_t& b1,
                    svint32_t& i1) {
  uint32_t j = 0;
  for (; j + 8 <= nd; j += 8) Tile<NQ, 8, kCos>(qt, qs, p0, p1, rows, stride, j, dim, inv, b0, i0, b1, i1);
  if (j + 4 <= nd) {
    Tile<NQ, 4, kCos>(qt, qs, p0, p1, rows, stride, j, dim, inv, b0, i0, b1, i1);
    j += 4;
  }
  if (j + 2 <= nd) {
    Tile<NQ, 2, kCos>(qt, qs, p0, p1, rows, stride, j, dim, inv, b0, i0, b1, i1);
    j += 2;
  }
  if (j < nd) Tile<NQ, 1, kCos>(qt, qs, p0, p1, rows, stride, j, dim, inv, b0, i0, b1, i1);
}

template <bool kCos>
void ExactF32T(const PreparedQuery& q, const float* rows, uint64_t stride, uint32_t nd, const float* inv,
               float* best_key, int32_t* best_index) {
  const uint64_t vl = svcntw();
  const uint64_t nt = q.n_tokens, np = q.n_padded;
  for (uint64_t v0 = 0; v0 < nt; v0 += 2 * vl) {
    const svbool_t p0 = svwhilelt_b32(v0, np), p1 = svwhilelt_b32(v0 + vl, np);
    svfloat32_t b0 = svdup_n_f32(-std::numeric_limits<float>::infinity()), b1 = b0;
    svint32_t i0 = svdup_n_s32(-1), i1 = i0;
    const float* qt = q.qt + v0;
    const bool two = v0 + vl < nt;
    if (two) {
      RunRows<2, kCos>(qt, q.lane_stride, p0, p1, rows, stride, nd, q.dim, inv, b0, i0, b1, i1);
    } else {
      RunRows<1, kCos>(qt, q.lane_stride, p0, p1, rows, stride, nd, q.dim, inv, b0, i0, b1, i1);
    }
    const svbool_t s0 = svwhilelt_b32(v0, nt);
    svst1_f32(s0, best_key + v0, b0);
    svst1_s32(s0, best_index + v0, i0);
    if (two) {
      const svbool_t s1 = svwhilelt_b32(v0 + vl, nt);
      svst1_f32(s1, best_key + v0 + vl, b1);
      svst1_s32(s1, best_index + v0 + vl, i1);
    }
  }
}

void ExactF32(const PreparedQuery& q, const float* rows, uint64_t stride, uint32_t nd, const float* inv,
              float* best_key, int32_t* best_index) {
  if (inv) {
    ExactF32T<true>(q, rows, stride, nd, inv, best_key, best_index);
  } else {
    ExactF32T<false>(q, rows, stride, nd, inv, best_key, best_index);
  }
}

}  // namespace

void SveExact(const PreparedQuery& q, const DocRef& d, maxsim_metric metric, float* best_key, int32_t* best_index,
              KernelScratch& scratch) {
  // The shared exact entry with this file's tiles: f16/bf16 rows widened by the NEON target's code (the
  // conversion is exact, the same floats everywhere), cosine inverse norms as every exact path computes them.
  HwyExactOps ops = *HwyTargetOps(HWY_NEON);
  ops.exact_f32 = &ExactF32;
  ExactWithHwy(ops, q, d, metric, best_key, best_index, scratch);
}

}  // namespace arm
}  // namespace maxsim

#undef MAXSIM_SVE_ROWS8

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
