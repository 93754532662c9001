// SPDX-License-Identifier: Apache-2.0
// The library's mutex: std::mutex, or in a build without threads (WebAssembly without shared memory, whose
// libc++ has no <mutex>) a type whose lock and unlock do nothing, since there is no second thread to exclude.
#ifndef MAXSIM_SRC_MUTEX_H_
#define MAXSIM_SRC_MUTEX_H_

#if defined(__wasm__) && !defined(_REENTRANT)
#define MAXSIM_SINGLE_THREADED 1
#else
#include <mutex>
#endif

namespace maxsim {

#ifdef MAXSIM_SINGLE_THREADED
struct Mutex {
  void lock() {}
  void unlock() {}
};
struct LockGuard {
  explicit LockGuard(Mutex&) {}
};
#else
using Mutex = std::mutex;
using LockGuard = std::lock_guard<std::mutex>;
#endif

}  // namespace maxsim

#endif  // MAXSIM_SRC_MUTEX_H_
