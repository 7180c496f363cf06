// Per-block preparation of the 4-bit score-bound scan, shared by every kernel so that all
// of them produce the same bits (ALGORITHM.md, "Deterministic 4-bit bound").
//
// For a block with per-channel offset lo and step st (k = lo + st (code + f), f in [0, 1])
// and a query q:   q.k <= sum q lo + sum a code + sum max(a, 0),   a = q * st.
// The integer dot needs a in int8: a = alpha qa + e with alpha >= max|a| / 127 a float and
// qa = round(a / alpha) in [-127, 127], so sum a code <= alpha sum qa code + 15 sum max(e, 0)
// (codes lie in 0..15). Hence, with dot = sum qa code (exact in int32),
//   s = scale q.k <= scale (alpha dot + C),  C = sum q lo + sum max(a, 0) + 16 sum max(e, 0).
// The kernels evaluate u = fma(alpha', float(dot), c') in float with alpha' = scale alpha
// and c' = scale (C + 2^-20 mag) rounded up, mag >= sum |q lo| + 32 sum |a| bounding every
// term, so the margin covers the float rounding of alpha', of the fma and of the double
// sums (each below 2^-22 mag relative). u >= s holds in exact arithmetic.
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

namespace certattn::detail {

struct block_query_prep {
  float alpha = 0.0f;  // scale * alpha, multiplies float(dot)
  float offset = 0.0f;  // scale * (C + margin), rounded up
};

inline double reduce8(const double* a) noexcept {
  return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

inline float round_up_f(double x) noexcept {
  float f = static_cast<float>(x);
  if (static_cast<double>(f) < x) f = std::nextafter(f, 3.4e38f);
  return f;
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
  const float alpha = amax > 0.0 ? round_up_f(amax / 127.0) : 0.0f;
  const double inv = amax > 0.0 ? 1.0 / double(alpha) : 0.0;
  // Pass 2: quantize, and the lane sums.
  double sum_ql[8] = {}, sum_apos[8] = {}, sum_epos[8] = {}, sum_abs[8] = {}, sum_qlabs[8] = {};
  for (std::size_t o = 0; o < padded_dim; o += 8) {
    for (std::size_t l = 0; l < 8; ++l) {
      const std::size_t i = o + l;
      const double a = double(q[i]) * double(st[i]);
      const double ql = double(q[i]) * double(lo[i]);
      double r = std::nearbyint(a * inv);
      r = std::clamp(r, -127.0, 127.0);
      if (amax > 0.0) qa[i] = static_cast<std::int8_t>(r);
      const double e = a - double(alpha) * r;  // alpha * r is exact
      sum_ql[l] += ql;
      sum_qlabs[l] += std::fabs(ql);
      sum_apos[l] += std::max(a, 0.0);
      sum_abs[l] += std::fabs(a);
      sum_epos[l] += std::max(e, 0.0);
    }
  }
  const double c = reduce8(sum_ql) + reduce8(sum_apos) + 16.0 * reduce8(sum_epos);
  const double mag = reduce8(sum_qlabs) + 32.0 * reduce8(sum_abs);
  out.alpha = static_cast<float>(scale * double(alpha));
  // scale > 0; the product is not followed by an addition, so no contraction applies.
  out.offset = round_up_f(scale * (c + mag * 0x1p-20));
  return out;
}

}  // namespace certattn::detail
