// Candidate generation: E_up >= E for every pool token (hashed once per call, shared by
// the G heads), then per head every token whose perturbed score bound
// y = u + E_up - c can reach the deepest level searched, with a conservative earliest
// level (never later than the true one). The AVX-512 kernels, the portable ones and the
// scalar twins evaluate the same float operations, so all give the same candidates.
#pragma once

#include <certattn/arch/dispatch.hpp>
#include <certattn/arch/portable.hpp>
#include <certattn/perturb.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include <certattn/arch/macros.hpp>

namespace certattn::detail {

struct candidate_params {
  float c = 0.0f;           // reference score, rounded down to float
  float slack = 0.0f;       // covers float rounding of u + E_up - c
  float threshold = 0.0f;   // keep y >= threshold (ln tau of the deepest level searched)
  float upper = 0.0f;       // ... and y < upper (+inf, or the previous pass's threshold)
  float level_scale = 0.0f; // -r / ln 2
  int min_level = 0;        // levels are clamped to [min_level, max_level]
  int max_level = 0;
};

/// E_up for tokens [0, n) of one call (shared by the G heads): e[t] >= E_t.
inline void fill_exp1_upper_scalar(std::uint64_t noise, std::size_t n, float* e) noexcept {
  for (std::size_t t = 0; t < n; ++t)
    e[t] = perturbation::exp1_upper_from_bits(mix64(noise + (std::uint64_t(t) + 1) * kGolden));
}

/// a + b rounded towards +inf (exactly what an upward-rounding float add gives): the
/// nearest sum, raised by one ulp when its TwoSum error is positive.
inline float add_round_up(float a, float b) noexcept {
  const float s = a + b;
  const float bb = s - a;
  const float err = (a - (s - bb)) + (b - bb);  // exact unless s overflowed (then +-inf/NaN)
  return err > 0.0f ? std::nextafter(s, std::numeric_limits<float>::infinity()) : s;
}

/// e[t] = e[t] + off[t] rounded up, for tokens [0, n): value-aware sampling's offsets
/// folded into the perturbation bounds.
inline void add_offsets_upper_scalar(float* e, const float* off, std::size_t n) noexcept {
  for (std::size_t t = 0; t < n; ++t) e[t] = add_round_up(e[t], off[t]);
}

/// Appends the candidates among tokens [0, n) to idx/lvl; returns their number.
/// y = u + E_up - c + slack >= ln tau_j is necessary for a token to be in S_j.
inline std::size_t find_candidates_scalar(const float* u, const float* e, std::size_t n,
                                          const candidate_params& p, std::uint32_t* idx,
                                          std::uint8_t* lvl) noexcept {
  std::size_t m = 0;
  for (std::size_t t = 0; t < n; ++t) {
    const float y = ((u[t] + e[t]) - p.c) + p.slack;
    if (!(y >= p.threshold && y < p.upper)) continue;
    float z = std::ceil(std::fma(y, p.level_scale, -1e-3f));
    z = std::min(std::max(z, float(p.min_level)), float(p.max_level));
    idx[m] = std::uint32_t(t);
    lvl[m] = std::uint8_t(z);
    ++m;
  }
  return m;
}

/// The kernels below AVX-512 (the dispatch's fallback): the portable batches (arch/
/// portable.hpp) where they give the scalar twins' bits, the scalar twins for the tail and
/// where the build's target has no fused multiply-add. Same results as the twins.
inline void fill_exp1_upper_portable(std::uint64_t noise, std::size_t n, float* e) noexcept {
  std::size_t t = 0;
#if CERTATTN_PORTABLE_SIMD
  if constexpr (portable::portable_has_fma) t = portable::fill_exp1_upper(noise, n, e);
#endif
  // Token t + i hashes like i under key + t golden.
  fill_exp1_upper_scalar(noise + std::uint64_t(t) * kGolden, n - t, e + t);
}

inline void add_offsets_upper_portable(float* e, const float* off, std::size_t n) noexcept {
  std::size_t t = 0;
#if CERTATTN_PORTABLE_SIMD
  t = portable::add_offsets_upper(e, off, n);
#endif
  add_offsets_upper_scalar(e + t, off + t, n - t);
}

/// E_up for tokens [0, n) with value-aware offsets folded in (off null: none): what the
/// call's perturbation stage writes, in one pass where the instruction set fuses it.
inline void perturbation_bounds_portable(std::uint64_t noise, std::size_t n, const float* off,
                                         float* e) noexcept {
  fill_exp1_upper_portable(noise, n, e);
  if (off != nullptr) add_offsets_upper_portable(e, off, n);
}

inline std::size_t find_candidates_portable(const float* u, const float* e, std::size_t n,
                                            const candidate_params& p, std::uint32_t* idx,
                                            std::uint8_t* lvl) noexcept {
  std::size_t t = 0, m = 0;
#if CERTATTN_PORTABLE_SIMD
  if constexpr (portable::portable_has_fma) t = portable::find_candidates(u, e, n, p, idx, lvl, &m);
#endif
  const std::size_t tail = find_candidates_scalar(u + t, e + t, n - t, p, idx + m, lvl + m);
  for (std::size_t i = m; i < m + tail; ++i) idx[i] += std::uint32_t(t);
  return m + tail;
}

#if CERTATTN_X86
CERTATTN_ARCH_BEGIN
CERTATTN_TARGET_AVX512 inline __m512 exp1_upper_avx512(__m512i lo8, __m512i hi8) noexcept {
  // Top 24 bits of the 16 hashes, as 16 int32 (lo8: tokens 0-7, hi8: tokens 8-15).
  const __m256i a = _mm512_cvtepi64_epi32(_mm512_srli_epi64(lo8, 40));
  const __m256i b = _mm512_cvtepi64_epi32(_mm512_srli_epi64(hi8, 40));
  const __m512i t = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
  const __m512 x = _mm512_cvtepi32_ps(t);
  const __m512i xb = _mm512_castps_si512(x);
  const __m512 e = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(xb, 23),
                                                       _mm512_set1_epi32(127)));
  const __m512 m = _mm512_castsi512_ps(_mm512_or_si512(
      _mm512_and_si512(xb, _mm512_set1_epi32(0x7fffff)), _mm512_set1_epi32(0x3f800000)));
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 f = _mm512_sub_ps(m, one);
  const __m512 cf = _mm512_mul_ps(_mm512_set1_ps(perturbation::kLogQuad), f);
  const __m512 log2t = _mm512_add_ps(e, _mm512_fmadd_ps(cf, _mm512_sub_ps(one, f), f));
  __m512 r = _mm512_mul_ps(_mm512_sub_ps(_mm512_set1_ps(perturbation::kLog2Offset), log2t),
                           _mm512_set1_ps(perturbation::kLn2f));
  const __mmask16 zero = _mm512_cmpeq_epi32_mask(t, _mm512_setzero_si512());
  return _mm512_mask_blend_ps(zero, r, _mm512_set1_ps(perturbation::kMaxExp1));
}

CERTATTN_TARGET_AVX512 inline __m512i mix64_avx512(__m512i x) noexcept {
  x = _mm512_xor_si512(x, _mm512_srli_epi64(x, 30));
  x = _mm512_mullo_epi64(x, _mm512_set1_epi64(std::int64_t(0xbf58476d1ce4e5b9ULL)));
  x = _mm512_xor_si512(x, _mm512_srli_epi64(x, 27));
  x = _mm512_mullo_epi64(x, _mm512_set1_epi64(std::int64_t(0x94d049bb133111ebULL)));
  return _mm512_xor_si512(x, _mm512_srli_epi64(x, 31));
}

/// E_up for tokens [0, n), with the value-aware offsets added (rounded up) as it is
/// written when kOffsets: one pass instead of a second one over E_up.
template <bool kOffsets>
CERTATTN_TARGET_AVX512 inline void hash_exp1_upper_avx512(std::uint64_t noise, std::size_t n,
                                                          const float* off, float* e) noexcept {
  const __m512i golden8 = _mm512_set1_epi64(std::int64_t(8 * kGolden));
  const __m512i key = _mm512_set1_epi64(std::int64_t(noise));
  // h = key + (t + 1) golden for the 16 tokens t .. t + 15, advanced by adding 16 golden.
  __m512i w0 = _mm512_mullo_epi64(_mm512_set_epi64(8, 7, 6, 5, 4, 3, 2, 1),
                                  _mm512_set1_epi64(std::int64_t(kGolden)));
  __m512i w1 = _mm512_add_epi64(w0, golden8);
  const __m512i step = _mm512_add_epi64(golden8, golden8);
  std::size_t t = 0;
  for (; t + 16 <= n; t += 16) {
    const __m512i h0 = mix64_avx512(_mm512_add_epi64(key, w0));
    const __m512i h1 = mix64_avx512(_mm512_add_epi64(key, w1));
    __m512 x = exp1_upper_avx512(h0, h1);
    if constexpr (kOffsets)
      x = _mm512_add_round_ps(x, _mm512_loadu_ps(off + t), _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC);
    _mm512_storeu_ps(e + t, x);
    w0 = _mm512_add_epi64(w0, step);
    w1 = _mm512_add_epi64(w1, step);
  }
  // The tail through the scalar twins: token t + i hashes like i under key + t golden.
  fill_exp1_upper_scalar(noise + std::uint64_t(t) * kGolden, n - t, e + t);
  if constexpr (kOffsets) add_offsets_upper_scalar(e + t, off + t, n - t);
}

CERTATTN_TARGET_AVX512 inline void fill_exp1_upper_avx512(std::uint64_t noise, std::size_t n,
                                                          float* e) noexcept {
  hash_exp1_upper_avx512<false>(noise, n, nullptr, e);
}

/// fill_exp1_upper_avx512, then (off not null) each offset added rounded up in the same
/// pass: add_offsets_upper_scalar()'s floats.
CERTATTN_TARGET_AVX512 inline void perturbation_bounds_avx512(std::uint64_t noise, std::size_t n,
                                                              const float* off, float* e) noexcept {
  if (off == nullptr)
    fill_exp1_upper_avx512(noise, n, e);
  else
    hash_exp1_upper_avx512<true>(noise, n, off, e);
}

CERTATTN_TARGET_AVX512 inline std::size_t find_candidates_avx512(
    const float* u, const float* e, std::size_t n, const candidate_params& p,
    std::uint32_t* idx, std::uint8_t* lvl) noexcept {
  std::size_t m = 0;
  const __m512 c = _mm512_set1_ps(p.c), slack = _mm512_set1_ps(p.slack);
  const __m512 thr = _mm512_set1_ps(p.threshold), up = _mm512_set1_ps(p.upper);
  const __m512 ls = _mm512_set1_ps(p.level_scale);
  const __m512 jmin = _mm512_set1_ps(float(p.min_level)), jmax = _mm512_set1_ps(float(p.max_level));
  const __m512i lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  std::size_t t = 0;
  for (; t + 16 <= n; t += 16) {
    const __m512 y = _mm512_add_ps(
        _mm512_sub_ps(_mm512_add_ps(_mm512_loadu_ps(u + t), _mm512_loadu_ps(e + t)), c), slack);
    const __mmask16 keep =
        _mm512_cmp_ps_mask(y, thr, _CMP_GE_OQ) & _mm512_cmp_ps_mask(y, up, _CMP_LT_OQ);
    if (keep == 0) continue;
    __m512 z = _mm512_roundscale_ps(_mm512_fmadd_ps(y, ls, _mm512_set1_ps(-1e-3f)),
                                    _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC);
    z = _mm512_min_ps(_mm512_max_ps(z, jmin), jmax);
    const __m512i zi = _mm512_cvttps_epi32(z);
    // Compress in a register, then a plain store: vpcompressd to memory is microcoded
    // and slow on AMD Zen 4 (the buffers have 16 entries of slack past any m).
    _mm512_storeu_si512(idx + m, _mm512_maskz_compress_epi32(
                                     keep, _mm512_add_epi32(_mm512_set1_epi32(int(t)), lanes)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(lvl + m),
                     _mm512_cvtepi32_epi8(_mm512_maskz_compress_epi32(keep, zi)));
    m += std::size_t(__builtin_popcount(keep));
  }
  const std::size_t tail = find_candidates_scalar(u + t, e + t, n - t, p, idx + m, lvl + m);
  for (std::size_t i = m; i < m + tail; ++i) idx[i] += std::uint32_t(t);
  return m + tail;
}
CERTATTN_ARCH_END
#endif

}  // namespace certattn::detail

#include <certattn/arch/macros_undef.hpp>
