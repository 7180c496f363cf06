/* certattn's C ABI: certified sparse attention for engines written in C, Rust, Go, Zig
 * or Python (ctypes). C99, no C++ in it; the implementation (src/c_api.cpp) wraps the
 * header-only C++ API and is linked as the library certattn_c (CMake target
 * certattn::certattn_c). docs/c-api.md describes ownership, threading and errors.
 *
 * Conventions
 *   - Every function that can fail returns a status (certattn_status); on failure
 *     certattn_last_error() holds a message naming the bad argument. No C++ exception
 *     crosses this boundary.
 *   - Objects are opaque handles created by *_create() and freed by *_destroy() (which
 *     accept NULL). Plain structs (options, cache, certificate, ...) belong to the caller.
 *   - Enumerations are stored in int32_t fields, booleans in int32_t (0 or 1), so that
 *     every struct has one layout across languages.
 *   - 16-bit caches (fp16, bf16) are passed as their IEEE binary16 / bfloat16 bits;
 *     quantized caches as ggml's blocks (q8_0, q4_0) or fp8 codes, as engines store them.
 *   - Sizes that are not passed explicitly follow from the arguments: queries and out hold
 *     group * head_dim floats, certs holds group entries.
 */
#ifndef CERTATTN_C_CERTATTN_H
#define CERTATTN_C_CERTATTN_H

#include <stddef.h>
#include <stdint.h>

/* The version of this ABI: raised whenever a struct layout or a signature changes.
 * certattn_c_api_version() returns the library's, to check against the header's. */
#define CERTATTN_C_API_VERSION 3

#if defined(CERTATTN_C_STATIC)
#define CERTATTN_C_EXPORT
#elif defined(_WIN32)
#ifdef CERTATTN_C_BUILDING
#define CERTATTN_C_EXPORT __declspec(dllexport)
#else
#define CERTATTN_C_EXPORT __declspec(dllimport)
#endif
#elif defined(__GNUC__)
#define CERTATTN_C_EXPORT __attribute__((visibility("default")))
#else
#define CERTATTN_C_EXPORT
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Status and errors -------------------------------------------------------------- */

typedef enum certattn_status {
  CERTATTN_OK = 0,
  CERTATTN_EINVAL = 1,    /* a bad argument: NULL, a size, a range, non-finite data */
  CERTATTN_ENOMEM = 2,    /* an allocation failed */
  CERTATTN_EINTERNAL = 3  /* anything else (a bug: please report the message) */
} certattn_status;

/* The message of the last failed call on this thread (a thread-local buffer, valid until
 * the next failing call on the thread; successful calls leave it as it is). "" when no
 * call has failed. */
CERTATTN_C_EXPORT const char* certattn_last_error(void);
/* "ok", "invalid argument", "out of memory", "internal error" or "unknown status". */
CERTATTN_C_EXPORT const char* certattn_status_string(int status);
/* The CERTATTN_C_API_VERSION the library was built with. */
CERTATTN_C_EXPORT int certattn_c_api_version(void);

/* ---- The cache of one (layer, KV head) ---------------------------------------------- */

typedef enum certattn_dtype {
  CERTATTN_DTYPE_F16 = 0,      /* IEEE binary16, as uint16_t bits */
  CERTATTN_DTYPE_BF16 = 1,     /* bfloat16, as uint16_t bits */
  CERTATTN_DTYPE_F32 = 2,      /* float */
  CERTATTN_DTYPE_Q8_0 = 3,     /* ggml's block_q8_0: 34-byte blocks of 32 channels, an fp16
                                  scale d and 32 int8 q, x = d q (llama.cpp -ctk/-ctv q8_0) */
  CERTATTN_DTYPE_Q4_0 = 4,     /* ggml's block_q4_0: 18-byte blocks, fp16 d and 16 bytes of
                                  nibbles, x = d (q - 8); channel i < 16 the low nibble of
                                  byte i, channel 16 + i its high nibble */
  CERTATTN_DTYPE_FP8_E4M3 = 5, /* one byte per channel (torch.float8_e4m3fn), x = fl(scale c) */
  CERTATTN_DTYPE_FP8_E5M2 = 6  /* one byte per channel (the high byte of a binary16) */
} certattn_dtype;

/* The values' format where it differs from the keys' (certattn_cache.value_dtype): 0 means
 * the values are stored as dtype; otherwise 1 + a certattn_dtype (llama.cpp's -ctk q8_0
 * with f16 values: dtype CERTATTN_DTYPE_Q8_0, value_dtype CERTATTN_VALUE_DTYPE_F16). The
 * pairs served: q8_0 keys with f16 or q4_0 values, q4_0 keys with f16 values (strided and
 * paged layouts). */
typedef enum certattn_value_dtype {
  CERTATTN_VALUE_DTYPE_AS_KEYS = 0,
  CERTATTN_VALUE_DTYPE_F16 = 1 + CERTATTN_DTYPE_F16,
  CERTATTN_VALUE_DTYPE_BF16 = 1 + CERTATTN_DTYPE_BF16,
  CERTATTN_VALUE_DTYPE_F32 = 1 + CERTATTN_DTYPE_F32,
  CERTATTN_VALUE_DTYPE_Q8_0 = 1 + CERTATTN_DTYPE_Q8_0,
  CERTATTN_VALUE_DTYPE_Q4_0 = 1 + CERTATTN_DTYPE_Q4_0,
  CERTATTN_VALUE_DTYPE_FP8_E4M3 = 1 + CERTATTN_DTYPE_FP8_E4M3,
  CERTATTN_VALUE_DTYPE_FP8_E5M2 = 1 + CERTATTN_DTYPE_FP8_E5M2
} certattn_value_dtype;

typedef enum certattn_layout {
  CERTATTN_LAYOUT_STRIDED = 0, /* two arrays with token strides (NHD, HND, padded) */
  CERTATTN_LAYOUT_PAGED = 1,   /* page pools and a block table (vLLM, FlashInfer) */
  CERTATTN_LAYOUT_LATENT = 2   /* one latent row per token: key, and value prefix (MLA) */
} certattn_layout;

/* The cache of one KV head: n_tokens tokens, oldest first, each with a key and a value row
 * of head_dim contiguous channels of type dtype. Strides and offsets are in units of dtype:
 * elements, or 32-channel blocks for q8_0 and q4_0 (whose head_dim and value_dim must be
 * multiples of 32); where value_dtype gives the values another format, value_stride counts
 * its units, and a paged cache's value pool has the key pool's layout counted in channels
 * (its strides are the key strides' channels in units of the value format).
 *   strided  keys/values point at token 0 of this head; token t's key row is at
 *            keys + t * key_stride (NHD [token][kv_heads][dim]: key_stride = kv_heads *
 *            head_dim; HND [kv_heads][token][dim]: key_stride = head_dim).
 *   paged    keys/values point at the page pools; token t lives on pool page
 *            block_table[t / page_size] at page * page_stride + head_offset +
 *            (t % page_size) * token_stride (keys and values alike). block_table holds
 *            block_table_len entries, at least ceil(n_tokens / page_size).
 *   latent   multi-head latent attention in its absorbed form (DeepSeek-V2/V3, Kimi K2):
 *            keys points at token 0's latent row of head_dim elements (e.g. 576), rows
 *            key_stride apart; the value is its first value_dim elements (e.g. 512);
 *            values must be NULL or equal to keys. Outputs have value_dim channels.
 * The paged fields are ignored by the strided layout and the strided ones by the paged.
 * value_dim: 0 (head_dim) for strided and paged caches; the latent layout's value width.
 * key_scale, value_scale: an fp8 cache's scales (vLLM's k_scale, v_scale; 0 means 1), the
 *            latent layout's one scale in key_scale; 0 or 1 for every other dtype. An index
 *            refuses a cache of another dtype or other scales than it was built from. */
typedef struct certattn_cache {
  int32_t dtype;   /* certattn_dtype */
  int32_t layout;  /* certattn_layout */
  const void* keys;
  const void* values;
  size_t n_tokens;
  size_t head_dim;
  /* strided */
  size_t key_stride;
  size_t value_stride;
  /* paged */
  const int32_t* block_table;
  size_t block_table_len;
  size_t page_size;
  size_t page_stride;
  size_t token_stride;
  size_t head_offset;
  /* latent */
  size_t value_dim;
  /* fp8 */
  float key_scale;
  float value_scale;
  /* keys and values in two formats */
  int32_t value_dtype; /* certattn_value_dtype: 0 (as dtype), or 1 + the values' certattn_dtype */
} certattn_cache;

/* ---- Options and certificates ------------------------------------------------------- */

typedef enum certattn_error_scale {
  CERTATTN_SCALE_DENOMINATOR = 0, /* |D^ - D| <= epsilon * D */
  CERTATTN_SCALE_OUTPUT_NORM = 1, /* ||o^ - o|| <= epsilon * ||o|| */
  CERTATTN_SCALE_VALUE = 2        /* ||o^ - o|| <= epsilon * M (the default) */
} certattn_error_scale;

typedef enum certattn_certificate_kind {
  CERTATTN_CERTIFICATE_TIGHT = 0,  /* the default */
  CERTATTN_CERTIFICATE_CLASSIC = 1 /* the paper's */
} certattn_certificate_kind;

typedef enum certattn_routing {
  CERTATTN_ROUTE_AUTO = 0, /* exact answers where the sparse path would cost more */
  CERTATTN_ROUTE_OFF = 1
} certattn_routing;

typedef enum certattn_answer_path {
  CERTATTN_PATH_SAMPLED = 0,     /* a certified level of the sparse path */
  CERTATTN_PATH_NO_POOL = 1,     /* the cache is no longer than the window: exact */
  CERTATTN_PATH_FALLBACK = 2,    /* no level certified: exact */
  CERTATTN_PATH_OVER_BUDGET = 3, /* the sample outgrew certattn_sample_budget(): exact */
  CERTATTN_PATH_JOINED = 4,      /* joined an earlier head's exact pass */
  CERTATTN_PATH_ROUTED = 5       /* the history routed the group to the dense kernel */
} certattn_answer_path;

/* certattn::cost_model: predicted cost relative to dense = fixed + per_key * sampled / n;
   a group call stops sampling where the prediction reaches give_up. */
typedef struct certattn_cost_model {
  double fixed;   /* default 0.6, in [0, 1) */
  double per_key; /* default 6.4, > 0 */
  double give_up; /* default 2.0, >= 1 */
  int32_t measured; /* default 1: once a history has timed a dense call, route on measured
                     * costs (certattn::cost_model::measured); 0: on the prediction alone */
} certattn_cost_model;

/* certattn::attention_variant (docs/integration.md, "Model families"): the attention of a
 * model beyond plain scaled dot products. Zero-filled (the default): plain attention.
 * The arrays are the caller's, one entry per query head of the call (`group` for the
 * group calls, 1 for certattn_exact_attention_variant), and must outlive the call. */
typedef struct certattn_variant {
  double logit_softcap;       /* 0: off; > 0: s = cap tanh(s / cap) (Gemma 2: 50) */
  const float* alibi_slopes;  /* NULL, or per head m: s_i += m (i - (n - 1)) (ALiBi) */
  const float* sinks;         /* NULL, or per head a sink logit z in the denominator (gpt-oss) */
  size_t sliding_window;      /* 0: every token; W: the newest W tokens only */
} certattn_variant;

/* certattn::options. Start from certattn_options_default() and set what you need. */
typedef struct certattn_options {
  double epsilon;        /* target error relative to scale (default 0.1) */
  double delta;          /* failure probability per call and head (default 0.05) */
  int32_t scale;         /* certattn_error_scale (default CERTATTN_SCALE_VALUE) */
  int32_t grid_ratio;    /* levels per halving of tau (default 2) */
  size_t window;         /* newest tokens read exactly, <= 64 (default 64) */
  int32_t max_levels;    /* the finest threshold is 2^(-max_levels / grid_ratio) (32) */
  int32_t grid_top;      /* tight: the coarsest threshold is 2^grid_top (default 6) */
  double softmax_scale;  /* 0 means 1/sqrt(head_dim) (default 0) */
  uint64_t seed;         /* perturbation seed, fixed before the call (default 0) */
  int32_t certificate;   /* certattn_certificate_kind (default tight) */
  int32_t route;         /* certattn_routing (default auto) */
  certattn_cost_model cost;
  certattn_variant variant; /* default: plain attention */
} certattn_options;

/* The perturbation key of a call: advance step at every decoding step. sequence tells
 * concurrent sequences of one engine apart (0: none). */
typedef struct certattn_noise_key {
  uint64_t step;
  uint32_t layer;
  uint32_t kv_head;
  uint64_t sequence;
} certattn_noise_key;

/* certattn::certificate: what a call reports for one query head (docs/certificate.md). */
typedef struct certattn_certificate {
  int32_t certified;   /* 1: error <= epsilon * scale with probability >= 1 - delta */
  int32_t exact;       /* 1: the output is exact attention */
  int32_t path;        /* certattn_answer_path */
  int32_t level;       /* stopping level, -1 when exact */
  double tau;          /* its threshold, relative to the largest weight */
  double bound;        /* certified error bound relative to the scale */
  double beta;         /* absolute bound on ||o^ - o|| */
  double scale_value;  /* D_lo, ||o^|| - beta or M_lo */
  double max_score;    /* c: weights are exp(s_i - c) */
  double denominator;  /* D^ at the stopping level (exact D when exact) */
  size_t heavy;        /* pool keys read exactly with their exact weight */
  size_t sampled;      /* light pool keys in the sample */
  size_t keys_read;    /* exact key rows read (window included) */
  size_t values_read;  /* value rows read (window included) */
  size_t bytes_read;   /* bytes read by the call for this head */
} certattn_certificate;

/* certattn::group_stats: what the last certified call of a workspace read. */
typedef struct certattn_group_stats {
  size_t tokens, pool, candidates, refined, keys_read, values_read, fallbacks, over_budget,
      routed, sampled, bytes_read, dense_bytes, bound_violations;
  double stage_seconds[6]; /* only with certattn_workspace_time_stages */
} certattn_group_stats;

/* The result of certattn_exact_attention (double precision reference). */
typedef struct certattn_exact_result {
  double max_score;   /* c = max_i s_i */
  double denominator; /* D = sum_i exp(s_i - c) */
  double value_scale; /* M = sqrt(sum_i a_i ||v_i||^2) */
  double output_norm; /* ||o|| */
} certattn_exact_result;

/* Writes the defaults of certattn::options to *options. */
CERTATTN_C_EXPORT int certattn_options_default(certattn_options* options);
/* Checks every field (the message names the first bad one). */
CERTATTN_C_EXPORT int certattn_options_validate(const certattn_options* options);
/* The most pool keys a group call of `tokens` tokens samples before it answers exactly
 * (SIZE_MAX when route is off). */
CERTATTN_C_EXPORT int certattn_sample_budget(const certattn_options* options, size_t tokens,
                                             size_t* budget);

/* ---- Key index (certattn::key_index): one per (layer, KV head) ---------------------- */

typedef struct certattn_index certattn_index;

typedef enum certattn_refresh_policy {
  CERTATTN_REFRESH_ON_DOUBLING = 0, /* value bounds refreshed when the cache doubles */
  CERTATTN_REFRESH_MANUAL = 1       /* only certattn_index_refresh() */
} certattn_refresh_policy;

CERTATTN_C_EXPORT int certattn_index_create(size_t head_dim, certattn_index** index);
CERTATTN_C_EXPORT void certattn_index_destroy(certattn_index* index);
/* Capacity for `tokens` tokens: appends within it allocate nothing. */
CERTATTN_C_EXPORT int certattn_index_reserve(certattn_index* index, size_t tokens);
/* Indexes every token of the cache (replacing what the index held). */
CERTATTN_C_EXPORT int certattn_index_build(certattn_index* index, const certattn_cache* cache);
/* Indexes token `position` (== the index's size) of the cache. */
CERTATTN_C_EXPORT int certattn_index_append(certattn_index* index, const certattn_cache* cache,
                                            size_t position);
CERTATTN_C_EXPORT int certattn_index_append_range(certattn_index* index,
                                                  const certattn_cache* cache, size_t first,
                                                  size_t count);
/* Keeps the first n tokens (n <= size; the cache holds at least n). */
CERTATTN_C_EXPORT int certattn_index_truncate(certattn_index* index, const certattn_cache* cache,
                                              size_t n);
/* Recomputes the value bounds from the cache. */
CERTATTN_C_EXPORT int certattn_index_refresh(certattn_index* index, const certattn_cache* cache);
CERTATTN_C_EXPORT int certattn_index_set_refresh_policy(certattn_index* index, int policy);
CERTATTN_C_EXPORT int certattn_index_size(const certattn_index* index, size_t* size);
CERTATTN_C_EXPORT int certattn_index_memory_bytes(const certattn_index* index, size_t* bytes);

/* ---- Workspace (certattn::attend_workspace): one per thread ------------------------- */

typedef struct certattn_workspace certattn_workspace;

/* Scratch for calls of up to `group` query heads, head_dim channels and max_tokens
 * tokens, with options whose levels (max_levels + grid_top * grid_ratio for the tight
 * certificate) are at most 44, the defaults' count. Calls within these allocate nothing. */
CERTATTN_C_EXPORT int certattn_workspace_create(size_t group, size_t head_dim, size_t max_tokens,
                                                certattn_workspace** workspace);
/* The same for up to max_levels levels (in [0, 254]). */
CERTATTN_C_EXPORT int certattn_workspace_create_levels(size_t group, size_t head_dim,
                                                       size_t max_tokens, int max_levels,
                                                       certattn_workspace** workspace);
CERTATTN_C_EXPORT void certattn_workspace_destroy(certattn_workspace* workspace);
/* Time the stages of each call into certattn_group_stats.stage_seconds (on != 0; off by
 * default: two clock reads per stage). */
CERTATTN_C_EXPORT int certattn_workspace_time_stages(certattn_workspace* workspace, int on);
/* What the last certattn_attend_group() or certattn_attend_positions() with this workspace
 * read (a multi-position call: summed over its positions). */
CERTATTN_C_EXPORT int certattn_workspace_last_stats(const certattn_workspace* workspace,
                                                    certattn_group_stats* stats);

/* ---- History (certattn::group_history): one per (layer, KV head) and sequence ------- */

typedef struct certattn_history certattn_history;

CERTATTN_C_EXPORT int certattn_history_create(size_t group, certattn_history** history);
CERTATTN_C_EXPORT void certattn_history_destroy(certattn_history* history);
/* Forget everything (a new sequence in the same slot). */
CERTATTN_C_EXPORT int certattn_history_reset(certattn_history* history);
/* The cost model's prediction for the last sparse call relative to dense (NaN before). */
CERTATTN_C_EXPORT int certattn_history_last_cost(const certattn_history* history, double* cost);
/* Copies the level each head stopped at in the last sparse call (-1: none) to levels
 * [group]. */
CERTATTN_C_EXPORT int certattn_history_levels(const certattn_history* history, int32_t* levels,
                                              size_t group);

/* ---- Calls --------------------------------------------------------------------------- */

/* Certified attention for the `group` query heads of one GQA group over one KV head
 * (certattn::attend_group): queries [group][head_dim] (unscaled), out [group][value_dim] (head_dim but for a latent cache),
 * certs [group]. index must hold exactly the cache's tokens. history: this (layer, KV
 * head)'s history, kept from step to step, or NULL for none. Allocates nothing. */
CERTATTN_C_EXPORT int certattn_attend_group(const float* queries, size_t group,
                                            const certattn_cache* cache,
                                            const certattn_index* index,
                                            const certattn_noise_key* key,
                                            const certattn_options* options, float* out,
                                            certattn_certificate* certs,
                                            certattn_workspace* workspace,
                                            certattn_history* history);

/* Several query positions of one KV head in one call (certattn::attend_positions:
 * speculative verification of draft tokens): position p in [0, positions) is the query of
 * token n_tokens - positions + p, whose tokens are appended to the cache and the index
 * before the call, and attends the tokens up to its own. queries
 * [positions][group][head_dim], out [positions][group][value_dim], certs
 * [positions][group]; the workspace created for a group of at least positions * group.
 * Each position is the call certattn_attend_group() makes over the cache up to its own
 * token with its own perturbations; the index is scanned once for all of them. After
 * verification, certattn_index_truncate() drops the rejected drafts. Allocates nothing. */
CERTATTN_C_EXPORT int certattn_attend_positions(const float* queries, size_t positions,
                                                size_t group, const certattn_cache* cache,
                                                const certattn_index* index,
                                                const certattn_noise_key* key,
                                                const certattn_options* options, float* out,
                                                certattn_certificate* certs,
                                                certattn_workspace* workspace,
                                                certattn_history* history);

/* Several sequences that share a prefix, in one call for one KV head
 * (certattn::attend_sequences: parallel samples of one prompt, beam search): caches
 * [sequences], one per sequence, all of one dtype, value_dtype and layout, whose first
 * prefix tokens are the ones prefix_index holds (built once from any of them; never
 * appended to). sequence_ids [sequences], all different: sequence s draws the
 * perturbations of key with key->sequence replaced by sequence_ids[s]. queries
 * [sequences][group][head_dim], out [sequences][group][value_dim], certs
 * [sequences][group]; the workspace created for a group of at least sequences * group.
 * histories: NULL, or [sequences] each sequence's own history for this (layer, KV head),
 * all different. Sequence s's answer and certificate are those of the call over its cache
 * with the pool ending at the prefix: its own tokens after the prefix are read exactly,
 * with the window; the prefix's index is scanned once for all sequences. Allocates nothing
 * after a first call of its cache format on the calling thread. */
CERTATTN_C_EXPORT int certattn_attend_sequences(const float* queries, size_t sequences,
                                                size_t group, const certattn_cache* caches,
                                                const certattn_index* prefix_index,
                                                const certattn_noise_key* key,
                                                const uint64_t* sequence_ids,
                                                const certattn_options* options, float* out,
                                                certattn_certificate* certs,
                                                certattn_workspace* workspace,
                                                certattn_history* const* histories);

/* Exact attention of several sequences that share a prefix of prefix_tokens tokens
 * (certattn::dense_attend_sequences, certattn_attend_sequences()'s baseline): one pass over
 * the prefix for all sequences * group queries, then each sequence's own tokens. caches,
 * queries and out as certattn_attend_sequences()'s; variant as
 * certattn_dense_attend_variant()'s (NULL: plain), applied to every sequence. The
 * workspace created for a group of at least sequences * group. */
CERTATTN_C_EXPORT int certattn_dense_attend_sequences(const float* queries, size_t sequences,
                                                      size_t group,
                                                      const certattn_cache* caches,
                                                      size_t prefix_tokens,
                                                      float softmax_scale,
                                                      const certattn_variant* variant,
                                                      float* out,
                                                      certattn_workspace* workspace);

/* Exact attention (the dense kernel, float accumulation) of `group` queries
 * [group][head_dim] over every token of the cache; out [group][value_dim]. softmax_scale 0
 * means 1/sqrt(head_dim). Uses the workspace's dense scratch; allocates nothing. */
CERTATTN_C_EXPORT int certattn_dense_attend(const float* queries, size_t group,
                                            const certattn_cache* cache, float softmax_scale,
                                            float* out, certattn_workspace* workspace);

/* The same with a variant (its arrays of `group` entries; NULL: plain): soft-cap, position
 * bias, sliding window and sinks, as certattn_attend_group() computes them. */
CERTATTN_C_EXPORT int certattn_dense_attend_variant(const float* queries, size_t group,
                                                    const certattn_cache* cache,
                                                    float softmax_scale,
                                                    const certattn_variant* variant, float* out,
                                                    certattn_workspace* workspace);

/* Exact attention of several query positions, causally (certattn::dense_attend_positions,
 * certattn_attend_positions()'s baseline): queries [positions][group][head_dim], out
 * [positions][group][value_dim]; variant as certattn_dense_attend_variant()'s (NULL:
 * plain), applied to every position. The workspace created for a group of at least
 * positions * group. Allocates nothing. */
CERTATTN_C_EXPORT int certattn_dense_attend_positions(const float* queries, size_t positions,
                                                      size_t group,
                                                      const certattn_cache* cache,
                                                      float softmax_scale,
                                                      const certattn_variant* variant,
                                                      float* out,
                                                      certattn_workspace* workspace);

/* Exact attention of one query [head_dim] in double precision (certattn::exact_attention,
 * the reference of every check): out [value_dim]; result may be NULL. Allocates. */
CERTATTN_C_EXPORT int certattn_exact_attention(const float* query, const certattn_cache* cache,
                                               double softmax_scale, double* out,
                                               certattn_exact_result* result);

/* The same with a variant (its arrays of 1 entry, this head's; NULL: plain). */
CERTATTN_C_EXPORT int certattn_exact_attention_variant(const float* query,
                                                       const certattn_cache* cache,
                                                       double softmax_scale,
                                                       const certattn_variant* variant,
                                                       double* out,
                                                       certattn_exact_result* result);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CERTATTN_C_CERTATTN_H */
