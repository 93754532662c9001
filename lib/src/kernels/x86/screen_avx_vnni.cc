// SPDX-License-Identifier: Apache-2.0
// Kernel "avx-vnni": exact path from exact_hwy.cc (Highway AVX2 target), i8 screening with AVX-VNNI, the VEX
// encoding of vpdpbusd on ymm registers (Alder Lake and later Intel client cores, which have no AVX-512;
// Sapphire Rapids; AMD Zen 5). On a CPU with AVX-512 VNNI the "avx512-vnni" kernel ranks higher.
//
// Signs: as in screen_avx512_vnni.cc. vpdpbusd multiplies unsigned by signed bytes; the query is stored once
// per call with a +128 bias (I8QueryLayout with xor 0x80, the same layout as "avx512-vnni"), the document codes
// stay signed, and each accumulator starts at -128 * code_sum(d) from the packed metadata, so it ends at exactly
// the integer dot I (arithmetic modulo 2^32; the final I fits in i32 for every packed buffer).
// Tile: 2 query vectors (16 tokens) x 6 document rows = 12 ymm accumulators + 2 query vectors + 1 broadcast =
// 15 of the 16 ymm registers. VEX has no embedded broadcast, so each row's 4 codes per k-group take one
// vpbroadcastd from memory (a load-port op): per group of 4 dimensions 12 vpdpbusd, 6 broadcasts, 2 loads;
// 12 independent chains cover vpdpbusd's latency. After the k loop: vcvtdq2ps, vmulps by the row scale and the
// lanes' query scales (the key A), vmaxps (top), one 32-byte store of the keys per row and query vector. The
// rest (selection, bounds, refinement) is screen_hwy-inl.h (Highway AVX2), shared with the "avx2" kernel.
#include <immintrin.h>

#include <cstring>
#include <limits>

#include "kernels/x86/keys_ymm-inl.h"
#include "kernels/x86/x86_kernels.h"

#define MAXSIM_TARGET_AVXVNNI __attribute__((target("avx2,fma,f16c,avxvnni")))

namespace maxsim {
namespace x86 {
namespace {

constexpr uint32_t kW = 8;     // lanes of a ymm vector = query tokens of one Highway AVX2 group
constexpr int kTileRows = 6;   // document rows per tile (register budget above)

// acc += q (unsigned bytes) x d (signed bytes), in place. The {vex} prefix (written %{vex%} in GCC asm, where
// braces mark dialect alternatives) pins the VEX encoding, the only one an AVX-VNNI CPU without AVX-512
// decodes. Under GCC the asm also keeps each accumulator in its register (its intrinsic codegen copies
// registers per instruction, as screen_avx512_vnni.cc found for zmm).
MAXSIM_TARGET_AVXVNNI inline void Dp(__m256i& acc, __m256i q, __m256i d) {
#if defined(__GNUC__) && !defined(__clang__)
  __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(q), "x"(d));
#else
  acc = _mm256_dpbusd_avx_epi32(acc, q, d);
#endif
}

template <int NQ, int R, bool kCos>
MAXSIM_TARGET_AVXVNNI inline void Tile(const uint8_t* ql, size_t qstride, uint32_t groups4, const int8_t* codes,
                                       uint32_t padded_dim, uint32_t j, const maxsim_vector_meta* meta,
                                       const float* inv, const __m256* sq, float* K, size_t group_stride,
                                       __m256* top) {
  __m256i acc[NQ][R];
  const int8_t* rp[R];
  for (int r = 0; r < R; ++r) {
    const __m256i start = _mm256_set1_epi32(CodeSumBias(meta[j + r].code_sum));
    for (int i = 0; i < NQ; ++i) acc[i][r] = start;
    rp[r] = codes + static_cast<size_t>(j + r) * padded_dim;
  }
  for (uint32_t g = 0; g < groups4; ++g) {
    __m256i qv[NQ];
    for (int i = 0; i < NQ; ++i) {
      qv[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + g * qstride + i * 32));
    }
    for (int r = 0; r < R; ++r) {
      int32_t dw;
      std::memcpy(&dw, rp[r] + 4 * g, 4);
      const __m256i dv = _mm256_set1_epi32(dw);
      for (int i = 0; i < NQ; ++i) Dp(acc[i][r], qv[i], dv);
    }
  }
  StoreKeysYmm<NQ, R, kCos>(acc, j, meta, inv, sq, K, group_stride, top);
}

// The i8 phase of one document for NQ query groups (BiasedLayoutKeys, x86_kernels.h).
struct YmmRows {
  template <int NQ, bool kCos>
  MAXSIM_TARGET_AVXVNNI static void Run(const uint8_t* ql, size_t qstride, uint32_t groups4, const DocRef& d,
                                        const float* inv, const float* sq_lanes, float* K, size_t group_stride,
                                        float* top_p, PrefetchQueue* pf) {
    __m256 top[NQ], sq[NQ];
    for (int i = 0; i < NQ; ++i) {
      top[i] = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
      sq[i] = _mm256_loadu_ps(sq_lanes + i * kW);
    }
    const uint32_t nd = d.n_tokens;
    uint32_t j = 0;
    // Codes two tiles ahead (a tile reads its rows as short streams that the hardware prefetchers find late).
    PrefetchCodes(d, 0, 2 * kTileRows);
    for (; j + kTileRows <= nd; j += kTileRows) {
      PrefetchCodes(d, j + 2 * kTileRows, j + 3 * kTileRows);
      if (pf) pf->Step();
      Tile<NQ, kTileRows, kCos>(ql, qstride, groups4, d.codes, d.padded_dim, j, d.meta, inv, sq, K, group_stride,
                                top);
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
    for (int i = 0; i < NQ; ++i) _mm256_storeu_ps(top_p + i * kW, top[i]);
  }
};


void ScreenedBatch(const PreparedQuery& q, const DocRef* docs, size_t n, maxsim_metric metric, maxsim_mode mode,
                   float* best_key, int32_t* best_index, KernelScratch& scratch, ScreenCounters* counters,
                   const ScreenPrune* prune) {
  ScreenCall c = MakeScreenCall(q, docs, n, metric, mode, best_key, best_index, scratch, counters, prune,
                                &BiasedLayoutKeys<kW, YmmRows>);
  c.pf_rows_per_step = kTileRows;  // YmmRows steps the prefetch queue once per tile
  HwyTargetOps(HWY_AVX2)->screen(c);
}

void Screened(const PreparedQuery& q, const DocRef& d, maxsim_metric metric, maxsim_mode mode, float* best_key,
              int32_t* best_index, KernelScratch& scratch, ScreenCounters* counters) {
  ScreenedBatch(q, &d, 1, metric, mode, best_key, best_index, scratch, counters, nullptr);
}

void Exact(const PreparedQuery& q, const DocRef& d, maxsim_metric metric, float* best_key, int32_t* best_index,
           KernelScratch& scratch) {
  ExactWithHwy(*HwyTargetOps(HWY_AVX2), q, d, metric, best_key, best_index, scratch);
}

}  // namespace
}  // namespace x86

// The query layout (biased i8, then the lanes) is avx512-vnni's: BiasedLayoutBytes / BiasedLayoutPrepare are
// ISA-free.
extern const KernelOps kOpsAvxVnni = {&x86::Exact, &x86::Screened, &x86::BiasedLayoutBytes, &x86::BiasedLayoutPrepare,
                                      &x86::ScreenedBatch};

}  // namespace maxsim
