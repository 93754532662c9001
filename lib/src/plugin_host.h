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

struct LoadedPlugin {
  std::string path;
  void* handle = nullptr;
  const maxsim_plugin_api* api = nullptr;
  std::string name;
  bool available = false;
  std::string info;  // probe's device description, or why it is unavailable
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
  // itself: <its folder>/maxsim/plugins (the installed layout) and its folder (the build tree). In a folder, files named libmaxsim-plugin-*.so are candidates. Each candidate that cannot
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
