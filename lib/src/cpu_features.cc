// SPDX-License-Identifier: Apache-2.0
#include "cpu_features.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#define MAXSIM_X86 1
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define MAXSIM_X86_LINUX 1  // AMX needs a per-process permission (arch_prctl), a Linux system call
#endif
#endif
#if defined(__aarch64__) || defined(_M_ARM64)
#define MAXSIM_AARCH64 1
#if defined(__linux__)
#include <sys/auxv.h>
#define MAXSIM_AARCH64_LINUX 1
#elif defined(__APPLE__)
#include <sys/sysctl.h>
#define MAXSIM_AARCH64_APPLE 1
#elif defined(_WIN32)
#include <windows.h>
#define MAXSIM_AARCH64_WINDOWS 1
#endif
#endif

#if defined(__wasm_relaxed_simd__)
#include <wasm_simd128.h>
#endif

namespace maxsim {
namespace {

#ifdef MAXSIM_X86
void Cpuid(uint32_t leaf, uint32_t subleaf, uint32_t r[4]) { __cpuid_count(leaf, subleaf, r[0], r[1], r[2], r[3]); }

uint64_t Xgetbv0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

void DetectX86(CpuInfo* info) {
  uint32_t r[4];
  Cpuid(0, 0, r);
  const uint32_t max_leaf = r[0];
  char vendor[13] = {};
  std::memcpy(vendor + 0, &r[1], 4);
  std::memcpy(vendor + 4, &r[3], 4);
  std::memcpy(vendor + 8, &r[2], 4);
  info->vendor = vendor;
  Cpuid(0x80000000u, 0, r);
  if (r[0] >= 0x80000004u) {
    char brand[49] = {};
    for (uint32_t i = 0; i < 3; ++i) {
      Cpuid(0x80000002u + i, 0, r);
      std::memcpy(brand + 16 * i, r, 16);
    }
    info->brand = brand;
    while (!info->brand.empty() && info->brand.back() == ' ') info->brand.pop_back();
    while (!info->brand.empty() && info->brand.front() == ' ') info->brand.erase(0, 1);
  }
  Cpuid(1, 0, r);
  const uint32_t ecx1 = r[2];
  const bool osxsave = ecx1 & (1u << 27);
  uint64_t xcr0 = osxsave ? Xgetbv0() : 0;
  const bool os_avx = (xcr0 & 0x6) == 0x6;             // XMM and YMM state
  const bool os_avx512 = (xcr0 & 0xE6) == 0xE6;        // + opmask, ZMM_Hi256, Hi16_ZMM
  const bool os_amx = (xcr0 & (3ull << 17)) == (3ull << 17);  // XTILECFG and XTILEDATA
  uint64_t f = 0;
  if (ecx1 & (1u << 19)) f |= kCpuSSE41;
  if (os_avx && (ecx1 & (1u << 12))) f |= kCpuFMA;
  if (os_avx && (ecx1 & (1u << 29))) f |= kCpuF16C;
  if (max_leaf >= 7) {
    Cpuid(7, 0, r);
    const uint32_t ebx7 = r[1], ecx7 = r[2], edx7 = r[3];
    if (os_avx && (ebx7 & (1u << 5))) f |= kCpuAVX2;
    if (os_avx512) {
      if (ebx7 & (1u << 16)) f |= kCpuAVX512F;
      if (ebx7 & (1u << 17)) f |= kCpuAVX512DQ;
      if (ebx7 & (1u << 30)) f |= kCpuAVX512BW;
      if (ebx7 & (1u << 31)) f |= kCpuAVX512VL;
      if (ecx7 & (1u << 11)) f |= kCpuAVX512VNNI;
    }
    const bool cpu_amx = (edx7 & (1u << 24)) && (edx7 & (1u << 25));
    if (os_amx) {
      if (edx7 & (1u << 24)) f |= kCpuAMXTile;
      if (edx7 & (1u << 25)) f |= kCpuAMXInt8;
      if (edx7 & (1u << 22)) f |= kCpuAMXBF16;
    }
    Cpuid(7, 1, r);
    if (os_avx && (r[0] & (1u << 4))) f |= kCpuAVXVNNI;
    if (os_avx512 && (r[0] & (1u << 5))) f |= kCpuAVX512BF16;
    if (!cpu_amx) {
      info->amx_note = "this CPU has no AMX-INT8";
    } else if (!os_amx) {
      info->amx_note = "the OS does not enable the AMX tile state (XCR0 bits 17-18)";
    } else {
#ifdef MAXSIM_X86_LINUX
      // Linux >= 5.16 requires each process to ask for the large tile-data state before the first tile
      // instruction; without it the instruction faults.
      constexpr long kArchReqXcompPerm = 0x1023;
      constexpr long kXfeatureXtiledata = 18;
      if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0) {
        f |= kCpuAMXPermitted;
      } else {
        info->amx_note = "the kernel refused AMX tile-data permission (arch_prctl ARCH_REQ_XCOMP_PERM failed)";
      }
#else
      // Other systems have no per-process request this library knows how to make: AMX stays off.
      info->amx_note = "AMX tile-data permission is only requested on Linux";
#endif
    }
  }
  info->features = f;
}
#endif

#ifdef MAXSIM_AARCH64
// AArch64: NEON (Advanced SIMD) is architectural; the rest comes from the OS, which also says whether it saves
// the state (SVE/SME registers) across context switches.
#if defined(MAXSIM_AARCH64_LINUX)
uint64_t DetectAarch64Features() {
  const unsigned long hw = getauxval(AT_HWCAP);
  const unsigned long hw2 = getauxval(AT_HWCAP2);
  uint64_t f = kCpuNEON;
  if (hw & (1ul << 20)) f |= kCpuDotProd;  // HWCAP_ASIMDDP
  if (hw & (1ul << 22)) f |= kCpuSVE;      // HWCAP_SVE
  if (hw2 & (1ul << 1)) f |= kCpuSVE2;     // HWCAP2_SVE2
  if (hw2 & (1ul << 13)) f |= kCpuI8MM;    // HWCAP2_I8MM
  if (hw2 & (1ul << 9)) f |= kCpuSVEI8MM;  // HWCAP2_SVEI8MM
  if (hw2 & (1ul << 23)) f |= kCpuSME;     // HWCAP2_SME
  return f;
}
#elif defined(MAXSIM_AARCH64_APPLE)
bool Sysctl(const char* name) {
  int v = 0;
  size_t len = sizeof(v);
  return sysctlbyname(name, &v, &len, nullptr, 0) == 0 && v != 0;
}
uint64_t DetectAarch64Features() {
  uint64_t f = kCpuNEON;
  if (Sysctl("hw.optional.arm.FEAT_DotProd")) f |= kCpuDotProd;
  if (Sysctl("hw.optional.arm.FEAT_I8MM")) f |= kCpuI8MM;
  if (Sysctl("hw.optional.arm.FEAT_SME")) f |= kCpuSME;
  // Apple cores have no SVE outside streaming mode.
  return f;
}
#elif defined(MAXSIM_AARCH64_WINDOWS)
uint64_t DetectAarch64Features() {
  uint64_t f = kCpuNEON;
#ifdef PF_ARM_V82_DP_INSTRUCTIONS_AVAILABLE
  if (IsProcessorFeaturePresent(PF_ARM_V82_DP_INSTRUCTIONS_AVAILABLE)) f |= kCpuDotProd;
#endif
#ifdef PF_ARM_SVE_INSTRUCTIONS_AVAILABLE
  if (IsProcessorFeaturePresent(PF_ARM_SVE_INSTRUCTIONS_AVAILABLE)) f |= kCpuSVE;
#endif
#ifdef PF_ARM_SVE2_INSTRUCTIONS_AVAILABLE
  if (IsProcessorFeaturePresent(PF_ARM_SVE2_INSTRUCTIONS_AVAILABLE)) f |= kCpuSVE2;
#endif
#ifdef PF_ARM_SVE_I8MM_INSTRUCTIONS_AVAILABLE
  if (IsProcessorFeaturePresent(PF_ARM_SVE_I8MM_INSTRUCTIONS_AVAILABLE)) f |= kCpuI8MM | kCpuSVEI8MM;
#endif
  return f;
}
#else
uint64_t DetectAarch64Features() { return kCpuNEON; }  // no OS query known here: the baseline only
#endif

void DetectAarch64(CpuInfo* info) {
  info->features = DetectAarch64Features();
  info->amx_note = "not an x86 CPU";
}
#endif

#if defined(__wasm_relaxed_simd__)
// Relaxed SIMD lets the engine compute f32x4.relaxed_madd fused or as a multiply and an add; the "wasm-relaxed"
// kernel needs it fused (the canonical chain). Checked here on inputs where the two differ (read through
// volatile so that the compiler cannot fold them); the kernel is offered only when every lane is fused.
bool ProbeRelaxed(std::string* why) {
  // (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24: a multiply rounded to f32 gives 1 + 2^-11 (a tie, to even), so
  // a * a - (1 + 2^-11) is 2^-24 fused and 0 unfused. Lanes 1-3: the same with signs and scales, and
  // 3 * fl(1/3) - 1.
  volatile float in[4][3] = {{1.0f + 0x1p-12f, 1.0f + 0x1p-12f, -(1.0f + 0x1p-11f)},
                             {-(1.0f + 0x1p-12f), 1.0f + 0x1p-12f, 1.0f + 0x1p-11f},
                             {0x1p20f + 0x1p8f, 0x1p-20f + 0x1p-32f, -(1.0f + 0x1p-11f)},
                             {3.0f, 1.0f / 3.0f, -1.0f}};
  float a[4], b[4], c[4], want[4], got[4];
  for (int l = 0; l < 4; ++l) {
    a[l] = in[l][0];
    b[l] = in[l][1];
    c[l] = in[l][2];
    want[l] = static_cast<float>(static_cast<double>(a[l]) * b[l] + c[l]);  // every sum here is exact in f64
  }
  wasm_v128_store(got, wasm_f32x4_relaxed_madd(wasm_v128_load(a), wasm_v128_load(b), wasm_v128_load(c)));
  if (std::memcmp(got, want, sizeof(got)) != 0) {
    *why = "this engine computes f32x4.relaxed_madd without fusing it (probe)";
    return false;
  }
  *why = "probe: f32x4.relaxed_madd is fused";
  return true;
}
#endif

CpuInfo Detect() {
  CpuInfo info;
#if defined(MAXSIM_X86)
  DetectX86(&info);
#elif defined(MAXSIM_AARCH64)
  DetectAarch64(&info);
#elif defined(__wasm_simd128__)
  info.features = kCpuWasmSimd128;
#if defined(__wasm_relaxed_simd__)
  if (ProbeRelaxed(&info.relaxed_note)) info.features |= kCpuWasmRelaxedSimd;
#else
  info.relaxed_note = "this module is built without relaxed SIMD";
#endif
  info.amx_note = "not an x86 CPU";
#endif
  if (const char* mask = std::getenv("MAXSIM_CPU_MASK"); mask && mask[0]) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long hide = std::strtoull(mask, &end, 16);
    if (end == mask || *end != '\0' || errno == ERANGE || mask[0] == '-') {
      info.mask_error = std::string("MAXSIM_CPU_MASK='") + mask +
                        "' is not a hexadecimal feature mask (e.g. 0x300 hides two features; unset it to hide none)";
    } else {
      info.features &= ~static_cast<uint64_t>(hide);
    }
  }
  return info;
}

}  // namespace

const CpuInfo& GetCpuInfo() {
  static const CpuInfo info = Detect();
  return info;
}

std::string FeatureNames(uint64_t mask) {
  static const struct {
    uint64_t bit;
    const char* name;
  } kNames[] = {
      {kCpuSSE41, "sse4.1"},        {kCpuAVX2, "avx2"},           {kCpuFMA, "fma"},
      {kCpuF16C, "f16c"},           {kCpuAVX512F, "avx512f"},     {kCpuAVX512BW, "avx512bw"},
      {kCpuAVX512VL, "avx512vl"},   {kCpuAVX512DQ, "avx512dq"},   {kCpuAVX512VNNI, "avx512vnni"},
      {kCpuAVXVNNI, "avxvnni"},     {kCpuAVX512BF16, "avx512bf16"}, {kCpuAMXTile, "amx-tile"},
      {kCpuAMXInt8, "amx-int8"},    {kCpuAMXBF16, "amx-bf16"},    {kCpuAMXPermitted, "amx-permission"},
      {kCpuNEON, "neon"},           {kCpuDotProd, "dotprod"},     {kCpuSVE, "sve"},
      {kCpuSVE2, "sve2"},           {kCpuSME, "sme"},             {kCpuI8MM, "i8mm"},
      {kCpuSVEI8MM, "svei8mm"},
      {kCpuWasmSimd128, "simd128"}, {kCpuWasmRelaxedSimd, "relaxed-simd"},
  };
  std::string out;
  for (const auto& n : kNames) {
    if (mask & n.bit) {
      if (!out.empty()) out += ",";
      out += n.name;
    }
  }
  return out;
}

}  // namespace maxsim
