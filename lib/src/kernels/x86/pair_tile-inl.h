// SPDX-License-Identifier: Apache-2.0
// Hook of kernels/screen_hwy-inl.h for the AVX2 and AVX-512 Highway targets (included inside its per-target
// namespace, once per target, hence no include guard): the raw vector type of the pair-per-lane refinement tile
// (RawF, kPW lanes) and its transposes, lane selection, tail mask and FMA. A target that provides these
// (TransposeRows, TransposeRowsFull, MakeSel/LaneSel, QueryAt, TailMask, Fma, ZeroF, StoreF, LoadF) gets the
// pair tile; the others refine with RefineTile alone.
#if HWY_TARGET == HWY_AVX2
using RawF = __m256;
using RawI = __m256i;
constexpr size_t kPW = 8;

// out[b] lane l = p[l][k0 + b], b < 8; `mask` (lanes set for k0 + b < dim) bounds the loads.
HWY_INLINE void TransposeRows(const float* const* p, size_t k0, const __m256i* mask, RawF* out) {
  RawF r[8], t[8];
  for (size_t i = 0; i < 8; ++i) r[i] = mask ? _mm256_maskload_ps(p[i] + k0, *mask) : _mm256_loadu_ps(p[i] + k0);
  for (size_t i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (size_t i = 0; i < 2; ++i) {  // r[4i + b], 128-bit block c: rows 4i..4i+3 at k0 + 4c + b
    r[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (size_t b = 0; b < 4; ++b) {
    out[b] = _mm256_permute2f128_ps(r[b], r[4 + b], 0x20);
    out[4 + b] = _mm256_permute2f128_ps(r[b], r[4 + b], 0x31);
  }
}

// The same for a full block, with fewer shuffles: 128-bit loads and inserts from memory put rows a and 4+a
// side by side per 4 k's, then a 4 x 4 transpose inside each 128-bit block (2 shuffles per output).
HWY_INLINE void TransposeRowsFull(const float* const* p, size_t k0, RawF* out) {
  for (size_t c = 0; c < 2; ++c) {
    RawF x[4];
    for (size_t a = 0; a < 4; ++a) {
      const size_t k = k0 + 4 * c;
      x[a] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(p[a] + k)), _mm_loadu_ps(p[4 + a] + k), 1);
    }
    const RawF t0 = _mm256_unpacklo_ps(x[0], x[1]), t1 = _mm256_unpackhi_ps(x[0], x[1]);
    const RawF t2 = _mm256_unpacklo_ps(x[2], x[3]), t3 = _mm256_unpackhi_ps(x[2], x[3]);
    const __m256d d0 = _mm256_castps_pd(t0), d1 = _mm256_castps_pd(t1);
    const __m256d d2 = _mm256_castps_pd(t2), d3 = _mm256_castps_pd(t3);
    out[4 * c + 0] = _mm256_castpd_ps(_mm256_unpacklo_pd(d0, d2));
    out[4 * c + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(d0, d2));
    out[4 * c + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(d1, d3));
    out[4 * c + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(d1, d3));
  }
}

struct LaneSel {
  __m256i idx;  // lane within its group (vpermps reads the low 3 bits)
  __m256 hi;    // sign bit set: second group
  bool two;     // lanes from both groups
};
HWY_INLINE LaneSel MakeSel(const uint32_t* lanes) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lanes));
  const __m256i hi = _mm256_slli_epi32(v, 28);
  return LaneSel{v, _mm256_castsi256_ps(hi), _mm256_movemask_ps(_mm256_castsi256_ps(hi)) != 0};
}
HWY_INLINE RawF QueryAt(const float* qa, const float* qb, const LaneSel& s) {
  const RawF a = _mm256_permutevar8x32_ps(_mm256_loadu_ps(qa), s.idx);
  if (!s.two) return a;  // lanes of the first group only: one permute (pairs come group by group)
  const RawF b = _mm256_permutevar8x32_ps(_mm256_loadu_ps(qb), s.idx);
  return _mm256_blendv_ps(a, b, s.hi);
}
HWY_INLINE __m256i TailMask(size_t n) {
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(n)), iota);
}
HWY_INLINE RawF Fma(RawF a, RawF b, RawF c) { return _mm256_fmadd_ps(a, b, c); }
HWY_INLINE RawF ZeroF() { return _mm256_setzero_ps(); }
HWY_INLINE void StoreF(RawF v, float* p) { _mm256_storeu_ps(p, v); }
HWY_INLINE RawF LoadF(const float* p) { return _mm256_load_ps(p); }
#else
using RawF = __m512;
using RawI = __m512i;
constexpr size_t kPW = 16;

// out[b] lane l = p[l][k0 + b], b < 16; `mask` bounds the loads (k0 + b < dim).
HWY_INLINE void TransposeRows(const float* const* p, size_t k0, const __mmask16* mask, RawF* out) {
  RawF r[16], t[16];
  for (size_t i = 0; i < 16; ++i) r[i] = mask ? _mm512_maskz_loadu_ps(*mask, p[i] + k0) : _mm512_loadu_ps(p[i] + k0);
  for (size_t i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (size_t i = 0; i < 4; ++i) {  // r[4i + b], 128-bit block c: rows 4i..4i+3 at k0 + 4c + b
    r[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (size_t b = 0; b < 4; ++b) {
    const RawF t88 = _mm512_shuffle_f32x4(r[b], r[4 + b], 0x88), tdd = _mm512_shuffle_f32x4(r[b], r[4 + b], 0xDD);
    const RawF u88 = _mm512_shuffle_f32x4(r[8 + b], r[12 + b], 0x88);
    const RawF udd = _mm512_shuffle_f32x4(r[8 + b], r[12 + b], 0xDD);
    out[b] = _mm512_shuffle_f32x4(t88, u88, 0x88);
    out[8 + b] = _mm512_shuffle_f32x4(t88, u88, 0xDD);
    out[4 + b] = _mm512_shuffle_f32x4(tdd, udd, 0x88);
    out[12 + b] = _mm512_shuffle_f32x4(tdd, udd, 0xDD);
  }
}

// The same for a full block, with half the shuffles: masked 128-bit broadcast loads (a load and a blend, no
// shuffle port) put rows a, 4+a, 8+a, 12+a side by side per 4 k's, then a 4 x 4 transpose inside each 128-bit
// block (2 shuffles per output).
HWY_INLINE void TransposeRowsFull(const float* const* p, size_t k0, RawF* out) {
  for (size_t c = 0; c < 4; ++c) {
    RawF x[4];
    for (size_t a = 0; a < 4; ++a) {
      const size_t k = k0 + 4 * c;
      RawF v = _mm512_castps128_ps512(_mm_loadu_ps(p[a] + k));
      v = _mm512_mask_broadcast_f32x4(v, 0x00F0, _mm_loadu_ps(p[4 + a] + k));
      v = _mm512_mask_broadcast_f32x4(v, 0x0F00, _mm_loadu_ps(p[8 + a] + k));
      x[a] = _mm512_mask_broadcast_f32x4(v, 0xF000, _mm_loadu_ps(p[12 + a] + k));
    }
    const RawF t0 = _mm512_unpacklo_ps(x[0], x[1]), t1 = _mm512_unpackhi_ps(x[0], x[1]);
    const RawF t2 = _mm512_unpacklo_ps(x[2], x[3]), t3 = _mm512_unpackhi_ps(x[2], x[3]);
    const __m512d d0 = _mm512_castps_pd(t0), d1 = _mm512_castps_pd(t1);
    const __m512d d2 = _mm512_castps_pd(t2), d3 = _mm512_castps_pd(t3);
    out[4 * c + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(d0, d2));
    out[4 * c + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(d0, d2));
    out[4 * c + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(d1, d3));
    out[4 * c + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(d1, d3));
  }
}

struct LaneSel {
  __m512i idx;  // 0..31: vpermt2ps index into (first group, second group)
};
HWY_INLINE LaneSel MakeSel(const uint32_t* lanes) {
  return LaneSel{_mm512_loadu_si512(lanes)};
}
HWY_INLINE RawF QueryAt(const float* qa, const float* qb, const LaneSel& s) {
  return _mm512_permutex2var_ps(_mm512_loadu_ps(qa), s.idx, _mm512_loadu_ps(qb));
}
HWY_INLINE __mmask16 TailMask(size_t n) { return static_cast<__mmask16>((1u << n) - 1); }
HWY_INLINE RawF Fma(RawF a, RawF b, RawF c) { return _mm512_fmadd_ps(a, b, c); }
HWY_INLINE RawF ZeroF() { return _mm512_setzero_ps(); }
HWY_INLINE void StoreF(RawF v, float* p) { _mm512_storeu_ps(p, v); }
HWY_INLINE RawF LoadF(const float* p) { return _mm512_load_ps(p); }
#endif
