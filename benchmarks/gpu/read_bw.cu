// SPDX-License-Identifier: Apache-2.0
// In-run ceiling of the GPU benchmark: the read bandwidth that plain read kernels reach, every byte read once and
// nothing written but one word that the compiler cannot prove dead. The memory-bound MaxSim shapes read their
// corpus once, so this (not a copy, which also writes) is the ceiling they are measured against. No one kernel
// is the fastest reader on every device and size, so the benchmark times every variant below at several grid
// sizes and reports the best, naming it:
//   stride-L-H     grid-stride loop, 16-byte loads, L independent loads in flight per thread, load flavour H
//   range-L-H      persistent blocks, each reading one contiguous range (as the ring kernels' warps stream
//                  their documents), L loads in flight per thread
//   chunk-L-H      one block per 64 KB chunk (no persistence: the hardware schedules the blocks)
//   bulk-S         the bulk copy engine (cp.async.bulk, sm_90): one warp per block issues 32 KB copies into an
//                  S-stage shared-memory ring, completing on one mbarrier per stage
// Load flavours H: ld (plain ld.global.v4), cs (ld.global.cs: streaming), nc (ld.global.nc.L1::no_allocate),
// ef (the same with an L2 evict-first cache policy), pf (the same with the .L2::256B prefetch size).
#include <cuda_runtime.h>
#include <stdint.h>

#include "read_bw.h"
#include "wgmma_common.cuh"

namespace {

enum Flavour { kLd, kCs, kNc, kNcEf, kNcPf };

// The L2 evict-first policy of flavour ef (a plain .L2::evict_first qualifier needs 256-bit loads).
template <int H>
__device__ __forceinline__ uint64_t Policy() {
  uint64_t pol = 0;
  if constexpr (H == kNcEf) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}

template <int H>
__device__ __forceinline__ uint4 Load16(const uint4* p, uint64_t pol) {
  uint4 v;
  if constexpr (H == kLd) {
    asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  } else if constexpr (H == kCs) {
    asm volatile("ld.global.cs.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  } else if constexpr (H == kNc) {
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  } else if constexpr (H == kNcEf) {
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(pol));
  } else {
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  }
  return v;
}

__device__ __forceinline__ void Sink(uint32_t acc, uint32_t* sink) {
  if (acc == 0x9E3779B9u) *sink = acc;  // data-dependent: keeps the loads
}

// This thread's share of elements [.., i1) of p: elements i, i + stride, ... (the caller's threads cover the
// stride), L loads in flight.
template <int L, int H>
__device__ __forceinline__ uint32_t ReadSpan(const uint4* __restrict__ p, uint64_t i, uint64_t i1, uint64_t stride) {
  uint32_t acc = 0;
  const uint64_t pol = Policy<H>();
  for (; i + (L - 1) * stride < i1; i += L * stride) {
    uint4 v[L];
#pragma unroll
    for (int k = 0; k < L; ++k) v[k] = Load16<H>(p + i + k * stride, pol);
#pragma unroll
    for (int k = 0; k < L; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  }
  for (; i < i1; i += stride) {
    const uint4 v = Load16<H>(p + i, pol);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  return acc;
}

template <int L, int H>
__global__ void __launch_bounds__(256) StrideKernel(const uint4* __restrict__ p, uint64_t n, uint32_t* sink) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  Sink(ReadSpan<L, H>(p, static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x, n, stride), sink);
}

template <int L, int H>
__global__ void __launch_bounds__(256) RangeKernel(const uint4* __restrict__ p, uint64_t n, uint32_t* sink) {
  const uint64_t b0 = blockIdx.x * n / gridDim.x, b1 = (blockIdx.x + 1ull) * n / gridDim.x;
  Sink(ReadSpan<L, H>(p, b0 + threadIdx.x, b1, blockDim.x), sink);
}

constexpr uint64_t kChunkElems = 4096;  // 64 KB per block

template <int L, int H>
__global__ void __launch_bounds__(256) ChunkKernel(const uint4* __restrict__ p, uint64_t n, uint32_t* sink) {
  const uint64_t b0 = blockIdx.x * kChunkElems, b1 = b0 + kChunkElems < n ? b0 + kChunkElems : n;
  Sink(ReadSpan<L, H>(p, b0 + threadIdx.x, b1, blockDim.x), sink);
}

constexpr uint32_t kBulkBytes = 32768;

// One warp per block; lane 0 keeps S bulk copies of kBulkBytes in flight (chunks blockIdx.x, + gridDim.x, ...);
// when one lands every lane reads a word of it, then the stage is refilled.
template <int S>
__global__ void __launch_bounds__(32) BulkKernel(const uint8_t* __restrict__ p, uint64_t n_chunks, uint32_t* sink) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) uint8_t ring[];
  __shared__ __align__(8) uint64_t bars[S];
  const uint32_t lane = threadIdx.x;
  const uint32_t ring_s = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
  const uint32_t bar_s = static_cast<uint32_t>(__cvta_generic_to_shared(bars));
  auto issue = [&](uint64_t i) {  // local chunk i of this block into stage i % S
    const uint64_t c = blockIdx.x + i * gridDim.x;
    if (c >= n_chunks) return;
    const uint32_t bar = bar_s + static_cast<uint32_t>(i % S) * 8;
    mscuda::FenceProxyAsync();  // the warp's reads of the stage before the copy engine rewrites it
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(kBulkBytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     ring_s + static_cast<uint32_t>(i % S) * kBulkBytes),
                 "l"(p + c * kBulkBytes), "r"(kBulkBytes), "r"(bar)
                 : "memory");
  };
  if (lane == 0) {
    for (int s = 0; s < S; ++s) mscuda::MbarInit(bar_s + 8 * s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int s = 0; s < S; ++s) issue(s);
  }
  __syncwarp();
  uint32_t acc = 0;
  for (uint64_t i = 0; blockIdx.x + i * gridDim.x < n_chunks; ++i) {
    mscuda::MbarWait(bar_s + static_cast<uint32_t>(i % S) * 8, static_cast<uint32_t>((i / S) & 1));
    acc ^= reinterpret_cast<const uint32_t*>(ring + (i % S) * kBulkBytes)[lane * 257 % (kBulkBytes / 4)];
    __syncwarp();
    if (lane == 0) issue(i + S);
  }
  Sink(acc, sink);
#endif
}

struct Variant {
  const char* name;
  enum Kind { kStride, kRange, kChunk, kBulk } kind;
  void (*kernel)(const uint4*, uint64_t, uint32_t*);
  void (*bulk)(const uint8_t*, uint64_t, uint32_t*);
  int stages;
};

#define MS_READ(kind, K, L, H, name) {name, Variant::kind, &K<L, H>, nullptr, 0}
const Variant kVariants[] = {
    MS_READ(kStride, StrideKernel, 4, kCs, "stride-4-cs"),
    MS_READ(kStride, StrideKernel, 4, kLd, "stride-4-ld"),
    MS_READ(kStride, StrideKernel, 8, kLd, "stride-8-ld"),
    MS_READ(kStride, StrideKernel, 8, kNc, "stride-8-nc"),
    MS_READ(kStride, StrideKernel, 8, kNcEf, "stride-8-ef"),
    MS_READ(kStride, StrideKernel, 8, kNcPf, "stride-8-pf"),
    MS_READ(kRange, RangeKernel, 8, kNc, "range-8-nc"),
    MS_READ(kRange, RangeKernel, 8, kNcPf, "range-8-pf"),
    MS_READ(kChunk, ChunkKernel, 4, kNc, "chunk-4-nc"),
    MS_READ(kChunk, ChunkKernel, 8, kNcEf, "chunk-8-ef"),
    {"bulk-4", Variant::kBulk, nullptr, &BulkKernel<4>, 4},
    {"bulk-6", Variant::kBulk, nullptr, &BulkKernel<6>, 6},
};
#undef MS_READ

}  // namespace

int ReadVariantCount() { return static_cast<int>(sizeof(kVariants) / sizeof(kVariants[0])); }

const char* ReadVariantName(int v) { return v >= 0 && v < ReadVariantCount() ? kVariants[v].name : "?"; }

bool ReadVariantPersistent(int v) {
  return v >= 0 && v < ReadVariantCount() && kVariants[v].kind != Variant::kChunk;
}

cudaError_t LaunchReadBandwidth(int v, const void* data, uint64_t bytes, int blocks, uint32_t* sink,
                                cudaStream_t stream) {
  if (v < 0 || v >= ReadVariantCount()) return cudaErrorInvalidValue;
  const Variant& r = kVariants[v];
  const uint64_t n = bytes / 16;
  switch (r.kind) {
    case Variant::kStride:
    case Variant::kRange: r.kernel<<<blocks, 256, 0, stream>>>(static_cast<const uint4*>(data), n, sink); break;
    case Variant::kChunk: {
      const uint64_t grid = (n + kChunkElems - 1) / kChunkElems;
      if (grid == 0 || grid > 0x7fffffffull) return cudaErrorInvalidValue;
      r.kernel<<<static_cast<unsigned>(grid), 256, 0, stream>>>(static_cast<const uint4*>(data), n, sink);
      break;
    }
    case Variant::kBulk: {
      // Whole 32 KB chunks only: the last partial chunk (under 32 KB) is left out of the bytes this variant reads.
      const int smem = r.stages * static_cast<int>(kBulkBytes);
      cudaError_t e = cudaFuncSetAttribute(r.bulk, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      if (e != cudaSuccess) return e;
      r.bulk<<<blocks, 32, smem, stream>>>(static_cast<const uint8_t*>(data), bytes / kBulkBytes, sink);
      break;
    }
  }
  return cudaGetLastError();
}

uint64_t ReadVariantBytes(int v, uint64_t bytes) {
  if (v >= 0 && v < ReadVariantCount() && kVariants[v].kind == Variant::kBulk) return bytes / kBulkBytes * kBulkBytes;
  return bytes / 16 * 16;
}

bool ReadVariantSupported(int v) {
  if (v < 0 || v >= ReadVariantCount()) return false;
  if (kVariants[v].kind != Variant::kBulk) return true;
  // The bulk kernel's body exists only where it was compiled for sm_90 or later (ptxVersion: the virtual
  // architecture the running code came from; a compute_80 image JIT-compiled for an H100 has an empty body).
  cudaFuncAttributes fa{};
  return cudaFuncGetAttributes(&fa, kVariants[v].bulk) == cudaSuccess && fa.ptxVersion >= 90;
}

bool ReadVariantOneBlockPerSm(int v) {
  return v >= 0 && v < ReadVariantCount() && kVariants[v].kind == Variant::kBulk;
}
