// AMX-INT8 4-bit scan (Intel Sapphire Rapids and later): the integer dots of the VNNI
// scan (arch/avx512/scan_kernels.hpp) as tile multiplies, the rest of the scan (the
// preparation of each block's int8 queries, the float finish of each bound) the VNNI
// scan's own operations, so that every bound has the same bits.
//
// Why: from G = 4 queries on, the VNNI scan is bound by its vpdpbusd (four per 64-byte
// line of codes and query: two nibbles times two query planes, docs/fast-path.md "The
// scan's floor"), and its cost grows with the queries of the call: 32 queries (8 draft
// positions of a G = 4 group) cost 6x one position. One tdpbsud multiplies 16 rows of int8
// query bytes by 64 channels of 16 tokens, 16 times the work of a vpdpbusd.
//
// Layout. A line of codes holds 4 channels (low nibbles) and the next 4 (high nibbles) of
// 16 tokens, 4 bytes per token. Its low nibbles are, unchanged, one row of a B tile in
// AMX's layout (4 consecutive K bytes per token column), its high nibbles the next row;
// so a block's codes, unpacked once into bytes (two 64-byte stores per line), are
// 8 groups x kt B tiles of 8 lines (64 channels) each, kt = ceil(padded_dim / 64). The
// queries are prepared straight into A-tile rows: row 2g is query g's first int8 plane and
// row 2g + 1 its second, each 64 kt bytes in the line order (octet o's 4 low channels,
// then its 4 high ones), zero past the last octet. A tile of 16 rows is 8 queries; its C
// tile row 2g holds query g's first-plane dot of the group's 16 tokens, row 2g + 1 the
// second's, which the finish combines as 128 dot + dot_f like the VNNI kernel.
//
// Schedule. Per block: prepare, unpack the block's codes, then per chunk of 8 queries
// keep its A tiles resident (kt <= 4) and stream the 8 groups' B tiles through two tile
// registers, with two C tiles alternating between groups; a group's C tile is stored one
// group and read back (by the finish) two groups after its multiplies were issued, and
// the next block's codes are prefetched a group at a time between the multiplies. The
// whole block is unpacked before its first tile load: unpacking the next block's groups
// between the current block's multiplies was slower at every G (docs/fast-path.md, "The
// scan on AMX tiles").
#pragma once

#include <certattn/arch/avx512/scan_kernels.hpp>
#include <certattn/arch/dispatch.hpp>
#include <certattn/arch/scan_prep.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#if defined(__linux__) && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <sys/syscall.h>
#include <unistd.h>
#define CERTATTN_AMX 1
#else
#define CERTATTN_AMX 0
#endif

#include <certattn/arch/macros.hpp>

CERTATTN_ARCH_BEGIN
namespace certattn::detail::amx {

inline constexpr std::size_t kTileBytes = 1024;        // 16 rows of 64 bytes
inline constexpr std::size_t kQueriesPerTile = 8;      // two planes each: 16 rows
inline constexpr std::size_t kChannelsPerTile = 64;    // K bytes of one tile row
inline constexpr std::size_t kResultBuffers = 4;       // C tiles stored, in turn
/// The fewest queries the scan runs on tiles. Below it, unpacking each block's codes into
/// B tiles (two 64-byte stores per line) and storing and reloading the sums cost what the
/// vpdpbusd they replace cost, or more. Sapphire Rapids guest,
/// `certattn-micro --benchmark_filter=scan/n:131072` (128K tokens, head_dim 128), us per
/// call, VNNI against tiles: G = 1/2/4 cache-resident 347/466/719 against 421/518/690,
/// from memory G = 1 373-380 against 511-555, G = 4 763-805 against 801-829; from memory
/// G = 8/12/16/32 1676-1709 / 2414-2511 / 3169-3337 / 5788-6245 against 1383-1461 /
/// 1943-1993 / 2279-2383 / 3615-4216.
inline constexpr std::size_t kMinQueries = 8;

/// K tiles of a block's codes: 64 channels each.
constexpr std::size_t k_tiles(std::size_t padded_dim) noexcept {
  return (padded_dim + kChannelsPerTile - 1) / kChannelsPerTile;
}
/// Bytes of one A-tile row (one query plane, zero past padded_dim).
constexpr std::size_t query_row_bytes(std::size_t padded_dim) noexcept {
  return kChannelsPerTile * k_tiles(padded_dim);
}
/// Query chunks of 8.
constexpr std::size_t query_chunks(std::size_t nq) noexcept {
  return (nq + kQueriesPerTile - 1) / kQueriesPerTile;
}

/// The scratch of one AMX scan, in the caller's query scratch (scan_request::qa): the A
/// rows of every chunk (16 rows each, rows past 2 nq zero), one block's unpacked codes,
/// the stored C tiles.
struct scratch_layout {
  std::size_t a_bytes, b_bytes, c_bytes;
  constexpr scratch_layout(std::size_t nq, std::size_t padded_dim) noexcept
      : a_bytes(query_chunks(nq) * 16 * query_row_bytes(padded_dim)),
        b_bytes(kGroupsPerBlock * k_tiles(padded_dim) * kTileBytes),
        c_bytes(kResultBuffers * kTileBytes) {}
  constexpr std::size_t total() const noexcept { return a_bytes + b_bytes + c_bytes + 64; }
};
/// Whether the scan of nq queries runs on tiles where enabled() (see kMinQueries).
constexpr bool serves(std::size_t nq) noexcept { return nq >= kMinQueries; }
/// Scratch of the AMX scan of nq queries (0 where it never runs).
constexpr std::size_t scratch_bytes(std::size_t nq, std::size_t padded_dim) noexcept {
  return serves(nq) ? scratch_layout(nq, padded_dim).total() : 0;
}

#if CERTATTN_AMX
/// CPUID says AMX-TILE and AMX-INT8, and Linux grants this process the tile data state
/// (arch_prctl ARCH_REQ_XCOMP_PERM, Linux 5.16+).
inline bool detect() noexcept {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, a, b, c, d);
  if (((d >> 24) & 1u) == 0 || ((d >> 25) & 1u) == 0) return false;
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return ::syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
}
#else
inline bool detect() noexcept { return false; }
#endif

/// Whether this machine runs tile multiplies (checked once per process).
inline bool available() noexcept {
  static const bool ok = detect();
  return ok;
}
inline std::atomic<int>& enabled_flag() noexcept {
  static std::atomic<int> on{available() && std::getenv("CERTATTN_NO_AMX") == nullptr ? 1 : 0};
  return on;
}
/// Whether the scan uses AMX: available() and neither CERTATTN_NO_AMX is set in the
/// environment nor set_enabled(false) was called.
inline bool enabled() noexcept { return enabled_flag().load(std::memory_order_relaxed) != 0; }
/// Turns the AMX scan off (the VNNI scan runs, with the same bits) or back on where
/// available(): for tests and benches.
inline void set_enabled(bool on) noexcept { enabled_flag().store(on && available() ? 1 : 0); }

#if CERTATTN_AMX
#define CERTATTN_TARGET_AMX CERTATTN_TARGET_AVX512
// The tile instructions as inline assembly with their memory effects declared: GCC 12's
// _tile_loadd and _tile_loadconfig tell the compiler nothing of the memory they read, so
// it may sink or drop the stores that fill a tile's source. AT&T operand order.
#define CERTATTN_TILE_LOAD(t, base, stride)                                                  \
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(base), "r"(std::int64_t(stride))    \
                   : "memory")
#define CERTATTN_TILE_STORE(t, base)                                                         \
  __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(base), "r"(std::int64_t(64))    \
                   : "memory")
#define CERTATTN_TILE_ZERO(t) __asm__ volatile("tilezero %%tmm" #t ::)
#define CERTATTN_TILE_DPBSUD(c, a, b) \
  __asm__ volatile("tdpbsud %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)

/// Tiles 0 and 1: C (alternating groups); 2 and 3: B (alternating K tiles); 4-7: the
/// chunk's A tiles (K tiles 0-3; beyond 4 K tiles, 4 and 5 alternate and reload).
struct alignas(64) tile_config {
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

CERTATTN_TARGET_AMX inline void configure(std::size_t rows) noexcept {
  tile_config cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = std::uint8_t(t == 2 || t == 3 ? 16 : rows);
  }
  __asm__ volatile("ldtilecfg %0" ::"m"(cfg) : "memory");
}

/// The tile state of one scan: configured before the first block, released after the
/// last (so that the thread's context switches save no tile data afterwards).
struct tile_session {
  CERTATTN_TARGET_AMX explicit tile_session(std::size_t rows) noexcept { configure(rows); }
  ~tile_session() { __asm__ volatile("tilerelease" ::); }
  tile_session(const tile_session&) = delete;
  tile_session& operator=(const tile_session&) = delete;
};

/// One block's lines of codes (8 groups of n_oct lines) unpacked into B tiles: line o of
/// group grp gives rows 2 (o % 8) (low nibbles) and 2 (o % 8) + 1 (high) of its K tile
/// o / 8. Rows of octets past the last keep old bytes: the A columns for them are zero.
CERTATTN_TARGET_AMX inline void unpack_block(const std::uint8_t* codes, std::size_t n_oct,
                                             std::size_t kt, std::uint8_t* b) noexcept {
  const __m512i mask = _mm512_set1_epi8(0x0F);
  for (std::size_t grp = 0; grp < kGroupsPerBlock; ++grp) {
    std::uint8_t* tiles = b + grp * kt * kTileBytes;
    for (std::size_t o = 0; o < n_oct; ++o) {
      const __m512i x = _mm512_loadu_si512(codes);
      std::uint8_t* row = tiles + (o / 8) * kTileBytes + (o % 8) * 128;
      _mm512_store_si512(row, _mm512_and_si512(x, mask));
      _mm512_store_si512(row + 64, _mm512_and_si512(_mm512_srli_epi16(x, 4), mask));
      codes += 64;
    }
  }
}

/// avx512::finish_bounds16() (the VNNI kernel's finish) of one group of 16 tokens for the
/// queries of one chunk (their dots in rows 2g, 2g + 1 of the stored C tile c).
CERTATTN_TARGET_AMX __attribute__((always_inline)) inline void finish_group(
    const std::int32_t* c, const std::uint8_t* rho, std::size_t grp, std::size_t valid,
    const block_query_prep* prep, std::size_t n, float* u, std::size_t u_stride,
    __m512* mx) noexcept {
  const std::size_t first = grp * kGroupTokens;
  const __m512 rb = _mm512_cvtepi32_ps(
      _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rho + first))));
  const std::size_t lanes = valid > first ? std::min(valid - first, kGroupTokens) : 0;
  const __mmask16 live = __mmask16((1u << lanes) - 1u);
  for (std::size_t g = 0; g < n; ++g)
    mx[g] = avx512::finish_bounds16(_mm512_load_si512(c + 32 * g),
                                    _mm512_load_si512(c + 32 * g + 16), prep[g], rb, live,
                                    u + g * u_stride + first, mx[g]);
}

/// The multiplies of one group into C tile C (0 or 1): A tiles resident in 4-7 when
/// kt <= 4, else loaded per K tile from a (rows of a_row bytes).
#define CERTATTN_AMX_GROUP(C)                                                                \
  do {                                                                                       \
    CERTATTN_TILE_ZERO(C);                                                                   \
    if (resident) {                                                                          \
      CERTATTN_TILE_LOAD(2, bg, 64);                                                         \
      CERTATTN_TILE_DPBSUD(C, 4, 2);                                                         \
      if (kt > 1) {                                                                          \
        CERTATTN_TILE_LOAD(3, bg + kTileBytes, 64);                                          \
        CERTATTN_TILE_DPBSUD(C, 5, 3);                                                       \
      }                                                                                      \
      if (kt > 2) {                                                                          \
        CERTATTN_TILE_LOAD(2, bg + 2 * kTileBytes, 64);                                      \
        CERTATTN_TILE_DPBSUD(C, 6, 2);                                                       \
      }                                                                                      \
      if (kt > 3) {                                                                          \
        CERTATTN_TILE_LOAD(3, bg + 3 * kTileBytes, 64);                                      \
        CERTATTN_TILE_DPBSUD(C, 7, 3);                                                       \
      }                                                                                      \
    } else {                                                                                 \
      for (std::size_t k = 0; k + 1 < kt; k += 2) {                                          \
        CERTATTN_TILE_LOAD(4, a + 64 * k, a_row);                                            \
        CERTATTN_TILE_LOAD(2, bg + k * kTileBytes, 64);                                      \
        CERTATTN_TILE_DPBSUD(C, 4, 2);                                                       \
        CERTATTN_TILE_LOAD(5, a + 64 * (k + 1), a_row);                                      \
        CERTATTN_TILE_LOAD(3, bg + (k + 1) * kTileBytes, 64);                                \
        CERTATTN_TILE_DPBSUD(C, 5, 3);                                                       \
      }                                                                                      \
      if (kt % 2 != 0) {                                                                     \
        CERTATTN_TILE_LOAD(4, a + 64 * (kt - 1), a_row);                                     \
        CERTATTN_TILE_LOAD(2, bg + (kt - 1) * kTileBytes, 64);                               \
        CERTATTN_TILE_DPBSUD(C, 4, 2);                                                       \
      }                                                                                      \
    }                                                                                        \
  } while (0)

/// Bounds of one block for the queries of one chunk (n <= 8 of them, A rows at a), from
/// the block's unpacked codes b: u and bmax as avx512::scan_block. next_codes (or
/// nullptr): the next block's codes, prefetched a group (group_bytes) at a time between
/// the multiplies. A decode step reads them from memory, and prefetched in one burst while
/// unpacking (as the VNNI kernel prefetches) they filled the miss buffers and stalled it:
/// G = 4 from memory 1178-1228 us against 801-829 spread (G = 32: 3955-4248 against
/// 3615-3636; `certattn-micro --benchmark_filter=scan/n:131072`, tiles forced on);
/// two blocks ahead, 968-1026.
CERTATTN_TARGET_AMX inline void scan_chunk(const std::uint8_t* b, const std::int8_t* a,
                                           std::size_t a_row, std::size_t kt,
                                           const std::uint8_t* rho, const block_query_prep* prep,
                                           std::size_t n, float* u, std::size_t u_stride,
                                           std::size_t valid, float* bmax, std::size_t bmax_stride,
                                           std::int32_t* c, const std::uint8_t* next_codes,
                                           std::size_t group_bytes) noexcept {
  const bool resident = kt <= 4;
  if (resident) {
    CERTATTN_TILE_LOAD(4, a, a_row);
    if (kt > 1) CERTATTN_TILE_LOAD(5, a + 64, a_row);
    if (kt > 2) CERTATTN_TILE_LOAD(6, a + 128, a_row);
    if (kt > 3) CERTATTN_TILE_LOAD(7, a + 192, a_row);
  }
  __m512 mx[kQueriesPerTile];
  for (std::size_t g = 0; g < n; ++g) mx[g] = _mm512_set1_ps(-__builtin_inff());
  auto result = [c](std::size_t grp) { return c + (grp % kResultBuffers) * (kTileBytes / 4); };
  for (std::size_t grp = 0; grp < kGroupsPerBlock; ++grp) {
    const std::uint8_t* bg = b + grp * kt * kTileBytes;
    if (grp % 2 == 0) {
      CERTATTN_AMX_GROUP(0);
      if (grp >= 1) CERTATTN_TILE_STORE(1, result(grp - 1));
    } else {
      CERTATTN_AMX_GROUP(1);
      CERTATTN_TILE_STORE(0, result(grp - 1));
    }
    if (next_codes != nullptr)
      for (std::size_t o = 0; o < group_bytes; o += 64)
        _mm_prefetch(reinterpret_cast<const char*>(next_codes + grp * group_bytes + o),
                     _MM_HINT_T0);
    if (grp >= 2) finish_group(result(grp - 2), rho, grp - 2, valid, prep, n, u, u_stride, mx);
  }
  CERTATTN_TILE_STORE(1, result(kGroupsPerBlock - 1));
  finish_group(result(kGroupsPerBlock - 2), rho, kGroupsPerBlock - 2, valid, prep, n, u,
               u_stride, mx);
  finish_group(result(kGroupsPerBlock - 1), rho, kGroupsPerBlock - 1, valid, prep, n, u,
               u_stride, mx);
  for (std::size_t g = 0; g < n; ++g) bmax[g * bmax_stride] = _mm512_reduce_max_ps(mx[g]);
}
#undef CERTATTN_AMX_GROUP

/// The preparation of one block for nq queries into A rows (query g's planes in rows 2g
/// and 2g + 1 of a_row bytes): avx512::prepare_block_queries_avx512's operations in
/// another byte order, hence the same bytes and prep.
CERTATTN_TARGET_AMX inline void prepare_block_rows(const float* lo, const float* st,
                                                   const float* q, std::size_t padded_dim,
                                                   std::size_t nq, std::int8_t* a,
                                                   std::size_t a_row,
                                                   block_query_prep* out) noexcept {
  std::size_t g = 0;
  for (; g + 2 <= nq; g += 2)
    avx512::prep_heads<2>(lo, st, q + g * padded_dim, padded_dim, a + 2 * g * a_row,
                          a + (2 * g + 1) * a_row, 8, out + g, 2 * a_row);
  if (g < nq)
    avx512::prep_heads<1>(lo, st, q + g * padded_dim, padded_dim, a + 2 * g * a_row,
                          a + (2 * g + 1) * a_row, 8, out + g, 2 * a_row);
}

#undef CERTATTN_TARGET_AMX
#undef CERTATTN_TILE_LOAD
#undef CERTATTN_TILE_STORE
#undef CERTATTN_TILE_ZERO
#undef CERTATTN_TILE_DPBSUD
#endif  // CERTATTN_AMX

}  // namespace certattn::detail::amx
CERTATTN_ARCH_END

#include <certattn/arch/macros_undef.hpp>
