// certattn._core: the pybind11 binding of the header-only library. Thin by design: the
// Python package (python/certattn/__init__.py) turns torch tensors into NumPy views, checks
// scalar arguments and shapes the results; this file reads the caller's buffers in place
// (never copying the cache), builds strided_kv views over them, and calls the library with
// the GIL released.
//
// A cache argument is a NumPy array [n, d] (one KV head) or [kv_heads, n, d] (a layer) of
// float16, float32 or uint16 (the bits of bfloat16), whose last axis is contiguous; the
// token and head strides are free (a head-major buffer sliced to its first n tokens, or a
// token-major [n, kv_heads, d] buffer transposed to [kv_heads, n, d], are read in place).
// A quantized cache is an array of the package's structured dtypes (certattn.BLOCK_Q8_0,
// BLOCK_Q4_0: ggml's blocks, the last axis head_dim / 32 blocks; FP8_E4M3, FP8_E5M2: one
// byte per channel, with the layer's k_scale, v_scale).
#include <certattn/certattn.hpp>
#include <certattn/reference.hpp>
#include <certattn/exact.hpp>
#include <certattn/parallel.hpp>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace py = pybind11;
using namespace certattn;

namespace {

enum class dtype_code { kHalf, kBfloat16, kFloat, kQ8_0, kQ4_0, kFp8E4M3, kFp8E5M2 };

const char* dtype_name(dtype_code c) {
  switch (c) {
    case dtype_code::kHalf: return "float16";
    case dtype_code::kBfloat16: return "bfloat16";
    case dtype_code::kFloat: return "float32";
    case dtype_code::kQ8_0: return "q8_0";
    case dtype_code::kQ4_0: return "q4_0";
    case dtype_code::kFp8E4M3: return "fp8_e4m3";
    case dtype_code::kFp8E5M2: return "fp8_e5m2";
  }
  return "?";
}

/// Channels per array element: 32 for ggml's blocks, else 1.
std::size_t channels_per_element(dtype_code c) {
  return c == dtype_code::kQ8_0 || c == dtype_code::kQ4_0 ? 32 : 1;
}
bool is_fp8(dtype_code c) { return c == dtype_code::kFp8E4M3 || c == dtype_code::kFp8E5M2; }

/// One cache argument (keys or values) seen in place: [heads][n][d] with element strides.
struct cache_arg {
  const char* data = nullptr;
  dtype_code dtype = dtype_code::kFloat;
  std::size_t item = 4, heads = 1, n = 0, d = 0;  // d in channels
  std::size_t head_stride = 0, token_stride = 0;  // elements (blocks for a block format)
  bool layer = false;                             // given as [kv_heads, n, d]
  float scale = 1.0f;                             // an fp8 cache's k_scale or v_scale

  /// With v this cache's values (as many channels or fewer: v = k[..., :512] is the value
  /// of a latent cache, multi-head latent attention). Tag: a kv_tag<K, V> (dispatch()).
  template <class Tag>
  auto view_with(const cache_arg& v, std::size_t h) const {
    using K = typename Tag::key;
    using V = typename Tag::value;
    strided_kv<K, V> kv(reinterpret_cast<const K*>(data) + h * head_stride,
                        reinterpret_cast<const V*>(v.data) + h * v.head_stride, n, d, token_stride,
                        v.token_stride, v.d);
    if constexpr (fp8_element<K> || fp8_element<V>)
      return kv.with_scales({scale, v.scale});
    else
      return kv;
  }
  template <class T>
  matrix_view<T> matrix(std::size_t h) const {
    return {reinterpret_cast<const T*>(data) + h * head_stride, n, d, token_stride};
  }
};

dtype_code dtype_of(const py::array& a, const char* name) {
  const py::dtype dt = a.dtype();
  if (dt.kind() == 'f' && dt.itemsize() == 2) return dtype_code::kHalf;
  if (dt.kind() == 'f' && dt.itemsize() == 4) return dtype_code::kFloat;
  if (dt.kind() == 'u' && dt.itemsize() == 2) return dtype_code::kBfloat16;
  if (dt.kind() == 'V' && py::hasattr(dt, "names") && !dt.attr("names").is_none()) {
    // The package's structured dtypes, told apart by their fields and size.
    const auto names = dt.attr("names").cast<std::vector<std::string>>();
    const std::size_t size = std::size_t(dt.itemsize());
    if (names == std::vector<std::string>{"d", "qs"} && size == sizeof(block_q8_0)) return dtype_code::kQ8_0;
    if (names == std::vector<std::string>{"d", "qs"} && size == sizeof(block_q4_0)) return dtype_code::kQ4_0;
    if (names == std::vector<std::string>{"e4m3"} && size == 1) return dtype_code::kFp8E4M3;
    if (names == std::vector<std::string>{"e5m2"} && size == 1) return dtype_code::kFp8E5M2;
  }
  throw py::type_error(std::string(name) + ": dtype " + py::str(py::handle(dt)).cast<std::string>() +
                       " is not supported (float16, float32, uint16 holding bfloat16 bits, or certattn.BLOCK_Q8_0, "
                       "BLOCK_Q4_0, FP8_E4M3, FP8_E5M2)");
}

/// (k_scale, v_scale) of an fp8 cache (vLLM's per-layer scales); (1, 1) for the others.
using scales_arg = std::pair<float, float>;

/// scale: the cache's fp8 scale (k_scale or v_scale); 1 for every other format.
cache_arg cache_of(const py::array& a, const char* name, float scale = 1.0f) {
  cache_arg c;
  c.dtype = dtype_of(a, name);
  c.item = std::size_t(a.itemsize());
  if (!(std::isfinite(scale) && scale > 0.0f))
    throw py::value_error(std::string(name) + ": kv_scales must be finite and > 0, got " + std::to_string(scale));
  if (scale != 1.0f && !is_fp8(c.dtype))
    throw py::value_error(std::string(name) + ": kv_scales apply to fp8 caches only (this one is " +
                          dtype_name(c.dtype) + ")");
  c.scale = scale;
  if (a.ndim() != 2 && a.ndim() != 3)
    throw py::value_error(std::string(name) + ": expected [n_tokens, head_dim] or [kv_heads, n_tokens, head_dim], got " +
                          std::to_string(a.ndim()) + " dimensions");
  c.layer = a.ndim() == 3;
  const int o = c.layer ? 1 : 0;
  c.heads = c.layer ? std::size_t(a.shape(0)) : 1;
  c.n = std::size_t(a.shape(o));
  const std::size_t units = std::size_t(a.shape(o + 1));  // elements per row
  c.d = units * channels_per_element(c.dtype);
  if (c.heads == 0) throw py::value_error(std::string(name) + ": kv_heads is 0");
  if (c.n == 0) throw py::value_error(std::string(name) + ": the cache is empty (0 tokens)");
  if (c.d == 0) throw py::value_error(std::string(name) + ": head_dim is 0");
  const auto stride = [&](int axis, std::size_t extent, const char* what) -> std::size_t {
    const py::ssize_t s = a.strides(axis);
    if (extent <= 1) return 0;
    if (s < 0 || s % py::ssize_t(c.item) != 0)
      throw py::value_error(std::string(name) + ": the " + what + " stride (" + std::to_string(s) +
                            " bytes) is negative or not a multiple of the element size: pass a contiguous array");
    return std::size_t(s) / c.item;
  };
  if (units > 1 && a.strides(o + 1) != py::ssize_t(c.item))
    throw py::value_error(std::string(name) +
                          ": the head_dim axis is not contiguous (each token's row must be contiguous; use "
                          "numpy.ascontiguousarray or tensor.contiguous())");
  c.token_stride = stride(o, c.n, "token");
  if (c.n > 1 && c.token_stride < units)
    throw py::value_error(std::string(name) + ": token rows overlap (token stride < head_dim)");
  if (c.n <= 1) c.token_stride = units;
  c.head_stride = c.layer ? stride(0, c.heads, "head") : 0;
  if (c.heads > 1 && c.head_stride < units)
    throw py::value_error(std::string(name) + ": head rows overlap (head stride < head_dim)");
  c.data = static_cast<const char*>(a.data());
  // A block's fp16 scale is read as 2 bytes: blocks need 2-byte alignment, fp8 none.
  const std::size_t align = c.dtype == dtype_code::kQ8_0 || c.dtype == dtype_code::kQ4_0 ? alignof(block_q8_0)
                                                                                          : std::min<std::size_t>(c.item, 8);
  if (reinterpret_cast<std::uintptr_t>(c.data) % align != 0)
    throw py::value_error(std::string(name) + ": the data is not aligned to its element size");
  return c;
}

/// The element types of a cache's keys and values, as dispatch() passes them.
template <class K, class V>
struct kv_tag {
  using key = K;
  using value = V;
};

/// A cache's key and value formats.
struct dtype_pair {
  dtype_code key = dtype_code::kFloat, value = dtype_code::kFloat;
};

/// Keys and values in two formats: the pairs llama.cpp's caches use (q8_0 keys with f16 or
/// q4_0 values, q4_0 keys with f16 values).
bool served_pair(dtype_code k, dtype_code v) {
  return (k == dtype_code::kQ8_0 && (v == dtype_code::kHalf || v == dtype_code::kQ4_0)) ||
         (k == dtype_code::kQ4_0 && v == dtype_code::kHalf);
}

dtype_pair check_pair(const cache_arg& k, const cache_arg& v) {
  if (k.dtype != v.dtype && !served_pair(k.dtype, v.dtype))
    throw py::type_error(std::string("k and v have different dtypes (") + dtype_name(k.dtype) + ", " +
                         dtype_name(v.dtype) +
                         "): keys and values in two formats are served as q8_0 keys with float16 or q4_0 values "
                         "and q4_0 keys with float16 values");
  if ((!is_fp8(k.dtype) && k.scale != 1.0f) || (!is_fp8(v.dtype) && v.scale != 1.0f))
    throw py::value_error("kv_scales apply to fp8 caches only");
  if (k.layer != v.layer || k.heads != v.heads || k.n != v.n || v.d > k.d)
    throw py::value_error("k and v have different shapes (kv_heads " + std::to_string(k.heads) + " vs " +
                          std::to_string(v.heads) + ", n_tokens " + std::to_string(k.n) + " vs " +
                          std::to_string(v.n) + ", head_dim " + std::to_string(k.d) + " vs " +
                          std::to_string(v.d) + "; v may have fewer channels than k, not more)");
  return {k.dtype, v.dtype};
}

/// Calls f(kv_tag<K, V>{}) with the cache's key and value element types.
template <class F>
decltype(auto) dispatch(dtype_pair c, F&& f) {
  if (c.key != c.value) {  // check_pair() admits these pairs only
    if (c.key == dtype_code::kQ8_0 && c.value == dtype_code::kHalf) return f(kv_tag<block_q8_0, half>{});
    if (c.key == dtype_code::kQ8_0) return f(kv_tag<block_q8_0, block_q4_0>{});
    return f(kv_tag<block_q4_0, half>{});
  }
  switch (c.key) {
    case dtype_code::kHalf: return f(kv_tag<half, half>{});
    case dtype_code::kBfloat16: return f(kv_tag<bfloat16, bfloat16>{});
    case dtype_code::kQ8_0: return f(kv_tag<block_q8_0, block_q8_0>{});
    case dtype_code::kQ4_0: return f(kv_tag<block_q4_0, block_q4_0>{});
    case dtype_code::kFp8E4M3: return f(kv_tag<fp8_e4m3, fp8_e4m3>{});
    case dtype_code::kFp8E5M2: return f(kv_tag<fp8_e5m2, fp8_e5m2>{});
    case dtype_code::kFloat: break;
  }
  return f(kv_tag<float, float>{});
}
dtype_pair pair_of(const cache_arg& k, const cache_arg& v) { return {k.dtype, v.dtype}; }

/// f(keys, values): KV head h's rows as matrix_views, for exact attention and the
/// reference: the cache in place, or a quantized cache's rows (or keys and values in two
/// formats) decoded (allocated).
template <class Tag, class F>
decltype(auto) with_matrices(const cache_arg& k, const cache_arg& v, std::size_t h, F&& f) {
  using K = typename Tag::key;
  using V = typename Tag::value;
  if constexpr (quantized_element<K> || !std::is_same_v<K, V>) {
    const auto kv = k.view_with<Tag>(v, h);
    const dense_rows<decltype(kv)> rows(kv);
    return f(rows.key_matrix(), rows.value_matrix());
  } else {
    return f(k.matrix<K>(h), v.matrix<K>(h));
  }
}

/// Each sequence's own tokens of a shared-prefix call (attend_sequences): own_k[s],
/// own_v[s] in the prefix cache's dtypes and shape but their own token counts.
std::vector<std::pair<cache_arg, cache_arg>> own_caches(const std::vector<py::array>& ks,
                                                        const std::vector<py::array>& vs, const cache_arg& k,
                                                        const cache_arg& v, const scales_arg& kv_scales) {
  if (ks.empty()) throw py::value_error("own_k: at least one sequence");
  if (ks.size() != vs.size())
    throw py::value_error("own_k holds " + std::to_string(ks.size()) + " sequences, own_v " +
                          std::to_string(vs.size()));
  std::vector<std::pair<cache_arg, cache_arg>> own;
  for (std::size_t s = 0; s < ks.size(); ++s) {
    const std::string kn = "own_k[" + std::to_string(s) + "]", vn = "own_v[" + std::to_string(s) + "]";
    const cache_arg ok = cache_of(ks[s], kn.c_str(), kv_scales.first);
    const cache_arg ov = cache_of(vs[s], vn.c_str(), kv_scales.second);
    check_pair(ok, ov);
    if (ok.dtype != k.dtype || ov.dtype != v.dtype)
      throw py::type_error(kn + ", " + vn + ": dtypes (" + dtype_name(ok.dtype) + ", " + dtype_name(ov.dtype) +
                           ") differ from the prefix's (" + dtype_name(k.dtype) + ", " + dtype_name(v.dtype) + ")");
    if (ok.layer != k.layer || ok.heads != k.heads || ok.d != k.d || ov.d != v.d)
      throw py::value_error(kn + ": kv_heads and head_dim (" + std::to_string(ok.heads) + ", " +
                            std::to_string(ok.d) + ") differ from the prefix cache's (" + std::to_string(k.heads) +
                            ", " + std::to_string(k.d) + ")");
    own.emplace_back(ok, ov);
  }
  return own;
}

/// f(views): KV head h of every sequence as joined_kv views (the prefix k, v followed by
/// that sequence's own tokens), nothing copied. Allocates the S views.
template <class Tag, class F>
decltype(auto) with_sequence_views(const cache_arg& k, const cache_arg& v,
                                   const std::vector<std::pair<cache_arg, cache_arg>>& own, std::size_t h, F&& f) {
  using View = decltype(k.view_with<Tag>(v, h));
  const View prefix = k.view_with<Tag>(v, h);
  std::vector<View> tails;
  tails.reserve(own.size());
  for (const auto& [ok, ov] : own) tails.push_back(ok.template view_with<Tag>(ov, h));
  std::vector<joined_kv<View>> views;
  views.reserve(own.size());
  for (const View& t : tails) views.emplace_back(prefix, t);
  return f(std::span<const joined_kv<View>>(views));
}

/// Queries: float32, C-contiguous, [heads, group, d] (the Python side reshapes).
struct query_arg {
  const float* data = nullptr;
  std::size_t heads = 0, group = 0, d = 0;
};

query_arg queries_of(const py::array& q) {
  if (!py::isinstance<py::array_t<float>>(q) || q.itemsize() != 4)
    throw py::type_error("q: expected float32 (the Python layer converts)");
  if (q.ndim() != 3) throw py::value_error("q: expected [kv_heads, group, head_dim]");
  if (!(q.flags() & py::array::c_style)) throw py::value_error("q: not C-contiguous");
  query_arg a;
  a.heads = std::size_t(q.shape(0));
  a.group = std::size_t(q.shape(1));
  a.d = std::size_t(q.shape(2));
  if (a.group == 0) throw py::value_error("q: group (query heads per KV head) is 0");
  a.data = static_cast<const float*>(q.data());
  return a;
}

/// The certificate as a NumPy record (certattn.CERTIFICATE_DTYPE).
struct cert_record {
  bool certified;
  bool exact;
  std::uint8_t path;  // answer_path (certattn.ANSWER_PATHS names them)
  std::int32_t level;
  double tau, bound, beta, scale_value, max_score, denominator;
  std::uint64_t heavy, sampled, keys_read, values_read, bytes_read;
};

cert_record to_record(const certificate& c) {
  return {c.certified,   c.exact,          std::uint8_t(c.path), std::int32_t(c.level), c.tau,
          c.bound,       c.beta,           c.scale_value,        c.max_score,           c.denominator,
          c.heavy,       c.sampled,        c.keys_read,          c.values_read,         c.bytes_read};
}

options make_options(double eps, double delta, const std::string& scale, const std::string& cert,
                     std::size_t window, int grid_ratio, int max_levels, int grid_top, double softmax_scale,
                     std::uint64_t seed, const std::string& route, double cost_fixed, double cost_per_key,
                     double cost_give_up, bool cost_measured) {
  options o;
  o.epsilon = eps;
  o.delta = delta;
  o.scale = error_scale_from_string(scale);
  o.certificate = certificate_kind_from_string(cert);
  o.window = window;
  o.grid_ratio = grid_ratio;
  o.max_levels = max_levels;
  o.grid_top = grid_top;
  o.softmax_scale = softmax_scale;
  o.seed = seed;
  o.route = routing_from_string(route);
  o.cost = cost_model{cost_fixed, cost_per_key, cost_give_up, cost_measured};
  validate(o);
  return o;
}

/// The group_history of every KV head of an index at one moment (KeyIndex.history_snapshot()):
/// what reference_attend needs to reproduce the next call made with the histories. Empty
/// before the first such call.
/// A call's attention variant (variant.hpp) with its per-query-head arrays owned: slopes
/// and sinks hold 0 or heads * group entries, query head h * group + g at that index.
struct py_variant {
  double softcap = 0.0;
  std::size_t sliding_window = 0;
  std::vector<float> slopes, sinks;
  /// KV head h's group of `group` query heads, as the calls take it.
  attention_variant head(std::size_t h, std::size_t group, std::size_t heads) const {
    for (const std::vector<float>* a : {&slopes, &sinks})
      if (!a->empty() && a->size() != heads * group)
        throw py::value_error((a == &slopes ? std::string("alibi_slopes") : std::string("sinks")) + ": " +
                              std::to_string(a->size()) + " values for " + std::to_string(heads * group) +
                              " query heads");
    attention_variant v;
    v.logit_softcap = softcap;
    v.sliding_window = sliding_window;
    if (!slopes.empty()) v.alibi_slopes = std::span<const float>(slopes).subspan(h * group, group);
    if (!sinks.empty()) v.sinks = std::span<const float>(sinks).subspan(h * group, group);
    return v;
  }
};

/// The variant of KV head h, or plain attention without one.
attention_variant variant_of(const py_variant* v, std::size_t h, std::size_t group, std::size_t heads) {
  return v == nullptr ? attention_variant{} : v->head(h, group, heads);
}

struct history_snapshot {
  std::vector<group_history> heads;
};

/// The histories a call with `group` query heads per KV head starts from: `h` itself, or
/// fresh ones when it holds none for that group (the first call, or the group changed).
bool histories_fit(const std::vector<group_history>& h, std::size_t heads, std::size_t group) {
  return h.size() == heads && !h.empty() && h[0].group() == group;
}

/// What a call made with a snapshot's histories starts from, for the reference: the
/// snapshot's, or fresh ones when it holds none for this group size (the call creates
/// them then). `name` is the argument's, for the error.
std::vector<group_history> start_histories(const history_snapshot& snap, std::size_t heads, std::size_t group,
                                           const std::string& name) {
  if (!snap.heads.empty() && snap.heads.size() != heads)
    throw py::value_error(name + ": a snapshot of " + std::to_string(snap.heads.size()) + " KV heads, the cache has " +
                          std::to_string(heads));
  return histories_fit(snap.heads, heads, group) ? snap.heads : std::vector<group_history>(heads, group_history(group));
}

/// Key indices of one KV head or a whole layer, with the workspaces and the thread pool
/// their calls reuse (so that a steady-state call allocates nothing), and one
/// group_history per KV head (docs/python.md, "Routing"). Calls on one index are
/// serialised by its mutex; different indices run concurrently.
class py_index {
 public:
  py_index(const py::array& k, const py::array& v, std::size_t reserve, std::size_t threads,
           const scales_arg& kv_scales) {
    const cache_arg kc = cache_of(k, "k", kv_scales.first), vc = cache_of(v, "v", kv_scales.second);
    check_pair(kc, vc);
    dtype_ = {kc.dtype, vc.dtype};
    layer_ = kc.layer;
    d_ = kc.d;
    idx_.assign(kc.heads, key_index(kc.d));
    reserved_ = std::max(reserve, kc.n);
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lk(mu_);
    for (key_index& x : idx_) x.reserve(reserved_);
    for_heads(threads, [&](std::size_t h, std::size_t) {
      dispatch(dtype_, [&](auto t) { idx_[h].build(kc.view_with<decltype(t)>(vc, h)); });
    });
  }

  std::size_t size() const { return idx_.empty() ? 0 : idx_[0].size(); }
  std::size_t heads() const { return idx_.size(); }
  std::size_t head_dim() const { return d_; }
  bool layer() const { return layer_; }
  /// The cache's dtype: its keys' ("q8_0"), or "q8_0/float16" where the values differ.
  std::string dtype() const {
    return dtype_.key == dtype_.value ? std::string(dtype_name(dtype_.key))
                                      : std::string(dtype_name(dtype_.key)) + "/" + dtype_name(dtype_.value);
  }
  std::size_t memory_bytes() const {
    std::size_t b = 0;
    for (const key_index& x : idx_) b += x.memory_bytes();
    return b;
  }

  void reserve(std::size_t tokens) {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lk(mu_);
    reserved_ = std::max(reserved_, tokens);
    for (key_index& x : idx_) x.reserve(tokens);
  }

  void append(const py::array& k, const py::array& v, std::size_t threads, const scales_arg& kv_scales) {
    const cache_arg kc = cache_of(k, "k", kv_scales.first), vc = cache_of(v, "v", kv_scales.second);
    check_pair(kc, vc);
    check_cache(kc, vc);
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lk(mu_);
    const std::size_t first = size();
    if (kc.n < first)
      throw error("append: k holds " + std::to_string(kc.n) + " tokens, fewer than the index (" +
                  std::to_string(first) + "); use truncate to drop tokens");
    for_heads(threads, [&](std::size_t h, std::size_t) {
      dispatch(dtype_, [&](auto t) { idx_[h].append_range(kc.view_with<decltype(t)>(vc, h), first, kc.n - first); });
    });
  }

  void truncate(const py::array& k, const py::array& v, std::size_t n, const scales_arg& kv_scales) {
    const cache_arg kc = cache_of(k, "k", kv_scales.first), vc = cache_of(v, "v", kv_scales.second);
    check_pair(kc, vc);
    check_cache(kc, vc);
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lk(mu_);
    for (std::size_t h = 0; h < idx_.size(); ++h)
      dispatch(dtype_, [&](auto t) { idx_[h].truncate(kc.view_with<decltype(t)>(vc, h), n); });
  }

  /// The certified call for every KV head of the index, queries q [heads][positions *
  /// group][d] (each head's positions of `group` queries: attend_positions() when positions
  /// > 1). With use_history (then hints is null) each head's call gets that head's
  /// group_history, created for this group size when the index holds none for it.
  void attend(const query_arg& q, const cache_arg& k, const cache_arg& v, const options& opt, std::uint64_t step,
              std::uint32_t layer, std::uint32_t kv_head, std::uint64_t sequence, const std::int32_t* hints,
              bool use_history, float* out, cert_record* certs, std::size_t threads,
              const py_variant* variant = nullptr, std::size_t positions = 1) {
    std::lock_guard<std::mutex> lk(mu_);
    const std::size_t P = positions, PG = q.group, G = PG / P, d = d_, H = q.heads;
    const bool single = !layer_;
    ensure_workspaces(std::min(threads, H), PG, k.n, opt.total_levels());
    if (use_history && !histories_fit(hist_, H, G)) hist_.assign(H, group_history(G));
    std::vector<certificate> certs_all(H * PG);
    for_heads(
        threads,
        [&](std::size_t h, std::size_t w) {
          const std::uint32_t head_id = single ? kv_head : std::uint32_t(h);
          const noise_key nk{step, layer, head_id, sequence};
          options head_opt = opt;
          head_opt.variant = variant_of(variant, h, G, H);
          std::span<const int> hint_span;
          if (hints != nullptr) hint_span = std::span<const int>(hints + h * G, G);
          dispatch(dtype_, [&](auto t) {
            const auto queries = std::span<const float>(q.data + h * PG * d, PG * d);
            const auto o = std::span<float>(out + h * PG * v.d, PG * v.d);
            const auto c = std::span<certificate>(certs_all.data() + h * PG, PG);
            if (P > 1 && use_history)
              attend_positions(queries, P, G, k.view_with<decltype(t)>(v, h), idx_[h], nk, head_opt, o, c,
                               *ws_[w], hist_[h]);
            else if (P > 1)
              attend_positions(queries, P, G, k.view_with<decltype(t)>(v, h), idx_[h], nk, head_opt, o, c,
                               *ws_[w], hint_span);
            else if (use_history)
              attend_group(queries, G, k.view_with<decltype(t)>(v, h), idx_[h], nk, head_opt, o, c, *ws_[w],
                           hist_[h]);
            else
              attend_group(queries, G, k.view_with<decltype(t)>(v, h), idx_[h], nk, head_opt, o, c, *ws_[w],
                           hint_span);
          });
        },
        H);
    for (std::size_t i = 0; i < H * PG; ++i) certs[i] = to_record(certs_all[i]);
  }

  /// The shared-prefix call for every KV head (attend_sequences): this index holds the
  /// prefix k, v; own[s] is sequence s's own tokens; q [heads][S * group][d] (sequence-
  /// major per KV head), hints null or [heads][S * group]. With use_history (then hints is
  /// null) sequence s's call on head h gets the group_history this index keeps for
  /// sequence ids[s] and head h, created for this group size when it holds none for it.
  void attend_sequences(const query_arg& q, const cache_arg& k, const cache_arg& v,
                        const std::vector<std::pair<cache_arg, cache_arg>>& own, const options& opt,
                        std::uint64_t step, std::uint32_t layer, std::uint32_t kv_head,
                        const std::vector<std::uint64_t>& ids, const std::int32_t* hints, bool use_history,
                        float* out, cert_record* certs, std::size_t threads, const py_variant* variant) {
    std::lock_guard<std::mutex> lk(mu_);
    if (size() != k.n)
      throw error("index holds " + std::to_string(size()) + " tokens, the prefix cache " + std::to_string(k.n) +
                  " (the index is the prefix's: append nothing of the sequences' own tokens to it)");
    const std::size_t S = own.size(), SG = q.group, G = SG / S, d = d_, H = q.heads;
    std::size_t longest = 0;
    for (const auto& o : own) longest = std::max(longest, k.n + o.first.n);
    ensure_workspaces(std::min(threads, H), SG, longest, opt.total_levels());
    std::vector<group_history*> histories;  // [heads][S]
    if (use_history) {
      histories.resize(H * S);
      for (std::size_t s = 0; s < S; ++s) {
        std::vector<group_history>& of_sequence = seq_hist_[ids[s]];
        if (!histories_fit(of_sequence, H, G)) of_sequence.assign(H, group_history(G));
        for (std::size_t h = 0; h < H; ++h) histories[h * S + s] = &of_sequence[h];
      }
    }
    std::vector<certificate> certs_all(H * SG);
    for_heads(
        threads,
        [&](std::size_t h, std::size_t w) {
          const noise_key nk{step, layer, layer_ ? std::uint32_t(h) : kv_head, 0};
          options head_opt = opt;
          head_opt.variant = variant_of(variant, h, G, H);
          const std::span<const int> hint_span =
              hints != nullptr ? std::span<const int>(hints + h * SG, SG) : std::span<const int>();
          dispatch(dtype_, [&](auto t) {
            with_sequence_views<decltype(t)>(k, v, own, h, [&](auto views) {
              const auto queries = std::span<const float>(q.data + h * SG * d, SG * d);
              const auto o = std::span<float>(out + h * SG * v.d, SG * v.d);
              const auto c = std::span<certificate>(certs_all.data() + h * SG, SG);
              const auto id_span = std::span<const std::uint64_t>(ids);
              if (use_history)
                certattn::attend_sequences(queries, G, views, idx_[h], nk, id_span, head_opt, o, c, *ws_[w],
                                           std::span<group_history* const>(histories.data() + h * S, S));
              else
                certattn::attend_sequences(queries, G, views, idx_[h], nk, id_span, head_opt, o, c, *ws_[w],
                                           hint_span);
            });
          });
        },
        H);
    for (std::size_t i = 0; i < H * SG; ++i) certs[i] = to_record(certs_all[i]);
  }

  /// Forget the histories: every one (a new sequence in this index's slot; no sequence
  /// given), or those of one sequence of the shared-prefix calls (a sample that ended).
  void reset_history(std::optional<std::uint64_t> sequence) {
    std::lock_guard<std::mutex> lk(mu_);
    if (sequence) {
      seq_hist_.erase(*sequence);
      return;
    }
    for (group_history& h : hist_) h.reset();
    seq_hist_.clear();
  }
  /// The histories of attend() (no sequence given) or of one sequence of the shared-prefix
  /// calls (empty before its first call with a history).
  history_snapshot snapshot(std::optional<std::uint64_t> sequence) const {
    std::lock_guard<std::mutex> lk(mu_);
    if (!sequence) return {hist_};
    const auto it = seq_hist_.find(*sequence);
    return {it == seq_hist_.end() ? std::vector<group_history>() : it->second};
  }

  const key_index& head(std::size_t h) const { return idx_.at(h); }
  /// Held by callers that read the indices without the members above (the reference, the
  /// C++ timing), so that an append from another thread cannot run meanwhile.
  std::mutex& mutex() const { return mu_; }
  void check_cache(const cache_arg& k, const cache_arg& v) const {
    if (k.dtype != dtype_.key)
      throw py::type_error(std::string("k: dtype ") + dtype_name(k.dtype) + " differs from the index's (" +
                           dtype_name(dtype_.key) + ")");
    if (v.dtype != dtype_.value)
      throw py::type_error(std::string("v: dtype ") + dtype_name(v.dtype) + " differs from the index's (" +
                           dtype_name(dtype_.value) + ")");
    if (k.layer != layer_ || k.heads != idx_.size())
      throw py::value_error("k: " +
                            (k.layer ? "[kv_heads = " + std::to_string(k.heads) + ", n, d]" : std::string("[n, d]")) +
                            " does not match the index (" +
                            (layer_ ? "built on a layer of " + std::to_string(idx_.size()) + " KV heads"
                                    : std::string("built on one KV head")) +
                            ")");
    if (k.d != d_)
      throw py::value_error("k: head_dim " + std::to_string(k.d) + " != the index's " + std::to_string(d_));
  }

 private:
  template <class F>
  void for_heads(std::size_t threads, F&& f, std::size_t items = 0) {
    if (items == 0) items = idx_.size();
    threads = std::min(std::max<std::size_t>(threads, 1), items);
    if (threads <= 1) {
      for (std::size_t h = 0; h < items; ++h) f(h, 0);
      return;
    }
    if (!pool_ || pool_->size() != threads) pool_ = std::make_unique<thread_pool>(threads);
    pool_->parallel_for(items, [&](std::size_t h, std::size_t w) { f(h, w); });
  }

  void ensure_workspaces(std::size_t workers, std::size_t group, std::size_t n, int levels) {
    workers = std::max<std::size_t>(workers, 1);
    if (ws_.size() < workers) ws_.resize(workers);
    for (std::size_t w = 0; w < workers; ++w) {
      auto& ws = ws_[w];
      if (ws && ws->group() >= group && ws->max_tokens() >= n && ws->max_levels() >= levels) continue;
      // Grow geometrically past the reserve, so that decoding does not reallocate per token.
      std::size_t cap = std::max(n, reserved_);
      if (ws && cap <= ws->max_tokens() * 5 / 4) cap = ws->max_tokens() * 5 / 4 + 1;
      if (ws && n > ws->max_tokens()) cap = std::max(cap, n + n / 4);
      const std::size_t g = std::max(group, ws ? ws->group() : 0);
      const int lv = std::max(levels, ws ? ws->max_levels() : options{}.total_levels());
      ws = std::make_unique<attend_workspace>(g, d_, cap, lv);
    }
  }

  std::vector<key_index> idx_;
  dtype_pair dtype_;
  bool layer_ = false;
  std::size_t d_ = 0, reserved_ = 0;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<attend_workspace>> ws_;
  std::unique_ptr<thread_pool> pool_;
  std::vector<group_history> hist_;  // [kv_heads], for the group size of the calls
  // The shared-prefix calls' histories: per sequence id, [kv_heads].
  std::map<std::uint64_t, std::vector<group_history>> seq_hist_;
};

py::array_t<cert_record> new_certs(std::size_t heads, std::size_t group) {
  return py::array_t<cert_record>({py::ssize_t(heads), py::ssize_t(group)});
}

/// q [heads][positions * group][d]: a whole number of positions per KV head.
void check_positions(const query_arg& q, std::size_t positions) {
  if (positions == 0) throw py::value_error("positions must be > 0");
  if (q.group % positions != 0)
    throw py::value_error("q: " + std::to_string(q.group) + " queries per KV head are not " +
                          std::to_string(positions) + " positions of a group");
}

/// level_hints as C-contiguous int32 (data null for None): count integers, one per query
/// head, as the previous call's certificates['level'] hold them; refused beside a history,
/// which carries the hints itself.
struct hints_arg {
  py::array_t<std::int32_t> array;
  const std::int32_t* data = nullptr;
};

hints_arg hints_of(const py::object& in, std::size_t count, bool with_history) {
  hints_arg h;
  if (in.is_none()) return h;
  if (with_history)
    throw py::value_error("level_hints and history exclude each other (the history carries the hints)");
  h.array = py::array_t<std::int32_t, py::array::c_style>::ensure(in);
  if (!h.array || std::size_t(h.array.size()) != count)
    throw py::value_error("level_hints: expected " + std::to_string(count) +
                          " integers (one per query head), e.g. the previous step's certificates['level']");
  h.data = h.array.data();
  return h;
}

py::tuple attend_py(const py::array& q_in, const py::array& k_in, const py::array& v_in, py_index& index,
                    const options& opt, std::uint64_t step, std::uint32_t layer, std::uint32_t kv_head,
                    std::uint64_t sequence, const py::object& hints_in, bool use_history, const py::object& out_in,
                    std::size_t threads, const py_variant* variant, std::size_t positions,
                    const scales_arg& kv_scales) {
  const query_arg q = queries_of(q_in);
  const cache_arg k = cache_of(k_in, "k", kv_scales.first), v = cache_of(v_in, "v", kv_scales.second);
  check_pair(k, v);
  index.check_cache(k, v);
  check_positions(q, positions);
  if (q.heads != k.heads)
    throw py::value_error("q has " + std::to_string(q.heads) + " KV-head groups, the cache " + std::to_string(k.heads));
  if (q.d != k.d)
    throw py::value_error("q: head_dim " + std::to_string(q.d) + " != the cache's " + std::to_string(k.d));
  const hints_arg hint_arg = hints_of(hints_in, q.heads * q.group / positions, use_history);
  const std::int32_t* hints = hint_arg.data;
  py::array_t<float> out;
  if (out_in.is_none()) {
    out = py::array_t<float>({py::ssize_t(q.heads), py::ssize_t(q.group), py::ssize_t(v.d)});
  } else {
    out = py::array_t<float>::ensure(out_in);
    if (!out || !py::isinstance<py::array_t<float>>(out_in) || !(out.flags() & py::array::c_style) ||
        !out.writeable() || std::size_t(out.size()) != q.heads * q.group * v.d)
      throw py::value_error("out: expected a writable C-contiguous float32 array of " +
                            std::to_string(q.heads * q.group * v.d) + " elements");
  }
  auto certs = new_certs(q.heads, q.group);
  float* o = out.mutable_data();
  cert_record* c = certs.mutable_data();
  {
    py::gil_scoped_release nogil;
    index.attend(q, k, v, opt, step, layer, kv_head, sequence, hints, use_history, o, c, threads, variant,
                 positions);
  }
  return py::make_tuple(out, certs);
}

template <class F>
void run_heads(std::size_t heads, std::size_t threads, F&& f) {
  threads = std::min(std::max<std::size_t>(threads, 1), heads);
  if (threads <= 1) {
    for (std::size_t h = 0; h < heads; ++h) f(h, 0);
    return;
  }
  thread_pool pool(threads);
  pool.parallel_for(heads, [&](std::size_t h, std::size_t w) { f(h, w); });
}

/// The queries against the cache they attend over: the same KV heads and head_dim.
void check_queries(const query_arg& q, const cache_arg& k) {
  if (q.heads != k.heads) throw py::value_error("q and the cache have different kv_heads");
  if (q.d != k.d) throw py::value_error("q: head_dim differs from the cache's");
}

void check_softmax_scale(double softmax_scale) {
  if (!(softmax_scale >= 0) || !std::isfinite(softmax_scale))
    throw py::value_error("softmax_scale must be finite and >= 0");
}

py::array_t<float> dense_py(const py::array& q_in, const py::array& k_in, const py::array& v_in, double softmax_scale,
                            std::size_t threads, const py_variant* variant, std::size_t positions,
                            const scales_arg& kv_scales) {
  const query_arg q = queries_of(q_in);
  const cache_arg k = cache_of(k_in, "k", kv_scales.first), v = cache_of(v_in, "v", kv_scales.second);
  check_pair(k, v);
  check_queries(q, k);
  check_positions(q, positions);
  check_softmax_scale(softmax_scale);
  py::array_t<float> out({py::ssize_t(q.heads), py::ssize_t(q.group), py::ssize_t(v.d)});
  float* o = out.mutable_data();
  {
    py::gil_scoped_release nogil;
    const std::size_t PG = q.group, G = PG / positions, d = q.d, dv = v.d;
    std::vector<dense_workspace> ws;
    for (std::size_t i = 0; i < std::min(std::max<std::size_t>(threads, 1), q.heads); ++i)
      ws.push_back(make_dense_workspace(PG, d));
    run_heads(q.heads, threads, [&](std::size_t h, std::size_t w) {
      dispatch(pair_of(k, v), [&](auto t) {
        const auto queries = std::span<const float>(q.data + h * PG * d, PG * d);
        const auto o_h = std::span<float>(o + h * PG * dv, PG * dv);
        if (positions > 1)
          dense_attend_positions(queries, positions, G, k.view_with<decltype(t)>(v, h), float(softmax_scale), o_h,
                                 ws[w], variant_of(variant, h, G, q.heads));
        else
          dense_attend(queries, G, k.view_with<decltype(t)>(v, h), float(softmax_scale), o_h, ws[w], 0, SIZE_MAX,
                       variant_of(variant, h, G, q.heads));
      });
    });
    for (std::size_t i = 0; i < q.heads * PG * dv; ++i)
      if (!std::isfinite(o[i]))
        throw error("dense_attend: the output holds a NaN or Inf (a NaN or Inf in q, k or v, or scores beyond float)");
  }
  return out;
}

/// x [..., head_dim] (float32) stored in a quantized format, as the bytes of its rows
/// [rows][row_bytes]: ggml's quantize_row rounding for q8_0 and q4_0, round-to-nearest-even
/// codes of x / scale for fp8 (e4m3 saturating). The Python layer views them as the
/// format's structured dtype.
py::array_t<std::uint8_t> quantize_py(const py::array_t<float, py::array::c_style | py::array::forcecast>& x,
                                      const std::string& format, float scale) {
  if (x.ndim() < 1 || x.shape(x.ndim() - 1) == 0) throw py::value_error("x: expected [..., head_dim]");
  const std::size_t d = std::size_t(x.shape(x.ndim() - 1)), rows = d == 0 ? 0 : std::size_t(x.size()) / d;
  const cache_format f = format == "q8_0"       ? cache_format::q8_0
                         : format == "q4_0"     ? cache_format::q4_0
                         : format == "fp8_e4m3" ? cache_format::fp8_e4m3
                         : format == "fp8_e5m2" ? cache_format::fp8_e5m2
                                                : throw py::value_error("format: expected q8_0, q4_0, fp8_e4m3 or "
                                                                        "fp8_e5m2, got '" + format + "'");
  const auto run = [&]<class T>(T) {
    check_row_channels<T>(d, "head_dim");
    if constexpr (fp8_element<T>) check_cache_scale(scale, "scale");
    const std::size_t row_bytes = format_traits<T>::row_bytes(d);
    py::array_t<std::uint8_t> out({py::ssize_t(rows), py::ssize_t(row_bytes)});
    const float* src = x.data();
    std::uint8_t* dst = out.mutable_data();
    for (std::size_t r = 0; r < rows; ++r) {
      T* row = reinterpret_cast<T*>(dst + r * row_bytes);
      if constexpr (fp8_element<T>)
        quantize_row(src + r * d, d, scale, row);
      else
        quantize_row(src + r * d, d, row);
    }
    return out;
  };
  switch (f) {
    case cache_format::q8_0: return run(block_q8_0{});
    case cache_format::q4_0: return run(block_q4_0{});
    case cache_format::fp8_e4m3: return run(fp8_e4m3{});
    default: return run(fp8_e5m2{});
  }
}

struct exact_record {
  double max_score, denominator, value_scale, output_norm;
};

py::tuple exact_py(const py::array& q_in, const py::array& k_in, const py::array& v_in, double softmax_scale,
                   const py_variant* variant, const scales_arg& kv_scales) {
  const query_arg q = queries_of(q_in);
  const cache_arg k = cache_of(k_in, "k", kv_scales.first), v = cache_of(v_in, "v", kv_scales.second);
  check_pair(k, v);
  check_queries(q, k);
  check_softmax_scale(softmax_scale);
  py::array_t<double> out({py::ssize_t(q.heads), py::ssize_t(q.group), py::ssize_t(v.d)});
  py::array_t<exact_record> info({py::ssize_t(q.heads), py::ssize_t(q.group)});
  double* o = out.mutable_data();
  exact_record* r = info.mutable_data();
  {
    py::gil_scoped_release nogil;
    for (std::size_t h = 0; h < q.heads; ++h)
      dispatch(pair_of(k, v), [&](auto t) {
        with_matrices<decltype(t)>(k, v, h, [&](const auto& keys, const auto& values) {
          for (std::size_t g = 0; g < q.group; ++g) {
            const std::size_t row = h * q.group + g;
            const exact_result x =
                exact_attention(std::span<const float>(q.data + row * q.d, q.d), keys, values, softmax_scale,
                                head_slice(variant_of(variant, h, q.group, q.heads), g));
            std::copy(x.output.begin(), x.output.end(), o + row * v.d);
            r[row] = {x.max_score, x.denominator, x.value_scale, x.output_norm};
          }
        });
      });
  }
  return py::make_tuple(out, info);
}

reference_extras extras_of(const py_index* index, std::size_t h, int hint) {
  reference_extras e;
  if (index != nullptr) {
    const key_index& x = index->head(h);
    e.value_center = x.value_center();
    e.value_cap = x.value_cap();
    e.reach_floor = x.reach_floor();
  }
  e.level_hint = hint;
  return e;
}

/// The reference of one attend call: reference_attend_group() per KV head, so that the
/// routing decisions within a group (sample_budget(), kOverBudget, kJoined) and, given the
/// histories as they were before the call, across calls (kRouted) are the fast path's.
py::tuple reference_py(const py::array& q_in, const py::array& k_in, const py::array& v_in, const py_index* index,
                       const options& opt, std::uint64_t step, std::uint32_t layer, std::uint32_t kv_head,
                       std::uint64_t sequence, const py::object& hints_in, const history_snapshot* history,
                       const py_variant* variant, const scales_arg& kv_scales) {
  const query_arg q = queries_of(q_in);
  const cache_arg k = cache_of(k_in, "k", kv_scales.first), v = cache_of(v_in, "v", kv_scales.second);
  check_pair(k, v);
  if (index != nullptr) {
    index->check_cache(k, v);
    if (index->size() != k.n)
      throw py::value_error("index holds " + std::to_string(index->size()) + " tokens, the cache " +
                            std::to_string(k.n));
  }
  check_queries(q, k);
  const hints_arg hints = hints_of(hints_in, q.heads * q.group, history != nullptr);
  std::vector<group_history> start;
  if (history != nullptr) start = start_histories(*history, q.heads, q.group, "history");
  const std::int32_t* hp = hints.data;
  py::array_t<double> out({py::ssize_t(q.heads), py::ssize_t(q.group), py::ssize_t(v.d)});
  auto certs = new_certs(q.heads, q.group);
  double* o = out.mutable_data();
  cert_record* c = certs.mutable_data();
  {
    py::gil_scoped_release nogil;
    std::unique_lock<std::mutex> lk;
    if (index != nullptr) lk = std::unique_lock<std::mutex>(index->mutex());
    if (index != nullptr && index->size() != k.n)
      throw error("index holds " + std::to_string(index->size()) + " tokens, the cache " + std::to_string(k.n));
    const std::size_t G = q.group, d = q.d;
    for (std::size_t h = 0; h < q.heads; ++h) {
      const noise_key nk{step, layer, k.layer ? std::uint32_t(h) : kv_head, sequence};
      reference_extras ex = extras_of(index, h, -1);
      if (history != nullptr) ex.history = &start[h];
      const std::span<const int> hint_span = hp ? std::span<const int>(hp + h * G, G) : std::span<const int>();
      options head_opt = opt;
      head_opt.variant = variant_of(variant, h, G, q.heads);
      const std::vector<reference_result> rs = dispatch(pair_of(k, v), [&](auto t) {
        return with_matrices<decltype(t)>(k, v, h, [&](const auto& keys, const auto& values) {
          return reference_attend_group(std::span<const float>(q.data + h * G * d, G * d), G, keys, values,
                                        head_opt, nk, ex, hint_span);
        });
      });
      for (std::size_t g = 0; g < G; ++g) {
        const std::size_t row = h * G + g;
        std::copy(rs[g].output.begin(), rs[g].output.end(), o + row * v.d);
        c[row] = to_record(rs[g].cert);
      }
    }
  }
  return py::make_tuple(out, certs);
}

// --- shared prefixes (attend_sequences) ---------------------------------------------------

/// The arguments every shared-prefix entry point checks alike: the prefix cache k, v,
/// each sequence's own tokens, and q [heads][S * group][d] with S = own.size().
struct sequences_args {
  query_arg q;
  cache_arg k, v;
  std::vector<std::pair<cache_arg, cache_arg>> own;
  std::size_t group = 0;  // query heads per KV head and sequence
};

sequences_args sequences_of(const py::array& q_in, const py::array& k_in, const py::array& v_in,
                            const std::vector<py::array>& own_k, const std::vector<py::array>& own_v,
                            const scales_arg& kv_scales) {
  sequences_args a;
  a.q = queries_of(q_in);
  a.k = cache_of(k_in, "k", kv_scales.first);
  a.v = cache_of(v_in, "v", kv_scales.second);
  check_pair(a.k, a.v);
  check_queries(a.q, a.k);
  a.own = own_caches(own_k, own_v, a.k, a.v, kv_scales);
  const std::size_t S = a.own.size();
  if (a.q.group % S != 0)
    throw py::value_error("q: " + std::to_string(a.q.group) + " queries per KV head are not " + std::to_string(S) +
                          " sequences of a group");
  a.group = a.q.group / S;
  return a;
}

std::vector<std::uint64_t> sequence_ids_of(const std::vector<std::uint64_t>& ids, std::size_t S) {
  if (ids.size() != S)
    throw py::value_error("sequences: " + std::to_string(ids.size()) + " ids for " + std::to_string(S) +
                          " sequences (one per sequence)");
  return ids;
}

py::tuple attend_sequences_py(const py::array& q_in, const py::array& k_in, const py::array& v_in, py_index& index,
                              const std::vector<py::array>& own_k, const std::vector<py::array>& own_v,
                              const std::vector<std::uint64_t>& ids_in, const options& opt, std::uint64_t step,
                              std::uint32_t layer, std::uint32_t kv_head, const py::object& hints_in,
                              bool use_history, std::size_t threads, const py_variant* variant,
                              const scales_arg& kv_scales) {
  const sequences_args a = sequences_of(q_in, k_in, v_in, own_k, own_v, kv_scales);
  index.check_cache(a.k, a.v);
  const std::vector<std::uint64_t> ids = sequence_ids_of(ids_in, a.own.size());
  const std::size_t H = a.q.heads, SG = a.q.group;
  const hints_arg hints = hints_of(hints_in, H * SG, use_history);
  py::array_t<float> out({py::ssize_t(H), py::ssize_t(SG), py::ssize_t(a.v.d)});
  auto certs = new_certs(H, SG);
  float* o = out.mutable_data();
  cert_record* c = certs.mutable_data();
  {
    py::gil_scoped_release nogil;
    index.attend_sequences(a.q, a.k, a.v, a.own, opt, step, layer, kv_head, ids, hints.data, use_history, o, c,
                           threads, variant);
  }
  return py::make_tuple(out, certs);
}

/// The reference of attend_sequences_py: reference_attend_sequences() per KV head over the
/// same joined views, with the index's value centre, cap and reach floor, and given
/// `histories` (one snapshot per sequence, taken before the call) the histories the call
/// started from.
py::tuple reference_sequences_py(const py::array& q_in, const py::array& k_in, const py::array& v_in,
                                 const py_index& index, const std::vector<py::array>& own_k,
                                 const std::vector<py::array>& own_v, const std::vector<std::uint64_t>& ids_in,
                                 const options& opt, std::uint64_t step, std::uint32_t layer, std::uint32_t kv_head,
                                 const py::object& hints_in,
                                 const std::optional<std::vector<history_snapshot>>& histories,
                                 const py_variant* variant, const scales_arg& kv_scales) {
  const sequences_args a = sequences_of(q_in, k_in, v_in, own_k, own_v, kv_scales);
  index.check_cache(a.k, a.v);
  const std::vector<std::uint64_t> ids = sequence_ids_of(ids_in, a.own.size());
  const std::size_t H = a.q.heads, SG = a.q.group, G = a.group, d = a.q.d, dv = a.v.d, S = a.own.size();
  const hints_arg hints = hints_of(hints_in, H * SG, histories.has_value());
  if (histories && histories->size() != S)
    throw py::value_error("history: " + std::to_string(histories->size()) + " snapshots for " + std::to_string(S) +
                          " sequences (one per sequence, KeyIndex.history_snapshot(sequence=id))");
  // What attend_sequences() starts from: sequence s's histories [heads], and the call's
  // pointers to them [heads][S].
  std::vector<std::vector<group_history>> start;
  std::vector<const group_history*> start_of;
  if (histories) {
    for (std::size_t s = 0; s < S; ++s)
      start.push_back(start_histories((*histories)[s], H, G, "history[" + std::to_string(s) + "]"));
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t s = 0; s < S; ++s) start_of.push_back(&start[s][h]);
  }
  py::array_t<double> out({py::ssize_t(H), py::ssize_t(SG), py::ssize_t(dv)});
  auto certs = new_certs(H, SG);
  double* o = out.mutable_data();
  cert_record* c = certs.mutable_data();
  {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lk(index.mutex());
    if (index.size() != a.k.n)
      throw error("index holds " + std::to_string(index.size()) + " tokens, the prefix cache " +
                  std::to_string(a.k.n));
    for (std::size_t h = 0; h < H; ++h) {
      const noise_key nk{step, layer, a.k.layer ? std::uint32_t(h) : kv_head, 0};
      options head_opt = opt;
      head_opt.variant = variant_of(variant, h, G, H);
      const std::span<const int> hint_span =
          hints.data == nullptr ? std::span<const int>() : std::span<const int>(hints.data + h * SG, SG);
      const std::vector<reference_result> rs = dispatch(pair_of(a.k, a.v), [&](auto t) {
        return with_sequence_views<decltype(t)>(a.k, a.v, a.own, h, [&](auto views) {
          return reference_attend_sequences(
              std::span<const float>(a.q.data + h * SG * d, SG * d), G, views, a.k.n, head_opt, nk,
              std::span<const std::uint64_t>(ids), extras_of(&index, h, -1), hint_span,
              histories ? std::span<const group_history* const>(start_of.data() + h * S, S)
                        : std::span<const group_history* const>());
        });
      });
      for (std::size_t i = 0; i < SG; ++i) {
        std::copy(rs[i].output.begin(), rs[i].output.end(), o + (h * SG + i) * dv);
        c[h * SG + i] = to_record(rs[i].cert);
      }
    }
  }
  return py::make_tuple(out, certs);
}

/// Exact attention of the sequences with the dense kernel (dense_attend_sequences: the
/// shared tokens read once for every sequence), the shared-prefix call's baseline.
py::array_t<float> dense_sequences_py(const py::array& q_in, const py::array& k_in, const py::array& v_in,
                                      const std::vector<py::array>& own_k, const std::vector<py::array>& own_v,
                                      double softmax_scale, std::size_t threads, const py_variant* variant,
                                      const scales_arg& kv_scales) {
  const sequences_args a = sequences_of(q_in, k_in, v_in, own_k, own_v, kv_scales);
  check_softmax_scale(softmax_scale);
  const std::size_t H = a.q.heads, SG = a.q.group, G = a.group, d = a.q.d, dv = a.v.d;
  py::array_t<float> out({py::ssize_t(H), py::ssize_t(SG), py::ssize_t(dv)});
  float* o = out.mutable_data();
  {
    py::gil_scoped_release nogil;
    std::vector<dense_workspace> ws;
    for (std::size_t i = 0; i < std::min(std::max<std::size_t>(threads, 1), H); ++i)
      ws.push_back(make_dense_workspace(SG, d));
    run_heads(H, threads, [&](std::size_t h, std::size_t w) {
      dispatch(pair_of(a.k, a.v), [&](auto t) {
        with_sequence_views<decltype(t)>(a.k, a.v, a.own, h, [&](auto views) {
          dense_attend_sequences(std::span<const float>(a.q.data + h * SG * d, SG * d), G, views, a.k.n,
                                 float(softmax_scale), std::span<float>(o + h * SG * dv, SG * dv), ws[w],
                                 variant_of(variant, h, G, H));
        });
      });
    });
    for (std::size_t i = 0; i < H * SG * dv; ++i)
      if (!std::isfinite(o[i]))
        throw error("dense_attend_sequences: the output holds a NaN or Inf (a NaN or Inf in q, k or v, or scores "
                    "beyond float)");
  }
  return out;
}

/// One row of the audit: counts and extremes of one (certificate, scale, epsilon).
struct audit_counts {
  std::size_t calls = 0, certified = 0, fallbacks = 0, violations = 0, checked = 0, disagreements = 0;
  double max_ratio = 0, p90_ratio = 0, keys_frac = 0, bound_max = 0;
  std::string first_disagreement;
};

std::string compare_reference(const certificate& fast, const float* fast_out, const reference_result& ref,
                              double value_scale) {
  const certificate& r = ref.cert;
  if (fast.certified != r.certified) return "certified differs";
  if (fast.exact != r.exact) return "exact differs";
  if (fast.level != r.level) return "level " + std::to_string(fast.level) + " vs " + std::to_string(r.level);
  if (fast.heavy != r.heavy) return "heavy " + std::to_string(fast.heavy) + " vs " + std::to_string(r.heavy);
  if (fast.sampled != r.sampled) return "sampled " + std::to_string(fast.sampled) + " vs " + std::to_string(r.sampled);
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < ref.output.size(); ++i) {
    const double t = double(fast_out[i]) - ref.output[i];
    diff += t * t;
    norm += ref.output[i] * ref.output[i];
  }
  diff = std::sqrt(diff);
  norm = std::max(std::sqrt(norm), 1e-6 * value_scale);
  if (diff > 1e-5 * norm) return "output differs by " + std::to_string(diff / norm) + " relative";
  return {};
}

/// certattn-bench audit's check (bench/cmd_audit.cpp, audit_setting) on arrays: k, v
/// [kv_heads, n, d], queries [steps, kv_heads, group, d] float32. Every call is compared
/// with exact attention in double; every check_every-th call also with the reference.
/// Routing is off, as in the bench: the audit studies the certificates themselves, and
/// an exact answer (over budget, routed) would have none to check.
std::vector<audit_counts> audit_py(const py::array& k_in, const py::array& v_in, const py::array& q_in,
                                   const std::vector<std::string>& certificates, const std::vector<std::string>& scales,
                                   const std::vector<double>& eps, double delta, std::uint64_t seed,
                                   std::size_t check_every, std::size_t threads) {
  const cache_arg k = cache_of(k_in, "k"), v = cache_of(v_in, "v");
  check_pair(k, v);
  if (k.d != v.d) throw py::value_error("audit: v must have k's head_dim (a latent cache is not audited here)");
  if (!py::isinstance<py::array_t<float>>(q_in) || q_in.ndim() != 4 || !(q_in.flags() & py::array::c_style))
    throw py::value_error("queries: expected C-contiguous float32 [steps, kv_heads, group, head_dim]");
  const std::size_t S = std::size_t(q_in.shape(0)), H = k.heads, G = std::size_t(q_in.shape(2)), n = k.n, d = k.d;
  if (std::size_t(q_in.shape(1)) != H || std::size_t(q_in.shape(3)) != d)
    throw py::value_error("queries: shape [steps, " + std::to_string(q_in.shape(1)) + ", group, " +
                          std::to_string(q_in.shape(3)) + "] does not match the cache's [" + std::to_string(H) +
                          " KV heads, head_dim " + std::to_string(d) + "]");
  if (S == 0 || G == 0) throw py::value_error("queries: no steps or no query heads");
  if (check_every == 0) throw py::value_error("check_every must be >= 1");
  struct cfg {
    options opt;
  };
  std::vector<cfg> cfgs;
  for (const std::string& c : certificates)
    for (const std::string& s : scales)
      for (double e : eps) cfgs.push_back({make_options(e, delta, s, c, 64, 2, 32, 6, 0.0, seed, "off", cost_model{}.fixed,
                                            cost_model{}.per_key, cost_model{}.give_up, true)});
  if (cfgs.empty()) throw py::value_error("audit: at least one certificate, scale and epsilon");
  if (n <= 64) throw py::value_error("audit: the cache must hold more than the 64-token window");
  const float* qd = static_cast<const float*>(q_in.data());
  const std::size_t C = cfgs.size(), calls = S * H * G;
  auto query = [&](std::size_t s, std::size_t h, std::size_t g) { return qd + ((s * H + h) * G + g) * d; };
  std::vector<audit_counts> rows(C);
  {
    py::gil_scoped_release nogil;
    for (float x : std::span<const float>(qd, calls * d))
      if (!std::isfinite(x)) throw error("queries contain a NaN or Inf");
    const std::size_t T = std::max<std::size_t>(threads, 1);
    std::vector<key_index> idx(H, key_index(d));
    run_heads(H, T, [&](std::size_t h, std::size_t) {
      dispatch(pair_of(k, v), [&](auto t) { idx[h].build(k.view_with<decltype(t)>(v, h)); });
    });
    std::vector<exact_result> exact(calls);
    run_heads(S * H, T, [&](std::size_t item, std::size_t) {
      const std::size_t s = item / H, h = item % H;
      for (std::size_t g = 0; g < G; ++g)
        exact[item * G + g] = dispatch(pair_of(k, v), [&](auto t) {
          return with_matrices<decltype(t)>(k, v, h, [&](const auto& keys, const auto& values) {
            return exact_attention(std::span<const float>(query(s, h, g), d), keys, values);
          });
        });
    });
    struct rec {
      float ratio = 0, keys = 0, bound = 0;
      std::uint8_t certified = 0, fallback = 0, violation = 0, checked = 0, disagree = 0;
    };
    std::vector<rec> recs(C * calls);
    std::vector<std::string> first(C * H);
    const std::size_t workers = std::min(T, H * C);
    std::vector<std::unique_ptr<attend_workspace>> ws(workers);
    for (auto& w : ws) w = std::make_unique<attend_workspace>(G, d, n);
    run_heads(H * C, T, [&](std::size_t item, std::size_t wi) {
      const std::size_t h = item / C, ci = item % C;
      const options& opt = cfgs[ci].opt;
      std::vector<float> out(G * d);
      std::vector<certificate> certs(G);
      std::vector<int> prev(G, -1);
      for (std::size_t s = 0; s < S; ++s) {
        const noise_key nk{std::uint64_t(s), std::uint32_t(ci), std::uint32_t(h)};
        const std::span<const int> hints = s == 0 ? std::span<const int>() : std::span<const int>(prev);
        dispatch(pair_of(k, v), [&](auto t) {
          attend_group(std::span<const float>(query(s, h, 0), G * d), G, k.view_with<decltype(t)>(v, h), idx[h], nk,
                       opt, std::span<float>(out), std::span<certificate>(certs), *ws[wi], hints);
        });
        for (std::size_t g = 0; g < G; ++g) {
          const std::size_t call = (s * H + h) * G + g;
          const certificate& cert = certs[g];
          const exact_result& x = exact[call];
          rec& r = recs[ci * calls + call];
          r.keys = float(cert.keys_read);
          r.certified = cert.certified;
          r.fallback = cert.exact && cert.level < 0;
          const double d_at_c = x.denominator * std::exp(x.max_score - cert.max_score);
          const double sv = opt.scale == error_scale::kDenominator ? d_at_c
                            : opt.scale == error_scale::kOutputNorm ? x.output_norm
                                                                    : x.value_scale;
          double err = 0;
          if (opt.scale == error_scale::kDenominator) {
            err = std::fabs(cert.denominator - d_at_c);
          } else {
            for (std::size_t i = 0; i < d; ++i) {
              const double t = double(out[g * d + i]) - x.output[i];
              err += t * t;
            }
            err = std::sqrt(err);
          }
          if (cert.certified) {
            r.ratio = float(err / (opt.epsilon * sv));
            r.bound = float(cert.bound / opt.epsilon);
            r.violation = err > opt.epsilon * sv;
          }
          if ((call + ci) % check_every == 0) {
            const reference_result ref = dispatch(pair_of(k, v), [&](auto t) {
              using E = decltype(t);
              reference_extras ex;
              ex.value_center = idx[h].value_center();
              ex.value_cap = idx[h].value_cap();
              ex.reach_floor = idx[h].reach_floor();
              ex.level_hint = hints.empty() ? -1 : hints[g];
              return with_matrices<E>(k, v, h, [&](const auto& keys, const auto& values) {
                return reference_attend(std::span<const float>(query(s, h, g), d), keys, values, opt, nk, ex);
              });
            });
            r.checked = 1;
            const std::string why = compare_reference(cert, out.data() + g * d, ref, x.value_scale);
            if (!why.empty()) {
              r.disagree = 1;
              if (first[item].empty())
                first[item] = "step " + std::to_string(s) + " head " + std::to_string(h) + " query " +
                              std::to_string(g) + ": " + why;
            }
          }
        }
        for (std::size_t g = 0; g < G; ++g) prev[g] = certs[g].level;
      }
    });
    for (std::size_t ci = 0; ci < C; ++ci) {
      audit_counts& a = rows[ci];
      a.calls = calls;
      std::vector<double> ratios;
      double keys = 0;
      for (std::size_t call = 0; call < calls; ++call) {
        const rec& r = recs[ci * calls + call];
        a.certified += r.certified;
        a.fallbacks += r.fallback;
        a.violations += r.violation;
        a.checked += r.checked;
        a.disagreements += r.disagree;
        keys += r.keys;
        if (r.certified) {
          ratios.push_back(r.ratio);
          a.max_ratio = std::max(a.max_ratio, double(r.ratio));
          a.bound_max = std::max(a.bound_max, double(r.bound));
        }
      }
      if (!ratios.empty()) {  // the bench's quantile: linear interpolation between order statistics
        std::sort(ratios.begin(), ratios.end());
        const double pos = 0.9 * double(ratios.size() - 1);
        const std::size_t lo = std::size_t(pos);
        const std::size_t hi = std::min(lo + 1, ratios.size() - 1);
        a.p90_ratio = ratios[lo] + (pos - double(lo)) * (ratios[hi] - ratios[lo]);
      }
      a.keys_frac = keys / double(calls) / double(n);
      for (std::size_t h = 0; h < H; ++h)
        if (a.first_disagreement.empty() && !first[h * C + ci].empty()) a.first_disagreement = first[h * C + ci];
    }
  }
  return rows;
}

/// The same certified calls made from C++ directly (attend_group per KV head on strided_kv
/// views, workspaces made beforehand, certattn::thread_pool for a layer), timed per
/// repeat: the baseline of the binding's overhead (python/bench/overhead.py). Step r of
/// the repeats uses noise_key step first_step + r, as the Python loop does.
std::vector<double> cpp_attend_seconds(const py::array& q_in, const py::array& k_in, const py::array& v_in,
                                       py_index& index, const options& opt, std::uint64_t first_step,
                                       std::size_t threads, std::size_t repeats) {
  const query_arg q = queries_of(q_in);
  const cache_arg k = cache_of(k_in, "k"), v = cache_of(v_in, "v");
  check_pair(k, v);
  if (v.d != k.d) throw py::value_error("cpp_attend_seconds: v must have k's head_dim");
  index.check_cache(k, v);
  if (q.heads != k.heads || q.d != k.d) throw py::value_error("q does not match the cache");
  const std::size_t H = q.heads, G = q.group, d = q.d;
  threads = std::min(std::max<std::size_t>(threads, 1), H);
  std::vector<double> seconds(repeats);
  py::gil_scoped_release nogil;
  std::lock_guard<std::mutex> lk(index.mutex());
  if (index.size() != k.n) throw error("index and cache sizes differ");
  std::vector<attend_workspace> ws;
  for (std::size_t w = 0; w < threads; ++w) ws.emplace_back(G, d, k.n);
  std::vector<float> out(H * G * d);
  std::vector<certificate> certs(H * G);
  thread_pool pool(threads);
  for (std::size_t r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    auto one = [&](std::size_t h, std::size_t w) {
      dispatch(pair_of(k, v), [&](auto t) {
        attend_group(std::span<const float>(q.data + h * G * d, G * d), G, k.view_with<decltype(t)>(v, h),
                     index.head(h), noise_key{first_step + r, 0u, k.layer ? h : 0u}, opt,
                     std::span<float>(out.data() + h * G * d, G * d), std::span<certificate>(certs.data() + h * G, G),
                     ws[w]);
      });
    };
    if (threads == 1)
      for (std::size_t h = 0; h < H; ++h) one(h, 0);
    else
      pool.parallel_for(H, one);
    seconds[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return seconds;
}

/// The address the binding reads a cache argument at (zero-copy checks in the tests).
std::uintptr_t cache_address(const py::array& a) {
  return reinterpret_cast<std::uintptr_t>(cache_of(a, "array").data);
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "certattn's C++ core (use the certattn package)";
  PYBIND11_NUMPY_DTYPE(cert_record, certified, exact, path, level, tau, bound, beta, scale_value, max_score, denominator,
                       heavy, sampled, keys_read, values_read, bytes_read);
  PYBIND11_NUMPY_DTYPE(exact_record, max_score, denominator, value_scale, output_norm);
  m.attr("CERTIFICATE_DTYPE") = py::dtype::of<cert_record>();
  m.attr("EXACT_DTYPE") = py::dtype::of<exact_record>();
  {
    py::list names;  // answer_path's names, indexed by its value (certificate field `path`)
    for (int p = 0; p <= int(answer_path::kRouted); ++p) names.append(std::string(to_string(answer_path(p))));
    m.attr("ANSWER_PATHS") = py::tuple(names);
  }
  m.attr("DEFAULT_COST") = py::make_tuple(cost_model{}.fixed, cost_model{}.per_key, cost_model{}.give_up);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const certattn::error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  py::class_<options>(m, "Options")
      .def(py::init(&make_options), py::arg("eps"), py::arg("delta"), py::arg("scale"), py::arg("certificate"),
           py::arg("window"), py::arg("grid_ratio"), py::arg("max_levels"), py::arg("grid_top"),
           py::arg("softmax_scale"), py::arg("seed"), py::arg("routing"), py::arg("cost_fixed"),
           py::arg("cost_per_key"), py::arg("cost_give_up"), py::arg("cost_measured") = true)
      .def_readonly("epsilon", &options::epsilon)
      .def_readonly("delta", &options::delta)
      .def_readonly("window", &options::window)
      .def_readonly("seed", &options::seed)
      .def_property_readonly("scale", [](const options& o) { return std::string(to_string(o.scale)); })
      .def_property_readonly("certificate", [](const options& o) { return std::string(to_string(o.certificate)); })
      .def_property_readonly("routing", [](const options& o) { return std::string(to_string(o.route)); })
      .def_property_readonly("cost", [](const options& o) {
        return py::make_tuple(o.cost.fixed, o.cost.per_key, o.cost.give_up);
      })
      .def("sample_budget", [](const options& o, std::size_t tokens) { return sample_budget(o, tokens); },
           py::arg("tokens"));

  py::class_<py_variant>(m, "Variant")
      .def(py::init([](double softcap, std::size_t sliding_window, std::vector<float> slopes, std::vector<float> sinks) {
             py_variant v;
             v.softcap = softcap;
             v.sliding_window = sliding_window;
             v.slopes = std::move(slopes);
             v.sinks = std::move(sinks);
             attention_variant probe;
             probe.logit_softcap = softcap;
             validate(probe, 0, "variant");
             return v;
           }),
           py::arg("softcap"), py::arg("sliding_window"), py::arg("alibi_slopes"), py::arg("sinks"));

  py::class_<history_snapshot>(m, "HistorySnapshot")
      .def_property_readonly("kv_heads", [](const history_snapshot& s) { return s.heads.size(); })
      .def_property_readonly("levels", [](const history_snapshot& s) {
        std::vector<std::vector<int>> out;
        for (const group_history& h : s.heads) out.emplace_back(h.levels().begin(), h.levels().end());
        return out;
      })
      .def_property_readonly("routes_dense", [](const history_snapshot& s) {
        // Under the default options (routing auto): whether each head's next call is routed.
        std::vector<bool> out;
        for (const group_history& h : s.heads) out.push_back(h.routes_dense(options{}));
        return out;
      });

  py::class_<py_index>(m, "KeyIndex")
      .def(py::init<const py::array&, const py::array&, std::size_t, std::size_t, const scales_arg&>(),
           py::arg("k"), py::arg("v"), py::arg("reserve") = 0, py::arg("threads") = 1,
           py::arg("kv_scales") = scales_arg{1.0f, 1.0f})
      .def("append", &py_index::append, py::arg("k"), py::arg("v"), py::arg("threads") = 1,
           py::arg("kv_scales") = scales_arg{1.0f, 1.0f})
      .def("truncate", &py_index::truncate, py::arg("k"), py::arg("v"), py::arg("n"),
           py::arg("kv_scales") = scales_arg{1.0f, 1.0f})
      .def("reserve", &py_index::reserve, py::arg("tokens"))
      .def("reset_history", &py_index::reset_history, py::arg("sequence").none(true) = py::none())
      .def("history_snapshot", &py_index::snapshot, py::arg("sequence").none(true) = py::none())
      .def("__len__", &py_index::size)
      .def_property_readonly("size", &py_index::size)
      .def_property_readonly("kv_heads", &py_index::heads)
      .def_property_readonly("head_dim", &py_index::head_dim)
      .def_property_readonly("layer", &py_index::layer)
      .def_property_readonly("dtype", &py_index::dtype)
      .def_property_readonly("memory_bytes", &py_index::memory_bytes);

  m.def("attend", &attend_py, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("index"), py::arg("options"),
        py::arg("step"), py::arg("layer"), py::arg("kv_head"), py::arg("sequence"), py::arg("level_hints"),
        py::arg("history"), py::arg("out"), py::arg("threads"), py::arg("variant").none(true) = py::none(),
        py::arg("positions") = 1, py::arg("kv_scales") = scales_arg{1.0f, 1.0f});
  m.def("dense_attend", &dense_py, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("softmax_scale"),
        py::arg("threads"), py::arg("variant").none(true) = py::none(), py::arg("positions") = 1,
        py::arg("kv_scales") = scales_arg{1.0f, 1.0f});
  m.def("quantize", &quantize_py, py::arg("x"), py::arg("format"), py::arg("scale") = 1.0f);
  m.def("exact_attention", &exact_py, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("softmax_scale"),
        py::arg("variant").none(true) = py::none(), py::arg("kv_scales") = scales_arg{1.0f, 1.0f});
  m.def("reference_attend", &reference_py, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("index"),
        py::arg("options"), py::arg("step"), py::arg("layer"), py::arg("kv_head"), py::arg("sequence"),
        py::arg("level_hints"), py::arg("history").none(true), py::arg("variant").none(true) = py::none(),
        py::arg("kv_scales") = scales_arg{1.0f, 1.0f});

  m.def("attend_sequences", &attend_sequences_py, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("index"),
        py::arg("own_k"), py::arg("own_v"), py::arg("sequences"), py::arg("options"), py::arg("step"),
        py::arg("layer"), py::arg("kv_head"), py::arg("level_hints"), py::arg("history"), py::arg("threads"),
        py::arg("variant").none(true) = py::none(), py::arg("kv_scales") = scales_arg{1.0f, 1.0f});
  m.def("reference_attend_sequences", &reference_sequences_py, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("index"), py::arg("own_k"), py::arg("own_v"), py::arg("sequences"), py::arg("options"),
        py::arg("step"), py::arg("layer"), py::arg("kv_head"), py::arg("level_hints"),
        py::arg("history").none(true), py::arg("variant").none(true) = py::none(),
        py::arg("kv_scales") = scales_arg{1.0f, 1.0f});
  m.def("dense_attend_sequences", &dense_sequences_py, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("own_k"),
        py::arg("own_v"), py::arg("softmax_scale"), py::arg("threads"), py::arg("variant").none(true) = py::none(),
        py::arg("kv_scales") = scales_arg{1.0f, 1.0f});

  py::class_<audit_counts>(m, "AuditCounts")
      .def_readonly("calls", &audit_counts::calls)
      .def_readonly("certified", &audit_counts::certified)
      .def_readonly("fallbacks", &audit_counts::fallbacks)
      .def_readonly("violations", &audit_counts::violations)
      .def_readonly("checked", &audit_counts::checked)
      .def_readonly("disagreements", &audit_counts::disagreements)
      .def_readonly("max_ratio", &audit_counts::max_ratio)
      .def_readonly("p90_ratio", &audit_counts::p90_ratio)
      .def_readonly("keys_frac", &audit_counts::keys_frac)
      .def_readonly("bound_max", &audit_counts::bound_max)
      .def_readonly("first_disagreement", &audit_counts::first_disagreement);
  m.def("audit", &audit_py, py::arg("k"), py::arg("v"), py::arg("queries"), py::arg("certificates"),
        py::arg("scales"), py::arg("eps"), py::arg("delta"), py::arg("seed"), py::arg("check_every"),
        py::arg("threads"));
  m.def("cache_address", &cache_address, py::arg("array"));
  m.def("cpp_attend_seconds", &cpp_attend_seconds, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("index"),
        py::arg("options"), py::arg("first_step"), py::arg("threads"), py::arg("repeats"));
  m.def("active_isa", [] { return std::string(to_string(active_isa())); });
}
