// SPDX-License-Identifier: Apache-2.0
// The `maxsim` command-line tool: info, pack, search, rerank, merge, eval, demo, bench. docs/cli.md shows each with real output.
#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include "cli.h"

namespace {

struct Command {
  const char* name;
  int (*run)(int, char**);
  const char* summary;
};

const Command kCommands[] = {
    {"info", maxsim::cli::RunInfo, "CPU features, CPU kernels (selected/available/why not), threads, plugins"},
    {"pack", maxsim::cli::RunPack, "pack .npy token vectors + offsets [+ ids] into a .maxsim file"},
    {"search", maxsim::cli::RunSearch, "top-k of .npy queries over a packed corpus or shards (text/tsv/json/jsonl/trec)"},
    {"rerank", maxsim::cli::RunRerank, "score each query's candidate documents exactly and re-sort them"},
    {"merge", maxsim::cli::RunMerge, "merge the runs of several shards into one exact top-k run"},
    {"eval", maxsim::cli::RunEval, "nDCG@k, recall@k, MRR@k, MAP of a run against qrels (trec_eval conventions)"},
    {"demo", maxsim::cli::RunDemo, "synthetic ColBERT-like corpus: pack, search, time, check certified == exact"},
    {"bench", maxsim::cli::RunBench, "quick throughput table for the canonical shape, against naive loops"},
};

void Usage(std::FILE* f) {
  std::fprintf(f,
               "maxsim %s: exact late-interaction (MaxSim / ColBERT) scoring\n\n"
               "Usage: maxsim COMMAND [options]    (maxsim COMMAND --help for details)\n\nCommands:\n",
               maxsim_version_string());
  for (const Command& c : kCommands) std::fprintf(f, "  %-8s %s\n", c.name, c.summary);
  std::fprintf(f,
               "\nEnvironment: MAXSIM_NUM_THREADS, MAXSIM_ISA, MAXSIM_BACKEND, MAXSIM_PLUGIN_PATH, "
               "MAXSIM_NO_PROGRESS.\n"
               "Exit codes: 0 success, 1 failure (input, I/O, library), 2 bad command line, 3 demo check failed.\n");
}

}  // namespace

int main(int argc, char** argv) {
  using namespace maxsim::cli;
  if (argc < 2) {
    Usage(stderr);
    return kExitUsage;
  }
  std::string cmd = argv[1];
  if (cmd == "-h" || cmd == "--help") {
    Usage(stdout);
    return kExitOk;
  }
  if (cmd == "--version" || cmd == "version") {
    std::printf("maxsim %s\n", maxsim_version_string());
    return kExitOk;
  }
  int first = 2;
  if (cmd == "help") {
    if (argc < 3) {
      Usage(stdout);
      return kExitOk;
    }
    cmd = argv[2];
    static char help_flag[] = "--help";
    argv[2] = help_flag;
    first = 2;
  }
  for (const Command& c : kCommands) {
    if (cmd != c.name) continue;
    try {
      return c.run(argc - first, argv + first);
    } catch (const UsageError& e) {
      std::fprintf(stderr, "maxsim %s: error: %s\n", c.name, e.what());
      return kExitUsage;
    } catch (const Failure& e) {
      std::fprintf(stderr, "maxsim %s: error: %s\n", c.name, e.what());
      return kExitFailure;
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "maxsim %s: error: out of memory\n", c.name);
      return kExitFailure;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "maxsim %s: error: %s\n", c.name, e.what());
      return kExitFailure;
    }
  }
  std::string names;
  for (const Command& c : kCommands) names += std::string(names.empty() ? "" : ", ") + c.name;
  std::fprintf(stderr, "maxsim: unknown command '%s' (commands: %s; see maxsim --help)\n", cmd.c_str(), names.c_str());
  return kExitUsage;
}
