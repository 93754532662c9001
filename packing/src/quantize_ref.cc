// SPDX-License-Identifier: Apache-2.0
// The canonical quantisation, written as plainly as possible. It is the definition the vectorised packer
// (quantize_hwy.cc) must reproduce bit for bit, and the reference the packer tests compare against.
//
//   maxabs   = max_k |v_k|                                           (f32, exact)
//   norm_sq  = sum_k (double)v_k^2 over 8 lanes (lane = k mod 8, each summed in k order), lanes combined as
//              ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))
//   scale    = maxabs / 127 (f32);  inv = 127 / maxabs (f32)
//   code_k   = clamp(round_half_even(v_k * inv), -127, 127)         (f32 product; double when maxabs < 2^-100,
//                                                                      where 127 / maxabs would overflow f32)
//   resid_sq = sum_k ((double)v_k - (double)scale * code_k)^2, same 8-lane order
//   norm = nearest f32 of sqrt(norm_sq); resid_norm = f32 of sqrt(resid_sq) rounded up; code_sum = sum code_k
#include <cmath>
#include <limits>

#include "packed.h"

namespace maxsim::pack {

double CombineLanes(const double l[8]) { return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7])); }

float NormFromSquares(double norm_sq) { return static_cast<float>(std::sqrt(norm_sq)); }

float ResidFromSquares(double resid_sq) {
  const double r = std::sqrt(resid_sq);
  float f = static_cast<float>(r);
  if (static_cast<double>(f) < r) f = std::nextafter(f, std::numeric_limits<float>::infinity());
  return f;
}

RowStats AnalyzeRowRef(const float* v, uint32_t dim) {
  RowStats stats;
  double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (uint32_t k = 0; k < dim; ++k) {
    const float x = v[k];
    if (!std::isfinite(x)) stats.finite = false;
    stats.maxabs = std::fmax(stats.maxabs, std::fabs(x));
    const double d = x;
    lanes[k % 8] += d * d;
  }
  stats.norm_sq = CombineLanes(lanes);
  if (!stats.finite) stats.maxabs = std::numeric_limits<float>::infinity();
  return stats;
}

void QuantizeRowRef(const float* v, uint32_t dim, uint32_t padded_dim, const RowStats& stats, int8_t* codes,
                    maxsim_vector_meta* meta) {
  const float maxabs = stats.maxabs;
  const float scale = maxabs / 127.0f;
  const bool tiny = maxabs < 0x1p-100f;
  const float inv = maxabs == 0.0f || tiny ? 0.0f : 127.0f / maxabs;
  const double inv_tiny = maxabs == 0.0f ? 0.0 : 127.0 / static_cast<double>(maxabs);
  double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int32_t code_sum = 0;
  for (uint32_t k = 0; k < dim; ++k) {
    const double rounded = tiny ? std::nearbyint(static_cast<double>(v[k]) * inv_tiny)
                                : static_cast<double>(std::nearbyint(v[k] * inv));
    const int32_t code = static_cast<int32_t>(std::fmin(127.0, std::fmax(-127.0, rounded)));
    if (codes) codes[k] = static_cast<int8_t>(code);
    code_sum += code;
    const double e = static_cast<double>(v[k]) - static_cast<double>(scale) * static_cast<double>(code);
    lanes[k % 8] += e * e;
  }
  if (codes) {
    for (uint32_t k = dim; k < padded_dim; ++k) codes[k] = 0;
  }
  meta->scale = scale;
  meta->norm = NormFromSquares(stats.norm_sq);
  meta->resid_norm = ResidFromSquares(CombineLanes(lanes));
  meta->code_sum = code_sum;
}

}  // namespace maxsim::pack
