// SPDX-License-Identifier: Apache-2.0
// kernel_bench: a small driver for kernel development (not the project's benchmark program, which is
// benchmarks/cpu_bench). Times one (kernel, mode, dtype, shape, threads) combination through the public API on
// packed documents and prints one line per combination:
//   kernel mode dtype Lq Ld Nd dim threads  best_us  docs/s  GSO/s  refined/qtok  multi/qtok
// GSO/s counts 2*Lq*Ld*dim operations per (query, document) pair. The best of `reps` calls is reported (the
// on a shared machine the minimum is the least disturbed figure).
//
// usage: kernel_bench [--kernels a,b] [--modes exact,certified,approximate] [--dtypes f32,bf16,f16]
//                     [--shapes Lq:Ld:Nd:dim,...] [--threads 1,2] [--reps N] [--data DIR] [--topk K]
// --data DIR scores the real embeddings (queries_tokens.npy etc.) instead of synthetic data and prints the
// fraction of query tokens whose candidate set had more than one token. --topk K also times maxsim_topk for
// every mode (mode printed as e.g. "certified@10"; the ref/qt column then holds the fraction of documents
// pruned by their certified upper bound, multi/qt the fraction of query tokens refined).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "half.h"
#include "maxsim/maxsim.hpp"
#include "npy.h"

namespace {

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

struct Shape {
  uint64_t lq, ld, nd;
  uint32_t dim;
};

// ColBERT-like synthetic tokens: unit vectors clustered around 64 centres.
std::vector<float> Tokens(std::mt19937_64& rng, uint64_t rows, uint32_t dim) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> centres(64 * static_cast<size_t>(dim));
  for (float& c : centres) c = g(rng);
  std::vector<float> v(rows * dim);
  for (uint64_t r = 0; r < rows; ++r) {
    const float* c = centres.data() + (rng() % 64) * dim;
    double n = 0;
    for (uint32_t k = 0; k < dim; ++k) {
      v[r * dim + k] = c[k] + 0.7f * g(rng);
      n += static_cast<double>(v[r * dim + k]) * v[r * dim + k];
    }
    for (uint32_t k = 0; k < dim; ++k) v[r * dim + k] = static_cast<float>(v[r * dim + k] / std::sqrt(n));
  }
  return v;
}

std::vector<uint8_t> Encode(const std::vector<float>& v, maxsim_dtype dt) {
  if (dt == MAXSIM_F32) {
    std::vector<uint8_t> out(v.size() * 4);
    std::memcpy(out.data(), v.data(), out.size());
    return out;
  }
  std::vector<uint8_t> out(v.size() * 2);
  auto* o = reinterpret_cast<uint16_t*>(out.data());
  for (size_t i = 0; i < v.size(); ++i) o[i] = dt == MAXSIM_BF16 ? maxsim::F32ToBf16(v[i]) : maxsim::F32ToF16(v[i]);
  return out;
}

maxsim_mode ModeOf(const std::string& m) {
  if (m == "certified") return MAXSIM_MODE_CERTIFIED;
  if (m == "approximate") return MAXSIM_MODE_APPROXIMATE;
  return MAXSIM_MODE_EXACT;
}
maxsim_dtype DtypeOf(const std::string& d) {
  if (d == "bf16") return MAXSIM_BF16;
  if (d == "f16") return MAXSIM_F16;
  return MAXSIM_F32;
}

maxsim::Context MakeContext(const std::string& kernel, int threads) {
  maxsim_options o;
  maxsim_options_init(&o);
  o.isa = kernel.c_str();
  o.num_threads = threads;
  o.load_plugins = 0;
  o.backend = "cpu";
  return maxsim::Context(o);
}

bool LoadNpy(const std::string& path, maxsim::npy::Array* a) {
  const std::string e = maxsim::npy::Read(path, a);
  if (!e.empty()) {
    std::fprintf(stderr, "%s\n", e.c_str());
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> kernels, modes = {"exact", "certified"}, dtypes = {"f32"};
  std::vector<Shape> shapes = {{32, 180, 1000, 128}, {32, 300, 1000, 128}};
  std::vector<int> threads = {1};
  int reps = 5;
  uint64_t topk = 0;
  std::string data_dir;
  for (int a = 1; a + 1 < argc; a += 2) {
    const std::string k = argv[a], v = argv[a + 1];
    if (k == "--kernels") kernels = Split(v, ',');
    else if (k == "--modes") modes = Split(v, ',');
    else if (k == "--dtypes") dtypes = Split(v, ',');
    else if (k == "--threads") {
      threads.clear();
      for (auto& t : Split(v, ',')) threads.push_back(std::atoi(t.c_str()));
    } else if (k == "--reps") reps = std::atoi(v.c_str());
    else if (k == "--data") data_dir = v;
    else if (k == "--topk") topk = std::stoull(v);
    else if (k == "--shapes") {
      shapes.clear();
      for (auto& s : Split(v, ',')) {
        auto f = Split(s, ':');
        if (f.size() != 4) return 2;
        shapes.push_back({std::stoull(f[0]), std::stoull(f[1]), std::stoull(f[2]),
                          static_cast<uint32_t>(std::stoul(f[3]))});
      }
    } else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (kernels.empty()) {
    for (size_t i = 0; i < maxsim_kernel_count(); ++i) {
      if (maxsim_kernel_available(i, nullptr)) kernels.push_back(maxsim_kernel_name(i));
    }
  }
  std::printf("%-14s %-11s %-5s %5s %5s %5s %4s %3s %11s %10s %8s %8s %8s\n", "kernel", "mode", "dtype", "Lq", "Ld",
              "Nd", "dim", "thr", "best_us", "docs/s", "GSO/s", "ref/qt", "multi/qt");
  try {
    if (!data_dir.empty()) {
      // Real embeddings: every query against every document, certified counters per kernel.
      maxsim::npy::Array qt, qo, dt, dof;
      if (!LoadNpy(data_dir + "/queries_tokens.npy", &qt) || !LoadNpy(data_dir + "/queries_offsets.npy", &qo) ||
          !LoadNpy(data_dir + "/docs_tokens.npy", &dt) || !LoadNpy(data_dir + "/docs_offsets.npy", &dof)) {
        return 1;
      }
      const uint32_t dim = static_cast<uint32_t>(qt.shape[1]);
      std::vector<uint64_t> qoff(qo.count()), doff(dof.count());
      std::memcpy(qoff.data(), qo.data.data(), qo.data.size());
      std::memcpy(doff.data(), dof.data.data(), dof.data.size());
      maxsim::DenseSets q(reinterpret_cast<const float*>(qt.data.data()), dim, qoff);
      maxsim::DenseSets d(reinterpret_cast<const float*>(dt.data.data()), dim, doff);
      for (const std::string& kn : kernels) {
        maxsim::Context ctx = MakeContext(kn, 1);
        maxsim::Packed pd = maxsim::Packed::Pack(ctx, d);
        for (const std::string& m : {std::string("certified"), std::string("approximate")}) {
          maxsim_stats st{};
          maxsim::ScoreOptions o;
          o.mode = ModeOf(m);
          o.stats = &st;
          std::vector<float> scores(q.n_sets() * d.n_sets());
          ctx.ScoreMatrix(q, pd, scores, o);
          std::printf("%-14s %-11s real: pairs %llu query-token evals %llu refined %llu (%.3f per token) "
                      "multi-candidate %llu (%.4f of tokens)\n",
                      kn.c_str(), m.c_str(), (unsigned long long)st.pairs, (unsigned long long)st.query_tokens,
                      (unsigned long long)st.refined, double(st.refined) / st.query_tokens,
                      (unsigned long long)st.multi_candidate, double(st.multi_candidate) / st.query_tokens);
        }
      }
      return 0;
    }
    for (const Shape& s : shapes) {
      std::mt19937_64 rng(42);
      const std::vector<float> qv = Tokens(rng, s.lq, s.dim), dv = Tokens(rng, s.ld * s.nd, s.dim);
      for (const std::string& dts : dtypes) {
        const maxsim_dtype dtype = DtypeOf(dts);
        const std::vector<uint8_t> qe = Encode(qv, dtype), de = Encode(dv, dtype);
        maxsim::DenseSets q = maxsim::DenseSets::Uniform(qe.data(), dtype, s.dim, 1, s.lq);
        maxsim::DenseSets d = maxsim::DenseSets::Uniform(de.data(), dtype, s.dim, s.nd, s.ld);
        for (const std::string& kn : kernels) {
          for (int t : threads) {
            maxsim::Context ctx = MakeContext(kn, t);
            const auto p0 = std::chrono::steady_clock::now();
            maxsim::Packed pd = maxsim::Packed::Pack(ctx, d);
            const double pack_us =
                std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - p0).count();
            if (kn == kernels.front()) {
              std::printf("# packing %llu documents of %llu x %u %s with %d thread(s): %.1f us per document\n",
                          (unsigned long long)s.nd, (unsigned long long)s.ld, s.dim, dts.c_str(), t, pack_us / s.nd);
            }
            for (const std::string& m : modes) {
              maxsim::ScoreOptions o;
              o.mode = ModeOf(m);
              maxsim_stats st{};
              o.stats = &st;
              std::vector<float> scores(s.nd);
              double best = 1e30;
              for (int r = 0; r < reps + 1; ++r) {
                const auto t0 = std::chrono::steady_clock::now();
                ctx.ScoreMatrix(q, pd, scores, o);
                const double us =
                    std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
                if (r > 0) best = std::min(best, us);
              }
              const double ops = 2.0 * s.lq * s.ld * s.dim * s.nd;
              const double qtok = double(st.query_tokens);
              std::printf("%-14s %-11s %-5s %5llu %5llu %5llu %4u %3d %11.1f %10.0f %8.1f %8.3f %8.4f\n", kn.c_str(),
                          m.c_str(), dts.c_str(), (unsigned long long)s.lq, (unsigned long long)s.ld,
                          (unsigned long long)s.nd, s.dim, t, best, s.nd / (best * 1e-6), ops / (best * 1e3),
                          qtok > 0 ? st.refined / qtok : 0.0, qtok > 0 ? st.multi_candidate / qtok : 0.0);
              std::fflush(stdout);
              if (topk > 0) {
                maxsim_stats tst{};
                maxsim::ScoreOptions to;
                to.mode = ModeOf(m);
                to.stats = &tst;
                double tbest = 1e30;
                for (int r = 0; r < reps + 1; ++r) {
                  const auto t0 = std::chrono::steady_clock::now();
                  const maxsim::TopKResult res = ctx.TopK(q, 1, pd, topk, to);
                  const double us =
                      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
                  if (r > 0) tbest = std::min(tbest, us);
                  if (res.index.empty()) return 1;
                }
                const std::string tm = m + "@" + std::to_string(topk);
                std::printf("%-14s %-11s %-5s %5llu %5llu %5llu %4u %3d %11.1f %10.0f %8.1f %8.3f %8.4f\n",
                            kn.c_str(), tm.c_str(), dts.c_str(), (unsigned long long)s.lq, (unsigned long long)s.ld,
                            (unsigned long long)s.nd, s.dim, t, tbest, s.nd / (tbest * 1e-6), ops / (tbest * 1e3),
                            tst.pairs ? double(tst.docs_pruned) / tst.pairs : 0.0,
                            tst.query_tokens ? double(tst.refined) / tst.query_tokens : 0.0);
                std::fflush(stdout);
              }
            }
          }
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernel_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
