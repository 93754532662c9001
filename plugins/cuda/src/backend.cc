// SPDX-License-Identifier: Apache-2.0
// The CUDA plugin's device and lifetime code: status helpers, device and pinned buffers, device discovery
// (Probe), backend creation and destruction, and the kernel-mode choice. Corpora are in corpus.cc, the kernel
// plan in plan.cc, inference in operations.cc, training in training.cc. Every CUDA call is checked; failures
// come back as a Status.
#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend.h"
#include "host_util.h"

namespace mscuda {

Status Fail(maxsim_status code, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  Status s;
  s.code = code;
  s.message = buf;
  return s;
}

Status CudaFail(cudaError_t e, const char* what) {
  cudaGetLastError();
  return Fail(e == cudaErrorMemoryAllocation ? MAXSIM_ERR_OUT_OF_MEMORY : MAXSIM_ERR_PLUGIN, "%s failed: %s (%s)",
              what, cudaGetErrorName(e), cudaGetErrorString(e));
}

namespace {

uint64_t EnvU64(const char* name, uint64_t fallback) {
  const char* e = std::getenv(name);
  if (!e || !e[0]) return fallback;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(e, &end, 10);
  return end && *end == '\0' ? v : fallback;
}

}  // namespace

// ---- buffers ------------------------------------------------------------------------------------------------

DeviceBuffer::~DeviceBuffer() { Release(); }
void DeviceBuffer::Release() {
  if (ptr_) cudaFree(ptr_);
  ptr_ = nullptr;
  size_ = 0;
}
Status DeviceBuffer::Reserve(uint64_t bytes, const char* what) {
  if (bytes <= size_) return Status::Ok();
  Release();
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Fail(e == cudaErrorMemoryAllocation ? MAXSIM_ERR_OUT_OF_MEMORY : MAXSIM_ERR_PLUGIN,
                "cannot allocate %llu bytes of device memory for %s: %s", static_cast<ull>(bytes), what,
                cudaGetErrorString(e));
  }
  ptr_ = static_cast<uint8_t*>(p);
  size_ = bytes;
  return Status::Ok();
}

PinnedBuffer::~PinnedBuffer() { Release(); }
void PinnedBuffer::Release() {
  if (ptr_) cudaFreeHost(ptr_);
  ptr_ = nullptr;
  size_ = 0;
}
Status PinnedBuffer::Reserve(uint64_t bytes, const char* what) {
  if (bytes <= size_) return Status::Ok();
  Release();
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Fail(MAXSIM_ERR_OUT_OF_MEMORY, "cannot allocate %llu bytes of pinned host memory for %s: %s",
                static_cast<ull>(bytes), what, cudaGetErrorString(e));
  }
  ptr_ = static_cast<uint8_t*>(p);
  size_ = bytes;
  return Status::Ok();
}

void Backend::Log(maxsim_log_level level, const std::string& m) const {
  if (host && host->log) host->log(host->host_data, level, m.c_str());
}

Status StageUpload(Backend& b, uint64_t& stage_used, void* dst, const void* src, uint64_t bytes,
                   cudaStream_t stream) {
  if (bytes == 0) return Status::Ok();
  uint8_t* s = b.stage.data() + stage_used;
  std::memcpy(s, src, bytes);
  stage_used += RoundUp(bytes, kAlign);
  MSC_CUDA(cudaMemcpyAsync(dst, s, bytes, cudaMemcpyHostToDevice, stream));
  return Status::Ok();
}

// ---- device discovery -------------------------------------------------------------------------------------

namespace {

// MAXSIM_CUDA_CERTIFIED: "screen" or "exact" force a route (Backend::ScreenRoute); anything else is kAuto.
Backend::ScreenRoute ScreenRouteFromEnv() {
  const char* v = std::getenv("MAXSIM_CUDA_CERTIFIED");
  const std::string route = v ? v : "";
  if (route == "screen") return Backend::ScreenRoute::kScreen;
  if (route == "exact") return Backend::ScreenRoute::kExact;
  return Backend::ScreenRoute::kAuto;
}

}  // namespace

Status Probe(std::string* info) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    char buf[300];
    std::snprintf(buf, sizeof(buf), "%s (cudaGetDeviceCount returned %d: %s)",
                  e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice ? "no usable CUDA driver or device"
                                                                             : "CUDA is not usable",
                  static_cast<int>(e), cudaGetErrorString(e));
    *info = buf;
    return Fail(MAXSIM_ERR_BACKEND_UNAVAILABLE, "%s", buf);
  }
  if (n == 0) {
    *info = "no CUDA device (cudaGetDeviceCount returned 0)";
    return Fail(MAXSIM_ERR_BACKEND_UNAVAILABLE, "%s", info->c_str());
  }
  const int dev = static_cast<int>(EnvU64("MAXSIM_CUDA_DEVICE", 0));
  if (dev >= n) {
    *info = "MAXSIM_CUDA_DEVICE=" + std::to_string(dev) + " but there are only " + std::to_string(n) + " devices";
    return Fail(MAXSIM_ERR_BACKEND_UNAVAILABLE, "%s", info->c_str());
  }
  cudaDeviceProp p{};
  MSC_CUDA(cudaGetDeviceProperties(&p, dev));
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  char buf[400];
  std::snprintf(buf, sizeof(buf), "%s (device %d of %d, compute capability %d.%d, %d SMs, %.1f GiB, driver %d.%d, "
                "runtime %d.%d)", p.name, dev, n, p.major, p.minor, p.multiProcessorCount,
                static_cast<double>(p.totalGlobalMem) / (1ull << 30), driver / 1000, (driver % 1000) / 10,
                runtime / 1000, (runtime % 1000) / 10);
  *info = buf;
  if (p.major < 8) {
    *info += ": needs compute capability 8.0 or newer (the plugin is built for sm_80 and sm_90a, plus compute_90 PTX)";
    return Fail(MAXSIM_ERR_BACKEND_UNAVAILABLE, "%s", info->c_str());
  }
  *info += WgmmaAvailable(dev) ? "; long queries: wgmma kernel (sm_90a)" : "; long queries: mma.sync kernel";
  // How certified and approximate requests are served (the route CreateBackend will take).
  switch (ScreenRouteFromEnv()) {
    case Backend::ScreenRoute::kScreen:
      *info += "; certified and approximate: int8 screening (forced, set by MAXSIM_CUDA_CERTIFIED=screen)";
      break;
    case Backend::ScreenRoute::kExact:
      *info += "; certified and approximate: exact kernel (forced, set by MAXSIM_CUDA_CERTIFIED=exact)";
      break;
    case Backend::ScreenRoute::kAuto: {
      const char* wg = std::getenv("MAXSIM_CUDA_SCREEN_WGMMA");
      if (wg != nullptr && std::strcmp(wg, "1") == 0 && WgmmaAvailable(dev)) {
        *info += "; certified: int8 wgmma screening for long queries (set by MAXSIM_CUDA_SCREEN_WGMMA=1: dot, scores "
                 "only, resident corpora), else exact kernel";
      } else {
        *info += "; certified: exact kernel (same bits, faster here)";
      }
      *info += "; approximate: int8 screening for queries of <= 32 tokens over many documents, else exact";
      break;
    }
  }
  return Status::Ok();
}

Status CreateBackend(const maxsim_plugin_host* host, Backend** out) {
  std::string info;
  MSC_RETURN(Probe(&info));
  auto* b = new Backend;
  b->host = host;
  b->device = static_cast<int>(EnvU64("MAXSIM_CUDA_DEVICE", 0));
  auto fail = [&](Status s) {
    DestroyBackend(b);
    return s;
  };
  cudaError_t e = cudaSetDevice(b->device);
  if (e == cudaSuccess) e = cudaGetDeviceProperties(&b->prop, b->device);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&b->copy, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&b->staged, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&b->qstaged, cudaEventDisableTiming);
  for (int i = 0; i < 2 && e == cudaSuccess; ++i) {
    e = cudaEventCreateWithFlags(&b->copied[i], cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&b->done[i], cudaEventDisableTiming);
  }
  if (e != cudaSuccess) return fail(CudaFail(e, "creating the CUDA streams and events"));
  b->min_ops = EnvU64("MAXSIM_CUDA_MIN_AUTO_OPS", 200000000ull);
  b->resident_limit = EnvU64("MAXSIM_CUDA_RESIDENT_LIMIT", 0);
  b->force_stream = EnvU64("MAXSIM_CUDA_STREAM", 0) != 0;
  b->chunk_bytes = std::max<uint64_t>(4096, EnvU64("MAXSIM_CUDA_STREAM_CHUNK_BYTES", 256ull << 20));
  b->screen_route = ScreenRouteFromEnv();
  Status s = b->flags_host.Reserve(64, "status flags");
  if (!s.ok()) return fail(s);
  *out = b;
  return Status::Ok();
}

void DestroyBackend(Backend* b) {
  if (!b) return;
  if (b->stream) cudaStreamSynchronize(b->stream);
  if (b->copy) cudaStreamSynchronize(b->copy);
  b->scratch.Release();
  b->qbuf.Release();
  b->chunk[0].Release();
  b->chunk[1].Release();
  b->stage.Release();
  b->qstage.Release();
  b->flags_host.Release();
  if (b->staged) cudaEventDestroy(b->staged);
  if (b->qstaged) cudaEventDestroy(b->qstaged);
  for (int i = 0; i < 2; ++i) {
    if (b->copied[i]) cudaEventDestroy(b->copied[i]);
    if (b->done[i]) cudaEventDestroy(b->done[i]);
  }
  if (b->stream) cudaStreamDestroy(b->stream);
  if (b->copy) cudaStreamDestroy(b->copy);
  delete b;
}

int Backend::KernelMode(int mode, const SetsView& q, uint64_t max_lq, uint64_t n_pairs) const {
  if (mode == MAXSIM_MODE_EXACT || screen_route == ScreenRoute::kScreen) return mode;
  if (screen_route == ScreenRoute::kExact || mode == MAXSIM_MODE_CERTIFIED) return MAXSIM_MODE_EXACT;
  const uint64_t rows = ScreenGroupRows(max_lq);
  const uint64_t groups = std::max<uint64_t>(1, (max_lq + rows - 1) / rows);
  const int sms = std::max(1, prop.multiProcessorCount);
  return ScreenPipeApplies(static_cast<uint32_t>(std::min<uint64_t>(groups, 0xffffffffull)), q.code_bytes, n_pairs, sms)
             ? mode
             : static_cast<int>(MAXSIM_MODE_EXACT);
}

}  // namespace mscuda
