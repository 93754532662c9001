// SPDX-License-Identifier: Apache-2.0
// Exact MaxSim, written once with Highway and compiled for every target Highway builds here: AVX2 (8 f32
// lanes) and AVX3 = AVX-512 (16 lanes) on x86, NEON (4 lanes) on AArch64, WASM (4 lanes) in WebAssembly.
// Kernels look their target's entry points up with HwyTargetOps(HWY_...) instead of HWY_DYNAMIC_DISPATCH,
// because the kernel list is the one dispatcher: MAXSIM_ISA=avx2 on an AVX-512 machine must run the AVX2 code,
// which Highway's own dispatch would not. ISA-specific tiles plug in per target from the architecture folders
// (x86/exact_tile_avx512-inl.h); the canonical chain's step is ChainMulAdd (chain_fma-inl.h: a fused
// multiply-add, emulated exactly where WebAssembly has none).
//
// x86 instructions: vfmadd231ps (query vector x broadcast document element), vbroadcastss / {1to16} embedded
// broadcast for the document element, vmovups of the transposed query (PreparedQuery::qt, lane = query token),
// vcmpps + vblendvps (AVX2) or k-mask blends (AVX-512) for the running max / first argmax.
// Tile: NQ query vectors x R document rows of accumulators, the k loop outermost inside the tile:
//   AVX2    2 x 6  = 12 ymm accumulators + 2 query + 1 broadcast = 15 of 16 registers (1 x 12 for odd NQ)
//   AVX-512 2 x 12 = 24 zmm accumulators + 2 query (broadcast folded into the FMA)  = 26 of 32 (1 x 12)
// Why: per k a tile issues NQ*R FMAs for NQ + R loads (loads are never the bottleneck), and NQ*R >= 12
// independent chains hide the 4-cycle FMA latency on two FMA ports. Each accumulator runs k = 0..dim-1 in
// order from +0, i.e. exactly the canonical chain (kernel.h): vectorised across tokens, never across k, so
// results are bit-identical to every other kernel. Nothing but the per-token running max and argmax (L1) is
// stored; document rows stream from L1/L2 once per pair of query vectors.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/pipeline.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/exact_hwy.cc"
// Not compiled: SSSE3/SSE4 (no kernel uses them) and the SVE targets (sizeless vectors cannot be array elements,
// which the register tiles are).
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4 | HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128)
#endif
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/screen_hwy-inl.h"  // per target: the screening pipeline (screen::Screen)

HWY_BEFORE_NAMESPACE();
namespace maxsim {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using VF = hn::Vec<DF>;
using VI = hn::Vec<DI>;

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
constexpr size_t kRows2 = 12;  // rows per tile with two query vectors
constexpr size_t kRows1 = 12;  // rows per tile with one query vector
#elif HWY_TARGET == HWY_WASM
// 2 x 4 = 8 accumulators: with 2 x 6 (AVX2's tile) V8's register allocation spilled on x86-64 (16 xmm) and
// exact ran at 10.6 GSO/s against 14 to 17.5 with this tile (Lq 32, Ld 180, web/bench); 2 x 3 and 2 x 5 measured
// slower than 2 x 4.
constexpr size_t kRows2 = 4;
constexpr size_t kRows1 = 8;
#else
constexpr size_t kRows2 = 6;
constexpr size_t kRows1 = 12;
#endif

// Lane l of the result is set when bit l of `bits` is.
HWY_INLINE hn::Mask<DF> LaneMask(uint32_t bits) {
  const DF df;
  const DI di;
  alignas(64) static constexpr int32_t kBit[16] = {1 << 0,  1 << 1,  1 << 2,  1 << 3,  1 << 4,  1 << 5,
                                                   1 << 6,  1 << 7,  1 << 8,  1 << 9,  1 << 10, 1 << 11,
                                                   1 << 12, 1 << 13, 1 << 14, 1 << 15};
  const VI lane_bits = hn::LoadU(di, kBit);
  const VI set = hn::And(hn::Set(di, static_cast<int32_t>(bits)), lane_bits);
  return hn::RebindMask(df, hn::Ne(set, hn::Zero(di)));
}

// Folds row r's keys acc[i][r] (E, or E * inv[r] for cosine) into best/arg in row order with strict >, for the
// lanes selected by masks[r] when kMask.
template <size_t NQ, size_t R, bool kCos, bool kMask>
HWY_INLINE void FoldTile(const VF (&acc)[NQ][R], const int32_t* idx, const float* inv, const uint32_t* masks,
                         float* HWY_RESTRICT best, int32_t* HWY_RESTRICT arg) {
  const DF df;
  const DI di;
  const size_t N = hn::Lanes(df);
  for (size_t i = 0; i < NQ; ++i) {
    VF bv = hn::LoadU(df, best + i * N);
    VI av = hn::LoadU(di, arg + i * N);
    for (size_t r = 0; r < R; ++r) {
      VF key = acc[i][r];
      if (kCos) key = hn::Mul(key, hn::Set(df, inv[r]));
      auto gt = key > bv;
      if (kMask) gt = hn::And(gt, LaneMask(masks[r] >> (i * N)));
      bv = hn::IfThenElse(gt, key, bv);
      av = hn::IfThenElse(hn::RebindMask(di, gt), hn::Set(di, idx[r]), av);
    }
    hn::StoreU(bv, df, best + i * N);
    hn::StoreU(av, di, arg + i * N);
  }
}

// One tile: NQ query vectors (lanes = query tokens, from the transposed layout qt with row stride qstride)
// against R document rows rp[0..R), then FoldTile. With pf, one prefetch per k at pf + k * pf_step (the next
// tile's lines spread over this tile's k loop, see Dots2x12).
template <size_t NQ, size_t R, bool kCos, bool kMask>
HWY_INLINE void Tile(const float* HWY_RESTRICT qt, size_t qstride, const float* const* rp, uint32_t dim,
                     const int32_t* idx, const float* inv, const uint32_t* masks, float* HWY_RESTRICT best,
                     int32_t* HWY_RESTRICT arg, const char* pf = nullptr, size_t pf_step = 0) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const float* rows[R];
  for (size_t r = 0; r < R; ++r) rows[r] = rp[r];
  VF acc[NQ][R];
  for (size_t i = 0; i < NQ; ++i) {
    for (size_t r = 0; r < R; ++r) acc[i][r] = hn::Zero(df);
  }
  for (uint32_t k = 0; k < dim; ++k) {
    MAXSIM_MCA_BEGIN(NQ * 100 + R);
    const float* HWY_RESTRICT qk = qt + static_cast<size_t>(k) * qstride;
    if (pf) __builtin_prefetch(pf + k * pf_step, 0, 3);
    VF q[NQ];
    for (size_t i = 0; i < NQ; ++i) q[i] = hn::LoadU(df, qk + i * N);
    for (size_t r = 0; r < R; ++r) {
      const VF b = hn::Set(df, rows[r][k]);
      for (size_t i = 0; i < NQ; ++i) acc[i][r] = ChainMulAdd(q[i], b, acc[i][r]);
    }
    MAXSIM_MCA_END();
  }
  FoldTile<NQ, R, kCos, kMask>(acc, idx, inv, masks, best, arg);
}

#undef MAXSIM_EXACT_ASM_TILE  // per target
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
#define MAXSIM_EXACT_ASM_TILE 1
#include "kernels/x86/exact_tile_avx512-inl.h"  // Dots2x12: the full 2 x 12 tile as one asm loop
#endif

// Rows [j, j + R) of a contiguous document. pf / pf_step: the next tile's lines, one prefetch per k (see
// Dots2x12 and RunRows).
template <size_t NQ, size_t R, bool kCos>
HWY_INLINE void ContiguousTile(const float* qt, size_t qstride, const float* rows, uint64_t stride, uint32_t j,
                               uint32_t dim, const float* inv, float* best, int32_t* arg, const char* pf = nullptr,
                               size_t pf_step = 0) {
  int32_t idx[R];
  float w[R];
  for (size_t r = 0; r < R; ++r) {
    idx[r] = static_cast<int32_t>(j + r);
    w[r] = kCos ? inv[j + r] : 1.0f;
  }
#ifdef MAXSIM_EXACT_ASM_TILE
  if constexpr (NQ == 2 && R == 12) {
    const DF df;
    alignas(64) float out[24 * 16];
    const float* row0 = rows + j * stride;
    Dots2x12(qt, qstride, row0, stride, dim, pf ? pf : reinterpret_cast<const char*>(row0), pf ? pf_step : 0, out);
    VF acc[2][12];
    for (size_t r = 0; r < 12; ++r) {
      acc[0][r] = hn::Load(df, out + (2 * r) * 16);
      acc[1][r] = hn::Load(df, out + (2 * r + 1) * 16);
    }
    FoldTile<2, 12, kCos, false>(acc, idx, w, nullptr, best, arg);
    return;
  }
#endif
  const float* rp[R];
  for (size_t r = 0; r < R; ++r) rp[r] = rows + (j + r) * stride;
  Tile<NQ, R, kCos, false>(qt, qstride, rp, dim, idx, w, nullptr, best, arg, pf, pf_step);
}

// Prefetches rows [j0, j1): a tile's rows are read as R concurrent streams of 4 bytes per k, which the
// hardware prefetchers follow poorly when the document comes from DRAM; one tile ahead hides the latency.
HWY_INLINE void PrefetchRows(const float* rows, uint64_t stride, uint32_t j0, uint32_t j1, uint32_t dim) {
  for (uint32_t j = j0; j < j1; ++j) {
    const char* p = reinterpret_cast<const char*>(rows + j * stride);
    for (uint32_t off = 0; off < dim * 4; off += 64) __builtin_prefetch(p + off, 0, 3);
  }
}

// All nd rows against NQ query vectors: full tiles of RMAX rows, then the rest in tiles of 8, 4, 2, 1.
template <size_t NQ, size_t RMAX, bool kCos>
HWY_NOINLINE void RunRows(const float* qt, size_t qstride, const float* rows, uint64_t stride, uint32_t nd,
                          uint32_t dim, const float* inv, float* best, int32_t* arg) {
  uint32_t j = 0;
  PrefetchRows(rows, stride, 0, nd < RMAX ? nd : static_cast<uint32_t>(RMAX), dim);  // the first tile
  for (; j + RMAX <= nd; j += RMAX) {
    const uint32_t next = j + static_cast<uint32_t>(RMAX);
    // The next RMAX rows' bytes spread over this tile's dim steps, at most a line per step (a burst of them
    // before the tile stalled on the line fill buffers: 37% of the AVX-512 and 19% of the AVX2 exact kernel's
    // samples on a Sapphire Rapids-class core). Steps above a line (rows longer than 16 x dim floats: padded
    // rows) skip lines; the hardware prefetchers follow the rest. Near the end this runs past the document on
    // purpose: in a packed corpus the originals are contiguous, so those lines are the next document's first
    // rows, whose tile otherwise starts with a burst (a prefetch never faults, whatever the address):
    // kernel_bench shows it on avx512-vnni exact at Lq=32 Ld=180, less on avx2.
    const size_t bytes = static_cast<size_t>(RMAX) * stride * sizeof(float);
    const size_t step = std::min<size_t>(64, (bytes + dim - 1) / dim);
    ContiguousTile<NQ, RMAX, kCos>(qt, qstride, rows, stride, j, dim, inv, best, arg,
                                   reinterpret_cast<const char*>(rows + next * stride), step);
  }
  if (RMAX > 8 && j + 8 <= nd) {
    ContiguousTile<NQ, 8, kCos>(qt, qstride, rows, stride, j, dim, inv, best, arg);
    j += 8;
  }
  if (j + 4 <= nd) {
    ContiguousTile<NQ, 4, kCos>(qt, qstride, rows, stride, j, dim, inv, best, arg);
    j += 4;
  }
  if (j + 2 <= nd) {
    ContiguousTile<NQ, 2, kCos>(qt, qstride, rows, stride, j, dim, inv, best, arg);
    j += 2;
  }
  if (j < nd) ContiguousTile<NQ, 1, kCos>(qt, qstride, rows, stride, j, dim, inv, best, arg);
}

template <bool kCos>
void ExactF32T(const PreparedQuery& q, const float* rows, uint64_t stride, uint32_t nd, const float* inv,
               float* best_key, int32_t* best_index) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const size_t nvec = q.n_padded / N;
  // Running max/argmax of two query vectors, in L1.
  alignas(64) float best[2 * 16];
  alignas(64) int32_t arg[2 * 16];
  for (size_t v = 0; v < nvec;) {
    const size_t nq = nvec - v >= 2 ? 2 : 1;
    for (size_t l = 0; l < nq * N; ++l) {
      best[l] = -std::numeric_limits<float>::infinity();
      arg[l] = -1;
    }
    const float* qt = q.qt + v * N;
    if (nq == 2) {
      RunRows<2, kRows2, kCos>(qt, q.lane_stride, rows, stride, nd, q.dim, inv, best, arg);
    } else {
      RunRows<1, kRows1, kCos>(qt, q.lane_stride, rows, stride, nd, q.dim, inv, best, arg);
    }
    for (size_t l = 0; l < nq * N && v * N + l < q.n_tokens; ++l) {
      best_key[v * N + l] = best[l];
      best_index[v * N + l] = arg[l];
    }
    v += nq;
  }
}

void ExactF32(const PreparedQuery& q, const float* rows, uint64_t stride, uint32_t nd, const float* inv,
              float* best_key, int32_t* best_index) {
  if (inv) {
    ExactF32T<true>(q, rows, stride, nd, inv, best_key, best_index);
  } else {
    ExactF32T<false>(q, rows, stride, nd, inv, best_key, best_index);
  }
}

void Widen(const DocRef& d, float* out) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const hn::Rebind<hwy::float16_t, DF> dh;
  const hn::Rebind<hwy::bfloat16_t, DF> db;
  for (uint32_t t = 0; t < d.n_tokens; ++t) {
    const uint8_t* row = d.originals + t * d.orig_row_bytes;
    float* o = out + static_cast<size_t>(t) * d.dim;
    uint32_t k = 0;
    if (d.dtype == MAXSIM_BF16) {
      const auto* in = reinterpret_cast<const hwy::bfloat16_t*>(row);
      for (; k + N <= d.dim; k += N) hn::StoreU(hn::PromoteTo(df, hn::LoadU(db, in + k)), df, o + k);
      const auto* bits = reinterpret_cast<const uint16_t*>(row);
      for (; k < d.dim; ++k) {
        const uint32_t b = static_cast<uint32_t>(bits[k]) << 16;
        std::memcpy(o + k, &b, 4);
      }
    } else {
      const auto* in = reinterpret_cast<const hwy::float16_t*>(row);
      for (; k + N <= d.dim; k += N) hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, in + k)), df, o + k);
      // The tail: widen a zero-padded copy (f16 -> f32 is exact either way).
      if (k < d.dim) {
        alignas(64) uint16_t tmp[16] = {};
        std::memcpy(tmp, in + k, (d.dim - k) * 2);
        alignas(64) float wide[16];
        hn::Store(hn::PromoteTo(df, hn::Load(dh, reinterpret_cast<const hwy::float16_t*>(tmp))), df, wide);
        std::memcpy(o + k, wide, (d.dim - k) * 4);
      }
    }
  }
}

// Constant-initialised (no call into target code before the registry has checked the CPU).
extern const HwyExactOps kHwyExactOps = {sizeof(VF) / sizeof(float), &ExactF32, &Widen, &screen::Screen};

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace maxsim
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace maxsim {

const HwyExactOps* HwyTargetOps(int64_t target) {
  switch (target) {
#if HWY_TARGETS & HWY_AVX3
    case HWY_AVX3: return &N_AVX3::kHwyExactOps;
#endif
#if HWY_TARGETS & HWY_AVX2
    case HWY_AVX2: return &N_AVX2::kHwyExactOps;
#endif
#if HWY_TARGETS & HWY_NEON
    case HWY_NEON: return &N_NEON::kHwyExactOps;
#endif
#if HWY_TARGETS & HWY_WASM
    case HWY_WASM: return &N_WASM::kHwyExactOps;
#endif
    default: return nullptr;
  }
}

const float* RowsF32(const HwyExactOps& ops, const DocRef& d, KernelScratch& scratch, uint64_t* stride) {
  if (d.dtype == MAXSIM_F32) {
    *stride = d.orig_row_bytes / sizeof(float);
    return reinterpret_cast<const float*>(d.originals);
  }
  constexpr uint32_t kKind = 1;  // widened f32 rows (identical for every target: the conversion is exact)
  if (d.serial == 0 || scratch.cache_serial != d.serial || scratch.cache_kind != kKind) {
    float* out = KernelScratch::Grow(scratch.cache, static_cast<size_t>(d.n_tokens) * d.dim + 16);
    ops.widen(d, out);
    scratch.cache_serial = d.serial;
    scratch.cache_kind = kKind;
  }
  *stride = d.dim;
  return scratch.cache.data();
}

void ExactWithHwy(const HwyExactOps& ops, const PreparedQuery& q, const DocRef& d, maxsim_metric metric,
                  float* best_key, int32_t* best_index, KernelScratch& scratch) {
  uint64_t stride = 0;
  const float* rows = RowsF32(ops, d, scratch, &stride);
  const float* inv = nullptr;
  if (metric == MAXSIM_METRIC_COSINE) {
    float* w = KernelScratch::Grow(scratch.inv, d.n_tokens);
    for (uint32_t t = 0; t < d.n_tokens; ++t) w[t] = InvNorm(d.meta[t].norm);
    inv = w;
  }
  ops.exact_f32(q, rows, stride, d.n_tokens, inv, best_key, best_index);
}

}  // namespace maxsim
#endif  // HWY_ONCE
