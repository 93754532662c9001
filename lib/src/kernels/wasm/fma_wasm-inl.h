// SPDX-License-Identifier: Apache-2.0
// ChainMulAdd for Highway's WASM target (included by kernels/chain_fma-inl.h): fl(a * b + c) rounded once,
// the canonical chain's step, on 4 f32 lanes.
//
// Relaxed-SIMD module (-mrelaxed-simd): f32x4.relaxed_madd. The engine may compute it fused or as a multiply
// and an add; the kernel that uses it ("wasm-relaxed") is available only after the run-time probe
// (wasm/probe_wasm.cc) has seen this engine fuse it on inputs where the two differ, so its bits never depend
// on the engine.
//
// SIMD128 module: exact emulation in f64 with round-to-odd (proof in docs/wasm.md):
//   p = a * b in f64 is exact (24 + 24 significand bits <= 53);
//   s = p + c in f64 (round to nearest), and its error e = (p + c) - s exactly (TwoSum, 6 operations);
//   o = s rounded to odd: s itself when e == 0, else the one of s's two f64 neighbours around p + c whose
//       last significand bit is 1 (bit pattern: (bits(s) - [sign(e) != sign(s)]) | 1);
//   result = o rounded to nearest f32.
// Rounding p + c to odd in a format with at least 2 more significand bits than f32 and then to nearest f32 is
// the correctly rounded sum (Boldo and Melquiond, "Emulation of FMA and correctly rounded sums: proved
// algorithms using rounding to odd", IEEE TC 2008): no double-rounding error, ties included. Valid while no
// step overflows f64 (the engine guarantees finite inputs with norms <= 1e19) and for f32 subnormal results
// (f64's grid there is 2^-1074, far finer than f32's 2^-149).
#ifndef MAXSIM_SRC_KERNELS_WASM_FMA_WASM_INL_H_
#define MAXSIM_SRC_KERNELS_WASM_FMA_WASM_INL_H_

#include <wasm_simd128.h>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace maxsim {
namespace HWY_NAMESPACE {
namespace wasm_fma {

// fl64(p + c) rounded to odd, for f64x2 p and c (both finite, the sum not overflowing).
HWY_INLINE v128_t AddRoundToOdd(v128_t p, v128_t c) {
  const v128_t s = wasm_f64x2_add(p, c);
  const v128_t bb = wasm_f64x2_sub(s, p);
  const v128_t e = wasm_f64x2_add(wasm_f64x2_sub(p, wasm_f64x2_sub(s, bb)), wasm_f64x2_sub(c, bb));
  const v128_t inexact = wasm_f64x2_ne(e, wasm_f64x2_splat(0.0));  // all ones where e != 0
  // |p + c| < |s| where the signs of e and s differ: truncation is s one ulp down in magnitude (bits - 1).
  const v128_t down = wasm_v128_and(wasm_i64x2_shr(wasm_v128_xor(s, e), 63), inexact);
  const v128_t odd = wasm_v128_and(inexact, wasm_i64x2_splat(1));
  return wasm_v128_or(wasm_i64x2_add(s, down), odd);
}

}  // namespace wasm_fma

template <class V>
HWY_INLINE V ChainMulAdd(V a, V b, V c) {
#if defined(__wasm_relaxed_simd__)
  return V{wasm_f32x4_relaxed_madd(a.raw, b.raw, c.raw)};
#else
  const v128_t A = a.raw, B = b.raw, C = c.raw;
  const v128_t a_hi = wasm_i32x4_shuffle(A, A, 2, 3, 2, 3);
  const v128_t b_hi = wasm_i32x4_shuffle(B, B, 2, 3, 2, 3);
  const v128_t c_hi = wasm_i32x4_shuffle(C, C, 2, 3, 2, 3);
  const v128_t p_lo = wasm_f64x2_mul(wasm_f64x2_promote_low_f32x4(A), wasm_f64x2_promote_low_f32x4(B));
  const v128_t p_hi = wasm_f64x2_mul(wasm_f64x2_promote_low_f32x4(a_hi), wasm_f64x2_promote_low_f32x4(b_hi));
  const v128_t lo = wasm_f32x4_demote_f64x2_zero(wasm_fma::AddRoundToOdd(p_lo, wasm_f64x2_promote_low_f32x4(C)));
  const v128_t hi = wasm_f32x4_demote_f64x2_zero(wasm_fma::AddRoundToOdd(p_hi, wasm_f64x2_promote_low_f32x4(c_hi)));
  return V{wasm_i32x4_shuffle(lo, hi, 0, 1, 4, 5)};
#endif
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace maxsim
HWY_AFTER_NAMESPACE();

#endif  // MAXSIM_SRC_KERNELS_WASM_FMA_WASM_INL_H_
