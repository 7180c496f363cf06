// Perturbations E_i ~ Exp(1), one per pool key, from a counter-based hash of
// (seed, step, layer, kv_head, token): reproducible from the seed, independent across
// keys, fresh at every decoding step, and computable for any token in any order.
#pragma once

#include <certattn/common.hpp>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

namespace certattn {

/// Which perturbations a call uses. The seed lives in options; the step must advance at
/// every decoding step (fresh perturbations are what make each step's guarantee hold).
struct noise_key {
  std::uint64_t step = 0;
  std::uint32_t layer = 0;
  std::uint32_t kv_head = 0;
  // The request or sequence the call belongs to, so that concurrent sequences of one
  // engine (one options.seed) draw independent perturbations; 0 leaves the stream of
  // (seed, step, layer, kv_head) as it is without one.
  std::uint64_t sequence = 0;
  // The query's place among the positions of one attend_positions() call (speculative
  // verification: the draft tokens), so that no two positions share perturbations; 0 for
  // the first position and for attend_group(), whose stream it leaves as it is.
  std::uint32_t position = 0;

  constexpr noise_key() noexcept = default;
  /// From any integer types (an engine's size_t or int indices): a negative value, or a
  /// layer or KV head above 2^32 - 1, throws certattn::error naming the field.
  template <std::integral Step, std::integral Layer, std::integral Head>
  constexpr noise_key(Step s, Layer l, Head h)
      : step(checked<std::uint64_t>(s, "step")),
        layer(checked<std::uint32_t>(l, "layer")),
        kv_head(checked<std::uint32_t>(h, "kv_head")) {}
  template <std::integral Step, std::integral Layer, std::integral Head, std::integral Seq>
  constexpr noise_key(Step s, Layer l, Head h, Seq q) : noise_key(s, l, h) {
    sequence = checked<std::uint64_t>(q, "sequence");
  }

 private:
  template <class To, class From>
  static constexpr To checked(From v, const char* field) {
    if (!std::in_range<To>(v))
      throw error(std::string("noise_key.") + field + " = " + std::to_string(v) +
                  " is out of range (0 .. " + std::to_string(std::numeric_limits<To>::max()) + ")");
    return To(v);
  }
};

namespace detail {
/// splitmix64's finaliser (Stafford's Mix13): a bijection on 64 bits with full avalanche.
/// With a per-call key added to a Weyl sequence of the token index it is SplitMix64,
/// which passes BigCrush.
inline constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}
inline constexpr std::uint64_t kGolden = 0x9e3779b97f4a7c15ULL;
}  // namespace detail

/// The perturbations of one call (one layer, KV head and step), shared by the query heads
/// of the GQA group (each head's guarantee is marginal, so sharing them is fine).
class perturbation {
 public:
  constexpr perturbation(std::uint64_t seed, const noise_key& k) noexcept
      : key_(derive(seed, k)) {}

  /// 64 random bits for a token.
  constexpr std::uint64_t bits(std::uint64_t token) const noexcept {
    return detail::mix64(key_ + (token + 1) * detail::kGolden);
  }
  /// U in (0, 1] with 53 random bits: (top 53 bits + 1) * 2^-53. Never 0, so E is finite.
  static constexpr double uniform_from_bits(std::uint64_t b) noexcept {
    return double((b >> 11) + 1) * 0x1p-53;
  }
  double uniform(std::uint64_t token) const noexcept { return uniform_from_bits(bits(token)); }
  /// E = -ln U ~ Exp(1), in [0, 36.8]. Every path (reference and fast) calls this same
  /// function, so the sample sets agree bit for bit.
  double exp1(std::uint64_t token) const noexcept { return exp1_from_bits(bits(token)); }
  static double exp1_from_bits(std::uint64_t b) noexcept { return -std::log(uniform_from_bits(b)); }

  constexpr std::uint64_t key() const noexcept { return key_; }

  /// A cheap float upper bound on E for candidate generation (never below exp1()): from the
  /// top 24 bits t, U >= t 2^-24, so E <= ln2 (24 - log2 t); log2 t is approximated from
  /// the float exponent and a quadratic in the mantissa, |error| <= 0.0077 (checked over
  /// all 2^24 values by a test), and 0.01 ln2 covers it plus float rounding. Every kernel
  /// (scalar, AVX-512) evaluates the same float operations, so the bounds are identical.
  static float exp1_upper_from_bits(std::uint64_t b) noexcept {
    const std::uint32_t t = std::uint32_t(b >> 40);
    // t = 0 (probability 2^-24): U >= 2^-53, so E <= 53 ln2 = 36.737. A finite bound, not
    // +inf: the candidate filters compare y < upper, which +inf would fail.
    if (t == 0) return kMaxExp1;
    const float x = float(t);  // exact: t < 2^24
    std::uint32_t xb;
    std::memcpy(&xb, &x, 4);
    const float e = float(int(xb >> 23) - 127);
    const std::uint32_t mb = (xb & 0x7fffffu) | 0x3f800000u;
    float m;
    std::memcpy(&m, &mb, 4);
    const float f = m - 1.0f;
    const float log2_t = e + std::fma(kLogQuad * f, 1.0f - f, f);
    return (kLog2Offset - log2_t) * kLn2f;
  }
  float exp1_upper(std::uint64_t token) const noexcept {
    return exp1_upper_from_bits(bits(token));
  }
  /// A float lower bound on E (never above exp1()), so that [lower, upper] brackets E
  /// within kBracket and a caller can often decide a comparison without the logarithm.
  /// With t the top 24 bits, E >= ln2 (24 - log2(t + 1)); the upper bound exceeds
  /// ln2 (24 - log2 t) by at most (0.01 + 0.0077) ln2 = 0.0123, and ln(1 + 1/t) <= 0.00025
  /// for t >= 2^12, so upper - 0.02 is below E with room for the float rounding (checked
  /// over all 2^24 values of t at the smallest E by a test). For t < 2^12 (probability
  /// 2^-12) it returns 0: valid, and too wide to decide anything.
  static float exp1_lower_from_bits(std::uint64_t b) noexcept {
    return exp1_lower_from_bits(b, exp1_upper_from_bits(b));
  }
  /// The same, given upper = exp1_upper_from_bits(b) (the hot path has it already).
  static float exp1_lower_from_bits(std::uint64_t b, float upper) noexcept {
    if ((b >> 40) < (std::uint64_t(1) << 12)) return 0.0f;
    return std::max(0.0f, upper - kBracket);
  }
  static constexpr float kBracket = 0.02f;
  static constexpr float kMaxExp1 = 36.75f;
  static constexpr float kLogQuad = 0.3466f;
  static constexpr float kLog2Offset = 24.01f;
  static constexpr float kLn2f = 0.693147182f;  // rounded up

 private:
  static constexpr std::uint64_t derive(std::uint64_t seed, const noise_key& k) noexcept {
    // Each field passes through the bijective mixer with its own offset, so distinct
    // (seed, step, layer, head, sequence) tuples give unrelated streams.
    std::uint64_t h = detail::mix64(seed + 0x243f6a8885a308d3ULL);
    h = detail::mix64(h ^ (k.step + 0x13198a2e03707344ULL));
    h = detail::mix64(h ^ (std::uint64_t(k.layer) + 0xa4093822299f31d0ULL));
    h = detail::mix64(h ^ (std::uint64_t(k.kv_head) + 0x082efa98ec4e6c89ULL));
    if (k.sequence != 0) h = detail::mix64(h ^ (k.sequence + 0x452821e638d01377ULL));
    if (k.position != 0) h = detail::mix64(h ^ (std::uint64_t(k.position) + 0xbe5466cf34e90c6cULL));
    return h;
  }
  std::uint64_t key_;
};

}  // namespace certattn
