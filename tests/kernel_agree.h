// SPDX-License-Identifier: Apache-2.0
// Scoring a (queries, documents) matrix with a chosen kernel and comparing kernels: the helpers the kernel tests
// share (kernel_test.cc, x86_kernel_test.cc). One comparison of every kernel against the scalar kernel,
// ExpectEveryKernelMatchesScalar, serves the ISA-neutral sweep and the per-ISA tile-shape sweeps.
#ifndef MAXSIM_TESTS_KERNEL_AGREE_H_
#define MAXSIM_TESTS_KERNEL_AGREE_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "maxsim/maxsim.hpp"
#include "test_util.h"

namespace maxsim::test {

// A CPU context for "kernel" or "kernel/variant" (a variant of KernelOps::variants, forced through its
// environment variable as a user would: "amx/vdpbf16ps" sets MAXSIM_BF16_DOT=vdpbf16ps while it is created).
Context KernelContext(const std::string& config, int threads);

// Every kernel this CPU runs that "auto" may select (explicit-only kernels have their own tests). With variants,
// a kernel with KernelOps::variants appears once per variant that runs here ("amx/fma", "amx/vdpbf16ps"),
// whatever the speed check would choose; without, once, with the context's choice.
std::vector<std::string> KernelConfigs(bool variants);

// One query set per length, clustered tokens, encoded as dtype.
TokenSets QueriesOfLengths(std::mt19937_64& rng, const std::vector<uint64_t>& lengths, uint32_t dim,
                           maxsim_dtype dtype);

struct Outcome {
  std::vector<float> scores;
  std::vector<int32_t> argmax;
  maxsim_stats stats{};
};

// maxsim_score_matrix of q against d (packed once here, or dense as they are) with argmax and statistics.
Outcome ScoreMatrixWith(Context& ctx, const TokenSets& q, const TokenSets& d, maxsim_metric metric, maxsim_mode mode,
                        bool packed_documents = true);

// The same score bits and the same argmax.
void ExpectIdentical(const Outcome& a, const Outcome& b, const std::string& what);

// Query-token x non-empty-document evaluations: certified and approximate refine at least one row for each.
uint64_t Evaluations(const TokenSets& q, const TokenSets& d);

// The same candidate sets as the scalar kernel's (multi_candidate), no more refined rows than they hold (the
// SIMD kernels refine in two rounds and may stop early), and at least min_refined.
void ExpectSameCandidateSets(const Outcome& scalar, const Outcome& got, const std::string& what,
                             uint64_t min_refined);

struct AgreeOptions {
  bool variants = false;         // every variant of a kernel (KernelConfigs(true))
  bool dense_certified = false;  // certified mode also against the documents as dense sets
  // Configurations that would run the same code as another one for this mode and dtype (skipped).
  bool (*repeats)(const std::string& config, maxsim_mode mode, maxsim_dtype dtype) = nullptr;
};

// Every kernel (two threads) against the scalar kernel (one thread), both metrics, every mode: identical scores
// and argmaxes, and in certified/approximate the same candidate sets. The i8 dot is exact in every kernel and
// the keys, margins and candidate tests are the same f32 expressions, so the approximate choices agree too.
void ExpectEveryKernelMatchesScalar(const TokenSets& q, const TokenSets& d, const std::string& label,
                                    const AgreeOptions& options);

}  // namespace maxsim::test

#endif  // MAXSIM_TESTS_KERNEL_AGREE_H_
