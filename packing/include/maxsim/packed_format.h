/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libmaxsim packed buffer format, version 1 (layout "canonical").
 *
 * One self-describing buffer holds a collection of token sets (a batch of queries or a shard of documents).
 * Every backend (CPU kernels of any ISA, GPU plugins) reads this one layout; nothing in it depends on the
 * machine that packed it. The full specification, with the reasons for each choice, is packing/README.md.
 *
 *   [0, 256)            header (struct maxsim_pack_header), little-endian
 *   codes region        n_vectors rows of `padded_dim` int8 codes, v8 in [-127, 127], zero padding
 *   meta region         n_vectors records of struct maxsim_vector_meta (16 bytes)
 *   originals region    n_vectors rows of `orig_row_bytes` bytes: dim values of `orig_dtype`, zero padding
 *   offsets region      n_sets + 1 uint64 token offsets (offsets[0] = 0, non-decreasing, last = n_vectors)
 *   ids region          n_sets uint64 external ids (optional: size 0 when absent)
 *   string ids region   (version 1.1, optional) n_sets + 1 uint64 byte offsets, then the ids' UTF-8 bytes,
 *                       each id followed by one NUL byte (present only when the flag below is set)
 *
 * Every region starts on a 64-byte boundary; the bytes between regions are zero. All sizes and offsets are
 * 64-bit, so buffers larger than 4 GiB work. This header is plain C so that plugins and tools can include it.
 */
#ifndef MAXSIM_PACKED_FORMAT_H_
#define MAXSIM_PACKED_FORMAT_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MAXSIM_PACK_MAGIC "MAXSIMPK"            /* 8 bytes, no terminator stored */
#define MAXSIM_PACK_VERSION_MAJOR 1u             /* a reader refuses another major version */
#define MAXSIM_PACK_VERSION_MINOR 1u             /* a reader accepts any minor <= its own and refuses a newer one
                                                    (it cannot check what that adds); writers write 0
                                                    unless the buffer has string ids (1.1) */
#define MAXSIM_PACK_ENDIAN_TAG 0x01020304u      /* reads 0x04030201 on a big-endian machine */
#define MAXSIM_PACK_LAYOUT_CANONICAL 1u
#define MAXSIM_PACK_HEADER_SIZE 256u
#define MAXSIM_PACK_ALIGN 64u                   /* region alignment and row padding unit (bytes) */
#define MAXSIM_PACK_QUANT_RANGE 127u            /* R: codes are round(v * R / max|v|), |code| <= R */
#define MAXSIM_PACK_MAX_DIM 65536u               /* largest supported token dimension */
/* Largest accepted L2 norm of one vector: with ||q||, ||d|| <= 1e19 every partial sum of an f32 dot product
 * stays below 1e38 < FLT_MAX, so no finite input can overflow a score. */
#define MAXSIM_PACK_MAX_NORM 1e19

/* Region indices into maxsim_pack_header.regions. */
enum maxsim_pack_region_id {
  MAXSIM_REGION_CODES = 0,
  MAXSIM_REGION_META = 1,
  MAXSIM_REGION_ORIGINALS = 2,
  MAXSIM_REGION_OFFSETS = 3,
  MAXSIM_REGION_IDS = 4,
  MAXSIM_REGION_COUNT = 5, /* regions of every buffer (version 1.0 has only these) */
  MAXSIM_REGION_STRING_IDS = 5, /* version 1.1: present only with MAXSIM_PACK_FLAG_HAS_STRING_IDS */
  MAXSIM_REGION_SLOTS = 8  /* slots in the header; unused slots are zero */
};

/* Element type of the full-precision originals (same numbering as maxsim_dtype in maxsim.h). */
enum maxsim_pack_dtype { MAXSIM_PACK_F32 = 1, MAXSIM_PACK_F16 = 2, MAXSIM_PACK_BF16 = 3 };

/* Header flag bits. */
#define MAXSIM_PACK_FLAG_HAS_IDS 0x1ull
#define MAXSIM_PACK_FLAG_HAS_STRING_IDS 0x2ull /* version >= 1.1; region_count is then 6 */

typedef struct maxsim_pack_region {
  uint64_t offset; /* bytes from the start of the buffer; multiple of 64 */
  uint64_t size;   /* bytes in use (the region's rows, excluding the zero gap that follows it) */
} maxsim_pack_region;

typedef struct maxsim_pack_header {
  char magic[8];               /*   0: "MAXSIMPK" */
  uint16_t version_major;      /*   8 */
  uint16_t version_minor;      /*  10 */
  uint32_t endian_tag;         /*  12: MAXSIM_PACK_ENDIAN_TAG */
  uint16_t header_size;        /*  16: 256 */
  uint16_t layout;             /*  18: MAXSIM_PACK_LAYOUT_CANONICAL */
  uint8_t orig_dtype;          /*  20: maxsim_pack_dtype */
  uint8_t region_count;        /*  21: MAXSIM_REGION_COUNT, + 1 with string ids */
  uint16_t quant_range;        /*  22: R (127) */
  uint32_t dim;                /*  24: token dimension d, 1..MAXSIM_PACK_MAX_DIM */
  uint32_t padded_dim;         /*  28: bytes per code row: d rounded up to a multiple of 64 */
  uint32_t orig_row_bytes;     /*  32: bytes per originals row: d * sizeof(dtype) rounded up to 64 */
  uint32_t meta_record_bytes;  /*  36: sizeof(maxsim_vector_meta) = 16 */
  uint64_t n_vectors;          /*  40: token vectors in all sets */
  uint64_t n_sets;             /*  48: token sets */
  uint64_t total_size;         /*  56: bytes in the whole buffer (end of the last region, rounded up to 64) */
  maxsim_pack_region regions[MAXSIM_REGION_SLOTS]; /* 64 .. 192 */
  uint64_t flags;              /* 192: MAXSIM_PACK_FLAG_* */
  uint64_t payload_checksum;   /* 200: maxsim_checksum64 of bytes [header_size, total_size) */
  uint8_t reserved[40];        /* 208: zero */
  uint64_t header_checksum;    /* 248: maxsim_checksum64 of bytes [0, 248) */
} maxsim_pack_header;

/*
 * Per-vector metadata (one record per token vector, same order as the codes). With v the vector converted to
 * f32 and v8 its codes: v = scale * v8 + e.
 *   scale       max|v_i| / R (0 for a zero vector, whose codes are all 0)
 *   norm        ||v||_2, computed in double, rounded to nearest f32 (cosine uses it; 0 -> cosine 0)
 *   resid_norm  ||e||_2 = ||v - scale * v8||_2, computed in double, rounded *up* to f32 (an upper bound)
 *   code_sum    sum of the codes (lets a kernel use an unsigned-bias multiply: (q8+128).d8 = q8.d8 + 128*sum)
 * The certified screening bound |<q,d> - s_q s_d <q8,d8>| <= ||e_q|| (||d|| + ||e_d||) + ||q|| ||e_d|| needs
 * nothing else.
 */
typedef struct maxsim_vector_meta {
  float scale;
  float norm;
  float resid_norm;
  int32_t code_sum;
} maxsim_vector_meta;

#ifdef __cplusplus
} /* extern "C" */
static_assert(sizeof(maxsim_pack_header) == MAXSIM_PACK_HEADER_SIZE, "header is 256 bytes");
static_assert(offsetof(maxsim_pack_header, regions) == 64, "region table starts at byte 64");
static_assert(offsetof(maxsim_pack_header, flags) == 192, "flags at byte 192");
static_assert(offsetof(maxsim_pack_header, header_checksum) == 248, "header checksum is the last 8 bytes");
static_assert(sizeof(maxsim_vector_meta) == 16, "metadata records are 16 bytes");
#else
_Static_assert(sizeof(maxsim_pack_header) == MAXSIM_PACK_HEADER_SIZE, "header is 256 bytes");
_Static_assert(sizeof(maxsim_vector_meta) == 16, "metadata records are 16 bytes");
#endif

#endif /* MAXSIM_PACKED_FORMAT_H_ */
