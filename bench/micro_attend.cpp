// Microbenchmarks of one GQA group call (G = 4 query heads, one KV head, head_dim 128) on a
// synthetic layer of 8 KV heads, mixed regime: the certified call and dense attention on
// the same heads and queries. Each iteration takes the next head (8 heads of K and V
// exceed the L3 at every context here, so the cache is read from memory, as in decoding);
// after a full cycle the decoding step advances (fresh queries and perturbations).
//
//   certattn-micro --benchmark_filter=attend_group   the certified call (its level loop is
//                                                    internal: measured as a whole)
//   certattn-micro --benchmark_filter=dense_group    dense_attend, the baseline
//
// Counters, per call: GB/s (attend_group: group_stats.bytes_read per second, i.e. codes,
// scales, refined 8-bit rows, exact keys and values; dense_group: K and V per second),
// dense_equiv_GB/s (K and V bytes of the group per second: the bandwidth dense attention
// would need to be as fast), keys_read (exact key rows per call, all G heads), candidates
// and refined (keys bucketed by the 4-bit bound, and 8-bit refinements, per call, all G
// heads), bytes_frac
// (bytes_read / dense_bytes), certified (fraction of query heads certified).
#include "micro_common.hpp"

#include <certattn/dense.hpp>

#include <benchmark/benchmark.h>

#include <map>
#include <span>
#include <vector>

namespace {

constexpr std::size_t kHeads = 8, kGroup = 4, kDim = 128, kSteps = 16;

/// Queries of kSteps decoding steps: [step][head][group][dim].
const std::vector<float>& queries(const certattn::micro::layer_fixture& fx) {
  static std::map<const void*, std::vector<float>> made;
  std::vector<float>& q = made[&fx];
  if (q.empty()) {
    q.resize(kSteps * kHeads * kGroup * kDim);
    for (std::size_t s = 0; s < kSteps; ++s)
      for (std::size_t h = 0; h < kHeads; ++h)
        certattn::synthetic::make_queries(
            fx.cache, h, kGroup, s,
            std::span<float>(q.data() + (s * kHeads + h) * kGroup * kDim, kGroup * kDim));
  }
  return q;
}

void attend_group(benchmark::State& state) {
  const std::size_t n = std::size_t(state.range(0));
  const auto& fx = certattn::micro::layer(n, kHeads);
  const auto& q = queries(fx);
  certattn::options opt;  // epsilon 0.1, delta 0.05, value scale
  opt.route = certattn::routing::kOff;  // the sparse path's kernels, whatever their cost
  certattn::attend_workspace ws(kGroup, kDim, n);
  std::vector<float> out(kGroup * kDim);
  std::vector<certattn::certificate> certs(kGroup);
  double bytes = 0, dense_bytes = 0, keys = 0, candidates = 0, refined = 0, certified = 0;
  std::size_t h = 0, s = 0;
  for (auto _ : state) {
    certattn::attend_group(std::span<const float>(q.data() + (s % kSteps * kHeads + h) * kGroup * kDim,
                                                  kGroup * kDim),
                           kGroup, fx.view(h), fx.idx[h],
                           certattn::noise_key{s, 0, std::uint32_t(h)}, opt, out, certs, ws);
    benchmark::DoNotOptimize(out.data());
    const certattn::group_stats& st = ws.last_stats();
    bytes += double(st.bytes_read);
    dense_bytes += double(st.dense_bytes);
    keys += double(st.keys_read);
    candidates += double(st.candidates);
    refined += double(st.refined);
    for (const auto& c : certs) certified += c.certified ? 1.0 : 0.0;
    if (++h == kHeads) {
      h = 0;
      ++s;
    }
  }
  using C = benchmark::Counter;
  state.counters["GB/s"] = C(bytes, C::kIsRate);
  state.counters["dense_equiv_GB/s"] = C(dense_bytes, C::kIsRate);
  state.counters["keys_read"] = C(keys, C::kAvgIterations);
  state.counters["candidates"] = C(candidates, C::kAvgIterations);
  state.counters["refined"] = C(refined, C::kAvgIterations);
  state.counters["bytes_frac"] = C(dense_bytes > 0 ? bytes / dense_bytes : 0.0);
  state.counters["certified"] = C(certified / double(kGroup), C::kAvgIterations);
}
BENCHMARK(attend_group)
    ->ArgName("n")
    ->Arg(16384)
    ->Arg(65536)
    ->Arg(131072)
    ->Unit(benchmark::kMillisecond);

void dense_group(benchmark::State& state) {
  const std::size_t n = std::size_t(state.range(0));
  const auto& fx = certattn::micro::layer(n, kHeads);
  const auto& q = queries(fx);
  certattn::dense_workspace ws(kGroup, kDim);
  std::vector<float> out(kGroup * kDim);
  std::size_t h = 0, s = 0;
  for (auto _ : state) {
    certattn::dense_attend(std::span<const float>(q.data() + (s % kSteps * kHeads + h) * kGroup * kDim,
                                                  kGroup * kDim),
                           kGroup, fx.view(h), 0.0f, out, ws);
    benchmark::DoNotOptimize(out.data());
    if (++h == kHeads) {
      h = 0;
      ++s;
    }
  }
  const double kv = double(2 * n * kDim * sizeof(certattn::half));
  state.counters["GB/s"] = benchmark::Counter(kv * double(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(dense_group)
    ->ArgName("n")
    ->Arg(16384)
    ->Arg(65536)
    ->Arg(131072)
    ->Unit(benchmark::kMillisecond);

}  // namespace
