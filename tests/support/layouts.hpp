// Test helper: one synthetic cache copied into each layout the library adapts to
// (head-major, token-major, paged with a shuffled block table) and each element type,
// quantized formats included (their rows encoded from the synthetic floats; an fp8
// cache's scale fixed per head from its largest channel).
#pragma once

#include <certattn/layout.hpp>
#include <certattn/testing/synthetic.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace certattn::test {

enum class layout_kind { kHnd, kNhd, kPaged };
inline std::string to_string(layout_kind k) {
  return k == layout_kind::kHnd ? "hnd" : k == layout_kind::kNhd ? "nhd" : "paged";
}

/// The cache of all KV heads in one layout, keys stored as K and values as V. Views are
/// per head.
template <kv_element K, kv_element V = K>
struct layout_cache {
  layout_kind kind = layout_kind::kHnd;
  std::size_t n = 0, d = 0, heads = 0, page = 16;
  std::vector<K> keys;
  std::vector<V> values;
  std::vector<std::int32_t> table;
  std::vector<fp8_scales> scales;  // per head (1 for a side that is not fp8)

  strided_kv<K, V> strided(std::size_t h) const {
    const strided_kv<K, V> v = kind == layout_kind::kHnd
                                   ? hnd_view(keys.data(), values.data(), n, n, heads, d, h)
                                   : nhd_view(keys.data(), values.data(), n, heads, d, h);
    if constexpr (fp8_element<K> || fp8_element<V>)
      return v.with_scales(scales[h]);
    else
      return v;
  }
  paged_kv<K, V> paged(std::size_t h) const {
    // FlashInfer-style HND pages: [pages][heads][page][d], counted in units of K.
    const std::size_t u = format_traits<K>::units(d);
    const paged_kv<K, V> v(keys.data(), values.data(), table, n, page, d, heads * page * u, u,
                           h * page * u);
    if constexpr (fp8_element<K> || fp8_element<V>)
      return v.with_scales(scales[h]);
    else
      return v;
  }
};

/// One row of floats stored as T (rounded, or quantized with `scale` for fp8).
template <kv_element T>
void store_row(const float* x, std::size_t d, float scale, T* out) {
  if constexpr (storage_element<T>) {
    for (std::size_t i = 0; i < d; ++i) out[i] = T(x[i]);
  } else if constexpr (fp8_element<T>) {
    quantize_row(x, d, scale, out);
  } else {
    (void)scale;
    quantize_row(x, d, out);
  }
}

template <kv_element K, kv_element V = K>
layout_cache<K, V> make_layout_cache(const synthetic::kv_cache& src, layout_kind kind,
                                     std::uint64_t seed = 7) {
  layout_cache<K, V> c;
  c.kind = kind;
  c.n = src.config.n_tokens;
  c.d = src.config.head_dim;
  c.heads = src.config.kv_heads;
  const std::size_t n = c.n, H = c.heads;
  const std::size_t ku = format_traits<K>::units(c.d), vu = format_traits<V>::units(c.d);
  const std::size_t rows = (kind == layout_kind::kPaged ? (n + c.page - 1) / c.page * c.page : n) * H;
  c.keys.resize(rows * ku);
  c.values.resize(rows * vu);
  if (kind == layout_kind::kPaged) {
    c.table.resize((n + c.page - 1) / c.page);
    std::iota(c.table.begin(), c.table.end(), 0);
    std::mt19937_64 rng(seed);
    std::shuffle(c.table.begin(), c.table.end(), rng);
  }
  c.scales.assign(H, {});
  std::vector<float> key(c.d), value(c.d);
  for (std::size_t h = 0; h < H; ++h) {
    // An fp8 side's scale puts its largest channel at a quarter of the format's range.
    const auto range = [](auto* tag) {
      return std::is_same_v<std::remove_pointer_t<decltype(tag)>, fp8_e4m3> ? 112.0f : 14336.0f;
    };
    if constexpr (fp8_element<K> || fp8_element<V>) {
      float km = 0.0f, vm = 0.0f;
      for (std::size_t t = 0; t < n; ++t)
        for (std::size_t i = 0; i < c.d; ++i) {
          km = std::max(km, std::fabs(float(src.key_row(h, t)[i])));
          vm = std::max(vm, std::fabs(float(src.value_row(h, t)[i])));
        }
      if constexpr (fp8_element<K>) c.scales[h].key = km > 0.0f ? km / range((K*)nullptr) : 1.0f;
      if constexpr (fp8_element<V>) c.scales[h].value = vm > 0.0f ? vm / range((V*)nullptr) : 1.0f;
    }
    for (std::size_t t = 0; t < n; ++t) {
      std::size_t row;  // in rows of head_dim channels
      switch (kind) {
        case layout_kind::kHnd: row = h * n + t; break;
        case layout_kind::kNhd: row = t * H + h; break;
        default: row = (std::size_t(c.table[t / c.page]) * H + h) * c.page + t % c.page;
      }
      for (std::size_t i = 0; i < c.d; ++i) {
        key[i] = float(src.key_row(h, t)[i]);
        value[i] = float(src.value_row(h, t)[i]);
      }
      store_row(key.data(), c.d, c.scales[h].key, c.keys.data() + row * ku);
      store_row(value.data(), c.d, c.scales[h].value, c.values.data() + row * vu);
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
