// SPDX-License-Identifier: Apache-2.0
// `maxsim eval`: nDCG@k, recall@k, MRR@k and MAP of a run against relevance judgements, with trec_eval's
// conventions (so that its numbers can be compared with trec_eval, pytrec_eval and ir-measures).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <unordered_map>
#include <unordered_set>

#include "cli.h"
#include "runs.h"

namespace maxsim::cli {
namespace {

struct Measures {
  double ndcg = 0, recall = 0, mrr = 0, map = 0;
};

// `ranked`: the run's documents for one query in trec_eval's order; `judged`: that query's grades.
Measures Evaluate(const std::vector<const RunLine*>& ranked, const std::map<std::string, int64_t>& judged,
                  uint64_t k) {
  Measures m;
  uint64_t n_rel = 0;
  std::vector<double> gains;
  for (const auto& [doc, grade] : judged) {
    if (grade > 0) {
      ++n_rel;
      gains.push_back(static_cast<double>(grade));
    }
  }
  if (n_rel == 0) return m;
  std::sort(gains.rbegin(), gains.rend());
  double dcg = 0, idcg = 0, precision_sum = 0;
  uint64_t found = 0, found_in_k = 0;
  for (size_t i = 0; i < ranked.size(); ++i) {
    auto it = judged.find(ranked[i]->doc_id);
    const int64_t grade = it == judged.end() ? 0 : it->second;
    if (grade <= 0) continue;
    ++found;
    precision_sum += static_cast<double>(found) / static_cast<double>(i + 1);
    if (i < k) {
      ++found_in_k;
      dcg += static_cast<double>(grade) / std::log2(static_cast<double>(i) + 2.0);
      if (m.mrr == 0) m.mrr = 1.0 / static_cast<double>(i + 1);
    }
  }
  for (size_t i = 0; i < gains.size() && i < k; ++i) idcg += gains[i] / std::log2(static_cast<double>(i) + 2.0);
  m.ndcg = dcg / idcg;
  m.recall = static_cast<double>(found_in_k) / static_cast<double>(n_rel);
  m.map = precision_sum / static_cast<double>(n_rel);
  return m;
}

}  // namespace

int RunEval(int argc, char** argv) {
  const std::vector<OptionSpec> options = {
      {"k", 'k', "K", "Cutoff of nDCG@K, recall@K and MRR@K (default 10). MAP uses the whole run."},
      {"format", 0, "text|tsv|json", "Output format (default text)."},
      {"output", 'o', "FILE", "Write the table here (atomically) instead of stdout."},
  };
  CommandSpec spec{
      "eval", "RUN QRELS [options]",
      "Score a run against relevance judgements: nDCG@k, recall@k, MRR@k and MAP, per query and their mean.",
      "RUN    a TREC run (qid Q0 docid rank score tag) or the tsv of 'maxsim search --format tsv'.\n"
      "QRELS  TREC qrels (qid 0 docid grade) or BEIR tsv (query-id, corpus-id, score; header optional).\n"
      "Conventions of trec_eval: documents are ranked by score descending, ties by document id in descending\n"
      "byte order (the rank column is ignored); a document is relevant when its grade is >= 1, and nDCG's gain\n"
      "is the grade itself (linear), with the ideal ranking taken from all of the query's judgements; unjudged\n"
      "documents are not relevant. Only queries present in both files are scored and averaged (the others are\n"
      "counted on stderr); a query whose judgements hold no relevant document scores 0.",
      options, 2, 2};
  Args args;
  if (!args.Parse(spec, argc, argv)) return kExitOk;
  const uint64_t k = static_cast<uint64_t>(args.Int("k", 10, 1, UINT32_MAX));
  const std::string format = args.Choice("format", "text", {"text", "tsv", "json"});
  const std::string& run_path = args.positional()[0];
  const std::string& qrels_path = args.positional()[1];

  const std::vector<RunLine> lines = ReadRunFile(run_path, true);
  const Qrels qrels = ReadQrels(qrels_path);
  std::vector<std::string> order;
  std::unordered_map<std::string, std::vector<const RunLine*>> by_query;
  std::unordered_set<std::string> seen;
  for (const RunLine& l : lines) {
    if (!seen.insert(l.query_id + "\t" + l.doc_id).second) {
      throw Failure(run_path + ":" + std::to_string(l.line) + ": query '" + l.query_id + "' lists document '" +
                    l.doc_id + "' twice");
    }
    if (by_query.find(l.query_id) == by_query.end()) order.push_back(l.query_id);
    by_query[l.query_id].push_back(&l);
  }
  const std::string ks = std::to_string(k);
  const std::string names[4] = {"ndcg@" + ks, "recall@" + ks, "mrr@" + ks, "map"};
  std::string out;
  char buf[256];
  if (format == "text") {
    std::snprintf(buf, sizeof(buf), "%-20s %10s %10s %10s %10s\n", "query", names[0].c_str(), names[1].c_str(),
                  names[2].c_str(), names[3].c_str());
    out = buf;
  } else if (format == "tsv") {
    out = "query_id\t" + names[0] + "\t" + names[1] + "\t" + names[2] + "\t" + names[3] + "\n";
  } else {
    out = "{\"run\": \"" + JsonEscape(run_path) + "\", \"qrels\": \"" + JsonEscape(qrels_path) +
          "\", \"k\": " + ks + ", \"queries\": [";
  }
  auto row = [&](const std::string& qid, const Measures& m, bool first) {
    if (format == "text") {
      std::snprintf(buf, sizeof(buf), " %10.4f %10.4f %10.4f %10.4f\n", m.ndcg, m.recall, m.mrr, m.map);
      std::string id = qid;
      if (id.size() < 20) id.append(20 - id.size(), ' ');
      out += id + buf;
    } else if (format == "tsv") {
      std::snprintf(buf, sizeof(buf), "\t%.17g\t%.17g\t%.17g\t%.17g\n", m.ndcg, m.recall, m.mrr, m.map);
      out += qid + buf;
    } else {
      std::snprintf(buf, sizeof(buf), "\"%s\": %.17g, \"%s\": %.17g, \"%s\": %.17g, \"%s\": %.17g}",
                    names[0].c_str(), m.ndcg, names[1].c_str(), m.recall, names[2].c_str(), m.mrr, names[3].c_str(),
                    m.map);
      out += std::string(first ? "\n  " : ",\n  ") + "{\"query_id\": \"" + JsonEscape(qid) + "\", " + buf;
    }
  };
  Measures mean;
  uint64_t scored = 0, unjudged = 0;
  for (const std::string& qid : order) {
    auto judged = qrels.find(qid);
    if (judged == qrels.end()) {
      ++unjudged;
      continue;
    }
    std::vector<const RunLine*>& ranked = by_query[qid];
    std::sort(ranked.begin(), ranked.end(), [](const RunLine* a, const RunLine* b) {
      if (a->score != b->score) return a->score > b->score;
      return a->doc_id > b->doc_id;  // trec_eval: ties by document id, descending
    });
    const Measures m = Evaluate(ranked, judged->second, k);
    row(qid, m, scored == 0);
    mean.ndcg += m.ndcg;
    mean.recall += m.recall;
    mean.mrr += m.mrr;
    mean.map += m.map;
    ++scored;
  }
  if (scored > 0) {
    const double n = static_cast<double>(scored);
    mean = {mean.ndcg / n, mean.recall / n, mean.mrr / n, mean.map / n};
  }
  uint64_t missing = 0;
  for (const auto& [qid, docs] : qrels) missing += by_query.count(qid) == 0;
  if (format == "json") {
    std::snprintf(buf, sizeof(buf), "\"%s\": %.17g, \"%s\": %.17g, \"%s\": %.17g, \"%s\": %.17g", names[0].c_str(),
                  mean.ndcg, names[1].c_str(), mean.recall, names[2].c_str(), mean.mrr, names[3].c_str(), mean.map);
    out += "\n ], \"mean\": {\"queries\": " + std::to_string(scored) + ", " + buf + "}}\n";
  } else {
    row("all", mean, false);
  }
  if (scored == 0) {
    throw Failure(run_path + " and " + qrels_path + " have no query id in common: nothing to evaluate (do the "
                  "run's query ids come from --query-ids?)");
  }
  WriteOutput(args.Str("output", ""), out);
  if (unjudged > 0 || missing > 0) {
    std::fprintf(stderr, "eval: scored %llu queries; %llu of the run's queries have no judgements and %llu judged "
                 "queries are not in the run (neither is scored, as trec_eval does by default)\n",
                 static_cast<unsigned long long>(scored), static_cast<unsigned long long>(unjudged),
                 static_cast<unsigned long long>(missing));
  }
  return kExitOk;
}

}  // namespace maxsim::cli
