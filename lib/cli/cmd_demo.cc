// SPDX-License-Identifier: Apache-2.0
// `maxsim demo`: the embedded default. A deterministic synthetic ColBERT-like corpus is generated, packed,
// scored in every mode (full score matrix and top-k), timed, and certified is checked against exact: every
// score bit-identical and every top-k ranking identical, or the command fails with exit code 3.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sys/stat.h>

#include "cli.h"
#include "npy.h"
#include "runs.h"

namespace maxsim::cli {
namespace {

struct Timed {
  std::string mode, op;
  double seconds = 0;
  maxsim_stats stats{};
};

uint32_t FloatBits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

void SaveNpy(const std::string& path, npy::Dtype dtype, std::vector<uint64_t> shape, const void* data, size_t bytes) {
  npy::Array a;
  a.dtype = dtype;
  a.shape = std::move(shape);
  a.data.assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + bytes);
  const std::string err = npy::Write(path, a);
  if (!err.empty()) throw Failure(err);
}

}  // namespace

int RunDemo(int argc, char** argv) {
  std::vector<OptionSpec> options = {
      {"docs", 0, "N", "Documents in the synthetic corpus (default 2000; lengths 60-300 tokens, d = 128)."},
      {"queries", 0, "N", "Queries of 32 tokens (default 8)."},
      {"seed", 0, "S", "Seed of the generator (default 42); the same seed gives the same corpus everywhere."},
      {"k", 'k', "K", "Top-k size (default 10)."},
      {"save", 0, "DIR", "Also write the corpus and queries as .npy (+ docs_ids.txt) and corpus.maxsim into DIR."},
  };
  for (const OptionSpec& o : ContextOptions()) options.push_back(o);
  CommandSpec spec{
      "demo", "[options]",
      "Generate a synthetic ColBERT-like corpus, pack it, score it in exact, certified and approximate mode,\n"
      "time each step, and check that certified equals exact (bit-identical scores, identical rankings).",
      "Documents: unit-norm tokens clustered around 256 topic directions, 4 topics per document. Each query\n"
      "is drawn from one source document (its tokens plus noise), so that document should rank first.\n"
      "Exit code 3 if the certified check fails.",
      options, 0, 0};
  Args args;
  if (!args.Parse(spec, argc, argv)) return kExitOk;
  SynthSpec ss;
  ss.n_docs = static_cast<uint64_t>(args.Int("docs", 2000, 1, 10000000));
  ss.n_queries = static_cast<uint64_t>(args.Int("queries", 8, 1, 100000));
  ss.seed = static_cast<uint64_t>(args.Int("seed", 42, 0, INT64_MAX));
  const uint64_t k = static_cast<uint64_t>(args.Int("k", 10, 1, 100000));
  maxsim_context* ctx = MakeContext(args);
  struct Destroy {
    maxsim_context* c;
    ~Destroy() { maxsim_context_destroy(c); }
  } destroy{ctx};

  std::printf("maxsim demo (libmaxsim %s): kernel %s, %d threads, backend %s\n", maxsim_version_string(),
              maxsim_context_kernel(ctx), maxsim_context_num_threads(ctx), maxsim_context_backend(ctx));
  double t = Now();
  SynthData data;
  {
    Progress p("generating documents", ss.n_docs, "docs");
    data = MakeSynthetic(ss, &p);
  }
  const uint64_t n_tokens = data.doc_offsets.back();
  const uint64_t nd = ss.n_docs, nq = ss.n_queries;
  std::printf("corpus: %llu documents, %u-%u tokens (%llu in all, mean %.0f), d = %u, seed %llu; %llu queries x %u "
              "tokens; generated in %s\n",
              static_cast<unsigned long long>(nd), ss.min_len, ss.max_len, static_cast<unsigned long long>(n_tokens),
              static_cast<double>(n_tokens) / nd, ss.dim, static_cast<unsigned long long>(ss.seed),
              static_cast<unsigned long long>(nq), ss.query_len, HumanSeconds(Now() - t).c_str());

  // Pack the corpus (with ids 1000000 + j, to show the id column) and the queries.
  const maxsim_dense_sets docs = data.DocSets();
  const maxsim_dense_sets queries = data.QuerySets(nq);
  std::vector<uint64_t> ids(nd);
  for (uint64_t j = 0; j < nd; ++j) ids[j] = 1000000 + j;
  maxsim_packed* corpus = nullptr;
  maxsim_packed* qpacked = nullptr;
  t = Now();
  {
    Progress p("packing " + HumanCount(static_cast<double>(n_tokens)) + " vectors", 0);
    Check(maxsim_pack(ctx, &docs, ids.data(), &corpus), "packing the corpus");
  }
  const double pack_s = Now() - t;
  struct Release {
    maxsim_packed* p;
    ~Release() { maxsim_packed_release(p); }
  } r1{corpus};
  Check(maxsim_pack(ctx, &queries, nullptr, &qpacked), "packing the queries");
  Release r2{qpacked};
  maxsim_packed_desc cdesc{};
  maxsim_packed_describe(corpus, &cdesc);
  std::printf("pack: %s for %llu vectors (%s vectors/s, %s per average document), %s packed\n",
              HumanSeconds(pack_s).c_str(), static_cast<unsigned long long>(n_tokens),
              HumanCount(n_tokens / std::max(pack_s, 1e-9)).c_str(), HumanSeconds(pack_s / nd).c_str(),
              HumanBytes(static_cast<double>(cdesc.size)).c_str());

  if (args.Has("save")) {
    const std::string dir = args.Str("save", "");
    ::mkdir(dir.c_str(), 0755);
    SaveNpy(dir + "/docs_tokens.npy", npy::Dtype::kF32, {n_tokens, data.dim}, data.docs.data(), data.docs.size() * 4);
    SaveNpy(dir + "/docs_offsets.npy", npy::Dtype::kI64, {nd + 1}, data.doc_offsets.data(), (nd + 1) * 8);
    SaveNpy(dir + "/queries_tokens.npy", npy::Dtype::kF32, {nq * ss.query_len, data.dim}, data.queries.data(),
            data.queries.size() * 4);
    SaveNpy(dir + "/queries_offsets.npy", npy::Dtype::kI64, {nq + 1}, data.query_offsets.data(), (nq + 1) * 8);
    std::string id_lines;
    for (uint64_t id : ids) id_lines += std::to_string(id) + "\n";
    WriteOutput(dir + "/docs_ids.txt", id_lines);  // temporary file + rename, never over a non-regular file
    Check(maxsim_packed_save(corpus, (dir + "/corpus.maxsim").c_str()), "writing " + dir + "/corpus.maxsim");
    std::printf("saved: %s/{docs_tokens,docs_offsets,queries_tokens,queries_offsets}.npy, docs_ids.txt, corpus.maxsim\n",
                dir.c_str());
  }

  // Score: the full matrix in each mode, then top-k in each mode.
  const maxsim_mode modes[] = {MAXSIM_MODE_EXACT, MAXSIM_MODE_CERTIFIED, MAXSIM_MODE_APPROXIMATE};
  std::vector<std::vector<float>> matrix(3, std::vector<float>(nq * nd));
  std::vector<std::vector<float>> top_scores(3, std::vector<float>(nq * k));
  std::vector<std::vector<uint64_t>> top_index(3, std::vector<uint64_t>(nq * k));
  std::vector<Timed> timings;
  maxsim_sets qs{qpacked, nullptr}, ds{corpus, nullptr};
  {
    // One untimed call first: a GPU backend uploads the corpus on its first use (kept for later calls), and the
    // CPU touches its scratch memory; neither belongs in the per-mode times.
    maxsim_score_options so;
    maxsim_score_options_init(&so);
    t = Now();
    Check(maxsim_score_matrix(ctx, &qs, &ds, &so, matrix[0].data(), nullptr), "scoring");
    std::printf("first call (untimed below): %s%s\n", HumanSeconds(Now() - t).c_str(),
                std::strcmp(maxsim_context_backend(ctx), "cpu") == 0 ? "" : ", including the corpus upload to the device");
  }
  {
    Progress p("scoring", 6, "runs");
    for (int m = 0; m < 3; ++m) {
      Timed tm{ModeName(modes[m]), "score matrix"};
      maxsim_score_options so;
      maxsim_score_options_init(&so);
      so.mode = modes[m];
      so.stats = &tm.stats;
      t = Now();
      Check(maxsim_score_matrix(ctx, &qs, &ds, &so, matrix[m].data(), nullptr), "scoring");
      tm.seconds = Now() - t;
      timings.push_back(tm);
      p.Add(1);
    }
    for (int m = 0; m < 3; ++m) {
      Timed tm{ModeName(modes[m]), "top-" + std::to_string(k)};
      maxsim_score_options so;
      maxsim_score_options_init(&so);
      so.mode = modes[m];
      so.stats = &tm.stats;
      t = Now();
      Check(maxsim_topk(ctx, &qs, &ds, k, &so, top_scores[m].data(), top_index[m].data(), nullptr), "top-k");
      tm.seconds = Now() - t;
      timings.push_back(tm);
      p.Add(1);
    }
  }
  const double ops = 2.0 * data.dim * static_cast<double>(data.query_offsets.back()) * static_cast<double>(n_tokens);
  std::printf("\n%-12s %-13s %10s %11s %9s   %s\n", "mode", "operation", "time", "docs/s", "GSO/s",
              "refined doc tokens per query token");
  for (const Timed& tm : timings) {
    const double per_token =
        tm.stats.query_tokens ? static_cast<double>(tm.stats.refined) / static_cast<double>(tm.stats.query_tokens) : 0;
    char refined[48] = "-";
    if (tm.mode != "exact") std::snprintf(refined, sizeof(refined), "%.2f", per_token);
    // Nothing refined in certified mode: the backend ran its exact kernel (the CUDA plugin does: same bits).
    if (tm.mode == "certified" && tm.stats.query_tokens > 0 && tm.stats.refined == 0) {
      std::snprintf(refined, sizeof(refined), "0 (exact kernel, same bits)");
    }
    std::printf("%-12s %-13s %10s %11s %9.1f   %s\n", tm.mode.c_str(), tm.op.c_str(), HumanSeconds(tm.seconds).c_str(),
                HumanCount(static_cast<double>(nq * nd) / tm.seconds).c_str(), ops / tm.seconds / 1e9, refined);
  }
  std::printf("(GSO/s = 2 * Lq * Ld * d per (query, document) pair / time; top-k counts every document even when\n"
              " its bound lets it be skipped: %llu of %llu pairs pruned in certified top-k)\n",
              static_cast<unsigned long long>(timings[4].stats.docs_pruned),
              static_cast<unsigned long long>(nq * nd));

  // The check: certified == exact, bit for bit, in the matrix and in the top-k.
  uint64_t same_scores = 0, same_rows = 0;
  for (uint64_t x = 0; x < nq * nd; ++x) same_scores += FloatBits(matrix[0][x]) == FloatBits(matrix[1][x]);
  for (uint64_t i = 0; i < nq; ++i) {
    bool same = true;
    for (uint64_t r = 0; r < k; ++r) {
      const uint64_t x = i * k + r;
      same = same && top_index[0][x] == top_index[1][x] && FloatBits(top_scores[0][x]) == FloatBits(top_scores[1][x]);
    }
    same_rows += same;
  }
  // Top-k must agree with the matrix too (ranking by score, ties to the lower index).
  uint64_t topk_consistent = 0;
  for (uint64_t i = 0; i < nq; ++i) {
    std::vector<uint64_t> order(nd);
    for (uint64_t j = 0; j < nd; ++j) order[j] = j;
    const float* row = matrix[0].data() + i * nd;
    const uint64_t kk = std::min<uint64_t>(k, nd);
    std::partial_sort(order.begin(), order.begin() + kk, order.end(),
                      [&](uint64_t a, uint64_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    bool ok = true;
    for (uint64_t r = 0; r < kk; ++r) ok = ok && order[r] == top_index[0][i * k + r];
    topk_consistent += ok;
  }
  const bool pass = same_scores == nq * nd && same_rows == nq && topk_consistent == nq;
  std::printf("\ncheck certified == exact: %llu/%llu scores bit-identical, top-%llu identical for %llu/%llu queries; "
              "exact top-%llu matches the sorted exact matrix for %llu/%llu queries: %s\n",
              static_cast<unsigned long long>(same_scores), static_cast<unsigned long long>(nq * nd),
              static_cast<unsigned long long>(k), static_cast<unsigned long long>(same_rows),
              static_cast<unsigned long long>(nq), static_cast<unsigned long long>(k),
              static_cast<unsigned long long>(topk_consistent), static_cast<unsigned long long>(nq),
              pass ? "PASS" : "FAIL");

  // Informational: how far approximate is from exact, and whether each query finds its source document.
  uint64_t overlap = 0, approx_same = 0, found_first = 0;
  double max_diff = 0;
  for (uint64_t x = 0; x < nq * nd; ++x) {
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(matrix[2][x]) - matrix[0][x]));
    approx_same += FloatBits(matrix[2][x]) == FloatBits(matrix[0][x]);
  }
  for (uint64_t i = 0; i < nq; ++i) {
    for (uint64_t r = 0; r < k; ++r) {
      for (uint64_t s = 0; s < k; ++s) overlap += top_index[2][i * k + r] == top_index[0][i * k + s];
    }
    found_first += top_index[0][i * k] == data.query_source[i];
  }
  std::printf("approximate vs exact (not a check): %llu/%llu scores identical, max |difference| %.3g, top-%llu "
              "overlap %llu/%llu\n",
              static_cast<unsigned long long>(approx_same), static_cast<unsigned long long>(nq * nd), max_diff,
              static_cast<unsigned long long>(k), static_cast<unsigned long long>(overlap),
              static_cast<unsigned long long>(nq * std::min<uint64_t>(k, nd)));
  std::printf("retrieval: each query's source document ranks first for %llu/%llu queries\n",
              static_cast<unsigned long long>(found_first), static_cast<unsigned long long>(nq));
  if (!pass) {
    std::fprintf(stderr, "maxsim demo: error: certified mode did not reproduce exact mode; this is a libmaxsim bug "
                         "(please report it with the output of 'maxsim info')\n");
    return kExitCheck;
  }
  return kExitOk;
}

}  // namespace maxsim::cli
