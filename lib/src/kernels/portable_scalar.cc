// SPDX-License-Identifier: Apache-2.0
// The "scalar" kernel: portable C++ with no ISA assumption (the fallback on any CPU).
#include <cmath>
#include <cstring>
#include <limits>

#include "half.h"
#include "kernels/kernel.h"
#include "kernels/screening.h"

#define MAXSIM_PORTABLE_NS portable_scalar
#include "kernels/portable-inl.h"

namespace maxsim {
extern const KernelOps kOpsScalar = {&portable_scalar::Exact, &portable_scalar::Screened};
}  // namespace maxsim
