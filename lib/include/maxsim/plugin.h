/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libmaxsim plugin ABI (GPU and other accelerator backends loaded with dlopen).
 *
 * A plugin is a shared library that exports exactly one symbol, MAXSIM_PLUGIN_ENTRY_SYMBOL, a function taking
 * no argument and returning a pointer to a static maxsim_plugin_api. The host:
 *   1. checks abi_major == MAXSIM_PLUGIN_ABI_MAJOR and struct_size >= the size of the fields it uses
 *      (a plugin with a newer minor version may have appended fields; an older minor has fewer, and the host
 *      only calls what MAXSIM_PLUGIN_HAS(api, member) says is present);
 *   2. calls probe(): MAXSIM_OK means "usable here" (info describes the device), anything else means
 *      "unavailable" (info says why, e.g. "no CUDA driver (cudaGetDeviceCount returned 35)");
 *   3. calls create() once per context and the operations below.
 * A plugin that cannot be loaded, has the wrong ABI, lacks the symbol or fails its probe is skipped with one
 * log line and the CPU is used (unless the user named that backend, which is then an error).
 *
 * Rules for plugins: never abort, exit or print; return a maxsim_status and write a message (at most err_cap
 * bytes including the terminator) into err. Every packed buffer handed to a plugin has already been validated
 * by the host (MAXSIM_VALIDATE_STANDARD or better); dense inputs have been shape-checked (not value-checked).
 * All functions may be called from several host threads for different backends; calls on one backend are
 * serialised by the host.
 */
#ifndef MAXSIM_PLUGIN_H_
#define MAXSIM_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#include "maxsim/maxsim.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MAXSIM_PLUGIN_ABI_MAJOR 1u
#define MAXSIM_PLUGIN_ABI_MINOR 0u
#define MAXSIM_PLUGIN_ENTRY_SYMBOL "maxsim_plugin_entry"

/* True if the plugin's struct (of size api->struct_size) contains `member`. */
#define MAXSIM_PLUGIN_HAS(api, member) \
  ((api)->struct_size >= offsetof(maxsim_plugin_api, member) + sizeof((api)->member) && (api)->member != NULL)

/* What the host gives a plugin. */
typedef struct maxsim_plugin_host {
  uint32_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  void* host_data;
  void (*log)(void* host_data, maxsim_log_level level, const char* message); /* never NULL */
} maxsim_plugin_host;

typedef struct maxsim_plugin_backend maxsim_plugin_backend; /* plugin-defined */
typedef struct maxsim_plugin_corpus maxsim_plugin_corpus;   /* plugin-defined: a device-resident packed buffer */

/* Inference on a device-resident corpus. Queries arrive as a validated packed buffer in host memory; outputs
 * are host memory. Which outputs are used depends on the operation. */
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
} maxsim_plugin_score_args;

/* Training on dense device tensors (MAXSIM_MEMORY_CUDA for the CUDA plugin). */
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
  void* stream;                  /* cudaStream_t */
  uint64_t* peak_extra_bytes;    /* optional out: device scratch the call used beyond inputs and outputs */
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
} maxsim_plugin_api;

typedef const maxsim_plugin_api* (*maxsim_plugin_entry_fn)(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MAXSIM_PLUGIN_H_ */
