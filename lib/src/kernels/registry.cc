// SPDX-License-Identifier: Apache-2.0
// Expands kernels/kernel_list.inc into the kernel table and answers "can this machine run kernel k?".
#include "cpu_features.h"
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

}  // namespace maxsim
