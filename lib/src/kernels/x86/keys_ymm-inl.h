// SPDX-License-Identifier: Apache-2.0
// The end of a ymm i8 tile, shared by the "avx2" (screen_avx2.cc) and "avx-vnni" (screen_avx_vnni.cc) screens:
// exact i32 dots of NQ query vectors (8 lanes each) x R document rows starting at row j -> the approximate keys
//   K[i * group_stride + (j + r) * 8 + l] = fl(fl(fl(float(I) * s_d) * s_q) [* inv])
// (the portable kernel's expression, ComputeKeysFn in kernels/pipeline.h) and the running maxima top[i].
// Include only from files whose ymm functions carry (at least) these target features.
#ifndef MAXSIM_SRC_KERNELS_X86_KEYS_YMM_INL_H_
#define MAXSIM_SRC_KERNELS_X86_KEYS_YMM_INL_H_

#include <immintrin.h>

#include "kernels/x86/x86_kernels.h"

namespace maxsim {
namespace x86 {

template <int NQ, int R, bool kCos>
__attribute__((target("avx2,fma,f16c"))) inline void StoreKeysYmm(const __m256i (&acc)[NQ][R], uint32_t j,
                                                                   const maxsim_vector_meta* meta,
                                                                   const float* inv, const __m256* sq, float* K,
                                                                   size_t group_stride, __m256* top) {
  for (int r = 0; r < R; ++r) {
    const __m256 sd = _mm256_set1_ps(meta[j + r].scale);
    for (int i = 0; i < NQ; ++i) {
      const __m256 a = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc[i][r]), sd), sq[i]);
      const __m256 key = kCos ? _mm256_mul_ps(a, _mm256_set1_ps(inv[j + r])) : a;
      _mm256_store_ps(K + i * group_stride + static_cast<size_t>(j + r) * 8, key);
      top[i] = _mm256_max_ps(key, top[i]);  // a NaN key returns top: ignored
    }
  }
}

}  // namespace x86
}  // namespace maxsim

#endif  // MAXSIM_SRC_KERNELS_X86_KEYS_YMM_INL_H_
