// SPDX-License-Identifier: Apache-2.0
// Internal interfaces between the x86 kernel files (lib/src/kernels/x86/). Each file is compiled for one ISA
// with per-function target attributes, never with global -m flags, so a function from here may only be called
// after the kernel registry has checked the CPU features it needs. The ISA-free parts they plug into (the
// screening pipeline and the Highway exact tiles, kernels/pipeline.h) live one folder up.
//
//   exact_tile_avx512-inl.h  the AVX-512 exact tile as one asm loop (a hook of kernels/exact_hwy.cc).
//   pair_tile-inl.h          AVX2 / AVX-512 transposes of the pair-per-lane refinement tile (a hook of
//                            kernels/screen_hwy-inl.h).
//   screen_avx2.cc           AVX2 i8 screening (sign table + vpmaddubsw + vpmaddwd), kernel "avx2".
//   screen_avx512_vnni.cc    AVX-512 VNNI i8 screening (vpdpbusd), kernel "avx512-vnni".
//   screen_avx_vnni.cc       AVX-VNNI i8 screening (VEX vpdpbusd on ymm), kernel "avx-vnni".
//   exact_avx512_bf16.cc     vdpbf16ps exact path for bf16 originals, kernel "avx512-bf16" (and "amx").
//   screen_amx.cc            AMX-INT8 screening (tdpbssd), kernel "amx".
#ifndef MAXSIM_SRC_KERNELS_X86_X86_KERNELS_H_
#define MAXSIM_SRC_KERNELS_X86_X86_KERNELS_H_

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <vector>

#include "hwy/detect_targets.h"  // HWY_AVX2, HWY_AVX3: the Highway targets the x86 kernels pair with
#include "kernels/pipeline.h"

namespace maxsim {
namespace x86 {

// vdpbf16ps exact path (exact_avx512_bf16.cc). Returns false (and computes nothing) when the pair falls outside
// the range where vdpbf16ps provably reproduces the canonical chain; the caller then uses the FMA path.
bool ExactBf16Dp(const PreparedQuery& q, const DocRef& d, maxsim_metric metric, float* best_key,
                 int32_t* best_index, KernelScratch& scratch);
// Query-layout hook of the kernels that use ExactBf16Dp (pair-swapped bf16 query, see exact_avx512_bf16.cc).
size_t Bf16LayoutBytes(const PreparedQuery& q);
void Bf16Prepare(const PreparedQuery& q, void* out);
// KernelOps::exact of the kernels with vdpbf16ps: ExactBf16Dp where it applies, else the Highway AVX3 path.
void ExactAvx512Bf16(const PreparedQuery& q, const DocRef& d, maxsim_metric metric, float* best_key,
                     int32_t* best_index, KernelScratch& scratch);
// The variants of ExactAvx512Bf16 (PreparedQuery::variant; the same bits, only speed differs): FMA tiles, or
// vdpbf16ps wherever it provably reproduces the chain. The context chooses (MAXSIM_BF16_DOT, else the rate
// check: vdpbf16ps when it does at least 1.2x FMA's multiply-adds per second on this core).
enum Bf16Dot : int { kBf16DotFma = 0, kBf16DotVdpbf16ps = 1 };
extern const KernelVariants kBf16DotVariants;
// What the one-time pair-order self-test found on this CPU (needs AVX512_BF16).
std::string Bf16DpSelfTest();

// AVX-512 VNNI screening shared between kernels (screen_avx512_vnni.cc); its biased query layout is also the
// "avx-vnni" kernel's.
void ScreenedAvx512Vnni(const PreparedQuery& q, const DocRef& d, maxsim_metric metric, maxsim_mode mode,
                        float* best_key, int32_t* best_index, KernelScratch& scratch, ScreenCounters* counters);
void ScreenedBatchAvx512Vnni(const PreparedQuery& q, const DocRef* docs, size_t n, maxsim_metric metric,
                             maxsim_mode mode, float* best_key, int32_t* best_index, KernelScratch& scratch,
                             ScreenCounters* counters, const ScreenPrune* prune);
size_t BiasedLayoutBytes(const PreparedQuery& q, maxsim_mode mode);
void BiasedLayoutPrepare(const PreparedQuery& q, maxsim_mode mode, void* out);

// The ComputeKeysFn of the vpdpbusd kernels ("avx512-vnni": W = 16 lanes per group, "avx-vnni": W = 8). Both read
// the biased I8QueryLayout and differ only in RowsT::Run<NQ, kCos>, which computes the keys of every document row
// for NQ (1 or 2) query groups with its ISA's tiles. ISA-free itself.
template <uint32_t W, typename RowsT>
void BiasedLayoutKeys(const ScreenJob& job, uint32_t g0, uint32_t ng, float* K, size_t k_stride, float* top) {
  const PreparedQuery& q = *job.q;
  const size_t qstride = static_cast<size_t>(q.lane_stride) * 4;
  const uint8_t* ql = static_cast<const uint8_t*>(job.layout) + static_cast<size_t>(g0) * W * 4;
  const uint32_t groups4 = static_cast<uint32_t>(I8QueryLayout::Groups4(q.dim));
  const float* sq = job.lanes.sq + static_cast<size_t>(g0) * W;
  const DocRef& d = *job.d;
  if (ng == 2) {
    job.cosine ? RowsT::template Run<2, true>(ql, qstride, groups4, d, job.inv, sq, K, k_stride, top, job.pf)
               : RowsT::template Run<2, false>(ql, qstride, groups4, d, job.inv, sq, K, k_stride, top, job.pf);
  } else {
    job.cosine ? RowsT::template Run<1, true>(ql, qstride, groups4, d, job.inv, sq, K, k_stride, top, job.pf)
               : RowsT::template Run<1, false>(ql, qstride, groups4, d, job.inv, sq, K, k_stride, top, job.pf);
  }
}

}  // namespace x86
}  // namespace maxsim

#endif  // MAXSIM_SRC_KERNELS_X86_X86_KERNELS_H_
