// SPDX-License-Identifier: Apache-2.0
// CK(call): the plain-CUDA probes' check (api_floor_probe.cu, launch_probe.cu): a failed CUDA runtime call prints
// where and why on stderr and exits 1.
#ifndef MAXSIM_BENCHMARKS_GPU_CUDA_CHECK_H_
#define MAXSIM_BENCHMARKS_GPU_CUDA_CHECK_H_

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

#endif  // MAXSIM_BENCHMARKS_GPU_CUDA_CHECK_H_
