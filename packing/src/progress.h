// SPDX-License-Identifier: Apache-2.0
// Progress reporting and cancellation of long calls (maxsim_set_progress). The callback a thread registered is
// captured when a call starts; worker threads count finished units of work; only the calling thread invokes the
// callback (so a caller may take its own locks or its interpreter's lock in it), at most every kIntervalMs, the
// first time kIntervalMs after the call started (short calls never call it). A non-zero return cancels: workers skip the remaining units and the call returns
// MAXSIM_ERR_CANCELLED.
#ifndef MAXSIM_SRC_PROGRESS_H_
#define MAXSIM_SRC_PROGRESS_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#if defined(__wasm__) && !defined(_REENTRANT)
#define MAXSIM_PROGRESS_ONE_THREAD 1  // WebAssembly without threads: its libc++ has no <thread>
#else
#include <thread>
#endif

#include "maxsim/maxsim.h"
#include "status.h"

namespace maxsim {

struct ProgressSink {
  maxsim_progress_fn fn = nullptr;
  void* user_data = nullptr;
};

// The calling thread's registered callback (maxsim_set_progress).
inline ProgressSink& ThreadProgressSink() {
  static thread_local ProgressSink sink;
  return sink;
}

class Progress {
#ifdef MAXSIM_PROGRESS_ONE_THREAD
  using ThreadId = int;
  static ThreadId Self() { return 0; }  // the calling thread is the only one
#else
  using ThreadId = std::thread::id;
  static ThreadId Self() { return std::this_thread::get_id(); }
#endif

 public:
  static constexpr int kIntervalMs = 50;

  explicit Progress(uint64_t total)
      : sink_(ThreadProgressSink()), total_(total), owner_(Self()),
        last_(std::chrono::steady_clock::now()) {}

  // True when the callers' remaining work should be skipped.
  bool cancelled() const { return sink_.fn != nullptr && cancel_.load(std::memory_order_relaxed); }

  // Any thread: `units` more of the total are done.
  void Advance(uint64_t units) {
    if (sink_.fn == nullptr) return;
    const uint64_t done = done_.fetch_add(units, std::memory_order_relaxed) + units;
    if (Self() != owner_ || cancel_.load(std::memory_order_relaxed)) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ < std::chrono::milliseconds(kIntervalMs)) return;
    last_ = now;
    Call(done);
  }

  // The calling thread, after the parallel work: the cancellation status.
  Status Finish(const char* what) const {
    if (cancelled()) {
      return Error(MAXSIM_ERR_CANCELLED, "%s was cancelled by the progress callback after %llu of %llu units", what,
                   static_cast<unsigned long long>(done_.load()), static_cast<unsigned long long>(total_));
    }
    return Status::Ok();
  }

 private:
  void Call(uint64_t done) {
    if (sink_.fn(sink_.user_data, done < total_ ? done : total_, total_) != 0) cancel_.store(true);
  }

  const ProgressSink sink_;
  const uint64_t total_;
  const ThreadId owner_;
  std::chrono::steady_clock::time_point last_;
  std::atomic<uint64_t> done_{0};
  std::atomic<bool> cancel_{false};
};

}  // namespace maxsim

#endif  // MAXSIM_SRC_PROGRESS_H_
