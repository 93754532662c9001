// SPDX-License-Identifier: Apache-2.0
// End-to-end tests of the retrieval commands of `maxsim`: string ids and query ids in every output format
// (JSON checked by a strict parser), padded queries with masks, search over shards and `merge` (identical to
// one corpus, ties included), `rerank`, `eval` (hand-computed values and pytrec_eval's on the shipped data),
// atomic output files, --verbose and --quiet.
#include <dirent.h>

#include <algorithm>
#include <map>
#include <memory>

#include "cli_test_util.h"

namespace maxsim::test {
namespace {

// ---- a strict JSON parser (RFC 8259), enough to check that every JSON output is valid and read it back ----

struct Json {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
  double number = 0;
  std::string text;
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;
  const Json& operator[](const std::string& key) const {
    for (const auto& m : members) {
      if (m.first == key) return m.second;
    }
    static const Json missing;
    ADD_FAILURE() << "no member '" << key << "'";
    return missing;
  }
  bool Has(const std::string& key) const {
    for (const auto& m : members) {
      if (m.first == key) return true;
    }
    return false;
  }
};

class JsonParser {
 public:
  explicit JsonParser(const std::string& s) : s_(s) {}
  // Parses one value followed only by whitespace; false (with *error) if the text is not valid JSON.
  bool ParseAll(Json* out, std::string* error) {
    try {
      *out = Value();
      Space();
      if (i_ != s_.size()) Fail("trailing text");
      return true;
    } catch (const std::runtime_error& e) {
      *error = e.what();
      return false;
    }
  }

 private:
  [[noreturn]] void Fail(const std::string& what) {
    throw std::runtime_error(what + " at byte " + std::to_string(i_) + ": '" + s_.substr(i_, 40) + "'");
  }
  void Space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  void Expect(char c) {
    Space();
    if (i_ >= s_.size() || s_[i_] != c) Fail(std::string("expected '") + c + "'");
    ++i_;
  }
  std::string String() {
    Expect('"');
    std::string out;
    while (true) {
      if (i_ >= s_.size()) Fail("unterminated string");
      const unsigned char c = static_cast<unsigned char>(s_[i_++]);
      if (c == '"') return out;
      if (c < 0x20) Fail("raw control character in a string");
      if (c != '\\') {
        out += static_cast<char>(c);
        continue;
      }
      if (i_ >= s_.size()) Fail("dangling backslash");
      const char e = s_[i_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          if (i_ + 4 > s_.size()) Fail("short \\u escape");
          const unsigned v = static_cast<unsigned>(std::stoul(s_.substr(i_, 4), nullptr, 16));
          i_ += 4;
          if (v >= 0x80) Fail("this test parser only decodes ASCII \\u escapes");
          out += static_cast<char>(v);
          break;
        }
        default: Fail("bad escape");
      }
    }
  }
  Json Value() {
    Space();
    if (i_ >= s_.size()) Fail("expected a value");
    Json v;
    const char c = s_[i_];
    if (c == '{') {
      v.kind = Json::kObject;
      ++i_;
      Space();
      if (i_ < s_.size() && s_[i_] == '}') {
        ++i_;
        return v;
      }
      while (true) {
        std::string key = String();
        Expect(':');
        v.members.emplace_back(key, Value());
        Space();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        Expect('}');
        return v;
      }
    }
    if (c == '[') {
      v.kind = Json::kArray;
      ++i_;
      Space();
      if (i_ < s_.size() && s_[i_] == ']') {
        ++i_;
        return v;
      }
      while (true) {
        v.items.push_back(Value());
        Space();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        Expect(']');
        return v;
      }
    }
    if (c == '"') {
      v.kind = Json::kString;
      v.text = String();
      return v;
    }
    for (const char* lit : {"null", "true", "false"}) {
      if (s_.compare(i_, std::strlen(lit), lit) == 0) {
        i_ += std::strlen(lit);
        v.kind = lit[0] == 'n' ? Json::kNull : Json::kBool;
        v.number = lit[0] == 't';
        return v;
      }
    }
    // Number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?  (no nan, inf, leading '+' or bare '.')
    static const std::regex number("-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?");
    size_t end = i_;
    while (end < s_.size() && std::strchr("+-0123456789.eE", s_[end])) ++end;
    const std::string t = s_.substr(i_, end - i_);
    if (t.empty() || !std::regex_match(t, number)) Fail("not a JSON value");
    v.kind = Json::kNumber;
    v.number = std::strtod(t.c_str(), nullptr);
    i_ = end;
    return v;
  }
  const std::string& s_;
  size_t i_ = 0;
};

Json ParseJsonText(const std::string& text) {
  Json v;
  std::string error;
  EXPECT_TRUE(JsonParser(text).ParseAll(&v, &error)) << error << "\n" << text.substr(0, 400);
  return v;
}

// Hits of a JSON object written by --format json, or of one line of --format jsonl.
std::vector<Hit> HitsOfJson(const Json& j) {
  std::vector<Hit> hits;
  for (const Json& q : j["results"].items) {
    for (const Json& h : q["hits"].items) {
      const Json& s = h["score"];
      EXPECT_EQ(s.kind == Json::kNull, h.Has("empty")) << "null scores (and only they) carry \"empty\": true";
      hits.push_back({q["query_id"].text, static_cast<uint64_t>(h["rank"].number), h["doc_id"].text,
                      s.kind == Json::kNull ? -INFINITY : static_cast<float>(s.number)});
    }
  }
  return hits;
}

std::vector<Hit> HitsOfJsonl(const std::string& text) {
  std::vector<Hit> hits;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const Json h = ParseJsonText(line);
    const Json& s = h["score"];
    hits.push_back({h["query_id"].text, static_cast<uint64_t>(h["rank"].number), h["doc_id"].text,
                    s.kind == Json::kNull ? -INFINITY : static_cast<float>(s.number)});
  }
  return hits;
}

std::string Lines(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += x + "\n";
  return s;
}

// Token sets [begin, end) of `t` as their own collection (a shard).
TokenSets Slice(const TokenSets& t, uint64_t begin, uint64_t end) {
  TokenSets s;
  s.dim = t.dim;
  s.offsets.push_back(0);
  for (uint64_t i = begin; i < end; ++i) {
    s.values.insert(s.values.end(), t.row(t.offsets[i]), t.row(t.offsets[i + 1]));
    s.offsets.push_back(s.values.size() / t.dim);
  }
  s.Encode(t.dtype);
  return s;
}

class Retrieval : public Cli {
 protected:
  // Packs `docs` with string ids into NAME.maxsim and returns its path.
  std::string PackWithIds(const TokenSets& docs, const std::vector<std::string>& ids, const std::string& name) {
    const auto [t, o] = WriteSets(docs, name);
    WriteBytes(Path(name + "_ids.txt"), Lines(ids));
    const std::string out = Path(name + ".maxsim");
    CliResult p = Run({"pack", t, o, "--ids", Path(name + "_ids.txt"), "-o", out});
    EXPECT_EQ(p.code, 0) << p.err;
    return out;
  }
};

// ---------------------------------------------------------------------------------------------------------

TEST_F(Retrieval, StringIdsAndQueryIdsInEveryFormat) {
  std::mt19937_64 rng(41);
  TokenSets docs = Generate(rng, Shape::kClustered, 12, 1, 12, 24);
  docs.values.erase(docs.values.begin() + static_cast<std::ptrdiff_t>(docs.offsets[5] * 24),
                    docs.values.begin() + static_cast<std::ptrdiff_t>(docs.offsets[6] * 24));
  const uint64_t removed = docs.length(5);
  for (size_t i = 6; i < docs.offsets.size(); ++i) docs.offsets[i] -= removed;  // document 5 is empty
  docs.Encode(MAXSIM_F32);
  TokenSets queries = Generate(rng, Shape::kClustered, 3, 2, 6, 24);
  queries.Encode(MAXSIM_F32);
  std::vector<std::string> ids;
  for (int j = 0; j < 12; ++j) ids.push_back("d" + std::to_string(j));
  ids[1] = "caf\xc3\xa9-1";       // UTF-8
  ids[2] = "say \"hi\"";          // quotes (and a space)
  ids[3] = "back\\slash";
  ids[4] = "two words";
  const std::string corpus = PackWithIds(docs, ids, "docs");
  {
    Packed p = Packed::Load(corpus);
    for (int j = 0; j < 12; ++j) EXPECT_EQ(p.StringId(static_cast<uint64_t>(j)), ids[static_cast<size_t>(j)]);
  }
  const std::vector<std::string> qids = {"q-\xce\xb1", "q2", "q\"3\""};
  WriteBytes(Path("qids.txt"), Lines(qids));
  const auto [qt, qo] = WriteSets(queries, "q");
  const std::vector<Hit> want = LibraryTopK(corpus, queries, 12, MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT, qids);
  auto search = [&](const std::string& format) {
    CliResult r = Run({"search", corpus, qt, qo, "-k", "12", "--query-ids", Path("qids.txt"), "--format", format});
    EXPECT_EQ(r.code, 0) << format << ": " << r.err;
    EXPECT_EQ(r.err, "") << format;
    return r.out;
  };
  ExpectSameHits(ParseTsv(search("tsv")), want, "tsv");
  const std::string json = search("json");
  const Json j = ParseJsonText(json);
  ExpectSameHits(HitsOfJson(j), want, "json");
  EXPECT_EQ(j["command"].text, "search");
  EXPECT_EQ(j["mode"].text, "exact");
  EXPECT_NE(json.find("\"doc_id\": \"say \\\"hi\\\"\""), std::string::npos) << "quotes escaped";
  EXPECT_NE(json.find("\"doc_id\": \"back\\\\slash\""), std::string::npos) << "backslash escaped";
  EXPECT_NE(json.find("\"score\": null, \"empty\": true"), std::string::npos) << "empty documents: null + flag";
  EXPECT_EQ(json.find("inf"), std::string::npos) << "no inf/nan in JSON";
  EXPECT_EQ(json.find("nan"), std::string::npos);
  ExpectSameHits(HitsOfJsonl(search("jsonl")), want, "jsonl");
  const std::string text = search("text");
  for (const std::string& q : qids) EXPECT_NE(text.find("query " + q + ": 12 hits"), std::string::npos) << text;
  for (const std::string& d : ids) EXPECT_NE(text.find(d + "\n"), std::string::npos) << d;
  // TREC fields are whitespace-separated: an id with a space is refused, naming it, and nothing is written.
  CliResult trec = Run({"search", corpus, qt, qo, "-k", "12", "--query-ids", Path("qids.txt"), "--format", "trec",
                        "-o", Path("run.trec")});
  EXPECT_EQ(trec.code, 1);
  EXPECT_NE(trec.err.find("contains whitespace, which a TREC run cannot hold"), std::string::npos) << trec.err;
  struct stat st;
  EXPECT_NE(stat(Path("run.trec").c_str(), &st), 0);
  // Without whitespace in the ids, TREC carries the same hits, with the tag asked for.
  for (auto& id : ids) std::replace(id.begin(), id.end(), ' ', '_');
  const std::string corpus2 = PackWithIds(docs, ids, "docs2");
  CliResult ok = Run({"search", corpus2, qt, qo, "-k", "12", "--query-ids", Path("qids.txt"), "--format", "trec",
                      "--tag", "run-7", "-o", Path("run.trec")});
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_EQ(ok.out, "") << "-o: nothing on stdout";
  ExpectSameHits(ParseTrec(ReadFile(Path("run.trec")), "run-7"),
                 LibraryTopK(corpus2, queries, 12, MAXSIM_METRIC_DOT, MAXSIM_MODE_EXACT, qids), "trec");
  // Bad query-id files name the line.
  WriteBytes(Path("qbad.txt"), "a\nb\n");
  CliResult few = Run({"search", corpus, qt, qo, "--query-ids", Path("qbad.txt")});
  EXPECT_EQ(few.code, 1);
  EXPECT_NE(few.err.find("has 2 ids (lines) but there are 3 queries"), std::string::npos) << few.err;
  WriteBytes(Path("qbad.txt"), "a\n\tb\nc\n");
  CliResult tab = Run({"search", corpus, qt, qo, "--query-ids", Path("qbad.txt")});
  EXPECT_NE(tab.err.find("qbad.txt:2"), std::string::npos) << tab.err;
  EXPECT_EQ(Run({"search", corpus, qt, qo, "--tag", "a b", "--format", "trec"}).code, 2);
}

TEST_F(Retrieval, PaddedQueriesWithMasksMatchTheOffsetsForm) {
  std::mt19937_64 rng(42);
  TokenSets docs = Generate(rng, Shape::kUnitGaussian, 15, 1, 20, 32);
  docs.Encode(MAXSIM_F32);
  const std::string corpus = PackWithIds(docs, [] {
    std::vector<std::string> v;
    for (int j = 0; j < 15; ++j) v.push_back("doc" + std::to_string(j));
    return v;
  }(), "docs");
  TokenSets queries = Generate(rng, Shape::kUnitGaussian, 4, 3, 8, 32);
  queries.offsets = {0, 3, 8, 12, 16};  // lengths 3, 5, 4, 4: padded to L = 6 below
  queries.values.resize(16 * 32);
  queries.Encode(MAXSIM_F32);
  const auto [qt, qo] = WriteSets(queries, "q");
  const uint64_t n = 4, L = 6, d = 32;
  npy::Array padded;
  padded.dtype = npy::Dtype::kF32;
  padded.shape = {n, L, d};
  std::vector<float> pv(n * L * d, 0.0f);
  std::vector<uint8_t> mask(n * L, 0);
  for (uint64_t i = 0; i < n; ++i) {
    for (uint64_t t = 0; t < queries.length(i); ++t) {
      std::memcpy(&pv[(i * L + t) * d], queries.row(queries.offsets[i] + t), d * 4);
      mask[i * L + t] = 1;
    }
    // Padding rows hold junk, as a model's would: the mask alone must keep them out.
    for (uint64_t t = queries.length(i); t < L; ++t) pv[(i * L + t) * d] = 3.0f;
  }
  padded.data.assign(reinterpret_cast<uint8_t*>(pv.data()), reinterpret_cast<uint8_t*>(pv.data()) + pv.size() * 4);
  ASSERT_EQ(npy::Write(Path("padded.npy"), padded), "");
  auto write_mask = [&](const std::string& name, npy::Dtype dtype, std::vector<uint64_t> shape, int64_t poke) {
    npy::Array m;
    m.dtype = dtype;
    m.shape = std::move(shape);
    const size_t w = npy::DtypeSize(dtype);
    m.data.assign(mask.size() * w, 0);
    for (size_t i = 0; i < mask.size(); ++i) m.data[i * w] = mask[i];
    if (poke != 0) std::memcpy(m.data.data() + 9 * w, &poke, w);  // element [1, 3]
    EXPECT_EQ(npy::Write(Path(name), m), "");
    return Path(name);
  };
  for (const char* metric : {"dot", "cosine"}) {
    const std::string want = Run({"search", corpus, qt, qo, "-k", "15", "--metric", metric}).out;
    ASSERT_FALSE(want.empty());
    for (npy::Dtype dt : {npy::Dtype::kU8, npy::Dtype::kI64, npy::Dtype::kI32}) {
      const std::string m = write_mask("mask.npy", dt, {n, L}, 0);
      CliResult r = Run({"search", corpus, Path("padded.npy"), "--query-mask", m, "-k", "15", "--metric", metric,
                         "--mode", "certified"});
      ASSERT_EQ(r.code, 0) << r.err;
      EXPECT_EQ(r.out, want) << metric << " mask dtype " << npy::DtypeName(dt);
    }
  }
  // A NumPy bool mask ('|b1') is read as such.
  std::string bool_mask = ReadFile(write_mask("bool.npy", npy::Dtype::kU8, {n, L}, 0));
  const size_t at = bool_mask.find("|u1");
  ASSERT_NE(at, std::string::npos);
  bool_mask.replace(at, 3, "|b1");
  WriteBytes(Path("bool.npy"), bool_mask);
  EXPECT_EQ(Run({"search", corpus, Path("padded.npy"), "--query-mask", Path("bool.npy"), "-k", "15"}).out,
            Run({"search", corpus, qt, qo, "-k", "15"}).out);
  // A mask on the offsets form drops those tokens: the same as leaving them out.
  TokenSets fewer = queries;
  fewer.values.erase(fewer.values.begin() + 4 * 32, fewer.values.begin() + 5 * 32);  // row 4: query 1's token 1
  fewer.offsets = {0, 3, 7, 11, 15};
  fewer.Encode(MAXSIM_F32);
  const auto [ft, fo] = WriteSets(fewer, "fewer");
  npy::Array flat;
  flat.dtype = npy::Dtype::kU8;
  flat.shape = {16};
  flat.data.assign(16, 1);
  flat.data[4] = 0;
  ASSERT_EQ(npy::Write(Path("flat.npy"), flat), "");
  EXPECT_EQ(Run({"search", corpus, qt, qo, "--query-mask", Path("flat.npy"), "-k", "15"}).out,
            Run({"search", corpus, ft, fo, "-k", "15"}).out);
  // Mistakes name the file and the element.
  auto expect_error = [&](const std::vector<std::string>& args, const std::vector<std::string>& fragments) {
    CliResult r = Run(args);
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_EQ(r.out, "");
    for (const std::string& f : fragments) EXPECT_NE(r.err.find(f), std::string::npos) << r.err;
  };
  expect_error({"search", corpus, Path("padded.npy"), "--query-mask", write_mask("m2.npy", npy::Dtype::kU8, {n, L}, 2)},
               {"m2.npy", "mask[1, 3] is 2", "0 (padding) or 1"});
  expect_error({"search", corpus, Path("padded.npy"), "--query-mask", write_mask("m3.npy", npy::Dtype::kI64, {n, L}, -1)},
               {"mask[1, 3] is -1"});
  expect_error({"search", corpus, Path("padded.npy"), "--query-mask", write_mask("m4.npy", npy::Dtype::kU8, {n * L}, 0)},
               {"m4.npy", "shape is [24]", "need [4, 6]"});
  expect_error({"search", corpus, Path("padded.npy"), "--query-mask", qt}, {"float32"});
  expect_error({"search", corpus, Path("padded.npy"), qo}, {"take no offsets file", "--query-mask"});
}

TEST_F(Retrieval, ShardsGiveTheSingleCorpusRunAndMergeAgrees) {
  std::mt19937_64 rng(43);
  TokenSets docs = Generate(rng, Shape::kClustered, 30, 0, 14, 40);
  // Exact ties across shards: documents 17 and 26 are copies of document `base` (the first non-empty one).
  uint64_t base = 0;
  while (docs.length(base) == 0) ++base;
  ASSERT_LT(base, 10u);
  TokenSets copy;
  copy.dim = docs.dim;
  copy.offsets.push_back(0);
  for (uint64_t j = 0; j < 30; ++j) {
    const uint64_t src = (j == 17 || j == 26) ? base : j;
    copy.values.insert(copy.values.end(), docs.row(docs.offsets[src]), docs.row(docs.offsets[src + 1]));
    copy.offsets.push_back(copy.values.size() / docs.dim);
  }
  copy.Encode(MAXSIM_F32);
  // Queries: one equal to document `base` (so the three copies tie at the top) and some others.
  TokenSets queries = Slice(copy, base, base + 1);
  TokenSets more = Generate(rng, Shape::kClustered, 3, 1, 5, 40);
  for (uint64_t i = 0; i < 3; ++i) {
    queries.values.insert(queries.values.end(), more.row(more.offsets[i]), more.row(more.offsets[i + 1]));
    queries.offsets.push_back(queries.values.size() / 40);
  }
  queries.Encode(MAXSIM_F32);
  const auto [qt, qo] = WriteSets(queries, "q");
  std::vector<std::string> ids;
  for (int j = 0; j < 30; ++j) ids.push_back("doc-" + std::to_string(j));
  const std::string one = PackWithIds(copy, ids, "all");
  const uint64_t cut[4] = {0, 10, 20, 30};
  std::vector<std::string> shards;
  for (int s = 0; s < 3; ++s) {
    shards.push_back(PackWithIds(Slice(copy, cut[s], cut[s + 1]),
                                 std::vector<std::string>(ids.begin() + cut[s], ids.begin() + cut[s + 1]),
                                 "shard" + std::to_string(s)));
  }
  for (const std::string k : {"1", "3", "7", "30", "50"}) {
    for (const std::string format : {"trec", "tsv", "jsonl", "text"}) {
      std::vector<std::string> args = {"search", one, qt, qo, "-k", k, "--format", format, "--mode", "certified"};
      const CliResult single = Run(args);
      ASSERT_EQ(single.code, 0) << single.err;
      args.erase(args.begin() + 1);
      args.insert(args.begin() + 1, shards.begin(), shards.end());
      const CliResult sharded = Run(args);
      ASSERT_EQ(sharded.code, 0) << sharded.err;
      EXPECT_EQ(sharded.out, single.out) << "k " << k << " " << format;
    }
  }
  // The tie: the query equal to document `base` finds it, 17 and 26 with the same score, in document order.
  const std::vector<Hit> top = ParseTsv(Run({"search", shards[0], shards[1], shards[2], qt, qo, "-k", "3"}).out);
  ASSERT_GE(top.size(), 3u);
  EXPECT_EQ(top[0].doc_id, "doc-" + std::to_string(base));
  EXPECT_EQ(top[1].doc_id, "doc-17");
  EXPECT_EQ(top[2].doc_id, "doc-26");
  EXPECT_EQ(top[0].score, top[2].score);
  // JSON: the same results; the corpus member lists the shards.
  const Json js = ParseJsonText(Run({"search", shards[0], shards[1], shards[2], qt, qo, "-k", "7", "--format", "json"}).out);
  ExpectSameHits(HitsOfJson(js), ParseTsv(Run({"search", one, qt, qo, "-k", "7"}).out), "json shards");
  EXPECT_EQ(js["corpus"].items.size(), 3u);
  // merge: the runs of each shard, in shard order, give the single corpus's run (TREC and tsv runs alike).
  for (const std::string format : {"trec", "tsv"}) {
    std::vector<std::string> merge = {"merge", "-k", "7", "--format", "trec"};
    for (int s = 0; s < 3; ++s) {
      const std::string run = Path("s" + std::to_string(s) + "." + format);
      ASSERT_EQ(Run({"search", shards[static_cast<size_t>(s)], qt, qo, "-k", "7", "--format", format, "-o", run}).code, 0);
      merge.push_back(run);
    }
    const CliResult merged = Run(merge);
    ASSERT_EQ(merged.code, 0) << merged.err;
    EXPECT_EQ(merged.out, Run({"search", one, qt, qo, "-k", "7", "--format", "trec"}).out) << format;
    merge.erase(merge.begin() + 1, merge.begin() + 3);  // default depth: the deepest input (7)
    EXPECT_EQ(Run(merge).out, merged.out);
  }
  // merge refuses a document listed twice for a query, and unreadable lines, naming the file and line.
  const std::string s0 = Path("s0.trec");
  CliResult twice = Run({"merge", s0, s0});
  EXPECT_EQ(twice.code, 1);
  EXPECT_NE(twice.err.find("s0.trec:1: query '0' lists document"), std::string::npos) << twice.err;
  WriteBytes(Path("bad.trec"), "0 Q0 doc-1 1 2.5 t\n0 Q0 doc-2 2 nan t\n");
  CliResult nan = Run({"merge", Path("bad.trec")});
  EXPECT_NE(nan.err.find("bad.trec:2: score 'nan' is not a finite number"), std::string::npos) << nan.err;
  WriteBytes(Path("bad.trec"), "0 Q0 doc-1 1 2.5 t\n0 Q0 doc-2 2 2.0\n");
  EXPECT_NE(Run({"merge", Path("bad.trec")}).err.find("bad.trec:2: has 5 fields"), std::string::npos);
  WriteBytes(Path("pairs.tsv"), "0\tdoc-1\n");
  EXPECT_NE(Run({"merge", Path("pairs.tsv")}).err.find("has no score"), std::string::npos);
  // Shards of different dimensions are refused.
  TokenSets other = Generate(rng, Shape::kGaussian, 2, 1, 3, 8);
  other.Encode(MAXSIM_F32);
  const auto [ot, oo] = WriteSets(other, "other");
  ASSERT_EQ(Run({"pack", ot, oo, "-o", Path("other.maxsim")}).code, 0);
  CliResult dims = Run({"search", shards[0], Path("other.maxsim"), qt, qo});
  EXPECT_EQ(dims.code, 1);
  EXPECT_NE(dims.err.find("other.maxsim has dimension 8"), std::string::npos) << dims.err;
}

TEST_F(Retrieval, RerankScoresCandidatesExactlyAndReSortsThem) {
  std::mt19937_64 rng(44);
  TokenSets docs = Generate(rng, Shape::kClustered, 25, 0, 16, 48);
  docs.Encode(MAXSIM_F32);
  TokenSets queries = Generate(rng, Shape::kClustered, 4, 2, 6, 48);
  queries.Encode(MAXSIM_F32);
  std::vector<std::string> ids;
  for (int j = 0; j < 25; ++j) ids.push_back("p" + std::to_string(j));
  const std::string corpus = PackWithIds(docs, ids, "docs");
  const auto [qt, qo] = WriteSets(queries, "q");
  WriteBytes(Path("qids.txt"), "alpha\nbeta\ngamma\ndelta\n");
  const std::vector<std::string> common = {"--query-ids", Path("qids.txt"), "--format", "trec"};
  auto with = [&](std::vector<std::string> a) {
    a.insert(a.end(), common.begin(), common.end());
    return a;
  };
  // Every document as a candidate, in reverse order, as query_id/doc_id pairs: the full exact ranking.
  std::string pairs;
  for (const char* q : {"alpha", "beta", "gamma", "delta"}) {
    for (int j = 24; j >= 0; --j) pairs += std::string(q) + "\tp" + std::to_string(j) + "\n";
  }
  WriteBytes(Path("all.tsv"), pairs);
  const CliResult full = Run(with({"search", corpus, qt, qo, "-k", "25"}));
  ASSERT_EQ(full.code, 0) << full.err;
  const CliResult all = Run(with({"rerank", corpus, qt, qo, "-c", Path("all.tsv")}));
  ASSERT_EQ(all.code, 0) << all.err;
  EXPECT_EQ(all.out, full.out);
  // Candidates from an approximate run: reranked exactly, they are the exact ranking restricted to them.
  ASSERT_EQ(Run(with({"search", corpus, qt, qo, "-k", "6", "--mode", "approximate", "-o", Path("approx.trec")})).code, 0);
  const std::vector<Hit> cands = ParseTrec(ReadFile(Path("approx.trec")));
  for (const std::string mode : {"exact", "certified"}) {
    const CliResult re = Run(with({"rerank", corpus, qt, qo, "-c", Path("approx.trec"), "--mode", mode}));
    ASSERT_EQ(re.code, 0) << re.err;
    std::vector<Hit> want;
    for (const Hit& h : ParseTrec(full.out)) {
      const bool listed = std::any_of(cands.begin(), cands.end(), [&](const Hit& c) {
        return c.query_id == h.query_id && c.doc_id == h.doc_id;
      });
      if (listed) want.push_back(h);
    }
    std::map<std::string, uint64_t> rank;
    for (Hit& h : want) h.rank = ++rank[h.query_id];
    ExpectSameHits(ParseTrec(re.out), want, "rerank " + mode);
  }
  // -k keeps the best; a query without candidates is left out; any output format.
  WriteBytes(Path("two.tsv"), "gamma\tp3\ngamma\tp9\ngamma\tp1\nalpha\tp0\n");
  const CliResult two = Run({"rerank", corpus, qt, qo, "-c", Path("two.tsv"), "--query-ids", Path("qids.txt"), "-k",
                             "2", "--format", "jsonl"});
  ASSERT_EQ(two.code, 0) << two.err;
  const std::vector<Hit> h2 = HitsOfJsonl(two.out);
  ASSERT_EQ(h2.size(), 3u);
  EXPECT_EQ(h2[0].query_id, "alpha");
  EXPECT_EQ(h2[1].query_id, "gamma");
  EXPECT_EQ(h2[2].query_id, "gamma");
  // Errors name the file and line.
  auto expect_error = [&](const std::string& content, const std::vector<std::string>& fragments) {
    WriteBytes(Path("c.tsv"), content);
    CliResult r = Run({"rerank", corpus, qt, qo, "-c", Path("c.tsv"), "--query-ids", Path("qids.txt")});
    EXPECT_EQ(r.code, 1) << content;
    EXPECT_EQ(r.out, "");
    for (const std::string& f : fragments) EXPECT_NE(r.err.find(f), std::string::npos) << r.err;
  };
  expect_error("alpha\tp1\nalpha\tnope\n", {"c.tsv:2", "document id 'nope' is not in"});
  expect_error("alpha\tp1\nomega\tp2\n", {"c.tsv:2", "query id 'omega' is not one of the 4 queries"});
  expect_error("alpha\tp1\nbeta\tp1\nalpha\tp1\n", {"c.tsv:3", "lists document 'p1' again (first on line 1)"});
  expect_error("alpha\tp1\tx\n", {"c.tsv:1", "found 3 fields"});
  CliResult none = Run({"rerank", corpus, qt, qo});
  EXPECT_EQ(none.code, 2);
  EXPECT_NE(none.err.find("needs the candidates"), std::string::npos);
  EXPECT_EQ(Run({"rerank", corpus, corpus, qt, qo, "-c", Path("two.tsv")}).code, 2);
}

// A case computed by hand (and with pytrec_eval 0.5.11, which agrees to the last digit). Query q1's documents
// d3 and d1 tie at 2.0: trec_eval ranks ties by document id descending, so d3 (grade 1) comes before d1
// (grade 2) whatever the rank column says.
//   q1: d2 (3.0, unjudged), d3 (2.0, grade 1), d1 (2.0, grade 2), d4; judged relevant: d1 (2), d3 (1); d5 is 0.
//       nDCG@2 = (1 / log2 3) / (2 + 1 / log2 3) = 0.23981246656813146; recall@2 = 1/2; MRR@2 = 1/2;
//       MAP = (1/2 + 2/3) / 2 = 0.58333333333333333
//   q2: d8, d9 (grade 1): nDCG@2 = 1 / log2 3 = 0.63092975357145753; recall@2 = 1; MRR@2 = 1/2; MAP = 1/2
//   q3 (judged, not in the run) and q4 (in the run, not judged) are not scored.
TEST_F(Retrieval, EvalMatchesHandComputedValues) {
  WriteBytes(Path("run.trec"),
             "q1 Q0 d2 1 3.0 t\nq1 Q0 d1 2 2.0 t\nq1 Q0 d3 3 2.0 t\nq1 Q0 d4 4 1.0 t\n"
             "q2 Q0 d8 1 5.0 t\nq2 Q0 d9 2 4.0 t\nq4 Q0 d1 1 1.0 t\n");
  WriteBytes(Path("qrels.txt"), "q1 0 d1 2\nq1 0 d3 1\nq1 0 d5 0\nq2 0 d9 1\nq3 0 x 1\n");
  WriteBytes(Path("qrels.tsv"), "query-id\tcorpus-id\tscore\nq1\td1\t2\nq1\td3\t1\nq1\td5\t0\nq2\td9\t1\nq3\tx\t1\n");
  const double want[2][4] = {{0.23981246656813146, 0.5, 0.5, 0.58333333333333333},
                             {0.63092975357145753, 1.0, 0.5, 0.5}};
  for (const char* qrels : {"qrels.txt", "qrels.tsv"}) {
    CliResult r = Run({"eval", Path("run.trec"), Path(qrels), "-k", "2", "--format", "json"});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.err.find("1 of the run's queries have no judgements and 1 judged queries are not in the run"),
              std::string::npos) << r.err;
    const Json j = ParseJsonText(r.out);
    ASSERT_EQ(j["queries"].items.size(), 2u);
    const char* names[4] = {"ndcg@2", "recall@2", "mrr@2", "map"};
    for (int q = 0; q < 2; ++q) {
      EXPECT_EQ(j["queries"].items[static_cast<size_t>(q)]["query_id"].text, q == 0 ? "q1" : "q2");
      for (int m = 0; m < 4; ++m) {
        EXPECT_NEAR(j["queries"].items[static_cast<size_t>(q)][names[m]].number, want[q][m], 1e-15) << q << names[m];
      }
    }
    for (int m = 0; m < 4; ++m) {
      EXPECT_NEAR(j["mean"][names[m]].number, (want[0][m] + want[1][m]) / 2, 1e-15) << names[m];
    }
    EXPECT_EQ(j["mean"]["queries"].number, 2);
  }
  // k = 1: q1's top document is unjudged, q2's is not relevant.
  CliResult k1 = Run({"eval", Path("run.trec"), Path("qrels.txt"), "-k", "1", "--format", "tsv"});
  ASSERT_EQ(k1.code, 0) << k1.err;
  EXPECT_EQ(k1.out, "query_id\tndcg@1\trecall@1\tmrr@1\tmap\n"
                    "q1\t0\t0\t0\t0.58333333333333326\nq2\t0\t0\t0\t0.5\nall\t0\t0\t0\t0.54166666666666663\n");
  CliResult text = Run({"eval", Path("run.trec"), Path("qrels.txt"), "-k", "2"});
  EXPECT_NE(text.out.find("0.4354     0.7500     0.5000     0.5417\n"), std::string::npos) << text.out;
  EXPECT_EQ(text.out.rfind("all ", std::string::npos), text.out.find("all ")) << "one mean row";
  // Bad inputs name the file and line.
  auto expect_error = [&](const std::string& run, const std::string& qrels, const std::string& fragment) {
    WriteBytes(Path("r.trec"), run);
    WriteBytes(Path("q.txt"), qrels);
    CliResult r = Run({"eval", Path("r.trec"), Path("q.txt")});
    EXPECT_EQ(r.code, 1) << run << qrels;
    EXPECT_EQ(r.out, "");
    EXPECT_NE(r.err.find(fragment), std::string::npos) << r.err;
  };
  const std::string good_qrels = "q1 0 d1 1\n";
  expect_error("q1 Q0 d1 1 1.0 t\nq1 Q0 d1 2 0.5 t\n", good_qrels, "r.trec:2: query 'q1' lists document 'd1' twice");
  expect_error("q1 Q0 d1 1 inf t\n", good_qrels, "r.trec:1: score 'inf'");
  expect_error("q1 Q0 d1 x 1.0 t\n", good_qrels, "r.trec:1: rank 'x' is not an unsigned integer");
  expect_error("q1 Q0 d1 1 1.0 t\n", "q1 0 d1 1\nq1 0 d2 high\n", "q.txt:2: relevance grade 'high'");
  expect_error("q1 Q0 d1 1 1.0 t\n", "q1 0 d1 1\nq1 0 d1 2\n", "q.txt:2: query 'q1' judges document 'd1' a second time");
  expect_error("q1 Q0 d1 1 1.0 t\n", "q1 d1\n", "q.txt:1: expected TREC qrels");
  expect_error("q9 Q0 d1 1 1.0 t\n", good_qrels, "no query id in common");
  EXPECT_NE(Run({"eval", Path("missing.trec"), Path("q.txt")}).err.find("missing.trec: cannot open"),
            std::string::npos);
}

TEST_F(Retrieval, OutputFilesAreReplacedAtomicallyAndNeverOverNonRegularFiles) {
  std::mt19937_64 rng(45);
  TokenSets docs = Generate(rng, Shape::kGaussian, 5, 1, 4, 8);
  docs.Encode(MAXSIM_F32);
  const std::string corpus = PackWithIds(docs, {"a", "b", "c d", "e", "f"}, "docs");
  const auto [qt, qo] = WriteSets(Slice(docs, 0, 2), "q");
  WriteBytes(Path("out.txt"), "previous content\n");
  CliResult ok = Run({"search", corpus, qt, qo, "-o", Path("out.txt"), "-k", "2"});
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_EQ(ReadFile(Path("out.txt")).substr(0, 8), "query_id");
  const std::string before = ReadFile(Path("out.txt"));
  CliResult bad = Run({"search", corpus, qt, qo, "-o", Path("out.txt"), "-k", "5", "--format", "trec"});
  EXPECT_EQ(bad.code, 1);
  EXPECT_EQ(ReadFile(Path("out.txt")), before) << "a failed command leaves the old file as it was";
  ASSERT_EQ(mkdir(Path("adir").c_str(), 0755), 0);
  CliResult dir = Run({"search", corpus, qt, qo, "-o", Path("adir")});
  EXPECT_EQ(dir.code, 1);
  EXPECT_NE(dir.err.find("adir exists and is a directory, not a regular file"), std::string::npos) << dir.err;
  ASSERT_EQ(mkfifo(Path("fifo").c_str(), 0644), 0);
  CliResult fifo = Run({"search", corpus, qt, qo, "-o", Path("fifo")});
  EXPECT_EQ(fifo.code, 1);
  EXPECT_NE(fifo.err.find("fifo exists and is a FIFO (named pipe), not a regular file"), std::string::npos) << fifo.err;
  // No temporary files are left behind.
  DIR* d = opendir(dir_.c_str());
  ASSERT_NE(d, nullptr);
  while (dirent* e = readdir(d)) EXPECT_EQ(std::string(e->d_name).find(".tmp-"), std::string::npos) << e->d_name;
  closedir(d);
}

TEST_F(Retrieval, VerboseShowsTheLibraryLogAndQuietOnlyResults) {
  CliResult v = Run({"info", "-v", "--backend", "cpu"});
  ASSERT_EQ(v.code, 0) << v.err;
  EXPECT_NE(v.err.find("libmaxsim info: backend:"), std::string::npos) << v.err;
  EXPECT_EQ(Run({"info", "--backend", "cpu"}).err, "") << "no log without -v";
  std::mt19937_64 rng(46);
  TokenSets docs = Generate(rng, Shape::kGaussian, 3, 1, 4, 8);
  docs.Encode(MAXSIM_F32);
  const auto [t, o] = WriteSets(docs, "d");
  CliResult quiet = Run({"pack", t, o, "-o", Path("q.maxsim"), "--quiet"});
  ASSERT_EQ(quiet.code, 0) << quiet.err;
  EXPECT_EQ(quiet.out, "");
  EXPECT_EQ(quiet.err, "");
  EXPECT_NE(Run({"pack", t, o, "-o", Path("q.maxsim")}).out.find("packed 3 sets"), std::string::npos);
  // --progress on a log (not a terminal): whole lines, each step ending with a last line; never with --quiet.
  CliResult progress = Run({"pack", t, o, "-o", Path("q.maxsim"), "--progress"});
  ASSERT_EQ(progress.code, 0) << progress.err;
  // Packing is counted by the library's progress callback: the last line has the percentage and the rate.
  const std::string rows = std::to_string(docs.rows());
  EXPECT_NE(progress.err.find("packing [##############################] 100%  " + rows + "/" + rows + " vectors"),
            std::string::npos) << progress.err;
  EXPECT_NE(progress.err.find(" vectors/s  in "), std::string::npos) << progress.err;
  EXPECT_NE(progress.err.find("(done)\n"), std::string::npos) << progress.err;
  EXPECT_EQ(progress.err.find('\r'), std::string::npos) << "no terminal redraws in a log";
  EXPECT_EQ(Run({"pack", t, o, "-o", Path("q.maxsim"), "--progress", "--quiet"}).err, "");
}

// ---- the shipped real data: one corpus and three shards with string ids, a TREC run, eval against the qrels ----

// Expected values: pytrec_eval-terrier 0.5.11 (trec_eval's code) and ir-measures 0.4.3 on the TREC run this test
// writes, computed once in a scratch venv (`python3 -m venv v && v/bin/pip install pytrec-eval-terrier
// ir-measures`) with RelevanceEvaluator(qrels, {'ndcg_cut.10', 'recall.10', 'recip_rank', 'map'}) over the BEIR
// qrels and the run's scores; ir_measures.calc_aggregate([nDCG@10, R@10, RR@10, AP]) gave the same means.
TEST_F(Retrieval, RealDataShardsWithStringIdsGiveOneTrecRunThatEvalScores) {
  const std::string data = SharedDataDir();
  if (data.empty()) {
    GTEST_SKIP() << "../shared/data/colbert-nanofiqa not found next to the source tree (set MAXSIM_SHARED_DIR to the "
                    "folder holding data/colbert-nanofiqa to run this test)";
  }
  TokenSets q, d;
  std::vector<std::string> qids, dids;
  std::string error;
  ASSERT_TRUE(LoadNanoFiqa(&q, &d, &qids, &dids, &error)) << error;
  const std::string one = Path("fiqa.maxsim");
  ASSERT_EQ(Run({"pack", data + "/docs_tokens.npy", data + "/docs_offsets.npy", "--ids", data + "/docs_ids.txt", "-o",
                 one}).code, 0);
  d.Encode(MAXSIM_F32);
  const uint64_t cut[4] = {0, 12, 20, 35};
  std::vector<std::string> search_shards = {"search"};
  for (int s = 0; s < 3; ++s) {
    search_shards.push_back(PackWithIds(Slice(d, cut[s], cut[s + 1]),
                                        std::vector<std::string>(dids.begin() + cut[s], dids.begin() + cut[s + 1]),
                                        "fiqa" + std::to_string(s)));
  }
  const std::vector<std::string> tail = {data + "/queries_tokens.npy", data + "/queries_offsets.npy", "--query-ids",
                                         data + "/queries_ids.txt", "-k", "35", "--format", "trec"};
  std::vector<std::string> single = {"search", one};
  single.insert(single.end(), tail.begin(), tail.end());
  single.insert(single.end(), {"-o", Path("run.trec")});
  ASSERT_EQ(Run(single).code, 0);
  search_shards.insert(search_shards.end(), tail.begin(), tail.end());
  search_shards.insert(search_shards.end(), {"--mode", "certified"});
  const CliResult sharded = Run(search_shards);
  ASSERT_EQ(sharded.code, 0) << sharded.err;
  const std::string run = ReadFile(Path("run.trec"));
  EXPECT_EQ(sharded.out, run) << "three shards (certified) == one corpus (exact), byte for byte";
  ASSERT_EQ(ParseTrec(run).size(), 5u * 35u);
  EXPECT_EQ(run.substr(0, 32), "10447 Q0 382236 1 16.8428478 max");
  // The merge of the shards' runs is the same run too.
  std::vector<std::string> merge = {"merge", "--format", "trec", "-k", "35"};
  for (int s = 0; s < 3; ++s) {
    std::vector<std::string> a = {"search", search_shards[static_cast<size_t>(s) + 1]};
    a.insert(a.end(), tail.begin(), tail.end());
    a.insert(a.end(), {"-o", Path("part" + std::to_string(s) + ".trec")});
    ASSERT_EQ(Run(a).code, 0);
    merge.push_back(Path("part" + std::to_string(s) + ".trec"));
  }
  EXPECT_EQ(Run(merge).out, run);

  CliResult ev = Run({"eval", Path("run.trec"), data + "/qrels.tsv", "-k", "10", "--format", "json"});
  ASSERT_EQ(ev.code, 0) << ev.err;
  EXPECT_EQ(ev.err, "") << "every query is judged and in the run";
  const Json j = ParseJsonText(ev.out);
  struct Row {
    const char* qid;
    double ndcg, recall, mrr, map;
  };
  const Row want[5] = {
      {"10447", 1.0, 1.0, 1.0, 1.0},
      {"11039", 0.9098999913476323, 0.875, 1.0, 0.9003413865546218},
      {"1736", 0.9182162519778518, 1.0, 1.0, 0.7961904761904762},
      {"2296", 0.9230390249121355, 0.8888888888888888, 1.0, 0.9500000000000001},
      {"2348", 0.9305687780632227, 0.9, 1.0, 0.9377124183006537},
  };
  ASSERT_EQ(j["queries"].items.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    const Json& r = j["queries"].items[i];
    EXPECT_EQ(r["query_id"].text, want[i].qid);
    EXPECT_NEAR(r["ndcg@10"].number, want[i].ndcg, 1e-12) << want[i].qid;
    EXPECT_NEAR(r["recall@10"].number, want[i].recall, 1e-12) << want[i].qid;
    EXPECT_NEAR(r["mrr@10"].number, want[i].mrr, 1e-12) << want[i].qid;
    EXPECT_NEAR(r["map"].number, want[i].map, 1e-12) << want[i].qid;
  }
  EXPECT_NEAR(j["mean"]["ndcg@10"].number, 0.9363448092601685, 1e-12);
  EXPECT_NEAR(j["mean"]["recall@10"].number, 0.9327777777777777, 1e-12);
  EXPECT_NEAR(j["mean"]["mrr@10"].number, 1.0, 1e-12);
  EXPECT_NEAR(j["mean"]["map"].number, 0.9168488562091504, 1e-12);
  // k = 5 (pytrec_eval: ndcg_cut_5 0.9368703095040971, recall_5 0.6561111111111112).
  const Json j5 = ParseJsonText(Run({"eval", Path("run.trec"), data + "/qrels.tsv", "-k", "5", "--format", "json"}).out);
  EXPECT_NEAR(j5["mean"]["ndcg@5"].number, 0.9368703095040971, 1e-12);
  EXPECT_NEAR(j5["mean"]["recall@5"].number, 0.6561111111111112, 1e-12);
}

}  // namespace
}  // namespace maxsim::test
