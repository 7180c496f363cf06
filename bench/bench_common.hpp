// Shared pieces of certattn-bench's subcommands: the grid flags every subcommand takes
// (contexts, heads, threads, layouts, ...), one layer's synthetic cache copied into the
// layout under test, clocks and medians, the machine's read bandwidth, and a progress line.
#pragma once

#include <certattn/certattn.hpp>
#include <certattn/dense.hpp>
#include <certattn/testing/synthetic.hpp>
#include <certattn/parallel.hpp>

#include <CLI/CLI.hpp>

#include "report.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace certattn::bench {

namespace syn = certattn::synthetic;

// ---- numbers with suffixes -------------------------------------------------------------

/// "16384", "16K", "16k", "1M" -> tokens (K = 1024). Throws certattn::error.
std::size_t parse_count(std::string_view text);
/// 16384 -> "16K", 1048576 -> "1M", 1000 -> "1000".
std::string format_count(std::size_t n);

// ---- layouts ---------------------------------------------------------------------------

enum class layout_kind { kHnd, kNhd, kPaged };
std::string_view to_string(layout_kind k) noexcept;

/// A cache's formats: its keys' and its values' (--dtype q8_0, or q8_0/f16 for q8_0 keys
/// with f16 values, as llama.cpp's `-ctk q8_0` stores them).
struct cache_dtype {
  cache_format key = cache_format::f16, value = cache_format::f16;
  bool mixed() const noexcept { return key != value; }
  bool operator==(const cache_dtype&) const = default;
};
/// "q8_0", or "q8_0/f16" where the values differ.
std::string to_string(cache_dtype t);

/// The grid point a speed or index row measured.
struct run_point {
  std::size_t context = 0, kv_heads = 0, group = 0, head_dim = 0, threads = 0;
  layout_kind layout = layout_kind::kHnd;
  syn::regime regime = syn::regime::kMixed;
  double eps = 0, delta = 0;
  cache_dtype dtype;
};
/// Its fields, the first of every such row's record (names of the JSON contract).
record point_fields(const run_point& p);
layout_kind layout_from_string(std::string_view s);
/// --dtype: the cache formats the bench stores (f16, bf16, q8_0, q4_0, fp8_e4m3, fp8_e5m2),
/// or keys and values in two of them (q8_0/f16, q4_0/f16).
cache_dtype dtype_from_string(std::string_view s);

/// One layer's cache (all KV heads) in one layout and one format (fp16 by default; the
/// others rounded or quantized from the synthetic fp16 rows, an fp8 cache with a scale per
/// head that puts its largest channel at a quarter of the format's range):
///   hnd   [kv_heads][tokens][head_dim]: for fp16 the synthetic cache itself, not copied
///   nhd   [tokens][kv_heads][head_dim] (llama.cpp): a token's row holds every head
///   paged FlashInfer HND pages [page][kv_heads][16 tokens][head_dim], shuffled block table
class layer_cache {
 public:
  static constexpr std::size_t kPageTokens = 16;

  layer_cache(const syn::kv_cache& src, layout_kind kind, std::uint64_t seed, cache_dtype format = {});
  layer_cache(const layer_cache&) = delete;
  layer_cache& operator=(const layer_cache&) = delete;

  layout_kind kind() const noexcept { return kind_; }
  std::size_t tokens() const noexcept { return n_; }
  std::size_t heads() const noexcept { return heads_; }
  std::size_t head_dim() const noexcept { return d_; }
  cache_dtype format() const noexcept { return format_; }
  /// Token-major rows (nhd) as T, the keys' (values') element type: [tokens][kv_heads]
  /// [head_dim] elements, or head_dim / 32 blocks per head.
  template <kv_element T = half>
  const T* keys() const noexcept { return reinterpret_cast<const T*>(k_); }
  template <kv_element T = half>
  const T* values() const noexcept { return reinterpret_cast<const T*>(v_); }
  /// An fp8 cache's scale pair per KV head (empty for other formats).
  std::span<const fp8_scales> scales() const noexcept { return scales_; }
  /// K and V bytes of the first n tokens of every head: what dense attention reads.
  std::size_t kv_bytes(std::size_t n) const noexcept {
    return n * heads_ * (key_row_bytes_ + value_row_bytes_);
  }

  template <kv_element K, kv_element V = K>
  strided_kv<K, V> strided(std::size_t h) const;  // hnd, nhd
  template <kv_element K, kv_element V = K>
  paged_kv<K, V> paged(std::size_t h) const;      // paged
  /// Head h of the paged layout through another block table of `tokens` tokens (its
  /// entries are pages of this cache): a sequence that shares some of its pages.
  template <kv_element K, kv_element V = K>
  paged_kv<K, V> paged(std::size_t h, std::span<const std::int32_t> table, std::size_t tokens) const;
  /// The paged layout's block table: token t lies on page page_table()[t / kPageTokens].
  std::span<const std::int32_t> page_table() const noexcept { return table_; }
  strided_kv<half> strided(std::size_t h) const { return strided<half>(h); }

  /// Calls f(view_of) with view_of(h) -> the kv_view of head h (all tokens), so that the
  /// timed loops are compiled once per format and view type and never branch inside.
  /// A build with CERTATTN_BENCH_F16_ONLY (the aarch64 preset's, whose bench runs one fp16
  /// smoke under qemu) compiles the fp16 loops only: each other format triples nothing but
  /// the build time there.
  template <class F>
  decltype(auto) visit(F&& f) const {
#if CERTATTN_BENCH_F16_ONLY
    if (format_ != cache_dtype{})
      throw error("--dtype " + to_string(format_) +
                  ": this certattn-bench was built with CERTATTN_BENCH_F16_ONLY (fp16 caches only)");
    return visit_as<half>(f);
#else
    if (format_ == cache_dtype{cache_format::q8_0, cache_format::f16}) return visit_as<block_q8_0, half>(f);
    if (format_ == cache_dtype{cache_format::q4_0, cache_format::f16}) return visit_as<block_q4_0, half>(f);
    switch (format_.key) {
      case cache_format::bf16: return visit_as<bfloat16>(f);
      case cache_format::q8_0: return visit_as<block_q8_0>(f);
      case cache_format::q4_0: return visit_as<block_q4_0>(f);
      case cache_format::fp8_e4m3: return visit_as<fp8_e4m3>(f);
      case cache_format::fp8_e5m2: return visit_as<fp8_e5m2>(f);
      default: return visit_as<half>(f);
    }
#endif
  }

 private:
  template <kv_element K, kv_element V = K, class F>
  decltype(auto) visit_as(F& f) const {
    if (kind_ == layout_kind::kPaged) return f([this](std::size_t h) { return paged<K, V>(h); });
    return f([this](std::size_t h) { return strided<K, V>(h); });
  }
  template <kv_element K, kv_element V>
  auto with_scale(auto view, std::size_t h) const {
    if constexpr (fp8_element<K> || fp8_element<V>)
      return view.with_scales(scales_[h]);
    else
      return view;
  }
  template <kv_element K, kv_element V>
  void check_format(const char* what) const {
    if (cache_dtype{format_traits<K>::format, format_traits<V>::format} != format_)
      throw error(std::string("layer_cache::") + what + ": another format");
  }
  layout_kind kind_;
  cache_dtype format_;
  std::size_t n_, d_, heads_, key_row_bytes_, value_row_bytes_;
  const std::uint8_t* k_ = nullptr;
  const std::uint8_t* v_ = nullptr;
  large_vector<std::uint8_t> keys_, values_;  // empty for an fp16 hnd; on huge pages (memory.hpp)
  std::vector<std::int32_t> table_;
  std::vector<fp8_scales> scales_;  // per head (fp8)
};

template <kv_element K, kv_element V>
strided_kv<K, V> layer_cache::strided(std::size_t h) const {
  const K* k = reinterpret_cast<const K*>(k_);
  const V* v = reinterpret_cast<const V*>(v_);
  check_format<K, V>("strided");
  if (kind_ == layout_kind::kHnd) return with_scale<K, V>(hnd_view(k, v, n_, n_, heads_, d_, h), h);
  if (kind_ == layout_kind::kNhd) return with_scale<K, V>(nhd_view(k, v, n_, heads_, d_, h), h);
  throw error("layer_cache::strided: the paged layout has no strided view");
}

template <kv_element K, kv_element V>
paged_kv<K, V> layer_cache::paged(std::size_t h) const {
  return paged<K, V>(h, table_, n_);
}

template <kv_element K, kv_element V>
paged_kv<K, V> layer_cache::paged(std::size_t h, std::span<const std::int32_t> table, std::size_t tokens) const {
  if (kind_ != layout_kind::kPaged) throw error("layer_cache::paged: not a paged layout");
  check_format<K, V>("paged");
  const std::size_t u = format_traits<K>::units(d_);
  return with_scale<K, V>(paged_kv<K, V>(reinterpret_cast<const K*>(k_), reinterpret_cast<const V*>(v_), table,
                                         tokens, kPageTokens, d_, heads_ * kPageTokens * u, u, h * kPageTokens * u),
                          h);
}

// ---- the grid every subcommand runs ------------------------------------------------------

/// Flags as typed on the command line (strings keep the 16K suffixes).
struct grid_flags {
  std::string variant = "plain";
  double softmax_scale = 0.0;
  std::vector<std::string> contexts{"16K", "32K", "64K", "128K"};
  std::size_t kv_heads = 8;
  std::size_t group = 4;
  std::size_t head_dim = 128;
  std::vector<std::size_t> threads{1, 0};
  std::vector<std::string> regimes{"mixed"};
  std::vector<std::string> layouts{"hnd"};
  std::vector<std::string> dtypes{"f16"};
  std::vector<double> eps{0.1};
  std::vector<double> delta{0.05};
  std::size_t reps = 20;
  std::size_t warmup = 2;
  std::size_t flush_mib = 64;
  std::string json, csv, plot;
  std::uint64_t seed = 1;
  bool quiet = false;
};

/// --variant: the attention variant every call of the run computes (variant.hpp): `plain`,
/// or parts joined by '+': softcap:CAP, alibi, sinks, window:W (e.g. sinks+window:128).
struct variant_spec {
  std::string text = "plain";
  double softcap = 0.0;
  bool alibi = false, sinks = false;
  std::size_t window = 0;
  std::size_t latent = 0;  // latent:DV: values are the first DV channels of the key rows (MLA)
  bool plain() const noexcept { return softcap == 0.0 && !alibi && !sinks && window == 0 && latent == 0; }
};
variant_spec parse_variant(const std::string& text);

/// One layer's variant data: ALiBi slopes 2^(-8 (i + 1) / N) over its N = kv_heads * group
/// query heads (BLOOM's), and sink logits drawn from U(0, 3) (gpt-oss's learned sinks are
/// of that order against its scores).
class layer_variant {
 public:
  layer_variant(const variant_spec& spec, std::size_t kv_heads, std::size_t group, std::uint64_t seed);
  /// The variant of KV head h's group (spans into this object).
  attention_variant head(std::size_t h) const;
  const variant_spec& spec() const noexcept { return spec_; }

 private:
  variant_spec spec_;
  std::size_t group_;
  std::vector<float> slopes_, sinks_;
};

/// Registers the shared flags on a subcommand; `reps_help` says what a repetition is there.
void add_grid_flags(CLI::App& cmd, grid_flags& f, const std::string& reps_help);

/// The flags resolved: contexts in tokens, thread counts with 0 replaced by all cores
/// (duplicates dropped), regimes and layouts parsed. Throws certattn::error.
struct grid {
  variant_spec variant;
  std::vector<std::size_t> contexts;
  std::vector<std::size_t> threads;
  std::vector<syn::regime> regimes;
  std::vector<layout_kind> layouts;
  std::vector<cache_dtype> dtypes;
};
grid resolve(const grid_flags& f);

/// Registers --certificate on a subcommand: the certificates to run, a comma list of tight and
/// classic (default tight), each its own rows, so that the paper's certificate can be set
/// beside the default one on the same data.
void add_certificate_flag(CLI::App& cmd, std::vector<std::string>& names);
/// The names parsed in the order given, duplicates dropped. Throws certattn::error.
std::vector<certificate_kind> certificates_from(const std::vector<std::string>& names);

/// One pool per thread count, made once and shared by every method timed with it.
class pools {
 public:
  explicit pools(const std::vector<std::size_t>& counts);
  thread_pool& get(std::size_t threads) { return *pools_.at(threads); }
  /// The pool with the most threads (for setup work such as building indexes).
  thread_pool& largest() { return *pools_.rbegin()->second; }

 private:
  std::map<std::size_t, std::unique_ptr<thread_pool>> pools_;
};

/// Queries of `steps` decoding steps for all heads: [steps][kv_heads][group][head_dim].
std::vector<float> make_step_queries(const syn::kv_cache& cache, std::size_t group,
                                     std::size_t steps, std::size_t first_step = 0);

// ---- clocks -------------------------------------------------------------------------------

using bench_clock = std::chrono::steady_clock;
inline double seconds_since(bench_clock::time_point t0) {
  return std::chrono::duration<double>(bench_clock::now() - t0).count();
}
/// The median; for an even count the mean of the two middle values. NaN when empty.
double median(std::vector<double> v);

// ---- the machine ----------------------------------------------------------------------------

/// Streaming read bandwidth in GB/s (1e9 bytes/s): a `mib` MiB buffer summed as 64-bit
/// integers (AVX-512 or AVX2 when the CPU has them), split evenly over the pool's threads,
/// best of `trials`. The buffer is written once before timing so every page is mapped.
double read_bandwidth_gbps(thread_pool& pool, std::size_t mib = 1024, int trials = 5);

/// Evicts the caches before a timed call by reading a buffer of `mib` MiB on the calling
/// thread (64 MiB: twice the L3 of the machines we measure on). In a real decode step the
/// other layers are read between two calls on one layer, so neither the KV cache nor the
/// index of a layer is still cached when its turn comes; without this, small contexts
/// would be timed from the L3. mib = 0 turns it off.
class cache_flusher {
 public:
  explicit cache_flusher(std::size_t mib);
  void operator()() const;

 private:
  std::vector<std::uint64_t> buf_;
};

/// std::thread::hardware_concurrency(), at least 1.
std::size_t threads_available();

/// The keys every command's JSON "machine" object has: "isa" (active_isa()) and
/// "threads_available". Inline, so that programs without report.cpp (the npy self-test)
/// link bench_common.cpp alone.
inline void machine_fields(json_writer& j) {
  j.key("isa").value(std::string(to_string(active_isa())));
  j.key("threads_available").value(std::uint64_t(threads_available()));
}

// ---- progress on stderr ----------------------------------------------------------------------

/// A one-line progress indicator for runs longer than a few seconds: silent for the first
/// `quiet_seconds`, then redrawn in place on a terminal (at most 5 times a second) or printed
/// as a line every 10 s when stderr is a file or pipe. Work is counted in arbitrary units
/// (the bench uses tokens x repetitions) so that the estimate of time left is sensible.
class progress {
 public:
  progress(std::string name, double total_units, bool enabled, double quiet_seconds = 3.0);
  ~progress();
  void set_stage(std::string stage);  // what is running now, e.g. "64K hnd 2T"
  void advance(double units);
  void finish();

 private:
  void draw(bool force);
  std::string name_, stage_;
  double total_, done_ = 0.0;
  bool enabled_, tty_, drawn_ = false, finished_ = false;
  double quiet_;
  bench_clock::time_point start_ = bench_clock::now(), last_draw_{};
};

}  // namespace certattn::bench
