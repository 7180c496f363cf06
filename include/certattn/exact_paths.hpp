// The certified call's exact answers: every path on which a head is answered by exact
// attention over its whole cache instead of by a level's estimate, with the certificate
// that exact answer's rounding allows (rounding.hpp, docs/certificate.md "Rounding"):
//   exact_heads      one pass of the dense kernel for the listed heads (float, with the
//                    double path where float cannot serve), writing each head's rounding
//   route_dense      a whole group the history routes (or a short sliding window)
//   route_positions  a routed multi-position call in one dense pass over shared tokens
// and the helpers both they and the stages use (score magnitudes, norms, statistics).
// attend_stages.hpp builds the stage sequence on these; level_loop.hpp is the per-head
// level loop. Internal: use attend_group() (attend.hpp).
#pragma once

#include <certattn/arch/score_dot.hpp>
#include <certattn/call_context.hpp>
#include <certattn/certificate.hpp>
#include <certattn/dense.hpp>
#include <certattn/index.hpp>
#include <certattn/layout.hpp>
#include <certattn/rounding.hpp>
#include <certattn/variant.hpp>
#include <certattn/workspace.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

namespace certattn::detail {

/// The exact answer paths of the certified call (see the top of this file).
struct exact_paths : row_access {
  // ---- statistics ---------------------------------------------------------------------
  /// A call's statistics before its stages: zero counts, its tokens and pool.
  static void begin_stats(const call_context& cx, attend_workspace& ws) {
    group_stats& stats = ws.stats_;
    stats = {};
    if (ws.record_ && cx.head0 == 0) ws.recorded_.assign(std::max(cx.heads, cx.group), {});
    stats.tokens = cx.n;
    stats.pool = cx.pool_end;
  }

  /// total += s, field by field (the per-position statistics of a multi-position call).
  static void add_stats(group_stats& total, const group_stats& s) noexcept {
    total.candidates += s.candidates;
    total.refined += s.refined;
    total.keys_read += s.keys_read;
    total.values_read += s.values_read;
    total.fallbacks += s.fallbacks;
    total.over_budget += s.over_budget;
    total.routed += s.routed;
    total.sampled += s.sampled;
    total.bytes_read += s.bytes_read;
    total.bound_violations += s.bound_violations;
    total.refine_blocks += s.refine_blocks;
    total.scattered_lines += s.scattered_lines;
    for (int i = 0; i < 6; ++i) total.stage_seconds[i] += s.stage_seconds[i];
  }

  // ---- exact attention for listed heads ------------------------------------------------
  /// The terms exact attention sums for head g: the attended tokens and its sink.
  static std::size_t exact_terms(const call_context& cx, std::size_t g) noexcept {
    return cx.attended() + (cx.head(g).has_sink ? 1 : 0);
  }

  /// What rounding.hpp's bounds take as S for head g: score_magnitude() through the
  /// variant (head_variant::score_magnitude()).
  static double variant_magnitude(const float* q, std::size_t g,
                                  const call_context& cx) noexcept {
    return cx.head(g).score_magnitude(score_magnitude(q, cx.d, cx.scale, cx.key_abs_max));
  }

  /// scale ||q||_1 max|k| >= |s_i| and >= scale sum_j |q_j k_ij| for every token: what the
  /// rounding bounds of rounding.hpp scale with.
  static double score_magnitude(const float* q, std::size_t d, double scale,
                                double key_abs_max) noexcept {
    double l1 = 0.0;
    for (std::size_t j = 0; j < d; ++j) l1 += std::fabs(double(q[j]));
    return scale * l1 * key_abs_max;
  }

  /// Exact attention for the heads ws.exact_heads_[0..m): one pass of the dense kernel over
  /// the cache for all of them (fallbacks, heads over budget, routed groups). ws.head_max_[g]
  /// is the head's maximum score c, or NaN when the call has not computed it (routed
  /// groups skip the max-score stage): then c is the dense kernel's running maximum, or
  /// the exact maximum on the double path. Writes each head's output, its c into
  /// ws.head_max_[g], D relative to c into ws.window_weight_[g] and what bounds its
  /// rounding into ws.exact_rounding_[g] (rounding.hpp). The float kernel cannot serve
  /// scores far from 0 (it cannot resolve their weights), a scale or scaled query beyond
  /// float's range, or values whose weighted sum overflows float: those heads take the
  /// double path (lane-fixed exact scores, double sums), as does any result that is not
  /// finite, and every head when `force_double` is set. `value_norm_max` >= max_i ||v_i||.
  template <kv_view KV>
  static void exact_heads(const KV& kv, const key_index& idx, const float* queries,
                          const call_context& cx, std::size_t m, float* out,
                          attend_workspace& ws, bool force_double, double value_norm_max) {
    const std::size_t d = cx.d, dv = cx.dv, n = cx.n, first = cx.first;
    const double scale = cx.scale;
    const isa which = cx.kernels.which;
    const bool float_scale = scale <= 0x1p100 && !force_double;
    std::size_t k = 0;  // heads of the float pass, gathered in ws.exact_q_
    for (std::size_t i = 0; i < m; ++i) {
      const std::size_t g = ws.exact_heads_[i];
      const float* q = queries + g * d;
      double qmax = 0.0;
      for (std::size_t j = 0; j < d; ++j) qmax = std::max(qmax, std::fabs(double(q[j])));
      ws.exact_float_[i] = float_scale && scale * qmax <= 0x1p100 && !(std::fabs(ws.head_max_[g]) > 1024.0);
      if (ws.exact_float_[i]) {
        ws.exact_slopes_[k] = float(cx.head(g).slope);
        std::copy_n(q, d, ws.exact_q_.data() + k++ * d);
      }
    }
    if (k > 0) {
      // The float pass computes the variant's scores; the sinks join below, in double.
      attention_variant scores_only;
      scores_only.logit_softcap = cx.user.variant.logit_softcap;
      if (!cx.user.variant.alibi_slopes.empty())
        scores_only.alibi_slopes = std::span<const float>(ws.exact_slopes_.data(), k);
      dense_partial(std::span<const float>(ws.exact_q_.data(), k * d), k, kv, float(scale), first, n,
                    std::span<float>(ws.exact_m_.data(), k), std::span<float>(ws.exact_l_.data(), k),
                    std::span<float>(ws.exact_out_.data(), k * dv), ws.dense_ws_, scores_only);
    }
    std::size_t f = 0;  // the float pass's row of the next head that joined it
    for (std::size_t i = 0; i < m; ++i) {
      const std::size_t g = ws.exact_heads_[i];
      const head_variant hv = cx.head(g);
      const float* q = queries + g * d;
      float* o = out + g * dv;
      double& c = ws.head_max_[g];
      const double magnitude = variant_magnitude(q, g, cx);
      exact_rounding& r = ws.exact_rounding_[g];
      r = {};
      r.head_dim = dv;
      if (ws.exact_float_[i]) {
        const float mk = ws.exact_m_[f], lk = ws.exact_l_[f];
        const float* ok = ws.exact_out_.data() + f * dv;
        ++f;
        double cref = std::isnan(c) ? double(mk) : c;
        if (std::isnan(c) && hv.has_sink) cref = std::max(cref, hv.sink);
        bool finite = std::fabs(cref) <= 1024.0;
        const double keys_weight = double(lk) * std::exp(double(mk) - cref);
        const double den = keys_weight + (hv.has_sink ? std::exp(hv.sink - cref) : 0.0);
        // o = acc e^{m - c} / D: acc / l without a sink.
        const double to_out = hv.has_sink ? std::exp(double(mk) - cref) / den : 1.0 / double(lk);
        for (std::size_t j = 0; j < dv; ++j)
          finite &= std::isfinite(o[j] = hv.has_sink ? float(double(ok[j]) * to_out) : ok[j] / lk);
        if (finite && keys_weight > 0.0 && std::isfinite(den)) {
          c = cref;
          ws.window_weight_[g] = den;
          r.eta = dense_kernel_eta(exact_terms(cx, g), d, magnitude);
          r.spread = value_norm_max;  // >= sum_i a_i ||v_i||; value scale: <= M
          continue;
        }
      }
      auto score = [&](std::size_t t) {
        return hv.score(scale * score_dot_fast(q, key_of(kv, t, cx), d, which), t);
      };
      if (std::isnan(c)) {  // the exact maximum, for the double path's weights
        c = hv.has_sink ? hv.sink : -std::numeric_limits<double>::infinity();
        for (std::size_t t = first; t < n; ++t) c = std::max(c, score(t));
      }
      std::fill(ws.exact_num_.begin(), ws.exact_num_.end(), 0.0);
      double den = hv.has_sink ? std::exp(hv.sink - c) : 0.0, sq = 0.0;
      for (std::size_t t = first; t < n; ++t) {
        const double w = std::exp(score(t) - c);
        den += w;
        sq += w * accumulate_row(value_of(kv, t, cx), dv, w, ws.exact_num_.data(), which);
      }
      for (std::size_t j = 0; j < dv; ++j) o[j] = float(ws.exact_num_[j] / den);
      ws.window_weight_[g] = den;
      r.eta = double_path_eta(exact_terms(cx, g), magnitude + std::fabs(c) * 0x1p-40);
      r.value_scale = std::sqrt(sq / den);
      r.spread = value_scale_upper(r);
    }
  }

  /// ||o|| of a head's float output.
  static double output_norm(const float* o, std::size_t d) noexcept {
    double a = 0.0;
    for (std::size_t j = 0; j < d; ++j) a += double(o[j]) * double(o[j]);
    return std::sqrt(a);
  }

  /// max_i ||v_i|| over the whole cache, rounded up, from the index's distances to the
  /// value centre (+inf when a value overflowed them).
  static double value_norm_max(const call_context& cx) noexcept {
    if (cx.value_overflow) return std::numeric_limits<double>::infinity();
    return (cx.center_norm + cx.value_distance_max) * (1.0 + 0x1p-40);
  }

  // ---- routed groups and positions -----------------------------------------------------
  /// The whole group by the dense kernel (group_history routed it): exact attention, with
  /// the certificate its rounding allows (rounding.hpp): the float kernel's bound where it
  /// meets epsilon, else the head again on the double path, else not certified.
  /// `path`: kRouted, or kNoPool for a short sliding window read whole.
  template <kv_view KV>
  static void route_dense(const KV& kv, const key_index& idx, std::span<const float> queries,
                          const call_context& cx, std::span<float> out,
                          std::span<certificate> certs, attend_workspace& ws, answer_path path) {
    const std::size_t n = cx.attended(), d = cx.dv, group = cx.group;
    for (std::size_t g = 0; g < group; ++g) {
      ws.exact_heads_[g] = std::uint32_t(g);
      ws.head_max_[g] = std::numeric_limits<double>::quiet_NaN();
      if (ws.record_) ws.recorded_[cx.head0 + g].clear();
    }
    const double vmax = value_norm_max(cx);
    exact_heads(kv, idx, queries.data(), cx, group, out.data(), ws, false, vmax);
    group_stats& stats = ws.stats_;
    stats.keys_read = stats.values_read = n;
    stats.routed = path == answer_path::kRouted ? group : 0;
    stats.dense_bytes = stats.bytes_read = n * (cx.key_bytes + cx.value_bytes);
    std::size_t redo = 0;  // heads whose float bound missed epsilon, for the double path
    for (std::size_t g = 0; g < group; ++g) {
      certificate& cert = certs[g];
      cert = {};
      cert.exact = true;
      cert.path = path;
      cert.max_score = ws.head_max_[g];
      cert.denominator = ws.window_weight_[g];
      cert.keys_read = cert.values_read = n;
      certify_exact_answer(ws.exact_rounding_[g], output_norm(out.data() + g * d, d),
                           cert.denominator, cx.user, cert);
      const bool on_double_path = !std::isnan(ws.exact_rounding_[g].value_scale);
      if (!cert.certified && !on_double_path) ws.exact_heads_[redo++] = std::uint32_t(g);
    }
    if (redo > 0) {
      exact_heads(kv, idx, queries.data(), cx, redo, out.data(), ws, true, vmax);
      stats.bytes_read += redo * n * (cx.key_bytes + cx.value_bytes);  // the double path: a pass per head
      for (std::size_t i = 0; i < redo; ++i) {
        const std::size_t g = ws.exact_heads_[i];
        certificate& cert = certs[g];
        cert.max_score = ws.head_max_[g];
        cert.denominator = ws.window_weight_[g];
        certify_exact_answer(ws.exact_rounding_[g], output_norm(out.data() + g * d, d),
                             cert.denominator, cx.user, cert);
      }
    }
    for (std::size_t g = 0; g < group; ++g) certs[g].bytes_read = stats.bytes_read / group;
  }

  /// The routed call of Q positions (run_positions()) in one pass of the dense kernel over
  /// the tokens every position attends, [lo, hi) = [the newest position's first token,
  /// n - Q + 1), for all Q G queries, as dense_attend_positions() reads them; each
  /// position's other tokens (the drafts before it, and the sliding window's older tokens
  /// it still sees) join its heads' sums in double. Each head's certificate bounds every
  /// term's relative error by the larger of the float pass's (dense_kernel_eta() over its
  /// hi - lo tokens, then the rescale to the head's reference in double and the double
  /// sums) and the double terms' (double_path_eta()); a head whose bound misses epsilon is
  /// answered again on the double path over its own tokens, as route_dense() does. A
  /// position bias (ALiBi) enters the pass relative to the newest token, n - 1: position p
  /// sees every score shifted by slope (n - n_p), a constant the softmax cancels, so its
  /// running maximum is the pass's plus that shift (exact in double) and its sums are the
  /// pass's. False (nothing answered) where the pass does not apply: one position, no
  /// shared token, or a query the float pass does not take.
  template <kv_view KV, class ContextOf>
  static bool route_positions(const KV& kv, const key_index& idx, std::span<const float> queries,
                              std::size_t Q, std::size_t G, const ContextOf& context_of,
                              std::span<float> out, std::span<certificate> certs,
                              attend_workspace& ws, group_stats& total) {
    using namespace detail;
    const std::size_t n = kv.size(), d = kv.head_dim(), dv = value_dim_of(kv);
    const call_context newest = context_of(kv_prefix<KV>(kv, n), Q - 1);
    const std::size_t lo = newest.first, hi = n - Q + 1;
    if (Q < 2 || lo >= hi || newest.scale > 0x1p100)
      return false;  // one position: route_dense(), as attend_group() answers it
    for (std::size_t i = 0; i < Q * G; ++i) {
      double qmax = 0.0;
      for (std::size_t j = 0; j < d; ++j)
        qmax = std::max(qmax, std::fabs(double(queries[i * d + j])));
      if (newest.scale * qmax > 0x1p100) return false;
    }
    const isa which = newest.kernels.which;
    attention_variant scores_only;  // the float pass's scores; the sinks join below
    scores_only.logit_softcap = newest.user.variant.logit_softcap;
    const std::span<const float> slopes = newest.user.variant.alibi_slopes;
    if (!slopes.empty()) {  // each row its head's slope, relative to token n - 1
      for (std::size_t r = 0; r < Q * G; ++r) ws.exact_slopes_[r] = slopes[r % G];
      scores_only.alibi_slopes = std::span<const float>(ws.exact_slopes_.data(), Q * G);
    }
    dense_partial(queries, Q * G, kv, float(newest.scale), lo, hi,
                  std::span<float>(ws.exact_m_.data(), Q * G),
                  std::span<float>(ws.exact_l_.data(), Q * G),
                  std::span<float>(ws.exact_out_.data(), Q * G * dv), ws.dense_ws_, scores_only);
    const std::size_t row_bytes = newest.key_bytes + newest.value_bytes;
    for (std::size_t p = 0; p < Q; ++p) {
      const kv_prefix<KV> view(kv, n - Q + 1 + p);
      const call_context cx = context_of(view, p);
      begin_stats(cx, ws);
      const double vmax = value_norm_max(cx);
      const std::size_t tail = cx.attended() - (hi - lo);  // [first, lo) and [hi, n_p)
      std::size_t redo = 0;
      for (std::size_t g = 0; g < G; ++g) {
        const std::size_t r = p * G + g;
        const head_variant hv = cx.head(g);
        const float* q = queries.data() + r * d;
        float* o = out.data() + r * dv;
        if (ws.record_) ws.recorded_[cx.head0 + g].clear();
        auto score = [&](std::size_t t) {
          return hv.score(cx.scale * score_dot_fast(q, key_of(view, t, cx), d, which), t);
        };
        // The pass's maximum as position p's: its bias is relative to token n - 1, position
        // p's to n_p - 1 (slope times a token count below 2^24: exact in double).
        const double bias_shift = hv.slope * double(n - cx.n);
        const double mf = double(ws.exact_m_[r]) + bias_shift, lf = ws.exact_l_[r];
        double c = mf;
        for (std::size_t t = cx.first; t < lo; ++t) c = std::max(c, score(t));
        for (std::size_t t = hi; t < cx.n; ++t) c = std::max(c, score(t));
        if (hv.has_sink) c = std::max(c, hv.sink);
        const double to_ref = std::exp(mf - c);
        double den = lf * to_ref + (hv.has_sink ? std::exp(hv.sink - c) : 0.0);
        double* num = ws.exact_num_.data();
        for (std::size_t j = 0; j < dv; ++j) num[j] = double(ws.exact_out_[r * dv + j]) * to_ref;
        auto join = [&](std::size_t t) {
          const double w = std::exp(score(t) - c);
          den += w;
          accumulate_row(value_of(view, t, cx), dv, w, num, which);
        };
        for (std::size_t t = cx.first; t < lo; ++t) join(t);
        for (std::size_t t = hi; t < cx.n; ++t) join(t);
        bool finite = std::isfinite(den) && den > 0.0 && std::fabs(c) <= 1024.0;
        for (std::size_t j = 0; j < dv; ++j) finite &= std::isfinite(o[j] = float(num[j] / den));
        const double magnitude = variant_magnitude(q, g, cx);
        // The pass's scores carry the bias relative to token n - 1: the newest position's
        // magnitude bounds them (its first token is lo, the pass's first).
        const double pass_magnitude = std::max(magnitude, variant_magnitude(q, g, newest));
        exact_rounding& er = ws.exact_rounding_[g];
        er = {};
        er.head_dim = dv;
        ws.head_max_[g] = c;
        ws.window_weight_[g] = den;
        certificate& cert = certs[r];
        cert = {};
        cert.exact = true;
        cert.path = answer_path::kRouted;
        cert.keys_read = cert.values_read = cx.attended();
        if (finite) {
          // The float pass's terms: its own error, then e^(mf - c) (the bias shift's sum,
          // the argument and exp in double) and the double sums they join; the other
          // terms: the double path's.
          const double sums = rounding_gamma(double(tail) + 3.0, kDoubleUnit);
          const double shift =
              3.0001 * kDoubleUnit * (pass_magnitude + std::fabs(c)) + 4.0 * kDoubleUnit;
          const double eta_f = dense_kernel_eta(hi - lo, d, pass_magnitude);
          const double float_terms = compose_relative(eta_f + sums + eta_f * sums, shift);
          const double double_terms = double_path_eta(tail + 3, magnitude + std::fabs(c) * 0x1p-40);
          er.eta = std::max(float_terms, double_terms) * (1.0 + 0x1p-40);
          er.spread = vmax;  // uncentred sums: >= sum_i a_i ||v_i||
          cert.max_score = c;
          cert.denominator = den;
          certify_exact_answer(er, output_norm(o, dv), den, cx.user, cert);
        }
        if (!cert.certified) {
          ws.exact_heads_[redo++] = std::uint32_t(g);
          ws.head_max_[g] = std::numeric_limits<double>::quiet_NaN();
        }
      }
      group_stats& stats = ws.stats_;
      stats.keys_read = stats.values_read = cx.attended();
      stats.routed = G;
      stats.dense_bytes = cx.attended() * row_bytes;
      // The shared pass's bytes once (at the newest position), each position's own tokens.
      stats.bytes_read = (tail + (p + 1 == Q ? hi - lo : 0)) * row_bytes;
      if (redo > 0) {
        const float* qp = queries.data() + p * G * d;
        float* op = out.data() + p * G * dv;
        exact_heads(view, idx, qp, cx, redo, op, ws, true, vmax);
        stats.bytes_read += redo * cx.attended() * row_bytes;  // the double path: a pass per head
        for (std::size_t i = 0; i < redo; ++i) {
          const std::size_t g = ws.exact_heads_[i];
          certificate& cert = certs[p * G + g];
          cert.max_score = ws.head_max_[g];
          cert.denominator = ws.window_weight_[g];
          certify_exact_answer(ws.exact_rounding_[g], output_norm(op + g * dv, dv),
                               cert.denominator, cx.user, cert);
        }
      }
      for (std::size_t g = 0; g < G; ++g) certs[p * G + g].bytes_read = stats.bytes_read / G;
      add_stats(total, stats);
    }
    return true;
  }
};

}  // namespace certattn::detail
