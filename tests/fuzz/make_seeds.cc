// SPDX-License-Identifier: Apache-2.0
// Writes a seed corpus for the fuzzers: small valid packed buffers (several dims, f32/f16/bf16 originals, without
// ids, with numeric ids, with string ids; empty sets) prefixed by the fuzz target's control byte, and small .npy files.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "maxsim/maxsim.h"
#include "npy.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s PACKED_SEED_DIR NPY_SEED_DIR\n", argv[0]);
    return 2;
  }
  int n = 0;
  for (uint32_t dim : {1u, 7u, 64u, 130u}) {
    for (maxsim_dtype dtype : {MAXSIM_F32, MAXSIM_F16, MAXSIM_BF16}) {
      std::vector<uint64_t> off = {0, 2, 2, 5};
      std::vector<float> v(5 * dim);
      for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37f * static_cast<float>(i)) * (i % 3 ? 1.0f : 4.0f);
      std::vector<uint16_t> h(v.size());
      const void* data = v.data();
      if (dtype != MAXSIM_F32) {
        for (size_t i = 0; i < v.size(); ++i) {
          uint32_t bits;
          __builtin_memcpy(&bits, &v[i], 4);
          h[i] = static_cast<uint16_t>(bits >> 16);  // bf16 by truncation; as f16 the same bits are other numbers
          if (dtype == MAXSIM_F16) h[i] &= 0x3BFF;   // keep them finite and small as f16
        }
        data = h.data();
      }
      maxsim_dense_sets s{};
      s.struct_size = sizeof(s);
      s.data = data;
      s.dtype = dtype;
      s.dim = dim;
      s.n_sets = 3;
      s.offsets = off.data();
      const uint64_t ids[3] = {7, 8, 9};
      const char* const string_ids[3] = {"doc-a", "b", "\xc3\xa9t\xc3\xa9"};
      for (int with_ids = 0; with_ids < 3; ++with_ids) {  // none, numeric, numeric + string ids (format 1.1)
        maxsim_packed* p = nullptr;
        const maxsim_status st = with_ids < 2 ? maxsim_pack(nullptr, &s, with_ids ? ids : nullptr, &p)
                                              : maxsim_pack_with_string_ids(nullptr, &s, ids, string_ids, &p);
        if (st != MAXSIM_OK) {
          std::fprintf(stderr, "pack failed: %s\n", maxsim_last_error());
          return 1;
        }
        maxsim_packed_desc d;
        maxsim_packed_describe(p, &d);
        for (uint8_t control : {0, 1}) {
          const std::string path = std::string(argv[1]) + "/seed" + std::to_string(n++);
          FILE* f = std::fopen(path.c_str(), "wb");
          if (!f) return 1;
          std::fwrite(&control, 1, 1, f);
          std::fwrite(d.data, 1, d.size, f);
          std::fclose(f);
        }
        maxsim_packed_release(p);
      }
    }
  }
  maxsim::npy::Array a;
  a.dtype = maxsim::npy::Dtype::kF32;
  a.shape = {3, 4};
  a.data.assign(48, 0);
  maxsim::npy::Write(std::string(argv[2]) + "/f32.npy", a);
  a.dtype = maxsim::npy::Dtype::kI64;
  a.shape = {4};
  a.data.assign(32, 1);
  maxsim::npy::Write(std::string(argv[2]) + "/i64.npy", a);
  return 0;
}
