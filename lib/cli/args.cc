// SPDX-License-Identifier: Apache-2.0
// Command-line parsing, help text, shared options and the context they describe.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cli.h"

namespace maxsim::cli {

void Check(maxsim_status status, const std::string& what) {
  if (status == MAXSIM_OK) return;
  throw Failure(what + ": " + maxsim_status_name(status) + ": " + maxsim_last_error());
}

namespace {

const OptionSpec* Find(const CommandSpec& spec, const std::string& long_name, char short_name) {
  for (const OptionSpec& o : spec.options) {
    if ((!long_name.empty() && long_name == o.name) || (short_name != 0 && short_name == o.short_name)) return &o;
  }
  return nullptr;
}

std::string HelpHint(const CommandSpec& spec) {
  return std::string(" (see 'maxsim ") + spec.name + " --help')";
}

std::string Joined(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "|" : "") + v[i];
  return s;
}

}  // namespace

void PrintHelp(const CommandSpec& spec) {
  std::printf("Usage: maxsim %s %s\n\n%s\n", spec.name, spec.usage, spec.summary);
  if (spec.details && spec.details[0]) std::printf("\n%s\n", spec.details);
  if (!spec.options.empty()) std::printf("\nOptions:\n");
  for (const OptionSpec& o : spec.options) {
    std::string left = "  ";
    left += o.short_name ? std::string("-") + o.short_name + ", " : std::string("    ");
    left += std::string("--") + o.name;
    if (o.value_name) left += std::string(" ") + o.value_name;
    if (left.size() < 28) left.append(28 - left.size(), ' ');
    else left += "\n" + std::string(28, ' ');
    std::printf("%s%s\n", left.c_str(), o.help);
  }
  std::printf("  -h, --help                Show this help.\n");
}

bool Args::Parse(const CommandSpec& spec, int argc, char** argv) {
  spec_ = &spec;
  bool options_done = false;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (options_done || a.size() < 2 || a[0] != '-') {
      positional_.push_back(a);
      continue;
    }
    if (a == "--") {
      options_done = true;
      continue;
    }
    if (a == "-h" || a == "--help") {
      PrintHelp(spec);
      return false;
    }
    const OptionSpec* o = nullptr;
    std::string value;
    bool has_value = false;
    if (a[1] == '-') {
      const size_t eq = a.find('=');
      const std::string name = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
      o = Find(spec, name, 0);
      if (!o) throw UsageError("unknown option '--" + name + "' for 'maxsim " + spec.name + "'" + HelpHint(spec));
      if (eq != std::string::npos) {
        value = a.substr(eq + 1);
        has_value = true;
      }
    } else {
      o = Find(spec, "", a[1]);
      if (!o) throw UsageError("unknown option '" + a.substr(0, 2) + "' for 'maxsim " + spec.name + "'" + HelpHint(spec));
      if (a.size() > 2) {
        value = a.substr(a[2] == '=' ? 3 : 2);
        has_value = true;
      }
    }
    if (!o->value_name) {
      if (has_value) throw UsageError(std::string("option --") + o->name + " takes no value" + HelpHint(spec));
      values_.emplace_back(o->name, "1");
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argc) {
        throw UsageError(std::string("option --") + o->name + " needs a value (" + o->value_name + ")" +
                         HelpHint(spec));
      }
      value = argv[++i];
    }
    values_.emplace_back(o->name, value);
  }
  if (positional_.size() < spec.min_positional || positional_.size() > spec.max_positional) {
    std::string msg = "'maxsim " + std::string(spec.name) + "' takes ";
    if (spec.min_positional == spec.max_positional) {
      msg += std::to_string(spec.min_positional);
    } else {
      msg += std::to_string(spec.min_positional) + " to " + std::to_string(spec.max_positional);
    }
    msg += " file argument" + std::string(spec.max_positional == 1 ? "" : "s") + " but got " +
           std::to_string(positional_.size());
    if (positional_.size() > spec.max_positional) msg += " ('" + positional_[spec.max_positional] + "' is extra)";
    msg += "; usage: maxsim " + std::string(spec.name) + " " + spec.usage;
    throw UsageError(msg);
  }
  return true;
}

bool Args::Has(const std::string& name) const {
  for (const auto& kv : values_) {
    if (kv.first == name) return true;
  }
  return false;
}

std::string Args::Str(const std::string& name, const std::string& fallback) const {
  std::string v = fallback;
  for (const auto& kv : values_) {
    if (kv.first == name) v = kv.second;  // the last occurrence wins
  }
  return v;
}

int64_t Args::Int(const std::string& name, int64_t fallback, int64_t lo, int64_t hi) const {
  if (!Has(name)) return fallback;
  const std::string s = Str(name, "");
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE || v < lo || v > hi) {
    throw UsageError("--" + name + " '" + s + "' is not an integer from " + std::to_string(lo) + " to " +
                     std::to_string(hi) + HelpHint(*spec_));
  }
  return v;
}

double Args::Real(const std::string& name, double fallback, double lo, double hi) const {
  if (!Has(name)) return fallback;
  const std::string s = Str(name, "");
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !std::isfinite(v) || v < lo || v > hi) {
    char range[96];
    std::snprintf(range, sizeof(range), " from %g to %g", lo, hi);
    throw UsageError("--" + name + " '" + s + "' is not a number" + range + HelpHint(*spec_));
  }
  return v;
}

std::string Args::Choice(const std::string& name, const std::string& fallback,
                         const std::vector<std::string>& choices) const {
  const std::string v = Str(name, fallback);
  for (const std::string& c : choices) {
    if (v == c) return v;
  }
  throw UsageError("--" + name + " '" + v + "' is not one of " + Joined(choices) + HelpHint(*spec_));
}

std::vector<OptionSpec> ContextOptions() {
  return {
      {"threads", 't', "N", "Threads for scoring and packing (default: MAXSIM_NUM_THREADS, else all cores)."},
      {"isa", 0, "NAME", "Force a CPU kernel by name (see 'maxsim info'; default: MAXSIM_ISA, else the best)."},
      {"backend", 0, "NAME", "auto, cpu, or a plugin name such as cuda (default: MAXSIM_BACKEND, else auto)."},
      {"no-progress", 0, nullptr, "Never draw a progress line (it is only drawn when stderr is a terminal)."},
      {"progress", 0, nullptr, "Show progress on stderr even when it is not a terminal (a line a second)."},
      {"quiet", 0, nullptr, "No progress line and no summary: only results (and errors) are printed."},
      {"verbose", 'v', nullptr, "Print the library's log messages (plugins tried, backend chosen) to stderr."},
  };
}

namespace {
void LogToStderr(void*, maxsim_log_level level, const char* message) {
  const char* name = level == MAXSIM_LOG_DEBUG ? "debug" : level == MAXSIM_LOG_INFO ? "info"
                     : level == MAXSIM_LOG_WARNING ? "warning" : "error";
  std::fprintf(stderr, "libmaxsim %s: %s\n", name, message);
}
}  // namespace

maxsim_context* MakeContext(const Args& args, int default_threads) {
  if (args.Has("progress")) Progress::Force();
  if (args.Has("no-progress") || args.Has("quiet")) Progress::Disable();
  maxsim_options o;
  maxsim_options_init(&o);
  if (args.Has("verbose")) o.log = LogToStderr;
  o.num_threads = static_cast<int32_t>(args.Int("threads", default_threads, 1, 4096));
  const std::string isa = args.Str("isa", "");
  const std::string backend = args.Str("backend", "");
  o.isa = isa.empty() ? nullptr : isa.c_str();
  o.backend = backend.empty() ? nullptr : backend.c_str();
  if (backend == "cpu") o.load_plugins = 0;
  maxsim_context* ctx = nullptr;
  const maxsim_status st = maxsim_context_create(&o, &ctx);
  if (st != MAXSIM_OK) {
    throw Failure(std::string("cannot create a libmaxsim context: ") + maxsim_status_name(st) + ": " +
                  maxsim_last_error());
  }
  return ctx;
}

maxsim_mode ParseMode(const std::string& s) {
  if (s == "exact") return MAXSIM_MODE_EXACT;
  if (s == "certified") return MAXSIM_MODE_CERTIFIED;
  if (s == "approximate") return MAXSIM_MODE_APPROXIMATE;
  throw UsageError("--mode '" + s + "' is not one of exact|certified|approximate");
}

maxsim_metric ParseMetric(const std::string& s) {
  if (s == "dot") return MAXSIM_METRIC_DOT;
  if (s == "cosine") return MAXSIM_METRIC_COSINE;
  throw UsageError("--metric '" + s + "' is not one of dot|cosine");
}

const char* ModeName(maxsim_mode m) {
  switch (m) {
    case MAXSIM_MODE_EXACT: return "exact";
    case MAXSIM_MODE_CERTIFIED: return "certified";
    case MAXSIM_MODE_APPROXIMATE: return "approximate";
    default: return "?";
  }
}

const char* MetricName(maxsim_metric m) { return m == MAXSIM_METRIC_COSINE ? "cosine" : "dot"; }

const char* DtypeName(maxsim_dtype d) {
  switch (d) {
    case MAXSIM_F32: return "f32";
    case MAXSIM_F16: return "f16";
    case MAXSIM_BF16: return "bf16";
    default: return "?";
  }
}

}  // namespace maxsim::cli
