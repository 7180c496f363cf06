// Synthetic KV caches and decode queries with the structure that makes real attention
// hard to approximate: sinks, RoPE recency, outlier key channels, topical heavy hitters,
// isolated needles, log-normal value norms. Used by the tests, benches and examples.
// The model behind each regime and its measured statistics are in docs/synthetic.md.
#pragma once

#include <certattn/common.hpp>
#include <certattn/memory.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numbers>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace certattn::synthetic {

/// Which structure dominates the attention of the generated queries, from nearly
/// uniform to nearly one-hot. Every regime keeps some realism (a key mean, varied value
/// norms); the named structure is the one turned up.
enum class regime {
  kUniform,          // unstructured keys, weak queries: exp(entropy) close to n
  kMild,             // sinks, recency and topics present but weak
  kRecency,          // strong RoPE recency: mass on the newest tokens, power-law tail
  kSinks,            // the first tokens take a large share for most queries
  kClustered,        // topical passages with heavy hitters; queries retrieve passages
  kNeedle,           // one isolated key matches the query strongly, anywhere
  kOutlierChannels,  // a few key channels of very large magnitude (KIVI)
  kPeaked,           // most mass on a few dozen keys
  kExtreme,          // nearly all mass on a handful of keys
  kMixed,            // all structures, strengths varying widely from query to query
};

inline constexpr std::array<regime, 10> all_regimes = {
    regime::kUniform,   regime::kMild,   regime::kRecency,         regime::kSinks,
    regime::kClustered, regime::kNeedle, regime::kOutlierChannels, regime::kPeaked,
    regime::kExtreme,   regime::kMixed,
};

inline std::string_view to_string(regime r) {
  switch (r) {
    case regime::kUniform: return "uniform";
    case regime::kMild: return "mild";
    case regime::kRecency: return "recency";
    case regime::kSinks: return "sinks";
    case regime::kClustered: return "clustered";
    case regime::kNeedle: return "needle";
    case regime::kOutlierChannels: return "outlier_channels";
    case regime::kPeaked: return "peaked";
    case regime::kExtreme: return "extreme";
    case regime::kMixed: return "mixed";
  }
  return "unknown";
}

inline regime regime_from_string(std::string_view name) {
  for (regime r : all_regimes) {
    if (to_string(r) == name) return r;
  }
  std::string known;
  for (regime r : all_regimes) {
    if (!known.empty()) known += ", ";
    known += to_string(r);
  }
  throw error("certattn::synthetic::regime_from_string: unknown regime \"" + std::string(name) +
              "\" (expected one of: " + known + ")");
}

struct cache_config {
  std::size_t n_tokens = 4096;
  std::size_t head_dim = 128;  // even: RoPE rotates channel pairs
  std::size_t kv_heads = 1;
  regime kind = regime::kMixed;
  std::uint64_t seed = 1;
};

/// A run of consecutive tokens about one topic (a paragraph of the imagined document).
struct passage {
  std::size_t begin = 0;  // first token
  std::size_t end = 0;    // one past the last token
  std::size_t topic = 0;
};

/// The hidden structure of one KV head, kept so that make_queries can aim at it. The
/// directions are unit vectors of head_dim doubles, pre-RoPE unless noted; a key at
/// position t holds RoPE_t(its pre-RoPE vector).
struct head_structure {
  std::vector<double> key_mean;            // [head_dim], not unit: the mean of the keys
  std::vector<double> noise_scale;         // [head_dim] per-channel std of the key noise
  std::vector<double> topic_dirs;          // [n_topics][head_dim]
  std::vector<double> sink_dir;            // [head_dim] shared by the sinks *after* RoPE
  std::vector<double> needle_dirs;         // [n_needles][head_dim]
  std::vector<std::size_t> outlier_pairs;  // rotary pair indices i (channels i, i + d/2)
  std::vector<double> outlier_means;       // [outlier_pairs][2] unit mean of each outlier pair
  std::vector<double> value_offset;        // [head_dim] common mean of the values
};

/// A synthetic fp16 KV cache, head-major (HND):
/// keys[(h * n_tokens + t) * head_dim + ch], values likewise. On huge pages, as an
/// engine's cache should be (memory.hpp, docs/integration.md).
struct kv_cache {
  cache_config config;
  large_vector<half> keys;    // [kv_heads][n_tokens][head_dim], RoPE applied
  large_vector<half> values;  // [kv_heads][n_tokens][head_dim]

  const half* key_row(std::size_t head, std::size_t token) const {
    return keys.data() + (head * config.n_tokens + token) * config.head_dim;
  }
  const half* value_row(std::size_t head, std::size_t token) const {
    return values.data() + (head * config.n_tokens + token) * config.head_dim;
  }

  // Hidden structure, shared by all heads (it belongs to the imagined text) ...
  std::vector<double> inv_freq;            // [head_dim / 2] rotary frequencies, base 10000
  std::size_t n_sinks = 0;                 // tokens 0 .. n_sinks-1 are attention sinks
  std::vector<passage> passages;           // cover [n_sinks, n_tokens) in order
  std::vector<std::size_t> needle_tokens;  // positions of the needles
  std::vector<std::uint8_t> heavy_hitter;  // [n_tokens] 1 where a token is salient
  std::vector<std::uint8_t> large_value;   // [n_tokens] 1 where the value norm is huge
  // ... and per KV head (its own projections).
  std::vector<head_structure> heads;  // [kv_heads]
};

namespace detail {

inline constexpr double kRopeBase = 10000.0;
inline constexpr std::size_t kSinks = 4;
inline constexpr std::size_t kNeedles = 8;
inline constexpr std::size_t kTopics = 16;
inline constexpr double kOutlierSpread = 0.35;  // per-token std of an outlier pair / its mean
inline constexpr double kLargeValueShare = 0.002;
inline constexpr double kLargeValueGain = 12.0;  // norm of a "large" value vs a typical one

/// Sink j's key is weaker than sink 0's: in real models the first token is the main sink.
inline double sink_decay(std::size_t j) { return 1.0 / (1.0 + 0.4 * static_cast<double>(j)); }

/// Knobs of one regime. Key-side amplitudes are in units of the typical key channel std
/// (1); query-side strengths are in score units (scale * q.k with scale 1/sqrt(d)), so
/// the table reads directly as "how many nats above the bulk".
struct regime_params {
  // keys
  double key_mean = 0.8;          // |key mean| / sqrt(d)
  double topic_amp = 0.0;         // topic component of an ordinary passage token / sqrt(d)
  double heavy_fraction = 0.0;    // share of non-sink tokens that are heavy hitters
  double heavy_gain = 1.0;        // their topic component relative to an ordinary token
  double sink_amp = 0.0;          // sink key component / sqrt(d); 0: no sinks
  double needle_amp = 0.0;        // needle key component / sqrt(d); 0: no needles
  std::size_t outlier_pairs = 0;  // rotary pairs with outlier magnitude
  double outlier_amp = 0.0;       // their magnitude relative to a typical channel
  // queries
  double noise = 0.2;      // score std drawn from the unstructured key noise
  double recency = 0.0;    // RoPE recency kernel height at distance 0
  double sink = 0.0;       // score of sink 0 (sink j gets sink / (1 + 0.4 j))
  double sink_prob = 0.0;  // share of queries that use the sinks
  double topic = 0.0;      // score of an ordinary token of a targeted passage
  std::size_t passages_per_query = 1;
  double needle = 0.0;       // score of the targeted needle
  double needle_prob = 0.0;  // share of queries that look for a needle
  double outlier = 0.0;      // score std drawn from the outlier channels
  double spread = 0.5;       // std (nats) of each strength from one step to the next
};

inline regime_params params_for(regime r) {
  regime_params p;
  // Key-side structure. Content is kept weak in positional regimes: a query with a large
  // component of its own (recency, sinks) meets big content keys at random angles, and
  // in d = 128 those chance alignments (std ~ |q| |k| / d) turn a few keys into magnets.
  auto keys = [&p](double topic_amp, double heavy_gain, double sink_amp, double needle_amp) {
    p.topic_amp = topic_amp;
    p.heavy_fraction = 0.04;
    p.heavy_gain = heavy_gain;
    p.sink_amp = sink_amp;
    p.needle_amp = needle_amp;
  };
  switch (r) {
    case regime::kUniform: p.noise = 0.2; break;
    case regime::kMild:
      keys(0.5, 1.5, 1.5, 0.0);
      p.noise = 0.6, p.recency = 2.0, p.sink = 2.5, p.sink_prob = 0.5, p.topic = 1.5;
      p.spread = 0.5;
      break;
    case regime::kRecency:
      keys(0.3, 1.5, 1.5, 0.0);
      p.noise = 0.6, p.recency = 11.0, p.sink = 1.5, p.sink_prob = 0.5, p.topic = 1.0;
      p.spread = 1.0;
      break;
    case regime::kSinks:
      keys(0.5, 1.5, 1.5, 0.0);
      p.noise = 0.7, p.recency = 3.0, p.sink = 11.0, p.sink_prob = 0.9, p.topic = 1.5;
      p.spread = 1.0;
      break;
    case regime::kClustered:
      keys(0.8, 1.8, 1.5, 0.0);
      p.noise = 0.7, p.recency = 3.0, p.sink = 3.0, p.sink_prob = 0.6, p.topic = 3.5;
      p.passages_per_query = 2;
      p.spread = 1.0;
      break;
    case regime::kNeedle:
      keys(0.5, 1.5, 1.5, 1.5);
      p.noise = 0.7, p.recency = 3.0, p.sink = 3.0, p.sink_prob = 0.6, p.topic = 1.5;
      p.needle = 11.0, p.needle_prob = 0.95;
      p.spread = 1.0;
      break;
    case regime::kOutlierChannels:
      keys(0.5, 1.5, 1.5, 0.0);
      p.outlier_pairs = 2, p.outlier_amp = 30.0;
      p.noise = 0.7, p.recency = 3.0, p.sink = 3.0, p.sink_prob = 0.6, p.topic = 3.0;
      p.outlier = 1.0;
      p.spread = 1.0;
      break;
    case regime::kPeaked:
      keys(0.8, 1.3, 1.5, 1.5);
      p.outlier_pairs = 1, p.outlier_amp = 15.0;
      p.noise = 0.9, p.recency = 5.0, p.sink = 7.0, p.sink_prob = 0.8, p.topic = 7.0;
      p.needle = 12.0, p.needle_prob = 0.5, p.outlier = 0.5;
      p.spread = 1.0;
      break;
    case regime::kExtreme:
      keys(0.8, 2.0, 1.5, 1.5);
      p.outlier_pairs = 1, p.outlier_amp = 15.0;
      p.noise = 1.0, p.recency = 6.0, p.sink = 24.0, p.sink_prob = 0.9, p.topic = 9.0;
      p.needle = 28.0, p.needle_prob = 0.9, p.outlier = 0.5;
      p.spread = 1.0;
      break;
    case regime::kMixed:
      keys(0.7, 2.0, 1.5, 1.5);
      p.outlier_pairs = 2, p.outlier_amp = 12.0;
      p.noise = 0.8, p.recency = 5.0, p.sink = 5.0, p.sink_prob = 0.7, p.topic = 4.0;
      p.needle = 9.0, p.needle_prob = 0.2, p.outlier = 0.8;
      p.spread = 2.5;
      break;
  }
  return p;
}

// ---- randomness -----------------------------------------------------------------------
// All randomness is integer hashing (splitmix64), so it is the same on every platform.
// Floating point is done in double and rounded to fp16 / float at the end: a last-bit
// difference in a libm function could flip an output bit only if the exact value sat
// within ~1e-16 of a rounding boundary.

inline constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// Independent stream id for (seed, purpose, a, b): any draw can be regenerated without
/// replaying the others, so the order of generation never matters.
inline constexpr std::uint64_t stream_id(std::uint64_t seed, std::uint64_t purpose,
                                         std::uint64_t a = 0, std::uint64_t b = 0) noexcept {
  std::uint64_t h = mix64(seed + 0x9e3779b97f4a7c15ULL * (purpose + 1));
  h = mix64(h ^ (a + 0x632be59bd9b4e019ULL));
  return mix64(h ^ (b + 0x85157af5d8a6c3b1ULL));
}

enum purpose : std::uint64_t {
  kStructure = 1,
  kHeadStructure,
  kKeyNoise,
  kValueNoise,
  kTokenScalars,
  kQuery,
  kQueryMember
};

/// Standard normal quantile Phi^{-1}(q) for q in (0, 0.5]: a rough rational start
/// (Abramowitz-Stegun 26.2.23, error < 5e-4) polished by Halley steps on erfc, which
/// keeps full relative accuracy deep in the tail.
inline double lower_normal_quantile(double q) {
  const double t = std::sqrt(-2.0 * std::log(q));
  double z = -(t - (2.515517 + t * (0.802853 + t * 0.010328)) /
                       (1.0 + t * (1.432788 + t * (0.189269 + t * 0.001308))));
  constexpr double kSqrt2 = 1.4142135623730951;
  constexpr double kSqrt2Pi = 2.5066282746310002;
  for (int it = 0; it < 3; ++it) {
    const double e = 0.5 * std::erfc(-z / kSqrt2) - q;
    const double u = e * kSqrt2Pi * std::exp(0.5 * z * z);
    z -= u / (1.0 + 0.5 * z * u);
  }
  return z;
}

/// Inverse-CDF sampling through a 4096-interval quantile table (linear interpolation
/// inside, exact quantiles in the two outer intervals so the tails stay Gaussian). One
/// table lookup per normal: several times faster than Box-Muller's log + sin + cos,
/// and unlike std::normal_distribution it gives the same numbers on every library.
class normal_table {
 public:
  static constexpr int kBits = 12;
  static constexpr std::uint32_t kIntervals = 1u << kBits;

  normal_table() {
    for (std::uint32_t i = 1; i < kIntervals; ++i) {
      const double p = static_cast<double>(i) / kIntervals;
      q_[i] = p <= 0.5 ? lower_normal_quantile(p) : -lower_normal_quantile(1.0 - p);
    }
  }

  /// Standard normal from 32 random bits: 12 pick the interval, 20 place within it.
  double operator()(std::uint32_t bits) const {
    const std::uint32_t i = bits >> (32 - kBits);
    const double f = (static_cast<double>(bits & ((1u << (32 - kBits)) - 1)) + 0.5) *
                     (1.0 / (1u << (32 - kBits)));
    if (i == 0) return lower_normal_quantile(f / kIntervals);
    if (i == kIntervals - 1) return -lower_normal_quantile((1.0 - f) / kIntervals);
    return q_[i] + f * (q_[i + 1] - q_[i]);
  }

  static const normal_table& get() {
    static const normal_table table;
    return table;
  }

 private:
  std::array<double, kIntervals + 1> q_{};  // q_[i] = Phi^{-1}(i / kIntervals); ends unused
};

/// Sequential splitmix64 stream with Gaussian and uniform draws.
class rng {
 public:
  explicit rng(std::uint64_t id) : state_(id) {}

  std::uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    return mix64(state_);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1p-53; }  // [0, 1)
  std::size_t below(std::size_t n) {
    return static_cast<std::size_t>(uniform() * static_cast<double>(n));
  }
  double normal() { return normal_table::get()(static_cast<std::uint32_t>(next() >> 32)); }
  /// Two normals from one 64-bit draw (the bulk noise: half the hashing).
  void normal2(const normal_table& t, double& a, double& b) {
    const std::uint64_t r = next();
    a = t(static_cast<std::uint32_t>(r >> 32));
    b = t(static_cast<std::uint32_t>(r));
  }

 private:
  std::uint64_t state_;
};

// ---- rotary embedding -------------------------------------------------------------------
// Half-split layout as in HF Llama / vLLM's neox style: pair i is channels (i, i + d/2),
// rotated by angle inv_freq[i] * position. Pairs with large i turn slowly.

inline void rope(std::span<const double> inv_freq, std::span<const double> src, double position,
                 std::span<double> dst) {
  const std::size_t half_dim = inv_freq.size();
  for (std::size_t i = 0; i < half_dim; ++i) {
    const double a = inv_freq[i] * position;
    const double c = std::cos(a), s = std::sin(a);
    const double x = src[i], y = src[i + half_dim];
    dst[i] = x * c - y * s;
    dst[i + half_dim] = x * s + y * c;
  }
}

/// cos / sin of inv_freq * t for consecutive t by the angle-addition recurrence,
/// re-anchored with exact values every kAnchor tokens (drift < kAnchor * 1e-16): the
/// cache needs n * d/2 rotations and libm sin/cos would dominate generation time.
class rope_table {
 public:
  static constexpr std::size_t kAnchor = 64;

  explicit rope_table(std::span<const double> inv_freq)
      : freq_(inv_freq.begin(), inv_freq.end()),
        step_cos_(freq_.size()),
        step_sin_(freq_.size()),
        cos_(freq_.size()),
        sin_(freq_.size()) {
    for (std::size_t i = 0; i < freq_.size(); ++i) {
      step_cos_[i] = std::cos(freq_[i]);
      step_sin_[i] = std::sin(freq_[i]);
    }
  }

  /// Moves to position t (must be called with t = 0, 1, 2, ...).
  void advance_to(std::size_t t) {
    if (t % kAnchor == 0) {
      for (std::size_t i = 0; i < freq_.size(); ++i) {
        const double a = freq_[i] * static_cast<double>(t);
        cos_[i] = std::cos(a);
        sin_[i] = std::sin(a);
      }
      return;
    }
    for (std::size_t i = 0; i < freq_.size(); ++i) {
      const double c = cos_[i] * step_cos_[i] - sin_[i] * step_sin_[i];
      sin_[i] = sin_[i] * step_cos_[i] + cos_[i] * step_sin_[i];
      cos_[i] = c;
    }
  }
  double cos(std::size_t i) const { return cos_[i]; }
  double sin(std::size_t i) const { return sin_[i]; }

 private:
  std::vector<double> freq_, step_cos_, step_sin_, cos_, sin_;
};

// ---- structure --------------------------------------------------------------------------

/// Random unit vector whose energy sits on the rotary pairs [first_pair, d/2): content
/// that must survive RoPE across a passage lives in slowly turning pairs.
inline void random_direction(rng& r, std::size_t head_dim, std::size_t first_pair,
                             std::span<double> out) {
  const std::size_t half_dim = head_dim / 2;
  double norm2 = 0.0;
  for (std::size_t i = 0; i < half_dim; ++i) {
    const bool on = i >= first_pair;
    const double x = r.normal(), y = r.normal();
    out[i] = on ? x : 0.0;
    out[i + half_dim] = on ? y : 0.0;
    norm2 += on ? x * x + y * y : 0.0;
  }
  const double inv = norm2 > 0.0 ? 1.0 / std::sqrt(norm2) : 0.0;
  for (std::size_t ch = 0; ch < head_dim; ++ch) out[ch] *= inv;
}

inline bool is_outlier_pair(const head_structure& hs, std::size_t pair) {
  return std::find(hs.outlier_pairs.begin(), hs.outlier_pairs.end(), pair) !=
         hs.outlier_pairs.end();
}

inline head_structure make_head_structure(const cache_config& cfg, const regime_params& p,
                                          std::size_t n_sinks, std::size_t head) {
  const std::size_t d = cfg.head_dim, half_dim = d / 2;
  const std::size_t low_freq = half_dim / 2;  // topics use pairs turning < 0.01 rad/token
  rng r(stream_id(cfg.seed, kHeadStructure, head));
  head_structure hs;

  // Outlier pairs among the slowest quarter (massive values in real models sit in
  // low-frequency dims, so an outlier channel keeps its sign over long stretches).
  std::vector<std::size_t> slow(half_dim - 3 * half_dim / 4);
  std::iota(slow.begin(), slow.end(), 3 * half_dim / 4);
  const std::size_t n_out = std::min(p.outlier_pairs, slow.size());
  for (std::size_t k = 0; k < n_out; ++k) {
    const std::size_t j = k + r.below(slow.size() - k);
    std::swap(slow[k], slow[j]);
    hs.outlier_pairs.push_back(slow[k]);
    const double angle = 2.0 * std::numbers::pi * r.uniform();
    hs.outlier_means.push_back(std::cos(angle));
    hs.outlier_means.push_back(std::sin(angle));
  }

  // Channel scales: log-normal per pair, mean square 1 over the ordinary pairs.
  hs.noise_scale.assign(d, 0.0);
  double ms = 0.0;
  for (std::size_t i = 0; i < half_dim; ++i) {
    const double s = std::exp(0.3 * r.normal());
    hs.noise_scale[i] = hs.noise_scale[i + half_dim] = s;
    if (!is_outlier_pair(hs, i)) ms += s * s;
  }
  const std::size_t ordinary = half_dim - n_out;
  const double fix = ordinary > 0 ? 1.0 / std::sqrt(ms / static_cast<double>(ordinary)) : 1.0;
  for (double& s : hs.noise_scale) s *= fix;

  // Key mean: energy spread over all pairs (so its rotation gives a recency kernel at
  // every distance scale), random phases, none in outlier pairs.
  hs.key_mean.assign(d, 0.0);
  double norm2 = 0.0;
  for (std::size_t i = 0; i < half_dim; ++i) {
    if (is_outlier_pair(hs, i)) continue;
    const double a = std::exp(0.3 * r.normal());
    const double phase = 2.0 * std::numbers::pi * r.uniform();
    hs.key_mean[i] = a * std::cos(phase);
    hs.key_mean[i + half_dim] = a * std::sin(phase);
    norm2 += a * a;
  }
  const double target = p.key_mean * std::sqrt(static_cast<double>(d));
  if (norm2 > 0.0) {
    for (double& m : hs.key_mean) m *= target / std::sqrt(norm2);
  }

  hs.topic_dirs.resize(kTopics * d);
  for (std::size_t k = 0; k < kTopics; ++k) {
    random_direction(r, d, low_freq, std::span(hs.topic_dirs).subspan(k * d, d));
  }
  hs.sink_dir.resize(n_sinks > 0 ? d : 0);
  if (n_sinks > 0) random_direction(r, d, 0, hs.sink_dir);
  hs.needle_dirs.resize(kNeedles * d);
  for (std::size_t k = 0; k < kNeedles; ++k) {
    random_direction(r, d, 0, std::span(hs.needle_dirs).subspan(k * d, d));
  }
  // Content directions never use outlier pairs (those carry their own signal) and are
  // orthogonal to the key mean, so how well a query finds its target does not depend
  // on a chance overlap between the target and the mean.
  auto clean = [&](std::vector<double>& dirs) {
    for (std::size_t base = 0; base < dirs.size(); base += d) {
      const std::span<double> v(dirs.data() + base, d);
      for (std::size_t i : hs.outlier_pairs) v[i] = v[i + half_dim] = 0.0;
      const double mm =
          std::inner_product(hs.key_mean.begin(), hs.key_mean.end(), hs.key_mean.begin(), 0.0);
      const double vm = std::inner_product(v.begin(), v.end(), hs.key_mean.begin(), 0.0);
      if (mm > 0.0) {
        for (std::size_t ch = 0; ch < d; ++ch) v[ch] -= vm / mm * hs.key_mean[ch];
      }
      const double vv = std::inner_product(v.begin(), v.end(), v.begin(), 0.0);
      const double inv = vv > 0.0 ? 1.0 / std::sqrt(vv) : 0.0;
      for (double& x : v) x *= inv;
    }
  };
  clean(hs.topic_dirs);
  clean(hs.sink_dir);
  clean(hs.needle_dirs);

  hs.value_offset.resize(d);
  for (double& v : hs.value_offset) v = 0.7 * r.normal();
  return hs;
}

/// Text-level structure shared by all heads: sinks, passages with Zipf-popular topics,
/// heavy hitters, needles, tokens whose value norm is huge.
inline void make_text_structure(kv_cache& c, const regime_params& p) {
  const std::size_t n = c.config.n_tokens;
  rng r(stream_id(c.config.seed, kStructure));
  c.n_sinks = p.sink_amp > 0.0 ? std::min(kSinks, n) : 0;

  // Passages: log-normal lengths around 128 tokens, topic drawn with weight 1/(k+1).
  std::array<double, kTopics> cdf{};
  double total = 0.0;
  for (std::size_t k = 0; k < kTopics; ++k) cdf[k] = total += 1.0 / static_cast<double>(k + 1);
  for (std::size_t t = c.n_sinks; t < n;) {
    const double len = std::clamp(128.0 * std::exp(0.6 * r.normal()), 16.0, 1024.0);
    const std::size_t end = std::min(n, t + static_cast<std::size_t>(len));
    const double u = r.uniform() * total;
    const auto topic =
        static_cast<std::size_t>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
    c.passages.push_back({t, end, std::min(topic, kTopics - 1)});
    t = end;
  }

  c.heavy_hitter.assign(n, 0);
  c.large_value.assign(n, 0);
  for (std::size_t t = c.n_sinks; t < n; ++t) {
    c.heavy_hitter[t] = p.topic_amp > 0.0 && r.uniform() < p.heavy_fraction ? 1 : 0;
    c.large_value[t] = r.uniform() < kLargeValueShare ? 1 : 0;
  }
  // Needles at distinct positions (while there is room), never heavy hitters.
  if (p.needle_amp > 0.0 && n > c.n_sinks) {
    const std::size_t count = std::min(kNeedles, n - c.n_sinks);
    while (c.needle_tokens.size() < count) {
      const std::size_t t = c.n_sinks + r.below(n - c.n_sinks);
      if (std::find(c.needle_tokens.begin(), c.needle_tokens.end(), t) != c.needle_tokens.end()) {
        continue;
      }
      c.needle_tokens.push_back(t);
      c.heavy_hitter[t] = 0;
    }
  }
}

/// Pre-RoPE key and value of one token of one head. `pre` and `val` hold head_dim doubles.
inline void make_token(const kv_cache& c, const regime_params& p, const head_structure& hs,
                       const normal_table& normal, std::size_t head, std::size_t t,
                       std::size_t passage_index, std::span<double> pre, std::span<double> val) {
  const std::size_t d = c.config.head_dim, half_dim = d / 2;
  const double sqrt_d = std::sqrt(static_cast<double>(d));
  const bool sink = t < c.n_sinks;

  rng kr(stream_id(c.config.seed, kKeyNoise, head, t));
  const double noise_gain = sink ? 0.3 : 1.0;  // sinks are nearly constant keys
  for (std::size_t i = 0; i < half_dim; ++i) {
    double a, b;
    kr.normal2(normal, a, b);
    pre[i] = hs.key_mean[i] + noise_gain * hs.noise_scale[i] * a;
    pre[i + half_dim] = hs.key_mean[i + half_dim] + noise_gain * hs.noise_scale[i + half_dim] * b;
  }
  for (std::size_t k = 0; k < hs.outlier_pairs.size(); ++k) {
    // Large mean plus large per-token spread: a wide per-block range for quantizers.
    const std::size_t i = hs.outlier_pairs[k];
    double a, b;
    kr.normal2(normal, a, b);
    pre[i] = p.outlier_amp * (hs.outlier_means[2 * k] + kOutlierSpread * a);
    pre[i + half_dim] = p.outlier_amp * (hs.outlier_means[2 * k + 1] + kOutlierSpread * b);
  }

  rng sr(stream_id(c.config.seed, kTokenScalars, head, t));
  const auto needle = std::find(c.needle_tokens.begin(), c.needle_tokens.end(), t);
  if (sink) {
    // Every sink key points the same way once rotated (one query direction finds them
    // all, as in real models), weaker for later sinks.
    rope(c.inv_freq, hs.sink_dir, -static_cast<double>(t), val);  // val: scratch until below
    const double amp = p.sink_amp * sqrt_d * sink_decay(t);
    for (std::size_t ch = 0; ch < d; ++ch) pre[ch] += amp * val[ch];
  } else if (needle != c.needle_tokens.end()) {
    // An inserted fact, unrelated to the passage around it: no topic component.
    const auto k = static_cast<std::size_t>(needle - c.needle_tokens.begin());
    const double* dir = hs.needle_dirs.data() + k * d;
    for (std::size_t ch = 0; ch < d; ++ch) pre[ch] += p.needle_amp * sqrt_d * dir[ch];
  } else if (p.topic_amp > 0.0) {
    const passage& ps = c.passages[passage_index];
    const double gain = (0.5 + sr.uniform()) * (c.heavy_hitter[t] ? p.heavy_gain : 1.0);
    const double* dir = hs.topic_dirs.data() + ps.topic * d;
    for (std::size_t ch = 0; ch < d; ++ch) pre[ch] += p.topic_amp * gain * sqrt_d * dir[ch];
  }

  // Values: common offset + log-normal norm; a few huge ones; sinks nearly zero
  // (a sink is where attention parks, its value contributes little).
  rng vr(stream_id(c.config.seed, kValueNoise, head, t));
  const double norm_gain =
      sink ? 0.1 : std::exp(0.5 * sr.normal()) * (c.large_value[t] ? kLargeValueGain : 1.0);
  const double offset_gain = sink ? 0.0 : 1.0;
  for (std::size_t ch = 0; ch < d; ch += 2) {
    double a, b;
    vr.normal2(normal, a, b);
    val[ch] = offset_gain * hs.value_offset[ch] + norm_gain * a;
    val[ch + 1] = offset_gain * hs.value_offset[ch + 1] + norm_gain * b;
  }
}

/// float -> fp16 bits, round to nearest even, the same bits as half(float) (Giesen's
/// method, as in Eigen) but branch-free, so the row loop vectorizes: converting one at a
/// time was a third of the generation time.
inline std::uint16_t half_bits(float f) {
  constexpr std::uint32_t kF16Max = (127u + 16u) << 23;  // 65536: overflows to inf
  constexpr std::uint32_t kSubnormalBelow = 113u << 23;  // 2^-14
  constexpr std::uint32_t kDenormMagic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = u & 0x80000000u;
  u ^= sign;
  const std::uint32_t normal = (u + ((15u - 127u) << 23) + 0xfffu + ((u >> 13) & 1u)) >> 13;
  const std::uint32_t subnormal =
      std::bit_cast<std::uint32_t>(std::bit_cast<float>(u) + std::bit_cast<float>(kDenormMagic)) -
      kDenormMagic;
  const std::uint32_t special = 0x7c00u | (static_cast<std::uint32_t>(u > 0x7f800000u) << 9);
  // Masks instead of ?: so the compiler keeps the loop branch-free.
  const std::uint32_t is_sub = 0u - static_cast<std::uint32_t>(u < kSubnormalBelow);
  const std::uint32_t is_big = 0u - static_cast<std::uint32_t>(u >= kF16Max);
  const std::uint32_t finite = (subnormal & is_sub) | (normal & ~is_sub);
  const std::uint32_t bits = (special & is_big) | (finite & ~is_big);
  return static_cast<std::uint16_t>(bits | (sign >> 16));
}

/// Converts one row to fp16 bits in `scratch`, then copies them to `dst`.
inline void store_half(std::span<const float> src, std::span<std::uint16_t> scratch, half* dst) {
  static_assert(sizeof(half) == sizeof(std::uint16_t));
  const std::size_t m = src.size();
  for (std::size_t i = 0; i < m; ++i) scratch[i] = half_bits(src[i]);
  std::memcpy(static_cast<void*>(dst), scratch.data(), m * sizeof(std::uint16_t));
}

inline std::size_t passage_of(const kv_cache& c, std::size_t t) {
  const auto it =
      std::upper_bound(c.passages.begin(), c.passages.end(), t,
                       [](std::size_t pos, const passage& ps) { return pos < ps.begin; });
  return static_cast<std::size_t>(it - c.passages.begin()) - 1;
}

}  // namespace detail

/// Generates the cache. Throws certattn::error on an empty or odd shape.
inline kv_cache make_cache(const cache_config& cfg) {
  if (cfg.n_tokens == 0) throw error("certattn::synthetic::make_cache: n_tokens must be > 0");
  if (cfg.head_dim == 0 || cfg.head_dim % 2 != 0) {
    throw error("certattn::synthetic::make_cache: head_dim must be even and > 0 (got " +
                std::to_string(cfg.head_dim) + ")");
  }
  if (cfg.kv_heads == 0) throw error("certattn::synthetic::make_cache: kv_heads must be > 0");
  const std::size_t max_elems = std::numeric_limits<std::size_t>::max() / 4;
  if (cfg.n_tokens > max_elems / cfg.head_dim / cfg.kv_heads) {
    throw error("certattn::synthetic::make_cache: n_tokens * head_dim * kv_heads overflows");
  }

  const detail::regime_params p = detail::params_for(cfg.kind);
  const std::size_t n = cfg.n_tokens, d = cfg.head_dim, half_dim = d / 2;
  kv_cache c;
  c.config = cfg;
  c.inv_freq.resize(half_dim);
  for (std::size_t i = 0; i < half_dim; ++i) {
    c.inv_freq[i] =
        std::pow(detail::kRopeBase, -static_cast<double>(2 * i) / static_cast<double>(d));
  }
  detail::make_text_structure(c, p);
  for (std::size_t h = 0; h < cfg.kv_heads; ++h) {
    c.heads.push_back(detail::make_head_structure(cfg, p, c.n_sinks, h));
  }

  c.keys.resize(cfg.kv_heads * n * d);
  c.values.resize(cfg.kv_heads * n * d);
  const detail::normal_table& normal = detail::normal_table::get();
  detail::rope_table rot(c.inv_freq);
  std::vector<double> pre(d), val(d);
  std::vector<float> row(d);
  std::vector<std::uint16_t> bits(d);
  std::size_t passage_idx = 0;  // passage of token t (passages are sorted)
  // Token-major loop so each rotation is computed once for all heads.
  for (std::size_t t = 0; t < n; ++t) {
    rot.advance_to(t);
    while (passage_idx + 1 < c.passages.size() && c.passages[passage_idx + 1].begin <= t) {
      ++passage_idx;
    }
    for (std::size_t h = 0; h < cfg.kv_heads; ++h) {
      detail::make_token(c, p, c.heads[h], normal, h, t, passage_idx, pre, val);
      for (std::size_t i = 0; i < half_dim; ++i) {
        const double x = pre[i], y = pre[i + half_dim];
        row[i] = static_cast<float>(x * rot.cos(i) - y * rot.sin(i));
        row[i + half_dim] = static_cast<float>(x * rot.sin(i) + y * rot.cos(i));
      }
      detail::store_half(row, bits, c.keys.data() + (h * n + t) * d);
      for (std::size_t ch = 0; ch < d; ++ch) row[ch] = static_cast<float>(val[ch]);
      detail::store_half(row, bits, c.values.data() + (h * n + t) * d);
    }
  }
  return c;
}

/// G queries of one GQA group at one decoding step, at position n_tokens, row-major
/// [group][head_dim]. The group shares an intent (which passage, needle, sink to look
/// at, drawn from (seed, kv_head, step)); each member scales it differently and adds its
/// own noise, as different query projections over the same keys would.
inline void make_queries(const kv_cache& c, std::size_t kv_head, std::size_t group,
                         std::uint64_t step, std::span<float> out) {
  const std::size_t n = c.config.n_tokens, d = c.config.head_dim, half_dim = d / 2;
  if (kv_head >= c.config.kv_heads) {
    throw error("certattn::synthetic::make_queries: kv_head " + std::to_string(kv_head) +
                " out of range (kv_heads = " + std::to_string(c.config.kv_heads) + ")");
  }
  if (group == 0) throw error("certattn::synthetic::make_queries: group must be > 0");
  if (out.size() != group * d) {
    throw error("certattn::synthetic::make_queries: out has " + std::to_string(out.size()) +
                " floats, expected group * head_dim = " + std::to_string(group * d));
  }
  if (c.heads.size() != c.config.kv_heads || c.keys.size() != c.config.kv_heads * n * d) {
    throw error("certattn::synthetic::make_queries: cache was not made by make_cache");
  }

  const detail::regime_params p = detail::params_for(c.config.kind);
  const head_structure& hs = c.heads[kv_head];
  const double sqrt_d = std::sqrt(static_cast<double>(d));
  const double pos = static_cast<double>(n);

  // Shared intent.
  const std::uint64_t intent_id = detail::stream_id(c.config.seed, detail::kQuery, kv_head, step);
  detail::rng r(intent_id);
  // Strengths jitter additively in nats: a multiplicative jitter would make the big
  // ones (a 28-nat needle) swing by many nats and blur the regimes.
  auto jitter = [](detail::rng& g, double strength, double nats) {
    return strength > 0.0 ? std::max(0.0, strength + nats * g.normal()) : 0.0;
  };
  constexpr double kMemberNats = 0.5;  // how far a group member departs from the intent
  const double s_recency = jitter(r, p.recency, p.spread);
  const double s_sink = r.uniform() < p.sink_prob ? jitter(r, p.sink, p.spread) : 0.0;
  const double s_topic = jitter(r, p.topic, p.spread);
  const bool use_needle = !c.needle_tokens.empty() && r.uniform() < p.needle_prob;
  const double s_needle = use_needle ? jitter(r, p.needle, p.spread) : 0.0;
  const std::size_t needle = c.needle_tokens.empty() ? 0 : r.below(c.needle_tokens.size());
  const double s_outlier = jitter(r, p.outlier, p.spread / 4.0);
  std::vector<std::size_t> targets;  // passages; a uniform token picks each
  for (std::size_t k = 0; k < p.passages_per_query && !c.passages.empty(); ++k) {
    targets.push_back(detail::passage_of(c, c.n_sinks + r.below(n - c.n_sinks)));
  }
  std::vector<double> shared_noise(d);
  for (double& z : shared_noise) z = r.normal();

  std::vector<double> pre(d), rot(d), q(d);
  for (std::size_t g = 0; g < group; ++g) {
    detail::rng m(detail::stream_id(intent_id, detail::kQueryMember, g));
    std::fill(q.begin(), q.end(), 0.0);
    auto add_target = [&](std::span<const double> dir, double position, double gain) {
      detail::rope(c.inv_freq, dir, position, rot);
      for (std::size_t ch = 0; ch < d; ++ch) q[ch] += gain * rot[ch];
    };
    // Pre-RoPE part, rotated to the query position: recency (aligned with the key mean,
    // so q.k carries sum_i e_i cos(inv_freq_i * distance)), outlier pairs, noise.
    const double mean_norm = std::sqrt(
        std::inner_product(hs.key_mean.begin(), hs.key_mean.end(), hs.key_mean.begin(), 0.0));
    const double rec = mean_norm > 0.0
                           ? jitter(m, s_recency, kMemberNats) * sqrt_d / (mean_norm * mean_norm)
                           : 0.0;
    for (std::size_t ch = 0; ch < d; ++ch) {
      const double z = std::sqrt(0.5) * shared_noise[ch] + std::sqrt(0.5) * m.normal();
      pre[ch] = rec * hs.key_mean[ch] + p.noise * z;
    }
    for (std::size_t k = 0; k < hs.outlier_pairs.size(); ++k) {
      // Query weight on the outlier pair chosen so the pair's per-token spread adds
      // s_outlier to the score std; aligned with the pair's mean.
      const std::size_t i = hs.outlier_pairs[k];
      const double b = jitter(m, s_outlier, kMemberNats / 4.0) * sqrt_d /
                       (detail::kOutlierSpread * p.outlier_amp);
      pre[i] = b * hs.outlier_means[2 * k];
      pre[i + half_dim] = b * hs.outlier_means[2 * k + 1];
    }
    add_target(pre, pos, 1.0);

    // Post-RoPE targets: a query "looking for" content c at position t must equal
    // RoPE_t(c) after its own rotation; gain chosen so the score is the strength.
    if (s_sink > 0.0 && c.n_sinks > 0) {
      const double gain = jitter(m, s_sink, kMemberNats) / p.sink_amp;
      for (std::size_t ch = 0; ch < d; ++ch) q[ch] += gain * hs.sink_dir[ch];  // post-RoPE
    }
    if (s_topic > 0.0 && p.topic_amp > 0.0) {
      for (std::size_t target : targets) {
        // A member sometimes reads a different passage than the rest of its group.
        std::size_t pidx = target;
        if (m.uniform() < 0.25) pidx = detail::passage_of(c, c.n_sinks + m.below(n - c.n_sinks));
        const passage& ps = c.passages[pidx];
        const double mid = 0.5 * static_cast<double>(ps.begin + ps.end - 1);
        const double gain = jitter(m, s_topic, kMemberNats) / p.topic_amp;
        add_target(std::span(hs.topic_dirs).subspan(ps.topic * d, d), mid, gain);
      }
    }
    if (s_needle > 0.0) {
      const double gain = jitter(m, s_needle, kMemberNats) / p.needle_amp;
      add_target(std::span(hs.needle_dirs).subspan(needle * d, d),
                 static_cast<double>(c.needle_tokens[needle]), gain);
    }
    for (std::size_t ch = 0; ch < d; ++ch) out[g * d + ch] = static_cast<float>(q[ch]);
  }
}

inline std::vector<float> make_queries(const kv_cache& c, std::size_t kv_head, std::size_t group,
                                       std::uint64_t step) {
  std::vector<float> out(group * c.config.head_dim);
  make_queries(c, kv_head, group, step, out);
  return out;
}

// ---- measuring what a cache does to attention -----------------------------------------

/// Exact attention statistics of one query (scale 1/sqrt(head_dim)).
struct attention_profile {
  double effective_keys = 0.0;  // exp(entropy of the attention weights)
  double top1_weight = 0.0;
  double top64_mass = 0.0;   // mass of the 64 largest weights
  double score_range = 0.0;  // max score - median score (nats)
  double sink_mass = 0.0;    // mass of the first 4 tokens
  double recent_mass = 0.0;  // mass of the last 64 tokens
  std::size_t argmax = 0;    // token with the largest score
};

namespace detail {
/// Upper median, reordering `v`.
inline double median_inplace(std::vector<double>& v) {
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}
}  // namespace detail

/// Profiles each query of `queries` ([m][head_dim] row-major) against one KV head, in
/// double precision. O(m n d): for tests, benches and the tables in docs/synthetic.md.
inline std::vector<attention_profile> profile_attention(const kv_cache& c, std::size_t kv_head,
                                                        std::span<const float> queries) {
  const std::size_t n = c.config.n_tokens, d = c.config.head_dim;
  if (kv_head >= c.config.kv_heads) {
    throw error("certattn::synthetic::profile_attention: kv_head out of range");
  }
  if (queries.size() % d != 0) {
    throw error(
        "certattn::synthetic::profile_attention: queries.size() is not a multiple of "
        "head_dim");
  }
  std::vector<float> keys(n * d);  // converted once, shared by all queries
  for (std::size_t t = 0; t < n; ++t) {
    const half* k = c.key_row(kv_head, t);
    for (std::size_t ch = 0; ch < d; ++ch) keys[t * d + ch] = static_cast<float>(k[ch]);
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const std::size_t top = std::min<std::size_t>(64, n), edge = std::min<std::size_t>(4, n);
  std::vector<attention_profile> out(queries.size() / d);
  std::vector<double> w(n), scratch(n);
  for (std::size_t j = 0; j < out.size(); ++j) {
    const float* q = queries.data() + j * d;
    for (std::size_t t = 0; t < n; ++t) {
      double acc = 0.0;
      for (std::size_t ch = 0; ch < d; ++ch) acc += static_cast<double>(q[ch]) * keys[t * d + ch];
      w[t] = acc * scale;
    }
    attention_profile& pr = out[j];
    pr.argmax = static_cast<std::size_t>(std::max_element(w.begin(), w.end()) - w.begin());
    const double mx = w[pr.argmax];
    scratch = w;
    pr.score_range = mx - detail::median_inplace(scratch);
    double z = 0.0, z_shift = 0.0;  // sum w, sum w (s - max)
    for (double& x : w) {
      const double e = std::exp(x - mx);
      z_shift += e * (x - mx);
      x = e;
      z += e;
    }
    pr.effective_keys = std::exp(std::log(z) - z_shift / z);  // H = ln Z - E[s - max]
    pr.top1_weight = 1.0 / z;
    pr.sink_mass =
        std::accumulate(w.begin(), w.begin() + static_cast<std::ptrdiff_t>(edge), 0.0) / z;
    pr.recent_mass = std::accumulate(w.end() - static_cast<std::ptrdiff_t>(top), w.end(), 0.0) / z;
    const auto top_end = w.begin() + static_cast<std::ptrdiff_t>(top);
    std::partial_sort(w.begin(), top_end, w.end(), std::greater<>());
    pr.top64_mass = std::accumulate(w.begin(), top_end, 0.0) / z;
  }
  return out;
}

/// Max over channels of the mean |key| divided by its median over channels: the
/// outlier-channel ratio KIVI reports (about 1.5 for keys without outlier channels).
inline double channel_magnitude_ratio(const kv_cache& c, std::size_t kv_head) {
  const std::size_t n = c.config.n_tokens, d = c.config.head_dim;
  if (kv_head >= c.config.kv_heads) {
    throw error("certattn::synthetic::channel_magnitude_ratio: kv_head out of range");
  }
  std::vector<double> mag(d, 0.0);
  for (std::size_t t = 0; t < n; ++t) {
    const half* k = c.key_row(kv_head, t);
    for (std::size_t ch = 0; ch < d; ++ch) mag[ch] += std::abs(static_cast<double>(k[ch]));
  }
  const double mx = *std::max_element(mag.begin(), mag.end());
  const double med = detail::median_inplace(mag);
  return med > 0.0 ? mx / med : std::numeric_limits<double>::infinity();
}

}  // namespace certattn::synthetic
