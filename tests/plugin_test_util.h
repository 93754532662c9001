// SPDX-License-Identifier: Apache-2.0
// What the plugin-host tests share: a log sink that keeps the library's lines, and context options that load
// plugins from one path.
#ifndef MAXSIM_TESTS_PLUGIN_TEST_UTIL_H_
#define MAXSIM_TESTS_PLUGIN_TEST_UTIL_H_

#include <string>
#include <vector>

#include "maxsim/maxsim.h"

namespace maxsim::test {

// docs_pruned = kPluginMarker + (corpora alive) in every maxsim_stats the test plugin fills.
constexpr uint64_t kPluginMarker = 0xC0FFEE00ull;

struct Log {
  maxsim_log_level min_level = MAXSIM_LOG_INFO;
  std::vector<std::string> lines;
  static void Sink(void* user, maxsim_log_level level, const char* message) {
    Log* log = static_cast<Log*>(user);
    if (level >= log->min_level) log->lines.push_back(message);
  }
  size_t Count(const std::string& part) const {
    size_t n = 0;
    for (const auto& l : lines) n += l.find(part) != std::string::npos;
    return n;
  }
};

// Options loading plugins from `path` (':'-separated folders or files; must outlive the context's creation).
inline maxsim_options PluginOptions(const std::string& path, const char* backend, Log* log) {
  maxsim_options o;
  maxsim_options_init(&o);
  o.plugin_path = path.c_str();
  o.backend = backend;
  o.num_threads = 2;
  o.log = &Log::Sink;
  o.log_user_data = log;
  return o;
}

}  // namespace maxsim::test

#endif  // MAXSIM_TESTS_PLUGIN_TEST_UTIL_H_
