// SPDX-License-Identifier: Apache-2.0
// Run-time CPU feature detection. x86: CPUID + XGETBV (the OS must enable the register state, not just the
// CPU support it) + the AMX tile-data permission (arch_prctl, Linux), requested once at first detection.
// AArch64: getauxval HWCAP/HWCAP2 (Linux, Android), sysctlbyname hw.optional.arm.* (macOS),
// IsProcessorFeaturePresent (Windows).
#ifndef MAXSIM_SRC_CPU_FEATURES_H_
#define MAXSIM_SRC_CPU_FEATURES_H_

#include <cstdint>
#include <string>

namespace maxsim {

enum CpuFeature : uint64_t {
  kCpuSSE41 = 1ull << 0,
  kCpuAVX2 = 1ull << 1,
  kCpuFMA = 1ull << 2,
  kCpuF16C = 1ull << 3,
  kCpuAVX512F = 1ull << 4,
  kCpuAVX512BW = 1ull << 5,
  kCpuAVX512VL = 1ull << 6,
  kCpuAVX512DQ = 1ull << 7,
  kCpuAVX512VNNI = 1ull << 8,
  kCpuAVXVNNI = 1ull << 9,
  kCpuAVX512BF16 = 1ull << 10,
  kCpuAMXTile = 1ull << 11,
  kCpuAMXInt8 = 1ull << 12,
  kCpuAMXBF16 = 1ull << 13,
  kCpuAMXPermitted = 1ull << 14,  // the kernel granted this process the AMX tile-data state
  kCpuNEON = 1ull << 20,
  kCpuDotProd = 1ull << 21,
  kCpuSVE = 1ull << 22,
  kCpuSVE2 = 1ull << 23,
  kCpuSME = 1ull << 24,
  kCpuI8MM = 1ull << 25,
  kCpuSVEI8MM = 1ull << 26,  // I8MM's SVE forms (SMMLA on Z registers): Linux reports them apart from NEON's
  kCpuWasmSimd128 = 1ull << 30,
  kCpuWasmRelaxedSimd = 1ull << 31,
};

struct CpuInfo {
  uint64_t features = 0;
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", ... or "" off x86
  std::string brand;   // processor brand string where available
  std::string amx_note;  // why AMX is not usable (CPU lacks it, OS did not enable it, permission refused)
  std::string relaxed_note;  // WebAssembly: what the relaxed-SIMD probe found
  std::string mask_error;  // MAXSIM_CPU_MASK is set but not a hex mask (contexts then fail to create)
};

// Detected once (thread-safe); MAXSIM_CPU_MASK (hex, features to hide) lets tests pretend to be an older CPU.
const CpuInfo& GetCpuInfo();
// Names of the features in `mask`, comma-separated ("avx2,fma").
std::string FeatureNames(uint64_t mask);

}  // namespace maxsim

#endif  // MAXSIM_SRC_CPU_FEATURES_H_
