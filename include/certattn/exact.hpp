// Exact attention in double precision: the plain, obviously correct reference that every
// estimate is measured against, and the quantities the error scales are stated on.
#pragma once

#include <certattn/arch/score_dot.hpp>
#include <certattn/common.hpp>
#include <certattn/layout.hpp>
#include <certattn/variant.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace certattn {

struct exact_result {
  std::vector<double> output;  // o = N / D                                [head_dim]
  double max_score = 0.0;      // c = max_i s_i (and the sink logit z, with a sink)
  double denominator = 0.0;    // D = sum_i exp(s_i - c) (+ exp(z - c) with a sink)
  double value_scale = 0.0;    // M = sqrt(sum_i a_i ||v_i||^2), a_i = exp(s_i - c) / D
  double output_norm = 0.0;    // ||o||
};

namespace detail {
template <class T>
inline void check_finite(const T* p, std::size_t n, const char* what) {
  for (std::size_t i = 0; i < n; ++i)
    if (!std::isfinite(to_double(p[i])))
      throw error(std::string(what) + " contains a NaN or Inf (element " + std::to_string(i) +
                  ")");
}

template <class Q, class T>
inline void check_attention_inputs(std::span<const Q> q, matrix_view<T> keys,
                                   matrix_view<T> values) {
  if (keys.cols == 0) throw error("head_dim (keys.cols) must be > 0");
  if (q.size() != keys.cols)
    throw error("q has " + std::to_string(q.size()) + " elements but head_dim (keys.cols) is " +
                std::to_string(keys.cols));
  if (values.rows != keys.rows)
    throw error("values.rows (" + std::to_string(values.rows) + ") != keys.rows (" +
                std::to_string(keys.rows) + ")");
  if (values.cols == 0 || values.cols > keys.cols)
    throw error("values.cols (" + std::to_string(values.cols) + ") must lie in [1, keys.cols = " +
                std::to_string(keys.cols) + "] (fewer for a latent cache's values)");
  if (keys.rows == 0) throw error("keys: the cache is empty (0 tokens)");
  if (keys.data == nullptr || values.data == nullptr) throw error("keys/values: null data");
  check_finite(q.data(), q.size(), "q");
  for (std::size_t t = 0; t < keys.rows; ++t) {
    check_finite(keys.row(t), keys.cols, "keys");
    check_finite(values.row(t), values.cols, "values");
  }
}
}  // namespace detail

/// Scores s_i = scale * q.k_i in double (q rounded to float first: the fast path takes
/// float queries), modified by the head's variant (head_variant::score(): soft-cap, bias).
/// The dot runs in 8 fixed lanes so that the fast path's scores are the same bits (see
/// arch/score_dot.hpp).
template <class Q, cache_element T>
inline std::vector<double> exact_scores(std::span<const Q> q, matrix_view<T> keys,
                                        double softmax_scale, const head_variant& hv = {}) {
  std::vector<float> qf(q.size());
  for (std::size_t i = 0; i < q.size(); ++i) qf[i] = float(q[i]);
  std::vector<double> s(keys.rows);
  for (std::size_t t = 0; t < keys.rows; ++t) {
    s[t] = hv.score(softmax_scale * detail::score_dot(qf.data(), keys.row(t), keys.cols), t);
    // exp(s - max s) would be NaN: refuse rather than return a silent NaN.
    if (!std::isfinite(s[t]))
      throw error("scores overflow: softmax_scale * q.k is not finite in double (token " +
                  std::to_string(t) + ")");
  }
  return s;
}

/// Exact softmax attention of one query over all rows of keys/values, in double.
/// softmax_scale <= 0 means 1/sqrt(head_dim). `variant` (variant.hpp; its spans empty or
/// of one entry, this head's): soft-cap and position bias on the scores, only the tokens
/// of the sliding window, and the sink's e^{z - c} in D (a row of value 0).
template <class Q, cache_element T>
inline exact_result exact_attention(std::span<const Q> q, matrix_view<T> keys,
                                    matrix_view<T> values, double softmax_scale = 0.0,
                                    const attention_variant& variant = {}) {
  detail::check_attention_inputs(q, keys, values);
  validate(variant, 1, "variant");
  const std::size_t d = values.cols;  // the output's channels (keys.cols for the scores)
  if (!(softmax_scale > 0.0)) softmax_scale = 1.0 / std::sqrt(double(keys.cols));
  const head_variant hv = head_variant_of(variant, 0, keys.rows);
  const std::vector<double> s = exact_scores(q, keys, softmax_scale, hv);
  exact_result r;
  r.max_score = *std::max_element(s.begin() + std::ptrdiff_t(hv.first), s.end());
  if (hv.has_sink) r.max_score = std::max(r.max_score, hv.sink);
  r.output.assign(d, 0.0);
  double sq = 0.0;
  if (hv.has_sink) r.denominator = std::exp(hv.sink - r.max_score);
  for (std::size_t t = hv.first; t < keys.rows; ++t) {
    const double w = std::exp(s[t] - r.max_score);
    const T* v = values.row(t);
    double vn = 0.0;
    for (std::size_t i = 0; i < d; ++i) {
      const double x = to_double(v[i]);
      r.output[i] += w * x;
      vn += x * x;
    }
    r.denominator += w;
    sq += w * vn;
  }
  double on = 0.0;
  for (double& x : r.output) {
    x /= r.denominator;
    on += x * x;
  }
  r.output_norm = std::sqrt(on);
  r.value_scale = std::sqrt(sq / r.denominator);
  return r;
}

/// The same over a kv_view (any layout: the adapters of layout.hpp or an engine's own),
/// its rows gathered first: exact_attention(q, kv) checks a certified call on the view it
/// was given.
template <class Q, kv_view KV>
inline exact_result exact_attention(std::span<const Q> q, const KV& kv, double softmax_scale = 0.0,
                                    const attention_variant& variant = {}) {
  const dense_rows<KV> rows(kv);
  return exact_attention(q, rows.key_matrix(), rows.value_matrix(), softmax_scale, variant);
}

}  // namespace certattn
