// SPDX-License-Identifier: Apache-2.0
// What `search` and `rerank` share: their options, sorting the positional files, the JSON header, the output
// and the statistics lines.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "cli.h"
#include "regular_file.h"
#include "runs.h"

namespace maxsim::cli {

std::vector<OptionSpec> ScoringOptions() {
  return {
      {"metric", 0, "dot|cosine", "Similarity: dot (ColBERT) or cosine (default dot)."},
      {"mode", 0, "MODE", "exact | certified (i8 screening + exact refinement: the same result as exact) |\n"
                          "                            approximate (i8 argmax, one refinement: fastest, not exact). "
                          "Default exact."},
      {"query-ids", 0, "FILE", "Query ids, one UTF-8 id per line, in query order (default: 0, 1, 2, ...)."},
      {"query-mask", 0, "MASK.npy", "Query token mask, bool/uint8/int32/int64 of 0 (padding) and 1: [n, L] for\n"
                                    "                            padded queries, [n_tokens] with offsets."},
      {"validate", 0, "LEVEL", "How deeply to check packed files: standard (default), deep or fast."},
      {"stats", 0, nullptr, "Print timing and screening counters to stderr."},
  };
}

std::vector<OptionSpec> OutputOptions() {
  return {
      {"format", 0, "FORMAT", "text | tsv | json | jsonl | trec (default tsv). See docs/cli.md for each."},
      {"output", 'o', "FILE", "Write the results here (atomically: no partial file on error) instead of stdout."},
      {"tag", 0, "TAG", "Run tag, the last field of a TREC run (default maxsim)."},
  };
}

maxsim_validation ParseValidation(const Args& args) {
  const std::string v = args.Choice("validate", "standard", {"standard", "deep", "fast"});
  return v == "deep" ? MAXSIM_VALIDATE_DEEP : v == "fast" ? MAXSIM_VALIDATE_FAST : MAXSIM_VALIDATE_STANDARD;
}

namespace {
bool EndsWith(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}
}  // namespace

ScoringFiles SortScoringFiles(const std::vector<std::string>& positional, bool one_corpus, const char* command) {
  ScoringFiles f;
  std::vector<std::string> npys;
  for (const std::string& p : positional) {
    uint64_t size = 0;
    std::string error;
    const int fd = file::OpenRegular(p, &size, &error);  // a FIFO, device or folder is refused, never opened blocking
    if (fd < 0) throw Failure(error);
    close(fd);
    // By name first (so that a damaged file is reported as what it was meant to be), else by content.
    const bool npy = EndsWith(p, ".npy") || (!EndsWith(p, ".maxsim") && IsNpyFile(p));
    if (npy) {
      npys.push_back(p);
    } else if (!npys.empty()) {
      throw UsageError("'" + p + "' comes after the query files but is not a .npy file: give the packed corpus "
                       "files first, then QUERIES.npy [QUERY_OFFSETS.npy] (see 'maxsim " + command + " --help')");
    } else {
      f.corpora.push_back(p);
    }
  }
  if (f.corpora.empty()) {
    throw UsageError(std::string("'maxsim ") + command + "' needs a packed corpus file (CORPUS.maxsim) before the "
                     "query files (see 'maxsim " + command + " --help')");
  }
  if (one_corpus && f.corpora.size() > 1) {
    throw UsageError(std::string("'maxsim ") + command + "' takes one packed corpus, got " +
                     std::to_string(f.corpora.size()) + " ('" + f.corpora[1] +
                     "' is not a .npy file: a missing or misspelt query file?)");
  }
  if (npys.empty()) {
    throw UsageError(std::string("'maxsim ") + command + "' needs the queries: QUERIES.npy (a .npy file that exists) "
                     "after the corpus (see 'maxsim " + command + " --help')");
  }
  if (npys.size() > 2) {
    throw UsageError("'" + npys[2] + "' is extra: the queries are QUERIES.npy and, for [tokens, dim] queries, "
                     "QUERY_OFFSETS.npy");
  }
  f.queries = npys[0];
  if (npys.size() == 2) f.query_offsets = npys[1];
  return f;
}

void ScoringSession::Open(const Args& args, const ScoringFiles& files) {
  metric = ParseMetric(args.Choice("metric", "dot", {"dot", "cosine"}));
  mode = ParseMode(args.Choice("mode", "exact", {"exact", "certified", "approximate"}));
  CheckOutputOptions(args);
  ctx = MakeContext(args);
  corpus.Load(files.corpora, ParseValidation(args));
  queries = ReadQueries(files.queries, files.query_offsets, args.Str("query-mask", ""));
  const uint32_t dim = corpus.shards[0].desc.dim;
  if (queries.tokens.dim != dim) {
    throw Failure(files.queries + " has token dimension " + std::to_string(queries.tokens.dim) + " but " +
                  files.corpora[0] + " has dimension " + std::to_string(dim) +
                  ": queries and corpus must come from the same embedding model");
  }
  query_ids = QueryIds(args.Str("query-ids", ""), queries.n);
}

std::vector<std::string> JsonFields(const char* command, const ScoringFiles& files, maxsim_metric metric,
                                    maxsim_mode mode, maxsim_context* ctx) {
  std::string corpora = "[";
  for (size_t i = 0; i < files.corpora.size(); ++i) {
    corpora += (i ? ", \"" : "\"") + JsonEscape(files.corpora[i]) + "\"";
  }
  corpora += "]";
  return {std::string("\"command\": \"") + command + "\"", "\"corpus\": " + corpora,
          "\"queries\": \"" + JsonEscape(files.queries) + "\"", std::string("\"metric\": \"") + MetricName(metric) + "\"",
          std::string("\"mode\": \"") + ModeName(mode) + "\"",
          "\"kernel\": \"" + JsonEscape(maxsim_context_kernel(ctx)) + "\"",
          "\"backend\": \"" + JsonEscape(maxsim_context_backend(ctx)) + "\""};
}

void CheckOutputOptions(const Args& args) {
  ParseFormat(args.Str("format", "tsv"));
  const std::string tag = args.Str("tag", "maxsim");
  for (unsigned char c : tag) {
    if (std::isspace(c) || c < 0x20) throw UsageError("--tag '" + tag + "' must not contain whitespace");
  }
  if (tag.empty()) throw UsageError("--tag must not be empty");
}

void EmitRun(const Args& args, const Run& run, const std::vector<std::string>& json_fields) {
  CheckOutputOptions(args);
  WriteOutput(args.Str("output", ""),
              FormatRun(run, ParseFormat(args.Str("format", "tsv")), args.Str("tag", "maxsim"), json_fields));
}

void AddStats(const maxsim_stats& part, maxsim_stats* total) {
  total->pairs += part.pairs;
  total->query_tokens += part.query_tokens;
  total->refined += part.refined;
  total->multi_candidate += part.multi_candidate;
  total->docs_pruned += part.docs_pruned;
}

void PrintStats(const char* command, const maxsim_stats& s, uint64_t n_queries, uint64_t n_docs, maxsim_mode mode,
                maxsim_metric metric, maxsim_context* ctx, double load_seconds, double score_seconds,
                double pairs) {
  std::fprintf(stderr,
               "%s: %llu queries x %llu documents, mode %s, metric %s, kernel %s, backend %s, %d threads\n"
               "  load+validate+read %s, scoring %s (%s query-document pairs/s)\n",
               command, static_cast<unsigned long long>(n_queries), static_cast<unsigned long long>(n_docs),
               ModeName(mode), MetricName(metric), maxsim_context_kernel(ctx), maxsim_context_backend(ctx),
               maxsim_context_num_threads(ctx), HumanSeconds(load_seconds).c_str(), HumanSeconds(score_seconds).c_str(),
               HumanCount(pairs / std::max(score_seconds, 1e-9)).c_str());
  std::fprintf(stderr,
               "  pairs scored %llu, documents pruned by their bound %llu, query-token evaluations %llu,\n"
               "  document tokens refined %llu, evaluations with more than one candidate %llu\n",
               static_cast<unsigned long long>(s.pairs), static_cast<unsigned long long>(s.docs_pruned),
               static_cast<unsigned long long>(s.query_tokens), static_cast<unsigned long long>(s.refined),
               static_cast<unsigned long long>(s.multi_candidate));
}

}  // namespace maxsim::cli
