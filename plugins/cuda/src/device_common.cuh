// SPDX-License-Identifier: Apache-2.0
// Device helpers shared by the kernels: tensor-core fragments, the fixed k order, (value, index) keys.
#ifndef MAXSIM_PLUGINS_CUDA_DEVICE_COMMON_CUH_
#define MAXSIM_PLUGINS_CUDA_DEVICE_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <atomic>

#include "kernels.h"
#include "ordered_sum.h"

namespace mscuda {

constexpr unsigned kFull = 0xffffffffu;

// ---- the fixed k order of the 16-bit tensor-core dot product ------------------------------------------
//
// mma.sync.m16n8k16 takes, in lane (g = lane / 4, t = lane % 4), A elements of rows g and g+8 at logical k
// {2t, 2t+1} (a0/a1) and {2t+8, 2t+9} (a2/a3), and B elements of column g at the same logical k. Any bijection
// of physical dimensions onto logical k applied to both A and B gives the same dot product. Every kernel that
// computes a 16-bit similarity runs the same chain of k steps s = 0, 1, ... from a zero accumulator, and step s
// sums the 16 contiguous dimensions [16s, 16s + 16). Within a step, kernels place the 16 dimensions in one of
// two ways, whichever suits how they load (a 32-dimension chunk c, two steps, is one uint4 per lane: .x/.y for
// step 2c, .z/.w for step 2c + 1; MmaChunk16):
//  * quad-contiguous (LdFrag16: loads straight from global memory): lane t holds dims 16s + 4t .. 16s + 4t + 3,
//    one 8-byte piece, at logical k 2t, 2t+1, 2t+8, 2t+9;
//  * natural (LdFragNatural, LdsmFrag16 = ldmatrix from a shared-memory ring, and the Hopper wgmma kernels):
//    dim 16s + k at logical k, so lane t holds the 32-bit words at dims 16s + 2t and 16s + 8 + 2t.
// The two placements give the same bits because a tensor-core k16 step does not depend on the order of its 16
// products. PTX does not promise that; the GPU suite checks it on every run (the ring kernels against
// ExactTcKernel, wgmma against mma.sync, certified refinement against the exact kernels). Contiguous steps are
// what let shared-memory rings be filled with whole 16-byte pieces in their natural order (and read with
// ldmatrix), and the Hopper kernels copy 16-byte pieces: with a k order whose steps take 4 of every 8
// dimensions, those copies would have to be 8 bytes (about 10% slower on the visual shape).
//
// The int8 kernel (m16n8k32) uses 64-byte chunks: lane t loads bytes [64c + 16t, +16) (integer dot products
// are exact, so its order matters to nobody else).

template <typename T>
struct Mma16;

template <>
struct Mma16<__nv_bfloat16> {
  static __device__ __forceinline__ void Run(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
};

template <>
struct Mma16<__half> {
  static __device__ __forceinline__ void Run(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
};

// A score: the double sum of the per-token maxima rounded once to f32, saturating at +-FLT_MAX (as the CPU's
// RoundScore in lib/src/engine.cc): a sum beyond the f32 range is not +-inf, so -inf stays the score of an empty
// document only. Inside the range the clamp changes nothing, so the bits are the plain rounding's.
__device__ __forceinline__ float RoundScore(double sum) {
  constexpr double kMax = 3.4028234663852886e38;  // FLT_MAX
  return static_cast<float>(sum > kMax ? kMax : (sum < -kMax ? -kMax : sum));
}

// One 32-dimension chunk: two k16 steps (dims [32c, 32c + 16), then [32c + 16, 32c + 32)). qa = row g's
// fragment, qb = row g+8's, b = column g's, all in the same placement (LdFrag16, or LdFragNatural with
// LdsmFrag16).
template <typename T>
__device__ __forceinline__ void MmaChunk16(float* c, const uint4& qa, const uint4& qb, const uint4& b) {
  Mma16<T>::Run(c, qa.x, qb.x, qa.y, qb.y, b.x, b.y);
  Mma16<T>::Run(c, qa.z, qb.z, qa.w, qb.w, b.z, b.w);
}

__device__ __forceinline__ void MmaI8(int* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                      uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One 64-byte code chunk: two k32 steps.
__device__ __forceinline__ void MmaChunkI8(int* c, const uint4& qa, const uint4& qb, const uint4& b) {
  MmaI8(c, qa.x, qb.x, qa.y, qb.y, b.x, b.y);
  MmaI8(c, qa.z, qb.z, qa.w, qb.w, b.z, b.w);
}

__device__ __forceinline__ uint4 Zero4() { return make_uint4(0u, 0u, 0u, 0u); }

// 16-byte read-only load (the data is never written while a kernel runs).
__device__ __forceinline__ uint4 Ld16(const void* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

// Streamed 16-byte load: read once, do not keep in L1.
__device__ __forceinline__ uint4 Ld16Stream(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

// Quad-contiguous placement: lane t's fragment of 32-dimension chunk c of a 16-bit row that starts at `row`:
// dims [32c + 4t, +4) in .x/.y (k step 2c) and [32c + 16 + 4t, +4) in .z/.w (step 2c + 1); pieces at or past
// `dim` (a multiple of 8), and everything when !row_ok, are zero. A quad's two loads each read 32 contiguous
// bytes (one sector).
__device__ __forceinline__ uint4 LdFrag16(const uint8_t* row, uint32_t c, int t, uint32_t dim, bool row_ok) {
  const uint32_t lo = 32 * c + 4 * t, hi = lo + 16;
  const uint2 x = (row_ok && lo < dim) ? __ldg(reinterpret_cast<const uint2*>(row + 2 * lo)) : make_uint2(0u, 0u);
  const uint2 z = (row_ok && hi < dim) ? __ldg(reinterpret_cast<const uint2*>(row + 2 * hi)) : make_uint2(0u, 0u);
  return make_uint4(x.x, x.y, z.x, z.y);
}

// Natural placement: lane t's fragment of 32-dimension chunk c: the 32-bit words at dims 32c + 2t, + 8, + 16,
// + 24 (a0 and a2 of steps 2c and 2c + 1 for an A row; b0 and b1 for a B column). Used for the query rows of
// the wgmma kernels and of the ring's launches of several queries, which load them once per query (a one-query
// ring launch and the grid take the same fragments with ldmatrix from shared memory: LdsmFrag16). Two ways to load
// the same fragment from global memory (gpu_bench on the H100 shows the difference):
//  * LdFragNatural: four independent 4-byte loads. Lowest latency; ExactTcPipeKernel loads a launch's queries
//    with it when there are several (one-query launches copy theirs once per block, ldmatrix), and the shuffle
//    version below made it about 10% slower on textual-1k when that launch loaded per warp too (less on
//    colpali-rerank).
//  * LdFragNaturalShfl: one 16-byte load per lane (dims [32c + 8t, +8): word j = dims 32c + 8t + 2j) and a 4 x 4
//    transpose inside the quad (4 shuffles) that hands lane t word t of each quad lane's vector. For
//    ExactTcSmemKernel: with LdFragNatural, ptxas hoisted all 128 of its query loads with their addresses into
//    the prologue (172 registers instead of 124: one 256-thread block per SM instead of two, and the visual
//    shape through this kernel about 40% slower). Every lane of the warp must call it (shuffles).
__device__ __forceinline__ uint4 LdFragNatural(const uint8_t* row, uint32_t c, int t, uint32_t dim, bool row_ok) {
  uint32_t w[4];
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const uint32_t d0 = 32 * c + 8 * m + 2 * t;  // dim is a multiple of 8: a word is wholly in or out
    w[m] = (row_ok && d0 < dim) ? __ldg(reinterpret_cast<const uint32_t*>(row + 2 * d0)) : 0u;
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// One round of the quad transpose below: a lane with `first` set sends (a0, a1) to lane ^ m and replaces them
// with what that lane sent; a lane without it does the same with (b0, b1).
__device__ __forceinline__ void TradeWordPair(uint32_t& a0, uint32_t& a1, uint32_t& b0, uint32_t& b1, bool first,
                                              int m) {
  const uint32_t p = __shfl_xor_sync(0xffffffffu, first ? a0 : b0, m);
  const uint32_t q = __shfl_xor_sync(0xffffffffu, first ? a1 : b1, m);
  if (first) {
    a0 = p;
    a1 = q;
  } else {
    b0 = p;
    b1 = q;
  }
}

__device__ __forceinline__ uint4 LdFragNaturalShfl(const uint8_t* row, uint32_t c, int t, uint32_t dim,
                                                   bool row_ok) {
  const uint32_t off = 32 * c + 8 * t;  // dim is a multiple of 8: the vector is wholly in or out
  uint4 v = (row_ok && off < dim) ? __ldg(reinterpret_cast<const uint4*>(row + 2 * off)) : make_uint4(0u, 0u, 0u, 0u);
  // Round 1, lanes t ^ 2: words 2, 3 of lanes 0, 1 trade places with words 0, 1 of lanes 2, 3.
  TradeWordPair(v.x, v.y, v.z, v.w, (t & 2) != 0, 2);
  // Round 2, lanes t ^ 1: words 1, 3 of even lanes trade places with words 0, 2 of odd lanes.
  TradeWordPair(v.x, v.z, v.y, v.w, (t & 1) != 0, 1);
  return v;
}

// ---- cp.async (sm_80+) and shared-memory loads ----------------------------------------------------------

// 16-byte asynchronous copy global -> shared; pred = false writes 16 zero bytes (src-size 0, nothing is read).
__device__ __forceinline__ void CpAsync16(uint32_t smem, const void* gmem, bool pred) {
  const int n = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ uint4 Lds16(uint32_t addr) {
  uint4 r;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "r"(addr));
  return r;
}

// 16-bit document rows of 256 bytes (dim <= 128) in a shared-memory ring: 16-byte slot `slot` (dims
// 8 slot .. 8 slot + 7) of token `tok` sits at slot ^ (tok % 8), the 128-byte swizzle. An ldmatrix 8x8 matrix
// (8 consecutive tokens, one slot) then touches 8 distinct 16-byte bank groups: conflict-free.
constexpr uint32_t kRingRowBytes = 256;
__device__ __forceinline__ uint32_t RingSlot16(uint32_t slot, uint32_t tok) { return slot ^ (tok & 7u); }

// Fragments, natural placement, of ring rows tok0 .. tok0 + 7 (tok0 a multiple of 8), 32-dimension chunk c, from
// the ring stage at `stage`: one ldmatrix.x4 whose matrix j is dims 32c + 8j .. + 7 (lane l addresses row
// tok0 + l % 8 of matrix l / 8); lane (g, t) receives row tok0 + g's words at dims 32c + 8j + 2t. B fragments of
// document tokens; also A fragments of query rows stored in the ring's layout (a one-query ring launch, the grid).
__device__ __forceinline__ uint4 LdsmFrag16(uint32_t stage, uint32_t tok0, uint32_t c, int lane) {
  const uint32_t row = static_cast<uint32_t>(lane & 7);  // = (tok0 + row) % 8, as tok0 % 8 == 0
  const uint32_t addr = stage + (tok0 + row) * kRingRowBytes + (RingSlot16(4 * c + (lane >> 3), row) << 4);
  uint4 r;
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "r"(addr));
  return r;
}

// ---- element conversion ---------------------------------------------------------------------------------

__device__ __forceinline__ float LoadElem(const uint8_t* row, uint32_t k, int dtype) {
  if (dtype == kF32) return __ldg(reinterpret_cast<const float*>(row) + k);
  const unsigned short bits = __ldg(reinterpret_cast<const unsigned short*>(row) + k);
  if (dtype == kBF16) return __uint_as_float(static_cast<uint32_t>(bits) << 16);
  return __half2float(__ushort_as_half(bits));
}

// Elements k0 .. k0 + 3 of a row as floats (0 past dim). With vec (dim % 4 == 0 and every row 8-byte aligned for
// 16-bit types, 16-byte aligned for f32: RowsVec4), one 8- or 16-byte load: a warp whose lanes take consecutive
// groups of 4 reads each row in whole lines, where four 2-byte loads per lane would each request the row's
// sectors again.
__device__ __forceinline__ bool RowsVec4(const uint8_t* base, uint64_t row_bytes, uint32_t dim, int dtype) {
  const uint64_t a = dtype == kF32 ? 15 : 7;
  return dim % 4 == 0 && (row_bytes & a) == 0 && (reinterpret_cast<uintptr_t>(base) & a) == 0;
}
__device__ __forceinline__ void LoadElems4(const uint8_t* row, uint32_t k0, uint32_t dim, int dtype, bool vec,
                                           float v[4]) {
  if (vec && k0 < dim) {
    if (dtype == kF32) {
      const float4 x = __ldg(reinterpret_cast<const float4*>(row) + k0 / 4);
      v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
      return;
    }
    const uint2 x = __ldg(reinterpret_cast<const uint2*>(row) + k0 / 4);
    const uint32_t w[4] = {x.x & 0xffffu, x.x >> 16, x.y & 0xffffu, x.y >> 16};
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      v[u] = dtype == kBF16 ? __uint_as_float(w[u] << 16) : __half2float(__ushort_as_half(static_cast<unsigned short>(w[u])));
    }
    return;
  }
#pragma unroll
  for (int u = 0; u < 4; ++u) v[u] = k0 + u < dim ? LoadElem(row, k0 + u, dtype) : 0.0f;
}

// ---- (value, index) keys: larger = higher value, then lower index ----------------------------------------

__device__ __forceinline__ uint32_t OrderedBits(float v) {
  const uint32_t b = __float_as_uint(v + 0.0f);  // -0 -> +0: equal values must tie
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float FromOrderedBits(uint32_t o) {
  return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}
__device__ __forceinline__ unsigned long long PackKey(float v, uint32_t index) {
  return (static_cast<unsigned long long>(OrderedBits(v)) << 32) | (0xffffffffu - index);
}
__device__ __forceinline__ float KeyValue(unsigned long long k) { return FromOrderedBits(static_cast<uint32_t>(k >> 32)); }
__device__ __forceinline__ uint32_t KeyIndex(unsigned long long k) { return 0xffffffffu - static_cast<uint32_t>(k); }

// The largest of v over a quad (lanes 4g .. 4g + 3, which fold the same rows over different columns), in each of
// its lanes; fmaxf, so a NaN loses to a number.
__device__ __forceinline__ float QuadMax(float v) {
  v = fmaxf(v, __shfl_xor_sync(kFull, v, 1));
  return fmaxf(v, __shfl_xor_sync(kFull, v, 2));
}

// Merge (v, i) with the value of a lane xor `off` away: higher value wins, ties to the lower index (-1 loses).
__device__ __forceinline__ void MergeBest(float& v, int& i, int off) {
  const float ov = __shfl_xor_sync(kFull, v, off);
  const int oi = __shfl_xor_sync(kFull, i, off);
  if (ov > v || (ov == v && static_cast<unsigned>(oi) < static_cast<unsigned>(i))) {
    v = ov;
    i = oi;
  }
}

// max that propagates NaN (PTX max.NaN, sm_80+), for the folded input check: chk = MaxNaN(chk, |sim|) over
// kept similarities stays finite exactly when every one of them is.
__device__ __forceinline__ float MaxNaN(float a, float b) {
  float d;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}
// 0 when chk (MaxNaN of magnitudes) is finite, else 1.
__device__ __forceinline__ bool NotFinite(float chk) { return !(chk <= 3.402823466e38f); }

// As the CPU (lib/src/kernels/kernel.h): a norm below 2^-126 counts as a zero vector (1/n would overflow f32).
__device__ __forceinline__ float InvNorm(float n) { return n >= 0x1p-126f ? 1.0f / n : 0.0f; }

__device__ __forceinline__ float RowNorm(const SetsView& s, uint64_t row) {
  return s.norms ? s.norms[row] : s.meta[row].norm;
}

// ---- host-side launch helpers ---------------------------------------------------------------------------

// Raises kernel K's dynamic shared-memory limit to `bytes` the first time it is launched on the current device
// (the attribute belongs to the function on one device: a context sharded over several GPUs launches K on each;
// idempotent, so two threads racing here only repeat the call; devices past 63 set it on every launch).
template <auto K>
cudaError_t AllowDynamicSmemOnce(int bytes) {
  static std::atomic<uint64_t> done{0};  // bit d: set on device d
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const uint64_t bit = dev >= 0 && dev < 64 ? 1ull << dev : 0;
  if (bit != 0 && (done.load() & bit) != 0) return cudaSuccess;
  e = cudaFuncSetAttribute(K, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess) done.fetch_or(bit);
  return e;
}

// Attribute A of the current device, asked once per device: `fallback` where the query fails or gives no positive
// value (a positive fallback is kept as the answer, 0 is asked again next time).
template <cudaDeviceAttr A>
inline int DeviceAttributeOnce(int fallback) {
  static std::atomic<int> values[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return fallback;
  std::atomic<int>* slot = dev >= 0 && dev < 64 ? &values[dev] : nullptr;
  int n = slot ? slot->load() : 0;
  if (n == 0) {
    if (cudaDeviceGetAttribute(&n, A, dev) != cudaSuccess || n <= 0) n = fallback;
    if (slot && n > 0) slot->store(n);
  }
  return n;
}

// Multiprocessors of the current device (1 if the query fails).
inline int SmCount() { return DeviceAttributeOnce<cudaDevAttrMultiProcessorCount>(1); }

// The most shared memory (static + dynamic) a block may opt into on the current device (0 if the query fails):
// 227 KB on the H100, 163 KB on the A100.
inline int SharedMemoryOptinBytes() { return DeviceAttributeOnce<cudaDevAttrMaxSharedMemoryPerBlockOptin>(0); }

// Whether a launch has enough pairs for the per-warp ring kernels (ExactTcPipeKernel, ScreenPipeKernel): at least
// half a pair per warp of a full launch of 8 warps per SM. Fewer pairs would leave most ring warps idle; the
// dealt kernel takes such one-query dot calls (a block's warps on one document, DealtChosen), and the
// one-pair-per-warp kernels the others.
inline bool EnoughPairsForWarpRings(uint64_t n_pairs, int sms) {
  return 2 * n_pairs >= static_cast<uint64_t>(sms) * 8;
}

// A pair's score from its per-row terms t[0 .. n) (shared memory): summed in double in token order, as everywhere
// (kernels.h, FinalizeKernel, the CPU). One thread runs the chain; loading eight terms ahead keeps the loads off
// it (a plain loop waited on each load).
__device__ __forceinline__ double OrderedSum(const float* t, uint64_t n) {
  double sum = 0.0;
  uint64_t r = 0;
  for (; r + 8 <= n; r += 8) {
    float v[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = t[r + k];
#pragma unroll
    for (int k = 0; k < 8; ++k) sum += static_cast<double>(v[k]);
  }
  for (; r < n; ++r) sum += static_cast<double>(t[r]);
  return sum;
}

// A warp's n terms (each lane holding some of them; n = 0: none, any order) and whether they may be added in any
// order with OrderedSum's result (ordered_sum.h: no non-finite term, and the nonzero terms' exponent fields within
// 29 - ceil(log2 n) of each other). A lane adds each of its terms (Add); every lane asks Exact.
struct TermSpan {
  uint32_t hi = 0u, lo = 255u;  // this lane's largest and smallest field of a nonzero term (OrderedSumField)
  __device__ __forceinline__ void Add(float v) {
    const uint32_t e = OrderedSumField(v);
    if (e == 0u) return;  // +-0
    hi = hi > e ? hi : e;
    lo = lo < e ? lo : e;
  }
  __device__ __forceinline__ bool Exact(uint64_t n) const {
    return OrderedSumAnyOrder(__reduce_max_sync(kFull, hi), __reduce_min_sync(kFull, lo), n);
  }
};

// The warp's sum of the lanes' exact partial sums s (TermSpan::Exact held): a tree over the lanes, then + 0.0,
// which gives an exact zero OrderedSum's sign (its sum starts at +0.0, so it is never -0.0; the tree's is when every
// term is -0.0).
__device__ __forceinline__ double WarpTreeSum(double s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(kFull, s, o);
  return s + 0.0;
}

// OrderedSum's double, on every lane of a warp whose lane l holds term l (0.0f from lane n on; n <= 32, the same on
// every lane): the tree where TermSpan allows it (five shuffles, in place of a chain of n dependent additions),
// else the terms in token order as OrderedSum adds them. Ragged query rows of real embeddings span a few exponents;
// the chain is there for adversarial ones.
__device__ __forceinline__ double WarpOrderedSum(float term, uint32_t n) {
  TermSpan span;
  span.Add(term);
  if (span.Exact(n)) return WarpTreeSum(static_cast<double>(term));
  double sum = 0.0;
  for (uint32_t r = 0; r < n; ++r) sum += static_cast<double>(__shfl_sync(kFull, term, static_cast<int>(r)));
  return sum;
}

// OrderedSum(t, n)'s double on lane 0 of a warp (every lane calls it), for any n (t: shared memory): lane l adds
// terms l, l + 32, ... and the lanes' sums meet in the tree where TermSpan allows it; else lane 0 runs OrderedSum.
__device__ __forceinline__ double WarpOrderedSumOf(const float* t, uint64_t n) {
  const uint32_t lane = threadIdx.x & 31u;
  TermSpan span;
  double s = 0.0;
  for (uint64_t r = lane; r < n; r += 32) {
    const float v = t[r];
    span.Add(v);
    s += static_cast<double>(v);
  }
  if (span.Exact(n)) return WarpTreeSum(s);
  return lane == 0 ? OrderedSum(t, n) : 0.0;
}

}  // namespace mscuda

#endif  // MAXSIM_PLUGINS_CUDA_DEVICE_COMMON_CUH_
