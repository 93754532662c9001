// SPDX-License-Identifier: Apache-2.0
// `maxsim bench`: a quick throughput table for the canonical ColBERT shape (d = 128, one query of 32 tokens
// against 1000 documents of 180 and of 300 tokens), per mode with the selected kernel, as ratios to naive
// loops. The full benchmark suite (every kernel, BLAS/oneDNN baselines, % of peak) is benchmarks/.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "cli.h"

namespace maxsim::cli {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

template <typename Fn>
double TimeMedian(int reps, Fn fn) {
  fn();  // warm-up: first-touch of scratch memory, thread start-up
  std::vector<double> s;
  for (int r = 0; r < reps; ++r) {
    const double t = Now();
    fn();
    s.push_back(Now() - t);
  }
  return Median(s);
}

}  // namespace

int RunBench(int argc, char** argv) {
  std::vector<OptionSpec> options = {
      {"docs", 0, "N", "Documents per shape (default 1000)."},
      {"reps", 0, "N", "Timed calls per figure after one warm-up; the median is shown (default 5)."},
      {"seed", 0, "S", "Seed of the synthetic data (default 7)."},
  };
  for (const OptionSpec& o : ContextOptions()) options.push_back(o);
  CommandSpec spec{
      "bench", "[options]",
      "Quick throughput table: d = 128, one query of Lq = 32 tokens against 1000 documents of Ld = 180 and of\n"
      "Ld = 300 tokens, scored (full score list) in each mode with the selected kernel, and by naive loops.",
      "Defaults to 1 thread (--threads N to change; the naive loops split documents over the same count).\n"
      "The corpus and the query are packed once, outside the timing. The naive loops run over the first 100\n"
      "documents only (they are slow) and are reported per document like the rest. For every kernel, the\n"
      "OpenBLAS/oneDNN baselines and %-of-peak figures, run <build>/benchmarks/cpu_bench (docs/benchmarks.md).",
      options, 0, 0};
  Args args;
  if (!args.Parse(spec, argc, argv)) return kExitOk;
  const uint64_t nd = static_cast<uint64_t>(args.Int("docs", 1000, 1, 1000000));
  const int reps = static_cast<int>(args.Int("reps", 5, 1, 1000));
  const uint64_t seed = static_cast<uint64_t>(args.Int("seed", 7, 0, INT64_MAX));
  maxsim_context* ctx = MakeContext(args, 1);
  struct Destroy {
    maxsim_context* c;
    ~Destroy() { maxsim_context_destroy(c); }
  } destroy{ctx};
  const int threads = maxsim_context_num_threads(ctx);
  std::printf("maxsim bench (libmaxsim %s): d = 128, one query of Lq = 32 against %llu documents; kernel %s, "
              "%d thread%s\n",
              maxsim_version_string(), static_cast<unsigned long long>(nd), maxsim_context_kernel(ctx), threads,
              threads == 1 ? "" : "s");
  std::printf("median of %d calls after a warm-up; GSO/s = 2 * Lq * Ld * d per document / time\n\n", reps);
  std::printf("%-5s %-24s %12s %11s %9s %9s\n", "Ld", "method", "time/query", "docs/s", "GSO/s", "x naive");

  for (uint32_t ld : {180u, 300u}) {
    SynthSpec ss;
    ss.n_docs = nd;
    ss.max_len = ld;
    ss.min_len = ld;
    ss.fixed_len = true;
    ss.n_queries = 1;
    ss.seed = seed;
    SynthData data;
    {
      Progress p("generating " + std::to_string(nd) + " documents of " + std::to_string(ld) + " tokens", nd, "docs");
      data = MakeSynthetic(ss, &p);
    }
    const maxsim_dense_sets docs = data.DocSets();
    const maxsim_dense_sets query = data.QuerySets(1);
    maxsim_packed *corpus = nullptr, *qp = nullptr;
    Check(maxsim_pack(ctx, &docs, nullptr, &corpus), "packing");
    Check(maxsim_pack(ctx, &query, nullptr, &qp), "packing");
    struct Release {
      maxsim_packed* p;
      ~Release() { maxsim_packed_release(p); }
    } r1{corpus}, r2{qp};

    const double gso_per_doc = 2.0 * 32 * ld * 128;
    const uint64_t naive_docs = std::min<uint64_t>(nd, 100);
    std::vector<float> naive(naive_docs), scores(nd);
    double naive_s = 0;
    {
      Progress p("naive loops, Ld = " + std::to_string(ld), 0);
      naive_s = TimeMedian(std::max(1, reps / 2), [&] {
        NaiveScores(data.queries.data(), 32, data.docs.data(), data.doc_offsets.data(), naive_docs, data.dim, threads,
                    naive.data());
      });
    }
    const double naive_per_doc = naive_s / naive_docs;
    const std::string naive_label = "naive loops (" + std::to_string(naive_docs) + " docs)";
    std::printf("%-5u %-24s %12s %11s %9.2f %9s\n", ld, naive_label.c_str(), HumanSeconds(naive_per_doc * nd).c_str(),
                HumanCount(1.0 / naive_per_doc).c_str(), gso_per_doc / naive_per_doc / 1e9, "1.0");
    for (maxsim_mode mode : {MAXSIM_MODE_EXACT, MAXSIM_MODE_CERTIFIED, MAXSIM_MODE_APPROXIMATE}) {
      maxsim_score_options so;
      maxsim_score_options_init(&so);
      so.mode = mode;
      maxsim_sets qs{qp, nullptr}, ds{corpus, nullptr};
      double s = 0;
      {
        Progress p(std::string(ModeName(mode)) + ", Ld = " + std::to_string(ld), 0);
        s = TimeMedian(reps, [&] { Check(maxsim_score_matrix(ctx, &qs, &ds, &so, scores.data(), nullptr), "scoring"); });
      }
      if (mode == MAXSIM_MODE_EXACT) {
        // Sanity: the naive sums (unfused multiply-add) agree with exact to rounding.
        double worst = 0;
        for (uint64_t j = 0; j < naive_docs; ++j) {
          worst = std::max(worst, std::fabs(static_cast<double>(naive[j]) - scores[j]) / (std::fabs(scores[j]) + 1e-30));
        }
        if (worst > 1e-4) {
          std::fprintf(stderr, "maxsim bench: warning: exact scores differ from the naive loops by %.3g (relative)\n",
                       worst);
        }
      }
      std::printf("%-5u %-24s %12s %11s %9.2f %9.1f\n", ld, (std::string(ModeName(mode)) + " (" +
                  maxsim_context_kernel(ctx) + ")").c_str(), HumanSeconds(s).c_str(), HumanCount(nd / s).c_str(),
                  gso_per_doc * nd / s / 1e9, naive_per_doc * nd / s);
    }
  }
  return kExitOk;
}

}  // namespace maxsim::cli
