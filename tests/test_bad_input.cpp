// Bad caller input raises certattn::error whose message names the offending argument, from
// every entry point of the foundation (validate, reference_attend, exact_attention); nothing
// crashes, nothing else is thrown, and legal edge cases (a pool-less cache, window 0, huge
// finite inputs) work.
#include <certattn/certattn.hpp>
#include <certattn/reference.hpp>
#include <certattn/exact.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace {

using namespace certattn;
using ::testing::HasSubstr;

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

/// The message of the certattn::error that f throws; a marker string otherwise, so that a
/// missing throw or a different exception type fails the HasSubstr check visibly.
std::string error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const certattn::error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<not a certattn::error: ") + e.what() + ">";
  } catch (...) {
    return "<unknown exception>";
  }
  return "<no exception>";
}

struct cache {
  std::size_t n, d;
  std::vector<half> keys, values;
  std::vector<float> q;
  explicit cache(std::size_t n_, std::size_t d_ = 8) : n(n_), d(d_), keys(n_ * d_), values(n_ * d_), q(d_) {
    for (std::size_t i = 0; i < n * d; ++i) {
      keys[i] = half(float(std::sin(0.37 * double(i))));
      values[i] = half(float(std::cos(0.91 * double(i))));
    }
    for (std::size_t i = 0; i < d; ++i) q[i] = float(0.5 + 0.1 * double(i));
  }
  matrix_view<half> kv() const { return make_matrix_view(keys.data(), n, d); }
  matrix_view<half> vv() const { return make_matrix_view(values.data(), n, d); }
  reference_result run(const options& opt) const {
    return reference_attend(std::span<const float>(q), kv(), vv(), opt, noise_key{});
  }
};

TEST(BadInput, OptionsEpsilon) {
  const cache c(256);
  for (double eps : {0.0, -0.0, -0.1, kNaN, kInf, -kInf}) {
    options opt;
    opt.epsilon = eps;
    EXPECT_THAT(error_message([&] { validate(opt); }), HasSubstr("epsilon")) << eps;
    EXPECT_THAT(error_message([&] { c.run(opt); }), HasSubstr("epsilon")) << eps;
  }
}

TEST(BadInput, OptionsDelta) {
  const cache c(256);
  for (double delta : {0.0, 1.0, -0.5, 1.5, kNaN, kInf, -kInf}) {
    options opt;
    opt.delta = delta;
    EXPECT_THAT(error_message([&] { validate(opt); }), HasSubstr("delta")) << delta;
    EXPECT_THAT(error_message([&] { c.run(opt); }), HasSubstr("delta")) << delta;
  }
}

TEST(BadInput, OtherOptions) {
  const cache c(256);
  {
    options opt;
    opt.grid_ratio = 0;
    EXPECT_THAT(error_message([&] { c.run(opt); }), HasSubstr("grid_ratio"));
    opt.grid_ratio = -3;
    EXPECT_THAT(error_message([&] { c.run(opt); }), HasSubstr("grid_ratio"));
  }
  {
    options opt;
    opt.max_levels = -1;
    EXPECT_THAT(error_message([&] { c.run(opt); }), HasSubstr("max_levels"));
  }
  for (double s : {-1.0, kNaN, kInf}) {
    options opt;
    opt.softmax_scale = s;
    EXPECT_THAT(error_message([&] { c.run(opt); }), HasSubstr("softmax_scale")) << s;
  }
  {
    options opt;
    opt.scale = static_cast<error_scale>(42);
    EXPECT_THAT(error_message([&] { c.run(opt); }), HasSubstr("scale"));
  }
  EXPECT_THAT(error_message([] { error_scale_from_string("bogus"); }), HasSubstr("error_scale"));
  EXPECT_EQ(error_scale_from_string("value"), error_scale::kValueScale);
}

TEST(BadInput, HeadDimZero) {
  const std::vector<half> none;
  const std::vector<float> q;
  const auto kv = make_matrix_view(none.data(), 100, 0);
  EXPECT_THAT(error_message([&] {
                reference_attend(std::span<const float>(q), kv, kv, options{}, noise_key{});
              }),
              HasSubstr("head_dim"));
  EXPECT_THAT(error_message([&] { exact_attention(std::span<const float>(q), kv, kv); }),
              HasSubstr("head_dim"));
}

// An engine's indices are size_t or int: noise_key takes any integer type, and refuses
// values its fields cannot hold instead of narrowing them silently.
TEST(BadInput, NoiseKeyFromEngineIndices) {
  const std::size_t step = 7, layer = 31, head = 7;
  const noise_key nk{step, layer, head};
  EXPECT_EQ(nk.step, 7u);
  EXPECT_EQ(nk.layer, 31u);
  EXPECT_EQ(nk.kv_head, 7u);
  const int l = -1;
  EXPECT_THAT(error_message([&] { noise_key{0, l, 0}; }), HasSubstr("noise_key.layer = -1"));
  const std::uint64_t big = std::uint64_t(1) << 32;
  EXPECT_THAT(error_message([&] { noise_key{0, 0, big}; }), HasSubstr("noise_key.kv_head"));
  EXPECT_THAT(error_message([&] { noise_key{-5, 0, 0}; }), HasSubstr("noise_key.step = -5"));
}

TEST(BadInput, EmptyCache) {
  const cache c(1);
  const auto empty = make_matrix_view(c.keys.data(), 0, c.d);
  options opt;
  opt.window = 0;  // even without a window an empty cache is an error
  for (const options& o : {options{}, opt}) {
    const std::string m = error_message([&] {
      reference_attend(std::span<const float>(c.q), empty, empty, o, noise_key{});
    });
    EXPECT_THAT(m, HasSubstr("n_tokens"));
    EXPECT_THAT(m, HasSubstr("empty"));
  }
  EXPECT_THAT(error_message([&] { exact_attention(std::span<const float>(c.q), empty, empty); }),
              HasSubstr("empty"));
}

TEST(BadInput, CacheShorterThanWindow) {
  // Shorter than the window (64): no pool, exact attention, certified as such.
  const cache c(63);
  const reference_result short_run = c.run(options{});
  EXPECT_TRUE(short_run.cert.exact);
  EXPECT_TRUE(short_run.cert.certified);
  EXPECT_EQ(short_run.cert.keys_read, 63u);
  // Exactly the window: the pool is empty, the output is exact and trivially certified.
  const cache w(64);
  const reference_result r = w.run(options{});
  EXPECT_TRUE(r.cert.exact);
  EXPECT_TRUE(r.cert.certified);
  const exact_result ex = exact_attention(std::span<const float>(w.q), w.kv(), w.vv());
  for (std::size_t i = 0; i < w.d; ++i) EXPECT_NEAR(r.output[i], ex.output[i], 1e-12);
}

TEST(BadInput, NonFiniteQuery) {
  for (double bad : {kNaN, kInf, -kInf}) {
    cache c(256);
    c.q[3] = float(bad);
    EXPECT_THAT(error_message([&] { c.run(options{}); }), HasSubstr("q contains")) << bad;
    EXPECT_THAT(error_message([&] { exact_attention(std::span<const float>(c.q), c.kv(), c.vv()); }),
                HasSubstr("q contains"));
  }
}

TEST(BadInput, NonFiniteKeysOrValues) {
  for (double bad : {kNaN, kInf, -kInf}) {
    for (std::size_t token : {0ul, 100ul, 255ul}) {  // pool, pool, window
      {
        cache c(256);
        c.keys[token * c.d + 5] = half(float(bad));
        EXPECT_THAT(error_message([&] { c.run(options{}); }), HasSubstr("keys"))
            << bad << " at token " << token;
      }
      {
        cache c(256);
        c.values[token * c.d + 1] = half(float(bad));
        EXPECT_THAT(error_message([&] { c.run(options{}); }), HasSubstr("values"))
            << bad << " at token " << token;
        EXPECT_THAT(error_message([&] {
                      exact_attention(std::span<const float>(c.q), c.kv(), c.vv());
                    }),
                    HasSubstr("values"));
      }
    }
  }
}

TEST(BadInput, MismatchedSizes) {
  const cache c(256);
  {  // q longer than head_dim
    std::vector<float> q(c.d + 1, 0.1f);
    EXPECT_THAT(error_message([&] {
                  reference_attend(std::span<const float>(q), c.kv(), c.vv(), options{}, noise_key{});
                }),
                HasSubstr("q has"));
  }
  {  // values with fewer rows
    const auto vv = make_matrix_view(c.values.data(), c.n - 1, c.d);
    EXPECT_THAT(error_message([&] {
                  reference_attend(std::span<const float>(c.q), c.kv(), vv, options{}, noise_key{});
                }),
                HasSubstr("values.rows"));
  }
  {  // values with more columns than the keys (fewer is a latent cache's, and allowed)
    const auto vv = make_matrix_view(c.values.data(), c.n / 2, c.d + 2);
    const auto kv = make_matrix_view(c.keys.data(), c.n / 2, c.d);
    EXPECT_THAT(error_message([&] {
                  reference_attend(std::span<const float>(c.q), kv, vv, options{}, noise_key{});
                }),
                HasSubstr("values.cols"));
  }
  {  // a value centre of the wrong size
    const std::vector<float> centre(c.d - 1, 0.0f);
    reference_extras ex;
    ex.value_center = centre;
    EXPECT_THAT(error_message([&] {
                  reference_attend(std::span<const float>(c.q), c.kv(), c.vv(), options{},
                                   noise_key{}, ex);
                }),
                HasSubstr("value_center"));
  }
  {  // null data
    const auto kv = make_matrix_view<half>(nullptr, c.n, c.d);
    EXPECT_THAT(error_message([&] {
                  reference_attend(std::span<const float>(c.q), kv, c.vv(), options{}, noise_key{});
                }),
                HasSubstr("null"));
  }
}

// Legal extremes must not crash or produce non-finite output: window 0, the largest fp16
// keys and values, a float query near its maximum (scores ~1e43, finite in double).
TEST(BadInput, LegalExtremesWork) {
  {
    cache c(300);
    options opt;
    opt.window = 0;
    const reference_result r = c.run(opt);
    for (double x : r.output) EXPECT_TRUE(std::isfinite(x));
  }
  {
    cache c(300);
    for (std::size_t i = 0; i < c.n * c.d; ++i) {
      c.keys[i] = half(i % 3 ? 65504.0f : -65504.0f);
      c.values[i] = half(i % 5 ? -65504.0f : 65504.0f);
    }
    for (auto& x : c.q) x = 3.0e38f;
    for (auto scale : {error_scale::kDenominator, error_scale::kOutputNorm, error_scale::kValueScale}) {
      options opt;
      opt.scale = scale;
      const reference_result r = c.run(opt);
      for (double x : r.output) EXPECT_TRUE(std::isfinite(x));
      EXPECT_TRUE(std::isfinite(r.max_score));
    }
  }
}

}  // namespace
