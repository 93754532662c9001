// SPDX-License-Identifier: Apache-2.0
// Copy-only twins of the exact ring kernels' schedules (schedule_read.cu), for the GPU benchmark's
// read-ring-schedule and read-grid-schedule rows: what a kernel that reads a shape's documents exactly as the
// scoring kernel does, and computes nothing, takes; read-dealt-schedule, the dealt kernel's; and read-cyclic-schedule
// and its variants, schedules no kernel runs (ceilings for one).
#ifndef MAXSIM_BENCHMARKS_GPU_SCHEDULE_READ_H_
#define MAXSIM_BENCHMARKS_GPU_SCHEDULE_READ_H_

#include <cuda_runtime.h>

#include "kernels.h"

// Whether the twins apply to `a` (the arguments of a one-group dot launch of 16-bit rows, dim <= 128, at most 32
// query rows: the launches the ring and the grid take), MT = 1 for up to 16 query rows, else 2.
bool ScheduleReadApplies(const mscuda::ForwardArgs& a, uint64_t max_lq);
// Which kernel the plugin's exact call with arguments `a` runs on a device of `sms` SMs (exact.cu, LaunchTcMt and
// LaunchPipe: the dealt kernel where DealtChosen says so and the grid does not, else the ring where its pairs fill
// the warp rings, then the grid where CoopChosen says so): "dealt", "ring", "grid", or "other" (none of them).
const char* ExactScheduleName(const mscuda::ForwardArgs& a, uint64_t max_lq, int sms);
// ExactTcPipeKernel's schedule (exact.cu, 8 warps x 3 stages, one block per SM): `sms` blocks, each warp a
// contiguous range of pairs. One float per pair goes to a.pairs.scores (not a score).
cudaError_t LaunchRingScheduleRead(const mscuda::ForwardArgs& a, uint64_t max_lq, int sms, cudaStream_t stream);
// ExactTcCoopKernel's schedule (exact_coop.cu, 4 warps x 2 stages, 3 blocks per SM): one block per pair. with_mma
// adds the kernel's tensor-core instructions to every step, as LaunchDealtScheduleRead's does (below).
cudaError_t LaunchGridScheduleRead(const mscuda::ForwardArgs& a, uint64_t max_lq, bool with_mma,
                                   cudaStream_t stream);
// Schedules that no kernel runs (ceilings for one): the ring's warps and stages over a one-query launch whose
// documents all have `doc_rows` rows (the caller's word for it), the launch's steps dealt out by `deal`:
//  kCyclic       step k to warp k % W, so that at any moment the warps read one contiguous stretch of the corpus,
//                as a plain read does;
//  kCyclicMerge  the same, with the global-memory merge of each document's row maxima a scoring kernel on it would
//                need after every step (schedule_read.cu says how);
//  kBalanced     each warp a contiguous range of steps, as many to within one (documents split between warps).
// One float per document goes to a.pairs.scores (not a score).
enum SpreadSchedule { kCyclic = 0, kCyclicMerge = 1, kBalanced = 2 };
cudaError_t LaunchSpreadScheduleRead(const mscuda::ForwardArgs& a, uint64_t max_lq, uint64_t doc_rows, int sms,
                                     SpreadSchedule deal, cudaStream_t stream);
// The dealt kernel's schedule (exact_dealt.cu: 12 warps x 2 stages): one block per SM (at most 32 documents each),
// documents dealt to the blocks round-robin and each block's steps to its warps round-robin, the warps meeting at
// block barriers at the end of every round of 8 documents (where the kernel merges its row maxima). One float per
// document. with_mma adds the kernel's tensor-core instructions to every step (schedule_read.cu's StepMma: the
// mma.sync chains of a query of max_lq rows in FoldRingStep's order, on the copied bytes, and the scores-only fold;
// no ldmatrix fragments, query copy or merges): what issuing them, and the SM clock the GPU then runs at, adds to
// this twin's time.
cudaError_t LaunchDealtScheduleRead(const mscuda::ForwardArgs& a, uint64_t max_lq, uint64_t doc_rows, int sms,
                                    bool with_mma, cudaStream_t stream);

#endif  // MAXSIM_BENCHMARKS_GPU_SCHEDULE_READ_H_
