// The C ABI gives exactly what the C++ API gives: the same outputs (bit for bit) and the
// same certificates for the same cache, index, options and noise key, for every element
// type (the quantized formats included), strided and paged layouts, with and without a
// group_history; the C handles hold
// the C++ objects, so an index built through C equals one built in C++. And the C calls
// that the C++ side makes without allocating (certified and dense calls, index appends
// within a reservation) allocate nothing either. Deterministic: no statistical check.
// This file replaces the global operator new to count allocations (the shared library's
// calls resolve to it too), so it is its own test executable.
#include <certattn/c/certattn.h>

#include <certattn/attend.hpp>
#include <certattn/dense.hpp>
#include <certattn/exact.hpp>
#include <certattn/testing/synthetic.hpp>

#include "../support/layouts.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

#include "../support/count_allocations.hpp"

namespace {
using namespace certattn;
using test::layout_kind;

constexpr std::size_t kHead = 1;  // of two KV heads: offsets and strides matter

template <class T>
constexpr std::int32_t dtype_of() {
  if constexpr (std::is_same_v<T, half>) return CERTATTN_DTYPE_F16;
  if constexpr (std::is_same_v<T, bfloat16>) return CERTATTN_DTYPE_BF16;
  if constexpr (std::is_same_v<T, block_q8_0>) return CERTATTN_DTYPE_Q8_0;
  if constexpr (std::is_same_v<T, fp8_e4m3>) return CERTATTN_DTYPE_FP8_E4M3;
  return CERTATTN_DTYPE_F32;
}

// The C description of head kHead of a layout_cache (as its strided() / paged() views).
template <class K, class V>
certattn_cache describe(const test::layout_cache<K, V>& c, std::size_t n) {
  certattn_cache r;
  std::memset(&r, 0, sizeof r);
  r.dtype = dtype_of<K>();
  if constexpr (!std::is_same_v<K, V>) r.value_dtype = 1 + dtype_of<V>();
  r.n_tokens = n;
  r.head_dim = c.d;
  if constexpr (fp8_element<K>) {
    r.key_scale = c.scales[kHead].key;
    r.value_scale = c.scales[kHead].value;
  }
  const std::size_t u = format_traits<K>::units(c.d);  // strides count key blocks
  if (c.kind == layout_kind::kPaged) {
    r.layout = CERTATTN_LAYOUT_PAGED;
    r.keys = c.keys.data();
    r.values = c.values.data();
    r.block_table = c.table.data();
    r.block_table_len = c.table.size();
    r.page_size = c.page;
    r.page_stride = c.heads * c.page * u;
    r.token_stride = u;
    r.head_offset = kHead * c.page * u;
  } else {
    const auto v = c.strided(kHead);
    r.layout = CERTATTN_LAYOUT_STRIDED;
    r.keys = v.key(0);
    r.values = v.value(0);
    r.key_stride = v.key_stride();
    r.value_stride = v.value_stride();
  }
  return r;
}

certattn_options to_c(const options& o) {
  certattn_options r;
  EXPECT_EQ(certattn_options_default(&r), CERTATTN_OK);
  r.epsilon = o.epsilon;
  r.delta = o.delta;
  r.scale = o.scale == error_scale::kDenominator   ? CERTATTN_SCALE_DENOMINATOR
            : o.scale == error_scale::kOutputNorm ? CERTATTN_SCALE_OUTPUT_NORM
                                                  : CERTATTN_SCALE_VALUE;
  r.window = o.window;
  r.grid_ratio = o.grid_ratio;
  r.max_levels = o.max_levels;
  r.grid_top = o.grid_top;
  r.softmax_scale = o.softmax_scale;
  r.seed = o.seed;
  r.certificate = o.certificate == certificate_kind::kTight ? CERTATTN_CERTIFICATE_TIGHT
                                                            : CERTATTN_CERTIFICATE_CLASSIC;
  r.route = o.route == routing::kAuto ? CERTATTN_ROUTE_AUTO : CERTATTN_ROUTE_OFF;
  r.cost.fixed = o.cost.fixed;
  r.cost.per_key = o.cost.per_key;
  r.cost.give_up = o.cost.give_up;
  r.cost.measured = o.cost.measured ? 1 : 0;
  r.variant.logit_softcap = o.variant.logit_softcap;
  r.variant.alibi_slopes = o.variant.alibi_slopes.empty() ? nullptr : o.variant.alibi_slopes.data();
  r.variant.sinks = o.variant.sinks.empty() ? nullptr : o.variant.sinks.data();
  r.variant.sliding_window = o.variant.sliding_window;
  return r;
}

void expect_same(const certificate& a, const certattn_certificate& b, const std::string& where) {
  SCOPED_TRACE(where);
  EXPECT_EQ(int(a.certified), b.certified);
  EXPECT_EQ(int(a.exact), b.exact);
  EXPECT_EQ(int(a.path), b.path);  // the C enumerators follow answer_path's order
  EXPECT_EQ(a.level, b.level);
  // Bit for bit: the same computation, only copied.
  EXPECT_EQ(std::memcmp(&a.tau, &b.tau, sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(&a.bound, &b.bound, sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(&a.beta, &b.beta, sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(&a.scale_value, &b.scale_value, sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(&a.max_score, &b.max_score, sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(&a.denominator, &b.denominator, sizeof(double)), 0);
  EXPECT_EQ(a.heavy, b.heavy);
  EXPECT_EQ(a.sampled, b.sampled);
  EXPECT_EQ(a.keys_read, b.keys_read);
  EXPECT_EQ(a.values_read, b.values_read);
  EXPECT_EQ(a.bytes_read, b.bytes_read);
}

struct equiv_case {
  synthetic::regime regime;
  layout_kind layout;
  int dtype;  // 0 half, 1 bfloat16, 2 float, 3 q8_0, 4 fp8_e4m3, 5 q8_0 keys with f16 values
};

std::string name_of(const testing::TestParamInfo<equiv_case>& p) {
  static const char* types[] = {"f16", "bf16", "f32", "q8_0", "fp8_e4m3", "q8_0_values_f16"};
  return std::string(synthetic::to_string(p.param.regime)) + "_" + test::to_string(p.param.layout) +
         "_" + types[p.param.dtype];
}

class CApiEquivalence : public testing::TestWithParam<equiv_case> {};

template <class K, class V = K>
void run_case(const equiv_case& p) {
  constexpr std::size_t n = 4096, d = 64, G = 4;
  synthetic::cache_config cfg;
  cfg.n_tokens = n;
  cfg.head_dim = d;
  cfg.kv_heads = 2;
  cfg.kind = p.regime;
  const synthetic::kv_cache src = synthetic::make_cache(cfg);
  const test::layout_cache<K, V> lc = test::make_layout_cache<K, V>(src, p.layout);
  const certattn_cache cc = describe(lc, n);

  auto with_view = [&](auto&& f) {
    if (p.layout == layout_kind::kPaged)
      f(lc.paged(kHead));
    else
      f(lc.strided(kHead));
  };

  with_view([&](const auto& kv) {
    // Indexes: C++ built in one go; C built over a prefix and appended to within its
    // reservation (counted: no allocation), then compared through the calls' results,
    // which depend on every code and bound of the index.
    key_index idx(d);
    idx.build(kv);
    certattn_index* cidx = nullptr;
    ASSERT_EQ(certattn_index_create(d, &cidx), CERTATTN_OK);
    ASSERT_EQ(certattn_index_reserve(cidx, n), CERTATTN_OK);
    const certattn_cache prefix = describe(lc, n / 2);
    g_allocations = 0;
    g_counting = true;
    ASSERT_EQ(certattn_index_build(cidx, &prefix), CERTATTN_OK) << certattn_last_error();
    ASSERT_EQ(certattn_index_append_range(cidx, &cc, n / 2, n / 2), CERTATTN_OK);
    ASSERT_EQ(certattn_index_refresh(cidx, &cc), CERTATTN_OK);  // bounds as a full build's
    g_counting = false;
    EXPECT_EQ(g_allocations.load(), 0) << "index build/append/refresh within the reservation";
    // Appends leave the codes of a full build only for complete blocks; rebuild so that
    // both indexes are the same (a build within the reservation allocates nothing).
    g_counting = true;
    ASSERT_EQ(certattn_index_build(cidx, &cc), CERTATTN_OK);
    g_counting = false;
    EXPECT_EQ(g_allocations.load(), 0);

    attend_workspace ws(G, d, n);
    certattn_workspace* cws = nullptr;
    ASSERT_EQ(certattn_workspace_create(G, d, n, &cws), CERTATTN_OK);
    group_history hist(G);
    certattn_history* chist = nullptr;
    g_allocations = 0;
    g_counting = true;
    ASSERT_EQ(certattn_history_create(G, &chist), CERTATTN_OK);
    g_counting = false;
    EXPECT_GT(g_allocations.load(), 0) << "the counter must see the library's allocations";

    options tight;  // defaults: tight, value scale, routing on
    // Routing on the prediction: the two histories then take the same decisions (measured
    // costs depend on each call's timing).
    tight.cost.measured = false;
    options classic;
    classic.certificate = certificate_kind::kClassic;
    classic.route = routing::kOff;
    classic.seed = 99;
    options denom;
    denom.scale = error_scale::kDenominator;
    denom.epsilon = 0.05;
    options outnorm;
    outnorm.scale = error_scale::kOutputNorm;
    outnorm.softmax_scale = 0.2;
    outnorm.window = 16;
    // A model's variant: soft-cap, position bias, sinks and a sliding window at once.
    const std::vector<float> slopes = {0.01f, 0.002f, -0.001f, 0.0005f}, sinks = {2.0f, -1.0f, 0.5f, 4.0f};
    options variant_opt;
    variant_opt.route = routing::kOff;
    variant_opt.variant.logit_softcap = 20.0;
    variant_opt.variant.alibi_slopes = slopes;
    variant_opt.variant.sinks = sinks;
    variant_opt.variant.sliding_window = 3000;

    std::vector<float> out(G * d), cout_(G * d);
    std::vector<certificate> certs(G);
    std::vector<certattn_certificate> ccerts(G);
    std::size_t sparse = 0, routed = 0;
    long allocations = 0;
    for (std::uint64_t step = 0; step < 10; ++step) {
      const std::vector<float> q = synthetic::make_queries(src, kHead, G, step);
      const noise_key nk(step, 2, kHead, step % 3);
      const certattn_noise_key ck{step, 2, std::uint32_t(kHead), step % 3};
      for (int variant = 0; variant < 5; ++variant) {
        const options& o = variant == 0   ? tight
                           : variant == 1 ? classic
                           : variant == 2 ? denom
                           : variant == 3 ? outnorm
                                          : variant_opt;
        const bool with_history = variant == 0;  // the history follows one option set
        const certattn_options co = to_c(o);
        if (with_history)
          attend_group(std::span<const float>(q), G, kv, idx, nk, o, std::span<float>(out),
                       std::span<certificate>(certs), ws, hist);
        else
          attend_group(std::span<const float>(q), G, kv, idx, nk, o, std::span<float>(out),
                       std::span<certificate>(certs), ws);
        std::fill(cout_.begin(), cout_.end(), -1.0f);
        g_allocations = 0;
        g_counting = step > 0;  // the first call of each variant may warm up
        const int rc = certattn_attend_group(q.data(), G, &cc, cidx, &ck, &co, cout_.data(),
                                             ccerts.data(), cws, with_history ? chist : nullptr);
        g_counting = false;
        allocations += g_allocations.load();
        ASSERT_EQ(rc, CERTATTN_OK) << certattn_last_error();
        const std::string where = "step " + std::to_string(step) + ", variant " + std::to_string(variant);
        EXPECT_EQ(std::memcmp(out.data(), cout_.data(), out.size() * sizeof(float)), 0) << where;
        for (std::size_t g = 0; g < G; ++g) {
          expect_same(certs[g], ccerts[g], where + ", head " + std::to_string(g));
          sparse += certs[g].path == answer_path::kSampled;
          routed += certs[g].path == answer_path::kRouted;
        }
        // The group statistics are the C++ workspace's.
        certattn_group_stats st;
        ASSERT_EQ(certattn_workspace_last_stats(cws, &st), CERTATTN_OK);
        EXPECT_EQ(st.keys_read, ws.last_stats().keys_read) << where;
        EXPECT_EQ(st.bytes_read, ws.last_stats().bytes_read) << where;
        EXPECT_EQ(st.sampled, ws.last_stats().sampled) << where;
        EXPECT_EQ(st.routed, ws.last_stats().routed) << where;
      }
      // The histories agree.
      double cost = 0.0;
      ASSERT_EQ(certattn_history_last_cost(chist, &cost), CERTATTN_OK);
      if (std::isnan(hist.last_cost()))
        EXPECT_TRUE(std::isnan(cost));
      else
        EXPECT_EQ(cost, hist.last_cost());
      std::int32_t levels[G];
      ASSERT_EQ(certattn_history_levels(chist, levels, G), CERTATTN_OK);
      for (std::size_t g = 0; g < G; ++g) EXPECT_EQ(levels[g], hist.levels()[g]);

      // The dense kernel: the C++ call's bits, without allocating.
      dense_workspace dws(G, d);
      dense_attend(std::span<const float>(q), G, kv, 0.0f, std::span<float>(out), dws);
      g_allocations = 0;
      g_counting = true;
      ASSERT_EQ(certattn_dense_attend(q.data(), G, &cc, 0.0f, cout_.data(), cws), CERTATTN_OK);
      g_counting = false;
      allocations += g_allocations.load();
      EXPECT_EQ(std::memcmp(out.data(), cout_.data(), out.size() * sizeof(float)), 0);
      // ... and with a variant.
      const certattn_options cv = to_c(variant_opt);
      dense_attend(std::span<const float>(q), G, kv, 0.0f, std::span<float>(out), dws, 0, SIZE_MAX,
                   variant_opt.variant);
      g_allocations = 0;
      g_counting = true;
      ASSERT_EQ(certattn_dense_attend_variant(q.data(), G, &cc, 0.0f, &cv.variant, cout_.data(), cws),
                CERTATTN_OK);
      g_counting = false;
      allocations += g_allocations.load();
      EXPECT_EQ(std::memcmp(out.data(), cout_.data(), out.size() * sizeof(float)), 0);
    }
    EXPECT_EQ(allocations, 0) << "certified and dense C calls after setup";
    EXPECT_GT(sparse + routed, 0u);

    // The exact reference: the C++ function's bits.
    {
      const std::vector<float> q = synthetic::make_queries(src, kHead, 1, 77);
      const dense_rows<std::decay_t<decltype(kv)>> rows(kv);  // decoded, if quantized
      const exact_result r = exact_attention(std::span<const float>(q), rows.key_matrix(),
                                             rows.value_matrix(), 0.3);
      std::vector<double> o(d);
      certattn_exact_result cr;
      ASSERT_EQ(certattn_exact_attention(q.data(), &cc, 0.3, o.data(), &cr), CERTATTN_OK);
      EXPECT_EQ(std::memcmp(o.data(), r.output.data(), d * sizeof(double)), 0);
      EXPECT_EQ(cr.max_score, r.max_score);
      EXPECT_EQ(cr.denominator, r.denominator);
      EXPECT_EQ(cr.value_scale, r.value_scale);
      EXPECT_EQ(cr.output_norm, r.output_norm);
      // With a variant (this head's entries).
      const attention_variant hv = head_slice(variant_opt.variant, 2);
      const exact_result rv = exact_attention(std::span<const float>(q), rows.key_matrix(),
                                              rows.value_matrix(), 0.3, hv);
      certattn_variant chv{hv.logit_softcap, hv.alibi_slopes.data(), hv.sinks.data(), hv.sliding_window};
      ASSERT_EQ(certattn_exact_attention_variant(q.data(), &cc, 0.3, &chv, o.data(), &cr), CERTATTN_OK);
      EXPECT_EQ(std::memcmp(o.data(), rv.output.data(), d * sizeof(double)), 0);
      EXPECT_EQ(cr.denominator, rv.denominator);
      // A bad variant names its field.
      chv.logit_softcap = -1.0;
      EXPECT_EQ(certattn_exact_attention_variant(q.data(), &cc, 0.3, &chv, o.data(), &cr), CERTATTN_EINVAL);
      EXPECT_NE(std::string(certattn_last_error()).find("variant.logit_softcap"), std::string::npos)
          << certattn_last_error();
    }

    certattn_history_destroy(chist);
    certattn_workspace_destroy(cws);
    certattn_index_destroy(cidx);
  });
}

TEST_P(CApiEquivalence, SameBitsAndCertificatesAsTheCppCall) {
  const equiv_case& p = GetParam();
  switch (p.dtype) {
    case 0: run_case<half>(p); break;
    case 1: run_case<bfloat16>(p); break;
    case 3: run_case<block_q8_0>(p); break;
    case 4: run_case<fp8_e4m3>(p); break;
    case 5: run_case<block_q8_0, half>(p); break;
    default: run_case<float>(p); break;
  }
}

std::vector<equiv_case> cases() {
  std::vector<equiv_case> c;
  for (synthetic::regime r : {synthetic::regime::kMixed, synthetic::regime::kUniform})
    for (layout_kind l : {layout_kind::kHnd, layout_kind::kNhd, layout_kind::kPaged})
      for (int t = 0; t < 3; ++t) c.push_back({r, l, t});
  c.push_back({synthetic::regime::kPeaked, layout_kind::kNhd, 0});
  c.push_back({synthetic::regime::kExtreme, layout_kind::kPaged, 1});
  // A block format and a scaled fp8 one on each layout: the C side's strides in blocks and
  // its scales (the other formats differ only in their decoder, tests/test_formats.cpp).
  for (int t = 3; t < 5; ++t)
    for (layout_kind l : {layout_kind::kHnd, layout_kind::kNhd, layout_kind::kPaged})
      c.push_back({synthetic::regime::kMixed, l, t});
  // Keys and values in two formats (cache.value_dtype): strided and paged.
  for (layout_kind l : {layout_kind::kNhd, layout_kind::kPaged}) c.push_back({synthetic::regime::kMixed, l, 5});
  return c;
}

INSTANTIATE_TEST_SUITE_P(All, CApiEquivalence, testing::ValuesIn(cases()), name_of);

// Quantized caches: a scale on a non-fp8 cache, a bad fp8 scale, a block row that is not
// whole blocks, and an index built from another format each give CERTATTN_EINVAL with a
// message naming the field.
TEST(CApiQuantized, BadInputNamesTheField) {
  std::vector<fp8_e4m3> k(64 * 32), v(64 * 32);
  certattn_cache c;
  std::memset(&c, 0, sizeof c);
  c.dtype = CERTATTN_DTYPE_FP8_E4M3;
  c.layout = CERTATTN_LAYOUT_STRIDED;
  c.keys = k.data();
  c.values = v.data();
  c.n_tokens = 64;
  c.head_dim = 32;
  c.key_stride = c.value_stride = 32;
  certattn_index* idx = nullptr;
  ASSERT_EQ(certattn_index_create(32, &idx), CERTATTN_OK);
  auto fails_naming = [&](const char* field) {
    EXPECT_EQ(certattn_index_build(idx, &c), CERTATTN_EINVAL) << field;
    EXPECT_NE(std::string(certattn_last_error()).find(field), std::string::npos) << certattn_last_error();
  };
  c.key_scale = -1.0f;
  fails_naming("cache.key_scale");
  c.key_scale = 0.5f;
  c.value_scale = NAN;
  fails_naming("cache.value_scale");
  c.value_scale = 0.0f;
  ASSERT_EQ(certattn_index_build(idx, &c), CERTATTN_OK);
  c.key_scale = 0.25f;  // another scale than the index's
  EXPECT_EQ(certattn_index_append(idx, &c, 63), CERTATTN_EINVAL);
  c.dtype = CERTATTN_DTYPE_F16;  // scales on a 16-bit cache
  fails_naming("cache.key_scale");
  c.dtype = CERTATTN_DTYPE_Q8_0;
  c.key_scale = 0.0f;
  c.head_dim = 48;
  fails_naming("head_dim (48)");
  c.head_dim = 32;
  c.value_dtype = CERTATTN_VALUE_DTYPE_FP8_E5M2;  // a pair of formats not served
  fails_naming("cache.value_dtype");
  c.value_dtype = CERTATTN_VALUE_DTYPE_F16;
  c.value_stride = 16;  // in units of the values' format: an f16 row is 32 elements
  fails_naming("value_stride (16)");
  c.layout = CERTATTN_LAYOUT_LATENT;
  fails_naming("cache.value_dtype must be 0 for the latent layout");
  certattn_index_destroy(idx);
}

// The enumerators of the C header follow the C++ enumerations' order (the equivalence
// test above relies on it for answer_path).
// A latent cache (multi-head latent attention): the C layout gives the C++ latent_kv's
// bits, for the certified call, the dense kernel and exact attention.
TEST(CApiLatent, SameBitsAsTheCppCall) {
  constexpr std::size_t n = 3000, d = 128, dv = 96, G = 8;
  synthetic::cache_config cfg;
  cfg.n_tokens = n;
  cfg.head_dim = d;
  const synthetic::kv_cache src = synthetic::make_cache(cfg);
  const latent_kv<half> kv(src.key_row(0, 0), n, d, dv, d);
  certattn_cache cc;
  std::memset(&cc, 0, sizeof cc);
  cc.dtype = CERTATTN_DTYPE_F16;
  cc.layout = CERTATTN_LAYOUT_LATENT;
  cc.keys = src.key_row(0, 0);
  cc.n_tokens = n;
  cc.head_dim = d;
  cc.key_stride = d;
  cc.value_dim = dv;
  key_index idx(d);
  idx.build(kv);
  certattn_index* cidx = nullptr;
  ASSERT_EQ(certattn_index_create(d, &cidx), CERTATTN_OK);
  ASSERT_EQ(certattn_index_build(cidx, &cc), CERTATTN_OK) << certattn_last_error();
  attend_workspace ws(G, d, n);
  certattn_workspace* cws = nullptr;
  ASSERT_EQ(certattn_workspace_create(G, d, n, &cws), CERTATTN_OK);
  options o;
  o.route = routing::kOff;
  o.softmax_scale = 0.125;
  const certattn_options co = to_c(o);
  std::vector<float> out(G * dv), cout_(G * dv);
  std::vector<certificate> certs(G);
  std::vector<certattn_certificate> ccerts(G);
  for (std::uint64_t step = 0; step < 3; ++step) {
    const std::vector<float> q = synthetic::make_queries(src, 0, G, step);
    const noise_key nk(step, 1, 0);
    const certattn_noise_key ck{step, 1, 0, 0};
    attend_group(std::span<const float>(q), G, kv, idx, nk, o, std::span<float>(out), std::span<certificate>(certs),
                 ws);
    ASSERT_EQ(certattn_attend_group(q.data(), G, &cc, cidx, &ck, &co, cout_.data(), ccerts.data(), cws, nullptr),
              CERTATTN_OK)
        << certattn_last_error();
    EXPECT_EQ(std::memcmp(out.data(), cout_.data(), out.size() * sizeof(float)), 0);
    for (std::size_t g = 0; g < G; ++g) expect_same(certs[g], ccerts[g], "latent head " + std::to_string(g));
    dense_workspace dws(G, d);
    dense_attend(std::span<const float>(q), G, kv, 0.125f, std::span<float>(out), dws);
    ASSERT_EQ(certattn_dense_attend(q.data(), G, &cc, 0.125f, cout_.data(), cws), CERTATTN_OK);
    EXPECT_EQ(std::memcmp(out.data(), cout_.data(), out.size() * sizeof(float)), 0);
    const exact_result r = exact_attention(std::span<const float>(q).first(d), kv, 0.125);
    std::vector<double> eo(dv);
    ASSERT_EQ(certattn_exact_attention(q.data(), &cc, 0.125, eo.data(), nullptr), CERTATTN_OK);
    EXPECT_EQ(std::memcmp(eo.data(), r.output.data(), dv * sizeof(double)), 0);
  }
  // Values other than the key rows, or a value width without the latent layout: refused.
  certattn_cache bad = cc;
  bad.values = src.value_row(0, 0);
  EXPECT_EQ(certattn_index_build(cidx, &bad), CERTATTN_EINVAL);
  EXPECT_NE(std::string(certattn_last_error()).find("cache.values must be NULL or equal to cache.keys"),
            std::string::npos);
  bad = cc;
  bad.layout = CERTATTN_LAYOUT_STRIDED;
  bad.values = src.value_row(0, 0);
  bad.value_stride = d;
  EXPECT_EQ(certattn_index_build(cidx, &bad), CERTATTN_EINVAL);
  EXPECT_NE(std::string(certattn_last_error()).find("needs the latent layout"), std::string::npos);
  certattn_workspace_destroy(cws);
  certattn_index_destroy(cidx);
}

TEST(CApiLayout, EnumeratorsMatchTheCppOrder) {
  EXPECT_EQ(int(answer_path::kSampled), CERTATTN_PATH_SAMPLED);
  EXPECT_EQ(int(answer_path::kNoPool), CERTATTN_PATH_NO_POOL);
  EXPECT_EQ(int(answer_path::kFallback), CERTATTN_PATH_FALLBACK);
  EXPECT_EQ(int(answer_path::kOverBudget), CERTATTN_PATH_OVER_BUDGET);
  EXPECT_EQ(int(answer_path::kJoined), CERTATTN_PATH_JOINED);
  EXPECT_EQ(int(answer_path::kRouted), CERTATTN_PATH_ROUTED);
  EXPECT_EQ(certattn_c_api_version(), CERTATTN_C_API_VERSION);
}

}  // namespace
