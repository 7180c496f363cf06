// The score bounds of a variant (variant.hpp): from the scan's u_t >= raw score to
// u'_t >= cap tanh(raw / cap) + slope (t - newest), in place, with each block's maximum
// over its pool tokens. The AVX-512 kernel and its scalar twin evaluate the same float
// operations (fused only where both fuse explicitly; no contraction), so both give the
// same bits and the same candidates.
//
// The soft-cap bound: tanh(y) = 1 - 2 / (1 + e^{2y}) increases with e^{2y}, so an upper
// bound E >= e^{2y} gives one on tanh. E = 2^z with z = x (2 log2 e / cap) clamped to
// [-100, 40] (above 40 the result is 1 >= tanh), 2^z = 2^k p(f) with k = floor(z),
// f = z - k exact, and p a degree-4 fit of 2^f raised by 2^-15: its relative error is
// below 5.3e-6 on [0, 1] (tests/test_variants.cpp checks p(f) >= 2^f (1 + 1e-5) on a grid
// of 2^20 points, and the fit's slope keeps it between them), which covers the rounding
// of z (at most 2^-23 |z| <= 1.2e-5 in the exponent: 8.3e-6 relative) and of the
// polynomial. The rest (1 + E, the division, 1 - q, the product with cap) errs by at most
// 7 2^-24 cap, covered by adding cap 2^-20 rounded up. The bias: slope * k for the integer
// k = t - newest is within 2^-24 of its float product; 2^-22 of it is added, and the sum
// rounded up.
#pragma once

#include <certattn/arch/candidate_kernels.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include <certattn/arch/macros.hpp>

namespace certattn::detail {

/// One head's bound transform, in float: the constants both kernels use.
struct bound_variant {
  float cap = 0.0f;          // soft-cap, 0 off
  float exp_scale = 0.0f;    // 2 log2(e) / cap
  float cap_margin = 0.0f;   // cap 2^-20
  float slope = 0.0f;        // position-bias slope, 0 off
  float newest = 0.0f;       // n - 1 (exact below 2^24 tokens)
  bool active() const noexcept { return cap > 0.0f || slope != 0.0f; }
};

inline bound_variant make_bound_variant(double cap, double slope, std::size_t n) noexcept {
  bound_variant b;
  b.cap = float(cap);
  b.exp_scale = cap > 0.0 ? float(2.0 * 1.4426950408889634 / double(b.cap)) : 0.0f;
  b.cap_margin = float(double(b.cap) * 0x1p-20);
  b.slope = float(slope);
  b.newest = float(n > 0 ? n - 1 : 0);
  return b;
}

// p(f) >= 2^f on [0, 1]: the fit's coefficients (relative error <= 5.3e-6) and the factor
// 1 + 2^-15 applied to its value.
inline constexpr float kExp2Poly[5] = {1.0000052452087402f, 0.6929742693901062f,
                                       0.24150888621807098f, 0.05198953300714493f,
                                       0.013511553406715393f};
inline constexpr float kExp2Raise = 1.0f + 0x1p-15f;

/// p(f) (1 + 2^-15) for f in [0, 1): the fused Horner steps both kernels take.
inline float exp2_fraction_upper(float f) noexcept {
  float p = kExp2Poly[4];
  p = std::fma(p, f, kExp2Poly[3]);
  p = std::fma(p, f, kExp2Poly[2]);
  p = std::fma(p, f, kExp2Poly[1]);
  p = std::fma(p, f, kExp2Poly[0]);
  return p * kExp2Raise;
}

/// An upper bound on cap tanh(x / cap) (x may be -inf: then -inf, a token no head reads).
CERTATTN_NO_FP_CONTRACT inline float softcap_upper_scalar(float x, const bound_variant& b) noexcept {
  if (x == -std::numeric_limits<float>::infinity()) return x;
  const float z = std::min(std::max(x * b.exp_scale, -100.0f), 40.0f);
  const float k = std::floor(z);
  const float f = z - k;
  std::int32_t bits = (std::int32_t(k) + 127) << 23;
  float two_k;
  std::memcpy(&two_k, &bits, sizeof two_k);
  const float e = exp2_fraction_upper(f) * two_k;
  const float t = z >= 40.0f ? 1.0f : 1.0f - 2.0f / (1.0f + e);
  return add_round_up(b.cap * t, b.cap_margin);
}

/// u + slope (t - newest), rounded up with the product's error covered.
CERTATTN_NO_FP_CONTRACT inline float bias_upper_scalar(float u, std::size_t t, const bound_variant& b) noexcept {
  const float p = b.slope * (float(t) - b.newest);
  const float bias = add_round_up(p, std::fabs(p) * 0x1p-22f);
  return add_round_up(u, bias);
}

/// Token t's bound through the variant: soft-cap, then bias (the AVX-512 kernel's order).
CERTATTN_NO_FP_CONTRACT inline float bound_upper_scalar(float x, std::size_t t, const bound_variant& b) noexcept {
  if (b.cap > 0.0f) x = softcap_upper_scalar(x, b);
  if (b.slope != 0.0f) x = bias_upper_scalar(x, t, b);
  return x;
}

/// Tokens [t0, t1) of one head's u (indexed by token) transformed into out (may be u);
/// the maxima of blocks [t0 / 128, ...) over their tokens below t1 into block_max (indexed
/// by block).
CERTATTN_NO_FP_CONTRACT inline void apply_bound_variant_scalar(const float* u, float* out,
                                                               std::size_t t0, std::size_t t1,
                                                               const bound_variant& b,
                                                               float* block_max) noexcept {
  constexpr std::size_t B = 128;
  for (std::size_t blk = t0 / B; blk * B < t1; ++blk) {
    float m = -std::numeric_limits<float>::infinity();
    for (std::size_t t = std::max(t0, blk * B); t < std::min(t1, (blk + 1) * B); ++t)
      m = std::max(m, out[t] = bound_upper_scalar(u[t], t, b));
    block_max[blk] = m;
  }
}

#if CERTATTN_X86
CERTATTN_ARCH_BEGIN
CERTATTN_TARGET_AVX512 inline __m512 add_round_up_avx512(__m512 a, __m512 b) noexcept {
  return _mm512_add_round_ps(a, b, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC);
}

CERTATTN_TARGET_AVX512 CERTATTN_NO_FP_CONTRACT inline __m512 softcap_upper_avx512(__m512 x, const bound_variant& b) noexcept {
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __mmask16 masked = _mm512_cmp_ps_mask(x, ninf, _CMP_EQ_OQ);
  const __m512 z = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(x, _mm512_set1_ps(b.exp_scale)),
                                               _mm512_set1_ps(-100.0f)),
                                 _mm512_set1_ps(40.0f));
  const __m512 k = _mm512_roundscale_ps(z, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(z, k);
  __m512 p = _mm512_set1_ps(kExp2Poly[4]);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Poly[3]));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Poly[2]));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Poly[1]));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Poly[0]));
  p = _mm512_mul_ps(p, _mm512_set1_ps(kExp2Raise));
  const __m512 two_k = _mm512_castsi512_ps(_mm512_slli_epi32(
      _mm512_add_epi32(_mm512_cvttps_epi32(k), _mm512_set1_epi32(127)), 23));
  const __m512 e = _mm512_mul_ps(p, two_k);
  const __m512 one = _mm512_set1_ps(1.0f);
  __m512 t = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(one, e)));
  t = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(z, _mm512_set1_ps(40.0f), _CMP_GE_OQ), t, one);
  const __m512 s = add_round_up_avx512(_mm512_mul_ps(_mm512_set1_ps(b.cap), t),
                                       _mm512_set1_ps(b.cap_margin));
  return _mm512_mask_blend_ps(masked, s, ninf);
}

CERTATTN_TARGET_AVX512 CERTATTN_NO_FP_CONTRACT inline void apply_bound_variant_avx512(const float* u,
                                                              float* out, std::size_t t0,
                                                              std::size_t t1,
                                                              const bound_variant& b,
                                                              float* block_max) noexcept {
  constexpr std::size_t B = 128;
  const __m512 lanes = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (std::size_t blk = t0 / B; blk * B < t1; ++blk) {
    const std::size_t a = std::max(t0, blk * B), e = std::min(t1, (blk + 1) * B);
    __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    std::size_t t = a;
    for (; t + 16 <= e; t += 16) {
      __m512 x = _mm512_loadu_ps(u + t);
      if (b.cap > 0.0f) x = softcap_upper_avx512(x, b);
      if (b.slope != 0.0f) {
        // float(t + i) - newest: exact, as the twin's float(t) - newest.
        const __m512 pos = _mm512_add_ps(_mm512_set1_ps(float(t)), lanes);
        const __m512 p = _mm512_mul_ps(_mm512_set1_ps(b.slope),
                                       _mm512_sub_ps(pos, _mm512_set1_ps(b.newest)));
        const __m512 margin = _mm512_mul_ps(_mm512_and_ps(p, abs_mask), _mm512_set1_ps(0x1p-22f));
        x = add_round_up_avx512(x, add_round_up_avx512(p, margin));
      }
      _mm512_storeu_ps(out + t, x);
      m = _mm512_max_ps(m, x);
    }
    float mx = _mm512_reduce_max_ps(m);
    for (; t < e; ++t) mx = std::max(mx, out[t] = bound_upper_scalar(u[t], t, b));
    block_max[blk] = mx;
  }
}
CERTATTN_ARCH_END
#endif

/// The transform on the given instruction set.
inline void apply_bound_variant(const float* u, float* out, std::size_t t0, std::size_t t1,
                                const bound_variant& b, float* block_max, isa which) noexcept {
#if CERTATTN_X86
  if (which == isa::kAvx512Vnni) return apply_bound_variant_avx512(u, out, t0, t1, b, block_max);
#endif
  (void)which;
  apply_bound_variant_scalar(u, out, t0, t1, b, block_max);
}

}  // namespace certattn::detail

#include <certattn/arch/macros_undef.hpp>
