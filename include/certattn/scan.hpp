// The score-bound scan: deterministic upper bounds u_i >= s_i for every pool key and the
// G query heads of a GQA group, in one pass over the 4-bit codes (read once per group).
// Dispatches at run time to the AVX-512 VNNI, AVX2 or plain kernel; all three give the
// same bits (see arch/scan_prep.hpp for the bound and why it is bit-identical).
#pragma once

#include <certattn/arch/avx2/scan_kernels.hpp>
#include <certattn/arch/avx512/scan_kernels.hpp>
#include <certattn/arch/dispatch.hpp>
#include <certattn/arch/scalar/scan_kernels.hpp>
#include <certattn/arch/scan_prep.hpp>
#include <certattn/index.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace certattn {

/// Inputs and outputs of one scan. Buffers are caller-owned (the certified call's
/// workspace); u has room for whole blocks: u_stride >= blocks(pool_end) * 128.
struct scan_request {
  const key_index* index = nullptr;
  const float* queries = nullptr;  // [nq][padded_dim], padded channels 0
  std::size_t nq = 0;
  double softmax_scale = 1.0;
  std::size_t pool_end = 0;        // bounds for tokens [0, pool_end)
  float* u = nullptr;              // [nq][u_stride] out
  std::size_t u_stride = 0;
  float* block_max = nullptr;      // [nq][block_stride] out: max u over a block's pool tokens
  std::size_t block_stride = 0;
  std::int8_t* qa = nullptr;       // [nq][padded_dim] scratch
  detail::block_query_prep* prep = nullptr;  // [nq] scratch
};

namespace detail {

inline void finish_block_max(const scan_request& r, std::size_t b) noexcept {
  const std::size_t t0 = b * key_index::kBlockTokens;
  const std::size_t t1 = std::min(r.pool_end, t0 + key_index::kBlockTokens);
  for (std::size_t g = 0; g < r.nq; ++g) {
    const float* u = r.u + g * r.u_stride;
    float m = -std::numeric_limits<float>::infinity();
    for (std::size_t t = t0; t < t1; ++t) m = std::max(m, u[t]);
    r.block_max[g * r.block_stride + b] = m;
  }
}

// One driver per instruction set, so that the shared preparation is inlined and
// vectorised in each kernel's own target context (it gives the same bits everywhere).
#define CERTATTN_SCAN_DRIVER(NAME, ATTR, PREP, KERNEL)                                      \
  ATTR inline void NAME(const scan_request& r) noexcept {                                   \
    const key_index& idx = *r.index;                                                        \
    const std::size_t dp = idx.padded_dim();                                                \
    const std::size_t nb = (r.pool_end + key_index::kBlockTokens - 1) / key_index::kBlockTokens; \
    for (std::size_t b = 0; b < nb; ++b) {                                                  \
      for (std::size_t g = 0; g < r.nq; ++g)                                                \
        r.prep[g] = PREP(idx.block_lo(b), idx.block_step4(b), r.queries + g * dp, dp,        \
                         r.softmax_scale, r.qa + g * dp);                                   \
      KERNEL(idx.block_codes4(b), idx.block_rho(b), dp, r.qa, r.prep, r.nq,                 \
             r.u + b * key_index::kBlockTokens,                                             \
             r.u_stride);                                                                   \
      finish_block_max(r, b);                                                               \
    }                                                                                       \
  }

CERTATTN_SCAN_DRIVER(scan_scalar, , prepare_block_query, scalar::scan_block)
#if CERTATTN_X86
CERTATTN_SCAN_DRIVER(scan_avx2, CERTATTN_TARGET_AVX2, prepare_block_query, avx2::scan_block)
CERTATTN_SCAN_DRIVER(scan_avx512, CERTATTN_TARGET_AVX512, avx512::prepare_block_query_avx512,
                     avx512::scan_block)
#endif
#undef CERTATTN_SCAN_DRIVER

}  // namespace detail

/// Runs the scan with the given instruction set (normally active_isa()).
inline void scan_score_bounds(const scan_request& r, isa which = active_isa()) noexcept {
  CERTATTN_ASSERT(r.index != nullptr && r.pool_end <= r.index->size());
#if CERTATTN_X86
  if (which == isa::kAvx512Vnni) return detail::scan_avx512(r);
  if (which == isa::kAvx2) return detail::scan_avx2(r);
#endif
  (void)which;
  detail::scan_scalar(r);
}

}  // namespace certattn
