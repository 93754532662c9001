// SPDX-License-Identifier: Apache-2.0
// Training on dense device tensors: the forward (scores + argmax, exact, with the value check of maxsim.h on
// the device) and the backward (grad_Q, grad_D atomic or deterministic, with the argmax/grad check).
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#include "backend.h"
#include "host_util.h"
#include "plan.h"

namespace mscuda {
namespace {

struct DenseInfo {
  SetsView view;                     // offsets still to be pointed at the device copy (unless uniform)
  const uint64_t* offsets = nullptr; // the caller's host offsets (n_sets + 1); NULL when uniform
  uint64_t n_rows = 0, first_row = 0, max_len = 0;
  bool uniform = false;              // no offsets given: sets of set_length rows, addressed without a device copy
  // Row offset of set i (i <= n_sets). Uniform sets are not expanded into a list: a call's host work stays
  // independent of the number of sets (10,000 documents cost ~5 us per call to list).
  uint64_t Offset(uint64_t i) const { return uniform ? i * view.set_length : offsets[i]; }
  // The set holding row `row` (first_row <= row < n_rows).
  uint64_t SetOf(uint64_t row) const {
    if (uniform) return view.set_length ? row / view.set_length : 0;
    return static_cast<uint64_t>(std::upper_bound(offsets, offsets + view.n_sets + 1, row) - offsets) - 1;
  }
};

Status ReadDense(const maxsim_dense_sets* s, const char* role, DenseInfo* out) {
  if (s == nullptr) return Fail(MAXSIM_ERR_INVALID_ARGUMENT, "%s: NULL", role);
  if (s->memory != MAXSIM_MEMORY_CUDA) {
    return Fail(MAXSIM_ERR_INVALID_ARGUMENT, "%s: the CUDA backend's training calls take MAXSIM_MEMORY_CUDA tensors", role);
  }
  DenseInfo d;
  SetsView& v = d.view;
  v.orig = static_cast<const uint8_t*>(s->data);
  v.dtype = s->dtype;
  v.dim = s->dim;
  const uint64_t elem = s->dtype == MAXSIM_F32 ? 4 : 2;
  v.row_bytes = (s->row_stride ? s->row_stride : s->dim) * elem;
  v.mask = s->mask;
  v.n_sets = s->n_sets;
  v.set_length = s->set_length;
  d.offsets = s->offsets;
  d.uniform = s->offsets == nullptr;
  if (d.uniform && s->n_sets > 0 && s->set_length > UINT64_MAX / s->n_sets) {
    return Fail(MAXSIM_ERR_UNSUPPORTED, "%s: too many rows for the CUDA backend", role);
  }
  d.first_row = d.Offset(0);
  d.n_rows = d.Offset(s->n_sets);
  v.n_rows = d.n_rows - d.first_row;
  d.max_len = d.uniform ? (s->n_sets ? s->set_length : 0) : MaxLen(d.offsets, s->n_sets);
  if (d.max_len > 0x7fffffffull) return Fail(MAXSIM_ERR_UNSUPPORTED, "%s: a set is too long for the CUDA backend", role);
  if (s->n_sets > 0xffffffffull) return Fail(MAXSIM_ERR_UNSUPPORTED, "%s: too many sets for the CUDA backend", role);
  *out = std::move(d);
  return Status::Ok();
}

// Bytes [0, 16) of flags_host receive ReadFlags' copies; the words at these offsets are the forward's folded input
// check flag and the backward's "a check flag is set" word, both written by the kernels through the mapping.
constexpr uint64_t kFoldedFlagOffset = 32;
constexpr uint64_t kBackwardBadOffset = 36;

Status ReadFlags(Backend& b, const ull* dev_flags, cudaStream_t stream, ull* out2) {
  MSC_CUDA(cudaMemcpyAsync(b.flags_host.data(), dev_flags, 16, cudaMemcpyDeviceToHost, stream));
  MSC_CUDA(cudaStreamSynchronize(stream));
  std::memcpy(out2, b.flags_host.data(), 16);
  return Status::Ok();
}

// What both training calls read from their arguments: the device (made current; the previous call's staged
// uploads have been read), both dense sides of one dimension, the layout, and its pairs.
struct TrainInputs {
  cudaStream_t stream = nullptr;
  DenseInfo q, d;
  uint64_t nq = 0, nd = 0, n_pairs = 0;
  bool list = false;              // MAXSIM_LAYOUT_CANDIDATES
  bool diagonal = false;          // MAXSIM_LAYOUT_PAIRS
  std::vector<uint32_t> pq, pd;   // list: pair e = (query pq[e], document pd[e]), in candidate order
  std::vector<uint64_t> am;       // list: pair e's argmax base (query positions of the pairs before it)
  // The argmax entries of the pairs before pair p (p <= n_pairs; the argmax is pair-major in every layout):
  // EntriesBefore(n_pairs) is the whole argmax.
  uint64_t EntriesBefore(uint64_t p) const {
    if (p >= n_pairs) {
      if (list) return n_pairs ? am[n_pairs - 1] + (q.Offset(pq[n_pairs - 1] + 1) - q.Offset(pq[n_pairs - 1])) : 0;
      return (q.Offset(nq) - q.Offset(0)) * (diagonal ? 1 : nd);
    }
    if (list) return am[p];
    if (diagonal) return q.Offset(p) - q.Offset(0);
    const uint64_t i = p / nd, j = p % nd;
    return nd * (q.Offset(i) - q.Offset(0)) + j * (q.Offset(i + 1) - q.Offset(i));
  }
};

Status ReadTrainInputs(Backend& b, const maxsim_plugin_train_args& a, TrainInputs* out) {
  MSC_CUDA(cudaSetDevice(b.device));
  MSC_RETURN(StagesFree(b));  // only after a call that did not wait for its stream (benchmarks)
  TrainInputs& in = *out;
  in.stream = static_cast<cudaStream_t>(a.stream);
  MSC_RETURN(ReadDense(a.queries, "queries", &in.q));
  MSC_RETURN(ReadDense(a.documents, "documents", &in.d));
  if (in.q.view.dim != in.d.view.dim) {
    return Fail(MAXSIM_ERR_DIM_MISMATCH, "queries have dim %u but documents have dim %u", in.q.view.dim,
                in.d.view.dim);
  }
  in.nq = in.q.view.n_sets;
  in.nd = in.d.view.n_sets;
  in.list = a.layout == MAXSIM_LAYOUT_CANDIDATES;
  in.diagonal = a.layout == MAXSIM_LAYOUT_PAIRS;
  if (a.layout != MAXSIM_LAYOUT_MATRIX && !in.list && a.layout != MAXSIM_LAYOUT_PAIRS) {
    return Fail(MAXSIM_ERR_INVALID_ARGUMENT, "layout %d is not MATRIX, PAIRS or CANDIDATES", static_cast<int>(a.layout));
  }
  if (a.layout == MAXSIM_LAYOUT_PAIRS && in.nq != in.nd) {
    return Fail(MAXSIM_ERR_INVALID_ARGUMENT, "pairs layout needs as many query sets as document sets");
  }
  in.n_pairs = in.list ? (in.nq ? a.cand_offsets[in.nq] : 0) : a.layout == MAXSIM_LAYOUT_PAIRS ? in.nq : in.nq * in.nd;
  if (in.list) {
    in.pq.resize(in.n_pairs);
    in.pd.resize(in.n_pairs);
    in.am.resize(in.n_pairs);
    uint64_t base = 0;
    for (uint64_t i = 0; i < in.nq; ++i) {
      const uint64_t lq = in.q.Offset(i + 1) - in.q.Offset(i);
      for (uint64_t e = a.cand_offsets[i]; e < a.cand_offsets[i + 1]; ++e) {
        if (a.candidates[e] >= in.nd) {
          return Fail(MAXSIM_ERR_INVALID_ARGUMENT, "candidates[%llu] is not a document", static_cast<ull>(e));
        }
        in.pq[e] = static_cast<uint32_t>(i);
        in.pd[e] = static_cast<uint32_t>(a.candidates[e]);
        in.am[e] = base;
        base += lq;
      }
    }
  }
  return Status::Ok();
}

// Hands a stream-ordered call's slot back if the call fails before CommitSlot.
struct SlotGuard {
  Backend& b;
  DeferredSlot slot;
  ~SlotGuard() { AbandonSlot(b, slot); }
};

}  // namespace

bool StreamOrdered(const maxsim_plugin_train_args& a) {
  return a.struct_size >= offsetof(maxsim_plugin_train_args, call) + sizeof(a.call) &&
         (a.flags & MAXSIM_CALL_STREAM_ORDERED) != 0;
}

Status ForwardValueError(int side, ull set, ull token) {
  return Fail(MAXSIM_ERR_NON_FINITE, "%s: set %llu token %llu has a non-finite value or an L2 norm above 1e19",
              side == 0 ? "queries" : "documents", set, token);
}

Status BackwardValueError(const ull flags[2]) {
  if (flags[1] != ~0ull) return Fail(MAXSIM_ERR_NON_FINITE, "grad_scores[%llu] is not finite", flags[1] - 1);
  return Fail(MAXSIM_ERR_INVALID_ARGUMENT,
              "argmax[%llu] is not -1 or a kept token of its document; pass the forward's argmax unchanged "
              "(gradients were not computed for it)", flags[0] - 1);
}

Status TrainForward(Backend& b, const maxsim_plugin_train_args& a, int documents_device_memory) {
  TrainInputs in;
  MSC_RETURN(ReadTrainInputs(b, a, &in));
  cudaStream_t stream = in.stream;
  DenseInfo& q = in.q;
  DenseInfo& d = in.d;
  const uint64_t nq = in.nq, nd = in.nd, n_pairs = in.n_pairs;
  const bool list = in.list;
  const std::vector<uint32_t>& pq = in.pq;
  const std::vector<uint32_t>& pd = in.pd;
  const std::vector<uint64_t>& am = in.am;
  if (a.scores == nullptr && n_pairs > 0) return Fail(MAXSIM_ERR_INVALID_ARGUMENT, "scores output is NULL");
  const bool cosine = a.metric == MAXSIM_METRIC_COSINE;
  Plan plan = MakePlan(b, q.view, d.view, q.max_len, MAXSIM_MODE_EXACT);
  if (a.argmax != nullptr || in.list || a.layout == MAXSIM_LAYOUT_PAIRS) plan.batch_terms = false;  // no batch kernel
  Carver cv;
  const uint64_t o_qoff = cv.Add((nq + 1) * 8), o_doff = cv.Add((nd + 1) * 8), o_flag = cv.Add(16);
  const uint64_t o_qn = cosine ? cv.Add(q.n_rows * 4) : 0, o_dn = cosine ? cv.Add(d.n_rows * 4) : 0;
  const uint64_t o_pq = list ? cv.Add(n_pairs * 4) : 0, o_pd = list ? cv.Add(n_pairs * 4) : 0,
                 o_am = list ? cv.Add(n_pairs * 8) : 0;
  const uint64_t o_part = cv.Add(plan.PartialBytes(n_pairs));
  MSC_RETURN(b.scratch.Reserve(cv.size(), "training forward scratch"));
  MSC_RETURN(b.stage.Reserve((nq + nd + 2) * 8 + n_pairs * 16 + 8 * kAlign, "training staging"));
  if (a.peak_extra_bytes) *a.peak_extra_bytes = cv.size();
  uint8_t* s = b.scratch.data();
  uint64_t used = 0;
  // Uniform sets (no offsets) are addressed by set_length: nothing to upload.
  if (!q.uniform) MSC_RETURN(StageUpload(b, used, s + o_qoff, q.offsets, (nq + 1) * 8, stream));
  if (!d.uniform) MSC_RETURN(StageUpload(b, used, s + o_doff, d.offsets, (nd + 1) * 8, stream));
  if (list) {
    MSC_RETURN(StageUpload(b, used, s + o_pq, pq.data(), n_pairs * 4, stream));
    MSC_RETURN(StageUpload(b, used, s + o_pd, pd.data(), n_pairs * 4, stream));
    MSC_RETURN(StageUpload(b, used, s + o_am, am.data(), n_pairs * 8, stream));
  }
  MSC_RETURN(EndStaging(b, used, stream));
  q.view.offsets = q.uniform ? nullptr : reinterpret_cast<const uint64_t*>(s + o_qoff);
  d.view.offsets = d.uniform ? nullptr : reinterpret_cast<const uint64_t*>(s + o_doff);
  // A stream-ordered call checks into its slot's device words (clear when taken), settled on the device.
  const bool ordered = StreamOrdered(a) && b.sync_calls;
  SlotGuard guard{b, {}};
  if (ordered) MSC_RETURN(AcquireSlot(b, stream, &guard.slot));
  ull* flag = ordered ? guard.slot.dev->flags : reinterpret_cast<ull*>(s + o_flag);
  // The value check of maxsim.h. Dot: folded into the scoring kernels (ForwardArgs::bad: a non-finite kept
  // similarity), so the inputs are read once; only when it fires does RowCheck read them again to name the
  // offending token (or find that the similarity came from a masked query row: the results stand). Cosine needs
  // the per-row norms anyway, so RowCheck computes them and checks on the way.
  // The folded check's flag is a word of pinned host memory that the kernels write through its device mapping:
  // no memset before the launch and no copy after it, only the synchronisation the call needs anyway.
  const bool folded = !cosine;
  float* qn = cosine ? reinterpret_cast<float*>(s + o_qn) : nullptr;
  float* dn = cosine ? reinterpret_cast<float*>(s + o_dn) : nullptr;
  volatile unsigned int* bad_host = reinterpret_cast<volatile unsigned int*>(b.flags_host.data() + kFoldedFlagOffset);
  unsigned int* bad_dev = nullptr;
  if (folded && ordered) {
    bad_dev = &guard.slot.dev->gate;
  } else if (folded) {
    *bad_host = 0u;
    bad_dev = reinterpret_cast<unsigned int*>(b.flags_host.device_data() + kFoldedFlagOffset);
  } else {
    if (!ordered) MSC_CUDA(cudaMemsetAsync(flag, 0xff, 16, stream));
    cudaError_t e = LaunchRowCheck(q.view, q.first_row, q.n_rows, qn, flag, stream);
    if (e == cudaSuccess) e = LaunchRowCheck(d.view, d.first_row, d.n_rows, dn, flag + 1, stream);
    if (e != cudaSuccess) return CudaFail(e, "launching the input check");
  }
  q.view.norms = qn;
  d.view.norms = dn;
  ForwardArgs fa;
  fa.q = q.view;
  fa.d = d.view;
  fa.d_device_memory = documents_device_memory;
  fa.cosine = cosine;
  fa.mode = MAXSIM_MODE_EXACT;
  fa.pairs.layout = list ? kPairsList : a.layout == MAXSIM_LAYOUT_PAIRS ? kPairsDiagonal : kPairsMatrix;
  fa.pairs.n_pairs = n_pairs;
  fa.pairs.nd = nd;
  fa.pairs.scores = a.scores;
  fa.pairs.score_stride = nd;
  fa.pairs.argmax = a.argmax;
  fa.pairs.am_rows = nd;
  if (list) {
    fa.pairs.pq = reinterpret_cast<const uint32_t*>(s + o_pq);
    fa.pairs.pd = reinterpret_cast<const uint32_t*>(s + o_pd);
    fa.pairs.am_base = reinterpret_cast<const uint64_t*>(s + o_am);
  }
  if (plan.PartialBytes(n_pairs) > 0) {
    fa.part.term = reinterpret_cast<float*>(s + o_part);
    fa.part.arg = reinterpret_cast<int32_t*>(s + o_part + n_pairs * plan.groups * plan.rows * 4);
  }
  fa.bad = bad_dev;
  MSC_RETURN(LaunchForward(b, plan, fa, stream));
  if (ordered) {
    SettleArgs sa;
    sa.dev = guard.slot.dev;
    sa.words = guard.slot.words;
    sa.locate_rows = folded;
    sa.name_rows = true;
    sa.q = q.view;
    sa.d = d.view;
    sa.q_begin = q.first_row;
    sa.q_end = q.n_rows;
    sa.d_begin = d.first_row;
    sa.d_end = d.n_rows;
    sa.fill[0] = reinterpret_cast<uint32_t*>(a.scores);
    sa.fill_words[0] = n_pairs;
    sa.fill[1] = reinterpret_cast<uint32_t*>(a.argmax);
    sa.fill_words[1] = a.argmax ? in.EntriesBefore(n_pairs) : 0;
    return CommitSlot(b, guard.slot, sa, stream, false, a.call);
  }
  if (!b.sync_calls) return Status::Ok();
  ull flags[2];
  if (folded) {
    MSC_CUDA(cudaStreamSynchronize(stream));
    b.staged_pending = false;
    if (*bad_host == 0u) return Status::Ok();
    MSC_CUDA(cudaMemsetAsync(flag, 0xff, 16, stream));
    cudaError_t e = LaunchRowCheck(q.view, q.first_row, q.n_rows, nullptr, flag, stream);
    if (e == cudaSuccess) e = LaunchRowCheck(d.view, d.first_row, d.n_rows, nullptr, flag + 1, stream);
    if (e != cudaSuccess) return CudaFail(e, "launching the input check");
    MSC_RETURN(ReadFlags(b, flag, stream, flags));
  } else {
    MSC_RETURN(ReadFlags(b, flag, stream, flags));
    b.staged_pending = false;
  }
  if (flags[0] != ~0ull || flags[1] != ~0ull) {
    // Nothing the caller could take for an answer (either check): scores NaN, argmax -1.
    MSC_CUDA(cudaMemsetAsync(a.scores, 0xff, n_pairs * 4, stream));
    if (a.argmax) MSC_CUDA(cudaMemsetAsync(a.argmax, 0xff, in.EntriesBefore(n_pairs) * 4, stream));
    MSC_CUDA(cudaStreamSynchronize(stream));
  }
  for (int r = 0; r < 2; ++r) {
    if (flags[r] != ~0ull) {
      DenseInfo& x = r == 0 ? q : d;
      const uint64_t row = flags[r] - 1;
      const uint64_t set = x.SetOf(row);
      return ForwardValueError(r, set, row - x.Offset(set));
    }
  }
  return Status::Ok();
}

Status TrainBackward(Backend& b, const maxsim_plugin_train_args& a) {
  TrainInputs in;
  MSC_RETURN(ReadTrainInputs(b, a, &in));
  if (a.argmax == nullptr || a.grad_scores == nullptr) {
    return Fail(MAXSIM_ERR_INVALID_ARGUMENT, "backward needs argmax and grad_scores (both non-NULL)");
  }
  cudaStream_t stream = in.stream;
  const DenseInfo& q = in.q;
  const DenseInfo& d = in.d;
  const uint64_t nq = in.nq, nd = in.nd, dim = q.view.dim, n_pairs = in.n_pairs;
  const bool list = in.list;
  const std::vector<uint32_t>& pq = in.pq;
  const std::vector<uint32_t>& pd = in.pd;
  const std::vector<uint64_t>& am = in.am;
  // Deterministic grad_D: chunks of consecutive pairs of at most kIndexEntries argmax entries (fewer than 2^32
  // pairs) for its inverse index.
  // Deterministic grad_D of the matrix and pairs layouts: one launch (LaunchBackwardDoc) computes grad_Q, grad_D
  // and the check, with no index in device memory. Else the separate kernels: the check, grad_Q, and grad_D by
  // atomics (faster than the one launch: 0.121 against 0.130 ms for the in-batch step on an H100) or, for the
  // candidates layout, through the sorted index.
  const bool doc = b.tuning.doc_backward && a.deterministic && !list && a.grad_documents != nullptr;
  std::vector<uint64_t> chunk_pairs;  // chunk c is pairs [chunk_pairs[c], chunk_pairs[c + 1])
  uint64_t chunk_max = 0;
  if (!doc && a.deterministic && a.grad_documents != nullptr && n_pairs > 0) {
    if (d.n_rows >= 0xffffffffull || q.n_rows >= 0xffffffffull) {
      return Fail(MAXSIM_ERR_INVALID_ARGUMENT, "the deterministic backward takes fewer than 2^32 - 1 query and "
                  "document rows (use deterministic = 0)");
    }
    chunk_pairs.push_back(0);
    while (chunk_pairs.back() < n_pairs) {
      const uint64_t p0 = chunk_pairs.back(), e0 = in.EntriesBefore(p0);
      // The last p1 with in.EntriesBefore(p1) - e0 <= kIndexEntries, at least p0 + 1 (a longer pair is a chunk alone).
      uint64_t lo = p0 + 1, hi = std::min<uint64_t>(n_pairs, p0 + 0xffffffffull);
      while (lo < hi) {
        const uint64_t mid = lo + (hi - lo + 1) / 2;
        if (in.EntriesBefore(mid) - e0 <= kIndexEntries) lo = mid; else hi = mid - 1;
      }
      chunk_max = std::max(chunk_max, in.EntriesBefore(lo) - e0);
      chunk_pairs.push_back(lo);
    }
  }
  size_t sort_temp = 0;
  if (chunk_max) MSC_CUDA(GradDIndexTempBytes(chunk_max, static_cast<uint32_t>(d.n_rows), &sort_temp));
  Carver cv;
  const uint64_t o_qoff = cv.Add((nq + 1) * 8), o_doff = cv.Add((nd + 1) * 8);
  const uint64_t o_pq = list ? cv.Add(n_pairs * 4) : 0, o_pd = list ? cv.Add(n_pairs * 4) : 0,
                 o_am = list ? cv.Add(n_pairs * 8) : 0, o_qps = list ? cv.Add((nq + 1) * 8) : 0;
  const uint64_t o_keys = cv.Add(chunk_max * 4), o_keys_alt = cv.Add(chunk_max * 4), o_vals = cv.Add(chunk_max * 8),
                 o_vals_alt = cv.Add(chunk_max * 8), o_temp = cv.Add(sort_temp);
  MSC_RETURN(b.scratch.Reserve(cv.size(), "training backward scratch"));
  MSC_RETURN(b.stage.Reserve(2 * (nq + nd + 2) * 8 + n_pairs * 32 + 10 * kAlign, "training staging"));
  if (a.peak_extra_bytes) *a.peak_extra_bytes = cv.size();
  uint8_t* s = b.scratch.data();
  uint64_t used = 0;
  // Uniform sets (no offsets) are addressed by set_length: nothing to upload.
  if (!q.uniform) MSC_RETURN(StageUpload(b, used, s + o_qoff, q.offsets, (nq + 1) * 8, stream));
  if (!d.uniform) MSC_RETURN(StageUpload(b, used, s + o_doff, d.offsets, (nd + 1) * 8, stream));
  if (list) {
    MSC_RETURN(StageUpload(b, used, s + o_pq, pq.data(), n_pairs * 4, stream));
    MSC_RETURN(StageUpload(b, used, s + o_pd, pd.data(), n_pairs * 4, stream));
    MSC_RETURN(StageUpload(b, used, s + o_am, am.data(), n_pairs * 8, stream));
    MSC_RETURN(StageUpload(b, used, s + o_qps, a.cand_offsets, (nq + 1) * 8, stream));
  }
  MSC_RETURN(EndStaging(b, used, stream));
  BackwardArgs ba;
  ba.q = q.view;
  ba.d = d.view;
  ba.q.offsets = q.uniform ? nullptr : reinterpret_cast<const uint64_t*>(s + o_qoff);
  ba.d.offsets = d.uniform ? nullptr : reinterpret_cast<const uint64_t*>(s + o_doff);
  ba.pairs.layout = list ? kPairsList : a.layout == MAXSIM_LAYOUT_PAIRS ? kPairsDiagonal : kPairsMatrix;
  ba.pairs.n_pairs = n_pairs;
  ba.pairs.nd = nd;
  ba.pairs.argmax = a.argmax;
  ba.pairs.am_rows = nd;
  if (list) {
    ba.pairs.pq = reinterpret_cast<const uint32_t*>(s + o_pq);
    ba.pairs.pd = reinterpret_cast<const uint32_t*>(s + o_pd);
    ba.pairs.am_base = reinterpret_cast<const uint64_t*>(s + o_am);
    ba.q_pair_start = reinterpret_cast<const uint64_t*>(s + o_qps);
  }
  ba.argmax = a.argmax;
  ba.grad = a.grad_scores;
  ba.grad_q = a.grad_queries;
  ba.grad_d = a.grad_documents;
  // The check flags persist in device memory between calls: cleared (all ones) by a memset only when the last
  // call found a bad entry or did not wait for its kernels. A bad entry also sets a word of mapped pinned memory,
  // so that a good call reads nothing back: its kernels and one synchronisation are the whole call.
  // A stream-ordered call checks into its slot's device words instead (clear when taken), settled on the device.
  const bool ordered = StreamOrdered(a) && b.sync_calls;
  SlotGuard guard{b, {}};
  volatile unsigned int* bad_host = reinterpret_cast<volatile unsigned int*>(b.flags_host.data() + kBackwardBadOffset);
  if (ordered) {
    MSC_RETURN(AcquireSlot(b, stream, &guard.slot));
    ba.flag = guard.slot.dev->flags;
    ba.bad_host = &guard.slot.dev->gate;
  } else {
    MSC_RETURN(b.backward_flags.Reserve(16, "the backward's check flags"));
    ba.flag = reinterpret_cast<ull*>(b.backward_flags.data());
    if (!b.backward_flags_clear || !b.sync_calls) MSC_CUDA(cudaMemsetAsync(ba.flag, 0xff, 16, stream));
    b.backward_flags_clear = false;
    *bad_host = 0u;
    ba.bad_host = reinterpret_cast<unsigned int*>(b.flags_host.device_data() + kBackwardBadOffset);
  }
  cudaError_t e = cudaSuccess;
  if (doc) {
    // Rows before the first set belong to no set: zeroed, as the other path leaves them.
    if (a.grad_queries && q.first_row) MSC_CUDA(cudaMemsetAsync(a.grad_queries, 0, q.first_row * dim * 4, stream));
    if (d.first_row) MSC_CUDA(cudaMemsetAsync(a.grad_documents, 0, d.first_row * dim * 4, stream));
    e = LaunchBackwardDoc(ba, q.first_row, q.n_rows, d.max_len, stream);
    if (e != cudaSuccess) return CudaFail(e, "launching the backward");
  } else {
    e = LaunchBackwardCheck(ba, stream);
    if (e != cudaSuccess) return CudaFail(e, "launching the backward check");
    if (a.grad_queries) {
      if (q.first_row) MSC_CUDA(cudaMemsetAsync(a.grad_queries, 0, q.first_row * dim * 4, stream));
      e = LaunchGradQ(ba, q.first_row, q.n_rows, stream);
      if (e != cudaSuccess) return CudaFail(e, "launching grad_Q");
    }
    if (a.grad_documents) {
      MSC_CUDA(cudaMemsetAsync(a.grad_documents, 0, d.n_rows * dim * 4, stream));
      if (a.deterministic) {
        GradDIndex x;
        x.keys = reinterpret_cast<uint32_t*>(s + o_keys);
        x.keys_alt = reinterpret_cast<uint32_t*>(s + o_keys_alt);
        x.vals = reinterpret_cast<uint64_t*>(s + o_vals);
        x.vals_alt = reinterpret_cast<uint64_t*>(s + o_vals_alt);
        x.temp = s + o_temp;
        x.temp_bytes = sort_temp;
        x.sentinel = static_cast<uint32_t>(d.n_rows);
        for (size_t c = 0; c + 1 < chunk_pairs.size() && e == cudaSuccess; ++c) {
          x.entry0 = in.EntriesBefore(chunk_pairs[c]);
          e = LaunchGradDIndexed(ba, x, chunk_pairs[c], chunk_pairs[c + 1],
                                 in.EntriesBefore(chunk_pairs[c + 1]) - x.entry0, stream);
        }
      } else {
        e = LaunchGradDAtomic(ba, stream);
      }
      if (e != cudaSuccess) return CudaFail(e, "launching grad_D");
    }
  }
  if (ordered) {
    // A failed check leaves no gradient the caller could take for one: both outputs NaN.
    SettleArgs sa;
    sa.dev = guard.slot.dev;
    sa.words = guard.slot.words;
    sa.fill[0] = reinterpret_cast<uint32_t*>(a.grad_queries);
    sa.fill_words[0] = a.grad_queries ? q.n_rows * dim : 0;
    sa.fill[1] = reinterpret_cast<uint32_t*>(a.grad_documents);
    sa.fill_words[1] = a.grad_documents ? d.n_rows * dim : 0;
    return CommitSlot(b, guard.slot, sa, stream, true, a.call);
  }
  if (!b.sync_calls) return Status::Ok();
  MSC_CUDA(cudaStreamSynchronize(stream));
  b.staged_pending = false;
  if (*bad_host == 0u) {
    b.backward_flags_clear = true;  // clear at the start (memset or kept) and nothing reported
    return Status::Ok();
  }
  ull flags[2];
  MSC_RETURN(ReadFlags(b, ba.flag, stream, flags));
  if (flags[0] != ~0ull || flags[1] != ~0ull) return BackwardValueError(flags);
  return Status::Ok();
}

}  // namespace mscuda
