// Bounds on the value vectors that the certificate needs without reading every value:
// R(c0) >= max_{i in pool} ||v_i - c0|| (ALGORITHM.md, step 3). The key index keeps a
// centre g and, per token, ||v_i - g|| rounded up to float.
//
// Value outliers. One value of very large norm anywhere in the pool would set R for every
// query (synthetic caches and real ones have values 30-60x the median norm), and the
// range terms tau R of the Bernstein bounds would force tiny thresholds. So tokens whose
// distance exceeds a cap (value_cap_factor times the 99th percentile of the distances)
// join the window: they form the *exact set*, read exactly at every call, and the pool
// excludes them, so R <= cap + ||g - c0||. The exact set is a function of the cache only
// (never of the perturbations), so every guarantee of ALGORITHM.md holds unchanged with
// "window" read as "window + exact set". The reference estimator computes the same
// numbers with the same functions, so both certify alike.
#pragma once

#include <certattn/common.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <vector>

namespace certattn {


/// ||v - center|| in double, rounded up to float. An empty centre is the origin.
template <cache_element T>
inline float value_distance_bound(const T* v, std::span<const float> center,
                                  std::size_t head_dim) noexcept {
  double s = 0.0;
  for (std::size_t i = 0; i < head_dim; ++i) {
    const double t = to_double(v[i]) - (center.empty() ? 0.0 : double(center[i]));
    s += t * t;
  }
  // sqrt in double is correctly rounded; the 1e-15 relative term covers the sum.
  return round_up_to_float(std::sqrt(s) * (1.0 + 1e-15));
}

/// The mean of the first `count` value rows (double accumulation, stored as float): the
/// centre g the index fixes when it is built. Any fixed centre is valid; the mean keeps
/// R small when values share a common offset, as real values do.
template <cache_element T>
inline std::vector<float> value_mean(matrix_view<T> values, std::size_t count) {
  std::vector<float> center(values.cols, 0.0f);
  if (count == 0) return center;
  std::vector<double> acc(values.cols, 0.0);
  for (std::size_t t = 0; t < count; ++t) {
    const T* row = values.row(t);
    for (std::size_t i = 0; i < values.cols; ++i) acc[i] += to_double(row[i]);
  }
  for (std::size_t i = 0; i < values.cols; ++i) center[i] = float(acc[i] / double(count));
  return center;
}

/// The cap on ||v - g|| above which a token joins the exact set: kValueCapFactor times the
/// 99th percentile of the given distances, raised if needed so that at most
/// max_exact_set(n) tokens exceed it (the exact set is read at every call); no exact set
/// for fewer than kMinTokensForCap distances, where the percentile means little.
/// The limit trades reads for R: 64 tokens, or 1/256 of the cache when that is more, so
/// that a fixed fraction of outliers (as in the synthetic caches: 0.27%) stays out of R
/// at every context length instead of making R, and the sample, grow with n.
/// The cap never exceeds FLT_MAX: a distance bound that overflowed float (+inf, values of
/// norm beyond 3.4e38) always puts its token in the exact set, whatever the limit, so that
/// R, and the certificate's beta, stay finite.
inline constexpr double kValueCapFactor = 1.5;
inline constexpr std::size_t kMinTokensForCap = 256;
inline constexpr std::size_t max_exact_set(std::size_t n) noexcept {
  return n / 256 > 64 ? n / 256 : 64;
}
inline float value_cap_from(std::vector<float> dists) {
  constexpr float kMaxCap = std::numeric_limits<float>::max();
  const std::size_t n = dists.size();
  if (n < kMinTokensForCap) return kMaxCap;
  const std::size_t k = n * 99 / 100;
  std::nth_element(dists.begin(), dists.begin() + std::ptrdiff_t(k), dists.end());
  double cap = kValueCapFactor * double(dists[k]);
  // The (limit + 1)-th largest distance: at most `limit` lie strictly above it.
  const std::size_t top = n - max_exact_set(n) - 1;
  std::nth_element(dists.begin(), dists.begin() + std::ptrdiff_t(top), dists.end());
  cap = std::max(cap, double(dists[top]));
  return std::min(round_up_to_float(cap), kMaxCap);
}

}  // namespace certattn
