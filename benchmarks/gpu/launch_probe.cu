// SPDX-License-Identifier: Apache-2.0
// What a launch of a given shape costs before any work (not a test; no library): empty kernels back to back in one
// CUDA graph, timed between CUDA events, by grid, block, dynamic shared memory per block and parameter bytes, so that a
// scoring kernel's launch shape can be read against a bare one. The rows name the shapes they stand for: the ring
// kernel's (ExactTcPipeKernel: one 256-thread block per SM, 200 KB of dynamic shared memory, its 488-byte
// ForwardArgs) and a grid of 1000 128-thread blocks with 64 KB each (late-interaction-kernels' textual-1k launch).
// Each row: the median over rounds of (events time / launches).
// Usage: launch_probe [--launches N] [--rounds N] [--json FILE]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_check.h"

namespace {

template <int BYTES>
struct Params {
  unsigned char b[BYTES];
};

// Does nothing unless its first parameter byte is 1 (never, here), so the launch is all there is.
template <int BYTES>
__global__ void EmptyKernel(const __grid_constant__ Params<BYTES> p, unsigned* sink) {
  extern __shared__ unsigned char smem[];
  if (p.b[0] == 1) {
    smem[threadIdx.x] = p.b[BYTES - 1];
    __syncthreads();
    if (threadIdx.x == 0) *sink = smem[1];
  }
}

struct Row {
  std::string name;
  double us;
};

template <int BYTES>
double TimeLaunches(int grid, int block, int smem, int launches, int rounds, cudaStream_t s, unsigned* sink) {
  CK(cudaFuncSetAttribute(EmptyKernel<BYTES>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  Params<BYTES> p{};
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  // The launches are captured into one CUDA graph and replayed: enqueued one by one from the host, empty kernels
  // come no faster than the host issues them (about 4.5-5 us each on the H100 machine), which hides the device's own
  // cost per launch.
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < launches; ++i) EmptyKernel<BYTES><<<grid, block, smem, s>>>(p, sink);
  CK(cudaStreamEndCapture(s, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<double> per;
  for (int r = 0; r < rounds + 1; ++r) {  // round 0 warms up
    CK(cudaEventRecord(a, s));
    CK(cudaGraphLaunch(exec, s));
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    if (r > 0) per.push_back(1000.0 * ms / launches);
  }
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(per.begin(), per.end());
  return per[per.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int launches = 1000, rounds = 5;
  const char* json = nullptr;
  for (int i = 1; i < argc; ++i) {
    const bool more = i + 1 < argc;
    if (!std::strcmp(argv[i], "--launches") && more) {
      launches = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--rounds") && more) {
      rounds = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--json") && more) {
      json = argv[++i];
    } else {
      std::fprintf(stderr, "usage: launch_probe [--launches N] [--rounds N] [--json FILE]\n");
      return 2;
    }
  }
  if (launches < 1 || rounds < 1) {
    std::fprintf(stderr, "launch_probe: --launches and --rounds must be positive\n");
    return 2;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  unsigned* sink = nullptr;
  CK(cudaMalloc(&sink, 4));
  constexpr int kRingSmem = 8 * 3 * 8192 + 32 * 256;  // exact.cu: 8 warps x 3 stages x 8 KB + the query
  std::vector<Row> rows;
  auto add = [&](const std::string& name, double us) { rows.push_back({name, us}); };
  const std::string g = std::to_string(sms);
  add(g + " x 256, no shared memory, 8-byte parameters", TimeLaunches<8>(sms, 256, 0, launches, rounds, s, sink));
  add(g + " x 256, no shared memory, 488-byte parameters", TimeLaunches<488>(sms, 256, 0, launches, rounds, s, sink));
  add(g + " x 256, 200 KB shared memory, 8-byte parameters",
      TimeLaunches<8>(sms, 256, kRingSmem, launches, rounds, s, sink));
  add(g + " x 256, 200 KB shared memory, 488-byte parameters (the ring's launch)",
      TimeLaunches<488>(sms, 256, kRingSmem, launches, rounds, s, sink));
  add("1000 x 128, no shared memory, 64-byte parameters", TimeLaunches<64>(1000, 128, 0, launches, rounds, s, sink));
  add("1000 x 128, 64 KB shared memory, 64-byte parameters (the peer's textual-1k launch)",
      TimeLaunches<64>(1000, 128, 65536, launches, rounds, s, sink));
  add("1000 x 128, 64 KB shared memory, 488-byte parameters",
      TimeLaunches<488>(1000, 128, 65536, launches, rounds, s, sink));
  std::printf("launch_probe: %s, %d SMs; empty kernels back to back in a graph, us per launch (median of %d rounds of %d)\n",
              prop.name, sms, rounds, launches);
  for (const Row& r : rows) std::printf("  %-80s %7.3f\n", r.name.c_str(), r.us);
  if (json) {
    FILE* f = std::fopen(json, "w");
    if (!f) {
      std::fprintf(stderr, "launch_probe: cannot write %s\n", json);
      return 1;
    }
    std::fprintf(f, "{\"device\": \"%s\", \"sms\": %d, \"launches\": %d, \"rounds\": %d, \"rows\": [", prop.name, sms,
                 launches, rounds);
    for (size_t i = 0; i < rows.size(); ++i) {
      std::fprintf(f, "%s{\"name\": \"%s\", \"us\": %.4f}", i ? ", " : "", rows[i].name.c_str(), rows[i].us);
    }
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }
  CK(cudaFree(sink));
  CK(cudaStreamDestroy(s));
  return 0;
}
