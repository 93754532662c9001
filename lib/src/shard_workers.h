// SPDX-License-Identifier: Apache-2.0
// Persistent host threads for sharded plugin calls (a context with several devices): shard 0 runs on the calling
// thread, shard s > 0 on worker s - 1, so a call pays one wake-up per shard rather than a thread start and, on a
// fresh thread, the device runtime's per-thread setup. Builds without threads run the shards one after the other
// (plugin_calls.cc) and have no workers.
#ifndef MAXSIM_SRC_SHARD_WORKERS_H_
#define MAXSIM_SRC_SHARD_WORKERS_H_

#include "mutex.h"

#ifndef MAXSIM_SINGLE_THREADED
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace maxsim {

class ShardWorkers {
 public:
  ShardWorkers() = default;
  ShardWorkers(const ShardWorkers&) = delete;
  ShardWorkers& operator=(const ShardWorkers&) = delete;
  ~ShardWorkers() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  // Runs fn(s) for every s in [0, n) at once and returns when all have returned. fn must not throw. One call at a
  // time (the context's plugin mutex serialises them).
  void Run(size_t n, const std::function<void(size_t)>& fn) {
    if (n == 0) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (threads_.size() + 1 < n) {
        const size_t index = threads_.size();
        const uint64_t seen = generation_;
        threads_.emplace_back([this, index, seen] { Loop(index, seen); });
      }
      job_ = &fn;
      shards_ = n;
      pending_ = threads_.size();
      ++generation_;
    }
    wake_.notify_all();
    fn(0);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [this] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  void Loop(size_t index, uint64_t seen) {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      const std::function<void(size_t)>* job = job_;
      const bool mine = index + 1 < shards_;
      lock.unlock();
      if (mine) (*job)(index + 1);
      lock.lock();
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> threads_;
  const std::function<void(size_t)>* job_ = nullptr;
  size_t shards_ = 0;
  size_t pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace maxsim

#endif  // MAXSIM_SINGLE_THREADED

#endif  // MAXSIM_SRC_SHARD_WORKERS_H_
