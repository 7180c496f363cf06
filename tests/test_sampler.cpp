// The threshold grid and the nested PPS samples (ALGORITHM.md, "Nested samples"):
// earliest_level() agrees with in_sample() everywhere, including exactly on the grid;
// each light key is included with probability min(1, w_i / tau) independently of the
// others; heavy keys always are; S_0 ⊆ S_1 ⊆ ...; and the reference's sample_level /
// heavy_level / trace describe exactly these sets.
//
// Statistical assertions reject at p < 1e-6 each (stated per test); there are fewer than
// 20 of them, so a correct sampler fails this file with probability < 2e-5 over the seeds.
#include <certattn/perturb.hpp>
#include <certattn/reference.hpp>
#include <certattn/sampler.hpp>

#include "support/harness.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "support/stats.hpp"

namespace {

using namespace certattn;
namespace st = certattn::test;

constexpr double kAlpha = 1e-6;

TEST(Grid, Values) {
  for (int r : {1, 2, 3, 8}) {
    EXPECT_EQ(ln_tau(0, r), 0.0);
    EXPECT_EQ(tau_of(0, r), 1.0);
    EXPECT_NEAR(tau_of(r, r), 0.5, 1e-15);
    EXPECT_NEAR(tau_of(5 * r, r), 1.0 / 32.0, 1e-15);
    for (int j = 0; j < 100; ++j) EXPECT_LT(ln_tau(j + 1, r), ln_tau(j, r));
  }
}

// earliest_level(x) <= j  <=>  in_sample(x, 0, ln tau_j), for every j in 0..J, on the grid
// points themselves, one ulp either side, and special values.
TEST(Grid, EarliestLevelAgreesWithInSampleOnEdges) {
  const double inf = std::numeric_limits<double>::infinity();
  for (int r : {1, 2, 3, 4, 7, 16}) {
    for (int J : {0, 1, 5, 32, 200}) {
      std::vector<double> xs = {0.0, -0.0, 1e-300, -1e-300, 1.0, 1e300, -1e300, inf, -inf,
                                std::numeric_limits<double>::quiet_NaN(),
                                -std::numeric_limits<double>::denorm_min()};
      for (int j = 0; j <= J + 2; ++j) {
        const double l = ln_tau(j, r);
        xs.push_back(l);
        xs.push_back(std::nextafter(l, inf));
        xs.push_back(std::nextafter(l, -inf));
        xs.push_back(std::nextafter(std::nextafter(l, -inf), -inf));
        xs.push_back(-double(j) * 0.6931471805599453 / double(r));  // the closed form
      }
      st::rng g(uint64_t(r * 1000 + J));
      for (int i = 0; i < 2000; ++i) xs.push_back(ln_tau(J + 2, r) * g.uniform());
      for (double x : xs) {
        const int e = earliest_level(x, r, J);
        ASSERT_GE(e, 0);
        ASSERT_LE(e, J + 1);
        for (int j = 0; j <= J; ++j)
          ASSERT_EQ(e <= j, in_sample(x, 0.0, ln_tau(j, r)))
              << "x = " << x << " r = " << r << " J = " << J << " j = " << j << " e = " << e;
        // The same with the sum formed from a score and a perturbation, as the reference does.
        const double s = x - 0.75, ee = 0.75;
        if (std::isfinite(x) && std::abs(x) < 1e10) {
          const int e2 = earliest_level(s + ee, r, J);
          for (int j = 0; j <= J; ++j)
            ASSERT_EQ(e2 <= j, in_sample(s, ee, ln_tau(j, r)));
        }
      }
    }
  }
}

TEST(Grid, HeavyKeysAreAlwaysSampled) {
  st::rng g(5);
  for (int i = 0; i < 100000; ++i) {
    const double s = -10.0 * g.uniform(), lt = -10.0 * g.uniform();
    const double e = i % 7 == 0 ? 0.0 : -std::log(g.uniform());
    if (is_heavy(s, lt)) {
      ASSERT_TRUE(in_sample(s, e, lt));
    }
  }
  // Exactly on the threshold: heavy (w_i >= tau_j).
  for (int j = 0; j < 40; ++j) {
    EXPECT_TRUE(is_heavy(ln_tau(j, 2), ln_tau(j, 2)));
    EXPECT_FALSE(is_heavy(std::nextafter(ln_tau(j, 2), -1e9), ln_tau(j, 2)));
    EXPECT_EQ(earliest_level(ln_tau(j, 2), 2, 64), j);
  }
}

// ------------------------------------------------------------------ inclusion frequencies

// Scores s_i - c = ln w_i for a pool of keys spanning heavy, near-threshold and light keys.
std::vector<double> test_log_weights(double ln_tau_j) {
  std::vector<double> lw;
  for (int i = 0; i < 40; ++i) lw.push_back(ln_tau_j + 0.5 - 0.15 * i);  // w/tau from e^.5 down
  lw.push_back(ln_tau_j);                                          // exactly on the threshold
  lw.push_back(std::nextafter(ln_tau_j, -1e9));                    // one ulp below: p ~ 1
  lw.push_back(ln_tau_j - 1e-9);
  lw.push_back(ln_tau_j - 20.0);                                   // p = 2e-9
  return lw;
}

// Independent binomial counts c_i ~ Bin(T, p_i): sum (c_i - T p_i)^2 / (T p_i (1 - p_i)) is
// ~chi^2 with one dof per key with 0 < p_i < 1 (p_i >= 2e-3 so the normal approximation is
// fine; rarer keys are checked to be near 0 count separately). Reject at p < 1e-6.
void expect_inclusion_matches(const std::vector<double>& lw, double ln_tau_j,
                              const std::vector<std::uint64_t>& counts, std::uint64_t trials,
                              const std::string& what) {
  double chi2 = 0.0;
  int dof = 0;
  for (std::size_t i = 0; i < lw.size(); ++i) {
    const double p = std::min(1.0, std::exp(lw[i] - ln_tau_j));
    if (lw[i] >= ln_tau_j) {
      EXPECT_EQ(counts[i], trials) << what << ": heavy key " << i << " not always sampled";
      continue;
    }
    if (p < 2e-3) {
      // P(count >= 3) for T p <= 1e-4 is < 2e-13.
      EXPECT_LE(counts[i], 2u) << what << ": key " << i << " with p = " << p;
      continue;
    }
    const double e = double(trials) * p;
    if (p > 1.0 - 1e-6) {
      EXPECT_GE(double(counts[i]), double(trials) - 3.0) << what << ": key " << i;
      continue;
    }
    chi2 += (double(counts[i]) - e) * (double(counts[i]) - e) / (e * (1.0 - p));
    ++dof;
  }
  ASSERT_GT(dof, 20);
  EXPECT_GT(st::chi_square_sf(chi2, dof), kAlpha)
      << what << ": chi2 = " << chi2 << " with " << dof << " dof";
}

TEST(Inclusion, FrequencyMatchesMinOneWOverTauAcrossSteps) {
  const int r = 2;
  const std::uint64_t T = 40000;
  for (int j : {0, 3, 9}) {
    const double lt = ln_tau(j, r);
    const std::vector<double> lw = test_log_weights(lt);
    std::vector<std::uint64_t> counts(lw.size(), 0);
    // Pairwise independence: joint inclusion of two keys with p ~ 0.5 and p ~ 0.35.
    const std::size_t a = 8, b = 11;
    std::vector<std::uint64_t> joint(4, 0);
    for (std::uint64_t step = 0; step < T; ++step) {
      const perturbation pert(2024, noise_key{step, 5, 1});
      std::vector<bool> in(lw.size());
      for (std::size_t i = 0; i < lw.size(); ++i) {
        in[i] = in_sample(lw[i], pert.exp1(i), lt);
        counts[i] += in[i];
      }
      joint[2 * in[a] + in[b]]++;
    }
    expect_inclusion_matches(lw, lt, counts, T, "level " + std::to_string(j));
    const double pa = std::exp(lw[a] - lt), pb = std::exp(lw[b] - lt);
    const std::vector<double> obs(joint.begin(), joint.end());
    const std::vector<double> exp = {T * (1 - pa) * (1 - pb), T * (1 - pa) * pb,
                                     T * pa * (1 - pb), T * pa * pb};
    EXPECT_GT(st::chi_square_sf(st::chi_square_statistic(obs, exp), 3.0), kAlpha)
        << "joint inclusion of two light keys is not independent";
  }
}

// The same through the reference estimator, over seeds: head_dim 1, q = 1, softmax scale 1,
// so s_i = k_i exactly; the last (window) key has score 0 = c, hence w_i = exp(k_i).
struct tiny_cache {
  std::vector<float> keys, values;
  std::size_t window;
};

tiny_cache make_tiny_cache(const std::vector<double>& lw, std::size_t window) {
  tiny_cache c;
  c.window = window;
  for (double x : lw) {
    c.keys.push_back(float(x));
    c.values.push_back(float(1.0 + x));
  }
  for (std::size_t i = 0; i < window; ++i) {
    c.keys.push_back(i + 1 == window ? 0.0f : -1.0f);
    c.values.push_back(0.5f);
  }
  return c;
}

TEST(Inclusion, ReferenceSampleLevelsMatchMinOneWOverTauAcrossSeeds) {
  const int r = 2, J = 12;
  const int j = 6;
  const double lt = ln_tau(j, r);
  // All keys at most 0 so that c = 0 is the window key. Keys are stored as float, so the
  // log-weights are rounded to float first (the float key is then the exact score).
  std::vector<double> lw = test_log_weights(lt);
  for (double& x : lw) x = double(float(x));
  const tiny_cache c = make_tiny_cache(lw, 2);
  const auto keys = make_matrix_view(c.keys.data(), c.keys.size(), 1);
  const auto values = make_matrix_view(c.values.data(), c.values.size(), 1);
  const std::vector<double> q = {1.0};
  options opt = test::sparse_options();  // the certificate's keys, not routing
  opt.certificate = certificate_kind::kClassic;  // plain PPS on the paper's grid
  opt.window = c.window;
  opt.grid_ratio = r;
  opt.max_levels = J;
  opt.softmax_scale = 1.0;
  opt.epsilon = 0.5;
  const std::uint64_t T = 30000;
  std::vector<std::uint64_t> counts(lw.size(), 0);
  for (std::uint64_t seed = 0; seed < T; ++seed) {
    opt.seed = seed;
    const reference_result res =
        reference_attend(std::span<const double>(q), keys, values, opt, noise_key{3, 1, 0});
    ASSERT_EQ(res.max_score, 0.0);
    ASSERT_EQ(res.sample_level.size(), lw.size());
    for (std::size_t i = 0; i < lw.size(); ++i) counts[i] += res.sample_level[i] <= j;
  }
  expect_inclusion_matches(lw, lt, counts, T, "reference, level " + std::to_string(j));
}

// ------------------------------------------------------------------ nesting and the trace

// For every call: sample_level and heavy_level are exactly the earliest levels of the
// defining inequalities with the library's perturbations, heavy implies sampled, and the
// trace's per-level counts are those of the nested sets.
TEST(Inclusion, ReferenceSetsAreNestedAndMatchTheDefinition) {
  st::rng g(77);
  const std::size_t n = 600, d = 8, window = 16;
  std::vector<half> keys(n * d), values(n * d);
  for (auto& x : keys) x = half(float(g.normal()));
  for (auto& x : values) x = half(float(g.normal()));
  // Exact ties: several keys equal, so their scores are equal.
  for (std::size_t t = 100; t < 140; ++t)
    for (std::size_t i = 0; i < d; ++i) keys[t * d + i] = keys[99 * d + i];
  const auto kv = make_matrix_view(keys.data(), n, d);
  const auto vv = make_matrix_view(values.data(), n, d);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> q(d);
    for (auto& x : q) x = float(3.0 * g.normal());
    options opt = test::sparse_options();  // the certificate's keys, not routing
    // Both certificates: the tight one shifts scores by the grid's top and adds each key's
    // value-aware offset ln(rho / rho_bar).
    opt.certificate = trial % 2 ? certificate_kind::kClassic : certificate_kind::kTight;
    opt.window = window;
    opt.grid_ratio = 1 + trial % 3;
    opt.max_levels = 24;
    opt.epsilon = options::kMinEpsilon;  // with this delta, never certifies: the trace
    opt.delta = 1e-300;                  // covers every level
    opt.seed = 1000 + trial;
    const noise_key nk{std::uint64_t(trial), 2, 3};
    const reference_result res = reference_attend(std::span<const float>(q), kv, vv, opt, nk);
    const int J = opt.total_levels();
    ASSERT_EQ(res.trace.size(), std::size_t(J + 1));
    const std::vector<double> s = exact_scores(std::span<const float>(q), kv,
                                               opt.effective_softmax_scale(d));
    const perturbation pert(opt.seed, nk);
    const double c = res.max_score + grid_shift(opt.top_halvings());
    // The sampling offsets of the tight certificate's value-aware design (0 for classic).
    const std::vector<float> center = value_mean(vv, n);
    std::vector<float> dist(n);
    for (std::size_t t = 0; t < n; ++t) dist[t] = value_distance_bound(vv.row(t), center, d);
    const sampling_design design = make_sampling_design(opt, reach_floor_from(dist), 0.0, center);
    auto x_of = [&](std::size_t t) { return (s[t] - c) + design.offset(dist[t]); };
    std::size_t exact_set = 0;
    for (std::size_t t = 0; t + window < n; ++t) {
      if (res.heavy_level[t] < 0) {  // the exact set (value outliers): read exactly
        ASSERT_EQ(res.sample_level[t], -1);
        ++exact_set;
        continue;
      }
      ASSERT_LE(res.sample_level[t], res.heavy_level[t]);
      for (int j = 0; j <= J; ++j) {
        const double lt = ln_tau(j, opt.grid_ratio);
        ASSERT_EQ(res.sample_level[t] <= j, in_sample(x_of(t), pert.exp1(t), lt))
            << "token " << t << " level " << j;
        ASSERT_EQ(res.heavy_level[t] <= j, is_heavy(x_of(t), lt));
      }
    }
    EXPECT_EQ(res.exact_set, exact_set);
    std::size_t prev_total = 0;
    for (int j = 0; j <= J; ++j) {
      std::size_t heavy = 0, light = 0;
      for (std::size_t t = 0; t + window < n; ++t) {
        if (res.heavy_level[t] < 0) continue;
        heavy += res.heavy_level[t] <= j;
        light += res.sample_level[t] <= j && res.heavy_level[t] > j;
      }
      EXPECT_EQ(res.trace[j].heavy, heavy);
      EXPECT_EQ(res.trace[j].sampled, light);
      EXPECT_EQ(res.trace[j].level, j);
      EXPECT_EQ(res.trace[j].tau, tau_of(j, opt.grid_ratio));
      EXPECT_GE(heavy + light, prev_total) << "S_j is not nested at level " << j;
      prev_total = heavy + light;
    }
  }
}

}  // namespace
