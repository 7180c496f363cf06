// AVX-512 dense attention kernel: one chunk of 16 tokens of one KV head for the G queries
// that share it (the interface is dense_chunk_args, arch/scalar/dense_kernels.hpp): score
// tiles for all queries, one online-softmax step, the value pass. Each key and value row
// is read from memory once for the whole group, quantized rows decoded in registers
// (row_loader), and the rows one chunk ahead are prefetched meanwhile. Compiled with function target attributes so that the binary still
// runs on CPUs without AVX-512.
#pragma once

#include <certattn/arch/decode_kernels.hpp>
#include <certattn/arch/dispatch.hpp>
#include <certattn/arch/scalar/dense_kernels.hpp>
#include <certattn/common.hpp>
#include <certattn/formats.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include <certattn/arch/macros.hpp>

#if CERTATTN_X86

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wuninitialized flags
// once inlined into a target-attribute function (GCC bug 105593, fixed in 12.3/13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace certattn::detail::avx512::dense {

/// Sixteen consecutive elements of a cache row as floats.
template <class T>
CERTATTN_TARGET_AVX512 inline __m512 load16(const T* p) {
  if constexpr (std::is_same_v<T, half>) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    // bf16 is the top half of a float: widen and shift, exact.
    const __m512i w =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  } else if constexpr (std::is_same_v<T, float>) {
    return _mm512_loadu_ps(p);
  } else {
    const __m256 lo = _mm512_cvtpd_ps(_mm512_loadu_pd(p));
    const __m256 hi = _mm512_cvtpd_ps(_mm512_loadu_pd(p + 8));
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
  }
}

/// The lanes of `m` only, zeros elsewhere; masked-off elements are never touched in memory
/// (AVX-512 fault suppression), which is how head_dim % 16 != 0 stays in bounds.
template <class T>
CERTATTN_TARGET_AVX512 inline __m512 load16_masked(const T* p, __mmask16 m) {
  if constexpr (std::is_same_v<T, half>) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  } else if constexpr (std::is_same_v<T, float>) {
    return _mm512_maskz_loadu_ps(m, p);
  } else {
    const __m256 lo = _mm512_cvtpd_ps(_mm512_maskz_loadu_pd(__mmask8(m), p));
    if ((m >> 8) == 0) return _mm512_castps256_ps512(lo);
    const __m256 hi = _mm512_cvtpd_ps(_mm512_maskz_loadu_pd(__mmask8(m >> 8), p + 8));
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
  }
}

/// The channels of a row of T as floats: a 16-bit, float or double row's elements, or a
/// quantized row through its decoder (arch/decode_kernels.hpp; the bits of decode_row()).
/// Made once per chunk from the view's fp8 scale.
template <class T>
struct row_loader {
  CERTATTN_TARGET_AVX512 explicit row_loader(float) {}
  /// Channels [c, c + 16), c a multiple of 16.
  CERTATTN_TARGET_AVX512 __m512 load16(const T* row, std::size_t c) const {
    return dense::load16(row + c);
  }
  /// The channels of mask m only (zeros elsewhere, nothing read past them).
  CERTATTN_TARGET_AVX512 __m512 load16_masked(const T* row, std::size_t c, __mmask16 m) const {
    return dense::load16_masked(row + c, m);
  }
  /// Channels [c, c + 32), c a multiple of 32.
  CERTATTN_TARGET_AVX512 void load32(const T* row, std::size_t c, __m512& lo, __m512& hi) const {
    lo = dense::load16(row + c);
    hi = dense::load16(row + c + 16);
  }
};
template <quantized_element T>
struct row_loader<T> : avx512_decoder<T> {
  using avx512_decoder<T>::avx512_decoder;
};

/// Whether T's rows decode 32 channels at a time more cheaply than 16 (one block scale).
template <class T>
inline constexpr bool decodes_by_32 = format_traits<T>::channels == 32;

/// Bytes of a row of n channels of T (for prefetches).
template <class T>
constexpr std::size_t row_bytes_of(std::size_t n) noexcept {
  if constexpr (quantized_element<T>)
    return format_traits<T>::row_bytes(n);
  else
    return n * sizeof(T);
}

/// exp(x) for x <= 88.7; below -104 the result is 0. Cephes' degree-6 polynomial on
/// [-ln2/2, ln2/2] after the reduction x = n ln2 + r (ln2 split in two, so r is exact to
/// ~1 ulp); scalef applies 2^n including the subnormal range. Max relative error 1.5e-7 on
/// [-87, 0] (tests/test_dense.cpp measures it). The clamps are written (bound, x) so a
/// NaN x propagates instead of being replaced by the bound.
CERTATTN_TARGET_AVX512 inline __m512 exp_ps(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);
  x = _mm512_min_ps(_mm512_set1_ps(88.7f), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

/// Horizontal sums of 16 vectors at once: lane i of the result is the sum of v[i]. A tree
/// of 30 shuffles and 15 adds, i.e. two shuffles per dot product instead of the ~10 of a
/// reduction per dot product.
CERTATTN_TARGET_AVX512 inline __m512 reduce16(const __m512 (&v)[16]) {
  __m512 w[8], x[4], y[2];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: v[2i] at 0,2 and v[2i+1] at 1,3
    w[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)  // per 128-bit lane c: the lane-c sums of v[4i..4i+3]
    x[i] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i)  // 128-bit lanes: halves of v[8i..8i+3], then of v[8i+4..8i+7]
    y[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/// Scores of queries [g0, g0 + GB) against the chunk, TB tokens at a time: GB x TB
/// accumulators of 16 partial sums each (query rows from L1, each key block converted once
/// for the GB queries), one reduction tree per tile.
template <class T, int GB, int TB>
CERTATTN_TARGET_AVX512 inline void score_block(const dense_chunk_args& a, std::size_t g0,
                                               bool first) {
  static_assert(GB * TB <= 16 && (TB == 4 || TB == 8 || TB == 16));
  constexpr std::size_t C = dense_chunk_tokens;
  const std::size_t full = a.head_dim / 16;
  const __mmask16 tail = __mmask16((1u << (a.head_dim % 16)) - 1u);
  const float* q = a.queries + g0 * a.q_stride;
  float* s = a.scores + g0 * C;
  const __m512 big = _mm512_set1_ps(std::numeric_limits<float>::max());
  const __m512 neg_big = _mm512_set1_ps(-std::numeric_limits<float>::max());
  const row_loader<T> load(a.key_scale);
  for (std::size_t t = 0; t < a.n; t += TB) {
    const T* rows[TB];
#pragma GCC unroll 16
    for (int u = 0; u < TB; ++u) rows[u] = static_cast<const T*>(a.key_rows[t + u]);
    if (first)
      for (std::size_t u = t; u < t + TB; ++u)
        if (const void* r = dense_ahead_row(a.key_rows, a.rows_ahead, u + a.prefetch_distance))
          dense_prefetch_row(r, row_bytes_of<T>(a.head_dim));
    __m512 acc[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
    std::size_t j = 0;
    if constexpr (decodes_by_32<T>) {  // head_dim is a multiple of 32: no odd block, no tail
      for (; j < full; j += 2) {
        __m512 q0[GB], q1[GB];
#pragma GCC unroll 4
        for (int g = 0; g < GB; ++g) {
          q0[g] = _mm512_loadu_ps(q + g * a.q_stride + 16 * j);
          q1[g] = _mm512_loadu_ps(q + g * a.q_stride + 16 * j + 16);
        }
#pragma GCC unroll 16
        for (int u = 0; u < TB; ++u) {
          __m512 k0, k1;
          load.load32(rows[u], 16 * j, k0, k1);
#pragma GCC unroll 4
          for (int g = 0; g < GB; ++g)
            acc[g * TB + u] =
                _mm512_fmadd_ps(q1[g], k1, _mm512_fmadd_ps(q0[g], k0, acc[g * TB + u]));
        }
      }
    }
    for (; j < full; ++j) {
      __m512 qv[GB];
#pragma GCC unroll 4
      for (int g = 0; g < GB; ++g) qv[g] = _mm512_loadu_ps(q + g * a.q_stride + 16 * j);
#pragma GCC unroll 16
      for (int u = 0; u < TB; ++u) {
        const __m512 k = load.load16(rows[u], 16 * j);
#pragma GCC unroll 4
        for (int g = 0; g < GB; ++g) acc[g * TB + u] = _mm512_fmadd_ps(qv[g], k, acc[g * TB + u]);
      }
    }
    if (tail != 0) {  // query rows are zero-padded, so only the key load needs the mask
      __m512 qv[GB];
#pragma GCC unroll 4
      for (int g = 0; g < GB; ++g) qv[g] = _mm512_loadu_ps(q + g * a.q_stride + 16 * full);
#pragma GCC unroll 16
      for (int u = 0; u < TB; ++u) {
        const __m512 k = load.load16_masked(rows[u], 16 * full, tail);
#pragma GCC unroll 4
        for (int g = 0; g < GB; ++g) acc[g * TB + u] = _mm512_fmadd_ps(qv[g], k, acc[g * TB + u]);
      }
    }
    __m512 z = reduce16(acc);  // lane g * TB + u: query g0 + g, token t + u
    z = _mm512_max_ps(neg_big, _mm512_min_ps(big, z));
    if constexpr (TB == 16) {
      _mm512_storeu_ps(s + t, z);
    } else if constexpr (TB == 8) {
      _mm256_storeu_ps(s + t, _mm512_castps512_ps256(z));
      if constexpr (GB > 1) _mm256_storeu_ps(s + C + t, _mm512_extractf32x8_ps(z, 1));
    } else {
      _mm_storeu_ps(s + t, _mm512_castps512_ps128(z));
      if constexpr (GB > 1) _mm_storeu_ps(s + C + t, _mm512_extractf32x4_ps(z, 1));
      if constexpr (GB > 2) _mm_storeu_ps(s + 2 * C + t, _mm512_extractf32x4_ps(z, 2));
      if constexpr (GB > 3) _mm_storeu_ps(s + 3 * C + t, _mm512_extractf32x4_ps(z, 3));
    }
  }
}

/// Lane-wise `op` reduction of four vectors at once: lane 4k + g of the result (every k)
/// holds op over all 16 lanes of v[g]. Six shuffles and six ops for four reductions.
template <class Op>
CERTATTN_TARGET_AVX512 inline __m512 reduce4(__m512 v0, __m512 v1, __m512 v2, __m512 v3, Op op) {
  const __m512 w0 = op(_mm512_unpacklo_ps(v0, v1), _mm512_unpackhi_ps(v0, v1));
  const __m512 w1 = op(_mm512_unpacklo_ps(v2, v3), _mm512_unpackhi_ps(v2, v3));
  // per 128-bit lane c: [v0, v1, v2, v3] reduced over lane c
  const __m512 x = op(_mm512_shuffle_ps(w0, w1, _MM_SHUFFLE(1, 0, 1, 0)),
                      _mm512_shuffle_ps(w0, w1, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 y = op(x, _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(2, 3, 0, 1)));
  return op(y, _mm512_shuffle_f32x4(y, y, _MM_SHUFFLE(1, 0, 3, 2)));
}

struct max_op {
  CERTATTN_TARGET_AVX512 __m512 operator()(__m512 a, __m512 b) const { return _mm512_max_ps(a, b); }
};
struct add_op {
  CERTATTN_TARGET_AVX512 __m512 operator()(__m512 a, __m512 b) const { return _mm512_add_ps(a, b); }
};

/// Online-softmax step of queries [g0, g0 + gb), gb <= 4, on their scores of this chunk
/// (one vector each: 16 tokens per chunk): new running max m, weights exp(s - m) in place
/// of the scores, running sum l updated, and alpha = exp(m_old - m) (0 on the first chunk,
/// where m_old = -inf), the factor the accumulators are rescaled by.
///
/// This step sits between the score and the value pass of every chunk, so its latency
/// counts, not its throughput. Once the running max has settled a chunk rarely raises it:
/// the weights are computed against the old max straight away (one sub + exp after the
/// scores), and only if some score exceeds it does the slow path reduce the chunk max and
/// redo them. The four queries share their reduction trees and alpha exp.
CERTATTN_TARGET_AVX512 inline void softmax_block(const dense_chunk_args& a, std::size_t g0,
                                                 std::size_t gb) {
  static_assert(dense_chunk_tokens == 16, "one score vector per query and chunk");
  constexpr std::size_t C = dense_chunk_tokens;
  const __mmask16 tokens = a.n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << a.n) - 1u);
  const __mmask8 queries = __mmask8((1u << gb) - 1u);
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512 zero = _mm512_setzero_ps();
  __m512 s[4] = {ninf, ninf, ninf, ninf}, p[4] = {zero, zero, zero, zero};
  // lane 4k + g: query g0 + g
  const __m512 m_old = _mm512_broadcast_f32x4(
      _mm_mask_loadu_ps(_mm512_castps512_ps128(ninf), queries, a.max_scores + g0));
  __mmask16 raised = 0;
  for (std::size_t g = 0; g < gb; ++g) {
    s[g] = _mm512_mask_loadu_ps(ninf, tokens, a.scores + (g0 + g) * C);
    const __m512 m = _mm512_permutexvar_ps(_mm512_set1_epi32(int(g)), m_old);
    raised |= _mm512_cmp_ps_mask(s[g], m, _CMP_GT_OQ);
    p[g] = _mm512_maskz_mov_ps(tokens, exp_ps(_mm512_sub_ps(s[g], m)));
  }
  __m512 m_new = m_old, alpha = _mm512_set1_ps(1.0f);
  if (raised != 0) {  // slow path: a new running max
    m_new = _mm512_max_ps(m_old, reduce4(s[0], s[1], s[2], s[3], max_op{}));
    alpha = exp_ps(_mm512_sub_ps(m_old, m_new));  // unused query lanes: NaN, never stored
    for (std::size_t g = 0; g < gb; ++g) {
      const __m512 m = _mm512_permutexvar_ps(_mm512_set1_epi32(int(g)), m_new);
      p[g] = _mm512_maskz_mov_ps(tokens, exp_ps(_mm512_sub_ps(s[g], m)));
    }
  }
  for (std::size_t g = 0; g < gb; ++g) _mm512_storeu_ps(a.scores + (g0 + g) * C, p[g]);
  const __m128 chunk_sum = _mm512_castps512_ps128(reduce4(p[0], p[1], p[2], p[3], add_op{}));
  const __m128 alpha4 = _mm512_castps512_ps128(alpha);
  const __m128 l_old = _mm_maskz_loadu_ps(queries, a.sums + g0);
  _mm_mask_storeu_ps(a.sums + g0, queries, _mm_fmadd_ps(l_old, alpha4, chunk_sum));
  _mm_mask_storeu_ps(a.max_scores + g0, queries, _mm512_castps512_ps128(m_new));
  _mm_mask_storeu_ps(a.alpha + g0, queries, alpha4);
}

/// Value pass of queries [g0, g0 + GB) over NB 16-wide blocks of channels from block b0:
/// each value block converted once for the GB queries, GB x NB accumulators summed over the
/// chunk from zero and then added to the running accumulator (acc = acc * alpha + chunk),
/// which keeps the fp32 summation error of long contexts at O(16 + n / 16) ulps instead
/// of O(n).
/// `last` masks the channels of block b0 + NB - 1 (the head_dim tail).
template <class T, int GB, int NB>
CERTATTN_TARGET_AVX512 inline void value_block(const dense_chunk_args& a, std::size_t g0,
                                               std::size_t b0, __mmask16 last, bool first) {
  constexpr std::size_t C = dense_chunk_tokens;
  const float* w = a.scores + g0 * C;
  const std::size_t col0 = 16 * b0;
  const row_loader<T> load(a.value_scale);
  __m512 acc[GB * NB];
#pragma GCC unroll 32
  for (int i = 0; i < GB * NB; ++i) acc[i] = _mm512_setzero_ps();
  for (std::size_t t = 0; t < a.n; ++t) {
    if (first)
      if (const void* r = dense_ahead_row(a.value_rows, a.rows_ahead, t + a.prefetch_distance))
        dense_prefetch_row(r, row_bytes_of<T>(a.value_dim));
    const T* v = static_cast<const T*>(a.value_rows[t]);
    __m512 wv[GB];
#pragma GCC unroll 4
    for (int g = 0; g < GB; ++g) wv[g] = _mm512_set1_ps(w[g * C + t]);
    if constexpr (decodes_by_32<T> && NB % 2 == 0) {  // value_pass: b0 even, no tail
#pragma GCC unroll 4
      for (int b = 0; b < NB; b += 2) {
        __m512 x0, x1;
        load.load32(v, col0 + 16 * b, x0, x1);
#pragma GCC unroll 4
        for (int g = 0; g < GB; ++g) {
          acc[g * NB + b] = _mm512_fmadd_ps(wv[g], x0, acc[g * NB + b]);
          acc[g * NB + b + 1] = _mm512_fmadd_ps(wv[g], x1, acc[g * NB + b + 1]);
        }
      }
    } else {
#pragma GCC unroll 8
      for (int b = 0; b < NB; ++b) {
        const __m512 x = b + 1 < NB ? load.load16(v, col0 + 16 * b)
                                    : load.load16_masked(v, col0 + 16 * b, last);
#pragma GCC unroll 4
        for (int g = 0; g < GB; ++g) acc[g * NB + b] = _mm512_fmadd_ps(wv[g], x, acc[g * NB + b]);
      }
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < GB; ++g) {
    float* o = a.acc + (g0 + g) * a.acc_stride + col0;
    const __m512 alpha = _mm512_set1_ps(a.alpha[g0 + g]);
#pragma GCC unroll 8
    for (int b = 0; b < NB; ++b) {
      const __mmask16 m = b + 1 < NB ? __mmask16(0xFFFF) : last;
      const __m512 old = _mm512_maskz_loadu_ps(m, o + 16 * b);
      _mm512_mask_storeu_ps(o + 16 * b, m, _mm512_fmadd_ps(old, alpha, acc[g * NB + b]));
    }
  }
}

/// value_block with a run-time block count nb in [1, NB].
template <class T, int GB, int NB>
CERTATTN_TARGET_AVX512 inline void value_block_n(const dense_chunk_args& a, std::size_t g0,
                                                 std::size_t b0, std::size_t nb, __mmask16 last,
                                                 bool first) {
  if constexpr (NB > 1) {
    if (nb < std::size_t(NB)) return value_block_n<T, GB, NB - 1>(a, g0, b0, nb, last, first);
  }
  value_block<T, GB, NB>(a, g0, b0, last, first);
}

/// All channels for queries [g0, g0 + GB): the head_dim / 16 blocks split into equal groups
/// of at most NBmax, NBmax chosen so that accumulators + value block + weights fit in the
/// 32 zmm registers.
template <int GB>
constexpr std::size_t value_groups(std::size_t head_dim) {
  constexpr std::size_t nb_max = GB <= 2 ? 8 : 4;
  return ((head_dim + 15) / 16 + nb_max - 1) / nb_max;
}

template <class T, int GB>
CERTATTN_TARGET_AVX512 inline void value_pass(const dense_chunk_args& a, std::size_t g0) {
  constexpr std::size_t nb_max = GB <= 2 ? 8 : 4;
  // Rows decoded 32 channels at a time are split into pairs of blocks (value_dim % 32 == 0).
  constexpr std::size_t unit = decodes_by_32<T> ? 2 : 1;
  const std::size_t blocks = (a.value_dim + 15) / 16, units = blocks / unit;
  const std::size_t rem = a.value_dim % 16;
  const __mmask16 tail = rem == 0 ? __mmask16(0xFFFF) : __mmask16((1u << rem) - 1u);
  const std::size_t groups = value_groups<GB>(a.value_dim);
  std::size_t b0 = 0;
  for (std::size_t i = 0; i < groups; ++i) {
    const std::size_t nb = unit * (units / groups + (i < units % groups ? 1 : 0));
    const __mmask16 last = b0 + nb == blocks ? tail : __mmask16(0xFFFF);
    value_block_n<T, GB, int(nb_max)>(a, g0, b0, nb, last, g0 == 0 && i == 0);
    b0 += nb;
  }
}

/// The chunk: scores for all queries (blocks of 4), the softmax step (blocks of 4), the
/// value pass (blocks of 4). Keys and values are read from memory once; a second query
/// block (G > 4) finds them in L1. The first pass over the keys prefetches the key rows one
/// chunk ahead, the first value pass the value rows (see dense_prefetch_row).
template <class K, class V = K>
CERTATTN_TARGET_AVX512 inline void dense_chunk(const dense_chunk_args& a) {
  const std::size_t G = a.group;
  std::size_t g = 0;
  for (; g + 4 <= G; g += 4) score_block<K, 4, 4>(a, g, g == 0);
  switch (G - g) {
    case 1:
      score_block<K, 1, 16>(a, g, g == 0);
      break;
    case 2:
      score_block<K, 2, 8>(a, g, g == 0);
      break;
    case 3:
      score_block<K, 3, 4>(a, g, g == 0);
      break;
    default:
      break;
  }
  dense_apply_variant(a);
  for (g = 0; g < G; g += 4) softmax_block(a, g, G - g < 4 ? G - g : 4);
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

}  // namespace certattn::detail::avx512::dense

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif  // CERTATTN_X86

#include <certattn/arch/macros_undef.hpp>
