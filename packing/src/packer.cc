// SPDX-License-Identifier: Apache-2.0
// The packer: dense row-major f32/f16/bf16 sets (+ optional mask and ids) -> canonical packed buffer.
// Two passes over chunks of rows, threaded with OpenMP:
//   1. analyse every vector (finite? norm <= 1e19?) into a small side array; on any rejection return the
//      first offending vector and write nothing;
//   2. quantise and copy into the output.
// (or one fused pass when the output is the library's own allocation, freed on error).
// The header, offsets, ids, zero gaps and checksums are written last.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "dense.h"
#include "packed.h"
#include "packer.h"
#include "parallel.h"
#include "progress.h"

namespace maxsim::pack {
namespace {

using ull = unsigned long long;

constexpr uint64_t kChunkRows = 512;

struct Chunk {
  uint64_t set;
  uint64_t row_begin;   // source rows [row_begin, row_end)
  uint64_t row_end;
  uint64_t packed_begin;  // packed index of the first kept row
};

struct Rejection {
  uint64_t packed = UINT64_MAX;
  uint64_t set = 0;
  uint64_t token = 0;
  uint32_t element = 0;  // first non-finite element, or UINT32_MAX for a norm rejection
  double norm = 0;
};

// Source row r (of set `set`) as f32: a pointer into the input when it already is contiguous f32, else widened into scratch.
inline const float* RowAsF32(const DenseView& in, uint64_t set, uint64_t r, float* scratch, const RowOps& ops) {
  const void* row = in.row(set, r);
  if (in.dtype == MAXSIM_F32) return static_cast<const float*>(row);
  ops.widen(row, in.dtype, in.dim, scratch);
  return scratch;
}

void BuildChunks(const DenseView& in, const std::vector<uint64_t>& new_offsets, std::vector<Chunk>* chunks) {
  chunks->clear();
  for (uint64_t i = 0; i < in.n_sets; ++i) {
    uint64_t packed = new_offsets[i];
    for (uint64_t b = in.begin(i); b < in.end(i); b += kChunkRows) {
      const uint64_t e = std::min(in.end(i), b + kChunkRows);
      chunks->push_back({i, b, e, packed});
      if (in.mask) {
        for (uint64_t r = b; r < e; ++r) packed += in.mask[r] != 0;
      } else {
        packed += e - b;
      }
    }
  }
}

// Total bytes of the string ids' text (each id + its NUL), or kNoStringIds without string ids; every id is
// checked first, so that a bad id is reported before anything is written.
Status StringIdBytes(const char* const* string_ids, uint64_t n_sets, const char* role, uint64_t* bytes) {
  *bytes = kNoStringIds;
  if (string_ids == nullptr) return Status::Ok();
  uint64_t total = 0;
  for (uint64_t i = 0; i < n_sets; ++i) {
    if (string_ids[i] == nullptr) {
      return Error(MAXSIM_ERR_INVALID_ARGUMENT, "%s: string id %llu is NULL", role, static_cast<ull>(i));
    }
    const uint64_t len = std::strlen(string_ids[i]);
    if (const char* problem = StringIdProblem(string_ids[i], len)) {
      return Error(MAXSIM_ERR_INVALID_ARGUMENT, "%s: string id %llu %s (ids must be non-empty UTF-8 without tabs, "
                   "line breaks or NUL)", role, static_cast<ull>(i), problem);
    }
    total += len + 1;
  }
  *bytes = total;
  return Status::Ok();
}

}  // namespace

Status PackedOffsets(const DenseView& in, std::vector<uint64_t>* offsets) {
  offsets->assign(in.n_sets + 1, 0);
  uint64_t total = 0;
  for (uint64_t i = 0; i < in.n_sets; ++i) {
    uint64_t kept = in.length(i);
    if (in.mask) {
      kept = 0;
      for (uint64_t r = in.begin(i); r < in.end(i); ++r) kept += in.mask[r] != 0;
    }
    total += kept;
    (*offsets)[i + 1] = total;
  }
  return Status::Ok();
}

Status PackedSize(const DenseView& in, bool with_ids, uint64_t* size, const char* const* string_ids) {
  std::vector<uint64_t> offsets;
  MAXSIM_RETURN_IF_ERROR(PackedOffsets(in, &offsets));
  uint64_t string_bytes = kNoStringIds;
  MAXSIM_RETURN_IF_ERROR(StringIdBytes(string_ids, in.n_sets, "sets", &string_bytes));
  Layout layout;
  MAXSIM_RETURN_IF_ERROR(
      ComputeLayout(in.dim, in.dtype, offsets.back(), in.n_sets, with_ids, &layout, MAXSIM_ERR_INVALID_ARGUMENT,
                    string_bytes));
  *size = layout.total_size;
  return Status::Ok();
}

Status PackInto(const DenseView& in, const uint64_t* ids, void* out, uint64_t capacity, int threads,
                const char* role, uint64_t* written, bool write_before_validation,
                const char* const* string_ids, const RowOps& ops) {
  if (in.memory != MAXSIM_MEMORY_HOST) {
    return Error(MAXSIM_ERR_UNSUPPORTED, "%s: packing reads host memory; copy device tensors to the host first", role);
  }
  if (out == nullptr) return Error(MAXSIM_ERR_INVALID_ARGUMENT, "%s: output buffer is NULL", role);
  if (reinterpret_cast<uintptr_t>(out) % MAXSIM_PACK_ALIGN != 0) {
    return Error(MAXSIM_ERR_INVALID_ARGUMENT, "%s: output buffer %p is not 64-byte aligned", role, out);
  }
  std::vector<uint64_t> new_offsets;
  MAXSIM_RETURN_IF_ERROR(PackedOffsets(in, &new_offsets));
  const uint64_t n_vectors = new_offsets.back();
  uint64_t string_bytes = kNoStringIds;
  MAXSIM_RETURN_IF_ERROR(StringIdBytes(string_ids, in.n_sets, role, &string_bytes));
  Layout l;
  MAXSIM_RETURN_IF_ERROR(ComputeLayout(in.dim, in.dtype, n_vectors, in.n_sets, ids != nullptr, &l,
                                       MAXSIM_ERR_INVALID_ARGUMENT, string_bytes));
  if (capacity < l.total_size) {
    if (written) *written = l.total_size;
    return Error(MAXSIM_ERR_BUFFER_TOO_SMALL, "%s: packing needs %llu bytes, output capacity is %llu", role,
                 static_cast<ull>(l.total_size), static_cast<ull>(capacity));
  }

  std::vector<Chunk> chunks;
  BuildChunks(in, new_offsets, &chunks);
  const int64_t n_chunks = static_cast<int64_t>(chunks.size());
  threads = std::max(1, threads);
  std::vector<Rejection> rejections(static_cast<size_t>(threads));
  auto* base = static_cast<uint8_t*>(out);
  auto* codes = reinterpret_cast<int8_t*>(base + l.regions[MAXSIM_REGION_CODES].offset);
  auto* meta = reinterpret_cast<maxsim_vector_meta*>(base + l.regions[MAXSIM_REGION_META].offset);
  uint8_t* originals = base + l.regions[MAXSIM_REGION_ORIGINALS].offset;
  const uint64_t orig_used = static_cast<uint64_t>(in.dim) * DtypeBytes(in.dtype);
  // Two passes (analyse everything, then write) keep the caller's buffer untouched on a rejection; when the
  // caller owns nothing that could be damaged (maxsim_pack frees its own buffer on error), one fused pass reads
  // the input once: for a large corpus that is the difference between one and two passes over memory.
  const bool analyse_pass = !write_before_validation;
  std::vector<RowStats> stats(analyse_pass ? n_vectors : 0);

  enum class Work { kAnalyse, kWrite, kBoth };
  Progress progress((analyse_pass ? 2 : 1) * (in.n_rows));
  auto run = [&](Work work) {
    ParallelTasks(threads, n_vectors > 2 * kChunkRows, n_chunks, 1, [&](int t) {
      return [&, scratch = std::vector<float>(in.dim), &mine = rejections[static_cast<size_t>(t)]](int64_t c) mutable {
        if (progress.cancelled()) return;
        const Chunk& ch = chunks[static_cast<size_t>(c)];
        progress.Advance(ch.row_end - ch.row_begin);
        uint64_t p = ch.packed_begin;
        for (uint64_t r = ch.row_begin; r < ch.row_end; ++r) {
          if (!in.kept(r)) continue;
          const float* v = RowAsF32(in, ch.set, r, scratch.data(), ops);
          RowStats st;
          if (work == Work::kWrite) {
            st = stats[p];
          } else {
            st = ops.analyze(v, in.dim);
            if (!st.finite || !NormAccepted(st.norm_sq)) {
              if (p < mine.packed) {
                mine.packed = p;
                mine.set = ch.set;
                mine.token = r - in.begin(ch.set);
                mine.element = UINT32_MAX;
                for (uint32_t k = 0; k < in.dim && !st.finite; ++k) {
                  if (!std::isfinite(v[k])) {
                    mine.element = k;
                    break;
                  }
                }
                mine.norm = std::sqrt(st.norm_sq);
              }
              ++p;
              continue;
            }
            if (work == Work::kAnalyse) {
              stats[p++] = st;
              continue;
            }
          }
          ops.quantize(v, in.dim, l.padded_dim, st, codes + p * l.padded_dim, &meta[p]);
          uint8_t* orow = originals + p * l.orig_row_bytes;
          std::memcpy(orow, in.row(ch.set, r), orig_used);
          std::memset(orow + orig_used, 0, l.orig_row_bytes - orig_used);
          ++p;
        }
      };
    });
  };
  run(analyse_pass ? Work::kAnalyse : Work::kBoth);
  MAXSIM_RETURN_IF_ERROR(progress.Finish("packing"));
  const Rejection* first = nullptr;
  for (const Rejection& r : rejections) {
    if (r.packed != UINT64_MAX && (first == nullptr || r.packed < first->packed)) first = &r;
  }
  if (first) {
    const char* what = analyse_pass ? "nothing was packed" : "the output buffer is incomplete";
    if (first->element != UINT32_MAX) {
      return Error(MAXSIM_ERR_NON_FINITE,
                   "%s: set %llu token %llu has a non-finite value at element %u; %s (remove or fix that vector)",
                   role, static_cast<ull>(first->set), static_cast<ull>(first->token), first->element, what);
    }
    return Error(MAXSIM_ERR_NON_FINITE,
                 "%s: set %llu token %llu has L2 norm %g, above the supported 1e19 (f32 dot products could "
                 "overflow); %s (rescale your embeddings)", role, static_cast<ull>(first->set),
                 static_cast<ull>(first->token), first->norm, what);
  }
  if (analyse_pass) run(Work::kWrite);
  MAXSIM_RETURN_IF_ERROR(progress.Finish("packing"));
  std::memcpy(base + l.regions[MAXSIM_REGION_OFFSETS].offset, new_offsets.data(), new_offsets.size() * 8);
  if (ids) std::memcpy(base + l.regions[MAXSIM_REGION_IDS].offset, ids, in.n_sets * 8);
  if (l.has_string_ids) {
    uint8_t* region = base + l.regions[MAXSIM_REGION_STRING_IDS].offset;
    char* text = reinterpret_cast<char*>(region + (in.n_sets + 1) * 8);
    uint64_t at = 0;
    for (uint64_t i = 0; i < in.n_sets; ++i) {
      std::memcpy(region + i * 8, &at, 8);
      const uint64_t len = std::strlen(string_ids[i]) + 1;  // with its NUL
      std::memcpy(text + at, string_ids[i], len);
      at += len;
    }
    std::memcpy(region + in.n_sets * 8, &at, 8);
  }
  for (int r = 0; r < l.region_count; ++r) {
    const uint64_t end = l.regions[r].offset + l.regions[r].size;
    const uint64_t next = r + 1 < l.region_count ? l.regions[r + 1].offset : l.total_size;
    std::memset(base + end, 0, next - end);
  }

  maxsim_pack_header h;
  std::memset(&h, 0, sizeof(h));
  std::memcpy(h.magic, MAXSIM_PACK_MAGIC, 8);
  h.version_major = MAXSIM_PACK_VERSION_MAJOR;
  // 1.0 unless the buffer has string ids, so that readers of 1.0 keep reading every buffer that needs no 1.1
  // feature.
  h.version_minor = l.has_string_ids ? 1 : 0;
  h.endian_tag = MAXSIM_PACK_ENDIAN_TAG;
  h.header_size = MAXSIM_PACK_HEADER_SIZE;
  h.layout = MAXSIM_PACK_LAYOUT_CANONICAL;
  h.orig_dtype = static_cast<uint8_t>(in.dtype);
  h.region_count = static_cast<uint8_t>(l.region_count);
  h.quant_range = MAXSIM_PACK_QUANT_RANGE;
  h.dim = in.dim;
  h.padded_dim = l.padded_dim;
  h.orig_row_bytes = l.orig_row_bytes;
  h.meta_record_bytes = sizeof(maxsim_vector_meta);
  h.n_vectors = n_vectors;
  h.n_sets = in.n_sets;
  h.total_size = l.total_size;
  for (int r = 0; r < l.region_count; ++r) h.regions[r] = l.regions[r];
  h.flags = (ids ? MAXSIM_PACK_FLAG_HAS_IDS : 0) | (l.has_string_ids ? MAXSIM_PACK_FLAG_HAS_STRING_IDS : 0);
  h.payload_checksum = Checksum64(base + MAXSIM_PACK_HEADER_SIZE, l.total_size - MAXSIM_PACK_HEADER_SIZE, ops);
  h.header_checksum = Checksum64(&h, offsetof(maxsim_pack_header, header_checksum), ops);
  std::memcpy(base, &h, sizeof(h));
  if (written) *written = l.total_size;
  return Status::Ok();
}

}  // namespace maxsim::pack
