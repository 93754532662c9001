// SPDX-License-Identifier: Apache-2.0
// Run by tests/system_input_test.cc in a child process under a thread limit: creates a context with argv[1]
// threads and, if that succeeds, scores enough documents to start an OpenMP team of that size. Prints
// "create STATUS message" and "score STATUS" and exits 0 whenever the library returned, so a process that the
// OpenMP runtime killed shows as a non-zero exit.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "maxsim/maxsim.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  maxsim_options o;
  maxsim_options_init(&o);
  o.num_threads = std::atoi(argv[1]);
  o.load_plugins = 0;
  o.backend = "cpu";
  maxsim_context* ctx = nullptr;
  maxsim_status st = maxsim_context_create(&o, &ctx);
  std::printf("create %s %s\n", maxsim_status_name(st), maxsim_last_error());
  if (st != MAXSIM_OK) return 0;
  const uint32_t dim = 4;
  std::vector<float> d(4096 * dim, 0.25f), q(2 * dim, 1.0f);
  const uint64_t doff[2] = {0, 4096}, qoff[2] = {0, 2};
  maxsim_dense_sets ds{}, qs{};
  ds.struct_size = qs.struct_size = sizeof(maxsim_dense_sets);
  ds.dtype = qs.dtype = MAXSIM_F32;
  ds.dim = qs.dim = dim;
  ds.n_sets = qs.n_sets = 1;
  ds.data = d.data();
  ds.offsets = doff;
  qs.data = q.data();
  qs.offsets = qoff;
  const maxsim_sets Q{nullptr, &qs}, D{nullptr, &ds};
  float score = 0;
  st = maxsim_score_matrix(ctx, &Q, &D, nullptr, &score, nullptr);
  std::printf("score %s %g\n", maxsim_status_name(st), score);
  maxsim_context_destroy(ctx);
  return 0;
}
