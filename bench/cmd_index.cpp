// certattn-bench index: what the key index costs (the paper's Table D.10).
//   build   key_index::build of every KV head after prefill, heads spread over the threads
//   append  key_index::append of one new token per head at each decoding step, against the
//           certified call of the same step on the same heads (the overhead of indexing)
//   memory  key_index::memory_bytes of all heads against the K and V bytes of the cache
// The cache holds context + steps tokens; the index is built on the first `context` and
// every step appends the next one, then queries the grown cache.
#include "bench_common.hpp"
#include "commands.hpp"
#include "report.hpp"
#include <certattn/parallel.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace certattn::bench {
namespace {

struct index_row : run_point {
  std::size_t steps = 0;
  double build_s = 0, build_keys_per_s = 0, build_keys_per_s_per_thread = 0;
  double append_us = 0, append_us_median = 0, append_us_max = 0;  // per step, all heads
  double certified_ms = 0;                                        // per step, all heads
  double append_ratio = 0;                                        // sum append / sum certified
  double index_bytes = 0, kv_bytes = 0, index_frac = 0;
};

record to_record(const index_row& r) {
  record rec = point_fields(r);
  rec.insert(rec.end(), {
      {"steps", std::uint64_t(r.steps)},
      {"build_s", r.build_s},
      {"build_keys_per_s", r.build_keys_per_s},
      {"build_keys_per_s_per_thread", r.build_keys_per_s_per_thread},
      {"append_us", r.append_us},
      {"append_us_median", r.append_us_median},
      {"append_us_max", r.append_us_max},
      {"certified_ms", r.certified_ms},
      {"append_ratio", r.append_ratio},
      {"index_bytes", std::uint64_t(r.index_bytes)},
      {"kv_bytes", std::uint64_t(r.kv_bytes)},
      {"index_frac", r.index_frac},
  });
  return rec;
}

/// Builds the indexes of one layout with one pool, then runs the append + query steps.
template <class ViewOf>
index_row run_one(const layer_cache& lc, ViewOf view_of, std::size_t n, std::size_t group,
                  const std::vector<float>& queries, const options& opt, std::size_t warmup,
                  std::size_t steps, thread_pool& pool, std::vector<attend_workspace>& ws,
                  const cache_flusher& flush) {
  const std::size_t H = lc.heads(), d = lc.head_dim(), G = group;
  index_row row;
  std::vector<key_index> idx(H, key_index(d));
  for (key_index& x : idx) x.reserve(lc.tokens());

  auto t0 = bench_clock::now();
  pool.parallel_for(H, [&](std::size_t h, std::size_t) { idx[h].build(view_of(h).prefix(n)); });
  row.build_s = seconds_since(t0);
  row.build_keys_per_s = double(n * H) / row.build_s;
  row.build_keys_per_s_per_thread = row.build_keys_per_s / double(pool.size());
  for (const key_index& x : idx) row.index_bytes += double(x.memory_bytes());
  row.kv_bytes = double(lc.kv_bytes(n));
  row.index_frac = row.index_bytes / row.kv_bytes;

  std::vector<double> append_s(H), query_s(H);
  std::vector<float> out(H * G * d);
  std::vector<certificate> certs(H * G);
  std::vector<double> append_steps;
  double append_sum = 0, query_sum = 0;
  for (std::size_t s = 0; s < warmup + steps; ++s) {
    const std::size_t pos = n + s;  // the token this step writes
    const float* q = queries.data() + s * H * G * d;
    flush();
    pool.parallel_for(H, [&](std::size_t h, std::size_t w) {
      const auto kv = view_of(h).prefix(pos + 1);
      auto a0 = bench_clock::now();
      idx[h].append(kv, pos);
      append_s[h] = seconds_since(a0);
      a0 = bench_clock::now();
      attend_group(std::span<const float>(q + h * G * d, G * d), G, kv, idx[h],
                   noise_key{std::uint64_t(s), 0, std::uint32_t(h)}, opt,
                   std::span<float>(out.data() + h * G * d, G * d),
                   std::span<certificate>(certs.data() + h * G, G), ws[w]);
      query_s[h] = seconds_since(a0);
    });
    if (s < warmup) continue;
    double a = 0, qs = 0;
    for (std::size_t h = 0; h < H; ++h) {
      a += append_s[h];
      qs += query_s[h];
    }
    append_steps.push_back(a);
    append_sum += a;
    query_sum += qs;
  }
  row.steps = steps;
  row.append_us = 1e6 * append_sum / double(steps);
  row.append_us_median = 1e6 * median(append_steps);
  row.append_us_max = 1e6 * *std::max_element(append_steps.begin(), append_steps.end());
  row.certified_ms = 1e3 * query_sum / double(steps);
  row.append_ratio = append_sum / query_sum;
  return row;
}

void report(const grid_flags& f, const grid& g, const std::vector<index_row>& rows) {
  const bool many_regimes = g.regimes.size() > 1;
  std::vector<std::string> headers{"context", "<layout", "thr"};
  if (many_regimes) headers.push_back("<regime");
  for (const char* h : {"build s", "Mkeys/s", "Mkeys/s/thr", "append us", "median us", "max us", "cert ms",
                        "append/cert", "index MiB", "KV MiB", "index/KV"})
    headers.push_back(h);
  text_table table(headers);
  for (const index_row& r : rows) {
    std::vector<std::string> c{format_count(r.context), std::string(to_string(r.layout)), std::to_string(r.threads)};
    if (many_regimes) c.push_back(std::string(syn::to_string(r.regime)));
    c.push_back(strf("%.2f", r.build_s));
    c.push_back(strf("%.2f", r.build_keys_per_s * 1e-6));
    c.push_back(strf("%.2f", r.build_keys_per_s_per_thread * 1e-6));
    c.push_back(strf("%.1f", r.append_us));
    c.push_back(strf("%.1f", r.append_us_median));
    c.push_back(strf("%.1f", r.append_us_max));
    c.push_back(strf("%.2f", r.certified_ms));
    c.push_back(strf("%.2f%%", 100.0 * r.append_ratio));
    c.push_back(strf("%.1f", r.index_bytes / 1048576.0));
    c.push_back(strf("%.1f", r.kv_bytes / 1048576.0));
    c.push_back(strf("%.1f%%", 100.0 * r.index_frac));
    table.add_row(c);
  }
  std::printf("\n");
  table.print(stdout);
  std::printf(
      "\nbuild: all %zu KV heads, heads spread over the threads (one timing). append / cert: per decoding step,\n"
      "summed over heads (time each head's task spent), mean over %zu steps after %zu warm-up; append/cert = sum of\n"
      "append times / sum of certified-call times. index = key_index::memory_bytes, KV = K and V in fp16.\n",
      f.kv_heads, f.reps, f.warmup);

  std::vector<record> recs;
  for (const index_row& r : rows) recs.push_back(to_record(r));
  if (!f.json.empty()) {
    json_writer j;
    j.begin_object().key("command").value("index");
    j.key("machine").begin_object(true);
    machine_fields(j);
    j.end_object();
    j.key("config").begin_object(true);
    j.key("steps").value(std::uint64_t(f.reps)).key("warmup").value(std::uint64_t(f.warmup));
    j.key("seed").value(std::uint64_t(f.seed)).key("flush_mib").value(std::uint64_t(f.flush_mib));
    j.end_object();
    finish_json(j, recs, f.json);
  }
  if (!f.csv.empty()) {
    write_csv(f.csv, recs);
  }
  if (!f.plot.empty()) {
    plot_spec build{"index_build_vs_context.png", "key_index::build throughput", "context (tokens)",
                    "million keys per second per thread", true, true, -1.0, {}};
    plot_spec append{"append_ratio_vs_context.png", "index append cost relative to the certified call",
                     "context (tokens)", "append / certified call (%)", true, true, -1.0, {}};
    std::map<std::string, std::size_t> where;
    for (const index_row& r : rows) {
      std::string label = std::string(to_string(r.layout)) + ", " + std::to_string(r.threads) +
                          (r.threads == 1 ? " thread" : " threads");
      if (many_regimes) label += ", " + std::string(syn::to_string(r.regime));
      if (!where.count(label)) {
        where[label] = build.series.size();
        build.series.push_back({label, {}, {}});
        append.series.push_back({label, {}, {}});
      }
      const std::size_t i = where[label];
      build.series[i].x.push_back(double(r.context));
      build.series[i].y.push_back(r.build_keys_per_s_per_thread * 1e-6);
      append.series[i].x.push_back(double(r.context));
      append.series[i].y.push_back(100.0 * r.append_ratio);
    }
    for (const std::string& file : write_plots(f.plot, {build, append})) std::printf("wrote %s\n", file.c_str());
  }
}

void run_index(const grid_flags& f) {
  const grid g = resolve(f);
  const std::size_t H = f.kv_heads, G = f.group, d = f.head_dim;
  const std::size_t steps = f.warmup + f.reps;
  pools P(g.threads);
  const cache_flusher flush(f.flush_mib);
  options opt;
  opt.epsilon = f.eps.front();
  opt.delta = f.delta.front();
  opt.seed = f.seed;
  opt.route = routing::kOff;  // the sparse path, whose index this command maintains
  if (f.eps.size() > 1 || f.delta.size() > 1)
    std::fprintf(stderr, "index: the certified call uses the first --eps and --delta only\n");

  double total = 0;
  for (std::size_t n : g.contexts)
    total += double(n * H) * double(g.regimes.size()) * (1.0 + double(g.layouts.size() * g.threads.size()));
  progress prog("certattn-bench index", total, !f.quiet);
  std::printf("machine: isa %s, %zu hardware threads\n", std::string(to_string(active_isa())).c_str(),
              threads_available());
  std::printf("grid: eps %g, delta %g, kv_heads %zu, group %zu, head_dim %zu, %zu warm-up + %zu timed steps\n",
              opt.epsilon, opt.delta, H, G, d, f.warmup, f.reps);
  std::fflush(stdout);

  std::vector<index_row> rows;
  for (syn::regime regime : g.regimes)
    for (std::size_t n : g.contexts) {
      const std::string ctx = format_count(n) + " " + std::string(syn::to_string(regime));
      prog.set_stage(ctx + ": synthetic cache");
      syn::cache_config cfg;
      cfg.n_tokens = n + steps;
      cfg.head_dim = d;
      cfg.kv_heads = H;
      cfg.kind = regime;
      cfg.seed = f.seed;
      const syn::kv_cache cache = syn::make_cache(cfg);
      const std::vector<float> queries = make_step_queries(cache, G, steps);
      std::vector<attend_workspace> ws;
      for (std::size_t w = 0; w < P.largest().size(); ++w) ws.emplace_back(G, d, n + steps);
      prog.advance(double(n * H));
      for (layout_kind layout : g.layouts) {
        const layer_cache lc(cache, layout, f.seed);
        for (std::size_t t : g.threads) {
          prog.set_stage(ctx + " " + std::string(to_string(layout)) + " " + std::to_string(t) + "T");
          index_row row = lc.visit([&](auto view_of) {
            return run_one(lc, view_of, n, G, queries, opt, f.warmup, f.reps, P.get(t), ws, flush);
          });
          static_cast<run_point&>(row) = {n, H, G, d, t, layout, regime, opt.epsilon, opt.delta};
          rows.push_back(row);
          prog.advance(double(n * H));
        }
      }
    }
  prog.finish();
  report(f, g, rows);
}

}  // namespace

void add_index_command(CLI::App& app) {
  auto f = std::make_shared<grid_flags>();
  f->reps = 32;  // appends are cheap and uneven (a token that widens a block re-encodes it)
  CLI::App* cmd = app.add_subcommand(
      "index", "key index cost: build speed (keys/s per thread), append per decoding step vs the certified call, "
               "memory vs the KV cache");
  add_grid_flags(*cmd, *f, "timed decoding steps (append + certified call) per configuration");
  cmd->callback([f] { run_index(*f); });
}

}  // namespace certattn::bench
