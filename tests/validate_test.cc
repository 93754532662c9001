// SPDX-License-Identifier: Apache-2.0
// The corruption suite: every header field mutated (with and without resealing the checksums, so each check is
// reached on its own), truncation and extension, huge counts, misaligned region offsets, corrupted offsets,
// codes, metadata and originals, and deep validation of consistent-looking lies. Every case must be rejected with
// MAXSIM_ERR_INVALID_BUFFER and a message, never a crash.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "maxsim/maxsim.hpp"
#include "packed.h"
#include "reference_packer.h"
#include "test_util.h"

namespace maxsim::test {
namespace {

std::vector<uint8_t> ValidBuffer(bool ids = true) {
  std::mt19937_64 rng(21);
  TokenSets t = Generate(rng, Shape::kGaussian, 5, 0, 9, 20);
  std::vector<uint64_t> id(t.n_sets(), 42);
  return ReferencePack(t, ids ? id.data() : nullptr);
}

// A buffer with string ids (format 1.1): ids "s0", "s1", "\u00e92" (two-byte UTF-8), "s3", "s44": 17 bytes of text
// with their NULs, so that a zero gap follows the region.
std::vector<uint8_t> StringIdBuffer() {
  std::mt19937_64 rng(22);
  TokenSets t = Generate(rng, Shape::kGaussian, 5, 0, 9, 20);
  const std::vector<std::string> sids = {"s0", "s1", "\xc3\xa9" "2", "s3", "s44"};
  return ReferencePack(t, nullptr, &sids);
}

maxsim_status ValidateBytes(const std::vector<uint8_t>& b, maxsim_validation level = MAXSIM_VALIDATE_STANDARD) {
  AlignedBytes a(b);
  return maxsim_validate(a.data(), b.size(), level);
}

void ExpectRejected(const std::vector<uint8_t>& b, const std::string& what, const char* message_part = nullptr,
                    maxsim_validation level = MAXSIM_VALIDATE_STANDARD) {
  const maxsim_status st = ValidateBytes(b, level);
  EXPECT_EQ(st, MAXSIM_ERR_INVALID_BUFFER) << what;
  const std::string msg = maxsim_last_error();
  EXPECT_FALSE(msg.empty()) << what;
  if (message_part) EXPECT_NE(msg.find(message_part), std::string::npos) << what << ": message was: " << msg;
}

TEST(Validate, AcceptsWhatThePackerWrites) {
  for (bool ids : {false, true}) {
    const auto b = ValidBuffer(ids);
    for (maxsim_validation level : {MAXSIM_VALIDATE_FAST, MAXSIM_VALIDATE_STANDARD, MAXSIM_VALIDATE_DEEP}) {
      EXPECT_EQ(ValidateBytes(b, level), MAXSIM_OK) << maxsim_last_error();
    }
  }
}

TEST(Validate, EveryHeaderBitFlipIsCaught) {
  const auto good = ValidBuffer();
  for (size_t byte = 0; byte < MAXSIM_PACK_HEADER_SIZE; ++byte) {
    for (int bit : {0, 7}) {
      auto b = good;
      b[byte] ^= static_cast<uint8_t>(1u << bit);
      ExpectRejected(b, "header byte " + std::to_string(byte) + " bit " + std::to_string(bit));
    }
  }
}

// Each field set to a wrong value with both checksums recomputed: the field's own check must catch it.
TEST(Validate, EachHeaderFieldIsCheckedOnItsOwn) {
  const auto good = ValidBuffer();
  struct Case {
    const char* name;
    std::function<void(std::vector<uint8_t>&)> mutate;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"magic", [](auto& b) { b[hdr::kMagic + 3] = 'X'; }, "magic"},
      {"version major", [](auto& b) { Put<uint16_t>(b, hdr::kVersionMajor, 2); }, "version"},
      {"endianness (big)", [](auto& b) { Put<uint32_t>(b, hdr::kEndian, 0x04030201u); }, "big-endian"},
      {"endianness (junk)", [](auto& b) { Put<uint32_t>(b, hdr::kEndian, 7); }, "endianness"},
      {"header size", [](auto& b) { Put<uint16_t>(b, hdr::kHeaderSize, 128); }, "header_size"},
      {"layout", [](auto& b) { Put<uint16_t>(b, hdr::kLayout, 2); }, "layout"},
      {"dtype 0", [](auto& b) { Put<uint8_t>(b, hdr::kDtype, 0); }, "dtype"},
      {"dtype 9", [](auto& b) { Put<uint8_t>(b, hdr::kDtype, 9); }, "dtype"},
      {"dtype f16 (sizes no longer match)", [](auto& b) { Put<uint8_t>(b, hdr::kDtype, 2); }, "orig_row_bytes"},
      {"region count", [](auto& b) { Put<uint8_t>(b, hdr::kRegionCount, 4); }, "region_count"},
      {"quant range", [](auto& b) { Put<uint16_t>(b, hdr::kQuantRange, 63); }, "quantisation range"},
      {"dim 0", [](auto& b) { Put<uint32_t>(b, hdr::kDim, 0); }, "dim"},
      {"dim huge", [](auto& b) { Put<uint32_t>(b, hdr::kDim, 1u << 30); }, "dim"},
      {"dim 65 (padded dim no longer fits)", [](auto& b) { Put<uint32_t>(b, hdr::kDim, 65); }, "padded_dim"},
      {"padded dim", [](auto& b) { Put<uint32_t>(b, hdr::kPaddedDim, 32); }, "padded_dim"},
      {"orig row bytes", [](auto& b) { Put<uint32_t>(b, hdr::kOrigRowBytes, 80); }, "orig_row_bytes"},
      {"meta record bytes", [](auto& b) { Put<uint32_t>(b, hdr::kMetaRecordBytes, 32); }, "metadata record"},
      {"n_vectors + 1", [](auto& b) { Put<uint64_t>(b, hdr::kNVectors, Get<uint64_t>(b, hdr::kNVectors) + 1); }, "region"},
      {"n_vectors huge", [](auto& b) { Put<uint64_t>(b, hdr::kNVectors, 1ull << 62); }, "64-bit"},
      {"n_vectors max", [](auto& b) { Put<uint64_t>(b, hdr::kNVectors, UINT64_MAX); }, "64-bit"},
      {"n_sets huge", [](auto& b) { Put<uint64_t>(b, hdr::kNSets, 1ull << 61); }, "64-bit"},
      {"n_sets max", [](auto& b) { Put<uint64_t>(b, hdr::kNSets, UINT64_MAX); }, "64-bit"},
      {"n_sets - 1", [](auto& b) { Put<uint64_t>(b, hdr::kNSets, Get<uint64_t>(b, hdr::kNSets) - 1); }, "region"},
      {"total size", [](auto& b) { Put<uint64_t>(b, hdr::kTotalSize, Get<uint64_t>(b, hdr::kTotalSize) + 64); }, "total_size"},
      {"codes offset misaligned", [](auto& b) { Put<uint64_t>(b, hdr::kRegions, 257); }, "region 0"},
      {"meta offset moved", [](auto& b) { Put<uint64_t>(b, hdr::kRegions + 16, Get<uint64_t>(b, hdr::kRegions + 16) + 64); }, "region 1"},
      {"originals size", [](auto& b) { Put<uint64_t>(b, hdr::kRegions + 40, 8); }, "region 2"},
      {"offsets offset beyond end", [](auto& b) { Put<uint64_t>(b, hdr::kRegions + 48, 1ull << 40); }, "region 3"},
      {"ids size", [](auto& b) { Put<uint64_t>(b, hdr::kRegions + 72, 0); }, "region 4"},
      {"unused slot", [](auto& b) { Put<uint64_t>(b, hdr::kRegions + 80, 256); }, "region 5"},
      {"unknown flag", [](auto& b) { Put<uint64_t>(b, hdr::kFlags, 5); }, "flag"},
      {"string-ids flag on a 1.0 buffer", [](auto& b) { Put<uint64_t>(b, hdr::kFlags, 3); }, "need 1.1"},
      {"ids flag cleared", [](auto& b) { Put<uint64_t>(b, hdr::kFlags, 0); }, "region 4"},
      {"reserved byte", [](auto& b) { b[hdr::kReserved + 5] = 1; }, "reserved"},
  };
  for (const Case& c : cases) {
    auto b = good;
    c.mutate(b);
    Reseal(b);
    ExpectRejected(b, c.name, c.message);
  }
}

TEST(Validate, StringIdsRegion) {
  const auto good = StringIdBuffer();
  for (maxsim_validation level : {MAXSIM_VALIDATE_FAST, MAXSIM_VALIDATE_STANDARD, MAXSIM_VALIDATE_DEEP}) {
    EXPECT_EQ(ValidateBytes(good, level), MAXSIM_OK) << maxsim_last_error();
  }
  const uint64_t at = Get<uint64_t>(good, hdr::kRegions + 16 * MAXSIM_REGION_STRING_IDS);
  const uint64_t size = Get<uint64_t>(good, hdr::kRegions + 16 * MAXSIM_REGION_STRING_IDS + 8);
  const uint64_t text = at + 6 * 8;  // after the 5 + 1 offsets
  ASSERT_EQ(size, 6 * 8 + 17u);
  struct Case {
    const char* name;
    std::function<void(std::vector<uint8_t>&)> mutate;
    const char* message;
    bool fast_catches;  // structural (FAST) or a content check (STANDARD)
  };
  const std::vector<Case> cases = {
      {"version 1.0", [](auto& b) { Put<uint16_t>(b, hdr::kVersionMinor, 0); }, "need 1.1", true},
      {"region count 5", [](auto& b) { Put<uint8_t>(b, hdr::kRegionCount, 5); }, "region_count", true},
      {"flag cleared", [](auto& b) { Put<uint64_t>(b, hdr::kFlags, 0); }, "region_count", true},
      {"region smaller than its table", [&](auto& b) { Put<uint64_t>(b, hdr::kRegions + 88, 40); }, "offset table",
       true},
      {"region size grown", [&](auto& b) { Put<uint64_t>(b, hdr::kRegions + 88, size + 1); }, "end at byte", true},
      {"region moved", [&](auto& b) { Put<uint64_t>(b, hdr::kRegions + 80, at + 64); }, "region 5", true},
      {"first offset", [&](auto& b) { Put<uint64_t>(b, at, 1); }, "offsets[0]", true},
      {"offsets decrease", [&](auto& b) { Put<uint64_t>(b, at + 16, 2); }, "string id 1 spans", true},
      {"empty id", [&](auto& b) { Put<uint64_t>(b, at + 16, 4); }, "string id 1 spans", true},
      {"last offset", [&](auto& b) { Put<uint64_t>(b, at + 40, 16); }, "end at byte 16", true},
      {"NUL overwritten", [&](auto& b) { b[text + 2] = 'x'; }, "string id 0 is not NUL-terminated", true},
      {"tab in an id", [&](auto& b) { b[text + 1] = '\t'; }, "string id 0 contains a tab", false},
      {"NUL inside an id", [&](auto& b) { b[text + 3] = 0; }, "string id 1 contains a NUL", false},
      {"broken UTF-8", [&](auto& b) { b[text + 7] = 'x'; }, "string id 2 is not valid UTF-8", false},
      {"gap after the region", [&](auto& b) { b[at + size] = 1; }, "after the string ids region", false},
  };
  for (const Case& c : cases) {
    auto b = good;
    c.mutate(b);
    Reseal(b);
    ExpectRejected(b, c.name, c.message);
    if (!c.fast_catches) {
      EXPECT_EQ(ValidateBytes(b, MAXSIM_VALIDATE_FAST), MAXSIM_OK) << c.name << ": " << maxsim_last_error();
    } else {
      ExpectRejected(b, c.name, c.message, MAXSIM_VALIDATE_FAST);
    }
  }
  // Random single-bit flips anywhere after the header never pass STANDARD.
  std::mt19937_64 rng(4);
  for (int trial = 0; trial < 200; ++trial) {
    auto b = good;
    b[256 + rng() % (b.size() - 256)] ^= static_cast<uint8_t>(1u << (rng() % 8));
    ExpectRejected(b, "string-id buffer flip " + std::to_string(trial));
  }
}

TEST(Validate, TruncationAndExtension) {
  const auto good = ValidBuffer();
  for (size_t size : {size_t{0}, size_t{1}, size_t{255}, size_t{256}, size_t{320}, good.size() - 64, good.size() - 1}) {
    std::vector<uint8_t> b(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(size));
    AlignedBytes a(b.empty() ? std::vector<uint8_t>(1) : b);
    EXPECT_EQ(maxsim_validate(a.data(), size, MAXSIM_VALIDATE_STANDARD), MAXSIM_ERR_INVALID_BUFFER) << size;
  }
  auto longer = good;
  longer.resize(good.size() + 64, 0);
  ExpectRejected(longer, "extended by 64 bytes", "truncated or padded");
}

TEST(Validate, PayloadCorruptionIsCaughtByTheChecksum) {
  const auto good = ValidBuffer();
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    auto b = good;
    const size_t at = 256 + rng() % (b.size() - 256);
    b[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
    // Offsets are checked structurally before the checksum pass; everything else is caught by the checksum.
    const uint64_t offsets_at = Get<uint64_t>(b, hdr::kRegions + 16 * MAXSIM_REGION_OFFSETS);
    const bool in_offsets = at >= offsets_at && at < offsets_at + Get<uint64_t>(b, hdr::kRegions + 16 * MAXSIM_REGION_OFFSETS + 8);
    ExpectRejected(b, "payload byte " + std::to_string(at), in_offsets ? "offset" : "checksum");
    // FAST skips the payload pass by design, but still never reads outside the buffer.
    AlignedBytes a(b);
    (void)maxsim_validate(a.data(), b.size(), MAXSIM_VALIDATE_FAST);
  }
}

// Consistent-looking lies: payload changed and resealed. STANDARD catches what could crash a kernel or produce
// NaN; DEEP re-quantises and catches the rest.
TEST(Validate, ResealedPayloadLiesAreCaught) {
  const auto good = ValidBuffer();
  pack::PackedView v;
  AlignedBytes ga(good);
  ASSERT_TRUE(pack::Validate(ga.data(), good.size(), MAXSIM_VALIDATE_STANDARD, &v).ok());
  const size_t codes = static_cast<size_t>(reinterpret_cast<const uint8_t*>(v.codes) - v.base);
  const size_t meta = static_cast<size_t>(reinterpret_cast<const uint8_t*>(v.meta) - v.base);
  const size_t orig = static_cast<size_t>(v.originals - v.base);
  const size_t offs = static_cast<size_t>(reinterpret_cast<const uint8_t*>(v.offsets) - v.base);
  struct Case {
    const char* name;
    std::function<void(std::vector<uint8_t>&)> mutate;
    const char* message;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<Case> standard = {
      {"offsets[0] != 0", [&](auto& b) { Put<uint64_t>(b, offs, 1); }, "offsets[0]"},
      {"offsets decrease", [&](auto& b) { Put<uint64_t>(b, offs + 16, 0); Put<uint64_t>(b, offs + 8, 5); }, "decrease"},
      {"last offset", [&](auto& b) { Put<uint64_t>(b, offs + 8 * v.n_sets, v.n_vectors + 1); }, "last offset"},
      {"code -128", [&](auto& b) { b[codes + 3] = 0x80; }, "-128"},
      {"code padding", [&](auto& b) { b[codes + v.dim + 1] = 1; }, "padding"},
      {"scale NaN", [&](auto& b) { Put<float>(b, meta, nan); }, "scale"},
      {"scale negative", [&](auto& b) { Put<float>(b, meta, -1.0f); }, "scale"},
      {"norm too large", [&](auto& b) { Put<float>(b, meta + 4, 3e19f); }, "norm"},
      {"resid inf", [&](auto& b) { Put<float>(b, meta + 8, std::numeric_limits<float>::infinity()); }, "residual"},
      {"code sum", [&](auto& b) { Put<int32_t>(b, meta + 12, 127 * 20 + 1); }, "code sum"},
      {"original NaN", [&](auto& b) { Put<float>(b, orig + 8, nan); }, "non-finite"},
      {"original padding", [&](auto& b) { Put<float>(b, orig + 4 * v.dim, 1.0f); }, "padding"},
      {"original huge", [&](auto& b) { Put<float>(b, orig + 4, 3e38f); }, "above the supported 1e19"},
      {"original changed", [&](auto& b) { Put<float>(b, orig, Get<float>(b, orig) + 0.125f); }, "norm record"},
      {"norm record stale", [&](auto& b) { Put<float>(b, meta + 4, Get<float>(b, meta + 4) * 0.5f); }, "norm record"},
      {"scale halved", [&](auto& b) { Put<float>(b, meta, Get<float>(b, meta) * 0.5f); }, "scale record"},
      {"gap after offsets", [&](auto& b) { b[offs + 8 * (v.n_sets + 1)] = 1; }, "after the offsets"},
  };
  for (const Case& c : standard) {
    auto b = good;
    c.mutate(b);
    Reseal(b);
    ExpectRejected(b, c.name, c.message);
  }
  const std::vector<Case> deep_only = {
      {"code off by one", [&](auto& b) { b[codes + 2] = static_cast<uint8_t>(b[codes + 2] == 127 ? 126 : b[codes + 2] + 1); }, "codes do not match"},
      {"resid understated", [&](auto& b) { Put<float>(b, meta + 8, 0.0f); }, "metadata"},
      {"code sum off by one", [&](auto& b) { Put<int32_t>(b, meta + 12, Get<int32_t>(b, meta + 12) + 1); }, "metadata"},
  };
  for (const Case& c : deep_only) {
    auto b = good;
    c.mutate(b);
    Reseal(b);
    EXPECT_EQ(ValidateBytes(b, MAXSIM_VALIDATE_STANDARD), MAXSIM_OK) << c.name << ": " << maxsim_last_error();
    ExpectRejected(b, c.name, c.message, MAXSIM_VALIDATE_DEEP);
  }
}

// STANDARD computes every vector's norm from its originals in their own dtype (not from the metadata): one
// element raised to near the dtype's maximum, metadata untouched and both checksums recomputed, is refused.
TEST(Validate, StandardChecksNormsOfTheOriginalsInEveryDtype) {
  for (maxsim_dtype dtype : {MAXSIM_F32, MAXSIM_F16, MAXSIM_BF16}) {
    std::mt19937_64 rng(22);
    TokenSets t = Generate(rng, Shape::kGaussian, 3, 1, 4, 70);
    t.Encode(dtype);
    const auto good = ReferencePack(t, nullptr);
    AlignedBytes ga(good);
    pack::PackedView v;
    ASSERT_TRUE(pack::Validate(ga.data(), good.size(), MAXSIM_VALIDATE_STANDARD, &v).ok()) << pack::DtypeName(dtype);
    const size_t orig = static_cast<size_t>(v.originals - v.base);
    auto b = good;
    if (dtype == MAXSIM_F32) {
      Put<float>(b, orig + 4 * 3, 3e38f);
    } else if (dtype == MAXSIM_BF16) {
      Put<uint16_t>(b, orig + 2 * 3, 0x7f7f);  // 3.39e38
    } else {
      Put<uint16_t>(b, orig + 2 * 3, 0x7bff);  // 65504: within 1e19, but the norm record no longer matches
    }
    Reseal(b);
    ExpectRejected(b, pack::DtypeName(dtype), dtype == MAXSIM_F16 ? "norm record" : "above the supported 1e19");
    ExpectRejected(b, pack::DtypeName(dtype), nullptr, MAXSIM_VALIDATE_DEEP);
  }
}

// The header's rule: a reader accepts any minor version up to its own and refuses a newer one.
TEST(Validate, MinorVersionsAboveTheReadersAreRefused) {
  for (uint16_t minor : {uint16_t{0}, uint16_t{MAXSIM_PACK_VERSION_MINOR}}) {
    auto b = ValidBuffer();
    Put<uint16_t>(b, hdr::kVersionMinor, minor);
    ResealHeaderOnly(b);
    EXPECT_EQ(ValidateBytes(b), MAXSIM_OK) << minor << ": " << maxsim_last_error();
  }
  for (uint16_t minor : {uint16_t{MAXSIM_PACK_VERSION_MINOR + 1}, uint16_t{65535}}) {
    auto b = ValidBuffer();
    Put<uint16_t>(b, hdr::kVersionMinor, minor);
    ResealHeaderOnly(b);
    ExpectRejected(b, "minor " + std::to_string(minor), "newer than this reader's");
  }
}

TEST(Validate, ArgumentErrors) {
  const auto good = ValidBuffer();
  AlignedBytes a(good.size() + 64);
  std::memcpy(a.data() + 8, good.data(), good.size());
  EXPECT_EQ(maxsim_validate(a.data() + 8, good.size(), MAXSIM_VALIDATE_STANDARD), MAXSIM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(maxsim_last_error()).find("aligned"), std::string::npos);
  EXPECT_EQ(maxsim_validate(nullptr, 100, MAXSIM_VALIDATE_STANDARD), MAXSIM_ERR_INVALID_ARGUMENT);
  AlignedBytes ok(good);
  EXPECT_EQ(maxsim_validate(ok.data(), good.size(), static_cast<maxsim_validation>(7)), MAXSIM_ERR_INVALID_ARGUMENT);
  maxsim_packed* p = nullptr;
  EXPECT_EQ(maxsim_packed_open(ok.data(), good.size(), MAXSIM_VALIDATE_STANDARD, nullptr), MAXSIM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(maxsim_packed_open(ok.data(), good.size() - 1, MAXSIM_VALIDATE_STANDARD, &p), MAXSIM_ERR_INVALID_BUFFER);
  EXPECT_EQ(p, nullptr);
}

TEST(Validate, RandomGarbageNeverCrashes) {
  std::mt19937_64 rng(8);
  const auto good = ValidBuffer();
  for (int trial = 0; trial < 2000; ++trial) {
    auto b = good;
    const int edits = 1 + static_cast<int>(rng() % 8);
    for (int e = 0; e < edits; ++e) b[rng() % b.size()] = static_cast<uint8_t>(rng());
    if (trial % 2) Reseal(b);
    if (trial % 5 == 0) b.resize(rng() % (b.size() + 1));
    AlignedBytes a(b.empty() ? std::vector<uint8_t>(1) : b);
    const maxsim_status st = maxsim_validate(a.data(), b.size(), MAXSIM_VALIDATE_DEEP);
    EXPECT_TRUE(st == MAXSIM_OK || st == MAXSIM_ERR_INVALID_BUFFER) << st;
  }
}

}  // namespace
}  // namespace maxsim::test
