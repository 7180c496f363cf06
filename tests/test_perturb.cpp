// The perturbation hash and its uniforms (ALGORITHM.md, "Perturbations"): U in (0, 1] with
// 53 random bits, never 0; uniform; independent across tokens, heads, layers, steps and
// seeds; E = -ln U ~ Exp(1).
//
// All tests use fixed seeds. Each statistical assertion rejects at p < 1e-6 (stated per
// test); the file has fewer than 60 such assertions, so a correct hash fails it with
// probability < 6e-5 over the choice of seeds.
#include <certattn/perturb.hpp>

#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <set>
#include <unordered_set>
#include <vector>

#include "support/stats.hpp"

namespace {

using certattn::noise_key;
using certattn::perturbation;
namespace st = certattn::test;

constexpr double kAlpha = 1e-6;  // rejection level of every statistical assertion here

// ------------------------------------------------------------------ the helpers themselves

TEST(StatsHelpers, MatchKnownValues) {
  EXPECT_NEAR(st::chi_square_sf(3.841458820694124, 1.0), 0.05, 1e-9);
  EXPECT_NEAR(st::chi_square_sf(18.307038053275146, 10.0), 0.05, 1e-9);
  EXPECT_NEAR(st::chi_square_sf(1000.0, 1000.0), 0.4940, 1e-3);
  EXPECT_NEAR(st::kolmogorov_sf(1.3580986393225507), 0.05, 1e-6);
  EXPECT_NEAR(st::binomial_sf(3, 10, 0.5), 1.0 - (1.0 + 10.0 + 45.0) / 1024.0, 1e-12);
  EXPECT_NEAR(st::binomial_sf(1, 1000, 0.001), 1.0 - std::pow(0.999, 1000.0), 1e-12);
  // P(Bin(100, 0.05) > c) <= 1e-3 first at c = 13 (P(X >= 14) = 4.2e-4, P(X >= 13) = 1.2e-3).
  EXPECT_EQ(st::binomial_upper_critical(100, 0.05, 1e-3), 13u);
  const std::vector<double> p = {0.5, 0.5};
  const auto pmf = st::poisson_binomial_pmf(p);
  EXPECT_NEAR(pmf[0], 0.25, 1e-15);
  EXPECT_NEAR(pmf[1], 0.5, 1e-15);
  EXPECT_NEAR(pmf[2], 0.25, 1e-15);
}

// ------------------------------------------------------------------ bits

TEST(Perturb, UniformFromBitsEdges) {
  EXPECT_EQ(perturbation::uniform_from_bits(0), 0x1p-53);  // never 0
  EXPECT_EQ(perturbation::uniform_from_bits(~std::uint64_t{0}), 1.0);
  EXPECT_EQ(perturbation::uniform_from_bits(0x7ff), 0x1p-53);  // low 11 bits are dropped
  EXPECT_EQ(perturbation::uniform_from_bits(std::uint64_t{1} << 11), 0x1p-52);
  EXPECT_EQ(perturbation::uniform_from_bits(std::uint64_t{1} << 63), 0.5 + 0x1p-53);
  // E is finite and at most 53 ln 2 = 36.74.
  EXPECT_LE(-std::log(perturbation::uniform_from_bits(0)), 36.8);
  EXPECT_EQ(-std::log(perturbation::uniform_from_bits(~std::uint64_t{0})), 0.0);
}

// The float bracket [exp1_lower, exp1_upper] of E (the fast path decides most sample
// levels from it, without a logarithm) must hold for every 64-bit draw. Both bounds depend
// only on the top 24 bits t, and E is monotone in the other 40, so checking every t at
// the largest E (low bits 0) and at the smallest E (low bits 1) covers all 2^64 draws.
// Deterministic and exhaustive: it fails only if a bound is wrong (dropping the 0.01 of
// kLog2Offset or halving kBracket makes it fail).
TEST(Perturb, Exp1BracketHoldsForEveryDraw) {
  std::size_t narrow = 0;
  for (std::uint64_t t = 0; t < (std::uint64_t{1} << 24); ++t) {
    const std::uint64_t smallest_u = t << 40, largest_u = smallest_u | ((std::uint64_t{1} << 40) - 1);
    const double e_max = perturbation::exp1_from_bits(smallest_u);
    const double e_min = perturbation::exp1_from_bits(largest_u);
    const float up = perturbation::exp1_upper_from_bits(smallest_u);
    const float lo = perturbation::exp1_lower_from_bits(largest_u);
    ASSERT_EQ(up, perturbation::exp1_upper_from_bits(largest_u)) << t;
    ASSERT_EQ(lo, perturbation::exp1_lower_from_bits(smallest_u)) << t;
    ASSERT_GE(double(up), e_max) << "upper bound below E at t = " << t;
    ASSERT_LE(double(lo), e_min) << "lower bound above E at t = " << t;
    ASSERT_GE(lo, 0.0f);
    narrow += double(up) - double(lo) <= 0.0201;
  }
  // Every t >= 2^12 has the narrow bracket.
  EXPECT_EQ(narrow, (std::size_t{1} << 24) - (std::size_t{1} << 12));
}

// Every draw is k * 2^-53 with k an integer in [1, 2^53], and all 53 bits of k - 1 vary.
// The low 11 bits of the IEEE mantissa of U in [1/2, 1) must vary too (a float or a 32-bit
// conversion would leave them 0). A fixed bit over 2^16 draws has probability 2^-65535.
TEST(Perturb, UniformHas53RandomBitsAndIsNeverZero) {
  for (std::uint64_t seed : {0ull, 1ull, 0xdeadbeefull}) {
    const perturbation p(seed, noise_key{7, 3, 1});
    std::uint64_t all_and = ~std::uint64_t{0}, all_or = 0;
    std::uint64_t mant_and = ~std::uint64_t{0}, mant_or = 0;
    std::size_t upper_half = 0;
    for (std::uint64_t t = 0; t < (1u << 16); ++t) {
      const double u = p.uniform(t);
      ASSERT_GT(u, 0.0);
      ASSERT_LE(u, 1.0);
      const double m = u * 0x1p53;
      ASSERT_EQ(m, std::floor(m)) << "U * 2^53 is not an integer at token " << t;
      ASSERT_GE(m, 1.0);
      ASSERT_LE(m, 0x1p53);
      const std::uint64_t k = std::uint64_t(m) - 1;
      all_and &= k;
      all_or |= k;
      if (u >= 0.5 && u < 1.0) {
        const std::uint64_t bits = std::bit_cast<std::uint64_t>(u) & 0x7ff;
        mant_and &= bits;
        mant_or |= bits;
        ++upper_half;
      }
      const double e = p.exp1(t);
      ASSERT_TRUE(std::isfinite(e));
      ASSERT_GE(e, 0.0);
      ASSERT_LE(e, 36.8);
      ASSERT_EQ(e, -std::log(u));
      ASSERT_EQ(u, perturbation::uniform_from_bits(p.bits(t)));
    }
    EXPECT_EQ(all_or, (std::uint64_t{1} << 53) - 1) << "some bit of U*2^53 - 1 never is 1";
    EXPECT_EQ(all_and, 0u) << "some bit of U*2^53 - 1 never is 0";
    EXPECT_GT(upper_half, 30000u);
    EXPECT_EQ(mant_or, 0x7ffu) << "low mantissa bits of U never set";
    EXPECT_EQ(mant_and, 0u) << "low mantissa bits of U always set";
  }
}

TEST(Perturb, ReproducibleFromTheSeed) {
  const noise_key k{12, 5, 2};
  const perturbation a(99, k), b(99, k);
  for (std::uint64_t t = 0; t < 1000; ++t) {
    ASSERT_EQ(a.bits(t), b.bits(t));
    ASSERT_EQ(a.exp1(t), b.exp1(t));
  }
  // Tokens can be queried in any order: the value is a pure function of the token.
  EXPECT_EQ(a.bits(123456789), perturbation(99, k).bits(123456789));
  static_assert(perturbation(1, noise_key{}).bits(0) == perturbation(1, noise_key{}).bits(0));
}

// Distinct (seed, step, layer, kv_head) tuples give distinct keys, and their streams do not
// overlap (a derivation that added the step to the token counter would make stream
// (step + 1, t) equal to stream (step, t + 1): caught here). A 64-bit collision among
// 2^17 x 2^17 pairs has probability 2^-30.
TEST(Perturb, StreamsOfDistinctCallsAreDistinctAndDoNotOverlap) {
  std::set<std::uint64_t> keys;
  std::size_t count = 0;
  for (std::uint64_t seed : {0ull, 1ull, 2ull, 1ull << 40})
    for (std::uint64_t step = 0; step < 8; ++step)
      for (std::uint32_t layer = 0; layer < 8; ++layer)
        for (std::uint32_t head = 0; head < 8; ++head)
          for (std::uint64_t sequence : {0ull, 1ull, 7ull}) {
            keys.insert(perturbation(seed, noise_key{step, layer, head, sequence}).key());
            ++count;
          }
  EXPECT_EQ(keys.size(), count);
  // Sequence 0 is the stream without a sequence.
  EXPECT_EQ(perturbation(5, noise_key{3, 2, 1, 0}).key(), perturbation(5, noise_key{3, 2, 1}).key());
  EXPECT_THROW(noise_key(0, 0, 0, -1), certattn::error);

  const noise_key base{10, 4, 2};
  const std::array<std::pair<std::uint64_t, noise_key>, 5> others = {{
      {0, noise_key{11, 4, 2}},     // next step
      {0, noise_key{10, 5, 2}},     // next layer
      {0, noise_key{10, 4, 3}},     // next head
      {1, noise_key{10, 4, 2}},     // next seed
      {0, noise_key{10, 4, 2, 1}},  // another sequence
  }};
  const perturbation a(0, base);
  std::unordered_set<std::uint64_t> seen;
  for (std::uint64_t t = 0; t < (1u << 17); ++t) seen.insert(a.bits(t));
  for (const auto& [seed, k] : others) {
    const perturbation b(seed, k);
    std::size_t hits = 0;
    for (std::uint64_t t = 0; t < (1u << 17); ++t) hits += seen.count(b.bits(t));
    EXPECT_EQ(hits, 0u) << "stream (seed " << seed << ", step " << k.step << ", layer "
                        << k.layer << ", head " << k.kv_head << ") overlaps the base stream";
  }
}

// ------------------------------------------------------------------ uniformity

// Chi-square over 256 equal bins of U, and over the 256 values of the lowest 8 random bits
// (which a sloppy conversion would bias). Each p-value > 1e-6 (false failure 1e-6 each).
TEST(Perturb, UniformIsUniformChiSquare) {
  const std::size_t n = 1u << 18;
  for (std::uint64_t seed : {3ull, 4ull}) {
    for (const noise_key k : {noise_key{0, 0, 0}, noise_key{1000, 31, 7}}) {
      const perturbation p(seed, k);
      std::vector<std::uint64_t> bins(256, 0), low(256, 0);
      for (std::uint64_t t = 0; t < n; ++t) {
        const double u = p.uniform(t);
        bins[std::min<std::size_t>(255, std::size_t((u - 0x1p-53) * 256.0))]++;
        low[(std::uint64_t(u * 0x1p53) - 1) & 0xff]++;
      }
      EXPECT_GT(st::chi_square_uniform_pvalue(bins), kAlpha) << "seed " << seed;
      EXPECT_GT(st::chi_square_uniform_pvalue(low), kAlpha) << "seed " << seed;
    }
  }
}

// ------------------------------------------------------------------ independence

namespace {
// Chi-square on a 16 x 16 grid of pairs (x_t, y_t) (dof 255) and Pearson's correlation.
// Under independence the grid statistic's p-value is uniform, and sqrt(n) r is ~N(0, 1):
// |r| > 5.33 / sqrt(n) has probability 1e-7.
void expect_independent_pairs(const std::vector<double>& x, const std::vector<double>& y,
                              const std::string& what) {
  std::vector<std::uint64_t> cells(256, 0);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::size_t a = std::min<std::size_t>(15, std::size_t(x[i] * 16.0));
    const std::size_t b = std::min<std::size_t>(15, std::size_t(y[i] * 16.0));
    cells[a * 16 + b]++;
  }
  EXPECT_GT(st::chi_square_uniform_pvalue(cells), kAlpha) << what << ": pair grid";
  const double r = st::correlation(x, y);
  EXPECT_LT(std::abs(r), 5.33 / std::sqrt(double(x.size()))) << what << ": correlation " << r;
}
}  // namespace

TEST(Perturb, IndependentAcrossTokens) {
  const perturbation p(17, noise_key{3, 2, 1});
  const std::size_t n = 1u << 17;
  for (std::uint64_t lag : {1ull, 2ull, 7ull, 64ull, 4096ull}) {
    std::vector<double> x(n), y(n);
    for (std::size_t t = 0; t < n; ++t) {
      x[t] = p.uniform(2 * lag * (t / lag) + t % lag);  // disjoint pairs (t, t + lag)
      y[t] = p.uniform(2 * lag * (t / lag) + t % lag + lag);
    }
    expect_independent_pairs(x, y, "tokens at lag " + std::to_string(lag));
  }
}

TEST(Perturb, IndependentAcrossHeadsLayersStepsAndSeeds) {
  const std::size_t n = 1u << 17;
  struct variant {
    std::uint64_t seed;
    noise_key key;
    const char* what;
  };
  const noise_key base{100, 7, 3};
  const std::vector<variant> variants = {
      {5, noise_key{101, 7, 3}, "next step"},
      {5, noise_key{100, 8, 3}, "next layer"},
      {5, noise_key{100, 7, 4}, "next kv head"},
      {6, noise_key{100, 7, 3}, "next seed"},
      {5, noise_key{100, 3, 7}, "layer and head swapped"},
      {5, noise_key{7, 100, 3}, "step and layer swapped"},
  };
  const perturbation a(5, base);
  std::vector<double> x(n);
  for (std::size_t t = 0; t < n; ++t) x[t] = a.uniform(t);
  for (const auto& v : variants) {
    const perturbation b(v.seed, v.key);
    std::vector<double> y(n), y_shift(n);
    for (std::size_t t = 0; t < n; ++t) {
      y[t] = b.uniform(t);
      y_shift[t] = b.uniform(t + 1);
    }
    expect_independent_pairs(x, y, v.what);
    expect_independent_pairs(x, y_shift, std::string(v.what) + " (token + 1)");
  }
}

// ------------------------------------------------------------------ Exp(1)

// Kolmogorov–Smirnov against 1 - exp(-x), p-value > 1e-6 (false failure 1e-6 per key),
// plus the mean within 5.3 standard errors (two-sided 1.2e-7).
TEST(Perturb, ExponentialByKolmogorovSmirnov) {
  const std::size_t n = 1u << 17;
  for (const auto& [seed, k] : std::vector<std::pair<std::uint64_t, noise_key>>{
           {0, noise_key{0, 0, 0}}, {1, noise_key{5, 1, 0}}, {123, noise_key{1u << 20, 40, 7}}}) {
    const perturbation p(seed, k);
    std::vector<double> e(n);
    double sum = 0.0;
    for (std::size_t t = 0; t < n; ++t) {
      e[t] = p.exp1(t);
      sum += e[t];
    }
    const double d = st::ks_statistic(e, [](double x) { return -std::expm1(-x); });
    EXPECT_GT(st::ks_pvalue(d, n), kAlpha) << "KS statistic " << d << " for seed " << seed;
    EXPECT_NEAR(sum / double(n), 1.0, 5.3 / std::sqrt(double(n)));
    // The upper tail matters most for inclusion of light keys: P(E >= 6) = e^-6.
    std::size_t tail = 0;
    for (double x : e) tail += x >= 6.0;
    const double pt = std::exp(-6.0);
    EXPECT_NEAR(double(tail), double(n) * pt, 5.3 * std::sqrt(double(n) * pt * (1.0 - pt)));
  }
}

}  // namespace
