// SPDX-License-Identifier: Apache-2.0
// Kernel "avx512-vnni": exact path from exact_hwy.cc (Highway AVX3 target), i8 screening with AVX-512 VNNI.
//
// Instructions: vpdpbusd zmm (16 lanes x 4 byte products, accumulated in i32 without saturation) with the
// document's 4 codes as an embedded {1to16} broadcast memory operand, vmovdqu64 of the query. Highway 1.0.3
// has no wrapper for vpdpbusd, hence hand intrinsics under target("...,avx512vnni").
// Signs: vpdpbusd multiplies unsigned by signed bytes. The query is stored once per call with a +128 bias
// (q8 xor 0x80 = q8 + 128 in [1, 255], I8QueryLayout); the document codes stay signed. Then
// sum (q + 128) d = I + 128 * code_sum(d), and the accumulator starts at -128 * code_sum(d) (packed metadata)
// so it ends at exactly I. Intermediate sums may wrap for huge dims, but the arithmetic is modulo 2^32 and
// the final I fits in i32 (|I| <= 127^2 * 65536), so the result is exact for every packed buffer.
// Tile: 2 query vectors (32 tokens) x 8 document rows = 16 zmm accumulators + 2 query = 18 of 32 registers;
// 16 vpdpbusd per k-group of 4, 2 query loads, broadcasts folded into the vpdpbusd. 16 independent chains
// cover vpdpbusd's 5-cycle latency. After the k loop: vcvtdq2ps, vmulps by the row scale and by the lanes'
// query scales (the key A), vmaxps (top), one 64-byte store of the keys per row and query vector. The rest
// (selection, bounds, refinement) is screen_hwy-inl.h (Highway AVX3).
#include <immintrin.h>

#include <cstring>
#include <limits>

// GCC 12's avx512fintrin.h builds _mm512_cvtepi32_ps / _mm512_max_ps on _mm512_undefined_ps(), a
// self-initialised variable that -Wmaybe-uninitialized reports wrongly once inlined (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "kernels/x86/x86_kernels.h"

#define MAXSIM_TARGET_VNNI \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

namespace maxsim {
namespace x86 {
namespace {

constexpr uint32_t kW = 16;

// acc += q (unsigned bytes) x d (signed bytes), in place. GCC 12 compiles _mm512_dpbusd_epi32 in a 16-accumulator
// loop with a register copy per instruction and accumulator spills (checked in the disassembly: ~50
// instructions per 16 vpdpbusd); the asm keeps every accumulator in its register. Clang's codegen is clean.
MAXSIM_TARGET_VNNI inline void Dp(__m512i& acc, __m512i q, __m512i d) {
#if defined(__GNUC__) && !defined(__clang__)
  __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(q), "v"(d));
#else
  acc = _mm512_dpbusd_epi32(acc, q, d);
#endif
}

template <int NQ, int R, bool kCos>
MAXSIM_TARGET_VNNI inline void Tile(const uint8_t* ql, size_t qstride, uint32_t groups4, const int8_t* codes,
                             uint32_t padded_dim, uint32_t j, const maxsim_vector_meta* meta, const float* inv,
                             const __m512* sq, float* K, size_t group_stride, __m512* top) {
  __m512i acc[NQ][R];
  const int8_t* rp[R];
  for (int r = 0; r < R; ++r) {
    const __m512i start = _mm512_set1_epi32(CodeSumBias(meta[j + r].code_sum));
    for (int i = 0; i < NQ; ++i) acc[i][r] = start;
    rp[r] = codes + static_cast<size_t>(j + r) * padded_dim;
  }
  for (uint32_t g = 0; g < groups4; ++g) {
    __m512i qv[NQ];
    for (int i = 0; i < NQ; ++i) qv[i] = _mm512_loadu_si512(ql + g * qstride + i * 64);
    for (int r = 0; r < R; ++r) {
      int32_t dw;
      std::memcpy(&dw, rp[r] + 4 * g, 4);
      const __m512i dv = _mm512_set1_epi32(dw);
      for (int i = 0; i < NQ; ++i) Dp(acc[i][r], qv[i], dv);
    }
  }
  for (int r = 0; r < R; ++r) {
    const __m512 sd = _mm512_set1_ps(meta[j + r].scale);
    for (int i = 0; i < NQ; ++i) {
      // key = fl(fl(fl(float(I) * s_d) * s_q) [* inv]), the portable kernel's expression.
      const __m512 a = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc[i][r]), sd), sq[i]);
      const __m512 key = kCos ? _mm512_mul_ps(a, _mm512_set1_ps(inv[j + r])) : a;
      _mm512_store_ps(K + i * group_stride + static_cast<size_t>(j + r) * kW, key);
      top[i] = _mm512_max_ps(key, top[i]);  // a NaN key returns top: ignored
    }
  }
}

// The i8 phase of one document for NQ query groups (BiasedLayoutKeys, x86_kernels.h).
struct ZmmRows {
  template <int NQ, bool kCos>
  MAXSIM_TARGET_VNNI static void Run(const uint8_t* ql, size_t qstride, uint32_t groups4, const DocRef& d,
                                      const float* inv, const float* sq_lanes, float* K, size_t group_stride,
                                      float* top_p, PrefetchQueue* pf) {
    __m512 top[NQ], sq[NQ];
    for (int i = 0; i < NQ; ++i) {
      top[i] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
      sq[i] = _mm512_loadu_ps(sq_lanes + i * kW);
    }
    const uint32_t nd = d.n_tokens;
    uint32_t j = 0;
    // Documents stream from DRAM in a search: prefetch the codes two tiles ahead (a tile reads 8 rows as 8
    // short streams, which the hardware prefetchers pick up too late).
    PrefetchCodes(d, 0, 16);
    for (; j + 8 <= nd; j += 8) {
      PrefetchCodes(d, j + 16, j + 24);
      if (pf) pf->Step();
      Tile<NQ, 8, kCos>(ql, qstride, groups4, d.codes, d.padded_dim, j, d.meta, inv, sq, K, group_stride, top);
    }
    if (j + 4 <= nd) {
      Tile<NQ, 4, kCos>(ql, qstride, groups4, d.codes, d.padded_dim, j, d.meta, inv, sq, K, group_stride, top);
      j += 4;
    }
    if (j + 2 <= nd) {
      Tile<NQ, 2, kCos>(ql, qstride, groups4, d.codes, d.padded_dim, j, d.meta, inv, sq, K, group_stride, top);
      j += 2;
    }
    if (j < nd) {
      Tile<NQ, 1, kCos>(ql, qstride, groups4, d.codes, d.padded_dim, j, d.meta, inv, sq, K, group_stride, top);
    }
    for (int i = 0; i < NQ; ++i) _mm512_storeu_ps(top_p + i * kW, top[i]);
  }
};


}  // namespace

void ScreenedBatchAvx512Vnni(const PreparedQuery& q, const DocRef* docs, size_t n, maxsim_metric metric,
                             maxsim_mode mode, float* best_key, int32_t* best_index, KernelScratch& scratch,
                             ScreenCounters* counters, const ScreenPrune* prune) {
  const ScreenCall c = MakeScreenCall(q, docs, n, metric, mode, best_key, best_index, scratch, counters, prune,
                                      &BiasedLayoutKeys<kW, ZmmRows>);
  HwyTargetOps(HWY_AVX3)->screen(c);
}

void ScreenedAvx512Vnni(const PreparedQuery& q, const DocRef& d, maxsim_metric metric, maxsim_mode mode,
                        float* best_key, int32_t* best_index, KernelScratch& scratch, ScreenCounters* counters) {
  ScreenedBatchAvx512Vnni(q, &d, 1, metric, mode, best_key, best_index, scratch, counters, nullptr);
}

size_t BiasedLayoutBytes(const PreparedQuery& q, maxsim_mode mode) {
  return mode == MAXSIM_MODE_EXACT ? 0 : I8QueryLayout::Bytes(q);
}

void BiasedLayoutPrepare(const PreparedQuery& q, maxsim_mode mode, void* out) {
  if (mode != MAXSIM_MODE_EXACT) I8QueryLayout::Write(q, 0x80, out);
}

namespace {
void ExactAvx3(const PreparedQuery& q, const DocRef& d, maxsim_metric metric, float* best_key, int32_t* best_index,
               KernelScratch& scratch) {
  ExactWithHwy(*HwyTargetOps(HWY_AVX3), q, d, metric, best_key, best_index, scratch);
}
}  // namespace

}  // namespace x86

extern const KernelOps kOpsAvx512Vnni = {&x86::ExactAvx3, &x86::ScreenedAvx512Vnni, &x86::BiasedLayoutBytes,
                                         &x86::BiasedLayoutPrepare, &x86::ScreenedBatchAvx512Vnni};

}  // namespace maxsim
