// key_index's quantisation: the AVX-512 row encoder gives the scalar loop's bits (codes,
// residual-norm bytes), and every code brackets its key: lo + st q <= k <= lo + st (q + 1),
// also for appended tokens whose block borrowed the previous block's ranges.
#include <certattn/index.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace {

using certattn::half;
using certattn::isa;
using certattn::key_index;

enum class kind { kGaussian, kOutlierChannels, kConstantChannels, kTiny, kHuge, kTies, kDrift };

std::vector<half> make_keys(kind k, std::size_t n, std::size_t d, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<half> keys(n * d);
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t i = 0; i < d; ++i) {
      float x = nd(rng);
      switch (k) {
        case kind::kGaussian: break;
        case kind::kOutlierChannels: x *= (i % 17 == 3) ? 40.0f : 1.0f; break;
        case kind::kConstantChannels: x = (i % 3 == 0) ? 0.75f : x; break;
        case kind::kTiny: x *= 1e-6f; break;
        case kind::kHuge: x *= 1e4f; x = std::fmax(-6.5e4f, std::fmin(6.5e4f, x)); break;
        case kind::kTies: x = float(int(4.0f * x)) * 0.25f; break;  // few distinct values
        // Keys that fall steadily: each appended block lies below the previous block's
        // ranges, which a young tail block borrows, so its own tokens must widen them.
        case kind::kDrift: x -= 0.1f * float(t); break;
      }
      keys[t * d + i] = half(x);
    }
  return keys;
}

/// Builds from a prefix and appends the rest (both encoders, tail-block headroom).
key_index build(const certattn::strided_kv<half>& kv, std::size_t n0) {
  key_index idx(kv.head_dim());
  idx.build(kv.prefix(n0));
  for (std::size_t t = n0; t < kv.size(); ++t) idx.append(kv, t);
  return idx;
}

class IndexEncode : public ::testing::TestWithParam<std::tuple<kind, std::size_t>> {};

TEST_P(IndexEncode, Avx512RowEncoderGivesTheScalarBitsAndCodesBracketKeys) {
  if (certattn::detected_isa() != isa::kAvx512Vnni) GTEST_SKIP() << "no AVX-512 VNNI here";
  const auto [k, d] = GetParam();
  const std::size_t n = 700;  // 5 full blocks and a partial one
  const std::vector<half> keys = make_keys(k, n, d, 17 * d + std::size_t(k));
  const std::vector<half> values(n * d, half(1.0f));
  const certattn::strided_kv<half> kv(keys.data(), values.data(), n, d, d, d);

  certattn::set_isa_cap(isa::kScalar);
  const key_index scalar = build(kv, 300);
  certattn::set_isa_cap(isa::kAvx512Vnni);
  const key_index vec = build(kv, 300);

  const std::size_t dp = scalar.padded_dim(), B = key_index::kBlockTokens;
  for (std::size_t t = 0; t < n; ++t) {
    const std::size_t b = t / B;
    ASSERT_EQ(0, std::memcmp(scalar.codes8_low(t), vec.codes8_low(t), scalar.low8_bytes()))
        << "8-bit codes, token " << t;
    ASSERT_EQ(scalar.block_rho(b)[t % B], vec.block_rho(b)[t % B]) << "residual byte, token " << t;
    for (std::size_t i = 0; i < dp; ++i)
      ASSERT_EQ(scalar.code4(t, i), vec.code4(t, i)) << "4-bit code, token " << t << " ch " << i;
    // The bracket, in double as the bounds assume it.
    const float* lo = vec.block_lo(b);
    const float* s4 = vec.block_step4(b);
    for (std::size_t i = 0; i < d; ++i) {
      const double x = double(float(keys[t * d + i])), l = double(lo[i]);
      const double q4 = vec.code4(t, i), q8 = vec.code8(t, i);
      const float s8 = certattn::detail::step8_of(s4[i]);
      ASSERT_EQ(double(s8) * 16.0, double(s4[i])) << "st8 = st4 / 16 exactly, ch " << i;
      ASSERT_EQ(unsigned(q8) >> 4, unsigned(q4)) << "nested codes, token " << t << " ch " << i;
      ASSERT_LE(l + double(s4[i]) * q4, x) << "token " << t << " ch " << i;
      ASSERT_GE(l + double(s4[i]) * (q4 + 1.0), x) << "token " << t << " ch " << i;
      ASSERT_LE(l + double(s8) * q8, x) << "token " << t << " ch " << i;
      ASSERT_GE(l + double(s8) * (q8 + 1.0), x) << "token " << t << " ch " << i;
    }
    for (std::size_t i = d; i < dp; ++i) {
      ASSERT_EQ(vec.code4(t, i), 0u);
      ASSERT_EQ(vec.code8(t, i), 0u);
    }
  }
  certattn::set_isa_cap(certattn::detected_isa());
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, IndexEncode,
    ::testing::Combine(::testing::Values(kind::kGaussian, kind::kOutlierChannels,
                                         kind::kConstantChannels, kind::kTiny, kind::kHuge,
                                         kind::kTies, kind::kDrift),
                       ::testing::Values(std::size_t(8), std::size_t(64), std::size_t(100),
                                         std::size_t(128))));

// The index's memory (format 2: nested codes): 1.0625 d + 9 bytes per token plus the
// centre, at most 30% of the fp16 K and V rows at head_dim 128 (28.3%) and 256, 31% at 64.
TEST(IndexMemory, NestedCodesKeepTheIndexWithinThirtyPercentOfTheCache) {
  for (std::size_t d : {64u, 128u, 256u}) {
    const std::size_t n = 16384;
    const std::vector<half> keys = make_keys(kind::kGaussian, n, d, d);
    const std::vector<half> values(n * d, half(1.0f));
    const certattn::strided_kv<half> kv(keys.data(), values.data(), n, d, d, d);
    key_index idx(d);
    idx.build(kv);
    const double frac = double(idx.memory_bytes()) / double(n * d * 2 * sizeof(half));
    const double per_token = double(idx.memory_bytes()) / double(n);
    EXPECT_NEAR(per_token, 1.0625 * double(d) + 9.0, 1.0) << "d " << d;
    EXPECT_LE(frac, d == 64 ? 0.31 : 0.30) << "d " << d;
  }
}

}  // namespace
