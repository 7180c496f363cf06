// certattn::half and certattn::bfloat16 against their definitions and against Eigen's
// types, whose bits they promise to share: every binary16 / bfloat16 bit pattern to float,
// float to 16 bits on the boundary cases and on 2^25 float bit patterns spread over the
// whole range, NaN handling, and the implicit conversions with Eigen::half / bfloat16.
#include <certattn/float16.hpp>

#include <Eigen/Core>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

using certattn::bfloat16;
using certattn::half;

std::uint32_t float_bits(float f) { return std::bit_cast<std::uint32_t>(f); }

// Compile-time: conversions are constexpr and exact on simple values.
static_assert(float(half(1.5f)) == 1.5f);
static_assert(half(65504.0f).bits() == 0x7bffu);
static_assert(half(65520.0f).bits() == 0x7c00u);  // rounds to +Inf
static_assert(float(bfloat16(-2.0f)) == -2.0f);
static_assert(bfloat16(1.0f).bits() == 0x3f80u);

TEST(Float16, EveryHalfBitPatternToFloatMatchesEigen) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const half h = half::from_bits(std::uint16_t(b));
    const Eigen::half e = Eigen::numext::bit_cast<Eigen::half>(std::uint16_t(b));
    ASSERT_EQ(float_bits(float(h)), float_bits(float(e))) << std::hex << b;
  }
}

TEST(Float16, EveryBfloat16BitPatternToFloatMatchesEigen) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const bfloat16 h = bfloat16::from_bits(std::uint16_t(b));
    const Eigen::bfloat16 e = Eigen::numext::bit_cast<Eigen::bfloat16>(std::uint16_t(b));
    ASSERT_EQ(float_bits(float(h)), float_bits(float(e))) << std::hex << b;
  }
}

// Rounding: every float bit pattern with stride 127 (2^25 values over all exponents and
// both signs), plus the boundaries. NaN is left out: Eigen's F16C path (with -mf16c) keeps
// the payload, its software path does not; ours always gives the quiet NaN.
TEST(Float16, FloatToSixteenBitsMatchesEigen) {
  std::vector<float> probe = {0.0f,     -0.0f,    1.0f,     65504.0f, 65519.0f,  65520.0f, 1e9f,
                              5.96e-8f, 2.98e-8f, 2.99e-8f, 6.1e-5f,  6.09e-5f,  -3.14159f,
                              std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
                              std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  for (float f : probe) {
    EXPECT_EQ(half(f).bits(), Eigen::numext::bit_cast<std::uint16_t>(Eigen::half(f))) << f;
    EXPECT_EQ(bfloat16(f).bits(), Eigen::numext::bit_cast<std::uint16_t>(Eigen::bfloat16(f))) << f;
  }
  std::size_t checked = 0;
  for (std::uint64_t u = 0; u < (std::uint64_t(1) << 32); u += 127) {
    const float f = std::bit_cast<float>(std::uint32_t(u));
    if (std::isnan(f)) continue;
    ASSERT_EQ(half(f).bits(), Eigen::numext::bit_cast<std::uint16_t>(Eigen::half(f))) << std::hex << u;
    ASSERT_EQ(bfloat16(f).bits(), Eigen::numext::bit_cast<std::uint16_t>(Eigen::bfloat16(f))) << std::hex << u;
    ++checked;
  }
  EXPECT_GT(checked, std::size_t(33'000'000));
}

TEST(Float16, NanBecomesQuietNanWithItsSign) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float snan = std::bit_cast<float>(0x7f800001u);  // signalling, payload in the low bit
  EXPECT_EQ(half(nan).bits(), 0x7e00u);
  EXPECT_EQ(half(-nan).bits(), 0xfe00u);
  EXPECT_EQ(half(snan).bits(), 0x7e00u);
  EXPECT_EQ(bfloat16(nan).bits(), 0x7fc0u);
  EXPECT_EQ(bfloat16(-nan).bits(), 0xffc0u);
  EXPECT_EQ(bfloat16(snan).bits(), 0x7fc0u);  // truncation alone would give Inf
  EXPECT_TRUE(std::isnan(float(half(nan))));
  EXPECT_FALSE(half(nan) == half(nan));
  EXPECT_TRUE(half(0.0f) == half(-0.0f));
}

TEST(Float16, ImplicitConversionsWithEigenKeepTheBits) {
  const half h(0.333f);
  const Eigen::half e = h;  // certattn -> Eigen
  EXPECT_EQ(Eigen::numext::bit_cast<std::uint16_t>(e), h.bits());
  const half back = e;  // Eigen -> certattn
  EXPECT_EQ(back.bits(), h.bits());
  const bfloat16 b(-7.77f);
  const Eigen::bfloat16 eb = b;
  EXPECT_EQ(Eigen::numext::bit_cast<std::uint16_t>(eb), b.bits());
  const bfloat16 bb = eb;
  EXPECT_EQ(bb.bits(), b.bits());
  // An Eigen-typed buffer is read in place through a reinterpreted pointer.
  const Eigen::half buf[3] = {Eigen::half(1.0f), Eigen::half(-2.5f), Eigen::half(1e-6f)};
  const half* as_ours = reinterpret_cast<const half*>(buf);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(float(as_ours[i]), float(buf[i]));
  // No conversion between the two families (a half is not a bfloat16).
  static_assert(!std::is_convertible_v<Eigen::bfloat16, half>);
  static_assert(!std::is_convertible_v<Eigen::half, bfloat16>);
  static_assert(!std::is_convertible_v<float, half>);  // explicit, as Eigen's
}

}  // namespace
