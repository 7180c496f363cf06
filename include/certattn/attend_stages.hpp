// The stages of the certified call for one GQA group (G query heads sharing one KV head),
// in the order attend_stages::run() calls them, one function each:
//   route          a group its history routes is answered by the dense kernel at once
//   window         exact scores of the rows every head reads (the newest tokens and the
//                  exact set: the classic certificate's value outliers, or values beyond
//                  float's range), all G heads in one pass over the key rows
//   scan           4-bit score bounds u_i >= s_i for every pool key and all G heads at once
//   perturbations  E_up >= E_i for every pool key (with the value-aware offsets)
//   max score      c = exact maximum over the keys whose bound can reach the best lower
//                  bound, per head; then the window's value sums of all heads in one pass
//   heads          per head: group_answer::answer_head() runs the head's level loop
//                  (level_loop.hpp: candidates bucketed by earliest level, 8-bit
//                  refinement, exact keys, heavy, light or out, the certificate of
//                  docs/certificate.md), or answers it exactly without a pool, or queues
//                  it for the exact pass
//   exact answers  one dense pass for the heads no level certified (or over budget)
//   accounting     bytes read, and what the group's history keeps
// Routing, the exact pass and their rounding certificates are exact_paths.hpp's; the
// stages from the perturbations on are one group_answer object per position, which holds
// what they share (the cache, the index, the queries, the outputs, the workspace).
// What every stage reads (call_context, the kernel table, row prefetches) is
// call_context.hpp's. The call computes exactly the samples of reference_attend() (same
// perturbations, same scores bit for bit, same sets) while reading a small fraction of
// the cache. A variant (options::variant) enters as data of the call context: the sliding
// window moves the pool's start, the scores go through head_variant::score(), the scan's
// bounds through the same transform rounded up (arch/variant_kernels.hpp), and a sink is
// one more exact term of value 0. Internal: use attend_group() (attend.hpp).
#pragma once

#include <certattn/arch/dispatch.hpp>
#include <certattn/arch/score_dot.hpp>
#include <certattn/arch/variant_kernels.hpp>
#include <certattn/call_context.hpp>
#include <certattn/certificate.hpp>
#include <certattn/dense.hpp>
#include <certattn/exact_paths.hpp>
#include <certattn/history.hpp>
#include <certattn/index.hpp>
#include <certattn/layout.hpp>
#include <certattn/level_loop.hpp>
#include <certattn/options.hpp>
#include <certattn/perturb.hpp>
#include <certattn/rounding.hpp>
#include <certattn/sampler.hpp>
#include <certattn/scan.hpp>
#include <certattn/variant.hpp>
#include <certattn/workspace.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

namespace certattn::detail {

/// What the heads of one call share as they are answered in order.
struct group_progress {
  std::size_t spent = 0;        // pool keys the heads so far took into their samples
  std::size_t exact_count = 0;  // heads answered exactly so far (ws.exact_heads_)
};

template <kv_view KV>
struct group_answer;  // below: the stages after the scan, per position

/// The stages of the certified call (see the top of this file), on the exact answer paths
/// of exact_paths.hpp.
struct attend_stages : exact_paths {
  // ---- the call, stage by stage -------------------------------------------------------
  template <kv_view KV>
  static void run(std::span<const float> queries, std::size_t group, const KV& kv,
                  const key_index& idx, const noise_key& nk, const options& user_opt,
                  std::span<float> out, std::span<certificate> certs, attend_workspace& ws,
                  std::span<const int> level_hints, group_history* history) {
    // The history's hints only where they are independent of this call's perturbations.
    if (history) level_hints = history->hints_for(nk);
    call_context context = make_context(group, kv, idx, nk, user_opt, level_hints, history);
    context.decoded = ws.decoded_.data();
    context.heads = group;
    const call_context& cx = context;
    begin_stats(cx, ws);
    // Routing times what it compares (history.hpp, cost_model::measured): two clock reads.
    const bool timed = history && user_opt.route == routing::kAuto && user_opt.cost.measured;
    const double t_start = timed ? stage_clock::now() : 0.0;
    if (cx.pool_end > cx.first && history && history->routes_dense(user_opt)) {
      route_dense(kv, idx, queries, cx, out, certs, ws, answer_path::kRouted);
      if (timed)
        history->record_dense(stage_clock::now() - t_start, cx.attended());
      else
        history->record_dense();
      return;
    }
    // A short sliding window is read whole, by the dense kernel (options::kMinSlidingPool).
    if (user_opt.short_sliding_window(cx.n)) {
      route_dense(kv, idx, queries, cx, out, certs, ws, answer_path::kNoPool);
      for (std::size_t g = 0; g < group; ++g) ws.head_levels_[g] = -1;
      return;
    }
    stage_clock clock{ws.time_stages_};
    double* seconds = ws.stats_.stage_seconds;
    prepare_queries(queries, group, cx, ws);
    fixed_scores(kv, queries.data(), cx, ws);
    clock.lap(seconds[0]);
    if (cx.pool_end > cx.first) {
      scan_bounds(idx, cx, group, cx.pool_end, cx.first_block(), ws);
      finish_bounds(cx, ws);
    }
    clock.lap(seconds[1]);
    const group_progress progress =
        group_answer<KV>(kv, idx, queries.data(), cx, out, certs, ws, clock).run(true, true);
    if (history) {
      // The call's cost relative to the dense kernel: measured, once this group's dense
      // kernel has been timed, else the cost model's prediction.
      const double predicted = user_opt.cost.predicted(ws.stats_.sampled, cx.attended()) +
                               (progress.exact_count > 0 ? 1.0 : 0.0);
      const double measured =
          timed ? history->measured_cost(stage_clock::now() - t_start, cx.attended())
                : std::numeric_limits<double>::quiet_NaN();
      const bool was_measured = !std::isnan(measured);
      history->record_sparse(was_measured ? measured : predicted,
                             std::span<const int>(ws.head_levels_.data(), group), nk,
                             was_measured ? predicted : std::numeric_limits<double>::quiet_NaN());
    }
  }

  // ---- several positions --------------------------------------------------------------
  /// attend_positions(): Q positions of G heads each, position p at token n - Q + p, over
  /// the cache up to its own token (kv_prefix). Each position is the call attend_group()
  /// would make on that prefix with noise_key::position = p, except that the index is
  /// scanned once, for all Q G queries over the widest pool, before the positions are
  /// answered in order. The history gives every position its hints and routes the whole
  /// call; it keeps the newest position's levels, and costs per position.
  template <kv_view KV>
  static void run_positions(std::span<const float> queries, std::size_t positions,
                            std::size_t group, const KV& kv, const key_index& idx,
                            const noise_key& nk, const options& user_opt, std::span<float> out,
                            std::span<certificate> certs, attend_workspace& ws,
                            std::span<const int> level_hints, group_history* history) {
    if (history) level_hints = history->hints_for(nk);
    const std::size_t Q = positions, G = group, n = kv.size(), d = kv.head_dim();
    const std::size_t dv = value_dim_of(kv);
    auto position_context = [&](const kv_prefix<KV>& view, std::size_t p) {
      noise_key nk_p = nk;
      nk_p.position = std::uint32_t(p);
      call_context cx = make_context(G, view, idx, nk_p, user_opt, level_hints, history);
      cx.decoded = ws.decoded_.data();
      cx.head0 = p * G;
      cx.heads = Q * G;
      return cx;
    };
    const kv_prefix<KV> newest(kv, n);
    const bool timed = history && user_opt.route == routing::kAuto && user_opt.cost.measured;
    const double t_start = timed ? stage_clock::now() : 0.0;
    group_stats total;
    auto add = [&](const group_stats& s) { add_stats(total, s); };
    // Routed: every position by the dense kernel, as attend_group() routes one.
    {
      const call_context cx = position_context(newest, Q - 1);
      if (cx.pool_end > cx.first && history && history->routes_dense(user_opt)) {
        // One pass over the tokens every position attends where it applies, else a dense
        // pass per position.
        if (!route_positions(kv, idx, queries, Q, G, position_context, out, certs, ws, total))
          for (std::size_t p = 0; p < Q; ++p) {
            const kv_prefix<KV> view(kv, n - Q + 1 + p);
            const call_context cp = position_context(view, p);
            begin_stats(cp, ws);
            route_dense(view, idx, queries.subspan(p * G * d, G * d), cp,
                        out.subspan(p * G * dv, G * dv), certs.subspan(p * G, G), ws,
                        answer_path::kRouted);
            add(ws.stats_);
          }
        ws.stats_ = total;
        ws.stats_.dense_bytes = cx.attended() * (cx.key_bytes + cx.value_bytes);
        if (timed)
          history->record_dense((stage_clock::now() - t_start) / double(Q), cx.attended());
        else
          history->record_dense();
        return;
      }
    }
    // The shared scan: all positions' heads over the union of their pools.
    stage_clock clock{ws.time_stages_};
    std::size_t scan_end = 0, scan_first = n;
    for (std::size_t p = 0; p < Q; ++p) {
      const kv_prefix<KV> view(kv, n - Q + 1 + p);
      const call_context cx = position_context(view, p);
      if (user_opt.short_sliding_window(cx.n) || cx.pool_end <= cx.first) continue;
      scan_end = std::max(scan_end, cx.pool_end);
      scan_first = std::min(scan_first, cx.first);
    }
    double scan_seconds = 0.0;
    {
      const call_context cx = position_context(newest, 0);
      prepare_queries(queries, Q * G, cx, ws);
      if (scan_end > scan_first)
        scan_bounds(idx, cx, Q * G, scan_end, scan_first / key_index::kBlockTokens, ws);
      clock.lap(scan_seconds);
    }
    bool any_exact = false;
    for (std::size_t p = 0; p < Q; ++p) {
      const kv_prefix<KV> view(kv, n - Q + 1 + p);
      const call_context cx = position_context(view, p);
      const float* q = queries.data() + p * G * d;
      const std::span<float> out_p = out.subspan(p * G * dv, G * dv);
      const std::span<certificate> certs_p = certs.subspan(p * G, G);
      begin_stats(cx, ws);
      if (user_opt.short_sliding_window(cx.n)) {
        route_dense(view, idx, queries.subspan(p * G * d, G * d), cx, out_p, certs_p, ws,
                    answer_path::kNoPool);
        for (std::size_t g = 0; g < G; ++g) ws.head_levels_[g] = -1;
        add(ws.stats_);
        continue;
      }
      double* seconds = ws.stats_.stage_seconds;
      seconds[1] = p == 0 ? scan_seconds : 0.0;
      fixed_scores(view, q, cx, ws);
      clock.lap(seconds[0]);
      if (cx.pool_end > cx.first) finish_bounds(cx, ws);
      clock.lap(seconds[1]);
      any_exact |= group_answer<kv_prefix<KV>>(view, idx, q, cx, out_p, certs_p, ws, clock)
                       .run(p + 1 == Q, p + 1 == Q)
                       .exact_count > 0;
      add(ws.stats_);
    }
    const std::size_t attended = n - user_opt.variant.first_token(n);
    total.tokens = n;
    total.pool = ws.stats_.pool;
    total.dense_bytes = ws.stats_.dense_bytes;
    ws.stats_ = total;
    if (history) {
      const double predicted =
          user_opt.cost.predicted(total.sampled / Q, attended) + (any_exact ? 1.0 : 0.0);
      const double measured =
          timed ? history->measured_cost((stage_clock::now() - t_start) / double(Q), attended)
                : std::numeric_limits<double>::quiet_NaN();
      const bool was_measured = !std::isnan(measured);
      history->record_sparse(was_measured ? measured : predicted,
                             std::span<const int>(ws.head_levels_.data(), group), nk,
                             was_measured ? predicted : std::numeric_limits<double>::quiet_NaN());
    }
  }

  // ---- several sequences over a shared prefix ----------------------------------------
  /// attend_sequences(): S sequences of G heads each, sequence s over views[s], whose
  /// first idx.size() tokens are the prefix the index holds. Each is the call
  /// attend_group() would make on its view with nk.sequence = sequences[s], an index of
  /// the prefix alone (its pool ends at the prefix; its own tokens are read exactly with
  /// the window), except that the index is scanned once, for all S G queries over the
  /// widest pool, before the sequences are answered in order. ws.tails_ holds each
  /// view's tail maxima (check_sequences_call()). Each history (if any) routes, hints and
  /// keeps its own sequence; a sequence's measured cost is its own time plus its share
  /// of the scan.
  template <kv_view KV>
  static void run_sequences(std::span<const float> queries, std::size_t group,
                            std::span<const KV> views, const key_index& idx, const noise_key& nk,
                            std::span<const std::uint64_t> sequences, const options& user_opt,
                            std::span<float> out, std::span<certificate> certs,
                            attend_workspace& ws, std::span<const int> level_hints,
                            std::span<group_history* const> histories) {
    const std::size_t S = views.size(), G = group, d = views[0].head_dim();
    const std::size_t dv = value_dim_of(views[0]);
    auto history_of = [&](std::size_t s) { return histories.empty() ? nullptr : histories[s]; };
    auto key_of_sequence = [&](std::size_t s) {
      noise_key k = nk;
      k.sequence = sequences[s];
      return k;
    };
    auto sequence_context = [&](std::size_t s) {
      group_history* h = history_of(s);
      const noise_key k = key_of_sequence(s);
      const std::span<const int> hints =
          h ? h->hints_for(k) : level_hints.empty() ? level_hints : level_hints.subspan(s * G, G);
      call_context cx = make_context(G, views[s], idx, k, user_opt, hints, h, idx.size());
      cx.decoded = ws.decoded_.data();
      cx.head0 = s * G;
      cx.heads = S * G;
      // The rounding bounds cover the sequence's own rows too.
      const tail_rows& tail = ws.tails_[s];
      cx.key_abs_max = std::max(cx.key_abs_max, double(tail.key_abs_max));
      cx.value_distance_max = std::max(cx.value_distance_max, double(tail.value_distance_max));
      cx.value_overflow = cx.value_overflow || tail.value_overflow;
      return cx;
    };
    const bool timed_routing = user_opt.route == routing::kAuto && user_opt.cost.measured;
    auto routed = [&](const call_context& cx, std::size_t s) {
      group_history* h = history_of(s);
      return cx.pool_end > cx.first && h && h->routes_dense(user_opt);
    };
    auto sparse = [&](const call_context& cx, std::size_t s) {
      return !routed(cx, s) && !user_opt.short_sliding_window(cx.n) && cx.pool_end > cx.first;
    };
    // The shared scan: every sparse sequence's heads over the union of their pools.
    stage_clock clock{ws.time_stages_};
    std::size_t scan_end = 0, scan_first = idx.size(), scanned = 0;
    for (std::size_t s = 0; s < S; ++s) {
      const call_context cx = sequence_context(s);
      if (!sparse(cx, s)) continue;
      scan_end = std::max(scan_end, cx.pool_end);
      scan_first = std::min(scan_first, cx.first);
      ++scanned;
    }
    double scan_seconds = 0.0;
    const double t_scan = timed_routing ? stage_clock::now() : 0.0;
    {
      const call_context cx = sequence_context(0);
      prepare_queries(queries, S * G, cx, ws);
      if (scan_end > scan_first)
        scan_bounds(idx, cx, S * G, scan_end, scan_first / key_index::kBlockTokens, ws);
      clock.lap(scan_seconds);
    }
    const double scan_share = timed_routing && scanned > 0
                                  ? (stage_clock::now() - t_scan) / double(scanned)
                                  : 0.0;
    group_stats total;
    std::size_t dense_tokens = 0, max_n = 0;
    for (std::size_t s = 0; s < S; ++s) {
      const KV& kv = views[s];
      const call_context cx = sequence_context(s);
      group_history* h = history_of(s);
      const float* q = queries.data() + s * G * d;
      const std::span<float> out_s = out.subspan(s * G * dv, G * dv);
      const std::span<certificate> certs_s = certs.subspan(s * G, G);
      const bool timed = h && timed_routing;
      const double t_start = timed ? stage_clock::now() : 0.0;
      max_n = std::max(max_n, cx.n);
      // The tokens the dense baseline reads for this sequence beyond the shared prefix.
      dense_tokens += s == 0 ? cx.attended() : cx.n - std::max(cx.first, idx.size());
      begin_stats(cx, ws);
      if (routed(cx, s)) {
        route_dense(kv, idx, queries.subspan(s * G * d, G * d), cx, out_s, certs_s, ws,
                    answer_path::kRouted);
        add_stats(total, ws.stats_);
        if (timed)
          h->record_dense(stage_clock::now() - t_start, cx.attended());
        else
          h->record_dense();
        continue;
      }
      if (user_opt.short_sliding_window(cx.n)) {
        route_dense(kv, idx, queries.subspan(s * G * d, G * d), cx, out_s, certs_s, ws,
                    answer_path::kNoPool);
        for (std::size_t g = 0; g < G; ++g) ws.head_levels_[g] = -1;
        add_stats(total, ws.stats_);
        continue;
      }
      double* seconds = ws.stats_.stage_seconds;
      seconds[1] = s == 0 ? scan_seconds : 0.0;
      fixed_scores(kv, q, cx, ws);
      clock.lap(seconds[0]);
      if (cx.pool_end > cx.first) finish_bounds(cx, ws);
      clock.lap(seconds[1]);
      const group_progress progress =
          group_answer<KV>(kv, idx, q, cx, out_s, certs_s, ws, clock).run(false, true);
      add_stats(total, ws.stats_);
      if (h) {
        const double predicted = user_opt.cost.predicted(ws.stats_.sampled, cx.attended()) +
                                 (progress.exact_count > 0 ? 1.0 : 0.0);
        const double measured =
            timed ? h->measured_cost(stage_clock::now() - t_start + scan_share, cx.attended())
                  : std::numeric_limits<double>::quiet_NaN();
        const bool was_measured = !std::isnan(measured);
        h->record_sparse(was_measured ? measured : predicted,
                         std::span<const int>(ws.head_levels_.data(), G), key_of_sequence(s),
                         was_measured ? predicted : std::numeric_limits<double>::quiet_NaN());
      }
    }
    // The scan's codes and block scales, read once, split over the heads that used them.
    const call_context cx0 = sequence_context(0);
    const std::size_t scan_blocks =
        scan_end > scan_first ? (scan_end + key_index::kBlockTokens - 1) / key_index::kBlockTokens -
                                    scan_first / key_index::kBlockTokens
                              : 0;
    const std::size_t scan_bytes =
        scan_blocks * (idx.block_code4_bytes() + key_index::kScaleRows * cx0.dp * sizeof(float));
    total.bytes_read += scan_bytes;
    for (std::size_t s = 0; s < S && scanned > 0; ++s) {
      if (!sparse(sequence_context(s), s)) continue;
      for (std::size_t g = 0; g < G; ++g) certs[s * G + g].bytes_read += scan_bytes / (scanned * G);
    }
    total.tokens = max_n;
    total.pool = scan_end - std::min(scan_end, scan_first);
    total.dense_bytes = dense_tokens * (cx0.key_bytes + cx0.value_bytes);
    ws.stats_ = total;
  }

  /// What attend_sequences() reads after the prefix index's tokens in views[s] = kv: max
  /// |k| and an upper bound of each value's distance to the index's centre, with the keys
  /// and values checked finite; kept in ws.tails_[s] for the call. It runs for every
  /// sequence at every call, so it works on the floats' bits (|x| orders as the bits with
  /// the sign cleared; Inf and NaN lie at 0x7f800000 and above) and sums the distances in
  /// float over 16 lanes: the sum's relative error is below gamma_{dv/16 + 4} (the
  /// subtraction, the square, dv/16 additions per lane; the lanes are added in double),
  /// which the bound adds before its square root. The bound only enters the rounding
  /// certificates of exact answers (value_norm_max()), where this slack is nothing.
  template <kv_view KV>
  static tail_rows read_tail_rows(const KV& kv, const key_index& idx, attend_workspace& ws,
                                  std::size_t s) {
    constexpr std::uint32_t kAbs = 0x7fffffffu, kInfBits = 0x7f800000u;
    constexpr std::size_t kLanes = 16;
    float* scratch = ws.decoded_.data();  // [2][head_dim] of its [9][head_dim]
    const std::size_t d = kv.head_dim(), dv = value_dim_of(kv);
    const float* g = idx.value_center().data();
    const double slack = 1.0 + double(dv / kLanes + 4) * 0x1p-23;
    std::uint32_t key_bits = 0;
    tail_rows r;
    for (std::size_t t = idx.size(); t < kv.size(); ++t) {
      key_to_float(kv, t, scratch);
      value_to_float(kv, t, scratch + d);
      std::uint32_t row_key = 0, row_value = 0;
      for (std::size_t i = 0; i < d; ++i) row_key = std::max(row_key, std::bit_cast<std::uint32_t>(scratch[i]) & kAbs);
      for (std::size_t i = 0; i < dv; ++i)
        row_value = std::max(row_value, std::bit_cast<std::uint32_t>(scratch[d + i]) & kAbs);
      if (row_key >= kInfBits)
        throw error("views[" + std::to_string(s) + "]: token " + std::to_string(t) + "'s key has a NaN or Inf");
      if (row_value >= kInfBits)
        throw error("views[" + std::to_string(s) + "]: token " + std::to_string(t) +
                    "'s value has a NaN or Inf");
      key_bits = std::max(key_bits, row_key);
      float lane[kLanes] = {};
      std::size_t i = 0;
      for (; i + kLanes <= dv; i += kLanes)
        for (std::size_t j = 0; j < kLanes; ++j) {
          const float x = scratch[d + i + j] - g[i + j];
          lane[j] += x * x;
        }
      for (; i < dv; ++i) {
        const float x = scratch[d + i] - g[i];
        lane[i % kLanes] += x * x;
      }
      double sum = 0.0;
      for (float x : lane) sum += double(x);
      const double dist = std::sqrt(sum * slack) * (1.0 + 1e-15);
      if (std::isfinite(dist))
        r.value_distance_max = std::max(r.value_distance_max, round_up_to_float(dist));
      else
        r.value_overflow = true;
    }
    r.key_abs_max = std::bit_cast<float>(key_bits);
    ws.tails_[s] = r;
    return r;
  }

  // ---- before the stages --------------------------------------------------------------
  template <kv_view KV>
  static call_context make_context(std::size_t group, const KV& kv, const key_index& idx,
                                   const noise_key& nk, const options& user_opt,
                                   std::span<const int> hints,
                                   const group_history* history,
                                   std::size_t pool_limit = SIZE_MAX) noexcept {
    const options opt = shifted_grid(user_opt);
    const std::size_t n = kv.size(), d = kv.head_dim();
    const std::size_t first = user_opt.variant.first_token(n);
    // The pool ends before the window, and (attend_sequences()) within the index's tokens:
    // the rows after them are read exactly, as the window's are.
    const std::size_t pool_end =
        std::min(n - opt.effective_window(n), std::max(pool_limit, first));
    // The exact set inside the pool: read exactly, never sampled. The classic certificate's
    // holds the value outliers; the tight one samples those by their reach and reads only
    // the values whose distance overflowed float.
    std::span<const std::uint32_t> xs = opt.certificate == certificate_kind::kClassic
                                            ? idx.exact_tokens()
                                            : idx.overflow_tokens();
    xs = xs.first(std::size_t(std::lower_bound(xs.begin(), xs.end(), std::uint32_t(pool_end)) -
                              xs.begin()));
    xs = xs.subspan(std::size_t(std::lower_bound(xs.begin(), xs.end(), std::uint32_t(first)) -
                                xs.begin()));
    const value_radius radius{idx.value_radius_base(pool_end), idx.value_center()};
    double g2 = 0.0;
    const std::size_t dv = value_dim_of(kv);
    for (std::size_t i = 0; i < dv; ++i) g2 += radius.center_at(i) * radius.center_at(i);
    return call_context{
        .user = user_opt,
        .opt = opt,
        .top = user_opt.top_halvings(),
        .group = group,
        .n = n,
        .d = d,
        .dp = (d + 7) / 8 * 8,
        .dv = dv,
        .key_bytes = key_row_bytes(kv),
        .value_bytes = values_alias_keys(kv) ? 0 : value_row_bytes(kv),
        .first = first,
        .pool_end = pool_end,
        .scale = opt.effective_softmax_scale(d),
        .pert = perturbation(opt.seed, nk),
        .xs = xs,
        .radius = radius,
        .center_norm = std::sqrt(g2),
        .design = make_sampling_design(opt, idx.reach_floor(), idx.value_distance_max(pool_end),
                                       idx.value_center()),
        .dist = idx.value_distances(),
        .key_abs_max = double(idx.max_abs_key()),
        .value_distance_max = idx.value_distance_max(std::min(n, idx.size())),
        .value_overflow = !idx.overflow_tokens().empty(),
        .kernels = select_attend_kernels(active_isa()),
        .budget = history ? history->sample_budget(user_opt, n - first)
                          : sample_budget(user_opt, n - first),
        .hints = hints,
    };
  }

  /// The first `rows` queries padded to a multiple of 8 channels (the scan's and the 8-bit stage's
  /// rows), and the value centre in double (the certificate's sums are around it).
  static void prepare_queries(std::span<const float> queries, std::size_t rows,
                              const call_context& cx, attend_workspace& ws) noexcept {
    const std::size_t d = cx.d, dp = cx.dp;
    for (std::size_t g = 0; g < rows; ++g) {
      std::copy_n(queries.data() + g * d, d, ws.qpad_.data() + g * dp);
      std::fill(ws.qpad_.data() + g * dp + d, ws.qpad_.data() + (g + 1) * dp, 0.0f);
    }
    for (std::size_t i = 0; i < cx.dv; ++i) ws.center_[i] = cx.radius.center_at(i);
  }

  // ---- stage: window ------------------------------------------------------------------
  /// The token of row i of the fixed rows: the window, then the exact set.
  static std::size_t fixed_token(const call_context& cx, std::size_t i) noexcept {
    const std::size_t W = cx.window();
    return i < W ? cx.pool_end + i : std::size_t(cx.xs[i - W]);
  }

  /// Scores of the rows every head reads exactly, the window and the exact set, for all G
  /// heads in one pass over the key rows: [g][window, then set].
  template <kv_view KV>
  static void fixed_scores(const KV& kv, const float* q, const call_context& cx,
                           attend_workspace& ws) noexcept {
    const std::size_t d = cx.d, F = cx.fixed_rows();
    for (std::size_t i = 0; i < F; ++i) {
      if (i + kPrefetchAhead < F) prefetch_rows(kv.key(fixed_token(cx, i + kPrefetchAhead)), cx.key_bytes);
      const std::size_t t = fixed_token(cx, i);
      const auto* k = key_of(kv, t, cx);
      for (std::size_t g = 0; g < cx.group; ++g)
        ws.fixed_scores_[g * ws.fixed_stride_ + i] =
            cx.head(g).score(cx.scale * score_dot_fast(q + g * d, k, d, cx.kernels.which), t);
    }
  }

  // ---- stage: scan --------------------------------------------------------------------
  /// The scan's bounds for `nq` padded queries (ws.qpad_) over tokens [block_begin * 128,
  /// pool_end): one pass over the 4-bit codes for all of them.
  static void scan_bounds(const key_index& idx, const call_context& cx, std::size_t nq,
                          std::size_t pool_end, std::size_t block_begin,
                          attend_workspace& ws) noexcept {
    scan_request r;
    r.index = &idx;
    r.queries = ws.qpad_.data();
    r.nq = nq;
    r.softmax_scale = cx.scale;
    r.pool_end = pool_end;
    r.block_begin = block_begin;
    r.u = ws.u_.data();
    r.u_stride = ws.u_stride_;
    r.block_max = ws.block_max_.data();
    r.block_stride = ws.block_stride_;
    r.qa = ws.qa_.data();
    r.prep = ws.prep_.data();
    r.residual = ws.residual_.data();
    r.residual_stride = ws.block_stride_;
    scan_score_bounds(r, cx.kernels.which);
  }

  /// This call's bounds made its own: no bound before the sliding window, the variant's
  /// transform (into bounds_of(), leaving the scan's own for the refinement), none for the
  /// exact set.
  static void finish_bounds(const call_context& cx, attend_workspace& ws) noexcept {
    constexpr float ninf = -std::numeric_limits<float>::infinity();
    ws.variant_bounds_ = cx.modified();
    for (std::size_t g = 0; g < cx.group; ++g) {
      float* u = bounds_of(cx, ws, g);
      // Tokens of the first block before the sliding window never attend.
      std::fill(u + cx.first_block() * key_index::kBlockTokens, u + cx.first, ninf);
      // The variant's scores: the same transform on the bounds, rounded up.
      if (cx.modified()) {
        const head_variant hv = cx.head(g);
        apply_bound_variant(scan_bounds_of(cx, ws, g), u, cx.first, cx.pool_end,
                            make_bound_variant(hv.cap, hv.slope, cx.n), block_max_of(cx, ws, g),
                            cx.kernels.which);
      }
      // The exact set is read exactly: no head takes it as a candidate.
      for (std::uint32_t t : cx.xs) u[t] = ninf;
    }
  }

  // ---- stage: perturbations -----------------------------------------------------------
  /// E_up >= E_t for every pool token (shared by the G heads). Value-aware sampling adds
  /// ln(rho_t / rho_bar) to every perturbed score: its float upper bound is folded into
  /// E_up (rounded up), so that the candidate and 8-bit stages bound the perturbed score
  /// unchanged.
  static void perturbation_bounds(const key_index& idx, const call_context& cx,
                                  attend_workspace& ws) noexcept {
    // From the first pool block on: token t0 + i hashes like i under key + t0 golden.
    const std::size_t t0 = cx.first_block() * key_index::kBlockTokens;
    if (cx.pool_end <= t0) return;
    cx.kernels.perturbation_bounds(cx.pert.key() + std::uint64_t(t0) * kGolden, cx.pool_end - t0,
                                   cx.design.value_aware ? idx.sampling_offsets_upper() + t0 : nullptr,
                                   ws.e_up_.data() + t0);
  }

  // ---- stage: max score ---------------------------------------------------------------
  /// c of every head (the exact maximum score; head_max_) and the weights' reference
  /// c + shift (head_c_).
  template <kv_view KV>
  static void max_scores(const KV& kv, const float* queries, const call_context& cx,
                         attend_workspace& ws) noexcept {
    for (std::size_t g = 0; g < cx.group; ++g) {
      double window_max = -std::numeric_limits<double>::infinity();
      for (std::size_t i = 0; i < cx.fixed_rows(); ++i)
        window_max = std::max(window_max, ws.fixed_scores_[g * ws.fixed_stride_ + i]);
      // With a sink, c is the larger of its logit and the keys' maximum: no weight above 1.
      const head_variant hv = cx.head(g);
      if (hv.has_sink) window_max = std::max(window_max, hv.sink);
      std::size_t keys_read = 0;
      const double c = cx.pool_end > cx.first
                           ? max_score(kv, queries + g * cx.d, cx, hv, bounds_of(cx, ws, g),
                                       block_max_of(cx, ws, g), window_max,
                                       keys_read)
                           : window_max;
      ws.head_max_keys_[g] = keys_read;
      ws.head_max_[g] = c;
      ws.head_c_[g] = c + grid_shift(cx.top);
    }
  }

  /// c = max_i s_i exactly: any key above the running lower bound has its bound above it.
  template <kv_view KV>
  static double max_score(const KV& kv, const float* q, const call_context& cx,
                          const head_variant& hv, const float* u, const float* block_max,
                          double window_max, std::size_t& keys_read) noexcept {
    const std::size_t pool_end = cx.pool_end, b0 = cx.first_block(), nb = cx.pool_blocks();
    double lb = window_max;
    auto exact = [&](std::size_t t) {
      ++keys_read;
      return hv.score(cx.scale * score_dot_fast(q, key_of(kv, t, cx), cx.d, cx.kernels.which), t);
    };
    // Seed with the key of the largest bound: usually the maximum itself.
    std::size_t best_block = b0;
    for (std::size_t b = b0 + 1; b < nb; ++b)
      if (block_max[b] > block_max[best_block]) best_block = b;
    if (nb > b0 && double(block_max[best_block]) >= lb) {
      const std::size_t t0 = std::max(best_block * key_index::kBlockTokens, cx.first);
      const std::size_t t1 = std::min(pool_end, t0 + key_index::kBlockTokens);
      std::size_t arg = t0;
      for (std::size_t t = t0; t < t1; ++t)
        if (u[t] > u[arg]) arg = t;
      lb = std::max(lb, exact(arg));
    }
    for (std::size_t b = b0; b < nb; ++b) {
      if (double(block_max[b]) < lb) continue;
      const std::size_t t0 = std::max(b * key_index::kBlockTokens, cx.first);
      const std::size_t t1 = std::min(pool_end, t0 + key_index::kBlockTokens);
      for (std::size_t t = t0; t < t1; ++t)
        if (double(u[t]) >= lb) lb = std::max(lb, exact(t));
    }
    return lb;
  }

  /// The window and exact-set sums of every head with its own c, in one pass over the
  /// value rows (each row is read once for the G heads).
  template <kv_view KV>
  static void fixed_sums(const KV& kv, const call_context& cx, attend_workspace& ws) noexcept {
    const std::size_t d = cx.dv, G = cx.group, F = cx.fixed_rows();
    std::fill_n(ws.window_num_.begin(), G * d, 0.0);
    std::fill_n(ws.window_weight_.begin(), G, 0.0);
    std::fill_n(ws.window_sq_.begin(), G, 0.0);
    for (std::size_t i = 0; i < F; ++i) {
      if (i + kPrefetchAhead < F)
        prefetch_rows(kv.value(fixed_token(cx, i + kPrefetchAhead)), value_row_bytes(kv));
      const auto* v = value_of(kv, fixed_token(cx, i), cx);
      for (std::size_t g = 0; g < G; ++g) {
        const double w = std::exp(ws.fixed_scores_[g * ws.fixed_stride_ + i] - ws.head_c_[g]);
        ws.window_weight_[g] += w;
        ws.window_sq_[g] += w * add_centered(v, w, ws.window_num_.data() + g * d, cx, ws).sq;
      }
    }
    // A sink: an exact term of value 0, so w (0 - g) in the centred sum and nothing in sq.
    for (std::size_t g = 0; g < G; ++g) {
      const head_variant hv = cx.head(g);
      if (!hv.has_sink) continue;
      const double w = std::exp(hv.sink - ws.head_c_[g]);
      ws.window_weight_[g] += w;
      for (std::size_t i = 0; i < d; ++i) ws.window_num_[g * d + i] -= w * ws.center_[i];
    }
  }

};

/// The stages after the scan for the G heads of one position (attend_stages::run() and
/// run_positions() make one per position): perturbations, max scores, window sums, each
/// head's level loop, the exact pass and the bytes. It holds what these stages share, so
/// that each takes only the head it answers.
template <kv_view KV>
struct group_answer : exact_paths {
  const KV& kv;
  const key_index& idx;
  const float* queries;  // the position's G queries
  const call_context& cx;
  std::span<float> out;
  std::span<certificate> certs;
  attend_workspace& ws;
  stage_clock& clock;
  group_progress progress{};

  group_answer(const KV& kv, const key_index& idx, const float* queries, const call_context& cx,
               std::span<float> out, std::span<certificate> certs, attend_workspace& ws,
               stage_clock& clock) noexcept
      : kv(kv), idx(idx), queries(queries), cx(cx), out(out), certs(certs), ws(ws), clock(clock) {}

  /// The stages in order; count_scan, count_fixed: whether the scan's and the fixed
  /// rows' bytes are this call's (a multi-position call counts both once; a shared-prefix
  /// call counts the scan once and each sequence's fixed rows, which are its own).
  group_progress run(bool count_scan, bool count_fixed) {
    double* seconds = ws.stats_.stage_seconds;
    attend_stages::perturbation_bounds(idx, cx, ws);
    clock.lap(seconds[3]);
    attend_stages::max_scores(kv, queries, cx, ws);
    attend_stages::fixed_sums(kv, cx, ws);
    clock.lap(seconds[2]);
    for (std::size_t g = 0; g < cx.group; ++g) answer_head(g);
    const std::size_t exact_pass_bytes = exact_answers();
    clock.lap(seconds[5]);
    account_bytes(exact_pass_bytes, count_scan, count_fixed);
    return progress;
  }

  // ---- stage: heads -------------------------------------------------------------------
  /// Head g: joins the exact pass (an earlier head needed it), exact attention without a
  /// pool, or the level loop; then its own reads, and the exact pass's queue.
  void answer_head(std::size_t g) {
    group_stats& stats = ws.stats_;
    head_state st;
    st.g = g;
    st.hv = cx.head(g);
    st.keys_read = cx.fixed_rows() + ws.head_max_keys_[g];
    st.values_read = cx.fixed_rows();
    certificate& cert = certs[g];
    cert = {};
    float* o = out.data() + g * cx.dv;
    bool done = false;
    if (cx.user.route == routing::kAuto && progress.exact_count > 0 && cx.has_pool()) {
      cert.path = answer_path::kJoined;  // the exact pass reads every row anyway
    } else if (!cx.has_pool()) {  // window and exact set are everything
      no_pool_answer(queries + g * cx.d, g, o, cert);
      done = true;
    } else {
      // What this head may still sample.
      const std::size_t head_budget = cx.budget - std::min(progress.spent, cx.budget);
      head_loop<KV> loop(kv, idx, queries + g * cx.d, cx, ws, st);
      done = loop.level_loop(head_budget, o, cert, clock);
      stats.sampled += st.sample_size();
      progress.spent += st.sample_size();
    }
    clock.lap(stats.stage_seconds[4]);
    stats.candidates += cx.has_pool() ? st.candidates : 0;
    finish_head(done, st, cert);
  }

  /// Exact attention in double around the centre g, from the fixed rows' sums: certified
  /// when its rounding bound meets epsilon (rounding.hpp).
  void no_pool_answer(const float* q, std::size_t g, float* o,
                      certificate& cert) const noexcept {
    const std::size_t d = cx.dv;
    const double window_weight = ws.window_weight_[g];
    const double* window_num = ws.window_num_.data() + g * d;
    for (std::size_t i = 0; i < d; ++i)
      o[i] = float(cx.radius.center_at(i) + window_num[i] / window_weight);
    cert.exact = true;
    cert.path = answer_path::kNoPool;
    cert.max_score = ws.head_max_[g];
    cert.denominator = unshift(window_weight, ws.head_c_[g], ws.head_max_[g], cx.top);
    exact_rounding r;
    r.head_dim = d;
    r.eta = double_path_eta(exact_terms(cx, g), variant_magnitude(q, g, cx) + grid_shift(cx.top));
    r.value_scale = std::sqrt(ws.window_sq_[g] / window_weight);
    r.center_norm = cx.center_norm;
    r.spread = value_scale_upper(r) + r.center_norm;
    certify_exact_answer(r, output_norm(o, d), cert.denominator, cx.user, cert);
  }

  /// Cache lines of head st.g's scattered rows (group_stats::scattered_lines): its
  /// refinement rows (the 8-bit codes' low nibbles), its prepared blocks' 4-bit step rows,
  /// and its pool key and value rows.
  static std::size_t scattered_lines(const head_state& st, const call_context& cx) noexcept {
    auto lines = [](std::size_t bytes) { return (bytes + 63) / 64; };
    const std::size_t fixed = cx.fixed_rows();
    return st.refined * lines(cx.dp / 2) + st.refine_blocks * lines(cx.dp * sizeof(float)) +
           (st.keys_read - fixed) * lines(cx.key_bytes) +
           (st.values_read - fixed) * lines(cx.value_bytes);
  }

  /// Head st.g's own reads (the shared part is added by account_bytes()), its stopping
  /// level for the history, and, when no level certified, its place in the exact pass.
  void finish_head(bool done, const head_state& st, certificate& cert) noexcept {
    group_stats& stats = ws.stats_;
    const std::size_t g = st.g, exact_rows = cx.fixed_rows();  // rows shared by the group
    cert.bytes_read = st.refined * (cx.dp / 2) + (st.keys_read - exact_rows) * cx.key_bytes +
                      (st.values_read - exact_rows) * cx.value_bytes;
    stats.refined += st.refined;
    stats.refine_blocks += st.refine_blocks;
    stats.scattered_lines += scattered_lines(st, cx);
    stats.keys_read += st.keys_read - exact_rows;
    stats.values_read += st.values_read - exact_rows;
    ws.head_levels_[g] = done ? cert.level : -1;
    if (done) {
      cert.keys_read = st.keys_read;
      cert.values_read = st.values_read;
      return;
    }
    // Answered by the exact pass, with every other such head.
    if (ws.record_) ws.recorded_[cx.head0 + g].clear();
    ws.exact_heads_[progress.exact_count++] = std::uint32_t(g);
    if (cert.path == answer_path::kOverBudget || cert.path == answer_path::kJoined)
      ++stats.over_budget;
    else
      cert.path = answer_path::kFallback;
    cert.exact = true;
    cert.level = -1;
  }

  // ---- stage: exact answers -----------------------------------------------------------
  /// The heads no level certified (or over budget, or joined) by one exact pass; returns
  /// the bytes it read.
  std::size_t exact_answers() {
    const std::size_t m = progress.exact_count, n = cx.attended();
    if (m == 0) return 0;
    group_stats& stats = ws.stats_;
    exact_heads(kv, idx, queries, cx, m, out.data(), ws, false,
                std::numeric_limits<double>::infinity());
    for (std::size_t i = 0; i < m; ++i) {
      certificate& cert = certs[ws.exact_heads_[i]];
      cert.denominator = ws.window_weight_[ws.exact_heads_[i]];
      cert.max_score = ws.head_max_[ws.exact_heads_[i]];
      cert.keys_read = n;
      cert.values_read = n;
    }
    stats.fallbacks += m - stats.over_budget;
    stats.keys_read += n;
    stats.values_read += n;
    return n * (cx.key_bytes + cx.value_bytes);  // every row once, for all these heads
  }

  // ---- accounting ---------------------------------------------------------------------
  /// The group's bytes (docs/fast-path.md, "Bytes read"): each head's own reads, plus the
  /// shared part (codes and block scales, the fixed rows, the exact pass) split evenly.
  /// A multi-position call counts the scan's and the fixed rows' bytes once, at its newest
  /// position (the others' fixed rows differ from its by at most Q - 1 rows).
  void account_bytes(std::size_t exact_pass_bytes, bool count_scan, bool count_fixed) noexcept {
    group_stats& stats = ws.stats_;
    const std::size_t F = cx.fixed_rows(), row_bytes = cx.key_bytes + cx.value_bytes;
    const std::size_t blocks = cx.pool_blocks() - std::min(cx.first_block(), cx.pool_blocks());
    const std::size_t shared =
        (count_scan ? blocks * (idx.block_code4_bytes() +
                                key_index::kScaleRows * cx.dp * sizeof(float))
                    : 0) +
        (count_fixed ? F * row_bytes : 0) + exact_pass_bytes;
    stats.keys_read += F;
    stats.values_read += F;
    stats.bytes_read = shared;
    for (std::size_t g = 0; g < cx.group; ++g) {
      stats.bytes_read += certs[g].bytes_read;
      certs[g].bytes_read += shared / cx.group;
    }
    stats.dense_bytes = cx.attended() * row_bytes;
  }
};

}  // namespace certattn::detail

