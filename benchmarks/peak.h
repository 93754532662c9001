// SPDX-License-Identifier: Apache-2.0
// Machine-peak microbenchmarks: f32 FMA throughput and int8 multiply-add throughput per ISA, measured in the
// same process as the MaxSim benchmarks so that every figure can be read as a % of what this core (at this
// clock, on this day) can do.
#ifndef MAXSIM_BENCHMARKS_PEAK_H_
#define MAXSIM_BENCHMARKS_PEAK_H_

#include <cstdint>
#include <string>
#include <vector>

namespace maxsim::bench {

enum class Peak {
  kFmaAvx2,       // vfmadd231ps ymm: 8 lanes x 2 flops per instruction
  kFmaAvx512,     // vfmadd231ps zmm: 16 lanes x 2 flops
  kI8Avx2,        // vpmaddubsw + vpmaddwd + vpaddd ymm: 32 u8*s8 products (64 ops) per sequence
  kI8AvxVnni,     // vpdpbusd ymm (AVX-VNNI): 32 products (64 ops)
  kI8Avx512Vnni,  // vpdpbusd zmm: 64 products (128 ops)
};

struct PeakInfo {
  Peak peak;
  const char* name;  // "fma-f32-avx2"
  const char* unit;  // "GFLOP/s" or "G i8-ops/s"
  bool f32;          // an f32 FMA peak (else int8)
};

const std::vector<PeakInfo>& AllPeaks();
// Whether this CPU (and OS) runs the peak's instructions; if not, why.
bool PeakAvailable(Peak p, std::string* why);
// Runs the peak loop for `iters` iterations on each of `threads` threads (OpenMP); returns the operations
// done in total (2 per multiply-add).
double RunPeak(Peak p, int threads, int64_t iters);
// Best of several short runs, in operations per second (the best run is the least disturbed one).
double MeasurePeak(Peak p, int threads);

}  // namespace maxsim::bench

#endif  // MAXSIM_BENCHMARKS_PEAK_H_
