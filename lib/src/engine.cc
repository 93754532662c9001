// SPDX-License-Identifier: Apache-2.0
#include "engine.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "packed_handle.h"
#include "parallel.h"
#include "progress.h"

namespace maxsim {
namespace {

using ull = unsigned long long;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------------------------------------
// Dense value checks
// ---------------------------------------------------------------------------------------------------------

struct RowRejection {
  uint64_t set = UINT64_MAX;
  uint64_t token = 0;
  int64_t element = -1;  // first non-finite element, -1 for a norm rejection
  double norm = 0;
  // Whether row (s, t) comes before this rejection (set, token).
  bool Before(uint64_t s, uint64_t t) const { return s < set || (s == set && t < token); }
};

Status RejectionError(const char* role, const RowRejection& r) {
  if (r.element >= 0) {
    return Error(MAXSIM_ERR_NON_FINITE, "%s: set %llu token %llu has a non-finite value at element %lld", role,
                 static_cast<ull>(r.set), static_cast<ull>(r.token), static_cast<long long>(r.element));
  }
  return Error(MAXSIM_ERR_NON_FINITE,
               "%s: set %llu token %llu has L2 norm %g, above the supported 1e19 (f32 dot products could "
               "overflow); rescale the embeddings", role, static_cast<ull>(r.set), static_cast<ull>(r.token), r.norm);
}

void NoteRejection(const DenseView& v, uint64_t set, uint64_t row, const float* f32, const pack::RowStats& s,
                   RowRejection* r) {
  const uint64_t token = row - v.begin(set);
  if (!r->Before(set, token)) return;
  r->set = set;
  r->token = token;
  r->element = -1;
  if (!s.finite) {
    for (uint32_t k = 0; k < v.dim; ++k) {
      if (!std::isfinite(f32[k])) {
        r->element = k;
        break;
      }
    }
  }
  r->norm = std::sqrt(s.norm_sq);
}

// Checks every kept row of dense host sets (finite, norm <= 1e19) and keeps each row's stats if asked. only:
// the indices of the sets to check (nullptr: all); the error names the first rejected row in set order either way.
Status AnalyzeDense(const DenseView& v, const char* role, int threads, const pack::RowOps& row_ops,
                    std::vector<pack::RowStats>* stats, const std::vector<uint64_t>* only = nullptr) {
  if (stats) stats->assign(v.n_rows, pack::RowStats{});
  std::vector<RowRejection> rejections(static_cast<size_t>(std::max(1, threads)));
  const int64_t n = static_cast<int64_t>(only ? only->size() : v.n_sets);
  const float bound = pack::AcceptedElementBound(v.dim);
  ParallelTasks(threads, v.n_rows > 1024, n, 16, [&](int t) {
    return [&, widened = std::vector<float>(v.dim), &mine = rejections[static_cast<size_t>(t)]](int64_t i) mutable {
      const uint64_t set = only ? (*only)[static_cast<size_t>(i)] : static_cast<uint64_t>(i);
      for (uint64_t r = v.begin(set); r < v.end(set); ++r) {
        if (!v.kept(r)) continue;
        // Without stats, an f32 row inside the element bound is accepted on a compare alone (no norm).
        if (!stats && v.dtype == MAXSIM_F32 &&
            row_ops.rows_within(v.row(set, r), 1, v.row_bytes, v.dim, bound)) {
          continue;
        }
        const float* f32 = reinterpret_cast<const float*>(v.row(set, r));
        if (v.dtype != MAXSIM_F32) {
          row_ops.widen(v.row(set, r), v.dtype, v.dim, widened.data());
          f32 = widened.data();
        }
        const pack::RowStats s = row_ops.analyze(f32, v.dim);
        if (!s.finite || !pack::NormAccepted(s.norm_sq)) NoteRejection(v, set, r, f32, s, &mine);
        if (stats) (*stats)[r] = s;
      }
    };
  });
  const RowRejection* first = nullptr;
  for (const RowRejection& r : rejections) {
    if (r.set != UINT64_MAX && (first == nullptr || first->Before(r.set, r.token))) first = &r;
  }
  if (first) return RejectionError(role, *first);
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------------------
// Queries
// ---------------------------------------------------------------------------------------------------------

struct QuerySet {
  PreparedQuery q;
  uint32_t positions = 0;             // Lq_i, masked positions included
  const uint32_t* kept = nullptr;     // kept token -> position; nullptr: identity
  const float* inv_norm = nullptr;    // per kept token (cosine)
  uint64_t token_offset = 0;          // o_i
};

struct QueryBatch {
  std::vector<QuerySet> sets;
  std::vector<float> qt, rows, inv_norm;
  std::vector<int8_t> codes;
  std::vector<maxsim_vector_meta> meta;
  std::vector<uint32_t> kept;
  std::vector<uint8_t> layouts;  // kernel-specific query layouts (KernelOps::prepare)
  uint64_t total_positions = 0;
};

// Runs the kernel's query-preparation hook once per query set: one zero-filled, 64-byte aligned slice each.
void PrepareLayouts(const KernelOps& ops, maxsim_mode mode, int threads, QueryBatch* b) {
  if (ops.layout_bytes == nullptr || ops.prepare == nullptr) return;
  const size_t n = b->sets.size();
  std::vector<size_t> before(n + 1, 0);
  for (size_t i = 0; i < n; ++i) before[i + 1] = before[i] + RoundUp(ops.layout_bytes(b->sets[i].q, mode), 64);
  if (before[n] == 0) return;
  b->layouts.assign(before[n] + 64, 0);
  uint8_t* base = b->layouts.data();
  base += (64 - reinterpret_cast<uintptr_t>(base) % 64) % 64;
  ParallelTasks(threads, n > 16, static_cast<int64_t>(n), 4, [&](int) {
    return [&](int64_t ii) {
      const size_t i = static_cast<size_t>(ii);
      if (before[i + 1] == before[i]) return;
      PreparedQuery& q = b->sets[i].q;
      q.layout = base + before[i];
      ops.prepare(q, mode, base + before[i]);
    };
  });
}

Status PrepareQueries(const SetsRef& Q, const ScoreRequest& req, int threads, const KernelOps& ops, int variant,
                      const pack::RowOps& row_ops, QueryBatch* out) {
  const bool need_codes = req.mode != MAXSIM_MODE_EXACT;
  const uint64_t n = Q.n_sets();
  const uint32_t dim = Q.dim();
  const uint32_t padded_dim = static_cast<uint32_t>(RoundUp(dim, MAXSIM_PACK_ALIGN));
  QueryBatch& b = *out;
  b.sets.assign(n, QuerySet{});
  // Sizes first, so that every set's storage is a fixed slice.
  std::vector<uint64_t> kept_before(n + 1, 0), qt_before(n + 1, 0);
  uint64_t positions = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t pos = Q.positions(i);
    if (pos > UINT32_MAX / 2) {
      return Error(MAXSIM_ERR_INVALID_ARGUMENT, "queries: set %llu has %llu tokens (at most %u supported)",
                   static_cast<ull>(i), static_cast<ull>(pos), UINT32_MAX / 2);
    }
    uint64_t kept = pos;
    if (!Q.is_packed && Q.dense.mask) {
      kept = 0;
      for (uint64_t r = Q.dense.begin(i); r < Q.dense.end(i); ++r) kept += Q.dense.mask[r] != 0;
    }
    QuerySet& qs = b.sets[i];
    qs.positions = static_cast<uint32_t>(pos);
    qs.token_offset = positions;
    qs.q.n_tokens = static_cast<uint32_t>(kept);
    qs.q.n_padded = static_cast<uint32_t>(RoundUp(kept, 16));
    qs.q.lane_stride = LaneStride(qs.q.n_padded);
    qs.q.dim = dim;
    qs.q.padded_dim = padded_dim;
    qs.q.variant = variant;
    positions += pos;
    kept_before[i + 1] = kept_before[i] + kept;
    qt_before[i + 1] = qt_before[i] + static_cast<uint64_t>(qs.q.lane_stride) * dim;
  }
  b.total_positions = positions;
  const uint64_t total_kept = kept_before[n];
  b.qt.assign(qt_before[n], 0.0f);
  b.rows.resize(total_kept * dim);
  b.inv_norm.resize(total_kept);
  const bool dense_meta = !Q.is_packed;
  if (dense_meta) b.meta.assign(total_kept, maxsim_vector_meta{0, 0, 0, 0});
  if (dense_meta && need_codes) b.codes.resize(total_kept * padded_dim);
  if (!Q.is_packed && Q.dense.mask) b.kept.resize(total_kept);

  std::vector<RowRejection> rejections(static_cast<size_t>(std::max(1, threads)));
  const int64_t ni = static_cast<int64_t>(n);
  ParallelTasks(threads, total_kept > 256, ni, 4, [&](int t) {
    return [&, &mine = rejections[static_cast<size_t>(t)]](int64_t ii) mutable {
      const uint64_t i = static_cast<uint64_t>(ii);
      QuerySet& qs = b.sets[i];
      float* rows = b.rows.data() + kept_before[i] * dim;
      float* qt = b.qt.data() + qt_before[i];
      float* inv = b.inv_norm.data() + kept_before[i];
      qs.q.rows = rows;
      qs.q.qt = qt;
      qs.inv_norm = inv;
      if (Q.is_packed) {
        const pack::PackedView& p = Q.packed;
        const uint64_t first = p.offsets[i];
        for (uint32_t s = 0; s < qs.q.n_tokens; ++s) {
          row_ops.widen(p.originals + (first + s) * p.orig_row_bytes, p.dtype, dim, rows + s * dim);
        }
        qs.q.meta = p.meta + first;
        qs.q.codes = p.codes + first * p.padded_dim;
      } else {
        const DenseView& v = Q.dense;
        maxsim_vector_meta* meta = b.meta.data() + kept_before[i];
        int8_t* codes = need_codes ? b.codes.data() + kept_before[i] * padded_dim : nullptr;
        uint32_t* kept = v.mask ? b.kept.data() + kept_before[i] : nullptr;
        uint32_t s = 0;
        for (uint64_t r = v.begin(i); r < v.end(i); ++r) {
          if (!v.kept(r)) continue;
          float* row = rows + static_cast<uint64_t>(s) * dim;
          row_ops.widen(v.row(i, r), v.dtype, dim, row);
          const pack::RowStats st = row_ops.analyze(row, dim);
          if (!st.finite || !pack::NormAccepted(st.norm_sq)) {
            NoteRejection(v, i, r, row, st, &mine);
          } else if (need_codes) {
            row_ops.quantize(row, dim, padded_dim, st, codes + static_cast<uint64_t>(s) * padded_dim, &meta[s]);
          } else {
            meta[s].norm = pack::NormFromSquares(st.norm_sq);
          }
          if (kept) kept[s] = static_cast<uint32_t>(r - v.begin(i));
          ++s;
        }
        qs.q.meta = meta;
        qs.q.codes = codes;
        qs.kept = kept;
      }
      for (uint32_t s = 0; s < qs.q.n_tokens; ++s) inv[s] = InvNorm(qs.q.meta[s].norm);
      // Transposed in blocks of 16 tokens (one 64-byte line of qt per k), not token by token: for long
      // queries a token's column touches dim lines far apart, and the blocks keep them in L1.
      for (uint32_t s0 = 0; s0 < qs.q.n_tokens; s0 += 16) {
        const uint32_t s1 = std::min(qs.q.n_tokens, s0 + 16);
        for (uint32_t k = 0; k < dim; ++k) {
          float* out = qt + static_cast<uint64_t>(k) * qs.q.lane_stride;
          for (uint32_t s = s0; s < s1; ++s) out[s] = rows[static_cast<uint64_t>(s) * dim + k];
        }
      }
    };
  });
  const RowRejection* first = nullptr;
  for (const RowRejection& r : rejections) {
    if (r.set != UINT64_MAX && (first == nullptr || first->Before(r.set, r.token))) first = &r;
  }
  if (first) return RejectionError("queries", *first);
  PrepareLayouts(ops, req.mode, threads, out);
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------------------
// Documents
// ---------------------------------------------------------------------------------------------------------

struct DocSource {
  const SetsRef* d = nullptr;
  const pack::RowOps* row_ops = nullptr;
  bool need_codes = false;
  bool need_meta = false;
  // Dense documents are checked either once up front (dense_stats then holds every row's stats when need_meta),
  // or, when the call materialises every document it must check at least once (every document for the matrix
  // and top-k, the listed ones for candidates), one by one while each is in cache: by DocMaterializer::Get when
  // need_meta (the stats are computed there, before quantising), else by DocMaterializer::Verify after the
  // document was scored (exact dot scoring reads the originals only, so the kernel streams them from memory as
  // it does a packed corpus, and the check re-reads them from cache).
  bool lazy_check = false;
  float bound = 0;  // pack::AcceptedElementBound(dim), for Verify
  std::vector<pack::RowStats> dense_stats;
};

// every_doc: the call materialises every document it must check at least once (unless cancelled), so the
// values may be checked as they are materialised (FirstRejection gives the error when one fails).
Status PrepareDocs(const SetsRef& D, const ScoreRequest& req, int threads, bool every_doc,
                   const pack::RowOps& row_ops, DocSource* src) {
  src->d = &D;
  src->row_ops = &row_ops;
  src->need_codes = req.mode != MAXSIM_MODE_EXACT;
  src->need_meta = src->need_codes || req.metric == MAXSIM_METRIC_COSINE;
  if (D.is_packed) return Status::Ok();
  if (every_doc && D.dense.memory == MAXSIM_MEMORY_HOST) {
    src->lazy_check = true;
    src->bound = pack::AcceptedElementBound(D.dense.dim);
    return Status::Ok();
  }
  return AnalyzeDense(D.dense, "documents", threads, row_ops, src->need_meta ? &src->dense_stats : nullptr);
}

// After a call whose DocMaterializer rejected a document: the error naming the first rejected row of all
// documents, or of the documents in `only` (the same one the up-front check names, whatever the thread count
// and schedule).
Status FirstRejection(const DocSource& src, int threads, const std::vector<uint64_t>* only = nullptr) {
  Status st = AnalyzeDense(src.d->dense, "documents", threads, *src.row_ops, nullptr, only);
  if (st.ok()) return Error(MAXSIM_ERR_INTERNAL, "documents: a row was rejected, then accepted on a second look");
  return st;
}

// Per-thread: turns document set j into a DocRef (compacting masked rows, quantising dense rows on demand).
class DocMaterializer {
 public:
  // *map: compact token -> position (nullptr when they are the same). False: a kept row of document j is not
  // accepted (non-finite or norm above the limit; only with src.lazy_check and need_meta), and *out is not usable.
  bool Get(const DocSource& src, uint64_t j, DocRef* out, const uint32_t** map) {
    const SetsRef& D = *src.d;
    DocRef d;
    d.dim = D.dim();
    d.dtype = D.dtype();
    *map = nullptr;
    if (D.is_packed) {
      const pack::PackedView& p = D.packed;
      const uint64_t first = p.offsets[j];
      d.n_tokens = static_cast<uint32_t>(p.offsets[j + 1] - first);
      d.originals = p.originals + first * p.orig_row_bytes;
      d.orig_row_bytes = p.orig_row_bytes;
      d.codes = p.codes + first * p.padded_dim;
      d.padded_dim = p.padded_dim;
      d.meta = p.meta + first;
      d.serial = j + 1;
      *out = d;
      return true;
    }
    const DenseView& v = D.dense;
    const uint64_t begin = v.begin(j), end = v.end(j);
    const uint64_t elem_bytes = static_cast<uint64_t>(v.dim) * (v.dtype == MAXSIM_F32 ? 4 : 2);
    if (v.mask) {
      map_.clear();
      for (uint64_t r = begin; r < end; ++r) {
        if (v.mask[r]) map_.push_back(static_cast<uint32_t>(r - begin));
      }
      compact_.resize(map_.size() * elem_bytes);
      for (size_t t = 0; t < map_.size(); ++t) {
        std::memcpy(compact_.data() + t * elem_bytes, v.row(j, begin + map_[t]), elem_bytes);
      }
      d.n_tokens = static_cast<uint32_t>(map_.size());
      d.originals = compact_.data();
      d.orig_row_bytes = elem_bytes;
      *map = map_.data();
    } else {
      d.n_tokens = static_cast<uint32_t>(end - begin);
      d.originals = v.row(j, begin);
      d.orig_row_bytes = v.row_bytes;
    }
    widened_.resize(v.dim);
    const bool f32_rows = v.dtype == MAXSIM_F32;
    // Row r as f32 values (widened into widened_ for f16 / bf16).
    auto values = [&](uint64_t r) -> const float* {
      if (f32_rows) return reinterpret_cast<const float*>(v.row(j, r));
      src.row_ops->widen(v.row(j, r), v.dtype, v.dim, widened_.data());
      return widened_.data();
    };
    const pack::RowStats* stats = src.need_meta && !src.lazy_check ? src.dense_stats.data() : nullptr;
    if (src.need_meta && src.lazy_check) {
      stats_.resize(d.n_tokens);
      for (uint32_t t = 0; t < d.n_tokens; ++t) {
        const uint64_t r = begin + (*map ? (*map)[t] : t);
        const pack::RowStats st = src.row_ops->analyze(values(r), v.dim);
        if (!st.finite || !pack::NormAccepted(st.norm_sq)) return false;
        stats_[t] = st;
      }
    }
    if (src.need_meta) {
      meta_.resize(d.n_tokens);
      d.padded_dim = static_cast<uint32_t>(RoundUp(v.dim, MAXSIM_PACK_ALIGN));
      if (src.need_codes) codes_.resize(static_cast<size_t>(d.n_tokens) * d.padded_dim);
      for (uint32_t t = 0; t < d.n_tokens; ++t) {
        const uint64_t r = begin + (*map ? (*map)[t] : t);
        const pack::RowStats& st = stats ? stats[r] : stats_[t];
        if (src.need_codes) {
          src.row_ops->quantize(values(r), v.dim, d.padded_dim, st,
                                codes_.data() + static_cast<size_t>(t) * d.padded_dim, &meta_[t]);
        } else {
          meta_[t] = maxsim_vector_meta{0, pack::NormFromSquares(st.norm_sq), 0, 0};
        }
      }
      d.meta = meta_.data();
      d.codes = src.need_codes ? codes_.data() : nullptr;
    }
    d.serial = j + 1;
    *out = d;
    return true;
  }

  // After document d (from Get) was scored: false if one of its rows is not accepted. Only exact dot scoring of
  // lazily checked dense documents checks here (every other case was checked before or in Get): the compare-only
  // test of pack::AcceptedElementBound over the whole document, and the exact per-row test only if that fails.
  bool Verify(const DocSource& src, const DocRef& d) {
    if (!src.lazy_check || src.need_meta || d.n_tokens == 0) return true;
    const DenseView& v = src.d->dense;
    if (v.dtype == MAXSIM_F32 &&
        src.row_ops->rows_within(d.originals, d.n_tokens, d.orig_row_bytes, v.dim, src.bound)) {
      return true;
    }
    widened_.resize(v.dim);
    for (uint32_t t = 0; t < d.n_tokens; ++t) {
      const uint8_t* row = d.originals + static_cast<uint64_t>(t) * d.orig_row_bytes;
      const float* f32 = reinterpret_cast<const float*>(row);
      if (v.dtype != MAXSIM_F32) {
        src.row_ops->widen(row, v.dtype, v.dim, widened_.data());
        f32 = widened_.data();
      }
      const pack::RowStats st = src.row_ops->analyze(f32, v.dim);
      if (!st.finite || !pack::NormAccepted(st.norm_sq)) return false;
    }
    return true;
  }

 private:
  std::vector<uint8_t> compact_;
  std::vector<uint32_t> map_;
  std::vector<maxsim_vector_meta> meta_;
  std::vector<int8_t> codes_;
  std::vector<float> widened_;
  std::vector<pack::RowStats> stats_;
};

// ---------------------------------------------------------------------------------------------------------
// One pair
// ---------------------------------------------------------------------------------------------------------

struct ThreadState {
  KernelScratch scratch;
  DocMaterializer docs;
  std::vector<float> best;
  std::vector<int32_t> arg;
  ScreenCounters counters;
  uint64_t pairs = 0;
  uint64_t query_tokens = 0;
  uint64_t docs_pruned = 0;
  // Batched screening (KernelOps::screened_batch): the block's non-empty documents and their indices.
  std::vector<DocRef> batch;
  std::vector<uint64_t> batch_index;
  std::vector<uint8_t> pruned;
};

// A score: the double sum of the per-token maxima rounded once to f32. Accepted inputs keep every per-token
// value finite (norms <= 1e19), but enough of them near 1e38 sum beyond the f32 range: such a sum saturates to
// +-FLT_MAX, so that -inf stays the score of an empty document only.
float RoundScore(double sum) {
  constexpr double kMax = std::numeric_limits<float>::max();
  return static_cast<float>(std::clamp(sum, -kMax, kMax));
}

// The keys -> score step for one query token set and document: the double sum over kept tokens in order (cosine:
// each key times the query token's 1/norm), rounded once to f32; writes the qs.positions argmax values if asked
// (doc_map: the compact token -> position map of a document with masked rows, else nullptr).
float ScoreFromKeys(const QuerySet& qs, bool cosine, const float* best, const int32_t* arg, const uint32_t* doc_map,
                    int32_t* argmax) {
  double sum = 0.0;
  for (uint32_t s = 0; s < qs.q.n_tokens; ++s) {
    const float value = cosine ? best[s] * qs.inv_norm[s] : best[s];
    sum += static_cast<double>(value);
  }
  if (argmax) {
    if (qs.kept) std::fill(argmax, argmax + qs.positions, -1);
    for (uint32_t s = 0; s < qs.q.n_tokens; ++s) {
      const int32_t a = arg[s];
      const int32_t pos = a < 0 ? -1 : (doc_map ? static_cast<int32_t>(doc_map[a]) : a);
      argmax[qs.kept ? qs.kept[s] : s] = pos;
    }
  }
  return RoundScore(sum);
}

// Scores prepared query qs against document d, writes qs.positions argmax values (if argmax) and returns the
// score: -inf for an empty document, else ScoreFromKeys of the kernel's keys.
float ScorePair(const QuerySet& qs, const DocRef& d, const uint32_t* doc_map, const KernelOps& ops,
                const ScoreRequest& req, ThreadState& ts, int32_t* argmax) {
  ++ts.pairs;
  ts.query_tokens += qs.q.n_tokens;
  if (d.n_tokens == 0 || qs.q.n_tokens == 0) {
    if (argmax) std::fill(argmax, argmax + qs.positions, -1);
    return d.n_tokens == 0 ? kNegInf : 0.0f;
  }
  float* best = KernelScratch::Grow(ts.best, qs.q.n_tokens);
  int32_t* arg = KernelScratch::Grow(ts.arg, qs.q.n_tokens);
  if (req.mode == MAXSIM_MODE_EXACT) {
    ops.exact(qs.q, d, req.metric, best, arg, ts.scratch);
  } else {
    ops.screened(qs.q, d, req.metric, req.mode, best, arg, ts.scratch, &ts.counters);
  }
  return ScoreFromKeys(qs, req.metric == MAXSIM_METRIC_COSINE, best, arg, doc_map, argmax);
}


// Materialises document j, hands it to score(d, map) and checks it after (DocMaterializer::Get, then Verify).
// False, with *rejected set, when one of its rows is not accepted: the caller ends its task.
template <typename Score>
bool ScoreChecked(const DocSource& src, uint64_t j, ThreadState& ts, std::atomic<bool>* rejected, Score score) {
  DocRef d;
  const uint32_t* map = nullptr;
  if (!ts.docs.Get(src, j, &d, &map)) {
    rejected->store(true, std::memory_order_relaxed);
    return false;
  }
  score(d, map);
  if (!ts.docs.Verify(src, d)) {
    rejected->store(true, std::memory_order_relaxed);
    return false;
  }
  return true;
}

// Whether screened scoring goes through KernelOps::screened_batch: certified/approximate on packed documents
// (whose DocRefs stay valid for the whole call, unlike materialised dense ones).
bool UseBatch(const KernelOps& ops, const ScoreRequest& req, const SetsRef& D) {
  return ops.screened_batch != nullptr && req.mode != MAXSIM_MODE_EXACT && D.is_packed;
}

// Fills ts.batch / ts.batch_index with the non-empty documents doc_of(p) for p in [p0, p1) (batch_index holds
// p), and hands each empty one to on_empty(d, map, p): it scores -inf without a kernel call.
template <typename DocOf, typename OnEmpty>
void CollectBatch(const DocSource& src, uint64_t p0, uint64_t p1, DocOf doc_of, ThreadState& ts, OnEmpty on_empty) {
  ts.batch.clear();
  ts.batch_index.clear();
  for (uint64_t p = p0; p < p1; ++p) {
    DocRef d;
    const uint32_t* map = nullptr;
    ts.docs.Get(src, doc_of(p), &d, &map);  // packed documents (UseBatch): always accepted
    if (d.n_tokens == 0) {
      on_empty(d, map, p);
      continue;
    }
    ts.batch.push_back(d);
    ts.batch_index.push_back(p);
  }
}

// Scores query qs against ts.batch (non-empty packed documents) in one kernel call: scores[i] for document i
// (unless pruned[i] is set on return, when `prune` is given), argmax[i] (if argmax) its qs.positions slots.
// The same results as ScorePair for every document that is not pruned.
void ScoreBatch(const QuerySet& qs, const KernelOps& ops, const ScoreRequest& req, ThreadState& ts,
                ScreenPrune* prune, float* scores, int32_t* const* argmax) {
  const size_t n = ts.batch.size();
  ts.pairs += n;
  ts.query_tokens += static_cast<uint64_t>(qs.q.n_tokens) * n;
  if (prune) std::fill(prune->pruned, prune->pruned + n, 0);
  if (n == 0) return;
  if (qs.q.n_tokens == 0) {
    for (size_t i = 0; i < n; ++i) {
      scores[i] = 0.0f;
      if (argmax && argmax[i]) std::fill(argmax[i], argmax[i] + qs.positions, -1);
    }
    return;
  }
  const size_t nt = qs.q.n_tokens;
  float* best = KernelScratch::Grow(ts.best, nt * n);
  int32_t* arg = KernelScratch::Grow(ts.arg, nt * n);
  ops.screened_batch(qs.q, ts.batch.data(), n, req.metric, req.mode, best, arg, ts.scratch, &ts.counters, prune);
  const bool cosine = req.metric == MAXSIM_METRIC_COSINE;
  for (size_t i = 0; i < n; ++i) {
    if (prune && prune->pruned[i]) {
      ++ts.docs_pruned;
      continue;
    }
    scores[i] = ScoreFromKeys(qs, cosine, best + i * nt, arg + i * nt, nullptr, argmax ? argmax[i] : nullptr);
  }
}

void SumStats(const std::vector<ThreadState>& states, maxsim_stats* stats) {
  if (!stats) return;
  *stats = maxsim_stats{};
  for (const ThreadState& ts : states) {
    stats->pairs += ts.pairs;
    stats->query_tokens += ts.query_tokens;
    stats->refined += ts.counters.refined;
    stats->multi_candidate += ts.counters.multi_candidate;
    stats->docs_pruned += ts.docs_pruned;
  }
}

// Certified scoring of dense host documents quantises each document it scores (once per materialisation, never
// kept across calls), which costs about as much as scoring it exactly against 100-200 query tokens: screening pays
// only when enough query tokens share each quantised document. Below kDenseCertifiedMinTokens such calls run the
// exact path, whose scores and argmaxes certified mode returns bit for bit by contract (only the statistics
// differ: nothing is refined). python/benchmarks/results/dense-modes.json (1000 dense documents of 180 tokens,
// d 128, one thread): screening is about even with exact at 8-12 queries of 32 tokens and 0.76x its time at 16.
constexpr uint64_t kDenseCertifiedMinTokens = 256;

// The request the engine runs: certified on dense documents becomes exact when fewer than
// kDenseCertifiedMinTokens query tokens are scored against each materialised document (tokens_per_document).
ScoreRequest EffectiveRequest(const ScoreRequest& req, const SetsRef& D, uint64_t tokens_per_document) {
  ScoreRequest r = req;
  if (req.mode == MAXSIM_MODE_CERTIFIED && !D.is_packed && tokens_per_document < kDenseCertifiedMinTokens) {
    r.mode = MAXSIM_MODE_EXACT;
  }
  return r;
}

// Query token positions of all query sets, and of the longest one.
void QueryTokens(const SetsRef& Q, uint64_t* total, uint64_t* longest) {
  *total = 0;
  *longest = 0;
  for (uint64_t i = 0; i < Q.n_sets(); ++i) {
    *total += Q.positions(i);
    *longest = std::max(*longest, Q.positions(i));
  }
}

Status CheckDims(const SetsRef& q, const SetsRef& d) {
  if (q.dim() != d.dim()) {
    return Error(MAXSIM_ERR_DIM_MISMATCH, "queries have dim %u but documents have dim %u", q.dim(), d.dim());
  }
  if (q.memory() != MAXSIM_MEMORY_HOST || d.memory() != MAXSIM_MEMORY_HOST) {
    return Error(MAXSIM_ERR_BACKEND_UNAVAILABLE,
                 "inputs in CUDA memory need the cuda backend (MAXSIM_BACKEND=cuda with the CUDA plugin); the CPU "
                 "engine reads host memory only");
  }
  return Status::Ok();
}

}  // namespace

// -------------------------------------------------------------------------------------------------------------
// Sets
// -------------------------------------------------------------------------------------------------------------

Status ResolveSets(const maxsim_sets* sets, const char* role, SetsRef* out) {
  if (sets == nullptr) return Error(MAXSIM_ERR_INVALID_ARGUMENT, "%s: maxsim_sets pointer is NULL", role);
  if ((sets->packed == nullptr) == (sets->dense == nullptr)) {
    return Error(MAXSIM_ERR_INVALID_ARGUMENT, "%s: set exactly one of maxsim_sets.packed and maxsim_sets.dense",
                 role);
  }
  SetsRef r;
  if (sets->packed) {
    r.is_packed = true;
    r.handle = sets->packed;
    r.packed = sets->packed->view;
  } else {
    r.dense_src = sets->dense;
    MAXSIM_RETURN_IF_ERROR(ResolveDense(sets->dense, role, &r.dense));
    // Uniform sets (no offsets) all have set_length tokens: one check, not one per set.
    const uint64_t checked = r.dense.offsets ? r.dense.n_sets : std::min<uint64_t>(r.dense.n_sets, 1);
    for (uint64_t i = 0; i < checked; ++i) {
      if (r.dense.length(i) > UINT32_MAX / 2) {
        return Error(MAXSIM_ERR_INVALID_ARGUMENT, "%s: set %llu has %llu tokens (at most %u supported)", role,
                     static_cast<ull>(i), static_cast<ull>(r.dense.length(i)), UINT32_MAX / 2);
      }
    }
  }
  *out = r;
  return Status::Ok();
}

Status CheckDenseValues(const DenseView& v, const char* role, int threads, const pack::RowOps& row_ops) {
  return AnalyzeDense(v, role, threads, row_ops, nullptr);
}

Status CheckCandidates(const uint64_t* cand_offsets, const uint64_t* candidates, uint64_t nq, uint64_t nd,
                       uint64_t* total) {
  if (cand_offsets == nullptr) return Error(MAXSIM_ERR_INVALID_ARGUMENT, "cand_offsets is NULL");
  if (cand_offsets[0] != 0) {
    return Error(MAXSIM_ERR_INVALID_ARGUMENT, "cand_offsets[0] is %llu, expected 0", static_cast<ull>(cand_offsets[0]));
  }
  for (uint64_t i = 0; i < nq; ++i) {
    if (cand_offsets[i + 1] < cand_offsets[i]) {
      return Error(MAXSIM_ERR_INVALID_ARGUMENT, "cand_offsets decrease at query %llu", static_cast<ull>(i));
    }
  }
  *total = cand_offsets[nq];
  if (*total > 0 && candidates == nullptr) return Error(MAXSIM_ERR_INVALID_ARGUMENT, "candidates is NULL");
  for (uint64_t c = 0; c < *total; ++c) {
    if (candidates[c] >= nd) {
      return Error(MAXSIM_ERR_INVALID_ARGUMENT, "candidates[%llu] = %llu is not a document index (there are %llu)",
                   static_cast<ull>(c), static_cast<ull>(candidates[c]), static_cast<ull>(nd));
    }
  }
  return Status::Ok();
}

// -------------------------------------------------------------------------------------------------------------
// Operations
// -------------------------------------------------------------------------------------------------------------

Status Engine::ScoreMatrix(const SetsRef& Q, const SetsRef& D, const ScoreRequest& request, float* scores,
                           int32_t* argmax, maxsim_stats* stats) const {
  MAXSIM_RETURN_IF_ERROR(CheckDims(Q, D));
  uint64_t q_tokens = 0, q_longest = 0;
  QueryTokens(Q, &q_tokens, &q_longest);
  const ScoreRequest req = EffectiveRequest(request, D, q_tokens);  // a document meets every query (or a chunk)
  if (scores == nullptr) return Error(MAXSIM_ERR_INVALID_ARGUMENT, "scores output is NULL");
  QueryBatch qb;
  MAXSIM_RETURN_IF_ERROR(PrepareQueries(Q, req, threads_, *kernel_->ops, variant_, row_ops_, &qb));
  const uint64_t nq = Q.n_sets(), nd = D.n_sets();
  DocSource src;
  MAXSIM_RETURN_IF_ERROR(PrepareDocs(D, req, threads_, nq > 0, row_ops_, &src));
  std::vector<ThreadState> states(static_cast<size_t>(threads_));
  if (nq == 0 || nd == 0) {
    SumStats(states, stats);
    return Status::Ok();
  }
  // Tasks: (query chunk, document block). Blocks keep a document hot in cache across all queries of a chunk;
  // queries are split only when there are too few document blocks to feed every thread.
  // ~32 blocks per thread: with dynamic scheduling the last task ends at most 1/32 of a thread's share late
  // (2 threads on 1000 documents: 67 tasks, ideal speed-up 1.97x; with 8 per thread it was 17 tasks, 1.89x).
  const uint64_t block = std::clamp<uint64_t>(nd / (static_cast<uint64_t>(threads_) * 32), 1, 64);
  const uint64_t n_blocks = (nd + block - 1) / block;
  uint64_t qchunk = nq;
  if (n_blocks < static_cast<uint64_t>(threads_) * 4) {
    qchunk = std::max<uint64_t>(1, nq / (static_cast<uint64_t>(threads_) * 4));
  }
  const uint64_t n_qchunks = (nq + qchunk - 1) / qchunk;
  const int64_t n_tasks = static_cast<int64_t>(n_blocks * n_qchunks);
  const KernelOps& ops = *kernel_->ops;
  const bool batched = UseBatch(ops, req, D);
  Progress progress(nq * nd);
  std::atomic<bool> rejected{false};  // a document failed the check in DocMaterializer::Get
  ParallelTasks(threads_, n_tasks > 1, n_tasks, 1, [&](int t) {
    return [&, &ts = states[static_cast<size_t>(t)], bscores = std::vector<float>(), bargmax = std::vector<int32_t*>()](int64_t task) mutable {
      if (progress.cancelled() || rejected.load(std::memory_order_relaxed)) return;
      const uint64_t qc = static_cast<uint64_t>(task) / n_blocks;
      const uint64_t db = static_cast<uint64_t>(task) % n_blocks;
      const uint64_t q0 = qc * qchunk, q1 = std::min(nq, q0 + qchunk);
      const uint64_t d0 = db * block, d1 = std::min(nd, d0 + block);
      progress.Advance((q1 - q0) * (d1 - d0));  // counted as a task starts: within one task of the truth
      if (batched) {
        // One kernel call per query and run of documents (the kernel overlaps a document's refinement with
        // the next one's screening). With several queries, runs of 8 documents stay in L2 across them.
        const uint64_t run = q1 - q0 == 1 ? d1 - d0 : 8;
        for (uint64_t r0 = d0; r0 < d1; r0 += run) {
          const uint64_t r1 = std::min(d1, r0 + run);
          CollectBatch(src, r0, r1, [](uint64_t j) { return j; }, ts, [&](const DocRef& d, const uint32_t* map, uint64_t j) {
            for (uint64_t i = q0; i < q1; ++i) {
              const QuerySet& qs = qb.sets[i];
              int32_t* am = argmax ? argmax + nd * qs.token_offset + j * qs.positions : nullptr;
              scores[i * nd + j] = ScorePair(qs, d, map, ops, req, ts, am);
            }
          });
          const size_t n = ts.batch.size();
          bscores.resize(n);
          bargmax.resize(n);
          for (uint64_t i = q0; i < q1; ++i) {
            const QuerySet& qs = qb.sets[i];
            for (size_t b = 0; b < n; ++b) {
              bargmax[b] = argmax ? argmax + nd * qs.token_offset + ts.batch_index[b] * qs.positions : nullptr;
            }
            ScoreBatch(qs, ops, req, ts, nullptr, bscores.data(), argmax ? bargmax.data() : nullptr);
            for (size_t b = 0; b < n; ++b) scores[i * nd + ts.batch_index[b]] = bscores[b];
          }
        }
        return;
      }
      for (uint64_t j = d0; j < d1; ++j) {
        const bool accepted = ScoreChecked(src, j, ts, &rejected, [&](const DocRef& d, const uint32_t* map) {
          for (uint64_t i = q0; i < q1; ++i) {
            const QuerySet& qs = qb.sets[i];
            int32_t* am = argmax ? argmax + nd * qs.token_offset + j * qs.positions : nullptr;
            scores[i * nd + j] = ScorePair(qs, d, map, ops, req, ts, am);
          }
        });
        if (!accepted) break;
      }
    };
  });
  if (rejected.load()) return FirstRejection(src, threads_);
  MAXSIM_RETURN_IF_ERROR(progress.Finish("maxsim_score_matrix"));
  SumStats(states, stats);
  return Status::Ok();
}

Status Engine::ScoreCandidates(const SetsRef& Q, const SetsRef& D, const uint64_t* cand_offsets,
                               const uint64_t* candidates, const ScoreRequest& request, float* scores, int32_t* argmax,
                               maxsim_stats* stats) const {
  MAXSIM_RETURN_IF_ERROR(CheckDims(Q, D));
  uint64_t q_tokens = 0, q_longest = 0;
  QueryTokens(Q, &q_tokens, &q_longest);
  const ScoreRequest req = EffectiveRequest(request, D, q_longest);  // a candidate meets one query
  const uint64_t nq = Q.n_sets(), nd = D.n_sets();
  uint64_t total = 0;
  MAXSIM_RETURN_IF_ERROR(CheckCandidates(cand_offsets, candidates, nq, nd, &total));
  if (scores == nullptr && total > 0) return Error(MAXSIM_ERR_INVALID_ARGUMENT, "scores output is NULL");
  QueryBatch qb;
  MAXSIM_RETURN_IF_ERROR(PrepareQueries(Q, req, threads_, *kernel_->ops, variant_, row_ops_, &qb));
  // Dense documents: only the listed ones are read, and each is checked as it is scored, so that the call's
  // time and memory follow the candidates, not the corpus.
  DocSource src;
  MAXSIM_RETURN_IF_ERROR(PrepareDocs(D, req, threads_, /*every_doc=*/true, row_ops_, &src));
  // argmax base of query i: sum over earlier queries of K_i' * Lq_i'.
  std::vector<uint64_t> base(nq + 1, 0);
  for (uint64_t i = 0; i < nq; ++i) {
    uint64_t add = 0;
    if (MulOverflows(cand_offsets[i + 1] - cand_offsets[i], qb.sets[i].positions, &add) ||
        AddOverflows(base[i], add, &base[i + 1])) {
      return Error(MAXSIM_ERR_INVALID_ARGUMENT, "argmax size overflows");
    }
  }
  std::vector<ThreadState> states(static_cast<size_t>(threads_));
  const uint64_t block = 16;
  const int64_t n_tasks = static_cast<int64_t>((total + block - 1) / block);
  const KernelOps& ops = *kernel_->ops;
  const bool batched = UseBatch(ops, req, D);
  Progress progress(total);
  std::atomic<bool> rejected{false};  // a listed document failed the check in DocMaterializer::Get / Verify
  ParallelTasks(threads_, n_tasks > 1, n_tasks, 1, [&](int t) {
    return [&, &ts = states[static_cast<size_t>(t)], bscores = std::vector<float>(), bargmax = std::vector<int32_t*>()](int64_t task) mutable {
      if (progress.cancelled() || rejected.load(std::memory_order_relaxed)) return;
      const uint64_t c0 = static_cast<uint64_t>(task) * block, c1 = std::min(total, c0 + block);
      progress.Advance(c1 - c0);
      uint64_t i = static_cast<uint64_t>(std::upper_bound(cand_offsets, cand_offsets + nq + 1, c0) - cand_offsets) - 1;
      if (batched) {
        // One kernel call per run of candidates of the same query.
        for (uint64_t r0 = c0; r0 < c1;) {
          while (cand_offsets[i + 1] <= r0) ++i;
          const uint64_t r1 = std::min(c1, cand_offsets[i + 1]);
          const QuerySet& qs = qb.sets[i];
          CollectBatch(src, r0, r1, [&](uint64_t c) { return candidates[c]; }, ts,
                       [&](const DocRef& d, const uint32_t* map, uint64_t c) {
                         int32_t* am = argmax ? argmax + base[i] + (c - cand_offsets[i]) * qs.positions : nullptr;
                         scores[c] = ScorePair(qs, d, map, ops, req, ts, am);
                       });
          const size_t n = ts.batch.size();
          bscores.resize(n);
          bargmax.resize(n);
          for (size_t b = 0; b < n; ++b) {
            const uint64_t c = ts.batch_index[b];
            bargmax[b] = argmax ? argmax + base[i] + (c - cand_offsets[i]) * qs.positions : nullptr;
          }
          ScoreBatch(qs, ops, req, ts, nullptr, bscores.data(), argmax ? bargmax.data() : nullptr);
          for (size_t b = 0; b < n; ++b) scores[ts.batch_index[b]] = bscores[b];
          r0 = r1;
        }
        return;
      }
      for (uint64_t c = c0; c < c1; ++c) {
        while (cand_offsets[i + 1] <= c) ++i;
        const QuerySet& qs = qb.sets[i];
        const bool accepted = ScoreChecked(src, candidates[c], ts, &rejected, [&](const DocRef& d, const uint32_t* map) {
          int32_t* am = argmax ? argmax + base[i] + (c - cand_offsets[i]) * qs.positions : nullptr;
          scores[c] = ScorePair(qs, d, map, ops, req, ts, am);
        });
        if (!accepted) break;
      }
    };
  });
  if (rejected.load()) {
    std::vector<uint64_t> listed(candidates, candidates + total);
    std::sort(listed.begin(), listed.end());
    listed.erase(std::unique(listed.begin(), listed.end()), listed.end());
    return FirstRejection(src, threads_, &listed);
  }
  MAXSIM_RETURN_IF_ERROR(progress.Finish("maxsim_score_candidates"));
  SumStats(states, stats);
  return Status::Ok();
}

namespace {
struct Ranked {
  float score;
  uint64_t index;
};
// Strict total order: higher score first, then lower index. A NaN score (none is produced from accepted
// inputs; this is defence in depth) ranks below every number, -inf included, so it can never displace one.
inline bool Better(const Ranked& a, const Ranked& b) {
  const bool a_nan = std::isnan(a.score), b_nan = std::isnan(b.score);
  if (a_nan != b_nan) return b_nan;
  if (!a_nan && a.score != b.score) return a.score > b.score;
  return a.index < b.index;
}
// Keeps the k best in a heap whose top is the worst kept entry.
inline void Offer(std::vector<Ranked>& heap, uint64_t k, const Ranked& r) {
  if (heap.size() < k) {
    heap.push_back(r);
    std::push_heap(heap.begin(), heap.end(), Better);
  } else if (Better(r, heap.front())) {
    std::pop_heap(heap.begin(), heap.end(), Better);
    heap.back() = r;
    std::push_heap(heap.begin(), heap.end(), Better);
  }
}
}  // namespace

Status Engine::TopK(const SetsRef& Q, const SetsRef& D, uint64_t k, const ScoreRequest& request, float* scores,
                    uint64_t* doc_index, uint64_t* ids, maxsim_stats* stats) const {
  MAXSIM_RETURN_IF_ERROR(CheckDims(Q, D));
  uint64_t q_tokens = 0, q_longest = 0;
  QueryTokens(Q, &q_tokens, &q_longest);
  const ScoreRequest req = EffectiveRequest(request, D, q_tokens);  // a document meets every query
  if (k == 0) return Error(MAXSIM_ERR_INVALID_ARGUMENT, "k is 0 (ask for at least one document)");
  if (scores == nullptr || doc_index == nullptr) {
    return Error(MAXSIM_ERR_INVALID_ARGUMENT, "top-k outputs scores and doc_index must not be NULL");
  }
  if (ids && !(D.is_packed && D.packed.ids)) {
    return Error(MAXSIM_ERR_INVALID_ARGUMENT,
                 "ids were requested but the documents carry none (pack them with ids, or pass ids = NULL)");
  }
  const uint64_t nq = Q.n_sets(), nd = D.n_sets();
  uint64_t out_size = 0;
  if (MulOverflows(nq, k, &out_size)) return Error(MAXSIM_ERR_INVALID_ARGUMENT, "Nq * k overflows");
  QueryBatch qb;
  MAXSIM_RETURN_IF_ERROR(PrepareQueries(Q, req, threads_, *kernel_->ops, variant_, row_ops_, &qb));
  DocSource src;
  MAXSIM_RETURN_IF_ERROR(PrepareDocs(D, req, threads_, nq > 0, row_ops_, &src));
  const uint64_t keep = std::min(k, nd);
  std::vector<ThreadState> states(static_cast<size_t>(threads_));
  std::vector<std::vector<std::vector<Ranked>>> heaps(static_cast<size_t>(threads_));
  const uint64_t block = std::clamp<uint64_t>(nd / (static_cast<uint64_t>(threads_) * 32), 1, 64);
  const int64_t n_tasks = static_cast<int64_t>((nd + block - 1) / block);
  const KernelOps& ops = *kernel_->ops;
  const bool batched = UseBatch(ops, req, D);
  const bool cosine = req.metric == MAXSIM_METRIC_COSINE;
  Progress progress(nq * nd);
  std::atomic<bool> rejected{false};  // a document failed the check in DocMaterializer::Get
  ParallelTasks(threads_, n_tasks > 1, n_tasks, 1, [&](int t) {
    heaps[static_cast<size_t>(t)].assign(nq, {});
    return [&, &ts = states[static_cast<size_t>(t)], &mine = heaps[static_cast<size_t>(t)], bscores = std::vector<float>()](int64_t task) mutable {
      if (progress.cancelled() || rejected.load(std::memory_order_relaxed)) return;
      const uint64_t d0 = static_cast<uint64_t>(task) * block, d1 = std::min(nd, d0 + block);
      progress.Advance(nq * (d1 - d0));
      if (batched) {
        // Pruning (ScreenPrune): a document whose certified upper bound is below this thread's current k-th
        // score cannot enter the top-k (the k documents kept so far are real, so the global k-th score is at
        // least as high), and is not refined. Runs of 16 documents (8 with several queries) refresh the bound.
        const uint64_t run = nq == 1 ? 16 : 8;
        for (uint64_t r0 = d0; r0 < d1; r0 += run) {
          const uint64_t r1 = std::min(d1, r0 + run);
          CollectBatch(src, r0, r1, [](uint64_t j) { return j; }, ts, [&](const DocRef& d, const uint32_t* map, uint64_t j) {
            for (uint64_t i = 0; i < nq; ++i) {
              Offer(mine[i], keep, Ranked{ScorePair(qb.sets[i], d, map, ops, req, ts, nullptr), j});
            }
          });
          const size_t n = ts.batch.size();
          bscores.resize(n);
          ts.pruned.resize(n);
          for (uint64_t i = 0; i < nq; ++i) {
            const QuerySet& qs = qb.sets[i];
            ScreenPrune prune;
            prune.token_weight = cosine ? qs.inv_norm : nullptr;
            prune.below = mine[i].size() == keep ? mine[i].front().score : kNegInf;
            prune.pruned = ts.pruned.data();
            ScoreBatch(qs, ops, req, ts, &prune, bscores.data(), nullptr);
            for (size_t b = 0; b < n; ++b) {
              if (!ts.pruned[b]) Offer(mine[i], keep, Ranked{bscores[b], ts.batch_index[b]});
            }
          }
        }
        return;
      }
      for (uint64_t j = d0; j < d1; ++j) {
        const bool accepted = ScoreChecked(src, j, ts, &rejected, [&](const DocRef& d, const uint32_t* map) {
          for (uint64_t i = 0; i < nq; ++i) {
            Offer(mine[i], keep, Ranked{ScorePair(qb.sets[i], d, map, ops, req, ts, nullptr), j});
          }
        });
        if (!accepted) break;
      }
    };
  });
  if (rejected.load()) return FirstRejection(src, threads_);
  MAXSIM_RETURN_IF_ERROR(progress.Finish("maxsim_topk"));
  std::vector<Ranked> merged;
  for (uint64_t i = 0; i < nq; ++i) {
    merged.clear();
    for (auto& per_thread : heaps) {
      if (per_thread.empty()) continue;
      merged.insert(merged.end(), per_thread[i].begin(), per_thread[i].end());
    }
    std::sort(merged.begin(), merged.end(), Better);
    for (uint64_t r = 0; r < k; ++r) {
      const bool have = r < merged.size() && r < keep;
      scores[i * k + r] = have ? merged[r].score : kNegInf;
      doc_index[i * k + r] = have ? merged[r].index : UINT64_MAX;
      if (ids) ids[i * k + r] = have ? D.packed.ids[merged[r].index] : UINT64_MAX;
    }
  }
  SumStats(states, stats);
  return Status::Ok();
}

// -------------------------------------------------------------------------------------------------------------
// Backward
// -------------------------------------------------------------------------------------------------------------

namespace {

// The documents query i scored, in order: (document index, index of the score / argmax slot).
struct Scored {
  uint64_t nq = 0, nd = 0;
  maxsim_layout layout = MAXSIM_LAYOUT_MATRIX;
  const uint64_t* cand_offsets = nullptr;
  const uint64_t* candidates = nullptr;
  uint64_t count(uint64_t i) const {
    return layout == MAXSIM_LAYOUT_MATRIX ? nd : layout == MAXSIM_LAYOUT_PAIRS ? 1 : cand_offsets[i + 1] - cand_offsets[i];
  }
  uint64_t doc(uint64_t i, uint64_t c) const {
    return layout == MAXSIM_LAYOUT_MATRIX ? c : layout == MAXSIM_LAYOUT_PAIRS ? i : candidates[cand_offsets[i] + c];
  }
  uint64_t score_index(uint64_t i, uint64_t c) const {
    return layout == MAXSIM_LAYOUT_MATRIX ? i * nd + c : layout == MAXSIM_LAYOUT_PAIRS ? i : cand_offsets[i] + c;
  }
};

// acc += g * (row `row` of set `set`).
inline void AddScaledRow(const DenseView& v, uint64_t set, uint64_t row, double g, const pack::RowOps& row_ops,
                         std::vector<float>& widened, double* acc) {
  const float* f = reinterpret_cast<const float*>(v.row(set, row));
  if (v.dtype != MAXSIM_F32) {
    row_ops.widen(v.row(set, row), v.dtype, v.dim, widened.data());
    f = widened.data();
  }
  for (uint32_t k = 0; k < v.dim; ++k) acc[k] += g * static_cast<double>(f[k]);
}

}  // namespace

Status Engine::Backward(const DenseView& Q, const DenseView& D, const maxsim_backward_args& args) const {
  if (Q.memory != MAXSIM_MEMORY_HOST || D.memory != MAXSIM_MEMORY_HOST) {
    return Error(MAXSIM_ERR_BACKEND_UNAVAILABLE,
                 "backward on CUDA memory needs the cuda backend; the CPU backward reads host memory only");
  }
  if (Q.dim != D.dim) {
    return Error(MAXSIM_ERR_DIM_MISMATCH, "queries have dim %u but documents have dim %u", Q.dim, D.dim);
  }
  if (args.argmax == nullptr || args.grad_scores == nullptr) {
    return Error(MAXSIM_ERR_INVALID_ARGUMENT, "backward needs argmax and grad_scores (both non-NULL)");
  }
  Scored sc;
  sc.nq = Q.n_sets;
  sc.nd = D.n_sets;
  sc.layout = args.layout;
  uint64_t n_scores = 0;
  switch (args.layout) {
    case MAXSIM_LAYOUT_MATRIX:
      if (MulOverflows(sc.nq, sc.nd, &n_scores)) return Error(MAXSIM_ERR_INVALID_ARGUMENT, "Nq * Nd overflows");
      break;
    case MAXSIM_LAYOUT_PAIRS:
      if (sc.nq != sc.nd) {
        return Error(MAXSIM_ERR_INVALID_ARGUMENT, "pairs layout needs as many query sets (%llu) as document sets (%llu)",
                     static_cast<ull>(sc.nq), static_cast<ull>(sc.nd));
      }
      n_scores = sc.nq;
      break;
    case MAXSIM_LAYOUT_CANDIDATES:
      MAXSIM_RETURN_IF_ERROR(CheckCandidates(args.cand_offsets, args.candidates, sc.nq, sc.nd, &n_scores));
      sc.cand_offsets = args.cand_offsets;
      sc.candidates = args.candidates;
      break;
    default:
      return Error(MAXSIM_ERR_INVALID_ARGUMENT, "layout %d is not MATRIX (0), PAIRS (1) or CANDIDATES (2)",
                   static_cast<int>(args.layout));
  }
  for (uint64_t s = 0; s < n_scores; ++s) {
    if (!std::isfinite(args.grad_scores[s])) {
      return Error(MAXSIM_ERR_NON_FINITE, "grad_scores[%llu] is not finite", static_cast<ull>(s));
    }
  }
  // argmax slots: base_i + c * Lq_i + s, with base_i as in the forward's layout.
  std::vector<uint64_t> base(sc.nq + 1, 0);
  for (uint64_t i = 0; i < sc.nq; ++i) base[i + 1] = base[i] + sc.count(i) * Q.length(i);
  for (uint64_t i = 0; i < sc.nq; ++i) {
    const uint64_t lq = Q.length(i);
    for (uint64_t c = 0; c < sc.count(i); ++c) {
      const uint64_t j = sc.doc(i, c);
      const int64_t ld = static_cast<int64_t>(D.length(j));
      const int32_t* am = args.argmax + base[i] + c * lq;
      for (uint64_t s = 0; s < lq; ++s) {
        const int32_t t = am[s];
        if (t < -1 || t >= ld || (t >= 0 && !D.kept(D.begin(j) + static_cast<uint64_t>(t)))) {
          return Error(MAXSIM_ERR_INVALID_ARGUMENT,
                       "argmax for query set %llu, document %llu, token %llu is %d: not a kept token of that "
                       "document (it has %lld positions); pass the forward's argmax unchanged",
                       static_cast<ull>(i), static_cast<ull>(j), static_cast<ull>(s), t, static_cast<long long>(ld));
        }
      }
    }
  }
  const uint32_t dim = Q.dim;
  const int threads = threads_;
  if (args.grad_queries) {
    std::fill(args.grad_queries, args.grad_queries + Q.n_rows * dim, 0.0f);
    const int64_t nq = static_cast<int64_t>(sc.nq);
    ParallelTasks(threads, nq > 1, nq, 1, [&](int) {
      return [&, acc = std::vector<double>(dim), widened = std::vector<float>(dim)](int64_t ii) mutable {
        const uint64_t i = static_cast<uint64_t>(ii);
        const uint64_t lq = Q.length(i);
        for (uint64_t s = 0; s < lq; ++s) {
          if (!Q.kept(Q.begin(i) + s)) continue;
          std::fill(acc.begin(), acc.end(), 0.0);
          for (uint64_t c = 0; c < sc.count(i); ++c) {
            const int32_t t = args.argmax[base[i] + c * lq + s];
            if (t < 0) continue;
            const uint64_t j = sc.doc(i, c);
            AddScaledRow(D, j, D.begin(j) + static_cast<uint64_t>(t), args.grad_scores[sc.score_index(i, c)], row_ops_, widened,
                         acc.data());
          }
          float* out = args.grad_queries + (Q.begin(i) + s) * dim;
          for (uint32_t k = 0; k < dim; ++k) out[k] = static_cast<float>(acc[k]);
        }
      };
    });
  }
  if (args.grad_documents) {
    std::fill(args.grad_documents, args.grad_documents + D.n_rows * dim, 0.0f);
    // Destination-owned: each document gathers, in (query, slot) order, every (query token) that chose it.
    std::vector<uint64_t> by_doc_start(sc.nd + 1, 0);
    std::vector<std::pair<uint64_t, uint64_t>> by_doc;  // (query, slot), grouped by document
    if (args.layout != MAXSIM_LAYOUT_MATRIX) {
      for (uint64_t i = 0; i < sc.nq; ++i) {
        for (uint64_t c = 0; c < sc.count(i); ++c) ++by_doc_start[sc.doc(i, c) + 1];
      }
      for (uint64_t j = 0; j < sc.nd; ++j) by_doc_start[j + 1] += by_doc_start[j];
      by_doc.resize(by_doc_start[sc.nd]);
      std::vector<uint64_t> fill(by_doc_start.begin(), by_doc_start.end() - 1);
      for (uint64_t i = 0; i < sc.nq; ++i) {
        for (uint64_t c = 0; c < sc.count(i); ++c) by_doc[fill[sc.doc(i, c)]++] = {i, c};
      }
    }
    const int64_t nd = static_cast<int64_t>(sc.nd);
    ParallelTasks(threads, nd > 1, nd, 1, [&](int) {
      return [&, acc = std::vector<double>(), widened = std::vector<float>(dim)](int64_t jj) mutable {
        const uint64_t j = static_cast<uint64_t>(jj);
        const uint64_t ld = D.length(j);
        acc.assign(ld * dim, 0.0);
        auto visit = [&](uint64_t i, uint64_t c) {
          const uint64_t lq = Q.length(i);
          const double g = args.grad_scores[sc.score_index(i, c)];
          for (uint64_t s = 0; s < lq; ++s) {
            const int32_t t = args.argmax[base[i] + c * lq + s];
            if (t < 0 || !Q.kept(Q.begin(i) + s)) continue;
            AddScaledRow(Q, i, Q.begin(i) + s, g, row_ops_, widened, acc.data() + static_cast<uint64_t>(t) * dim);
          }
        };
        if (args.layout == MAXSIM_LAYOUT_MATRIX) {
          for (uint64_t i = 0; i < sc.nq; ++i) visit(i, j);
        } else {
          for (uint64_t e = by_doc_start[j]; e < by_doc_start[j + 1]; ++e) visit(by_doc[e].first, by_doc[e].second);
        }
        for (uint64_t t = 0; t < ld; ++t) {
          float* out = args.grad_documents + (D.begin(j) + t) * dim;
          for (uint32_t k = 0; k < dim; ++k) out[k] = static_cast<float>(acc[t * dim + k]);
        }
      };
    });
  }
  return Status::Ok();
}

}  // namespace maxsim
