// SPDX-License-Identifier: Apache-2.0
// `maxsim rerank`: score each query's candidate documents exactly and print them re-sorted.
#include <algorithm>
#include <cstdio>
#include <unordered_map>

#include "cli.h"
#include "runs.h"

namespace maxsim::cli {

int RunRerank(int argc, char** argv) {
  std::vector<OptionSpec> options = {
      {"candidates", 'c', "FILE", "Candidates per query (required): a TREC run, a tsv of query_id/doc_id pairs,\n"
                                  "                            or a tsv run as 'maxsim search --format tsv' writes."},
      {"k", 'k', "K", "Keep each query's best K after reranking (default: all its candidates)."},
  };
  for (const auto& group : {ScoringOptions(), OutputOptions(), ContextOptions()}) {
    options.insert(options.end(), group.begin(), group.end());
  }
  CommandSpec spec{
      "rerank", "CORPUS.maxsim QUERIES.npy [QUERY_OFFSETS.npy] -c CANDIDATES [options]",
      "Score each query against its candidate documents (maxsim_score_candidates) and print them re-sorted.",
      "Candidates name queries by query id (--query-ids; default 0, 1, ...) and documents by the corpus's ids\n"
      "(string ids, else numeric ids, else the document number); scores and ranks in the file are ignored.\n"
      "Queries are printed in query order; a query without candidates is left out. Ranking: score\n"
      "descending, ties by the lower document number (as 'maxsim search').",
      options, 1, 3};
  Args args;
  if (!args.Parse(spec, argc, argv)) return kExitOk;
  const std::string cand_path = args.Str("candidates", "");
  if (cand_path.empty()) throw UsageError("'maxsim rerank' needs the candidates: -c CANDIDATES (a TREC run or tsv)");
  const uint64_t k = static_cast<uint64_t>(args.Int("k", 0, 1, UINT32_MAX));
  const ScoringFiles files = SortScoringFiles(args.positional(), true, "rerank");

  const double t0 = Now();
  ScoringSession session;
  session.Open(args, files);
  maxsim_context* ctx = session.ctx;
  const maxsim_metric metric = session.metric;
  const maxsim_mode mode = session.mode;
  const Corpus& corpus = session.corpus;
  const Queries& q = session.queries;
  const std::vector<std::string>& qids = session.query_ids;
  const std::string qids_path = args.Str("query-ids", "");
  std::unordered_map<std::string, uint64_t> query_of, doc_of;
  for (uint64_t i = 0; i < q.n; ++i) {
    if (!query_of.emplace(qids[i], i).second) {
      throw Failure(qids_path + ":" + std::to_string(i + 1) + ": query id '" + qids[i] + "' appears twice (lines " +
                    std::to_string(query_of[qids[i]] + 1) + " and " + std::to_string(i + 1) + ")");
    }
  }
  constexpr uint64_t kAmbiguous = kNoIndex - 1;
  for (uint64_t j = 0; j < corpus.n_docs; ++j) {
    auto [it, fresh] = doc_of.emplace(corpus.DocId(0, j), j);
    if (!fresh) it->second = kAmbiguous;
  }

  // Candidates grouped by query, in file order within a query; repeats of a (query, document) pair refused.
  const std::vector<RunLine> lines = ReadRunFile(cand_path, false);
  std::vector<std::vector<uint64_t>> per_query(q.n);
  std::unordered_map<std::string, uint64_t> seen;  // "query\tdoc" -> line
  for (const RunLine& l : lines) {
    const std::string where = cand_path + ":" + std::to_string(l.line);
    auto qi = query_of.find(l.query_id);
    if (qi == query_of.end()) {
      throw Failure(where + ": query id '" + l.query_id + "' is not one of the " + std::to_string(q.n) +
                    " queries" + (qids_path.empty() ? " (without --query-ids they are 0, 1, ...)" : " of " + qids_path));
    }
    auto dj = doc_of.find(l.doc_id);
    if (dj == doc_of.end()) throw Failure(where + ": document id '" + l.doc_id + "' is not in " + files.corpora[0]);
    if (dj->second == kAmbiguous) {
      throw Failure(where + ": document id '" + l.doc_id + "' names more than one document of " + files.corpora[0]);
    }
    auto [it, fresh] = seen.emplace(l.query_id + "\t" + l.doc_id, l.line);
    if (!fresh) {
      throw Failure(where + ": query '" + l.query_id + "' lists document '" + l.doc_id + "' again (first on line " +
                    std::to_string(it->second) + ")");
    }
    per_query[qi->second].push_back(dj->second);
  }
  std::vector<uint64_t> cand_offsets{0}, candidates;
  for (const auto& c : per_query) {
    candidates.insert(candidates.end(), c.begin(), c.end());
    cand_offsets.push_back(candidates.size());
  }
  const double t1 = Now();

  std::vector<float> scores(candidates.size());
  maxsim_stats stats{};
  maxsim_score_options so;
  maxsim_score_options_init(&so);
  so.metric = metric;
  so.mode = mode;
  so.stats = &stats;
  {
    Progress p("reranking " + HumanCount(static_cast<double>(candidates.size())) + " candidates", 0);
    const maxsim_dense_sets qs = q.Dense(0, q.n);
    maxsim_sets qsets{nullptr, &qs};
    maxsim_sets dsets{corpus.shards[0].packed, nullptr};
    Check(maxsim_score_candidates(ctx, &qsets, &dsets, cand_offsets.data(), candidates.data(), &so, scores.data(),
                                  nullptr),
          "reranking against " + files.corpora[0]);
  }
  Run run;
  for (uint64_t i = 0; i < q.n; ++i) {
    if (per_query[i].empty()) continue;
    QueryHits qh;
    qh.query_id = qids[i];
    qh.query = i;
    for (uint64_t c = cand_offsets[i]; c < cand_offsets[i + 1]; ++c) {
      qh.hits.push_back({std::string(), scores[c], candidates[c]});
    }
    std::sort(qh.hits.begin(), qh.hits.end(),
              [](const RunHit& a, const RunHit& b) { return RanksBefore(a.score, a.doc, b.score, b.doc); });
    if (k > 0 && qh.hits.size() > k) qh.hits.resize(k);
    for (RunHit& h : qh.hits) h.doc_id = corpus.DocId(0, h.doc);
    run.push_back(std::move(qh));
  }
  const double t2 = Now();
  std::vector<std::string> json = JsonFields("rerank", files, metric, mode, ctx);
  json.push_back("\"candidates\": \"" + JsonEscape(cand_path) + "\"");
  EmitRun(args, run, json);
  if (args.Has("stats")) {
    PrintStats("rerank", stats, q.n, corpus.n_docs, mode, metric, ctx, t1 - t0, t2 - t1,
               static_cast<double>(candidates.size()));
  }
  return kExitOk;
}

}  // namespace maxsim::cli
