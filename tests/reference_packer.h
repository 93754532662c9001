// SPDX-License-Identifier: Apache-2.0
// An independent, deliberately plain packer written from packing/README.md: header fields are written at
// their documented byte offsets (not through the C struct), regions are laid out with its own arithmetic, and
// vectors are quantised by the canonical scalar definition (quantize_ref.cc). The library's packer must
// produce exactly these bytes.
#ifndef MAXSIM_TESTS_REFERENCE_PACKER_H_
#define MAXSIM_TESTS_REFERENCE_PACKER_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "test_util.h"

namespace maxsim::test {

// string_ids: null, or one id per set (format 1.1: a sixth region, version 1.1, flag bit 1).
std::vector<uint8_t> ReferencePack(const TokenSets& sets, const uint64_t* ids,
                                   const std::vector<std::string>* string_ids = nullptr);

// Byte offsets of header fields (from the spec), for the corruption tests.
namespace hdr {
constexpr size_t kMagic = 0, kVersionMajor = 8, kVersionMinor = 10, kEndian = 12, kHeaderSize = 16, kLayout = 18,
                 kDtype = 20, kRegionCount = 21, kQuantRange = 22, kDim = 24, kPaddedDim = 28, kOrigRowBytes = 32,
                 kMetaRecordBytes = 36, kNVectors = 40, kNSets = 48, kTotalSize = 56, kRegions = 64, kFlags = 192,
                 kPayloadChecksum = 200, kReserved = 208, kHeaderChecksum = 248;
}  // namespace hdr

// Recomputes both checksums of a buffer in place (so that a test can corrupt a field "consistently").
void Reseal(std::vector<uint8_t>& buffer);
void ResealHeaderOnly(std::vector<uint8_t>& buffer);

template <typename T>
void Put(std::vector<uint8_t>& b, size_t at, T value) {
  std::memcpy(b.data() + at, &value, sizeof(T));
}
template <typename T>
T Get(const std::vector<uint8_t>& b, size_t at) {
  T v;
  std::memcpy(&v, b.data() + at, sizeof(T));
  return v;
}

}  // namespace maxsim::test

#endif  // MAXSIM_TESTS_REFERENCE_PACKER_H_
