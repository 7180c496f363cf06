// AVX-512 quantisation of one key row for the index (key_index::encode_token): the 8-bit
// codes of 8 channels at a time in double (the 4-bit code is the 8-bit code's high
// nibble), and the lanes of the residual norm's sum of squares. It computes exactly what
// the scalar loop of index.hpp computes, bit for bit: the same operations in the same
// order, without contraction into fmas (GCC would fuse the intrinsics' multiply and add in
// a function compiled for AVX-512, so this one is compiled with fp-contract off), the same
// guess-and-correct rule, and the same lane order for the sum. A lane whose guess needs
// more than one correction step (never seen; the guess is within one) sends the octet to
// the scalar code.
#pragma once

#include <certattn/arch/dispatch.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include <certattn/arch/macros.hpp>

#if CERTATTN_X86

CERTATTN_ARCH_BEGIN
namespace certattn::detail {

/// The scalar quantize() on 8 lanes: q = min((k - lo) inv, qmax), truncated where > 0,
/// else 0; one step down while lo + st q > k, one step up while lo + st (q + 1) < k; 0
/// where st = 0. Clears ok when a lane would need a second step. (Helpers, not lambdas:
/// a lambda does not inherit the target attribute under Clang.)
CERTATTN_TARGET_AVX512 CERTATTN_NO_FP_CONTRACT inline __mmask8 too_high_avx512(
    __m512d q, __m512d l, __m512d st, __m512d k) noexcept {  // q > 0 && lo + st q > k
  return __mmask8(_mm512_cmp_pd_mask(q, _mm512_setzero_pd(), _CMP_GT_OQ) &
                  _mm512_cmp_pd_mask(_mm512_add_pd(l, _mm512_mul_pd(st, q)), k, _CMP_GT_OQ));
}
CERTATTN_TARGET_AVX512 CERTATTN_NO_FP_CONTRACT inline __mmask8 too_low_avx512(
    __m512d q, __m512d qmax, __m512d l, __m512d st, __m512d k) noexcept {
  // q < qmax && lo + st (q + 1) < k
  const __m512d next = _mm512_add_pd(q, _mm512_set1_pd(1.0));
  return __mmask8(_mm512_cmp_pd_mask(q, qmax, _CMP_LT_OQ) &
                  _mm512_cmp_pd_mask(_mm512_add_pd(l, _mm512_mul_pd(st, next)), k, _CMP_LT_OQ));
}
CERTATTN_TARGET_AVX512 CERTATTN_NO_FP_CONTRACT inline __m512d quantize_lanes_avx512(
    __m512d k, __m512d l, __m512d st, __m512d inv, double qmax_s, __mmask8& has_step,
    bool& ok) noexcept {
  const __m512d zero = _mm512_setzero_pd(), one = _mm512_set1_pd(1.0);
  const __m512d qmax = _mm512_set1_pd(qmax_s);
  has_step = _mm512_cmp_pd_mask(st, zero, _CMP_GT_OQ);
  // min(qmax, v) returns v when v is NaN, as std::min(v, qmax) does.
  const __m512d qd = _mm512_min_pd(qmax, _mm512_mul_pd(_mm512_sub_pd(k, l), inv));
  __m512d q = _mm512_maskz_roundscale_pd(_mm512_cmp_pd_mask(qd, zero, _CMP_GT_OQ), qd,
                                         _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  q = _mm512_mask_sub_pd(q, too_high_avx512(q, l, st, k) & has_step, q, one);
  ok &= (too_high_avx512(q, l, st, k) & has_step) == 0;
  q = _mm512_mask_add_pd(q, too_low_avx512(q, qmax, l, st, k) & has_step, q, one);
  ok &= (too_low_avx512(q, qmax, l, st, k) & has_step) == 0;
  return _mm512_maskz_mov_pd(has_step, q);
}

/// Codes of channels [8 o, 8 o + 8) of one row: the 8-bit codes q8 (one per byte; the
/// 4-bit code is q8 / 16, as st8 = st4 / 16) and the 8 lanes of (f - 1/2)^2 to add (0
/// where st4 = 0). x holds the row's floats (lanes at or beyond `valid` read as 0), lo/s8
/// the block's offset and 8-bit step, inv4/inv8 the reciprocals of st4 and st8 (0 where
/// the step is 0). Returns false when a lane needs the scalar loop.
CERTATTN_TARGET_AVX512 CERTATTN_NO_FP_CONTRACT inline bool quantize_octet_avx512(
    const float* x, std::size_t valid, const float* lo, const float* s8, const double* inv4,
    const double* inv8, std::uint8_t* q8_out, __m512d& rho_lanes) noexcept {
  const __mmask8 live = valid >= 8 ? __mmask8(0xFF) : __mmask8((1u << valid) - 1u);
  const __m512d k = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(live, x));
  const __m512d l = _mm512_cvtps_pd(_mm256_loadu_ps(lo));
  bool ok = true;
  __mmask8 has8;
  const __m512d q8 = quantize_lanes_avx512(k, l, _mm512_cvtps_pd(_mm256_loadu_ps(s8)),
                                           _mm512_loadu_pd(inv8), 255.0, has8, ok);
  if (!ok) return false;
  // q4 = floor(q8 / 16) (exact); f = (k - lo) inv4 - q4 in [0, 1]; (f - 1/2)^2 joins the
  // lane's sum where st4 > 0 (st4 > 0 exactly where st8 > 0).
  const __m512d q4 = _mm512_roundscale_pd(_mm512_mul_pd(q8, _mm512_set1_pd(0.0625)),
                                          _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m512d f = _mm512_sub_pd(_mm512_mul_pd(_mm512_sub_pd(k, l), _mm512_loadu_pd(inv4)), q4);
  const __m512d e = _mm512_sub_pd(f, _mm512_set1_pd(0.5));
  rho_lanes = _mm512_mask_add_pd(rho_lanes, has8, rho_lanes, _mm512_mul_pd(e, e));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(q8_out),
                   _mm512_cvtepi64_epi8(_mm512_cvttpd_epi64(q8)));
  return true;
}

/// The whole row (dp channels, d of them real): 8-bit codes into c8[0, dp) (one per
/// byte), the residual's 8 lane sums into rho_lanes. False when some octet needs the
/// scalar loop (the caller then redoes the row with it).
CERTATTN_TARGET_AVX512 CERTATTN_NO_FP_CONTRACT inline bool quantize_row_avx512(
    const float* x, std::size_t d, std::size_t dp, const float* lo, const float* s8,
    const double* inv4, const double* inv8, std::uint8_t* c8, double* rho_lanes) noexcept {
  __m512d acc = _mm512_setzero_pd();
  for (std::size_t i = 0; i < dp; i += 8) {
    if (!quantize_octet_avx512(x + i, i < d ? d - i : 0, lo + i, s8 + i, inv4 + i, inv8 + i,
                               c8 + i, acc))
      return false;
  }
  _mm512_storeu_pd(rho_lanes, acc);
  return true;
}

}  // namespace certattn::detail
CERTATTN_ARCH_END
#endif

#include <certattn/arch/macros_undef.hpp>
