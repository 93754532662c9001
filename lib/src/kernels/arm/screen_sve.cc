// SPDX-License-Identifier: Apache-2.0
// Kernel "sve": AArch64 with SVE (Neoverse V1/V2/N2, A64FX, Graviton3/4, Grace), vector-length agnostic: correct at
// every SVE length from 128 to 2048 bits (tested under qemu at 128, 256, 512 and 2048). Exact path: exact_sve.cc
// (FMLA by element, 2 query vectors x 8 rows). i8 screening with SDOT by element (svdot_lane_s32), document rows
// across the vector's 128-bit segments (sve_kernel-inl.h): segment s of the document operand holds 16 codes
// (4 k-groups) of row j + s; the query operand is a group's 16 codes at one k-group (4 lanes x 4 codes of the
// signed I8QueryLayout) replicated into every segment (LD1RQB); SDOT by element t adds, in each segment, the
// 4-code dot of every query lane with the row's k-group t, so lane l of segment s accumulates the exact integer
// dot I(query lane l, row j + s) (|sum of 4 products| <= 4 * 128 * 127, no wrap in any order). Per 4 k-groups
// and tile of 2 query groups x 8 vectors (8 VL / 128 rows): 8 document loads, 8 query loads, 64 SDOTs into 16
// accumulators (+ 8 document + 2 query registers of 32): at 128 bits the shape and instruction count of
// neon-dotprod's tile.
//
// Document layout. At 128 bits a vector is one row, and the tile reads the packed code rows in place. Wider
// vectors read S = VL / 128 rows' chunks side by side, which the packed rows (padded_dim bytes apart) are not:
// each document's codes are copied once per call into [chunk][row][16 bytes] (zero rows up to a multiple of S),
// padded_dim bytes per row against the (query tokens / 4) x 4 SDOTs that read each 16 of them.
//
// Compiled under `#pragma GCC target("arch=armv8.2-a+sve")` (clang: target("sve")); every header that defines
// templates or inline functions shared with other files is included before the pragma (see exact_sve.cc).
#include <arm_neon.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "hwy/detect_targets.h"
#include "kernels/arm/sve_kernels.h"
#include "kernels/pipeline.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("sve"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+sve")
#endif

#include <arm_sve.h>

#include "kernels/arm/sve_kernel-inl.h"

// X(r) for r = 0..7: one tile vector each (named accumulators: sizeless types cannot be array elements).
#define MAXSIM_SVE_VECS8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

namespace maxsim {
namespace arm {
namespace sve {
namespace {

struct SdotImpl {
  static constexpr int kVectors = 8;
  static constexpr bool kPairLayout = false;
  static uint32_t RowsPerVector() { return static_cast<uint32_t>(svcntw() / kW); }

  // Bytes of the re-laid-out codes (0 where the tile reads the packed rows in place), and the view of them.
  static size_t LayoutBytes(const DocRef& d, uint32_t groups4, size_t nd_pad) {
    return RowsPerVector() == 1 ? 0 : static_cast<size_t>((groups4 + 3) / 4) * nd_pad * 16;
  }
  static void Layout(const DocRef& d, uint32_t groups4, size_t nd_pad, int8_t* out, DocView* v) {
    if (RowsPerVector() == 1) {
      v->codes = d.codes;
      v->row_stride = d.padded_dim;
      v->chunk_stride = 16;
      return;
    }
    const uint32_t chunks = (groups4 + 3) / 4;  // 16 codes each, within padded_dim (a multiple of 64)
    for (uint32_t c = 0; c < chunks; ++c) {
      int8_t* o = out + static_cast<size_t>(c) * nd_pad * 16;
      for (uint32_t r = 0; r < d.n_tokens; ++r) {
        std::memcpy(o + static_cast<size_t>(r) * 16, d.codes + static_cast<size_t>(r) * d.padded_dim + 16 * c, 16);
      }
      std::memset(o + static_cast<size_t>(d.n_tokens) * 16, 0, (nd_pad - d.n_tokens) * 16);
    }
    v->codes = out;
    v->row_stride = 16;
    v->chunk_stride = nd_pad * 16;
  }

  // NQ query groups x RV vectors starting at row `row`: exact dots, then keys (PutKeys) into K (group i at
  // K + i * gs) and the running tops.
  template <int NQ, int RV, bool kCos>
  static inline void Tile(const QueryArgs& a, const DocView& v, uint32_t row, svfloat32_t sq0, svfloat32_t sq1,
                          float* K, size_t gs, svfloat32_t& top0, svfloat32_t& top1) {
    const svbool_t pb = svptrue_b8();
    const uint32_t per_vec = RowsPerVector();
#define MAXSIM_SVE_DECL(r)                                 \
  [[maybe_unused]] svint32_t x0_##r = svdup_n_s32(0);      \
  [[maybe_unused]] svint32_t x1_##r = svdup_n_s32(0);      \
  [[maybe_unused]] const int8_t* rp_##r =                  \
      v.codes + static_cast<size_t>(row + ((r) < RV ? (r) : 0) * per_vec) * v.row_stride;
    MAXSIM_SVE_VECS8(MAXSIM_SVE_DECL)
#undef MAXSIM_SVE_DECL
    for (uint32_t c = 0; 4 * c < a.groups4; ++c) {
      MAXSIM_MCA_BEGIN(NQ * 100 + RV);
      const size_t off = c * v.chunk_stride;
#define MAXSIM_SVE_LOAD(r) \
  [[maybe_unused]] const svint8_t d_##r = (r) < RV ? svld1_s8(pb, rp_##r + off) : svdup_n_s8(0);
      MAXSIM_SVE_VECS8(MAXSIM_SVE_LOAD)
#undef MAXSIM_SVE_LOAD
#define MAXSIM_SVE_DOT(r)                                                      \
  if constexpr ((r) < RV) {                                                    \
    x0_##r = svdot_lane_s32(x0_##r, q0, d_##r, kT);                            \
    if constexpr (NQ > 1) x1_##r = svdot_lane_s32(x1_##r, q1, d_##r, kT);      \
  }
#define MAXSIM_SVE_STEP(t)                                                     \
  {                                                                            \
    constexpr int kT = t;                                                      \
    const int8_t* qg = a.ql + static_cast<size_t>(4 * c + kT) * a.qstride;     \
    const svint8_t q0 = svld1rq_s8(pb, qg);                                    \
    const svint8_t q1 = NQ > 1 ? svld1rq_s8(pb, qg + 16) : q0;                 \
    MAXSIM_SVE_VECS8(MAXSIM_SVE_DOT)                                           \
  }
      MAXSIM_SVE_STEP(0)
      MAXSIM_SVE_STEP(1)
      MAXSIM_SVE_STEP(2)
      MAXSIM_SVE_STEP(3)
#undef MAXSIM_SVE_STEP
#undef MAXSIM_SVE_DOT
      MAXSIM_MCA_END();
    }
#define MAXSIM_SVE_PUT(r)                                                          \
  if constexpr ((r) < RV) {                                                        \
    PutKeys<kCos>(x0_##r, row + (r) * per_vec, v, sq0, K, top0);                   \
    if constexpr (NQ > 1) PutKeys<kCos>(x1_##r, row + (r) * per_vec, v, sq1, K + gs, top1); \
  }
    MAXSIM_SVE_VECS8(MAXSIM_SVE_PUT)
#undef MAXSIM_SVE_PUT
  }
};

}  // namespace
}  // namespace sve
}  // namespace arm

extern const KernelOps kOpsSve = arm::sve::Ops<arm::sve::SdotImpl>();  // instantiated under the pragma

}  // namespace maxsim

#undef MAXSIM_SVE_VECS8

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
