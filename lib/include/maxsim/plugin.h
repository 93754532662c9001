/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libmaxsim plugin ABI 1.4 (GPU and other accelerator backends loaded at run time).
 *
 * A plugin is a shared library (libmaxsim-plugin-NAME.so / .dylib / .dll) that exports exactly one symbol,
 * MAXSIM_PLUGIN_ENTRY_SYMBOL, a function taking no argument and returning a pointer to a static
 * maxsim_plugin_api. The host:
 *   1. checks abi_major == MAXSIM_PLUGIN_ABI_MAJOR and struct_size >= the size of ABI 1.0's table (minor
 *      versions only append members: the host reads a member only where MAXSIM_PLUGIN_HAS(api, member) or
 *      MAXSIM_PLUGIN_HAS_FIELD(api, member) says the plugin's table holds it);
 *   2. calls probe(): MAXSIM_OK means "usable here" (info describes the device), anything else means
 *      "unavailable" (info says why, e.g. "no CUDA driver (cudaGetDeviceCount returned 35)");
 *   3. calls create() (or create_device() once per device, see device_count) once per context and the
 *      operations below.
 * A plugin that cannot be loaded, has the wrong ABI, lacks the symbol or fails its probe is skipped with one
 * log line and the CPU is used (unless the user named that backend, which is then an error).
 *
 * Only name, probe, create and destroy are required. Every other member may be NULL, which means the backend
 * does not support that operation: under MAXSIM_BACKEND=auto the host then runs the call on the CPU; when the
 * user named the backend (or the inputs are in device memory, which only the plugin can read) the call fails
 * with MAXSIM_ERR_UNSUPPORTED naming the missing member. The host never calls a NULL member.
 *
 * Rules for plugins: never abort, exit or print; return a maxsim_status and write a message (at most err_cap
 * bytes including the terminator) into err. Every packed buffer handed to a plugin has already been validated
 * by the host (MAXSIM_VALIDATE_STANDARD or better) and, from ABI 1.1, arrives decoded as a maxsim_packed_view:
 * a plugin never parses the packed header itself. Dense inputs have been shape-checked (not value-checked).
 * All functions may be called from several host threads for different backends; calls on one backend are
 * serialised by the host.
 */
#ifndef MAXSIM_PLUGIN_H_
#define MAXSIM_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#include "maxsim/maxsim.h"
#include "maxsim/packed_format.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MAXSIM_PLUGIN_ABI_MAJOR 1u
#define MAXSIM_PLUGIN_ABI_MINOR 4u
#define MAXSIM_PLUGIN_ENTRY_SYMBOL "maxsim_plugin_entry"

/* True if the plugin's table (of size api->struct_size) holds the data member `member`. */
#define MAXSIM_PLUGIN_HAS_FIELD(api, member) \
  ((api)->struct_size >= offsetof(maxsim_plugin_api, member) + sizeof((api)->member))
/* True if the plugin's table holds the function member `member` and it is not NULL. */
#define MAXSIM_PLUGIN_HAS(api, member) (MAXSIM_PLUGIN_HAS_FIELD(api, member) && (api)->member != NULL)

/* The bit of a maxsim_memory kind in maxsim_plugin_api.accepted_memory. */
#define MAXSIM_MEMORY_BIT(memory) (1ull << (unsigned)(memory))

/* A validated packed buffer (or a contiguous range of its sets), decoded by the host (ABI 1.1). Every pointer
 * is host memory and stays valid for the duration of the call that passes the view. Set i of the view owns rows
 * [offsets[i], offsets[i + 1]) of the row arrays (codes, meta, originals); offsets[0] may be above 0 when the
 * view is a range of a larger buffer (a shard of a corpus), so a plugin that copies the rows to a device copies
 * rows [offsets[0], offsets[n_sets]) and rebases the offsets. Region layouts are packing/README.md's. */
typedef struct maxsim_packed_view {
  uint32_t struct_size;                /* sizeof(maxsim_packed_view) as the host sees it */
  uint32_t dim;                        /* token dimension */
  uint32_t padded_dim;                 /* bytes per code row (dim rounded up to 64) */
  uint32_t orig_row_bytes;             /* bytes per originals row (multiple of 64) */
  uint32_t orig_dtype;                 /* maxsim_pack_dtype of the originals */
  uint32_t reserved;                   /* 0 */
  uint64_t n_sets;                     /* token sets in the view */
  uint64_t n_rows;                     /* offsets[n_sets] - offsets[0] */
  uint64_t max_set_rows;               /* tokens in the longest set of the view */
  const uint64_t* offsets;             /* n_sets + 1 row indices, non-decreasing */
  const int8_t* codes;                 /* row r at codes + r * padded_dim */
  const maxsim_vector_meta* meta;      /* row r at meta[r] */
  const uint8_t* originals;            /* row r at originals + r * orig_row_bytes */
  const uint64_t* ids;                 /* external id of set i at ids[i], or NULL */
} maxsim_packed_view;

/* Directions of maxsim_plugin_api.mem_copy. */
typedef enum maxsim_plugin_copy_kind {
  MAXSIM_COPY_HOST_TO_DEVICE = 0,
  MAXSIM_COPY_DEVICE_TO_HOST = 1,
  MAXSIM_COPY_FORCE_INT32 = 0x7FFFFFFF
} maxsim_plugin_copy_kind;

/* What the host gives a plugin. */
typedef struct maxsim_plugin_host {
  uint32_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  void* host_data;
  void (*log)(void* host_data, maxsim_log_level level, const char* message); /* never NULL */
  /* ABI 1.2 (present when struct_size covers it): the devices the context asks for (maxsim_options.devices), a
   * comma-separated list of device ordinals such as "0,1", or NULL / "" for the plugin's own default (e.g.
   * MAXSIM_CUDA_DEVICES). A plugin that supports several devices makes device_count() its length. */
  const char* devices;
} maxsim_plugin_host;

typedef struct maxsim_plugin_backend maxsim_plugin_backend; /* plugin-defined */
typedef struct maxsim_plugin_corpus maxsim_plugin_corpus;   /* plugin-defined: a device-resident packed buffer */

/* Inference on a device-resident corpus. Queries arrive as a validated packed buffer in host memory (and, from
 * ABI 1.1, decoded in query_view); outputs are host memory. Which outputs are used depends on the operation. */
typedef struct maxsim_plugin_score_args {
  uint32_t struct_size;
  maxsim_metric metric;
  maxsim_mode mode;
  const void* queries;           /* validated packed buffer (host) */
  uint64_t queries_size;
  const maxsim_plugin_corpus* corpus;
  const uint64_t* cand_offsets;  /* score_candidates: Nq + 1 (host) */
  const uint64_t* candidates;    /* score_candidates: document indices (host) */
  uint64_t k;                    /* topk */
  float* scores;                 /* [Nq, Nd] (matrix), [n candidates], [Nq, k] (topk) */
  int32_t* argmax;               /* optional (matrix, candidates), layout as in maxsim.h */
  uint64_t* topk_index;          /* topk: [Nq, k] */
  maxsim_stats* stats;           /* optional */
  /* ABI 1.1 (present when struct_size covers it; the host fills it unless query_dense is set) */
  const maxsim_packed_view* query_view; /* the queries, decoded */
  /* ABI 1.2: dense host-memory queries, passed instead of a packed buffer (queries, queries_size and query_view
   * are then NULL / 0) only to a plugin whose dense_query_modes() includes the call's mode. The sets have no
   * mask and no set_data (rows addressed from data; the host packs sets given with per-set row pointers, and
   * never passes such sets in device memory, which the C API rejects); their shape has been checked, their values have not: the plugin must fail the call with
   * MAXSIM_ERR_NON_FINITE, writing no output, when a row has a non-finite element or an L2 norm above 1e19 (the
   * host then names the row as the CPU would). */
  const maxsim_dense_sets* query_dense;
  /* ABI 1.3: score_matrix into columns of a wider matrix, set only for a plugin whose output_layouts has
   * MAXSIM_PLUGIN_OUTPUT_MATRIX_COLUMNS (0 otherwise, and for every other operation). The caller's matrix has
   * matrix_columns columns (0: the corpus's n_docs) and the corpus's document j is its column
   * matrix_first_column + j: scores[i * matrix_columns + matrix_first_column + j], argmax
   * [matrix_columns * o_i + (matrix_first_column + j) * Lq_i + s] (o_i: the query tokens before set i). The host
   * guarantees matrix_first_column + n_docs <= matrix_columns; the plugin writes nothing outside its columns (other
   * devices write theirs at the same time), and nothing when the call fails. */
  uint64_t matrix_columns;
  uint64_t matrix_first_column;
} maxsim_plugin_score_args;

/* Bits of maxsim_plugin_api.output_layouts (ABI 1.3). */
#define MAXSIM_PLUGIN_OUTPUT_MATRIX_COLUMNS (1ull << 0) /* score_matrix honours matrix_columns / _first_column */

/* Training on dense tensors in device memory (a memory kind in the plugin's accepted_memory). */
typedef struct maxsim_plugin_train_args {
  uint32_t struct_size;
  maxsim_metric metric;
  maxsim_layout layout;
  const maxsim_dense_sets* queries;
  const maxsim_dense_sets* documents;
  const uint64_t* cand_offsets;  /* CANDIDATES layout (host) */
  const uint64_t* candidates;    /* CANDIDATES layout (host) */
  float* scores;                 /* forward out (device) */
  int32_t* argmax;               /* forward out / backward in (device) */
  const float* grad_scores;      /* backward in (device) */
  float* grad_queries;           /* backward out (device), may be NULL */
  float* grad_documents;         /* backward out (device), may be NULL */
  int deterministic;             /* backward: 1 = destination-owned reduction, bit-identical across runs */
  void* stream;                  /* the device's stream / queue handle (cudaStream_t for CUDA; NULL: default) */
  uint64_t* peak_extra_bytes;    /* optional out: device scratch the call used beyond inputs and outputs */
  /* ABI 1.4 (present when struct_size covers it). MAXSIM_CALL_* bits of the public call. The host sets
   * MAXSIM_CALL_STREAM_ORDERED only for a plugin with a synchronize member: the plugin may then return once the
   * call's work is enqueued on `stream`, deferring the value checks it does on the device (maxsim.h): a failed
   * check leaves NaN scores and gradients and -1 argmax, and its error (the synchronous call's message, naming
   * `call`) is returned by synchronize or by the backend's next operation, whichever comes first, once. */
  uint32_t flags;
  const char* call;              /* the public function, e.g. "maxsim_score_matrix", for deferred messages */
} maxsim_plugin_train_args;

typedef struct maxsim_plugin_api {
  uint32_t abi_major;            /* MAXSIM_PLUGIN_ABI_MAJOR the plugin was built against */
  uint32_t abi_minor;
  uint32_t struct_size;          /* sizeof(maxsim_plugin_api) as the plugin sees it */
  const char* name;              /* backend name users select with MAXSIM_BACKEND, e.g. "cuda" */
  const char* description;       /* e.g. "CUDA (sm_80, sm_90)" */

  maxsim_status (*probe)(const maxsim_plugin_host* host, char* info, size_t info_cap);
  maxsim_status (*create)(const maxsim_plugin_host* host, maxsim_plugin_backend** out, char* err, size_t err_cap);
  void (*destroy)(maxsim_plugin_backend* backend);

  /* Work (2 * Lq * Ld * dim summed over pairs) above which this backend beats a multi-core CPU: MAXSIM_BACKEND
   * =auto routes a call here only above it (and only for packed corpora or device-memory inputs). */
  uint64_t (*min_auto_ops)(maxsim_plugin_backend* backend);

  /* Copies a validated packed buffer (host memory) to the device; the host may free its copy afterwards. */
  maxsim_status (*corpus_upload)(maxsim_plugin_backend* backend, const void* packed, uint64_t size,
                                 maxsim_plugin_corpus** out, char* err, size_t err_cap);
  void (*corpus_free)(maxsim_plugin_backend* backend, maxsim_plugin_corpus* corpus);

  maxsim_status (*score_matrix)(maxsim_plugin_backend* backend, const maxsim_plugin_score_args* args, char* err,
                                size_t err_cap);
  maxsim_status (*score_candidates)(maxsim_plugin_backend* backend, const maxsim_plugin_score_args* args,
                                    char* err, size_t err_cap);
  maxsim_status (*topk)(maxsim_plugin_backend* backend, const maxsim_plugin_score_args* args, char* err,
                        size_t err_cap);

  /* Dense training forward (scores + int32 argmax, exact) and backward (dot metric). */
  maxsim_status (*train_forward)(maxsim_plugin_backend* backend, const maxsim_plugin_train_args* args, char* err,
                                 size_t err_cap);
  maxsim_status (*train_backward)(maxsim_plugin_backend* backend, const maxsim_plugin_train_args* args,
                                  char* err, size_t err_cap);

  /* ---- ABI 1.1 (appended; every member optional) ---- */

  /* MAXSIM_MEMORY_BIT() of each maxsim_memory kind whose dense tensors train_forward / train_backward take
   * (device memory the host cannot read). A 1.0 plugin is taken to accept MAXSIM_MEMORY_CUDA. */
  uint64_t accepted_memory;

  /* corpus_upload with the buffer decoded (preferred over corpus_upload when both are set). The view may be a
   * range of a larger buffer (a shard); the host may free its memory once this returns. */
  maxsim_status (*corpus_upload_view)(maxsim_plugin_backend* backend, const maxsim_packed_view* corpus,
                                      maxsim_plugin_corpus** out, char* err, size_t err_cap);

  /* Device memory for tests and tools (the conformance suite allocates device tensors through these): mem_alloc
   * returns `bytes` of device memory of the backend's memory kind; mem_copy copies synchronously. */
  maxsim_status (*mem_alloc)(maxsim_plugin_backend* backend, uint64_t bytes, void** out, char* err, size_t err_cap);
  void (*mem_free)(maxsim_plugin_backend* backend, void* ptr);
  maxsim_status (*mem_copy)(maxsim_plugin_backend* backend, void* dst, const void* src, uint64_t bytes,
                            maxsim_plugin_copy_kind kind, char* err, size_t err_cap);

  /* One line per setting the backend read when it was created (tuning variables, device, experimental
   * options), for `maxsim info`. Writes at most cap bytes including the terminator. */
  void (*describe)(maxsim_plugin_backend* backend, char* out, size_t cap);

  /* Several devices: device_count() says how many backends the host should create for one context (e.g. from
   * MAXSIM_CUDA_DEVICES; 0 or 1: one, through create), create_device() creates the one for device slot
   * `index` < device_count(). The host then shards each uploaded corpus across them (contiguous ranges of
   * sets), runs a call on every shard at once (one host thread each) and merges the results exactly. */
  uint32_t (*device_count)(const maxsim_plugin_host* host);
  maxsim_status (*create_device)(const maxsim_plugin_host* host, uint32_t index, maxsim_plugin_backend** out,
                                 char* err, size_t err_cap);

  /* ---- ABI 1.2 (appended; optional) ---- */

  /* The modes (bit 1u << maxsim_mode) in which score_matrix, score_candidates and topk take dense host queries
   * as they are (maxsim_plugin_score_args.query_dense) instead of a packed buffer the host builds on every call:
   * a backend whose kernels for that mode read only the originals lists it. NULL or 0: always packed. */
  uint32_t (*dense_query_modes)(maxsim_plugin_backend* backend);

  /* ---- ABI 1.3 (appended; optional) ---- */

  /* MAXSIM_PLUGIN_OUTPUT_* bits: output layouts the operations write besides the dense ones. With
   * MAXSIM_PLUGIN_OUTPUT_MATRIX_COLUMNS, a sharded score matrix is written by each device straight into its
   * columns of the caller's matrix; without it (0, or a 1.0-1.2 table) the host stages each shard's matrix and
   * copies its columns into place. */
  uint64_t output_layouts;

  /* ---- ABI 1.4 (appended; optional) ---- */

  /* Waits for the backend's stream-ordered calls (maxsim_plugin_train_args.flags) and returns the first deferred
   * error not yet reported (its message in err), MAXSIM_OK when none. NULL: the plugin defers nothing, and the
   * host never asks it to (maxsim_synchronize then returns MAXSIM_OK). */
  maxsim_status (*synchronize)(maxsim_plugin_backend* backend, char* err, size_t err_cap);
} maxsim_plugin_api;

typedef const maxsim_plugin_api* (*maxsim_plugin_entry_fn)(void);

/* Exported by libmaxsim (not by plugins), for programs that drive a plugin's functions directly, such as the
 * GPU benchmark: the view the host hands a plugin of sets [first_set, first_set + n_sets) of a packed handle.
 * The view points into the handle's memory and stays valid until the handle is released. */
MAXSIM_API maxsim_status maxsim_packed_plugin_view(const maxsim_packed* packed, uint64_t first_set, uint64_t n_sets,
                                                   maxsim_packed_view* out);
/* Exported by libmaxsim, for tests and tools that reach a backend's own hooks (the conformance suite allocates
 * device tensors through mem_alloc): the plugin table and backend a context runs on device slot `device` (0 for
 * the first; the context shards over several when the plugin reports device_count > 1). Fails with
 * MAXSIM_ERR_BACKEND_UNAVAILABLE when the context runs on the CPU. */
MAXSIM_API maxsim_status maxsim_context_plugin(maxsim_context* ctx, uint32_t device, const maxsim_plugin_api** api,
                                               maxsim_plugin_backend** backend);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MAXSIM_PLUGIN_H_ */
