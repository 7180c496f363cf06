// How the library sees the caller's KV cache: a small concept for the cache of one
// (layer, KV head) and adapters for the layouts engines use. Strides are runtime values
// (as in mdspan's layout_stride and FlashInfer's paged_kv_t): templates vary only with the
// element type, so one instantiation serves every layout of that type.
#pragma once

#include <certattn/common.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace certattn {

/// The cache of one KV head, as the certified call and the key index read it: `size()`
/// tokens, oldest first, each with a key row of `head_dim()` contiguous elements and a
/// value row of `head_dim()` of them, or of `value_dim()` when the view declares one (no
/// more than head_dim; value_dim_of()). Rows may live anywhere (strided, paged); only the
/// channels of one row must be contiguous.
template <class V>
concept kv_view = requires(const V& v, std::size_t t) {
  typename V::element_type;
  requires storage_element<typename V::element_type>;
  { v.size() } -> std::convertible_to<std::size_t>;
  { v.head_dim() } -> std::convertible_to<std::size_t>;
  // Any pointer to the element type will do (an engine's accessors often return T*).
  { v.key(t) } -> std::convertible_to<const typename V::element_type*>;
  { v.value(t) } -> std::convertible_to<const typename V::element_type*>;
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

/// Keys and values in two arrays with runtime token strides (in elements). Covers
/// token-major NHD ([token][kv_head][dim], stride = kv_heads * head_dim), head-major HND
/// ([kv_head][token][dim], stride = head_dim) and any padded variant.
template <storage_element T>
class strided_kv {
 public:
  using element_type = T;
  strided_kv() = default;
  // keys/values point at token 0 of this head; strides are in elements.
  // value_dim: the channels of a value row (0: head_dim; fewer when the values have their
  // own width, or are a prefix of the key rows as in multi-head latent attention).
  strided_kv(const T* keys, const T* values, std::size_t n_tokens, std::size_t head_dim,
             std::size_t key_stride, std::size_t value_stride, std::size_t value_dim = 0)
      : keys_(keys), values_(values), n_(n_tokens), d_(head_dim),
        dv_(value_dim == 0 ? head_dim : value_dim), key_stride_(key_stride),
        value_stride_(value_stride) {
    if (head_dim == 0) throw error("head_dim must be > 0");
    if (dv_ > head_dim)
      throw error("value_dim (" + std::to_string(dv_) + ") > head_dim (" + std::to_string(head_dim) +
                  "): a value row may not be wider than a key row");
    if (n_tokens > 0 && (keys == nullptr || values == nullptr))
      throw error("strided_kv: keys and values must not be null");
    if (key_stride < head_dim && n_tokens > 1)
      throw error("key_stride (" + std::to_string(key_stride) + ") < head_dim (" +
                  std::to_string(head_dim) + "): rows would overlap");
    if (value_stride < dv_ && n_tokens > 1)
      throw error("value_stride (" + std::to_string(value_stride) + ") < value_dim (" +
                  std::to_string(dv_) + "): rows would overlap");
  }
  std::size_t size() const noexcept { return n_; }
  std::size_t head_dim() const noexcept { return d_; }
  std::size_t value_dim() const noexcept { return dv_; }
  const T* key(std::size_t t) const noexcept { return keys_ + t * key_stride_; }
  const T* value(std::size_t t) const noexcept { return values_ + t * value_stride_; }
  std::size_t key_stride() const noexcept { return key_stride_; }
  std::size_t value_stride() const noexcept { return value_stride_; }
  /// True when every value row is a prefix of its key row (one array for both).
  bool values_alias_keys() const noexcept { return values_ == keys_ && value_stride_ == key_stride_; }
  /// The same cache seen with fewer tokens (a prefix), e.g. the state before an append.
  strided_kv prefix(std::size_t n) const noexcept {
    strided_kv v = *this;
    v.n_ = n < n_ ? n : n_;
    return v;
  }

 private:
  const T* keys_ = nullptr;
  const T* values_ = nullptr;
  std::size_t n_ = 0, d_ = 0, dv_ = 0, key_stride_ = 0, value_stride_ = 0;
};

/// Head `head` of a token-major cache [token][kv_heads][head_dim] (llama.cpp's layout).
template <storage_element T>
strided_kv<T> nhd_view(const T* keys, const T* values, std::size_t n_tokens,
                       std::size_t kv_heads, std::size_t head_dim, std::size_t head) {
  if (head >= kv_heads)
    throw error("head (" + std::to_string(head) + ") >= kv_heads (" + std::to_string(kv_heads) +
                ")");
  return strided_kv<T>(keys + head * head_dim, values + head * head_dim, n_tokens, head_dim,
                       kv_heads * head_dim, kv_heads * head_dim);
}

/// Head `head` of a head-major cache [kv_heads][capacity][head_dim] holding n_tokens.
template <storage_element T>
strided_kv<T> hnd_view(const T* keys, const T* values, std::size_t n_tokens,
                       std::size_t capacity, std::size_t kv_heads, std::size_t head_dim,
                       std::size_t head) {
  if (head >= kv_heads)
    throw error("head (" + std::to_string(head) + ") >= kv_heads (" + std::to_string(kv_heads) +
                ")");
  if (n_tokens > capacity)
    throw error("n_tokens (" + std::to_string(n_tokens) + ") > capacity (" +
                std::to_string(capacity) + ")");
  return strided_kv<T>(keys + head * capacity * head_dim, values + head * capacity * head_dim,
                       n_tokens, head_dim, head_dim, head_dim);
}

/// A paged cache (vLLM, FlashInfer): fixed-size pages from a pool, a block table mapping
/// the sequence's page number to a pool page. Within a page, token rows are `token_stride`
/// elements apart; pages are `page_stride` elements apart; this head's rows start
/// `head_offset` elements into a page. FlashInfer's HND pages [kv_heads][page_size][dim]:
/// token_stride = dim, head_offset = head * page_size * dim, page_stride = kv_heads *
/// page_size * dim. vLLM/NHD pages [page_size][kv_heads][dim]: token_stride = kv_heads *
/// dim, head_offset = head * dim.
template <storage_element T>
class paged_kv {
 public:
  using element_type = T;
  paged_kv() = default;
  paged_kv(const T* key_pages, const T* value_pages, std::span<const std::int32_t> block_table,
           std::size_t n_tokens, std::size_t page_size, std::size_t head_dim,
           std::size_t page_stride, std::size_t token_stride, std::size_t head_offset)
      : keys_(key_pages), values_(value_pages), table_(block_table), n_(n_tokens),
        page_(page_size), d_(head_dim), page_stride_(page_stride),
        token_stride_(token_stride), head_offset_(head_offset) {
    if (head_dim == 0) throw error("head_dim must be > 0");
    if (page_size == 0) throw error("page_size must be > 0");
    if (n_tokens > 0 && (key_pages == nullptr || value_pages == nullptr))
      throw error("paged_kv: key_pages and value_pages must not be null");
    if (table_.size() * page_size < n_tokens)
      throw error("block_table has " + std::to_string(table_.size()) + " pages of " +
                  std::to_string(page_size) + " tokens, too few for n_tokens = " +
                  std::to_string(n_tokens));
    if (token_stride < head_dim && page_size > 1)
      throw error("token_stride < head_dim: rows would overlap");
    for (std::size_t p = 0; p * page_size < n_tokens; ++p)
      if (table_[p] < 0) throw error("block_table[" + std::to_string(p) + "] is negative");
  }
  std::size_t size() const noexcept { return n_; }
  std::size_t head_dim() const noexcept { return d_; }
  std::size_t page_size() const noexcept { return page_; }
  const T* key(std::size_t t) const noexcept { return keys_ + offset(t); }
  const T* value(std::size_t t) const noexcept { return values_ + offset(t); }
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
  const T* keys_ = nullptr;
  const T* values_ = nullptr;
  std::span<const std::int32_t> table_;
  std::size_t n_ = 0, page_ = 0, d_ = 0, page_stride_ = 0, token_stride_ = 0,
              head_offset_ = 0;
};

/// Multi-head latent attention in its absorbed form (DeepSeek-V2/V3, Kimi K2): one latent
/// row of head_dim channels per token (512 latent + 64 rotary) is the key of every query
/// head of the layer, and its first value_dim channels (512) are the value: key(t) and
/// value(t) are the same pointer, and there is no value buffer. Rows are `row_stride`
/// elements apart. The softmax scale is the model's (1/sqrt(192) for DeepSeek-V3), not
/// 1/sqrt(head_dim): set options::softmax_scale.
template <storage_element T>
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
    if (n_tokens > 0 && rows == nullptr) throw error("latent_kv: rows must not be null");
    if (row_stride < head_dim && n_tokens > 1)
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
  latent_kv prefix(std::size_t n) const noexcept {
    latent_kv v = *this;
    v.n_ = n < n_ ? n : n_;
    return v;
  }

 private:
  const T* rows_ = nullptr;
  std::size_t n_ = 0, d_ = 0, dv_ = 0, stride_ = 0;
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

/// Dense copies of a kv_view's key and value rows ([size][head_dim] each, any layout), as
/// the matrices the oracles take (exact_attention, reference_attend). Allocates: for
/// checks, not for the decode path.
template <kv_view KV>
struct dense_rows {
  using T = typename KV::element_type;
  std::vector<T> keys, values;
  std::size_t n = 0, d = 0, dv = 0;  // tokens, key channels, value channels
  explicit dense_rows(const KV& kv) : n(kv.size()), d(kv.head_dim()), dv(value_dim_of(kv)) {
    keys.resize(n * d);
    values.resize(n * dv);
    for (std::size_t t = 0; t < n; ++t) {
      const T* k = kv.key(t);
      const T* v = kv.value(t);
      std::copy(k, k + d, keys.begin() + std::ptrdiff_t(t * d));
      std::copy(v, v + dv, values.begin() + std::ptrdiff_t(t * dv));
    }
  }
  matrix_view<T> key_matrix() const { return {keys.data(), n, d, d}; }
  matrix_view<T> value_matrix() const { return {values.data(), n, dv, dv}; }
};

}  // namespace certattn
