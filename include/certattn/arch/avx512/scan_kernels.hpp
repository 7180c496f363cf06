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
CERTATTN_TARGET_AVX512 inline void scan_group(const std::uint8_t* codes, std::size_t n_oct,
                                              const std::int8_t* qa, std::size_t padded_dim,
                                              const block_query_prep* prep, float* u,
                                              std::size_t u_stride) noexcept {
  __m512i acc[NQ];
  for (int g = 0; g < NQ; ++g) acc[g] = _mm512_setzero_si512();
  const __m512i mask = _mm512_set1_epi8(0x0F);
  for (std::size_t o = 0; o < n_oct; ++o) {
    const __m512i x = _mm512_loadu_si512(codes + o * 64);
    const __m512i lo = _mm512_and_si512(x, mask);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), mask);
    for (int g = 0; g < NQ; ++g) {
      std::int32_t wl, wh;
      std::memcpy(&wl, qa + g * padded_dim + 8 * o, 4);
      std::memcpy(&wh, qa + g * padded_dim + 8 * o + 4, 4);
      acc[g] = _mm512_dpbusd_epi32(acc[g], lo, _mm512_set1_epi32(wl));
      acc[g] = _mm512_dpbusd_epi32(acc[g], hi, _mm512_set1_epi32(wh));
    }
  }
  for (int g = 0; g < NQ; ++g) {
    const __m512 r = _mm512_fmadd_ps(_mm512_set1_ps(prep[g].alpha), _mm512_cvtepi32_ps(acc[g]),
                                     _mm512_set1_ps(prep[g].offset));
    _mm512_storeu_ps(u + g * u_stride, r);
  }
}

CERTATTN_TARGET_AVX512 inline void scan_block(const std::uint8_t* codes, std::size_t padded_dim,
                                              const std::int8_t* qa,
                                              const block_query_prep* prep, std::size_t nq,
                                              float* u, std::size_t u_stride) noexcept {
  const std::size_t n_oct = padded_dim / 8;
  for (std::size_t grp = 0; grp < 8; ++grp) {
    const std::uint8_t* c = codes + grp * n_oct * 64;
    float* ug = u + grp * 16;
    std::size_t g = 0;
    for (; g + 4 <= nq; g += 4)
      scan_group<4>(c, n_oct, qa + g * padded_dim, padded_dim, prep + g, ug + g * u_stride,
                    u_stride);
    switch (nq - g) {
      case 3: scan_group<3>(c, n_oct, qa + g * padded_dim, padded_dim, prep + g, ug + g * u_stride, u_stride); break;
      case 2: scan_group<2>(c, n_oct, qa + g * padded_dim, padded_dim, prep + g, ug + g * u_stride, u_stride); break;
      case 1: scan_group<1>(c, n_oct, qa + g * padded_dim, padded_dim, prep + g, ug + g * u_stride, u_stride); break;
      default: break;
    }
  }
}

}  // namespace certattn::detail::avx512
CERTATTN_ARCH_END
#endif
