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
// that the cache (>= 256 MiB) cannot stay in the 32 MiB L3: every call streams from DRAM,
// as a decode step does. Arguments: G, n_tokens, isa (0 scalar, 1 avx2, 2 avx512),
// element type (0 fp16, 1 bf16, 2 fp32). Times are CPU times (the machine may be shared).
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
#include <vector>

#include <certattn/arch/macros.hpp>  // CERTATTN_X86 and the kernel attributes

namespace {

using certattn::isa;

struct free_deleter {
  void operator()(void* p) const noexcept { std::free(p); }
};

template <class T>
std::unique_ptr<T[], free_deleter> alloc_random(std::size_t count, std::uint64_t seed) {
  const std::size_t bytes = (count * sizeof(T) + 4095) / 4096 * 4096;
  T* p = static_cast<T*>(std::aligned_alloc(4096, bytes));
  // A cheap generator: filling hundreds of MiB with <random> would dominate the run.
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::size_t i = 0; i < count; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = T(float(std::int64_t(x >> 40) - (1 << 23)) * (1.0f / float(1 << 23)));
  }
  return std::unique_ptr<T[], free_deleter>(p);
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
  const std::size_t per_head = n * d, min_bytes = std::size_t(256) << 20;
  std::size_t heads = (min_bytes + 2 * per_head * sizeof(T) - 1) / (2 * per_head * sizeof(T));
  heads = heads < 1 ? 1 : heads;
  auto keys = alloc_random<T>(heads * per_head, 2);
  auto values = alloc_random<T>(heads * per_head, 3);
  std::vector<float> q(G * d), out(G * d);
  std::mt19937 rng(4);
  std::normal_distribution<float> N(0.0f, 1.0f);
  for (float& x : q) x = N(rng);
  certattn::dense_workspace ws(G, d);
  std::size_t h = 0;
  for (auto _ : state) {
    const auto kv = certattn::hnd_view(keys.get(), values.get(), n, n, heads, d, h);
    certattn::dense_attend(q, G, kv, 0.0f, out, ws);
    benchmark::DoNotOptimize(out.data());
    h = h + 1 == heads ? 0 : h + 1;
  }
  certattn::set_isa_cap(isa::kAvx512Vnni);
  const double bytes = double(2 * per_head * sizeof(T));
  state.counters["ns_per_token"] =
      benchmark::Counter(double(n) * 1e-9, benchmark::Counter::kIsIterationInvariantRate |
                                               benchmark::Counter::kInvert);
  state.counters["GBps"] =
      benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void dense_hnd(benchmark::State& state) {
  switch (state.range(3)) {
    case 0:
      dense_hnd_impl<certattn::half>(state);
      break;
    case 1:
      dense_hnd_impl<certattn::bfloat16>(state);
      break;
    default:
      dense_hnd_impl<float>(state);
      break;
  }
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
}
BENCHMARK(dense_hnd)->Apply(hnd_args)->Unit(benchmark::kMicrosecond)->MinTime(1.0);

// Cache-resident: one head of 1024 tokens (512 KiB at fp16), the same every call, so the
// kernel's arithmetic is measured without DRAM.
void dense_hot(benchmark::State& state) {
  using T = certattn::half;
  const std::size_t G = std::size_t(state.range(0)), n = 1024, d = 128;
  if (!set_isa(state, int(state.range(1)))) return;
  auto keys = alloc_random<T>(n * d, 2);
  auto values = alloc_random<T>(n * d, 3);
  std::vector<float> q(G * d, 0.1f), out(G * d);
  certattn::dense_workspace ws(G, d);
  const auto kv = certattn::hnd_view(keys.get(), values.get(), n, n, 1, d, 0);
  for (auto _ : state) {
    certattn::dense_attend(q, G, kv, 0.0f, out, ws);
    benchmark::DoNotOptimize(out.data());
  }
  certattn::set_isa_cap(isa::kAvx512Vnni);
  state.counters["ns_per_token"] =
      benchmark::Counter(double(n) * 1e-9, benchmark::Counter::kIsIterationInvariantRate |
                                               benchmark::Counter::kInvert);
}
BENCHMARK(dense_hot)
    ->ArgNames({"G", "isa"})
    ->ArgsProduct({{1, 4, 8}, {2}})
    ->Args({4, 1})
    ->Args({4, 0})
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
