// SPDX-License-Identifier: Apache-2.0
// The fixture of the `maxsim` tool's end-to-end tests: runs the real binary as a child process in a temporary
// folder, writes .npy inputs, parses every output format, and computes the library's own answer to compare.
#ifndef MAXSIM_TESTS_CLI_TEST_UTIL_H_
#define MAXSIM_TESTS_CLI_TEST_UTIL_H_

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "maxsim/maxsim.hpp"
#include "npy.h"
#include "test_util.h"

#ifndef MAXSIM_CLI_PATH
#error "MAXSIM_CLI_PATH must name the maxsim executable"
#endif

namespace maxsim::test {

struct CliResult {
  int code = -1;
  std::string out, err;
};

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/maxsim-cli-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (!dir_.empty()) std::system(("rm -rf '" + dir_ + "'").c_str());
  }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  // Runs the tool with stdout/stderr captured in files (never a terminal, so no progress line is expected).
  CliResult Run(const std::vector<std::string>& args) {
    const std::string out = Path("stdout.txt"), err = Path("stderr.txt");
    const pid_t pid = fork();
    if (pid == 0) {
      const int fo = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int fe = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fo, 1);
      dup2(fe, 2);
      std::vector<char*> argv;
      // Cross builds run the tool through the same emulator as the tests (CMAKE_CROSSCOMPILING_EMULATOR, its
      // words separated by spaces): under qemu-user an exec of a foreign binary does not go through qemu again.
      std::vector<std::string> words;
      const std::string emulator = MAXSIM_CLI_EMULATOR;
      for (size_t p = 0; p < emulator.size();) {
        const size_t e = std::min(emulator.find(' ', p), emulator.size());
        if (e > p) words.push_back(emulator.substr(p, e - p));
        p = e + 1;
      }
      words.push_back(MAXSIM_CLI_PATH);
      for (const std::string& a : args) words.push_back(a);
      for (std::string& w : words) argv.push_back(w.data());
      argv.push_back(nullptr);
      execvp(argv[0], argv.data());
      _exit(127);
    }
    // A run that blocks (on a FIFO, say) is killed after two minutes and fails with code -2.
    int status = 0;
    bool done = false;
    for (int waited_ms = 0; waited_ms < 120000 && !done; waited_ms += 10) {
      done = waitpid(pid, &status, WNOHANG) == pid;
      if (!done) usleep(10000);
    }
    if (!done) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
    }
    CliResult r;
    r.code = !done ? -2 : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = ReadFile(out);
    r.err = ReadFile(err);
    return r;
  }

  // Writes token sets as tokens/offsets .npy files (f32 or the sets' dtype) and returns their paths.
  std::pair<std::string, std::string> WriteSets(const TokenSets& s, const std::string& stem) {
    npy::Array tok, off;
    tok.dtype = s.dtype == MAXSIM_F32 ? npy::Dtype::kF32 : s.dtype == MAXSIM_F16 ? npy::Dtype::kF16 : npy::Dtype::kBF16;
    tok.shape = {s.rows(), s.dim};
    tok.data = s.encoded;
    off.dtype = npy::Dtype::kI64;
    off.shape = {s.offsets.size()};
    off.data.resize(s.offsets.size() * 8);
    std::memcpy(off.data.data(), s.offsets.data(), off.data.size());
    const std::string tp = Path(stem + "_tokens.npy"), op = Path(stem + "_offsets.npy");
    EXPECT_EQ(npy::Write(tp, tok), "");
    EXPECT_EQ(npy::Write(op, off), "");
    return {tp, op};
  }

  std::string dir_;
};

struct Hit {
  std::string query_id;
  uint64_t rank;
  std::string doc_id;
  float score;
};

inline float ScoreOf(const std::string& s) {
  return s == "-inf" || s == "null" ? -INFINITY : std::strtof(s.c_str(), nullptr);
}

// --format tsv
inline std::vector<Hit> ParseTsv(const std::string& text) {
  std::vector<Hit> hits;
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "query_id\trank\tdoc_id\tscore");
  while (std::getline(in, line)) {
    const std::regex re("([^\t]+)\t(\\d+)\t([^\t]+)\t([^\t]+)");
    std::smatch m;
    EXPECT_TRUE(std::regex_match(line, m, re)) << line;
    if (m.size() == 5) hits.push_back({m[1], std::stoull(m[2]), m[3], ScoreOf(m[4])});
  }
  return hits;
}

// --format trec
inline std::vector<Hit> ParseTrec(const std::string& text, const std::string& tag = "maxsim") {
  std::vector<Hit> hits;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string q, q0, d, r, s, t, extra;
    f >> q >> q0 >> d >> r >> s >> t;
    EXPECT_TRUE(!(f >> extra)) << line;
    EXPECT_EQ(q0, "Q0") << line;
    EXPECT_EQ(t, tag) << line;
    hits.push_back({q, std::stoull(r), d, ScoreOf(s)});
  }
  return hits;
}

// --format json (ids without quotes or backslashes)
inline std::vector<Hit> ParseJson(const std::string& text) {
  std::vector<Hit> hits;
  const std::regex query_re("\\{\"query_id\": \"([^\"]*)\", \"query\": (\\d+|null), \"hits\": \\[([^\\]]*)\\]\\}");
  const std::regex hit_re(
      "\\{\"rank\": (\\d+), \"doc_id\": \"([^\"]*)\", \"doc\": (\\d+|null), \"score\": ([^,}]+)(, \"empty\": true)?\\}");
  for (auto q = std::sregex_iterator(text.begin(), text.end(), query_re); q != std::sregex_iterator(); ++q) {
    const std::string body = (*q)[3];
    for (auto h = std::sregex_iterator(body.begin(), body.end(), hit_re); h != std::sregex_iterator(); ++h) {
      const std::string score = (*h)[4];
      EXPECT_EQ(score == "null", (*h)[5].matched) << "null scores (and only they) carry \"empty\": true";
      hits.push_back({(*q)[1], std::stoull((*h)[1]), (*h)[2], ScoreOf(score)});
    }
  }
  return hits;
}

// --format jsonl (ids without quotes or backslashes)
inline std::vector<Hit> ParseJsonl(const std::string& text) {
  std::vector<Hit> hits;
  const std::regex re("\\{\"query_id\": \"([^\"]*)\", \"query\": (\\d+|null), \"rank\": (\\d+), \"doc_id\": "
                      "\"([^\"]*)\", \"doc\": (\\d+|null), \"score\": ([^,}]+)(, \"empty\": true)?\\}");
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    EXPECT_TRUE(std::regex_match(line, m, re)) << line;
    if (m.size() == 8) hits.push_back({m[1], std::stoull(m[3]), m[4], ScoreOf(m[6])});
  }
  return hits;
}

// The id the tool prints for document j: its string id, else its numeric id, else j.
inline std::string DocIdOf(const Packed& corpus, uint64_t j) {
  const maxsim_packed_desc d = corpus.Describe();
  if (corpus.HasStringIds()) return corpus.StringId(j);
  return std::to_string(d.ids ? d.ids[j] : j);
}

// The library's answer, flattened like the tool prints it (tail entries for k > documents left out).
inline std::vector<Hit> LibraryTopK(const std::string& corpus_file, const TokenSets& queries, uint64_t k,
                                    maxsim_metric metric, maxsim_mode mode,
                                    const std::vector<std::string>& qids = {}) {
  maxsim_options o;
  maxsim_options_init(&o);
  o.load_plugins = 0;
  Context ctx(o);
  Packed corpus = Packed::Load(corpus_file);
  const uint64_t nq = queries.n_sets();
  TopKResult r = ctx.TopK(queries.Dense(), nq, corpus, k, {metric, mode}, false);
  std::vector<Hit> hits;
  for (uint64_t i = 0; i < nq; ++i) {
    for (uint64_t j = 0; j < k; ++j) {
      const uint64_t x = i * k + j;
      if (r.index[x] == UINT64_MAX) break;
      hits.push_back({qids.empty() ? std::to_string(i) : qids[i], j + 1, DocIdOf(corpus, r.index[x]), r.scores[x]});
    }
  }
  return hits;
}

inline void ExpectSameHits(const std::vector<Hit>& got, const std::vector<Hit>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].query_id, want[i].query_id) << what << " hit " << i;
    EXPECT_EQ(got[i].rank, want[i].rank) << what << " hit " << i;
    EXPECT_EQ(got[i].doc_id, want[i].doc_id) << what << " hit " << i;
    // Bit-identical: the tool prints round-trip decimals.
    uint32_t a, b;
    std::memcpy(&a, &got[i].score, 4);
    std::memcpy(&b, &want[i].score, 4);
    EXPECT_EQ(a, b) << what << " hit " << i << ": " << got[i].score << " vs " << want[i].score;
  }
}

}  // namespace maxsim::test

#endif  // MAXSIM_TESTS_CLI_TEST_UTIL_H_
