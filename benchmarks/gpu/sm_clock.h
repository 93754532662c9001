// SPDX-License-Identifier: Apache-2.0
// The SM clock a row's launches actually ran at, measured inside the run (sm_clock.cu): each SM's cycle counter
// (%clock64) against the GPU's nanosecond timer (%globaltimer), read by a stamp launch before and after a batch of
// the row's calls on the same stream: the rate the SMs' cycles advanced at while those calls ran. (On the H100,
// nvidia-smi's clocks.sm, sampled every 20 ms, stayed at 1980 MHz while kernels issuing mma ran at 1.8 GHz by this
// measure: benchmarks/results/gpu-clock-h100.md and gpu-h100.md.)
#ifndef MAXSIM_BENCHMARKS_GPU_SM_CLOCK_H_
#define MAXSIM_BENCHMARKS_GPU_SM_CLOCK_H_

#include <cuda_runtime.h>

#include <functional>
#include <string>

struct SmClock {
  double mhz = 0;             // median over rounds of the median SM's cycles per microsecond
  double mhz_low = 0;         // the slowest SM of any round
  double mhz_high = 0;        // the fastest SM of any round
  double cycles_per_call = 0; // median over rounds of the median SM's cycles between the stamps, per call
  double ns_per_call = 0;     // the same for the global timer's nanoseconds: the calls' time, back to back
  int sms = 0;                // SMs that both stamps reached, in the round with fewest (a row where it is under
                              // the device's count leaves some SMs out of its medians)
  // The fields above as JSON members ("sm_mhz": ..., ...), for a benchmark row; empty when nothing was measured.
  std::string Json() const;
};

// `rounds` times: a stamp launch, calls fn(0) ... fn(calls - 1) on `stream`, another stamp launch. Each SM's
// cycles over the nanoseconds between its last stamp before and its first stamp after (the launches in between, and
// the gaps between them, which the kernel rows' events also hold). Errors come back as the CUDA status.
cudaError_t MeasureSmClock(cudaStream_t stream, int sms, int rounds, int calls, const std::function<void(int)>& fn,
                           SmClock* out);

// One block that spins for `ns` nanoseconds (by %globaltimer) while the other SMs idle: MeasureSmClock around it
// tells whether an idle SM's counter keeps the clock's pace (then gaps between launches count at full rate).
cudaError_t LaunchSpin(unsigned long long ns, cudaStream_t stream);

// The global timer against the host's steady clock: one block spins for `ns` nanoseconds between two stamps, and
// *ratio is the timer's span over the host's span from before the launches to after the stream's synchronisation
// (which also holds the launches' latency: about 0.1% of a 50 ms spin). Near 1: MHz by the timer are MHz.
cudaError_t TimerAgainstHost(cudaStream_t stream, unsigned long long ns, double* ratio);

#endif  // MAXSIM_BENCHMARKS_GPU_SM_CLOCK_H_
