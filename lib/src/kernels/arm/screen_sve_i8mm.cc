// SPDX-License-Identifier: Apache-2.0
// Kernel "sve-i8mm": AArch64 with SVE and the int8 matrix-multiply extension for SVE (FEAT_I8MM with SVE; Linux
// HWCAP2_SVEI8MM: Neoverse V1/V2/N2, Graviton3/4, Grace), vector-length agnostic (tested under qemu at 128, 256,
// 512 and 2048 bits). Exact path: exact_sve.cc, as `sve`. i8 screening with SMMLA (svmmla_s32): in each 128-bit
// segment one instruction multiplies a 2 x 8 block of document codes (two rows, 8 consecutive k) by the 8 x 2
// block of two query lanes into a 2 x 2 block of i32 sums, 32 multiply-adds per segment against SDOT's 16.
// Signed x signed, so the canonical codes [-127, 127] (and a -128 a FAST-validated buffer may hold) go in
// unchanged, and every sum is the exact integer dot I.
//
// What SVE2 would add, and why this kernel does not need it: SVE2's integer additions are widening and
// narrowing forms (SMLALB/T, SQDMLAL, ...), complex dots (CDOT), histograms and matches; for an i8 dot product
// SDOT (SVE) and SMMLA (SVE + I8MM) are the fastest instructions, and the f32 FMA chain is SVE's FMLA. So the
// faster variant over `sve` is SMMLA, which needs I8MM rather than SVE2, and the row is named for the features it
// needs: `sve-i8mm` (file, symbol kOpsSveI8mm, MAXSIM_ISA name). Every core with SVE2 and I8MM runs it.
//
// Layouts. The query side is I8PairLayout (kernels/pipeline.h, shared with neon-i8mm: per 8 k, 16 bytes per lane
// pair), replicated into every segment (LD1RQB). The document side is re-laid out once per document and call
// (sve_kernel-inl.h's DocView): per 8 k and vector of 2S rows j..j+2S-1 (S = VL / 128 segments), segment s holds
// row j + s's 8 codes then row j + S + s's, so SMMLA(document, lane pair) leaves in segment s the u64 pair
// [row j+s: lanes (2p, 2p+1)], [row j+S+s: lanes (2p, 2p+1)]; TRN1 / TRN2 on 64-bit elements of the two lane
// pairs' results give rows j..j+S-1 and j+S..j+2S-1 as the pipeline's [row][4 lanes] blocks. Per 8 k and tile
// of 2 query groups (4 lane pairs) x 4 vectors (8 S rows): 4 query + 4 document loads, 16 SMMLAs into 16
// accumulators; at 128 bits neon-i8mm's tile (2 x 8 rows) without its half-row combines.
//
// Compiled under `#pragma GCC target("arch=armv8.2-a+sve+i8mm")` (clang: target("sve,i8mm")); every header that
// defines templates or inline functions shared with other files is included before the pragma (see exact_sve.cc).
#include <arm_neon.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "hwy/detect_targets.h"
#include "kernels/arm/sve_kernels.h"
#include "kernels/pipeline.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("sve,i8mm"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+sve+i8mm")
#endif

#include <arm_sve.h>

#include "kernels/arm/sve_kernel-inl.h"

// X(r) for r = 0..3: one tile vector each (named accumulators: sizeless types cannot be array elements).
#define MAXSIM_SVE_VECS4(X) X(0) X(1) X(2) X(3)

namespace maxsim {
namespace arm {
namespace sve {
namespace {

struct SmmlaImpl {
  static constexpr int kVectors = 4;
  static constexpr bool kPairLayout = true;
  static uint32_t RowsPerVector() { return static_cast<uint32_t>(svcntw() / 2); }  // 2 rows per segment

  static size_t LayoutBytes(const DocRef& d, uint32_t /*groups4*/, size_t nd_pad) {
    return static_cast<size_t>((d.dim + 7) / 8) * nd_pad * 8;
  }
  static void Layout(const DocRef& d, uint32_t /*groups4*/, size_t nd_pad, int8_t* out, DocView* v) {
    const uint32_t chunks = (d.dim + 7) / 8;  // 8 codes each, within padded_dim (a multiple of 64)
    const size_t per_vec = RowsPerVector(), segs = per_vec / 2;
    std::memset(out, 0, static_cast<size_t>(chunks) * nd_pad * 8);
    for (uint32_t r = 0; r < d.n_tokens; ++r) {
      const size_t w = r / per_vec, m = r % per_vec;
      // Vector w, segment m % segs, half m / segs.
      int8_t* o = out + w * per_vec * 8 + (m % segs) * 16 + (m / segs) * 8;
      const int8_t* in = d.codes + static_cast<size_t>(r) * d.padded_dim;
      for (uint32_t c = 0; c < chunks; ++c) std::memcpy(o + static_cast<size_t>(c) * nd_pad * 8, in + 8 * c, 8);
    }
    v->codes = out;
    v->row_stride = 8;  // a vector of 2S rows starting at row j (a multiple of 2S) is at j * 8
    v->chunk_stride = nd_pad * 8;
  }

  // The 2 x 2 blocks of lane pairs A (lanes 0, 1) and B (lanes 2, 3) for one vector, as two [row][4] key vectors.
  template <bool kCos>
  static inline void Put(svint32_t xa, svint32_t xb, uint32_t row, uint32_t segs, const DocView& v, svfloat32_t sq,
                         float* K, svfloat32_t& top) {
    const svint64_t a = svreinterpret_s64_s32(xa), b = svreinterpret_s64_s32(xb);
    PutKeys<kCos>(svreinterpret_s32_s64(svtrn1_s64(a, b)), row, v, sq, K, top);
    PutKeys<kCos>(svreinterpret_s32_s64(svtrn2_s64(a, b)), row + segs, v, sq, K, top);
  }

  template <int NQ, int RV, bool kCos>
  static inline void Tile(const QueryArgs& a, const DocView& v, uint32_t row, svfloat32_t sq0, svfloat32_t sq1,
                          float* K, size_t gs, svfloat32_t& top0, svfloat32_t& top1) {
    const svbool_t pb = svptrue_b8();
    const uint32_t per_vec = RowsPerVector();
#define MAXSIM_SVE_DECL(r)                                                    \
  [[maybe_unused]] svint32_t xa0_##r = svdup_n_s32(0), xb0_##r = xa0_##r;     \
  [[maybe_unused]] svint32_t xa1_##r = xa0_##r, xb1_##r = xa0_##r;            \
  [[maybe_unused]] const int8_t* rp_##r =                                     \
      v.codes + static_cast<size_t>(row + ((r) < RV ? (r) : 0) * per_vec) * v.row_stride;
    MAXSIM_SVE_VECS4(MAXSIM_SVE_DECL)
#undef MAXSIM_SVE_DECL
    const uint32_t steps = (a.groups4 + 1) / 2;  // k steps of 8 covering dim
    for (uint32_t c = 0; c < steps; ++c) {
      MAXSIM_MCA_BEGIN(NQ * 100 + RV);
      const int8_t* qc = a.own + static_cast<size_t>(c) * a.own_stride;
      const svint8_t qa0 = svld1rq_s8(pb, qc), qb0 = svld1rq_s8(pb, qc + 16);
      const svint8_t qa1 = NQ > 1 ? svld1rq_s8(pb, qc + 32) : qa0;
      const svint8_t qb1 = NQ > 1 ? svld1rq_s8(pb, qc + 48) : qb0;
      const size_t off = c * v.chunk_stride;
#define MAXSIM_SVE_MM(r)                                                       \
  if constexpr ((r) < RV) {                                                    \
    const svint8_t d = svld1_s8(pb, rp_##r + off);                             \
    xa0_##r = svmmla_s32(xa0_##r, d, qa0);                                     \
    xb0_##r = svmmla_s32(xb0_##r, d, qb0);                                     \
    if constexpr (NQ > 1) {                                                    \
      xa1_##r = svmmla_s32(xa1_##r, d, qa1);                                   \
      xb1_##r = svmmla_s32(xb1_##r, d, qb1);                                   \
    }                                                                          \
  }
      MAXSIM_SVE_VECS4(MAXSIM_SVE_MM)
#undef MAXSIM_SVE_MM
      MAXSIM_MCA_END();
    }
    const uint32_t segs = per_vec / 2;
#define MAXSIM_SVE_PUT(r)                                                                  \
  if constexpr ((r) < RV) {                                                                \
    Put<kCos>(xa0_##r, xb0_##r, row + (r) * per_vec, segs, v, sq0, K, top0);               \
    if constexpr (NQ > 1) Put<kCos>(xa1_##r, xb1_##r, row + (r) * per_vec, segs, v, sq1, K + gs, top1); \
  }
    MAXSIM_SVE_VECS4(MAXSIM_SVE_PUT)
#undef MAXSIM_SVE_PUT
  }
};

}  // namespace
}  // namespace sve
}  // namespace arm

extern const KernelOps kOpsSveI8mm = arm::sve::Ops<arm::sve::SmmlaImpl>();  // instantiated under the pragma

}  // namespace maxsim

#undef MAXSIM_SVE_VECS4

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
