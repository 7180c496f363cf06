// The score-bound scan: deterministic upper bounds u_i >= s_i for every pool key and the
// G query heads of a GQA group, in one pass over the 4-bit codes (read once per group).
// Dispatches at run time to the AVX-512 VNNI, AVX2 or plain kernel; all three give the
// same bits (see arch/scan_prep.hpp for the bound and why it is bit-identical).
#pragma once

#include <certattn/arch/amx/scan_kernels.hpp>
#include <certattn/arch/avx2/scan_kernels.hpp>
#include <certattn/arch/avx512/scan_kernels.hpp>
#include <certattn/arch/dispatch.hpp>
#include <certattn/arch/scalar/scan_kernels.hpp>
#include <certattn/arch/scan_prep.hpp>
#include <certattn/index.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <certattn/arch/macros.hpp>

namespace certattn {

/// Bytes of the scan's scratch (scan_request::qa): two int8 planes of nq queries
/// (arch/scan_prep.hpp), or the AMX scan's tiles (arch/amx/scan_kernels.hpp).
constexpr std::size_t scan_query_bytes(std::size_t nq, std::size_t padded_dim) noexcept {
  return std::max(detail::query_plane_bytes(nq, padded_dim),
                  detail::amx::scratch_bytes(nq, padded_dim));
}

/// Inputs and outputs of one scan. Buffers are caller-owned (the certified call's
/// workspace); u has room for whole blocks: u_stride >= blocks(pool_end) * 128.
struct scan_request {
  const key_index* index = nullptr;
  const float* queries = nullptr;  // [nq][padded_dim], padded channels 0
  std::size_t nq = 0;
  double softmax_scale = 1.0;
  std::size_t pool_end = 0;        // bounds for tokens [block_begin * 128, pool_end)
  std::size_t block_begin = 0;     // the first block scanned (a sliding window's)
  float* u = nullptr;              // [nq][u_stride] out
  std::size_t u_stride = 0;
  float* block_max = nullptr;      // [nq][block_stride] out: max u over a block's pool tokens
  std::size_t block_stride = 0;
  std::int8_t* qa = nullptr;       // [scan_query_bytes(nq, padded_dim)] scratch (int8 queries)
  // [nq][residual_stride] out, optional: per block scanned, the pair (holder, norm) of each
  // query's residual term min(holder, norm * rho byte), which the nested 8-bit refinement
  // takes off a token's u (detail::scan_integer_part()).
  detail::residual_coefficients* residual = nullptr;
  std::size_t residual_stride = 0;
  detail::block_query_prep* prep = nullptr;  // [nq] scratch
};

namespace detail {

/// Prefetches what the preparation reads of block b (lo and st4) and its residual bytes.
inline void prefetch_block_scales(const key_index& idx, std::size_t b) noexcept {
  const char* lo = reinterpret_cast<const char*>(idx.block_lo(b));
  for (std::size_t i = 0; i < 2 * idx.padded_dim() * sizeof(float); i += 64)
    __builtin_prefetch(lo + i);
  __builtin_prefetch(idx.block_rho(b));
  __builtin_prefetch(idx.block_rho(b) + 64);
}

// One driver per instruction set: each kernel has its own preparation and finish (the
// same operations in the same order; arch/scan_prep.hpp). The kernel writes every token
// of a block and the block's maximum over its pool tokens.
#define CERTATTN_SCAN_DRIVER(NAME, ATTR, MAXABS, MAXIMA, PREP, FINISH, KERNEL)               \
  ATTR inline void NAME(const scan_request& r) noexcept {                                   \
    const key_index& idx = *r.index;                                                        \
    const std::size_t dp = idx.padded_dim();                                                \
    const std::size_t nb = (r.pool_end + key_index::kBlockTokens - 1) / key_index::kBlockTokens; \
    const scan_constants k = make_scan_constants(dp, r.softmax_scale);                      \
    for (std::size_t g = 0; g < r.nq; ++g) r.prep[g].max_abs_q = MAXABS(r.queries + g * dp, dp); \
    for (std::size_t b = r.block_begin; b < nb; ++b) {                                      \
      const float* lo = idx.block_lo(b);                                                    \
      const float* st = idx.block_step4(b);                                                 \
      PREP(lo, st, r.queries, dp, r.nq, r.qa, r.prep);                                      \
      if (b + 1 < nb) prefetch_block_scales(idx, b + 1);                                    \
      FINISH(r.prep, r.nq, k, MAXIMA(lo, st, dp));                                          \
      if (r.residual)                                                                       \
        for (std::size_t g = 0; g < r.nq; ++g)                                              \
          r.residual[g * r.residual_stride + b] = {r.prep[g].holder, r.prep[g].norm};       \
      const std::size_t t0 = b * key_index::kBlockTokens;                                   \
      KERNEL(idx.block_codes4(b), idx.block_rho(b), dp, r.qa, r.prep, r.nq, r.u + t0,        \
             r.u_stride, std::min(r.pool_end - t0, key_index::kBlockTokens),                \
             r.block_max + b, r.block_stride);                                              \
    }                                                                                       \
  }

CERTATTN_SCAN_DRIVER(scan_scalar, , max_abs, block_scale_maxima, prepare_block_queries,
                     finish_prep, scalar::scan_block)
#if CERTATTN_X86
CERTATTN_SCAN_DRIVER(scan_avx2, CERTATTN_TARGET_AVX2, max_abs, block_scale_maxima,
                     avx2::prepare_block_queries_avx2, finish_prep, avx2::scan_block)
CERTATTN_SCAN_DRIVER(scan_avx512, CERTATTN_TARGET_AVX512, avx512::max_abs_avx512,
                     avx512::block_scale_maxima_avx512, avx512::prepare_block_queries_avx512,
                     avx512::finish_prep_avx512, avx512::scan_block)
#endif
#undef CERTATTN_SCAN_DRIVER

#if CERTATTN_AMX
/// scan_avx512 with its integer dots as AMX tile multiplies (arch/amx/scan_kernels.hpp):
/// the same preparation and finish, hence the same bits. r.qa holds
/// amx::scratch_layout(r.nq, padded_dim).total() bytes (scan_query_bytes() where
/// amx::serves(r.nq)); runs only where amx::available().
CERTATTN_TARGET_AVX512 inline void scan_amx(const scan_request& r) noexcept {
  const key_index& idx = *r.index;
  const std::size_t dp = idx.padded_dim(), n_oct = dp / 8, kt = amx::k_tiles(dp);
  const std::size_t a_row = amx::query_row_bytes(dp), nq = r.nq;
  const std::size_t nb = (r.pool_end + key_index::kBlockTokens - 1) / key_index::kBlockTokens;
  const amx::scratch_layout lay(nq, dp);
  auto* a = reinterpret_cast<std::int8_t*>(
      (reinterpret_cast<std::uintptr_t>(r.qa) + 63) & ~std::uintptr_t(63));
  auto* b = reinterpret_cast<std::uint8_t*>(a + lay.a_bytes);
  auto* c = reinterpret_cast<std::int32_t*>(a + lay.a_bytes + lay.b_bytes);
  const std::size_t block_bytes = kGroupsPerBlock * n_oct * 64;
  std::memset(a, 0, lay.a_bytes);  // columns past padded_dim and rows past 2 nq stay zero
  const scan_constants k = make_scan_constants(dp, r.softmax_scale);
  for (std::size_t g = 0; g < nq; ++g)
    r.prep[g].max_abs_q = avx512::max_abs_avx512(r.queries + g * dp, dp);
  const amx::tile_session tiles(std::min<std::size_t>(16, 2 * nq));
  for (std::size_t blk = r.block_begin; blk < nb; ++blk) {
    const float* lo = idx.block_lo(blk);
    const float* st = idx.block_step4(blk);
    amx::prepare_block_rows(lo, st, r.queries, dp, nq, a, a_row, r.prep);
    if (blk + 1 < nb) prefetch_block_scales(idx, blk + 1);
    avx512::finish_prep_avx512(r.prep, nq, k, avx512::block_scale_maxima_avx512(lo, st, dp));
    if (r.residual)
      for (std::size_t g = 0; g < nq; ++g)
        r.residual[g * r.residual_stride + blk] = {r.prep[g].holder, r.prep[g].norm};
    const std::uint8_t* codes = idx.block_codes4(blk);
    amx::unpack_block(codes, n_oct, kt, b);
    const std::size_t t0 = blk * key_index::kBlockTokens;
    const std::size_t valid = std::min(r.pool_end - t0, key_index::kBlockTokens);
    for (std::size_t g0 = 0; g0 < nq; g0 += amx::kQueriesPerTile)
      amx::scan_chunk(b, a + 2 * g0 * a_row, a_row, kt, idx.block_rho(blk), r.prep + g0,
                      std::min(amx::kQueriesPerTile, nq - g0), r.u + g0 * r.u_stride + t0,
                      r.u_stride, valid, r.block_max + g0 * r.block_stride + blk,
                      r.block_stride, c, g0 == 0 ? codes + block_bytes : nullptr, n_oct * 64);
  }
}
#endif

}  // namespace detail

/// Runs the scan with the given instruction set (normally active_isa()).
inline void scan_score_bounds(const scan_request& r, isa which = active_isa()) noexcept {
  CERTATTN_ASSERT(r.index != nullptr && r.pool_end <= r.index->size());
#if CERTATTN_X86
  if (which == isa::kAvx512Vnni) {
#if CERTATTN_AMX
    if (detail::amx::serves(r.nq) && detail::amx::enabled()) return detail::scan_amx(r);
#endif
    return detail::scan_avx512(r);
  }
  if (which == isa::kAvx2) return detail::scan_avx2(r);
#endif
  (void)which;
  detail::scan_scalar(r);
}

}  // namespace certattn

#include <certattn/arch/macros_undef.hpp>
