// Microbenchmark of the kernels the dispatch runs per token or per candidate, each as its
// scalar twin, the portable xsimd kernel (arch/portable.hpp, compiled for this build's
// target: SSE2 by default on x86-64, NEON on aarch64, AVX-512 under -march=native on an
// AVX-512 machine) and the hand-written AVX2 / AVX-512 kernel where one exists. Data sit
// in L1/L2: this measures arithmetic, not memory. Counter: ns per call.
//
//   certattn-micro --benchmark_filter='^kernel/'
// Against xsimd at the hand-written kernels' own width (the question whether they could be
// xsimd too), build this file alone with -march=native:
//   g++ -std=c++20 -O3 -march=native -Iinclude -I/usr/include/eigen3 bench/micro_kernels.cpp
//       -o micro_kernels -lbenchmark_main -lbenchmark -lpthread
#include <certattn/arch/candidate_kernels.hpp>
#include <certattn/arch/portable.hpp>
#include <certattn/arch/refine_kernels.hpp>
#include <certattn/arch/score_dot.hpp>

#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include <certattn/arch/macros.hpp>  // CERTATTN_X86 and the kernel attributes

namespace {

using certattn::half;
using certattn::isa;
namespace detail = certattn::detail;

// Variants: 0 scalar twin, 1 portable (xsimd), 2 AVX2, 3 AVX-512 (hand-written).
bool variant_available(long v) {
  if (v == 1) return CERTATTN_PORTABLE_SIMD;
  if (v == 2) return int(certattn::detected_isa()) >= int(isa::kAvx2);
  if (v == 3) return int(certattn::detected_isa()) >= int(isa::kAvx512Vnni);
  return true;
}

std::vector<float> random_floats(std::size_t n, std::uint64_t seed, float scale) {
  std::vector<float> v(n);
  for (auto& x : v) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    x = (float(seed >> 40) * 0x1p-24f - 0.5f) * scale;
  }
  return v;
}

// Exact score of one fp16 key, d = 128 (the level loop's per-candidate score).
void score_dot(benchmark::State& st) {
  const long v = st.range(0);
  if (!variant_available(v) || v == 2) return st.SkipWithError("not available");
  const std::size_t d = 128;
  const auto q = random_floats(d, 1, 1.0f);
  std::vector<half> k(d);
  for (std::size_t i = 0; i < d; ++i) k[i] = half(q[(i * 7) % d]);
  for (auto _ : st) {
    double s = 0;
    if (v == 0) s = detail::score_dot(q.data(), k.data(), d);
#if CERTATTN_PORTABLE_SIMD
    if (v == 1) s = detail::portable::score_dot(q.data(), k.data(), d);
#endif
#if CERTATTN_X86
    if (v == 3) s = detail::score_dot_avx512(q.data(), k.data(), d);
#endif
    benchmark::DoNotOptimize(s);
  }
}
BENCHMARK(score_dot)->Name("kernel/score_dot")->ArgName("variant")->DenseRange(0, 3);

// One value row into the double accumulator, d = 128 fp16 (per sampled token).
void accumulate_row(benchmark::State& st) {
  const long v = st.range(0);
  if (!variant_available(v) || v == 2) return st.SkipWithError("not available");
  if (v == 1 && !detail::portable::portable_has_fma) return st.SkipWithError("no fma: scalar");
  const std::size_t d = 128;
  const auto f = random_floats(d, 2, 4.0f);
  std::vector<half> x(d);
  for (std::size_t i = 0; i < d; ++i) x[i] = half(f[i]);
  std::vector<double> acc(d, 0.0);
  for (auto _ : st) {
    double s = 0;
    if (v == 0) s = detail::accumulate_row_scalar(x.data(), d, 0.25, acc.data());
#if CERTATTN_PORTABLE_SIMD
    if (v == 1) s = detail::portable::accumulate_row(x.data(), d, 0.25, acc.data());
#endif
#if CERTATTN_X86
    if (v == 3) s = detail::accumulate_row_avx512(x.data(), d, 0.25, acc.data());
#endif
    benchmark::DoNotOptimize(s);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(accumulate_row)->Name("kernel/accumulate_row")->ArgName("variant")->DenseRange(0, 3);

// The nested 8-bit refinement dot of one candidate (its low nibbles), padded_dim = 128.
void refine_dot(benchmark::State& st) {
  const long v = st.range(0);
  if (!variant_available(v)) return st.SkipWithError("not available");
  if (v == 1 && !detail::portable::portable_has_fma) return st.SkipWithError("no fma: scalar");
  const std::size_t dp = 128;
  const auto a = random_floats(dp, 3, 1.0f);
  std::vector<std::uint8_t> code(dp / 2);  // low nibbles, two channels per byte
  for (std::size_t i = 0; i < dp / 2; ++i) code[i] = std::uint8_t(i * 37);
  for (auto _ : st) {
    float s = 0;
    if (v == 0) s = detail::refine_dot_scalar(a.data(), code.data(), dp);
#if CERTATTN_PORTABLE_SIMD
    if (v == 1) s = detail::portable::refine_dot(a.data(), code.data(), dp);
#endif
#if CERTATTN_X86
    if (v == 2) s = detail::refine_dot_avx2(a.data(), code.data(), dp);
    if (v == 3) s = detail::refine_dot_avx512(a.data(), code.data(), dp);
#endif
    benchmark::DoNotOptimize(s);
  }
}
BENCHMARK(refine_dot)->Name("kernel/refine_dot")->ArgName("variant")->DenseRange(0, 3);

// Perturbation bounds of 4096 tokens (once per call, shared by the group).
void fill_exp1_upper(benchmark::State& st) {
  const long v = st.range(0);
  if (!variant_available(v) || v == 2) return st.SkipWithError("not available");
  if (v == 1 && !detail::portable::portable_has_fma) return st.SkipWithError("no fma: scalar");
  const std::size_t n = 4096;
  std::vector<float> e(n);
  for (auto _ : st) {
    if (v == 0) detail::fill_exp1_upper_scalar(12345, n, e.data());
    if (v == 1) detail::fill_exp1_upper_portable(12345, n, e.data());
#if CERTATTN_X86
    if (v == 3) detail::fill_exp1_upper_avx512(12345, n, e.data());
#endif
    benchmark::ClobberMemory();
  }
}
BENCHMARK(fill_exp1_upper)->Name("kernel/fill_exp1_upper")->ArgName("variant")->DenseRange(0, 3);

// Candidate selection over 4096 tokens, about 2% kept.
void find_candidates(benchmark::State& st) {
  const long v = st.range(0);
  if (!variant_available(v) || v == 2) return st.SkipWithError("not available");
  if (v == 1 && !detail::portable::portable_has_fma) return st.SkipWithError("no fma: scalar");
  const std::size_t n = 4096;
  const auto u = random_floats(n, 4, 20.0f);
  const auto e = random_floats(n, 5, 2.0f);
  detail::candidate_params p;
  p.threshold = 8.0f;
  p.upper = INFINITY;
  p.level_scale = -1.0f;
  p.max_level = 12;
  std::vector<std::uint32_t> idx(n + 16);
  std::vector<std::uint8_t> lvl(n + 16);
  for (auto _ : st) {
    std::size_t m = 0;
    if (v == 0) m = detail::find_candidates_scalar(u.data(), e.data(), n, p, idx.data(), lvl.data());
    if (v == 1) m = detail::find_candidates_portable(u.data(), e.data(), n, p, idx.data(), lvl.data());
#if CERTATTN_X86
    if (v == 3) m = detail::find_candidates_avx512(u.data(), e.data(), n, p, idx.data(), lvl.data());
#endif
    benchmark::DoNotOptimize(m);
  }
}
BENCHMARK(find_candidates)->Name("kernel/find_candidates")->ArgName("variant")->DenseRange(0, 3);

}  // namespace
