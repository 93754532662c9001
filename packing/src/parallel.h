// SPDX-License-Identifier: Apache-2.0
// The one way the library runs a loop of tasks on several threads: an OpenMP team only when the work is split,
// else a plain loop on the calling thread. An `omp parallel if (false)` region is not free: libgomp still builds a
// team of one, hands it the work and synchronises it (futex calls), about 15% of a small call (1 x 32 query
// against one document) when every region of the call was entered that way.
#ifndef MAXSIM_SRC_PARALLEL_H_
#define MAXSIM_SRC_PARALLEL_H_

#include <cstdint>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace maxsim {

// Runs tasks [0, n). make_worker(thread) is called once per thread (0 .. threads-1) and returns that thread's
// worker, a callable taking a task index (it owns or refers to the thread's scratch state). With split true and
// threads > 1 the tasks are shared out dynamically in chunks of `chunk` among `threads` OpenMP threads; otherwise
// thread 0's worker runs them in order on the calling thread, with no OpenMP region at all (the same tasks and
// the same per-task results: callers make results independent of which thread ran a task).
template <typename MakeWorker>
void ParallelTasks(int threads, bool split, int64_t n, int64_t chunk, MakeWorker&& make_worker) {
#ifdef _OPENMP
  if (split && threads > 1) {
#pragma omp parallel num_threads(threads)
    {
      auto worker = make_worker(omp_get_thread_num());
#pragma omp for schedule(dynamic, chunk)
      for (int64_t i = 0; i < n; ++i) worker(i);
    }
    return;
  }
#else
  (void)threads;
  (void)split;
  (void)chunk;
#endif
  auto worker = make_worker(0);
  for (int64_t i = 0; i < n; ++i) worker(i);
}

}  // namespace maxsim

#endif  // MAXSIM_SRC_PARALLEL_H_
