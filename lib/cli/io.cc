// SPDX-License-Identifier: Apache-2.0
// Reading the tool's input files: token matrices, offsets and ids, with messages that say how to fix them.
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include "cli.h"
#include "half.h"
#include "maxsim/packed_format.h"
#include "npy.h"

namespace maxsim::cli {
namespace {

std::string ShapeText(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Reads an integer vector (int64 or uint64, 1-D) from .npy.
std::vector<uint64_t> ReadIndexArray(const std::string& path, const char* what) {
  npy::Array a;
  const std::string err = npy::Read(path, &a);
  if (!err.empty()) throw Failure(err);
  if (a.shape.size() != 1) {
    throw Failure(path + ": " + what + " must be a 1-D array, but its shape is " + ShapeText(a.shape));
  }
  if (a.dtype != npy::Dtype::kI64 && a.dtype != npy::Dtype::kU64) {
    throw Failure(path + ": " + what + " must be int64 or uint64, not " + npy::DtypeName(a.dtype) +
                  " (save with arr.astype(np.int64))");
  }
  std::vector<uint64_t> v(a.shape[0]);
  if (!v.empty()) std::memcpy(v.data(), a.data.data(), v.size() * 8);
  if (a.dtype == npy::Dtype::kI64) {
    for (size_t i = 0; i < v.size(); ++i) {
      if (static_cast<int64_t>(v[i]) < 0) {
        throw Failure(path + ": " + what + "[" + std::to_string(i) + "] is " +
                      std::to_string(static_cast<int64_t>(v[i])) + ": negative values are not allowed");
      }
    }
  }
  return v;
}

}  // namespace

Tokens ReadTokens(const std::string& path) {
  npy::Array a;
  const std::string err = npy::Read(path, &a);
  if (!err.empty()) throw Failure(err);
  if (a.shape.size() != 2) {
    throw Failure(path + ": token vectors must be a 2-D array [tokens, dim], but its shape is " + ShapeText(a.shape) +
                  " (concatenate the sets' tokens row-wise and describe the sets with an offsets array)");
  }
  Tokens t;
  switch (a.dtype) {
    case npy::Dtype::kF32: t.dtype = MAXSIM_F32; break;
    case npy::Dtype::kF16: t.dtype = MAXSIM_F16; break;
    case npy::Dtype::kBF16: t.dtype = MAXSIM_BF16; break;
    default:
      throw Failure(path + ": token vectors must be float32, float16 or bfloat16, not " +
                    std::string(npy::DtypeName(a.dtype)) + " (convert with arr.astype(np.float32))");
  }
  if (a.shape[1] == 0 || a.shape[1] > MAXSIM_PACK_MAX_DIM) {
    throw Failure(path + ": token dimension " + std::to_string(a.shape[1]) + " is outside 1.." +
                  std::to_string(MAXSIM_PACK_MAX_DIM));
  }
  t.rows = a.shape[0];
  t.dim = static_cast<uint32_t>(a.shape[1]);
  t.data = std::move(a.data);
  return t;
}

std::vector<uint64_t> ReadOffsets(const std::string& path, uint64_t rows, const std::string& tokens_path) {
  std::vector<uint64_t> off = ReadIndexArray(path, "offsets");
  if (off.empty()) {
    throw Failure(path + ": offsets is empty; it needs n_sets + 1 values (0, end of set 0, ..., " +
                  std::to_string(rows) + ")");
  }
  if (off[0] != 0) throw Failure(path + ": offsets[0] is " + std::to_string(off[0]) + " but must be 0");
  for (size_t i = 1; i < off.size(); ++i) {
    if (off[i] < off[i - 1]) {
      throw Failure(path + ": offsets decrease at index " + std::to_string(i) + " (" + std::to_string(off[i - 1]) +
                    " then " + std::to_string(off[i]) + "); offsets must be non-decreasing, like cu_seqlens");
    }
  }
  if (off.back() != rows) {
    throw Failure(path + ": the last offset is " + std::to_string(off.back()) + " but " + tokens_path + " has " +
                  std::to_string(rows) + " rows; offsets must end at the number of token rows");
  }
  return off;
}

std::vector<uint64_t> ReadIds(const std::string& path, uint64_t n_sets) {
  std::vector<uint64_t> ids;
  if (EndsWith(path, ".npy")) {
    ids = ReadIndexArray(path, "ids");
  } else {
    std::ifstream in(path);
    if (!in) throw Failure(path + ": cannot open: " + std::strerror(errno));
    std::string line;
    uint64_t line_no = 0;
    while (std::getline(in, line)) {
      ++line_no;
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
      size_t b = 0;
      while (b < line.size() && (line[b] == ' ' || line[b] == '\t')) ++b;
      line = line.substr(b);
      if (line.empty()) continue;
      errno = 0;
      char* end = nullptr;
      const unsigned long long v = std::strtoull(line.c_str(), &end, 10);
      if (*end != '\0' || line[0] == '-' || errno == ERANGE) {
        throw Failure(path + ":" + std::to_string(line_no) + ": '" + line +
                      "' is not an unsigned 64-bit integer (ids must be numbers; keep string ids in a side table "
                      "indexed by the id)");
      }
      ids.push_back(v);
    }
  }
  if (ids.size() != n_sets) {
    throw Failure(path + ": has " + std::to_string(ids.size()) + " ids but there are " + std::to_string(n_sets) +
                  " sets (one id per set)");
  }
  return ids;
}

void ConvertTokens(Tokens* t, maxsim_dtype to, const std::string& path) {
  if (t->dtype == to) return;
  const uint64_t n = t->rows * t->dim;
  std::vector<float> f32(n);
  if (n == 0) {
    t->dtype = to;
    t->data.clear();
    return;
  }
  if (t->dtype == MAXSIM_F32) {
    std::memcpy(f32.data(), t->data.data(), n * 4);
  } else {
    const auto* h = reinterpret_cast<const uint16_t*>(t->data.data());
    for (uint64_t i = 0; i < n; ++i) f32[i] = t->dtype == MAXSIM_F16 ? F16ToF32(h[i]) : Bf16ToF32(h[i]);
  }
  std::vector<uint8_t> out(n * (to == MAXSIM_F32 ? 4 : 2));
  if (to == MAXSIM_F32) {
    std::memcpy(out.data(), f32.data(), n * 4);
  } else {
    auto* h = reinterpret_cast<uint16_t*>(out.data());
    for (uint64_t i = 0; i < n; ++i) {
      const float v = f32[i];
      if (to == MAXSIM_F16) {
        h[i] = F32ToF16(v);
        if (std::isfinite(v) && !std::isfinite(F16ToF32(h[i]))) {
          throw Failure(path + ": row " + std::to_string(i / t->dim) + " element " + std::to_string(i % t->dim) +
                        " is " + FloatText(v) + ", outside the f16 range (|v| < 65520): use --dtype bf16 or keep");
        }
      } else {
        h[i] = F32ToBf16(v);
        if (std::isfinite(v) && !std::isfinite(Bf16ToF32(h[i]))) {
          throw Failure(path + ": row " + std::to_string(i / t->dim) + " element " + std::to_string(i % t->dim) +
                        " is " + FloatText(v) + ", outside the bf16 range: use --dtype keep");
        }
      }
    }
  }
  t->data = std::move(out);
  t->dtype = to;
}

}  // namespace maxsim::cli
