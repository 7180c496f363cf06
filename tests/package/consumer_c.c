/* A C consumer of the installed C ABI: one certified call over a tiny fp32 cache. */
#include <certattn/c/certattn.h>

#include <stdio.h>
#include <string.h>

int main(void) {
  enum { N = 200, D = 8, G = 2 };
  static float keys[N * D], values[N * D];
  float q[G * D], out[G * D];
  certattn_certificate certs[G];
  certattn_cache cache;
  certattn_options opt;
  certattn_noise_key key = {1, 0, 0, 0};
  certattn_index* idx = NULL;
  certattn_workspace* ws = NULL;
  int t, i, rc;
  for (t = 0; t < N; ++t)
    for (i = 0; i < D; ++i) {
      keys[t * D + i] = (float)((t * 7 + i * 3) % 11) * 0.1f;
      values[t * D + i] = (float)((t + i) % 5);
    }
  for (i = 0; i < G * D; ++i) q[i] = 0.5f;
  memset(&cache, 0, sizeof cache);
  cache.dtype = CERTATTN_DTYPE_F32;
  cache.layout = CERTATTN_LAYOUT_STRIDED;
  cache.keys = keys;
  cache.values = values;
  cache.n_tokens = N;
  cache.head_dim = D;
  cache.key_stride = cache.value_stride = D;
  if (certattn_c_api_version() != CERTATTN_C_API_VERSION ||
      certattn_options_default(&opt) != CERTATTN_OK ||
      certattn_index_create(D, &idx) != CERTATTN_OK ||
      certattn_index_build(idx, &cache) != CERTATTN_OK ||
      certattn_workspace_create(G, D, N, &ws) != CERTATTN_OK ||
      (rc = certattn_attend_group(q, G, &cache, idx, &key, &opt, out, certs, ws, NULL)) !=
          CERTATTN_OK) {
    fprintf(stderr, "certattn C API: %s\n", certattn_last_error());
    return 1;
  }
  if (certattn_index_create(0, NULL) != CERTATTN_EINVAL || certattn_last_error()[0] == '\0')
    return 1;
  certattn_workspace_destroy(ws);
  certattn_index_destroy(idx);
  printf("certattn C API %d: certified %d, exact %d, bound %g\n", CERTATTN_C_API_VERSION,
         certs[0].certified, certs[0].exact, certs[0].bound);
  /* A head is answered either under a certificate or exactly (a cache this small is
   * cheaper to read whole than to sample). */
  for (i = 0; i < G; ++i)
    if (!certs[i].certified && !certs[i].exact) return 1;
  return 0;
}
