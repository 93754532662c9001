// SPDX-License-Identifier: Apache-2.0
// Hook of kernels/exact_hwy.cc for the AVX-512 Highway targets (included inside its per-target namespace, once
// per AVX-512 target, hence no include guard): the exact tile of 2 query vectors x 12 document rows in asm.
// The full AVX-512 tile (2 query vectors x 12 rows of one contiguous document) as one asm loop. Why not the
// generic Tile: with 12 row pointers, the query pointer and the loop bound live, GCC 12 keeps three of them in
// xmm registers or on the stack (a vmovq per k on port 0, which the FMAs need, plus two stack loads), and the
// tile ran at 76% of the measured zmm FMA peak in cache on a Sapphire Rapids-class core. Here the 12 rows are
// addressed from 4 bases (rows 0, 3, 6, 9) plus the row stride scaled by 1/2/4/8, so everything stays in
// registers; per k: 2 query loads, 12 vbroadcastss (load port only; folding the broadcast into both FMAs that
// use it would make 26 loads per 24 FMAs, over the 2 zmm loads per cycle: 74% in a standalone loop, 87% with
// separate broadcasts), 24 FMAs, and one prefetch of the next tile (`pf`, advancing `pf_step` bytes per k: the
// next tile's lines spread over this tile's k loop; issued as a burst before the tile they stalled on the line
// fill buffers, 37% of the exact kernel's samples). Same arithmetic as Tile: acc[i][r] = fma(q_i[k], d_r[k],
// acc), k = 0..dim-1 from +0, so the results are the canonical chain bit for bit. Leaves acc[i][r] in out[(r *
// 2 + i) * 16 ..].
HWY_INLINE void Dots2x12(const float* qt, size_t qstride, const float* row0, size_t row_stride, uint32_t dim,
                         const char* pf, size_t pf_step, float* HWY_RESTRICT out) {
  const long s = static_cast<long>(row_stride * sizeof(float));
  const char* b0 = reinterpret_cast<const char*>(row0);
  const char* b3 = b0 + 3 * s;
  const char* b6 = b0 + 6 * s;
  const char* b9 = b0 + 9 * s;
  const char* q = reinterpret_cast<const char*>(qt);
  const long qs = static_cast<long>(qstride * sizeof(float));
  long n = dim;
#define MAXSIM_Z(x) "vpxord %%zmm" #x ", %%zmm" #x ", %%zmm" #x "\n\t"
#define MAXSIM_ROW(addr, i0, i1)                  \
  "vbroadcastss " addr ", %%zmm31\n\t"            \
  "vfmadd231ps %%zmm29, %%zmm31, %%zmm" #i0 "\n\t" \
  "vfmadd231ps %%zmm30, %%zmm31, %%zmm" #i1 "\n\t"
#define MAXSIM_ST(x) "vmovups %%zmm" #x ", " #x "*64(%[out])\n\t"
  __asm__ volatile(
      MAXSIM_Z(0) MAXSIM_Z(1) MAXSIM_Z(2) MAXSIM_Z(3) MAXSIM_Z(4) MAXSIM_Z(5) MAXSIM_Z(6) MAXSIM_Z(7) MAXSIM_Z(8)
      MAXSIM_Z(9) MAXSIM_Z(10) MAXSIM_Z(11) MAXSIM_Z(12) MAXSIM_Z(13) MAXSIM_Z(14) MAXSIM_Z(15) MAXSIM_Z(16)
      MAXSIM_Z(17) MAXSIM_Z(18) MAXSIM_Z(19) MAXSIM_Z(20) MAXSIM_Z(21) MAXSIM_Z(22) MAXSIM_Z(23)
      "test %[n], %[n]\n\t"
      "jz 2f\n\t"
      "1:\n\t"
      "vmovups (%[q]), %%zmm29\n\t"
      "vmovups 64(%[q]), %%zmm30\n\t"
      MAXSIM_ROW("(%[b0])", 0, 1)
      MAXSIM_ROW("(%[b0],%[s],1)", 2, 3)
      MAXSIM_ROW("(%[b0],%[s],2)", 4, 5)
      MAXSIM_ROW("(%[b3])", 6, 7)
      MAXSIM_ROW("(%[b0],%[s],4)", 8, 9)
      MAXSIM_ROW("(%[b3],%[s],2)", 10, 11)
      MAXSIM_ROW("(%[b6])", 12, 13)
      MAXSIM_ROW("(%[b3],%[s],4)", 14, 15)
      MAXSIM_ROW("(%[b0],%[s],8)", 16, 17)
      MAXSIM_ROW("(%[b9])", 18, 19)
      MAXSIM_ROW("(%[b6],%[s],4)", 20, 21)
      MAXSIM_ROW("(%[b3],%[s],8)", 22, 23)
      "prefetcht0 (%[pf])\n\t"
      "add %[pfs], %[pf]\n\t"
      "add $4, %[b0]\n\t"
      "add $4, %[b3]\n\t"
      "add $4, %[b6]\n\t"
      "add $4, %[b9]\n\t"
      "add %[qs], %[q]\n\t"
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      "2:\n\t"
      MAXSIM_ST(0) MAXSIM_ST(1) MAXSIM_ST(2) MAXSIM_ST(3) MAXSIM_ST(4) MAXSIM_ST(5) MAXSIM_ST(6) MAXSIM_ST(7)
      MAXSIM_ST(8) MAXSIM_ST(9) MAXSIM_ST(10) MAXSIM_ST(11) MAXSIM_ST(12) MAXSIM_ST(13) MAXSIM_ST(14)
      MAXSIM_ST(15) MAXSIM_ST(16) MAXSIM_ST(17) MAXSIM_ST(18) MAXSIM_ST(19) MAXSIM_ST(20) MAXSIM_ST(21)
      MAXSIM_ST(22) MAXSIM_ST(23)
      : [b0] "+r"(b0), [b3] "+r"(b3), [b6] "+r"(b6), [b9] "+r"(b9), [q] "+r"(q), [n] "+r"(n), [pf] "+r"(pf)
      : [s] "r"(s), [qs] "r"(qs), [pfs] "r"(static_cast<long>(pf_step)), [out] "r"(out)
      : "memory", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
        "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22",
        "xmm23", "xmm29", "xmm30", "xmm31");
#undef MAXSIM_Z
#undef MAXSIM_ROW
#undef MAXSIM_ST
}
