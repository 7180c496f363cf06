// The fast path computes what the reference computes: the same levels, the same sample
// sets (token by token), the same certificate and the same output up to float rounding,
// over every synthetic regime, each layout and element type, head_dim 64/128/256, G in
// {1, 4, 7, 8}, contexts from 1K to 128K, each instruction set, and both certificates
// (tight with the previous step's level hints, and classic).
//
// Scores are computed by one lane-fixed function in both paths, so they agree bit for
// bit and the admissible "key within rounding of a threshold" case cannot arise: the
// test requires identical sets (and counts any difference, which must be zero).
#include <certattn/attend.hpp>
#include <certattn/reference.hpp>

#include "support/layouts.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>

#include <certattn/arch/macros.hpp>  // CERTATTN_X86 and the kernel attributes

namespace {

using namespace certattn;
using test::layout_kind;

struct exact_case {
  synthetic::regime kind;
  layout_kind layout;
  int type;  // 0 fp16, 1 bf16, 2 fp32
  std::size_t d, group, n;
  isa arch;
  error_scale scale;
  double eps;
};

std::string name_of(const exact_case& c) {
  static const char* types[] = {"fp16", "bf16", "fp32"};
  return std::string(synthetic::to_string(c.kind)) + "_" + test::to_string(c.layout) + "_" +
         types[c.type] + "_d" + std::to_string(c.d) + "_G" + std::to_string(c.group) + "_n" +
         std::to_string(c.n) + "_" + std::string(to_string(c.arch)) + "_" +
         std::string(to_string(c.scale));
}

template <storage_element T, class View>
void check_group(const exact_case& p, const test::layout_cache<T>& /*owns kv's rows*/, const View& kv,
                 const synthetic::kv_cache& src, std::size_t head) {
  const std::size_t n = p.n, d = p.d, G = p.group;
  key_index idx(d);
  // Build from most of the cache and append the rest: the append path (tail block,
  // re-encoding, value-bound refresh) must give an index the call is exact with.
  const std::size_t n0 = n - std::min<std::size_t>(n / 3, 700);
  idx.build(kv.prefix(n0));
  for (std::size_t t = n0; t < n; ++t) idx.append(kv, t);

  attend_workspace ws(G, d, n);
  ws.record_samples(true);
  std::vector<float> out(G * d);
  std::vector<certificate> certs(G);
  std::vector<T> kmat, vmat;
  test::gather_head<T>(kv, kmat, vmat);
  int deepest_level = -1;
  // Both certificates without routing, the tight one also with the level hints of the
  // previous step; then the defaults (tight, routing) with a group_history over three
  // steps, which carries the hints and may route the group or stop heads over budget.
  struct config {
    certificate_kind kind;
    routing route;
  };
  for (const config cfgc : {config{certificate_kind::kTight, routing::kOff},
                            config{certificate_kind::kClassic, routing::kOff},
                            config{certificate_kind::kTight, routing::kAuto}}) {
  options opt;
  opt.epsilon = p.eps;
  opt.scale = p.scale;
  opt.seed = 11;
  opt.certificate = cfgc.kind;
  opt.route = cfgc.route;
  const certificate_kind kind = cfgc.kind;
  const bool with_history = cfgc.route == routing::kAuto;
  group_history history(G);
  std::vector<int> hints;
  for (std::uint64_t step : {3u, 4u, 5u}) {
    if (!with_history && step == 5u) break;
    const noise_key nk{step, 2, std::uint32_t(head)};
    const std::vector<float> q = synthetic::make_queries(src, head, G, step);
    const group_history before = history;
    set_isa_cap(p.arch);
    if (with_history)
      attend_group(std::span<const float>(q), G, kv, idx, nk, opt, std::span<float>(out),
                   std::span<certificate>(certs), ws, history);
    else
      attend_group(std::span<const float>(q), G, kv, idx, nk, opt, std::span<float>(out),
                   std::span<certificate>(certs), ws, hints);
    set_isa_cap(isa::kAvx512Vnni);
    ASSERT_EQ(ws.last_stats().bound_violations, 0u);
    reference_extras extras{idx.value_center(), idx.value_cap(), idx.reach_floor()};
    if (with_history) extras.history = &before;
    const std::vector<reference_result> refs = reference_attend_group(
        std::span<const float>(q), G, make_matrix_view(kmat.data(), n, d),
        make_matrix_view(vmat.data(), n, d), opt, nk, extras,
        with_history ? std::span<const int>() : std::span<const int>(hints));
    for (std::size_t g = 0; g < G; ++g) {
      const reference_result& r = refs[g];
      const certificate& f = certs[g];
      if (!with_history) deepest_level = std::max(deepest_level, f.exact ? 1000 : f.level);
      SCOPED_TRACE(std::string(to_string(kind)) + " routing " + std::string(to_string(opt.route)) +
                   " head " + std::to_string(g) + " step " + std::to_string(step));
      ASSERT_EQ(to_string(f.path), to_string(r.cert.path));
      ASSERT_EQ(f.certified, r.cert.certified);
      ASSERT_EQ(f.exact, r.cert.exact);
      ASSERT_EQ(f.level, r.cert.level);
      ASSERT_EQ(f.heavy, r.cert.heavy);
      ASSERT_EQ(f.sampled, r.cert.sampled);
      // A routed call's c is the dense kernel's float maximum; the others' the same bits.
      const bool routed = f.path == answer_path::kRouted;
      if (routed)
        ASSERT_NEAR(f.max_score, r.cert.max_score, 1e-6 * std::max(1.0, std::fabs(r.cert.max_score)));
      else
        ASSERT_EQ(f.max_score, r.cert.max_score);
      // The exact answers run the float dense kernel; sampled levels sum in double.
      EXPECT_NEAR(f.denominator * std::exp(f.max_score - r.cert.max_score), r.cert.denominator,
                  (f.exact ? 1e-5 : 1e-9) * r.cert.denominator);
      if (!f.exact) {
        EXPECT_NEAR(f.bound, r.cert.bound, 1e-9 * std::max(1.0, r.cert.bound));
        EXPECT_NEAR(f.beta, r.cert.beta, 1e-9 * std::max(1.0, r.cert.beta));
        // The same sample, token by token, heavy or light.
        std::set<std::uint32_t> heavy, light;
        for (const auto& sk : ws.samples(g))
          (sk.heavy_level <= f.level ? heavy : light).insert(sk.token);
        std::size_t mismatches = 0;
        for (std::size_t t = 0; t < r.sample_level.size(); ++t) {
          if (r.sample_level[t] < 0) continue;  // exact set
          const bool in = r.sample_level[t] <= f.level;
          const bool hv = r.heavy_level[t] <= f.level;
          mismatches += (in && hv) != bool(heavy.count(std::uint32_t(t)));
          mismatches += (in && !hv) != bool(light.count(std::uint32_t(t)));
        }
        ASSERT_EQ(mismatches, 0u) << "sample sets differ";
      }
      // Output: float storage of a double computation, sums in another order.
      double err = 0.0, norm = 0.0;
      for (std::size_t i = 0; i < d; ++i) {
        err = std::max(err, std::fabs(double(out[g * d + i]) - r.output[i]));
        norm = std::max(norm, std::fabs(r.output[i]));
      }
      ASSERT_LE(err, 1e-5 * std::max(1.0, norm)) << "output differs";
    }
    hints.assign(G, -1);
    for (std::size_t g = 0; g < G; ++g) hints[g] = certs[g].level;
  }
  }
  std::printf("[ deepest ] %s: %s\n", name_of(p).c_str(),
              deepest_level == 1000 ? "exact fallback" : std::to_string(deepest_level).c_str());
}

template <storage_element T>
void run_case(const exact_case& p) {
  synthetic::cache_config cfg;
  cfg.n_tokens = p.n;
  cfg.head_dim = p.d;
  cfg.kv_heads = p.layout == layout_kind::kHnd ? 1 : 2;
  cfg.kind = p.kind;
  cfg.seed = 1000 + p.n + p.d;
  const synthetic::kv_cache src = synthetic::make_cache(cfg);
  const auto cache = test::make_layout_cache<T>(src, p.layout);
  const std::size_t head = cfg.kv_heads - 1;
  if (p.layout == layout_kind::kPaged)
    check_group<T>(p, cache, cache.paged(head), src, head);
  else
    check_group<T>(p, cache, cache.strided(head), src, head);
}

class FastPathExact : public ::testing::TestWithParam<exact_case> {};

TEST_P(FastPathExact, SameLevelsSamplesCertificatesAndOutputs) {
  const exact_case& p = GetParam();
  if (int(p.arch) > int(detected_isa())) GTEST_SKIP() << "CPU lacks " << to_string(p.arch);
  switch (p.type) {
    case 0: run_case<half>(p); break;
    case 1: run_case<bfloat16>(p); break;
    default: run_case<float>(p); break;
  }
}

/// A covering design rather than the full product: every regime meets every layout,
/// type, head_dim, group size, arch and scale several times, at 1K-16K; a few large
/// contexts (32K, 128K) run on the main path.
std::vector<exact_case> cases() {
  std::vector<exact_case> c;
  const std::size_t dims[] = {64, 128, 256};
  const std::size_t groups[] = {1, 4, 7, 8};
  const std::size_t ns[] = {1024, 3000, 8192, 16384};
  const isa archs[] = {isa::kAvx512Vnni, isa::kAvx2, isa::kScalar};
  const error_scale scales[] = {error_scale::kValueScale, error_scale::kOutputNorm,
                                error_scale::kDenominator};
  const double eps[] = {0.1, 0.05, 0.2};
  std::size_t k = 0;
  for (synthetic::regime r : synthetic::all_regimes)
    for (int rep = 0; rep < 4; ++rep, ++k) {
      exact_case e;
      e.kind = r;
      e.layout = layout_kind(k % 3);
      e.type = int((k / 3) % 3);
      e.d = dims[(k + rep) % 3];
      e.group = groups[(k / 2) % 4];
      e.n = ns[(k * 7 + rep) % 4];
      e.arch = archs[(k / 5) % 3];
      e.scale = scales[(k / 4) % 3];
      e.eps = eps[k % 3];
      if (e.arch == isa::kScalar) e.n = std::min<std::size_t>(e.n, 3000);  // slow twin
      c.push_back(e);
    }
  // Tight targets: stopping levels past the first bucketing pass (levels > 3J/4), and
  // calls that reach J and fall back to exact attention.
  c.push_back({synthetic::regime::kPeaked, layout_kind::kHnd, 0, 128, 4, 8192, isa::kAvx512Vnni,
               error_scale::kValueScale, 0.01});
  c.push_back({synthetic::regime::kExtreme, layout_kind::kNhd, 2, 64, 4, 4096, isa::kAvx2,
               error_scale::kOutputNorm, 0.005});
  c.push_back({synthetic::regime::kMild, layout_kind::kPaged, 1, 128, 7, 4096, isa::kScalar,
               error_scale::kValueScale, 0.01});
  c.push_back({synthetic::regime::kUniform, layout_kind::kHnd, 0, 64, 4, 2048, isa::kAvx512Vnni,
               error_scale::kValueScale, options::kMinEpsilon});
  c.push_back({synthetic::regime::kMixed, layout_kind::kHnd, 0, 128, 4, 32768, isa::kAvx512Vnni,
               error_scale::kValueScale, 0.1});
  c.push_back({synthetic::regime::kPeaked, layout_kind::kNhd, 0, 128, 8, 32768, isa::kAvx512Vnni,
               error_scale::kValueScale, 0.1});
  c.push_back({synthetic::regime::kRecency, layout_kind::kPaged, 0, 128, 4, 131072,
               isa::kAvx512Vnni, error_scale::kValueScale, 0.1});
  c.push_back({synthetic::regime::kNeedle, layout_kind::kHnd, 1, 64, 7, 131072, isa::kAvx2,
               error_scale::kOutputNorm, 0.1});
  return c;
}

INSTANTIATE_TEST_SUITE_P(Covering, FastPathExact, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return name_of(info.param); });

}  // namespace

namespace {
using namespace certattn;

// Regression: a token whose hash has its top 24 bits zero (probability 2^-24, about once
// per call at 128K) has E >= 16.6 and is almost surely sampled. Its perturbation bound
// was once +inf, which the candidate filter (y < upper) dropped: the fast path lost the
// key. Find a step where such a token lies in the pool and compare with the reference.
TEST(FastPathExactRegression, TokenWithZeroTopHashBits) {
  const std::size_t n = 4096, d = 64, G = 2;
  options opt;
  opt.seed = 5;
  opt.route = routing::kOff;  // the sampled path, whatever its cost
  std::uint64_t step = 0;
  std::size_t token = n;
  for (std::uint64_t s = 0; s < 200000 && token == n; ++s) {
    const perturbation pert(opt.seed, noise_key{s, 0, 0});
    for (std::size_t t = 0; t + opt.window < n; ++t)
      if ((pert.bits(t) >> 40) == 0) {
        step = s;
        token = t;
        break;
      }
  }
  ASSERT_LT(token, n) << "no such token found";
  EXPECT_EQ(perturbation::exp1_upper_from_bits(perturbation(opt.seed, {step, 0, 0}).bits(token)),
            perturbation::kMaxExp1);
  EXPECT_GE(double(perturbation::kMaxExp1), perturbation(opt.seed, {step, 0, 0}).exp1(token));

  synthetic::cache_config cfg;
  cfg.n_tokens = n;
  cfg.head_dim = d;
  cfg.kind = synthetic::regime::kMild;
  const auto src = synthetic::make_cache(cfg);
  const strided_kv<half> kv(src.key_row(0, 0), src.value_row(0, 0), n, d, d, d);
  key_index idx(d);
  idx.build(kv);
  attend_workspace ws(G, d, n);
  ws.record_samples(true);
  std::vector<float> out(G * d);
  std::vector<certificate> certs(G);
  const std::vector<float> q = synthetic::make_queries(src, 0, G, step);
  for (isa a : {isa::kAvx512Vnni, isa::kAvx2, isa::kScalar}) {
    if (int(a) > int(detected_isa())) continue;
    set_isa_cap(a);
    attend_group(std::span<const float>(q), G, kv, idx, noise_key{step, 0, 0}, opt,
                 std::span<float>(out), std::span<certificate>(certs), ws);
    set_isa_cap(isa::kAvx512Vnni);
    for (std::size_t g = 0; g < G; ++g) {
      const auto r = reference_attend(std::span<const float>(q.data() + g * d, d), keys_matrix(kv),
                                      values_matrix(kv), opt, noise_key{step, 0, 0},
                                      {idx.value_center(), idx.value_cap(), idx.reach_floor()});
      ASSERT_EQ(certs[g].level, r.cert.level) << to_string(a);
      ASSERT_EQ(certs[g].heavy, r.cert.heavy) << to_string(a);
      ASSERT_EQ(certs[g].sampled, r.cert.sampled) << to_string(a);
      if (!certs[g].exact && r.sample_level[token] >= 0 && r.sample_level[token] <= r.cert.level) {
        bool found = false;
        for (const auto& sk : ws.samples(g)) found = found || sk.token == token;
        EXPECT_TRUE(found) << "the zero-top-bits token was dropped (" << to_string(a) << ")";
      }
    }
  }
}

}  // namespace

// The batched 8-bit dot of the level loop (16 candidates per call, one transposed
// reduction) must give every candidate the bits of the single-candidate kernels, which
// the bound's rounding analysis and the cross-ISA determinism rely on. Deterministic:
// fails only on a wrong lane, shuffle or reduction order.
TEST(RefineKernels, BatchedDotMatchesSingleCandidateBits) {
  if (detected_isa() != isa::kAvx512Vnni) GTEST_SKIP() << "CPU lacks avx512_vnni";
  std::uint64_t state = 12345;
  auto next = [&state] { return state = state * 6364136223846793005ULL + 1442695040888963407ULL; };
  for (std::size_t dp : {8u, 16u, 64u, 72u, 128u, 136u, 256u}) {
    std::vector<std::vector<float>> a(16, std::vector<float>(detail::refine_a_size(dp), 0.0f));
    std::vector<std::vector<std::uint8_t>> code(16, std::vector<std::uint8_t>(dp / 2));
    for (int k = 0; k < 16; ++k)
      for (std::size_t i = 0; i < dp; ++i) {
        // Magnitudes spread over 2^-20..2^20 so that the summation order shows in the bits.
        const double mag = std::ldexp(1.0, int(next() >> 59) - 16 + int(next() >> 61));
        a[std::size_t(k)][i] = float((double(next() >> 11) * 0x1p-53 - 0.5) * mag);
        if (i % 2 == 0) code[std::size_t(k)][i / 2] = std::uint8_t(next() >> 56);
      }
    for (std::size_t m : {1u, 5u, 16u}) {
      const float* ap[16];
      const std::uint8_t* cp[16];
      for (std::size_t k = 0; k < 16; ++k) {
        ap[k] = a[k < m ? k : 0].data();
        cp[k] = code[k < m ? k : 0].data();
      }
      float dot[16];
      detail::refine_dots(ap, cp, m, dp, dot, isa::kAvx512Vnni);
      for (std::size_t k = 0; k < m; ++k) {
#if CERTATTN_X86
        const float one = detail::refine_dot_avx512(ap[k], cp[k], dp);
        EXPECT_EQ(std::bit_cast<std::uint32_t>(dot[k]), std::bit_cast<std::uint32_t>(one))
            << "dp " << dp << " m " << m << " candidate " << k;
#endif
        const float scalar = detail::refine_dot_scalar(ap[k], cp[k], dp);
        EXPECT_EQ(std::bit_cast<std::uint32_t>(dot[k]), std::bit_cast<std::uint32_t>(scalar))
            << "dp " << dp << " m " << m << " candidate " << k;
      }
    }
  }
}

// The batched exact score of the level loop (8 keys per call, one transposed reduction)
// must give every key the bits of score_dot(): the reference's scores, hence its samples.
// Deterministic: fails only on a wrong lane, shuffle or reduction order.
TEST(ScoreKernels, BatchedScoreMatchesReferenceBits) {
  std::uint64_t state = 987654321;
  auto next = [&state] { return state = state * 6364136223846793005ULL + 1442695040888963407ULL; };
  for (std::size_t d : {8u, 64u, 72u, 128u, 256u}) {
    std::vector<float> q(d);
    for (auto& x : q) x = float((double(next() >> 11) * 0x1p-53 - 0.5) * std::ldexp(1.0, int(next() >> 60) - 8));
    std::vector<std::vector<half>> keys(8, std::vector<half>(d));
    for (auto& k : keys)
      for (auto& x : k) x = half(float((double(next() >> 11) * 0x1p-53 - 0.5) * std::ldexp(1.0, int(next() >> 61))));
    const half* rows[8];
    for (std::size_t j = 0; j < 8; ++j) rows[j] = keys[j].data();
    for (isa which : {isa::kScalar, isa::kAvx2, isa::kAvx512Vnni}) {
      if (int(which) > int(detected_isa())) continue;
      double dots[8];
      detail::score_dot8_fast(q.data(), rows, d, which, dots);
      for (std::size_t j = 0; j < 8; ++j)
        EXPECT_EQ(std::bit_cast<std::uint64_t>(dots[j]),
                  std::bit_cast<std::uint64_t>(detail::score_dot(q.data(), rows[j], d)))
            << "d " << d << " key " << j << " isa " << to_string(which);
    }
  }
}
