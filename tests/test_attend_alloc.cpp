// A steady-state certified call allocates nothing: the workspace is the caller's. Nor do
// the key index's build, appends and refreshes within its reserved size.
// This file replaces the global operator new to count allocations, so it is its own
// test executable.
#include <certattn/attend.hpp>
#include <certattn/testing/synthetic.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "support/count_allocations.hpp"

namespace {
using namespace certattn;

// One KV head of a synthetic cache, and its token-major view.
synthetic::kv_cache one_head(std::size_t n, std::size_t d, synthetic::regime r) {
  synthetic::cache_config cfg;
  cfg.n_tokens = n;
  cfg.head_dim = d;
  cfg.kind = r;
  return synthetic::make_cache(cfg);
}
strided_kv<half> view_of(const synthetic::kv_cache& c) {
  const std::size_t n = c.config.n_tokens, d = c.config.head_dim;
  return strided_kv<half>(c.key_row(0, 0), c.value_row(0, 0), n, d, d, d);
}

TEST(AttendAllocation, SteadyStateCallsDoNotAllocate) {
  const std::size_t n = 20000, d = 128, G = 4;
  // Without routing (every path of the level loop), and with a group_history (heads over
  // budget, then groups routed to the dense kernel and probes): routed on the measured
  // costs (the dense probe, timed calls; which calls are routed depends on the machine's
  // load) and on the model's prediction (deterministic: a flat group is routed).
  struct setting {
    routing route;
    bool measured;
  };
  for (setting set : {setting{routing::kOff, true}, setting{routing::kAuto, true},
                      setting{routing::kAuto, false}})
  for (synthetic::regime r : {synthetic::regime::kMixed, synthetic::regime::kUniform,
                              synthetic::regime::kExtreme}) {
    const routing route = set.route;
    const auto cache = one_head(n, d, r);
    const strided_kv<half> kv = view_of(cache);
    key_index idx(d);
    idx.build(kv);
    attend_workspace ws(G, d, n);
    group_history history(G);
    std::vector<float> out(G * d);
    std::vector<certificate> certs(G);
    options opt;
    opt.route = route;
    opt.cost.measured = set.measured;
    std::vector<std::vector<float>> queries;
    for (std::uint64_t s = 0; s < 12; ++s) queries.push_back(synthetic::make_queries(cache, 0, G, s));
    // Also force the exact fallback once: max_levels 0 rarely certifies.
    options strict = opt;
    strict.max_levels = 0;
    strict.epsilon = 1e-6;
    auto call = [&](std::uint64_t s, const options& o) {
      if (route == routing::kAuto)
        attend_group(std::span<const float>(queries[s]), G, kv, idx, {s, 0, 0}, o,
                     std::span<float>(out), std::span<certificate>(certs), ws, history);
      else
        attend_group(std::span<const float>(queries[s]), G, kv, idx, {s, 0, 0}, o,
                     std::span<float>(out), std::span<certificate>(certs), ws);
    };
    call(0, opt);  // warm-up
    // A routed call at the smallest epsilon: the float kernel's rounding bound misses it
    // and every head is answered again on the double path (rounding.hpp).
    options tiny = opt;
    tiny.epsilon = options::kMinEpsilon;
    const std::vector<int> none(G, -1);
    group_history forced(G);
    forced.record_sparse(5.0, none, noise_key{100, 0, 0});
    forced.record_sparse(5.0, none, noise_key{101, 0, 0});
    g_allocations = 0;
    g_counting = true;
    if (route == routing::kAuto) {
      attend_group(std::span<const float>(queries[1]), G, kv, idx, {102, 0, 0}, tiny,
                   std::span<float>(out), std::span<certificate>(certs), ws, forced);
      EXPECT_EQ(certs[0].path, answer_path::kRouted);
      EXPECT_GT(ws.last_stats().bytes_read, ws.last_stats().dense_bytes)
          << "the double path's extra pass is counted";
    }
    std::size_t routed = 0;
    for (std::uint64_t s = 1; s < 12; ++s) {
      ws.time_stages(s % 2 == 1);  // timed calls do not allocate either
      call(s, s == 5 ? strict : opt);
      routed += certs[0].path == answer_path::kRouted;
      if (s == 5 && route == routing::kOff) {
        EXPECT_TRUE(certs[0].exact) << "the strict call should have fallen back to exact";
      }
    }
    g_counting = false;
    EXPECT_EQ(g_allocations.load(), 0) << "regime " << synthetic::to_string(r) << ", routing "
                                       << to_string(route) << ", measured " << set.measured;
    // The last call (s = 11) was timed when the group was not routed; untimed calls leave
    // stage_seconds at 0.
    double timed = 0;
    for (double t : ws.last_stats().stage_seconds) timed += t;
    if (ws.last_stats().routed == 0) {
      EXPECT_GT(timed, 0.0);
    }
    ws.time_stages(false);
    call(0, opt);
    for (double t : ws.last_stats().stage_seconds) EXPECT_EQ(t, 0.0);
    if (route == routing::kAuto && !set.measured && r == synthetic::regime::kUniform) {
      EXPECT_GT(routed, 0u) << "a flat group should have been routed to the dense kernel";
    }
  }
}

// The variants (soft-cap, position bias, sinks, a sliding window) in steady state, on the
// sparse path and routed: their data is the caller's, their work the workspace's.
TEST(AttendAllocation, VariantCallsDoNotAllocate) {
  const std::size_t n = 12000, d = 64, G = 4;
  const auto cache = one_head(n, d, synthetic::regime::kMixed);
  const strided_kv<half> kv = view_of(cache);
  key_index idx(d);
  idx.build(kv);
  attend_workspace ws(G, d, n);
  std::vector<float> out(G * d);
  std::vector<certificate> certs(G);
  const std::vector<float> slopes = {0.01f, 0.001f, 0.0001f, 0.0f}, sinks = {1.0f, 2.0f, -1.0f, 0.0f};
  options opt;
  opt.variant.logit_softcap = 30.0;
  opt.variant.alibi_slopes = slopes;
  opt.variant.sinks = sinks;
  opt.variant.sliding_window = 5000;
  std::vector<std::vector<float>> queries;
  for (std::uint64_t s = 0; s < 8; ++s) queries.push_back(synthetic::make_queries(cache, 0, G, s));
  group_history history(G);
  const std::vector<int> none(G, -1);
  group_history routed(G);  // one that routes its next call
  routed.record_sparse(5.0, none, noise_key{100, 0, 0});
  routed.record_sparse(5.0, none, noise_key{101, 0, 0});
  attend_group(std::span<const float>(queries[0]), G, kv, idx, {0, 0, 0}, opt, std::span<float>(out),
               std::span<certificate>(certs), ws, history);  // warm-up
  g_allocations = 0;
  g_counting = true;
  for (std::uint64_t s = 1; s < 8; ++s)
    attend_group(std::span<const float>(queries[s]), G, kv, idx, {s, 0, 0}, opt, std::span<float>(out),
                 std::span<certificate>(certs), ws, history);
  attend_group(std::span<const float>(queries[1]), G, kv, idx, {102, 0, 0}, opt, std::span<float>(out),
               std::span<certificate>(certs), ws, routed);
  g_counting = false;
  EXPECT_EQ(certs[0].path, answer_path::kRouted);
  EXPECT_EQ(g_allocations.load(), 0);

  // A latent cache (values a prefix of the key rows) through the same workspace, and a
  // short sliding window read whole by the dense kernel.
  const latent_kv<half> latent(cache.key_row(0, 0), n, d, 48, d);
  key_index lidx(d);
  lidx.build(latent);
  std::vector<float> lout(G * 48);
  options short_window;
  short_window.variant.sliding_window = 300;
  attend_group(std::span<const float>(queries[0]), G, latent, lidx, {0, 0, 0}, options{}, std::span<float>(lout),
               std::span<certificate>(certs), ws);  // warm-up
  g_allocations = 0;
  g_counting = true;
  for (std::uint64_t s = 1; s < 4; ++s) {
    attend_group(std::span<const float>(queries[s]), G, latent, lidx, {s, 0, 0}, options{}, std::span<float>(lout),
                 std::span<certificate>(certs), ws);
    attend_group(std::span<const float>(queries[s]), G, kv, idx, {s, 1, 0}, short_window, std::span<float>(out),
                 std::span<certificate>(certs), ws);
  }
  g_counting = false;
  EXPECT_EQ(certs[0].path, answer_path::kNoPool);
  EXPECT_EQ(g_allocations.load(), 0);
}

// An engine reserves its index for the longest sequence: build, appends (one at a time or
// in chunks, across the value-bound refreshes at 600, 1200, 2400 and 4800 tokens), a
// rollback and an explicit refresh then never allocate.
TEST(IndexAllocation, BuildAppendTruncateAndRefreshWithinReserveDoNotAllocate) {
  const std::size_t n = 5000, n0 = 300, d = 128;
  const auto cache = one_head(n, d, synthetic::regime::kMixed);
  const strided_kv<half> kv = view_of(cache);
  key_index idx(d);
  idx.reserve(n);
  g_allocations = 0;
  g_counting = true;
  idx.build(kv.prefix(n0));
  for (std::size_t t = n0; t < 3000; ++t) idx.append(kv, t);
  idx.append_range(kv, 3000, n - 3000);
  idx.truncate(kv, n - 777);  // a rejected draft, rolled back, then other tokens
  idx.append_range(kv, n - 777, 777);
  idx.refresh(kv);
  g_counting = false;
  EXPECT_EQ(g_allocations.load(), 0);
  EXPECT_EQ(idx.size(), n);
}

TEST(AttendAllocation, CounterSeesAllocations) {
  // The counter works: a vector allocates.
  g_allocations = 0;
  g_counting = true;
  std::vector<int>* v = new std::vector<int>(100);
  g_counting = false;
  EXPECT_GE(g_allocations.load(), 2);
  delete v;
}

}  // namespace
