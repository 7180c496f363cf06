// The key index of one (layer, KV head): 4-bit key codes laid out for VNNI, the low
// nibbles of nested 8-bit codes for refinement, per-block per-channel scales, and the
// value-norm bounds the certificate needs. Built once after prefill, appended one token
// per decoding step. Read-only during certified calls, so calls on several query heads
// may share it concurrently.
#pragma once

#include <certattn/arch/avx512/encode_kernels.hpp>
#include <certattn/arch/dispatch.hpp>
#include <certattn/arch/scan_prep.hpp>
#include <certattn/arch/score_dot.hpp>
#include <certattn/common.hpp>
#include <certattn/layout.hpp>
#include <certattn/memory.hpp>
#include <certattn/value_bounds.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <certattn/arch/macros.hpp>

namespace certattn {

/// Codes: per block of kBlockTokens tokens and per channel, an offset lo and a step st4;
/// with st8 = st4 / 16 (exact), k = lo + st (q + f), f in [0, 1], for the code q (4-bit:
/// 0..15, 8-bit: 0..255). The codes are nested: the 4-bit code is the 8-bit code's high
/// nibble (q8 = 16 q4 + low), so the index stores the 4-bit codes for the scan and only
/// the low nibbles for refinement, token-major (padded_dim / 2 bytes: one 64-byte line per
/// token at head_dim 128; byte j holds channel 2j in its low nibble, 2j + 1 in its high).
/// A refinement adds the low nibbles' dot to the scan's own bound of the high nibbles'
/// (docs/fast-path.md, "Nested 8-bit codes").
/// 4-bit layout (for _mm512_dpbusd_epi32, FBGEMM's ROW_INTERLEAVE 4): a block is 8 groups
/// of 16 tokens; a group holds, per channel octet o, 64 bytes: byte 4*lane + j =
/// code[token lane][8o + j] | code[token lane][8o + 4 + j] << 4. One 64-byte load thus
/// gives, per 32-bit lane (one token), 4 channels in the low nibbles and the next 4 in the
/// high nibbles: two dpbusd per query per load, no horizontal sums.
class key_index {
 public:
  static constexpr std::size_t kBlockTokens = detail::kBlockTokens;
  static constexpr std::size_t kGroupTokens = detail::kGroupTokens;
  static constexpr std::size_t kGroupsPerBlock = detail::kGroupsPerBlock;

  key_index() = default;
  /// value_dim: the channels of the cache's value rows, for reserve() (0: head_dim; a
  /// latent cache's are fewer, latent_kv in layout.hpp); build() takes the view's.
  explicit key_index(std::size_t head_dim, std::size_t value_dim = 0)
      : d_(head_dim), dv_(value_dim == 0 ? head_dim : value_dim), dp_((head_dim + 7) / 8 * 8) {
    if (head_dim == 0) throw error("head_dim must be > 0");
    if (dv_ > head_dim)
      throw error("value_dim (" + std::to_string(dv_) + ") > head_dim (" + std::to_string(head_dim) +
                  "): a latent cache's values are a prefix of its key rows");
  }

  std::size_t head_dim() const noexcept { return d_; }
  /// The channels of the value rows (the value centre's length).
  std::size_t value_dim() const noexcept { return dv_; }
  /// head_dim rounded up to a multiple of 8 (padded channels have lo = st = 0, code 0).
  std::size_t padded_dim() const noexcept { return dp_; }
  std::size_t size() const noexcept { return n_; }
  std::size_t blocks() const noexcept { return (n_ + kBlockTokens - 1) / kBlockTokens; }

  /// When the value bounds (centre, distances, cap, reach floor) are recomputed.
  ///   kOnDoubling  inside append(), whenever the cache has doubled since they were fixed
  ///                (and at 256 tokens): amortised O(head_dim) per append, but the append
  ///                that triggers it re-reads every value (O(n head_dim)).
  ///   kManual      never inside append(): the engine calls refresh() when it chooses (off
  ///                the decode's critical path, or never). append() then costs at most
  ///                O(head_dim) plus one block re-encode (128 tokens) in the worst case.
  /// Any bounds are valid for the certificate (they are functions of the cache); fresher
  /// ones fit the values better, so the certified call reads fewer keys.
  enum class refresh_policy { kOnDoubling, kManual };
  void set_refresh_policy(refresh_policy p) noexcept { policy_ = p; }
  refresh_policy get_refresh_policy() const noexcept { return policy_; }

  /// Reserves room for `tokens` tokens so that build(), append(), append_range() and
  /// refresh() up to there never allocate.
  void reserve(std::size_t tokens) {
    const std::size_t nb = (tokens + kBlockTokens - 1) / kBlockTokens;
    codes4_.reserve(nb * block_code4_bytes());
    low8_.reserve(nb * kBlockTokens * dp_ / 2);
    rho_.reserve(nb * kBlockTokens);
    scales_.reserve(nb * kScaleRows * dp_);
    dist_.reserve(nb * kBlockTokens);
    offset_up_.reserve(nb * kBlockTokens);
    block_prefix_max_.reserve(nb);
    block_prefix_max_all_.reserve(nb);
    exact_.reserve(tokens);
    overflow_.reserve(tokens);
    sort_.reserve(nb * kBlockTokens);
    rows_.reserve(kBlockTokens * d_);
    for (auto* v : {&row_, &mins_, &maxs_, &check_}) v->reserve(d_);
    inv4_.reserve(dp_);
    inv8_.reserve(dp_);
    s8_.reserve(dp_);
    q8_.reserve(dp_);
    acc_.reserve(dv_);
    center_.reserve(dv_);
  }

  /// Indexes every token of kv (after prefill) and fixes the value bounds (centre g, cap,
  /// exact set) from the values present now. Throws certattn::error on NaN/Inf in keys or
  /// values.
  template <kv_view KV>
  void build(const KV& kv) {
    check_dim(kv, /*building=*/true);
    // Check every row first: a build that throws leaves the index as it was.
    const std::size_t n = kv.size();
    float kmax = 0.0f;
    for (std::size_t t = 0; t < n; ++t) kmax = std::max(kmax, check_row(kv, t));
    n_ = 0;
    codes4_.clear();
    low8_.clear();
    rho_.clear();
    scales_.clear();
    max_abs_key_ = kmax;
    built_ = true;
    format_ = format_traits<key_element_t<KV>>::format;
    value_format_ = format_traits<value_element_t<KV>>::format;
    key_scale_ = key_scale_of(kv);
    value_scale_ = value_scale_of(kv);
    dv_ = value_dim_of(kv);
    const std::size_t nb = (n + kBlockTokens - 1) / kBlockTokens;
    resize_blocks(nb);
    n_ = n;
    for (std::size_t b = 0; b < nb; ++b) encode_block(kv, b);
    refresh_value_bounds(kv);
  }

  /// Indexes token `position` (== size()) of kv, the token the engine just wrote. The
  /// tail block is partly filled: a new token that fits its current code ranges is
  /// encoded alone; one that widens a range re-encodes the block's tokens from kv. The
  /// value bounds are recomputed whenever the cache has doubled since they were fixed
  /// (amortised O(head_dim) per append), so that a short prefill does not fix them for good.
  template <kv_view KV>
  void append(const KV& kv, std::size_t position) {
    check_dim(kv);
    if (!built_) throw error("key_index::append: build() must be called first");
    if (position != n_)
      throw error("append position (" + std::to_string(position) +
                  ") must equal the index size (" + std::to_string(n_) + ")");
    if (kv.size() <= position)
      throw error("append position (" + std::to_string(position) + ") >= kv.size() (" +
                  std::to_string(kv.size()) + ")");
    max_abs_key_ = std::max(max_abs_key_, check_row(kv, position));
    const std::size_t b = position / kBlockTokens, tb = position % kBlockTokens;
    if (tb == 0) resize_blocks(b + 1);
    n_ = position + 1;
    row_.resize(d_);
    load_key(kv, position, row_.data());
    if (tb == kBlockTokens - 1)
      encode_block(kv, b);  // the block is full: exact ranges, tightest bounds
    else if (tb == 0 || !fits_block(row_.data(), b))
      encode_block(kv, b, /*headroom=*/true);
    else
      encode_token(row_.data(), b, tb);
    if (policy_ == refresh_policy::kOnDoubling && n_ >= next_refresh_) {
      refresh_value_bounds(kv);
      return;
    }
    dist_.resize(blocks() * kBlockTokens, 0.0f);
    offset_up_.resize(blocks() * kBlockTokens, 0.0f);
    check_.resize(d_);
    detail::value_to_float(kv, position, check_.data());
    dist_[position] = value_distance_bound(check_.data(), center_, dv_);
    offset_up_[position] = sampling_offset_upper(dist_[position], reach_floor_);
    if (dist_[position] > cap_) exact_.push_back(std::uint32_t(position));
    if (!std::isfinite(dist_[position])) overflow_.push_back(std::uint32_t(position));
    update_block_max(b);
  }

  /// Indexes tokens [first, first + count) of kv (first == size()): a chunk of prefill or
  /// the accepted tokens of a speculative draft. The same index as `count` append()s.
  template <kv_view KV>
  void append_range(const KV& kv, std::size_t first, std::size_t count) {
    if (first != n_)
      throw error("append_range first (" + std::to_string(first) +
                  ") must equal the index size (" + std::to_string(n_) + ")");
    if (count > kv.size() || first > kv.size() - count)
      throw error("append_range: first + count (" + std::to_string(first) + " + " +
                  std::to_string(count) + ") > kv.size() (" + std::to_string(kv.size()) + ")");
    for (std::size_t t = first; t < first + count; ++t) append(kv, t);
  }

  /// Forgets tokens [n, size()): the rollback of rejected draft tokens, before the engine
  /// writes other tokens at those positions. The key codes become bit-identical to build()
  /// on the first n tokens (the tail block is re-encoded from kv with its exact ranges:
  /// O(128 head_dim) at most, plus O(tokens removed)); the value bounds (centre, cap,
  /// reach floor) stay those fixed before, which are valid for any cache (refresh()
  /// recomputes them). Does not allocate.
  template <kv_view KV>
  void truncate(const KV& kv, std::size_t n) {
    check_dim(kv);
    if (!built_) throw error("key_index::truncate: build() must be called first");
    if (n > n_)
      throw error("truncate: n (" + std::to_string(n) + ") > index size (" + std::to_string(n_) +
                  ")");
    if (kv.size() < n)
      throw error("truncate: kv.size() (" + std::to_string(kv.size()) + ") < n (" +
                  std::to_string(n) + ")");
    if (n == n_) return;
    n_ = n;
    const std::size_t nb = blocks(), padded = nb * kBlockTokens;
    resize_blocks(nb);
    std::fill(dist_.begin() + std::ptrdiff_t(std::min(n, dist_.size())), dist_.end(), 0.0f);
    std::fill(offset_up_.begin() + std::ptrdiff_t(std::min(n, offset_up_.size())), offset_up_.end(),
              0.0f);
    dist_.resize(padded, 0.0f);
    offset_up_.resize(padded, 0.0f);
    auto drop_from = [n](std::vector<std::uint32_t>& list) {
      list.resize(std::size_t(std::lower_bound(list.begin(), list.end(), std::uint32_t(n)) -
                              list.begin()));
    };
    drop_from(exact_);
    drop_from(overflow_);
    if (nb == 0) return;
    // The tail block as build() encodes it: exact ranges over its remaining tokens, and
    // no residual bytes past them.
    std::fill(rho_.begin() + std::ptrdiff_t(n), rho_.begin() + std::ptrdiff_t(padded), std::uint8_t(0));
    if (n % kBlockTokens != 0) encode_block(kv, nb - 1);
    update_block_max(nb - 1);
  }

  /// Recomputes the value bounds from every value now in the cache (what append() does by
  /// itself under refresh_policy::kOnDoubling): O(n head_dim).
  template <kv_view KV>
  void refresh(const KV& kv) {
    check_dim(kv);
    if (!built_) throw error("key_index::refresh: build() must be called first");
    if (kv.size() < n_)
      throw error("refresh: kv.size() (" + std::to_string(kv.size()) + ") < index size (" +
                  std::to_string(n_) + ")");
    refresh_value_bounds(kv);
  }

  // ---- read access for the kernels -------------------------------------------------
  std::size_t block_code4_bytes() const noexcept { return kBlockTokens * dp_ / 2; }
  const std::uint8_t* block_codes4(std::size_t b) const noexcept {
    return codes4_.data() + b * block_code4_bytes();
  }
  /// Rows of per-channel scales per block: the offset lo and the 4-bit step st4 (the
  /// 8-bit step is st4 / 16).
  static constexpr std::size_t kScaleRows = 2;
  const float* block_lo(std::size_t b) const noexcept {
    return scales_.data() + b * kScaleRows * dp_;
  }
  const float* block_step4(std::size_t b) const noexcept { return block_lo(b) + dp_; }
  /// Per-token residual norms ||f - 1/2|| of the 4-bit codes, in bytes of
  /// detail::rho_step(padded_dim) rounded up (the Cauchy-Schwarz term of the scan).
  const std::uint8_t* block_rho(std::size_t b) const noexcept {
    return rho_.data() + b * kBlockTokens;
  }
  /// Bytes of a token's refinement row: the low nibbles of its 8-bit codes.
  std::size_t low8_bytes() const noexcept { return dp_ / 2; }
  /// Token t's refinement row (low nibbles of the 8-bit codes, two channels per byte).
  const std::uint8_t* codes8_low(std::size_t token) const noexcept {
    return low8_.data() + token * low8_bytes();
  }
  /// The 8-bit code of (token, channel): 16 code4 + its low nibble (for tests).
  unsigned code8(std::size_t token, std::size_t ch) const noexcept {
    const std::uint8_t byte = codes8_low(token)[ch / 2];
    return code4(token, ch) * 16u + ((ch & 1) ? (byte >> 4) : (byte & 0xF));
  }
  /// The 4-bit code of (token, channel), decoded from the interleaved layout (for tests).
  unsigned code4(std::size_t token, std::size_t ch) const noexcept {
    const std::size_t b = token / kBlockTokens, tb = token % kBlockTokens;
    const std::size_t g = tb / kGroupTokens, lane = tb % kGroupTokens;
    const std::size_t o = ch / 8, j = ch % 8;
    const std::uint8_t byte =
        block_codes4(b)[(g * (dp_ / 8) + o) * 64 + lane * 4 + (j & 3)];
    return j < 4 ? (byte & 0xF) : (byte >> 4);
  }

  /// The centre g of the value bound.
  std::span<const float> value_center() const noexcept { return center_; }
  /// Tokens with ||v - g|| above this cap form the exact set (see value_bounds.hpp).
  float value_cap() const noexcept { return cap_; }
  /// The exact set, in increasing token order.
  std::span<const std::uint32_t> exact_tokens() const noexcept { return exact_; }
  /// max ||v_t - g|| over t < pool_end outside the exact set, rounded up:
  /// R(c0) = base + ||g - c0|| bounds the pool's ||v_i - c0||.
  double value_radius_base(std::size_t pool_end) const noexcept {
    return prefix_max(pool_end, block_prefix_max_, [this](float x) { return x <= cap_; });
  }

  /// The reach floor rho_bar of value-aware sampling (value_bounds.hpp): the median of the
  /// distances ||v - g|| when the value bounds were fixed.
  float reach_floor() const noexcept { return reach_floor_; }
  /// ||v_t - g|| rounded up to float, for every indexed token t.
  float value_distance(std::size_t t) const noexcept { return dist_[t]; }
  const float* value_distances() const noexcept { return dist_.data(); }
  /// Per token, the float at or above ln(rho_t / rho_bar) (sampling_offset_upper()).
  const float* sampling_offsets_upper() const noexcept { return offset_up_.data(); }
  /// Tokens whose ||v - g|| overflowed float (values beyond float's range), in increasing
  /// order: the tight certificate reads them exactly (the classic one's exact set holds
  /// them too).
  std::span<const std::uint32_t> overflow_tokens() const noexcept { return overflow_; }
  /// max ||v_t - g|| over every t < pool_end whose distance is finite (exact set included).
  double value_distance_max(std::size_t pool_end) const noexcept {
    return prefix_max(pool_end, block_prefix_max_all_, [](float x) { return std::isfinite(x); });
  }

  /// max |k| over every indexed key element: the certified call checks with it that the
  /// scores stay within the range its float bounds can represent.
  float max_abs_key() const noexcept { return max_abs_key_; }

  /// Bytes held by the index (capacity excluded).
  std::size_t memory_bytes() const noexcept {
    return codes4_.size() + low8_.size() + rho_.size() +
           sizeof(float) * (scales_.size() + dist_.size() + offset_up_.size() +
                            block_prefix_max_.size() + block_prefix_max_all_.size() +
                            center_.size()) +
           sizeof(std::uint32_t) * (exact_.size() + overflow_.size());
  }

 private:
  /// The view's dimensions against the index's: head_dim always, value_dim except when
  /// a build fixes it.
  template <kv_view KV>
  void check_dim(const KV& kv, bool building = false) const {
    if (d_ == 0) throw error("key_index: default-constructed (head_dim 0)");
    if (kv.head_dim() != d_)
      throw error("kv.head_dim() (" + std::to_string(kv.head_dim()) +
                  ") != key_index head_dim (" + std::to_string(d_) + ")");
    const std::size_t dv = value_dim_of(kv);
    if (dv == 0 || dv > d_)
      throw error("kv's value_dim (" + std::to_string(dv) + ") must lie in [1, head_dim = " +
                  std::to_string(d_) + "]");
    if (!building && dv != dv_)
      throw error("kv's value_dim (" + std::to_string(dv) + ") != the value_dim the index was built with (" +
                  std::to_string(dv_) + ")");
    if (!building && built_) check_format(kv);
  }
 public:
  /// Throws unless kv stores the format (and the fp8 scales) this index was built from:
  /// its bounds hold for those numbers only.
  template <kv_view KV>
  void check_format(const KV& kv) const {
    if (!built_) return;
    const cache_format f = format_traits<key_element_t<KV>>::format;
    const cache_format vf = format_traits<value_element_t<KV>>::format;
    if (f != format_)
      throw error("kv: a " + std::string(to_string(f)) + " cache, but the key index was built from a " +
                  std::string(to_string(format_)) + " cache");
    if (vf != value_format_)
      throw error("kv: " + std::string(to_string(vf)) + " values, but the key index was built from " +
                  std::string(to_string(value_format_)) + " values");
    if (key_scale_of(kv) != key_scale_ || value_scale_of(kv) != value_scale_)
      throw error("kv: scales (key " + std::to_string(key_scale_of(kv)) + ", value " +
                  std::to_string(value_scale_of(kv)) + ") differ from those the key index was built with (" +
                  std::to_string(key_scale_) + ", " + std::to_string(value_scale_) + ")");
  }
  /// The cache format the index was built from.
  cache_format format() const noexcept { return format_; }
  /// The format of the values it was built from (the keys' unless they differ).
  cache_format value_format() const noexcept { return value_format_; }

 private:
  /// Throws on a NaN or Inf in token t's key or value; returns max |k| of its key.
  template <kv_view KV>
  float check_row(const KV& kv, std::size_t t) {
    check_.resize(d_);
    detail::key_to_float(kv, t, check_.data());
    float kmax = 0.0f;
    for (std::size_t i = 0; i < d_; ++i) {
      if (!std::isfinite(check_[i]))
        throw error("keys: token " + std::to_string(t) + " has a NaN or Inf");
      kmax = std::max(kmax, std::fabs(check_[i]));
    }
    const std::size_t dv = value_dim_of(kv);  // a build checks before it fixes dv_
    detail::value_to_float(kv, t, check_.data());
    for (std::size_t i = 0; i < dv; ++i)
      if (!std::isfinite(check_[i]))
        throw error("values: token " + std::to_string(t) + " has a NaN or Inf");
    return kmax;
  }

  void resize_blocks(std::size_t nb) {
    codes4_.resize(nb * block_code4_bytes(), 0);
    low8_.resize(nb * kBlockTokens * low8_bytes(), 0);
    rho_.resize(nb * kBlockTokens, 0);
    scales_.resize(nb * kScaleRows * dp_, 0.0f);
    block_prefix_max_.resize(nb, 0.0f);
    block_prefix_max_all_.resize(nb, 0.0f);
  }

  /// The largest q in [0, qmax] with lo + st q <= k; then k <= lo + st (q + 1) as
  /// st >= range / qmax. The guess uses a reciprocal; the loops check the invariant in
  /// double, where lo + st q is exact up to 2^-53.
  static unsigned quantize(double k, double lo, double st, double inv, unsigned qmax) noexcept {
    if (!(st > 0.0)) return 0;
    // Truncation is floor here (clamped at 0 first): no libm floor() call per channel.
    const double qd = std::min((k - lo) * inv, double(qmax));
    unsigned q = qd > 0.0 ? unsigned(qd) : 0u;
    // The guess is within one of the answer (the reciprocal and the product err by a few
    // 2^-53): one step each way settles it; the loops only guard the invariant.
    while (q > 0 && lo + st * q > k) --q;
    while (q < qmax && lo + st * (q + 1) < k) ++q;
    return q;
  }

  /// The key row of token t as floats (exact), into out[0, head_dim).
  template <kv_view KV>
  void load_key(const KV& kv, std::size_t t, float* out) const noexcept {
    detail::key_to_float(kv, t, out);
  }

  /// Within block b's range [lo, lo + 255 st8] (= lo + 15.9375 st4) in every channel.
  bool fits_block(const float* x, std::size_t b) const noexcept {
    const float* lo = block_lo(b);
    const float* s4 = block_step4(b);
    for (std::size_t i = 0; i < d_; ++i) {
      const double v = double(x[i]);
      if (v < double(lo[i]) || v > double(lo[i]) + 255.0 * double(detail::step8_of(s4[i])))
        return false;
    }
    return true;
  }

  /// Block b's 8-bit steps st8 = st4 / 16 and the reciprocal steps, for the quantisation
  /// guesses of encode_token (padded channels: 0, like their steps).
  void prepare_block_inverse(std::size_t b) {
    const float* s4 = block_step4(b);
    inv4_.assign(dp_, 0.0);
    inv8_.assign(dp_, 0.0);
    s8_.assign(dp_, 0.0f);
    for (std::size_t i = 0; i < d_; ++i) {
      s8_[i] = detail::step8_of(s4[i]);
      inv4_[i] = s4[i] > 0.0f ? 1.0 / double(s4[i]) : 0.0;
      inv8_[i] = s8_[i] > 0.0f ? 1.0 / double(s8_[i]) : 0.0;
    }
    inverse_block_ = b;
  }

  /// Quantises token tb of block b (its key row x) into its 8-bit codes (the low nibbles
  /// into its refinement row, the high nibbles, its 4-bit codes, into the scan's layout)
  /// and its residual-norm byte. The AVX-512 path computes the same bits as the scalar
  /// loop (arch/avx512/encode_kernels.hpp); both sum the residual's squares in 8 lanes
  /// (channel i in lane i mod 8) and add the lanes in one fixed order. The 4-bit code
  /// q8 / 16 brackets k with st4 (lo + st4 (q8 / 16) <= lo + st8 q8 <= k and
  /// k <= lo + st8 (q8 + 1) <= lo + st4 (q8 / 16 + 1), every product by a power of two
  /// exact): it is the code quantize() gives with st4.
  void encode_token(const float* x, std::size_t b, std::size_t tb) {
    if (inverse_block_ != b) prepare_block_inverse(b);
    const float* lo = block_lo(b);
    q8_.resize(dp_);
    double lanes[8] = {};
    bool done = false;
#if CERTATTN_X86
    if (active_isa() == isa::kAvx512Vnni)
      done = detail::quantize_row_avx512(x, d_, dp_, lo, s8_.data(), inv4_.data(), inv8_.data(),
                                         q8_.data(), lanes);
#endif
    if (!done) {
      std::fill(lanes, lanes + 8, 0.0);
      for (std::size_t i = 0; i < dp_; ++i) {
        if (i >= d_) {  // padding: code 0
          q8_[i] = 0;
          continue;
        }
        const double v = double(x[i]), l = double(lo[i]);
        const unsigned q8 = quantize(v, l, s8_[i], inv8_[i], 255);
        q8_[i] = std::uint8_t(q8);
        if (s8_[i] > 0.0f) {  // f in [0, 1] with x = lo + st4 (q4 + f); a constant channel adds 0
          const double f = (v - l) * inv4_[i] - double(q8 >> 4);
          lanes[i % 8] += (f - 0.5) * (f - 0.5);
        }
      }
    }
    // The 4-bit layout: per channel octet o, the token's 4 bytes hold channels 8o + j (low
    // nibble) and 8o + 4 + j (high nibble), j < 4.
    std::uint8_t* c4 = codes4_.data() + b * block_code4_bytes();
    const std::size_t g = tb / kGroupTokens, lane = tb % kGroupTokens;
    for (std::size_t o = 0; o < dp_ / 8; ++o) {
      std::uint8_t* dst = c4 + (g * (dp_ / 8) + o) * 64 + lane * 4;
      const std::uint8_t* q = q8_.data() + 8 * o;
      for (std::size_t j = 0; j < 4; ++j) dst[j] = std::uint8_t((q[j] >> 4) | (q[j + 4] & 0xF0));
    }
    // The refinement row: the low nibbles, channels 2j and 2j + 1 in byte j.
    std::uint8_t* low = low8_.data() + (b * kBlockTokens + tb) * low8_bytes();
    for (std::size_t j = 0; j < dp_ / 2; ++j)
      low[j] = std::uint8_t((q8_[2 * j] & 0xF) | (q8_[2 * j + 1] & 0xF) << 4);
    const double rho2 = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
                        ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    // Rounded up with a margin far above the rounding of f (reciprocal and products:
    // a few 1e-16 relative of values at most 16).
    const double rho = std::sqrt(rho2) * (1.0 + 1e-9) + 1e-9;
    rho_[b * kBlockTokens + tb] =
        std::uint8_t(std::min(255.0, std::ceil(rho / detail::rho_step(dp_))));
  }

  /// Recomputes block b's ranges from its tokens in kv and re-encodes them. With
  /// headroom (the partly filled tail block), the ranges also cover the previous block's
  /// (a full block: the best guess of where the next keys fall) and are widened by a
  /// quarter on each side, so that the next tokens usually fit: from its own few tokens
  /// alone, a new block's ranges were exceeded in some channel by most of the next
  /// tokens, and its re-encodes (up to 128 tokens each) were 90% of the append time. A
  /// full block is encoded with its exact ranges (tightest bounds).
  template <kv_view KV>
  void encode_block(const KV& kv, std::size_t b, bool headroom = false) {
    const std::size_t t0 = b * kBlockTokens, t1 = std::min(n_, t0 + kBlockTokens);
    rows_.resize(kBlockTokens * d_);
    for (std::size_t t = t0; t < t1; ++t) load_key(kv, t, rows_.data() + (t - t0) * d_);
    mins_.assign(d_, std::numeric_limits<float>::infinity());
    maxs_.assign(d_, -std::numeric_limits<float>::infinity());
    for (std::size_t t = 0; t < t1 - t0; ++t) {
      const float* x = rows_.data() + t * d_;
      for (std::size_t i = 0; i < d_; ++i) {
        mins_[i] = std::min(mins_[i], x[i]);
        maxs_[i] = std::max(maxs_[i], x[i]);
      }
    }
    if (headroom && b > 0) {  // the previous block's ranges, [lo, lo + 255 st8] per channel
      const float* plo = block_lo(b - 1);
      const float* ps4 = block_step4(b - 1);
      for (std::size_t i = 0; i < d_; ++i) {
        mins_[i] = std::min(mins_[i], plo[i]);
        const double top = double(plo[i]) + 255.0 * double(detail::step8_of(ps4[i]));
        maxs_[i] = std::max(maxs_[i],
                            float(std::min(top, double(std::numeric_limits<float>::max()))));
      }
    }
    float* lo = scales_.data() + b * kScaleRows * dp_;
    float* s4 = lo + dp_;
    for (std::size_t i = 0; i < dp_; ++i) lo[i] = s4[i] = 0.0f;
    for (std::size_t i = 0; i < d_; ++i) {
      double mn = mins_[i], mx = maxs_[i];
      if (headroom) {
        const double h = 0.25 * (mx - mn) + 0x1p-10 * std::max(std::fabs(mn), std::fabs(mx));
        // Within float's range: keys near +-FLT_MAX would get lo = -inf (NaN bounds).
        mn = std::max(mn - h, -double(std::numeric_limits<float>::max()));
        mx = std::min(mx + h, double(std::numeric_limits<float>::max()));
      }
      lo[i] = float(mn);
      if (double(lo[i]) > mn) lo[i] = std::nextafter(lo[i], -std::numeric_limits<float>::infinity());
      const double range = mx - double(lo[i]);
      // st8 = range / 255 (every 8-bit code used), st4 = 16 st8: the 4-bit codes 0..15
      // then cover [lo, lo + 16 st4] = range * 256 / 255, where st4 = range / 15 left the
      // top sixteenth of the range unused (a 6% wider step, and a looser scan bound).
      s4[i] = detail::nestable_step4(round_up_to_float(range * 16.0 / 255.0));
    }
    inverse_block_ = std::size_t(-1);
    std::memset(codes4_.data() + b * block_code4_bytes(), 0, block_code4_bytes());
    std::memset(low8_.data() + t0 * low8_bytes(), 0, kBlockTokens * low8_bytes());
    for (std::size_t t = t0; t < t1; ++t) encode_token(rows_.data() + (t - t0) * d_, b, t - t0);
  }

  /// max of dist_[t] over t < pool_end with keep(dist_[t]): the whole blocks from their
  /// prefix maxima (kept with the same predicate), the rest token by token.
  template <class Keep>
  double prefix_max(std::size_t pool_end, const std::vector<float>& block_prefix,
                    Keep keep) const noexcept {
    if (pool_end == 0) return 0.0;
    pool_end = std::min(pool_end, n_);
    const std::size_t b = pool_end / kBlockTokens;
    float m = b > 0 ? block_prefix[b - 1] : 0.0f;
    for (std::size_t t = b * kBlockTokens; t < pool_end; ++t)
      if (keep(dist_[t])) m = std::max(m, dist_[t]);
    return double(m);
  }

  /// Prefix maxima of the distances, outside the exact set and all finite, blocks 0..b.
  void update_block_max(std::size_t b) noexcept {
    float m = b > 0 ? block_prefix_max_[b - 1] : 0.0f;
    float m_all = b > 0 ? block_prefix_max_all_[b - 1] : 0.0f;
    const std::size_t t0 = b * kBlockTokens, t1 = std::min(n_, t0 + kBlockTokens);
    for (std::size_t t = t0; t < t1; ++t) {
      if (dist_[t] <= cap_) m = std::max(m, dist_[t]);
      if (std::isfinite(dist_[t])) m_all = std::max(m_all, dist_[t]);
    }
    block_prefix_max_[b] = m;
    block_prefix_max_all_[b] = m_all;
  }

  /// Centre = mean of all values now, distances, cap, exact set, prefix maxima.
  template <kv_view KV>
  void refresh_value_bounds(const KV& kv) {
    std::vector<double>& acc = acc_;
    acc.assign(dv_, 0.0);
    check_.resize(d_);
    for (std::size_t t = 0; t < n_; ++t) {
      detail::value_to_float(kv, t, check_.data());
      for (std::size_t i = 0; i < dv_; ++i) acc[i] += double(check_[i]);
    }
    center_.assign(dv_, 0.0f);
    if (n_ > 0)
      for (std::size_t i = 0; i < dv_; ++i) center_[i] = float(acc[i] / double(n_));
    dist_.assign(blocks() * kBlockTokens, 0.0f);
    for (std::size_t t = 0; t < n_; ++t) {  // the same bits as from the 16-bit row
      detail::value_to_float(kv, t, check_.data());
      dist_[t] = value_distance_bound(check_.data(), center_, dv_);
    }
    sort_.assign(dist_.begin(), dist_.begin() + std::ptrdiff_t(n_));
    cap_ = value_cap_from_inplace(sort_);
    sort_.assign(dist_.begin(), dist_.begin() + std::ptrdiff_t(n_));
    reach_floor_ = reach_floor_from_inplace(sort_);
    offset_up_.assign(blocks() * kBlockTokens, 0.0f);
    for (std::size_t t = 0; t < n_; ++t)
      offset_up_[t] = sampling_offset_upper(dist_[t], reach_floor_);
    exact_.clear();
    overflow_.clear();
    for (std::size_t t = 0; t < n_; ++t) {
      if (dist_[t] > cap_) exact_.push_back(std::uint32_t(t));
      if (!std::isfinite(dist_[t])) overflow_.push_back(std::uint32_t(t));
    }
    block_prefix_max_.assign(blocks(), 0.0f);
    block_prefix_max_all_.assign(blocks(), 0.0f);
    for (std::size_t b = 0; b < blocks(); ++b) update_block_max(b);
    next_refresh_ = std::max(2 * n_, kMinTokensForCap);
  }

  std::size_t d_ = 0, dv_ = 0, dp_ = 0, n_ = 0, next_refresh_ = 0;
  bool built_ = false;
  cache_format format_ = cache_format::f16;   // what build() read, and every call must
  float key_scale_ = 1.0f, value_scale_ = 1.0f;
  cache_format value_format_ = cache_format::f16;  // its values' (value distances, exact set)
  refresh_policy policy_ = refresh_policy::kOnDoubling;
  float max_abs_key_ = 0.0f;
  float cap_ = std::numeric_limits<float>::infinity();
  float reach_floor_ = 1.0f;
  std::vector<std::uint32_t> exact_;      // the exact set: tokens with dist_ > cap_
  std::vector<std::uint32_t> overflow_;   // tokens with dist_ = +inf
  // Scratch of the encoder (not part of the index's state).
  std::vector<float> rows_, row_, mins_, maxs_, check_, sort_;
  std::vector<double> inv4_, inv8_, acc_;
  std::vector<float> s8_;         // the block's 8-bit steps st4 / 16
  std::vector<std::uint8_t> q8_;  // one row's 8-bit codes, one per byte
  std::size_t inverse_block_ = std::size_t(-1);
  // The arrays calls read (on huge pages: see memory.hpp).
  large_vector<std::uint8_t> codes4_;     // [blocks][groups][octets][64]
  large_vector<std::uint8_t> low8_;       // [tokens (block-padded)][padded_dim / 2] low nibbles
  large_vector<std::uint8_t> rho_;        // [tokens (block-padded)] residual norm bytes
  large_vector<float> scales_;            // [blocks][lo, st4][padded_dim]
  large_vector<float> dist_;              // [tokens (block-padded)] ||v_t - g|| rounded up
  large_vector<float> offset_up_;         // [tokens (block-padded)] ln(rho_t / rho_bar), up
  std::vector<float> block_prefix_max_;   // [blocks] max of dist_ <= cap_ over blocks 0..b
  std::vector<float> block_prefix_max_all_;  // [blocks] max of finite dist_ over blocks 0..b
  std::vector<float> center_;             // [value_dim] g
};

}  // namespace certattn

#include <certattn/arch/macros_undef.hpp>
