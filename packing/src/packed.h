// SPDX-License-Identifier: Apache-2.0
// Internal interface of the packed format: layout arithmetic, checksum, quantisation, validation, views.
#ifndef MAXSIM_PACKING_PACKED_H_
#define MAXSIM_PACKING_PACKED_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "maxsim/maxsim.h"
#include "maxsim/packed_format.h"
#include "status.h"
#include "string_id.h"

namespace maxsim::pack {

inline uint32_t DtypeBytes(maxsim_dtype dtype) { return dtype == MAXSIM_F32 ? 4u : 2u; }
inline bool DtypeValid(uint32_t dtype) { return dtype >= MAXSIM_F32 && dtype <= MAXSIM_BF16; }
const char* DtypeName(maxsim_dtype dtype);

// Where every region of a canonical buffer lies. Fully determined by (dim, dtype, n_vectors, n_sets, has_ids)
// and, for a buffer with string ids, the bytes of those ids (each id's UTF-8 bytes + its NUL terminator).
struct Layout {
  uint32_t dim = 0;
  uint32_t padded_dim = 0;
  uint32_t orig_row_bytes = 0;
  maxsim_dtype dtype = MAXSIM_F32;
  uint64_t n_vectors = 0;
  uint64_t n_sets = 0;
  bool has_ids = false;
  bool has_string_ids = false;
  uint64_t string_id_bytes = 0;  // the text part of the string-ids region (after its n_sets + 1 offsets)
  int region_count = MAXSIM_REGION_COUNT;  // 5, or 6 with string ids
  maxsim_pack_region regions[MAXSIM_REGION_SLOTS] = {};
  uint64_t total_size = 0;
};

// Overflow-checked; fails with MAXSIM_ERR_INVALID_ARGUMENT (or the given code) naming the field that overflows.
// string_id_bytes: UINT64_MAX for a buffer without string ids.
constexpr uint64_t kNoStringIds = UINT64_MAX;
Status ComputeLayout(uint32_t dim, maxsim_dtype dtype, uint64_t n_vectors, uint64_t n_sets, bool has_ids,
                     Layout* layout, maxsim_status code = MAXSIM_ERR_INVALID_ARGUMENT,
                     uint64_t string_id_bytes = kNoStringIds);

struct RowOps;
const RowOps& BestRowOps();

// 64-bit checksum (four independent multiply-rotate lanes, then an avalanche): detects corruption, not an
// adversary. About 10 GB/s on one core. Its block loop is RowOps::checksum_blocks.
uint64_t Checksum64(const void* data, uint64_t size, const RowOps& ops = BestRowOps());

// A validated buffer, as kernels see it. Pointers are into the buffer; nothing is owned.
struct PackedView {
  const uint8_t* base = nullptr;
  uint64_t size = 0;
  uint32_t dim = 0;
  uint32_t padded_dim = 0;
  uint32_t orig_row_bytes = 0;
  maxsim_dtype dtype = MAXSIM_F32;
  uint64_t n_vectors = 0;
  uint64_t n_sets = 0;
  const int8_t* codes = nullptr;
  const maxsim_vector_meta* meta = nullptr;
  const uint8_t* originals = nullptr;
  const uint64_t* offsets = nullptr;
  const uint64_t* ids = nullptr;  // null when the buffer has none
  // String ids (format 1.1): id i is the NUL-terminated UTF-8 text at string_ids + string_id_offsets[i], of
  // string_id_offsets[i + 1] - string_id_offsets[i] - 1 bytes. Both null when the buffer has none.
  const uint64_t* string_id_offsets = nullptr;
  const char* string_ids = nullptr;
};



Status Validate(const void* buffer, uint64_t size, maxsim_validation level, PackedView* view,
                const RowOps& ops = BestRowOps());
// The DEEP pass alone, over a view that passed STANDARD: re-quantises every vector with `threads` threads and
// requires codes and metadata to match bit for bit.
Status CheckDeep(const PackedView& view, int threads, const RowOps& ops = BestRowOps());

// ---- Quantisation (the canonical definition lives in quantize_ref.cc; packing/README.md states it) ----

// Pass 1 over one f32 vector: finiteness, max |v|, and the canonical double sum of squares.
struct RowStats {
  float maxabs = 0;
  double norm_sq = 0;
  bool finite = true;
};
// Pass 2: codes (padded_dim bytes, zero padding) and metadata; meta->norm comes from the pass-1 sum.
// `codes` may be null to compute only the metadata.
void QuantizeRowRef(const float* v, uint32_t dim, uint32_t padded_dim, const RowStats& stats, int8_t* codes,
                    maxsim_vector_meta* meta);
RowStats AnalyzeRowRef(const float* v, uint32_t dim);

// The vectorised row operations (quantize_hwy.cc: one Highway source compiled per target), bit-identical to
// the reference whatever the target. The caller picks the target and passes them down, so that a caller's
// ISA choice (MAXSIM_ISA, maxsim_options.isa) holds in packing too.
struct RowOps {
  RowStats (*analyze)(const float* v, uint32_t dim);
  void (*quantize)(const float* v, uint32_t dim, uint32_t padded_dim, const RowStats& stats, int8_t* codes,
                   maxsim_vector_meta* meta);
  void (*widen)(const void* row, maxsim_dtype dtype, uint32_t dim, float* out);  // f16/bf16/f32 -> f32, exact
  // Checksum64's loop: n_blocks 64-byte blocks into the 8 lane pairs (a, b).
  void (*checksum_blocks)(const uint8_t* p, uint64_t n_blocks, uint64_t a[8], uint64_t b[8]);
  // Whether every element of n_rows f32 rows of dim values, row_bytes apart, has |x| <= bound (NaN fails): a
  // compare per element, no norm (with AcceptedElementBound below).
  bool (*rows_within)(const uint8_t* rows, uint64_t n_rows, uint64_t row_bytes, uint32_t dim, float bound);
  int64_t target;  // the Highway target (HWY_AVX3, HWY_AVX2, HWY_NEON, ...)
};
// The best target this CPU runs among those compiled and not above `cap` (a Highway target bit; 0: no cap):
// HWY_AVX2 allows AVX2, SSE4, SSSE3 and the scalar target, never AVX-512; a cap below every compiled target
// gives the narrowest one (the build's baseline). BestRowOps() is RowOpsFor(0).
RowOps RowOpsFor(int64_t cap);
// The compiled targets this CPU runs, best first (tests compare them), and a target's name ("AVX2").
std::vector<int64_t> RowOpsTargets();
const char* RowOpsTargetName(int64_t target);

// The canonical combination of the 8 lane sums and the f32 roundings of the norms.
double CombineLanes(const double lanes[8]);
float NormFromSquares(double norm_sq);      // round to nearest
float ResidFromSquares(double resid_sq);    // round up: an upper bound

// Accepted vector: finite and ||v|| <= MAXSIM_PACK_MAX_NORM.
inline bool NormAccepted(double norm_sq) { return norm_sq <= MAXSIM_PACK_MAX_NORM * MAXSIM_PACK_MAX_NORM; }

// A sufficient test of acceptance without the norm: an f32 vector of `dim` elements whose every |x_k| is at
// most AcceptedElementBound(dim) is finite and has RowOps::analyze's norm_sq accepted by NormAccepted (test it
// with RowOps::rows_within). A vector failing it may still be accepted (one large element): decide such
// vectors with RowOps::analyze.
float AcceptedElementBound(uint32_t dim);

}  // namespace maxsim::pack

#endif  // MAXSIM_PACKING_PACKED_H_
