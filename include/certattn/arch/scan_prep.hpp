// Per-block preparation of the 4-bit score-bound scan, shared by every kernel so that all
// of them produce the same bits (ALGORITHM.md, "Deterministic 4-bit bound").
//
// For a block with per-channel offset lo and step st (k = lo + st (code + f), f in [0, 1])
// and a query q, with a = q * st:
//   q.k = sum q lo + sum a code + sum a/2 + sum a (f - 1/2),
// and the last term is at most min(sum |a| / 2, ||a|| rho_t) (Hoelder, and Cauchy-Schwarz
// with the per-token residual norm rho_t >= ||f - 1/2|| that the index stores in a byte:
// about 0.58 times the Hoelder term for keys without outlier channels).
// The integer dot needs a in int8: a = alpha qa + e with alpha >= max|a| / 127 a float and
// qa = round(a / alpha) in [-127, 127], so sum a code <= alpha sum qa code + 15 sum max(e, 0)
// (codes lie in 0..15). Hence, with dot = sum qa code (exact in int32),
//   s = scale q.k <= scale (alpha dot + C) + min(H, N rho_t),
//   C = sum q lo + sum a / 2 + 16 sum max(e, 0),  H = scale sum |a| / 2,  N = scale ||a||.
// The kernels evaluate u = fma(alpha', float(dot), c') + min(h', n' byte_t) in float with
// alpha' = scale alpha, c' = scale (C + 2^-20 mag) rounded up, h' and n' (n' folds in the
// byte's step) rounded up, mag >= sum |q lo| + 32 sum |a| bounding every term, so the
// margin covers the float rounding of alpha', of the fma, of the product, of the final
// sum and of the double sums (each below 2^-22 mag). u >= s holds in exact arithmetic.
//
// Bit-identity across kernels: every product below is exact in double (float * float, or a
// float times a small integer), so fused or unfused multiply-adds give the same result,
// and sums run in 8 fixed lanes (channel mod 8) reduced by one fixed tree.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <certattn/common.hpp>

namespace certattn::detail {

/// Tokens per block of the key index (one set of per-channel scales each) and tokens per
/// group of the interleaved 4-bit layout (one token per 32-bit lane of a 512-bit vector).
inline constexpr std::size_t kBlockTokens = 128;
inline constexpr std::size_t kGroupTokens = 16;
inline constexpr std::size_t kGroupsPerBlock = kBlockTokens / kGroupTokens;
static_assert(kBlockTokens % kGroupTokens == 0);



struct block_query_prep {
  float alpha = 0.0f;   // scale * alpha, multiplies float(dot)
  float offset = 0.0f;  // scale * (C + margin), rounded up
  float holder = 0.0f;  // scale * sum |a| / 2, rounded up
  float norm = 0.0f;    // scale * ||a|| * rho step, rounded up: multiplies the rho byte
};

/// Per-token residual norms rho_t = ||f - 1/2|| <= sqrt(padded_dim) / 2 are stored as
/// bytes of this step (rounded up), so that 255 steps always cover the range.
inline double rho_step(std::size_t padded_dim) noexcept {
  return std::sqrt(double(padded_dim)) * 0.5 * 1.0001 / 255.0;
}

/// Shared ending of the preparation: every operation here is on exact sums, so the
/// vector and scalar paths agree.
inline block_query_prep finish_prep(float alpha, double scale, double sum_ql, double sum_a,
                                    double sum_epos, double sum_qlabs, double sum_abs,
                                    double sum_a2, std::size_t padded_dim) noexcept {
  block_query_prep out;
  const double c = sum_ql + 0.5 * sum_a + 16.0 * sum_epos;
  const double mag = sum_qlabs + 32.0 * sum_abs;
  out.alpha = static_cast<float>(scale * double(alpha));
  // Below FLT_MIN the float roundings err by up to 2^-150 absolutely, not relatively:
  // alpha' (rounded to nearest) times |dot| <= 15 * 127 * padded_dim, the fma, the rho
  // product and the final sum. This absolute term covers them (the fuzzer found bounds
  // below scores of ~1e-43 with subnormal keys); elsewhere it is negligible.
  const double tiny = (2048.0 * double(padded_dim) + 16.0) * 0x1p-149;
  // scale > 0; each product is not followed by an addition, so no contraction applies.
  out.offset = round_up_to_float(scale * (c + mag * 0x1p-20) + tiny);
  out.holder = round_up_to_float(scale * (0.5 * sum_abs) * (1.0 + 0x1p-40));
  // sum_a2 carries at most 2^-50 relative rounding: the 2^-40 inflation covers it.
  out.norm = round_up_to_float(scale * std::sqrt(sum_a2) * (1.0 + 0x1p-40) * rho_step(padded_dim));
  return out;
}

inline double reduce8(const double* a) noexcept {
  return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}


/// Prepares one block for one query q (padded_dim floats, padded channels 0):
/// writes qa (padded_dim int8) and returns alpha', c'.
__attribute__((always_inline)) inline block_query_prep prepare_block_query(
    const float* lo, const float* st, const float* q, std::size_t padded_dim, double scale,
    std::int8_t* qa) noexcept {
  // Pass 1: a = q * st (exact in double) and max |a|.
  double amax = 0.0;
  for (std::size_t i = 0; i < padded_dim; ++i)
    amax = std::max(amax, std::fabs(double(q[i]) * double(st[i])));
  block_query_prep out;
  if (amax == 0.0) {
    std::memset(qa, 0, padded_dim);
  }
  const float alpha = amax > 0.0 ? round_up_to_float(amax / 127.0) : 0.0f;
  const double inv = amax > 0.0 ? 1.0 / double(alpha) : 0.0;
  // Pass 2: quantize, and the lane sums.
  double sum_ql[8] = {}, sum_a[8] = {}, sum_epos[8] = {}, sum_abs[8] = {}, sum_qlabs[8] = {},
         sum_a2[8] = {};
  for (std::size_t o = 0; o < padded_dim; o += 8) {
    for (std::size_t l = 0; l < 8; ++l) {
      const std::size_t i = o + l;
      const double a = double(q[i]) * double(st[i]);
      const double ql = double(q[i]) * double(lo[i]);
      double r = std::nearbyint(a * inv);
      r = std::clamp(r, -127.0, 127.0);
      if (amax > 0.0) qa[i] = static_cast<std::int8_t>(r);
      const double e = std::fma(-double(alpha), r, a);  // alpha * r is exact
      sum_ql[l] += ql;
      sum_qlabs[l] += std::fabs(ql);
      sum_a[l] += a;
      sum_abs[l] += std::fabs(a);
      sum_a2[l] = std::fma(a, a, sum_a2[l]);  // fused in every kernel: the same bits
      sum_epos[l] += std::max(e, 0.0);
    }
  }
  (void)out;
  return finish_prep(alpha, scale, reduce8(sum_ql), reduce8(sum_a), reduce8(sum_epos),
                     reduce8(sum_qlabs), reduce8(sum_abs), reduce8(sum_a2), padded_dim);
}

}  // namespace certattn::detail
