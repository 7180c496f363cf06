// The runtime fidelity monitor of one live request (or any stream of attention calls):
// decides which calls get a dense probe, takes the probes' outcomes whenever the engine
// gets to them, and states "at most U of the calls exceeded epsilon, at confidence
// 1 - alpha, at cost P/T dense calls per call" for any method, certified or not.
#pragma once

#include <certattn/common.hpp>
#include <certattn/monitor/confidence_sequence.hpp>
#include <certattn/monitor/probe_scheduler.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace certattn {

/// What the engine does with a call.
enum class probe_action : std::uint8_t {
  kNone,      // not selected: nothing to do (the call still counts, with weight 0)
  kProbeNow,  // compute the dense output on the identical state now, then observe()
  kDefer,     // selected, but this step's inline budget is spent: keep the call's state
              // (query, cache length), compute the dense output later, then observe();
              // or give up with drop() (counted as an exceedance, so the bound stays valid)
  kSkip,      // shed under load (p = 0): not monitored; counted as an exceedance in the
              // upper bound, so overload widens the bound instead of biasing it
};

inline std::string_view to_string(probe_action a) noexcept {
  switch (a) {
    case probe_action::kNone: return "none";
    case probe_action::kProbeNow: return "probe_now";
    case probe_action::kDefer: return "defer";
    case probe_action::kSkip: return "skip";
  }
  return "?";
}

struct probe_decision {
  probe_action action = probe_action::kNone;
  double p = 0.0;  // the probability this call was put up for probing with (0 when shed)

  bool selected() const noexcept {
    return action == probe_action::kProbeNow || action == probe_action::kDefer;
  }
};

struct monitor_options {
  cs_estimator estimator = cs_estimator::kEmpiricalBernstein;  // of statement()
  double alpha = 0.05;          // statement() holds with probability >= 1 - alpha
  double epsilon = 0.0;         // the engine's error threshold; only quoted in to_string
  scheduler_options scheduler{};
  std::size_t max_pending = 256;    // open probes (inline in flight + deferred); when full,
                                    // further calls are shed (kSkip)
  double throttle_backlog = 0.5;    // deferred probes >= this fraction of max_pending:
                                    // p_t drops to p_min until the backlog drains
  bool track_betting = false;       // keep the betting sequence even when not the default
  std::size_t betting_grid = 256;
  std::uint64_t seed = 0x6a09e667f3bcc909ULL;  // of the probe coins
};

inline void validate(const monitor_options& o) {
  if (!(o.alpha > 0.0 && o.alpha < 1.0))
    throw error("monitor_options.alpha must be in (0, 1), got " + std::to_string(o.alpha));
  if (!(o.epsilon >= 0.0 && std::isfinite(o.epsilon)))
    throw error("monitor_options.epsilon must be finite and >= 0, got " +
                std::to_string(o.epsilon));
  validate(o.scheduler);
  if (o.max_pending < 1) throw error("monitor_options.max_pending must be >= 1");
  if (!(o.throttle_backlog >= 0.0 && o.throttle_backlog <= 1.0))
    throw error("monitor_options.throttle_backlog must be in [0, 1], got " +
                std::to_string(o.throttle_backlog));
  if ((o.track_betting || o.estimator == cs_estimator::kBetting) && o.betting_grid < 2)
    throw error("monitor_options.betting_grid must be >= 2, got " +
                std::to_string(o.betting_grid));
}

/// The monitor's statement after T calls.
struct fidelity_statement {
  std::uint64_t calls = 0;     // T: calls decided
  std::uint64_t probes = 0;    // P: dense probes computed and observed
  std::uint64_t pending = 0;   // probes selected, outcome not yet observed
  std::uint64_t dropped = 0;   // deferred probes given up (counted as exceedances)
  std::uint64_t skipped = 0;   // calls shed under load (counted as exceedances)
  double upper_bound = 1.0;    // rate of calls with error > epsilon <= upper, prob >= 1 - alpha
  double lower_bound = 0.0;    // rate >= lower, prob >= 1 - alpha (both: >= 1 - 2 alpha)
  double point_estimate = 0.0; // HT estimate of the rate (no guarantee)
  double cost = 0.0;           // P / T: dense calls per call
  double alpha = 0.05;
  double epsilon = 0.0;
  cs_estimator estimator = cs_estimator::kEmpiricalBernstein;
};

/// "after T calls and P probes: at most U% of calls exceeded epsilon, at 95% confidence, at
/// C% extra cost (...)".
inline std::string to_string(const fidelity_statement& s) {
  char eps[48] = "epsilon";
  if (s.epsilon > 0.0) std::snprintf(eps, sizeof eps, "epsilon = %g", s.epsilon);
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "after %llu calls and %llu probes: at most %.3g%% of calls exceeded %s, at "
                "%.4g%% confidence, at %.3g%% extra cost (%s; lower bound %.3g%%, point "
                "estimate %.3g%%; %llu pending, %llu dropped, %llu skipped)",
                static_cast<unsigned long long>(s.calls),
                static_cast<unsigned long long>(s.probes), 100.0 * s.upper_bound, eps,
                100.0 * (1.0 - s.alpha), 100.0 * s.cost,
                std::string(to_string(s.estimator)).c_str(), 100.0 * s.lower_bound,
                100.0 * s.point_estimate, static_cast<unsigned long long>(s.pending),
                static_cast<unsigned long long>(s.dropped),
                static_cast<unsigned long long>(s.skipped));
  return buf;
}

namespace detail::monitor {
/// SplitMix64 on the call counter: the coins depend on the seed and on how many calls came
/// before, never on the call id (ids may repeat) nor on anything the call computed.
inline double coin_uniform(std::uint64_t seed, std::uint64_t counter) noexcept {
  std::uint64_t x = seed + (counter + 1) * 0x9e3779b97f4a7c15ULL;
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return double(x >> 11) * 0x1p-53;  // [0, 1): p = 1 always selects
}
}  // namespace detail::monitor

/// Usage, per attention call (single-threaded, like a call of the library):
///
///     auto d = mon.decide(call_id, signal);          // before or right after the sparse call
///     if (d.action == certattn::probe_action::kProbeNow)
///       mon.observe(call_id, dense_error(call) > eps);
///     else if (d.action == certattn::probe_action::kDefer)
///       engine_queue.push(call_id, state_snapshot);  // later: observe() or drop()
///
/// and at each decoding step `mon.begin_step(slack)` with the dense calls the engine can
/// afford inline this step (default: unlimited). The decision p_t, the load state and the
/// coin are all fixed before the call's error is looked at, which is what keeps the HT
/// weights correct however p_t moves. Steady state allocates nothing: the pending table is
/// reserved at construction.
class fidelity_monitor {
 public:
  explicit fidelity_monitor(const monitor_options& o = {})
      : opt_(o), sched_((validate(o), o.scheduler)), cs_(make_cs_options(o)) {
    pending_.reserve(opt_.max_pending);
    throttle_at_ = std::size_t(std::ceil(opt_.throttle_backlog * double(opt_.max_pending)));
  }

  const monitor_options& options() const noexcept { return opt_; }

  /// Dense calls the engine can run inline from now until the next begin_step (>= 0,
  /// infinity = unlimited, the default). Selected calls beyond it are deferred.
  void begin_step(double inline_budget) {
    if (!(inline_budget >= 0.0))
      throw error("fidelity_monitor::begin_step: inline_budget must be >= 0, got " +
                  std::to_string(inline_budget));
    budget_ = inline_budget;
  }

  /// Decide call `call_id` from its label-free signal (finite, >= 0; larger = riskier).
  probe_decision decide(std::uint64_t call_id, double signal) {
    if (!(signal >= 0.0 && std::isfinite(signal)))
      throw error("fidelity_monitor::decide: signal must be finite and >= 0, got " +
                  std::to_string(signal));
    return place(call_id, sched_.probability(signal));
  }

  /// Decide with the engine's own probability p in [p_min, 1] (its own policy).
  probe_decision decide_with_probability(std::uint64_t call_id, double p) {
    if (!(p >= opt_.scheduler.p_min && p <= 1.0))
      throw error("fidelity_monitor::decide_with_probability: p must be in [p_min, 1] = [" +
                  std::to_string(opt_.scheduler.p_min) + ", 1], got " + std::to_string(p));
    return place(call_id, p);
  }

  /// The outcome of a selected call (kProbeNow or kDefer): did its error exceed epsilon on
  /// the state the call saw?
  void observe(std::uint64_t call_id, bool exceeded) {
    const std::size_t i = find(call_id, "observe");
    cs_.close(pending_[i].ticket, exceeded ? 1.0 : 0.0);
    ++probes_;
    erase(i);
  }

  /// Give up a selected call's probe: it stays counted as an exceedance, for good.
  void drop(std::uint64_t call_id) {
    const std::size_t i = find(call_id, "drop");
    cs_.abandon(pending_[i].ticket);
    ++dropped_;
    erase(i);
  }

  fidelity_statement statement() const { return statement(opt_.alpha, opt_.estimator); }
  fidelity_statement statement(double alpha) const { return statement(alpha, opt_.estimator); }
  fidelity_statement statement(double alpha, cs_estimator e) const {
    const cs_bounds b = cs_.bounds(e, alpha);  // validates alpha and e
    fidelity_statement s;
    s.calls = cs_.calls();
    s.probes = probes_;
    s.pending = pending_.size();
    s.dropped = dropped_;
    s.skipped = skipped_;
    s.upper_bound = b.upper;
    s.lower_bound = b.lower;
    s.point_estimate = b.point;
    s.cost = s.calls > 0 ? double(probes_) / double(s.calls) : 0.0;
    s.alpha = alpha;
    s.epsilon = opt_.epsilon;
    s.estimator = e;
    return s;
  }

  std::size_t pending() const noexcept { return pending_.size(); }
  std::size_t deferred() const noexcept { return deferred_; }
  const confidence_sequence& sequences() const noexcept { return cs_; }

 private:
  struct open_probe {
    std::uint64_t call_id;
    cs_ticket ticket;
    bool deferred;
  };

  static cs_options make_cs_options(const monitor_options& o) {
    cs_options c;
    c.p_min = o.scheduler.p_min;
    c.alpha = o.alpha;
    c.betting = o.track_betting || o.estimator == cs_estimator::kBetting;
    c.betting_grid = o.betting_grid;
    return c;
  }

  probe_decision place(std::uint64_t call_id, double p) {
    // Load is read before the coin: shedding and throttling are functions of the past, so
    // p_t stays predictable and the HT weights unbiased.
    if (pending_.size() >= opt_.max_pending) {
      cs_.add_unmonitored();
      ++skipped_;
      return {probe_action::kSkip, 0.0};
    }
    if (deferred_ > 0 && deferred_ >= throttle_at_) p = opt_.scheduler.p_min;
    const bool hit = detail::monitor::coin_uniform(opt_.seed, counter_++) < p;
    if (!hit) {
      cs_.add(p, false);
      return {probe_action::kNone, p};
    }
    for (const open_probe& o : pending_)
      if (o.call_id == call_id)
        throw error("fidelity_monitor::decide: call_id " + std::to_string(call_id) +
                    " already has an open probe");
    const bool now = budget_ >= 1.0;
    if (now) budget_ -= 1.0;
    else ++deferred_;
    pending_.push_back({call_id, cs_.open(p), !now});
    return {now ? probe_action::kProbeNow : probe_action::kDefer, p};
  }

  std::size_t find(std::uint64_t call_id, const char* what) const {
    for (std::size_t i = 0; i < pending_.size(); ++i)
      if (pending_[i].call_id == call_id) return i;
    throw error(std::string("fidelity_monitor::") + what + ": call_id " +
                std::to_string(call_id) + " has no open probe");
  }
  void erase(std::size_t i) noexcept {
    if (pending_[i].deferred) --deferred_;
    pending_[i] = pending_.back();
    pending_.pop_back();
  }

  monitor_options opt_;
  probe_scheduler sched_;
  confidence_sequence cs_;
  std::vector<open_probe> pending_;
  std::size_t throttle_at_ = 0, deferred_ = 0;
  double budget_ = std::numeric_limits<double>::infinity();
  std::uint64_t counter_ = 0, probes_ = 0, dropped_ = 0, skipped_ = 0;
};

}  // namespace certattn
