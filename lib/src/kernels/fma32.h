// SPDX-License-Identifier: Apache-2.0
// Fma32(a, b, c): fl(a * b + c) rounded once, the canonical chain's step (kernel.h), for scalar code.
// std::fma everywhere except WebAssembly: wasi-libc's fmaf (musl's) computes a * b + c in double and, for the
// sums that land on an f32 halfway point, relies on switching the rounding mode, which WebAssembly does not
// have; it then rounds twice and is wrong on those inputs (tests/wasm checks both). There the step is the
// round-to-odd construction of kernels/wasm/fma_wasm-inl.h on one lane (proof in docs/wasm.md).
#ifndef MAXSIM_SRC_KERNELS_FMA32_H_
#define MAXSIM_SRC_KERNELS_FMA32_H_

#include <cmath>
#include <cstdint>
#include <cstring>

namespace maxsim {

// The round-to-odd construction itself, compiled everywhere so that native tests compare it with the CPU's
// fused multiply-add (tests/fma_emulation_test.cc).
inline float Fma32RoundToOdd(float a, float b, float c) {
  const double p = static_cast<double>(a) * b;  // exact
  const double s = p + c;
  const double bb = s - p;
  const double e = (p - (s - bb)) + (c - bb);  // (p + c) - s exactly
  if (e == 0.0) return static_cast<float>(s);
  uint64_t bits;
  std::memcpy(&bits, &s, 8);
  if ((e < 0.0) != (s < 0.0)) --bits;  // |p + c| < |s|: truncate
  bits |= 1;                           // round to odd
  double o;
  std::memcpy(&o, &bits, 8);
  return static_cast<float>(o);
}

inline float Fma32(float a, float b, float c) {
#if defined(__wasm__)
  return Fma32RoundToOdd(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

}  // namespace maxsim

#endif  // MAXSIM_SRC_KERNELS_FMA32_H_
