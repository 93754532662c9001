// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: bytes as a packed buffer, with a structure-aware mutator and an oracle.
//
// Input: one control byte, then the buffer. Control bit 0 set: the checksums are recomputed before validation,
// so that mutations reach the field checks and the kernels behind the checksum. The custom mutator
// (LLVMFuzzerCustomMutator) either mutates bytes generically or, half of the time, picks a field of a parsed
// buffer (a header field, an offset, a metadata record, a code, an original in its own dtype) and plants a
// hostile value there (extremes, NaN/inf, dtype maxima, off-by-one), then reseals both checksums.
//
// Oracle, for every buffer the validator accepts:
//   STANDARD: every score is finite, or -inf exactly for an empty document, in every mode and metric; certified
//             equals exact bit for bit (scores and argmax), or is refused with MAXSIM_ERR_INVALID_BUFFER exactly
//             when DEEP validation refuses the buffer (the trust model: trust.cc); top-k never ranks a NaN.
//   DEEP:     certified equals exact bit for bit.
//   FAST:     (a trusted buffer that may lie) every call returns; sanitizers see no undefined behaviour.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "maxsim/maxsim.h"
#include "maxsim/packed_format.h"
#include "packed.h"

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace {

maxsim_context* Context() {
  static maxsim_context* ctx = [] {
    maxsim_options o;
    maxsim_options_init(&o);
    o.num_threads = 1;
    o.load_plugins = 0;
    maxsim_context* c = nullptr;
    if (maxsim_context_create(&o, &c) != MAXSIM_OK) std::abort();
    return c;
  }();
  return ctx;
}

void Reseal(uint8_t* b, size_t n) {
  if (n < MAXSIM_PACK_HEADER_SIZE) return;
  const uint64_t payload = maxsim::pack::Checksum64(b + MAXSIM_PACK_HEADER_SIZE, n - MAXSIM_PACK_HEADER_SIZE);
  std::memcpy(b + offsetof(maxsim_pack_header, payload_checksum), &payload, 8);
  const uint64_t header = maxsim::pack::Checksum64(b, offsetof(maxsim_pack_header, header_checksum));
  std::memcpy(b + offsetof(maxsim_pack_header, header_checksum), &header, 8);
}

uint64_t Next(uint64_t& s) {  // splitmix64
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Hostile values of each kind of field.
const uint32_t kF32Bits[] = {0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x00000001u,
                             0x80000000u, 0x00000000u, 0x5f000000u /* 9.2e18 */, 0x5f800000u /* 1.8e19 */,
                             0x3f800000u, 0x00800000u};
const uint16_t kF16Bits[] = {0x7bff, 0xfbff, 0x7c00, 0x7e00, 0x0001, 0x8000, 0x3c00, 0x0400};
const uint16_t kBf16Bits[] = {0x7f7f, 0xff7f, 0x7f80, 0x7fc0, 0x0001, 0x8000, 0x5f80, 0x3f80, 0x0080};
const int32_t kI32[] = {INT32_MAX, INT32_MIN, -1, 0, 1, 127, -127, 127 * 64, -127 * 64};
const int8_t kCodes[] = {-128, -127, 127, 0, 1, -1};
const uint64_t kU64[] = {0, 1, UINT64_MAX, UINT64_MAX / 2, 1ull << 32, 0xFFFFFFFFull};

template <typename T, size_t N>
T Pick(const T (&values)[N], uint64_t& s) {
  return values[Next(s) % N];
}

// Plants one hostile value in a field of a buffer that parses at FAST (header checksums aside), then reseals.
// Returns false if the buffer does not parse far enough to know its fields.
bool MutateField(uint8_t* b, size_t n, uint64_t seed) {
  if (n < MAXSIM_PACK_HEADER_SIZE) return false;
  Reseal(b, n);
  maxsim::pack::PackedView v;
  if (!maxsim::pack::Validate(b, n, MAXSIM_VALIDATE_FAST, &v).ok()) return false;
  uint64_t s = seed;
  const uint64_t r = v.n_vectors ? Next(s) % v.n_vectors : 0;
  const uint32_t k = static_cast<uint32_t>(Next(s) % v.dim);
  auto* meta = const_cast<maxsim_vector_meta*>(v.meta);
  switch (Next(s) % 8) {
    case 0: {  // an original element, in its dtype
      if (!v.n_vectors) return false;
      uint8_t* row = const_cast<uint8_t*>(v.originals) + r * v.orig_row_bytes;
      if (v.dtype == MAXSIM_F32) {
        const uint32_t bits = Pick(kF32Bits, s);
        std::memcpy(row + 4 * k, &bits, 4);
      } else {
        const uint16_t bits = v.dtype == MAXSIM_F16 ? Pick(kF16Bits, s) : Pick(kBf16Bits, s);
        std::memcpy(row + 2 * k, &bits, 2);
      }
      break;
    }
    case 1: case 2: {  // a metadata float (scale, norm, resid_norm)
      if (!v.n_vectors) return false;
      const uint32_t bits = Next(s) % 2 ? Pick(kF32Bits, s) : [&] {
        uint32_t x;
        std::memcpy(&x, reinterpret_cast<const uint8_t*>(&meta[r]) + 4 * (Next(s) % 3), 4);
        return x ^ (1u << (Next(s) % 32));
      }();
      std::memcpy(reinterpret_cast<uint8_t*>(&meta[r]) + 4 * (Next(s) % 3), &bits, 4);
      break;
    }
    case 3:  // a code sum
      if (!v.n_vectors) return false;
      meta[r].code_sum = Next(s) % 2 ? Pick(kI32, s)
                                     : static_cast<int32_t>(static_cast<uint32_t>(meta[r].code_sum) +
                                                            static_cast<uint32_t>(Next(s) % 3) - 1u);
      break;
    case 4:  // a code
      if (!v.n_vectors) return false;
      const_cast<int8_t*>(v.codes)[r * v.padded_dim + k] =
          Next(s) % 2 ? Pick(kCodes, s) : static_cast<int8_t>(v.codes[r * v.padded_dim + k] + (Next(s) % 2 ? 1 : -1));
      break;
    case 5: {  // an offset
      auto* off = const_cast<uint64_t*>(v.offsets);
      const uint64_t i = Next(s) % (v.n_sets + 1);
      off[i] = Next(s) % 2 ? Pick(kU64, s) : off[i] + (Next(s) % 2 ? 1 : UINT64_MAX);
      break;
    }
    case 6: {  // a header field (u8 .. u64 at a random offset)
      const size_t at = Next(s) % offsetof(maxsim_pack_header, payload_checksum);
      const uint64_t value = Pick(kU64, s);
      std::memcpy(b + at, &value, std::min<size_t>(8, offsetof(maxsim_pack_header, payload_checksum) - at));
      break;
    }
    default: {  // the version minor
      const uint16_t minor = static_cast<uint16_t>(Next(s) % 3 == 0 ? 65535 : Next(s) % 3);
      std::memcpy(b + offsetof(maxsim_pack_header, version_minor), &minor, 2);
      break;
    }
  }
  Reseal(b, n);
  return true;
}

bool EmptyDoc(const maxsim_packed_desc& d, uint64_t j) { return d.offsets[j + 1] == d.offsets[j]; }

struct Query {
  uint32_t dim;
  std::vector<float> values;
  uint64_t offsets[3] = {0, 3, 3};  // a 3-token query and an empty one
  maxsim_dense_sets sets{};
  explicit Query(uint32_t d) : dim(d), values(3 * static_cast<size_t>(d)) {
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>((i * 7919) % 13) - 6.0f;
    sets.struct_size = sizeof(sets);
    sets.data = values.data();
    sets.dtype = MAXSIM_F32;
    sets.dim = d;
    sets.n_sets = 2;
    sets.offsets = offsets;
  }
};

// Scores an accepted buffer in every mode and metric, checking the oracle for `level`.
void Score(const maxsim_packed* p, maxsim_validation level, bool deep_ok) {
  maxsim_packed_desc desc;
  if (maxsim_packed_describe(p, &desc) != MAXSIM_OK) std::abort();
  const uint64_t nd = desc.n_sets;
  if (nd > 4096 || desc.n_vectors > 65536) return;
  Query q(desc.dim);
  const maxsim_sets Q{nullptr, &q.sets}, D{p, nullptr};
  const uint64_t nq = 2, cells = nq * nd;
  std::vector<float> exact(cells), cert(cells), approx(cells);
  std::vector<int32_t> ae(3 * nd), ac(3 * nd);
  for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
    maxsim_score_options o;
    maxsim_score_options_init(&o);
    o.metric = metric;
    if (maxsim_score_matrix(Context(), &Q, &D, &o, exact.data(), ae.data()) != MAXSIM_OK) std::abort();
    o.mode = MAXSIM_MODE_CERTIFIED;
    const maxsim_status cst = maxsim_score_matrix(Context(), &Q, &D, &o, cert.data(), ac.data());
    o.mode = MAXSIM_MODE_APPROXIMATE;
    if (maxsim_score_matrix(Context(), &Q, &D, &o, approx.data(), nullptr) != MAXSIM_OK) std::abort();
    std::vector<float> ts(nq * 5);
    std::vector<uint64_t> ti(nq * 5), ids(nq * 5);
    if (maxsim_topk(Context(), &Q, &D, 5, &o, ts.data(), ti.data(), desc.has_ids ? ids.data() : nullptr) != MAXSIM_OK) {
      std::abort();
    }
    if (level == MAXSIM_VALIDATE_FAST) continue;  // trusted: only "returns, no UB"
    // Certified: exact's bits, or (STANDARD only) refused exactly when DEEP refuses the buffer.
    if (cst == MAXSIM_OK) {
      if (!deep_ok && level == MAXSIM_VALIDATE_STANDARD) std::abort();
      if (std::memcmp(exact.data(), cert.data(), cells * 4) != 0 || ae != ac) std::abort();
    } else if (cst != MAXSIM_ERR_INVALID_BUFFER || deep_ok) {
      std::abort();
    }
    for (uint64_t i = 0; i < nq; ++i) {
      for (uint64_t j = 0; j < nd; ++j) {
        for (const std::vector<float>* s : {&exact, &approx}) {
          const float x = (*s)[i * nd + j];
          if (EmptyDoc(desc, j) ? x != -INFINITY : !std::isfinite(x)) std::abort();
        }
      }
      for (size_t r = 0; r < 5; ++r) {
        if (std::isnan(ts[i * 5 + r])) std::abort();
      }
    }
  }
}

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  uint64_t s = seed;
  if (size > 1 + MAXSIM_PACK_HEADER_SIZE && Next(s) % 2 == 0) {
    // Field mutation on a 64-byte aligned copy of the buffer; the control byte asks for no further resealing.
    const size_t n = size - 1;
    void* buf = std::aligned_alloc(64, (n + 63) / 64 * 64);
    std::memcpy(buf, data + 1, n);
    if (MutateField(static_cast<uint8_t*>(buf), n, Next(s))) {
      std::memcpy(data + 1, buf, n);
      data[0] &= 0xFE;
      std::free(buf);
      return size;
    }
    std::free(buf);
  }
  return LLVMFuzzerMutate(data, size, max_size);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool reseal = data[0] & 1;
  const size_t n = size - 1;
  auto* b = static_cast<uint8_t*>(std::aligned_alloc(64, (n + 63) / 64 * 64 + 64));
  std::memcpy(b, data + 1, n);
  if (reseal) Reseal(b, n);
  const bool deep_ok = maxsim_validate(b, n, MAXSIM_VALIDATE_DEEP) == MAXSIM_OK;
  for (maxsim_validation level : {MAXSIM_VALIDATE_STANDARD, MAXSIM_VALIDATE_DEEP, MAXSIM_VALIDATE_FAST}) {
    maxsim_packed* p = nullptr;
    if (maxsim_packed_open(b, n, level, &p) != MAXSIM_OK) continue;
    if (level == MAXSIM_VALIDATE_DEEP && !deep_ok) std::abort();
    Score(p, level, deep_ok);
    maxsim_packed_release(p);
  }
  std::free(b);
  return 0;
}
