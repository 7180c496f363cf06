/* The C ABI from C: a synthetic fp16 cache of one KV head, its index built in two steps,
 * certified calls with and without a history (strided and paged layouts), the dense and
 * the exact reference, and every bad input's status and message.
 *
 * Outputs are compared with certattn_exact_attention within the certificate's bound beta.
 * delta = 1e-9 per call and head; the test makes 4 heads x 12 certified calls and 3
 * positions x 4 heads in one multi-position call, so the probability of a false failure
 * is below 6e-8. Everything else is deterministic: the same
 * inputs must give the same bits (two calls, two layouts). */
#include <certattn/c/certattn.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_failures = 0;

#define CHECK(cond)                                                               \
  do {                                                                            \
    if (!(cond)) {                                                                \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);    \
      ++g_failures;                                                               \
    }                                                                             \
  } while (0)

#define CHECK_OK(call)                                                                    \
  do {                                                                                    \
    int rc_ = (call);                                                                     \
    if (rc_ != CERTATTN_OK) {                                                             \
      fprintf(stderr, "%s:%d: %s returned %d (%s): %s\n", __FILE__, __LINE__, #call, rc_, \
              certattn_status_string(rc_), certattn_last_error());                        \
      ++g_failures;                                                                       \
    }                                                                                     \
  } while (0)

/* A call that must fail with `code` and a message containing `needle`. */
#define CHECK_FAILS(call, code, needle)                                                  \
  do {                                                                                   \
    int rc_ = (call);                                                                    \
    const char* msg_ = certattn_last_error();                                            \
    if (rc_ != (code) || msg_ == NULL || strstr(msg_, (needle)) == NULL) {               \
      fprintf(stderr, "%s:%d: %s returned %d, message '%s'; expected %d and '%s'\n",     \
              __FILE__, __LINE__, #call, rc_, msg_ ? msg_ : "(null)", (code), (needle)); \
      ++g_failures;                                                                      \
    }                                                                                    \
  } while (0)

enum { N = 3000, D = 64, G = 4, PAGE = 16, PAGES = (N + PAGE - 1) / PAGE };

/* float -> IEEE binary16 bits, round to nearest even (normal and subnormal range). */
static uint16_t to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  int32_t e = (int32_t)((x >> 23) & 0xff) - 127 + 15;
  uint32_t m = x & 0x7fffffu;
  if (e >= 31) return (uint16_t)(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return (uint16_t)sign;
    m |= 0x800000u;
    {
      const uint32_t shift = (uint32_t)(14 - e);
      uint32_t h = m >> shift;
      const uint32_t rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
      if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
      return (uint16_t)(sign | h);
    }
  }
  {
    uint32_t h = ((uint32_t)e << 10) | (m >> 13);
    const uint32_t rem = m & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
    return (uint16_t)(sign | h);
  }
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static double uniform01(void) {
  g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
  return ((double)(g_rng >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
static double normal(void) {
  return sqrt(-2.0 * log(uniform01())) * cos(6.283185307179586 * uniform01());
}

static uint16_t g_keys[N * D], g_values[N * D];
static uint16_t g_key_pages[PAGES * PAGE * D], g_value_pages[PAGES * PAGE * D];
static int32_t g_table[PAGES];
static float g_queries[G * D];

/* Keys: noise plus a few tokens aligned with the queries (peaked attention, so the sparse
 * path certifies at a level); values: noise. */
static void make_cache(void) {
  size_t t, i, p;
  float dir[D];
  double norm = 0.0;
  for (i = 0; i < D; ++i) {
    dir[i] = (float)normal();
    norm += (double)dir[i] * dir[i];
  }
  for (i = 0; i < D; ++i) dir[i] = (float)(dir[i] / sqrt(norm));
  for (t = 0; t < N; ++t) {
    const double boost = (t % 97 == 5) ? 6.0 : 0.0;
    for (i = 0; i < D; ++i) {
      g_keys[t * D + i] = to_half((float)(normal() + boost * dir[i] * 8.0));
      g_values[t * D + i] = to_half((float)normal());
    }
  }
  for (size_t g = 0; g < G; ++g)
    for (i = 0; i < D; ++i) g_queries[g * D + i] = (float)(dir[i] * 12.0 + 0.3 * normal());
  /* The same cache in pages of PAGE tokens, pages in reverse order. */
  for (p = 0; p < PAGES; ++p) g_table[p] = (int32_t)(PAGES - 1 - p);
  for (t = 0; t < N; ++t) {
    const size_t off = ((size_t)g_table[t / PAGE] * PAGE + t % PAGE) * D;
    memcpy(&g_key_pages[off], &g_keys[t * D], D * sizeof(uint16_t));
    memcpy(&g_value_pages[off], &g_values[t * D], D * sizeof(uint16_t));
  }
}

static certattn_cache strided_cache(size_t n) {
  certattn_cache c;
  memset(&c, 0, sizeof c);
  c.dtype = CERTATTN_DTYPE_F16;
  c.layout = CERTATTN_LAYOUT_STRIDED;
  c.keys = g_keys;
  c.values = g_values;
  c.n_tokens = n;
  c.head_dim = D;
  c.key_stride = D;
  c.value_stride = D;
  return c;
}

static certattn_cache paged_cache(size_t n) {
  certattn_cache c;
  memset(&c, 0, sizeof c);
  c.dtype = CERTATTN_DTYPE_F16;
  c.layout = CERTATTN_LAYOUT_PAGED;
  c.keys = g_key_pages;
  c.values = g_value_pages;
  c.n_tokens = n;
  c.head_dim = D;
  c.block_table = g_table;
  c.block_table_len = PAGES;
  c.page_size = PAGE;
  c.page_stride = PAGE * D;
  c.token_stride = D;
  c.head_offset = 0;
  return c;
}

/* ||out - exact|| <= beta (plus float rounding of the output) for every head. */
static void check_against_exact(const certattn_cache* cache, const float* out,
                                const certattn_certificate* certs, const certattn_options* o) {
  size_t g, i;
  for (g = 0; g < G; ++g) {
    double ref[D], err = 0.0;
    certattn_exact_result r;
    CHECK_OK(certattn_exact_attention(&g_queries[g * D], cache, o->softmax_scale, ref, &r));
    for (i = 0; i < D; ++i) err += (out[g * D + i] - ref[i]) * (out[g * D + i] - ref[i]);
    err = sqrt(err);
    CHECK(certs[g].certified == 1 || certs[g].exact == 1);
    if (certs[g].exact) {
      CHECK(certs[g].level == -1);
      CHECK(err <= 1e-5 * (r.output_norm + r.value_scale));
    } else {
      CHECK(certs[g].path == CERTATTN_PATH_SAMPLED);
      CHECK(certs[g].level >= 0);
      CHECK(certs[g].bound <= o->epsilon);
      CHECK(err <= certs[g].beta + 1e-6 * (r.output_norm + r.value_scale));
      CHECK(certs[g].beta <= o->epsilon * r.value_scale * (1.0 + 1e-9));
    }
    CHECK(certs[g].keys_read >= 1 && certs[g].keys_read <= N);
    /* An exact answer's reference c is the dense kernel's running maximum, in float (its
       weights exp(s_i - c) and denominator are relative to that c); a sampled answer's is
       the exact maximum. */
    CHECK(fabs(certs[g].max_score - r.max_score) <=
          (certs[g].exact ? 1e-6 : 1e-9) * (1.0 + fabs(r.max_score)));
  }
}

/* Steps 1..8 of one group through `hist` (key->step ends at 8), each answer checked
 * against exact attention; returns how many heads were answered by sampling. */
static size_t history_steps(const certattn_cache* cache, const certattn_index* idx,
                            certattn_noise_key* key, const certattn_options* o,
                            certattn_history* hist, certattn_workspace* ws) {
  static float out[G * D];
  certattn_certificate certs[G];
  size_t sampled = 0, g;
  for (key->step = 1; key->step <= 8; ++key->step) {
    CHECK_OK(certattn_attend_group(g_queries, G, cache, idx, key, o, out, certs, ws, hist));
    check_against_exact(cache, out, certs, o);
    for (g = 0; g < G; ++g) sampled += certs[g].path == CERTATTN_PATH_SAMPLED;
  }
  key->step = 8;
  return sampled;
}

static void test_calls(void) {
  certattn_index* idx = NULL;
  certattn_workspace* ws = NULL;
  certattn_history* hist = NULL;
  certattn_options o;
  certattn_noise_key key = {0, 3, 1, 0};
  certattn_cache cache = strided_cache(N), paged = paged_cache(N);
  static float out[G * D], out2[G * D], dense[G * D];
  certattn_certificate certs[G], certs2[G];
  certattn_group_stats stats;
  size_t size = 0, bytes = 0, budget = 0, g, i;
  double cost = 0.0;
  int32_t levels[G];

  CHECK(certattn_c_api_version() == CERTATTN_C_API_VERSION);
  CHECK_OK(certattn_options_default(&o));
  CHECK(o.epsilon == 0.1 && o.delta == 0.05 && o.window == 64 && o.scale == CERTATTN_SCALE_VALUE);
  CHECK(o.certificate == CERTATTN_CERTIFICATE_TIGHT && o.route == CERTATTN_ROUTE_AUTO);
  CHECK(o.cost.fixed == 0.6 && o.cost.per_key == 6.4 && o.cost.give_up == 2.0 && o.cost.measured == 1 && o.grid_top == 6 &&
        o.max_levels == 32);
  CHECK_OK(certattn_options_validate(&o));
  CHECK_OK(certattn_sample_budget(&o, N, &budget));
  CHECK(budget == (size_t)((2.0 - 0.6) * N / 6.4));
  o.delta = 1e-9;

  /* The index: built over a prefix, then appended to, within a reservation. */
  CHECK_OK(certattn_index_create(D, &idx));
  CHECK_OK(certattn_index_reserve(idx, N));
  {
    certattn_cache prefix = strided_cache(N - 100);
    CHECK_OK(certattn_index_build(idx, &prefix));
  }
  CHECK_OK(certattn_index_append(idx, &cache, N - 100));
  CHECK_OK(certattn_index_append_range(idx, &cache, N - 99, 99));
  CHECK_OK(certattn_index_size(idx, &size));
  CHECK(size == N);
  CHECK_OK(certattn_index_memory_bytes(idx, &bytes));
  CHECK(bytes > 0);
  CHECK_OK(certattn_index_refresh(idx, &cache));
  CHECK_OK(certattn_index_set_refresh_policy(idx, CERTATTN_REFRESH_MANUAL));
  CHECK_OK(certattn_workspace_create(G, D, N, &ws));

  /* Without a history: certified within beta, and the same bits twice and from pages. */
  CHECK_OK(certattn_attend_group(g_queries, G, &cache, idx, &key, &o, out, certs, ws, NULL));
  check_against_exact(&cache, out, certs, &o);
  CHECK_OK(certattn_workspace_last_stats(ws, &stats));
  CHECK(stats.tokens == N && stats.pool == N - 64 && stats.bound_violations == 0);
  CHECK(stats.bytes_read > 0 && stats.dense_bytes > 0);
  CHECK_OK(certattn_attend_group(g_queries, G, &cache, idx, &key, &o, out2, certs2, ws, NULL));
  CHECK(memcmp(out, out2, sizeof out) == 0);
  CHECK(memcmp(certs, certs2, sizeof certs) == 0);
  {
    /* Indexes built in one go over either layout hold the same codes and value bounds
     * (the one above was built in two steps, so its value bounds differ). */
    certattn_index *sidx = NULL, *pidx = NULL;
    CHECK_OK(certattn_index_create(D, &sidx));
    CHECK_OK(certattn_index_build(sidx, &cache));
    CHECK_OK(certattn_index_create(D, &pidx));
    CHECK_OK(certattn_index_build(pidx, &paged));
    CHECK_OK(certattn_attend_group(g_queries, G, &cache, sidx, &key, &o, out, certs, ws, NULL));
    memset(out2, 0, sizeof out2);
    CHECK_OK(certattn_attend_group(g_queries, G, &paged, pidx, &key, &o, out2, certs2, ws, NULL));
    CHECK(memcmp(out, out2, sizeof out) == 0);
    CHECK(memcmp(certs, certs2, sizeof certs) == 0);
    check_against_exact(&paged, out2, certs2, &o);
    certattn_index_destroy(sidx);
    certattn_index_destroy(pidx);
  }
  /* Another step draws other perturbations; the sequence field too. */
  key.sequence = 42;
  CHECK_OK(certattn_attend_group(g_queries, G, &cache, idx, &key, &o, out2, certs2, ws, NULL));
  check_against_exact(&cache, out2, certs2, &o);
  key.sequence = 0;

  /* With a history over several steps. */
  CHECK_OK(certattn_history_create(G, &hist));
  CHECK_OK(certattn_history_last_cost(hist, &cost));
  CHECK(isnan(cost));
  CHECK(history_steps(&cache, idx, &key, &o, hist, ws) > 0); /* the peaked cache certifies sparse answers */
  /* With measured costs the last cost is a timing against the dense probe's: any
   * positive value (a small cache on a loaded machine can take longer than two dense
   * kernels). */
  CHECK_OK(certattn_history_last_cost(hist, &cost));
  CHECK(cost > 0.0 && isfinite(cost));
  CHECK_OK(certattn_history_levels(hist, levels, G));
  for (g = 0; g < G; ++g) CHECK(levels[g] >= -1 && levels[g] <= 44);
  /* With the cost model's predictions it is deterministic, and on this peaked cache
   * below give_up dense kernels. */
  {
    certattn_options m = o;
    m.cost.measured = 0;
    CHECK_OK(certattn_history_reset(hist));
    history_steps(&cache, idx, &key, &m, hist, ws);
    CHECK_OK(certattn_history_last_cost(hist, &cost));
    CHECK(cost > 0.0 && cost < m.cost.give_up);
  }
  CHECK_OK(certattn_history_reset(hist));
  CHECK_OK(certattn_history_last_cost(hist, &cost));
  CHECK(isnan(cost));
  CHECK_OK(certattn_history_levels(hist, levels, G));
  for (g = 0; g < G; ++g) CHECK(levels[g] == -1);

  /* Other options: classic certificate, denominator scale, route off. */
  {
    certattn_options c = o;
    c.certificate = CERTATTN_CERTIFICATE_CLASSIC;
    c.route = CERTATTN_ROUTE_OFF;
    c.softmax_scale = 0.1;
    CHECK_OK(certattn_attend_group(g_queries, G, &cache, idx, &key, &c, out, certs, ws, NULL));
    check_against_exact(&cache, out, certs, &c);
    c.scale = CERTATTN_SCALE_DENOMINATOR;
    CHECK_OK(certattn_attend_group(g_queries, G, &cache, idx, &key, &c, out, certs, ws, NULL));
    for (g = 0; g < G; ++g) CHECK(certs[g].certified == 1 || certs[g].exact == 1);
  }

  /* A cache no longer than the window: exact, certified as such. */
  {
    certattn_index* small = NULL;
    certattn_cache c = strided_cache(40);
    CHECK_OK(certattn_index_create(D, &small));
    CHECK_OK(certattn_index_build(small, &c));
    CHECK_OK(certattn_attend_group(g_queries, G, &c, small, &key, &o, out, certs, ws, NULL));
    for (g = 0; g < G; ++g)
      CHECK(certs[g].exact == 1 && certs[g].certified == 1 && certs[g].path == CERTATTN_PATH_NO_POOL);
    check_against_exact(&c, out, certs, &o);
    /* truncate, then grow again */
    CHECK_OK(certattn_index_truncate(small, &c, 10));
    CHECK_OK(certattn_index_size(small, &size));
    CHECK(size == 10);
    certattn_index_destroy(small);
  }

  /* The dense kernel against the double reference (float accumulation). */
  CHECK_OK(certattn_dense_attend(g_queries, G, &cache, 0.0f, dense, ws));
  CHECK_OK(certattn_dense_attend(g_queries, G, &paged, 0.0f, out2, ws));
  CHECK(memcmp(dense, out2, sizeof dense) == 0);
  for (g = 0; g < G; ++g) {
    double ref[D], err = 0.0;
    certattn_exact_result r;
    CHECK_OK(certattn_exact_attention(&g_queries[g * D], &cache, 0.0, ref, &r));
    for (i = 0; i < D; ++i) err += (dense[g * D + i] - ref[i]) * (dense[g * D + i] - ref[i]);
    CHECK(sqrt(err) <= 1e-4 * r.value_scale);
    err = 0.0;
    for (i = 0; i < D; ++i) err += (out2[g * D + i] - ref[i]) * (out2[g * D + i] - ref[i]);
    CHECK(sqrt(err) <= 1e-4 * r.value_scale); /* paged: the same within float rounding */
  }

  certattn_history_destroy(hist);
  certattn_workspace_destroy(ws);
  certattn_index_destroy(idx);
}

/* Three positions of one KV head in one call (speculative verification): each position's
 * answer within its certificate of exact attention over the cache up to its own token;
 * one position is certattn_attend_group() bit for bit; the causal dense kernel agrees with
 * the dense kernel over each prefix. */
static void test_positions(void) {
  enum { P = 3 };
  certattn_index* idx = NULL;
  certattn_workspace* ws = NULL;
  certattn_options o;
  certattn_noise_key key = {7, 0, 0, 0};
  certattn_cache cache = strided_cache(N);
  static float q[P * G * D], out[P * G * D], dense[P * G * D], one[G * D];
  certattn_certificate certs[P * G], one_certs[G];
  certattn_group_stats stats;
  size_t p, g;
  for (p = 0; p < P; ++p) memcpy(&q[p * G * D], g_queries, sizeof g_queries);
  CHECK_OK(certattn_options_default(&o));
  o.delta = 1e-9;
  CHECK_OK(certattn_index_create(D, &idx));
  CHECK_OK(certattn_index_build(idx, &cache));
  CHECK_OK(certattn_workspace_create(P * G, D, N, &ws));

  CHECK_OK(certattn_attend_positions(q, P, G, &cache, idx, &key, &o, out, certs, ws, NULL));
  CHECK_OK(certattn_workspace_last_stats(ws, &stats));
  CHECK(stats.bound_violations == 0 && stats.bytes_read > 0);
  for (p = 0; p < P; ++p) {
    certattn_cache prefix = strided_cache(N - P + 1 + p);
    check_against_exact(&prefix, &out[p * G * D], &certs[p * G], &o);
  }
  /* One position is the group call. */
  CHECK_OK(certattn_attend_positions(g_queries, 1, G, &cache, idx, &key, &o, one, one_certs, ws, NULL));
  CHECK_OK(certattn_attend_group(g_queries, G, &cache, idx, &key, &o, out, certs, ws, NULL));
  CHECK(memcmp(one, out, sizeof one) == 0);
  CHECK(memcmp(one_certs, certs, sizeof one_certs) == 0);

  /* The causal dense kernel against the dense kernel over each prefix. */
  CHECK_OK(certattn_dense_attend_positions(q, P, G, &cache, 0.0f, NULL, dense, ws));
  for (p = 0; p < P; ++p) {
    certattn_cache prefix = strided_cache(N - P + 1 + p);
    CHECK_OK(certattn_dense_attend(g_queries, G, &prefix, 0.0f, one, ws));
    for (g = 0; g < G * D; ++g) CHECK(fabs(one[g] - dense[p * G * D + g]) <= 1e-4);
  }

  /* Bad input names the argument. */
  CHECK_FAILS(certattn_attend_positions(q, 0, G, &cache, idx, &key, &o, out, certs, ws, NULL),
              CERTATTN_EINVAL, "positions must be > 0");
  CHECK_FAILS(certattn_attend_positions(q, P + 1, G, &cache, idx, &key, &o, out, certs, ws, NULL),
              CERTATTN_EINVAL, "positions * group = 16 must lie in [1, 12]");
  CHECK_FAILS(certattn_dense_attend_positions(q, 0, G, &cache, 0.0f, NULL, dense, ws), CERTATTN_EINVAL,
              "positions must be > 0");
  CHECK_FAILS(certattn_dense_attend_positions(NULL, P, G, &cache, 0.0f, NULL, dense, ws), CERTATTN_EINVAL,
              "queries");
  certattn_workspace_destroy(ws);
  certattn_index_destroy(idx);
}

/* Three sequences that share the cache's first N - 300 tokens (views of 0, 100 and 300 own
 * tokens over one storage) in one call: each answer within its certificate of exact
 * attention over its own tokens; the sequence without own tokens is certattn_attend_group()
 * with its id as key.sequence, bit for bit (its certificates but for their share of the
 * scan's bytes); the dense baseline agrees with the dense kernel
 * over each sequence; bad input names the argument. */
static void test_sequences(void) {
  enum { S = 3, PREFIX = N - 300 };
  certattn_index* idx = NULL;
  certattn_workspace* ws = NULL;
  certattn_history* hists[S] = {NULL, NULL, NULL};
  certattn_history* saved = NULL;
  certattn_options o;
  certattn_noise_key key = {5, 1, 0, 0};
  const uint64_t ids[S] = {11, 12, 13}, same[S] = {11, 11, 13};
  certattn_cache caches[S], mixed[S];
  static float q[S * G * D], out[S * G * D], dense[S * G * D], one[G * D];
  certattn_certificate certs[S * G], one_certs[G];
  certattn_group_stats stats;
  size_t s, g;
  caches[0] = strided_cache(PREFIX);
  caches[1] = strided_cache(PREFIX + 100);
  caches[2] = strided_cache(N);
  for (s = 0; s < S; ++s) memcpy(&q[s * G * D], g_queries, sizeof g_queries);
  CHECK_OK(certattn_options_default(&o));
  o.delta = 1e-9;
  CHECK_OK(certattn_index_create(D, &idx));
  CHECK_OK(certattn_index_build(idx, &caches[0]));
  CHECK_OK(certattn_workspace_create(S * G, D, N, &ws));
  for (s = 0; s < S; ++s) CHECK_OK(certattn_history_create(G, &hists[s]));

  CHECK_OK(certattn_attend_sequences(q, S, G, caches, idx, &key, ids, &o, out, certs, ws, NULL));
  CHECK_OK(certattn_workspace_last_stats(ws, &stats));
  CHECK(stats.bound_violations == 0 && stats.bytes_read > 0);
  for (s = 0; s < S; ++s) check_against_exact(&caches[s], &out[s * G * D], &certs[s * G], &o);
  /* The sequence without own tokens is the group call with its id. */
  key.sequence = ids[0];
  CHECK_OK(certattn_attend_group(g_queries, G, &caches[0], idx, &key, &o, one, one_certs, ws, NULL));
  key.sequence = 0;
  CHECK(memcmp(one, out, sizeof one) == 0);
  for (g = 0; g < G; ++g) { /* all but bytes_read: the shared scan's bytes are split over every sequence */
    one_certs[g].bytes_read = certs[g].bytes_read;
    CHECK(memcmp(&one_certs[g], &certs[g], sizeof one_certs[g]) == 0);
  }
  /* With each sequence's history, over a few steps. */
  for (key.step = 6; key.step <= 9; ++key.step) {
    CHECK_OK(certattn_attend_sequences(q, S, G, caches, idx, &key, ids, &o, out, certs, ws, hists));
    for (s = 0; s < S; ++s) check_against_exact(&caches[s], &out[s * G * D], &certs[s * G], &o);
  }

  /* The dense baseline against the dense kernel over each sequence. */
  CHECK_OK(certattn_dense_attend_sequences(q, S, G, caches, PREFIX, 0.0f, NULL, dense, ws));
  for (s = 0; s < S; ++s) {
    CHECK_OK(certattn_dense_attend(g_queries, G, &caches[s], 0.0f, one, ws));
    for (g = 0; g < G * D; ++g) CHECK(fabs(one[g] - dense[s * G * D + g]) <= 1e-4);
  }

  /* Bad input names the argument. */
  CHECK_FAILS(certattn_attend_sequences(q, S, G, caches, idx, &key, same, &o, out, certs, ws, NULL),
              CERTATTN_EINVAL, "sequences: ids 0 and 1 are equal");
  CHECK_FAILS(certattn_attend_sequences(q, 4, G, caches, idx, &key, ids, &o, out, certs, ws, NULL),
              CERTATTN_EINVAL, "sequences * group = 16 must lie in [1, 12]");
  mixed[0] = caches[0];
  mixed[1] = paged_cache(PREFIX + 100);
  mixed[2] = caches[2];
  CHECK_FAILS(certattn_attend_sequences(q, S, G, mixed, idx, &key, ids, &o, out, certs, ws, NULL),
              CERTATTN_EINVAL, "caches[1]: its dtype, value_dtype or layout differs from caches[0]'s");
  saved = hists[1];
  hists[1] = NULL;
  CHECK_FAILS(certattn_attend_sequences(q, S, G, caches, idx, &key, ids, &o, out, certs, ws, hists),
              CERTATTN_EINVAL, "histories[1] is NULL");
  hists[1] = saved;
  CHECK_FAILS(certattn_dense_attend_sequences(q, S, G, caches, N, 0.0f, NULL, dense, ws), CERTATTN_EINVAL,
              "prefix_tokens (3000) exceeds views[0].size() (2700)");
  for (s = 0; s < S; ++s) certattn_history_destroy(hists[s]);
  certattn_workspace_destroy(ws);
  certattn_index_destroy(idx);
}

static void test_bad_input(void) {
  certattn_index* idx = NULL;
  certattn_workspace* ws = NULL;
  certattn_history* hist = NULL;
  certattn_options o, bad;
  certattn_noise_key key = {1, 0, 0, 0};
  certattn_cache cache = strided_cache(N), c;
  static float out[G * D], q[G * D];
  certattn_certificate certs[G];
  double dout[D];
  size_t size;
  double cost;
  int32_t levels[G];
  static uint16_t nan_keys[4 * D];
  int32_t bad_table[4] = {0, -1, 2, 3};

  CHECK_OK(certattn_options_default(&o));
  CHECK_FAILS(certattn_options_default(NULL), CERTATTN_EINVAL, "options");

  /* Handles. */
  CHECK_FAILS(certattn_index_create(0, &idx), CERTATTN_EINVAL, "head_dim");
  CHECK(idx == NULL);
  CHECK_FAILS(certattn_index_create(D, NULL), CERTATTN_EINVAL, "index");
  CHECK_FAILS(certattn_workspace_create(0, D, N, &ws), CERTATTN_EINVAL, "group");
  CHECK_FAILS(certattn_workspace_create(G, 0, N, &ws), CERTATTN_EINVAL, "head_dim");
  CHECK_FAILS(certattn_workspace_create(G, D, SIZE_MAX, &ws), CERTATTN_EINVAL, "max_tokens");
  CHECK_FAILS(certattn_workspace_create(G, D, N, NULL), CERTATTN_EINVAL, "workspace");
  CHECK_FAILS(certattn_workspace_create_levels(G, D, N, 300, &ws), CERTATTN_EINVAL, "max_levels");
  CHECK(ws == NULL);
  CHECK_FAILS(certattn_history_create(0, &hist), CERTATTN_EINVAL, "group");
  CHECK_FAILS(certattn_history_create(G, NULL), CERTATTN_EINVAL, "history");
  certattn_index_destroy(NULL);
  certattn_workspace_destroy(NULL);
  certattn_history_destroy(NULL);

  CHECK_OK(certattn_index_create(D, &idx));
  CHECK_OK(certattn_workspace_create(G, D, N, &ws));
  CHECK_OK(certattn_history_create(G, &hist));

  /* The index. */
  CHECK_FAILS(certattn_index_build(NULL, &cache), CERTATTN_EINVAL, "index must not be NULL");
  CHECK_FAILS(certattn_index_build(idx, NULL), CERTATTN_EINVAL, "cache must not be NULL");
  CHECK_FAILS(certattn_index_append(idx, &cache, 0), CERTATTN_EINVAL, "build() must be called");
  CHECK_FAILS(certattn_index_reserve(NULL, 10), CERTATTN_EINVAL, "index");
  CHECK_FAILS(certattn_index_reserve(idx, SIZE_MAX), CERTATTN_EINVAL, "tokens");
  c = cache; c.dtype = 7;
  CHECK_FAILS(certattn_index_build(idx, &c), CERTATTN_EINVAL, "cache.dtype");
  c = cache; c.layout = 5;
  CHECK_FAILS(certattn_index_build(idx, &c), CERTATTN_EINVAL, "cache.layout");
  c = cache; c.keys = NULL;
  CHECK_FAILS(certattn_index_build(idx, &c), CERTATTN_EINVAL, "cache.keys");
  c = cache; c.head_dim = 0;
  CHECK_FAILS(certattn_index_build(idx, &c), CERTATTN_EINVAL, "cache.head_dim");
  c = cache; c.head_dim = 32; c.key_stride = c.value_stride = 32;
  CHECK_FAILS(certattn_index_build(idx, &c), CERTATTN_EINVAL, "head_dim");
  c = cache; c.key_stride = 10;
  CHECK_FAILS(certattn_index_build(idx, &c), CERTATTN_EINVAL, "key_stride");
  c = cache; c.n_tokens = SIZE_MAX;
  CHECK_FAILS(certattn_index_build(idx, &c), CERTATTN_EINVAL, "cache.n_tokens");
  {
    size_t i;
    for (i = 0; i < 4 * D; ++i) nan_keys[i] = 0x3c00u; /* 1.0 */
    nan_keys[2 * D + 5] = 0x7e00u;                     /* NaN */
    c = cache; c.keys = nan_keys; c.n_tokens = 4;
    CHECK_FAILS(certattn_index_build(idx, &c), CERTATTN_EINVAL, "keys: token 2");
  }
  c = paged_cache(N); c.block_table = NULL;
  CHECK_FAILS(certattn_index_build(idx, &c), CERTATTN_EINVAL, "block_table");
  c = paged_cache(N); c.page_size = 0;
  CHECK_FAILS(certattn_index_build(idx, &c), CERTATTN_EINVAL, "page_size");
  c = paged_cache(N); c.block_table_len = 3;
  CHECK_FAILS(certattn_index_build(idx, &c), CERTATTN_EINVAL, "block_table");
  c = paged_cache(4 * PAGE); c.block_table = bad_table; c.block_table_len = 4;
  CHECK_FAILS(certattn_index_build(idx, &c), CERTATTN_EINVAL, "block_table[1]");

  CHECK_OK(certattn_index_build(idx, &cache));
  CHECK_FAILS(certattn_index_append(idx, &cache, 5), CERTATTN_EINVAL, "position");
  CHECK_FAILS(certattn_index_append_range(idx, &cache, N, 5), CERTATTN_EINVAL, "append_range");
  CHECK_FAILS(certattn_index_truncate(idx, &cache, N + 1), CERTATTN_EINVAL, "truncate");
  c = strided_cache(N - 10);
  CHECK_FAILS(certattn_index_refresh(idx, &c), CERTATTN_EINVAL, "refresh");
  CHECK_FAILS(certattn_index_set_refresh_policy(idx, 9), CERTATTN_EINVAL, "policy");
  CHECK_FAILS(certattn_index_size(idx, NULL), CERTATTN_EINVAL, "size");
  CHECK_FAILS(certattn_index_size(NULL, &size), CERTATTN_EINVAL, "index");
  CHECK_FAILS(certattn_index_memory_bytes(idx, NULL), CERTATTN_EINVAL, "bytes");

  /* The history. */
  CHECK_FAILS(certattn_history_reset(NULL), CERTATTN_EINVAL, "history");
  CHECK_FAILS(certattn_history_last_cost(hist, NULL), CERTATTN_EINVAL, "cost");
  CHECK_FAILS(certattn_history_last_cost(NULL, &cost), CERTATTN_EINVAL, "history");
  CHECK_FAILS(certattn_history_levels(hist, levels, G + 1), CERTATTN_EINVAL, "group");
  CHECK_FAILS(certattn_history_levels(hist, NULL, G), CERTATTN_EINVAL, "levels");
  CHECK_FAILS(certattn_workspace_last_stats(ws, NULL), CERTATTN_EINVAL, "stats");

  /* Options. */
  bad = o; bad.epsilon = -1.0;
  CHECK_FAILS(certattn_options_validate(&bad), CERTATTN_EINVAL, "options.epsilon");
  bad = o; bad.epsilon = NAN;
  CHECK_FAILS(certattn_options_validate(&bad), CERTATTN_EINVAL, "options.epsilon");
  bad = o; bad.delta = 1.0;
  CHECK_FAILS(certattn_options_validate(&bad), CERTATTN_EINVAL, "options.delta");
  bad = o; bad.scale = 3;
  CHECK_FAILS(certattn_options_validate(&bad), CERTATTN_EINVAL, "options.scale");
  bad = o; bad.grid_ratio = 0;
  CHECK_FAILS(certattn_options_validate(&bad), CERTATTN_EINVAL, "options.grid_ratio");
  bad = o; bad.max_levels = -1;
  CHECK_FAILS(certattn_options_validate(&bad), CERTATTN_EINVAL, "options.max_levels");
  bad = o; bad.grid_top = 65;
  CHECK_FAILS(certattn_options_validate(&bad), CERTATTN_EINVAL, "options.grid_top");
  bad = o; bad.softmax_scale = -0.5;
  CHECK_FAILS(certattn_options_validate(&bad), CERTATTN_EINVAL, "options.softmax_scale");
  bad = o; bad.certificate = 2;
  CHECK_FAILS(certattn_options_validate(&bad), CERTATTN_EINVAL, "options.certificate");
  bad = o; bad.route = -1;
  CHECK_FAILS(certattn_options_validate(&bad), CERTATTN_EINVAL, "options.route");
  bad = o; bad.cost.fixed = 1.0;
  CHECK_FAILS(certattn_options_validate(&bad), CERTATTN_EINVAL, "options.cost.fixed");
  bad = o; bad.cost.per_key = 0.0;
  CHECK_FAILS(certattn_options_validate(&bad), CERTATTN_EINVAL, "options.cost.per_key");
  CHECK_FAILS(certattn_options_validate(NULL), CERTATTN_EINVAL, "options");
  CHECK_FAILS(certattn_sample_budget(&o, N, NULL), CERTATTN_EINVAL, "budget");

  /* The certified call. */
  memcpy(q, g_queries, sizeof q);
  CHECK_FAILS(certattn_attend_group(NULL, G, &cache, idx, &key, &o, out, certs, ws, NULL),
              CERTATTN_EINVAL, "queries");
  CHECK_FAILS(certattn_attend_group(q, G, NULL, idx, &key, &o, out, certs, ws, NULL),
              CERTATTN_EINVAL, "cache");
  CHECK_FAILS(certattn_attend_group(q, G, &cache, NULL, &key, &o, out, certs, ws, NULL),
              CERTATTN_EINVAL, "index");
  CHECK_FAILS(certattn_attend_group(q, G, &cache, idx, NULL, &o, out, certs, ws, NULL),
              CERTATTN_EINVAL, "key");
  CHECK_FAILS(certattn_attend_group(q, G, &cache, idx, &key, NULL, out, certs, ws, NULL),
              CERTATTN_EINVAL, "options");
  CHECK_FAILS(certattn_attend_group(q, G, &cache, idx, &key, &o, NULL, certs, ws, NULL),
              CERTATTN_EINVAL, "out");
  CHECK_FAILS(certattn_attend_group(q, G, &cache, idx, &key, &o, out, NULL, ws, NULL),
              CERTATTN_EINVAL, "certs");
  CHECK_FAILS(certattn_attend_group(q, G, &cache, idx, &key, &o, out, certs, NULL, NULL),
              CERTATTN_EINVAL, "workspace");
  CHECK_FAILS(certattn_attend_group(q, 0, &cache, idx, &key, &o, out, certs, ws, NULL),
              CERTATTN_EINVAL, "group");
  CHECK_FAILS(certattn_attend_group(q, G + 1, &cache, idx, &key, &o, out, certs, ws, NULL),
              CERTATTN_EINVAL, "group");
  bad = o; bad.window = 65;
  CHECK_FAILS(certattn_attend_group(q, G, &cache, idx, &key, &bad, out, certs, ws, NULL),
              CERTATTN_EINVAL, "options.window");
  bad = o; bad.max_levels = 40;
  CHECK_FAILS(certattn_attend_group(q, G, &cache, idx, &key, &bad, out, certs, ws, NULL),
              CERTATTN_EINVAL, "levels");
  bad = o; bad.delta = 0.0;
  CHECK_FAILS(certattn_attend_group(q, G, &cache, idx, &key, &bad, out, certs, ws, NULL),
              CERTATTN_EINVAL, "options.delta");
  c = strided_cache(N - 1);
  CHECK_FAILS(certattn_attend_group(q, G, &c, idx, &key, &o, out, certs, ws, NULL),
              CERTATTN_EINVAL, "idx.size()");
  c = cache; c.n_tokens = 0;
  CHECK_FAILS(certattn_attend_group(q, G, &c, idx, &key, &o, out, certs, ws, NULL),
              CERTATTN_EINVAL, "n_tokens");
  c = cache; c.head_dim = 32; c.key_stride = c.value_stride = 32;
  CHECK_FAILS(certattn_attend_group(q, G, &c, idx, &key, &o, out, certs, ws, NULL),
              CERTATTN_EINVAL, "head_dim");
  {
    certattn_history* h2 = NULL;
    CHECK_OK(certattn_history_create(2, &h2));
    CHECK_FAILS(certattn_attend_group(q, G, &cache, idx, &key, &o, out, certs, ws, h2),
                CERTATTN_EINVAL, "history");
    certattn_history_destroy(h2);
  }
  {
    certattn_workspace* small = NULL;
    CHECK_OK(certattn_workspace_create(G, D, 100, &small));
    CHECK_FAILS(certattn_attend_group(q, G, &cache, idx, &key, &o, out, certs, small, NULL),
                CERTATTN_EINVAL, "too small");
    certattn_workspace_destroy(small);
  }
  q[D + 3] = NAN;
  CHECK_FAILS(certattn_attend_group(q, G, &cache, idx, &key, &o, out, certs, ws, hist),
              CERTATTN_EINVAL, "NaN");
  q[D + 3] = 1e30f;
  CHECK_FAILS(certattn_attend_group(q, G, &cache, idx, &key, &o, out, certs, ws, hist),
              CERTATTN_EINVAL, "2^100");
  q[D + 3] = g_queries[D + 3];
  /* After all that, a good call still works. */
  CHECK_OK(certattn_attend_group(q, G, &cache, idx, &key, &o, out, certs, ws, hist));

  /* The dense and the exact reference. */
  CHECK_FAILS(certattn_dense_attend(NULL, G, &cache, 0.0f, out, ws), CERTATTN_EINVAL, "queries");
  CHECK_FAILS(certattn_dense_attend(q, G, &cache, 0.0f, NULL, ws), CERTATTN_EINVAL, "out");
  CHECK_FAILS(certattn_dense_attend(q, G, &cache, 0.0f, out, NULL), CERTATTN_EINVAL, "workspace");
  CHECK_FAILS(certattn_dense_attend(q, G + 1, &cache, 0.0f, out, ws), CERTATTN_EINVAL, "group");
  CHECK_FAILS(certattn_dense_attend(q, G, &cache, -1.0f, out, ws), CERTATTN_EINVAL,
              "softmax_scale");
  c = cache; c.n_tokens = 0;
  CHECK_FAILS(certattn_dense_attend(q, G, &c, 0.0f, out, ws), CERTATTN_EINVAL, "n_tokens");
  q[0] = INFINITY;
  CHECK_FAILS(certattn_dense_attend(q, G, &cache, 0.0f, out, ws), CERTATTN_EINVAL, "queries");
  CHECK_FAILS(certattn_exact_attention(q, &cache, 0.0, dout, NULL), CERTATTN_EINVAL, "q");
  q[0] = g_queries[0];
  CHECK_FAILS(certattn_exact_attention(NULL, &cache, 0.0, dout, NULL), CERTATTN_EINVAL, "query");
  CHECK_FAILS(certattn_exact_attention(q, &cache, 0.0, NULL, NULL), CERTATTN_EINVAL, "out");
  CHECK_FAILS(certattn_exact_attention(q, NULL, 0.0, dout, NULL), CERTATTN_EINVAL, "cache");
  CHECK_FAILS(certattn_exact_attention(q, &cache, NAN, dout, NULL), CERTATTN_EINVAL,
              "softmax_scale");
  CHECK_OK(certattn_exact_attention(q, &cache, 0.0, dout, NULL));

  CHECK(strcmp(certattn_status_string(CERTATTN_OK), "ok") == 0);
  CHECK(strcmp(certattn_status_string(CERTATTN_EINVAL), "invalid argument") == 0);
  CHECK(strcmp(certattn_status_string(CERTATTN_ENOMEM), "out of memory") == 0);
  CHECK(strcmp(certattn_status_string(99), "unknown status") == 0);

  certattn_history_destroy(hist);
  certattn_workspace_destroy(ws);
  certattn_index_destroy(idx);
}

int main(void) {
  make_cache();
  test_calls();
  test_positions();
  test_sequences();
  test_bad_input();
  if (g_failures != 0) {
    fprintf(stderr, "%d check(s) failed\n", g_failures);
    return 1;
  }
  printf("certattn C API: all checks passed\n");
  return 0;
}
