// SPDX-License-Identifier: Apache-2.0
// Corpora and queries on the device: the device image of a host-decoded packed view (originals, metadata,
// codes and rebased offsets, each 256-byte aligned), resident corpora (one device copy) and streamed ones (a
// pinned host copy scored chunk by chunk), the per-document-scale codes of certified screening, and query
// uploads.
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>

#include "backend.h"
#include "host_util.h"

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
  v.offsets = reinterpret_cast<const uint64_t*>(base + in.off_offsets);
  v.n_sets = in.n_sets;
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

Status UploadQueriesTo(Backend& b, const maxsim_packed_view& view, DeviceBuffer& dst, DeviceQueries* out) {
  DeviceQueries q;
  MSC_RETURN(DescribeImage(view, "queries", &q.info));
  q.host_offsets.resize(q.info.n_sets + 1);
  for (uint64_t i = 0; i <= q.info.n_sets; ++i) q.host_offsets[i] = view.offsets[i] - q.info.first_row;
  q.max_len = q.info.max_len;
  // The copy is not waited for: the kernels that read dst follow it on the stream, and the next upload waits for
  // it before writing qstage again (an event that never fired, before the first upload, counts as fired).
  MSC_CUDA(cudaEventSynchronize(b.qstaged));
  MSC_RETURN(dst.Reserve(q.info.total_size, "the queries"));
  MSC_RETURN(b.qstage.Reserve(q.info.total_size, "staging the queries"));
  WriteImage(view, q.info, b.qstage.data());
  MSC_CUDA(cudaMemcpyAsync(dst.data(), b.qstage.data(), q.info.total_size, cudaMemcpyHostToDevice, b.stream));
  MSC_CUDA(cudaEventRecord(b.qstaged, b.stream));
  q.view = PackedView(q.info, dst.data());
  *out = std::move(q);
  return Status::Ok();
}

}  // namespace mscuda
