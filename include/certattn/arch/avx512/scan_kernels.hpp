// AVX-512 VNNI 4-bit scan: one 64-byte load holds 4 channels (low nibbles) and the next 4
// (high nibbles) of 16 tokens, one token per 32-bit lane; vpdpbusd multiplies the unsigned
// codes by the broadcast int8 query and sums each lane's 4 products, so no horizontal sum
// is needed; each query has two int8 planes (the second carries the first's rounding,
// arch/scan_prep.hpp), added as 128 dot + dot_f. Codes are loaded once per chunk of up to
// 4 queries; each query's block
// maximum is kept in a register over the block's 8 groups. The preparation (a = q st,
// int8 quantisation, lane sums) runs two queries at a time in 16 float lanes, and its
// double ending four queries at a time (arch/scan_prep.hpp: the same bits as the others).
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
namespace certattn::detail::avx512 {

/// acc += the 4-byte dot products of the unsigned codes and the signed query word w,
/// broadcast from memory, per 32-bit lane (vpdpbusd with an embedded broadcast). Inline
/// assembly: GCC 12 copies the accumulator of _mm512_dpbusd_epi32 into a new register
/// and back around each call, and those copies, not the dpbusd, then bound the loop.
CERTATTN_TARGET_AVX512 __attribute__((always_inline)) inline __m512i dpbusd_bcast(
    __m512i acc, __m512i codes, const std::int8_t* w) noexcept {
  __asm__("vpdpbusd {%2%{1to16%}, %1, %0|%0, %1, %2%{1to16%}}"
          : "+v"(acc)
          : "v"(codes), "m"(*reinterpret_cast<const std::int32_t*>(w)));
  return acc;
}

/// One query's bounds of a group of 16 tokens from its two planes' integer dots (the
/// finish every AVX-512 scan kernel shares, hence their same bits): u = alpha (128 dot +
/// dot_f) + offset + min(holder, norm rho), stored at `at`; returns mx raised to u over
/// the live lanes (the pool's tokens).
CERTATTN_TARGET_AVX512 __attribute__((always_inline)) inline __m512 finish_bounds16(
    __m512i dot, __m512i dot_f, const block_query_prep& p, __m512 rb, __mmask16 live,
    float* at, __m512 mx) noexcept {
  dot = _mm512_add_epi32(_mm512_slli_epi32(dot, kFineShift), dot_f);  // 128 dot + dot_f
  const __m512 r = _mm512_fmadd_ps(_mm512_set1_ps(p.alpha), _mm512_cvtepi32_ps(dot),
                                   _mm512_set1_ps(p.offset));
  const __m512 t =
      _mm512_min_ps(_mm512_set1_ps(p.holder), _mm512_mul_ps(_mm512_set1_ps(p.norm), rb));
  const __m512 v = _mm512_add_ps(r, t);
  _mm512_storeu_ps(at, v);
  return _mm512_mask_max_ps(mx, live, mx, v);
}

/// Bounds of one block for NQ queries: u[g * u_stride + t] for its 128 tokens, and
/// bmax[g * bmax_stride] = max of u over its first `valid` tokens (the pool's). qa holds
/// the NQ queries' bytes of channel octet o at qa + o * qa_stride + 8 g. The codes are
/// read in order (one stream: interleaving groups defeats the hardware prefetcher), and
/// each query has 4 NS accumulators (low and high nibbles of both planes, NS octets in
/// turn): the 4 NS NQ dpbusd chains hide its 4-cycle latency (about two issue per cycle
/// on Zen 4). The second plane's bytes are at qf, with the first's layout.
template <int NQ, int NS>
CERTATTN_TARGET_AVX512 inline void scan_heads(const std::uint8_t* codes, const std::uint8_t* rho,
                                              std::size_t n_oct, const std::int8_t* qa,
                                              const std::int8_t* qf, std::size_t qa_stride,
                                              const block_query_prep* prep, float* u,
                                              std::size_t u_stride, std::size_t valid,
                                              float* bmax, std::size_t bmax_stride) noexcept {
  __m512 mx[NQ];
  _Pragma("GCC unroll 8")
  for (int g = 0; g < NQ; ++g) mx[g] = _mm512_set1_ps(-__builtin_inff());
  const __m512i mask = _mm512_set1_epi8(0x0F);
  const std::size_t block_bytes = kGroupsPerBlock * n_oct * 64;
  const std::uint8_t* c = codes;
  for (std::size_t grp = 0; grp < kGroupsPerBlock; ++grp) {
    __m512i acc[NQ][NS][2], acc_f[NQ][NS][2];
    _Pragma("GCC unroll 8")
    for (int g = 0; g < NQ; ++g)
      _Pragma("GCC unroll 8")
      for (int k = 0; k < NS; ++k)
        acc[g][k][0] = acc[g][k][1] = acc_f[g][k][0] = acc_f[g][k][1] = _mm512_setzero_si512();
    const std::int8_t* w = qa;
    const std::int8_t* wf = qf;
    std::size_t o = 0;
    auto octet = [&](int k) CERTATTN_TARGET_AVX512 {
      __m512i x = _mm512_loadu_si512(c);
      __asm__("" : "+v"(x));  // one load: GCC would fold it into both operations below
      // The next block's codes (a decode step reads them from memory).
      _mm_prefetch(reinterpret_cast<const char*>(c + block_bytes), _MM_HINT_T0);
      const __m512i lo = _mm512_and_si512(x, mask);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), mask);
      _Pragma("GCC unroll 8")
      for (int g = 0; g < NQ; ++g) {
        acc[g][k][0] = dpbusd_bcast(acc[g][k][0], lo, w + 8 * g);
        acc[g][k][1] = dpbusd_bcast(acc[g][k][1], hi, w + 8 * g + 4);
        acc_f[g][k][0] = dpbusd_bcast(acc_f[g][k][0], lo, wf + 8 * g);
        acc_f[g][k][1] = dpbusd_bcast(acc_f[g][k][1], hi, wf + 8 * g + 4);
      }
      c += 64;
      w += qa_stride;
      wf += qa_stride;
    };
    for (; o + NS <= n_oct; o += NS) {
      _Pragma("GCC unroll 8")
      for (int k = 0; k < NS; ++k) octet(k);
    }
    for (; o < n_oct; ++o) octet(0);
    const std::size_t first = grp * kGroupTokens;
    const __m512 rb = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(rho + first))));
    // Lanes of pool tokens (a prefix of the block; all 16 but in the last block).
    const std::size_t lanes = valid > first ? std::min(valid - first, kGroupTokens) : 0;
    const __mmask16 live = __mmask16((1u << lanes) - 1u);
    _Pragma("GCC unroll 8")
    for (int g = 0; g < NQ; ++g) {
      __m512i dot = _mm512_add_epi32(acc[g][0][0], acc[g][0][1]);
      __m512i dot_f = _mm512_add_epi32(acc_f[g][0][0], acc_f[g][0][1]);
      _Pragma("GCC unroll 8")
      for (int k = 1; k < NS; ++k) {
        dot = _mm512_add_epi32(dot, _mm512_add_epi32(acc[g][k][0], acc[g][k][1]));
        dot_f = _mm512_add_epi32(dot_f, _mm512_add_epi32(acc_f[g][k][0], acc_f[g][k][1]));
      }
      mx[g] = finish_bounds16(dot, dot_f, prep[g], rb, live, u + g * u_stride + first, mx[g]);
    }
  }
  _Pragma("GCC unroll 8")
  for (int g = 0; g < NQ; ++g) bmax[g * bmax_stride] = _mm512_reduce_max_ps(mx[g]);
}

/// One block for nq queries; qa in the octet-major layout of prepare_block_query().
CERTATTN_TARGET_AVX512 inline void scan_block(const std::uint8_t* codes, const std::uint8_t* rho,
                                              std::size_t padded_dim, const std::int8_t* qa,
                                              const block_query_prep* prep, std::size_t nq,
                                              float* u, std::size_t u_stride, std::size_t valid,
                                              float* bmax, std::size_t bmax_stride) noexcept {
  const std::size_t n_oct = padded_dim / 8;
  const std::int8_t* qf = fine_plane(qa, nq, padded_dim);
#define CERTATTN_SCAN_HEADS(N, NS)                                                             \
  scan_heads<N, NS>(codes, rho, n_oct, qa + 8 * g, qf + 8 * g, 8 * nq, prep + g,               \
                    u + g * u_stride, u_stride, valid, bmax + g * bmax_stride, bmax_stride)
  std::size_t g = 0;
  for (; g + 4 <= nq; g += 4) CERTATTN_SCAN_HEADS(4, 1);
  switch (nq - g) {
    case 3: CERTATTN_SCAN_HEADS(3, 1); break;
    case 2: CERTATTN_SCAN_HEADS(2, 2); break;
    case 1: CERTATTN_SCAN_HEADS(1, 2); break;
    default: break;
  }
#undef CERTATTN_SCAN_HEADS
}

/// scan_tree16() of four vectors at once: lane 4k of the result is the sum of v_k.
CERTATTN_TARGET_AVX512 inline __m512 tree16x4(__m512 v0, __m512 v1, __m512 v2,
                                              __m512 v3) noexcept {
  // x_l + x_{l+8}: [v0 | v1] and [v2 | v3], 8 lanes each.
  const __m512 w01 = _mm512_add_ps(_mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 w23 = _mm512_add_ps(_mm512_shuffle_f32x4(v2, v3, _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(v2, v3, _MM_SHUFFLE(3, 2, 3, 2)));
  // + 4: 4 lanes per vector, one 128-bit lane each.
  const __m512 c = _mm512_add_ps(_mm512_shuffle_f32x4(w01, w23, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_f32x4(w01, w23, _MM_SHUFFLE(3, 1, 3, 1)));
  // (c0 + c2) + (c1 + c3).
  const __m512 d = _mm512_add_ps(c, _mm512_permute_ps(c, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm512_add_ps(d, _mm512_permute_ps(d, _MM_SHUFFLE(2, 3, 0, 1)));
}

/// prepare_block_query() (arch/scan_prep.hpp) for NH queries at once (their dependency
/// chains interleave), with the 16 lanes in one register: the same operations in the
/// same order and the same tree, hence the same bits. n16 vectors of 16 channels (the
/// last one half when padded_dim % 16 == 8); query h is q + h * q_stride, its int8 bytes
/// go to qa + h * query_bytes (8: the octet-major layout), its results to out[h].
template <int NH>
CERTATTN_TARGET_AVX512 __attribute__((always_inline)) inline void prep_body(
    const float* lo, const float* st, const float* q, std::size_t q_stride, std::size_t n16,
    bool half, std::int8_t* qa, std::int8_t* qf, std::size_t qa_stride, block_query_prep* out,
    std::size_t query_bytes) noexcept {
  const __m512 zero = _mm512_setzero_ps();
  __m512 amax[NH], ca[NH], cb[NH], s[NH], q2[NH], p[NH], ce[NH];
  _Pragma("GCC unroll 4")
  for (int h = 0; h < NH; ++h) amax[h] = ca[h] = cb[h] = s[h] = q2[h] = p[h] = ce[h] = zero;
  auto load = [half, n16](const float* x, std::size_t j) CERTATTN_TARGET_AVX512 {
    return half && j + 1 == n16 ? _mm512_maskz_loadu_ps(0x00FF, x + 16 * j)
                                : _mm512_loadu_ps(x + 16 * j);
  };
  _Pragma("GCC unroll 16")
  for (std::size_t j = 0; j < n16; ++j) {
    const __m512 lv = load(lo, j), sv = load(st, j);
    _Pragma("GCC unroll 4")
    for (int h = 0; h < NH; ++h) {
      const __m512 qv = load(q + h * q_stride, j);
      const __m512 a = _mm512_mul_ps(qv, sv);
      const __m512 fa = _mm512_abs_ps(a);
      amax[h] = _mm512_max_ps(fa, amax[h]);
      s[h] = _mm512_add_ps(s[h], fa);
      q2[h] = _mm512_fmadd_ps(a, a, q2[h]);
      ca[h] = _mm512_fmadd_ps(qv, lv, ca[h]);
      cb[h] = _mm512_fmadd_ps(a, _mm512_set1_ps(0.5f), cb[h]);
      p[h] = _mm512_add_ps(p[h], _mm512_abs_ps(_mm512_mul_ps(qv, lv)));
    }
  }
  float alpha[NH];
  __m512 va[NH], vi[NH], vb[NH], vf[NH];
  _Pragma("GCC unroll 4")
  for (int h = 0; h < NH; ++h) {
    const float m = _mm512_reduce_max_ps(amax[h]);
    alpha[h] = scan_alpha(m);
    va[h] = _mm512_set1_ps(alpha[h]);
    vi[h] = _mm512_set1_ps(scan_inverse(m, alpha[h]));
    vb[h] = _mm512_set1_ps(alpha[h] * kFineStep);
    vf[h] = _mm512_set1_ps(scan_fine_inverse(alpha[h]));
  }
  const __m512 round = _mm512_set1_ps(kScanRound);
  _Pragma("GCC unroll 16")
  for (std::size_t j = 0; j < n16; ++j) {
    const __m512 sv = load(st, j);
    _Pragma("GCC unroll 4")
    for (int h = 0; h < NH; ++h) {
      const __m512 a = _mm512_mul_ps(load(q + h * q_stride, j), sv);
      // y = round + RNE(a inv): its low byte is the two's complement code.
      const __m512 y = _mm512_fmadd_ps(a, vi[h], round);
      const __m512 r = _mm512_sub_ps(y, round);
      const __m512 e = _mm512_fnmadd_ps(va[h], r, a);
      // The second plane: y_f = round + RNE(e inv_f), e_f = e - beta r_f.
      const __m512 yf = _mm512_fmadd_ps(e, vf[h], round);
      const __m512 ef = _mm512_fnmadd_ps(vb[h], _mm512_sub_ps(yf, round), e);
      ce[h] = _mm512_add_ps(ce[h], _mm512_max_ps(ef, zero));
      const std::size_t at = h * query_bytes + 2 * j * qa_stride;
      const bool full = !(half && j + 1 == n16);
      const __m128 b = _mm_castsi128_ps(_mm512_cvtepi32_epi8(_mm512_castps_si512(y)));
      const __m128 bf = _mm_castsi128_ps(_mm512_cvtepi32_epi8(_mm512_castps_si512(yf)));
      if (qa_stride == 8 && full) {  // consecutive octets (the AMX scan's rows): one store
        _mm_storeu_ps(reinterpret_cast<float*>(qa + at), b);
        _mm_storeu_ps(reinterpret_cast<float*>(qf + at), bf);
        continue;
      }
      _mm_storel_pi(reinterpret_cast<__m64*>(qa + at), b);
      if (full) _mm_storeh_pi(reinterpret_cast<__m64*>(qa + at + qa_stride), b);
      _mm_storel_pi(reinterpret_cast<__m64*>(qf + at), bf);
      if (full) _mm_storeh_pi(reinterpret_cast<__m64*>(qf + at + qa_stride), bf);
    }
  }
  _Pragma("GCC unroll 4")
  for (int h = 0; h < NH; ++h) {
    const __m512 c = _mm512_fmadd_ps(ce[h], _mm512_set1_ps(15.0f), _mm512_add_ps(ca[h], cb[h]));
    const __m512 m = _mm512_fmadd_ps(s[h], _mm512_set1_ps(24.0f), p[h]);
    alignas(64) float t[16];
    _mm512_store_ps(t, tree16x4(c, s[h], q2[h], m));
    out[h].raw_alpha = alpha[h];
    out[h].sum_c = t[0];
    out[h].sum_s = t[4];
    out[h].sum_q2 = t[8];
    out[h].sum_m = t[12];
  }
}

template <int NH>
CERTATTN_TARGET_AVX512 inline void prep_heads(const float* lo, const float* st, const float* q,
                                              std::size_t padded_dim, std::int8_t* qa,
                                              std::int8_t* qf, std::size_t qa_stride,
                                              block_query_prep* out,
                                              std::size_t query_bytes = 8) noexcept {
  switch (padded_dim) {  // the common head dims with a compile-time vector count
    case 64:
      return prep_body<NH>(lo, st, q, padded_dim, 4, false, qa, qf, qa_stride, out, query_bytes);
    case 128:
      return prep_body<NH>(lo, st, q, padded_dim, 8, false, qa, qf, qa_stride, out, query_bytes);
    default:
      return prep_body<NH>(lo, st, q, padded_dim, (padded_dim + 15) / 16, padded_dim % 16 != 0,
                           qa, qf, qa_stride, out, query_bytes);
  }
}

/// The preparation of one block for nq queries (q: [nq][padded_dim]; qa: both planes, each
/// octet-major, 8 nq bytes per octet): pairs of queries at once (their chains interleave).
CERTATTN_TARGET_AVX512 inline void prepare_block_queries_avx512(const float* lo, const float* st,
                                                                const float* q,
                                                                std::size_t padded_dim,
                                                                std::size_t nq, std::int8_t* qa,
                                                                block_query_prep* out) noexcept {
  std::int8_t* qf = fine_plane(qa, nq, padded_dim);
  std::size_t g = 0;
  for (; g + 2 <= nq; g += 2)
    prep_heads<2>(lo, st, q + g * padded_dim, padded_dim, qa + 8 * g, qf + 8 * g, 8 * nq, out + g);
  if (g < nq)
    prep_heads<1>(lo, st, q + g * padded_dim, padded_dim, qa + 8 * g, qf + 8 * g, 8 * nq, out + g);
}

/// finish_prep() for four queries per register: the same double operations in the same
/// order (explicit fmas where finish_prep_one() has them), hence the same bits.
CERTATTN_TARGET_AVX512 inline void finish_prep_avx512(block_query_prep* prep, std::size_t n,
                                                      const scan_constants& k,
                                                      block_maxima bm) noexcept {
  std::size_t g = 0;
  for (; g + 4 <= n; g += 4) {
    // raw_alpha, sum_c, sum_s, sum_q2 of four queries, transposed; then sum_m, max_abs_q.
    __m128 f0 = _mm_loadu_ps(&prep[g].raw_alpha), f1 = _mm_loadu_ps(&prep[g + 1].raw_alpha);
    __m128 f2 = _mm_loadu_ps(&prep[g + 2].raw_alpha), f3 = _mm_loadu_ps(&prep[g + 3].raw_alpha);
    _MM_TRANSPOSE4_PS(f0, f1, f2, f3);
    const __m256d a = _mm256_cvtps_pd(f0), c = _mm256_cvtps_pd(f1), s = _mm256_cvtps_pd(f2);
    const __m256d q2 = _mm256_cvtps_pd(f3);
    const __m256d m = _mm256_setr_pd(prep[g].sum_m, prep[g + 1].sum_m, prep[g + 2].sum_m,
                                     prep[g + 3].sum_m);
    const __m256d qm = _mm256_setr_pd(prep[g].max_abs_q, prep[g + 1].max_abs_q,
                                      prep[g + 2].max_abs_q, prep[g + 3].max_abs_q);
    const __m256d rel = _mm256_set1_pd(k.rel), scale = _mm256_set1_pd(k.scale);
    const __m256d infl = _mm256_set1_pd(1.0 + 0x1p-20), tiny = _mm256_set1_pd(0x1p-150);
    const __m256d ops_sum = _mm256_set1_pd(k.ops_sum);
    const __m256d qs = _mm256_mul_pd(qm, _mm256_set1_pd(double(bm.st)));
    const __m256d big = _mm256_mul_pd(_mm256_mul_pd(_mm256_set1_pd(k.dim), qm),
                                      _mm256_set1_pd(double(bm.lo) + 32.0 * double(bm.st)));
    const __m256d big2 = _mm256_mul_pd(_mm256_mul_pd(_mm256_set1_pd(k.dim), qs), qs);
    const __m256d sub = _mm256_min_pd(tiny, _mm256_mul_pd(big, infl));
    const __m256d sub2 = _mm256_min_pd(tiny, _mm256_mul_pd(big2, infl));
    const __m256d s_up = _mm256_mul_pd(s, rel);
    const __m256d mag_up = _mm256_fmadd_pd(_mm256_set1_pd(k.alpha_mag), a,
                                           _mm256_mul_pd(_mm256_fmadd_pd(ops_sum, sub, m), rel));
    const __m256d c_up = _mm256_add_pd(
        c, _mm256_fmadd_pd(_mm256_set1_pd(k.margin), mag_up,
                           _mm256_mul_pd(_mm256_set1_pd(k.ops_c), sub)));
    const __m256d n_up = _mm256_sqrt_pd(_mm256_mul_pd(_mm256_fmadd_pd(ops_sum, sub2, q2), rel));
    auto round_up = [](__m256d x) CERTATTN_TARGET_AVX512 {
      const __m256d ax = _mm256_andnot_pd(_mm256_set1_pd(-0.0), x);
      return _mm256_cvtpd_ps(_mm256_add_pd(_mm256_fmadd_pd(ax, _mm256_set1_pd(0x1p-22), x),
                                           _mm256_set1_pd(0x1p-149)));
    };
    __m128 o0 = _mm256_cvtpd_ps(  // beta'
        _mm256_mul_pd(_mm256_mul_pd(scale, a), _mm256_set1_pd(double(kFineStep))));
    __m128 o1 = round_up(_mm256_fmadd_pd(scale, c_up, _mm256_set1_pd(k.abs_u)));
    __m128 o2 = round_up(_mm256_mul_pd(scale, _mm256_mul_pd(_mm256_set1_pd(0.5), s_up)));
    __m128 o3 =
        round_up(_mm256_mul_pd(_mm256_mul_pd(scale, n_up), _mm256_set1_pd(k.norm_step)));
    _MM_TRANSPOSE4_PS(o0, o1, o2, o3);  // alpha, offset, holder, norm of each query
    _mm_storeu_ps(&prep[g].alpha, o0);
    _mm_storeu_ps(&prep[g + 1].alpha, o1);
    _mm_storeu_ps(&prep[g + 2].alpha, o2);
    _mm_storeu_ps(&prep[g + 3].alpha, o3);
  }
  for (; g < n; ++g) finish_prep_one(prep[g], k, bm);
}

/// block_scale_maxima() and max_abs() (arch/scan_prep.hpp) 16 lanes at a time.
CERTATTN_TARGET_AVX512 inline __m512 abs_max_lanes(const float* x, std::size_t n) noexcept {
  __m512 m = _mm512_setzero_ps();
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
  if (i < n)
    m = _mm512_max_ps(
        m, _mm512_abs_ps(_mm512_maskz_loadu_ps(__mmask16((1u << (n - i)) - 1u), x + i)));
  return m;
}

CERTATTN_TARGET_AVX512 inline block_maxima block_scale_maxima_avx512(
    const float* lo, const float* st, std::size_t padded_dim) noexcept {
  return {_mm512_reduce_max_ps(abs_max_lanes(lo, padded_dim)),
          _mm512_reduce_max_ps(abs_max_lanes(st, padded_dim))};
}

CERTATTN_TARGET_AVX512 inline float max_abs_avx512(const float* x, std::size_t n) noexcept {
  return _mm512_reduce_max_ps(abs_max_lanes(x, n));
}

}  // namespace certattn::detail::avx512
CERTATTN_ARCH_END
#endif

#include <certattn/arch/macros_undef.hpp>
