// thread_pool: every item runs exactly once, per-thread ids are in range, exceptions
// propagate, and concurrent certified calls on different heads agree with serial ones.
#include <certattn/attend.hpp>
#include <certattn/parallel.hpp>
#include <certattn/testing/synthetic.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>

namespace {
using namespace certattn;

TEST(ThreadPool, RunsEveryItemOnce) {
  thread_pool pool(3);
  std::vector<std::atomic<int>> hits(1000);
  for (int round = 0; round < 5; ++round)
    pool.parallel_for(hits.size(), [&](std::size_t i, std::size_t w) {
      ASSERT_LT(w, pool.size());
      ++hits[i];
    });
  for (auto& h : hits) EXPECT_EQ(h.load(), 5);
}

TEST(ThreadPool, PropagatesExceptions) {
  thread_pool pool(2);
  EXPECT_THROW(pool.parallel_for(10, [](std::size_t i, std::size_t) {
    if (i == 7) throw error("boom");
  }), error);
  std::atomic<int> count{0};  // the items run on several threads at once
  pool.parallel_for(3, [&](std::size_t, std::size_t) { ++count; });  // still usable
  EXPECT_EQ(count.load(), 3);
}

TEST(ThreadPool, ConcurrentHeadsMatchSerial) {
  const std::size_t n = 6000, d = 64, G = 4, H = 4;
  synthetic::cache_config cfg;
  cfg.n_tokens = n;
  cfg.head_dim = d;
  cfg.kv_heads = H;
  const auto cache = synthetic::make_cache(cfg);
  std::vector<key_index> idx;
  std::vector<strided_kv<half>> views;
  for (std::size_t h = 0; h < H; ++h) {
    views.push_back(hnd_view(cache.keys.data(), cache.values.data(), n, n, H, d, h));
    idx.emplace_back(d);
    idx.back().build(views.back());
  }
  options opt;
  std::vector<std::vector<float>> q(H), serial(H, std::vector<float>(G * d)),
      parallel(H, std::vector<float>(G * d));
  for (std::size_t h = 0; h < H; ++h) q[h] = synthetic::make_queries(cache, h, G, 9);
  std::vector<certificate> certs(G);
  attend_workspace ws0(G, d, n);
  for (std::size_t h = 0; h < H; ++h)
    attend_group(std::span<const float>(q[h]), G, views[h], idx[h], {9, 0, std::uint32_t(h)}, opt,
                 std::span<float>(serial[h]), std::span<certificate>(certs), ws0);
  thread_pool pool(2);
  std::vector<attend_workspace> ws;
  for (std::size_t w = 0; w < pool.size(); ++w) ws.emplace_back(G, d, n);
  std::vector<std::vector<certificate>> pc(H, std::vector<certificate>(G));
  pool.parallel_for(H, [&](std::size_t h, std::size_t w) {
    attend_group(std::span<const float>(q[h]), G, views[h], idx[h], {9, 0, std::uint32_t(h)}, opt,
                 std::span<float>(parallel[h]), std::span<certificate>(pc[h]), ws[w]);
  });
  for (std::size_t h = 0; h < H; ++h)
    EXPECT_EQ(0, std::memcmp(serial[h].data(), parallel[h].data(), G * d * sizeof(float)));
}

}  // namespace
