// SPDX-License-Identifier: Apache-2.0
// Inference on a device corpus: the score matrix (also into device memory, for benchmarks), candidate lists
// and top-k, with resident corpora scored in one pass and streamed ones chunk by chunk (the next chunk copied
// while the current one is scored).
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <limits>
#include <vector>

#include "backend.h"
#include "host_util.h"
#include "plan.h"

namespace mscuda {
namespace {

template <typename F>
Status ForEachChunk(Backend& b, const Corpus& c, const std::vector<DocChunk>& chunks, bool need_codes, F&& fn) {
  const PackedInfo& in = c.info;
  if (!c.streamed) {
    const SetsView v = c.View();
    for (const DocChunk& ch : chunks) {
      SetsView d = v.Sets(ch.j0, ch.j1);
      d.n_rows = c.offsets[ch.j1] - c.offsets[ch.j0];
      MSC_RETURN(fn(ch, d));
    }
    return Status::Ok();
  }
  // Layout of a chunk buffer: originals | meta | codes.
  uint64_t max_rows = 0;
  for (const DocChunk& ch : chunks) max_rows = std::max(max_rows, c.offsets[ch.j1] - c.offsets[ch.j0]);
  const uint64_t orig_bytes = RoundUp(max_rows * in.orig_row_bytes, kAlign);
  const uint64_t meta_bytes = RoundUp(max_rows * sizeof(maxsim_vector_meta), kAlign);
  const uint64_t code_bytes = need_codes ? RoundUp(max_rows * in.padded_dim, kAlign) : 0;
  for (int i = 0; i < 2; ++i) MSC_RETURN(b.chunk[i].Reserve(orig_bytes + meta_bytes + code_bytes + kAlign, "a streamed chunk"));
  const uint8_t* h = c.host.data();
  auto enqueue_copy = [&](size_t k) -> Status {
    const DocChunk& ch = chunks[k];
    const int buf = static_cast<int>(k & 1);
    const uint64_t r0 = c.offsets[ch.j0], rows = c.offsets[ch.j1] - r0;
    uint8_t* dst = b.chunk[buf].data();
    MSC_CUDA(cudaStreamWaitEvent(b.copy, b.done[buf], 0));
    MSC_CUDA(cudaMemcpyAsync(dst, h + in.off_orig + r0 * in.orig_row_bytes, rows * in.orig_row_bytes,
                             cudaMemcpyHostToDevice, b.copy));
    MSC_CUDA(cudaMemcpyAsync(dst + orig_bytes, h + in.off_meta + r0 * sizeof(maxsim_vector_meta),
                             rows * sizeof(maxsim_vector_meta), cudaMemcpyHostToDevice, b.copy));
    if (need_codes) {
      MSC_CUDA(cudaMemcpyAsync(dst + orig_bytes + meta_bytes, h + in.off_codes + r0 * in.padded_dim,
                               rows * in.padded_dim, cudaMemcpyHostToDevice, b.copy));
    }
    MSC_CUDA(cudaEventRecord(b.copied[buf], b.copy));
    return Status::Ok();
  };
  // The done events start "complete" so that the first two copies do not wait.
  MSC_CUDA(cudaEventRecord(b.done[0], b.stream));
  MSC_CUDA(cudaEventRecord(b.done[1], b.stream));
  if (!chunks.empty()) MSC_RETURN(enqueue_copy(0));
  const uint64_t* dev_offsets = reinterpret_cast<const uint64_t*>(c.dev.data());
  for (size_t k = 0; k < chunks.size(); ++k) {
    if (k + 1 < chunks.size()) MSC_RETURN(enqueue_copy(k + 1));
    const int buf = static_cast<int>(k & 1);
    MSC_CUDA(cudaStreamWaitEvent(b.stream, b.copied[buf], 0));
    const DocChunk& ch = chunks[k];
    SetsView d = RowsFromChunkStart(in, c.offsets.data(), dev_offsets, ch.j0, ch.j1);
    const uint8_t* base = b.chunk[buf].data();
    d.orig = base;
    d.row_bytes = in.orig_row_bytes;
    d.dtype = in.dtype;
    d.dim = in.dim;
    d.meta = reinterpret_cast<const maxsim_vector_meta*>(base + orig_bytes);
    d.codes = need_codes ? reinterpret_cast<const int8_t*>(base + orig_bytes + meta_bytes) : nullptr;
    d.code_bytes = in.padded_dim;
    MSC_RETURN(fn(ch, d));
    MSC_CUDA(cudaEventRecord(b.done[buf], b.stream));
  }
  return Status::Ok();
}

// Waits for the stream, then QueryValues.
Status SyncedQueryValues(Backend& b, DeviceQueries& q) {
  MSC_CUDA(cudaStreamSynchronize(b.stream));
  return QueryValues(b, q);
}

// Dense queries carry originals only: a kernel mode that reads codes cannot take them (DenseQueryModes keeps
// such modes packed, so this fails only on a disagreement between the two).
Status CodesPresent(const DeviceQueries& q, bool need_codes) {
  if (need_codes && q.view.codes == nullptr) {
    return Fail(MAXSIM_ERR_INTERNAL, "queries arrived dense but the kernel for this mode reads int8 codes");
  }
  return Status::Ok();
}

void FillStats(maxsim_stats* st, uint64_t pairs, uint64_t query_tokens, const ull* counters) {
  if (!st) return;
  *st = maxsim_stats{};
  st->pairs = pairs;
  st->query_tokens = query_tokens;
  if (counters) {
    st->refined = counters[0];
    st->multi_candidate = counters[1];
  }
}

}  // namespace

Status ScoreMatrixDevice(Backend& b, const DeviceQueries& q, const Corpus& c, int metric, int mode, float* d_scores,
                         int32_t* d_argmax, unsigned long long* d_counters, cudaStream_t stream) {
  if (c.streamed) return Fail(MAXSIM_ERR_UNSUPPORTED, "ScoreMatrixDevice needs a resident corpus");
  MSC_RETURN(CheckPair(q.info, c));
  const uint64_t nq = q.info.n_sets, nd = c.info.n_sets;
  const bool wg = UseScreenWgmma(b, mode, q, c, metric, d_argmax != nullptr);
  if (wg) MSC_RETURN(EnsureDocScaleCodes(b, c));
  const SetsView d = c.View();
  const int kmode = wg ? static_cast<int>(MAXSIM_MODE_CERTIFIED) : b.KernelMode(mode, q.view, q.max_len, nq * nd);
  const Plan plan = wg ? MakeScreenWgmmaPlan(b, q.max_len) : MakePlan(b, q.view, d, q.max_len, kmode);
  uint8_t* partials = nullptr;
  if (plan.PartialBytes(nq * nd) > 0) {
    MSC_RETURN(b.scratch.Reserve(plan.PartialBytes(nq * nd), "partial results"));
    partials = b.scratch.data();
  }
  const ForwardArgs a = MatrixForwardArgs(q.view, d, nq, nd, metric, kmode, d_counters, d_scores, d_argmax, partials, plan);
  return LaunchForward(b, plan, a, stream);
}

Status ScoreMatrix(Backend& b, const maxsim_plugin_score_args& a) {
  MSC_CUDA(cudaSetDevice(b.device));
  const Corpus& c = *reinterpret_cast<const Corpus*>(a.corpus);
  DeviceQueries q;
  MSC_RETURN(PrepareQueries(b, a, &q));
  MSC_RETURN(CheckPair(q.info, c));
  const uint64_t nq = q.info.n_sets, nd = c.info.n_sets;
  const uint64_t qpos = nq ? q.host_offsets[nq] : 0;
  // ABI 1.3: the corpus's documents may be columns [c0, c0 + nd) of a wider matrix of ld columns (a shard's
  // part of a sharded call): the results go straight there, and nowhere else.
  uint64_t ld = nd, c0 = 0;
  if (a.struct_size >= offsetof(maxsim_plugin_score_args, matrix_first_column) + sizeof(a.matrix_first_column) &&
      a.matrix_columns != 0) {
    ld = a.matrix_columns;
    c0 = a.matrix_first_column;
    if (c0 > ld || nd > ld - c0) {
      return Fail(MAXSIM_ERR_INVALID_ARGUMENT, "score matrix columns [%llu, +%llu) lie outside its %llu columns",
                  static_cast<ull>(c0), static_cast<ull>(nd), static_cast<ull>(ld));
    }
  }
  if (nq == 0 || nd == 0) {
    MSC_RETURN(SyncedQueryValues(b, q));
    FillStats(a.stats, 0, 0, nullptr);
    return Status::Ok();
  }
  const bool wg = UseScreenWgmma(b, a.mode, q, c, a.metric, a.argmax != nullptr);
  if (wg) MSC_RETURN(EnsureDocScaleCodes(b, c));
  const int mode = wg ? static_cast<int>(MAXSIM_MODE_CERTIFIED) : b.KernelMode(a.mode, q.view, q.max_len, nq * nd);
  const bool need_codes = mode != MAXSIM_MODE_EXACT;
  MSC_RETURN(CodesPresent(q, need_codes));
  SetsView probe_d = c.streamed ? SetsView{} : c.View();
  if (c.streamed) {
    probe_d.orig = nullptr;  // chunk buffers are 256-byte aligned, rows as in the buffer
    probe_d.row_bytes = c.info.orig_row_bytes;
    probe_d.dtype = c.info.dtype;
    probe_d.dim = c.info.dim;
  }
  const Plan plan = wg ? MakeScreenWgmmaPlan(b, q.max_len) : MakePlan(b, q.view, probe_d, q.max_len, mode);
  // Per-document-column device bytes of one chunk: scores, argmax, partials.
  const uint64_t col_bytes = nq * 4 + (a.argmax ? qpos * 4 : 0) + plan.PartialBytes(nq);
  const uint64_t max_docs = std::max<uint64_t>(1, kOutputBudget / std::max<uint64_t>(1, col_bytes));
  const std::vector<DocChunk> chunks = MakeChunks(c, max_docs, StreamedRowBytes(c, need_codes), b.chunk_bytes);
  uint64_t cn = 0;
  for (const DocChunk& ch : chunks) cn = std::max(cn, ch.j1 - ch.j0);
  // Host staging: the chunk's scores, its argmax, and the screening counters (read back with the last chunk's
  // results, so the call waits for the device once per chunk). Small results are written there by the kernels
  // themselves, through the stage's device mapping; larger ones are copied from device scratch.
  const uint64_t o_hargmax = RoundUp(nq * cn * 4, kAlign);
  const uint64_t h_cnt = o_hargmax + RoundUp(a.argmax ? qpos * cn * 4 : 0, kAlign);
  const bool mapped = h_cnt <= b.mapped_results_max;
  Carver cv;
  const uint64_t o_scores = mapped ? 0 : cv.Add(nq * cn * 4);
  const uint64_t o_argmax = a.argmax && !mapped ? cv.Add(qpos * cn * 4) : 0;
  const uint64_t o_part = cv.Add(plan.PartialBytes(nq * cn));
  const uint64_t o_cnt = cv.Add(16);
  MSC_RETURN(b.scratch.Reserve(cv.size(), "scores and partial results"));
  MSC_RETURN(b.stage.Reserve(h_cnt + 16, "result staging"));
  uint8_t* s = b.scratch.data();
  uint8_t* hs = b.stage.data();
  uint8_t* ha = hs + o_hargmax;
  float* out_scores = reinterpret_cast<float*>(mapped ? b.stage.device_data() : s + o_scores);
  int32_t* out_argmax = !a.argmax ? nullptr
                        : reinterpret_cast<int32_t*>(mapped ? b.stage.device_data() + o_hargmax : s + o_argmax);
  // Only screening counts (refined tokens, multi-candidate tokens); exact kernels take no counters.
  ull* counters = need_codes ? reinterpret_cast<ull*>(s + o_cnt) : nullptr;
  if (counters) MSC_CUDA(cudaMemsetAsync(counters, 0, 16, b.stream));
  const bool single = chunks.size() == 1;
  Status st = ForEachChunk(b, c, chunks, need_codes, [&](const DocChunk& ch, const SetsView& d) -> Status {
    const uint64_t n = ch.j1 - ch.j0;
    const ForwardArgs fa =
        MatrixForwardArgs(q.view, d, nq, n, a.metric, mode, counters, out_scores, out_argmax, s + o_part, plan);
    MSC_RETURN(LaunchForward(b, plan, fa, b.stream));
    CheckQueriesOnHost(q);  // while the device works
    // Copied results come back through the pinned stage too (a copy into the caller's pageable memory would be
    // staged by the driver, synchronously, and costs more than the memcpy below).
    if (!mapped) {
      MSC_CUDA(cudaMemcpyAsync(hs, out_scores, nq * n * 4, cudaMemcpyDeviceToHost, b.stream));
      if (a.argmax) MSC_CUDA(cudaMemcpyAsync(ha, out_argmax, qpos * n * 4, cudaMemcpyDeviceToHost, b.stream));
    }
    if (counters && ch.j1 == nd) {
      MSC_CUDA(cudaMemcpyAsync(b.stage.data() + h_cnt, counters, 16, cudaMemcpyDeviceToHost, b.stream));
    }
    MSC_CUDA(cudaStreamSynchronize(b.stream));
    MSC_RETURN(QueryValues(b, q));  // nothing reaches the caller's outputs from bad queries
    if (single && ld == nd) {
      std::memcpy(a.scores, hs, nq * n * 4);
      if (a.argmax) std::memcpy(a.argmax, ha, qpos * n * 4);
    } else {
      const uint64_t j0 = c0 + ch.j0;  // the chunk's first column in the caller's matrix
      for (uint64_t i = 0; i < nq; ++i) {
        std::memcpy(a.scores + i * ld + j0, hs + i * n * 4, n * 4);
        if (a.argmax) {
          const uint64_t oi = q.host_offsets[i], lq = q.host_offsets[i + 1] - oi;
          std::memcpy(a.argmax + ld * oi + j0 * lq, ha + (n * oi) * 4, n * lq * 4);
        }
      }
    }
    return Status::Ok();
  });
  MSC_RETURN(st);
  ull hc[2] = {0, 0};
  if (counters) std::memcpy(hc, b.stage.data() + h_cnt, 16);
  FillStats(a.stats, nq * nd, qpos * nd, counters ? hc : nullptr);
  return Status::Ok();
}

Status ScoreCandidates(Backend& b, const maxsim_plugin_score_args& a) {
  MSC_CUDA(cudaSetDevice(b.device));
  const Corpus& c = *reinterpret_cast<const Corpus*>(a.corpus);
  DeviceQueries q;
  MSC_RETURN(PrepareQueries(b, a, &q));
  MSC_RETURN(CheckPair(q.info, c));
  const uint64_t nq = q.info.n_sets, nd = c.info.n_sets;
  const uint64_t total = nq ? a.cand_offsets[nq] : 0;
  if (total == 0) {
    MSC_RETURN(SyncedQueryValues(b, q));
    FillStats(a.stats, 0, 0, nullptr);
    return Status::Ok();
  }
  const int mode = b.KernelMode(a.mode, q.view, q.max_len, total);
  const bool need_codes = mode != MAXSIM_MODE_EXACT;
  MSC_RETURN(CodesPresent(q, need_codes));
  // Pairs sorted by chunk (a stable counting sort), with their output slot and argmax base.
  SetsView probe_d;
  if (!c.streamed) probe_d = c.View();
  probe_d.row_bytes = c.info.orig_row_bytes;
  probe_d.dtype = c.info.dtype;
  probe_d.dim = c.info.dim;
  Plan plan = MakePlan(b, q.view, probe_d, q.max_len, mode);
  plan.batch_terms = false;  // pair lists never run the batch kernel: no room for its terms
  const std::vector<DocChunk> chunks =
      MakeChunks(c, c.streamed ? nd : nd, StreamedRowBytes(c, need_codes), b.chunk_bytes);
  std::vector<uint32_t> chunk_of(nd);
  for (size_t k = 0; k < chunks.size(); ++k) {
    for (uint64_t j = chunks[k].j0; j < chunks[k].j1; ++j) chunk_of[j] = static_cast<uint32_t>(k);
  }
  std::vector<uint64_t> start(chunks.size() + 1, 0);
  for (uint64_t e = 0; e < total; ++e) ++start[chunk_of[a.candidates[e]] + 1];
  for (size_t k = 0; k < chunks.size(); ++k) start[k + 1] += start[k];
  std::vector<uint32_t> pq(total), pd(total);
  std::vector<uint64_t> slot(total), am(total);
  std::vector<uint64_t> fill(start.begin(), start.end() - 1);
  uint64_t am_total = 0, qtok = 0;
  for (uint64_t i = 0; i < nq; ++i) {
    const uint64_t lq = q.host_offsets[i + 1] - q.host_offsets[i];
    for (uint64_t e = a.cand_offsets[i]; e < a.cand_offsets[i + 1]; ++e) {
      const uint64_t j = a.candidates[e];
      const uint32_t k = chunk_of[j];
      const uint64_t pos = fill[k]++;
      pq[pos] = static_cast<uint32_t>(i);
      pd[pos] = static_cast<uint32_t>(j - chunks[k].j0);
      slot[pos] = e;
      am[pos] = am_total;
      am_total += lq;
      qtok += lq;
    }
  }
  // Batches of pairs so that the partials stay within the output budget.
  const uint64_t per_pair = plan.PartialBytes(1);
  const uint64_t batch = per_pair ? std::max<uint64_t>(1, kOutputBudget / per_pair) : total;
  Carver cv;
  const uint64_t o_pq = cv.Add(total * 4), o_pd = cv.Add(total * 4), o_slot = cv.Add(total * 8),
                 o_am = cv.Add(total * 8), o_scores = cv.Add(total * 4),
                 o_argmax = a.argmax ? cv.Add(am_total * 4) : 0, o_part = cv.Add(plan.PartialBytes(std::min(batch, total))),
                 o_cnt = cv.Add(16);
  MSC_RETURN(b.scratch.Reserve(cv.size(), "candidate lists and partial results"));
  MSC_RETURN(b.stage.Reserve(total * 24 + 4 * kAlign, "candidate staging"));
  uint8_t* s = b.scratch.data();
  uint64_t used = 0;
  MSC_RETURN(StageUpload(b, used, s + o_pq, pq.data(), total * 4, b.stream));
  MSC_RETURN(StageUpload(b, used, s + o_pd, pd.data(), total * 4, b.stream));
  MSC_RETURN(StageUpload(b, used, s + o_slot, slot.data(), total * 8, b.stream));
  ull* counters = reinterpret_cast<ull*>(s + o_cnt);
  MSC_CUDA(cudaMemsetAsync(counters, 0, 16, b.stream));
  // The argmax base list is uploaded separately (the stage holds 24 bytes per pair).
  MSC_CUDA(cudaStreamSynchronize(b.stream));
  // The results below are copied straight into the caller's outputs: dense queries' check (enqueued before the
  // uploads above) is final now.
  MSC_RETURN(QueryValues(b, q));
  used = 0;
  MSC_RETURN(StageUpload(b, used, s + o_am, am.data(), total * 8, b.stream));
  Status st = ForEachChunk(b, c, chunks, need_codes, [&](const DocChunk& ch, const SetsView& d) -> Status {
    const size_t k = static_cast<size_t>(&ch - chunks.data());
    for (uint64_t p0 = start[k]; p0 < start[k + 1]; p0 += batch) {
      const uint64_t n = std::min(batch, start[k + 1] - p0);
      ForwardArgs fa;
      fa.q = q.view;
      fa.d = d;
      fa.d_device_memory = 1;  // a corpus's rows (resident image or streamed chunk)
      fa.cosine = a.metric == MAXSIM_METRIC_COSINE;
      fa.mode = mode;
      fa.counters = counters;
      fa.pairs.layout = kPairsList;
      fa.pairs.n_pairs = n;
      fa.pairs.pq = reinterpret_cast<const uint32_t*>(s + o_pq) + p0;
      fa.pairs.pd = reinterpret_cast<const uint32_t*>(s + o_pd) + p0;
      fa.pairs.pslot = reinterpret_cast<const uint64_t*>(s + o_slot) + p0;
      fa.pairs.scores = reinterpret_cast<float*>(s + o_scores);
      fa.pairs.argmax = a.argmax ? reinterpret_cast<int32_t*>(s + o_argmax) : nullptr;
      fa.pairs.am_base = reinterpret_cast<const uint64_t*>(s + o_am) + p0;
      fa.part.term = reinterpret_cast<float*>(s + o_part);
      fa.part.arg = reinterpret_cast<int32_t*>(s + o_part + n * plan.groups * plan.rows * 4);
      MSC_RETURN(LaunchForward(b, plan, fa, b.stream));
    }
    return Status::Ok();
  });
  MSC_RETURN(st);
  // argmax slots of list pairs were assigned in (query, candidate) order, which is maxsim.h's layout.
  MSC_CUDA(cudaMemcpyAsync(a.scores, s + o_scores, total * 4, cudaMemcpyDeviceToHost, b.stream));
  if (a.argmax) MSC_CUDA(cudaMemcpyAsync(a.argmax, s + o_argmax, am_total * 4, cudaMemcpyDeviceToHost, b.stream));
  ull hc[2] = {0, 0};
  MSC_CUDA(cudaMemcpyAsync(hc, counters, 16, cudaMemcpyDeviceToHost, b.stream));
  MSC_CUDA(cudaStreamSynchronize(b.stream));
  FillStats(a.stats, total, qtok, need_codes ? hc : nullptr);
  return Status::Ok();
}

Status TopK(Backend& b, const maxsim_plugin_score_args& a) {
  MSC_CUDA(cudaSetDevice(b.device));
  const Corpus& c = *reinterpret_cast<const Corpus*>(a.corpus);
  DeviceQueries q;
  MSC_RETURN(PrepareQueries(b, a, &q));
  MSC_RETURN(CheckPair(q.info, c));
  const uint64_t nq = q.info.n_sets, nd = c.info.n_sets, k = a.k;
  if (k == 0) return Fail(MAXSIM_ERR_INVALID_ARGUMENT, "k is 0 (ask for at least one document)");
  const uint64_t qpos = nq ? q.host_offsets[nq] : 0;
  const ull* keys = nullptr;  // nq rows of k keys in the pinned stage, `have` valid per row
  uint64_t have = 0;
  ull hc[2] = {0, 0};
  const bool wg = nq > 0 && nd > 0 && UseScreenWgmma(b, a.mode, q, c, a.metric, false);
  if (wg) MSC_RETURN(EnsureDocScaleCodes(b, c));
  const int mode = wg ? static_cast<int>(MAXSIM_MODE_CERTIFIED) : b.KernelMode(a.mode, q.view, q.max_len, nq * nd);
  const bool need_codes = mode != MAXSIM_MODE_EXACT;
  MSC_RETURN(CodesPresent(q, need_codes));
  if (nq > 0 && nd > 0) {
    SetsView probe_d;
    if (!c.streamed) probe_d = c.View();
    probe_d.row_bytes = c.info.orig_row_bytes;
    probe_d.dtype = c.info.dtype;
    probe_d.dim = c.info.dim;
    const Plan plan = wg ? MakeScreenWgmmaPlan(b, q.max_len) : MakePlan(b, q.view, probe_d, q.max_len, mode);
    const uint64_t col_bytes = nq * 4 + plan.PartialBytes(nq);
    const uint64_t max_docs = std::max<uint64_t>(1, kOutputBudget / std::max<uint64_t>(1, col_bytes));
    const std::vector<DocChunk> chunks = MakeChunks(c, max_docs, StreamedRowBytes(c, need_codes), b.chunk_bytes);
    uint64_t cn = 0;
    for (const DocChunk& ch : chunks) cn = std::max(cn, ch.j1 - ch.j0);
    Carver cv;
    const uint64_t o_scores = cv.Add(nq * cn * 4), o_part = cv.Add(plan.PartialBytes(nq * cn)),
                   o_run0 = cv.Add(nq * k * 8), o_run1 = cv.Add(nq * k * 8), o_cnt = cv.Add(16);
    MSC_RETURN(b.scratch.Reserve(cv.size(), "top-k scratch"));
    // The final keys and the counters come back through the pinned stage; the last merge writes small key lists
    // there itself, through the stage's device mapping.
    const uint64_t h_cnt = RoundUp(nq * k * 8, kAlign);
    MSC_RETURN(b.stage.Reserve(h_cnt + 16, "top-k staging"));
    const bool mapped = nq * k * 8 <= b.mapped_results_max;
    uint8_t* s = b.scratch.data();
    ull* run[2] = {reinterpret_cast<ull*>(s + o_run0), reinterpret_cast<ull*>(s + o_run1)};
    ull* counters = need_codes ? reinterpret_cast<ull*>(s + o_cnt) : nullptr;
    if (counters) MSC_CUDA(cudaMemsetAsync(counters, 0, 16, b.stream));
    int cur = 0;
    Status st = ForEachChunk(b, c, chunks, need_codes, [&](const DocChunk& ch, const SetsView& d) -> Status {
      const uint64_t n = ch.j1 - ch.j0;
      const ForwardArgs fa = MatrixForwardArgs(q.view, d, nq, n, a.metric, mode, counters,
                                               reinterpret_cast<float*>(s + o_scores), nullptr, s + o_part, plan);
      MSC_RETURN(LaunchForward(b, plan, fa, b.stream));
      CheckQueriesOnHost(q);  // while the device works
      ull* out = ch.j1 == nd && mapped ? reinterpret_cast<ull*>(b.stage.device_data()) : run[1 - cur];
      const cudaError_t e = LaunchTopkMerge(fa.pairs.scores, n, n, ch.j0, nq, run[cur], out, have, k, b.stream);
      if (e != cudaSuccess) return CudaFail(e, "launching the top-k merge");
      cur = 1 - cur;
      have = std::min(k, have + n);
      return Status::Ok();
    });
    MSC_RETURN(st);
    if (!mapped) MSC_CUDA(cudaMemcpyAsync(b.stage.data(), run[cur], nq * k * 8, cudaMemcpyDeviceToHost, b.stream));
    if (counters) MSC_CUDA(cudaMemcpyAsync(b.stage.data() + h_cnt, counters, 16, cudaMemcpyDeviceToHost, b.stream));
    MSC_RETURN(SyncedQueryValues(b, q));
    if (counters) std::memcpy(hc, b.stage.data() + h_cnt, 16);
    keys = reinterpret_cast<const ull*>(b.stage.data());
  } else {
    MSC_RETURN(SyncedQueryValues(b, q));
  }
  std::vector<ull> row(have);
  for (uint64_t i = 0; i < nq; ++i) {
    if (have) {
      std::memcpy(row.data(), keys + i * k, have * 8);
      std::sort(row.begin(), row.end(), [](ull x, ull y) { return x > y; });
    }
    for (uint64_t r = 0; r < k; ++r) {
      if (r < have) {
        const uint32_t ob = static_cast<uint32_t>(row[r] >> 32);
        const uint32_t bits = (ob & 0x80000000u) ? (ob & 0x7fffffffu) : ~ob;
        float v;
        std::memcpy(&v, &bits, 4);
        a.scores[i * k + r] = v;
        a.topk_index[i * k + r] = 0xffffffffull - static_cast<uint32_t>(row[r]);
      } else {
        a.scores[i * k + r] = -std::numeric_limits<float>::infinity();
        a.topk_index[i * k + r] = UINT64_MAX;
      }
    }
  }
  FillStats(a.stats, nq * nd, qpos * nd, need_codes ? hc : nullptr);
  return Status::Ok();
}

}  // namespace mscuda
