// Row decoders of the quantized cache formats (formats.hpp) on AVX-512 and AVX2. Every
// decoded float is exact or one correctly rounded product (an fp8 value times the view's
// scale), so each ISA gives the bits of decode_row_scalar(), which defines them.
#pragma once

#include <certattn/arch/dispatch.hpp>
#include <certattn/formats.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <certattn/arch/macros.hpp>

namespace certattn::detail {

#if CERTATTN_X86
CERTATTN_ARCH_BEGIN
/// Sixteen fp8 codes (widened to 16 bits) as the floats they stand for, before the view's
/// scale: E5M2 is the high byte of a binary16; E4M3's exponent and mantissa shift into a
/// binary16's (times 2^8, exact, subnormals included) and S.1111.111 is NaN. The row
/// decoder and the AVX-512 dense kernel both use it.
CERTATTN_TARGET_AVX512 inline __m512 fp8_to_float_avx512(fp8_e5m2, __m256i code) {
  return _mm512_cvtph_ps(_mm256_slli_epi16(code, 8));
}
CERTATTN_TARGET_AVX512 inline __m512 fp8_to_float_avx512(fp8_e4m3, __m256i code) {
  const __m256i mag = _mm256_and_si256(code, _mm256_set1_epi16(0x7F));
  const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(code, _mm256_set1_epi16(0x80)), 8),
                                    _mm256_slli_epi16(mag, 7));
  const __m512 v = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
  return _mm512_mask_mov_ps(v, _mm256_cmpeq_epi16_mask(mag, _mm256_set1_epi16(0x7F)),
                            _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()));
}

template <quantized_element T>
CERTATTN_TARGET_AVX512 inline void decode_row_avx512(const T* row, std::size_t dim, float scale,
                                                     float* out) noexcept {
  if constexpr (std::is_same_v<T, block_q8_0>) {
    for (std::size_t b = 0; b < dim / 32; ++b) {
      const __m512 d = _mm512_set1_ps(float(row[b].d));
      const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row[b].qs));
      const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row[b].qs + 16));
      _mm512_storeu_ps(out + 32 * b, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo))));
      _mm512_storeu_ps(out + 32 * b + 16,
                       _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi))));
    }
  } else if constexpr (std::is_same_v<T, block_q4_0>) {
    const __m128i nibble = _mm_set1_epi8(0x0F);
    const __m512i eight = _mm512_set1_epi32(8);
    for (std::size_t b = 0; b < dim / 32; ++b) {
      const __m512 d = _mm512_set1_ps(float(row[b].d));
      const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row[b].qs));
      const __m128i lo = _mm_and_si128(x, nibble), hi = _mm_and_si128(_mm_srli_epi16(x, 4), nibble);
      // (A lambda would not inherit the function's target.)
      _mm512_storeu_ps(out + 32 * b, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(
                                                          _mm512_cvtepu8_epi32(lo), eight))));
      _mm512_storeu_ps(out + 32 * b + 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(
                                                               _mm512_cvtepu8_epi32(hi), eight))));
    }
  } else {
    const __m512 s = _mm512_set1_ps(scale);
    std::size_t i = 0;
    for (; i + 16 <= dim; i += 16) {
      const __m256i c = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + i)));
      _mm512_storeu_ps(out + i, _mm512_mul_ps(s, fp8_to_float_avx512(T{}, c)));
    }
    decode_row_scalar(row + i, dim - i, scale, out + i);
  }
}

template <quantized_element T>
CERTATTN_TARGET_AVX2 inline void decode_row_avx2(const T* row, std::size_t dim, float scale,
                                                 float* out) noexcept {
  if constexpr (std::is_same_v<T, block_q8_0>) {
    for (std::size_t b = 0; b < dim / 32; ++b) {
      const __m256 d = _mm256_set1_ps(float(row[b].d));
      for (std::size_t k = 0; k < 32; k += 8) {
        const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row[b].qs + k));
        _mm256_storeu_ps(out + 32 * b + k, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
      }
    }
  } else if constexpr (std::is_same_v<T, block_q4_0>) {
    const __m128i nibble = _mm_set1_epi8(0x0F);
    const __m256i eight = _mm256_set1_epi32(8);
    for (std::size_t b = 0; b < dim / 32; ++b) {
      const __m256 d = _mm256_set1_ps(float(row[b].d));
      const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row[b].qs));
      const __m128i lo = _mm_and_si128(x, nibble), hi = _mm_and_si128(_mm_srli_epi16(x, 4), nibble);
      const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
      for (int k = 0; k < 4; ++k)
        _mm256_storeu_ps(out + 32 * b + 8 * k,
                         _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(
                                              _mm256_cvtepu8_epi32(parts[k]), eight))));
    }
  } else {
    const __m256 s = _mm256_set1_ps(scale);
    std::size_t i = 0;
    for (; i + 8 <= dim; i += 8) {
      const __m128i c = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + i)));
      __m256 v;
      if constexpr (std::is_same_v<T, fp8_e5m2>) {
        v = _mm256_cvtph_ps(_mm_slli_epi16(c, 8));
      } else {
        const __m128i mag = _mm_and_si128(c, _mm_set1_epi16(0x7F));
        const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(c, _mm_set1_epi16(0x80)), 8),
                                       _mm_slli_epi16(mag, 7));
        v = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
        const __m128i nan16 = _mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7F));
        const __m256 nan = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(nan16));
        v = _mm256_blendv_ps(v, _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN()), nan);
      }
      _mm256_storeu_ps(out + i, _mm256_mul_ps(s, v));
    }
    decode_row_scalar(row + i, dim - i, scale, out + i);
  }
}
CERTATTN_ARCH_END
#endif

/// The `dim` channels of a quantized row as floats, on the ISA active now (the same bits
/// on each). `scale` is the view's fp8 scale (1 for the block formats).
template <quantized_element T>
inline void decode_row(const T* row, std::size_t dim, float scale, float* out) noexcept {
#if CERTATTN_X86
  switch (active_isa()) {
    case isa::kAvx512Vnni: return decode_row_avx512(row, dim, scale, out);
    case isa::kAvx2: return decode_row_avx2(row, dim, scale, out);
    case isa::kScalar: break;
  }
#endif
  decode_row_scalar(row, dim, scale, out);
}

}  // namespace certattn::detail

#include <certattn/arch/macros_undef.hpp>
