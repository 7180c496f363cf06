// The 8-bit refinement bound of one candidate, from nested codes (index.hpp): with
// st8 = st4 / 16, k = lo + st4 (code4 + f4) = lo + st8 (16 code4 + low + f8), so
//   s = scale (sum q lo + sum A code4) + scale sum A8 (low + f8),    A = q st4, A8 = A / 16,
// and the scan has already bounded the first part: its u = fl(r + t) with
// r >= scale (sum q lo + sum A code4 + sum a / 2), a = fl(q st4) (arch/scan_prep.hpp;
// scan_integer_part() recovers r from u). So, with a8 = fl(q st8),
//   s <= r + scale (C8 + sum a8 low),    C8 = sum max(a8, 0) - sum a / 2 + margin.
// a8 and C8 depend only on the block and the query, so they are prepared once per block
// that has candidates (prepare_refine_block), and a candidate costs one 64-byte row of low
// nibbles (at head_dim 128) and one dot of them with a8. The dot runs in float in 16 fixed
// lanes with explicit fmas and one reduction tree, so the AVX-512 kernel, the AVX2 kernel
// (two 8-lane halves), the portable one and the scalar twin give the same bits. The lanes
// follow the row's bytes: per chunk of 32 channels (16 bytes), lane l adds channel 2l (the
// low nibble of byte l), then channel 2l + 1 (its high nibble); the preparation stores a8
// in that order (refine_slot(): per chunk, the even channels, then the odd ones, zero past
// padded_dim), so that one widening load of 16 bytes feeds 32 channels. Rounding: each
// lane chain performs at most d / 16 + 2 fmas and the tree 4 additions,
// each erring by at most 2^-24 of a partial sum bounded by 16 sum |a8|; A8 - a8 adds at
// most 16 (2^-24 sum |a8| + d 2^-150); the double sums of C8 err by less than 2^-45
// (sum |a| + sum |a8|). The margin (d + 64) 2^-23 16 sum |a8| + 2^-40 (sum |a| + sum |a8|),
// the relative inflation 2^-40 and 1e-30 cover them with a factor of two to spare.
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

/// Per block and query: C8 (rounded up) from the 8 lane sums (channel mod 8, fixed order)
/// of max(a8, 0) - a / 2, |a| and |a8|, so that the AVX-512 twin gives the same bits.
inline float finish_refine_block(const double* c, const double* abs_a, const double* abs_a8,
                                 std::size_t padded_dim) noexcept {
  const double sa8 = reduce8(abs_a8);
  const double margin =
      double(padded_dim + 64) * 0x1p-23 * 16.0 * sa8 + 0x1p-40 * (reduce8(abs_a) + sa8);
  const double x = reduce8(c) + margin;
  return round_up_to_float(x + std::fabs(x) * 0x1p-40 + 1e-30);
}

/// The slots of a8 past padded_dim: 0, so that whole chunks of 32 add nothing there.
inline void zero_refine_padding(float* a8, std::size_t padded_dim) noexcept {
  for (std::size_t i = padded_dim; i < refine_a_size(padded_dim); ++i) a8[refine_slot(i)] = 0.0f;
}

/// a8 = q st8 into its slots (a8[refine_a_size(padded_dim)], zero past padded_dim) and C8.
inline float prepare_refine_block_scalar(const float* q, const float* st4, std::size_t padded_dim,
                                         float* a8) noexcept {
  double c[8] = {}, abs_a[8] = {}, abs_a8[8] = {};
  zero_refine_padding(a8, padded_dim);
  for (std::size_t i = 0; i < padded_dim; ++i) {
    const float a = q[i] * st4[i];  // the scan's a, bit for bit
    const float x = q[i] * step8_of(st4[i]);
    a8[refine_slot(i)] = x;
    c[i % 8] += std::max(double(x), 0.0) - 0.5 * double(a);
    abs_a[i % 8] += std::fabs(double(a));
    abs_a8[i % 8] += std::fabs(double(x));
  }
  return finish_refine_block(c, abs_a, abs_a8, padded_dim);
}

/// The preparation below AVX-512: the portable kernel (the same bits: its sums add the
/// same doubles in the same lanes), or the scalar twin where there is no batch type.
inline float prepare_refine_block(const float* q, const float* st4, std::size_t padded_dim,
                                  float* a8) noexcept {
#if CERTATTN_PORTABLE_SIMD
  alignas(64) double c[8], abs_a[8], abs_a8[8];
  zero_refine_padding(a8, padded_dim);
  portable::prepare_refine_sums(q, st4, padded_dim, a8, c, abs_a, abs_a8);
  return finish_refine_block(c, abs_a, abs_a8, padded_dim);
#else
  return prepare_refine_block_scalar(q, st4, padded_dim, a8);
#endif
}

#if CERTATTN_X86
CERTATTN_ARCH_BEGIN
CERTATTN_TARGET_AVX512 inline float prepare_refine_block_avx512(const float* q, const float* st4,
                                                                std::size_t padded_dim,
                                                                float* a8) noexcept {
  __m512d c = _mm512_setzero_pd(), abs_a = c, abs_a8 = c;
  const __m512d zero = _mm512_setzero_pd(), half = _mm512_set1_pd(0.5);
  zero_refine_padding(a8, padded_dim);
  const __m256i even_odd = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  for (std::size_t o = 0; o < padded_dim; o += 8) {  // padded_dim is a multiple of 8
    const __m256 qf = _mm256_loadu_ps(q + o);
    const __m256 sf = _mm256_loadu_ps(st4 + o);
    const __m512d ad = _mm512_cvtps_pd(_mm256_mul_ps(qf, sf));
    const __m256 a8f = _mm256_mul_ps(qf, _mm256_mul_ps(sf, _mm256_set1_ps(0.0625f)));
    // Channels o..o+7: the four even ones to slots refine_slot(o) + 0..3, the odd ones 16 on.
    const __m256 eo = _mm256_permutevar8x32_ps(a8f, even_odd);
    _mm_storeu_ps(a8 + refine_slot(o), _mm256_castps256_ps128(eo));
    _mm_storeu_ps(a8 + refine_slot(o) + 16, _mm256_extractf128_ps(eo, 1));
    const __m512d a8d = _mm512_cvtps_pd(a8f);
    c = _mm512_add_pd(c, _mm512_sub_pd(_mm512_max_pd(a8d, zero), _mm512_mul_pd(half, ad)));
    abs_a = _mm512_add_pd(abs_a, _mm512_abs_pd(ad));
    abs_a8 = _mm512_add_pd(abs_a8, _mm512_abs_pd(a8d));
  }
  alignas(64) double lc[8], la[8], l8[8];
  _mm512_store_pd(lc, c);
  _mm512_store_pd(la, abs_a);
  _mm512_store_pd(l8, abs_a8);
  return finish_refine_block(lc, la, l8, padded_dim);
}
CERTATTN_ARCH_END
#endif

/// sum a8 low in 16 lanes (the scalar twin of the vector kernels): per chunk of 32
/// channels, lane l adds channel 2l, then 2l + 1 (a8 in refine_slot() order, nibbles past
/// padded_dim read as 0).
inline float refine_dot_scalar(const float* a8, const std::uint8_t* low,
                               std::size_t padded_dim) noexcept {
  float acc[16] = {};
  for (std::size_t o = 0; o < padded_dim; o += 32)
    for (std::size_t l = 0; l < 16; ++l) {
      const std::uint8_t byte = o + 2 * l < padded_dim ? low[o / 2 + l] : std::uint8_t(0);
      acc[l] = std::fma(a8[o + l], float(byte & 0xF), acc[l]);
      acc[l] = std::fma(a8[o + 16 + l], float(byte >> 4), acc[l]);
    }
  return reduce16(acc);
}

/// refine_dot_scalar()'s bits below AVX2: the portable kernel where the build's target has
/// a fused multiply-add (NEON), else the scalar twin.
inline float refine_dot_portable(const float* a8, const std::uint8_t* low,
                                 std::size_t padded_dim) noexcept {
#if CERTATTN_PORTABLE_SIMD
  if constexpr (portable::portable_has_fma) return portable::refine_dot(a8, low, padded_dim);
#endif
  return refine_dot_scalar(a8, low, padded_dim);
}

#if CERTATTN_X86
CERTATTN_ARCH_BEGIN
/// Chunk o (32 channels, 16 bytes; fewer past padded_dim, read as 0): acc += a8's even
/// slots times the low nibbles, then its odd slots times the high nibbles.
CERTATTN_TARGET_AVX512 inline __m512 refine_chunk_avx512(__m512 acc, const float* a8,
                                                         const std::uint8_t* low, std::size_t o,
                                                         std::size_t padded_dim) noexcept {
  const std::size_t bytes = std::min<std::size_t>(16, (padded_dim - o) / 2);
  const __m128i x = bytes == 16 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(low + o / 2))
                                : _mm_maskz_loadu_epi8(__mmask16((1u << bytes) - 1u), low + o / 2);
  const __m512i w = _mm512_cvtepu8_epi32(x);
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(w, _mm512_set1_epi32(0xF)));
  const __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(w, 4));
  acc = _mm512_fmadd_ps(_mm512_loadu_ps(a8 + o), lo, acc);
  return _mm512_fmadd_ps(_mm512_loadu_ps(a8 + o + 16), hi, acc);
}

CERTATTN_TARGET_AVX512 inline float refine_dot_avx512(const float* a8, const std::uint8_t* low,
                                                      std::size_t padded_dim) noexcept {
  __m512 acc = _mm512_setzero_ps();
  for (std::size_t o = 0; o < padded_dim; o += 32)
    acc = refine_chunk_avx512(acc, a8, low, o, padded_dim);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, acc);
  return reduce16(lanes);
}

/// refine_dot_avx512() of 16 candidates at once (a8[k] with low[k]), the same bits for
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
  for (std::size_t o = 0; o < padded_dim; o += 32) {
    _Pragma("GCC unroll 16")
    for (int k = 0; k < 16; ++k) acc[k] = refine_chunk_avx512(acc[k], a[k], code[k], o, padded_dim);
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

CERTATTN_TARGET_AVX2 inline float refine_dot_avx2(const float* a8, const std::uint8_t* low,
                                                  std::size_t padded_dim) noexcept {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();  // lanes 0-7, 8-15
  const __m256i m = _mm256_set1_epi32(0xF);
  for (std::size_t o = 0; o < padded_dim; o += 32) {
    alignas(16) std::uint8_t b[16] = {};
    std::memcpy(b, low + o / 2, std::min<std::size_t>(16, (padded_dim - o) / 2));
    const __m128i x = _mm_load_si128(reinterpret_cast<const __m128i*>(b));
    const __m256i w0 = _mm256_cvtepu8_epi32(x), w1 = _mm256_cvtepu8_epi32(_mm_srli_si128(x, 8));
    const __m256 lo0 = _mm256_cvtepi32_ps(_mm256_and_si256(w0, m));
    const __m256 hi0 = _mm256_cvtepi32_ps(_mm256_srli_epi32(w0, 4));
    const __m256 lo1 = _mm256_cvtepi32_ps(_mm256_and_si256(w1, m));
    const __m256 hi1 = _mm256_cvtepi32_ps(_mm256_srli_epi32(w1, 4));
    lo = _mm256_fmadd_ps(_mm256_loadu_ps(a8 + o), lo0, lo);
    lo = _mm256_fmadd_ps(_mm256_loadu_ps(a8 + o + 16), hi0, lo);
    hi = _mm256_fmadd_ps(_mm256_loadu_ps(a8 + o + 8), lo1, hi);
    hi = _mm256_fmadd_ps(_mm256_loadu_ps(a8 + o + 24), hi1, hi);
  }
  alignas(32) float lanes[16];
  _mm256_store_ps(lanes, lo);
  _mm256_store_ps(lanes + 8, hi);
  return reduce16(lanes);
}
CERTATTN_ARCH_END
#endif

/// The dots sum a8[k] low[k] of m <= 16 candidates (entries m..15 of a and code must be
/// valid pointers too: any candidate's), each the same bits as refine_dot_scalar().
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

/// The refined bound (scaled) of a candidate whose scan bound is u, from its block's
/// preparation (a8, offset C8), residual coefficients and rho byte, and its low nibbles:
/// scan_integer_part() + scale (C8 + dot). For tests and the reference of the level loop.
inline double refine8_bound(float u, residual_coefficients res, std::uint8_t rho,
                            const float* a8, float offset, const std::uint8_t* low,
                            std::size_t padded_dim, double scale, isa which) noexcept {
  float dot;
  refine_dots(&a8, &low, 1, padded_dim, &dot, which);
  return scan_integer_part(u, res, rho) + scale * (double(offset) + double(dot));
}

}  // namespace certattn::detail

#include <certattn/arch/macros_undef.hpp>
