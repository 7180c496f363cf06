// The certificate of one level (docs/certificate.md), tight and classic: the Chernoff
// interval of the (weighted) count, the one-sided Bernstein bound on the second moment,
// the Hilbert-space Bernstein bound on the centred numerator, beta, the lower bound on the
// value scale, and the three error scales.
// Everything here is a pure function of the level's sufficient statistics, in double,
// allocation-free: the reference and the fast path both call certify_level().
#pragma once

#include <certattn/options.hpp>
#include <certattn/value_bounds.hpp>

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
/// k need not be an integer: the same interval holds for a sum of independent variables in
/// [0, 1] (the tight certificate's weighted count, docs/certificate.md), whose MGFs are
/// dominated by Bernoullis' of the same means (convexity), hence by Poissons'.
inline count_interval chernoff_mass_interval(double k, double log_term) noexcept {
  if (!(k > 0.0)) return {0.0, log_term};
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

inline count_interval chernoff_count_interval(std::size_t count, double log_term) noexcept {
  return chernoff_mass_interval(double(count), log_term);
}

/// One-sided Bernstein upper bound on a sum X = sum_i y_i of nonnegative terms from an
/// estimate X^ whose deviations X - X^ are independent, zero-mean, at most b each, with
/// variance sum at most b X: X <= X^ + 2bL/3 + sqrt(2bL) sqrt(X), solved as a quadratic
/// in sqrt(X), L = ln(1/delta_e).
inline double second_moment_upper_range(double x_hat, double b, double log_term) noexcept {
  const double lin = std::sqrt(2.0 * b * log_term);
  const double cst = std::max(x_hat, 0.0) + 2.0 * b * log_term / 3.0;
  const double root = 0.5 * (lin + std::sqrt(lin * lin + 4.0 * cst));
  return root * root;
}

/// The matching lower bound, when X^ - X has independent zero-mean terms at most b each
/// and variance sum at most b X: X^ - X <= bL/3 + sqrt(2bLX) (one-sided Bernstein), so
/// sqrt(X) >= (-sqrt(2bL) + sqrt(2bL + 4 (X^ - bL/3))) / 2 when X^ > bL/3, else X >= 0.
inline double second_moment_lower_range(double x_hat, double b, double log_term) noexcept {
  const double lin = std::sqrt(2.0 * b * log_term);
  const double cst = x_hat - b * log_term / 3.0;
  if (!(cst > 0.0) || !std::isfinite(lin)) return 0.0;
  const double root = 0.5 * (std::sqrt(lin * lin + 4.0 * cst) - lin);
  return std::max(0.0, root * root * (1.0 - 1e-12));
}

/// One-sided Bernstein upper bound on G = sum_A w_i ||v_i - c0||^2 from its HT estimate
/// G^: G <= G^ + 2bL/3 + sqrt(2 tau R^2 L) sqrt(G), b = tau R^2, L = ln(1/delta_e);
/// solved as a quadratic in sqrt(G).
inline double second_moment_upper(double g_hat, double tau, double radius,
                                  double log_term) noexcept {
  return second_moment_upper_range(g_hat, tau * radius * radius, log_term);
}

/// Pinelis' Bernstein inequality in Hilbert space for Z = sum_A (tau X_i - w_i)(v_i - c0):
/// ||Z|| <= b L/3 + sqrt((b L/3)^2 + 2 sigma^2 L), b = tau R, sigma^2 = tau G+,
/// L = ln(2/delta_e).
inline double numerator_deviation_range(double b, double sigma2, double log_term) noexcept {
  const double b3 = b * log_term / 3.0;
  return b3 + std::sqrt(b3 * b3 + 2.0 * sigma2 * log_term);
}
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
  std::span<const double> light_sum;    // sum_{S∩A} kappa_i (v_i - g)    [head_dim]
  double light_sq = 0.0;                // sum_{S∩A} ||v_i - g||^2
  // The tight certificate's sums (sampling_design; kappa_i = 1 under plain PPS, and then
  // light_mass = light_count). rho_i is the key's reach, d_i^2 = ||v_i - g||^2.
  double light_mass = 0.0;              // sum_{S∩A} kappa_i
  double light_h = 0.0;                 // sum_{S∩A} kappa_i d_i^2 / rho_i
  double light_hw = 0.0;                // sum_{S∩A} w_i d_i^2 / rho_i
  double light_t = 0.0;                 // sum_{S∩A} kappa_i ||v_i||^2
};

/// How the tight certificate samples light keys, fixed per call before the perturbations:
/// with probability min(1, w_i / (kappa_i tau)), kappa_i = rho_bar / rho_i (value-aware),
/// or min(1, w_i / tau) with every reach equal to rho_bar (plain). Either way
/// ||v_i - g|| <= rho_i for every pool key, which is all the certificate assumes.
struct sampling_design {
  bool value_aware = false;
  float floor = 1.0f;      // the index's reach floor (value-aware)
  double rho_bar = 0.0;    // the floor (value-aware), or max_{pool} ||v_i - g|| (plain)
  double rho_max = 0.0;    // max_{pool} rho_i over finite distances (the others are read
                           // exactly: key_index::overflow_tokens())
  double center_norm = 0.0;  // ||g||

  double offset(float dist) const noexcept {
    return value_aware ? sampling_offset(dist, floor) : 0.0;
  }
  double weight(float dist) const noexcept { return value_aware ? reach_weight(dist, floor) : 1.0; }
  double reach(float dist) const noexcept { return value_aware ? key_reach(dist, floor) : rho_bar; }
};

/// The design of a call: value-aware under options::value_aware(), else plain PPS with
/// every reach at the pool's largest distance. The same function for the reference and
/// the fast path, so that both derive the same doubles.
inline sampling_design make_sampling_design(const options& opt, float floor,
                                            double pool_max_distance,
                                            std::span<const float> center) noexcept {
  sampling_design s;
  s.value_aware = opt.value_aware();
  s.floor = floor;
  s.rho_bar = s.value_aware ? double(floor) : pool_max_distance;
  s.rho_max = s.value_aware ? std::max(double(floor), pool_max_distance) : pool_max_distance;
  double g2 = 0.0;
  for (float x : center) g2 += double(x) * double(x);
  s.center_norm = std::sqrt(g2);
  return s;
}

/// x / rho for the sums d^2 / rho; 0 when rho is 0 (then d = 0 too).
inline double per_reach(double x, double rho) noexcept { return rho > 0.0 ? x / rho : 0.0; }

/// The share of delta the tight certificate spends on level j (the shares of levels 0..J
/// sum to at most 1). Without a hint, 1/(J+1) each, as the classic certificate. With a
/// hint h (the level the same head stopped at in the previous step; any level fixed before
/// this call's perturbations are drawn), 7/8 of delta goes to the 8 levels around h
/// (h-3..h+4, shifted inside 0..J) and 1/8 to the others. Valid whatever the hint: the
/// shares are fixed before the sample, and the union bound over levels needs nothing else.
inline constexpr int kHintWindow = 8;
inline constexpr double kHintShare = 7.0 / 8.0;
inline double level_delta_share(int level, int max_levels, int hint) noexcept {
  const int levels = max_levels + 1;
  if (hint < 0 || hint > max_levels || levels <= kHintWindow) return 1.0 / double(levels);
  const int first = std::clamp(hint - 3, 0, levels - kHintWindow);
  return level >= first && level < first + kHintWindow
             ? kHintShare / double(kHintWindow)
             : (1.0 - kHintShare) / double(levels - kHintWindow);
}

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
  double t_lo = 0.0;         // tight: lower bound on sum_A w_i ||v_i||^2 (value scale)
  double event_delta = 0.0;  // the failure budget of each of this level's events
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

/// Step 6, shared by both certificates: the level is certified when beta (or dD) meets
/// epsilon on the chosen scale (docs/certificate.md, event 7). Needs d_lo, dD, beta,
/// o_hat_norm and m_lo.
/// The output is returned in float: rounding o^ adds up to 2^-24 ||o^|| to its error
/// (normal range), so a level certifies on the output-norm and value scales only when beta
/// plus that margin meets epsilon (docs/certificate.md, "Rounding"). The reported beta and
/// bound are the statistical ones.
inline double output_rounding_margin(double o_hat_norm) noexcept {
  return 0x1p-24 * (1.0 + 0x1p-20) * o_hat_norm;
}

inline void apply_error_scale(level_result& r, const options& opt) noexcept {
  const double eps = opt.epsilon;
  const double margin = output_rounding_margin(r.o_hat_norm);
  switch (opt.scale) {
    case error_scale::kDenominator:
      r.scale_value = r.d_lo;
      r.bound = r.d_lo > 0.0 ? r.dD / r.d_lo : std::numeric_limits<double>::infinity();
      r.certified = r.d_lo > 0.0 && r.dD <= eps * r.d_lo;
      break;
    case error_scale::kOutputNorm:
      r.scale_value = r.o_hat_norm - r.beta;
      r.bound = relative_bound(r.beta, r.scale_value);
      r.certified = r.d_lo > 0.0 && r.beta + margin <= eps * r.scale_value;
      break;
    case error_scale::kValueScale:
      r.scale_value = r.m_lo;
      r.bound = relative_bound(r.beta, r.m_lo);
      r.certified = r.d_lo > 0.0 && r.beta + margin <= eps * r.m_lo;
      break;
  }
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
  r.event_delta = delta_e;

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
  detail::apply_error_scale(r, opt);
  return r;
}

/// The number of events per level of the tight certificate: count, second moment and
/// numerator, plus the value-scale lower bound on the value scale.
inline int tight_events(const options& opt) noexcept {
  return opt.scale == error_scale::kValueScale ? 4 : 3;
}

/// The tight certificate of one level (docs/certificate.md). The centre is the index's
/// value centre g (fixed before the call), every light summand is bounded through the
/// keys' reaches, the variance carries the finite-population factor (1 - pi_i), and on the
/// value scale the light keys' share of M is bounded from below from the sample. Writes
/// o^ into o_hat ([head_dim]). `share` is level_delta_share() of this level.
inline level_result certify_level_tight(const level_sums& s, const sampling_design& design,
                                        std::span<const float> center, const options& opt,
                                        double share, std::span<double> o_hat) noexcept {
  const std::size_t d = o_hat.size();
  const double delta_e = opt.delta * share / double(tight_events(opt));
  const double log2_term = std::log(2.0 / delta_e);
  const double log1_term = std::log(1.0 / delta_e);
  const double tau = s.tau;
  const double k = std::max(0.0, s.light_mass);
  level_result r;
  r.event_delta = delta_e;

  // 1. Denominator: the light part of D^ is tau * sum kappa_i X_i, a sum of independent
  //    terms in [0, tau]: the Chernoff interval of a [0, 1]-valued sum.
  r.d_hat = s.exact_weight + tau * k;
  const count_interval ci = chernoff_mass_interval(k, log2_term);
  r.mu_lo = ci.lo;
  r.mu_hi = ci.hi;
  r.d_lo = s.exact_weight + tau * ci.lo;
  r.d_hi = s.exact_weight + tau * ci.hi;
  r.dD = tau * std::max(k - ci.lo, ci.hi - k);

  // 2. o^ = g + (sum_E w (v - g) + tau sum kappa (v - g)) / D^, and ||o^ - g|| without
  //    cancellation (the centre of Z is g).
  const double inv_d = 1.0 / r.d_hat;
  double o_norm2_p[4] = {}, dev2_p[4] = {};
  for (std::size_t i = 0; i < d; ++i) {
    const double dv = (s.exact_num[i] + tau * s.light_sum[i]) * inv_d;
    o_hat[i] = (center.empty() ? 0.0 : double(center[i])) + dv;
    o_norm2_p[i % 4] += o_hat[i] * o_hat[i];
    dev2_p[i % 4] += dv * dv;
  }
  auto sum4 = [](const double* p) { return (p[0] + p[2]) + (p[1] + p[3]); };
  r.o_hat_norm = std::sqrt(sum4(o_norm2_p));
  r.o_dev = std::sqrt(sum4(dev2_p));

  // 3. Second moment with the finite-population factor: F = sum_A w_i (1 - pi_i) d_i^2 /
  //    rho_i, estimated by tau sum kappa d^2/rho - sum w d^2/rho over S∩A; each term's
  //    deviation is at most b = tau rho_bar, its variance at most b times its mean.
  //    The inflation covers the rounding of the d_i^2 and of rho_i's float bound.
  const double b = tau * design.rho_bar * (1.0 + 1e-12);
  r.radius = design.rho_bar;
  r.g_hat = std::max(0.0, tau * s.light_h - s.light_hw);
  r.g_plus = second_moment_upper_range(r.g_hat, b, log1_term);

  // 4. Numerator Z = sum_A (X_i / pi_i - 1) w_i (v_i - g): terms at most b long, variance
  //    sum tau rho_bar F (Pinelis' Bernstein inequality in Hilbert space).
  r.zeta = numerator_deviation_range(b, b * r.g_plus, log2_term);
  // 5. Lemma 1 with centre g.
  if (r.d_lo > 0.0) r.beta = (r.zeta + r.o_dev * r.dD) / r.d_lo;

  // 6. Error scales. On the value scale M^2 = (T_E + T_A) / D with T_A = sum_A w ||v||^2,
  //    bounded below from its HT estimate tau sum kappa ||v||^2: each term at most
  //    b_T = tau rho_bar max over rho in [rho_bar, rho_max] of (||g|| + rho)^2 / rho,
  //    attained at an end (convex in rho).
  double exact_sq = std::max(0.0, s.exact_sq);
  if (opt.scale == error_scale::kValueScale) {
    auto reach_sq = [&](double rho) {
      const double a = design.center_norm + rho;
      return a * a / rho;
    };
    const double b_t = tau * design.rho_bar *
                       std::max(reach_sq(design.rho_bar), reach_sq(design.rho_max)) *
                       (1.0 + 1e-12);
    r.t_lo = std::isfinite(b_t) && b_t > 0.0
                 ? second_moment_lower_range(tau * s.light_t, b_t, log1_term)
                 : 0.0;
    exact_sq += r.t_lo;
  }
  r.m_lo = r.d_hi > 0.0 ? std::sqrt(exact_sq / r.d_hi) : 0.0;
  detail::apply_error_scale(r, opt);
  return r;
}

/// The level's certificate under opt.certificate: certify_level() (classic; c0 is its
/// scratch) or certify_level_tight() with the level's share of delta for this hint.
inline level_result certify(const level_sums& s, const value_radius& radius,
                            const sampling_design& design, const options& opt, int level,
                            int hint, std::span<double> o_hat, std::span<double> c0) noexcept {
  if (opt.certificate == certificate_kind::kClassic)
    return certify_level(s, radius, opt, o_hat, c0);
  return certify_level_tight(s, design, radius.center, opt,
                             level_delta_share(level, opt.max_levels, hint), o_hat);
}

}  // namespace certattn
