// Per-block preparation of the 4-bit score-bound scan, shared by every kernel so that all
// of them produce the same bits (ALGORITHM.md, "Deterministic 4-bit bound").
//
// The bound. For a block with per-channel offset lo and step st (k = lo + st (c + f), code
// c in 0..15, f in [0, 1]) and a query q, let a = fl(q st) (float; A = q st exactly,
// |A - a| <= u |a| + 2^-150, u = 2^-24). Then
//   q.k = sum q lo + sum a c + sum a/2 + sum a (f - 1/2) + sum (A - a)(c + f),
// sum a (f - 1/2) <= min(sum |a| / 2, ||a|| rho_t) (Hoelder; Cauchy-Schwarz with the
// per-token residual norm rho_t >= ||f - 1/2|| the index stores in a byte), and the last
// term is at most 16 u S + 16 d 2^-150 (S = sum |a|). The integer dot needs a in int8, and
// a second int8 plane carries what the first rounds off: alpha = fl(max|a| / 127),
// inv = fl(127 / max|a|) (0 when alpha < FLT_MIN), r = RNE(a inv) of the exact product
// (|a inv| <= 127 (1 + u): r in [-127, 127], no clamp), e' = fl(a - alpha r)
// (|e'| <= 0.5001 alpha: inv and 1 / alpha agree to 2.01 u; e' = a when inv = 0); then
// beta = alpha 2^-7 (exact), inv_f = fl(128 / alpha) (0 when beta < FLT_MIN),
// r_f = RNE(e' inv_f) in [-65, 65] and e_f = fl(e' - beta r_f) (|e_f| <= 0.51 beta, or
// e_f = e' when inv_f = 0). So
//   sum a c = alpha dot + beta dot_f + sum e_f c + sum (a - alpha r - e') c
//             + sum (e' - beta r_f - e_f) c
//          <= beta dot2 + 15 sum max(e_f, 0) + 15 u (sum |e'| + sum |e_f|) (+ subnormal),
// with dot = sum r c, dot_f = sum r_f c and dot2 = 128 dot + dot_f exact in int32 (at most
// (128 * 1905 + 65 * 15) d < 2^31 for d < 8700). So, with scale > 0,
//   s <= scale (beta dot2 + C) + min(scale S / 2, scale ||a|| rho_t),
//   C = sum q lo + sum a / 2 + 15 sum max(e_f, 0) + 16 u S (+ rounding terms).
// Any alpha would do (e' and e_f absorb it); alpha ~ max|a| / 127 makes it tight. With one
// plane the query's rounding cost 15 sum max(e', 0), about 0.6 nats of the bound's mean
// slack; the second plane leaves 1/128 of that (docs/fast-path.md, "The 4-bit scan").
//
// Float evaluation. Per channel i (lane l = i mod 16, channels in increasing order; a
// partial last vector acts as zeros) the lanes accumulate in float, with explicit fmas:
//   ca = fma(q, lo, ca), cb = fma(a, 1/2, cb), s += |a|, q2 = fma(a, a, q2), p += |fl(q lo)|,
// and in a second pass (after alpha) y = fma(a, inv, 1.5 2^23), r = y - 1.5 2^23 (exact;
// the low byte of y is r), e' = fma(-alpha, r, a), y_f = fma(e', inv_f, 1.5 2^23),
// r_f = y_f - 1.5 2^23, e_f = fma(-beta, r_f, e'), ce += max(e_f, 0). Per lane then
// c = fma(ce, 15, ca + cb) and m = fma(s, 24, p), and c, s, q2, m each go through one fixed
// tree (x_l + x_{l+8}, then + 4, + 2, + 1). Rounding, all relative to u and to
// P = sum |q lo|, S and d alpha:
//  * the 3 ceil(d/16) + 6 roundings of C (lanes and tree) err by at most u each times the
//    sum of the absolute values of its terms, M <= P + 15.5 S + 0.07 d alpha (max(e_f, 0) is
//    at most 0.52 beta; at most 0.52 alpha when inv_f = 0, see below; |a| when inv = 0);
//  * e' and e_f add 15 u (S + 0.52 d (alpha + beta)) through the codes, A - a adds 16 u S;
//  * the kernels evaluate u_t = fl(fl(fma(beta', float(dot2), c')) + min(h', fl(n' byte_t)))
//    with beta' = float(scale beta): beta', float(dot2), the fma and the final sum err by
//    at most u (4.02 scale beta |dot2| + 2 |c'| + h'), with
//    beta |dot2| <= alpha |dot| + beta |dot_f| <= 15 S + 15.4 d alpha;
// in all at most u (3 ceil(d/16) + 8.1) MAG, MAG = P + 24 S + 12 d alpha (checked term by
// term: 8.5 (3 ceil(d/16) + 8.1) >= 91.8 for S; 11.9 (...) >= 7.9 + 61.9 for d alpha). When
// inv_f = 0 (alpha < 2^7 FLT_MIN) every r_f is 0: M's d alpha term is 7.8 and
// beta |dot2| = alpha |dot| <= 15 S + 7.5 d alpha, the single plane's 4.2 (...) >= 38.
// c' adds (3 ceil(d/16) + 12) 2^-23 MAG, twice that: the rest covers the double roundings
// of finish_prep and of the reference's exact score, and the inflation factors below. MAG
// comes from the tree sum of m, inflated like the other non-negative sums (s, q2, m carry
// at most ceil(d/16) + 7 roundings of their own terms: factor 1 + (ceil(d/16) + 8) 2^-23).
// Subnormal results: a product or fma rounding of a result r errs by at most
// u |r| + min(2^-150, |r|), and d max|q| (max|lo| + 32 max|st|) bounds every |r| of the
// sums (d (max|q| max|st|)^2 those of q2; exact maxima, per block and query), so (49 d + 48)
// min(2^-150, that) covers C before the scale (15 d of it for e_f), and is 0 when the
// query or the block is 0: a softmax scale beyond float's range then still gives finite
// bounds; (2^18 d + 16) 2^-149 covers the epilogue after it (beta' times
// |dot2| <= 244830 d). h' >= scale S / 2, n' (1 - u) >= scale ||a|| rho_step (rho_step
// inflated by 2^-20), and every constant is rounded up to float (scan_round_up).
// u_t >= s_t in exact arithmetic.
//
// Bit-identity across kernels: the lane sums use the same operations in the same order
// in every kernel (16 float lanes: one AVX-512 register, two AVX2 registers, or arrays)
// and the same tree; every product feeds an abs, a max, a min, a conversion or an explicit
// fma, never an addition (or is exact), so floating-point contraction cannot change a bit
// (checked with GCC at -O0..-O3, -march=native, -ffp-contract=off/fast, and clang).
// finish_prep_one()
// (double, explicit fmas) has an AVX-512 twin that does the same operations for four
// queries at once.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include <certattn/common.hpp>

namespace certattn::detail {

/// Tokens per block of the key index (one set of per-channel scales each) and tokens per
/// group of the interleaved 4-bit layout (one token per 32-bit lane of a 512-bit vector).
inline constexpr std::size_t kBlockTokens = 128;
inline constexpr std::size_t kGroupTokens = 16;
inline constexpr std::size_t kGroupsPerBlock = kBlockTokens / kGroupTokens;
static_assert(kBlockTokens % kGroupTokens == 0);

/// Lanes of the preparation's float sums (channel mod 16).
inline constexpr std::size_t kPrepLanes = 16;

struct block_query_prep {  // (standard layout: finish_prep_avx512 loads 4 floats at once)
  float alpha = 0.0f;   // beta' = scale * alpha * 2^-7, multiplies float(dot2)
  float offset = 0.0f;  // scale * (C + margin), rounded up
  float holder = 0.0f;  // scale * sum |a| / 2, rounded up
  float norm = 0.0f;    // scale * ||a|| * rho step, rounded up: multiplies the rho byte
  // The preparation's own results, from which finish_prep() computes the four above.
  float raw_alpha = 0.0f;  // alpha = fl(max|a| / 127)
  float sum_c = 0.0f, sum_s = 0.0f, sum_q2 = 0.0f, sum_m = 0.0f;  // tree sums of c, s, q2, m
  float max_abs_q = 0.0f;  // max |q|, set once per scan
};

static_assert(sizeof(block_query_prep) == 10 * sizeof(float));

/// A block's residual term for one query: the scan adds min(holder, norm * rho byte).
struct residual_coefficients {
  float holder = 0.0f, norm = 0.0f;
};

/// An upper bound, in double, of the part r = fl(fma(beta', float(dot2), c')) of a scan
/// bound u = fl(r + t), t = min(holder, fl(norm * rho)) (the kernels' epilogue, recomputed
/// here bit for bit): r <= u - t + |u| 2^-24 + 2^-149 (the sum's rounding), and the double
/// difference errs by at most (|u| + |t|) 2^-53. r bounds scale (sum q lo + sum A code4 +
/// sum a / 2) (see the derivation above): the nested 8-bit refinement replaces the scan's
/// bound of the codes' fractions by its own. +inf when u or t is not finite.
inline double scan_integer_part(float u, residual_coefficients k, std::uint8_t rho) noexcept {
  const float t = std::min(k.holder, k.norm * float(rho));
  const double ud = double(u), td = double(t);
  if (!(std::fabs(ud) <= double(FLT_MAX)) || !(td <= double(FLT_MAX)))
    return std::numeric_limits<double>::infinity();
  const double mag = std::fabs(ud) + std::fabs(td);
  return (ud - td) + std::fabs(ud) * 0x1p-24 + 0x1p-149 + mag * 0x1p-52;
}

/// max |lo| and max |st4| of a block (exact: any order gives the same bits).
struct block_maxima {
  float lo = 0.0f, st = 0.0f;
};

inline block_maxima block_scale_maxima(const float* lo, const float* st,
                                       std::size_t padded_dim) noexcept {
  block_maxima m;
  for (std::size_t i = 0; i < padded_dim; ++i) {
    const float l = std::fabs(lo[i]), t = std::fabs(st[i]);
    m.lo = l > m.lo ? l : m.lo;
    m.st = t > m.st ? t : m.st;
  }
  return m;
}

inline float max_abs(const float* x, std::size_t n) noexcept {
  float m = 0.0f;
  for (std::size_t i = 0; i < n; ++i) m = std::fabs(x[i]) > m ? std::fabs(x[i]) : m;
  return m;
}

/// Per-token residual norms rho_t = ||f - 1/2|| <= sqrt(padded_dim) / 2 are stored as
/// bytes of this step (rounded up), so that 255 steps always cover the range.
inline double rho_step(std::size_t padded_dim) noexcept {
  return std::sqrt(double(padded_dim)) * 0.5 * 1.0001 / 255.0;
}

/// Sum of 8 double lanes by one fixed tree (also used by score_dot and the refinement).
inline double reduce8(const double* a) noexcept {
  return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

/// The preparation's fixed tree over 16 float lanes (the vector kernels do the same
/// additions with shuffles).
inline float scan_tree16(const float* x) noexcept {
  float b[8], c[4];
  for (int i = 0; i < 8; ++i) b[i] = x[i] + x[i + 8];
  for (int i = 0; i < 4; ++i) c[i] = b[i] + b[i + 4];
  return (c[0] + c[2]) + (c[1] + c[3]);
}

/// What the preparation needs besides the block and the query: fixed for one scan.
struct scan_constants {
  double scale = 1.0;
  double dim = 0.0;       // padded_dim
  double rel = 1.0;       // inflation of the non-negative float sums s, q2, m
  double margin = 0.0;    // times MAG: the relative rounding margin of c'
  double alpha_mag = 0.0; // 12 d: MAG's alpha term
  double ops_sum = 0.0;   // roundings that may be subnormal in p (and m), and in q2
  double ops_c = 0.0;     // in C (with the factors 16 and 15 of A - a, e' and e_f)
  double abs_u = 0.0;     // subnormal errors of the kernels' float epilogue, scaled
  double norm_step = 0.0; // rho_step, inflated for the kernel's product n' * byte
};

inline scan_constants make_scan_constants(std::size_t padded_dim, double scale) noexcept {
  scan_constants k;
  const double d = double(padded_dim);
  const double n16 = double((padded_dim + kPrepLanes - 1) / kPrepLanes);
  k.scale = scale;
  k.dim = d;
  k.rel = 1.0 + (n16 + 8.0) * 0x1p-23;
  k.margin = (3.0 * n16 + 12.0) * 0x1p-23;
  k.alpha_mag = 12.0 * d;
  k.ops_sum = d + 16.0;
  k.ops_c = 49.0 * d + 48.0;
  k.abs_u = (262144.0 * d + 16.0) * 0x1p-149;
  k.norm_step = rho_step(padded_dim) * (1.0 + 0x1p-20);
  return k;
}

/// A float >= x: fl(x + |x| 2^-22) + 2^-149 rounded to nearest, which is at least x for
/// every finite x in range.
inline float scan_round_up(double x) noexcept {
  return static_cast<float>(std::fma(std::fabs(x), 0x1p-22, x) + 0x1p-149);
}

/// 1.5 * 2^23: for |t| < 2^22, fl(t + kScanRound) = kScanRound + RNE(t), whose low byte is
/// RNE(t) in two's complement.
inline constexpr float kScanRound = 12582912.0f;

/// alpha = fl(max|a| / 127) and the factor that quantizes, inv = fl(127 / max|a|) (not
/// 1 / alpha: the two divisions run in parallel), or 0 when alpha < FLT_MIN (every qa
/// is then 0 and e = a).
inline float scan_alpha(float amax) noexcept { return amax / 127.0f; }
inline float scan_inverse(float amax, float alpha) noexcept {
  return alpha >= FLT_MIN ? 127.0f / amax : 0.0f;
}

/// The second plane: its step beta = alpha 2^-7 (exact) and the factor that quantizes
/// the first plane's remainder, inv_f = fl(128 / alpha), or 0 when beta < FLT_MIN (every
/// r_f is then 0 and e_f = e'). The kernels add the planes' dots as 128 dot + dot_f.
inline constexpr float kFineStep = 0x1p-7f;
inline constexpr std::int32_t kFineShift = 7;  // 128 = 1 / kFineStep
inline float scan_fine_inverse(float alpha) noexcept {
  return alpha * kFineStep >= FLT_MIN ? 128.0f / alpha : 0.0f;
}

/// Shared ending of the preparation, from the tree sums to the kernels' constants (see the
/// header comment), in double. Every product that feeds a sum is an explicit fma or
/// exact, so the AVX-512 twin (finish_prep_avx512, four queries per register) gives the
/// same bits. bm: the block's maxima.
inline void finish_prep_one(block_query_prep& p, const scan_constants& k,
                            block_maxima bm) noexcept {
  // A float rounding of a result r errs by at most u |r| + min(2^-150, |r|); big and big2
  // bound every |r| of the sums (c, p, m) and of q2.
  const double qs = double(p.max_abs_q) * double(bm.st);
  const double big = (k.dim * double(p.max_abs_q)) * (double(bm.lo) + 32.0 * double(bm.st));
  const double big2 = (k.dim * qs) * qs;
  const double sub = std::min(0x1p-150, big * (1.0 + 0x1p-20));
  const double sub2 = std::min(0x1p-150, big2 * (1.0 + 0x1p-20));
  const double a = double(p.raw_alpha);
  const double s_up = double(p.sum_s) * k.rel;
  const double mag_up = std::fma(k.alpha_mag, a, std::fma(k.ops_sum, sub, double(p.sum_m)) * k.rel);
  const double c_up = double(p.sum_c) + std::fma(k.margin, mag_up, k.ops_c * sub);
  const double n_up = std::sqrt(std::fma(k.ops_sum, sub2, double(p.sum_q2)) * k.rel);
  p.alpha = static_cast<float>((k.scale * a) * double(kFineStep));  // beta'
  p.offset = scan_round_up(std::fma(k.scale, c_up, k.abs_u));
  p.holder = scan_round_up(k.scale * (0.5 * s_up));
  p.norm = scan_round_up((k.scale * n_up) * k.norm_step);
}

inline void finish_prep(block_query_prep* prep, std::size_t n, const scan_constants& k,
                        block_maxima bm) noexcept {
  for (std::size_t g = 0; g < n; ++g) finish_prep_one(prep[g], k, bm);
}

/// Prepares one block for one query q (padded_dim floats, padded channels 0): writes its
/// two int8 planes, channel 8 o + j at qa[o * qa_stride + j] and qf[o * qa_stride + j]
/// (the kernels' octet-major layout: the nq queries' 8 bytes of an octet side by side,
/// qa_stride = 8 nq), and alpha and the tree sums into out (finish_prep() does the rest).
/// The plain definition the vector preparations match bit for bit.
inline void prepare_block_query(const float* lo, const float* st, const float* q,
                                std::size_t padded_dim, std::int8_t* qa, std::int8_t* qf,
                                std::size_t qa_stride, block_query_prep& out) noexcept {
  constexpr std::size_t L = kPrepLanes;
  float ca[L] = {}, cb[L] = {}, s[L] = {}, q2[L] = {}, p[L] = {}, ce[L] = {};
  float amax = 0.0f;
  for (std::size_t i = 0; i < padded_dim; ++i) {
    const std::size_t l = i % L;
    const float a = q[i] * st[i];
    const float fa = std::fabs(a);
    amax = fa > amax ? fa : amax;
    s[l] += fa;
    q2[l] = std::fma(a, a, q2[l]);
    ca[l] = std::fma(q[i], lo[i], ca[l]);
    cb[l] = std::fma(a, 0.5f, cb[l]);
    p[l] += std::fabs(q[i] * lo[i]);
  }
  const float alpha = scan_alpha(amax);
  const float inv = scan_inverse(amax, alpha);
  const float beta = alpha * kFineStep, inv_f = scan_fine_inverse(alpha);
  for (std::size_t i = 0; i < padded_dim; ++i) {
    const float a = q[i] * st[i];
    const float y = std::fma(a, inv, kScanRound);  // kScanRound + RNE(a inv)
    const float r = y - kScanRound;
    const float e = std::fma(-alpha, r, a);
    const float yf = std::fma(e, inv_f, kScanRound);  // the remainder's plane
    const float rf = yf - kScanRound;
    const float ef = std::fma(-beta, rf, e);
    qa[i / 8 * qa_stride + i % 8] = static_cast<std::int8_t>(r);
    qf[i / 8 * qa_stride + i % 8] = static_cast<std::int8_t>(rf);
    ce[i % L] += ef > 0.0f ? ef : 0.0f;
  }
  float c[L], m[L];
  for (std::size_t l = 0; l < L; ++l) {
    c[l] = std::fma(ce[l], 15.0f, ca[l] + cb[l]);
    m[l] = std::fma(s[l], 24.0f, p[l]);
  }
  out.raw_alpha = alpha;
  out.sum_c = scan_tree16(c);
  out.sum_s = scan_tree16(s);
  out.sum_q2 = scan_tree16(q2);
  out.sum_m = scan_tree16(m);
}

/// The int8 queries of a block: the first plane of the nq queries ([nq * padded_dim]
/// bytes, octet-major), then the second (fine_plane()); query_plane_bytes() in all.
inline constexpr std::size_t query_plane_bytes(std::size_t nq, std::size_t padded_dim) noexcept {
  return 2 * nq * padded_dim;
}
inline std::int8_t* fine_plane(std::int8_t* qa, std::size_t nq, std::size_t padded_dim) noexcept {
  return qa + nq * padded_dim;
}
inline const std::int8_t* fine_plane(const std::int8_t* qa, std::size_t nq,
                                     std::size_t padded_dim) noexcept {
  return qa + nq * padded_dim;
}

/// The preparation of one block for nq queries (q: [nq][padded_dim]; qa: both planes,
/// 2 nq padded_dim bytes).
inline void prepare_block_queries(const float* lo, const float* st, const float* q,
                                  std::size_t padded_dim, std::size_t nq, std::int8_t* qa,
                                  block_query_prep* out) noexcept {
  std::int8_t* qf = fine_plane(qa, nq, padded_dim);
  for (std::size_t g = 0; g < nq; ++g)
    prepare_block_query(lo, st, q + g * padded_dim, padded_dim, qa + 8 * g, qf + 8 * g, 8 * nq,
                        out[g]);
}

}  // namespace certattn::detail
