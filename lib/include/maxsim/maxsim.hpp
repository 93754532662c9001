// SPDX-License-Identifier: Apache-2.0
// Thin header-only C++17 wrapper over the C API (maxsim.h): owning handles (RAII), exceptions instead of
// status codes, and span-like views. Everything here is inline and calls only the stable C ABI.
//
//   maxsim::Context ctx;                                          // defaults from the environment
//   maxsim::DenseSets docs(tokens.data(), dim, offsets);          // row-major f32 + cu_seqlens-style offsets
//                                                                 // (int64 as numpy/torch give them, uint64, int32)
//   maxsim::Packed corpus = maxsim::Packed::Pack(ctx, docs);      // or Packed::Load("corpus.maxsim")
//   auto top = ctx.TopK(maxsim::DenseSets(q.data(), dim, qoff), corpus, 10,
//                       {MAXSIM_METRIC_DOT, MAXSIM_MODE_CERTIFIED});
#ifndef MAXSIM_MAXSIM_HPP_
#define MAXSIM_MAXSIM_HPP_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "maxsim/maxsim.h"

namespace maxsim {

class Error : public std::runtime_error {
 public:
  Error(maxsim_status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  maxsim_status status() const { return status_; }

 private:
  maxsim_status status_;
};

// Throws maxsim::Error(status, message); built without exceptions (-fno-exceptions, e.g. WebAssembly), prints
// the message to stderr and aborts instead.
[[noreturn]] inline void Fail(maxsim_status status, const std::string& message) {
#if defined(__cpp_exceptions)
  throw Error(status, message);
#else
  std::fprintf(stderr, "maxsim: %s\n", message.c_str());
  std::abort();
#endif
}

// A failed call: Fail with the status name and the library's message.
inline void Check(maxsim_status status) {
  if (status != MAXSIM_OK) Fail(status, std::string(maxsim_status_name(status)) + ": " + maxsim_last_error());
}

template <typename T>
struct Span {
  T* data = nullptr;
  size_t size = 0;
  Span() = default;
  Span(T* d, size_t n) : data(d), size(n) {}
  template <typename C, typename = decltype(std::declval<C&>().data()), typename = decltype(std::declval<C&>().size())>
  Span(C& c) : data(c.data()), size(c.size()) {}  // NOLINT: implicit from containers, like std::span
  T* begin() const { return data; }
  T* end() const { return data + size; }
  T& operator[](size_t i) const { return data[i]; }
};

// Offsets or indices as users hold them: 64-bit integers (int64_t from numpy and torch, uint64_t) are viewed
// in place; 32-bit ones (int32_t, uint32_t) are widened into a copy this object owns. Signed values are checked
// for negatives (an Error naming the element). Any other element type stops the build at the call site with the
// static_assert below.
class Indices {
 public:
  Indices() = default;
  template <typename T>
  Indices(const T* data, size_t size) {  // NOLINT: pointer + count
    static_assert(kAccepted<T>,
                  "maxsim: offsets and indices must be 32- or 64-bit integers (int64_t as numpy/torch give them, "
                  "uint64_t, int32_t, uint32_t); convert other element types first");
    Init(data, size);
  }
  template <typename C, typename = decltype(std::declval<const C&>().data()),
            typename = decltype(std::declval<const C&>().size())>
  Indices(const C& c)  // NOLINT: implicit from containers (std::vector, spans), like std::span
      : Indices(c.data(), static_cast<size_t>(c.size())) {}
  template <typename T>
  Indices(Span<T> s) : Indices(static_cast<const std::remove_const_t<T>*>(s.data), s.size) {}  // NOLINT
  Indices(std::initializer_list<uint64_t>) = delete;  // would dangle: name a container that outlives the call

  const uint64_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  template <typename T>
  static constexpr bool kAccepted =
      std::is_integral<T>::value && !std::is_same<T, bool>::value && (sizeof(T) == 8 || sizeof(T) == 4);

  template <typename T>
  void Init(const T* data, size_t size) {
    if constexpr (std::is_signed<T>::value) {
      for (size_t i = 0; i < size; ++i) {
        if (data[i] < 0) {
          Fail(MAXSIM_ERR_INVALID_ARGUMENT, "MAXSIM_ERR_INVALID_ARGUMENT: offsets/indices element " +
                                                std::to_string(i) + " is negative (" +
                                                std::to_string(static_cast<long long>(data[i])) + ")");
        }
      }
    }
    size_ = size;
    if constexpr (sizeof(T) == 8) {
      // A signed and an unsigned integer of one width may alias; the values are non-negative, so the same.
      data_ = reinterpret_cast<const uint64_t*>(data);
    } else {
      owned_ = std::make_shared<std::vector<uint64_t>>(data, data + size);
      data_ = owned_->data();
    }
  }
  const uint64_t* data_ = nullptr;
  size_t size_ = 0;
  std::shared_ptr<const std::vector<uint64_t>> owned_;  // widened 32-bit values (shared by copies)
};

// A non-owning description of row-major token sets (see maxsim_dense_sets).
class DenseSets {
 public:
  // Ragged sets: set i owns rows [offsets[i], offsets[i+1]). offsets has n_sets + 1 entries and must outlive
  // this object when it is a 64-bit array (it is viewed, not copied).
  DenseSets(const void* data, maxsim_dtype dtype, uint32_t dim, Indices offsets) {
    Init(data, dtype, dim);
    s_.n_sets = offsets.size() == 0 ? 0 : offsets.size() - 1;
    s_.offsets = offsets.data();
    offsets_ = std::move(offsets);
  }
  DenseSets(const float* data, uint32_t dim, Indices offsets)
      : DenseSets(static_cast<const void*>(data), MAXSIM_F32, dim, std::move(offsets)) {}
  // Uniform sets of `set_length` rows (a padded batch [n_sets, set_length, dim]), optional mask.
  static DenseSets Uniform(const void* data, maxsim_dtype dtype, uint32_t dim, uint64_t n_sets, uint64_t set_length,
                           const uint8_t* mask = nullptr) {
    DenseSets d;
    d.Init(data, dtype, dim);
    d.s_.n_sets = n_sets;
    d.s_.set_length = set_length;
    d.s_.mask = mask;
    return d;
  }
  // Ragged sets in separate allocations (maxsim_dense_sets.set_data): set i's rows start at set_data[i], each
  // set's rows contiguous with the common row stride; offsets give the lengths as above. set_data (n_sets
  // pointers) must outlive this object; it is viewed, not copied.
  static DenseSets PerSet(const void* const* set_data, maxsim_dtype dtype, uint32_t dim, Indices offsets) {
    DenseSets d(nullptr, dtype, dim, std::move(offsets));
    d.s_.set_data = set_data;
    return d;
  }
  DenseSets& WithMask(const uint8_t* mask) { s_.mask = mask; return *this; }
  DenseSets& WithRowStride(uint64_t elements) { s_.row_stride = elements; return *this; }
  DenseSets& InDeviceMemory() { s_.memory = MAXSIM_MEMORY_CUDA; return *this; }
  const maxsim_dense_sets* get() const { return &s_; }
  uint64_t n_sets() const { return s_.n_sets; }

 private:
  DenseSets() = default;
  void Init(const void* data, maxsim_dtype dtype, uint32_t dim) {
    s_ = maxsim_dense_sets{};
    s_.struct_size = sizeof(s_);
    s_.memory = MAXSIM_MEMORY_HOST;
    s_.data = data;
    s_.dtype = dtype;
    s_.dim = dim;
  }
  maxsim_dense_sets s_{};
  Indices offsets_;  // keeps widened 32-bit offsets alive
};

class Context;

// An owning handle to a validated packed collection.
class Packed {
 public:
  Packed() = default;
  explicit Packed(maxsim_packed* p) : p_(p) {}
  Packed(Packed&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  Packed& operator=(Packed&& o) noexcept {
    if (this != &o) {
      maxsim_packed_release(p_);
      p_ = std::exchange(o.p_, nullptr);
    }
    return *this;
  }
  Packed(const Packed&) = delete;
  Packed& operator=(const Packed&) = delete;
  ~Packed() { maxsim_packed_release(p_); }

  static Packed Pack(maxsim_context* ctx, const DenseSets& sets, const uint64_t* ids = nullptr) {
    maxsim_packed* p = nullptr;
    Check(maxsim_pack(ctx, sets.get(), ids, &p));
    return Packed(p);
  }
  static Packed Pack(Context& ctx, const DenseSets& sets, const uint64_t* ids = nullptr);
  // With one string id per set (packed format 1.1); ids (numeric) may be given too.
  static Packed PackWithStringIds(maxsim_context* ctx, const DenseSets& sets,
                                  const std::vector<std::string>& string_ids, const uint64_t* ids = nullptr) {
    std::vector<const char*> p(string_ids.size());
    for (size_t i = 0; i < p.size(); ++i) p[i] = string_ids[i].c_str();
    maxsim_packed* out = nullptr;
    Check(maxsim_pack_with_string_ids(ctx, sets.get(), ids, p.data(), &out));
    return Packed(out);
  }
  static Packed Load(const std::string& path, maxsim_validation level = MAXSIM_VALIDATE_STANDARD) {
    maxsim_packed* p = nullptr;
    Check(maxsim_packed_load(path.c_str(), level, &p));
    return Packed(p);
  }
  // Borrows `buffer` (64-byte aligned) without copying; keep it alive while this handle lives.
  static Packed Open(const void* buffer, uint64_t size, maxsim_validation level = MAXSIM_VALIDATE_STANDARD) {
    maxsim_packed* p = nullptr;
    Check(maxsim_packed_open(buffer, size, level, &p));
    return Packed(p);
  }
  void Save(const std::string& path) const { Check(maxsim_packed_save(p_, path.c_str())); }
  maxsim_packed_desc Describe() const {
    maxsim_packed_desc d{};
    Check(maxsim_packed_describe(p_, &d));
    return d;
  }
  // String id of set i ("" when the collection has none: HasStringIds() tells).
  std::string StringId(uint64_t i) const {
    const char* id = nullptr;
    size_t length = 0;
    Check(maxsim_packed_string_id(p_, i, &id, &length));
    return id ? std::string(id, length) : std::string();
  }
  bool HasStringIds() const {
    const char* id = nullptr;
    return Describe().n_sets > 0 && maxsim_packed_string_id(p_, 0, &id, nullptr) == MAXSIM_OK && id != nullptr;
  }
  const maxsim_packed* get() const { return p_; }

 private:
  maxsim_packed* p_ = nullptr;
};

// Either packed or dense input to an operation.
class Sets {
 public:
  Sets(const Packed& p) { s_.packed = p.get(); }       // NOLINT: implicit by design
  Sets(const DenseSets& d) { s_.dense = d.get(); }     // NOLINT
  const maxsim_sets* get() const { return &s_; }

 private:
  maxsim_sets s_{};
};

struct ScoreOptions {
  maxsim_metric metric = MAXSIM_METRIC_DOT;
  maxsim_mode mode = MAXSIM_MODE_EXACT;
  maxsim_stats* stats = nullptr;
  void* cuda_stream = nullptr;
  uint32_t flags = 0;  // MAXSIM_CALL_STREAM_ORDERED: see maxsim.h
  maxsim_score_options c() const {
    maxsim_score_options o;
    maxsim_score_options_init(&o);
    o.metric = metric;
    o.mode = mode;
    o.stats = stats;
    o.cuda_stream = cuda_stream;
    o.flags = flags;
    return o;
  }
};

struct TopKResult {
  uint64_t k = 0;
  std::vector<float> scores;     // [Nq, k]
  std::vector<uint64_t> index;   // [Nq, k]
  std::vector<uint64_t> ids;     // [Nq, k] when requested
};

class Context {
 public:
  Context() { Check(maxsim_context_create(nullptr, &ctx_)); }
  explicit Context(const maxsim_options& options) { Check(maxsim_context_create(&options, &ctx_)); }
  Context(Context&& o) noexcept : ctx_(std::exchange(o.ctx_, nullptr)) {}
  Context& operator=(Context&& o) noexcept {
    if (this != &o) {
      maxsim_context_destroy(ctx_);
      ctx_ = std::exchange(o.ctx_, nullptr);
    }
    return *this;
  }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  ~Context() { maxsim_context_destroy(ctx_); }

  maxsim_context* get() const { return ctx_; }
  std::string Report() const {
    size_t needed = 0;
    maxsim_context_report(ctx_, nullptr, 0, &needed);
    std::string text(needed, '\0');
    Check(maxsim_context_report(ctx_, text.data(), text.size(), &needed));
    text.resize(needed - 1);
    return text;
  }
  std::string Kernel() const { return maxsim_context_kernel(ctx_); }
  std::string Backend() const { return maxsim_context_backend(ctx_); }
  int Threads() const { return maxsim_context_num_threads(ctx_); }

  // scores [Nq * Nd] into the caller's memory; argmax optional (see maxsim.h for its layout and size).
  void ScoreMatrix(const Sets& q, const Sets& d, Span<float> scores, const ScoreOptions& o = {},
                   int32_t* argmax = nullptr) {
    const maxsim_score_options c = o.c();
    Check(maxsim_score_matrix(ctx_, q.get(), d.get(), &c, scores.data, argmax));
  }
  std::vector<float> ScoreMatrix(const Sets& q, uint64_t nq, const Sets& d, uint64_t nd, const ScoreOptions& o = {},
                                 int32_t* argmax = nullptr) {
    std::vector<float> scores(nq * nd);
    ScoreMatrix(q, d, scores, o, argmax);
    return scores;
  }
  void ScorePairs(const Sets& q, const Sets& d, Span<float> scores, const ScoreOptions& o = {},
                  int32_t* argmax = nullptr) {
    const maxsim_score_options c = o.c();
    Check(maxsim_score_pairs(ctx_, q.get(), d.get(), &c, scores.data, argmax));
  }
  // Candidates (document indices) of query i: candidates[cand_offsets[i] .. cand_offsets[i+1]); both arrays
  // take the same integer types as DenseSets offsets.
  void ScoreCandidates(const Sets& q, const Sets& d, const Indices& cand_offsets, const Indices& candidates,
                       Span<float> scores, const ScoreOptions& o = {}, int32_t* argmax = nullptr) {
    const maxsim_score_options c = o.c();
    Check(maxsim_score_candidates(ctx_, q.get(), d.get(), cand_offsets.data(), candidates.data(), &c, scores.data,
                                  argmax));
  }
  TopKResult TopK(const Sets& q, uint64_t nq, const Sets& d, uint64_t k, const ScoreOptions& o = {},
                  bool with_ids = false) {
    TopKResult r;
    r.k = k;
    r.scores.resize(nq * k);
    r.index.resize(nq * k);
    if (with_ids) r.ids.resize(nq * k);
    const maxsim_score_options c = o.c();
    Check(maxsim_topk(ctx_, q.get(), d.get(), k, &c, r.scores.data(), r.index.data(),
                      with_ids ? r.ids.data() : nullptr));
    return r;
  }
  void Backward(const DenseSets& q, const DenseSets& d, const maxsim_backward_args& args) {
    Check(maxsim_backward(ctx_, q.get(), d.get(), &args));
  }
  // Waits for the context's stream-ordered calls; throws their first deferred error.
  void Synchronize() { Check(maxsim_synchronize(ctx_)); }

 private:
  maxsim_context* ctx_ = nullptr;
};

inline Packed Packed::Pack(Context& ctx, const DenseSets& sets, const uint64_t* ids) {
  return Pack(ctx.get(), sets, ids);
}

}  // namespace maxsim

#endif  // MAXSIM_MAXSIM_HPP_
