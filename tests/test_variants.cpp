// The attention variants of current open models (variant.hpp): for every row of the model
// table of docs/integration.md, a synthetic layer of that shape (head_dim, G, variant),
// where the fast path computes what the reference computes (same path, level, sample
// sets token by token, beta to 1e-9), every certified head is within epsilon of exact
// attention with the variant, and the kernels of every instruction set agree bit for bit
// on the sampled heads. Then the bound kernels (soft-cap and position bias, rounded up)
// against their real values and across instruction sets, the dense kernel with a variant
// against exact attention, and the arguments a variant refuses.
//
// False failures: the error check can fail only where a certificate fails, probability
// <= delta = 0.05 per certified head; with fixed seeds the test is deterministic, and the
// measured errors sit far below epsilon (docs/accuracy.md).
#include <certattn/attend.hpp>
#include <certattn/exact.hpp>
#include <certattn/reference.hpp>
#include <certattn/testing/synthetic.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <certattn/arch/macros.hpp>  // CERTATTN_X86

namespace {

using namespace certattn;

/// One row of the model table: the shape of one attention layer.
struct model_row {
  const char* name;
  std::size_t d, group, n;
  synthetic::regime kind;
  double softcap;          // 0: off
  double slope_base;       // 0: no bias; else head g of the group has slope base * 2^-g
  bool sinks;
  std::size_t window;      // 0: full attention
  std::size_t value_dim = 0;  // > 0: a latent cache (MLA), values the first value_dim channels
  double softmax_scale = 0.0;
};

std::vector<model_row> model_rows() {
  using R = synthetic::regime;
  return {
      {"llama3_8b", 128, 4, 6000, R::kMixed, 0, 0, false, 0},
      {"qwen25_7b", 128, 7, 6000, R::kPeaked, 0, 0, false, 0},
      {"qwen3_moe", 128, 16, 3000, R::kClustered, 0, 0, false, 0},
      {"mistral_7b_sliding", 128, 4, 9000, R::kRecency, 0, 0, false, 4096},
      {"gemma2_9b_global", 256, 2, 6000, R::kMixed, 50, 0, false, 0},
      {"gemma2_9b_local", 256, 2, 7000, R::kClustered, 50, 0, false, 4096},
      {"gemma2_strong_cap", 128, 2, 5000, R::kExtreme, 5, 0, false, 0},
      {"gemma3_local", 256, 2, 5000, R::kSinks, 0, 0, false, 1024},
      {"gpt_oss_full", 64, 8, 8192, R::kMixed, 0, 0, true, 0},
      {"gpt_oss_sliding", 64, 8, 4096, R::kNeedle, 0, 0, true, 128},
      {"phi3_mini", 96, 1, 6000, R::kOutlierChannels, 0, 0, false, 0},
      {"stablelm_d80", 80, 2, 5000, R::kMild, 0, 0, false, 0},
      {"bloom_alibi", 128, 1, 6000, R::kMixed, 0, 1.0 / 256, false, 0},
      {"mpt_alibi", 128, 4, 7000, R::kClustered, 0, 1.0 / 64, false, 0},
      {"baichuan_alibi_sinks_cap", 128, 2, 5000, R::kPeaked, 30, 1.0 / 512, true, 2048},
      // Where the transformed bounds decide the candidates: a cap that flattens the scores
      // (deep levels, every key near c) and a bias that raises older tokens.
      {"softcap_flat", 64, 4, 4096, R::kMild, 2, 0, false, 0},
      {"alibi_rising", 64, 2, 4096, R::kMixed, 0, -1.0 / 128, false, 0},
      // Multi-head latent attention, absorbed (DeepSeek-V3, Kimi K2): one 576-channel latent
      // row per token, its first 512 channels the value, softmax scale 1/sqrt(192).
      {"deepseek_v3_mla_g16", 576, 16, 1500, R::kMixed, 0, 0, false, 0, 512, 0.07216878364870323},
      {"kimi_k2_mla_g64", 576, 64, 700, R::kPeaked, 0, 0, false, 0, 512, 0.07216878364870323},
  };
}

/// The variant of a row for its group, with the spans' storage.
struct row_variant {
  std::vector<float> slopes, sinks;
  attention_variant v;
  row_variant(const model_row& r, std::uint64_t seed) {
    v.logit_softcap = r.softcap;
    v.sliding_window = r.window;
    if (r.slope_base != 0.0) {
      for (std::size_t g = 0; g < r.group; ++g) slopes.push_back(float(r.slope_base * std::ldexp(1.0, -int(g))));
      v.alibi_slopes = slopes;
    }
    if (r.sinks) {
      std::mt19937_64 rng(seed);
      std::uniform_real_distribution<float> z(-2.0f, 6.0f);
      for (std::size_t g = 0; g < r.group; ++g) sinks.push_back(z(rng));
      v.sinks = sinks;
    }
  }
};

double scale_of(const exact_result& ex, error_scale s) {
  switch (s) {
    case error_scale::kOutputNorm: return ex.output_norm;
    case error_scale::kValueScale: return ex.value_scale;
    default: return 0.0;
  }
}

class ModelRows : public ::testing::TestWithParam<model_row> {};

template <class View>
void check_model_row(const model_row& row, const synthetic::kv_cache& src, const View& kv,
                     matrix_view<half> keys, matrix_view<half> values);

TEST_P(ModelRows, FastPathMatchesReferenceAndCertifiesAgainstExact) {
  const model_row& row = GetParam();
  const std::size_t n = row.n, d = row.d;
  synthetic::cache_config cfg;
  cfg.n_tokens = n;
  cfg.head_dim = d;
  cfg.kind = row.kind;
  cfg.seed = 500 + n + d;
  const synthetic::kv_cache src = synthetic::make_cache(cfg);
  const auto keys = make_matrix_view(src.key_row(0, 0), n, d);
  if (row.value_dim > 0) {  // the latent rows are the synthetic keys; values alias them
    const latent_kv<half> kv(src.key_row(0, 0), n, d, row.value_dim, d);
    check_model_row(row, src, kv, keys, make_matrix_view(src.key_row(0, 0), n, row.value_dim, d));
  } else {
    const strided_kv<half> kv(src.key_row(0, 0), src.value_row(0, 0), n, d, d, d);
    check_model_row(row, src, kv, keys, make_matrix_view(src.value_row(0, 0), n, d));
  }
}

template <class View>
void check_model_row(const model_row& row, const synthetic::kv_cache& src, const View& kv,
                     matrix_view<half> keys, matrix_view<half> values) {
  const std::size_t n = row.n, d = row.d, G = row.group, dv = value_dim_of(kv);
  key_index idx(d, dv);
  idx.build(kv);
  attend_workspace ws(G, d, n, options{}.total_levels(), dv);
  ws.record_samples(true);
  const row_variant rv(row, 77 + n);
  std::vector<float> out(G * dv), out_isa(G * dv);
  std::vector<certificate> certs(G), certs_isa(G);
  std::size_t sampled_heads = 0;
  struct config {
    certificate_kind kind;
    routing route;
    error_scale scale;
  };
  for (const config cf : {config{certificate_kind::kTight, routing::kOff, error_scale::kValueScale},
                          config{certificate_kind::kClassic, routing::kOff, error_scale::kOutputNorm},
                          config{certificate_kind::kTight, routing::kAuto, error_scale::kValueScale}}) {
    options opt;
    opt.epsilon = 0.1;
    opt.scale = cf.scale;
    opt.seed = 5;
    opt.certificate = cf.kind;
    opt.route = cf.route;
    opt.variant = rv.v;
    opt.softmax_scale = row.softmax_scale;
    opt.cost.measured = false;  // routing on the model alone: the same decisions every run
    const bool with_history = cf.route == routing::kAuto;
    group_history history(G);
    std::vector<int> hints;
    // Two steps: the second is hinted with the first's levels (or routed by its history).
    for (std::uint64_t step : {7u, 8u}) {
      const noise_key nk{step, 3, 0};
      const std::vector<float> q = synthetic::make_queries(src, 0, G, step);
      const group_history before = history;
      auto call = [&](std::vector<float>& o, std::vector<certificate>& c, group_history& h) {
        if (with_history)
          attend_group(std::span<const float>(q), G, kv, idx, nk, opt, std::span<float>(o),
                       std::span<certificate>(c), ws, h);
        else
          attend_group(std::span<const float>(q), G, kv, idx, nk, opt, std::span<float>(o),
                       std::span<certificate>(c), ws, hints);
      };
      // Every instruction set below the best gives the same bits on the sampled heads (on
      // the first step of each configuration).
      for (isa arch : {isa::kScalar, isa::kAvx2}) {
        if (int(arch) > int(detected_isa()) || step != 7u) continue;
        group_history h = before;
        set_isa_cap(arch);
        call(out_isa, certs_isa, h);
        set_isa_cap(isa::kAvx512Vnni);
        ASSERT_EQ(ws.last_stats().bound_violations, 0u) << to_string(arch);
        call(out, certs, history = before);
        for (std::size_t g = 0; g < G; ++g) {
          SCOPED_TRACE(std::string(to_string(arch)) + " head " + std::to_string(g));
          ASSERT_EQ(certs[g].path, certs_isa[g].path);
          ASSERT_EQ(certs[g].level, certs_isa[g].level);
          if (certs[g].exact) continue;
          ASSERT_EQ(certs[g].beta, certs_isa[g].beta);
          ASSERT_EQ(std::memcmp(out.data() + g * dv, out_isa.data() + g * dv, dv * sizeof(float)), 0);
        }
      }
      history = before;
      call(out, certs, history);
      ASSERT_EQ(ws.last_stats().bound_violations, 0u);
      reference_extras extras{idx.value_center(), idx.value_cap(), idx.reach_floor()};
      if (with_history) extras.history = &before;
      const std::vector<reference_result> refs = reference_attend_group(
          std::span<const float>(q), G, keys, values, opt, nk, extras,
          with_history ? std::span<const int>() : std::span<const int>(hints));
      for (std::size_t g = 0; g < G; ++g) {
        const reference_result& r = refs[g];
        const certificate& f = certs[g];
        SCOPED_TRACE(std::string(row.name) + " " + std::string(to_string(cf.kind)) + " routing " +
                     std::string(to_string(cf.route)) + " head " + std::to_string(g) + " step " +
                     std::to_string(step));
        ASSERT_EQ(to_string(f.path), to_string(r.cert.path));
        ASSERT_EQ(f.certified, r.cert.certified);
        ASSERT_EQ(f.level, r.cert.level);
        ASSERT_EQ(f.heavy, r.cert.heavy);
        ASSERT_EQ(f.sampled, r.cert.sampled);
        // The dense kernel's answers (routed, or a short window read whole) carry its float
        // maximum; the others the same bits.
        if (f.path == answer_path::kRouted || opt.short_sliding_window(n))
          ASSERT_NEAR(f.max_score, r.cert.max_score, 1e-5 * std::max(1.0, std::fabs(r.cert.max_score)));
        else
          ASSERT_EQ(f.max_score, r.cert.max_score);
        if (!f.exact) {
          ++sampled_heads;
          EXPECT_NEAR(f.beta, r.cert.beta, 1e-9 * std::max(1.0, r.cert.beta));
          EXPECT_NEAR(f.bound, r.cert.bound, 1e-9 * std::max(1.0, r.cert.bound));
          std::set<std::uint32_t> heavy, light;
          for (const auto& sk : ws.samples(g)) (sk.heavy_level <= f.level ? heavy : light).insert(sk.token);
          std::size_t mismatches = 0;
          for (std::size_t t = 0; t < r.sample_level.size(); ++t) {
            if (r.sample_level[t] < 0) continue;
            const bool in = r.sample_level[t] <= f.level, hv = r.heavy_level[t] <= f.level;
            mismatches += (in && hv) != bool(heavy.count(std::uint32_t(t)));
            mismatches += (in && !hv) != bool(light.count(std::uint32_t(t)));
          }
          ASSERT_EQ(mismatches, 0u) << "sample sets differ";
          // Nothing outside the sliding window is sampled.
          for (const auto& sk : ws.samples(g)) ASSERT_GE(sk.token, rv.v.first_token(n));
        }
        // Certified: within epsilon of exact attention with the variant.
        const exact_result ex =
            exact_attention(std::span<const float>(q).subspan(g * d, d), keys, values, row.softmax_scale,
                            head_slice(rv.v, g));
        double err2 = 0.0;
        for (std::size_t i = 0; i < dv; ++i) {
          const double e = double(out[g * dv + i]) - ex.output[i];
          err2 += e * e;
        }
        if (f.certified) {
          ASSERT_LE(std::sqrt(err2), opt.epsilon * scale_of(ex, cf.scale));
        }
        if (f.exact) {
          ASSERT_LE(std::sqrt(err2), 1e-4 * std::max(1.0, ex.output_norm));
        }
      }
      hints.assign(G, -1);
      for (std::size_t g = 0; g < G; ++g) hints[g] = certs[g].level;
    }
  }
  std::printf("[ variant ] %s: %zu sampled heads\n", row.name, sampled_heads);
}

INSTANTIATE_TEST_SUITE_P(Models, ModelRows, ::testing::ValuesIn(model_rows()),
                         [](const auto& info) { return std::string(info.param.name); });

// p(f) (1 + 2^-15) >= 2^f (1 + 1e-5) on a grid of 2^20 + 1 points of [0, 1]: between two
// points (spacing 2^-20) either side moves by less than 2^-19, well inside the 1e-5 margin,
// so the polynomial bound holds on all of [0, 1) with the room the rounding of z needs.
TEST(VariantBounds, ExponentPolynomialIsAnUpperBound) {
  double worst = 1e300;
  for (std::uint32_t i = 0; i <= (1u << 20); ++i) {
    const double f = std::ldexp(double(i), -20);
    const double p = double(detail::exp2_fraction_upper(float(f)));
    worst = std::min(worst, p / std::exp2(double(float(f))) - 1.0);
  }
  EXPECT_GE(worst, 1e-5);
}

// The soft-cap and bias bounds hold against the real transform of every tested value,
// and the AVX-512 kernel gives its scalar twin's bits (with the block maxima).
TEST(VariantBounds, SoftcapAndBiasBoundsHoldAndAgreeAcrossKernels) {
  std::mt19937_64 rng(3);
  for (double cap : {0.0, 5.0, 30.0, 50.0}) {
    for (double slope : {0.0, 1.0 / 256, -0.03, 0.5}) {
      const std::size_t n = 1000, t0 = 37;
      std::vector<float> u(n);
      std::normal_distribution<float> x(0.0f, float(cap > 0.0 ? 2.0 * cap : 40.0));
      for (float& v : u) v = x(rng);
      u[40] = -std::numeric_limits<float>::infinity();
      u[41] = 1e6f;
      u[42] = -1e6f;
      const detail::bound_variant b = detail::make_bound_variant(cap, slope, n);
      head_variant hv;
      hv.cap = double(float(cap));
      hv.slope = double(float(slope));
      hv.newest = double(n - 1);
      std::vector<float> a = u, s = u, bm_a(8, 0.0f), bm_s(8, 0.0f);
      detail::apply_bound_variant_scalar(u.data(), s.data(), t0, n, b, bm_s.data());
#if CERTATTN_X86
      if (detected_isa() == isa::kAvx512Vnni) {
        detail::apply_bound_variant_avx512(u.data(), a.data(), t0, n, b, bm_a.data());
        ASSERT_EQ(std::memcmp(a.data(), s.data(), n * sizeof(float)), 0) << cap << " " << slope;
        ASSERT_EQ(std::memcmp(bm_a.data(), bm_s.data(), bm_s.size() * sizeof(float)), 0);
      }
#endif
      for (std::size_t t = t0; t < n; ++t) {
        if (std::isinf(u[t])) {
          ASSERT_EQ(s[t], u[t]);
          continue;
        }
        const double real = hv.score(double(u[t]), t);
        ASSERT_GE(double(s[t]), real) << "cap " << cap << " slope " << slope << " u " << u[t];
        // Tight: within 2e-5 cap of the soft-cap, and a few float ulps of the result.
        ASSERT_LE(double(s[t]) - real, 2e-5 * cap + 1e-6 * (std::fabs(slope * double(n)) + std::fabs(real)) + 1e-5)
            << "cap " << cap << " slope " << slope << " u " << u[t];
      }
      for (std::size_t blk = 0; blk * 128 < n; ++blk) {
        if ((blk + 1) * 128 <= t0) continue;
        float m = -std::numeric_limits<float>::infinity();
        for (std::size_t t = std::max(t0, blk * 128); t < std::min(n, (blk + 1) * 128); ++t) m = std::max(m, s[t]);
        ASSERT_EQ(bm_s[blk], m);
      }
    }
  }
}

// The dense kernel with a variant (every instruction set) against exact attention with it.
TEST(VariantDense, MatchesExactAttentionOnEveryKernel) {
  const std::size_t n = 3000, d = 64, G = 3;
  synthetic::cache_config cfg;
  cfg.n_tokens = n;
  cfg.head_dim = d;
  cfg.kind = synthetic::regime::kMixed;
  const synthetic::kv_cache src = synthetic::make_cache(cfg);
  const strided_kv<half> kv(src.key_row(0, 0), src.value_row(0, 0), n, d, d, d);
  const std::vector<float> q = synthetic::make_queries(src, 0, G, 1);
  const std::vector<float> slopes = {0.01f, 0.001f, -0.002f}, sinks = {3.0f, -1.0f, 40.0f};
  attention_variant v;
  v.logit_softcap = 8.0;
  v.alibi_slopes = slopes;
  v.sinks = sinks;
  v.sliding_window = 1700;
  dense_workspace dws(G, d);
  std::vector<float> out(G * d);
  for (isa arch : {isa::kAvx512Vnni, isa::kAvx2, isa::kScalar}) {
    if (int(arch) > int(detected_isa())) continue;
    set_isa_cap(arch);
    dense_attend(std::span<const float>(q), G, kv, 0.0f, std::span<float>(out), dws, 0, SIZE_MAX, v);
    set_isa_cap(isa::kAvx512Vnni);
    for (std::size_t g = 0; g < G; ++g) {
      const exact_result ex = exact_attention(std::span<const float>(q).subspan(g * d, d),
                                              make_matrix_view(src.key_row(0, 0), n, d),
                                              make_matrix_view(src.value_row(0, 0), n, d), 0.0,
                                              head_slice(v, g));
      for (std::size_t i = 0; i < d; ++i)
        ASSERT_NEAR(out[g * d + i], ex.output[i], 2e-5 * std::max(1.0, ex.output_norm))
            << to_string(arch) << " head " << g;
    }
  }
}

// The dense kernel over a latent cache (values: a prefix of the key rows) on every
// instruction set, against exact attention; G = 128 as in DeepSeek-V3's layers.
TEST(LatentDense, MatchesExactAttentionOnEveryKernel) {
  const std::size_t n = 700, d = 576, dv = 512, G = 128;
  synthetic::cache_config cfg;
  cfg.n_tokens = n;
  cfg.head_dim = d;
  const synthetic::kv_cache src = synthetic::make_cache(cfg);
  const latent_kv<half> kv(src.key_row(0, 0), n, d, dv, d);
  const std::vector<float> q = synthetic::make_queries(src, 0, G, 2);
  const float scale = float(1.0 / std::sqrt(192.0));
  dense_workspace dws(G, d);
  std::vector<float> out(G * dv);
  for (isa arch : {isa::kAvx512Vnni, isa::kAvx2, isa::kScalar}) {
    if (int(arch) > int(detected_isa())) continue;
    set_isa_cap(arch);
    dense_attend(std::span<const float>(q), G, kv, scale, std::span<float>(out), dws);
    set_isa_cap(isa::kAvx512Vnni);
    for (std::size_t g = 0; g < G; g += 9) {
      const exact_result ex = exact_attention(std::span<const float>(q).subspan(g * d, d),
                                              make_matrix_view(src.key_row(0, 0), n, d),
                                              make_matrix_view(src.key_row(0, 0), n, dv, d), double(scale));
      ASSERT_EQ(ex.output.size(), dv);
      for (std::size_t i = 0; i < dv; ++i)
        ASSERT_NEAR(out[g * dv + i], ex.output[i], 2e-5 * std::max(1.0, ex.output_norm))
            << to_string(arch) << " head " << g;
    }
  }
}

void expect_error(const std::function<void()>& f, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << "no error, expected one mentioning: " << what;
  } catch (const error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(VariantBadInput, ErrorsNameTheArgument) {
  const std::size_t n = 600, d = 64, G = 2;
  synthetic::cache_config cfg;
  cfg.n_tokens = n;
  cfg.head_dim = d;
  const synthetic::kv_cache src = synthetic::make_cache(cfg);
  const strided_kv<half> kv(src.key_row(0, 0), src.value_row(0, 0), n, d, d, d);
  key_index idx(d);
  idx.build(kv);
  attend_workspace ws(G, d, n);
  std::vector<float> q = synthetic::make_queries(src, 0, G, 1), out(G * d);
  std::vector<certificate> certs(G);
  const std::vector<float> three = {1.0f, 2.0f, 3.0f}, bad = {1.0f, NAN};
  auto call = [&](const options& o) {
    attend_group(std::span<const float>(q), G, kv, idx, {1, 0, 0}, o, std::span<float>(out),
                 std::span<certificate>(certs), ws);
  };
  options o;
  o.variant.sinks = three;
  expect_error([&] { call(o); }, "options.variant.sinks has 3 elements, expected 0 or one per query head = 2");
  o = {};
  o.variant.alibi_slopes = bad;
  expect_error([&] { call(o); }, "options.variant.alibi_slopes[1]");
  o = {};
  o.variant.logit_softcap = -1.0;
  expect_error([&] { call(o); }, "options.variant.logit_softcap must lie in [0, 2^20]");
  o.variant.logit_softcap = NAN;
  expect_error([&] { call(o); }, "options.variant.logit_softcap");
  dense_workspace dws(G, d);
  attention_variant v;
  v.sinks = three;
  expect_error([&] { dense_attend(std::span<const float>(q), G, kv, 0.0f, std::span<float>(out), dws, 0, SIZE_MAX, v); },
               "variant.sinks has 3 elements");
  expect_error([&] {
    exact_attention(std::span<const float>(q).first(d), make_matrix_view(src.key_row(0, 0), n, d),
                    make_matrix_view(src.value_row(0, 0), n, d), 0.0, v);
  }, "variant.sinks has 3 elements, expected 0 or one per query head = 1");
  // A latent cache: values alias a prefix of the key rows, never more.
  expect_error([&] { latent_kv<half>(src.key_row(0, 0), n, d, d + 16, d); },
               "value_dim (80) must lie in [1, head_dim = 64]");
  const latent_kv<half> latent(src.key_row(0, 0), n, d, 48, d);
  expect_error([&] { idx.append(latent, idx.size()); },
               "kv's value_dim (48) != the value_dim the index was built with (64)");
  key_index lidx(d);
  lidx.build(latent);  // a build takes the view's value_dim
  EXPECT_EQ(lidx.value_dim(), 48u);
  std::vector<float> lout(G * 48);
  // A workspace of head_dim 64 serves any value_dim up to 64; one sized for fewer refuses more.
  attend_group(std::span<const float>(q), G, latent, lidx, {1, 0, 0}, options{}, std::span<float>(lout),
               std::span<certificate>(certs), ws);
  attend_workspace narrow(G, d, n, options{}.total_levels(), 32);
  expect_error([&] {
    attend_group(std::span<const float>(q), G, latent, lidx, {1, 0, 0}, options{}, std::span<float>(lout),
                 std::span<certificate>(certs), narrow);
  }, "value_dim 32");
  expect_error([&] {
    attend_group(std::span<const float>(q), G, latent, lidx, {1, 0, 0}, options{}, std::span<float>(out),
                 std::span<certificate>(certs), ws);
  }, "out has 128 elements, expected group * value_dim = 96");
}

}  // namespace
