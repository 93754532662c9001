// SPDX-License-Identifier: Apache-2.0
// Cross-ISA bit identity: packed files committed in tests/data/cross-isa/ (written on x86-64 by
// scripts/make-cross-isa-data.sh) must, on the machine running this test (x86-64, AArch64 under qemu, ...):
//   - be byte-identical to what this machine packs from the same token values (so a buffer packed here scores
//     the same elsewhere: the reverse direction), and
//   - score, with every kernel this machine runs, in exact, certified and approximate mode, dot and cosine,
//     exactly the score bits and argmax the committed expected.txt holds.
// The token values come from integer arithmetic only (a 64-bit LCG, values k / 2^14 times a power of two), so
// every machine generates the same floats without relying on libm or <random> distributions. Documents include
// duplicated tokens (ties: the lowest index wins), a zero vector, huge and tiny norms, and ragged lengths.
#include <gtest/gtest.h>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "maxsim/maxsim.hpp"
#include "test_util.h"

namespace maxsim::test {
namespace {

struct Lcg {
  uint64_t s;
  uint32_t Next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(s >> 33);
  }
};

// n sets with lengths from `lengths` (cycled), values (k - 8192) / 2^14 * 2^e, k uniform in [0, 16384).
TokenSets MakeSets(uint64_t seed, uint32_t dim, std::vector<uint32_t> lengths, size_t n, maxsim_dtype dtype,
                   bool adversarial) {
  Lcg g{seed};
  TokenSets t;
  t.dim = dim;
  t.offsets.push_back(0);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t len = lengths[i % lengths.size()];
    // Per set a scale 2^e: huge (2^40) and tiny (2^-40) norms in two adversarial sets.
    const int e = adversarial && i == 3 ? 40 : adversarial && i == 5 ? -40 : 0;
    for (uint32_t r = 0; r < len; ++r) {
      if (adversarial && i == 1 && r == 2) {
        t.values.resize(t.values.size() + dim, 0.0f);  // a zero vector
        continue;
      }
      if (adversarial && i == 2 && r % 3 == 2) {  // duplicated tokens: ties
        const std::vector<float> prev(t.values.end() - dim, t.values.end());
        t.values.insert(t.values.end(), prev.begin(), prev.end());
        continue;
      }
      for (uint32_t k = 0; k < dim; ++k) {
        const int32_t v = static_cast<int32_t>(g.Next() % 16384) - 8192;
        t.values.push_back(std::ldexp(static_cast<float>(v), e - 14));
      }
    }
    t.offsets.push_back(t.values.size() / dim);
  }
  t.Encode(dtype);
  return t;
}

struct Case {
  const char* name;
  uint32_t dim;
  maxsim_dtype corpus_dtype, query_dtype;
};
// Odd dims take every kernel's tails; 128 its main loops.
const Case kCases[] = {{"f32-d72", 72, MAXSIM_F32, MAXSIM_F32}, {"bf16-d128", 128, MAXSIM_BF16, MAXSIM_F16}};

TokenSets Corpus(const Case& c) { return MakeSets(1000 + c.dim, c.dim, {1, 7, 12, 19, 33, 4, 25, 9}, 12, c.corpus_dtype, true); }
TokenSets Queries(const Case& c) { return MakeSets(2000 + c.dim, c.dim, {5, 32, 17, 40}, 4, c.query_dtype, false); }

std::string DataDir() { return std::string(MAXSIM_SOURCE_DIR) + "/tests/data/cross-isa"; }

std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// One line: "<case> <metric> <mode>: <score bits hex>... | <argmax>...".
std::string ScoreLine(Context& ctx, const Case& c, const Packed& q, const Packed& d, maxsim_metric metric,
                      maxsim_mode mode) {
  const maxsim_packed_desc qd = q.Describe(), dd = d.Describe();
  std::vector<int32_t> am(dd.n_sets * qd.n_vectors);
  const std::vector<float> s = ctx.ScoreMatrix(q, qd.n_sets, d, dd.n_sets, ScoreOptions{metric, mode}, am.data());
  std::ostringstream o;
  o << c.name << (metric == MAXSIM_METRIC_DOT ? " dot " : " cosine ")
    << (mode == MAXSIM_MODE_EXACT ? "exact" : mode == MAXSIM_MODE_CERTIFIED ? "certified" : "approximate") << ":";
  for (float v : s) {
    uint32_t b;
    std::memcpy(&b, &v, 4);
    char hex[16];
    std::snprintf(hex, sizeof(hex), " %08" PRIx32, b);
    o << hex;
  }
  o << " |";
  for (int32_t a : am) o << ' ' << a;
  return o.str();
}

const maxsim_metric kMetrics[] = {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE};
const maxsim_mode kModes[] = {MAXSIM_MODE_EXACT, MAXSIM_MODE_CERTIFIED, MAXSIM_MODE_APPROXIMATE};

// MAXSIM_WRITE_CROSS_ISA_DATA=1 (scripts/make-cross-isa-data.sh): writes the packed files and expected.txt
// instead of checking them.
TEST(CrossIsa, PackedFilesFromAnotherIsaPackAndScoreBitIdentically) {
  const bool write = std::getenv("MAXSIM_WRITE_CROSS_ISA_DATA") != nullptr;
  Context ctx = CpuContext(2);
  std::vector<std::string> expected;
  if (!write) {
    std::ifstream f(DataDir() + "/expected.txt");
    ASSERT_TRUE(f.good()) << DataDir() << "/expected.txt is missing (scripts/make-cross-isa-data.sh writes it)";
    for (std::string line; std::getline(f, line);) {
      if (!line.empty() && line[0] != '#') expected.push_back(line);
    }
  }
  std::vector<std::string> written;
  for (const Case& c : kCases) {
    const TokenSets corpus = Corpus(c), queries = Queries(c);
    const Packed dp = Packed::Pack(ctx, corpus.Dense()), qp = Packed::Pack(ctx, queries.Dense());
    const std::string dpath = DataDir() + "/" + c.name + "-corpus.maxsim";
    const std::string qpath = DataDir() + "/" + c.name + "-queries.maxsim";
    if (write) {
      dp.Save(dpath);
      qp.Save(qpath);
      for (maxsim_metric metric : kMetrics) {
        for (maxsim_mode mode : kModes) written.push_back(ScoreLine(ctx, c, qp, dp, metric, mode));
      }
      continue;
    }
    // This machine packs the same bytes as the committed files.
    for (const auto& [path, mine] : {std::pair{dpath, &dp}, std::pair{qpath, &qp}}) {
      const std::vector<uint8_t> file = ReadBytes(path);
      const maxsim_packed_desc desc = mine->Describe();
      ASSERT_EQ(file.size(), desc.size) << path;
      EXPECT_EQ(0, std::memcmp(file.data(), desc.data, file.size())) << path << ": packed bytes differ";
    }
    // The committed files score the committed bits with every kernel this machine runs.
    const Packed d = Packed::Load(dpath), q = Packed::Load(qpath);
    for (size_t k = 0; k < maxsim_kernel_count(); ++k) {
      if (!maxsim_kernel_available(k, nullptr)) continue;
      Context kctx = CpuContext(2, maxsim_kernel_name(k));
      size_t line = 0;
      for (const Case& before : kCases) {
        if (&before == &c) break;
        line += 6;
      }
      for (maxsim_metric metric : kMetrics) {
        for (maxsim_mode mode : kModes) {
          ASSERT_LT(line, expected.size());
          EXPECT_EQ(expected[line], ScoreLine(kctx, c, q, d, metric, mode)) << "kernel " << maxsim_kernel_name(k);
          ++line;
        }
      }
    }
  }
  if (write) {
    std::ofstream f(DataDir() + "/expected.txt");
    f << "# Score bits (hex f32, row-major [queries, documents]) | argmax, per case, metric and mode:\n"
      << "# written by scripts/make-cross-isa-data.sh; checked by tests/cross_isa_test.cc\n";
    for (const std::string& l : written) f << l << '\n';
    ASSERT_TRUE(f.good());
  }
}

}  // namespace
}  // namespace maxsim::test
