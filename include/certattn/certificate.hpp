// The certificate of one level (ALGORITHM.md, "The certificate at level j"): the Chernoff
// count interval, the one-sided Bernstein bound on the second moment G, the Hilbert-space
// Bernstein bound on the centred numerator, beta, and the three error scales.
// Everything here is a pure function of the level's sufficient statistics, in double,
// allocation-free: the reference and the fast path both call certify_level().
#pragma once

#include <certattn/options.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>

namespace certattn {

/// Interval for the mean mu of a sum k of independent Bernoullis:
/// { mu : mu h(k/mu) <= L }, h(u) = u ln u - u + 1, L = ln(2/delta_e). Valid with
/// probability >= 1 - delta_e because each Bernoulli's MGF is dominated by a Poisson's.
struct count_interval {
  double lo = 0.0;
  double hi = 0.0;
};

namespace detail {
/// f(mu) = mu h(k/mu) = k ln(k/mu) - k + mu, convex in mu, 0 at mu = k.
inline double chernoff_rate(double k, double mu) noexcept {
  // Near mu = k the direct form cancels (k ln(k/mu) against mu - k): use log1p there.
  if (mu > 0.5 * k && mu < 2.0 * k) {
    const double x = (mu - k) / k;
    return k * (x - std::log1p(x));
  }
  return k * std::log(k / mu) - k + mu;
}
}  // namespace detail

/// Newton's method on the convex rate function, started outside the root on each side:
/// the iterates approach the root monotonically from outside, so stopping early only
/// widens the interval (the bound stays valid at any iteration count).
inline count_interval chernoff_count_interval(std::size_t count, double log_term) noexcept {
  const double k = double(count);
  if (count == 0) return {0.0, log_term};
  count_interval out;
  // Upper end: f(mu) = L for mu > k. Start where f(mu) > L surely: mu = k + L + sqrt(2kL) + L.
  {
    double mu = k + 2.0 * log_term + std::sqrt(2.0 * k * log_term);
    for (int it = 0; it < 100; ++it) {
      const double f = detail::chernoff_rate(k, mu) - log_term;
      const double fp = 1.0 - k / mu;  // > 0 right of k
      const double step = f / fp;
      if (!(step > 1e-13 * mu)) break;
      mu -= step;
    }
    out.hi = mu;
  }
  // Lower end: f(mu) = L for mu < k. Two starts left of the root: at k exp(-(L + k)/k),
  // f = L + mu > L; at k - t with t = sqrt(2kL) (a hair more), f >= t^2 / (2k) >= L by
  // the series -ln(1 - t/k) >= t/k + t^2/(2k^2). The larger is closer: from it Newton
  // needs a few steps instead of 10-30 (this runs at every level of every head).
  {
    const double t = std::sqrt(2.0 * k * log_term) * (1.0 + 1e-9);
    double mu = std::max(k - t, k * std::exp(-(log_term + k) / k));
    for (int it = 0; it < 200; ++it) {
      const double f = detail::chernoff_rate(k, mu) - log_term;
      const double fp = 1.0 - k / mu;  // < 0 left of k
      const double step = -f / fp;     // moves right
      if (!(step > 1e-13 * mu)) break;
      mu += step;
    }
    out.lo = std::max(0.0, mu);
  }
  return out;
}

/// One-sided Bernstein upper bound on G = sum_A w_i ||v_i - c0||^2 from its HT estimate
/// G^: G <= G^ + 2bL/3 + sqrt(2 tau R^2 L) sqrt(G), b = tau R^2, L = ln(1/delta_e);
/// solved as a quadratic in sqrt(G).
inline double second_moment_upper(double g_hat, double tau, double radius,
                                  double log_term) noexcept {
  const double b = tau * radius * radius;
  const double lin = std::sqrt(2.0 * b * log_term);
  const double cst = std::max(g_hat, 0.0) + 2.0 * b * log_term / 3.0;
  const double root = 0.5 * (lin + std::sqrt(lin * lin + 4.0 * cst));
  return root * root;
}

/// Pinelis' Bernstein inequality in Hilbert space for Z = sum_A (tau X_i - w_i)(v_i - c0):
/// ||Z|| <= b L/3 + sqrt((b L/3)^2 + 2 sigma^2 L), b = tau R, sigma^2 = tau G+,
/// L = ln(2/delta_e).
inline double numerator_deviation(double tau, double radius, double g_plus,
                                  double log_term) noexcept {
  const double b3 = tau * radius * log_term / 3.0;
  return b3 + std::sqrt(b3 * b3 + 2.0 * tau * g_plus * log_term);
}

/// The sufficient statistics of one level. W = window, H = heavy pool keys (exact
/// weights), S∩A = light pool keys in the sample (weight tau). The vector sums are
/// deviations from the value centre g of the radius bound (value_radius::center; the
/// origin when it is empty): sums of raw values lose every digit to cancellation when the
/// values share an offset far larger than their spread (a fuzzer found bf16 values near
/// -1e38, equal in most channels, whose certificates then differed between two summation
/// orders).
struct level_sums {
  double tau = 1.0;
  double exact_weight = 0.0;            // D_W + D_H
  std::span<const double> exact_num;    // sum_{W ∪ H} w_i (v_i - g)      [head_dim]
  double exact_sq = 0.0;                // sum_{W ∪ H} w_i ||v_i||^2
  std::size_t light_count = 0;          // k = |S ∩ A|
  std::span<const double> light_sum;    // sum_{S∩A} (v_i - g)            [head_dim]
  double light_sq = 0.0;                // sum_{S∩A} ||v_i - g||^2
};

/// R(c0) = base + ||center - c0|| >= max_{i in pool} ||v_i - c0|| by the triangle
/// inequality, when base >= max_{i in pool} ||v_i - center|| (kept by the key index).
struct value_radius {
  double base = 0.0;
  std::span<const float> center;        // [head_dim]; empty means the origin
  /// R(c0) from ||c0 - center||^2 computed by the caller (certify_level() has c0 - g
  /// directly, without the cancellation of subtracting two nearby large vectors).
  double at_distance_squared(double dist2) const noexcept {
    // The relative inflation covers the rounding of this sum and of the square root.
    return (base + std::sqrt(dist2)) * (1.0 + 1e-12);
  }
  double center_at(std::size_t i) const noexcept {
    return center.empty() ? 0.0 : double(center[i]);
  }
};

/// Everything certify_level() derives; the trace records it per level.
struct level_result {
  double d_hat = 0.0, mu_lo = 0.0, mu_hi = 0.0, dD = 0.0, d_lo = 0.0, d_hi = 0.0;
  double g_hat = 0.0, g_plus = 0.0, radius = 0.0, zeta = 0.0, o_dev = 0.0;
  double beta = std::numeric_limits<double>::infinity();
  double o_hat_norm = 0.0, m_lo = 0.0;
  double scale_value = 0.0;  // D_lo, ||o^|| - beta, or M_lo
  double bound = std::numeric_limits<double>::infinity();  // relative error bound
  bool certified = false;
};

namespace detail {
/// beta / scale; a zero bound on a zero scale (all values zero: o^ = o exactly) is 0, not
/// 0/0 or +inf, so that a certified level never reports a non-finite bound.
inline double relative_bound(double beta, double scale) noexcept {
  if (scale > 0.0) return beta / scale;
  return beta == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
}
}  // namespace detail

/// Certificate of one level. Writes o^ = N^/D^ into o_hat and uses c0 as scratch (both
/// [head_dim]). Does not allocate.
inline level_result certify_level(const level_sums& s, const value_radius& radius,
                                  const options& opt, std::span<double> o_hat,
                                  std::span<double> c0) noexcept {
  const std::size_t d = o_hat.size();
  const double delta_e = opt.event_delta();
  const double log2_term = std::log(2.0 / delta_e);
  const double log1_term = std::log(1.0 / delta_e);
  const double tau = s.tau;
  const double k = double(s.light_count);
  level_result r;

  // 1. Count interval and the denominator.
  r.d_hat = s.exact_weight + tau * k;
  const count_interval ci = chernoff_count_interval(s.light_count, log2_term);
  r.mu_lo = ci.lo;
  r.mu_hi = ci.hi;
  r.d_lo = s.exact_weight + tau * ci.lo;
  r.d_hi = s.exact_weight + tau * ci.hi;
  r.dD = tau * std::max(k - ci.lo, ci.hi - k);

  // 2. Centre from the exact part only (never from the sample), and o^.
  // Called at every level of every head: multiplications by the reciprocals instead of
  // 2d divisions, and 4 interleaved partial sums instead of one long dependency chain
  // per sum (the order is fixed, so every path still gets the same bits).
  // The sums are deviations from g (level_sums): dc = c0 - g and dv = o^ - g come
  // without cancellation, and c0, o^ themselves only at the end.
  const double inv_w = 1.0 / s.exact_weight, inv_d = 1.0 / r.d_hat;
  double o_norm2_p[4] = {}, dev2_p[4] = {}, c0_dot_p[4] = {}, c0_norm2_p[4] = {};
  for (std::size_t i = 0; i < d; ++i) {
    const double dc = s.exact_num[i] * inv_w;
    const double dv = (s.exact_num[i] + tau * s.light_sum[i]) * inv_d;
    const double g = radius.center_at(i);
    c0[i] = g + dc;
    o_hat[i] = g + dv;
    o_norm2_p[i % 4] += o_hat[i] * o_hat[i];
    const double t = dv - dc;
    dev2_p[i % 4] += t * t;
    c0_dot_p[i % 4] += dc * s.light_sum[i];
    c0_norm2_p[i % 4] += dc * dc;
  }
  auto sum4 = [](const double* p) { return (p[0] + p[2]) + (p[1] + p[3]); };
  const double o_norm2 = sum4(o_norm2_p), dev2 = sum4(dev2_p), c0_dot_sum = sum4(c0_dot_p),
               c0_norm2 = sum4(c0_norm2_p);
  r.o_hat_norm = std::sqrt(o_norm2);
  r.o_dev = std::sqrt(dev2);

  // 3. Second moment: G^ = tau sum_{S∩A} ||v_i - c0||^2, expanded around g so that the
  //    fast path can accumulate sum (v - g) and sum ||v - g||^2 before c0 is known:
  //    ||v - c0||^2 = ||v - g||^2 - 2 (c0 - g).(v - g) + ||c0 - g||^2.
  r.g_hat = std::max(0.0, tau * (s.light_sq - 2.0 * c0_dot_sum + k * c0_norm2));
  r.radius = radius.at_distance_squared(c0_norm2);
  r.g_plus = second_moment_upper(r.g_hat, tau, r.radius, log1_term);

  // 4. Numerator deviation and 5. the output bound (Lemma 1).
  r.zeta = numerator_deviation(tau, r.radius, r.g_plus, log2_term);
  if (r.d_lo > 0.0) r.beta = (r.zeta + r.o_dev * r.dD) / r.d_lo;

  // 6. Error scales.
  r.m_lo = r.d_hi > 0.0 ? std::sqrt(std::max(0.0, s.exact_sq) / r.d_hi) : 0.0;
  const double eps = opt.epsilon;
  switch (opt.scale) {
    case error_scale::kDenominator:
      r.scale_value = r.d_lo;
      r.bound = r.d_lo > 0.0 ? r.dD / r.d_lo : std::numeric_limits<double>::infinity();
      r.certified = r.d_lo > 0.0 && r.dD <= eps * r.d_lo;
      break;
    case error_scale::kOutputNorm:
      r.scale_value = r.o_hat_norm - r.beta;
      r.bound = detail::relative_bound(r.beta, r.scale_value);
      r.certified = r.d_lo > 0.0 && r.beta <= eps * r.scale_value;
      break;
    case error_scale::kValueScale:
      r.scale_value = r.m_lo;
      r.bound = detail::relative_bound(r.beta, r.m_lo);
      r.certified = r.d_lo > 0.0 && r.beta <= eps * r.m_lo;
      break;
  }
  return r;
}

}  // namespace certattn
