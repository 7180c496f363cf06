// Test helper for the hardening tests (extremes, determinism, robustness, fuzzing): a small
// dense cache of one KV head built from generator functions, one certified group call, and
// its comparison with the reference estimator (same level, same sample sets token by token,
// same certificate, outputs within float rounding).
#pragma once

#include <certattn/attend.hpp>
#include <certattn/exact.hpp>
#include <certattn/reference.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <vector>

namespace certattn::test {

/// ||o~ - o|| over the scale the certificate is stated on (the denominator scale is
/// checked through the denominator: 0 here).
inline double scaled_error(const float* o, const exact_result& ex, const options& opt) {
  double e2 = 0.0;
  for (std::size_t i = 0; i < ex.output.size(); ++i)
    e2 += (double(o[i]) - ex.output[i]) * (double(o[i]) - ex.output[i]);
  const double err = std::sqrt(e2);
  switch (opt.scale) {
    case error_scale::kValueScale: return ex.value_scale > 0 ? err / ex.value_scale : err;
    case error_scale::kOutputNorm:
      return ex.output_norm > 0 ? err / ex.output_norm : (err > 0 ? INFINITY : 0.0);
    case error_scale::kDenominator: return 0.0;
  }
  return 0.0;
}

/// A history that routes its next call to the dense kernel (two calls that lost).
inline group_history routing_history(std::size_t G) {
  group_history h(G);
  const std::vector<int> none(G, -1);
  h.record_sparse(5.0, none, noise_key{0, 9, 9});
  h.record_sparse(5.0, none, noise_key{1, 9, 9});
  return h;
}

/// One KV head, token-major [n][stride] (stride >= d: padded rows are allowed).
template <storage_element T>
struct head_cache {
  std::size_t n = 0, d = 0, stride = 0;
  std::vector<T> keys, values;

  head_cache() = default;
  head_cache(std::size_t n_, std::size_t d_, std::size_t stride_ = 0)
      : n(n_), d(d_), stride(stride_ == 0 ? d_ : stride_), keys(n_ * stride), values(n_ * stride) {}
  template <class KF, class VF>
  head_cache(std::size_t n_, std::size_t d_, KF key_of, VF value_of) : head_cache(n_, d_) {
    for (std::size_t t = 0; t < n; ++t)
      for (std::size_t i = 0; i < d; ++i) {
        keys[t * stride + i] = T(float(key_of(t, i)));
        values[t * stride + i] = T(float(value_of(t, i)));
      }
  }
  strided_kv<T> view() const { return {keys.data(), values.data(), n, d, stride, stride}; }
  strided_kv<T> view(std::size_t tokens) const { return view().prefix(tokens); }
  matrix_view<T> key_matrix(std::size_t tokens) const {
    return make_matrix_view(keys.data(), tokens, d, stride);
  }
  matrix_view<T> value_matrix(std::size_t tokens) const {
    return make_matrix_view(values.data(), tokens, d, stride);
  }
};

/// A deterministic pseudo-normal stream (splitmix64 + Box-Muller) for generators.
inline double gauss(std::uint64_t a, std::uint64_t b = 0) {
  auto mix = [](std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  };
  const std::uint64_t h = mix(mix(a) ^ (b * 0x632be59bd9b4e019ULL));
  const double u1 = (double(h >> 11) + 0.5) * 0x1p-53;
  const double u2 = double(mix(h) >> 11) * 0x1p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

/// Default options on the sparse path whatever it costs (routing off): for the tests of
/// the sampler and the certificate, which small caches would otherwise route to exact
/// answers.
inline options sparse_options() {
  options o;
  o.route = routing::kOff;
  return o;
}

/// What one certified group call returned.
struct group_run {
  std::vector<float> out;
  std::vector<certificate> certs;
  group_stats stats;
  std::vector<std::vector<attend_workspace::sampled_key>> samples;  // per head
};

template <kv_view KV>
group_run run_group(const KV& kv, const key_index& idx, const std::vector<float>& q,
                    std::size_t group, const options& opt, const noise_key& nk,
                    group_history* history = nullptr) {
  // Levels within what a workspace takes, so that bad options reach attend_group's checks.
  attend_workspace ws(group, kv.head_dim(), kv.size(), std::clamp(opt.total_levels(), 0, 254));
  ws.record_samples(true);
  group_run r;
  r.out.assign(group * kv.head_dim(), 0.0f);
  r.certs.assign(group, certificate{});
  if (history)
    attend_group(std::span<const float>(q), group, kv, idx, nk, opt, std::span<float>(r.out),
                 std::span<certificate>(r.certs), ws, *history);
  else
    attend_group(std::span<const float>(q), group, kv, idx, nk, opt, std::span<float>(r.out),
                 std::span<certificate>(r.certs), ws);
  r.stats = ws.last_stats();
  for (std::size_t g = 0; g < group; ++g) {
    const auto s = ws.samples(g);
    r.samples.emplace_back(s.begin(), s.end());
  }
  return r;
}

/// Every field of a certificate is finite (bound, beta, scale_value, tau, max_score, D).
inline bool certificate_finite(const certificate& c) {
  return std::isfinite(c.tau) && std::isfinite(c.bound) && std::isfinite(c.beta) &&
         std::isfinite(c.scale_value) && std::isfinite(c.max_score) &&
         std::isfinite(c.denominator) && c.denominator > 0.0;
}

/// Empty when head g of a call agrees with its reference result; else what differs.
template <storage_element T>
std::string compare_head(const reference_result& r, const group_run& run, std::size_t g,
                         std::size_t d, double vmax, const options& opt) {
  const std::string head = "head " + std::to_string(g) + ": ";
  const certificate& f = run.certs[g];
  if (f.path != r.cert.path)
    return head + "path " + std::string(to_string(f.path)) + " vs reference " +
           std::string(to_string(r.cert.path));
  if (f.certified != r.cert.certified) return head + "certified differs";
  if (f.exact != r.cert.exact) return head + "exact differs";
  if (f.level != r.cert.level)
    return head + "level " + std::to_string(f.level) + " vs reference " +
           std::to_string(r.cert.level);
  if (f.heavy != r.cert.heavy) return head + "heavy count differs";
  if (f.sampled != r.cert.sampled) return head + "sampled count differs";
  // A routed call skips the max-score stage: its c is the dense kernel's float maximum.
  const bool routed = f.path == answer_path::kRouted;
  if (!routed && std::memcmp(&f.max_score, &r.cert.max_score, sizeof(double)) != 0)
    return head + "max_score differs";
  if (routed && !(std::fabs(f.max_score - r.cert.max_score) <=
                  1e-6 * std::max(1.0, std::fabs(r.cert.max_score))))
    return head + "max_score differs";
  // The exact answers run the float dense kernel; sampled levels sum in double.
  const double f_den =
      routed ? f.denominator * std::exp(f.max_score - r.cert.max_score) : f.denominator;
  if (!(std::fabs(f_den - r.cert.denominator) <= (f.exact ? 1e-5 : 1e-9) * r.cert.denominator))
    return head + "denominator differs";
  if (!f.exact) {
    // On the output-norm scale the bound divides by ||o^|| - beta, and both paths know
    // ||o^|| only to a few ulps of the values (o^ is a weighted mean of them, summed in
    // another order): an output that nearly cancels amplifies that, as for the outputs
    // below.
    double bound_tol = 1e-9 * std::max(1.0, r.cert.bound);
    if (opt.scale == error_scale::kOutputNorm && r.cert.scale_value > 0.0)
      bound_tol += r.cert.bound * 1e-12 * std::sqrt(double(d)) * vmax / r.cert.scale_value;
    if (!(std::fabs(f.bound - r.cert.bound) <= bound_tol)) return head + "bound differs";
    std::set<std::uint32_t> heavy, light;
    for (const auto& sk : run.samples[g]) (sk.heavy_level <= f.level ? heavy : light).insert(sk.token);
    for (std::size_t t = 0; t < r.sample_level.size(); ++t) {
      if (r.sample_level[t] < 0) continue;  // exact set
      const bool in = r.sample_level[t] <= f.level, hv = r.heavy_level[t] <= f.level;
      if ((in && hv) != bool(heavy.count(std::uint32_t(t))) ||
          (in && !hv) != bool(light.count(std::uint32_t(t))))
        return head + "sample differs at token " + std::to_string(t);
    }
  }
  // Float storage of a double computation summed in another order: relative to the
  // output, plus a term relative to the values for outputs that cancel to ~0.
  double err = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < d; ++i) {
    const float o = run.out[g * d + i];
    if (!std::isfinite(o)) return head + "non-finite output";
    err = std::max(err, std::fabs(double(o) - r.output[i]));
    norm = std::max(norm, std::fabs(r.output[i]));
  }
  if (!(err <= 1e-5 * norm + 1e-9 * vmax + 1e-44))
    return head + "output differs by " + std::to_string(err) + " (norm " + std::to_string(norm) + ")";
  return {};
}

/// The reference results of a whole group call (reference_attend_group() with the index's
/// value bounds); history: the group_history the call was given, as it was before it.
template <storage_element T>
std::vector<reference_result> reference_group(matrix_view<T> keys, matrix_view<T> values,
                                              const key_index& idx, const std::vector<float>& q,
                                              std::size_t group, const options& opt,
                                              const noise_key& nk,
                                              const group_history* history = nullptr,
                                              std::span<const int> level_hints = {}) {
  reference_extras extras{idx.value_center(), idx.value_cap(), idx.reach_floor()};
  extras.history = history;
  return reference_attend_group(std::span<const float>(q), group, keys, values, opt, nk, extras,
                                level_hints);
}

/// The largest |value| of the cache (the outputs' absolute tolerance scale).
template <storage_element T>
double max_abs_value(matrix_view<T> values) {
  double vmax = 0.0;
  for (std::size_t t = 0; t < values.rows; ++t)
    for (std::size_t i = 0; i < values.cols; ++i) vmax = std::max(vmax, std::fabs(to_double(values(t, i))));
  return vmax;
}

/// Empty when the call agrees with the reference for every head; else what differs.
/// Matrices are [n][d] with row stride `stride` (dense copies or the cache itself).
/// history: the group_history the call was given, as it was before the call.
template <storage_element T>
std::string compare_with_reference(matrix_view<T> keys, matrix_view<T> values,
                                   const key_index& idx, const std::vector<float>& q,
                                   std::size_t group, const options& opt, const noise_key& nk,
                                   const group_run& run, const group_history* history = nullptr,
                                   std::span<const int> level_hints = {}) {
  if (run.stats.bound_violations != 0) return "bound violations";
  const double vmax = max_abs_value(values);
  const auto refs = reference_group(keys, values, idx, q, group, opt, nk, history, level_hints);
  for (std::size_t g = 0; g < group; ++g) {
    std::string diff = compare_head<T>(refs[g], run, g, keys.cols, vmax, opt);
    if (!diff.empty()) return diff;
  }
  return {};
}

}  // namespace certattn::test
