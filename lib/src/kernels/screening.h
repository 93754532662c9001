// SPDX-License-Identifier: Apache-2.0
// Certified i8 screening: the error bound every screened kernel uses to decide which document tokens must be
// refined with the originals. docs/semantics.md derives it; in short, with v = s v8 + e for every vector,
//
//   |<q,d> - s_q s_d <q8,d8>|  <=  ||e_q|| (||d|| + ||e_d||) + ||q|| ||e_d||            (quantisation)
//   |E(q,d) - <q,d>|           <=  gamma_dim ||q|| ||d||,  gamma_dim = (dim+2) u/(1-(dim+2) u), u = 2^-24
//                                                                                          (the f32 FMA chain)
// and the approximation A = fl(fl(float(I) * s_d) * s_q) (I the exact integer dot) carries a few relative
// roundings. The margin below adds a relative slack of 2^-20 on the bound, 2^-21 |A| for the roundings of A
// and of the comparisons, and an absolute (dim + 16) 2^-124 for underflow (also under flush-to-zero). Where
// underflow sits matters: fl(float(I) * s_d) never underflows with loss (when s_d is subnormal it is an
// integer times a multiple of 2^-149, else |I| s_d >= 2^-126), but A = fl(B * s_q) may be subnormal, an error
// of up to 2^-150 (2^-126 when flushed to zero) that the cosine key then multiplies by 1/||d||, which can be
// 2^126. So 2^-126 is added inside the part of the bound that is scaled by 1/||d||. A token j can hold the
// exact maximum only if  A_j + m_j >= max_k (A_k - m_k);  every such j is refined.
#ifndef MAXSIM_SRC_KERNELS_SCREENING_H_
#define MAXSIM_SRC_KERNELS_SCREENING_H_

#include <cmath>
#include <cstdint>

#include "kernels/fma32.h"
#include "maxsim/packed_format.h"

namespace maxsim {

struct ScreenConstants {
  float gamma;      // gamma_dim
  float abs_slack;  // (dim + 16) * 2^-124
  explicit ScreenConstants(uint32_t dim) {
    const double g = (dim + 2.0) * 0x1p-24;
    gamma = static_cast<float>(g / (1.0 - g) * (1.0 + 0x1p-20));
    abs_slack = static_cast<float>((dim + 16.0) * 0x1p-124);
  }
};

// Margin in key space for one (query token, document token) pair. `approx_key` is A (dot) or A * inv_norm_d
// (cosine), `inv` is 1 (dot) or inv_norm_d (cosine).
inline float ScreenMargin(const ScreenConstants& c, const maxsim_vector_meta& q, const maxsim_vector_meta& d,
                          float approx_key, float inv) {
  const float eps = q.resid_norm * (d.norm + d.resid_norm) + q.norm * d.resid_norm + 0x1p-126f;
  const float fp = c.gamma * q.norm * d.norm;
  return (eps + fp) * inv * (1.0f + 0x1p-20f) + std::fabs(approx_key) * 0x1p-21f + c.abs_slack;
}

// The canonical similarity E(q, d) for one pair (see kernel.h): a sequential f32 FMA chain from +0.
inline float CanonicalDot(const float* q, const float* d, uint32_t dim) {
  float acc = 0.0f;
  for (uint32_t k = 0; k < dim; ++k) acc = Fma32(q[k], d[k], acc);
  return acc;
}

}  // namespace maxsim

#endif  // MAXSIM_SRC_KERNELS_SCREENING_H_
