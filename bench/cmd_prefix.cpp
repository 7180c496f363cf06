// certattn-bench prefix: parallel samples of one prompt. S sequences share a prefix of
// `context` tokens and each holds --own-tokens tokens of its own; one decoding step of one
// layer answers every sequence's G query heads per KV head. The dense baseline
// (dense_attend_sequences()) reads the prefix once for all S G queries and each
// sequence's own tokens; the certified call (attend_sequences()) scans the prefix's index
// once for all of them and reads each sequence's own tokens exactly. Both are timed
// alternately on the same paged cache (each sequence's block table lists the prefix's
// pages, then its own), threads and queries; every (KV head, sequence) keeps its
// group_history over the steps. The same sequences are also timed as separate attend_group()
// calls over indexes of their own (the prefix's copied, then appended): what one scan saves.
#include "bench_common.hpp"
#include "commands.hpp"
#include "report.hpp"
#include <certattn/parallel.hpp>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace certattn::bench {
namespace {

struct prefix_flags : grid_flags {
  std::vector<std::size_t> sequences{1, 4, 8};
  std::size_t own_tokens = 256;
  std::vector<std::string> routings{"auto"};
};

struct prefix_row : run_point {
  std::size_t sequences = 1, own_tokens = 0, reps = 0;
  routing route = routing::kAuto;
  double dense_ms = 0, certified_ms = 0, speedup = 0;
  // The same sequences as separate attend_group() calls, each over its own index (a copy
  // of the prefix's with its own tokens appended): what the shared scan saves.
  double separate_ms = 0, separate_ratio = 0;
  double keys_read_per_head = 0, bytes_read_frac = 0, certified_frac = 0, routed_frac = 0;
  double refined_per_call = 0;  // per KV head and step, all sequences
};

record to_record(const prefix_row& r) {
  record rec = point_fields(r);
  rec.insert(rec.end(), {
      {"sequences", std::uint64_t(r.sequences)},
      {"own_tokens", std::uint64_t(r.own_tokens)},
      {"routing", std::string(to_string(r.route))},
      {"reps", std::uint64_t(r.reps)},
      {"dense_ms", r.dense_ms},
      {"certified_ms", r.certified_ms},
      {"speedup", r.speedup},
      {"separate_ms", r.separate_ms},
      {"separate_over_shared", r.separate_ratio},
      {"keys_read_per_head", r.keys_read_per_head},
      {"bytes_read_frac", r.bytes_read_frac},
      {"certified_frac", r.certified_frac},
      {"routed_frac", r.routed_frac},
      {"refined_per_call", r.refined_per_call},
  });
  return rec;
}

/// Each sequence's block table: the prefix's pages, then the pages of its own tokens,
/// which follow the prefix and the earlier sequences' own tokens in the cache.
std::vector<std::vector<std::int32_t>> sequence_tables(const layer_cache& lc, std::size_t prefix,
                                                       std::size_t own, std::size_t sequences) {
  constexpr std::size_t page = layer_cache::kPageTokens;
  const std::span<const std::int32_t> all = lc.page_table();
  std::vector<std::vector<std::int32_t>> tables(sequences);
  for (std::size_t s = 0; s < sequences; ++s) {
    tables[s].assign(all.begin(), all.begin() + std::ptrdiff_t(prefix / page));
    const std::size_t first = (prefix + s * own) / page;
    tables[s].insert(tables[s].end(), all.begin() + std::ptrdiff_t(first),
                     all.begin() + std::ptrdiff_t(first + (own + page - 1) / page));
  }
  return tables;
}

/// `steps` decoding steps of S sequences over one layer, dense then certified in each.
template <class View>
prefix_row run_steps(const layer_cache& lc, const std::vector<std::vector<View>>& views,
                     const std::vector<key_index>& idx, const std::vector<std::vector<key_index>>& own_idx,
                     const std::vector<float>& queries, std::size_t S,
                     std::size_t G, const options& opt, const layer_variant& variant, std::size_t warmup,
                     std::size_t steps, thread_pool& pool, const cache_flusher& flush, progress& prog,
                     double units_per_step) {
  const std::size_t H = lc.heads(), d = lc.head_dim(), SG = S * G, prefix = idx[0].size();
  std::vector<float> out_dense(H * SG * d), out_cert(H * SG * d);
  std::vector<certificate> certs(H * SG), separate_certs(H * SG);
  std::vector<float> out_separate(H * SG * d);
  std::vector<attend_workspace> aws, one_ws;
  std::vector<dense_workspace> dws;
  std::size_t max_tokens = 0;
  for (const View& v : views[0]) max_tokens = std::max(max_tokens, v.size());
  for (std::size_t w = 0; w < pool.size(); ++w) {
    aws.emplace_back(SG, d, max_tokens);
    one_ws.emplace_back(G, d, max_tokens);
    dws.emplace_back(SG, d);
  }
  std::vector<group_history> histories(H * S, group_history(G)), separate_histories(H * S, group_history(G));
  std::vector<group_history*> history_ptrs(H * S);
  for (std::size_t i = 0; i < H * S; ++i) history_ptrs[i] = &histories[i];
  std::vector<std::uint64_t> ids(S);
  for (std::size_t s = 0; s < S; ++s) ids[s] = s + 1;
  std::vector<group_stats> stats(H);
  const float scale = float(opt.effective_softmax_scale(d));
  std::vector<double> dense_s, cert_s, ratio, separate_s, separate_ratio;
  double keys = 0, bytes = 0, dense_bytes = 0, certified = 0, routed = 0, refined = 0;
  for (std::size_t step = 0; step < steps; ++step) {
    const std::span<const float> q(queries.data() + step * H * SG * d, H * SG * d);
    flush();
    auto t0 = bench_clock::now();
    pool.parallel_for(H, [&](std::size_t h, std::size_t w) {
      dense_attend_sequences(q.subspan(h * SG * d, SG * d), G, std::span<const View>(views[h]), prefix, scale,
                             std::span<float>(out_dense.data() + h * SG * d, SG * d), dws[w], variant.head(h));
    });
    const double dense = seconds_since(t0);
    flush();
    t0 = bench_clock::now();
    pool.parallel_for(H, [&](std::size_t h, std::size_t w) {
      options head_opt = opt;
      head_opt.variant = variant.head(h);
      attend_sequences(q.subspan(h * SG * d, SG * d), G, std::span<const View>(views[h]), idx[h],
                       noise_key{std::uint64_t(step), 0, std::uint32_t(h)}, std::span<const std::uint64_t>(ids),
                       head_opt, std::span<float>(out_cert.data() + h * SG * d, SG * d),
                       std::span<certificate>(certs.data() + h * SG, SG), aws[w],
                       std::span<group_history* const>(history_ptrs.data() + h * S, S));
      stats[h] = aws[w].last_stats();
    });
    const double cert = seconds_since(t0);
    flush();
    t0 = bench_clock::now();
    pool.parallel_for(H, [&](std::size_t h, std::size_t w) {
      options head_opt = opt;
      head_opt.variant = variant.head(h);
      for (std::size_t s = 0; s < S; ++s)
        attend_group(q.subspan((h * S + s) * G * d, G * d), G, views[h][s], own_idx[h][s],
                     noise_key{std::uint64_t(step), 0, std::uint32_t(h), ids[s]}, head_opt,
                     std::span<float>(out_separate.data() + (h * S + s) * G * d, G * d),
                     std::span<certificate>(separate_certs.data() + (h * S + s) * G, G), one_ws[w],
                     separate_histories[h * S + s]);
    });
    const double separate = seconds_since(t0);
    prog.advance(units_per_step);
    if (step < warmup) continue;
    dense_s.push_back(dense);
    cert_s.push_back(cert);
    ratio.push_back(dense / cert);
    separate_s.push_back(separate);
    separate_ratio.push_back(separate / cert);
    for (const group_stats& st : stats) {
      keys += double(st.keys_read);
      bytes += double(st.bytes_read);
      dense_bytes += double(st.dense_bytes);
      routed += double(st.routed);
      refined += double(st.refined);
    }
    for (const certificate& c : certs) certified += c.certified ? 1.0 : 0.0;
  }
  prefix_row row;
  const double timed = double(dense_s.size()), heads = timed * double(H * SG);
  row.reps = dense_s.size();
  row.dense_ms = 1e3 * median(dense_s);
  row.certified_ms = 1e3 * median(cert_s);
  row.speedup = median(ratio);
  row.separate_ms = 1e3 * median(separate_s);
  row.separate_ratio = median(separate_ratio);
  row.keys_read_per_head = keys / heads;
  row.bytes_read_frac = bytes / dense_bytes;
  row.certified_frac = certified / heads;
  row.routed_frac = routed / heads;
  row.refined_per_call = refined / (timed * double(H));
  return row;
}

void report(const prefix_flags& f, const std::vector<prefix_row>& rows) {
  text_table table({"context", "own", "thr", "<routing", "seqs", "dense ms", "cert ms", "speedup", "ms/seq",
                    "separate ms", "sep/cert",
                    "keys/head", "bytes %", "cert %", "routed %", "refined/call"});
  for (const prefix_row& r : rows)
    table.add_row({format_count(r.context), std::to_string(r.own_tokens), std::to_string(r.threads),
                   std::string(to_string(r.route)), std::to_string(r.sequences), strf("%.2f", r.dense_ms),
                   strf("%.2f", r.certified_ms), strf("%.2fx", r.speedup),
                   strf("%.2f", r.certified_ms / double(r.sequences)), strf("%.2f", r.separate_ms),
                   strf("%.2fx", r.separate_ratio), strf("%.0f", r.keys_read_per_head),
                   strf("%.1f%%", 100.0 * r.bytes_read_frac), strf("%.1f%%", 100.0 * r.certified_frac),
                   strf("%.1f%%", 100.0 * r.routed_frac), strf("%.0f", r.refined_per_call)});
  std::printf("\n");
  table.print(stdout);
  std::printf(
      "\ncontext = the shared prefix's tokens; own = each sequence's own tokens after it; seqs = sequences per call.\n"
      "dense = dense_attend_sequences() (the prefix read once for all sequences), cert = attend_sequences() (the\n"
      "prefix's index scanned once, each sequence's own tokens read exactly); one layer, all KV heads, median over\n"
      "%zu steps after %zu warm-up; speedup = median of per-step dense/cert. separate = the same sequences as\n"
      "attend_group() calls, each over its own index (the prefix's copied, its tokens appended); sep/cert = median\n"
      "of per-step separate/cert. keys/head per query head; bytes = certified bytes / dense bytes; refined/call =\n"
      "8-bit refinements per KV head and step, all sequences.\n",
      f.reps, f.warmup);
  std::vector<record> recs;
  for (const prefix_row& r : rows) recs.push_back(to_record(r));
  if (!f.json.empty()) {
    json_writer j;
    j.begin_object().key("command").value("prefix");
    j.key("machine").begin_object(true);
    machine_fields(j);
    j.end_object();
    j.key("config").begin_object(true);
    j.key("steps").value(std::uint64_t(f.reps)).key("warmup").value(std::uint64_t(f.warmup));
    j.key("seed").value(std::uint64_t(f.seed)).key("own_tokens").value(std::uint64_t(f.own_tokens));
    j.end_object();
    finish_json(j, recs, f.json);
  }
  if (!f.csv.empty()) write_csv(f.csv, recs);
}

void run_prefix(const prefix_flags& f) {
  const grid g = resolve(f);
  for (layout_kind l : g.layouts)
    if (l != layout_kind::kPaged)
      throw error("--layout " + std::string(to_string(l)) +
                  ": sequences share a prefix through their block tables: prefix runs on the paged layout only");
  if (g.variant.latent > 0) throw error("--variant latent:DV: prefix runs plain, soft-capped, ALiBi and sink variants");
  if (!f.plot.empty()) throw error("--plot: prefix writes tables, JSON and CSV only");
  if (g.dtypes.size() > 1 || g.dtypes[0] != cache_dtype{}) throw error("--dtype: prefix runs on the f16 cache only");
  std::size_t max_sequences = 0;
  for (std::size_t s : f.sequences) {
    if (s == 0 || s * f.group > 1024)
      throw error("--sequences " + std::to_string(s) + ": each must lie in [1, 1024 / group]");
    max_sequences = std::max(max_sequences, s);
  }
  std::vector<routing> routings;
  for (const std::string& r : f.routings) routings.push_back(routing_from_string(r));
  const std::size_t H = f.kv_heads, G = f.group, d = f.head_dim, steps = f.warmup + f.reps;
  const std::size_t own = (f.own_tokens + layer_cache::kPageTokens - 1) / layer_cache::kPageTokens *
                          layer_cache::kPageTokens;
  pools P(g.threads);
  const cache_flusher flush(f.flush_mib);
  const layer_variant variant(g.variant, H, G, f.seed);
  double total = 0;
  for (std::size_t n : g.contexts)
    for (std::size_t s : f.sequences)
      total += double(g.regimes.size() * g.threads.size() * routings.size() * steps) *
               double((n + s * own) * H);
  progress prog("certattn-bench prefix", total, !f.quiet);
  std::printf("machine: isa %s, %zu hardware threads\n", std::string(to_string(active_isa())).c_str(),
              threads_available());
  std::printf("grid: regime %s, eps %g, kv_heads %zu, group %zu, head_dim %zu, own tokens %zu, variant %s, %zu "
              "warm-up + %zu timed steps\n",
              f.regimes.front().c_str(), f.eps.front(), H, G, d, f.own_tokens, g.variant.text.c_str(), f.warmup,
              f.reps);
  std::fflush(stdout);
  std::vector<prefix_row> rows;
  for (syn::regime regime : g.regimes)
    for (std::size_t n : g.contexts) {
      if (n % layer_cache::kPageTokens != 0)
        throw error("--context " + std::to_string(n) + ": the prefix must fill whole 16-token pages");
      const std::string ctx = format_count(n) + " " + std::string(syn::to_string(regime));
      prog.set_stage(ctx + ": synthetic cache");
      syn::cache_config cfg;
      cfg.n_tokens = n + max_sequences * own;
      cfg.head_dim = d;
      cfg.kv_heads = H;
      cfg.kind = regime;
      cfg.seed = f.seed;
      const syn::kv_cache cache = syn::make_cache(cfg);
      const layer_cache lc(cache, layout_kind::kPaged, f.seed);
      using View = paged_kv<half>;
      prog.set_stage(ctx + ": prefix indexes");
      std::vector<key_index> idx(H, key_index(d));
      P.largest().parallel_for(H, [&](std::size_t h, std::size_t) { idx[h].build(lc.paged<half>(h).prefix(n)); });
      for (std::size_t S : f.sequences) {
        const auto tables = sequence_tables(lc, n, own, S);
        std::vector<std::vector<View>> views(H);
        for (std::size_t h = 0; h < H; ++h)
          for (std::size_t s = 0; s < S; ++s) views[h].push_back(lc.paged<half>(h, tables[s], n + own));
        const std::vector<float> queries = make_step_queries(cache, S * G, steps);
        // The separate calls' indexes: the prefix's copied per sequence, its tokens appended.
        std::vector<std::vector<key_index>> own_idx(H);
        P.largest().parallel_for(H, [&](std::size_t h, std::size_t) {
          for (std::size_t s = 0; s < S; ++s) {
            own_idx[h].push_back(idx[h]);
            own_idx[h].back().append_range(views[h][s], n, own);
          }
        });
        for (std::size_t t : g.threads)
          for (routing route : routings) {
            prog.set_stage(ctx + " " + std::to_string(S) + " sequences " + std::to_string(t) + "T " +
                           std::string(to_string(route)));
            options opt;
            opt.epsilon = f.eps.front();
            opt.delta = f.delta.front();
            opt.seed = f.seed;
            opt.route = route;
            opt.softmax_scale = f.softmax_scale;
            prefix_row row = run_steps(lc, views, idx, own_idx, queries, S, G, opt, variant, f.warmup, steps, P.get(t), flush,
                                       prog, double((n + S * own) * H));
            static_cast<run_point&>(row) = {n, H, G, d, t, layout_kind::kPaged, regime, opt.epsilon, opt.delta};
            row.sequences = S;
            row.own_tokens = own;
            row.route = route;
            rows.push_back(row);
          }
      }
    }
  prog.finish();
  report(f, rows);
}

}  // namespace

void add_prefix_command(CLI::App& app) {
  auto f = std::make_shared<prefix_flags>();
  f->layouts = {"paged"};
  f->contexts = {"32K", "128K"};
  f->threads = {1};
  f->reps = 10;
  CLI::App* cmd = app.add_subcommand(
      "prefix",
      "parallel samples of one prompt: S sequences sharing a prefix, attend_sequences() (one scan of the prefix's "
      "index) vs dense_attend_sequences() (one pass over the prefix), one layer per step");
  add_grid_flags(*cmd, *f, "timed decoding steps per configuration (after the warm-up)");
  cmd->add_option("--sequences", f->sequences, "sequences per call, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--own-tokens", f->own_tokens,
                  "each sequence's own tokens after the prefix (rounded up to whole 16-token pages)")
      ->capture_default_str();
  cmd->add_option("--routing", f->routings, "options.route of the certified call, comma-separated: auto, off")
      ->delimiter(',')
      ->check(CLI::IsMember({"auto", "off"}))
      ->capture_default_str();
  cmd->callback([f] { run_prefix(*f); });
}

}  // namespace certattn::bench
