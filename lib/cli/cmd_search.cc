// SPDX-License-Identifier: Apache-2.0
// `maxsim search`: each query's top k over one packed corpus or several shards searched as one.
#include <algorithm>
#include <cstdio>

#include "cli.h"
#include "runs.h"

namespace maxsim::cli {

int RunSearch(int argc, char** argv) {
  std::vector<OptionSpec> options = {{"k", 'k', "K", "Results per query (default 10)."}};
  for (const auto& group : {ScoringOptions(), OutputOptions(), ContextOptions()}) {
    options.insert(options.end(), group.begin(), group.end());
  }
  CommandSpec spec{
      "search", "CORPUS.maxsim [SHARD.maxsim ...] QUERIES.npy [QUERY_OFFSETS.npy] [options]",
      "Score every query against every document of a packed corpus (or of several shards, searched as one\n"
      "corpus) and print each query's top k.",
      "QUERIES.npy        float32/float16/bfloat16, the corpus's dim: [n_query_tokens, dim] with\n"
      "QUERY_OFFSETS.npy  int64/uint64 [n_queries + 1] (as for 'maxsim pack'), or padded [n, L, dim] with an\n"
      "                   optional --query-mask [n, L] (as models emit them).\n"
      "Shards: documents are numbered across the files in the order given; the merged top k is exact and\n"
      "identical to searching one corpus holding all of them. Ranking: score descending, ties by the lower\n"
      "document number. Document ids: the corpus's string ids, else its numeric ids, else the number.\n"
      "An empty document scores -inf (null with \"empty\": true in JSON).",
      options, 1, 1u << 20};
  Args args;
  if (!args.Parse(spec, argc, argv)) return kExitOk;
  const uint64_t k_asked = static_cast<uint64_t>(args.Int("k", 10, 1, 1000000));
  const ScoringFiles files = SortScoringFiles(args.positional(), false, "search");

  const double t0 = Now();
  ScoringSession session;
  session.Open(args, files);
  maxsim_context* ctx = session.ctx;
  const maxsim_metric metric = session.metric;
  const maxsim_mode mode = session.mode;
  const Corpus& corpus = session.corpus;
  const Queries& q = session.queries;
  const std::vector<std::string>& qids = session.query_ids;
  const double t1 = Now();

  const uint64_t nq = q.n;
  maxsim_stats stats{};
  maxsim_score_options so;
  maxsim_score_options_init(&so);
  so.metric = metric;
  so.mode = mode;
  // Each shard's top k (fewer when it holds fewer documents), then one merge per query. A document of the
  // global top k is in its own shard's top k under the same order, so the merge is exact.
  struct Cand {
    float score;
    uint64_t global;
    size_t shard;
    uint64_t local;
  };
  std::vector<std::vector<Cand>> cands(nq);
  // One call per shard for the whole batch, or batches of queries when a progress line is drawn.
  const uint64_t batch = Progress::Enabled() ? std::max<uint64_t>(1, (nq + 99) / 100) : std::max<uint64_t>(nq, 1);
  {
    Progress p("searching", nq * corpus.shards.size(), "queries");
    for (size_t s = 0; s < corpus.shards.size(); ++s) {
      const Shard& shard = corpus.shards[s];
      const uint64_t k = std::min<uint64_t>(k_asked, shard.desc.n_sets);
      std::vector<float> scores(batch * k);
      std::vector<uint64_t> index(batch * k);
      for (uint64_t b = 0; k > 0 && b < nq; b += batch) {
        const uint64_t e = std::min(nq, b + batch);
        const maxsim_dense_sets qs = q.Dense(b, e);
        maxsim_sets qsets{nullptr, &qs};
        maxsim_sets dsets{shard.packed, nullptr};
        maxsim_stats part{};
        so.stats = &part;
        Check(maxsim_topk(ctx, &qsets, &dsets, k, &so, scores.data(), index.data(), nullptr),
              "searching " + shard.path);
        AddStats(part, &stats);
        for (uint64_t i = b; i < e; ++i) {
          for (uint64_t r = 0; r < k; ++r) {
            const uint64_t x = (i - b) * k + r;
            if (index[x] == UINT64_MAX) break;  // fewer documents than k
            cands[i].push_back({scores[x], shard.first + index[x], s, index[x]});
          }
        }
        p.Add(e - b);
      }
    }
  }
  Run run(nq);
  for (uint64_t i = 0; i < nq; ++i) {
    std::vector<Cand>& c = cands[i];
    std::sort(c.begin(), c.end(),
              [](const Cand& a, const Cand& b) { return RanksBefore(a.score, a.global, b.score, b.global); });
    if (c.size() > k_asked) c.resize(k_asked);
    run[i].query_id = qids[i];
    run[i].query = i;
    for (const Cand& h : c) run[i].hits.push_back({corpus.DocId(h.shard, h.local), h.score, h.global});
  }
  const double t2 = Now();

  std::vector<std::string> json = JsonFields("search", files, metric, mode, ctx);
  json.push_back("\"k\": " + std::to_string(k_asked));
  EmitRun(args, run, json);
  if (args.Has("stats")) {
    PrintStats("search", stats, nq, corpus.n_docs, mode, metric, ctx, t1 - t0, t2 - t1,
               static_cast<double>(nq) * static_cast<double>(corpus.n_docs));
  }
  return kExitOk;
}

}  // namespace maxsim::cli
