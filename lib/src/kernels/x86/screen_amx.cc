// Kernel "amx": the "avx512-bf16" exact path, i8 screening with AMX-INT8 tiles.
//
// Instructions: ldtilecfg once per (query, document) call (palette 1: eight tiles of 16 rows x 64 bytes),
// tileloadd, tdpbssd (signed x signed bytes: no bias needed), tilestored, tilerelease at the end of the call.
// Tile roles: A = 16 document tokens x 64 code bytes, read row-major straight from the packed codes (stride
// padded_dim); B = 16 groups of 4 code bytes x 16 query tokens, i.e. the interleaved query layout
// [k/4][lane][4] that the AVX2 kernel uses, read with stride lane_stride * 4 (the query is packed once per call
// by the layout hook); C = 16 document tokens x 16 query tokens of i32: C[m][n] = I(doc m, query n).
// Blocking: 2 document blocks x 2 query groups per step = 4 C tiles (tmm0-3), 2 A (tmm4-5), 2 B (tmm6-7): per
// 64 bytes of k, 4 tile loads feed 4 tdpbssd (16 x 16 x 64 multiply-adds each). The C tiles are stored to one
// of two alternating 4 KB buffers in L1, and AVX-512 does the rest: per document row a vcvtdq2ps, a vmulps by
// the row scale and one by the lanes' query scales (the key A), a store and a vmaxps per query group. At 1024
// multiply-adds per cycle for tdpbssd that post-processing, not the tile unit, bounds this kernel (measured on
// the device: ~11 cycles per 16 keys against ~2 for the tdpbssd work; docs/kernels.md). Selection, bounds and
// refinement are screen_hwy-inl.h (Highway AVX3).
// Why the tail copy: a block with fewer than 16 document rows is copied (64 bytes of k at a time) into a
// zeroed 1 KB buffer, so no tile load reads past the document (the codes of a dense document live in a
// vector of exactly n_tokens rows).
// The AMX tile-data permission is requested at CPU detection (cpu_features.cc); the kernel list requires
// kCpuAMXPermitted, so without it the registry reports why and another kernel runs.
#include <immintrin.h>

#include <cstring>
#include <limits>

#include "kernels/x86/amx_tiles.h"
#include "kernels/x86/x86_kernels.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC bug 105593, see screen_avx512vnni.cc
#endif

#define MAXSIM_TARGET_AMX \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,amx-tile,amx-int8")))

// The compiler's tile intrinsics are asm statements that do not declare the memory they read or write.
#define MAXSIM_MEMORY_BARRIER() __asm__ volatile("" ::: "memory")

namespace maxsim {
namespace x86 {
namespace {

constexpr uint32_t kW = 16;

MAXSIM_TARGET_AMX void Release() { _tile_release(); }

// One step over all k blocks. a0/a1: first code byte of each 16-row document block (stride as); b0/b1: the
// query groups in the interleaved layout (stride bs, bstep bytes per k block). C tiles go to c[(b * 2 + g) * 256].
MAXSIM_TARGET_AMX void Block22(const int8_t* a0, const int8_t* a1, size_t as, const int8_t* b0, const int8_t* b1,
                               size_t bs, size_t bstep, uint32_t kblocks, int32_t* c) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (uint32_t kb = 0; kb < kblocks; ++kb) {
    _tile_loadd(4, a0 + kb * 64, as);
    _tile_loadd(5, a1 + kb * 64, as);
    _tile_loadd(6, b0 + kb * bstep, bs);
    _tile_loadd(7, b1 + kb * bstep, bs);
    _tile_dpbssd(0, 4, 6);
    _tile_dpbssd(1, 4, 7);
    _tile_dpbssd(2, 5, 6);
    _tile_dpbssd(3, 5, 7);
  }
  _tile_stored(0, c, 64);
  _tile_stored(1, c + 256, 64);
  _tile_stored(2, c + 512, 64);
  _tile_stored(3, c + 768, 64);
  MAXSIM_MEMORY_BARRIER();
}

MAXSIM_TARGET_AMX void Block12(const int8_t* a0, const int8_t* a1, size_t as, const int8_t* b0, size_t bs,
                               size_t bstep, uint32_t kblocks, int32_t* c) {
  _tile_zero(0);
  _tile_zero(2);
  for (uint32_t kb = 0; kb < kblocks; ++kb) {
    _tile_loadd(4, a0 + kb * 64, as);
    _tile_loadd(5, a1 + kb * 64, as);
    _tile_loadd(6, b0 + kb * bstep, bs);
    _tile_dpbssd(0, 4, 6);
    _tile_dpbssd(2, 5, 6);
  }
  _tile_stored(0, c, 64);
  _tile_stored(2, c + 512, 64);
  MAXSIM_MEMORY_BARRIER();
}

// One document block; `tail` rows valid (16 for a full block read in place; fewer: copied through `buf`).
MAXSIM_TARGET_AMX void Block21(const int8_t* a0, size_t as, uint32_t tail, const int8_t* b0, const int8_t* b1,
                               size_t bs, size_t bstep, uint32_t kblocks, int8_t* buf, int32_t* c) {
  _tile_zero(0);
  _tile_zero(1);
  for (uint32_t kb = 0; kb < kblocks; ++kb) {
    if (tail < 16) {
      for (uint32_t m = 0; m < tail; ++m) std::memcpy(buf + m * 64, a0 + m * as + kb * 64, 64);
      MAXSIM_MEMORY_BARRIER();
      _tile_loadd(4, buf, 64);
    } else {
      _tile_loadd(4, a0 + kb * 64, as);
    }
    _tile_loadd(6, b0 + kb * bstep, bs);
    _tile_loadd(7, b1 + kb * bstep, bs);
    _tile_dpbssd(0, 4, 6);
    _tile_dpbssd(1, 4, 7);
  }
  _tile_stored(0, c, 64);
  _tile_stored(1, c + 256, 64);
  MAXSIM_MEMORY_BARRIER();
}

MAXSIM_TARGET_AMX void Block11(const int8_t* a0, size_t as, uint32_t tail, const int8_t* b0, size_t bs,
                               size_t bstep, uint32_t kblocks, int8_t* buf, int32_t* c) {
  _tile_zero(0);
  for (uint32_t kb = 0; kb < kblocks; ++kb) {
    if (tail < 16) {
      for (uint32_t m = 0; m < tail; ++m) std::memcpy(buf + m * 64, a0 + m * as + kb * 64, 64);
      MAXSIM_MEMORY_BARRIER();
      _tile_loadd(4, buf, 64);
    } else {
      _tile_loadd(4, a0 + kb * 64, as);
    }
    _tile_loadd(6, b0 + kb * bstep, bs);
    _tile_dpbssd(0, 4, 6);
  }
  _tile_stored(0, c, 64);
  MAXSIM_MEMORY_BARRIER();
}

// C tile (16 rows = document tokens j0.., 16 lanes = query tokens) -> keys and their running max.
template <bool kCos>
MAXSIM_TARGET_AMX inline void Post(const int32_t* c, uint32_t j0, uint32_t rows, const maxsim_vector_meta* meta,
                                   const float* inv, __m512 sq, float* K, __m512* top) {
  __m512 t = *top;
  for (uint32_t m = 0; m < rows; ++m) {
    const uint32_t j = j0 + m;
    // key = fl(fl(fl(float(I) * s_d) * s_q) [* inv]), the portable kernel's expression.
    const __m512 a = _mm512_mul_ps(
        _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + 16 * m)), _mm512_set1_ps(meta[j].scale)), sq);
    const __m512 key = kCos ? _mm512_mul_ps(a, _mm512_set1_ps(inv[j])) : a;
    _mm512_store_ps(K + static_cast<size_t>(j) * kW, key);
    t = _mm512_max_ps(key, t);  // a NaN key returns t: ignored
  }
  *top = t;
}

template <bool kCos>
MAXSIM_TARGET_AMX void KeysT(const ScreenJob& job, uint32_t g0, uint32_t ng, float* B, size_t gs, float* top_p) {
  const PreparedQuery& q = *job.q;
  const DocRef& d = *job.d;
  // Two C buffers, alternating per 32-row block: the tile stores of block b + 1 need not wait for the vector
  // loads of block b's post-processing, so the tile unit and the AVX-512 epilogue overlap.
  alignas(64) int32_t cbuf[2][4 * 256];
  alignas(64) int8_t buf[16 * 64];
  std::memset(buf, 0, sizeof(buf));
  const size_t bs = static_cast<size_t>(q.lane_stride) * 4;
  const size_t bstep = 16 * bs;
  const int8_t* b0 = static_cast<const int8_t*>(job.layout) + static_cast<size_t>(g0) * kW * 4;
  const int8_t* b1 = b0 + kW * 4;
  const uint32_t kblocks = d.padded_dim / 64;
  const size_t as = d.padded_dim;
  const uint32_t nd = d.n_tokens;
  const __m512 sq0 = _mm512_loadu_ps(job.lanes.sq + static_cast<size_t>(g0) * kW);
  const __m512 sq1 = ng == 2 ? _mm512_loadu_ps(job.lanes.sq + static_cast<size_t>(g0 + 1) * kW) : sq0;
  __m512 top[2] = {_mm512_set1_ps(-std::numeric_limits<float>::infinity()),
                   _mm512_set1_ps(-std::numeric_limits<float>::infinity())};
  uint32_t j = 0;
  for (; j + 32 <= nd; j += 32) {
    int32_t* c = cbuf[(j / 32) & 1];
    const int8_t* a0 = d.codes + static_cast<size_t>(j) * as;
    // Codes and metadata 64 rows ahead: a block of 32 rows takes only ~8 tdpbssd and 64 rows of
    // post-processing (a few hundred cycles), less than a DRAM round trip.
    if (j == 0) {
      for (uint32_t r = 32; r < 64 && r < nd; ++r) {
        const char* p = reinterpret_cast<const char*>(d.codes) + static_cast<size_t>(r) * as;
        for (size_t off = 0; off < as; off += 64) __builtin_prefetch(p + off, 0, 3);
        __builtin_prefetch(d.meta + r, 0, 3);
      }
    }
    if (job.pf) {
      job.pf->Step();
      job.pf->Step();
    }
    const uint32_t pf_end = j + 96 < nd ? j + 96 : nd;
    for (uint32_t r = j + 64; r < pf_end; ++r) {
      const char* p = reinterpret_cast<const char*>(d.codes) + static_cast<size_t>(r) * as;
      for (size_t off = 0; off < as; off += 64) __builtin_prefetch(p + off, 0, 3);
      __builtin_prefetch(d.meta + r, 0, 3);
    }
    if (ng == 2) {
      Block22(a0, a0 + 16 * as, as, b0, b1, bs, bstep, kblocks, c);
      Post<kCos>(c, j, 16, d.meta, job.inv, sq0, B, &top[0]);
      Post<kCos>(c + 256, j, 16, d.meta, job.inv, sq1, B + gs, &top[1]);
      Post<kCos>(c + 512, j + 16, 16, d.meta, job.inv, sq0, B, &top[0]);
      Post<kCos>(c + 768, j + 16, 16, d.meta, job.inv, sq1, B + gs, &top[1]);
    } else {
      Block12(a0, a0 + 16 * as, as, b0, bs, bstep, kblocks, c);
      Post<kCos>(c, j, 16, d.meta, job.inv, sq0, B, &top[0]);
      Post<kCos>(c + 512, j + 16, 16, d.meta, job.inv, sq0, B, &top[0]);
    }
  }
  for (; j < nd; j += 16) {
    int32_t* c = cbuf[(j / 16) & 1];
    const uint32_t rows = nd - j < 16 ? nd - j : 16;
    const int8_t* a0 = d.codes + static_cast<size_t>(j) * as;
    if (ng == 2) {
      Block21(a0, as, rows, b0, b1, bs, bstep, kblocks, buf, c);
      Post<kCos>(c, j, rows, d.meta, job.inv, sq0, B, &top[0]);
      Post<kCos>(c + 256, j, rows, d.meta, job.inv, sq1, B + gs, &top[1]);
    } else {
      Block11(a0, as, rows, b0, bs, bstep, kblocks, buf, c);
      Post<kCos>(c, j, rows, d.meta, job.inv, sq0, B, &top[0]);
    }
  }
  for (uint32_t g = 0; g < ng; ++g) _mm512_storeu_ps(top_p + g * kW, top[g]);
}

// ComputeKeysFn (x86_kernels.h) for tdpbssd; the tiles are configured by ScreenedBatchAmx.
void AmxKeys(const ScreenJob& job, uint32_t g0, uint32_t ng, float* K, size_t k_stride, float* top) {
  job.cosine ? KeysT<true>(job, g0, ng, K, k_stride, top) : KeysT<false>(job, g0, ng, K, k_stride, top);
}

void ScreenedBatchAmx(const PreparedQuery& q, const DocRef* docs, size_t n, maxsim_metric metric, maxsim_mode mode,
                      float* best_key, int32_t* best_index, KernelScratch& scratch, ScreenCounters* counters,
                      const ScreenPrune* prune) {
  const ScreenCall c = MakeScreenCall(q, docs, n, metric, mode, best_key, best_index, scratch, counters, prune,
                                      &AmxKeys);
  AmxConfigure16x64();
  HwyExactAvx3()->screen(c);
  Release();
}

void ScreenedAmx(const PreparedQuery& q, const DocRef& d, maxsim_metric metric, maxsim_mode mode, float* best_key,
                 int32_t* best_index, KernelScratch& scratch, ScreenCounters* counters) {
  ScreenedBatchAmx(q, &d, 1, metric, mode, best_key, best_index, scratch, counters, nullptr);
}

size_t LayoutBytes(const PreparedQuery& q, maxsim_mode mode) {
  return mode == MAXSIM_MODE_EXACT ? Bf16LayoutBytes(q) : I8QueryLayout::Bytes(q);
}

void Prepare(const PreparedQuery& q, maxsim_mode mode, void* out) {
  if (mode == MAXSIM_MODE_EXACT) {
    Bf16Prepare(q, out);
  } else {
    I8QueryLayout::Write(q, 0, out);
  }
}

}  // namespace
}  // namespace x86

extern const KernelOps kOpsAmx = {&x86::ExactBf16Kernel, &x86::ScreenedAmx, &x86::LayoutBytes, &x86::Prepare,
                                  &x86::ScreenedBatchAmx};

}  // namespace maxsim
