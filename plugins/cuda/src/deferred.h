// SPDX-License-Identifier: Apache-2.0
// Stream-ordered training and device-tensor calls (MAXSIM_CALL_STREAM_ORDERED, maxsim.h): what one such call
// leaves behind instead of a host synchronisation. Each call takes a slot: a few words of device memory (its
// check flags) and of mapped pinned host memory (what the host reads), and an event recorded after its work. The
// call's last launch, the settle kernel (deferred.cu), reads the slot's device words: when a check fired it
// locates the offending row if asked, makes the call's outputs NaN / -1, writes the result into the host words
// and sets their `failed` word last; in every case it clears the device words, so a slot is clean when its event
// has fired. Internal to the plugin.
#ifndef MAXSIM_PLUGINS_CUDA_DEFERRED_H_
#define MAXSIM_PLUGINS_CUDA_DEFERRED_H_

#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels.h"

namespace mscuda {

constexpr uint32_t kDeferredSlots = 64;  // stream-ordered calls in flight before a call waits for the oldest

// A slot's device words: gate 0 and flags all ones between uses.
struct DeferredDevice {
  unsigned int gate;             // the forward's folded check / the backward's "a check flag is set" word
  unsigned int unused;
  unsigned long long flags[2];   // 1 + the first offending index of each check (RowCheck's, the backward's)
  unsigned long long unused2;
};

// A slot's host words (mapped pinned memory; the settle kernel writes them only when the call failed).
struct DeferredWords {
  unsigned int failed;           // 1 once the rest is written
  unsigned int unused;
  unsigned long long flags[2];   // the device flags as the settle kernel found them
  unsigned long long set[2];     // forward: the set and the token within it of row flags[r] - 1 (r = 0: queries,
  unsigned long long token[2];   // 1: documents)
};

// The settle kernel's arguments (one block; the good path reads two words and returns).
struct SettleArgs {
  DeferredDevice* dev = nullptr;
  DeferredWords* words = nullptr;  // device address of the slot's host words
  // Forward with the folded check: when the gate is set, rows [begin, end) of q and d are checked as RowCheck
  // checks them (a masked query row's NaN similarity is no error: the results then stand).
  bool locate_rows = false;
  bool name_rows = false;          // forward: report the set and token of each flagged row
  SetsView q, d;
  uint64_t q_begin = 0, q_end = 0, d_begin = 0, d_end = 0;
  uint32_t* fill[3] = {nullptr, nullptr, nullptr};  // outputs set to all-ones bits (NaN f32, -1 int32) on failure
  uint64_t fill_words[3] = {0, 0, 0};
};
cudaError_t LaunchSettle(const SettleArgs& a, cudaStream_t stream);

}  // namespace mscuda

#endif  // MAXSIM_PLUGINS_CUDA_DEFERRED_H_
