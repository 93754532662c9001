// SPDX-License-Identifier: Apache-2.0
// Corpora and queries on the device: the packed-buffer description, resident corpora (one device copy) and
// streamed ones (a pinned host copy scored chunk by chunk), the per-document-scale codes of certified
// screening, and query uploads.
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>

#include "backend.h"
#include "host_util.h"

namespace mscuda {

// ---- packed buffers -----------------------------------------------------------------------------------------

Status ParsePacked(const void* buffer, uint64_t size, const char* role, PackedInfo* info) {
  if (buffer == nullptr || size < MAXSIM_PACK_HEADER_SIZE) {
    return Fail(MAXSIM_ERR_INVALID_BUFFER, "%s: packed buffer is missing or shorter than its header", role);
  }
  maxsim_pack_header h;
  std::memcpy(&h, buffer, sizeof(h));
  if (std::memcmp(h.magic, MAXSIM_PACK_MAGIC, 8) != 0 || h.version_major != MAXSIM_PACK_VERSION_MAJOR ||
      h.layout != MAXSIM_PACK_LAYOUT_CANONICAL || h.total_size > size || h.dim == 0 ||
      h.orig_dtype < MAXSIM_PACK_F32 || h.orig_dtype > MAXSIM_PACK_BF16 || h.padded_dim % 64 != 0 ||
      h.orig_row_bytes % 64 != 0 || h.meta_record_bytes != sizeof(maxsim_vector_meta)) {
    return Fail(MAXSIM_ERR_INVALID_BUFFER, "%s: not a canonical libmaxsim packed buffer (the host validates "
                "buffers before handing them to plugins: this is a bug)", role);
  }
  for (int r = 0; r < MAXSIM_REGION_COUNT; ++r) {
    if (h.regions[r].offset % 64 != 0 || h.regions[r].offset > size || h.regions[r].size > size - h.regions[r].offset) {
      return Fail(MAXSIM_ERR_INVALID_BUFFER, "%s: region %d lies outside the buffer", role, r);
    }
  }
  PackedInfo in;
  in.dim = h.dim;
  in.padded_dim = h.padded_dim;
  in.orig_row_bytes = h.orig_row_bytes;
  in.dtype = h.orig_dtype;
  in.n_vectors = h.n_vectors;
  in.n_sets = h.n_sets;
  in.total_size = h.total_size;
  in.off_codes = h.regions[MAXSIM_REGION_CODES].offset;
  in.off_meta = h.regions[MAXSIM_REGION_META].offset;
  in.off_orig = h.regions[MAXSIM_REGION_ORIGINALS].offset;
  in.off_offsets = h.regions[MAXSIM_REGION_OFFSETS].offset;
  if (h.regions[MAXSIM_REGION_OFFSETS].size < (in.n_sets + 1) * 8) {
    return Fail(MAXSIM_ERR_INVALID_BUFFER, "%s: offsets region too small", role);
  }
  in.host_offsets = reinterpret_cast<const uint64_t*>(static_cast<const uint8_t*>(buffer) + in.off_offsets);
  if (in.n_sets > 0xffffffffull) {
    return Fail(MAXSIM_ERR_UNSUPPORTED, "%s: %llu sets; the CUDA backend handles at most 2^32 - 1 per buffer",
                role, static_cast<ull>(in.n_sets));
  }
  *info = in;
  return Status::Ok();
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

Status UploadCorpus(Backend& b, const void* packed, uint64_t size, Corpus** out) {
  MSC_CUDA(cudaSetDevice(b.device));
  auto c = std::make_unique<Corpus>();
  MSC_RETURN(ParsePacked(packed, size, "corpus", &c->info));
  const PackedInfo& in = c->info;
  c->offsets.assign(in.host_offsets, in.host_offsets + in.n_sets + 1);
  c->max_len = MaxLen(c->offsets.data(), in.n_sets);
  if (c->max_len > 0x7fffffffull) {
    return Fail(MAXSIM_ERR_UNSUPPORTED, "corpus: a set has %llu tokens; the CUDA backend handles at most 2^31 - 1",
                static_cast<ull>(c->max_len));
  }
  size_t free_b = 0, total_b = 0;
  MSC_CUDA(cudaMemGetInfo(&free_b, &total_b));
  const uint64_t limit = b.resident_limit ? b.resident_limit : static_cast<uint64_t>(free_b * 0.8);
  c->streamed = b.force_stream || in.total_size > limit;
  if (!c->streamed) {
    MSC_RETURN(c->dev.Reserve(in.total_size, "the corpus"));
    MSC_CUDA(cudaMemcpy(c->dev.data(), packed, in.total_size, cudaMemcpyHostToDevice));
  } else {
    // Streamed: a pinned host copy (the host may free its buffer) and the offsets on the device.
    MSC_RETURN(c->host.Reserve(in.total_size, "the streamed corpus"));
    std::memcpy(c->host.data(), packed, in.total_size);
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

Status UploadQueriesTo(Backend& b, const void* packed, uint64_t size, DeviceBuffer& dst, DeviceQueries* out) {
  DeviceQueries q;
  MSC_RETURN(ParsePacked(packed, size, "queries", &q.info));
  q.host_offsets = q.info.host_offsets;
  q.max_len = MaxLen(q.host_offsets, q.info.n_sets);
  if (q.max_len > 0x7fffffffull) return Fail(MAXSIM_ERR_UNSUPPORTED, "queries: a set is too long for the CUDA backend");
  // The copy is not waited for: the kernels that read dst follow it on the stream, and the next upload waits for
  // it before writing qstage again (an event that never fired, before the first upload, counts as fired).
  MSC_CUDA(cudaEventSynchronize(b.qstaged));
  MSC_RETURN(dst.Reserve(q.info.total_size, "the queries"));
  MSC_RETURN(b.qstage.Reserve(q.info.total_size, "staging the queries"));
  std::memcpy(b.qstage.data(), packed, q.info.total_size);
  MSC_CUDA(cudaMemcpyAsync(dst.data(), b.qstage.data(), q.info.total_size, cudaMemcpyHostToDevice, b.stream));
  MSC_CUDA(cudaEventRecord(b.qstaged, b.stream));
  q.view = PackedView(q.info, dst.data());
  *out = q;
  return Status::Ok();
}

}  // namespace mscuda
