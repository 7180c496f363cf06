// The smallest complete use of certattn: one layer's fp16 KV cache in one contiguous
// token-major buffer (llama.cpp's layout), the key index of one KV head, and one certified
// call for the G query heads of its GQA group. Each output is compared with exact
// attention in double precision, and each certificate is printed beside the error it
// promises to bound.
//
// The cache and the queries come from certattn's synthetic generator (a stand-in for a
// model: sinks, recency, heavy hitters, outlier channels); an engine has its own.
#include <certattn/certattn.hpp>
#include <certattn/testing/synthetic.hpp>
#include <certattn/exact.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <vector>

int main() {
  namespace syn = certattn::synthetic;
  using certattn::half;

  // ---- the engine's side: one layer of a token-major cache [n_tokens][kv_heads][head_dim]
  const std::size_t n = 16384, kv_heads = 4, d = 128, group = 4;  // 16 query heads, GQA 4
  syn::cache_config cfg;
  cfg.n_tokens = n;
  cfg.head_dim = d;
  cfg.kv_heads = kv_heads;
  cfg.kind = syn::regime::kMixed;
  const syn::kv_cache model = syn::make_cache(cfg);
  // The engine's cache, on huge pages (docs/integration.md, "Memory").
  certattn::large_vector<half> keys(n * kv_heads * d), values(n * kv_heads * d);
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t h = 0; h < kv_heads; ++h)
      for (std::size_t i = 0; i < d; ++i) {
        keys[(t * kv_heads + h) * d + i] = model.key_row(h, t)[i];
        values[(t * kv_heads + h) * d + i] = model.value_row(h, t)[i];
      }

  // ---- describe KV head 1 of that buffer to the library and index its keys (after prefill)
  const std::size_t head = 1;
  const auto kv = certattn::nhd_view(keys.data(), values.data(), n, kv_heads, d, head);
  certattn::key_index idx(d);
  idx.build(kv);

  // ---- one certified call for the group's query heads: q [group][head_dim]
  const std::uint64_t step = 0;
  const std::vector<float> q = syn::make_queries(model, head, group, step);
  certattn::options opt;  // value-scale error, window 64
  opt.epsilon = 0.1;      // ||o^ - o|| <= 0.1 M per head ...
  opt.delta = 0.01;       // ... with probability >= 0.99 per head and call
  opt.seed = 2026;        // fixed before generation; noise_key.step advances per step
  certattn::attend_workspace ws(group, d, n);  // sized once, reused by every call
  std::vector<float> out(group * d);
  std::vector<certattn::certificate> certs(group);
  const certattn::noise_key nk{step, /*layer=*/0, /*kv_head=*/std::uint32_t(head)};
  certattn::attend_group(std::span<const float>(q), group, kv, idx, nk, opt, std::span<float>(out),
                         std::span<certattn::certificate>(certs), ws);

  // ---- compare with exact attention (double) and print the certificates
  std::printf(
      "certattn minimal: %zu tokens, head_dim %zu, KV head %zu of %zu, group %zu, "
      "epsilon %.2f, delta %.2g (value scale)\n",
      n, d, head, kv_heads, group, opt.epsilon, opt.delta);
  std::printf("index: %zu bytes = %.0f%% of this head's fp16 K+V\n", idx.memory_bytes(),
              100.0 * double(idx.memory_bytes()) / double(2 * n * d * sizeof(half)));
  std::printf("%4s %9s %5s %10s %10s %12s %12s\n", "head", "result", "level", "keys read", "bound",
              "error/M", "error/|o|");
  int violations = 0;
  for (std::size_t g = 0; g < group; ++g) {
    const auto ex =
        certattn::exact_attention(std::span<const float>(q.data() + g * d, d),
                                  certattn::keys_matrix(kv), certattn::values_matrix(kv));
    double err2 = 0.0;
    for (std::size_t i = 0; i < d; ++i) {
      const double e = double(out[g * d + i]) - ex.output[i];
      err2 += e * e;
    }
    const double err = std::sqrt(err2);
    const certattn::certificate& c = certs[g];
    std::printf("%4zu %9s %5d %10zu %10.4f %12.6f %12.6f\n", g,
                c.exact ? "exact" : (c.certified ? "certified" : "?"), c.level, c.keys_read,
                c.bound, err / ex.value_scale, err / ex.output_norm);
    // The promise: P(certified and error > epsilon * M) <= delta.
    if (c.certified && err > opt.epsilon * ex.value_scale) ++violations;
  }
  const certattn::group_stats& st = ws.last_stats();
  std::printf("group read %zu of %zu bytes dense attention reads (%.1f%%), %zu fallbacks\n",
              st.bytes_read, st.dense_bytes, 100.0 * double(st.bytes_read) / double(st.dense_bytes),
              st.fallbacks);
  if (violations > 0) {
    std::printf("%d certified head(s) above epsilon * M: an event of probability <= delta each\n",
                violations);
    return EXIT_FAILURE;
  }
  return EXIT_SUCCESS;
}
