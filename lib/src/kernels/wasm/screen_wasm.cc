// SPDX-License-Identifier: Apache-2.0
// Kernels "wasm-simd128" and "wasm-relaxed" (one per WebAssembly module; docs/wasm.md): the exact path and the
// screening pipeline are exact_hwy.cc + screen_hwy-inl.h on Highway's WASM target (W = 4 f32 lanes) with the
// canonical chain's step from wasm/fma_wasm-inl.h (emulated, or f32x4.relaxed_madd where probed fused); this
// file is the i8 phase (ComputeKeysFn), the same in both modules.
//
// The integer dot I = sum_k q_k d_k of a query token and a document row, 4 codes (a k-group) at a time against
// the shared I8QueryLayout's order (lane s of k-group g holds q_s[4g .. 4g+3]): the query codes widened to i16
// once per call (after the shared layout); per k-group and row the row's 4 codes are splat and widened
// (v128.load32_splat + i16x8.extend_low_i8x16), and per query vector two i32x4.dot_i16x8_s + i32x4.add give the
// lanes' pair sums, added pairwise once per row. Exact for any int8 codes.
// Both modules use it. i32x4.relaxed_dot_i8x16_i7x16_add_s on the sign-split query (q = q+ - q-, both in
// [0, 127], the document codes as the 8-bit operand: exact on every engine) was measured slower in V8 on x86-64:
// certified 2.5 GSO/s against 12 with this loop (web/bench/bench.mjs, Lq 32, Ld 180, one thread), so the
// relaxed module takes only f32x4.relaxed_madd from relaxed SIMD.
// Keys and top as every kernel computes them (ComputeKeysFn in kernels/pipeline.h).
#include <wasm_simd128.h>

#include <cstring>
#include <limits>

#include "hwy/detect_targets.h"  // HWY_WASM
#include "kernels/pipeline.h"

namespace maxsim {
namespace wasm {
namespace {

constexpr uint32_t kW = 4;

// The kernel's part of the query layout, after I8QueryLayout: the codes widened to i16
// ([groups4][lane_stride][4] int16).
size_t ExtraBytes(const PreparedQuery& q) { return 2 * I8QueryLayout::CodeBytes(q); }

size_t LayoutBytes(const PreparedQuery& q, maxsim_mode mode) {
  return mode == MAXSIM_MODE_EXACT ? 0 : I8QueryLayout::Bytes(q) + ExtraBytes(q);
}

void Prepare(const PreparedQuery& q, maxsim_mode mode, void* out) {
  if (mode == MAXSIM_MODE_EXACT) return;
  I8QueryLayout::Write(q, 0, out);
  const size_t n = I8QueryLayout::CodeBytes(q);
  const int8_t* codes = static_cast<const int8_t*>(out);
  int16_t* wide = reinterpret_cast<int16_t*>(static_cast<uint8_t*>(out) + I8QueryLayout::Bytes(q));
  for (size_t i = 0; i < n; ++i) wide[i] = codes[i];
}

// Keys of one query group (4 lanes) and row j from the lanes' integer dots.
template <bool kCos>
inline void StoreKey(v128_t dots, uint32_t j, const maxsim_vector_meta* meta, const float* inv, v128_t sq,
                     float* K, v128_t* top) {
  v128_t a = wasm_f32x4_mul(wasm_f32x4_mul(wasm_f32x4_convert_i32x4(dots), wasm_f32x4_splat(meta[j].scale)), sq);
  if (kCos) a = wasm_f32x4_mul(a, wasm_f32x4_splat(inv[j]));
  wasm_v128_store(K + static_cast<size_t>(j) * kW, a);
  *top = wasm_v128_bitselect(a, *top, wasm_f32x4_gt(a, *top));  // a NaN key is never greater: ignored
}

// NQ query groups x R rows starting at row j: the integer dots of every (group, row), then their keys.
template <int NQ, int R, bool kCos>
inline void Tile(const uint8_t* ql, size_t qstride, uint32_t groups4, const DocRef& d, uint32_t j,
                 const float* inv, const v128_t* sq, float* K, size_t k_stride, v128_t* top) {
  const int8_t* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = d.codes + static_cast<size_t>(j + r) * d.padded_dim;
  v128_t acc[NQ][R][2];
  for (int i = 0; i < NQ; ++i) {
    for (int r = 0; r < R; ++r) acc[i][r][0] = acc[i][r][1] = wasm_i32x4_splat(0);
  }
  for (uint32_t g = 0; g < groups4; ++g) {
    const uint8_t* qg = ql + g * qstride;
    v128_t dv[R];
    for (int r = 0; r < R; ++r) dv[r] = wasm_i16x8_extend_low_i8x16(wasm_v128_load32_splat(rows[r] + 4 * g));
    for (int i = 0; i < NQ; ++i) {
      const v128_t lo = wasm_v128_load(qg + i * 32);
      const v128_t hi = wasm_v128_load(qg + i * 32 + 16);
      for (int r = 0; r < R; ++r) {
        acc[i][r][0] = wasm_i32x4_add(acc[i][r][0], wasm_i32x4_dot_i16x8(lo, dv[r]));
        acc[i][r][1] = wasm_i32x4_add(acc[i][r][1], wasm_i32x4_dot_i16x8(hi, dv[r]));
      }
    }
  }
  for (int i = 0; i < NQ; ++i) {
    for (int r = 0; r < R; ++r) {
      const v128_t lo = acc[i][r][0], hi = acc[i][r][1];  // lanes 0, 1 as pairs in lo, lanes 2, 3 in hi
      const v128_t dots =
          wasm_i32x4_add(wasm_i32x4_shuffle(lo, hi, 0, 2, 4, 6), wasm_i32x4_shuffle(lo, hi, 1, 3, 5, 7));
      StoreKey<kCos>(dots, j + r, d.meta, inv, sq[i], K + i * k_stride, &top[i]);
    }
  }
}

template <int NQ, bool kCos>
void Rows(const uint8_t* ql, size_t qstride, uint32_t groups4, const DocRef& d, const float* inv, const float* sq_p,
          float* K, size_t k_stride, float* top_p, PrefetchQueue* pf) {
  constexpr int kR = NQ == 2 ? 2 : 4;
  v128_t sq[NQ], top[NQ];
  for (int i = 0; i < NQ; ++i) {
    sq[i] = wasm_v128_load(sq_p + i * kW);
    top[i] = wasm_f32x4_splat(-std::numeric_limits<float>::infinity());
  }
  const uint32_t nd = d.n_tokens;
  uint32_t j = 0;
  for (; j + kR <= nd; j += kR) {
    Tile<NQ, kR, kCos>(ql, qstride, groups4, d, j, inv, sq, K, k_stride, top);
    if (pf) pf->Step();
  }
  for (; j < nd; ++j) Tile<NQ, 1, kCos>(ql, qstride, groups4, d, j, inv, sq, K, k_stride, top);
  for (int i = 0; i < NQ; ++i) wasm_v128_store(top_p + i * kW, top[i]);
}

// ComputeKeysFn (kernels/pipeline.h).
void Keys(const ScreenJob& job, uint32_t g0, uint32_t ng, float* K, size_t k_stride, float* top) {
  const PreparedQuery& q = *job.q;
  const uint32_t groups4 = static_cast<uint32_t>(I8QueryLayout::Groups4(q.dim));
  // Per k-group, lane_stride lanes of 4 int16 codes.
  const size_t qstride = static_cast<size_t>(q.lane_stride) * 4 * sizeof(int16_t);
  const uint8_t* ql = static_cast<const uint8_t*>(job.layout) + I8QueryLayout::Bytes(q) +
                      static_cast<size_t>(g0) * kW * 4 * sizeof(int16_t);
  const float* sq = job.lanes.sq + static_cast<size_t>(g0) * kW;
  const DocRef& d = *job.d;
  if (ng == 2) {
    job.cosine ? Rows<2, true>(ql, qstride, groups4, d, job.inv, sq, K, k_stride, top, job.pf)
               : Rows<2, false>(ql, qstride, groups4, d, job.inv, sq, K, k_stride, top, job.pf);
  } else {
    job.cosine ? Rows<1, true>(ql, qstride, groups4, d, job.inv, sq, K, k_stride, top, job.pf)
               : Rows<1, false>(ql, qstride, groups4, d, job.inv, sq, K, k_stride, top, job.pf);
  }
}

void ScreenedBatch(const PreparedQuery& q, const DocRef* docs, size_t n, maxsim_metric metric, maxsim_mode mode,
                   float* best_key, int32_t* best_index, KernelScratch& scratch, ScreenCounters* counters,
                   const ScreenPrune* prune) {
  ScreenCall c = MakeScreenCall(q, docs, n, metric, mode, best_key, best_index, scratch, counters, prune, &Keys);
  c.pf_rows_per_step = 2;
  HwyTargetOps(HWY_WASM)->screen(c);
}

void Screened(const PreparedQuery& q, const DocRef& d, maxsim_metric metric, maxsim_mode mode, float* best_key,
              int32_t* best_index, KernelScratch& scratch, ScreenCounters* counters) {
  ScreenedBatch(q, &d, 1, metric, mode, best_key, best_index, scratch, counters, nullptr);
}

void Exact(const PreparedQuery& q, const DocRef& d, maxsim_metric metric, float* best_key, int32_t* best_index,
           KernelScratch& scratch) {
  ExactWithHwy(*HwyTargetOps(HWY_WASM), q, d, metric, best_key, best_index, scratch);
}

}  // namespace
}  // namespace wasm

#if defined(__wasm_relaxed_simd__)
extern const KernelOps kOpsWasmRelaxed = {&wasm::Exact, &wasm::Screened, &wasm::LayoutBytes, &wasm::Prepare,
                                          &wasm::ScreenedBatch};
#else
extern const KernelOps kOpsWasmSimd128 = {&wasm::Exact, &wasm::Screened, &wasm::LayoutBytes, &wasm::Prepare,
                                          &wasm::ScreenedBatch};
#endif

}  // namespace maxsim
