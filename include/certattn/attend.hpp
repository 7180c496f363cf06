// The certified call for one GQA group: G query heads sharing one KV head, over the
// caller's cache and its key index. attend_group() checks its arguments and runs the
// stages of attend_stages.hpp; the workspace it needs is workspace.hpp's.
#pragma once

#include <certattn/attend_stages.hpp>
#include <certattn/history.hpp>
#include <certattn/index.hpp>
#include <certattn/layout.hpp>
#include <certattn/options.hpp>
#include <certattn/perturb.hpp>
#include <certattn/workspace.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <span>
#include <string>

namespace certattn {

namespace detail {
/// attend_group()'s argument checks: a certattn::error naming the first bad argument.
/// attend_positions() passes its positions (Q > 1): queries, out and certs then hold Q
/// positions of `group` heads, and the workspace rows for Q * group heads.
template <kv_view KV>
void check_attend_call(std::span<const float> queries, std::size_t group, const KV& kv,
                       const key_index& idx, const options& opt, std::span<float> out,
                       std::span<certificate> certs, const attend_workspace& ws,
                       std::span<const int> level_hints, std::size_t positions = 1,
                       const tail_rows* tail = nullptr) {
  validate(opt);
  const std::size_t n = kv.size(), d = kv.head_dim(), dv = value_dim_of(kv);
  validate_shape(opt, n, d);
  if (dv == 0 || dv > d)
    throw error("kv: value_dim (" + std::to_string(dv) + ") must lie in [1, head_dim = " +
                std::to_string(d) + "]");
  if (group == 0) throw error("group must be > 0");
  if (positions == 0) throw error("positions must be > 0");
  if (positions > n)
    throw error("positions (" + std::to_string(positions) + ") exceeds kv.size() (" +
                std::to_string(n) + "): append every position's token before the call");
  // "positions * group" where the call has several positions, "group" where it has one.
  const std::size_t heads = positions * group;
  const char* per = positions > 1 ? "positions * group" : "group";
  if (queries.size() != heads * d)
    throw error("queries has " + std::to_string(queries.size()) + " elements, expected " + std::string(per) +
                " * head_dim = " + std::to_string(heads * d));
  if (out.size() != heads * dv)
    throw error("out has " + std::to_string(out.size()) + " elements, expected " + std::string(per) +
                " * value_dim = " + std::to_string(heads * dv));
  if (certs.size() != heads)
    throw error("certs has " + std::to_string(certs.size()) + " elements, expected " + std::string(per) +
                " = " + std::to_string(heads));
  if (!level_hints.empty() && level_hints.size() != group)
    throw error("level_hints has " + std::to_string(level_hints.size()) +
                " elements, expected 0 or group = " + std::to_string(group));
  if (idx.head_dim() != d)
    throw error("idx head_dim (" + std::to_string(idx.head_dim()) + ") != kv.head_dim() (" +
                std::to_string(d) + ")");
  if (idx.value_dim() != dv)
    throw error("idx value_dim (" + std::to_string(idx.value_dim()) + ") != the cache's value_dim (" +
                std::to_string(dv) + "): build the index as key_index(head_dim, value_dim)");
  if (tail && idx.size() > n)
    throw error("prefix_index.size() (" + std::to_string(idx.size()) + ") exceeds kv.size() (" +
                std::to_string(n) + "): the index must hold a prefix every view shares");
  if (!tail && idx.size() != n)
    throw error("idx.size() (" + std::to_string(idx.size()) + ") != kv.size() (" +
                std::to_string(n) + "): append every new token to the index");
  idx.check_format(kv);
  if (heads > ws.group() || d != ws.head_dim() || dv > ws.value_dim() || n > ws.max_tokens() ||
      opt.total_levels() > ws.max_levels())
    throw error("ws (attend_workspace) is sized for group " + std::to_string(ws.group()) +
                ", head_dim " + std::to_string(ws.head_dim()) + ", value_dim " +
                std::to_string(ws.value_dim()) + ", " +
                std::to_string(ws.max_tokens()) + " tokens, " + std::to_string(ws.max_levels()) +
                " levels: too small for this call (" + std::string(per) + " " + std::to_string(heads) +
                ", head_dim " + std::to_string(d) + ", value_dim " + std::to_string(dv) + ", " +
                std::to_string(n) +
                " tokens, levels options.total_levels() = " + std::to_string(opt.total_levels()) +
                ")");
  if (opt.window > 64) throw error("options.window must be <= 64 for attend_group");
  validate(opt.variant, group, "options.variant");
  // Bias positions are exact in float below 2^24 tokens (arch/variant_kernels.hpp).
  if (!opt.variant.alibi_slopes.empty() && n > (std::size_t(1) << 24))
    throw error("options.variant.alibi_slopes: a position bias needs fewer than 2^24 tokens, got " +
                std::to_string(n));
  for (float x : queries)
    if (!std::isfinite(x)) throw error("queries contain a NaN or Inf");
  // The score bounds run in float. Scores beyond any real model's would overflow them
  // (and lose candidates), so such inputs are refused rather than certified wrongly.
  const double score_scale = std::max(1.0, opt.effective_softmax_scale(d));
  const double key_abs_max = std::max(double(idx.max_abs_key()), tail ? double(tail->key_abs_max) : 0.0);
  for (std::size_t g = 0; g < heads; ++g) {
    double l1 = 0.0;
    for (std::size_t i = 0; i < d; ++i) l1 += std::fabs(double(queries[g * d + i]));
    const double magnitude = l1 * key_abs_max * score_scale;
    if (!(magnitude <= detail::kMaxScoreMagnitude)) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.3g", magnitude);
      throw error("queries: " +
                  (positions > 1 ? "position " + std::to_string(g / group) + " head " + std::to_string(g % group)
                                 : "head " + std::to_string(g)) +
                  ": max(1, softmax_scale) * ||q||_1 * max|key| = " + buf +
                  " exceeds 2^100: scores this large overflow the float score bounds");
    }
  }
}

/// attend_sequences()'s argument checks: a certattn::error naming the first bad argument
/// (a sequence's own, prefixed "sequence s: "). Fills ws.tails_ with each view's tail rows.
template <kv_view KV>
void check_sequences_call(std::span<const float> queries, std::size_t group,
                          std::span<const KV> views, const key_index& idx,
                          std::span<const std::uint64_t> sequences, const options& opt,
                          std::span<float> out, std::span<certificate> certs,
                          attend_workspace& ws, std::span<const int> level_hints,
                          std::span<group_history* const> histories) {
  const std::size_t S = views.size();
  if (S == 0) throw error("views must hold at least one sequence's view");
  if (group == 0) throw error("group must be > 0");
  if (sequences.size() != S)
    throw error("sequences has " + std::to_string(sequences.size()) +
                " elements, expected one id per view = " + std::to_string(S));
  for (std::size_t a = 0; a < S; ++a)
    for (std::size_t b = a + 1; b < S; ++b)
      if (sequences[a] == sequences[b])
        throw error("sequences: ids " + std::to_string(a) + " and " + std::to_string(b) +
                    " are equal (" + std::to_string(sequences[a]) +
                    "): each sequence needs its own perturbations");
  const std::size_t d = views[0].head_dim(), dv = value_dim_of(views[0]), heads = S * group;
  if (queries.size() != heads * d)
    throw error("queries has " + std::to_string(queries.size()) +
                " elements, expected sequences * group * head_dim = " + std::to_string(heads * d));
  if (out.size() != heads * dv)
    throw error("out has " + std::to_string(out.size()) +
                " elements, expected sequences * group * value_dim = " + std::to_string(heads * dv));
  if (certs.size() != heads)
    throw error("certs has " + std::to_string(certs.size()) +
                " elements, expected sequences * group = " + std::to_string(heads));
  if (!level_hints.empty() && level_hints.size() != heads)
    throw error("level_hints has " + std::to_string(level_hints.size()) +
                " elements, expected 0 or sequences * group = " + std::to_string(heads));
  if (!histories.empty() && histories.size() != S)
    throw error("histories has " + std::to_string(histories.size()) +
                " elements, expected one per view = " + std::to_string(S));
  for (std::size_t s = 0; s < histories.size(); ++s) {
    if (!histories[s]) throw error("histories[" + std::to_string(s) + "] is null");
    if (histories[s]->group() != group)
      throw error("histories[" + std::to_string(s) + "] (group_history) is for group " +
                  std::to_string(histories[s]->group()) + ", the call has group " +
                  std::to_string(group));
    for (std::size_t b = 0; b < s; ++b)
      if (histories[b] == histories[s])
        throw error("histories[" + std::to_string(b) + "] and histories[" + std::to_string(s) +
                    "] are the same group_history: each sequence keeps its own");
  }
  if (heads > ws.group())
    throw error("ws (attend_workspace) is sized for group " + std::to_string(ws.group()) +
                ": too small for this call (sequences * group " + std::to_string(heads) + ")");
  for (std::size_t s = 0; s < S; ++s) {
    const KV& kv = views[s];
    const std::span<const int> hints = level_hints.empty() ? level_hints
                                                           : level_hints.subspan(s * group, group);
    try {
      if (kv.head_dim() != d || value_dim_of(kv) != dv)
        throw error("kv: head_dim " + std::to_string(kv.head_dim()) + " and value_dim " +
                    std::to_string(value_dim_of(kv)) + " differ from views[0]'s (" +
                    std::to_string(d) + ", " + std::to_string(dv) + ")");
      // The own rows are decoded into the workspace's rows and compared with the index's
      // value centre: shapes that do not fit make check_attend_call() throw, naming them,
      // before any row is read; otherwise it runs once, with the own rows' keys.
      const tail_rows none;
      if (d != ws.head_dim() || dv > ws.value_dim() || idx.value_dim() != dv)
        check_attend_call(queries.subspan(s * group * d, group * d), group, kv, idx, opt,
                          out.subspan(s * group * dv, group * dv), certs.subspan(s * group, group),
                          ws, hints, 1, &none);
      const tail_rows tail = attend_stages::read_tail_rows(kv, idx, ws, s);
      check_attend_call(queries.subspan(s * group * d, group * d), group, kv, idx, opt,
                        out.subspan(s * group * dv, group * dv), certs.subspan(s * group, group),
                        ws, hints, 1, &tail);
    } catch (const error& e) {
      throw error("sequence " + std::to_string(s) + ": " + e.what());
    }
  }
}
}  // namespace detail

/// Certified attention for the G query heads of one GQA group over one KV head.
///   queries [group][head_dim] (unscaled; options.softmax_scale applies), kv the head's
///   cache (kv.size() tokens, oldest first), idx its key index (idx.size() == kv.size()),
///   nk the perturbation key (layer, kv head, decoding step: advance the step every call),
///   out [group][head_dim], certs [group]. The workspace is the caller's: a call within
///   its sizes allocates nothing. Single-threaded and reentrant; calls on different
///   groups may run concurrently, also on one shared index.
///   history: this (layer, KV head)'s group_history (history.hpp), kept by the engine
///   from step to step. It carries each head's last stopping level, around which the
///   tight certificate spends most of delta (level_delta_share()) on a strictly later
///   step of the same layer, KV head and sequence (group_history::hints_for()), so that
///   heads stop with fewer keys, and routes groups whose sparse path lost to the dense
///   kernel (options::route), on costs measured here once it has timed a dense call. Without one, the call has no hints and routes no group; a head
///   whose sample outgrows sample_budget() is still answered exactly.
template <kv_view KV>
void attend_group(std::span<const float> queries, std::size_t group, const KV& kv,
                  const key_index& idx, const noise_key& nk, const options& opt,
                  std::span<float> out, std::span<certificate> certs, attend_workspace& ws,
                  group_history& history) {
  if (history.group() != group)
    throw error("history (group_history) is for group " + std::to_string(history.group()) +
                ", the call has group " + std::to_string(group));
  detail::check_attend_call(queries, group, kv, idx, opt, out, certs, ws, {});
  detail::attend_stages::run(queries, group, kv, idx, nk, opt, out, certs, ws, {}, &history);
}

/// The same without a history, with optional level hints: empty, or [group] the level
/// each head stopped at in this (layer, KV head)'s previous step (certificate::level; -1
/// for none). A hint is valid when it was fixed before this call's perturbations were
/// drawn (the caller's contract: e.g. the previous step's levels, never this step's).
template <kv_view KV>
void attend_group(std::span<const float> queries, std::size_t group, const KV& kv,
                  const key_index& idx, const noise_key& nk, const options& opt,
                  std::span<float> out, std::span<certificate> certs, attend_workspace& ws,
                  std::span<const int> level_hints = {}) {
  detail::check_attend_call(queries, group, kv, idx, opt, out, certs, ws, level_hints);
  detail::attend_stages::run(queries, group, kv, idx, nk, opt, out, certs, ws, level_hints, nullptr);
}


/// Several query positions of one KV head in one call: speculative verification (the
/// draft tokens) and any Q queries whose keys are the cache's newest. Position p
/// (0 <= p < positions) is the query of token n - positions + p (n = kv.size(); every
/// position's token is appended to the cache and the index before the call) and attends
/// the tokens up to its own, causally. queries [positions][group][head_dim], out
/// [positions][group][value_dim], certs [positions][group]; ws sized for positions * group
/// heads. Each position's answer and certificate are those attend_group() gives over the
/// cache's first n - positions + p + 1 tokens (kv_prefix) with noise key nk and
/// noise_key::position = p, so that no two positions share perturbations; the index is
/// scanned once for all positions (reference_attend_positions() reproduces the call).
/// A position's window is options.window tokens back from its own: when positions exceed
/// the window, the earlier drafts lie in the later positions' pools, sampled like any key.
/// After verification, key_index::truncate() drops the rejected drafts (docs/integration.md).
/// history: as attend_group()'s; its hints apply to every position, it keeps the newest
/// position's levels, and it routes the whole call (then one dense pass reads the tokens
/// every position attends, for all of them, where no position bias is set).
template <kv_view KV>
void attend_positions(std::span<const float> queries, std::size_t positions, std::size_t group,
                      const KV& kv, const key_index& idx, const noise_key& nk, const options& opt,
                      std::span<float> out, std::span<certificate> certs, attend_workspace& ws,
                      group_history& history) {
  if (history.group() != group)
    throw error("history (group_history) is for group " + std::to_string(history.group()) +
                ", the call has group " + std::to_string(group));
  detail::check_attend_call(queries, group, kv, idx, opt, out, certs, ws, {}, positions);
  detail::attend_stages::run_positions(queries, positions, group, kv, idx, nk, opt, out, certs,
                                       ws, {}, &history);
}

/// The same without a history, with optional level hints: empty, or [group] for every
/// position (attend_group()'s rule: fixed before this call's perturbations were drawn).
template <kv_view KV>
void attend_positions(std::span<const float> queries, std::size_t positions, std::size_t group,
                      const KV& kv, const key_index& idx, const noise_key& nk, const options& opt,
                      std::span<float> out, std::span<certificate> certs, attend_workspace& ws,
                      std::span<const int> level_hints = {}) {
  detail::check_attend_call(queries, group, kv, idx, opt, out, certs, ws, level_hints, positions);
  detail::attend_stages::run_positions(queries, positions, group, kv, idx, nk, opt, out, certs,
                                       ws, level_hints, nullptr);
}

/// Several sequences that share a prefix (parallel samples of one prompt, beam search)
/// in one call for one KV head: the prefix's index is scanned once for all of them.
///   views: each sequence's cache of this KV head (views[s].size() tokens, oldest first),
///   whose first prefix_index.size() tokens are the shared prefix's (for instance
///   paged_kv views whose block tables list the prefix's pages, then the sequence's own);
///   prefix_index: the index of those shared tokens, built once (the sequences append
///   nothing to it); queries [sequences][group][head_dim], out [sequences][group]
///   [value_dim], certs [sequences][group]; ws sized for views.size() * group heads.
///   sequences: one id per view, all different: sequence s draws the perturbations of
///   nk with noise_key::sequence = sequences[s]. views is a span of one view type,
///   spelled out where it comes from a container: std::span<const paged_kv<half>>(v).
/// Sequence s's answer and certificate are those attend_group() gives over views[s] with
/// that noise key and an index over its prefix alone: its pool is the prefix's tokens
/// before its window, and every token after the prefix (its own) is read exactly with the
/// window (reference_attend_sequences() reproduces the call). The own tokens are what a
/// sequence pays per step beyond the shared scan, so the call suits tails of up to a few
/// thousand tokens; a longer-lived sequence is better served by its own index
/// (docs/integration.md, "Parallel samples and shared prefixes"). The views' shared
/// tokens must be the prefix index's: the call cannot tell.
/// level_hints: empty or [sequences][group] (attend_group()'s rule).
template <kv_view KV>
void attend_sequences(std::span<const float> queries, std::size_t group, std::span<const KV> views,
                      const key_index& prefix_index, const noise_key& nk,
                      std::span<const std::uint64_t> sequences, const options& opt,
                      std::span<float> out, std::span<certificate> certs, attend_workspace& ws,
                      std::span<const int> level_hints = {}) {
  detail::check_sequences_call(queries, group, views, prefix_index, sequences, opt, out, certs, ws,
                               level_hints, {});
  detail::attend_stages::run_sequences(queries, group, views, prefix_index, nk, sequences, opt, out,
                                       certs, ws, level_hints, {});
}

/// The same with each sequence's group_history for this (layer, KV head) (histories
/// [sequences], all different): each gives its sequence's hints, routes that sequence
/// alone (the dense kernel over its view) and keeps its levels and costs; a sequence's
/// cost counts its share of the shared scan.
template <kv_view KV>
void attend_sequences(std::span<const float> queries, std::size_t group, std::span<const KV> views,
                      const key_index& prefix_index, const noise_key& nk,
                      std::span<const std::uint64_t> sequences, const options& opt,
                      std::span<float> out, std::span<certificate> certs, attend_workspace& ws,
                      std::span<group_history* const> histories) {
  detail::check_sequences_call(queries, group, views, prefix_index, sequences, opt, out, certs, ws,
                               {}, histories);
  detail::attend_stages::run_sequences(queries, group, views, prefix_index, nk, sequences, opt, out,
                                       certs, ws, {}, histories);
}

}  // namespace certattn
