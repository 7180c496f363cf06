// What every baseline of `certattn-bench accuracy` sees and returns. A baseline family
// (oracle top-k, Quest, MagicPIG, ...) is a `method`: a tuning grid fixed per setting,
// an optional per-KV-head preparation (page bounds, hash codes, clusters), and a per-call
// run that writes one output estimate per grid point with the keys and bytes it read.
//
// Bytes are counted by one formula for every method and for the certified call
// (docs/accuracy.md): exact 16-bit key rows x d x 2 + value rows x d x 2 + metadata.
// Reads that do not depend on the query (sink and window rows, page bounds, centroids,
// 4-bit codes) are made once per GQA group and split evenly over its G query heads, as
// the certified call's certificate does; query-dependent rows are counted per head.
#pragma once

#include <certattn/arch/dispatch.hpp>
#include <certattn/arch/score_dot.hpp>
#include <certattn/common.hpp>
#include <certattn/index.hpp>
#include <certattn/parallel.hpp>
#include <certattn/perturb.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace certattn::bench::baselines {

/// A small counter-based generator (SplitMix64): one stream per call and method.
class rng {
 public:
  explicit rng(std::uint64_t seed) noexcept : s_(seed) {}
  std::uint64_t next() noexcept {
    std::uint64_t z = (s_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, 1) with 53 random bits.
  double uniform() noexcept { return double(next() >> 11) * 0x1p-53; }
  double normal() noexcept {  // Box-Muller, one of the pair
    const double u1 = (double(next() >> 11) + 1.0) * 0x1p-53, u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  std::uint64_t s_;
};

inline std::uint64_t mix_seed(std::uint64_t a, std::uint64_t b) noexcept {
  rng r(a * 0x2545F4914F6CDD1DULL + b);
  r.next();
  return r.next();
}

/// One KV head's cache as the baselines see it (token-major rows of one head).
struct head_input {
  const half* keys = nullptr;    // [n][d]
  const half* values = nullptr;  // [n][d]
  std::size_t n = 0, d = 0;
  std::size_t group = 1;         // G query heads share this KV head
  std::size_t window = 64;       // newest tokens, as the certified call's window
  std::size_t sinks = 4;         // first tokens kept by the methods that keep sinks
  double scale = 0.0;            // softmax scale
  std::span<const double> key_norm;  // ||k_i||, [n]
  const key_index* index = nullptr;  // the certified call's index (4-bit proxy for SSA)
  std::uint64_t seed = 0;            // for a method's own randomness at preparation
  thread_pool* pool = nullptr;       // for heavy preparation (k-means, hashing)

  const half* key(std::size_t t) const noexcept { return keys + t * d; }
  const half* value(std::size_t t) const noexcept { return values + t * d; }
  /// Bytes of `rows` 16-bit key rows plus as many value rows.
  double kv_row_bytes(double rows) const noexcept { return rows * 2.0 * double(d) * 2.0; }
};

/// One call (one query head): exact quantities computed once, shared by every baseline.
struct call_input {
  const float* q = nullptr;             // [d]
  double q_norm = 0.0;                  // ||q||
  std::span<const double> s;            // exact scores s_i = scale q.k_i, [n]
  std::span<const double> w;            // w_i = exp(s_i - c), [n]
  double c = 0.0;                       // max score
  double denominator = 0.0;             // D = sum w_i
  std::span<const std::uint32_t> order; // tokens by decreasing score, [n]
  std::span<const float> proxy;         // 4-bit score upper bounds of the pool, [n - window]
  std::uint64_t seed = 0;               // fresh randomness for this call
  noise_key noise{};                    // the certified call's perturbations of this query
};

/// What one grid point read in one call.
struct config_result {
  double keys = 0.0;   // exact 16-bit key rows read by this query head
  double bytes = 0.0;  // this query head's bytes (shared reads split over the group)
};

/// Weighted sums of value rows: den = sum weight, num = sum weight v.
class accum {
 public:
  void reset(std::size_t d) {
    num_.assign(d, 0.0);
    den_ = 0.0;
  }
  void add(const half* v, double weight) noexcept {
    if (weight == 0.0) return;
    den_ += weight;
    detail::accumulate_row(v, num_.size(), weight, num_.data(), active_isa());
  }
  /// num += scale * value_sum, den += weight: rows that enter with a common weight and
  /// only their sum is kept (RetroInfer's estimated clusters, light keys at weight tau).
  void add_sum(std::span<const double> value_sum, double scale, double weight) noexcept {
    den_ += weight;
    for (std::size_t i = 0; i < num_.size(); ++i) num_[i] += scale * value_sum[i];
  }
  double den() const noexcept { return den_; }
  /// o = num / den (zeros when nothing was added).
  void write(double* o) const noexcept {
    for (std::size_t i = 0; i < num_.size(); ++i) o[i] = den_ > 0.0 ? num_[i] / den_ : 0.0;
  }

 private:
  std::vector<double> num_;
  double den_ = 0.0;
};

/// Per-worker scratch a method may use during a call (no allocation per call).
struct scratch {
  accum acc, acc2;
  std::vector<double> a, b;
  std::vector<std::uint32_t> idx, idx2;
  std::vector<std::uint16_t> cnt;
  std::vector<std::uint8_t> flag;
  std::vector<float> f;
};

/// Key budgets of one setting: the grid points of the budgeted methods, in keys per query
/// head, built around what the certified call read (see docs/accuracy.md).
struct budgets {
  std::vector<std::size_t> keys;   // every budget, ascending
  std::vector<std::size_t> coarse; // a subset for the methods with a second grid axis
  std::vector<std::size_t> shared; // keys plus larger budgets for rows shared by a group
};

/// A baseline family.
class method {
 public:
  virtual ~method() = default;
  virtual std::string family() const = 0;
  /// Compared at matched keys read (false for dense methods that read every key).
  virtual bool key_matched() const { return true; }
  /// Fixes the grid for a setting (n tokens, head_dim d).
  virtual void configure(const budgets& b, std::size_t n, std::size_t d) = 0;
  virtual std::size_t configs() const = 0;
  virtual std::string config(std::size_t i) const = 0;
  /// Per-KV-head preparation, before any call on that head.
  virtual void prepare(const head_input&) {}
  /// One call: for grid point i, writes the estimate to out[i * d, (i + 1) * d) and what it
  /// read to res[i]. Must be safe to call concurrently (state is read-only after prepare).
  virtual void run(const head_input& h, const call_input& c, scratch& ws, std::span<double> out,
                   std::span<config_result> res) const = 0;
};

/// Budgets clamped to [lo, hi], sorted, duplicates dropped.
inline std::vector<std::size_t> clamp_unique(std::vector<std::size_t> v, std::size_t lo, std::size_t hi) {
  for (std::size_t& x : v) x = std::clamp(x, lo, hi);
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

}  // namespace certattn::bench::baselines
