// SPDX-License-Identifier: Apache-2.0
// Kernel "avx2": exact path from exact_hwy.cc (Highway AVX2 target), i8 screening with hand-written AVX2.
//
// The integer dot I = sum_k q_k d_k of one query token and one document row, 4 codes (a "k-group") at a time,
// with vpmaddubsw (u8 x s8 pairs -> i16), vpmaddwd with ones (pairs -> i32) and vpaddd: 3 vector ops per 32
// multiply-adds, the i8 peak loop's sequence. vpmaddubsw needs one operand unsigned and saturates its i16 pair
// sums, and with a plain +128 bias the canonical codes [-127, 127] reach 255 * 127 * 2 = 64770 > 32767. So the
// unsigned operand is |d| and the signed one is q with the signs of d applied: |d| <= 128 (even a -128 code,
// which a FAST-validated buffer may hold: vpabsb gives 0x80 = 128 as u8) and |q| <= 127, so a pair sum is at
// most 2 * 128 * 127 = 32512, nothing ever saturates and I is the exact integer dot for any packed buffer.
//
// Sign table instead of vpsignb (measured, see docs/kernels.md): applying the signs with vpsignb costs one op
// per (row, query vector) plus a vpabsb per row, 30 vector ops per 192 multiply-adds where the peak loop needs
// 18; the i8 phase then ran at ~65% of the maddubs peak. Instead, once per call, every query vector and k-group
// is written with all 16 sign patterns of its 4 codes (SignTable: 512 bytes per vector and k-group), and once
// per document every k-group of every row gets |d| and the byte offset of its sign pattern (PrepRows). The inner
// loop then loads the signed operand straight from the table (folded into vpmaddubsw): per k-group and tile of
// 2 query vectors x R rows, R broadcasts of |d| and R scalar offsets, 2R table loads, and exactly the peak
// loop's 3 vector ops per product. A zero code gets the "+" pattern (its |d| is 0, so the product is 0).
// Table size: 32 KB per block of 2 query vectors at dim 128 (16 tokens), read while the block's rows stream.
// The main tile's k loop is an asm block (Dots2x3: GCC's register allocation of the intrinsic loop was fragile),
// and in a document's first block it also prepares the next tile's |d| and offsets (Dots2x3Prep) in the slots
// the multiply-bound loop leaves free (dims whose code rows are contiguous: 64, 128, 256).
//
// After the k loop: vcvtdq2ps, vmulps by the row's scale and by the lanes' query scales (the key A), running
// vmaxps per lane (top), one store of the keys per row and query vector. The rest (selection, bounds,
// refinement) is screen_hwy-inl.h (Highway AVX2).
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "kernels/x86/keys_ymm-inl.h"
#include "kernels/x86/x86_kernels.h"

#define MAXSIM_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace maxsim {
namespace x86 {
namespace {

constexpr uint32_t kW = 8;
constexpr size_t kPatterns = 16;                  // sign patterns of a k-group's 4 codes
constexpr size_t kEntry = kW * 4;                 // bytes of one query vector's k-group (8 lanes x 4 codes)
constexpr size_t kVecGroup = kPatterns * kEntry;  // 512: one query vector's k-group, all patterns
constexpr uint32_t kRows = 3;                     // rows per tile (see Rows)

// Data of one ScreenedBatch call, handed to Avx2Keys as ScreenCall::ctx / ScreenJob::ctx (the call's own stack
// object: nothing outlives the call or is shared between threads). Storage: KernelScratch::i32 of the thread.
struct Avx2Call {
  const int8_t* table = nullptr;  // [n_padded / 16][groups4][2][16 patterns][8 lanes][4], see SignTable
  uint8_t* absd = nullptr;        // [n_tokens][groups4 * 4]: |d| of the prepared document
  uint32_t* offs = nullptr;       // [n_tokens][groups4]: sign pattern * 32 of each k-group
  const DocRef* prepared = nullptr;  // the document absd/offs hold (nullptr: none)
};

// Table of the query: for block b (query vectors 2b, 2b + 1), k-group g, vector i, pattern p: the interleaved
// codes of the vector's 8 tokens with byte t of every 4 negated where bit t of p is set. vpsignb by +-1 is an
// exact negation here (query codes are in [-127, 127]).
MAXSIM_TARGET_AVX2 void SignTable(const PreparedQuery& q, int8_t* out) {
  const size_t groups4 = I8QueryLayout::Groups4(q.dim);
  const int8_t* ql = static_cast<const int8_t*>(q.layout);  // [groups4][lane_stride][4]
  __m256i sgn[kPatterns];
  for (size_t p = 0; p < kPatterns; ++p) {
    uint32_t w = 0;
    for (int t = 0; t < 4; ++t) w |= static_cast<uint32_t>((p >> t & 1) ? 0xFF : 0x01) << (8 * t);
    sgn[p] = _mm256_set1_epi32(static_cast<int32_t>(w));
  }
  const size_t nv = q.n_padded / kW;
  for (size_t v = 0; v < nv; ++v) {
    for (size_t g = 0; g < groups4; ++g) {
      const __m256i qv = _mm256_load_si256(reinterpret_cast<const __m256i*>(ql + (g * q.lane_stride + v * kW) * 4));
      int8_t* o = out + ((v / 2 * groups4 + g) * 2 + v % 2) * kVecGroup;
      for (size_t p = 0; p < kPatterns; ++p) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(o + p * kEntry), _mm256_sign_epi8(qv, sgn[p]));
      }
    }
  }
}

// |d| and the sign-pattern offsets of the k-groups of rows [j0, j1) (codes beyond dim are zero: "+" pattern).
MAXSIM_TARGET_AVX2 inline void PrepRows(const DocRef& d, uint32_t groups4, uint32_t j0, uint32_t j1, uint8_t* absd,
                                        uint32_t* offs) {
  const __m256i bits = _mm256_set1_epi32(0x08040201);
  const __m256i one8 = _mm256_set1_epi8(1);
  const __m256i one16 = _mm256_set1_epi16(1);
  const uint32_t bytes = groups4 * 4;  // <= padded_dim, a multiple of 4
  for (uint32_t j = j0; j < j1; ++j) {
    const int8_t* row = d.codes + static_cast<size_t>(j) * d.padded_dim;
    uint8_t* a = absd + static_cast<size_t>(j) * bytes;
    uint32_t* o = offs + static_cast<size_t>(j) * groups4;
    uint32_t k = 0;
    for (; k + 32 <= bytes; k += 32) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(a + k), _mm256_abs_epi8(v));
      // Per byte 1 << (k mod 4) where negative, summed per 4 bytes: the pattern; times 32: the entry offset.
      const __m256i neg = _mm256_and_si256(_mm256_cmpgt_epi8(_mm256_setzero_si256(), v), bits);
      const __m256i pat = _mm256_madd_epi16(_mm256_maddubs_epi16(neg, one8), one16);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + k / 4), _mm256_slli_epi32(pat, 5));
    }
    for (; k < bytes; k += 4) {
      uint32_t pat = 0;
      for (int t = 0; t < 4; ++t) {
        const int c = row[k + t];
        a[k + t] = static_cast<uint8_t>(c < 0 ? -c : c);
        pat |= static_cast<uint32_t>(c < 0) << t;
      }
      o[k / 4] = pat * static_cast<uint32_t>(kEntry);
    }
  }
}

// acc += x (vpaddd) with acc's register as the destination: with the intrinsic, GCC 12 wrote the sum to a
// temporary and copied it back (a vmovdqa per accumulator and k-group, 34 instead of 28 instructions per
// k-group: front-end slots the loop needs; checked in the disassembly).
MAXSIM_TARGET_AVX2 inline void AddTo(__m256i& acc, __m256i x) { __asm__("vpaddd %1, %0, %0" : "+x"(acc) : "x"(x)); }

// The main tile's k loop (2 query vectors x 3 rows, groups4 >= 1) as one asm block: the same 28 instructions per
// k-group the intrinsics compile to at best (3 |d| broadcasts, 3 offset loads, 6 vpmaddubsw with the table
// load folded in, 6 vpmaddwd, 6 vpaddd, 4 loop instructions), but independent of GCC's register allocation,
// which kept the six accumulators on the stack (a load and a store per vpaddd, ~30% slower) after unrelated
// changes to Rows. acc[i][r] += the k-groups' products of query vector i and row r.
MAXSIM_TARGET_AVX2 inline void Dots2x3(const int8_t* tb, uint32_t groups4, const uint8_t* const* ap,
                                       const uint32_t* const* op, __m256i ones, __m256i (*acc)[3]) {
  __m256i c00 = acc[0][0], c01 = acc[0][1], c02 = acc[0][2], c10 = acc[1][0], c11 = acc[1][1], c12 = acc[1][2];
  __m256i da, p;
  uint64_t g = 0, t;
  __asm__(
      "1:\n\t"
      "movl (%[o0],%[g],4), %k[t]\n\t"
      "vpbroadcastd (%[a0],%[g],4), %[da]\n\t"
      "vpmaddubsw (%[tb],%[t]), %[da], %[p]\n\t"
      "vpmaddubsw 512(%[tb],%[t]), %[da], %[da]\n\t"
      "movl (%[o1],%[g],4), %k[t]\n\t"
      "vpmaddwd %[ones], %[p], %[p]\n\t"
      "vpmaddwd %[ones], %[da], %[da]\n\t"
      "vpaddd %[p], %[c00], %[c00]\n\t"
      "vpaddd %[da], %[c10], %[c10]\n\t"
      "vpbroadcastd (%[a1],%[g],4), %[da]\n\t"
      "vpmaddubsw (%[tb],%[t]), %[da], %[p]\n\t"
      "vpmaddubsw 512(%[tb],%[t]), %[da], %[da]\n\t"
      "movl (%[o2],%[g],4), %k[t]\n\t"
      "vpmaddwd %[ones], %[p], %[p]\n\t"
      "vpmaddwd %[ones], %[da], %[da]\n\t"
      "vpaddd %[p], %[c01], %[c01]\n\t"
      "vpaddd %[da], %[c11], %[c11]\n\t"
      "vpbroadcastd (%[a2],%[g],4), %[da]\n\t"
      "vpmaddubsw (%[tb],%[t]), %[da], %[p]\n\t"
      "vpmaddubsw 512(%[tb],%[t]), %[da], %[da]\n\t"
      "add $1, %[g]\n\t"
      "add $1024, %[tb]\n\t"
      "vpmaddwd %[ones], %[p], %[p]\n\t"
      "vpmaddwd %[ones], %[da], %[da]\n\t"
      "vpaddd %[p], %[c02], %[c02]\n\t"
      "vpaddd %[da], %[c12], %[c12]\n\t"
      "cmp %[n], %[g]\n\t"
      "jb 1b\n\t"
      : [c00] "+x"(c00), [c01] "+x"(c01), [c02] "+x"(c02), [c10] "+x"(c10), [c11] "+x"(c11), [c12] "+x"(c12),
        [da] "=&x"(da), [p] "=&x"(p), [g] "+r"(g), [t] "=&r"(t), [tb] "+r"(tb)
      : [a0] "r"(ap[0]), [a1] "r"(ap[1]), [a2] "r"(ap[2]), [o0] "r"(op[0]), [o1] "r"(op[1]), [o2] "r"(op[2]),
        [ones] "x"(ones), [n] "r"(static_cast<uint64_t>(groups4))
      : "cc", "memory");
  static_assert(2 * kVecGroup == 1024 && kVecGroup == 512, "the asm's table strides");
  acc[0][0] = c00;
  acc[0][1] = c01;
  acc[0][2] = c02;
  acc[1][0] = c10;
  acc[1][1] = c11;
  acc[1][2] = c12;
}

// Constants of Dots2x3Prep, read from memory (the asm has no operands left for registers): per 4 codes the
// pattern bits 1, 2, 4, 8; bytes of 1 (vpmaddubsw: pairs of bits); words of 32 (vpmaddwd: pattern * 32).
alignas(32) constexpr uint32_t kPrepConst[24] = {
    0x08040201u, 0x08040201u, 0x08040201u, 0x08040201u, 0x08040201u, 0x08040201u, 0x08040201u, 0x08040201u,
    0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u,
    0x00200020u, 0x00200020u, 0x00200020u, 0x00200020u, 0x00200020u, 0x00200020u, 0x00200020u, 0x00200020u};
static_assert(kEntry == 0x20, "kPrepConst's pattern scale");

// Dots2x3 that also prepares the next tile's rows (|d| and the pattern offsets, PrepRows' arithmetic), one
// 32-byte chunk of codes per k-group until `nbytes` are done. Preparing them between the tiles cost ~17 cycles
// per row (Zen 5: ~2K of the ~20K TSC ticks of a Ld=180 document's i8 phase), which the out-of-order window
// could not hide (a tile is ~900 instructions); here they use the slots the multiply-bound loop leaves free,
// with da and p as temporaries (dead between two rows' products). The rows are contiguous (padded_dim ==
// groups4 * 4 == kBytes, a compile-time displacement: the asm has no operands left for row pointers), rows j..
// j + 2 at ap[0], the next rows right after them in absd / offs, their codes at src.
template <int kBytes>
MAXSIM_TARGET_AVX2 inline void Dots2x3Prep(const int8_t* tb, const uint8_t* a, const uint32_t* o, __m256i ones,
                                           __m256i (*acc)[3], const int8_t* src, size_t nbytes) {
  static_assert(kBytes % 32 == 0, "whole 32-byte chunks");
  __m256i c00 = acc[0][0], c01 = acc[0][1], c02 = acc[0][2], c10 = acc[1][0], c11 = acc[1][1], c12 = acc[1][2];
  __m256i da, p;
  // g runs from -groups4 to 0 against the rows' end pointers; qp from 0 to nbytes over the next rows.
  const uint8_t* a0 = a + kBytes;
  const uint8_t* o0 = reinterpret_cast<const uint8_t*>(o) + kBytes;
  int64_t g = -(kBytes / 4), qp = 0;
  uint64_t t;
  __asm__(
      "1:\n\t"
      "movl (%[o0],%[g],4), %k[t]\n\t"
      "vpbroadcastd (%[a0],%[g],4), %[da]\n\t"
      "vpmaddubsw (%[tb],%[t]), %[da], %[p]\n\t"
      "vpmaddubsw 512(%[tb],%[t]), %[da], %[da]\n\t"
      "movl %c[B](%[o0],%[g],4), %k[t]\n\t"
      "vpmaddwd %[ones], %[p], %[p]\n\t"
      "vpmaddwd %[ones], %[da], %[da]\n\t"
      "vpaddd %[p], %[c00], %[c00]\n\t"
      "vpaddd %[da], %[c10], %[c10]\n\t"
      "cmp %[nb], %[qp]\n\t"
      "jae 2f\n\t"
      "vmovdqu (%[src],%[qp]), %[p]\n\t"
      "vpabsb %[p], %[da]\n\t"
      "vmovdqu %[da], %c[B]*2(%[a0],%[qp])\n\t"
      "vpxor %[da], %[da], %[da]\n\t"
      "vpcmpgtb %[p], %[da], %[p]\n\t"
      "vpand (%[cst]), %[p], %[p]\n\t"
      "vpmaddubsw 32(%[cst]), %[p], %[p]\n\t"
      "vpmaddwd 64(%[cst]), %[p], %[p]\n\t"
      "vmovdqu %[p], %c[B]*2(%[o0],%[qp])\n\t"
      "add $32, %[qp]\n\t"
      "2:\n\t"
      "vpbroadcastd %c[B](%[a0],%[g],4), %[da]\n\t"
      "vpmaddubsw (%[tb],%[t]), %[da], %[p]\n\t"
      "vpmaddubsw 512(%[tb],%[t]), %[da], %[da]\n\t"
      "movl %c[B]*2(%[o0],%[g],4), %k[t]\n\t"
      "vpmaddwd %[ones], %[p], %[p]\n\t"
      "vpmaddwd %[ones], %[da], %[da]\n\t"
      "vpaddd %[p], %[c01], %[c01]\n\t"
      "vpaddd %[da], %[c11], %[c11]\n\t"
      "vpbroadcastd %c[B]*2(%[a0],%[g],4), %[da]\n\t"
      "vpmaddubsw (%[tb],%[t]), %[da], %[p]\n\t"
      "vpmaddubsw 512(%[tb],%[t]), %[da], %[da]\n\t"
      "add $1024, %[tb]\n\t"
      "vpmaddwd %[ones], %[p], %[p]\n\t"
      "vpmaddwd %[ones], %[da], %[da]\n\t"
      "vpaddd %[p], %[c02], %[c02]\n\t"
      "vpaddd %[da], %[c12], %[c12]\n\t"
      "add $1, %[g]\n\t"
      "jnz 1b\n\t"
      : [c00] "+x"(c00), [c01] "+x"(c01), [c02] "+x"(c02), [c10] "+x"(c10), [c11] "+x"(c11), [c12] "+x"(c12),
        [da] "=&x"(da), [p] "=&x"(p), [g] "+r"(g), [t] "=&r"(t), [tb] "+r"(tb), [qp] "+r"(qp)
      : [a0] "r"(a0), [o0] "r"(o0), [src] "r"(src), [nb] "r"(nbytes), [ones] "x"(ones), [cst] "r"(kPrepConst),
        [B] "i"(kBytes)
      : "cc", "memory");
  acc[0][0] = c00;
  acc[0][1] = c01;
  acc[0][2] = c02;
  acc[1][0] = c10;
  acc[1][1] = c11;
  acc[1][2] = c12;
}

template <int NQ, int R, bool kCos>
MAXSIM_TARGET_AVX2 inline void Tile(const int8_t* tb, uint32_t groups4, uint8_t* absd, uint32_t* offs, uint32_t j,
                                    const maxsim_vector_meta* meta, const float* inv, const __m256* sq, float* K,
                                    size_t group_stride, __m256* top, const int8_t* prep_codes = nullptr,
                                    uint32_t prep_rows = 0) {
  __m256i acc[NQ][R];
  for (int i = 0; i < NQ; ++i) {
    for (int r = 0; r < R; ++r) acc[i][r] = _mm256_setzero_si256();
  }
  const size_t bytes = static_cast<size_t>(groups4) * 4;
  const uint8_t* ap[R];
  const uint32_t* op[R];
  for (int r = 0; r < R; ++r) {
    ap[r] = absd + (j + r) * bytes;
    op[r] = offs + static_cast<size_t>(j + r) * groups4;
  }
  const __m256i ones = _mm256_set1_epi16(1);
  if constexpr (NQ == 2 && R == 3) {
    if (prep_rows > 0) {  // rows j + 3 .. j + 3 + prep_rows (see Rows: bytes is 64, 128 or 256 here)
      const size_t nb = static_cast<size_t>(prep_rows) * bytes;
      if (bytes == 128) {
        Dots2x3Prep<128>(tb, ap[0], op[0], ones, acc, prep_codes, nb);
      } else if (bytes == 64) {
        Dots2x3Prep<64>(tb, ap[0], op[0], ones, acc, prep_codes, nb);
      } else {
        Dots2x3Prep<256>(tb, ap[0], op[0], ones, acc, prep_codes, nb);
      }
    } else if (groups4 > 0) {
      Dots2x3(tb, groups4, ap, op, ones, acc);
    }
  } else {
  for (uint32_t g = 0; g < groups4; ++g, tb += 2 * kVecGroup) {
    for (int r = 0; r < R; ++r) {
      int32_t dw;
      std::memcpy(&dw, ap[r] + 4 * g, 4);
      const __m256i da = _mm256_set1_epi32(dw);
      const int8_t* t = tb + op[r][g];
      for (int i = 0; i < NQ; ++i) {
        const __m256i qs = _mm256_load_si256(reinterpret_cast<const __m256i*>(t + i * kVecGroup));
        AddTo(acc[i][r], _mm256_madd_epi16(_mm256_maddubs_epi16(da, qs), ones));
      }
    }
  }
  }
  StoreKeysYmm<NQ, R, kCos>(acc, j, meta, inv, sq, K, group_stride, top);
}

template <int NQ, bool kCos>
MAXSIM_TARGET_AVX2 void Rows(const int8_t* tb, uint32_t groups4, const DocRef& d, uint8_t* absd,
                             uint32_t* offs, const float* inv, const float* sq_lanes, float* K,
                             size_t group_stride, float* top_p, PrefetchQueue* pf, bool prep) {
  __m256 top[NQ], sq[NQ];
  for (int i = 0; i < NQ; ++i) {
    top[i] = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    sq[i] = _mm256_loadu_ps(sq_lanes + i * kW);
  }
  const uint32_t nd = d.n_tokens;
  uint32_t j = 0;
  // The first block of a document prepares each tile's rows just before it: the codes come from DRAM or L3,
  // prefetched three tiles ahead, and a separate pass over them stalled on those misses (measured: 10% of the
  // time in a pass that is 2% of the work); within the tiles the misses overlap with the arithmetic.
  // With two query vectors and contiguous rows (padded_dim == groups4 * 4: dim 64, 128 or 256) each tile
  // prepares the next tile's rows inside its k loop (Dots2x3Prep) and only the first tile's rows are prepared
  // before the loop.
  const uint32_t bytes = groups4 * 4;
  const bool fused = prep && NQ == 2 && d.padded_dim == bytes && (bytes == 64 || bytes == 128 || bytes == 256) &&
                     nd >= kRows;
  if (prep) PrefetchCodes(d, 0, 4 * kRows);
  if (fused) PrepRows(d, groups4, 0, kRows, absd, offs);
  // Tiles of 3 rows (6 accumulators, the |d| broadcast, ones and a temporary: no spills, checked in the
  // disassembly); 4 rows measured no faster.
  for (; j + kRows <= nd; j += kRows) {
    if (pf) pf->Step();
    if (fused) {
      PrefetchCodes(d, j + 4 * kRows, j + 5 * kRows);
      const uint32_t next = std::min(nd, j + 2 * kRows) - (j + kRows);  // rows of the next tile (or the tail)
      Tile<NQ, kRows, kCos>(tb, groups4, absd, offs, j, d.meta, inv, sq, K, group_stride, top,
                            d.codes + static_cast<size_t>(j + kRows) * bytes, next);
      continue;
    }
    if (prep) {
      PrefetchCodes(d, j + 3 * kRows, j + 4 * kRows);
      PrepRows(d, groups4, j, j + kRows, absd, offs);
    }
    Tile<NQ, kRows, kCos>(tb, groups4, absd, offs, j, d.meta, inv, sq, K, group_stride, top);
  }
  for (; j < nd; ++j) {
    if (prep && !fused) PrepRows(d, groups4, j, j + 1, absd, offs);
    Tile<NQ, 1, kCos>(tb, groups4, absd, offs, j, d.meta, inv, sq, K, group_stride, top);
  }
  for (int i = 0; i < NQ; ++i) _mm256_storeu_ps(top_p + i * kW, top[i]);
}

// ComputeKeysFn (kernels/pipeline.h) with the sign table. ScreenDoc calls it for g0 = 0 first for every document;
// the document's |d| and offsets are prepared then (and again whenever it is not the prepared one).
void Avx2Keys(const ScreenJob& job, uint32_t g0, uint32_t ng, float* K, size_t k_stride, float* top) {
  Avx2Call& c = *static_cast<Avx2Call*>(job.ctx);
  const PreparedQuery& q = *job.q;
  const DocRef& d = *job.d;
  const uint32_t groups4 = static_cast<uint32_t>(I8QueryLayout::Groups4(q.dim));
  const bool prep = g0 == 0 || c.prepared != job.d;
  // The previous document's candidate rows are prefetched (PrefetchQueue) during the blocks after the first:
  // the first block streams this document's codes from DRAM, and with both in its tiles the prefetches stalled
  // it (~10% of the i8 phase's samples on the queue's prefetcht1, Zen 5). A query of one block steps
  // in it (ScreenCall::pf_skip_first_block).
  const bool one_block = q.n_padded <= 2 * kW;
  PrefetchQueue* pf = g0 > 0 || one_block ? job.pf : nullptr;
  c.prepared = job.d;
  // Blocks start at even groups (groups_per_block = 2).
  const int8_t* tb = c.table + static_cast<size_t>(g0 / 2) * groups4 * 2 * kVecGroup;
  const float* sq = job.lanes.sq + static_cast<size_t>(g0) * kW;
  if (ng == 2) {
    job.cosine ? Rows<2, true>(tb, groups4, d, c.absd, c.offs, job.inv, sq, K, k_stride, top, pf, prep)
               : Rows<2, false>(tb, groups4, d, c.absd, c.offs, job.inv, sq, K, k_stride, top, pf, prep);
  } else {
    job.cosine ? Rows<1, true>(tb, groups4, d, c.absd, c.offs, job.inv, sq, K, k_stride, top, pf, prep)
               : Rows<1, false>(tb, groups4, d, c.absd, c.offs, job.inv, sq, K, k_stride, top, pf, prep);
  }
}

void ScreenedBatch(const PreparedQuery& q, const DocRef* docs, size_t n, maxsim_metric metric, maxsim_mode mode,
                   float* best_key, int32_t* best_index, KernelScratch& scratch, ScreenCounters* counters,
                   const ScreenPrune* prune) {
  // One block of 64-byte aligned storage: the sign table (built per call: about 2 us for 32 tokens at dim 128,
  // against ~10 us per document; in the query layout it would cost 16x the codes for every query of a batch)
  // and one document's |d| and offsets.
  const size_t groups4 = I8QueryLayout::Groups4(q.dim);
  uint32_t max_nd = 0;
  for (size_t i = 0; i < n; ++i) max_nd = std::max(max_nd, docs[i].n_tokens);
  const size_t table_bytes = static_cast<size_t>(q.n_padded / 16) * groups4 * 2 * kVecGroup;
  const size_t absd_bytes = (static_cast<size_t>(max_nd) * groups4 * 4 + 63) / 64 * 64;
  const size_t offs_bytes = static_cast<size_t>(max_nd) * groups4 * 4;
  int32_t* mem = KernelScratch::Grow(scratch.i32, (table_bytes + absd_bytes + offs_bytes + 64) / 4);
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(mem) + 63) & ~uintptr_t{63});
  Avx2Call call;
  SignTable(q, reinterpret_cast<int8_t*>(base));
  call.table = reinterpret_cast<const int8_t*>(base);
  call.absd = base + table_bytes;
  call.offs = reinterpret_cast<uint32_t*>(base + table_bytes + absd_bytes);
  ScreenCall c = MakeScreenCall(q, docs, n, metric, mode, best_key, best_index, scratch, counters, prune,
                                &Avx2Keys);
  c.ctx = &call;
  c.pf_rows_per_step = kRows;  // Avx2Keys steps once per tile, in every block but a document's first
  c.pf_skip_first_block = true;
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
