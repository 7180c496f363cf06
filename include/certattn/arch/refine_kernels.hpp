// The 8-bit refinement bound of one candidate: with k = lo + st8 (code + f), f in [0, 1],
//   q.k <= sum q lo + sum a code + sum max(a, 0),  a = q st8,
// evaluated in float in 16 fixed lanes (channel mod 16) with explicit fmas and one fixed
// reduction tree, so the AVX-512 kernel and its scalar twin give the same bits. The float
// rounding is covered by a margin: each lane chain performs at most 3 d / 16 + 2 roundings
// and the tree 4 more, each erring by at most 2^-24 of a partial sum bounded by
// mag = sum |q lo| + 256 sum |a|, so (3 d + 64) 2^-24 mag (doubled for safety) bounds it.
#pragma once

#include <certattn/arch/dispatch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace certattn::detail {

inline float reduce16(const float* a) noexcept {
  float b[8];
  for (int i = 0; i < 8; ++i) b[i] = a[i] + a[i + 8];
  float c[4];
  for (int i = 0; i < 4; ++i) c[i] = b[i] + b[i + 4];
  return (c[0] + c[2]) + (c[1] + c[3]);
}

/// Returns the bound on q.k (unscaled) for padded_dim channels (a multiple of 8; the
/// last 8 channels of an odd octet count are zero-padded by the caller's layout).
inline double refine8_scalar(const float* q, const float* lo, const float* st,
                             const std::uint8_t* code, std::size_t padded_dim) noexcept {
  float acc[16] = {}, mag[16] = {};
  for (std::size_t o = 0; o < padded_dim; o += 16) {
    for (std::size_t l = 0; l < 16; ++l) {
      const std::size_t i = o + l;
      if (i >= padded_dim) break;
      const float a = q[i] * st[i];
      float x = std::fma(q[i], lo[i], acc[l]);
      x = std::fma(a, float(code[i]), x);
      acc[l] = x + std::fmax(a, 0.0f);
      mag[l] = std::fma(256.0f, std::fabs(a), mag[l] + std::fabs(q[i] * lo[i]));
    }
  }
  const double sum = reduce16(acc), m = reduce16(mag);
  return sum + 2.0 * double(3 * padded_dim + 64) * 0x1p-24 * (m * 1.01 + 1e-30);
}

#if CERTATTN_X86
CERTATTN_ARCH_BEGIN
CERTATTN_TARGET_AVX512 inline double refine8_avx512(const float* q, const float* lo,
                                                    const float* st, const std::uint8_t* code,
                                                    std::size_t padded_dim) noexcept {
  __m512 acc = _mm512_setzero_ps(), mag = _mm512_setzero_ps();
  const __m512 zero = _mm512_setzero_ps(), c256 = _mm512_set1_ps(256.0f);
  const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (std::size_t o = 0; o < padded_dim; o += 16) {
    const std::size_t left = padded_dim - o;
    const __mmask16 m = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
    const __m512 qq = _mm512_maskz_loadu_ps(m, q + o);
    const __m512 ll = _mm512_maskz_loadu_ps(m, lo + o);
    const __m512 ss = _mm512_maskz_loadu_ps(m, st + o);
    const __m512 cc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, code + o)));
    const __m512 a = _mm512_mul_ps(qq, ss);
    __m512 x = _mm512_fmadd_ps(qq, ll, acc);
    x = _mm512_fmadd_ps(a, cc, x);
    acc = _mm512_add_ps(x, _mm512_max_ps(a, zero));
    const __m512 ql = _mm512_and_ps(_mm512_mul_ps(qq, ll), absmask);
    mag = _mm512_fmadd_ps(c256, _mm512_and_ps(a, absmask), _mm512_add_ps(mag, ql));
  }
  alignas(64) float av[16], mv[16];
  _mm512_store_ps(av, acc);
  _mm512_store_ps(mv, mag);
  const double sum = reduce16(av), mm = reduce16(mv);
  return sum + 2.0 * double(3 * padded_dim + 64) * 0x1p-24 * (mm * 1.01 + 1e-30);
}
CERTATTN_ARCH_END
#endif

inline double refine8_bound(const float* q, const float* lo, const float* st,
                            const std::uint8_t* code, std::size_t padded_dim, isa which) noexcept {
#if CERTATTN_X86
  if (which == isa::kAvx512Vnni) return refine8_avx512(q, lo, st, code, padded_dim);
#endif
  (void)which;
  return refine8_scalar(q, lo, st, code, padded_dim);
}

}  // namespace certattn::detail
