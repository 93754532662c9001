// SPDX-License-Identifier: Apache-2.0
// The "autovec-avx2" kernel: the portable body compiled for x86-64-v3 (AVX2 + FMA + F16C) and left to the
// compiler's auto-vectoriser. All headers are included before the target pragma (see portable-inl.h).
#include <cmath>
#include <cstring>
#include <limits>

#include "half.h"
#include "kernels/kernel.h"
#include "kernels/screening.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

#define MAXSIM_PORTABLE_NS portable_autovec_avx2
#include "kernels/portable-inl.h"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace maxsim {
extern const KernelOps kOpsAutovecAvx2 = {&portable_autovec_avx2::Exact, &portable_autovec_avx2::Screened};
}  // namespace maxsim
