// Shared by `accuracy` and `audit`: the data a run evaluates (a synthetic setting or a KV
// cache and queries dumped from a real model as .npy), exact attention of one query in
// double precision, order statistics, and exact binomial bounds.
#pragma once

#include "bench_common.hpp"
#include "npy.hpp"
#include "../tests/support/stats.hpp"

#include <certattn/arch/dispatch.hpp>
#include <certattn/arch/score_dot.hpp>
#include <certattn/exact.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace certattn::bench {

/// One layer's cache (all KV heads, fp16, head-major) and the decode queries to run on it.
struct eval_data {
  std::string name;    // "mixed/16K", or the .npy cache's file name
  std::string source;  // the regime, or "npy"
  std::size_t n = 0, d = 0, heads = 0, group = 0, steps = 0;
  large_vector<half> keys, values;  // [heads][n][d]
  std::vector<float> queries;      // [steps][heads][group][d]

  const half* key_rows(std::size_t h) const noexcept { return keys.data() + h * n * d; }
  const half* value_rows(std::size_t h) const noexcept { return values.data() + h * n * d; }
  strided_kv<half> view(std::size_t h) const { return hnd_view(keys.data(), values.data(), n, n, heads, d, h); }
  matrix_view<half> key_matrix(std::size_t h) const { return make_matrix_view(key_rows(h), n, d); }
  matrix_view<half> value_matrix(std::size_t h) const { return make_matrix_view(value_rows(h), n, d); }
  const float* query(std::size_t step, std::size_t h, std::size_t g) const noexcept {
    return queries.data() + ((step * heads + h) * group + g) * d;
  }
  std::size_t calls() const noexcept { return steps * heads * group; }
};

/// A synthetic setting: make_cache + make_queries (docs/synthetic.md).
inline eval_data synthetic_data(synthetic::regime regime, std::size_t n, std::size_t heads, std::size_t group,
                                std::size_t d, std::size_t steps, std::uint64_t seed) {
  synthetic::cache_config cfg;
  cfg.n_tokens = n;
  cfg.head_dim = d;
  cfg.kv_heads = heads;
  cfg.kind = regime;
  cfg.seed = seed;
  synthetic::kv_cache cache = synthetic::make_cache(cfg);
  eval_data e;
  e.source = std::string(synthetic::to_string(regime));
  e.name = e.source + "/" + format_count(n);
  e.n = n;
  e.d = d;
  e.heads = heads;
  e.group = group;
  e.steps = steps;
  e.queries = make_step_queries(cache, group, steps);
  e.keys = std::move(cache.keys);
  e.values = std::move(cache.values);
  return e;
}

/// A user's cache and queries:
///   kv      float16 or float32 [2, kv_heads, n_tokens, head_dim] (keys, then values;
///           tokens oldest first, RoPE applied as the model attends to them)
///   queries float16 or float32 [steps, kv_heads, group, head_dim] (unscaled; the softmax
///           scale is 1/sqrt(head_dim))
/// The first steps holding at least max_calls calls are used (0: all).
inline eval_data npy_data(const std::string& kv_path, const std::string& queries_path, std::size_t max_calls) {
  const npy::array kv = npy::read(kv_path);
  if (kv.shape.size() != 4 || kv.shape[0] != 2)
    throw error(kv_path + ": expected shape [2, kv_heads, n_tokens, head_dim], got " +
                npy::detail::shape_text(kv.shape));
  const npy::array q = npy::read(queries_path);
  if (q.shape.size() != 4)
    throw error(queries_path + ": expected shape [steps, kv_heads, group, head_dim], got " +
                npy::detail::shape_text(q.shape));
  eval_data e;
  e.heads = kv.shape[1];
  e.n = kv.shape[2];
  e.d = kv.shape[3];
  if (q.shape[1] != e.heads || q.shape[3] != e.d)
    throw error(queries_path + ": shape " + npy::detail::shape_text(q.shape) + " does not fit the cache " +
                npy::detail::shape_text(kv.shape) + " (kv_heads and head_dim must agree)");
  if (e.heads == 0 || e.n == 0 || e.d == 0 || q.shape[0] == 0 || q.shape[2] == 0)
    throw error(kv_path + ": empty cache or no queries");
  e.group = q.shape[2];
  const std::size_t per_step = e.heads * e.group;
  e.steps = max_calls > 0 ? std::min((max_calls + per_step - 1) / per_step, q.shape[0]) : q.shape[0];
  std::vector<half> all = kv.to_half(kv_path);
  const std::size_t half_size = e.heads * e.n * e.d;
  e.keys.assign(all.begin(), all.begin() + std::ptrdiff_t(half_size));
  e.values.assign(all.begin() + std::ptrdiff_t(half_size), all.end());
  std::vector<float> qf = q.to_float();
  qf.resize(e.steps * e.heads * e.group * e.d);
  for (float x : qf)
    if (!std::isfinite(x)) throw error(queries_path + ": contains NaN or Inf");
  e.queries = std::move(qf);
  e.source = "npy";
  e.name = std::filesystem::path(kv_path).filename().string();
  return e;
}

/// eval_data's cache stored in another format (head-major, as layer_cache stores it: int8 or
/// 4-bit blocks, fp8 with a scale per head, bf16), with its rows decoded to floats: the
/// numbers the certified call reads, which exact attention and the reference read too.
struct stored_cache {
  std::size_t n = 0, d = 0;
  std::unique_ptr<const layer_cache> lc;
  std::vector<float> keys, values;  // [heads][n][d], decoded

  stored_cache(const eval_data& e, cache_dtype format) : n(e.n), d(e.d) {
    syn::kv_cache src;
    src.config.n_tokens = e.n;
    src.config.head_dim = e.d;
    src.config.kv_heads = e.heads;
    src.keys.assign(e.keys.begin(), e.keys.end());
    src.values.assign(e.values.begin(), e.values.end());
    lc = std::make_unique<const layer_cache>(src, layout_kind::kHnd, 1, format);
    keys.resize(e.heads * n * d);
    values.resize(e.heads * n * d);
    lc->visit([&](auto view_of) {
      for (std::size_t h = 0; h < e.heads; ++h) {
        const auto kv = view_of(h);
        for (std::size_t t = 0; t < n; ++t) {
          detail::key_to_float(kv, t, keys.data() + (h * n + t) * d);
          detail::value_to_float(kv, t, values.data() + (h * n + t) * d);
        }
      }
      return 0;
    });
  }
  const float* key_rows(std::size_t h) const noexcept { return keys.data() + h * n * d; }
  const float* value_rows(std::size_t h) const noexcept { return values.data() + h * n * d; }
  matrix_view<float> key_matrix(std::size_t h) const { return make_matrix_view(key_rows(h), n, d); }
  matrix_view<float> value_matrix(std::size_t h) const { return make_matrix_view(value_rows(h), n, d); }
};

/// Exact attention of one query in double: the same scores as exact_attention() and the
/// certified call (8 fixed lanes, the same bits), with vectorised kernels.
struct exact_call {
  std::vector<double> s;  // scores scale * q.k_i   [n]
  std::vector<double> w;  // exp(s_i - c)           [n]
  std::vector<double> o;  // output                 [d]
  double c = 0, D = 0, M = 0, o_norm = 0;
};

/// hv: the head's variant (variant.hpp): its scores, only the tokens from hv.first, and the
/// sink in D (weights w_t of the tokens before hv.first are 0).
template <class T>
inline void exact_attend(const float* q, const T* keys, const T* values, std::size_t n, std::size_t d,
                         double scale, exact_call& out, const head_variant& hv = {}) {
  const isa which = active_isa();
  out.s.resize(n);
  out.w.assign(n, 0.0);
  out.o.assign(d, 0.0);
  double c = hv.has_sink ? hv.sink : -INFINITY;
  for (std::size_t t = 0; t < n; ++t) {
    out.s[t] = hv.score(scale * detail::score_dot_fast(q, keys + t * d, d, which), t);
    if (t >= hv.first) c = std::max(c, out.s[t]);
  }
  double D = hv.has_sink ? std::exp(hv.sink - c) : 0.0, sq = 0;
  for (std::size_t t = hv.first; t < n; ++t) {
    const double w = std::exp(out.s[t] - c);
    out.w[t] = w;
    D += w;
    sq += w * detail::accumulate_row(values + t * d, d, w, out.o.data(), which);
  }
  double on = 0;
  for (double& x : out.o) {
    x /= D;
    on += x * x;
  }
  out.c = c;
  out.D = D;
  out.M = std::sqrt(sq / D);
  out.o_norm = std::sqrt(on);
}

/// Throws unless exact_attend() agrees with certattn::exact_attention() on this query
/// (run on a few calls of every setting, so the fast exact path cannot drift).
template <class Rows>
inline void check_exact(const float* q, const Rows& e, std::size_t h, const exact_call& x,
                        const attention_variant& v = {}) {
  const exact_result r =
      exact_attention(std::span<const float>(q, e.d), e.key_matrix(h), e.value_matrix(h), 0.0, v);
  double diff = 0;
  for (std::size_t i = 0; i < e.d; ++i) diff = std::max(diff, std::fabs(r.output[i] - x.o[i]));
  const bool ok = diff <= 1e-9 * std::max(r.value_scale, 1e-300) && r.max_score == x.c &&
                  std::fabs(r.denominator - x.D) <= 1e-9 * r.denominator &&
                  std::fabs(r.value_scale - x.M) <= 1e-9 * r.value_scale;
  if (!ok)
    throw error("internal: the bench's exact attention differs from certattn::exact_attention (max |diff| " +
                std::to_string(diff) + ")");
}

/// ||a - b|| for a float estimate against the exact output.
template <class T>
inline double distance(const T* a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    const double t = double(a[i]) - b[i];
    s += t * t;
  }
  return std::sqrt(s);
}

/// The q-quantile by nearest rank: the smallest x with at least a fraction q of the values
/// <= x (p90 of 2000 calls is the 1800th smallest). Reorders v.
inline double quantile(std::vector<double>& v, double q) {
  if (v.empty()) return std::nan("");
  const std::size_t k = std::min(v.size() - 1, std::size_t(std::ceil(q * double(v.size()))) - (q > 0 ? 1 : 0));
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(k), v.end());
  return v[k];
}

// ---- exact binomial bounds ---------------------------------------------------------------------

/// P(X >= k) for X ~ Binomial(n, p), by the regularised incomplete beta function of the
/// test suite's statistics (tests/support/stats.hpp: one copy for the tests and the bench).
inline double binomial_upper_tail(std::size_t k, std::size_t n, double p) {
  return certattn::test::binomial_sf(k, n, p);
}

/// Clopper-Pearson one-sided upper confidence bound on a rate from k events in n trials:
/// the p at which P(X <= k) = 1 - confidence (1 when k = n; 1 - (1-conf)^(1/n) when k = 0).
inline double clopper_pearson_upper(std::size_t k, std::size_t n, double confidence = 0.95) {
  if (n == 0 || k >= n) return 1;
  const double alpha = 1 - confidence;
  if (k == 0) return 1 - std::pow(alpha, 1.0 / double(n));
  double lo = 0, hi = 1;
  for (int it = 0; it < 200; ++it) {  // P(X <= k) = 1 - P(X >= k + 1) decreases in p
    const double mid = 0.5 * (lo + hi);
    if (1 - binomial_upper_tail(k + 1, n, mid) > alpha)
      lo = mid;
    else
      hi = mid;
  }
  return hi;
}

}  // namespace certattn::bench
