// Direct comparisons of every vector kernel with its scalar twin, on random inputs chosen
// so that a wrong lane, reduction order, rounding or mask shows in the bits: the portable
// (xsimd) kernels, which the dispatch runs below AVX2 / AVX-512 and on aarch64, and the
// AVX2 / AVX-512 kernels where the CPU has them. End-to-end tests (test_determinism,
// test_attend) cover the same kernels only through the certified call. Deterministic: fixed
// seeds, exact (bitwise) expectations; the dense kernel's, which is not bit-identical
// across ISAs, within its rounding.
#include <certattn/arch/candidate_kernels.hpp>
#include <certattn/arch/portable.hpp>
#include <certattn/arch/refine_kernels.hpp>
#include <certattn/arch/scan_prep.hpp>
#include <certattn/arch/score_dot.hpp>
#include <certattn/dense.hpp>
#include <certattn/arch/avx512/scan_kernels.hpp>  // empty off x86

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <certattn/arch/macros.hpp>  // CERTATTN_X86 and the kernel attributes

namespace {

using certattn::bfloat16;
using certattn::half;
using certattn::isa;
namespace detail = certattn::detail;

struct rng {
  std::uint64_t s;
  std::uint64_t next() { return s = s * 6364136223846793005ULL + 1442695040888963407ULL; }
  double uniform() { return double(next() >> 11) * 0x1p-53; }  // [0, 1)
  /// A float with a magnitude spread over 2^-lo_exp .. 2^hi_exp, either sign.
  float spread(int lo_exp, int hi_exp) {
    const int e = lo_exp + int(next() % std::uint64_t(hi_exp - lo_exp + 1));
    return float((uniform() - 0.5) * std::ldexp(2.0, e));
  }
};

bool has(isa a) { return int(a) <= int(certattn::detected_isa()); }

std::uint64_t bits(double x) { return std::bit_cast<std::uint64_t>(x); }
std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }

template <class T>
std::vector<T> random_row(rng& r, std::size_t d, int lo, int hi) {
  std::vector<T> v(d);
  for (auto& x : v) x = T(r.spread(lo, hi));
  return v;
}

// Dimensions that exercise full batches, the tails of 8 and 16 lanes, and d < 8.
const std::size_t kDims[] = {1, 3, 7, 8, 15, 16, 24, 64, 72, 100, 128, 136, 256};

TEST(PortableKernels, TargetIsNamed) {
  std::printf("portable kernels: %s (fused multiply-add: %s)\n", detail::portable::arch_name(),
              detail::portable::portable_has_fma ? "yes" : "no");
#if defined(__aarch64__) || defined(__FMA__)
  // NEON, or x86-64 with FMA (test_kernels_direct_fma): the fused kernels run in batches.
  EXPECT_TRUE(CERTATTN_PORTABLE_SIMD);
  EXPECT_TRUE(detail::portable::portable_has_fma);
#else
  EXPECT_FALSE(CERTATTN_PORTABLE_SIMD);  // the default x86-64 target runs the scalar twins
#endif
}

// ---- exact scores ------------------------------------------------------------------------
template <class T>
void check_score_dot(std::uint64_t seed) {
  rng r{seed};
  for (std::size_t d : kDims) {
    for (int rep = 0; rep < 8; ++rep) {
      const auto q = random_row<float>(r, d, -12, 6);
      const auto k = random_row<T>(r, d, -8, 4);
      const double want = detail::score_dot(q.data(), k.data(), d);
#if CERTATTN_PORTABLE_SIMD
      EXPECT_EQ(bits(detail::portable::score_dot(q.data(), k.data(), d)), bits(want)) << "d " << d;
#endif
      for (isa a : {isa::kScalar, isa::kAvx2, isa::kAvx512Vnni}) {
        if (!has(a)) continue;
        EXPECT_EQ(bits(detail::score_dot_fast(q.data(), k.data(), d, a)), bits(want))
            << "d " << d << " isa " << certattn::to_string(a);
      }
    }
  }
}
TEST(ScoreDot, PortableAndVectorEqualScalarHalf) { check_score_dot<half>(11); }
TEST(ScoreDot, PortableAndVectorEqualScalarBfloat16) { check_score_dot<bfloat16>(12); }
TEST(ScoreDot, PortableAndVectorEqualScalarFloat) { check_score_dot<float>(13); }

// ---- value accumulation ------------------------------------------------------------------
template <class T>
void check_accumulate(std::uint64_t seed) {
  rng r{seed};
  for (std::size_t d : kDims) {
    for (int rep = 0; rep < 6; ++rep) {
      const auto v = random_row<T>(r, d, -10, 8);
      std::vector<double> acc0(d), g(d);
      for (auto& x : acc0) x = double(r.spread(-20, 4)) * (1.0 + r.uniform() * 0x1p-30);
      for (auto& x : g) x = double(r.spread(-6, 6)) / 3.0;  // not a float: y = v - g rounds
      const double w = r.uniform() * 3.0 + 0x1p-40;
      std::vector<double> want = acc0;
      const double sq = detail::accumulate_row_scalar(v.data(), d, w, want.data());
      std::vector<double> want_c = acc0;
      const auto nc = detail::accumulate_centered_row_scalar(v.data(), d, w, g.data(), want_c.data());
      for (isa a : {isa::kScalar, isa::kAvx2, isa::kAvx512Vnni}) {
        if (!has(a)) continue;
        std::vector<double> got = acc0;
        EXPECT_EQ(bits(detail::accumulate_row(v.data(), d, w, got.data(), a)), bits(sq))
            << "d " << d << " isa " << certattn::to_string(a);
        for (std::size_t i = 0; i < d; ++i)
          ASSERT_EQ(bits(got[i]), bits(want[i])) << "d " << d << " i " << i << " isa " << certattn::to_string(a);
        std::vector<double> got_c = acc0;
        const auto n = detail::accumulate_centered_row(v.data(), d, w, g.data(), got_c.data(), a);
        EXPECT_EQ(bits(n.sq), bits(nc.sq)) << "d " << d << " isa " << certattn::to_string(a);
        EXPECT_EQ(bits(n.centered_sq), bits(nc.centered_sq)) << "d " << d << " isa " << certattn::to_string(a);
        for (std::size_t i = 0; i < d; ++i)
          ASSERT_EQ(bits(got_c[i]), bits(want_c[i])) << "d " << d << " i " << i << " isa " << certattn::to_string(a);
      }
#if CERTATTN_PORTABLE_SIMD
      if (detail::portable::portable_has_fma) {  // the batch kernels themselves
        std::vector<double> got = acc0, got_c = acc0;
        EXPECT_EQ(bits(detail::portable::accumulate_row(v.data(), d, w, got.data())), bits(sq));
        EXPECT_EQ(got, want);
        double s1 = 0, s2 = 0;
        detail::portable::accumulate_centered_row(v.data(), d, w, g.data(), got_c.data(), &s1, &s2);
        EXPECT_EQ(bits(s1), bits(nc.sq));
        EXPECT_EQ(bits(s2), bits(nc.centered_sq));
        EXPECT_EQ(got_c, want_c);
      }
#endif
    }
  }
}
TEST(Accumulate, RowAndCenteredRowEqualScalarHalf) { check_accumulate<half>(21); }
TEST(Accumulate, RowAndCenteredRowEqualScalarBfloat16) { check_accumulate<bfloat16>(22); }
TEST(Accumulate, RowAndCenteredRowEqualScalarFloat) { check_accumulate<float>(23); }

// ---- perturbation bounds and candidates --------------------------------------------------
TEST(Perturbation, FillExp1UpperEqualsScalar) {
  for (std::uint64_t noise : {0ULL, 1ULL, 0x123456789abcdefULL, ~0ULL}) {
    for (std::size_t n : {0u, 1u, 3u, 15u, 16u, 17u, 100u, 4099u}) {
      std::vector<float> want(n), got(n, -1.0f);
      detail::fill_exp1_upper_scalar(noise, n, want.data());
      detail::fill_exp1_upper_portable(noise, n, got.data());
      for (std::size_t t = 0; t < n; ++t) ASSERT_EQ(bits(got[t]), bits(want[t])) << "n " << n << " t " << t;
#if CERTATTN_X86
      if (has(isa::kAvx512Vnni)) {
        std::fill(got.begin(), got.end(), -1.0f);
        detail::fill_exp1_upper_avx512(noise, n, got.data());
        for (std::size_t t = 0; t < n; ++t) ASSERT_EQ(bits(got[t]), bits(want[t])) << "avx512 n " << n;
      }
#endif
    }
  }
}

TEST(Perturbation, AddOffsetsUpperEqualsScalar) {
  rng r{31};
  const std::size_t n = 1000;
  std::vector<float> e(n), off(n);
  for (std::size_t t = 0; t < n; ++t) {
    e[t] = float(r.uniform() * 30.0);
    off[t] = r.spread(-30, 3);
  }
  // Cancellations to zero and sums that round exactly, up and down.
  off[0] = -e[0];
  off[1] = 0.0f;
  e[2] = 1.0f, off[2] = 0x1p-30f;
  e[3] = -1.0f, off[3] = 0x1p-30f;
  e[4] = -1.0f, off[4] = -0x1p-30f;
  e[5] = std::numeric_limits<float>::max(), off[5] = std::numeric_limits<float>::max();
  std::vector<float> want = e, got = e;
  detail::add_offsets_upper_scalar(want.data(), off.data(), n);
  detail::add_offsets_upper_portable(got.data(), off.data(), n);
  for (std::size_t t = 0; t < n; ++t) ASSERT_EQ(bits(got[t]), bits(want[t])) << "t " << t;
  for (std::size_t t = 0; t < n; ++t)  // rounded up: never below the exact sum
    ASSERT_GE(double(want[t]), double(e[t]) + double(off[t])) << "t " << t;
}

// The call's perturbation stage: E_up with the offsets folded in, fused on AVX-512 (its
// round-up add), equals the scalar fill followed by the scalar TwoSum addition, bit for
// bit, the edge cases of AddOffsetsUpperEqualsScalar included.
TEST(Perturbation, FusedBoundsEqualFillThenOffsets) {
  rng r{37};
  for (std::uint64_t noise : {0ULL, 0x9e3779b97f4a7c15ULL}) {
    for (std::size_t n : {0u, 1u, 15u, 16u, 17u, 1000u, 4099u}) {
      std::vector<float> off(n), want(n), got(n, -1.0f);
      for (std::size_t t = 0; t < n; ++t) off[t] = r.spread(-30, 3);
      detail::fill_exp1_upper_scalar(noise, n, want.data());
      std::vector<float> plain = want;
      if (n >= 5) {  // a cancellation to zero, sums that round exactly up and down, overflow
        off[0] = -plain[0];
        off[1] = 0.0f;
        off[2] = 0x1p-30f;
        off[3] = -0x1p-30f;
        off[4] = std::numeric_limits<float>::max();
      }
      detail::add_offsets_upper_scalar(want.data(), off.data(), n);
      detail::perturbation_bounds_portable(noise, n, off.data(), got.data());
      for (std::size_t t = 0; t < n; ++t) ASSERT_EQ(bits(got[t]), bits(want[t])) << "portable n " << n;
#if CERTATTN_X86
      if (has(isa::kAvx512Vnni)) {
        std::fill(got.begin(), got.end(), -1.0f);
        detail::perturbation_bounds_avx512(noise, n, off.data(), got.data());
        for (std::size_t t = 0; t < n; ++t) ASSERT_EQ(bits(got[t]), bits(want[t])) << "avx512 n " << n << " t " << t;
        std::fill(got.begin(), got.end(), -1.0f);
        detail::perturbation_bounds_avx512(noise, n, nullptr, got.data());
        for (std::size_t t = 0; t < n; ++t) ASSERT_EQ(bits(got[t]), bits(plain[t])) << "no offsets n " << n;
      }
#endif
    }
  }
}

TEST(Candidates, FindCandidatesEqualsScalar) {
  rng r{41};
  for (std::size_t n : {0u, 5u, 16u, 31u, 1000u, 4096u}) {
    for (int rep = 0; rep < 6; ++rep) {
      std::vector<float> u(n), e(n);
      for (std::size_t t = 0; t < n; ++t) {
        u[t] = float(r.uniform() * 20.0 - 10.0);
        e[t] = float(r.uniform() * 8.0);
      }
      detail::candidate_params p;
      p.c = float(r.uniform() * 4.0);
      p.slack = 0x1p-18f;
      p.threshold = float(-3.0 - r.uniform() * 6.0);
      p.upper = rep % 2 == 0 ? INFINITY : p.threshold + 2.5f;
      p.level_scale = float(-0.5 / std::log(2.0));
      p.min_level = rep % 3;
      p.max_level = 12;
      // +16 entries of slack, as the workspace keeps for the compressing stores.
      std::vector<std::uint32_t> idx0(n + 16), idx1(n + 16);
      std::vector<std::uint8_t> lvl0(n + 16), lvl1(n + 16);
      const std::size_t m0 = detail::find_candidates_scalar(u.data(), e.data(), n, p, idx0.data(), lvl0.data());
      const std::size_t m1 = detail::find_candidates_portable(u.data(), e.data(), n, p, idx1.data(), lvl1.data());
      ASSERT_EQ(m1, m0) << "n " << n;
      for (std::size_t i = 0; i < m0; ++i) {
        ASSERT_EQ(idx1[i], idx0[i]) << "n " << n << " i " << i;
        ASSERT_EQ(lvl1[i], lvl0[i]) << "n " << n << " i " << i;
      }
#if CERTATTN_X86
      if (has(isa::kAvx512Vnni)) {
        const std::size_t m2 = detail::find_candidates_avx512(u.data(), e.data(), n, p, idx1.data(), lvl1.data());
        ASSERT_EQ(m2, m0) << "avx512 n " << n;
        for (std::size_t i = 0; i < m0; ++i) {
          ASSERT_EQ(idx1[i], idx0[i]) << "avx512 n " << n << " i " << i;
          ASSERT_EQ(lvl1[i], lvl0[i]) << "avx512 n " << n << " i " << i;
        }
      }
#endif
    }
  }
}

// ---- the 8-bit refinement: block preparation and candidate dots --------------------------
TEST(Refine, PrepareBlockEqualsScalar) {
  rng r{51};
  for (std::size_t dp : {8u, 16u, 64u, 72u, 128u, 136u, 256u}) {
    for (int rep = 0; rep < 6; ++rep) {
      const auto q = random_row<float>(r, dp, -10, 6);
      auto st = random_row<float>(r, dp, -12, 0);
      for (auto& x : st) x = std::fabs(x);
      const std::size_t na = detail::refine_a_size(dp);
      std::vector<float> a0(na, 1.0f), a1(na, 2.0f);  // the padding slots must be zeroed
      const float off0 = detail::prepare_refine_block_scalar(q.data(), st.data(), dp, a0.data());
      const float off1 = detail::prepare_refine_block(q.data(), st.data(), dp, a1.data());
      EXPECT_EQ(bits(off1), bits(off0)) << "dp " << dp;
      for (std::size_t i = 0; i < na; ++i) ASSERT_EQ(bits(a1[i]), bits(a0[i])) << "dp " << dp << " i " << i;
      for (std::size_t i = 0; i < dp; ++i)  // channel i's slot holds q st8
        ASSERT_EQ(bits(a0[detail::refine_slot(i)]), bits(q[i] * detail::step8_of(st[i]))) << "dp " << dp;
      for (std::size_t i = dp; i < na; ++i) ASSERT_EQ(a0[detail::refine_slot(i)], 0.0f) << "dp " << dp;
#if CERTATTN_X86
      if (has(isa::kAvx512Vnni)) {
        std::vector<float> a2(na, 3.0f);
        const float off2 = detail::prepare_refine_block_avx512(q.data(), st.data(), dp, a2.data());
        EXPECT_EQ(bits(off2), bits(off0)) << "avx512 dp " << dp;
        for (std::size_t i = 0; i < na; ++i) ASSERT_EQ(bits(a2[i]), bits(a0[i])) << "avx512 dp " << dp;
      }
#endif
    }
  }
}

TEST(Refine, DotEqualsScalarOnEveryIsa) {
  rng r{61};
  for (std::size_t dp : {8u, 16u, 24u, 64u, 72u, 128u, 136u, 256u}) {
    for (int rep = 0; rep < 8; ++rep) {
      auto a = random_row<float>(r, detail::refine_a_size(dp), -20, 20);
      for (std::size_t i = dp; i < a.size(); ++i) a[detail::refine_slot(i)] = 0.0f;  // as prepared
      std::vector<std::uint8_t> code(dp / 2);  // low nibbles, two channels per byte
      for (auto& c : code) c = std::uint8_t(r.next() >> 56);
      const float want = detail::refine_dot_scalar(a.data(), code.data(), dp);
      EXPECT_EQ(bits(detail::refine_dot_portable(a.data(), code.data(), dp)), bits(want)) << "dp " << dp;
      for (isa which : {isa::kScalar, isa::kAvx2, isa::kAvx512Vnni}) {
        if (!has(which)) continue;
        const float* ap = a.data();
        const std::uint8_t* cp = code.data();
        float dot = 0.0f;
        detail::refine_dots(&ap, &cp, 1, dp, &dot, which);
        EXPECT_EQ(bits(dot), bits(want)) << "dp " << dp << " isa " << certattn::to_string(which);
      }
    }
  }
}

// ---- block scale maxima (exact in any order) ---------------------------------------------
TEST(ScanPrep, BlockScaleMaximaEqualScalar) {
  rng r{71};
  for (std::size_t dp : {8u, 16u, 24u, 64u, 136u, 256u}) {
    const auto lo = random_row<float>(r, dp, -10, 10);
    const auto st = random_row<float>(r, dp, -10, 10);
    const auto m = detail::block_scale_maxima(lo.data(), st.data(), dp);
    float wl = 0, ws = 0;
    for (std::size_t i = 0; i < dp; ++i) wl = std::max(wl, std::fabs(lo[i])), ws = std::max(ws, std::fabs(st[i]));
    EXPECT_EQ(bits(m.lo), bits(wl));
    EXPECT_EQ(bits(m.st), bits(ws));
    EXPECT_EQ(bits(detail::max_abs(lo.data(), dp)), bits(wl));
#if CERTATTN_X86
    if (has(isa::kAvx512Vnni)) {
      const auto v = detail::avx512::block_scale_maxima_avx512(lo.data(), st.data(), dp);
      EXPECT_EQ(bits(v.lo), bits(wl)) << "dp " << dp;
      EXPECT_EQ(bits(v.st), bits(ws)) << "dp " << dp;
      EXPECT_EQ(bits(detail::avx512::max_abs_avx512(lo.data(), dp)), bits(wl)) << "dp " << dp;
    }
#endif
  }
}

// ---- the dense chunk: the portable kernel against the scalar twin ------------------------
template <class T>
void check_dense_chunk(std::uint64_t seed) {
#if CERTATTN_PORTABLE_SIMD
  rng r{seed};
  constexpr std::size_t C = detail::dense_chunk_tokens;
  for (std::size_t d : {8u, 64u, 100u, 128u}) {
    for (std::size_t G : {1u, 4u}) {
      for (std::size_t n : {1u, 9u, 16u}) {
        const std::size_t qs = detail::dense_round16(d);
        std::vector<float> q(G * qs, 0.0f);
        for (std::size_t g = 0; g < G; ++g)
          for (std::size_t i = 0; i < d; ++i) q[g * qs + i] = r.spread(-6, 0);
        std::vector<std::vector<T>> keys, vals;
        std::vector<const void*> kr(qs + 16), vr(qs + 16);
        for (std::size_t t = 0; t < n; ++t) {
          keys.push_back(random_row<T>(r, d, -4, 2));
          vals.push_back(random_row<T>(r, d, -4, 2));
        }
        for (std::size_t t = 0; t < kr.size(); ++t) {
          kr[t] = keys[std::min(t, n - 1)].data();
          vr[t] = vals[std::min(t, n - 1)].data();
        }
        struct state {
          std::vector<float> scores, alpha, chunk, m, l, acc;
        } s[2];
        for (auto& x : s) {
          x.scores.assign(G * C, 0.0f);
          x.alpha.assign(G, 0.0f);
          x.chunk.assign((G + 1) * qs, 0.0f);
          x.m.assign(G, -INFINITY);
          x.l.assign(G, 0.0f);
          x.acc.assign(G * d, 0.0f);
        }
        for (int k = 0; k < 2; ++k) {
          for (int pass = 0; pass < 2; ++pass) {  // two chunks: the rescaling runs too
            detail::dense_chunk_args a;
            a.queries = q.data();
            a.q_stride = qs;
            a.group = G;
            a.head_dim = d;
            a.key_rows = kr.data();
            a.value_rows = vr.data();
            a.n = n;
            a.scores = s[k].scores.data();
            a.alpha = s[k].alpha.data();
            a.chunk_acc = s[k].chunk.data();
            a.max_scores = s[k].m.data();
            a.sums = s[k].l.data();
            a.acc = s[k].acc.data();
            a.acc_stride = d;
            a.rows_ahead = kr.size();
            a.prefetch_distance = pass;
            if (k == 0)
              detail::scalar::dense_chunk<T>(a);
            else
              detail::portable::dense_chunk<T>(a);
          }
        }
        for (std::size_t g = 0; g < G; ++g) {
          EXPECT_NEAR(s[1].m[g], s[0].m[g], 1e-5f * std::max(1.0f, std::fabs(s[0].m[g])));
          EXPECT_NEAR(s[1].l[g], s[0].l[g], 1e-5f * s[0].l[g]);
          for (std::size_t i = 0; i < d; ++i)
            ASSERT_NEAR(s[1].acc[g * d + i], s[0].acc[g * d + i], 1e-5f * s[0].l[g] * 4.0f)
                << "d " << d << " G " << G << " n " << n;
        }
      }
    }
  }
#else
  (void)seed;
  GTEST_SKIP() << "no batch type for this target";
#endif
}
TEST(DenseChunk, PortableMatchesScalarHalf) { check_dense_chunk<half>(81); }
TEST(DenseChunk, PortableMatchesScalarBfloat16) { check_dense_chunk<bfloat16>(82); }
TEST(DenseChunk, PortableMatchesScalarFloat) { check_dense_chunk<float>(83); }

}  // namespace
