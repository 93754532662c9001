// SPDX-License-Identifier: Apache-2.0
// isa_probe: what the x86 kernels assume about the machine, measured on it (one core).
//   1. Peaks of the instruction sequences the kernels are built on (independent chains, registers only):
//      f32 FMA (ymm, zmm), the AVX2 sign-trick i8 sequence, vpdpbusd, vdpbf16ps, AMX tdpbssd / tdpbf16ps.
//   2. Semantics: does vdpbf16ps / AMX tdpbf16ps reproduce the canonical f32 FMA chain bit for bit, and with
//      which order inside a pair (docs/kernels.md uses this to decide what may run in exact mode).
// Each probe runs only if the CPU has the feature (cpu_features.cc decides, AMX permission included).
// Output: one line per measurement; "peak" lines give G multiply-adds/s (x2 for GFLOP/s or GSO/s).
// A peak loop measures throughput only if its chains stay independent in the generated code: a compiler may
// merge chains it can prove equal (equal start values and inputs) or compute a repeated product once. Every
// accumulator's start value and every per-chain input therefore passes through OPAQUE, so that the compiler
// knows none of them (`objdump -d` of the loop shows one instruction per chain and step, with GCC and clang).
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu_features.h"
#include "half.h"
#include "kernels/x86/amx_tiles.h"
#include "kernels/x86/x86_kernels.h"

namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

#define TGT_AVX2 __attribute__((target("avx2,fma")))
#define TGT_512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#define TGT_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define TGT_AMX __attribute__((target("avx512f,amx-tile,amx-int8,amx-bf16")))

constexpr long kIters = 20000000;

// The compiler forgets v's value (no instruction is emitted). reg: "x" (xmm/ymm 0-15) or "v" (AVX-512: 0-31).
#define OPAQUE(v, reg) __asm__ volatile("" : "+" reg(v))

TGT_AVX2 double PeakFmaYmm() {
  __m256 a[12];
  const __m256 b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-3f);
  for (int i = 0; i < 12; ++i) {
    a[i] = _mm256_set1_ps(static_cast<float>(i));
    OPAQUE(a[i], "x");
  }
  const auto t0 = Clock::now();
  for (long it = 0; it < kIters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) a[i] = _mm256_fmadd_ps(a[i], b, c);
  }
  const double s = Seconds(t0);
  float sink = 0;
  for (int i = 0; i < 12; ++i) sink += _mm256_cvtss_f32(a[i]);
  if (sink == 1234.5f) std::printf(" ");
  return 12.0 * 8 * kIters / s / 1e9;
}

TGT_512 double PeakFmaZmm() {
  __m512 a[24];
  const __m512 b = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-3f);
  for (int i = 0; i < 24; ++i) {
    a[i] = _mm512_set1_ps(static_cast<float>(i));
    OPAQUE(a[i], "v");
  }
  const auto t0 = Clock::now();
  for (long it = 0; it < kIters; ++it) {
#pragma GCC unroll 24
    for (int i = 0; i < 24; ++i) a[i] = _mm512_fmadd_ps(a[i], b, c);
  }
  const double s = Seconds(t0);
  float sink = 0;
  for (int i = 0; i < 24; ++i) sink += _mm512_reduce_add_ps(a[i]);
  if (sink == 1234.5f) std::printf(" ");
  return 24.0 * 16 * kIters / s / 1e9;
}

// The AVX2 screening kernel's inner step: vpsignb, vpmaddubsw, vpmaddwd, vpaddd per 32 multiply-adds. The
// query vector is made opaque before every chain's step: with a known-equal query, the compiler computes the
// product once per distinct query and only the vpaddd per chain (2 products for 8 chains, a 4x overstated peak).
TGT_AVX2 double PeakSignTrick() {
  __m256i acc[8];
  __m256i q = _mm256_set1_epi8(3);
  const __m256i d = _mm256_set1_epi32(0x01FF7F80), ones = _mm256_set1_epi16(1);
  const __m256i da = _mm256_abs_epi8(d);
  for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_si256();
  const auto t0 = Clock::now();
  for (long it = 0; it < kIters; ++it) {
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      OPAQUE(q, "x");
      const __m256i t = _mm256_sign_epi8(q, d);
      acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(da, t), ones));
    }
  }
  const double s = Seconds(t0);
  int sink = 0;
  for (int i = 0; i < 8; ++i) sink += _mm256_extract_epi32(acc[i], 0);
  if (sink == 12345) std::printf(" ");
  return 8.0 * 32 * kIters / s / 1e9;
}

TGT_512 double PeakVnni() {
  __m512i acc[16];
  __m512i q = _mm512_set1_epi8(3);
  const __m512i d = _mm512_set1_epi32(0x01FF7F80);
  for (int i = 0; i < 16; ++i) {
    acc[i] = _mm512_set1_epi32(i);
    OPAQUE(acc[i], "v");
  }
  const auto t0 = Clock::now();
  for (long it = 0; it < kIters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], q, d);
    OPAQUE(q, "v");  // no constant product to fold into an add
  }
  const double s = Seconds(t0);
  int sink = 0;
  for (int i = 0; i < 16; ++i) sink += _mm512_reduce_add_epi32(acc[i]);
  if (sink == 12345) std::printf(" ");
  return 16.0 * 64 * kIters / s / 1e9;
}

TGT_BF16 double PeakBf16() {
  __m512 acc[16];
  __m512i q = _mm512_set1_epi32(0x3F803F80);
  const __m512i d = _mm512_set1_epi32(0x3F003F00);
  for (int i = 0; i < 16; ++i) {
    acc[i] = _mm512_set1_ps(static_cast<float>(i));
    OPAQUE(acc[i], "v");
  }
  const auto t0 = Clock::now();
  for (long it = 0; it < kIters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)q, (__m512bh)d);
    OPAQUE(q, "v");
  }
  const double s = Seconds(t0);
  float sink = 0;
  for (int i = 0; i < 16; ++i) sink += _mm512_reduce_add_ps(acc[i]);
  if (sink == 1234.5f) std::printf(" ");
  return 16.0 * 32 * kIters / s / 1e9;
}

// Four C tiles, two A, two B, all resident: the tile unit alone.
TGT_AMX double PeakAmx(bool bf16) {
  alignas(64) static int8_t data[16 * 64];
  for (int i = 0; i < 16 * 64; ++i) data[i] = static_cast<int8_t>(i % 7 == 0 ? 0 : 1);  // small bf16 values
  maxsim::x86::AmxConfigure16x64();
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, data, 64);
  _tile_loadd(5, data, 64);
  _tile_loadd(6, data, 64);
  _tile_loadd(7, data, 64);
  const long iters = kIters / 20;
  const auto t0 = Clock::now();
  if (bf16) {
    for (long it = 0; it < iters; ++it) {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  } else {
    for (long it = 0; it < iters; ++it) {
      _tile_dpbssd(0, 4, 6);
      _tile_dpbssd(1, 4, 7);
      _tile_dpbssd(2, 5, 6);
      _tile_dpbssd(3, 5, 7);
    }
  }
  alignas(64) static int32_t out[256];
  _tile_stored(0, out, 64);
  __asm__ volatile("" ::: "memory");
  const double s = Seconds(t0);
  _tile_release();
  const double macs_per_op = bf16 ? 16.0 * 16 * 32 : 16.0 * 16 * 64;
  return 4.0 * macs_per_op * iters / s / 1e9;
}

// Do the tile unit and AVX-512 overlap? The amx kernel's shape at Lq = Ld = 1024 (d = 128), one document: per
// block of 32 rows x 32 query lanes, 2 k steps of 4 tile loads + 4 tdpbssd, 4 tile stores (4 KB), and an
// epilogue of 64 key vectors (vcvtdq2ps, vmulps by the row scale, vmaxps; the loads read the other 2 KB half
// of the previous block's stores, as the kernel does). Timed three ways: tiles only, epilogue only (on the same
// buffers), both; prints microseconds per document. If the two overlapped, "both" would be near the larger
// of the other two. On a Sapphire Rapids-class core it is close to their sum (docs/kernels.md): the
// epilogue's instruction count adds to the tile time, which is why the amx kernel keeps it minimal.
struct AmxOverlap {
  double tiles_us, epilogue_us, both_us;
};
template <bool kTiles, bool kEpilogue>
TGT_AMX double AmxOverlapRun(const int8_t* codes, const int8_t* ql, size_t bs, const float* scale, int32_t* c,
                             float* sink) {
  __m512 top = _mm512_set1_ps(-1e30f);
  const auto t0 = Clock::now();
  for (int gp = 0; gp < 1024 / 32; ++gp) {
    const int8_t* b0 = ql + gp * 32 * 4;
    for (int j = 0; j < 1024; j += 32) {
      const int8_t* a0 = codes + j * 128;
      if (kTiles) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int kb = 0; kb < 2; ++kb) {
          _tile_loadd(4, a0 + kb * 64, 128);
          _tile_loadd(5, a0 + 16 * 128 + kb * 64, 128);
          _tile_loadd(6, b0 + kb * 16 * bs, bs);
          _tile_loadd(7, b0 + 64 + kb * 16 * bs, bs);
          _tile_dpbssd(0, 4, 6);
          _tile_dpbssd(1, 4, 7);
          _tile_dpbssd(2, 5, 6);
          _tile_dpbssd(3, 5, 7);
        }
        _tile_stored(0, c, 64);
        _tile_stored(1, c + 256, 64);
      }
      __asm__ volatile("" ::: "memory");
      if (kEpilogue) {
        for (int t = 0; t < 4; ++t) {
          const int32_t* src = c + (t < 2 ? 512 + t * 256 : (t - 2) * 256);
          const int row0 = t < 2 ? j - 16 : j;
          __m512 m = _mm512_set1_ps(-1e30f);
          for (int r = 0; r < 16; ++r) {
            const __m512 x = _mm512_cvtepi32_ps(_mm512_load_si512(src + r * 16));
            m = _mm512_max_ps(m, _mm512_mul_ps(x, _mm512_set1_ps(scale[(row0 + r) & 1023])));
          }
          top = _mm512_max_ps(top, m);
          if (t == 1 && kTiles) {
            __asm__ volatile("" ::: "memory");
            _tile_stored(2, c + 512, 64);
            _tile_stored(3, c + 768, 64);
            __asm__ volatile("" ::: "memory");
          }
        }
      } else if (kTiles) {
        _tile_stored(2, c + 512, 64);
        _tile_stored(3, c + 768, 64);
      }
      __asm__ volatile("" ::: "memory");
    }
  }
  const double s = Seconds(t0);
  *sink += _mm512_reduce_max_ps(top);
  return s * 1e6;
}

TGT_AMX AmxOverlap AmxOverlapProbe() {
  const size_t bs = 1040 * 4;  // the query layout's row stride at Lq = 1024 (LaneStride)
  // 64-byte aligned like the packed codes and the query layout (a tile row split across two lines costs ~2.4x).
  alignas(64) static int8_t codes[1024 * 128], ql[32 * 1040 * 4 + 64];
  std::vector<float> scale(1024);
  std::mt19937 rng(3);
  for (auto& v : codes) v = static_cast<int8_t>(rng() % 255 - 127);
  for (auto& v : ql) v = static_cast<int8_t>(rng() % 255 - 127);
  for (auto& v : scale) v = 1e-3f * static_cast<float>(1 + rng() % 7);
  alignas(64) static int32_t c[1024];
  float sink = 0;
  maxsim::x86::AmxConfigure16x64();
  AmxOverlap r{1e30, 1e30, 1e30};
  for (int rep = 0; rep < 20; ++rep) {
    r.tiles_us = std::min(r.tiles_us, AmxOverlapRun<true, false>(codes, ql, bs, scale.data(), c, &sink));
    r.epilogue_us = std::min(r.epilogue_us, AmxOverlapRun<false, true>(codes, ql, bs, scale.data(), c, &sink));
    r.both_us = std::min(r.both_us, AmxOverlapRun<true, true>(codes, ql, bs, scale.data(), c, &sink));
  }
  _tile_release();
  if (sink == 1234.5f) std::printf(" ");
  return r;
}

// AMX-BF16 semantics: C (16 x 16 f32) += A (16 x 32 bf16) . B (16 pairs x 16 columns x 2), chained over
// `steps` instructions, against the canonical chain over k in both pair orders.
TGT_AMX void AmxBf16Semantics(int steps, int* match_natural, int* match_swapped, int* total, float* example) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> expo(-20, 4), mant(0, 127), sgn(0, 1);
  auto value = [&]() -> uint16_t {
    return static_cast<uint16_t>((sgn(rng) << 15) | ((127 + expo(rng)) << 7) | mant(rng));
  };
  alignas(64) static uint16_t a[8][16 * 32], b[8][16 * 32];
  alignas(64) static float c[16 * 16], init[16 * 16];
  for (int s = 0; s < steps; ++s) {
    for (int i = 0; i < 16 * 32; ++i) {
      a[s][i] = value();
      b[s][i] = value();
    }
  }
  for (int i = 0; i < 256; ++i) init[i] = maxsim::Bf16ToF32(value());
  std::memcpy(c, init, sizeof(c));
  maxsim::x86::AmxConfigure16x64();
  _tile_loadd(0, c, 64);
  for (int s = 0; s < steps; ++s) {
    _tile_loadd(4, a[s], 64);
    _tile_loadd(6, b[s], 64);
    _tile_dpbf16ps(0, 4, 6);
  }
  _tile_stored(0, c, 64);
  __asm__ volatile("" ::: "memory");
  _tile_release();
  *match_natural = *match_swapped = *total = 0;
  for (int m = 0; m < 16; ++m) {
    for (int n = 0; n < 16; ++n) {
      float nat = init[m * 16 + n], swp = nat;
      for (int s = 0; s < steps; ++s) {
        for (int kk = 0; kk < 16; ++kk) {
          const float a0 = maxsim::Bf16ToF32(a[s][m * 32 + 2 * kk]), a1 = maxsim::Bf16ToF32(a[s][m * 32 + 2 * kk + 1]);
          const float b0 = maxsim::Bf16ToF32(b[s][kk * 32 + 2 * n]), b1 = maxsim::Bf16ToF32(b[s][kk * 32 + 2 * n + 1]);
          nat = std::fma(a1, b1, std::fma(a0, b0, nat));
          swp = std::fma(a0, b0, std::fma(a1, b1, swp));
        }
      }
      const float got = c[m * 16 + n];
      *match_natural += std::memcmp(&got, &nat, 4) == 0;
      *match_swapped += std::memcmp(&got, &swp, 4) == 0;
      ++*total;
      if (m == 0 && n == 0) {
        example[0] = got;
        example[1] = nat;
        example[2] = swp;
      }
    }
  }
}

}  // namespace

int main() {
  using namespace maxsim;
  const CpuInfo& cpu = GetCpuInfo();
  std::printf("cpu: %s; features: %s\n", cpu.brand.c_str(), FeatureNames(cpu.features).c_str());
  if (!cpu.amx_note.empty()) std::printf("amx: %s\n", cpu.amx_note.c_str());
  const bool avx2 = (cpu.features & (kCpuAVX2 | kCpuFMA)) == (kCpuAVX2 | kCpuFMA);
  const bool avx512 = (cpu.features & (kCpuAVX512F | kCpuAVX512BW | kCpuAVX512VL | kCpuAVX512DQ | kCpuAVX512VNNI)) ==
                      (kCpuAVX512F | kCpuAVX512BW | kCpuAVX512VL | kCpuAVX512DQ | kCpuAVX512VNNI);
  const bool bf16 = avx512 && (cpu.features & kCpuAVX512BF16);
  const bool amx = (cpu.features & (kCpuAMXTile | kCpuAMXInt8 | kCpuAMXPermitted)) ==
                   (kCpuAMXTile | kCpuAMXInt8 | kCpuAMXPermitted);
  const bool amx_bf16 = amx && (cpu.features & kCpuAMXBF16);
  if (avx2) {
    const double y = PeakFmaYmm();
    std::printf("peak  f32 FMA ymm (12 chains)          %8.1f G multiply-adds/s = %7.1f GFLOP/s\n", y, 2 * y);
    std::printf("peak  AVX2 vpsignb+maddubsw+maddwd+add %8.1f G i8 multiply-adds/s\n", PeakSignTrick());
  }
  if (avx512) {
    const double z = PeakFmaZmm();
    std::printf("peak  f32 FMA zmm (24 chains)          %8.1f G multiply-adds/s = %7.1f GFLOP/s\n", z, 2 * z);
    std::printf("peak  vpdpbusd zmm (16 chains)         %8.1f G i8 multiply-adds/s\n", PeakVnni());
  }
  if (bf16) {
    std::printf("peak  vdpbf16ps zmm (16 chains)        %8.1f G bf16 multiply-adds/s\n", PeakBf16());
    std::string why;
    const int v = x86::kBf16DotVariants.decide(&why);
    std::printf("semantics vdpbf16ps: %s; exact bf16 path chosen: %s\n", why.c_str(), x86::kBf16DotVariants.names[v]);
  }
  if (amx) std::printf("peak  AMX tdpbssd (4 C tiles)          %8.1f G i8 multiply-adds/s\n", PeakAmx(false));
  if (amx) {
    const AmxOverlap o = AmxOverlapProbe();
    std::printf("overlap AMX tiles + AVX-512 epilogue, 1024 x 1024 document: tiles %.1f us, epilogue %.1f us, both "
                "%.1f us (%.0f%% of the sum; 50%% would be full overlap)\n",
                o.tiles_us, o.epilogue_us, o.both_us, 100.0 * o.both_us / (o.tiles_us + o.epilogue_us));
  }
  if (amx_bf16) {
    std::printf("peak  AMX tdpbf16ps (4 C tiles)        %8.1f G bf16 multiply-adds/s\n", PeakAmx(true));
    for (int steps : {1, 4}) {
      int nat = 0, swp = 0, total = 0;
      float ex[3];
      AmxBf16Semantics(steps, &nat, &swp, &total, ex);
      std::printf("semantics tdpbf16ps, %d instruction(s) (k = %d): %d/%d outputs equal the canonical chain, %d/%d "
                  "the pair-swapped chain (C[0][0]: %.9g, chain %.9g, swapped %.9g)\n",
                  steps, 32 * steps, nat, total, swp, total, ex[0], ex[1], ex[2]);
    }
  }
  return 0;
}
