// Small, dependency-free statistics for the test suite and the bench's exact binomial
// bounds (bench/eval_common.hpp): chi-square, Kolmogorov–Smirnov and binomial tails, exact
// Poisson-binomial distributions, quantiles. Everything in double,
// written from the textbook formulas (Numerical Recipes' incomplete gamma / beta by series
// and continued fractions), accurate to ~1e-10 relative where the tests use them.
//
// Every statistical test in this suite runs with fixed seeds, so a given build either passes
// or fails deterministically; the "false-failure probability" stated next to each test is
// the probability, over the choice of seed, that a correct implementation fails it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <stdexcept>
#include <vector>

namespace certattn::test {

// ------------------------------------------------------------------ incomplete gamma

namespace detail {
inline double gamma_p_series(double a, double x) {
  double sum = 1.0 / a, term = sum, ap = a;
  for (int n = 0; n < 100000; ++n) {
    ap += 1.0;
    term *= x / ap;
    sum += term;
    if (std::abs(term) < std::abs(sum) * 1e-16) break;
  }
  return sum * std::exp(-x + a * std::log(x) - std::lgamma(a));
}
inline double gamma_q_fraction(double a, double x) {
  // Modified Lentz for the continued fraction of Q(a, x).
  const double tiny = 1e-300;
  double b = x + 1.0 - a, c = 1.0 / tiny, d = 1.0 / b, h = d;
  for (int i = 1; i < 100000; ++i) {
    const double an = -double(i) * (double(i) - a);
    b += 2.0;
    d = an * d + b;
    if (std::abs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::abs(c) < tiny) c = tiny;
    d = 1.0 / d;
    const double del = d * c;
    h *= del;
    if (std::abs(del - 1.0) < 1e-16) break;
  }
  return std::exp(-x + a * std::log(x) - std::lgamma(a)) * h;
}
}  // namespace detail

/// Regularized upper incomplete gamma Q(a, x) = Gamma(a, x) / Gamma(a).
inline double gamma_q(double a, double x) {
  if (x <= 0.0) return 1.0;
  if (x < a + 1.0) return 1.0 - detail::gamma_p_series(a, x);
  return detail::gamma_q_fraction(a, x);
}

/// P(chi^2_dof >= x).
inline double chi_square_sf(double x, double dof) { return gamma_q(0.5 * dof, 0.5 * x); }

/// Pearson's statistic sum (obs - exp)^2 / exp over bins with exp > 0.
inline double chi_square_statistic(std::span<const double> observed,
                                   std::span<const double> expected) {
  double x = 0.0;
  for (std::size_t i = 0; i < observed.size(); ++i)
    if (expected[i] > 0.0) x += (observed[i] - expected[i]) * (observed[i] - expected[i]) / expected[i];
  return x;
}

/// Goodness of fit of counts to equal bins: p-value of Pearson's statistic, dof = bins - 1.
inline double chi_square_uniform_pvalue(std::span<const std::uint64_t> counts) {
  double total = 0.0;
  for (auto c : counts) total += double(c);
  const double e = total / double(counts.size());
  double x = 0.0;
  for (auto c : counts) x += (double(c) - e) * (double(c) - e) / e;
  return chi_square_sf(x, double(counts.size() - 1));
}

// ------------------------------------------------------------------ normal

inline double normal_sf(double z) { return 0.5 * std::erfc(z / std::sqrt(2.0)); }

// ------------------------------------------------------------------ Kolmogorov–Smirnov

/// Q_KS(lambda) = 2 sum_{k>=1} (-1)^(k-1) exp(-2 k^2 lambda^2).
inline double kolmogorov_sf(double lambda) {
  if (lambda < 0.2) return 1.0;
  double sum = 0.0, sign = 1.0;
  for (int k = 1; k <= 200; ++k) {
    const double t = sign * std::exp(-2.0 * double(k) * double(k) * lambda * lambda);
    sum += t;
    if (std::abs(t) < 1e-17) break;
    sign = -sign;
  }
  return std::clamp(2.0 * sum, 0.0, 1.0);
}

/// One-sample KS statistic sup |F_n - F| of samples against a continuous CDF.
template <class Cdf>
inline double ks_statistic(std::vector<double> x, Cdf cdf) {
  std::sort(x.begin(), x.end());
  const double n = double(x.size());
  double d = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double f = cdf(x[i]);
    d = std::max({d, double(i + 1) / n - f, f - double(i) / n});
  }
  return d;
}

/// Asymptotic p-value of the KS statistic with Stephens' small-sample correction.
inline double ks_pvalue(double d, std::size_t n) {
  const double sn = std::sqrt(double(n));
  return kolmogorov_sf((sn + 0.12 + 0.11 / sn) * d);
}

// ------------------------------------------------------------------ incomplete beta, binomial

namespace detail {
inline double beta_fraction(double a, double b, double x) {
  const double tiny = 1e-300;
  const double qab = a + b, qap = a + 1.0, qam = a - 1.0;
  double c = 1.0, d = 1.0 - qab * x / qap;
  if (std::abs(d) < tiny) d = tiny;
  d = 1.0 / d;
  double h = d;
  for (int m = 1; m < 100000; ++m) {
    const double m2 = 2.0 * m;
    double aa = m * (b - m) * x / ((qam + m2) * (a + m2));
    d = 1.0 + aa * d;
    if (std::abs(d) < tiny) d = tiny;
    c = 1.0 + aa / c;
    if (std::abs(c) < tiny) c = tiny;
    d = 1.0 / d;
    h *= d * c;
    aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
    d = 1.0 + aa * d;
    if (std::abs(d) < tiny) d = tiny;
    c = 1.0 + aa / c;
    if (std::abs(c) < tiny) c = tiny;
    d = 1.0 / d;
    const double del = d * c;
    h *= del;
    if (std::abs(del - 1.0) < 1e-16) break;
  }
  return h;
}
}  // namespace detail

/// Regularized incomplete beta I_x(a, b).
inline double beta_inc(double a, double b, double x) {
  if (x <= 0.0) return 0.0;
  if (x >= 1.0) return 1.0;
  const double lbt = std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) +
                     b * std::log1p(-x);
  if (x < (a + 1.0) / (a + b + 2.0)) return std::exp(lbt) * detail::beta_fraction(a, b, x) / a;
  return 1.0 - std::exp(lbt) * detail::beta_fraction(b, a, 1.0 - x) / b;
}

/// P(X >= k) for X ~ Binomial(n, p).
inline double binomial_sf(std::size_t k, std::size_t n, double p) {
  if (k == 0) return 1.0;
  if (k > n) return 0.0;
  return beta_inc(double(k), double(n - k + 1), p);
}

/// The smallest c with P(X > c) <= alpha, X ~ Binomial(n, p): a count of "violations" above
/// c rejects "rate <= p" at level alpha (one-sided binomial test).
inline std::size_t binomial_upper_critical(std::size_t n, double p, double alpha) {
  std::size_t lo = 0, hi = n;  // answer in [lo, hi]
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (binomial_sf(mid + 1, n, p) <= alpha) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

/// Exact distribution of a sum of independent Bernoulli(p_i) (Poisson-binomial), by DP.
inline std::vector<double> poisson_binomial_pmf(std::span<const double> p) {
  std::vector<double> f(p.size() + 1, 0.0);
  f[0] = 1.0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    for (std::size_t k = i + 1; k >= 1; --k) f[k] = f[k] * (1.0 - p[i]) + f[k - 1] * p[i];
    f[0] *= 1.0 - p[i];
  }
  return f;
}

/// Poisson(mu) pmf for k = 0..kmax.
inline std::vector<double> poisson_pmf(double mu, std::size_t kmax) {
  std::vector<double> f(kmax + 1);
  for (std::size_t k = 0; k <= kmax; ++k)
    f[k] = std::exp(double(k) * std::log(mu) - mu - std::lgamma(double(k) + 1.0));
  return f;
}

// ------------------------------------------------------------------ descriptive

/// Empirical quantile (nearest rank, q in [0, 1]); 0 for an empty sample.
inline double quantile(std::vector<double> x, double q) {
  if (x.empty()) return 0.0;
  std::sort(x.begin(), x.end());
  const std::size_t i = std::min(x.size() - 1, std::size_t(std::ceil(q * double(x.size()))) -
                                                   (q > 0.0 ? 1 : 0));
  return x[i];
}

inline double max_of(const std::vector<double>& x) {
  return x.empty() ? 0.0 : *std::max_element(x.begin(), x.end());
}

/// Pearson correlation.
inline double correlation(std::span<const double> x, std::span<const double> y) {
  const double n = double(x.size());
  const double mx = std::accumulate(x.begin(), x.end(), 0.0) / n;
  const double my = std::accumulate(y.begin(), y.end(), 0.0) / n;
  double sxy = 0.0, sxx = 0.0, syy = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) * (x[i] - mx);
    syy += (y[i] - my) * (y[i] - my);
  }
  return sxy / std::sqrt(sxx * syy);
}

/// A small deterministic generator for test data (SplitMix64), independent of the library's
/// perturbation hash so that test data never correlates with the noise under test.
struct rng {
  std::uint64_t s;
  explicit rng(std::uint64_t seed) : s(seed ^ 0x5851f42d4c957f2dULL) {}
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double uniform() { return (double(next() >> 11) + 0.5) * 0x1p-53; }  // (0, 1)
  double normal() {
    const double u1 = uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  bool bernoulli(double p) { return uniform() < p; }
};

}  // namespace certattn::test
