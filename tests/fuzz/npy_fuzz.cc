// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: arbitrary bytes as a .npy file. The parser must reject or accept without crashing, and an
// accepted array's data must be exactly as large as its shape and dtype say.
#include <cstdint>
#include <cstdlib>

#include "npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  maxsim::npy::Array a;
  if (maxsim::npy::Parse(data, size, &a).empty()) {
    if (a.data.size() != a.count() * maxsim::npy::DtypeSize(a.dtype)) std::abort();
  }
  return 0;
}
