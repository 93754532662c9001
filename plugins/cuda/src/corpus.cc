// SPDX-License-Identifier: Apache-2.0
// Corpora and queries on the device: the device image of a host-decoded packed view (originals, metadata,
// codes and rebased offsets, each 256-byte aligned), resident corpora (one device copy) and streamed ones (a
// pinned host copy scored chunk by chunk), the per-document-scale codes of certified screening, and query
// uploads.
#include <cstddef>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>

#include "backend.h"
#include "host_check.h"
#include "host_util.h"
#include "maxsim/packed_format.h"

namespace mscuda {

// ---- device images -----------------------------------------------------------------------------------------

Status DescribeImage(const maxsim_packed_view& v, const char* role, PackedInfo* info) {
  if (v.struct_size < sizeof(maxsim_packed_view) || v.offsets == nullptr || v.dim == 0 ||
      v.orig_dtype < MAXSIM_PACK_F32 || v.orig_dtype > MAXSIM_PACK_BF16 || v.padded_dim % 64 != 0 ||
      v.orig_row_bytes % 64 != 0) {
    return Fail(MAXSIM_ERR_INVALID_ARGUMENT, "%s: not a packed view from a libmaxsim host of ABI 1.1 or newer", role);
  }
  if (v.n_sets > 0xffffffffull) {
    return Fail(MAXSIM_ERR_UNSUPPORTED, "%s: %llu sets; the CUDA backend handles at most 2^32 - 1 per buffer",
                role, static_cast<ull>(v.n_sets));
  }
  if (v.max_set_rows > 0x7fffffffull) {
    return Fail(MAXSIM_ERR_UNSUPPORTED, "%s: a set has %llu tokens; the CUDA backend handles at most 2^31 - 1",
                role, static_cast<ull>(v.max_set_rows));
  }
  PackedInfo in;
  in.dim = v.dim;
  in.padded_dim = v.padded_dim;
  in.orig_row_bytes = v.orig_row_bytes;
  in.dtype = static_cast<int>(v.orig_dtype);
  in.n_vectors = v.n_rows;
  in.n_sets = v.n_sets;
  in.first_row = v.offsets[0];
  in.max_len = v.max_set_rows;
  in.uniform = v.n_sets > 0;
  in.set_length = v.n_sets > 0 ? v.offsets[1] - v.offsets[0] : 0;
  for (uint64_t i = 1; in.uniform && i < v.n_sets; ++i) in.uniform = v.offsets[i + 1] - v.offsets[i] == in.set_length;
  uint64_t at = 0;
  auto place = [&](uint64_t bytes) {
    const uint64_t o = at;
    at += RoundUp(bytes, kAlign);
    return o;
  };
  in.off_orig = place(in.n_vectors * in.orig_row_bytes);
  in.off_meta = place(in.n_vectors * sizeof(maxsim_vector_meta));
  in.off_codes = place(in.n_vectors * in.padded_dim);
  in.off_offsets = place((in.n_sets + 1) * sizeof(uint64_t));
  in.total_size = at;
  *info = in;
  return Status::Ok();
}

void WriteImage(const maxsim_packed_view& v, const PackedInfo& in, uint8_t* dst) {
  const uint64_t r0 = in.first_row;
  std::memcpy(dst + in.off_orig, v.originals + r0 * in.orig_row_bytes, in.n_vectors * in.orig_row_bytes);
  std::memcpy(dst + in.off_meta, v.meta + r0, in.n_vectors * sizeof(maxsim_vector_meta));
  std::memcpy(dst + in.off_codes, v.codes + r0 * in.padded_dim, in.n_vectors * in.padded_dim);
  auto* off = reinterpret_cast<uint64_t*>(dst + in.off_offsets);
  for (uint64_t i = 0; i <= in.n_sets; ++i) off[i] = v.offsets[i] - r0;
}

SetsView PackedView(const PackedInfo& in, const uint8_t* base) {
  SetsView v;
  v.orig = base + in.off_orig;
  v.row_bytes = in.orig_row_bytes;
  v.dtype = in.dtype;
  v.dim = in.dim;
  v.codes = reinterpret_cast<const int8_t*>(base + in.off_codes);
  v.code_bytes = in.padded_dim;
  v.meta = reinterpret_cast<const maxsim_vector_meta*>(base + in.off_meta);
  if (in.uniform) {
    v.set_length = in.set_length;  // the image keeps its offsets region, which the kernels do not read
  } else {
    v.offsets = reinterpret_cast<const uint64_t*>(base + in.off_offsets);
  }
  v.n_sets = in.n_sets;
  v.n_rows = in.n_vectors;
  return v;
}

SetsView RowsFromChunkStart(const PackedInfo& in, const uint64_t* offsets, const uint64_t* dev_offsets, uint64_t j0,
                            uint64_t j1) {
  SetsView all;  // the whole buffer's sets, over rows that start at set j0's first row
  if (in.uniform) all.set_length = in.set_length; else all.offsets = dev_offsets;
  SetsView v = all.Sets(j0, j1);
  v.row_base += offsets[j0];
  v.n_rows = offsets[j1] - offsets[j0];
  return v;
}

SetsView Corpus::View() const {
  SetsView v = PackedView(info, dev.data());
  v.dscodes = doc_scale_codes;
  v.dsinfo = doc_scale_info;
  return v;
}

// ---- corpora ------------------------------------------------------------------------------------------------

Status UploadCorpus(Backend& b, const maxsim_packed_view& view, Corpus** out) {
  MSC_CUDA(cudaSetDevice(b.device));
  auto c = std::make_unique<Corpus>();
  MSC_RETURN(DescribeImage(view, "corpus", &c->info));
  const PackedInfo& in = c->info;
  c->offsets.resize(in.n_sets + 1);
  for (uint64_t i = 0; i <= in.n_sets; ++i) c->offsets[i] = view.offsets[i] - in.first_row;
  c->max_len = in.max_len;
  size_t free_b = 0, total_b = 0;
  MSC_CUDA(cudaMemGetInfo(&free_b, &total_b));
  const uint64_t limit = b.resident_limit ? b.resident_limit : static_cast<uint64_t>(free_b * 0.8);
  c->streamed = b.force_stream || in.total_size > limit;
  if (!c->streamed) {
    // Resident: each region copied from the host's buffer straight into the device image.
    MSC_RETURN(c->dev.Reserve(in.total_size, "the corpus"));
    uint8_t* d = c->dev.data();
    const uint64_t r0 = in.first_row;
    MSC_CUDA(cudaMemcpy(d + in.off_orig, view.originals + r0 * in.orig_row_bytes, in.n_vectors * in.orig_row_bytes,
                        cudaMemcpyHostToDevice));
    MSC_CUDA(cudaMemcpy(d + in.off_meta, view.meta + r0, in.n_vectors * sizeof(maxsim_vector_meta),
                        cudaMemcpyHostToDevice));
    MSC_CUDA(cudaMemcpy(d + in.off_codes, view.codes + r0 * in.padded_dim, in.n_vectors * in.padded_dim,
                        cudaMemcpyHostToDevice));
    MSC_CUDA(cudaMemcpy(d + in.off_offsets, c->offsets.data(), (in.n_sets + 1) * 8, cudaMemcpyHostToDevice));
  } else {
    // Streamed: the image in pinned host memory (the source of every chunk), the offsets on the device.
    MSC_RETURN(c->host.Reserve(in.total_size, "the streamed corpus"));
    WriteImage(view, in, c->host.data());
    MSC_RETURN(c->dev.Reserve((in.n_sets + 1) * 8, "the corpus offsets"));
    MSC_CUDA(cudaMemcpy(c->dev.data(), c->offsets.data(), (in.n_sets + 1) * 8, cudaMemcpyHostToDevice));
    char msg[200];
    std::snprintf(msg, sizeof(msg), "cuda: corpus of %.1f MiB is streamed from pinned host memory (limit %.1f MiB)",
                  in.total_size / 1048576.0, limit / 1048576.0);
    b.Log(MAXSIM_LOG_INFO, msg);
  }
  *out = c.release();
  return Status::Ok();
}

Status EnsureDocScaleCodes(Backend& b, const Corpus& c) {
  std::lock_guard<std::mutex> lock(c.doc_scale_mutex);
  if (c.doc_scale_codes != nullptr || c.streamed) return Status::Ok();
  MSC_RETURN(c.doc_scale.Reserve(DocScaleCodeBytes(c.info.n_vectors, c.info.n_sets),
                                 "the corpus's per-document-scale codes (certified screening)"));
  const int8_t* codes = nullptr;
  const float4* info = nullptr;
  const cudaError_t e = LaunchDocScaleCodes(PackedView(c.info, c.dev.data()), c.info.n_vectors, c.doc_scale.data(),
                                            &codes, &info, b.stream);
  if (e != cudaSuccess) return CudaFail(e, "launching the per-document-scale code builder");
  // The codes are complete before any later work on b.stream; other streams wait for them here.
  MSC_CUDA(cudaStreamSynchronize(b.stream));
  c.doc_scale_codes = codes;
  c.doc_scale_info = info;
  b.Log(MAXSIM_LOG_INFO, "cuda: built per-document-scale int8 codes for certified screening of long queries");
  return Status::Ok();
}

void FreeCorpus(Backend& b, Corpus* c) {
  if (!c) return;
  cudaSetDevice(b.device);
  cudaStreamSynchronize(b.stream);
  cudaStreamSynchronize(b.copy);
  delete c;
}

// ---- queries ------------------------------------------------------------------------------------------------

namespace {

// The word of Backend::flags_host that the cosine query check sets (training uses bytes [0, 40)).
constexpr uint64_t kQueryFlagOffset = 48;
// Larger query images are staged and copied in pieces of about this size, each copy overlapping the next
// piece's memcpy.
constexpr uint64_t kStagePiece = 128ull << 10;

}  // namespace

Status UploadQueriesTo(Backend& b, const maxsim_packed_view& view, DeviceBuffer& dst, DeviceQueries* out) {
  DeviceQueries q;
  MSC_RETURN(DescribeImage(view, "queries", &q.info));
  q.host_offsets.resize(q.info.n_sets + 1);
  for (uint64_t i = 0; i <= q.info.n_sets; ++i) q.host_offsets[i] = view.offsets[i] - q.info.first_row;
  q.max_len = q.info.max_len;
  // The copy is not waited for: the kernels that read dst follow it on the stream.
  MSC_RETURN(StagesFree(b));
  MSC_RETURN(dst.Reserve(q.info.total_size, "the queries"));
  MSC_RETURN(b.qstage.Reserve(q.info.total_size, "staging the queries"));
  WriteImage(view, q.info, b.qstage.data());
  MSC_CUDA(cudaMemcpyAsync(dst.data(), b.qstage.data(), q.info.total_size, cudaMemcpyHostToDevice, b.stream));
  b.qstage_busy = true;
  q.view = PackedView(q.info, dst.data());
  *out = std::move(q);
  return Status::Ok();
}

Status UploadDenseQueries(Backend& b, const maxsim_dense_sets& s, bool cosine, DeviceBuffer& dst, DeviceQueries* out) {
  if (s.memory != MAXSIM_MEMORY_HOST || s.mask != nullptr || s.data == nullptr || s.dim == 0 ||
      (s.dtype != MAXSIM_F32 && s.dtype != MAXSIM_F16 && s.dtype != MAXSIM_BF16)) {
    return Fail(MAXSIM_ERR_INVALID_ARGUMENT, "queries: dense host queries must be host memory without a mask");
  }
  if (s.n_sets > 0xffffffffull) {
    return Fail(MAXSIM_ERR_UNSUPPORTED, "queries: %llu sets; the CUDA backend handles at most 2^32 - 1 per call",
                static_cast<ull>(s.n_sets));
  }
  DeviceQueries q;
  const uint64_t n = s.n_sets;
  const uint64_t first = s.offsets ? s.offsets[0] : 0;
  q.host_offsets.resize(n + 1);
  for (uint64_t i = 0; i <= n; ++i) q.host_offsets[i] = (s.offsets ? s.offsets[i] : i * s.set_length) - first;
  const uint64_t rows = q.host_offsets[n];
  q.max_len = s.offsets ? MaxLen(q.host_offsets.data(), n) : (n ? s.set_length : 0);
  if (q.max_len > 0x7fffffffull) {
    return Fail(MAXSIM_ERR_UNSUPPORTED, "queries: a set has %llu tokens; the CUDA backend handles at most 2^31 - 1",
                static_cast<ull>(q.max_len));
  }
  // Rows as the packed image lays them out (each padded with zeros to a multiple of 64 bytes), so that the
  // kernels and their plan are those of packed queries.
  const uint64_t elem = s.dtype == MAXSIM_F32 ? 4 : 2;
  const uint64_t used = static_cast<uint64_t>(s.dim) * elem;
  const uint64_t stride = (s.row_stride ? s.row_stride : s.dim) * elem;
  const uint64_t row_bytes = RoundUp(used, 64);
  Carver cv;
  const uint64_t o_rows = cv.Add(rows * row_bytes);
  const uint64_t o_off = s.offsets ? cv.Add((n + 1) * 8) : 0;
  const uint64_t o_norms = cosine ? cv.Add(rows * 4) : 0;
  PackedInfo& in = q.info;
  in.dim = s.dim;
  in.orig_row_bytes = static_cast<uint32_t>(row_bytes);
  in.dtype = static_cast<int>(s.dtype);
  in.n_vectors = rows;
  in.n_sets = n;
  in.max_len = q.max_len;
  in.off_orig = o_rows;
  in.off_offsets = o_off;
  in.total_size = cv.size();
  MSC_RETURN(StagesFree(b));
  MSC_RETURN(dst.Reserve(cv.size(), "the queries"));
  MSC_RETURN(b.qstage.Reserve(o_rows + rows * row_bytes + (s.offsets ? (n + 1) * 8 : 0) + kAlign, "staging the queries"));
  uint8_t* h = b.qstage.data();
  const uint8_t* src = static_cast<const uint8_t*>(s.data) + first * stride;
  // Rows into the stage and onto the device, piece by piece: one memcpy and one copy for a small query.
  const uint64_t piece = std::max<uint64_t>(1, kStagePiece / row_bytes);
  for (uint64_t r0 = 0; r0 < rows; r0 += piece) {
    const uint64_t r1 = std::min(rows, r0 + piece);
    uint8_t* to = h + o_rows + r0 * row_bytes;
    if (stride == row_bytes && used == row_bytes) {
      std::memcpy(to, src + r0 * stride, (r1 - r0) * row_bytes);
    } else {
      for (uint64_t r = r0; r < r1; ++r) {
        std::memcpy(h + o_rows + r * row_bytes, src + r * stride, used);
        std::memset(h + o_rows + r * row_bytes + used, 0, row_bytes - used);
      }
    }
    MSC_CUDA(cudaMemcpyAsync(dst.data() + o_rows + r0 * row_bytes, to, (r1 - r0) * row_bytes, cudaMemcpyHostToDevice,
                             b.stream));
  }
  if (s.offsets) {
    std::memcpy(h + o_off, q.host_offsets.data(), (n + 1) * 8);
    MSC_CUDA(cudaMemcpyAsync(dst.data() + o_off, h + o_off, (n + 1) * 8, cudaMemcpyHostToDevice, b.stream));
  }
  b.qstage_busy = true;
  float* norms = cosine ? reinterpret_cast<float*>(dst.data() + o_norms) : nullptr;
  if (cosine) {
    // The norms are the scoring kernels' input: the device computes them (and checks the rows on the way)
    // before those kernels, on b.stream.
    uint8_t* flag = b.flags_host.data() + kQueryFlagOffset;
    *reinterpret_cast<volatile unsigned int*>(flag) = 0u;
    q.bad = reinterpret_cast<volatile unsigned int*>(flag);
    const cudaError_t e =
        LaunchQueryCheck(dst.data() + o_rows, row_bytes, in.dtype, s.dim, rows, norms,
                         reinterpret_cast<unsigned int*>(b.flags_host.device_data() + kQueryFlagOffset), b.stream);
    if (e != cudaSuccess) return CudaFail(e, "launching the query check");
  } else {
    // Dot: the host checks the staged rows while the device scores them (CheckQueriesOnHost).
    q.host_rows = h + o_rows;
    q.host_checked = false;
  }
  SetsView& v = q.view;
  v.orig = dst.data() + o_rows;
  v.row_bytes = row_bytes;
  v.dtype = in.dtype;
  v.dim = s.dim;
  v.norms = norms;
  v.offsets = s.offsets ? reinterpret_cast<const uint64_t*>(dst.data() + o_off) : nullptr;
  v.set_length = s.offsets ? 0 : s.set_length;
  v.n_sets = n;
  v.n_rows = rows;
  *out = std::move(q);
  return Status::Ok();
}

Status PrepareQueries(Backend& b, const maxsim_plugin_score_args& a, DeviceQueries* out) {
  if (a.struct_size >= offsetof(maxsim_plugin_score_args, query_dense) + sizeof(a.query_dense) && a.query_dense) {
    return UploadDenseQueries(b, *a.query_dense, a.metric == MAXSIM_METRIC_COSINE, b.qbuf, out);
  }
  return UploadQueriesTo(b, *a.query_view, b.qbuf, out);
}

void CheckQueriesOnHost(DeviceQueries& q) {
  if (q.host_checked) return;
  q.host_bad = !QueryRowsAccepted(q.host_rows, q.view.row_bytes, q.view.dtype, q.view.dim, q.info.n_vectors);
  q.host_checked = true;
}

Status QueryValues(Backend& b, DeviceQueries& q) {
  b.qstage_busy = false;
  CheckQueriesOnHost(q);
  if (!q.host_bad && (q.bad == nullptr || *q.bad == 0u)) return Status::Ok();
  return Fail(MAXSIM_ERR_NON_FINITE, "queries: a token has a non-finite value or an L2 norm above 1e19");
}

}  // namespace mscuda
