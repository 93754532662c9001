// SPDX-License-Identifier: Apache-2.0
// The CUDA plugin's device and lifetime code: status helpers, device and pinned buffers, device discovery
// (Probe), backend creation and destruction, and the kernel-mode choice. Corpora are in corpus.cc, the kernel
// plan in plan.cc, inference in operations.cc, training in training.cc. Every CUDA call is checked; failures
// come back as a Status.
#include <algorithm>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

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

// The context's device list (maxsim_options.devices, ABI 1.2), or NULL when it names none.
const char* OptionDevices(const maxsim_plugin_host* host) {
  if (host == nullptr || host->struct_size < offsetof(maxsim_plugin_host, devices) + sizeof(host->devices)) {
    return nullptr;
  }
  return host->devices && host->devices[0] ? host->devices : nullptr;
}

// The devices of one context: the context's maxsim_options.devices, else MAXSIM_CUDA_DEVICES ("0,1"; a device
// may be listed more than once, which gives it several backends, each with its own stream), else the one device
// MAXSIM_CUDA_DEVICE (default 0). Empty (and `why` set) when the list is not of that form. *source (optional)
// says where the list came from.
std::vector<int> DeviceList(const maxsim_plugin_host* host, std::string* why, std::string* source = nullptr) {
  std::vector<int> list;
  const char* option = OptionDevices(host);
  const char* e = option ? option : std::getenv("MAXSIM_CUDA_DEVICES");
  const std::string name = option ? "maxsim_options.devices" : "MAXSIM_CUDA_DEVICES";
  if (e == nullptr || e[0] == '\0') {
    list.push_back(static_cast<int>(EnvU64("MAXSIM_CUDA_DEVICE", 0)));
    if (source) {
      const char* d = std::getenv("MAXSIM_CUDA_DEVICE");
      *source = d && d[0] ? std::string("set by MAXSIM_CUDA_DEVICE=") + d : "default";
    }
    return list;
  }
  if (source) *source = "set by " + name + "=" + e;
  const char* p = e;
  while (*p) {
    char* end = nullptr;
    const long v = std::strtol(p, &end, 10);
    if (end == p || v < 0 || v > 1023 || (*end != ',' && *end != '\0') || list.size() >= 64) {
      *why = name + "='" + e + "' is not a comma-separated list of at most 64 device ordinals";
      return {};
    }
    list.push_back(static_cast<int>(v));
    p = *end == ',' ? end + 1 : end;
  }
  if (list.empty()) *why = name + " is empty";
  return list;
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
  dev_ = nullptr;
  size_ = 0;
}
Status PinnedBuffer::Reserve(uint64_t bytes, const char* what) {
  if (bytes <= size_) return Status::Ok();
  Release();
  void* p = nullptr;
  cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Fail(MAXSIM_ERR_OUT_OF_MEMORY, "cannot allocate %llu bytes of pinned host memory for %s: %s",
                static_cast<ull>(bytes), what, cudaGetErrorString(e));
  }
  void* d = nullptr;
  e = cudaHostGetDevicePointer(&d, p, 0);
  if (e != cudaSuccess) {
    cudaFreeHost(p);
    return CudaFail(e, "mapping pinned host memory into the device's address space");
  }
  ptr_ = static_cast<uint8_t*>(p);
  dev_ = static_cast<uint8_t*>(d);
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

Status EndStaging(Backend& b, uint64_t stage_used, cudaStream_t stream) {
  if (stage_used == 0) return Status::Ok();
  MSC_CUDA(cudaEventRecord(b.staged, stream));
  b.staged_pending = true;
  return Status::Ok();
}

Status StagesFree(Backend& b) {
  if (b.qstage_busy) {
    MSC_CUDA(cudaStreamSynchronize(b.stream));
    b.qstage_busy = false;
  }
  if (b.staged_pending) {
    MSC_CUDA(cudaEventSynchronize(b.staged));
    b.staged_pending = false;
  }
  return Status::Ok();
}

void SettleFailedCall(Backend& b, bool training, cudaStream_t caller_stream) {
  const bool streams_done = cudaSetDevice(b.device) == cudaSuccess && cudaStreamSynchronize(b.stream) == cudaSuccess &&
                            cudaStreamSynchronize(b.copy) == cudaSuccess &&
                            (!training || cudaStreamSynchronize(caller_stream) == cudaSuccess);
  // The staged uploads may be a stream-ordered call's on a stream none of these is ordered after (an operation
  // whose start reported an earlier call's deferred error enqueued no wait for the calls after that one).
  const bool staged_done = !b.staged_pending || cudaEventSynchronize(b.staged) == cudaSuccess;
  cudaGetLastError();  // a non-sticky error of the wait must not reach the next call
  if (streams_done) b.qstage_busy = false;
  if (streams_done && staged_done) b.staged_pending = false;
}

// ---- device discovery -------------------------------------------------------------------------------------

namespace {

bool EnvIs(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

// A switch such as MAXSIM_CUDA_NO_PIPE: set, non-empty and not "0".
bool EnvFlag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

// MAXSIM_CUDA_CERTIFIED: "screen" or "exact" force a route (Backend::ScreenRoute); anything else is kAuto.
Backend::ScreenRoute ScreenRouteFromEnv() {
  const char* v = std::getenv("MAXSIM_CUDA_CERTIFIED");
  const std::string route = v ? v : "";
  if (route == "screen") return Backend::ScreenRoute::kScreen;
  if (route == "exact") return Backend::ScreenRoute::kExact;
  return Backend::ScreenRoute::kAuto;
}

}  // namespace

bool MatrixColumnsHidden() { return EnvIs("MAXSIM_CUDA_MATRIX_COLUMNS", "0"); }

Tuning ReadTuning() {
  Tuning t;
  t.kernels.pipe = !EnvFlag("MAXSIM_CUDA_NO_PIPE");
  t.kernels.screen_pipe = !EnvFlag("MAXSIM_CUDA_NO_SCREEN_PIPE");
  t.kernels.wgmma = !EnvIs("MAXSIM_CUDA_WGMMA", "0");
  t.kernels.batch = !EnvFlag("MAXSIM_CUDA_NO_BATCH");
  t.kernels.screen_wgmma = !EnvIs("MAXSIM_CUDA_SCREEN_WGMMA", "0");
  t.kernels.screen_wgmma_cap =
      static_cast<uint32_t>(std::min<uint64_t>(64, std::max<uint64_t>(1, EnvU64("MAXSIM_CUDA_SCREEN_WGMMA_CAP", 12))));
  t.doc_backward = !EnvFlag("MAXSIM_CUDA_NO_DOC_BACKWARD");
  t.kernels.batch_ahead = static_cast<uint32_t>(std::min<uint64_t>(3, EnvU64("MAXSIM_CUDA_BATCH_AHEAD", 0)));
  const uint64_t rows = EnvU64("MAXSIM_CUDA_BATCH_ROWS", 0);
  t.kernels.batch_rows = rows == 128 || rows == 256 ? static_cast<uint32_t>(rows) : 0;
  t.kernels.batch_spread = static_cast<uint32_t>(std::min<uint64_t>(2, EnvU64("MAXSIM_CUDA_BATCH_SPREAD", 0)));
  t.kernels.batch_tma = !EnvIs("MAXSIM_CUDA_BATCH_TMA", "0");
  t.kernels.wgmma_int_fold = !EnvIs("MAXSIM_CUDA_WGMMA_INT_FOLD", "0");
  t.kernels.wgmma_tma = !EnvIs("MAXSIM_CUDA_WGMMA_TMA", "0");
  t.kernels.coop = !EnvFlag("MAXSIM_CUDA_NO_COOP");
  t.kernels.dealt = !EnvFlag("MAXSIM_CUDA_NO_DEALT");
  t.smem_kernel = !EnvFlag("MAXSIM_CUDA_NO_SMEM_KERNEL");
  t.screen_wgmma_min_lq = EnvU64("MAXSIM_CUDA_SCREEN_WGMMA_MIN_LQ", 256);
  if (const char* e = std::getenv("MAXSIM_CUDA_EXPERIMENTAL")) {
    std::string list = e;
    size_t start = 0;
    while (start <= list.size()) {
      size_t end = list.find(',', start);
      if (end == std::string::npos) end = list.size();
      const std::string name = list.substr(start, end - start);
      if (name == "screen-wgmma") {
        t.experimental_screen_wgmma = true;
      } else if (name == "coop-always") {
        t.kernels.coop_always = true;
      } else if (name == "dealt-always") {
        t.kernels.dealt_always = true;
      } else if (!name.empty()) {
        t.unknown_experimental += (t.unknown_experimental.empty() ? "" : ",") + name;
      }
      start = end + 1;
    }
  }
  return t;
}

Status Probe(const maxsim_plugin_host* host, std::string* info) {
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
  std::string why, source;
  const std::vector<int> devices = DeviceList(host, &why, &source);
  if (devices.empty()) {
    *info = why;
    return Fail(MAXSIM_ERR_BACKEND_UNAVAILABLE, "%s", info->c_str());
  }
  for (int d : devices) {
    if (d >= n) {
      *info = "device " + std::to_string(d) + " was asked for (" + source + ") but there are only " +
              std::to_string(n) + " devices";
      return Fail(MAXSIM_ERR_BACKEND_UNAVAILABLE, "%s", info->c_str());
    }
  }
  const int dev = devices[0];
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
  if (devices.size() > 1) *info += "; corpora sharded over " + std::to_string(devices.size()) + " devices (" + source + ")";
  if (p.major < 8) {
    *info += ": needs compute capability 8.0 or newer (the plugin is built for sm_80 and sm_90a, plus compute_90 PTX)";
    return Fail(MAXSIM_ERR_BACKEND_UNAVAILABLE, "%s", info->c_str());
  }
  *info += WgmmaAvailable(dev) ? "; long queries: wgmma kernel (sm_90a)" : "; long queries: mma.sync kernel";
  if (WgmmaAvailable(dev)) {
    const Tuning t = ReadTuning();
    *info += t.kernels.wgmma && t.kernels.batch ? "; query batches: wgmma batch kernel (sm_90a)"
                                                : "; query batches: per-pair kernels";
  }
  // How certified and approximate requests are served (the route CreateBackend will take).
  switch (ScreenRouteFromEnv()) {
    case Backend::ScreenRoute::kScreen:
      *info += "; certified and approximate: int8 screening (forced, set by MAXSIM_CUDA_CERTIFIED=screen)";
      break;
    case Backend::ScreenRoute::kExact:
      *info += "; certified and approximate: exact kernel (forced, set by MAXSIM_CUDA_CERTIFIED=exact)";
      break;
    case Backend::ScreenRoute::kAuto: {
      if (ReadTuning().experimental_screen_wgmma && WgmmaAvailable(dev)) {
        *info += "; certified: int8 wgmma screening for long queries (experimental, set by MAXSIM_CUDA_EXPERIMENTAL="
                 "screen-wgmma: dot, scores only, resident corpora), else exact kernel";
      } else {
        *info += "; certified: exact kernel (same bits, faster here)";
      }
      *info += "; approximate: int8 screening for queries of <= 32 tokens over many documents, else exact";
      break;
    }
  }
  return Status::Ok();
}

namespace {

// One line per setting CreateBackend read, with where it came from.
std::string SettingsText(const Backend& b) {
  auto source = [](const char* name) {
    const char* v = std::getenv(name);
    return v && v[0] ? std::string(" (set by ") + name + "=" + v + ")" : std::string(" (default)");
  };
  char line[256];
  std::string t;
  std::string why, devices_source;
  DeviceList(b.host, &why, &devices_source);
  // Built as a string: the device name (up to 255 bytes) and the source would not fit a fixed line.
  t += "device " + std::to_string(b.device) + ": " + b.prop.name + ", " + std::to_string(b.prop.multiProcessorCount) +
       " SMs (" + devices_source + ")\n";
  std::snprintf(line, sizeof(line), "auto routing threshold: %llu operations%s\n", static_cast<ull>(b.min_ops),
                source("MAXSIM_CUDA_MIN_AUTO_OPS").c_str());
  t += line;
  if (b.resident_limit) {
    std::snprintf(line, sizeof(line), "resident corpora up to %llu bytes%s\n", static_cast<ull>(b.resident_limit),
                  source("MAXSIM_CUDA_RESIDENT_LIMIT").c_str());
  } else {
    std::snprintf(line, sizeof(line), "resident corpora up to 80%% of free device memory%s\n",
                  source("MAXSIM_CUDA_RESIDENT_LIMIT").c_str());
  }
  t += line;
  std::snprintf(line, sizeof(line), "streamed corpora: %s%s, chunks of %llu bytes%s\n",
                b.force_stream ? "always" : "above the resident limit", source("MAXSIM_CUDA_STREAM").c_str(),
                static_cast<ull>(b.chunk_bytes), source("MAXSIM_CUDA_STREAM_CHUNK_BYTES").c_str());
  t += line;
  std::snprintf(line, sizeof(line), "results written into mapped host memory: up to %llu bytes per chunk%s\n",
                static_cast<ull>(b.mapped_results_max), source("MAXSIM_CUDA_MAPPED_RESULTS").c_str());
  t += line;
  const char* route = b.screen_route == Backend::ScreenRoute::kScreen  ? "int8 screening (both modes)"
                      : b.screen_route == Backend::ScreenRoute::kExact ? "exact kernel (both modes)"
                                                                        : "auto";
  std::snprintf(line, sizeof(line), "certified/approximate route: %s%s\n", route, source("MAXSIM_CUDA_CERTIFIED").c_str());
  t += line;
  const Tuning& k = b.tuning;
  auto onoff = [](bool on) { return on ? "on" : "off"; };
  std::snprintf(line, sizeof(line), "exact ring kernel: %s%s\n", onoff(k.kernels.pipe), source("MAXSIM_CUDA_NO_PIPE").c_str());
  t += line;
  // Built as strings, not in line[]: the variables' values are the user's, of any length.
  const std::string rule = "at dim 128, from " + std::to_string(kCoopMinPairsPerSm) +
                           " pairs per SM, or documents scored once each (not candidate lists) of " +
                           std::to_string(kCoopLongDocRows) + "+ tokens, or " + std::to_string(kCoopMinEvenRows) +
                           "+ whose 32-token steps split evenly over the grid's 4 warps";
  t += std::string("exact one-block-per-pair grid (the ring's dot calls without a document mask, ") +
       (k.kernels.coop && k.kernels.coop_always ? "every one: MAXSIM_CUDA_EXPERIMENTAL=coop-always" : rule) +
       "): " + onoff(k.kernels.coop) + source("MAXSIM_CUDA_NO_COOP") +
       (k.kernels.coop_always && !k.kernels.coop ? "; coop-always ignored: MAXSIM_CUDA_NO_COOP wins" : "") + "\n";
  const int granted = CoopBlocksPerSmGranted(), designed = CoopBlocksPerSmDesigned();
  std::snprintf(line, sizeof(line), "  the grid's blocks resident per SM: %d granted by the driver, %d designed%s\n",
                granted, designed,
                granted == designed ? "" : granted < 0 ? " (the occupancy query failed)" : " (the grid runs slower)");
  t += line;
  t += std::string("exact dealt kernel (one-query dot calls without a document mask, ") +
       (k.kernels.dealt && k.kernels.dealt_always
            ? "every one the grid does not take, up to 32 documents per SM: MAXSIM_CUDA_EXPERIMENTAL=dealt-always"
            : "fewer documents than half the ring's warps, or up to 32 per SM of 224+ tokens on average") +
       "): " + onoff(k.kernels.dealt && k.kernels.pipe) + source("MAXSIM_CUDA_NO_DEALT") +
       (k.kernels.pipe ? "" : "; off with the ring (MAXSIM_CUDA_NO_PIPE)") + "\n";
  std::snprintf(line, sizeof(line), "exact shared-memory kernel (long queries): %s%s\n", onoff(k.smem_kernel),
                source("MAXSIM_CUDA_NO_SMEM_KERNEL").c_str());
  t += line;
  std::snprintf(line, sizeof(line), "exact wgmma kernel (long queries, sm_90a): %s%s\n", onoff(k.kernels.wgmma),
                source("MAXSIM_CUDA_WGMMA").c_str());
  t += line;
  std::snprintf(line, sizeof(line), "exact wgmma batch kernel (several queries of <= 128 tokens, sm_90a): %s%s\n",
                onoff(k.kernels.batch && k.kernels.wgmma), source("MAXSIM_CUDA_NO_BATCH").c_str());
  t += line;
  const std::string ahead = k.kernels.batch_ahead ? std::to_string(k.kernels.batch_ahead)
                                                  : "3 for documents over " + std::to_string(kBatchAheadLongDoc) +
                                                        " tokens, else 2";
  std::snprintf(line, sizeof(line),
                "wgmma batch kernel: stages copied ahead: %s%s, row groups %s%s, row groups per block: up to %u%s\n",
                ahead.c_str(), source("MAXSIM_CUDA_BATCH_AHEAD").c_str(),
                k.kernels.batch_rows == 128 ? "128" : k.kernels.batch_rows == 256 ? "256" : "auto",
                source("MAXSIM_CUDA_BATCH_ROWS").c_str(), k.kernels.batch_spread ? k.kernels.batch_spread : 2,
                source("MAXSIM_CUDA_BATCH_SPREAD").c_str());
  t += line;
  std::snprintf(line, sizeof(line), "wgmma batch kernel copies: %s%s\n",
                k.kernels.batch_tma ? "bulk tensor copies (TMA)" : "cp.async by every thread",
                source("MAXSIM_CUDA_BATCH_TMA").c_str());
  t += line;
  std::snprintf(line, sizeof(line), "wgmma long-query kernel: row maxima by 3-input integer maxima: %s%s\n",
                onoff(k.kernels.wgmma_int_fold), source("MAXSIM_CUDA_WGMMA_INT_FOLD").c_str());
  t += line;
  std::snprintf(line, sizeof(line), "wgmma long-query kernel copies: %s%s\n",
                k.kernels.wgmma_tma ? "bulk tensor copies (TMA)" : "cp.async by every thread",
                source("MAXSIM_CUDA_WGMMA_TMA").c_str());
  t += line;
  std::snprintf(line, sizeof(line), "screening ring kernel: %s%s\n", onoff(k.kernels.screen_pipe),
                source("MAXSIM_CUDA_NO_SCREEN_PIPE").c_str());
  t += line;
  std::snprintf(line, sizeof(line), "wgmma screening (long queries, where screening runs): %s%s, from %llu tokens%s, "
                "%u candidate records per row%s\n", onoff(k.kernels.screen_wgmma), source("MAXSIM_CUDA_SCREEN_WGMMA").c_str(),
                static_cast<ull>(k.screen_wgmma_min_lq), source("MAXSIM_CUDA_SCREEN_WGMMA_MIN_LQ").c_str(),
                k.kernels.screen_wgmma_cap, source("MAXSIM_CUDA_SCREEN_WGMMA_CAP").c_str());
  t += line;
  std::snprintf(line, sizeof(line), "deterministic training backward (matrix, pairs): %s%s\n",
                k.doc_backward ? "one launch" : "sorted index", source("MAXSIM_CUDA_NO_DOC_BACKWARD").c_str());
  t += line;
  std::snprintf(line, sizeof(line), "sharded score matrices: %s%s\n",
                MatrixColumnsHidden() ? "staged by the host, then placed"
                                      : "written into the caller's columns by each device",
                source("MAXSIM_CUDA_MATRIX_COLUMNS").c_str());
  t += line;
  std::string experimental =
      k.experimental_screen_wgmma ? "screen-wgmma (wgmma screening on the default certified route)" : "";
  if (k.kernels.coop_always) {
    experimental += std::string(experimental.empty() ? "" : ", ") +
                    "coop-always (the one-block-per-pair grid on every call it can run" +
                    (k.kernels.coop ? ")" : "; off: MAXSIM_CUDA_NO_COOP wins)");
  }
  if (k.kernels.dealt_always) {
    experimental += std::string(experimental.empty() ? "" : ", ") +
                    "dealt-always (the dealt kernel on every one-query dot call the grid does not take, up to 32 "
                    "documents per SM" +
                    (k.kernels.dealt ? ")" : "; off: MAXSIM_CUDA_NO_DEALT wins)");
  }
  t += "experimental: " + (experimental.empty() ? std::string("none") : experimental) +
       source("MAXSIM_CUDA_EXPERIMENTAL") +
       (k.unknown_experimental.empty() ? "" : "; unknown, ignored: " + k.unknown_experimental) + "\n";
  return t;
}

}  // namespace

Status DeviceAlloc(Backend& b, uint64_t bytes, void** out) {
  MSC_CUDA(cudaSetDevice(b.device));
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
  if (e != cudaSuccess) return CudaFail(e, "cudaMalloc (mem_alloc)");
  *out = p;
  return Status::Ok();
}

void DeviceFree(Backend& b, void* p) {
  if (!p) return;
  cudaSetDevice(b.device);
  cudaFree(p);
}

Status DeviceCopy(Backend& b, void* dst, const void* src, uint64_t bytes, bool to_device) {
  if (bytes == 0) return Status::Ok();
  MSC_CUDA(cudaSetDevice(b.device));
  MSC_CUDA(cudaMemcpy(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost));
  return Status::Ok();
}

uint32_t DeviceCount(const maxsim_plugin_host* host) {
  std::string why;
  return static_cast<uint32_t>(std::max<size_t>(1, DeviceList(host, &why).size()));
}

Status CreateBackend(const maxsim_plugin_host* host, Backend** out, uint32_t index) {
  std::string info;
  MSC_RETURN(Probe(host, &info));
  std::string why;
  const std::vector<int> devices = DeviceList(host, &why);
  if (index >= devices.size()) {
    return Fail(MAXSIM_ERR_INVALID_ARGUMENT, "device slot %u of %zu", index, devices.size());
  }
  auto* b = new Backend;
  b->host = host;
  b->device = devices[index];
  auto fail = [&](Status s) {
    DestroyBackend(b);
    return s;
  };
  cudaError_t e = cudaSetDevice(b->device);
  if (e == cudaSuccess) e = cudaGetDeviceProperties(&b->prop, b->device);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&b->copy, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&b->staged, cudaEventDisableTiming);
  for (int i = 0; i < 2 && e == cudaSuccess; ++i) {
    e = cudaEventCreateWithFlags(&b->copied[i], cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&b->done[i], cudaEventDisableTiming);
  }
  if (e != cudaSuccess) return fail(CudaFail(e, "creating the CUDA streams and events"));
  b->min_ops = EnvU64("MAXSIM_CUDA_MIN_AUTO_OPS", 200000000ull);
  b->resident_limit = EnvU64("MAXSIM_CUDA_RESIDENT_LIMIT", 0);
  b->force_stream = EnvU64("MAXSIM_CUDA_STREAM", 0) != 0;
  b->chunk_bytes = std::max<uint64_t>(4096, EnvU64("MAXSIM_CUDA_STREAM_CHUNK_BYTES", 256ull << 20));
  b->mapped_results_max = EnvU64("MAXSIM_CUDA_MAPPED_RESULTS", 256ull << 10);
  b->screen_route = ScreenRouteFromEnv();
  b->tuning = ReadTuning();
  b->settings = SettingsText(*b);
  if (!b->tuning.unknown_experimental.empty()) {
    b->Log(MAXSIM_LOG_WARNING, "cuda: MAXSIM_CUDA_EXPERIMENTAL names unknown options (ignored): " +
                                   b->tuning.unknown_experimental);
  }
  Status s = b->flags_host.Reserve(64, "status flags");
  if (!s.ok()) return fail(s);
  *out = b;
  return Status::Ok();
}

void DestroyBackend(Backend* b) {
  if (!b) return;
  ReleaseDeferred(*b);
  if (b->stream) cudaStreamSynchronize(b->stream);
  if (b->copy) cudaStreamSynchronize(b->copy);
  b->scratch.Release();
  b->qbuf.Release();
  b->chunk[0].Release();
  b->chunk[1].Release();
  b->stage.Release();
  b->qstage.Release();
  b->flags_host.Release();
  b->backward_flags.Release();
  if (b->staged) cudaEventDestroy(b->staged);
  for (int i = 0; i < 2; ++i) {
    if (b->copied[i]) cudaEventDestroy(b->copied[i]);
    if (b->done[i]) cudaEventDestroy(b->done[i]);
  }
  if (b->stream) cudaStreamDestroy(b->stream);
  if (b->copy) cudaStreamDestroy(b->copy);
  delete b;
}

uint32_t DenseQueryModes(const Backend& b) {
  // Exact always runs the exact kernel. Certified does (KernelMode, UseScreenWgmma) unless screening is forced
  // (MAXSIM_CUDA_CERTIFIED=screen) or the experimental wgmma screening may take it; approximate only when
  // MAXSIM_CUDA_CERTIFIED=exact (else short queries over many documents screen with int8 codes).
  uint32_t modes = 1u << MAXSIM_MODE_EXACT;
  const bool certified_exact = b.screen_route == Backend::ScreenRoute::kExact ||
                               (b.screen_route == Backend::ScreenRoute::kAuto && !b.tuning.experimental_screen_wgmma);
  if (certified_exact) modes |= 1u << MAXSIM_MODE_CERTIFIED;
  if (b.screen_route == Backend::ScreenRoute::kExact) modes |= 1u << MAXSIM_MODE_APPROXIMATE;
  return modes;
}

int Backend::KernelMode(int mode, const SetsView& q, uint64_t max_lq, uint64_t n_pairs) const {
  if (mode == MAXSIM_MODE_EXACT || screen_route == ScreenRoute::kScreen) return mode;
  if (screen_route == ScreenRoute::kExact || mode == MAXSIM_MODE_CERTIFIED) return MAXSIM_MODE_EXACT;
  const uint64_t rows = ScreenGroupRows(max_lq);
  const uint64_t groups = std::max<uint64_t>(1, (max_lq + rows - 1) / rows);
  const int sms = std::max(1, prop.multiProcessorCount);
  return ScreenPipeApplies(tuning.kernels, static_cast<uint32_t>(std::min<uint64_t>(groups, 0xffffffffull)),
                           q.code_bytes, n_pairs, sms, static_cast<int>(prop.sharedMemPerBlockOptin))
             ? mode
             : static_cast<int>(MAXSIM_MODE_EXACT);
}

}  // namespace mscuda
