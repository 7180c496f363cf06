// certattn-bench monitor: the runtime fidelity monitor (docs/monitor.md) on a simulated
// generation. A synthetic cache grows by one token per decoding step; every step runs
// layers x KV heads x group attention calls for each method (the certified call, oracle
// top-k at the certified call's mean keys read, StreamingLLM sinks + window at the same
// budget). Each method has its own fidelity_monitor, fed every call with a label-free
// signal; the calls it selects are probed with exact dense attention. Because this is a
// simulation, exact attention also runs on every call, so the monitor's statement can be
// printed beside the true exceedance rate it bounds.
//
// Two passes over the same generation: the first runs the certified call (it owns the key
// index, appended each step) and fixes k = round(mean keys read); the second computes the
// truth and the baselines step by step and feeds the monitors in call order.
#include "baselines/oracle.hpp"
#include "baselines/streaming.hpp"
#include "bench_common.hpp"
#include "commands.hpp"
#include "eval_common.hpp"
#include "report.hpp"

#include <certattn/exact.hpp>
#include <certattn/monitor/monitor.hpp>
#include <certattn/parallel.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>

namespace certattn::bench {
namespace {

namespace bl = baselines;

struct monitor_flags {
  std::string context = "8K";
  std::size_t steps = 64, layers = 2, kv_heads = 2, group = 4, head_dim = 128;
  std::string regime = "mixed";
  double eps = 0.1, delta = 0.05, alpha = 0.05;
  std::string estimator = "empirical_bernstein";
  double probe_rate = 0.05, p_min = 0.01;
  std::size_t samples = 16;  // dropped keys sampled for the sinks + window signal
  std::size_t threads = 0;
  std::uint64_t seed = 1;
  std::string json, csv;
  bool quiet = false;
};

// The methods, in the order of the table.
enum method_id : std::size_t { kCertified = 0, kTopK = 1, kSinks = 2, kMethods = 3 };
const char* const kMethodName[kMethods] = {"certified", "oracle top-k", "sinks+window"};

/// Per call and method: the estimate, its label-free signal and the truth.
struct call_record {
  double signal = 0.0;
  double err = 0.0;  // ||o^ - o|| / M, against exact attention in double
  bool exceeded = false;
  double keys = 0.0;
};

/// One layer's synthetic cache of n0 + steps tokens; step s sees its first n0 + s + 1.
struct layer_data {
  synthetic::kv_cache cache;
  std::vector<float> queries;  // [steps][kv_heads][group][d]
  strided_kv<half> view(std::size_t h) const {
    const auto& c = cache.config;
    return hnd_view(cache.keys.data(), cache.values.data(), c.n_tokens, c.n_tokens, c.kv_heads,
                    c.head_dim, h);
  }
};

struct sim {
  std::size_t n0, S, L, H, G, d;
  std::size_t call_id(std::size_t s, std::size_t l, std::size_t h, std::size_t g) const {
    return ((s * L + l) * H + h) * G + g;
  }
  std::size_t calls() const { return S * L * H * G; }
};

/// ||a - b|| / M for an estimate a against the exact output b.
template <class T>
double rel_error(const T* a, const std::vector<double>& b, double M) {
  return distance(a, b) / std::max(M, 1e-300);
}

/// Pass 1: the certified call over the whole generation. Each (layer, KV head) item owns
/// its key index (built after prefill, appended once per step) and workspace.
void run_certified(const sim& z, const std::vector<layer_data>& layers, const options& opt,
                   thread_pool& pool, std::vector<float>& out, std::vector<certificate>& certs) {
  out.assign(z.calls() * z.d, 0.0f);
  certs.assign(z.calls(), {});
  pool.parallel_for(z.L * z.H, [&](std::size_t item, std::size_t) {
    const std::size_t l = item / z.H, h = item % z.H;
    const strided_kv<half> kv = layers[l].view(h);
    key_index idx(z.d);
    idx.reserve(z.n0 + z.S);
    idx.build(kv.prefix(z.n0));
    attend_workspace ws(z.G, z.d, z.n0 + z.S);
    for (std::size_t s = 0; s < z.S; ++s) {
      const std::size_t n = z.n0 + s + 1;  // this step's token appended, then attended
      idx.append(kv.prefix(n), n - 1);
      const std::size_t c0 = z.call_id(s, l, h, 0);
      const float* q = layers[l].queries.data() + (s * z.H + h) * z.G * z.d;
      attend_group(std::span<const float>(q, z.G * z.d), z.G, kv.prefix(n), idx,
                   noise_key{std::uint64_t(s), std::uint32_t(l), std::uint32_t(h)}, opt,
                   std::span<float>(out.data() + c0 * z.d, z.G * z.d),
                   std::span<certificate>(certs.data() + c0, z.G), ws);
    }
  });
}

/// Per-worker buffers of pass 2.
struct worker {
  exact_call ex;
  bl::scratch ws;
  std::vector<std::uint32_t> order;
  std::vector<double> out;
};

/// The label-free signal of oracle top-k: an upper bound on the attention mass it dropped,
/// from the scores it kept. Every dropped key scores at most the k-th largest score s_k, so
/// dropped <= (n - k) exp(s_k - c) =: U, and the signal is U / (kept + U) in [0, 1].
double topk_signal(std::span<const double> w, std::span<const std::uint32_t> order, std::size_t k,
                   std::size_t n) {
  double kept = 0.0;
  for (std::size_t i = 0; i < k; ++i) kept += w[order[i]];
  const double u = double(n - k) * w[order[k - 1]];
  return kept + u > 0.0 ? u / (kept + u) : 0.0;
}

/// The label-free signal of sinks + window: the dropped mass estimated from m dropped keys
/// drawn uniformly (with replacement) and scored exactly, m extra key reads:
/// dropped^ = (n_dropped / m) sum exp(s_j - c), signal = dropped^ / (kept + dropped^).
double sinks_signal(std::span<const double> w, std::size_t sinks, std::size_t budget, std::size_t n,
                    std::size_t m, std::uint64_t seed) {
  const std::size_t recent = budget - sinks;
  double kept = 0.0;
  for (std::size_t t = 0; t < sinks; ++t) kept += w[t];
  for (std::size_t t = n - recent; t < n; ++t) kept += w[t];
  const std::size_t dropped = n - budget;  // tokens [sinks, n - recent)
  if (dropped == 0 || m == 0) return 0.0;
  bl::rng r(seed);
  double sum = 0.0;
  for (std::size_t j = 0; j < m; ++j) {
    const std::size_t t = sinks + std::min(dropped - 1, std::size_t(r.uniform() * double(dropped)));
    sum += w[t];
  }
  const double est = double(dropped) / double(m) * sum;
  return kept + est > 0.0 ? est / (kept + est) : 0.0;
}

struct method_row {
  std::string name, config;
  fidelity_statement st;
  double true_rate = 0, mean_keys = 0, mean_signal = 0, p90_err = 0, max_err = 0;
  std::size_t mismatches = 0;  // probes whose dense outcome differed from the truth
};

void run_monitor(const monitor_flags& f) {
  const cs_estimator est = cs_estimator_from_string(f.estimator);
  const std::size_t n0 = parse_count(f.context);
  if (n0 <= 64) throw error("--context must exceed the 64-token window");
  if (f.steps == 0 || f.layers == 0 || f.kv_heads == 0 || f.group == 0)
    throw error("--steps, --layers, --kv-heads and --group must be > 0");
  if (f.head_dim == 0 || f.head_dim % 2) throw error("--head-dim must be even and > 0");
  options opt;
  opt.epsilon = f.eps;
  opt.delta = f.delta;
  opt.seed = f.seed;
  opt.scale = error_scale::kValueScale;
  opt.route = routing::kOff;  // the monitor watches the sparse path's certificates
  validate(opt);
  monitor_options mo;
  mo.estimator = est;
  mo.alpha = f.alpha;
  mo.epsilon = f.eps;
  mo.scheduler.target_rate = f.probe_rate;
  mo.scheduler.p_min = f.p_min;
  validate(mo);  // throws on a bad --alpha, --probe-rate or --p-min
  const synthetic::regime regime = synthetic::regime_from_string(f.regime);

  const sim z{n0, f.steps, f.layers, f.kv_heads, f.group, f.head_dim};
  thread_pool pool(f.threads);
  std::printf("monitor: %s/%s + %zu steps, %zu layers x %zu KV heads x group %zu = %zu calls per method, "
              "eps %g, delta %g, alpha %g, %s, probe rate %g (p_min %g), %zu threads, isa %s\n",
              f.regime.c_str(), format_count(n0).c_str(), z.S, z.L, z.H, z.G, z.calls(), f.eps, f.delta,
              f.alpha, std::string(to_string(est)).c_str(), f.probe_rate, f.p_min, pool.size(),
              std::string(to_string(active_isa())).c_str());
  std::fflush(stdout);
  const auto t0 = bench_clock::now();
  progress prog("certattn-bench monitor", double(z.calls()) * 2.0, !f.quiet);

  // The caches (one per layer: its own seed) and the queries of every step.
  prog.set_stage("synthetic caches");
  std::vector<layer_data> layers(z.L);
  for (std::size_t l = 0; l < z.L; ++l) {
    synthetic::cache_config cfg;
    cfg.n_tokens = n0 + z.S;
    cfg.head_dim = z.d;
    cfg.kv_heads = z.H;
    cfg.kind = regime;
    cfg.seed = bl::mix_seed(f.seed, l + 1);
    layers[l].cache = synthetic::make_cache(cfg);
    layers[l].queries = make_step_queries(layers[l].cache, z.G, z.S);
  }

  // Pass 1: the certified call; it fixes the baselines' budget.
  prog.set_stage("certified calls");
  std::vector<float> cert_out;
  std::vector<certificate> certs;
  run_certified(z, layers, opt, pool, cert_out, certs);
  prog.advance(double(z.calls()));
  double mean_keys = 0;
  for (const certificate& c : certs) mean_keys += double(c.keys_read);
  mean_keys /= double(z.calls());
  const std::size_t k = std::clamp<std::size_t>(std::size_t(std::llround(mean_keys)), 5, n0);

  bl::budgets b;
  b.keys = {k};
  b.shared = {k};
  b.coarse = {k};
  bl::oracle_top_k topk;
  bl::streaming_llm sinks;
  topk.configure(b, n0, z.d);
  sinks.configure(b, n0, z.d);
  const std::size_t kSinkTokens = 4;  // as bench/baselines/streaming.hpp
  const double scale = opt.effective_softmax_scale(z.d);

  // Pass 2, step by step: truth and baselines (parallel over layers x heads), then every
  // call of the step goes through its method's monitor in call order.
  std::vector<fidelity_monitor> mons;
  for (std::size_t m = 0; m < kMethods; ++m) {
    monitor_options o = mo;
    o.seed = bl::mix_seed(mo.seed, m + 1);
    mons.emplace_back(o);
  }
  std::vector<call_record> rec(kMethods * z.calls());
  auto R = [&](std::size_t m, std::size_t ci) -> call_record& { return rec[m * z.calls() + ci]; };
  std::vector<double> base_out(2 * z.calls() * z.d);  // [top-k, sinks][calls][d]: for probes
  std::vector<worker> workers(pool.size());
  std::vector<method_row> rows(kMethods);

  for (std::size_t s = 0; s < z.S; ++s) {
    const std::size_t n = n0 + s + 1;
    prog.set_stage(strf("step %zu/%zu", s + 1, z.S));
    pool.parallel_for(z.L * z.H, [&](std::size_t item, std::size_t wi) {
      const std::size_t l = item / z.H, h = item % z.H;
      worker& w = workers[wi];
      const half* K = layers[l].cache.keys.data() + h * (n0 + z.S) * z.d;
      const half* V = layers[l].cache.values.data() + h * (n0 + z.S) * z.d;
      bl::head_input hi;
      hi.keys = K;
      hi.values = V;
      hi.n = n;
      hi.d = z.d;
      hi.group = z.G;
      hi.scale = scale;
      for (std::size_t g = 0; g < z.G; ++g) {
        const std::size_t ci = z.call_id(s, l, h, g);
        const float* q = layers[l].queries.data() + ((s * z.H + h) * z.G + g) * z.d;
        exact_attend(q, K, V, n, z.d, scale, w.ex);
        // certified
        const certificate& c = certs[ci];
        call_record& rc = R(kCertified, ci);
        rc.signal = c.exact ? 0.0 : c.bound / f.eps;
        rc.err = rel_error(cert_out.data() + ci * z.d, w.ex.o, w.ex.M);
        rc.keys = double(c.keys_read);
        // the k keys of largest score first (oracle top-k reads order[0, k))
        w.order.resize(n);
        std::iota(w.order.begin(), w.order.end(), 0u);
        const std::size_t kk = std::min(k, n);
        std::partial_sort(w.order.begin(), w.order.begin() + std::ptrdiff_t(kk), w.order.end(),
                          [&](std::uint32_t a, std::uint32_t bb) {
                            return w.ex.s[a] > w.ex.s[bb] || (w.ex.s[a] == w.ex.s[bb] && a < bb);
                          });
        bl::call_input in;
        in.q = q;
        in.s = w.ex.s;
        in.w = w.ex.w;
        in.c = w.ex.c;
        in.denominator = w.ex.D;
        in.order = w.order;
        in.noise = noise_key{std::uint64_t(s), std::uint32_t(l), std::uint32_t(h)};
        bl::config_result res[1];
        double* ok = base_out.data() + ci * z.d;
        double* os = base_out.data() + (z.calls() + ci) * z.d;
        topk.run(hi, in, w.ws, std::span<double>(ok, z.d), res);
        call_record& rk = R(kTopK, ci);
        rk.signal = topk_signal(w.ex.w, w.order, kk, n);
        rk.err = rel_error(ok, w.ex.o, w.ex.M);
        rk.keys = res[0].keys;
        sinks.run(hi, in, w.ws, std::span<double>(os, z.d), res);
        call_record& rs = R(kSinks, ci);
        rs.signal = sinks_signal(w.ex.w, kSinkTokens, std::min(std::max(k, kSinkTokens + 1), n), n,
                                 f.samples, bl::mix_seed(f.seed ^ 0x5a5aull, ci + 1));
        rs.err = rel_error(os, w.ex.o, w.ex.M);
        rs.keys = res[0].keys + double(f.samples);
        for (std::size_t m = 0; m < kMethods; ++m) R(m, ci).exceeded = R(m, ci).err > f.eps;
      }
    });
    prog.advance(double(z.L * z.H * z.G));

    // The monitors, in call order. A probe is what an engine would run: exact attention on
    // the state the call saw (this step's prefix), its error against the method's output.
    for (std::size_t m = 0; m < kMethods; ++m) mons[m].begin_step(std::numeric_limits<double>::infinity());
    for (std::size_t l = 0; l < z.L; ++l)
      for (std::size_t h = 0; h < z.H; ++h)
        for (std::size_t g = 0; g < z.G; ++g) {
          const std::size_t ci = z.call_id(s, l, h, g);
          for (std::size_t m = 0; m < kMethods; ++m) {
            const probe_decision dec = mons[m].decide(ci, R(m, ci).signal);
            if (!dec.selected()) continue;  // unlimited inline budget: never deferred
            const half* K = layers[l].cache.keys.data() + h * (n0 + z.S) * z.d;
            const half* V = layers[l].cache.values.data() + h * (n0 + z.S) * z.d;
            const float* q = layers[l].queries.data() + ((s * z.H + h) * z.G + g) * z.d;
            const exact_result x = exact_attention(std::span<const float>(q, z.d), make_matrix_view(K, n, z.d),
                                                   make_matrix_view(V, n, z.d), scale);
            const double err = m == kCertified ? rel_error(cert_out.data() + ci * z.d, x.output, x.value_scale)
                                               : rel_error(base_out.data() + ((m - 1) * z.calls() + ci) * z.d,
                                                           x.output, x.value_scale);
            const bool exceeded = err > f.eps;
            if (exceeded != R(m, ci).exceeded) ++rows[m].mismatches;
            mons[m].observe(ci, exceeded);
          }
        }
  }
  prog.finish();

  for (std::size_t m = 0; m < kMethods; ++m) {
    method_row& r = rows[m];
    r.name = kMethodName[m];
    r.config = m == kCertified ? strf("eps=%g", f.eps)
               : m == kTopK    ? strf("k=%zu", k)
                               : strf("sinks=%zu,recent=%zu,+%zu sampled", kSinkTokens, k - kSinkTokens, f.samples);
    r.st = mons[m].statement();
    std::vector<double> errs;
    for (std::size_t ci = 0; ci < z.calls(); ++ci) {
      const call_record& c = R(m, ci);
      r.true_rate += c.exceeded ? 1.0 : 0.0;
      r.mean_keys += c.keys;
      r.mean_signal += c.signal;
      errs.push_back(c.err);
    }
    r.true_rate /= double(z.calls());
    r.mean_keys /= double(z.calls());
    r.mean_signal /= double(z.calls());
    r.max_err = *std::max_element(errs.begin(), errs.end());
    r.p90_err = quantile(errs, 0.9);
  }
  const double secs = seconds_since(t0);

  text_table table({"<method", "<config", "keys", "calls", "probes", "cost", "upper_bound", "true_rate",
                    "covered", "alpha", "<estimator"});
  std::vector<record> recs;
  for (const method_row& r : rows) {
    const bool covered = r.true_rate <= r.st.upper_bound;
    table.add_row({r.name, r.config, strf("%.0f", r.mean_keys), std::to_string(r.st.calls),
                   std::to_string(r.st.probes), strf("%.3f", r.st.cost), strf("%.4f", r.st.upper_bound),
                   strf("%.4f", r.true_rate), covered ? "yes" : "NO", strf("%g", r.st.alpha),
                   std::string(to_string(r.st.estimator))});
    recs.push_back({{"method", r.name},
                    {"config", r.config},
                    {"calls", std::uint64_t(r.st.calls)},
                    {"probes", std::uint64_t(r.st.probes)},
                    {"cost", r.st.cost},
                    {"upper_bound", r.st.upper_bound},
                    {"lower_bound", r.st.lower_bound},
                    {"point_estimate", r.st.point_estimate},
                    {"true_rate", r.true_rate},
                    {"covered", std::uint64_t(covered)},
                    {"alpha", r.st.alpha},
                    {"estimator", std::string(to_string(r.st.estimator))},
                    {"epsilon", f.eps},
                    {"keys_read", r.mean_keys},
                    {"mean_signal", r.mean_signal},
                    {"p90_err", r.p90_err},
                    {"max_err", r.max_err},
                    {"probe_mismatches", std::uint64_t(r.mismatches)},
                    {"statement", to_string(r.st)}});
  }
  std::printf("\n");
  table.print(stdout);
  std::printf("\n");
  for (const method_row& r : rows) std::printf("%s: %s\n", r.name.c_str(), to_string(r.st).c_str());
  std::size_t mism = 0;
  for (const method_row& r : rows) mism += r.mismatches;
  std::printf("\n%.1f s; probes agree with the truth on every probed call: %s\n", secs, mism == 0 ? "yes" : "NO");

  if (!f.json.empty()) {
    json_writer j;
    j.begin_object().key("command").value("monitor");
    j.key("machine").begin_object(true);
    machine_fields(j);
    j.end_object();
    j.key("config").begin_object(true);
    j.key("regime").value(f.regime).key("context").value(std::uint64_t(n0));
    j.key("steps").value(std::uint64_t(z.S)).key("layers").value(std::uint64_t(z.L));
    j.key("kv_heads").value(std::uint64_t(z.H)).key("group").value(std::uint64_t(z.G));
    j.key("head_dim").value(std::uint64_t(z.d)).key("eps").value(f.eps).key("delta").value(f.delta);
    j.key("alpha").value(f.alpha).key("probe_rate").value(f.probe_rate).key("p_min").value(f.p_min);
    j.key("k").value(std::uint64_t(k)).key("seed").value(std::uint64_t(f.seed)).key("seconds").value(secs);
    j.end_object();
    finish_json(j, recs, f.json);
  }
  if (!f.csv.empty()) {
    write_csv(f.csv, recs);
  }
}

}  // namespace

void add_monitor_command(CLI::App& app) {
  auto f = std::make_shared<monitor_flags>();
  CLI::App* cmd = app.add_subcommand(
      "monitor",
      "the fidelity monitor's statement beside the true exceedance rate, on a simulated generation, for the "
      "certified call, oracle top-k and sinks + window (docs/monitor.md)");
  cmd->add_option("--context", f->context, "tokens before the first decoding step (prefill)")->capture_default_str();
  cmd->add_option("--steps", f->steps, "decoding steps (one token appended per step)")->capture_default_str();
  cmd->add_option("--layers", f->layers, "layers (one synthetic cache each)")->capture_default_str();
  cmd->add_option("--kv-heads", f->kv_heads, "KV heads per layer")->capture_default_str();
  cmd->add_option("--group", f->group, "query heads per KV head (GQA group)")->capture_default_str();
  cmd->add_option("--head-dim", f->head_dim, "channels per head")->capture_default_str();
  cmd->add_option("--regime", f->regime, "synthetic regime (docs/synthetic.md)")->capture_default_str();
  cmd->add_option("--eps", f->eps, "error threshold (value scale): a call exceeds when error / M > eps")
      ->capture_default_str();
  cmd->add_option("--delta", f->delta, "failure probability of the certified call")->capture_default_str();
  cmd->add_option("--alpha", f->alpha, "the statements hold with probability >= 1 - alpha")->capture_default_str();
  cmd->add_option("--estimator", f->estimator, "confidence sequence: hoeffding, empirical_bernstein or betting")
      ->capture_default_str();
  cmd->add_option("--probe-rate", f->probe_rate, "target fraction of calls probed densely")->capture_default_str();
  cmd->add_option("--p-min", f->p_min, "floor of every probe probability")->capture_default_str();
  cmd->add_option("--samples", f->samples, "dropped keys sampled for the sinks + window signal")
      ->capture_default_str();
  cmd->add_option("--threads", f->threads, "threads (0 = all cores)")->capture_default_str();
  cmd->add_option("--seed", f->seed, "seed of the synthetic data and the perturbations")->capture_default_str();
  cmd->add_option("--json", f->json, "also write the rows as JSON to this file");
  cmd->add_option("--csv", f->csv, "also write the rows as CSV to this file");
  cmd->add_flag("--quiet", f->quiet, "no progress indicator on stderr");
  cmd->callback([f] { run_monitor(*f); });
}

}  // namespace certattn::bench
