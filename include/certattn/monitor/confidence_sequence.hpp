// Anytime-valid confidence sequences for the exceedance rate of a stream of attention
// calls observed through Horvitz–Thompson-weighted dense probes (docs/monitor.md).
//
// Call t has an exceedance x_t in [0, 1] (1 when its error exceeded epsilon). It is probed
// with a probability p_t in [p_min, 1] fixed before its coin is flipped, and contributes
// Y_t = 1{probed} x_t / p_t. The target is the running average (1/T) sum_t x_t of the
// stream itself, which need not be i.i.d.: nothing is assumed about x_t beyond [0, 1] and
// that its coin is independent of it given the past, so drift, bursts and adaptive p_t are
// all covered. The only randomness the guarantee uses is the probe coins.
#pragma once

#include <certattn/common.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace certattn {

/// Which confidence sequence a statement is made with.
enum class cs_estimator : std::uint8_t {
  /// Hoeffding supermartingale on the range [0, 1/p_t] of each observation, stitched over
  /// a grid of slopes. Valid for the running mean under any drift and adaptive p_t; wide.
  kHoeffding,
  /// Empirical Bernstein (Howard et al. 2021, Thm 4 with a zero prediction): the variance
  /// process is sum Y_t^2, observable, stitched over a grid. Valid for the running mean
  /// under any drift and adaptive p_t. The default.
  kEmpiricalBernstein,
  /// Hedged-capital betting (Waudby-Smith & Ramdas 2023) on a grid of candidate means.
  /// Valid only when every call has the same conditional mean; under drift it is not a
  /// confidence sequence for the running mean, and it is measured to fail (docs/monitor.md).
  kBetting,
};

inline std::string_view to_string(cs_estimator e) noexcept {
  switch (e) {
    case cs_estimator::kHoeffding: return "hoeffding";
    case cs_estimator::kEmpiricalBernstein: return "empirical_bernstein";
    case cs_estimator::kBetting: return "betting";
  }
  return "?";
}

inline cs_estimator cs_estimator_from_string(std::string_view s) {
  if (s == "hoeffding") return cs_estimator::kHoeffding;
  if (s == "empirical_bernstein" || s == "eb") return cs_estimator::kEmpiricalBernstein;
  if (s == "betting") return cs_estimator::kBetting;
  throw error("cs_estimator: unknown name '" + std::string(s) +
              "' (expected hoeffding, empirical_bernstein or betting)");
}

/// True for the estimators whose guarantee holds for the running mean under arbitrary
/// drift and adaptive probing; a monitor's default must be one of them.
constexpr bool is_drift_safe(cs_estimator e) noexcept { return e != cs_estimator::kBetting; }

struct cs_options {
  double p_min = 0.01;            // declared floor on every monitored call's p_t, in (0, 1]
  double alpha = 0.05;            // design level: only tunes the betting bets
  bool betting = false;           // keep the betting sequence too (O(grid) work per call)
  std::size_t betting_grid = 256; // candidate rates of the betting sequence, >= 2
};

inline void validate(const cs_options& o) {
  if (!(o.p_min > 0.0 && o.p_min <= 1.0))
    throw error("cs_options.p_min must be in (0, 1], got " + std::to_string(o.p_min));
  if (!(o.alpha > 0.0 && o.alpha < 1.0))
    throw error("cs_options.alpha must be in (0, 1), got " + std::to_string(o.alpha));
  if (o.betting && o.betting_grid < 2)
    throw error("cs_options.betting_grid must be >= 2, got " + std::to_string(o.betting_grid));
}

/// Bounds on the running exceedance rate of all calls counted so far.
struct cs_bounds {
  double lower = 0.0;  // rate >= lower with probability >= 1 - alpha, at every time at once
  double upper = 1.0;  // rate <= upper with probability >= 1 - alpha, at every time at once
  double point = 0.0;  // HT estimate over the monitored calls resolved so far (no guarantee)
};

/// What a probe whose outcome arrives later must remember: its probability and the bet the
/// betting sequence placed on it, both fixed before its coin (that is what keeps them
/// predictable however late the outcome is submitted).
struct cs_ticket {
  double p = 1.0;
  double bet = 0.0;
};

namespace detail::monitor {

/// Discrete stitching (Howard et al. 2021, sec. 3): one exponential supermartingale per
/// slope lambda_k = lambda_0 2^(-k/2), each tested at level alpha w_k with
/// w_k = (k+1)^(-s) / sum_j (j+1)^(-s). A union bound over k and Ville's inequality for
/// each make the minimum over k of the per-slope boundaries valid at every time at once,
/// with no sample size fixed in advance. With s = 1.4 the price over a single tuned slope
/// grows like 1.4 log log V, as for the stitched boundaries of the paper.
template <std::size_t K>
struct slope_grid {
  std::array<double, K> inv_lambda{};
  std::array<double, K> psi{};      // psi(lambda_k)
  std::array<double, K> log_iw{};   // log(1 / w_k)
};

inline constexpr double kStitchS = 1.4;

template <std::size_t K, class Psi>
inline slope_grid<K> make_slope_grid(double lambda0, Psi psi) {
  slope_grid<K> g;
  double h = 0.0;
  for (std::size_t k = 0; k < K; ++k) h += std::pow(double(k + 1), -kStitchS);
  for (std::size_t k = 0; k < K; ++k) {
    const double lambda = lambda0 * std::exp2(-0.5 * double(k));
    g.inv_lambda[k] = 1.0 / lambda;
    g.psi[k] = psi(lambda);
    g.log_iw[k] = std::log(h) + kStitchS * std::log(double(k + 1));
  }
  return g;
}

// Sub-Gaussian slopes run from 4 down to ~1e-8 (variances from ~1 to ~1e17 in p_min
// units: below that the deterministic bounds already win); sub-exponential slopes live in
// (0, 1) and start just below 1, where psi_E stays finite. Starting where the useful
// slopes are keeps the stitching penalty s log(k + 1) small.
inline constexpr std::size_t kGaussSlopes = 60;
inline constexpr std::size_t kExpSlopes = 56;

inline const slope_grid<kGaussSlopes>& gauss_grid() {
  static const auto g =
      make_slope_grid<kGaussSlopes>(4.0, [](double l) { return 0.5 * l * l; });
  return g;
}
inline const slope_grid<kExpSlopes>& exp_grid() {
  // psi_E(l) = -log(1 - l) - l: Fan et al. (2015), exp(l u - psi_E(l) u^2) <= 1 + l u for
  // every u >= -1 and l in [0, 1).
  static const auto g = make_slope_grid<kExpSlopes>(
      0.95, [](double l) { return -std::log1p(-l) - l; });
  return g;
}

/// The stitched boundary: with probability >= 1 - alpha, at every time, S < b(V) where S is
/// the supermartingale's sum and V its variance process (both in scaled units). Every
/// slope gives a valid boundary, so the minimum may be taken over any subset of them: the
/// scan is limited to a window around the slope sqrt(2 log(1/alpha) / V) that a single
/// Gaussian boundary would pick (the per-slope boundary is unimodal in k and the window is
/// wide enough to contain its minimum: tests/test_monitor_api.cpp checks it against the
/// full scan).
template <std::size_t K>
inline double stitched_boundary(const slope_grid<K>& g, double v, double log_inv_alpha) noexcept {
  constexpr std::ptrdiff_t kHalfWindow = 6;
  // k with lambda_k ~ lambda*, i.e. k ~ 2 log2(lambda_0 / lambda*); lambda_0 = 1/inv_lambda[0].
  std::ptrdiff_t centre = 0;
  if (v > 0.0) {
    const double lambda_star = std::sqrt(2.0 * (log_inv_alpha + g.log_iw[0]) / v);
    const double k = 2.0 * std::log2(1.0 / (g.inv_lambda[0] * lambda_star));
    centre = k <= 0.0 ? 0 : std::ptrdiff_t(std::min(k, double(K)));
  }
  const std::ptrdiff_t lo = std::max<std::ptrdiff_t>(0, centre - kHalfWindow);
  const std::ptrdiff_t hi = std::min<std::ptrdiff_t>(std::ptrdiff_t(K) - 1, centre + kHalfWindow);
  double b = std::numeric_limits<double>::infinity();
  for (std::ptrdiff_t k = lo; k <= hi; ++k)
    b = std::min(b, (log_inv_alpha + g.log_iw[k] + g.psi[k] * v) * g.inv_lambda[k]);
  return b;
}

/// The same minimum over every slope (the reference for the windowed scan).
template <std::size_t K>
inline double stitched_boundary_full(const slope_grid<K>& g, double v,
                                     double log_inv_alpha) noexcept {
  double b = std::numeric_limits<double>::infinity();
  for (std::size_t k = 0; k < K; ++k)
    b = std::min(b, (log_inv_alpha + g.log_iw[k] + g.psi[k] * v) * g.inv_lambda[k]);
  return b;
}

}  // namespace detail::monitor

/// The three confidence sequences over one stream of calls, updated together: Hoeffding
/// and empirical Bernstein in O(1) per call, betting (when enabled) in O(grid) per call.
/// Allocation happens only in the constructor.
///
/// Feeding it, per call t:
///   * monitored call, outcome known now:   add(p_t, probed, x_t)   (x ignored if !probed)
///   * probed, outcome later (deferred):    ticket = open(p_t) ... close(ticket, x_t)
///     until closed the probe counts as the worst case (x = 1 for the upper bound, x = 0
///     for the lower); a ticket never closed stays that way, which is the conservative
///     accounting of a deferred probe that was finally dropped (abandon() records it).
///   * call not monitored at all (p_t = 0): add_unmonitored(), counted as an exceedance
///     in the upper bound and a non-exceedance in the lower.
class confidence_sequence {
 public:
  explicit confidence_sequence(const cs_options& opt = {}) : opt_(opt) {
    validate(opt_);
    if (opt_.betting) init_betting();
  }

  const cs_options& options() const noexcept { return opt_; }

  /// A monitored call whose outcome is known now. Precondition: p in [p_min, 1], x in [0, 1].
  void add(double p, bool probed, double x = 0.0) noexcept {
    CERTATTN_ASSERT(p >= opt_.p_min && p <= 1.0);
    CERTATTN_ASSERT(!probed || (x >= 0.0 && x <= 1.0));
    const double y = probed ? x / p : 0.0;
    count_monitored(p);
    sum_y_ += y;
    sum_y2_ += y * y;
    if (probed) observe_exact(x);
    if (opt_.betting) {
      bet_multiply(bet_op::kResolved, current_bet(), y * opt_.p_min, p);
      bet_learn(y * opt_.p_min);
    }
  }

  /// A probed call whose outcome comes later. Precondition: p in [p_min, 1].
  cs_ticket open(double p) noexcept {
    CERTATTN_ASSERT(p >= opt_.p_min && p <= 1.0);
    count_monitored(p);
    const cs_ticket t{p, opt_.betting ? current_bet() : 0.0};
    pend_y_ += 1.0 / p;
    pend_y2_ += 1.0 / (p * p);
    ++open_;
    if (opt_.betting) bet_multiply(bet_op::kOpen, t.bet, 0.0, p);
    return t;
  }

  /// The outcome x in [0, 1] of an open ticket.
  void close(const cs_ticket& t, double x) noexcept {
    CERTATTN_ASSERT(open_ > 0);
    CERTATTN_ASSERT(x >= 0.0 && x <= 1.0);
    const double y = x / t.p;
    pend_y_ -= 1.0 / t.p;
    pend_y2_ -= 1.0 / (t.p * t.p);
    --open_;
    if (open_ == 0) pend_y_ = pend_y2_ = 0.0;  // no drift of the running cancellations
    sum_y_ += y;
    sum_y2_ += y * y;
    observe_exact(x);
    if (opt_.betting) {
      bet_multiply(bet_op::kClose, t.bet, y * opt_.p_min, t.p);
      bet_learn(y * opt_.p_min);
    }
  }

  /// An open ticket whose outcome will never come: it keeps its worst-case contribution
  /// forever (which is what makes dropping a probe safe); only the bookkeeping moves.
  void abandon(const cs_ticket& t) noexcept {
    CERTATTN_ASSERT(open_ > 0);
    pend_y_ -= 1.0 / t.p;
    pend_y2_ -= 1.0 / (t.p * t.p);
    --open_;
    if (open_ == 0) pend_y_ = pend_y2_ = 0.0;
    drop_y_ += 1.0 / t.p;
    drop_y2_ += 1.0 / (t.p * t.p);
    ++abandoned_;
  }

  void add_unmonitored(std::uint64_t n = 1) noexcept {
    calls_ += n;
    unmonitored_ += n;
  }

  /// Bounds at level alpha in (0, 1). Any alpha is valid (the sequences do not depend on
  /// it, apart from the tuning of the betting bets), but the guarantee is for an alpha
  /// chosen before looking at the data.
  cs_bounds bounds(cs_estimator e, double alpha) const {
    if (!(alpha > 0.0 && alpha < 1.0))
      throw error("confidence_sequence::bounds: alpha must be in (0, 1), got " +
                  std::to_string(alpha));
    if (e == cs_estimator::kBetting && !opt_.betting)
      throw error("confidence_sequence::bounds: estimator betting was not enabled "
                  "(cs_options.betting)");
    cs_bounds b;
    const std::uint64_t resolved = monitored_ - open_ - abandoned_;
    b.point = resolved > 0 ? sum_y_ / double(resolved) : 0.0;
    if (calls_ == 0) return b;

    const double lia = std::log(1.0 / alpha);
    double lo_sum = 0.0, hi_sum = 0.0;  // bounds on sum_t x_t over the monitored calls
    if (monitored_ > 0) {
      if (e == cs_estimator::kBetting) {
        const auto [lo, hi] = betting_rates(alpha);
        lo_sum = lo * double(monitored_);
        hi_sum = hi * double(monitored_);
      } else {
        // All sums in units of 1/p_min, so the slope grids are scale free.
        const double c = 1.0 / opt_.p_min;
        const double pm2 = opt_.p_min * opt_.p_min;
        double b_lo, b_hi;
        if (e == cs_estimator::kHoeffding) {
          const double v = v_hoeffding_ * pm2;
          b_lo = b_hi = detail::monitor::stitched_boundary(detail::monitor::gauss_grid(), v, lia);
        } else {
          // Open and abandoned probes at their worst case, x = 1.
          const double v = (sum_y2_ + std::max(pend_y2_, 0.0) + drop_y2_) * pm2;
          b_hi = detail::monitor::stitched_boundary(detail::monitor::exp_grid(), v, lia);
          b_lo = detail::monitor::stitched_boundary(detail::monitor::gauss_grid(), v, lia);
        }
        hi_sum = sum_y_ + std::max(pend_y_, 0.0) + drop_y_ + c * b_hi;
        lo_sum = sum_y_ - c * b_lo;
      }
    }
    // Unmonitored calls may all have exceeded; observed probes are facts.
    hi_sum = std::min(hi_sum + double(unmonitored_), exact_sum_ + double(calls_ - exact_n_));
    lo_sum = std::max(lo_sum, exact_sum_);
    b.upper = std::clamp(hi_sum / double(calls_), 0.0, 1.0);
    b.lower = std::clamp(lo_sum / double(calls_), 0.0, 1.0);
    return b;
  }

  std::uint64_t calls() const noexcept { return calls_; }
  std::uint64_t monitored() const noexcept { return monitored_; }
  std::uint64_t unmonitored() const noexcept { return unmonitored_; }
  std::uint64_t open_tickets() const noexcept { return open_; }
  std::uint64_t abandoned() const noexcept { return abandoned_; }
  std::uint64_t observed() const noexcept { return exact_n_; }

 private:
  void count_monitored(double p) noexcept {
    ++calls_;
    ++monitored_;
    v_hoeffding_ += 0.25 / (p * p);  // Hoeffding's lemma on the range [0, 1/p]
  }
  void observe_exact(double x) noexcept {
    ++exact_n_;
    exact_sum_ += x;
  }

  // ---------------------------------------------------------------- betting
  // Observations are normalised to y = Y p_min in [0, 1]; candidate rate mu_j has normalised
  // mean m_j = mu_j p_min. Two one-sided capitals per candidate, each tested at alpha:
  //   K-(m) = prod (1 - l-(m) (y - m))   grows when the data sit below m: rejects m as upper
  //   K+(m) = prod (1 + l+(m) (y - m))   grows when the data sit above m: rejects m as lower
  // with l-(m) = min(bet, c/(1-m)), l+(m) = min(bet, c/m), c = 1/2, so every factor is
  // >= 1/2. Both are nonnegative martingales when E[y_t | past] = m for every t: a constant
  // mean. That assumption is exactly what drift breaks.
  //
  // Capitals are kept as mantissa * 2^exponent and multiplied directly (no log per factor):
  // a factor lies in [1/2, 1 + bet] and bet <= sqrt(8 log(1/alpha) / log 2) < 93 for every
  // double alpha > 0, so 32 factors between renormalisations stay within 2^(+-210).
  static constexpr double kBetCap = 0.5;
  static constexpr int kRenormEvery = 32;

  void init_betting() {
    const std::size_t g = opt_.betting_grid;
    rate_.resize(g);
    m_.resize(g);
    cap_hi_.resize(g);
    cap_lo_.resize(g);
    k_hi_.assign(g, 1.0);
    k_lo_.assign(g, 1.0);
    e_hi_.assign(g, 0);
    e_lo_.assign(g, 0);
    for (std::size_t j = 0; j < g; ++j) {
      // Quadratic spacing: resolution ~ 2 sqrt(rate) / g, finest where rates live.
      const double u = double(j) / double(g - 1);
      rate_[j] = u * u;
      m_[j] = rate_[j] * opt_.p_min;
      cap_hi_[j] = kBetCap / (1.0 - m_[j]);
      cap_lo_[j] = m_[j] > 0.0 ? kBetCap / m_[j] : std::numeric_limits<double>::infinity();
    }
    bet_log_ = std::log(1.0 / opt_.alpha);
  }

  /// WSR's predictable plug-in bet, sqrt(2 log(1/alpha) / (sigma^2 t log(1 + t))), from the
  /// resolved observations only (so a pending probe never leaks into a later bet).
  double current_bet() const noexcept {
    const double t = double(bet_n_ + 1);
    const double var = (0.25 + bet_dev2_) / t;
    return std::sqrt(2.0 * bet_log_ / (var * t * std::log1p(t)));
  }
  void bet_learn(double y) noexcept {
    ++bet_n_;
    bet_sum_ += y;
    const double mu = (0.5 + bet_sum_) / double(bet_n_ + 1);
    bet_dev2_ += (y - mu) * (y - mu);
  }

  // The capital of an open probe is multiplied by its smallest possible factor (y = 1/p,
  // x = 1, for K-; y = 0 for K+); closing divides that out and multiplies the actual one.
  // Raw loops over the arrays: this is the O(grid) part of every call.
  enum class bet_op { kResolved, kOpen, kClose };

  void bet_multiply(bet_op op, double bet, double y, double p) noexcept {
    const std::size_t g = m_.size();
    const double* m = m_.data();
    const double* ch = cap_hi_.data();
    const double* cl = cap_lo_.data();
    double* kh = k_hi_.data();
    double* kl = k_lo_.data();
    const double y_max = opt_.p_min / p;
    for (std::size_t j = 0; j < g; ++j) {
      const double lh = bet < ch[j] ? bet : ch[j];
      const double ll = bet < cl[j] ? bet : cl[j];
      switch (op) {
        case bet_op::kResolved:
          kh[j] *= 1.0 - lh * (y - m[j]);
          kl[j] *= 1.0 + ll * (y - m[j]);
          break;
        case bet_op::kOpen:
          kh[j] *= 1.0 - lh * (y_max - m[j]);
          kl[j] *= 1.0 - ll * m[j];
          break;
        case bet_op::kClose:
          kh[j] *= (1.0 - lh * (y - m[j])) / (1.0 - lh * (y_max - m[j]));
          kl[j] *= (1.0 + ll * (y - m[j])) / (1.0 - ll * m[j]);
          break;
      }
    }
    if (++bet_ops_ >= kRenormEvery) {
      bet_ops_ = 0;
      for (std::size_t j = 0; j < g; ++j) {
        int e;
        kh[j] = std::frexp(kh[j], &e);
        e_hi_[j] += e;
        kl[j] = std::frexp(kl[j], &e);
        e_lo_[j] += e;
      }
    }
  }

  /// Capital >= 1/alpha, without taking logs: k 2^e >= 1/alpha iff k >= 2^-e / alpha.
  static bool rejects(double k, std::int64_t e, double inv_alpha) noexcept {
    const std::int64_t ec = std::clamp<std::int64_t>(e, -100000, 100000);
    return k >= std::ldexp(inv_alpha, int(-ec));
  }

  /// [lower, upper] rate over the monitored calls: the grid points next to the outermost
  /// candidates not rejected.
  std::pair<double, double> betting_rates(double alpha) const noexcept {
    const std::size_t g = rate_.size();
    const double ia = 1.0 / alpha;
    double lo = 1.0, hi = 0.0;  // if every candidate is rejected the sequence is empty
    for (std::size_t j = g; j-- > 0;) {
      if (!rejects(k_hi_[j], e_hi_[j], ia)) {
        hi = j + 1 < g ? rate_[j + 1] : 1.0;
        break;
      }
    }
    for (std::size_t j = 0; j < g; ++j) {
      if (!rejects(k_lo_[j], e_lo_[j], ia)) {
        lo = j > 0 ? rate_[j - 1] : 0.0;
        break;
      }
    }
    return {lo, hi};
  }

  cs_options opt_;
  std::uint64_t calls_ = 0, monitored_ = 0, unmonitored_ = 0;
  std::uint64_t open_ = 0, abandoned_ = 0, exact_n_ = 0;
  double exact_sum_ = 0.0;             // sum of x over probes observed
  double sum_y_ = 0.0, sum_y2_ = 0.0;  // resolved HT observations
  double pend_y_ = 0.0, pend_y2_ = 0.0;// worst case (x = 1) of the open tickets
  double drop_y_ = 0.0, drop_y2_ = 0.0;// worst case of the abandoned ones, kept for good
  double v_hoeffding_ = 0.0;           // sum 1/(4 p_t^2)

  std::vector<double> rate_, m_, cap_hi_, cap_lo_, k_hi_, k_lo_;
  std::vector<std::int64_t> e_hi_, e_lo_;
  double bet_log_ = 0.0, bet_sum_ = 0.0, bet_dev2_ = 0.0;
  std::uint64_t bet_n_ = 0;
  int bet_ops_ = 0;
};

}  // namespace certattn
