// SPDX-License-Identifier: Apache-2.0
// The floors under a synchronous public call with a host query in and host scores out (not a test; no library):
// how long after a kernel's end the host knows it ended, by each way of waiting, and what each way of getting the
// query to the kernel costs, on a memory-bound kernel of the textual-1k scoring kernel's size (one block per SM,
// 256 threads, ~77 MB read, 1000 scores out). Every "call" row is a loop of whole calls timed with the host clock
// (median of per-call times); "kernel-only" rows are the same kernels back to back between CUDA events.
//   wait: stream-sync (cudaStreamSynchronize), event-sync (cudaEventRecord + cudaEventSynchronize), write-value
//   (cuStreamWriteValue32 of a mapped pinned word after the kernel, the host spinning on it), last-block (the
//   kernel's last block to finish writes the word with a system-scope release, the host spinning on it).
//   query: h2d (pinned stage + cudaMemcpyAsync before the kernel, the library's path), param (the query inside the
//   kernel's parameters, __grid_constant__; 8 KB queries only), mapped (every block reads the query from the mapped
//   pinned stage), fetch (block 0 reads it from the mapped stage into device memory, the other blocks wait for its
//   release), pdl (a one-block kernel copies it from the mapped stage, the scoring kernel launched as its
//   programmatic dependent waits for it with cudaGridDependencySynchronize), empty (no query, an empty kernel).
//   scores: mapped (written by the kernel into mapped pinned memory, the library's path) or d2h (device + a copy).
// Usage: api_floor_probe [--bytes N] [--query-bytes 8192|32768] [--iters N] [--json FILE]
#include <cuda.h>
#include <cuda_runtime.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "cuda_check.h"

namespace {

constexpr int kThreads = 256;
constexpr uint32_t kParamQueryBytes = 8192;  // 32 tokens x 128 dims x bf16: the textual query
constexpr uint32_t kMaxQueryBytes = 32768;   // 128 tokens (q128)
constexpr uint32_t kDocs = 1000;

struct QueryParam {
  uint4 v[kParamQueryBytes / 16];
};

// Reads `words` uint4 from `docs` (block-strided slices), folds them with the query in shared memory, writes one
// float per document of its slice to `out`; when `done` is set, the last block to finish writes `seq` to *flag with
// a system-scope release after every block's results were made visible system-wide.
__device__ void Body(const uint4* __restrict__ docs, uint64_t words, const uint4* q_smem, uint32_t q_words, float* out,
                     unsigned* done, unsigned* flag, unsigned seq) {
  const uint64_t per_block = (words + gridDim.x - 1) / gridDim.x;
  const uint64_t w0 = blockIdx.x * per_block, w1 = min(words, w0 + per_block);
  unsigned acc = 0;
  for (uint64_t w = w0 + threadIdx.x; w < w1; w += kThreads) {
    uint4 x;
    asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(x.x), "=r"(x.y), "=r"(x.z), "=r"(x.w) : "l"(docs + w));
    const uint4 qv = q_smem[w & (q_words - 1)];
    acc += (x.x ^ qv.x) + (x.y ^ qv.y) + (x.z ^ qv.z) + (x.w ^ qv.w);
  }
  __shared__ unsigned red[kThreads];
  red[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
    __syncthreads();
  }
  const uint32_t d0 = blockIdx.x * kDocs / gridDim.x, d1 = (blockIdx.x + 1) * kDocs / gridDim.x;
  for (uint32_t d = d0 + threadIdx.x; d < d1; d += kThreads) out[d] = static_cast<float>(red[0] & 0xffff) + d;
  if (done == nullptr) return;
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned prev = atomicAdd(done, 1u);
    if (prev == gridDim.x - 1) {
      *done = 0;
      __threadfence_system();
      asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(flag), "r"(seq) : "memory");
    }
  }
}

__device__ void LoadQuery(const uint4* q, uint4* smem, uint32_t q_words) {
  for (uint32_t i = threadIdx.x; i < q_words; i += kThreads) smem[i] = q[i];
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads) PtrKernel(const uint4* docs, uint64_t words, const uint4* q, uint32_t q_words,
                                                      float* out, unsigned* done, unsigned* flag, unsigned seq) {
  extern __shared__ uint4 qs[];
  LoadQuery(q, qs, q_words);
  Body(docs, words, qs, q_words, out, done, flag, seq);
}

__global__ void __launch_bounds__(kThreads) ParamKernel(const uint4* docs, uint64_t words, const __grid_constant__ QueryParam q,
                                                        float* out, unsigned* done, unsigned* flag, unsigned seq) {
  extern __shared__ uint4 qs[];
  LoadQuery(q.v, qs, kParamQueryBytes / 16);
  Body(docs, words, qs, kParamQueryBytes / 16, out, done, flag, seq);
}

// Block 0 reads the query from mapped host memory (one pass over the bus), copies it to `dq` and releases
// *ready = seq; the other blocks wait for that, then read dq (from L2).
__global__ void __launch_bounds__(kThreads) FetchKernel(const uint4* docs, uint64_t words, const uint4* host_q, uint4* dq,
                                                        uint32_t q_words, unsigned* ready, float* out, unsigned* done,
                                                        unsigned* flag, unsigned seq) {
  extern __shared__ uint4 qs[];
  if (blockIdx.x == 0) {
    for (uint32_t i = threadIdx.x; i < q_words; i += kThreads) {
      const uint4 v = host_q[i];
      qs[i] = v;
      dq[i] = v;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(ready), "r"(seq) : "memory");
    }
  } else {
    if (threadIdx.x == 0) {
      unsigned v = 0;
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(ready) : "memory");
      } while (v != seq);
    }
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < q_words; i += kThreads) qs[i] = __ldcg(dq + i);
    __syncthreads();
  }
  Body(docs, words, qs, q_words, out, done, flag, seq);
}

// One block copies the query from mapped host memory to dq, then lets the dependent launch proceed (sm_90+; on
// older devices the launches simply follow each other).
__global__ void __launch_bounds__(kThreads) CopyQueryKernel(const uint4* host_q, uint4* dq, uint32_t q_words) {
  for (uint32_t i = threadIdx.x; i < q_words; i += kThreads) dq[i] = host_q[i];
  __syncthreads();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}

// The consumer of a programmatic dependent launch: starts while CopyQueryKernel runs, waits for it before the
// query load.
__global__ void __launch_bounds__(kThreads) PdlKernel(const uint4* docs, uint64_t words, const uint4* q, uint32_t q_words,
                                                      float* out, unsigned* done, unsigned* flag, unsigned seq) {
  extern __shared__ uint4 qs[];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
#endif
  LoadQuery(q, qs, q_words);
  Body(docs, words, qs, q_words, out, done, flag, seq);
}

__global__ void EmptyKernel(unsigned* done, unsigned* flag, unsigned seq) {
  if (done != nullptr && threadIdx.x == 0 && blockIdx.x == 0) {
    __threadfence_system();
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(flag), "r"(seq) : "memory");
  }
}

using WriteValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

double NowUs() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Row {
  std::string name;
  double us;
};

}  // namespace

int main(int argc, char** argv) {
  uint64_t bytes = 1000ull * 300 * 256;  // textual-1k: 1000 documents x 300 tokens x 128 bf16
  uint32_t qbytes = kParamQueryBytes;
  int iters = 300;
  const char* json = nullptr;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--bytes")) bytes = std::strtoull(argv[i + 1], nullptr, 10);
    if (!std::strcmp(argv[i], "--query-bytes")) qbytes = static_cast<uint32_t>(std::strtoul(argv[i + 1], nullptr, 10));
    if (!std::strcmp(argv[i], "--iters")) iters = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--json")) json = argv[i + 1];
  }
  if (qbytes < 16 || qbytes > kMaxQueryBytes || (qbytes & (qbytes - 1)) != 0) {
    std::fprintf(stderr, "--query-bytes: a power of two from 16 to %u\n", kMaxQueryBytes);
    return 2;
  }
  const uint32_t q_words = qbytes / 16;
  CK(cudaSetDevice(0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int grid = prop.multiProcessorCount;
  for (const void* k : {reinterpret_cast<const void*>(PtrKernel), reinterpret_cast<const void*>(ParamKernel),
                        reinterpret_cast<const void*>(FetchKernel), reinterpret_cast<const void*>(PdlKernel)}) {
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxQueryBytes));
  }
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t ev, e0, e1;
  CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const uint64_t words = bytes / 16;
  uint4* docs = nullptr;
  uint4* dq = nullptr;
  float* dout = nullptr;
  unsigned* done = nullptr;  // [0]: last-block counter, [1]: fetch-ready word
  CK(cudaMalloc(&docs, std::max<uint64_t>(16, words * 16)));
  CK(cudaMemset(docs, 1, std::max<uint64_t>(16, words * 16)));
  CK(cudaMalloc(&dq, kMaxQueryBytes));
  CK(cudaMalloc(&dout, kDocs * 4));
  CK(cudaMalloc(&done, 8));
  CK(cudaMemset(done, 0, 8));
  constexpr uint32_t kScores = kMaxQueryBytes, kFlag = kMaxQueryBytes + 8192;
  uint8_t* pin = nullptr;  // [0, 32K): query stage, [32K, 36K): scores, [40K]: flag
  CK(cudaHostAlloc(reinterpret_cast<void**>(&pin), 65536, cudaHostAllocMapped | cudaHostAllocPortable));
  uint8_t* pin_dev = nullptr;
  CK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&pin_dev), pin, 0));
  std::memset(pin, 0, 65536);
  volatile unsigned* hflag = reinterpret_cast<volatile unsigned*>(pin + kFlag);
  unsigned* dflag = reinterpret_cast<unsigned*>(pin_dev + kFlag);
  float* mapped_out = reinterpret_cast<float*>(pin_dev + kScores);
  std::vector<uint8_t> user_query(qbytes, 3);
  std::vector<float> user_scores(kDocs);
  QueryParam qp;
  WriteValue32 write_value = nullptr;
  {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &fn, 12000, cudaEnableDefault, &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess) {
      write_value = reinterpret_cast<WriteValue32>(fn);
    }
  }
  cudaLaunchAttribute pdl_attr;
  pdl_attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl_attr.val.programmaticStreamSerializationAllowed = 1;
  unsigned seq = 0;
  enum Query { kH2d, kParam, kMapped, kFetch, kPdl, kNone };
  enum Wait { kStreamSync, kEventSync, kWriteValue, kLastBlock };
  const uint4* host_q = reinterpret_cast<const uint4*>(pin_dev);
  auto launch = [&](Query qm, float* out, unsigned* dn, unsigned s) {
    switch (qm) {
      case kNone:
        EmptyKernel<<<grid, kThreads, 0, st>>>(dn, dflag, s);
        break;
      case kParam:
        ParamKernel<<<grid, kThreads, kParamQueryBytes, st>>>(docs, words, qp, out, dn, dflag, s);
        break;
      case kH2d:
        PtrKernel<<<grid, kThreads, qbytes, st>>>(docs, words, dq, q_words, out, dn, dflag, s);
        break;
      case kMapped:
        PtrKernel<<<grid, kThreads, qbytes, st>>>(docs, words, host_q, q_words, out, dn, dflag, s);
        break;
      case kFetch:
        FetchKernel<<<grid, kThreads, qbytes, st>>>(docs, words, host_q, dq, q_words, done + 1, out, dn, dflag, s);
        break;
      case kPdl: {
        CopyQueryKernel<<<1, kThreads, 0, st>>>(host_q, dq, q_words);
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(grid);
        cfg.blockDim = dim3(kThreads);
        cfg.dynamicSmemBytes = qbytes;
        cfg.stream = st;
        cfg.attrs = &pdl_attr;
        cfg.numAttrs = 1;
        CK(cudaLaunchKernelEx(&cfg, PdlKernel, static_cast<const uint4*>(docs), words, static_cast<const uint4*>(dq),
                              q_words, out, dn, dflag, s));
        break;
      }
    }
  };
  // One whole call: the caller's query into the stage (or the parameters), the kernel, the wait, the scores out.
  auto call = [&](Query qm, Wait w, bool mapped_scores) {
    ++seq;
    float* out = mapped_scores ? mapped_out : dout;
    unsigned* dn = w == kLastBlock ? done : nullptr;
    if (w == kWriteValue || w == kLastBlock) *hflag = 0;
    if (qm == kParam) {
      std::memcpy(&qp, user_query.data(), kParamQueryBytes);
    } else if (qm != kNone) {
      std::memcpy(pin, user_query.data(), qbytes);
      if (qm == kH2d) CK(cudaMemcpyAsync(dq, pin, qbytes, cudaMemcpyHostToDevice, st));
    }
    launch(qm, out, dn, seq);
    if (!mapped_scores && qm != kNone) CK(cudaMemcpyAsync(pin + kScores, dout, kDocs * 4, cudaMemcpyDeviceToHost, st));
    switch (w) {
      case kStreamSync:
        CK(cudaStreamSynchronize(st));
        break;
      case kEventSync:
        CK(cudaEventRecord(ev, st));
        CK(cudaEventSynchronize(ev));
        break;
      case kWriteValue:
        if (write_value(st, reinterpret_cast<CUdeviceptr>(dflag), seq, 0) != CUDA_SUCCESS) {
          std::fprintf(stderr, "cuStreamWriteValue32 failed\n");
          std::exit(1);
        }
        while (*hflag != seq) _mm_pause();
        break;
      case kLastBlock:
        while (*hflag != seq) _mm_pause();
        break;
    }
    if (qm != kNone) std::memcpy(user_scores.data(), pin + kScores, kDocs * 4);
  };
  const char* qname[] = {"h2d", "param", "mapped", "fetch", "pdl", "empty"};
  const char* wname[] = {"stream-sync", "event-sync", "write-value", "last-block"};
  struct Case {
    Query q;
    Wait w;
    bool mapped;
  };
  std::vector<Case> cases;
  for (Wait w : {kStreamSync, kEventSync, kWriteValue, kLastBlock}) {
    if (w == kWriteValue && write_value == nullptr) continue;
    cases.push_back({kNone, w, true});
    cases.push_back({kH2d, w, true});
  }
  if (qbytes == kParamQueryBytes) cases.push_back({kParam, kStreamSync, true});
  cases.push_back({kMapped, kStreamSync, true});
  cases.push_back({kFetch, kStreamSync, true});
  cases.push_back({kPdl, kStreamSync, true});
  cases.push_back({kH2d, kStreamSync, false});
  std::vector<std::vector<double>> wall(cases.size());
  // Kernel-only: each flavour back to back between events (no host wait inside; the query already in place).
  std::vector<Query> kflavours = {kH2d, kMapped, kFetch, kPdl};
  if (qbytes == kParamQueryBytes) kflavours.push_back(kParam);
  std::vector<std::vector<double>> kernel(kflavours.size());
  std::vector<double> kernel_lastblock;
  auto kernel_only = [&](const std::function<void()>& fn) {
    for (int i = 0; i < 20; ++i) fn();
    CK(cudaEventRecord(e0, st));
    for (int i = 0; i < 100; ++i) fn();
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return ms * 1000.0 / 100;
  };
  std::memcpy(pin, user_query.data(), qbytes);
  CK(cudaMemcpy(dq, pin, qbytes, cudaMemcpyHostToDevice));
  for (int round = 0; round < 3; ++round) {
    for (size_t c = 0; c < cases.size(); ++c) {
      const size_t k = round % 2 ? cases.size() - 1 - c : c;  // alternate the order between rounds
      const Case cs = cases[k];
      for (int i = 0; i < 30; ++i) call(cs.q, cs.w, cs.mapped);
      std::vector<double> t;
      for (int i = 0; i < iters; ++i) {
        const double t0 = NowUs();
        call(cs.q, cs.w, cs.mapped);
        t.push_back(NowUs() - t0);
      }
      wall[k].push_back(Median(t));
    }
    for (size_t f = 0; f < kflavours.size(); ++f) {
      kernel[f].push_back(kernel_only([&] { launch(kflavours[f], mapped_out, nullptr, ++seq); }));
    }
    kernel_lastblock.push_back(kernel_only([&] { launch(kH2d, mapped_out, done, ++seq); }));
    CK(cudaStreamSynchronize(st));
  }
  CK(cudaGetLastError());
  std::vector<Row> rows;
  for (size_t f = 0; f < kflavours.size(); ++f) {
    rows.push_back({std::string("kernel-only query=") + qname[kflavours[f]], Median(kernel[f])});
  }
  rows.push_back({"kernel-only query=h2d last-block-signal", Median(kernel_lastblock)});
  for (size_t k = 0; k < cases.size(); ++k) {
    rows.push_back({std::string("call query=") + qname[cases[k].q] + " wait=" + wname[cases[k].w] +
                        " scores=" + (cases[k].mapped ? "mapped" : "d2h"),
                    Median(wall[k])});
  }
  const double base = rows[0].us;
  std::printf("api_floor_probe: %s, %d SMs, %.1f MB read per call, %u-byte query, %d calls per row, medians of 3 "
              "rounds (us)\n", prop.name, grid, bytes / 1e6, qbytes, iters);
  for (const Row& r : rows) {
    std::printf("  %-58s %8.2f  (%+.2f over kernel-only query=h2d)\n", r.name.c_str(), r.us, r.us - base);
  }
  if (json) {
    std::string command;
    for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
    char date[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    int driver = 0;
    cudaDriverGetVersion(&driver);
    FILE* f = std::fopen(json, "w");
    if (!f) return 1;
    std::fprintf(f,
                 "{\"command\": \"%s\", \"date\": \"%s\", \"device\": \"%s\", \"driver\": %d, \"bytes\": %llu, "
                 "\"query_bytes\": %u, \"iters\": %d, \"rows\": [",
                 command.c_str(), date, prop.name, driver, static_cast<unsigned long long>(bytes), qbytes, iters);
    for (size_t i = 0; i < rows.size(); ++i) {
      std::fprintf(f, "%s{\"name\": \"%s\", \"us\": %.3f}", i ? ", " : "", rows[i].name.c_str(), rows[i].us);
    }
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }
  return 0;
}
