// SPDX-License-Identifier: Apache-2.0
#ifndef MAXSIM_PACKING_PACKER_H_
#define MAXSIM_PACKING_PACKER_H_

#include <cstdint>
#include <vector>

#include "dense.h"
#include "packed.h"
#include "status.h"

namespace maxsim::pack {

// Token offsets of the packed collection (masked rows dropped).
Status PackedOffsets(const DenseView& in, std::vector<uint64_t>* offsets);
// string_ids: null, or n_sets NUL-terminated UTF-8 ids (format 1.1), each checked by StringIdProblem.
Status PackedSize(const DenseView& in, bool with_ids, uint64_t* size, const char* const* string_ids = nullptr);
// Packs host-memory sets into `out` (64-byte aligned, `capacity` bytes). On any error nothing is written,
// unless write_before_validation (one fused pass; for outputs the library allocated and frees on error).
// ops: the vectorised row operations of the caller's target (packed.h).
Status PackInto(const DenseView& in, const uint64_t* ids, void* out, uint64_t capacity, int threads,
                const char* role, uint64_t* written, bool write_before_validation = false,
                const char* const* string_ids = nullptr, const RowOps& ops = BestRowOps());

}  // namespace maxsim::pack

#endif  // MAXSIM_PACKING_PACKER_H_
