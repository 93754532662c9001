// SPDX-License-Identifier: Apache-2.0
// What the wasm32-wasi build needs from outside and its toolchain does not have (compiled only there,
// cmake/wasm.cmake):
//   - Highway's run-time target list (hwy/targets.h; the library's targets.cc is not in this header-only use).
//     A WebAssembly module has exactly one target, its static one, chosen when it is built and validated by
//     the engine before any code runs.
//   - __cxa_thread_atexit, which C++ thread_local objects with destructors call and wasi-libc lacks. Without
//     threads the only thread exits with the module, so its destructors are the program's exit handlers.
#include <cstdlib>

#include "hwy/targets.h"

namespace hwy {

namespace {
int64_t g_supported_for_test = 0;
}  // namespace

int64_t SupportedTargets() { return g_supported_for_test != 0 ? g_supported_for_test : HWY_STATIC_TARGET; }

void SetSupportedTargetsForTest(int64_t targets) { g_supported_for_test = targets; }

void DisableTargets(int64_t) {}

}  // namespace hwy

extern "C" int __cxa_atexit(void (*fn)(void*), void* arg, void* dso);

extern "C" int __cxa_thread_atexit(void (*fn)(void*), void* arg, void* dso) { return __cxa_atexit(fn, arg, dso); }
