// SPDX-License-Identifier: Apache-2.0
// Checked view of a maxsim_dense_sets from the caller.
#ifndef MAXSIM_SRC_DENSE_H_
#define MAXSIM_SRC_DENSE_H_

#include <cstdint>

#include "maxsim/maxsim.h"
#include "status.h"

namespace maxsim {

struct DenseView {
  maxsim_memory memory = MAXSIM_MEMORY_HOST;
  const uint8_t* data = nullptr;
  maxsim_dtype dtype = MAXSIM_F32;
  uint32_t dim = 0;
  uint64_t row_bytes = 0;   // stride between rows in bytes
  uint64_t n_sets = 0;
  const uint64_t* offsets = nullptr;
  uint64_t set_length = 0;
  const uint8_t* mask = nullptr;
  uint64_t n_rows = 0;      // rows addressed: offsets[n_sets] (or n_sets * set_length)
  const void* const* set_data = nullptr;  // per-set first rows (maxsim_dense_sets.set_data), else NULL

  uint64_t begin(uint64_t i) const { return offsets ? offsets[i] : i * set_length; }
  uint64_t end(uint64_t i) const { return offsets ? offsets[i + 1] : (i + 1) * set_length; }
  uint64_t length(uint64_t i) const { return end(i) - begin(i); }
  // Row r (numbered as the mask numbers rows) of set i, begin(i) <= r < end(i): one set's rows are contiguous
  // with stride row_bytes in both layouts.
  const uint8_t* row(uint64_t i, uint64_t r) const {
    return set_data ? static_cast<const uint8_t*>(set_data[i]) + (r - begin(i)) * row_bytes : data + r * row_bytes;
  }
  bool kept(uint64_t r) const { return mask == nullptr || mask[r] != 0; }
};

// Checks the struct (sizes, enums, offsets monotone, no overflow in row addressing) without reading the
// values. `role` names the argument in messages ("queries", "documents").
Status ResolveDense(const maxsim_dense_sets* sets, const char* role, DenseView* view);

}  // namespace maxsim

#endif  // MAXSIM_SRC_DENSE_H_
