// SPDX-License-Identifier: Apache-2.0
// Kernel "neon-dotprod": AArch64 with the dot-product extension (FEAT_DotProd: Cortex-A55/A76 and later, Neoverse
// N1/V1/V2, Apple M1 and later). Exact path: Highway NEON FMLA tiles (exact_hwy.cc). i8 screening with SDOT by
// element: one 16-byte load of a document row covers 4 k-groups; for each of them, SDOT (by element t) adds the
// 4-code dot of every query lane (4 lanes x 4 codes of I8QueryLayout, signed) into that lane's i32, the exact
// integer dot I (|sum of 4 products| <= 4 * 128 * 127, no wrap in any order). Per 4 k-groups and tile: R row
// loads, 4 NQ query loads, 4 NQ R SDOTs. Tile: 2 query groups x 8 rows = 16 accumulators + 8 row + 2 query
// registers of 32. The loop runs over whole 16-byte steps: the query layout holds zero codes up to padded_dim,
// so the document's padding bytes beyond dim add nothing.
#include <arm_neon.h>

#include <cstddef>
#include <cstdint>
#include <limits>

#include "hwy/detect_targets.h"
#include "kernels/pipeline.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("dotprod"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")
#endif

#include "kernels/arm/neon_kernel-inl.h"

namespace maxsim {
namespace arm {
namespace {

struct DotprodImpl : NoOwnLayout {
  static constexpr int kRows = 8;
  template <int T, int NQ, int R>
  static inline void Step(const TileArgs& a, uint32_t g, const int8x16_t (&dv)[R], int32x4_t (&acc)[NQ][R]) {
    int8x16_t qv[NQ];
    for (int i = 0; i < NQ; ++i) qv[i] = vld1q_s8(a.ql + (g + T) * a.qstride + i * 16);
    for (int r = 0; r < R; ++r) {
      for (int i = 0; i < NQ; ++i) acc[i][r] = vdotq_laneq_s32(acc[i][r], qv[i], dv[r], T);
    }
  }
  template <int NQ, int R>
  static inline void Tile(const TileArgs& a, uint32_t j, int32x4_t (&acc)[NQ][R]) {
    const int8_t* rp[R];
    for (int r = 0; r < R; ++r) {
      rp[r] = a.codes + static_cast<size_t>(j + r) * a.padded_dim;
      for (int i = 0; i < NQ; ++i) acc[i][r] = vdupq_n_s32(0);
    }
    for (uint32_t g = 0; g < a.groups4; g += 4) {
      MAXSIM_MCA_BEGIN(NQ * 100 + R);
      int8x16_t dv[R];
      for (int r = 0; r < R; ++r) dv[r] = vld1q_s8(rp[r] + 4 * g);
      Step<0>(a, g, dv, acc);
      Step<1>(a, g, dv, acc);
      Step<2>(a, g, dv, acc);
      Step<3>(a, g, dv, acc);
      MAXSIM_MCA_END();
    }
  }
};

}  // namespace
}  // namespace arm

extern const KernelOps kOpsNeonDotprod = arm::Ops<arm::DotprodImpl>();  // instantiated under the pragma

}  // namespace maxsim

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
