// SPDX-License-Identifier: Apache-2.0
// The GPU benchmark's read-bandwidth baseline kernel (read_bw.cu).
#ifndef MAXSIM_BENCHMARKS_GPU_READ_BW_H_
#define MAXSIM_BENCHMARKS_GPU_READ_BW_H_

#include <cuda_runtime.h>
#include <stdint.h>

// Reads `bytes` (a multiple of 16, 16-byte aligned) from device memory once with `blocks` blocks of 256 threads.
cudaError_t LaunchReadBandwidth(const void* data, uint64_t bytes, int blocks, uint32_t* sink, cudaStream_t stream);

#endif  // MAXSIM_BENCHMARKS_GPU_READ_BW_H_
