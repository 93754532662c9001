// SPDX-License-Identifier: Apache-2.0
// The GPU benchmark's read-bandwidth ceiling kernels (read_bw.cu): variants of a plain read, the best reported.
#ifndef MAXSIM_BENCHMARKS_GPU_READ_BW_H_
#define MAXSIM_BENCHMARKS_GPU_READ_BW_H_

#include <cuda_runtime.h>
#include <stdint.h>

int ReadVariantCount();
const char* ReadVariantName(int variant);
// Whether the variant runs on the current device (the bulk-copy ones need code compiled for sm_90 or later).
bool ReadVariantSupported(int variant);
// Whether the variant's grid is the caller's `blocks` (persistent), rather than one block per 64 KB chunk.
bool ReadVariantPersistent(int variant);
// Bulk-copy variants (one warp per block, up to 192 KB of shared memory): one block per SM.
bool ReadVariantOneBlockPerSm(int variant);
// The bytes the variant reads of `bytes` (bulk variants read whole 32 KB chunks only).
uint64_t ReadVariantBytes(int variant, uint64_t bytes);
// Reads `bytes` (a multiple of 16, 16-byte aligned) from device memory once with variant `variant` and
// `blocks` blocks (persistent variants; others size their own grid).
cudaError_t LaunchReadBandwidth(int variant, const void* data, uint64_t bytes, int blocks, uint32_t* sink,
                                cudaStream_t stream);

#endif  // MAXSIM_BENCHMARKS_GPU_READ_BW_H_
