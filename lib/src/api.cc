// SPDX-License-Identifier: Apache-2.0
// The C API: argument checks, routing between the CPU engine and a plugin, and the conversion of internal
// Status values and C++ exceptions into status codes + the thread-local message. Nothing escapes as an
// exception and nothing is printed.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "context.h"
#include "engine.h"
#include "file_io.h"
#include "maxsim/maxsim.h"
#include "packed.h"
#include "packed_handle.h"
#include "packer.h"
#include "progress.h"
#include "status.h"

// maxsim.h makes these names macros that pass the caller's sizeof; the exported functions are defined below.
#undef maxsim_options_init
#undef maxsim_score_options_init
#undef maxsim_backward_args_init

using maxsim::Error;
using maxsim::Report;
using maxsim::Status;

namespace maxsim {

uint64_t NextPackedUid() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

namespace {

// Without C++ exceptions (the WebAssembly build: its libc++ has none) an allocation failure aborts the module.
template <typename F>
maxsim_status Guard(F&& body) {
#if !defined(__cpp_exceptions)
  return Report(body());
#else
  try {
    return Report(body());
  } catch (const std::bad_alloc&) {
    return Report(Error(MAXSIM_ERR_OUT_OF_MEMORY, "out of host memory"));
  } catch (const std::exception& e) {
    return Report(Error(MAXSIM_ERR_INTERNAL, "internal error: %s", e.what()));
  } catch (...) {
    return Report(Error(MAXSIM_ERR_INTERNAL, "internal error: unknown exception"));
  }
#endif
}

Status CheckContext(const maxsim_context* ctx) {
  if (ctx == nullptr) return Error(MAXSIM_ERR_INVALID_ARGUMENT, "context is NULL (create one with maxsim_context_create)");
  return Status::Ok();
}

// The size of a C API struct's first released layout: its sizeof in the header whose last member was the one of
// `last_size` bytes at `last_offset`.
constexpr size_t FirstLayout(size_t last_offset, size_t last_size, size_t align) {
  return (last_offset + last_size + align - 1) / align * align;
}
constexpr size_t kOptionsFirstLayout =
    FirstLayout(offsetof(maxsim_options, log_user_data), sizeof(void*), alignof(maxsim_options));
constexpr size_t kScoreOptionsFirstLayout =
    FirstLayout(offsetof(maxsim_score_options, cuda_stream), sizeof(void*), alignof(maxsim_score_options));
constexpr size_t kBackwardArgsFirstLayout =
    FirstLayout(offsetof(maxsim_backward_args, cuda_stream), sizeof(void*), alignof(maxsim_backward_args));

// Writes the defaults `full` (every field this library knows) into the caller's first `size` bytes of *out, never
// past them nor past sizeof(T), with struct_size = the bytes written. A size below the first released layout
// writes struct_size = 0 only (nothing when even that does not fit), so that the call taking the struct fails
// naming it.
template <typename T>
void InitSized(T* out, size_t size, size_t first_layout, const T& full) {
  static_assert(offsetof(T, struct_size) == 0, "struct_size leads every C API struct");
  if (out == nullptr || size < sizeof(uint32_t)) return;
  const uint32_t written = size < first_layout ? 0u : static_cast<uint32_t>(std::min(size, sizeof(T)));
  if (written != 0) std::memcpy(out, &full, written);
  std::memcpy(out, &written, sizeof(written));
}

maxsim_options DefaultOptions() {
  maxsim_options o;
  std::memset(&o, 0, sizeof(o));
  o.struct_size = sizeof(o);
  o.load_plugins = 1;
  return o;
}

maxsim_score_options DefaultScoreOptions() {
  maxsim_score_options o;
  std::memset(&o, 0, sizeof(o));
  o.struct_size = sizeof(o);
  o.metric = MAXSIM_METRIC_DOT;
  o.mode = MAXSIM_MODE_EXACT;
  return o;
}

maxsim_backward_args DefaultBackwardArgs() {
  maxsim_backward_args a;
  std::memset(&a, 0, sizeof(a));
  a.struct_size = sizeof(a);
  a.layout = MAXSIM_LAYOUT_MATRIX;
  return a;
}

// MAXSIM_CALL_* bits of a call's options: known bits only.
Status CheckCallFlags(uint32_t flags, const char* where) {
  if ((flags & ~MAXSIM_CALL_STREAM_ORDERED) != 0) {
    return Error(MAXSIM_ERR_INVALID_ARGUMENT, "%s.flags is 0x%x: the only flag is MAXSIM_CALL_STREAM_ORDERED (0x1)",
                 where, flags);
  }
  return Status::Ok();
}

// MAXSIM_CALL_STREAM_ORDERED takes dense device tensors only (a call on host memory has nothing to defer).
Status CheckStreamOrdered(uint32_t flags, maxsim_memory queries, maxsim_memory documents, bool packed) {
  if ((flags & MAXSIM_CALL_STREAM_ORDERED) == 0) return Status::Ok();
  if (packed || queries == MAXSIM_MEMORY_HOST || documents == MAXSIM_MEMORY_HOST) {
    return Error(MAXSIM_ERR_INVALID_ARGUMENT,
                 "MAXSIM_CALL_STREAM_ORDERED needs dense device tensors (MAXSIM_MEMORY_CUDA) in and out; these %s",
                 packed ? "include a packed collection" : "include host memory");
  }
  return Status::Ok();
}

Status ReadScoreOptions(const maxsim_score_options* o, ScoreRequest* req, maxsim_stats** stats, void** stream,
                        uint32_t* flags) {
  maxsim_score_options def = DefaultScoreOptions();
  if (o) {
    if (o->struct_size < kScoreOptionsFirstLayout) {
      return Error(MAXSIM_ERR_INVALID_ARGUMENT,
                   "maxsim_score_options.struct_size is %u; call maxsim_score_options_init first", o->struct_size);
    }
    // Only the caller's struct_size bytes: a program built against an older maxsim.h passes a shorter struct,
    // whose later fields keep their defaults.
    std::memcpy(&def, o, std::min<size_t>(o->struct_size, sizeof(def)));
  }
  const int32_t metric = RawEnum(def.metric), mode = RawEnum(def.mode);
  if (metric != MAXSIM_METRIC_DOT && metric != MAXSIM_METRIC_COSINE) {
    return Error(MAXSIM_ERR_INVALID_ARGUMENT, "metric %d is not DOT (0) or COSINE (1)", metric);
  }
  if (mode != MAXSIM_MODE_EXACT && mode != MAXSIM_MODE_CERTIFIED && mode != MAXSIM_MODE_APPROXIMATE) {
    return Error(MAXSIM_ERR_INVALID_ARGUMENT, "mode %d is not EXACT (0), CERTIFIED (1) or APPROXIMATE (2)", mode);
  }
  req->metric = def.metric;
  req->mode = def.mode;
  *stats = def.stats;
  *stream = def.cuda_stream;
  *flags = o && o->struct_size < offsetof(maxsim_score_options, flags) + sizeof(uint32_t) ? 0u : def.flags;
  return CheckCallFlags(*flags, "maxsim_score_options");
}

// 2 * dim * (query tokens) * (document tokens) summed over the scored pairs (saturating).
uint64_t MatrixWork(const SetsRef& q, const SetsRef& d) {
  auto tokens = [](const SetsRef& s) {
    return s.is_packed ? s.packed.n_vectors : s.dense.n_rows;
  };
  unsigned __int128 w = static_cast<unsigned __int128>(2) * q.dim() * tokens(q) * tokens(d);
  return w > UINT64_MAX ? UINT64_MAX : static_cast<uint64_t>(w);
}

// What every scoring entry point reads first: the context, the options and both sets.
struct ScoringInputs {
  ScoreRequest req;
  maxsim_stats* stats = nullptr;
  void* stream = nullptr;
  uint32_t flags = 0;
  const char* name = "";
  SetsRef q, d;
  // A plugin call for `op` carrying the request, the statistics, the stream and the flags.
  PluginCall Call(PluginOp op) const {
    PluginCall call;
    call.op = op;
    call.req = req;
    call.stats = stats;
    call.stream = stream;
    call.flags = flags;
    call.name = name;
    return call;
  }
};

Status ReadScoringInputs(const maxsim_context* ctx, const char* name, const maxsim_sets* queries,
                         const maxsim_sets* documents, const maxsim_score_options* options, ScoringInputs* in) {
  MAXSIM_RETURN_IF_ERROR(CheckContext(ctx));
  in->name = name;
  MAXSIM_RETURN_IF_ERROR(ReadScoreOptions(options, &in->req, &in->stats, &in->stream, &in->flags));
  MAXSIM_RETURN_IF_ERROR(ResolveSets(queries, "queries", &in->q));
  MAXSIM_RETURN_IF_ERROR(ResolveSets(documents, "documents", &in->d));
  MAXSIM_RETURN_IF_ERROR(CheckStreamOrdered(in->flags, in->q.memory(), in->d.memory(), in->q.is_packed || in->d.is_packed));
  if (in->req.mode == MAXSIM_MODE_CERTIFIED) {  // every route, CPU and plugins (trust.cc)
    if (in->q.is_packed) MAXSIM_RETURN_IF_ERROR(ProveForCertified(*in->q.handle, ctx->threads, ctx->engine->row_ops(), "queries"));
    if (in->d.is_packed) MAXSIM_RETURN_IF_ERROR(ProveForCertified(*in->d.handle, ctx->threads, ctx->engine->row_ops(), "documents"));
  }
  return Status::Ok();
}

// The CPU engine reports a dimension mismatch itself; a plugin route checks it here first.
Status CheckSameDim(const SetsRef& q, const SetsRef& d) {
  if (q.dim() != d.dim()) {
    return Error(MAXSIM_ERR_DIM_MISMATCH, "queries have dim %u but documents have dim %u", q.dim(), d.dim());
  }
  return Status::Ok();
}

Status ScoreCandidatesImpl(maxsim_context* ctx, const maxsim_sets* queries, const maxsim_sets* documents,
                           const uint64_t* cand_offsets, const uint64_t* candidates,
                           const maxsim_score_options* options, float* scores, int32_t* argmax, bool pairs) {
  ScoringInputs in;
  MAXSIM_RETURN_IF_ERROR(ReadScoringInputs(ctx, pairs ? "maxsim_score_pairs" : "maxsim_score_candidates", queries,
                                           documents, options, &in));
  const SetsRef& q = in.q;
  const SetsRef& d = in.d;
  std::vector<uint64_t> pair_offsets, pair_docs;
  if (pairs) {
    if (q.n_sets() != d.n_sets()) {
      return Error(MAXSIM_ERR_INVALID_ARGUMENT, "pairs need as many query sets (%llu) as document sets (%llu)",
                   static_cast<unsigned long long>(q.n_sets()), static_cast<unsigned long long>(d.n_sets()));
    }
    pair_offsets.resize(q.n_sets() + 1);
    pair_docs.resize(q.n_sets());
    for (uint64_t i = 0; i <= q.n_sets(); ++i) pair_offsets[i] = i;
    for (uint64_t i = 0; i < q.n_sets(); ++i) pair_docs[i] = i;
    cand_offsets = pair_offsets.data();
    candidates = pair_docs.data();
  }
  uint64_t total = 0;
  MAXSIM_RETURN_IF_ERROR(CheckCandidates(cand_offsets, candidates, q.n_sets(), d.n_sets(), &total));
  Route route;
  const uint64_t nd = std::max<uint64_t>(1, d.n_sets());
  const uint64_t work = MatrixWork(q, d) / nd * std::max<uint64_t>(1, total / std::max<uint64_t>(1, q.n_sets()));
  MAXSIM_RETURN_IF_ERROR(ChooseRoute(*ctx, PluginOp::kCandidates, q, d, work, &route));
  if (route == Route::kPlugin) {
    PluginCall call = in.Call(PluginOp::kCandidates);
    call.cand_offsets = cand_offsets;
    call.candidates = candidates;
    call.scores = scores;
    call.argmax = argmax;
    return RunOnPlugin(*ctx, q, d, call);
  }
  return ctx->engine->ScoreCandidates(q, d, cand_offsets, candidates, in.req, scores, argmax, in.stats);
}

Status CheckLevel(const maxsim_validation& level) {
  const int32_t v = RawEnum(level);
  if (v != MAXSIM_VALIDATE_STANDARD && v != MAXSIM_VALIDATE_DEEP && v != MAXSIM_VALIDATE_FAST) {
    return Error(MAXSIM_ERR_INVALID_ARGUMENT, "validation level %d is not STANDARD (0), DEEP (1) or FAST (2)", v);
  }
  return Status::Ok();
}

// maxsim_pack and maxsim_pack_with_string_ids: a library-owned buffer, packed and checked (FAST).
Status PackOwned(maxsim_context* ctx, const maxsim_dense_sets* sets, const uint64_t* ids,
                 const char* const* string_ids, maxsim_packed** out) {
  if (!out) return Error(MAXSIM_ERR_INVALID_ARGUMENT, "out is NULL");
  *out = nullptr;
  DenseView v;
  MAXSIM_RETURN_IF_ERROR(ResolveDense(sets, "sets", &v));
  pack::RowOps ops;
  MAXSIM_RETURN_IF_ERROR(PackingRowOps(ctx, &ops));
  uint64_t size = 0;
  MAXSIM_RETURN_IF_ERROR(pack::PackedSize(v, ids != nullptr, &size, string_ids));
  void* memory = AllocatePacked(size);
  if (!memory) {
    return Error(MAXSIM_ERR_OUT_OF_MEMORY, "cannot allocate %llu bytes for the packed buffer",
                 static_cast<unsigned long long>(size));
  }
  const uint64_t allocated = size;
  Status st = pack::PackInto(v, ids, memory, size, ctx ? ctx->threads : 1, "sets", &size,
                             /*write_before_validation=*/true, string_ids, ops);
  pack::PackedView view;
  if (st.ok()) st = pack::Validate(memory, size, MAXSIM_VALIDATE_FAST, &view, ops);
  if (!st.ok()) {
    FreePacked(memory, allocated);
    return st;
  }
  auto* p = new maxsim_packed;
  p->view = view;
  p->storage = maxsim_packed::Storage::kOwned;
  p->memory = memory;
  p->mapped_bytes = allocated;
  p->uid = NextPackedUid();
  p->trust = maxsim_packed::Trust::kProven;  // this library packed it
  *out = p;
  return Status::Ok();
}

}  // namespace
}  // namespace maxsim

using namespace maxsim;  // NOLINT: this file only implements the C API

extern "C" {

MAXSIM_API const char* maxsim_status_name(maxsim_status status_in) {
  switch (RawEnum(status_in)) {
    case MAXSIM_OK: return "MAXSIM_OK";
    case MAXSIM_ERR_INVALID_ARGUMENT: return "MAXSIM_ERR_INVALID_ARGUMENT";
    case MAXSIM_ERR_INVALID_BUFFER: return "MAXSIM_ERR_INVALID_BUFFER";
    case MAXSIM_ERR_NON_FINITE: return "MAXSIM_ERR_NON_FINITE";
    case MAXSIM_ERR_DIM_MISMATCH: return "MAXSIM_ERR_DIM_MISMATCH";
    case MAXSIM_ERR_IO: return "MAXSIM_ERR_IO";
    case MAXSIM_ERR_OUT_OF_MEMORY: return "MAXSIM_ERR_OUT_OF_MEMORY";
    case MAXSIM_ERR_UNSUPPORTED: return "MAXSIM_ERR_UNSUPPORTED";
    case MAXSIM_ERR_BACKEND_UNAVAILABLE: return "MAXSIM_ERR_BACKEND_UNAVAILABLE";
    case MAXSIM_ERR_BUFFER_TOO_SMALL: return "MAXSIM_ERR_BUFFER_TOO_SMALL";
    case MAXSIM_ERR_PLUGIN: return "MAXSIM_ERR_PLUGIN";
    case MAXSIM_ERR_INTERNAL: return "MAXSIM_ERR_INTERNAL";
    case MAXSIM_ERR_CANCELLED: return "MAXSIM_ERR_CANCELLED";
  }
  return "MAXSIM_ERR_UNKNOWN";
}

MAXSIM_API void maxsim_set_progress(maxsim_progress_fn fn, void* user_data) {
  maxsim::ThreadProgressSink() = maxsim::ProgressSink{fn, user_data};
}

MAXSIM_API uint32_t maxsim_version(void) { return MAXSIM_VERSION_NUMBER; }

MAXSIM_API const char* maxsim_version_string(void) { return MAXSIM_VERSION_STRING; }

MAXSIM_API void maxsim_options_init_sized(maxsim_options* o, size_t size) {
  maxsim::InitSized(o, size, maxsim::kOptionsFirstLayout, maxsim::DefaultOptions());
}

MAXSIM_API void maxsim_options_init(maxsim_options* o) {
  maxsim::InitSized(o, maxsim::kOptionsFirstLayout, maxsim::kOptionsFirstLayout, maxsim::DefaultOptions());
}

MAXSIM_API maxsim_status maxsim_context_create(const maxsim_options* options, maxsim_context** out) {
#if !defined(__cpp_exceptions)
  return CreateContext(options, out);
#else
  try {
    return CreateContext(options, out);
  } catch (const std::bad_alloc&) {
    return Report(Error(MAXSIM_ERR_OUT_OF_MEMORY, "out of host memory creating the context"));
  } catch (...) {
    return Report(Error(MAXSIM_ERR_INTERNAL, "internal error creating the context"));
  }
#endif
}

MAXSIM_API void maxsim_context_destroy(maxsim_context* ctx) { delete ctx; }

MAXSIM_API maxsim_status maxsim_context_report(const maxsim_context* ctx, char* text, size_t capacity,
                                               size_t* needed) {
  return Guard([&]() -> Status {
    MAXSIM_RETURN_IF_ERROR(CheckContext(ctx));
    const std::string r = ContextReport(*ctx);
    if (needed) *needed = r.size() + 1;
    if (text == nullptr || capacity < r.size() + 1) {
      if (text && capacity > 0) {
        std::memcpy(text, r.data(), capacity - 1);
        text[capacity - 1] = '\0';
      }
      return Error(MAXSIM_ERR_BUFFER_TOO_SMALL, "report needs %zu bytes, capacity is %zu", r.size() + 1, capacity);
    }
    std::memcpy(text, r.c_str(), r.size() + 1);
    return Status::Ok();
  });
}

MAXSIM_API const char* maxsim_context_kernel(const maxsim_context* ctx) { return ctx ? ctx->kernel->name : ""; }

MAXSIM_API const char* maxsim_context_backend(const maxsim_context* ctx) {
  if (!ctx) return "";
  return ctx->accel ? ctx->accel->name.c_str() : "cpu";
}

MAXSIM_API int32_t maxsim_context_num_threads(const maxsim_context* ctx) { return ctx ? ctx->threads : 0; }

MAXSIM_API size_t maxsim_kernel_count(void) {
  size_t n = 0;
  KernelList(&n);
  return n;
}

MAXSIM_API const char* maxsim_kernel_name(size_t i) {
  size_t n = 0;
  const KernelInfo* list = KernelList(&n);
  return i < n ? list[i].name : nullptr;
}

MAXSIM_API int maxsim_kernel_available(size_t i, const char** reason) {
  size_t n = 0;
  const KernelInfo* list = KernelList(&n);
  if (i >= n) {
    if (reason) *reason = "no such kernel index";
    return 0;
  }
  static thread_local std::string why;
  why.clear();
  const bool ok = KernelAvailable(list[i], &why);
  if (reason) *reason = ok ? "" : why.c_str();
  return ok ? 1 : 0;
}

// ---- packing -----------------------------------------------------------------------------------------------

MAXSIM_API maxsim_status maxsim_pack_size(const maxsim_dense_sets* sets, int with_ids, uint64_t* size) {
  return Guard([&]() -> Status {
    if (!size) return Error(MAXSIM_ERR_INVALID_ARGUMENT, "size output is NULL");
    DenseView v;
    MAXSIM_RETURN_IF_ERROR(ResolveDense(sets, "sets", &v));
    return pack::PackedSize(v, with_ids != 0, size);
  });
}

MAXSIM_API maxsim_status maxsim_pack_into(maxsim_context* ctx, const maxsim_dense_sets* sets, const uint64_t* ids,
                                          void* out, uint64_t capacity, uint64_t* written) {
  return Guard([&]() -> Status {
    DenseView v;
    MAXSIM_RETURN_IF_ERROR(ResolveDense(sets, "sets", &v));
    pack::RowOps ops;
    MAXSIM_RETURN_IF_ERROR(PackingRowOps(ctx, &ops));
    return pack::PackInto(v, ids, out, capacity, ctx ? ctx->threads : 1, "sets", written, false, nullptr, ops);
  });
}


MAXSIM_API maxsim_status maxsim_pack(maxsim_context* ctx, const maxsim_dense_sets* sets, const uint64_t* ids,
                                     maxsim_packed** out) {
  return Guard([&]() -> Status { return PackOwned(ctx, sets, ids, nullptr, out); });
}

MAXSIM_API maxsim_status maxsim_pack_with_string_ids(maxsim_context* ctx, const maxsim_dense_sets* sets,
                                                     const uint64_t* ids, const char* const* string_ids,
                                                     maxsim_packed** out) {
  return Guard([&]() -> Status {
    if (!string_ids) {
      if (out) *out = nullptr;
      return Error(MAXSIM_ERR_INVALID_ARGUMENT, "string_ids is NULL (use maxsim_pack for sets without string ids)");
    }
    return PackOwned(ctx, sets, ids, string_ids, out);
  });
}

MAXSIM_API maxsim_status maxsim_validate(const void* buffer, uint64_t size, maxsim_validation level) {
  return Guard([&]() -> Status {
    MAXSIM_RETURN_IF_ERROR(CheckLevel(level));
    pack::RowOps ops;
    MAXSIM_RETURN_IF_ERROR(PackingRowOps(nullptr, &ops));
    return pack::Validate(buffer, size, level, nullptr, ops);
  });
}

MAXSIM_API maxsim_status maxsim_packed_open(const void* buffer, uint64_t size, maxsim_validation level,
                                            maxsim_packed** out) {
  return Guard([&]() -> Status {
    if (!out) return Error(MAXSIM_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = nullptr;
    MAXSIM_RETURN_IF_ERROR(CheckLevel(level));
    pack::RowOps ops;
    MAXSIM_RETURN_IF_ERROR(PackingRowOps(nullptr, &ops));
    pack::PackedView view;
    MAXSIM_RETURN_IF_ERROR(pack::Validate(buffer, size, level, &view, ops));
    auto* p = new maxsim_packed;
    p->view = view;
    p->uid = NextPackedUid();
    p->trust = TrustAfter(level);
    *out = p;
    return Status::Ok();
  });
}

MAXSIM_API maxsim_status maxsim_packed_load(const char* path, maxsim_validation level, maxsim_packed** out) {
  return Guard([&]() -> Status {
    if (!out) return Error(MAXSIM_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = nullptr;
    MAXSIM_RETURN_IF_ERROR(CheckLevel(level));
    pack::RowOps ops;
    MAXSIM_RETURN_IF_ERROR(PackingRowOps(nullptr, &ops));
    return LoadPackedFile(path, level, ops, out);
  });
}

MAXSIM_API maxsim_status maxsim_packed_save(const maxsim_packed* packed, const char* path) {
  return Guard([&]() -> Status {
    if (!packed) return Error(MAXSIM_ERR_INVALID_ARGUMENT, "packed is NULL");
    return SavePackedFile(packed->view, path);
  });
}

MAXSIM_API void maxsim_packed_release(maxsim_packed* packed) {
  if (!packed) return;
  ForgetPacked(packed);
  ReleasePackedStorage(packed);
  delete packed;
}

MAXSIM_API maxsim_status maxsim_packed_describe(const maxsim_packed* packed, maxsim_packed_desc* desc) {
  return Guard([&]() -> Status {
    if (!packed || !desc) return Error(MAXSIM_ERR_INVALID_ARGUMENT, "packed or desc is NULL");
    const pack::PackedView& v = packed->view;
    desc->n_sets = v.n_sets;
    desc->n_vectors = v.n_vectors;
    desc->dim = v.dim;
    desc->dtype = v.dtype;
    desc->has_ids = v.ids != nullptr;
    desc->size = v.size;
    desc->data = v.base;
    desc->offsets = v.offsets;
    desc->ids = v.ids;
    return Status::Ok();
  });
}

MAXSIM_API maxsim_status maxsim_packed_string_id(const maxsim_packed* packed, uint64_t i, const char** id,
                                                 size_t* length) {
  return Guard([&]() -> Status {
    if (!packed || !id) return Error(MAXSIM_ERR_INVALID_ARGUMENT, "packed or id is NULL");
    const pack::PackedView& v = packed->view;
    if (i >= v.n_sets) {
      return Error(MAXSIM_ERR_INVALID_ARGUMENT, "set %llu is out of range (the collection has %llu sets)",
                   static_cast<unsigned long long>(i), static_cast<unsigned long long>(v.n_sets));
    }
    *id = nullptr;
    if (length) *length = 0;
    if (v.string_ids == nullptr) return Status::Ok();
    const uint64_t at = v.string_id_offsets[i];
    *id = v.string_ids + at;
    if (length) *length = static_cast<size_t>(v.string_id_offsets[i + 1] - at - 1);
    return Status::Ok();
  });
}

// ---- scoring -----------------------------------------------------------------------------------------------

MAXSIM_API void maxsim_score_options_init_sized(maxsim_score_options* o, size_t size) {
  maxsim::InitSized(o, size, maxsim::kScoreOptionsFirstLayout, maxsim::DefaultScoreOptions());
}

MAXSIM_API void maxsim_score_options_init(maxsim_score_options* o) {
  maxsim::InitSized(o, maxsim::kScoreOptionsFirstLayout, maxsim::kScoreOptionsFirstLayout,
                    maxsim::DefaultScoreOptions());
}

MAXSIM_API maxsim_status maxsim_score_matrix(maxsim_context* ctx, const maxsim_sets* queries,
                                             const maxsim_sets* documents, const maxsim_score_options* options,
                                             float* scores, int32_t* argmax) {
  return Guard([&]() -> Status {
    ScoringInputs in;
    MAXSIM_RETURN_IF_ERROR(ReadScoringInputs(ctx, "maxsim_score_matrix", queries, documents, options, &in));
    Route route;
    MAXSIM_RETURN_IF_ERROR(ChooseRoute(*ctx, PluginOp::kMatrix, in.q, in.d, MatrixWork(in.q, in.d), &route));
    if (route == Route::kPlugin) {
      MAXSIM_RETURN_IF_ERROR(CheckSameDim(in.q, in.d));
      PluginCall call = in.Call(PluginOp::kMatrix);
      call.scores = scores;
      call.argmax = argmax;
      return RunOnPlugin(*ctx, in.q, in.d, call);
    }
    return ctx->engine->ScoreMatrix(in.q, in.d, in.req, scores, argmax, in.stats);
  });
}

MAXSIM_API maxsim_status maxsim_score_pairs(maxsim_context* ctx, const maxsim_sets* queries,
                                            const maxsim_sets* documents, const maxsim_score_options* options,
                                            float* scores, int32_t* argmax) {
  return Guard([&]() -> Status {
    return ScoreCandidatesImpl(ctx, queries, documents, nullptr, nullptr, options, scores, argmax, true);
  });
}

MAXSIM_API maxsim_status maxsim_score_candidates(maxsim_context* ctx, const maxsim_sets* queries,
                                                 const maxsim_sets* documents, const uint64_t* cand_offsets,
                                                 const uint64_t* candidates, const maxsim_score_options* options,
                                                 float* scores, int32_t* argmax) {
  return Guard([&]() -> Status {
    return ScoreCandidatesImpl(ctx, queries, documents, cand_offsets, candidates, options, scores, argmax, false);
  });
}

MAXSIM_API maxsim_status maxsim_topk(maxsim_context* ctx, const maxsim_sets* queries, const maxsim_sets* documents,
                                     uint64_t k, const maxsim_score_options* options, float* scores,
                                     uint64_t* doc_index, uint64_t* ids) {
  return Guard([&]() -> Status {
    ScoringInputs in;
    MAXSIM_RETURN_IF_ERROR(ReadScoringInputs(ctx, "maxsim_topk", queries, documents, options, &in));
    const SetsRef& d = in.d;
    // The outputs are [Nq, k]: a k for which no memory could hold them is a mistake (k = -1 cast to uint64_t,
    // say), refused before anything is written.
    uint64_t cells = 0;
    if (MulOverflows(in.q.n_sets(), k, &cells) || cells > static_cast<uint64_t>(PTRDIFF_MAX) / sizeof(uint64_t)) {
      return Error(MAXSIM_ERR_INVALID_ARGUMENT, "k = %llu: %llu queries x k outputs cannot fit in memory",
                   static_cast<unsigned long long>(k), static_cast<unsigned long long>(in.q.n_sets()));
    }
    Route route;
    MAXSIM_RETURN_IF_ERROR(ChooseRoute(*ctx, PluginOp::kTopK, in.q, d, MatrixWork(in.q, d), &route));
    if (route == Route::kPlugin) {
      if (k == 0) return Error(MAXSIM_ERR_INVALID_ARGUMENT, "k is 0 (ask for at least one document)");
      if (!scores || !doc_index) return Error(MAXSIM_ERR_INVALID_ARGUMENT, "top-k outputs must not be NULL");
      if (ids && !(d.is_packed && d.packed.ids)) {
        return Error(MAXSIM_ERR_INVALID_ARGUMENT,
                     "ids were requested but the documents carry none (pack them with ids, or pass ids = NULL)");
      }
      MAXSIM_RETURN_IF_ERROR(CheckSameDim(in.q, d));
      PluginCall call = in.Call(PluginOp::kTopK);
      call.k = k;
      call.scores = scores;
      call.topk_index = doc_index;
      call.ids = ids;
      return RunOnPlugin(*ctx, in.q, d, call);
    }
    return ctx->engine->TopK(in.q, d, k, in.req, scores, doc_index, ids, in.stats);
  });
}

MAXSIM_API void maxsim_backward_args_init_sized(maxsim_backward_args* a, size_t size) {
  maxsim::InitSized(a, size, maxsim::kBackwardArgsFirstLayout, maxsim::DefaultBackwardArgs());
}

MAXSIM_API void maxsim_backward_args_init(maxsim_backward_args* a) {
  maxsim::InitSized(a, maxsim::kBackwardArgsFirstLayout, maxsim::kBackwardArgsFirstLayout,
                    maxsim::DefaultBackwardArgs());
}

MAXSIM_API maxsim_status maxsim_backward(maxsim_context* ctx, const maxsim_dense_sets* queries,
                                         const maxsim_dense_sets* documents, const maxsim_backward_args* args) {
  return Guard([&]() -> Status {
    MAXSIM_RETURN_IF_ERROR(CheckContext(ctx));
    if (!args) return Error(MAXSIM_ERR_INVALID_ARGUMENT, "backward args are NULL");
    if (args->struct_size < maxsim::kBackwardArgsFirstLayout) {
      return Error(MAXSIM_ERR_INVALID_ARGUMENT,
                   "maxsim_backward_args.struct_size is %u; call maxsim_backward_args_init first", args->struct_size);
    }
    const int32_t layout = RawEnum(args->layout);
    if (layout != MAXSIM_LAYOUT_MATRIX && layout != MAXSIM_LAYOUT_PAIRS && layout != MAXSIM_LAYOUT_CANDIDATES) {
      return Error(MAXSIM_ERR_INVALID_ARGUMENT, "layout %d is not MATRIX (0), PAIRS (1) or CANDIDATES (2)", layout);
    }
    const uint32_t flags =
        args->struct_size < offsetof(maxsim_backward_args, flags) + sizeof(uint32_t) ? 0u : args->flags;
    MAXSIM_RETURN_IF_ERROR(CheckCallFlags(flags, "maxsim_backward_args"));
    DenseView q, d;
    MAXSIM_RETURN_IF_ERROR(ResolveDense(queries, "queries", &q));
    MAXSIM_RETURN_IF_ERROR(ResolveDense(documents, "documents", &d));
    MAXSIM_RETURN_IF_ERROR(CheckStreamOrdered(flags, q.memory, d.memory, false));
    // Host tensors always take the CPU backward (the reference); device tensors need the plugin.
    if (q.memory != MAXSIM_MEMORY_HOST || d.memory != MAXSIM_MEMORY_HOST) {
      if (q.memory != d.memory) {
        return Error(MAXSIM_ERR_INVALID_ARGUMENT, "queries and documents must be in the same memory kind");
      }
      if (!ctx->accel) {
        return Error(MAXSIM_ERR_BACKEND_UNAVAILABLE,
                     "inputs are in device memory but no accelerator backend is active (%s)", ctx->backend_note.c_str());
      }
      return BackwardOnPlugin(*ctx, queries, documents, *args, flags);
    }
    return ctx->engine->Backward(q, d, *args);
  });
}

MAXSIM_API maxsim_status maxsim_synchronize(maxsim_context* ctx) {
  return Guard([&]() -> Status {
    MAXSIM_RETURN_IF_ERROR(CheckContext(ctx));
    return SynchronizeBackends(*ctx);
  });
}

}  // extern "C"
