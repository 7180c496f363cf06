// The probe probability of each call, from a label-free signal the call already produced
// (for a certified call beta / epsilon, for a selection method the estimated dropped
// attention mass). Spending probes where errors are likely shrinks the HT variance at
// equal cost; the floor p_min keeps every weight 1/p_t bounded, which the confidence
// sequences need (docs/monitor.md).
#pragma once

#include <certattn/common.hpp>

#include <algorithm>
#include <cmath>
#include <string>

namespace certattn {

struct scheduler_options {
  double target_rate = 0.05;   // mean probe probability aimed for = dense calls per call
  double p_min = 0.01;         // floor of every p_t (> 0): the HT weights stay <= 1/p_min
  double p_max = 1.0;          // ceiling of every p_t
  double exponent = 0.5;       // p_t ~ (signal + signal_offset)^exponent; 0 = fixed p_t
  double signal_offset = 1e-3; // keeps zero-signal calls comparable to weak-signal ones
  double adapt_rate = 1e-3;    // step of the running mean that normalises the signal
};

inline void validate(const scheduler_options& o) {
  if (!(o.p_min > 0.0 && o.p_min <= 1.0))
    throw error("scheduler_options.p_min must be in (0, 1], got " + std::to_string(o.p_min));
  if (!(o.p_max >= o.p_min && o.p_max <= 1.0))
    throw error("scheduler_options.p_max must be in [p_min, 1], got " +
                std::to_string(o.p_max));
  if (!(o.target_rate >= o.p_min && o.target_rate <= o.p_max))
    throw error("scheduler_options.target_rate must be in [p_min, p_max], got " +
                std::to_string(o.target_rate));
  if (!(o.exponent >= 0.0 && std::isfinite(o.exponent)))
    throw error("scheduler_options.exponent must be finite and >= 0, got " +
                std::to_string(o.exponent));
  if (!(o.signal_offset > 0.0 && std::isfinite(o.signal_offset)))
    throw error("scheduler_options.signal_offset must be finite and > 0, got " +
                std::to_string(o.signal_offset));
  if (!(o.adapt_rate > 0.0 && o.adapt_rate <= 1.0))
    throw error("scheduler_options.adapt_rate must be in (0, 1], got " +
                std::to_string(o.adapt_rate));
}

/// p_t = clamp(target_rate * w_t / wbar, p_min, p_max) with w_t = (signal + offset)^exponent
/// and wbar a running mean of past w (updated after use). The square root (exponent 1/2)
/// is the Neyman allocation when the signal is proportional to the exceedance probability:
/// it minimises sum x_t (1 - p_t) / p_t at a fixed sum of p_t. The normaliser keeps the
/// mean cost near target_rate whatever the signal's scale, and is predictable: p_t depends
/// on the past and on call t's own signal, never on its coin or its error.
class probe_scheduler {
 public:
  explicit probe_scheduler(const scheduler_options& o = {}) : opt_(o) { validate(opt_); }

  /// Precondition: signal finite and >= 0 (the monitor checks it).
  double probability(double signal) noexcept {
    if (opt_.exponent == 0.0) return std::clamp(opt_.target_rate, opt_.p_min, opt_.p_max);
    const double w = std::pow(signal + opt_.signal_offset, opt_.exponent);
    if (!(mean_w_ > 0.0)) mean_w_ = w;
    const double p = std::clamp(opt_.target_rate * w / mean_w_, opt_.p_min, opt_.p_max);
    mean_w_ += opt_.adapt_rate * (w - mean_w_);
    return p;
  }

  double p_min() const noexcept { return opt_.p_min; }
  const scheduler_options& options() const noexcept { return opt_; }

 private:
  scheduler_options opt_;
  double mean_w_ = 0.0;
};

}  // namespace certattn
