// The object behind the public opaque maxsim_packed handle.
#ifndef MAXSIM_SRC_PACKED_HANDLE_H_
#define MAXSIM_SRC_PACKED_HANDLE_H_

#include <cstdint>

#include "packed.h"

struct maxsim_packed {
  enum class Storage { kBorrowed, kOwned, kMapped };
  maxsim::pack::PackedView view;
  Storage storage = Storage::kBorrowed;
  void* memory = nullptr;     // kOwned: aligned heap block; kMapped: mmap address
  uint64_t mapped_bytes = 0;  // kMapped
  uint64_t uid = 0;           // unique per handle (device-copy caches key on it, never on the address)
};

namespace maxsim {
uint64_t NextPackedUid();
}  // namespace maxsim

#endif  // MAXSIM_SRC_PACKED_HANDLE_H_
