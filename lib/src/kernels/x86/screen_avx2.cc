// Kernel "avx2": exact path from exact_hwy.cc (Highway AVX2 target), i8 screening with hand-written AVX2.
//
// Instructions (per 4 code bytes of one document row x 8 query tokens): vpbroadcastd (the row's 4 codes),
// vpabsb (|d|, once per row and k-group), then per query vector vpsignb (q with the sign of d), vpmaddubsw
// (|d| as u8 x signed q: four products summed in pairs to i16), vpmaddwd with ones (pairs to i32), vpaddd.
// Why the sign trick: vpmaddubsw saturates its i16 pair sums, and with a plain +128 bias the canonical codes
// [-127, 127] reach 255 * 127 * 2 = 64770 > 32767. With |d| <= 127 and |sign(q, d)| <= 127 a pair sum is at
// most 2 * 127 * 127 = 32258, so nothing ever saturates and I is the exact integer dot for any packed buffer.
// Tile: 2 query vectors (16 tokens, interleaved layout [k/4][lane][4]) x 3 document rows = 6 ymm
// accumulators + 2 query + ones + row broadcast and |row| + 2 temporaries = 13 of 16 registers; per k-group
// 30 vector ops for 192 multiply-adds. After the k loop: vcvtdq2ps, vmulps by the row's scale and by the lanes'
// query scales (the key A), running vmaxps per lane (top), one store of the keys per row and query vector.
// The rest (selection, bounds, refinement) is screen_hwy-inl.h (Highway AVX2).
#include <immintrin.h>

#include <cstring>
#include <limits>

#include "kernels/x86/x86_kernels.h"

#define MAXSIM_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace maxsim {
namespace x86 {
namespace {

constexpr uint32_t kW = 8;

template <int NQ, int R, bool kCos>
MAXSIM_TARGET_AVX2 inline void Tile(const int8_t* ql, size_t qstride, uint32_t groups4, const int8_t* codes,
                             uint32_t padded_dim, uint32_t j, const maxsim_vector_meta* meta, const float* inv,
                             const __m256* sq, float* K, size_t group_stride, __m256* top) {
  __m256i acc[NQ][R];
  for (int i = 0; i < NQ; ++i) {
    for (int r = 0; r < R; ++r) acc[i][r] = _mm256_setzero_si256();
  }
  const int8_t* rp[R];
  for (int r = 0; r < R; ++r) rp[r] = codes + static_cast<size_t>(j + r) * padded_dim;
  const __m256i ones = _mm256_set1_epi16(1);
  for (uint32_t g = 0; g < groups4; ++g) {
    __m256i qv[NQ];
    for (int i = 0; i < NQ; ++i) {
      qv[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + g * qstride + i * 32));
    }
    for (int r = 0; r < R; ++r) {
      int32_t dw;
      std::memcpy(&dw, rp[r] + 4 * g, 4);
      const __m256i dv = _mm256_set1_epi32(dw);
      const __m256i da = _mm256_abs_epi8(dv);
      for (int i = 0; i < NQ; ++i) {
        const __m256i t = _mm256_sign_epi8(qv[i], dv);
        const __m256i p = _mm256_maddubs_epi16(da, t);
        acc[i][r] = _mm256_add_epi32(acc[i][r], _mm256_madd_epi16(p, ones));
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    const __m256 sd = _mm256_set1_ps(meta[j + r].scale);
    for (int i = 0; i < NQ; ++i) {
      // key = fl(fl(fl(float(I) * s_d) * s_q) [* inv]), the portable kernel's expression.
      const __m256 a = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc[i][r]), sd), sq[i]);
      const __m256 key = kCos ? _mm256_mul_ps(a, _mm256_set1_ps(inv[j + r])) : a;
      _mm256_store_ps(K + i * group_stride + static_cast<size_t>(j + r) * kW, key);
      top[i] = _mm256_max_ps(key, top[i]);  // a NaN key returns top: ignored
    }
  }
}

template <int NQ, bool kCos>
MAXSIM_TARGET_AVX2 void Rows(const int8_t* ql, size_t qstride, uint32_t groups4, const DocRef& d, const float* inv,
                      const float* sq_lanes, float* K, size_t group_stride, float* top_p, PrefetchQueue* pf) {
  __m256 top[NQ], sq[NQ];
  for (int i = 0; i < NQ; ++i) {
    top[i] = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    sq[i] = _mm256_loadu_ps(sq_lanes + i * kW);
  }
  const uint32_t nd = d.n_tokens;
  uint32_t j = 0;
  // Tiles of 3 rows: 6 accumulators (GCC spilled 3 of the 8 of a 4-row tile to the stack, checked in the
  // disassembly; 3 rows leave room for the query, ones, row, |row| and temporaries in 16 ymm registers).
  PrefetchCodes(d, 0, 9);
  for (; j + 3 <= nd; j += 3) {
    PrefetchCodes(d, j + 9, j + 12);  // three tiles ahead, see screen_avx512vnni.cc
    if (pf && j % 6 == 0) pf->Step();
    Tile<NQ, 3, kCos>(ql, qstride, groups4, d.codes, d.padded_dim, j, d.meta, inv, sq, K, group_stride, top);
  }
  if (j + 2 <= nd) {
    Tile<NQ, 2, kCos>(ql, qstride, groups4, d.codes, d.padded_dim, j, d.meta, inv, sq, K, group_stride, top);
    j += 2;
  }
  if (j < nd) Tile<NQ, 1, kCos>(ql, qstride, groups4, d.codes, d.padded_dim, j, d.meta, inv, sq, K, group_stride, top);
  for (int i = 0; i < NQ; ++i) _mm256_storeu_ps(top_p + i * kW, top[i]);
}

// ComputeKeysFn (x86_kernels.h) for the sign-trick sequence.
void Avx2Keys(const ScreenJob& job, uint32_t g0, uint32_t ng, float* K, size_t k_stride, float* top) {
  const PreparedQuery& q = *job.q;
  const size_t qstride = static_cast<size_t>(q.n_padded) * 4;
  const int8_t* ql = static_cast<const int8_t*>(job.layout) + static_cast<size_t>(g0) * kW * 4;
  const uint32_t groups4 = static_cast<uint32_t>(I8QueryLayout::Groups4(q.dim));
  const float* sq = job.lanes.sq + static_cast<size_t>(g0) * kW;
  if (ng == 2) {
    job.cosine ? Rows<2, true>(ql, qstride, groups4, *job.d, job.inv, sq, K, k_stride, top, job.pf)
               : Rows<2, false>(ql, qstride, groups4, *job.d, job.inv, sq, K, k_stride, top, job.pf);
  } else {
    job.cosine ? Rows<1, true>(ql, qstride, groups4, *job.d, job.inv, sq, K, k_stride, top, job.pf)
               : Rows<1, false>(ql, qstride, groups4, *job.d, job.inv, sq, K, k_stride, top, job.pf);
  }
}

void ScreenedBatch(const PreparedQuery& q, const DocRef* docs, size_t n, maxsim_metric metric, maxsim_mode mode,
                   float* best_key, int32_t* best_index, KernelScratch& scratch, ScreenCounters* counters,
                   const ScreenPrune* prune) {
  const ScreenCall c = MakeScreenCall(q, docs, n, metric, mode, best_key, best_index, scratch, counters, prune,
                                      &Avx2Keys);
  HwyExactAvx2()->screen(c);
}

void Screened(const PreparedQuery& q, const DocRef& d, maxsim_metric metric, maxsim_mode mode, float* best_key,
              int32_t* best_index, KernelScratch& scratch, ScreenCounters* counters) {
  ScreenedBatch(q, &d, 1, metric, mode, best_key, best_index, scratch, counters, nullptr);
}

void Exact(const PreparedQuery& q, const DocRef& d, maxsim_metric metric, float* best_key, int32_t* best_index,
           KernelScratch& scratch) {
  ExactWithHwy(*HwyExactAvx2(), q, d, metric, best_key, best_index, scratch);
}

size_t LayoutBytes(const PreparedQuery& q, maxsim_mode mode) {
  return mode == MAXSIM_MODE_EXACT ? 0 : I8QueryLayout::Bytes(q);
}

void Prepare(const PreparedQuery& q, maxsim_mode mode, void* out) {
  if (mode != MAXSIM_MODE_EXACT) I8QueryLayout::Write(q, 0, out);
}

}  // namespace
}  // namespace x86

extern const KernelOps kOpsAvx2 = {&x86::Exact, &x86::Screened, &x86::LayoutBytes, &x86::Prepare,
                                   &x86::ScreenedBatch};

}  // namespace maxsim
