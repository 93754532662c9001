// SPDX-License-Identifier: Apache-2.0
// Kernel "neon-i8mm": AArch64 with the int8 matrix-multiply extension (FEAT_I8MM: Neoverse V1/V2/N2, Cortex-A510/
// A710/X2 and later, Apple M2 and later). Exact path: Highway NEON FMLA tiles (exact_hwy.cc). i8 screening with
// SMMLA: one instruction multiplies a 2 x 8 block of query codes (two query lanes, 8 consecutive k) by an 8 x 2
// block of document codes (two rows) into a 2 x 2 block of i32 sums, 32 multiply-adds (twice SDOT's 16 per
// instruction). Signed x signed, so the canonical codes [-127, 127] (and a -128 a FAST-validated buffer may hold)
// go in unchanged, and every i32 sum is the exact integer dot I.
//
// The query needs 8 consecutive codes per lane, so this kernel stores its own layout after the shared one:
// I8PairLayout (kernels/pipeline.h), [padded_dim / 8][n_padded / 2 lane pairs][2 lanes][8 codes], zero beyond
// dim. Per k step of 8 and tile of 2 query groups (4 lane pairs) x 8 rows (4 row pairs): 4 query loads, 8
// half-row loads, 16 SMMLAs into 16 accumulators. At the end UZP1 / UZP2 turn a row pair's two 2 x 2 blocks per
// group into one vector per row (lanes 0..3). A tile with an odd row count pairs its last row with itself.
#include <arm_neon.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "hwy/detect_targets.h"
#include "kernels/pipeline.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("i8mm"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+i8mm")
#endif

#include "kernels/arm/neon_kernel-inl.h"

namespace maxsim {
namespace arm {
namespace {

struct I8mmImpl {
  static constexpr int kRows = 8;

  static size_t OwnBytes(const PreparedQuery& q) { return I8PairLayout::Bytes(q); }
  static void WriteOwn(const PreparedQuery& q, int8_t* out) { I8PairLayout::Write(q, out); }
  static void OwnLayout(const PreparedQuery& q, const void* layout, uint32_t g0, TileArgs* a) {
    a->own = static_cast<const int8_t*>(layout) + I8QueryLayout::Bytes(q) + static_cast<size_t>(g0) * kW * 8;
    a->own_stride = I8PairLayout::StepBytes(q);
  }

  template <int NQ, int R>
  static inline void Tile(const TileArgs& a, uint32_t j, int32x4_t (&out)[NQ][R]) {
    constexpr int P = (R + 1) / 2;  // row pairs
    const int8_t* rp[2 * P];
    for (int r = 0; r < 2 * P; ++r) rp[r] = a.codes + static_cast<size_t>(j + (r < R ? r : R - 1)) * a.padded_dim;
    int32x4_t acc[2 * NQ][P];  // [lane pair][row pair]
    for (int v = 0; v < 2 * NQ; ++v) {
      for (int p = 0; p < P; ++p) acc[v][p] = vdupq_n_s32(0);
    }
    const uint32_t steps = (a.groups4 + 1) / 2;  // k steps of 8 covering dim (padded_dim is a multiple of 64)
    for (uint32_t s = 0; s < steps; ++s) {
      MAXSIM_MCA_BEGIN(NQ * 100 + R);
      int8x16_t qv[2 * NQ];
      for (int v = 0; v < 2 * NQ; ++v) qv[v] = vld1q_s8(a.own + s * a.own_stride + v * 16);
      for (int p = 0; p < P; ++p) {
        const int8x16_t dv = vcombine_s8(vld1_s8(rp[2 * p] + 8 * s), vld1_s8(rp[2 * p + 1] + 8 * s));
        for (int v = 0; v < 2 * NQ; ++v) acc[v][p] = vmmlaq_s32(acc[v][p], qv[v], dv);
      }
      MAXSIM_MCA_END();
    }
    // acc[v][p] = [lane 2v' x row 2p, lane 2v' x row 2p+1, lane 2v'+1 x row 2p, lane 2v'+1 x row 2p+1]
    for (int i = 0; i < NQ; ++i) {
      for (int p = 0; p < P; ++p) {
        out[i][2 * p] = vuzp1q_s32(acc[2 * i][p], acc[2 * i + 1][p]);
        if (2 * p + 1 < R) out[i][2 * p + 1] = vuzp2q_s32(acc[2 * i][p], acc[2 * i + 1][p]);
      }
    }
  }
};

}  // namespace
}  // namespace arm

extern const KernelOps kOpsNeonI8mm = arm::Ops<arm::I8mmImpl>();  // instantiated under the pragma

}  // namespace maxsim

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
