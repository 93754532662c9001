// SPDX-License-Identifier: Apache-2.0
// Validation of packed buffers from outside. Order: header fields (each checked before anything derived from
// it is used), header checksum, region table against the layout recomputed with overflow checks, offsets, then
// (STANDARD) the payload checksum and every record, code and original, then (DEEP) a re-quantisation.
// Messages name the field, the value found and the value expected.
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "half.h"
#include "packed.h"
#include "parallel.h"

namespace maxsim::pack {
namespace {

using ull = unsigned long long;

Status Bad(const char* format, ...) __attribute__((format(printf, 1, 2)));
Status Bad(const char* format, ...) {
  char buf[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof(buf), format, args);
  va_end(args);
  return Status(MAXSIM_ERR_INVALID_BUFFER, std::string("invalid packed buffer: ") + buf);
}

const char* kRegionNames[MAXSIM_REGION_COUNT + 1] = {"codes", "metadata", "originals", "offsets", "ids",
                                                     "string ids"};

bool SameBits(float a, float b) {
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

bool AllZero(const uint8_t* p, uint64_t n) {
  uint8_t acc = 0;
  for (uint64_t i = 0; i < n; ++i) acc |= p[i];
  return acc == 0;
}

// Codes must be in [-127, 127] (-128 would break sign-trick kernels) with zero padding.
Status CheckCodes(const PackedView& v) {
  const uint32_t dim = v.dim;
  for (uint64_t r = 0; r < v.n_vectors; ++r) {
    const int8_t* row = v.codes + r * v.padded_dim;
    uint8_t bad = 0;
    for (uint32_t k = 0; k < dim; ++k) bad |= static_cast<uint8_t>(row[k] == -128);
    if (bad) return Bad("vector %llu has code -128 (codes must lie in [-127, 127])", static_cast<ull>(r));
    if (!AllZero(reinterpret_cast<const uint8_t*>(row) + dim, v.padded_dim - dim)) {
      return Bad("vector %llu has non-zero code padding", static_cast<ull>(r));
    }
  }
  return Status::Ok();
}

Status CheckMeta(const PackedView& v) {
  const double max_norm = MAXSIM_PACK_MAX_NORM;
  const int64_t max_sum = 127ll * v.dim;
  for (uint64_t r = 0; r < v.n_vectors; ++r) {
    const maxsim_vector_meta& m = v.meta[r];
    if (!(std::isfinite(m.scale) && m.scale >= 0.0f)) {
      return Bad("vector %llu has scale %g (must be finite and >= 0)", static_cast<ull>(r), m.scale);
    }
    if (!(std::isfinite(m.norm) && m.norm >= 0.0f && m.norm <= max_norm)) {
      return Bad("vector %llu has norm %g (must be finite, >= 0 and <= 1e19)", static_cast<ull>(r), m.norm);
    }
    if (!(std::isfinite(m.resid_norm) && m.resid_norm >= 0.0f)) {
      return Bad("vector %llu has residual norm %g (must be finite and >= 0)", static_cast<ull>(r), m.resid_norm);
    }
    if (m.code_sum > max_sum || m.code_sum < -max_sum) {
      return Bad("vector %llu has code sum %d, impossible for dim %u", static_cast<ull>(r), m.code_sum, v.dim);
    }
  }
  return Status::Ok();
}

// Every original is finite with a norm <= 1e19, both computed from the originals themselves (the packer's
// canonical pass: widen exactly to f32, then RowOps::analyze), and the scale and norm records equal the ones that pass
// gives: the metadata cosine and the screening bounds read can then never claim a vector is smaller than it is.
// Codes, residual norms and code sums need a re-quantisation (DEEP).
Status CheckOriginals(const PackedView& v, const RowOps& ops) {
  const uint32_t elem = DtypeBytes(v.dtype);
  const uint64_t used = static_cast<uint64_t>(v.dim) * elem;
  std::vector<float> widened(v.dtype == MAXSIM_F32 ? 0 : v.dim);
  for (uint64_t r = 0; r < v.n_vectors; ++r) {
    const uint8_t* row = v.originals + r * v.orig_row_bytes;
    const float* f32 = reinterpret_cast<const float*>(row);  // rows are 64-byte aligned
    if (v.dtype != MAXSIM_F32) {
      ops.widen(row, v.dtype, v.dim, widened.data());
      f32 = widened.data();
    }
    const RowStats s = ops.analyze(f32, v.dim);
    if (!s.finite) return Bad("vector %llu has a non-finite original value", static_cast<ull>(r));
    if (!NormAccepted(s.norm_sq)) {
      return Bad("vector %llu has originals of norm %g, above the supported 1e19", static_cast<ull>(r),
                 std::sqrt(s.norm_sq));
    }
    const float norm = NormFromSquares(s.norm_sq), scale = s.maxabs / 127.0f;
    if (!SameBits(norm, v.meta[r].norm)) {
      return Bad("vector %llu: its norm record %g does not match its originals (norm %g)", static_cast<ull>(r),
                 v.meta[r].norm, norm);
    }
    if (!SameBits(scale, v.meta[r].scale)) {
      return Bad("vector %llu: its scale record %g does not match its originals (max |v| / 127 = %g)",
                 static_cast<ull>(r), v.meta[r].scale, scale);
    }
    if (!AllZero(row + used, v.orig_row_bytes - used)) {
      return Bad("vector %llu has non-zero padding after its originals", static_cast<ull>(r));
    }
  }
  return Status::Ok();
}

// Re-quantises vector r (row and codes are scratch) and requires its codes and metadata to match bit for bit.
Status CheckDeepRow(const PackedView& v, uint64_t r, float* row, int8_t* codes, const RowOps& ops) {
  ops.widen(v.originals + r * v.orig_row_bytes, v.dtype, v.dim, row);
  const RowStats stats = ops.analyze(row, v.dim);
  if (!stats.finite || !NormAccepted(stats.norm_sq)) {
    return Bad("vector %llu has norm %g, above the supported 1e19", static_cast<ull>(r), std::sqrt(stats.norm_sq));
  }
  maxsim_vector_meta meta;
  ops.quantize(row, v.dim, v.padded_dim, stats, codes, &meta);
  if (std::memcmp(&meta, &v.meta[r], sizeof(meta)) != 0) {
    return Bad("vector %llu: metadata does not match its originals (stored scale %g norm %g resid %g sum %d; "
               "recomputed %g %g %g %d)",
               static_cast<ull>(r), v.meta[r].scale, v.meta[r].norm, v.meta[r].resid_norm, v.meta[r].code_sum,
               meta.scale, meta.norm, meta.resid_norm, meta.code_sum);
  }
  if (std::memcmp(codes, v.codes + r * v.padded_dim, v.padded_dim) != 0) {
    return Bad("vector %llu: codes do not match its originals", static_cast<ull>(r));
  }
  return Status::Ok();
}

}  // namespace

// The rows are shared by `threads` threads; the first mismatching vector is the one reported, whatever the
// thread count (each thread skips rows after the first mismatch found so far).
Status CheckDeep(const PackedView& v, int threads, const RowOps& ops) {
  const int64_t n = static_cast<int64_t>(v.n_vectors);
  std::atomic<uint64_t> first_bad{UINT64_MAX};
  ParallelTasks(threads, n > 2048, n, 512, [&](int) {
    return [&, row = std::vector<float>(v.dim), codes = std::vector<int8_t>(v.padded_dim)](int64_t i) mutable {
      const uint64_t r = static_cast<uint64_t>(i);
      uint64_t seen = first_bad.load(std::memory_order_relaxed);
      if (r > seen || CheckDeepRow(v, r, row.data(), codes.data(), ops).ok()) return;
      while (r < seen && !first_bad.compare_exchange_weak(seen, r, std::memory_order_relaxed)) {
      }
    };
  });
  const uint64_t bad = first_bad.load();
  if (bad == UINT64_MAX) return Status::Ok();
  std::vector<float> row(v.dim);
  std::vector<int8_t> codes(v.padded_dim);
  return CheckDeepRow(v, bad, row.data(), codes.data(), ops);
}

Status Validate(const void* buffer, uint64_t size, maxsim_validation level, PackedView* view, const RowOps& ops) {
  if (buffer == nullptr) return Error(MAXSIM_ERR_INVALID_ARGUMENT, "packed buffer pointer is NULL");
  const int32_t raw_level = RawEnum(level);
  if (raw_level != MAXSIM_VALIDATE_STANDARD && raw_level != MAXSIM_VALIDATE_DEEP && raw_level != MAXSIM_VALIDATE_FAST) {
    return Error(MAXSIM_ERR_INVALID_ARGUMENT, "validation level %d is not STANDARD (0), DEEP (1) or FAST (2)",
                 raw_level);
  }
  if (reinterpret_cast<uintptr_t>(buffer) % MAXSIM_PACK_ALIGN != 0) {
    return Error(MAXSIM_ERR_INVALID_ARGUMENT,
                 "packed buffer at %p is not 64-byte aligned (allocate it with aligned_alloc(64, size) or load the "
                 "file with maxsim_packed_load)", buffer);
  }
  if (size < MAXSIM_PACK_HEADER_SIZE) {
    return Bad("%llu bytes is smaller than the %u-byte header (truncated?)", static_cast<ull>(size),
               MAXSIM_PACK_HEADER_SIZE);
  }
  const auto* base = static_cast<const uint8_t*>(buffer);
  maxsim_pack_header h;
  std::memcpy(&h, base, sizeof(h));

  if (std::memcmp(h.magic, MAXSIM_PACK_MAGIC, 8) != 0) {
    return Bad("magic is not \"MAXSIMPK\" (not a libmaxsim packed buffer)");
  }
  if (h.endian_tag != MAXSIM_PACK_ENDIAN_TAG) {
    if (h.endian_tag == 0x04030201u) return Bad("buffer was written with the other byte order (big-endian)");
    return Bad("endianness tag is 0x%08x, expected 0x01020304", h.endian_tag);
  }
  if (h.version_major != MAXSIM_PACK_VERSION_MAJOR) {
    return Bad("format version %u.%u is not supported by this reader (%u.%u): repack the data with this version",
               h.version_major, h.version_minor, MAXSIM_PACK_VERSION_MAJOR, MAXSIM_PACK_VERSION_MINOR);
  }
  if (h.version_minor > MAXSIM_PACK_VERSION_MINOR) {
    return Bad("format version %u.%u is newer than this reader's %u.%u (it may hold information this reader cannot "
               "check): upgrade libmaxsim to read it", h.version_major, h.version_minor, MAXSIM_PACK_VERSION_MAJOR,
               MAXSIM_PACK_VERSION_MINOR);
  }
  if (h.header_size != MAXSIM_PACK_HEADER_SIZE) {
    return Bad("header_size is %u, expected %u", h.header_size, MAXSIM_PACK_HEADER_SIZE);
  }
  const uint64_t header_sum = Checksum64(base, offsetof(maxsim_pack_header, header_checksum), ops);
  if (header_sum != h.header_checksum) {
    return Bad("header checksum mismatch (stored 0x%016llx, computed 0x%016llx): the header is corrupted",
               static_cast<ull>(h.header_checksum), static_cast<ull>(header_sum));
  }
  if (h.layout != MAXSIM_PACK_LAYOUT_CANONICAL) return Bad("layout id %u is unknown (expected 1)", h.layout);
  if (!DtypeValid(h.orig_dtype)) return Bad("originals dtype %u is not f32 (1), f16 (2) or bf16 (3)", h.orig_dtype);
  if (h.quant_range != MAXSIM_PACK_QUANT_RANGE) {
    return Bad("quantisation range is %u, expected %u", h.quant_range, MAXSIM_PACK_QUANT_RANGE);
  }
  if (h.meta_record_bytes != sizeof(maxsim_vector_meta)) {
    return Bad("metadata record size is %u, expected %zu", h.meta_record_bytes, sizeof(maxsim_vector_meta));
  }
  if (h.dim == 0 || h.dim > MAXSIM_PACK_MAX_DIM) return Bad("dim %u is outside 1..%u", h.dim, MAXSIM_PACK_MAX_DIM);
  constexpr uint64_t kKnownFlags = MAXSIM_PACK_FLAG_HAS_IDS | MAXSIM_PACK_FLAG_HAS_STRING_IDS;
  if ((h.flags & ~kKnownFlags) != 0) {
    return Bad("unknown flag bits 0x%llx", static_cast<ull>(h.flags & ~kKnownFlags));
  }
  const bool has_string_ids = (h.flags & MAXSIM_PACK_FLAG_HAS_STRING_IDS) != 0;
  if (has_string_ids && h.version_minor < 1) {
    return Bad("flag bit 1 (string ids) is set but the format version is %u.%u (string ids need 1.1)",
               h.version_major, h.version_minor);
  }
  const unsigned expected_regions = MAXSIM_REGION_COUNT + (has_string_ids ? 1u : 0u);
  if (h.region_count != expected_regions) {
    return Bad("region_count is %u, expected %u", h.region_count, expected_regions);
  }
  if (!AllZero(h.reserved, sizeof(h.reserved))) {
    return Bad("reserved header bytes are not zero");
  }

  const auto dtype = static_cast<maxsim_dtype>(h.orig_dtype);
  const bool has_ids = (h.flags & MAXSIM_PACK_FLAG_HAS_IDS) != 0;
  // The string-ids region's size is the one length the layout cannot derive from counts: its text part is
  // whatever follows the n_sets + 1 offsets (the offsets are then checked against it).
  uint64_t string_id_bytes = kNoStringIds;
  if (has_string_ids) {
    uint64_t table = 0;
    if (h.n_sets > UINT64_MAX / 8 - 1) return Bad("n_sets %llu is too large", static_cast<ull>(h.n_sets));
    table = (h.n_sets + 1) * 8;
    const uint64_t region_size = h.regions[MAXSIM_REGION_STRING_IDS].size;
    if (region_size < table) {
      return Bad("region 5 (string ids) is %llu bytes, less than its %llu-byte offset table",
                 static_cast<ull>(region_size), static_cast<ull>(table));
    }
    string_id_bytes = region_size - table;
  }
  Layout l;
  MAXSIM_RETURN_IF_ERROR(ComputeLayout(h.dim, dtype, h.n_vectors, h.n_sets, has_ids, &l, MAXSIM_ERR_INVALID_BUFFER,
                                       string_id_bytes));
  if (h.padded_dim != l.padded_dim) return Bad("padded_dim is %u, expected %u", h.padded_dim, l.padded_dim);
  if (h.orig_row_bytes != l.orig_row_bytes) {
    return Bad("orig_row_bytes is %u, expected %u", h.orig_row_bytes, l.orig_row_bytes);
  }
  for (int r = 0; r < MAXSIM_REGION_SLOTS; ++r) {
    const maxsim_pack_region expected = r < l.region_count ? l.regions[r] : maxsim_pack_region{0, 0};
    if (h.regions[r].offset != expected.offset || h.regions[r].size != expected.size) {
      return Bad("region %d (%s) is at offset %llu size %llu, expected offset %llu size %llu", r,
                 r < l.region_count ? kRegionNames[r] : "unused", static_cast<ull>(h.regions[r].offset),
                 static_cast<ull>(h.regions[r].size), static_cast<ull>(expected.offset),
                 static_cast<ull>(expected.size));
    }
  }
  if (h.total_size != l.total_size) {
    return Bad("total_size is %llu, expected %llu for %llu vectors in %llu sets", static_cast<ull>(h.total_size),
               static_cast<ull>(l.total_size), static_cast<ull>(h.n_vectors), static_cast<ull>(h.n_sets));
  }
  if (size != h.total_size) {
    return Bad("buffer is %llu bytes but its header says %llu (truncated or padded?)", static_cast<ull>(size),
               static_cast<ull>(h.total_size));
  }

  PackedView v;
  v.base = base;
  v.size = size;
  v.dim = h.dim;
  v.padded_dim = h.padded_dim;
  v.orig_row_bytes = h.orig_row_bytes;
  v.dtype = dtype;
  v.n_vectors = h.n_vectors;
  v.n_sets = h.n_sets;
  v.codes = reinterpret_cast<const int8_t*>(base + l.regions[MAXSIM_REGION_CODES].offset);
  v.meta = reinterpret_cast<const maxsim_vector_meta*>(base + l.regions[MAXSIM_REGION_META].offset);
  v.originals = base + l.regions[MAXSIM_REGION_ORIGINALS].offset;
  v.offsets = reinterpret_cast<const uint64_t*>(base + l.regions[MAXSIM_REGION_OFFSETS].offset);
  v.ids = has_ids ? reinterpret_cast<const uint64_t*>(base + l.regions[MAXSIM_REGION_IDS].offset) : nullptr;

  if (v.offsets[0] != 0) return Bad("offsets[0] is %llu, expected 0", static_cast<ull>(v.offsets[0]));
  for (uint64_t i = 0; i < v.n_sets; ++i) {
    if (v.offsets[i + 1] < v.offsets[i]) {
      return Bad("offsets decrease at set %llu (%llu then %llu)", static_cast<ull>(i), static_cast<ull>(v.offsets[i]),
                 static_cast<ull>(v.offsets[i + 1]));
    }
  }
  if (v.offsets[v.n_sets] != v.n_vectors) {
    return Bad("last offset is %llu but the buffer holds %llu vectors", static_cast<ull>(v.offsets[v.n_sets]),
               static_cast<ull>(v.n_vectors));
  }
  if (has_string_ids) {
    const uint8_t* region = base + l.regions[MAXSIM_REGION_STRING_IDS].offset;
    v.string_id_offsets = reinterpret_cast<const uint64_t*>(region);
    v.string_ids = reinterpret_cast<const char*>(region + (v.n_sets + 1) * 8);
    const uint64_t* so = v.string_id_offsets;
    if (so[0] != 0) return Bad("string id offsets[0] is %llu, expected 0", static_cast<ull>(so[0]));
    for (uint64_t i = 0; i < v.n_sets; ++i) {
      if (so[i + 1] <= so[i] || so[i + 1] - so[i] < 2) {
        return Bad("string id %llu spans bytes %llu..%llu: every id needs at least one byte and its NUL",
                   static_cast<ull>(i), static_cast<ull>(so[i]), static_cast<ull>(so[i + 1]));
      }
    }
    if (so[v.n_sets] != l.string_id_bytes) {
      return Bad("string ids end at byte %llu but their region holds %llu bytes of text",
                 static_cast<ull>(so[v.n_sets]), static_cast<ull>(l.string_id_bytes));
    }
    for (uint64_t i = 0; i < v.n_sets; ++i) {
      if (v.string_ids[so[i + 1] - 1] != '\0') return Bad("string id %llu is not NUL-terminated", static_cast<ull>(i));
    }
  }

  if (level != MAXSIM_VALIDATE_FAST) {
    const uint64_t payload_sum = Checksum64(base + MAXSIM_PACK_HEADER_SIZE, size - MAXSIM_PACK_HEADER_SIZE, ops);
    if (payload_sum != h.payload_checksum) {
      return Bad("payload checksum mismatch (stored 0x%016llx, computed 0x%016llx): the data is corrupted",
                 static_cast<ull>(h.payload_checksum), static_cast<ull>(payload_sum));
    }
    // Gaps between regions are zero in a canonical buffer.
    for (int r = 0; r < l.region_count; ++r) {
      const uint64_t end = l.regions[r].offset + l.regions[r].size;
      const uint64_t next = r + 1 < l.region_count ? l.regions[r + 1].offset : l.total_size;
      if (!AllZero(base + end, next - end)) return Bad("non-zero bytes after the %s region", kRegionNames[r]);
    }
    for (uint64_t i = 0; has_string_ids && i < v.n_sets; ++i) {
      const uint64_t at = v.string_id_offsets[i];
      const char* problem = StringIdProblem(v.string_ids + at, v.string_id_offsets[i + 1] - at - 1);
      if (problem) return Bad("string id %llu %s", static_cast<ull>(i), problem);
    }
    MAXSIM_RETURN_IF_ERROR(CheckMeta(v));
    MAXSIM_RETURN_IF_ERROR(CheckCodes(v));
    MAXSIM_RETURN_IF_ERROR(CheckOriginals(v, ops));
  }
  if (level == MAXSIM_VALIDATE_DEEP) MAXSIM_RETURN_IF_ERROR(CheckDeep(v, 1, ops));
  if (view) *view = v;
  return Status::Ok();
}

}  // namespace maxsim::pack
