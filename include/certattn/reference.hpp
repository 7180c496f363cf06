// The reference certified estimator: exact scores for every key, then the level loop of
// docs/certificate.md written as plainly as possible. It is the oracle every fast path is
// compared with (same perturbations, same sample sets, same certificate), so clarity
// beats speed here.
#pragma once

#include <certattn/certificate.hpp>
#include <certattn/exact.hpp>
#include <certattn/history.hpp>
#include <certattn/options.hpp>
#include <certattn/perturb.hpp>
#include <certattn/rounding.hpp>
#include <certattn/sampler.hpp>
#include <certattn/value_bounds.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <vector>

namespace certattn {

/// One row of the per-level trace, in the level loop's units: tau and every weighted sum
/// of `bound` are relative to c + grid_shift(options::top_halvings()) (multiply by
/// 2^top_halvings for weights relative to the largest one).
struct level_trace {
  int level = 0;
  double tau = 0.0;
  std::size_t heavy = 0;    // |H_j|
  std::size_t sampled = 0;  // |S_j ∩ A_j|
  level_result bound;       // everything certify_level() derived
};

struct reference_result {
  std::vector<double> output;       // o^ (or exact o when no level certified)   [head_dim]
  certificate cert;
  std::vector<level_trace> trace;   // levels 0..stopping level (all of them when exact)
  double max_score = 0.0;           // c
  // For token i < n - window: the earliest level at which it is sampled
  // (S_j = { i : sample_level[i] <= j }) and at which it is heavy, on the grid of
  // options::total_levels(); total_levels() + 1 = never. Tokens of the exact set (the
  // classic certificate's value outliers, or values beyond float's range; see
  // value_bounds.hpp) are read exactly and have level -1 in both.
  std::vector<int> sample_level;
  std::vector<int> heavy_level;
  std::size_t exact_set = 0;        // pool tokens moved to the exact set
  float value_cap = 0.0f;           // the cap that defined it
  // Heavy and sampled light pool keys at the last level the loop processed (0 when it ran
  // none): what the head spent of sample_budget().
  std::size_t sample_size = 0;
};

/// Extra inputs that let the reference reproduce an index's value bound exactly.
struct reference_extras {
  // The centre g of the value-radius bound; empty means the mean of all value rows.
  // Pass key_index::value_center() to compare with the fast path.
  std::span<const float> value_center;
  // The cap of the exact set; NaN means value_cap_from() over all tokens' distances.
  // Pass key_index::value_cap() to compare with the fast path.
  float value_cap = std::numeric_limits<float>::quiet_NaN();
  // The reach floor of value-aware sampling; NaN means reach_floor_from() over all
  // tokens' distances. Pass key_index::reach_floor() to compare with the fast path.
  float reach_floor = std::numeric_limits<float>::quiet_NaN();
  // The tight certificate's level hint (level_delta_share()); -1: none.
  int level_hint = -1;
  // The history the attend_group() call to reproduce was given (nullptr: none): the
  // reference routes to exact attention exactly when group_history::routes_dense() says so.
  const group_history* history = nullptr;
  // The group's earlier heads in that call (reference_attend_group() fills both): the pool
  // keys they took into their samples (reference_result::sample_size), which count
  // against sample_budget(), and whether one of them needed the exact pass.
  std::size_t group_spent = 0;
  bool group_exact = false;
  // The pool ends at this token at the latest (an attend_sequences() call: its index holds
  // the shared prefix alone, and the tokens after it are read exactly, with the window).
  std::size_t pool_limit = SIZE_MAX;
};

/// The certified estimate for query q over all rows of keys/values (token order: oldest
/// first; the last options.window rows are the window, all of them when there are fewer).
/// options.variant's spans hold this head's entry (or none): its scores, sliding window
/// and sink are those of exact_attention() with the same variant.
template <class Q, cache_element T>
inline reference_result reference_attend(std::span<const Q> q, matrix_view<T> keys,
                                         matrix_view<T> values, const options& opt,
                                         const noise_key& nk,
                                         const reference_extras& extras = {}) {
  validate(opt);
  validate_shape(opt, keys.rows, keys.cols);
  detail::check_attention_inputs(q, keys, values);
  validate(opt.variant, 1, "options.variant");

  const std::size_t n = keys.rows, d = keys.cols, dv = values.cols;
  // The variant: tokens [first, n) attend, the pool is [first, pool_end).
  const head_variant hv = head_variant_of(opt.variant, 0, n);
  const std::size_t first = hv.first, attended = n - first;
  const std::size_t pool_end =
      std::min(n - opt.effective_window(n), std::max(extras.pool_limit, first));
  // The level loop's grid: levels 0..total_levels(), weights relative to c + shift.
  const options grid = shifted_grid(opt);
  const int J = grid.max_levels, r = opt.grid_ratio, top = opt.top_halvings();
  const std::vector<double> s = exact_scores(q, keys, opt.effective_softmax_scale(d), hv);

  reference_result res;
  res.max_score = *std::max_element(s.begin() + std::ptrdiff_t(first), s.end());
  if (hv.has_sink) res.max_score = std::max(res.max_score, hv.sink);
  const double c = res.max_score;  // a function of q and the cache only: no peeking
  const double cw = c + grid_shift(top);  // the weights' reference: w_i = exp(s_i - cw)

  auto value = [&](std::size_t t, std::size_t i) { return to_double(values(t, i)); };
  auto value_sq = [&](std::size_t t) {
    double a = 0.0;
    for (std::size_t i = 0; i < dv; ++i) a += value(t, i) * value(t, i);
    return a;
  };

  // Value bounds: centre g, the distances ||v_t - g||, the cap and the exact set.
  std::vector<float> center_store;
  std::span<const float> center = extras.value_center;
  if (center.empty()) {
    center_store = value_mean(values, n);
    center = center_store;
  }
  if (center.size() != dv)
    throw error("extras.value_center has " + std::to_string(center.size()) +
                " elements but the values have " + std::to_string(dv) + " channels");
  std::vector<float> dist(n);
  for (std::size_t t = 0; t < n; ++t) dist[t] = value_distance_bound(values.row(t), center, dv);
  res.value_cap = std::isnan(extras.value_cap) ? value_cap_from(dist) : extras.value_cap;
  // The classic certificate reads value outliers exactly; the tight one samples them in
  // proportion to their reach, and reads exactly only values whose distance overflowed.
  const bool classic = opt.certificate == certificate_kind::kClassic;
  auto in_exact_set = [&](std::size_t t) {
    return t >= pool_end || (classic ? dist[t] > res.value_cap : !std::isfinite(dist[t]));
  };
  // R(c0) = base + ||g - c0||, base = max over the pool (exact set excluded) of ||v_i - g||.
  double base = 0.0;
  for (std::size_t t = 0; t < pool_end; ++t)
    if (!in_exact_set(t)) base = std::max(base, double(dist[t]));
  const value_radius radius{base, center};
  double pool_max_distance = 0.0;  // over the finite ones, as key_index::value_distance_max()
  for (std::size_t t = 0; t < pool_end; ++t)
    if (std::isfinite(dist[t])) pool_max_distance = std::max(pool_max_distance, double(dist[t]));
  const float floor = std::isnan(extras.reach_floor) ? reach_floor_from(dist) : extras.reach_floor;
  const sampling_design design = make_sampling_design(opt, floor, pool_max_distance, center);
  // The certificate's vector sums are deviations from g (level_sums).
  auto dev = [&](std::size_t t, std::size_t i) { return value(t, i) - double(center[i]); };
  auto dev_sq = [&](std::size_t t) {
    double a = 0.0;
    for (std::size_t i = 0; i < dv; ++i) a += dev(t, i) * dev(t, i);
    return a;
  };

  // Window and exact set: exact sums. A sink is one more exact row, of value 0.
  double window_weight = 0.0, window_sq = 0.0;
  std::vector<double> window_num(dv, 0.0);
  for (std::size_t t = first; t < n; ++t) {
    if (!in_exact_set(t)) continue;
    if (t < pool_end) ++res.exact_set;
    const double w = std::exp(s[t] - cw);
    window_weight += w;
    window_sq += w * value_sq(t);
    for (std::size_t i = 0; i < dv; ++i) window_num[i] += w * dev(t, i);
  }
  if (hv.has_sink) {
    const double w = std::exp(hv.sink - cw);
    window_weight += w;
    for (std::size_t i = 0; i < dv; ++i) window_num[i] -= w * double(center[i]);
  }

  // Levels at which each pool key is heavy and sampled.
  const perturbation pert(opt.seed, nk);
  res.sample_level.resize(pool_end);
  res.heavy_level.resize(pool_end);
  for (std::size_t t = 0; t < pool_end; ++t) {
    if (t < first) {  // outside the sliding window: never read
      res.heavy_level[t] = res.sample_level[t] = J + 1;
      continue;
    }
    if (in_exact_set(t)) {
      res.heavy_level[t] = res.sample_level[t] = -1;
      continue;
    }
    // ln(w_i rho_i / rho_bar): the key's size in the PPS design (the offset is 0 under
    // plain PPS, and then x = s - c exactly).
    const double x = (s[t] - cw) + design.offset(dist[t]);
    res.heavy_level[t] = earliest_level(x, r, J);
    res.sample_level[t] = earliest_level(x + pert.exp1(t), r, J);
  }

  // Routing (options::route): the whole call by exact attention when the history says so,
  // and a head whose sample outgrows its budget stops there (answered exactly below).
  const std::size_t pool = pool_end - first;
  const bool routed = pool > 0 && extras.history && extras.history->routes_dense(opt);
  const bool joined = !routed && opt.route == routing::kAuto && extras.group_exact &&
                      pool > res.exact_set;
  const std::size_t budget = extras.history ? extras.history->sample_budget(opt, attended)
                                            : sample_budget(opt, attended);
  const std::size_t head_budget = budget - std::min(extras.group_spent, budget);
  bool over_budget = false;
  std::vector<double> exact_num(dv), light_sum(dv), o_hat(dv), c0(dv);
  for (int j = 0; j <= J && pool > res.exact_set && !routed && !joined; ++j) {
    const double tau = tau_of(j, r);
    level_sums sums;
    sums.tau = tau;
    sums.exact_weight = window_weight;
    sums.exact_sq = window_sq;
    exact_num = window_num;
    std::fill(light_sum.begin(), light_sum.end(), 0.0);
    std::size_t heavy = 0;
    for (std::size_t t = first; t < pool_end; ++t) {
      if (res.heavy_level[t] < 0) continue;  // exact set: already in the window sums
      if (res.heavy_level[t] <= j) {  // heavy: exact weight
        const double w = std::exp(s[t] - cw);
        ++heavy;
        sums.exact_weight += w;
        sums.exact_sq += w * value_sq(t);
        for (std::size_t i = 0; i < dv; ++i) exact_num[i] += w * dev(t, i);
      } else if (res.sample_level[t] <= j) {  // light and sampled: weight tau kappa
        const double kappa = design.weight(dist[t]), rho = design.reach(dist[t]);
        const double dsq = dev_sq(t);
        ++sums.light_count;
        sums.light_sq += dsq;
        sums.light_mass += kappa;
        sums.light_h += kappa * per_reach(dsq, rho);
        sums.light_hw += std::exp(s[t] - cw) * per_reach(dsq, rho);
        sums.light_t += kappa * value_sq(t);
        for (std::size_t i = 0; i < dv; ++i) light_sum[i] += kappa * dev(t, i);
      }
    }
    sums.exact_num = exact_num;
    sums.light_sum = light_sum;
    const level_result lr = certify(sums, radius, design, grid, j, extras.level_hint, o_hat, c0);
    res.trace.push_back({j, tau, heavy, sums.light_count, lr});
    res.sample_size = heavy + sums.light_count;
    if (lr.certified) {
      res.output = o_hat;
      certificate& cert = res.cert;
      cert.certified = true;
      cert.level = j;
      cert.tau = unshift(tau, cw, c, top);  // relative to the largest weight
      cert.bound = lr.bound;
      cert.beta = lr.beta;
      cert.scale_value = lr.scale_value;
      cert.max_score = c;
      cert.denominator = unshift(lr.d_hat, cw, c, top);
      cert.heavy = heavy;
      cert.sampled = sums.light_count;
      // The reference reads every key; it reports what an exact candidate generator
      // would read: the window and the sample.
      cert.keys_read = (n - pool_end) + res.exact_set + heavy + sums.light_count;
      cert.values_read = cert.keys_read;
      cert.bytes_read = (cert.keys_read * d + cert.values_read * dv) * sizeof(T);
      return res;
    }
    if (heavy + sums.light_count > head_budget) {
      over_budget = true;
      break;
    }
  }

  // No level certified (or the pool is empty, or the call routed): exact attention, error 0.
  const exact_result ex = exact_attention(q, keys, values, opt.effective_softmax_scale(d), opt.variant);
  res.output = ex.output;
  res.cert.path = routed                     ? answer_path::kRouted
                  : pool == res.exact_set    ? answer_path::kNoPool
                  : joined                   ? answer_path::kJoined
                  : over_budget              ? answer_path::kOverBudget
                                             : answer_path::kFallback;
  // An empty pool or a routed call: exact attention in double, certified when its rounding
  // bound meets epsilon (rounding.hpp) as attend_group()'s double path decides: centred on
  // g without a pool, uncentred when routed. (attend_group() answers a routed head with the
  // float kernel first, whose bound is looser; where that one meets epsilon, so does this.)
  if (res.cert.path == answer_path::kNoPool || res.cert.path == answer_path::kRouted) {
    // A short sliding window is answered like a routed group (the dense kernel, then the
    // double path where its bound misses epsilon): uncentred.
    const bool centred = res.cert.path == answer_path::kNoPool && !opt.short_sliding_window(n);
    double l1 = 0.0, kmax = 0.0, g2 = 0.0, o2 = 0.0;
    for (const Q& x : q) l1 += std::fabs(double(float(x)));
    for (std::size_t t = 0; t < n; ++t)
      for (std::size_t i = 0; i < d; ++i) kmax = std::max(kmax, std::fabs(to_double(keys(t, i))));
    for (float x : center) g2 += double(x) * double(x);
    for (double x : ex.output) o2 += double(float(x)) * double(float(x));
    const double magnitude =
        hv.score_magnitude(opt.effective_softmax_scale(d) * l1 * double(float(kmax)));
    const std::size_t terms = attended + (hv.has_sink ? 1 : 0);
    exact_rounding r;
    r.head_dim = dv;
    r.eta = double_path_eta(terms, centred ? magnitude + grid_shift(top) : magnitude + std::fabs(c) * 0x1p-40);
    r.value_scale = ex.value_scale;
    r.center_norm = centred ? std::sqrt(g2) : 0.0;
    r.spread = value_scale_upper(r) + r.center_norm;
    certify_exact_answer(r, std::sqrt(o2), ex.denominator, opt, res.cert);
  }
  res.cert.exact = true;
  res.cert.level = -1;
  res.cert.max_score = c;
  res.cert.denominator = ex.denominator;
  res.cert.keys_read = attended;
  res.cert.values_read = attended;
  res.cert.bytes_read = attended * (d + dv) * sizeof(T);
  return res;
}

/// The reference of one attend_group() call: reference_attend() for each of its `group`
/// query heads in call order, passing each what the earlier heads spent of
/// sample_budget() and whether one of them needed the exact pass (so that the routing
/// decisions are the fast path's). queries [group][head_dim]. Each head's level hint is
/// level_hints[g] when given, else history->hints_for(nk)[g] when extras.history is set
/// (none when the history's hints are not from a strictly earlier step of nk's layer, KV
/// head and sequence: attend_group()'s rule), else extras.level_hint.
template <class Q, cache_element T>
inline std::vector<reference_result> reference_attend_group(
    std::span<const Q> queries, std::size_t group, matrix_view<T> keys, matrix_view<T> values,
    const options& opt, const noise_key& nk, reference_extras extras = {},
    std::span<const int> level_hints = {}) {
  if (group == 0 || queries.size() != group * keys.cols)
    throw error("reference_attend_group: queries has " + std::to_string(queries.size()) +
                " elements, expected group * head_dim = " + std::to_string(group * keys.cols));
  if (!level_hints.empty() && level_hints.size() != group)
    throw error("reference_attend_group: level_hints has " + std::to_string(level_hints.size()) +
                " elements, expected 0 or group = " + std::to_string(group));
  validate(opt.variant, group, "options.variant");
  std::vector<reference_result> out;
  out.reserve(group);
  const std::size_t d = keys.cols;
  options head_opt = opt;
  for (std::size_t g = 0; g < group; ++g) {
    head_opt.variant = head_slice(opt.variant, g);
    reference_extras e = extras;
    if (!level_hints.empty())
      e.level_hint = level_hints[g];
    else if (extras.history && extras.history->group() == group) {
      const std::span<const int> hints = extras.history->hints_for(nk);
      e.level_hint = hints.empty() ? -1 : hints[g];
    }
    out.push_back(reference_attend(queries.subspan(g * d, d), keys, values, head_opt, nk, e));
    extras.group_spent += out.back().sample_size;
    const answer_path p = out.back().cert.path;
    extras.group_exact = extras.group_exact || p == answer_path::kFallback ||
                         p == answer_path::kOverBudget || p == answer_path::kJoined;
  }
  return out;
}

/// The same over a kv_view (any layout), its rows gathered first: the arguments of the
/// attend_group() call it reproduces, in the same order.
template <class Q, kv_view KV>
inline std::vector<reference_result> reference_attend_group(
    std::span<const Q> queries, std::size_t group, const KV& kv, const options& opt,
    const noise_key& nk, const reference_extras& extras = {}, std::span<const int> level_hints = {}) {
  const dense_rows<KV> rows(kv);
  return reference_attend_group(queries, group, rows.key_matrix(), rows.value_matrix(), opt, nk,
                                extras, level_hints);
}

/// The reference of one attend_positions() call: for each position p in order,
/// reference_attend_group() over the cache's first n - positions + p + 1 rows with
/// noise_key::position = p. queries [positions][group][head_dim]; the results
/// [positions][group], flattened.
template <class Q, kv_view KV>
inline std::vector<reference_result> reference_attend_positions(
    std::span<const Q> queries, std::size_t positions, std::size_t group, const KV& kv,
    const options& opt, const noise_key& nk, const reference_extras& extras = {},
    std::span<const int> level_hints = {}) {
  const std::size_t n = kv.size(), d = kv.head_dim();
  if (positions == 0 || positions > n || queries.size() != positions * group * d)
    throw error("reference_attend_positions: queries has " + std::to_string(queries.size()) +
                " elements for " + std::to_string(positions) + " positions over " +
                std::to_string(n) + " tokens, expected positions * group * head_dim = " +
                std::to_string(positions * group * d));
  const dense_rows<KV> rows(kv);
  std::vector<reference_result> out;
  out.reserve(positions * group);
  for (std::size_t p = 0; p < positions; ++p) {
    const std::size_t n_p = n - positions + p + 1;
    noise_key nk_p = nk;
    nk_p.position = std::uint32_t(p);
    auto keys = rows.key_matrix(), values = rows.value_matrix();
    keys.rows = values.rows = n_p;
    std::vector<reference_result> r =
        reference_attend_group(queries.subspan(p * group * d, group * d), group, keys, values,
                               opt, nk_p, extras, level_hints);
    for (auto& x : r) out.push_back(std::move(x));
  }
  return out;
}

/// The reference of one attend_sequences() call: for each sequence s in order,
/// reference_attend_group() over views[s] with noise_key::sequence = sequences[s] and the
/// pool ending at the prefix (reference_extras::pool_limit = prefix_tokens). queries
/// [sequences][group][head_dim], level_hints empty or [sequences][group]; histories empty
/// or [sequences]: sequence s's group_history as the call to reproduce was given it (a
/// copy taken before that call; it replaces extras.history for that sequence). The
/// results [sequences][group], flattened.
template <class Q, kv_view KV>
inline std::vector<reference_result> reference_attend_sequences(
    std::span<const Q> queries, std::size_t group, std::span<const KV> views,
    std::size_t prefix_tokens, const options& opt, const noise_key& nk,
    std::span<const std::uint64_t> sequences, reference_extras extras = {},
    std::span<const int> level_hints = {}, std::span<const group_history* const> histories = {}) {
  const std::size_t S = views.size();
  if (S == 0 || sequences.size() != S)
    throw error("reference_attend_sequences: one id per view expected, got " +
                std::to_string(sequences.size()) + " for " + std::to_string(S) + " views");
  const std::size_t d = views[0].head_dim();
  if (queries.size() != S * group * d)
    throw error("reference_attend_sequences: queries has " + std::to_string(queries.size()) +
                " elements, expected sequences * group * head_dim = " + std::to_string(S * group * d));
  if (!level_hints.empty() && level_hints.size() != S * group)
    throw error("reference_attend_sequences: level_hints has " + std::to_string(level_hints.size()) +
                " elements, expected 0 or sequences * group = " + std::to_string(S * group));
  if (!histories.empty() && histories.size() != S)
    throw error("reference_attend_sequences: " + std::to_string(histories.size()) + " histories for " +
                std::to_string(S) + " sequences (expected none or one per sequence)");
  if (!histories.empty() && !level_hints.empty())
    throw error("reference_attend_sequences: level_hints and histories exclude each other (a history carries its "
                "sequence's hints)");
  extras.pool_limit = prefix_tokens;
  std::vector<reference_result> out;
  out.reserve(S * group);
  for (std::size_t s = 0; s < S; ++s) {
    noise_key nk_s = nk;
    nk_s.sequence = sequences[s];
    if (!histories.empty()) extras.history = histories[s];
    std::vector<reference_result> r = reference_attend_group(
        queries.subspan(s * group * d, group * d), group, views[s], opt, nk_s, extras,
        level_hints.empty() ? level_hints : level_hints.subspan(s * group, group));
    for (auto& x : r) out.push_back(std::move(x));
  }
  return out;
}

}  // namespace certattn
