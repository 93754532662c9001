// SPDX-License-Identifier: Apache-2.0
// End-to-end tests of the `maxsim` command-line tool: the real binary is run as a child process, its output
// parsed and compared with the library's own top-k computed here; every documented error is provoked and must
// give a non-zero exit code and a message naming the problem. Also direct tests of the strict .npy reader.
// The retrieval commands (formats, shards, rerank, merge, eval) are in cli_retrieval_test.cc.
#include <map>
#include <set>

#include "cli_test_util.h"

namespace maxsim::test {
namespace {

// ---------------------------------------------------------------------------------------------------------

TEST_F(Cli, PackThenSearchMatchesTheLibraryInEveryModeMetricAndFormat) {
  std::mt19937_64 rng(11);
  TokenSets docs = Generate(rng, Shape::kClustered, 40, 0, 30, 48);  // includes empty documents
  docs.Encode(MAXSIM_F32);
  TokenSets queries = Generate(rng, Shape::kClustered, 5, 1, 12, 48);
  queries.Encode(MAXSIM_F32);
  const auto [dt, doff] = WriteSets(docs, "docs");
  const auto [qt, qoff] = WriteSets(queries, "queries");
  npy::Array ids;
  ids.dtype = npy::Dtype::kU64;
  ids.shape = {docs.n_sets()};
  for (uint64_t j = 0; j < docs.n_sets(); ++j) {
    const uint64_t id = 5000000000ull + 7 * j;  // above 2^32: ids are 64-bit end to end
    ids.data.insert(ids.data.end(), reinterpret_cast<const uint8_t*>(&id), reinterpret_cast<const uint8_t*>(&id) + 8);
  }
  ASSERT_EQ(npy::Write(Path("ids.npy"), ids), "");
  const std::string corpus = Path("corpus.maxsim");
  CliResult p = Run({"pack", dt, doff, "--ids", Path("ids.npy"), "-o", corpus});
  ASSERT_EQ(p.code, 0) << p.err;
  EXPECT_NE(p.out.find("packed 40 sets"), std::string::npos) << p.out;
  EXPECT_EQ(p.err, "");
  {
    Packed loaded = Packed::Load(corpus, MAXSIM_VALIDATE_DEEP);
    const maxsim_packed_desc d = loaded.Describe();
    EXPECT_EQ(d.n_sets, docs.n_sets());
    EXPECT_EQ(d.n_vectors, docs.rows());
    ASSERT_TRUE(d.has_ids);
    EXPECT_EQ(d.ids[39], 5000000000ull + 7 * 39);
  }
  for (maxsim_metric metric : {MAXSIM_METRIC_DOT, MAXSIM_METRIC_COSINE}) {
    for (maxsim_mode mode : {MAXSIM_MODE_EXACT, MAXSIM_MODE_CERTIFIED, MAXSIM_MODE_APPROXIMATE}) {
      const std::string m = mode == MAXSIM_MODE_EXACT ? "exact" : mode == MAXSIM_MODE_CERTIFIED ? "certified" : "approximate";
      const std::string met = metric == MAXSIM_METRIC_DOT ? "dot" : "cosine";
      const std::vector<Hit> want = LibraryTopK(corpus, queries, 7, metric, mode);
      ASSERT_EQ(want.size(), 5u * 7u);
      CliResult tsv = Run({"search", corpus, qt, qoff, "-k", "7", "--mode", m, "--metric", met});
      ASSERT_EQ(tsv.code, 0) << tsv.err;
      EXPECT_EQ(tsv.err, "") << "nothing on stderr (no progress line when stderr is not a terminal)";
      ExpectSameHits(ParseTsv(tsv.out), want, "tsv " + m + " " + met);
      CliResult json = Run({"search", corpus, qt, qoff, "-k=7", "--mode=" + m, "--metric", met, "--format", "json"});
      ASSERT_EQ(json.code, 0) << json.err;
      ExpectSameHits(ParseJson(json.out), want, "json " + m + " " + met);
      EXPECT_NE(json.out.find("\"mode\": \"" + m + "\""), std::string::npos);
    }
  }
  // Certified prints exactly what exact prints.
  EXPECT_EQ(Run({"search", corpus, qt, qoff, "--mode", "certified", "-k", "40"}).out,
            Run({"search", corpus, qt, qoff, "--mode", "exact", "-k", "40"}).out);
}

TEST_F(Cli, KLargerThanTheCorpusListsEveryDocumentOnceAndEmptyDocumentsLast) {
  std::mt19937_64 rng(12);
  TokenSets docs = Generate(rng, Shape::kGaussian, 6, 0, 5, 16);
  docs.offsets = {0, 3, 3, 8, 10, 10, 14};  // documents 1 and 4 are empty
  docs.values.resize(14 * 16);
  docs.Encode(MAXSIM_F32);
  TokenSets queries = Generate(rng, Shape::kGaussian, 2, 3, 3, 16);
  queries.Encode(MAXSIM_F32);
  const auto [dt, doff] = WriteSets(docs, "docs");
  const auto [qt, qoff] = WriteSets(queries, "queries");
  ASSERT_EQ(Run({"pack", dt, doff, "-o", Path("c.maxsim")}).code, 0);
  CliResult r = Run({"search", Path("c.maxsim"), qt, qoff, "-k", "50"});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::vector<Hit> hits = ParseTsv(r.out);
  ASSERT_EQ(hits.size(), 12u);
  ExpectSameHits(hits, LibraryTopK(Path("c.maxsim"), queries, 50, MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT), "k=50");
  for (uint64_t q = 0; q < 2; ++q) {
    std::set<std::string> seen;
    for (int r2 = 0; r2 < 6; ++r2) seen.insert(hits[q * 6 + r2].doc_id);
    EXPECT_EQ(seen.size(), 6u);
    // -inf, lower index first; without ids the id column is the document index.
    EXPECT_TRUE(std::isinf(hits[q * 6 + 4].score) && hits[q * 6 + 4].doc_id == "1");
    EXPECT_TRUE(std::isinf(hits[q * 6 + 5].score) && hits[q * 6 + 5].doc_id == "4");
  }
  EXPECT_NE(r.out.find("\t-inf\n"), std::string::npos);
  CliResult j = Run({"search", Path("c.maxsim"), qt, qoff, "-k", "50", "--format", "json"});
  EXPECT_NE(j.out.find("\"score\": null, \"empty\": true"), std::string::npos) << "-inf is not JSON: null + flag";
  ExpectSameHits(ParseJson(j.out), hits, "json k=50");
}

TEST_F(Cli, EmptyCorpusAndEmptyQuerySets) {
  std::mt19937_64 rng(14);
  TokenSets none;
  none.dim = 16;
  none.offsets = {0};
  none.Encode(MAXSIM_F32);
  TokenSets queries = Generate(rng, Shape::kGaussian, 3, 2, 4, 16);
  queries.offsets = {0, 0, 3, 3};  // queries 0 and 2 have no tokens
  queries.values.resize(3 * 16);
  queries.Encode(MAXSIM_F32);
  const auto [nt, no] = WriteSets(none, "none");
  const auto [qt, qoff] = WriteSets(queries, "queries");
  CliResult p = Run({"pack", nt, no, "-o", Path("empty.maxsim")});
  ASSERT_EQ(p.code, 0) << p.err;
  CliResult s = Run({"search", Path("empty.maxsim"), qt, qoff, "-k", "1000000"});
  ASSERT_EQ(s.code, 0) << s.err;
  EXPECT_EQ(s.out, "query_id\trank\tdoc_id\tscore\n") << "no documents: nothing to list";
  // Empty query sets score 0 against every non-empty document (ties: lower index first).
  TokenSets docs = Generate(rng, Shape::kGaussian, 5, 1, 4, 16);
  docs.Encode(MAXSIM_F32);
  const auto [dt, doff] = WriteSets(docs, "docs");
  ASSERT_EQ(Run({"pack", dt, doff, "-o", Path("c.maxsim")}).code, 0);
  CliResult r = Run({"search", Path("c.maxsim"), qt, qoff, "-k", "3", "--mode", "certified"});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::vector<Hit> hits = ParseTsv(r.out);
  ExpectSameHits(hits, LibraryTopK(Path("c.maxsim"), queries, 3, MAXSIM_METRIC_DOT, MAXSIM_MODE_CERTIFIED), "empty q");
  ASSERT_EQ(hits.size(), 9u);
  EXPECT_EQ(hits[0].score, 0.0f);
  EXPECT_EQ(hits[0].doc_id, "0");
  EXPECT_EQ(hits[2].doc_id, "2");
}

TEST_F(Cli, TextIdsAndHalfPrecisionOriginals) {
  std::mt19937_64 rng(13);
  TokenSets docs = Generate(rng, Shape::kUnitGaussian, 9, 1, 9, 32);
  docs.Encode(MAXSIM_F32);
  TokenSets queries = Generate(rng, Shape::kUnitGaussian, 3, 4, 4, 32);
  queries.Encode(MAXSIM_F16);  // f16 queries are read as they are
  const auto [dt, doff] = WriteSets(docs, "docs");
  const auto [qt, qoff] = WriteSets(queries, "queries");
  WriteBytes(Path("ids.txt"), "10\n11\n12\n13\n14\r\n15\n16\n17\n18");  // CRLF and no final newline too
  for (const std::string dtype : {"f16", "bf16", "keep"}) {
    const std::string c = Path("c-" + dtype + ".maxsim");
    CliResult p = Run({"pack", dt, doff, "--ids", Path("ids.txt"), "--dtype", dtype, "-o", c});
    ASSERT_EQ(p.code, 0) << p.err;
    Packed loaded = Packed::Load(c);
    const maxsim_packed_desc d = loaded.Describe();
    EXPECT_EQ(d.dtype, dtype == "f16" ? MAXSIM_F16 : dtype == "bf16" ? MAXSIM_BF16 : MAXSIM_F32);
    EXPECT_FALSE(d.has_ids) << "a text file holds string ids";
    EXPECT_EQ(loaded.StringId(0), "10");
    EXPECT_EQ(loaded.StringId(4), "14");
    EXPECT_EQ(loaded.StringId(8), "18");
    CliResult s = Run({"search", c, qt, qoff, "-k", "3", "--mode", "certified"});
    ASSERT_EQ(s.code, 0) << s.err;
    ExpectSameHits(ParseTsv(s.out), LibraryTopK(c, queries, 3, MAXSIM_METRIC_DOT, MAXSIM_MODE_CERTIFIED), dtype);
  }
  // f16 conversion of values beyond its range is refused with the offending element named.
  TokenSets big = docs;
  big.values[5 * 32 + 3] = 1e6f;
  big.Encode(MAXSIM_F32);
  const auto [bt, boff] = WriteSets(big, "big");
  CliResult r = Run({"pack", bt, boff, "--dtype", "f16", "-o", Path("big.maxsim")});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("row 5 element 3"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("outside the f16 range"), std::string::npos) << r.err;
}

TEST_F(Cli, DemoPassesItsCertifiedCheck) {
  CliResult r = Run({"demo", "--docs", "300", "--queries", "3", "--threads", "2"});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("check certified == exact:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(": PASS"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("3/3 queries"), std::string::npos) << r.out;
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << "no progress line when stderr is not a terminal";
  // Deterministic: the same seed gives the same corpus (the saved files are byte-identical).
  ASSERT_EQ(Run({"demo", "--docs", "50", "--queries", "2", "--seed", "5", "--save", Path("a")}).code, 0);
  ASSERT_EQ(Run({"demo", "--docs", "50", "--queries", "2", "--seed", "5", "--threads", "1", "--save", Path("b")}).code, 0);
  for (const char* f : {"docs_tokens.npy", "docs_offsets.npy", "queries_tokens.npy", "docs_ids.txt", "corpus.maxsim"}) {
    const std::string a = ReadFile(Path(std::string("a/") + f)), b = ReadFile(Path(std::string("b/") + f));
    EXPECT_FALSE(a.empty()) << f;
    EXPECT_EQ(a, b) << f;
  }
  // The saved files feed pack and search.
  CliResult s = Run({"search", Path("a/corpus.maxsim"), Path("a/queries_tokens.npy"), Path("a/queries_offsets.npy"),
                     "-k", "1"});
  ASSERT_EQ(s.code, 0) << s.err;
  EXPECT_EQ(ParseTsv(s.out).size(), 2u);
}

TEST_F(Cli, InfoBenchAndHelp) {
  CliResult info = Run({"info"});
  ASSERT_EQ(info.code, 0) << info.err;
  for (size_t i = 0; i < maxsim_kernel_count(); ++i) {
    EXPECT_NE(info.out.find(maxsim_kernel_name(i)), std::string::npos) << "info lists kernel " << maxsim_kernel_name(i);
  }
  EXPECT_NE(info.out.find("selected"), std::string::npos);
  CliResult forced = Run({"info", "--isa", "scalar", "--threads", "3"});
  EXPECT_NE(forced.out.find("Selected kernel: scalar (forced"), std::string::npos) << forced.out;
  EXPECT_NE(forced.out.find("Threads: 3 (set by the options)"), std::string::npos) << forced.out;
  CliResult bench = Run({"bench", "--docs", "20", "--reps", "1"});
  ASSERT_EQ(bench.code, 0) << bench.err;
  for (const char* m : {"naive loops", "exact (", "certified (", "approximate ("}) {
    EXPECT_NE(bench.out.find(m), std::string::npos) << m << "\n" << bench.out;
  }
  for (const std::string cmd : {"search", "rerank", "merge", "eval", "pack"}) {
    CliResult h = Run({cmd, "--help"});
    EXPECT_EQ(h.code, 0) << cmd;
    EXPECT_NE(h.out.find("Usage: maxsim " + cmd), std::string::npos) << cmd;
  }
  EXPECT_NE(Run({"help", "pack"}).out.find("Usage: maxsim pack"), std::string::npos);
  EXPECT_EQ(Run({"--version"}).code, 0);
  CliResult none = Run({});
  EXPECT_EQ(none.code, 2);
  CliResult unknown = Run({"serach"});
  EXPECT_EQ(unknown.code, 2);
  EXPECT_NE(unknown.err.find("unknown command 'serach'"), std::string::npos);
}

// ---- errors ---------------------------------------------------------------------------------------------

class CliErrors : public Cli {
 protected:
  void SetUp() override {
    Cli::SetUp();
    std::mt19937_64 rng(21);
    docs_ = Generate(rng, Shape::kUnitGaussian, 8, 1, 10, 24);
    docs_.Encode(MAXSIM_F32);
    queries_ = Generate(rng, Shape::kUnitGaussian, 2, 4, 4, 24);
    queries_.Encode(MAXSIM_F32);
    std::tie(dt_, doff_) = WriteSets(docs_, "docs");
    std::tie(qt_, qoff_) = WriteSets(queries_, "queries");
    corpus_ = Path("corpus.maxsim");
    ASSERT_EQ(Run({"pack", dt_, doff_, "-o", corpus_}).code, 0);
  }
  // Runs and expects a failure with `code` whose stderr contains every fragment.
  void ExpectError(const std::vector<std::string>& args, int code, const std::vector<std::string>& fragments) {
    CliResult r = Run(args);
    std::string cmd;
    for (const std::string& a : args) cmd += a + " ";
    EXPECT_EQ(r.code, code) << cmd << "\n" << r.err;
    EXPECT_EQ(r.out, "") << cmd << ": nothing on stdout on failure";
    EXPECT_NE(r.err.find("error: "), std::string::npos) << cmd;
    for (const std::string& f : fragments) EXPECT_NE(r.err.find(f), std::string::npos) << cmd << "\n" << r.err;
  }
  // A .npy image with the given header dict and data bytes.
  static std::string Npy(const std::string& dict, const std::string& data, uint8_t major = 1) {
    std::string header = dict;
    const size_t prefix = major == 1 ? 10 : 12;
    while ((prefix + header.size() + 1) % 64) header += ' ';
    header += '\n';
    std::string b = "\x93NUMPY";
    b += static_cast<char>(major);
    b += '\0';
    b += static_cast<char>(header.size() & 0xFF);
    b += static_cast<char>((header.size() >> 8) & 0xFF);
    if (major != 1) b += std::string(2, '\0');
    return b + header + data;
  }
  std::string QueryBytes() const { return std::string(queries_.encoded.begin(), queries_.encoded.end()); }

  TokenSets docs_, queries_;
  std::string dt_, doff_, qt_, qoff_, corpus_;
};

TEST_F(CliErrors, MissingFiles) {
  ExpectError({"search", Path("nope.maxsim"), qt_, qoff_}, 1, {"nope.maxsim", "No such file"});
  ExpectError({"search", corpus_, Path("nope.npy"), qoff_}, 1, {"nope.npy", "cannot open"});
  ExpectError({"pack", Path("nope.npy"), doff_, "-o", Path("x.maxsim")}, 1, {"nope.npy", "cannot open"});
  ExpectError({"pack", dt_, doff_, "--ids", Path("nope.txt"), "-o", Path("x.maxsim")}, 1, {"nope.txt", "cannot open"});
  ExpectError({"pack", dt_, doff_, "-o", Path("no-such-dir/x.maxsim")}, 1, {"no-such-dir/x.maxsim"});
  struct stat st;
  EXPECT_NE(stat(Path("x.maxsim").c_str(), &st), 0) << "no output file after a failure";
}

TEST_F(CliErrors, PickledMalformedTruncatedAndFortranNpy) {
  const std::string shape = "'shape': (8, 24), ";
  const std::string data = QueryBytes();
  WriteBytes(Path("pickled.npy"), Npy("{'descr': '|O', 'fortran_order': False, " + shape + "}", std::string(64, '\0')));
  ExpectError({"search", corpus_, Path("pickled.npy"), qoff_}, 1, {"pickled.npy", "object (pickled) array: refused"});
  WriteBytes(Path("structured.npy"),
             Npy("{'descr': [('a', '<f4')], 'fortran_order': False, " + shape + "}", data));
  ExpectError({"search", corpus_, Path("structured.npy"), qoff_}, 1, {"structured or object arrays"});
  WriteBytes(Path("fortran.npy"), Npy("{'descr': '<f4', 'fortran_order': True, " + shape + "}", data));
  ExpectError({"search", corpus_, Path("fortran.npy"), qoff_}, 1, {"fortran.npy", "Fortran-ordered", "ascontiguousarray"});
  WriteBytes(Path("truncated.npy"), Npy("{'descr': '<f4', 'fortran_order': False, " + shape + "}", data.substr(0, 100)));
  ExpectError({"search", corpus_, Path("truncated.npy"), qoff_}, 1, {"truncated.npy", "truncated or trailing bytes"});
  WriteBytes(Path("nodict.npy"), Npy("['descr', '<f4']", data));
  ExpectError({"search", corpus_, Path("nodict.npy"), qoff_}, 1, {"nodict.npy", "not a Python dict"});
  WriteBytes(Path("noshape.npy"), Npy("{'descr': '<f4', 'fortran_order': False}", data));
  ExpectError({"search", corpus_, Path("noshape.npy"), qoff_}, 1, {"lacks descr, fortran_order or shape"});
  WriteBytes(Path("badkey.npy"), Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (8, 24), 'x': 1}", data));
  ExpectError({"search", corpus_, Path("badkey.npy"), qoff_}, 1, {"unknown key 'x'"});
  WriteBytes(Path("badshape.npy"), Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (8, -24), }", data));
  ExpectError({"search", corpus_, Path("badshape.npy"), qoff_}, 1, {"shape holds something other than"});
  WriteBytes(Path("bigendian.npy"), Npy("{'descr': '>f4', 'fortran_order': False, " + shape + "}", data));
  ExpectError({"search", corpus_, Path("bigendian.npy"), qoff_}, 1, {"big-endian"});
  WriteBytes(Path("magic.npy"), "PK\x03\x04 this is a zip file, not .npy");
  ExpectError({"search", corpus_, Path("magic.npy"), qoff_}, 1, {"magic.npy", "bad magic"});
  std::string hdr_overrun = Npy("{'descr': '<f4', 'fortran_order': False, " + shape + "}", data);
  hdr_overrun[8] = '\xff';
  hdr_overrun[9] = '\x7f';
  WriteBytes(Path("overrun.npy"), hdr_overrun);
  ExpectError({"search", corpus_, Path("overrun.npy"), qoff_}, 1, {"header length exceeds the file"});
  WriteBytes(Path("f64.npy"), Npy("{'descr': '<f8', 'fortran_order': False, 'shape': (8, 24), }", data + data));
  ExpectError({"search", corpus_, Path("f64.npy"), qoff_}, 1, {"float64", "astype(np.float32)"});
  // The offsets file is read just as strictly.
  WriteBytes(Path("off-f32.npy"), Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", std::string(12, '\0')));
  ExpectError({"search", corpus_, qt_, Path("off-f32.npy")}, 1, {"offsets must be int64 or uint64"});
}

TEST_F(CliErrors, DimensionMismatchBetweenQueriesAndCorpus) {
  std::mt19937_64 rng(5);
  TokenSets q = Generate(rng, Shape::kUnitGaussian, 2, 3, 3, 16);
  q.Encode(MAXSIM_F32);
  const auto [t, o] = WriteSets(q, "q16");
  ExpectError({"search", corpus_, t, o}, 1, {"dimension 16", "dimension 24", "same embedding model"});
}

TEST_F(CliErrors, BadOffsets) {
  auto write = [&](const std::string& name, std::vector<int64_t> v) {
    npy::Array a;
    a.dtype = npy::Dtype::kI64;
    a.shape = {v.size()};
    a.data.resize(v.size() * 8);
    if (!v.empty()) std::memcpy(a.data.data(), v.data(), a.data.size());
    EXPECT_EQ(npy::Write(Path(name), a), "");
    return Path(name);
  };
  ExpectError({"search", corpus_, qt_, write("dec.npy", {0, 5, 3, 8})}, 1, {"decrease at index 2", "non-decreasing"});
  ExpectError({"search", corpus_, qt_, write("short.npy", {0, 4, 7})}, 1, {"last offset is 7", "has 8 rows"});
  ExpectError({"search", corpus_, qt_, write("start.npy", {2, 4, 8})}, 1, {"offsets[0] is 2"});
  ExpectError({"search", corpus_, qt_, write("neg.npy", {0, -4, 8})}, 1, {"offsets[1] is -4", "negative"});
  ExpectError({"search", corpus_, qt_, write("empty.npy", {})}, 1, {"offsets is empty"});
  ExpectError({"pack", dt_, write("past.npy", {0, 4, 1000}), "-o", Path("x.maxsim")}, 1, {"last offset is 1000"});
  npy::Array two_d;
  two_d.dtype = npy::Dtype::kI64;
  two_d.shape = {1, 3};
  two_d.data.assign(24, 0);
  ASSERT_EQ(npy::Write(Path("2d.npy"), two_d), "");
  ExpectError({"search", corpus_, qt_, Path("2d.npy")}, 1, {"1-D array"});
}

TEST_F(CliErrors, BadIds) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"1\n2\n3\n", {"has 3 ids (lines)", "8 sets"}},
      {"a\nb\n\nd\ne\nf\ng\nh\n", {"bad.txt:3", "is empty"}},
      {"a\nb\nc\td\n", {"bad.txt:3", "'c\td' contains a tab"}},
      {"a\n\xff\xfe\n", {"bad.txt:2", "not valid UTF-8"}},
      {"a\nb\nc\nd\ne\nf\ng\nh\ni\n", {"has 9 ids (lines)"}},
  };
  for (const auto& [text, fragments] : cases) {
    WriteBytes(Path("bad.txt"), text);
    ExpectError({"pack", dt_, doff_, "--ids", Path("bad.txt"), "-o", Path("x.maxsim")}, 1, fragments);
  }
  npy::Array few;
  few.dtype = npy::Dtype::kU64;
  few.shape = {3};
  few.data.assign(24, 0);
  ASSERT_EQ(npy::Write(Path("few.npy"), few), "");
  ExpectError({"pack", dt_, doff_, "--ids", Path("few.npy"), "-o", Path("x.maxsim")}, 1, {"has 3 ids", "8 sets"});
  struct stat st;
  EXPECT_NE(stat(Path("x.maxsim").c_str(), &st), 0) << "no output file after a failure";
}

TEST_F(CliErrors, CommandLineMistakes) {
  ExpectError({"search", corpus_, qt_, qoff_, "--bogus"}, 2, {"unknown option '--bogus'", "maxsim search --help"});
  ExpectError({"search", corpus_, qt_, qoff_, "-x"}, 2, {"unknown option '-x'"});
  ExpectError({"search", corpus_, qt_, qoff_, "--mode", "fast"}, 2, {"--mode 'fast'", "exact|certified|approximate"});
  ExpectError({"search", corpus_, qt_, qoff_, "--metric", "l2"}, 2, {"--metric 'l2'", "dot|cosine"});
  ExpectError({"search", corpus_, qt_, qoff_, "--format", "csv"}, 2, {"text|tsv|json|jsonl|trec"});
  ExpectError({"search", corpus_, qt_, qoff_, "-k", "0"}, 2, {"'0' is not an integer from 1"});
  ExpectError({"search", corpus_, qt_, qoff_, "-k", "ten"}, 2, {"'ten'"});
  ExpectError({"search", corpus_, qt_, qoff_, "--threads", "-3"}, 2, {"--threads '-3'"});
  ExpectError({"search", corpus_, qt_, qoff_, "--mode"}, 2, {"--mode needs a value"});
  ExpectError({"search", corpus_, qt_}, 1, {"need an offsets file"});
  ExpectError({"search", corpus_}, 2, {"needs the queries"});
  ExpectError({"search", corpus_, qt_, qoff_, "extra"}, 1, {"extra: cannot open"});
  ExpectError({"search", corpus_, qt_, qoff_, qoff_}, 2, {"is extra"});
  ExpectError({"search", qt_, qoff_}, 2, {"needs a packed corpus"});
  ExpectError({"pack", dt_, doff_}, 2, {"-o OUT.maxsim"});
  ExpectError({"pack", dt_, doff_, "-o", Path("x.maxsim"), "--dtype", "f8"}, 2, {"--dtype 'f8'"});
  ExpectError({"demo", "--docs", "0"}, 2, {"--docs '0'"});
  ExpectError({"info", "--no-progress=1"}, 2, {"takes no value"});
  ExpectError({"info", "--isa", "no-such-kernel"}, 1, {"'no-such-kernel'", "is not a CPU kernel name"});
}

TEST_F(CliErrors, CorruptPackedFileIsRejectedByValidation) {
  std::string bytes = ReadFile(corpus_);
  ASSERT_GT(bytes.size(), 1024u);
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x5A;
  WriteBytes(Path("flipped.maxsim"), flipped);
  ExpectError({"search", Path("flipped.maxsim"), qt_, qoff_}, 1, {"flipped.maxsim", "MAXSIM_ERR_INVALID_BUFFER"});
  WriteBytes(Path("cut.maxsim"), bytes.substr(0, bytes.size() - 64));
  ExpectError({"search", Path("cut.maxsim"), qt_, qoff_}, 1, {"cut.maxsim", "MAXSIM_ERR_INVALID_BUFFER"});
  WriteBytes(Path("npy-as-corpus.maxsim"), ReadFile(qt_));
  ExpectError({"search", Path("npy-as-corpus.maxsim"), qt_, qoff_}, 1, {"MAXSIM_ERR_INVALID_BUFFER"});
}

TEST_F(CliErrors, NonFiniteTokensAreRefusedAtPackTime) {
  TokenSets bad = docs_;
  uint64_t set = 0;
  while (bad.length(set) < 2) ++set;
  bad.values[(docs_.offsets[set] + 1) * 24 + 5] = NAN;  // token 1 of the first set with two tokens
  bad.Encode(MAXSIM_F32);
  const auto [t, o] = WriteSets(bad, "bad");
  ExpectError({"pack", t, o, "-o", Path("bad.maxsim")}, 1,
              {"MAXSIM_ERR_NON_FINITE", "set " + std::to_string(set) + " token 1"});
  struct stat st;
  EXPECT_NE(stat(Path("bad.maxsim").c_str(), &st), 0) << "nothing written";
}

// ---- the .npy reader directly ---------------------------------------------------------------------------

TEST(NpyReader, AcceptsVersions1To3AndRoundTrips) {
  npy::Array a;
  a.dtype = npy::Dtype::kF32;
  a.shape = {2, 3};
  const float v[6] = {1, 2, 3, 4, 5, 6};
  a.data.assign(reinterpret_cast<const uint8_t*>(v), reinterpret_cast<const uint8_t*>(v) + 24);
  char tmpl[] = "/tmp/maxsim-npy-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/a.npy";
  ASSERT_EQ(npy::Write(path, a), "");
  npy::Array b;
  ASSERT_EQ(npy::Read(path, &b), "");
  EXPECT_EQ(b.shape, a.shape);
  EXPECT_EQ(b.data, a.data);
  std::system(("rm -rf '" + std::string(tmpl) + "'").c_str());
  // Version 2.0 (4-byte header length) with a Python-2 long suffix and a one-element tuple.
  std::string h = "{'descr': '<i8', 'fortran_order': False, 'shape': (2L,), }";
  while ((12 + h.size() + 1) % 64) h += ' ';
  h += '\n';
  std::string img = std::string("\x93NUMPY\x02\x00", 8) + static_cast<char>(h.size()) + std::string(3, '\0') + h +
                    std::string(16, '\x01');
  npy::Array c;
  ASSERT_EQ(npy::Parse(reinterpret_cast<const uint8_t*>(img.data()), img.size(), &c), "");
  EXPECT_EQ(c.dtype, npy::Dtype::kI64);
  EXPECT_EQ(c.shape, std::vector<uint64_t>{2});
}

TEST(NpyReader, RejectsWhatItCannotRepresentExactly) {
  auto parse = [](const std::string& dict, size_t data_bytes) {
    std::string h = dict;
    while ((10 + h.size() + 1) % 64) h += ' ';
    h += '\n';
    std::string img = std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(h.size() & 0xFF) +
                      static_cast<char>(h.size() >> 8) + h + std::string(data_bytes, '\0');
    npy::Array a;
    return npy::Parse(reinterpret_cast<const uint8_t*>(img.data()), img.size(), &a);
  };
  EXPECT_EQ(parse("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", 16), "");
  EXPECT_NE(parse("{'descr': '|O', 'fortran_order': False, 'shape': (2,), }", 16).find("pickled"), std::string::npos);
  EXPECT_NE(parse("{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", 16).find("not supported"),
            std::string::npos);
  EXPECT_NE(parse("{'descr': '<f4', 'fortran_order': maybe, 'shape': (2,), }", 8).find("neither True nor False"),
            std::string::npos);
  EXPECT_NE(parse("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999, 99999999999), }", 8)
                .find("overflows"),
            std::string::npos);
  EXPECT_NE(parse("{'descr': '<f4', 'fortran_order': False, 'shape': (184467440737095516160,), }", 8).find("overflows"),
            std::string::npos);
  EXPECT_NE(parse("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 12).find("trailing"), std::string::npos);
  EXPECT_NE(parse("{'descr': '<f\\4', 'fortran_order': False, 'shape': (2,), }", 8).find("descr"), std::string::npos);
  EXPECT_NE(parse("{'descr: '<f4', 'fortran_order': False, 'shape': (2,), }", 8), "");
  // A NUL inside the descr is shown (escaped), not allowed to cut the message short.
  const std::string nul = parse(std::string("{'descr': '<f") + '\0' + "x9', 'fortran_order': False, 'shape': (2,), }", 8);
  EXPECT_NE(nul.find("'<f\\x00x9' is not supported"), std::string::npos) << nul;
  std::string bimg = "{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }";
  EXPECT_EQ(parse(bimg, 3), "");
  const std::string v9("\x93NUMPY\x09\x00\x10\x00{}", 12);
  npy::Array a;
  EXPECT_NE(npy::Parse(reinterpret_cast<const uint8_t*>(v9.data()), v9.size(), &a).find("version 9"), std::string::npos);
  EXPECT_NE(npy::Parse(reinterpret_cast<const uint8_t*>("\x93NUMPY"), 6, &a).find("bad magic"), std::string::npos);
}

// Inputs that are not regular files are refused before anything can block on them; outputs never replace
// one; a bool array is called bool; MAXSIM_CPU_MASK must be a hex mask.
TEST_F(CliErrors, NonRegularFilesAndBadEnvironmentAreRefused) {
  const std::string fifo = Path("fifo.npy"), folder = Path("folder.npy");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  ASSERT_EQ(mkdir(folder.c_str(), 0755), 0);
  ExpectError({"search", corpus_, fifo, qoff_}, 1, {"FIFO"});
  ExpectError({"search", corpus_, qt_, fifo}, 1, {"FIFO"});
  ExpectError({"search", fifo, qt_, qoff_}, 1, {"FIFO"});
  ExpectError({"search", corpus_, folder, qoff_}, 1, {"is a directory"});
  ExpectError({"pack", dt_, doff_, "--ids", fifo, "-o", Path("x.maxsim")}, 1, {"FIFO"});
  ExpectError({"pack", dt_, doff_, "-o", fifo}, 1, {"FIFO", "refusing to replace"});
  ExpectError({"pack", dt_, doff_, "-o", folder}, 1, {"directory", "refusing to replace"});
  struct stat st;
  ASSERT_EQ(stat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "the FIFO was replaced";
  // demo --save writes its id list through the same writer: a FIFO in its place is refused, not opened.
  ASSERT_EQ(mkdir(Path("demo").c_str(), 0755), 0);
  ASSERT_EQ(mkfifo(Path("demo/docs_ids.txt").c_str(), 0644), 0);
  CliResult demo = Run({"demo", "--docs", "20", "--queries", "1", "--save", Path("demo")});
  EXPECT_EQ(demo.code, 1) << demo.err;
  EXPECT_NE(demo.err.find("refusing to replace"), std::string::npos) << demo.err;
  ASSERT_EQ(stat(Path("demo/docs_ids.txt").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "demo replaced the FIFO";
  WriteBytes(Path("bool.npy"), Npy("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }", std::string(3, '\1')));
  ExpectError({"search", corpus_, qt_, Path("bool.npy")}, 1, {"not bool"});
  setenv("MAXSIM_CPU_MASK", "zz", 1);
  CliResult r = Run({"info"});
  unsetenv("MAXSIM_CPU_MASK");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("MAXSIM_CPU_MASK='zz'"), std::string::npos) << r.err;
}

// ---- real embeddings --------------------------------------------------------------------------------------

TEST_F(Cli, RealColbertEmbeddingsPackSearchAndRankRelevantDocumentsFirst) {
  const std::string data = SharedDataDir();
  if (data.empty()) {
    GTEST_SKIP() << "../shared/data/colbert-nanofiqa not found next to the source tree (set MAXSIM_SHARED_DIR to the "
                    "folder holding data/colbert-nanofiqa to run this test)";
  }
  const std::string corpus = Path("fiqa.maxsim");
  CliResult p = Run({"pack", data + "/docs_tokens.npy", data + "/docs_offsets.npy", "--ids", data + "/docs_ids.txt",
                     "-o", corpus});
  ASSERT_EQ(p.code, 0) << p.err;
  EXPECT_NE(p.out.find("packed 35 sets, 4430 vectors, dim 128"), std::string::npos) << p.out;
  TokenSets q, d;
  std::vector<std::string> qids, dids;
  std::string error;
  ASSERT_TRUE(LoadNanoFiqa(&q, &d, &qids, &dids, &error)) << error;
  q.Encode(MAXSIM_F32);
  const std::string qt = data + "/queries_tokens.npy", qo = data + "/queries_offsets.npy";
  CliResult exact = Run({"search", corpus, qt, qo, "-k", "35", "--query-ids", data + "/queries_ids.txt"});
  ASSERT_EQ(exact.code, 0) << exact.err;
  const std::vector<Hit> hits = ParseTsv(exact.out);
  ExpectSameHits(hits, LibraryTopK(corpus, q, 35, MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT, qids), "real exact");
  for (const char* metric : {"dot", "cosine"}) {
    EXPECT_EQ(Run({"search", corpus, qt, qo, "-k", "35", "--mode", "certified", "--metric", metric}).out,
              Run({"search", corpus, qt, qo, "-k", "35", "--mode", "exact", "--metric", metric}).out)
        << "certified must print exactly what exact prints (" << metric << ")";
  }
  // Each query's best document is one the qrels mark relevant.
  std::map<std::string, std::set<std::string>> qrels;
  std::istringstream in(ReadFile(data + "/qrels.tsv"));
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string qid, did;
    f >> qid >> did;
    qrels[qid].insert(did);
  }
  ASSERT_EQ(qids.size(), 5u);
  for (const Hit& h : hits) {
    if (h.rank == 1) EXPECT_TRUE(qrels[h.query_id].count(h.doc_id)) << "query " << h.query_id << " top-1 " << h.doc_id;
  }
}

}  // namespace
}  // namespace maxsim::test
