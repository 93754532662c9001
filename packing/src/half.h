// SPDX-License-Identifier: Apache-2.0
// Scalar conversions between f32 and the 16-bit formats. f16/bf16 -> f32 is exact; f32 -> f16/bf16 rounds
// to nearest even (used by tests and tools to make 16-bit inputs; the library itself only widens).
#ifndef MAXSIM_SRC_HALF_H_
#define MAXSIM_SRC_HALF_H_

#include <cstdint>
#include <cstring>

namespace maxsim {

inline float BitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
inline uint32_t FloatToBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

inline float Bf16ToF32(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

inline float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0) {
    if (mantissa == 0) return BitsToFloat(sign);
    // Subnormal: value = mantissa * 2^-24, exact in f32.
    float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return BitsToFloat(sign | 0x7F800000u | (mantissa << 13));
  return BitsToFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

inline uint16_t F32ToBf16(float f) {
  uint32_t bits = FloatToBits(f);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

inline uint16_t F32ToF16(float f) {
  const uint32_t bits = FloatToBits(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to >= 65520: infinity
  if (abs < 0x38800000u) {                                               // below the smallest normal f16
    // Round abs * 2^24 to an integer (nearest even) = the subnormal mantissa.
    const float scaled = BitsToFloat(abs) * 16777216.0f;  // exact: power-of-two scale
    uint32_t m = static_cast<uint32_t>(scaled);
    const float rest = scaled - static_cast<float>(m);
    if (rest > 0.5f || (rest == 0.5f && (m & 1u))) ++m;
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t rounded = abs + 0xFFFu + ((abs >> 13) & 1u);
  return static_cast<uint16_t>(sign | (((rounded >> 13) - (112u << 10)) & 0x7FFFu));
}

}  // namespace maxsim

#endif  // MAXSIM_SRC_HALF_H_
