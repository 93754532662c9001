// SPDX-License-Identifier: Apache-2.0
#include "npy.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "regular_file.h"

namespace maxsim::npy {
namespace {

constexpr uint64_t kMaxHeader = 1u << 20;

struct Descr {
  const char* text;
  Dtype dtype;
};
// bf16 has no NumPy dtype; ml_dtypes writes it as '<V2' with no way to tell it from other 2-byte voids, so the
// reader accepts only the explicit '<bf16' spelling some tools use.
const Descr kDescrs[] = {{"<f4", Dtype::kF32}, {"<f2", Dtype::kF16}, {"<bf16", Dtype::kBF16}, {"<f8", Dtype::kF64},
                         {"<i8", Dtype::kI64}, {"<u8", Dtype::kU64}, {"<i4", Dtype::kI32}, {"|u1", Dtype::kU8},
                         {"|b1", Dtype::kBool}};

// The descr as a message shows it: control and non-ASCII bytes (a NUL would end the message) as \xNN.
std::string Printable(const std::string& s) {
  std::string out;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) {
      out += c;
    } else {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", u);
      out += hex;
    }
  }
  return out;
}

void SkipSpace(const std::string& s, size_t& i) {
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n')) ++i;
}

// Parses a Python string literal '...' or "..." (no escapes are valid in an .npy header).
bool ParseString(const std::string& s, size_t& i, std::string* out) {
  if (i >= s.size() || (s[i] != '\'' && s[i] != '"')) return false;
  const char quote = s[i++];
  const size_t end = s.find(quote, i);
  if (end == std::string::npos) return false;
  *out = s.substr(i, end - i);
  if (out->find('\\') != std::string::npos) return false;
  i = end + 1;
  return true;
}

std::string ParseHeader(const std::string& h, Dtype* dtype, std::vector<uint64_t>* shape) {
  size_t i = 0;
  SkipSpace(h, i);
  if (i >= h.size() || h[i] != '{') return "header is not a Python dict";
  ++i;
  bool have_descr = false, have_order = false, have_shape = false;
  for (;;) {
    SkipSpace(h, i);
    if (i < h.size() && h[i] == '}') {
      ++i;
      break;
    }
    std::string key;
    if (!ParseString(h, i, &key)) return "header dict has a malformed key";
    SkipSpace(h, i);
    if (i >= h.size() || h[i] != ':') return "header dict lacks ':' after '" + key + "'";
    ++i;
    SkipSpace(h, i);
    if (key == "descr") {
      std::string d;
      if (!ParseString(h, i, &d)) {
        return "descr is not a plain dtype string (structured or object arrays are not supported)";
      }
      bool found = false;
      for (const Descr& x : kDescrs) {
        if (d == x.text) {
          *dtype = x.dtype;
          found = true;
        }
      }
      if (!found) {
        const std::string shown = Printable(d);
        if (d.find('O') != std::string::npos) return "dtype '" + shown + "' is an object (pickled) array: refused";
        if (!d.empty() && d[0] == '>') {
          return "dtype '" + shown + "' is big-endian: convert with arr.astype('<" + Printable(d.substr(1)) + "')";
        }
        return "dtype '" + shown + "' is not supported (use float32, float16, int64, uint64, int32, uint8 or bool)";
      }
      have_descr = true;
    } else if (key == "fortran_order") {
      if (h.compare(i, 5, "False") == 0) {
        i += 5;
      } else if (h.compare(i, 4, "True") == 0) {
        return "Fortran-ordered arrays are not supported: save with np.ascontiguousarray";
      } else {
        return "fortran_order is neither True nor False";
      }
      have_order = true;
    } else if (key == "shape") {
      if (i >= h.size() || h[i] != '(') return "shape is not a tuple";
      ++i;
      shape->clear();
      for (;;) {
        SkipSpace(h, i);
        if (i < h.size() && h[i] == ')') {
          ++i;
          break;
        }
        if (i >= h.size() || h[i] < '0' || h[i] > '9') return "shape holds something other than non-negative integers";
        uint64_t v = 0;
        while (i < h.size() && h[i] >= '0' && h[i] <= '9') {
          const uint64_t digit = static_cast<uint64_t>(h[i] - '0');
          if (v > (std::numeric_limits<uint64_t>::max() - digit) / 10) return "shape dimension overflows";
          v = v * 10 + digit;
          ++i;
        }
        if (i < h.size() && h[i] == 'L') ++i;  // Python 2 long suffix
        shape->push_back(v);
        if (shape->size() > 32) return "shape has more than 32 dimensions";
        SkipSpace(h, i);
        if (i < h.size() && h[i] == ',') ++i;
      }
      have_shape = true;
    } else {
      return "header has an unknown key '" + key + "'";
    }
    SkipSpace(h, i);
    if (i < h.size() && h[i] == ',') ++i;
  }
  if (!have_descr || !have_order || !have_shape) return "header lacks descr, fortran_order or shape";
  return "";
}

}  // namespace

const char* DtypeName(Dtype d) {
  switch (d) {
    case Dtype::kF32: return "float32";
    case Dtype::kF16: return "float16";
    case Dtype::kBF16: return "bfloat16";
    case Dtype::kF64: return "float64";
    case Dtype::kI64: return "int64";
    case Dtype::kU64: return "uint64";
    case Dtype::kI32: return "int32";
    case Dtype::kU8: return "uint8";
    case Dtype::kBool: return "bool";
  }
  return "?";
}

size_t DtypeSize(Dtype d) {
  switch (d) {
    case Dtype::kF32: case Dtype::kI32: return 4;
    case Dtype::kF16: case Dtype::kBF16: return 2;
    case Dtype::kF64: case Dtype::kI64: case Dtype::kU64: return 8;
    case Dtype::kU8: case Dtype::kBool: return 1;
  }
  return 0;
}

std::string Parse(const uint8_t* b, size_t size, Array* out) {
  if (size < 10 || std::memcmp(b, "\x93NUMPY", 6) != 0) return "not a .npy file (bad magic)";
  const uint8_t major = b[6];
  uint64_t header_len = 0, start = 0;
  if (major == 1) {
    header_len = static_cast<uint64_t>(b[8]) | (static_cast<uint64_t>(b[9]) << 8);
    start = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) return "truncated header";
    header_len = static_cast<uint64_t>(b[8]) | (static_cast<uint64_t>(b[9]) << 8) |
                 (static_cast<uint64_t>(b[10]) << 16) | (static_cast<uint64_t>(b[11]) << 24);
    start = 12;
  } else {
    return "unsupported .npy format version " + std::to_string(major);
  }
  if (header_len > kMaxHeader || start + header_len > size) return "header length exceeds the file";
  const std::string header(reinterpret_cast<const char*>(b + start), static_cast<size_t>(header_len));
  Array a;
  std::string err = ParseHeader(header, &a.dtype, &a.shape);
  if (!err.empty()) return err;
  const uint64_t data_at = start + header_len;
  uint64_t bytes = DtypeSize(a.dtype);
  for (uint64_t s : a.shape) {
    if (s != 0 && bytes > std::numeric_limits<uint64_t>::max() / s) return "array size overflows";
    bytes *= s;
  }
  if (size - data_at != bytes) {
    return "data is " + std::to_string(size - data_at) + " bytes but shape and dtype need " + std::to_string(bytes) +
           " (truncated or trailing bytes)";
  }
  a.data.assign(b + data_at, b + size);
  *out = std::move(a);
  return "";
}

std::string Read(const std::string& path, Array* out) {
  std::vector<uint8_t> bytes;
  const std::string error = file::ReadRegular(path, &bytes);  // refuses FIFOs, devices and folders first
  if (!error.empty()) return error;
  const std::string err = Parse(bytes.data(), bytes.size(), out);
  return err.empty() ? "" : path + ": " + err;
}

std::string Write(const std::string& path, const Array& a) {
  std::string descr;
  switch (a.dtype) {
    case Dtype::kF32: descr = "<f4"; break;
    case Dtype::kF16: descr = "<f2"; break;
    case Dtype::kBF16: descr = "<bf16"; break;
    case Dtype::kF64: descr = "<f8"; break;
    case Dtype::kI64: descr = "<i8"; break;
    case Dtype::kU64: descr = "<u8"; break;
    case Dtype::kI32: descr = "<i4"; break;
    case Dtype::kU8: descr = "|u1"; break;
    case Dtype::kBool: descr = "|b1"; break;
  }
  std::string shape = "(";
  for (size_t i = 0; i < a.shape.size(); ++i) shape += std::to_string(a.shape[i]) + (a.shape.size() == 1 ? "," : i + 1 < a.shape.size() ? ", " : "");
  shape += ")";
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  const uint8_t pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<uint8_t>(header.size() & 0xFF),
                           static_cast<uint8_t>(header.size() >> 8)};
  const std::string error =
      file::WriteAtomically(path, {{pre, 10}, {header.data(), header.size()}, {a.data.data(), a.data.size()}});
  return error;  // names the path
}

}  // namespace maxsim::npy
