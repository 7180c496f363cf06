// What the certified call keeps between calls: the caller-owned scratch of attend_group()
// (attend_workspace, sized once, so that a steady-state call allocates nothing) and the
// statistics of its last call (group_stats). Per-call state lives in the call's context
// (call_context.hpp) and a head's level loop state (level_loop.hpp), not here.
#pragma once

#include <certattn/common.hpp>
#include <certattn/dense.hpp>
#include <certattn/index.hpp>
#include <certattn/layout.hpp>
#include <certattn/memory.hpp>
#include <certattn/options.hpp>
#include <certattn/rounding.hpp>
#include <certattn/scan.hpp>

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <span>
#include <utility>
#include <vector>

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
  std::size_t refine_blocks = 0;     // sum over heads of 8-bit block preparations (each reads
                                     // the block's 4-bit step row)
  // Cache lines of the rows read at places no stream predicts: refinement rows (the 8-bit
  // codes' low nibbles), the prepared blocks' step rows, and the exact key and value rows of
  // the pool (not the
  // window's, the exact set's or the exact pass's, which are read in order).
  std::size_t scattered_lines = 0;
  // Seconds per stage (window, scan, max score, candidates, level loop, fallback), filled
  // only when the workspace times stages (attend_workspace::time_stages).
  double stage_seconds[6] = {};
};

namespace detail {
struct attend_stages;  // attend_stages.hpp
struct exact_paths;    // exact_paths.hpp
template <kv_view KV>
struct group_answer;   // attend_stages.hpp
struct row_access;     // call_context.hpp
template <kv_view KV>
struct head_loop;      // level_loop.hpp

/// What a shared-prefix call (attend_sequences()) reads of a sequence's rows after the
/// index's tokens, which the index does not describe: max |k| and an upper bound of the
/// largest finite ||v - g|| (g the index's value centre), with whether one overflowed.
struct tail_rows {
  float key_abs_max = 0.0f;
  float value_distance_max = 0.0f;
  bool value_overflow = false;
};

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
/// tokens, the most levels, the most value channels: 0 means head_dim, which serves every
/// cache of that head_dim, latent ones included). A call with sizes within these never
/// allocates.
class attend_workspace {
 public:
  attend_workspace(std::size_t group, std::size_t head_dim, std::size_t max_tokens,
                   int max_levels = options{}.total_levels(), std::size_t value_dim = 0)
      : group_(group), d_(head_dim), dv_(value_dim == 0 ? head_dim : value_dim),
        dp_((head_dim + 7) / 8 * 8), cap_(max_tokens), levels_(max_levels) {
    if (group == 0) throw error("attend_workspace: group must be > 0");
    if (head_dim == 0) throw error("attend_workspace: head_dim must be > 0");
    if (dv_ > head_dim) throw error("attend_workspace: value_dim must be <= head_dim");
    if (max_levels < 0 || max_levels > 254)
      throw error("attend_workspace: max_levels must lie in [0, 254]");
    const std::size_t blocks = (max_tokens + key_index::kBlockTokens - 1) / key_index::kBlockTokens;
    u_stride_ = blocks * key_index::kBlockTokens;
    block_stride_ = blocks;
    qpad_.assign(group * dp_, 0.0f);
    u_.assign(group * u_stride_ + 16, 0.0f);
    variant_u_.assign(group * u_stride_ + 16, 0.0f);
    block_max_.assign(group * blocks + 1, 0.0f);
    residual_.assign(group * blocks + 1, {});
    qa_.assign(scan_query_bytes(group, dp_), 0);  // the int8 queries (and the AMX scan's tiles)
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
    refine_a_.assign(blocks * detail::refine_a_size(dp_) + 16, 0.0f);
    refine_offset_.assign(blocks + 1, 0.0f);
    refine_ready_.assign(blocks + 1, 0);
    to_include_.assign(max_tokens + 16, {});
    pending_head_.assign(std::size_t(max_levels) + 2, -1);
    transition_head_.assign(std::size_t(max_levels) + 2, -1);
    exact_num_.assign(dv_, 0.0);
    light_sum_.assign(dv_, 0.0);
    window_num_.assign(group * dv_, 0.0);
    center_.assign(dv_, 0.0);
    o_hat_.assign(dv_, 0.0);
    c0_.assign(dv_, 0.0);
    decoded_.assign(9 * head_dim, 0.0f);  // 8 key rows and a value row of a quantized cache
    dense_ws_ = dense_workspace(group, head_dim);
    exact_heads_.assign(group, 0);
    exact_q_.assign(group * head_dim, 0.0f);
    exact_out_.assign(group * dv_, 0.0f);
    exact_m_.assign(group, 0.0f);
    exact_l_.assign(group, 0.0f);
    exact_slopes_.assign(group, 0.0f);
    exact_float_.assign(group, 0);
    tails_.assign(group, {});
    head_levels_.assign(group, -1);
    exact_rounding_.assign(group, {});
  }

  std::size_t group() const noexcept { return group_; }
  std::size_t head_dim() const noexcept { return d_; }
  /// The most value channels a call may have (head_dim unless sized smaller).
  std::size_t value_dim() const noexcept { return dv_; }
  std::size_t max_tokens() const noexcept { return cap_; }
  int max_levels() const noexcept { return levels_; }
  /// Statistics of the last call.
  const group_stats& last_stats() const noexcept { return stats_; }

  /// Time the stages of each call into group_stats::stage_seconds (two clock reads per
  /// stage; off by default).
  void time_stages(bool on) noexcept { time_stages_ = on; }
  bool times_stages() const noexcept { return time_stages_; }

  /// For benches: the last call's 4-bit score bounds u of head g and the perturbations'
  /// upper bounds E_up (value-aware offsets included), over its pool tokens; valid until
  /// the next call, and meaningless after a routed one (group_stats::routed).
  std::span<const float> last_score_bounds(std::size_t g) const noexcept {
    const float* u = variant_bounds_ ? variant_u_.data() : u_.data();
    return g < group_ ? std::span<const float>(u + g * u_stride_, stats_.pool)
                      : std::span<const float>();
  }
  std::span<const float> last_perturbation_bounds() const noexcept {
    return std::span<const float>(e_up_.data(), stats_.pool);
  }

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
  friend struct detail::attend_stages;
  friend struct detail::exact_paths;
  template <kv_view KV>
  friend struct detail::group_answer;
  friend struct detail::row_access;
  template <kv_view KV>
  friend struct detail::head_loop;

  struct node {
    std::uint32_t token = 0;
    std::int32_t next = -1;
    double score = 0.0;
    std::uint8_t stage = 0;  // kRefined or kScored
  };

  std::size_t group_, d_, dv_, dp_, cap_;
  int levels_;
  std::size_t u_stride_ = 0, block_stride_ = 0;
  // Per-token arrays (large_vector: on huge pages, memory.hpp): the level loop reads
  // them at the candidates' random positions.
  std::vector<float> qpad_, block_max_;
  large_vector<float> u_;          // [group][u_stride] the scan's bounds
  large_vector<float> variant_u_;  // [group][u_stride] the variant's (when it modifies scores)
  bool variant_bounds_ = false;    // the last call's candidates came from variant_u_
  std::vector<detail::residual_coefficients> residual_;  // [group][blocks] the scan's
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
  std::vector<float> refine_a_;           // [blocks][refine_a_size] q * st8 of this head
  std::vector<float> refine_offset_;      // [blocks] the nested refinement's constant
  std::vector<std::uint8_t> refine_ready_;  // [blocks] prepared for this head
  large_vector<admitted> to_include_;     // this level's keys whose values enter the sums
  std::vector<std::int32_t> pending_head_, transition_head_;
  std::vector<double> exact_num_, light_sum_, o_hat_, c0_;
  std::vector<double> window_num_;  // [group][value_dim]
  std::vector<double> center_;      // [value_dim] the index's value centre g (level_sums)
  std::vector<float> decoded_;      // [9][head_dim] rows of a quantized cache, decoded
  group_stats stats_;
  dense_workspace dense_ws_;  // the exact answers' (one dense pass for all their heads)
  std::vector<std::uint32_t> exact_heads_;  // [group] heads answered exactly, this call
  std::vector<float> exact_q_, exact_out_;  // [group][head_dim], [group][value_dim]: their
                                            // queries and outputs
  std::vector<float> exact_m_, exact_l_;    // [group] the dense pass's softmax states
  std::vector<float> exact_slopes_;         // [group] their position-bias slopes
  std::vector<std::uint8_t> exact_float_;   // [group] 1: the head joins the float pass
  std::vector<detail::tail_rows> tails_;    // [group] a shared-prefix call's sequences' tails
  std::vector<int> head_levels_;            // [group] stopping levels (group_history)
  std::vector<exact_rounding> exact_rounding_;  // [group] the exact answers' rounding
  bool record_ = false;
  bool time_stages_ = false;
  std::vector<std::vector<sampled_key>> recorded_;
};

}  // namespace certattn
