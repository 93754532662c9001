// SPDX-License-Identifier: Apache-2.0
// Finds, loads and vets backend plugins (see maxsim/plugin.h for the ABI).
#ifndef MAXSIM_SRC_PLUGIN_HOST_H_
#define MAXSIM_SRC_PLUGIN_HOST_H_

#include <functional>
#include <string>
#include <vector>

#include "maxsim/plugin.h"

namespace maxsim {

using LogSink = std::function<void(maxsim_log_level, const std::string&)>;

// File names the host loads from a folder: kPluginPrefix + NAME + kPluginSuffix.
constexpr const char* kPluginPrefix = "libmaxsim-plugin-";
#if defined(__APPLE__)
constexpr const char* kPluginSuffix = ".dylib";
#elif defined(_WIN32)
constexpr const char* kPluginSuffix = ".dll";
#else
constexpr const char* kPluginSuffix = ".so";
#endif

// The operations a plugin table may implement (ABI 1.1: any of them may be NULL, meaning unsupported).
enum class PluginMember {
  kCorpusUpload,   // corpus_upload_view or corpus_upload, with corpus_free
  kScoreMatrix,
  kScoreCandidates,
  kTopK,
  kTrainForward,
  kTrainBackward,
  kDeviceMemory,   // mem_alloc, mem_free and mem_copy
  kCount
};
const char* PluginMemberName(PluginMember m);

struct LoadedPlugin {
  std::string path;
  void* handle = nullptr;
  const maxsim_plugin_api* api = nullptr;
  std::string name;
  bool available = false;
  std::string info;  // probe's device description, or why it is unavailable
  // Read once at load from the table (members the table is too short for count as NULL).
  bool has[static_cast<int>(PluginMember::kCount)] = {};
  uint64_t accepted_memory = 0;  // MAXSIM_MEMORY_BIT()s (a 1.0 table: MAXSIM_MEMORY_CUDA)
  bool Has(PluginMember m) const { return has[static_cast<int>(m)]; }
  bool Accepts(maxsim_memory m) const { return (accepted_memory & MAXSIM_MEMORY_BIT(m)) != 0; }
  // The ABI 1.1 optional hooks, NULL when absent.
  void (*describe)(maxsim_plugin_backend*, char*, size_t) = nullptr;
  uint32_t (*device_count)(const maxsim_plugin_host*) = nullptr;
  maxsim_status (*create_device)(const maxsim_plugin_host*, uint32_t, maxsim_plugin_backend**, char*, size_t) = nullptr;
  uint32_t (*dense_query_modes)(maxsim_plugin_backend*) = nullptr;  // ABI 1.2
  bool matrix_columns = false;  // ABI 1.3 output_layouts: score_matrix writes into columns of a wider matrix
  maxsim_status (*synchronize)(maxsim_plugin_backend*, char*, size_t) = nullptr;  // ABI 1.4: stream-ordered calls
  // "what it implements" for maxsim info: "ABI 1.1; no topk, train_backward" style.
  std::string Capabilities() const;
};

// A plugin that was found but not used, and why (for maxsim info).
struct SkippedPlugin {
  std::string path;
  std::string reason;
};

class PluginHost {
 public:
  PluginHost() = default;
  PluginHost(const PluginHost&) = delete;
  PluginHost& operator=(const PluginHost&) = delete;
  ~PluginHost();

  // Searches, in order: `extra` (':'-separated folders or files), MAXSIM_PLUGIN_PATH, then beside the library
  // itself: <its folder>/maxsim/plugins (the installed layout) and its folder (the build tree). In a folder,
  // files named kPluginPrefix*kPluginSuffix are candidates. Each candidate that cannot
  // be used produces exactly one log line (warning) and an entry in skipped().
  void Discover(const std::string& extra, const LogSink& log, const maxsim_plugin_host* host);

  const std::vector<LoadedPlugin>& plugins() const { return plugins_; }
  const std::vector<SkippedPlugin>& skipped() const { return skipped_; }
  const std::vector<std::string>& searched() const { return searched_; }

 private:
  void TryLoad(const std::string& path, const LogSink& log, const maxsim_plugin_host* host);
  std::vector<LoadedPlugin> plugins_;
  std::vector<SkippedPlugin> skipped_;
  std::vector<std::string> searched_;
  std::vector<std::string> seen_;  // real paths already considered
};

// Folder holding the loaded libmaxsim shared object ("" if unknown).
std::string LibraryDirectory();

}  // namespace maxsim

#endif  // MAXSIM_SRC_PLUGIN_HOST_H_
