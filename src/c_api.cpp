// The C ABI of include/certattn/c/certattn.h over the header-only C++ API. Every entry
// point runs its body inside guarded(): certattn::error (bad input) becomes
// CERTATTN_EINVAL, std::bad_alloc CERTATTN_ENOMEM, anything else CERTATTN_EINTERNAL, and
// the message lands in a thread-local buffer. No exception crosses the boundary.
// Calls that the C++ side performs without allocating (certified and dense calls, appends
// within a reserved index) allocate nothing here either: converted structs live on the
// stack and the C++ certificates in the workspace, sized at creation.
#ifndef CERTATTN_C_BUILDING
#define CERTATTN_C_BUILDING
#endif
#include <certattn/c/certattn.h>

#include <certattn/attend.hpp>
#include <certattn/dense.hpp>
#include <certattn/exact.hpp>
#include <certattn/history.hpp>
#include <certattn/index.hpp>
#include <certattn/layout.hpp>
#include <certattn/options.hpp>
#include <certattn/perturb.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

struct certattn_index {
  certattn::key_index idx;
};

struct certattn_workspace {
  certattn::attend_workspace ws;
  certattn::dense_workspace dense;
  std::vector<certattn::certificate> certs;  // [group]: the C++ call's, converted after
};

struct certattn_history {
  certattn::group_history h;
};

namespace {

static_assert(sizeof(certattn::half) == sizeof(std::uint16_t), "fp16 is passed as uint16_t bits");
static_assert(sizeof(certattn::bfloat16) == sizeof(std::uint16_t),
              "bf16 is passed as uint16_t bits");

// Trivially destructible, so that no call (not even a thread's first) allocates for it.
thread_local char g_last_error[1024] = "";

void set_error(const char* fn, const char* what) noexcept {
  std::snprintf(g_last_error, sizeof g_last_error, "%s: %s", fn, what);
}

using certattn::error;

// Bounds on the sizes the C++ side indexes with 32-bit tokens and multiplies together.
constexpr std::size_t kMaxTokens = (std::size_t(1) << 32) - 1024;
constexpr std::size_t kMaxGroup = std::size_t(1) << 16;
constexpr std::size_t kMaxHeadDim = std::size_t(1) << 16;


template <class F>
int guarded(const char* fn, F&& f) noexcept {
  try {
    f();
    return CERTATTN_OK;
  } catch (const certattn::error& e) {
    set_error(fn, e.what());
    return CERTATTN_EINVAL;
  } catch (const std::invalid_argument& e) {
    set_error(fn, e.what());
    return CERTATTN_EINVAL;
  } catch (const std::out_of_range& e) {
    set_error(fn, e.what());
    return CERTATTN_EINVAL;
  } catch (const std::bad_alloc&) {
    set_error(fn, "out of memory");
    return CERTATTN_ENOMEM;
  } catch (const std::length_error& e) {
    set_error(fn, e.what());
    return CERTATTN_ENOMEM;
  } catch (const std::exception& e) {
    set_error(fn, e.what());
    return CERTATTN_EINTERNAL;
  } catch (...) {
    set_error(fn, "unknown exception");
    return CERTATTN_EINTERNAL;
  }
}

void require(const void* p, const char* name) {
  if (p == nullptr) throw error(std::string(name) + " must not be NULL");
}

/// An fp8 cache's scale field: 0 means 1.
float fp8_scale(float s) { return s == 0.0f ? 1.0f : s; }

/// The view with the cache's fp8 scales; other dtypes must leave them 0 or 1.
template <class K, class V, class View>
auto with_scales(const certattn_cache& c, const View& kv) {
  const auto unit = [](float s) { return s == 0.0f || s == 1.0f; };
  if constexpr (certattn::fp8_element<K> || certattn::fp8_element<V>) {
    if constexpr (requires { kv.with_scale(1.0f); }) {
      if (c.value_scale != 0.0f && c.value_scale != c.key_scale)
        throw error("cache.value_scale must be 0 or equal to cache.key_scale for the latent layout "
                    "(the values are the key rows)");
      return kv.with_scale(certattn::check_cache_scale(fp8_scale(c.key_scale), "cache.key_scale"));
    } else {
      if (!certattn::fp8_element<K> && !unit(c.key_scale))
        throw error("cache.key_scale applies to fp8 keys only: leave it 0 (got " + std::to_string(c.key_scale) + ")");
      if (!certattn::fp8_element<V> && !unit(c.value_scale))
        throw error("cache.value_scale applies to fp8 values only: leave it 0 (got " +
                    std::to_string(c.value_scale) + ")");
      return kv.with_scales({certattn::check_cache_scale(fp8_scale(c.key_scale), "cache.key_scale"),
                             certattn::check_cache_scale(fp8_scale(c.value_scale), "cache.value_scale")});
    }
  } else {
    if (!unit(c.key_scale) || !unit(c.value_scale))
      throw error("cache.key_scale and cache.value_scale apply to fp8 caches only: leave them 0 (got " +
                  std::to_string(c.key_scale) + ", " + std::to_string(c.value_scale) + ")");
    return kv;
  }
}

// The cache as the C++ adapters see it: f(kv) with kv a strided_kv<K, V>, paged_kv<K, V> or
// latent_kv<K> (with its fp8 scales).
template <class K, class V, class F>
void with_layout(const certattn_cache& c, F&& f) {
  const K* k = static_cast<const K*>(c.keys);
  const V* v = static_cast<const V*>(c.values);
  if (c.layout == CERTATTN_LAYOUT_LATENT) {
    if constexpr (std::is_same_v<K, V>) {
      if (v != nullptr && v != k)
        throw error("cache.values must be NULL or equal to cache.keys for the latent layout (the values "
                    "are the first value_dim channels of the key rows)");
      f(with_scales<K, K>(c, certattn::latent_kv<K>(k, c.n_tokens, c.head_dim, c.value_dim, c.key_stride)));
      return;
    } else {
      throw error("cache.value_dtype must be 0 for the latent layout (the values are the key rows)");
    }
  }
  if (c.value_dim != 0 && c.value_dim != c.head_dim)
    throw error("cache.value_dim = " + std::to_string(c.value_dim) +
                ": a value width other than head_dim needs the latent layout");
  if (c.layout == CERTATTN_LAYOUT_STRIDED) {
    f(with_scales<K, V>(c, certattn::strided_kv<K, V>(k, v, c.n_tokens, c.head_dim, c.key_stride, c.value_stride)));
  } else {
    if (c.block_table == nullptr && c.block_table_len > 0)
      throw error("cache.block_table is NULL but cache.block_table_len is " +
                  std::to_string(c.block_table_len));
    if (c.block_table == nullptr && c.n_tokens > 0)
      throw error("cache.block_table must not be NULL for a paged cache with tokens");
    const std::span<const std::int32_t> table(c.block_table, c.block_table_len);
    f(with_scales<K, V>(c, certattn::paged_kv<K, V>(k, v, table, c.n_tokens, c.page_size, c.head_dim,
                                                    c.page_stride, c.token_stride, c.head_offset)));
  }
}

template <class F>
void with_cache(const certattn_cache* c, F&& f) {
  require(c, "cache");
  if (c->layout != CERTATTN_LAYOUT_STRIDED && c->layout != CERTATTN_LAYOUT_PAGED &&
      c->layout != CERTATTN_LAYOUT_LATENT)
    throw error("cache.layout = " + std::to_string(c->layout) +
                " is not a certattn_layout (0 strided, 1 paged, 2 latent)");
  if (c->head_dim == 0 || c->head_dim > kMaxHeadDim)
    throw error("cache.head_dim must lie in [1, 65536], got " + std::to_string(c->head_dim));
  if (c->n_tokens > kMaxTokens)
    throw error("cache.n_tokens must be < 2^32 - 1024, got " + std::to_string(c->n_tokens));
  if (c->n_tokens > 0 &&
      (c->keys == nullptr || (c->values == nullptr && c->layout != CERTATTN_LAYOUT_LATENT)))
    throw error("cache.keys and cache.values must not be NULL (cache.n_tokens = " +
                std::to_string(c->n_tokens) + ")");
  if (c->value_dtype != CERTATTN_VALUE_DTYPE_AS_KEYS && c->value_dtype != 1 + c->dtype) {
    // Keys and values in two formats: the pairs llama.cpp's caches use.
    using certattn::block_q4_0;
    using certattn::block_q8_0;
    using certattn::half;
    if (c->dtype == CERTATTN_DTYPE_Q8_0 && c->value_dtype == CERTATTN_VALUE_DTYPE_F16)
      return with_layout<block_q8_0, half>(*c, f);
    if (c->dtype == CERTATTN_DTYPE_Q4_0 && c->value_dtype == CERTATTN_VALUE_DTYPE_F16)
      return with_layout<block_q4_0, half>(*c, f);
    if (c->dtype == CERTATTN_DTYPE_Q8_0 && c->value_dtype == CERTATTN_VALUE_DTYPE_Q4_0)
      return with_layout<block_q8_0, block_q4_0>(*c, f);
    throw error("cache.value_dtype = " + std::to_string(c->value_dtype) + " with cache.dtype = " +
                std::to_string(c->dtype) +
                ": keys and values in two formats are served as q8_0 keys with f16 (value_dtype 1) or q4_0 "
                "(value_dtype 5) values, and q4_0 keys with f16 values; 0 means the keys' format");
  }
  switch (c->dtype) {
    case CERTATTN_DTYPE_F16: return with_layout<certattn::half, certattn::half>(*c, f);
    case CERTATTN_DTYPE_BF16: return with_layout<certattn::bfloat16, certattn::bfloat16>(*c, f);
    case CERTATTN_DTYPE_F32: return with_layout<float, float>(*c, f);
    case CERTATTN_DTYPE_Q8_0: return with_layout<certattn::block_q8_0, certattn::block_q8_0>(*c, f);
    case CERTATTN_DTYPE_Q4_0: return with_layout<certattn::block_q4_0, certattn::block_q4_0>(*c, f);
    case CERTATTN_DTYPE_FP8_E4M3: return with_layout<certattn::fp8_e4m3, certattn::fp8_e4m3>(*c, f);
    case CERTATTN_DTYPE_FP8_E5M2: return with_layout<certattn::fp8_e5m2, certattn::fp8_e5m2>(*c, f);
    default:
      throw error("cache.dtype = " + std::to_string(c->dtype) +
                  " is not a certattn_dtype (0 f16, 1 bf16, 2 f32, 3 q8_0, 4 q4_0, 5 fp8_e4m3, 6 fp8_e5m2)");
  }
}

/// f(views) with views the S caches as one view type (caches[0]'s): a cache of another
/// format or layout is an error naming it. The views live in a buffer per view type and
/// thread, so that calls after the first allocate nothing.
template <class F>
void with_caches(const certattn_cache* caches, std::size_t S, F&& f) {
  require(caches, "caches");
  if (S == 0) throw error("sequences must be > 0");
  with_cache(&caches[0], [&](const auto& kv0) {
    using View = std::decay_t<decltype(kv0)>;
    thread_local std::vector<View> views;
    views.clear();
    for (std::size_t s = 0; s < S; ++s)
      with_cache(&caches[s], [&](const auto& kv) {
        if constexpr (std::is_same_v<std::decay_t<decltype(kv)>, View>)
          views.push_back(kv);
        else
          throw error("caches[" + std::to_string(s) +
                      "]: its dtype, value_dtype or layout differs from caches[0]'s");
      });
    f(std::span<const View>(views));
  });
}

/// The variant with its arrays as spans of `heads` entries (0: none, for the checks that
/// know no group).
certattn::attention_variant to_cpp(const certattn_variant& v, std::size_t heads) {
  certattn::attention_variant r;
  r.logit_softcap = v.logit_softcap;
  r.sliding_window = v.sliding_window;
  if (v.alibi_slopes != nullptr && heads > 0) r.alibi_slopes = std::span<const float>(v.alibi_slopes, heads);
  if (v.sinks != nullptr && heads > 0) r.sinks = std::span<const float>(v.sinks, heads);
  certattn::validate(r, heads, "variant");
  return r;
}

certattn::options to_cpp(const certattn_options& o, std::size_t heads = 0) {
  certattn::options r;
  r.epsilon = o.epsilon;
  r.delta = o.delta;
  if (o.scale < 0 || o.scale > 2)
    throw error("options.scale = " + std::to_string(o.scale) +
                " is not a certattn_error_scale (0 denominator, 1 output_norm, 2 value)");
  r.scale = o.scale == CERTATTN_SCALE_DENOMINATOR   ? certattn::error_scale::kDenominator
            : o.scale == CERTATTN_SCALE_OUTPUT_NORM ? certattn::error_scale::kOutputNorm
                                                    : certattn::error_scale::kValueScale;
  r.window = o.window;
  r.grid_ratio = o.grid_ratio;
  r.max_levels = o.max_levels;
  r.grid_top = o.grid_top;
  r.softmax_scale = o.softmax_scale;
  r.seed = o.seed;
  if (o.certificate != CERTATTN_CERTIFICATE_TIGHT && o.certificate != CERTATTN_CERTIFICATE_CLASSIC)
    throw error("options.certificate = " + std::to_string(o.certificate) +
                " is not a certattn_certificate_kind (0 tight, 1 classic)");
  r.certificate = o.certificate == CERTATTN_CERTIFICATE_TIGHT ? certattn::certificate_kind::kTight
                                                              : certattn::certificate_kind::kClassic;
  if (o.route != CERTATTN_ROUTE_AUTO && o.route != CERTATTN_ROUTE_OFF)
    throw error("options.route = " + std::to_string(o.route) +
                " is not a certattn_routing (0 auto, 1 off)");
  r.route = o.route == CERTATTN_ROUTE_AUTO ? certattn::routing::kAuto : certattn::routing::kOff;
  r.cost.fixed = o.cost.fixed;
  r.cost.per_key = o.cost.per_key;
  r.cost.give_up = o.cost.give_up;
  if (o.cost.measured != 0 && o.cost.measured != 1)
    throw error("options.cost.measured = " + std::to_string(o.cost.measured) + " must be 0 or 1");
  r.cost.measured = o.cost.measured != 0;
  r.variant = to_cpp(o.variant, heads);
  certattn::validate(r);
  return r;
}

std::int32_t to_c(certattn::answer_path p) noexcept {
  switch (p) {
    case certattn::answer_path::kSampled: return CERTATTN_PATH_SAMPLED;
    case certattn::answer_path::kNoPool: return CERTATTN_PATH_NO_POOL;
    case certattn::answer_path::kFallback: return CERTATTN_PATH_FALLBACK;
    case certattn::answer_path::kOverBudget: return CERTATTN_PATH_OVER_BUDGET;
    case certattn::answer_path::kJoined: return CERTATTN_PATH_JOINED;
    case certattn::answer_path::kRouted: return CERTATTN_PATH_ROUTED;
  }
  return -1;
}

certattn_certificate to_c(const certattn::certificate& c) noexcept {
  certattn_certificate r;
  r.certified = c.certified ? 1 : 0;
  r.exact = c.exact ? 1 : 0;
  r.path = to_c(c.path);
  r.level = c.level;
  r.tau = c.tau;
  r.bound = c.bound;
  r.beta = c.beta;
  r.scale_value = c.scale_value;
  r.max_score = c.max_score;
  r.denominator = c.denominator;
  r.heavy = c.heavy;
  r.sampled = c.sampled;
  r.keys_read = c.keys_read;
  r.values_read = c.values_read;
  r.bytes_read = c.bytes_read;
  return r;
}

void check_dims(std::size_t group, std::size_t head_dim, std::size_t max_tokens) {
  if (group == 0 || group > kMaxGroup)
    throw error("group must lie in [1, 65536], got " + std::to_string(group));
  if (head_dim == 0 || head_dim > kMaxHeadDim)
    throw error("head_dim must lie in [1, 65536], got " + std::to_string(head_dim));
  if (max_tokens > kMaxTokens)
    throw error("max_tokens must be < 2^32 - 1024, got " + std::to_string(max_tokens));
}

}  // namespace

extern "C" {

const char* certattn_last_error(void) { return g_last_error; }

const char* certattn_status_string(int status) {
  switch (status) {
    case CERTATTN_OK: return "ok";
    case CERTATTN_EINVAL: return "invalid argument";
    case CERTATTN_ENOMEM: return "out of memory";
    case CERTATTN_EINTERNAL: return "internal error";
  }
  return "unknown status";
}

int certattn_c_api_version(void) { return CERTATTN_C_API_VERSION; }

int certattn_options_default(certattn_options* options) {
  return guarded("certattn_options_default", [&] {
    require(options, "options");
    const certattn::options d;
    certattn_options& o = *options;
    std::memset(&o, 0, sizeof o);
    o.epsilon = d.epsilon;
    o.delta = d.delta;
    o.scale = CERTATTN_SCALE_VALUE;
    o.grid_ratio = d.grid_ratio;
    o.window = d.window;
    o.max_levels = d.max_levels;
    o.grid_top = d.grid_top;
    o.softmax_scale = d.softmax_scale;
    o.seed = d.seed;
    o.certificate = CERTATTN_CERTIFICATE_TIGHT;
    o.route = CERTATTN_ROUTE_AUTO;
    o.cost.fixed = d.cost.fixed;
    o.cost.per_key = d.cost.per_key;
    o.cost.give_up = d.cost.give_up;
    o.cost.measured = d.cost.measured ? 1 : 0;
  });
}

int certattn_options_validate(const certattn_options* options) {
  return guarded("certattn_options_validate", [&] {
    require(options, "options");
    (void)to_cpp(*options);
  });
}

int certattn_sample_budget(const certattn_options* options, size_t tokens, size_t* budget) {
  return guarded("certattn_sample_budget", [&] {
    require(options, "options");
    require(budget, "budget");
    *budget = certattn::sample_budget(to_cpp(*options), tokens);
  });
}

// ---- key index

int certattn_index_create(size_t head_dim, certattn_index** index) {
  return guarded("certattn_index_create", [&] {
    require(index, "index");
    *index = nullptr;
    if (head_dim == 0 || head_dim > kMaxHeadDim)
      throw error("head_dim must lie in [1, 65536], got " + std::to_string(head_dim));
    *index = new certattn_index{certattn::key_index(head_dim)};
  });
}

void certattn_index_destroy(certattn_index* index) { delete index; }

int certattn_index_reserve(certattn_index* index, size_t tokens) {
  return guarded("certattn_index_reserve", [&] {
    require(index, "index");
    if (tokens > kMaxTokens)
      throw error("tokens must be < 2^32 - 1024, got " + std::to_string(tokens));
    index->idx.reserve(tokens);
  });
}

int certattn_index_build(certattn_index* index, const certattn_cache* cache) {
  return guarded("certattn_index_build", [&] {
    require(index, "index");
    with_cache(cache, [&](const auto& kv) { index->idx.build(kv); });
  });
}

int certattn_index_append(certattn_index* index, const certattn_cache* cache, size_t position) {
  return guarded("certattn_index_append", [&] {
    require(index, "index");
    with_cache(cache, [&](const auto& kv) {
      if (position >= kMaxTokens)
        throw error("position must be < 2^32 - 1024, got " + std::to_string(position));
      index->idx.append(kv, position);
    });
  });
}

int certattn_index_append_range(certattn_index* index, const certattn_cache* cache, size_t first,
                                size_t count) {
  return guarded("certattn_index_append_range", [&] {
    require(index, "index");
    with_cache(cache, [&](const auto& kv) {
      if (count > kMaxTokens || first > kMaxTokens - count)
        throw error("first + count must be < 2^32 - 1024");
      index->idx.append_range(kv, first, count);
    });
  });
}

int certattn_index_truncate(certattn_index* index, const certattn_cache* cache, size_t n) {
  return guarded("certattn_index_truncate", [&] {
    require(index, "index");
    with_cache(cache, [&](const auto& kv) { index->idx.truncate(kv, n); });
  });
}

int certattn_index_refresh(certattn_index* index, const certattn_cache* cache) {
  return guarded("certattn_index_refresh", [&] {
    require(index, "index");
    with_cache(cache, [&](const auto& kv) { index->idx.refresh(kv); });
  });
}

int certattn_index_set_refresh_policy(certattn_index* index, int policy) {
  return guarded("certattn_index_set_refresh_policy", [&] {
    require(index, "index");
    if (policy != CERTATTN_REFRESH_ON_DOUBLING && policy != CERTATTN_REFRESH_MANUAL)
      throw error("policy = " + std::to_string(policy) +
                  " is not a certattn_refresh_policy (0 on_doubling, 1 manual)");
    index->idx.set_refresh_policy(policy == CERTATTN_REFRESH_MANUAL
                                      ? certattn::key_index::refresh_policy::kManual
                                      : certattn::key_index::refresh_policy::kOnDoubling);
  });
}

int certattn_index_size(const certattn_index* index, size_t* size) {
  return guarded("certattn_index_size", [&] {
    require(index, "index");
    require(size, "size");
    *size = index->idx.size();
  });
}

int certattn_index_memory_bytes(const certattn_index* index, size_t* bytes) {
  return guarded("certattn_index_memory_bytes", [&] {
    require(index, "index");
    require(bytes, "bytes");
    *bytes = index->idx.memory_bytes();
  });
}

// ---- workspace

int certattn_workspace_create_levels(size_t group, size_t head_dim, size_t max_tokens,
                                     int max_levels, certattn_workspace** workspace) {
  return guarded("certattn_workspace_create", [&] {
    require(workspace, "workspace");
    *workspace = nullptr;
    check_dims(group, head_dim, max_tokens);
    *workspace = new certattn_workspace{
        certattn::attend_workspace(group, head_dim, max_tokens, max_levels),
        certattn::dense_workspace(group, head_dim),
        std::vector<certattn::certificate>(group)};
  });
}

int certattn_workspace_create(size_t group, size_t head_dim, size_t max_tokens,
                              certattn_workspace** workspace) {
  return certattn_workspace_create_levels(group, head_dim, max_tokens,
                                          certattn::options{}.total_levels(), workspace);
}

void certattn_workspace_destroy(certattn_workspace* workspace) { delete workspace; }

int certattn_workspace_time_stages(certattn_workspace* workspace, int on) {
  return guarded("certattn_workspace_time_stages", [&] {
    require(workspace, "workspace");
    workspace->ws.time_stages(on != 0);
  });
}

int certattn_workspace_last_stats(const certattn_workspace* workspace,
                                  certattn_group_stats* stats) {
  return guarded("certattn_workspace_last_stats", [&] {
    require(workspace, "workspace");
    require(stats, "stats");
    const certattn::group_stats& s = workspace->ws.last_stats();
    stats->tokens = s.tokens;
    stats->pool = s.pool;
    stats->candidates = s.candidates;
    stats->refined = s.refined;
    stats->keys_read = s.keys_read;
    stats->values_read = s.values_read;
    stats->fallbacks = s.fallbacks;
    stats->over_budget = s.over_budget;
    stats->routed = s.routed;
    stats->sampled = s.sampled;
    stats->bytes_read = s.bytes_read;
    stats->dense_bytes = s.dense_bytes;
    stats->bound_violations = s.bound_violations;
    for (int i = 0; i < 6; ++i) stats->stage_seconds[i] = s.stage_seconds[i];
  });
}

// ---- history

int certattn_history_create(size_t group, certattn_history** history) {
  return guarded("certattn_history_create", [&] {
    require(history, "history");
    *history = nullptr;
    if (group == 0 || group > kMaxGroup)
      throw error("group must lie in [1, 65536], got " + std::to_string(group));
    *history = new certattn_history{certattn::group_history(group)};
  });
}

void certattn_history_destroy(certattn_history* history) { delete history; }

int certattn_history_reset(certattn_history* history) {
  return guarded("certattn_history_reset", [&] {
    require(history, "history");
    history->h.reset();
  });
}

int certattn_history_last_cost(const certattn_history* history, double* cost) {
  return guarded("certattn_history_last_cost", [&] {
    require(history, "history");
    require(cost, "cost");
    *cost = history->h.last_cost();
  });
}

int certattn_history_levels(const certattn_history* history, int32_t* levels, size_t group) {
  return guarded("certattn_history_levels", [&] {
    require(history, "history");
    require(levels, "levels");
    const auto l = history->h.levels();
    if (group != l.size())
      throw error("group = " + std::to_string(group) + " but the history is for group " +
                  std::to_string(l.size()));
    for (std::size_t g = 0; g < l.size(); ++g) levels[g] = l[g];
  });
}

// ---- calls

namespace {
/// certattn_attend_group() (several false: one position) and certattn_attend_positions().
int attend_call(const char* fn, bool several, const float* queries, size_t positions, size_t group,
                const certattn_cache* cache, const certattn_index* index,
                const certattn_noise_key* key, const certattn_options* options, float* out,
                certattn_certificate* certs, certattn_workspace* workspace,
                certattn_history* history) {
  return guarded(fn, [&] {
    require(queries, "queries");
    require(index, "index");
    require(key, "key");
    require(options, "options");
    require(out, "out");
    require(certs, "certs");
    require(workspace, "workspace");
    const certattn::options opt = to_cpp(*options, group);
    certattn::noise_key nk;
    nk.step = key->step;
    nk.layer = key->layer;
    nk.kv_head = key->kv_head;
    nk.sequence = key->sequence;
    with_cache(cache, [&](const auto& kv) {
      // positions 0 or beyond the cache: attend_positions() says so (Q bounded first: no
      // overflow in Q * group).
      const std::size_t d = kv.head_dim(), Q = positions;
      if (group == 0 || Q > workspace->certs.size() || Q * group > workspace->certs.size())
        throw error(std::string(several ? "positions * group = " : "group = ") +
                    std::to_string(Q * group) + " must lie in [1, " +
                    std::to_string(workspace->certs.size()) + "] (the workspace's group)");
      if (d != workspace->ws.head_dim())
        throw error("cache.head_dim (" + std::to_string(d) + ") != the workspace's head_dim (" +
                    std::to_string(workspace->ws.head_dim()) + ")");
      const std::span<const float> q(queries, Q * group * d);
      const std::span<float> o(out, Q * group * certattn::value_dim_of(kv));
      const std::span<certattn::certificate> c(workspace->certs.data(), Q * group);
      if (!several && history != nullptr)
        certattn::attend_group(q, group, kv, index->idx, nk, opt, o, c, workspace->ws, history->h);
      else if (!several)
        certattn::attend_group(q, group, kv, index->idx, nk, opt, o, c, workspace->ws);
      else if (history != nullptr)
        certattn::attend_positions(q, positions, group, kv, index->idx, nk, opt, o, c, workspace->ws,
                                   history->h);
      else
        certattn::attend_positions(q, positions, group, kv, index->idx, nk, opt, o, c, workspace->ws);
      for (std::size_t g = 0; g < Q * group; ++g) certs[g] = to_c(c[g]);
    });
  });
}
}  // namespace

int certattn_attend_group(const float* queries, size_t group, const certattn_cache* cache,
                          const certattn_index* index, const certattn_noise_key* key,
                          const certattn_options* options, float* out,
                          certattn_certificate* certs, certattn_workspace* workspace,
                          certattn_history* history) {
  return attend_call("certattn_attend_group", false, queries, 1, group, cache, index, key, options, out, certs,
                     workspace, history);
}

int certattn_attend_positions(const float* queries, size_t positions, size_t group,
                              const certattn_cache* cache, const certattn_index* index,
                              const certattn_noise_key* key, const certattn_options* options,
                              float* out, certattn_certificate* certs,
                              certattn_workspace* workspace, certattn_history* history) {
  return attend_call("certattn_attend_positions", true, queries, positions, group, cache, index, key, options,
                     out, certs, workspace, history);
}

namespace {
/// certattn_dense_attend(_variant) (several false: one position) and
/// certattn_dense_attend_positions().
int dense_attend_call(const char* fn, bool several, const float* queries, size_t positions, size_t group,
                      const certattn_cache* cache, float softmax_scale,
                      const certattn_variant* variant, float* out, certattn_workspace* workspace) {
  return guarded(fn, [&] {
    require(queries, "queries");
    require(out, "out");
    require(workspace, "workspace");
    with_cache(cache, [&](const auto& kv) {
      // positions 0 or beyond the cache: dense_attend_positions() says so (Q bounded first).
      const std::size_t d = kv.head_dim(), Q = positions;
      if (kv.size() == 0) throw error("cache.n_tokens: the cache is empty");
      if (group == 0 || Q > workspace->dense.group() || Q * group > workspace->dense.group())
        throw error(std::string(several ? "positions * group = " : "group = ") +
                    std::to_string(Q * group) + " must lie in [1, " +
                    std::to_string(workspace->dense.group()) + "] (the workspace's group)");
      if (d != workspace->dense.head_dim())
        throw error("cache.head_dim (" + std::to_string(d) + ") != the workspace's head_dim (" +
                    std::to_string(workspace->dense.head_dim()) + ")");
      for (std::size_t i = 0; i < Q * group * d; ++i)
        if (!std::isfinite(queries[i])) throw error("queries contain a NaN or Inf");
      const certattn::attention_variant v =
          variant != nullptr ? to_cpp(*variant, group) : certattn::attention_variant{};
      const std::span<const float> q(queries, Q * group * d);
      const std::span<float> o(out, Q * group * certattn::value_dim_of(kv));
      if (several)
        certattn::dense_attend_positions(q, positions, group, kv, softmax_scale, o, workspace->dense, v);
      else
        certattn::dense_attend(q, group, kv, softmax_scale, o, workspace->dense, 0, SIZE_MAX, v);
    });
  });
}
}  // namespace

int certattn_dense_attend(const float* queries, size_t group, const certattn_cache* cache,
                          float softmax_scale, float* out, certattn_workspace* workspace) {
  return dense_attend_call("certattn_dense_attend", false, queries, 1, group, cache, softmax_scale, nullptr, out,
                           workspace);
}

int certattn_dense_attend_variant(const float* queries, size_t group, const certattn_cache* cache,
                                  float softmax_scale, const certattn_variant* variant, float* out,
                                  certattn_workspace* workspace) {
  return dense_attend_call("certattn_dense_attend_variant", false, queries, 1, group, cache, softmax_scale, variant,
                           out, workspace);
}

int certattn_dense_attend_positions(const float* queries, size_t positions, size_t group,
                                    const certattn_cache* cache, float softmax_scale,
                                    const certattn_variant* variant, float* out,
                                    certattn_workspace* workspace) {
  return dense_attend_call("certattn_dense_attend_positions", true, queries, positions, group, cache,
                           softmax_scale, variant, out, workspace);
}


int certattn_attend_sequences(const float* queries, size_t sequences, size_t group,
                              const certattn_cache* caches, const certattn_index* prefix_index,
                              const certattn_noise_key* key, const uint64_t* sequence_ids,
                              const certattn_options* options, float* out, certattn_certificate* certs,
                              certattn_workspace* workspace, certattn_history* const* histories) {
  return guarded("certattn_attend_sequences", [&] {
    require(queries, "queries");
    require(prefix_index, "prefix_index");
    require(key, "key");
    require(sequence_ids, "sequence_ids");
    require(options, "options");
    require(out, "out");
    require(certs, "certs");
    require(workspace, "workspace");
    const std::size_t S = sequences;
    if (group == 0 || S == 0 || S > workspace->certs.size() || S * group > workspace->certs.size())
      throw error("sequences * group = " + std::to_string(S * group) + " must lie in [1, " +
                  std::to_string(workspace->certs.size()) + "] (the workspace's group)");
    const certattn::options opt = to_cpp(*options, group);
    certattn::noise_key nk;
    nk.step = key->step;
    nk.layer = key->layer;
    nk.kv_head = key->kv_head;
    with_caches(caches, S, [&](auto views) {
      const std::size_t d = views[0].head_dim();
      if (d != workspace->ws.head_dim())
        throw error("caches[0].head_dim (" + std::to_string(d) + ") != the workspace's head_dim (" +
                    std::to_string(workspace->ws.head_dim()) + ")");
      const std::span<const float> q(queries, S * group * d);
      const std::span<float> o(out, S * group * certattn::value_dim_of(views[0]));
      const std::span<certattn::certificate> c(workspace->certs.data(), S * group);
      const std::span<const std::uint64_t> ids(sequence_ids, S);
      if (histories != nullptr) {
        thread_local std::vector<certattn::group_history*> hs;
        hs.clear();
        for (std::size_t s = 0; s < S; ++s) {
          if (histories[s] == nullptr) throw error("histories[" + std::to_string(s) + "] is NULL");
          hs.push_back(&histories[s]->h);
        }
        certattn::attend_sequences(q, group, views, prefix_index->idx, nk, ids, opt, o, c, workspace->ws,
                                   std::span<certattn::group_history* const>(hs));
      } else {
        certattn::attend_sequences(q, group, views, prefix_index->idx, nk, ids, opt, o, c, workspace->ws);
      }
      for (std::size_t g = 0; g < S * group; ++g) certs[g] = to_c(c[g]);
    });
  });
}

int certattn_dense_attend_sequences(const float* queries, size_t sequences, size_t group,
                                    const certattn_cache* caches, size_t prefix_tokens, float softmax_scale,
                                    const certattn_variant* variant, float* out,
                                    certattn_workspace* workspace) {
  return guarded("certattn_dense_attend_sequences", [&] {
    require(queries, "queries");
    require(out, "out");
    require(workspace, "workspace");
    const std::size_t S = sequences;
    if (group == 0 || S == 0 || S > workspace->dense.group() || S * group > workspace->dense.group())
      throw error("sequences * group = " + std::to_string(S * group) + " must lie in [1, " +
                  std::to_string(workspace->dense.group()) + "] (the workspace's group)");
    with_caches(caches, S, [&](auto views) {
      const std::size_t d = views[0].head_dim();
      if (d != workspace->dense.head_dim())
        throw error("caches[0].head_dim (" + std::to_string(d) + ") != the workspace's head_dim (" +
                    std::to_string(workspace->dense.head_dim()) + ")");
      for (std::size_t i = 0; i < S * group * d; ++i)
        if (!std::isfinite(queries[i])) throw error("queries contain a NaN or Inf");
      const certattn::attention_variant v =
          variant != nullptr ? to_cpp(*variant, group) : certattn::attention_variant{};
      certattn::dense_attend_sequences(std::span<const float>(queries, S * group * d), group, views,
                                       prefix_tokens, softmax_scale,
                                       std::span<float>(out, S * group * certattn::value_dim_of(views[0])),
                                       workspace->dense, v);
    });
  });
}

namespace {
int exact_attention_call(const char* fn, const float* query, const certattn_cache* cache,
                         double softmax_scale, const certattn_variant* variant, double* out,
                         certattn_exact_result* result) {
  return guarded(fn, [&] {
    require(query, "query");
    require(out, "out");
    if (!(softmax_scale >= 0.0) || !std::isfinite(softmax_scale))
      throw error("softmax_scale must be finite and >= 0 (0 = 1/sqrt(head_dim))");
    with_cache(cache, [&](const auto& kv) {
      const std::size_t n = kv.size(), d = kv.head_dim(), dv = certattn::value_dim_of(kv);
      if (n == 0) throw error("cache.n_tokens: the cache is empty");
      // Gathered into contiguous rows (a quantized cache's decoded): one code path for every
      // layout (a check, not a hot path).
      const certattn::dense_rows<std::decay_t<decltype(kv)>> rows(kv);
      const certattn::exact_result r = certattn::exact_attention(
          std::span<const float>(query, d), rows.key_matrix(), rows.value_matrix(), softmax_scale,
          variant != nullptr ? to_cpp(*variant, 1) : certattn::attention_variant{});
      for (std::size_t i = 0; i < dv; ++i) out[i] = r.output[i];
      if (result != nullptr) {
        result->max_score = r.max_score;
        result->denominator = r.denominator;
        result->value_scale = r.value_scale;
        result->output_norm = r.output_norm;
      }
    });
  });
}
}  // namespace

int certattn_exact_attention(const float* query, const certattn_cache* cache,
                             double softmax_scale, double* out, certattn_exact_result* result) {
  return exact_attention_call("certattn_exact_attention", query, cache, softmax_scale, nullptr, out, result);
}

int certattn_exact_attention_variant(const float* query, const certattn_cache* cache,
                                     double softmax_scale, const certattn_variant* variant,
                                     double* out, certattn_exact_result* result) {
  return exact_attention_call("certattn_exact_attention_variant", query, cache, softmax_scale, variant, out,
                              result);
}

}  // extern "C"
