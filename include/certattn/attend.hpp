// The certified call for one GQA group: G query heads sharing one KV head. The stages run
// top to bottom in this file, one function each:
//   window      exact scores of the rows every head reads (the newest tokens and the exact
//               set: the classic certificate's value outliers, or values beyond float's
//               range), all G heads in one pass over the key rows
//   scan        4-bit score bounds u_i >= s_i for every pool key and all G heads at once
//   max score   c = exact maximum over the keys whose bound can reach the best lower bound,
//               per head; then the window's value sums of all heads in one pass
//   candidates  pool keys whose perturbed bound can reach the deepest level, bucketed by
//               their earliest level (counting sort)
//   level loop  new candidates refined with 8-bit codes, then exact 16-bit keys; heavy,
//               light or out; Horvitz-Thompson sums; the certificate of docs/certificate.md
//   fallback    exact attention when no level certifies
// It computes exactly the samples of reference_attend() (same perturbations, same scores
// bit for bit, same sets) while reading a small fraction of the cache.
#pragma once

#include <certattn/arch/candidate_kernels.hpp>
#include <certattn/arch/dispatch.hpp>
#include <certattn/arch/refine_kernels.hpp>
#include <certattn/arch/score_dot.hpp>
#include <certattn/certificate.hpp>
#include <certattn/dense.hpp>
#include <certattn/history.hpp>
#include <certattn/index.hpp>
#include <certattn/layout.hpp>
#include <certattn/memory.hpp>
#include <certattn/options.hpp>
#include <certattn/perturb.hpp>
#include <certattn/rounding.hpp>
#include <certattn/sampler.hpp>
#include <certattn/scan.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <certattn/arch/macros.hpp>

namespace certattn {

/// What one group call read, for benches and tests (bytes by the formula of
/// docs/fast-path.md, "Bytes read").
struct group_stats {
  std::size_t tokens = 0;            // n
  std::size_t pool = 0;              // n - window
  std::size_t candidates = 0;        // sum over heads of keys bucketed by the 4-bit bound
  std::size_t refined = 0;           // sum over heads of 8-bit refinements
  std::size_t keys_read = 0;         // sum over heads of exact key rows read (window: once)
  std::size_t values_read = 0;       // sum over heads of value rows read (window: once)
  std::size_t fallbacks = 0;         // heads answered by exact attention: no level certified
  std::size_t over_budget = 0;       // heads answered exactly: the group's samples outgrew
                                     // sample_budget() (answer_path kOverBudget, kJoined)
  std::size_t routed = 0;            // heads answered by the dense kernel (group_history)
  std::size_t sampled = 0;           // sum over sparse heads of heavy + sampled light keys at
                                     // the last level processed (cost_model's input)
  std::size_t bytes_read = 0;        // the whole group
  std::size_t dense_bytes = 0;       // what dense attention reads: K and V once
  std::size_t bound_violations = 0;  // a key exact-scored above its bound: must stay 0
  // Seconds per stage (window, scan, max score, candidates, level loop, fallback), filled
  // only when the workspace times stages (attend_workspace::time_stages).
  double stage_seconds[6] = {};
};

namespace detail {
/// Largest max(1, softmax_scale) * ||q||_1 * max|k| a certified call accepts: the float
/// score bounds keep a margin of 2^28 below FLT_MAX (real scores are below 2^10).
inline constexpr double kMaxScoreMagnitude = 0x1p100;

/// Times the stages of a call when the workspace asks for it (time_stages): a branch per
/// stage otherwise. A monotonic clock from <ctime>: <chrono> alone added a tenth of the
/// umbrella header's compile time.
struct stage_clock {
  bool on;
  double t = on ? now() : 0.0;
  [[gnu::noinline]] static double now() noexcept {
    std::timespec ts{};
#if defined(CLOCK_MONOTONIC)
    clock_gettime(CLOCK_MONOTONIC, &ts);
#else
    std::timespec_get(&ts, TIME_UTC);
#endif
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  }
  // Out of line and cold: the untimed call keeps its code layout.
  [[gnu::noinline, gnu::cold]] void record(double& acc) noexcept {
    const double n = now();
    acc += n - t;
    t = n;
  }
  void lap(double& acc) noexcept {
    if (on) [[unlikely]]
      record(acc);
  }
};

/// A heap array of doubles left uninitialised, so that its pages stay uncommitted until
/// written; move-only. (std::unique_ptr<double[]> would do, but <memory> adds a tenth of
/// the umbrella header's compile time.)
class uninitialized_doubles {
 public:
  uninitialized_doubles() = default;
  explicit uninitialized_doubles(std::size_t n) : p_(new double[n]) {}
  uninitialized_doubles(uninitialized_doubles&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  uninitialized_doubles& operator=(uninitialized_doubles&& o) noexcept {
    if (this != &o) {
      delete[] p_;
      p_ = std::exchange(o.p_, nullptr);
    }
    return *this;
  }
  uninitialized_doubles(const uninitialized_doubles&) = delete;
  uninitialized_doubles& operator=(const uninitialized_doubles&) = delete;
  ~uninitialized_doubles() { delete[] p_; }
  double& operator[](std::size_t i) const noexcept { return p_[i]; }

 private:
  double* p_ = nullptr;
};
}  // namespace detail

/// Caller-owned scratch of the certified call, sized once for (group, head_dim, the most
/// tokens, the most levels). A call with sizes within these never allocates.
class attend_workspace {
 public:
  attend_workspace(std::size_t group, std::size_t head_dim, std::size_t max_tokens,
                   int max_levels = options{}.total_levels())
      : group_(group), d_(head_dim), dp_((head_dim + 7) / 8 * 8), cap_(max_tokens),
        levels_(max_levels) {
    if (group == 0) throw error("attend_workspace: group must be > 0");
    if (head_dim == 0) throw error("attend_workspace: head_dim must be > 0");
    if (max_levels < 0 || max_levels > 254)
      throw error("attend_workspace: max_levels must lie in [0, 254]");
    const std::size_t blocks = (max_tokens + key_index::kBlockTokens - 1) / key_index::kBlockTokens;
    u_stride_ = blocks * key_index::kBlockTokens;
    block_stride_ = blocks;
    qpad_.assign(group * dp_, 0.0f);
    u_.assign(group * u_stride_ + 16, 0.0f);
    block_max_.assign(group * blocks + 1, 0.0f);
    qa_.assign(group * dp_, 0);
    prep_.assign(group, {});
    // [group][window + exact set]: the exact set can hold any number of tokens (values
    // beyond float's range always join it), so room for every token, left uncommitted.
    fixed_stride_ = max_tokens + 1;
    fixed_scores_ = detail::uninitialized_doubles(group * fixed_stride_);
    head_c_.assign(group, 0.0);
    head_max_.assign(group, 0.0);
    head_max_keys_.assign(group, 0);
    window_weight_.assign(group, 0.0);
    window_sq_.assign(group, 0.0);
    cand_idx_.assign(max_tokens + 16, 0);
    cand_lvl_.assign(max_tokens + 16, 0);
    bucket_.assign(max_tokens + 16, 0);
    bucket_start_.assign(std::size_t(max_levels) + 3, 0);
    nodes_.assign(3 * max_tokens + 16, {});  // refined, scored, transition
    to_score_.assign(max_tokens + 16, 0);
    e_up_.assign(max_tokens + 16, 0.0f);
    refine_a_.assign(blocks * dp_ + 16, 0.0f);
    refine_offset_.assign(blocks + 1, 0.0f);
    refine_ready_.assign(blocks + 1, 0);
    to_include_.assign(max_tokens + 16, {});
    pending_head_.assign(std::size_t(max_levels) + 2, -1);
    transition_head_.assign(std::size_t(max_levels) + 2, -1);
    exact_num_.assign(head_dim, 0.0);
    light_sum_.assign(head_dim, 0.0);
    window_num_.assign(group * head_dim, 0.0);
    center_.assign(head_dim, 0.0);
    o_hat_.assign(head_dim, 0.0);
    c0_.assign(head_dim, 0.0);
    dense_ws_ = dense_workspace(group, head_dim);
    exact_heads_.assign(group, 0);
    exact_q_.assign(group * head_dim, 0.0f);
    exact_out_.assign(group * head_dim, 0.0f);
    exact_m_.assign(group, 0.0f);
    exact_l_.assign(group, 0.0f);
    exact_float_.assign(group, 0);
    head_levels_.assign(group, -1);
    exact_rounding_.assign(group, {});
  }

  std::size_t group() const noexcept { return group_; }
  std::size_t head_dim() const noexcept { return d_; }
  std::size_t max_tokens() const noexcept { return cap_; }
  int max_levels() const noexcept { return levels_; }
  /// Statistics of the last call.
  const group_stats& last_stats() const noexcept { return stats_; }

  /// Time the stages of each call into group_stats::stage_seconds (two clock reads per
  /// stage; off by default).
  void time_stages(bool on) noexcept { time_stages_ = on; }
  bool times_stages() const noexcept { return time_stages_; }

  /// For tests: record the sample of each head (tokens that entered the HT sums, with
  /// the level at which each is heavy). Recording allocates; leave it off in production.
  void record_samples(bool on) { record_ = on; }
  struct sampled_key {
    std::uint32_t token;
    int heavy_level;
  };
  /// The recorded sample of head g in the last call (empty when it fell back to exact).
  std::span<const sampled_key> samples(std::size_t g) const {
    return g < recorded_.size() ? std::span<const sampled_key>(recorded_[g])
                                : std::span<const sampled_key>();
  }

 private:
  friend struct detail_attend;

  struct node {
    std::uint32_t token = 0;
    std::int32_t next = -1;
    double score = 0.0;
    std::uint8_t stage = 0;  // kRefined or kScored
  };

  std::size_t group_, d_, dp_, cap_;
  int levels_;
  std::size_t u_stride_ = 0, block_stride_ = 0;
  // Per-token arrays (large_vector: on huge pages, memory.hpp): the level loop reads
  // them at the candidates' random positions.
  std::vector<float> qpad_, block_max_;
  large_vector<float> u_;
  std::vector<std::int8_t> qa_;
  std::vector<detail::block_query_prep> prep_;
  std::size_t fixed_stride_ = 0;
  detail::uninitialized_doubles fixed_scores_;  // [group][fixed_stride]: window, then exact set
  std::vector<double> head_c_;              // [group] the weights' reference c + shift
  std::vector<double> head_max_;            // [group] c of each head (the maximum score)
  std::vector<std::size_t> head_max_keys_;  // [group] keys the max stage read exactly
  std::vector<double> window_weight_, window_sq_;  // [group] sums over window + exact set
  large_vector<std::uint32_t> cand_idx_, bucket_;
  large_vector<std::uint8_t> cand_lvl_;
  std::vector<std::uint32_t> bucket_start_;
  large_vector<node> nodes_;
  struct admitted {
    std::uint32_t token = 0;
    int heavy_level = 0;
    double score = 0.0;
  };
  large_vector<std::uint32_t> to_score_;  // this level's keys to read exactly
  large_vector<float> e_up_;              // [pool] upper bounds on the perturbations
  std::vector<float> refine_a_;           // [blocks][padded_dim] q * st8 of this head
  std::vector<float> refine_offset_;      // [blocks] C8 + margin of this head
  std::vector<std::uint8_t> refine_ready_;  // [blocks] prepared for this head
  large_vector<admitted> to_include_;     // this level's keys whose values enter the sums
  std::vector<std::int32_t> pending_head_, transition_head_;
  std::vector<double> exact_num_, light_sum_, o_hat_, c0_;
  std::vector<double> window_num_;  // [group][head_dim]
  std::vector<double> center_;      // [head_dim] the index's value centre g (level_sums)
  double center_norm_ = 0.0;        // ||g||
  sampling_design design_;          // this call's (certificate.hpp)
  const float* dist_ = nullptr;     // the index's ||v_t - g|| bounds, per token
  group_stats stats_;
  dense_workspace dense_ws_;  // the exact answers' (one dense pass for all their heads)
  std::vector<std::uint32_t> exact_heads_;  // [group] heads answered exactly, this call
  std::vector<float> exact_q_, exact_out_;  // [group][head_dim] their queries and outputs
  std::vector<float> exact_m_, exact_l_;    // [group] the dense pass's softmax states
  std::vector<std::uint8_t> exact_float_;   // [group] 1: the head joins the float pass
  std::vector<int> head_levels_;            // [group] stopping levels (group_history)
  std::vector<exact_rounding> exact_rounding_;  // [group] the exact answers' rounding
  bool record_ = false;
  bool time_stages_ = false;
  std::size_t head_ = 0;
  std::vector<std::vector<sampled_key>> recorded_;
};

/// The stages of the certified call. Internal: use attend_group().
struct detail_attend {
  using node = attend_workspace::node;
  // Candidates sit at random places in the cache: every pass over them prefetches this
  // many rows ahead, so that the misses overlap instead of queueing.
  static constexpr std::size_t kPrefetchAhead = 16;
  static void prefetch_rows(const void* p, std::size_t bytes) noexcept {
    const char* c = static_cast<const char*>(p);
    for (std::size_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o);
  }
  /// Into L2 only: for rows known to be needed soon but not next (a later pass of this
  /// level), so that their misses overlap the current pass without evicting its L1 data.
  static void prefetch_rows_l2(const void* p, std::size_t bytes) noexcept {
    const char* c = static_cast<const char*>(p);
    for (std::size_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 0, 2);
  }
  static constexpr std::uint8_t kRefined = 1, kScored = 2;

  /// Per-head running sums of the level loop.
  struct head_state {
    double exact_weight = 0.0, exact_sq = 0.0, light_sq = 0.0;
    double light_mass = 0.0, light_h = 0.0, light_hw = 0.0, light_t = 0.0;  // level_sums
    std::size_t light_count = 0, heavy = 0, keys_read = 0, values_read = 0, refined = 0;
    std::int32_t free_node = 0;
  };

  template <class T>
  static double add_value(const T* v, std::size_t d, double w, double* acc) noexcept {
    return detail::accumulate_row(v, d, w, acc, active_isa());
  }
  /// acc += w (v - g) with g the value centre: the certificate's sums (level_sums).
  template <class T>
  static detail::row_norms add_centered(const T* v, double w, double* acc,
                                        const attend_workspace& ws) noexcept {
    return detail::accumulate_centered_row(v, ws.d_, w, ws.center_.data(), acc, active_isa());
  }

  // ---- stage: window ------------------------------------------------------------------
  /// Scores of the rows every head reads exactly, the window and the exact set, for all G
  /// heads in one pass over the key rows: [g][window, then set].
  template <kv_view KV>
  static void fixed_scores(const KV& kv, const float* q, std::size_t G, std::size_t d,
                           double scale, std::size_t pool_end, std::span<const std::uint32_t> xs,
                           attend_workspace& ws, isa which) noexcept {
    using T = typename KV::element_type;
    const std::size_t W = kv.size() - pool_end, F = W + xs.size();
    auto token = [&](std::size_t i) { return i < W ? pool_end + i : std::size_t(xs[i - W]); };
    for (std::size_t i = 0; i < F; ++i) {
      if (i + kPrefetchAhead < F) prefetch_rows(kv.key(token(i + kPrefetchAhead)), d * sizeof(T));
      const T* k = kv.key(token(i));
      for (std::size_t g = 0; g < G; ++g)
        ws.fixed_scores_[g * ws.fixed_stride_ + i] =
            scale * detail::score_dot_fast(q + g * d, k, d, which);
    }
  }

  /// The window and exact-set sums of every head with its own c, in one pass over the
  /// value rows (each row is read once for the G heads).
  template <kv_view KV>
  static void fixed_sums(const KV& kv, std::size_t G, std::size_t pool_end,
                         std::span<const std::uint32_t> xs, attend_workspace& ws) noexcept {
    using T = typename KV::element_type;
    const std::size_t d = ws.d_, W = kv.size() - pool_end, F = W + xs.size();
    auto token = [&](std::size_t i) { return i < W ? pool_end + i : std::size_t(xs[i - W]); };
    std::fill_n(ws.window_num_.begin(), G * d, 0.0);
    std::fill_n(ws.window_weight_.begin(), G, 0.0);
    std::fill_n(ws.window_sq_.begin(), G, 0.0);
    for (std::size_t i = 0; i < F; ++i) {
      if (i + kPrefetchAhead < F) prefetch_rows(kv.value(token(i + kPrefetchAhead)), d * sizeof(T));
      const T* v = kv.value(token(i));
      for (std::size_t g = 0; g < G; ++g) {
        const double w = std::exp(ws.fixed_scores_[g * ws.fixed_stride_ + i] - ws.head_c_[g]);
        ws.window_weight_[g] += w;
        ws.window_sq_[g] += w * add_centered(v, w, ws.window_num_.data() + g * d, ws).sq;
      }
    }
  }

  // ---- stage: scan --------------------------------------------------------------------
  static void scan(const key_index& idx, std::size_t G, double scale, std::size_t pool_end,
                   attend_workspace& ws, isa which) noexcept {
    scan_request r;
    r.index = &idx;
    r.queries = ws.qpad_.data();
    r.nq = G;
    r.softmax_scale = scale;
    r.pool_end = pool_end;
    r.u = ws.u_.data();
    r.u_stride = ws.u_stride_;
    r.block_max = ws.block_max_.data();
    r.block_stride = ws.block_stride_;
    r.qa = ws.qa_.data();
    r.prep = ws.prep_.data();
    scan_score_bounds(r, which);
  }

  // ---- stage: max score ---------------------------------------------------------------
  /// c = max_i s_i exactly: any key above the running lower bound has its bound above it.
  template <kv_view KV>
  static double max_score(const KV& kv, const float* q, std::size_t d, double scale,
                          std::size_t pool_end, const float* u, const float* block_max,
                          double window_max, head_state& st, isa which) noexcept {
    double lb = window_max;
    const std::size_t nb = (pool_end + key_index::kBlockTokens - 1) / key_index::kBlockTokens;
    auto exact = [&](std::size_t t) {
      ++st.keys_read;
      return scale * detail::score_dot_fast(q, kv.key(t), d, which);
    };
    // Seed with the key of the largest bound: usually the maximum itself.
    std::size_t best_block = 0;
    for (std::size_t b = 1; b < nb; ++b)
      if (block_max[b] > block_max[best_block]) best_block = b;
    if (nb > 0 && double(block_max[best_block]) >= lb) {
      const std::size_t t0 = best_block * key_index::kBlockTokens;
      const std::size_t t1 = std::min(pool_end, t0 + key_index::kBlockTokens);
      std::size_t arg = t0;
      for (std::size_t t = t0; t < t1; ++t)
        if (u[t] > u[arg]) arg = t;
      lb = std::max(lb, exact(arg));
    }
    for (std::size_t b = 0; b < nb; ++b) {
      if (double(block_max[b]) < lb) continue;
      const std::size_t t0 = b * key_index::kBlockTokens;
      const std::size_t t1 = std::min(pool_end, t0 + key_index::kBlockTokens);
      for (std::size_t t = t0; t < t1; ++t)
        if (double(u[t]) >= lb) lb = std::max(lb, exact(t));
    }
    return lb;
  }

  // ---- stage: candidates --------------------------------------------------------------
  /// Pool keys whose perturbed bound reaches ln tau_J, in buckets by earliest level.
  static std::size_t bucket_candidates(const float* u, std::size_t pool_end, double c,
                                       const options& opt, int first, int last,
                                       attend_workspace& ws, isa which) noexcept {
    detail::candidate_params p;
    p.c = std::nextafter(float(c), -INFINITY);  // below c: y only grows
    // Each of the three float roundings errs by at most 2^-24 of its operand, all of
    // which stay within |c| + 80 for any token that can reach ln tau_J >= -180; within
    // |c| + 640 when E_up carries value-aware offsets (ln(rho / rho_bar) < 192 for float
    // distances; an infinite one is stored as 2^64, and y then passes every threshold).
    p.slack = float((std::fabs(c) + (ws.design_.value_aware ? 1024.0 : 256.0)) * 0x1p-21);
    p.threshold = float(ln_tau(last, opt.grid_ratio));
    // A later pass keeps only what the earlier one (down to level first - 1) did not.
    p.upper = first == 0 ? INFINITY : float(ln_tau(first - 1, opt.grid_ratio));
    p.level_scale = float(-double(opt.grid_ratio) / std::numbers::ln2);
    p.min_level = first;
    p.max_level = last;
    std::size_t m;
#if CERTATTN_X86
    if (which == isa::kAvx512Vnni)
      m = detail::find_candidates_avx512(u, ws.e_up_.data(), pool_end, p, ws.cand_idx_.data(),
                                         ws.cand_lvl_.data());
    else
#endif
      m = detail::find_candidates_portable(u, ws.e_up_.data(), pool_end, p, ws.cand_idx_.data(),
                                         ws.cand_lvl_.data());
    (void)which;
    // Counting sort by level (stable: tokens stay in order within a level).
    const std::size_t J = std::size_t(opt.max_levels);
    std::uint32_t* start = ws.bucket_start_.data();
    std::fill(start, start + J + 3, 0u);
    for (std::size_t i = 0; i < m; ++i) ++start[ws.cand_lvl_[i] + 1];
    for (std::size_t j = 1; j <= J + 1; ++j) start[j] += start[j - 1];
    // start[j] is now the beginning of bucket j; scatter with start[j] as the cursor.
    for (std::size_t i = 0; i < m; ++i) {
      const std::size_t j = ws.cand_lvl_[i];
      ws.bucket_[start[j]++] = ws.cand_idx_[i];
    }
    // Shift back: after the scatter, start[j] is the end of bucket j = start of j + 1.
    for (std::size_t j = J + 1; j > 0; --j) start[j] = start[j - 1];
    start[0] = 0;
    return m;
  }

  /// Candidates are bucketed lazily: first the levels most calls stop within, the
  /// deeper ones only when a call gets there (their buckets are empty until then).
  static int first_pass_levels(const options& opt) noexcept {
    return std::min(opt.max_levels, 3 * opt.max_levels / 4);
  }

  // ---- stage: level loop --------------------------------------------------------------
  /// This head's 8-bit preparation of block b (see arch/refine_kernels.hpp), made on
  /// first use: a = q st8 (returned) and the offset C8 + margin.
  static const float* refine_block(const key_index& idx, std::size_t b, const float* qpad,
                                   attend_workspace& ws, isa which) noexcept {
    (void)which;  // dispatched on x86 only
    const std::size_t dp = idx.padded_dim();
    float* a = ws.refine_a_.data() + b * dp;
    if (!ws.refine_ready_[b]) {
#if CERTATTN_X86
      if (which == isa::kAvx512Vnni)
        ws.refine_offset_[b] =
            detail::prepare_refine_block_avx512(qpad, idx.block_lo(b), idx.block_step8(b), dp, a);
      else
#endif
        ws.refine_offset_[b] =
            detail::prepare_refine_block(qpad, idx.block_lo(b), idx.block_step8(b), dp, a);
      ws.refine_ready_[b] = 1;
    }
    return a;
  }

  static std::int32_t push(attend_workspace& ws, head_state& st, std::vector<std::int32_t>& head,
                           std::size_t level, std::uint32_t token, double score,
                           std::uint8_t stage) noexcept {
    const std::int32_t k = st.free_node++;
    node& nd = ws.nodes_[std::size_t(k)];
    nd.token = token;
    nd.score = score;
    nd.stage = stage;
    nd.next = head[level];
    head[level] = k;
    return k;
  }

  template <kv_view KV>
  static void include(const KV& kv, std::size_t t, double s, double c, int level, int heavy_level,
                      const options& opt, attend_workspace& ws, head_state& st) noexcept {
    const double w = std::exp(s - c);
    ++st.values_read;
    if (ws.record_) ws.recorded_[ws.head_].push_back({std::uint32_t(t), heavy_level});
    if (heavy_level <= level) {
      ++st.heavy;
      st.exact_weight += w;
      st.exact_sq += w * add_centered(kv.value(t), w, ws.exact_num_.data(), ws).sq;
    } else {
      const float dist = ws.dist_[t];
      const double kappa = ws.design_.weight(dist), rho = ws.design_.reach(dist);
      const detail::row_norms nv = add_centered(kv.value(t), kappa, ws.light_sum_.data(), ws);
      ++st.light_count;
      st.light_sq += nv.centered_sq;
      st.light_mass += kappa;
      st.light_h += kappa * per_reach(nv.centered_sq, rho);
      st.light_hw += w * per_reach(nv.centered_sq, rho);
      st.light_t += kappa * nv.sq;
      if (heavy_level <= opt.max_levels)
        push(ws, st, ws.transition_head_, std::size_t(heavy_level), std::uint32_t(t), s, kScored);
    }
  }

  /// A key with exact score s at this level: sampled now (queued for its value), at a
  /// later level (deferred), or never.
  static void admit(std::size_t t, double s, double c, const perturbation& pert, int level,
                    const options& opt, attend_workspace& ws, head_state& st,
                    std::size_t& n_include) noexcept {
    // The level needs E only to within the grid: decide it from E's float bracket, and
    // take the logarithm only when the bracket straddles a grid point (about 6% of keys at
    // grid ratio 2). Either way the level is the one earliest_level(s - c + E) gives.
    const std::uint64_t bits = pert.bits(t);
    const double x = (s - c) + ws.design_.offset(ws.dist_[t]);  // as reference_attend()
    const float upper = perturbation::exp1_upper_from_bits(bits);
    int ls = earliest_level(x + double(upper), opt.grid_ratio, opt.max_levels);
    if (ls != earliest_level(x + double(perturbation::exp1_lower_from_bits(bits, upper)),
                             opt.grid_ratio, opt.max_levels))
      ls = earliest_level(x + perturbation::exp1_from_bits(bits), opt.grid_ratio, opt.max_levels);
    if (ls > opt.max_levels) return;
    if (ls > level) {
      push(ws, st, ws.pending_head_, std::size_t(ls), std::uint32_t(t), s, kScored);
      return;
    }
    if (ls < level) ++ws.stats_.bound_violations;  // the bounds promised otherwise
    ws.to_include_[n_include++] = {std::uint32_t(t),
                                   earliest_level(x, opt.grid_ratio, opt.max_levels), s};
  }

  /// The 8-bit stage of a new candidate with 8-bit bound u8 (scaled): true when its exact
  /// key must be read now.
  static bool refine_candidate(std::size_t t, double u8, double c, int level, const options& opt,
                               attend_workspace& ws, head_state& st) noexcept {
    ++st.refined;
    const double x8 = (u8 - c) + double(ws.e_up_[t]);  // == pert.exp1_upper(t)
    const int l8 = earliest_level(x8 + 1e-12 * (std::fabs(u8) + std::fabs(c) + 64.0),
                                  opt.grid_ratio, opt.max_levels);
    if (l8 > opt.max_levels) return false;
    if (l8 > level) {
      push(ws, st, ws.pending_head_, std::size_t(l8), std::uint32_t(t), 0.0, kRefined);
      return false;
    }
    return true;
  }

  /// One level's new keys: 8-bit refinement, exact keys, values; each pass prefetches.
  template <kv_view KV>
  static void process_level(const KV& kv, const key_index& idx, const float* q,
                            const float* qpad, double scale, double c, const perturbation& pert,
                            int level, const options& opt, attend_workspace& ws,
                            head_state& st, isa which) noexcept {
    const std::size_t d = ws.d_, dp = idx.padded_dim();
    using T = typename KV::element_type;
    std::size_t n_score = 0, n_include = 0;
    const std::uint32_t b0 = ws.bucket_start_[std::size_t(level)];
    const std::uint32_t b1 = ws.bucket_start_[std::size_t(level) + 1];
    // The buckets of the next levels follow this one: prefetch across the boundary, so
    // that a level's first candidates are not fetched one miss at a time.
    const std::uint32_t b_end = ws.bucket_start_[std::size_t(opt.max_levels) + 1];
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
          prefetch_rows(idx.codes8(ahead), dp);
          const std::size_t ab = ahead / key_index::kBlockTokens;
          if (!ws.refine_ready_[ab]) {  // its block's scales, read by the preparation
            prefetch_rows(idx.block_lo(ab), dp * sizeof(float));
            prefetch_rows(idx.block_step8(ab), dp * sizeof(float));
          }
        }
        const std::uint32_t t = ws.bucket_[i + k];
        const std::size_t b = t / key_index::kBlockTokens;
        a[k] = refine_block(idx, b, qpad, ws, which);
        offset[k] = ws.refine_offset_[b];
        codes[k] = idx.codes8(t);
      }
      for (std::uint32_t k = m; k < kBatch; ++k) {
        a[k] = a[0];
        codes[k] = codes[0];
      }
      detail::refine_dots(a, codes, m, dp, dot, which);
      for (std::uint32_t k = 0; k < m; ++k) {
        const std::uint32_t t = ws.bucket_[i + k];
        const double u8 = scale * (double(offset[k]) + double(dot[k]));
        if (refine_candidate(t, u8, c, level, opt, ws, st)) {
          prefetch_rows_l2(kv.key(t), d * sizeof(T));
          ws.to_score_[n_score++] = t;
        }
      }
    }
    for (std::int32_t k = ws.pending_head_[std::size_t(level)]; k >= 0;) {
      const node nd = ws.nodes_[std::size_t(k)];
      if (nd.stage == kRefined) {
        prefetch_rows_l2(kv.key(nd.token), d * sizeof(T));
        ws.to_score_[n_score++] = nd.token;
      } else {
        const std::size_t before = n_include;
        admit(nd.token, nd.score, c, pert, level, opt, ws, st, n_include);
        if (n_include != before) prefetch_rows_l2(kv.value(nd.token), d * sizeof(T));
      }
      k = nd.next;
    }
    // Exact keys 8 at a time through the batched score (independent chains, same bits).
    for (std::size_t i = 0; i < n_score; i += 8) {
      const std::size_t m = std::min<std::size_t>(8, n_score - i);
      const T* rows[8];
      for (std::size_t j = 0; j < 8; ++j) {
        if (i + j + kPrefetchAhead < n_score)
          prefetch_rows(kv.key(ws.to_score_[i + j + kPrefetchAhead]), d * sizeof(T));
        rows[j] = kv.key(ws.to_score_[i + (j < m ? j : 0)]);
      }
      double dots[8];
      detail::score_dot8_fast(q, rows, d, which, dots);
      for (std::size_t j = 0; j < m; ++j) {
        const std::uint32_t t = ws.to_score_[i + j];
        ++st.keys_read;
        const std::size_t before = n_include;
        admit(t, scale * dots[j], c, pert, level, opt, ws, st, n_include);
        if (n_include != before) prefetch_rows_l2(kv.value(t), d * sizeof(T));
      }
    }
    for (std::size_t i = 0; i < n_include; ++i) {
      if (i + kPrefetchAhead < n_include)
        prefetch_rows(kv.value(ws.to_include_[i + kPrefetchAhead].token), d * sizeof(T));
      const auto& a = ws.to_include_[i];
      include(kv, a.token, a.score, c, level, a.heavy_level, opt, ws, st);
    }
  }

  /// Keys sampled as light at an earlier level that are heavy from this level on.
  template <kv_view KV>
  static void transitions(const KV& kv, int level, double c, attend_workspace& ws,
                          head_state& st) noexcept {
    const std::int32_t first = ws.transition_head_[std::size_t(level)];
    const std::size_t bytes = ws.d_ * sizeof(typename KV::element_type);
    for (std::int32_t k = first; k >= 0; k = ws.nodes_[std::size_t(k)].next)
      prefetch_rows(kv.value(ws.nodes_[std::size_t(k)].token), bytes);
    for (std::int32_t k = first; k >= 0; k = ws.nodes_[std::size_t(k)].next) {
      const node& nd = ws.nodes_[std::size_t(k)];
      const double w = std::exp(nd.score - c);
      const auto* v = kv.value(nd.token);
      const float dist = ws.dist_[nd.token];
      const double kappa = ws.design_.weight(dist), rho = ws.design_.reach(dist);
      // light_sum -= kappa (v - g), exact_num += w (v - g).
      const detail::row_norms nv = add_centered(v, -kappa, ws.light_sum_.data(), ws);
      add_centered(v, w, ws.exact_num_.data(), ws);
      --st.light_count;
      st.light_sq -= nv.centered_sq;
      st.light_mass -= kappa;
      st.light_h -= kappa * per_reach(nv.centered_sq, rho);
      st.light_hw -= w * per_reach(nv.centered_sq, rho);
      st.light_t -= kappa * nv.sq;
      if (st.light_count == 0)  // no rounding residue where the sums are empty
        st.light_mass = st.light_h = st.light_hw = st.light_t = 0.0;
      ++st.heavy;
      st.exact_weight += w;
      st.exact_sq += w * nv.sq;
    }
  }

  // ---- stage: exact answers ----------------------------------------------------------
  /// scale ||q||_1 max|k| >= |s_i| and >= scale sum_j |q_j k_ij| for every token: what the
  /// rounding bounds of rounding.hpp scale with.
  static double score_magnitude(const float* q, std::size_t d, double scale,
                                const key_index& idx) noexcept {
    double l1 = 0.0;
    for (std::size_t j = 0; j < d; ++j) l1 += std::fabs(double(q[j]));
    return scale * l1 * double(idx.max_abs_key());
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
  static void exact_heads(const KV& kv, const key_index& idx, const float* queries, double scale,
                          std::size_t m, float* out, attend_workspace& ws, isa which,
                          bool force_double, double value_norm_max) {
    const std::size_t d = ws.d_, n = kv.size();
    const bool float_scale = scale <= 0x1p100 && !force_double;
    std::size_t k = 0;  // heads of the float pass, gathered in ws.exact_q_
    for (std::size_t i = 0; i < m; ++i) {
      const std::size_t g = ws.exact_heads_[i];
      const float* q = queries + g * d;
      double qmax = 0.0;
      for (std::size_t j = 0; j < d; ++j) qmax = std::max(qmax, std::fabs(double(q[j])));
      ws.exact_float_[i] = float_scale && scale * qmax <= 0x1p100 && !(std::fabs(ws.head_max_[g]) > 1024.0);
      if (ws.exact_float_[i]) std::copy_n(q, d, ws.exact_q_.data() + k++ * d);
    }
    if (k > 0)
      dense_partial(std::span<const float>(ws.exact_q_.data(), k * d), k, kv, float(scale), 0, n,
                    std::span<float>(ws.exact_m_.data(), k), std::span<float>(ws.exact_l_.data(), k),
                    std::span<float>(ws.exact_out_.data(), k * d), ws.dense_ws_);
    std::size_t f = 0;  // the float pass's row of the next head that joined it
    for (std::size_t i = 0; i < m; ++i) {
      const std::size_t g = ws.exact_heads_[i];
      const float* q = queries + g * d;
      float* o = out + g * d;
      double& c = ws.head_max_[g];
      const double magnitude = score_magnitude(q, d, scale, idx);
      exact_rounding& r = ws.exact_rounding_[g];
      r = {};
      r.head_dim = d;
      if (ws.exact_float_[i]) {
        const float mk = ws.exact_m_[f], lk = ws.exact_l_[f];
        const float* ok = ws.exact_out_.data() + f * d;
        ++f;
        const double cref = std::isnan(c) ? double(mk) : c;
        bool finite = std::fabs(cref) <= 1024.0;
        for (std::size_t j = 0; j < d; ++j) finite &= std::isfinite(o[j] = ok[j] / lk);
        const double den = double(lk) * std::exp(double(mk) - cref);
        if (finite && den > 0.0 && std::isfinite(den)) {
          c = cref;
          ws.window_weight_[g] = den;
          r.eta = dense_kernel_eta(n, d, magnitude);
          r.spread = value_norm_max;  // >= sum_i a_i ||v_i||; value scale: <= M
          continue;
        }
      }
      if (std::isnan(c)) {  // the exact maximum, for the double path's weights
        c = -std::numeric_limits<double>::infinity();
        for (std::size_t t = 0; t < n; ++t)
          c = std::max(c, scale * detail::score_dot_fast(q, kv.key(t), d, which));
      }
      std::fill(ws.exact_num_.begin(), ws.exact_num_.end(), 0.0);
      double den = 0.0, sq = 0.0;
      for (std::size_t t = 0; t < n; ++t) {
        const double w = std::exp(scale * detail::score_dot_fast(q, kv.key(t), d, which) - c);
        den += w;
        sq += w * add_value(kv.value(t), d, w, ws.exact_num_.data());
      }
      for (std::size_t j = 0; j < d; ++j) o[j] = float(ws.exact_num_[j] / den);
      ws.window_weight_[g] = den;
      r.eta = double_path_eta(n, magnitude + std::fabs(c) * 0x1p-40);
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
  static double value_norm_max(const key_index& idx, std::size_t n) noexcept {
    if (!idx.overflow_tokens().empty()) return std::numeric_limits<double>::infinity();
    double g2 = 0.0;
    for (float x : idx.value_center()) g2 += double(x) * double(x);
    return (std::sqrt(g2) + idx.value_distance_max(n)) * (1.0 + 0x1p-40);
  }

  // ---- the call, stage by stage -------------------------------------------------------
  template <kv_view KV>
  static void run(std::span<const float> queries, std::size_t group, const KV& kv,
                  const key_index& idx, const noise_key& nk, const options& user_opt,
                  std::span<float> out, std::span<certificate> certs, attend_workspace& ws,
                  std::span<const int> level_hints, group_history* history) {
    using T = typename KV::element_type;
    // Every stage works on the shifted grid: levels 0..total_levels(), weights relative
    // to c + shift (head_c_), the coarsest threshold 1 (options.hpp, shifted_grid()).
    const options opt = shifted_grid(user_opt);
    const int top = user_opt.top_halvings();
    const std::size_t n = kv.size(), d = kv.head_dim();
    const isa which = active_isa();
    const double scale = opt.effective_softmax_scale(d);
    const std::size_t pool_end = n - opt.effective_window(n);
    const std::size_t dp = (d + 7) / 8 * 8;
    const perturbation pert(opt.seed, nk);
    group_stats& stats = ws.stats_;
    stats = {};
    if (ws.record_) ws.recorded_.assign(group, {});
    stats.tokens = n;
    stats.pool = pool_end;
    // The history's hints only where they are independent of this call's perturbations.
    if (history) level_hints = history->hints_for(nk);
    // Routing: a group whose sparse cost estimate exceeds the dense kernel's is answered
    // by the dense kernel (until a probe is due), before any stage reads the index.
    if (pool_end > 0 && history && history->routes_dense(user_opt)) {
      route_dense(kv, idx, queries, group, user_opt, scale, out, certs, ws, which);
      history->record_dense();
      return;
    }
    const std::size_t budget = sample_budget(user_opt, n);
    std::size_t spent = 0;        // pool keys the heads so far took into their samples
    std::size_t exact_count = 0;  // heads of this call answered exactly (ws.exact_heads_)

    for (std::size_t g = 0; g < group; ++g) {
      std::copy_n(queries.data() + g * d, d, ws.qpad_.data() + g * dp);
      std::fill(ws.qpad_.data() + g * dp + d, ws.qpad_.data() + (g + 1) * dp, 0.0f);
    }
    detail::stage_clock clock{ws.time_stages_};
    const value_radius radius{idx.value_radius_base(pool_end), idx.value_center()};
    for (std::size_t i = 0; i < d; ++i) ws.center_[i] = radius.center_at(i);
    ws.center_norm_ = 0.0;
    for (std::size_t i = 0; i < d; ++i) ws.center_norm_ += ws.center_[i] * ws.center_[i];
    ws.center_norm_ = std::sqrt(ws.center_norm_);
    ws.design_ = make_sampling_design(opt, idx.reach_floor(), idx.value_distance_max(pool_end),
                                      idx.value_center());
    ws.dist_ = idx.value_distances();
    const std::size_t W = n - pool_end;
    // The exact set inside the pool: read exactly, never sampled. The classic certificate's
    // holds the value outliers; the tight one samples those by their reach and reads only
    // the values whose distance overflowed float.
    std::span<const std::uint32_t> xs = opt.certificate == certificate_kind::kClassic
                                            ? idx.exact_tokens()
                                            : idx.overflow_tokens();
    xs = xs.first(std::size_t(std::lower_bound(xs.begin(), xs.end(), std::uint32_t(pool_end)) - xs.begin()));
    fixed_scores(kv, queries.data(), group, d, scale, pool_end, xs, ws, which);
    clock.lap(stats.stage_seconds[0]);
    if (pool_end > 0) scan(idx, group, scale, pool_end, ws, which);
    clock.lap(stats.stage_seconds[1]);
#if CERTATTN_X86
    if (which == isa::kAvx512Vnni)
      detail::fill_exp1_upper_avx512(pert.key(), pool_end, ws.e_up_.data());
    else
#endif
      detail::fill_exp1_upper_portable(pert.key(), pool_end, ws.e_up_.data());
    // Value-aware sampling adds ln(rho_t / rho_bar) to every perturbed score: fold its
    // float upper bound into E_up (rounded up), so that the candidate and 8-bit stages
    // bound the perturbed score unchanged.
    if (ws.design_.value_aware) {
#if CERTATTN_X86
      if (which == isa::kAvx512Vnni)
        detail::add_offsets_upper_avx512(ws.e_up_.data(), idx.sampling_offsets_upper(), pool_end);
      else
#endif
        detail::add_offsets_upper_portable(ws.e_up_.data(), idx.sampling_offsets_upper(), pool_end);
    }
    clock.lap(stats.stage_seconds[3]);

    for (std::size_t g = 0; g < group; ++g)
      for (std::uint32_t t : xs) ws.u_[g * ws.u_stride_ + t] = -std::numeric_limits<float>::infinity();
    // c of every head (exact maximum score), then the fixed rows' sums of all heads.
    for (std::size_t g = 0; g < group; ++g) {
      double window_max = -std::numeric_limits<double>::infinity();
      for (std::size_t i = 0; i < W + xs.size(); ++i)
        window_max = std::max(window_max, ws.fixed_scores_[g * ws.fixed_stride_ + i]);
      head_state st;
      ws.head_c_[g] = pool_end > 0 ? max_score(kv, queries.data() + g * d, d, scale, pool_end,
                                               ws.u_.data() + g * ws.u_stride_,
                                               ws.block_max_.data() + g * ws.block_stride_,
                                               window_max, st, which)
                                   : window_max;
      ws.head_max_keys_[g] = st.keys_read;
      ws.head_max_[g] = ws.head_c_[g];
      ws.head_c_[g] += grid_shift(top);
    }
    fixed_sums(kv, group, pool_end, xs, ws);
    clock.lap(stats.stage_seconds[2]);
    for (std::size_t g = 0; g < group; ++g) {
      const float* q = queries.data() + g * d;
      const float* qpad = ws.qpad_.data() + g * dp;
      ws.head_ = g;
      std::fill_n(ws.refine_ready_.begin(),
                  (pool_end + key_index::kBlockTokens - 1) / key_index::kBlockTokens, 0);
      const float* u = ws.u_.data() + g * ws.u_stride_;
      head_state st;
      st.keys_read = W + xs.size() + ws.head_max_keys_[g];
      st.values_read = W + xs.size();
      const double c = ws.head_c_[g];
      const std::span<const double> window_num(ws.window_num_.data() + g * d, d);
      const double window_weight = ws.window_weight_[g], window_sq = ws.window_sq_[g];

      certificate& cert = certs[g];
      cert = {};
      float* o = out.data() + g * d;
      bool done = false;
      std::size_t m = 0;  // candidates bucketed
      // What this head may still sample; once an earlier head needed the exact pass, the
      // remaining heads join it (it reads every row anyway).
      const std::size_t head_budget = budget - std::min(spent, budget);
      if (user_opt.route == routing::kAuto && exact_count > 0 && pool_end > xs.size()) {
        cert.path = answer_path::kJoined;
      } else if (pool_end == xs.size()) {  // no pool: window and exact set are everything
        for (std::size_t i = 0; i < d; ++i)
          o[i] = float(radius.center_at(i) + window_num[i] / window_weight);
        cert.exact = true;
        cert.path = answer_path::kNoPool;
        cert.max_score = ws.head_max_[g];
        cert.denominator = unshift(window_weight, ws.head_c_[g], ws.head_max_[g], top);
        // Exact attention in double around the centre g: certified when its rounding
        // bound meets epsilon (rounding.hpp).
        exact_rounding r;
        r.head_dim = d;
        r.eta = double_path_eta(n, score_magnitude(q, d, scale, idx) + grid_shift(top));
        r.value_scale = std::sqrt(ws.window_sq_[g] / window_weight);
        r.center_norm = ws.center_norm_;
        r.spread = value_scale_upper(r) + r.center_norm;
        certify_exact_answer(r, output_norm(o, d), cert.denominator, user_opt, cert);
        done = true;
      } else {
        const int first_last = first_pass_levels(opt);
        m = bucket_candidates(u, pool_end, c, opt, 0, first_last, ws, which);
        clock.lap(stats.stage_seconds[3]);
        std::fill(ws.pending_head_.begin(), ws.pending_head_.end(), -1);
        std::fill(ws.transition_head_.begin(), ws.transition_head_.end(), -1);
        std::copy(window_num.begin(), window_num.end(), ws.exact_num_.begin());
        std::fill(ws.light_sum_.begin(), ws.light_sum_.end(), 0.0);
        st.exact_weight = window_weight;
        st.exact_sq = window_sq;
        for (int j = 0; j <= opt.max_levels && !done; ++j) {
          if (j == first_last + 1) {  // the deeper levels' candidates, now needed
            m += bucket_candidates(u, pool_end, c, opt, j, opt.max_levels, ws, which);
            clock.lap(stats.stage_seconds[3]);
          }
          // New candidates of this level, then keys deferred to it, then light keys that
          // turn heavy here.
          process_level(kv, idx, q, qpad, scale, c, pert, j, opt, ws, st, which);
          transitions(kv, j, c, ws, st);

          level_sums sums;
          sums.tau = tau_of(j, opt.grid_ratio);
          sums.exact_weight = st.exact_weight;
          sums.exact_num = ws.exact_num_;
          sums.exact_sq = st.exact_sq;
          sums.light_count = st.light_count;
          sums.light_sum = ws.light_sum_;
          sums.light_sq = st.light_sq;
          sums.light_mass = st.light_mass;
          sums.light_h = st.light_h;
          sums.light_hw = st.light_hw;
          sums.light_t = st.light_t;
          const int hint = level_hints.empty() ? -1 : level_hints[g];
          const level_result lr =
              certify(sums, radius, ws.design_, opt, j, hint, ws.o_hat_, ws.c0_);
          if (lr.certified) {
            for (std::size_t i = 0; i < d; ++i) o[i] = float(ws.o_hat_[i]);
            cert.certified = true;
            cert.level = j;
            cert.tau = unshift(sums.tau, c, ws.head_max_[g], top);  // relative to the largest weight
            cert.bound = lr.bound;
            cert.beta = lr.beta;
            cert.scale_value = lr.scale_value;
            cert.max_score = ws.head_max_[g];
            cert.denominator = unshift(lr.d_hat, c, ws.head_max_[g], top);
            cert.heavy = st.heavy;
            cert.sampled = st.light_count;
            done = true;
          } else if (st.heavy + st.light_count > head_budget) {
            cert.path = answer_path::kOverBudget;
            break;
          }
        }
        stats.sampled += st.heavy + st.light_count;
        spent += st.heavy + st.light_count;
      }
      clock.lap(stats.stage_seconds[4]);
      stats.candidates += pool_end > xs.size() ? m : 0;
      // Own reads; the shared part (codes, scales, window, the exact answers' dense pass)
      // is added below, split evenly.
      const std::size_t exact_rows = W + xs.size();  // shared by the group
      cert.bytes_read =
          st.refined * dp + (st.keys_read - exact_rows + st.values_read - exact_rows) * d * sizeof(T);
      stats.refined += st.refined;
      stats.keys_read += st.keys_read - exact_rows;
      stats.values_read += st.values_read - exact_rows;
      ws.head_levels_[g] = done ? cert.level : -1;
      if (!done) {  // answered by the exact pass below, with every other such head
        if (ws.record_) ws.recorded_[g].clear();
        ws.exact_heads_[exact_count++] = std::uint32_t(g);
        if (cert.path == answer_path::kOverBudget || cert.path == answer_path::kJoined)
          ++stats.over_budget;
        else
          cert.path = answer_path::kFallback;
        cert.exact = true;
        cert.level = -1;
      } else {
        cert.keys_read = st.keys_read;
        cert.values_read = st.values_read;
      }
    }
    std::size_t exact_pass_bytes = 0;
    if (exact_count > 0) {
      exact_heads(kv, idx, queries.data(), scale, exact_count, out.data(), ws, which, false,
                  std::numeric_limits<double>::infinity());
      for (std::size_t i = 0; i < exact_count; ++i) {
        certificate& cert = certs[ws.exact_heads_[i]];
        cert.denominator = ws.window_weight_[ws.exact_heads_[i]];
        cert.max_score = ws.head_max_[ws.exact_heads_[i]];
        cert.keys_read = n;
        cert.values_read = n;
      }
      stats.fallbacks += exact_count - stats.over_budget;
      // One pass reads every key and value row once for all these heads.
      exact_pass_bytes = 2 * n * d * sizeof(T);
      stats.keys_read += n;
      stats.values_read += n;
    }
    clock.lap(stats.stage_seconds[5]);
    const std::size_t pool_blocks = (pool_end + key_index::kBlockTokens - 1) / key_index::kBlockTokens;
    const std::size_t shared = pool_blocks * (idx.block_code4_bytes() + 3 * dp * sizeof(float)) +
                               2 * (W + xs.size()) * d * sizeof(T) + exact_pass_bytes;
    stats.keys_read += W + xs.size();
    stats.values_read += W + xs.size();
    stats.bytes_read = shared;
    for (std::size_t g = 0; g < group; ++g) {
      stats.bytes_read += certs[g].bytes_read;
      certs[g].bytes_read += shared / group;
    }
    stats.dense_bytes = 2 * n * d * sizeof(T);
    if (history) {
      const double cost = user_opt.cost.predicted(stats.sampled, n) + (exact_count > 0 ? 1.0 : 0.0);
      history->record_sparse(cost, std::span<const int>(ws.head_levels_.data(), group), nk);
    }
  }

  /// The whole group by the dense kernel (group_history routed it): exact attention, with
  /// the certificate its rounding allows (rounding.hpp): the float kernel's bound where it
  /// meets epsilon, else the head again on the double path, else not certified.
  template <kv_view KV>
  static void route_dense(const KV& kv, const key_index& idx, std::span<const float> queries,
                          std::size_t group, const options& opt, double scale,
                          std::span<float> out, std::span<certificate> certs,
                          attend_workspace& ws, isa which) {
    using T = typename KV::element_type;
    const std::size_t n = kv.size(), d = kv.head_dim();
    for (std::size_t g = 0; g < group; ++g) {
      ws.exact_heads_[g] = std::uint32_t(g);
      ws.head_max_[g] = std::numeric_limits<double>::quiet_NaN();
      if (ws.record_) ws.recorded_[g].clear();
    }
    const double vmax = value_norm_max(idx, n);
    exact_heads(kv, idx, queries.data(), scale, group, out.data(), ws, which, false, vmax);
    group_stats& stats = ws.stats_;
    stats.keys_read = stats.values_read = n;
    stats.routed = group;
    stats.dense_bytes = stats.bytes_read = 2 * n * d * sizeof(T);
    std::size_t redo = 0;  // heads whose float bound missed epsilon, for the double path
    for (std::size_t g = 0; g < group; ++g) {
      certificate& cert = certs[g];
      cert = {};
      cert.exact = true;
      cert.path = answer_path::kRouted;
      cert.max_score = ws.head_max_[g];
      cert.denominator = ws.window_weight_[g];
      cert.keys_read = cert.values_read = n;
      certify_exact_answer(ws.exact_rounding_[g], output_norm(out.data() + g * d, d),
                           cert.denominator, opt, cert);
      if (!cert.certified && !std::isnan(ws.exact_rounding_[g].value_scale)) continue;
      if (!cert.certified) ws.exact_heads_[redo++] = std::uint32_t(g);
    }
    if (redo > 0) {
      exact_heads(kv, idx, queries.data(), scale, redo, out.data(), ws, which, true, vmax);
      stats.bytes_read += redo * 2 * n * d * sizeof(T);  // the double path: a pass per head
      for (std::size_t i = 0; i < redo; ++i) {
        const std::size_t g = ws.exact_heads_[i];
        certificate& cert = certs[g];
        cert.max_score = ws.head_max_[g];
        cert.denominator = ws.window_weight_[g];
        certify_exact_answer(ws.exact_rounding_[g], output_norm(out.data() + g * d, d),
                             cert.denominator, opt, cert);
      }
    }
    for (std::size_t g = 0; g < group; ++g) certs[g].bytes_read = stats.bytes_read / group;
  }
};

namespace detail {
/// attend_group()'s argument checks: a certattn::error naming the first bad argument.
template <kv_view KV>
void check_attend_call(std::span<const float> queries, std::size_t group, const KV& kv,
                       const key_index& idx, const options& opt, std::span<float> out,
                       std::span<certificate> certs, const attend_workspace& ws,
                       std::span<const int> level_hints) {
  validate(opt);
  const std::size_t n = kv.size(), d = kv.head_dim();
  validate_shape(opt, n, d);
  if (group == 0) throw error("group must be > 0");
  if (queries.size() != group * d)
    throw error("queries has " + std::to_string(queries.size()) + " elements, expected group * head_dim = " +
                std::to_string(group * d));
  if (out.size() != group * d)
    throw error("out has " + std::to_string(out.size()) + " elements, expected group * head_dim = " +
                std::to_string(group * d));
  if (certs.size() != group)
    throw error("certs has " + std::to_string(certs.size()) + " elements, expected group = " +
                std::to_string(group));
  if (!level_hints.empty() && level_hints.size() != group)
    throw error("level_hints has " + std::to_string(level_hints.size()) +
                " elements, expected 0 or group = " + std::to_string(group));
  if (idx.head_dim() != d)
    throw error("idx head_dim (" + std::to_string(idx.head_dim()) + ") != kv.head_dim() (" +
                std::to_string(d) + ")");
  if (idx.size() != n)
    throw error("idx.size() (" + std::to_string(idx.size()) + ") != kv.size() (" +
                std::to_string(n) + "): append every new token to the index");
  if (group > ws.group() || d != ws.head_dim() || n > ws.max_tokens() ||
      opt.total_levels() > ws.max_levels())
    throw error("ws (attend_workspace) is sized for group " + std::to_string(ws.group()) +
                ", head_dim " + std::to_string(ws.head_dim()) + ", " +
                std::to_string(ws.max_tokens()) + " tokens, " + std::to_string(ws.max_levels()) +
                " levels: too small for this call (group " + std::to_string(group) +
                ", head_dim " + std::to_string(d) + ", " + std::to_string(n) +
                " tokens, levels options.total_levels() = " + std::to_string(opt.total_levels()) +
                ")");
  if (opt.window > 64) throw error("options.window must be <= 64 for attend_group");
  for (float x : queries)
    if (!std::isfinite(x)) throw error("queries contain a NaN or Inf");
  // The score bounds run in float. Scores beyond any real model's would overflow them
  // (and lose candidates), so such inputs are refused rather than certified wrongly.
  const double score_scale = std::max(1.0, opt.effective_softmax_scale(d));
  for (std::size_t g = 0; g < group; ++g) {
    double l1 = 0.0;
    for (std::size_t i = 0; i < d; ++i) l1 += std::fabs(double(queries[g * d + i]));
    const double magnitude = l1 * double(idx.max_abs_key()) * score_scale;
    if (!(magnitude <= detail::kMaxScoreMagnitude)) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.3g", magnitude);
      throw error("queries: head " + std::to_string(g) +
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
///   tight certificate spends most of delta (level_delta_share()), so that heads stop
///   with fewer keys, and routes groups whose sparse path lost to the dense kernel
///   (options::route). Without one, the call has no hints and routes no group; a head
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
  detail_attend::run(queries, group, kv, idx, nk, opt, out, certs, ws, {}, &history);
}

/// The same without a history, with optional level hints: empty, or [group] the level
/// each head stopped at in this (layer, KV head)'s previous step (certificate::level; -1
/// for none). Any hint is valid, since it is fixed before the perturbations.
template <kv_view KV>
void attend_group(std::span<const float> queries, std::size_t group, const KV& kv,
                  const key_index& idx, const noise_key& nk, const options& opt,
                  std::span<float> out, std::span<certificate> certs, attend_workspace& ws,
                  std::span<const int> level_hints = {}) {
  detail::check_attend_call(queries, group, kv, idx, opt, out, certs, ws, level_hints);
  detail_attend::run(queries, group, kv, idx, nk, opt, out, certs, ws, level_hints, nullptr);
}


}  // namespace certattn

#include <certattn/arch/macros_undef.hpp>
