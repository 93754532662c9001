// SPDX-License-Identifier: Apache-2.0
// Shared pieces of the `maxsim` command-line tool: option parsing, errors, progress display, input loading,
// the synthetic ColBERT-like corpus used by `demo` and `bench`, and a naive reference scorer.
//
// The tool talks to libmaxsim only through the public C API (maxsim.h / maxsim.hpp); it is an example of
// how an application uses the library as much as a tool.
#ifndef MAXSIM_CLI_CLI_H_
#define MAXSIM_CLI_CLI_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "maxsim/maxsim.h"

namespace maxsim::cli {

// Exit codes (docs/cli.md lists them).
constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;   // bad input data, I/O or library error
constexpr int kExitUsage = 2;     // bad command line
constexpr int kExitCheck = 3;     // `demo`: certified differed from exact

// A bad command line: printed with a pointer to --help, exit code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Anything else that stops a command (bad file, library error): exit code 1.
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws Failure with "<what>: MAXSIM_ERR_...: <library message>" if status is not MAXSIM_OK.
void Check(maxsim_status status, const std::string& what);

// ---- options ----------------------------------------------------------------------------------------------

struct OptionSpec {
  const char* name;        // long name without "--" ("threads")
  char short_name;         // 0 if none ('k' for -k)
  const char* value_name;  // nullptr for a flag, else shown in the help ("N")
  const char* help;
};

struct CommandSpec {
  const char* name;        // "search"
  const char* usage;       // "CORPUS.maxsim QUERIES.npy QUERY_OFFSETS.npy [options]"
  const char* summary;     // one line
  const char* details;     // paragraphs after the usage (may be "")
  std::vector<OptionSpec> options;
  size_t min_positional = 0;
  size_t max_positional = 0;
};

// Parsed command line of one subcommand. Accepts "--name value", "--name=value", "-k value", "-kVALUE",
// and "--" to end the options. Unknown options, missing values and a wrong number of positional arguments
// throw UsageError naming the problem.
class Args {
 public:
  // Returns false (after printing the help to stdout) if --help/-h was given.
  bool Parse(const CommandSpec& spec, int argc, char** argv);
  const std::vector<std::string>& positional() const { return positional_; }
  bool Has(const std::string& name) const;
  std::string Str(const std::string& name, const std::string& fallback) const;
  // Strict integer parsing within [lo, hi]; the message names the option and the accepted range.
  int64_t Int(const std::string& name, int64_t fallback, int64_t lo, int64_t hi) const;
  double Real(const std::string& name, double fallback, double lo, double hi) const;
  // One of `choices` (the message lists them).
  std::string Choice(const std::string& name, const std::string& fallback,
                     const std::vector<std::string>& choices) const;

 private:
  const CommandSpec* spec_ = nullptr;
  std::vector<std::string> positional_;
  std::vector<std::pair<std::string, std::string>> values_;
};

void PrintHelp(const CommandSpec& spec);

// Options every scoring command shares: --threads, --isa, --backend, --no-progress.
std::vector<OptionSpec> ContextOptions();
// Creates a context from those options (plugins loaded unless --backend cpu). Throws Failure.
maxsim_context* MakeContext(const Args& args, int default_threads = 0);

maxsim_mode ParseMode(const std::string& s);
maxsim_metric ParseMetric(const std::string& s);
const char* ModeName(maxsim_mode m);
const char* MetricName(maxsim_metric m);
const char* DtypeName(maxsim_dtype d);

// ---- progress ---------------------------------------------------------------------------------------------

// A one-line progress display on stderr, redrawn by a background thread every 100 ms, only when stderr is a
// terminal (and neither --no-progress, --quiet nor MAXSIM_NO_PROGRESS is set), or when asked with --progress:
// then, if stderr is not a terminal (a log file), one line per second and a last line when the step ends. With
// total == 0 it shows the stage name and the elapsed time (for single long library calls); otherwise a bar,
// the percentage, counts, rate and ETA. The library itself never prints: counts come from the caller (Add,
// Set), e.g. from the library's progress callback.
class Progress {
 public:
  static void Disable();               // --no-progress, --quiet
  static void Force();                 // --progress
  static bool Enabled();               // stderr is a terminal (or forced) and not disabled
  Progress(std::string label, uint64_t total, const char* unit = "");
  ~Progress();                          // clears the line (a terminal) or prints the last one (a log)
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  void Add(uint64_t n) { done_.fetch_add(n, std::memory_order_relaxed); }
  void Set(uint64_t done) { done_.store(done, std::memory_order_relaxed); }
  void Stage(const std::string& label);  // changes the label (stage displays)

 private:
  void Loop();
  std::string Line();
  void Draw();
  std::string label_;
  uint64_t total_;
  const char* unit_;
  std::atomic<uint64_t> done_{0};
  std::atomic<bool> stop_{false};
  std::chrono::steady_clock::time_point start_;
  std::thread thread_;
  bool active_ = false;
  bool lines_ = false;  // forced onto a non-terminal: whole lines, not redraws
  std::mutex mu_;  // guards label_
};

// ---- timing and formatting --------------------------------------------------------------------------------

inline double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
std::string HumanCount(double v);      // 12.3K, 4.56M
std::string HumanSeconds(double s);    // "12.3 ms"
std::string HumanBytes(double bytes);  // "1.23 GB"
std::string JsonEscape(const std::string& s);
std::string FloatText(float v);        // shortest round-trip text ("%.9g"); "-inf" for -infinity

// ---- input files ------------------------------------------------------------------------------------------

// A token matrix [n, dim] read from .npy (f32, f16 or bf16 kept as read).
struct Tokens {
  maxsim_dtype dtype = MAXSIM_F32;
  uint32_t dim = 0;
  uint64_t rows = 0;
  std::vector<uint8_t> data;
};
Tokens ReadTokens(const std::string& path);
// Offsets [n_sets + 1] (int64 or uint64 .npy): must start at 0, never decrease and end at `rows`.
std::vector<uint64_t> ReadOffsets(const std::string& path, uint64_t rows, const std::string& tokens_path);
// Numeric ids, one per set: an int64/uint64 .npy [n_sets].
std::vector<uint64_t> ReadNumericIds(const std::string& path, uint64_t n_sets);
// String ids: a text file with one non-empty UTF-8 id per line (no tab; "\r\n" line ends accepted), exactly
// n_sets lines. `sets` names them in messages ("documents"). Errors name the file and line.
std::vector<std::string> ReadStringIds(const std::string& path, uint64_t n_sets, const char* sets);
bool IsNpyFile(const std::string& path);  // starts with the .npy magic
// Every line of a text file, without its line end ("\n" or "\r\n").
std::vector<std::string> ReadLines(const std::string& path);

// Query sets as models emit them: tokens [n_tokens, dim] + offsets, or padded [n, L, dim] (no offsets), each
// with an optional mask (bool/uint8/int32/int64 of 0 and 1, shaped like the tokens without dim: padding = 0).
struct Queries {
  Tokens tokens;
  std::vector<uint64_t> offsets;  // empty for padded queries
  uint64_t set_length = 0;        // L, padded queries only
  std::vector<uint8_t> mask;      // empty: every token counts
  uint64_t n = 0;
  // Queries [begin, end) for the C API (a view: *this must outlive it).
  maxsim_dense_sets Dense(uint64_t begin, uint64_t end) const;
};
Queries ReadQueries(const std::string& tokens_path, const std::string& offsets_path, const std::string& mask_path);
// The query ids of --query-ids (one per line), or "0", "1", ... without that file.
std::vector<std::string> QueryIds(const std::string& path, uint64_t n);

// Packed files searched as one corpus: document j of shard s has global index shards[s].first + j.
struct Shard {
  std::string path;
  maxsim_packed* packed = nullptr;
  maxsim_packed_desc desc{};
  uint64_t first = 0;
};
struct Corpus {
  std::vector<Shard> shards;
  uint64_t n_docs = 0;
  Corpus() = default;
  Corpus(const Corpus&) = delete;
  Corpus& operator=(const Corpus&) = delete;
  ~Corpus();
  void Load(const std::vector<std::string>& paths, maxsim_validation level);  // same dim everywhere
  // The document's string id, else its numeric id, else its global index, as text.
  std::string DocId(size_t shard, uint64_t local) const;
};
// Converts tokens to f16 or bf16 (round to nearest even); a value outside the f16 range is an error naming it.
void ConvertTokens(Tokens* t, maxsim_dtype to, const std::string& path);

// ---- what search and rerank share ---------------------------------------------------------------------------

// --metric, --mode, --validate, --query-ids, --query-mask, --stats; and --format, --output, --tag.
std::vector<OptionSpec> ScoringOptions();
std::vector<OptionSpec> OutputOptions();
maxsim_validation ParseValidation(const Args& args);
// Positional files sorted by content: packed files (corpus shards, in order), then QUERIES.npy and optionally
// QUERY_OFFSETS.npy. Throws UsageError naming what is missing or extra.
struct ScoringFiles {
  std::vector<std::string> corpora;
  std::string queries, query_offsets;
};
ScoringFiles SortScoringFiles(const std::vector<std::string>& positional, bool one_corpus, const char* command);
// The "key": value members the JSON output starts with.
std::vector<std::string> JsonFields(const char* command, const ScoringFiles& files, maxsim_metric metric,
                                    maxsim_mode mode, maxsim_context* ctx);
// What a scoring command works on: its context (from the context options), the corpus (every shard) and the
// queries with their ids, checked against each other.
struct ScoringSession {
  maxsim_metric metric = MAXSIM_METRIC_DOT;  // --metric
  maxsim_mode mode = MAXSIM_MODE_EXACT;      // --mode
  maxsim_context* ctx = nullptr;
  Corpus corpus;
  Queries queries;
  std::vector<std::string> query_ids;
  ScoringSession() = default;
  ScoringSession(const ScoringSession&) = delete;
  ScoringSession& operator=(const ScoringSession&) = delete;
  ~ScoringSession() { maxsim_context_destroy(ctx); }
  // Reads --metric, --mode, --format and --tag (usage errors come before any work), then opens everything.
  void Open(const Args& args, const ScoringFiles& files);
};
struct QueryHits;
// Checks --format and --tag (usage errors, before any work).
void CheckOutputOptions(const Args& args);
// Formats `run` as --format asks and writes it to --output (atomically) or stdout.
void EmitRun(const Args& args, const std::vector<QueryHits>& run, const std::vector<std::string>& json_fields);
// Adds one call's counters to a running total.
void AddStats(const maxsim_stats& part, maxsim_stats* total);
void PrintStats(const char* command, const maxsim_stats& s, uint64_t n_queries, uint64_t n_docs, maxsim_mode mode,
                maxsim_metric metric, maxsim_context* ctx, double load_seconds, double score_seconds,
                double pairs);

// ---- synthetic data and the naive scorer ------------------------------------------------------------------

// A deterministic ColBERT-like corpus: unit-norm tokens clustered around `n_topics` directions; each document
// draws its tokens from a few topics; each query is built from one "source" document's tokens plus noise, so
// that document should rank first. Identical for a given seed on every machine and thread count.
struct SynthSpec {
  uint64_t n_docs = 2000;
  uint32_t min_len = 60, max_len = 300;  // document lengths, uniform
  uint32_t dim = 128;
  uint64_t n_queries = 8;
  uint32_t query_len = 32;
  uint64_t seed = 42;
  uint32_t n_topics = 256;
  bool fixed_len = false;                // every document has exactly max_len tokens
};
struct SynthData {
  uint32_t dim = 0;
  std::vector<float> docs, queries;      // row-major f32
  std::vector<uint64_t> doc_offsets, query_offsets;
  std::vector<uint64_t> query_source;    // the document each query was drawn from

  // Views of the data for the C API (no copy); the first n query sets.
  maxsim_dense_sets DocSets() const { return Sets(docs.data(), doc_offsets); }
  maxsim_dense_sets QuerySets(uint64_t n) const {
    maxsim_dense_sets s = Sets(queries.data(), query_offsets);
    s.n_sets = n;
    return s;
  }

 private:
  maxsim_dense_sets Sets(const float* rows, const std::vector<uint64_t>& offsets) const {
    maxsim_dense_sets s{};
    s.struct_size = sizeof(s);
    s.data = rows;
    s.dtype = MAXSIM_F32;
    s.dim = dim;
    s.n_sets = offsets.empty() ? 0 : offsets.size() - 1;
    s.offsets = offsets.data();
    return s;
  }
};
SynthData MakeSynthetic(const SynthSpec& spec, Progress* progress = nullptr);

// The textbook loops: for each query token, for each document token, a dot product, keep the max, sum.
// Used as the baseline that `bench` reports ratios against. Splits documents over `threads` std::threads.
void NaiveScores(const float* q, uint64_t lq, const float* docs, const uint64_t* offsets, uint64_t n_docs,
                 uint32_t dim, int threads, float* scores);

// ---- subcommands ------------------------------------------------------------------------------------------

int RunInfo(int argc, char** argv);
int RunPack(int argc, char** argv);
int RunSearch(int argc, char** argv);
int RunRerank(int argc, char** argv);
int RunMerge(int argc, char** argv);
int RunEval(int argc, char** argv);
int RunDemo(int argc, char** argv);
int RunBench(int argc, char** argv);

}  // namespace maxsim::cli

#endif  // MAXSIM_CLI_CLI_H_
