// SPDX-License-Identifier: Apache-2.0
// The CUDA plugin's backend object and its operations (host code). plugin_entry.cc wraps these into the C
// plugin ABI (maxsim/plugin.h); the GPU benchmark links them directly to time device-resident work.
#ifndef MAXSIM_PLUGINS_CUDA_BACKEND_H_
#define MAXSIM_PLUGINS_CUDA_BACKEND_H_

#include <cuda_runtime.h>
#include <stdint.h>

#include <mutex>
#include <string>
#include <vector>

#include "deferred.h"
#include "kernels.h"
#include "maxsim/plugin.h"

namespace mscuda {

struct Status {
  maxsim_status code = MAXSIM_OK;
  std::string message;
  bool ok() const { return code == MAXSIM_OK; }
  static Status Ok() { return Status(); }
};
Status Fail(maxsim_status code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// A grow-only device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();
  Status Reserve(uint64_t bytes, const char* what);
  uint8_t* data() const { return ptr_; }
  uint64_t capacity() const { return size_; }
  void Release();

 private:
  uint8_t* ptr_ = nullptr;
  uint64_t size_ = 0;
};

// A grow-only pinned host allocation, mapped into the device's address space: kernels read and write it through
// device_data() (a zero-copy access over the bus, no copy engine, no extra launch).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer();
  Status Reserve(uint64_t bytes, const char* what);
  uint8_t* data() const { return ptr_; }
  uint8_t* device_data() const { return dev_; }
  void Release();

 private:
  uint8_t* ptr_ = nullptr;
  uint8_t* dev_ = nullptr;
  uint64_t size_ = 0;
};

// The device image of a packed collection (a host-decoded maxsim_packed_view, possibly a range of a larger
// buffer): its rows' originals, metadata and codes, then the set offsets rebased to the first row, each region
// 256-byte aligned, total_size bytes in all.
struct PackedInfo {
  uint32_t dim = 0, padded_dim = 0, orig_row_bytes = 0;
  int dtype = kF32;
  uint64_t n_vectors = 0, n_sets = 0, total_size = 0;
  uint64_t first_row = 0;  // the view's offsets[0]
  uint64_t max_len = 0;    // tokens in the longest set
  // Every set has set_length tokens: the device views address the sets by that length (PackedView), so a kernel
  // finds its set's rows without first loading them from the offsets.
  bool uniform = false;
  uint64_t set_length = 0;
  uint64_t off_codes = 0, off_meta = 0, off_orig = 0, off_offsets = 0;
};
Status DescribeImage(const maxsim_packed_view& view, const char* role, PackedInfo* info);
// Writes the image of `view` described by `info` (info.total_size bytes) to host memory at dst.
void WriteImage(const maxsim_packed_view& view, const PackedInfo& info, uint8_t* dst);

// A packed collection on the device: resident (one copy of the whole buffer) or streamed (a pinned host copy,
// documents copied to the device in chunks while the previous chunk is scored).
struct Corpus {
  PackedInfo info;
  std::vector<uint64_t> offsets;  // host copy (rebased)
  uint64_t max_len = 0;
  bool streamed = false;
  DeviceBuffer dev;               // resident: the whole image; streamed: the offsets only
  PinnedBuffer host;              // streamed: the whole image
  // Resident: the per-document-scale codes of the wgmma screening kernel (screen_wgmma.cu), built by the first
  // certified request that uses it (EnsureDocScaleCodes) and kept with the corpus.
  mutable std::mutex doc_scale_mutex;
  mutable DeviceBuffer doc_scale;
  mutable const int8_t* doc_scale_codes = nullptr;
  mutable const float4* doc_scale_info = nullptr;
  SetsView View() const;          // resident only
};

// Queries on the device (the image of a packed view in device memory, or dense host queries' rows) + what the
// host needs to schedule.
struct DeviceQueries {
  PackedInfo info;
  SetsView view;
  std::vector<uint64_t> host_offsets;  // rebased
  uint64_t max_len = 0;
  // Dense queries (ABI 1.2 query_dense) get the packer's value check (every element finite, L2 norm at most
  // 1e19); packed queries were validated by the host. Cosine: the check kernel, which also computes the norms,
  // sets `bad` (a word of pinned host memory, final once the host has synchronised with the stream). Dot: the
  // host checks the staged rows at host_rows (CheckQueriesOnHost) while the device scores them.
  const volatile unsigned int* bad = nullptr;
  const uint8_t* host_rows = nullptr;
  bool host_checked = true;
  bool host_bad = false;
};

// Kernel settings a backend reads once, when it is created (CreateBackend; listed by maxsim info).
struct Tuning {
  // Default kernels that can be switched off, for tests that check each one against the general kernel:
  // MAXSIM_CUDA_NO_PIPE=1, MAXSIM_CUDA_NO_SCREEN_PIPE=1, MAXSIM_CUDA_WGMMA=0, MAXSIM_CUDA_SCREEN_WGMMA=0; and the
  // wgmma screening kernel's candidate records per row, MAXSIM_CUDA_SCREEN_WGMMA_CAP (1..64, default 12).
  KernelSwitches kernels;
  bool smem_kernel = true;  // MAXSIM_CUDA_NO_SMEM_KERNEL=1: long queries on the register kernel instead
  // The deterministic training backward of the matrix and pairs layouts in one launch (LaunchBackwardDoc);
  // MAXSIM_CUDA_NO_DOC_BACKWARD=1: the separate check, grad_Q and sorted-index grad_D kernels, as for candidates.
  bool doc_backward = true;
  // MAXSIM_CUDA_EXPERIMENTAL: a comma-separated list of default-off kernels to use. "screen-wgmma": certified
  // requests of long queries screen with wgmma on the default route (else only when MAXSIM_CUDA_CERTIFIED=screen).
  // "coop-always": kernels.coop_always, the one-block-per-pair grid on every call CoopChosen is asked about
  // (MAXSIM_CUDA_NO_COOP=1 wins). "dealt-always": kernels.dealt_always, the dealt kernel (exact_dealt.cu) on every
  // one-query dot call without a document mask that the grid does not take, up to 32 documents per SM
  // (MAXSIM_CUDA_NO_DEALT=1 wins).
  bool experimental_screen_wgmma = false;
  uint64_t screen_wgmma_min_lq = 256;  // MAXSIM_CUDA_SCREEN_WGMMA_MIN_LQ: the shortest query it screens
  std::string unknown_experimental;    // names in MAXSIM_CUDA_EXPERIMENTAL this build does not know
};
Tuning ReadTuning();
// MAXSIM_CUDA_MATRIX_COLUMNS=0: the plugin hides its column-range score matrix (ABI 1.3 output_layouts) from the
// host, which then stages sharded matrices itself. Read by maxsim_plugin_entry when a context loads the plugin
// and by the settings list of `maxsim info`.
bool MatrixColumnsHidden();

// Stream-ordered calls of one backend (deferred.cc): the slots in flight, the first failure not yet reported, and
// the last stream-ordered call's stream and event (a later call on another stream waits for that event on the
// device before it reuses the backend's scratch memory).
struct DeferredState {
  PinnedBuffer words;                 // kDeferredSlots DeferredWords, 64 bytes apart (mapped)
  DeviceBuffer device;                // kDeferredSlots DeferredDevice
  std::vector<cudaEvent_t> done;      // per slot: recorded after the call's settle kernel
  struct Pending {
    uint32_t slot;
    bool backward;
    std::string call;                 // the public function, for the message
  };
  std::vector<Pending> pending;       // in the order the calls were made
  std::vector<uint32_t> free_slots;
  Status error;                       // the first failure not yet reported
  bool last_ordered = false;          // the backend's last call was stream-ordered: last_event orders reuse
  cudaStream_t last_stream = nullptr;
  cudaEvent_t last_event = nullptr;
};

struct Backend {
  const maxsim_plugin_host* host = nullptr;
  int device = 0;
  cudaDeviceProp prop{};
  cudaStream_t stream = nullptr;    // inference work
  cudaStream_t copy = nullptr;      // streamed corpora: host -> device copies
  cudaEvent_t copied[2] = {nullptr, nullptr}, done[2] = {nullptr, nullptr};
  DeviceBuffer scratch;             // per-call scratch (grow-only)
  DeviceBuffer qbuf;                // the current call's queries
  DeviceBuffer chunk[2];            // streamed corpora: double-buffered document chunks
  PinnedBuffer stage;               // host staging for uploads and results
  PinnedBuffer qstage;              // host staging of the queries, copied to the device on `stream`
  bool qstage_busy = false;         // a copy may still read qstage (the host has not synchronised since; StagesFree)
  PinnedBuffer flags_host;
  // The training backward's two check flags (device memory, all ones when clear). Kept between calls: a call whose
  // kernels reported nothing (the mapped word in flags_host stayed 0) leaves them clear, and the next call needs no
  // memset before its kernels.
  DeviceBuffer backward_flags;
  bool backward_flags_clear = false;  // known to be all ones (set only after a completed, synchronised check)
  cudaEvent_t staged = nullptr;     // recorded after a call's staged uploads: the stage is free once it fires
  bool staged_pending = false;      // `staged` was recorded by a call that returned without waiting (StagesFree)
  uint64_t min_ops = 0;
  uint64_t resident_limit = 0;      // corpora larger than this are streamed (0: 80% of free memory)
  bool force_stream = false;
  uint64_t chunk_bytes = 0;         // streaming chunk size
  // Results of at most this many bytes per chunk (scores + argmax; top-k keys) are written by the kernels straight
  // into the mapped pinned stage instead of device scratch + a copy (MAXSIM_CUDA_MAPPED_RESULTS, default 256 KiB;
  // 0: never). Above it the copy engine moves them faster than scattered 4-byte writes over the bus would.
  uint64_t mapped_results_max = 0;
  // Training calls wait for their stream. false (benchmarks only): a good training call returns with its kernels
  // enqueued; later calls find the pinned stages free (StagesFree), but share the scratch buffers in stream order
  // only, so they must run on the same stream or after a synchronisation.
  bool sync_calls = true;
  // Where certified and approximate requests run (MAXSIM_CUDA_CERTIFIED, read when the backend is created).
  // kAuto: certified requests run the exact kernel (on the GPU the two give identical bits, and screening with
  // exact refinement measured slower at every benchmark shape, docs/cuda.md); approximate requests screen only
  // where the screening kernel's per-warp ring applies (short queries, d <= 128, many pairs: faster than exact
  // there) and run the exact kernel elsewhere (exact results are within the approximate contract).
  // kScreen ("screen"): both modes always screen. kExact ("exact"): neither does.
  enum class ScreenRoute { kAuto, kScreen, kExact };
  ScreenRoute screen_route = ScreenRoute::kAuto;
  Tuning tuning;

  // The kernel mode for a requested mode, query set and number of (query, document) pairs.
  int KernelMode(int mode, const SetsView& q, uint64_t max_lq, uint64_t n_pairs) const;

  // What the backend read when it was created, one line per setting (the plugin's describe hook, maxsim info).
  std::string settings;
  DeferredState deferred;

  void Log(maxsim_log_level level, const std::string& m) const;
};

// Waits for work that earlier calls left running and that may still read or write the backend's pinned stages: a
// query copy not waited for (qstage_busy) and a training call's staged uploads (staged_pending, with sync_calls
// false). Every operation calls it before it writes a stage (PrepareQueries, and the training calls).
Status StagesFree(Backend& b);
// After an operation failed (a status or an exception, possibly after enqueueing work): waits for the backend's
// streams and, for a training call, the caller's stream (caller_stream; NULL: the default stream), so that no later call's host writes (the pinned stages,
// the mapped flag words) or device work (scratch, the backward's persistent check flags) meet the failed call's
// copies and kernels. Errors of the wait itself are dropped: the call has already failed.
void SettleFailedCall(Backend& b, bool training, cudaStream_t caller_stream);

Status Probe(const maxsim_plugin_host* host, std::string* info);
// Backends one context should make: the length of its device list (maxsim_options.devices, else
// MAXSIM_CUDA_DEVICES), else 1.
uint32_t DeviceCount(const maxsim_plugin_host* host);
// The backend on device slot `index` < DeviceCount(host) (entry `index` of the device list, else
// MAXSIM_CUDA_DEVICE).
Status CreateBackend(const maxsim_plugin_host* host, Backend** out, uint32_t index = 0);
void DestroyBackend(Backend* b);

// A driver function through the runtime's entry-point query (the plugin does not link libcuda), or NULL.
void* DriverEntry(const char* name);
// Whether p is plain device memory (not pinned host or managed memory, which callers may also pass as
// MAXSIM_MEMORY_CUDA), by one driver query; false when the driver cannot say.
bool IsDeviceMemory(const void* p);
// The device memory of a training or device-tensor call (caller_memory.cc): every MAXSIM_MEMORY_CUDA pointer must be
// memory CUDA knows that the backend's device can use (its own device memory, managed or pinned host memory), and
// the rows of each dense set, its mask and the scores must lie inside their allocations. MAXSIM_ERR_INVALID_ARGUMENT
// naming the argument otherwise, before any work. documents_device_memory (optional): set to 1 when the documents'
// rows are plain device memory (IsDeviceMemory), 0 when not, left as it is when the driver was not asked about them
// (no rows, or host memory); TrainForward takes it (ForwardArgs::d_device_memory).
Status CheckCallerTensors(const Backend& b, const maxsim_plugin_train_args& a, int* documents_device_memory = nullptr);

// Device memory on the backend's device (the plugin's mem_alloc / mem_free / mem_copy hooks; copies synchronous).
Status DeviceAlloc(Backend& b, uint64_t bytes, void** out);
void DeviceFree(Backend& b, void* p);
Status DeviceCopy(Backend& b, void* dst, const void* src, uint64_t bytes, bool to_device);

// Makes a corpus of a host-decoded packed view (the host may free its memory afterwards).
Status UploadCorpus(Backend& b, const maxsim_packed_view& view, Corpus** out);
void FreeCorpus(Backend& b, Corpus* c);

// Copies the image of a packed query view into `dst` (grow-only) through the pinned query stage (on b.stream), and
// describes it.
Status UploadQueriesTo(Backend& b, const maxsim_packed_view& view, DeviceBuffer& dst, DeviceQueries* out);
// Copies dense host queries (no mask) into `dst` the same way, rows laid out as in a packed image. Cosine: also
// enqueues their check and norms (computed as the packer computes them) on b.stream; dot: leaves the check to
// the host (CheckQueriesOnHost, QueryValues).
Status UploadDenseQueries(Backend& b, const maxsim_dense_sets& s, bool cosine, DeviceBuffer& dst, DeviceQueries* out);
// The call's queries on the device (the caller has selected b.device): its dense host queries when it passes them,
// else its packed view.
Status PrepareQueries(Backend& b, const maxsim_plugin_score_args& a, DeviceQueries* out);
// Checks dense queries' staged rows on the host as the packer does (once; a no-op for other queries). The
// scoring calls run it right after launching their first kernel, so that it overlaps the device's work.
void CheckQueriesOnHost(DeviceQueries& q);
// Call right after synchronising with b.stream (which frees the query stage): MAXSIM_ERR_NON_FINITE when dense
// queries failed their value check. Called before writing any output the caller could take for an answer.
Status QueryValues(Backend& b, DeviceQueries& q);
// The modes (1u << maxsim_mode) in which the backend scores dense host queries as they are: those whose kernels
// read only the originals (the exact kernel; certified and approximate where they run it).
uint32_t DenseQueryModes(const Backend& b);
// The cosine check of UploadDenseQueries (query_check.cu): rows [0, n_rows) of row_bytes bytes from `rows`
// (device memory); sets *bad (device-visible pinned host memory) to 1 on a bad row; norms: per-row L2 norms.
cudaError_t LaunchQueryCheck(const uint8_t* rows, uint64_t row_bytes, int dtype, uint32_t dim, uint64_t n_rows,
                             float* norms, unsigned int* bad, cudaStream_t stream);

// Scores device queries against a corpus: the matrix (d_scores [Nq, Nd] and d_argmax in maxsim.h's layout,
// device memory, argmax optional). Resident corpora only (streamed corpora go through ScoreMatrix).
Status ScoreMatrixDevice(Backend& b, const DeviceQueries& q, const Corpus& c, int metric, int mode,
                         float* d_scores, int32_t* d_argmax, unsigned long long* d_counters, cudaStream_t stream);

Status ScoreMatrix(Backend& b, const maxsim_plugin_score_args& a);
Status ScoreCandidates(Backend& b, const maxsim_plugin_score_args& a);
Status TopK(Backend& b, const maxsim_plugin_score_args& a);
// documents_device_memory: what CheckCallerTensors found (-1: not known; the batch launcher then asks the driver).
Status TrainForward(Backend& b, const maxsim_plugin_train_args& a, int documents_device_memory = -1);
Status TrainBackward(Backend& b, const maxsim_plugin_train_args& a);
// Whether a training call may return with its work enqueued (MAXSIM_CALL_STREAM_ORDERED; the host sets it).
bool StreamOrdered(const maxsim_plugin_train_args& a);
// The failed value checks' errors, the same for a synchronous call and a deferred one (training.cc): the
// forward's offending token (side 0: queries, 1: documents), the backward's flags (1 + index, ~0 when clear).
Status ForwardValueError(int side, unsigned long long set, unsigned long long token);
Status BackwardValueError(const unsigned long long flags[2]);

// Stream-ordered calls (deferred.cc). Every operation calls BeginOperation first, with the stream it will use: a
// failure of an earlier stream-ordered call that its host words already show is returned (once; the operation
// then does nothing), and the stream waits on the device for the last stream-ordered call when that ran on
// another stream. SynchronizeDeferred waits for every stream-ordered call and returns the first failure not yet
// reported. PollDeferred retires finished calls (wait: all of them).
Status BeginOperation(Backend& b, cudaStream_t stream);
Status SynchronizeDeferred(Backend& b);
Status PollDeferred(Backend& b, bool wait);
// A stream-ordered call's slot: taken before its first launch (AcquireSlot; waits for the oldest call when
// kDeferredSlots are in flight), handed back with the call's settle kernel and event (CommitSlot) or, when the
// call fails first, by AbandonSlot (after the stream has finished).
struct DeferredSlot {
  uint32_t index = 0;
  DeferredDevice* dev = nullptr;
  DeferredWords* words = nullptr;  // device address
  cudaStream_t stream = nullptr;
  bool held = false;
};
Status AcquireSlot(Backend& b, cudaStream_t stream, DeferredSlot* out);
Status CommitSlot(Backend& b, DeferredSlot& slot, const SettleArgs& settle, cudaStream_t stream, bool backward,
                  const char* call);
void AbandonSlot(Backend& b, DeferredSlot& slot);
// Waits for the calls in flight and frees the slots (DestroyBackend).
void ReleaseDeferred(Backend& b);

}  // namespace mscuda

#endif  // MAXSIM_PLUGINS_CUDA_BACKEND_H_
