// SPDX-License-Identifier: Apache-2.0
// The exact fused multiply-add emulation of the WebAssembly build (Fma32RoundToOdd, kernels/fma32.h; proof in
// docs/wasm.md) and the reference its WebAssembly test uses (ReferenceFma, fma_cases.h), both against this
// CPU's fused multiply-add (std::fma) on random and halfway triples. MAXSIM_FMA_CASES=N runs N triples (e.g.
// 4000000000 for a long run; the default is a CI-sized sample).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "fma_cases.h"
#include "kernels/fma32.h"

namespace maxsim::test {
namespace {

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

TEST(FmaEmulation, RoundToOddAndTheReferenceEqualTheHardwareFma) {
  const char* env = std::getenv("MAXSIM_FMA_CASES");
  const uint64_t n = env ? std::strtoull(env, nullptr, 10) : 8000000;
  uint64_t bad = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const FmaTriple t = FmaCase(20261126, i);
    const float want = std::fma(t.a, t.b, t.c);
    const float odd = Fma32RoundToOdd(t.a, t.b, t.c), ref = ReferenceFma(t.a, t.b, t.c);
    if (Bits(odd) != Bits(want) || Bits(ref) != Bits(want)) {
      if (++bad <= 10) {
        ADD_FAILURE() << "case " << i << ": fma(" << t.a << ", " << t.b << ", " << t.c << ") = 0x" << std::hex
                      << Bits(want) << ", round-to-odd 0x" << Bits(odd) << ", reference 0x" << Bits(ref);
      }
    }
  }
  EXPECT_EQ(bad, 0u) << "of " << n << " triples";
}

// Rounding to f64 and then to f32 is wrong on the halfway cases; the sample must contain them, or the test
// above would pass for the naive method too.
TEST(FmaEmulation, TheSampleContainsDoubleRoundingCases) {
  uint64_t traps = 0;
  for (uint64_t i = 0; i < 600000; ++i) {
    const FmaTriple t = FmaCase(20261126, i);
    const float naive = static_cast<float>(static_cast<double>(t.a) * t.b + t.c);
    if (Bits(naive) != Bits(std::fma(t.a, t.b, t.c))) ++traps;
  }
  EXPECT_GT(traps, 1000u);
}

}  // namespace
}  // namespace maxsim::test
