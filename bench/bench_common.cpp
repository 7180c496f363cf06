// Implementation of bench_common.hpp.
#include "bench_common.hpp"

#include <certattn/arch/dispatch.hpp>
#include <certattn/parallel.hpp>

#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <certattn/arch/macros.hpp>  // CERTATTN_X86 and the kernel attributes

namespace certattn::bench {

// ---- numbers with suffixes -------------------------------------------------------------

std::size_t parse_count(std::string_view text) {
  std::string s(text);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.erase(s.begin());
  if (s.empty()) throw error("empty count");
  std::size_t mult = 1;
  const char last = char(std::toupper(static_cast<unsigned char>(s.back())));
  if (last == 'K' || last == 'M' || last == 'G') {
    mult = last == 'K' ? std::size_t(1) << 10 : last == 'M' ? std::size_t(1) << 20 : std::size_t(1) << 30;
    s.pop_back();
  }
  if (s.empty() || !std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
    throw error("'" + std::string(text) + "' is not a count (examples: 4096, 16K, 1M)");
  const unsigned long long v = std::strtoull(s.c_str(), nullptr, 10);
  if (v > SIZE_MAX / mult) throw error("'" + std::string(text) + "' is too large");
  return std::size_t(v) * mult;
}

std::string format_count(std::size_t n) {
  if (n >= (std::size_t(1) << 20) && n % (std::size_t(1) << 20) == 0)
    return std::to_string(n >> 20) + "M";
  if (n >= 1024 && n % 1024 == 0) return std::to_string(n >> 10) + "K";
  return std::to_string(n);
}

// ---- layouts ---------------------------------------------------------------------------

std::string_view to_string(layout_kind k) noexcept {
  switch (k) {
    case layout_kind::kHnd: return "hnd";
    case layout_kind::kNhd: return "nhd";
    case layout_kind::kPaged: return "paged";
  }
  return "?";
}

record point_fields(const run_point& p) {
  return {
      {"context", std::uint64_t(p.context)},
      {"kv_heads", std::uint64_t(p.kv_heads)},
      {"group", std::uint64_t(p.group)},
      {"head_dim", std::uint64_t(p.head_dim)},
      {"threads", std::uint64_t(p.threads)},
      {"layout", std::string(to_string(p.layout))},
      {"regime", std::string(syn::to_string(p.regime))},
      {"eps", p.eps},
      {"delta", p.delta},
      {"dtype", to_string(p.dtype)},
  };
}

layout_kind layout_from_string(std::string_view s) {
  if (s == "hnd") return layout_kind::kHnd;
  if (s == "nhd") return layout_kind::kNhd;
  if (s == "paged") return layout_kind::kPaged;
  throw error("unknown layout '" + std::string(s) + "' (expected hnd, nhd or paged)");
}

namespace {
/// One fp16 row of the synthetic cache stored as T at `out` (rounded, or quantized; an
/// fp8 row as codes of x / scale).
template <kv_element T>
void store_row_as(const half* row, std::size_t d, float scale, std::uint8_t* out) {
  T* dst = reinterpret_cast<T*>(out);
  std::vector<float> x(d);
  for (std::size_t i = 0; i < d; ++i) x[i] = float(row[i]);
  if constexpr (storage_element<T>) {
    for (std::size_t i = 0; i < d; ++i) dst[i] = T(x[i]);
  } else if constexpr (fp8_element<T>) {
    quantize_row(x.data(), d, scale, dst);
  } else {
    (void)scale;
    quantize_row(x.data(), d, dst);
  }
}

template <kv_element T>
float fp8_scale(const syn::kv_cache& src, std::size_t h, bool keys) {
  float m = 0.0f;
  for (std::size_t t = 0; t < src.config.n_tokens; ++t) {
    const half* row = keys ? src.key_row(h, t) : src.value_row(h, t);
    for (std::size_t i = 0; i < src.config.head_dim; ++i) m = std::max(m, std::fabs(float(row[i])));
  }
  const float range = std::is_same_v<T, fp8_e4m3> ? 112.0f : 14336.0f;  // a quarter of the largest
  return m > 0.0f ? m / range : 1.0f;
}

template <kv_element K, kv_element V = K>
void fill_layer(const syn::kv_cache& src, layout_kind kind, const std::vector<std::int32_t>& table,
                std::size_t page_tokens, std::vector<fp8_scales>& scales, std::uint8_t* keys, std::uint8_t* values) {
  const std::size_t n = src.config.n_tokens, d = src.config.head_dim, H = src.config.kv_heads;
  const std::size_t krb = format_traits<K>::row_bytes(d), vrb = format_traits<V>::row_bytes(d);
  scales.assign(H, {});
  for (std::size_t h = 0; h < H; ++h) {
    if constexpr (fp8_element<K>) scales[h].key = fp8_scale<K>(src, h, true);
    if constexpr (fp8_element<V>) scales[h].value = fp8_scale<V>(src, h, false);
    for (std::size_t t = 0; t < n; ++t) {
      std::size_t row;  // in rows of this head's width
      switch (kind) {
        case layout_kind::kHnd: row = h * n + t; break;
        case layout_kind::kNhd: row = t * H + h; break;
        default: row = (std::size_t(table[t / page_tokens]) * H + h) * page_tokens + t % page_tokens;
      }
      store_row_as<K>(src.key_row(h, t), d, scales[h].key, keys + row * krb);
      store_row_as<V>(src.value_row(h, t), d, scales[h].value, values + row * vrb);
    }
  }
}
}  // namespace

namespace {
std::size_t row_bytes_of(cache_format f, std::size_t d) {
  switch (f) {
    case cache_format::f16: return format_traits<half>::row_bytes(d);
    case cache_format::bf16: return format_traits<bfloat16>::row_bytes(d);
    case cache_format::q8_0: return format_traits<block_q8_0>::row_bytes(d);
    case cache_format::q4_0: return format_traits<block_q4_0>::row_bytes(d);
    case cache_format::fp8_e4m3: return format_traits<fp8_e4m3>::row_bytes(d);
    case cache_format::fp8_e5m2: return format_traits<fp8_e5m2>::row_bytes(d);
    default: throw error("--dtype: " + std::string(to_string(f)) + " is not benchmarked");
  }
}
}  // namespace

layer_cache::layer_cache(const syn::kv_cache& src, layout_kind kind, std::uint64_t seed, cache_dtype format)
    : kind_(kind), format_(format), n_(src.config.n_tokens), d_(src.config.head_dim), heads_(src.config.kv_heads) {
  const std::size_t n = n_, d = d_, H = heads_;
  key_row_bytes_ = row_bytes_of(format.key, d);
  value_row_bytes_ = row_bytes_of(format.value, d);
  for (cache_format f : {format.key, format.value})
    if (f != cache_format::f16 && f != cache_format::bf16 && d % 32 != 0)
      throw error("--dtype " + to_string(format) + ": --head-dim must be a multiple of 32");
  if (kind == layout_kind::kHnd && format == cache_dtype{}) {
    k_ = reinterpret_cast<const std::uint8_t*>(src.keys.data());
    v_ = reinterpret_cast<const std::uint8_t*>(src.values.data());
    return;
  }
  std::size_t rows = n * H;
  if (kind == layout_kind::kPaged) {
    // Pages handed out in a shuffled order, as an allocator that has run for a while would.
    const std::size_t pages = (n + kPageTokens - 1) / kPageTokens;
    table_.resize(pages);
    std::iota(table_.begin(), table_.end(), 0);
    std::mt19937_64 rng(seed ^ 0x70616765ull);
    std::shuffle(table_.begin(), table_.end(), rng);
    rows = pages * kPageTokens * H;
  }
  keys_.assign(rows * key_row_bytes_, 0);
  values_.assign(rows * value_row_bytes_, 0);
  auto fill = [&]<class K, class V>() {
    fill_layer<K, V>(src, kind, table_, kPageTokens, scales_, keys_.data(), values_.data());
  };
  if (format == cache_dtype{cache_format::q8_0, cache_format::f16}) {
    fill.template operator()<block_q8_0, half>();
  } else if (format == cache_dtype{cache_format::q4_0, cache_format::f16}) {
    fill.template operator()<block_q4_0, half>();
  } else if (format.mixed()) {
    throw error("--dtype " + to_string(format) + ": keys and values in two formats are benchmarked as q8_0/f16 and q4_0/f16");
  } else {
    switch (format.key) {
      case cache_format::f16: fill.template operator()<half, half>(); break;
      case cache_format::bf16: fill.template operator()<bfloat16, bfloat16>(); break;
      case cache_format::q8_0: fill.template operator()<block_q8_0, block_q8_0>(); break;
      case cache_format::q4_0: fill.template operator()<block_q4_0, block_q4_0>(); break;
      case cache_format::fp8_e4m3: fill.template operator()<fp8_e4m3, fp8_e4m3>(); break;
      default: fill.template operator()<fp8_e5m2, fp8_e5m2>(); break;
    }
  }
  k_ = keys_.data();
  v_ = values_.data();
}

std::string to_string(cache_dtype t) {
  return t.mixed() ? std::string(to_string(t.key)) + "/" + std::string(to_string(t.value))
                   : std::string(to_string(t.key));
}

cache_dtype dtype_from_string(std::string_view s) {
  const auto one = [&](std::string_view x) {
    for (cache_format f : {cache_format::f16, cache_format::bf16, cache_format::q8_0, cache_format::q4_0,
                           cache_format::fp8_e4m3, cache_format::fp8_e5m2})
      if (x == to_string(f)) return f;
    throw error("unknown --dtype '" + std::string(s) +
                "' (expected f16, bf16, q8_0, q4_0, fp8_e4m3, fp8_e5m2, q8_0/f16 or q4_0/f16)");
  };
  const std::size_t slash = s.find('/');
  if (slash == std::string_view::npos) return {one(s), one(s)};
  const cache_dtype t{one(s.substr(0, slash)), one(s.substr(slash + 1))};
  if (t.mixed() && t != cache_dtype{cache_format::q8_0, cache_format::f16} &&
      t != cache_dtype{cache_format::q4_0, cache_format::f16})
    throw error("--dtype '" + std::string(s) + "': keys and values in two formats are benchmarked as q8_0/f16 and q4_0/f16");
  return t;
}

// ---- the grid --------------------------------------------------------------------------------

variant_spec parse_variant(const std::string& text) {
  variant_spec v;
  v.text = text;
  if (text == "plain") return v;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t end = std::min(text.find('+', pos), text.size());
    const std::string part = text.substr(pos, end - pos);
    const std::size_t colon = part.find(':');
    const std::string name = part.substr(0, colon), arg = colon == std::string::npos ? "" : part.substr(colon + 1);
    auto number = [&](const char* what) {
      if (arg.empty()) throw error("--variant: " + name + " needs a value (" + what + ")");
      std::size_t used = 0;
      double x = 0.0;
      try {
        x = std::stod(arg, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != arg.size() || !(x > 0.0)) throw error("--variant: " + name + ":" + arg + " needs " + what + " > 0");
      return x;
    };
    if (name == "softcap") v.softcap = number("a cap");
    else if (name == "window") v.window = std::size_t(number("a window in tokens"));
    else if (name == "latent") v.latent = std::size_t(number("a value width"));
    else if (name == "alibi" && arg.empty()) v.alibi = true;
    else if (name == "sinks" && arg.empty()) v.sinks = true;
    else
      throw error("--variant: unknown part '" + part +
                  "' (expected plain, or softcap:CAP, alibi, sinks, window:W, latent:DV joined by '+')");
    pos = end + 1;
  }
  return v;
}

layer_variant::layer_variant(const variant_spec& spec, std::size_t kv_heads, std::size_t group, std::uint64_t seed)
    : spec_(spec), group_(group) {
  const std::size_t heads = kv_heads * group;
  if (spec.alibi)
    for (std::size_t i = 0; i < heads; ++i) slopes_.push_back(float(std::exp2(-8.0 * double(i + 1) / double(heads))));
  if (spec.sinks) {
    std::mt19937_64 rng(seed * 7919 + 17);
    std::uniform_real_distribution<float> z(0.0f, 3.0f);
    for (std::size_t i = 0; i < heads; ++i) sinks_.push_back(z(rng));
  }
}

attention_variant layer_variant::head(std::size_t h) const {
  attention_variant v;
  v.logit_softcap = spec_.softcap;
  v.sliding_window = spec_.window;
  if (!slopes_.empty()) v.alibi_slopes = std::span<const float>(slopes_).subspan(h * group_, group_);
  if (!sinks_.empty()) v.sinks = std::span<const float>(sinks_).subspan(h * group_, group_);
  return v;
}

void add_grid_flags(CLI::App& cmd, grid_flags& f, const std::string& reps_help) {
  cmd.add_option("--variant", f.variant,
                 "attention variant of every call: plain, or parts joined by '+': softcap:CAP, alibi (BLOOM's "
                 "slopes), sinks (one learned logit per head), window:W (sliding window of W tokens), latent:DV "
                 "(multi-head latent attention: the values are the first DV channels of the key rows; speed only)")
      ->capture_default_str();
  cmd.add_option("--softmax-scale", f.softmax_scale,
                 "softmax scale of every call (0: 1/sqrt(head_dim); DeepSeek-V3's MLA: 0.0722 = 1/sqrt(192))")
      ->capture_default_str();
  cmd.add_option("--context", f.contexts,
                 "context lengths in tokens, comma-separated; K = 1024, M = 1024K")
      ->delimiter(',')
      ->capture_default_str();
  cmd.add_option("--kv-heads", f.kv_heads, "KV heads of the layer")->capture_default_str();
  cmd.add_option("--group", f.group, "query heads per KV head (GQA group size G)")
      ->capture_default_str();
  cmd.add_option("--head-dim", f.head_dim, "channels per head (even)")->capture_default_str();
  cmd.add_option("--threads", f.threads, "thread counts, comma-separated; 0 = all cores")
      ->delimiter(',')
      ->capture_default_str();
  std::string regimes;
  for (syn::regime r : syn::all_regimes) regimes += (regimes.empty() ? "" : ", ") + std::string(syn::to_string(r));
  cmd.add_option("--regime", f.regimes, "synthetic regimes, comma-separated: " + regimes)
      ->delimiter(',')
      ->capture_default_str();
  cmd.add_option("--layout", f.layouts, "cache layouts, comma-separated: hnd, nhd, paged")
      ->delimiter(',')
      ->capture_default_str();
  cmd.add_option("--dtype", f.dtypes,
                 "cache formats, comma-separated: f16, bf16, q8_0 and q4_0 (ggml's blocks), fp8_e4m3, fp8_e5m2 "
                 "(with a scale per KV head); q8_0/f16 and q4_0/f16 for keys and values in two formats "
                 "(llama.cpp's -ctk q8_0 with f16 values); each its own rows")
      ->delimiter(',')
      ->capture_default_str();
  cmd.add_option("--eps", f.eps, "target errors epsilon (value scale), comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  cmd.add_option("--delta", f.delta, "failure probabilities delta, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  cmd.add_option("--reps", f.reps, reps_help)->capture_default_str();
  cmd.add_option("--warmup", f.warmup, "untimed repetitions before the timed ones")
      ->capture_default_str();
  cmd.add_option("--flush-mib", f.flush_mib,
                 "MiB read before every timed call to evict the caches, as the other layers of a "
                 "decode step would (0 = off)")
      ->capture_default_str();
  cmd.add_option("--json", f.json, "also write the results as JSON to this file");
  cmd.add_option("--csv", f.csv, "also write the results as CSV to this file");
  cmd.add_option("--plot", f.plot, "write PNG plots into this directory (needs gnuplot)");
  cmd.add_option("--seed", f.seed, "seed of the synthetic cache, queries and perturbations")
      ->capture_default_str();
  cmd.add_flag("--quiet", f.quiet, "no progress indicator on stderr");
}

grid resolve(const grid_flags& f) {
  grid g;
  g.variant = parse_variant(f.variant);
  for (const std::string& c : f.contexts) {
    const std::size_t n = parse_count(c);
    if (n < options{}.window)
      throw error("--context: " + c + " tokens is shorter than the certified call's window of " +
                  std::to_string(options{}.window) + " tokens");
    g.contexts.push_back(n);
  }
  if (g.contexts.empty()) throw error("--context: give at least one context");
  if (f.kv_heads == 0) throw error("--kv-heads must be > 0");
  if (f.group == 0) throw error("--group must be > 0");
  if (f.head_dim == 0 || f.head_dim % 2 != 0) throw error("--head-dim must be even and > 0");
  if (f.reps == 0) throw error("--reps must be > 0");
  for (std::size_t t : f.threads) {
    const std::size_t n = t == 0 ? threads_available() : t;
    if (std::find(g.threads.begin(), g.threads.end(), n) == g.threads.end()) g.threads.push_back(n);
  }
  if (g.threads.empty()) throw error("--threads: give at least one thread count");
  for (const std::string& r : f.regimes) g.regimes.push_back(syn::regime_from_string(r));
  for (const std::string& l : f.layouts) g.layouts.push_back(layout_from_string(l));
  for (const std::string& t : f.dtypes)
    if (std::find(g.dtypes.begin(), g.dtypes.end(), dtype_from_string(t)) == g.dtypes.end())
      g.dtypes.push_back(dtype_from_string(t));
  if (g.dtypes.empty()) throw error("--dtype: give at least one format");
  if (g.regimes.empty() || g.layouts.empty() || f.eps.empty() || f.delta.empty())
    throw error("--regime, --layout, --eps and --delta each need at least one value");
  options probe;
  for (double e : f.eps)
    for (double d : f.delta) {
      probe.epsilon = e;
      probe.delta = d;
      validate(probe);
    }
  return g;
}

void add_certificate_flag(CLI::App& cmd, std::vector<std::string>& names) {
  cmd.add_option("--certificate", names,
                 "certificates, comma-separated: tight (value-aware, level hints), classic (the paper's)")
      ->delimiter(',')
      ->capture_default_str();
}

std::vector<certificate_kind> certificates_from(const std::vector<std::string>& names) {
  std::vector<certificate_kind> kinds;
  for (const std::string& s : names) {
    const certificate_kind k = certificate_kind_from_string(s);
    if (std::find(kinds.begin(), kinds.end(), k) == kinds.end()) kinds.push_back(k);
  }
  if (kinds.empty()) throw error("--certificate: give at least one of tight, classic");
  return kinds;
}

pools::pools(const std::vector<std::size_t>& counts) {
  for (std::size_t t : counts)
    if (!pools_.count(t)) pools_.emplace(t, std::make_unique<thread_pool>(t));
}

std::vector<float> make_step_queries(const syn::kv_cache& cache, std::size_t group,
                                     std::size_t steps, std::size_t first_step) {
  const std::size_t H = cache.config.kv_heads, d = cache.config.head_dim;
  std::vector<float> q(steps * H * group * d);
  for (std::size_t s = 0; s < steps; ++s)
    for (std::size_t h = 0; h < H; ++h)
      syn::make_queries(cache, h, group, first_step + s,
                        std::span<float>(q.data() + (s * H + h) * group * d, group * d));
  return q;
}

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// ---- the machine ------------------------------------------------------------------------------

namespace {

std::uint64_t sum_words_plain(const std::uint64_t* p, std::size_t n) {
  std::uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  for (std::size_t i = 0; i + 4 <= n; i += 4) {
    a0 += p[i];
    a1 += p[i + 1];
    a2 += p[i + 2];
    a3 += p[i + 3];
  }
  return a0 + a1 + a2 + a3;
}

#if CERTATTN_X86
CERTATTN_ARCH_BEGIN
CERTATTN_TARGET_AVX2 std::uint64_t sum_words_avx2(const std::uint64_t* p, std::size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (std::size_t i = 0; i + 16 <= n; i += 16) {
    a0 = _mm256_add_epi64(a0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
    a2 = _mm256_add_epi64(a2, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
    a3 = _mm256_add_epi64(a3, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
  }
  const __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  alignas(32) std::uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

CERTATTN_TARGET_AVX512 std::uint64_t sum_words_avx512(const std::uint64_t* p, std::size_t n) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (std::size_t i = 0; i + 32 <= n; i += 32) {
    a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(p + i));
    a1 = _mm512_add_epi64(a1, _mm512_loadu_si512(p + i + 8));
    a2 = _mm512_add_epi64(a2, _mm512_loadu_si512(p + i + 16));
    a3 = _mm512_add_epi64(a3, _mm512_loadu_si512(p + i + 24));
  }
  return std::uint64_t(
      _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3))));
}
CERTATTN_ARCH_END
#endif

std::uint64_t sum_words(const std::uint64_t* p, std::size_t n) {
#if CERTATTN_X86
  switch (active_isa()) {
    case isa::kAvx512Vnni: return sum_words_avx512(p, n);
    case isa::kAvx2: return sum_words_avx2(p, n);
    case isa::kScalar: break;
  }
#endif
  return sum_words_plain(p, n);
}

// Where sums go so that the reads they come from cannot be optimised away.
volatile std::uint64_t g_sink = 0;

struct free_deleter {
  void operator()(void* p) const noexcept { std::free(p); }
};

}  // namespace

double read_bandwidth_gbps(thread_pool& pool, std::size_t mib, int trials) {
  // Best of several passes: the machine may be shared, and the best pass is the one least
  // disturbed by other work.
  const std::size_t bytes = std::max<std::size_t>(mib, 1) << 20;
  std::unique_ptr<std::uint64_t[], free_deleter> buf(
      static_cast<std::uint64_t*>(std::aligned_alloc(4096, bytes)));
  if (!buf) throw error("read_bandwidth_gbps: cannot allocate " + std::to_string(mib) + " MiB");
  const std::size_t words = bytes / sizeof(std::uint64_t);
  const std::size_t parts = pool.size();
  // Slices of whole 256-byte lines so every kernel covers its slice exactly.
  const std::size_t slice = (words / parts) / 32 * 32;
  pool.parallel_for(parts, [&](std::size_t i, std::size_t) {
    for (std::size_t w = i * slice; w < (i + 1) * slice; ++w) buf[w] = w;
  });
  std::vector<std::uint64_t> sums(parts);
  double best = 0.0;
  for (int t = 0; t < trials; ++t) {
    const auto t0 = bench_clock::now();
    pool.parallel_for(parts, [&](std::size_t i, std::size_t) {
      sums[i] = sum_words(buf.get() + i * slice, slice);
    });
    const double s = seconds_since(t0);
    g_sink = std::accumulate(sums.begin(), sums.end(), std::uint64_t(0));
    best = std::max(best, double(parts * slice * sizeof(std::uint64_t)) / s * 1e-9);
  }
  return best;
}

cache_flusher::cache_flusher(std::size_t mib) : buf_((mib << 20) / sizeof(std::uint64_t)) {
  for (std::size_t i = 0; i < buf_.size(); ++i) buf_[i] = i;
}

void cache_flusher::operator()() const {
  if (buf_.empty()) return;
  g_sink = sum_words(buf_.data(), buf_.size());
}

std::size_t threads_available() {
  return std::max<std::size_t>(1, std::thread::hardware_concurrency());
}

// ---- progress ------------------------------------------------------------------------------------

progress::progress(std::string name, double total_units, bool enabled, double quiet_seconds)
    : name_(std::move(name)), total_(total_units), enabled_(enabled),
      tty_(isatty(fileno(stderr)) != 0), quiet_(quiet_seconds) {}

progress::~progress() { finish(); }

void progress::set_stage(std::string stage) {
  stage_ = std::move(stage);
  draw(false);
}

void progress::advance(double units) {
  done_ += units;
  draw(false);
}

void progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (!enabled_ || !drawn_) return;
  const double el = seconds_since(start_);
  if (tty_)
    std::fprintf(stderr, "\r\033[K%s: done in %.0f s\n", name_.c_str(), el);
  else
    std::fprintf(stderr, "%s: done in %.0f s\n", name_.c_str(), el);
  std::fflush(stderr);
}

void progress::draw(bool force) {
  if (!enabled_ || finished_) return;
  const auto now = bench_clock::now();
  const double el = std::chrono::duration<double>(now - start_).count();
  if (el < quiet_ && !force) return;
  const double since = std::chrono::duration<double>(now - last_draw_).count();
  if (!force && drawn_ && since < (tty_ ? 0.2 : 10.0)) return;
  last_draw_ = now;
  drawn_ = true;
  const double frac = total_ > 0 ? std::min(1.0, done_ / total_) : 0.0;
  char eta[48] = "";
  if (frac > 0.02) std::snprintf(eta, sizeof eta, ", ~%.0f s left", el * (1.0 - frac) / frac);
  if (tty_)
    std::fprintf(stderr, "\r\033[K%s: %3.0f%% %s (%.0f s%s)", name_.c_str(), 100.0 * frac,
                 stage_.c_str(), el, eta);
  else
    std::fprintf(stderr, "%s: %3.0f%% %s (%.0f s%s)\n", name_.c_str(), 100.0 * frac,
                 stage_.c_str(), el, eta);
  std::fflush(stderr);
}

}  // namespace certattn::bench
