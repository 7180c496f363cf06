// AVX2 4-bit scan (no VNNI): _mm256_maddubs_epi16 multiplies unsigned codes by the int8
// query and adds pairs (at most 2 * 15 * 127 = 3810: no saturation), _mm256_madd_epi16
// with ones adds the pairs into 32-bit lanes: the same exact integer dot as dpbusd.
#pragma once

#include <certattn/arch/dispatch.hpp>
#include <certattn/arch/scan_prep.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>

#if CERTATTN_X86
CERTATTN_ARCH_BEGIN
namespace certattn::detail::avx2 {

template <int NQ>
CERTATTN_TARGET_AVX2 inline void scan_group(const std::uint8_t* codes, const std::uint8_t* rho,
                                            std::size_t n_oct,
                                            const std::int8_t* qa, std::size_t padded_dim,
                                            const block_query_prep* prep, float* u,
                                            std::size_t u_stride) noexcept {
  __m256i acc[NQ][2];
  _Pragma("GCC unroll 8")
  for (int g = 0; g < NQ; ++g) acc[g][0] = acc[g][1] = _mm256_setzero_si256();
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  for (std::size_t o = 0; o < n_oct; ++o) {
    for (int h = 0; h < 2; ++h) {
      const __m256i x =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + o * 64 + h * 32));
      const __m256i lo = _mm256_and_si256(x, mask);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), mask);
      _Pragma("GCC unroll 8")
      for (int g = 0; g < NQ; ++g) {
        std::int32_t wl, wh;
        std::memcpy(&wl, qa + g * padded_dim + 8 * o, 4);
        std::memcpy(&wh, qa + g * padded_dim + 8 * o + 4, 4);
        const __m256i pl = _mm256_maddubs_epi16(lo, _mm256_set1_epi32(wl));
        const __m256i ph = _mm256_maddubs_epi16(hi, _mm256_set1_epi32(wh));
        acc[g][h] = _mm256_add_epi32(acc[g][h], _mm256_madd_epi16(pl, ones));
        acc[g][h] = _mm256_add_epi32(acc[g][h], _mm256_madd_epi16(ph, ones));
      }
    }
  }
  for (int h = 0; h < 2; ++h) {
    std::int64_t rb8;
    std::memcpy(&rb8, rho + h * 8, 8);
    const __m256 rb = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(rb8)));
    _Pragma("GCC unroll 8")
    for (int g = 0; g < NQ; ++g) {
      const __m256 r =
          _mm256_fmadd_ps(_mm256_set1_ps(prep[g].alpha), _mm256_cvtepi32_ps(acc[g][h]),
                          _mm256_set1_ps(prep[g].offset));
      const __m256 t = _mm256_min_ps(_mm256_set1_ps(prep[g].holder),
                                     _mm256_mul_ps(_mm256_set1_ps(prep[g].norm), rb));
      _mm256_storeu_ps(u + g * u_stride + h * 8, _mm256_add_ps(r, t));
    }
  }
}

CERTATTN_TARGET_AVX2 inline void scan_block(const std::uint8_t* codes, const std::uint8_t* rho,
                                            std::size_t padded_dim,
                                            const std::int8_t* qa, const block_query_prep* prep,
                                            std::size_t nq, float* u,
                                            std::size_t u_stride) noexcept {
  const std::size_t n_oct = padded_dim / 8;
  for (std::size_t grp = 0; grp < kGroupsPerBlock; ++grp) {
    const std::uint8_t* c = codes + grp * n_oct * 64;
    float* ug = u + grp * 16;
    std::size_t g = 0;
    for (; g + 2 <= nq; g += 2)
      scan_group<2>(c, rho + grp * 16, n_oct, qa + g * padded_dim, padded_dim, prep + g, ug + g * u_stride,
                    u_stride);
    if (g < nq)
      scan_group<1>(c, rho + grp * 16, n_oct, qa + g * padded_dim, padded_dim, prep + g, ug + g * u_stride,
                    u_stride);
  }
}

}  // namespace certattn::detail::avx2
CERTATTN_ARCH_END
#endif
