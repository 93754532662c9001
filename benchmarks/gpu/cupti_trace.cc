// SPDX-License-Identifier: Apache-2.0
// A timeline of a process's CUDA work for benchmarks/gpu/trace_report.py, on machines without Nsight Systems:
// a CUPTI injection library (CUDA_INJECTION64_PATH=libmaxsim_cupti_trace.so; the driver loads it at cuInit and
// calls InitializeInjection). It records every runtime and driver API call (host thread, start, end), every
// kernel, memcpy and memset (device start, end, stream, bytes) and the host's waits (stream, event and context
// synchronisations), and writes them to $MAXSIM_TRACE_OUT (one tab-separated line per record) at exit.
// Programs mark where their calls begin with maxsim_trace_mark(name) (looked up with dlsym, so they run unchanged
// without the tracer). All times are CUPTI timestamps (ns), host and device alike.
#include <cupti.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr size_t kBufferBytes = 8u << 20;

struct Mark {
  uint64_t at;
  std::string name;
};

std::mutex g_mu;
std::vector<std::string> g_lines;  // formatted records, written at exit
std::vector<Mark> g_marks;
bool g_started = false;

void Check(CUptiResult r, const char* what) {
  if (r != CUPTI_SUCCESS) {
    const char* s = nullptr;
    cuptiGetResultString(r, &s);
    std::fprintf(stderr, "cupti_trace: %s failed: %s\n", what, s ? s : "?");
  }
}

void CUPTIAPI Requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

std::string ApiName(CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  const char* name = nullptr;
  if (cuptiGetCallbackName(domain, cbid, &name) == CUPTI_SUCCESS && name) return name;
  return (domain == CUPTI_CB_DOMAIN_DRIVER_API ? "driver-" : "runtime-") + std::to_string(cbid);
}

void CUPTIAPI Completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::vector<std::string> lines;
  CUpti_Activity* rec = nullptr;
  char line[1200];
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    line[0] = '\0';
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
        std::snprintf(line, sizeof(line), "kernel\t%llu\t%llu\t%s\t%u\t%u\t%u,%u,%u/%u", (unsigned long long)k->start,
                      (unsigned long long)k->end, k->name ? k->name : "?", k->correlationId, k->streamId, k->gridX,
                      k->gridY, k->gridZ, k->blockX);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
        std::snprintf(line, sizeof(line), "memcpy\t%llu\t%llu\tkind%u\t%u\t%u\t%llu", (unsigned long long)m->start,
                      (unsigned long long)m->end, (unsigned)m->copyKind, m->correlationId, m->streamId,
                      (unsigned long long)m->bytes);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
        std::snprintf(line, sizeof(line), "memset\t%llu\t%llu\tmemset\t%u\t%u\t%llu", (unsigned long long)m->start,
                      (unsigned long long)m->end, m->correlationId, m->streamId, (unsigned long long)m->bytes);
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME:
      case CUPTI_ACTIVITY_KIND_DRIVER: {
        const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(rec);
        const bool drv = rec->kind == CUPTI_ACTIVITY_KIND_DRIVER;
        std::snprintf(line, sizeof(line), "%s\t%llu\t%llu\t%s\t%u\t%u\t", drv ? "driver" : "runtime",
                      (unsigned long long)a->start, (unsigned long long)a->end,
                      ApiName(drv ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid).c_str(),
                      a->correlationId, a->threadId);
        break;
      }
      case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
        const auto* s = reinterpret_cast<const CUpti_ActivitySynchronization2*>(rec);
        std::snprintf(line, sizeof(line), "sync\t%llu\t%llu\tsync-type%d\t%u\t%u\t", (unsigned long long)s->start,
                      (unsigned long long)s->end, static_cast<int>(s->type), s->correlationId, s->streamId);
        break;
      }
      default:
        break;
    }
    if (line[0]) lines.emplace_back(line);
  }
  size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped);
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_mu);
  if (dropped) g_lines.push_back("dropped\t0\t0\t" + std::to_string(dropped) + "\t0\t0\t");
  for (std::string& l : lines) g_lines.push_back(std::move(l));
}

void WriteAll() {
  if (!g_started) return;
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  const char* path = std::getenv("MAXSIM_TRACE_OUT");
  FILE* f = std::fopen(path && path[0] ? path : "cupti-trace.tsv", "w");
  if (!f) return;
  std::lock_guard<std::mutex> lock(g_mu);
  for (const Mark& m : g_marks) {
    std::fprintf(f, "mark\t%llu\t%llu\t%s\t0\t0\t\n", (unsigned long long)m.at, (unsigned long long)m.at, m.name.c_str());
  }
  for (const std::string& l : g_lines) std::fprintf(f, "%s\n", l.c_str());
  std::fclose(f);
}

}  // namespace

extern "C" {

// Called by the CUDA driver when CUDA_INJECTION64_PATH names this library.
__attribute__((visibility("default"))) int InitializeInjection(void) {
  Check(cuptiActivityRegisterCallbacks(Requested, Completed), "cuptiActivityRegisterCallbacks");
  for (CUpti_ActivityKind k : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                               CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER,
                               CUPTI_ACTIVITY_KIND_SYNCHRONIZATION}) {
    Check(cuptiActivityEnable(k), "cuptiActivityEnable");
  }
  g_started = true;
  std::atexit(WriteAll);
  return 1;
}

// A named point on the host's timeline (the start of a call the report groups the records by).
__attribute__((visibility("default"))) void maxsim_trace_mark(const char* name) {
  uint64_t t = 0;
  cuptiGetTimestamp(&t);
  std::lock_guard<std::mutex> lock(g_mu);
  g_marks.push_back({t, name ? name : ""});
}

}  // extern "C"
