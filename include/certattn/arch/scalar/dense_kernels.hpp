// Scalar twin of the dense attention kernels (arch/avx2, arch/avx512): the same chunked
// online softmax in plain C++. It is the kernel of CPUs without AVX2 and the readable
// statement of what the vector kernels compute. Also defines the chunk interface they share.
#pragma once

#include <certattn/common.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace certattn::detail {

/// Tokens per chunk of the online softmax. Per chunk a kernel computes the scores of all
/// queries of the group, one softmax step, then the value pass; each chunk also prefetches
/// the next one. 16 (one score vector per query) measured best with DRAM-resident caches
/// (d = 128 fp16, G = 1..8: 15-30% faster than 32 or 64, whose prefetch footprint evicts
/// the current chunk from L1), at a cost of ~5-10% with cache-resident ones.
inline constexpr std::size_t dense_chunk_tokens = 16;

/// Rounds n up to a multiple of 16: the padded length of query rows and row-pointer lists.
constexpr std::size_t dense_round16(std::size_t n) noexcept { return (n + 15) / 16 * 16; }

/// One chunk of one KV head for the `group` queries that share it. Rows come as pointers
/// rather than strides: every kv_view (strided, paged, user-defined) reduces to them once
/// per chunk, so kernels are instantiated per element type only.
struct dense_chunk_args {
  const float* queries = nullptr;  // [group][q_stride] scaled by softmax_scale, 0 past head_dim
  std::size_t q_stride = 0;        // dense_round16(head_dim)
  std::size_t group = 0;
  std::size_t head_dim = 0;
  std::size_t value_dim = 0;       // channels of a value row (<= head_dim; MLA's are fewer)
  // Row pointers of the chunk's tokens, followed by those of the tokens the next calls will
  // read (for prefetching): [rows_ahead] entries, rows_ahead >= dense_round16(n) for keys
  // (a short last chunk repeats its last row).
  const void* const* key_rows = nullptr;
  const void* const* value_rows = nullptr;
  std::size_t n = 0;            // tokens in the chunk, 1..dense_chunk_tokens
  float* scores = nullptr;      // [group][dense_chunk_tokens] scratch: scores, then weights
  float* alpha = nullptr;       // [group] scratch: rescale factor of this chunk
  float* chunk_acc = nullptr;   // [(group + 1) * q_stride] scratch (scalar kernel only)
  float* max_scores = nullptr;  // [group] running max m (-inf before the first chunk)
  float* sums = nullptr;        // [group] running sum of exp(s - m)
  float* acc = nullptr;         // [group][acc_stride] running sum of exp(s - m) v
  std::size_t acc_stride = 0;
  std::size_t rows_ahead = 0;
  std::size_t prefetch_distance = 0;  // rows between a row's prefetch and its first read
  // The score variant (variant.hpp), applied to the chunk's scores before its softmax step
  // by dense_apply_variant(): soft-cap (0 off), then the position bias slope[g] (t - newest)
  // with `position` = first token of the chunk - newest (slopes null: none).
  float softcap = 0.0f;
  const float* slopes = nullptr;  // [group] or null
  float position = 0.0f;
  // An fp8 cache's scales (formats.hpp): a channel is fl(scale * code). 1 otherwise.
  float key_scale = 1.0f, value_scale = 1.0f;
};

/// The variant's scores of the chunk, in place: s = cap tanh(s / cap), then
/// s += slope (position + t). In float with the C library's tanhf (within 2 ulp), whose
/// error the dense kernel's rounding bound covers (rounding.hpp, via
/// head_variant::score_magnitude()). Every kernel calls it between its scores and its
/// softmax step; plain attention skips it at one branch per chunk.
inline void dense_apply_variant(const dense_chunk_args& a) noexcept {
  if (a.softcap <= 0.0f && a.slopes == nullptr) return;
  constexpr std::size_t C = dense_chunk_tokens;
  for (std::size_t g = 0; g < a.group; ++g) {
    float* s = a.scores + g * C;
    if (a.softcap > 0.0f) {
      const float cap = a.softcap, inv = 1.0f / a.softcap;
      for (std::size_t t = 0; t < a.n; ++t) s[t] = cap * std::tanh(s[t] * inv);
    }
    if (a.slopes != nullptr) {
      const float m = a.slopes[g];
      for (std::size_t t = 0; t < a.n; ++t) s[t] += m * (a.position + float(t));
    }
  }
}

/// Software prefetch of every cache line of a row. Kernels prefetch key row t + distance
/// during their first pass over this chunk's keys and value row t + distance during their
/// first pass over its values, so the memory bus works while they compute: the hardware
/// prefetchers alone (which stop at 4 KiB pages and see two interleaved streams) leave it
/// idle during the arithmetic. Measured at d = 128 fp16: G = 4 from 44 to 19 ns per token,
/// G = 1 from 25 to 16. Spreading the next chunk's requests evenly over all passes was
/// slower (26 ns at G = 4).
inline void dense_prefetch_row(const void* row, std::size_t bytes) noexcept {
  std::uintptr_t line = reinterpret_cast<std::uintptr_t>(row) & ~std::uintptr_t(63);
  const std::uintptr_t end = reinterpret_cast<std::uintptr_t>(row) + bytes;
  for (; line < end; line += 64) {
    // GCC 12 treats __builtin_prefetch as free of side effects and, under -ffinite-loops,
    // may delete a loop of them (it did in some inlining contexts): use a volatile asm on x86.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __asm__ volatile("prefetcht0 %0" : : "m"(*reinterpret_cast<const char*>(line)));
#else
    __builtin_prefetch(reinterpret_cast<const void*>(line), 0, 3);
#endif
  }
}

/// Prefetch distance in rows: one chunk. Measured against 0-64 rows: shorter leaves misses
/// exposed, longer was slower too (10% at G = 8 for 24 rows), the rows in flight competing
/// with the current chunk for L1. Rows of 128 bytes (fp8 at d = 128, fp16 at d = 64) ran
/// 12-22% faster at 24 rows (`certattn-micro dense_hnd`), but the longer row-pointer ring
/// that needs (dense_rows_capacity) made the fp16 kernel at d = 128 5-28% slower in
/// certattn-bench, a layout effect not understood (docs/bench.md, "Quantized dense
/// kernels"); so every row size keeps one chunk.
inline constexpr std::size_t dense_prefetch_rows = dense_chunk_tokens;

/// Row r of a row list, counted from the chunk's first token, or null past its end.
inline const void* dense_ahead_row(const void* const* rows, std::size_t rows_ahead,
                                   std::size_t r) noexcept {
  return r < rows_ahead ? rows[r] : nullptr;
}

/// Scores are kept finite so that s - m never becomes inf - inf (a NaN) when a huge
/// softmax_scale overflows a dot product; NaN inputs still propagate.
inline float dense_clamp_score(float s) noexcept {
  constexpr float big = std::numeric_limits<float>::max();
  return std::min(std::max(s, -big), big);
}

namespace scalar {

/// A cache row [d] as floats, zero-padded to q_stride.
template <class T>
inline void dense_row_to_float(const T* src, std::size_t d, std::size_t q_stride, float* dst) {
  std::size_t i = 0;
  if constexpr (std::is_same_v<T, half>) {
    std::uint16_t bits[16];
    for (; i + 16 <= d; i += 16) {
      std::memcpy(bits, src + i, sizeof bits);
      // Branch-free (float16.hpp), so GCC vectorises this loop at -O2: the generic
      // conversion cost ~250 ns per token at d = 128, G = 4.
      for (std::size_t j = 0; j < 16; ++j) dst[i + j] = half_bits_to_float(bits[j]);
    }
  }
  for (; i < d; ++i) dst[i] = to_float(src[i]);
  for (; i < q_stride; ++i) dst[i] = 0.0f;
}

/// The chunk, in the vector kernels' order: each key and value row converted to float
/// once for all queries (a software fp16 conversion per element and query made this
/// kernel 4x slower at G = 4), sixteen partial sums per dot product, the value pass summed
/// per chunk from zero and then added to the running accumulator.
template <class K, class V = K>
inline void dense_chunk(const dense_chunk_args& a) {
  constexpr std::size_t C = dense_chunk_tokens;
  const std::size_t d = a.head_dim, G = a.group;
  float* row = a.chunk_acc;                 // [q_stride]
  float* chunk = a.chunk_acc + a.q_stride;  // [group][q_stride]
  for (std::size_t t = 0; t < a.n; ++t) {
    const K* k = static_cast<const K*>(a.key_rows[t]);
    dense_row_to_float(k, d, a.q_stride, row);
    for (std::size_t g = 0; g < G; ++g) {
      // Sixteen partial sums, as in the vector kernels: a single running sum would lose
      // ~sqrt(d) times more to rounding on the large scores of peaked queries.
      // Blocks of 16 with a fixed inner count also let GCC vectorise at -O2 (ARM builds
      // run this kernel); query rows and `row` are zero-padded to q_stride.
      const float* q = a.queries + g * a.q_stride;
      float part[16] = {};
      for (std::size_t i = 0; i < a.q_stride; i += 16)
        for (std::size_t j = 0; j < 16; ++j) part[j] += q[i + j] * row[i + j];
      for (std::size_t w = 8; w > 0; w /= 2)
        for (std::size_t i = 0; i < w; ++i) part[i] += part[i + w];
      a.scores[g * C + t] = dense_clamp_score(part[0]);
    }
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
    const V* v = static_cast<const V*>(a.value_rows[t]);
    dense_row_to_float(v, dv, vs, row);
    for (std::size_t g = 0; g < G; ++g) {
      const float w = a.scores[g * C + t];
      float* c = chunk + g * a.q_stride;
      for (std::size_t i = 0; i < vs; i += 16)
        for (std::size_t j = 0; j < 16; ++j) c[i + j] += w * row[i + j];
    }
  }
  for (std::size_t g = 0; g < G; ++g) {
    float* o = a.acc + g * a.acc_stride;
    const float* c = chunk + g * a.q_stride;
    for (std::size_t i = 0; i < dv; ++i) o[i] = o[i] * a.alpha[g] + c[i];
  }
}

}  // namespace scalar
}  // namespace certattn::detail
