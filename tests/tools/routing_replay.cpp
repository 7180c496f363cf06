// Routing policies compared on one recorded trace (docs/bench.md, "Routing on measured
// costs"). A bench run's routing ratio moves by a few hundredths between runs, because
// each run's histories see other timings; replaying one trace of measured call times
// gives every policy the same ones.
//   record: for each of the ten synthetic regimes and each context, 8 KV heads x `steps`
//           decoding steps of one layer (G query heads per KV head, d = 128, the defaults,
//           each call sparse with the sample budget of routing and the level hints of the
//           step before): the time of every group's sparse call and of its dense kernel,
//           in the bench's order (the dense kernels of the 8 heads, then their certified
//           calls, each pass after a cache flush); one line per call to the trace file.
//   replay: each group's calls through a group_history with routing on, as attend_group()
//           feeds it (the dense time of a routed call, the sparse call's measured cost
//           once a dense call has been timed, the cost model's prediction before), and
//           the resulting speedups: dense / routed choice, dense / sparse, and their ratio
//           to max(1, the sparse path's).
// The replay keeps each sparse call's time with its hints from the previous step (a
// routed step would leave them as they were) and the cost model's budget (a measured
// budget would differ). It reports both the ratio of total times and, as the bench, the
// median over steps of each step's ratio. Release build:
//   build/release/tests/certattn_routing_replay record trace.txt 4 60 16384,32768
//   build/release/tests/certattn_routing_replay replay trace.txt
#include <certattn/certattn.hpp>
#include <certattn/testing/synthetic.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace syn = certattn::synthetic;
using namespace certattn;

namespace {

constexpr std::size_t kHeads = 8, kDim = 128;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Reads a buffer larger than the last-level cache: the next step starts cold.
void flush_caches(std::vector<std::uint64_t>& buf) {
  std::uint64_t s = 0;
  for (std::size_t i = 0; i < buf.size(); i += 8) s += buf[i];
  buf[s % buf.size()] += 1;
}

int record(const std::string& path, std::size_t group, std::size_t steps,
           const std::vector<std::size_t>& contexts) {
  std::ofstream out(path);
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return 1;
  }
  std::vector<std::uint64_t> flush(std::size_t(256) << 17, 1);  // 256 MiB
  out << "# regime context group step kv_head sparse_s dense_s sampled\n";
  for (std::size_t n : contexts) {
    for (syn::regime r : syn::all_regimes) {
      syn::cache_config cfg;
      cfg.n_tokens = n, cfg.head_dim = kDim, cfg.kv_heads = kHeads, cfg.kind = r, cfg.seed = 1;
      const syn::kv_cache c = syn::make_cache(cfg);
      std::vector<strided_kv<half>> views;
      std::vector<key_index> idx;
      for (std::size_t h = 0; h < kHeads; ++h) {
        views.emplace_back(c.key_row(h, 0), c.value_row(h, 0), n, kDim, kDim, kDim);
        idx.emplace_back(kDim);
        idx.back().build(views.back());
      }
      // Every call sparse (no history: routing needs one), with the sample budget routing
      // gives it (route auto: over-budget heads go to the exact pass, as in the bench) and
      // the level hints of the step before (the levels its heads stopped at).
      options opt;
      attend_workspace ws(group, kDim, n);
      dense_workspace dws(group, kDim);
      std::vector<float> o(group * kDim);
      std::vector<certificate> certs(group);
      std::vector<std::vector<int>> hints(kHeads, std::vector<int>(group, -1));
      for (std::uint64_t s = 0; s < steps; ++s) {
        double sparse_s[kHeads], dense_s[kHeads];
        std::size_t sampled[kHeads];
        std::vector<std::vector<float>> queries(kHeads);
        for (std::size_t h = 0; h < kHeads; ++h) queries[h] = syn::make_queries(c, h, group, s);
        // As the bench: the dense kernels of every head, then the certified calls, each
        // pass after a flush.
        flush_caches(flush);
        for (std::size_t h = 0; h < kHeads; ++h) {
          const std::vector<float>& q = queries[h];
          const double t0 = now();
          dense_attend(std::span<const float>(q), group, views[h], 0.0f, std::span<float>(o), dws);
          dense_s[h] = now() - t0;
        }
        flush_caches(flush);
        for (std::size_t h = 0; h < kHeads; ++h) {
          const std::vector<float>& q = queries[h];
          const double t0 = now();
          attend_group(std::span<const float>(q), group, views[h], idx[h],
                       noise_key{s, 0, std::uint32_t(h)}, opt, std::span<float>(o),
                       std::span<certificate>(certs), ws,
                       std::span<const int>(hints[h]));
          sparse_s[h] = now() - t0;
          sampled[h] = ws.last_stats().sampled;
          for (std::size_t g = 0; g < group; ++g)
            if (certs[g].level >= 0) hints[h][g] = certs[g].level;
        }
        for (std::size_t h = 0; h < kHeads; ++h)
          out << syn::to_string(r) << ' ' << n << ' ' << group << ' ' << s << ' ' << h << ' '
              << sparse_s[h] << ' ' << dense_s[h] << ' ' << sampled[h] << '\n';
      }
      std::fprintf(stderr, "recorded %s %zu\n", std::string(syn::to_string(r)).c_str(), n);
    }
  }
  return 0;
}

struct call {
  double sparse_s, dense_s;
  std::size_t sampled;
};

int replay(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    return 1;
  }
  // (context, regime, group) -> [kv_head] -> calls in step order
  std::map<std::tuple<std::size_t, std::string, std::size_t>, std::vector<std::vector<call>>> trace;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string regime;
    std::size_t n, group, step, h, sampled;
    double sp, de;
    ls >> regime >> n >> group >> step >> h >> sp >> de >> sampled;
    auto& heads = trace[{n, regime, group}];
    if (heads.size() <= h) heads.resize(h + 1);
    heads[h].push_back({sp, de, sampled});
  }
  const options opt;  // routing on, costs measured: the defaults
  int below = 0, below_median = 0, configs = 0;
  double worst = 1e9, worst_median = 1e9;
  std::printf("| context | regime | G | off | auto | auto / max(1, off) | median of step ratios: off, auto, criterion | routed |\n|---|---|---|---|---|---|---|---|\n");
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  };
  for (const auto& [key, heads] : trace) {
    const auto& [n, regime, group] = key;
    std::size_t routed = 0, calls = 0, steps = 0;
    for (const auto& h : heads) steps = std::max(steps, h.size());
    std::vector<double> step_dense(steps), step_sparse(steps), step_chosen(steps);
    for (std::size_t h = 0; h < heads.size(); ++h) {
      group_history hist(group);
      const std::vector<int> levels(group, -1);
      for (std::size_t s = 0; s < heads[h].size(); ++s) {
        const call& c = heads[h][s];
        step_dense[s] += c.dense_s;
        step_sparse[s] += c.sparse_s;
        ++calls;
        if (hist.routes_dense(opt)) {
          step_chosen[s] += c.dense_s;
          ++routed;
          hist.record_dense(c.dense_s, n);
          continue;
        }
        step_chosen[s] += c.sparse_s;
        const double predicted = opt.cost.predicted(c.sampled, n);
        const double measured = hist.measured_cost(c.sparse_s, n);
        const bool was_measured = !std::isnan(measured);
        hist.record_sparse(was_measured ? measured : predicted, levels,
                           noise_key{s, 0, std::uint32_t(h)},
                           was_measured ? predicted : std::numeric_limits<double>::quiet_NaN());
      }
    }
    std::vector<double> r_off, r_on;
    for (std::size_t s = 0; s < steps; ++s) {
      r_off.push_back(step_dense[s] / step_sparse[s]);
      r_on.push_back(step_dense[s] / step_chosen[s]);
    }
    auto total = [](const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); };
    const double dense = total(step_dense);
    const double off = dense / total(step_sparse), on = dense / total(step_chosen), crit = on / std::max(1.0, off);
    const double m_off = median(r_off), m_on = median(r_on), m_crit = m_on / std::max(1.0, m_off);
    ++configs;
    below += crit < 0.95;
    below_median += m_crit < 0.95;
    worst = std::min(worst, crit);
    worst_median = std::min(worst_median, m_crit);
    std::printf("| %zuK | %s | %zu | %.2fx | %.2fx | %.3f | %.2fx, %.2fx, %.3f | %.0f%% |\n", n / 1024,
                regime.c_str(), group, off, on, crit, m_off, m_on, m_crit,
                100.0 * double(routed) / double(calls));
  }
  std::printf("\n%d of %d configurations below 0.95 of max(1, off); worst %.3f\n", below, configs,
              worst);
  std::printf("medians of step ratios (the bench's): %d of %d below 0.95; worst %.3f\n", below_median,
              configs, worst_median);
  return 0;
}

std::vector<std::size_t> parse_list(const std::string& s) {
  std::vector<std::size_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::stoul(item));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "record" && argc == 6)
    return record(argv[2], std::stoul(argv[3]), std::stoul(argv[4]), parse_list(argv[5]));
  if (mode == "replay" && argc == 3) return replay(argv[2]);
  std::fprintf(stderr,
               "usage: %s record TRACE GROUP STEPS CONTEXT[,CONTEXT...]\n"
               "       %s replay TRACE\n",
               argv[0], argv[0]);
  return 2;
}
