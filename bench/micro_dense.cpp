// Microbenchmark of the dense kernel (exact attention, the certified call's baseline and
// fallback) and of the machine's single-thread read bandwidth, which bounds it at G = 1.
//
//   micro_dense --benchmark_filter=read_bandwidth    streaming AVX-512 sum over 1 GiB
//   micro_dense --benchmark_filter=scattered_rows    rows at random places, as the level loop
//   micro_dense --benchmark_filter=dense_hnd         one KV head per call, head-major cache
//   micro_dense --benchmark_filter=dense_nhd_layer   all 8 KV heads of a token-major layer
//   micro_dense --benchmark_filter=dense_hot         1024 tokens in L2 (arithmetic only)
//   micro_dense --benchmark_filter=dense_paged       pages of 16 tokens, shuffled
//
// Counters: ns_per_token (per KV head and token: the whole group's work on one K and one V
// row), GBps (cache bytes read per second). The head-major runs cycle over enough heads
// that the cache (>= 256 MiB) cannot stay in a 32 MiB L3: every call streams from DRAM,
// as a decode step does (a 480 MiB L3, as on the Sapphire Rapids guests, keeps part of it). Arguments: G, n_tokens, isa (0 scalar, 1 avx2, 2 avx512),
// element type (0 fp16, 1 bf16, 2 fp32, 3 q8_0, 4 q4_0, 5 fp8_e4m3, 6 fp8_e5m2; GBps counts
// the format's own bytes). Times are CPU times (the machine may be shared).
// In the tree it is part of certattn-micro (bench/CMakeLists.txt globs bench/micro_*.cpp).
// Alone:
//   g++ -std=c++20 -O2 -Iinclude -I/usr/include/eigen3 bench/micro_dense.cpp -o micro_dense
//       -lbenchmark_main -lbenchmark -lpthread
#include <certattn/dense.hpp>
#include <certattn/memory.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <type_traits>
#include <vector>

#include <certattn/arch/macros.hpp>  // CERTATTN_X86 and the kernel attributes

namespace {

using certattn::isa;

// Buffers as the library allocates its own and the bench its caches: on huge pages where
// the kernel allows (TLB misses would otherwise dominate a stream over 256 MiB).
struct free_deleter {
  std::size_t bytes = 0;
  void operator()(void* p) const noexcept { certattn::detail::free_large(p, bytes); }
};

template <class T>
std::unique_ptr<T[], free_deleter> alloc_random(std::size_t count, std::uint64_t seed) {
  const std::size_t bytes = count * sizeof(T);
  T* p = static_cast<T*>(certattn::detail::allocate_large(bytes));
  // A cheap generator: filling hundreds of MiB with <random> would dominate the run.
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::size_t i = 0; i < count; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = T(float(std::int64_t(x >> 40) - (1 << 23)) * (1.0f / float(1 << 23)));
  }
  return std::unique_ptr<T[], free_deleter>(p, free_deleter{bytes});
}

// A quantized cache of `units` storage units (blocks or fp8 codes) filled with random codes
// directly (quantizing hundreds of MiB of floats would dominate the run): block scales of
// 2^-14..2^-8 (normal fp16); fp8 codes of values in (-1, 1), e4m3's with a view scale.
constexpr float kFp8Scale = 1.0f / 256.0f;
template <certattn::quantized_element T>
std::unique_ptr<T[], free_deleter> alloc_random_codes(std::size_t units, std::uint64_t seed) {
  const std::size_t bytes = units * sizeof(T);
  T* p = static_cast<T*>(certattn::detail::allocate_large(bytes));
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&x] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  for (std::size_t i = 0; i < units; ++i) {
    if constexpr (std::is_same_v<T, certattn::block_q8_0> ||
                  std::is_same_v<T, certattn::block_q4_0>) {
      p[i].d = certattn::half(float(1 + next() % 64) * 0x1p-14f);
      for (auto& q : p[i].qs) q = static_cast<std::remove_reference_t<decltype(q)>>(next() >> 56);
    } else {
      // The code of a value uniform in (-1, 1) (/ kFp8Scale for e4m3), through its fp16
      // bits, truncated: what a cache scaled to its range holds (values far below the
      // range's top are rare, and their codes are zero here).
      const float v = float(std::int64_t(next() >> 40) - (1 << 23)) * (1.0f / float(1 << 23));
      std::uint16_t h;
      const certattn::half hv(std::is_same_v<T, certattn::fp8_e4m3> ? v / kFp8Scale : v);
      std::memcpy(&h, &hv, 2);
      if constexpr (std::is_same_v<T, certattn::fp8_e4m3>) {
        const int e = int((h >> 10) & 31) - 8;  // e4m3's exponent field
        p[i].bits = std::uint8_t(((h >> 8) & 0x80) | (e >= 1 ? (e << 3) | ((h >> 7) & 7) : 0));
      } else {
        p[i].bits = std::uint8_t(h >> 8);
      }
    }
  }
  return std::unique_ptr<T[], free_deleter>(p, free_deleter{bytes});
}

/// `rows` rows of head_dim channels of T: floats rounded to T, or random codes.
template <class T>
std::unique_ptr<T[], free_deleter> alloc_cache(std::size_t head_dim, std::size_t rows,
                                               std::uint64_t seed) {
  if constexpr (certattn::quantized_element<T>)
    return alloc_random_codes<T>(certattn::format_traits<T>::units(head_dim) * rows, seed);
  else
    return alloc_random<T>(head_dim * rows, seed);
}

/// The element type of the benches' `type` argument: 0 fp16, 1 bf16, 2 fp32, 3 q8_0,
/// 4 q4_0, 5 fp8_e4m3, 6 fp8_e5m2.
template <class F>
void with_type(long type, F&& f) {
  switch (type) {
    case 0: f(certattn::half{}); break;
    case 1: f(certattn::bfloat16{}); break;
    case 2: f(float{}); break;
    case 3: f(certattn::block_q8_0{}); break;
    case 4: f(certattn::block_q4_0{}); break;
    case 5: f(certattn::fp8_e4m3{}); break;
    default: f(certattn::fp8_e5m2{}); break;
  }
}

/// The view with e4m3's scale (the codes were made for it).
template <class T>
certattn::strided_kv<T> with_fp8_scales(const certattn::strided_kv<T>& kv) {
  if constexpr (std::is_same_v<T, certattn::fp8_e4m3>)
    return kv.with_scales({kFp8Scale, kFp8Scale});
  else
    return kv;
}

// ---------------------------------------------------------------------------------------
// Read bandwidth: the roof for the G = 1 kernel.

#if CERTATTN_X86
// GCC 12 bug 105593: -Wuninitialized inside inlined AVX-512 intrinsics.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
CERTATTN_TARGET_AVX512 float stream_sum_avx512(const float* p, std::size_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (std::size_t i = 0; i < n; i += 64) {
    a0 = _mm512_add_ps(a0, _mm512_load_ps(p + i));
    a1 = _mm512_add_ps(a1, _mm512_load_ps(p + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_load_ps(p + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_load_ps(p + i + 48));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}
#pragma GCC diagnostic pop
#endif

void read_bandwidth(benchmark::State& state) {
#if CERTATTN_X86
  if (certattn::detected_isa() != isa::kAvx512Vnni) {
    state.SkipWithError("needs AVX-512");
    return;
  }
  const std::size_t n = (std::size_t(1) << 30) / sizeof(float);
  auto buf = alloc_random<float>(n, 1);
  for (auto _ : state) benchmark::DoNotOptimize(stream_sum_avx512(buf.get(), n));
  state.SetBytesProcessed(std::int64_t(state.iterations()) * std::int64_t(n * sizeof(float)));
  state.counters["GBps"] = benchmark::Counter(double(n * sizeof(float)) * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
#else
  state.SkipWithError("x86 only");
#endif
}
BENCHMARK(read_bandwidth)->Unit(benchmark::kMillisecond)->MinTime(2.0);

// ---------------------------------------------------------------------------------------
// Scattered rows: what the certified call's level loop reads. 20,000 rows of `row` bytes at
// random places of a region of `region` MiB (on huge pages, as the index and the bench's
// caches are), each prefetched 16 rows ahead (as the level loop does) and summed; 64 MiB
// read before each batch, as certattn-bench speed does before a call. The time per row
// is the floor of a stage that reads scattered rows, whatever their bytes: on a machine
// where it does not grow with the row, a row costs what its address does (translation,
// the DRAM page), not what its bytes take at the streaming bandwidth.

void scattered_rows(benchmark::State& state) {
  const std::size_t region = std::size_t(state.range(0)) << 20, row = std::size_t(state.range(1));
  constexpr std::size_t kRows = 20000, kAhead = 16;
  certattn::large_vector<std::uint64_t> buf(region / 8, 1), flush((std::size_t(64) << 20) / 8, 1);
  std::vector<std::uint32_t> at(kRows);
  std::mt19937_64 rng(7);
  const std::size_t n_rows = region / row;
  std::uint64_t acc = 0;
  double seconds = 0.0;  // the rows' own time (the flush is paused out of state's too)
  for (auto _ : state) {
    state.PauseTiming();
    for (std::uint32_t& t : at) t = std::uint32_t(rng() % n_rows);
    for (std::size_t i = 0; i < flush.size(); i += 8) acc += flush[i];
    state.ResumeTiming();
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < kRows; ++i) {
      if (i + kAhead < kRows) {
        const char* ahead = reinterpret_cast<const char*>(buf.data()) + at[i + kAhead] * row;
        for (std::size_t o = 0; o < row; o += 64) __builtin_prefetch(ahead + o);
      }
      const std::uint64_t* p = buf.data() + at[i] * row / 8;
      for (std::size_t o = 0; o < row / 8; o += 8) acc += p[o];
    }
    benchmark::DoNotOptimize(acc);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double rows = double(kRows) * double(state.iterations());
  state.counters["ns_per_row"] = seconds > 0.0 ? seconds * 1e9 / rows : 0.0;
  state.counters["GBps"] = seconds > 0.0 ? rows * double(row) * 1e-9 / seconds : 0.0;
}
BENCHMARK(scattered_rows)
    ->ArgNames({"region_mib", "row"})
    ->ArgsProduct({{16, 64, 256, 1024}, {64, 128, 256}})
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.5);

// ---------------------------------------------------------------------------------------
// One KV head per call, head-major cache.

bool set_isa(benchmark::State& state, int level) {
  const isa a = isa(level);
  if (int(certattn::detected_isa()) < level) {
    state.SkipWithError("CPU lacks this ISA");
    return false;
  }
  certattn::set_isa_cap(a);
  return true;
}

template <class T>
void dense_hnd_impl(benchmark::State& state) {
  const std::size_t G = std::size_t(state.range(0)), n = std::size_t(state.range(1)), d = 128;
  if (!set_isa(state, int(state.range(2)))) return;
  const std::size_t units = certattn::format_traits<T>::units(d);
  const std::size_t head_bytes = 2 * n * certattn::format_traits<T>::row_bytes(d), min_bytes = std::size_t(256) << 20;
  const std::size_t heads = std::max<std::size_t>(1, (min_bytes + head_bytes - 1) / head_bytes);
  auto keys = alloc_cache<T>(d, heads * n, 2);
  auto values = alloc_cache<T>(d, heads * n, 3);
  std::vector<float> q(G * d), out(G * d);
  std::mt19937 rng(4);
  std::normal_distribution<float> N(0.0f, 1.0f);
  for (float& x : q) x = N(rng);
  certattn::dense_workspace ws(G, d);
  std::size_t h = 0;
  for (auto _ : state) {
    const auto kv = with_fp8_scales(certattn::strided_kv<T>(
        keys.get() + h * n * units, values.get() + h * n * units, n, d, units, units));
    certattn::dense_attend(q, G, kv, 0.0f, out, ws);
    benchmark::DoNotOptimize(out.data());
    h = h + 1 == heads ? 0 : h + 1;
  }
  certattn::set_isa_cap(isa::kAvx512Vnni);
  state.counters["ns_per_token"] =
      benchmark::Counter(double(n) * 1e-9, benchmark::Counter::kIsIterationInvariantRate |
                                               benchmark::Counter::kInvert);
  state.counters["GBps"] =
      benchmark::Counter(double(head_bytes) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void dense_hnd(benchmark::State& state) {
  with_type(state.range(3), [&state](auto t) { dense_hnd_impl<decltype(t)>(state); });
}

void hnd_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"G", "n", "isa", "type"});
  for (long n : {32768L, 131072L})
    for (long G : {1L, 4L, 8L}) b->Args({G, n, 2, 0});
  for (long G : {1L, 4L}) {
    b->Args({G, 32768, 2, 1});  // bf16
    b->Args({G, 32768, 2, 2});  // fp32
    b->Args({G, 32768, 1, 0});  // AVX2
    b->Args({G, 32768, 0, 0});  // scalar
  }
  for (long n : {32768L, 131072L})
    for (long type : {3L, 4L, 5L, 6L}) b->Args({4, n, 2, type});  // the quantized formats
}
BENCHMARK(dense_hnd)->Apply(hnd_args)->Unit(benchmark::kMicrosecond)->MinTime(1.0);

// Cache-resident: one head of 1024 tokens (512 KiB at fp16), the same every call, so the
// kernel's arithmetic is measured without DRAM. Arguments: G, isa, element type.
template <class T>
void dense_hot_impl(benchmark::State& state) {
  const std::size_t G = std::size_t(state.range(0)), n = 1024, d = 128;
  if (!set_isa(state, int(state.range(1)))) return;
  const std::size_t units = certattn::format_traits<T>::units(d);
  auto keys = alloc_cache<T>(d, n, 2);
  auto values = alloc_cache<T>(d, n, 3);
  std::vector<float> q(G * d, 0.1f), out(G * d);
  certattn::dense_workspace ws(G, d);
  const auto kv = with_fp8_scales(certattn::strided_kv<T>(keys.get(), values.get(), n, d, units, units));
  for (auto _ : state) {
    certattn::dense_attend(q, G, kv, 0.0f, out, ws);
    benchmark::DoNotOptimize(out.data());
  }
  certattn::set_isa_cap(isa::kAvx512Vnni);
  state.counters["ns_per_token"] =
      benchmark::Counter(double(n) * 1e-9, benchmark::Counter::kIsIterationInvariantRate |
                                               benchmark::Counter::kInvert);
}
void dense_hot(benchmark::State& state) {
  with_type(state.range(2), [&state](auto t) { dense_hot_impl<decltype(t)>(state); });
}
BENCHMARK(dense_hot)
    ->ArgNames({"G", "isa", "type"})
    ->ArgsProduct({{1, 4, 8}, {2}, {0}})
    ->ArgsProduct({{1, 4}, {2}, {3, 4, 5, 6}})
    ->Args({4, 1, 0})
    ->Args({4, 0, 0})
    ->Args({4, 1, 3})
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.5);

// A paged cache (pages of 16 tokens in shuffled order, FlashInfer's HND page layout),
// against dense_hnd at the same size: the cost of the block-table walk.
void dense_paged(benchmark::State& state) {
  using T = certattn::half;
  const std::size_t G = std::size_t(state.range(0)), n = std::size_t(state.range(1)), d = 128,
                    page = 16, H = 8;
  const std::size_t pages = n / page * H;  // H sequences' worth of pages, > L3
  auto keys = alloc_random<T>(pages * page * d, 2);
  auto values = alloc_random<T>(pages * page * d, 3);
  std::vector<std::int32_t> table(pages);
  for (std::size_t i = 0; i < pages; ++i) table[i] = std::int32_t(i);
  std::shuffle(table.begin(), table.end(), std::mt19937(1));
  std::vector<float> q(G * d, 0.1f), out(G * d);
  certattn::dense_workspace ws(G, d);
  std::size_t h = 0;
  for (auto _ : state) {
    const certattn::paged_kv<T> kv(
        keys.get(), values.get(),
        std::span<const std::int32_t>(table).subspan(h * (n / page), n / page), n, page, d,
        page * d, d, 0);
    certattn::dense_attend(q, G, kv, 0.0f, out, ws);
    benchmark::DoNotOptimize(out.data());
    h = h + 1 == H ? 0 : h + 1;
  }
  state.counters["ns_per_token"] =
      benchmark::Counter(double(n) * 1e-9, benchmark::Counter::kIsIterationInvariantRate |
                                               benchmark::Counter::kInvert);
  state.counters["GBps"] = benchmark::Counter(double(2 * n * d * sizeof(T)) * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(dense_paged)
    ->ArgNames({"G", "n"})
    ->Args({1, 32768})
    ->Args({4, 32768})
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(1.0);

// ---------------------------------------------------------------------------------------
// All KV heads of a token-major layer in one pass.

void dense_nhd_layer(benchmark::State& state) {
  using T = certattn::half;
  const std::size_t G = std::size_t(state.range(0)), n = std::size_t(state.range(1)), d = 128,
                    H = 8;
  if (!set_isa(state, int(state.range(2)))) return;
  auto keys = alloc_random<T>(n * H * d, 5);
  auto values = alloc_random<T>(n * H * d, 6);
  std::vector<float> q(H * G * d), out(H * G * d);
  std::mt19937 rng(7);
  std::normal_distribution<float> N(0.0f, 1.0f);
  for (float& x : q) x = N(rng);
  certattn::dense_workspace ws(G, d, H);
  for (auto _ : state) {
    certattn::dense_attend_nhd_layer<T>(q, H, G, keys.get(), values.get(), n, d, 0.0f, out, ws);
    benchmark::DoNotOptimize(out.data());
  }
  certattn::set_isa_cap(isa::kAvx512Vnni);
  // Per KV head and token, comparable with dense_hnd.
  state.counters["ns_per_token"] =
      benchmark::Counter(double(n * H) * 1e-9, benchmark::Counter::kIsIterationInvariantRate |
                                                   benchmark::Counter::kInvert);
  state.counters["GBps"] = benchmark::Counter(double(2 * n * H * d * sizeof(T)) * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(dense_nhd_layer)
    ->ArgNames({"G", "n", "isa"})
    ->Args({1, 32768, 2})
    ->Args({4, 32768, 2})
    ->Args({1, 131072, 2})
    ->Args({4, 131072, 2})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(1.0);

// For comparison with the layer pass: one strided NHD view per head (8 separate passes).
void dense_nhd_per_head(benchmark::State& state) {
  using T = certattn::half;
  const std::size_t G = std::size_t(state.range(0)), n = std::size_t(state.range(1)), d = 128,
                    H = 8;
  auto keys = alloc_random<T>(n * H * d, 5);
  auto values = alloc_random<T>(n * H * d, 6);
  std::vector<float> q(G * d), out(G * d);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = float(i % 7) * 0.1f;
  certattn::dense_workspace ws(G, d);
  for (auto _ : state) {
    for (std::size_t h = 0; h < H; ++h) {
      certattn::dense_attend(q, G, certattn::nhd_view(keys.get(), values.get(), n, H, d, h), 0.0f,
                             out, ws);
      benchmark::DoNotOptimize(out.data());
    }
  }
  state.counters["ns_per_token"] =
      benchmark::Counter(double(n * H) * 1e-9, benchmark::Counter::kIsIterationInvariantRate |
                                                   benchmark::Counter::kInvert);
}
BENCHMARK(dense_nhd_per_head)
    ->ArgNames({"G", "n"})
    ->Args({1, 131072})
    ->Args({4, 131072})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(1.0);

}  // namespace
