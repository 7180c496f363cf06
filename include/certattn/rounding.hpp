// The rounding of the answers a call computes with exact attention (no pool, routed
// groups): a bound on each path's floating-point error, and the certificate it allows on
// every error scale (docs/certificate.md, "Rounding"). "Exact" attention computed in float
// or double is not exact: its error is of order (n / 16) 2^-24 M for the float kernel and
// n 2^-53 M in double, which on the output-norm scale can exceed epsilon ||o|| when values
// nearly cancel. An exact answer is certified only when that bound meets epsilon.
#pragma once

#include <certattn/certificate.hpp>
#include <certattn/options.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

namespace certattn {
namespace detail {
inline constexpr double kFloatUnit = 0x1p-24;   // float32 rounding: |fl(x) - x| <= u |x|
inline constexpr double kDoubleUnit = 0x1p-53;  // the same for double
/// The relative error bound of the dense kernels' float exp (avx512 and avx2: Cephes'
/// polynomial; portable and scalar: the C library's expf), with margin: the largest
/// measured is 1.5e-7 on [-87, 0] (below, weights flush toward 0: dense_kernel_eta()'s
/// underflow term). tests/test_dense.cpp checks every kernel against it.
inline constexpr double kDenseExpError = 0x1p-21;

/// Higham's gamma_k = k u / (1 - k u): the relative error of a result that went through k
/// roundings of unit u (Accuracy and Stability of Numerical Algorithms, Lemma 3.1).
inline double rounding_gamma(double k, double u) noexcept {
  const double x = k * u;
  return x < 0.5 ? x / (1.0 - x) : std::numeric_limits<double>::infinity();
}
/// (1 + g) e^e - 1: a relative error g after an exponent error e.
inline double compose_relative(double g, double e) noexcept { return g + (1.0 + g) * std::expm1(e); }
}  // namespace detail

/// The relative error eta of every term the float dense kernel (dense.hpp) sums for one
/// query: each weight it uses is w_i (1 + theta_i) and each accumulated product
/// w_i v_ij (1 + theta'_ij), |theta| <= eta, against the exact weights of the double scores.
/// score_magnitude >= scale sum_j |q_j k_ij| for every token (scale ||q||_1 max|k|).
///   exponent errors  the float score (scale rounded to float, scaled query, d products and
///                    sums: gamma_{d+2} S), the subtraction of the running maximum and of
///                    the rescale arguments (their total is at most the maximum's rise,
///                    <= 2 S: 4 u S), one exp per weight and one per rescale, at most one
///                    rescale per chunk of 16 tokens;
///   sum roundings    at most 16 inside a chunk and two per chunk carried (acc alpha + chunk,
///                    fused or not);
///   underflow        weights below e^-87 may flush to 0: 2^-120 per token against D >= 1.
inline double dense_kernel_eta(std::size_t n, std::size_t d, double score_magnitude) noexcept {
  using namespace detail;
  const double u = kFloatUnit, chunks = std::ceil(double(n) / 16.0);
  const double exponent = rounding_gamma(double(d) + 2.0, u) * score_magnitude * 1.0001 +
                          4.0001 * u * score_magnitude +
                          (chunks + 1.0) * kDenseExpError * 1.0001;
  return compose_relative(rounding_gamma(2.0 * chunks + 18.0, u), exponent) + double(n) * 0x1p-120;
}

/// The same for the double path (exact scores, the bits of exact_scores(); w = exp(s - c)
/// in double; n fused accumulations of w (v - g) or w v): the subtraction s - c
/// (|s - c| <= 2 S), exp within 2 ulp, the centring v - g, n + 2 roundings of the sums, and
/// 2^-1070 per token for underflow against D >= 1.
inline double double_path_eta(std::size_t n, double score_magnitude) noexcept {
  using namespace detail;
  const double u = kDoubleUnit;
  const double exponent = 2.0001 * u * score_magnitude + 4.0 * u;
  return compose_relative(rounding_gamma(double(n) + 4.0, u), exponent) + double(n) * 0x1p-1070;
}

/// What an exact answer's error bound is built from (docs/certificate.md, "Rounding").
struct exact_rounding {
  double eta = std::numeric_limits<double>::infinity();  // dense_kernel_eta / double_path_eta
  /// >= sum_i a_i ||v_i - g|| for the centre g the sums were taken around (g = 0 when
  /// uncentred), a_i the attention weights; +inf when unknown.
  double spread = std::numeric_limits<double>::infinity();
  double center_norm = 0.0;  // ||g||
  /// The path's estimate of the value scale M (double sums), or NaN when it computed none:
  /// then the sums must be uncentred (g = 0), where spread <= M by Jensen's inequality
  /// bounds the error relative to M without knowing M.
  double value_scale = std::numeric_limits<double>::quiet_NaN();
  std::size_t head_dim = 0;
};

/// An upper bound on M from a double path's estimate r.value_scale; it also bounds
/// sum_i a_i ||v_i|| (Jensen), the spread of uncentred sums.
inline double value_scale_upper(const exact_rounding& r) noexcept {
  return r.value_scale *
         (1.0 + 3.0 * r.eta + detail::rounding_gamma(double(r.head_dim) + 4.0, detail::kDoubleUnit)) *
         (1.0 + 0x1p-40);
}

namespace detail {
/// The certificate of an exact answer: its bound from the path's rounding, and certified
/// when that bound meets options.epsilon on options.scale. o_norm = ||o~|| of the float
/// output returned; denominator = the reported D (relative to its max_score). With
/// rho = 2 eta / (1 - eta):
///   ||o~ - o|| <= rho spread + u_d (||g|| + spread) + u_f ||o~|| + d 2^-149
/// (the sums, adding g back in double, the rounding to float and its subnormal floor), and
/// |D~ - D| <= eta D.
inline void certify_exact_answer_unclamped(const exact_rounding& r, double o_norm,
                                           double denominator, const options& opt,
                                           certificate& cert) noexcept {
  using namespace detail;
  const double inf = std::numeric_limits<double>::infinity();
  const double eta = r.eta;
  cert.certified = false;
  cert.bound = cert.beta = inf;
  cert.scale_value = 0.0;
  if (!(eta < 0.25) || !std::isfinite(o_norm)) return;
  const double rho = 2.0 * eta / (1.0 - eta) * (1.0 + 0x1p-40);
  // Sums of zero values are exactly zero: no subnormal floor.
  const double floor = r.spread > 0.0 ? double(r.head_dim) * 0x1p-149 : 0.0;
  const double beta = rho * r.spread + kDoubleUnit * (r.center_norm + r.spread) +
                      kFloatUnit * (1.0 + 0x1p-20) * o_norm + floor;
  cert.beta = std::isnan(beta) ? inf : beta;
  const bool zero = cert.beta == 0.0;  // all values zero: the output is exactly 0
  switch (opt.scale) {
    case error_scale::kDenominator: {
      cert.scale_value = denominator / (1.0 + eta);  // D_lo
      cert.bound = eta * (1.0 + eta) / (1.0 - eta);
      cert.certified = cert.scale_value > 0.0 && cert.bound <= opt.epsilon;
      return;
    }
    case error_scale::kOutputNorm: {
      cert.scale_value = o_norm - cert.beta;  // ||o|| >= ||o~|| - beta
      cert.bound = detail::relative_bound(cert.beta, cert.scale_value);
      cert.certified = zero || (cert.scale_value > 0.0 && cert.beta <= opt.epsilon * cert.scale_value);
      return;
    }
    case error_scale::kValueScale: {
      if (!std::isnan(r.value_scale)) {
        // M^2 = sum_i w_i ||v_i||^2 / D, each term within eta (and the squared norms within
        // gamma_{d+2} in double).
        const double m_lo = r.value_scale *
                            (1.0 - 2.0 * eta - rounding_gamma(double(r.head_dim) + 2.0, kDoubleUnit));
        cert.scale_value = std::max(m_lo, 0.0);
        cert.bound = detail::relative_bound(cert.beta, cert.scale_value);
        cert.certified = zero || (m_lo > 0.0 && cert.beta <= opt.epsilon * m_lo);
        return;
      }
      // Uncentred sums without M: spread <= M, and ||o~|| <= ||o|| + beta <= (1 + bound) M,
      // so beta / M <= (rho + u_d + u_f') / (1 - u_f') + floor / M, with M >= ||o|| >=
      // ||o~|| / (1 + bound) for the floor.
      const double uf = kFloatUnit * (1.0 + 0x1p-20);
      const double rel = (rho + kDoubleUnit + uf) / (1.0 - uf);
      const double m_lo = o_norm / (1.0 + rel);
      if (r.center_norm != 0.0) return;
      if (zero) {
        cert.bound = 0.0;
        cert.certified = true;
        return;
      }
      if (!(m_lo > 0.0)) return;
      cert.bound = rel + floor / m_lo;
      cert.scale_value = m_lo;
      cert.certified = cert.bound <= opt.epsilon;
      return;
    }
  }
}
}  // namespace detail

/// The certificate of an exact answer (detail::certify_exact_answer_unclamped()) with every
/// reported field finite: a head whose rounding cannot be bounded (eta >= 1/4: scores beyond 10^14, or no bound on the values) is not
/// certified and reports bound and beta DBL_MAX.
inline void certify_exact_answer(const exact_rounding& r, double o_norm, double denominator,
                                 const options& opt, certificate& cert) noexcept {
  detail::certify_exact_answer_unclamped(r, o_norm, denominator, opt, cert);
  static constexpr double big = std::numeric_limits<double>::max();
  auto clamp = [](double x) { return std::isnan(x) ? big : std::min(std::max(x, 0.0), big); };
  cert.bound = clamp(cert.bound);
  cert.beta = clamp(cert.beta);
  cert.scale_value = std::isfinite(cert.scale_value) ? std::max(cert.scale_value, 0.0) : 0.0;
}

}  // namespace certattn
