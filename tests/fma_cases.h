// SPDX-License-Identifier: Apache-2.0
// Triples (a, b, c) for testing an f32 fused multiply-add, and an independent correctly rounded reference. Shared
// by the native test (tests/fma_emulation_test.cc: the emulation and the reference against the CPU's fused
// multiply-add) and the WebAssembly one (tests/wasm/wasm_kernel_test.cc: the vector and scalar steps against
// the reference). Random values over the whole exponent range, cancellations, subnormal results, and the halfway
// cases where rounding a*b + c to f64 first and then to f32 would be wrong (a*b + c within 2^-25..2^-47
// relative of an f32 midpoint, on both sides, and exactly on it).
#ifndef MAXSIM_TESTS_FMA_CASES_H_
#define MAXSIM_TESTS_FMA_CASES_H_

#include <cmath>
#include <cstdint>
#include <cstring>

namespace maxsim::test {

struct FmaTriple {
  float a, b, c;
};

// SplitMix64: the same sequence on every platform.
inline uint64_t FmaRandom(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline float FmaBitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// A finite f32 with a random sign, significand and an exponent in [lo, hi] (biased, 1..254).
inline float FmaRandomFloat(uint64_t* s, uint32_t lo, uint32_t hi) {
  const uint64_t r = FmaRandom(s);
  const uint32_t e = lo + static_cast<uint32_t>((r >> 32) % (hi - lo + 1));
  return FmaBitsToFloat(static_cast<uint32_t>(r & 0x807FFFFFu) | (e << 23));
}

// Triple i of the sequence from `seed` (kinds cycle with i).
inline FmaTriple FmaCase(uint64_t seed, uint64_t i) {
  uint64_t s = seed ^ (i * 0xD1B54A32D192ED03ull);
  const uint64_t kind = i % 6;
  FmaTriple t;
  if (kind == 0) {  // anything in a range where nothing overflows
    t.a = FmaRandomFloat(&s, 64, 190);
    t.b = FmaRandomFloat(&s, 64, 190);
    t.c = FmaRandomFloat(&s, 1, 250);
  } else if (kind == 1) {  // embedding-like magnitudes
    t.a = FmaRandomFloat(&s, 112, 128);
    t.b = FmaRandomFloat(&s, 112, 128);
    t.c = FmaRandomFloat(&s, 100, 132);
  } else if (kind == 2) {  // c close to -a*b: cancellation, and results near or below the f32 normal range
    t.a = FmaRandomFloat(&s, 40, 127);
    t.b = FmaRandomFloat(&s, 40, 127);
    const float p = t.a * t.b;
    const uint32_t delta = static_cast<uint32_t>(FmaRandom(&s) % 5);
    uint32_t bits;
    std::memcpy(&bits, &p, 4);
    t.c = -FmaBitsToFloat(bits + delta - 2);
    if (!std::isfinite(t.c)) t.c = -p;
  } else {  // halfway cases: a*b = h (1 +- 2^-2j) or h, with h half an ulp of c
    const uint64_t r = FmaRandom(&s);
    const uint32_t ce = 60 + static_cast<uint32_t>(r % 130);  // c's biased exponent
    // c with an odd or even significand (which way a tie goes)
    t.c = FmaBitsToFloat((static_cast<uint32_t>(FmaRandom(&s)) & 0x807FFFFFu) | (ce << 23));
    const int h_exp = static_cast<int>(ce) - 127 - 24;  // half an ulp of c: 2^(e - 24)
    const int split = static_cast<int>((r >> 16) % 40) - 20;  // h = 2^split * 2^(h_exp - split)
    const float ha = std::ldexp(1.0f, split), hb = std::ldexp(1.0f, h_exp - split);
    const int j = 12 + static_cast<int>((r >> 24) % 12);  // 2j in [24, 46]
    const float u = std::ldexp(1.0f, -j);
    if (kind == 3) {  // h (1 - 2^-2j): just below the midpoint
      t.a = ha * (1.0f + u);
      t.b = hb * (1.0f - u);
    } else if (kind == 4) {  // h (1 + 2^-j)^2 / ... : just above it (and, for small j, further)
      t.a = ha * (1.0f + u);
      t.b = hb * (1.0f + u);
    } else {  // exactly on it
      t.a = ha;
      t.b = hb;
    }
    if ((r >> 40) & 1) t.a = -t.a;
    if ((r >> 41) & 1) t.c = -t.c;  // the product pulls toward or away from zero
  }
  return t;
}

// fl(a * b + c) rounded once, by a method independent of the round-to-odd construction: the exact sum as
// s + e (TwoSum of the exact product and c), s rounded to f32 unless s is exactly halfway between two f32
// neighbours and e != 0, in which case e decides the side.
inline float ReferenceFma(float a, float b, float c) {
  const double p = static_cast<double>(a) * b;
  const double s = p + c;
  const double bb = s - p;
  const double e = (p - (s - bb)) + (c - bb);
  const float f = static_cast<float>(s);
  if (e == 0.0 || static_cast<double>(f) == s) return f;
  const float g = std::nextafter(f, static_cast<double>(f) < s ? INFINITY : -INFINITY);  // s lies between f, g
  if ((static_cast<double>(f) + static_cast<double>(g)) * 0.5 != s) return f;  // not a tie: f is nearest
  return (e > 0.0) == (g > f) ? g : f;  // a false tie: the exact sum is on e's side of it
}

}  // namespace maxsim::test

#endif  // MAXSIM_TESTS_FMA_CASES_H_
