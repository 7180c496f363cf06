// AVX-512 VNNI 4-bit scan: one 64-byte load holds 4 channels (low nibbles) and the next 4
// (high nibbles) of 16 tokens, one token per 32-bit lane; _mm512_dpbusd_epi32 multiplies
// the unsigned codes by the broadcast int8 query and sums each lane's 4 products, so no
// horizontal sum is needed. Codes are loaded once per chunk of up to 4 queries.
#pragma once

#include <certattn/arch/dispatch.hpp>
#include <certattn/arch/scan_prep.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>

#if CERTATTN_X86
CERTATTN_ARCH_BEGIN
namespace certattn::detail::avx512 {

template <int NQ>
CERTATTN_TARGET_AVX512 inline void scan_group(const std::uint8_t* codes, const std::uint8_t* rho,
                                              std::size_t n_oct,
                                              const std::int8_t* qa, std::size_t padded_dim,
                                              const block_query_prep* prep, float* u,
                                              std::size_t u_stride) noexcept {
  __m512i acc[NQ];
  _Pragma("GCC unroll 8")
  for (int g = 0; g < NQ; ++g) acc[g] = _mm512_setzero_si512();
  const __m512i mask = _mm512_set1_epi8(0x0F);
  for (std::size_t o = 0; o < n_oct; ++o) {
    const __m512i x = _mm512_loadu_si512(codes + o * 64);
    const __m512i lo = _mm512_and_si512(x, mask);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), mask);
    _Pragma("GCC unroll 8")
    for (int g = 0; g < NQ; ++g) {
      std::int32_t wl, wh;
      std::memcpy(&wl, qa + g * padded_dim + 8 * o, 4);
      std::memcpy(&wh, qa + g * padded_dim + 8 * o + 4, 4);
      acc[g] = _mm512_dpbusd_epi32(acc[g], lo, _mm512_set1_epi32(wl));
      acc[g] = _mm512_dpbusd_epi32(acc[g], hi, _mm512_set1_epi32(wh));
    }
  }
  const __m512 rb = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(
      reinterpret_cast<const __m128i*>(rho))));
  _Pragma("GCC unroll 8")
  for (int g = 0; g < NQ; ++g) {
    const __m512 r = _mm512_fmadd_ps(_mm512_set1_ps(prep[g].alpha), _mm512_cvtepi32_ps(acc[g]),
                                     _mm512_set1_ps(prep[g].offset));
    const __m512 t = _mm512_min_ps(_mm512_set1_ps(prep[g].holder),
                                   _mm512_mul_ps(_mm512_set1_ps(prep[g].norm), rb));
    _mm512_storeu_ps(u + g * u_stride, _mm512_add_ps(r, t));
  }
}

/// prepare_block_query() (arch/scan_prep.hpp) with the 8 double lanes in one register:
/// lane l accumulates channels l, l + 8, ... in the same order, products are exact, and
/// the final reduce8() is shared, so the result is the same bits.
CERTATTN_TARGET_AVX512 inline block_query_prep prepare_block_query_avx512(
    const float* lo, const float* st, const float* q, std::size_t padded_dim, double scale,
    std::int8_t* qa) noexcept {
  __m512d amax_v = _mm512_setzero_pd();
  for (std::size_t o = 0; o < padded_dim; o += 8) {
    const __m512d a = _mm512_mul_pd(_mm512_cvtps_pd(_mm256_loadu_ps(q + o)),
                                    _mm512_cvtps_pd(_mm256_loadu_ps(st + o)));
    amax_v = _mm512_max_pd(amax_v, _mm512_abs_pd(a));
  }
  const double amax = _mm512_reduce_max_pd(amax_v);
  block_query_prep out;
  if (amax == 0.0) std::memset(qa, 0, padded_dim);
  const float alpha = amax > 0.0 ? round_up_to_float(amax / 127.0) : 0.0f;
  const double inv = amax > 0.0 ? 1.0 / double(alpha) : 0.0;
  const __m512d vinv = _mm512_set1_pd(inv), valpha = _mm512_set1_pd(double(alpha));
  const __m512d lim = _mm512_set1_pd(127.0), zero = _mm512_setzero_pd();
  __m512d s_ql = zero, s_qlabs = zero, s_a = zero, s_abs = zero, s_epos = zero, s_a2 = zero;
  for (std::size_t o = 0; o < padded_dim; o += 8) {
    const __m512d qd = _mm512_cvtps_pd(_mm256_loadu_ps(q + o));
    const __m512d a = _mm512_mul_pd(qd, _mm512_cvtps_pd(_mm256_loadu_ps(st + o)));
    const __m512d ql = _mm512_mul_pd(qd, _mm512_cvtps_pd(_mm256_loadu_ps(lo + o)));
    __m512d r = _mm512_roundscale_pd(_mm512_mul_pd(a, vinv),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm512_min_pd(_mm512_max_pd(r, _mm512_sub_pd(zero, lim)), lim);
    if (amax > 0.0) {
      const __m256i ri = _mm512_cvtpd_epi32(r);
      const __m128i rb = _mm256_cvtepi32_epi8(ri);
      std::memcpy(qa + o, &rb, 8);
    }
    const __m512d e = _mm512_fnmadd_pd(valpha, r, a);
    s_ql = _mm512_add_pd(s_ql, ql);
    s_qlabs = _mm512_add_pd(s_qlabs, _mm512_abs_pd(ql));
    s_a = _mm512_add_pd(s_a, a);
    s_abs = _mm512_add_pd(s_abs, _mm512_abs_pd(a));
    s_a2 = _mm512_fmadd_pd(a, a, s_a2);
    s_epos = _mm512_add_pd(s_epos, _mm512_max_pd(e, zero));
  }
  alignas(64) double l_ql[8], l_qlabs[8], l_a[8], l_abs[8], l_epos[8], l_a2[8];
  _mm512_store_pd(l_ql, s_ql);
  _mm512_store_pd(l_qlabs, s_qlabs);
  _mm512_store_pd(l_a, s_a);
  _mm512_store_pd(l_abs, s_abs);
  _mm512_store_pd(l_epos, s_epos);
  _mm512_store_pd(l_a2, s_a2);
  (void)out;
  return finish_prep(alpha, scale, reduce8(l_ql), reduce8(l_a), reduce8(l_epos),
                     reduce8(l_qlabs), reduce8(l_abs), reduce8(l_a2), padded_dim);
}

CERTATTN_TARGET_AVX512 inline void scan_block(const std::uint8_t* codes, const std::uint8_t* rho,
                                              std::size_t padded_dim,
                                              const std::int8_t* qa,
                                              const block_query_prep* prep, std::size_t nq,
                                              float* u, std::size_t u_stride) noexcept {
  const std::size_t n_oct = padded_dim / 8;
  for (std::size_t grp = 0; grp < kGroupsPerBlock; ++grp) {
    const std::uint8_t* c = codes + grp * n_oct * 64;
    float* ug = u + grp * 16;
    std::size_t g = 0;
    for (; g + 4 <= nq; g += 4)
      scan_group<4>(c, rho + grp * 16, n_oct, qa + g * padded_dim, padded_dim, prep + g, ug + g * u_stride,
                    u_stride);
    switch (nq - g) {
      case 3: scan_group<3>(c, rho + grp * 16, n_oct, qa + g * padded_dim, padded_dim, prep + g, ug + g * u_stride, u_stride); break;
      case 2: scan_group<2>(c, rho + grp * 16, n_oct, qa + g * padded_dim, padded_dim, prep + g, ug + g * u_stride, u_stride); break;
      case 1: scan_group<1>(c, rho + grp * 16, n_oct, qa + g * padded_dim, padded_dim, prep + g, ug + g * u_stride, u_stride); break;
      default: break;
    }
  }
}

}  // namespace certattn::detail::avx512
CERTATTN_ARCH_END
#endif
