// certattn over a paged KV cache, as vLLM and FlashInfer keep one: a pool of fixed-size
// pages (16 tokens each), a free list, and a block table per sequence mapping its page
// number to a pool page. After a prefill the sequence decodes token by token: a new page
// is taken from the free list whenever the last one is full, the new key and value are
// written into it, the token is appended to each KV head's key index, and one certified
// call per KV head answers the step. Every output is checked against exact attention.
//
// Pages here are token-major (vLLM's flash-attention layout, FlashInfer's NHD):
// [page][page_size][kv_heads][head_dim]. For FlashInfer's HND pages
// [page][kv_heads][page_size][head_dim] pass token_stride = head_dim and
// head_offset = head * page_size * head_dim instead (docs/integration.md).
#include <algorithm>
#include <certattn/certattn.hpp>
#include <certattn/testing/synthetic.hpp>
#include <certattn/exact.hpp>
#include <certattn/parallel.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <vector>

namespace {

using certattn::half;

/// The engine's paged cache of one layer: the page pool and its free list.
struct page_pool {
  static constexpr std::size_t page_size = 16;
  std::size_t kv_heads, head_dim;
  // On huge pages (docs/integration.md, "Memory"): the certified call reads rows at random.
  certattn::large_vector<half> key_pages, value_pages;  // [pages][page_size][kv_heads][head_dim]
  std::vector<std::int32_t> free_list;

  page_pool(std::size_t pages, std::size_t kv_heads_, std::size_t head_dim_)
      : kv_heads(kv_heads_),
        head_dim(head_dim_),
        key_pages(pages * page_stride()),
        value_pages(pages * page_stride()) {
    // Hand pages out in a scrambled order, as a pool shared by many sequences would:
    // consecutive pages of one sequence are far apart in memory.
    for (std::size_t p = 0; p < pages; ++p)
      free_list.push_back(std::int32_t((p * 37) % pages));  // 37 is prime to `pages`
  }
  std::size_t page_stride() const { return page_size * kv_heads * head_dim; }
  std::size_t token_stride() const { return kv_heads * head_dim; }
  std::int32_t allocate() {
    if (free_list.empty()) {
      std::fprintf(stderr, "page pool exhausted\n");
      std::exit(EXIT_FAILURE);
    }
    const std::int32_t p = free_list.back();
    free_list.pop_back();
    return p;
  }
  half* key_slot(const std::vector<std::int32_t>& table, std::size_t t, std::size_t head) {
    return key_pages.data() + std::size_t(table[t / page_size]) * page_stride() +
           (t % page_size) * token_stride() + head * head_dim;
  }
  half* value_slot(const std::vector<std::int32_t>& table, std::size_t t, std::size_t head) {
    return value_pages.data() + std::size_t(table[t / page_size]) * page_stride() +
           (t % page_size) * token_stride() + head * head_dim;
  }
  /// What the library sees of one KV head of a sequence with n tokens.
  certattn::paged_kv<half> view(const std::vector<std::int32_t>& table, std::size_t n,
                                std::size_t head) const {
    return certattn::paged_kv<half>(key_pages.data(), value_pages.data(),
                                    std::span<const std::int32_t>(table), n, page_size, head_dim,
                                    page_stride(), token_stride(), head * head_dim);
  }
};

}  // namespace

int main() {
  namespace syn = certattn::synthetic;
  const std::size_t kv_heads = 2, d = 128, group = 4;
  const std::size_t prefill = 1000, steps = 48;  // crosses 3 page and 1 index-block boundary
  const std::size_t n_max = prefill + steps;

  // Stand-in for the model: the keys and values it would write, token by token.
  syn::cache_config cfg;
  cfg.n_tokens = n_max;
  cfg.head_dim = d;
  cfg.kv_heads = kv_heads;
  cfg.kind = syn::regime::kMixed;
  const syn::kv_cache model = syn::make_cache(cfg);

  page_pool pool(/*pages=*/97, kv_heads, d);
  std::vector<std::int32_t> block_table;  // this sequence's pages, in order
  auto write_token = [&](std::size_t t) {
    if (t % page_pool::page_size == 0) block_table.push_back(pool.allocate());
    for (std::size_t h = 0; h < kv_heads; ++h)
      for (std::size_t i = 0; i < d; ++i) {
        pool.key_slot(block_table, t, h)[i] = model.key_row(h, t)[i];
        pool.value_slot(block_table, t, h)[i] = model.value_row(h, t)[i];
      }
  };

  // ---- prefill: write the prompt's tokens, then build one index per KV head
  for (std::size_t t = 0; t < prefill; ++t) write_token(t);
  std::vector<certattn::key_index> index;
  for (std::size_t h = 0; h < kv_heads; ++h) {
    index.emplace_back(d);
    index[h].reserve(n_max);  // appends up to n_max do not reallocate the codes
    index[h].build(pool.view(block_table, prefill, h));
  }

  certattn::options opt;
  opt.epsilon = 0.1;
  opt.delta = 0.01;
  opt.seed = 7;  // fixed before generation
  // The engine's threads run the heads; each worker owns one workspace.
  certattn::thread_pool threads(2);
  std::vector<certattn::attend_workspace> ws;
  for (std::size_t w = 0; w < threads.size(); ++w) ws.emplace_back(group, d, n_max);
  std::vector<float> out(kv_heads * group * d);
  std::vector<certattn::certificate> certs(kv_heads * group);

  std::printf(
      "certattn paged: page_size %zu, %zu KV heads x %zu query heads, head_dim %zu, "
      "prefill %zu, %zu decode steps, epsilon %.2f, delta %.2g\n",
      page_pool::page_size, kv_heads, group, d, prefill, steps, opt.epsilon, opt.delta);
  std::printf("%5s %6s %6s %10s %9s %10s %12s %10s\n", "step", "tokens", "pages", "last page",
              "certified", "fallbacks", "keys read", "max err/M");
  int violations = 0;
  std::size_t certified_total = 0;
  for (std::size_t step = 0; step < steps; ++step) {
    // ---- the engine writes the new token (a new page at every page boundary) ...
    const std::size_t pos = prefill + step, n = pos + 1;
    write_token(pos);
    // ---- ... appends it to every head's index (between calls: the index is read-only
    // during them) ...
    for (std::size_t h = 0; h < kv_heads; ++h) index[h].append(pool.view(block_table, n, h), pos);
    // ---- ... and answers the step with one certified call per KV head.
    std::vector<std::vector<float>> q(kv_heads);
    for (std::size_t h = 0; h < kv_heads; ++h) q[h] = syn::make_queries(model, h, group, step);
    threads.parallel_for(kv_heads, [&](std::size_t h, std::size_t worker) {
      const certattn::noise_key nk{step, /*layer=*/0, std::uint32_t(h)};
      certattn::attend_group(
          std::span<const float>(q[h]), group, pool.view(block_table, n, h), index[h], nk, opt,
          std::span<float>(out).subspan(h * group * d, group * d),
          std::span<certattn::certificate>(certs).subspan(h * group, group), ws[worker]);
    });

    // ---- check against exact attention (rows gathered from the pages for the check only)
    std::size_t certified = 0, fallbacks = 0, keys_read = 0;
    double worst = 0.0;
    for (std::size_t h = 0; h < kv_heads; ++h) {
      const auto kv = pool.view(block_table, n, h);
      std::vector<half> k(n * d), v(n * d);
      for (std::size_t t = 0; t < n; ++t)
        for (std::size_t i = 0; i < d; ++i) {
          k[t * d + i] = kv.key(t)[i];
          v[t * d + i] = kv.value(t)[i];
        }
      for (std::size_t g = 0; g < group; ++g) {
        const auto ex = certattn::exact_attention(std::span<const float>(q[h].data() + g * d, d),
                                                  certattn::make_matrix_view(k.data(), n, d),
                                                  certattn::make_matrix_view(v.data(), n, d));
        double err2 = 0.0;
        for (std::size_t i = 0; i < d; ++i) {
          const double e = double(out[(h * group + g) * d + i]) - ex.output[i];
          err2 += e * e;
        }
        const double rel = std::sqrt(err2) / ex.value_scale;
        const certattn::certificate& c = certs[h * group + g];
        certified += c.certified;
        fallbacks += c.exact;
        keys_read += c.keys_read;
        worst = std::max(worst, rel);
        if (c.certified && rel > opt.epsilon) ++violations;
      }
    }
    certified_total += certified;
    std::printf("%5zu %6zu %6zu %10d %6zu/%zu %10zu %11.1f%% %10.5f\n", step, n, block_table.size(),
                block_table.back(), certified, kv_heads * group, fallbacks,
                100.0 * double(keys_read) / double(kv_heads * group * n), worst);
  }
  std::printf("%zu of %zu calls certified; index %zu bytes per head (%.0f%% of its fp16 K+V)\n",
              certified_total, steps * kv_heads * group, index[0].memory_bytes(),
              100.0 * double(index[0].memory_bytes()) / double(2 * n_max * d * sizeof(half)));
  if (violations > 0) {
    std::printf("%d certified call(s) above epsilon * M: events of probability <= delta each\n",
                violations);
    return EXIT_FAILURE;
  }
  return EXIT_SUCCESS;
}
