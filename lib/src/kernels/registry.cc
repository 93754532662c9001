// SPDX-License-Identifier: Apache-2.0
// Expands kernels/kernel_list.inc into the kernel table and answers "can this machine run kernel k?".
#include "cpu_features.h"
#include "hwy/detect_targets.h"
#include "kernels/kernel.h"

namespace maxsim {

#define MAXSIM_KERNEL(symbol, name, required, priority, description) extern const KernelOps symbol;
#include "kernels/kernel_list.inc"
#undef MAXSIM_KERNEL

namespace {
const KernelInfo kKernels[] = {
#define MAXSIM_KERNEL(symbol, name, required, priority, description) \
  {name, static_cast<uint64_t>(required), priority, description, &symbol},
#include "kernels/kernel_list.inc"
#undef MAXSIM_KERNEL
};
}  // namespace

const KernelInfo* KernelList(size_t* count) {
  *count = sizeof(kKernels) / sizeof(kKernels[0]);
  return kKernels;
}

bool KernelAvailable(const KernelInfo& k, std::string* reason) {
  const CpuInfo& cpu = GetCpuInfo();
  const uint64_t missing = k.required & ~cpu.features;
  if (missing == 0) return true;
  if (reason) {
    if (missing == kCpuAMXPermitted) {
      *reason = cpu.amx_note;
    } else {
      *reason = "needs " + FeatureNames(k.required) + "; this CPU lacks " + FeatureNames(missing);
      if ((missing & (kCpuAMXTile | kCpuAMXInt8 | kCpuAMXBF16 | kCpuAMXPermitted)) && !cpu.amx_note.empty()) {
        *reason += " (" + cpu.amx_note + ")";
      }
      if ((missing & kCpuWasmRelaxedSimd) && !cpu.relaxed_note.empty()) *reason += " (" + cpu.relaxed_note + ")";
    }
  }
  return false;
}

int64_t PackingTargetCap(const KernelInfo& k) {
  constexpr uint64_t kAvx3 = kCpuAVX512F | kCpuAVX512BW | kCpuAVX512VL | kCpuAVX512DQ;  // Highway's AVX3
  constexpr uint64_t kAvx2 = kCpuAVX2 | kCpuFMA | kCpuF16C;
  const uint64_t r = k.required;
  if ((r & kAvx3) == kAvx3) return HWY_AVX3;
  if ((r & kAvx2) == kAvx2) return HWY_AVX2;
  if (r & kCpuSVE2) return HWY_SVE2;
  if (r & kCpuSVE) return HWY_SVE;
  if (r & kCpuNEON) return HWY_NEON;
  if (r & kCpuWasmSimd128) return HWY_WASM;
  return HWY_EMU128;  // no ISA assumption: the scalar or emulated target (HWY_SCALAR is the larger bit)
}

}  // namespace maxsim
