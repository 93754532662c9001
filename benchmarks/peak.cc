// SPDX-License-Identifier: Apache-2.0
// Peak loops. Each runs independent dependency chains (more chains than latency x ports) of one instruction
// sequence, so that the loop is bound by instruction throughput alone. Intrinsics with per-function target
// attributes (no global -m flags); the empty asm statements stop the compiler from hoisting loop-invariant
// work out of the loop, so every iteration issues the full sequence (check with objdump -d).
#include "peak.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>

#include "cpu_features.h"

namespace maxsim::bench {
namespace {

volatile double g_sink = 0;

__attribute__((target("avx2,fma"))) double FmaAvx2(int64_t iters, float seed) {
  // 12 chains: FMA latency 4-5 cycles x 2 pipes needs >= 10.
  __m256 acc[12];
  for (int j = 0; j < 12; ++j) acc[j] = _mm256_set1_ps(seed + 0.01f * j);
  const __m256 m = _mm256_set1_ps(0.9999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
    for (int j = 0; j < 12; ++j) acc[j] = _mm256_fmadd_ps(acc[j], m, b);
  }
  __m256 s = acc[0];
  for (int j = 1; j < 12; ++j) s = _mm256_add_ps(s, acc[j]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0] + out[7];
}

__attribute__((target("avx512f"))) double FmaAvx512(int64_t iters, float seed) {
  __m512 acc[16];
  for (int j = 0; j < 16; ++j) acc[j] = _mm512_set1_ps(seed + 0.01f * j);
  const __m512 m = _mm512_set1_ps(0.9999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
    for (int j = 0; j < 16; ++j) acc[j] = _mm512_fmadd_ps(acc[j], m, b);
  }
  __m512 s = acc[0];
  for (int j = 1; j < 16; ++j) s = _mm512_add_ps(s, acc[j]);
  float out[16];  // (not _mm512_reduce_add_ps: GCC 12's header warns inside it)
  _mm512_storeu_ps(out, s);
  return out[0] + out[15];
}

__attribute__((target("avx2"))) double I8Avx2(int64_t iters, float seed) {
  // The AVX2 u8 x s8 dot-product step: vpmaddubsw (u8*s8 pairs -> i16), vpmaddwd with ones (-> i32), vpaddd.
  __m256i a = _mm256_set1_epi8(static_cast<char>(1 + static_cast<int>(seed)));
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i b[6], acc[6];
  for (int j = 0; j < 6; ++j) {
    // Six distinct nonzero multipliers (-3..-1, 1..3): a zero one makes its product a known 0, and the compiler
    // drops that chain (five chains measured, six counted).
    b[j] = _mm256_set1_epi8(static_cast<char>(j < 3 ? j - 3 : j - 2));
    acc[j] = _mm256_setzero_si256();
  }
  for (int64_t i = 0; i < iters; ++i) {
    __asm__ volatile("" : "+x"(a));  // `a` may have changed: recompute every product
    for (int j = 0; j < 6; ++j) {
      acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(_mm256_maddubs_epi16(a, b[j]), ones));
    }
  }
  __m256i s = acc[0];
  for (int j = 1; j < 6; ++j) s = _mm256_add_epi32(s, acc[j]);
  return static_cast<double>(_mm256_extract_epi32(s, 0));
}

__attribute__((target("avx2,avxvnni"))) double I8AvxVnni(int64_t iters, float seed) {
  const __m256i a = _mm256_set1_epi8(static_cast<char>(1 + static_cast<int>(seed)));
  const __m256i b = _mm256_set1_epi8(-2);
  __m256i acc[12];
  for (int j = 0; j < 12; ++j) acc[j] = _mm256_set1_epi32(j);
  for (int64_t i = 0; i < iters; ++i) {
    for (int j = 0; j < 12; ++j) acc[j] = _mm256_dpbusd_avx_epi32(acc[j], a, b);
  }
  __m256i s = acc[0];
  for (int j = 1; j < 12; ++j) s = _mm256_add_epi32(s, acc[j]);
  return static_cast<double>(_mm256_extract_epi32(s, 0));
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) double I8Avx512Vnni(int64_t iters, float seed) {
  const __m512i a = _mm512_set1_epi8(static_cast<char>(1 + static_cast<int>(seed)));
  const __m512i b = _mm512_set1_epi8(-2);
  __m512i acc[16];
  for (int j = 0; j < 16; ++j) acc[j] = _mm512_set1_epi32(j);
  for (int64_t i = 0; i < iters; ++i) {
    for (int j = 0; j < 16; ++j) acc[j] = _mm512_dpbusd_epi32(acc[j], a, b);
  }
  __m512i s = acc[0];
  for (int j = 1; j < 16; ++j) s = _mm512_add_epi32(s, acc[j]);
  int32_t out[16];
  _mm512_storeu_si512(out, s);
  return static_cast<double>(out[0]) + out[15];
}

// Operations per loop iteration (2 per multiply-add lane).
double OpsPerIter(Peak p) {
  switch (p) {
    case Peak::kFmaAvx2: return 12 * 8 * 2;
    case Peak::kFmaAvx512: return 16 * 16 * 2;
    case Peak::kI8Avx2: return 6 * 32 * 2;
    case Peak::kI8AvxVnni: return 12 * 32 * 2;
    case Peak::kI8Avx512Vnni: return 16 * 64 * 2;
  }
  return 0;
}

double Call(Peak p, int64_t iters, float seed) {
  switch (p) {
    case Peak::kFmaAvx2: return FmaAvx2(iters, seed);
    case Peak::kFmaAvx512: return FmaAvx512(iters, seed);
    case Peak::kI8Avx2: return I8Avx2(iters, seed);
    case Peak::kI8AvxVnni: return I8AvxVnni(iters, seed);
    case Peak::kI8Avx512Vnni: return I8Avx512Vnni(iters, seed);
  }
  return 0;
}

}  // namespace

const std::vector<PeakInfo>& AllPeaks() {
  static const std::vector<PeakInfo> kPeaks = {
      {Peak::kFmaAvx2, "fma-f32-avx2", "GFLOP/s", true},
      {Peak::kFmaAvx512, "fma-f32-avx512", "GFLOP/s", true},
      {Peak::kI8Avx2, "i8-avx2-maddubs", "G i8-ops/s", false},
      {Peak::kI8AvxVnni, "i8-avxvnni-dpbusd", "G i8-ops/s", false},
      {Peak::kI8Avx512Vnni, "i8-avx512vnni-dpbusd", "G i8-ops/s", false},
  };
  return kPeaks;
}

bool PeakAvailable(Peak p, std::string* why) {
  uint64_t need = 0;
  switch (p) {
    case Peak::kFmaAvx2: need = kCpuAVX2 | kCpuFMA; break;
    case Peak::kFmaAvx512: need = kCpuAVX512F; break;
    case Peak::kI8Avx2: need = kCpuAVX2; break;
    case Peak::kI8AvxVnni: need = kCpuAVX2 | kCpuAVXVNNI; break;
    case Peak::kI8Avx512Vnni: need = kCpuAVX512F | kCpuAVX512BW | kCpuAVX512VNNI; break;
  }
  const uint64_t missing = need & ~GetCpuInfo().features;
  if (missing && why) *why = "this CPU lacks " + FeatureNames(missing);
  return missing == 0;
}

double RunPeak(Peak p, int threads, int64_t iters) {
  double sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
  sink += Call(p, iters, 0.5f + 0.001f * omp_get_thread_num());
  g_sink = g_sink + sink;
  return OpsPerIter(p) * static_cast<double>(iters) * threads;
}

double MeasurePeak(Peak p, int threads) {
  using Clock = std::chrono::steady_clock;
  // Calibrate on one thread to ~20 ms of work (every thread then gets the same work, so an undisturbed run at
  // any thread count also takes ~20 ms; calibrating with several threads would let a scheduling delay of the
  // calibration run fix a tiny, overhead-dominated size), then keep the best of 7 runs.
  int64_t iters = 1 << 12;
  for (;;) {
    const auto t0 = Clock::now();
    g_sink = g_sink + Call(p, iters, 0.5f);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s > 0.02 || iters > (int64_t{1} << 34)) break;
    iters = s > 0.002 ? static_cast<int64_t>(iters * (0.02 / s)) + 1 : iters * 8;
  }
  double best = 0;
  for (int r = 0; r < 7; ++r) {
    const auto t0 = Clock::now();
    const double ops = RunPeak(p, threads, iters);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, ops / s);
  }
  return best;
}

}  // namespace maxsim::bench
