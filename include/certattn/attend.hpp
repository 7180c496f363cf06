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
                       std::span<const int> level_hints, std::size_t positions = 1) {
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
  if (idx.size() != n)
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
  for (std::size_t g = 0; g < heads; ++g) {
    double l1 = 0.0;
    for (std::size_t i = 0; i < d; ++i) l1 += std::fabs(double(queries[g * d + i]));
    const double magnitude = l1 * double(idx.max_abs_key()) * score_scale;
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

}  // namespace certattn

