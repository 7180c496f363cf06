// Exact scores q.k in double with 8 fixed lanes (channel mod 8) and one fixed reduction
// tree. Products of a float and a 16-bit or float element are exact in double, so fused
// and unfused multiply-adds agree: the reference and every fast path get the same bits,
// hence the same sample sets.
#pragma once

#include <certattn/arch/dispatch.hpp>
#include <certattn/arch/portable.hpp>
#include <certattn/arch/scan_prep.hpp>
#include <certattn/common.hpp>

#include <cstddef>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <type_traits>

#include <certattn/arch/macros.hpp>

namespace certattn::detail {

template <class T>
inline double score_dot(const float* q, const T* k, std::size_t d) noexcept {
  double acc[8] = {};
  std::size_t o = 0;
  for (; o + 8 <= d; o += 8)
    for (std::size_t l = 0; l < 8; ++l) acc[l] += double(q[o + l]) * to_double(k[o + l]);
  for (std::size_t l = 0; o + l < d; ++l) acc[l] += double(q[o + l]) * to_double(k[o + l]);
  return reduce8(acc);
}

#if CERTATTN_X86
CERTATTN_ARCH_BEGIN
/// The same lanes for fp16 keys with F16C + AVX-512 (the main path).
CERTATTN_TARGET_AVX512 inline double score_dot_avx512(const float* q, const half* k,
                                                      std::size_t d) noexcept {
  __m512d acc = _mm512_setzero_pd();
  std::size_t o = 0;
  for (; o + 8 <= d; o += 8) {
    __m128i h;
    std::memcpy(&h, k + o, 16);
    const __m512d kd = _mm512_cvtps_pd(_mm256_cvtph_ps(h));
    const __m512d qd = _mm512_cvtps_pd(_mm256_loadu_ps(q + o));
    acc = _mm512_fmadd_pd(qd, kd, acc);
  }
  alignas(64) double lanes[8];
  _mm512_store_pd(lanes, acc);
  for (std::size_t l = 0; o + l < d; ++l) lanes[l] += double(q[o + l]) * to_double(k[o + l]);
  return reduce8(lanes);
}
/// score_dot_avx512() of 8 keys at once (d a multiple of 8), the same bits for each: the
/// 8 lane chains run interleaved, and one transposed tree performs for every key exactly
/// the additions of reduce8(): e_i = a_i + a_{i+4}, then (e_0 + e_2) + (e_1 + e_3).
CERTATTN_TARGET_AVX512 inline void score_dot8_avx512(const float* q, const half* const* k,
                                                     std::size_t d, double* dot) noexcept {
  __m512d acc[8];
  _Pragma("GCC unroll 8")
  for (int j = 0; j < 8; ++j) acc[j] = _mm512_setzero_pd();
  for (std::size_t o = 0; o < d; o += 8) {
    const __m512d qd = _mm512_cvtps_pd(_mm256_loadu_ps(q + o));
    _Pragma("GCC unroll 8")
    for (int j = 0; j < 8; ++j) {
      __m128i h;
      std::memcpy(&h, k[j] + o, 16);
      acc[j] = _mm512_fmadd_pd(qd, _mm512_cvtps_pd(_mm256_cvtph_ps(h)), acc[j]);
    }
  }
  // e: lanes 0-3 of x[m] hold key 2m's e, lanes 4-7 key 2m + 1's.
  __m512d x[4];
  _Pragma("GCC unroll 4")
  for (int m = 0; m < 4; ++m)
    x[m] = _mm512_add_pd(_mm512_shuffle_f64x2(acc[2 * m], acc[2 * m + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f64x2(acc[2 * m], acc[2 * m + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  // (e0 + e2, e1 + e3): pair p of z[h] (128 bits) holds key 4h + p's.
  __m512d z[2];
  _Pragma("GCC unroll 2")
  for (int h = 0; h < 2; ++h)
    z[h] = _mm512_add_pd(_mm512_shuffle_f64x2(x[2 * h], x[2 * h + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f64x2(x[2 * h], x[2 * h + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  // Element 2p + e: key p (e = 0) or key 4 + p (e = 1).
  const __m512d f = _mm512_add_pd(_mm512_unpacklo_pd(z[0], z[1]), _mm512_unpackhi_pd(z[0], z[1]));
  _mm512_storeu_pd(dot, _mm512_permutexvar_pd(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), f));
}
CERTATTN_ARCH_END
#endif

/// acc[i] += w v[i] (fused) for one value row, returning ||v||^2 in 8 fixed lanes: the
/// vector kernel below gives the same bits.
template <class T>
inline double accumulate_row_scalar(const T* v, std::size_t d, double w, double* acc) noexcept {
  double sq[8] = {};
  for (std::size_t i = 0; i < d; ++i) {
    const double x = to_double(v[i]);
    acc[i] = std::fma(w, x, acc[i]);
    sq[i % 8] += x * x;  // exact product
  }
  return reduce8(sq);
}

#if CERTATTN_X86
CERTATTN_ARCH_BEGIN
template <class T>
CERTATTN_TARGET_AVX512 inline __m512d load8_as_double(const T* p) noexcept {
  if constexpr (std::is_same_v<T, half>) {
    __m128i h;
    std::memcpy(&h, p, 16);
    return _mm512_cvtps_pd(_mm256_cvtph_ps(h));
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    __m128i h;
    std::memcpy(&h, p, 16);
    return _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
  } else {
    return _mm512_cvtps_pd(_mm256_loadu_ps(reinterpret_cast<const float*>(p)));
  }
}

template <class T>
CERTATTN_TARGET_AVX512 inline double accumulate_row_avx512(const T* v, std::size_t d, double w,
                                                           double* acc) noexcept {
  const __m512d wv = _mm512_set1_pd(w);
  __m512d sq = _mm512_setzero_pd();
  std::size_t o = 0;
  for (; o + 8 <= d; o += 8) {
    const __m512d x = load8_as_double(v + o);
    _mm512_storeu_pd(acc + o, _mm512_fmadd_pd(wv, x, _mm512_loadu_pd(acc + o)));
    sq = _mm512_fmadd_pd(x, x, sq);
  }
  alignas(64) double lanes[8];
  _mm512_store_pd(lanes, sq);
  for (std::size_t l = 0; o + l < d; ++l) {
    const double x = to_double(v[o + l]);
    acc[o + l] = std::fma(w, x, acc[o + l]);
    lanes[l] += x * x;
  }
  return reduce8(lanes);
}
CERTATTN_ARCH_END
#endif

/// The dispatch: AVX-512 where selected, else the portable kernel (arch/portable.hpp) where
/// the build's target has a fused multiply-add, else the scalar twin. The same bits on each.
template <class T>
inline double accumulate_row(const T* v, std::size_t d, double w, double* acc, isa which) noexcept {
#if CERTATTN_X86
  if constexpr (storage_element<T>)
    if (which == isa::kAvx512Vnni) return accumulate_row_avx512(v, d, w, acc);
#endif
  (void)which;
#if CERTATTN_PORTABLE_SIMD
  if constexpr (portable::portable_has_fma && storage_element<T>)
    return portable::accumulate_row(v, d, w, acc);
#endif
  return accumulate_row_scalar(v, d, w, acc);
}

/// The norms a centred accumulation returns: ||v||^2 and ||v - g||^2.
struct row_norms {
  double sq = 0.0;
  double centered_sq = 0.0;
};

/// acc[i] += w (v[i] - g[i]) (fused) for one value row, returning ||v||^2 and
/// ||v - g||^2, each in 8 fixed lanes (explicit fmas: the vector kernel below gives the
/// same bits). The certificate's sums are deviations from the index's value centre g:
/// sums of raw values cancel catastrophically when the values share a large offset.
template <class T>
inline row_norms accumulate_centered_row_scalar(const T* v, std::size_t d, double w,
                                                const double* g, double* acc) noexcept {
  double sq[8] = {}, sc[8] = {};
  for (std::size_t i = 0; i < d; ++i) {
    const double x = to_double(v[i]);
    const double y = x - g[i];
    acc[i] = std::fma(w, y, acc[i]);
    sq[i % 8] = std::fma(x, x, sq[i % 8]);
    sc[i % 8] = std::fma(y, y, sc[i % 8]);
  }
  return {reduce8(sq), reduce8(sc)};
}

#if CERTATTN_X86
CERTATTN_ARCH_BEGIN
template <class T>
CERTATTN_TARGET_AVX512 inline row_norms accumulate_centered_row_avx512(const T* v, std::size_t d,
                                                                      double w, const double* g,
                                                                      double* acc) noexcept {
  const __m512d wv = _mm512_set1_pd(w);
  __m512d sq = _mm512_setzero_pd(), sc = _mm512_setzero_pd();
  std::size_t o = 0;
  for (; o + 8 <= d; o += 8) {
    const __m512d x = load8_as_double(v + o);
    const __m512d y = _mm512_sub_pd(x, _mm512_loadu_pd(g + o));
    _mm512_storeu_pd(acc + o, _mm512_fmadd_pd(wv, y, _mm512_loadu_pd(acc + o)));
    sq = _mm512_fmadd_pd(x, x, sq);
    sc = _mm512_fmadd_pd(y, y, sc);
  }
  alignas(64) double lq[8], lc[8];
  _mm512_store_pd(lq, sq);
  _mm512_store_pd(lc, sc);
  for (std::size_t l = 0; o + l < d; ++l) {
    const double x = to_double(v[o + l]);
    const double y = x - g[o + l];
    acc[o + l] = std::fma(w, y, acc[o + l]);
    lq[l] = std::fma(x, x, lq[l]);
    lc[l] = std::fma(y, y, lc[l]);
  }
  return {reduce8(lq), reduce8(lc)};
}
CERTATTN_ARCH_END
#endif

template <class T>
inline row_norms accumulate_centered_row(const T* v, std::size_t d, double w, const double* g,
                                         double* acc, isa which) noexcept {
#if CERTATTN_X86
  if constexpr (storage_element<T>)
    if (which == isa::kAvx512Vnni) return accumulate_centered_row_avx512(v, d, w, g, acc);
#endif
  (void)which;
#if CERTATTN_PORTABLE_SIMD
  if constexpr (portable::portable_has_fma && storage_element<T>) {
    row_norms r;
    portable::accumulate_centered_row(v, d, w, g, acc, &r.sq, &r.centered_sq);
    return r;
  }
#endif
  return accumulate_centered_row_scalar(v, d, w, g, acc);
}

/// A row of 16-bit or float elements as floats (exact), with F16C where the CPU has it.
#if CERTATTN_X86
CERTATTN_ARCH_BEGIN
CERTATTN_TARGET_AVX2 inline void half_row_to_float_f16c(const half* x, float* out,
                                                        std::size_t d) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= d; i += 8) {
    __m128i h;
    std::memcpy(&h, x + i, 16);
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < d; ++i) out[i] = float(x[i]);
}
CERTATTN_ARCH_END
#endif

template <class T>
inline void row_to_float(const T* x, float* out, std::size_t d) noexcept {
#if CERTATTN_X86
  if constexpr (std::is_same_v<T, half>)
    if (active_isa() != isa::kScalar) return half_row_to_float_f16c(x, out, d);
#endif
  if constexpr (std::is_same_v<T, bfloat16>) {
    for (std::size_t i = 0; i < d; ++i) {  // bf16 is the top half of a float
      std::uint16_t b;
      std::memcpy(&b, x + i, 2);
      const std::uint32_t u = std::uint32_t(b) << 16;
      std::memcpy(out + i, &u, 4);
    }
  } else {
    for (std::size_t i = 0; i < d; ++i) out[i] = to_float(x[i]);
  }
}

/// score_dot()'s bits: AVX-512 for fp16 keys where selected, else the portable kernel.
template <class T>
inline double score_dot_fast(const float* q, const T* k, std::size_t d, isa which) noexcept {
#if CERTATTN_X86
  if constexpr (std::is_same_v<T, half>)
    if (which == isa::kAvx512Vnni) return score_dot_avx512(q, k, d);
#endif
  (void)which;
#if CERTATTN_PORTABLE_SIMD
  if constexpr (storage_element<T> && (portable::portable_fast_half || !std::is_same_v<T, half>))
    return portable::score_dot(q, k, d);
#endif
  return score_dot(q, k, d);
}

/// Scores of 8 keys (unscaled), each the bits score_dot_fast() gives.
template <class T>
inline void score_dot8_fast(const float* q, const T* const* k, std::size_t d, isa which,
                            double* dot) noexcept {
#if CERTATTN_X86
  if constexpr (std::is_same_v<T, half>)
    if (which == isa::kAvx512Vnni && d % 8 == 0) return score_dot8_avx512(q, k, d, dot);
#endif
  for (int j = 0; j < 8; ++j) dot[j] = score_dot_fast(q, k[j], d, which);
}

}  // namespace certattn::detail

#include <certattn/arch/macros_undef.hpp>
