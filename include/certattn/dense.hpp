// Exact attention over the cache: the baseline the certified call is timed against and its
// fallback when no level certifies. One pass over the keys and values of a KV head for all
// G query heads of its group, online softmax in fp32 (flash-decoding style), vectorised
// per ISA in arch/<isa>/dense_kernels.hpp and chosen at run time. A quantized cache
// (formats.hpp) is decoded in registers by the AVX-512 kernel; elsewhere a chunk of rows
// at a time is decoded into a float tile in L1, which the float kernel then reads.
#pragma once

#include <certattn/arch/avx2/dense_kernels.hpp>
#include <certattn/arch/avx512/dense_kernels.hpp>
#include <certattn/arch/dispatch.hpp>
#include <certattn/arch/portable.hpp>
#include <certattn/arch/scalar/dense_kernels.hpp>
#include <certattn/common.hpp>
#include <certattn/layout.hpp>
#include <certattn/variant.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <certattn/arch/macros.hpp>

namespace certattn {

/// The online-softmax state of one query over a range of tokens: m = max score, l = sum of
/// exp(s - m); the matching accumulator sum exp(s - m) v lives in a span beside it.
struct softmax_partial {
  float max_score = -std::numeric_limits<float>::infinity();
  float sum = 0.0f;
};

class dense_workspace;
namespace detail {
struct dense_workspace_access;
// Row pointers per call: a chunk, the prefetch distance after it, and the slack of one
// more chunk (units are appended whole).
inline constexpr std::size_t dense_rows_capacity = 2 * dense_chunk_tokens + dense_prefetch_rows;
}  // namespace detail

/// Caller-owned scratch of the dense kernels, sized once for up to `group` queries per KV
/// head, `head_dim` channels and `kv_heads` heads per call (kv_heads > 1 only for the
/// *_nhd_layer calls). Calls never allocate; one workspace per thread. After a call its
/// max-score and sum slots hold the final m and l of each query row (cmd_speed reads them
/// through detail::dense_workspace_access; dense_partial* return them properly).
class dense_workspace {
 public:
  dense_workspace() = default;
  dense_workspace(std::size_t group, std::size_t head_dim, std::size_t kv_heads = 1) {
    if (group == 0) throw error("dense_workspace: group must be > 0");
    if (head_dim == 0) throw error("dense_workspace: head_dim must be > 0");
    if (kv_heads == 0) throw error("dense_workspace: kv_heads must be > 0");
    group_ = group;
    head_dim_ = head_dim;
    kv_heads_ = kv_heads;
    const std::size_t rows = kv_heads * group, qs = detail::dense_round16(head_dim);
    // [rows][qs] queries | [group][chunk] scores | [rows] max | [rows] sums | [group] alpha
    // | [group + 1][qs] scalar kernel scratch; every part starts on a 64-byte boundary.
    off_scores_ = rows * qs;
    off_max_ = off_scores_ + group * detail::dense_chunk_tokens;
    off_sums_ = off_max_ + detail::dense_round16(rows);
    off_alpha_ = off_sums_ + detail::dense_round16(rows);
    off_chunk_acc_ = off_alpha_ + detail::dense_round16(group);
    off_tile_ = off_chunk_acc_ + detail::dense_round16((group + 1) * qs);
    floats_.assign(off_tile_ + 2 * detail::dense_chunk_tokens * qs + 16, 0.0f);
    rows_.assign(2 * detail::dense_rows_capacity, nullptr);
  }
  std::size_t group() const noexcept { return group_; }
  std::size_t head_dim() const noexcept { return head_dim_; }
  std::size_t kv_heads() const noexcept { return kv_heads_; }

 private:
  friend struct detail::dense_workspace_access;
  float* base() noexcept {  // floats_ aligned to 64 bytes (copies re-align themselves)
    const auto p = reinterpret_cast<std::uintptr_t>(floats_.data());
    return floats_.data() + ((64 - p % 64) % 64) / sizeof(float);
  }
  std::size_t group_ = 0, head_dim_ = 0, kv_heads_ = 0;
  std::size_t off_scores_ = 0, off_max_ = 0, off_sums_ = 0, off_alpha_ = 0, off_chunk_acc_ = 0;
  std::size_t off_tile_ = 0;  // [2][chunk][qs]: a chunk of a quantized cache's rows, decoded
  std::vector<float> floats_;
  std::vector<const void*> rows_;
};

inline dense_workspace make_dense_workspace(std::size_t group, std::size_t head_dim,
                                            std::size_t kv_heads = 1) {
  return dense_workspace(group, head_dim, kv_heads);
}

namespace detail {

struct dense_workspace_access {
  static float* queries(dense_workspace& w) { return w.base(); }
  static float* scores(dense_workspace& w) { return w.base() + w.off_scores_; }
  static float* max_scores(dense_workspace& w) { return w.base() + w.off_max_; }
  static float* sums(dense_workspace& w) { return w.base() + w.off_sums_; }
  static float* alpha(dense_workspace& w) { return w.base() + w.off_alpha_; }
  static float* chunk_acc(dense_workspace& w) { return w.base() + w.off_chunk_acc_; }
  static float* key_tile(dense_workspace& w) { return w.base() + w.off_tile_; }
  static float* value_tile(dense_workspace& w) {
    return w.base() + w.off_tile_ + dense_chunk_tokens * dense_round16(w.head_dim_);
  }
  static const void** key_rows(dense_workspace& w) { return w.rows_.data(); }
  static const void** value_rows(dense_workspace& w) {
    return w.rows_.data() + dense_rows_capacity;
  }
};

using dense_chunk_fn = void (*)(const dense_chunk_args&);

/// The AVX-512 kernel for key rows of type K and value rows of type V, at least one of them
/// quantized, where it is active, else null (the caller decodes rows into a float tile for
/// the float kernel).
template <class K, class V = K>
inline dense_chunk_fn select_quantized_dense_kernel() noexcept {
#if CERTATTN_X86
  if (active_isa() == isa::kAvx512Vnni) return &avx512::dense::dense_chunk<K, V>;
#endif
  return nullptr;
}

/// The chunk kernel for key rows of type K and value rows of type V on the ISA active now.
template <class K, class V = K>
inline dense_chunk_fn select_dense_kernel() noexcept {
#if CERTATTN_X86
  switch (active_isa()) {
    case isa::kAvx512Vnni:
      return &avx512::dense::dense_chunk<K, V>;
    case isa::kAvx2:
      return &avx2::dense::dense_chunk<K, V>;
    case isa::kScalar:
      break;
  }
#endif
#if CERTATTN_PORTABLE_SIMD
  return &portable::dense_chunk<K, V>;
#else
  return &scalar::dense_chunk<K, V>;
#endif
}

inline float dense_effective_scale(float softmax_scale, std::size_t head_dim) {
  if (!std::isfinite(softmax_scale) || softmax_scale < 0.0f)
    throw error("softmax_scale must be finite and >= 0 (0 = 1/sqrt(head_dim)), got " +
                std::to_string(softmax_scale));
  return softmax_scale > 0.0f ? softmax_scale : float(1.0 / std::sqrt(double(head_dim)));
}

inline void dense_check_size(std::size_t got, std::size_t want, const char* what,
                             const char* shape) {
  if (got != want)
    throw error(std::string(what) + " has " + std::to_string(got) + " elements, expected " + shape +
                " = " + std::to_string(want));
}

inline void dense_check_workspace(const dense_workspace& ws, std::size_t group,
                                  std::size_t head_dim, std::size_t kv_heads) {
  if (group > ws.group() || head_dim > ws.head_dim() || kv_heads > ws.kv_heads())
    throw error("ws: dense_workspace sized for group " + std::to_string(ws.group()) +
                ", head_dim " + std::to_string(ws.head_dim()) + ", kv_heads " +
                std::to_string(ws.kv_heads()) + " is too small for group " + std::to_string(group) +
                ", head_dim " + std::to_string(head_dim) + ", kv_heads " +
                std::to_string(kv_heads));
}

/// queries [rows][head_dim] -> dst [rows][dense_round16(head_dim)], times scale, zero
/// padded (the kernels read whole 16-lane blocks of query rows).
inline void dense_scale_queries(std::span<const float> queries, std::size_t rows,
                                std::size_t head_dim, float scale, float* dst) {
  const std::size_t qs = dense_round16(head_dim);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t i = 0; i < head_dim; ++i) {
      const float x = queries[r * head_dim + i];
      if (!std::isfinite(x))
        throw error("queries contains a NaN or Inf (row " + std::to_string(r) + ", element " +
                    std::to_string(i) + ")");
      dst[r * qs + i] = x * scale;
      if (!std::isfinite(dst[r * qs + i]))
        throw error("softmax_scale (" + std::to_string(scale) + ") times queries overflows " +
                    "float (row " + std::to_string(r) + ", element " + std::to_string(i) + ")");
    }
    for (std::size_t i = head_dim; i < qs; ++i) dst[r * qs + i] = 0.0f;
  }
}

/// Row pointers of tokens [t0, t0 + n) of a kv_view.
template <kv_view KV>
inline void dense_fill_rows(const KV& kv, std::size_t t0, std::size_t n, const void** keys,
                            const void** values) {
  for (std::size_t i = 0; i < n; ++i) {
    keys[i] = kv.key(t0 + i);
    values[i] = kv.value(t0 + i);
  }
}

/// The same for a paged cache, one block-table lookup per page instead of a division per
/// token (which cost ~15 ns per token, doubling the time of the G = 1 kernel). Within a
/// page paged_kv's rows are evenly spaced (its token_stride), so two rows give the rest.
template <cache_element K, cache_element V>
inline void dense_fill_rows(const paged_kv<K, V>& kv, std::size_t t0, std::size_t n,
                            const void** keys, const void** values) {
  const std::size_t page = kv.page_size(), end = t0 + n;
  for (std::size_t t = t0, i = 0; t < end;) {
    const std::size_t run = std::min(page - t % page, end - t);  // tokens left in this page
    const K* k = kv.key(t);
    const V* v = kv.value(t);
    const std::ptrdiff_t ks = run > 1 ? kv.key(t + 1) - k : 0;
    const std::ptrdiff_t vs = run > 1 ? kv.value(t + 1) - v : 0;
    for (std::size_t j = 0; j < run; ++j, ++i) {
      keys[i] = k + std::ptrdiff_t(j) * ks;
      values[i] = v + std::ptrdiff_t(j) * vs;
    }
    t += run;
  }
}

/// A prefix of a view reads its rows as the view does.
template <kv_view KV>
inline void dense_fill_rows(const kv_prefix<KV>& kv, std::size_t t0, std::size_t n,
                            const void** keys, const void** values) noexcept {
  dense_fill_rows(kv.base(), t0, n, keys, values);
}

/// Tokens [t0, t0 + n) of a quantized cache decoded into the tiles (rows `stride` floats
/// apart; a side stored as 16-bit or float elements is read in place), with their row
/// pointers; the stored rows of the next chunk (below `end`) are prefetched, so that they
/// arrive while this one is computed.
template <kv_view KV>
inline void dense_decode_rows(const KV& kv, std::size_t t0, std::size_t n, std::size_t end,
                              std::size_t stride, float* key_tile, float* value_tile,
                              const void** keys, const void** values) noexcept {
  const std::size_t kb = key_row_bytes(kv), vb = value_row_bytes(kv);
  for (std::size_t i = 0; i < n; ++i) {
    if (t0 + n + i < end) {
      const char* k = reinterpret_cast<const char*>(kv.key(t0 + n + i));
      const char* v = reinterpret_cast<const char*>(kv.value(t0 + n + i));
      for (std::size_t o = 0; o < kb; o += 64) __builtin_prefetch(k + o);
      for (std::size_t o = 0; o < vb; o += 64) __builtin_prefetch(v + o);
    }
    keys[i] = key_row(kv, t0 + i, key_tile + i * stride);
    values[i] = value_row(kv, t0 + i, value_tile + i * stride);
  }
}

/// Runs the kernel over `units` chunks in order. fill(u, keys, values) writes the row
/// pointers of unit u and returns its token count (1..dense_chunk_tokens); prepare(u, args)
/// points args at the unit's queries and state. Each call also gets the rows of the
/// following units up to the prefetch distance, which it prefetches; every unit is filled
/// once, its rows shifted to the front of the buffer when its turn comes.
template <class Fill, class Prepare>
inline void dense_run_units(std::size_t units, dense_chunk_args& args, dense_chunk_fn kernel,
                            dense_workspace& ws, Fill&& fill, Prepare&& prepare) {
  using A = dense_workspace_access;
  constexpr std::size_t cap = dense_rows_capacity;
  const void** keys = A::key_rows(ws);
  const void** values = A::value_rows(ws);
  args.key_rows = keys;
  args.value_rows = values;
  std::size_t sizes[cap];  // token counts of the filled units not yet run (a ring)
  std::size_t have = 0, next = 0, head = 0, queued = 0;
  for (std::size_t u = 0; u < units; ++u) {
    // Units hold >= 1 row and the buffer <= cap rows, so the ring cannot overflow.
    while (next < units && (queued == 0 || have < sizes[head] + args.prefetch_distance)) {
      const std::size_t n = fill(next++, keys + have, values + have);
      sizes[(head + queued++) % cap] = n;
      have += n;
    }
    const std::size_t n = sizes[head];
    std::size_t ahead = have;
    for (; ahead < dense_round16(n); ++ahead) keys[ahead] = keys[n - 1];
    args.n = n;
    args.rows_ahead = ahead;
    prepare(u, args);
    kernel(args);
    have -= n;
    std::copy(keys + n, keys + n + have, keys);
    std::copy(values + n, values + n + have, values);
    head = (head + 1) % cap;
    --queued;
  }
}

inline void dense_normalise(const float* acc, const float* sums, std::size_t rows,
                            std::size_t head_dim, float* out) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float inv = 1.0f / sums[r];  // >= 1: the max token contributes exp(0)
    for (std::size_t i = 0; i < head_dim; ++i) out[r * head_dim + i] = acc[r * head_dim + i] * inv;
  }
}

}  // namespace detail

/// Partial softmax state of `group` queries over tokens [begin, end) of kv, unnormalised:
/// per query m = max score, l = sum exp(s - m), acc = sum exp(s - m) v (scores s =
/// softmax_scale * q.k; softmax_scale 0 means 1/sqrt(head_dim)). An empty range gives
/// m = -inf, l = 0, acc = 0. queries [group][head_dim]; max_scores, sums [group];
/// acc [group][head_dim]. `variant` (variant.hpp, spans of `group` entries) modifies the
/// scores (soft-cap, position bias relative to token kv.size() - 1); its sliding window and
/// sinks are not applied here: the range is the caller's, and a sink joins the merged
/// state's sum (dense_attend() applies both).
template <kv_view KV>
void dense_partial(std::span<const float> queries, std::size_t group, const KV& kv,
                   float softmax_scale, std::size_t begin, std::size_t end,
                   std::span<float> max_scores, std::span<float> sums, std::span<float> acc,
                   dense_workspace& ws, const attention_variant& variant = {}) {
  using K = key_element_t<KV>;
  using V = value_element_t<KV>;
  using A = detail::dense_workspace_access;
  // A quantized cache without the AVX-512 kernel: rows decoded into a float tile.
  constexpr bool quantized = quantized_element<K> || quantized_element<V>;
  detail::dense_chunk_fn fused = nullptr;
  if constexpr (quantized) fused = detail::select_quantized_dense_kernel<K, V>();
  const bool decoded = quantized && fused == nullptr;
  const std::size_t d = kv.head_dim(), dv = value_dim_of(kv);
  if (group == 0) throw error("group must be > 0");
  if (begin > end)
    throw error("begin (" + std::to_string(begin) + ") > end (" + std::to_string(end) + ")");
  if (end > kv.size())
    throw error("end (" + std::to_string(end) + ") > kv.size() (" + std::to_string(kv.size()) +
                ")");
  detail::dense_check_size(queries.size(), group * d, "queries", "group * head_dim");
  detail::dense_check_size(max_scores.size(), group, "max_scores", "group");
  detail::dense_check_size(sums.size(), group, "sums", "group");
  detail::dense_check_size(acc.size(), group * dv, "acc", "group * value_dim");
  detail::dense_check_workspace(ws, group, d, 1);
  validate(variant, group, "variant");
  const float scale = detail::dense_effective_scale(softmax_scale, d);
  detail::dense_scale_queries(queries, group, d, scale, A::queries(ws));

  for (std::size_t g = 0; g < group; ++g) {
    max_scores[g] = -std::numeric_limits<float>::infinity();
    sums[g] = 0.0f;
  }
  for (float& x : acc) x = 0.0f;
  detail::dense_chunk_args args;
  args.queries = A::queries(ws);
  args.q_stride = detail::dense_round16(d);
  args.group = group;
  args.head_dim = d;
  args.value_dim = dv;
  args.scores = A::scores(ws);
  args.alpha = A::alpha(ws);
  args.chunk_acc = A::chunk_acc(ws);
  args.max_scores = max_scores.data();
  args.sums = sums.data();
  args.acc = acc.data();
  args.acc_stride = dv;
  // A decoded chunk lives in the tile until the kernel has read it: no rows ahead (the
  // fill prefetches the next chunk's stored rows instead).
  args.prefetch_distance = decoded ? 0 : detail::dense_prefetch_rows;
  if (fused != nullptr) {
    args.key_scale = key_scale_of(kv);
    args.value_scale = value_scale_of(kv);
  }
  args.softcap = float(variant.logit_softcap);
  args.slopes = variant.alibi_slopes.empty() ? nullptr : variant.alibi_slopes.data();
  const double newest = kv.size() > 0 ? double(kv.size() - 1) : 0.0;
  constexpr std::size_t C = detail::dense_chunk_tokens;
  const std::size_t tile_stride = detail::dense_round16(d);
  detail::dense_run_units((end - begin + C - 1) / C, args,
                          fused != nullptr ? fused : detail::select_dense_kernel<key_row_t<KV>, value_row_t<KV>>(), ws,
                          [&](std::size_t u, const void** keys, const void** values) {
                            const std::size_t t0 = begin + u * C, n = end - t0 < C ? end - t0 : C;
                            if constexpr (quantized)
                              if (decoded) {
                                detail::dense_decode_rows(kv, t0, n, end, tile_stride, A::key_tile(ws),
                                                          A::value_tile(ws), keys, values);
                                return n;
                              }
                            detail::dense_fill_rows(kv, t0, n, keys, values);
                            return n;
                          },
                          [&](std::size_t u, detail::dense_chunk_args& a) {
                            a.position = float(double(begin + u * C) - newest);
                          });
}

/// Exact attention of `group` queries (row-major [group][head_dim], not yet scaled) over
/// tokens [begin, min(end, kv.size())) of kv; writes the normalised outputs to out
/// [group][head_dim]. softmax_scale 0 means 1/sqrt(head_dim). `variant` (variant.hpp,
/// spans of `group` entries): the scores' soft-cap and position bias, the sliding window
/// (tokens before kv.size() - W are skipped) and the sinks (e^{z - m} joins each sum).
template <kv_view KV>
void dense_attend(std::span<const float> queries, std::size_t group, const KV& kv,
                  float softmax_scale, std::span<float> out, dense_workspace& ws,
                  std::size_t begin = 0, std::size_t end = SIZE_MAX,
                  const attention_variant& variant = {}) {
  using A = detail::dense_workspace_access;
  if (group == 0) throw error("group must be > 0");
  if (end == SIZE_MAX) end = kv.size();
  begin = std::max(begin, variant.first_token(kv.size()));
  if (begin >= end)
    throw error("begin (" + std::to_string(begin) + ") >= end (" + std::to_string(end) +
                "), after the sliding window: attention over an empty token range is undefined");
  const std::size_t dv = value_dim_of(kv);
  detail::dense_check_size(out.size(), group * dv, "out", "group * value_dim");
  detail::dense_check_workspace(ws, group, kv.head_dim(), 1);
  // The state lives in the workspace's head-0 slots and the accumulator in out itself.
  std::span<float> m(A::max_scores(ws), group), l(A::sums(ws), group);
  dense_partial(queries, group, kv, softmax_scale, begin, end, m, l, out, ws, variant);
  for (std::size_t g = 0; g < variant.sinks.size(); ++g)
    l[g] += std::exp(variant.sinks[g] - m[g]);  // +inf when the sink takes all: o = 0
  detail::dense_normalise(out.data(), l.data(), group, dv, out.data());
}

namespace detail {
/// Token t of kv joined in double to the softmax states (m, l, out: [rows][value_dim]) of
/// rows r0 .. r0 + group of a shared dense pass, from the scaled queries it left in the
/// workspace (qs, q_stride apart): the score in double, the variant's soft-cap, and its
/// position bias relative to token `newest`, as the pass's. A quantized row is decoded into
/// key_buf / value_buf. The multi-position and shared-prefix baselines join their own
/// tokens with it.
template <kv_view KV>
void join_token_double(const KV& kv, std::size_t t, std::size_t r0, std::size_t group,
                       const float* qs, std::size_t q_stride, const attention_variant& variant,
                       std::size_t newest, std::span<float> m, std::span<float> l,
                       std::span<float> out, float* key_buf, float* value_buf) {
  const std::size_t d = kv.head_dim(), dv = value_dim_of(kv);
  const auto* k = key_row(kv, t, key_buf);
  const auto* v = value_row(kv, t, value_buf);
  for (std::size_t g = 0; g < group; ++g) {
    const std::size_t r = r0 + g;
    double s = 0.0;
    for (std::size_t i = 0; i < d; ++i) s += double(qs[r * q_stride + i]) * to_double(k[i]);
    if (variant.logit_softcap > 0.0) s = variant.logit_softcap * std::tanh(s / variant.logit_softcap);
    if (!variant.alibi_slopes.empty())
      s += double(variant.alibi_slopes[g]) * (double(t) - double(newest));
    const double m_new = std::max(double(m[r]), s);
    const double keep = std::exp(double(m[r]) - m_new), w = std::exp(s - m_new);
    l[r] = float(double(l[r]) * keep + w);
    float* o = out.data() + r * dv;
    for (std::size_t i = 0; i < dv; ++i) o[i] = float(double(o[i]) * keep + w * to_double(v[i]));
    m[r] = float(m_new);
  }
}
}  // namespace detail

/// Exact attention of several query positions of one KV head, causally: position p
/// (0 <= p < positions) is the query of token n - positions + p (n = kv.size()) and attends
/// the tokens up to its own (speculative verification's shape; attend_positions()'s
/// baseline). One pass of the dense kernel over the tokens every position attends for all
/// positions * group queries, then each position's few others (the drafts before it, and
/// a sliding window's oldest tokens) joined to its state in double. queries
/// [positions][group][head_dim] (not yet scaled), out [positions][group][value_dim]; ws
/// sized for positions * group queries. `variant`: spans of `group` entries, applied to
/// every position as dense_attend() applies them to one (a position bias relative to the
/// position's own token).
template <kv_view KV>
void dense_attend_positions(std::span<const float> queries, std::size_t positions,
                            std::size_t group, const KV& kv, float softmax_scale,
                            std::span<float> out, dense_workspace& ws,
                            const attention_variant& variant = {}) {
  using A = detail::dense_workspace_access;
  constexpr std::size_t kMaxRows = 1024;  // the repeated slopes live on the stack
  const std::size_t n = kv.size(), d = kv.head_dim(), dv = value_dim_of(kv);
  const std::size_t Q = positions, G = group, rows = Q * G;
  if (group == 0) throw error("group must be > 0");
  if (positions == 0) throw error("positions must be > 0");
  if (positions > n)
    throw error("positions (" + std::to_string(positions) + ") exceeds kv.size() (" +
                std::to_string(n) + ")");
  if (rows > kMaxRows)
    throw error("positions * group (" + std::to_string(rows) + ") exceeds " +
                std::to_string(kMaxRows));
  detail::dense_check_size(queries.size(), rows * d, "queries", "positions * group * head_dim");
  detail::dense_check_size(out.size(), rows * dv, "out", "positions * group * value_dim");
  detail::dense_check_workspace(ws, rows, d, 1);
  validate(variant, group, "variant");
  // Every position attends [begin, shared_end): the newest one's first token on.
  const std::size_t shared_end = n - Q + 1, begin = variant.first_token(n);
  float slopes[kMaxRows];
  attention_variant scores_only;
  scores_only.logit_softcap = variant.logit_softcap;
  if (!variant.alibi_slopes.empty()) {
    for (std::size_t r = 0; r < rows; ++r) slopes[r] = variant.alibi_slopes[r % G];
    scores_only.alibi_slopes = std::span<const float>(slopes, rows);
  }
  std::span<float> m(A::max_scores(ws), rows), l(A::sums(ws), rows);
  dense_partial(queries, rows, kv, softmax_scale, std::min(begin, shared_end), shared_end, m, l,
                out, ws, scores_only);
  // The other tokens of each position, in double, from the scaled queries dense_partial
  // left in the workspace; a row of a quantized cache decoded into its (now free) tile.
  // The position bias is relative to token n - 1 for all: a constant per position, which
  // the softmax cancels.
  const float* qs = A::queries(ws);
  const std::size_t q_stride = detail::dense_round16(d);
  float* key_buf = A::key_tile(ws);
  float* value_buf = A::value_tile(ws);
  auto join = [&](std::size_t p, std::size_t t) {
    detail::join_token_double(kv, t, p * G, G, qs, q_stride, variant, n - 1, m, l, out, key_buf, value_buf);
  };
  for (std::size_t p = 0; p < Q; ++p) {
    const std::size_t n_p = shared_end + p, first_p = variant.first_token(n_p);
    for (std::size_t t = first_p; t < std::min(begin, n_p); ++t) join(p, t);
    for (std::size_t t = std::max(begin, shared_end); t < n_p; ++t) join(p, t);
  }
  // Position p's scores are the pass's plus slope (n - n_p): only its sink sees the shift.
  for (std::size_t r = 0; r < rows && !variant.sinks.empty(); ++r) {
    const std::size_t g = r % G, n_p = shared_end + r / G;
    const double shift =
        variant.alibi_slopes.empty() ? 0.0 : double(variant.alibi_slopes[g]) * double(n - n_p);
    l[r] = float(double(l[r]) + std::exp(double(variant.sinks[g]) - (double(m[r]) + shift)));
  }
  detail::dense_normalise(out.data(), l.data(), rows, dv, out.data());
}

/// Exact attention of several sequences that share a prefix (attend_sequences()'s
/// baseline): sequence s (views[s], group queries) attends all its tokens, of which the
/// first prefix_tokens are the same in every view. One pass of the dense kernel over the
/// shared tokens every sequence attends (views[0]'s rows) for all sequences * group
/// queries, then each sequence's own tokens (and a sliding window's shared tokens the
/// others no longer see) joined to its state in double. queries [sequences][group]
/// [head_dim] (not yet scaled), out [sequences][group][value_dim]; ws sized for
/// sequences * group queries. `variant`: spans of `group` entries, applied to every
/// sequence as dense_attend() applies them to one (a position bias relative to the
/// sequence's own newest token).
template <kv_view KV>
void dense_attend_sequences(std::span<const float> queries, std::size_t group,
                            std::span<const KV> views, std::size_t prefix_tokens,
                            float softmax_scale, std::span<float> out, dense_workspace& ws,
                            const attention_variant& variant = {}) {
  using A = detail::dense_workspace_access;
  constexpr std::size_t kMaxRows = 1024;  // the repeated slopes live on the stack
  const std::size_t S = views.size(), G = group, rows = S * G;
  if (S == 0) throw error("views must hold at least one sequence's view");
  if (group == 0) throw error("group must be > 0");
  if (rows > kMaxRows)
    throw error("sequences * group (" + std::to_string(rows) + ") exceeds " +
                std::to_string(kMaxRows));
  const std::size_t d = views[0].head_dim(), dv = value_dim_of(views[0]);
  std::size_t shared_end = prefix_tokens, begin = 0;
  for (std::size_t s = 0; s < S; ++s) {
    if (views[s].head_dim() != d || value_dim_of(views[s]) != dv)
      throw error("views[" + std::to_string(s) + "]: head_dim and value_dim must be views[0]'s");
    if (views[s].size() == 0) throw error("views[" + std::to_string(s) + "] is empty");
    if (prefix_tokens > views[s].size())
      throw error("prefix_tokens (" + std::to_string(prefix_tokens) + ") exceeds views[" +
                  std::to_string(s) + "].size() (" + std::to_string(views[s].size()) + ")");
    begin = std::max(begin, variant.first_token(views[s].size()));
  }
  detail::dense_check_size(queries.size(), rows * d, "queries", "sequences * group * head_dim");
  detail::dense_check_size(out.size(), rows * dv, "out", "sequences * group * value_dim");
  detail::dense_check_workspace(ws, rows, d, 1);
  validate(variant, group, "variant");
  const std::size_t n0 = views[0].size();
  float slopes[kMaxRows];
  attention_variant scores_only;
  scores_only.logit_softcap = variant.logit_softcap;
  if (!variant.alibi_slopes.empty()) {
    for (std::size_t r = 0; r < rows; ++r) slopes[r] = variant.alibi_slopes[r % G];
    scores_only.alibi_slopes = std::span<const float>(slopes, rows);
  }
  std::span<float> m(A::max_scores(ws), rows), l(A::sums(ws), rows);
  dense_partial(queries, rows, views[0], softmax_scale, std::min(begin, shared_end), shared_end, m,
                l, out, ws, scores_only);
  // The other tokens of each sequence, in double, from the scaled queries dense_partial
  // left in the workspace. The pass's position bias is relative to views[0]'s newest
  // token: sequence s's scores are the pass's plus slope (n0 - n_s) for every token, a
  // constant that the softmax cancels, so its own tokens join relative to n0 - 1 too and
  // only the sink sees the shift.
  const float* qs = A::queries(ws);
  const std::size_t q_stride = detail::dense_round16(d);
  float* key_buf = A::key_tile(ws);
  float* value_buf = A::value_tile(ws);
  auto join = [&](const KV& kv, std::size_t s, std::size_t t) {
    detail::join_token_double(kv, t, s * G, G, qs, q_stride, variant, n0 - 1, m, l, out, key_buf, value_buf);
  };
  for (std::size_t s = 0; s < S; ++s) {
    const std::size_t n_s = views[s].size(), first_s = variant.first_token(n_s);
    for (std::size_t t = first_s; t < std::min(begin, shared_end); ++t) join(views[s], s, t);
    for (std::size_t t = std::max(first_s, shared_end); t < n_s; ++t) join(views[s], s, t);
    for (std::size_t g = 0; g < G && !variant.sinks.empty(); ++g) {
      const std::size_t r = s * G + g;
      const double shift = variant.alibi_slopes.empty()
                               ? 0.0
                               : double(variant.alibi_slopes[g]) * (double(n0) - double(n_s));
      l[r] = float(double(l[r]) + std::exp(double(variant.sinks[g]) - (double(m[r]) + shift)));
    }
  }
  detail::dense_normalise(out.data(), l.data(), rows, dv, out.data());
}

/// The element types of a token-major layer call: 16-bit, float and double elements,
/// ggml's blocks (a llama.cpp q8_0 or q4_0 cache tensor, rows of kv_heads * head_dim / 32
/// blocks), and fp8 (vLLM's e4m3 / e5m2 cache with a scale pair per KV head: the
/// overloads that take `scales`).
template <class T>
concept nhd_layer_element = cache_element<T> || std::is_same_v<T, block_q8_0> ||
                            std::is_same_v<T, block_q4_0> || fp8_element<T>;

namespace detail {
/// dense_partial_nhd_layer() with an fp8 layer's scales ([kv_heads], checked; null for
/// every other format).
template <nhd_layer_element K, nhd_layer_element V>
void dense_partial_nhd_layer_scaled(std::span<const float> queries, std::size_t kv_heads,
                                    std::size_t group, const K* keys, const V* values,
                                    std::size_t n_tokens, std::size_t head_dim,
                                    float softmax_scale, const fp8_scales* scales,
                                    std::span<float> max_scores, std::span<float> sums,
                                    std::span<float> acc, dense_workspace& ws) {
  using A = detail::dense_workspace_access;
  if (kv_heads == 0) throw error("kv_heads must be > 0");
  if (group == 0) throw error("group must be > 0");
  if (head_dim == 0) throw error("head_dim must be > 0");
  if (n_tokens > 0 && (keys == nullptr || values == nullptr))
    throw error("keys and values must not be null");
  check_row_channels<K>(head_dim, "head_dim");
  check_row_channels<V>(head_dim, "head_dim");
  const std::size_t rows = kv_heads * group, qs = detail::dense_round16(head_dim);
  detail::dense_check_size(queries.size(), rows * head_dim, "queries",
                           "kv_heads * group * head_dim");
  detail::dense_check_size(max_scores.size(), rows, "max_scores", "kv_heads * group");
  detail::dense_check_size(sums.size(), rows, "sums", "kv_heads * group");
  detail::dense_check_size(acc.size(), rows * head_dim, "acc", "kv_heads * group * head_dim");
  detail::dense_check_workspace(ws, group, head_dim, kv_heads);
  const float scale = detail::dense_effective_scale(softmax_scale, head_dim);
  detail::dense_scale_queries(queries, rows, head_dim, scale, A::queries(ws));

  for (std::size_t r = 0; r < rows; ++r) {
    max_scores[r] = -std::numeric_limits<float>::infinity();
    sums[r] = 0.0f;
  }
  for (float& x : acc) x = 0.0f;
  detail::dense_chunk_args args;
  args.q_stride = qs;
  args.group = group;
  args.head_dim = head_dim;
  args.value_dim = head_dim;
  args.scores = A::scores(ws);
  args.alpha = A::alpha(ws);
  args.chunk_acc = A::chunk_acc(ws);
  args.acc_stride = head_dim;
  // A block format without the AVX-512 kernel: each head's rows decoded into the float
  // tile, one unit at a time (as dense_partial does).
  constexpr bool quantized = quantized_element<K> || quantized_element<V>;
  detail::dense_chunk_fn kernel = nullptr;
  if constexpr (quantized) kernel = detail::select_quantized_dense_kernel<K, V>();
  const bool decoded = quantized && kernel == nullptr;
  if (kernel == nullptr)
    kernel = detail::select_dense_kernel<std::conditional_t<cache_element<K>, K, float>,
                                         std::conditional_t<cache_element<V>, V, float>>();
  args.prefetch_distance = decoded ? 0 : detail::dense_prefetch_rows;
  // Units run chunk-major: every head of a chunk of tokens, then the next chunk, so each
  // token row ([kv_heads][head_dim], contiguous) is fetched from memory once.
  constexpr std::size_t C = detail::dense_chunk_tokens;
  // Elements or blocks per head, and per token row, of the keys and of the values.
  const std::size_t kunit = format_traits<K>::units(head_dim), vunit = format_traits<V>::units(head_dim);
  const std::size_t krow = kv_heads * kunit, vrow = kv_heads * vunit;
  const std::size_t chunks = (n_tokens + C - 1) / C, tile_stride = qs;
  float* q_scaled = A::queries(ws);
  detail::dense_run_units(
      chunks * kv_heads, args, kernel, ws,
      [&](std::size_t u, const void** krows, const void** vrows) {
        const std::size_t t0 = (u / kv_heads) * C, h = u % kv_heads;
        const std::size_t n = n_tokens - t0 < C ? n_tokens - t0 : C;
        if constexpr (quantized)
          if (decoded) {
            const auto view = nhd_view(keys, values, n_tokens, kv_heads, head_dim, h);
            if constexpr (fp8_element<K> || fp8_element<V>)
              detail::dense_decode_rows(view.with_scales(scales[h]), t0, n, n_tokens, tile_stride,
                                        A::key_tile(ws), A::value_tile(ws), krows, vrows);
            else
              detail::dense_decode_rows(view, t0, n, n_tokens, tile_stride, A::key_tile(ws),
                                        A::value_tile(ws), krows, vrows);
            return n;
          }
        const K* k = keys + t0 * krow + h * kunit;
        const V* v = values + t0 * vrow + h * vunit;
        for (std::size_t i = 0; i < n; ++i) {
          krows[i] = k + i * krow;
          vrows[i] = v + i * vrow;
        }
        return n;
      },
      [&](std::size_t u, detail::dense_chunk_args& a) {
        const std::size_t h = u % kv_heads;
        a.queries = q_scaled + h * group * qs;
        a.max_scores = max_scores.data() + h * group;
        a.sums = sums.data() + h * group;
        a.acc = acc.data() + h * group * head_dim;
        if constexpr (fp8_element<K> || fp8_element<V>) {
          a.key_scale = scales[h].key;
          a.value_scale = scales[h].value;
        }
      });
}

/// An fp8 layer's scales, one pair per KV head, each finite and > 0 (the error names the
/// pair and the part; nothing allocated when they are).
inline void check_layer_scales(std::span<const fp8_scales> scales, std::size_t kv_heads) {
  dense_check_size(scales.size(), kv_heads, "scales", "kv_heads");
  auto ok = [](float s) { return s > 0.0f && s <= std::numeric_limits<float>::max(); };
  for (std::size_t h = 0; h < kv_heads; ++h)
    for (const bool key : {true, false}) {
      const float s = key ? scales[h].key : scales[h].value;
      if (!ok(s))
        check_cache_scale(s, ("scales[" + std::to_string(h) + (key ? "].key" : "].value")).c_str());
    }
}
}  // namespace detail

/// Partial softmax state (as dense_partial) of all KV heads of one layer of a token-major
/// cache ([token][kv_heads][head_dim], llama.cpp's layout) over its tokens [0, n_tokens),
/// in one pass over the rows: per chunk of tokens every head is processed while the chunk
/// is in cache, instead of one pass per head striding a whole token row per token. Split
/// the tokens between threads (flash-decoding's split-K) by offsetting keys and values
/// (by token rows: kv_heads * head_dim elements, or kv_heads * head_dim / 32 blocks) and
/// merging the states. queries and acc [kv_heads][group][head_dim]; max_scores and sums
/// [kv_heads][group]; ws sized for (group, head_dim, kv_heads).
/// Keys and values may differ in format (keys K, values V: llama.cpp's -ctk q8_0 with f16
/// values), each row of kv_heads * head_dim channels in its own units.
template <nhd_layer_element K, nhd_layer_element V>
  requires(!fp8_element<K> && !fp8_element<V>)
void dense_partial_nhd_layer(std::span<const float> queries, std::size_t kv_heads,
                             std::size_t group, const K* keys, const V* values,
                             std::size_t n_tokens, std::size_t head_dim, float softmax_scale,
                             std::span<float> max_scores, std::span<float> sums,
                             std::span<float> acc, dense_workspace& ws) {
  detail::dense_partial_nhd_layer_scaled<K, V>(queries, kv_heads, group, keys, values, n_tokens,
                                            head_dim, softmax_scale, nullptr, max_scores, sums,
                                            acc, ws);
}

/// The same for an fp8 layer (vLLM's cache with kv_cache_dtype fp8): scales[h] is KV head
/// h's pair (k_scale, v_scale), finite and > 0; a channel is fl(scale * code).
template <fp8_element T>
void dense_partial_nhd_layer(std::span<const float> queries, std::size_t kv_heads,
                             std::size_t group, const T* keys, const T* values,
                             std::size_t n_tokens, std::size_t head_dim, float softmax_scale,
                             std::span<const fp8_scales> scales, std::span<float> max_scores,
                             std::span<float> sums, std::span<float> acc, dense_workspace& ws) {
  detail::check_layer_scales(scales, kv_heads);
  detail::dense_partial_nhd_layer_scaled<T, T>(queries, kv_heads, group, keys, values, n_tokens,
                                            head_dim, softmax_scale, scales.data(), max_scores,
                                            sums, acc, ws);
}

namespace detail {
template <nhd_layer_element K, nhd_layer_element V>
void dense_attend_nhd_layer_scaled(std::span<const float> queries, std::size_t kv_heads,
                                   std::size_t group, const K* keys, const V* values,
                                   std::size_t n_tokens, std::size_t head_dim,
                                   float softmax_scale, const fp8_scales* scales,
                                   std::span<float> out, dense_workspace& ws) {
  using A = detail::dense_workspace_access;
  if (kv_heads == 0) throw error("kv_heads must be > 0");
  if (group == 0) throw error("group must be > 0");
  if (head_dim == 0) throw error("head_dim must be > 0");
  if (n_tokens == 0) throw error("n_tokens must be > 0: attention over no tokens is undefined");
  check_row_channels<K>(head_dim, "head_dim");
  check_row_channels<V>(head_dim, "head_dim");
  detail::dense_check_size(queries.size(), kv_heads * group * head_dim, "queries",
                           "kv_heads * group * head_dim");
  detail::dense_check_size(out.size(), kv_heads * group * head_dim, "out",
                           "kv_heads * group * head_dim");
  detail::dense_check_workspace(ws, group, head_dim, kv_heads);
  const std::size_t rows = kv_heads * group;
  std::span<float> m(A::max_scores(ws), rows), l(A::sums(ws), rows);
  dense_partial_nhd_layer_scaled<K, V>(queries, kv_heads, group, keys, values, n_tokens, head_dim,
                                       softmax_scale, scales, m, l, out, ws);
  detail::dense_normalise(out.data(), l.data(), rows, head_dim, out.data());
}
}  // namespace detail

/// Exact attention for all KV heads of one layer of a token-major cache in one pass over
/// its rows (see dense_partial_nhd_layer). queries and out [kv_heads][group][head_dim].
/// On return the workspace also holds each row's max score and sum (its max-score and sum
/// slots, [kv_heads][group]), as dense_partial_nhd_layer would return them.
/// Keys and values may differ in format, as in dense_partial_nhd_layer().
template <nhd_layer_element K, nhd_layer_element V>
  requires(!fp8_element<K> && !fp8_element<V>)
void dense_attend_nhd_layer(std::span<const float> queries, std::size_t kv_heads, std::size_t group,
                            const K* keys, const V* values, std::size_t n_tokens,
                            std::size_t head_dim, float softmax_scale, std::span<float> out,
                            dense_workspace& ws) {
  detail::dense_attend_nhd_layer_scaled<K, V>(queries, kv_heads, group, keys, values, n_tokens,
                                           head_dim, softmax_scale, nullptr, out, ws);
}

/// The same for an fp8 layer: scales[h] is KV head h's (k_scale, v_scale), finite, > 0.
template <fp8_element T>
void dense_attend_nhd_layer(std::span<const float> queries, std::size_t kv_heads, std::size_t group,
                            const T* keys, const T* values, std::size_t n_tokens,
                            std::size_t head_dim, float softmax_scale,
                            std::span<const fp8_scales> scales, std::span<float> out,
                            dense_workspace& ws) {
  detail::check_layer_scales(scales, kv_heads);
  detail::dense_attend_nhd_layer_scaled<T, T>(queries, kv_heads, group, keys, values, n_tokens,
                                           head_dim, softmax_scale, scales.data(), out, ws);
}

}  // namespace certattn

#include <certattn/arch/macros_undef.hpp>
