// What every stage of the certified group call shares: the call's own kernels on one
// instruction set (attend_kernels, chosen once per call by select_attend_kernels()), what
// the call fixes before its stages run (call_context), and how the stages read rows of the
// cache (row_access: prefetches ahead of random reads, value rows into the certificate's
// centred sums). Both the stage sequence (attend_stages.hpp) and the per-head level loop
// (level_loop.hpp) include it. Internal: use attend_group() (attend.hpp).
#pragma once

#include <certattn/arch/candidate_kernels.hpp>
#include <certattn/arch/dispatch.hpp>
#include <certattn/arch/refine_kernels.hpp>
#include <certattn/arch/score_dot.hpp>
#include <certattn/certificate.hpp>
#include <certattn/index.hpp>
#include <certattn/options.hpp>
#include <certattn/perturb.hpp>
#include <certattn/variant.hpp>
#include <certattn/workspace.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

#include <certattn/arch/macros.hpp>

namespace certattn::detail {

/// The certified call's own kernels on one instruction set, chosen once per call from a
/// table (select_attend_kernels(), as select_dense_kernel() chooses the dense kernel's), so
/// that the stages call through it instead of branching on the ISA. The dot products, 8-bit
/// refinements and value accumulations dispatch on `which` in their own headers
/// (arch/score_dot.hpp, arch/refine_kernels.hpp).
struct attend_kernels {
  isa which = isa::kScalar;
  void (*perturbation_bounds)(std::uint64_t noise, std::size_t n, const float* off,
                              float* e) noexcept = nullptr;
  std::size_t (*find_candidates)(const float* u, const float* e, std::size_t n,
                                 const candidate_params& p, std::uint32_t* idx,
                                 std::uint8_t* lvl) noexcept = nullptr;
  float (*prepare_refine_block)(const float* q, const float* st4, std::size_t padded_dim,
                                float* a8) noexcept = nullptr;
};

inline attend_kernels select_attend_kernels(isa which) noexcept {
  attend_kernels k{which, &perturbation_bounds_portable, &find_candidates_portable,
                   &prepare_refine_block};
#if CERTATTN_X86
  if (which == isa::kAvx512Vnni) {
    k.perturbation_bounds = &perturbation_bounds_avx512;
    k.find_candidates = &find_candidates_avx512;
    k.prepare_refine_block = &prepare_refine_block_avx512;
  }
#endif
  return k;
}

/// What one call fixes before its stages run, and every stage reads.
struct call_context {
  const options& user;                // the options as given (epsilon, routing, cost)
  options opt;                        // on the shifted grid: levels 0..total_levels(),
                                      // weights relative to c + shift (shifted_grid())
  int top = 0;                        // user.top_halvings()
  std::size_t group = 0, n = 0, d = 0, dp = 0;  // heads, tokens, head_dim, padded head_dim
  std::size_t dv = 0;                 // value channels: d, or fewer for a latent cache
  std::size_t key_bytes = 0;          // bytes of a key row
  std::size_t value_bytes = 0;        // bytes a value row adds (0 when values alias keys)
  std::size_t first = 0;              // the first token that attends (a sliding window's)
  std::size_t pool_end = 0;           // the pool is [first, pool_end), the window after it
  double scale = 0.0;                 // the softmax scale
  perturbation pert;                  // this call's Exp(1) perturbations
  std::span<const std::uint32_t> xs;  // the exact set inside the pool
  value_radius radius;                // the index's value centre g and radius base
  double center_norm = 0.0;           // ||g||
  sampling_design design;             // how light keys are sampled (certificate.hpp)
  const float* dist = nullptr;        // the index's ||v_t - g|| bounds, per token
  // Over every token the call reads (the index's, and a shared-prefix call's tail rows,
  // attend_sequences()): max |k|, which the rounding bounds scale with, and an upper bound
  // of max ||v - g|| over the finite distances, with whether any distance overflowed.
  double key_abs_max = 0.0;
  double value_distance_max = 0.0;
  bool value_overflow = false;
  attend_kernels kernels;
  std::size_t budget = 0;             // sample_budget() of the group
  std::span<const int> hints;         // [group] level hints, or empty
  float* decoded = nullptr;           // [9][d]: 8 key rows and a value row of a quantized
                                      // cache, decoded (the workspace's)
  // A multi-position call (attend_positions()) scans the index once for the heads of all
  // its positions: this position's head g is row head0 + g of the scan's arrays (bounds,
  // block maxima, padded queries, recorded samples), of `heads` rows in all.
  std::size_t head0 = 0, heads = 0;

  std::size_t window() const noexcept { return n - pool_end; }
  /// Rows every head reads exactly: the window and the exact set.
  std::size_t fixed_rows() const noexcept { return window() + xs.size(); }
  /// The tokens that attend: what the dense kernel reads, and the cost model's unit.
  std::size_t attended() const noexcept { return n - first; }
  bool has_pool() const noexcept { return pool_end - first > xs.size(); }
  /// Blocks [first_block(), pool_blocks()) hold the pool.
  std::size_t first_block() const noexcept { return first / key_index::kBlockTokens; }
  std::size_t pool_blocks() const noexcept {
    return (pool_end + key_index::kBlockTokens - 1) / key_index::kBlockTokens;
  }
  /// Head g's variant (scalars of options::variant).
  head_variant head(std::size_t g) const noexcept { return head_variant_of(user.variant, g, n); }
  /// True when scores are not scale q.k (soft-cap or position bias).
  bool modified() const noexcept { return user.variant.modifies_scores(); }
};

/// How the stages and the level loop read rows of the cache: both derive from it. The
/// workspace befriends it for its value centre.
struct row_access {
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

  /// Token t's key row as the kernels read it: in place, or decoded into slot `slot` (of
  /// 8) of the call's scratch for a quantized cache.
  template <kv_view KV>
  static const key_row_t<KV>* key_of(const KV& kv, std::size_t t, const call_context& cx,
                                         std::size_t slot = 0) noexcept {
    return key_row(kv, t, cx.decoded + slot * cx.d);
  }
  /// Token t's value row as the kernels read it (decoded into the value slot).
  template <kv_view KV>
  static const value_row_t<KV>* value_of(const KV& kv, std::size_t t,
                                           const call_context& cx) noexcept {
    return value_row(kv, t, cx.decoded + 8 * cx.d);
  }

  /// Head g's rows of the scan's arrays: its 4-bit bounds as candidates are chosen from
  /// (the variant's when it modifies scores), the scan's own, its block maxima.
  static float* bounds_of(const call_context& cx, attend_workspace& ws, std::size_t g) noexcept {
    return (cx.modified() ? ws.variant_u_.data() : ws.u_.data()) + (cx.head0 + g) * ws.u_stride_;
  }
  static float* scan_bounds_of(const call_context& cx, attend_workspace& ws,
                               std::size_t g) noexcept {
    return ws.u_.data() + (cx.head0 + g) * ws.u_stride_;
  }
  static const residual_coefficients* residual_of(const call_context& cx,
                                                  const attend_workspace& ws,
                                                  std::size_t g) noexcept {
    return ws.residual_.data() + (cx.head0 + g) * ws.block_stride_;
  }
  static float* block_max_of(const call_context& cx, attend_workspace& ws, std::size_t g) noexcept {
    return ws.block_max_.data() + (cx.head0 + g) * ws.block_stride_;
  }

  /// acc += w (v - g) with g the value centre: the certificate's sums (level_sums).
  template <class T>
  static row_norms add_centered(const T* v, double w, double* acc, const call_context& cx,
                                const attend_workspace& ws) noexcept {
    return accumulate_centered_row(v, cx.dv, w, ws.center_.data(), acc, cx.kernels.which);
  }
};

}  // namespace certattn::detail

#include <certattn/arch/macros_undef.hpp>
