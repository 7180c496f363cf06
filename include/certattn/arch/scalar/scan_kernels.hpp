// Plain C++ twin of the 4-bit scan kernels: the definition the vector kernels must match
// bit for bit (integer dots are exact, the two planes' dots added as 128 dot + dot_f; the
// epilogue is one correctly rounded fma, one product followed by a min, and one sum; the
// block maximum is exact in any order).
#pragma once

#include <certattn/arch/scan_prep.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace certattn::detail::scalar {

/// Bounds for the 128 tokens of one block and nq queries: u[g * u_stride + t], and
/// bmax[g * bmax_stride] = max of u over the block's first `valid` tokens (the pool's).
/// codes: the block's interleaved 4-bit codes; qa: the int8 queries' two planes, each
/// octet-major (byte j of channel octet o of query g at qa[(o * nq + g) * 8 + j], the
/// second plane at fine_plane(qa)).
inline void scan_block(const std::uint8_t* codes, const std::uint8_t* rho, std::size_t padded_dim,
                       const std::int8_t* qa, const block_query_prep* prep, std::size_t nq,
                       float* u, std::size_t u_stride, std::size_t valid, float* bmax,
                       std::size_t bmax_stride) noexcept {
  const std::size_t n_oct = padded_dim / 8;
  const std::int8_t* qf = fine_plane(qa, nq, padded_dim);
  for (std::size_t g = 0; g < nq; ++g) {
    const std::int8_t* qg = qa + 8 * g;
    const std::int8_t* fg = qf + 8 * g;
    float* ug = u + g * u_stride;
    for (std::size_t grp = 0; grp < kGroupsPerBlock; ++grp) {
      std::int32_t dot[16] = {}, dot_f[16] = {};
      for (std::size_t o = 0; o < n_oct; ++o) {
        const std::uint8_t* src = codes + (grp * n_oct + o) * 64;
        for (std::size_t lane = 0; lane < 16; ++lane)
          for (std::size_t j = 0; j < 4; ++j) {
            const std::uint8_t b = src[lane * 4 + j];
            dot[lane] += std::int32_t(b & 0xF) * qg[8 * nq * o + j] +
                         std::int32_t(b >> 4) * qg[8 * nq * o + 4 + j];
            dot_f[lane] += std::int32_t(b & 0xF) * fg[8 * nq * o + j] +
                           std::int32_t(b >> 4) * fg[8 * nq * o + 4 + j];
          }
      }
      for (std::size_t lane = 0; lane < 16; ++lane) {
        const std::int32_t dot2 = dot[lane] * (1 << kFineShift) + dot_f[lane];
        const float r = std::fma(prep[g].alpha, float(dot2), prep[g].offset);
        const float t = std::min(prep[g].holder, prep[g].norm * float(rho[grp * 16 + lane]));
        ug[grp * 16 + lane] = r + t;
      }
    }
    float m = -INFINITY;
    for (std::size_t t = 0; t < valid; ++t) m = std::max(m, ug[t]);
    bmax[g * bmax_stride] = m;
  }
}

}  // namespace certattn::detail::scalar
