// SPDX-License-Identifier: Apache-2.0
// The shared half of the NEON kernels (screen_neon.cc, screen_neon_dotprod.cc, screen_neon_i8mm.cc): the row loop
// over i8 tiles, the keys of a tile, the ComputeKeysFn that feeds the screening pipeline (kernels/pipeline.h,
// Highway NEON target: W = 4 query lanes per group) and the KernelOps entry points. The exact path is the
// Highway NEON one (exact_hwy.cc: FMLA tiles, the canonical chain). Each kernel file supplies only Impl: its
// i8 tile, the exact i32 dots I of NQ query groups x R document rows (Impl::Tile), written with its own
// instructions, and optionally a query layout of its own, stored after the shared I8QueryLayout.
//
// Included by each kernel file after its target pragma (armv8.2-a+dotprod, armv8.6-a+i8mm, or none), so the
// functions here are compiled for that file's instructions. They sit in an unnamed namespace on purpose: every
// file gets its own copies, and the linker can never merge a dotprod-compiled copy into the baseline kernel.
#include <arm_neon.h>

#include <cstddef>
#include <cstdint>
#include <limits>

#include "hwy/detect_targets.h"  // HWY_NEON: the Highway target the NEON kernels pair with
#include "kernels/pipeline.h"

namespace maxsim {
namespace arm {
namespace {

constexpr uint32_t kW = 4;  // f32 lanes of a NEON vector = query tokens of one Highway NEON group

// What a tile reads: the query's i8 codes at group g0 (I8QueryLayout, signed: [groups4][lane_stride][4], here
// already offset to lane g0 * 4), the kernel's own layout when it has one, and the document's code rows.
struct TileArgs {
  const int8_t* ql = nullptr;
  size_t qstride = 0;            // bytes between k-groups of ql
  const int8_t* own = nullptr;   // the kernel's own query layout at group g0 (neon-i8mm), else nullptr
  size_t own_stride = 0;         // bytes between k steps of `own`
  uint32_t groups4 = 0;          // k-groups of 4 codes covering dim (query codes beyond dim are zero)
  const int8_t* codes = nullptr;
  uint32_t padded_dim = 0;
};

// Keys of one tile (ComputeKeysFn): K[i * group_stride + (j + r) * 4 + l] = fl(fl(float(I) * s_d) * s_q[l])
// (cosine: then * inv[j + r]), the portable kernel's expression; top[i] = max over rows, NaN keys ignored
// (FMAXNM returns the number when one operand is a quiet NaN; top itself starts at -inf and is never NaN).
template <int NQ, int R, bool kCos>
inline void StoreKeys(const int32x4_t (&acc)[NQ][R], uint32_t j, const maxsim_vector_meta* meta, const float* inv,
                      const float32x4_t* sq, float* K, size_t group_stride, float32x4_t* top) {
  for (int r = 0; r < R; ++r) {
    const float32x4_t sd = vdupq_n_f32(meta[j + r].scale);
    for (int i = 0; i < NQ; ++i) {
      const float32x4_t a = vmulq_f32(vmulq_f32(vcvtq_f32_s32(acc[i][r]), sd), sq[i]);
      const float32x4_t key = kCos ? vmulq_f32(a, vdupq_n_f32(inv[j + r])) : a;
      vst1q_f32(K + i * group_stride + static_cast<size_t>(j + r) * kW, key);
      top[i] = vmaxnmq_f32(top[i], key);
    }
  }
}

// Every document row in tiles of Impl::kRows rows, then 4, 2, 1 (Impl::Tile<NQ, R> for R in those four).
template <typename Impl, int NQ, bool kCos>
inline void RowsKeys(const TileArgs& a, const DocRef& d, const float* inv, const float* sq_lanes, float* K,
                     size_t group_stride, float* top_out, PrefetchQueue* pf) {
  constexpr int kR = Impl::kRows;
  float32x4_t top[NQ], sq[NQ];
  for (int i = 0; i < NQ; ++i) {
    top[i] = vdupq_n_f32(-std::numeric_limits<float>::infinity());
    sq[i] = vld1q_f32(sq_lanes + i * kW);
  }
  const uint32_t nd = d.n_tokens;
  uint32_t j = 0;
  PrefetchCodes(d, 0, 2 * kR);
  for (; j + kR <= nd; j += kR) {
    PrefetchCodes(d, j + 2 * kR, j + 3 * kR);
    if (pf) pf->Step();
    int32x4_t acc[NQ][kR];
    Impl::template Tile<NQ, kR>(a, j, acc);
    StoreKeys<NQ, kR, kCos>(acc, j, d.meta, inv, sq, K, group_stride, top);
  }
  if (kR > 4 && j + 4 <= nd) {
    int32x4_t acc[NQ][4];
    Impl::template Tile<NQ, 4>(a, j, acc);
    StoreKeys<NQ, 4, kCos>(acc, j, d.meta, inv, sq, K, group_stride, top);
    j += 4;
  }
  if (j + 2 <= nd) {
    int32x4_t acc[NQ][2];
    Impl::template Tile<NQ, 2>(a, j, acc);
    StoreKeys<NQ, 2, kCos>(acc, j, d.meta, inv, sq, K, group_stride, top);
    j += 2;
  }
  if (j < nd) {
    int32x4_t acc[NQ][1];
    Impl::template Tile<NQ, 1>(a, j, acc);
    StoreKeys<NQ, 1, kCos>(acc, j, d.meta, inv, sq, K, group_stride, top);
  }
  for (int i = 0; i < NQ; ++i) vst1q_f32(top_out + i * kW, top[i]);
}

// ComputeKeysFn (kernels/pipeline.h) of a NEON kernel: query groups [g0, g0 + ng), ng <= 2.
template <typename Impl>
void NeonKeys(const ScreenJob& job, uint32_t g0, uint32_t ng, float* K, size_t k_stride, float* top) {
  const PreparedQuery& q = *job.q;
  TileArgs a;
  a.qstride = static_cast<size_t>(q.lane_stride) * 4;
  a.ql = static_cast<const int8_t*>(job.layout) + static_cast<size_t>(g0) * kW * 4;
  a.groups4 = static_cast<uint32_t>(I8QueryLayout::Groups4(q.dim));
  a.codes = job.d->codes;
  a.padded_dim = job.d->padded_dim;
  Impl::OwnLayout(q, job.layout, g0, &a);
  const float* sq = job.lanes.sq + static_cast<size_t>(g0) * kW;
  const DocRef& d = *job.d;
  if (ng == 2) {
    job.cosine ? RowsKeys<Impl, 2, true>(a, d, job.inv, sq, K, k_stride, top, job.pf)
               : RowsKeys<Impl, 2, false>(a, d, job.inv, sq, K, k_stride, top, job.pf);
  } else {
    job.cosine ? RowsKeys<Impl, 1, true>(a, d, job.inv, sq, K, k_stride, top, job.pf)
               : RowsKeys<Impl, 1, false>(a, d, job.inv, sq, K, k_stride, top, job.pf);
  }
}

template <typename Impl>
void ScreenedBatch(const PreparedQuery& q, const DocRef* docs, size_t n, maxsim_metric metric, maxsim_mode mode,
                   float* best_key, int32_t* best_index, KernelScratch& scratch, ScreenCounters* counters,
                   const ScreenPrune* prune) {
  ScreenCall c = MakeScreenCall(q, docs, n, metric, mode, best_key, best_index, scratch, counters, prune,
                                &NeonKeys<Impl>);
  c.pf_rows_per_step = Impl::kRows;  // RowsKeys steps the prefetch queue once per full tile
  HwyTargetOps(HWY_NEON)->screen(c);
}

template <typename Impl>
void Screened(const PreparedQuery& q, const DocRef& d, maxsim_metric metric, maxsim_mode mode, float* best_key,
              int32_t* best_index, KernelScratch& scratch, ScreenCounters* counters) {
  ScreenedBatch<Impl>(q, &d, 1, metric, mode, best_key, best_index, scratch, counters, nullptr);
}

inline void Exact(const PreparedQuery& q, const DocRef& d, maxsim_metric metric, float* best_key,
                  int32_t* best_index, KernelScratch& scratch) {
  ExactWithHwy(*HwyTargetOps(HWY_NEON), q, d, metric, best_key, best_index, scratch);
}

// The query layout: the signed I8QueryLayout (codes, then QueryLanes, which the pipeline reads), then Impl's own.
template <typename Impl>
size_t LayoutBytes(const PreparedQuery& q, maxsim_mode mode) {
  return mode == MAXSIM_MODE_EXACT ? 0 : I8QueryLayout::Bytes(q) + Impl::OwnBytes(q);
}

template <typename Impl>
void Prepare(const PreparedQuery& q, maxsim_mode mode, void* out) {
  if (mode == MAXSIM_MODE_EXACT) return;
  I8QueryLayout::Write(q, 0, out);
  Impl::WriteOwn(q, static_cast<int8_t*>(out) + I8QueryLayout::Bytes(q));
}

template <typename Impl>
constexpr KernelOps Ops() {
  return KernelOps{&Exact, &Screened<Impl>, &LayoutBytes<Impl>, &Prepare<Impl>, &ScreenedBatch<Impl>};
}

// The defaults of Impl's layout hooks: no layout of its own.
struct NoOwnLayout {
  static size_t OwnBytes(const PreparedQuery&) { return 0; }
  static void WriteOwn(const PreparedQuery&, int8_t*) {}
  static void OwnLayout(const PreparedQuery&, const void*, uint32_t, TileArgs*) {}
};

}  // namespace
}  // namespace arm
}  // namespace maxsim
