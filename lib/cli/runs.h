// SPDX-License-Identifier: Apache-2.0
// Ranked results ("runs") of the retrieval commands: the one order every command ranks by, the output formats
// (text, tsv, json, jsonl, trec), reading run, candidate and qrels files, and writing output atomically.
#ifndef MAXSIM_CLI_RUNS_H_
#define MAXSIM_CLI_RUNS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace maxsim::cli {

constexpr uint64_t kNoIndex = UINT64_MAX;

struct RunHit {
  std::string doc_id;
  float score = 0;
  uint64_t doc = kNoIndex;  // document index (global over the shards in command-line order), when known
};

struct QueryHits {
  std::string query_id;
  uint64_t query = kNoIndex;  // query index in the query file, when known
  std::vector<RunHit> hits;   // ranked: rank r + 1 is hits[r]
};
using Run = std::vector<QueryHits>;

// The ranking order of search, rerank and merge: score descending, then document index ascending (for merge:
// run-file position, then rank in that file, which is the document index order when the files are the shards'
// runs in corpus order). -inf (an empty document) ranks after every finite score.
bool RanksBefore(float score_a, uint64_t key_a, float score_b, uint64_t key_b);

enum class Format { kText, kTsv, kJson, kJsonl, kTrec };
const std::vector<std::string>& FormatNames();  // text, tsv, json, jsonl, trec
Format ParseFormat(const std::string& name);

// Text of the run in `format`. json_fields: extra members of the JSON object (`"key": value` pieces, already
// JSON) describing the command. A TREC run refuses ids with whitespace (its fields are whitespace-separated),
// naming the id.
std::string FormatRun(const Run& run, Format format, const std::string& trec_tag,
                      const std::vector<std::string>& json_fields);

// Writes `text` to `path` through a temporary file beside it, renamed into place (no partial file; refuses to
// replace anything but a regular file); to stdout when path is empty or "-".
void WriteOutput(const std::string& path, const std::string& text);

// One line of a run or candidate file.
struct RunLine {
  std::string query_id, doc_id;
  float score = 0;
  bool has_score = false;
  uint64_t rank = 0;  // 0 when the file has none
  uint64_t line = 0;  // 1-based line number, for messages
};
// Reads a TREC run (`qid Q0 docid rank score tag`, whitespace-separated), a tsv of `query_id rank doc_id
// score` (what `--format tsv` writes, header included) or a tsv of `query_id doc_id` pairs (candidates).
// need_scores: refuse files without scores. Errors name the file and line.
std::vector<RunLine> ReadRunFile(const std::string& path, bool need_scores);

// Relevance judgements: query id -> document id -> grade. TREC qrels (`qid iter docid grade`) or BEIR tsv
// (`query-id corpus-id score`, header optional). Errors name the file and line.
using Qrels = std::map<std::string, std::map<std::string, int64_t>>;
Qrels ReadQrels(const std::string& path);

}  // namespace maxsim::cli

#endif  // MAXSIM_CLI_RUNS_H_
