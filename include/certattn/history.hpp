// What the certified call of one (layer, KV head) carries from one decoding step to the
// next (docs/integration.md, "Routing"): the level each query head stopped at, which the
// tight certificate spends most of delta around, and whether the sparse path lost to the
// dense kernel, which routes the next calls to the dense kernel. Everything here is fixed
// before a call draws its perturbations (they are fresh at every step), so no decision
// made from it can weaken a certificate: an exact answer is always valid.
#pragma once

#include <certattn/common.hpp>
#include <certattn/options.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace certattn {

/// One per (layer, KV head) and sequence, owned by the engine and passed to every
/// attend_group() call of that group; reset() (or a new object) for a new sequence. Not
/// thread-safe: one call at a time per object. Sized at construction: calls never
/// allocate.
class group_history {
 public:
  /// After a sparse call that lost, the dense calls before the next sparse probe: 4, then
  /// doubling while the probes keep losing, at most kMaxProbeInterval.
  static constexpr std::uint32_t kFirstProbeInterval = 4;
  static constexpr std::uint32_t kMaxProbeInterval = 64;

  group_history() = default;
  explicit group_history(std::size_t group) : levels_(group, -1) {
    if (group == 0) throw error("group_history: group must be > 0");
  }

  std::size_t group() const noexcept { return levels_.size(); }
  /// The level each head stopped at in the last sparse call (-1: none yet, or exact).
  std::span<const int> levels() const noexcept { return levels_; }
  /// The cost model's prediction for the last sparse call, relative to the dense kernel
  /// (options::cost; a head answered exactly adds 1); NaN before the first sparse call.
  double last_cost() const noexcept { return cost_; }
  /// What routing decides on: the mean of the last sparse call's cost and the estimate
  /// before it (halving the weight of older calls), restarted from a probe's cost. One
  /// flat call among focused ones does not route a group; two in a row do.
  double cost_estimate() const noexcept { return estimate_; }
  /// Dense calls since the last sparse one, and how many the next probe waits for.
  std::uint32_t dense_streak() const noexcept { return dense_streak_; }
  std::uint32_t probe_interval() const noexcept { return probe_interval_; }

  /// The decision of the next call: the dense kernel for the whole group. True when the
  /// sparse path's cost estimate exceeds the dense kernel's and the next probe is not due.
  bool routes_dense(const options& o) const noexcept {
    return o.route == routing::kAuto && estimate_ > 1.0 && dense_streak_ < probe_interval_;
  }

  /// Forget everything (a new sequence in the same slot).
  void reset() noexcept {
    std::fill(levels_.begin(), levels_.end(), -1);
    cost_ = estimate_ = std::numeric_limits<double>::quiet_NaN();
    dense_streak_ = 0;
    probe_interval_ = kFirstProbeInterval;
  }

  /// Called by attend_group() after a sparse call: `cost` its prediction (see last_cost()),
  /// `levels[g]` the level head g stopped at (-1 when answered exactly: its hint is kept).
  void record_sparse(double cost, std::span<const int> levels) noexcept {
    const bool probe = dense_streak_ > 0;
    for (std::size_t g = 0; g < levels_.size() && g < levels.size(); ++g)
      if (levels[g] >= 0) levels_[g] = levels[g];
    estimate_ = probe || std::isnan(estimate_) ? cost : 0.5 * (estimate_ + cost);
    if (estimate_ > 1.0 && probe)
      probe_interval_ = std::min(kMaxProbeInterval, 2 * probe_interval_);
    else if (!(estimate_ > 1.0))
      probe_interval_ = kFirstProbeInterval;
    cost_ = cost;
    dense_streak_ = 0;
  }
  /// Called by attend_group() after a call routed to the dense kernel.
  void record_dense() noexcept {
    if (dense_streak_ < std::numeric_limits<std::uint32_t>::max()) ++dense_streak_;
  }

 private:
  std::vector<int> levels_;
  double cost_ = std::numeric_limits<double>::quiet_NaN();
  double estimate_ = std::numeric_limits<double>::quiet_NaN();
  std::uint32_t dense_streak_ = 0;
  std::uint32_t probe_interval_ = kFirstProbeInterval;
};

}  // namespace certattn
