// SPDX-License-Identifier: Apache-2.0
// The object behind maxsim_context: the chosen CPU kernel and thread count, the plugin host, the backend
// choice, and the cache of corpora uploaded to a plugin's device.
#ifndef MAXSIM_SRC_CONTEXT_H_
#define MAXSIM_SRC_CONTEXT_H_

#include <memory>
#include <string>
#include <unordered_map>

#include "engine.h"
#include "mutex.h"
#include "maxsim/plugin.h"
#include "plugin_host.h"

struct maxsim_context {
  int threads = 1;
  std::string threads_source;
  const maxsim::KernelInfo* kernel = nullptr;
  std::string kernel_source;
  std::unique_ptr<maxsim::Engine> engine;

  maxsim_log_fn log = nullptr;
  void* log_user = nullptr;

  maxsim::PluginHost plugins;
  maxsim_plugin_host host_iface{};
  bool plugins_loaded = false;
  const maxsim::LoadedPlugin* accel = nullptr;      // the accelerator plugin in use, if any
  maxsim_plugin_backend* accel_backend = nullptr;
  bool accel_forced = false;                        // the user named this backend
  std::string backend_request;                      // "auto", "cpu" or a plugin name
  std::string backend_note;                         // why this backend

  maxsim::Mutex plugin_mu;                              // serialises calls on accel_backend and the cache
  std::unordered_map<uint64_t, maxsim_plugin_corpus*> corpora;  // packed uid -> device copy

  void Log(maxsim_log_level level, const std::string& message) const {
    if (log) log(log_user, level, message.c_str());
  }
  ~maxsim_context();
};

namespace maxsim {

maxsim_status CreateContext(const maxsim_options* options, maxsim_context** out);
std::string ContextReport(const maxsim_context& ctx);

// Drops the device copies of a packed handle being released (all contexts).
void ForgetPacked(const maxsim_packed* packed);

// Backend routing for one scoring call.
enum class Route { kCpu, kPlugin };
Status ChooseRoute(maxsim_context& ctx, const SetsRef& q, const SetsRef& d, uint64_t work_ops, Route* route);

enum class PluginOp { kMatrix, kCandidates, kTopK };
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
};
Status RunOnPlugin(maxsim_context& ctx, const SetsRef& q, const SetsRef& d, const PluginCall& call);
Status BackwardOnPlugin(maxsim_context& ctx, const maxsim_dense_sets* q, const maxsim_dense_sets* d,
                        const maxsim_backward_args& args);

}  // namespace maxsim

#endif  // MAXSIM_SRC_CONTEXT_H_
