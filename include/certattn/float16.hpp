// The cache's 16-bit element types: certattn::half (IEEE binary16) and certattn::bfloat16.
// Each holds its 16 bits and converts to and from float: exactly to float, and from float
// with round-to-nearest-even (NaN becomes a quiet NaN). The bits and the rounding are those
// of Eigen::half and Eigen::bfloat16, to which they convert implicitly where both are
// present, so an engine's Eigen-typed cache is read in place (reinterpret its pointer).
#pragma once

#include <bit>
#include <concepts>
#include <cstdint>
#include <type_traits>

namespace certattn {

namespace detail {

/// binary16 bits -> float, exact: exponent and mantissa shifted into place, then scaled by
/// 2^(127 - 15), which also renormalises subnormals; Inf/NaN get the float's all-ones
/// exponent (the NaN payload is kept). Branch-free, so loops over rows vectorise.
constexpr float half_bits_to_float(std::uint16_t h) noexcept {
  const std::uint32_t magnitude = std::uint32_t(h & 0x7fffu) << 13;
  std::uint32_t u = std::bit_cast<std::uint32_t>(std::bit_cast<float>(magnitude) * 0x1p112f);
  u |= (h & 0x7c00u) == 0x7c00u ? 0x7f800000u : 0u;
  u |= std::uint32_t(h & 0x8000u) << 16;
  return std::bit_cast<float>(u);
}

/// float -> binary16 bits, round to nearest even; beyond the largest half (65504, rounded)
/// to +-Inf; NaN to the quiet NaN 0x7e00 (with the sign). Giesen's method, as in Eigen,
/// written with masks so a loop over a row vectorises.
constexpr std::uint16_t float_to_half_bits(float f) noexcept {
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
  const std::uint32_t is_sub = 0u - static_cast<std::uint32_t>(u < kSubnormalBelow);
  const std::uint32_t is_big = 0u - static_cast<std::uint32_t>(u >= kF16Max);
  const std::uint32_t finite = (subnormal & is_sub) | (normal & ~is_sub);
  const std::uint32_t bits = (special & is_big) | (finite & ~is_big);
  return static_cast<std::uint16_t>(bits | (sign >> 16));
}

/// bfloat16 bits -> float: the top half of a float, exact.
constexpr float bfloat16_bits_to_float(std::uint16_t b) noexcept {
  return std::bit_cast<float>(std::uint32_t(b) << 16);
}

/// float -> bfloat16 bits, round to nearest even; NaN to the quiet NaN 0x7fc0 (with the sign).
constexpr std::uint16_t float_to_bfloat16_bits(float f) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) & 0x8000u) | 0x7fc0u;
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/// A foreign 16-bit type laid out as binary16 bits in a member `x` (Eigen::half).
template <class T, class Self>
concept foreign_half = !std::same_as<T, Self> && sizeof(T) == 2 && std::is_trivially_copyable_v<T> &&
                       requires(const T& t) {
                         { t.x } -> std::convertible_to<std::uint16_t>;
                       };
/// A foreign 16-bit type laid out as bfloat16 bits in a member `value` (Eigen::bfloat16).
template <class T, class Self>
concept foreign_bfloat16 = !std::same_as<T, Self> && sizeof(T) == 2 && std::is_trivially_copyable_v<T> &&
                           requires(const T& t) {
                             { t.value } -> std::convertible_to<std::uint16_t>;
                           };

}  // namespace detail

/// IEEE 754 binary16.
class half {
 public:
  half() = default;
  constexpr explicit half(float f) noexcept : bits_(detail::float_to_half_bits(f)) {}
  constexpr explicit half(double x) noexcept : half(static_cast<float>(x)) {}
  template <std::integral I>
  constexpr explicit half(I x) noexcept : half(static_cast<float>(x)) {}
  /// From Eigen::half (same bits).
  template <detail::foreign_half<half> T>
  constexpr half(const T& h) noexcept : bits_(std::bit_cast<std::uint16_t>(h)) {}

  static constexpr half from_bits(std::uint16_t b) noexcept {
    half h;
    h.bits_ = b;
    return h;
  }
  constexpr std::uint16_t bits() const noexcept { return bits_; }

  constexpr explicit operator float() const noexcept { return detail::half_bits_to_float(bits_); }
  constexpr explicit operator double() const noexcept { return static_cast<double>(static_cast<float>(*this)); }
  /// To Eigen::half (same bits).
  template <detail::foreign_half<half> T>
  constexpr operator T() const noexcept {
    return std::bit_cast<T>(bits_);
  }

  /// Compared as numbers: -0 == +0, NaN is unequal to everything.
  friend constexpr bool operator==(half a, half b) noexcept { return float(a) == float(b); }
  friend constexpr bool operator<(half a, half b) noexcept { return float(a) < float(b); }

 private:
  std::uint16_t bits_;
};

/// bfloat16: the top 16 bits of an IEEE binary32.
class bfloat16 {
 public:
  bfloat16() = default;
  constexpr explicit bfloat16(float f) noexcept : bits_(detail::float_to_bfloat16_bits(f)) {}
  constexpr explicit bfloat16(double x) noexcept : bfloat16(static_cast<float>(x)) {}
  template <std::integral I>
  constexpr explicit bfloat16(I x) noexcept : bfloat16(static_cast<float>(x)) {}
  /// From Eigen::bfloat16 (same bits).
  template <detail::foreign_bfloat16<bfloat16> T>
  constexpr bfloat16(const T& b) noexcept : bits_(std::bit_cast<std::uint16_t>(b)) {}

  static constexpr bfloat16 from_bits(std::uint16_t b) noexcept {
    bfloat16 x;
    x.bits_ = b;
    return x;
  }
  constexpr std::uint16_t bits() const noexcept { return bits_; }

  constexpr explicit operator float() const noexcept { return detail::bfloat16_bits_to_float(bits_); }
  constexpr explicit operator double() const noexcept { return static_cast<double>(static_cast<float>(*this)); }
  /// To Eigen::bfloat16 (same bits).
  template <detail::foreign_bfloat16<bfloat16> T>
  constexpr operator T() const noexcept {
    return std::bit_cast<T>(bits_);
  }

  friend constexpr bool operator==(bfloat16 a, bfloat16 b) noexcept { return float(a) == float(b); }
  friend constexpr bool operator<(bfloat16 a, bfloat16 b) noexcept { return float(a) < float(b); }

 private:
  std::uint16_t bits_;
};

static_assert(sizeof(half) == 2 && std::is_trivially_copyable_v<half> && std::is_standard_layout_v<half>);
static_assert(sizeof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16> &&
              std::is_standard_layout_v<bfloat16>);

}  // namespace certattn
