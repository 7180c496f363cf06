// The geometric threshold grid and the nested PPS samples it defines (docs/certificate.md,
// "The grid" and "Value-aware sampling"). Membership is decided in the log domain, by one
// pair of functions that the reference and the fast path share, so both compute the same
// sets.
#pragma once

#include <algorithm>
#include <cmath>
#include <numbers>

namespace certattn {

/// ln tau_j = -j (ln2 / r). tau_0 = 1 and each r levels halve tau. Every path computes
/// the grid with this one expression, so all of them compare against the same doubles.
inline double ln_tau(int level, int grid_ratio) noexcept {
  return -double(level) * (std::numbers::ln2 / double(grid_ratio));
}
inline double tau_of(int level, int grid_ratio) noexcept {
  return std::exp(ln_tau(level, grid_ratio));
}

/// The shift of the weights' reference for a grid that starts at tau_0 = 2^top_halvings:
/// weights exp(s - c - shift) against thresholds 2^(-j/r) are weights exp(s - c) against
/// 2^(top - j/r). One expression for every path.
inline double grid_shift(int top_halvings) noexcept {
  return double(top_halvings) * std::numbers::ln2;
}
/// A quantity relative to the shifted reference c_shifted = fl(c + grid_shift(top)) (a
/// weight sum, a threshold), made relative to exp(c) instead. Multiplies by 2^top exactly
/// when c + shift rounded to nothing, and otherwise also by exp of the rounding (up to
/// ulp(c) / 2: 2e-4 relative at |c| = 1e12), so that a reported denominator means
/// sum exp(s - c) whatever the magnitude of c.
inline double unshift(double x, double c_shifted, double c, int top_halvings) noexcept {
  return std::ldexp(x * std::exp((c_shifted - c) - grid_shift(top_halvings)), top_halvings);
}

/// Heavy at level j: w_i >= tau_j, i.e. s_i - c >= ln tau_j. Heavy keys are always sampled.
inline bool is_heavy(double score_minus_c, double ln_tau_j) noexcept {
  return score_minus_c >= ln_tau_j;
}
/// In the sample S_j: s_i - c + E_i >= ln tau_j. A light key enters with probability
/// exactly w_i / tau_j, independently of the others (Poisson PPS sampling).
inline bool in_sample(double score_minus_c, double e, double ln_tau_j) noexcept {
  return score_minus_c + e >= ln_tau_j;
}

/// The earliest level at which a key with perturbed (upper-bounded) score x = s - c + E can
/// be in the sample: the smallest j >= 0 with x >= ln tau_j. Returns max_levels + 1 when
/// no level up to J admits it. Exact with respect to ln_tau(): the guess from the
/// closed form is corrected by the same comparison in_sample() uses.
inline int earliest_level(double x, int grid_ratio, int max_levels) noexcept {
  if (x >= 0.0) return 0;
  // The hot path calls this per candidate: no division for the usual ratios (the
  // compiler folds ln2 / r to the same double that ln_tau() computes).
  double step;
  switch (grid_ratio) {
    case 1: step = std::numbers::ln2 / 1.0; break;
    case 2: step = std::numbers::ln2 / 2.0; break;
    case 3: step = std::numbers::ln2 / 3.0; break;
    case 4: step = std::numbers::ln2 / 4.0; break;
    default: step = std::numbers::ln2 / double(grid_ratio); break;
  }
  auto grid = [step](int j) { return -double(j) * step; };  // == ln_tau(j, grid_ratio)
  if (!(x >= grid(max_levels))) return max_levels + 1;
  // A guess, within one of the answer (any guess is correct: the comparisons below
  // decide). Truncation + 1, not std::ceil: on the baseline ISA ceil is a libm call, and
  // the hot path asks this about 25K times per group call (the ceil was 9% of the level
  // loop). Selects instead of the loops' branches measured slower: they predict well.
  const double y = -x * (double(grid_ratio) * std::numbers::log2e);  // > 0 here
  int j = y < double(max_levels) ? int(y) + 1 : max_levels;
  while (j > 0 && x >= grid(j - 1)) --j;
  while (j <= max_levels && !(x >= grid(j))) ++j;
  return j;
}

}  // namespace certattn
