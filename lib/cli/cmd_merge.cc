// SPDX-License-Identifier: Apache-2.0
// `maxsim merge`: one top-k run from the runs of several shards.
#include <algorithm>
#include <cstdio>
#include <unordered_map>

#include "cli.h"
#include "runs.h"

namespace maxsim::cli {

int RunMerge(int argc, char** argv) {
  std::vector<OptionSpec> options = {
      {"k", 'k', "K", "Results per query (default: as many as the deepest input run has for that query)."}};
  for (const OptionSpec& o : OutputOptions()) options.push_back(o);
  CommandSpec spec{
      "merge", "RUN [RUN ...] [options]",
      "Merge the runs of several shards (TREC runs or 'maxsim search --format tsv' output) into one run.",
      "Give the runs in the order of their shards: ranking is score descending, then the earlier file, then\n"
      "the better rank in that file, so merging the runs of 'maxsim search' over each shard gives exactly what\n"
      "'maxsim search' over all the shards gives (scores are bit-identical on every machine). Queries appear\n"
      "in the order they first appear in the files. A document listed twice for one query is an error\n"
      "(shards hold disjoint documents).",
      options, 1, 1u << 20};
  Args args;
  if (!args.Parse(spec, argc, argv)) return kExitOk;
  const uint64_t k_asked = static_cast<uint64_t>(args.Int("k", 0, 1, UINT32_MAX));
  CheckOutputOptions(args);

  struct Entry {
    float score;
    size_t file;
    uint64_t rank, line;
    std::string doc_id;
  };
  std::vector<std::string> order;                          // query ids in first-appearance order
  std::unordered_map<std::string, std::vector<Entry>> by_query;
  std::unordered_map<std::string, size_t> depth;           // deepest input list per query
  std::unordered_map<std::string, std::string> where_seen;  // "query\tdoc" -> "file:line"
  const auto& files = args.positional();
  for (size_t f = 0; f < files.size(); ++f) {
    std::unordered_map<std::string, size_t> count;
    for (RunLine& l : ReadRunFile(files[f], true)) {
      const std::string here = files[f] + ":" + std::to_string(l.line);
      auto [it, fresh] = where_seen.emplace(l.query_id + "\t" + l.doc_id, here);
      if (!fresh) {
        throw Failure(here + ": query '" + l.query_id + "' lists document '" + l.doc_id + "' again (first at " +
                      it->second + "); merge combines the runs of disjoint shards");
      }
      if (by_query.find(l.query_id) == by_query.end()) order.push_back(l.query_id);
      by_query[l.query_id].push_back({l.score, f, l.rank, l.line, l.doc_id});
      ++count[l.query_id];
    }
    for (const auto& [qid, n] : count) depth[qid] = std::max(depth[qid], n);
  }
  Run run;
  for (const std::string& qid : order) {
    std::vector<Entry>& e = by_query[qid];
    std::sort(e.begin(), e.end(), [](const Entry& a, const Entry& b) {
      if (a.score != b.score) return a.score > b.score;
      if (a.file != b.file) return a.file < b.file;
      if (a.rank != b.rank) return a.rank < b.rank;
      return a.line < b.line;
    });
    const size_t k = k_asked ? k_asked : depth[qid];
    if (e.size() > k) e.resize(k);
    QueryHits qh;
    qh.query_id = qid;
    for (const Entry& x : e) qh.hits.push_back({x.doc_id, x.score, kNoIndex});
    run.push_back(std::move(qh));
  }
  std::string runs = "[";
  for (size_t f = 0; f < files.size(); ++f) runs += (f ? ", \"" : "\"") + JsonEscape(files[f]) + "\"";
  EmitRun(args, run, {"\"command\": \"merge\"", "\"runs\": " + runs + "]"});
  return kExitOk;
}

}  // namespace maxsim::cli
