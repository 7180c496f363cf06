// Several positions in one call (attend_positions()): speculative verification's Q draft
// positions over one KV head. For each position and head the fast path computes what the
// reference computes over the cache up to that position (same path, level, samples token
// by token, beta to 1e-9), every certified head is within epsilon of exact attention with
// the causal mask, outputs are the same bits on every instruction set, a steady-state
// call does not allocate, one position is attend_group() bit for bit, and after a partial
// acceptance (key_index::truncate) the next call equals one on a freshly built index. The
// causal dense kernel (dense_attend_positions()) agrees with exact attention. Bad input
// gets an error naming the argument.
#include "support/count_allocations.hpp"

#include <certattn/attend.hpp>
#include <certattn/dense.hpp>
#include <certattn/exact.hpp>
#include <certattn/reference.hpp>

#include "support/harness.hpp"
#include "support/layouts.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <set>
#include <string>
#include <vector>

namespace {

using namespace certattn;
using test::layout_kind;
using test::routing_history;
using test::scaled_error;

struct positions_case {
  layout_kind layout;
  synthetic::regime kind;
  std::size_t positions, group, n, window;
  bool variant;  // sliding window, ALiBi slopes, soft-cap and sinks
  bool quantized;  // a q8_0 cache instead of fp16
};

std::string name_of(const positions_case& c) {
  return test::to_string(c.layout) + "_" + std::string(synthetic::to_string(c.kind)) + "_Q" +
         std::to_string(c.positions) + "_G" + std::to_string(c.group) + "_n" +
         std::to_string(c.n) + "_w" + std::to_string(c.window) + (c.variant ? "_variant" : "") +
         (c.quantized ? "_q8_0" : "");
}

/// The variant of a case, with its spans' storage.
struct case_variant {
  std::vector<float> slopes, sinks;
  attention_variant v;
  explicit case_variant(std::size_t G) {
    for (std::size_t g = 0; g < G; ++g) {
      slopes.push_back(0.002f * float(g + 1));
      sinks.push_back(0.5f - 0.25f * float(g));
    }
    v.sliding_window = 2600;
    v.logit_softcap = 30.0;
    v.alibi_slopes = slopes;
    v.sinks = sinks;
  }
};

/// The synthetic cache of one KV head (the default regime) the single-shape tests use.
synthetic::kv_cache one_head_source(std::size_t n, std::size_t d,
                                    std::uint64_t seed = synthetic::cache_config{}.seed) {
  synthetic::cache_config cfg;
  cfg.n_tokens = n;
  cfg.head_dim = d;
  cfg.kv_heads = 1;
  cfg.seed = seed;
  return synthetic::make_cache(cfg);
}

/// Exact attention of head g of position p: over the cache's first n - Q + p + 1 rows.
template <class View>
exact_result exact_at(const std::vector<float>& q, std::size_t p, std::size_t g, std::size_t Q,
                      std::size_t G, const View& kv, const dense_rows<View>& rows,
                      const options& opt) {
  const std::size_t d = kv.head_dim(), n_p = kv.size() - Q + 1 + p;
  auto keys = rows.key_matrix(), values = rows.value_matrix();
  keys.rows = values.rows = n_p;
  return exact_attention(std::span<const float>(q.data() + (p * G + g) * d, d), keys, values,
                         opt.effective_softmax_scale(d), head_slice(opt.variant, g));
}

template <class View>
void check_positions_call(const positions_case& c, const View& kv,
                          const synthetic::kv_cache& src, std::size_t head) {
  const std::size_t n = c.n, d = kv.head_dim(), Q = c.positions, G = c.group;
  key_index idx(d);
  const std::size_t n0 = n - 300;
  idx.build(kv.prefix(n0));
  for (std::size_t t = n0; t < n; ++t) idx.append(kv, t);
  const dense_rows<View> rows(kv);
  attend_workspace ws(Q * G, d, n);
  ws.record_samples(true);
  const case_variant cv(G);
  options opt;
  opt.seed = 17;
  opt.window = c.window;
  opt.route = routing::kOff;
  if (c.variant) opt.variant = cv.v;
  std::size_t certified = 0;
  for (std::uint64_t step : {1u, 2u}) {
    const noise_key nk{step, 0, std::uint32_t(head)};
    std::vector<float> q;
    for (std::size_t p = 0; p < Q; ++p) {
      const std::vector<float> qp = synthetic::make_queries(src, head, G, 10 * step + p);
      q.insert(q.end(), qp.begin(), qp.end());
    }
    std::vector<float> first_out;
    std::vector<certificate> first_certs;
    for (isa a : {isa::kAvx512Vnni, isa::kAvx2, isa::kScalar}) {
      if (int(a) > int(detected_isa())) continue;
      SCOPED_TRACE(std::string(to_string(a)) + " step " + std::to_string(step));
      std::vector<float> out(Q * G * d);
      std::vector<certificate> certs(Q * G);
      set_isa_cap(a);
      attend_positions(std::span<const float>(q), Q, G, kv, idx, nk, opt, std::span<float>(out),
                       std::span<certificate>(certs), ws);
      set_isa_cap(isa::kAvx512Vnni);
      ASSERT_EQ(ws.last_stats().bound_violations, 0u);
      if (first_out.empty()) {
        first_out = out;
        first_certs = certs;
      } else {
        for (std::size_t i = 0; i < out.size(); ++i)
          ASSERT_EQ(std::bit_cast<std::uint32_t>(out[i]), std::bit_cast<std::uint32_t>(first_out[i]))
              << "output " << i << " differs across instruction sets";
        for (std::size_t h = 0; h < Q * G; ++h) {
          ASSERT_EQ(certs[h].level, first_certs[h].level);
          ASSERT_EQ(certs[h].beta, first_certs[h].beta);
        }
        continue;
      }
      const reference_extras extras{idx.value_center(), idx.value_cap(), idx.reach_floor()};
      const std::vector<reference_result> refs =
          reference_attend_positions(std::span<const float>(q), Q, G, kv, opt, nk, extras);
      ASSERT_EQ(refs.size(), Q * G);
      for (std::size_t p = 0; p < Q; ++p)
        for (std::size_t g = 0; g < G; ++g) {
          const std::size_t h = p * G + g;
          SCOPED_TRACE("position " + std::to_string(p) + " head " + std::to_string(g));
          const reference_result& r = refs[h];
          const certificate& f = certs[h];
          ASSERT_EQ(to_string(f.path), to_string(r.cert.path));
          ASSERT_EQ(f.level, r.cert.level);
          ASSERT_EQ(f.sampled, r.cert.sampled);
          ASSERT_EQ(f.heavy, r.cert.heavy);
          ASSERT_EQ(f.max_score, r.cert.max_score);
          if (!f.exact) {
            EXPECT_NEAR(f.beta, r.cert.beta, 1e-9 * std::max(1.0, r.cert.beta));
            EXPECT_NEAR(f.bound, r.cert.bound, 1e-9 * std::max(1.0, r.cert.bound));
            std::set<std::uint32_t> fast, ref;
            for (const auto& sk : ws.samples(h)) fast.insert(sk.token);
            for (std::size_t t = 0; t < r.sample_level.size(); ++t)
              if (r.sample_level[t] >= 0 && r.sample_level[t] <= f.level) ref.insert(std::uint32_t(t));
            ASSERT_EQ(fast, ref) << "sample sets differ";
          }
          // Within epsilon of exact attention over the tokens up to the position's own
          // (false failure probability <= delta per certified head).
          const exact_result ex = exact_at(q, p, g, Q, G, kv, rows, opt);
          double err2 = 0.0;
          for (std::size_t i = 0; i < d; ++i) {
            const double e = double(out[h * d + i]) - ex.output[i];
            err2 += e * e;
          }
          if (f.certified) {
            ++certified;
            EXPECT_LE(std::sqrt(err2), opt.epsilon * ex.value_scale);
          }
        }
      // The positions draw different perturbations: their samples differ somewhere.
      if (Q > 1) {
        bool differ = false;
        for (std::size_t g = 0; g < G && !differ; ++g)
          differ = refs[g].sample_level != refs[(Q - 1) * G + g].sample_level;
        EXPECT_TRUE(differ);
      }
    }
  }
  EXPECT_GT(certified, 0u);

  // A steady-state call does not allocate.
  std::vector<float> q = synthetic::make_queries(src, head, Q * G, 99);
  std::vector<float> out(Q * G * d);
  std::vector<certificate> certs(Q * G);
  ws.record_samples(false);
  g_allocations = 0;
  g_counting = true;
  attend_positions(std::span<const float>(q), Q, G, kv, idx, noise_key{9, 0, std::uint32_t(head)},
                   opt, std::span<float>(out), std::span<certificate>(certs), ws);
  g_counting = false;
  EXPECT_EQ(g_allocations.load(), 0);

  // The causal dense kernel against exact attention, on every instruction set.
  dense_workspace dws(Q * G, d);
  for (isa a : {isa::kAvx512Vnni, isa::kAvx2, isa::kScalar}) {
    if (int(a) > int(detected_isa())) continue;
    set_isa_cap(a);
    dense_attend_positions(std::span<const float>(q), Q, G, kv, float(opt.effective_softmax_scale(d)),
                           std::span<float>(out), dws, opt.variant);
    set_isa_cap(isa::kAvx512Vnni);
    for (std::size_t p = 0; p < Q; ++p)
      for (std::size_t g = 0; g < G; ++g) {
        const exact_result ex = exact_at(q, p, g, Q, G, kv, rows, opt);
        for (std::size_t i = 0; i < d; ++i)
          ASSERT_NEAR(out[(p * G + g) * d + i], ex.output[i], 2e-5 * std::max(1.0, ex.value_scale))
              << "dense_attend_positions on " << to_string(a) << ", position " << p << " head "
              << g << " channel " << i;
      }
  }
}

template <class T>
void run_positions_case(const positions_case& c) {
  synthetic::cache_config cfg;
  cfg.n_tokens = c.n;
  cfg.head_dim = 64;
  cfg.kv_heads = 2;
  cfg.kind = c.kind;
  cfg.seed = 91 + c.n;
  const synthetic::kv_cache src = synthetic::make_cache(cfg);
  const auto cache = test::make_layout_cache<T>(src, c.layout);
  if (c.layout == layout_kind::kPaged)
    check_positions_call(c, cache.paged(1), src, 1);
  else
    check_positions_call(c, cache.strided(1), src, 1);
}

class PositionsCall : public ::testing::TestWithParam<positions_case> {};

TEST_P(PositionsCall, EachPositionIsItsPrefixCall) {
  const positions_case& c = GetParam();
  if (c.quantized)
    run_positions_case<block_q8_0>(c);
  else
    run_positions_case<half>(c);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PositionsCall,
    ::testing::Values(
        positions_case{layout_kind::kHnd, synthetic::regime::kMixed, 4, 4, 4000, 16, false, false},
        positions_case{layout_kind::kHnd, synthetic::regime::kPeaked, 8, 4, 6000, 16, false, false},
        // More positions than the window: the earlier drafts are the later ones' pool keys.
        positions_case{layout_kind::kPaged, synthetic::regime::kMixed, 8, 2, 3000, 4, false, false},
        positions_case{layout_kind::kNhd, synthetic::regime::kRecency, 2, 1, 3000, 16, false, false},
        positions_case{layout_kind::kHnd, synthetic::regime::kMixed, 4, 2, 4000, 16, true, false},
        positions_case{layout_kind::kPaged, synthetic::regime::kPeaked, 4, 4, 3000, 16, false, true}),
    [](const auto& info) { return name_of(info.param); });

/// One position is attend_group() bit for bit (noise_key::position 0 leaves its stream).
TEST(Positions, OnePositionIsAttendGroup) {
  const synthetic::kv_cache src = one_head_source(5000, 128, 3);
  const auto cache = test::make_layout_cache<half>(src, layout_kind::kHnd);
  const auto kv = cache.strided(0);
  key_index idx(128);
  idx.build(kv);
  const std::size_t G = 4;
  attend_workspace ws(G, 128, 5000);
  group_history h1(G), h2(G);
  options opt;
  opt.cost.measured = false;  // routing on predicted costs: measured times differ between the two calls
  std::vector<float> a(G * 128), b(G * 128);
  std::vector<certificate> ca(G), cb(G);
  for (std::uint64_t step = 1; step <= 4; ++step) {
    const std::vector<float> q = synthetic::make_queries(src, 0, G, step);
    const noise_key nk{step, 0, 0};
    attend_group(std::span<const float>(q), G, kv, idx, nk, opt, std::span<float>(a),
                 std::span<certificate>(ca), ws, h1);
    const group_stats sa = ws.last_stats();
    attend_positions(std::span<const float>(q), 1, G, kv, idx, nk, opt, std::span<float>(b),
                     std::span<certificate>(cb), ws, h2);
    const group_stats sb = ws.last_stats();
    for (std::size_t i = 0; i < a.size(); ++i)
      ASSERT_EQ(std::bit_cast<std::uint32_t>(a[i]), std::bit_cast<std::uint32_t>(b[i])) << i;
    for (std::size_t g = 0; g < G; ++g) {
      EXPECT_EQ(ca[g].level, cb[g].level);
      EXPECT_EQ(ca[g].beta, cb[g].beta);
      EXPECT_EQ(ca[g].bytes_read, cb[g].bytes_read);
    }
    EXPECT_EQ(sa.refined, sb.refined);
    EXPECT_EQ(sa.bytes_read, sb.bytes_read);
    EXPECT_EQ(sa.keys_read, sb.keys_read);
  }
}

// A routed call of several positions reads the tokens every position attends once, for all
// Q G queries (each position's own drafts, and a sliding window's older tokens, joined in
// double): every head is routed and exact, each certified head is within epsilon of exact
// attention over its prefix on every error scale, down to the smallest epsilon (whose
// heads need the double path), the answers agree with a routed call per position, and the
// call reads fewer bytes than a dense pass per position, with a position bias (ALiBi) too:
// its scores in the shared pass are relative to the newest token, a constant shift per
// position.
TEST(Positions, RoutedCallReadsTheSharedTokensOnce) {
  const std::size_t n = 3000, d = 64, G = 2;
  const synthetic::kv_cache src = one_head_source(n, d);
  const auto cache = test::make_layout_cache<half>(src, layout_kind::kHnd);
  const auto kv = cache.strided(0);
  const dense_rows<std::decay_t<decltype(kv)>> rows(kv);
  key_index idx(d);
  idx.build(kv);
  // Each position's own index (its prefix's), for the routed call per position.
  std::vector<key_index> prefix_idx;
  for (std::size_t p = 0; p < 8; ++p) {
    prefix_idx.push_back(idx);
    prefix_idx.back().truncate(kv, n - 7 + p);
  }
  const case_variant cv(G);
  std::size_t heads = 0, certified = 0;
  for (std::size_t Q : {2u, 8u})
    for (int variant = 0; variant < 4; ++variant)
      for (const error_scale scale :
           {error_scale::kValueScale, error_scale::kOutputNorm, error_scale::kDenominator})
        for (const double eps : {0.05, options::kMinEpsilon}) {
          SCOPED_TRACE("Q " + std::to_string(Q) + " variant " + std::to_string(variant) +
                       " scale " + std::string(to_string(scale)) + " eps " + std::to_string(eps));
          options opt;
          opt.epsilon = eps;
          opt.scale = scale;
          opt.route = routing::kAuto;
          if (variant >= 1) {  // soft-cap and sinks
            opt.variant.logit_softcap = cv.v.logit_softcap;
            opt.variant.sinks = cv.v.sinks;
          }
          if (variant >= 2) opt.variant.sliding_window = 2600;  // older tokens per position
          if (variant == 3) opt.variant.alibi_slopes = cv.v.alibi_slopes;
          std::vector<float> q;
          for (std::size_t p = 0; p < Q; ++p) {
            const std::vector<float> qp = synthetic::make_queries(src, 0, G, 40 + p);
            q.insert(q.end(), qp.begin(), qp.end());
          }
          attend_workspace ws(Q * G, d, n);
          std::vector<float> out(Q * G * d);
          std::vector<certificate> certs(Q * G);
          group_history h = routing_history(G);
          attend_positions(std::span<const float>(q), Q, G, kv, idx, noise_key{3, 0, 0}, opt,
                           std::span<float>(out), std::span<certificate>(certs), ws, h);
          const std::size_t one_pass_bytes = ws.last_stats().bytes_read;
          std::size_t per_position_bytes = 0;
          for (std::size_t p = 0; p < Q; ++p) {
            const auto view = kv.prefix(n - Q + 1 + p);
            const key_index& idx_p = prefix_idx[8 - Q + p];
            attend_workspace ws_p(G, d, n);
            std::vector<float> out_p(G * d);
            std::vector<certificate> certs_p(G);
            group_history h_p = routing_history(G);
            attend_group(std::span<const float>(q.data() + p * G * d, G * d), G, view, idx_p,
                         noise_key{3, 0, 0}, opt, std::span<float>(out_p),
                         std::span<certificate>(certs_p), ws_p, h_p);
            per_position_bytes += ws_p.last_stats().bytes_read;
            for (std::size_t g = 0; g < G; ++g) {
              const certificate& c = certs[p * G + g];
              ASSERT_EQ(c.path, answer_path::kRouted) << "p " << p << " g " << g;
              ASSERT_TRUE(c.exact);
              ++heads;
              const exact_result ex = exact_at(q, p, g, Q, G, kv, rows, opt);
              for (std::size_t i = 0; i < d; ++i)
                ASSERT_NEAR(out[(p * G + g) * d + i], out_p[g * d + i],
                            1e-5 * (1.0 + std::fabs(ex.output[i])))
                    << "p " << p << " g " << g << " channel " << i;
              if (!c.certified) continue;
              ++certified;
              EXPECT_LE(scaled_error(out.data() + (p * G + g) * d, ex, opt), opt.epsilon)
                  << "p " << p << " g " << g;
              if (scale == error_scale::kDenominator) {
                const double den = c.denominator * std::exp(c.max_score - ex.max_score);
                EXPECT_LE(std::fabs(den - ex.denominator), opt.epsilon * ex.denominator)
                    << "p " << p << " g " << g;
              }
            }
          }
          // Where the float pass certifies (not at the smallest epsilon, nor on the output-norm
          // scale of these nearly cancelling values, whose heads take the double path either
          // way): one pass instead of eight.
          if (Q == 8 && eps > 0.01 && scale != error_scale::kOutputNorm)
            EXPECT_LT(4 * one_pass_bytes, per_position_bytes);
        }
  EXPECT_GT(certified, heads / 2);
}

/// The causal dense kernel with ALiBi and sinks: each position's scores carry the bias
/// relative to its own token, so its sink's weight against the keys' differs from the
/// newest position's by slope (n - n_p). Large slopes and a sink that holds much of the
/// weight make that shift visible: each position equals dense_attend() over its prefix.
TEST(Positions, DenseKernelShiftsEachPositionsSink) {
  const std::size_t n = 1500, d = 64, G = 2, Q = 8;
  const synthetic::kv_cache src = one_head_source(n, d, 5);
  const auto cache = test::make_layout_cache<half>(src, layout_kind::kHnd);
  const auto kv = cache.strided(0);
  const std::vector<float> slopes{0.25f, 0.5f}, sinks{6.0f, 4.0f};
  attention_variant v;
  v.alibi_slopes = slopes;
  v.sinks = sinks;
  const std::vector<float> q = synthetic::make_queries(src, 0, Q * G, 4);
  std::vector<float> out(Q * G * d), one(G * d);
  dense_workspace ws(Q * G, d), ws1(G, d);
  const float scale = float(1.0 / std::sqrt(double(d)));
  dense_attend_positions(std::span<const float>(q), Q, G, kv, scale, std::span<float>(out), ws, v);
  for (std::size_t p = 0; p < Q; ++p) {
    dense_attend(std::span<const float>(q.data() + p * G * d, G * d), G, kv.prefix(n - Q + 1 + p), scale,
                 std::span<float>(one), ws1, 0, SIZE_MAX, v);
    for (std::size_t i = 0; i < G * d; ++i)
      ASSERT_NEAR(out[p * G * d + i], one[i], 1e-4 * (1.0 + std::fabs(one[i])))
          << "position " << p << " element " << i;
  }
}

// The routed call of several positions on values that nearly cancel (pairs of identical
// keys with values +A x and -A x plus a small offset: ||o|| / M about 2e-8), on the
// output-norm scale: the float pass's error is far above epsilon ||o||, so a certified
// head must have come through the double path; no certified head may miss epsilon.
TEST(Positions, RoutedCallNearCancellingValuesNeverOverclaims) {
  const std::size_t n = 4096, d = 32, G = 1, Q = 4;
  std::size_t certified = 0, violations = 0;
  for (std::uint64_t trial = 0; trial < 25; ++trial) {
    const double A = 1000.0;
    const test::head_cache<float> cache(
        n, d,
        [&](std::size_t t, std::size_t i) { return test::gauss(trial * 31 + t % (n / 2), i); },
        [&](std::size_t t, std::size_t i) {
          const double x = test::gauss(trial * 77 + t % (n / 2), i + 500);
          return (t < n / 2 ? A * x : -A * x) + 2e-5;
        });
    key_index idx(d);
    idx.build(cache.view());
    std::vector<float> q(Q * d);
    for (std::size_t i = 0; i < q.size(); ++i) q[i] = float(test::gauss(trial, 9000 + i));
    options opt;
    opt.scale = error_scale::kOutputNorm;
    attend_workspace ws(Q * G, d, n);
    std::vector<float> out(Q * d);
    std::vector<certificate> certs(Q);
    group_history h = routing_history(G);
    attend_positions(std::span<const float>(q), Q, G, cache.view(), idx, noise_key{trial, 0, 0},
                     opt, std::span<float>(out), std::span<certificate>(certs), ws, h);
    for (std::size_t p = 0; p < Q; ++p) {
      ASSERT_EQ(certs[p].path, answer_path::kRouted);
      if (!certs[p].certified) continue;
      ++certified;
      const std::size_t n_p = n - Q + 1 + p;
      const exact_result ex = exact_attention(std::span<const float>(q.data() + p * d, d),
                                              cache.key_matrix(n_p), cache.value_matrix(n_p));
      violations += scaled_error(out.data() + p * d, ex, opt) > opt.epsilon;
    }
  }
  EXPECT_EQ(violations, 0u) << certified << " certified";
  EXPECT_GT(certified, 0u);
}

/// A sliding window shorter than the positions: each position attends its own few newest
/// tokens only (no pool: exact answers), and the causal dense kernel's shared pass is empty.
TEST(Positions, SlidingWindowShorterThanThePositions) {
  const std::size_t n = 3000, d = 64, G = 2, Q = 6;
  const synthetic::kv_cache src = one_head_source(n, d, 21);
  const auto cache = test::make_layout_cache<half>(src, layout_kind::kHnd);
  const strided_kv<half> kv = cache.strided(0);
  const dense_rows<strided_kv<half>> rows(kv);
  key_index idx(d);
  idx.build(kv);
  case_variant cv(G);
  options opt;
  opt.variant = cv.v;
  opt.variant.sliding_window = 3;
  const std::vector<float> q = synthetic::make_queries(src, 0, Q * G, 5);
  std::vector<float> out(Q * G * d), dense(Q * G * d);
  std::vector<certificate> certs(Q * G);
  attend_workspace ws(Q * G, d, n);
  attend_positions(std::span<const float>(q), Q, G, kv, idx, noise_key{1, 0, 0}, opt,
                   std::span<float>(out), std::span<certificate>(certs), ws);
  dense_workspace dws(Q * G, d);
  dense_attend_positions(std::span<const float>(q), Q, G, kv, float(opt.effective_softmax_scale(d)),
                         std::span<float>(dense), dws, opt.variant);
  for (std::size_t p = 0; p < Q; ++p)
    for (std::size_t g = 0; g < G; ++g) {
      const exact_result ex = exact_at(q, p, g, Q, G, kv, rows, opt);
      const std::size_t r = p * G + g;
      EXPECT_TRUE(certs[r].exact) << "position " << p << " head " << g;
      EXPECT_EQ(certs[r].keys_read, 3u);
      for (std::size_t i = 0; i < d; ++i) {
        ASSERT_NEAR(out[r * d + i], ex.output[i], 1e-5 * std::max(1.0, ex.value_scale)) << p << " " << g;
        ASSERT_NEAR(dense[r * d + i], ex.output[i], 2e-5 * std::max(1.0, ex.value_scale)) << p << " " << g;
      }
    }
}

/// Speculative verification's loop: append k drafts, verify them in one call, keep the
/// accepted ones and truncate the rest; the next call equals one on an index that never
/// saw the rejected drafts (the prompt built, then only the kept tokens appended).
TEST(Positions, TruncateAfterPartialAcceptance) {
  const std::size_t n = 6000, d = 64, G = 4, Q = 4;
  const synthetic::kv_cache src = one_head_source(n, d, 12);
  const auto cache = test::make_layout_cache<half>(src, layout_kind::kHnd);
  const auto kv = cache.strided(0);
  const std::size_t prompt = 5000;
  key_index idx(d);
  idx.build(kv.prefix(prompt));
  attend_workspace ws(Q * G, d, n);
  options opt;
  opt.route = routing::kOff;
  std::size_t len = prompt;  // tokens kept so far
  for (std::uint64_t step = 1; step <= 3; ++step) {
    // Q drafts appended and verified; 1 + step % 3 of them accepted.
    for (std::size_t t = len; t < len + Q; ++t) idx.append(kv, t);
    std::vector<float> q = synthetic::make_queries(src, 0, Q * G, step);
    std::vector<float> out(Q * G * d);
    std::vector<certificate> certs(Q * G);
    attend_positions(std::span<const float>(q), Q, G, kv.prefix(len + Q), idx,
                     noise_key{step, 0, 0}, opt, std::span<float>(out),
                     std::span<certificate>(certs), ws);
    len += 1 + step % 3;
    idx.truncate(kv, len);
    // The next call on the truncated index, and on a fresh one.
    idx.append(kv, len);
    // Fresh: the same prompt, then only the kept tokens, never a rejected draft.
    key_index fresh(d);
    fresh.build(kv.prefix(prompt));
    for (std::size_t t = prompt; t <= len; ++t) fresh.append(kv, t);
    const std::vector<float> q1 = synthetic::make_queries(src, 0, G, 100 + step);
    std::vector<float> a(G * d), b(G * d);
    std::vector<certificate> ca(G), cb(G);
    const noise_key nk{100 + step, 0, 0};
    attend_group(std::span<const float>(q1), G, kv.prefix(len + 1), idx, nk, opt,
                 std::span<float>(a), std::span<certificate>(ca), ws);
    attend_group(std::span<const float>(q1), G, kv.prefix(len + 1), fresh, nk, opt,
                 std::span<float>(b), std::span<certificate>(cb), ws);
    for (std::size_t i = 0; i < a.size(); ++i)
      ASSERT_EQ(std::bit_cast<std::uint32_t>(a[i]), std::bit_cast<std::uint32_t>(b[i]))
          << "step " << step << " output " << i;
    for (std::size_t g = 0; g < G; ++g) {
      EXPECT_EQ(ca[g].level, cb[g].level);
      EXPECT_EQ(ca[g].beta, cb[g].beta);
    }
    idx.truncate(kv, len);
  }
}

std::string message_of(auto&& f) {
  try {
    f();
  } catch (const error& e) {
    return e.what();
  }
  return "no error";
}

TEST(PositionsBadInput, ErrorsNameTheArgument) {
  const synthetic::kv_cache src = one_head_source(600, 32);
  const auto cache = test::make_layout_cache<half>(src, layout_kind::kHnd);
  const auto kv = cache.strided(0);
  key_index idx(32);
  idx.build(kv);
  const std::size_t G = 2, Q = 3;
  attend_workspace ws(Q * G, 32, 600), small(G, 32, 600);
  options opt;
  std::vector<float> q(Q * G * 32, 0.1f), out(Q * G * 32);
  std::vector<certificate> certs(Q * G);
  auto call = [&](std::size_t positions, std::span<const float> qs, attend_workspace& w) {
    attend_positions(qs, positions, G, kv, idx, noise_key{1, 0, 0}, opt,
                     std::span<float>(out).first(positions * G * 32),
                     std::span<certificate>(certs).first(positions * G), w);
  };
  EXPECT_NE(message_of([&] { call(0, {}, ws); }).find("positions must be > 0"), std::string::npos);
  EXPECT_NE(message_of([&] { call(Q, std::span<const float>(q).first(G * 32), ws); })
                .find("queries has 64 elements, expected positions * group * head_dim = 192"),
            std::string::npos);
  EXPECT_NE(message_of([&] { call(Q, q, small); }).find("too small for this call (positions * group 6"),
            std::string::npos);
  std::vector<float> big(700 * G * 32, 0.1f), big_out(700 * G * 32);
  std::vector<certificate> big_certs(700 * G);
  EXPECT_NE(message_of([&] {
              attend_positions(std::span<const float>(big), 700, G, kv, idx, noise_key{1, 0, 0}, opt,
                               std::span<float>(big_out), std::span<certificate>(big_certs), ws);
            }).find("positions (700) exceeds kv.size() (600)"),
            std::string::npos);
  q[G * 32 + 5] = std::nanf("");
  EXPECT_NE(message_of([&] { call(Q, q, ws); }).find("queries contain a NaN"), std::string::npos);
  dense_workspace dws(G, 32);
  EXPECT_NE(message_of([&] {
              dense_attend_positions(std::span<const float>(q), Q, G, kv, 0.0f, std::span<float>(out), dws);
            }).find("ws"),
            std::string::npos);
}

}  // namespace
