// SPDX-License-Identifier: Apache-2.0
#include "dense.h"

#include <cstddef>
#include <cstdint>

#include "maxsim/packed_format.h"

namespace maxsim {

using ull = unsigned long long;

namespace {

// maxsim_dense_sets.set_data: host memory, data NULL, and every set with rows has a pointer aligned to its element
// size whose rows end inside the address space. (Whether the caller's pointers address memory of that size is
// the caller's promise, as for data.)
Status CheckSetData(const maxsim_dense_sets& s, const char* role, uint64_t elem, DenseView* v) {
  if (s.memory != MAXSIM_MEMORY_HOST) {
    return Error(MAXSIM_ERR_UNSUPPORTED, "%s: per-set row pointers (set_data) are host memory only; pass device "
                 "tensors as one array with offsets", role);
  }
  if (s.data != nullptr) {
    return Error(MAXSIM_ERR_INVALID_ARGUMENT, "%s: both data and set_data are set; with per-set row pointers data "
                 "must be NULL", role);
  }
  const uint64_t row_used = static_cast<uint64_t>(s.dim) * elem;
  for (uint64_t i = 0; i < s.n_sets; ++i) {
    const uint64_t len = v->length(i);
    if (len == 0) continue;
    const auto p = reinterpret_cast<uintptr_t>(s.set_data[i]);
    if (p == 0) {
      return Error(MAXSIM_ERR_INVALID_ARGUMENT, "%s: set_data[%llu] is NULL but set %llu has %llu rows", role,
                   static_cast<ull>(i), static_cast<ull>(i), static_cast<ull>(len));
    }
    if (p % elem != 0) {
      return Error(MAXSIM_ERR_INVALID_ARGUMENT, "%s: set_data[%llu] = %p is not aligned to its %llu-byte elements",
                   role, static_cast<ull>(i), s.set_data[i], static_cast<ull>(elem));
    }
    uint64_t span = 0;
    if (MulOverflows(len - 1, v->row_bytes, &span) || AddOverflows(span, row_used, &span) ||
        span > static_cast<uint64_t>(PTRDIFF_MAX) || span > UINTPTR_MAX - p) {
      return Error(MAXSIM_ERR_INVALID_ARGUMENT, "%s: set %llu's %llu rows of stride %llu bytes from set_data[%llu] "
                   "do not fit in memory", role, static_cast<ull>(i), static_cast<ull>(len),
                   static_cast<ull>(v->row_bytes), static_cast<ull>(i));
    }
  }
  v->set_data = s.set_data;
  return Status::Ok();
}

}  // namespace

Status ResolveDense(const maxsim_dense_sets* s, const char* role, DenseView* view) {
  if (s == nullptr) return Error(MAXSIM_ERR_INVALID_ARGUMENT, "%s: maxsim_dense_sets pointer is NULL", role);
  if (s->struct_size < offsetof(maxsim_dense_sets, mask) + sizeof(s->mask)) {
    return Error(MAXSIM_ERR_INVALID_ARGUMENT,
                 "%s: maxsim_dense_sets.struct_size is %u, expected %zu (set it to sizeof(maxsim_dense_sets))", role,
                 s->struct_size, sizeof(maxsim_dense_sets));
  }
  const int32_t memory = RawEnum(s->memory), dtype = RawEnum(s->dtype);
  if (memory != MAXSIM_MEMORY_HOST && memory != MAXSIM_MEMORY_CUDA) {
    return Error(MAXSIM_ERR_INVALID_ARGUMENT, "%s: memory kind %d is not HOST (0) or CUDA (1)", role, memory);
  }
  if (dtype != MAXSIM_F32 && dtype != MAXSIM_F16 && dtype != MAXSIM_BF16) {
    return Error(MAXSIM_ERR_INVALID_ARGUMENT, "%s: dtype %d is not MAXSIM_F32 (1), MAXSIM_F16 (2) or MAXSIM_BF16 (3)",
                 role, dtype);
  }
  if (s->dim == 0 || s->dim > MAXSIM_PACK_MAX_DIM) {
    return Error(MAXSIM_ERR_INVALID_ARGUMENT, "%s: dim %u is outside the supported range 1..%u", role, s->dim,
                 MAXSIM_PACK_MAX_DIM);
  }
  const uint64_t stride = s->row_stride == 0 ? s->dim : s->row_stride;
  if (stride < s->dim) {
    return Error(MAXSIM_ERR_INVALID_ARGUMENT, "%s: row_stride %llu is smaller than dim %u", role,
                 static_cast<ull>(stride), s->dim);
  }
  DenseView v;
  v.memory = s->memory;
  v.data = static_cast<const uint8_t*>(s->data);
  v.dtype = s->dtype;
  v.dim = s->dim;
  v.n_sets = s->n_sets;
  v.offsets = s->offsets;
  v.set_length = s->set_length;
  v.mask = s->mask;
  const uint64_t elem = s->dtype == MAXSIM_F32 ? 4 : 2;
  if (MulOverflows(stride, elem, &v.row_bytes)) {
    return Error(MAXSIM_ERR_INVALID_ARGUMENT, "%s: row_stride %llu overflows", role, static_cast<ull>(stride));
  }
  if (s->offsets) {
    if (s->n_sets == UINT64_MAX) return Error(MAXSIM_ERR_INVALID_ARGUMENT, "%s: n_sets is too large", role);
    for (uint64_t i = 0; i < s->n_sets; ++i) {
      if (s->offsets[i + 1] < s->offsets[i]) {
        return Error(MAXSIM_ERR_INVALID_ARGUMENT, "%s: offsets decrease at set %llu (%llu then %llu)", role,
                     static_cast<ull>(i), static_cast<ull>(s->offsets[i]), static_cast<ull>(s->offsets[i + 1]));
      }
    }
    v.n_rows = s->n_sets == 0 ? 0 : s->offsets[s->n_sets];
  } else if (MulOverflows(s->n_sets, s->set_length, &v.n_rows)) {
    return Error(MAXSIM_ERR_INVALID_ARGUMENT, "%s: n_sets * set_length overflows", role);
  }
  uint64_t last_byte = 0;
  if (v.n_rows > 0 && (MulOverflows(v.n_rows - 1, v.row_bytes, &last_byte) ||
                       AddOverflows(last_byte, static_cast<uint64_t>(s->dim) * elem, &last_byte) ||
                       last_byte > static_cast<uint64_t>(PTRDIFF_MAX))) {
    return Error(MAXSIM_ERR_INVALID_ARGUMENT, "%s: %llu rows of stride %llu bytes do not fit in memory", role,
                 static_cast<ull>(v.n_rows), static_cast<ull>(v.row_bytes));
  }
  if (s->struct_size >= offsetof(maxsim_dense_sets, set_data) + sizeof(s->set_data) && s->set_data != nullptr) {
    MAXSIM_RETURN_IF_ERROR(CheckSetData(*s, role, elem, &v));
  } else if (v.n_rows > 0 && s->data == nullptr) {
    return Error(MAXSIM_ERR_INVALID_ARGUMENT, "%s: data is NULL but the sets address %llu rows", role,
                 static_cast<ull>(v.n_rows));
  }
  *view = v;
  return Status::Ok();
}

}  // namespace maxsim
