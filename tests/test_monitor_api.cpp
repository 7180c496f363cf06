// The monitor's API and its deterministic properties: names, bad input, the exact
// limits (p = 1), the conservative accounting of open / abandoned / shed probes, the
// elastic state machine, the stitched boundary, reproducible coins, and no allocation in
// steady state. Coverage itself is tested in test_monitor_coverage.cpp.
#include <certattn/monitor/monitor.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <new>
#include <random>
#include <string>

#include "support/stats.hpp"

// Counts heap allocations while armed, to check the steady state allocates nothing.
namespace {
std::atomic<bool> g_count_allocs{false};
std::atomic<long> g_allocs{0};
}  // namespace

void* operator new(std::size_t n) {
  if (g_count_allocs.load(std::memory_order_relaxed)) g_allocs.fetch_add(1);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

using certattn::confidence_sequence;
using certattn::cs_estimator;
using certattn::cs_options;
using certattn::fidelity_monitor;
using certattn::monitor_options;
using certattn::probe_action;
using certattn::scheduler_options;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr std::array<cs_estimator, 3> kAll = {
    cs_estimator::kHoeffding, cs_estimator::kEmpiricalBernstein, cs_estimator::kBetting};

// Expects certattn::error whose message names `arg`.
void expect_error(const std::function<void()>& f, const std::string& arg) {
  try {
    f();
    ADD_FAILURE() << "no certattn::error (expected one naming '" << arg << "')";
  } catch (const certattn::error& e) {
    EXPECT_NE(std::string(e.what()).find(arg), std::string::npos)
        << "message '" << e.what() << "' does not name '" << arg << "'";
  }
}

TEST(MonitorApi, Names) {
  for (cs_estimator e : kAll)
    EXPECT_EQ(certattn::cs_estimator_from_string(certattn::to_string(e)), e);
  EXPECT_EQ(certattn::cs_estimator_from_string("eb"), cs_estimator::kEmpiricalBernstein);
  expect_error([] { certattn::cs_estimator_from_string("bernstein"); }, "cs_estimator");
  EXPECT_EQ(certattn::to_string(probe_action::kNone), "none");
  EXPECT_EQ(certattn::to_string(probe_action::kProbeNow), "probe_now");
  EXPECT_EQ(certattn::to_string(probe_action::kDefer), "defer");
  EXPECT_EQ(certattn::to_string(probe_action::kSkip), "skip");
  EXPECT_TRUE(certattn::is_drift_safe(cs_estimator::kHoeffding));
  EXPECT_TRUE(certattn::is_drift_safe(cs_estimator::kEmpiricalBernstein));
  EXPECT_FALSE(certattn::is_drift_safe(cs_estimator::kBetting));
}

TEST(MonitorApi, DefaultIsDriftSafe) {
  EXPECT_EQ(monitor_options{}.estimator, cs_estimator::kEmpiricalBernstein);
  EXPECT_TRUE(certattn::is_drift_safe(monitor_options{}.estimator));
}

TEST(MonitorApi, BadOptionsThrow) {
  for (double p : {0.0, -0.1, 1.5, kNaN})
    expect_error([p] { confidence_sequence cs(cs_options{.p_min = p}); }, "p_min");
  for (double a : {0.0, 1.0, -1.0, kNaN})
    expect_error([a] { confidence_sequence cs(cs_options{.alpha = a}); }, "alpha");
  expect_error([] { confidence_sequence cs(cs_options{.betting = true, .betting_grid = 1}); },
               "betting_grid");

  auto sched = [](auto edit) {
    scheduler_options o;
    edit(o);
    certattn::probe_scheduler s(o);
  };
  for (double p : {0.0, -1.0, 2.0, kNaN})
    expect_error([&] { sched([p](scheduler_options& o) { o.p_min = p; }); }, "p_min");
  expect_error([&] { sched([](scheduler_options& o) { o.p_max = 0.001; }); }, "p_max");
  expect_error([&] { sched([](scheduler_options& o) { o.p_max = 1.5; }); }, "p_max");
  for (double t : {0.001, 1.5, kNaN})
    expect_error([&] { sched([t](scheduler_options& o) { o.target_rate = t; }); },
                 "target_rate");
  for (double x : {-0.5, kNaN, kInf})
    expect_error([&] { sched([x](scheduler_options& o) { o.exponent = x; }); }, "exponent");
  expect_error([&] { sched([](scheduler_options& o) { o.signal_offset = 0.0; }); },
               "signal_offset");
  for (double r : {0.0, 1.5, kNaN})
    expect_error([&] { sched([r](scheduler_options& o) { o.adapt_rate = r; }); },
                 "adapt_rate");

  auto mon = [](auto edit) {
    monitor_options o;
    edit(o);
    fidelity_monitor m(o);
  };
  for (double a : {0.0, 1.0, kNaN})
    expect_error([&] { mon([a](monitor_options& o) { o.alpha = a; }); }, "alpha");
  for (double e : {-0.1, kNaN, kInf})
    expect_error([&] { mon([e](monitor_options& o) { o.epsilon = e; }); }, "epsilon");
  expect_error([&] { mon([](monitor_options& o) { o.max_pending = 0; }); }, "max_pending");
  expect_error([&] { mon([](monitor_options& o) { o.throttle_backlog = 1.5; }); },
               "throttle_backlog");
  expect_error([&] { mon([](monitor_options& o) { o.scheduler.p_min = 0.0; }); }, "p_min");
  expect_error(
      [&] {
        mon([](monitor_options& o) {
          o.estimator = cs_estimator::kBetting;
          o.betting_grid = 1;
        });
      },
      "betting_grid");
}

TEST(MonitorApi, BadCallInputThrows) {
  monitor_options o;
  o.scheduler.p_min = 0.05;
  fidelity_monitor m(o);
  for (double s : {kNaN, -1.0, kInf})
    expect_error([&] { m.decide(1, s); }, "signal");
  for (double p : {0.0, 0.01, 1.5, -0.5, kNaN})
    expect_error([&] { m.decide_with_probability(1, p); }, "p must be in");
  for (double b : {-1.0, kNaN}) expect_error([&] { m.begin_step(b); }, "inline_budget");
  for (double a : {0.0, 1.0, -0.5, 2.0, kNaN}) {
    expect_error([&] { m.statement(a); }, "alpha");
    expect_error([&] { m.sequences().bounds(cs_estimator::kHoeffding, a); }, "alpha");
  }
  expect_error([&] { m.statement(0.05, cs_estimator::kBetting); }, "betting");
  expect_error([&] { m.observe(12345, true); }, "call_id 12345");
  expect_error([&] { m.drop(12345); }, "call_id 12345");
  ASSERT_EQ(m.decide_with_probability(7, 1.0).action, probe_action::kProbeNow);
  expect_error([&] { m.decide_with_probability(7, 1.0); }, "call_id 7");
  m.observe(7, false);
  expect_error([&] { m.observe(7, false); }, "call_id 7");  // already observed
  // A call that threw is not counted; the monitor stays usable.
  EXPECT_EQ(m.statement().calls, 1u);
}

// With every call probed (p = 1) the statement is exact, whatever the estimator.
TEST(MonitorApi, FullProbingIsExact) {
  monitor_options o;
  o.track_betting = true;
  fidelity_monitor m(o);
  std::mt19937_64 rng(5);
  int exceed = 0;
  for (int t = 0; t < 500; ++t) {
    const bool x = rng() % 7 == 0;
    exceed += x;
    ASSERT_EQ(m.decide_with_probability(t, 1.0).action, probe_action::kProbeNow);
    m.observe(t, x);
  }
  for (cs_estimator e : kAll) {
    const auto s = m.statement(0.05, e);
    EXPECT_DOUBLE_EQ(s.upper_bound, exceed / 500.0) << certattn::to_string(e);
    EXPECT_DOUBLE_EQ(s.lower_bound, exceed / 500.0) << certattn::to_string(e);
    EXPECT_DOUBLE_EQ(s.point_estimate, exceed / 500.0);
    EXPECT_DOUBLE_EQ(s.cost, 1.0);
  }
}

// A ticket opened and closed at once is the same observation as add().
TEST(MonitorApi, TicketsMatchInOrderAdds) {
  cs_options co{.p_min = 0.05, .alpha = 0.05, .betting = true, .betting_grid = 64};
  confidence_sequence a(co), b(co);
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int t = 0; t < 3000; ++t) {
    const double p = 0.05 + 0.95 * u(rng) * u(rng);
    const bool probed = u(rng) < p;
    const double x = u(rng) < 0.2 ? 1.0 : 0.0;
    a.add(p, probed, x);
    if (probed) b.close(b.open(p), x);
    else b.add(p, false);
  }
  for (cs_estimator e : kAll) {
    const auto ba = a.bounds(e, 0.05), bb = b.bounds(e, 0.05);
    EXPECT_NEAR(ba.upper, bb.upper, 1e-9) << certattn::to_string(e);
    EXPECT_NEAR(ba.lower, bb.lower, 1e-9) << certattn::to_string(e);
    EXPECT_NEAR(ba.point, bb.point, 1e-12);
  }
}

// While open, a probe counts as its worst case; abandoned, it stays so for good.
TEST(MonitorApi, OpenAndAbandonedProbesAreWorstCase) {
  cs_options co{.p_min = 0.05, .alpha = 0.05, .betting = true, .betting_grid = 128};
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  confidence_sequence base(co);
  for (int t = 0; t < 2000; ++t) {
    const double p = 0.05 + 0.5 * u(rng);
    base.add(p, u(rng) < p, u(rng) < 0.1 ? 1.0 : 0.0);
  }
  for (double p : {0.05, 0.2, 1.0}) {
    confidence_sequence open = base, as1 = base, as0 = base, dropped = base;
    const auto t = open.open(p);
    as1.close(as1.open(p), 1.0);
    as0.close(as0.open(p), 0.0);
    const auto td = dropped.open(p);
    const auto before_drop = dropped.bounds(cs_estimator::kEmpiricalBernstein, 0.05);
    dropped.abandon(td);
    for (cs_estimator e : kAll) {
      const auto bo = open.bounds(e, 0.05), b1 = as1.bounds(e, 0.05), b0 = as0.bounds(e, 0.05);
      EXPECT_GE(bo.upper, std::max(b1.upper, b0.upper) - 1e-12) << certattn::to_string(e);
      EXPECT_LE(bo.lower, std::min(b1.lower, b0.lower) + 1e-12) << certattn::to_string(e);
      const auto bd = dropped.bounds(e, 0.05);
      EXPECT_NEAR(bd.upper, bo.upper, 1e-12) << certattn::to_string(e);
      EXPECT_NEAR(bd.lower, bo.lower, 1e-12) << certattn::to_string(e);
    }
    const auto after_drop = dropped.bounds(cs_estimator::kEmpiricalBernstein, 0.05);
    EXPECT_DOUBLE_EQ(after_drop.upper, before_drop.upper);
    EXPECT_DOUBLE_EQ(after_drop.lower, before_drop.lower);
    (void)t;
  }
}

// An unmonitored call may have exceeded: it raises the upper bound by 1/T's worth and
// never raises the lower bound.
TEST(MonitorApi, UnmonitoredCallsCountAsExceedances) {
  confidence_sequence cs(cs_options{.p_min = 0.1});
  for (int t = 0; t < 5000; ++t) cs.add(0.2, t % 5 == 0, t % 50 == 0 ? 1.0 : 0.0);
  const auto b = cs.bounds(cs_estimator::kEmpiricalBernstein, 0.05);
  cs.add_unmonitored(500);
  const auto s = cs.bounds(cs_estimator::kEmpiricalBernstein, 0.05);
  EXPECT_NEAR(s.upper, (b.upper * 5000 + 500) / 5500.0, 1e-12);
  EXPECT_NEAR(s.lower, b.lower * 5000 / 5500.0, 1e-12);
  EXPECT_EQ(cs.unmonitored(), 500u);
}

// The windowed scan of the stitched boundary equals the full scan (its minimum lies in the
// window), and the boundary costs a bounded factor over a fixed-time bound.
TEST(MonitorApi, StitchedBoundary) {
  namespace dm = certattn::detail::monitor;
  // The union bound over slopes: the levels alpha w_k must add up to at most alpha.
  auto total_weight = [](const auto& g) {
    double w = 0.0;
    for (double l : g.log_iw) w += std::exp(-l);
    return w;
  };
  EXPECT_LE(total_weight(dm::gauss_grid()), 1.0 + 1e-12);
  EXPECT_LE(total_weight(dm::exp_grid()), 1.0 + 1e-12);
  for (double alpha : {0.5, 0.05, 1e-3, 1e-9}) {
    const double l = std::log(1.0 / alpha);
    for (double v = 1e-9; v < 1e17; v *= 1.13) {
      EXPECT_EQ(dm::stitched_boundary(dm::gauss_grid(), v, l),
                dm::stitched_boundary_full(dm::gauss_grid(), v, l));
      EXPECT_EQ(dm::stitched_boundary(dm::exp_grid(), v, l),
                dm::stitched_boundary_full(dm::exp_grid(), v, l));
    }
    for (double v = 10.0; v < 1e12; v *= 10.0) {
      // Never below the fixed-time Gaussian bound sqrt(2 V log(1/alpha)) (no free lunch),
      // and within a log log factor of it.
      const double fixed = std::sqrt(2.0 * v * l);
      const double g = dm::stitched_boundary(dm::gauss_grid(), v, l);
      const double e = dm::stitched_boundary(dm::exp_grid(), v, l);
      EXPECT_GE(g, fixed);
      EXPECT_GE(e, fixed);
      EXPECT_LE(g, fixed * std::sqrt(1.0 + (1.5 + 1.4 * std::log(std::log2(v) + 20.0)) / l));
    }
  }
}

TEST(MonitorApi, ElasticStateMachine) {
  monitor_options o;
  o.scheduler.p_min = 0.1;
  o.scheduler.target_rate = 0.5;
  o.scheduler.exponent = 0.0;
  o.max_pending = 8;
  o.throttle_backlog = 0.5;  // throttle at 4 deferred
  fidelity_monitor m(o);
  m.begin_step(1.0);
  std::uint64_t id = 0, now = 0, deferred = 0, skipped = 0, throttled = 0;
  std::vector<std::uint64_t> open_ids;
  while (skipped == 0) {
    const bool throttling = m.deferred() >= 4;  // from here on p drops to the floor
    const auto d = m.decide(++id, 1.0);
    if (d.action == probe_action::kSkip) {
      ++skipped;
      EXPECT_EQ(d.p, 0.0);
      break;
    }
    EXPECT_DOUBLE_EQ(d.p, throttling ? 0.1 : 0.5);
    throttled += throttling;
    now += d.action == probe_action::kProbeNow;
    deferred += d.action == probe_action::kDefer;
    if (d.selected()) open_ids.push_back(id);
    ASSERT_LT(id, 100000u);
  }
  EXPECT_EQ(now, 1u);  // the budget of one inline probe
  EXPECT_GT(deferred, 0u);
  EXPECT_GT(throttled, 0u);
  EXPECT_EQ(m.pending(), 8u);
  // Drain: observe half, drop the rest.
  for (std::size_t i = 0; i < open_ids.size(); ++i) {
    if (i % 2) m.observe(open_ids[i], false);
    else m.drop(open_ids[i]);
  }
  const auto s = m.statement();
  EXPECT_EQ(s.pending, 0u);
  EXPECT_EQ(s.probes, 4u);
  EXPECT_EQ(s.dropped, 4u);
  EXPECT_EQ(s.skipped, skipped);
  EXPECT_EQ(s.calls, id);
  EXPECT_DOUBLE_EQ(s.cost, 4.0 / double(id));
  // After draining the monitor selects again.
  m.begin_step(kInf);
  bool selected = false;
  for (int k = 0; k < 200 && !selected; ++k) selected = m.decide(++id, 1.0).selected();
  EXPECT_TRUE(selected);
}

TEST(MonitorApi, StatementSentence) {
  monitor_options o;
  o.epsilon = 0.05;
  fidelity_monitor m(o);
  for (std::uint64_t t = 0; t < 1000; ++t)
    if (m.decide(t, 0.1).selected()) m.observe(t, t % 100 == 0);
  const std::string s = certattn::to_string(m.statement());
  for (const char* part : {"after 1000 calls and ", " probes: at most ",
                           "% of calls exceeded epsilon = 0.05, at 95% confidence, at ",
                           "% extra cost (empirical_bernstein; lower bound "})
    EXPECT_NE(s.find(part), std::string::npos) << s << "\n  missing: " << part;
}

// The coins: reproducible from the seed, and Bernoulli(p). Binomial test at 1e-6 each side
// (false-failure probability 2e-6).
TEST(MonitorApi, CoinsAreReproducibleAndFair) {
  monitor_options o;
  o.scheduler.p_min = 0.01;
  o.seed = 99;
  fidelity_monitor a(o), b(o);
  o.seed = 100;
  fidelity_monitor c(o);
  constexpr int n = 200000;
  int hits = 0, same = 0;
  for (int t = 0; t < n; ++t) {
    const bool ha = a.decide_with_probability(t, 0.3).selected();
    const bool hb = b.decide_with_probability(t, 0.3).selected();
    const bool hc = c.decide_with_probability(t, 0.3).selected();
    EXPECT_EQ(ha, hb);
    hits += ha;
    same += ha == hc;
    if (ha) a.observe(t, false);
    if (hb) b.observe(t, false);
    if (hc) c.observe(t, false);
  }
  EXPECT_LT(same, n - 1000);  // another seed, other coins
  const std::size_t hi = certattn::test::binomial_upper_critical(n, 0.3, 1e-6);
  const std::size_t lo = n - certattn::test::binomial_upper_critical(n, 0.7, 1e-6);
  EXPECT_LE(std::size_t(hits), hi);
  EXPECT_GE(std::size_t(hits), lo);
}

TEST(MonitorApi, SchedulerFollowsSignalAndTarget) {
  scheduler_options so;
  so.target_rate = 0.1;
  so.p_min = 0.02;
  so.exponent = 0.5;
  certattn::probe_scheduler s(so);
  std::mt19937_64 rng(1);
  std::exponential_distribution<double> sig(20.0);
  double sum = 0.0;
  constexpr int n = 100000;
  for (int t = 0; t < n; ++t) {
    const double p = s.probability(sig(rng));
    ASSERT_GE(p, so.p_min);
    ASSERT_LE(p, so.p_max);
    sum += p;
  }
  EXPECT_NEAR(sum / n, 0.1, 0.02);  // the floor lifts the mean a little above the target
  // Riskier calls get more probes (normaliser barely moves between the two).
  EXPECT_LT(s.probability(0.001), s.probability(0.5));
  so.exponent = 0.0;
  certattn::probe_scheduler fixed(so);
  EXPECT_DOUBLE_EQ(fixed.probability(123.0), 0.1);
}

TEST(MonitorApi, SteadyStateAllocatesNothing) {
  for (cs_estimator e : kAll) {
    monitor_options o;
    o.estimator = e;
    o.scheduler.p_min = 0.01;
    fidelity_monitor m(o);
    std::mt19937_64 rng(2);
    auto run = [&](int n, std::uint64_t base) {
      for (int t = 0; t < n; ++t) {
        m.begin_step(t % 3 == 0 ? 0.0 : 2.0);
        const std::uint64_t id = base + std::uint64_t(t);
        const auto d = m.decide(id, double(rng() % 100) / 100.0);
        if (d.selected()) {
          if (t % 5 == 0) m.drop(id);
          else m.observe(id, rng() % 10 == 0);
        }
        const auto s = m.statement();
        ASSERT_LE(s.lower_bound, 1.0);
      }
    };
    run(1000, 0);  // warm-up: the slope grids' first use
    g_allocs = 0;
    g_count_allocs = true;
    run(20000, 1000000);
    g_count_allocs = false;
    EXPECT_EQ(g_allocs.load(), 0) << certattn::to_string(e);
  }
}

}  // namespace
