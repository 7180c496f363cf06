// Microbenchmark of the 4-bit score-bound scan (scan_score_bounds), per instruction set.
//
//   certattn-micro --benchmark_filter=scan
//
// Arguments: n (context), G (query heads sharing the scan), isa (0 scalar, 1 avx2,
// 2 avx512_vnni, 3 avx512_vnni with AMX tile multiplies from 8 queries on, where the CPU has
// them), cold (0: one head's index, resident in L2/L3 after the first call;
// 1: cycles over enough heads that the codes (>= 64 MiB) stream from memory, as in a
// decode step). Counters: GB/s of index bytes the scan reads (4-bit codes, per-block
// scales, residual norms), keys/s (pool keys bounded per second, for one group).
#include "micro_common.hpp"

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cmath>
#include <string>
#include <vector>

namespace {

namespace syn = certattn::synthetic;
using certattn::isa;
using certattn::key_index;

void scan(benchmark::State& state) {
  const std::size_t n = std::size_t(state.range(0)), G = std::size_t(state.range(1));
  const bool amx = state.range(2) == 3;
  const isa which = amx ? isa::kAvx512Vnni : isa(state.range(2));
  const bool cold = state.range(3) != 0;
  if (int(certattn::detected_isa()) < int(which) || (amx && !certattn::detail::amx::available())) {
    state.SkipWithError("CPU lacks this ISA");
    return;
  }
  const std::size_t d = 128, window = 64, pool_end = n - window;
  const std::size_t heads = cold ? certattn::micro::cold_heads(n * d / 2) : 1;  // 4-bit codes
  const certattn::micro::layer_fixture& fx = certattn::micro::layer(n, heads);
  const std::size_t dp = fx.idx[0].padded_dim();
  const std::size_t blocks = (pool_end + key_index::kBlockTokens - 1) / key_index::kBlockTokens;
  std::vector<float> qpad(G * dp, 0.0f);
  const std::vector<float> q = syn::make_queries(fx.cache, 0, G, 0);
  for (std::size_t g = 0; g < G; ++g)
    for (std::size_t i = 0; i < d; ++i) qpad[g * dp + i] = q[g * d + i];
  std::vector<float> u(G * blocks * key_index::kBlockTokens + 16), block_max(G * blocks + 1);
  std::vector<std::int8_t> qa(certattn::scan_query_bytes(G, dp));
  std::vector<certattn::detail::block_query_prep> prep(G);

  certattn::scan_request r;
  r.queries = qpad.data();
  r.nq = G;
  r.softmax_scale = 1.0 / std::sqrt(double(d));
  r.pool_end = pool_end;
  r.u = u.data();
  r.u_stride = blocks * key_index::kBlockTokens;
  r.block_max = block_max.data();
  r.block_stride = blocks;
  r.qa = qa.data();
  r.prep = prep.data();

  certattn::set_isa_cap(which);
  certattn::detail::amx::set_enabled(amx);
  std::size_t h = 0;
  for (auto _ : state) {
    r.index = &fx.idx[h];
    certattn::scan_score_bounds(r, which);
    benchmark::DoNotOptimize(u.data());
    benchmark::ClobberMemory();
    h = h + 1 == heads ? 0 : h + 1;
  }
  certattn::set_isa_cap(isa::kAvx512Vnni);
  certattn::detail::amx::set_enabled(true);
  const double bytes = double(blocks) * double(fx.idx[0].block_code4_bytes() + key_index::kScaleRows * dp * sizeof(float) +
                                               key_index::kBlockTokens);
  const double iters = double(state.iterations());
  state.counters["GB/s"] = benchmark::Counter(bytes * iters, benchmark::Counter::kIsRate);
  state.counters["keys/s"] = benchmark::Counter(double(pool_end) * iters, benchmark::Counter::kIsRate);
  const bool tiles = amx && certattn::detail::amx::serves(G);
  state.SetLabel(std::string(certattn::to_string(which)) + (tiles ? " + amx" : "") +
                 (cold ? ", from memory" : ", cache-resident"));
}

void scan_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"n", "G", "isa", "cold"});
  for (long n : {16384L, 131072L})
    for (long a : {0L, 1L, 2L}) b->Args({n, 4, a, 0});
  for (long G : {1L, 8L}) b->Args({131072, G, 2, 0});
  for (long G : {1L, 2L, 4L, 8L, 16L, 32L})
    for (long a : {2L, 3L}) b->Args({131072, G, a, 0});
  for (long a : {1L, 2L, 3L}) b->Args({131072, 4, a, 1});
  for (long G : {1L, 8L, 12L, 16L, 32L})
    for (long a : {2L, 3L}) b->Args({131072, G, a, 1});
}
BENCHMARK(scan)->Apply(scan_args)->Unit(benchmark::kMicrosecond);

}  // namespace
