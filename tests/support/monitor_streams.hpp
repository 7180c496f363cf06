// Simulated streams for the monitor's coverage: calls with a latent risk, i.i.d. or with
// bursty drift, probed at a fixed or adaptive rate, and one "cell" (many streams of one
// configuration) checked for misses at every step. Shared by tests/test_monitor_coverage.cpp
// and the table tool tests/tools/monitor_coverage_table.cpp (docs/monitor.md).
#pragma once

#include <certattn/monitor/monitor.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <random>

namespace certattn::test::monitor_streams {

using certattn::cs_estimator;
using certattn::fidelity_monitor;
using certattn::monitor_options;

constexpr double kAlpha = 0.05;
constexpr int kStreams = 1000;
constexpr std::array<cs_estimator, 3> kEstimators = {
    cs_estimator::kHoeffding, cs_estimator::kEmpiricalBernstein, cs_estimator::kBetting};

// ---------------------------------------------------------------- simulated streams
//
// Each call has a latent risk r and exceeds epsilon with probability r; its label-free
// signal is r times log-normal noise (a noisy but informative predictor, like beta/epsilon
// or the dropped attention mass).
//   calm:  5% of calls are hard (r = 0.4), the rest r = 0.01     (rate ~ 0.03)
//   burst: every call degrades to r = 0.9                         (rate   0.9)
// i.i.d. streams stay calm. Bursty streams are a Markov chain of phases, calm -> burst
// with probability 4/T per call and burst -> calm with 12/T, starting calm: a few sharp
// phase transitions per stream at random times, the fidelity cliff switching on and off.
enum class regime { kIid, kBursty };

struct call {
  bool exceeded;
  double signal;
};

class stream {
 public:
  stream(regime g, std::uint64_t horizon, std::uint64_t seed)
      : g_(g), up_(4.0 / double(horizon)), down_(12.0 / double(horizon)), rng_(seed) {}

  call next() {
    if (g_ == regime::kBursty) burst_ = burst_ ? !(u_(rng_) < down_) : u_(rng_) < up_;
    double r;
    if (burst_) r = 0.9;
    else r = u_(rng_) < 0.05 ? 0.4 : 0.01;
    const bool x = u_(rng_) < r;
    return {x, r * std::exp(0.5 * n_(rng_))};
  }
  bool in_burst() const noexcept { return burst_; }

 private:
  regime g_;
  double up_, down_;
  bool burst_ = false;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> u_{0.0, 1.0};
  std::normal_distribution<double> n_{0.0, 1.0};
};

// Probing: fixed p = target, or adaptive p ~ sqrt(signal) normalised to mean target, both
// with a floor p_min. The tests use target 0.3, p_min 0.1 (HT weights <= 10).
struct cell_config {
  regime g = regime::kIid;
  bool adaptive = false;
  std::uint64_t horizon = 3000;
  int streams = kStreams;
  double target = 0.3;
  double p_min = 0.1;
  std::size_t betting_grid = 64;
  std::uint64_t seed = 1;
};

inline monitor_options make_options(const cell_config& c, std::uint64_t seed) {
  monitor_options o;
  o.alpha = kAlpha;
  o.scheduler.target_rate = c.target;
  o.scheduler.p_min = c.p_min;
  o.scheduler.exponent = c.adaptive ? 0.5 : 0.0;
  o.track_betting = true;
  o.betting_grid = c.betting_grid;
  o.seed = seed;
  return o;
}

struct misses {
  std::array<int, 3> upper{};  // streams where rate_t > upper_t at some t
  std::array<int, 3> lower{};  // streams where rate_t < lower_t at some t
  std::array<int, 3> either{};
  std::array<double, 3> mean_upper{}, mean_width{};  // at t = T
  double mean_rate = 0.0, mean_cost = 0.0;
};

inline misses run_cell(const cell_config& c) {
  misses m;
  for (int s = 0; s < c.streams; ++s) {
    const std::uint64_t seed = c.seed + 7919 * std::uint64_t(s);
    fidelity_monitor mon(make_options(c, seed));
    stream st(c.g, c.horizon, seed ^ 0x5bd1e995ULL);
    std::array<bool, 3> hi{}, lo{};
    std::uint64_t sum_x = 0;
    for (std::uint64_t t = 1; t <= c.horizon; ++t) {
      const call x = st.next();
      sum_x += x.exceeded;
      if (mon.decide(t, x.signal).selected()) mon.observe(t, x.exceeded);
      const double rate = double(sum_x) / double(t);
      for (std::size_t e = 0; e < 3; ++e) {
        const auto b = mon.statement(kAlpha, kEstimators[e]);
        hi[e] = hi[e] || rate > b.upper_bound;
        lo[e] = lo[e] || rate < b.lower_bound;
        if (t == c.horizon) {
          m.mean_upper[e] += b.upper_bound / c.streams;
          m.mean_width[e] += (b.upper_bound - b.lower_bound) / c.streams;
          if (e == 0) m.mean_cost += b.cost / c.streams;
        }
      }
    }
    m.mean_rate += double(sum_x) / double(c.horizon) / c.streams;
    for (std::size_t e = 0; e < 3; ++e) {
      m.upper[e] += hi[e];
      m.lower[e] += lo[e];
      m.either[e] += hi[e] || lo[e];
    }
  }
  return m;
}

}  // namespace certattn::test::monitor_streams
