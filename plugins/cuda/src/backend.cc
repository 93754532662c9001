// SPDX-License-Identifier: Apache-2.0
// Host side of the CUDA plugin: device discovery, device-resident and streamed corpora, the choice of kernel
// for each call, chunking (bounded scratch whatever the corpus size), and the training calls. Every CUDA call
// is checked; failures come back as a Status (out of memory -> MAXSIM_ERR_OUT_OF_MEMORY, everything else
// MAXSIM_ERR_PLUGIN with the CUDA error's name and the call that failed).
#include "backend.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>

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

namespace {

using ull = unsigned long long;

Status CudaFail(cudaError_t e, const char* what) {
  cudaGetLastError();  // clear a non-sticky error so that later calls can proceed
  return Fail(e == cudaErrorMemoryAllocation ? MAXSIM_ERR_OUT_OF_MEMORY : MAXSIM_ERR_PLUGIN, "%s failed: %s (%s)",
              what, cudaGetErrorName(e), cudaGetErrorString(e));
}

#define MSC_CUDA(call)                                   \
  do {                                                   \
    const cudaError_t e_ = (call);                       \
    if (e_ != cudaSuccess) return CudaFail(e_, #call);   \
  } while (0)
#define MSC_RETURN(expr)              \
  do {                                \
    Status s_ = (expr);               \
    if (!s_.ok()) return s_;          \
  } while (0)

constexpr uint64_t kAlign = 256;
inline uint64_t RoundUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// Carves one scratch allocation into 256-byte aligned pieces.
class Carver {
 public:
  uint64_t Add(uint64_t bytes) {
    const uint64_t o = size_;
    size_ += RoundUp(bytes == 0 ? 1 : bytes, kAlign);
    return o;
  }
  uint64_t size() const { return size_; }

 private:
  uint64_t size_ = 0;
};

uint64_t EnvU64(const char* name, uint64_t fallback) {
  const char* e = std::getenv(name);
  if (!e || !e[0]) return fallback;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(e, &end, 10);
  return end && *end == '\0' ? v : fallback;
}

constexpr uint64_t kOutputBudget = 256ull << 20;  // device bytes for one chunk's outputs + partials

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

// ---- packed buffers -----------------------------------------------------------------------------------------

Status ParsePacked(const void* buffer, uint64_t size, const char* role, PackedInfo* info) {
  if (buffer == nullptr || size < MAXSIM_PACK_HEADER_SIZE) {
    return Fail(MAXSIM_ERR_INVALID_BUFFER, "%s: packed buffer is missing or shorter than its header", role);
  }
  maxsim_pack_header h;
  std::memcpy(&h, buffer, sizeof(h));
  if (std::memcmp(h.magic, MAXSIM_PACK_MAGIC, 8) != 0 || h.version_major != MAXSIM_PACK_VERSION_MAJOR ||
      h.layout != MAXSIM_PACK_LAYOUT_CANONICAL || h.total_size > size || h.dim == 0 ||
      h.orig_dtype < MAXSIM_PACK_F32 || h.orig_dtype > MAXSIM_PACK_BF16 || h.padded_dim % 64 != 0 ||
      h.orig_row_bytes % 64 != 0 || h.meta_record_bytes != sizeof(maxsim_vector_meta)) {
    return Fail(MAXSIM_ERR_INVALID_BUFFER, "%s: not a canonical libmaxsim packed buffer (the host validates "
                "buffers before handing them to plugins: this is a bug)", role);
  }
  for (int r = 0; r < MAXSIM_REGION_COUNT; ++r) {
    if (h.regions[r].offset % 64 != 0 || h.regions[r].offset > size || h.regions[r].size > size - h.regions[r].offset) {
      return Fail(MAXSIM_ERR_INVALID_BUFFER, "%s: region %d lies outside the buffer", role, r);
    }
  }
  PackedInfo in;
  in.dim = h.dim;
  in.padded_dim = h.padded_dim;
  in.orig_row_bytes = h.orig_row_bytes;
  in.dtype = h.orig_dtype;
  in.n_vectors = h.n_vectors;
  in.n_sets = h.n_sets;
  in.total_size = h.total_size;
  in.off_codes = h.regions[MAXSIM_REGION_CODES].offset;
  in.off_meta = h.regions[MAXSIM_REGION_META].offset;
  in.off_orig = h.regions[MAXSIM_REGION_ORIGINALS].offset;
  in.off_offsets = h.regions[MAXSIM_REGION_OFFSETS].offset;
  if (h.regions[MAXSIM_REGION_OFFSETS].size < (in.n_sets + 1) * 8) {
    return Fail(MAXSIM_ERR_INVALID_BUFFER, "%s: offsets region too small", role);
  }
  in.host_offsets = reinterpret_cast<const uint64_t*>(static_cast<const uint8_t*>(buffer) + in.off_offsets);
  if (in.n_sets > 0xffffffffull) {
    return Fail(MAXSIM_ERR_UNSUPPORTED, "%s: %llu sets; the CUDA backend handles at most 2^32 - 1 per buffer",
                role, static_cast<ull>(in.n_sets));
  }
  *info = in;
  return Status::Ok();
}

namespace {

SetsView PackedView(const PackedInfo& in, const uint8_t* base) {
  SetsView v;
  v.orig = base + in.off_orig;
  v.row_bytes = in.orig_row_bytes;
  v.dtype = in.dtype;
  v.dim = in.dim;
  v.codes = reinterpret_cast<const int8_t*>(base + in.off_codes);
  v.code_bytes = in.padded_dim;
  v.meta = reinterpret_cast<const maxsim_vector_meta*>(base + in.off_meta);
  v.offsets = reinterpret_cast<const uint64_t*>(base + in.off_offsets);
  v.n_sets = in.n_sets;
  return v;
}

uint64_t MaxLen(const uint64_t* offsets, uint64_t n) {
  uint64_t m = 0;
  for (uint64_t i = 0; i < n; ++i) m = std::max(m, offsets[i + 1] - offsets[i]);
  return m;
}

}  // namespace

SetsView Corpus::View() const {
  SetsView v = PackedView(info, dev.data());
  v.dscodes = doc_scale_codes;
  v.dsinfo = doc_scale_info;
  return v;
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

// ---- corpora ------------------------------------------------------------------------------------------------

Status UploadCorpus(Backend& b, const void* packed, uint64_t size, Corpus** out) {
  MSC_CUDA(cudaSetDevice(b.device));
  auto c = std::make_unique<Corpus>();
  MSC_RETURN(ParsePacked(packed, size, "corpus", &c->info));
  const PackedInfo& in = c->info;
  c->offsets.assign(in.host_offsets, in.host_offsets + in.n_sets + 1);
  c->max_len = MaxLen(c->offsets.data(), in.n_sets);
  if (c->max_len > 0x7fffffffull) {
    return Fail(MAXSIM_ERR_UNSUPPORTED, "corpus: a set has %llu tokens; the CUDA backend handles at most 2^31 - 1",
                static_cast<ull>(c->max_len));
  }
  size_t free_b = 0, total_b = 0;
  MSC_CUDA(cudaMemGetInfo(&free_b, &total_b));
  const uint64_t limit = b.resident_limit ? b.resident_limit : static_cast<uint64_t>(free_b * 0.8);
  c->streamed = b.force_stream || in.total_size > limit;
  if (!c->streamed) {
    MSC_RETURN(c->dev.Reserve(in.total_size, "the corpus"));
    MSC_CUDA(cudaMemcpy(c->dev.data(), packed, in.total_size, cudaMemcpyHostToDevice));
  } else {
    // Streamed: a pinned host copy (the host may free its buffer) and the offsets on the device.
    MSC_RETURN(c->host.Reserve(in.total_size, "the streamed corpus"));
    std::memcpy(c->host.data(), packed, in.total_size);
    MSC_RETURN(c->dev.Reserve((in.n_sets + 1) * 8, "the corpus offsets"));
    MSC_CUDA(cudaMemcpy(c->dev.data(), c->offsets.data(), (in.n_sets + 1) * 8, cudaMemcpyHostToDevice));
    char msg[200];
    std::snprintf(msg, sizeof(msg), "cuda: corpus of %.1f MiB is streamed from pinned host memory (limit %.1f MiB)",
                  in.total_size / 1048576.0, limit / 1048576.0);
    b.Log(MAXSIM_LOG_INFO, msg);
  }
  *out = c.release();
  return Status::Ok();
}

namespace {

// Builds the corpus's per-document-scale codes once (on b.stream, waited for).
Status EnsureDocScaleCodes(Backend& b, const Corpus& c) {
  std::lock_guard<std::mutex> lock(c.doc_scale_mutex);
  if (c.doc_scale_codes != nullptr || c.streamed) return Status::Ok();
  MSC_RETURN(c.doc_scale.Reserve(DocScaleCodeBytes(c.info.n_vectors, c.info.n_sets),
                                 "the corpus's per-document-scale codes (certified screening)"));
  const int8_t* codes = nullptr;
  const float4* info = nullptr;
  const cudaError_t e = LaunchDocScaleCodes(PackedView(c.info, c.dev.data()), c.info.n_vectors, c.doc_scale.data(),
                                            &codes, &info, b.stream);
  if (e != cudaSuccess) return CudaFail(e, "launching the per-document-scale code builder");
  // The codes are complete before any later work on b.stream; other streams wait for them here.
  MSC_CUDA(cudaStreamSynchronize(b.stream));
  c.doc_scale_codes = codes;
  c.doc_scale_info = info;
  b.Log(MAXSIM_LOG_INFO, "cuda: built per-document-scale int8 codes for certified screening of long queries");
  return Status::Ok();
}

}  // namespace

void FreeCorpus(Backend& b, Corpus* c) {
  if (!c) return;
  cudaSetDevice(b.device);
  cudaStreamSynchronize(b.stream);
  cudaStreamSynchronize(b.copy);
  delete c;
}

// ---- forward planning -----------------------------------------------------------------------------------

namespace {

enum class KernelKind { kTc, kTcSmem, kFfma, kScreen, kScreenWgmma };

struct Plan {
  KernelKind kind = KernelKind::kFfma;
  uint32_t rows = kFfmaGroupRows;  // RG
  uint32_t groups = 1;             // G
  bool partials = true;
  uint32_t cand_cap = 0;           // kScreenWgmma: candidate entries per task
  uint64_t PartialBytes(uint64_t n_pairs) const {
    return (partials ? n_pairs * groups * rows * (sizeof(float) + sizeof(int32_t)) : 0) + CandidateBytes(n_pairs);
  }
  // kScreenWgmma's candidate lists, thresholds and counts (CandidateLists), after the partials.
  uint64_t CandidateBytes(uint64_t n_pairs) const {
    if (kind != KernelKind::kScreenWgmma) return 0;
    return n_pairs * groups * (cand_cap * sizeof(uint4) + kScreenWgmmaRows * sizeof(int32_t) + sizeof(uint32_t)) + 16;
  }
};

// Whether a certified request runs the wgmma screening kernel (screen_wgmma.cu: dot, values only, 16-bit
// originals of 96 < dim <= 128, a resident corpus, an sm_90 device with the sm_90a module, queries of at least
// MAXSIM_CUDA_SCREEN_WGMMA_MIN_LQ tokens, default 256, read per call). It is the long-query kernel of forced
// screening (MAXSIM_CUDA_CERTIFIED=screen; several times faster than the mma.sync screening kernel on the visual
// shape), but not the default certified route: the exact kernel is faster still on the H100, with the same bits
// (gpu_bench, mode certified-screen; docs/cuda.md).
// MAXSIM_CUDA_SCREEN_WGMMA=1 puts it on the default route too, =0 never uses it.
bool UseScreenWgmma(const Backend& b, int requested_mode, const DeviceQueries& q, const Corpus& c, int metric,
                    bool argmax) {
  if (requested_mode != MAXSIM_MODE_CERTIFIED || b.screen_route == Backend::ScreenRoute::kExact) return false;
  const char* on = std::getenv("MAXSIM_CUDA_SCREEN_WGMMA");
  if (b.screen_route == Backend::ScreenRoute::kAuto && (on == nullptr || std::strcmp(on, "1") != 0)) return false;
  if (c.streamed || metric != MAXSIM_METRIC_DOT || argmax) return false;
  const char* v = std::getenv("MAXSIM_CUDA_SCREEN_WGMMA_MIN_LQ");
  const uint64_t min_lq = v ? std::strtoull(v, nullptr, 10) : 256;
  if (q.max_len < std::max<uint64_t>(min_lq, 1)) return false;
  return ScreenWgmmaSupported(q.view, c.info.dtype, c.info.padded_dim, c.max_len);
}

Plan MakeScreenWgmmaPlan(uint64_t max_lq) {
  Plan p;
  p.kind = KernelKind::kScreenWgmma;
  p.rows = kScreenWgmmaRows;
  p.groups = static_cast<uint32_t>(std::max<uint64_t>(1, (max_lq + p.rows - 1) / p.rows));
  p.partials = p.groups > 1;
  p.cand_cap = ScreenWgmmaCap();
  return p;
}

Plan MakePlan(const SetsView& q, const SetsView& d, uint64_t max_lq, int mode) {
  Plan p;
  if (mode != MAXSIM_MODE_EXACT) {
    p.kind = KernelKind::kScreen;
    p.rows = ScreenGroupRows(max_lq);
  } else if (TcSmemSupported(q, d, max_lq) && std::getenv("MAXSIM_CUDA_NO_SMEM_KERNEL") == nullptr) {
    p.kind = KernelKind::kTcSmem;
    p.rows = TcSmemGroupRows(max_lq);
  } else if (TcSupported(q, d)) {
    p.kind = KernelKind::kTc;
    p.rows = TcGroupRows(max_lq);
  } else {
    p.kind = KernelKind::kFfma;
    p.rows = kFfmaGroupRows;
  }
  p.groups = static_cast<uint32_t>(std::max<uint64_t>(1, (max_lq + p.rows - 1) / p.rows));
  p.partials = p.kind == KernelKind::kFfma || p.groups > 1;
  return p;
}

// The arguments of one matrix-layout forward: all nq queries against nd documents (a chunk of a corpus, or all of
// it), scores [nq x nd] at `scores`, argmax (optional) in the matrix layout with nd columns, and the plan's
// partial results at `partials` (PartialBytes(nq * nd) bytes; unused when the plan needs none).
ForwardArgs MatrixForwardArgs(const SetsView& q, const SetsView& d, uint64_t nq, uint64_t nd, int metric, int mode,
                              ull* counters, float* scores, int32_t* argmax, uint8_t* partials, const Plan& plan) {
  ForwardArgs fa;
  fa.q = q;
  fa.d = d;
  fa.cosine = metric == MAXSIM_METRIC_COSINE;
  fa.mode = mode;
  fa.counters = counters;
  fa.pairs.layout = kPairsMatrix;
  fa.pairs.n_pairs = nq * nd;
  fa.pairs.nd = nd;
  fa.pairs.scores = scores;
  fa.pairs.score_stride = nd;
  fa.pairs.argmax = argmax;
  fa.pairs.am_rows = nd;
  if (plan.partials && partials) {
    fa.part.term = reinterpret_cast<float*>(partials);
    fa.part.arg = reinterpret_cast<int32_t*>(partials + nq * nd * plan.groups * plan.rows * 4);
  }
  if (plan.kind == KernelKind::kScreenWgmma && partials) {
    const uint64_t tasks = nq * nd * plan.groups;
    uint8_t* c = partials + (plan.partials ? tasks * plan.rows * 8 : 0);
    c = reinterpret_cast<uint8_t*>(RoundUp(reinterpret_cast<uintptr_t>(c), 16));
    fa.cand.list = reinterpret_cast<uint4*>(c);
    fa.cand.threshold = reinterpret_cast<int32_t*>(c + tasks * plan.cand_cap * sizeof(uint4));
    fa.cand.count = reinterpret_cast<uint32_t*>(c + tasks * (plan.cand_cap * sizeof(uint4) + kScreenWgmmaRows * 4));
    fa.cand.cap = plan.cand_cap;
  }
  return fa;
}

// Launches the kernels of one forward (a.part.term/arg must point at PartialBytes(n_pairs) when partials).
Status LaunchForward(const Plan& plan, ForwardArgs a, cudaStream_t stream) {
  a.part.groups = plan.groups;
  a.part.group_rows = plan.rows;
  if (!plan.partials) {
    a.part.groups = 1;
  }
  cudaError_t e = cudaSuccess;
  switch (plan.kind) {
    case KernelKind::kTc: e = LaunchExactTc(a, stream); break;
    case KernelKind::kTcSmem: e = LaunchExactTcSmem(a, stream); break;
    case KernelKind::kFfma: e = LaunchExactFfma(a, stream); break;
    case KernelKind::kScreen: e = LaunchScreen(a, stream); break;
    case KernelKind::kScreenWgmma: e = LaunchScreenWgmma(a, stream); break;
  }
  if (e != cudaSuccess) return CudaFail(e, "launching the forward kernel");
  if (plan.partials) {
    e = LaunchFinalize(a, stream);
    if (e != cudaSuccess) return CudaFail(e, "launching the finalize kernel");
  }
  return Status::Ok();
}

// Copies `bytes` from host memory to device memory through the pinned stage (stream-ordered). The stage is
// reused by the next call only after the stream synchronises.
Status StageUpload(Backend& b, uint64_t& stage_used, void* dst, const void* src, uint64_t bytes,
                   cudaStream_t stream) {
  if (bytes == 0) return Status::Ok();
  uint8_t* s = b.stage.data() + stage_used;
  std::memcpy(s, src, bytes);
  stage_used += RoundUp(bytes, kAlign);
  MSC_CUDA(cudaMemcpyAsync(dst, s, bytes, cudaMemcpyHostToDevice, stream));
  return Status::Ok();
}

struct DocChunk {
  uint64_t j0 = 0, j1 = 0;
};

std::vector<DocChunk> MakeChunks(const Corpus& c, uint64_t max_docs, uint64_t row_bytes_streamed, uint64_t cap_bytes) {
  std::vector<DocChunk> chunks;
  const uint64_t nd = c.info.n_sets;
  uint64_t j = 0;
  while (j < nd) {
    uint64_t j1 = j + 1;
    while (j1 < nd && j1 - j < max_docs &&
           (!c.streamed || (c.offsets[j1 + 1] - c.offsets[j]) * row_bytes_streamed <= cap_bytes)) {
      ++j1;
    }
    chunks.push_back({j, j1});
    j = j1;
  }
  return chunks;
}

// Runs fn(chunk, doc view) for every chunk, on b.stream. Streamed corpora: chunk c + 1 is copied on b.copy
// while chunk c is scored (double buffering with events).
template <typename F>
Status ForEachChunk(Backend& b, const Corpus& c, const std::vector<DocChunk>& chunks, bool need_codes, F&& fn) {
  const PackedInfo& in = c.info;
  if (!c.streamed) {
    SetsView v = c.View();
    for (const DocChunk& ch : chunks) {
      SetsView d = v;
      d.offsets = v.offsets + ch.j0;
      if (v.dsinfo) d.dsinfo = v.dsinfo + ch.j0;
      d.n_sets = ch.j1 - ch.j0;
      MSC_RETURN(fn(ch, d));
    }
    return Status::Ok();
  }
  // Layout of a chunk buffer: originals | meta | codes.
  uint64_t max_rows = 0;
  for (const DocChunk& ch : chunks) max_rows = std::max(max_rows, c.offsets[ch.j1] - c.offsets[ch.j0]);
  const uint64_t orig_bytes = RoundUp(max_rows * in.orig_row_bytes, kAlign);
  const uint64_t meta_bytes = RoundUp(max_rows * sizeof(maxsim_vector_meta), kAlign);
  const uint64_t code_bytes = need_codes ? RoundUp(max_rows * in.padded_dim, kAlign) : 0;
  for (int i = 0; i < 2; ++i) MSC_RETURN(b.chunk[i].Reserve(orig_bytes + meta_bytes + code_bytes + kAlign, "a streamed chunk"));
  const uint8_t* h = c.host.data();
  auto enqueue_copy = [&](size_t k) -> Status {
    const DocChunk& ch = chunks[k];
    const int buf = static_cast<int>(k & 1);
    const uint64_t r0 = c.offsets[ch.j0], rows = c.offsets[ch.j1] - r0;
    uint8_t* dst = b.chunk[buf].data();
    MSC_CUDA(cudaStreamWaitEvent(b.copy, b.done[buf], 0));
    MSC_CUDA(cudaMemcpyAsync(dst, h + in.off_orig + r0 * in.orig_row_bytes, rows * in.orig_row_bytes,
                             cudaMemcpyHostToDevice, b.copy));
    MSC_CUDA(cudaMemcpyAsync(dst + orig_bytes, h + in.off_meta + r0 * sizeof(maxsim_vector_meta),
                             rows * sizeof(maxsim_vector_meta), cudaMemcpyHostToDevice, b.copy));
    if (need_codes) {
      MSC_CUDA(cudaMemcpyAsync(dst + orig_bytes + meta_bytes, h + in.off_codes + r0 * in.padded_dim,
                               rows * in.padded_dim, cudaMemcpyHostToDevice, b.copy));
    }
    MSC_CUDA(cudaEventRecord(b.copied[buf], b.copy));
    return Status::Ok();
  };
  // The done events start "complete" so that the first two copies do not wait.
  MSC_CUDA(cudaEventRecord(b.done[0], b.stream));
  MSC_CUDA(cudaEventRecord(b.done[1], b.stream));
  if (!chunks.empty()) MSC_RETURN(enqueue_copy(0));
  const uint64_t* dev_offsets = reinterpret_cast<const uint64_t*>(c.dev.data());
  for (size_t k = 0; k < chunks.size(); ++k) {
    if (k + 1 < chunks.size()) MSC_RETURN(enqueue_copy(k + 1));
    const int buf = static_cast<int>(k & 1);
    MSC_CUDA(cudaStreamWaitEvent(b.stream, b.copied[buf], 0));
    const DocChunk& ch = chunks[k];
    SetsView d;
    const uint8_t* base = b.chunk[buf].data();
    d.orig = base;
    d.row_bytes = in.orig_row_bytes;
    d.dtype = in.dtype;
    d.dim = in.dim;
    d.meta = reinterpret_cast<const maxsim_vector_meta*>(base + orig_bytes);
    d.codes = need_codes ? reinterpret_cast<const int8_t*>(base + orig_bytes + meta_bytes) : nullptr;
    d.code_bytes = in.padded_dim;
    d.offsets = dev_offsets + ch.j0;
    d.row_base = c.offsets[ch.j0];
    d.n_sets = ch.j1 - ch.j0;
    MSC_RETURN(fn(ch, d));
    MSC_CUDA(cudaEventRecord(b.done[buf], b.stream));
  }
  return Status::Ok();
}

uint64_t StreamedRowBytes(const Corpus& c, bool need_codes) {
  return c.info.orig_row_bytes + sizeof(maxsim_vector_meta) + (need_codes ? c.info.padded_dim : 0);
}

Status CheckPair(const PackedInfo& q, const Corpus& c) {
  if (q.dim != c.info.dim) {
    return Fail(MAXSIM_ERR_DIM_MISMATCH, "queries have dim %u but the corpus has dim %u", q.dim, c.info.dim);
  }
  return Status::Ok();
}

}  // namespace

// ---- queries ------------------------------------------------------------------------------------------------

Status UploadQueriesTo(Backend& b, const void* packed, uint64_t size, DeviceBuffer& dst, DeviceQueries* out) {
  DeviceQueries q;
  MSC_RETURN(ParsePacked(packed, size, "queries", &q.info));
  q.host_offsets = q.info.host_offsets;
  q.max_len = MaxLen(q.host_offsets, q.info.n_sets);
  if (q.max_len > 0x7fffffffull) return Fail(MAXSIM_ERR_UNSUPPORTED, "queries: a set is too long for the CUDA backend");
  // The copy is not waited for: the kernels that read dst follow it on the stream, and the next upload waits for
  // it before writing qstage again (an event that never fired, before the first upload, counts as fired).
  MSC_CUDA(cudaEventSynchronize(b.qstaged));
  MSC_RETURN(dst.Reserve(q.info.total_size, "the queries"));
  MSC_RETURN(b.qstage.Reserve(q.info.total_size, "staging the queries"));
  std::memcpy(b.qstage.data(), packed, q.info.total_size);
  MSC_CUDA(cudaMemcpyAsync(dst.data(), b.qstage.data(), q.info.total_size, cudaMemcpyHostToDevice, b.stream));
  MSC_CUDA(cudaEventRecord(b.qstaged, b.stream));
  q.view = PackedView(q.info, dst.data());
  *out = q;
  return Status::Ok();
}

// ---- inference ------------------------------------------------------------------------------------------

Status ScoreMatrixDevice(Backend& b, const DeviceQueries& q, const Corpus& c, int metric, int mode, float* d_scores,
                         int32_t* d_argmax, unsigned long long* d_counters, cudaStream_t stream) {
  if (c.streamed) return Fail(MAXSIM_ERR_UNSUPPORTED, "ScoreMatrixDevice needs a resident corpus");
  MSC_RETURN(CheckPair(q.info, c));
  const uint64_t nq = q.info.n_sets, nd = c.info.n_sets;
  const bool wg = UseScreenWgmma(b, mode, q, c, metric, d_argmax != nullptr);
  if (wg) MSC_RETURN(EnsureDocScaleCodes(b, c));
  const SetsView d = c.View();
  const int kmode = wg ? static_cast<int>(MAXSIM_MODE_CERTIFIED) : b.KernelMode(mode, q.view, q.max_len, nq * nd);
  const Plan plan = wg ? MakeScreenWgmmaPlan(q.max_len) : MakePlan(q.view, d, q.max_len, kmode);
  uint8_t* partials = nullptr;
  if (plan.PartialBytes(nq * nd) > 0) {
    MSC_RETURN(b.scratch.Reserve(plan.PartialBytes(nq * nd), "partial results"));
    partials = b.scratch.data();
  }
  const ForwardArgs a = MatrixForwardArgs(q.view, d, nq, nd, metric, kmode, d_counters, d_scores, d_argmax, partials, plan);
  return LaunchForward(plan, a, stream);
}

namespace {

void FillStats(maxsim_stats* st, uint64_t pairs, uint64_t query_tokens, const ull* counters) {
  if (!st) return;
  *st = maxsim_stats{};
  st->pairs = pairs;
  st->query_tokens = query_tokens;
  if (counters) {
    st->refined = counters[0];
    st->multi_candidate = counters[1];
  }
}

}  // namespace

Status ScoreMatrix(Backend& b, const maxsim_plugin_score_args& a) {
  MSC_CUDA(cudaSetDevice(b.device));
  const Corpus& c = *reinterpret_cast<const Corpus*>(a.corpus);
  DeviceQueries q;
  MSC_RETURN(UploadQueriesTo(b, a.queries, a.queries_size, b.qbuf, &q));
  MSC_RETURN(CheckPair(q.info, c));
  const uint64_t nq = q.info.n_sets, nd = c.info.n_sets;
  const uint64_t qpos = nq ? q.host_offsets[nq] : 0;
  if (nq == 0 || nd == 0) {
    FillStats(a.stats, 0, 0, nullptr);
    return Status::Ok();
  }
  const bool wg = UseScreenWgmma(b, a.mode, q, c, a.metric, a.argmax != nullptr);
  if (wg) MSC_RETURN(EnsureDocScaleCodes(b, c));
  const int mode = wg ? static_cast<int>(MAXSIM_MODE_CERTIFIED) : b.KernelMode(a.mode, q.view, q.max_len, nq * nd);
  const bool need_codes = mode != MAXSIM_MODE_EXACT;
  SetsView probe_d = c.streamed ? SetsView{} : c.View();
  if (c.streamed) {
    probe_d.orig = nullptr;  // chunk buffers are 256-byte aligned, rows as in the buffer
    probe_d.row_bytes = c.info.orig_row_bytes;
    probe_d.dtype = c.info.dtype;
    probe_d.dim = c.info.dim;
  }
  const Plan plan = wg ? MakeScreenWgmmaPlan(q.max_len) : MakePlan(q.view, probe_d, q.max_len, mode);
  // Per-document-column device bytes of one chunk: scores, argmax, partials.
  const uint64_t col_bytes = nq * 4 + (a.argmax ? qpos * 4 : 0) + plan.PartialBytes(nq);
  const uint64_t max_docs = std::max<uint64_t>(1, kOutputBudget / std::max<uint64_t>(1, col_bytes));
  const std::vector<DocChunk> chunks = MakeChunks(c, max_docs, StreamedRowBytes(c, need_codes), b.chunk_bytes);
  uint64_t cn = 0;
  for (const DocChunk& ch : chunks) cn = std::max(cn, ch.j1 - ch.j0);
  Carver cv;
  const uint64_t o_scores = cv.Add(nq * cn * 4);
  const uint64_t o_argmax = a.argmax ? cv.Add(qpos * cn * 4) : 0;
  const uint64_t o_part = cv.Add(plan.PartialBytes(nq * cn));
  const uint64_t o_cnt = cv.Add(16);
  MSC_RETURN(b.scratch.Reserve(cv.size(), "scores and partial results"));
  // Host staging: the chunk's scores, its argmax, and the screening counters (read back with the last chunk's
  // results, so the call waits for the device once per chunk).
  const uint64_t h_cnt = RoundUp(nq * cn * 4, kAlign) + RoundUp(a.argmax ? qpos * cn * 4 : 0, kAlign);
  MSC_RETURN(b.stage.Reserve(h_cnt + 16, "result staging"));
  uint8_t* s = b.scratch.data();
  // Only screening counts (refined tokens, multi-candidate tokens); exact kernels take no counters.
  ull* counters = need_codes ? reinterpret_cast<ull*>(s + o_cnt) : nullptr;
  if (counters) MSC_CUDA(cudaMemsetAsync(counters, 0, 16, b.stream));
  const bool single = chunks.size() == 1;
  Status st = ForEachChunk(b, c, chunks, need_codes, [&](const DocChunk& ch, const SetsView& d) -> Status {
    const uint64_t n = ch.j1 - ch.j0;
    const ForwardArgs fa =
        MatrixForwardArgs(q.view, d, nq, n, a.metric, mode, counters, reinterpret_cast<float*>(s + o_scores),
                          a.argmax ? reinterpret_cast<int32_t*>(s + o_argmax) : nullptr, s + o_part, plan);
    MSC_RETURN(LaunchForward(plan, fa, b.stream));
    uint8_t* hs = b.stage.data();
    uint8_t* ha = hs + RoundUp(nq * n * 4, kAlign);
    MSC_CUDA(cudaMemcpyAsync(single ? static_cast<void*>(a.scores) : hs, s + o_scores, nq * n * 4,
                             cudaMemcpyDeviceToHost, b.stream));
    if (a.argmax) {
      MSC_CUDA(cudaMemcpyAsync(single ? static_cast<void*>(a.argmax) : ha, s + o_argmax, qpos * n * 4,
                               cudaMemcpyDeviceToHost, b.stream));
    }
    if (counters && ch.j1 == nd) {
      MSC_CUDA(cudaMemcpyAsync(b.stage.data() + h_cnt, counters, 16, cudaMemcpyDeviceToHost, b.stream));
    }
    MSC_CUDA(cudaStreamSynchronize(b.stream));
    if (!single) {
      for (uint64_t i = 0; i < nq; ++i) {
        std::memcpy(a.scores + i * nd + ch.j0, hs + i * n * 4, n * 4);
        if (a.argmax) {
          const uint64_t oi = q.host_offsets[i], lq = q.host_offsets[i + 1] - oi;
          std::memcpy(a.argmax + nd * oi + ch.j0 * lq, ha + (n * oi) * 4, n * lq * 4);
        }
      }
    }
    return Status::Ok();
  });
  MSC_RETURN(st);
  ull hc[2] = {0, 0};
  if (counters) std::memcpy(hc, b.stage.data() + h_cnt, 16);
  FillStats(a.stats, nq * nd, qpos * nd, counters ? hc : nullptr);
  return Status::Ok();
}

Status ScoreCandidates(Backend& b, const maxsim_plugin_score_args& a) {
  MSC_CUDA(cudaSetDevice(b.device));
  const Corpus& c = *reinterpret_cast<const Corpus*>(a.corpus);
  DeviceQueries q;
  MSC_RETURN(UploadQueriesTo(b, a.queries, a.queries_size, b.qbuf, &q));
  MSC_RETURN(CheckPair(q.info, c));
  const uint64_t nq = q.info.n_sets, nd = c.info.n_sets;
  const uint64_t total = nq ? a.cand_offsets[nq] : 0;
  if (total == 0) {
    FillStats(a.stats, 0, 0, nullptr);
    return Status::Ok();
  }
  const int mode = b.KernelMode(a.mode, q.view, q.max_len, total);
  const bool need_codes = mode != MAXSIM_MODE_EXACT;
  // Pairs sorted by chunk (a stable counting sort), with their output slot and argmax base.
  SetsView probe_d;
  if (!c.streamed) probe_d = c.View();
  probe_d.row_bytes = c.info.orig_row_bytes;
  probe_d.dtype = c.info.dtype;
  probe_d.dim = c.info.dim;
  const Plan plan = MakePlan(q.view, probe_d, q.max_len, mode);
  const std::vector<DocChunk> chunks =
      MakeChunks(c, c.streamed ? nd : nd, StreamedRowBytes(c, need_codes), b.chunk_bytes);
  std::vector<uint32_t> chunk_of(nd);
  for (size_t k = 0; k < chunks.size(); ++k) {
    for (uint64_t j = chunks[k].j0; j < chunks[k].j1; ++j) chunk_of[j] = static_cast<uint32_t>(k);
  }
  std::vector<uint64_t> start(chunks.size() + 1, 0);
  for (uint64_t e = 0; e < total; ++e) ++start[chunk_of[a.candidates[e]] + 1];
  for (size_t k = 0; k < chunks.size(); ++k) start[k + 1] += start[k];
  std::vector<uint32_t> pq(total), pd(total);
  std::vector<uint64_t> slot(total), am(total);
  std::vector<uint64_t> fill(start.begin(), start.end() - 1);
  uint64_t am_total = 0, qtok = 0;
  for (uint64_t i = 0; i < nq; ++i) {
    const uint64_t lq = q.host_offsets[i + 1] - q.host_offsets[i];
    for (uint64_t e = a.cand_offsets[i]; e < a.cand_offsets[i + 1]; ++e) {
      const uint64_t j = a.candidates[e];
      const uint32_t k = chunk_of[j];
      const uint64_t pos = fill[k]++;
      pq[pos] = static_cast<uint32_t>(i);
      pd[pos] = static_cast<uint32_t>(j - chunks[k].j0);
      slot[pos] = e;
      am[pos] = am_total;
      am_total += lq;
      qtok += lq;
    }
  }
  // Batches of pairs so that the partials stay within the output budget.
  const uint64_t per_pair = plan.PartialBytes(1);
  const uint64_t batch = per_pair ? std::max<uint64_t>(1, kOutputBudget / per_pair) : total;
  Carver cv;
  const uint64_t o_pq = cv.Add(total * 4), o_pd = cv.Add(total * 4), o_slot = cv.Add(total * 8),
                 o_am = cv.Add(total * 8), o_scores = cv.Add(total * 4),
                 o_argmax = a.argmax ? cv.Add(am_total * 4) : 0, o_part = cv.Add(plan.PartialBytes(std::min(batch, total))),
                 o_cnt = cv.Add(16);
  MSC_RETURN(b.scratch.Reserve(cv.size(), "candidate lists and partial results"));
  MSC_RETURN(b.stage.Reserve(total * 24 + 4 * kAlign, "candidate staging"));
  uint8_t* s = b.scratch.data();
  uint64_t used = 0;
  MSC_RETURN(StageUpload(b, used, s + o_pq, pq.data(), total * 4, b.stream));
  MSC_RETURN(StageUpload(b, used, s + o_pd, pd.data(), total * 4, b.stream));
  MSC_RETURN(StageUpload(b, used, s + o_slot, slot.data(), total * 8, b.stream));
  ull* counters = reinterpret_cast<ull*>(s + o_cnt);
  MSC_CUDA(cudaMemsetAsync(counters, 0, 16, b.stream));
  // The argmax base list is uploaded separately (the stage holds 24 bytes per pair).
  MSC_CUDA(cudaStreamSynchronize(b.stream));
  used = 0;
  MSC_RETURN(StageUpload(b, used, s + o_am, am.data(), total * 8, b.stream));
  Status st = ForEachChunk(b, c, chunks, need_codes, [&](const DocChunk& ch, const SetsView& d) -> Status {
    const size_t k = static_cast<size_t>(&ch - chunks.data());
    for (uint64_t p0 = start[k]; p0 < start[k + 1]; p0 += batch) {
      const uint64_t n = std::min(batch, start[k + 1] - p0);
      ForwardArgs fa;
      fa.q = q.view;
      fa.d = d;
      fa.cosine = a.metric == MAXSIM_METRIC_COSINE;
      fa.mode = mode;
      fa.counters = counters;
      fa.pairs.layout = kPairsList;
      fa.pairs.n_pairs = n;
      fa.pairs.pq = reinterpret_cast<const uint32_t*>(s + o_pq) + p0;
      fa.pairs.pd = reinterpret_cast<const uint32_t*>(s + o_pd) + p0;
      fa.pairs.pslot = reinterpret_cast<const uint64_t*>(s + o_slot) + p0;
      fa.pairs.scores = reinterpret_cast<float*>(s + o_scores);
      fa.pairs.argmax = a.argmax ? reinterpret_cast<int32_t*>(s + o_argmax) : nullptr;
      fa.pairs.am_base = reinterpret_cast<const uint64_t*>(s + o_am) + p0;
      fa.part.term = reinterpret_cast<float*>(s + o_part);
      fa.part.arg = reinterpret_cast<int32_t*>(s + o_part + n * plan.groups * plan.rows * 4);
      MSC_RETURN(LaunchForward(plan, fa, b.stream));
    }
    return Status::Ok();
  });
  MSC_RETURN(st);
  // argmax slots of list pairs were assigned in (query, candidate) order, which is maxsim.h's layout.
  MSC_CUDA(cudaMemcpyAsync(a.scores, s + o_scores, total * 4, cudaMemcpyDeviceToHost, b.stream));
  if (a.argmax) MSC_CUDA(cudaMemcpyAsync(a.argmax, s + o_argmax, am_total * 4, cudaMemcpyDeviceToHost, b.stream));
  ull hc[2] = {0, 0};
  MSC_CUDA(cudaMemcpyAsync(hc, counters, 16, cudaMemcpyDeviceToHost, b.stream));
  MSC_CUDA(cudaStreamSynchronize(b.stream));
  FillStats(a.stats, total, qtok, need_codes ? hc : nullptr);
  return Status::Ok();
}

Status TopK(Backend& b, const maxsim_plugin_score_args& a) {
  MSC_CUDA(cudaSetDevice(b.device));
  const Corpus& c = *reinterpret_cast<const Corpus*>(a.corpus);
  DeviceQueries q;
  MSC_RETURN(UploadQueriesTo(b, a.queries, a.queries_size, b.qbuf, &q));
  MSC_RETURN(CheckPair(q.info, c));
  const uint64_t nq = q.info.n_sets, nd = c.info.n_sets, k = a.k;
  if (k == 0) return Fail(MAXSIM_ERR_INVALID_ARGUMENT, "k is 0 (ask for at least one document)");
  const uint64_t qpos = nq ? q.host_offsets[nq] : 0;
  std::vector<ull> keys;
  uint64_t have = 0;
  ull hc[2] = {0, 0};
  const bool wg = nq > 0 && nd > 0 && UseScreenWgmma(b, a.mode, q, c, a.metric, false);
  if (wg) MSC_RETURN(EnsureDocScaleCodes(b, c));
  const int mode = wg ? static_cast<int>(MAXSIM_MODE_CERTIFIED) : b.KernelMode(a.mode, q.view, q.max_len, nq * nd);
  const bool need_codes = mode != MAXSIM_MODE_EXACT;
  if (nq > 0 && nd > 0) {
    SetsView probe_d;
    if (!c.streamed) probe_d = c.View();
    probe_d.row_bytes = c.info.orig_row_bytes;
    probe_d.dtype = c.info.dtype;
    probe_d.dim = c.info.dim;
    const Plan plan = wg ? MakeScreenWgmmaPlan(q.max_len) : MakePlan(q.view, probe_d, q.max_len, mode);
    const uint64_t col_bytes = nq * 4 + plan.PartialBytes(nq);
    const uint64_t max_docs = std::max<uint64_t>(1, kOutputBudget / std::max<uint64_t>(1, col_bytes));
    const std::vector<DocChunk> chunks = MakeChunks(c, max_docs, StreamedRowBytes(c, need_codes), b.chunk_bytes);
    uint64_t cn = 0;
    for (const DocChunk& ch : chunks) cn = std::max(cn, ch.j1 - ch.j0);
    Carver cv;
    const uint64_t o_scores = cv.Add(nq * cn * 4), o_part = cv.Add(plan.PartialBytes(nq * cn)),
                   o_run0 = cv.Add(nq * k * 8), o_run1 = cv.Add(nq * k * 8), o_cnt = cv.Add(16);
    MSC_RETURN(b.scratch.Reserve(cv.size(), "top-k scratch"));
    uint8_t* s = b.scratch.data();
    ull* run[2] = {reinterpret_cast<ull*>(s + o_run0), reinterpret_cast<ull*>(s + o_run1)};
    ull* counters = reinterpret_cast<ull*>(s + o_cnt);
    MSC_CUDA(cudaMemsetAsync(counters, 0, 16, b.stream));
    int cur = 0;
    Status st = ForEachChunk(b, c, chunks, need_codes, [&](const DocChunk& ch, const SetsView& d) -> Status {
      const uint64_t n = ch.j1 - ch.j0;
      const ForwardArgs fa = MatrixForwardArgs(q.view, d, nq, n, a.metric, mode, counters,
                                               reinterpret_cast<float*>(s + o_scores), nullptr, s + o_part, plan);
      MSC_RETURN(LaunchForward(plan, fa, b.stream));
      const cudaError_t e = LaunchTopkMerge(fa.pairs.scores, n, n, ch.j0, nq, run[cur], run[1 - cur], have, k, b.stream);
      if (e != cudaSuccess) return CudaFail(e, "launching the top-k merge");
      cur = 1 - cur;
      have = std::min(k, have + n);
      return Status::Ok();
    });
    MSC_RETURN(st);
    keys.resize(nq * k);
    MSC_CUDA(cudaMemcpyAsync(keys.data(), run[cur], nq * k * 8, cudaMemcpyDeviceToHost, b.stream));
    MSC_CUDA(cudaMemcpyAsync(hc, counters, 16, cudaMemcpyDeviceToHost, b.stream));
    MSC_CUDA(cudaStreamSynchronize(b.stream));
  }
  for (uint64_t i = 0; i < nq; ++i) {
    ull* row = keys.empty() ? nullptr : keys.data() + i * k;
    if (row) std::sort(row, row + have, [](ull x, ull y) { return x > y; });
    for (uint64_t r = 0; r < k; ++r) {
      if (r < have) {
        const uint32_t ob = static_cast<uint32_t>(row[r] >> 32);
        const uint32_t bits = (ob & 0x80000000u) ? (ob & 0x7fffffffu) : ~ob;
        float v;
        std::memcpy(&v, &bits, 4);
        a.scores[i * k + r] = v;
        a.topk_index[i * k + r] = 0xffffffffull - static_cast<uint32_t>(row[r]);
      } else {
        a.scores[i * k + r] = -std::numeric_limits<float>::infinity();
        a.topk_index[i * k + r] = UINT64_MAX;
      }
    }
  }
  FillStats(a.stats, nq * nd, qpos * nd, need_codes ? hc : nullptr);
  return Status::Ok();
}

// ---- training -------------------------------------------------------------------------------------------

namespace {

struct DenseInfo {
  SetsView view;                 // offsets still to be pointed at the device copy
  std::vector<uint64_t> offsets; // host copy (n_sets + 1), always filled
  uint64_t n_rows = 0, first_row = 0, max_len = 0;
};

Status ReadDense(const maxsim_dense_sets* s, const char* role, DenseInfo* out) {
  if (s == nullptr) return Fail(MAXSIM_ERR_INVALID_ARGUMENT, "%s: NULL", role);
  if (s->memory != MAXSIM_MEMORY_CUDA) {
    return Fail(MAXSIM_ERR_INVALID_ARGUMENT, "%s: the CUDA backend's training calls take MAXSIM_MEMORY_CUDA tensors", role);
  }
  DenseInfo d;
  SetsView& v = d.view;
  v.orig = static_cast<const uint8_t*>(s->data);
  v.dtype = s->dtype;
  v.dim = s->dim;
  const uint64_t elem = s->dtype == MAXSIM_F32 ? 4 : 2;
  v.row_bytes = (s->row_stride ? s->row_stride : s->dim) * elem;
  v.mask = s->mask;
  v.n_sets = s->n_sets;
  v.set_length = s->set_length;
  d.offsets.resize(s->n_sets + 1);
  for (uint64_t i = 0; i <= s->n_sets; ++i) d.offsets[i] = s->offsets ? s->offsets[i] : i * s->set_length;
  d.first_row = d.offsets[0];
  d.n_rows = d.offsets[s->n_sets];
  d.max_len = MaxLen(d.offsets.data(), s->n_sets);
  if (d.max_len > 0x7fffffffull) return Fail(MAXSIM_ERR_UNSUPPORTED, "%s: a set is too long for the CUDA backend", role);
  if (s->n_sets > 0xffffffffull) return Fail(MAXSIM_ERR_UNSUPPORTED, "%s: too many sets for the CUDA backend", role);
  *out = std::move(d);
  return Status::Ok();
}

Status ReadFlags(Backend& b, const ull* dev_flags, cudaStream_t stream, ull* out2) {
  MSC_CUDA(cudaMemcpyAsync(b.flags_host.data(), dev_flags, 16, cudaMemcpyDeviceToHost, stream));
  MSC_CUDA(cudaStreamSynchronize(stream));
  std::memcpy(out2, b.flags_host.data(), 16);
  return Status::Ok();
}

}  // namespace

Status TrainForward(Backend& b, const maxsim_plugin_train_args& a) {
  MSC_CUDA(cudaSetDevice(b.device));
  MSC_CUDA(cudaEventSynchronize(b.staged));  // the previous call's staged uploads have been read
  cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
  DenseInfo q, d;
  MSC_RETURN(ReadDense(a.queries, "queries", &q));
  MSC_RETURN(ReadDense(a.documents, "documents", &d));
  if (q.view.dim != d.view.dim) {
    return Fail(MAXSIM_ERR_DIM_MISMATCH, "queries have dim %u but documents have dim %u", q.view.dim, d.view.dim);
  }
  const uint64_t nq = q.view.n_sets, nd = d.view.n_sets;
  const bool list = a.layout == MAXSIM_LAYOUT_CANDIDATES;
  if (a.layout != MAXSIM_LAYOUT_MATRIX && !list && a.layout != MAXSIM_LAYOUT_PAIRS) {
    return Fail(MAXSIM_ERR_INVALID_ARGUMENT, "layout %d is not MATRIX, PAIRS or CANDIDATES", static_cast<int>(a.layout));
  }
  if (a.layout == MAXSIM_LAYOUT_PAIRS && nq != nd) {
    return Fail(MAXSIM_ERR_INVALID_ARGUMENT, "pairs layout needs as many query sets as document sets");
  }
  const uint64_t n_pairs = list ? (nq ? a.cand_offsets[nq] : 0) : a.layout == MAXSIM_LAYOUT_PAIRS ? nq : nq * nd;
  if (a.scores == nullptr && n_pairs > 0) return Fail(MAXSIM_ERR_INVALID_ARGUMENT, "scores output is NULL");
  const bool cosine = a.metric == MAXSIM_METRIC_COSINE;
  const Plan plan = MakePlan(q.view, d.view, q.max_len, MAXSIM_MODE_EXACT);
  std::vector<uint32_t> pq, pd;
  std::vector<uint64_t> am;
  if (list) {
    pq.resize(n_pairs);
    pd.resize(n_pairs);
    am.resize(n_pairs);
    uint64_t base = 0;
    for (uint64_t i = 0; i < nq; ++i) {
      const uint64_t lq = q.offsets[i + 1] - q.offsets[i];
      for (uint64_t e = a.cand_offsets[i]; e < a.cand_offsets[i + 1]; ++e) {
        if (a.candidates[e] >= nd) return Fail(MAXSIM_ERR_INVALID_ARGUMENT, "candidates[%llu] is not a document", static_cast<ull>(e));
        pq[e] = static_cast<uint32_t>(i);
        pd[e] = static_cast<uint32_t>(a.candidates[e]);
        am[e] = base;
        base += lq;
      }
    }
  }
  Carver cv;
  const uint64_t o_qoff = cv.Add((nq + 1) * 8), o_doff = cv.Add((nd + 1) * 8), o_flag = cv.Add(16);
  const uint64_t o_qn = cosine ? cv.Add(q.n_rows * 4) : 0, o_dn = cosine ? cv.Add(d.n_rows * 4) : 0;
  const uint64_t o_pq = list ? cv.Add(n_pairs * 4) : 0, o_pd = list ? cv.Add(n_pairs * 4) : 0,
                 o_am = list ? cv.Add(n_pairs * 8) : 0;
  const uint64_t o_part = cv.Add(plan.PartialBytes(n_pairs));
  MSC_RETURN(b.scratch.Reserve(cv.size(), "training forward scratch"));
  MSC_RETURN(b.stage.Reserve((nq + nd + 2) * 8 + n_pairs * 16 + 8 * kAlign, "training staging"));
  if (a.peak_extra_bytes) *a.peak_extra_bytes = cv.size();
  uint8_t* s = b.scratch.data();
  uint64_t used = 0;
  MSC_RETURN(StageUpload(b, used, s + o_qoff, q.offsets.data(), (nq + 1) * 8, stream));
  MSC_RETURN(StageUpload(b, used, s + o_doff, d.offsets.data(), (nd + 1) * 8, stream));
  if (list) {
    MSC_RETURN(StageUpload(b, used, s + o_pq, pq.data(), n_pairs * 4, stream));
    MSC_RETURN(StageUpload(b, used, s + o_pd, pd.data(), n_pairs * 4, stream));
    MSC_RETURN(StageUpload(b, used, s + o_am, am.data(), n_pairs * 8, stream));
  }
  MSC_CUDA(cudaEventRecord(b.staged, stream));
  q.view.offsets = reinterpret_cast<const uint64_t*>(s + o_qoff);
  d.view.offsets = reinterpret_cast<const uint64_t*>(s + o_doff);
  ull* flag = reinterpret_cast<ull*>(s + o_flag);
  MSC_CUDA(cudaMemsetAsync(flag, 0xff, 16, stream));
  float* qn = cosine ? reinterpret_cast<float*>(s + o_qn) : nullptr;
  float* dn = cosine ? reinterpret_cast<float*>(s + o_dn) : nullptr;
  cudaError_t e = LaunchRowCheck(q.view, q.first_row, q.n_rows, qn, flag, stream);
  if (e == cudaSuccess) e = LaunchRowCheck(d.view, d.first_row, d.n_rows, dn, flag + 1, stream);
  if (e != cudaSuccess) return CudaFail(e, "launching the input check");
  q.view.norms = qn;
  d.view.norms = dn;
  ForwardArgs fa;
  fa.q = q.view;
  fa.d = d.view;
  fa.cosine = cosine;
  fa.mode = MAXSIM_MODE_EXACT;
  fa.pairs.layout = list ? kPairsList : a.layout == MAXSIM_LAYOUT_PAIRS ? kPairsDiagonal : kPairsMatrix;
  fa.pairs.n_pairs = n_pairs;
  fa.pairs.nd = nd;
  fa.pairs.scores = a.scores;
  fa.pairs.score_stride = nd;
  fa.pairs.argmax = a.argmax;
  fa.pairs.am_rows = nd;
  if (list) {
    fa.pairs.pq = reinterpret_cast<const uint32_t*>(s + o_pq);
    fa.pairs.pd = reinterpret_cast<const uint32_t*>(s + o_pd);
    fa.pairs.am_base = reinterpret_cast<const uint64_t*>(s + o_am);
  }
  fa.part.term = reinterpret_cast<float*>(s + o_part);
  fa.part.arg = reinterpret_cast<int32_t*>(s + o_part + n_pairs * plan.groups * plan.rows * 4);
  MSC_RETURN(LaunchForward(plan, fa, stream));
  if (!b.sync_calls) return Status::Ok();
  ull flags[2];
  MSC_RETURN(ReadFlags(b, flag, stream, flags));
  for (int r = 0; r < 2; ++r) {
    if (flags[r] != ~0ull) {
      DenseInfo& x = r == 0 ? q : d;
      const uint64_t row = flags[r] - 1;
      const uint64_t set = static_cast<uint64_t>(std::upper_bound(x.offsets.begin(), x.offsets.end(), row) - x.offsets.begin()) - 1;
      return Fail(MAXSIM_ERR_NON_FINITE, "%s: set %llu token %llu has a non-finite value or an L2 norm above 1e19",
                  r == 0 ? "queries" : "documents", static_cast<ull>(set), static_cast<ull>(row - x.offsets[set]));
    }
  }
  return Status::Ok();
}

Status TrainBackward(Backend& b, const maxsim_plugin_train_args& a) {
  MSC_CUDA(cudaSetDevice(b.device));
  MSC_CUDA(cudaEventSynchronize(b.staged));  // the previous call's staged uploads have been read
  cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
  DenseInfo q, d;
  MSC_RETURN(ReadDense(a.queries, "queries", &q));
  MSC_RETURN(ReadDense(a.documents, "documents", &d));
  if (q.view.dim != d.view.dim) {
    return Fail(MAXSIM_ERR_DIM_MISMATCH, "queries have dim %u but documents have dim %u", q.view.dim, d.view.dim);
  }
  if (a.argmax == nullptr || a.grad_scores == nullptr) {
    return Fail(MAXSIM_ERR_INVALID_ARGUMENT, "backward needs argmax and grad_scores (both non-NULL)");
  }
  const uint64_t nq = q.view.n_sets, nd = d.view.n_sets, dim = q.view.dim;
  const bool list = a.layout == MAXSIM_LAYOUT_CANDIDATES;
  if (a.layout == MAXSIM_LAYOUT_PAIRS && nq != nd) {
    return Fail(MAXSIM_ERR_INVALID_ARGUMENT, "pairs layout needs as many query sets as document sets");
  }
  const uint64_t n_pairs = list ? (nq ? a.cand_offsets[nq] : 0) : a.layout == MAXSIM_LAYOUT_PAIRS ? nq : nq * nd;
  std::vector<uint32_t> pq, pd;
  std::vector<uint64_t> am, by_doc_start, by_doc;
  if (list) {
    pq.resize(n_pairs);
    pd.resize(n_pairs);
    am.resize(n_pairs);
    by_doc_start.assign(nd + 1, 0);
    uint64_t base = 0;
    for (uint64_t i = 0; i < nq; ++i) {
      const uint64_t lq = q.offsets[i + 1] - q.offsets[i];
      for (uint64_t e = a.cand_offsets[i]; e < a.cand_offsets[i + 1]; ++e) {
        if (a.candidates[e] >= nd) return Fail(MAXSIM_ERR_INVALID_ARGUMENT, "candidates[%llu] is not a document", static_cast<ull>(e));
        pq[e] = static_cast<uint32_t>(i);
        pd[e] = static_cast<uint32_t>(a.candidates[e]);
        am[e] = base;
        base += lq;
        ++by_doc_start[a.candidates[e] + 1];
      }
    }
    for (uint64_t j = 0; j < nd; ++j) by_doc_start[j + 1] += by_doc_start[j];
    by_doc.resize(n_pairs);
    std::vector<uint64_t> fill(by_doc_start.begin(), by_doc_start.end() - 1);
    for (uint64_t e = 0; e < n_pairs; ++e) by_doc[fill[pd[e]]++] = e;  // ascending pair order per document
  }
  Carver cv;
  const uint64_t o_qoff = cv.Add((nq + 1) * 8), o_doff = cv.Add((nd + 1) * 8), o_flag = cv.Add(16);
  const uint64_t o_pq = list ? cv.Add(n_pairs * 4) : 0, o_pd = list ? cv.Add(n_pairs * 4) : 0,
                 o_am = list ? cv.Add(n_pairs * 8) : 0, o_qps = list ? cv.Add((nq + 1) * 8) : 0,
                 o_dps = list ? cv.Add((nd + 1) * 8) : 0, o_dp = list ? cv.Add(n_pairs * 8) : 0;
  MSC_RETURN(b.scratch.Reserve(cv.size(), "training backward scratch"));
  MSC_RETURN(b.stage.Reserve(2 * (nq + nd + 2) * 8 + n_pairs * 32 + 10 * kAlign, "training staging"));
  if (a.peak_extra_bytes) *a.peak_extra_bytes = cv.size();
  uint8_t* s = b.scratch.data();
  uint64_t used = 0;
  MSC_RETURN(StageUpload(b, used, s + o_qoff, q.offsets.data(), (nq + 1) * 8, stream));
  MSC_RETURN(StageUpload(b, used, s + o_doff, d.offsets.data(), (nd + 1) * 8, stream));
  if (list) {
    MSC_RETURN(StageUpload(b, used, s + o_pq, pq.data(), n_pairs * 4, stream));
    MSC_RETURN(StageUpload(b, used, s + o_pd, pd.data(), n_pairs * 4, stream));
    MSC_RETURN(StageUpload(b, used, s + o_am, am.data(), n_pairs * 8, stream));
    MSC_RETURN(StageUpload(b, used, s + o_qps, a.cand_offsets, (nq + 1) * 8, stream));
    MSC_RETURN(StageUpload(b, used, s + o_dps, by_doc_start.data(), (nd + 1) * 8, stream));
    MSC_RETURN(StageUpload(b, used, s + o_dp, by_doc.data(), n_pairs * 8, stream));
  }
  MSC_CUDA(cudaEventRecord(b.staged, stream));
  BackwardArgs ba;
  ba.q = q.view;
  ba.d = d.view;
  ba.q.offsets = reinterpret_cast<const uint64_t*>(s + o_qoff);
  ba.d.offsets = reinterpret_cast<const uint64_t*>(s + o_doff);
  ba.pairs.layout = list ? kPairsList : a.layout == MAXSIM_LAYOUT_PAIRS ? kPairsDiagonal : kPairsMatrix;
  ba.pairs.n_pairs = n_pairs;
  ba.pairs.nd = nd;
  ba.pairs.argmax = a.argmax;
  ba.pairs.am_rows = nd;
  if (list) {
    ba.pairs.pq = reinterpret_cast<const uint32_t*>(s + o_pq);
    ba.pairs.pd = reinterpret_cast<const uint32_t*>(s + o_pd);
    ba.pairs.am_base = reinterpret_cast<const uint64_t*>(s + o_am);
    ba.q_pair_start = reinterpret_cast<const uint64_t*>(s + o_qps);
    ba.d_pair_start = reinterpret_cast<const uint64_t*>(s + o_dps);
    ba.d_pairs = reinterpret_cast<const uint64_t*>(s + o_dp);
  }
  ba.argmax = a.argmax;
  ba.grad = a.grad_scores;
  ba.grad_q = a.grad_queries;
  ba.grad_d = a.grad_documents;
  ba.flag = reinterpret_cast<ull*>(s + o_flag);
  MSC_CUDA(cudaMemsetAsync(ba.flag, 0xff, 16, stream));
  cudaError_t e = LaunchBackwardCheck(ba, stream);
  if (e != cudaSuccess) return CudaFail(e, "launching the backward check");
  if (a.grad_queries) {
    if (q.first_row) MSC_CUDA(cudaMemsetAsync(a.grad_queries, 0, q.first_row * dim * 4, stream));
    e = LaunchGradQ(ba, q.first_row, q.n_rows, stream);
    if (e != cudaSuccess) return CudaFail(e, "launching grad_Q");
  }
  if (a.grad_documents) {
    if (a.deterministic) {
      if (d.first_row) MSC_CUDA(cudaMemsetAsync(a.grad_documents, 0, d.first_row * dim * 4, stream));
      e = LaunchGradDDeterministic(ba, d.max_len, stream);
    } else {
      MSC_CUDA(cudaMemsetAsync(a.grad_documents, 0, d.n_rows * dim * 4, stream));
      e = LaunchGradDAtomic(ba, stream);
    }
    if (e != cudaSuccess) return CudaFail(e, "launching grad_D");
  }
  if (!b.sync_calls) return Status::Ok();
  ull flags[2];
  MSC_RETURN(ReadFlags(b, ba.flag, stream, flags));
  if (flags[1] != ~0ull) {
    return Fail(MAXSIM_ERR_NON_FINITE, "grad_scores[%llu] is not finite", static_cast<ull>(flags[1] - 1));
  }
  if (flags[0] != ~0ull) {
    return Fail(MAXSIM_ERR_INVALID_ARGUMENT,
                "argmax[%llu] is not -1 or a kept token of its document; pass the forward's argmax unchanged "
                "(gradients were not computed for it)", static_cast<ull>(flags[0] - 1));
  }
  return Status::Ok();
}

}  // namespace mscuda
