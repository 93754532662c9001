// SPDX-License-Identifier: Apache-2.0
#include "context.h"

#include <algorithm>
#include <cerrno>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <set>
#include <vector>

#include "cpu_features.h"
#include "packed.h"
#include "packed_handle.h"
#include "packer.h"

#ifdef _OPENMP
#include <omp.h>
#include <pthread.h>
#endif

namespace maxsim {
namespace {

using ull = unsigned long long;

Mutex g_contexts_mu;
std::set<maxsim_context*> g_contexts;

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string FromOptionOrEnv(const char* option, const char* env, const char* fallback, std::string* source) {
  if (option && option[0]) {
    *source = "set by the options";
    return option;
  }
  if (const char* e = std::getenv(env); e && e[0]) {
    *source = std::string("set by ") + env + "=" + e;
    return e;
  }
  *source = "default";
  return fallback;
}

void HostLog(void* host_data, maxsim_log_level level, const char* message) {
  const auto* ctx = static_cast<const maxsim_context*>(host_data);
  if (ctx && message) ctx->Log(level, message);
}

// The most threads a context runs: the same limit as MAXSIM_NUM_THREADS and the CLI's --threads.
constexpr int kMaxThreads = 4096;

#ifdef _OPENMP
// Checks that this process may run `n` threads at once by starting n - 1 that wait until all have started (the
// calling thread is the n-th). libgomp cannot report a failure to create a team member: it prints "Thread
// creation failed" and exits the process. A count the process limits (ulimit -u, cgroup pids.max, address
// space) would not allow is therefore refused here, with a status. The probe threads use the default stack size,
// as libgomp's do unless OMP_STACKSIZE is set.
Status ProbeThreads(int n, const std::string& source) {
  if (n <= 1) return Status::Ok();
  pthread_rwlock_t gate = PTHREAD_RWLOCK_INITIALIZER;
  pthread_rwlock_wrlock(&gate);
  std::vector<pthread_t> started;
  started.reserve(static_cast<size_t>(n - 1));
  int err = 0;
  for (int i = 1; i < n; ++i) {
    pthread_t t;
    err = pthread_create(&t, nullptr, [](void* g) -> void* {
      auto* gate_lock = static_cast<pthread_rwlock_t*>(g);
      pthread_rwlock_rdlock(gate_lock);
      pthread_rwlock_unlock(gate_lock);
      return nullptr;
    }, &gate);
    if (err != 0) break;
    started.push_back(t);
  }
  pthread_rwlock_unlock(&gate);
  for (pthread_t t : started) pthread_join(t, nullptr);
  pthread_rwlock_destroy(&gate);
  if (err == 0) return Status::Ok();
  return Error(MAXSIM_ERR_INVALID_ARGUMENT,
               "%d threads (%s) cannot run in this process: starting thread %zu failed (%s); the process or user "
               "thread limit (ulimit -u, cgroup pids.max) or the address space is exhausted; ask for fewer threads",
               n, source.c_str(), started.size() + 2, std::strerror(err));
}
#endif  // _OPENMP

// num_threads: 0 reads MAXSIM_NUM_THREADS, else OpenMP's default; 1..4096 is used as given once ProbeThreads
// shows the process can run that many; anything else is refused with a status (never capped silently).
Status SelectThreads(const maxsim_options& o, maxsim_context* ctx) {
  if (o.num_threads < 0 || o.num_threads > kMaxThreads) {
    return Error(MAXSIM_ERR_INVALID_ARGUMENT,
                 "num_threads is %d: use 0 for the default (MAXSIM_NUM_THREADS, else one per core) or a count from 1 "
                 "to %d", o.num_threads, kMaxThreads);
  }
  if (o.num_threads > 0) {
    ctx->threads = o.num_threads;
    ctx->threads_source = "set by the options";
  } else if (const char* e = std::getenv("MAXSIM_NUM_THREADS"); e && e[0]) {
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(e, &end, 10);
    if (end == e || *end != '\0' || errno == ERANGE || n <= 0 || n > kMaxThreads) {
      return Error(MAXSIM_ERR_INVALID_ARGUMENT, "MAXSIM_NUM_THREADS='%s' is not a thread count from 1 to %d", e,
                   kMaxThreads);
    }
    ctx->threads = static_cast<int>(n);
    ctx->threads_source = std::string("set by MAXSIM_NUM_THREADS=") + e;
  } else {
#ifdef _OPENMP
    ctx->threads = std::clamp(omp_get_max_threads(), 1, kMaxThreads);
    ctx->threads_source = "OpenMP default";
#else
    ctx->threads = 1;
    ctx->threads_source = "built without OpenMP";
#endif
  }
#ifdef _OPENMP
  return ProbeThreads(ctx->threads, ctx->threads_source);
#else
  return Status::Ok();
#endif
}

// The selected kernel's variant (KernelOps::variants): forced by its environment variable, else the kernel's
// own decision. An unknown name, or a variant that cannot run here, is refused.
Status SelectVariant(maxsim_context* ctx) {
  const KernelVariants* v = ctx->kernel->ops->variants;
  if (v == nullptr) return Status::Ok();
  std::string source;
  const std::string want = Lower(FromOptionOrEnv(nullptr, v->env, "", &source));
  std::string known, why;
  if (want.empty() || want == "auto") {
    ctx->kernel_variant = v->decide(&why);
    ctx->kernel_variant_note = Format("%s: %s (chosen by speed: %s; %s=%s", v->what, v->names[ctx->kernel_variant],
                                      why.c_str(), v->env, v->names[0]);
    for (int i = 1; v->names[i] != nullptr; ++i) ctx->kernel_variant_note += std::string("|") + v->names[i];
    ctx->kernel_variant_note += " forces one; the bits are the same)";
    return Status::Ok();
  }
  for (int i = 0; i < 4 && v->names[i] != nullptr; ++i) {
    if (want != v->names[i]) {
      known += std::string(", ") + v->names[i];
      continue;
    }
    if (!v->runs(i, &why)) {
      return Error(MAXSIM_ERR_BACKEND_UNAVAILABLE, "%s (%s) cannot run here: %s", v->names[i], source.c_str(),
                   why.c_str());
    }
    ctx->kernel_variant = i;
    ctx->kernel_variant_note = Format("%s: %s (forced, %s)", v->what, v->names[i], source.c_str());
    return Status::Ok();
  }
  return Error(MAXSIM_ERR_INVALID_ARGUMENT, "'%s' (%s) is not a path for %s in kernel %s; known: auto%s",
               want.c_str(), source.c_str(), v->what, ctx->kernel->name, known.c_str());
}

// The kernel `isa` names (NULL or "": MAXSIM_ISA, else the best available) and why it was chosen.
Status FindKernel(const char* isa, const KernelInfo** kernel, std::string* kernel_source) {
  std::string source;
  const std::string want = Lower(FromOptionOrEnv(isa, "MAXSIM_ISA", "", &source));
  size_t n = 0;
  const KernelInfo* list = KernelList(&n);
  if (want.empty() || want == "auto" || want == "best") {
    for (size_t i = 0; i < n; ++i) {
      if (!KernelExplicitOnly(list[i]) && KernelAvailable(list[i], nullptr)) {
        *kernel = &list[i];
        *kernel_source = "the highest-priority kernel this CPU supports";
        return Status::Ok();
      }
    }
    return Error(MAXSIM_ERR_INTERNAL, "no CPU kernel is available (the scalar kernel should always be)");
  }
  std::string known;
  for (size_t i = 0; i < n; ++i) {
    if (want == list[i].name) {
      std::string reason;
      if (!KernelAvailable(list[i], &reason)) {
        return Error(MAXSIM_ERR_BACKEND_UNAVAILABLE, "CPU kernel '%s' (%s) cannot run here: %s", list[i].name,
                     source.c_str(), reason.c_str());
      }
      *kernel = &list[i];
      *kernel_source = "forced, " + source;
      return Status::Ok();
    }
    known += (known.empty() ? "" : ", ") + std::string(list[i].name);
  }
  return Error(MAXSIM_ERR_INVALID_ARGUMENT, "'%s' (%s) is not a CPU kernel name; known: auto, %s", want.c_str(),
               source.c_str(), known.c_str());
}

// maxsim_options.devices: a comma-separated list of device ordinals (at most 64 entries, each below 1024).
Status CheckDeviceList(const char* list) {
  const char* p = list;
  int entries = 0;
  while (true) {
    const char* start = p;
    while (*p >= '0' && *p <= '9' && p - start < 5) ++p;
    const long v = p > start && p - start < 5 ? std::strtol(start, nullptr, 10) : -1;
    if (v < 0 || v > 1023 || ++entries > 64 || (*p != ',' && *p != '\0')) {
      return Error(MAXSIM_ERR_INVALID_ARGUMENT,
                   "maxsim_options.devices is '%s': expected a comma-separated list of at most 64 device ordinals "
                   "(0 to 1023), such as \"0,1\"", list);
    }
    if (*p == '\0') return Status::Ok();
    ++p;
  }
}

Status SelectKernel(const maxsim_options& o, maxsim_context* ctx) {
  return FindKernel(o.isa, &ctx->kernel, &ctx->kernel_source);
}

// Creates the plugin's backends: one per device when it reports several (device_count > 1), else one.
maxsim_status StartBackends(const LoadedPlugin& p, const maxsim_plugin_host* host,
                            std::vector<maxsim_plugin_backend*>* out, std::string* why) {
  const uint32_t n = p.device_count ? std::max<uint32_t>(1, p.device_count(host)) : 1;
  if (!p.device_count && host->devices && std::strchr(host->devices, ',')) {
    *why = Format("maxsim_options.devices is '%s' but the plugin runs on one device (it has no device_count and "
                  "create_device)", host->devices);
    return MAXSIM_ERR_UNSUPPORTED;
  }
  for (uint32_t i = 0; i < n; ++i) {
    char err[1024] = {};
    maxsim_plugin_backend* backend = nullptr;
    const maxsim_status st = n > 1 ? p.create_device(host, i, &backend, err, sizeof(err))
                                   : p.api->create(host, &backend, err, sizeof(err));
    err[sizeof(err) - 1] = '\0';
    if (st != MAXSIM_OK || backend == nullptr) {
      for (maxsim_plugin_backend* b : *out) p.api->destroy(b);
      out->clear();
      *why = (n > 1 ? Format("device %u of %u: ", i, n) : std::string()) + (err[0] ? err : maxsim_status_name(st));
      return st == MAXSIM_OK ? MAXSIM_ERR_PLUGIN : st;
    }
    out->push_back(backend);
  }
  return MAXSIM_OK;
}

Status SelectBackend(const maxsim_options& o, maxsim_context* ctx) {
  std::string source;
  ctx->backend_request = Lower(FromOptionOrEnv(o.backend, "MAXSIM_BACKEND", "auto", &source));
  const std::string& want = ctx->backend_request;
  if (want == "cpu") {
    ctx->backend_note = "cpu (" + source + ")";
    return Status::Ok();
  }
  std::vector<const LoadedPlugin*> candidates;
  if (want == "auto") {
    for (const LoadedPlugin& p : ctx->plugins.plugins()) {
      if (p.available) candidates.push_back(&p);
    }
    if (candidates.empty()) {
      ctx->backend_note = o.load_plugins ? "auto -> cpu (no available accelerator plugin)"
                                         : "auto -> cpu (plugin loading disabled)";
      return Status::Ok();
    }
  } else {
    for (const LoadedPlugin& p : ctx->plugins.plugins()) {
      if (p.name == want) {
        if (!p.available) {
          return Error(MAXSIM_ERR_BACKEND_UNAVAILABLE, "backend '%s' (%s) is unavailable: %s", want.c_str(),
                       source.c_str(), p.info.c_str());
        }
        candidates.push_back(&p);
      }
    }
    if (candidates.empty()) {
      std::string names = "auto, cpu";
      for (const LoadedPlugin& p : ctx->plugins.plugins()) names += ", " + p.name;
      std::string where;
      for (const std::string& s : ctx->plugins.searched()) where += (where.empty() ? "" : ":") + s;
      std::string skipped;
      for (const SkippedPlugin& s : ctx->plugins.skipped()) skipped += "; skipped " + s.path + ": " + s.reason;
      return Error(MAXSIM_ERR_BACKEND_UNAVAILABLE,
                   "backend '%s' (%s) was not found: known backends are %s (plugins searched in '%s'%s); set "
                   "MAXSIM_PLUGIN_PATH to the folder holding %s%s%s", want.c_str(), source.c_str(), names.c_str(),
                   where.c_str(), skipped.c_str(), kPluginPrefix, want.c_str(), kPluginSuffix);
    }
    ctx->accel_forced = true;
  }
  // Start the first candidate that agrees to (auto: the next one if a plugin fails to start).
  std::string failures;
  for (const LoadedPlugin* p : candidates) {
    std::vector<maxsim_plugin_backend*> backends;
    std::string err;
    const maxsim_status st = StartBackends(*p, &ctx->host_iface, &backends, &err);
    if (st == MAXSIM_OK) {
      ctx->accel = p;
      ctx->accel_backend = backends[0];
      ctx->shard_backends = std::move(backends);
      break;
    }
    const std::string why = Format("plugin %s failed to start: %s", p->name.c_str(), err.c_str());
    if (ctx->accel_forced) return Error(MAXSIM_ERR_BACKEND_UNAVAILABLE, "%s", why.c_str());
    ctx->Log(MAXSIM_LOG_WARNING, why + "; trying the next backend");
    failures += (failures.empty() ? "" : "; ") + why;
  }
  if (!ctx->accel) {
    ctx->backend_note = "auto -> cpu (" + failures + ")";
    return Status::Ok();
  }
  const std::string devices =
      ctx->shard_backends.size() > 1 ? Format(" on %zu devices", ctx->shard_backends.size()) : std::string();
  ctx->backend_note = ctx->accel_forced
                          ? ctx->accel->name + devices + " (" + source + "; every call runs on it)"
                          : "auto -> " + ctx->accel->name + devices +
                                " for packed corpora and device tensors when the work is large enough (" +
                                (ctx->accel->api->min_auto_ops
                                     ? Format("%llu", static_cast<ull>(ctx->accel->api->min_auto_ops(ctx->accel_backend))) +
                                           " operations = 2*Lq*Ld*dim summed over pairs, or more"
                                     : std::string("never: the plugin gives no threshold")) +
                                "), else cpu";
  return Status::Ok();
}

}  // namespace

maxsim_status CreateContext(const maxsim_options* options, maxsim_context** out) {
  if (out == nullptr) return Report(Error(MAXSIM_ERR_INVALID_ARGUMENT, "maxsim_context_create: out is NULL"));
  *out = nullptr;
  maxsim_options o;
  maxsim_options_init(&o);
  if (options) {
    if (options->struct_size < offsetof(maxsim_options, log_user_data) + sizeof(void*)) {
      return Report(Error(MAXSIM_ERR_INVALID_ARGUMENT,
                          "maxsim_options.struct_size is %u; call maxsim_options_init first", options->struct_size));
    }
    // Fields beyond the caller's struct_size (a program built against an older maxsim.h) keep their defaults.
    std::memcpy(&o, options, std::min<size_t>(options->struct_size, sizeof(o)));
    o.struct_size = sizeof(o);
  }
  auto ctx = std::make_unique<maxsim_context>();
  ctx->log = o.log;
  ctx->log_user = o.log_user_data;
  if (const std::string& bad = GetCpuInfo().mask_error; !bad.empty()) {
    return Report(Error(MAXSIM_ERR_INVALID_ARGUMENT, "%s", bad.c_str()));
  }
  Status st = SelectThreads(o, ctx.get());
  if (st.ok()) st = SelectKernel(o, ctx.get());
  if (st.ok()) st = SelectVariant(ctx.get());
  if (!st.ok()) return Report(st);
  ctx->engine = std::make_unique<Engine>(ctx->kernel, ctx->kernel_variant, ctx->threads);
  ctx->host_iface.struct_size = sizeof(maxsim_plugin_host);
  ctx->host_iface.abi_major = MAXSIM_PLUGIN_ABI_MAJOR;
  ctx->host_iface.abi_minor = MAXSIM_PLUGIN_ABI_MINOR;
  ctx->host_iface.host_data = ctx.get();
  ctx->host_iface.log = &HostLog;
  if (o.devices && o.devices[0]) {
    st = CheckDeviceList(o.devices);
    if (!st.ok()) return Report(st);
    ctx->devices = o.devices;
  }
  ctx->host_iface.devices = ctx->devices.empty() ? nullptr : ctx->devices.c_str();
  if (o.load_plugins) {
    const maxsim_context* raw = ctx.get();
    ctx->plugins.Discover(o.plugin_path ? o.plugin_path : "",
                          [raw](maxsim_log_level level, const std::string& m) { raw->Log(level, m); },
                          &ctx->host_iface);
    ctx->plugins_loaded = true;
  }
  st = SelectBackend(o, ctx.get());
  if (!st.ok()) return Report(st);
  ctx->Log(MAXSIM_LOG_INFO, "backend: " + ctx->backend_note);  // every path, "cpu" and "no plugin" included
  {
    LockGuard lock(g_contexts_mu);
    g_contexts.insert(ctx.get());
  }
  *out = ctx.release();
  return MAXSIM_OK;
}

}  // namespace maxsim

maxsim_context::~maxsim_context() {
  {
    maxsim::LockGuard lock(maxsim::g_contexts_mu);
    maxsim::g_contexts.erase(this);
  }
#ifndef MAXSIM_SINGLE_THREADED
  shard_workers.reset();  // idle between calls: joined before the backends go
#endif
  if (accel) {
    for (auto& entry : corpora) maxsim::FreeDeviceCorpus(*this, entry.second);
    for (maxsim_plugin_backend* b : shard_backends) accel->api->destroy(b);
  }
}

namespace maxsim {

void ForgetPacked(const maxsim_packed* packed) {
  LockGuard lock(g_contexts_mu);
  for (maxsim_context* ctx : g_contexts) {
    LockGuard plock(ctx->plugin_mu);
    auto it = ctx->corpora.find(packed->uid);
    if (it != ctx->corpora.end()) {
      FreeDeviceCorpus(*ctx, it->second);
      ctx->corpora.erase(it);
    }
  }
}

void FreeDeviceCorpus(maxsim_context& ctx, DeviceCorpus& corpus) {
  for (size_t s = 0; s < corpus.shard.size(); ++s) {
    if (corpus.shard[s]) ctx.accel->api->corpus_free(ctx.shard_backends[s], corpus.shard[s]);
    corpus.shard[s] = nullptr;
  }
}

Status PackingRowOps(const maxsim_context* ctx, pack::RowOps* out) {
  if (ctx) {
    *out = ctx->engine->row_ops();
    return Status::Ok();
  }
  const KernelInfo* kernel = nullptr;
  std::string source;
  MAXSIM_RETURN_IF_ERROR(FindKernel(nullptr, &kernel, &source));
  *out = pack::RowOpsFor(PackingTargetCap(*kernel));
  return Status::Ok();
}

std::string ContextReport(const maxsim_context& ctx) {
  const CpuInfo& cpu = GetCpuInfo();
  std::string r = Format("libmaxsim %s\n", maxsim_version_string());
  r += "CPU: " + (cpu.brand.empty() ? std::string("unknown") : cpu.brand);
  if (!cpu.vendor.empty()) r += " (" + cpu.vendor + ")";
  r += "\n  features: " + (cpu.features ? FeatureNames(cpu.features) : std::string("(none detected)")) + "\n";
  if (!cpu.amx_note.empty() && !(cpu.features & kCpuAMXTile)) r += "  amx: " + cpu.amx_note + "\n";
  r += "CPU kernels (highest priority first):\n";
  size_t n = 0;
  const KernelInfo* list = KernelList(&n);
  for (size_t i = 0; i < n; ++i) {
    std::string reason;
    const bool ok = KernelAvailable(list[i], &reason);
    const char* state = &list[i] == ctx.kernel  ? "selected"
                        : !ok                   ? "unavailable"
                        : KernelExplicitOnly(list[i]) ? "explicit"  // runs here, but only when named
                                                : "available";
    r += Format("  %-16s %-11s %s", list[i].name, state, list[i].description);
    if (!ok) r += "\n  " + std::string(16, ' ') + "             because it " + reason;
    r += "\n";
  }
  r += "Selected kernel: " + std::string(ctx.kernel->name) + " (" + ctx.kernel_source + ")\n";
  if (!ctx.kernel_variant_note.empty()) r += "  " + ctx.kernel_variant_note + "\n";
  r += Format("Packing: Highway %s (the widest target kernel %s allows)\n",
              pack::RowOpsTargetName(ctx.engine->row_ops().target), ctx.kernel->name);
  r += Format("Threads: %d (%s)\n", ctx.threads, ctx.threads_source.c_str());
  if (!ctx.plugins_loaded) {
    r += "Plugins: not loaded (disabled by the options)\n";
  } else {
    std::string where;
    for (const std::string& s : ctx.plugins.searched()) where += (where.empty() ? "" : ":") + s;
    r += "Plugins (searched " + (where.empty() ? std::string("nothing") : where) + "):\n";
    if (ctx.plugins.plugins().empty() && ctx.plugins.skipped().empty()) r += "  none found\n";
    for (const LoadedPlugin& p : ctx.plugins.plugins()) {
      r += "  " + p.name + "  " + p.path + "\n    " + (p.available ? "available: " : "unavailable: ") + p.info + "\n";
      r += "    " + p.Capabilities() + "\n";
    }
    for (const SkippedPlugin& s : ctx.plugins.skipped()) r += "  skipped " + s.path + ": " + s.reason + "\n";
  }
  r += "Backend: " + ctx.backend_note + "\n";
  // The settings each backend read when it was created (ABI 1.1 describe hook).
  if (ctx.accel && ctx.accel->describe) {
    for (size_t s = 0; s < ctx.shard_backends.size(); ++s) {
      char text[4096] = {};
      ctx.accel->describe(ctx.shard_backends[s], text, sizeof(text));
      text[sizeof(text) - 1] = '\0';
      std::string lines = text;
      if (lines.empty()) continue;
      if (ctx.shard_backends.size() > 1) r += Format("  device %zu:\n", s);
      size_t start = 0;
      while (start < lines.size()) {
        size_t end = lines.find('\n', start);
        if (end == std::string::npos) end = lines.size();
        if (end > start) r += "    " + lines.substr(start, end - start) + "\n";
        start = end + 1;
      }
    }
  }
  return r;
}

}  // namespace maxsim
