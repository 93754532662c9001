// SPDX-License-Identifier: Apache-2.0
// What a string id may hold (packed format 1.1, packing/README.md): header-only, so that the packer, the
// validator and the command-line tool (which checks id files line by line) apply the one rule.
#ifndef MAXSIM_PACKING_STRING_ID_H_
#define MAXSIM_PACKING_STRING_ID_H_

#include <cstdint>

namespace maxsim::pack {

// Non-empty, valid UTF-8 (shortest forms, no surrogates, at most U+10FFFF), and free of NUL, tab, line feed and
// carriage return (ids live in line- and tab-separated files). Returns nullptr if valid, else what is wrong
// ("contains a tab").
inline const char* StringIdProblem(const char* text, uint64_t length) {
  if (length == 0) return "is empty";
  const auto* s = reinterpret_cast<const unsigned char*>(text);
  uint64_t i = 0;
  while (i < length) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      if (c == 0) return "contains a NUL byte";
      if (c == '\t') return "contains a tab";
      if (c == '\n' || c == '\r') return "contains a line break";
      ++i;
      continue;
    }
    // Multi-byte sequence: lead byte gives the length and the smallest allowed code point (no overlong forms).
    uint32_t cp;
    int extra;
    if (c >= 0xC2 && c <= 0xDF) {
      cp = c & 0x1F;
      extra = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      cp = c & 0x0F;
      extra = 2;
    } else if (c >= 0xF0 && c <= 0xF4) {
      cp = c & 0x07;
      extra = 3;
    } else {
      return "is not valid UTF-8";
    }
    if (length - i <= static_cast<uint64_t>(extra)) return "is not valid UTF-8 (a truncated sequence)";
    for (int k = 1; k <= extra; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return "is not valid UTF-8";
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if ((extra == 2 && cp < 0x800) || (extra == 3 && (cp < 0x10000 || cp > 0x10FFFF))) {
      return "is not valid UTF-8 (an overlong or out-of-range sequence)";
    }
    if (cp >= 0xD800 && cp <= 0xDFFF) return "is not valid UTF-8 (a surrogate code point)";
    i += static_cast<uint64_t>(extra) + 1;
  }
  return nullptr;
}

}  // namespace maxsim::pack

#endif  // MAXSIM_PACKING_STRING_ID_H_
