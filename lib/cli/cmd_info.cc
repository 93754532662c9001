// SPDX-License-Identifier: Apache-2.0
// `maxsim info`: what this machine runs and why.
#include <cstdio>

#include "cli.h"

namespace maxsim::cli {

int RunInfo(int argc, char** argv) {
  CommandSpec spec{"info", "[options]",
                   "Print the library version, the CPU features detected, every CPU kernel (selected, available, or\n"
                   "unavailable and why), the thread count, the plugins found and the backend in use.",
                   "The options show what a forced choice would do: 'maxsim info --isa scalar --threads 1'.",
                   ContextOptions(), 0, 0};
  Args args;
  if (!args.Parse(spec, argc, argv)) return kExitOk;
  maxsim_context* ctx = MakeContext(args);
  size_t needed = 0;
  maxsim_context_report(ctx, nullptr, 0, &needed);
  std::string text(needed, '\0');
  const maxsim_status st = maxsim_context_report(ctx, text.data(), text.size(), &needed);
  maxsim_context_destroy(ctx);
  Check(st, "maxsim_context_report");
  text.resize(needed - 1);
  std::fputs(text.c_str(), stdout);
  if (!text.empty() && text.back() != '\n') std::fputc('\n', stdout);
  return kExitOk;
}

}  // namespace maxsim::cli
