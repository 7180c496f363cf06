// certattn-bench speed: one decoding step of one layer (all KV heads), dense attention and
// the certified call timed alternately on the same queries, threads and cache.
//
// For each (regime, context): a synthetic cache and its key indexes are built once; for each
// layout the cache is copied into that layout; for each thread count, epsilon, delta and
// certificate the two methods run A B A B ... (warm-up steps first), each step with fresh
// queries and fresh perturbations (noise_key.step advances every repetition). Every KV head
// keeps a group_history across the steps of a configuration, as a decoder would: level hints,
// and (routing auto) the routing of groups whose sparse path lost. With --fit-cost, the
// steps run without routing fit options.cost (the cost model) by least squares.
#include "bench_common.hpp"
#include "commands.hpp"
#include "report.hpp"
#include <certattn/parallel.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace certattn::bench {
namespace {

constexpr const char* kStageNames[6] = {"window", "scan", "max", "candidates", "levels", "fallback"};

struct speed_flags : grid_flags {
  std::size_t bandwidth_mib = 1024;
  std::vector<std::string> certificates{"tight"};
  std::vector<std::string> routings{"auto"};
  bool fit_cost = false;
  bool profile_stages = false;
  bool block_occupancy = false;
  std::vector<std::size_t> positions{1};
};

struct speed_row : run_point {
  std::size_t positions = 1;  // query positions per call (attend_positions)
  certificate_kind certificate = certificate_kind::kTight;
  routing route = routing::kAuto;
  std::size_t reps = 0;
  double dense_ms = 0, certified_ms = 0, speedup = 0;
  double keys_read_frac = 0, keys_read_per_head = 0, bytes_read_frac = 0;
  double certified_frac = 0, fallback_frac = 0, routed_frac = 0, over_budget_frac = 0;
  double sampled_per_head = 0;  // heavy + sampled light pool keys per query head (cost model)
  // Per group call (one KV head's G query heads): 8-bit refinements, 8-bit block
  // preparations, and cache lines of the rows read at scattered places
  // (group_stats::scattered_lines).
  double refined_per_call = 0, refine_blocks_per_call = 0, lines_per_call = 0;
  // Pool keys bucketed as candidates per group call (group_stats::candidates): what the
  // candidate stage writes and sorts, whatever level the heads stop at.
  double candidates_per_call = 0;
  double dense_gbps = 0, read_gbps = 0, dense_bw_frac = 0;
  // The certified call's time over the time its bytes take at the measured read bandwidth.
  double floor_ratio = 0;
  bool profile_stages = false;
  double stage_ms[6] = {};  // per step, summed over heads (--profile-stages only)
  bool block_occupancy = false;
  // --block-occupancy: mean over sampled heads of the fraction of the pool's 128-token
  // blocks (16-token sub-blocks) holding a candidate at the stopping level.
  double block_occupancy_frac = 0, subblock_occupancy_frac = 0;
};

record to_record(const speed_row& r) {
  record rec = point_fields(r);
  rec.insert(rec.end(), {
      {"certificate", std::string(to_string(r.certificate))},
      {"routing", std::string(to_string(r.route))},
      {"positions", std::uint64_t(r.positions)},
      {"reps", std::uint64_t(r.reps)},
      {"dense_ms", r.dense_ms},
      {"certified_ms", r.certified_ms},
      {"speedup", r.speedup},
      {"keys_read_frac", r.keys_read_frac},
      {"keys_read_per_head", r.keys_read_per_head},
      {"bytes_read_frac", r.bytes_read_frac},
      {"certified_frac", r.certified_frac},
      {"fallback_frac", r.fallback_frac},
      {"routed_frac", r.routed_frac},
      {"over_budget_frac", r.over_budget_frac},
      {"sampled_per_head", r.sampled_per_head},
      {"candidates_per_call", r.candidates_per_call},
      {"refined_per_call", r.refined_per_call},
      {"refine_blocks_per_call", r.refine_blocks_per_call},
      {"scattered_lines_per_call", r.lines_per_call},
      {"dense_gbps", r.dense_gbps},
      {"floor_ratio", r.floor_ratio},
      {"read_gbps", r.read_gbps},
      {"dense_bw_frac", r.dense_bw_frac},
  });
  if (r.profile_stages)
    for (int i = 0; i < 6; ++i) rec.push_back({std::string("stage_ms_") + kStageNames[i], r.stage_ms[i]});
  if (r.block_occupancy) {
    rec.push_back({"block_occupancy", r.block_occupancy_frac});
    rec.push_back({"subblock_occupancy", r.subblock_occupancy_frac});
  }
  return rec;
}

/// Per-worker scratch of both methods, sized for one context.
struct worker_scratch {
  std::vector<attend_workspace> attend;
  std::vector<dense_workspace> dense;
  worker_scratch(std::size_t workers, std::size_t group, std::size_t d, std::size_t heads,
                 std::size_t tokens, bool time_stages) {
    for (std::size_t w = 0; w < workers; ++w) {
      attend.emplace_back(group, d, tokens);
      attend.back().time_stages(time_stages);
      dense.emplace_back(group, d, heads);
    }
  }
};

/// What one step measured.
struct step_result {
  double dense_s = 0, certified_s = 0;
  std::size_t keys_read = 0, bytes_read = 0, dense_bytes = 0, certified = 0, fallbacks = 0;
  std::size_t routed = 0, over_budget = 0, sampled = 0;
  std::size_t candidates = 0, refined = 0, refine_blocks = 0, scattered_lines = 0;
  double stage_s[6] = {};
  // --block-occupancy: sampled heads counted, and their 128-token blocks and 16-token
  // sub-blocks of the pool holding at least one candidate at the stopping level.
  std::size_t occupancy_heads = 0;
  double blocks_hit = 0, subblocks_hit = 0;
};

/// The fraction of the pool's 128-token blocks and 16-token sub-blocks that hold at least
/// one candidate of a head at its stopping level: a token whose 4-bit bound, perturbed by
/// E_up, reaches that level's threshold (what the candidate stage keeps for it).
void add_block_occupancy(const attend_workspace& ws, std::span<const certificate> certs,
                         const options& opt, step_result& r) {
  if (ws.last_stats().routed > 0) return;
  const std::span<const float> e_up = ws.last_perturbation_bounds();
  const std::size_t pool = e_up.size();
  if (pool == 0) return;
  const std::size_t blocks = (pool + 127) / 128, subblocks = (pool + 15) / 16;
  std::vector<std::uint8_t> hit(blocks), sub(subblocks);
  for (std::size_t g = 0; g < certs.size(); ++g) {
    const certificate& c = certs[g];
    if (!c.certified || c.exact) continue;
    const std::span<const float> u = ws.last_score_bounds(g);
    const double reference = c.max_score + grid_shift(opt.top_halvings());
    const double threshold = ln_tau(c.level, opt.grid_ratio);
    std::fill(hit.begin(), hit.end(), 0);
    std::fill(sub.begin(), sub.end(), 0);
    for (std::size_t t = 0; t < pool; ++t)
      if ((double(u[t]) - reference) + double(e_up[t]) >= threshold) hit[t / 128] = sub[t / 16] = 1;
    r.blocks_hit += double(std::count(hit.begin(), hit.end(), 1)) / double(blocks);
    r.subblocks_hit += double(std::count(sub.begin(), sub.end(), 1)) / double(subblocks);
    ++r.occupancy_heads;
  }
}

/// Dense attention over a token-major layer with a pool: one dense_attend_nhd_layer pass
/// per thread over its own range of tokens (flash-decoding's split-K), then the partial
/// softmax states merged. A single thread makes one pass over the whole layer, of any
/// format (an fp8 layer with its scale pair per KV head).
class nhd_dense_split {
 public:
  nhd_dense_split(std::size_t threads, std::size_t n, std::size_t rows, std::size_t d) : rows_(rows), d_(d) {
    constexpr std::size_t kAlign = 256;  // whole chunks of the kernel per part
    const std::size_t parts = std::max<std::size_t>(1, std::min(threads, (n + kAlign - 1) / kAlign));
    for (std::size_t p = 0; p <= parts; ++p) bounds_.push_back(std::min(n, (n * p / parts + kAlign - 1) / kAlign * kAlign));
    bounds_.back() = n;
    out_.assign(parts * rows * d, 0.0f);
    max_.assign(parts * rows, 0.0f);
    sum_.assign(parts * rows, 0.0f);
  }
  std::size_t parts() const noexcept { return bounds_.size() - 1; }


  void run(const layer_cache& lc, std::span<const float> q, std::size_t group, float scale, thread_pool& pool,
           std::vector<dense_workspace>& ws, std::span<float> out) {
#if !CERTATTN_BENCH_F16_ONLY
    if (lc.format() == cache_dtype{cache_format::q8_0, cache_format::f16})
      return run_as<block_q8_0, half>(lc, q, group, scale, pool, ws, out);
    if (lc.format() == cache_dtype{cache_format::q4_0, cache_format::f16})
      return run_as<block_q4_0, half>(lc, q, group, scale, pool, ws, out);
    switch (lc.format().key) {
      case cache_format::bf16: return run_as<bfloat16>(lc, q, group, scale, pool, ws, out);
      case cache_format::q8_0: return run_as<block_q8_0>(lc, q, group, scale, pool, ws, out);
      case cache_format::q4_0: return run_as<block_q4_0>(lc, q, group, scale, pool, ws, out);
      case cache_format::fp8_e4m3: return run_as<fp8_e4m3>(lc, q, group, scale, pool, ws, out);
      case cache_format::fp8_e5m2: return run_as<fp8_e5m2>(lc, q, group, scale, pool, ws, out);
      default: break;
    }
#endif
    run_as<half>(lc, q, group, scale, pool, ws, out);
  }

 private:
  template <class K, class V = K>
  void run_as(const layer_cache& lc, std::span<const float> q, std::size_t group, float scale,
              thread_pool& pool, std::vector<dense_workspace>& ws, std::span<float> out) {
    const std::size_t H = lc.heads(), d = d_;
    const std::size_t krow = H * format_traits<K>::units(d), vrow = H * format_traits<V>::units(d);
    // One layer pass over tokens [t0, t1): fp8 with its scales.
    auto layer = [&](std::size_t t0, std::size_t t1, std::span<float> o, dense_workspace& w) {
      const K* k = lc.keys<K>() + t0 * krow;
      const V* v = lc.values<V>() + t0 * vrow;
      if constexpr (fp8_element<K>)
        dense_attend_nhd_layer<K>(q, H, group, k, v, t1 - t0, d, scale, lc.scales(), o, w);
      else
        dense_attend_nhd_layer<K, V>(q, H, group, k, v, t1 - t0, d, scale, o, w);
    };
    if (parts() == 1) {
      layer(0, lc.tokens(), out, ws[0]);
      return;
    }
    using A = detail::dense_workspace_access;
    pool.parallel_for(parts(), [&](std::size_t p, std::size_t w) {
      const std::size_t t0 = bounds_[p], t1 = bounds_[p + 1];
      layer(t0, t1, std::span<float>(out_.data() + p * rows_ * d, rows_ * d), ws[w]);
      // The layer call leaves each row's running max and sum in the workspace.
      std::copy_n(A::max_scores(ws[w]), rows_, max_.data() + p * rows_);
      std::copy_n(A::sums(ws[w]), rows_, sum_.data() + p * rows_);
    });
    for (std::size_t r = 0; r < rows_; ++r) {
      float m = -INFINITY;
      for (std::size_t p = 0; p < parts(); ++p) m = std::max(m, max_[p * rows_ + r]);
      float den = 0.0f;
      float* o = out.data() + r * d;
      std::fill(o, o + d, 0.0f);
      for (std::size_t p = 0; p < parts(); ++p) {
        const float wgt = sum_[p * rows_ + r] * std::exp(max_[p * rows_ + r] - m);
        den += wgt;
        const float* op = out_.data() + (p * rows_ + r) * d;
        for (std::size_t i = 0; i < d; ++i) o[i] += wgt * op[i];
      }
      for (std::size_t i = 0; i < d; ++i) o[i] /= den;
    }
  }

  std::size_t rows_, d_;
  std::vector<std::size_t> bounds_;
  std::vector<float> out_, max_, sum_;
};

/// Runs `steps` decoding steps of one configuration, dense then certified in each. Every KV
/// head keeps one group_history over the steps (fresh for each configuration).
template <class ViewOf>
std::vector<step_result> run_steps(const layer_cache& lc, ViewOf view_of, const std::vector<key_index>& idx,
                                   const std::vector<float>& queries, std::size_t positions,
                                   std::size_t group, const options& opt,
                                   const layer_variant& variant, std::size_t steps, thread_pool& pool,
                                   worker_scratch& ws,
                                   const cache_flusher& flush, progress& prog, double units_per_step,
                                   bool block_occupancy) {
  const std::size_t H = lc.heads(), d = lc.head_dim(), n = lc.tokens(), G = group;
  const std::size_t dv = value_dim_of(view_of(0));  // fewer than d for a latent cache
  // Each KV head's P positions of G query heads: [P][G] consecutive query rows.
  const std::size_t P = positions, PG = P * G;
  const std::size_t per_step = H * PG * d;
  std::vector<float> out_dense(H * PG * dv), out_cert(H * PG * dv);
  const float scale = float(opt.softmax_scale);
  std::vector<certificate> certs(H * PG);
  std::vector<group_history> history(H, group_history(G)), history_before;
  std::vector<group_stats> stats(H);
  nhd_dense_split nhd(pool.size(), n, H * G, d);
  std::vector<step_result> res(steps);

  for (std::size_t s = 0; s < steps; ++s) {
    const std::span<const float> q(queries.data() + s * per_step, per_step);
    step_result& r = res[s];

    flush();
    auto t0 = bench_clock::now();
    if (P > 1) {  // the causal dense kernel: each row read once for the P G queries
      pool.parallel_for(H, [&](std::size_t h, std::size_t w) {
        dense_attend_positions(q.subspan(h * PG * d, PG * d), P, G, view_of(h), scale,
                               std::span<float>(out_dense.data() + h * PG * dv, PG * dv), ws.dense[w],
                               variant.head(h));
      });
    } else if (lc.kind() == layout_kind::kNhd) {
      nhd.run(lc, q, G, scale, pool, ws.dense, out_dense);
    } else {
      pool.parallel_for(H, [&](std::size_t h, std::size_t w) {
        dense_attend(q.subspan(h * G * d, G * d), G, view_of(h), scale,
                     std::span<float>(out_dense.data() + h * G * dv, G * dv), ws.dense[w], 0, SIZE_MAX,
                     variant.head(h));
      });
    }
    r.dense_s = seconds_since(t0);

    if (block_occupancy) history_before = history;
    flush();
    t0 = bench_clock::now();
    pool.parallel_for(H, [&](std::size_t h, std::size_t w) {
      options head_opt = opt;
      head_opt.variant = variant.head(h);
      const noise_key nk{std::uint64_t(s), 0, std::uint32_t(h)};
      if (P > 1)
        attend_positions(q.subspan(h * PG * d, PG * d), P, G, view_of(h), idx[h], nk, head_opt,
                         std::span<float>(out_cert.data() + h * PG * dv, PG * dv),
                         std::span<certificate>(certs.data() + h * PG, PG), ws.attend[w], history[h]);
      else
        attend_group(q.subspan(h * G * d, G * d), G, view_of(h), idx[h], nk, head_opt,
                     std::span<float>(out_cert.data() + h * G * dv, G * dv),
                     std::span<certificate>(certs.data() + h * G, G), ws.attend[w], history[h]);
      stats[h] = ws.attend[w].last_stats();
    });
    r.certified_s = seconds_since(t0);
    if (block_occupancy) {  // untimed: each group's call again, from the same history
      attend_workspace& aw = ws.attend[0];
      for (std::size_t h = 0; h < H; ++h) {
        group_history before = history_before[h];
        std::vector<certificate> again(G);
        options head_opt = opt;
        head_opt.variant = variant.head(h);
        attend_group(q.subspan(h * G * d, G * d), G, view_of(h), idx[h],
                     noise_key{std::uint64_t(s), 0, std::uint32_t(h)}, head_opt,
                     std::span<float>(out_cert.data() + h * G * dv, G * dv),
                     std::span<certificate>(again), aw, before);
        add_block_occupancy(aw, again, opt, r);
      }
    }

    for (std::size_t h = 0; h < H; ++h) {
      r.keys_read += stats[h].keys_read;
      r.bytes_read += stats[h].bytes_read;
      r.dense_bytes += stats[h].dense_bytes;
      r.fallbacks += stats[h].fallbacks;
      r.routed += stats[h].routed;
      r.over_budget += stats[h].over_budget;
      r.sampled += stats[h].sampled;
      r.candidates += stats[h].candidates;
      r.refined += stats[h].refined;
      r.refine_blocks += stats[h].refine_blocks;
      r.scattered_lines += stats[h].scattered_lines;
      for (int i = 0; i < 6; ++i) r.stage_s[i] += stats[h].stage_seconds[i];
    }
    for (const certificate& c : certs) r.certified += c.certified ? 1 : 0;
    prog.advance(units_per_step);
  }
  return res;
}

speed_row summarise(const std::vector<step_result>& all, std::size_t warmup, std::size_t n,
                    std::size_t H, std::size_t G, std::size_t P, std::size_t kv_bytes, double read_gbps) {
  speed_row row;
  std::vector<double> dense, cert, ratio;
  double keys = 0, bytes = 0, dense_bytes = 0, certified = 0, fallbacks = 0;
  double routed = 0, over_budget = 0, sampled = 0, occ_heads = 0, occ_blocks = 0, occ_sub = 0;
  double candidates = 0, refined = 0, refine_blocks = 0, lines = 0;
  for (std::size_t s = warmup; s < all.size(); ++s) {
    const step_result& r = all[s];
    dense.push_back(r.dense_s);
    cert.push_back(r.certified_s);
    ratio.push_back(r.dense_s / r.certified_s);
    keys += double(r.keys_read);
    bytes += double(r.bytes_read);
    dense_bytes += double(r.dense_bytes);
    certified += double(r.certified);
    fallbacks += double(r.fallbacks);
    routed += double(r.routed);
    over_budget += double(r.over_budget);
    sampled += double(r.sampled);
    candidates += double(r.candidates);
    refined += double(r.refined);
    refine_blocks += double(r.refine_blocks);
    lines += double(r.scattered_lines);
    for (int i = 0; i < 6; ++i) row.stage_ms[i] += 1e3 * r.stage_s[i];
    occ_heads += double(r.occupancy_heads);
    occ_blocks += r.blocks_hit;
    occ_sub += r.subblocks_hit;
  }
  if (occ_heads > 0) {
    row.block_occupancy_frac = occ_blocks / occ_heads;
    row.subblock_occupancy_frac = occ_sub / occ_heads;
  }
  // calls: query heads answered (P positions of G heads per KV head); group_calls: calls
  // of the library (one per KV head and step, whatever its positions).
  const double steps = double(dense.size()), calls = steps * double(H * G * P);
  row.reps = dense.size();
  row.dense_ms = 1e3 * median(dense);
  row.certified_ms = 1e3 * median(cert);
  row.speedup = median(ratio);
  row.keys_read_per_head = keys / calls;
  row.keys_read_frac = keys / (calls * double(n));
  row.bytes_read_frac = bytes / dense_bytes;
  row.certified_frac = certified / calls;
  row.fallback_frac = fallbacks / calls;
  row.routed_frac = routed / calls;
  row.over_budget_frac = over_budget / calls;
  row.sampled_per_head = sampled / calls;
  const double group_calls = steps * double(H);
  row.candidates_per_call = candidates / group_calls;
  row.refined_per_call = refined / group_calls;
  row.refine_blocks_per_call = refine_blocks / group_calls;
  row.lines_per_call = lines / group_calls;
  row.dense_gbps = double(kv_bytes) / (row.dense_ms * 1e-3) * 1e-9;
  row.read_gbps = read_gbps;
  row.dense_bw_frac = row.dense_gbps / read_gbps;
  const double floor_ms = row.bytes_read_frac * double(kv_bytes) / (read_gbps * 1e9) * 1e3;
  row.floor_ratio = floor_ms > 0 ? row.certified_ms / floor_ms : 0.0;
  for (double& x : row.stage_ms) x /= steps;
  return row;
}

// ---- output ----------------------------------------------------------------------------------

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}
std::string join(const std::vector<double>& v) {
  std::string s;
  for (double x : v) s += (s.empty() ? "" : ",") + strf("%g", x);
  return s;
}

std::string series_label(const speed_row& r, bool layouts, bool threads, bool regimes, bool eps, bool delta,
                         bool certificates) {
  std::string s;
  auto add = [&s](const std::string& x) { s += (s.empty() ? "" : ", ") + x; };
  if (certificates) add(std::string(to_string(r.certificate)));
  if (layouts) add(std::string(to_string(r.layout)));
  if (threads) add(std::to_string(r.threads) + (r.threads == 1 ? " thread" : " threads"));
  if (regimes) add(std::string(syn::to_string(r.regime)));
  if (eps) add(strf("eps %g", r.eps));
  if (delta) add(strf("delta %g", r.delta));
  return s.empty() ? "certified" : s;
}

void report(const speed_flags& f, const grid& g, const std::vector<certificate_kind>& certificates,
            const std::vector<speed_row>& rows, const std::map<std::size_t, double>& bandwidth) {
  const bool many_regimes = g.regimes.size() > 1, many_eps = f.eps.size() > 1, many_delta = f.delta.size() > 1;
  const bool many_certificates = certificates.size() > 1;
  // The certificate column is shown even for one certificate: the default (tight) is not the
  // paper's, and a row without it would be read against the paper's tables.
  const bool dtypes = g.dtypes.size() > 1 || g.dtypes[0] != cache_dtype{};
  std::vector<std::string> headers{"context", "<layout", "thr"};
  if (dtypes) headers.push_back("<dtype");
  if (many_regimes) headers.push_back("<regime");
  if (many_eps) headers.push_back("eps");
  if (many_delta) headers.push_back("delta");
  const bool many_positions = f.positions.size() > 1 || f.positions[0] != 1;
  headers.push_back("<cert");
  headers.push_back("<route");
  if (many_positions) headers.push_back("pos");
  const std::size_t id_columns = headers.size();  // the columns that name a row's configuration
  for (const char* h : {"dense ms", "cert ms", "speedup", "keys %", "keys/head", "bytes %", "cand/call",
                        "refined/call", "lines/call", "certified %", "exact %", "dense GB/s", "of read bw",
                        "x floor"})
    headers.push_back(h);
  text_table table(headers);
  std::vector<std::vector<std::string>> row_ids;  // each row's identifying cells
  for (const speed_row& r : rows) {
    std::vector<std::string> c{format_count(r.context), std::string(to_string(r.layout)), std::to_string(r.threads)};
    if (dtypes) c.push_back(to_string(r.dtype));
    if (many_regimes) c.push_back(std::string(syn::to_string(r.regime)));
    if (many_eps) c.push_back(strf("%g", r.eps));
    if (many_delta) c.push_back(strf("%g", r.delta));
    c.push_back(std::string(to_string(r.certificate)));
    c.push_back(std::string(to_string(r.route)));
    if (many_positions) c.push_back(std::to_string(r.positions));
    row_ids.push_back(c);
    c.push_back(strf("%.2f", r.dense_ms));
    c.push_back(strf("%.2f", r.certified_ms));
    c.push_back(strf("%.2fx", r.speedup));
    c.push_back(strf("%.2f", 100.0 * r.keys_read_frac));
    c.push_back(strf("%.0f", r.keys_read_per_head));
    c.push_back(strf("%.1f", 100.0 * r.bytes_read_frac));
    c.push_back(strf("%.0f", r.candidates_per_call));
    c.push_back(strf("%.0f", r.refined_per_call));
    c.push_back(strf("%.0f", r.lines_per_call));
    c.push_back(strf("%.1f", 100.0 * r.certified_frac));
    c.push_back(strf("%.1f", 100.0 * (r.routed_frac + r.over_budget_frac + r.fallback_frac)));
    c.push_back(strf("%.1f", r.dense_gbps));
    c.push_back(strf("%.0f%%", 100.0 * r.dense_bw_frac));
    c.push_back(strf("%.2f", r.floor_ratio));
    table.add_row(c);
  }
  std::printf("\n");
  table.print(stdout);
  std::printf(
      "\nmedians over %zu steps (one layer, all %zu KV heads, G = %zu, head_dim %zu, %s); speedup = median of "
      "per-step dense/certified ratios.\nkeys %% = exact key rows read per query head / context; bytes %% = "
      "group_stats.bytes_read / dense_bytes (K and V once); cand/call, refined/call, lines/call = pool keys "
      "bucketed as candidates, 8-bit refinements and cache lines of rows read at scattered places (8-bit "
      "codes' low nibbles, 4-bit step rows, pool keys and values) per group call (one KV head); cert = tight "
      "(every step after the first hinted with the levels of the step before) or classic (the paper's).\n"
      "route = options.route (auto: group_history routes groups whose sparse path lost to the dense kernel, "
      "and a group stops sampling at sample_budget()); exact %% = query heads answered by exact attention "
      "(routed, over budget or fallback).\npos = query positions per call (--positions: attend_positions() "
      "against the causal dense kernel dense_attend_positions(); keys/head and certified %% per query head and "
      "position, cand/call, refined/call and lines/call per call).\nx floor = cert ms / (the call's bytes at "
      "the read bandwidth measured with as many threads): 1 is a call at its memory floor.\n",
      f.reps, f.kv_heads, f.group, f.head_dim,
      dtypes ? "dense = the dense kernel over the cache in its dtype" : "fp16");

  if (f.profile_stages) {
    // The main table's identifying columns, so that each stage row names its configuration.
    std::vector<std::string> sh(headers.begin(), headers.begin() + std::ptrdiff_t(id_columns));
    for (const char* s : kStageNames) sh.push_back(std::string(s) + " ms");
    text_table stages(sh);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      std::vector<std::string> c = row_ids[i];
      for (double x : rows[i].stage_ms) c.push_back(strf("%.3f", x));
      stages.add_row(c);
    }
    std::printf("\ncertified call by stage (--profile-stages): ms per step, summed over heads\n");
    stages.print(stdout);
  }

  if (f.block_occupancy) {
    text_table occ({"context", "<layout", "thr", "<regime", "<cert", "<route", "blocks %", "sub-blocks %"});
    for (const speed_row& r : rows)
      occ.add_row({format_count(r.context), std::string(to_string(r.layout)), std::to_string(r.threads),
                   std::string(syn::to_string(r.regime)), std::string(to_string(r.certificate)),
                   std::string(to_string(r.route)), strf("%.1f", 100.0 * r.block_occupancy_frac),
                   strf("%.1f", 100.0 * r.subblock_occupancy_frac)});
    std::printf("\n128-token blocks and 16-token sub-blocks of the pool holding at least one candidate at the "
                "stopping level (--block-occupancy; mean over sampled heads and timed steps):\n");
    occ.print(stdout);
  }

  std::vector<record> recs;
  for (const speed_row& r : rows) recs.push_back(to_record(r));
  if (!f.json.empty()) {
    json_writer j;
    j.begin_object().key("command").value("speed");
    j.key("machine").begin_object();
    j.key("read_gbps").value(bandwidth.at(1));
    j.key("read_gbps_by_threads").begin_object(true);
    for (const auto& [t, bw] : bandwidth) j.key(std::to_string(t)).value(bw);
    j.end_object();
    machine_fields(j);
    j.end_object();
    j.key("config").begin_object(true);
    j.key("reps").value(std::uint64_t(f.reps)).key("warmup").value(std::uint64_t(f.warmup));
    j.key("seed").value(std::uint64_t(f.seed)).key("bandwidth_mib").value(std::uint64_t(f.bandwidth_mib));
    j.key("flush_mib").value(std::uint64_t(f.flush_mib));
    j.key("profile_stages").value(f.profile_stages);
    j.end_object();
    finish_json(j, recs, f.json);
  }
  if (!f.csv.empty()) {
    write_csv(f.csv, recs);
  }
  if (!f.plot.empty()) {
    const bool ml = g.layouts.size() > 1, mt = g.threads.size() > 1;
    plot_spec speed{"speedup_vs_context.png", "certified vs dense attention, one decoding step of one layer",
                    "context (tokens)", "speedup over dense (median of per-step ratios)", true, true, 1.0, {}};
    plot_spec keys{"keys_read_vs_context.png", "exact key rows read per query head",
                   "context (tokens)", "keys read per query head", true, true, -1.0, {}};
    std::map<std::string, std::size_t> where;
    for (const speed_row& r : rows) {
      const std::string label = series_label(r, ml, mt, many_regimes, many_eps, many_delta, many_certificates);
      if (!where.count(label)) {
        where[label] = speed.series.size();
        speed.series.push_back({label, {}, {}});
        keys.series.push_back({label, {}, {}});
      }
      const std::size_t i = where[label];
      speed.series[i].x.push_back(double(r.context));
      speed.series[i].y.push_back(r.speedup);
      keys.series[i].x.push_back(double(r.context));
      keys.series[i].y.push_back(r.keys_read_per_head);
    }
    for (const std::string& file : write_plots(f.plot, {speed, keys})) std::printf("wrote %s\n", file.c_str());
  }
}

// ---- the cost model ----------------------------------------------------------------------------

/// One step without routing: x = pool keys the heads sampled per token (summed over the
/// heads of a group, averaged over the groups), y = certified time / dense time.
struct cost_point {
  double x = 0, y = 0;
};

/// Least squares y = fixed + per_key * x over the steps without routing (steps with an
/// exact fallback excluded: they add a dense pass the model does not count).
void print_cost_fit(const std::vector<cost_point>& pts) {
  if (pts.size() < 3) {
    std::printf("\ncost model: too few steps without routing to fit (%zu)\n", pts.size());
    return;
  }
  double sx = 0, sy = 0, sxx = 0, sxy = 0, syy = 0;
  for (const cost_point& p : pts) {
    sx += p.x, sy += p.y, sxx += p.x * p.x, sxy += p.x * p.y, syy += p.y * p.y;
  }
  const double m = double(pts.size());
  const double vx = sxx - sx * sx / m, vy = syy - sy * sy / m, cxy = sxy - sx * sy / m;
  if (!(vx > 0)) {
    std::printf("\ncost model: the steps do not vary in keys sampled: no fit\n");
    return;
  }
  const double per_key = cxy / vx, fixed = (sy - per_key * sx) / m;
  const double r2 = vy > 0 ? cxy * cxy / (vx * vy) : 1.0;
  std::printf("\ncost model (least squares over %zu steps without routing: certified/dense time = fixed + per_key * "
              "sampled keys per group / context):\n  fixed %.3f, per_key %.2f, R^2 %.2f; options.cost = {%.3f, %.2f} "
              "(break-even: %.2f%% of the context sampled per group)\n",
              pts.size(), fixed, per_key, r2, fixed, per_key, 100.0 * (1.0 - fixed) / per_key);
}

// ---- the command -------------------------------------------------------------------------------

void run_speed(const speed_flags& f) {
  const grid g = resolve(f);
  if (!g.variant.plain() && std::find(g.layouts.begin(), g.layouts.end(), layout_kind::kNhd) != g.layouts.end())
    throw error("--variant " + g.variant.text +
                ": the nhd layout's dense baseline (dense_attend_nhd_layer) computes plain attention only; use "
                "--layout hnd or paged");
  const layer_variant variant(g.variant, f.kv_heads, f.group, f.seed);
  if (g.variant.latent > 0) {
    if (g.variant.latent > f.head_dim)
      throw error("--variant latent:" + std::to_string(g.variant.latent) + ": the value width exceeds --head-dim " +
                  std::to_string(f.head_dim));
    for (layout_kind l : g.layouts)
      if (l != layout_kind::kHnd) throw error("--variant latent:DV runs on the hnd layout only");
    if (g.dtypes.size() > 1 || g.dtypes[0] != cache_dtype{})
      throw error("--variant latent:DV runs on the f16 cache only");
  }
  const std::vector<certificate_kind> certificates = certificates_from(f.certificates);
  std::size_t max_positions = 1;
  for (std::size_t p : f.positions) {
    if (p == 0 || p > 64) throw error("--positions " + std::to_string(p) + ": each must lie in [1, 64]");
    max_positions = std::max(max_positions, p);
  }
  if (max_positions > 1 && f.block_occupancy)
    throw error("--block-occupancy runs with --positions 1 only");
  if (max_positions > 1 && g.variant.latent > 0)
    throw error("--variant latent:DV runs with --positions 1 only");
  std::vector<routing> routings;
  for (const std::string& r : f.routings) {
    const routing x = routing_from_string(r);
    if (std::find(routings.begin(), routings.end(), x) == routings.end()) routings.push_back(x);
  }
  if (f.fit_cost && std::find(routings.begin(), routings.end(), routing::kOff) == routings.end())
    routings.push_back(routing::kOff);
  std::vector<cost_point> cost_points;
  const std::size_t H = f.kv_heads, G = f.group, d = f.head_dim;
  const std::size_t steps = f.warmup + f.reps;
  pools P(g.threads);
  const cache_flusher flush(f.flush_mib);

  // Work units ~ bytes touched: a step costs n*H per method; building the cache and the
  // indexes of a context costs about as much as kSetupSteps steps (measured on the dev box).
  constexpr double kSetupSteps = 150.0;
  double total = 0;
  for (std::size_t n : g.contexts) {
    total += double(g.regimes.size()) * double(n * H) * kSetupSteps;
    total += double(g.regimes.size() * g.layouts.size() * g.threads.size() * f.eps.size() * f.delta.size() *
                    certificates.size() * routings.size() * f.positions.size()) *
             double(steps) * double(n * H);
  }
  progress prog("certattn-bench speed", total, !f.quiet);

  // Per thread count, and always for one thread (the machine's figure in the JSON).
  std::map<std::size_t, double> bandwidth;
  prog.set_stage("measuring read bandwidth");
  for (std::size_t t : g.threads) bandwidth[t] = read_bandwidth_gbps(P.get(t), f.bandwidth_mib);
  if (!bandwidth.count(1)) {
    thread_pool one(1);
    bandwidth[1] = read_bandwidth_gbps(one, f.bandwidth_mib);
  }
  std::printf("machine: isa %s, %zu hardware threads; read bandwidth", std::string(to_string(active_isa())).c_str(),
              threads_available());
  for (const auto& [t, bw] : bandwidth) std::printf("  %zu thread%s %.1f GB/s", t, t == 1 ? "" : "s", bw);
  std::printf("\n");
  std::printf("grid: regime %s, eps %s, delta %s, certificate %s, kv_heads %zu, group %zu, head_dim %zu, variant %s, "
              "%zu warm-up + %zu timed steps\n",
              join(f.regimes).c_str(), join(f.eps).c_str(), join(f.delta).c_str(), join(f.certificates).c_str(), H, G,
              d, g.variant.text.c_str(), f.warmup, f.reps);
  std::fflush(stdout);

  std::vector<speed_row> rows;
  for (syn::regime regime : g.regimes) {
    for (std::size_t n : g.contexts) {
      const std::string ctx = format_count(n) + " " + std::string(syn::to_string(regime));
      prog.set_stage(ctx + ": synthetic cache");
      syn::cache_config cfg;
      cfg.n_tokens = n;
      cfg.head_dim = d;
      cfg.kv_heads = H;
      cfg.kind = regime;
      cfg.seed = f.seed;
      const syn::kv_cache cache = syn::make_cache(cfg);
      // Per --positions value: each KV head's P positions of G query heads.
      std::map<std::size_t, std::vector<float>> queries_of;
      for (std::size_t p : f.positions) queries_of[p] = make_step_queries(cache, p * G, steps);
      worker_scratch scratch(P.largest().size(), max_positions * G, d, H, n, f.profile_stages);
      for (const cache_dtype& dtype : g.dtypes) {
      // The index of each KV head, built from the head-major cache in this format (every
      // layout of it stores the same numbers).
      prog.set_stage(ctx + " " + to_string(dtype) + ": key indexes");
      const std::unique_ptr<const layer_cache> hnd =
          std::make_unique<const layer_cache>(cache, layout_kind::kHnd, f.seed, dtype);
      std::vector<key_index> idx(H, key_index(d));
      const std::size_t dv = g.variant.latent;
      P.largest().parallel_for(H, [&](std::size_t h, std::size_t) {
        if (dv > 0) {  // the key rows as latent rows: values their first dv channels
          const strided_kv<half> kv = hnd->strided(h);
          idx[h].build(latent_kv<half>(kv.key(0), n, d, dv, kv.key_stride()));
        } else {
          hnd->visit([&](auto view_of) {
            idx[h].build(view_of(h));
            return 0;
          });
        }
      });
      prog.advance(double(n * H) * kSetupSteps);

      for (layout_kind layout : g.layouts) {
        const std::unique_ptr<const layer_cache> own =
            layout == layout_kind::kHnd ? nullptr : std::make_unique<const layer_cache>(cache, layout, f.seed, dtype);
        const layer_cache& lc = own ? *own : *hnd;
        for (std::size_t t : g.threads)
          for (double eps : f.eps)
            for (double delta : f.delta)
              for (certificate_kind cert : certificates)
                for (routing route : routings)
                for (std::size_t positions : f.positions) {
                  const std::vector<float>& queries = queries_of.at(positions);
                  prog.set_stage(ctx + " " + std::string(to_string(layout)) + " " + std::to_string(t) + "T " +
                                 std::string(to_string(cert)) + " " + std::string(to_string(route)) +
                                 (positions > 1 ? " " + std::to_string(positions) + " positions" : ""));
                  options opt;
                  opt.epsilon = eps;
                  opt.delta = delta;
                  opt.seed = f.seed;
                  opt.certificate = cert;
                  opt.route = route;
                  opt.softmax_scale = f.softmax_scale;
                  const std::vector<step_result> res =
                      dv > 0 ? run_steps(lc,
                                         [&](std::size_t h) {
                                           const strided_kv<half> kv = lc.strided(h);
                                           return latent_kv<half>(kv.key(0), n, d, dv, kv.key_stride());
                                         },
                                         idx, queries, positions, G, opt, variant, steps, P.get(t), scratch,
                                         flush, prog,
                                         2.0 * double(n * H), f.block_occupancy)
                             : lc.visit([&](auto view_of) {
                                 return run_steps(lc, view_of, idx, queries, positions, G, opt, variant, steps,
                                                  P.get(t), scratch, flush, prog, 2.0 * double(n * H),
                                                  f.block_occupancy);
                               });
                  // A latent layer's dense pass reads each row once (the values are inside the keys).
                  const std::size_t kv_bytes = dv > 0 ? lc.kv_bytes(n) / 2 : lc.kv_bytes(n);
                  speed_row row = summarise(res, f.warmup, n, H, G, positions, kv_bytes, bandwidth.at(t));
                  static_cast<run_point&>(row) = {n, H, G, d, t, layout, regime, eps, delta, dtype};
                  row.certificate = cert;
                  row.route = route;
                  row.positions = positions;
                  row.profile_stages = f.profile_stages;
                  row.block_occupancy = f.block_occupancy;
                  rows.push_back(row);
                  if (route == routing::kOff && positions == 1)
                    for (std::size_t s = f.warmup; s < res.size(); ++s)
                      if (res[s].fallbacks == 0)
                        cost_points.push_back({double(res[s].sampled) / double(H * n),
                                               res[s].certified_s / res[s].dense_s});
                }
      }
      }
    }
  }
  prog.finish();
  report(f, g, certificates, rows, bandwidth);
  if (f.fit_cost) print_cost_fit(cost_points);
}

}  // namespace

void add_speed_command(CLI::App& app) {
  auto f = std::make_shared<speed_flags>();
  CLI::App* cmd = app.add_subcommand(
      "speed",
      "time one decoding step of one layer: dense attention vs the certified call (median ms, speedup, keys and "
      "bytes read, fraction certified, bandwidth)");
  add_grid_flags(*cmd, *f, "timed decoding steps per configuration (after the warm-up)");
  cmd->add_option("--bandwidth-mib", f->bandwidth_mib, "buffer size of the read-bandwidth measurement (MiB)")
      ->capture_default_str();
  add_certificate_flag(*cmd, f->certificates);
  cmd->add_option("--routing", f->routings,
                  "options.route of the certified call, comma-separated: auto (exact answers where the sparse path "
                  "costs more than dense), off")
      ->delimiter(',')
      ->check(CLI::IsMember({"auto", "off"}))
      ->capture_default_str();
  cmd->add_option("--positions", f->positions,
                  "query positions per call, comma-separated (speculative verification's drafts: attend_positions() "
                  "against the causal dense kernel over the same positions)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_flag("--fit-cost", f->fit_cost,
                "fit the cost model (options.cost) by least squares over the steps run with --routing off (added "
                "when missing) and print it");
  cmd->add_flag("--block-occupancy", f->block_occupancy,
                "after each timed step, run each group's call again (untimed) and report the fraction of the pool's "
                "128-token blocks and 16-token sub-blocks holding a candidate at each sampled head's stopping level");
  cmd->add_flag("--profile-stages", f->profile_stages,
                "time the certified call by stage (attend_workspace::time_stages) and print the stage table");
  cmd->callback([f] { run_speed(*f); });
}

}  // namespace certattn::bench
