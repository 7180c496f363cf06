// What the certified call of one (layer, KV head) carries from one decoding step to the
// next (docs/integration.md, "Routing"): the level each query head stopped at, which the
// tight certificate spends most of delta around, and whether the sparse path lost to the
// dense kernel, which routes the next calls to the dense kernel. A level hint is valid only
// if it was fixed before the perturbations it is used with were drawn: the history keeps
// the noise key of the calls that produced its hints and hands them out only to a strictly
// later step of the same (layer, KV head, sequence), whose perturbations are independent
// of theirs; any other call (a retried or repeated step, a step back after a truncation,
// another layer or sequence) gets no hints, i.e. the uniform split of delta. Routing only
// chooses exact answers, each certified by its own rounding bound whatever chose it; with
// measured costs (the default) a group's first call times the dense kernel, and routing
// decides on this machine's costs from its second call on.
#pragma once

#include <certattn/common.hpp>
#include <certattn/options.hpp>
#include <certattn/perturb.hpp>

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
  /// doubling while the probes keep losing, at most kMaxProbeInterval, and never fewer than
  /// probe_wait_after_loss() of the losing probe's cost.
  static constexpr std::uint32_t kFirstProbeInterval = 4;
  static constexpr std::uint32_t kMaxProbeInterval = 64;
  /// The least weight of a sparse call's cost in cost_estimate(): the estimate is the
  /// plain mean of the first calls, then a running mean in which each new cost weighs
  /// 1/8. It follows the mean cost of calls whose costs vary widely from step to step (a
  /// head's sample changes with its query: in the synthetic mixed regime at 16K one
  /// group's calls cost from 0.25 to 2.4 dense kernels, most of them below 1) rather than
  /// the last two.
  static constexpr double kNewCostWeight = 0.125;
  /// How far above 1 the estimate must be, in units of itself times its standard error,
  /// for routing to take a sparse group to the dense kernel (loses_to_dense()). One call's
  /// cost varies around its group's mean by about 0.47 of that mean (a standard deviation
  /// over the 8 groups of the synthetic mixed regime at 32K, 152 calls): routing on the
  /// plain estimate sent groups that cost 0.65 dense kernels on average to the dense
  /// kernel after a costly call or two. With this margin a group routes after one call of
  /// more than 1.54 dense kernels, two averaging more than 1.33, or a settled running mean
  /// above 1.10; a routed group stays routed while its estimate exceeds 1 (hysteresis: a
  /// probe near its group's cost does not send it back to the sparse path).
  static constexpr double kCostSpread = 0.35;

  group_history() = default;
  explicit group_history(std::size_t group) : levels_(group, -1) {
    if (group == 0) throw error("group_history: group must be > 0");
  }

  std::size_t group() const noexcept { return levels_.size(); }
  /// The level each head stopped at in the last sparse call (-1: none yet, or exact).
  std::span<const int> levels() const noexcept { return levels_; }
  /// Whether levels() came from calls of this history (false before the first sparse
  /// call and after reset()), and the noise key of the latest of them: its layer, KV head
  /// and sequence, and the largest step among the calls that produced levels().
  bool has_hints() const noexcept { return has_key_; }
  const noise_key& hint_key() const noexcept { return key_; }
  /// The level hints a call with noise key `nk` may use: levels() when they were produced
  /// at steps strictly before nk.step of the same (layer, KV head, sequence), so that they
  /// are independent of nk's perturbations; empty (no hints: the uniform split) otherwise.
  std::span<const int> hints_for(const noise_key& nk) const noexcept {
    if (!has_key_ || nk.layer != key_.layer || nk.kv_head != key_.kv_head ||
        nk.sequence != key_.sequence || !(nk.step > key_.step))
      return {};
    return levels_;
  }
  /// The last sparse call's cost relative to the dense kernel: its measured time against
  /// this group's measured dense kernel once a routed call has been timed
  /// (measured_cost()), else the cost model's prediction (options::cost; a head answered
  /// exactly adds 1); NaN before the first sparse call.
  double last_cost() const noexcept { return cost_; }
  /// What routing decides on: a weighted mean of the sparse calls' costs (the plain mean
  /// of the first calls, older calls fading once there are more than 8: kNewCostWeight).
  /// A probe after k routed calls weighs at least 1 - (7/8)^k, as if the estimate had
  /// faded over the calls it did not see, so that a group whose attention changed is
  /// re-estimated within a probe or two. NaN before the first sparse call, and again
  /// from the first timed dense pass until the quick probe (measured costs replace the
  /// cost model's predictions).
  double cost_estimate() const noexcept { return estimate_; }
  /// The sum of the squared weights of the costs in cost_estimate() (1/n for the plain
  /// mean of n calls, 1/15 for the running mean): its variance relative to one call's.
  double estimate_weight_sq() const noexcept { return estimate_weight_sq_; }
  /// Whether the sparse path loses to the dense kernel with some confidence:
  /// estimate (1 - kCostSpread sqrt(estimate_weight_sq())) > 1 (the estimate's relative
  /// standard error is about 0.47 sqrt(estimate_weight_sq()); kCostSpread).
  bool loses_to_dense() const noexcept {
    return estimate_ * (1.0 - kCostSpread * std::sqrt(estimate_weight_sq_)) > 1.0;
  }
  /// Whether the group is routed between probes: it became so when loses_to_dense() held
  /// after a sparse call, and stays so while cost_estimate() exceeds 1.
  bool routed() const noexcept { return routed_; }
  /// Dense calls since the last sparse one, and how many the next probe waits for.
  std::uint32_t dense_streak() const noexcept { return dense_streak_; }
  std::uint32_t probe_interval() const noexcept { return probe_interval_; }

  /// The dense kernel's time per token on this group as measured here (seconds; NaN
  /// before the first routed call): the first routed call's dense pass, then a running
  /// mean in which each new pass weighs kNewDenseWeight, clamped to within a factor 2 of
  /// the mean. A running mean, because the sparse calls it prices run now: on a shared
  /// machine both paths slow down and speed up together (a Zen 5 guest's dense pass went
  /// from 1.35 to 1.9 ms within one bench run), and the fastest pass ever seen made every
  /// later sparse call look up to 1.4 times its cost and routed groups that were winning.
  /// Clamped, so that one pass slowed by a page fault or a preemption moves it by at
  /// most a quarter.
  double dense_seconds_per_token() const noexcept { return dense_spt_; }
  static constexpr double kNewDenseWeight = 0.25;
  /// The cost of a sparse call that took `seconds` over `tokens`, relative to this group's
  /// measured dense kernel: what routing records instead of the cost model's prediction
  /// once a dense call has been timed (options::cost.measured). NaN before that.
  double measured_cost(double seconds, std::size_t tokens) const noexcept {
    return dense_spt_ > 0.0 && tokens > 0 ? seconds / (dense_spt_ * double(tokens))
                                          : std::numeric_limits<double>::quiet_NaN();
  }

  /// How much the sparse calls' measured costs exceed the cost model's predictions of
  /// them on this group (below 1: this machine is faster than the model says): a running
  /// mean of measured / predicted over the timed sparse calls (each new ratio weighs 1/4),
  /// each ratio clamped to [kMinCostScale, kMaxCostScale]; NaN before the first.
  double cost_scale() const noexcept { return cost_scale_; }
  static constexpr double kMinCostScale = 0.125, kMaxCostScale = 8.0;
  /// The sample budget of this group's next call: sample_budget() with the model's costs
  /// scaled by cost_scale() once it is known and options.cost.measured is on, so that the
  /// call stops where its measured cost, not the model's guess, reaches give_up dense
  /// kernels (the budget of a G = 8 group, whose dense kernel costs more per token than
  /// the model's G = 4, or of a machine faster than the one the model was fitted on).
  std::size_t sample_budget(const options& o, std::size_t tokens) const noexcept {
    return o.cost.measured && !std::isnan(cost_scale_)
               ? certattn::sample_budget(o, tokens, cost_scale_)
               : certattn::sample_budget(o, tokens);
  }

  /// The decision of the next call: the dense kernel for the whole group. True for the
  /// group's first call (the dense probe, dense_probe_due()), and when the group is
  /// routed() (its sparse path loses to the dense kernel) and the next probe is not due.
  /// The first timed dense call is followed at once by a sparse call (the quick probe), so
  /// that with measured costs the group routes on this machine's costs from its second
  /// call on.
  bool routes_dense(const options& o) const noexcept {
    if (o.route != routing::kAuto) return false;
    return dense_probe_due(o) ||
           (routed_ && dense_streak_ < probe_interval_ && !quick_probe_due_);
  }
  /// True when the next call goes to the dense kernel only to time it: with measured costs
  /// (options::cost.measured), the first call of the group (of the sequence, after
  /// reset()). Without it routing would start from the cost model's prediction, fitted on
  /// another machine: a group the prediction keeps below 1 would never time its dense
  /// kernel and the constants would route it for the whole sequence (on a machine with more
  /// read bandwidth per core than the model's, the dense kernel is faster and the sparse
  /// path's fixed cost a larger part of it), and a group the prediction routes would pay a
  /// sparse call more before its costs are measured. One dense call per group and
  /// sequence; the next call is the quick probe.
  bool dense_probe_due(const options& o) const noexcept {
    return o.route == routing::kAuto && o.cost.measured && !dense_called_;
  }
  /// What probing may cost a routed group: a probe that loses costs (cost - 1) dense
  /// kernels, so the next one waits at least (cost - 1) / kProbeLossShare calls (at most
  /// kMaxProbeInterval). A group whose sparse path costs 4 dense kernels is probed every
  /// 60 calls instead of every 8, 16, 32; one near 1 keeps the doubling wait.
  static constexpr double kProbeLossShare = 0.05;
  static std::uint32_t probe_wait_after_loss(double cost) noexcept {
    const double wait = std::ceil((cost - 1.0) / kProbeLossShare);
    if (!(wait > 0.0)) return 0;  // a probe that did not lose (or a NaN cost)
    return wait >= double(kMaxProbeInterval) ? kMaxProbeInterval : std::uint32_t(wait);
  }

  /// Forget everything (a new sequence in the same slot).
  void reset() noexcept {
    std::fill(levels_.begin(), levels_.end(), -1);
    has_key_ = false;
    key_ = {};
    cost_ = estimate_ = std::numeric_limits<double>::quiet_NaN();
    estimate_weight_sq_ = 1.0;
    routed_ = false;
    dense_streak_ = 0;
    probe_interval_ = kFirstProbeInterval;
    dense_spt_ = std::numeric_limits<double>::quiet_NaN();
    quick_probe_due_ = false;
    dense_called_ = false;
    cost_scale_ = std::numeric_limits<double>::quiet_NaN();
  }

  /// Called by attend_group() after a sparse call with noise key `nk`: `cost` its measured
  /// or predicted cost (see last_cost()), `levels[g]` the level head g stopped at (-1 when
  /// answered exactly: its hint is kept). A call of another (layer, KV head, sequence)
  /// starts the hints afresh; one of the same keeps the largest step seen, so that no
  /// later hint goes to a step at or before any call that produced it. `predicted`: the
  /// cost model's prediction of the same call when `cost` was measured (it updates
  /// cost_scale()); NaN when `cost` is the prediction itself.
  void record_sparse(double cost, std::span<const int> levels, const noise_key& nk,
                     double predicted = std::numeric_limits<double>::quiet_NaN()) noexcept {
    if (predicted > 0.0 && std::isfinite(predicted) && cost > 0.0 && std::isfinite(cost)) {
      const double r = std::clamp(cost / predicted, kMinCostScale, kMaxCostScale);
      cost_scale_ = std::isnan(cost_scale_) ? r : 0.75 * cost_scale_ + 0.25 * r;
    }
    const bool probe = dense_streak_ > 0, quick = quick_probe_due_;
    quick_probe_due_ = false;
    const bool same = has_key_ && nk.layer == key_.layer && nk.kv_head == key_.kv_head &&
                      nk.sequence == key_.sequence;
    if (!same) std::fill(levels_.begin(), levels_.end(), -1);
    const std::uint64_t step = same ? std::max(key_.step, nk.step) : nk.step;
    key_ = nk;
    key_.step = step;
    has_key_ = true;
    for (std::size_t g = 0; g < levels_.size() && g < levels.size(); ++g)
      if (levels[g] >= 0) levels_[g] = levels[g];
    // The plain mean of the first calls (weight S / (1 + S) = 1 / (n + 1) after n calls),
    // then a running mean; a probe weighs as much as the routed calls before it would
    // have faded the estimate.
    if (std::isnan(estimate_)) {
      estimate_ = cost;
      estimate_weight_sq_ = 1.0;
    } else {
      const double S = estimate_weight_sq_;
      double w = std::max(kNewCostWeight, S / (1.0 + S));
      if (probe) w = std::max(w, 1.0 - std::pow(1.0 - kNewCostWeight, double(dense_streak_)));
      estimate_ += w * (cost - estimate_);
      estimate_weight_sq_ = (1.0 - w) * (1.0 - w) * S + w * w;
    }
    // A probe that lost: the wait doubles (a quick probe keeps the first wait), and is at
    // least what keeps probing within kProbeLossShare of the dense time.
    routed_ = routed_ ? estimate_ > 1.0 : loses_to_dense();
    if (routed_ && probe)
      probe_interval_ = std::max(quick ? probe_interval_ : std::min(kMaxProbeInterval, 2 * probe_interval_),
                                 probe_wait_after_loss(cost));
    else if (!routed_)
      probe_interval_ = kFirstProbeInterval;
    cost_ = cost;
    dense_streak_ = 0;
  }
  /// Called by attend_group() after a call routed to the dense kernel.
  void record_dense() noexcept {
    dense_called_ = true;
    if (dense_streak_ < std::numeric_limits<std::uint32_t>::max()) ++dense_streak_;
  }
  /// The same, with the dense pass's measured time over `tokens` tokens.
  void record_dense(double seconds, std::size_t tokens) noexcept {
    record_dense();
    if (!(seconds > 0.0) || !std::isfinite(seconds) || tokens == 0) return;
    const double spt = seconds / double(tokens);
    if (std::isnan(dense_spt_)) {
      // The first timed dense pass: the sparse calls are measured from the quick probe on,
      // and the estimate restarts from it (not from the cost model's predictions).
      quick_probe_due_ = true;
      estimate_ = std::numeric_limits<double>::quiet_NaN();
      estimate_weight_sq_ = 1.0;
      routed_ = false;
    }
    dense_spt_ = std::isnan(dense_spt_)
                     ? spt
                     : dense_spt_ + kNewDenseWeight *
                                        (std::clamp(spt, 0.5 * dense_spt_, 2.0 * dense_spt_) - dense_spt_);
  }

 private:
  std::vector<int> levels_;
  noise_key key_{};
  bool has_key_ = false;
  double cost_ = std::numeric_limits<double>::quiet_NaN();
  double estimate_ = std::numeric_limits<double>::quiet_NaN();
  double estimate_weight_sq_ = 1.0;  // estimate_weight_sq()
  bool routed_ = false;              // routed()
  std::uint32_t dense_streak_ = 0;
  std::uint32_t probe_interval_ = kFirstProbeInterval;
  double dense_spt_ = std::numeric_limits<double>::quiet_NaN();
  bool quick_probe_due_ = false;
  bool dense_called_ = false;  // a call of this sequence went to the dense kernel
  double cost_scale_ = std::numeric_limits<double>::quiet_NaN();
};

}  // namespace certattn
