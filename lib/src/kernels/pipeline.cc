// SPDX-License-Identifier: Apache-2.0
// The ISA-free parts of the screening pipeline that are not per Highway target (pipeline.h): the shared i8
// query layout (baseline ISA: it runs once per query set and call, not per document) and the tests' switch for
// the fused i8 phase's fallback.
#include <atomic>
#include <cstring>

#include "kernels/pipeline.h"
#include "kernels/screening.h"

namespace maxsim {
namespace {
std::atomic<bool> g_force_fallback{false};
}  // namespace

void ForceFusedFallbackForTest(bool on) { g_force_fallback.store(on, std::memory_order_relaxed); }
bool FusedFallbackForced() { return g_force_fallback.load(std::memory_order_relaxed); }

void I8QueryLayout::Write(const PreparedQuery& q, uint8_t xor_bias, void* out_void) {
  int8_t* out = static_cast<int8_t*>(out_void);
  const size_t groups = Groups4(q.dim);
  const uint8_t pad = xor_bias;  // a zero code, biased
  std::memset(out, pad, CodeBytes(q));
  for (uint32_t s = 0; s < q.n_padded; ++s) {
    const int8_t* codes = s < q.n_tokens ? q.codes + static_cast<size_t>(s) * q.padded_dim : nullptr;
    for (size_t g = 0; g < groups; ++g) {
      uint8_t* o = reinterpret_cast<uint8_t*>(out) + (g * q.lane_stride + s) * 4;
      for (size_t b = 0; b < 4; ++b) {
        const size_t k = 4 * g + b;
        const int8_t c = codes && k < q.dim ? codes[k] : 0;
        o[b] = static_cast<uint8_t>(static_cast<uint8_t>(c) ^ xor_bias);
      }
    }
  }
  // Per-lane data (QueryLanes); padding lanes stay zero.
  float* f = reinterpret_cast<float*>(static_cast<uint8_t*>(out_void) + CodeBytes(q));
  std::memset(f, 0, 4 * sizeof(float) * q.n_padded);
  const ScreenConstants c(q.dim);
  for (uint32_t s = 0; s < q.n_tokens; ++s) {
    const maxsim_vector_meta& m = q.meta[s];
    f[s] = m.scale;
    f[q.n_padded + s] = m.norm;
    f[2 * static_cast<size_t>(q.n_padded) + s] = m.resid_norm;
    f[3 * static_cast<size_t>(q.n_padded) + s] = c.gamma * m.norm;  // as ScreenMargin computes it
  }
}

void I8PairLayout::Write(const PreparedQuery& q, int8_t* out) {
  const size_t step = StepBytes(q);
  for (uint32_t s = 0; s < q.n_tokens; ++s) {
    const int8_t* codes = q.codes + static_cast<size_t>(s) * q.padded_dim;
    for (uint32_t k = 0; k < q.dim; ++k) out[(k / 8) * step + (s / 2) * 16 + (s % 2) * 8 + k % 8] = codes[k];
  }
}

}  // namespace maxsim
