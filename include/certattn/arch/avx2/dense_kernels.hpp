// AVX2 dense attention kernel: the AVX-512 kernel's algorithm (arch/avx512/dense_kernels.hpp)
// with 8-wide vectors and 16 registers, for CPUs with AVX2 + FMA + F16C but no AVX-512.
// head_dim tails have no masked 16-bit loads here: they go through a zero-padded copy. The
// softmax step runs per query (the AVX-512 kernel batches four).
#pragma once

#include <certattn/arch/dispatch.hpp>
#include <certattn/arch/scalar/dense_kernels.hpp>
#include <certattn/common.hpp>

#include <cstddef>
#include <cstring>
#include <limits>
#include <type_traits>

#include <certattn/arch/macros.hpp>

#if CERTATTN_X86

namespace certattn::detail::avx2::dense {

/// Eight consecutive elements of a cache row as floats.
template <class T>
CERTATTN_TARGET_AVX2 inline __m256 load8(const T* p) {
  if constexpr (std::is_same_v<T, half>) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  } else if constexpr (std::is_same_v<T, float>) {
    return _mm256_loadu_ps(p);
  } else {
    return _mm256_set_m128(_mm256_cvtpd_ps(_mm256_loadu_pd(p + 4)),
                           _mm256_cvtpd_ps(_mm256_loadu_pd(p)));
  }
}

/// The first `count` (< 8) elements, zeros after, without reading past them.
template <class T>
CERTATTN_TARGET_AVX2 inline __m256 load8_partial(const T* p, std::size_t count) {
  T buf[8] = {};
  std::memcpy(buf, p, count * sizeof(T));
  return load8(buf);
}

/// An 8-lane mask (all bits set in the first `count` lanes) for maskload/maskstore.
CERTATTN_TARGET_AVX2 inline __m256i lane_mask(std::size_t count) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(count)), idx);
}

/// exp(x) for x <= 88.7; below -87.3 (where 2^n would leave the normal range) the result is
/// 0. Same reduction and polynomial as the AVX-512 kernel (relative error <= 1.5e-7), with
/// 2^n built in the exponent field since AVX2 has no scalef.
CERTATTN_TARGET_AVX2 inline __m256 exp_ps(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.3f);
  const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(lo, x);
  x = _mm256_min_ps(_mm256_set1_ps(88.7f), x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // n in [-126, 128]: 2^n = (n + 127) << 23, except n = 128 (x in [88.38, 88.7]) which is
  // split as 2 * 2^127 to stay inside the exponent field.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i top = _mm256_cmpgt_epi32(ni, _mm256_set1_epi32(127));
  const __m256i e = _mm256_sub_epi32(ni, _mm256_and_si256(top, _mm256_set1_epi32(1)));
  const __m256 pow2 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23));
  p = _mm256_mul_ps(p, pow2);
  p = _mm256_blendv_ps(p, _mm256_add_ps(p, p), _mm256_castsi256_ps(top));
  return _mm256_andnot_ps(underflow, p);
}

CERTATTN_TARGET_AVX2 inline float reduce_add(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

CERTATTN_TARGET_AVX2 inline float reduce_max(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/// Horizontal sums of 8 vectors at once: lane i of the result is the sum of v[i].
CERTATTN_TARGET_AVX2 inline __m256 reduce8(const __m256 (&v)[8]) {
  __m256 w[4], x[2];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)  // per 128-bit lane: v[2i] at 0,2 and v[2i+1] at 1,3
    w[i] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]));
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i)  // per 128-bit lane c: the lane-c sums of v[4i..4i+3]
    x[i] = _mm256_add_ps(_mm256_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm256_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm256_add_ps(_mm256_permute2f128_ps(x[0], x[1], 0x20),
                       _mm256_permute2f128_ps(x[0], x[1], 0x31));
}

/// Scores of queries [g0, g0 + GB) against the chunk, TB tokens at a time (GB x TB <= 8
/// accumulators; see the AVX-512 kernel).
template <class T, int GB, int TB>
CERTATTN_TARGET_AVX2 inline void score_block(const dense_chunk_args& a, std::size_t g0,
                                             bool first) {
  static_assert(GB * TB <= 8 && (TB == 2 || TB == 4 || TB == 8));
  constexpr std::size_t C = dense_chunk_tokens;
  const std::size_t full = a.head_dim / 8, rem = a.head_dim % 8;
  const float* q = a.queries + g0 * a.q_stride;
  float* s = a.scores + g0 * C;
  const __m256 big = _mm256_set1_ps(std::numeric_limits<float>::max());
  const __m256 neg_big = _mm256_set1_ps(-std::numeric_limits<float>::max());
  for (std::size_t t = 0; t < a.n; t += TB) {
    const T* rows[TB];
#pragma GCC unroll 8
    for (int u = 0; u < TB; ++u) rows[u] = static_cast<const T*>(a.key_rows[t + u]);
    if (first)  // see dense_prefetch_row
      for (std::size_t u = t; u < t + TB; ++u)
        if (const void* r = dense_ahead_row(a.key_rows, a.rows_ahead, u + a.prefetch_distance))
          dense_prefetch_row(r, a.head_dim * sizeof(T));
    __m256 acc[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
    for (std::size_t j = 0; j < full; ++j) {
      __m256 qv[GB];
#pragma GCC unroll 4
      for (int g = 0; g < GB; ++g) qv[g] = _mm256_loadu_ps(q + g * a.q_stride + 8 * j);
#pragma GCC unroll 8
      for (int u = 0; u < TB; ++u) {
        const __m256 k = load8(rows[u] + 8 * j);
#pragma GCC unroll 4
        for (int g = 0; g < GB; ++g) acc[g * TB + u] = _mm256_fmadd_ps(qv[g], k, acc[g * TB + u]);
      }
    }
    if (rem != 0) {  // query rows are zero-padded to a multiple of 16
      __m256 qv[GB];
#pragma GCC unroll 4
      for (int g = 0; g < GB; ++g) qv[g] = _mm256_loadu_ps(q + g * a.q_stride + 8 * full);
#pragma GCC unroll 8
      for (int u = 0; u < TB; ++u) {
        const __m256 k = load8_partial(rows[u] + 8 * full, rem);
#pragma GCC unroll 4
        for (int g = 0; g < GB; ++g) acc[g * TB + u] = _mm256_fmadd_ps(qv[g], k, acc[g * TB + u]);
      }
    }
    __m256 z = reduce8(acc);  // lane g * TB + u: query g0 + g, token t + u
    z = _mm256_max_ps(neg_big, _mm256_min_ps(big, z));
    if constexpr (TB == 8) {
      _mm256_storeu_ps(s + t, z);
    } else if constexpr (TB == 4) {
      _mm_storeu_ps(s + t, _mm256_castps256_ps128(z));
      if constexpr (GB > 1) _mm_storeu_ps(s + C + t, _mm256_extractf128_ps(z, 1));
    } else {
      const __m128 lo = _mm256_castps256_ps128(z), hi = _mm256_extractf128_ps(z, 1);
      _mm_storel_pi(reinterpret_cast<__m64*>(s + t), lo);
      if constexpr (GB > 1) _mm_storeh_pi(reinterpret_cast<__m64*>(s + C + t), lo);
      if constexpr (GB > 2) _mm_storel_pi(reinterpret_cast<__m64*>(s + 2 * C + t), hi);
      if constexpr (GB > 3) _mm_storeh_pi(reinterpret_cast<__m64*>(s + 3 * C + t), hi);
    }
  }
}

/// Online-softmax step of one query (see the AVX-512 kernel); returns exp(m_old - m_new).
CERTATTN_TARGET_AVX2 inline float softmax_step(float* s, std::size_t n, float& m, float& l) {
  const std::size_t full = n / 8, rem = n % 8;
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  const __m256i tail = lane_mask(rem);
  __m256 mx = ninf;
  for (std::size_t i = 0; i < full; ++i) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + 8 * i));
  if (rem != 0)
    mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, _mm256_maskload_ps(s + 8 * full, tail),
                                            _mm256_castsi256_ps(tail)));
  const float chunk_max = reduce_max(mx);
  const float m_new = m > chunk_max ? m : chunk_max;
  const __m256 mv = _mm256_set1_ps(m_new);
  __m256 sum = _mm256_setzero_ps();
  for (std::size_t i = 0; i < full; ++i) {
    const __m256 p = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(s + 8 * i), mv));
    _mm256_storeu_ps(s + 8 * i, p);
    sum = _mm256_add_ps(sum, p);
  }
  if (rem != 0) {
    const __m256 p =
        _mm256_and_ps(_mm256_castsi256_ps(tail),
                      exp_ps(_mm256_sub_ps(_mm256_maskload_ps(s + 8 * full, tail), mv)));
    _mm256_maskstore_ps(s + 8 * full, tail, p);
    sum = _mm256_add_ps(sum, p);
  }
  const float alpha = m == m_new ? 1.0f : _mm256_cvtss_f32(exp_ps(_mm256_set1_ps(m - m_new)));
  l = l * alpha + reduce_add(sum);
  m = m_new;
  return alpha;
}

/// Value pass of queries [g0, g0 + GB) over NB 8-wide channel blocks from block b0; the
/// last block holds `last` (1..8) channels. See the AVX-512 kernel.
template <class T, int GB, int NB>
CERTATTN_TARGET_AVX2 inline void value_block(const dense_chunk_args& a, std::size_t g0,
                                             std::size_t b0, std::size_t last, bool first) {
  constexpr std::size_t C = dense_chunk_tokens;
  const float* w = a.scores + g0 * C;
  const std::size_t col0 = 8 * b0;
  __m256 acc[GB * NB];
#pragma GCC unroll 16
  for (int i = 0; i < GB * NB; ++i) acc[i] = _mm256_setzero_ps();
  for (std::size_t t = 0; t < a.n; ++t) {
    if (first)
      if (const void* r = dense_ahead_row(a.value_rows, a.rows_ahead, t + a.prefetch_distance))
        dense_prefetch_row(r, a.value_dim * sizeof(T));
    const T* v = static_cast<const T*>(a.value_rows[t]) + col0;
    __m256 wv[GB];
#pragma GCC unroll 4
    for (int g = 0; g < GB; ++g) wv[g] = _mm256_broadcast_ss(w + g * C + t);
#pragma GCC unroll 8
    for (int b = 0; b < NB; ++b) {
      const __m256 x =
          (b + 1 < NB || last == 8) ? load8(v + 8 * b) : load8_partial(v + 8 * b, last);
#pragma GCC unroll 4
      for (int g = 0; g < GB; ++g) acc[g * NB + b] = _mm256_fmadd_ps(wv[g], x, acc[g * NB + b]);
    }
  }
  const __m256i last_mask = lane_mask(last);
#pragma GCC unroll 4
  for (int g = 0; g < GB; ++g) {
    float* o = a.acc + (g0 + g) * a.acc_stride + col0;
    const __m256 alpha = _mm256_set1_ps(a.alpha[g0 + g]);
#pragma GCC unroll 8
    for (int b = 0; b < NB; ++b) {
      if (b + 1 < NB || last == 8) {
        _mm256_storeu_ps(o + 8 * b,
                         _mm256_fmadd_ps(_mm256_loadu_ps(o + 8 * b), alpha, acc[g * NB + b]));
      } else {
        const __m256 old = _mm256_maskload_ps(o + 8 * b, last_mask);
        _mm256_maskstore_ps(o + 8 * b, last_mask, _mm256_fmadd_ps(old, alpha, acc[g * NB + b]));
      }
    }
  }
}

template <class T, int GB, int NB>
CERTATTN_TARGET_AVX2 inline void value_block_n(const dense_chunk_args& a, std::size_t g0,
                                               std::size_t b0, std::size_t nb, std::size_t last,
                                               bool first) {
  if constexpr (NB > 1) {
    if (nb < std::size_t(NB)) return value_block_n<T, GB, NB - 1>(a, g0, b0, nb, last, first);
  }
  value_block<T, GB, NB>(a, g0, b0, last, first);
}

/// All channels for queries [g0, g0 + GB), in equal groups of at most NBmax blocks so that
/// GB x NBmax accumulators + one value block + GB weights fit in 16 ymm registers.
template <class T, int GB>
CERTATTN_TARGET_AVX2 inline void value_pass(const dense_chunk_args& a, std::size_t g0) {
  constexpr std::size_t nb_max = GB == 1 ? 8 : GB == 2 ? 4 : GB == 3 ? 3 : 2;
  const std::size_t blocks = (a.value_dim + 7) / 8;
  const std::size_t rem = a.value_dim % 8;
  const std::size_t groups = (blocks + nb_max - 1) / nb_max;
  std::size_t b0 = 0;
  for (std::size_t i = 0; i < groups; ++i) {
    const std::size_t nb = blocks / groups + (i < blocks % groups ? 1 : 0);
    const std::size_t last = b0 + nb == blocks && rem != 0 ? rem : 8;
    value_block_n<T, GB, int(nb_max)>(a, g0, b0, nb, last, g0 == 0 && i == 0);
    b0 += nb;
  }
}

template <class K, class V = K>
CERTATTN_TARGET_AVX2 inline void dense_chunk(const dense_chunk_args& a) {
  const std::size_t G = a.group;
  std::size_t g = 0;
  for (; g + 4 <= G; g += 4) score_block<K, 4, 2>(a, g, g == 0);
  switch (G - g) {
    case 1:
      score_block<K, 1, 8>(a, g, g == 0);
      break;
    case 2:
      score_block<K, 2, 4>(a, g, g == 0);
      break;
    case 3:
      score_block<K, 3, 2>(a, g, g == 0);
      break;
    default:
      break;
  }
  dense_apply_variant(a);
  for (std::size_t i = 0; i < G; ++i)
    a.alpha[i] = softmax_step(a.scores + i * dense_chunk_tokens, a.n, a.max_scores[i], a.sums[i]);
  for (g = 0; g + 4 <= G; g += 4) value_pass<V, 4>(a, g);
  switch (G - g) {
    case 1:
      value_pass<V, 1>(a, g);
      break;
    case 2:
      value_pass<V, 2>(a, g);
      break;
    case 3:
      value_pass<V, 3>(a, g);
      break;
    default:
      break;
  }
}

}  // namespace certattn::detail::avx2::dense

#endif  // CERTATTN_X86

#include <certattn/arch/macros_undef.hpp>
