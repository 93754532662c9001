// SPDX-License-Identifier: Apache-2.0
// A strict reader/writer for NumPy .npy files (format versions 1.0, 2.0, 3.0) holding plain little-endian
// numeric arrays. Pickled/object arrays, structured dtypes, Fortran order, big-endian data, malformed headers
// and sizes that do not match the file are rejected with a message saying what is wrong.
#ifndef MAXSIM_CLI_NPY_H_
#define MAXSIM_CLI_NPY_H_

#include <cstdint>
#include <string>
#include <vector>

namespace maxsim::npy {

enum class Dtype { kF32, kF16, kBF16, kF64, kI64, kU64, kI32, kU8, kBool };
const char* DtypeName(Dtype d);
size_t DtypeSize(Dtype d);

struct Array {
  Dtype dtype = Dtype::kF32;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> data;  // little-endian, C order
  uint64_t count() const {
    uint64_t n = 1;
    for (uint64_t s : shape) n *= s;
    return n;
  }
};

// Returns "" on success, else a message naming the file and the problem.
std::string Read(const std::string& path, Array* out);
// Parses an in-memory .npy image (used by Read and by the fuzzer).
std::string Parse(const uint8_t* bytes, size_t size, Array* out);
std::string Write(const std::string& path, const Array& array);

}  // namespace maxsim::npy

#endif  // MAXSIM_CLI_NPY_H_
