// SPDX-License-Identifier: Apache-2.0
// The device memory a caller hands over (MAXSIM_MEMORY_CUDA tensors of the training calls and of the public
// scoring calls on device tensors), checked before any kernel reads or writes it: a kernel that touches memory
// CUDA does not know, or another device's memory, faults, and the fault leaves the device unusable for the rest of
// the process. One driver query per pointer (cuPointerGetAttributes: memory type, device, allocation range).
#include <cuda.h>

#include <cstdint>

#include "backend.h"
#include "host_util.h"

namespace mscuda {

void* DriverEntry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  const cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found);
#else
  const cudaError_t e = cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &found);
#endif
  if (e != cudaSuccess) cudaGetLastError();
  return e == cudaSuccess && found == cudaDriverEntryPointSuccess ? fn : nullptr;
}

namespace {

using GetAttributes = CUresult (*)(unsigned, CUpointer_attribute*, void**, CUdeviceptr);

GetAttributes Query() {
  static const GetAttributes fn = reinterpret_cast<GetAttributes>(DriverEntry("cuPointerGetAttributes"));
  return fn;
}

}  // namespace

bool IsDeviceMemory(const void* p) {
  const GetAttributes query = Query();
  if (p == nullptr || query == nullptr) return false;
  unsigned int type = 0;
  uint64_t managed = 0;  // a boolean the driver writes into the low bytes
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED};
  void* data[] = {&type, &managed};
  return query(2, attrs, data, reinterpret_cast<CUdeviceptr>(p)) == CUDA_SUCCESS && type == CU_MEMORYTYPE_DEVICE &&
         managed == 0;
}

namespace {

// `bytes` bytes from p (0: the extent is not known here, only p is checked), named `what` in messages (a plural
// noun: "queries", "the scores"). device_memory (optional): set to 1 if p is plain device memory (IsDeviceMemory),
// 0 if not, left as it is when the driver was not asked.
Status CheckRange(const Backend& b, const void* p, uint64_t bytes, const char* what, int* device_memory = nullptr) {
  const GetAttributes query = Query();
  if (p == nullptr || query == nullptr) return Status::Ok();  // NULL outputs are the operations' to refuse
  unsigned int type = 0;
  int device = -1;
  CUdeviceptr start = 0;
  size_t size = 0;
  uint64_t managed = 0;  // a boolean the driver writes into the low bytes
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                 CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                 CU_POINTER_ATTRIBUTE_IS_MANAGED};
  void* data[] = {&type, &device, &start, &size, &managed};
  if (query(5, attrs, data, reinterpret_cast<CUdeviceptr>(p)) != CUDA_SUCCESS) {
    if (device_memory) *device_memory = 0;
    return Status::Ok();  // the driver cannot describe it: left to the kernels, as before any check
  }
  if (device_memory) *device_memory = type == CU_MEMORYTYPE_DEVICE && managed == 0 ? 1 : 0;
  if (type == 0) {
    return Fail(MAXSIM_ERR_INVALID_ARGUMENT,
                "%s at %p: not CUDA memory (host memory CUDA does not know, or a freed allocation); pass host data as "
                "MAXSIM_MEMORY_HOST", what, p);
  }
  if (type == CU_MEMORYTYPE_DEVICE && managed == 0 && device != b.device) {
    return Fail(MAXSIM_ERR_INVALID_ARGUMENT,
                "%s are on CUDA device %d but this context computes device tensors on device %d (the first of its "
                "device list)", what, device, b.device);
  }
  const uintptr_t at = reinterpret_cast<uintptr_t>(p), end = static_cast<uintptr_t>(start) + size;
  if (bytes > 0 && size > 0 && (at < start || bytes > end - at)) {
    return Fail(MAXSIM_ERR_INVALID_ARGUMENT,
                "%s: %llu bytes from %p are read or written but its CUDA allocation ends %llu bytes after it", what,
                static_cast<ull>(bytes), p, static_cast<ull>(at < end ? end - at : 0));
  }
  return Status::Ok();
}

// The rows of a dense device set and its mask; device_memory as for CheckRange, of the rows.
Status CheckSet(const Backend& b, const maxsim_dense_sets& s, const char* data_what, const char* mask_what,
                int* device_memory) {
  const uint64_t first = s.offsets ? s.offsets[0] : 0;
  uint64_t last = 0;
  if (s.offsets) {
    last = s.offsets[s.n_sets];
  } else if (__builtin_mul_overflow(s.n_sets, s.set_length, &last)) {
    return Status::Ok();  // the operations refuse such shapes
  }
  if (last <= first || s.data == nullptr) return Status::Ok();
  const uint64_t elem = s.dtype == MAXSIM_F32 ? 4 : 2, stride = s.row_stride ? s.row_stride : s.dim;
  uint64_t span = 0, skip = 0;
  const bool fits = !__builtin_mul_overflow(last - 1 - first, stride, &span) && !__builtin_add_overflow(span, s.dim, &span) &&
                    !__builtin_mul_overflow(span, elem, &span) && !__builtin_mul_overflow(first, stride, &skip) &&
                    !__builtin_mul_overflow(skip, elem, &skip);
  if (!fits) return Status::Ok();  // the operations refuse such shapes
  MSC_RETURN(CheckRange(b, static_cast<const uint8_t*>(s.data) + skip, span, data_what, device_memory));
  if (s.mask) MSC_RETURN(CheckRange(b, s.mask + first, last - first, mask_what));
  return Status::Ok();
}

}  // namespace

Status CheckCallerTensors(const Backend& b, const maxsim_plugin_train_args& a, int* documents_device_memory) {
  for (const maxsim_dense_sets* s : {a.queries, a.documents}) {
    if (s->memory != MAXSIM_MEMORY_CUDA) continue;
    const bool q = s == a.queries;
    MSC_RETURN(CheckSet(b, *s, q ? "queries" : "documents", q ? "the query mask bytes" : "the document mask bytes",
                        q ? nullptr : documents_device_memory));
  }
  if (a.queries->memory != MAXSIM_MEMORY_CUDA) return Status::Ok();
  // Scores (and their gradient): one per scored pair.
  const uint64_t nq = a.queries->n_sets, nd = a.documents->n_sets;
  uint64_t pairs = 0;
  if (a.layout == MAXSIM_LAYOUT_MATRIX) {
    if (__builtin_mul_overflow(nq, nd, &pairs)) pairs = 0;
  } else if (a.layout == MAXSIM_LAYOUT_PAIRS) {
    pairs = nq;
  } else if (a.cand_offsets) {
    pairs = a.cand_offsets[nq];
  }
  const uint64_t score_bytes = pairs <= UINT64_MAX / 4 ? pairs * 4 : 0;
  MSC_RETURN(CheckRange(b, a.scores, score_bytes, "the scores"));
  MSC_RETURN(CheckRange(b, a.grad_scores, score_bytes, "the score gradients (grad_scores)"));
  // Argmax and the gradients: their start only.
  MSC_RETURN(CheckRange(b, a.argmax, 0, "the argmax values"));
  MSC_RETURN(CheckRange(b, a.grad_queries, 0, "the query gradients (grad_queries)"));
  MSC_RETURN(CheckRange(b, a.grad_documents, 0, "the document gradients (grad_documents)"));
  return Status::Ok();
}

}  // namespace mscuda
