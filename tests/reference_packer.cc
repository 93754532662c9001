// SPDX-License-Identifier: Apache-2.0
#include "reference_packer.h"

#include <cstring>

#include "packed.h"

namespace maxsim::test {
namespace {
uint64_t Align64(uint64_t x) { return (x + 63) / 64 * 64; }
}  // namespace

std::vector<uint8_t> ReferencePack(const TokenSets& t, const uint64_t* ids, const std::vector<std::string>* string_ids) {
  const uint32_t dim = t.dim;
  const uint32_t elem = t.dtype == MAXSIM_F32 ? 4 : 2;
  std::vector<uint64_t> rows;  // kept source rows, in order
  std::vector<uint64_t> offsets{0};
  for (uint64_t i = 0; i < t.n_sets(); ++i) {
    for (uint64_t r = t.offsets[i]; r < t.offsets[i + 1]; ++r) {
      if (t.kept(r)) rows.push_back(r);
    }
    offsets.push_back(rows.size());
  }
  const uint64_t n = rows.size(), sets = t.n_sets();
  const uint32_t padded_dim = static_cast<uint32_t>(Align64(dim));
  const uint32_t orig_row = static_cast<uint32_t>(Align64(static_cast<uint64_t>(dim) * elem));
  // String ids region: (sets + 1) u64 offsets into the text that follows, each id's bytes then one NUL.
  std::vector<uint8_t> strings;
  if (string_ids) {
    std::vector<uint64_t> at{0};
    std::string text;
    for (const std::string& s : *string_ids) {
      text += s;
      text += '\0';
      at.push_back(text.size());
    }
    strings.resize(at.size() * 8 + text.size());
    std::memcpy(strings.data(), at.data(), at.size() * 8);
    std::memcpy(strings.data() + at.size() * 8, text.data(), text.size());
  }
  const int n_regions = string_ids ? 6 : 5;
  uint64_t region_off[6], region_size[6] = {n * padded_dim, n * 16, n * orig_row, (sets + 1) * 8, ids ? sets * 8 : 0,
                                            strings.size()};
  uint64_t cursor = 256;
  for (int r = 0; r < n_regions; ++r) {
    region_off[r] = cursor;
    cursor = Align64(cursor + region_size[r]);
  }
  const uint64_t total = cursor;
  std::vector<uint8_t> b(total, 0);
  for (uint64_t v = 0; v < n; ++v) {
    const float* x = t.row(rows[v]);
    const pack::RowStats stats = pack::AnalyzeRowRef(x, dim);
    maxsim_vector_meta meta;
    pack::QuantizeRowRef(x, dim, padded_dim, stats, reinterpret_cast<int8_t*>(b.data() + region_off[0] + v * padded_dim),
                         &meta);
    std::memcpy(b.data() + region_off[1] + v * 16, &meta, 16);
    std::memcpy(b.data() + region_off[2] + v * orig_row, t.encoded.data() + rows[v] * dim * elem, dim * elem);
  }
  std::memcpy(b.data() + region_off[3], offsets.data(), offsets.size() * 8);
  if (ids) std::memcpy(b.data() + region_off[4], ids, sets * 8);
  if (!strings.empty()) std::memcpy(b.data() + region_off[5], strings.data(), strings.size());

  std::memcpy(b.data() + hdr::kMagic, "MAXSIMPK", 8);
  Put<uint16_t>(b, hdr::kVersionMajor, 1);
  Put<uint16_t>(b, hdr::kVersionMinor, string_ids ? 1 : 0);
  Put<uint32_t>(b, hdr::kEndian, 0x01020304u);
  Put<uint16_t>(b, hdr::kHeaderSize, 256);
  Put<uint16_t>(b, hdr::kLayout, 1);
  Put<uint8_t>(b, hdr::kDtype, static_cast<uint8_t>(t.dtype));
  Put<uint8_t>(b, hdr::kRegionCount, static_cast<uint8_t>(n_regions));
  Put<uint16_t>(b, hdr::kQuantRange, 127);
  Put<uint32_t>(b, hdr::kDim, dim);
  Put<uint32_t>(b, hdr::kPaddedDim, padded_dim);
  Put<uint32_t>(b, hdr::kOrigRowBytes, orig_row);
  Put<uint32_t>(b, hdr::kMetaRecordBytes, 16);
  Put<uint64_t>(b, hdr::kNVectors, n);
  Put<uint64_t>(b, hdr::kNSets, sets);
  Put<uint64_t>(b, hdr::kTotalSize, total);
  for (int r = 0; r < n_regions; ++r) {
    Put<uint64_t>(b, hdr::kRegions + 16 * r, region_off[r]);
    Put<uint64_t>(b, hdr::kRegions + 16 * r + 8, region_size[r]);
  }
  Put<uint64_t>(b, hdr::kFlags, (ids ? 1 : 0) | (string_ids ? 2 : 0));
  Reseal(b);
  return b;
}

void ResealHeaderOnly(std::vector<uint8_t>& b) {
  Put<uint64_t>(b, hdr::kHeaderChecksum, pack::Checksum64(b.data(), hdr::kHeaderChecksum));
}

void Reseal(std::vector<uint8_t>& b) {
  if (b.size() > 256) Put<uint64_t>(b, hdr::kPayloadChecksum, pack::Checksum64(b.data() + 256, b.size() - 256));
  ResealHeaderOnly(b);
}

}  // namespace maxsim::test
