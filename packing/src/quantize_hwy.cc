// SPDX-License-Identifier: Apache-2.0
// Vectorised quantisation (Highway, one source compiled per target, chosen at run time). Reproduces
// quantize_ref.cc bit for bit: the order-sensitive double sums use the same 8 lanes (lane = k mod 8) whatever
// the vector width, by keeping 8 / N accumulators of N double lanes; everything else is order-independent.
#include <cmath>
#include <cstring>
#include <limits>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "quantize_hwy.cc"
// Not compiled: the SVE targets (sizeless vectors cannot be array or struct members, which LaneSums needs); on
// AArch64 the NEON target serves every CPU, SVE ones included.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128)
#endif
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "half.h"
#include "packed.h"

HWY_BEFORE_NAMESPACE();
namespace maxsim::pack {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET == HWY_WASM || HWY_TARGET == HWY_WASM_EMU256
// Highway's WASM targets have no f64 vectors: the 8 canonical lanes as plain doubles (the same operations in
// the same order, so the same bits).
struct LaneSums {
  double acc[8];
};

HWY_INLINE void ZeroSums(LaneSums& s) {
  for (double& a : s.acc) a = 0.0;
}

HWY_INLINE double FinishSums(const LaneSums& s) { return CombineLanes(s.acc); }

HWY_INLINE void AddSquares8(LaneSums& s, const float* HWY_RESTRICT x8) {
  for (size_t i = 0; i < 8; ++i) {
    const double x = x8[i];
    s.acc[i] += x * x;
  }
}

HWY_INLINE void AddResiduals8(LaneSums& s, const float* HWY_RESTRICT v8, const int8_t* HWY_RESTRICT c8,
                              double scale) {
  for (size_t i = 0; i < 8; ++i) {
    const double e = static_cast<double>(v8[i]) - scale * static_cast<double>(c8[i]);
    s.acc[i] += e * e;
  }
}
#else
// Up to 4 double lanes per vector (N = 1, 2 or 4), so that 8 / N accumulators hold the 8 canonical lanes.
using DD = hn::CappedTag<double, 4>;
using DF_HALF = hn::Rebind<float, DD>;
using DI32_HALF = hn::Rebind<int32_t, DD>;
using DI8_HALF = hn::Rebind<int8_t, DD>;

struct LaneSums {
  // Written out: g++ compiles an implicit constructor without this target's attributes (AArch64: "target
  // specific option mismatch" when it inlines Vec128's).
  HWY_INLINE LaneSums() {}
  hn::Vec<DD> acc[8];
};

HWY_INLINE void ZeroSums(LaneSums& s) {
  const DD dd;
  for (auto& a : s.acc) a = hn::Zero(dd);
}

HWY_INLINE double FinishSums(const LaneSums& s) {
  const DD dd;
  const size_t n = hn::Lanes(dd);
  HWY_ALIGN double tmp[4];
  double lanes[8];
  for (size_t a = 0; a < 8 / n; ++a) {
    hn::Store(s.acc[a], dd, tmp);
    for (size_t i = 0; i < n; ++i) lanes[a * n + i] = tmp[i];
  }
  return CombineLanes(lanes);
}

// Adds the squares of one block of 8 values (x8 points at 8 floats) to the 8 lane sums.
HWY_INLINE void AddSquares8(LaneSums& s, const float* HWY_RESTRICT x8) {
  const DD dd;
  const DF_HALF df;
  const size_t n = hn::Lanes(dd);
  for (size_t a = 0; a < 8 / n; ++a) {
    const auto x = hn::PromoteTo(dd, hn::LoadU(df, x8 + a * n));
    s.acc[a] = hn::MulAdd(x, x, s.acc[a]);
  }
}

// Adds (v - scale * code)^2 for one block of 8 values.
HWY_INLINE void AddResiduals8(LaneSums& s, const float* HWY_RESTRICT v8, const int8_t* HWY_RESTRICT c8,
                              double scale) {
  const DD dd;
  const DF_HALF df;
  const DI32_HALF di32;
  const DI8_HALF di8;
  const size_t n = hn::Lanes(dd);
  const auto vscale = hn::Set(dd, scale);
  for (size_t a = 0; a < 8 / n; ++a) {
    const auto x = hn::PromoteTo(dd, hn::LoadU(df, v8 + a * n));
    const auto c = hn::PromoteTo(dd, hn::PromoteTo(di32, hn::LoadU(di8, c8 + a * n)));
    const auto e = hn::Sub(x, hn::Mul(vscale, c));  // scale * code is exact in double
    s.acc[a] = hn::MulAdd(e, e, s.acc[a]);
  }
}

#endif  // HWY_WASM

RowStats AnalyzeRowImpl(const float* HWY_RESTRICT v, uint32_t dim) {
  const hn::ScalableTag<float> df;
  const size_t nf = hn::Lanes(df);
  auto vmax = hn::Zero(df);
  auto all_finite = hn::FirstN(df, nf);  // all true
  const auto limit = hn::Set(df, std::numeric_limits<float>::max());
  size_t k = 0;
  for (; k + nf <= dim; k += nf) {
    const auto a = hn::Abs(hn::LoadU(df, v + k));
    all_finite = hn::And(all_finite, a <= limit);  // false for NaN and Inf
    vmax = hn::Max(vmax, a);
  }
  RowStats stats;
  stats.finite = hn::AllTrue(df, all_finite);
  float maxabs = hn::GetLane(hn::MaxOfLanes(df, vmax));
  for (; k < dim; ++k) {
    if (!std::isfinite(v[k])) stats.finite = false;
    maxabs = std::fmax(maxabs, std::fabs(v[k]));
  }
  if (!stats.finite) {
    stats.maxabs = std::numeric_limits<float>::infinity();
    return stats;  // the caller rejects the vector; its norm is not needed
  }
  stats.maxabs = maxabs;

  LaneSums sums;
  ZeroSums(sums);
  uint32_t j = 0;
  for (; j + 8 <= dim; j += 8) AddSquares8(sums, v + j);
  if (j < dim) {
    HWY_ALIGN float tail[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::memcpy(tail, v + j, (dim - j) * sizeof(float));
    AddSquares8(sums, tail);  // +0.0 leaves a non-negative lane sum unchanged
  }
  stats.norm_sq = FinishSums(sums);
  return stats;
}

// True when every element of the n_rows f32 rows (row_bytes apart) has |x| <= bound; NaN and Inf fail.
bool RowsWithinImpl(const uint8_t* HWY_RESTRICT rows, uint64_t n_rows, uint64_t row_bytes, uint32_t dim,
                    float bound) {
  const hn::ScalableTag<float> df;
  const size_t nf = hn::Lanes(df);
  const auto limit = hn::Set(df, bound);
  auto ok = hn::FirstN(df, nf);  // all true
  bool tail_ok = true;
  for (uint64_t r = 0; r < n_rows; ++r) {
    const float* HWY_RESTRICT v = reinterpret_cast<const float*>(rows + r * row_bytes);
    size_t k = 0;
    for (; k + 2 * nf <= dim; k += 2 * nf) {
      ok = hn::And(ok, hn::Abs(hn::LoadU(df, v + k)) <= limit);  // false for NaN
      ok = hn::And(ok, hn::Abs(hn::LoadU(df, v + k + nf)) <= limit);
    }
    for (; k + nf <= dim; k += nf) ok = hn::And(ok, hn::Abs(hn::LoadU(df, v + k)) <= limit);
    for (; k < dim; ++k) tail_ok &= std::fabs(v[k]) <= bound;
  }
  return tail_ok && hn::AllTrue(df, ok);
}

void QuantizeRowImpl(const float* HWY_RESTRICT v, uint32_t dim, uint32_t padded_dim, const RowStats& stats,
                     int8_t* HWY_RESTRICT codes, maxsim_vector_meta* meta) {
  const float maxabs = stats.maxabs;
  const float scale = maxabs / 127.0f;
  const bool tiny = maxabs < 0x1p-100f;
  if (tiny || codes == nullptr) {
    // Zero and tiny vectors (127 / maxabs would overflow f32) and metadata-only requests are rare: the
    // reference handles them, and is by definition identical.
    QuantizeRowRef(v, dim, padded_dim, stats, codes, meta);
    return;
  }
  const float inv = 127.0f / maxabs;

  const hn::ScalableTag<float> df;
  const hn::Rebind<int32_t, decltype(df)> di32;
  const hn::Rebind<int8_t, decltype(df)> di8;
  const size_t nf = hn::Lanes(df);
  const auto vinv = hn::Set(df, inv);
  const auto lo = hn::Set(di32, -127);
  const auto hi = hn::Set(di32, 127);
  auto vsum = hn::Zero(di32);
  uint32_t k = 0;
  for (; k + nf <= dim; k += nf) {
    const auto q = hn::Min(hn::Max(hn::NearestInt(hn::Mul(hn::LoadU(df, v + k), vinv)), lo), hi);
    vsum = hn::Add(vsum, q);
    hn::StoreU(hn::DemoteTo(di8, q), di8, codes + k);
  }
  int32_t code_sum = hn::GetLane(hn::SumOfLanes(di32, vsum));
  for (; k < dim; ++k) {
    const int32_t code = static_cast<int32_t>(std::fmin(127.0f, std::fmax(-127.0f, std::nearbyint(v[k] * inv))));
    codes[k] = static_cast<int8_t>(code);
    code_sum += code;
  }
  std::memset(codes + dim, 0, padded_dim - dim);

  LaneSums sums;
  ZeroSums(sums);
  uint32_t j = 0;
  for (; j + 8 <= dim; j += 8) AddResiduals8(sums, v + j, codes + j, scale);
  if (j < dim) {
    HWY_ALIGN float vt[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int8_t ct[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::memcpy(vt, v + j, (dim - j) * sizeof(float));
    std::memcpy(ct, codes + j, dim - j);
    AddResiduals8(sums, vt, ct, scale);
  }
  meta->scale = scale;
  meta->norm = NormFromSquares(stats.norm_sq);
  meta->resid_norm = ResidFromSquares(FinishSums(sums));
  meta->code_sum = code_sum;
}

void WidenRowImpl(const void* HWY_RESTRICT row, maxsim_dtype dtype, uint32_t dim, float* HWY_RESTRICT out) {
  if (dtype == MAXSIM_F32) {
    std::memcpy(out, row, dim * sizeof(float));
    return;
  }
  const hn::ScalableTag<float> df;
  const size_t nf = hn::Lanes(df);
  uint32_t k = 0;
  if (dtype == MAXSIM_F16) {
    const hn::Rebind<hwy::float16_t, decltype(df)> dh;
    const auto* in = static_cast<const hwy::float16_t*>(row);
    // Not on WASM: Highway 1.0.3 converts f16 there with integer arithmetic that turns Inf and NaN into finite
    // values, and this conversion is what rejects non-finite input.
#if HWY_TARGET != HWY_WASM && HWY_TARGET != HWY_WASM_EMU256
    for (; k + nf <= dim; k += nf) hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, in + k)), df, out + k);
#else
    (void)dh;
    (void)in;
    (void)nf;
#endif
    const auto* bits = static_cast<const uint16_t*>(row);
    for (; k < dim; ++k) out[k] = F16ToF32(bits[k]);
  } else {
    const hn::Rebind<hwy::bfloat16_t, decltype(df)> dbf;
    const auto* in = static_cast<const hwy::bfloat16_t*>(row);
    for (; k + nf <= dim; k += nf) hn::StoreU(hn::PromoteTo(df, hn::LoadU(dbf, in + k)), df, out + k);
    const auto* bits = static_cast<const uint16_t*>(row);
    for (; k < dim; ++k) out[k] = Bf16ToF32(bits[k]);
  }
}

// The block loop of Checksum64: 8 u64 lanes (a_l += w_l, b_l += a_l) over n_blocks 64-byte blocks, kept in
// 8 / N vectors of N lanes so the lane mapping is the same on every target.
void ChecksumBlocksImpl(const uint8_t* HWY_RESTRICT p, uint64_t n_blocks, uint64_t* HWY_RESTRICT a_out,
                        uint64_t* HWY_RESTRICT b_out) {
  const hn::CappedTag<uint64_t, 8> d;
  const size_t n = hn::Lanes(d);
  const size_t groups = 8 / n;
  hn::Vec<decltype(d)> a[8], b[8];
  for (size_t g = 0; g < groups; ++g) {
    a[g] = hn::LoadU(d, a_out + g * n);
    b[g] = hn::LoadU(d, b_out + g * n);
  }
  const auto* words = reinterpret_cast<const uint64_t*>(p);
  for (uint64_t blk = 0; blk < n_blocks; ++blk) {
    for (size_t g = 0; g < groups; ++g) {
      a[g] = hn::Add(a[g], hn::LoadU(d, words + blk * 8 + g * n));
      b[g] = hn::Add(b[g], a[g]);
    }
  }
  for (size_t g = 0; g < groups; ++g) {
    hn::StoreU(a[g], d, a_out + g * n);
    hn::StoreU(b[g], d, b_out + g * n);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace maxsim::pack
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace maxsim::pack {
HWY_EXPORT(AnalyzeRowImpl);
HWY_EXPORT(RowsWithinImpl);
HWY_EXPORT(QuantizeRowImpl);
HWY_EXPORT(WidenRowImpl);
HWY_EXPORT(ChecksumBlocksImpl);

#if HWY_COMPILE_ONLY_STATIC || (HWY_TARGETS & (HWY_TARGETS - 1)) == 0
// One target compiled (edge builds without libhwy, WebAssembly modules): it is the only choice.
RowOps RowOpsFor(int64_t) {
  return RowOps{&HWY_STATIC_DISPATCH(AnalyzeRowImpl), &HWY_STATIC_DISPATCH(QuantizeRowImpl),
                &HWY_STATIC_DISPATCH(WidenRowImpl), &HWY_STATIC_DISPATCH(ChecksumBlocksImpl),
                &HWY_STATIC_DISPATCH(RowsWithinImpl), HWY_STATIC_TARGET};
}
std::vector<int64_t> RowOpsTargets() { return {HWY_STATIC_TARGET}; }
#else
// Highway's own dispatch (HWY_DYNAMIC_DISPATCH) follows one process-wide choice; packing takes the target its
// caller allows instead, from the same tables: a ChosenTarget holding that one target gives its table index.
RowOps RowOpsFor(int64_t cap) {
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();  // best first
  int64_t target = targets.empty() ? HWY_STATIC_TARGET : targets.back();
  for (int64_t t : targets) {
    if (cap == 0 || t >= cap) {  // a larger bit is a narrower target
      target = t;
      break;
    }
  }
  hwy::ChosenTarget chosen;
  chosen.Update(target);
  const size_t i = chosen.GetIndex();
  return RowOps{HWY_DISPATCH_TABLE(AnalyzeRowImpl)[i], HWY_DISPATCH_TABLE(QuantizeRowImpl)[i],
                HWY_DISPATCH_TABLE(WidenRowImpl)[i], HWY_DISPATCH_TABLE(ChecksumBlocksImpl)[i],
                HWY_DISPATCH_TABLE(RowsWithinImpl)[i], target};
}
std::vector<int64_t> RowOpsTargets() { return hwy::SupportedAndGeneratedTargets(); }
#endif

const RowOps& BestRowOps() {
  static const RowOps ops = RowOpsFor(0);
  return ops;
}

const char* RowOpsTargetName(int64_t target) { return hwy::TargetName(target); }

float AcceptedElementBound(uint32_t dim) {
  // Every |x_k| <= b gives a sum of squares <= dim * b^2; the canonical double sum (exact squares, at most dim
  // roundings of relative 2^-53 each) then stays below dim * b^2 * (1 + 2^-20) for any dim < 2^32. b is the
  // float below 0.999 * MAX_NORM / sqrt(dim), so dim * b^2 * (1 + 2^-20) < MAX_NORM^2: accepted.
  const double b = 0.999 * MAXSIM_PACK_MAX_NORM / std::sqrt(static_cast<double>(dim == 0 ? 1 : dim));
  const float f = static_cast<float>(b);
  return static_cast<double>(f) <= b ? f : std::nextafter(f, 0.0f);
}

}  // namespace maxsim::pack
#endif  // HWY_ONCE
