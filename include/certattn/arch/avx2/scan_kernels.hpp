// AVX2 4-bit scan (no VNNI): _mm256_maddubs_epi16 multiplies unsigned codes by the int8
// query and adds pairs (at most 2 * 15 * 127 = 3810: no saturation), _mm256_madd_epi16
// with ones adds the pairs into 32-bit lanes: the same exact integer dot as dpbusd, for
// each of the query's two int8 planes (arch/scan_prep.hpp), added as 128 dot + dot_f.
#pragma once

#include <certattn/arch/dispatch.hpp>
#include <certattn/arch/scan_prep.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <certattn/arch/macros.hpp>

#if CERTATTN_X86
CERTATTN_ARCH_BEGIN
namespace certattn::detail::avx2 {

/// Bounds of one block for NQ queries: u[g * u_stride + t] for its 128 tokens, and
/// bmax[g * bmax_stride] = max of u over its first `valid` tokens (the pool's).
template <int NQ>
CERTATTN_TARGET_AVX2 inline void scan_heads(const std::uint8_t* codes, const std::uint8_t* rho,
                                            std::size_t n_oct, const std::int8_t* qa,
                                            const std::int8_t* qf,
                                            std::size_t qa_stride, const block_query_prep* prep,
                                            float* u, std::size_t u_stride, std::size_t valid,
                                            float* bmax, std::size_t bmax_stride) noexcept {
  const __m256 neg_inf = _mm256_set1_ps(-__builtin_inff());
  __m256 mx[NQ];
  _Pragma("GCC unroll 8")
  for (int g = 0; g < NQ; ++g) mx[g] = neg_inf;
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const std::size_t block_bytes = kGroupsPerBlock * n_oct * 64;
  for (std::size_t grp = 0; grp < kGroupsPerBlock; ++grp) {
    const std::uint8_t* c = codes + grp * n_oct * 64;
    __m256i acc[NQ][2], acc_f[NQ][2];
    _Pragma("GCC unroll 8")
    for (int g = 0; g < NQ; ++g)
      acc[g][0] = acc[g][1] = acc_f[g][0] = acc_f[g][1] = _mm256_setzero_si256();
    for (std::size_t o = 0; o < n_oct; ++o) {
      for (int h = 0; h < 2; ++h) {
        const __m256i x =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + o * 64 + h * 32));
        if (h == 0)  // the next block's codes (a decode step reads them from memory)
          _mm_prefetch(reinterpret_cast<const char*>(c + o * 64 + block_bytes), _MM_HINT_T0);
        const __m256i lo = _mm256_and_si256(x, mask);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), mask);
        // acc += the codes' dot with the 8 query bytes at w (one plane, one octet).
        auto add_octet = [&](__m256i& acc, const std::int8_t* w) CERTATTN_TARGET_AVX2 {
          std::int32_t wl, wh;
          std::memcpy(&wl, w, 4);
          std::memcpy(&wh, w + 4, 4);
          const __m256i pl = _mm256_maddubs_epi16(lo, _mm256_set1_epi32(wl));
          const __m256i ph = _mm256_maddubs_epi16(hi, _mm256_set1_epi32(wh));
          acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pl, ones));
          acc = _mm256_add_epi32(acc, _mm256_madd_epi16(ph, ones));
        };
        _Pragma("GCC unroll 8")
        for (int g = 0; g < NQ; ++g) {
          add_octet(acc[g][h], qa + o * qa_stride + 8 * g);
          add_octet(acc_f[g][h], qf + o * qa_stride + 8 * g);
        }
      }
    }
    const std::size_t first = grp * kGroupTokens;
    const int lanes = int(valid > first ? std::min(valid - first, kGroupTokens) : 0);
    for (int h = 0; h < 2; ++h) {
      std::int64_t rb8;
      std::memcpy(&rb8, rho + first + h * 8, 8);
      const __m256 rb = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(rb8)));
      const __m256 live = _mm256_castsi256_ps(
          _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes - 8 * h), iota));
      _Pragma("GCC unroll 8")
      for (int g = 0; g < NQ; ++g) {
        const __m256i dot2 =
            _mm256_add_epi32(_mm256_slli_epi32(acc[g][h], kFineShift), acc_f[g][h]);
        const __m256 r = _mm256_fmadd_ps(_mm256_set1_ps(prep[g].alpha), _mm256_cvtepi32_ps(dot2),
                                         _mm256_set1_ps(prep[g].offset));
        const __m256 t = _mm256_min_ps(_mm256_set1_ps(prep[g].holder),
                                       _mm256_mul_ps(_mm256_set1_ps(prep[g].norm), rb));
        const __m256 v = _mm256_add_ps(r, t);
        _mm256_storeu_ps(u + g * u_stride + first + h * 8, v);
        mx[g] = _mm256_max_ps(mx[g], _mm256_blendv_ps(neg_inf, v, live));
      }
    }
  }
  _Pragma("GCC unroll 8")
  for (int g = 0; g < NQ; ++g) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(mx[g]), _mm256_extractf128_ps(mx[g], 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    bmax[g * bmax_stride] = _mm_cvtss_f32(m);
  }
}

CERTATTN_TARGET_AVX2 inline void scan_block(const std::uint8_t* codes, const std::uint8_t* rho,
                                            std::size_t padded_dim, const std::int8_t* qa,
                                            const block_query_prep* prep, std::size_t nq,
                                            float* u, std::size_t u_stride, std::size_t valid,
                                            float* bmax, std::size_t bmax_stride) noexcept {
  const std::size_t n_oct = padded_dim / 8;
  const std::int8_t* qf = fine_plane(qa, nq, padded_dim);
  std::size_t g = 0;
  for (; g + 2 <= nq; g += 2)
    scan_heads<2>(codes, rho, n_oct, qa + 8 * g, qf + 8 * g, 8 * nq, prep + g, u + g * u_stride,
                  u_stride, valid, bmax + g * bmax_stride, bmax_stride);
  if (g < nq)
    scan_heads<1>(codes, rho, n_oct, qa + 8 * g, qf + 8 * g, 8 * nq, prep + g, u + g * u_stride,
                  u_stride, valid, bmax + g * bmax_stride, bmax_stride);
}

/// Lane sums of prepare_block_query() (arch/scan_prep.hpp): lanes 0..7 in [0], 8..15 in [1].
struct prep_lanes {
  __m256 amax[2], ca[2], cb[2], s[2], q2[2], p[2], ce[2];
};

CERTATTN_TARGET_AVX2 __attribute__((always_inline)) inline void prep_pass1(
    prep_lanes& x, int h, __m256 q, __m256 lo, __m256 st) noexcept {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 a = _mm256_mul_ps(q, st);
  const __m256 fa = _mm256_andnot_ps(sign, a);
  x.amax[h] = _mm256_max_ps(fa, x.amax[h]);
  x.s[h] = _mm256_add_ps(x.s[h], fa);
  x.q2[h] = _mm256_fmadd_ps(a, a, x.q2[h]);
  x.ca[h] = _mm256_fmadd_ps(q, lo, x.ca[h]);
  x.cb[h] = _mm256_fmadd_ps(a, _mm256_set1_ps(0.5f), x.cb[h]);
  x.p[h] = _mm256_add_ps(x.p[h], _mm256_andnot_ps(sign, _mm256_mul_ps(q, lo)));
}

/// Quantizes 8 channels to both planes: the int32 codes r and r_f; adds max(e_f, 0) to ce.
struct plane_codes {
  __m256i r, r_f;
};
CERTATTN_TARGET_AVX2 __attribute__((always_inline)) inline plane_codes prep_pass2(
    prep_lanes& x, int h, __m256 q, __m256 st, __m256 alpha, __m256 inv, __m256 beta,
    __m256 inv_f) noexcept {
  const __m256 a = _mm256_mul_ps(q, st);
  const __m256 round = _mm256_set1_ps(kScanRound);
  const __m256 r = _mm256_sub_ps(_mm256_fmadd_ps(a, inv, round), round);  // RNE(a inv)
  const __m256 e = _mm256_fnmadd_ps(alpha, r, a);
  const __m256 rf = _mm256_sub_ps(_mm256_fmadd_ps(e, inv_f, round), round);  // RNE(e inv_f)
  const __m256 ef = _mm256_fnmadd_ps(beta, rf, e);
  x.ce[h] = _mm256_add_ps(x.ce[h], _mm256_max_ps(ef, _mm256_setzero_ps()));
  // exact: integers in [-127, 127]
  return {_mm256_cvtps_epi32(r), _mm256_cvtps_epi32(rf)};
}

/// 8 int32 in [-127, 127] to 8 bytes.
CERTATTN_TARGET_AVX2 inline void store_qa8(std::int8_t* dst, __m256i r) noexcept {
  const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), _mm_packs_epi16(w, w));
}

/// The 8 lanes after the tree's first level (x_l + x_{l+8}) of two sums, reduced by the
/// rest of scan_tree16(): lane 0 and lane 4 of the result.
CERTATTN_TARGET_AVX2 inline __m256 tree8x2(__m256 b0, __m256 b1) noexcept {
  const __m256 c = _mm256_add_ps(_mm256_permute2f128_ps(b0, b1, 0x20),
                                 _mm256_permute2f128_ps(b0, b1, 0x31));
  const __m256 d = _mm256_add_ps(c, _mm256_permute_ps(c, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm256_add_ps(d, _mm256_permute_ps(d, _MM_SHUFFLE(2, 3, 0, 1)));
}

/// prepare_block_query() with the 16 lanes in two registers: the same operations in the
/// same order and the same tree, hence the same bits.
CERTATTN_TARGET_AVX2 inline void prepare_block_query_avx2(const float* lo, const float* st,
                                                          const float* q, std::size_t padded_dim,
                                                          std::int8_t* qa, std::int8_t* qf,
                                                          std::size_t qa_stride,
                                                          block_query_prep& out) noexcept {
  const std::size_t n8 = padded_dim / 8;  // lane halves: half j % 2 of vector j / 2
  const __m256 zero = _mm256_setzero_ps();
  prep_lanes x;
  for (int h = 0; h < 2; ++h)
    x.amax[h] = x.ca[h] = x.cb[h] = x.s[h] = x.q2[h] = x.p[h] = x.ce[h] = zero;
  for (std::size_t j = 0; j < n8; ++j)
    prep_pass1(x, int(j % 2), _mm256_loadu_ps(q + 8 * j), _mm256_loadu_ps(lo + 8 * j),
               _mm256_loadu_ps(st + 8 * j));
  const __m256 am = _mm256_max_ps(x.amax[0], x.amax[1]);
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(am), _mm256_extractf128_ps(am, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float amax = _mm_cvtss_f32(m4);
  const float alpha = scan_alpha(amax);
  const float inv = scan_inverse(amax, alpha);
  const __m256 va = _mm256_set1_ps(alpha), vi = _mm256_set1_ps(inv);
  const __m256 vb = _mm256_set1_ps(alpha * kFineStep), vf = _mm256_set1_ps(scan_fine_inverse(alpha));
  for (std::size_t j = 0; j < n8; ++j) {
    const plane_codes r = prep_pass2(x, int(j % 2), _mm256_loadu_ps(q + 8 * j),
                                     _mm256_loadu_ps(st + 8 * j), va, vi, vb, vf);
    store_qa8(qa + j * qa_stride, r.r);
    store_qa8(qf + j * qa_stride, r.r_f);
  }
  __m256 c[2], m[2];
  for (int h = 0; h < 2; ++h) {
    c[h] = _mm256_fmadd_ps(x.ce[h], _mm256_set1_ps(15.0f), _mm256_add_ps(x.ca[h], x.cb[h]));
    m[h] = _mm256_fmadd_ps(x.s[h], _mm256_set1_ps(24.0f), x.p[h]);
  }
  alignas(32) float t0[8], t1[8];
  _mm256_store_ps(t0, tree8x2(_mm256_add_ps(c[0], c[1]), _mm256_add_ps(x.s[0], x.s[1])));
  _mm256_store_ps(t1, tree8x2(_mm256_add_ps(x.q2[0], x.q2[1]), _mm256_add_ps(m[0], m[1])));
  out.raw_alpha = alpha;
  out.sum_c = t0[0];
  out.sum_s = t0[4];
  out.sum_q2 = t1[0];
  out.sum_m = t1[4];
}

/// The preparation of one block for nq queries (q: [nq][padded_dim]; qa: both planes,
/// each octet-major, 8 nq bytes per octet).
CERTATTN_TARGET_AVX2 inline void prepare_block_queries_avx2(const float* lo, const float* st,
                                                            const float* q,
                                                            std::size_t padded_dim,
                                                            std::size_t nq, std::int8_t* qa,
                                                            block_query_prep* out) noexcept {
  std::int8_t* qf = fine_plane(qa, nq, padded_dim);
  for (std::size_t g = 0; g < nq; ++g)
    prepare_block_query_avx2(lo, st, q + g * padded_dim, padded_dim, qa + 8 * g, qf + 8 * g,
                             8 * nq, out[g]);
}

}  // namespace certattn::detail::avx2
CERTATTN_ARCH_END
#endif

#include <certattn/arch/macros_undef.hpp>
