// Certificates on every answer path (docs/certificate.md, "Rounding" and "Delta spent where
// heads stop"): exact answers computed in float or double are certified only when their
// rounding bound meets epsilon, epsilon has a floor, and level hints are used only with
// perturbations they do not depend on. Deterministic: fixed caches and seeds, so these
// tests cannot fail by chance.
#include "support/harness.hpp"

#include <certattn/certattn.hpp>
#include <certattn/exact.hpp>
#include <certattn/reference.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace {

using namespace certattn;

using test::routing_history;
using test::scaled_error;

TEST(Rounding, EpsilonHasAFloorNamedInTheError) {
  options o;
  o.epsilon = 1e-10;
  try {
    validate(o);
    FAIL() << "epsilon 1e-10 accepted";
  } catch (const certattn::error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("options.epsilon"), std::string::npos) << m;
    EXPECT_NE(m.find("kMinEpsilon"), std::string::npos) << m;
  }
  o.epsilon = options::kMinEpsilon;
  EXPECT_NO_THROW(validate(o));
}

// A cache no longer than the window (kNoPool) and a routed group, at the smallest epsilon:
// a head reported certified has error <= epsilon * scale against exact attention in double,
// on every scale and element type's rounding.
TEST(Rounding, TinyEpsilonNoPoolAndRoutedNeverOverclaim) {
  const std::size_t d = 64, G = 4;
  std::size_t certified = 0, heads = 0;
  // 32K tokens: the float kernel's own error (about sqrt(n / 16) 2^-24 M) exceeds 2^-20 M
  // on the output-norm and denominator scales (where the old certificate overclaimed).
  for (const std::size_t n : {48u, 4096u, 32768u})
    for (const error_scale scale :
         {error_scale::kValueScale, error_scale::kOutputNorm, error_scale::kDenominator}) {
      if (n > 4096 && scale == error_scale::kValueScale) continue;
      for (std::uint64_t trial = 0; trial < (n > 4096 ? 3u : 10u); ++trial) {
        const test::head_cache<half> cache(
            n, d, [&](std::size_t t, std::size_t i) { return test::gauss(trial * 7919 + t, i); },
            [&](std::size_t t, std::size_t i) { return 0.3 + test::gauss(trial * 104729 + t, i + 999); });
        key_index idx(d);
        idx.build(cache.view());
        std::vector<float> q(G * d);
        for (std::size_t i = 0; i < q.size(); ++i) q[i] = float(1.5 * test::gauss(trial, 5000 + i));
        options opt;
        opt.epsilon = options::kMinEpsilon;
        opt.scale = scale;
        group_history h = n > 64 ? routing_history(G) : group_history(G);
        const test::group_run run = test::run_group(cache.view(), idx, q, G, opt, {trial, 0, 0}, &h);
        for (std::size_t g = 0; g < G; ++g) {
          const certificate& c = run.certs[g];
          ASSERT_EQ(c.path, n > 64 ? answer_path::kRouted : answer_path::kNoPool);
          ++heads;
          if (!c.certified) continue;
          ++certified;
          const exact_result ex = exact_attention(std::span<const float>(q.data() + g * d, d),
                                                  cache.key_matrix(n), cache.value_matrix(n));
          const double err = scaled_error(run.out.data() + g * d, ex, opt);
          EXPECT_LE(err, opt.epsilon) << "n " << n << " scale " << to_string(scale) << " trial "
                                      << trial << " head " << g;
          if (scale == error_scale::kDenominator) {
            const double den = c.denominator * std::exp(c.max_score - ex.max_score);
            EXPECT_LE(std::fabs(den - ex.denominator), opt.epsilon * ex.denominator);
          }
        }
      }
    }
  // Most heads are certified at 2^-20 through the double path; none overclaims.
  EXPECT_GT(certified, heads / 2);
}

// Values that nearly cancel: pairs of identical keys with values +A x and -A x plus a small
// common offset, so that ||o|| / M is about 2e-8. The float kernel's error is of order
// (n / 16) 2^-24 M, far above epsilon ||o||: a routed head must not be certified on the
// float answer; the double path's bound (n 2^-53 M) meets epsilon ||o|| with offset 2e-5,
// and nothing certifies when o = 0 exactly (offset 0).
TEST(Rounding, NearCancellingValuesOnTheOutputNormScale) {
  const std::size_t n = 4096, d = 32, G = 1;
  for (const double offset : {2e-5, 0.0}) {
    std::size_t certified = 0, violations = 0, calls = 0;
    // 100 routed calls where a certificate is possible; 20 where none is (o = 0).
    for (std::uint64_t trial = 0; trial < (offset > 0.0 ? 100u : 20u); ++trial) {
      const double A = 1000.0;
      // Token t and t + n/2 share a key; their values cancel, and the float kernel's
      // running sums hold the first half's +A x terms until the second half arrives.
      const test::head_cache<float> cache(
          n, d, [&](std::size_t t, std::size_t i) { return test::gauss(trial * 31 + t % (n / 2), i); },
          [&](std::size_t t, std::size_t i) {
            const double x = test::gauss(trial * 77 + t % (n / 2), i + 500);
            return (t < n / 2 ? A * x : -A * x) + offset;
          });
      key_index idx(d);
      idx.build(cache.view());
      std::vector<float> q(d);
      for (std::size_t i = 0; i < d; ++i) q[i] = float(test::gauss(trial, 9000 + i));
      options opt;
      opt.scale = error_scale::kOutputNorm;
      group_history h = routing_history(G);
      const test::group_run run = test::run_group(cache.view(), idx, q, G, opt, {trial, 0, 0}, &h);
      ASSERT_EQ(run.certs[0].path, answer_path::kRouted);
      ++calls;
      if (!run.certs[0].certified) continue;
      ++certified;
      const exact_result ex = exact_attention(std::span<const float>(q), cache.key_matrix(n),
                                              cache.value_matrix(n));
      violations += scaled_error(run.out.data(), ex, opt) > opt.epsilon;
    }
    EXPECT_EQ(violations, 0u) << "offset " << offset << ": " << certified << " certified of " << calls;
    if (offset == 0.0) EXPECT_EQ(certified, 0u) << "o = 0: nothing can be certified on ||o||";
    if (offset > 0.0) EXPECT_GT(certified, calls / 2) << "the double path certifies these";
  }
}

// The same call twice with a live history (a retried step): the second gets no hints from
// the first, whose perturbations it reuses, so both give the answer of a call without
// hints, and the reference decides the same.
TEST(Rounding, RepeatedStepWithAHistoryUsesNoHintsFromIt) {
  const std::size_t n = 16384, d = 32, G = 4;
  const test::head_cache<half> cache(
      n, d, [](std::size_t t, std::size_t i) { return 1.2 * test::gauss(t, i); },
      [](std::size_t t, std::size_t i) { return test::gauss(t, i + 77); });
  key_index idx(d);
  idx.build(cache.view());
  options opt = test::sparse_options();
  std::size_t differs_from_hinted = 0;
  for (std::uint64_t trial = 0; trial < 20; ++trial) {
    std::vector<float> q(G * d);
    for (std::size_t i = 0; i < q.size(); ++i) q[i] = float(2.0 * test::gauss(trial, 40000 + i));
    group_history h(G);
    // Earlier steps give the history hints for step 10.
    for (std::uint64_t step = 8; step < 10; ++step)
      test::run_group(cache.view(), idx, q, G, opt, {step, 3, 1}, &h);
    const noise_key nk{10, 3, 1};
    ASSERT_FALSE(h.hints_for(nk).empty());
    const test::group_run first = test::run_group(cache.view(), idx, q, G, opt, nk, &h);
    EXPECT_TRUE(h.hints_for(nk).empty()) << "hints of step 10 offered to step 10";
    const group_history snapshot = h;
    const test::group_run again = test::run_group(cache.view(), idx, q, G, opt, nk, &h);
    const test::group_run unhinted = test::run_group(cache.view(), idx, q, G, opt, nk);
    for (std::size_t g = 0; g < G; ++g) {
      EXPECT_EQ(again.certs[g].level, unhinted.certs[g].level) << "trial " << trial;
      EXPECT_EQ(again.certs[g].beta, unhinted.certs[g].beta) << "trial " << trial;
      differs_from_hinted += again.certs[g].level != first.certs[g].level ||
                             again.certs[g].beta != first.certs[g].beta;
    }
    // The reference, given the history as it stood before the repeated call, agrees.
    reference_extras ex;
    ex.value_center = idx.value_center();
    ex.value_cap = idx.value_cap();
    ex.reach_floor = idx.reach_floor();
    ex.history = &snapshot;
    const auto ref = reference_attend_group(std::span<const float>(q), G, cache.view(), opt, nk, ex);
    for (std::size_t g = 0; g < G; ++g) {
      EXPECT_EQ(ref[g].cert.level, again.certs[g].level) << "trial " << trial << " head " << g;
      EXPECT_NEAR(ref[g].cert.beta, again.certs[g].beta, 1e-9 * std::fabs(ref[g].cert.beta));
    }
    // Another layer, KV head or sequence, or an earlier step, gets no hints either; a
    // later step of the same gets them.
    EXPECT_TRUE(h.hints_for(noise_key{11, 4, 1}).empty());
    EXPECT_TRUE(h.hints_for(noise_key{11, 3, 2}).empty());
    EXPECT_TRUE(h.hints_for(noise_key{11, 3, 1, 5}).empty());
    EXPECT_TRUE(h.hints_for(noise_key{9, 3, 1}).empty());
    EXPECT_FALSE(h.hints_for(noise_key{11, 3, 1}).empty());
  }
  // The hints did change the calls that were allowed them (the test can see a reuse).
  EXPECT_GT(differs_from_hinted, 0u);
}

// A history keeps the largest step that produced its hints: going back a step and forward
// again does not hand the hints of step 10 to a repeated step 10.
TEST(Rounding, HistoryKeepsTheLargestStep) {
  group_history h(2);
  h.record_sparse(0.5, std::vector<int>{3, 4}, noise_key{10, 0, 0});
  h.record_sparse(0.5, std::vector<int>{5, 6}, noise_key{4, 0, 0});
  EXPECT_EQ(h.hint_key().step, 10u);
  EXPECT_TRUE(h.hints_for(noise_key{10, 0, 0}).empty());
  EXPECT_FALSE(h.hints_for(noise_key{11, 0, 0}).empty());
  // Another layer starts afresh: the old levels are dropped with the old key.
  h.record_sparse(0.5, std::vector<int>{-1, 2}, noise_key{0, 1, 0});
  EXPECT_EQ(h.levels()[0], -1);
  EXPECT_EQ(h.levels()[1], 2);
  h.reset();
  EXPECT_FALSE(h.has_hints());
  EXPECT_TRUE(h.hints_for(noise_key{100, 1, 0}).empty());
}

// The bound of rounding.hpp on its own: exact answers of zero values are exact, a bound
// that cannot be met is not certified, and the float kernel's eta grows with n.
TEST(Rounding, ExactAnswerBoundBasics) {
  options opt;
  exact_rounding r;
  r.head_dim = 8;
  r.eta = double_path_eta(1000, 10.0);
  r.spread = 0.0;
  r.value_scale = 0.0;
  certificate c;
  certify_exact_answer(r, 0.0, 1.0, opt, c);
  EXPECT_TRUE(c.certified);
  EXPECT_EQ(c.bound, 0.0);
  EXPECT_LT(dense_kernel_eta(1000, 128, 50.0), dense_kernel_eta(100000, 128, 50.0));
  EXPECT_LT(double_path_eta(100000, 50.0), 1e-10);
  opt.scale = error_scale::kOutputNorm;
  r.spread = 1.0;
  r.value_scale = 1.0;
  r.eta = dense_kernel_eta(1 << 20, 128, 50.0);
  certify_exact_answer(r, 1e-6, 1.0, opt, c);
  EXPECT_FALSE(c.certified);
}

}  // namespace
