// SPDX-License-Identifier: Apache-2.0
// ChainMulAdd(a, b, c): one step of the canonical chain (kernel.h), fl(a * b + c) with a single rounding, per
// Highway target. Every target with a fused multiply-add uses it (hn::MulAdd); WebAssembly's SIMD128 has none
// (Highway's MulAdd is a multiply and an add there), so the WASM target takes its step from
// kernels/wasm/fma_wasm-inl.h. Included per target by screen_hwy-inl.h (and through it by exact_hwy.cc).
#if defined(MAXSIM_SRC_KERNELS_CHAIN_FMA_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MAXSIM_SRC_KERNELS_CHAIN_FMA_INL_H_
#undef MAXSIM_SRC_KERNELS_CHAIN_FMA_INL_H_
#else
#define MAXSIM_SRC_KERNELS_CHAIN_FMA_INL_H_
#endif

#include "hwy/highway.h"

#if HWY_TARGET == HWY_WASM
#include "kernels/wasm/fma_wasm-inl.h"  // defines ChainMulAdd for HWY_WASM
#else
HWY_BEFORE_NAMESPACE();
namespace maxsim {
namespace HWY_NAMESPACE {

template <class V>
HWY_INLINE V ChainMulAdd(V a, V b, V c) {
  return hwy::HWY_NAMESPACE::MulAdd(a, b, c);
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace maxsim
HWY_AFTER_NAMESPACE();
#endif

#endif  // MAXSIM_SRC_KERNELS_CHAIN_FMA_INL_H_
