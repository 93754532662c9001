// SPDX-License-Identifier: Apache-2.0
// The SM clock a row's launches ran at (sm_clock.h). A stamp launch puts several small blocks on every SM; each
// records its SM, that SM's cycle counter and the global nanosecond timer. Stream order puts the row's calls between
// a stamp launch and the next, so per SM the cycles and nanoseconds between its last stamp before and its first stamp
// after cover the calls and the gaps between them.
#include "sm_clock.h"

#include <algorithm>
#include <cstdio>
#include <vector>

namespace {

struct Stamp {
  unsigned long long cycles;
  unsigned long long ns;
  unsigned int sm;
  unsigned int pad;
};

constexpr int kStampsPerSm = 8;  // blocks per SM in a stamp launch, so that every SM gets at least one

__global__ void StampKernel(Stamp* out) {
  if (threadIdx.x != 0) return;
  unsigned int sm;
  unsigned long long ns;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  const unsigned long long cycles = clock64();
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  out[blockIdx.x] = Stamp{cycles, ns, sm, 0};
}

__global__ void SpinKernel(unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

double MedianOf(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

std::string SmClock::Json() const {
  if (sms == 0) return "";
  char buf[200];
  std::snprintf(buf, sizeof(buf),
                "\"sm_mhz\": %.1f, \"sm_mhz_low\": %.1f, \"sm_mhz_high\": %.1f, \"sm_cycles_per_call\": %.0f, "
                "\"sm_clock_sms\": %d",
                mhz, mhz_low, mhz_high, cycles_per_call, sms);
  return buf;
}

cudaError_t MeasureSmClock(cudaStream_t stream, int sms, int rounds, int calls, const std::function<void(int)>& fn,
                           SmClock* out) {
  *out = SmClock{};
  if (sms <= 0 || rounds <= 0 || calls <= 0) return cudaErrorInvalidValue;
  const int blocks = kStampsPerSm * sms;
  Stamp* dev = nullptr;
  cudaError_t e = cudaMalloc(&dev, 2ull * blocks * sizeof(Stamp));
  if (e != cudaSuccess) return e;
  std::vector<Stamp> host(2ull * blocks);
  std::vector<double> round_mhz, round_cycles;
  double low = 0, high = 0;
  int fewest = 0;
  for (int r = 0; r < rounds && e == cudaSuccess; ++r) {
    StampKernel<<<blocks, 32, 0, stream>>>(dev);
    for (int i = 0; i < calls; ++i) fn(i);
    StampKernel<<<blocks, 32, 0, stream>>>(dev + blocks);
    if ((e = cudaGetLastError()) != cudaSuccess) break;
    if ((e = cudaMemcpyAsync(host.data(), dev, host.size() * sizeof(Stamp), cudaMemcpyDeviceToHost, stream)) !=
            cudaSuccess ||
        (e = cudaStreamSynchronize(stream)) != cudaSuccess) {
      break;
    }
    unsigned int top = 0;
    for (const Stamp& s : host) top = std::max(top, s.sm);
    std::vector<const Stamp*> before(top + 1, nullptr), after(top + 1, nullptr);
    for (int b = 0; b < blocks; ++b) {
      const Stamp& s = host[b];
      if (before[s.sm] == nullptr || s.ns > before[s.sm]->ns) before[s.sm] = &s;
      const Stamp& t = host[blocks + b];
      if (after[t.sm] == nullptr || t.ns < after[t.sm]->ns) after[t.sm] = &t;
    }
    std::vector<double> mhz, cycles;
    for (unsigned int sm = 0; sm <= top; ++sm) {
      if (before[sm] == nullptr || after[sm] == nullptr || after[sm]->ns <= before[sm]->ns) continue;
      const double c = static_cast<double>(after[sm]->cycles - before[sm]->cycles);
      mhz.push_back(c / static_cast<double>(after[sm]->ns - before[sm]->ns) * 1e3);
      cycles.push_back(c / calls);
    }
    if (mhz.empty()) continue;
    const auto [lo, hi] = std::minmax_element(mhz.begin(), mhz.end());
    low = round_mhz.empty() ? *lo : std::min(low, *lo);
    high = round_mhz.empty() ? *hi : std::max(high, *hi);
    fewest = round_mhz.empty() ? static_cast<int>(mhz.size()) : std::min(fewest, static_cast<int>(mhz.size()));
    round_mhz.push_back(MedianOf(mhz));
    round_cycles.push_back(MedianOf(cycles));
  }
  cudaFree(dev);
  if (e == cudaSuccess && !round_mhz.empty()) {
    *out = SmClock{MedianOf(round_mhz), low, high, MedianOf(round_cycles), fewest};
  }
  return e;
}

cudaError_t LaunchSpin(unsigned long long ns, cudaStream_t stream) {
  SpinKernel<<<1, 32, 0, stream>>>(ns);
  return cudaGetLastError();
}
