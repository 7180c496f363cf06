// The quantized cache formats (formats.hpp): ggml's block_q8_0 and block_q4_0 layouts bit
// for bit, the fp8 codes' values, the row decoders the same bits on every instruction set,
// and for each format on each layout: the fast path computes what the reference computes
// over the decoded cache (same levels, samples token by token, beta to 1e-9), every
// certified head is within epsilon of exact attention over the decoded cache, outputs are
// the same bits on every instruction set, a steady-state call does not allocate, and the
// dense kernel agrees with exact attention. Bad input gets an error naming the argument.
#include "support/count_allocations.hpp"

#include <certattn/attend.hpp>
#include <certattn/dense.hpp>
#include <certattn/exact.hpp>
#include <certattn/reference.hpp>

#include "support/layouts.hpp"

#include <certattn/arch/macros.hpp>  // CERTATTN_X86 and the kernel attributes

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <random>
#include <set>
#include <utility>
#include <string>
#include <vector>

namespace {

using namespace certattn;
using test::layout_kind;

TEST(FormatLayout, BlocksMatchGgml) {
  EXPECT_EQ(sizeof(block_q8_0), 34u);
  EXPECT_EQ(offsetof(block_q8_0, qs), 2u);
  EXPECT_EQ(sizeof(block_q4_0), 18u);
  EXPECT_EQ(offsetof(block_q4_0, qs), 2u);
  // x = d * q; x = d * (nibble - 8), channel i low nibble of qs[i], 16 + i its high nibble.
  block_q8_0 b8{};
  b8.d = half(0.5f);
  for (int i = 0; i < 32; ++i) b8.qs[i] = std::int8_t(i - 16);
  block_q4_0 b4{};
  b4.d = half(-0.25f);
  for (int i = 0; i < 16; ++i) b4.qs[i] = std::uint8_t(i | ((15 - i) << 4));
  float x[32];
  detail::decode_row_scalar(&b8, 32, 1.0f, x);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(x[i], 0.5f * float(i - 16));
  detail::decode_row_scalar(&b4, 32, 1.0f, x);
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(x[i], -0.25f * float(i - 8));
    EXPECT_EQ(x[16 + i], -0.25f * float(15 - i - 8));
  }
}

TEST(FormatLayout, Fp8CodeValues) {
  using detail::fp8_e4m3_value;
  EXPECT_EQ(fp8_e4m3_value(0x7E), 448.0f);        // the largest
  EXPECT_EQ(fp8_e4m3_value(0x38), 1.0f);          // exponent 7 = bias
  EXPECT_EQ(fp8_e4m3_value(0x08), 0x1p-6f);       // the smallest normal
  EXPECT_EQ(fp8_e4m3_value(0x01), 0x1p-9f);       // the smallest subnormal
  EXPECT_EQ(fp8_e4m3_value(0xC0), -2.0f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_value(0x7F)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_value(0xFF)));
  EXPECT_EQ(detail::fp8_e5m2_value(0x7B), 57344.0f);
  EXPECT_EQ(detail::fp8_e5m2_value(0x3C), 1.0f);
  EXPECT_EQ(detail::fp8_e5m2_value(0x01), 0x1p-16f);
  EXPECT_TRUE(std::isinf(detail::fp8_e5m2_value(0x7C)));
  // The encoders round to nearest and saturate (e4m3).
  const float in[4] = {1.0f, 1000.0f, -0.0f, 3.3f};
  fp8_e4m3 c[4];
  quantize_row(in, 4, 1.0f, c);
  EXPECT_EQ(c[0].bits, 0x38);
  EXPECT_EQ(c[1].bits, 0x7E);
  EXPECT_EQ(c[2].bits, 0x80);
  EXPECT_EQ(fp8_e4m3_value(c[3].bits), 3.25f);
  fp8_e5m2 e[4];
  quantize_row(in, 4, 1.0f, e);
  EXPECT_EQ(detail::fp8_e5m2_value(e[0].bits), 1.0f);
  EXPECT_EQ(detail::fp8_e5m2_value(e[1].bits), 1024.0f);
  EXPECT_EQ(detail::fp8_e5m2_value(e[3].bits), 3.5f);
}

template <class T>
std::vector<T> random_units(std::size_t n, std::uint64_t seed) {
  std::vector<T> v(n);
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> bytes(n * sizeof(T));
  for (auto& b : bytes) b = static_cast<unsigned char>(rng());
  std::memcpy(v.data(), bytes.data(), bytes.size());
  if constexpr (std::is_same_v<T, block_q8_0> || std::is_same_v<T, block_q4_0>)
    for (auto& b : v) b.d = half(std::ldexp(float(rng() % 1000 + 1), int(rng() % 30) - 24));
  return v;
}

#if CERTATTN_X86
/// The AVX-512 decoder's single 16-channel loads (the dense kernel's), row by 16 channels.
template <class T>
CERTATTN_TARGET_AVX512 void load16_avx512(const std::vector<T>& row, std::size_t d, float scale,
                                          float* out) {
  const detail::avx512_decoder<T> dec(scale);
  for (std::size_t c = 0; c < d; c += 16) {
    const std::size_t k = std::min<std::size_t>(16, d - c);
    const __mmask16 m = k == 16 ? __mmask16(0xFFFF) : __mmask16((1u << k) - 1u);
    _mm512_mask_storeu_ps(out + c, m, k == 16 ? dec.load16(row.data(), c)
                                             : dec.load16_masked(row.data(), c, m));
  }
}
#endif

/// load16_avx512() against `want`, on a CPU with AVX-512.
template <class T>
void expect_avx512_loads(const std::vector<T>& row, std::size_t d, float scale,
                         const std::vector<float>& want) {
#if CERTATTN_X86
  if (detected_isa() != isa::kAvx512Vnni) return;
  std::vector<float> got(d);
  load16_avx512(row, d, scale, got.data());
  for (std::size_t i = 0; i < d; ++i) {
    if (std::isnan(want[i]))
      EXPECT_TRUE(std::isnan(got[i])) << "load16 channel " << i;
    else
      EXPECT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want[i]))
          << "load16, d " << d << " scale " << scale << " channel " << i;
  }
#else
  (void)row, (void)d, (void)scale, (void)want;
#endif
}

template <class T>
void decode_same_bits_on_every_isa() {
  // fp8 rows of any length (the tails are masked); scales whose 2^8 multiple overflows
  // (e4m3's decoder then keeps the scale apart) or is subnormal.
  constexpr bool fp8 = fp8_element<T>;
  const std::vector<std::size_t> dims = fp8 ? std::vector<std::size_t>{7, 32, 40, 128, 160, 576}
                                             : std::vector<std::size_t>{32, 128, 160, 576};
  const std::vector<float> scales = fp8 ? std::vector<float>{1.0f, 0.0123f, 3.7e4f, 3e36f, 1e-39f}
                                        : std::vector<float>{1.0f};
  for (std::size_t d : dims) {
    const std::vector<T> row = random_units<T>(format_traits<T>::units(d), d);
    for (float scale : scales) {
      std::vector<float> want(d), got(d);
      detail::decode_row_scalar(row.data(), d, scale, want.data());
      for (isa a : {isa::kAvx512Vnni, isa::kAvx2, isa::kScalar}) {
        if (int(a) > int(detected_isa())) continue;
        set_isa_cap(a);
        detail::decode_row(row.data(), d, scale, got.data());
        set_isa_cap(isa::kAvx512Vnni);
        for (std::size_t i = 0; i < d; ++i) {
          if (std::isnan(want[i])) {
            EXPECT_TRUE(std::isnan(got[i])) << to_string(a) << " channel " << i;
            continue;
          }
          EXPECT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want[i]))
              << to_string(a) << " d " << d << " channel " << i;
        }
      }
      expect_avx512_loads(row, d, scale, want);
    }
  }
}

TEST(DecodeKernels, SameBitsOnEveryIsa) {
  decode_same_bits_on_every_isa<block_q8_0>();
  decode_same_bits_on_every_isa<block_q4_0>();
  decode_same_bits_on_every_isa<fp8_e4m3>();
  decode_same_bits_on_every_isa<fp8_e5m2>();
}

// ---- the certified call over each format -----------------------------------------------

struct format_case {
  cache_format format;        // the keys'
  cache_format value_format;  // the values' (the keys' in most cases)
  layout_kind layout;
  synthetic::regime kind;
  std::size_t d, group, n;
};

std::string name_of(const format_case& c) {
  const std::string values =
      c.value_format == c.format ? "" : "_values_" + std::string(to_string(c.value_format));
  return std::string(to_string(c.format)) + values + "_" + test::to_string(c.layout) + "_" +
         std::string(synthetic::to_string(c.kind)) + "_d" + std::to_string(c.d) + "_G" +
         std::to_string(c.group) + "_n" + std::to_string(c.n);
}

/// The dense kernel over the stored format (AVX-512: decoded in registers; elsewhere through
/// a float tile) against exact attention over the decoded rows, on every instruction set.
template <class View>
void check_dense_kernel(const std::vector<float>& q, std::size_t G, const View& kv,
                        const dense_rows<View>& rows) {
  const std::size_t d = kv.head_dim();
  std::vector<float> out(G * d);
  dense_workspace dws(G, d);
  for (isa a : {isa::kAvx512Vnni, isa::kAvx2, isa::kScalar}) {
    if (int(a) > int(detected_isa())) continue;
    set_isa_cap(a);
    dense_attend(std::span<const float>(q), G, kv, 0.0f, std::span<float>(out), dws);
    set_isa_cap(isa::kAvx512Vnni);
    for (std::size_t g = 0; g < G; ++g) {
      const exact_result ex = exact_attention(std::span<const float>(q.data() + g * d, d),
                                              rows.key_matrix(), rows.value_matrix());
      for (std::size_t i = 0; i < d; ++i)
        ASSERT_NEAR(out[g * d + i], ex.output[i], 2e-5 * std::max(1.0, ex.value_scale))
            << "dense kernel on " << to_string(a) << ", head " << g << " channel " << i;
    }
  }
}

/// One call per ISA on the same index; the fast path against the reference, the
/// certificate against exact attention, and the ISAs against each other.
template <class K, class V, class View>
void check_format_call(const format_case& p, const View& kv, const synthetic::kv_cache& src,
                       std::size_t head) {
  const std::size_t n = p.n, d = p.d, G = p.group;
  key_index idx(d);
  const std::size_t n0 = n - std::min<std::size_t>(n / 4, 500);
  idx.build(kv.prefix(n0));
  for (std::size_t t = n0; t < n; ++t) idx.append(kv, t);
  EXPECT_EQ(idx.format(), format_traits<K>::format);
  EXPECT_EQ(idx.value_format(), format_traits<V>::format);

  const dense_rows<View> rows(kv);  // the decoded cache: what "exact" means
  attend_workspace ws(G, d, n);
  ws.record_samples(true);
  options opt;
  opt.seed = 5;
  opt.route = routing::kOff;
  std::size_t certified = 0;
  for (std::uint64_t step : {1u, 2u}) {
    const noise_key nk{step, 0, std::uint32_t(head)};
    const std::vector<float> q = synthetic::make_queries(src, head, G, step);
    std::vector<float> first_out;
    std::vector<certificate> first_certs;
    for (isa a : {isa::kAvx512Vnni, isa::kAvx2, isa::kScalar}) {
      if (int(a) > int(detected_isa())) continue;
      SCOPED_TRACE(std::string(to_string(a)) + " step " + std::to_string(step));
      std::vector<float> out(G * d);
      std::vector<certificate> certs(G);
      set_isa_cap(a);
      attend_group(std::span<const float>(q), G, kv, idx, nk, opt, std::span<float>(out),
                   std::span<certificate>(certs), ws);
      set_isa_cap(isa::kAvx512Vnni);
      ASSERT_EQ(ws.last_stats().bound_violations, 0u);
      if (first_out.empty()) {
        first_out = out;
        first_certs = certs;
      } else {
        for (std::size_t i = 0; i < G * d; ++i)
          ASSERT_EQ(std::bit_cast<std::uint32_t>(out[i]), std::bit_cast<std::uint32_t>(first_out[i]))
              << "output " << i << " differs across instruction sets";
        for (std::size_t g = 0; g < G; ++g) {
          ASSERT_EQ(certs[g].level, first_certs[g].level);
          ASSERT_EQ(certs[g].beta, first_certs[g].beta);
        }
      }
      const reference_extras extras{idx.value_center(), idx.value_cap(), idx.reach_floor()};
      const std::vector<reference_result> refs = reference_attend_group(
          std::span<const float>(q), G, rows.key_matrix(), rows.value_matrix(), opt, nk, extras);
      for (std::size_t g = 0; g < G; ++g) {
        const reference_result& r = refs[g];
        const certificate& f = certs[g];
        ASSERT_EQ(to_string(f.path), to_string(r.cert.path)) << "head " << g;
        ASSERT_EQ(f.level, r.cert.level) << "head " << g;
        ASSERT_EQ(f.sampled, r.cert.sampled) << "head " << g;
        ASSERT_EQ(f.max_score, r.cert.max_score) << "head " << g;
        if (!f.exact) {
          EXPECT_NEAR(f.beta, r.cert.beta, 1e-9 * std::max(1.0, r.cert.beta));
          std::set<std::uint32_t> fast, ref;
          for (const auto& sk : ws.samples(g)) fast.insert(sk.token);
          for (std::size_t t = 0; t < r.sample_level.size(); ++t)
            if (r.sample_level[t] >= 0 && r.sample_level[t] <= f.level) ref.insert(std::uint32_t(t));
          ASSERT_EQ(fast, ref) << "sample sets differ, head " << g;
        }
        // Within epsilon of exact attention over the decoded cache (false failure
        // probability <= delta per certified head).
        const exact_result ex = exact_attention(std::span<const float>(q.data() + g * d, d),
                                                rows.key_matrix(), rows.value_matrix());
        double err2 = 0.0;
        for (std::size_t i = 0; i < d; ++i) {
          const double e = double(out[g * d + i]) - ex.output[i];
          err2 += e * e;
        }
        if (f.certified) {
          ++certified;
          EXPECT_LE(std::sqrt(err2), opt.epsilon * ex.value_scale) << "head " << g;
        }
      }
    }
  }
  EXPECT_GT(certified, 0u);
  // A steady-state call (same sizes) does not allocate.
  const std::vector<float> q = synthetic::make_queries(src, head, G, 9);
  std::vector<float> out(G * d);
  std::vector<certificate> certs(G);
  g_allocations = 0;
  g_counting = true;
  attend_group(std::span<const float>(q), G, kv, idx, noise_key{9, 0, std::uint32_t(head)}, opt,
               std::span<float>(out), std::span<certificate>(certs), ws);
  g_counting = false;
  EXPECT_EQ(g_allocations.load(), 0);

  check_dense_kernel(q, G, kv, rows);
}

template <class K, class V = K>
void run_format_case(const format_case& p) {
  synthetic::cache_config cfg;
  cfg.n_tokens = p.n;
  cfg.head_dim = p.d;
  cfg.kv_heads = 2;
  cfg.kind = p.kind;
  cfg.seed = 77 + p.n;
  const synthetic::kv_cache src = synthetic::make_cache(cfg);
  const auto cache = test::make_layout_cache<K, V>(src, p.layout);
  // The view reads the rows the synthetic cache stored (each side in its own format): the
  // oracles below read through the view, so its addressing is checked here.
  const auto stored_as = [&](auto* tag, const half* row, float scale, std::vector<float>& out) {
    using T = std::remove_pointer_t<decltype(tag)>;
    std::vector<float> x(p.d);
    for (std::size_t i = 0; i < p.d; ++i) x[i] = float(row[i]);
    std::vector<T> units(format_traits<T>::units(p.d));
    test::store_row(x.data(), p.d, scale, units.data());
    out.resize(p.d);
    if constexpr (quantized_element<T>)
      detail::decode_row(units.data(), p.d, scale, out.data());
    else
      for (std::size_t i = 0; i < p.d; ++i) out[i] = float(units[i]);
  };
  const auto expect_rows = [&](const auto& kv) {
    std::vector<float> want(p.d), got(p.d);
    for (std::size_t t = 0; t < p.n; t += 97) {
      stored_as((K*)nullptr, src.key_row(1, t), cache.scales[1].key, want);
      detail::key_to_float(kv, t, got.data());
      ASSERT_EQ(want, got) << "key row " << t;
      stored_as((V*)nullptr, src.value_row(1, t), cache.scales[1].value, want);
      detail::value_to_float(kv, t, got.data());
      ASSERT_EQ(want, got) << "value row " << t;
    }
  };
  if (p.layout == layout_kind::kPaged)
    expect_rows(cache.paged(1));
  else
    expect_rows(cache.strided(1));
  if (p.layout == layout_kind::kPaged)
    check_format_call<K, V>(p, cache.paged(1), src, 1);
  else
    check_format_call<K, V>(p, cache.strided(1), src, 1);
}

class FormatCall : public ::testing::TestWithParam<format_case> {};

TEST_P(FormatCall, FastPathIsReferenceAndCertifiedOverTheDecodedCache) {
  const format_case& p = GetParam();
  if (p.value_format != p.format) {  // keys and values in different formats
    if (p.format == cache_format::q8_0 && p.value_format == cache_format::f16)
      run_format_case<block_q8_0, half>(p);
    else if (p.format == cache_format::q4_0 && p.value_format == cache_format::f16)
      run_format_case<block_q4_0, half>(p);
    else if (p.format == cache_format::q8_0 && p.value_format == cache_format::q4_0)
      run_format_case<block_q8_0, block_q4_0>(p);
    else if (p.format == cache_format::f16 && p.value_format == cache_format::fp8_e4m3)
      run_format_case<half, fp8_e4m3>(p);
    else
      FAIL() << "no case for these formats";
    return;
  }
  switch (p.format) {
    case cache_format::q8_0: run_format_case<block_q8_0>(p); break;
    case cache_format::q4_0: run_format_case<block_q4_0>(p); break;
    case cache_format::fp8_e4m3: run_format_case<fp8_e4m3>(p); break;
    default: run_format_case<fp8_e5m2>(p); break;
  }
}

std::vector<format_case> format_cases() {
  std::vector<format_case> c;
  const cache_format formats[] = {cache_format::q8_0, cache_format::q4_0, cache_format::fp8_e4m3,
                                  cache_format::fp8_e5m2};
  const layout_kind layouts[] = {layout_kind::kHnd, layout_kind::kNhd, layout_kind::kPaged};
  const synthetic::regime kinds[] = {synthetic::regime::kMixed, synthetic::regime::kPeaked,
                                     synthetic::regime::kRecency};
  std::size_t k = 0;
  for (cache_format f : formats)
    for (layout_kind l : layouts) {
      const std::size_t d = k % 2 == 0 ? 128 : 64;
      c.push_back({f, f, l, kinds[k % 3], d, k % 3 == 0 ? std::size_t(1) : std::size_t(4),
                   k % 4 == 0 ? std::size_t(8192) : std::size_t(3000)});
      ++k;
    }
  // Keys and values in different formats: llama.cpp's -ctk q8_0 / q4_0 with f16 values
  // (or q4_0 values), and fp8 values beside f16 keys; strided and paged.
  const std::pair<cache_format, cache_format> mixed[] = {
      {cache_format::q8_0, cache_format::f16},
      {cache_format::q4_0, cache_format::f16},
      {cache_format::q8_0, cache_format::q4_0},
      {cache_format::f16, cache_format::fp8_e4m3}};
  for (const auto& [kf, vf] : mixed)
    for (layout_kind l : {layout_kind::kNhd, layout_kind::kPaged}) {
      const std::size_t d = k % 2 == 0 ? 128 : 64;
      c.push_back({kf, vf, l, kinds[k % 3], d, k % 3 == 0 ? std::size_t(1) : std::size_t(4),
                   std::size_t(3000)});
      ++k;
    }
  return c;
}

INSTANTIATE_TEST_SUITE_P(EachFormatAndLayout, FormatCall, ::testing::ValuesIn(format_cases()),
                         [](const auto& info) { return name_of(info.param); });

// fp8 rows of any width: the dense kernel's masked tail (head_dim % 16 != 0), and a NaN code
// (e4m3's S.1111.111) gives a NaN output, not the 480 its bits would shift to.
TEST(FormatDense, Fp8TailChannelsAndNanCodes) {
  const std::size_t n = 300, d = 40, G = 3;
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(d), q(G * d);
  for (float& v : q) v = normal(rng);
  std::vector<fp8_e4m3> k(n * d), v(n * d);
  for (std::size_t t = 0; t < n; ++t) {
    for (float& y : x) y = normal(rng);
    quantize_row(x.data(), d, 0.02f, k.data() + t * d);
    for (float& y : x) y = normal(rng);
    quantize_row(x.data(), d, 0.03f, v.data() + t * d);
  }
  const auto kv = hnd_view(k.data(), v.data(), n, n, 1, d, 0).with_scales({0.02f, 0.03f});
  using view = std::remove_cv_t<decltype(kv)>;
  check_dense_kernel(q, G, kv, dense_rows<view>(kv));
  v[7 * d + 39].bits = 0x7F;
  std::vector<float> out(G * d);
  dense_workspace dws(G, d);
  for (isa a : {isa::kAvx512Vnni, isa::kAvx2, isa::kScalar}) {
    if (int(a) > int(detected_isa())) continue;
    set_isa_cap(a);
    dense_attend(std::span<const float>(q), G, kv, 0.0f, std::span<float>(out), dws);
    set_isa_cap(isa::kAvx512Vnni);
    EXPECT_TRUE(std::isnan(out[39])) << to_string(a);
  }
}

// ---- bad input --------------------------------------------------------------------------

std::string message_of(auto&& f) {
  try {
    f();
  } catch (const error& e) {
    return e.what();
  }
  return "";
}

TEST(FormatBadInput, ErrorsNameTheArgument) {
  std::vector<block_q8_0> k8(64), v8(64);
  EXPECT_NE(message_of([&] { hnd_view(k8.data(), v8.data(), 4, 4, 1, 48, 0); }).find("head_dim (48)"),
            std::string::npos);
  std::vector<fp8_e4m3> k(8 * 32), v(8 * 32);
  const auto view = hnd_view(k.data(), v.data(), 8, 8, 1, 32, 0);
  EXPECT_NE(message_of([&] { (void)view.with_scales({std::nanf(""), 1.0f}); }).find("key scale"),
            std::string::npos);
  EXPECT_NE(message_of([&] { (void)view.with_scales({1.0f, INFINITY}); }).find("value scale"),
            std::string::npos);
  // A NaN in a block's scale is a NaN key: the index names the token.
  for (auto& b : k8) b.d = half(1.0f);
  for (auto& b : v8) b.d = half(1.0f);
  k8[3 * 4].d = half(std::nanf(""));
  const auto q8 = hnd_view(k8.data(), v8.data(), 16, 16, 1, 128, 0);
  key_index idx(128);
  EXPECT_NE(message_of([&] { idx.build(q8); }).find("keys: token 3"), std::string::npos);
  k8[3 * 4].d = half(1.0f);
  idx.build(q8);
  // An index built from one format refuses a view of another, and other fp8 scales.
  std::vector<block_q4_0> k4(64), v4(64);
  const auto q4 = hnd_view(k4.data(), v4.data(), 16, 16, 1, 128, 0);
  EXPECT_NE(message_of([&] { idx.append(q4, 16); }).find("kv: a q4_0 cache"), std::string::npos);
  std::vector<fp8_e5m2> k5(16 * 32), v5(16 * 32);
  const auto e5 = hnd_view(k5.data(), v5.data(), 16, 16, 1, 32, 0).with_scales({2.0f, 2.0f});
  key_index idx5(32);
  idx5.build(e5);
  attend_workspace ws(1, 32, 16);
  std::vector<float> q(32, 0.1f), out(32);
  std::vector<certificate> certs(1);
  const auto other = hnd_view(k5.data(), v5.data(), 16, 16, 1, 32, 0).with_scales({1.0f, 2.0f});
  EXPECT_NE(message_of([&] {
              attend_group(std::span<const float>(q), 1, other, idx5, noise_key{}, options{},
                           std::span<float>(out), std::span<certificate>(certs), ws);
            }).find("differ from those the key index was built with"),
            std::string::npos);
  // Keys and values in different formats: the index records both, and a side that is not
  // fp8 keeps the scale 1.
  std::vector<half> v16(16 * 128, half(0.5f));
  const auto mixed = hnd_view(k8.data(), v16.data(), 16, 16, 1, 128, 0);
  static_assert(std::is_same_v<decltype(mixed), const strided_kv<block_q8_0, half>>);
  EXPECT_NE(message_of([&] { idx.append(mixed, 15); }).find("kv: f16 values, but the key index was built from q8_0 values"),
            std::string::npos);
  std::vector<fp8_e4m3> v8e(16 * 128);
  const auto fp8_values = hnd_view(v16.data(), v8e.data(), 16, 16, 1, 128, 0);
  EXPECT_NE(message_of([&] { (void)fp8_values.with_scales({2.0f, 1.0f}); })
                .find("key scale (2.000000) must be 1: the keys are f16, not fp8"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              const paged_kv<half, block_q8_0> p(v16.data(), k8.data(), std::span<const std::int32_t>(), 0,
                                                 16, 128, 16 * 128, 136, 0);
            }).find("token_stride (136) must be whole blocks of the values' 32 channels"),
            std::string::npos);
}

// ---- the token-major layer call over ggml's blocks ----------------------------------------

/// dense_attend_nhd_layer over a q8_0 / q4_0 layer ([token][kv_heads][head_dim / 32]
/// blocks, llama.cpp's cache tensor; values V, the keys' format or another): the bits of
/// dense_attend() head by head over the same rows (the same kernel over the same chunks),
/// on every instruction set.
template <class T, class V = T>
void check_block_layer() {
  const std::size_t n = 300, d = 64, H = 3, G = 2, unit = format_traits<T>::units(d);
  const std::size_t vunit = format_traits<V>::units(d);
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(d), q(H * G * d);
  for (float& v : q) v = normal(rng);
  std::vector<T> k(n * H * unit);
  std::vector<V> v(n * H * vunit);
  for (std::size_t r = 0; r < n * H; ++r) {
    for (float& y : x) y = normal(rng);
    quantize_row(x.data(), d, k.data() + r * unit);
    for (float& y : x) y = normal(rng);
    test::store_row(x.data(), d, 1.0f, v.data() + r * vunit);
  }
  std::vector<float> out(H * G * d), want(G * d);
  dense_workspace layer_ws(G, d, H), head_ws(G, d);
  for (isa a : {isa::kAvx512Vnni, isa::kAvx2, isa::kScalar}) {
    if (int(a) > int(detected_isa())) continue;
    set_isa_cap(a);
    dense_attend_nhd_layer(std::span<const float>(q), H, G, k.data(), v.data(), n, d, 0.0f,
                           std::span<float>(out), layer_ws);
    for (std::size_t h = 0; h < H; ++h) {
      dense_attend(std::span<const float>(q.data() + h * G * d, G * d), G,
                   nhd_view(k.data(), v.data(), n, H, d, h), 0.0f, std::span<float>(want), head_ws);
      for (std::size_t i = 0; i < G * d; ++i)
        ASSERT_EQ(std::bit_cast<std::uint32_t>(out[h * G * d + i]),
                  std::bit_cast<std::uint32_t>(want[i]))
            << to_string(a) << " head " << h << " entry " << i;
    }
    set_isa_cap(isa::kAvx512Vnni);
  }
  EXPECT_NE(message_of([&] {
              dense_attend_nhd_layer(std::span<const float>(q.data(), H * G * 48), H, G,
                                     k.data(), v.data(), n, 48, 0.0f,
                                        std::span<float>(out.data(), H * G * 48), layer_ws);
            }).find("head_dim"),
            std::string::npos);
}

TEST(FormatDense, TokenMajorLayerOfBlocks) {
  check_block_layer<block_q8_0>();
  check_block_layer<block_q4_0>();
  check_block_layer<block_q8_0, half>();  // llama.cpp's -ctk q8_0 with f16 values
  check_block_layer<block_q4_0, half>();
}

/// The same over an fp8 layer with a scale pair per KV head (vLLM's cache): the bits of
/// dense_attend() over each head's scaled view, on every instruction set, for both the
/// attend and the partial call (tokens split in two and merged as the caller would); e4m3
/// scales include one whose 2^8 multiple overflows float (the decoder keeps it apart).
template <class T>
void check_fp8_layer() {
  const std::size_t n = 300, d = 40, H = 3, G = 2, split = 170;
  const std::vector<fp8_scales> scales = {{0.03f, 2.5f}, {1e-3f, 0.5f}, {3e36f, 1e-30f}};
  std::mt19937_64 rng(12);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(d), q(H * G * d);
  for (float& v : q) v = normal(rng);
  std::vector<T> k(n * H * d), v(n * H * d);
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t h = 0; h < H; ++h) {
      for (float& y : x) y = normal(rng) * 20.0f * scales[h].key;
      quantize_row(x.data(), d, scales[h].key, k.data() + (t * H + h) * d);
      for (float& y : x) y = normal(rng) * 20.0f * scales[h].value;
      quantize_row(x.data(), d, scales[h].value, v.data() + (t * H + h) * d);
    }
  for (std::size_t i = 2 * G * d; i < 3 * G * d; ++i) q[i] *= 1e-36f;  // head 2's keys ~1e38
  std::vector<float> out(H * G * d), want(G * d);
  std::vector<float> m1(H * G), l1(H * G), a1(H * G * d), m2(H * G), l2(H * G), a2(H * G * d);
  std::vector<float> mw(G), lw(G), aw(G * d);
  dense_workspace layer_ws(G, d, H), head_ws(G, d);
  const std::span<const fp8_scales> sc(scales);
  for (isa a : {isa::kAvx512Vnni, isa::kAvx2, isa::kScalar}) {
    if (int(a) > int(detected_isa())) continue;
    set_isa_cap(a);
    dense_attend_nhd_layer<T>(std::span<const float>(q), H, G, k.data(), v.data(), n, d, 0.0f,
                              sc, std::span<float>(out), layer_ws);
    dense_partial_nhd_layer<T>(std::span<const float>(q), H, G, k.data() + split * H * d,
                               v.data() + split * H * d, n - split, d, 0.0f, sc,
                               std::span<float>(m2), std::span<float>(l2), std::span<float>(a2),
                               layer_ws);
    for (std::size_t h = 0; h < H; ++h) {
      const auto view = nhd_view(k.data(), v.data(), n, H, d, h).with_scales(scales[h]);
      const std::span<const float> qh(q.data() + h * G * d, G * d);
      dense_attend(qh, G, view, 0.0f, std::span<float>(want), head_ws);
      for (std::size_t i = 0; i < G * d; ++i)
        ASSERT_EQ(std::bit_cast<std::uint32_t>(out[h * G * d + i]),
                  std::bit_cast<std::uint32_t>(want[i]))
            << to_string(a) << " head " << h << " entry " << i;
      dense_partial(qh, G, view, 0.0f, split, n, std::span<float>(mw), std::span<float>(lw),
                    std::span<float>(aw), head_ws);
      for (std::size_t i = 0; i < G; ++i) {
        ASSERT_EQ(std::bit_cast<std::uint32_t>(m2[h * G + i]), std::bit_cast<std::uint32_t>(mw[i]));
        ASSERT_EQ(std::bit_cast<std::uint32_t>(l2[h * G + i]), std::bit_cast<std::uint32_t>(lw[i]));
      }
      for (std::size_t i = 0; i < G * d; ++i)
        ASSERT_EQ(std::bit_cast<std::uint32_t>(a2[h * G * d + i]),
                  std::bit_cast<std::uint32_t>(aw[i]))
            << to_string(a) << " partial, head " << h << " entry " << i;
    }
    set_isa_cap(isa::kAvx512Vnni);
  }
  std::vector<fp8_scales> bad = scales;
  bad[1].value = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(message_of([&] {
              dense_attend_nhd_layer<T>(std::span<const float>(q), H, G, k.data(), v.data(), n, d,
                                        0.0f, std::span<const fp8_scales>(bad),
                                        std::span<float>(out), layer_ws);
            }).find("scales[1].value"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              dense_attend_nhd_layer<T>(std::span<const float>(q), H, G, k.data(), v.data(), n, d,
                                        0.0f, sc.first(2), std::span<float>(out), layer_ws);
            }).find("scales"),
            std::string::npos);
}

TEST(FormatDense, TokenMajorLayerOfFp8) {
  check_fp8_layer<fp8_e4m3>();
  check_fp8_layer<fp8_e5m2>();
}

}  // namespace
