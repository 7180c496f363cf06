// Prints the coverage tables of docs/monitor.md ("Measured coverage and width"): every
// estimator x {i.i.d., bursty} x {fixed, adaptive probing} at T = 10^4 (1000 streams) and
// T = 10^5 (200 streams), for heavy (target 0.30, p_min 0.10) and light (0.05, 0.01)
// probing. Miss rates are fractions of streams; upper and width are means at t = T.
// About 7 minutes in a Release build on 2 shared cores:
//   build/release/tests/certattn_monitor_coverage_table
#include <cstdio>
#include <string>
#include <utility>

#include "../support/monitor_streams.hpp"

int main() {
  using namespace certattn::test::monitor_streams;
  std::printf("| probing (target, p_min) | T | streams | regime | probing | estimator | miss "
              "upper | miss lower | miss either | mean upper | mean width | true rate | cost "
              "|\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (auto [target, p_min] : {std::pair{0.3, 0.1}, std::pair{0.05, 0.01}}) {
    for (auto [horizon, streams] : {std::pair{std::uint64_t(10000), 1000},
                                    std::pair{std::uint64_t(100000), 200}}) {
      for (regime g : {regime::kIid, regime::kBursty}) {
        for (bool adaptive : {false, true}) {
          const misses m = run_cell({.g = g, .adaptive = adaptive, .horizon = horizon,
                                     .streams = streams, .target = target, .p_min = p_min,
                                     .betting_grid = 128, .seed = 77});
          for (std::size_t e = 0; e < 3; ++e)
            std::printf("| %.2f, %.2f | %llu | %d | %s | %s | %s | %.3f | %.3f | %.3f | %.4f | "
                        "%.4f | %.4f | %.4f |\n",
                        target, p_min, static_cast<unsigned long long>(horizon), streams,
                        g == regime::kIid ? "iid" : "bursty", adaptive ? "adaptive" : "fixed",
                        std::string(certattn::to_string(kEstimators[e])).c_str(),
                        double(m.upper[e]) / streams, double(m.lower[e]) / streams,
                        double(m.either[e]) / streams, m.mean_upper[e], m.mean_width[e],
                        m.mean_rate, m.mean_cost);
          std::fflush(stdout);
        }
      }
    }
  }
}
