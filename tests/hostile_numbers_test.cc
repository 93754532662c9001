// SPDX-License-Identifier: Apache-2.0
// Every public C entry point with hostile numbers in every integer option and argument (0, -1, 1, huge,
// INT_MAX, INT_MIN, SIZE_MAX, values just past a limit): each call returns a status, nothing crashes, and nothing
// is printed (stdout and stderr are captured around the calls). Counts are hostile only where the library can
// tell they are impossible (an overflow, a range, a size no memory can hold): a count that merely exceeds the
// memory the caller actually passed is the caller's promise, which no C API can check.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <iterator>
#include <vector>

#include "maxsim/maxsim.h"

namespace {

const int32_t kInts[] = {0, -1, 1, 2, 3, 4097, 65536, 65537, INT32_MAX, INT32_MIN};
// Enum fields: a negative value is outside the range of the library's enums in C++ (0 .. 0x7FFFFFFF), so a C++
// caller cannot even pass one without undefined behaviour (UBSan's enum check); C callers' values are read as
// plain integers by the library (RawEnum).
const int32_t kEnumValues[] = {0, 1, 2, 3, 4, 12, 4097, 65537, INT32_MAX};
const uint64_t kCounts[] = {0, 1, UINT32_MAX, static_cast<uint64_t>(INT32_MAX), UINT64_MAX, UINT64_MAX / 2,
                            UINT64_MAX - 1, 1ull << 62, 1ull << 63};
const uint32_t kDims[] = {0, 1, 65536, 65537, UINT32_MAX, static_cast<uint32_t>(INT32_MAX)};

// Redirects stdout and stderr to a file for its lifetime; Text() returns what was written.
class CaptureOutput {
 public:
  CaptureOutput() {
    std::fflush(stdout);
    std::fflush(stderr);
    char tmpl[] = "/tmp/maxsim-capture-XXXXXX";
    fd_ = mkstemp(tmpl);
    path_ = tmpl;
    saved_out_ = dup(1);
    saved_err_ = dup(2);
    dup2(fd_, 1);
    dup2(fd_, 2);
  }
  std::string Text() {
    Restore();
    std::ifstream in(path_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  ~CaptureOutput() {
    Restore();
    unlink(path_.c_str());
  }

 private:
  void Restore() {
    if (saved_out_ < 0) return;
    std::fflush(stdout);
    std::fflush(stderr);
    dup2(saved_out_, 1);
    dup2(saved_err_, 2);
    close(saved_out_);
    close(saved_err_);
    close(fd_);
    saved_out_ = saved_err_ = -1;
  }
  int fd_ = -1, saved_out_ = -1, saved_err_ = -1;
  std::string path_;
};

// Statuses the walk saw, checked after the capture ends (a gtest failure message would itself be a print).
struct Walk {
  std::vector<std::string> problems;
  int calls = 0;
  void Expect(bool ok, const std::string& what) {
    ++calls;
    if (!ok) problems.push_back(what + " (" + maxsim_last_error() + ")");
  }
  void ExpectError(maxsim_status st, const std::string& what) {
    Expect(st != MAXSIM_OK && std::strlen(maxsim_last_error()) > 0, what + " returned " + maxsim_status_name(st));
  }
  void ExpectStatus(maxsim_status st, const std::string& what) {
    Expect(st == MAXSIM_OK || std::strlen(maxsim_last_error()) > 0, what + ": an error without a message");
  }
};

maxsim_dense_sets Dense(const float* data, uint32_t dim, uint64_t n_sets, const uint64_t* offsets,
                        uint64_t set_length) {
  maxsim_dense_sets s{};
  s.struct_size = sizeof(s);
  s.data = data;
  s.dtype = MAXSIM_F32;
  s.dim = dim;
  s.n_sets = n_sets;
  s.offsets = offsets;
  s.set_length = set_length;
  return s;
}

// Bytes the declared rows would span, or UINT64_MAX if that overflows (what the library must refuse).
uint64_t DeclaredBytes(const maxsim_dense_sets& s) {
  const uint64_t stride = s.row_stride ? s.row_stride : s.dim;
  unsigned __int128 rows = static_cast<unsigned __int128>(s.n_sets) * s.set_length;
  unsigned __int128 bytes = rows * stride * 4;
  return bytes > (static_cast<unsigned __int128>(1) << 63) ? UINT64_MAX : static_cast<uint64_t>(bytes);
}

void WalkEverything(Walk& w) {
  for (int32_t v : kEnumValues) w.Expect(maxsim_status_name(static_cast<maxsim_status>(v)) != nullptr, "status_name");
  for (uint64_t i : kCounts) {
    const char* reason = nullptr;
    w.Expect(maxsim_kernel_available(static_cast<size_t>(i), &reason) == 0 || i < maxsim_kernel_count(),
             "kernel_available " + std::to_string(i));
    w.Expect(maxsim_kernel_name(static_cast<size_t>(i)) == nullptr || i < maxsim_kernel_count(), "kernel_name");
  }

  // Context options.
  for (int32_t threads : kInts) {
    maxsim_options o;
    maxsim_options_init(&o);
    o.num_threads = threads;
    o.load_plugins = 0;
    maxsim_context* c = nullptr;
    const maxsim_status st = maxsim_context_create(&o, &c);
    const bool allowed = threads >= 0 && threads <= 4096;
    w.Expect((st == MAXSIM_OK) == allowed, "num_threads " + std::to_string(threads));
    maxsim_context_destroy(c);
  }
  for (uint32_t size : {0u, 1u, 8u, UINT32_MAX}) {
    maxsim_options o;
    maxsim_options_init(&o);
    o.struct_size = size;
    o.load_plugins = UINT32_MAX;
    o.num_threads = 1;
    maxsim_context* c = nullptr;
    w.ExpectStatus(maxsim_context_create(&o, &c), "options.struct_size " + std::to_string(size));
    maxsim_context_destroy(c);
  }
  maxsim_options o;
  maxsim_options_init(&o);
  o.num_threads = 2;
  o.load_plugins = 0;
  o.backend = "cpu";
  maxsim_context* ctx = nullptr;
  w.Expect(maxsim_context_create(&o, &ctx) == MAXSIM_OK, "context");
  if (!ctx) return;
  char text[8];
  size_t needed = 0;
  for (size_t cap : {size_t{0}, size_t{1}, sizeof(text)}) {
    w.ExpectStatus(maxsim_context_report(ctx, text, cap, &needed), "report capacity");
  }

  // Dense descriptions: each field hostile on its own, where the library can tell.
  std::vector<float> data(64 * 8, 0.5f);
  const uint64_t offsets[3] = {0, 3, 5};
  for (int field = 0; field < 6; ++field) {
    for (uint64_t v : kCounts) {
      maxsim_dense_sets s = Dense(data.data(), 8, 2, nullptr, 4);
      switch (field) {
        case 0: s.n_sets = v; break;
        case 1: s.set_length = v; break;
        case 2: s.row_stride = v; break;
        case 3: s.dim = static_cast<uint32_t>(v); break;
        case 4: s.dtype = static_cast<maxsim_dtype>(static_cast<uint32_t>(v) & 0x7FFFFFFFu); break;
        default: s.memory = static_cast<maxsim_memory>(static_cast<uint32_t>(v) & 0x7FFFFFFFu); break;
      }
      const uint64_t bytes = DeclaredBytes(s);
      if (bytes != UINT64_MAX && bytes > data.size() * 4 && s.dim >= 1 && s.dim <= 65536) continue;  // a promise
      const std::string what = "dense field " + std::to_string(field) + " = " + std::to_string(v);
      uint64_t size = 0;
      w.ExpectStatus(maxsim_pack_size(&s, static_cast<int>(v), &size), "pack_size " + what);
      maxsim_packed* p = nullptr;
      w.ExpectStatus(maxsim_pack(ctx, &s, nullptr, &p), "pack " + what);
      maxsim_packed_release(p);
    }
  }
  for (uint32_t dim : kDims) {
    maxsim_dense_sets s = Dense(data.data(), dim, 2, offsets, 0);
    if (dim >= 1 && dim <= 65536) continue;  // a valid dim: pack_size only computes a size
    uint64_t size = 0;
    w.ExpectError(maxsim_pack_size(&s, 0, &size), "pack_size dim " + std::to_string(dim));
  }
  for (uint32_t size : {0u, 1u, UINT32_MAX}) {
    maxsim_dense_sets s = Dense(data.data(), 8, 2, offsets, 0);
    s.struct_size = size;
    uint64_t bytes = 0;
    w.ExpectStatus(maxsim_pack_size(&s, 0, &bytes), "dense struct_size");
  }

  // Packing into a caller buffer: every capacity below the need is refused.
  const maxsim_dense_sets docs = Dense(data.data(), 8, 2, offsets, 0);
  uint64_t need = 0;
  w.Expect(maxsim_pack_size(&docs, 0, &need) == MAXSIM_OK, "pack_size");
  std::vector<uint8_t> raw(need + 128);
  void* out = raw.data() + (64 - reinterpret_cast<uintptr_t>(raw.data()) % 64) % 64;
  for (uint64_t cap : {uint64_t{0}, uint64_t{1}, uint64_t{255}, need - 1}) {
    uint64_t written = 0;
    w.ExpectError(maxsim_pack_into(ctx, &docs, nullptr, out, cap, &written), "pack_into capacity " + std::to_string(cap));
  }
  uint64_t written = 0;
  w.Expect(maxsim_pack_into(ctx, &docs, nullptr, out, need, &written) == MAXSIM_OK, "pack_into");

  // Validation: sizes and levels.
  for (uint64_t size : kCounts) {
    if (size == need) continue;
    w.ExpectError(maxsim_validate(out, size, MAXSIM_VALIDATE_STANDARD), "validate size " + std::to_string(size));
    maxsim_packed* p = nullptr;
    w.ExpectError(maxsim_packed_open(out, size, MAXSIM_VALIDATE_FAST, &p), "open size " + std::to_string(size));
  }
  for (int32_t level : kEnumValues) {
    if (level >= 0 && level <= 2) continue;
    const auto l = static_cast<maxsim_validation>(level);
    w.ExpectError(maxsim_validate(out, need, l), "validate level " + std::to_string(level));
    maxsim_packed* p = nullptr;
    w.ExpectError(maxsim_packed_open(out, need, l, &p), "open level");
    w.ExpectError(maxsim_packed_load("/nonexistent.maxsim", l, &p), "load level");
  }
  maxsim_packed* packed = nullptr;
  w.Expect(maxsim_packed_open(out, need, MAXSIM_VALIDATE_STANDARD, &packed) == MAXSIM_OK, "open");
  for (uint64_t i : kCounts) {
    const char* id = nullptr;
    size_t length = 0;
    const maxsim_status st = maxsim_packed_string_id(packed, i, &id, &length);
    w.Expect(i < 2 ? st == MAXSIM_OK : st != MAXSIM_OK, "string_id " + std::to_string(i));
  }

  // Scoring options and arguments.
  const float q[2 * 8] = {1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0};
  const uint64_t qoff[2] = {0, 2};
  const maxsim_dense_sets qs = Dense(q, 8, 1, qoff, 0);
  const maxsim_sets Q{nullptr, &qs}, D{packed, nullptr};
  float scores[16];
  int32_t argmax[64];
  uint64_t index[16], ids[16];
  for (int field = 0; field < 3; ++field) {
    for (int32_t v : kEnumValues) {
      maxsim_score_options so;
      maxsim_score_options_init(&so);
      if (field == 0) so.struct_size = static_cast<uint32_t>(v);
      if (field == 1) so.metric = static_cast<maxsim_metric>(v);
      if (field == 2) so.mode = static_cast<maxsim_mode>(v);
      const std::string what = "score option " + std::to_string(field) + " = " + std::to_string(v);
      w.ExpectStatus(maxsim_score_matrix(ctx, &Q, &D, &so, scores, argmax), "matrix " + what);
      w.ExpectStatus(maxsim_topk(ctx, &Q, &D, 2, &so, scores, index, nullptr), "topk " + what);
    }
  }
  for (uint64_t k : kCounts) {
    if (k >= 1 && k <= 16) continue;
    if (k == INT32_MAX || k == UINT32_MAX) continue;  // a real output size (16-32 GiB): the caller's promise
    w.ExpectError(maxsim_topk(ctx, &Q, &D, k, nullptr, scores, index, nullptr), "topk k " + std::to_string(k));
  }
  w.ExpectError(maxsim_topk(ctx, &Q, &D, 2, nullptr, scores, index, ids), "topk ids without ids");
  for (uint64_t c : kCounts) {
    if (c < 2) continue;
    const uint64_t coff[2] = {0, 1}, cand[1] = {c};
    w.ExpectError(maxsim_score_candidates(ctx, &Q, &D, coff, cand, nullptr, scores, argmax),
                  "candidate " + std::to_string(c));
    const uint64_t bad_off[2] = {c, c};
    w.ExpectError(maxsim_score_candidates(ctx, &Q, &D, bad_off, cand, nullptr, scores, argmax),
                  "cand_offsets[0] " + std::to_string(c));
  }

  // Backward: layout, struct size, argmax values.
  const maxsim_dense_sets ds = Dense(data.data(), 8, 2, offsets, 0);
  float grad_scores[2] = {1, 1};
  std::vector<float> gq(2 * 8), gd(5 * 8);
  for (int field = 0; field < 3; ++field) {
    for (int32_t v : field == 0 ? std::vector<int32_t>(std::begin(kEnumValues), std::end(kEnumValues))
                                : std::vector<int32_t>(std::begin(kInts), std::end(kInts))) {
      maxsim_backward_args a;
      maxsim_backward_args_init(&a);
      int32_t am[4] = {0, 0, 0, 0};
      a.argmax = am;
      a.grad_scores = grad_scores;
      a.grad_queries = gq.data();
      a.grad_documents = gd.data();
      if (field == 0) a.layout = static_cast<maxsim_layout>(v);
      if (field == 1) a.struct_size = static_cast<uint32_t>(v);
      if (field == 2) am[1] = v;
      if (field == 0 && v == 1) continue;  // PAIRS needs Nq == Nd, a different shape
      a.deterministic = v;
      const std::string what = "backward field " + std::to_string(field) + " = " + std::to_string(v);
      const maxsim_status st = maxsim_backward(ctx, &qs, &ds, &a);
      const bool valid = (field == 0 && v == 0) || (field == 1 && static_cast<uint32_t>(v) >= sizeof(a)) ||
                         (field == 2 && v >= -1 && v <= 2);
      w.Expect((st == MAXSIM_OK) == valid, what + " returned " + maxsim_status_name(st));
    }
  }
  maxsim_packed_release(packed);
  maxsim_context_destroy(ctx);
}

TEST(HostileNumbers, EveryEntryPointAnswersWithAStatusAndPrintsNothing) {
  Walk w;
  CaptureOutput capture;
  WalkEverything(w);
  const std::string printed = capture.Text();
  EXPECT_EQ(printed, "") << "the library printed";
  for (const std::string& p : w.problems) ADD_FAILURE() << p;
  EXPECT_GT(w.calls, 300);
}

}  // namespace
