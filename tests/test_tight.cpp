// The tight certificate (docs/certificate.md), inequality by inequality and as a whole:
//
//  * level_delta_share(): the shares of levels 0..J sum to at most 1 for every hint;
//  * chernoff_mass_interval(): coverage for sums of independent kappa_i X_i, kappa_i in
//    (0, 1] (the weighted count of value-aware sampling), and agreement with the integer
//    interval where the mass is an integer;
//  * second_moment_lower_range(): the lower bound solves its quadratic;
//  * certify_level_tight(): every derived quantity against an independent implementation
//    of the formulas from the raw sampled vectors (catches a dropped term, a wrong
//    finite-population factor or a centre taken from the sample);
//  * coverage of every event under value-aware Poisson sampling, each at its own budget:
//    the denominator interval, F <= F+, ||Z|| <= zeta, T_lo <= T_A, and of beta and M_lo.
//
// Coverage assertions are one-sided binomial tests at level 1e-6 (fewer than 40 of them:
// a correct implementation fails this file with probability < 4e-5 over the fixed seeds).
// Power: at delta = 0.6 the count interval is missed in some trials, and taking the
// estimate F^ for its upper bound F+ makes about half the trials miss F (checked by
// breaking the code once). Bernstein's slack hides smaller errors from the coverage
// checks (a range b 4x too small still covers at 0.15); the comparison with the
// independent implementation catches those.
#include <certattn/certificate.hpp>
#include <certattn/value_bounds.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "support/stats.hpp"

namespace {

using namespace certattn;
namespace st = certattn::test;

constexpr double kAlpha = 1e-6;

// ---------------------------------------------------------------- the share of delta

TEST(LevelDeltaShare, SumsToAtMostOneForEveryHint) {
  for (int J : {0, 3, 7, 8, 9, 32, 100}) {
    for (int hint = -2; hint <= J + 2; ++hint) {
      double sum = 0.0, lo = 1.0;
      for (int j = 0; j <= J; ++j) {
        const double s = level_delta_share(j, J, hint);
        ASSERT_GT(s, 0.0) << "J " << J << " hint " << hint << " level " << j;
        sum += s;
        lo = std::min(lo, s);
      }
      EXPECT_LE(sum, 1.0 + 1e-12) << "J " << J << " hint " << hint;
      EXPECT_GE(sum, 1.0 - 1e-12) << "J " << J << " hint " << hint;  // nothing wasted
      if (hint < 0 || hint > J) {
        EXPECT_DOUBLE_EQ(lo, 1.0 / (J + 1));
      }
    }
  }
  // With a hint, the hinted level gets more than the uniform share.
  EXPECT_GT(level_delta_share(20, 32, 20), 1.0 / 33.0);
  EXPECT_LT(level_delta_share(0, 32, 20), 1.0 / 33.0);
}

// ---------------------------------------------------------------- weighted count interval

TEST(ChernoffMass, EqualsTheCountIntervalOnIntegers) {
  for (std::size_t k : {0u, 1u, 2u, 7u, 100u, 12345u})
    for (double L : {0.5, 3.0, 9.0}) {
      const count_interval a = chernoff_count_interval(k, L);
      const count_interval b = chernoff_mass_interval(double(k), L);
      EXPECT_EQ(a.lo, b.lo);
      EXPECT_EQ(a.hi, b.hi);
    }
}

TEST(ChernoffMass, CoverageForWeightedBernoulliSums) {
  // Y = sum kappa_i X_i, X_i ~ Bernoulli(p_i): mu = E Y must lie in the interval of Y with
  // probability >= 1 - delta_e; three weight profiles, including tiny weights (where a
  // Poisson bound in units of 1 is loosest) and weights at 1 (the integer case).
  const double delta_e = 0.2, L = std::log(2.0 / delta_e);
  const std::size_t trials = 40000;
  std::size_t total_miss = 0;
  for (int profile = 0; profile < 3; ++profile) {
    st::rng g(900 + profile);
    std::vector<double> kappa(400), p(400);
    double mu = 0.0;
    for (std::size_t i = 0; i < kappa.size(); ++i) {
      kappa[i] = profile == 0 ? 1.0 : profile == 1 ? 0.3 + 0.7 * g.uniform() : 0.02 * g.uniform();
      p[i] = 0.05 * g.uniform();
      mu += kappa[i] * p[i];
    }
    std::size_t miss = 0;
    for (std::size_t t = 0; t < trials; ++t) {
      double y = 0.0;
      for (std::size_t i = 0; i < kappa.size(); ++i) y += g.uniform() < p[i] ? kappa[i] : 0.0;
      const count_interval ci = chernoff_mass_interval(y, L);
      miss += !(ci.lo <= mu && mu <= ci.hi);
    }
    std::printf("weighted count, profile %d: mu %.3f miss %.4f (budget %.2f)\n", profile, mu,
                double(miss) / trials, delta_e);
    EXPECT_LE(miss, st::binomial_upper_critical(trials, delta_e, kAlpha)) << profile;
    total_miss += miss;
  }
  EXPECT_GT(total_miss, 0u);  // not vacuous
}

TEST(SecondMomentLower, SolvesItsQuadratic) {
  for (double b : {1e-3, 0.5, 7.0})
    for (double L : {1.0, 6.0})
      for (double x_hat : {0.0, 0.1, 3.0, 1e3}) {
        const double lo = second_moment_lower_range(x_hat, b, L);
        ASSERT_GE(lo, 0.0);
        if (lo == 0.0) {
          EXPECT_LE(x_hat, b * L / 3.0 + 1e-12);
          continue;
        }
        // X^ - X = bL/3 + sqrt(2 b L X) at the root (up to the relative margin).
        const double gap = x_hat - lo - b * L / 3.0 - std::sqrt(2.0 * b * L * lo);
        EXPECT_GE(gap, -1e-9 * x_hat);
        EXPECT_LE(gap, 1e-9 * x_hat + 1e-300);
      }
}

// ---------------------------------------------------------------- certify_level_tight

// One level: exact keys (window + heavy), light pool keys (weight, value), tau. Light
// weights are below kappa_i tau, so that every light key has inclusion probability < 1.
struct tight_case {
  std::string name;
  std::size_t d = 4;
  double tau = 1.0 / 32.0;
  std::vector<double> exact_w;
  std::vector<std::vector<double>> exact_v;
  std::vector<double> light_w;
  std::vector<std::vector<double>> light_v;
  // The design, as the key index would keep it.
  std::vector<float> center;
  std::vector<float> dist;
  float floor = 1.0f;
  double rho_max = 0.0;
  std::vector<double> kappa, rho, pi;
};

void fix_design(tight_case& c) {
  std::vector<double> mean(c.d, 0.0);
  for (const auto& v : c.light_v)
    for (std::size_t i = 0; i < c.d; ++i) mean[i] += v[i] / double(c.light_v.size());
  c.center.assign(mean.begin(), mean.end());
  for (const auto& v : c.light_v) c.dist.push_back(value_distance_bound(v.data(), c.center, c.d));
  c.floor = reach_floor_from(c.dist);
  for (float x : c.dist) c.rho_max = std::max(c.rho_max, double(x));
  for (float x : c.dist) {
    c.kappa.push_back(reach_weight(x, c.floor));
    c.rho.push_back(key_reach(x, c.floor));
  }
}

// Light weights from their fraction u of kappa tau (u < 1: light).
void set_light_weights(tight_case& c, const std::vector<double>& u) {
  c.light_w.clear();
  c.pi.clear();
  for (std::size_t i = 0; i < u.size(); ++i) {
    c.light_w.push_back(u[i] * c.kappa[i] * c.tau);
    c.pi.push_back(c.light_w[i] / (c.kappa[i] * c.tau));
  }
}

tight_case make_tight_case(const std::string& name, std::uint64_t seed) {
  st::rng g(seed);
  tight_case c;
  c.name = name;
  auto vec = [&](double offset, double spread) {
    std::vector<double> v(c.d);
    for (auto& x : v) x = offset + spread * g.normal();
    return v;
  };
  std::vector<double> u;
  if (name == "constant pool, distant window") {
    c.exact_w = {1.0, 0.5};
    c.exact_v = {{0.0, 1.0, 0.0, 0.0}, {0.0, 1.0, 0.0, 0.0}};
    for (int i = 0; i < 400; ++i) c.light_v.push_back({10.0, 0.0, 0.0, 0.0});
    u.assign(400, 0.05);
  } else if (name == "value outliers with large weights") {
    c.exact_w = {1.0, 0.8};
    c.exact_v = {vec(0.0, 1.0), vec(0.0, 1.0)};
    for (int i = 0; i < 600; ++i) {
      c.light_v.push_back(i < 6 ? vec(0.0, 200.0) : vec(0.0, 1.0));
      u.push_back(i < 6 ? 0.9 : 0.02 * g.uniform());
    }
  } else if (name == "single dominant key") {
    c.exact_w = {1.0};
    c.exact_v = {vec(3.0, 1.0)};
    c.tau = 1.0 / 64.0;
    for (int i = 0; i < 2000; ++i) {
      c.light_v.push_back(vec(-1.0, 1.0));
      u.push_back(0.01 * g.uniform());
    }
  } else if (name == "ties just below kappa tau") {
    c.exact_w = {1.0, 0.3};
    c.exact_v = {vec(0.0, 1.0), vec(0.0, 1.0)};
    for (int i = 0; i < 80; ++i) {
      c.light_v.push_back(vec(2.0, 1.0));
      u.push_back(std::nextafter(1.0, 0.0));
    }
    for (int i = 0; i < 500; ++i) {
      c.light_v.push_back(vec(-2.0, 1.0));
      u.push_back(0.01);
    }
  } else {  // generic: spread norms, so that the reaches differ
    c.d = 16;
    c.exact_w = {1.0, 0.2, 0.1, 0.05};
    for (int i = 0; i < 4; ++i) c.exact_v.push_back(vec(0.5, 1.0));
    for (int i = 0; i < 1500; ++i) {
      c.light_v.push_back(vec(0.5, i % 10 == 0 ? 4.0 : 1.0));
      u.push_back(std::exp(-6.0 * g.uniform()));
    }
  }
  fix_design(c);
  set_light_weights(c, u);
  return c;
}

const std::vector<std::string> kTightCases = {
    "constant pool, distant window", "value outliers with large weights", "single dominant key",
    "ties just below kappa tau", "generic"};

sampling_design design_of(const tight_case& c, const options& opt) {
  return make_sampling_design(opt, c.floor, c.rho_max, c.center);
}

double sq_norm(const std::vector<double>& v) {
  double a = 0.0;
  for (double x : v) a += x * x;
  return a;
}
double sq_dist(const std::vector<double>& v, const std::vector<float>& g) {
  double a = 0.0;
  for (std::size_t i = 0; i < v.size(); ++i) a += (v[i] - double(g[i])) * (v[i] - double(g[i]));
  return a;
}

// level_sums of a sample, as the reference builds them.
struct tight_stats {
  std::vector<double> exact_num, light_sum;
  level_sums s;
};
tight_stats make_tight_stats(const tight_case& c, const std::vector<std::size_t>& sampled) {
  tight_stats t;
  t.exact_num.assign(c.d, 0.0);
  t.light_sum.assign(c.d, 0.0);
  t.s.tau = c.tau;
  for (std::size_t j = 0; j < c.exact_w.size(); ++j) {
    t.s.exact_weight += c.exact_w[j];
    t.s.exact_sq += c.exact_w[j] * sq_norm(c.exact_v[j]);
    for (std::size_t i = 0; i < c.d; ++i)
      t.exact_num[i] += c.exact_w[j] * (c.exact_v[j][i] - double(c.center[i]));
  }
  for (std::size_t j : sampled) {
    const double dsq = sq_dist(c.light_v[j], c.center);
    ++t.s.light_count;
    t.s.light_sq += dsq;
    t.s.light_mass += c.kappa[j];
    t.s.light_h += c.kappa[j] * per_reach(dsq, c.rho[j]);
    t.s.light_hw += c.light_w[j] * per_reach(dsq, c.rho[j]);
    t.s.light_t += c.kappa[j] * sq_norm(c.light_v[j]);
    for (std::size_t i = 0; i < c.d; ++i)
      t.light_sum[i] += c.kappa[j] * (c.light_v[j][i] - double(c.center[i]));
  }
  t.s.exact_num = t.exact_num;
  t.s.light_sum = t.light_sum;
  return t;
}

// ---- independent implementation from the raw vectors (docs/certificate.md, each event).

double rate(double k, double mu) {  // mu h(k/mu), long double
  if (k == 0.0) return mu;
  const long double kl = k, m = mu;
  return double(kl * std::log(kl / m) - kl + m);
}
double bisect(double k, double L, double lo, double hi) {
  const bool increasing = lo >= k;
  for (int it = 0; it < 400; ++it) {
    const double mid = 0.5 * (lo + hi);
    if ((rate(k, mid) - L > 0.0) == increasing) hi = mid;
    else lo = mid;
  }
  return 0.5 * (lo + hi);
}

struct my_tight {
  double d_hat, mu_lo, mu_hi, dD, d_lo, d_hi, f_hat, f_plus, zeta, o_dev, beta, t_lo, m_lo;
  std::vector<double> o_hat;
};

my_tight my_certify_tight(const tight_case& c, const std::vector<std::size_t>& sampled,
                          double delta_e) {
  my_tight r{};
  const double tau = c.tau, rb = double(c.floor);
  const double L2 = std::log(2.0 / delta_e), L1 = std::log(1.0 / delta_e);
  double de = 0.0, k = 0.0, te = 0.0;
  std::vector<double> ne(c.d, 0.0), nl(c.d, 0.0);
  for (std::size_t j = 0; j < c.exact_w.size(); ++j) {
    de += c.exact_w[j];
    te += c.exact_w[j] * sq_norm(c.exact_v[j]);
    for (std::size_t i = 0; i < c.d; ++i) ne[i] += c.exact_w[j] * c.exact_v[j][i];
  }
  double f_hat = 0.0, t_hat = 0.0;
  for (std::size_t j : sampled) {
    const double ht = c.light_w[j] / c.pi[j];  // the HT weight, tau kappa
    k += ht / tau;
    for (std::size_t i = 0; i < c.d; ++i) nl[i] += ht * c.light_v[j][i];
    // rho = 0 only when every distance is 0 (then the term is 0).
    if (c.rho[j] > 0.0) f_hat += ht * (1.0 - c.pi[j]) * sq_dist(c.light_v[j], c.center) / c.rho[j];
    t_hat += ht * sq_norm(c.light_v[j]);
  }
  r.d_hat = de + tau * k;
  r.mu_lo = k == 0.0 ? 0.0 : bisect(k, L2, 0.0, k);
  r.mu_hi = k == 0.0 ? L2 : bisect(k, L2, k, k + 10.0 * L2 + 10.0 * std::sqrt(k * L2) + 10.0);
  r.d_lo = de + tau * r.mu_lo;
  r.d_hi = de + tau * r.mu_hi;
  r.dD = tau * std::max(k - r.mu_lo, r.mu_hi - k);
  r.o_hat.resize(c.d);
  double dev = 0.0, gn = 0.0;
  for (std::size_t i = 0; i < c.d; ++i) {
    r.o_hat[i] = (ne[i] + nl[i]) / r.d_hat;
    dev += (r.o_hat[i] - c.center[i]) * (r.o_hat[i] - c.center[i]);
    gn += double(c.center[i]) * double(c.center[i]);
  }
  r.o_dev = std::sqrt(dev);
  r.f_hat = f_hat;
  const double b = tau * rb;
  const double p = std::sqrt(2.0 * b * L1), q = f_hat + 2.0 * b * L1 / 3.0;
  const double x = (p + std::sqrt(p * p + 4.0 * q)) / 2.0;
  r.f_plus = x * x;
  const double b3 = b * L2 / 3.0;
  r.zeta = b3 + std::sqrt(b3 * b3 + 2.0 * b * r.f_plus * L2);
  r.beta = (r.zeta + r.o_dev * r.dD) / r.d_lo;
  auto f = [&](double rho) { return (std::sqrt(gn) + rho) * (std::sqrt(gn) + rho) / rho; };
  const double bt = tau * rb * std::max(f(rb), f(std::max(rb, c.rho_max)));
  const double pt = std::sqrt(2.0 * bt * L1), qt = t_hat - bt * L1 / 3.0;
  // A floor of 0 (every distance 0) leaves no finite range: no lower bound on T_A.
  const double y = qt > 0.0 && std::isfinite(bt) ? (std::sqrt(pt * pt + 4.0 * qt) - pt) / 2.0 : 0.0;
  r.t_lo = y * y;
  r.m_lo = std::sqrt((te + r.t_lo) / r.d_hi);
  return r;
}

void expect_rel(double got, double want, double tol, const char* what, const std::string& ctx) {
  EXPECT_NEAR(got, want, tol * std::max(std::abs(want), 1e-300)) << what << " (" << ctx << ")";
}

TEST(CertifyLevelTight, MatchesAnIndependentImplementationOfTheFormulas) {
  options opt;
  opt.max_levels = 0;  // share 1: delta_e = delta / 4 on the value scale
  std::uint64_t seed = 70;
  for (const auto& name : kTightCases) {
    const tight_case c = make_tight_case(name, seed++);
    const sampling_design design = design_of(c, opt);
    st::rng g(seed * 31);
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<std::size_t> sampled;
      for (std::size_t i = 0; i < c.light_w.size(); ++i)
        if (trial > 0 && g.uniform() < c.pi[i]) sampled.push_back(i);
      const tight_stats ts = make_tight_stats(c, sampled);
      std::vector<double> o_hat(c.d);
      const level_result lr = certify_level_tight(ts.s, design, c.center, opt, 1.0, o_hat);
      const my_tight m = my_certify_tight(c, sampled, opt.delta / 4.0);
      const std::string ctx = name + " trial " + std::to_string(trial);
      EXPECT_EQ(lr.event_delta, opt.delta / 4.0);
      expect_rel(lr.d_hat, m.d_hat, 1e-12, "D^", ctx);
      expect_rel(lr.mu_lo + 1.0, m.mu_lo + 1.0, 1e-9, "mu_lo", ctx);
      expect_rel(lr.mu_hi, m.mu_hi, 1e-9, "mu_hi", ctx);
      expect_rel(lr.d_lo, m.d_lo, 1e-9, "D_lo", ctx);
      expect_rel(lr.d_hi, m.d_hi, 1e-9, "D_hi", ctx);
      expect_rel(lr.g_hat + 1e-12, m.f_hat + 1e-12, 1e-9, "F^", ctx);
      expect_rel(lr.g_plus, m.f_plus, 1e-9, "F+", ctx);
      expect_rel(lr.zeta, m.zeta, 1e-9, "zeta", ctx);
      expect_rel(lr.o_dev + 1e-12, m.o_dev + 1e-12, 1e-9, "||o^ - g||", ctx);
      expect_rel(lr.beta, m.beta, 1e-9, "beta", ctx);
      expect_rel(lr.t_lo + 1e-12, m.t_lo + 1e-12, 1e-9, "T_lo", ctx);
      expect_rel(lr.m_lo, m.m_lo, 1e-9, "M_lo", ctx);
      for (std::size_t i = 0; i < c.d; ++i)
        EXPECT_NEAR(o_hat[i], m.o_hat[i], 1e-12 * (1.0 + std::abs(m.o_hat[i]))) << ctx;
    }
  }
}

TEST(CertifyLevelTight, EveryEventAndBetaCoverUnderValueAwareSampling) {
  const std::size_t trials = 20000;
  options opt;
  opt.delta = 0.6;
  opt.max_levels = 0;
  opt.scale = error_scale::kValueScale;
  const double delta_e = opt.delta / double(tight_events(opt));  // 0.15
  std::uint64_t seed = 800;
  std::size_t total_count_miss = 0;
  for (const auto& name : kTightCases) {
    const tight_case c = make_tight_case(name, seed++);
    const sampling_design design = design_of(c, opt);
    // The truth: D, o, M, and the light sums F and T_A the events bound.
    double D = 0.0, T = 0.0, F = 0.0, TA = 0.0;
    std::vector<double> o(c.d, 0.0);
    for (std::size_t j = 0; j < c.exact_w.size(); ++j) {
      D += c.exact_w[j];
      T += c.exact_w[j] * sq_norm(c.exact_v[j]);
      for (std::size_t i = 0; i < c.d; ++i) o[i] += c.exact_w[j] * c.exact_v[j][i];
    }
    for (std::size_t j = 0; j < c.light_w.size(); ++j) {
      const double w = c.light_w[j];
      D += w;
      TA += w * sq_norm(c.light_v[j]);
      if (c.rho[j] > 0.0) F += w * (1.0 - c.pi[j]) * sq_dist(c.light_v[j], c.center) / c.rho[j];
      for (std::size_t i = 0; i < c.d; ++i) o[i] += w * c.light_v[j][i];
    }
    T += TA;
    for (auto& x : o) x /= D;
    const double M = std::sqrt(T / D);

    st::rng g(seed * 977);
    std::size_t count_miss = 0, f_miss = 0, z_miss = 0, t_miss = 0, beta_miss = 0, m_miss = 0;
    double worst = 0.0;
    std::vector<double> o_hat(c.d), z(c.d);
    std::vector<std::size_t> sampled;
    for (std::size_t trial = 0; trial < trials; ++trial) {
      sampled.clear();
      std::fill(z.begin(), z.end(), 0.0);
      for (std::size_t j = 0; j < c.light_w.size(); ++j) {
        const bool in = g.uniform() < c.pi[j];
        if (in) sampled.push_back(j);
        const double coef = ((in ? 1.0 / c.pi[j] : 0.0) - 1.0) * c.light_w[j];
        for (std::size_t i = 0; i < c.d; ++i) z[i] += coef * (c.light_v[j][i] - double(c.center[i]));
      }
      const tight_stats ts = make_tight_stats(c, sampled);
      const level_result lr = certify_level_tight(ts.s, design, c.center, opt, 1.0, o_hat);
      count_miss += !(lr.d_lo <= D && D <= lr.d_hi);
      f_miss += F > lr.g_plus;
      z_miss += std::sqrt(sq_norm(z)) > lr.zeta;
      t_miss += lr.t_lo > TA;
      double err = 0.0;
      for (std::size_t i = 0; i < c.d; ++i) err += (o_hat[i] - o[i]) * (o_hat[i] - o[i]);
      err = std::sqrt(err);
      beta_miss += err > lr.beta;
      m_miss += lr.m_lo > M;
      worst = std::max(worst, err / lr.beta);
    }
    std::printf("tight %-34s count %.4f  F %.4f  Z %.4f  T %.4f  beta %.4f  M %.4f  "
                "max err/beta %.3f\n",
                name.c_str(), double(count_miss) / trials, double(f_miss) / trials,
                double(z_miss) / trials, double(t_miss) / trials, double(beta_miss) / trials,
                double(m_miss) / trials, worst);
    const std::size_t crit_e = st::binomial_upper_critical(trials, delta_e, kAlpha);
    EXPECT_LE(count_miss, crit_e) << name;
    EXPECT_LE(f_miss, crit_e) << name;
    EXPECT_LE(z_miss, crit_e) << name;
    EXPECT_LE(t_miss, crit_e) << name;
    EXPECT_LE(beta_miss, st::binomial_upper_critical(trials, opt.delta, kAlpha)) << name;
    EXPECT_LE(m_miss, st::binomial_upper_critical(trials, 2.0 * delta_e, kAlpha)) << name;
    total_count_miss += count_miss;
  }
  EXPECT_GT(total_count_miss, 0u);  // the interval is not vacuous at delta_e = 0.15
}

}  // namespace
