// SPDX-License-Identifier: Apache-2.0
// Kernel "amx": the "avx512-bf16" exact path, i8 screening with AMX-INT8 tiles.
//
// Instructions: ldtilecfg once per (query, document) call (palette 1: eight tiles of 16 rows x 64 bytes),
// tileloadd, tdpbssd (signed x signed bytes: no bias needed), tilestored, tilerelease at the end of the call.
// Tile roles: A = 16 document tokens x 64 code bytes, read row-major straight from the packed codes (stride
// padded_dim); B = 16 groups of 4 code bytes x 16 query tokens, i.e. the interleaved query layout
// [k/4][lane][4] that the AVX2 kernel uses, read with stride lane_stride * 4 (the query is packed once per call
// by the layout hook); C = 16 document tokens x 16 query tokens of i32: C[m][n] = I(doc m, query n).
// Blocking: 2 document blocks x 2 query groups per step = 4 C tiles (tmm0-3), 2 A (tmm4-5), 2 B (tmm6-7): per
// 64 bytes of k, 4 tile loads feed 4 tdpbssd (16 x 16 x 64 multiply-adds each). The C tiles go through L1 (there
// is no tile-to-zmm move) and AVX-512 does the rest: per document row a vcvtdq2ps, a vmulps by the row scale and
// one by the lanes' query scales (the key A). Two ways to hand the keys to the selection (screen_hwy-inl.h):
// the fused phase (AmxSurvivors, the default) keeps only the rows some lane can keep, against a running
// threshold; KeysT stores every key and their maximum (the fallback for documents where a lane's threshold turns
// out infinite). Measured on a Sapphire Rapids-class core the tile unit and the AVX-512 epilogue hardly overlap
// (an epilogue's time adds to the tiles'), so the epilogue's instruction count, not the 1024 multiply-adds per
// cycle of tdpbssd, bounds this kernel (docs/kernels.md). Selection, bounds and refinement are Highway AVX3.
// Why the tail copy: a block with fewer than 16 document rows is copied (64 bytes of k at a time) into a
// zeroed 1 KB buffer, so no tile load reads past the document (the codes of a dense document live in a
// vector of exactly n_tokens rows).
// The AMX tile-data permission is requested at CPU detection (cpu_features.cc); the kernel list requires
// kCpuAMXPermitted, so without it the registry reports why and another kernel runs.
#include <immintrin.h>

#include <atomic>
#include <cstring>
#include <limits>

#include "kernels/x86/amx_tiles.h"
#include "kernels/x86/x86_kernels.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC bug 105593, see screen_avx512_vnni.cc
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

// One step over all k blocks into C tiles 0-3 (2 document blocks x 2 query groups): tile (b, g) is tmm(b * 2 + g).
// a0/a1: first code byte of each 16-row document block (stride as); b0/b1: the query groups in the interleaved
// layout (stride bs, bstep bytes per k block).
MAXSIM_TARGET_AMX void Compute22(const int8_t* a0, const int8_t* a1, size_t as, const int8_t* b0, const int8_t* b1,
                                 size_t bs, size_t bstep, uint32_t kblocks) {
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
}

// One query group: tiles 0 (block a0) and 2 (block a1).
MAXSIM_TARGET_AMX void Compute12(const int8_t* a0, const int8_t* a1, size_t as, const int8_t* b0, size_t bs,
                                 size_t bstep, uint32_t kblocks) {
  _tile_zero(0);
  _tile_zero(2);
  for (uint32_t kb = 0; kb < kblocks; ++kb) {
    _tile_loadd(4, a0 + kb * 64, as);
    _tile_loadd(5, a1 + kb * 64, as);
    _tile_loadd(6, b0 + kb * bstep, bs);
    _tile_dpbssd(0, 4, 6);
    _tile_dpbssd(2, 5, 6);
  }
}

// Compute22 / Compute12 with the C tiles stored to c[(b * 2 + g) * 256].
MAXSIM_TARGET_AMX void Block22(const int8_t* a0, const int8_t* a1, size_t as, const int8_t* b0, const int8_t* b1,
                               size_t bs, size_t bstep, uint32_t kblocks, int32_t* c) {
  Compute22(a0, a1, as, b0, b1, bs, bstep, kblocks);
  _tile_stored(0, c, 64);
  _tile_stored(1, c + 256, 64);
  _tile_stored(2, c + 512, 64);
  _tile_stored(3, c + 768, 64);
  MAXSIM_MEMORY_BARRIER();
}

MAXSIM_TARGET_AMX void Block12(const int8_t* a0, const int8_t* a1, size_t as, const int8_t* b0, size_t bs,
                               size_t bstep, uint32_t kblocks, int32_t* c) {
  Compute12(a0, a1, as, b0, bs, bstep, kblocks);
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

// The tile operands of one (query group pair, document) job: B = the query groups g0, g0 + 1 in the interleaved
// layout (16 k groups of 4 bytes x 16 lanes per tile, rows lane_stride * 4 bytes apart), A = the document's code
// rows (padded_dim bytes apart), kblocks tiles of 64 code bytes along k.
struct TileOperands {
  size_t bs, bstep, as;
  const int8_t* b0;
  const int8_t* b1;
  uint32_t kblocks, nd;
  TileOperands(const ScreenJob& job, uint32_t g0)
      : bs(static_cast<size_t>(job.q->lane_stride) * 4),
        bstep(16 * bs),
        as(job.d->padded_dim),
        b0(static_cast<const int8_t*>(job.layout) + static_cast<size_t>(g0) * kW * 4),
        b1(b0 + kW * 4),
        kblocks(job.d->padded_dim / 64),
        nd(job.d->n_tokens) {}
};

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
  const DocRef& d = *job.d;
  // Two C buffers, alternating per 32-row block: the tile stores of block b + 1 need not wait for the vector
  // loads of block b's post-processing.
  alignas(64) int32_t cbuf[2][4 * 256];
  alignas(64) int8_t buf[16 * 64];
  std::memset(buf, 0, sizeof(buf));
  const TileOperands t(job, g0);
  const size_t bs = t.bs, bstep = t.bstep, as = t.as;
  const int8_t* b0 = t.b0;
  const int8_t* b1 = t.b1;
  const uint32_t kblocks = t.kblocks, nd = t.nd;
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

// ---- Fused i8 phase (ComputeSurvivorsFn) ----
// Why: KeysT stores every key (a 1024 x 1024 document: 4 MB of keys) and the selection scans them all again; on
// a Sapphire Rapids-class core that was most of an amx call at Lq = Ld = 1024 (KeysT 42% and the scan 18% of the
// samples). Here a C tile's 16 keys per lane stay in registers: a tree gives the tile's maximum per lane, which
// updates the running top and with it the running threshold rt (RunningRule: never above the final threshold,
// proof at MakeRunningRule in screen_hwy-inl.h); only a tile where some lane reaches rt has its rows compared
// one by one, and the rows some lane keeps are stored with their keys (branch-free) in the group's
// SurvivorList. The selection then scans those instead of every row.
// kernel_bench (one core, amx certified / approximate) shows the gain: largest at Lq = Ld = 1024 and for
// approximate, within noise at Ld = 180. It keeps ~220 of
// 1024 rows per group at Lq = Ld = 1024 where the final threshold keeps ~86: every lane's running maximum
// climbs through ~ln(nd) records, and one of 16 lanes is enough to keep a row. Tried and dropped: keeping all
// C tiles of a group pair (4 KB per 32 rows) with per-4-row maxima, then recomputing the rows of the 4-row
// groups that reach the final threshold: the second pass cost more than the first saved (i8 phase 800K
// against 570K TSC ticks per document).
// Why the split stores: the four C tiles of a block are 4 KB, so a load of the previous block's tiles would
// alias (address bits 0-11) a tile store still in flight and wait for it. Tiles 0-1 (rows j..j+15) go to one
// 2 KB half and tiles 2-3 (rows j+16..j+31) to the other; the stores of one half overlap the loads of the other
// (rows j-16.. while the first half is written, rows j.. while the second is), and rows come out in order.

// One query group's running state.
struct GroupRun {
  __m512 sq, top, rt, c1, c3, lo, hi;
  bool approximate;
  uint32_t* rows;
  float* keys;
  size_t n;
};

MAXSIM_TARGET_AMX inline void UpdateThreshold(GroupRun& g) {
  __m512 rt = g.top;
  if (!g.approximate) {
    const __m512 rel = _mm512_mul_ps(_mm512_add_ps(_mm512_abs_ps(g.top), g.c3), _mm512_set1_ps(0x1p-13f));
    rt = _mm512_sub_ps(_mm512_sub_ps(g.top, g.c1), rel);
  }
  rt = _mm512_max_ps(rt, g.lo);  // a NaN rt (an infinite top) gives lo: -inf except for padding lanes
  g.rt = _mm512_min_ps(rt, g.hi);
}

// The C tile at c (rows j0 .. j0 + rows - 1 of the document, lanes = the group's query tokens) into g.
template <bool kCos>
MAXSIM_TARGET_AMX inline void Survive(const int32_t* c, uint32_t j0, uint32_t rows, const maxsim_vector_meta* meta,
                                      const float* inv, GroupRun& g) {
  __m512 k[16];
  for (uint32_t m = 0; m < rows; ++m) {
    const uint32_t j = j0 + m;
    // key = fl(fl(fl(float(I) * s_d) * s_q) [* inv]), the portable kernel's expression (as Post).
    const __m512 a = _mm512_mul_ps(
        _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + 16 * m)), _mm512_set1_ps(meta[j].scale)), g.sq);
    k[m] = kCos ? _mm512_mul_ps(a, _mm512_set1_ps(inv[j])) : a;
  }
  // Tile maximum. Keys are never NaN (finite inputs, norms <= 1e19: kernel.h); an infinite one is fine.
  __m512 t;
  if (rows == 16) {
    __m512 m8[8];
    for (int i = 0; i < 8; ++i) m8[i] = _mm512_max_ps(k[2 * i], k[2 * i + 1]);
    for (int i = 0; i < 4; ++i) m8[i] = _mm512_max_ps(m8[2 * i], m8[2 * i + 1]);
    t = _mm512_max_ps(_mm512_max_ps(m8[0], m8[1]), _mm512_max_ps(m8[2], m8[3]));
  } else {
    t = k[0];
    for (uint32_t m = 1; m < rows; ++m) t = _mm512_max_ps(k[m], t);
  }
  const __m512 rt = g.rt;
  g.top = _mm512_max_ps(t, g.top);
  if (_mm512_cmp_ps_mask(t, rt, _CMP_NLT_UQ) == 0) return;  // no lane of any row reaches rt
  uint32_t* rows_out = g.rows;
  float* keys_out = g.keys;
  size_t n = g.n;
  for (uint32_t m = 0; m < rows; ++m) {
    _mm512_store_ps(keys_out + n * kW, k[m]);
    rows_out[n] = j0 + m;
    n += _mm512_cmp_ps_mask(k[m], rt, _CMP_NLT_UQ) != 0;
  }
  g.n = n;
}

template <bool kCos>
MAXSIM_TARGET_AMX void SurvivorsT(const ScreenJob& job, uint32_t g0, uint32_t ng, const RunningRule* rules,
                                  SurvivorList* out, float* top_p) {
  const DocRef& d = *job.d;
  alignas(64) int32_t half[2][2 * 256];
  alignas(64) int32_t cbuf[4 * 256];
  alignas(64) int8_t buf[16 * 64];
  std::memset(buf, 0, sizeof(buf));
  const TileOperands t(job, g0);
  const size_t bs = t.bs, bstep = t.bstep, as = t.as;
  const int8_t* b0 = t.b0;
  const int8_t* b1 = t.b1;
  const uint32_t kblocks = t.kblocks, nd = t.nd;
  GroupRun g[2];
  for (uint32_t gl = 0; gl < ng; ++gl) {
    GroupRun& r = g[gl];
    r.sq = _mm512_loadu_ps(job.lanes.sq + static_cast<size_t>(g0 + gl) * kW);
    r.top = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    r.c1 = _mm512_loadu_ps(rules[gl].c1);
    r.c3 = _mm512_loadu_ps(rules[gl].c3);
    r.lo = _mm512_loadu_ps(rules[gl].lo);
    r.hi = _mm512_loadu_ps(rules[gl].hi);
    r.approximate = rules[gl].approximate;
    r.rows = out[gl].rows;
    r.keys = out[gl].keys;
    r.n = 0;
    UpdateThreshold(r);
  }
  const maxsim_vector_meta* meta = d.meta;
  const float* inv = job.inv;
  uint32_t j = 0;
  bool pending = false;  // rows j - 16 .. j - 1 of the previous block wait in half[1]
  for (; j + 32 <= nd; j += 32) {
    const int8_t* a0 = d.codes + static_cast<size_t>(j) * as;
    if (job.pf) {
      job.pf->Step();
      job.pf->Step();
    }
    if (g0 == 0) {  // the codes come from DRAM for the first group pair only; later ones find them in L2
      if (j == 0) PrefetchCodes(d, 32, 64);
      PrefetchCodes(d, j + 64, j + 96);
    }
    if (ng == 2) {
      Compute22(a0, a0 + 16 * as, as, b0, b1, bs, bstep, kblocks);
      _tile_stored(0, half[0], 64);
      _tile_stored(1, half[0] + 256, 64);
    } else {
      Compute12(a0, a0 + 16 * as, as, b0, bs, bstep, kblocks);
      _tile_stored(0, half[0], 64);
    }
    MAXSIM_MEMORY_BARRIER();
    if (pending) {
      for (uint32_t gl = 0; gl < ng; ++gl) Survive<kCos>(half[1] + gl * 256, j - 16, 16, meta, inv, g[gl]);
    }
    MAXSIM_MEMORY_BARRIER();
    if (ng == 2) {
      _tile_stored(2, half[1], 64);
      _tile_stored(3, half[1] + 256, 64);
    } else {
      _tile_stored(2, half[1], 64);
    }
    MAXSIM_MEMORY_BARRIER();
    for (uint32_t gl = 0; gl < ng; ++gl) {
      Survive<kCos>(half[0] + gl * 256, j, 16, meta, inv, g[gl]);
      UpdateThreshold(g[gl]);
    }
    pending = true;
  }
  if (pending) {
    for (uint32_t gl = 0; gl < ng; ++gl) {
      Survive<kCos>(half[1] + gl * 256, j - 16, 16, meta, inv, g[gl]);
      UpdateThreshold(g[gl]);
    }
  }
  for (; j < nd; j += 16) {
    const uint32_t rows = nd - j < 16 ? nd - j : 16;
    const int8_t* a0 = d.codes + static_cast<size_t>(j) * as;
    if (ng == 2) {
      Block21(a0, as, rows, b0, b1, bs, bstep, kblocks, buf, cbuf);
    } else {
      Block11(a0, as, rows, b0, bs, bstep, kblocks, buf, cbuf);
    }
    for (uint32_t gl = 0; gl < ng; ++gl) {
      Survive<kCos>(cbuf + gl * 256, j, rows, meta, inv, g[gl]);
      UpdateThreshold(g[gl]);
    }
  }
  for (uint32_t gl = 0; gl < ng; ++gl) {
    _mm512_storeu_ps(top_p + gl * kW, g[gl].top);
    out[gl].n = g[gl].n;
  }
}

void AmxSurvivors(const ScreenJob& job, uint32_t g0, uint32_t ng, const RunningRule* rules, SurvivorList* out,
                  float* top) {
  job.cosine ? SurvivorsT<true>(job, g0, ng, rules, out, top) : SurvivorsT<false>(job, g0, ng, rules, out, top);
}

// ComputeKeysFn (kernels/pipeline.h) for tdpbssd; the tiles are configured by ScreenedBatchAmx.
void AmxKeys(const ScreenJob& job, uint32_t g0, uint32_t ng, float* K, size_t k_stride, float* top) {
  job.cosine ? KeysT<true>(job, g0, ng, K, k_stride, top) : KeysT<false>(job, g0, ng, K, k_stride, top);
}

void ScreenedBatchAmx(const PreparedQuery& q, const DocRef* docs, size_t n, maxsim_metric metric, maxsim_mode mode,
                      float* best_key, int32_t* best_index, KernelScratch& scratch, ScreenCounters* counters,
                      const ScreenPrune* prune) {
  ScreenCall c = MakeScreenCall(q, docs, n, metric, mode, best_key, best_index, scratch, counters, prune, &AmxKeys);
  c.survivors = &AmxSurvivors;
  AmxConfigure16x64();
  HwyTargetOps(HWY_AVX3)->screen(c);
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

extern const KernelOps kOpsAmx = {&x86::ExactAvx512Bf16, &x86::ScreenedAmx,      &x86::LayoutBytes,
                                  &x86::Prepare,          &x86::ScreenedBatchAmx, &x86::kBf16DotVariants};

}  // namespace maxsim
