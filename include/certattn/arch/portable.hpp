// The portable kernels: one xsimd::batch source compiled for the translation unit's own
// target: NEON on aarch64, and on x86-64 the -march level when it has FMA (e.g. -mavx2
// -mfma or -march=native). They are the fallback of the runtime dispatch (isa::kScalar),
// and serve the stages without a hand-written kernel at isa::kAvx2, below the AVX2 /
// AVX-512 kernels that x86 selects at run time with function-level target attributes.
//
// The default x86-64 target (SSE2, no FMA) runs the scalar twins instead and does not
// include xsimd: there the batch forms of the kernels that need a fused multiply-add
// cannot give the twins' bits, the fp16 score dot was slower than its twin (135 against
// 116 ns at d = 128) and the dense kernel no faster, while xsimd's headers cost every
// translation unit that includes certattn 0.3-0.4 s of compile time.
//
// Every kernel keeps the lane structure of its scalar twin, whatever the batch width
// (channel mod 8 for double sums, mod 16 for float ones, one fixed reduction tree), so it
// gives the twin's bits: the certificate's sample sets do not depend on the ISA. Kernels
// whose bits need a fused multiply-add (an inexact product added in one rounding) use the
// batch form only where the target has one (portable_has_fma); elsewhere they run the
// scalar twin, whose std::fma is correctly rounded. Kernels whose products are exact in
// double (exact scores, norms) give the same bits fused or not and always run in batches.
#pragma once

#include <certattn/arch/dispatch.hpp>
#include <certattn/arch/scalar/dense_kernels.hpp>
#include <certattn/common.hpp>
#include <certattn/perturb.hpp>

// The condition of CERTATTN_PORTABLE_SIMD (arch/macros.hpp), which is defined below.
#if (defined(__aarch64__) && defined(__ARM_NEON)) || (defined(__x86_64__) && defined(__FMA__))
#include <xsimd/xsimd.hpp>
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include <certattn/arch/macros.hpp>

namespace certattn::detail::portable {

#if CERTATTN_PORTABLE_SIMD
using arch = xsimd::default_arch;
using batch_d = xsimd::batch<double, arch>;
using batch_f = xsimd::batch<float, arch>;
using batch_u32 = xsimd::batch<std::uint32_t, arch>;
inline constexpr std::size_t nd = batch_d::size;  // doubles per batch (2 with NEON or SSE2)
inline constexpr std::size_t nf = batch_f::size;  // floats per batch
static_assert(8 % nd == 0 && 16 % nf == 0, "the fixed lanes must split into whole batches");

/// Whether xsimd::fma is one fused instruction on this target (NEON always; x86 with
/// -mfma or AVX-512). Without it xsimd computes x * y + z in two roundings.
inline constexpr bool portable_has_fma =
    XSIMD_WITH_NEON64 || XSIMD_WITH_FMA3_SSE || XSIMD_WITH_FMA3_AVX || XSIMD_WITH_AVX512F;

/// Whether fp16 elements widen in one instruction (NEON). Elsewhere the portable score dot
/// of fp16 keys measured slower than the scalar twin (SSE2: 135 against 116 ns at
/// d = 128), and the dispatch keeps the twin for them.
inline constexpr bool portable_fast_half = XSIMD_WITH_NEON64;

/// The name of the batch target, e.g. "arm64+neon", "sse2".
inline const char* arch_name() noexcept { return arch::name(); }
#else
inline constexpr bool portable_has_fma = false;
inline constexpr bool portable_fast_half = false;
inline const char* arch_name() noexcept { return "scalar"; }
#endif

/// n <= 16 elements as floats (exact), branch-free so that the compiler vectorises it.
template <class T>
inline void widen_to_float(const T* p, float* out, std::size_t n) noexcept {
  if constexpr (std::is_same_v<T, half>) {
    std::uint16_t b[16];
    std::memcpy(b, p, n * 2);
    for (std::size_t l = 0; l < n; ++l) out[l] = half_bits_to_float(b[l]);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    std::uint16_t b[16];
    std::memcpy(b, p, n * 2);
    for (std::size_t l = 0; l < n; ++l) {
      const std::uint32_t u = std::uint32_t(b[l]) << 16;  // bf16 is the top half of a float
      std::memcpy(out + l, &u, 4);
    }
  } else {
    for (std::size_t l = 0; l < n; ++l) out[l] = float(p[l]);
  }
}

/// The fixed tree over 8 double lanes (the same additions as scan_prep.hpp's reduce8).
inline double tree8(const double* a) noexcept {
  return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}
/// The fixed tree over 16 float lanes (refine_kernels.hpp's reduce16).
inline float tree16(const float* a) noexcept {
  float b[8];
  for (int i = 0; i < 8; ++i) b[i] = a[i] + a[i + 8];
  float c[4];
  for (int i = 0; i < 4; ++i) c[i] = b[i] + b[i + 4];
  return (c[0] + c[2]) + (c[1] + c[3]);
}

#if CERTATTN_PORTABLE_SIMD

/// A batch built element by element from f(0), ..., f(size - 1), in registers. xsimd 8.1
/// has no widening conversions (float -> double, fp16 -> float, uint8 -> float between
/// batches of different widths); widening through a stack array and a vector load stalls
/// on store forwarding (measured 2-10x slower than the scalar twin at d = 128), while
/// the element-wise constructor lets the compiler keep the lanes in registers.
template <class B, class F, std::size_t... I>
inline B make_batch(F&& f, std::index_sequence<I...>) noexcept {
  return B{f(I)...};  // kernel::set(): the lanes from registers
}
template <class B, class F>
inline B make_batch(F&& f) noexcept {
  return make_batch<B>(f, std::make_index_sequence<B::size>());
}

/// Element p[i] of a cache row as double (exact).
template <class T>
inline double elem_as_double(const T* p, std::size_t i) noexcept {
  if constexpr (std::is_same_v<T, half>) {
    std::uint16_t b;
    std::memcpy(&b, p + i, 2);
    return double(half_bits_to_float(b));
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    std::uint16_t b;
    std::memcpy(&b, p + i, 2);
    const std::uint32_t u = std::uint32_t(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return double(f);
  } else {
    return double(p[i]);
  }
}

/// nd elements from p as a double batch. The widening conversions xsimd 8.1 lacks are
/// written with the target's own intrinsics where it has them (NEON: fcvtl, and fp16 ->
/// float in one instruction; SSE2: cvtps2pd), element-wise elsewhere. All exact.
template <class T>
inline batch_d load_as_double(const T* p) noexcept {
#if XSIMD_WITH_NEON64
  if constexpr (nd == 2) {
    if constexpr (std::is_same_v<T, float>) {
      return vcvt_f64_f32(vld1_f32(p));
    } else if constexpr (std::is_same_v<T, half>) {
      std::uint32_t h;
      std::memcpy(&h, p, 4);
      const float32x4_t f = vcvt_f32_f16(vreinterpret_f16_u32(vdup_n_u32(h)));
      return vcvt_f64_f32(vget_low_f32(f));
    } else if constexpr (std::is_same_v<T, bfloat16>) {
      std::uint32_t h;
      std::memcpy(&h, p, 4);
      const uint32x4_t u = vshll_n_u16(vreinterpret_u16_u32(vdup_n_u32(h)), 16);
      return vcvt_f64_f32(vget_low_f32(vreinterpretq_f32_u32(u)));
    }
  }
#elif XSIMD_WITH_SSE2 && !XSIMD_WITH_AVX
  if constexpr (nd == 2 && std::is_same_v<T, float>) {
    return _mm_cvtps_pd(_mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
#endif
  return make_batch<batch_d>([p](std::size_t i) { return elem_as_double(p, i); });
}

/// Eight double lanes as 8 / nd batches.
struct lanes8 {
  batch_d v[8 / nd];
  lanes8() noexcept {
    for (auto& x : v) x = batch_d(0.0);
  }
  void store(double* out) const noexcept {
    for (std::size_t j = 0; j < 8 / nd; ++j) v[j].store_unaligned(out + j * nd);
  }
};

/// Exact score q.k in double, 8 lanes (channel mod 8): score_dot()'s bits. The products
/// are exact in double, so the fused and the unfused multiply-add agree.
template <class T>
inline double score_dot(const float* q, const T* k, std::size_t d) noexcept {
  lanes8 acc;
  std::size_t o = 0;
  for (; o + 8 <= d; o += 8)
    for (std::size_t j = 0; j < 8 / nd; ++j)
      acc.v[j] = xsimd::fma(load_as_double(q + o + j * nd), load_as_double(k + o + j * nd), acc.v[j]);
  alignas(64) double l[8];
  acc.store(l);
  for (std::size_t i = 0; o + i < d; ++i) l[i] += double(q[o + i]) * to_double(k[o + i]);
  return tree8(l);
}

/// acc[i] = fma(w, v[i], acc[i]) and ||v||^2 in 8 lanes: accumulate_row_scalar()'s bits.
/// Needs portable_has_fma.
template <class T>
inline double accumulate_row(const T* v, std::size_t d, double w, double* acc) noexcept {
  const batch_d wv(w);
  lanes8 sq;
  std::size_t o = 0;
  for (; o + 8 <= d; o += 8) {
    for (std::size_t j = 0; j < 8 / nd; ++j) {
      const batch_d xb = load_as_double(v + o + j * nd);
      double* a = acc + o + j * nd;
      xsimd::fma(wv, xb, batch_d::load_unaligned(a)).store_unaligned(a);
      sq.v[j] = xsimd::fma(xb, xb, sq.v[j]);  // exact product
    }
  }
  alignas(64) double l[8];
  sq.store(l);
  for (std::size_t i = 0; o + i < d; ++i) {
    const double xi = to_double(v[o + i]);
    acc[o + i] = std::fma(w, xi, acc[o + i]);
    l[i] += xi * xi;
  }
  return tree8(l);
}

/// acc[i] = fma(w, v[i] - g[i], acc[i]), ||v||^2 and ||v - g||^2 in 8 lanes each:
/// accumulate_centered_row_scalar()'s bits. Needs portable_has_fma.
template <class T>
inline void accumulate_centered_row(const T* v, std::size_t d, double w, const double* g,
                                    double* acc, double* sq_out, double* sc_out) noexcept {
  const batch_d wv(w);
  lanes8 sq, sc;
  std::size_t o = 0;
  for (; o + 8 <= d; o += 8) {
    for (std::size_t j = 0; j < 8 / nd; ++j) {
      const batch_d xb = load_as_double(v + o + j * nd);
      const batch_d yb = xb - batch_d::load_unaligned(g + o + j * nd);
      double* a = acc + o + j * nd;
      xsimd::fma(wv, yb, batch_d::load_unaligned(a)).store_unaligned(a);
      sq.v[j] = xsimd::fma(xb, xb, sq.v[j]);
      sc.v[j] = xsimd::fma(yb, yb, sc.v[j]);
    }
  }
  alignas(64) double lq[8], lc[8];
  sq.store(lq);
  sc.store(lc);
  for (std::size_t i = 0; o + i < d; ++i) {
    const double xi = to_double(v[o + i]);
    const double yi = xi - g[o + i];
    acc[o + i] = std::fma(w, yi, acc[o + i]);
    lq[i] = std::fma(xi, xi, lq[i]);
    lc[i] = std::fma(yi, yi, lc[i]);
  }
  *sq_out = tree8(lq);
  *sc_out = tree8(lc);
}

/// sum a8 low in 16 float lanes with fused multiply-adds: refine_dot_scalar()'s bits
/// (a8 in its slot order; low: two channels' low nibbles per byte). Needs portable_has_fma.
inline float refine_dot(const float* a8, const std::uint8_t* low, std::size_t padded_dim) noexcept {
  batch_f acc[16 / nf];
  for (auto& x : acc) x = batch_f(0.0f);
  for (std::size_t o = 0; o < padded_dim; o += 32) {
    const std::size_t bytes = std::min<std::size_t>(16, (padded_dim - o) / 2);
    alignas(16) std::uint8_t b[16] = {};
    std::memcpy(b, low + o / 2, bytes);
    for (std::size_t j = 0; j < 16 / nf; ++j) {
      const std::uint8_t* bj = b + j * nf;
      const batch_f lo = make_batch<batch_f>([bj](std::size_t i) { return float(bj[i] & 0xF); });
      const batch_f hi = make_batch<batch_f>([bj](std::size_t i) { return float(bj[i] >> 4); });
      acc[j] = xsimd::fma(batch_f::load_unaligned(a8 + o + j * nf), lo, acc[j]);
      acc[j] = xsimd::fma(batch_f::load_unaligned(a8 + o + 16 + j * nf), hi, acc[j]);
    }
  }
  alignas(64) float l[16];
  for (std::size_t j = 0; j < 16 / nf; ++j) acc[j].store_aligned(l + j * nf);
  return tree16(l);
}

/// prepare_refine_block()'s sums: a8 = q st8 (float, st8 = st4 / 16) into its slots
/// (refine_slot(), common.hpp; the caller zeroes the padding), and per lane
/// (channel mod 8) c += max(a8, 0) - a / 2 (a = q st4, float), |a|, |a8| in double.
inline void prepare_refine_sums(const float* q, const float* st4, std::size_t padded_dim,
                                float* a8, double* c_out, double* abs_a_out,
                                double* abs_a8_out) noexcept {
  lanes8 c, abs_a, abs_a8;
  const batch_d zero(0.0), half(0.5);
  for (std::size_t o = 0; o < padded_dim; o += 8) {  // padded_dim is a multiple of 8
    for (std::size_t j = 0; j < 8 / nd; ++j) {
      const std::size_t i0 = o + j * nd;
      const batch_d ab =
          make_batch<batch_d>([&](std::size_t i) { return double(q[i0 + i] * st4[i0 + i]); });
      const batch_d a8b = make_batch<batch_d>([&](std::size_t i) {
        const std::size_t ch = i0 + i;
        const float x = q[ch] * step8_of(st4[ch]);  // float: inside the margin
        a8[refine_slot(ch)] = x;
        return double(x);
      });
      c.v[j] = c.v[j] + (xsimd::max(a8b, zero) - half * ab);
      abs_a.v[j] = abs_a.v[j] + xsimd::abs(ab);
      abs_a8.v[j] = abs_a8.v[j] + xsimd::abs(a8b);
    }
  }
  c.store(c_out);
  abs_a.store(abs_a_out);
  abs_a8.store(abs_a8_out);
}


// ---- candidates and perturbation bounds (arch/candidate_kernels.hpp) ---------------------
// Each processes whole batches and returns how many tokens it did; the caller finishes the
// tail with the scalar twin.

/// E_up for tokens [0, n): the hashes in scalar 64-bit code (NEON has no 64-bit vector
/// multiply), their top 24 bits through perturbation::exp1_upper_from_bits()'s float
/// operations in batches. Needs portable_has_fma.
inline std::size_t fill_exp1_upper(std::uint64_t noise, std::size_t n, float* e) noexcept {
  using batch_i32 = xsimd::batch<std::int32_t, arch>;
  const batch_f one(1.0f), quad(perturbation::kLogQuad), offset(perturbation::kLog2Offset),
      ln2(perturbation::kLn2f), top(perturbation::kMaxExp1);
  const batch_i32 mant(0x7fffff), expo(0x3f800000), bias(127);
  std::size_t t = 0;
  for (; t + nf <= n; t += nf) {
    const batch_i32 ti = make_batch<batch_i32>([noise, t](std::size_t l) {
      return std::int32_t(mix64(noise + (std::uint64_t(t + l) + 1) * kGolden) >> 40);
    });
    const batch_f x = xsimd::batch_cast<float>(ti);  // exact: t < 2^24
    const batch_i32 xb = xsimd::bitwise_cast<batch_i32>(x);
    const batch_f ex = xsimd::batch_cast<float>((xb >> 23) - bias);
    const batch_f m = xsimd::bitwise_cast<batch_f>((xb & mant) | expo);
    const batch_f f = m - one;
    const batch_f log2t = ex + xsimd::fma(quad * f, one - f, f);
    const batch_f r = (offset - log2t) * ln2;
    xsimd::select(x == batch_f(0.0f), top, r).store_unaligned(e + t);  // t = 0: the cap
  }
  return t;
}

/// e[t] = e[t] + off[t] rounded towards +inf (add_round_up(): TwoSum, then one ulp up when
/// the error is positive), for whole batches of [0, n).
inline std::size_t add_offsets_upper(float* e, const float* off, std::size_t n) noexcept {
  using batch_i32 = xsimd::batch<std::int32_t, arch>;
  const batch_f zero(0.0f);
  std::size_t t = 0;
  for (; t + nf <= n; t += nf) {
    const batch_f a = batch_f::load_unaligned(e + t), b = batch_f::load_unaligned(off + t);
    const batch_f s = a + b;
    const batch_f bb = s - a;
    const batch_f err = (a - (s - bb)) + (b - bb);
    // nextafter(s, +inf): the bits + 1 above zero, - 1 below, the smallest subnormal at 0.
    const batch_i32 sb = xsimd::bitwise_cast<batch_i32>(s);
    const batch_f up = xsimd::select(
        s > zero, xsimd::bitwise_cast<batch_f>(sb + 1),
        xsimd::select(s < zero, xsimd::bitwise_cast<batch_f>(sb - 1),
                      xsimd::bitwise_cast<batch_f>(batch_i32(1))));
    xsimd::select(err > zero, up, s).store_unaligned(e + t);
  }
  return t;
}

/// find_candidates_scalar() over whole batches of [0, n): y = ((u + e) - c) + slack kept
/// when threshold <= y < upper, its level ceil(fma(y, level_scale, -1e-3)) clamped to
/// [min_level, max_level]. Candidates are appended in token order. Needs portable_has_fma.
template <class Params>
inline std::size_t find_candidates(const float* u, const float* e, std::size_t n, const Params& p,
                                   std::uint32_t* idx, std::uint8_t* lvl, std::size_t* count) noexcept {
  const batch_f c(p.c), slack(p.slack), thr(p.threshold), upper(p.upper), ls(p.level_scale),
      eps(-1e-3f), jmin(float(p.min_level)), jmax(float(p.max_level));
  alignas(64) float ys[nf], zs[nf];
  std::size_t m = 0, t = 0;
  for (; t + nf <= n; t += nf) {
    const batch_f y =
        ((batch_f::load_unaligned(u + t) + batch_f::load_unaligned(e + t)) - c) + slack;
    if (!xsimd::any((y >= thr) & (y < upper))) continue;
    const batch_f z = xsimd::min(xsimd::max(xsimd::ceil(xsimd::fma(y, ls, eps)), jmin), jmax);
    y.store_aligned(ys);
    z.store_aligned(zs);
    for (std::size_t l = 0; l < nf; ++l)
      if (ys[l] >= p.threshold && ys[l] < p.upper) {
        idx[m] = std::uint32_t(t + l);
        lvl[m] = std::uint8_t(zs[l]);
        ++m;
      }
  }
  *count = m;
  return t;
}

// ---- the dense kernel (arch/scalar/dense_kernels.hpp) -------------------------------------

/// One key or value row [d] as floats, zero-padded to q_stride (a multiple of 16).
template <class T>
inline void dense_row(const T* src, std::size_t d, std::size_t q_stride, float* dst) noexcept {
  std::size_t i = 0;
  for (; i + 16 <= d; i += 16) widen_to_float(src + i, dst + i, 16);
  if (i < d) widen_to_float(src + i, dst + i, d - i);
  for (i = d; i < q_stride; ++i) dst[i] = 0.0f;
}

/// Sixteen partial sums of q.row (q_stride floats, a multiple of 16) and their fixed tree.
inline float dense_dot16(const float* q, const float* row, std::size_t q_stride) noexcept {
  batch_f part[16 / nf];
  for (auto& x : part) x = batch_f(0.0f);
  for (std::size_t i = 0; i < q_stride; i += 16)
    for (std::size_t j = 0; j < 16 / nf; ++j)
      part[j] = xsimd::fma(batch_f::load_unaligned(q + i + j * nf),
                           batch_f::load_unaligned(row + i + j * nf), part[j]);
  alignas(64) float l[16];
  for (std::size_t j = 0; j < 16 / nf; ++j) part[j].store_aligned(l + j * nf);
  return tree16(l);
}

/// c[i] += w row[i] over q_stride floats (a multiple of 16).
inline void dense_axpy(float w, const float* row, std::size_t q_stride, float* c) noexcept {
  const batch_f wv(w);
  for (std::size_t i = 0; i < q_stride; i += nf)
    xsimd::fma(wv, batch_f::load_unaligned(row + i), batch_f::load_unaligned(c + i))
        .store_unaligned(c + i);
}

/// The chunk of the online softmax: scalar::dense_chunk()'s order (each row converted once
/// for all queries, sixteen partial sums per dot, the value pass summed per chunk from zero
/// and then added to the running accumulator) with batch arithmetic. Not bit-identical
/// to the other ISAs' dense kernels (their exp differs too): the dense path is compared
/// with the exact attention within a tolerance.
template <class K, class V = K>
inline void dense_chunk(const dense_chunk_args& a) {
  constexpr std::size_t C = dense_chunk_tokens;
  const std::size_t d = a.head_dim, G = a.group;
  float* row = a.chunk_acc;                 // [q_stride]
  float* chunk = a.chunk_acc + a.q_stride;  // [group][q_stride]
  const std::size_t key_bytes = d * sizeof(K);
  for (std::size_t t = 0; t < a.n; ++t) {
    if (a.prefetch_distance > 0)
      if (const void* ahead = dense_ahead_row(a.key_rows, a.rows_ahead, t + a.prefetch_distance))
        dense_prefetch_row(ahead, key_bytes);
    dense_row(static_cast<const K*>(a.key_rows[t]), d, a.q_stride, row);
    for (std::size_t g = 0; g < G; ++g)
      a.scores[g * C + t] = dense_clamp_score(dense_dot16(a.queries + g * a.q_stride, row, a.q_stride));
  }
  dense_apply_variant(a);
  for (std::size_t g = 0; g < G; ++g) {
    float* s = a.scores + g * C;
    const float m_old = a.max_scores[g];
    float m_new = m_old;
    for (std::size_t t = 0; t < a.n; ++t) m_new = std::max(m_new, s[t]);
    const float alpha = std::exp(m_old - m_new);  // 0 on the first chunk
    float sum = 0.0f;
    for (std::size_t t = 0; t < a.n; ++t) {
      s[t] = std::exp(s[t] - m_new);
      sum += s[t];
    }
    a.sums[g] = a.sums[g] * alpha + sum;
    a.max_scores[g] = m_new;
    a.alpha[g] = alpha;
  }
  const std::size_t dv = a.value_dim, vs = dense_round16(dv);
  std::fill(chunk, chunk + G * a.q_stride, 0.0f);
  for (std::size_t t = 0; t < a.n; ++t) {
    if (a.prefetch_distance > 0)
      if (const void* ahead = dense_ahead_row(a.value_rows, a.rows_ahead, t + a.prefetch_distance))
        dense_prefetch_row(ahead, dv * sizeof(V));
    dense_row(static_cast<const V*>(a.value_rows[t]), dv, vs, row);
    for (std::size_t g = 0; g < G; ++g)
      dense_axpy(a.scores[g * C + t], row, vs, chunk + g * a.q_stride);
  }
  for (std::size_t g = 0; g < G; ++g) {
    float* o = a.acc + g * a.acc_stride;
    const float* c = chunk + g * a.q_stride;
    const batch_f al(a.alpha[g]);
    std::size_t i = 0;
    for (; i + nf <= dv; i += nf)
      xsimd::fma(batch_f::load_unaligned(o + i), al, batch_f::load_unaligned(c + i))
          .store_unaligned(o + i);
    for (; i < dv; ++i) o[i] = o[i] * a.alpha[g] + c[i];
  }
}

#endif  // CERTATTN_PORTABLE_SIMD

}  // namespace certattn::detail::portable

#include <certattn/arch/macros_undef.hpp>
