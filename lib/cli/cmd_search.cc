// SPDX-License-Identifier: Apache-2.0
// `maxsim search`: top-k documents of a packed corpus for each query set of a .npy batch.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "cli.h"

namespace maxsim::cli {

int RunSearch(int argc, char** argv) {
  std::vector<OptionSpec> options = {
      {"k", 'k', "K", "Results per query (default 10)."},
      {"metric", 0, "dot|cosine", "Similarity: dot (ColBERT) or cosine (default dot)."},
      {"mode", 0, "MODE", "exact | certified (i8 screening + exact refinement: the same result as exact) |\n"
                          "                            approximate (i8 argmax, one refinement: fastest, not exact). "
                          "Default exact."},
      {"format", 0, "tsv|json", "Output format on stdout (default tsv)."},
      {"validate", 0, "LEVEL", "How deeply to check the corpus file: standard (default), deep or fast."},
      {"stats", 0, nullptr, "Print timing and screening counters to stderr."},
  };
  for (const OptionSpec& o : ContextOptions()) options.push_back(o);
  CommandSpec spec{
      "search", "CORPUS.maxsim QUERIES.npy QUERY_OFFSETS.npy [options]",
      "Score every query set against every document of a packed corpus and print each query's top k.",
      "QUERIES.npy        float32/float16/bfloat16 [n_query_tokens, dim], the same dim as the corpus.\n"
      "QUERY_OFFSETS.npy  int64/uint64 [n_queries + 1], as for 'maxsim pack'.\n"
      "TSV output: a header line, then one line per hit: query (index), rank (1-based), doc (index in the\n"
      "corpus), id (the corpus id, or the doc index when the corpus has no ids), score (round-trip decimal;\n"
      "-inf for an empty document). Ties are broken by the lower document index.",
      options, 3, 3};
  Args args;
  if (!args.Parse(spec, argc, argv)) return kExitOk;
  const uint64_t k_asked = static_cast<uint64_t>(args.Int("k", 10, 1, 1000000));
  const maxsim_metric metric = ParseMetric(args.Choice("metric", "dot", {"dot", "cosine"}));
  const maxsim_mode mode = ParseMode(args.Choice("mode", "exact", {"exact", "certified", "approximate"}));
  const std::string format = args.Choice("format", "tsv", {"tsv", "json"});
  const std::string vlevel = args.Choice("validate", "standard", {"standard", "deep", "fast"});
  const maxsim_validation validation = vlevel == "deep"   ? MAXSIM_VALIDATE_DEEP
                                       : vlevel == "fast" ? MAXSIM_VALIDATE_FAST
                                                          : MAXSIM_VALIDATE_STANDARD;
  const std::string& corpus_path = args.positional()[0];
  const std::string& queries_path = args.positional()[1];
  const std::string& qoff_path = args.positional()[2];

  const double t0 = Now();
  maxsim_packed* corpus = nullptr;
  maxsim_status st;
  {
    Progress p("loading and validating " + corpus_path, 0);
    st = maxsim_packed_load(corpus_path.c_str(), validation, &corpus);
  }
  Check(st, "loading " + corpus_path);
  struct Release {
    maxsim_packed* p;
    ~Release() { maxsim_packed_release(p); }
  } release{corpus};
  maxsim_packed_desc desc{};
  Check(maxsim_packed_describe(corpus, &desc), "describing " + corpus_path);

  Tokens q = ReadTokens(queries_path);
  const std::vector<uint64_t> qoff = ReadOffsets(qoff_path, q.rows, queries_path);
  if (q.dim != desc.dim) {
    throw Failure(queries_path + " has token dimension " + std::to_string(q.dim) + " but " + corpus_path +
                  " has dimension " + std::to_string(desc.dim) +
                  ": queries and corpus must come from the same embedding model");
  }
  const uint64_t nq = qoff.size() - 1;
  // More results than documents would only print nothing more: size the outputs by what can be returned.
  const uint64_t k = std::min<uint64_t>(k_asked, desc.n_sets);
  const double t1 = Now();

  maxsim_context* ctx = MakeContext(args);
  struct Destroy {
    maxsim_context* c;
    ~Destroy() { maxsim_context_destroy(c); }
  } destroy{ctx};

  std::vector<float> scores(nq * k);
  std::vector<uint64_t> index(nq * k), ids(desc.has_ids ? nq * k : 0);
  maxsim_stats stats{};
  maxsim_score_options so;
  maxsim_score_options_init(&so);
  so.metric = metric;
  so.mode = mode;
  so.stats = &stats;
  // One call for the whole batch, or batches of queries when a progress line is drawn.
  const uint64_t batch = Progress::Enabled() ? std::max<uint64_t>(1, (nq + 99) / 100) : std::max<uint64_t>(nq, 1);
  {
    Progress p("searching", nq, "queries");
    for (uint64_t b = 0; k > 0 && b < nq; b += batch) {
      const uint64_t e = std::min(nq, b + batch);
      maxsim_dense_sets qs{};
      qs.struct_size = sizeof(qs);
      qs.memory = MAXSIM_MEMORY_HOST;
      qs.data = q.data.data();
      qs.dtype = q.dtype;
      qs.dim = q.dim;
      qs.n_sets = e - b;
      qs.offsets = qoff.data() + b;
      maxsim_sets qsets{nullptr, &qs};
      maxsim_sets dsets{corpus, nullptr};
      maxsim_stats part{};
      so.stats = &part;
      Check(maxsim_topk(ctx, &qsets, &dsets, k, &so, scores.data() + b * k, index.data() + b * k,
                        desc.has_ids ? ids.data() + b * k : nullptr),
            "searching " + corpus_path);
      stats.pairs += part.pairs;
      stats.query_tokens += part.query_tokens;
      stats.refined += part.refined;
      stats.multi_candidate += part.multi_candidate;
      stats.docs_pruned += part.docs_pruned;
      p.Add(e - b);
    }
  }
  const double t2 = Now();

  auto id_of = [&](uint64_t i) { return desc.has_ids ? ids[i] : index[i]; };
  std::string out;
  char line[160];
  if (format == "tsv") {
    out = "query\trank\tdoc\tid\tscore\n";
    for (uint64_t i = 0; i < nq; ++i) {
      for (uint64_t r = 0; r < k; ++r) {
        const uint64_t x = i * k + r;
        if (index[x] == UINT64_MAX) break;  // fewer documents than k
        std::snprintf(line, sizeof(line), "%llu\t%llu\t%llu\t%llu\t%s\n", static_cast<unsigned long long>(i),
                      static_cast<unsigned long long>(r + 1), static_cast<unsigned long long>(index[x]),
                      static_cast<unsigned long long>(id_of(x)), FloatText(scores[x]).c_str());
        out += line;
      }
    }
  } else {
    out = "{\"corpus\": \"" + JsonEscape(corpus_path) + "\", \"queries\": \"" + JsonEscape(queries_path) +
          "\", \"metric\": \"" + MetricName(metric) + "\", \"mode\": \"" + ModeName(mode) +
          "\", \"k\": " + std::to_string(k_asked) + ", \"kernel\": \"" + JsonEscape(maxsim_context_kernel(ctx)) +
          "\", \"backend\": \"" + JsonEscape(maxsim_context_backend(ctx)) + "\",\n \"results\": [";
    for (uint64_t i = 0; i < nq; ++i) {
      out += std::string(i ? ",\n  " : "\n  ") + "{\"query\": " + std::to_string(i) + ", \"hits\": [";
      for (uint64_t r = 0; r < k; ++r) {
        const uint64_t x = i * k + r;
        if (index[x] == UINT64_MAX) break;
        const std::string score = std::isinf(scores[x]) ? "null" : FloatText(scores[x]);
        std::snprintf(line, sizeof(line), "%s{\"rank\": %llu, \"doc\": %llu, \"id\": %llu, \"score\": %s}",
                      r ? ", " : "", static_cast<unsigned long long>(r + 1), static_cast<unsigned long long>(index[x]),
                      static_cast<unsigned long long>(id_of(x)), score.c_str());
        out += line;
      }
      out += "]}";
    }
    out += "\n ]}\n";
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  if (std::fflush(stdout) != 0) throw Failure("writing the results to stdout failed");

  if (args.Has("stats")) {
    const double secs = t2 - t1;
    std::fprintf(stderr,
                 "search: %llu queries x %llu documents, mode %s, metric %s, kernel %s, backend %s, %d threads\n"
                 "  load+validate+read %s, search %s (%s docs/s)\n",
                 static_cast<unsigned long long>(nq), static_cast<unsigned long long>(desc.n_sets), ModeName(mode),
                 MetricName(metric), maxsim_context_kernel(ctx), maxsim_context_backend(ctx),
                 maxsim_context_num_threads(ctx), HumanSeconds(t1 - t0).c_str(), HumanSeconds(secs).c_str(),
                 HumanCount(static_cast<double>(nq * desc.n_sets) / std::max(secs, 1e-9)).c_str());
    std::fprintf(stderr,
                 "  pairs scored %llu, documents pruned by their bound %llu, query-token evaluations %llu,\n"
                 "  document tokens refined %llu, evaluations with more than one candidate %llu\n",
                 static_cast<unsigned long long>(stats.pairs), static_cast<unsigned long long>(stats.docs_pruned),
                 static_cast<unsigned long long>(stats.query_tokens), static_cast<unsigned long long>(stats.refined),
                 static_cast<unsigned long long>(stats.multi_candidate));
  }
  return kExitOk;
}

}  // namespace maxsim::cli
