// The 8-bit refinement bound of one candidate: with k = lo + st8 (code + f), f in [0, 1],
//   q.k <= C8 + sum a code,  a = q st8,  C8 = sum q lo + sum max(a, 0).
// a and C8 depend only on the block and the query, so they are prepared once per block
// that has candidates (prepare_refine_block), and a candidate costs one dot of its 8-bit
// codes with a. The dot runs in float in 16 fixed lanes (channel mod 16) with explicit
// fmas and one reduction tree, so the AVX-512 kernel, the AVX2 kernel (two 8-lane halves)
// and the scalar twin give the same bits. Rounding: each lane chain performs at most
// d / 16 fmas and the tree 4 additions, each erring by at most 2^-24 of a partial sum
// bounded by 256 sum |a|; C8 is summed in double and rounded up. The margin
// (d + 64) 2^-23 * 256 sum |a| covers them with a factor of two to spare.
#pragma once

#include <certattn/arch/dispatch.hpp>
#include <certattn/arch/portable.hpp>
#include <certattn/arch/scan_prep.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <certattn/arch/macros.hpp>

namespace certattn::detail {

inline float reduce16(const float* a) noexcept {
  float b[8];
  for (int i = 0; i < 8; ++i) b[i] = a[i] + a[i + 8];
  float c[4];
  for (int i = 0; i < 4; ++i) c[i] = b[i] + b[i + 4];
  return (c[0] + c[2]) + (c[1] + c[3]);
}

/// Per block and query: a = q st8 (float, [padded_dim]) and the constant
/// C8 + margin (rounded up), to which a candidate's dot is added. The double sums run in
/// 8 fixed lanes (channel mod 8) so that the AVX-512 twin below gives the same bits.
inline float finish_refine_block(const double* c, const double* abs_a, const double* abs_ql,
                                 std::size_t padded_dim) noexcept {
  // The dot's float rounding, a's rounding, and the double sums (also those of the
  // reference's exact score, below 2^-45 of sum |q lo| + 256 sum |a|).
  const double margin =
      double(padded_dim + 64) * 0x1p-23 * 256.0 * reduce8(abs_a) + 0x1p-40 * reduce8(abs_ql);
  return round_up_to_float((reduce8(c) + margin) * (1.0 + 0x1p-40) + 1e-30);
}

inline float prepare_refine_block_scalar(const float* q, const float* lo, const float* st,
                                         std::size_t padded_dim, float* a) noexcept {
  double c[8] = {}, abs_a[8] = {}, abs_ql[8] = {};
  for (std::size_t i = 0; i < padded_dim; ++i) {
    a[i] = q[i] * st[i];  // float: its rounding (2^-24 |a|) is inside the margin
    const double ql = double(q[i]) * double(lo[i]);  // exact
    c[i % 8] += ql + std::max(double(a[i]), 0.0);
    abs_a[i % 8] += std::fabs(double(a[i]));
    abs_ql[i % 8] += std::fabs(ql);
  }
  return finish_refine_block(c, abs_a, abs_ql, padded_dim);
}

/// The preparation below AVX-512: the portable kernel (the same bits: every product it
/// adds is exact in double), or the scalar twin where there is no batch type.
inline float prepare_refine_block(const float* q, const float* lo, const float* st,
                                  std::size_t padded_dim, float* a) noexcept {
#if CERTATTN_PORTABLE_SIMD
  alignas(64) double c[8], abs_a[8], abs_ql[8];
  portable::prepare_refine_sums(q, lo, st, padded_dim, a, c, abs_a, abs_ql);
  return finish_refine_block(c, abs_a, abs_ql, padded_dim);
#else
  return prepare_refine_block_scalar(q, lo, st, padded_dim, a);
#endif
}

#if CERTATTN_X86
CERTATTN_ARCH_BEGIN
CERTATTN_TARGET_AVX512 inline float prepare_refine_block_avx512(const float* q, const float* lo,
                                                                const float* st,
                                                                std::size_t padded_dim,
                                                                float* a) noexcept {
  __m512d c = _mm512_setzero_pd(), abs_a = c, abs_ql = c;
  const __m512d zero = _mm512_setzero_pd();
  for (std::size_t o = 0; o < padded_dim; o += 8) {  // padded_dim is a multiple of 8
    const __m256 qf = _mm256_loadu_ps(q + o);
    const __m256 af = _mm256_mul_ps(qf, _mm256_loadu_ps(st + o));
    _mm256_storeu_ps(a + o, af);
    const __m512d ad = _mm512_cvtps_pd(af);
    const __m512d ql = _mm512_mul_pd(_mm512_cvtps_pd(qf), _mm512_cvtps_pd(_mm256_loadu_ps(lo + o)));
    c = _mm512_add_pd(c, _mm512_add_pd(ql, _mm512_max_pd(ad, zero)));
    abs_a = _mm512_add_pd(abs_a, _mm512_abs_pd(ad));
    abs_ql = _mm512_add_pd(abs_ql, _mm512_abs_pd(ql));
  }
  alignas(64) double lc[8], la[8], lq[8];
  _mm512_store_pd(lc, c);
  _mm512_store_pd(la, abs_a);
  _mm512_store_pd(lq, abs_ql);
  return finish_refine_block(lc, la, lq, padded_dim);
}
CERTATTN_ARCH_END
#endif

/// sum a code in 16 lanes (the scalar twin of the vector kernels).
inline float refine_dot_scalar(const float* a, const std::uint8_t* code,
                               std::size_t padded_dim) noexcept {
  float acc[16] = {};
  for (std::size_t o = 0; o < padded_dim; o += 16)
    for (std::size_t l = 0; l < 16 && o + l < padded_dim; ++l)
      acc[l] = std::fma(a[o + l], float(code[o + l]), acc[l]);
  return reduce16(acc);
}

/// refine_dot_scalar()'s bits below AVX2: the portable kernel where the build's target has
/// a fused multiply-add (NEON), else the scalar twin.
inline float refine_dot_portable(const float* a, const std::uint8_t* code,
                                 std::size_t padded_dim) noexcept {
#if CERTATTN_PORTABLE_SIMD
  if constexpr (portable::portable_has_fma) return portable::refine_dot(a, code, padded_dim);
#endif
  return refine_dot_scalar(a, code, padded_dim);
}

#if CERTATTN_X86
CERTATTN_ARCH_BEGIN
CERTATTN_TARGET_AVX512 inline float refine_dot_avx512(const float* a, const std::uint8_t* code,
                                                      std::size_t padded_dim) noexcept {
  __m512 acc = _mm512_setzero_ps();
  std::size_t o = 0;
  for (; o + 16 <= padded_dim; o += 16) {
    const __m512 cc = _mm512_cvtepi32_ps(
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(code + o))));
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + o), cc, acc);
  }
  if (o < padded_dim) {  // padded_dim is a multiple of 8
    const __mmask16 m = __mmask16((1u << (padded_dim - o)) - 1);
    const __m512 cc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, code + o)));
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + o), cc, acc);
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, acc);
  return reduce16(lanes);
}

/// refine_dot_avx512() of 16 candidates at once (a[k] with code[k]), the same bits for
/// each: the 16 lane chains run interleaved (16 independent fma chains instead of one),
/// and the 16 reductions share one transposed tree that performs, for every candidate,
/// exactly the additions of reduce16(): b = x[i] + x[i + 8], c = b[i] + b[i + 4], then
/// (c0 + c2) + (c1 + c3). dot[k] receives candidate k's sum.
CERTATTN_TARGET_AVX512 inline void refine_dot16_avx512(const float* const* a,
                                                       const std::uint8_t* const* code,
                                                       std::size_t padded_dim,
                                                       float* dot) noexcept {
  __m512 acc[16];
  _Pragma("GCC unroll 16")
  for (int k = 0; k < 16; ++k) acc[k] = _mm512_setzero_ps();
  std::size_t o = 0;
  for (; o + 16 <= padded_dim; o += 16) {
    _Pragma("GCC unroll 16")
    for (int k = 0; k < 16; ++k) {
      const __m512 cc = _mm512_cvtepi32_ps(
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(code[k] + o))));
      acc[k] = _mm512_fmadd_ps(_mm512_loadu_ps(a[k] + o), cc, acc[k]);
    }
  }
  if (o < padded_dim) {  // padded_dim is a multiple of 8
    const __mmask16 m = __mmask16((1u << (padded_dim - o)) - 1);
    _Pragma("GCC unroll 16")
    for (int k = 0; k < 16; ++k) {
      const __m512 cc =
          _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, code[k] + o)));
      acc[k] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a[k] + o), cc, acc[k]);
    }
  }
  // b: lanes 0-7 of x[m] hold candidate 2m's b, lanes 8-15 candidate 2m + 1's.
  __m512 x[8];
  _Pragma("GCC unroll 8")
  for (int m = 0; m < 8; ++m)
    x[m] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * m], acc[2 * m + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(acc[2 * m], acc[2 * m + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  // c: quarter j of z[p] holds candidate 4p + j's c0..c3.
  __m512 z[4];
  _Pragma("GCC unroll 4")
  for (int p = 0; p < 4; ++p)
    z[p] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * p], x[2 * p + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(x[2 * p], x[2 * p + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  // (c0 + c2, c1 + c3): quarter j of r[h] holds those of candidates 8h + j, then 8h + 4 + j.
  __m512 r[2];
  _Pragma("GCC unroll 2")
  for (int h = 0; h < 2; ++h)
    r[h] = _mm512_add_ps(_mm512_shuffle_ps(z[2 * h], z[2 * h + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(z[2 * h], z[2 * h + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  // Element e of quarter j: candidate 4e + j.
  const __m512 f = _mm512_add_ps(_mm512_shuffle_ps(r[0], r[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_ps(r[0], r[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i to_candidate =
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_ps(dot, _mm512_permutexvar_ps(to_candidate, f));
}

CERTATTN_TARGET_AVX2 inline float refine_dot_avx2(const float* a, const std::uint8_t* code,
                                                  std::size_t padded_dim) noexcept {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  std::size_t o = 0;
  for (; o + 16 <= padded_dim; o += 16) {
    std::int64_t c0, c1;
    std::memcpy(&c0, code + o, 8);
    std::memcpy(&c1, code + o + 8, 8);
    lo = _mm256_fmadd_ps(_mm256_loadu_ps(a + o),
                         _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(c0))), lo);
    hi = _mm256_fmadd_ps(_mm256_loadu_ps(a + o + 8),
                         _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(c1))), hi);
  }
  if (o < padded_dim) {  // 8 channels left
    std::int64_t c0;
    std::memcpy(&c0, code + o, 8);
    lo = _mm256_fmadd_ps(_mm256_loadu_ps(a + o),
                         _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(c0))), lo);
  }
  alignas(32) float lanes[16];
  _mm256_store_ps(lanes, lo);
  _mm256_store_ps(lanes + 8, hi);
  return reduce16(lanes);
}
CERTATTN_ARCH_END
#endif

/// The dots sum a[k] code[k] of m <= 16 candidates (entries m..15 of a and code must be
/// valid pointers too: any candidate's), each the same bits as refine8_bound() adds.
inline void refine_dots(const float* const* a, const std::uint8_t* const* code, std::size_t m,
                        std::size_t padded_dim, float* dot, isa which) noexcept {
#if CERTATTN_X86
  if (which == isa::kAvx512Vnni && m > 1) return refine_dot16_avx512(a, code, padded_dim, dot);
  if (which == isa::kAvx512Vnni) {
    dot[0] = refine_dot_avx512(a[0], code[0], padded_dim);
    return;
  }
  if (which == isa::kAvx2) {
    for (std::size_t k = 0; k < m; ++k) dot[k] = refine_dot_avx2(a[k], code[k], padded_dim);
    return;
  }
#endif
  (void)which;
  for (std::size_t k = 0; k < m; ++k) dot[k] = refine_dot_portable(a[k], code[k], padded_dim);
}

/// The 8-bit bound on q.k (unscaled) of one candidate, given its block's preparation.
inline double refine8_bound(const float* a, float offset, const std::uint8_t* code,
                            std::size_t padded_dim, isa which) noexcept {
  float dot;
#if CERTATTN_X86
  if (which == isa::kAvx512Vnni)
    dot = refine_dot_avx512(a, code, padded_dim);
  else if (which == isa::kAvx2)
    dot = refine_dot_avx2(a, code, padded_dim);
  else
#endif
    dot = refine_dot_portable(a, code, padded_dim);
  (void)which;
  return double(offset) + double(dot);
}

}  // namespace certattn::detail

#include <certattn/arch/macros_undef.hpp>
