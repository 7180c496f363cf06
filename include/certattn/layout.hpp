// How the library sees the caller's KV cache: a small concept for the cache of one
// (layer, KV head) and adapters for the layouts engines use. Strides are runtime values
// (as in mdspan's layout_stride and FlashInfer's paged_kv_t): templates vary only with the
// element type, so one instantiation serves every layout of that type. The element type is
// a 16-bit or float element, or a quantized format (formats.hpp): ggml's 32-channel blocks,
// whose strides count blocks, or fp8 codes with a scale per view.
#pragma once

#include <certattn/arch/decode_kernels.hpp>
#include <certattn/arch/score_dot.hpp>
#include <certattn/common.hpp>
#include <certattn/formats.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace certattn {

namespace detail {
// A view's key and value element types: its key_type and value_type when it declares them
// (keys and values stored in different formats), else its element_type for both. Empty
// when it declares neither, so that kv_view fails cleanly.
template <class V>
struct view_types {};
template <class V>
  requires requires { typename V::key_type; typename V::value_type; }
struct view_types<V> {
  using key = typename V::key_type;
  using value = typename V::value_type;
};
template <class V>
  requires(!requires { typename V::key_type; } && requires { typename V::element_type; })
struct view_types<V> {
  using key = typename V::element_type;
  using value = typename V::element_type;
};
// element_type where keys and values share one format (the adapters below declare it then).
template <class K, class V>
struct same_element {};
template <class T>
struct same_element<T, T> {
  using element_type = T;
};
}  // namespace detail

/// The element type of a view's key rows, and of its value rows.
template <class V>
using key_element_t = typename detail::view_types<V>::key;
template <class V>
using value_element_t = typename detail::view_types<V>::value;

/// The cache of one KV head, as the certified call and the key index read it: `size()`
/// tokens, oldest first, each with a key row of `head_dim()` contiguous channels and a
/// value row of `head_dim()` of them, or of `value_dim()` when the view declares one (no
/// more than head_dim; value_dim_of()). Rows may live anywhere (strided, paged); only the
/// channels of one row must be contiguous. A row of a block format is head_dim / 32
/// contiguous blocks; an fp8 view may declare key_scale() and value_scale() (else 1).
/// Keys and values share `element_type`, or a view declares `key_type` and `value_type`
/// (llama.cpp's `-ctk q8_0` with f16 values: keys in one format, values in another).
template <class V>
concept kv_view = requires(const V& v, std::size_t t) {
  typename key_element_t<V>;
  typename value_element_t<V>;
  requires kv_element<key_element_t<V>> && kv_element<value_element_t<V>>;
  { v.size() } -> std::convertible_to<std::size_t>;
  { v.head_dim() } -> std::convertible_to<std::size_t>;
  // Any pointer to the element type will do (an engine's accessors often return T*).
  { v.key(t) } -> std::convertible_to<const key_element_t<V>*>;
  { v.value(t) } -> std::convertible_to<const value_element_t<V>*>;
};

/// The channels of a view's value rows: value_dim() when the view has one (a latent
/// cache, whose values are a prefix of its key rows), else head_dim().
template <kv_view KV>
std::size_t value_dim_of(const KV& kv) noexcept {
  if constexpr (requires { { kv.value_dim() } -> std::convertible_to<std::size_t>; })
    return kv.value_dim();
  else
    return kv.head_dim();
}

/// True when a view's value rows lie inside its key rows (kv.values_alias_keys(), as
/// latent_kv and a strided_kv over one array declare): a value read after its key costs
/// no bytes.
template <kv_view KV>
bool values_alias_keys(const KV& kv) noexcept {
  if constexpr (requires { { kv.values_alias_keys() } -> std::convertible_to<bool>; })
    return kv.values_alias_keys();
  else
    return false;
}

/// The scales of an fp8 view (1 for every other format): the stored value of a channel is
/// scale * code, rounded to float.
template <kv_view KV>
float key_scale_of(const KV& kv) noexcept {
  if constexpr (requires { { kv.key_scale() } -> std::convertible_to<float>; })
    return kv.key_scale();
  else
    return 1.0f;
}
template <kv_view KV>
float value_scale_of(const KV& kv) noexcept {
  if constexpr (requires { { kv.value_scale() } -> std::convertible_to<float>; })
    return kv.value_scale();
  else
    return 1.0f;
}

/// The scales of an fp8 view, as the views below keep them (vLLM's k_scale and v_scale).
struct fp8_scales {
  float key = 1.0f, value = 1.0f;
};

namespace detail {
/// The scales a view keeps for its fp8 sides: each must be finite and > 0, and 1 for a side
/// stored in another format (its rows carry their own scales or none).
template <kv_element K, kv_element V>
fp8_scales checked_scales(fp8_scales s) {
  s.key = check_cache_scale(s.key, "key scale");
  s.value = check_cache_scale(s.value, "value scale");
  if (!fp8_element<K> && s.key != 1.0f)
    throw error("key scale (" + std::to_string(s.key) + ") must be 1: the keys are " +
                std::string(to_string(format_traits<K>::format)) + ", not fp8");
  if (!fp8_element<V> && s.value != 1.0f)
    throw error("value scale (" + std::to_string(s.value) + ") must be 1: the values are " +
                std::string(to_string(format_traits<V>::format)) + ", not fp8");
  return s;
}
}  // namespace detail

/// Keys and values in two arrays with runtime token strides (in units of their element
/// types: elements, or blocks of a block format). Covers token-major NHD ([token][kv_head]
/// [dim], stride = kv_heads * head_dim), head-major HND ([kv_head][token][dim], stride =
/// head_dim) and any padded variant. Keys and values may differ in format (strided_kv<K, V>,
/// e.g. q8_0 keys with f16 values, as llama.cpp's `-ctk q8_0` stores them).
template <kv_element K, kv_element V = K>
class strided_kv : public detail::same_element<K, V> {
 public:
  using key_type = K;
  using value_type = V;
  strided_kv() = default;
  // keys/values point at token 0 of this head; strides are in units of K and V.
  // value_dim: the channels of a value row (0: head_dim; fewer when the values have their
  // own width, or are a prefix of the key rows as in multi-head latent attention).
  strided_kv(const K* keys, const V* values, std::size_t n_tokens, std::size_t head_dim,
             std::size_t key_stride, std::size_t value_stride, std::size_t value_dim = 0)
      : keys_(keys), values_(values), n_(n_tokens), d_(head_dim),
        dv_(value_dim == 0 ? head_dim : value_dim), key_stride_(key_stride),
        value_stride_(value_stride) {
    if (head_dim == 0) throw error("head_dim must be > 0");
    if (dv_ > head_dim)
      throw error("value_dim (" + std::to_string(dv_) + ") > head_dim (" + std::to_string(head_dim) +
                  "): a value row may not be wider than a key row");
    check_row_channels<K>(head_dim, "head_dim");
    check_row_channels<V>(dv_, "value_dim");
    if (n_tokens > 0 && (keys == nullptr || values == nullptr))
      throw error("strided_kv: keys and values must not be null");
    const std::size_t ku = format_traits<K>::units(head_dim), vu = format_traits<V>::units(dv_);
    if (key_stride < ku && n_tokens > 1)
      throw error("key_stride (" + std::to_string(key_stride) + ") < " +
                  row_extent<K>(head_dim, "head_dim") + ": rows would overlap");
    if (value_stride < vu && n_tokens > 1)
      throw error("value_stride (" + std::to_string(value_stride) + ") < " +
                  row_extent<V>(dv_, "value_dim") + ": rows would overlap");
  }
  /// The same view with an fp8 cache's scales (vLLM's k_scale, v_scale; finite, > 0; 1
  /// for a side that is not fp8).
  strided_kv with_scales(fp8_scales s) const
    requires(fp8_element<K> || fp8_element<V>)
  {
    strided_kv v = *this;
    v.scales_ = detail::checked_scales<K, V>(s);
    return v;
  }
  float key_scale() const noexcept { return scales_.key; }
  float value_scale() const noexcept { return scales_.value; }
  std::size_t size() const noexcept { return n_; }
  std::size_t head_dim() const noexcept { return d_; }
  std::size_t value_dim() const noexcept { return dv_; }
  const K* key(std::size_t t) const noexcept { return keys_ + t * key_stride_; }
  const V* value(std::size_t t) const noexcept { return values_ + t * value_stride_; }
  std::size_t key_stride() const noexcept { return key_stride_; }
  std::size_t value_stride() const noexcept { return value_stride_; }
  /// True when every value row is a prefix of its key row (one array for both, one scale).
  bool values_alias_keys() const noexcept {
    if constexpr (std::is_same_v<K, V>)
      return values_ == keys_ && value_stride_ == key_stride_ && scales_.key == scales_.value;
    else
      return false;
  }
  /// The same cache seen with fewer tokens (a prefix), e.g. the state before an append.
  strided_kv prefix(std::size_t n) const noexcept {
    strided_kv v = *this;
    v.n_ = n < n_ ? n : n_;
    return v;
  }

 private:
  const K* keys_ = nullptr;
  const V* values_ = nullptr;
  std::size_t n_ = 0, d_ = 0, dv_ = 0, key_stride_ = 0, value_stride_ = 0;
  fp8_scales scales_;
};

/// Head `head` of a token-major cache [token][kv_heads][head_dim] (llama.cpp's layout; a
/// q8_0 or q4_0 cache tensor's rows are [kv_heads * head_dim / 32] blocks). Keys and values
/// may differ in format.
template <kv_element K, kv_element V>
strided_kv<K, V> nhd_view(const K* keys, const V* values, std::size_t n_tokens,
                          std::size_t kv_heads, std::size_t head_dim, std::size_t head) {
  if (head >= kv_heads)
    throw error("head (" + std::to_string(head) + ") >= kv_heads (" + std::to_string(kv_heads) +
                ")");
  check_row_channels<K>(head_dim, "head_dim");
  check_row_channels<V>(head_dim, "head_dim");
  const std::size_t ku = format_traits<K>::units(head_dim), vu = format_traits<V>::units(head_dim);
  return strided_kv<K, V>(keys + head * ku, values + head * vu, n_tokens, head_dim, kv_heads * ku,
                          kv_heads * vu);
}

/// Head `head` of a head-major cache [kv_heads][capacity][head_dim] holding n_tokens.
template <kv_element K, kv_element V>
strided_kv<K, V> hnd_view(const K* keys, const V* values, std::size_t n_tokens,
                          std::size_t capacity, std::size_t kv_heads, std::size_t head_dim,
                          std::size_t head) {
  if (head >= kv_heads)
    throw error("head (" + std::to_string(head) + ") >= kv_heads (" + std::to_string(kv_heads) +
                ")");
  if (n_tokens > capacity)
    throw error("n_tokens (" + std::to_string(n_tokens) + ") > capacity (" +
                std::to_string(capacity) + ")");
  check_row_channels<K>(head_dim, "head_dim");
  check_row_channels<V>(head_dim, "head_dim");
  const std::size_t ku = format_traits<K>::units(head_dim), vu = format_traits<V>::units(head_dim);
  return strided_kv<K, V>(keys + head * capacity * ku, values + head * capacity * vu, n_tokens,
                          head_dim, ku, vu);
}

/// A paged cache (vLLM, FlashInfer): fixed-size pages from a pool, a block table mapping
/// the sequence's page number to a pool page. Within a page, token rows are `token_stride`
/// units of K (elements, or blocks of a block format) apart; pages are `page_stride` units
/// apart; this head's rows start `head_offset` units into a page. FlashInfer's HND pages
/// [kv_heads][page_size][dim]: token_stride = dim, head_offset = head * page_size * dim,
/// page_stride = kv_heads * page_size * dim. vLLM/NHD pages [page_size][kv_heads][dim]:
/// token_stride = kv_heads * dim, head_offset = head * dim. The value pool has the same
/// layout counted in channels: where values are stored in another format than keys
/// (paged_kv<K, V>), its strides are the key strides' channels in units of V.
template <kv_element K, kv_element V = K>
class paged_kv : public detail::same_element<K, V> {
  static constexpr std::size_t kc = format_traits<K>::channels, vc = format_traits<V>::channels;

 public:
  using key_type = K;
  using value_type = V;
  paged_kv() = default;
  paged_kv(const K* key_pages, const V* value_pages, std::span<const std::int32_t> block_table,
           std::size_t n_tokens, std::size_t page_size, std::size_t head_dim,
           std::size_t page_stride, std::size_t token_stride, std::size_t head_offset)
      : keys_(key_pages), values_(value_pages), table_(block_table), n_(n_tokens),
        page_(page_size), d_(head_dim), page_stride_(page_stride),
        token_stride_(token_stride), head_offset_(head_offset) {
    if (head_dim == 0) throw error("head_dim must be > 0");
    check_row_channels<K>(head_dim, "head_dim");
    check_row_channels<V>(head_dim, "head_dim");
    if (page_size == 0) throw error("page_size must be > 0");
    if (n_tokens > 0 && (key_pages == nullptr || value_pages == nullptr))
      throw error("paged_kv: key_pages and value_pages must not be null");
    if (table_.size() * page_size < n_tokens)
      throw error("block_table has " + std::to_string(table_.size()) + " pages of " +
                  std::to_string(page_size) + " tokens, too few for n_tokens = " +
                  std::to_string(n_tokens));
    if (token_stride < format_traits<K>::units(head_dim) && page_size > 1)
      throw error("token_stride (" + std::to_string(token_stride) + ") < " +
                  row_extent<K>(head_dim, "head_dim") + ": rows would overlap");
    if constexpr (vc > kc) {
      const auto whole = [](std::size_t units, const char* what) {
        if (units * kc % vc != 0)
          throw error(std::string(what) + " (" + std::to_string(units) +
                      ") must be whole blocks of the values' " + std::to_string(vc) +
                      " channels, counted in key elements");
      };
      whole(page_stride, "page_stride");
      whole(token_stride, "token_stride");
      whole(head_offset, "head_offset");
    }
    for (std::size_t p = 0; p * page_size < n_tokens; ++p)
      if (table_[p] < 0) throw error("block_table[" + std::to_string(p) + "] is negative");
  }
  std::size_t size() const noexcept { return n_; }
  std::size_t head_dim() const noexcept { return d_; }
  std::size_t page_size() const noexcept { return page_; }
  /// The same view with an fp8 cache's scales (vLLM's k_scale, v_scale; finite, > 0; 1
  /// for a side that is not fp8).
  paged_kv with_scales(fp8_scales s) const
    requires(fp8_element<K> || fp8_element<V>)
  {
    paged_kv v = *this;
    v.scales_ = detail::checked_scales<K, V>(s);
    return v;
  }
  float key_scale() const noexcept { return scales_.key; }
  float value_scale() const noexcept { return scales_.value; }
  const K* key(std::size_t t) const noexcept { return keys_ + offset(t); }
  const V* value(std::size_t t) const noexcept {
    if constexpr (kc == vc)
      return values_ + offset(t);
    else
      return values_ + offset(t) * kc / vc;
  }
  paged_kv prefix(std::size_t n) const noexcept {
    paged_kv v = *this;
    v.n_ = n < n_ ? n : n_;
    return v;
  }

 private:
  std::size_t offset(std::size_t t) const noexcept {
    return std::size_t(table_[t / page_]) * page_stride_ + head_offset_ +
           (t % page_) * token_stride_;
  }
  const K* keys_ = nullptr;
  const V* values_ = nullptr;
  std::span<const std::int32_t> table_;
  std::size_t n_ = 0, page_ = 0, d_ = 0, page_stride_ = 0, token_stride_ = 0,
              head_offset_ = 0;
  fp8_scales scales_;
};

/// Multi-head latent attention in its absorbed form (DeepSeek-V2/V3, Kimi K2): one latent
/// row of head_dim channels per token (512 latent + 64 rotary) is the key of every query
/// head of the layer, and its first value_dim channels (512) are the value: key(t) and
/// value(t) are the same pointer, and there is no value buffer. Rows are `row_stride`
/// elements apart. The softmax scale is the model's (1/sqrt(192) for DeepSeek-V3), not
/// 1/sqrt(head_dim): set options::softmax_scale.
template <kv_element T>
class latent_kv {
 public:
  using element_type = T;
  latent_kv() = default;
  latent_kv(const T* rows, std::size_t n_tokens, std::size_t head_dim, std::size_t value_dim,
            std::size_t row_stride)
      : rows_(rows), n_(n_tokens), d_(head_dim), dv_(value_dim), stride_(row_stride) {
    if (head_dim == 0) throw error("head_dim must be > 0");
    if (value_dim == 0 || value_dim > head_dim)
      throw error("value_dim (" + std::to_string(value_dim) +
                  ") must lie in [1, head_dim = " + std::to_string(head_dim) +
                  "]: the values are a prefix of the key rows they alias");
    check_row_channels<T>(head_dim, "head_dim");
    check_row_channels<T>(value_dim, "value_dim");
    if (n_tokens > 0 && rows == nullptr) throw error("latent_kv: rows must not be null");
    if (row_stride < format_traits<T>::units(head_dim) && n_tokens > 1)
      throw error("row_stride (" + std::to_string(row_stride) + ") < head_dim (" +
                  std::to_string(head_dim) + "): rows would overlap");
  }
  std::size_t size() const noexcept { return n_; }
  std::size_t head_dim() const noexcept { return d_; }
  std::size_t value_dim() const noexcept { return dv_; }
  const T* key(std::size_t t) const noexcept { return rows_ + t * stride_; }
  const T* value(std::size_t t) const noexcept { return rows_ + t * stride_; }
  std::size_t row_stride() const noexcept { return stride_; }
  bool values_alias_keys() const noexcept { return true; }
  /// The same view with an fp8 cache's scale (one: the values are the key rows).
  latent_kv with_scale(float s) const
    requires fp8_element<T>
  {
    latent_kv v = *this;
    v.scale_ = check_cache_scale(s, "scale");
    return v;
  }
  float key_scale() const noexcept { return scale_; }
  float value_scale() const noexcept { return scale_; }
  latent_kv prefix(std::size_t n) const noexcept {
    latent_kv v = *this;
    v.n_ = n < n_ ? n : n_;
    return v;
  }

 private:
  const T* rows_ = nullptr;
  std::size_t n_ = 0, d_ = 0, dv_ = 0, stride_ = 0;
  float scale_ = 1.0f;
};

/// A kv_view's keys (or values) as the matrix_view the reference estimator takes, when its
/// rows are evenly strided.
template <storage_element T>
matrix_view<T> keys_matrix(const strided_kv<T>& kv) {
  return {kv.key(0), kv.size(), kv.head_dim(), kv.key_stride()};
}
template <storage_element T>
matrix_view<T> values_matrix(const strided_kv<T>& kv) {
  return {kv.value(0), kv.size(), kv.value_dim(), kv.value_stride()};
}

/// The element types the kernels read for a view's key rows and value rows: their own, or
/// float for a quantized format, whose rows are decoded first.
template <kv_view KV>
using key_row_t = std::conditional_t<quantized_element<key_element_t<KV>>, float, key_element_t<KV>>;
template <kv_view KV>
using value_row_t =
    std::conditional_t<quantized_element<value_element_t<KV>>, float, value_element_t<KV>>;
/// The earlier name of key_row_t (from when keys and values shared one element type).
template <kv_view KV>
using row_element_t = key_row_t<KV>;

namespace detail {
/// Bytes of a stored key row and of a stored value row (what a read of one costs).
template <kv_view KV>
std::size_t key_row_bytes(const KV& kv) noexcept {
  return format_traits<key_element_t<KV>>::row_bytes(kv.head_dim());
}
template <kv_view KV>
std::size_t value_row_bytes(const KV& kv) noexcept {
  return format_traits<value_element_t<KV>>::row_bytes(value_dim_of(kv));
}
/// Token t's key row as the kernels read it: in place, or decoded into `scratch`
/// (head_dim floats) for a quantized format.
template <kv_view KV>
inline const key_row_t<KV>* key_row(const KV& kv, std::size_t t, float* scratch) noexcept {
  if constexpr (quantized_element<key_element_t<KV>>) {
    decode_row(kv.key(t), kv.head_dim(), key_scale_of(kv), scratch);
    return scratch;
  } else {
    return kv.key(t);
  }
}
/// Token t's value row as the kernels read it (value_dim floats of scratch when decoded).
template <kv_view KV>
inline const value_row_t<KV>* value_row(const KV& kv, std::size_t t, float* scratch) noexcept {
  if constexpr (quantized_element<value_element_t<KV>>) {
    decode_row(kv.value(t), value_dim_of(kv), value_scale_of(kv), scratch);
    return scratch;
  } else {
    return kv.value(t);
  }
}
/// Token t's key (value) row as floats, exact: the numbers every stage reads.
template <kv_view KV>
inline void key_to_float(const KV& kv, std::size_t t, float* out) noexcept {
  if constexpr (quantized_element<key_element_t<KV>>)
    decode_row(kv.key(t), kv.head_dim(), key_scale_of(kv), out);
  else
    row_to_float(kv.key(t), out, kv.head_dim());
}
template <kv_view KV>
inline void value_to_float(const KV& kv, std::size_t t, float* out) noexcept {
  if constexpr (quantized_element<value_element_t<KV>>)
    decode_row(kv.value(t), value_dim_of(kv), value_scale_of(kv), out);
  else
    row_to_float(kv.value(t), out, value_dim_of(kv));
}
}  // namespace detail

/// The first `size` tokens of another view, nothing copied: what position p of an
/// attend_positions() call attends (the cache up to its own token), and the cache a
/// sequential call at that position would have seen. The view must outlive it.
template <kv_view KV>
class kv_prefix {
 public:
  using key_type = key_element_t<KV>;
  using value_type = value_element_t<KV>;
  kv_prefix(const KV& base, std::size_t size) : base_(&base), size_(size) {
    if (size > base.size())
      throw error("kv_prefix: size (" + std::to_string(size) + ") exceeds the view's " +
                  std::to_string(base.size()) + " tokens");
  }
  std::size_t size() const noexcept { return size_; }
  std::size_t head_dim() const noexcept { return base_->head_dim(); }
  decltype(auto) key(std::size_t t) const noexcept { return base_->key(t); }
  decltype(auto) value(std::size_t t) const noexcept { return base_->value(t); }
  std::size_t value_dim() const noexcept { return value_dim_of(*base_); }
  bool values_alias_keys() const noexcept { return certattn::values_alias_keys(*base_); }
  float key_scale() const noexcept { return key_scale_of(*base_); }
  float value_scale() const noexcept { return value_scale_of(*base_); }
  const KV& base() const noexcept { return *base_; }

 private:
  const KV* base_;
  std::size_t size_;
};

/// A shared prefix's view followed by one sequence's own tokens in another view of the
/// same type, nothing copied: token t is prefix's for t < prefix.size(), else own's token
/// t - prefix.size(). For attend_sequences() over caches that keep the prefix in one
/// buffer and each sequence's tokens in its own (no block table to share pages through).
/// Both views must outlive it and agree in head_dim, value_dim and scales.
template <kv_view KV>
class joined_kv {
 public:
  using key_type = key_element_t<KV>;
  using value_type = value_element_t<KV>;
  joined_kv() = default;
  joined_kv(const KV& prefix, const KV& own) : prefix_(&prefix), own_(&own), split_(prefix.size()) {
    if (own.head_dim() != prefix.head_dim() || value_dim_of(own) != value_dim_of(prefix))
      throw error("joined_kv: own's head_dim " + std::to_string(own.head_dim()) + " and value_dim " +
                  std::to_string(value_dim_of(own)) + " differ from prefix's (" +
                  std::to_string(prefix.head_dim()) + ", " + std::to_string(value_dim_of(prefix)) + ")");
    if (key_scale_of(own) != key_scale_of(prefix) || value_scale_of(own) != value_scale_of(prefix))
      throw error("joined_kv: own's fp8 scales differ from prefix's");
  }
  std::size_t size() const noexcept { return split_ + own_->size(); }
  std::size_t head_dim() const noexcept { return prefix_->head_dim(); }
  decltype(auto) key(std::size_t t) const noexcept {
    return t < split_ ? prefix_->key(t) : own_->key(t - split_);
  }
  decltype(auto) value(std::size_t t) const noexcept {
    return t < split_ ? prefix_->value(t) : own_->value(t - split_);
  }
  std::size_t value_dim() const noexcept { return value_dim_of(*prefix_); }
  bool values_alias_keys() const noexcept {
    return certattn::values_alias_keys(*prefix_) && certattn::values_alias_keys(*own_);
  }
  float key_scale() const noexcept { return key_scale_of(*prefix_); }
  float value_scale() const noexcept { return value_scale_of(*prefix_); }

 private:
  const KV* prefix_ = nullptr;
  const KV* own_ = nullptr;
  std::size_t split_ = 0;
};

/// Dense copies of a kv_view's key and value rows ([size][head_dim] each, any layout), as
/// the matrices the oracles take (exact_attention, reference_attend); a quantized cache's
/// rows decoded to floats, and both sides as floats (exact) where keys and values are
/// stored in different formats. Allocates: for checks, not for the decode path.
template <kv_view KV>
struct dense_rows {
  using T = std::conditional_t<std::is_same_v<key_row_t<KV>, value_row_t<KV>>, key_row_t<KV>, float>;
  std::vector<T> keys, values;
  std::size_t n = 0, d = 0, dv = 0;  // tokens, key channels, value channels
  explicit dense_rows(const KV& kv) : n(kv.size()), d(kv.head_dim()), dv(value_dim_of(kv)) {
    keys.resize(n * d);
    values.resize(n * dv);
    std::vector<float> kbuf(d), vbuf(dv);
    for (std::size_t t = 0; t < n; ++t) {
      const auto* k = detail::key_row(kv, t, kbuf.data());
      const auto* v = detail::value_row(kv, t, vbuf.data());
      for (std::size_t i = 0; i < d; ++i) keys[t * d + i] = T(k[i]);
      for (std::size_t i = 0; i < dv; ++i) values[t * dv + i] = T(v[i]);
    }
  }
  matrix_view<T> key_matrix() const { return {keys.data(), n, d, d}; }
  matrix_view<T> value_matrix() const { return {values.data(), n, dv, dv}; }
};

}  // namespace certattn
