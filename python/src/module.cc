// SPDX-License-Identifier: Apache-2.0
// maxsim._core: the nanobind layer over the C API (maxsim/maxsim.h). It only translates: arrays (numpy,
// torch, anything with DLPack) into maxsim_dense_sets views of the caller's memory (no copy), statuses into the
// Python exception classes registered by maxsim/_errors.py, and releases the GIL around every call that does
// work. Shapes, dtypes and output allocation in the caller's framework are decided in maxsim/_api.py.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "maxsim/maxsim.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using AnyArray = nb::ndarray<nb::ro>;
using U64Array = nb::ndarray<const uint64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using OutF32 = nb::ndarray<float, nb::c_contig>;
using OutI32 = nb::ndarray<int32_t, nb::c_contig>;
using OutU64 = nb::ndarray<uint64_t, nb::c_contig, nb::device::cpu>;

// Python exception classes by status code, registered once by maxsim/_errors.py (kept alive for the process).
PyObject* g_error_classes[16] = {};
PyObject* g_base_error = nullptr;

[[noreturn]] void Throw(maxsim_status st, const std::string& message) {
  const int code = static_cast<int>(st);
  PyObject* cls = (code >= 0 && code < 16 && g_error_classes[code]) ? g_error_classes[code] : g_base_error;
  if (cls == nullptr) cls = PyExc_RuntimeError;
  nb::object exc = nb::steal(PyObject_CallFunction(cls, "s", message.c_str()));
  if (!exc.is_valid()) throw nb::python_error();
  nb::setattr(exc, "status", nb::int_(code));
  nb::setattr(exc, "status_name", nb::str(maxsim_status_name(st)));
  PyErr_SetObject(cls, exc.ptr());
  throw nb::python_error();
}

[[noreturn]] void ThrowArg(const std::string& message) { Throw(MAXSIM_ERR_INVALID_ARGUMENT, message); }

void Check(maxsim_status st) {
  if (st == MAXSIM_OK) return;
  Throw(st, maxsim_last_error());
}

// Installs this thread's progress callback (maxsim_set_progress) around one call that does work. The library
// invokes it on this thread, every 50 ms at most, with the GIL released: it takes the GIL, runs Python's signal
// handlers (Ctrl-C raises KeyboardInterrupt there) and advances `bar` (a tqdm-like object, or None). An exception
// from either cancels the call (MAXSIM_ERR_CANCELLED) and is re-raised once the call has returned.
class ProgressScope {
 public:
  explicit ProgressScope(nb::handle bar) : bar_(bar) { maxsim_set_progress(&ProgressScope::Callback, this); }
  ~ProgressScope() { maxsim_set_progress(nullptr, nullptr); }
  ProgressScope(const ProgressScope&) = delete;
  ProgressScope& operator=(const ProgressScope&) = delete;

  // After the call, with the GIL: the pending Python exception, if a callback raised one.
  void Check(maxsim_status st) {
    if (failed_) throw nb::python_error();
    ::Check(st);
  }

 private:
  static int Callback(void* user, uint64_t done, uint64_t total) {
    auto* self = static_cast<ProgressScope*>(user);
    nb::gil_scoped_acquire acquire;
    if (PyErr_CheckSignals() != 0) {
      self->failed_ = true;
      return 1;
    }
    if (!self->bar_.is_none() && done > self->reported_) {
      PyObject* r = PyObject_CallMethod(self->bar_.ptr(), "update", "K", static_cast<unsigned long long>(done - self->reported_));
      if (r == nullptr) {
        self->failed_ = true;
        return 1;
      }
      Py_DECREF(r);
      self->reported_ = done;
    }
    (void)total;
    return 0;
  }

  nb::handle bar_;
  uint64_t reported_ = 0;
  bool failed_ = false;
};

maxsim_dtype DtypeOf(const nb::dlpack::dtype& t, const char* what) {
  using nb::dlpack::dtype_code;
  if (t.lanes == 1 && t.code == static_cast<uint8_t>(dtype_code::Float) && t.bits == 32) return MAXSIM_F32;
  if (t.lanes == 1 && t.code == static_cast<uint8_t>(dtype_code::Float) && t.bits == 16) return MAXSIM_F16;
  if (t.lanes == 1 && t.code == static_cast<uint8_t>(dtype_code::Bfloat) && t.bits == 16) return MAXSIM_BF16;
  ThrowArg(std::string(what) + " must be float32, float16 or bfloat16 (got DLPack type code " +
           std::to_string(t.code) + ", " + std::to_string(t.bits) + " bits)");
}

maxsim_memory MemoryOf(int device_type, const char* what) {
  if (device_type == nb::device::cpu::value) return MAXSIM_MEMORY_HOST;
  if (device_type == nb::device::cuda::value) return MAXSIM_MEMORY_CUDA;
  ThrowArg(std::string(what) + " lives on DLPack device type " + std::to_string(device_type) +
           "; libmaxsim reads host (CPU) and CUDA memory");
}

// Token sets in the caller's memory: [rows, d] with offsets or a set length, or [n, L, d]. Rows may be strided
// (any row stride >= d, unit element stride): the library reads them in place. Holds the arrays it points into.
class DenseSets {
 public:
  // raw_dtype = MAXSIM_BF16 reads a uint16 array as bfloat16 bit patterns (numpy has no bfloat16 type).
  DenseSets(AnyArray data, std::optional<U64Array> offsets, uint64_t set_length,
            std::optional<nb::ndarray<nb::ro, nb::ndim<1>>> mask, int raw_dtype)
      : data_(std::move(data)), offsets_(std::move(offsets)), mask_(std::move(mask)) {
    std::memset(&sets_, 0, sizeof(sets_));
    sets_.struct_size = sizeof(sets_);
    const size_t nd = data_.ndim();
    if (nd != 2 && nd != 3) ThrowArg("token array must have 2 ([rows, dim]) or 3 ([sets, length, dim]) dimensions, got " + std::to_string(nd));
    if (raw_dtype == MAXSIM_BF16) {
      const auto t = data_.dtype();
      if (t.code != static_cast<uint8_t>(nb::dlpack::dtype_code::UInt) || t.bits != 16 || t.lanes != 1) ThrowArg("bfloat16 bit patterns must be a uint16 array");
      sets_.dtype = MAXSIM_BF16;
    } else {
      sets_.dtype = DtypeOf(data_.dtype(), "token array");
    }
    sets_.memory = MemoryOf(data_.device_type(), "token array");
    const uint64_t dim = data_.shape(nd - 1);
    if (dim == 0 || dim > UINT32_MAX) ThrowArg("token dimension is " + std::to_string(dim) + "; it must be 1 to 2^32-1");
    sets_.dim = static_cast<uint32_t>(dim);
    uint64_t total_rows = 1;
    for (size_t i = 0; i + 1 < nd; ++i) total_rows *= data_.shape(i);
    if (total_rows > 0 && dim > 1 && data_.stride(nd - 1) != 1) ThrowArg("token rows must be contiguous (element stride 1 in the last dimension); pass a contiguous copy");
    uint64_t rows = data_.shape(0);
    int64_t row_stride = data_.stride(nd - 2);
    if (nd == 3) {
      const uint64_t n = data_.shape(0), len = data_.shape(1);
      if (offsets_) ThrowArg("offsets are for a 2-D [rows, dim] token array; a 3-D array has one set per leading index");
      // Rows of all sets must be evenly spaced: stride(0) == L * stride(1) (true for any C-contiguous array).
      if (n > 1 && data_.stride(0) != static_cast<int64_t>(len) * row_stride) {
        ThrowArg("a 3-D token array must have evenly spaced rows (stride(0) == L * stride(1)); pass a contiguous copy");
      }
      rows = n * len;
      sets_.n_sets = n;
      sets_.set_length = len;
      if (len == 1) row_stride = n > 1 ? data_.stride(0) : static_cast<int64_t>(dim);
    } else if (offsets_) {
      if (offsets_->shape(0) == 0) ThrowArg("offsets must have n_sets + 1 entries (got an empty array)");
      sets_.n_sets = offsets_->shape(0) - 1;
      sets_.offsets = offsets_->data();
      if (offsets_->data()[sets_.n_sets] > rows) {
        ThrowArg("offsets end at row " + std::to_string(offsets_->data()[sets_.n_sets]) + " but the token array has " +
                 std::to_string(rows) + " rows");
      }
    } else {
      if (set_length == 0) {
        sets_.n_sets = 1;
        sets_.set_length = rows;
      } else {
        if (rows % set_length != 0) ThrowArg("the token array's " + std::to_string(rows) + " rows are not a multiple of set_length " + std::to_string(set_length));
        sets_.n_sets = rows / set_length;
        sets_.set_length = set_length;
      }
    }
    if (rows <= 1) row_stride = static_cast<int64_t>(dim);
    if (row_stride < static_cast<int64_t>(dim)) ThrowArg("token rows overlap or run backwards (row stride " + std::to_string(row_stride) + " < dim " + std::to_string(dim) + "); pass a contiguous copy");
    sets_.row_stride = static_cast<uint64_t>(row_stride);
    sets_.data = data_.data();
    rows_ = rows;
    if (mask_) {
      const auto& m = *mask_;
      const auto t = m.dtype();
      if (t.bits != 8 || t.lanes != 1 || (t.code != static_cast<uint8_t>(nb::dlpack::dtype_code::Bool) &&
                                          t.code != static_cast<uint8_t>(nb::dlpack::dtype_code::UInt) &&
                                          t.code != static_cast<uint8_t>(nb::dlpack::dtype_code::Int))) {
        ThrowArg("mask must be bool or uint8 (one byte per token)");
      }
      if (m.shape(0) != rows) ThrowArg("mask has " + std::to_string(m.shape(0)) + " entries for " + std::to_string(rows) + " token rows");
      if (rows > 1 && m.stride(0) != 1) ThrowArg("mask must be contiguous");
      if (MemoryOf(m.device_type(), "mask") != sets_.memory) ThrowArg("mask and tokens must live on the same device");
      if (sets_.memory == MAXSIM_MEMORY_CUDA && m.device_id() != data_.device_id()) {
        ThrowArg("mask lives on CUDA device " + std::to_string(m.device_id()) + " but the tokens on device " +
                 std::to_string(data_.device_id()) + "; move them to one GPU");
      }
      sets_.mask = static_cast<const uint8_t*>(m.data());
    }
  }

  // Sets from a Python list (or tuple) of per-set host arrays ([L_i, d] each), described in place with per-set row
  // pointers (maxsim_dense_sets.set_data): no copy; the arrays are held until this object goes. None, keeping
  // nothing, when the list cannot be described so: an element that is not a 2-D array nanobind reads, on a device,
  // of another dtype than the first, with a non-unit element stride, a row stride unlike the other arrays' (arrays
  // of two rows or more), or a first row not aligned to its element size; the caller then concatenates the list
  // (converting dtypes as numpy or torch do). An array whose dim differs from the first one's is an error naming it.
  static std::optional<DenseSets> FromList(nb::handle list, const std::string& what) {
    const bool is_list = PyList_Check(list.ptr()), is_tuple = PyTuple_Check(list.ptr());
    if (!is_list && !is_tuple) ThrowArg(what + " must be a list or tuple of per-set arrays");
    const size_t n = static_cast<size_t>(is_list ? PyList_GET_SIZE(list.ptr()) : PyTuple_GET_SIZE(list.ptr()));
    if (n == 0) return std::nullopt;
    DenseSets d;
    std::memset(&d.sets_, 0, sizeof(d.sets_));
    d.sets_.struct_size = sizeof(d.sets_);
    d.sets_.memory = MAXSIM_MEMORY_HOST;
    d.parts_.reserve(n);
    d.set_ptrs_.resize(n);
    d.own_offsets_.resize(n + 1);
    d.own_offsets_[0] = 0;
    int64_t stride = -1;  // common row stride in elements, once an array of two rows or more sets it
    size_t elem = 4;
    for (size_t j = 0; j < n; ++j) {
      PyObject* item = is_list ? PyList_GET_ITEM(list.ptr(), j) : PyTuple_GET_ITEM(list.ptr(), j);
      AnyArray a;
      if (!nb::try_cast(nb::handle(item), a, false)) return std::nullopt;
      if (a.ndim() != 2 || a.device_type() != nb::device::cpu::value) return std::nullopt;
      const auto t = a.dtype();
      if (j == 0) {
        using nb::dlpack::dtype_code;
        const bool f = t.code == static_cast<uint8_t>(dtype_code::Float) && (t.bits == 32 || t.bits == 16);
        const bool bf = t.code == static_cast<uint8_t>(dtype_code::Bfloat) && t.bits == 16;
        if (t.lanes != 1 || !(f || bf)) return std::nullopt;
        d.sets_.dtype = DtypeOf(t, "token array");
        elem = t.bits / 8;
        if (a.shape(1) == 0 || a.shape(1) > UINT32_MAX) return std::nullopt;
        d.sets_.dim = static_cast<uint32_t>(a.shape(1));
      } else {
        const auto first = d.parts_[0].dtype();
        if (t.code != first.code || t.bits != first.bits || t.lanes != first.lanes) return std::nullopt;
      }
      if (a.shape(1) != d.sets_.dim) {
        Throw(MAXSIM_ERR_DIM_MISMATCH, what + "[" + std::to_string(j) + "] has dim " + std::to_string(a.shape(1)) +
                                           " but " + what + "[0] has dim " + std::to_string(d.sets_.dim));
      }
      const uint64_t len = a.shape(0);
      if (len > 0 && d.sets_.dim > 1 && a.stride(1) != 1) return std::nullopt;
      if (len > 1) {
        if (stride < 0) stride = a.stride(0);
        if (a.stride(0) != stride || stride < static_cast<int64_t>(d.sets_.dim)) return std::nullopt;
      }
      if (len > 0 && reinterpret_cast<uintptr_t>(a.data()) % elem != 0) return std::nullopt;
      d.set_ptrs_[j] = len > 0 ? a.data() : nullptr;
      d.own_offsets_[j + 1] = d.own_offsets_[j] + len;
      d.parts_.push_back(std::move(a));
    }
    d.sets_.row_stride = stride < 0 ? d.sets_.dim : static_cast<uint64_t>(stride);
    d.sets_.n_sets = n;
    d.sets_.offsets = d.own_offsets_.data();
    d.sets_.set_data = d.set_ptrs_.data();
    d.rows_ = d.own_offsets_[n];
    return std::optional<DenseSets>(std::move(d));
  }
  // Moves keep sets_'s pointers into own_offsets_ and set_ptrs_ valid (a vector's buffer moves with it); a copy
  // would not.
  DenseSets(DenseSets&&) = default;
  DenseSets& operator=(DenseSets&&) = default;
  DenseSets(const DenseSets&) = delete;
  DenseSets& operator=(const DenseSets&) = delete;

  const maxsim_dense_sets& sets() const { return sets_; }
  uint64_t n_sets() const { return sets_.n_sets; }
  uint32_t dim() const { return sets_.dim; }
  uint64_t rows() const { return rows_; }
  // Query-token rows as the argmax layout counts them (masked rows included).
  uint64_t token_rows() const {
    if (sets_.offsets) return sets_.offsets[sets_.n_sets] - sets_.offsets[0];
    return sets_.n_sets * sets_.set_length;
  }
  bool on_cuda() const { return sets_.memory == MAXSIM_MEMORY_CUDA; }
  int device_id() const { return data_.device_id(); }

 private:
  DenseSets() = default;

  AnyArray data_;
  std::vector<AnyArray> parts_;          // FromList: the per-set arrays (set_ptrs_ point into them)
  std::vector<const void*> set_ptrs_;
  std::vector<uint64_t> own_offsets_;
  std::optional<U64Array> offsets_;
  std::optional<nb::ndarray<nb::ro, nb::ndim<1>>> mask_;
  maxsim_dense_sets sets_;
  uint64_t rows_ = 0;
};

class Context {
 public:
  Context(int threads, const std::string& backend, const std::string& isa, bool load_plugins,
          const std::string& plugin_path, const std::string& devices) {
    if (threads < 0) ThrowArg("threads is " + std::to_string(threads) + " (use 0 for the default or a positive count)");
    maxsim_options o;
    maxsim_options_init(&o);
    o.num_threads = threads;
    o.backend = backend.empty() ? nullptr : backend.c_str();
    o.isa = isa.empty() ? nullptr : isa.c_str();
    o.plugin_path = plugin_path.empty() ? nullptr : plugin_path.c_str();
    o.load_plugins = load_plugins ? 1 : 0;
    o.devices = devices.empty() ? nullptr : devices.c_str();
    maxsim_status st;
    {
      nb::gil_scoped_release release;
      st = maxsim_context_create(&o, &ctx_);
    }
    Check(st);
  }
  ~Context() { maxsim_context_destroy(ctx_); }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  maxsim_context* get() const { return ctx_; }
  std::string Report() const {
    size_t needed = 0;
    maxsim_context_report(ctx_, nullptr, 0, &needed);
    std::string text(needed, '\0');
    Check(maxsim_context_report(ctx_, text.data(), text.size(), &needed));
    text.resize(needed ? needed - 1 : 0);
    return text;
  }
  std::string Kernel() const { return maxsim_context_kernel(ctx_); }
  std::string Backend() const { return maxsim_context_backend(ctx_); }
  int Threads() const { return maxsim_context_num_threads(ctx_); }

 private:
  maxsim_context* ctx_ = nullptr;
};

maxsim_validation ValidationOf(const std::string& level) {
  if (level == "standard") return MAXSIM_VALIDATE_STANDARD;
  if (level == "deep") return MAXSIM_VALIDATE_DEEP;
  if (level == "fast") return MAXSIM_VALIDATE_FAST;
  ThrowArg("validation level '" + level + "' is not 'fast', 'standard' or 'deep'");
}

// A validated packed corpus: owned (packed here), borrowed from a Python buffer (kept alive), or a read-only
// file mapping. close() releases it; any later use raises InvalidArgumentError.
class Packed {
 public:
  explicit Packed(maxsim_packed* p, nb::object keep = nb::none()) : p_(p), keep_(std::move(keep)) {}
  ~Packed() { maxsim_packed_release(p_); }
  Packed(const Packed&) = delete;
  Packed& operator=(const Packed&) = delete;

  static Packed* Pack(Context* ctx, const DenseSets& sets, std::optional<U64Array> ids,
                      std::optional<std::vector<std::string>> string_ids, nb::handle bar) {
    if (sets.on_cuda()) ThrowArg("pack reads host memory; move the tokens to the CPU first");
    if (ids && ids->shape(0) != sets.n_sets()) ThrowArg("ids has " + std::to_string(ids->shape(0)) + " entries for " + std::to_string(sets.n_sets()) + " sets");
    std::vector<const char*> names;
    if (string_ids) {
      if (string_ids->size() != sets.n_sets()) ThrowArg("string ids has " + std::to_string(string_ids->size()) + " entries for " + std::to_string(sets.n_sets()) + " sets");
      for (const std::string& n : *string_ids) {
        if (n.find('\0') != std::string::npos) ThrowArg("string id '" + n.substr(0, n.find('\0')) + "...' contains a NUL character");
        names.push_back(n.c_str());
      }
    }
    maxsim_packed* p = nullptr;
    maxsim_status st;
    ProgressScope progress(bar);
    {
      nb::gil_scoped_release release;
      st = string_ids ? maxsim_pack_with_string_ids(ctx->get(), &sets.sets(), ids ? ids->data() : nullptr, names.data(), &p)
                      : maxsim_pack(ctx->get(), &sets.sets(), ids ? ids->data() : nullptr, &p);
    }
    progress.Check(st);
    return new Packed(p);
  }
  static Packed* Load(const std::string& path, const std::string& level) {
    const maxsim_validation v = ValidationOf(level);
    maxsim_packed* p = nullptr;
    maxsim_status st;
    {
      nb::gil_scoped_release release;
      st = maxsim_packed_load(path.c_str(), v, &p);
    }
    Check(st);
    return new Packed(p);
  }
  static Packed* Open(nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> buf,
                      const std::string& level, nb::object owner) {
    const maxsim_validation v = ValidationOf(level);
    maxsim_packed* p = nullptr;
    maxsim_status st;
    {
      nb::gil_scoped_release release;
      st = maxsim_packed_open(buf.data(), buf.shape(0), v, &p);
    }
    Check(st);
    return new Packed(p, owner);
  }

  const maxsim_packed* get() const {
    if (!p_) ThrowArg("this PackedCorpus is closed");
    return p_;
  }
  maxsim_packed_desc Describe() const {
    maxsim_packed_desc d;
    Check(maxsim_packed_describe(get(), &d));
    return d;
  }
  void Save(const std::string& path) const {
    const maxsim_packed* p = get();
    maxsim_status st;
    {
      nb::gil_scoped_release release;
      st = maxsim_packed_save(p, path.c_str());
    }
    Check(st);
  }
  void Validate(const std::string& level) const {
    const maxsim_validation v = ValidationOf(level);
    const maxsim_packed_desc d = Describe();
    maxsim_status st;
    {
      nb::gil_scoped_release release;
      st = maxsim_validate(d.data, d.size, v);
    }
    Check(st);
  }
  void Close() {
    maxsim_packed_release(p_);
    p_ = nullptr;
    keep_ = nb::none();
  }
  bool closed() const { return p_ == nullptr; }

 private:
  maxsim_packed* p_ = nullptr;
  nb::object keep_;
};

// One side of a scoring call: a PackedCorpus or DenseSets.
struct Side {
  maxsim_sets sets{nullptr, nullptr};
  uint64_t n_sets = 0;
  uint64_t token_rows = 0;
  bool cuda = false;
  int device_id = 0;
};

Side SideOf(nb::handle obj, const char* what) {
  Side s;
  if (nb::isinstance<Packed>(obj)) {
    const Packed& p = nb::cast<const Packed&>(obj);
    s.sets.packed = p.get();
    const maxsim_packed_desc d = p.Describe();
    s.n_sets = d.n_sets;
    s.token_rows = d.n_vectors;
  } else if (nb::isinstance<DenseSets>(obj)) {
    const DenseSets& d = nb::cast<const DenseSets&>(obj);
    s.sets.dense = &d.sets();
    s.n_sets = d.n_sets();
    s.token_rows = d.token_rows();
    s.cuda = d.on_cuda();
    s.device_id = d.device_id();
  } else {
    ThrowArg(std::string(what) + " must be a PackedCorpus or DenseSets");
  }
  return s;
}

template <typename Out>
void CheckOut(const Out& out, uint64_t expected, bool cuda, const char* what) {
  if (out.size() != expected) ThrowArg(std::string(what) + " has " + std::to_string(out.size()) + " elements; " + std::to_string(expected) + " needed");
  const bool out_cuda = out.device_type() == nb::device::cuda::value;
  if (out_cuda != cuda) ThrowArg(std::string(what) + " must live where the inputs live (" + (cuda ? "CUDA" : "host") + ")");
}

maxsim_score_options ScoreOptions(int metric, int mode, maxsim_stats* stats, uintptr_t stream, uint32_t flags = 0) {
  maxsim_score_options o;
  maxsim_score_options_init(&o);
  o.metric = static_cast<maxsim_metric>(metric);
  o.mode = static_cast<maxsim_mode>(mode);
  o.stats = stats;
  o.cuda_stream = reinterpret_cast<void*>(stream);
  o.flags = flags;
  return o;
}

nb::object StatsDict(const maxsim_stats& s) {
  nb::dict d;
  d["pairs"] = s.pairs;
  d["query_tokens"] = s.query_tokens;
  d["refined"] = s.refined;
  d["multi_candidate"] = s.multi_candidate;
  d["docs_pruned"] = s.docs_pruned;
  return d;
}

void CheckSides(const Side& q, const Side& d) {
  if (q.cuda != d.cuda && q.sets.dense && d.sets.dense) ThrowArg("queries and documents must both be host memory or both CUDA memory");
}

// The score matrix (every query set against every document set) or pairs (query set i against document set i).
template <bool kPairs>
nb::object ScoreSets(Context* ctx, nb::handle queries, nb::handle documents, int metric, int mode, OutF32 scores,
                     std::optional<OutI32> argmax, bool want_stats, uintptr_t stream, nb::handle bar, uint32_t flags) {
  const Side q = SideOf(queries, "queries"), d = SideOf(documents, "documents");
  CheckSides(q, d);
  const bool cuda = q.cuda || d.cuda;
  if (kPairs && q.n_sets != d.n_sets) ThrowArg("pairs needs as many query sets as document sets (" + std::to_string(q.n_sets) + " vs " + std::to_string(d.n_sets) + ")");
  const uint64_t per_query = kPairs ? 1 : d.n_sets;
  CheckOut(scores, q.n_sets * per_query, cuda, "scores");
  if (argmax) CheckOut(*argmax, q.token_rows * per_query, cuda, "argmax");
  maxsim_stats stats{};
  const maxsim_score_options o = ScoreOptions(metric, mode, want_stats ? &stats : nullptr, stream, flags);
  maxsim_status st;
  ProgressScope progress(bar);
  {
    nb::gil_scoped_release release;
    st = (kPairs ? maxsim_score_pairs : maxsim_score_matrix)(ctx->get(), &q.sets, &d.sets, &o, scores.data(),
                                                            argmax ? argmax->data() : nullptr);
  }
  progress.Check(st);
  return want_stats ? StatsDict(stats) : nb::none();
}

nb::object ScoreCandidates(Context* ctx, nb::handle queries, nb::handle documents, U64Array cand_offsets,
                           U64Array candidates, int metric, int mode, OutF32 scores, std::optional<OutI32> argmax,
                           uint64_t argmax_size, bool want_stats, uintptr_t stream, nb::handle bar, uint32_t flags) {
  const Side q = SideOf(queries, "queries"), d = SideOf(documents, "documents");
  CheckSides(q, d);
  const bool cuda = q.cuda || d.cuda;
  if (cand_offsets.shape(0) != q.n_sets + 1) ThrowArg("candidate offsets need n_queries + 1 = " + std::to_string(q.n_sets + 1) + " entries, got " + std::to_string(cand_offsets.shape(0)));
  const uint64_t total = cand_offsets.data()[q.n_sets];
  if (total > candidates.shape(0)) ThrowArg("candidate offsets end at " + std::to_string(total) + " but there are " + std::to_string(candidates.shape(0)) + " candidates");
  CheckOut(scores, total, cuda, "scores");
  if (argmax) CheckOut(*argmax, argmax_size, cuda, "argmax");
  maxsim_stats stats{};
  const maxsim_score_options o = ScoreOptions(metric, mode, want_stats ? &stats : nullptr, stream, flags);
  maxsim_status st;
  ProgressScope progress(bar);
  {
    nb::gil_scoped_release release;
    st = maxsim_score_candidates(ctx->get(), &q.sets, &d.sets, cand_offsets.data(), candidates.data(), &o,
                                 scores.data(), argmax ? argmax->data() : nullptr);
  }
  progress.Check(st);
  return want_stats ? StatsDict(stats) : nb::none();
}

nb::object TopK(Context* ctx, nb::handle queries, nb::handle documents, uint64_t k, int metric, int mode,
                nb::ndarray<float, nb::c_contig, nb::device::cpu> scores, OutU64 index, std::optional<OutU64> ids,
                bool want_stats, uintptr_t stream, nb::handle bar) {
  const Side q = SideOf(queries, "queries"), d = SideOf(documents, "documents");
  CheckSides(q, d);
  CheckOut(scores, q.n_sets * k, false, "scores");
  CheckOut(index, q.n_sets * k, false, "indices");
  if (ids) CheckOut(*ids, q.n_sets * k, false, "ids");
  maxsim_stats stats{};
  const maxsim_score_options o = ScoreOptions(metric, mode, want_stats ? &stats : nullptr, stream);
  maxsim_status st;
  ProgressScope progress(bar);
  {
    nb::gil_scoped_release release;
    st = maxsim_topk(ctx->get(), &q.sets, &d.sets, k, &o, scores.data(), index.data(), ids ? ids->data() : nullptr);
  }
  progress.Check(st);
  return want_stats ? StatsDict(stats) : nb::none();
}

// The common top-k call in one step (maxsim.topk's fast path): a numpy-readable query array ([Lq, d]: one set,
// or [n, Lq, d]) without a mask against a PackedCorpus. The same checks as the general path (DenseSets,
// maxsim_topk); the outputs are new numpy arrays sharing one allocation: scores float32, indices int64 (-1 past
// the corpus end), ids uint64 when want_ids (the corpus has numeric ids) else None; [k] for a 2-D query, else
// [n, k]. Saves the Python-level argument handling and output allocation of the general path.
nb::tuple TopKNumpy(Context* ctx, AnyArray queries, const Packed& corpus, int64_t k, int metric, int mode,
                    bool want_ids) {
  if (k < 0) ThrowArg("k is " + std::to_string(k) + "; it must be >= 0");
  const size_t nd = queries.ndim();
  const DenseSets q(std::move(queries), std::nullopt, 0, std::nullopt, 0);
  if (q.on_cuda()) ThrowArg("queries in CUDA memory: use maxsim.topk with torch tensors (this path is numpy)");
  const maxsim_sets qs{nullptr, &q.sets()};
  const maxsim_sets ds{corpus.get(), nullptr};
  const uint64_t n = q.n_sets(), kk = static_cast<uint64_t>(k);
  const size_t total = static_cast<size_t>(n * kk);
  // One block: scores (4 bytes each, rounded up to 8), then indices, then ids.
  const size_t score_bytes = (total * sizeof(float) + 7) / 8 * 8;
  const size_t bytes = score_bytes + total * 8 * (want_ids ? 2 : 1);
  auto* block = static_cast<uint8_t*>(std::malloc(bytes ? bytes : 1));
  if (!block) Throw(MAXSIM_ERR_OUT_OF_MEMORY, "cannot allocate the top-k outputs");
  nb::capsule owner(block, [](void* p) noexcept { std::free(p); });
  auto* scores = reinterpret_cast<float*>(block);
  auto* index = reinterpret_cast<uint64_t*>(block + score_bytes);
  uint64_t* ids = want_ids ? index + total : nullptr;
  const maxsim_score_options o = ScoreOptions(metric, mode, nullptr, 0);
  maxsim_status st;
  ProgressScope progress{nb::none()};
  {
    nb::gil_scoped_release release;
    st = maxsim_topk(ctx->get(), &qs, &ds, kk, &o, scores, index, ids);
  }
  progress.Check(st);
  const bool single = nd == 2;
  const size_t shape2[2] = {static_cast<size_t>(n), static_cast<size_t>(kk)};
  const size_t ndim = single ? 1 : 2;
  const size_t* shape = single ? shape2 + 1 : shape2;
  nb::object s = nb::cast(nb::ndarray<nb::numpy, float>(scores, ndim, shape, owner));
  nb::object i = nb::cast(nb::ndarray<nb::numpy, int64_t>(reinterpret_cast<int64_t*>(index), ndim, shape, owner));
  nb::object d = want_ids ? nb::cast(nb::ndarray<nb::numpy, uint64_t>(ids, ndim, shape, owner)) : nb::none();
  return nb::make_tuple(s, i, d);
}

void Backward(Context* ctx, const DenseSets& queries, const DenseSets& documents, int layout,
              std::optional<U64Array> cand_offsets, std::optional<U64Array> candidates,
              nb::ndarray<const int32_t, nb::c_contig> argmax, nb::ndarray<const float, nb::c_contig> grad_scores,
              std::optional<OutF32> grad_queries, std::optional<OutF32> grad_documents, bool deterministic,
              uintptr_t stream, uint32_t flags) {
  if (grad_queries) CheckOut(*grad_queries, queries.rows() * queries.dim(), queries.on_cuda(), "grad_queries");
  if (grad_documents) CheckOut(*grad_documents, documents.rows() * documents.dim(), documents.on_cuda(), "grad_documents");
  maxsim_backward_args a;
  maxsim_backward_args_init(&a);
  a.layout = static_cast<maxsim_layout>(layout);
  a.cand_offsets = cand_offsets ? cand_offsets->data() : nullptr;
  a.candidates = candidates ? candidates->data() : nullptr;
  a.argmax = argmax.data();
  a.grad_scores = grad_scores.data();
  a.grad_queries = grad_queries ? grad_queries->data() : nullptr;
  a.grad_documents = grad_documents ? grad_documents->data() : nullptr;
  a.deterministic = deterministic ? 1 : 0;
  a.cuda_stream = reinterpret_cast<void*>(stream);
  a.flags = flags;
  maxsim_status st;
  {
    nb::gil_scoped_release release;
    st = maxsim_backward(ctx->get(), &queries.sets(), &documents.sets(), &a);
  }
  Check(st);
}

// maxsim_synchronize: waits for the context's stream-ordered calls; raises their first deferred error.
void Synchronize(Context* ctx) {
  maxsim_status st;
  {
    nb::gil_scoped_release release;
    st = maxsim_synchronize(ctx->get());
  }
  Check(st);
}

// The C call alone, timed in C++: the baseline of the binding-overhead benchmark (python/benchmarks).
double TimeTopKCall(Context* ctx, nb::handle queries, const Packed& corpus, uint64_t k, int mode, int iterations) {
  const Side q = SideOf(queries, "queries");
  const maxsim_sets d{corpus.get(), nullptr};
  std::vector<float> scores(q.n_sets * k);
  std::vector<uint64_t> index(q.n_sets * k);
  const maxsim_score_options o = ScoreOptions(MAXSIM_METRIC_DOT, mode, nullptr, 0);
  maxsim_status st = MAXSIM_OK;
  std::chrono::steady_clock::time_point t0, t1;
  {
    nb::gil_scoped_release release;
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations && st == MAXSIM_OK; ++i) {
      st = maxsim_topk(ctx->get(), &q.sets, &d, k, &o, scores.data(), index.data(), nullptr);
    }
    t1 = std::chrono::steady_clock::now();
  }
  Check(st);
  return std::chrono::duration<double>(t1 - t0).count() / iterations;
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "libmaxsim C API binding (internal: use the maxsim package)";

  m.def("register_errors", [](nb::handle base, nb::dict by_status) {
    g_base_error = base.ptr();
    Py_INCREF(g_base_error);
    for (auto [key, value] : by_status) {
      const int code = nb::cast<int>(key);
      if (code < 0 || code >= 16) continue;
      g_error_classes[code] = value.ptr();
      Py_INCREF(value.ptr());
    }
  }, nb::sig("def register_errors(base: type, by_status: dict[int, type], /) -> None"));
  m.def("version_string", [] { return std::string(maxsim_version_string()); });
  m.def("version", [] { return maxsim_version(); });
  m.def("status_name", [](int code) { return std::string(maxsim_status_name(static_cast<maxsim_status>(code))); });
  m.def("kernels", [] {
    nb::list out;
    for (size_t i = 0; i < maxsim_kernel_count(); ++i) {
      const char* reason = nullptr;
      const int ok = maxsim_kernel_available(i, &reason);
      out.append(nb::make_tuple(std::string(maxsim_kernel_name(i)), ok != 0, std::string(reason ? reason : "")));
    }
    return out;
  });

  nb::class_<Context>(m, "Context")
      .def(nb::init<int, const std::string&, const std::string&, bool, const std::string&, const std::string&>(),
           "threads"_a = 0, "backend"_a = "", "isa"_a = "", "load_plugins"_a = true, "plugin_path"_a = "",
           "devices"_a = "")
      .def("report", &Context::Report)
      .def_prop_ro("kernel", &Context::Kernel)
      .def_prop_ro("backend", &Context::Backend)
      .def_prop_ro("threads", &Context::Threads);

  nb::class_<DenseSets>(m, "DenseSets")
      .def(nb::init<AnyArray, std::optional<U64Array>, uint64_t, std::optional<nb::ndarray<nb::ro, nb::ndim<1>>>, int>(),
           "data"_a, "offsets"_a.none() = nb::none(), "set_length"_a = 0, "mask"_a.none() = nb::none(),
           "raw_dtype"_a = 0)
      .def_static("from_list", &DenseSets::FromList, "sets"_a, "what"_a)
      .def_prop_ro("n_sets", &DenseSets::n_sets)
      .def_prop_ro("dim", &DenseSets::dim)
      .def_prop_ro("rows", &DenseSets::rows)
      .def_prop_ro("token_rows", &DenseSets::token_rows)
      .def_prop_ro("on_cuda", &DenseSets::on_cuda);

  nb::class_<Packed>(m, "Packed")
      .def_static("pack", &Packed::Pack, "ctx"_a, "sets"_a, "ids"_a.none() = nb::none(),
                  "string_ids"_a.none() = nb::none(), "progress"_a.none() = nb::none(), nb::rv_policy::take_ownership)
      .def_static("load", &Packed::Load, "path"_a, "level"_a = "standard", nb::rv_policy::take_ownership)
      .def_static("open", &Packed::Open, "buffer"_a, "level"_a, "owner"_a, nb::rv_policy::take_ownership)
      .def("save", &Packed::Save)
      .def("validate", &Packed::Validate, "level"_a = "standard")
      .def("close", &Packed::Close)
      .def_prop_ro("closed", &Packed::closed)
      .def_prop_ro("n_sets", [](const Packed& p) { return p.Describe().n_sets; })
      .def_prop_ro("n_vectors", [](const Packed& p) { return p.Describe().n_vectors; })
      .def_prop_ro("dim", [](const Packed& p) { return p.Describe().dim; })
      .def_prop_ro("dtype", [](const Packed& p) { return static_cast<int>(p.Describe().dtype); })
      .def_prop_ro("nbytes", [](const Packed& p) { return p.Describe().size; })
      .def_prop_ro("has_ids", [](const Packed& p) { return p.Describe().has_ids != 0; })
      .def_prop_ro("has_string_ids", [](const Packed& p) {
        const char* id = nullptr;
        size_t len = 0;
        return p.Describe().n_sets > 0 && maxsim_packed_string_id(p.get(), 0, &id, &len) == MAXSIM_OK && id != nullptr;
      })
      .def("offsets", [](nb::handle self) {
        const maxsim_packed_desc d = nb::cast<const Packed&>(self).Describe();
        return nb::ndarray<nb::numpy, const uint64_t, nb::ndim<1>>(d.offsets, {static_cast<size_t>(d.n_sets + 1)}, self);
      })
      .def("ids", [](nb::handle self) -> nb::object {
        const maxsim_packed_desc d = nb::cast<const Packed&>(self).Describe();
        if (!d.ids) return nb::none();
        return nb::cast(nb::ndarray<nb::numpy, const uint64_t, nb::ndim<1>>(d.ids, {static_cast<size_t>(d.n_sets)}, self));
      })
      .def("string_ids", [](const Packed& p, std::optional<OutU64> which) -> nb::object {
        // All string ids (which = None) or those of the given set indices (UINT64_MAX: None); None without any.
        const maxsim_packed* h = p.get();
        const char* id = nullptr;
        size_t len = 0;
        const uint64_t n = p.Describe().n_sets;
        if (n == 0) return nb::list();
        Check(maxsim_packed_string_id(h, 0, &id, &len));
        if (id == nullptr) return nb::none();
        nb::list out;
        const uint64_t count = which ? which->size() : n;
        for (uint64_t k = 0; k < count; ++k) {
          const uint64_t i = which ? which->data()[k] : k;
          if (i >= n) {
            out.append(nb::none());
            continue;
          }
          Check(maxsim_packed_string_id(h, i, &id, &len));
          out.append(nb::str(id, len));
        }
        return out;
      }, "which"_a.none() = nb::none())
      .def("buffer", [](nb::handle self) {
        const maxsim_packed_desc d = nb::cast<const Packed&>(self).Describe();
        return nb::ndarray<nb::numpy, const uint8_t, nb::ndim<1>>(d.data, {static_cast<size_t>(d.size)}, self);
      });

  m.def("score_matrix", &ScoreSets<false>, "ctx"_a, "queries"_a, "documents"_a, "metric"_a, "mode"_a, "scores"_a,
        "argmax"_a.none(), "want_stats"_a, "stream"_a, "progress"_a.none() = nb::none(), "flags"_a = 0u);
  m.def("score_pairs", &ScoreSets<true>, "ctx"_a, "queries"_a, "documents"_a, "metric"_a, "mode"_a, "scores"_a,
        "argmax"_a.none(), "want_stats"_a, "stream"_a, "progress"_a.none() = nb::none(), "flags"_a = 0u);
  m.def("score_candidates", &ScoreCandidates, "ctx"_a, "queries"_a, "documents"_a, "cand_offsets"_a,
        "candidates"_a, "metric"_a, "mode"_a, "scores"_a, "argmax"_a.none(), "argmax_size"_a, "want_stats"_a,
        "stream"_a, "progress"_a.none() = nb::none(), "flags"_a = 0u);
  m.def("topk", &TopK, "ctx"_a, "queries"_a, "documents"_a, "k"_a, "metric"_a, "mode"_a, "scores"_a, "index"_a,
        "ids"_a.none(), "want_stats"_a, "stream"_a, "progress"_a.none() = nb::none());
  m.def("topk_numpy", &TopKNumpy, "ctx"_a, "queries"_a, "corpus"_a, "k"_a, "metric"_a, "mode"_a, "want_ids"_a);
  m.def("backward", &Backward, "ctx"_a, "queries"_a, "documents"_a, "layout"_a, "cand_offsets"_a.none(),
        "candidates"_a.none(), "argmax"_a, "grad_scores"_a, "grad_queries"_a.none(), "grad_documents"_a.none(),
        "deterministic"_a, "stream"_a, "flags"_a = 0u);
  m.def("synchronize", &Synchronize, "ctx"_a);
  m.attr("CALL_STREAM_ORDERED") = MAXSIM_CALL_STREAM_ORDERED;
  m.def("_time_topk_c_call", &TimeTopKCall, "ctx"_a, "queries"_a, "corpus"_a, "k"_a, "mode"_a, "iterations"_a);
}
