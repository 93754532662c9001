// SPDX-License-Identifier: Apache-2.0
// The CUDA plugin's one exported symbol: maxsim_plugin_entry() returns the ABI table (maxsim/plugin.h).
// Everything else in the shared library is hidden (-fvisibility=hidden plus a linker version script, which
// also hides the statically linked CUDA runtime). No function here throws, prints or aborts: C++ exceptions
// (std::bad_alloc from host vectors) become status codes with messages.
#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include <cuda.h>

#include "backend.h"
#include "maxsim/plugin.h"

namespace {

using mscuda::Backend;
using mscuda::Status;

void CopyMessage(const std::string& m, char* out, size_t cap) {
  if (!out || cap == 0) return;
  const size_t n = m.size() < cap - 1 ? m.size() : cap - 1;
  std::memcpy(out, m.data(), n);
  out[n] = '\0';
}

// The calling thread's current CUDA context (the driver's, which the caller's CUDA runtime follows), restored
// when an entry point returns: the plugin selects each backend's device for its own work, and a caller's next CUDA
// call (a cudaMalloc, say) must not land on another device because a context with several devices ran a call. A
// thread that had no current context is left with none (restoring a device number instead would create that
// device's primary context in a thread that never used CUDA). The driver's functions come through the runtime's
// entry-point query (DriverEntry), so the plugin does not link libcuda itself.
class CallerContext {
 public:
  CallerContext() {
    const Api& api = Get();
    ok_ = api.get && api.set && api.get(&ctx_) == CUDA_SUCCESS;
  }
  ~CallerContext() {
    const Api& api = Get();
    CUcontext now = nullptr;
    if (ok_ && api.get(&now) == CUDA_SUCCESS && now != ctx_) api.set(ctx_);
  }
  CallerContext(const CallerContext&) = delete;
  CallerContext& operator=(const CallerContext&) = delete;

 private:
  struct Api {
    CUresult (*get)(CUcontext*) = nullptr;
    CUresult (*set)(CUcontext) = nullptr;
  };
  static const Api& Get() {
    static const Api api = [] {
      Api a;
      a.get = reinterpret_cast<CUresult (*)(CUcontext*)>(mscuda::DriverEntry("cuCtxGetCurrent"));
      a.set = reinterpret_cast<CUresult (*)(CUcontext)>(mscuda::DriverEntry("cuCtxSetCurrent"));
      return a;
    }();
    return api;
  }
  CUcontext ctx_ = nullptr;
  bool ok_ = false;
};

template <typename F>
maxsim_status Guard(char* err, size_t err_cap, F&& body) {
  const CallerContext caller;
  try {
    const Status s = body();
    if (!s.ok()) CopyMessage(s.message, err, err_cap);
    return s.code;
  } catch (const std::bad_alloc&) {
    CopyMessage("out of host memory in the CUDA plugin", err, err_cap);
    return MAXSIM_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    CopyMessage(std::string("internal error in the CUDA plugin: ") + e.what(), err, err_cap);
    return MAXSIM_ERR_INTERNAL;
  } catch (...) {
    CopyMessage("internal error in the CUDA plugin", err, err_cap);
    return MAXSIM_ERR_INTERNAL;
  }
}

Backend* B(maxsim_plugin_backend* b) { return reinterpret_cast<Backend*>(b); }

// Whether a training call's arguments carry its stream (a struct too short to is refused by CheckTrainArgs).
bool HasStream(const maxsim_plugin_train_args* a) {
  return a != nullptr && a->struct_size >= offsetof(maxsim_plugin_train_args, stream) + sizeof(a->stream);
}

// An operation (scoring or training) on backend b: Guard, and on failure SettleFailedCall, so that a call that
// failed after enqueueing work leaves none running when it returns (training: on its stream too).
// Every operation starts with BeginOperation on the stream it uses (the caller's for training, else the
// backend's): an earlier stream-ordered call's failure is reported, and the stream is ordered after that call.
// A synchronous operation that succeeded has waited for its stream, so nothing stream-ordered is left to order
// after.
template <typename F>
maxsim_status GuardOperation(maxsim_plugin_backend* b, bool training, void* stream, char* err, size_t err_cap,
                             F&& body, bool stream_ordered = false) {
  const CallerContext caller;
  const maxsim_status code = Guard(err, err_cap, [&]() -> Status {
    if (!b) return mscuda::Fail(MAXSIM_ERR_INVALID_ARGUMENT, "backend is NULL");
    Status s = mscuda::BeginOperation(*B(b), training ? static_cast<cudaStream_t>(stream) : B(b)->stream);
    if (!s.ok()) return s;
    return body();
  });
  if (code != MAXSIM_OK && b) mscuda::SettleFailedCall(*B(b), training, static_cast<cudaStream_t>(stream));
  if (code == MAXSIM_OK && !stream_ordered && B(b)->sync_calls) B(b)->deferred.last_ordered = false;
  return code;
}

maxsim_status Probe(const maxsim_plugin_host* host, char* info, size_t info_cap) {
  const CallerContext caller;
  try {
    std::string text;
    const Status s = mscuda::Probe(host, &text);
    CopyMessage(text, info, info_cap);
    return s.ok() ? MAXSIM_OK : MAXSIM_ERR_BACKEND_UNAVAILABLE;
  } catch (...) {
    CopyMessage("probe failed (out of host memory)", info, info_cap);
    return MAXSIM_ERR_BACKEND_UNAVAILABLE;
  }
}

maxsim_status CreateDevice(const maxsim_plugin_host* host, uint32_t index, maxsim_plugin_backend** out, char* err,
                           size_t err_cap) {
  return Guard(err, err_cap, [&]() -> Status {
    if (!out) return mscuda::Fail(MAXSIM_ERR_INVALID_ARGUMENT, "create: out is NULL");
    Backend* b = nullptr;
    Status s = mscuda::CreateBackend(host, &b, index);
    if (s.ok()) *out = reinterpret_cast<maxsim_plugin_backend*>(b);
    return s;
  });
}

maxsim_status Create(const maxsim_plugin_host* host, maxsim_plugin_backend** out, char* err, size_t err_cap) {
  return CreateDevice(host, 0, out, err, err_cap);
}

uint32_t DeviceCount(const maxsim_plugin_host* host) {
  try {
    return mscuda::DeviceCount(host);
  } catch (...) {
    return 1;
  }
}

void Destroy(maxsim_plugin_backend* b) {
  const CallerContext caller;
  mscuda::DestroyBackend(B(b));
}

uint64_t MinAutoOps(maxsim_plugin_backend* b) { return b ? B(b)->min_ops : UINT64_MAX; }
uint32_t DenseQueryModes(maxsim_plugin_backend* b) { return b ? mscuda::DenseQueryModes(*B(b)) : 0u; }

maxsim_status CorpusUploadView(maxsim_plugin_backend* b, const maxsim_packed_view* view, maxsim_plugin_corpus** out,
                               char* err, size_t err_cap) {
  return Guard(err, err_cap, [&]() -> Status {
    if (!b || !view || !out) return mscuda::Fail(MAXSIM_ERR_INVALID_ARGUMENT, "corpus_upload_view: NULL argument");
    mscuda::Corpus* c = nullptr;
    Status s = mscuda::UploadCorpus(*B(b), *view, &c);
    if (s.ok()) *out = reinterpret_cast<maxsim_plugin_corpus*>(c);
    return s;
  });
}

void CorpusFree(maxsim_plugin_backend* b, maxsim_plugin_corpus* c) {
  const CallerContext caller;
  if (b) mscuda::FreeCorpus(*B(b), reinterpret_cast<mscuda::Corpus*>(c));
}

Status CheckScoreArgs(maxsim_plugin_backend* b, const maxsim_plugin_score_args* a) {
  if (!b || !a || !a->corpus) return mscuda::Fail(MAXSIM_ERR_INVALID_ARGUMENT, "NULL argument");
  const bool dense = a->struct_size >= offsetof(maxsim_plugin_score_args, query_dense) + sizeof(void*) &&
                     a->query_dense != nullptr;
  if (!dense && (a->struct_size < offsetof(maxsim_plugin_score_args, query_view) + sizeof(void*) ||
                 a->query_view == nullptr)) {
    return mscuda::Fail(MAXSIM_ERR_INVALID_ARGUMENT, "the queries arrive without a packed view (a libmaxsim host of "
                        "plugin ABI 1.1 or newer passes one)");
  }
  if (dense && (mscuda::DenseQueryModes(*B(b)) & (1u << static_cast<unsigned>(a->mode))) == 0) {
    return mscuda::Fail(MAXSIM_ERR_INVALID_ARGUMENT, "dense host queries in mode %d, which this backend scores "
                        "from packed queries only (dense_query_modes)", static_cast<int>(a->mode));
  }
  if (a->struct_size < offsetof(maxsim_plugin_score_args, stats) + sizeof(void*)) {
    return mscuda::Fail(MAXSIM_ERR_INVALID_ARGUMENT, "maxsim_plugin_score_args.struct_size %u is too small",
                        a->struct_size);
  }
  if (a->metric != MAXSIM_METRIC_DOT && a->metric != MAXSIM_METRIC_COSINE) {
    return mscuda::Fail(MAXSIM_ERR_INVALID_ARGUMENT, "unknown metric %d", static_cast<int>(a->metric));
  }
  if (a->mode != MAXSIM_MODE_EXACT && a->mode != MAXSIM_MODE_CERTIFIED && a->mode != MAXSIM_MODE_APPROXIMATE) {
    return mscuda::Fail(MAXSIM_ERR_INVALID_ARGUMENT, "unknown mode %d", static_cast<int>(a->mode));
  }
  return Status::Ok();
}

maxsim_status ScoreMatrix(maxsim_plugin_backend* b, const maxsim_plugin_score_args* a, char* err, size_t err_cap) {
  return GuardOperation(b, false, nullptr, err, err_cap, [&]() -> Status {
    Status s = CheckScoreArgs(b, a);
    if (!s.ok()) return s;
    if (!a->scores) return mscuda::Fail(MAXSIM_ERR_INVALID_ARGUMENT, "scores output is NULL");
    return mscuda::ScoreMatrix(*B(b), *a);
  });
}

maxsim_status ScoreCandidates(maxsim_plugin_backend* b, const maxsim_plugin_score_args* a, char* err,
                              size_t err_cap) {
  return GuardOperation(b, false, nullptr, err, err_cap, [&]() -> Status {
    Status s = CheckScoreArgs(b, a);
    if (!s.ok()) return s;
    if (!a->cand_offsets) return mscuda::Fail(MAXSIM_ERR_INVALID_ARGUMENT, "cand_offsets is NULL");
    return mscuda::ScoreCandidates(*B(b), *a);
  });
}

maxsim_status TopK(maxsim_plugin_backend* b, const maxsim_plugin_score_args* a, char* err, size_t err_cap) {
  return GuardOperation(b, false, nullptr, err, err_cap, [&]() -> Status {
    Status s = CheckScoreArgs(b, a);
    if (!s.ok()) return s;
    if (!a->scores || !a->topk_index) return mscuda::Fail(MAXSIM_ERR_INVALID_ARGUMENT, "top-k outputs are NULL");
    return mscuda::TopK(*B(b), *a);
  });
}

// documents_device_memory: as CheckCallerTensors sets it.
Status CheckTrainArgs(maxsim_plugin_backend* b, const maxsim_plugin_train_args* a, int* documents_device_memory = nullptr) {
  if (!b || !a || !a->queries || !a->documents) return mscuda::Fail(MAXSIM_ERR_INVALID_ARGUMENT, "NULL argument");
  if (a->struct_size < offsetof(maxsim_plugin_train_args, peak_extra_bytes) + sizeof(void*)) {
    return mscuda::Fail(MAXSIM_ERR_INVALID_ARGUMENT, "maxsim_plugin_train_args.struct_size %u is too small",
                        a->struct_size);
  }
  if (a->layout == MAXSIM_LAYOUT_CANDIDATES && !a->cand_offsets) {
    return mscuda::Fail(MAXSIM_ERR_INVALID_ARGUMENT, "CANDIDATES layout needs cand_offsets");
  }
  // Device tensors must be memory the backend's device can use: a kernel touching another device's memory, or
  // memory CUDA does not know, would fault and leave the device unusable for the rest of the process.
  return mscuda::CheckCallerTensors(*B(b), *a, documents_device_memory);
}

maxsim_status TrainForward(maxsim_plugin_backend* b, const maxsim_plugin_train_args* a, char* err, size_t err_cap) {
  return GuardOperation(b, HasStream(a), HasStream(a) ? a->stream : nullptr, err, err_cap, [&]() -> Status {
    int documents_device_memory = -1;
    Status s = CheckTrainArgs(b, a, &documents_device_memory);
    if (!s.ok()) return s;
    return mscuda::TrainForward(*B(b), *a, documents_device_memory);
  }, a != nullptr && mscuda::StreamOrdered(*a));
}

maxsim_status TrainBackward(maxsim_plugin_backend* b, const maxsim_plugin_train_args* a, char* err,
                            size_t err_cap) {
  return GuardOperation(b, HasStream(a), HasStream(a) ? a->stream : nullptr, err, err_cap, [&]() -> Status {
    Status s = CheckTrainArgs(b, a);
    if (!s.ok()) return s;
    if (a->metric != MAXSIM_METRIC_DOT) {
      return mscuda::Fail(MAXSIM_ERR_UNSUPPORTED, "the training backward supports the dot metric only");
    }
    return mscuda::TrainBackward(*B(b), *a);
  }, a != nullptr && mscuda::StreamOrdered(*a));
}

maxsim_status Synchronize(maxsim_plugin_backend* b, char* err, size_t err_cap) {
  const CallerContext caller;
  return Guard(err, err_cap, [&]() -> Status {
    if (!b) return mscuda::Fail(MAXSIM_ERR_INVALID_ARGUMENT, "backend is NULL");
    return mscuda::SynchronizeDeferred(*B(b));
  });
}

maxsim_status MemAlloc(maxsim_plugin_backend* b, uint64_t bytes, void** out, char* err, size_t err_cap) {
  return Guard(err, err_cap, [&]() -> Status {
    if (!b || !out) return mscuda::Fail(MAXSIM_ERR_INVALID_ARGUMENT, "mem_alloc: NULL argument");
    return mscuda::DeviceAlloc(*B(b), bytes, out);
  });
}

void MemFree(maxsim_plugin_backend* b, void* p) {
  const CallerContext caller;
  if (b) mscuda::DeviceFree(*B(b), p);
}

maxsim_status MemCopy(maxsim_plugin_backend* b, void* dst, const void* src, uint64_t bytes,
                      maxsim_plugin_copy_kind kind, char* err, size_t err_cap) {
  return Guard(err, err_cap, [&]() -> Status {
    if (!b || (bytes && (!dst || !src))) return mscuda::Fail(MAXSIM_ERR_INVALID_ARGUMENT, "mem_copy: NULL argument");
    if (kind != MAXSIM_COPY_HOST_TO_DEVICE && kind != MAXSIM_COPY_DEVICE_TO_HOST) {
      return mscuda::Fail(MAXSIM_ERR_INVALID_ARGUMENT, "mem_copy: unknown direction %d", static_cast<int>(kind));
    }
    return mscuda::DeviceCopy(*B(b), dst, src, bytes, kind == MAXSIM_COPY_HOST_TO_DEVICE);
  });
}

void Describe(maxsim_plugin_backend* b, char* out, size_t cap) {
  if (!b) return;
  try {
    CopyMessage(B(b)->settings, out, cap);
  } catch (...) {
    CopyMessage("", out, cap);
  }
}

const maxsim_plugin_api kApi = {
    MAXSIM_PLUGIN_ABI_MAJOR,
    MAXSIM_PLUGIN_ABI_MINOR,
    static_cast<uint32_t>(sizeof(maxsim_plugin_api)),
    "cuda",
    "CUDA (sm_80, sm_90 + PTX; static cudart): tensor-core exact, int8 certified, training fwd/bwd",
    &Probe,
    &Create,
    &Destroy,
    &MinAutoOps,
    nullptr,  // corpus_upload (ABI 1.0): corpus_upload_view replaces it
    &CorpusFree,
    &ScoreMatrix,
    &ScoreCandidates,
    &TopK,
    &TrainForward,
    &TrainBackward,
    MAXSIM_MEMORY_BIT(MAXSIM_MEMORY_CUDA),
    &CorpusUploadView,
    &MemAlloc,
    &MemFree,
    &MemCopy,
    &Describe,
    &DeviceCount,
    &CreateDevice,
    &DenseQueryModes,
    MAXSIM_PLUGIN_OUTPUT_MATRIX_COLUMNS,
    &Synchronize,
};

}  // namespace

// MAXSIM_CUDA_MATRIX_COLUMNS=0 (read when the host loads the plugin, i.e. at each context's creation) hides the
// column-range layout from the host, which then stages each shard's score matrix and places its columns itself:
// the path of plugins older than ABI 1.3, kept reachable so that benchmarks can measure one against the other.
extern "C" __attribute__((visibility("default"))) const maxsim_plugin_api* maxsim_plugin_entry(void) {
  static const maxsim_plugin_api kStaged = [] {
    maxsim_plugin_api a = kApi;
    a.output_layouts = 0;
    return a;
  }();
  return mscuda::MatrixColumnsHidden() ? &kStaged : &kApi;
}
