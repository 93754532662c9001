// SPDX-License-Identifier: Apache-2.0
// What the SVE kernel files (screen_sve.cc, screen_sve_i8mm.cc) share across files: the exact path
// (exact_sve.cc). Everything else they share is per file, in sve_kernel-inl.h.
#ifndef MAXSIM_SRC_KERNELS_ARM_SVE_KERNELS_H_
#define MAXSIM_SRC_KERNELS_ARM_SVE_KERNELS_H_

#include "kernels/kernel.h"

namespace maxsim {
namespace arm {

// KernelOps::exact of the SVE kernels: vector-length-agnostic FMLA tiles, the canonical chain. Executes SVE
// instructions: call it only on a CPU that reports SVE.
void SveExact(const PreparedQuery& q, const DocRef& d, maxsim_metric metric, float* best_key, int32_t* best_index,
              KernelScratch& scratch);

}  // namespace arm
}  // namespace maxsim

#endif  // MAXSIM_SRC_KERNELS_ARM_SVE_KERNELS_H_
