// SPDX-License-Identifier: Apache-2.0
// Reading the tool's input files (token matrices, padded queries and masks, offsets, ids, packed shards), with
// messages that name the file, line or element and say how to fix it.
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "cli.h"
#include "half.h"
#include "maxsim/packed_format.h"
#include "npy.h"
#include "regular_file.h"
#include "string_id.h"

namespace maxsim::cli {
namespace {

std::string ShapeText(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
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

namespace {

// Tokens from an array whose last axis is the dimension: [n_tokens, dim] or, padded, [n_sets, L, dim].
Tokens TokensFromArray(npy::Array&& a, const std::string& path) {
  Tokens t;
  switch (a.dtype) {
    case npy::Dtype::kF32: t.dtype = MAXSIM_F32; break;
    case npy::Dtype::kF16: t.dtype = MAXSIM_F16; break;
    case npy::Dtype::kBF16: t.dtype = MAXSIM_BF16; break;
    default:
      throw Failure(path + ": token vectors must be float32, float16 or bfloat16, not " +
                    std::string(npy::DtypeName(a.dtype)) + " (convert with arr.astype(np.float32))");
  }
  const uint64_t dim = a.shape.back();
  if (dim == 0 || dim > MAXSIM_PACK_MAX_DIM) {
    throw Failure(path + ": token dimension " + std::to_string(dim) + " is outside 1.." +
                  std::to_string(MAXSIM_PACK_MAX_DIM));
  }
  t.rows = a.count() / dim;
  t.dim = static_cast<uint32_t>(dim);
  t.data = std::move(a.data);
  return t;
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
  return TokensFromArray(std::move(a), path);
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

std::vector<uint64_t> ReadNumericIds(const std::string& path, uint64_t n_sets) {
  std::vector<uint64_t> ids = ReadIndexArray(path, "ids");
  if (ids.size() != n_sets) {
    throw Failure(path + ": has " + std::to_string(ids.size()) + " ids but there are " + std::to_string(n_sets) +
                  " sets (one id per set)");
  }
  return ids;
}

std::vector<std::string> ReadLines(const std::string& path) {
  std::vector<uint8_t> bytes;
  const std::string error = file::ReadRegular(path, &bytes);  // refuses FIFOs, devices and folders first
  if (!error.empty()) throw Failure(error);
  std::istringstream in(std::string(bytes.begin(), bytes.end()));
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(line);
  }
  return lines;
}

std::vector<std::string> ReadStringIds(const std::string& path, uint64_t n_sets, const char* sets) {
  std::vector<std::string> ids = ReadLines(path);
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string& id = ids[i];
    if (const char* problem = pack::StringIdProblem(id.data(), id.size())) {
      throw Failure(path + ":" + std::to_string(i + 1) + ": the id " + (id.empty() ? std::string() : "'" + id + "' ") +
                    problem + " (one non-empty UTF-8 id per line, without tabs)");
    }
  }
  if (ids.size() != n_sets) {
    throw Failure(path + ": has " + std::to_string(ids.size()) + " ids (lines) but there are " +
                  std::to_string(n_sets) + " " + sets + " (one id per line, in order)");
  }
  return ids;
}

bool IsNpyFile(const std::string& path) {
  uint64_t size = 0;
  std::string error;
  const int fd = file::OpenRegular(path, &size, &error);  // a FIFO is not a .npy file (and must not block)
  if (fd < 0) return false;
  char magic[6] = {0};
  const bool npy = read(fd, magic, 6) == 6 && std::memcmp(magic, "\x93NUMPY", 6) == 0;
  close(fd);
  return npy;
}

Queries ReadQueries(const std::string& tokens_path, const std::string& offsets_path, const std::string& mask_path) {
  npy::Array a;
  std::string err = npy::Read(tokens_path, &a);
  if (!err.empty()) throw Failure(err);
  Queries q;
  std::vector<uint64_t> mask_shape;
  if (a.shape.size() == 3) {
    if (!offsets_path.empty()) {
      throw Failure(tokens_path + ": padded queries " + ShapeText(a.shape) + " [n, L, dim] take no offsets file (" +
                    offsets_path + "); mark padding with --query-mask instead");
    }
    q.n = a.shape[0];
    q.set_length = a.shape[1];
    mask_shape = {a.shape[0], a.shape[1]};
    q.tokens = TokensFromArray(std::move(a), tokens_path);
  } else if (a.shape.size() == 2) {
    if (offsets_path.empty()) {
      throw Failure(tokens_path + ": query tokens " + ShapeText(a.shape) + " [tokens, dim] need an offsets file "
                    "(QUERY_OFFSETS.npy), or give padded queries [n, L, dim]");
    }
    mask_shape = {a.shape[0]};
    q.tokens = TokensFromArray(std::move(a), tokens_path);
    q.offsets = ReadOffsets(offsets_path, q.tokens.rows, tokens_path);
    q.n = q.offsets.size() - 1;
  } else {
    throw Failure(tokens_path + ": queries must be [tokens, dim] (with an offsets file) or padded [n, L, dim], "
                  "but the shape is " + ShapeText(a.shape));
  }
  if (mask_path.empty()) return q;
  npy::Array m;
  err = npy::Read(mask_path, &m);
  if (!err.empty()) throw Failure(err);
  if (m.dtype != npy::Dtype::kBool && m.dtype != npy::Dtype::kU8 && m.dtype != npy::Dtype::kI64 &&
      m.dtype != npy::Dtype::kI32 &&
      m.dtype != npy::Dtype::kU64) {
    throw Failure(mask_path + ": a mask must be bool, uint8, int32 or int64 (0 = padding, 1 = token), not " +
                  npy::DtypeName(m.dtype));
  }
  if (m.shape != mask_shape) {
    throw Failure(mask_path + ": the mask's shape is " + ShapeText(m.shape) + " but the queries need " +
                  ShapeText(mask_shape) + " (one entry per query token of " + tokens_path + ")");
  }
  const uint64_t n = m.count();
  q.mask.resize(n);
  const size_t width = npy::DtypeSize(m.dtype);
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t v = 0;
    std::memcpy(&v, m.data.data() + i * width, width);  // little-endian: the low bytes hold the value
    if (v > 1) {
      std::string index = std::to_string(i);
      if (mask_shape.size() == 2) index = std::to_string(i / mask_shape[1]) + ", " + std::to_string(i % mask_shape[1]);
      throw Failure(mask_path + ": mask[" + index + "] is " +
                    (width == 8 ? std::to_string(static_cast<int64_t>(v))
                     : width == 4 ? std::to_string(static_cast<int32_t>(v)) : std::to_string(v)) +
                    "; a mask holds 0 (padding) or 1 (token)");
    }
    q.mask[i] = static_cast<uint8_t>(v);
  }
  return q;
}

maxsim_dense_sets Queries::Dense(uint64_t begin, uint64_t end) const {
  maxsim_dense_sets s{};
  s.struct_size = sizeof(s);
  s.memory = MAXSIM_MEMORY_HOST;
  s.dtype = tokens.dtype;
  s.dim = tokens.dim;
  s.n_sets = end - begin;
  const size_t elem = tokens.dtype == MAXSIM_F32 ? 4 : 2;
  if (offsets.empty()) {  // padded [n, L, dim]
    s.data = tokens.data.data() + begin * set_length * tokens.dim * elem;
    s.set_length = set_length;
    s.mask = mask.empty() ? nullptr : mask.data() + begin * set_length;
  } else {  // offsets index rows of the whole token matrix; so does the mask
    s.data = tokens.data.data();
    s.offsets = offsets.data() + begin;
    s.mask = mask.empty() ? nullptr : mask.data();
  }
  return s;
}

std::vector<std::string> QueryIds(const std::string& path, uint64_t n) {
  if (!path.empty()) return ReadStringIds(path, n, "queries");
  std::vector<std::string> ids(n);
  for (uint64_t i = 0; i < n; ++i) ids[i] = std::to_string(i);
  return ids;
}

Corpus::~Corpus() {
  for (Shard& s : shards) maxsim_packed_release(s.packed);
}

void Corpus::Load(const std::vector<std::string>& paths, maxsim_validation level) {
  for (const std::string& path : paths) {
    Shard s;
    s.path = path;
    maxsim_status st;
    {
      Progress p("loading and validating " + path, 0);
      st = maxsim_packed_load(path.c_str(), level, &s.packed);
    }
    Check(st, "loading " + path);
    shards.push_back(s);
    Check(maxsim_packed_describe(s.packed, &shards.back().desc), "describing " + path);
    shards.back().first = n_docs;
    if (shards.size() > 1 && shards.back().desc.dim != shards[0].desc.dim) {
      throw Failure(path + " has dimension " + std::to_string(shards.back().desc.dim) + " but " + shards[0].path +
                    " has " + std::to_string(shards[0].desc.dim) + ": every shard must come from the same model");
    }
    n_docs += shards.back().desc.n_sets;
  }
}

std::string Corpus::DocId(size_t shard, uint64_t local) const {
  const Shard& s = shards[shard];
  const char* id = nullptr;
  size_t length = 0;
  Check(maxsim_packed_string_id(s.packed, local, &id, &length), "reading a string id of " + s.path);
  if (id) return std::string(id, length);
  if (s.desc.ids) return std::to_string(s.desc.ids[local]);
  return std::to_string(s.first + local);
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
