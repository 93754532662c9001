// SPDX-License-Identifier: Apache-2.0
// WebAssembly-only checks (the kernel, packing and API suites run here as everywhere): the canonical chain's
// step on the WASM target (kernels/chain_fma-inl.h) and the scalar one (kernels/fma32.h) against an
// independent correctly rounded reference on random and halfway triples, and which kernel this module offers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cpu_features.h"
#include "fma_cases.h"
#include "hwy/highway.h"
#include "kernels/chain_fma-inl.h"
#include "kernels/fma32.h"
#include "maxsim/maxsim.h"

namespace maxsim::test {
namespace {

namespace hn = hwy::HWY_NAMESPACE;

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// ReferenceFma (fma_cases.h) rather than wasi-libc's fmaf, which rounds twice on exactly these inputs (see
// kernels/fma32.h); the reference itself is checked against the CPU's fused multiply-add by the native
// tests/fma_emulation_test.cc.
// The module's ChainMulAdd (emulated in the SIMD128 module; relaxed_madd, proven fused by the probe, in the
// relaxed one) and the scalar Fma32 against the reference, four triples per call. MAXSIM_FMA_CASES overrides
// the count.
TEST(WasmFma, ChainStepMatchesFmaOnRandomAndHalfwayTriples) {
  const char* env = std::getenv("MAXSIM_FMA_CASES");
  const uint64_t n = env ? std::strtoull(env, nullptr, 10) : 4000000;
  const bool vector_step_exact =
#if defined(__wasm_relaxed_simd__)
      (GetCpuInfo().features & kCpuWasmRelaxedSimd) != 0;
#else
      true;
#endif
  const hn::Full128<float> df;
  uint64_t mismatches = 0;
  for (uint64_t i = 0; i < n; i += 4) {
    alignas(16) float a[4], b[4], c[4], got[4];
    for (int l = 0; l < 4; ++l) {
      const FmaTriple t = FmaCase(20261126, i + l);
      a[l] = t.a;
      b[l] = t.b;
      c[l] = t.c;
    }
    hn::Store(maxsim::HWY_NAMESPACE::ChainMulAdd(hn::Load(df, a), hn::Load(df, b), hn::Load(df, c)), df, got);
    for (int l = 0; l < 4; ++l) {
      const float want = ReferenceFma(a[l], b[l], c[l]);
      const float scalar = Fma32(a[l], b[l], c[l]);
      const bool bad = Bits(scalar) != Bits(want) || (vector_step_exact && Bits(got[l]) != Bits(want));
      if (bad && ++mismatches <= 10) {
        ADD_FAILURE() << "case " << i + l << ": fma(" << a[l] << ", " << b[l] << ", " << c[l] << ") = " << want
                      << " (0x" << std::hex << Bits(want) << "), vector step 0x" << Bits(got[l])
                      << ", Fma32 0x" << Bits(scalar) << std::dec;
      }
    }
  }
  EXPECT_EQ(mismatches, 0u) << "of " << n << " triples";
}

// The halfway case of the proof (docs/wasm.md) spelled out: a*b = 2^-24 (1 - 2^-30), c = 1 + 2^-23. Rounding
// a*b + c to f64 lands exactly on the f32 midpoint 1 + 2^-23 + 2^-24, which then rounds (to even) up to
// 1 + 2^-22; the fused result is 1 + 2^-23.
TEST(WasmFma, DoubleRoundingCaseIsRoundedOnce) {
#if defined(__wasm_relaxed_simd__)
  if (!(GetCpuInfo().features & kCpuWasmRelaxedSimd)) GTEST_SKIP() << GetCpuInfo().relaxed_note;
#endif
  const hn::Full128<float> df;
  const float a = 0x1p-12f * (1.0f + 0x1p-15f), b = 0x1p-12f * (1.0f - 0x1p-15f), c = 1.0f + 0x1p-23f;
  const float twice = static_cast<float>(static_cast<double>(a) * b + c);
  ASSERT_EQ(twice, 1.0f + 0x1p-22f);  // the trap exists
  EXPECT_EQ(ReferenceFma(a, b, c), 1.0f + 0x1p-23f);
  EXPECT_EQ(Fma32(a, b, c), 1.0f + 0x1p-23f);
  alignas(16) float out[4];
  hn::Store(maxsim::HWY_NAMESPACE::ChainMulAdd(hn::Set(df, a), hn::Set(df, b), hn::Set(df, c)), df, out);
  for (float v : out) EXPECT_EQ(v, 1.0f + 0x1p-23f);
}

TEST(WasmKernels, TheModulesKernelIsListedAndSelected) {
  const std::string want =
#if defined(__wasm_relaxed_simd__)
      "wasm-relaxed";
#else
      "wasm-simd128";
#endif
  bool listed = false;
  for (size_t i = 0; i < maxsim_kernel_count(); ++i) {
    if (want != maxsim_kernel_name(i)) continue;
    listed = true;
    const char* why = nullptr;
    const int available = maxsim_kernel_available(i, &why);
#if defined(__wasm_relaxed_simd__)
    // Offered exactly when the probe saw a fused relaxed_madd and an exact relaxed dot.
    EXPECT_EQ(available != 0, (GetCpuInfo().features & kCpuWasmRelaxedSimd) != 0) << GetCpuInfo().relaxed_note;
    if (!available) EXPECT_NE(std::string(why).find("probe"), std::string::npos) << why;
#else
    EXPECT_TRUE(available) << why;
#endif
  }
  EXPECT_TRUE(listed) << want;
  maxsim_options o;
  maxsim_options_init(&o);
  o.load_plugins = 1;
  o.plugin_path = "/nonexistent";
  maxsim_context* ctx = nullptr;
  ASSERT_EQ(maxsim_context_create(&o, &ctx), MAXSIM_OK) << maxsim_last_error();
  if (GetCpuInfo().features & kCpuWasmRelaxedSimd || want == "wasm-simd128") {
    EXPECT_EQ(std::string(maxsim_context_kernel(ctx)), want);
  }
  char report[8192];
  ASSERT_EQ(maxsim_context_report(ctx, report, sizeof(report), nullptr), MAXSIM_OK);
  EXPECT_NE(std::string(report).find("no plugins in this build"), std::string::npos) << report;
  maxsim_context_destroy(ctx);
}

}  // namespace
}  // namespace maxsim::test
