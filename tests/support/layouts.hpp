// Test helper: one synthetic cache copied into each layout the library adapts to
// (head-major, token-major, paged with a shuffled block table) and each element type.
#pragma once

#include <certattn/layout.hpp>
#include <certattn/testing/synthetic.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace certattn::test {

enum class layout_kind { kHnd, kNhd, kPaged };
inline std::string to_string(layout_kind k) {
  return k == layout_kind::kHnd ? "hnd" : k == layout_kind::kNhd ? "nhd" : "paged";
}

/// The cache of all KV heads in one layout and element type. Views are per head.
template <storage_element T>
struct layout_cache {
  layout_kind kind = layout_kind::kHnd;
  std::size_t n = 0, d = 0, heads = 0, page = 16;
  std::vector<T> keys, values;
  std::vector<std::int32_t> table;

  strided_kv<T> strided(std::size_t h) const {
    if (kind == layout_kind::kHnd)
      return hnd_view(keys.data(), values.data(), n, n, heads, d, h);
    return nhd_view(keys.data(), values.data(), n, heads, d, h);
  }
  paged_kv<T> paged(std::size_t h) const {
    // FlashInfer-style HND pages: [pages][heads][page][d].
    return paged_kv<T>(keys.data(), values.data(), table, n, page, d, heads * page * d, d,
                       h * page * d);
  }
};

template <storage_element T>
layout_cache<T> make_layout_cache(const synthetic::kv_cache& src, layout_kind kind,
                                  std::uint64_t seed = 7) {
  layout_cache<T> c;
  c.kind = kind;
  c.n = src.config.n_tokens;
  c.d = src.config.head_dim;
  c.heads = src.config.kv_heads;
  const std::size_t n = c.n, d = c.d, H = c.heads;
  std::size_t pages = (n + c.page - 1) / c.page;
  c.keys.resize((kind == layout_kind::kPaged ? pages * c.page : n) * H * d);
  c.values.resize(c.keys.size());
  if (kind == layout_kind::kPaged) {
    c.table.resize(pages);
    std::iota(c.table.begin(), c.table.end(), 0);
    std::mt19937_64 rng(seed);
    std::shuffle(c.table.begin(), c.table.end(), rng);
  }
  for (std::size_t h = 0; h < H; ++h)
    for (std::size_t t = 0; t < n; ++t) {
      std::size_t off;
      switch (kind) {
        case layout_kind::kHnd: off = (h * n + t) * d; break;
        case layout_kind::kNhd: off = (t * H + h) * d; break;
        default:
          off = ((std::size_t(c.table[t / c.page]) * H + h) * c.page + t % c.page) * d;
      }
      for (std::size_t i = 0; i < d; ++i) {
        c.keys[off + i] = T(float(src.key_row(h, t)[i]));
        c.values[off + i] = T(float(src.value_row(h, t)[i]));
      }
    }
  return c;
}

/// Dense copies of one head as matrices for the reference (row-major [n][d]).
template <storage_element T, class View>
void gather_head(const View& kv, std::vector<T>& k, std::vector<T>& v) {
  const std::size_t n = kv.size(), d = kv.head_dim();
  k.resize(n * d);
  v.resize(n * d);
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t i = 0; i < d; ++i) {
      k[t * d + i] = kv.key(t)[i];
      v[t * d + i] = kv.value(t)[i];
    }
}

}  // namespace certattn::test
