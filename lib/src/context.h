// SPDX-License-Identifier: Apache-2.0
// The object behind maxsim_context: the chosen CPU kernel and thread count, the plugin host, the backend
// choice, and the cache of corpora uploaded to a plugin's device.
#ifndef MAXSIM_SRC_CONTEXT_H_
#define MAXSIM_SRC_CONTEXT_H_

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine.h"
#include "mutex.h"
#include "maxsim/plugin.h"
#include "plugin_host.h"
#include "shard_workers.h"

namespace maxsim {

// A packed corpus on the accelerator: one device copy per shard backend, shard s holding the corpus's sets
// [first[s], first[s + 1]) (a contiguous range; empty shards hold no copy).
struct DeviceCorpus {
  std::vector<maxsim_plugin_corpus*> shard;
  std::vector<uint64_t> first;
};

}  // namespace maxsim

struct maxsim_context {
  int threads = 1;
  std::string threads_source;
  const maxsim::KernelInfo* kernel = nullptr;
  std::string kernel_source;
  int kernel_variant = 0;            // PreparedQuery::variant (KernelOps::variants), 0 without variants
  std::string kernel_variant_note;   // the variant chosen and why; empty without variants
  std::unique_ptr<maxsim::Engine> engine;

  maxsim_log_fn log = nullptr;
  void* log_user = nullptr;

  maxsim::PluginHost plugins;
  maxsim_plugin_host host_iface{};
  std::string devices;                              // maxsim_options.devices ("" = the backend's default)
  bool plugins_loaded = false;
  const maxsim::LoadedPlugin* accel = nullptr;      // the accelerator plugin in use, if any
  maxsim_plugin_backend* accel_backend = nullptr;   // its backend on the first device (training calls)
  std::vector<maxsim_plugin_backend*> shard_backends;  // one per device, accel_backend first (corpora shard over them)
  bool accel_forced = false;                        // the user named this backend
  std::string backend_request;                      // "auto", "cpu" or a plugin name
  std::string backend_note;                         // why this backend

  maxsim::Mutex plugin_mu;                           // serialises calls on the backends and the cache
  // A stream-ordered call went to the plugin since the last maxsim_synchronize, so the plugin's next operation may
  // report its deferred error instead of running (guarded by plugin_mu).
  bool stream_ordered_pending = false;
  std::unordered_map<uint64_t, maxsim::DeviceCorpus> corpora;  // packed uid -> device copies
#ifndef MAXSIM_SINGLE_THREADED
  std::unique_ptr<maxsim::ShardWorkers> shard_workers;  // host threads of sharded calls (made by the first)
#endif

  void Log(maxsim_log_level level, const std::string& message) const {
    if (log) log(log_user, level, message.c_str());
  }
  ~maxsim_context();
};

namespace maxsim {

maxsim_status CreateContext(const maxsim_options* options, maxsim_context** out);
// The packing row operations (pack::RowOps) of a call: the context's (its kernel's target cap), or without a
// context those of the kernel MAXSIM_ISA names (the best one when unset; an unknown or unavailable name is an
// error), so that a pinned ISA holds in every entry point.
Status PackingRowOps(const maxsim_context* ctx, pack::RowOps* out);
std::string ContextReport(const maxsim_context& ctx);

// The plugin's view of sets [s0, s1) of a validated packed buffer.
maxsim_packed_view ViewOf(const pack::PackedView& v, uint64_t s0, uint64_t s1);

// Drops the device copies of a packed handle being released (all contexts).
void ForgetPacked(const maxsim_packed* packed);
// Frees the device copies of one corpus (caller holds ctx.plugin_mu or owns ctx alone).
void FreeDeviceCorpus(maxsim_context& ctx, DeviceCorpus& corpus);

// Backend routing for one scoring call.
enum class Route { kCpu, kPlugin };
enum class PluginOp { kMatrix, kCandidates, kTopK };
// kPlugin when the accelerator takes this call (device-memory inputs, a named backend, or auto above the
// plugin's min_auto_ops for a packed corpus), kCpu otherwise; an error when the inputs are in device memory the
// backend does not take, or the named backend does not implement the operation.
Status ChooseRoute(maxsim_context& ctx, PluginOp op, const SetsRef& q, const SetsRef& d, uint64_t work_ops,
                   Route* route);
struct PluginCall {
  PluginOp op = PluginOp::kMatrix;
  ScoreRequest req;
  const uint64_t* cand_offsets = nullptr;
  const uint64_t* candidates = nullptr;
  uint64_t k = 0;
  float* scores = nullptr;
  int32_t* argmax = nullptr;
  uint64_t* topk_index = nullptr;
  uint64_t* ids = nullptr;
  maxsim_stats* stats = nullptr;
  void* stream = nullptr;
  uint32_t flags = 0;            // MAXSIM_CALL_* (checked by the C API: stream-ordered only for device tensors)
  const char* name = "";         // the public function, for deferred error messages
};
Status RunOnPlugin(maxsim_context& ctx, const SetsRef& q, const SetsRef& d, const PluginCall& call);
Status BackwardOnPlugin(maxsim_context& ctx, const maxsim_dense_sets* q, const maxsim_dense_sets* d,
                        const maxsim_backward_args& args, uint32_t flags);
// maxsim_synchronize: every backend's plugin synchronize (none without the member); the first error.
Status SynchronizeBackends(maxsim_context& ctx);

}  // namespace maxsim

#endif  // MAXSIM_SRC_CONTEXT_H_
