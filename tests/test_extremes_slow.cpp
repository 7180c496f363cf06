// A context of one million tokens (head_dim 128, fp16, G = 4): the index builds, appends
// cross the block boundary after it, the certified call matches the reference, and the
// process's resident memory for cache + index + workspace + calls stays within 1.5x of
// the cache and the index (measured from /proc/self/statm, printed for the record).
// Labelled `slow` (file name): the sanitize preset skips it.
#include <certattn/attend.hpp>
#include <certattn/reference.hpp>

#include "support/harness.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <unistd.h>
#include <vector>

namespace {

using namespace certattn;

/// Resident set size in bytes (second field of /proc/self/statm, in pages).
std::size_t resident_bytes() {
  std::ifstream f("/proc/self/statm");
  std::size_t total = 0, resident = 0;
  f >> total >> resident;
  return resident * std::size_t(sysconf(_SC_PAGESIZE));
}

double mib(std::size_t b) { return double(b) / (1024.0 * 1024.0); }

TEST(ExtremesSlow, MillionTokenContextMemoryAndExactness) {
  if (resident_bytes() == 0) GTEST_SKIP() << "/proc/self/statm is not available";
  const std::size_t n = std::size_t(1) << 20, extra = 200, cap = n + extra, d = 128, G = 4;
  const std::size_t rss0 = resident_bytes();

  // The engine's cache (head-major, room for the appended tokens), filled with a cheap
  // generator: uniform keys with a few structured channels, uniform values.
  std::vector<half> keys(cap * d), values(cap * d);
  std::uint64_t state = 12345;
  auto next = [&state] {
    state += 0x9e3779b97f4a7c15ULL;
    std::uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  for (std::size_t t = 0; t < cap; ++t)
    for (std::size_t i = 0; i < d; i += 4) {
      const std::uint64_t r = next();
      for (std::size_t j = 0; j < 4; ++j) {
        const float u = float((r >> (16 * j)) & 0xFFFF) / 65535.0f * 2.0f - 1.0f;
        keys[t * d + i + j] = half(u * (i < 8 ? 2.5f : 1.0f));
        values[t * d + i + j] = half(u * 0.7f + (j == 0 ? 0.3f : 0.0f));
      }
    }
  const std::size_t rss_cache = resident_bytes();
  const std::size_t kv_bytes = 2 * cap * d * sizeof(half);

  key_index idx(d);
  const strided_kv<half> full(keys.data(), values.data(), cap, d, d, d);
  idx.build(full.prefix(n));
  for (std::size_t t = n; t < cap; ++t) idx.append(full, t);  // crosses a block boundary
  ASSERT_EQ(idx.size(), cap);
  const std::size_t rss_index = resident_bytes();

  attend_workspace ws(G, d, cap);
  std::vector<float> q(G * d), out(G * d);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = float(3.0 * test::gauss(7, i));
  std::vector<certificate> certs(G);
  options opt;
  for (std::uint64_t step = 0; step < 4; ++step)
    attend_group(std::span<const float>(q), G, full, idx, noise_key{step, 0, 0}, opt,
                 std::span<float>(out), std::span<certificate>(certs), ws);
  const std::size_t rss_call = resident_bytes();

  const std::size_t index_bytes = idx.memory_bytes();
  std::printf("[ memory ] %zu tokens, head_dim %zu, fp16, G %zu\n", cap, d, G);
  std::printf("[ memory ] KV cache %.1f MiB (RSS +%.1f MiB)\n", mib(kv_bytes), mib(rss_cache - rss0));
  std::printf("[ memory ] index %.1f MiB = %.3f x KV (RSS +%.1f MiB)\n", mib(index_bytes),
              double(index_bytes) / double(kv_bytes), mib(rss_index - rss_cache));
  std::printf("[ memory ] workspace + %d calls: RSS +%.1f MiB\n", 4, mib(rss_call - rss_index));
  std::printf("[ memory ] total RSS +%.1f MiB = %.3f x (KV + index)\n", mib(rss_call - rss0),
              double(rss_call - rss0) / double(kv_bytes + index_bytes));
  EXPECT_LE(double(rss_call - rss0), 1.5 * double(kv_bytes + index_bytes));
  // The index holds no hidden capacity beyond what it reports (within 10%).
  EXPECT_LE(double(rss_index - rss_cache), 1.1 * double(index_bytes) + 4e6);

  for (const certificate& c : certs) EXPECT_TRUE(test::certificate_finite(c));
  // The last call against the reference, for every head of the group.
  test::group_run run;
  run.out = out;
  run.certs = certs;
  run.stats = ws.last_stats();
  ws.record_samples(true);
  attend_group(std::span<const float>(q), G, full, idx, noise_key{3, 0, 0}, opt,
               std::span<float>(run.out), std::span<certificate>(run.certs), ws);
  run.stats = ws.last_stats();
  for (std::size_t g = 0; g < G; ++g) {
    const auto s = ws.samples(g);
    run.samples.emplace_back(s.begin(), s.end());
  }
  std::printf("[ memory ] certified levels %d %d %d %d, keys read %zu of %zu\n", certs[0].level,
              certs[1].level, certs[2].level, certs[3].level, run.stats.keys_read, G * cap);
  EXPECT_EQ(test::compare_with_reference(make_matrix_view(keys.data(), cap, d),
                                         make_matrix_view(values.data(), cap, d), idx, q, G, opt,
                                         noise_key{3, 0, 0}, run),
            "");
}

}  // namespace
