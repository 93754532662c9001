/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libmaxsim: exact late-interaction (MaxSim) scoring. Stable C API.
 *
 *   score(Q, D) = sum over query tokens q of  max over document tokens d of  sim(q, d)
 *   sim = <q, d> (MAXSIM_METRIC_DOT, ColBERT) or <q, d> / (||q|| ||d||) (MAXSIM_METRIC_COSINE)
 *
 * Conventions (docs/semantics.md has the full text and the reasons):
 *  - f32 accumulation. The similarity of one (query token, document token) pair is the sequential f32 fused
 *    multiply-add chain over k = 0..dim-1 starting from +0, on inputs converted exactly to f32. Every CPU
 *    kernel computes exactly this, so exact results are bit-identical across ISAs and thread counts.
 *  - Ties go to the lowest document-token index. The per-token maxima are summed in double, in token order, in
 *    one pass, and rounded once to f32; a sum beyond the f32 range saturates to +-FLT_MAX, so that no accepted
 *    input scores a non-finite value other than an empty document's -INFINITY.
 *  - A document set with no tokens scores -INFINITY (it never outranks a real document; argmax -1); a query
 *    set with no tokens scores 0 against any non-empty document. Masked document tokens are excluded (never
 *    treated as 0); masked query tokens contribute 0 and get argmax -1.
 *  - Modes: EXACT (full-precision originals); CERTIFIED (i8 screening, then exact refinement of every document
 *    token the error bound cannot exclude: the same scores and argmaxes as EXACT, bit for bit, on the CPU);
 *    APPROXIMATE (i8 argmax with scales applied, then only that token refined: fastest, not exact).
 *    Dense documents have no stored codes: certified and approximate quantise each document they score, per
 *    call. That pays in certified mode only when many query tokens share each document, so CERTIFIED on dense host
 *    documents runs the exact path (the same bits, as promised; maxsim_stats.refined stays 0) when fewer than 256
 *    query tokens are scored against each document: those of all query sets (matrix, top-k) or of the longest
 *    query set (candidates, pairs). APPROXIMATE always screens. Pack documents that are scored more than once.
 *  - Accepted vectors: finite elements and L2 norm <= 1e19 (so no f32 dot product can overflow). Anything else
 *    is rejected with MAXSIM_ERR_NON_FINITE naming the set and token.
 *
 * Errors: every function returns a maxsim_status; on failure maxsim_last_error() (thread-local) holds a
 * message naming what is wrong and how to fix it. The library never prints, aborts or exits. Output buffers are
 * left untouched or partially written on failure; inputs are never modified.
 *
 * Threads: a context may be used from several threads at once; each call parallelises internally with OpenMP
 * (MAXSIM_NUM_THREADS or maxsim_options.num_threads).
 */
#ifndef MAXSIM_MAXSIM_H_
#define MAXSIM_MAXSIM_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define MAXSIM_API __declspec(dllexport)
#else
#define MAXSIM_API __attribute__((visibility("default")))
#endif

#include "maxsim/version.h" /* MAXSIM_VERSION_MAJOR/MINOR/PATCH/STRING, generated from CMake's project(VERSION) */

/* ----------------------------------------------------------------------------------------------------- */
/* Status codes and errors                                                                               */
/* ----------------------------------------------------------------------------------------------------- */

typedef enum maxsim_status {
  MAXSIM_OK = 0,
  MAXSIM_ERR_INVALID_ARGUMENT = 1,   /* a null pointer, a bad enum value, a size or shape that does not fit */
  MAXSIM_ERR_INVALID_BUFFER = 2,     /* a packed buffer or file failed validation */
  MAXSIM_ERR_NON_FINITE = 3,         /* an input vector has NaN/Inf or a norm above 1e19 */
  MAXSIM_ERR_DIM_MISMATCH = 4,       /* queries and documents have different dimensions */
  MAXSIM_ERR_IO = 5,                 /* a file could not be opened, read, written or mapped */
  MAXSIM_ERR_OUT_OF_MEMORY = 6,      /* host or device allocation failed */
  MAXSIM_ERR_UNSUPPORTED = 7,        /* valid request this build or backend does not implement */
  MAXSIM_ERR_BACKEND_UNAVAILABLE = 8,/* a named backend or ISA is not available on this machine */
  MAXSIM_ERR_BUFFER_TOO_SMALL = 9,   /* an output capacity is too small; the needed size is reported */
  MAXSIM_ERR_PLUGIN = 10,            /* a plugin reported a failure (launch failure, device error) */
  MAXSIM_ERR_INTERNAL = 11,          /* a bug in libmaxsim: please report it with the message */
  MAXSIM_ERR_CANCELLED = 12,         /* the progress callback asked the call to stop (maxsim_set_progress) */
  MAXSIM_STATUS_FORCE_INT32 = 0x7FFFFFFF /* keeps the enum 32-bit; never returned */
} maxsim_status;

/* Message of the last failed call on this thread ("" if none). Valid until the next failing call on this
 * thread. Never NULL. */
MAXSIM_API const char* maxsim_last_error(void);
/* Short constant name of a status ("MAXSIM_ERR_INVALID_BUFFER"). Never NULL. */
MAXSIM_API const char* maxsim_status_name(maxsim_status status);

/* Version of the library actually loaded: MAJOR * 10000 + MINOR * 100 + PATCH. */
MAXSIM_API uint32_t maxsim_version(void);
MAXSIM_API const char* maxsim_version_string(void);

/* Progress and cancellation of long calls. The callback registered by a thread applies to the calls that thread
 * makes afterwards (maxsim_pack, maxsim_pack_into, maxsim_pack_with_string_ids, maxsim_score_matrix,
 * maxsim_score_pairs, maxsim_score_candidates, maxsim_topk on the CPU backend): it runs on the calling thread only
 * (never on a worker), at most every 50 ms, the first time 50 ms after the call started (short calls never see
 * it), with the units done so far and the call's total (packing: token rows; scoring: (query set, document set)
 * pairs). Return 0 to go on; non-zero cancels: the workers skip the remaining units and the call returns
 * MAXSIM_ERR_CANCELLED (outputs partially written, nothing allocated for the caller). NULL removes the callback.
 * Calls a plugin runs report nothing. */
typedef int (*maxsim_progress_fn)(void* user_data, uint64_t done, uint64_t total);
MAXSIM_API void maxsim_set_progress(maxsim_progress_fn fn, void* user_data);

/* ----------------------------------------------------------------------------------------------------- */
/* Enumerations (each ends with a *_FORCE_INT32 member that keeps it 32-bit; the library reads enum fields  */
/* as plain integers and rejects values it does not know, with a message)                                */
/* ----------------------------------------------------------------------------------------------------- */

typedef enum maxsim_dtype { MAXSIM_F32 = 1, MAXSIM_F16 = 2, MAXSIM_BF16 = 3, MAXSIM_DTYPE_FORCE_INT32 = 0x7FFFFFFF } maxsim_dtype;
typedef enum maxsim_metric {
  MAXSIM_METRIC_DOT = 0,
  MAXSIM_METRIC_COSINE = 1,
  MAXSIM_METRIC_FORCE_INT32 = 0x7FFFFFFF
} maxsim_metric;
typedef enum maxsim_mode {
  MAXSIM_MODE_EXACT = 0,
  MAXSIM_MODE_CERTIFIED = 1,
  MAXSIM_MODE_APPROXIMATE = 2,
  MAXSIM_MODE_FORCE_INT32 = 0x7FFFFFFF
} maxsim_mode;
typedef enum maxsim_memory {
  MAXSIM_MEMORY_HOST = 0,
  MAXSIM_MEMORY_CUDA = 1,
  MAXSIM_MEMORY_FORCE_INT32 = 0x7FFFFFFF
} maxsim_memory;
typedef enum maxsim_log_level {
  MAXSIM_LOG_DEBUG = 0,
  MAXSIM_LOG_INFO = 1,
  MAXSIM_LOG_WARNING = 2,
  MAXSIM_LOG_ERROR = 3,
  MAXSIM_LOG_FORCE_INT32 = 0x7FFFFFFF
} maxsim_log_level;

/* Log sink for the few events a user may want to see (a plugin skipped, the backend chosen). The library
 * never prints: without a callback these messages are dropped. */
typedef void (*maxsim_log_fn)(void* user_data, maxsim_log_level level, const char* message);

/* ----------------------------------------------------------------------------------------------------- */
/* Context                                                                                               */
/* ----------------------------------------------------------------------------------------------------- */

typedef struct maxsim_context maxsim_context;

typedef struct maxsim_options {
  uint32_t struct_size;   /* sizeof(maxsim_options): lets later versions append fields */
  int32_t num_threads;    /* 0: MAXSIM_NUM_THREADS if set, else OpenMP's default. 1..4096 are used as given
                             once the process has been seen to start that many threads at once; anything else,
                             or a count the process limits (ulimit -u, cgroup pids.max, memory) do not allow,
                             fails maxsim_context_create with MAXSIM_ERR_INVALID_ARGUMENT (never capped) */
  /* Backend: NULL or "" reads MAXSIM_BACKEND (default "auto"). "auto": a GPU plugin when one is available and
   * the work is large enough, else the CPU. "cpu": always the CPU. Any other name (e.g. "cuda") must be a
   * loaded, available plugin, else maxsim_context_create fails with MAXSIM_ERR_BACKEND_UNAVAILABLE. */
  const char* backend;
  /* CPU kernel: NULL or "" reads MAXSIM_ISA (default: the best available). A name from
   * maxsim_kernel_count/maxsim_kernel_name forces it; an unknown or unsupported name fails with a message. */
  const char* isa;
  /* Extra plugin search path (':'-separated folders or .so files), searched before MAXSIM_PLUGIN_PATH and
   * the library's own folder. NULL: none. */
  const char* plugin_path;
  uint32_t load_plugins;  /* 1 (default via maxsim_options_init): look for plugins; 0: CPU only, no dlopen */
  maxsim_log_fn log;      /* NULL: drop log messages */
  void* log_user_data;
  /* Accelerator devices: NULL or "" lets the backend choose (the CUDA backend reads MAXSIM_CUDA_DEVICES, else
   * device 0). Else a comma-separated list of device ordinals, e.g. "0,1": one backend per entry (an ordinal may
   * repeat, giving that device several backends, each with its own stream). Packed corpora are then split into
   * contiguous shards, one per entry, every call runs on all shards at once and the results are merged exactly:
   * the same bits as one device (docs/cuda.md, "Several GPUs"). A list that is not of this form fails
   * maxsim_context_create with MAXSIM_ERR_INVALID_ARGUMENT. */
  const char* devices;
} maxsim_options;

/* Fills defaults (everything from the environment, plugins loaded) into the first `size` bytes of *options (the
 * caller's sizeof(maxsim_options)) and sets struct_size = size: a caller built against an older maxsim.h, whose
 * struct is shorter, gets nothing written past it. A size beyond this library's struct (a newer maxsim.h) gets
 * this library's fields and struct_size = this library's sizeof; the bytes past it are left alone and never read.
 * A size below the first released layout (the fields up to log_user_data) writes only struct_size = 0 (nothing
 * when size < 4), so that maxsim_context_create then fails naming it. NULL: nothing. */
MAXSIM_API void maxsim_options_init_sized(maxsim_options* options, size_t size);
/* maxsim_options_init(&o) fills the whole struct the caller was compiled with (a macro passing its sizeof). The
 * exported function of this name (called by binaries built before the macro, or through a foreign-function
 * interface that does not expand macros) fills the first released layout only, up to log_user_data, with
 * struct_size set to that size: the appended fields are then not read, even if set; call maxsim_options_init_sized
 * with the struct's full size to use them. */
MAXSIM_API void maxsim_options_init(maxsim_options* options);
#define maxsim_options_init(options) maxsim_options_init_sized((options), sizeof(maxsim_options))

/* Creates a context: detects CPU features, selects the CPU kernel, loads plugins, selects the backend.
 * options may be NULL (defaults). */
MAXSIM_API maxsim_status maxsim_context_create(const maxsim_options* options, maxsim_context** out);
MAXSIM_API void maxsim_context_destroy(maxsim_context* ctx);

/* Human-readable report: version, CPU features detected, every CPU kernel with "selected", "available" or
 * "unavailable because ...", the reason for the choice, plugins found and why each was used or skipped, the
 * backend, thread count. Writes at most `capacity` bytes including the terminator; *needed (if not NULL)
 * receives the full length + 1. Returns MAXSIM_ERR_BUFFER_TOO_SMALL if it did not fit. */
MAXSIM_API maxsim_status maxsim_context_report(const maxsim_context* ctx, char* text, size_t capacity,
                                               size_t* needed);
/* Name of the CPU kernel this context runs ("avx2", "scalar", ...) and of the backend ("cpu", "cuda"). */
MAXSIM_API const char* maxsim_context_kernel(const maxsim_context* ctx);
MAXSIM_API const char* maxsim_context_backend(const maxsim_context* ctx);
MAXSIM_API int32_t maxsim_context_num_threads(const maxsim_context* ctx);

/* The kernel list, in priority order (highest first). available is 1 if this machine can run kernel i;
 * otherwise *reason (if not NULL) says why not. */
MAXSIM_API size_t maxsim_kernel_count(void);
MAXSIM_API const char* maxsim_kernel_name(size_t i);
MAXSIM_API int maxsim_kernel_available(size_t i, const char** reason);

/* ----------------------------------------------------------------------------------------------------- */
/* Token sets: dense (row-major, no packing) and packed                                                  */
/* ----------------------------------------------------------------------------------------------------- */

/* A collection of token sets in row-major memory. Set i owns rows [offsets[i], offsets[i+1]) when offsets is
 * given (like cu_seqlens; offsets[0] need not be 0), else rows [i * set_length, (i+1) * set_length).
 *
 * Per-set memory (set_data): sets that live in separate allocations (a list of per-document arrays, PyLate's
 * documents_embeddings) are described in place, without concatenating them. set_data holds n_sets pointers; row
 * r of set i (r counted as above, from offsets[i] or i * set_length) is at set_data[i] + (r - first row of set i)
 * * row_stride elements: each set's rows contiguous with the common row stride, data NULL. A set with rows needs a
 * non-NULL pointer aligned to its element size (4 bytes for f32, 2 for f16/bf16); an empty set's pointer may be
 * NULL. The mask and every output indexed by rows (argmax positions, backward gradients) count rows exactly as
 * for data: results are the same bits as for the concatenated rows. Host memory only (MAXSIM_MEMORY_CUDA with
 * set_data is MAXSIM_ERR_UNSUPPORTED). A plugin never sees such sets: the host packs them for it. set_data is read
 * only when struct_size covers it, so callers built against an older maxsim.h keep working unchanged. */
typedef struct maxsim_dense_sets {
  uint32_t struct_size;     /* sizeof(maxsim_dense_sets) */
  maxsim_memory memory;     /* where data and mask live; offsets are always host memory */
  const void* data;         /* first row (NULL when set_data is given) */
  maxsim_dtype dtype;
  uint32_t dim;
  uint64_t row_stride;      /* elements between consecutive rows; 0 means dim */
  uint64_t n_sets;
  const uint64_t* offsets;  /* n_sets + 1 non-decreasing values, or NULL to use set_length */
  uint64_t set_length;      /* rows per set when offsets is NULL */
  const uint8_t* mask;      /* optional: one byte per row (indexed like the rows), 0 = padding token */
  const void* const* set_data; /* optional, appended: n_sets pointers to each set's first row (see above) */
} maxsim_dense_sets;

/* Opaque, validated, read-only packed collection. Either borrows the caller's memory (maxsim_packed_open),
 * owns a heap copy (maxsim_pack) or maps a file read-only (maxsim_packed_load). */
typedef struct maxsim_packed maxsim_packed;

/* Validation depth for buffers from outside. STANDARD checks every header field, region, offset and count
 * with overflow-safe arithmetic, every metadata record, every code (range and zero padding), that every
 * original is finite with a norm <= 1e19 (computed from the originals) and that the norm and scale records equal
 * the ones recomputed from the originals, and the payload checksum. DEEP also re-quantises every vector and
 * requires codes and metadata to match bit for bit (what certified mode's guarantee rests on, against buffers
 * crafted by hand). FAST checks the header, regions and offsets only (O(sets), no pass over the vectors): use
 * it only on buffers this process packed itself, or that the caller vouches for.
 * Certified mode and trust: a handle opened or loaded at STANDARD is DEEP-validated once, before its first
 * CERTIFIED call (with the context's threads); if its codes or metadata do not match its originals, that call and
 * every later certified call on it fail with MAXSIM_ERR_INVALID_BUFFER instead of returning a non-exact answer.
 * Handles from maxsim_pack* or opened at DEEP are proven; at FAST, the caller's word is taken (packing/README.md,
 * "Trust and validation"). */
typedef enum maxsim_validation {
  MAXSIM_VALIDATE_STANDARD = 0,
  MAXSIM_VALIDATE_DEEP = 1,
  MAXSIM_VALIDATE_FAST = 2,
  MAXSIM_VALIDATE_FORCE_INT32 = 0x7FFFFFFF
} maxsim_validation;

/* Bytes a packed buffer of these sets needs (depends only on counts, dim and dtype). */
MAXSIM_API maxsim_status maxsim_pack_size(const maxsim_dense_sets* sets, int with_ids, uint64_t* size);
/* Packs host-memory sets (f32, f16 or bf16; masked rows are dropped) into `out` (capacity bytes, 64-byte
 * aligned recommended). ids: NULL or n_sets external ids. Rejects non-finite values (MAXSIM_ERR_NON_FINITE,
 * naming the first offending vector) before writing anything. ctx may be NULL (single thread). */
MAXSIM_API maxsim_status maxsim_pack_into(maxsim_context* ctx, const maxsim_dense_sets* sets,
                                          const uint64_t* ids, void* out, uint64_t capacity,
                                          uint64_t* written);
/* Packs into a new owned handle. */
MAXSIM_API maxsim_status maxsim_pack(maxsim_context* ctx, const maxsim_dense_sets* sets, const uint64_t* ids,
                                     maxsim_packed** out);
/* Packs like maxsim_pack and also stores one string id per set (packed format 1.1): string_ids holds n_sets
 * NUL-terminated UTF-8 strings, each non-empty and free of tab, line feed and carriage return (ids live in
 * line- and tab-separated files); a bad id fails with MAXSIM_ERR_INVALID_ARGUMENT naming it. ids (numeric) may
 * be given too, or NULL. */
MAXSIM_API maxsim_status maxsim_pack_with_string_ids(maxsim_context* ctx, const maxsim_dense_sets* sets,
                                                     const uint64_t* ids, const char* const* string_ids,
                                                     maxsim_packed** out);
/* Validates `buffer` (see maxsim_validation) and wraps it without copying; the caller keeps it alive and
 * unchanged until maxsim_packed_release. */
MAXSIM_API maxsim_status maxsim_packed_open(const void* buffer, uint64_t size, maxsim_validation level,
                                            maxsim_packed** out);
/* Validates a buffer without keeping anything. */
MAXSIM_API maxsim_status maxsim_validate(const void* buffer, uint64_t size, maxsim_validation level);
/* Maps a file read-only (zero copy) and validates it. */
MAXSIM_API maxsim_status maxsim_packed_load(const char* path, maxsim_validation level, maxsim_packed** out);
/* Writes the buffer to `path` (via a temporary file renamed into place: a failure leaves no partial file). */
MAXSIM_API maxsim_status maxsim_packed_save(const maxsim_packed* packed, const char* path);
MAXSIM_API void maxsim_packed_release(maxsim_packed* packed);

typedef struct maxsim_packed_desc {
  uint64_t n_sets;
  uint64_t n_vectors;
  uint32_t dim;
  maxsim_dtype dtype;       /* dtype of the originals */
  int has_ids;
  uint64_t size;            /* bytes */
  const void* data;         /* the buffer itself */
  const uint64_t* offsets;  /* n_sets + 1 token offsets */
  const uint64_t* ids;      /* n_sets ids, or NULL */
} maxsim_packed_desc;
MAXSIM_API maxsim_status maxsim_packed_describe(const maxsim_packed* packed, maxsim_packed_desc* desc);
/* String id of set i: *id points into the buffer (NUL-terminated UTF-8, valid as long as the handle) and
 * *length (if not NULL) receives its bytes. A collection without string ids gives *id = NULL, *length = 0 and
 * MAXSIM_OK; i >= n_sets fails with MAXSIM_ERR_INVALID_ARGUMENT. */
MAXSIM_API maxsim_status maxsim_packed_string_id(const maxsim_packed* packed, uint64_t i, const char** id,
                                                 size_t* length);

/* Either a packed collection or dense sets: exactly one member is non-NULL. */
typedef struct maxsim_sets {
  const maxsim_packed* packed;
  const maxsim_dense_sets* dense;
} maxsim_sets;

/* ----------------------------------------------------------------------------------------------------- */
/* Scoring                                                                                               */
/* ----------------------------------------------------------------------------------------------------- */

/* Counters a call can report (optional). */
typedef struct maxsim_stats {
  uint64_t pairs;                /* (query set, document set) pairs scored */
  uint64_t query_tokens;         /* query-token x document evaluations (sum over pairs of Lq) */
  uint64_t refined;              /* document tokens refined with the originals (certified/approximate) */
  uint64_t multi_candidate;      /* query-token x document evaluations whose candidate set had > 1 token */
  uint64_t docs_pruned;          /* top-k: documents excluded by their certified upper bound alone */
} maxsim_stats;

typedef struct maxsim_score_options {
  uint32_t struct_size;          /* sizeof(maxsim_score_options) */
  maxsim_metric metric;
  maxsim_mode mode;
  maxsim_stats* stats;           /* optional: filled on success */
  void* cuda_stream;             /* cudaStream_t for MAXSIM_MEMORY_CUDA inputs (NULL: default stream) */
  /* Appended (read only when struct_size covers it): MAXSIM_CALL_* bits, 0 by default. */
  uint32_t flags;
} maxsim_score_options;

/* Stream-ordered call (maxsim_score_options.flags, maxsim_backward_args.flags): for MAXSIM_MEMORY_CUDA tensors in
 * and out only (a call with host inputs or a packed corpus that sets it fails with MAXSIM_ERR_INVALID_ARGUMENT).
 * The call returns once its work is enqueued on the stream, without waiting for it. Its host-side checks (shapes,
 * pointers, memory kinds) still fail the call at once; the checks of the tensors' values on the device (a
 * non-finite or overflowing token, a bad argmax or gradient entry in the backward) are deferred: the outputs of a
 * call that fails one are NaN (scores, gradients) and -1 (argmax) once the stream reaches them, and
 * maxsim_synchronize reports the error with the message the synchronous call gives, naming the call; so does the
 * next call on the context that reaches the accelerator backend and finds the failure already recorded (that
 * call then fails without scoring on that backend; with several devices the other devices' shares of its outputs
 * may be written, so treat its outputs as on any failure; calls the context keeps on the CPU do not report it).
 * Without
 * the flag (the default) every call with device tensors waits for its stream and reports everything itself. A
 * plugin without deferred work (no synchronize member) runs flagged calls as synchronous ones. No flagged call
 * runs on the CPU: host memory fails as above, and device tensors in a context without an accelerator backend
 * fail with MAXSIM_ERR_BACKEND_UNAVAILABLE, as they do without the flag. Consecutive stream-ordered calls may use
 * different streams: the library orders its own reuse of scratch memory between them on the device. docs/cuda.md
 * says when to use it. */
#define MAXSIM_CALL_STREAM_ORDERED 1u

/* Fills defaults (metric DOT, mode EXACT, no stats, default stream, no flags) into the first `size` bytes of
 * *options (the caller's sizeof(maxsim_score_options)) as maxsim_options_init_sized does: nothing is written past
 * the caller's struct or this library's; a size below the first released layout (the fields up to cuda_stream)
 * writes only struct_size = 0 (nothing when size < 4), so that the scoring call then fails naming it. */
MAXSIM_API void maxsim_score_options_init_sized(maxsim_score_options* options, size_t size);
/* maxsim_score_options_init(&o): the whole struct the caller was compiled with (a macro passing its sizeof). The
 * exported function of this name fills the first released layout only (up to cuda_stream; flags are then not
 * read): use maxsim_score_options_init_sized with the full size from a foreign-function interface. */
MAXSIM_API void maxsim_score_options_init(maxsim_score_options* options);
#define maxsim_score_options_init(options) maxsim_score_options_init_sized((options), sizeof(maxsim_score_options))

/* Device memory (the CUDA backend, docs/cuda.md). When the queries and documents are dense sets with memory =
 * MAXSIM_MEMORY_CUDA (both must be), every output of the scoring calls below (scores, argmax) is device memory
 * too, the work is enqueued on options->cuda_stream, and the call returns once that stream has finished it (so
 * that errors come back as statuses); offsets and candidate lists stay host memory. Device inputs score in
 * EXACT mode only (CERTIFIED/APPROXIMATE need packed buffers) and top-k needs a packed corpus. With a packed
 * corpus (host memory, uploaded once and cached per context) and host queries, outputs are host memory.
 * Device inputs are checked by the scoring kernels themselves (docs/cuda.md): a NaN or infinite element in a
 * kept token is MAXSIM_ERR_NON_FINITE naming it, with every score set to NaN and every argmax to -1; with the
 * dot metric a finite token whose norm exceeds 1e19 is rejected only where one of its similarities overflows. */

/* Argmax layout. For query set i (Lq_i tokens; o_i = number of query tokens in earlier sets), its c-th scored
 * document (c = document index for the matrix, 0 for pairs, candidate slot for candidates) and query token s,
 * the argmax is at  base_i + c * Lq_i + s,  where base_i = Nd * o_i (matrix), o_i (pairs), or the sum over
 * earlier queries i' of K_i' * Lq_i' (candidates, K_i = candidates of query i). For uniform shapes this is
 * [Nq, Nd, Lq], [B, Lq] and [Nq, K, Lq]. The value is the document-token index within its set (row position,
 * masked rows counted), or -1 (empty document, masked query token). */

/* Every query set against every document set: scores[i * Nd + j] (row-major [Nq, Nd]). argmax optional
 * (size: Nd * total query tokens). */
MAXSIM_API maxsim_status maxsim_score_matrix(maxsim_context* ctx, const maxsim_sets* queries,
                                             const maxsim_sets* documents, const maxsim_score_options* options,
                                             float* scores, int32_t* argmax);

/* Query set i against document set i (Nq == Nd): scores[i]. argmax optional (total query tokens). */
MAXSIM_API maxsim_status maxsim_score_pairs(maxsim_context* ctx, const maxsim_sets* queries,
                                            const maxsim_sets* documents, const maxsim_score_options* options,
                                            float* scores, int32_t* argmax);

/* Per-query candidate lists (reranking, knowledge distillation): query i is scored against document sets
 * candidates[cand_offsets[i] .. cand_offsets[i+1]) (indices into documents; repeats allowed).
 * scores[cand_offsets[i] + c]. cand_offsets: Nq + 1 non-decreasing values starting at 0. With dense host
 * documents on the CPU backend only the listed documents are read and value-checked (time and memory follow
 * the candidates, not the corpus); a rejected one is named by its first bad row in document order. */
MAXSIM_API maxsim_status maxsim_score_candidates(maxsim_context* ctx, const maxsim_sets* queries,
                                                 const maxsim_sets* documents, const uint64_t* cand_offsets,
                                                 const uint64_t* candidates,
                                                 const maxsim_score_options* options, float* scores,
                                                 int32_t* argmax);

/* Streaming top-k: for each query set, the k best document sets (score descending, ties by lower document
 * index), without materialising the score matrix. Outputs [Nq, k]: scores, document indices and (optional,
 * needs a packed corpus with ids) ids. If the corpus has fewer than k documents, the tail of each row is
 * score -INFINITY, index UINT64_MAX, id UINT64_MAX. */
MAXSIM_API maxsim_status maxsim_topk(maxsim_context* ctx, const maxsim_sets* queries,
                                     const maxsim_sets* documents, uint64_t k, const maxsim_score_options* options,
                                     float* scores, uint64_t* doc_index, uint64_t* ids);

/* ----------------------------------------------------------------------------------------------------- */
/* Training backward (dot metric)                                                                        */
/* ----------------------------------------------------------------------------------------------------- */

typedef enum maxsim_layout {
  MAXSIM_LAYOUT_MATRIX = 0,     /* scores [Nq, Nd] (in-batch) */
  MAXSIM_LAYOUT_PAIRS = 1,      /* scores [B] */
  MAXSIM_LAYOUT_CANDIDATES = 2, /* scores [total candidates] (KD) */
  MAXSIM_LAYOUT_FORCE_INT32 = 0x7FFFFFFF
} maxsim_layout;

typedef struct maxsim_backward_args {
  uint32_t struct_size;              /* sizeof(maxsim_backward_args): maxsim_backward_args_init(&a) fills it */
  maxsim_layout layout;
  const uint64_t* cand_offsets;      /* CANDIDATES layout only */
  const uint64_t* candidates;        /* CANDIDATES layout only */
  const int32_t* argmax;             /* from the forward, in its layout */
  const float* grad_scores;          /* dL/dscore, shaped like the forward's scores */
  float* grad_queries;               /* out: dL/dQ, f32, one row of dim per query row (row_stride = dim);
                                        NULL to skip. Padding/masked rows get 0. */
  float* grad_documents;             /* out: dL/dD likewise; NULL to skip */
  int deterministic;                 /* 1: bit-identical across runs and thread counts (CPU always is; the CUDA
                                        backend then uses a destination-owned reduction, else f32 atomics) */
  void* cuda_stream;                 /* cudaStream_t for MAXSIM_MEMORY_CUDA tensors (NULL: default stream) */
  /* Appended (read only when struct_size covers it): MAXSIM_CALL_* bits, 0 by default. */
  uint32_t flags;
} maxsim_backward_args;

/* Fills defaults (layout MATRIX, every pointer NULL, deterministic 0, default stream, no flags) into the first
 * `size` bytes of *args (the caller's sizeof(maxsim_backward_args)) as maxsim_options_init_sized does: nothing is
 * written past the caller's struct or this library's; a size below the first released layout (the fields up to
 * cuda_stream) writes only struct_size = 0 (nothing when size < 4), so that maxsim_backward then fails naming it. */
MAXSIM_API void maxsim_backward_args_init_sized(maxsim_backward_args* args, size_t size);
/* maxsim_backward_args_init(&a): the whole struct the caller was compiled with (a macro passing its sizeof). The
 * exported function of this name fills the first released layout only (up to cuda_stream; flags are then not
 * read): use maxsim_backward_args_init_sized with the full size from a foreign-function interface. */
MAXSIM_API void maxsim_backward_args_init(maxsim_backward_args* args);
#define maxsim_backward_args_init(args) maxsim_backward_args_init_sized((args), sizeof(maxsim_backward_args))

/* Gradients of sum(grad_scores * scores) for the dot metric given the forward's argmax:
 *   grad_Q[i, s]  = sum over scored documents j of g[i, j] * D[j, argmax[i, j, s]]        (a gather)
 *   grad_D[j, t] += g[i, j] * Q[i, s]  for every (i, s) with argmax[i, j, s] == t           (a scatter)
 * Both outputs are overwritten (not accumulated into). Queries and documents must be dense and in the same
 * memory kind. With MAXSIM_MEMORY_CUDA tensors (the CUDA backend) argmax, grad_scores and both outputs are
 * device memory, the work runs on cuda_stream and the call returns once it has finished. */
MAXSIM_API maxsim_status maxsim_backward(maxsim_context* ctx, const maxsim_dense_sets* queries,
                                         const maxsim_dense_sets* documents, const maxsim_backward_args* args);

/* Waits until every stream-ordered call made on ctx (MAXSIM_CALL_STREAM_ORDERED, on any stream) has finished on
 * the device, and returns the first deferred error among them not yet reported (MAXSIM_OK when there is none, and
 * at once when no call was stream-ordered). Later errors of the same calls are dropped: their outputs are NaN / -1
 * all the same. */
MAXSIM_API maxsim_status maxsim_synchronize(maxsim_context* ctx);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MAXSIM_MAXSIM_H_ */
