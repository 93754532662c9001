// SPDX-License-Identifier: Apache-2.0
// The packer: byte-for-byte against the independent reference packer (output pre-filled with a sentinel so an
// unwritten byte shows), every Highway target against the scalar definition, rejection of bad values with
// nothing written, masks, dtypes, ids, threads, save/load round trips, and a buffer larger than 4 GiB.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "half.h"
#include "kernels/kernel.h"
#include "maxsim/maxsim.hpp"
#include "packed.h"
#include "reference_packer.h"
#include "test_util.h"

namespace maxsim::test {
namespace {

// A file name of this process in the test temp folder: ctest runs each test in its own process, and two
// checkouts (or CI jobs) may share /tmp, so a fixed name let one process truncate a file another had mapped
// (seen: SIGBUS in BufferLargerThan4GiB when two builds' suites ran at once).
std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/maxsim-" + std::to_string(getpid()) + "-" + name;
}

constexpr uint8_t kSentinel = 0xA5;

// Packs with the library into sentinel-filled memory; returns the written bytes.
std::vector<uint8_t> LibraryPack(const TokenSets& t, const uint64_t* ids, int threads) {
  Context ctx = CpuContext(threads);
  const DenseSets d = t.Dense();
  uint64_t size = 0;
  Check(maxsim_pack_size(d.get(), ids != nullptr, &size));
  AlignedBytes out(size + 128, kSentinel);
  uint64_t written = 0;
  Check(maxsim_pack_into(ctx.get(), d.get(), ids, out.data(), size, &written));
  EXPECT_EQ(written, size);
  for (size_t i = size; i < size + 128; ++i) {
    EXPECT_EQ(out.data()[i], kSentinel) << "packer wrote past the size it reported";
  }
  return std::vector<uint8_t>(out.data(), out.data() + size);
}

void ExpectSameBytes(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], want[i]) << what << ": first difference at byte " << i << " of " << got.size();
  }
}

TEST(Packer, MatchesReferencePackerByteForByte) {
  std::mt19937_64 rng(11);
  for (uint32_t dim : {1u, 7u, 48u, 64u, 96u, 128u, 200u, 768u}) {
    for (maxsim_dtype dtype : {MAXSIM_F32, MAXSIM_F16, MAXSIM_BF16}) {
      for (Shape shape : {Shape::kGaussian, Shape::kLargeNorm, Shape::kTinyNorm, Shape::kDuplicates}) {
        if (dtype == MAXSIM_F16 && shape == Shape::kLargeNorm) continue;  // beyond f16's range (65504)
        TokenSets t = Generate(rng, shape, 9, 0, dim > 200 ? 20 : 60, dim);
        t.Encode(dtype);
        std::vector<uint64_t> ids(t.n_sets());
        for (auto& id : ids) id = rng();
        const std::string what = "dim " + std::to_string(dim) + " dtype " + std::to_string(dtype) + " " + ShapeName(shape);
        ExpectSameBytes(LibraryPack(t, ids.data(), 1), ReferencePack(t, ids.data()), what + " (ids)");
        ExpectSameBytes(LibraryPack(t, nullptr, 1), ReferencePack(t, nullptr), what);
      }
    }
  }
}

// String ids (format 1.1): multi-byte UTF-8, spaces, long ids, empty sets; with and without numeric ids.
std::vector<std::string> SampleStringIds(uint64_t n) {
  const std::vector<std::string> pool = {"doc-0", "caf\xc3\xa9", "\xe6\x96\x87\xe6\xa1\xa3 7", "a b  c",
                                         "\xf0\x9f\x99\x82", std::string(300, 'x'), "9", "\"quoted\" \\ back"};
  std::vector<std::string> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = pool[i % pool.size()] + (i >= pool.size() ? "#" + std::to_string(i) : "");
  return v;
}

TEST(Packer, StringIdsMatchTheReferenceAndReadBack) {
  std::mt19937_64 rng(31);
  for (maxsim_dtype dtype : {MAXSIM_F32, MAXSIM_BF16}) {
    TokenSets t = Generate(rng, Shape::kGaussian, 11, 0, 20, 40);  // includes empty sets
    t.Encode(dtype);
    const std::vector<std::string> sids = SampleStringIds(t.n_sets());
    std::vector<uint64_t> ids(t.n_sets());
    for (auto& id : ids) id = rng();
    for (const uint64_t* numeric : {static_cast<const uint64_t*>(nullptr), static_cast<const uint64_t*>(ids.data())}) {
      Context ctx = CpuContext(2);
      Packed p = Packed::PackWithStringIds(ctx.get(), t.Dense(), sids, numeric);
      const maxsim_packed_desc d = p.Describe();
      const std::vector<uint8_t> got(static_cast<const uint8_t*>(d.data), static_cast<const uint8_t*>(d.data) + d.size);
      ExpectSameBytes(got, ReferencePack(t, numeric, &sids), numeric ? "string + numeric ids" : "string ids");
      EXPECT_EQ(d.has_ids, numeric ? 1 : 0);
      ASSERT_TRUE(p.HasStringIds());
      for (uint64_t i = 0; i < t.n_sets(); ++i) {
        const char* id = nullptr;
        size_t length = 0;
        ASSERT_EQ(maxsim_packed_string_id(p.get(), i, &id, &length), MAXSIM_OK);
        EXPECT_EQ(std::string(id), sids[i]) << "NUL-terminated in place";
        EXPECT_EQ(length, sids[i].size());
      }
      const std::string path = TempPath("strings.maxsim");
      p.Save(path);
      Packed loaded = Packed::Load(path, MAXSIM_VALIDATE_DEEP);
      for (uint64_t i = 0; i < t.n_sets(); ++i) EXPECT_EQ(loaded.StringId(i), sids[i]);
      std::remove(path.c_str());
      const char* id = reinterpret_cast<const char*>(1);
      EXPECT_EQ(maxsim_packed_string_id(p.get(), t.n_sets(), &id, nullptr), MAXSIM_ERR_INVALID_ARGUMENT);
      EXPECT_NE(std::string(maxsim_last_error()).find("out of range"), std::string::npos);
      EXPECT_EQ(maxsim_packed_string_id(p.get(), 0, nullptr, nullptr), MAXSIM_ERR_INVALID_ARGUMENT);
    }
    // Without string ids the getter answers NULL and the buffer stays format 1.0.
    Packed plain = Packed::Pack(nullptr, t.Dense());
    const char* id = "x";
    size_t length = 5;
    ASSERT_EQ(maxsim_packed_string_id(plain.get(), 0, &id, &length), MAXSIM_OK);
    EXPECT_EQ(id, nullptr);
    EXPECT_EQ(length, 0u);
    EXPECT_FALSE(plain.HasStringIds());
    const auto* h = static_cast<const maxsim_pack_header*>(plain.Describe().data);
    EXPECT_EQ(h->version_minor, 0u);
    EXPECT_EQ(h->region_count, 5u);
  }
}

TEST(Packer, BadStringIdsAreRefusedNamingTheId) {
  std::mt19937_64 rng(32);
  TokenSets t = Generate(rng, Shape::kGaussian, 5, 1, 4, 8);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"", "is empty"},
      {"a\tb", "tab"},
      {"a\nb", "line break"},
      {"a\r", "line break"},
      {"\xc0\x80", "not valid UTF-8"},          // overlong NUL
      {"\xe0\x80\xaf", "overlong"},              // overlong '/'
      {"\xed\xa0\x80", "surrogate"},
      {"\xf4\x90\x80\x80", "out-of-range"},      // above U+10FFFF
      {"abc\xe6\x96", "truncated"},
      {"\x80", "not valid UTF-8"},
      {"\xff", "not valid UTF-8"},
  };
  for (const auto& [id, message] : bad) {
    std::vector<std::string> sids = SampleStringIds(5);
    sids[3] = id;
    std::vector<const char*> p;
    for (const auto& s : sids) p.push_back(s.c_str());
    maxsim_packed* out = reinterpret_cast<maxsim_packed*>(1);
    EXPECT_EQ(maxsim_pack_with_string_ids(nullptr, t.Dense().get(), nullptr, p.data(), &out),
              MAXSIM_ERR_INVALID_ARGUMENT) << message;
    EXPECT_EQ(out, nullptr);
    const std::string msg = maxsim_last_error();
    EXPECT_NE(msg.find("string id 3"), std::string::npos) << msg;
    EXPECT_NE(msg.find(message), std::string::npos) << msg;
  }
  std::vector<const char*> with_null = {"a", "b", nullptr, "d", "e"};
  maxsim_packed* out = nullptr;
  EXPECT_EQ(maxsim_pack_with_string_ids(nullptr, t.Dense().get(), nullptr, with_null.data(), &out),
            MAXSIM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(maxsim_last_error()).find("string id 2 is NULL"), std::string::npos);
  EXPECT_EQ(maxsim_pack_with_string_ids(nullptr, t.Dense().get(), nullptr, nullptr, &out), MAXSIM_ERR_INVALID_ARGUMENT);
}

// tests/data/packed-v1.0.maxsim was written by the packer of format 1.0 (before string ids existed), from
// 5 vectors of dim 8 with element k of row r = ((8r + k) mod 7 - 3) / 4, offsets {0, 2, 2, 5} and numeric ids
// {7, 2^40, 3}. It still loads, and today's packer still writes exactly these bytes for that input.
TEST(PackedFile, AFormat10FileStillLoadsAndIsStillWhatThePackerWrites) {
  TokenSets t;
  t.dim = 8;
  t.offsets = {0, 2, 2, 5};
  for (int r = 0; r < 5; ++r) {
    for (int k = 0; k < 8; ++k) t.values.push_back(static_cast<float>(((8 * r + k) % 7) - 3) * 0.25f);
  }
  t.Encode(MAXSIM_F32);
  const uint64_t ids[3] = {7, 1ull << 40, 3};
  Packed old = Packed::Load(std::string(MAXSIM_SOURCE_DIR) + "/tests/data/packed-v1.0.maxsim", MAXSIM_VALIDATE_DEEP);
  const maxsim_packed_desc d = old.Describe();
  EXPECT_EQ(static_cast<const maxsim_pack_header*>(d.data)->version_minor, 0u);
  ASSERT_EQ(d.n_sets, 3u);
  ASSERT_TRUE(d.has_ids);
  EXPECT_EQ(d.ids[1], 1ull << 40);
  EXPECT_FALSE(old.HasStringIds());
  const std::vector<uint8_t> bytes(static_cast<const uint8_t*>(d.data), static_cast<const uint8_t*>(d.data) + d.size);
  ExpectSameBytes(LibraryPack(t, ids, 1), bytes, "format 1.0 file");
}

TEST(Packer, ThreadCountDoesNotChangeTheBytes) {
  std::mt19937_64 rng(12);
  TokenSets t = Generate(rng, Shape::kUnitGaussian, 300, 0, 40, 128);  // > 2 chunks of work
  const auto one = LibraryPack(t, nullptr, 1);
  ExpectSameBytes(LibraryPack(t, nullptr, 2), one, "2 threads");
  ExpectSameBytes(LibraryPack(t, nullptr, 5), one, "5 threads");
}

TEST(Packer, MaskedRowsAreDropped) {
  std::mt19937_64 rng(13);
  TokenSets t = Generate(rng, Shape::kGaussian, 12, 0, 30, 64);
  t.mask.resize(t.rows());
  for (auto& m : t.mask) m = (rng() % 3) != 0;
  ExpectSameBytes(LibraryPack(t, nullptr, 1), ReferencePack(t, nullptr), "masked");
  // The same as packing the compacted sets.
  TokenSets c;
  c.dim = t.dim;
  c.offsets.push_back(0);
  for (uint64_t i = 0; i < t.n_sets(); ++i) {
    for (uint64_t r = t.offsets[i]; r < t.offsets[i + 1]; ++r) {
      if (t.mask[r]) c.values.insert(c.values.end(), t.row(r), t.row(r) + t.dim);
    }
    c.offsets.push_back(c.values.size() / t.dim);
  }
  c.Encode(MAXSIM_F32);
  ExpectSameBytes(LibraryPack(t, nullptr, 1), LibraryPack(c, nullptr, 1), "masked vs compacted");
}

TEST(Packer, EveryHighwayTargetMatchesTheScalarDefinition) {
  std::mt19937_64 rng(14);
  std::normal_distribution<float> g(0.0f, 1.0f);
  ASSERT_FALSE(pack::RowOpsTargets().empty());
  for (int64_t t : pack::RowOpsTargets()) {
    const pack::RowOps ops = pack::RowOpsFor(t);
    const char* target = pack::RowOpsTargetName(t);
    ASSERT_EQ(ops.target, t) << target << ": a cap this CPU runs selects that target";
    for (uint32_t dim = 1; dim <= 300; dim += (dim < 40 ? 1 : 37)) {
      for (int trial = 0; trial < 6; ++trial) {
        std::vector<float> v(dim);
        const float scale = trial == 0 ? 0.0f : trial == 1 ? 1e-30f : trial == 2 ? 1e30f : trial == 3 ? 1e-42f : 1.0f;
        for (float& x : v) x = g(rng) * scale;
        if (trial == 5) v[rng() % dim] = 3.0e38f;  // one huge element
        const pack::RowStats ref = pack::AnalyzeRowRef(v.data(), dim);
        const pack::RowStats got = ops.analyze(v.data(), dim);
        ASSERT_EQ(got.finite, ref.finite);
        ASSERT_EQ(std::memcmp(&got.maxabs, &ref.maxabs, 4), 0) << target << " dim " << dim;
        ASSERT_EQ(std::memcmp(&got.norm_sq, &ref.norm_sq, 8), 0) << target << " dim " << dim;
        const uint32_t padded = (dim + 63) / 64 * 64;
        std::vector<int8_t> c_ref(padded, 5), c_got(padded, 7);
        maxsim_vector_meta m_ref, m_got;
        pack::QuantizeRowRef(v.data(), dim, padded, ref, c_ref.data(), &m_ref);
        ops.quantize(v.data(), dim, padded, got, c_got.data(), &m_got);
        ASSERT_EQ(c_got, c_ref) << target << " dim " << dim << " trial " << trial;
        ASSERT_EQ(std::memcmp(&m_got, &m_ref, sizeof(m_ref)), 0)
            << target << " dim " << dim << " trial " << trial;
        // Widening and the checksum loop too (exact conversions, integer sums): the same bits on every target.
        std::vector<uint16_t> half(dim);
        for (uint32_t k = 0; k < dim; ++k) half[k] = F32ToBf16(v[k]);
        std::vector<float> w_ref(dim), w_got(dim);
        pack::BestRowOps().widen(half.data(), MAXSIM_BF16, dim, w_ref.data());
        ops.widen(half.data(), MAXSIM_BF16, dim, w_got.data());
        ASSERT_EQ(std::memcmp(w_ref.data(), w_got.data(), 4 * dim), 0) << target << " dim " << dim;
        ASSERT_EQ(pack::Checksum64(c_got.data(), padded, ops), pack::Checksum64(c_got.data(), padded))
            << target << " dim " << dim;
      }
    }
  }
}

// Packing runs on the widest Highway target the context's kernel allows (MAXSIM_ISA=avx2 on an AVX-512 machine
// keeps AVX-512 out of packing too), says so in the report, and every kernel's context packs the same bytes.
TEST(Packer, PackingFollowsTheKernelsTargetAndPacksTheSameBytes) {
  std::mt19937_64 rng(16);
  TokenSets t = Generate(rng, Shape::kClustered, 12, 1, 40, 96);
  t.Encode(MAXSIM_BF16);
  const DenseSets d = t.Dense();
  std::vector<uint8_t> first;
  std::string first_kernel;
  for (size_t i = 0; i < maxsim_kernel_count(); ++i) {
    if (!maxsim_kernel_available(i, nullptr)) continue;
    const std::string kernel = maxsim_kernel_name(i);
    maxsim_options o;
    maxsim_options_init(&o);
    o.isa = kernel.c_str();
    o.load_plugins = 0;
    Context ctx(o);
    size_t n = 0;
    const KernelInfo* list = KernelList(&n);
    const pack::RowOps want = pack::RowOpsFor(PackingTargetCap(list[i]));
    const std::string report = ctx.Report();
    const std::string line = std::string("Packing: Highway ") + pack::RowOpsTargetName(want.target) + " ";
    EXPECT_NE(report.find(line), std::string::npos) << kernel << "\n" << report;
    if (kernel == "avx2" || kernel == "avx-vnni" || kernel == "autovec-avx2" || kernel == "scalar") {
      EXPECT_EQ(report.find("Packing: Highway AVX3"), std::string::npos) << kernel << " packs with AVX-512";
    }
    if (kernel == "scalar") {  // the narrowest target compiled: scalar on x86-64, NEON (the baseline) on AArch64
      EXPECT_EQ(want.target, pack::RowOpsTargets().back()) << pack::RowOpsTargetName(want.target);
    }
    Packed p = Packed::Pack(ctx, d);
    maxsim_packed_desc desc{};
    Check(maxsim_packed_describe(p.get(), &desc));
    const auto* bytes = static_cast<const uint8_t*>(desc.data);
    std::vector<uint8_t> got(bytes, bytes + desc.size);
    if (first.empty()) {
      first = got;
      first_kernel = kernel;
    } else {
      ExpectSameBytes(got, first, kernel + " vs " + first_kernel);
    }
  }
  // Without a context (validate, open, load) MAXSIM_ISA picks the target; a name that is no kernel is refused.
  Context any = CpuContext(1);
  Packed p = Packed::Pack(any, d);
  maxsim_packed_desc desc{};
  Check(maxsim_packed_describe(p.get(), &desc));
  setenv("MAXSIM_ISA", "scalar", 1);
  EXPECT_EQ(maxsim_validate(desc.data, desc.size, MAXSIM_VALIDATE_DEEP), MAXSIM_OK) << maxsim_last_error();
  setenv("MAXSIM_ISA", "avx9", 1);
  EXPECT_EQ(maxsim_validate(desc.data, desc.size, MAXSIM_VALIDATE_STANDARD), MAXSIM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(maxsim_last_error()).find("'avx9' (set by MAXSIM_ISA=avx9) is not a CPU kernel name"),
            std::string::npos) << maxsim_last_error();
  unsetenv("MAXSIM_ISA");
}

// The compare-only acceptance test of dense scoring (RowOps::rows_within with pack::AcceptedElementBound): on every
// Highway target, a row it passes is accepted by the canonical AnalyzeRowRef (finite, norm <= 1e19), it fails
// every non-finite row, and it agrees with the element-wise definition, at and around the bound.
TEST(Packer, ElementBoundIsASufficientAcceptanceTest) {
  std::mt19937_64 rng(16);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (int64_t t : pack::RowOpsTargets()) {
    const pack::RowOps ops = pack::RowOpsFor(t);
    const char* target = pack::RowOpsTargetName(t);
    for (uint32_t dim : {1u, 2u, 7u, 15u, 16u, 17u, 31u, 32u, 33u, 64u, 96u, 128u, 129u, 300u, 1000u}) {
      const float b = pack::AcceptedElementBound(dim);
      ASSERT_GT(b, 0.0f);
      // A bound far from tight would send ordinary rows down the slow path: within 1% of 1e19 / sqrt(dim).
      ASSERT_GT(static_cast<double>(b), 0.99 * MAXSIM_PACK_MAX_NORM / std::sqrt(static_cast<double>(dim)));
      for (int trial = 0; trial < 12; ++trial) {
        const uint32_t rows = 1 + static_cast<uint32_t>(rng() % 5);
        const uint32_t stride = dim + static_cast<uint32_t>(rng() % 3);  // padded rows too
        std::vector<float> v(static_cast<size_t>(rows) * stride, 1e38f);  // padding: never read
        for (uint32_t r = 0; r < rows; ++r) {
          for (uint32_t k = 0; k < dim; ++k) {
            float x = g(rng);
            switch (trial % 6) {
              case 0: break;
              case 1: x = std::copysign(b, x); break;                                   // every element at the bound
              case 2: x = std::copysign(std::nextafter(b, 1e38f), x) * (k == 0); break;  // one just above
              case 3: x = (k == dim - 1) ? std::numeric_limits<float>::quiet_NaN() : x; break;
              case 4: x = (k == dim / 2) ? -std::numeric_limits<float>::infinity() : x; break;
              default: x *= b * 0.5f; break;
            }
            v[static_cast<size_t>(r) * stride + k] = x;
          }
        }
        const uint32_t bad_row = static_cast<uint32_t>(rng() % rows);
        for (uint32_t r = 0; r < rows; ++r) {  // only one row gets the trial's special values
          if (r != bad_row && trial % 6 != 0 && trial % 6 != 5) {
            for (uint32_t k = 0; k < dim; ++k) v[static_cast<size_t>(r) * stride + k] = g(rng);
          }
        }
        bool within = true, accepted = true;
        for (uint32_t r = 0; r < rows; ++r) {
          const float* row = v.data() + static_cast<size_t>(r) * stride;
          for (uint32_t k = 0; k < dim; ++k) within &= std::fabs(row[k]) <= b;
          const pack::RowStats st = pack::AnalyzeRowRef(row, dim);
          accepted &= st.finite && pack::NormAccepted(st.norm_sq);
        }
        const bool got =
            ops.rows_within(reinterpret_cast<const uint8_t*>(v.data()), rows, stride * sizeof(float), dim, b);
        ASSERT_EQ(got, within) << target << " dim " << dim << " trial " << trial;
        if (got) ASSERT_TRUE(accepted) << target << " dim " << dim << " trial " << trial;
      }
    }
  }
}

TEST(Packer, QuantisationInvariantsHold) {
  std::mt19937_64 rng(15);
  TokenSets t = Generate(rng, Shape::kGaussian, 20, 1, 30, 100);
  const auto bytes = LibraryPack(t, nullptr, 1);
  AlignedBytes buf(bytes);
  pack::PackedView v;
  ASSERT_TRUE(pack::Validate(buf.data(), buf.size(), MAXSIM_VALIDATE_DEEP, &v).ok());
  for (uint64_t r = 0; r < v.n_vectors; ++r) {
    const float* x = t.row(r);
    const maxsim_vector_meta& m = v.meta[r];
    double resid = 0, norm = 0, maxabs = 0;
    int32_t sum = 0;
    for (uint32_t k = 0; k < v.dim; ++k) {
      const int8_t c = v.codes[r * v.padded_dim + k];
      ASSERT_GE(c, -127);
      sum += c;
      const double e = x[k] - static_cast<double>(m.scale) * c;
      resid += e * e;
      norm += static_cast<double>(x[k]) * x[k];
      maxabs = std::max(maxabs, std::fabs(static_cast<double>(x[k])));
    }
    EXPECT_EQ(sum, m.code_sum);
    EXPECT_GE(static_cast<double>(m.resid_norm), std::sqrt(resid)) << "resid_norm must be an upper bound";
    EXPECT_NEAR(m.norm, std::sqrt(norm), 1e-6 * std::sqrt(norm));
    EXPECT_NEAR(m.scale, maxabs / 127.0, 1e-6 * maxabs);
    // The largest element quantises to +-127: the range is fully used.
    int max_code = 0;
    for (uint32_t k = 0; k < v.dim; ++k) max_code = std::max(max_code, std::abs(int{v.codes[r * v.padded_dim + k]}));
    EXPECT_EQ(max_code, 127);
  }
}

TEST(Packer, ZeroVectorsHaveZeroScaleAndScoreZero) {
  TokenSets t;
  t.dim = 16;
  t.values.assign(3 * 16, 0.0f);
  t.values[16 + 3] = 1.0f;  // the middle vector is not zero
  t.offsets = {0, 3};
  t.Encode(MAXSIM_F32);
  const auto bytes = LibraryPack(t, nullptr, 1);
  ExpectSameBytes(bytes, ReferencePack(t, nullptr), "zeros");
  AlignedBytes buf(bytes);
  pack::PackedView v;
  ASSERT_TRUE(pack::Validate(buf.data(), buf.size(), MAXSIM_VALIDATE_DEEP, &v).ok());
  EXPECT_EQ(v.meta[0].scale, 0.0f);
  EXPECT_EQ(v.meta[0].norm, 0.0f);
  EXPECT_EQ(v.meta[0].resid_norm, 0.0f);
  for (uint32_t k = 0; k < 64; ++k) EXPECT_EQ(v.codes[k], 0);
  // Cosine with a zero vector is 0 by definition; dot is 0.
  Context ctx = CpuContext(1);
  Packed p = Packed::Open(buf.data(), buf.size());
  for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
    for (maxsim_mode mode : {MAXSIM_MODE_EXACT, MAXSIM_MODE_CERTIFIED}) {
      float score = -1;
      int32_t arg[3];
      ScoreOptions o{metric, mode};
      ctx.ScoreMatrix(p, p, Span<float>(&score, 1), o, arg);
      EXPECT_EQ(score, metric == MAXSIM_METRIC_DOT ? 1.0f : 1.0f);  // each token's best: 0, 1, 0 (dot) / 0, 1, 0
      EXPECT_EQ(arg[0], 0);  // all zero: ties, lowest index
      EXPECT_EQ(arg[1], 1);
      EXPECT_EQ(arg[2], 0);
    }
  }
}

TEST(Packer, RejectsNonFiniteValuesAndWritesNothing) {
  std::mt19937_64 rng(16);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    for (maxsim_dtype dtype : {MAXSIM_F32, MAXSIM_F16, MAXSIM_BF16}) {
      TokenSets t = Generate(rng, Shape::kGaussian, 6, 8, 8, 32);
      t.values[(t.offsets[2] + 5) * 32 + 7] = bad;  // set 2, token 5, element 7
      t.values[(t.offsets[4] + 1) * 32 + 0] = bad;  // a later one must not be the one reported
      t.Encode(dtype);
      const DenseSets d = t.Dense();
      uint64_t size = 0;
      Check(maxsim_pack_size(d.get(), 0, &size));
      AlignedBytes out(size, kSentinel);
      uint64_t written = 0;
      EXPECT_EQ(maxsim_pack_into(nullptr, d.get(), nullptr, out.data(), size, &written), MAXSIM_ERR_NON_FINITE);
      const std::string msg = maxsim_last_error();
      EXPECT_NE(msg.find("set 2 token 5"), std::string::npos) << msg;
      EXPECT_NE(msg.find("element 7"), std::string::npos) << msg;
      for (size_t i = 0; i < size; ++i) ASSERT_EQ(out.data()[i], kSentinel) << "byte " << i << " was written";
      maxsim_packed* p = nullptr;
      EXPECT_EQ(maxsim_pack(nullptr, d.get(), nullptr, &p), MAXSIM_ERR_NON_FINITE);
      EXPECT_EQ(p, nullptr);
    }
  }
}

TEST(Packer, RejectsNormsAboveTheOverflowLimit) {
  TokenSets t;
  t.dim = 4;
  t.values = {1, 2, 3, 4, 2e19f, 0, 0, 0, 1, 1, 1, 1};
  t.offsets = {0, 1, 3};
  t.Encode(MAXSIM_F32);
  const DenseSets d = t.Dense();
  maxsim_packed* p = nullptr;
  EXPECT_EQ(maxsim_pack(nullptr, d.get(), nullptr, &p), MAXSIM_ERR_NON_FINITE);
  const std::string msg = maxsim_last_error();
  EXPECT_NE(msg.find("set 1 token 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("norm"), std::string::npos) << msg;
  t.values[4] = 9e18f;  // below the limit: accepted
  t.Encode(MAXSIM_F32);
  const DenseSets ok = t.Dense();
  EXPECT_EQ(maxsim_pack(nullptr, ok.get(), nullptr, &p), MAXSIM_OK) << maxsim_last_error();
  maxsim_packed_release(p);
}

TEST(Packer, ChecksArgumentsAndCapacity) {
  std::mt19937_64 rng(17);
  TokenSets t = Generate(rng, Shape::kGaussian, 3, 1, 4, 8);
  DenseSets d = t.Dense();
  uint64_t size = 0;
  Check(maxsim_pack_size(d.get(), 0, &size));
  AlignedBytes out(size);
  uint64_t needed = 0;
  EXPECT_EQ(maxsim_pack_into(nullptr, d.get(), nullptr, out.data(), size - 1, &needed), MAXSIM_ERR_BUFFER_TOO_SMALL);
  EXPECT_EQ(needed, size);
  EXPECT_EQ(maxsim_pack_into(nullptr, d.get(), nullptr, out.data() + 8, size, nullptr), MAXSIM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(maxsim_last_error()).find("aligned"), std::string::npos);
  EXPECT_EQ(maxsim_pack_into(nullptr, nullptr, nullptr, out.data(), size, nullptr), MAXSIM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(maxsim_pack_into(nullptr, d.get(), nullptr, nullptr, size, nullptr), MAXSIM_ERR_INVALID_ARGUMENT);
  maxsim_dense_sets bad = *d.get();
  bad.dtype = static_cast<maxsim_dtype>(9);
  EXPECT_EQ(maxsim_pack_size(&bad, 0, &size), MAXSIM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(maxsim_last_error()).find("dtype"), std::string::npos);
  bad = *d.get();
  bad.dim = 0;
  EXPECT_EQ(maxsim_pack_size(&bad, 0, &size), MAXSIM_ERR_INVALID_ARGUMENT);
  bad = *d.get();
  bad.struct_size = 4;
  EXPECT_EQ(maxsim_pack_size(&bad, 0, &size), MAXSIM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(maxsim_last_error()).find("struct_size"), std::string::npos);
  std::vector<uint64_t> decreasing = {0, 3, 2, 5};
  bad = *d.get();
  bad.offsets = decreasing.data();
  EXPECT_EQ(maxsim_pack_size(&bad, 0, &size), MAXSIM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(maxsim_last_error()).find("decrease"), std::string::npos);
}

TEST(PackedFile, SaveLoadRoundTripIsZeroCopyAndExact) {
  std::mt19937_64 rng(18);
  TokenSets t = Generate(rng, Shape::kUnitGaussian, 25, 0, 50, 128);
  std::vector<uint64_t> ids(t.n_sets());
  for (uint64_t i = 0; i < ids.size(); ++i) ids[i] = 1000 + 7 * i;
  Context ctx = CpuContext(2);
  Packed p = Packed::Pack(ctx, t.Dense(), ids.data());
  const std::string path = TempPath("roundtrip.maxsim");
  p.Save(path);
  Packed loaded = Packed::Load(path, MAXSIM_VALIDATE_DEEP);
  const maxsim_packed_desc a = p.Describe(), b = loaded.Describe();
  ASSERT_EQ(a.size, b.size);
  EXPECT_EQ(std::memcmp(a.data, b.data, a.size), 0);
  EXPECT_EQ(b.n_sets, t.n_sets());
  EXPECT_EQ(b.n_vectors, t.rows());
  EXPECT_EQ(b.dim, 128u);
  EXPECT_EQ(b.has_ids, 1);
  for (uint64_t i = 0; i < ids.size(); ++i) EXPECT_EQ(b.ids[i], ids[i]);
  TokenSets q = Generate(rng, Shape::kUnitGaussian, 2, 32, 32, 128);
  const auto s1 = ctx.ScoreMatrix(q.Dense(), 2, p, t.n_sets());
  const auto s2 = ctx.ScoreMatrix(q.Dense(), 2, loaded, t.n_sets());
  EXPECT_EQ(std::memcmp(s1.data(), s2.data(), s1.size() * 4), 0);
  // Top-k returns the ids stored in the file.
  const TopKResult top = ctx.TopK(q.Dense(), 2, loaded, 5, {}, true);
  for (size_t r = 0; r < top.index.size(); ++r) EXPECT_EQ(top.ids[r], ids[top.index[r]]);
  std::remove(path.c_str());
}

TEST(PackedFile, LoadErrorsAreClear) {
  maxsim_packed* p = nullptr;
  EXPECT_EQ(maxsim_packed_load("/nonexistent/x.maxsim", MAXSIM_VALIDATE_STANDARD, &p), MAXSIM_ERR_IO);
  EXPECT_NE(std::string(maxsim_last_error()).find("/nonexistent/x.maxsim"), std::string::npos);
  EXPECT_EQ(maxsim_packed_load(::testing::TempDir().c_str(), MAXSIM_VALIDATE_STANDARD, &p), MAXSIM_ERR_IO);
  const std::string empty = TempPath("empty.maxsim");
  { FILE* f = std::fopen(empty.c_str(), "wb"); std::fclose(f); }
  EXPECT_EQ(maxsim_packed_load(empty.c_str(), MAXSIM_VALIDATE_STANDARD, &p), MAXSIM_ERR_INVALID_BUFFER);
  EXPECT_NE(std::string(maxsim_last_error()).find("smaller than the 256-byte header"), std::string::npos);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(maxsim_packed_load(nullptr, MAXSIM_VALIDATE_STANDARD, &p), MAXSIM_ERR_INVALID_ARGUMENT);
  std::remove(empty.c_str());
  // Saving into a folder that does not exist leaves nothing behind and says why.
  std::mt19937_64 rng(19);
  TokenSets t = Generate(rng, Shape::kGaussian, 2, 1, 3, 8);
  Packed ok = Packed::Pack(nullptr, t.Dense());
  EXPECT_EQ(maxsim_packed_save(ok.get(), "/nonexistent-dir/x.maxsim"), MAXSIM_ERR_IO);
  EXPECT_NE(std::string(maxsim_last_error()).find("/nonexistent-dir/x.maxsim"), std::string::npos);
}

// A real buffer larger than 4 GiB: a sparse file of 13 M zero vectors (dim 64, f32) whose very last vector,
// beyond the 4 GiB mark in every region that scales with it, is a known non-zero vector. Loading validates all
// of it (STANDARD), and scoring must find that last vector.
TEST(PackedFile, BufferLargerThan4GiB) {
  if (sizeof(void*) < 8) GTEST_SKIP() << "a 32-bit address space (wasm32) cannot hold a 4 GiB buffer";
  const uint32_t dim = 64;
  const uint64_t n = 13'000'000;
  pack::Layout l;
  ASSERT_TRUE(pack::ComputeLayout(dim, MAXSIM_F32, n, 2, false, &l).ok());
  ASSERT_GT(l.total_size, 4ull << 30);
  ASSERT_GT(l.regions[MAXSIM_REGION_ORIGINALS].offset + (n - 1) * l.orig_row_bytes, 4ull << 30);
  const std::string path = TempPath("large.maxsim");
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  if (ftruncate(fd, static_cast<off_t>(l.total_size)) != 0) {
    close(fd);
    GTEST_SKIP() << "cannot create a sparse file of " << l.total_size << " bytes here";
  }
  std::vector<float> last(dim);
  for (uint32_t k = 0; k < dim; ++k) last[k] = 0.25f * static_cast<float>(k % 5) - 0.5f;
  const pack::RowStats st = pack::AnalyzeRowRef(last.data(), dim);
  std::vector<int8_t> codes(l.padded_dim);
  maxsim_vector_meta meta;
  pack::QuantizeRowRef(last.data(), dim, l.padded_dim, st, codes.data(), &meta);
  auto pwrite_all = [&](const void* p, size_t size, uint64_t at) {
    ASSERT_EQ(pwrite(fd, p, size, static_cast<off_t>(at)), static_cast<ssize_t>(size));
  };
  pwrite_all(codes.data(), codes.size(), l.regions[MAXSIM_REGION_CODES].offset + (n - 1) * l.padded_dim);
  pwrite_all(&meta, sizeof(meta), l.regions[MAXSIM_REGION_META].offset + (n - 1) * sizeof(meta));
  pwrite_all(last.data(), dim * 4, l.regions[MAXSIM_REGION_ORIGINALS].offset + (n - 1) * l.orig_row_bytes);
  const uint64_t offsets[3] = {0, 1, n};
  pwrite_all(offsets, sizeof(offsets), l.regions[MAXSIM_REGION_OFFSETS].offset);
  maxsim_pack_header h{};
  std::memcpy(h.magic, MAXSIM_PACK_MAGIC, 8);
  h.version_major = 1;
  h.endian_tag = MAXSIM_PACK_ENDIAN_TAG;
  h.header_size = 256;
  h.layout = 1;
  h.orig_dtype = MAXSIM_F32;
  h.region_count = 5;
  h.quant_range = 127;
  h.dim = dim;
  h.padded_dim = l.padded_dim;
  h.orig_row_bytes = l.orig_row_bytes;
  h.meta_record_bytes = 16;
  h.n_vectors = n;
  h.n_sets = 2;
  h.total_size = l.total_size;
  for (int r = 0; r < MAXSIM_REGION_COUNT; ++r) h.regions[r] = l.regions[r];
  void* map = mmap(nullptr, l.total_size, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(map, MAP_FAILED);
  h.payload_checksum = pack::Checksum64(static_cast<uint8_t*>(map) + 256, l.total_size - 256);
  munmap(map, l.total_size);
  h.header_checksum = pack::Checksum64(&h, offsetof(maxsim_pack_header, header_checksum));
  pwrite_all(&h, sizeof(h), 0);
  close(fd);

  Packed corpus = Packed::Load(path);
  EXPECT_EQ(corpus.Describe().size, l.total_size);
  std::vector<float> q(2 * dim, 0.0f);
  for (uint32_t k = 0; k < dim; ++k) q[k] = last[k];  // query token 0 = the last vector; token 1 = zero
  const uint64_t qoff[2] = {0, 2};
  Context ctx = CpuContext(2);
  std::vector<int32_t> argmax(4);
  const auto scores = ctx.ScoreMatrix(DenseSets(q.data(), dim, Span<const uint64_t>(qoff, 2)), 1, corpus, 2, {},
                                      argmax.data());
  double self = 0;
  for (float x : last) self += static_cast<double>(x) * x;
  EXPECT_EQ(scores[0], 0.0f);                       // set 0: a single zero vector
  EXPECT_FLOAT_EQ(scores[1], static_cast<float>(self));  // set 1: finds its last token
  EXPECT_EQ(argmax[2], static_cast<int32_t>(n - 2));  // set 1 token n-2 = the last vector
  std::remove(path.c_str());
}

}  // namespace
}  // namespace maxsim::test
