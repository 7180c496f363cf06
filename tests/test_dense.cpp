// The dense kernels (scalar, AVX2, AVX-512; fp16, bf16, fp32) against exact_attention in
// double, over head_dim, group size, context length and cache layout (HND, NHD, paged),
// plus the partial form, the all-heads NHD pass, extreme inputs and input validation.
#include <certattn/dense.hpp>
#include <certattn/rounding.hpp>
#include <certattn/exact.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <certattn/arch/macros.hpp>  // CERTATTN_X86 and the kernel attributes

namespace {

using certattn::bfloat16;
using certattn::half;
using certattn::isa;

// Restores the process-wide ISA cap when a test ends, whatever happens in it.
struct isa_scope {
  explicit isa_scope(isa a) { certattn::set_isa_cap(a); }
  ~isa_scope() { certattn::set_isa_cap(isa::kAvx512Vnni); }
};

bool supported(isa a) { return int(certattn::detected_isa()) >= int(a); }

// A cache of kv_heads heads, head-major [kv_heads][n][d] (HND) and the same data token-major
// [n][kv_heads][d] (NHD). Keys have a shared offset and a few outlier channels and values a
// non-zero mean, as in real caches; queries lean towards a few keys so softmax is peaked
// at some tokens, flat elsewhere.
template <class T>
struct test_cache {
  std::size_t n = 0, d = 0, heads = 0;
  std::vector<T> k_hnd, v_hnd, k_nhd, v_nhd;

  test_cache(std::size_t n_, std::size_t d_, std::size_t heads_, std::uint64_t seed)
      : n(n_),
        d(d_),
        heads(heads_),
        k_hnd(n * d * heads),
        v_hnd(n * d * heads),
        k_nhd(n * d * heads),
        v_nhd(n * d * heads) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> N(0.0f, 1.0f);
    for (std::size_t h = 0; h < heads; ++h) {
      std::vector<float> offset(d);
      for (std::size_t i = 0; i < d; ++i) offset[i] = 0.5f * N(rng) + (i % 17 == 3 ? 4.0f : 0.0f);
      for (std::size_t t = 0; t < n; ++t)
        for (std::size_t i = 0; i < d; ++i) {
          const T kx = T(offset[i] + N(rng));
          const T vx = T(0.3f + N(rng));
          k_hnd[(h * n + t) * d + i] = kx;
          v_hnd[(h * n + t) * d + i] = vx;
          k_nhd[(t * heads + h) * d + i] = kx;
          v_nhd[(t * heads + h) * d + i] = vx;
        }
    }
  }
  const T* key(std::size_t h, std::size_t t) const { return &k_hnd[(h * n + t) * d]; }
  const T* value(std::size_t h, std::size_t t) const { return &v_hnd[(h * n + t) * d]; }
  certattn::strided_kv<T> hnd(std::size_t h) const {
    return certattn::hnd_view(k_hnd.data(), v_hnd.data(), n, n, heads, d, h);
  }
  certattn::strided_kv<T> nhd(std::size_t h) const {
    return certattn::nhd_view(k_nhd.data(), v_nhd.data(), n, heads, d, h);
  }
};

// Queries: half of them close to a random key of the head (peaked softmax), the others
// generic.
template <class T>
std::vector<float> make_queries(const test_cache<T>& c, std::size_t h, std::size_t group,
                                std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> N(0.0f, 1.0f);
  std::vector<float> q(group * c.d);
  for (std::size_t g = 0; g < group; ++g) {
    const std::size_t t = rng() % c.n;
    for (std::size_t i = 0; i < c.d; ++i)
      q[g * c.d + i] =
          g % 2 == 0 ? 1.5f * certattn::to_float(c.key(h, t)[i]) + 0.5f * N(rng) : N(rng);
  }
  return q;
}

// Exact attention of each query over tokens [begin, end) of head h, in double.
template <class T>
std::vector<certattn::exact_result> reference(const test_cache<T>& c, std::size_t h,
                                              std::span<const float> q, std::size_t group,
                                              double scale, std::size_t begin, std::size_t end) {
  const auto K = certattn::make_matrix_view(c.key(h, begin), end - begin, c.d);
  const auto V = certattn::make_matrix_view(c.value(h, begin), end - begin, c.d);
  std::vector<certattn::exact_result> r;
  for (std::size_t g = 0; g < group; ++g)
    r.push_back(certattn::exact_attention(q.subspan(g * c.d, c.d), K, V, scale));
  return r;
}

// max over queries of ||o - e|| / ||e|| (or ||o - e|| when e = 0).
double rel_error(std::span<const float> out, const std::vector<certattn::exact_result>& ref,
                 std::size_t d) {
  double worst = 0.0;
  for (std::size_t g = 0; g < ref.size(); ++g) {
    double err = 0.0;
    for (std::size_t i = 0; i < d; ++i) {
      const double e = double(out[g * d + i]) - ref[g].output[i];
      err += e * e;
    }
    err = std::sqrt(err);
    worst = std::max(worst, ref[g].output_norm > 0 ? err / ref[g].output_norm : err);
  }
  return worst;
}

// A paged copy of head h: pages of `page` tokens in FlashInfer's HND page layout
// [page][kv_heads][page][d] with pages stored in shuffled order.
template <class T>
struct paged_copy {
  std::vector<T> k, v;
  std::vector<std::int32_t> table;
  certattn::paged_kv<T> view;
  paged_copy(const test_cache<T>& c, std::size_t h, std::size_t page, std::uint64_t seed) {
    const std::size_t pages = (c.n + page - 1) / page, page_stride = c.heads * page * c.d;
    table.resize(pages);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937_64(seed));
    k.assign(pages * page_stride, T(0.0f));
    v.assign(pages * page_stride, T(0.0f));
    for (std::size_t t = 0; t < c.n; ++t) {
      const std::size_t off =
          std::size_t(table[t / page]) * page_stride + h * page * c.d + (t % page) * c.d;
      std::copy_n(c.key(h, t), c.d, k.begin() + off);
      std::copy_n(c.value(h, t), c.d, v.begin() + off);
    }
    view = certattn::paged_kv<T>(k.data(), v.data(), table, c.n, page, c.d, page_stride, c.d,
                                 h * page * c.d);
  }
};

template <class T>
double tolerance() {
  // fp32 scores and accumulation; the inputs are exact in all three types.
  return 1e-5;
}

using shape = std::tuple<isa, int /*type*/, std::size_t /*d*/, std::size_t /*G*/>;

class DenseShapes : public ::testing::TestWithParam<shape> {};

template <class T>
void run_shapes(isa a, std::size_t d, std::size_t G) {
  isa_scope scope(a);
  for (std::size_t n : {std::size_t(1), std::size_t(5), std::size_t(16), std::size_t(63),
                        std::size_t(64), std::size_t(65), std::size_t(300), std::size_t(2500)}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    const test_cache<T> c(n, d, 2, n * 31 + d + G);
    const std::size_t h = 1;
    const std::vector<float> q = make_queries(c, h, G, n + 7);
    const float scale = float(1.0 / std::sqrt(double(d)));
    const auto ref = reference(c, h, q, G, scale, 0, n);
    certattn::dense_workspace ws(G, d);
    std::vector<float> out(G * d, -1.0f);

    certattn::dense_attend(q, G, c.hnd(h), scale, out, ws);
    EXPECT_LT(rel_error(out, ref, d), tolerance<T>()) << "HND";

    certattn::dense_attend(q, G, c.nhd(h), scale, out, ws);
    EXPECT_LT(rel_error(out, ref, d), tolerance<T>()) << "NHD";

    const paged_copy<T> p(c, h, 16, n);
    certattn::dense_attend(q, G, p.view, scale, out, ws);
    EXPECT_LT(rel_error(out, ref, d), tolerance<T>()) << "paged";

    // Scale 0 means 1/sqrt(head_dim).
    certattn::dense_attend(q, G, c.hnd(h), 0.0f, out, ws);
    EXPECT_LT(rel_error(out, ref, d), tolerance<T>()) << "default scale";

    if (n >= 5) {  // a sub-range, with its partial state
      const std::size_t b = n / 5, e = n - n / 4;
      const auto ref_sub = reference(c, h, q, G, scale, b, e);
      certattn::dense_attend(q, G, c.hnd(h), scale, out, ws, b, e);
      EXPECT_LT(rel_error(out, ref_sub, d), tolerance<T>()) << "range";

      std::vector<float> m(G), l(G), acc(G * d);
      certattn::dense_partial(q, G, c.nhd(h), scale, b, e, m, l, acc, ws);
      for (std::size_t g = 0; g < G; ++g) {
        EXPECT_NEAR(m[g], ref_sub[g].max_score,
                    1e-5 * std::max(1.0, std::abs(ref_sub[g].max_score)));
        EXPECT_NEAR(l[g], ref_sub[g].denominator, 2e-5 * ref_sub[g].denominator);
        for (std::size_t i = 0; i < d; ++i) acc[g * d + i] /= l[g];
      }
      EXPECT_LT(rel_error(acc, ref_sub, d), tolerance<T>()) << "partial";
    }
  }
}

TEST_P(DenseShapes, MatchesExact) {
  const auto [a, type, d, G] = GetParam();
  if (!supported(a)) GTEST_SKIP() << "CPU lacks " << certattn::to_string(a);
  switch (type) {
    case 0:
      run_shapes<half>(a, d, G);
      break;
    case 1:
      run_shapes<bfloat16>(a, d, G);
      break;
    default:
      run_shapes<float>(a, d, G);
      break;
  }
}

std::string shape_name(const ::testing::TestParamInfo<shape>& info) {
  const auto [a, type, d, G] = info.param;
  static const char* types[] = {"fp16", "bf16", "fp32"};
  return std::string(certattn::to_string(a)) + "_" + types[type] + "_d" + std::to_string(d) + "_G" +
         std::to_string(G);
}

INSTANTIATE_TEST_SUITE_P(
    All, DenseShapes,
    ::testing::Combine(::testing::Values(isa::kScalar, isa::kAvx2, isa::kAvx512Vnni),
                       ::testing::Values(0, 1, 2),
                       ::testing::Values(std::size_t(64), std::size_t(128), std::size_t(256),
                                         std::size_t(72), std::size_t(80), std::size_t(8)),
                       ::testing::Values(std::size_t(1), std::size_t(2), std::size_t(4),
                                         std::size_t(5), std::size_t(7), std::size_t(8))),
    shape_name);

// Long contexts: the fp32 accumulation over ~20K tokens stays at ~1e-6 thanks to the
// per-chunk partial sums.
class DenseLong : public ::testing::TestWithParam<isa> {};

TEST_P(DenseLong, TwentyThousandTokens) {
  const isa a = GetParam();
  if (!supported(a)) GTEST_SKIP() << "CPU lacks " << certattn::to_string(a);
  isa_scope scope(a);
  const std::size_t n = 20000, d = 128;
  const test_cache<half> c(n, d, 1, 5);
  for (std::size_t G : {std::size_t(1), std::size_t(4), std::size_t(8)}) {
    const std::vector<float> q = make_queries(c, 0, G, G);
    const float scale = float(1.0 / std::sqrt(double(d)));
    const auto ref = reference(c, 0, q, G, scale, 0, n);
    certattn::dense_workspace ws(G, d);
    std::vector<float> out(G * d);
    certattn::dense_attend(q, G, c.hnd(0), scale, out, ws);
    const double err = rel_error(out, ref, d);
    EXPECT_LT(err, 1e-5) << "G = " << G;
    std::printf("[ %s ] n = %zu, G = %zu: relative error %.2e\n",
                std::string(certattn::to_string(a)).c_str(), n, G, err);
  }
}

INSTANTIATE_TEST_SUITE_P(All, DenseLong,
                         ::testing::Values(isa::kScalar, isa::kAvx2, isa::kAvx512Vnni),
                         [](const auto& info) {
                           return std::string(certattn::to_string(info.param));
                         });

// The one-pass NHD layer call equals per-head attention.
class DenseLayer : public ::testing::TestWithParam<isa> {};

TEST_P(DenseLayer, AllHeadsMatchExact) {
  const isa a = GetParam();
  if (!supported(a)) GTEST_SKIP() << "CPU lacks " << certattn::to_string(a);
  isa_scope scope(a);
  for (auto [n, d, H, G] :
       {std::tuple<std::size_t, std::size_t, std::size_t, std::size_t>{1000, 128, 8, 4},
        {77, 80, 3, 7},
        {1, 64, 2, 1}}) {
    const test_cache<bfloat16> c(n, d, H, n + H);
    std::vector<float> q;
    for (std::size_t h = 0; h < H; ++h) {
      const auto qh = make_queries(c, h, G, h);
      q.insert(q.end(), qh.begin(), qh.end());
    }
    const float scale = float(1.0 / std::sqrt(double(d)));
    certattn::dense_workspace ws(G, d, H);
    std::vector<float> out(H * G * d);
    certattn::dense_attend_nhd_layer<bfloat16>(q, H, G, c.k_nhd.data(), c.v_nhd.data(), n, d, scale,
                                               out, ws);
    for (std::size_t h = 0; h < H; ++h) {
      const auto ref =
          reference(c, h, std::span<const float>(q).subspan(h * G * d, G * d), G, scale, 0, n);
      EXPECT_LT(rel_error(std::span<const float>(out).subspan(h * G * d, G * d), ref, d), 2e-5)
          << "n " << n << " d " << d << " head " << h;
    }
  }
}

// Split-K over the layer: partial states of two token ranges, merged, equal the whole.
TEST_P(DenseLayer, PartialsMerge) {
  const isa a = GetParam();
  if (!supported(a)) GTEST_SKIP() << "CPU lacks " << certattn::to_string(a);
  isa_scope scope(a);
  const std::size_t n = 700, d = 64, H = 4, G = 2, split = 333, R = H * G;
  const test_cache<half> c(n, d, H, 77);
  std::vector<float> q;
  for (std::size_t h = 0; h < H; ++h) {
    const auto qh = make_queries(c, h, G, h + 5);
    q.insert(q.end(), qh.begin(), qh.end());
  }
  certattn::dense_workspace ws(G, d, H);
  std::vector<float> m1(R), l1(R), a1(R * d), m2(R), l2(R), a2(R * d);
  const std::size_t row = H * d;
  certattn::dense_partial_nhd_layer<half>(q, H, G, c.k_nhd.data(), c.v_nhd.data(), split, d, 0.0f,
                                          m1, l1, a1, ws);
  certattn::dense_partial_nhd_layer<half>(q, H, G, c.k_nhd.data() + split * row,
                                          c.v_nhd.data() + split * row, n - split, d, 0.0f, m2, l2,
                                          a2, ws);
  for (std::size_t h = 0; h < H; ++h) {
    const auto ref = reference(c, h, std::span<const float>(q).subspan(h * G * d, G * d), G,
                               1.0 / std::sqrt(double(d)), 0, n);
    std::vector<float> out(G * d);
    for (std::size_t g = 0; g < G; ++g) {
      const std::size_t r = h * G + g;
      const float m = std::max(m1[r], m2[r]);
      const float w1 = std::exp(m1[r] - m), w2 = std::exp(m2[r] - m);
      const float l = l1[r] * w1 + l2[r] * w2;
      EXPECT_NEAR(m, ref[g].max_score, 1e-5 * std::max(1.0, std::abs(ref[g].max_score)));
      EXPECT_NEAR(l, ref[g].denominator, 1e-5 * ref[g].denominator);
      for (std::size_t i = 0; i < d; ++i)
        out[g * d + i] = (a1[r * d + i] * w1 + a2[r * d + i] * w2) / l;
    }
    EXPECT_LT(rel_error(out, ref, d), 1e-5) << "head " << h;
  }
  // The empty range: m = -inf, l = 0, acc = 0.
  certattn::dense_partial_nhd_layer<half>(q, H, G, c.k_nhd.data(), c.v_nhd.data(), 0, d, 0.0f, m1,
                                          l1, a1, ws);
  for (std::size_t r = 0; r < R; ++r) {
    EXPECT_EQ(m1[r], -std::numeric_limits<float>::infinity());
    EXPECT_EQ(l1[r], 0.0f);
  }
}

INSTANTIATE_TEST_SUITE_P(All, DenseLayer,
                         ::testing::Values(isa::kScalar, isa::kAvx2, isa::kAvx512Vnni),
                         [](const auto& info) {
                           return std::string(certattn::to_string(info.param));
                         });

// Extreme inputs on every ISA.
class DenseExtreme : public ::testing::TestWithParam<isa> {};

TEST_P(DenseExtreme, HugeScoresStayFinite) {
  const isa a = GetParam();
  if (!supported(a)) GTEST_SKIP();
  isa_scope scope(a);
  const std::size_t n = 500, d = 72, G = 4;
  const test_cache<half> c(n, d, 1, 3);
  const std::vector<float> q = make_queries(c, 0, G, 9);
  certattn::dense_workspace ws(G, d);
  std::vector<float> out(G * d);
  // Scores up to ~1e7 and ~1e33: softmax is an argmax; still no overflow and no NaN.
  for (float scale : {1e4f, 1e30f}) {
    certattn::dense_attend(q, G, c.hnd(0), scale, out, ws);
    for (float x : out) ASSERT_TRUE(std::isfinite(x)) << "scale " << scale;
    const auto ref = reference(c, 0, q, G, scale, 0, n);
    EXPECT_LT(rel_error(out, ref, d), 1e-3) << "scale " << scale;
  }
  // Products that overflow float are rejected at entry, naming softmax_scale.
  try {
    certattn::dense_attend(q, G, c.hnd(0), 1e38f, out, ws);
    FAIL() << "no error";
  } catch (const certattn::error& e) {
    EXPECT_NE(std::string(e.what()).find("softmax_scale"), std::string::npos) << e.what();
  }
}

TEST_P(DenseExtreme, DegenerateCaches) {
  const isa a = GetParam();
  if (!supported(a)) GTEST_SKIP();
  isa_scope scope(a);
  const std::size_t n = 333, d = 128, G = 8;
  test_cache<bfloat16> c(n, d, 1, 4);
  const std::vector<float> q = make_queries(c, 0, G, 2);
  certattn::dense_workspace ws(G, d);
  std::vector<float> out(G * d);

  // Single token: the output is the value row.
  certattn::dense_attend(q, G, c.hnd(0), 0.0f, out, ws, 17, 18);
  for (std::size_t g = 0; g < G; ++g)
    for (std::size_t i = 0; i < d; ++i)
      EXPECT_NEAR(out[g * d + i], certattn::to_float(c.value(0, 17)[i]), 1e-6);

  // All keys equal: the output is the mean of the values.
  for (std::size_t t = 1; t < n; ++t) std::copy_n(c.key(0, 0), d, c.k_hnd.begin() + t * d);
  certattn::dense_attend(q, G, c.hnd(0), 0.0f, out, ws);
  for (std::size_t i = 0; i < d; ++i) {
    double mean = 0.0;
    for (std::size_t t = 0; t < n; ++t) mean += certattn::to_float(c.value(0, t)[i]);
    mean /= double(n);
    for (std::size_t g = 0; g < G; ++g) EXPECT_NEAR(out[g * d + i], mean, 1e-5);
  }

  // All values zero: the output is exactly zero.
  std::fill(c.v_hnd.begin(), c.v_hnd.end(), bfloat16(0.0f));
  certattn::dense_attend(q, G, c.hnd(0), 0.0f, out, ws);
  for (float x : out) EXPECT_EQ(x, 0.0f);

  // Empty range of the partial form: m = -inf, l = 0, acc = 0.
  std::vector<float> m(G, 1.0f), l(G, 1.0f), acc(G * d, 1.0f);
  certattn::dense_partial(q, G, c.hnd(0), 0.0f, 10, 10, m, l, acc, ws);
  for (std::size_t g = 0; g < G; ++g) {
    EXPECT_EQ(m[g], -std::numeric_limits<float>::infinity());
    EXPECT_EQ(l[g], 0.0f);
  }
  for (float x : acc) EXPECT_EQ(x, 0.0f);
}

INSTANTIATE_TEST_SUITE_P(All, DenseExtreme,
                         ::testing::Values(isa::kScalar, isa::kAvx2, isa::kAvx512Vnni),
                         [](const auto& info) {
                           return std::string(certattn::to_string(info.param));
                         });

#if CERTATTN_X86
CERTATTN_TARGET_AVX512 void exp16_avx512(const float* x, float* y) {
  _mm512_storeu_ps(y, certattn::detail::avx512::dense::exp_ps(_mm512_loadu_ps(x)));
}
CERTATTN_TARGET_AVX2 void exp8_avx2(const float* x, float* y) {
  _mm256_storeu_ps(y, certattn::detail::avx2::dense::exp_ps(_mm256_loadu_ps(x)));
}
#endif

// The vector exp of the softmax weights: relative error over [-87, 0] (where the kernels
// evaluate it) against exp in double, and exact zeros far below.
TEST(DenseExp, RelativeError) {
#if CERTATTN_X86
  const bool has512 = supported(isa::kAvx512Vnni), has2 = supported(isa::kAvx2);
  std::vector<float> xs;
  for (double x = -87.0; x <= 0.0; x += 1.0009e-4) xs.push_back(float(x));
  xs.push_back(0.0f);
  xs.resize((xs.size() + 15) / 16 * 16, -1.0f);
  std::vector<float> y512(xs.size()), y2(xs.size());
  for (std::size_t i = 0; i < xs.size(); i += 16) {
    if (has512) exp16_avx512(&xs[i], &y512[i]);
    if (has2) {
      exp8_avx2(&xs[i], &y2[i]);
      exp8_avx2(&xs[i + 8], &y2[i + 8]);
    }
  }
  double worst512 = 0.0, worst2 = 0.0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const double e = std::exp(double(xs[i]));
    if (has512) worst512 = std::max(worst512, std::abs(y512[i] - e) / e);
    if (has2) worst2 = std::max(worst2, std::abs(y2[i] - e) / e);
  }
  std::printf("exp relative error on [-87, 0]: avx512 %.2e, avx2 %.2e\n", worst512, worst2);
  EXPECT_LT(worst512, 2e-7);
  EXPECT_LT(worst2, 2e-7);
  // The constant the exact answers' rounding bound assumes (rounding.hpp), for these and
  // for the C library's expf of the scalar and portable kernels.
  double worst_libm = 0.0;
  for (float x : xs) {
    const double e = std::exp(double(x));
    worst_libm = std::max(worst_libm, std::abs(double(std::exp(x)) - e) / e);
  }
  EXPECT_LT(worst512, certattn::detail::kDenseExpError);
  EXPECT_LT(worst2, certattn::detail::kDenseExpError);
  EXPECT_LT(worst_libm, certattn::detail::kDenseExpError);
  float far[16], y[16];
  for (int i = 0; i < 16; ++i)
    far[i] = i < 8 ? -200.0f * float(i + 1) : -std::numeric_limits<float>::infinity();
  if (has512) {
    exp16_avx512(far, y);
    for (float v : y) EXPECT_EQ(v, 0.0f);
  }
  if (has2) {
    exp8_avx2(far, y);
    exp8_avx2(far + 8, y + 8);
    for (float v : y) EXPECT_EQ(v, 0.0f);
  }
#else
  GTEST_SKIP();
#endif
}

// The kernels' branch-free fp16 conversion equals the binary16 definition,
// (-1)^s 2^(e-15) (1 + m/1024) or 2^-14 m/1024, on every bit pattern.
TEST(DenseScalar, HalfConversionIsExact) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const int e = int(b >> 10) & 31, m = int(b & 1023);
    const float mag = e == 31 ? (m == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN())
                      : e == 0 ? std::ldexp(float(m), -24)
                               : std::ldexp(1.0f + float(m) / 1024.0f, e - 15);
    const float want = (b & 0x8000u) ? -mag : mag;
    const float got = certattn::detail::half_bits_to_float(std::uint16_t(b));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << b;
    } else {
      EXPECT_EQ(got, want) << b;
      EXPECT_EQ(std::signbit(got), std::signbit(want)) << b;
    }
  }
}

// Long paged ranges cross many pages and chunks whose prefetch reaches into the next page.
TEST(DensePaged, OddPageSizesAndRanges) {
  for (isa a : {isa::kScalar, isa::kAvx2, isa::kAvx512Vnni}) {
    if (!supported(a)) continue;
    isa_scope scope(a);
    const test_cache<half> c(3000, 96, 1, 11);
    const auto q = make_queries(c, 0, 4, 3);
    certattn::dense_workspace ws(4, 96);
    std::vector<float> out(4 * 96);
    for (std::size_t page : {std::size_t(1), std::size_t(7), std::size_t(16), std::size_t(100)}) {
      const paged_copy<half> p(c, 0, page, page);
      for (auto [b, e] : {std::pair<std::size_t, std::size_t>{0, 3000}, {13, 2990}, {999, 1000}}) {
        certattn::dense_attend(q, 4, p.view, 0.0f, out, ws, b, e);
        EXPECT_LT(rel_error(out, reference(c, 0, q, 4, 1.0 / std::sqrt(96.0), b, e), 96), 1e-5)
            << certattn::to_string(a) << " page " << page << " [" << b << ", " << e << ")";
      }
    }
  }
}

TEST(DenseValidation, BadInputsNameTheArgument) {
  const std::size_t n = 10, d = 16, G = 2;
  const test_cache<half> c(n, d, 1, 1);
  std::vector<float> q(G * d, 0.1f), out(G * d), m(G), l(G), acc(G * d);
  certattn::dense_workspace ws(G, d);
  auto expect_error = [](auto&& f, const char* word) {
    try {
      f();
      ADD_FAILURE() << "no error, expected one naming " << word;
    } catch (const certattn::error& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  };
  const auto kv = c.hnd(0);
  expect_error([&] { certattn::dense_attend(q, 0, kv, 0.f, out, ws); }, "group");
  expect_error(
      [&] { certattn::dense_attend(std::span<const float>(q).first(d), G, kv, 0.f, out, ws); },
      "queries");
  expect_error([&] { certattn::dense_attend(q, G, kv, 0.f, std::span<float>(out).first(d), ws); },
               "out");
  expect_error([&] { certattn::dense_attend(q, G, kv, -1.f, out, ws); }, "softmax_scale");
  expect_error([&] { certattn::dense_attend(q, G, kv, std::nanf(""), out, ws); }, "softmax_scale");
  expect_error([&] { certattn::dense_attend(q, G, kv, 0.f, out, ws, 5, 3); }, "begin");
  expect_error([&] { certattn::dense_attend(q, G, kv, 0.f, out, ws, 4, 4); }, "begin (4) >= end (4)");
  expect_error([&] { certattn::dense_attend(q, G, kv, 0.f, out, ws, 0, 11); }, "end");
  certattn::dense_workspace small(1, d);
  expect_error([&] { certattn::dense_attend(q, G, kv, 0.f, out, small); }, "ws");
  certattn::dense_workspace empty;
  expect_error([&] { certattn::dense_attend(q, G, kv, 0.f, out, empty); }, "ws");
  std::vector<float> bad = q;
  bad[3] = std::numeric_limits<float>::infinity();
  expect_error([&] { certattn::dense_attend(bad, G, kv, 0.f, out, ws); }, "queries");
  expect_error(
      [&] {
        certattn::dense_partial(q, G, kv, 0.f, 0, n, std::span<float>(m).first(1), l, acc, ws);
      },
      "max_scores");
  expect_error(
      [&] {
        certattn::dense_partial(q, G, kv, 0.f, 0, n, m, std::span<float>(l).first(1), acc, ws);
      },
      "sums");
  expect_error(
      [&] {
        certattn::dense_partial(q, G, kv, 0.f, 0, n, m, l, std::span<float>(acc).first(d), ws);
      },
      "acc");
  expect_error([&] { certattn::dense_partial(q, G, kv, 0.f, 0, n + 1, m, l, acc, ws); }, "end");
  expect_error([&] { certattn::dense_workspace(0, d); }, "group");
  expect_error([&] { certattn::dense_workspace(G, 0); }, "head_dim");
  expect_error([&] { certattn::dense_workspace(G, d, 0); }, "kv_heads");
  expect_error(
      [&] {
        certattn::dense_attend_nhd_layer<half>(q, 2, G, c.k_nhd.data(), c.v_nhd.data(), n, d, 0.f,
                                               out, ws);
      },
      "queries");
  std::vector<float> q2(2 * G * d, 0.1f), out2(2 * G * d);
  expect_error(
      [&] {
        certattn::dense_attend_nhd_layer<half>(q2, 2, G, c.k_nhd.data(), c.v_nhd.data(), n, d, 0.f,
                                               out2, ws);
      },
      "ws");
  expect_error(
      [&] {
        certattn::dense_attend_nhd_layer<half>(q, 1, G, c.k_nhd.data(), c.v_nhd.data(), 0, d, 0.f,
                                               out, ws);
      },
      "n_tokens");
  expect_error(
      [&] {
        certattn::dense_attend_nhd_layer<half>(q, 0, G, c.k_nhd.data(), c.v_nhd.data(), n, d, 0.f,
                                               out, ws);
      },
      "kv_heads");
}

// A workspace sized for more serves smaller calls, and calls reuse it without stale state.
TEST(DenseWorkspace, ReuseAcrossShapes) {
  certattn::dense_workspace ws(8, 256, 1);
  for (auto [d, G] : {std::pair<std::size_t, std::size_t>{128, 4}, {256, 8}, {72, 3}, {128, 4}}) {
    const test_cache<float> c(200, d, 1, d + G);
    const auto q = make_queries(c, 0, G, 1);
    std::vector<float> out(G * d);
    certattn::dense_attend(q, G, c.hnd(0), 0.0f, out, ws);
    const auto ref = reference(c, 0, q, G, 1.0 / std::sqrt(double(d)), 0, 200);
    EXPECT_LT(rel_error(out, ref, d), 2e-5);
  }
  certattn::dense_workspace copy = ws;  // copies re-align their own buffer
  const test_cache<float> c(100, 64, 1, 8);
  const auto q = make_queries(c, 0, 2, 1);
  std::vector<float> out(2 * 64);
  certattn::dense_attend(q, 2, c.hnd(0), 0.0f, out, copy);
  EXPECT_LT(rel_error(out, reference(c, 0, q, 2, 0.125, 0, 100), 64), 2e-5);
}

}  // namespace
