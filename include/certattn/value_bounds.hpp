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

/// The float nearest above x (x itself when representable): a float that bounds x.
inline float round_up_to_float(double x) noexcept {
  float f = static_cast<float>(x);
  if (static_cast<double>(f) < x) f = std::nextafter(f, std::numeric_limits<float>::infinity());
  return f;
}

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

/// The cap on ||v - g|| above which a token joins the exact set: value_cap_factor times the
/// 99th percentile of the given distances; +inf (no exact set) for fewer than
/// kMinTokensForCap distances, where the percentile means little.
inline constexpr double kValueCapFactor = 1.5;
inline constexpr std::size_t kMinTokensForCap = 256;
inline float value_cap_from(std::vector<float> dists) {
  if (dists.size() < kMinTokensForCap) return std::numeric_limits<float>::infinity();
  const std::size_t k = dists.size() * 99 / 100;
  std::nth_element(dists.begin(), dists.begin() + std::ptrdiff_t(k), dists.end());
  return round_up_to_float(kValueCapFactor * double(dists[k]));
}

}  // namespace certattn
