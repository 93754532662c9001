// SPDX-License-Identifier: Apache-2.0
// Forward planning: the kernel for each call, its argument block and launch, and document chunking.
#include "plan.h"

#include <algorithm>

#include "host_util.h"

namespace mscuda {

// Whether a certified request runs the wgmma screening kernel (screen_wgmma.cu: dot, values only, 16-bit
// originals of 96 < dim <= 128, a resident corpus, an sm_90 device with the sm_90a module, queries of at least
// tuning.screen_wgmma_min_lq tokens). It is the long-query kernel of forced screening (MAXSIM_CUDA_CERTIFIED=screen;
// several times faster than the mma.sync screening kernel on the visual shape), but not the default certified
// route: the exact kernel is faster still on the H100, with the same bits (gpu_bench, mode certified-screen;
// docs/cuda.md). The experimental option screen-wgmma puts it on the default route too.
bool UseScreenWgmma(const Backend& b, int requested_mode, const DeviceQueries& q, const Corpus& c, int metric,
                    bool argmax) {
  if (requested_mode != MAXSIM_MODE_CERTIFIED || b.screen_route == Backend::ScreenRoute::kExact) return false;
  if (b.screen_route == Backend::ScreenRoute::kAuto && !b.tuning.experimental_screen_wgmma) return false;
  if (c.streamed || metric != MAXSIM_METRIC_DOT || argmax) return false;
  if (q.max_len < std::max<uint64_t>(b.tuning.screen_wgmma_min_lq, 1)) return false;
  return ScreenWgmmaSupported(b.tuning.kernels, q.view, c.info.dtype, c.info.padded_dim, c.max_len);
}

Plan MakeScreenWgmmaPlan(const Backend& b, uint64_t max_lq) {
  Plan p;
  p.kind = KernelKind::kScreenWgmma;
  p.rows = kScreenWgmmaRows;
  p.groups = static_cast<uint32_t>(std::max<uint64_t>(1, (max_lq + p.rows - 1) / p.rows));
  p.partials = p.groups > 1;
  p.cand_cap = ScreenWgmmaCap(b.tuning.kernels);
  return p;
}

Plan MakePlan(const Backend& b, const SetsView& q, const SetsView& d, uint64_t max_lq, int mode) {
  Plan p;
  if (mode != MAXSIM_MODE_EXACT) {
    p.kind = KernelKind::kScreen;
    p.rows = ScreenGroupRows(max_lq);
  } else if (b.tuning.smem_kernel && TcSmemSupported(q, d, max_lq)) {
    p.kind = KernelKind::kTcSmem;
    p.rows = TcSmemGroupRows(max_lq);
  } else if (TcSupported(q, d)) {
    p.kind = KernelKind::kTc;
    p.rows = TcGroupRows(max_lq);
  } else {
    p.kind = KernelKind::kFfma;
    p.rows = kFfmaGroupRows;
  }
  p.groups = static_cast<uint32_t>(std::max<uint64_t>(1, (max_lq + p.rows - 1) / p.rows));
  p.partials = p.kind == KernelKind::kFfma || p.groups > 1;
  p.max_lq = max_lq;
  // Whether LaunchForward may run the wgmma batch kernel (exact tensor-core plans of queries of <= 128 tokens on
  // a device with it): its per-row terms then need room (WgmmaBatchUsable decides per launch).
  p.batch_terms = (p.kind == KernelKind::kTc || p.kind == KernelKind::kTcSmem) && !p.partials && max_lq <= 128 &&
                  b.tuning.kernels.wgmma && b.tuning.kernels.batch && WgmmaAvailable(b.device);
  return p;
}

ForwardArgs MatrixForwardArgs(const SetsView& q, const SetsView& d, uint64_t nq, uint64_t nd, int metric, int mode,
                              ull* counters, float* scores, int32_t* argmax, uint8_t* partials, const Plan& plan) {
  ForwardArgs fa;
  fa.q = q;
  fa.d = d;
  fa.d_device_memory = 1;  // a corpus's rows: the plugin's own device memory (resident image or streamed chunk)
  fa.cosine = metric == MAXSIM_METRIC_COSINE;
  fa.mode = mode;
  fa.counters = counters;
  fa.pairs.layout = kPairsMatrix;
  fa.pairs.n_pairs = nq * nd;
  fa.pairs.nd = nd;
  fa.pairs.scores = scores;
  fa.pairs.score_stride = nd;
  fa.pairs.argmax = argmax;
  fa.pairs.am_rows = nd;
  if (plan.partials && partials) {
    fa.part.term = reinterpret_cast<float*>(partials);
    fa.part.arg = reinterpret_cast<int32_t*>(partials + nq * nd * plan.groups * plan.rows * 4);
  } else if (plan.batch_terms && partials) {
    fa.part.term = reinterpret_cast<float*>(partials);  // the batch kernel's terms
  }
  if (plan.kind == KernelKind::kScreenWgmma && partials) {
    const uint64_t tasks = nq * nd * plan.groups;
    uint8_t* c = partials + (plan.partials ? tasks * plan.rows * 8 : 0);
    c = reinterpret_cast<uint8_t*>(RoundUp(reinterpret_cast<uintptr_t>(c), 16));
    fa.cand.list = reinterpret_cast<uint4*>(c);
    fa.cand.threshold = reinterpret_cast<int32_t*>(c + tasks * plan.cand_cap * sizeof(uint4));
    fa.cand.count = reinterpret_cast<uint32_t*>(c + tasks * (plan.cand_cap * sizeof(uint4) + kScreenWgmmaRows * 4));
    fa.cand.cap = plan.cand_cap;
  }
  return fa;
}

Status LaunchForward(const Backend& b, const Plan& plan, ForwardArgs a, cudaStream_t stream) {
  a.sw = b.tuning.kernels;
  a.part.groups = plan.groups;
  a.part.group_rows = plan.rows;
  if (!plan.partials) {
    a.part.groups = 1;
  }
  cudaError_t e = cudaSuccess;
  if ((plan.kind == KernelKind::kTc || plan.kind == KernelKind::kTcSmem) && WgmmaBatchUsable(a, plan.max_lq)) {
    e = LaunchExactWgmmaBatch(a, plan.max_lq, stream);
    if (e != cudaSuccess) return CudaFail(e, "launching the batch forward kernel");
    return Status::Ok();
  }
  switch (plan.kind) {
    case KernelKind::kTc: e = LaunchExactTc(a, stream); break;
    case KernelKind::kTcSmem: e = LaunchExactTcSmem(a, stream); break;
    case KernelKind::kFfma: e = LaunchExactFfma(a, stream); break;
    case KernelKind::kScreen: e = LaunchScreen(a, stream); break;
    case KernelKind::kScreenWgmma: e = LaunchScreenWgmma(a, stream); break;
  }
  if (e != cudaSuccess) return CudaFail(e, "launching the forward kernel");
  if (plan.partials) {
    e = LaunchFinalize(a, stream);
    if (e != cudaSuccess) return CudaFail(e, "launching the finalize kernel");
  }
  return Status::Ok();
}

std::vector<DocChunk> MakeChunks(const Corpus& c, uint64_t max_docs, uint64_t row_bytes_streamed, uint64_t cap_bytes) {
  std::vector<DocChunk> chunks;
  const uint64_t nd = c.info.n_sets;
  if (!c.streamed) {  // resident: runs of max_docs documents, no walk over the sets (a per-call cost)
    max_docs = std::max<uint64_t>(1, max_docs);
    chunks.reserve(nd / max_docs + 1);
    for (uint64_t j = 0; j < nd; j += max_docs) chunks.push_back({j, std::min(nd, j + max_docs)});
    return chunks;
  }
  uint64_t j = 0;
  while (j < nd) {
    uint64_t j1 = j + 1;
    while (j1 < nd && j1 - j < max_docs &&
           (!c.streamed || (c.offsets[j1 + 1] - c.offsets[j]) * row_bytes_streamed <= cap_bytes)) {
      ++j1;
    }
    chunks.push_back({j, j1});
    j = j1;
  }
  return chunks;
}

// Runs fn(chunk, doc view) for every chunk, on b.stream. Streamed corpora: chunk c + 1 is copied on b.copy

uint64_t StreamedRowBytes(const Corpus& c, bool need_codes) {
  return c.info.orig_row_bytes + sizeof(maxsim_vector_meta) + (need_codes ? c.info.padded_dim : 0);
}

Status CheckPair(const PackedInfo& q, const Corpus& c) {
  if (q.dim != c.info.dim) {
    return Fail(MAXSIM_ERR_DIM_MISMATCH, "queries have dim %u but the corpus has dim %u", q.dim, c.info.dim);
  }
  return Status::Ok();
}

}  // namespace mscuda
