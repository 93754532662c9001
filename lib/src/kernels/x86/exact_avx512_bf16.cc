// SPDX-License-Identifier: Apache-2.0
// Kernel "avx512-bf16": the "avx512-vnni" kernel plus vdpbf16ps for the exact path on bf16 inputs.
//
// Instruction: vdpbf16ps zmm (16 f32 lanes; each lane accumulates the two products of one pair of bf16 values),
// the query pairs from a prepared layout (lane = query token), the document pair as a broadcast dword.
// Tile: 2 query vectors (32 tokens) x 12 document rows = 24 zmm accumulators + 2 query; per pair of k the tile
// issues 24 vdpbf16ps for 2 loads + 12 broadcasts, i.e. twice the multiply-adds of the FMA tile per instruction.
//
// Why it can be exact. Intel's pseudo-code for VDPBF16PS accumulates, per lane, one product after the other
// into the f32 accumulator with round-to-nearest-even, treating denormal inputs as zero and flushing denormal
// results (DAZ/FTZ, whatever MXCSR says). A product of two bf16 values (8-bit significands) is exact in f32,
// so each step is fl(acc + a*b) = fma(a, b, acc): the canonical chain, step for step, provided
//   (1) the pair is consumed in k order: the layout stores each pair in whichever order the instruction
//       consumes first (the SDM lists the odd element first); a one-time self-test on this CPU decides which
//       order that is, and disables the path if the instruction matches neither chain bit for bit;
//   (2) nothing is ever denormal: every nonzero bf16 value x is a multiple of 2^(e_x - 7), so every product
//       and every partial sum is a multiple of 2^(e_min(q) + e_min(d) - 14). If that is >= 2^-126 (checked per
//       query set and per document: e_min(q) + e_min(d) >= -112, no denormal inputs) no value is ever in the
//       denormal range and DAZ/FTZ change nothing.
// Pairs outside these conditions (f32/f16 data, a query not exactly representable in bf16, odd dim, tiny
// values, a CPU failing the self-test) take the FMA path, which gives the same bits. Tests compare the two.
#include <immintrin.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "half.h"
#include "kernels/x86/x86_kernels.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC bug 105593, see screen_avx512_vnni.cc
#endif

#define MAXSIM_TARGET_BF16 \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16")))

namespace maxsim {
namespace x86 {
namespace {

enum DpOrder : uint32_t { kDpUnusable = 0, kDpLowFirst = 1, kDpHighFirst = 2 };

// Header of the bf16 query layout (64 bytes), followed by [pairs][lane_stride] dwords.
struct Bf16Header {
  uint32_t usable;   // 1: query values are bf16 and not denormal, and the CPU passed the self-test
  int32_t min_exp;   // smallest unbiased exponent of a nonzero query value (INT32_MAX if all are zero)
  uint32_t pairs;    // ceil(dim / 2)
  uint32_t order;    // DpOrder
  uint32_t pad[12];
};
static_assert(sizeof(Bf16Header) == 64, "header is one cache line");

float Chain(float acc, float a0, float b0, float a1, float b1, bool low_first) {
  if (low_first) return std::fma(a1, b1, std::fma(a0, b0, acc));
  return std::fma(a0, b0, std::fma(a1, b1, acc));
}

// Runs vdpbf16ps over `pairs` steps for 16 lanes: acc[l] = dp(acc[l], a[p][l], b[p][l]).
MAXSIM_TARGET_BF16 void RunDp(const uint32_t* a, const uint32_t* b, int pairs, float* acc) {
  __m512 v = _mm512_loadu_ps(acc);
  for (int p = 0; p < pairs; ++p) {
    const __m512i x = _mm512_loadu_si512(a + 16 * p);
    const __m512i y = _mm512_loadu_si512(b + 16 * p);
    v = _mm512_dpbf16_ps(v, (__m512bh)x, (__m512bh)y);
  }
  _mm512_storeu_ps(acc, v);
}

// One-time self-test: random chains with wide exponent ranges (no denormals), compared bit for bit with the
// two possible canonical chains.
DpOrder SelfTest() {
  std::mt19937 rng(12345);
  std::uniform_int_distribution<int> expo(-24, 6), mant(0, 127), sign(0, 1);
  auto value = [&]() -> uint16_t {
    if (mant(rng) < 4) return 0;
    const uint32_t e = static_cast<uint32_t>(127 + expo(rng));
    return static_cast<uint16_t>((sign(rng) << 15) | (e << 7) | static_cast<uint32_t>(mant(rng)));
  };
  constexpr int kPairs = 64, kTrials = 64;
  bool low_ok = true, high_ok = true;
  std::vector<uint32_t> a(16 * kPairs), b(16 * kPairs);
  for (int t = 0; t < kTrials; ++t) {
    for (size_t i = 0; i < a.size(); ++i) {
      a[i] = value() | (static_cast<uint32_t>(value()) << 16);
      b[i] = value() | (static_cast<uint32_t>(value()) << 16);
    }
    // Steps that round differently under one and two roundings: acc = 1, products of half an ulp.
    if (t == 0) {
      for (int l = 0; l < 16; ++l) {
        a[l] = 0x33803380u;  // 2^-24, 2^-24
        b[l] = 0x3F803F80u;  // 1, 1
      }
    }
    float acc[16];
    for (int l = 0; l < 16; ++l) acc[l] = t == 0 ? 1.0f : Bf16ToF32(value());
    float lo[16], hi[16];
    for (int l = 0; l < 16; ++l) {
      lo[l] = hi[l] = acc[l];
      for (int p = 0; p < kPairs; ++p) {
        const uint32_t x = a[16 * p + l], y = b[16 * p + l];
        const float x0 = Bf16ToF32(static_cast<uint16_t>(x)), x1 = Bf16ToF32(static_cast<uint16_t>(x >> 16));
        const float y0 = Bf16ToF32(static_cast<uint16_t>(y)), y1 = Bf16ToF32(static_cast<uint16_t>(y >> 16));
        lo[l] = Chain(lo[l], x0, y0, x1, y1, true);
        hi[l] = Chain(hi[l], x0, y0, x1, y1, false);
      }
    }
    RunDp(a.data(), b.data(), kPairs, acc);
    for (int l = 0; l < 16; ++l) {
      low_ok &= std::memcmp(&acc[l], &lo[l], 4) == 0;
      high_ok &= std::memcmp(&acc[l], &hi[l], 4) == 0;
    }
  }
  if (low_ok && !high_ok) return kDpLowFirst;
  if (high_ok && !low_ok) return kDpHighFirst;
  return kDpUnusable;  // neither (or, impossibly, both)
}

DpOrder Order() {
  static const DpOrder order = SelfTest();
  return order;
}

// Multiply-adds per second of 16 independent vdpbf16ps chains and of 16 vfmadd231ps zmm chains (best of 3
// runs each, ~1-2 ms in all, once per process). vdpbf16ps does twice the work per instruction; whether it also issues at the
// FMA rate is a property of the core (AMD Zen 4/5: yes; Intel Sapphire Rapids: half the rate, so the FMA
// path is twice as fast there). Both paths give the same bits, so this timing can only change the speed.
MAXSIM_TARGET_BF16 double DpRate(bool dp) {
  // Long enough (~0.5M instructions per attempt) that the core has settled at its AVX-512 clock; a shorter
  // run measured both at the same (wrong) rate on a Sapphire Rapids-class core.
  constexpr int kIters = 32768;
  double best = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    __m512 acc[16];
    // Distinct start values: with equal ones the compiler proves the 16 chains equal and keeps one (a latency
    // measurement 16 times too fast, for both instructions).
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
    __m512i a = _mm512_set1_epi32(0x3F803F80), b = _mm512_set1_epi32(0x3C003C00);
    __m512 fa = _mm512_set1_ps(1.0f), fb = _mm512_set1_ps(0x1p-20f);
    const auto t0 = std::chrono::steady_clock::now();
    for (int it = 0; it < kIters; ++it) {
      if (dp) {
        for (int i = 0; i < 16; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)a, (__m512bh)b);
        __asm__ volatile("" : "+v"(a));
      } else {
        for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(fa, fb, acc[i]);
        __asm__ volatile("" : "+v"(fa));
      }
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    __m512 sum = acc[0];
    for (int i = 1; i < 16; ++i) sum = _mm512_add_ps(sum, acc[i]);
    alignas(64) float sink[16];
    _mm512_store_ps(sink, sum);
    __asm__ volatile("" : : "r"(sink[0]) : "memory");
    const double rate = 16.0 * kIters * (dp ? 32 : 16) / (s > 0 ? s : 1e-9);
    best = rate > best ? rate : best;
  }
  return best;
}

// The rate check, once per process: vdpbf16ps and FMA multiply-adds per second.
struct DpRates {
  double dp, fma;
};
const DpRates& Rates() {
  static const DpRates rates = [] {
    DpRate(false);  // warm-up: bring the core to its AVX-512 clock first
    DpRates r;
    r.dp = DpRate(true);
    r.fma = DpRate(false);
    return r;
  }();
  return rates;
}

// vdpbf16ps is chosen when it is at least this much faster than FMA (both give the same bits).
constexpr double kDpMinSpeedup = 1.2;

// Smallest unbiased exponent of the nonzero bf16 values in n values; INT32_MAX if all are zero, INT32_MIN if
// one is denormal.
MAXSIM_TARGET_BF16 int32_t MinExponent(const uint16_t* v, size_t n, int32_t so_far) {
  __m512i lo = _mm512_set1_epi16(-1);  // as unsigned: 0xFFFF
  const __m512i abs_mask = _mm512_set1_epi16(0x7FFF);
  size_t i = 0;
  for (; i < n; i += 32) {
    const __mmask32 valid = n - i >= 32 ? ~0u : (1u << (n - i)) - 1u;
    const __m512i x = _mm512_and_si512(_mm512_maskz_loadu_epi16(valid, v + i), abs_mask);
    const __mmask32 nonzero = _mm512_test_epi16_mask(x, x);
    lo = _mm512_mask_min_epu16(lo, nonzero, lo, x);
  }
  alignas(64) uint16_t lanes[32];
  _mm512_store_si512(lanes, lo);
  uint32_t m = 0xFFFF;
  for (uint16_t x : lanes) m = x < m ? x : m;
  if (m == 0xFFFF) return so_far;  // all zero
  const uint32_t field = m >> 7;
  if (field == 0) return std::numeric_limits<int32_t>::min();
  const int32_t e = static_cast<int32_t>(field) - 127;
  return e < so_far ? e : so_far;
}

template <int NQ, int R, bool kCos>
MAXSIM_TARGET_BF16 inline void Tile(const uint32_t* ql, size_t qstride, uint32_t pairs, const uint8_t* rows,
                             uint64_t row_bytes, uint32_t j, const float* inv, float* best, int32_t* arg) {
  __m512 acc[NQ][R];
  const uint8_t* rp[R];
  for (int r = 0; r < R; ++r) {
    rp[r] = rows + static_cast<uint64_t>(j + r) * row_bytes;
    for (int i = 0; i < NQ; ++i) acc[i][r] = _mm512_setzero_ps();
  }
  for (uint32_t p = 0; p < pairs; ++p) {
    __m512i qv[NQ];
    for (int i = 0; i < NQ; ++i) qv[i] = _mm512_loadu_si512(ql + p * qstride + i * 16);
    for (int r = 0; r < R; ++r) {
      int32_t dw;
      std::memcpy(&dw, rp[r] + 4 * p, 4);
      const __m512i dv = _mm512_set1_epi32(dw);
      for (int i = 0; i < NQ; ++i) acc[i][r] = _mm512_dpbf16_ps(acc[i][r], (__m512bh)qv[i], (__m512bh)dv);
    }
  }
  for (int i = 0; i < NQ; ++i) {
    __m512 bv = _mm512_loadu_ps(best + 16 * i);
    __m512i av = _mm512_loadu_si512(arg + 16 * i);
    for (int r = 0; r < R; ++r) {
      const __m512 key = kCos ? _mm512_mul_ps(acc[i][r], _mm512_set1_ps(inv[j + r])) : acc[i][r];
      const __mmask16 gt = _mm512_cmp_ps_mask(key, bv, _CMP_GT_OQ);
      bv = _mm512_mask_mov_ps(bv, gt, key);
      av = _mm512_mask_mov_epi32(av, gt, _mm512_set1_epi32(static_cast<int32_t>(j + r)));
    }
    _mm512_storeu_ps(best + 16 * i, bv);
    _mm512_storeu_si512(arg + 16 * i, av);
  }
}

template <int NQ, bool kCos>
MAXSIM_TARGET_BF16 void Rows(const uint32_t* ql, size_t qstride, uint32_t pairs, const uint8_t* rows, uint64_t row_bytes,
                      uint32_t nd, const float* inv, float* best, int32_t* arg) {
  uint32_t j = 0;
  for (; j + 12 <= nd; j += 12) Tile<NQ, 12, kCos>(ql, qstride, pairs, rows, row_bytes, j, inv, best, arg);
  if (j + 8 <= nd) {
    Tile<NQ, 8, kCos>(ql, qstride, pairs, rows, row_bytes, j, inv, best, arg);
    j += 8;
  }
  if (j + 4 <= nd) {
    Tile<NQ, 4, kCos>(ql, qstride, pairs, rows, row_bytes, j, inv, best, arg);
    j += 4;
  }
  if (j + 2 <= nd) {
    Tile<NQ, 2, kCos>(ql, qstride, pairs, rows, row_bytes, j, inv, best, arg);
    j += 2;
  }
  if (j < nd) Tile<NQ, 1, kCos>(ql, qstride, pairs, rows, row_bytes, j, inv, best, arg);
}

// Rotates every dword of the document rows by 16 bits (for CPUs that consume the high element first).
MAXSIM_TARGET_BF16 void SwapPairs(const DocRef& d, uint32_t pairs, uint32_t* out) {
  for (uint32_t t = 0; t < d.n_tokens; ++t) {
    const uint8_t* row = d.originals + t * d.orig_row_bytes;
    uint32_t* o = out + static_cast<size_t>(t) * pairs;
    uint32_t p = 0;
    for (; p + 16 <= pairs; p += 16) {
      _mm512_storeu_si512(o + p, _mm512_rol_epi32(_mm512_loadu_si512(row + 4 * p), 16));
    }
    for (; p < pairs; ++p) {
      uint32_t x;
      std::memcpy(&x, row + 4 * p, 4);
      o[p] = (x << 16) | (x >> 16);
    }
  }
}

}  // namespace

size_t Bf16LayoutBytes(const PreparedQuery& q) {
  return sizeof(Bf16Header) + static_cast<size_t>((q.dim + 1) / 2) * q.lane_stride * 4;
}

void Bf16Prepare(const PreparedQuery& q, void* out) {
  auto* h = static_cast<Bf16Header*>(out);
  std::memset(h, 0, sizeof(*h));
  h->pairs = (q.dim + 1) / 2;
  h->order = Order();
  h->min_exp = std::numeric_limits<int32_t>::max();
  bool usable = h->order != kDpUnusable && q.variant == kBf16DotVdpbf16ps && q.dim % 2 == 0;
  for (uint32_t s = 0; usable && s < q.n_tokens; ++s) {
    for (uint32_t k = 0; k < q.dim; ++k) {
      const uint32_t bits = FloatToBits(q.rows[static_cast<size_t>(s) * q.dim + k]);
      if (bits & 0xFFFFu) {
        usable = false;  // not exactly a bf16 value
        break;
      }
      const uint32_t mag = bits & 0x7FFFFFFFu;
      if (mag == 0) continue;
      const uint32_t field = mag >> 23;
      if (field == 0) {
        usable = false;  // denormal
        break;
      }
      h->min_exp = std::min(h->min_exp, static_cast<int32_t>(field) - 127);
    }
  }
  h->usable = usable ? 1 : 0;
  if (!usable) return;
  auto* dw = reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(out) + sizeof(Bf16Header));
  const bool low_first = h->order == kDpLowFirst;
  for (uint32_t p = 0; p < h->pairs; ++p) {
    for (uint32_t s = 0; s < q.n_tokens; ++s) {
      const float* row = q.rows + static_cast<size_t>(s) * q.dim;
      const uint32_t e0 = FloatToBits(row[2 * p]) >> 16;
      const uint32_t e1 = 2 * p + 1 < q.dim ? FloatToBits(row[2 * p + 1]) >> 16 : 0;
      dw[static_cast<size_t>(p) * q.lane_stride + s] = low_first ? (e0 | (e1 << 16)) : (e1 | (e0 << 16));
    }
  }
}

bool ExactBf16Dp(const PreparedQuery& q, const DocRef& d, maxsim_metric metric, float* best_key,
                 int32_t* best_index, KernelScratch& scratch) {
  if (d.dtype != MAXSIM_BF16 || q.layout == nullptr) return false;
  const auto* h = static_cast<const Bf16Header*>(q.layout);
  if (!h->usable) return false;
  // Per-document facts (minimum exponent, swapped copy), cached while consecutive calls see one document.
  const uint32_t pairs = h->pairs;
  const bool swap = h->order == kDpHighFirst;
  constexpr uint32_t kKind = 0xBF16;
  if (d.serial == 0 || scratch.cache_serial != d.serial || scratch.cache_kind != kKind) {
    int32_t m = std::numeric_limits<int32_t>::max();
    for (uint32_t t = 0; t < d.n_tokens && m != std::numeric_limits<int32_t>::min(); ++t) {
      m = MinExponent(reinterpret_cast<const uint16_t*>(d.originals + t * d.orig_row_bytes), d.dim, m);
    }
    if (swap) {
      float* out = KernelScratch::Grow(scratch.cache, static_cast<size_t>(d.n_tokens) * pairs + 16);
      SwapPairs(d, pairs, reinterpret_cast<uint32_t*>(out));
    }
    scratch.cache_i32 = m;
    scratch.cache_serial = d.serial;
    scratch.cache_kind = kKind;
  }
  const int32_t d_min = scratch.cache_i32;
  if (d_min == std::numeric_limits<int32_t>::min()) return false;
  if (d_min != std::numeric_limits<int32_t>::max() && h->min_exp != std::numeric_limits<int32_t>::max() &&
      static_cast<int64_t>(d_min) + h->min_exp < -112) {
    return false;
  }
  const uint8_t* rows = swap ? reinterpret_cast<const uint8_t*>(scratch.cache.data()) : d.originals;
  const uint64_t row_bytes = swap ? static_cast<uint64_t>(pairs) * 4 : d.orig_row_bytes;
  const float* inv = nullptr;
  if (metric == MAXSIM_METRIC_COSINE) {
    float* w = KernelScratch::Grow(scratch.inv, d.n_tokens);
    for (uint32_t t = 0; t < d.n_tokens; ++t) w[t] = InvNorm(d.meta[t].norm);
    inv = w;
  }
  const auto* ql = reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(q.layout) + sizeof(Bf16Header));
  alignas(64) float best[32];
  alignas(64) int32_t arg[32];
  const uint32_t nvec = q.n_padded / 16;
  for (uint32_t v = 0; v < nvec;) {
    const uint32_t nq = nvec - v >= 2 ? 2 : 1;
    for (uint32_t l = 0; l < 16 * nq; ++l) {
      best[l] = -std::numeric_limits<float>::infinity();
      arg[l] = -1;
    }
    const uint32_t* qv = ql + static_cast<size_t>(v) * 16;
    if (nq == 2) {
      inv ? Rows<2, true>(qv, q.lane_stride, pairs, rows, row_bytes, d.n_tokens, inv, best, arg)
          : Rows<2, false>(qv, q.lane_stride, pairs, rows, row_bytes, d.n_tokens, inv, best, arg);
    } else {
      inv ? Rows<1, true>(qv, q.lane_stride, pairs, rows, row_bytes, d.n_tokens, inv, best, arg)
          : Rows<1, false>(qv, q.lane_stride, pairs, rows, row_bytes, d.n_tokens, inv, best, arg);
    }
    for (uint32_t l = 0; l < 16 * nq && v * 16 + l < q.n_tokens; ++l) {
      best_key[v * 16 + l] = best[l];
      best_index[v * 16 + l] = arg[l];
    }
    v += nq;
  }
  return true;
}

namespace {

size_t LayoutBytes(const PreparedQuery& q, maxsim_mode mode) {
  return mode == MAXSIM_MODE_EXACT ? Bf16LayoutBytes(q) : BiasedLayoutBytes(q, mode);
}

void Prepare(const PreparedQuery& q, maxsim_mode mode, void* out) {
  if (mode == MAXSIM_MODE_EXACT) {
    Bf16Prepare(q, out);
  } else {
    BiasedLayoutPrepare(q, mode, out);
  }
}

}  // namespace

void ExactAvx512Bf16(const PreparedQuery& q, const DocRef& d, maxsim_metric metric, float* best_key,
                     int32_t* best_index, KernelScratch& scratch) {
  if (!ExactBf16Dp(q, d, metric, best_key, best_index, scratch)) {
    ExactWithHwy(*HwyTargetOps(HWY_AVX3), q, d, metric, best_key, best_index, scratch);
  }
}

std::string Bf16DpSelfTest() {
  switch (Order()) {
    case kDpLowFirst: return "vdpbf16ps consumes the low element of each pair first";
    case kDpHighFirst: return "vdpbf16ps consumes the high element of each pair first";
    default: return "vdpbf16ps matches neither canonical order on this CPU";
  }
}

namespace {

int DecideBf16Dot(std::string* why) {
  if (Order() == kDpUnusable) {
    if (why) *why = Bf16DpSelfTest() + " (self-test), so it cannot be exact";
    return kBf16DotFma;
  }
  const DpRates& r = Rates();
  const bool dp = r.dp >= kDpMinSpeedup * r.fma;
  if (why) {
    char text[200];
    std::snprintf(text, sizeof(text), "vdpbf16ps %.1f vs vfmadd231ps %.1f G multiply-adds/s, vdpbf16ps needs %.1fx; "
                  "self-test: ", r.dp / 1e9, r.fma / 1e9, kDpMinSpeedup);
    *why = text + Bf16DpSelfTest();
  }
  return dp ? kBf16DotVdpbf16ps : kBf16DotFma;
}

bool Bf16DotRuns(int variant, std::string* why) {
  if (variant != kBf16DotVdpbf16ps || Order() != kDpUnusable) return true;
  if (why) *why = Bf16DpSelfTest() + " (self-test), so it cannot give the exact chain";
  return false;
}

}  // namespace

extern const KernelVariants kBf16DotVariants = {"MAXSIM_BF16_DOT", "exact bf16 dot products",
                                                {"fma", "vdpbf16ps", nullptr}, &DecideBf16Dot, &Bf16DotRuns};

}  // namespace x86

extern const KernelOps kOpsAvx512Bf16 = {&x86::ExactAvx512Bf16,       &x86::ScreenedAvx512Vnni,
                                         &x86::LayoutBytes,           &x86::Prepare,
                                         &x86::ScreenedBatchAvx512Vnni, &x86::kBf16DotVariants};

}  // namespace maxsim
