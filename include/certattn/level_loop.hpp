// The level loop of one head of the certified group call (attend_stages.hpp's
// group_answer::answer_head() runs it for each head with a pool to sample): the head's
// candidates (pool keys whose perturbed bound can reach the deepest level, bucketed by
// earliest level); then, level by level from the coarsest, the new candidates refined with
// 8-bit codes, then exact 16-bit keys; heavy, light or out; the light keys that turn
// heavy; the Horvitz-Thompson sums and the certificate of docs/certificate.md. What stays
// fixed while a head's loop runs (the cache, the index, the query, c, the call context,
// the workspace, the head's running sums) is one head_loop object, so that its functions
// take only what varies from call to call: the level, a token, its score. The running sums
// are small types with add and remove (exact_sums, light_sums). Internal: use
// attend_group() (attend.hpp).
#pragma once

#include <certattn/arch/candidate_kernels.hpp>
#include <certattn/arch/dispatch.hpp>
#include <certattn/arch/refine_kernels.hpp>
#include <certattn/arch/score_dot.hpp>
#include <certattn/call_context.hpp>
#include <certattn/certificate.hpp>
#include <certattn/index.hpp>
#include <certattn/layout.hpp>
#include <certattn/options.hpp>
#include <certattn/perturb.hpp>
#include <certattn/sampler.hpp>
#include <certattn/variant.hpp>
#include <certattn/workspace.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <span>
#include <vector>

namespace certattn::detail {

/// The exact part of a head's estimate: window, exact set and heavy keys (level_sums'
/// exact_weight and exact_sq; the vector sum lives in the workspace).
struct exact_sums {
  double weight = 0.0, sq = 0.0;
  std::size_t heavy = 0;  // heavy pool keys (the window and exact set are not counted)
  void add_heavy(double w, double v_sq) noexcept {
    ++heavy;
    weight += w;
    sq += w * v_sq;
  }
};

/// One sampled light key's terms in the certificate's sums: its weight kappa, exact weight
/// w, ||v - g||^2 / rho, ||v - g||^2 and ||v||^2.
struct light_term {
  double kappa = 0.0, w = 0.0, per_reach = 0.0, centered_sq = 0.0, sq = 0.0;
};

/// The light keys' running sums (level_sums' light part without its vector): a key adds
/// its terms when it is sampled light and removes them when it turns heavy, as
/// FlashInfer's state_t merges and splits softmax states.
struct light_sums {
  std::size_t count = 0;
  double sq = 0.0, mass = 0.0, h = 0.0, hw = 0.0, t = 0.0;
  void add(const light_term& x) noexcept {
    ++count;
    sq += x.centered_sq;
    mass += x.kappa;
    h += x.kappa * x.per_reach;
    hw += x.w * x.per_reach;
    t += x.kappa * x.sq;
  }
  void remove(const light_term& x) noexcept {
    --count;
    sq -= x.centered_sq;
    mass -= x.kappa;
    h -= x.kappa * x.per_reach;
    hw -= x.w * x.per_reach;
    t -= x.kappa * x.sq;
    if (count == 0) mass = h = hw = t = 0.0;  // no rounding residue where the sums are empty
  }
};

/// One head's level loop: its running sums and what it read.
struct head_state {
  std::size_t g = 0;
  head_variant hv;
  exact_sums exact;
  light_sums light;
  std::size_t candidates = 0;  // pool keys bucketed by their perturbed 4-bit bound
  std::size_t keys_read = 0, values_read = 0, refined = 0;
  std::size_t refine_blocks = 0;  // 8-bit block preparations (refine_block())
  std::int32_t free_node = 0;
  /// Heavy and sampled light pool keys: what the head spends of sample_budget().
  std::size_t sample_size() const noexcept { return exact.heavy + light.count; }
};

/// The level loop of head st.g. It holds what the loop reads for the whole head; its
/// functions take the level, token and score that vary per call.
template <kv_view KV>
struct head_loop : row_access {
  using node = attend_workspace::node;
  static constexpr std::uint8_t kRefined = 1, kScored = 2;

  const KV& kv;
  const key_index& idx;
  const float* q;     // the head's query
  const float* qpad;  // the query padded to a multiple of 8 channels (the 8-bit stage's)
  const float* u;     // the head's 4-bit score bounds, per pool token (the scan's own)
  const residual_coefficients* residual;  // per block, the scan's residual terms
  const double c;     // the weights' reference c + shift (ws.head_c_)
  const call_context& cx;
  attend_workspace& ws;
  head_state& st;

  head_loop(const KV& kv, const key_index& idx, const float* q, const call_context& cx,
            attend_workspace& ws, head_state& st) noexcept
      : kv(kv), idx(idx), q(q), qpad(ws.qpad_.data() + (cx.head0 + st.g) * cx.dp),
        u(scan_bounds_of(cx, ws, st.g)), residual(residual_of(cx, ws, st.g)), c(ws.head_c_[st.g]),
        cx(cx), ws(ws), st(st) {}

  /// Levels from the coarsest, each one's new keys, then the certificate; true when a
  /// level certified (o and cert filled), false when the head goes to the exact pass
  /// (cert.path kOverBudget when its sample outgrew head_budget).
  bool level_loop(std::size_t head_budget, float* o, certificate& cert,
                  stage_clock& clock) noexcept {
    const options& opt = cx.opt;
    std::fill_n(ws.refine_ready_.begin(), cx.pool_blocks(), 0);
    const int first_last = first_pass_levels();
    st.candidates = bucket_candidates(0, first_last);
    clock.lap(ws.stats_.stage_seconds[3]);
    start_sums();
    const int hint = cx.hints.empty() ? -1 : cx.hints[st.g];
    for (int j = 0; j <= opt.max_levels; ++j) {
      if (j == first_last + 1) {  // the deeper levels' candidates, now needed
        clock.lap(ws.stats_.stage_seconds[4]);  // the levels so far: the level loop's time
        st.candidates += bucket_candidates(j, opt.max_levels);
        clock.lap(ws.stats_.stage_seconds[3]);
      }
      // New candidates of this level, then keys deferred to it, then light keys that
      // turn heavy here.
      process_level(j);
      transitions(j);
      const double tau = tau_of(j, opt.grid_ratio);
      const level_result lr =
          certify(sums_of(tau), cx.radius, cx.design, opt, j, hint,
                  std::span<double>(ws.o_hat_.data(), cx.dv), std::span<double>(ws.c0_.data(), cx.dv));
      if (lr.certified) {
        for (std::size_t i = 0; i < cx.dv; ++i) o[i] = float(ws.o_hat_[i]);
        fill_sampled_certificate(lr, j, tau, cert);
        return true;
      }
      if (st.sample_size() > head_budget) {
        cert.path = answer_path::kOverBudget;
        return false;
      }
    }
    return false;
  }

  /// Empty node lists; the exact part starts as the fixed rows' sums, the light part empty.
  void start_sums() noexcept {
    const std::size_t g = st.g;
    std::fill(ws.pending_head_.begin(), ws.pending_head_.end(), -1);
    std::fill(ws.transition_head_.begin(), ws.transition_head_.end(), -1);
    std::copy_n(ws.window_num_.begin() + std::ptrdiff_t(g * cx.dv), cx.dv, ws.exact_num_.begin());
    std::fill(ws.light_sum_.begin(), ws.light_sum_.end(), 0.0);
    st.exact.weight = ws.window_weight_[g];
    st.exact.sq = ws.window_sq_[g];
  }

  /// The level's sums for the certificate.
  level_sums sums_of(double tau) const noexcept {
    const std::size_t dv = cx.dv;
    level_sums s;
    s.tau = tau;
    s.exact_weight = st.exact.weight;
    s.exact_num = std::span<const double>(ws.exact_num_.data(), dv);
    s.exact_sq = st.exact.sq;
    s.light_count = st.light.count;
    s.light_sum = std::span<const double>(ws.light_sum_.data(), dv);
    s.light_sq = st.light.sq;
    s.light_mass = st.light.mass;
    s.light_h = st.light.h;
    s.light_hw = st.light.hw;
    s.light_t = st.light.t;
    return s;
  }

  void fill_sampled_certificate(const level_result& lr, int level, double tau,
                                certificate& cert) const noexcept {
    const double cmax = ws.head_max_[st.g];
    cert.certified = true;
    cert.level = level;
    cert.tau = unshift(tau, c, cmax, cx.top);  // relative to the largest weight
    cert.bound = lr.bound;
    cert.beta = lr.beta;
    cert.scale_value = lr.scale_value;
    cert.max_score = cmax;
    cert.denominator = unshift(lr.d_hat, c, cmax, cx.top);
    cert.heavy = st.exact.heavy;
    cert.sampled = st.light.count;
  }

  // ---- the level loop's parts ---------------------------------------------------------
  /// Pool keys whose perturbed bound reaches ln tau_last, not already bucketed by an
  /// earlier pass (levels below first), in buckets by earliest level.
  std::size_t bucket_candidates(int first, int last) noexcept {
    const options& opt = cx.opt;
    candidate_params p;
    p.c = std::nextafter(float(c), -INFINITY);  // below c: y only grows
    // Each of the three float roundings errs by at most 2^-24 of its operand, all of
    // which stay within |c| + 80 for any token that can reach ln tau_J >= -180; within
    // |c| + 640 when E_up carries value-aware offsets (ln(rho / rho_bar) < 192 for float
    // distances; an infinite one is stored as 2^64, and y then passes every threshold).
    p.slack = float((std::fabs(c) + (cx.design.value_aware ? 1024.0 : 256.0)) * 0x1p-21);
    p.threshold = float(ln_tau(last, opt.grid_ratio));
    // A later pass keeps only what the earlier one (down to level first - 1) did not.
    p.upper = first == 0 ? INFINITY : float(ln_tau(first - 1, opt.grid_ratio));
    p.level_scale = float(-double(opt.grid_ratio) / std::numbers::ln2);
    p.min_level = first;
    p.max_level = last;
    // From the first token that attends (indices relative to it, shifted back below).
    const std::size_t t0 = cx.first;
    const std::size_t m = cx.kernels.find_candidates(bounds_of(cx, ws, st.g) + t0, ws.e_up_.data() + t0, cx.pool_end - t0,
                                                     p, ws.cand_idx_.data(), ws.cand_lvl_.data());
    // Counting sort by level (stable: tokens stay in order within a level).
    const std::size_t J = std::size_t(opt.max_levels);
    std::uint32_t* start = ws.bucket_start_.data();
    std::fill(start, start + J + 3, 0u);
    for (std::size_t i = 0; i < m; ++i) ++start[ws.cand_lvl_[i] + 1];
    for (std::size_t j = 1; j <= J + 1; ++j) start[j] += start[j - 1];
    // start[j] is now the beginning of bucket j; scatter with start[j] as the cursor.
    for (std::size_t i = 0; i < m; ++i) {
      const std::size_t j = ws.cand_lvl_[i];
      ws.bucket_[start[j]++] = ws.cand_idx_[i] + std::uint32_t(t0);
    }
    // Shift back: after the scatter, start[j] is the end of bucket j = start of j + 1.
    for (std::size_t j = J + 1; j > 0; --j) start[j] = start[j - 1];
    start[0] = 0;
    return m;
  }

  /// Candidates are bucketed lazily: first the levels most calls stop within, the
  /// deeper ones only when a call gets there (their buckets are empty until then).
  int first_pass_levels() const noexcept {
    return std::min(cx.opt.max_levels, 3 * cx.opt.max_levels / 4);
  }

  /// This head's 8-bit preparation of block b (see arch/refine_kernels.hpp), made on
  /// first use: a8 = q st8 (returned) and the constant C8.
  const float* refine_block(std::size_t b) noexcept {
    const std::size_t dp = idx.padded_dim();
    float* a = ws.refine_a_.data() + b * refine_a_size(dp);
    if (!ws.refine_ready_[b]) {
      ws.refine_offset_[b] = cx.kernels.prepare_refine_block(qpad, idx.block_step4(b), dp, a);
      ws.refine_ready_[b] = 1;
      ++st.refine_blocks;
    }
    return a;
  }

  /// A new node at the front of list[level] (pending keys or transitions).
  std::int32_t push(std::vector<std::int32_t>& list, std::size_t level, std::uint32_t token,
                    double score, std::uint8_t stage) noexcept {
    const std::int32_t k = st.free_node++;
    node& nd = ws.nodes_[std::size_t(k)];
    nd.token = token;
    nd.score = score;
    nd.stage = stage;
    nd.next = list[level];
    list[level] = k;
    return k;
  }

  /// acc += w (v - g): row_access::add_centered() with this call's centre.
  template <class V>
  row_norms add_centered(const V* v, double w, double* acc) const noexcept {
    return row_access::add_centered(v, w, acc, cx, ws);
  }

  /// Token t's terms as a light key with exact weight w (its value row's norms nv).
  light_term light_terms_of(std::size_t t, double w, const row_norms& nv) const noexcept {
    const float dist = cx.dist[t];
    light_term x;
    x.kappa = cx.design.weight(dist);
    x.w = w;
    x.per_reach = per_reach(nv.centered_sq, cx.design.reach(dist));
    x.centered_sq = nv.centered_sq;
    x.sq = nv.sq;
    return x;
  }

  /// A sampled key's value enters the sums: heavy (exact weight) or light (weight kappa,
  /// and queued for the level at which it turns heavy).
  void include(std::size_t t, double s, int level, int heavy_level) noexcept {
    const double w = std::exp(s - c);
    ++st.values_read;
    if (ws.record_) ws.recorded_[cx.head0 + st.g].push_back({std::uint32_t(t), heavy_level});
    if (heavy_level <= level) {
      st.exact.add_heavy(w, add_centered(value_of(kv, t, cx), w, ws.exact_num_.data()).sq);
    } else {
      const double kappa = cx.design.weight(cx.dist[t]);
      const row_norms nv = add_centered(value_of(kv, t, cx), kappa, ws.light_sum_.data());
      st.light.add(light_terms_of(t, w, nv));
      if (heavy_level <= cx.opt.max_levels)
        push(ws.transition_head_, std::size_t(heavy_level), std::uint32_t(t), s, kScored);
    }
  }

  /// A key with exact score s at this level: sampled now (queued for its value), at a
  /// later level (deferred), or never. (Inlined into process_level(), as before the level
  /// loop had its own header: GCC 12 otherwise calls it once per scored key.)
  __attribute__((always_inline)) void admit(std::size_t t, double s, int level, std::size_t& n_include) noexcept {
    const options& opt = cx.opt;
    // The level needs E only to within the grid: decide it from E's float bracket, and
    // take the logarithm only when the bracket straddles a grid point (about 6% of keys at
    // grid ratio 2). Either way the level is the one earliest_level(s - c + E) gives.
    const std::uint64_t bits = cx.pert.bits(t);
    const double x = (s - c) + cx.design.offset(cx.dist[t]);  // as reference_attend()
    const float upper = perturbation::exp1_upper_from_bits(bits);
    int ls = earliest_level(x + double(upper), opt.grid_ratio, opt.max_levels);
    if (ls != earliest_level(x + double(perturbation::exp1_lower_from_bits(bits, upper)),
                             opt.grid_ratio, opt.max_levels))
      ls = earliest_level(x + perturbation::exp1_from_bits(bits), opt.grid_ratio, opt.max_levels);
    if (ls > opt.max_levels) return;
    if (ls > level) {
      push(ws.pending_head_, std::size_t(ls), std::uint32_t(t), s, kScored);
      return;
    }
    if (ls < level) ++ws.stats_.bound_violations;  // the bounds promised otherwise
    ws.to_include_[n_include++] = {std::uint32_t(t),
                                   earliest_level(x, opt.grid_ratio, opt.max_levels), s};
  }

  /// The 8-bit stage of a new candidate with 8-bit bound u8 (scaled): true when its exact
  /// key must be read now.
  bool refine_candidate(std::size_t t, double u8, int level) noexcept {
    const options& opt = cx.opt;
    ++st.refined;
    const double x8 = (u8 - c) + double(ws.e_up_[t]);  // == pert.exp1_upper(t)
    const int l8 = earliest_level(x8 + 1e-12 * (std::fabs(u8) + std::fabs(c) + 64.0),
                                  opt.grid_ratio, opt.max_levels);
    if (l8 > opt.max_levels) return false;
    if (l8 > level) {
      push(ws.pending_head_, std::size_t(l8), std::uint32_t(t), 0.0, kRefined);
      return false;
    }
    return true;
  }

  /// One level's new keys: 8-bit refinement, exact keys, values; each pass prefetches.
  void process_level(int level) noexcept {
    const std::size_t d = cx.d, dp = idx.padded_dim(), value_bytes = value_row_bytes(kv);
    const isa which = cx.kernels.which;
    std::size_t n_score = 0, n_include = 0;
    const std::uint32_t b0 = ws.bucket_start_[std::size_t(level)];
    const std::uint32_t b1 = ws.bucket_start_[std::size_t(level) + 1];
    // The buckets of the next levels follow this one: prefetch across the boundary, so
    // that a level's first candidates are not fetched one miss at a time.
    const std::uint32_t b_end = ws.bucket_start_[std::size_t(cx.opt.max_levels) + 1];
    // Candidates go 16 at a time through the batched 8-bit dot (independent chains).
    constexpr std::uint32_t kBatch = 16;
    for (std::uint32_t i = b0; i < b1; i += kBatch) {
      const std::uint32_t m = std::min(kBatch, b1 - i);
      const float* a[kBatch];
      const std::uint8_t* codes[kBatch];
      float offset[kBatch], dot[kBatch];
      for (std::uint32_t k = 0; k < m; ++k) {
        if (i + k + kPrefetchAhead < b_end) {
          const std::uint32_t ahead = ws.bucket_[i + k + kPrefetchAhead];
          prefetch_rows(idx.codes8_low(ahead), idx.low8_bytes());
          __builtin_prefetch(u + ahead);  // its bound and residual byte, for scan_integer_part()
          __builtin_prefetch(idx.block_rho(0) + ahead);
          const std::size_t ab = ahead / key_index::kBlockTokens;
          if (!ws.refine_ready_[ab])  // its block's steps, read by the preparation
            prefetch_rows(idx.block_step4(ab), dp * sizeof(float));
        }
        const std::uint32_t t = ws.bucket_[i + k];
        const std::size_t b = t / key_index::kBlockTokens;
        a[k] = refine_block(b);
        offset[k] = ws.refine_offset_[b];
        codes[k] = idx.codes8_low(t);
      }
      for (std::uint32_t k = m; k < kBatch; ++k) {
        a[k] = a[0];
        codes[k] = codes[0];
      }
      refine_dots(a, codes, m, dp, dot, which);
      for (std::uint32_t k = 0; k < m; ++k) {
        const std::uint32_t t = ws.bucket_[i + k];
        const std::size_t b = t / key_index::kBlockTokens;
        double u8 = scan_integer_part(u[t], residual[b], idx.block_rho(b)[t % key_index::kBlockTokens]) +
                    cx.scale * (double(offset[k]) + double(dot[k]));
        if (cx.modified()) u8 = st.hv.score(u8, t);  // increasing: still a bound
        if (refine_candidate(t, u8, level)) {
          prefetch_rows_l2(kv.key(t), cx.key_bytes);
          __builtin_prefetch(cx.dist + t);  // admit() reads its distance, at a random place
          ws.to_score_[n_score++] = t;
        }
      }
    }
    for (std::int32_t k = ws.pending_head_[std::size_t(level)]; k >= 0;) {
      const node nd = ws.nodes_[std::size_t(k)];
      if (nd.stage == kRefined) {
        prefetch_rows_l2(kv.key(nd.token), cx.key_bytes);
        __builtin_prefetch(cx.dist + nd.token);
        ws.to_score_[n_score++] = nd.token;
      } else {
        const std::size_t before = n_include;
        admit(nd.token, nd.score, level, n_include);
        if (n_include != before) prefetch_rows_l2(kv.value(nd.token), value_bytes);
      }
      k = nd.next;
    }
    // Exact keys 8 at a time through the batched score (independent chains, same bits).
    for (std::size_t i = 0; i < n_score; i += 8) {
      const std::size_t m = std::min<std::size_t>(8, n_score - i);
      const key_row_t<KV>* rows[8];
      for (std::size_t j = 0; j < 8; ++j) {
        if (i + j + kPrefetchAhead < n_score)
          prefetch_rows(kv.key(ws.to_score_[i + j + kPrefetchAhead]), cx.key_bytes);
        rows[j] = key_of(kv, ws.to_score_[i + (j < m ? j : 0)], cx, j);
      }
      double dots[8];
      score_dot8_fast(q, rows, d, which, dots);
      for (std::size_t j = 0; j < m; ++j) {
        const std::uint32_t t = ws.to_score_[i + j];
        ++st.keys_read;
        const std::size_t before = n_include;
        const double s = cx.scale * dots[j];
        admit(t, cx.modified() ? st.hv.score(s, t) : s, level, n_include);
        if (n_include != before) prefetch_rows_l2(kv.value(t), value_bytes);
      }
    }
    for (std::size_t i = 0; i < n_include; ++i) {
      if (i + kPrefetchAhead < n_include)
        prefetch_rows(kv.value(ws.to_include_[i + kPrefetchAhead].token), value_bytes);
      const auto& a = ws.to_include_[i];
      include(a.token, a.score, level, a.heavy_level);
    }
  }

  /// Keys sampled as light at an earlier level that are heavy from this level on: their
  /// light terms leave the light sums, their exact weight joins the exact part.
  __attribute__((always_inline)) void transitions(int level) noexcept {
    const std::int32_t first = ws.transition_head_[std::size_t(level)];
    const std::size_t bytes = value_row_bytes(kv);
    for (std::int32_t k = first; k >= 0; k = ws.nodes_[std::size_t(k)].next)
      prefetch_rows(kv.value(ws.nodes_[std::size_t(k)].token), bytes);
    for (std::int32_t k = first; k >= 0; k = ws.nodes_[std::size_t(k)].next) {
      const node& nd = ws.nodes_[std::size_t(k)];
      const double w = std::exp(nd.score - c);
      const auto* v = value_of(kv, nd.token, cx);
      const double kappa = cx.design.weight(cx.dist[nd.token]);
      // light_sum -= kappa (v - g), exact_num += w (v - g).
      const row_norms nv = add_centered(v, -kappa, ws.light_sum_.data());
      add_centered(v, w, ws.exact_num_.data());
      st.light.remove(light_terms_of(nd.token, w, nv));
      st.exact.add_heavy(w, nv.sq);
    }
  }
};

}  // namespace certattn::detail
