// SPDX-License-Identifier: Apache-2.0
// Kernel "neon": baseline AArch64 (Advanced SIMD, every ARMv8-A core). Exact path: Highway NEON FMLA tiles
// (exact_hwy.cc). i8 screening with widening multiplies: per k-group of 4 codes, the 16 query codes of a group
// (4 lanes x 4 codes, I8QueryLayout) times the row's 4 codes replicated (LD1R): SMULL / SMULL2 give the 16
// products as i16 (|q| <= 127 and |d| <= 128, so every product fits), SADALP adds adjacent pairs into i32
// accumulators (two per lane), and one ADDP at the end leaves the exact integer dot I per lane. 4 instructions
// per 16 multiply-adds. Tile: 2 query groups x 4 rows = 16 accumulators + 2 query + 4 row registers of 32.
#include "kernels/arm/neon_kernel-inl.h"

namespace maxsim {
namespace arm {
namespace {

struct NeonImpl : NoOwnLayout {
  static constexpr int kRows = 4;
  template <int NQ, int R>
  static inline void Tile(const TileArgs& a, uint32_t j, int32x4_t (&out)[NQ][R]) {
    int32x4_t lo[NQ][R], hi[NQ][R];  // lo: lanes 0 and 1 (two partial sums each), hi: lanes 2 and 3
    const int8_t* rp[R];
    for (int r = 0; r < R; ++r) {
      rp[r] = a.codes + static_cast<size_t>(j + r) * a.padded_dim;
      for (int i = 0; i < NQ; ++i) lo[i][r] = hi[i][r] = vdupq_n_s32(0);
    }
    for (uint32_t g = 0; g < a.groups4; ++g) {
      MAXSIM_MCA_BEGIN(NQ * 100 + R);
      int8x16_t qv[NQ];
      for (int i = 0; i < NQ; ++i) qv[i] = vld1q_s8(a.ql + g * a.qstride + i * 16);
      for (int r = 0; r < R; ++r) {
        const int8x16_t dv = vreinterpretq_s8_s32(vld1q_dup_s32(reinterpret_cast<const int32_t*>(rp[r] + 4 * g)));
        for (int i = 0; i < NQ; ++i) {
          lo[i][r] = vpadalq_s16(lo[i][r], vmull_s8(vget_low_s8(qv[i]), vget_low_s8(dv)));
          hi[i][r] = vpadalq_s16(hi[i][r], vmull_high_s8(qv[i], dv));
        }
      }
      MAXSIM_MCA_END();
    }
    for (int r = 0; r < R; ++r) {
      for (int i = 0; i < NQ; ++i) out[i][r] = vpaddq_s32(lo[i][r], hi[i][r]);
    }
  }
};

}  // namespace
}  // namespace arm

extern const KernelOps kOpsNeon = arm::Ops<arm::NeonImpl>();

}  // namespace maxsim
