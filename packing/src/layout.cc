// SPDX-License-Identifier: Apache-2.0
// Region arithmetic and the checksum of the packed format.
#include <cstring>

#include "packed.h"

namespace maxsim::pack {

const char* DtypeName(maxsim_dtype dtype) {
  switch (dtype) {
    case MAXSIM_F32: return "f32";
    case MAXSIM_F16: return "f16";
    case MAXSIM_BF16: return "bf16";
    default: break;
  }
  return "unknown";
}

Status ComputeLayout(uint32_t dim, maxsim_dtype dtype, uint64_t n_vectors, uint64_t n_sets, bool has_ids,
                     Layout* layout, maxsim_status code, uint64_t string_id_bytes) {
  if (dim == 0 || dim > MAXSIM_PACK_MAX_DIM) {
    return Error(code, "dim %u is outside the supported range 1..%u", dim, MAXSIM_PACK_MAX_DIM);
  }
  if (!DtypeValid(dtype)) return Error(code, "originals dtype %d is not f32 (1), f16 (2) or bf16 (3)", dtype);
  Layout l;
  l.dim = dim;
  l.dtype = dtype;
  l.n_vectors = n_vectors;
  l.n_sets = n_sets;
  l.has_ids = has_ids;
  l.has_string_ids = string_id_bytes != kNoStringIds;
  l.string_id_bytes = l.has_string_ids ? string_id_bytes : 0;
  l.region_count = l.has_string_ids ? MAXSIM_REGION_COUNT + 1 : MAXSIM_REGION_COUNT;
  l.padded_dim = static_cast<uint32_t>(RoundUp(dim, MAXSIM_PACK_ALIGN));
  l.orig_row_bytes = static_cast<uint32_t>(RoundUp(static_cast<uint64_t>(dim) * DtypeBytes(dtype), MAXSIM_PACK_ALIGN));

  uint64_t sizes[MAXSIM_REGION_COUNT + 1] = {};
  uint64_t sets_plus_one = 0;
  if (MulOverflows(n_vectors, l.padded_dim, &sizes[MAXSIM_REGION_CODES]) ||
      MulOverflows(n_vectors, sizeof(maxsim_vector_meta), &sizes[MAXSIM_REGION_META]) ||
      MulOverflows(n_vectors, l.orig_row_bytes, &sizes[MAXSIM_REGION_ORIGINALS]) ||
      AddOverflows(n_sets, 1, &sets_plus_one) ||
      MulOverflows(sets_plus_one, sizeof(uint64_t), &sizes[MAXSIM_REGION_OFFSETS]) ||
      MulOverflows(has_ids ? n_sets : 0, sizeof(uint64_t), &sizes[MAXSIM_REGION_IDS]) ||
      (l.has_string_ids && AddOverflows(sizes[MAXSIM_REGION_OFFSETS], l.string_id_bytes,
                                        &sizes[MAXSIM_REGION_STRING_IDS]))) {
    return Error(code, "%llu vectors of dim %u in %llu sets do not fit in a 64-bit buffer size",
                 static_cast<unsigned long long>(n_vectors), dim, static_cast<unsigned long long>(n_sets));
  }
  uint64_t cursor = MAXSIM_PACK_HEADER_SIZE;
  for (int r = 0; r < l.region_count; ++r) {
    l.regions[r].offset = cursor;
    l.regions[r].size = sizes[r];
    uint64_t end = 0;
    if (AddOverflows(cursor, sizes[r], &end) || end > UINT64_MAX - MAXSIM_PACK_ALIGN) {
      return Error(code, "%llu vectors of dim %u in %llu sets do not fit in a 64-bit buffer size",
                   static_cast<unsigned long long>(n_vectors), dim, static_cast<unsigned long long>(n_sets));
    }
    cursor = RoundUp(end, MAXSIM_PACK_ALIGN);
  }
  l.total_size = cursor;
  *layout = l;
  return Status::Ok();
}

namespace {
inline uint64_t Mix64(uint64_t x) {  // a 64-bit finaliser (multiply-xorshift avalanche)
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}
}  // namespace

// Eight-lane Fletcher-style sums over little-endian 64-bit words (a_l += w, b_l += a_l, mod 2^64; the last
// partial 64-byte block zero-padded): every single-bit error changes some a_l, reorderings change b_l, and the
// length is mixed in at the end. The loop vectorises (two u64 adds per word, memory speed); the 16 lane values
// are then folded through an avalanche mix.
uint64_t Checksum64(const void* data, uint64_t size, const RowOps& ops) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  uint64_t b[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const uint64_t i = size / 64 * 64;
  ops.checksum_blocks(p, size / 64, a, b);
  uint64_t w[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::memcpy(w, p + i, size - i);
  for (int l = 0; l < 8; ++l) {
    a[l] += w[l];
    b[l] += a[l];
  }
  uint64_t h = Mix64(size ^ 0x9e3779b97f4a7c15ull);
  for (int l = 0; l < 8; ++l) {
    h = Mix64(h ^ a[l]) + 0x9e3779b97f4a7c15ull;
    h = Mix64(h ^ b[l]) + 0x632be59bd9b4e019ull;
  }
  return h;
}

}  // namespace maxsim::pack
