// Several sequences over a shared prefix in one call (attend_sequences()): parallel samples
// of one prompt, their views paged over the prefix's pages and then their own. For each
// sequence and head the fast path computes what the reference computes over that
// sequence's view with the pool ending at the prefix (same path, level, samples token by
// token, beta and the bound to 1e-9), every certified head is within epsilon of exact
// attention over the sequence's tokens, outputs are the same bits on every instruction
// set, a steady-state call does not allocate, a sequence without tokens of its own is
// attend_group() bit for bit, and the rounding bound of an exact answer covers keys that
// only a sequence's own tokens hold. The dense baseline (dense_attend_sequences())
// agrees with exact attention. Bad input gets an error naming the argument.
#include "support/count_allocations.hpp"

#include <certattn/attend.hpp>
#include <certattn/dense.hpp>
#include <certattn/exact.hpp>
#include <certattn/reference.hpp>

#include "support/harness.hpp"
#include "support/layouts.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <functional>
#include <cmath>
#include <cstddef>
#include <set>
#include <string>
#include <vector>

namespace {

using namespace certattn;
using test::layout_kind;
using ::testing::HasSubstr;

/// The message of the certattn::error that f throws; a marker string otherwise.
std::string error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const certattn::error& e) {
    return e.what();
  } catch (...) {
    return "<another exception>";
  }
  return "<no exception>";
}

/// S sequences over one paged cache: the prefix's pages, then each sequence's own pages
/// (its tail's tokens follow the prefix and the earlier tails in the synthetic source,
/// each tail starting on a page).
template <class T>
struct shared_prefix_cache {
  test::layout_cache<T> cache;
  std::size_t prefix = 0;
  std::vector<std::vector<std::int32_t>> tables;
  std::vector<paged_kv<T>> views;

  shared_prefix_cache(const synthetic::kv_cache& src, std::size_t prefix_tokens,
                      const std::vector<std::size_t>& tails)
      : cache(test::make_layout_cache<T>(src, layout_kind::kPaged)), prefix(prefix_tokens) {
    const std::size_t page = cache.page;
    std::size_t start = prefix;  // a multiple of the page size
    for (std::size_t tail : tails) {
      std::vector<std::int32_t> table(cache.table.begin(),
                                      cache.table.begin() + std::ptrdiff_t(prefix / page));
      for (std::size_t p = 0; p * page < tail; ++p) table.push_back(cache.table[start / page + p]);
      tables.push_back(std::move(table));
      start += (tail + page - 1) / page * page;
    }
    const std::size_t u = format_traits<T>::units(cache.d);
    for (std::size_t s = 0; s < tails.size(); ++s)
      views.emplace_back(cache.keys.data(), cache.values.data(), tables[s], prefix + tails[s], page,
                         cache.d, cache.heads * page * u, u, 0);
  }
};

/// Synthetic source tokens for a prefix and the given tails, each tail on its own pages.
synthetic::kv_cache make_source(std::size_t prefix, const std::vector<std::size_t>& tails,
                                std::size_t d, synthetic::regime kind, std::uint64_t seed) {
  std::size_t n = prefix;
  for (std::size_t t : tails) n += (t + 15) / 16 * 16;
  synthetic::cache_config cfg;
  cfg.n_tokens = n;
  cfg.head_dim = d;
  cfg.kv_heads = 1;
  cfg.kind = kind;
  cfg.seed = seed;
  return synthetic::make_cache(cfg);
}

struct sequences_case {
  synthetic::regime kind;
  std::size_t group, prefix, window;
  std::vector<std::size_t> tails;
  bool variant;    // sliding window, ALiBi slopes, soft-cap and sinks
  bool quantized;  // a q8_0 cache instead of fp16
};

std::string name_of(const sequences_case& c) {
  std::string s = std::string(synthetic::to_string(c.kind)) + "_G" + std::to_string(c.group) +
                  "_P" + std::to_string(c.prefix) + "_w" + std::to_string(c.window) + "_tails";
  for (std::size_t t : c.tails) s += "_" + std::to_string(t);
  return s + (c.variant ? "_variant" : "") + (c.quantized ? "_q8_0" : "");
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

template <class View>
exact_result exact_of(const std::vector<float>& q, std::size_t s, std::size_t g, std::size_t G,
                      const View& kv, const options& opt) {
  const std::size_t d = kv.head_dim();
  const dense_rows<View> rows(kv);
  return exact_attention(std::span<const float>(q.data() + (s * G + g) * d, d), rows.key_matrix(),
                         rows.value_matrix(), opt.effective_softmax_scale(d),
                         head_slice(opt.variant, g));
}

template <class T>
void check_sequences_case(const sequences_case& c) {
  const std::size_t d = 64, G = c.group, S = c.tails.size(), P = c.prefix;
  const synthetic::kv_cache src = make_source(P, c.tails, d, c.kind, 300 + P);
  const shared_prefix_cache<T> sp(src, P, c.tails);
  using View = paged_kv<T>;
  const std::span<const View> views(sp.views);
  key_index idx(d);
  idx.build(views[0].prefix(P));
  std::size_t n_max = 0;
  for (const View& v : views) n_max = std::max(n_max, v.size());
  attend_workspace ws(S * G, d, n_max);
  ws.record_samples(true);
  const case_variant cv(G);
  options opt;
  opt.seed = 23;
  opt.window = c.window;
  opt.route = routing::kOff;
  if (c.variant) opt.variant = cv.v;
  std::vector<std::uint64_t> ids;
  for (std::size_t s = 0; s < S; ++s) ids.push_back(1000 + 7 * s);
  std::size_t certified = 0;
  for (std::uint64_t step : {1u, 2u}) {
    const noise_key nk{step, 3, 0};
    std::vector<float> q;
    for (std::size_t s = 0; s < S; ++s) {
      const std::vector<float> qs = synthetic::make_queries(src, 0, G, 10 * step + s);
      q.insert(q.end(), qs.begin(), qs.end());
    }
    std::vector<float> first_out;
    std::vector<certificate> first_certs;
    for (isa a : {isa::kAvx512Vnni, isa::kAvx2, isa::kScalar}) {
      if (int(a) > int(detected_isa())) continue;
      SCOPED_TRACE(std::string(to_string(a)) + " step " + std::to_string(step));
      std::vector<float> out(S * G * d);
      std::vector<certificate> certs(S * G);
      set_isa_cap(a);
      attend_sequences(std::span<const float>(q), G, views, idx, nk,
                       std::span<const std::uint64_t>(ids), opt, std::span<float>(out),
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
        for (std::size_t h = 0; h < S * G; ++h) {
          ASSERT_EQ(certs[h].level, first_certs[h].level);
          ASSERT_EQ(certs[h].beta, first_certs[h].beta);
        }
        continue;
      }
      const reference_extras extras{idx.value_center(), idx.value_cap(), idx.reach_floor()};
      const std::vector<reference_result> refs = reference_attend_sequences(
          std::span<const float>(q), G, views, P, opt, nk, std::span<const std::uint64_t>(ids), extras);
      ASSERT_EQ(refs.size(), S * G);
      for (std::size_t s = 0; s < S; ++s)
        for (std::size_t g = 0; g < G; ++g) {
          const std::size_t h = s * G + g;
          SCOPED_TRACE("sequence " + std::to_string(s) + " head " + std::to_string(g));
          const reference_result& r = refs[h];
          const certificate& f = certs[h];
          ASSERT_EQ(to_string(f.path), to_string(r.cert.path));
          ASSERT_EQ(f.level, r.cert.level);
          ASSERT_EQ(f.sampled, r.cert.sampled);
          ASSERT_EQ(f.heavy, r.cert.heavy);
          ASSERT_EQ(f.max_score, r.cert.max_score);
          ASSERT_EQ(f.certified, r.cert.certified);
          EXPECT_NEAR(f.bound, r.cert.bound, 1e-9 * std::max(1.0, r.cert.bound));
          if (!f.exact) {
            EXPECT_NEAR(f.beta, r.cert.beta, 1e-9 * std::max(1.0, r.cert.beta));
            std::set<std::uint32_t> fast, ref;
            for (const auto& sk : ws.samples(h)) fast.insert(sk.token);
            for (std::size_t t = 0; t < r.sample_level.size(); ++t)
              if (r.sample_level[t] >= 0 && r.sample_level[t] <= f.level) ref.insert(std::uint32_t(t));
            ASSERT_EQ(fast, ref) << "sample sets differ";
            // Only prefix tokens are sampled: the own tokens are read exactly.
            if (!fast.empty()) EXPECT_LT(*fast.rbegin(), P);
          }
          // Within epsilon of exact attention over all the sequence's tokens (false
          // failure probability <= delta per certified head).
          const exact_result ex = exact_of(q, s, g, G, views[s], opt);
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
      // The sequences draw different perturbations: their samples differ somewhere.
      if (S > 1) {
        bool differ = false;
        for (std::size_t g = 0; g < G && !differ; ++g)
          differ = refs[g].sample_level != refs[(S - 1) * G + g].sample_level;
        EXPECT_TRUE(differ);
      }
    }
  }
  EXPECT_GT(certified, 0u);

  // A steady-state call does not allocate.
  std::vector<float> q = synthetic::make_queries(src, 0, S * G, 99);
  std::vector<float> out(S * G * d);
  std::vector<certificate> certs(S * G);
  ws.record_samples(false);
  g_allocations = 0;
  g_counting = true;
  attend_sequences(std::span<const float>(q), G, views, idx, noise_key{9, 3, 0},
                   std::span<const std::uint64_t>(ids), opt, std::span<float>(out),
                   std::span<certificate>(certs), ws);
  g_counting = false;
  EXPECT_EQ(g_allocations.load(), 0);

  // The dense baseline against exact attention, on every instruction set.
  dense_workspace dws(S * G, d);
  for (isa a : {isa::kAvx512Vnni, isa::kAvx2, isa::kScalar}) {
    if (int(a) > int(detected_isa())) continue;
    set_isa_cap(a);
    dense_attend_sequences(std::span<const float>(q), G, views, P,
                           float(opt.effective_softmax_scale(d)), std::span<float>(out), dws,
                           opt.variant);
    set_isa_cap(isa::kAvx512Vnni);
    for (std::size_t s = 0; s < S; ++s)
      for (std::size_t g = 0; g < G; ++g) {
        const exact_result ex = exact_of(q, s, g, G, views[s], opt);
        for (std::size_t i = 0; i < d; ++i)
          ASSERT_NEAR(out[(s * G + g) * d + i], ex.output[i], 2e-5 * std::max(1.0, ex.value_scale))
              << "dense_attend_sequences on " << to_string(a) << ", sequence " << s << " head "
              << g << " channel " << i;
      }
  }
}

class SequencesCall : public ::testing::TestWithParam<sequences_case> {};

TEST_P(SequencesCall, EachSequenceIsItsPrefixPoolCall) {
  const sequences_case& c = GetParam();
  if (c.quantized)
    check_sequences_case<block_q8_0>(c);
  else
    check_sequences_case<half>(c);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, SequencesCall,
    ::testing::Values(
        // No own tokens, fewer than the window (the window reaches into the prefix), more.
        sequences_case{synthetic::regime::kMixed, 4, 3008, 16, {0, 40, 600}, false, false},
        sequences_case{synthetic::regime::kPeaked, 2, 4096, 64, {200, 1, 900, 64}, false, false},
        sequences_case{synthetic::regime::kRecency, 1, 2000, 16, {300, 300}, false, false},
        sequences_case{synthetic::regime::kMixed, 4, 3008, 16, {10, 500, 80}, true, false},
        sequences_case{synthetic::regime::kMixed, 2, 3008, 16, {0, 120, 700}, false, true}),
    [](const auto& info) { return name_of(info.param); });

/// A sequence without tokens of its own is attend_group() over its view and the prefix's
/// index, bit for bit, with its id as noise_key::sequence.
TEST(Sequences, ASequenceWithoutOwnTokensIsAttendGroup) {
  const std::size_t d = 128, G = 4, P = 4992;
  const std::vector<std::size_t> tails{0, 300};
  const synthetic::kv_cache src = make_source(P, tails, d, synthetic::regime::kMixed, 5);
  const shared_prefix_cache<half> sp(src, P, tails);
  key_index idx(d);
  idx.build(sp.views[0]);
  attend_workspace ws(2 * G, d, P + 300), ws1(G, d, P);
  options opt;
  opt.route = routing::kOff;
  const std::vector<std::uint64_t> ids{41, 42};
  for (std::uint64_t step = 1; step <= 3; ++step) {
    std::vector<float> q = synthetic::make_queries(src, 0, 2 * G, step);
    std::vector<float> a(2 * G * d), b(G * d);
    std::vector<certificate> ca(2 * G), cb(G);
    attend_sequences(std::span<const float>(q), G, std::span<const paged_kv<half>>(sp.views), idx,
                     noise_key{step, 0, 0}, std::span<const std::uint64_t>(ids), opt,
                     std::span<float>(a), std::span<certificate>(ca), ws);
    attend_group(std::span<const float>(q.data(), G * d), G, sp.views[0], idx,
                 noise_key{step, 0, 0, ids[0]}, opt, std::span<float>(b), std::span<certificate>(cb),
                 ws1);
    for (std::size_t i = 0; i < b.size(); ++i)
      ASSERT_EQ(std::bit_cast<std::uint32_t>(a[i]), std::bit_cast<std::uint32_t>(b[i])) << i;
    for (std::size_t g = 0; g < G; ++g) {
      EXPECT_EQ(ca[g].level, cb[g].level);
      EXPECT_EQ(ca[g].beta, cb[g].beta);
      EXPECT_EQ(ca[g].keys_read, cb[g].keys_read);
    }
  }
}

/// joined_kv (a prefix buffer, then each sequence's own buffer) serves the same call as
/// paged views over the same tokens: the same answers and certificates, bit for bit.
TEST(Sequences, JoinedViewsEqualPagedViews) {
  const std::size_t d = 64, G = 2, P = 2048;
  const std::vector<std::size_t> tails{96, 400};
  const synthetic::kv_cache src = make_source(P, tails, d, synthetic::regime::kMixed, 21);
  const shared_prefix_cache<half> sp(src, P, tails);
  const auto hnd = test::make_layout_cache<half>(src, layout_kind::kHnd);
  const std::size_t n = hnd.n;
  const strided_kv<half> prefix = hnd_view(hnd.keys.data(), hnd.values.data(), P, n, 1, d, 0);
  std::vector<strided_kv<half>> own;
  std::size_t start = P;
  for (std::size_t t : tails) {
    own.push_back(hnd_view(hnd.keys.data() + start * d, hnd.values.data() + start * d, t, t, 1, d, 0));
    start += (t + 15) / 16 * 16;
  }
  std::vector<joined_kv<strided_kv<half>>> joined;
  for (const auto& o : own) joined.emplace_back(prefix, o);
  key_index idx(d), idx_joined(d);
  idx.build(sp.views[0].prefix(P));
  idx_joined.build(prefix);
  attend_workspace ws(2 * G, d, P + 400);
  options opt;
  opt.route = routing::kOff;
  const std::vector<std::uint64_t> ids{8, 9};
  const std::vector<float> q = synthetic::make_queries(src, 0, 2 * G, 3);
  std::vector<float> a(2 * G * d), b(2 * G * d);
  std::vector<certificate> ca(2 * G), cb(2 * G);
  attend_sequences(std::span<const float>(q), G, std::span<const paged_kv<half>>(sp.views), idx,
                   noise_key{2, 0, 0}, std::span<const std::uint64_t>(ids), opt, std::span<float>(a),
                   std::span<certificate>(ca), ws);
  attend_sequences(std::span<const float>(q), G, std::span<const joined_kv<strided_kv<half>>>(joined),
                   idx_joined, noise_key{2, 0, 0}, std::span<const std::uint64_t>(ids), opt,
                   std::span<float>(b), std::span<certificate>(cb), ws);
  for (std::size_t i = 0; i < a.size(); ++i)
    ASSERT_EQ(std::bit_cast<std::uint32_t>(a[i]), std::bit_cast<std::uint32_t>(b[i])) << i;
  for (std::size_t h = 0; h < 2 * G; ++h) {
    EXPECT_EQ(ca[h].level, cb[h].level);
    EXPECT_EQ(ca[h].beta, cb[h].beta);
    EXPECT_EQ(ca[h].keys_read, cb[h].keys_read);
  }
  EXPECT_THAT(error_message([&] { joined_kv<strided_kv<half>>(prefix, hnd_view(hnd.keys.data(), hnd.values.data(), 8, 8, 2, 32, 0)); }),
              HasSubstr("joined_kv: own's head_dim 32"));
}

/// An exact answer's rounding bound scales with the largest key the call reads: a key of
/// a sequence's own tokens, which the prefix's index does not hold, must count. With views
/// no longer than the window every head is answered exactly without a pool, and its bound
/// equals the reference's, which takes max |k| over all of the view's keys: sequence 1's
/// own key, hundreds of times the others, moves the double path's term by about 1e-3 of
/// the bound, a million times the comparison's tolerance.
TEST(Sequences, ExactAnswersBoundTheOwnTokensKeys) {
  const std::size_t d = 64, G = 2, P = 48;
  const std::vector<std::size_t> tails{16, 16};
  const synthetic::kv_cache src = make_source(P, tails, d, synthetic::regime::kMixed, 8);
  shared_prefix_cache<half> sp(src, P, tails);
  // Sequence 1's own token P + 5 gets a large key channel.
  {
    const half* k = sp.views[1].key(P + 5);
    const_cast<half*>(k)[5] = half(2000.0f);
  }
  key_index idx(d);
  idx.build(sp.views[0].prefix(P));
  attend_workspace ws(2 * G, d, P + 16);
  options opt;
  opt.route = routing::kOff;
  opt.epsilon = options::kMinEpsilon;
  const std::vector<std::uint64_t> ids{1, 2};
  std::vector<float> q = synthetic::make_queries(src, 0, 2 * G, 4);
  for (std::size_t g = 0; g < G; ++g)  // the twins' queries are the same
    std::copy_n(q.begin() + std::ptrdiff_t(g * d), d, q.begin() + std::ptrdiff_t((G + g) * d));
  std::vector<float> out(2 * G * d);
  std::vector<certificate> certs(2 * G);
  const std::span<const paged_kv<half>> views(sp.views);
  attend_sequences(std::span<const float>(q), G, views, idx, noise_key{1, 0, 0},
                   std::span<const std::uint64_t>(ids), opt, std::span<float>(out),
                   std::span<certificate>(certs), ws);
  const reference_extras extras{idx.value_center(), idx.value_cap(), idx.reach_floor()};
  const std::vector<reference_result> refs = reference_attend_sequences(
      std::span<const float>(q), G, views, P, opt, noise_key{1, 0, 0},
      std::span<const std::uint64_t>(ids), extras);
  for (std::size_t h = 0; h < 2 * G; ++h) {
    SCOPED_TRACE("head " + std::to_string(h));
    ASSERT_EQ(certs[h].path, answer_path::kNoPool);
    EXPECT_NEAR(certs[h].bound, refs[h].cert.bound, 1e-9 * refs[h].cert.bound);
    EXPECT_EQ(certs[h].certified, refs[h].cert.certified);
  }
}

/// The dense baseline with ALiBi and sinks: each sequence's bias is relative to its own
/// newest token, so its sink's weight against the keys' differs from views[0]'s by slope
/// (n0 - n_s). Large slopes and heavy sinks make that visible: each sequence equals
/// dense_attend() over its view.
TEST(Sequences, DenseBaselineShiftsEachSequencesSink) {
  const std::size_t d = 64, G = 2, P = 1024;
  const std::vector<std::size_t> tails{0, 200, 48};
  const synthetic::kv_cache src = make_source(P, tails, d, synthetic::regime::kMixed, 31);
  const shared_prefix_cache<half> sp(src, P, tails);
  const std::vector<float> slopes{0.02f, 0.05f}, sinks{6.0f, 4.0f};
  attention_variant v;
  v.alibi_slopes = slopes;
  v.sinks = sinks;
  const std::vector<float> q = synthetic::make_queries(src, 0, 3 * G, 6);
  std::vector<float> out(3 * G * d), one(G * d);
  dense_workspace ws(3 * G, d), ws1(G, d);
  const float scale = float(1.0 / std::sqrt(double(d)));
  dense_attend_sequences(std::span<const float>(q), G, std::span<const paged_kv<half>>(sp.views), P, scale,
                         std::span<float>(out), ws, v);
  for (std::size_t s = 0; s < 3; ++s) {
    dense_attend(std::span<const float>(q.data() + s * G * d, G * d), G, sp.views[s], scale,
                 std::span<float>(one), ws1, 0, SIZE_MAX, v);
    for (std::size_t i = 0; i < G * d; ++i)
      ASSERT_NEAR(out[s * G * d + i], one[i], 1e-4 * (1.0 + std::fabs(one[i])))
          << "sequence " << s << " element " << i;
  }
}

TEST(Sequences, BadInputNamesTheArgument) {
  const std::size_t d = 64, G = 2, P = 512;
  const std::vector<std::size_t> tails{16, 32};
  const synthetic::kv_cache src = make_source(P, tails, d, synthetic::regime::kMixed, 9);
  shared_prefix_cache<half> sp(src, P, tails);
  key_index idx(d);
  idx.build(sp.views[0].prefix(P));
  attend_workspace ws(2 * G, d, P + 32), small(G, d, P + 32);
  const options opt;
  std::vector<float> q = synthetic::make_queries(src, 0, 2 * G, 1), out(2 * G * d);
  std::vector<certificate> certs(2 * G);
  const std::span<const paged_kv<half>> views(sp.views);
  auto call = [&](std::span<const std::uint64_t> ids, const key_index& index,
                  attend_workspace& w) {
    attend_sequences(std::span<const float>(q), G, views, index, noise_key{1, 0, 0}, ids, opt,
                     std::span<float>(out), std::span<certificate>(certs), w);
  };
  const std::vector<std::uint64_t> ids{5, 6}, same{5, 5}, one{5};
  EXPECT_THAT(error_message([&] { call(same, idx, ws); }), HasSubstr("sequences: ids 0 and 1 are equal"));
  EXPECT_THAT(error_message([&] { call(one, idx, ws); }), HasSubstr("sequences has 1 elements"));
  EXPECT_THAT(error_message([&] { call(ids, idx, small); }), HasSubstr("too small for this call (sequences * group 4)"));
  key_index longer(d);
  longer.build(sp.views[1]);
  EXPECT_THAT(error_message([&] { call(ids, longer, ws); }), HasSubstr("sequence 0: prefix_index.size() (544) exceeds kv.size() (528)"));
  // A NaN in a sequence's own key: the prefix's index never saw it.
  const half* k = sp.views[1].key(P + 3);
  const half saved = k[0];
  const_cast<half*>(k)[0] = half(std::numeric_limits<float>::quiet_NaN());
  EXPECT_THAT(error_message([&] { call(ids, idx, ws); }), HasSubstr("sequence 1: views[1]: token 515's key has a NaN or Inf"));
  const_cast<half*>(k)[0] = saved;
  group_history h(G), other(3);
  std::vector<group_history*> twice{&h, &h}, wrong{&h, &other};
  auto with_histories = [&](std::vector<group_history*>& hs) {
    attend_sequences(std::span<const float>(q), G, views, idx, noise_key{1, 0, 0},
                     std::span<const std::uint64_t>(ids), opt, std::span<float>(out),
                     std::span<certificate>(certs), ws, std::span<group_history* const>(hs));
  };
  EXPECT_THAT(error_message([&] { with_histories(twice); }), HasSubstr("are the same group_history"));
  EXPECT_THAT(error_message([&] { with_histories(wrong); }), HasSubstr("histories[1] (group_history) is for group 3"));
}

/// With a history per sequence, each routes and hints its own sequence: the call runs
/// many steps with routing on, equals at every step the reference given copies of the
/// histories taken before it, every certified head stays within epsilon, and each
/// history keeps its own sequence's key.
TEST(Sequences, HistoriesKeepTheirOwnSequence) {
  std::size_t routed = 0, sparse = 0;
  for (synthetic::regime regime : {synthetic::regime::kUniform, synthetic::regime::kMixed}) {
    SCOPED_TRACE(std::string(synthetic::to_string(regime)));
    const std::size_t d = 64, G = 2, P = 4096;
    const std::vector<std::size_t> tails{64, 256};
    const synthetic::kv_cache src = make_source(P, tails, d, regime, 12);
    const shared_prefix_cache<half> sp(src, P, tails);
    key_index idx(d);
    idx.build(sp.views[0].prefix(P));
    attend_workspace ws(2 * G, d, P + 256);
    options opt;
    opt.cost.measured = false;
    const std::vector<std::uint64_t> ids{3, 4};
    group_history h0(G), h1(G);
    std::vector<group_history*> hs{&h0, &h1};
    const std::span<const paged_kv<half>> views(sp.views);
    for (std::uint64_t step = 1; step <= 12; ++step) {
      std::vector<float> q = synthetic::make_queries(src, 0, 2 * G, step);
      std::vector<float> out(2 * G * d);
      std::vector<certificate> certs(2 * G);
      const group_history before0 = h0, before1 = h1;
      const std::vector<const group_history*> before{&before0, &before1};
      attend_sequences(std::span<const float>(q), G, views, idx, noise_key{step, 0, 0},
                       std::span<const std::uint64_t>(ids), opt, std::span<float>(out),
                       std::span<certificate>(certs), ws, std::span<group_history* const>(hs));
      const reference_extras extras{idx.value_center(), idx.value_cap(), idx.reach_floor()};
      const std::vector<reference_result> refs = reference_attend_sequences(
          std::span<const float>(q), G, views, P, opt, noise_key{step, 0, 0}, std::span<const std::uint64_t>(ids),
          extras, {}, std::span<const group_history* const>(before));
      for (std::size_t s = 0; s < 2; ++s)
        for (std::size_t g = 0; g < G; ++g) {
          const certificate& c = certs[s * G + g];
          const certificate& r = refs[s * G + g].cert;
          SCOPED_TRACE("step " + std::to_string(step) + " sequence " + std::to_string(s) + " head " +
                       std::to_string(g));
          ASSERT_EQ(to_string(c.path), to_string(r.path));
          ASSERT_EQ(c.level, r.level);
          ASSERT_EQ(c.sampled, r.sampled);
          ASSERT_EQ(c.certified, r.certified);
          ASSERT_EQ(c.exact, r.exact);
          // Exact answers: the dense kernel's float rounding bound against the reference's
          // double one; sampled answers: the same bound.
          if (!c.exact) EXPECT_NEAR(c.bound, r.bound, 1e-9 * std::max(1.0, r.bound));
          routed += c.path == answer_path::kRouted;
          sparse += !c.exact;
          if (!c.certified) continue;
          const exact_result ex = exact_of(q, s, g, G, sp.views[s], opt);
          double err2 = 0.0;
          for (std::size_t i = 0; i < d; ++i) {
            const double e = double(out[(s * G + g) * d + i]) - ex.output[i];
            err2 += e * e;
          }
          EXPECT_LE(std::sqrt(err2), opt.epsilon * ex.value_scale) << "step " << step;
        }
      // Each history's hints are for its own sequence's next step only.
      EXPECT_TRUE(h0.hints_for(noise_key{step + 1, 0, 0, ids[1]}).empty());
    }
  }
  // The uniform regime is cheaper dense: the histories route its sequences; the mixed
  // one is sampled, each step hinted by its sequence's history.
  EXPECT_GT(routed, 0u);
  EXPECT_GT(sparse, 0u);
}

/// reference_attend_sequences() takes one history per sequence, never with level hints.
TEST(Sequences, ReferenceChecksItsHistories) {
  const std::size_t d = 64, G = 2, P = 4096;
  const std::vector<std::size_t> tails{64, 256};
  const synthetic::kv_cache src = make_source(P, tails, d, synthetic::regime::kMixed, 12);
  const shared_prefix_cache<half> sp(src, P, tails);
  const std::span<const paged_kv<half>> views(sp.views);
  const options opt;
  const std::vector<std::uint64_t> ids{3, 4};
  const group_history h0(G), h1(G);
  const std::vector<float> q = synthetic::make_queries(src, 0, 2 * G, 13);
  const std::vector<const group_history*> one{&h0};
  const std::vector<int> hints(2 * G, 3);
  EXPECT_THAT(error_message([&] {
                reference_attend_sequences(std::span<const float>(q), G, views, P, opt, noise_key{13, 0, 0},
                                           std::span<const std::uint64_t>(ids), {}, {},
                                           std::span<const group_history* const>(one));
              }),
              HasSubstr("1 histories for 2 sequences (expected none or one per sequence)"));
  const std::vector<const group_history*> two{&h0, &h1};
  EXPECT_THAT(error_message([&] {
                reference_attend_sequences(std::span<const float>(q), G, views, P, opt, noise_key{13, 0, 0},
                                           std::span<const std::uint64_t>(ids), {}, std::span<const int>(hints),
                                           std::span<const group_history* const>(two));
              }),
              HasSubstr("level_hints and histories exclude each other"));
}

}  // namespace
