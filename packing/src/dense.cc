// SPDX-License-Identifier: Apache-2.0
#include "dense.h"

#include <cstddef>

#include "maxsim/packed_format.h"

namespace maxsim {

using ull = unsigned long long;

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
  if (v.n_rows > 0 && s->data == nullptr) {
    return Error(MAXSIM_ERR_INVALID_ARGUMENT, "%s: data is NULL but the sets address %llu rows", role,
                 static_cast<ull>(v.n_rows));
  }
  *view = v;
  return Status::Ok();
}

}  // namespace maxsim
