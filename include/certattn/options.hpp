// What a certified call is asked to achieve (options) and what it reports back
// (certificate), with the validation every entry point runs before touching data.
#pragma once

#include <certattn/common.hpp>
#include <certattn/variant.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace certattn {

/// The error measure a certificate is stated on (docs/certificate.md, event 7).
enum class error_scale {
  kDenominator,  // |D^ - D| <= epsilon * D
  kOutputNorm,   // ||o^ - o|| <= epsilon * ||o||
  kValueScale,   // ||o^ - o|| <= epsilon * M,  M^2 = sum_i a_i ||v_i||^2
};

inline std::string_view to_string(error_scale s) noexcept {
  switch (s) {
    case error_scale::kDenominator: return "denominator";
    case error_scale::kOutputNorm: return "output_norm";
    case error_scale::kValueScale: return "value_scale";
  }
  return "?";
}

inline error_scale error_scale_from_string(std::string_view s) {
  if (s == "denominator") return error_scale::kDenominator;
  if (s == "output_norm" || s == "output") return error_scale::kOutputNorm;
  if (s == "value_scale" || s == "value") return error_scale::kValueScale;
  throw error("error_scale: unknown name '" + std::string(s) +
              "' (expected denominator, output_norm or value_scale)");
}

/// Which certificate a call computes (docs/certificate.md). Both state the same guarantee,
/// P(certified and error > epsilon * scale) <= delta per call and head.
///   kTight    value-aware sampling (probability proportional to w_i rho_i), a
///             finite-population variance, a sample-based lower bound on the value scale,
///             and delta spent around a level hint: fewer keys for the same guarantee.
///   kClassic  the paper's certificate (docs/certificate.md): plain PPS, uniform delta over the
///             levels, value outliers read exactly. Kept to reproduce the paper's tables.
enum class certificate_kind { kTight, kClassic };

inline std::string_view to_string(certificate_kind k) noexcept {
  return k == certificate_kind::kTight ? "tight" : k == certificate_kind::kClassic ? "classic" : "?";
}

inline certificate_kind certificate_kind_from_string(std::string_view s) {
  if (s == "tight") return certificate_kind::kTight;
  if (s == "classic") return certificate_kind::kClassic;
  throw error("certificate: unknown name '" + std::string(s) + "' (expected tight or classic)");
}

/// Whether the certified call may answer a group with exact attention when the sparse
/// path would cost more than the dense kernel (docs/integration.md, "Routing").
///   kAuto  a head whose sample outgrows its budget (sample_budget()) is answered exactly,
///          and a group_history that saw the group lose routes its next calls to the dense
///          kernel, probing the sparse path again after 4, 8, ..., 64 dense calls
///   kOff   always the sparse path (the benches that study the certificate itself)
/// Exact answers are always valid, so routing never weakens a certificate.
enum class routing { kAuto, kOff };

inline std::string_view to_string(routing r) noexcept {
  return r == routing::kAuto ? "auto" : r == routing::kOff ? "off" : "?";
}

inline routing routing_from_string(std::string_view s) {
  if (s == "auto") return routing::kAuto;
  if (s == "off") return routing::kOff;
  throw error("routing: unknown name '" + std::string(s) + "' (expected auto or off)");
}

/// The time of a certified group call relative to the dense kernel on the same group,
/// predicted from the keys its heads sampled: fixed + per_key * sampled / tokens, where
/// `sampled` sums heavy and sampled light pool keys over the group's heads. `fixed` is the
/// share of the stages that read every pool key's 4-bit codes (scan, perturbation bounds,
/// max score); `per_key` the cost of one sampled key (candidate refinement, its exact key
/// and value rows, read at random positions) in units of one token of the dense kernel.
/// The defaults are a least-squares fit over ten regimes at 16K, 32K and 128K tokens,
/// G = 4, one thread (docs/bench.md, "Routing and the cost model");
/// `certattn-bench speed --fit-cost` fits them on another machine. `give_up` is the
/// predicted cost at which a call stops sampling (sample_budget()): a call then costs at
/// most about give_up + 1 dense kernels (the spent part, then one dense pass).
/// `measured`: once a group_history has timed a routed call's dense pass (its first call
/// goes to the dense kernel for that: group_history::dense_probe_due()), it routes on
/// the sparse calls' measured time against it instead of on the prediction, and scales the
/// sample budget by their measured / predicted ratio (group_history::sample_budget(); the
/// constants cannot be right on every machine; docs/integration.md, "Routing").
struct cost_model {
  double fixed = 0.6;
  double per_key = 6.4;
  double give_up = 2.0;
  bool measured = true;
  double predicted(std::size_t sampled, std::size_t tokens) const noexcept {
    return fixed + per_key * double(sampled) / double(tokens);
  }
};

/// Options of a certified call. A plain struct: set what you need, keep the defaults.
struct options {
  /// The smallest epsilon a call accepts, 2^-20 (about 9.5e-7). Outputs are float32,
  /// whose rounding alone moves o by up to 2^-24 ||o||; below 16 times that, no
  /// certificate could be met by an honest bound on any path (docs/certificate.md,
  /// "Rounding").
  static constexpr double kMinEpsilon = 0x1p-20;
  /// A sliding window whose pool would hold fewer tokens than this is read whole (no
  /// pool: exact attention, certified by its rounding bound). The sparse path's cost per
  /// head barely shrinks with the pool (the scan of the window's blocks, the level loop),
  /// and gpt-oss's 128-token windows ran 17 times slower sampled than dense
  /// (docs/bench.md, "Variants").
  static constexpr std::size_t kMinSlidingPool = 1024;

  double epsilon = 0.1;                         // target error, relative to `scale`
  double delta = 0.05;                          // failure probability per call and head
  error_scale scale = error_scale::kValueScale;
  std::size_t window = 64;                      // newest tokens, always read exactly
  int grid_ratio = 2;                           // r: levels per halving of tau
  int max_levels = 32;                          // J: the finest threshold is tau = 2^(-J/r)
  int grid_top = 6;                             // tight: the coarsest threshold is 2^grid_top
  double softmax_scale = 0.0;                   // 0 means 1/sqrt(head_dim)
  std::uint64_t seed = 0;                       // perturbation seed, fixed before the call
  certificate_kind certificate = certificate_kind::kTight;
  routing route = routing::kAuto;               // exact answers where sparse would cost more
  cost_model cost{};                            // the break-even of `route`
  attention_variant variant{};                  // soft-cap, position bias, sinks, sliding
                                                // window (variant.hpp); default: plain

  /// The classic certificate's per-event failure budget delta / ((J+1) * 3): three events
  /// per level (count interval, second-moment bound, numerator bound), union-bounded over
  /// all levels.
  double event_delta() const noexcept { return delta / (double(max_levels + 1) * 3.0); }

  /// True when light keys are sampled in proportion to w_i rho_i (the tight certificate
  /// on the output-norm and value scales; the denominator scale has no use for values).
  bool value_aware() const noexcept {
    return certificate == certificate_kind::kTight && scale != error_scale::kDenominator;
  }

  /// Levels above tau = 1: the tight certificate starts its grid at tau_0 = 2^grid_top
  /// (grid_top * r more levels), so that heads with flat attention (weights near 1, whose
  /// sum D is close to the token count) can stop at a threshold near D / (sample size)
  /// instead of reading every key at tau = 1. The classic certificate starts at 1.
  int top_halvings() const noexcept {
    return certificate == certificate_kind::kTight ? grid_top : 0;
  }
  int coarse_levels() const noexcept { return top_halvings() * grid_ratio; }
  /// The index of the finest level: levels 0..total_levels(), level j at threshold
  /// tau = 2^(-(j - coarse_levels()) / r) relative to the largest weight.
  int total_levels() const noexcept { return max_levels + coarse_levels(); }

  /// The rows read exactly at every call: the newest min(window, attended tokens), or
  /// every attended token of a sliding window shorter than window + kMinSlidingPool. A
  /// cache whose attended tokens (all n_tokens, or the sliding window's) are no more than
  /// that has no pool: the call is exact attention, certified by its rounding bound
  /// (rounding.hpp).
  std::size_t effective_window(std::size_t n_tokens) const noexcept {
    const std::size_t attended = n_tokens - variant.first_token(n_tokens);
    if (short_sliding_window(n_tokens)) return attended;
    return window < attended ? window : attended;
  }
  /// True when a sliding window is read whole (shorter than window + kMinSlidingPool): the
  /// call answers it with the dense kernel (answer_path::kNoPool), certified by the
  /// kernel's rounding bound, as a routed group is.
  bool short_sliding_window(std::size_t n_tokens) const noexcept {
    return variant.sliding_window > 0 && n_tokens - variant.first_token(n_tokens) < window + kMinSlidingPool;
  }

  double effective_softmax_scale(std::size_t head_dim) const noexcept {
    return softmax_scale > 0.0 ? softmax_scale : 1.0 / std::sqrt(double(head_dim));
  }
};

/// The options in the units the level loop works in: weights relative to
/// c + top_halvings() ln 2 (so that the coarsest threshold is 1 again) and the levels
/// 0..total_levels(). Level j is the same threshold in both, so levels, hints and the
/// per-level failure budget mean the same thing.
inline options shifted_grid(const options& o) noexcept {
  options s = o;
  s.max_levels = o.total_levels();
  s.grid_top = 0;
  return s;
}

/// Throws certattn::error naming the first bad field.
inline void validate(const options& o) {
  if (!(o.epsilon > 0.0) || !std::isfinite(o.epsilon))
    throw error("options.epsilon must be finite and > 0, got " + std::to_string(o.epsilon));
  if (!(o.epsilon >= options::kMinEpsilon)) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%.3g is below options::kMinEpsilon = 2^-20 = %.3g",
                  o.epsilon, options::kMinEpsilon);
    throw error(std::string("options.epsilon = ") + buf +
                ": float32 outputs round by up to 2^-24 of their norm, so no bound could meet it");
  }
  if (!(o.delta > 0.0 && o.delta < 1.0))
    throw error("options.delta must lie in (0, 1), got " + std::to_string(o.delta));
  if (o.grid_ratio < 1 || o.grid_ratio > 64)
    throw error("options.grid_ratio must lie in [1, 64], got " + std::to_string(o.grid_ratio));
  if (o.max_levels < 0 || o.max_levels > 4096)
    throw error("options.max_levels must lie in [0, 4096], got " + std::to_string(o.max_levels));
  if (o.grid_top < 0 || o.grid_top > 64)
    throw error("options.grid_top must lie in [0, 64], got " + std::to_string(o.grid_top));
  if (!(o.softmax_scale >= 0.0) || !std::isfinite(o.softmax_scale))
    throw error("options.softmax_scale must be finite and >= 0 (0 = 1/sqrt(head_dim)), got " +
                std::to_string(o.softmax_scale));
  if (o.certificate != certificate_kind::kTight && o.certificate != certificate_kind::kClassic)
    throw error("options.certificate is not a valid certificate_kind");
  if (o.route != routing::kAuto && o.route != routing::kOff)
    throw error("options.route is not a valid routing");
  if (!(o.cost.fixed >= 0.0 && o.cost.fixed < 1.0))
    throw error("options.cost.fixed must lie in [0, 1), got " + std::to_string(o.cost.fixed));
  if (!(o.cost.per_key > 0.0) || !std::isfinite(o.cost.per_key))
    throw error("options.cost.per_key must be finite and > 0, got " +
                std::to_string(o.cost.per_key));
  if (!(o.cost.give_up >= 1.0) || !std::isfinite(o.cost.give_up))
    throw error("options.cost.give_up must be finite and >= 1, got " +
                std::to_string(o.cost.give_up));
  if (!(o.variant.logit_softcap >= 0.0 && o.variant.logit_softcap <= attention_variant::kMaxParameter))
    throw error("options.variant.logit_softcap must lie in [0, 2^20] (0 = off), got " +
                std::to_string(o.variant.logit_softcap));
  switch (o.scale) {
    case error_scale::kDenominator:
    case error_scale::kOutputNorm:
    case error_scale::kValueScale: break;
    default: throw error("options.scale is not a valid error_scale");
  }
}

/// Shape checks shared by every entry point.
inline void validate_shape(const options& /*o*/, std::size_t n_tokens, std::size_t head_dim) {
  if (head_dim == 0) throw error("head_dim must be > 0");
  if (n_tokens == 0) throw error("n_tokens: the cache is empty");
}

/// How a call answered one query head.
enum class answer_path : std::uint8_t {
  kSampled,     // a certified level of the sparse path
  kNoPool,      // the cache is no longer than the window (plus the exact set): exact, in double
  kFallback,    // no level certified: exact attention
  kOverBudget,  // the group's sample outgrew sample_budget() before this head certified: exact
  kJoined,      // an earlier head of the group needed the exact pass: this one joined it
  kRouted,      // group_history routed the group to the dense kernel: exact
};

inline std::string_view to_string(answer_path p) noexcept {
  switch (p) {
    case answer_path::kSampled: return "sampled";
    case answer_path::kNoPool: return "no_pool";
    case answer_path::kFallback: return "fallback";
    case answer_path::kOverBudget: return "over_budget";
    case answer_path::kJoined: return "joined";
    case answer_path::kRouted: return "routed";
  }
  return "?";
}

/// The most pool keys (heavy and sampled light, summed over the heads in call order) a
/// group call may take into its samples before it stops: where the sparse path's
/// predicted cost reaches options.cost.give_up dense kernels. The head whose level loop
/// crosses it, and every later head of the group, is answered by one exact pass, so that
/// a call costs at most about give_up + 1 dense kernels (the budget spent, then the dense
/// pass). Unlimited when options.route is kOff.
/// `cost_scale` multiplies the model's fixed and per-key costs: the ratio of measured to
/// predicted costs that a group_history tracks on this machine
/// (group_history::sample_budget()), 1 for the model as it is.
inline std::size_t sample_budget(const options& o, std::size_t tokens,
                                 double cost_scale = 1.0) noexcept {
  if (o.route == routing::kOff) return std::size_t(-1);
  const double s = cost_scale > 0.0 && std::isfinite(cost_scale) ? cost_scale : 1.0;
  const double b = std::max(0.0, o.cost.give_up - s * o.cost.fixed) * double(tokens) /
                   (s * o.cost.per_key);
  return b >= 0x1p62 ? std::size_t(-1) : std::size_t(b);
}

/// What a call reports for one query head.
struct certificate {
  bool certified = false;       // true: error <= epsilon * scale with prob >= 1 - delta
                                //   (the exact paths kNoPool and kRouted: when their
                                //   rounding bound meets epsilon, rounding.hpp; false for
                                //   kFallback, kOverBudget and kJoined: the sparse path
                                //   gave up)
  bool exact = false;           // true: the output is exact attention, computed in float or
                                //   double (its error is its rounding)
  answer_path path = answer_path::kSampled;  // which of the call's paths answered
  int level = -1;               // stopping level j, -1 when exact (0 = the coarsest)
  double tau = 0.0;             // its threshold, relative to the largest weight
  double bound = 0.0;           // certified error bound relative to its scale:
                                //   beta / scale_value, or dD / D_lo on the denominator scale
  double beta = 0.0;            // absolute bound on ||o^ - o||
  double scale_value = 0.0;     // D_lo, ||o^|| - beta or M_lo
  double max_score = 0.0;       // c: weights are w_i = exp(s_i - c)
  double denominator = 0.0;     // D^ at the stopping level (exact D when exact)
  std::size_t heavy = 0;        // pool keys with w_i >= tau (read exactly, exact weight)
  std::size_t sampled = 0;      // light pool keys in the sample (weight tau)
  std::size_t keys_read = 0;    // keys whose exact 16-bit row was read (window included)
  std::size_t values_read = 0;  // value rows read (window included)
  std::size_t bytes_read = 0;   // bytes read by the call (docs/fast-path.md, "Bytes read")
};

}  // namespace certattn
