// Internal interfaces between the x86 kernel files (lib/src/kernels/x86/). Each file is compiled for one ISA
// with per-function target attributes (or Highway's per-target namespaces), never with global -m flags, so a
// function from here may only be called after the kernel registry has checked the CPU features it needs.
//
//   exact_hwy.cc           Highway, compiled for AVX2 and AVX3 (AVX-512): the exact f32 register-tiled
//                          microkernel, f16/bf16 widening, and the exact refinement of screened candidates.
//   screen_avx2.cc         AVX2 i8 screening (vpsignb + vpmaddubsw + vpmaddwd), kernel "avx2".
//   screen_avx512vnni.cc   AVX-512 VNNI i8 screening (vpdpbusd), kernel "avx512-vnni".
//   exact_avx512bf16.cc    vdpbf16ps exact path for bf16 originals, kernel "avx512-bf16" (and "amx").
//   screen_amx.cc          AMX-INT8 screening (tdpbssd), kernel "amx".
//   screen_driver-inl.h    The ISA-independent part of screening: certified thresholds, exact margins on the
//                          few tokens that survive a cheap prefilter, candidate sets, refinement calls.
#ifndef MAXSIM_SRC_KERNELS_X86_X86_KERNELS_H_
#define MAXSIM_SRC_KERNELS_X86_X86_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "kernels/kernel.h"

namespace maxsim {
namespace x86 {

// Entry points of exact_hwy.cc for one Highway target. Lanes() is the f32 vector width (8 or 16).
struct HwyExactOps {
  size_t lanes;
  // Canonical E for every (query token, document row) and the running max / first argmax per query token.
  // rows: nd rows of dim f32, `stride` floats apart. inv: per row 1/||d|| (cosine) or nullptr (dot).
  void (*exact_f32)(const PreparedQuery& q, const float* rows, uint64_t stride, uint32_t nd, const float* inv,
                    float* best_key, int32_t* best_index);
  // f16/bf16 originals -> f32 rows of `dim` floats (stride dim).
  void (*widen)(const DocRef& d, float* out);
  // Refinement for one group of `lanes` query tokens (qt_group = q.qt + g * lanes): for list[i] (increasing
  // document rows) computes E against every lane and folds key = E (or E * inv[row]) into best/arg for the
  // lanes whose bit is set in masks[i] (strict >, so the lowest row wins ties).
  void (*refine)(const float* qt_group, uint32_t n_padded, uint32_t dim, const float* rows, uint64_t stride,
                 const uint32_t* list, const uint32_t* masks, size_t n, const float* inv, float* best,
                 int32_t* arg);
};

// nullptr when the build did not compile that target.
const HwyExactOps* HwyExactAvx2();
const HwyExactOps* HwyExactAvx3();

// Document rows as f32: the originals when they are f32, else widened once per document into scratch.cache.
const float* RowsF32(const HwyExactOps& ops, const DocRef& d, KernelScratch& scratch, uint64_t* stride);

// The shared exact entry (KernelOps::exact) for a Highway target: widens f16/bf16 into scratch, computes
// cosine inverse norms, calls ops.exact_f32.
void ExactWithHwy(const HwyExactOps& ops, const PreparedQuery& q, const DocRef& d, maxsim_metric metric,
                  float* best_key, int32_t* best_index, KernelScratch& scratch);

// vdpbf16ps exact path (exact_avx512bf16.cc). Returns false (and computes nothing) when the pair falls outside
// the range where vdpbf16ps provably reproduces the canonical chain; the caller then uses the FMA path.
bool ExactBf16Dp(const PreparedQuery& q, const DocRef& d, maxsim_metric metric, float* best_key,
                 int32_t* best_index, KernelScratch& scratch);
// Query-layout hook of the kernels that use ExactBf16Dp (pair-swapped bf16 query, see exact_avx512bf16.cc).
size_t Bf16LayoutBytes(const PreparedQuery& q);
void Bf16Prepare(const PreparedQuery& q, void* out);
// KernelOps::exact of the kernels with vdpbf16ps: ExactBf16Dp where it applies, else the Highway AVX3 path.
void ExactBf16Kernel(const PreparedQuery& q, const DocRef& d, maxsim_metric metric, float* best_key,
                     int32_t* best_index, KernelScratch& scratch);
// One line saying what the vdpbf16ps self-test and rate check found on this CPU (run on first use; needs
// AVX512_BF16), and whether exact bf16 pairs take the vdpbf16ps path (the exact result is the same either way).
const char* Bf16DpVerdict();
bool Bf16DpInUse();
// Tests only: -1 (default) choose by measured rate, 1 use vdpbf16ps wherever it is exact, 0 never.
void ForceBf16DpForTest(int mode);

// AVX-512 pieces shared between kernels (screen_avx512vnni.cc).
size_t ScanAvx512(const float* Bg, uint32_t nd, const float* inv, const float* tp, uint32_t* list,
                  uint32_t* masks);
void ScreenedVnni(const PreparedQuery& q, const DocRef& d, maxsim_metric metric, maxsim_mode mode,
                  float* best_key, int32_t* best_index, KernelScratch& scratch, ScreenCounters* counters);
size_t VnniLayoutBytes(const PreparedQuery& q, maxsim_mode mode);
void VnniPrepare(const PreparedQuery& q, maxsim_mode mode, void* out);

// Query layouts shared by the screening kernels, written by the per-kernel prepare hook into one block:
//   i8 interleaved:  [padded_dim / 4][n_padded][4] int8: lane s holds q8[s][4g .. 4g+3] (zero codes beyond
//                    dim). AVX2 and AMX (as the B tile, 16 groups per tile) read it signed; VNNI reads it with
//                    a +128 bias (xor 0x80) as unsigned. The SIMD loops stop after Groups4(dim) groups.
struct I8QueryLayout {
  static size_t Groups4(uint32_t dim) { return (dim + 3) / 4; }
  static size_t Bytes(const PreparedQuery& q) { return static_cast<size_t>(q.padded_dim / 4) * q.n_padded * 4; }
  // Writes the layout; xor_bias = 0x80 gives the biased unsigned form.
  static void Write(const PreparedQuery& q, uint8_t xor_bias, int8_t* out);
};

}  // namespace x86
}  // namespace maxsim

#endif  // MAXSIM_SRC_KERNELS_X86_X86_KERNELS_H_
