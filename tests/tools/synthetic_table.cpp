// Prints the statistics table of docs/synthetic.md ("What the regimes look like"): for
// each regime, 4 KV heads x 32 steps x group 4 queries at n = 16384, d = 128, the median
// effective keys exp(H), top-1 weight, top-64 mass, score range, sink and recent mass,
// needle top-1 rate and channel max/median. Release build:
//   build/release/tests/certattn_synthetic_table
#include <certattn/testing/synthetic.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace syn = certattn::synthetic;

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main() {
  const std::size_t n = 16384, d = 128, heads = 4, steps = 32, group = 4;
  std::printf("n=%zu d=%zu: %zu KV heads x %zu steps x group %zu = %zu queries per regime\n\n", n,
              d, heads, steps, group, heads * steps * group);
  std::printf(
      "| regime | exp(H) median | exp(H)/n | exp(H) p10 .. p90 | top-1 | top-64 mass "
      "| max-median score | sink mass | last-64 mass | needle top-1 rate "
      "| channel max/median |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (syn::regime r : syn::all_regimes) {
    syn::cache_config cfg;
    cfg.n_tokens = n, cfg.head_dim = d, cfg.kv_heads = heads, cfg.kind = r, cfg.seed = 1;
    const syn::kv_cache c = syn::make_cache(cfg);
    std::vector<double> eff, top1, top64, range, sink, recent, channel;
    std::size_t needle_hits = 0;
    for (std::size_t h = 0; h < heads; ++h) {
      channel.push_back(syn::channel_magnitude_ratio(c, h));
      std::vector<float> queries;
      for (std::uint64_t step = 0; step < steps; ++step) {
        const std::vector<float> q = syn::make_queries(c, h, group, step);
        queries.insert(queries.end(), q.begin(), q.end());
      }
      for (const syn::attention_profile& p : syn::profile_attention(c, h, queries)) {
        eff.push_back(p.effective_keys), top1.push_back(p.top1_weight);
        top64.push_back(p.top64_mass), range.push_back(p.score_range);
        sink.push_back(p.sink_mass), recent.push_back(p.recent_mass);
        const auto& nt = c.needle_tokens;
        needle_hits += std::find(nt.begin(), nt.end(), p.argmax) != nt.end() ? 1 : 0;
      }
    }
    std::vector<double> sorted = eff;
    std::sort(sorted.begin(), sorted.end());
    std::printf(
        "| %s | %.0f | %.4f | %.0f .. %.0f | %.3f | %.3f | %.1f | %.3f | %.3f | %.2f | %.1f |\n",
        std::string(syn::to_string(r)).c_str(), median(eff), median(eff) / n,
        sorted[sorted.size() / 10], sorted[sorted.size() * 9 / 10], median(top1), median(top64),
        median(range), median(sink), median(recent),
        static_cast<double>(needle_hits) / static_cast<double>(eff.size()), median(channel));
  }
}
