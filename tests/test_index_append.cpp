// The key index's engine-facing growth: append_range() builds the same index as appends
// one token at a time, and under refresh_policy::kManual appends keep the value bounds
// until refresh(), which then gives the bounds build() gives on the same tokens.
#include <certattn/attend.hpp>
#include <certattn/index.hpp>
#include <certattn/testing/synthetic.hpp>

#include "support/harness.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace {

using namespace certattn;

struct fixture {
  std::size_t n = 3000, d = 64;
  synthetic::kv_cache cache;
  fixture() {
    synthetic::cache_config cfg;
    cfg.n_tokens = n;
    cfg.head_dim = d;
    cfg.kind = synthetic::regime::kMixed;
    cache = synthetic::make_cache(cfg);
  }
  strided_kv<half> view() const {
    return strided_kv<half>(cache.key_row(0, 0), cache.value_row(0, 0), n, d, d, d);
  }
};

// The key codes of two indexes, bit for bit: 4-bit codes, scales, residual bytes and 8-bit
// rows of every block (padding included).
void expect_same_codes(const key_index& a, const key_index& b) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.blocks(), b.blocks());
  const std::size_t dp = a.padded_dim(), bt = key_index::kBlockTokens;
  for (std::size_t blk = 0; blk < a.blocks(); ++blk) {
    ASSERT_EQ(std::memcmp(a.block_codes4(blk), b.block_codes4(blk), a.block_code4_bytes()), 0) << blk;
    ASSERT_EQ(std::memcmp(a.block_lo(blk), b.block_lo(blk), key_index::kScaleRows * dp * sizeof(float)), 0) << blk;
    ASSERT_EQ(std::memcmp(a.block_rho(blk), b.block_rho(blk), bt), 0) << blk;
    ASSERT_EQ(std::memcmp(a.codes8_low(blk * bt), b.codes8_low(blk * bt), bt * a.low8_bytes()), 0) << blk;
  }
}

// Everything a certified call reads from the index, compared bit for bit.
void expect_same_index(const key_index& a, const key_index& b, std::size_t n) {
  expect_same_codes(a, b);
  for (std::size_t t = 0; t < n; ++t) {
    ASSERT_EQ(a.value_distance(t), b.value_distance(t)) << t;
    ASSERT_EQ(a.sampling_offsets_upper()[t], b.sampling_offsets_upper()[t]) << t;
  }
  const auto ca = a.value_center(), cb = b.value_center();
  ASSERT_TRUE(std::equal(ca.begin(), ca.end(), cb.begin(), cb.end()));
  EXPECT_EQ(a.value_cap(), b.value_cap());
  EXPECT_EQ(a.reach_floor(), b.reach_floor());
  const auto xa = a.exact_tokens(), xb = b.exact_tokens();
  EXPECT_TRUE(std::equal(xa.begin(), xa.end(), xb.begin(), xb.end()));
  EXPECT_EQ(a.value_distance_max(n), b.value_distance_max(n));
}

TEST(IndexAppend, RangeEqualsOneByOne) {
  const fixture f;
  const auto kv = f.view();
  for (std::size_t n0 : {1ul, 100ul, 128ul, 700ul}) {
    SCOPED_TRACE("built on " + std::to_string(n0));
    key_index one(f.d), range(f.d);
    one.build(kv.prefix(n0));
    range.build(kv.prefix(n0));
    for (std::size_t t = n0; t < f.n; ++t) one.append(kv, t);
    // Chunks of uneven sizes, as chunked prefill and accepted drafts come.
    std::size_t t = n0, chunk = 1;
    while (t < f.n) {
      const std::size_t c = std::min(chunk, f.n - t);
      range.append_range(kv, t, c);
      t += c;
      chunk = chunk * 3 % 257 + 1;
    }
    expect_same_index(one, range, f.n);
  }
}

TEST(IndexAppend, RangeChecksItsArguments) {
  const fixture f;
  const auto kv = f.view();
  key_index idx(f.d);
  idx.build(kv.prefix(100));
  EXPECT_THROW(idx.append_range(kv, 99, 2), error);     // not at the end of the index
  EXPECT_THROW(idx.append_range(kv, 100, f.n), error);  // beyond the cache
  idx.append_range(kv, 100, 0);                         // nothing to do
  EXPECT_EQ(idx.size(), 100u);
}

TEST(IndexAppend, ManualRefreshKeepsTheBoundsUntilRefresh) {
  const fixture f;
  const auto kv = f.view();
  key_index manual(f.d);
  manual.set_refresh_policy(key_index::refresh_policy::kManual);
  manual.build(kv.prefix(300));
  const std::vector<float> center0(manual.value_center().begin(), manual.value_center().end());
  const float floor0 = manual.reach_floor();
  manual.append_range(kv, 300, f.n - 300);  // past 600, 1200 and 2400 tokens
  EXPECT_TRUE(std::equal(center0.begin(), center0.end(), manual.value_center().begin()));
  EXPECT_EQ(manual.reach_floor(), floor0);
  // The default policy refreshed along the way: its centre differs.
  key_index automatic(f.d);
  automatic.build(kv.prefix(300));
  automatic.append_range(kv, 300, f.n - 300);
  EXPECT_FALSE(std::equal(center0.begin(), center0.end(), automatic.value_center().begin()));
  // refresh() gives the bounds build() computes on the same tokens.
  manual.refresh(kv);
  key_index built(f.d);
  built.build(kv);
  const auto cm = manual.value_center(), cb = built.value_center();
  EXPECT_TRUE(std::equal(cm.begin(), cm.end(), cb.begin(), cb.end()));
  EXPECT_EQ(manual.value_cap(), built.value_cap());
  EXPECT_EQ(manual.reach_floor(), built.reach_floor());
  for (std::size_t t = 0; t < f.n; ++t) ASSERT_EQ(manual.value_distance(t), built.value_distance(t));
  EXPECT_THROW(key_index(f.d).refresh(kv), error);  // not built yet
}

// Rollback: truncate(n) gives the key codes of build() on the first n tokens, whatever the
// index went through before (a build, appends across blocks and refreshes), keeps its
// value bounds, and the index then grows again as usual.
TEST(IndexTruncate, GivesTheCodesOfABuildOnThePrefix) {
  const fixture f;
  const auto kv = f.view();
  for (std::size_t n : {0ul, 1ul, 127ul, 128ul, 129ul, 1000ul, 2047ul, 2999ul}) {
    SCOPED_TRACE("truncate to " + std::to_string(n));
    key_index idx(f.d);
    idx.build(kv.prefix(200));
    idx.append_range(kv, 200, f.n - 200);
    const std::vector<float> center(idx.value_center().begin(), idx.value_center().end());
    const float cap = idx.value_cap(), floor = idx.reach_floor();
    idx.truncate(kv, n);
    key_index built(f.d);
    built.build(kv.prefix(n));
    expect_same_codes(idx, built);
    // The value bounds stay: the distances are still those to the same centre.
    EXPECT_TRUE(std::equal(center.begin(), center.end(), idx.value_center().begin()));
    EXPECT_EQ(idx.value_cap(), cap);
    EXPECT_EQ(idx.reach_floor(), floor);
    for (std::uint32_t t : idx.exact_tokens()) EXPECT_LT(t, n);
    // Growing again gives the codes of the same build grown the same way.
    idx.append_range(kv, n, f.n - n);
    built.append_range(kv, n, f.n - n);
    expect_same_codes(idx, built);
  }
}

// After a rollback the certified call still computes what the reference computes with
// the index's bounds (both certificates).
TEST(IndexTruncate, CallsAfterARollbackEqualTheReference) {
  const fixture f;
  const auto kv = f.view();
  key_index idx(f.d);
  idx.build(kv.prefix(1000));
  idx.append_range(kv, 1000, f.n - 1000);
  idx.truncate(kv, 2345);
  const auto kv_n = kv.prefix(2345);
  for (certificate_kind kind : {certificate_kind::kTight, certificate_kind::kClassic}) {
    options opt;
    opt.certificate = kind;
    const std::vector<float> q = synthetic::make_queries(f.cache, 0, 4, 9);
    const noise_key nk{9, 0, 0};
    const test::group_run run = test::run_group(kv_n, idx, q, 4, opt, nk);
    const std::vector<half> keys(f.cache.key_row(0, 0), f.cache.key_row(0, 0) + 2345 * f.d);
    const std::vector<half> values(f.cache.value_row(0, 0), f.cache.value_row(0, 0) + 2345 * f.d);
    EXPECT_EQ(test::compare_with_reference(make_matrix_view(keys.data(), 2345, f.d),
                                           make_matrix_view(values.data(), 2345, f.d), idx, q, 4,
                                           opt, nk, run),
              "")
        << to_string(kind);
  }
}

TEST(IndexTruncate, ChecksItsArguments) {
  const fixture f;
  const auto kv = f.view();
  key_index idx(f.d);
  EXPECT_THROW(idx.truncate(kv, 0), error);  // not built
  idx.build(kv.prefix(500));
  EXPECT_THROW(idx.truncate(kv, 501), error);
  EXPECT_THROW(idx.truncate(kv.prefix(100), 200), error);
  idx.truncate(kv, 500);  // nothing to do
  EXPECT_EQ(idx.size(), 500u);
}

}  // namespace
