// SPDX-License-Identifier: Apache-2.0
#include "context.h"

#include <algorithm>
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

Status SelectThreads(const maxsim_options& o, maxsim_context* ctx) {
  if (o.num_threads < 0) {
    return Error(MAXSIM_ERR_INVALID_ARGUMENT, "num_threads is %d (use 0 for the default or a positive count)",
                 o.num_threads);
  }
  if (o.num_threads > 0) {
    ctx->threads = o.num_threads;
    ctx->threads_source = "set by the options";
    return Status::Ok();
  }
  if (const char* e = std::getenv("MAXSIM_NUM_THREADS"); e && e[0]) {
    char* end = nullptr;
    const long n = std::strtol(e, &end, 10);
    if (end == e || *end != '\0' || n <= 0 || n > 4096) {
      return Error(MAXSIM_ERR_INVALID_ARGUMENT, "MAXSIM_NUM_THREADS='%s' is not a thread count from 1 to 4096", e);
    }
    ctx->threads = static_cast<int>(n);
    ctx->threads_source = std::string("set by MAXSIM_NUM_THREADS=") + e;
    return Status::Ok();
  }
#ifdef _OPENMP
  ctx->threads = std::max(1, omp_get_max_threads());
  ctx->threads_source = "OpenMP default";
#else
  ctx->threads = 1;
  ctx->threads_source = "built without OpenMP";
#endif
  return Status::Ok();
}

Status SelectKernel(const maxsim_options& o, maxsim_context* ctx) {
  std::string source;
  const std::string want = Lower(FromOptionOrEnv(o.isa, "MAXSIM_ISA", "", &source));
  size_t n = 0;
  const KernelInfo* list = KernelList(&n);
  if (want.empty() || want == "auto" || want == "best") {
    for (size_t i = 0; i < n; ++i) {
      if (KernelAvailable(list[i], nullptr)) {
        ctx->kernel = &list[i];
        ctx->kernel_source = "the highest-priority kernel this CPU supports";
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
      ctx->kernel = &list[i];
      ctx->kernel_source = "forced, " + source;
      return Status::Ok();
    }
    known += (known.empty() ? "" : ", ") + std::string(list[i].name);
  }
  return Error(MAXSIM_ERR_INVALID_ARGUMENT, "'%s' (%s) is not a CPU kernel name; known: auto, %s", want.c_str(),
               source.c_str(), known.c_str());
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
                   "MAXSIM_PLUGIN_PATH to the folder holding libmaxsim-plugin-%s.so", want.c_str(), source.c_str(),
                   names.c_str(), where.c_str(), skipped.c_str(), want.c_str());
    }
    ctx->accel_forced = true;
  }
  // Start the first candidate that agrees to (auto: the next one if a plugin fails to start).
  std::string failures;
  for (const LoadedPlugin* p : candidates) {
    char err[1024] = {};
    maxsim_plugin_backend* backend = nullptr;
    const maxsim_status st = p->api->create(&ctx->host_iface, &backend, err, sizeof(err));
    err[sizeof(err) - 1] = '\0';
    if (st == MAXSIM_OK && backend != nullptr) {
      ctx->accel = p;
      ctx->accel_backend = backend;
      break;
    }
    const std::string why = Format("plugin %s failed to start: %s", p->name.c_str(), err[0] ? err : maxsim_status_name(st));
    if (ctx->accel_forced) return Error(MAXSIM_ERR_BACKEND_UNAVAILABLE, "%s", why.c_str());
    ctx->Log(MAXSIM_LOG_WARNING, why + "; trying the next backend");
    failures += (failures.empty() ? "" : "; ") + why;
  }
  if (!ctx->accel) {
    ctx->backend_note = "auto -> cpu (" + failures + ")";
    return Status::Ok();
  }
  ctx->backend_note = ctx->accel_forced
                          ? ctx->accel->name + " (" + source + "; every call runs on it)"
                          : "auto -> " + ctx->accel->name +
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
    o = *options;
  }
  auto ctx = std::make_unique<maxsim_context>();
  ctx->log = o.log;
  ctx->log_user = o.log_user_data;
  Status st = SelectThreads(o, ctx.get());
  if (st.ok()) st = SelectKernel(o, ctx.get());
  if (!st.ok()) return Report(st);
  ctx->engine = std::make_unique<Engine>(ctx->kernel, ctx->threads);
  ctx->host_iface.struct_size = sizeof(maxsim_plugin_host);
  ctx->host_iface.abi_major = MAXSIM_PLUGIN_ABI_MAJOR;
  ctx->host_iface.abi_minor = MAXSIM_PLUGIN_ABI_MINOR;
  ctx->host_iface.host_data = ctx.get();
  ctx->host_iface.log = &HostLog;
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
  if (accel && accel_backend) {
    for (auto& entry : corpora) accel->api->corpus_free(accel_backend, entry.second);
    accel->api->destroy(accel_backend);
  }
}

namespace maxsim {

void ForgetPacked(const maxsim_packed* packed) {
  LockGuard lock(g_contexts_mu);
  for (maxsim_context* ctx : g_contexts) {
    LockGuard plock(ctx->plugin_mu);
    auto it = ctx->corpora.find(packed->uid);
    if (it != ctx->corpora.end()) {
      ctx->accel->api->corpus_free(ctx->accel_backend, it->second);
      ctx->corpora.erase(it);
    }
  }
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
    const char* state = &list[i] == ctx.kernel ? "selected" : ok ? "available" : "unavailable";
    r += Format("  %-16s %-11s %s", list[i].name, state, list[i].description);
    if (!ok) r += "\n  " + std::string(16, ' ') + "             because it " + reason;
    r += "\n";
  }
  r += "Selected kernel: " + std::string(ctx.kernel->name) + " (" + ctx.kernel_source + ")\n";
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
    }
    for (const SkippedPlugin& s : ctx.plugins.skipped()) r += "  skipped " + s.path + ": " + s.reason + "\n";
  }
  r += "Backend: " + ctx.backend_note + "\n";
  return r;
}

// ---------------------------------------------------------------------------------------------------------
// Plugin routing
// ---------------------------------------------------------------------------------------------------------

Status ChooseRoute(maxsim_context& ctx, const SetsRef& q, const SetsRef& d, uint64_t work_ops, Route* route) {
  const bool device = q.memory() == MAXSIM_MEMORY_CUDA || d.memory() == MAXSIM_MEMORY_CUDA;
  *route = Route::kCpu;
  if (!ctx.accel) {
    if (device) {
      return Error(MAXSIM_ERR_BACKEND_UNAVAILABLE,
                   "inputs are in CUDA memory but no accelerator backend is active (%s)", ctx.backend_note.c_str());
    }
    return Status::Ok();
  }
  if (ctx.accel_forced || device) {
    *route = Route::kPlugin;
    return Status::Ok();
  }
  const uint64_t threshold =
      ctx.accel->api->min_auto_ops ? ctx.accel->api->min_auto_ops(ctx.accel_backend) : UINT64_MAX;
  if (d.is_packed && work_ops >= threshold) *route = Route::kPlugin;
  return Status::Ok();
}

namespace {

struct AlignedBuffer {
  void* p = nullptr;
  ~AlignedBuffer() { std::free(p); }
};

// Packs dense host sets into an aligned temporary buffer (for handing to a plugin).
Status PackTemporary(const SetsRef& s, const char* role, int threads, AlignedBuffer* buf, uint64_t* size) {
  MAXSIM_RETURN_IF_ERROR(pack::PackedSize(s.dense, false, size));
  buf->p = std::aligned_alloc(MAXSIM_PACK_ALIGN, RoundUp(*size, MAXSIM_PACK_ALIGN));
  if (!buf->p) return Error(MAXSIM_ERR_OUT_OF_MEMORY, "%s: cannot allocate %llu bytes to pack", role, static_cast<ull>(*size));
  return pack::PackInto(s.dense, nullptr, buf->p, *size, threads, role, size);
}

// Dense host sets with a mask are packed without their masked rows, so a plugin reports argmax in compacted
// coordinates (query tokens and document tokens both renumbered without the masked rows). This maps such a
// plugin argmax (matrix or candidates layout over kept query tokens) to maxsim.h's layout over positions.
std::vector<uint32_t> KeptPositions(const SetsRef& s, uint64_t i) {
  std::vector<uint32_t> kept;
  for (uint64_t r = s.dense.begin(i); r < s.dense.end(i); ++r) {
    if (s.dense.kept(r)) kept.push_back(static_cast<uint32_t>(r - s.dense.begin(i)));
  }
  return kept;
}

struct ArgmaxRemap {
  bool active = false;
  std::vector<int32_t> compact;  // the plugin's output
};

uint64_t KeptCount(const SetsRef& s, uint64_t i) {
  if (s.is_packed || !s.dense.mask) return s.positions(i);
  uint64_t n = 0;
  for (uint64_t r = s.dense.begin(i); r < s.dense.end(i); ++r) n += s.dense.kept(r);
  return n;
}

void RemapArgmax(const SetsRef& q, const SetsRef& d, const PluginCall& call, const std::vector<int32_t>& compact) {
  const uint64_t nq = q.n_sets(), nd = d.n_sets();
  const bool qmask = !q.is_packed && q.dense.mask, dmask = !d.is_packed && d.dense.mask;
  std::vector<std::vector<uint32_t>> dmap(dmask ? nd : 0);
  for (uint64_t j = 0; j < dmap.size(); ++j) dmap[j] = KeptPositions(d, j);
  uint64_t cbase = 0, pbase_pos = 0;  // compacted and positional bases of query i
  for (uint64_t i = 0; i < nq; ++i) {
    const uint64_t lq = q.positions(i);
    std::vector<uint32_t> qk;
    if (qmask) qk = KeptPositions(q, i);
    const uint64_t lk = qmask ? qk.size() : lq;
    const uint64_t n_docs = call.op == PluginOp::kMatrix ? nd : call.cand_offsets[i + 1] - call.cand_offsets[i];
    for (uint64_t c = 0; c < n_docs; ++c) {
      const uint64_t j = call.op == PluginOp::kMatrix ? c : call.candidates[call.cand_offsets[i] + c];
      const uint64_t src = call.op == PluginOp::kMatrix ? nd * cbase + c * lk : cbase + c * lk;
      const uint64_t dst = call.op == PluginOp::kMatrix ? nd * pbase_pos + c * lq : pbase_pos + c * lq;
      int32_t* out = call.argmax + dst;
      if (qmask) std::fill(out, out + lq, -1);
      for (uint64_t s = 0; s < lk; ++s) {
        int32_t t = compact[src + s];
        if (t >= 0 && dmask) t = static_cast<int32_t>(dmap[j][static_cast<size_t>(t)]);
        out[qmask ? qk[s] : s] = t;
      }
    }
    if (call.op == PluginOp::kMatrix) {
      cbase += lk;
      pbase_pos += lq;
    } else {
      cbase += n_docs * lk;
      pbase_pos += n_docs * lq;
    }
  }
}

Status PluginError(const maxsim_context& ctx, maxsim_status code, const char* err) {
  return Error(code == MAXSIM_OK ? MAXSIM_ERR_PLUGIN : code, "backend %s: %s", ctx.accel->name.c_str(),
               err[0] ? err : maxsim_status_name(code));
}

}  // namespace

Status RunOnPlugin(maxsim_context& ctx, const SetsRef& q, const SetsRef& d, const PluginCall& call) {
  const maxsim_plugin_api* api = ctx.accel->api;
  char err[1024] = {};
  LockGuard lock(ctx.plugin_mu);
  if (q.memory() == MAXSIM_MEMORY_CUDA || d.memory() == MAXSIM_MEMORY_CUDA) {
    if (q.is_packed || d.is_packed || q.memory() != d.memory()) {
      return Error(MAXSIM_ERR_INVALID_ARGUMENT, "queries and documents must both be dense device tensors (or both host)");
    }
    if (call.op == PluginOp::kTopK) {
      return Error(MAXSIM_ERR_UNSUPPORTED, "top-k on device tensors is not supported: pack the corpus and upload it");
    }
    if (call.req.mode != MAXSIM_MODE_EXACT) {
      return Error(MAXSIM_ERR_UNSUPPORTED,
                   "certified/approximate modes need packed buffers (i8 codes + metadata); device tensors score "
                   "in exact mode");
    }
    maxsim_plugin_train_args a{};
    a.struct_size = sizeof(a);
    a.metric = call.req.metric;
    a.layout = call.op == PluginOp::kMatrix ? MAXSIM_LAYOUT_MATRIX : MAXSIM_LAYOUT_CANDIDATES;
    a.queries = q.dense_src;
    a.documents = d.dense_src;
    a.cand_offsets = call.cand_offsets;
    a.candidates = call.candidates;
    a.scores = call.scores;
    a.argmax = call.argmax;
    a.stream = call.stream;
    const maxsim_status st = api->train_forward(ctx.accel_backend, &a, err, sizeof(err));
    if (st != MAXSIM_OK) return PluginError(ctx, st, err);
    return Status::Ok();
  }
  // Host inputs: queries as a packed buffer, documents as a device-resident corpus.
  AlignedBuffer qtemp, dtemp;
  const void* qbuf = nullptr;
  uint64_t qsize = 0;
  if (q.is_packed) {
    qbuf = q.packed.base;
    qsize = q.packed.size;
  } else {
    MAXSIM_RETURN_IF_ERROR(PackTemporary(q, "queries", ctx.threads, &qtemp, &qsize));
    qbuf = qtemp.p;
  }
  maxsim_plugin_corpus* corpus = nullptr;
  bool temporary_corpus = false;
  if (d.is_packed) {
    auto it = ctx.corpora.find(d.handle->uid);
    if (it != ctx.corpora.end()) {
      corpus = it->second;
    } else {
      const maxsim_status st =
          api->corpus_upload(ctx.accel_backend, d.packed.base, d.packed.size, &corpus, err, sizeof(err));
      if (st != MAXSIM_OK) return PluginError(ctx, st, err);
      ctx.corpora[d.handle->uid] = corpus;
    }
  } else {
    uint64_t dsize = 0;
    MAXSIM_RETURN_IF_ERROR(PackTemporary(d, "documents", ctx.threads, &dtemp, &dsize));
    const maxsim_status st = api->corpus_upload(ctx.accel_backend, dtemp.p, dsize, &corpus, err, sizeof(err));
    if (st != MAXSIM_OK) return PluginError(ctx, st, err);
    temporary_corpus = true;
  }
  // Masked dense host inputs lose their masked rows in packing: collect the plugin's argmax and remap it.
  ArgmaxRemap remap;
  if (call.argmax && ((!q.is_packed && q.dense.mask) || (!d.is_packed && d.dense.mask))) {
    remap.active = true;
    uint64_t n = 0;
    for (uint64_t i = 0; i < q.n_sets(); ++i) {
      const uint64_t docs = call.op == PluginOp::kMatrix ? d.n_sets() : call.cand_offsets[i + 1] - call.cand_offsets[i];
      n += docs * KeptCount(q, i);
    }
    remap.compact.assign(n, -1);
  }
  maxsim_plugin_score_args a{};
  a.struct_size = sizeof(a);
  a.metric = call.req.metric;
  a.mode = call.req.mode;
  a.queries = qbuf;
  a.queries_size = qsize;
  a.corpus = corpus;
  a.cand_offsets = call.cand_offsets;
  a.candidates = call.candidates;
  a.k = call.k;
  a.scores = call.scores;
  a.argmax = remap.active ? remap.compact.data() : call.argmax;
  a.topk_index = call.topk_index;
  a.stats = call.stats;
  maxsim_status st = MAXSIM_OK;
  switch (call.op) {
    case PluginOp::kMatrix: st = api->score_matrix(ctx.accel_backend, &a, err, sizeof(err)); break;
    case PluginOp::kCandidates: st = api->score_candidates(ctx.accel_backend, &a, err, sizeof(err)); break;
    case PluginOp::kTopK: st = api->topk(ctx.accel_backend, &a, err, sizeof(err)); break;
  }
  if (temporary_corpus) api->corpus_free(ctx.accel_backend, corpus);
  if (st != MAXSIM_OK) return PluginError(ctx, st, err);
  if (remap.active) RemapArgmax(q, d, call, remap.compact);
  if (call.op == PluginOp::kTopK && call.ids) {
    const uint64_t n = q.n_sets() * call.k;
    for (uint64_t r = 0; r < n; ++r) {
      const uint64_t idx = call.topk_index[r];
      call.ids[r] = idx < d.n_sets() ? d.packed.ids[idx] : UINT64_MAX;
    }
  }
  return Status::Ok();
}

Status BackwardOnPlugin(maxsim_context& ctx, const maxsim_dense_sets* q, const maxsim_dense_sets* d,
                        const maxsim_backward_args& args) {
  LockGuard lock(ctx.plugin_mu);
  maxsim_plugin_train_args a{};
  a.struct_size = sizeof(a);
  a.metric = MAXSIM_METRIC_DOT;
  a.layout = args.layout;
  a.queries = q;
  a.documents = d;
  a.cand_offsets = args.cand_offsets;
  a.candidates = args.candidates;
  a.argmax = const_cast<int32_t*>(args.argmax);
  a.grad_scores = args.grad_scores;
  a.grad_queries = args.grad_queries;
  a.grad_documents = args.grad_documents;
  a.deterministic = args.deterministic;
  a.stream = args.cuda_stream;
  char err[1024] = {};
  const maxsim_status st = ctx.accel->api->train_backward(ctx.accel_backend, &a, err, sizeof(err));
  if (st != MAXSIM_OK) return PluginError(ctx, st, err);
  return Status::Ok();
}

}  // namespace maxsim
