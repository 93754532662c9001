// SPDX-License-Identifier: Apache-2.0
// Copy-only twins of the exact ring kernels' schedules (schedule_read.cu), for the GPU benchmark's
// read-ring-schedule and read-grid-schedule rows: what a kernel that reads a shape's documents exactly as the
// scoring kernel does, and computes nothing, takes. And read-cyclic-schedule: a schedule no kernel runs yet.
#ifndef MAXSIM_BENCHMARKS_GPU_SCHEDULE_READ_H_
#define MAXSIM_BENCHMARKS_GPU_SCHEDULE_READ_H_

#include <cuda_runtime.h>

#include "kernels.h"

// Whether the twins apply to `a` (the arguments of a one-group dot launch of 16-bit rows, dim <= 128, at most 32
// query rows: the launches the ring and the grid take), MT = 1 for up to 16 query rows, else 2.
bool ScheduleReadApplies(const mscuda::ForwardArgs& a, uint64_t max_lq);
// Which of the two the plugin's exact call with arguments `a` runs on a device of `sms` SMs (exact.cu, LaunchTcMt and
// LaunchPipe: the ring where its pairs fill the warp rings, then the grid where CoopChosen says so): "ring",
// "grid", or "other" (neither).
const char* ExactScheduleName(const mscuda::ForwardArgs& a, uint64_t max_lq, int sms);
// ExactTcPipeKernel's schedule (exact.cu, 8 warps x 3 stages, one block per SM): `sms` blocks, each warp a
// contiguous range of pairs. One float per pair goes to a.pairs.scores (not a score).
cudaError_t LaunchRingScheduleRead(const mscuda::ForwardArgs& a, uint64_t max_lq, int sms, cudaStream_t stream);
// ExactTcCoopKernel's schedule (exact_coop.cu, 4 warps x 2 stages, 3 blocks per SM): one block per pair.
cudaError_t LaunchGridScheduleRead(const mscuda::ForwardArgs& a, uint64_t max_lq, cudaStream_t stream);
// A schedule that no kernel runs (a ceiling for one): the ring's warps and stages over a one-query launch whose
// documents all have `doc_rows` rows (the caller's word for it), dealt out step by step (step k of the launch to
// warp k % W), so that at any moment the warps read one contiguous stretch of the corpus, as a plain read does.
// One float per document goes to a.pairs.scores (not a score).
cudaError_t LaunchCyclicScheduleRead(const mscuda::ForwardArgs& a, uint64_t max_lq, uint64_t doc_rows, int sms,
                                     cudaStream_t stream);

#endif  // MAXSIM_BENCHMARKS_GPU_SCHEDULE_READ_H_
