// SPDX-License-Identifier: Apache-2.0
#include "runs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>

#include "cli.h"
#include "regular_file.h"
#include "string_id.h"

namespace maxsim::cli {
namespace {

std::string Where(const std::string& path, uint64_t line) { return path + ":" + std::to_string(line); }

std::vector<std::string> SplitTabs(const std::string& s) {
  std::vector<std::string> f;
  size_t b = 0;
  for (;;) {
    const size_t e = s.find('\t', b);
    f.push_back(s.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) return f;
    b = e + 1;
  }
}

std::vector<std::string> SplitSpace(const std::string& s) {
  std::vector<std::string> f;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    const size_t b = i;
    while (i < s.size() && !std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    if (i > b) f.push_back(s.substr(b, i - b));
  }
  return f;
}

// A line's fields: tab-separated if it holds a tab, else whitespace-separated; none for a blank line.
std::vector<std::string> Fields(const std::string& text, bool* tabs) {
  if (text.find_first_not_of(" \t") == std::string::npos) return {};
  *tabs = text.find('\t') != std::string::npos;
  return *tabs ? SplitTabs(text) : SplitSpace(text);
}

bool HasSpace(const std::string& s) {
  for (unsigned char c : s) {
    if (std::isspace(c)) return true;
  }
  return false;
}

void CheckId(const std::string& id, const std::string& what, const std::string& where) {
  if (const char* problem = pack::StringIdProblem(id.data(), id.size())) {
    throw Failure(where + ": " + what + " '" + id + "' " + problem);
  }
}

float ParseScore(const std::string& s, const std::string& where) {
  char* end = nullptr;
  errno = 0;
  const float v = std::strtof(s.c_str(), &end);
  if (s.empty() || *end != '\0' || std::isnan(v) || v == INFINITY || (errno == ERANGE && std::isfinite(v) && v != 0)) {
    throw Failure(where + ": score '" + s + "' is not a finite number (or -inf, an empty document)");
  }
  return v;
}

uint64_t ParseUnsigned(const std::string& s, const char* what, const std::string& where) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (s.empty() || s[0] == '-' || s[0] == '+' || *end != '\0' || errno == ERANGE) {
    throw Failure(where + ": " + what + " '" + s + "' is not an unsigned integer");
  }
  return v;
}

// -inf is an empty document; any other non-finite score (none comes from a validated corpus; a FAST-trusted one
// may hold anything) is null too, never a bare nan/inf, which is not JSON.
std::string JsonScore(float s) {
  if (s == -std::numeric_limits<float>::infinity()) return "null, \"empty\": true";
  return std::isfinite(s) ? FloatText(s) : "null";
}

std::string JsonIndex(uint64_t i) { return i == kNoIndex ? "null" : std::to_string(i); }

}  // namespace

bool RanksBefore(float score_a, uint64_t key_a, float score_b, uint64_t key_b) {
  if (score_a != score_b) return score_a > score_b;
  return key_a < key_b;
}

const std::vector<std::string>& FormatNames() {
  static const std::vector<std::string> names = {"text", "tsv", "json", "jsonl", "trec"};
  return names;
}

Format ParseFormat(const std::string& name) {
  const auto& n = FormatNames();
  for (size_t i = 0; i < n.size(); ++i) {
    if (n[i] == name) return static_cast<Format>(i);
  }
  throw UsageError("--format '" + name + "' is not one of text|tsv|json|jsonl|trec");
}

std::string FormatRun(const Run& run, Format format, const std::string& trec_tag,
                      const std::vector<std::string>& json_fields) {
  std::string out;
  if (format == Format::kTsv) out = "query_id\trank\tdoc_id\tscore\n";
  if (format == Format::kJson) {
    out = "{";
    for (const std::string& f : json_fields) out += f + ", ";
    out += "\"results\": [";
  }
  bool first_query = true;
  for (const QueryHits& q : run) {
    switch (format) {
      case Format::kText:
        out += "query " + q.query_id + ": " + std::to_string(q.hits.size()) + (q.hits.size() == 1 ? " hit\n" : " hits\n");
        break;
      case Format::kJson:
        out += std::string(first_query ? "\n  " : ",\n  ") + "{\"query_id\": \"" + JsonEscape(q.query_id) +
               "\", \"query\": " + JsonIndex(q.query) + ", \"hits\": [";
        break;
      case Format::kTrec:
        if (HasSpace(q.query_id)) {
          throw Failure("query id '" + q.query_id + "' contains whitespace, which a TREC run cannot hold (its fields "
                        "are whitespace-separated): use --format tsv or jsonl");
        }
        break;
      default: break;
    }
    first_query = false;
    for (size_t r = 0; r < q.hits.size(); ++r) {
      const RunHit& h = q.hits[r];
      const std::string rank = std::to_string(r + 1);
      switch (format) {
        case Format::kText: {
          char line[96];
          std::snprintf(line, sizeof(line), "  %4s  %-15s  ", rank.c_str(), FloatText(h.score).c_str());
          out += line + h.doc_id + "\n";
          break;
        }
        case Format::kTsv:
          out += q.query_id + "\t" + rank + "\t" + h.doc_id + "\t" + FloatText(h.score) + "\n";
          break;
        case Format::kJson:
          out += std::string(r ? ", " : "") + "{\"rank\": " + rank + ", \"doc_id\": \"" + JsonEscape(h.doc_id) +
                 "\", \"doc\": " + JsonIndex(h.doc) + ", \"score\": " + JsonScore(h.score) + "}";
          break;
        case Format::kJsonl:
          out += "{\"query_id\": \"" + JsonEscape(q.query_id) + "\", \"query\": " + JsonIndex(q.query) +
                 ", \"rank\": " + rank + ", \"doc_id\": \"" + JsonEscape(h.doc_id) + "\", \"doc\": " +
                 JsonIndex(h.doc) + ", \"score\": " + JsonScore(h.score) + "}\n";
          break;
        case Format::kTrec:
          if (HasSpace(h.doc_id)) {
            throw Failure("document id '" + h.doc_id + "' contains whitespace, which a TREC run cannot hold (its "
                          "fields are whitespace-separated): use --format tsv or jsonl");
          }
          out += q.query_id + " Q0 " + h.doc_id + " " + rank + " " + FloatText(h.score) + " " + trec_tag + "\n";
          break;
      }
    }
    if (format == Format::kJson) out += "]}";
  }
  if (format == Format::kJson) out += "\n]}\n";
  return out;
}

void WriteOutput(const std::string& path, const std::string& text) {
  if (path.empty() || path == "-") {
    if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0) {
      throw Failure("writing the results to stdout failed: " + std::string(std::strerror(errno)));
    }
    return;
  }
  const std::string error = file::WriteAtomically(path, {{text.data(), text.size()}});
  if (!error.empty()) throw Failure(error + " (nothing was written)");
}

std::vector<RunLine> ReadRunFile(const std::string& path, bool need_scores) {
  const std::vector<std::string> lines = ReadLines(path);
  std::vector<RunLine> out;
  enum { kUnknown, kTrec, kTsv4, kTsv2 } kind = kUnknown;
  for (size_t n = 0; n < lines.size(); ++n) {
    const std::string& text = lines[n];
    const std::string where = Where(path, n + 1);
    bool tabs = false;
    const std::vector<std::string> f = Fields(text, &tabs);
    if (f.empty()) continue;
    if (kind == kUnknown) {
      if (!tabs && f.size() == 6) {
        kind = kTrec;
      } else if (tabs && (f.size() == 4 || f.size() == 2)) {
        kind = f.size() == 4 ? kTsv4 : kTsv2;
        if (f[0] == "query_id" || f[0] == "qid" || f[0] == "query-id") continue;  // header
      } else {
        throw Failure(where + ": expected a TREC run line (qid Q0 docid rank score tag), a tab-separated "
                      "query_id/rank/doc_id/score line or a tab-separated query_id/doc_id pair; found " +
                      std::to_string(f.size()) + " fields");
      }
    }
    const size_t want = kind == kTrec ? 6 : kind == kTsv4 ? 4 : 2;
    if (f.size() != want || (kind != kTrec && !tabs)) {
      throw Failure(where + ": has " + std::to_string(f.size()) + " fields, but the file's first line has " +
                    std::to_string(want) + (kind == kTrec ? " (whitespace-separated)" : " (tab-separated)"));
    }
    RunLine r;
    r.line = n + 1;
    r.query_id = f[0];
    r.doc_id = kind == kTrec ? f[2] : kind == kTsv4 ? f[2] : f[1];
    CheckId(r.query_id, "query id", where);
    CheckId(r.doc_id, "document id", where);
    if (kind != kTsv2) {
      r.rank = ParseUnsigned(kind == kTrec ? f[3] : f[1], "rank", where);
      r.score = ParseScore(kind == kTrec ? f[4] : f[3], where);
      r.has_score = true;
    } else if (need_scores) {
      throw Failure(where + ": has no score (a query_id/doc_id pair); this command needs a run with scores");
    }
    out.push_back(std::move(r));
  }
  return out;
}

Qrels ReadQrels(const std::string& path) {
  const std::vector<std::string> lines = ReadLines(path);
  Qrels q;
  bool first = true;
  for (size_t n = 0; n < lines.size(); ++n) {
    const std::string& text = lines[n];
    const std::string where = Where(path, n + 1);
    bool tabs = false;
    const std::vector<std::string> f = Fields(text, &tabs);
    if (f.empty()) continue;
    std::string qid, did, grade;
    if (tabs && f.size() == 3) {  // BEIR: query-id, corpus-id, score
      qid = f[0], did = f[1], grade = f[2];
    } else if (f.size() == 4) {  // TREC: qid, iteration, docid, grade
      qid = f[0], did = f[2], grade = f[3];
    } else {
      throw Failure(where + ": expected TREC qrels (qid 0 docid grade) or BEIR tsv (query-id, corpus-id, score); "
                    "found " + std::to_string(f.size()) + " fields");
    }
    char* end = nullptr;
    errno = 0;
    const long long g = std::strtoll(grade.c_str(), &end, 10);
    if (grade.empty() || *end != '\0' || errno == ERANGE) {
      if (first) {  // a header line ("query-id corpus-id score")
        first = false;
        continue;
      }
      throw Failure(where + ": relevance grade '" + grade + "' is not an integer");
    }
    first = false;
    CheckId(qid, "query id", where);
    CheckId(did, "document id", where);
    auto& docs = q[qid];
    if (!docs.emplace(did, g).second) {
      throw Failure(where + ": query '" + qid + "' judges document '" + did + "' a second time");
    }
  }
  return q;
}

}  // namespace maxsim::cli
