// SPDX-License-Identifier: Apache-2.0
// The plugin host of builds that cannot load plugins (WebAssembly: no dlopen). Every place a plugin would be
// searched for is reported as skipped with the reason, so `info` and the logs say why no accelerator is used.
#include "plugin_host.h"

#include <cstdlib>

namespace maxsim {

std::string LibraryDirectory() { return ""; }

PluginHost::~PluginHost() = default;

void PluginHost::Discover(const std::string& extra, const LogSink& log, const maxsim_plugin_host* host) {
  (void)host;
  std::string where = extra;
  if (const char* env = std::getenv("MAXSIM_PLUGIN_PATH")) where += (where.empty() ? "" : ":") + std::string(env);
  skipped_.push_back({where.empty() ? std::string("(no search)") : where, "no plugins in this build"});
  if (!where.empty()) log(MAXSIM_LOG_WARNING, "plugin path " + where + " ignored: no plugins in this build");
}

void PluginHost::TryLoad(const std::string&, const LogSink&, const maxsim_plugin_host*) {}

}  // namespace maxsim
