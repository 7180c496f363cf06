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
  // s carries head_dim + 2 roundings of relative error u = 2^-53 (a difference, a square
  // and the partial sums), so ||v - center|| <= sqrt(s) (1 - u)^-(head_dim / 2 + 1); the
  // sqrt and the product round once more each. 1 + (head_dim + 8) u covers all of it.
  const double u = std::ldexp(1.0, -53);
  return round_up_to_float(std::sqrt(s) * (1.0 + double(head_dim + 8) * u));
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
/// Reorders `dists` (the key index passes its own scratch, so that a refresh within the
/// reserved size does not allocate).
inline float value_cap_from_inplace(std::vector<float>& dists) {
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
inline float value_cap_from(std::vector<float> dists) { return value_cap_from_inplace(dists); }

// Value-aware sampling (docs/certificate.md). The tight certificate samples a light key
// with probability min(1, w_i rho_i / (rho_bar tau)) instead of min(1, w_i / tau), where
// rho_i = max(rho_bar, ||v_i - g|| bound) is the key's *reach* and rho_bar its floor:
// keys whose values lie far from the centre g are sampled more, and each sampled key's
// contribution tau (rho_bar / rho_i) (v_i - g) is then at most tau rho_bar long, whatever
// the outliers. The floor is the median of the distances when the bound is fixed (half
// the keys sit on it, so the weights rho_bar / rho_i of the count bound stay near 1); a
// function of the cache only, never of the perturbations.

/// The reach floor rho_bar from the distances ||v - g||: the median of the finite ones,
/// or, when that is 0 (most values equal g), the largest finite one (uniform reach: plain
/// PPS); 0 when every finite distance is 0 (then every reach is 0 and so is the certificate's
/// bound). Distances that overflowed float belong to tokens read exactly
/// (key_index::overflow_tokens()) and do not count.
/// Reorders and shortens `dists` (in-place twin for the key index's scratch).
inline float reach_floor_from_inplace(std::vector<float>& dists) {
  dists.erase(std::remove_if(dists.begin(), dists.end(), [](float x) { return !std::isfinite(x); }),
              dists.end());
  if (dists.empty()) return 0.0f;
  const std::size_t k = dists.size() / 2;
  std::nth_element(dists.begin(), dists.begin() + std::ptrdiff_t(k), dists.end());
  const float floor = dists[k];
  return floor > 0.0f ? floor : *std::max_element(dists.begin(), dists.end());
}
inline float reach_floor_from(std::vector<float> dists) { return reach_floor_from_inplace(dists); }

/// rho_i = max(rho_bar, dist): the reach of a key with distance bound `dist`.
inline double key_reach(float dist, float floor) noexcept {
  return dist > floor ? double(dist) : double(floor);
}
/// ln(rho_i / rho_bar) >= 0, added to the key's score in every sampling test (0 at or
/// below the floor; +inf above a floor of 0 or for a distance that overflowed float: such
/// a key would be heavy at every level). One expression that the reference and the fast
/// path share.
inline double sampling_offset(float dist, float floor) noexcept {
  return dist > floor ? std::log(double(dist) / double(floor)) : 0.0;
}
/// kappa_i = rho_bar / rho_i in [0, 1]: the Horvitz-Thompson weight of a sampled light key
/// is tau kappa_i.
inline double reach_weight(float dist, float floor) noexcept {
  return dist > floor ? double(floor) / double(dist) : 1.0;
}
/// The float at or above sampling_offset() (the double that the exact tests use), for the
/// float candidate bounds. An infinite offset is stored as 2^64: the key's bound then
/// passes every level's threshold (all at most 0), as it must, and stays finite, so that
/// the candidate tests (y < +inf) and the float sums keep it.
inline constexpr float kMaxOffsetUpper = 0x1p64f;
inline float sampling_offset_upper(float dist, float floor) noexcept {
  const double x = sampling_offset(dist, floor);
  return x >= double(kMaxOffsetUpper) ? kMaxOffsetUpper : round_up_to_float(x);
}

}  // namespace certattn
