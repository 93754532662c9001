// SPDX-License-Identifier: Apache-2.0
#include "plugin_host.h"

#include <dirent.h>
#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "regular_file.h"
#include "status.h"

namespace maxsim {
namespace {

// Size of the v1.0 function table: a plugin struct smaller than this lacks required members.
constexpr size_t kMinApiSize = offsetof(maxsim_plugin_api, train_backward) + sizeof(void*);

std::vector<std::string> SplitPath(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(':', start);
    if (end == std::string::npos) end = s.size();
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

bool IsDirectory(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::vector<std::string> PluginFilesIn(const std::string& dir) {
  std::vector<std::string> files;
  DIR* d = opendir(dir.c_str());
  if (!d) return files;
  while (struct dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    const size_t n_suffix = std::strlen(kPluginSuffix);
    if (name.rfind(kPluginPrefix, 0) == 0 && name.size() > n_suffix &&
        name.compare(name.size() - n_suffix, n_suffix, kPluginSuffix) == 0) {
      files.push_back(dir + "/" + name);
    }
  }
  closedir(d);
  std::sort(files.begin(), files.end());
  return files;
}

// Reads what the table implements (the host calls nothing it has not recorded here).
void ReadCapabilities(LoadedPlugin* p) {
  const maxsim_plugin_api* a = p->api;
  auto set = [&](PluginMember m, bool v) { p->has[static_cast<int>(m)] = v; };
  const bool upload = a->corpus_upload != nullptr || MAXSIM_PLUGIN_HAS(a, corpus_upload_view);
  set(PluginMember::kCorpusUpload, upload && a->corpus_free != nullptr);
  set(PluginMember::kScoreMatrix, a->score_matrix != nullptr);
  set(PluginMember::kScoreCandidates, a->score_candidates != nullptr);
  set(PluginMember::kTopK, a->topk != nullptr);
  set(PluginMember::kTrainForward, a->train_forward != nullptr);
  set(PluginMember::kTrainBackward, a->train_backward != nullptr);
  set(PluginMember::kDeviceMemory,
      MAXSIM_PLUGIN_HAS(a, mem_alloc) && MAXSIM_PLUGIN_HAS(a, mem_free) && MAXSIM_PLUGIN_HAS(a, mem_copy));
  p->accepted_memory = MAXSIM_PLUGIN_HAS_FIELD(a, accepted_memory) ? a->accepted_memory
                                                                    : MAXSIM_MEMORY_BIT(MAXSIM_MEMORY_CUDA);
  p->accepted_memory &= ~MAXSIM_MEMORY_BIT(MAXSIM_MEMORY_HOST);  // host tensors never go to the training calls
  if (MAXSIM_PLUGIN_HAS(a, describe)) p->describe = a->describe;
  if (MAXSIM_PLUGIN_HAS(a, device_count) && MAXSIM_PLUGIN_HAS(a, create_device)) {
    p->device_count = a->device_count;
    p->create_device = a->create_device;
  }
  if (MAXSIM_PLUGIN_HAS(a, dense_query_modes)) p->dense_query_modes = a->dense_query_modes;
  if (MAXSIM_PLUGIN_HAS(a, synchronize)) p->synchronize = a->synchronize;
  p->matrix_columns = MAXSIM_PLUGIN_HAS_FIELD(a, output_layouts) &&
                      (a->output_layouts & MAXSIM_PLUGIN_OUTPUT_MATRIX_COLUMNS) != 0;
}

}  // namespace

std::string LibraryDirectory() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&LibraryDirectory), &info) == 0 || info.dli_fname == nullptr) return "";
  std::string path = info.dli_fname;
  char resolved[PATH_MAX];
  if (realpath(path.c_str(), resolved)) path = resolved;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

PluginHost::~PluginHost() {
  // Backends are destroyed by the context before this runs. RTLD_NODELETE keeps the code mapped after
  // dlclose (runtimes such as CUDA's register exit handlers that must stay callable).
  for (LoadedPlugin& p : plugins_) {
    if (p.handle) dlclose(p.handle);
  }
}

void PluginHost::Discover(const std::string& extra, const LogSink& log, const maxsim_plugin_host* host) {
  std::vector<std::string> entries = SplitPath(extra);
  if (const char* env = std::getenv("MAXSIM_PLUGIN_PATH")) {
    for (const std::string& e : SplitPath(env)) entries.push_back(e);
  }
  for (const std::string& entry : entries) {
    searched_.push_back(entry);
    if (IsDirectory(entry)) {
      for (const std::string& f : PluginFilesIn(entry)) TryLoad(f, log, host);
    } else {
      TryLoad(entry, log, host);
    }
  }
  // Beside the library: <libdir>/maxsim/plugins is where `cmake --install` puts plugins; <libdir> itself is
  // where a build tree has them (next to libmaxsim.so). These are searched when they exist; a missing one is
  // not worth a warning (an installation without plugins has no such folder).
  const std::string libdir = LibraryDirectory();
  if (!libdir.empty()) {
    for (const std::string& dir : {libdir + "/maxsim/plugins", libdir}) {
      searched_.push_back(dir);
      if (IsDirectory(dir)) {
        for (const std::string& f : PluginFilesIn(dir)) TryLoad(f, log, host);
      }
    }
  }
}

void PluginHost::TryLoad(const std::string& path, const LogSink& log, const maxsim_plugin_host* host) {
  char resolved[PATH_MAX];
  const std::string real = realpath(path.c_str(), resolved) ? std::string(resolved) : path;
  if (std::find(seen_.begin(), seen_.end(), real) != seen_.end()) return;
  seen_.push_back(real);
  auto skip = [&](const std::string& reason) {
    skipped_.push_back({path, reason});
    log(MAXSIM_LOG_WARNING, "plugin " + path + " skipped: " + reason);
  };
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    skip("no such file");
    return;
  }
  if (!S_ISREG(st.st_mode)) {  // dlopen would block on a FIFO
    skip(std::string("it is ") + file::KindName(st.st_mode) + ", not a regular file");
    return;
  }
  dlerror();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!handle) {
    const char* err = dlerror();
    skip(std::string("dlopen failed: ") + (err ? err : "unknown error"));
    return;
  }
  auto entry = reinterpret_cast<maxsim_plugin_entry_fn>(dlsym(handle, MAXSIM_PLUGIN_ENTRY_SYMBOL));
  if (!entry) {
    dlclose(handle);
    skip(std::string("it does not export ") + MAXSIM_PLUGIN_ENTRY_SYMBOL + " (not a libmaxsim plugin)");
    return;
  }
  const maxsim_plugin_api* api = entry();
  std::string why;
  if (api == nullptr) {
    why = std::string(MAXSIM_PLUGIN_ENTRY_SYMBOL) + "() returned NULL";
  } else if (api->abi_major != MAXSIM_PLUGIN_ABI_MAJOR) {
    why = Format("built for plugin ABI %u.%u, this library speaks %u.%u (rebuild the plugin against this "
                 "libmaxsim)", api->abi_major, api->abi_minor, MAXSIM_PLUGIN_ABI_MAJOR, MAXSIM_PLUGIN_ABI_MINOR);
  } else if (api->struct_size < kMinApiSize) {
    why = Format("its function table is %u bytes, smaller than the %zu bytes of ABI %u.0", api->struct_size,
                 kMinApiSize, MAXSIM_PLUGIN_ABI_MAJOR);
  } else if (api->name == nullptr || api->name[0] == '\0' || api->probe == nullptr || api->create == nullptr ||
             api->destroy == nullptr) {
    why = "its table lacks a name, probe, create or destroy";
  } else if (std::strcmp(api->name, "cpu") == 0 || std::strcmp(api->name, "auto") == 0) {
    why = Format("its name '%s' is reserved", api->name);
  } else {
    for (const LoadedPlugin& p : plugins_) {
      if (p.name == api->name) why = "a plugin named '" + p.name + "' was already loaded from " + p.path;
    }
  }
  if (!why.empty()) {
    dlclose(handle);
    skip(why);
    return;
  }
  LoadedPlugin p;
  p.path = path;
  p.handle = handle;
  p.api = api;
  p.name = api->name;
  ReadCapabilities(&p);
  char info[512] = {};
  const maxsim_status probe = api->probe(host, info, sizeof(info));
  info[sizeof(info) - 1] = '\0';
  p.available = probe == MAXSIM_OK;
  p.info = info;
  if (!p.available) {
    if (p.info.empty()) p.info = Format("probe returned %s", maxsim_status_name(probe));
    log(MAXSIM_LOG_INFO, "plugin " + p.name + " (" + path + ") unavailable: " + p.info + "; using the CPU");
  }
  plugins_.push_back(std::move(p));
}

}  // namespace maxsim
