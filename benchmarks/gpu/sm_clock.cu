// SPDX-License-Identifier: Apache-2.0
// The SM clock a row's launches ran at (sm_clock.h). A stamp launch puts several small blocks on every SM; each
// records its SM, that SM's cycle counter and the global nanosecond timer. Stream order puts the row's calls between
// a stamp launch and the next, so per SM the cycles and nanoseconds between its last stamp before and its first stamp
// after cover the calls and the gaps between them.
#include "sm_clock.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

namespace {

struct Stamp {
  unsigned long long cycles;
  unsigned long long ns;
  unsigned int sm;
  unsigned int pad;
};

// Blocks per SM in a stamp launch. The hardware spreads them over the SMs, which in practice gives every SM some;
// nothing guarantees it, so each row reports how many SMs its stamps reached (SmClock::sms).
constexpr int kStampsPerSm = 8;

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
                "\"sm_ns_per_call\": %.0f, \"sm_clock_sms\": %d",
                mhz, mhz_low, mhz_high, cycles_per_call, ns_per_call, sms);
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
  std::vector<double> round_mhz, round_cycles, round_ns;
  double low = 0, high = 0;
  int fewest = 0;
  for (int r = 0; r < rounds && e == cudaSuccess; ++r) {
    StampKernel<<<blocks, 32, 0, stream>>>(dev);
    if ((e = cudaGetLastError()) != cudaSuccess) break;
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
    std::vector<double> mhz, cycles, ns;
    for (unsigned int sm = 0; sm <= top; ++sm) {
      const Stamp *b = before[sm], *f = after[sm];
      if (b == nullptr || f == nullptr || f->ns <= b->ns || f->cycles <= b->cycles) continue;
      const double c = static_cast<double>(f->cycles - b->cycles), t = static_cast<double>(f->ns - b->ns);
      mhz.push_back(c / t * 1e3);
      cycles.push_back(c / calls);
      ns.push_back(t / calls);
    }
    if (mhz.empty()) continue;
    const auto [lo, hi] = std::minmax_element(mhz.begin(), mhz.end());
    low = round_mhz.empty() ? *lo : std::min(low, *lo);
    high = round_mhz.empty() ? *hi : std::max(high, *hi);
    fewest = round_mhz.empty() ? static_cast<int>(mhz.size()) : std::min(fewest, static_cast<int>(mhz.size()));
    round_mhz.push_back(MedianOf(mhz));
    round_cycles.push_back(MedianOf(cycles));
    round_ns.push_back(MedianOf(ns));
  }
  cudaFree(dev);
  if (e == cudaSuccess && !round_mhz.empty()) {
    *out = SmClock{MedianOf(round_mhz), low, high, MedianOf(round_cycles), MedianOf(round_ns), fewest};
  }
  return e;
}

cudaError_t TimerAgainstHost(cudaStream_t stream, unsigned long long ns, double* ratio) {
  *ratio = 0;
  Stamp* dev = nullptr;
  cudaError_t e = cudaMalloc(&dev, 2 * sizeof(Stamp));
  if (e != cudaSuccess) return e;
  Stamp host[2];
  if ((e = cudaStreamSynchronize(stream)) == cudaSuccess) {
    const auto t0 = std::chrono::steady_clock::now();
    StampKernel<<<1, 32, 0, stream>>>(dev);
    SpinKernel<<<1, 32, 0, stream>>>(ns);
    StampKernel<<<1, 32, 0, stream>>>(dev + 1);
    if ((e = cudaGetLastError()) == cudaSuccess && (e = cudaStreamSynchronize(stream)) == cudaSuccess) {
      const double host_ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
      if ((e = cudaMemcpy(host, dev, sizeof(host), cudaMemcpyDeviceToHost)) == cudaSuccess && host[1].ns > host[0].ns) {
        *ratio = static_cast<double>(host[1].ns - host[0].ns) / host_ns;
      }
    }
  }
  cudaFree(dev);
  return e;
}

cudaError_t LaunchSpin(unsigned long long ns, cudaStream_t stream) {
  SpinKernel<<<1, 32, 0, stream>>>(ns);
  return cudaGetLastError();
}
