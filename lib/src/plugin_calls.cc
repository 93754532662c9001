// SPDX-License-Identifier: Apache-2.0
// Calls on the accelerator plugin: which calls it takes (ChooseRoute), packed views handed to it, the device-
// corpus cache, and sharding over several devices (a corpus cut into contiguous ranges of sets, one per
// backend; every call runs on all shards at once, one host thread each (ShardWorkers), and the results are
// merged exactly: matrix and candidate scores are placed, top-k lists merged by (score, lower index first) as the
// CPU ranks).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "context.h"
#include "mutex.h"
#include "packed.h"
#include "packed_handle.h"
#include "packer.h"
#include "shard_workers.h"

#include <memory>
#include <new>

namespace maxsim {
namespace {

using ull = unsigned long long;

PluginMember MemberFor(PluginOp op) {
  switch (op) {
    case PluginOp::kMatrix: return PluginMember::kScoreMatrix;
    case PluginOp::kCandidates: return PluginMember::kScoreCandidates;
    case PluginOp::kTopK: return PluginMember::kTopK;
  }
  return PluginMember::kScoreMatrix;
}

Status Unsupported(const maxsim_context& ctx, PluginMember m, const char* what) {
  return Error(MAXSIM_ERR_UNSUPPORTED,
               "backend %s cannot run %s: its plugin does not implement %s (the member is NULL)%s",
               ctx.accel->name.c_str(), what, PluginMemberName(m),
               ctx.accel_forced ? "; MAXSIM_BACKEND=auto or cpu runs such calls on the CPU" : "");
}

const char* MemoryName(maxsim_memory m) {
  switch (m) {
    case MAXSIM_MEMORY_HOST: return "host";
    case MAXSIM_MEMORY_CUDA: return "CUDA";
    default: return "unknown";
  }
}

}  // namespace

const char* PluginMemberName(PluginMember m) {
  switch (m) {
    case PluginMember::kCorpusUpload: return "corpus_upload";
    case PluginMember::kScoreMatrix: return "score_matrix";
    case PluginMember::kScoreCandidates: return "score_candidates";
    case PluginMember::kTopK: return "topk";
    case PluginMember::kTrainForward: return "train_forward";
    case PluginMember::kTrainBackward: return "train_backward";
    case PluginMember::kDeviceMemory: return "mem_alloc/mem_free/mem_copy";
    case PluginMember::kCount: break;
  }
  return "?";
}

std::string LoadedPlugin::Capabilities() const {
  std::string r = Format("ABI %u.%u", api->abi_major, api->abi_minor);
  std::string missing;
  for (int m = 0; m < static_cast<int>(PluginMember::kCount); ++m) {
    if (!has[m]) missing += (missing.empty() ? "" : ", ") + std::string(PluginMemberName(static_cast<PluginMember>(m)));
  }
  if (!missing.empty()) r += "; not implemented: " + missing;
  if (device_count) r += "; multi-device (device_count, create_device)";
  if (dense_query_modes) r += "; dense host queries (dense_query_modes)";
  if (matrix_columns) r += "; score matrix into columns of the caller's (output_layouts)";
  if (synchronize) r += "; stream-ordered calls (synchronize)";
  return r;
}

Status ChooseRoute(maxsim_context& ctx, PluginOp op, const SetsRef& q, const SetsRef& d, uint64_t work_ops,
                   Route* route) {
  const maxsim_memory mem = q.memory() != MAXSIM_MEMORY_HOST ? q.memory() : d.memory();
  const bool device = mem != MAXSIM_MEMORY_HOST;
  *route = Route::kCpu;
  if (!ctx.accel) {
    if (device) {
      return Error(MAXSIM_ERR_BACKEND_UNAVAILABLE, "inputs are in %s memory but no accelerator backend is active (%s)",
                   MemoryName(mem), ctx.backend_note.c_str());
    }
    return Status::Ok();
  }
  const LoadedPlugin& p = *ctx.accel;
  if (device) {
    if (!p.Accepts(mem)) {
      return Error(MAXSIM_ERR_UNSUPPORTED, "inputs are in %s memory, which backend %s does not take", MemoryName(mem),
                   p.name.c_str());
    }
    if (!p.Has(PluginMember::kTrainForward)) return Unsupported(ctx, PluginMember::kTrainForward, "device tensors");
    *route = Route::kPlugin;
    return Status::Ok();
  }
  const PluginMember need = MemberFor(op);
  const bool can = p.Has(PluginMember::kCorpusUpload) && p.Has(need);
  if (ctx.accel_forced) {
    if (!can) {
      return Unsupported(ctx, p.Has(PluginMember::kCorpusUpload) ? need : PluginMember::kCorpusUpload,
                         "this call");
    }
    *route = Route::kPlugin;
    return Status::Ok();
  }
  if (!can) return Status::Ok();  // auto: the CPU runs what the plugin does not implement
  const uint64_t threshold = p.api->min_auto_ops ? p.api->min_auto_ops(ctx.accel_backend) : UINT64_MAX;
  if (d.is_packed && work_ops >= threshold) *route = Route::kPlugin;
  return Status::Ok();
}

namespace {

struct AlignedBuffer {
  void* p = nullptr;
  ~AlignedBuffer() { std::free(p); }
};

// Packs dense host sets into an aligned temporary buffer (for handing to a plugin) and decodes it. A bad value
// is reported as the CPU reports it (CheckDenseValues), whichever route the call takes.
Status PackTemporary(const SetsRef& s, const char* role, const maxsim_context& ctx, AlignedBuffer* buf,
                     uint64_t* size, pack::PackedView* view) {
  MAXSIM_RETURN_IF_ERROR(pack::PackedSize(s.dense, false, size));
  buf->p = std::aligned_alloc(MAXSIM_PACK_ALIGN, RoundUp(*size, MAXSIM_PACK_ALIGN));
  if (!buf->p) return Error(MAXSIM_ERR_OUT_OF_MEMORY, "%s: cannot allocate %llu bytes to pack", role, static_cast<ull>(*size));
  const pack::RowOps& ops = ctx.engine->row_ops();
  const Status packed = pack::PackInto(s.dense, nullptr, buf->p, *size, ctx.threads, role, size, false, nullptr, ops);
  if (packed.code() == MAXSIM_ERR_NON_FINITE) {
    const Status named = CheckDenseValues(s.dense, role, ctx.threads, ops);
    if (!named.ok()) return named;
  }
  MAXSIM_RETURN_IF_ERROR(packed);
  return pack::Validate(buf->p, *size, MAXSIM_VALIDATE_FAST, view, ops);
}

}  // namespace

// The plugin's view of sets [s0, s1) of a validated packed buffer.
maxsim_packed_view ViewOf(const pack::PackedView& v, uint64_t s0, uint64_t s1) {
  maxsim_packed_view out{};
  out.struct_size = sizeof(out);
  out.dim = v.dim;
  out.padded_dim = v.padded_dim;
  out.orig_row_bytes = v.orig_row_bytes;
  out.orig_dtype = static_cast<uint32_t>(v.dtype);
  out.n_sets = s1 - s0;
  out.offsets = v.offsets + s0;
  out.n_rows = v.offsets[s1] - v.offsets[s0];
  for (uint64_t i = s0; i < s1; ++i) out.max_set_rows = std::max(out.max_set_rows, v.offsets[i + 1] - v.offsets[i]);
  out.codes = v.codes;
  out.meta = v.meta;
  out.originals = v.originals;
  out.ids = v.ids ? v.ids + s0 : nullptr;
  return out;
}

namespace {

// Dense host sets with a mask are packed without their masked rows, so a plugin reports argmax in compacted
// coordinates (query tokens and document tokens both renumbered without the masked rows). This maps such a
// plugin argmax (matrix or candidates layout over kept query tokens) to maxsim.h's layout over positions.
std::vector<uint32_t> KeptPositions(const SetsRef& s, uint64_t i) {
  std::vector<uint32_t> kept;
  for (uint64_t r = s.dense.begin(i); r < s.dense.end(i); ++r) {
    if (s.dense.kept(r)) kept.push_back(static_cast<uint32_t>(r - s.dense.begin(i)));
  }
  return kept;
}

struct ArgmaxRemap {
  bool active = false;
  std::vector<int32_t> compact;  // the plugin's output
};

uint64_t KeptCount(const SetsRef& s, uint64_t i) {
  if (s.is_packed || !s.dense.mask) return s.positions(i);
  uint64_t n = 0;
  for (uint64_t r = s.dense.begin(i); r < s.dense.end(i); ++r) n += s.dense.kept(r);
  return n;
}

void RemapArgmax(const SetsRef& q, const SetsRef& d, const PluginCall& call, const std::vector<int32_t>& compact) {
  const uint64_t nq = q.n_sets(), nd = d.n_sets();
  const bool qmask = !q.is_packed && q.dense.mask, dmask = !d.is_packed && d.dense.mask;
  std::vector<std::vector<uint32_t>> dmap(dmask ? nd : 0);
  for (uint64_t j = 0; j < dmap.size(); ++j) dmap[j] = KeptPositions(d, j);
  uint64_t cbase = 0, pbase_pos = 0;  // compacted and positional bases of query i
  for (uint64_t i = 0; i < nq; ++i) {
    const uint64_t lq = q.positions(i);
    std::vector<uint32_t> qk;
    if (qmask) qk = KeptPositions(q, i);
    const uint64_t lk = qmask ? qk.size() : lq;
    const uint64_t n_docs = call.op == PluginOp::kMatrix ? nd : call.cand_offsets[i + 1] - call.cand_offsets[i];
    for (uint64_t c = 0; c < n_docs; ++c) {
      const uint64_t j = call.op == PluginOp::kMatrix ? c : call.candidates[call.cand_offsets[i] + c];
      const uint64_t src = call.op == PluginOp::kMatrix ? nd * cbase + c * lk : cbase + c * lk;
      const uint64_t dst = call.op == PluginOp::kMatrix ? nd * pbase_pos + c * lq : pbase_pos + c * lq;
      int32_t* out = call.argmax + dst;
      if (qmask) std::fill(out, out + lq, -1);
      for (uint64_t s = 0; s < lk; ++s) {
        int32_t t = compact[src + s];
        if (t >= 0 && dmask) t = static_cast<int32_t>(dmap[j][static_cast<size_t>(t)]);
        out[qmask ? qk[s] : s] = t;
      }
    }
    if (call.op == PluginOp::kMatrix) {
      cbase += lk;
      pbase_pos += lq;
    } else {
      cbase += n_docs * lk;
      pbase_pos += n_docs * lq;
    }
  }
}

Status PluginError(const maxsim_context& ctx, maxsim_status code, const char* err) {
  return Error(code == MAXSIM_OK ? MAXSIM_ERR_PLUGIN : code, "backend %s: %s", ctx.accel->name.c_str(),
               err[0] ? err : maxsim_status_name(code));
}

// The MAXSIM_CALL_* flags a training-args call passes to the plugin: stream-ordered only for a plugin that can
// report deferred errors (a synchronize member; others run the call synchronously). A stream-ordered call marks
// the context as having deferred errors pending until maxsim_synchronize.
uint32_t PluginCallFlags(maxsim_context& ctx, uint32_t flags) {
  const uint32_t passed = ctx.accel->synchronize ? flags : 0u;
  if (passed & MAXSIM_CALL_STREAM_ORDERED) ctx.stream_ordered_pending = true;
  return passed;
}

// Runs fn(s) for every shard s, shards after the first on the context's persistent shard workers (one after the
// other in a build without threads); the first error wins.
template <typename F>
Status ForEachShard(maxsim_context& ctx, size_t n, F&& fn) {
  if (n == 1) return fn(0);
  std::vector<Status> st(n);
#ifdef MAXSIM_SINGLE_THREADED
  (void)ctx;
  for (size_t s = 0; s < n; ++s) st[s] = fn(s);
#else
  if (!ctx.shard_workers) ctx.shard_workers = std::make_unique<ShardWorkers>();
  ctx.shard_workers->Run(n, [&](size_t s) {
    try {
      st[s] = fn(s);
    } catch (const std::bad_alloc&) {
      st[s] = Error(MAXSIM_ERR_OUT_OF_MEMORY, "out of host memory in shard %zu of a sharded call", s);
    } catch (...) {
      st[s] = Error(MAXSIM_ERR_INTERNAL, "unexpected exception in shard %zu of a sharded call", s);
    }
  });
#endif
  for (const Status& x : st) MAXSIM_RETURN_IF_ERROR(x);
  return Status::Ok();
}

// Uploads sets [s0, s1) of a packed buffer to one backend (buffer/size: the whole buffer, for 1.0 plugins).
Status Upload(maxsim_context& ctx, maxsim_plugin_backend* backend, const pack::PackedView& v, uint64_t s0,
              uint64_t s1, maxsim_plugin_corpus** out) {
  const maxsim_plugin_api* api = ctx.accel->api;
  char err[1024] = {};
  maxsim_status st;
  if (MAXSIM_PLUGIN_HAS(api, corpus_upload_view)) {
    const maxsim_packed_view view = ViewOf(v, s0, s1);
    st = api->corpus_upload_view(backend, &view, out, err, sizeof(err));
  } else if (s0 == 0 && s1 == v.n_sets) {
    st = api->corpus_upload(backend, v.base, v.size, out, err, sizeof(err));
  } else {
    return Error(MAXSIM_ERR_INTERNAL, "backend %s: an ABI 1.0 plugin cannot take a shard", ctx.accel->name.c_str());
  }
  err[sizeof(err) - 1] = '\0';
  if (st != MAXSIM_OK) return PluginError(ctx, st, err);
  return Status::Ok();
}

// Cuts sets [0, n) into `parts` contiguous ranges of about equal token counts.
std::vector<uint64_t> ShardBounds(const pack::PackedView& v, size_t parts) {
  std::vector<uint64_t> first(parts + 1, v.n_sets);
  first[0] = 0;
  const uint64_t rows = v.offsets[v.n_sets];
  uint64_t j = 0;
  for (size_t s = 1; s < parts; ++s) {
    const uint64_t target = rows / parts * s + rows % parts * s / parts;
    while (j < v.n_sets && v.offsets[j] < target) ++j;
    first[s] = std::max(first[s - 1], j);
  }
  return first;
}

// Uploads a corpus to every shard backend (one host thread each).
Status UploadCorpus(maxsim_context& ctx, const pack::PackedView& v, DeviceCorpus* out) {
  const size_t n = ctx.shard_backends.size();
  DeviceCorpus c;
  c.first = ShardBounds(v, n);
  c.shard.assign(n, nullptr);
  Status st = ForEachShard(ctx, n, [&](size_t s) -> Status {
    if (c.first[s] == c.first[s + 1] && n > 1) return Status::Ok();
    return Upload(ctx, ctx.shard_backends[s], v, c.first[s], c.first[s + 1], &c.shard[s]);
  });
  if (!st.ok()) {
    FreeDeviceCorpus(ctx, c);
    return st;
  }
  *out = std::move(c);
  return Status::Ok();
}

void AddStats(maxsim_stats* total, const maxsim_stats& s) {
  total->pairs += s.pairs;
  total->query_tokens += s.query_tokens;
  total->refined += s.refined;
  total->multi_candidate += s.multi_candidate;
  total->docs_pruned += s.docs_pruned;
}

maxsim_status CallOp(const maxsim_plugin_api* api, PluginOp op, maxsim_plugin_backend* b,
                     const maxsim_plugin_score_args* a, char* err, size_t cap) {
  switch (op) {
    case PluginOp::kMatrix: return api->score_matrix(b, a, err, cap);
    case PluginOp::kCandidates: return api->score_candidates(b, a, err, cap);
    case PluginOp::kTopK: return api->topk(b, a, err, cap);
  }
  return MAXSIM_ERR_INTERNAL;
}

// One operation over a sharded corpus: per-shard outputs, then placed / merged into `a`'s outputs.
// lq: the query sets' lengths in the plugin's layout.
Status RunSharded(maxsim_context& ctx, PluginOp op, const DeviceCorpus& corpus, const std::vector<uint64_t>& lq,
                  const maxsim_plugin_score_args& a) {
  const maxsim_plugin_api* api = ctx.accel->api;
  const size_t n = corpus.shard.size();
  const uint64_t nq = lq.size(), k = a.k;
  std::vector<uint64_t> qpos(nq + 1, 0);  // prefix sums of lq
  for (uint64_t i = 0; i < nq; ++i) qpos[i + 1] = qpos[i] + lq[i];
  struct Part {
    std::vector<uint64_t> cand_offsets, candidates, origin;  // candidates: local indices; origin: global slot
    std::vector<float> scores;
    std::vector<int32_t> argmax;
    std::vector<uint64_t> index;
    std::unique_ptr<float[]> matrix;            // kMatrix: [nq][shard columns], every element written
    std::unique_ptr<int32_t[]> matrix_argmax;   // kMatrix with argmax
    maxsim_stats stats{};
  };
  std::vector<Part> parts(n);
  // The shards write their columns of the caller's matrix themselves: a plugin that takes a column range (ABI 1.3
  // output_layouts), or any plugin for one query (its columns are contiguous). Otherwise each shard's matrix is
  // staged and placed once every shard has succeeded.
  const bool columns = op == PluginOp::kMatrix && ctx.accel->matrix_columns;
  const bool in_place = op == PluginOp::kMatrix && (columns || nq == 1);
  if (op == PluginOp::kCandidates) {
    for (Part& p : parts) p.cand_offsets.assign(nq + 1, 0);
    for (uint64_t i = 0; i < nq; ++i) {
      for (Part& p : parts) p.cand_offsets[i + 1] = p.cand_offsets[i];
      for (uint64_t e = a.cand_offsets[i]; e < a.cand_offsets[i + 1]; ++e) {
        const uint64_t j = a.candidates[e];
        const size_t s = static_cast<size_t>(std::upper_bound(corpus.first.begin(), corpus.first.end(), j) -
                                             corpus.first.begin()) - 1;
        Part& p = parts[s];
        p.candidates.push_back(j - corpus.first[s]);
        p.origin.push_back(e);
        ++p.cand_offsets[i + 1];
      }
    }
  }
  Status st = ForEachShard(ctx, n, [&](size_t s) -> Status {
    Part& p = parts[s];
    const uint64_t nd = corpus.first[s + 1] - corpus.first[s];
    if (corpus.shard[s] == nullptr) return Status::Ok();  // an empty shard
    if (op == PluginOp::kCandidates && p.candidates.empty()) return Status::Ok();
    maxsim_plugin_score_args sa = a;
    sa.corpus = corpus.shard[s];
    sa.stats = a.stats ? &p.stats : nullptr;
    const uint64_t cols = op == PluginOp::kMatrix ? nd : 0;
    if (columns) {
      // Columns [j0, j0 + nd) of the caller's matrix (scores and argmax). A bad query fails on every shard before
      // anything is written.
      sa.matrix_columns = corpus.first[n];
      sa.matrix_first_column = corpus.first[s];
    } else if (in_place) {
      // One query: the shard's columns are contiguous in the caller's outputs (scores from j0, argmax from
      // j0 * lq), so the plugin writes them there as a dense one-row matrix.
      sa.scores = a.scores + corpus.first[s];
      sa.argmax = a.argmax ? a.argmax + corpus.first[s] * lq[0] : nullptr;
    } else if (op == PluginOp::kMatrix) {
      p.matrix.reset(new float[nq * cols]);
      if (a.argmax) p.matrix_argmax.reset(new int32_t[qpos[nq] * cols]);
      sa.scores = p.matrix.get();
      sa.argmax = p.matrix_argmax.get();
    } else if (op == PluginOp::kCandidates) {
      sa.cand_offsets = p.cand_offsets.data();
      sa.candidates = p.candidates.data();
      p.scores.resize(p.candidates.size());
      if (a.argmax) {
        uint64_t am = 0;
        for (uint64_t i = 0; i < nq; ++i) am += (p.cand_offsets[i + 1] - p.cand_offsets[i]) * lq[i];
        p.argmax.resize(am);
      }
    } else {
      p.scores.resize(nq * k);
      p.index.resize(nq * k);
      sa.topk_index = p.index.data();
    }
    if (op != PluginOp::kMatrix) {
      sa.scores = p.scores.data();
      sa.argmax = p.argmax.empty() ? nullptr : p.argmax.data();
    }
    char err[1024] = {};
    const maxsim_status code = CallOp(api, op, ctx.shard_backends[s], &sa, err, sizeof(err));
    err[sizeof(err) - 1] = '\0';
    if (code != MAXSIM_OK) return PluginError(ctx, code, err);
    return Status::Ok();
  });
  MAXSIM_RETURN_IF_ERROR(st);
  const uint64_t nd_all = corpus.first[n];
  if (op == PluginOp::kMatrix && !in_place) {
    // Every shard succeeded: each places its columns (disjoint in the outputs) from its own thread.
    MAXSIM_RETURN_IF_ERROR(ForEachShard(ctx, n, [&](size_t s) -> Status {
      const Part& p = parts[s];
      const uint64_t j0 = corpus.first[s], nd = corpus.first[s + 1] - j0;
      if (nd == 0 || !p.matrix) return Status::Ok();
      for (uint64_t i = 0; i < nq; ++i) {
        std::memcpy(a.scores + i * nd_all + j0, p.matrix.get() + i * nd, nd * sizeof(float));
        // Matrix argmax: query i's block starts at nd * qpos[i]; document j at + j * lq[i].
        if (a.argmax) {
          std::memcpy(a.argmax + nd_all * qpos[i] + j0 * lq[i], p.matrix_argmax.get() + nd * qpos[i],
                      nd * lq[i] * sizeof(int32_t));
        }
      }
      return Status::Ok();
    }));
  } else if (op == PluginOp::kCandidates) {
    // Candidate argmax: candidate e of query i at base_i + (e - cand_offsets[i]) * lq[i].
    std::vector<uint64_t> base(nq, 0);
    for (uint64_t i = 1; i < nq; ++i) base[i] = base[i - 1] + (a.cand_offsets[i] - a.cand_offsets[i - 1]) * lq[i - 1];
    for (const Part& p : parts) {
      uint64_t local_base = 0;
      for (uint64_t i = 0; i < nq; ++i) {
        for (uint64_t c = p.cand_offsets[i]; c < p.cand_offsets[i + 1]; ++c) {
          const uint64_t e = p.origin[c];
          a.scores[e] = p.scores[c];
          if (a.argmax) {
            std::memcpy(a.argmax + base[i] + (e - a.cand_offsets[i]) * lq[i],
                        p.argmax.data() + local_base + (c - p.cand_offsets[i]) * lq[i], lq[i] * sizeof(int32_t));
          }
        }
        local_base += (p.cand_offsets[i + 1] - p.cand_offsets[i]) * lq[i];
      }
    }
  } else if (op == PluginOp::kTopK) {
    // Top-k: each shard's k best (local indices), merged by score, ties to the lower document index.
    std::vector<std::pair<float, uint64_t>> all;
    for (uint64_t i = 0; i < nq; ++i) {
      all.clear();
      for (size_t s = 0; s < n; ++s) {
        const Part& p = parts[s];
        if (p.index.empty()) continue;
        for (uint64_t r = 0; r < k; ++r) {
          const uint64_t idx = p.index[i * k + r];
          if (idx != UINT64_MAX) all.push_back({p.scores[i * k + r], corpus.first[s] + idx});
        }
      }
      std::sort(all.begin(), all.end(), [](const auto& x, const auto& y) {
        return x.first != y.first ? x.first > y.first : x.second < y.second;
      });
      for (uint64_t r = 0; r < k; ++r) {
        a.scores[i * k + r] = r < all.size() ? all[r].first : -std::numeric_limits<float>::infinity();
        a.topk_index[i * k + r] = r < all.size() ? all[r].second : UINT64_MAX;
      }
    }
  }
  if (a.stats) {
    *a.stats = maxsim_stats{};
    for (const Part& p : parts) AddStats(a.stats, p.stats);
  }
  return Status::Ok();
}

}  // namespace

Status RunOnPlugin(maxsim_context& ctx, const SetsRef& q, const SetsRef& d, const PluginCall& call) {
  const maxsim_plugin_api* api = ctx.accel->api;
  char err[1024] = {};
  LockGuard lock(ctx.plugin_mu);
  if (q.memory() != MAXSIM_MEMORY_HOST || d.memory() != MAXSIM_MEMORY_HOST) {
    if (q.is_packed || d.is_packed || q.memory() != d.memory()) {
      return Error(MAXSIM_ERR_INVALID_ARGUMENT, "queries and documents must both be dense device tensors (or both host)");
    }
    if (call.op == PluginOp::kTopK) {
      return Error(MAXSIM_ERR_UNSUPPORTED, "top-k on device tensors is not supported: pack the corpus and upload it");
    }
    if (call.req.mode != MAXSIM_MODE_EXACT) {
      return Error(MAXSIM_ERR_UNSUPPORTED,
                   "certified/approximate modes need packed buffers (i8 codes + metadata); device tensors score "
                   "in exact mode");
    }
    maxsim_plugin_train_args a{};
    a.struct_size = sizeof(a);
    a.metric = call.req.metric;
    a.layout = call.op == PluginOp::kMatrix ? MAXSIM_LAYOUT_MATRIX : MAXSIM_LAYOUT_CANDIDATES;
    a.queries = q.dense_src;
    a.documents = d.dense_src;
    a.cand_offsets = call.cand_offsets;
    a.candidates = call.candidates;
    a.scores = call.scores;
    a.argmax = call.argmax;
    a.stream = call.stream;
    a.flags = PluginCallFlags(ctx, call.flags);
    a.call = call.name;
    const maxsim_status st = api->train_forward(ctx.accel_backend, &a, err, sizeof(err));
    if (st != MAXSIM_OK) return PluginError(ctx, st, err);
    return Status::Ok();
  }
  // Host inputs: documents as a device-resident corpus; queries as a packed buffer, or as they are where the
  // plugin reads dense host queries in this mode (ABI 1.2 dense_query_modes: no packing on the host per call).
  // Per-set row pointers (set_data) are packed: the plugin ABI's dense sets address rows from data only.
  const bool dense_query = !q.is_packed && q.dense.mask == nullptr && q.dense.set_data == nullptr &&
                           ctx.accel->dense_query_modes != nullptr &&
                           (ctx.accel->dense_query_modes(ctx.accel_backend) &
                            (1u << static_cast<unsigned>(call.req.mode))) != 0;
  AlignedBuffer qtemp, dtemp;
  pack::PackedView qpacked;
  if (q.is_packed) {
    qpacked = q.packed;
  } else if (!dense_query) {
    uint64_t qsize = 0;
    MAXSIM_RETURN_IF_ERROR(PackTemporary(q, "queries", ctx, &qtemp, &qsize, &qpacked));
  }
  const maxsim_packed_view qview = dense_query ? maxsim_packed_view{} : ViewOf(qpacked, 0, qpacked.n_sets);
  // The plugin checks dense queries itself; on a non-finite value the host re-checks them to name the row. But
  // while a stream-ordered call may have left a deferred error, the plugin's operation may return that error (an
  // earlier call's) instead of running: the queries are then checked here first, so that a bad query fails this
  // call without reaching the plugin (the deferred error stays for its next operation or maxsim_synchronize) and a
  // non-finite error from the plugin is returned as the plugin gives it.
  const bool queries_checked_first = dense_query && ctx.stream_ordered_pending;
  if (queries_checked_first) {
    MAXSIM_RETURN_IF_ERROR(CheckDenseValues(q.dense, "queries", ctx.threads, ctx.engine->row_ops()));
  }
  DeviceCorpus temporary;
  const DeviceCorpus* corpus = nullptr;
  if (d.is_packed) {
    auto it = ctx.corpora.find(d.handle->uid);
    if (it == ctx.corpora.end()) {
      DeviceCorpus c;
      MAXSIM_RETURN_IF_ERROR(UploadCorpus(ctx, d.packed, &c));
      it = ctx.corpora.emplace(d.handle->uid, std::move(c)).first;
    }
    corpus = &it->second;
  } else {
    uint64_t dsize = 0;
    pack::PackedView dpacked;
    MAXSIM_RETURN_IF_ERROR(PackTemporary(d, "documents", ctx, &dtemp, &dsize, &dpacked));
    MAXSIM_RETURN_IF_ERROR(UploadCorpus(ctx, dpacked, &temporary));
    corpus = &temporary;
  }
  // Masked dense host inputs lose their masked rows in packing: collect the plugin's argmax and remap it.
  ArgmaxRemap remap;
  if (call.argmax && ((!q.is_packed && q.dense.mask) || (!d.is_packed && d.dense.mask))) {
    remap.active = true;
    uint64_t n = 0;
    for (uint64_t i = 0; i < q.n_sets(); ++i) {
      const uint64_t docs = call.op == PluginOp::kMatrix ? d.n_sets() : call.cand_offsets[i + 1] - call.cand_offsets[i];
      n += docs * KeptCount(q, i);
    }
    remap.compact.assign(n, -1);
  }
  maxsim_plugin_score_args a{};
  a.struct_size = sizeof(a);
  a.metric = call.req.metric;
  a.mode = call.req.mode;
  a.queries = dense_query ? nullptr : qpacked.base;
  a.queries_size = dense_query ? 0 : qpacked.size;
  a.query_view = dense_query ? nullptr : &qview;
  a.query_dense = dense_query ? q.dense_src : nullptr;
  a.cand_offsets = call.cand_offsets;
  a.candidates = call.candidates;
  a.k = call.k;
  a.scores = call.scores;
  a.argmax = remap.active ? remap.compact.data() : call.argmax;
  a.topk_index = call.topk_index;
  a.stats = call.stats;
  Status st;
  if (corpus->shard.size() == 1) {
    a.corpus = corpus->shard[0];
    const maxsim_status code = CallOp(api, call.op, ctx.accel_backend, &a, err, sizeof(err));
    err[sizeof(err) - 1] = '\0';
    if (code != MAXSIM_OK) st = PluginError(ctx, code, err);
  } else {
    std::vector<uint64_t> lq(q.n_sets());  // the query sets' lengths in the plugin's layout
    for (uint64_t i = 0; i < lq.size(); ++i) {
      lq[i] = dense_query ? q.dense.length(i) : qpacked.offsets[i + 1] - qpacked.offsets[i];
    }
    st = RunSharded(ctx, call.op, *corpus, lq, a);
  }
  if (!temporary.shard.empty()) FreeDeviceCorpus(ctx, temporary);
  if (dense_query && !queries_checked_first && st.code() == MAXSIM_ERR_NON_FINITE) {
    // The plugin found a bad query row (and wrote nothing): the CPU's check names it.
    const Status named = CheckDenseValues(q.dense, "queries", ctx.threads, ctx.engine->row_ops());
    if (!named.ok()) return named;
  }
  MAXSIM_RETURN_IF_ERROR(st);
  if (remap.active) RemapArgmax(q, d, call, remap.compact);
  if (call.op == PluginOp::kTopK && call.ids) {
    const uint64_t n = q.n_sets() * call.k;
    for (uint64_t r = 0; r < n; ++r) {
      const uint64_t idx = call.topk_index[r];
      call.ids[r] = idx < d.n_sets() ? d.packed.ids[idx] : UINT64_MAX;
    }
  }
  return Status::Ok();
}

Status BackwardOnPlugin(maxsim_context& ctx, const maxsim_dense_sets* q, const maxsim_dense_sets* d,
                        const maxsim_backward_args& args, uint32_t flags) {
  if (!ctx.accel->Accepts(q->memory)) {
    return Error(MAXSIM_ERR_UNSUPPORTED, "inputs are in %s memory, which backend %s does not take",
                 MemoryName(q->memory), ctx.accel->name.c_str());
  }
  if (!ctx.accel->Has(PluginMember::kTrainBackward)) {
    return Unsupported(ctx, PluginMember::kTrainBackward, "the backward");
  }
  LockGuard lock(ctx.plugin_mu);
  maxsim_plugin_train_args a{};
  a.struct_size = sizeof(a);
  a.metric = MAXSIM_METRIC_DOT;
  a.layout = args.layout;
  a.queries = q;
  a.documents = d;
  a.cand_offsets = args.cand_offsets;
  a.candidates = args.candidates;
  a.argmax = const_cast<int32_t*>(args.argmax);
  a.grad_scores = args.grad_scores;
  a.grad_queries = args.grad_queries;
  a.grad_documents = args.grad_documents;
  a.deterministic = args.deterministic;
  a.stream = args.cuda_stream;
  a.flags = PluginCallFlags(ctx, flags);
  a.call = "maxsim_backward";
  char err[1024] = {};
  const maxsim_status st = ctx.accel->api->train_backward(ctx.accel_backend, &a, err, sizeof(err));
  if (st != MAXSIM_OK) return PluginError(ctx, st, err);
  return Status::Ok();
}

Status SynchronizeBackends(maxsim_context& ctx) {
  if (!ctx.accel || !ctx.accel->synchronize) return Status::Ok();
  LockGuard lock(ctx.plugin_mu);
  Status first;
  for (maxsim_plugin_backend* b : ctx.shard_backends) {  // every backend waits, the first error is returned
    char err[1024] = {};
    const maxsim_status code = ctx.accel->synchronize(b, err, sizeof(err));
    err[sizeof(err) - 1] = '\0';
    if (code != MAXSIM_OK && first.ok()) first = PluginError(ctx, code, err);
  }
  ctx.stream_ordered_pending = false;  // every deferred error is reported or dropped (maxsim.h)
  return first;
}

}  // namespace maxsim

extern "C" MAXSIM_API maxsim_status maxsim_packed_plugin_view(const maxsim_packed* packed, uint64_t first_set,
                                                              uint64_t n_sets, maxsim_packed_view* out) {
  using maxsim::Error;
  if (packed == nullptr || out == nullptr) {
    return maxsim::Report(Error(MAXSIM_ERR_INVALID_ARGUMENT, "maxsim_packed_plugin_view: NULL argument"));
  }
  const maxsim::pack::PackedView& v = packed->view;
  if (first_set > v.n_sets || n_sets > v.n_sets - first_set) {
    return maxsim::Report(Error(MAXSIM_ERR_INVALID_ARGUMENT,
                                "maxsim_packed_plugin_view: sets [%llu, +%llu) lie outside the %llu sets of the buffer",
                                static_cast<unsigned long long>(first_set), static_cast<unsigned long long>(n_sets),
                                static_cast<unsigned long long>(v.n_sets)));
  }
  *out = maxsim::ViewOf(v, first_set, first_set + n_sets);
  return MAXSIM_OK;
}

extern "C" MAXSIM_API maxsim_status maxsim_context_plugin(maxsim_context* ctx, uint32_t device,
                                                          const maxsim_plugin_api** api,
                                                          maxsim_plugin_backend** backend) {
  using maxsim::Error;
  if (ctx == nullptr || api == nullptr || backend == nullptr) {
    return maxsim::Report(Error(MAXSIM_ERR_INVALID_ARGUMENT, "maxsim_context_plugin: NULL argument"));
  }
  if (ctx->accel == nullptr) {
    return maxsim::Report(Error(MAXSIM_ERR_BACKEND_UNAVAILABLE, "the context runs on the CPU (%s)",
                                ctx->backend_note.c_str()));
  }
  if (device >= ctx->shard_backends.size()) {
    return maxsim::Report(Error(MAXSIM_ERR_INVALID_ARGUMENT, "device slot %u: the context has %zu", device,
                                ctx->shard_backends.size()));
  }
  *api = ctx->accel->api;
  *backend = ctx->shard_backends[device];
  return MAXSIM_OK;
}
