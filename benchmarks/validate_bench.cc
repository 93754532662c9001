// SPDX-License-Identifier: Apache-2.0
// What validation costs, through the public C API as users call it: maxsim_validate at FAST, STANDARD and DEEP,
// packing (maxsim_pack_into, for scale: DEEP redoes the packer's work), and the first certified call on a buffer
// opened at STANDARD (which DEEP-validates it once, with the context's threads) against a later call. Per million
// token vectors, for each dtype of the originals, as CPU time (all threads: the work, even on a busy machine) and
// wall time. Writes a JSON result file (command, machine, date) and prints a markdown table.
//
//   validate_bench [--tokens=N] [--dim=D] [--threads=T] [--reps=R] [--out=FILE.json] [--note=TEXT]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <time.h>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "maxsim/maxsim.h"

namespace {

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU time of the whole process (every thread): on a shared machine the work done, whatever the waiting.
double CpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

struct Cost {
  double wall = 0, cpu = 0;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename F>
Cost MedianCost(int reps, F f) {
  std::vector<double> wall, cpu;
  for (int r = 0; r < reps; ++r) {
    const double w0 = Seconds(), c0 = CpuSeconds();
    f();
    wall.push_back(Seconds() - w0);
    cpu.push_back(CpuSeconds() - c0);
  }
  return {Median(wall), Median(cpu)};
}

void Check(maxsim_status st, const char* what) {
  if (st != MAXSIM_OK) {
    std::fprintf(stderr, "validate_bench: %s failed: %s\n", what, maxsim_last_error());
    std::exit(1);
  }
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

std::string JsonEscape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) o += c;
  }
  return o;
}

uint16_t ToHalfBits(float f, maxsim_dtype dtype) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  if (dtype == MAXSIM_BF16) return static_cast<uint16_t>((b + 0x7FFF + ((b >> 16) & 1)) >> 16);
  // f16 of a value in [-4, 4] (normal range, round to nearest even by the usual bit trick).
  const uint32_t sign = (b >> 16) & 0x8000u;
  const int exp = static_cast<int>((b >> 23) & 0xFF) - 127 + 15;
  if (exp <= 0) return static_cast<uint16_t>(sign);
  uint32_t mant = b & 0x7FFFFFu;
  uint32_t h = (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t tokens = 200000;
  uint32_t dim = 128;
  int threads = 2, reps = 5;
  std::string out, note, command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&](const char* key) { return a.substr(std::strlen(key)); };
    if (a.rfind("--tokens=", 0) == 0) tokens = std::strtoull(val("--tokens=").c_str(), nullptr, 10);
    else if (a.rfind("--dim=", 0) == 0) dim = static_cast<uint32_t>(std::strtoul(val("--dim=").c_str(), nullptr, 10));
    else if (a.rfind("--threads=", 0) == 0) threads = std::atoi(val("--threads=").c_str());
    else if (a.rfind("--reps=", 0) == 0) reps = std::max(1, std::atoi(val("--reps=").c_str()));
    else if (a.rfind("--out=", 0) == 0) out = val("--out=");
    else if (a.rfind("--note=", 0) == 0) note = val("--note=");
    else {
      std::fprintf(stderr, "usage: %s [--tokens=N] [--dim=D] [--threads=T] [--reps=R] [--out=F.json] [--note=T]\n",
                   argv[0]);
      return 2;
    }
  }
  if (tokens == 0 || dim == 0 || threads < 1) return 2;
  maxsim_options o;
  maxsim_options_init(&o);
  o.num_threads = threads;
  o.load_plugins = 0;
  o.backend = "cpu";
  maxsim_context* ctx = nullptr;
  Check(maxsim_context_create(&o, &ctx), "context");

  // Documents of 100 tokens (ColBERT-like), Gaussian values; one 32-token query for the certified calls.
  const uint64_t per_doc = 100, n_docs = (tokens + per_doc - 1) / per_doc;
  tokens = n_docs * per_doc;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  std::vector<float> f32(tokens * dim);
  for (float& x : f32) x = std::clamp(normal(rng), -4.0f, 4.0f);
  std::vector<float> query(32 * dim);
  for (float& x : query) x = normal(rng);
  const uint64_t qoff[2] = {0, 32};

  struct Row {
    const char* dtype;
    const char* what;
    Cost cost;
  };
  std::vector<Row> rows;
  char date[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);

  for (maxsim_dtype dtype : {MAXSIM_F32, MAXSIM_F16, MAXSIM_BF16}) {
    const char* name = dtype == MAXSIM_F32 ? "f32" : dtype == MAXSIM_F16 ? "f16" : "bf16";
    std::vector<uint16_t> half;
    const void* data = f32.data();
    if (dtype != MAXSIM_F32) {
      half.resize(f32.size());
      for (size_t i = 0; i < f32.size(); ++i) half[i] = ToHalfBits(f32[i], dtype);
      data = half.data();
    }
    maxsim_dense_sets s{};
    s.struct_size = sizeof(s);
    s.data = data;
    s.dtype = dtype;
    s.dim = dim;
    s.n_sets = n_docs;
    s.set_length = per_doc;
    uint64_t size = 0;
    Check(maxsim_pack_size(&s, 0, &size), "pack_size");
    void* buf = std::aligned_alloc(64, (size + 63) / 64 * 64);
    uint64_t written = 0;
    Check(maxsim_pack_into(ctx, &s, nullptr, buf, size, &written), "pack_into");  // also faults the pages in
    rows.push_back({name, "pack (maxsim_pack_into)", MedianCost(reps, [&] {
                      Check(maxsim_pack_into(ctx, &s, nullptr, buf, size, &written), "pack_into");
                    })});
    for (maxsim_validation level : {MAXSIM_VALIDATE_FAST, MAXSIM_VALIDATE_STANDARD, MAXSIM_VALIDATE_DEEP}) {
      const char* lname = level == MAXSIM_VALIDATE_FAST ? "maxsim_validate FAST"
                          : level == MAXSIM_VALIDATE_STANDARD ? "maxsim_validate STANDARD"
                                                              : "maxsim_validate DEEP";
      rows.push_back({name, lname, MedianCost(reps, [&] { Check(maxsim_validate(buf, size, level), lname); })});
    }
    // First certified call on a handle opened at STANDARD (runs DEEP once, with the context's threads) minus a
    // later call on the same handle.
    maxsim_dense_sets qs{};
    qs.struct_size = sizeof(qs);
    qs.data = query.data();
    qs.dtype = MAXSIM_F32;
    qs.dim = dim;
    qs.n_sets = 1;
    qs.offsets = qoff;
    std::vector<float> scores(n_docs);
    maxsim_score_options so;
    maxsim_score_options_init(&so);
    so.mode = MAXSIM_MODE_CERTIFIED;
    std::vector<double> first_wall, first_cpu, later_wall, later_cpu;
    for (int r = 0; r < reps; ++r) {
      maxsim_packed* p = nullptr;
      Check(maxsim_packed_open(buf, size, MAXSIM_VALIDATE_STANDARD, &p), "open");
      const maxsim_sets Q{nullptr, &qs}, D{p, nullptr};
      for (int call = 0; call < 2; ++call) {
        const double w0 = Seconds(), c0 = CpuSeconds();
        Check(maxsim_score_matrix(ctx, &Q, &D, &so, scores.data(), nullptr), "certified call");
        (call == 0 ? first_wall : later_wall).push_back(Seconds() - w0);
        (call == 0 ? first_cpu : later_cpu).push_back(CpuSeconds() - c0);
      }
      maxsim_packed_release(p);
    }
    rows.push_back({name, "first certified call on a STANDARD handle (DEEP + scoring)",
                    {Median(first_wall), Median(first_cpu)}});
    rows.push_back({name, "later certified call (scoring only)", {Median(later_wall), Median(later_cpu)}});
    std::free(buf);
  }

  const double per_million = 1e6 / static_cast<double>(tokens);
  std::printf("Cost per million token vectors (dim %u, %llu tokens in documents of %llu, %d threads for packing and "
              "scoring, one for maxsim_validate; median of %d; CPU = all threads)\n\n",
              dim, static_cast<unsigned long long>(tokens), static_cast<unsigned long long>(per_doc), threads, reps);
  std::printf("| originals | operation | ms CPU per million tokens | ms wall per million tokens |\n|---|---|---|---|\n");
  for (const Row& r : rows) {
    std::printf("| %s | %s | %.1f | %.1f |\n", r.dtype, r.what, r.cost.cpu * per_million * 1e3,
                r.cost.wall * per_million * 1e3);
  }
  if (!out.empty()) {
    std::ofstream f(out);
    f << "{\n  \"context\": {\"command\": \"" << JsonEscape(command) << "\", \"date\": \"" << date
      << "\", \"host\": \"" << JsonEscape(host) << "\", \"cpu\": \"" << JsonEscape(CpuModel())
      << "\", \"cpus_online\": " << sysconf(_SC_NPROCESSORS_ONLN) << ", \"kernel\": \""
      << maxsim_context_kernel(ctx) << "\", \"note\": \"" << JsonEscape(note) << "\"},\n"
      << "  \"dim\": " << dim << ", \"tokens\": " << tokens << ", \"threads\": " << threads << ", \"reps\": " << reps
      << ",\n  \"results\": [\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      f << "    {\"originals\": \"" << rows[i].dtype << "\", \"operation\": \"" << rows[i].what
        << "\", \"cpu_ms_per_million_tokens\": " << rows[i].cost.cpu * per_million * 1e3
        << ", \"wall_ms_per_million_tokens\": " << rows[i].cost.wall * per_million * 1e3 << "}"
        << (i + 1 < rows.size() ? "," : "") << "\n";
    }
    f << "  ]\n}\n";
  }
  maxsim_context_destroy(ctx);
  return 0;
}
