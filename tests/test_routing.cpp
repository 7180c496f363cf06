// Routing (options::route, group_history, sample_budget): the certified call answers with
// exact attention where the sparse path would cost more than the dense kernel, and the
// reference makes the same decisions. Deterministic (fixed caches, queries and seeds):
// these tests fail only on a wrong decision, a wrong answer or a wrong byte count.
#include <certattn/attend.hpp>
#include <certattn/exact.hpp>
#include <certattn/history.hpp>
#include <certattn/reference.hpp>
#include <certattn/testing/synthetic.hpp>

#include "support/harness.hpp"
#include "support/layouts.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

using namespace certattn;

TEST(GroupHistory, RoutesAfterALossAndProbesWithBackoff) {
  options o;
  o.cost.measured = false;  // the decisions on costs alone (no dense probe: below)
  group_history h(4);
  EXPECT_FALSE(h.routes_dense(o)) << "no sparse call seen yet";
  EXPECT_TRUE(std::isnan(h.last_cost()));
  const std::vector<int> levels{3, -1, 5, 7};
  // One call routes its group only when it costs more than 1 / (1 - 0.35) = 1.54 dense
  // kernels (kCostSpread); the mean of two, more than 1 / (1 - 0.35 sqrt(1/2)) = 1.33.
  h.record_sparse(1.5, levels, noise_key{});
  EXPECT_DOUBLE_EQ(h.cost_estimate(), 1.5);
  EXPECT_DOUBLE_EQ(h.estimate_weight_sq(), 1.0);
  EXPECT_FALSE(h.routes_dense(o)) << "one call of 1.5: within one call's spread of 1";
  EXPECT_EQ(h.levels()[0], 3);
  EXPECT_EQ(h.levels()[1], -1);
  EXPECT_DOUBLE_EQ(h.last_cost(), 1.5);
  h.record_sparse(1.5, levels, noise_key{});
  EXPECT_DOUBLE_EQ(h.estimate_weight_sq(), 0.5);
  EXPECT_TRUE(h.routes_dense(o)) << "two calls of 1.5";
  group_history one(4);
  one.record_sparse(1.6, levels, noise_key{});
  EXPECT_TRUE(one.routes_dense(o)) << "one call of 1.6";
  // 4 dense calls, a probe; each probe that loses doubles the wait, up to 64. A probe
  // after k routed calls weighs at least 1 - (7/8)^k; the routed group stays routed while
  // its estimate exceeds 1.
  std::uint32_t expected = group_history::kFirstProbeInterval;
  for (int round = 0; round < 8; ++round) {
    for (std::uint32_t k = 0; k < expected; ++k) {
      ASSERT_TRUE(h.routes_dense(o)) << "round " << round << " call " << k;
      h.record_dense();
    }
    ASSERT_FALSE(h.routes_dense(o)) << "the probe of round " << round << " is due";
    const double before = h.cost_estimate();
    h.record_sparse(1.3, std::vector<int>{-1, 2, -1, -1}, noise_key{});
    const double w = std::max(1.0 - std::pow(1.0 - group_history::kNewCostWeight, double(expected)),
                              group_history::kNewCostWeight);
    ASSERT_NEAR(h.cost_estimate(), before + w * (1.3 - before), 1e-12) << "round " << round;
    ASSERT_TRUE(h.routed()) << "a probe of 1.3 keeps the estimate above 1";
    expected = std::min(group_history::kMaxProbeInterval, 2 * expected);
    ASSERT_EQ(h.probe_interval(), expected) << "a loss of 0.3 waits at most 7 calls";
  }
  EXPECT_NEAR(h.cost_estimate(), 1.3, 1e-3) << "the long waits' probes weigh almost 1";
  EXPECT_EQ(h.levels()[0], 3) << "an exact head keeps its previous hint";
  EXPECT_EQ(h.levels()[1], 2);
  // A probe that wins after 64 routed calls: its cost is almost the whole estimate, the
  // group is sparse again, and the next loss waits 4 calls again.
  for (std::uint32_t k = 0; k < expected; ++k) h.record_dense();
  h.record_sparse(0.6, levels, noise_key{});
  EXPECT_LT(h.cost_estimate(), 0.61);
  EXPECT_FALSE(h.routes_dense(o));
  EXPECT_EQ(h.probe_interval(), group_history::kFirstProbeInterval);
  // After 8 calls each new cost weighs 1/8: one costly call among many cheap ones stays
  // on the sparse path, a run of flat ones routes once the mean clears the settled margin.
  group_history m(4);
  for (int k = 0; k < 8; ++k) m.record_sparse(0.7, levels, noise_key{});
  EXPECT_NEAR(m.cost_estimate(), 0.7, 1e-12);
  EXPECT_NEAR(m.estimate_weight_sq(), 1.0 / 8.0, 1e-12);
  m.record_sparse(2.4, levels, noise_key{});
  EXPECT_NEAR(m.cost_estimate(), 0.7 + group_history::kNewCostWeight * 1.7, 1e-12);
  EXPECT_FALSE(m.routes_dense(o));
  group_history f(4);
  for (int k = 0; k < 8; ++k) f.record_sparse(0.6, levels, noise_key{});
  int flat = 0;
  while (!f.routes_dense(o) && flat < 40) {
    f.record_sparse(1.5, levels, noise_key{});
    ++flat;
  }
  EXPECT_EQ(flat, 7) << "flat calls of cost 1.5 after focused ones before the group is routed";
  // Costs that straddle 1 (a mean of 0.9 with calls up to 1.9): never routed.
  group_history v(4);
  for (int k = 0; k < 60; ++k) {
    v.record_sparse(k % 4 == 3 ? 1.9 : 0.5 + 0.1 * (k % 3), levels, noise_key{});
    ASSERT_FALSE(v.routes_dense(o)) << "call " << k << ", estimate " << v.cost_estimate();
  }
  // Routing off: never dense.
  h.record_sparse(5.0, levels, noise_key{});
  h.record_sparse(5.0, levels, noise_key{});
  options off;
  off.route = routing::kOff;
  EXPECT_TRUE(h.routes_dense(o));
  EXPECT_FALSE(h.routes_dense(off));
  h.reset();
  EXPECT_FALSE(h.routes_dense(o));
  EXPECT_FALSE(h.routed());
  EXPECT_EQ(h.levels()[2], -1);
  EXPECT_THROW(group_history(0), certattn::error);
}

TEST(SampleBudget, IsTheBreakEvenOfTheCostModel) {
  options o;  // fixed 0.6, per_key 6.4, give_up 2
  EXPECT_EQ(sample_budget(o, 32768), std::size_t((2.0 - 0.6) * 32768 / 6.4));  // 7167
  o.cost.fixed = 0.5;
  o.cost.per_key = 4.0;
  EXPECT_EQ(sample_budget(o, 1000), 375u);
  o.cost.give_up = 1.0;
  EXPECT_EQ(sample_budget(o, 1000), 125u);
  o.route = routing::kOff;
  EXPECT_EQ(sample_budget(o, 1000), std::size_t(-1));
  options bad;
  bad.cost.fixed = 1.0;
  EXPECT_THROW(validate(bad), certattn::error);
  bad = {};
  bad.cost.per_key = 0.0;
  EXPECT_THROW(validate(bad), certattn::error);
  bad = {};
  bad.cost.give_up = 0.9;
  EXPECT_THROW(validate(bad), certattn::error);
  bad = {};
  bad.route = routing(7);
  EXPECT_THROW(validate(bad), certattn::error);
}

struct flat_case {
  synthetic::kv_cache cache;
  strided_kv<half> kv;
  key_index idx;
  std::vector<half> kmat, vmat;
};

flat_case make_case(synthetic::regime r, std::size_t n, std::size_t d) {
  synthetic::cache_config cfg;
  cfg.n_tokens = n;
  cfg.head_dim = d;
  cfg.kind = r;
  cfg.seed = 77;
  flat_case c{synthetic::make_cache(cfg), {}, key_index(d), {}, {}};
  c.kv = strided_kv<half>(c.cache.key_row(0, 0), c.cache.value_row(0, 0), n, d, d, d);
  c.idx.build(c.kv);
  test::gather_head<half>(c.kv, c.kmat, c.vmat);
  return c;
}

// A flat group: the first call's heads outgrow their budgets and are answered exactly;
// the history then routes the next 4 calls to the dense kernel (exact, certified, every
// row read once for the group), then probes; the reference agrees on every call.
TEST(Routing, FlatGroupIsRoutedToTheDenseKernelAndProbed) {
  const std::size_t n = 16384, d = 128, G = 4;
  flat_case c = make_case(synthetic::regime::kUniform, n, d);
  options opt;
  opt.seed = 3;
  // The model's schedule, independent of timing (measured costs: the next test and the
  // bench, docs/bench.md "Routing on measured costs").
  opt.cost.measured = false;
  group_history history(G);
  std::vector<std::string> paths;
  for (std::uint64_t step = 0; step < 11; ++step) {
    const std::vector<float> q = synthetic::make_queries(c.cache, 0, G, step);
    const group_history before = history;
    const noise_key nk{step, 1, 0};
    const test::group_run run = test::run_group(c.kv, c.idx, q, G, opt, nk, &history);
    const std::string diff = test::compare_with_reference(
        make_matrix_view(c.kmat.data(), n, d), make_matrix_view(c.vmat.data(), n, d), c.idx, q, G,
        opt, nk, run, &before);
    ASSERT_TRUE(diff.empty()) << "step " << step << ": " << diff;
    // The call's answer: every head routed, or the sparse path with some heads exact.
    paths.push_back(run.stats.routed == G         ? "routed"
                    : run.stats.over_budget > 0   ? "over_budget"
                                                  : "sparse");
    if (run.certs[0].path == answer_path::kRouted) {
      EXPECT_EQ(run.stats.routed, G);
      EXPECT_EQ(run.stats.keys_read, n);
      EXPECT_EQ(run.stats.bytes_read, run.stats.dense_bytes);
      for (std::size_t g = 0; g < G; ++g) {
        EXPECT_TRUE(run.certs[g].certified && run.certs[g].exact);
        // The float kernel's rounding bound (rounding.hpp): small, not 0.
        EXPECT_GT(run.certs[g].bound, 0.0);
        EXPECT_LE(run.certs[g].bound, opt.epsilon);
        const auto ex = exact_attention(std::span<const float>(q.data() + g * d, d),
                                        make_matrix_view(c.kmat.data(), n, d),
                                        make_matrix_view(c.vmat.data(), n, d));
        for (std::size_t i = 0; i < d; ++i)
          ASSERT_NEAR(run.out[g * d + i], ex.output[i], 1e-5 * std::max(1.0, ex.output_norm));
      }
    }
  }
  // sparse (lost), 4 routed, probe (lost), 8 routed... the first 11 calls:
  const std::vector<std::string> expected{"over_budget", "routed", "routed", "routed", "routed",
                                          "over_budget", "routed", "routed", "routed", "routed",
                                          "routed"};
  EXPECT_EQ(paths, expected);
  // The lost probe doubled the wait, or set it by its loss (kProbeLossShare).
  EXPECT_EQ(history.probe_interval(),
            std::max(2 * group_history::kFirstProbeInterval,
                     group_history::probe_wait_after_loss(history.last_cost())));
  EXPECT_TRUE(std::isnan(history.dense_seconds_per_token())) << "cost.measured off: untimed";
}

// The cost model's prediction decides only until the group has timed both paths (with
// measured costs, never: the first call is the dense probe): a history that measured a
// dense pass routes on the sparse calls' measured time against it.
TEST(Routing, MeasuredCostReplacesThePrediction) {
  group_history h(2);
  const std::vector<int> levels{3, 4};
  h.record_sparse(1.8, levels, noise_key{0, 0, 0});
  h.record_sparse(1.8, levels, noise_key{1, 0, 0});
  options o, model_only;
  model_only.cost.measured = false;
  ASSERT_TRUE(h.routes_dense(model_only)) << "the model's prediction: routed";
  EXPECT_TRUE(std::isnan(h.measured_cost(1.0, 1000)));
  h.record_dense(2e-3, 1000);  // the first timed dense pass: 2 us per token
  EXPECT_DOUBLE_EQ(h.dense_seconds_per_token(), 2e-6);
  EXPECT_FALSE(h.routes_dense(o)) << "a quick probe follows the first timed dense call";
  EXPECT_TRUE(std::isnan(h.cost_estimate())) << "the predictions' estimate is dropped";
  EXPECT_DOUBLE_EQ(h.measured_cost(1e-3, 1000), 0.5);
  h.record_sparse(h.measured_cost(1e-3, 1000), levels, noise_key{3, 0, 0});  // it won
  EXPECT_FALSE(h.routes_dense(o));
  EXPECT_DOUBLE_EQ(h.cost_estimate(), 0.5);
  // The dense time is a running mean (each pass weighs 1/4), each pass clamped to within a
  // factor 2 of it: it follows the machine's speed, and one slowed pass moves it little.
  group_history m(2);
  m.record_dense(2e-3, 1000);
  m.record_dense(8e-3, 1000);  // slowed 4 times: counted as 2 times
  EXPECT_DOUBLE_EQ(m.dense_seconds_per_token(), 2.5e-6);
  m.record_dense(1e-3, 1000);  // faster: counted as half the mean
  EXPECT_DOUBLE_EQ(m.dense_seconds_per_token(), 2.5e-6 - 0.25 * 1.25e-6);
  for (int k = 0; k < 40; ++k) m.record_dense(3e-3, 1000);  // the machine slowed down
  EXPECT_NEAR(m.dense_seconds_per_token(), 3e-6, 1e-10);
  // A quick probe that loses (alone: above 1.54, kCostSpread) waits the first wait without
  // doubling it, or longer: what keeps probing within kProbeLossShare of the dense time.
  group_history l(2);
  l.record_dense(2e-3, 1000);
  ASSERT_FALSE(l.routes_dense(o));
  l.record_sparse(2.2, levels, noise_key{2, 0, 0});
  EXPECT_EQ(l.probe_interval(), group_history::probe_wait_after_loss(2.2));
  EXPECT_GT(l.probe_interval(), 2 * group_history::kFirstProbeInterval);
  EXPECT_TRUE(l.routes_dense(o));
  group_history near(2);
  near.record_dense(2e-3, 1000);
  near.record_sparse(1.1, levels, noise_key{2, 0, 0});
  EXPECT_FALSE(near.routes_dense(o)) << "one call of 1.1: within one call's spread";
  group_history flat(2);
  flat.record_dense(2e-3, 1000);
  flat.record_sparse(4.0, levels, noise_key{2, 0, 0});
  EXPECT_EQ(flat.probe_interval(), 60u) << "(4 - 1) / 0.05 calls";
  EXPECT_EQ(group_history::probe_wait_after_loss(0.5), 0u);
  EXPECT_EQ(group_history::probe_wait_after_loss(std::numeric_limits<double>::quiet_NaN()), 0u);
  EXPECT_EQ(group_history::probe_wait_after_loss(1e300), group_history::kMaxProbeInterval);
  flat.reset();
  EXPECT_TRUE(std::isnan(flat.dense_seconds_per_token()));
  EXPECT_EQ(flat.probe_interval(), group_history::kFirstProbeInterval);
}

// With measured costs, a group's first call times its dense kernel (the dense probe), and
// its second is a quick sparse probe, after which its measured costs decide: the cost
// model's constants never route it. Once per sequence; an untimed dense call counts as
// the probe too, so that a failed clock cannot route a group for good.
TEST(GroupHistory, TimesTheDenseKernelOnItsFirstCall) {
  options o;  // cost.measured on (the default)
  const std::vector<int> levels{3, 4};
  group_history h(2);
  EXPECT_TRUE(h.dense_probe_due(o));
  EXPECT_TRUE(h.routes_dense(o)) << "the first call times the dense kernel";
  options model_only = o;
  model_only.cost.measured = false;
  EXPECT_FALSE(h.routes_dense(model_only)) << "no probe without measured costs";
  options off = o;
  off.route = routing::kOff;
  EXPECT_FALSE(h.routes_dense(off));
  h.record_dense(2e-3, 1000);  // the dense probe
  EXPECT_FALSE(h.dense_probe_due(o));
  EXPECT_FALSE(h.routes_dense(o)) << "the quick sparse probe";
  EXPECT_FALSE(h.has_hints()) << "a routed call leaves no levels";
  h.record_sparse(h.measured_cost(4.4e-3, 1000), levels, noise_key{1, 0, 0});  // lost
  EXPECT_DOUBLE_EQ(h.cost_estimate(), 2.2);
  EXPECT_TRUE(h.routes_dense(o)) << "measured: the sparse path costs more here";
  EXPECT_EQ(h.probe_interval(), group_history::probe_wait_after_loss(2.2));
  for (std::uint32_t k = 0; k < h.probe_interval(); ++k) h.record_dense(3e-3, 1000);
  EXPECT_FALSE(h.routes_dense(o)) << "the next probe";
  h.record_sparse(h.measured_cost(1e-3, 1000), levels, noise_key{6, 0, 0});  // won
  EXPECT_FALSE(h.routes_dense(o));
  EXPECT_FALSE(h.dense_probe_due(o)) << "once per sequence";
  // A sequence's histories: after reset() the probe is due again.
  h.reset();
  EXPECT_TRUE(h.routes_dense(o));
  h.record_dense();  // untimed: still the probe, never repeated
  EXPECT_FALSE(h.dense_probe_due(o));
  EXPECT_FALSE(h.routes_dense(o));
  h.record_sparse(0.3, levels, noise_key{2, 0, 0});
  EXPECT_FALSE(h.routes_dense(o));
}

// The sample budget follows the measured costs: a history whose sparse calls measured
// below the model's predictions scales the model's costs down (a larger budget), one
// whose calls measured above them scales them up; the reference, given the history,
// spends the same budget.
TEST(Routing, MeasuredCostsScaleTheSampleBudget) {
  const std::vector<int> levels{3, 4};
  options o;
  group_history h(2);
  EXPECT_TRUE(std::isnan(h.cost_scale()));
  EXPECT_EQ(h.sample_budget(o, 32768), sample_budget(o, 32768)) << "nothing measured yet";
  h.record_sparse(0.9, levels, noise_key{0, 0, 0});  // a prediction: no ratio
  EXPECT_TRUE(std::isnan(h.cost_scale()));
  h.record_sparse(0.5, levels, noise_key{1, 0, 0}, 1.0);  // measured at half the prediction
  EXPECT_DOUBLE_EQ(h.cost_scale(), 0.5);
  EXPECT_EQ(h.sample_budget(o, 32768), std::size_t((2.0 - 0.3) * 32768 / 3.2));
  EXPECT_EQ(sample_budget(o, 32768, 0.5), h.sample_budget(o, 32768));
  h.record_sparse(2.0, levels, noise_key{2, 0, 0}, 1.0);  // each new ratio weighs 1/4
  EXPECT_DOUBLE_EQ(h.cost_scale(), 0.875);
  h.record_sparse(500.0, levels, noise_key{3, 0, 0}, 1.0);  // clamped to 8
  EXPECT_DOUBLE_EQ(h.cost_scale(), 0.75 * 0.875 + 0.25 * group_history::kMaxCostScale);
  EXPECT_LT(h.sample_budget(o, 32768), sample_budget(o, 32768)) << "slower than the model";
  options model_only = o;
  model_only.cost.measured = false;
  EXPECT_EQ(h.sample_budget(model_only, 32768), sample_budget(o, 32768));
  options off = o;
  off.route = routing::kOff;
  EXPECT_EQ(h.sample_budget(off, 32768), std::size_t(-1));
  h.reset();
  EXPECT_TRUE(std::isnan(h.cost_scale()));

  // A flat group outgrows the model's budget; with the budget of a machine measured 8
  // times faster than the model its heads are sampled, and the reference agrees.
  const std::size_t n = 16384, d = 128, G = 4;
  flat_case c = make_case(synthetic::regime::kUniform, n, d);
  options opt;
  opt.seed = 3;
  const std::vector<float> q = synthetic::make_queries(c.cache, 0, G, 5);
  const noise_key nk{5, 1, 0};
  group_history model(G), fast(G);
  model.record_sparse(0.9, std::vector<int>(G, -1), noise_key{4, 1, 0});
  fast.record_sparse(0.1, std::vector<int>(G, -1), noise_key{4, 1, 0}, 1.0);
  ASSERT_DOUBLE_EQ(fast.cost_scale(), group_history::kMinCostScale);
  for (group_history* hist : {&model, &fast}) hist->record_dense();  // the dense probe made
  for (group_history* hist : {&model, &fast}) {
    const group_history before = *hist;
    const test::group_run run = test::run_group(c.kv, c.idx, q, G, opt, nk, hist);
    const std::string diff = test::compare_with_reference(
        make_matrix_view(c.kmat.data(), n, d), make_matrix_view(c.vmat.data(), n, d), c.idx, q,
        G, opt, nk, run, &before);
    ASSERT_TRUE(diff.empty()) << diff;
    if (hist == &model) {
      EXPECT_GT(run.stats.over_budget, 0u) << "the model's budget: some heads exact";
    } else {
      EXPECT_EQ(run.stats.over_budget, 0u) << "the measured budget: every head sampled";
      EXPECT_GT(run.stats.sampled, sample_budget(opt, n)) << "beyond the model's budget";
    }
  }
}

// A focused group stays on the sparse path: no head reaches its budget, the history's
// cost stays below 1 and never routes (the model's costs: measured ones depend on the
// machine's timing; the dense probe they add is tested above).
TEST(Routing, FocusedGroupStaysSparse) {
  const std::size_t n = 16384, d = 128, G = 4;
  flat_case c = make_case(synthetic::regime::kExtreme, n, d);
  options opt;
  opt.cost.measured = false;
  group_history history(G);
  for (std::uint64_t step = 0; step < 6; ++step) {
    const std::vector<float> q = synthetic::make_queries(c.cache, 0, G, step);
    const test::group_run run = test::run_group(c.kv, c.idx, q, G, opt, {step, 0, 0}, &history);
    for (std::size_t g = 0; g < G; ++g)
      ASSERT_EQ(run.certs[g].path, answer_path::kSampled) << "step " << step << " head " << g;
    ASSERT_LT(history.last_cost(), 1.0);
    ASSERT_FALSE(history.routes_dense(opt));
  }
}

// The bounded worst case, in the cost model's units (the dense kernel = 1): with routing
// no call of any regime is predicted to cost more than give_up + 1.5 dense kernels (the
// budget spent, one level's overshoot, then one dense pass), and no call reads more than
// twice its bytes. Without routing the flat regimes cost more than that, which shows the
// bound is not vacuous.
TEST(Routing, NoCallCostsMuchMoreThanTheDenseKernel) {
  const std::size_t n = 16384, d = 128, G = 4;
  double worst_off = 0.0;
  for (int r = 0; r <= int(synthetic::regime::kMixed); ++r) {
    flat_case c = make_case(synthetic::regime(r), n, d);
    for (routing route : {routing::kAuto, routing::kOff}) {
      options opt;
      opt.route = route;
      // The model's costs: the bound is in its units, and measured ones would make the
      // budget (and this test) depend on the machine's timing.
      opt.cost.measured = false;
      group_history history(G);
      double worst = 0.0, worst_bytes = 0.0;
      for (std::uint64_t step = 0; step < 6; ++step) {
        const std::vector<float> q = synthetic::make_queries(c.cache, 0, G, step);
        const test::group_run run = test::run_group(c.kv, c.idx, q, G, opt, {step, 0, 0}, &history);
        const bool exact_pass = run.stats.routed + run.stats.over_budget + run.stats.fallbacks > 0;
        const double cost = run.stats.routed == G ? 1.0
                                                  : opt.cost.predicted(run.stats.sampled, n) + exact_pass;
        worst = std::max(worst, cost);
        worst_bytes = std::max(worst_bytes, double(run.stats.bytes_read) / double(run.stats.dense_bytes));
      }
      std::printf("[ cost    ] %-17s routing %-4s worst call: predicted %.2fx dense, %.2fx its bytes\n",
                  std::string(synthetic::to_string(synthetic::regime(r))).c_str(),
                  std::string(to_string(route)).c_str(), worst, worst_bytes);
      if (route == routing::kAuto) {
        EXPECT_LE(worst, opt.cost.give_up + 1.5) << synthetic::to_string(synthetic::regime(r));
        EXPECT_LE(worst_bytes, 2.0) << synthetic::to_string(synthetic::regime(r));
      } else {
        worst_off = std::max(worst_off, worst);
      }
    }
  }
  EXPECT_GT(worst_off, options{}.cost.give_up + 1.5) << "without routing some regime should exceed the bound";
}

TEST(Routing, HistoryOfAnotherGroupSizeIsRefused) {
  const std::size_t n = 256, d = 16;
  flat_case c = make_case(synthetic::regime::kMixed, n, d);
  attend_workspace ws(4, d, n);
  group_history history(2);
  std::vector<float> q(4 * d, 0.5f), out(4 * d);
  std::vector<certificate> certs(4);
  try {
    attend_group(std::span<const float>(q), 4, c.kv, c.idx, {0, 0, 0}, options{},
                 std::span<float>(out), std::span<certificate>(certs), ws, history);
    FAIL() << "expected certattn::error";
  } catch (const certattn::error& e) {
    EXPECT_NE(std::string(e.what()).find("history"), std::string::npos) << e.what();
  }
}

}  // namespace

namespace {
// The oracles also take the kv_view of the call they check (rows gathered): the same
// results as over the matrices.
TEST(Oracles, TakeTheCallsKvView) {
  const std::size_t n = 3000, d = 64, G = 2;
  flat_case c = make_case(synthetic::regime::kMixed, n, d);
  const std::vector<float> q = synthetic::make_queries(c.cache, 0, G, 4);
  options opt;
  opt.seed = 9;
  group_history history(G);
  reference_extras extras{c.idx.value_center(), c.idx.value_cap(), c.idx.reach_floor()};
  extras.history = &history;
  const auto a = reference_attend_group(std::span<const float>(q), G, c.kv, opt, {4, 0, 0}, extras);
  const auto b = reference_attend_group(std::span<const float>(q), G, make_matrix_view(c.kmat.data(), n, d),
                                        make_matrix_view(c.vmat.data(), n, d), opt, {4, 0, 0}, extras);
  for (std::size_t g = 0; g < G; ++g) {
    EXPECT_EQ(a[g].output, b[g].output);
    EXPECT_EQ(a[g].cert.level, b[g].cert.level);
    const auto ea = exact_attention(std::span<const float>(q.data() + g * d, d), c.kv);
    const auto eb = exact_attention(std::span<const float>(q.data() + g * d, d),
                                    make_matrix_view(c.kmat.data(), n, d), make_matrix_view(c.vmat.data(), n, d));
    EXPECT_EQ(ea.output, eb.output);
    EXPECT_EQ(ea.denominator, eb.denominator);
  }
}
}  // namespace
