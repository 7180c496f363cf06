// Row decoders of the quantized cache formats (formats.hpp) on AVX-512 and AVX2. Every
// decoded float is exact or one correctly rounded product (an fp8 value times the view's
// scale), so each ISA gives the bits of decode_row_scalar(), which defines them.
#pragma once

#include <certattn/arch/dispatch.hpp>
#include <certattn/formats.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include <certattn/arch/macros.hpp>

namespace certattn::detail {

#if CERTATTN_X86
CERTATTN_ARCH_BEGIN
/// The channels of a quantized row as 16-float vectors on AVX-512, with the bits of
/// decode_row_scalar(): the row decoder's and the AVX-512 dense kernel's one decoder, made
/// once per call (it holds the view's fp8 scale). Every value is exact or one correctly
/// rounded product, so the cheaper instruction sequences below change no bit:
///   q8_0  one fp16 scale per 32 channels, widened once for both halves: d * q, exact;
///   q4_0  a table of the block's 16 values d * (n - 8) (exact products), looked up by
///         each nibble (vpermps reads an index's low 4 bits, so the low nibbles need no
///         mask and the high ones one shift);
///   e5m2  the high byte of a binary16;
///   e4m3  exponent and mantissa shifted into a binary16's, which is the value times 2^-8
///         (subnormals included; the sign-extended byte shifted by 7 puts the sign in bit
///         15 and a copy in bit 14, which is cleared); S.1111.111 is NaN. The 2^8 moves
///         into the scale: fl(scale 2^8 * v 2^-8) = fl(scale v) while scale 2^8 is finite.
template <quantized_element T>
struct avx512_decoder {
  __m512 scale;           // fp8: the view's scale (times 2^8 for e4m3 when prescaled)
  bool prescaled = true;  // e4m3: scale * 2^8 is finite

  CERTATTN_TARGET_AVX512 explicit avx512_decoder(float s) {
    if constexpr (std::is_same_v<T, fp8_e4m3>) {
      prescaled = s * 256.0f <= std::numeric_limits<float>::max();
      if (prescaled) s *= 256.0f;
    }
    scale = _mm512_set1_ps(s);
  }

  /// Channels [c, c + 16), c a multiple of 16.
  CERTATTN_TARGET_AVX512 __m512 load16(const T* row, std::size_t c) const {
    if constexpr (std::is_same_v<T, block_q8_0>) {
      const block_q8_0& b = row[c / 32];
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + c % 32));
      return _mm512_mul_ps(block_scale(b), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
    } else if constexpr (std::is_same_v<T, block_q4_0>) {
      const block_q4_0& b = row[c / 32];
      __m512i n = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs)));
      if (c % 32 != 0) n = _mm512_srli_epi32(n, 4);
      return _mm512_permutexvar_ps(n, q4_table(b));
    } else {
      return fp8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c)));
    }
  }

  /// The channels of mask m only (zeros elsewhere, nothing read past them).
  CERTATTN_TARGET_AVX512 __m512 load16_masked(const T* row, std::size_t c, __mmask16 m) const {
    if constexpr (std::is_same_v<T, block_q8_0> || std::is_same_v<T, block_q4_0>)
      return _mm512_maskz_mov_ps(m, load16(row, c));  // a block row holds whole blocks
    else
      return _mm512_maskz_mov_ps(m, fp8(_mm_maskz_loadu_epi8(m, row + c)));
  }

  /// Channels [c, c + 32), c a multiple of 32: lo the first 16, hi the next.
  CERTATTN_TARGET_AVX512 void load32(const T* row, std::size_t c, __m512& lo, __m512& hi) const {
    if constexpr (std::is_same_v<T, block_q8_0>) {
      const block_q8_0& b = row[c / 32];
      const __m512 d = block_scale(b);
      lo = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs)))));
      hi = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 16)))));
    } else if constexpr (std::is_same_v<T, block_q4_0>) {
      const block_q4_0& b = row[c / 32];
      const __m512 table = q4_table(b);
      const __m512i n =
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs)));
      lo = _mm512_permutexvar_ps(n, table);
      hi = _mm512_permutexvar_ps(_mm512_srli_epi32(n, 4), table);
    } else {
      lo = load16(row, c);
      hi = load16(row, c + 16);
    }
  }

 private:
  template <class B>
  CERTATTN_TARGET_AVX512 static __m512 block_scale(const B& b) {
    std::uint16_t bits;
    std::memcpy(&bits, &b.d, 2);
    return _mm512_cvtph_ps(_mm256_set1_epi16(short(bits)));
  }
  CERTATTN_TARGET_AVX512 static __m512 q4_table(const block_q4_0& b) {
    const __m512 n_minus_8 = _mm512_setr_ps(-8.0f, -7.0f, -6.0f, -5.0f, -4.0f, -3.0f, -2.0f, -1.0f,
                                            0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f);
    return _mm512_mul_ps(block_scale(b), n_minus_8);
  }
  /// Sixteen fp8 codes times the view's scale.
  CERTATTN_TARGET_AVX512 __m512 fp8(__m128i code) const {
    if constexpr (std::is_same_v<T, fp8_e5m2>) {
      const __m256i h = _mm256_slli_epi16(_mm256_cvtepu8_epi16(code), 8);
      return _mm512_mul_ps(scale, _mm512_cvtph_ps(h));
    } else {
      const __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(code), 7),
                                         _mm256_set1_epi16(short(0xBFFF)));
      __m512 v = _mm512_cvtph_ps(h);
      if (!prescaled) v = _mm512_mul_ps(v, _mm512_set1_ps(256.0f));
      const __mmask16 nan = _mm_cmpeq_epi8_mask(_mm_or_si128(code, _mm_set1_epi8(char(0x80))),
                                                _mm_set1_epi8(char(0xFF)));
      return _mm512_mask_mul_ps(_mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()),
                                __mmask16(~nan), scale, v);
    }
  }
};

template <quantized_element T>
CERTATTN_TARGET_AVX512 inline void decode_row_avx512(const T* row, std::size_t dim, float scale,
                                                     float* out) noexcept {
  const avx512_decoder<T> dec(scale);
  std::size_t i = 0;
  for (; i + 32 <= dim; i += 32) {
    __m512 lo, hi;
    dec.load32(row, i, lo, hi);
    _mm512_storeu_ps(out + i, lo);
    _mm512_storeu_ps(out + i + 16, hi);
  }
  for (; i < dim; i += 16) {  // fp8 rows only: block rows hold whole blocks
    const __mmask16 m = dim - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (dim - i)) - 1u);
    _mm512_mask_storeu_ps(out + i, m, dec.load16_masked(row, i, m));
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
