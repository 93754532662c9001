// SPDX-License-Identifier: Apache-2.0
// The object behind the public opaque maxsim_packed handle.
#ifndef MAXSIM_SRC_PACKED_HANDLE_H_
#define MAXSIM_SRC_PACKED_HANDLE_H_

#include <cstdint>
#include <string>

#include "mutex.h"
#include "packed.h"

struct maxsim_packed {
  enum class Storage { kBorrowed, kOwned, kMapped };
  maxsim::pack::PackedView view;
  Storage storage = Storage::kBorrowed;
  void* memory = nullptr;     // kOwned: from AllocatePacked; kMapped: mmap of a file
  uint64_t mapped_bytes = 0;  // kOwned and kMapped: bytes to release
  uint64_t uid = 0;           // unique per handle (device-copy caches key on it, never on the address)
  // Whether the codes and metadata are proven to match the originals, which certified mode's guarantee rests on:
  // kProven (packed by this library, or DEEP-validated), kTrusted (opened FAST: the caller vouches for it) or
  // kUnproven (STANDARD: DEEP-validated before its first certified use, by maxsim::ProveForCertified).
  enum class Trust { kProven, kTrusted, kUnproven };
  Trust trust = Trust::kUnproven;
  mutable maxsim::Mutex proof_mu;  // guards the fields below
  mutable int proof_state = 0;  // kUnproven only: 0 not checked yet, 1 DEEP passed, 2 DEEP failed
  mutable std::string proof_error;
};

namespace maxsim {
uint64_t NextPackedUid();
// The trust a handle validated at `level` starts with (DEEP: proven, FAST: trusted, STANDARD: unproven).
maxsim_packed::Trust TrustAfter(maxsim_validation level);
// Certified scoring of a packed handle: a kUnproven one is DEEP-validated once (with `threads` threads) and the
// outcome kept; a failure is MAXSIM_ERR_INVALID_BUFFER naming `role` (the caller scores nothing).
Status ProveForCertified(const maxsim_packed& packed, int threads, const pack::RowOps& ops, const char* role);
// Memory for a packed buffer the library owns: 64-byte aligned; large blocks come straight from mmap (page
// aligned, returned to the OS on release). First-touch page faults cost about as much as packing itself
// (0.45 vs 0.14 us per d=128 vector, fresh vs already-touched buffer, 235 MB corpus, one thread); the threads of
// a multi-threaded pack fault their own pages in parallel. Transparent huge pages were measured and rejected:
// on a process's first allocation the kernel compacts memory and packing became up to 4x slower, erratically;
// MAP_POPULATE helped one thread a little and serialised two. Returns nullptr on failure.
void* AllocatePacked(uint64_t bytes);
void FreePacked(void* memory, uint64_t bytes);
}  // namespace maxsim

#endif  // MAXSIM_SRC_PACKED_HANDLE_H_
