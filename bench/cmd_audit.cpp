// certattn-bench audit: the certificate validity table at scale. For every setting
// (synthetic regime x context, or a user's .npy cache), certificate (tight, classic), error
// scale (denominator, output norm, value scale) and epsilon, every call of attend_group is
// checked against exact attention in double: a violation is a certified call whose error
// exceeds epsilon x scale. Steps of one (KV head, configuration) run in order, each call
// hinted with the levels its heads stopped at in the step before, as a decoder would.
// Reported per row: calls, certified, fallbacks to exact attention, violations, the exact
// (Clopper-Pearson) 95% upper bound on the violation rate, and the largest error relative
// to epsilon x scale. A deterministic subset of the calls (every --check-every-th; all in
// --quick) is also run through reference_attend() with the same level hint, which must agree
// with the fast path exactly: same certification, level, heavy and sampled counts, output
// within 1e-5.
//
// Exit status: nonzero when any call disagrees with the reference, or when a row's
// violations are improbable under the guarantee (P(Binomial(certified, delta) >= v) below
// 0.05 / rows: a Bonferroni-corrected exact test of "violation rate <= delta").
#include "bench_common.hpp"
#include "commands.hpp"
#include "eval_common.hpp"
#include "report.hpp"

#include <certattn/reference.hpp>
#include <certattn/parallel.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace certattn::bench {
namespace {

struct audit_flags {
  bool quick = false;
  std::vector<std::string> contexts;  // default 16K..128K (quick: 8K)
  std::vector<std::string> regimes;   // default all ten
  std::vector<std::string> certificates{"tight"};
  std::vector<std::string> scales{"denominator", "output_norm", "value_scale"};
  std::vector<double> eps{0.05, 0.1, 0.2, 0.3};
  double delta = 0.05;
  std::size_t kv_heads = 0, group = 4, head_dim = 128, steps = 0, check_every = 0;
  std::size_t threads = 0;
  double alpha = 0.05;
  std::string kv, queries;
  std::string json, csv;
  std::uint64_t seed = 1;
  std::string variant = "plain";
  std::vector<std::string> dtypes{"f16"};
  std::size_t positions = 1;  // query positions per call (attend_positions)
  bool quiet = false;
};

struct config {
  certificate_kind certificate;
  error_scale scale;
  double eps;

  options to_options(const audit_flags& f) const {
    options opt;
    opt.epsilon = eps;
    opt.delta = f.delta;
    opt.scale = scale;
    opt.seed = f.seed;
    opt.certificate = certificate;
    opt.route = routing::kOff;  // the audit studies the sparse path's certificates
    return opt;
  }
};

/// One (setting, certificate, scale, epsilon) row.
struct audit_row {
  std::string setting;
  std::size_t n = 0;
  certificate_kind certificate = certificate_kind::kTight;
  error_scale scale = error_scale::kValueScale;
  double eps = 0, delta = 0;
  std::size_t calls = 0, certified = 0, fallbacks = 0, violations = 0, checked = 0, disagreements = 0;
  double max_ratio = 0, p90_ratio = 0, keys_frac = 0, bound_max = 0;
  double rate_ub = 1, p_value = 1;
  bool pass = true;
};

/// What one call of one configuration produced.
struct call_record {
  float ratio = 0;  // error / (eps * scale), certified calls only
  float keys = 0;
  float bound = 0;  // the certificate's bound / eps
  std::uint8_t certified = 0, fallback = 0, violation = 0, checked = 0, disagree = 0;
};

/// What the audit keeps of one query's exact attention: exact_call without its per-token
/// scores and weights, so that every call of a setting can be held at once.
struct exact_summary {
  std::vector<double> o;
  double c = 0, D = 0, M = 0, o_norm = 0;

  explicit exact_summary(const exact_call& x) : o(x.o), c(x.c), D(x.D), M(x.M), o_norm(x.o_norm) {}
};

double scale_value(error_scale s, const exact_summary& x, double d_at_c) {
  switch (s) {
    case error_scale::kDenominator: return d_at_c;
    case error_scale::kOutputNorm: return x.o_norm;
    case error_scale::kValueScale: return x.M;
  }
  return x.M;
}

/// Fast path against the reference on one call: empty when they agree, else why not.
std::string compare(const certificate& fast, const float* fast_out, const reference_result& ref, double value_scale) {
  const certificate& r = ref.cert;
  if (fast.certified != r.certified) return "certified differs";
  if (fast.exact != r.exact) return "exact differs";
  if (fast.level != r.level) return strf("level %d vs %d", fast.level, r.level);
  if (fast.heavy != r.heavy) return strf("heavy %zu vs %zu", fast.heavy, r.heavy);
  if (fast.sampled != r.sampled) return strf("sampled %zu vs %zu", fast.sampled, r.sampled);
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < ref.output.size(); ++i) {
    const double t = double(fast_out[i]) - ref.output[i];
    diff += t * t;
    norm += ref.output[i] * ref.output[i];
  }
  diff = std::sqrt(diff);
  norm = std::max(std::sqrt(norm), 1e-6 * value_scale);
  if (diff > 1e-5 * norm) return strf("output differs by %.3g relative", diff / norm);
  return {};
}

/// The query of head g at position p of step s's call: step (s + p) mod steps's query, so
/// that the positions of one call ask different questions (position 0 is step s's own).
const float* position_query(const eval_data& e, std::size_t s, std::size_t p, std::size_t h, std::size_t g) {
  return e.query((s + p) % e.steps, h, g);
}

/// Exact attention of every call of a setting, [steps][heads][positions][group] (position p
/// over the first n - positions + p + 1 tokens), computed once and shared by all
/// configurations.
template <class Rows>
std::vector<exact_summary> exact_calls(const eval_data& e, const Rows& rows, const layer_variant& lv,
                                       std::size_t positions, thread_pool& pool) {
  const std::size_t n = e.n, d = e.d, H = e.heads, G = e.group, P = positions;
  const double scale = options{}.effective_softmax_scale(d);
  std::vector<std::vector<exact_summary>> per_item(e.steps * H);
  std::vector<exact_call> scratch(pool.size());
  pool.parallel_for(e.steps * H, [&](std::size_t item, std::size_t wi) {
    const std::size_t s = item / H, h = item % H;
    exact_call& x = scratch[wi];
    const attention_variant v = lv.head(h);
    for (std::size_t p = 0; p < P; ++p) {
      const std::size_t n_p = n - P + 1 + p;
      for (std::size_t g = 0; g < G; ++g) {
        const float* q = position_query(e, s, p, h, g);
        exact_attend(q, rows.key_rows(h), rows.value_rows(h), n_p, d, scale, x, head_variant_of(v, g, n_p));
        if (s == 0 && g == 0 && n_p == n) check_exact(q, rows, h, x, head_slice(v, g));
        per_item[item].emplace_back(x);
      }
    }
  });
  std::vector<exact_summary> all;
  all.reserve(e.calls() * positions);
  for (std::vector<exact_summary>& v : per_item)
    for (exact_summary& x : v) all.push_back(std::move(x));
  return all;
}

template <class Rows>
cache_dtype rows_format(const Rows& rows) {
  if constexpr (std::is_same_v<Rows, stored_cache>)
    return rows.lc->format();
  else
    return {};
}

/// One setting's audit over `cache` (the fp16 eval_data itself, or a stored_cache),
/// whose head h the certified call reads through view_of(h).
template <class Rows, class ViewOf>
std::vector<audit_row> audit_rows(const eval_data& e, const Rows& cache, ViewOf view_of, const std::vector<config>& cfgs,
                                  const audit_flags& f, std::size_t check_every, thread_pool& pool, progress& prog) {
  const std::size_t n = e.n, d = e.d, H = e.heads, G = e.group, S = e.steps, P = f.positions;
  const std::size_t calls = e.calls() * P, PG = P * G;
  const std::size_t C = cfgs.size();
  std::vector<key_index> idx(H, key_index(d));
  pool.parallel_for(H, [&](std::size_t h, std::size_t) { idx[h].build(view_of(h)); });
  const layer_variant lv(parse_variant(f.variant), H, G, f.seed);
  const std::vector<exact_summary> exact = exact_calls(e, cache, lv, P, pool);
  std::vector<call_record> rec(C * calls);
  std::vector<std::string> first_disagreement(pool.size());

  struct worker {
    std::vector<float> queries, out;
    std::vector<certificate> certs;
    std::vector<int> hints;
    std::unique_ptr<attend_workspace> ws;
  };
  std::vector<worker> workers(pool.size());
  for (worker& w : workers) {
    w.queries.resize(PG * d);
    w.out.resize(PG * d);
    w.certs.resize(PG);
    w.hints.resize(G);
    w.ws = std::make_unique<attend_workspace>(PG, d, n);
  }

  // One item per (KV head, configuration): its steps run in order, since each step's level
  // hints are the levels of the step before.
  pool.parallel_for(H * C, [&](std::size_t item, std::size_t wi) {
    worker& w = workers[wi];
    const std::size_t h = item / C, ci = item % C;
    options opt = cfgs[ci].to_options(f);
    opt.variant = lv.head(h);
    options head_opt = opt;  // the reference's: this query head's entries only
    for (std::size_t s = 0; s < S; ++s) {
      // Each configuration draws its own perturbations (layer = configuration).
      const noise_key nk{std::uint64_t(s), std::uint32_t(ci), std::uint32_t(h)};
      const std::span<const int> hints = s == 0 ? std::span<const int>() : std::span<const int>(w.hints);
      if (P == 1) {
        attend_group(std::span<const float>(e.query(s, h, 0), G * d), G, view_of(h), idx[h], nk, opt, w.out,
                     w.certs, *w.ws, hints);
      } else {
        for (std::size_t p = 0; p < P; ++p)
          std::copy_n(position_query(e, s, p, h, 0), G * d, w.queries.data() + p * G * d);
        attend_positions(std::span<const float>(w.queries), P, G, view_of(h), idx[h], nk, opt, w.out, w.certs,
                         *w.ws, hints);
      }
      for (std::size_t pg = 0; pg < PG; ++pg) {
        const std::size_t p = pg / G, g = pg % G;
        const std::size_t call = (s * H + h) * PG + pg;
        const certificate& cert = w.certs[pg];
        const exact_summary& x = exact[call];
        call_record& r = rec[ci * calls + call];
        r.keys = float(cert.keys_read);
        r.certified = cert.certified ? 1 : 0;
        r.fallback = cert.exact && cert.level < 0 ? 1 : 0;
        const double d_at_c = x.D * std::exp(x.c - cert.max_score);  // D with the certificate's c
        const double sv = scale_value(cfgs[ci].scale, x, d_at_c);
        double err;
        if (cfgs[ci].scale == error_scale::kDenominator)
          err = std::fabs(cert.denominator - d_at_c);
        else
          err = distance(w.out.data() + pg * d, x.o);
        if (cert.certified) {
          r.ratio = float(err / (cfgs[ci].eps * sv));
          r.bound = float(cert.bound / cfgs[ci].eps);
          r.violation = err > cfgs[ci].eps * sv ? 1 : 0;
        }
        if ((call + ci) % check_every == 0) {  // every check_every-th call of each configuration
          reference_extras extras;
          extras.value_center = idx[h].value_center();
          extras.value_cap = idx[h].value_cap();
          extras.reach_floor = idx[h].reach_floor();
          extras.level_hint = hints.empty() ? -1 : hints[g];
          head_opt.variant = head_slice(opt.variant, g);
          noise_key nk_p = nk;
          nk_p.position = std::uint32_t(p);
          auto keys = cache.key_matrix(h), values = cache.value_matrix(h);
          keys.rows = values.rows = n - P + 1 + p;  // position p's prefix
          const reference_result ref =
              reference_attend(std::span<const float>(position_query(e, s, p, h, g), d), keys, values, head_opt,
                               nk_p, extras);
          r.checked = 1;
          const std::string why = compare(cert, w.out.data() + pg * d, ref, x.M);
          if (!why.empty()) {
            r.disagree = 1;
            if (first_disagreement[wi].empty())
              first_disagreement[wi] = strf("%s step %zu head %zu position %zu query %zu, %s %s eps %g: ",
                                            e.name.c_str(), s, h, p, g,
                                            std::string(to_string(cfgs[ci].certificate)).c_str(),
                                            std::string(to_string(cfgs[ci].scale)).c_str(), cfgs[ci].eps) + why;
          }
        }
      }
      // The next step's hints: the newest position's levels.
      for (std::size_t g = 0; g < G; ++g) w.hints[g] = w.certs[(P - 1) * G + g].level;
      prog.advance(double(PG * n));
    }
  });
  for (const std::string& m : first_disagreement)
    if (!m.empty()) std::fprintf(stderr, "audit: fast path and reference disagree: %s\n", m.c_str());

  std::vector<audit_row> rows;
  for (std::size_t ci = 0; ci < C; ++ci) {
    audit_row a;
    const cache_dtype format = rows_format(cache);
    a.setting = e.name + (format == cache_dtype{} ? "" : " " + to_string(format));
    a.n = n;
    a.certificate = cfgs[ci].certificate;
    a.scale = cfgs[ci].scale;
    a.eps = cfgs[ci].eps;
    a.delta = f.delta;
    a.calls = calls;
    std::vector<double> ratios;
    double keys = 0;
    for (std::size_t call = 0; call < calls; ++call) {
      const call_record& r = rec[ci * calls + call];
      a.certified += r.certified;
      a.fallbacks += r.fallback;
      a.violations += r.violation;
      a.checked += r.checked;
      a.disagreements += r.disagree;
      keys += r.keys;
      if (r.certified) {
        ratios.push_back(r.ratio);
        a.max_ratio = std::max(a.max_ratio, double(r.ratio));
        a.bound_max = std::max(a.bound_max, double(r.bound));
      }
    }
    a.p90_ratio = ratios.empty() ? 0.0 : quantile(ratios, 0.9);
    a.keys_frac = keys / double(calls) / double(n);
    rows.push_back(a);
  }
  return rows;
}

/// One setting's audit with its cache stored in `dtype`: fp16 as the setting holds it, or
/// quantized (stored_cache), where exact attention and the reference read the decoded rows.
std::vector<audit_row> audit_setting(const eval_data& e, cache_dtype dtype, const std::vector<config>& cfgs,
                                     const audit_flags& f, std::size_t check_every, thread_pool& pool, progress& prog) {
  if (dtype == cache_dtype{})
    return audit_rows(e, e, [&](std::size_t h) { return e.view(h); }, cfgs, f, check_every, pool, prog);
  const stored_cache stored(e, dtype);
  return stored.lc->visit(
      [&](auto view_of) { return audit_rows(e, stored, view_of, cfgs, f, check_every, pool, prog); });
}

record to_record(const audit_row& a) {
  return {
      {"setting", a.setting},
      {"context", std::uint64_t(a.n)},
      {"certificate", std::string(to_string(a.certificate))},
      {"scale", std::string(to_string(a.scale))},
      {"eps", a.eps},
      {"delta", a.delta},
      {"calls", std::uint64_t(a.calls)},
      {"certified", std::uint64_t(a.certified)},
      {"fallbacks", std::uint64_t(a.fallbacks)},
      {"violations", std::uint64_t(a.violations)},
      {"violation_rate_ub95", a.rate_ub},
      {"p_value", a.p_value},
      {"max_err_over_bound", a.max_ratio},
      {"p90_err_over_bound", a.p90_ratio},
      {"max_certified_bound_over_eps", a.bound_max},
      {"keys_read_frac", a.keys_frac},
      {"checked", std::uint64_t(a.checked)},
      {"disagreements", std::uint64_t(a.disagreements)},
      {"pass", std::string(a.pass ? "yes" : "no")},
  };
}

void run_audit(audit_flags f) {
  if (f.kv.empty() != f.queries.empty()) throw error("--kv and --queries go together");
  const std::vector<certificate_kind> certificates = certificates_from(f.certificates);
  std::vector<config> cfgs;
  for (certificate_kind k : certificates)
    for (const std::string& s : f.scales)
      for (double e : f.eps) {
        const config c{k, error_scale_from_string(s), e};
        validate(c.to_options(f));
        cfgs.push_back(c);
      }
  if (cfgs.empty()) throw error("--scale and --eps need at least one value each");
  if (!(f.alpha > 0 && f.alpha < 1)) throw error("--alpha must lie in (0, 1)");
  if (f.positions == 0 || f.positions > 64) throw error("--positions must lie in [1, 64]");
  const std::size_t P = f.positions;
  if (f.contexts.empty()) f.contexts = f.quick ? std::vector<std::string>{"8K"}
                                               : std::vector<std::string>{"16K", "32K", "64K", "128K"};
  if (f.regimes.empty())
    for (synthetic::regime r : synthetic::all_regimes) f.regimes.push_back(std::string(synthetic::to_string(r)));
  const std::size_t heads = f.kv_heads > 0 ? f.kv_heads : f.quick ? 2 : 8;
  const std::size_t steps = f.steps > 0 ? f.steps : f.quick ? 3 : 8;
  const std::size_t check_every = f.check_every > 0 ? f.check_every : f.quick ? 1 : 10;
  thread_pool pool(f.threads);

  struct plan {
    synthetic::regime regime;
    std::size_t n;
  };
  std::vector<plan> plans;
  double total = 0;
  if (f.kv.empty()) {
    if (f.group == 0 || f.head_dim == 0 || f.head_dim % 2) throw error("--group > 0 and an even --head-dim, please");
    for (const std::string& r : f.regimes)
      for (const std::string& c : f.contexts) {
        plans.push_back({synthetic::regime_from_string(r), parse_count(c)});
        if (plans.back().n <= 64) throw error("--context: contexts must exceed the 64-token window");
        if (plans.back().n <= 64 + P) throw error("--context: contexts must exceed the window plus --positions");
        total += double(steps * heads * P * f.group * cfgs.size() * f.dtypes.size() * plans.back().n);
      }
    std::printf("audit: %s, variant %s, %zu settings (regime x context) x %zu certificates x %zu scales x %zu "
                "epsilons, %zu calls per row (%zu steps x %zu KV heads x %zu positions x group %zu), delta %g, "
                "reference check on every %zu%s call, %zu threads\n",
                f.quick ? "quick" : "full", f.variant.c_str(), plans.size(), certificates.size(),
                f.scales.size(), f.eps.size(), steps * heads * P * f.group, steps, heads, P, f.group, f.delta,
                check_every,
                check_every == 1 ? "st" : check_every == 2 ? "nd" : check_every == 3 ? "rd" : "th", pool.size());
  }
  std::fflush(stdout);

  std::vector<audit_row> rows;
  if (!f.kv.empty()) {
    const eval_data e = npy_data(f.kv, f.queries, 0);
    if (e.n <= 64 + P) throw error(f.kv + ": the cache must hold more than the 64-token window plus --positions");
    std::printf("audit: %s, %zu KV heads x %zu tokens, %zu steps x %zu positions x group %zu = %zu calls per row, "
                "delta %g\n",
                e.name.c_str(), e.heads, e.n, e.steps, P, e.group, e.calls() * P, f.delta);
    progress prog("certattn-bench audit", double(e.calls() * P * cfgs.size() * f.dtypes.size() * e.n), !f.quiet);
    for (const std::string& t : f.dtypes) {
      const auto r = audit_setting(e, dtype_from_string(t), cfgs, f, check_every, pool, prog);
      rows.insert(rows.end(), r.begin(), r.end());
    }
  } else {
    progress prog("certattn-bench audit", total, !f.quiet);
    for (const plan& p : plans) {
      prog.set_stage(std::string(synthetic::to_string(p.regime)) + "/" + format_count(p.n));
      const eval_data e = synthetic_data(p.regime, p.n, heads, f.group, f.head_dim, steps, f.seed);
      for (const std::string& t : f.dtypes) {
        const auto r = audit_setting(e, dtype_from_string(t), cfgs, f, check_every, pool, prog);
        rows.insert(rows.end(), r.begin(), r.end());
      }
    }
    prog.finish();
  }

  // Per-row tests, then the summary by (scale, epsilon).
  std::size_t failed = 0, disagreements = 0, checked = 0, certified = 0, violations = 0, fallbacks = 0, calls = 0;
  const double per_row_alpha = f.alpha / double(rows.size());
  for (audit_row& a : rows) {
    a.rate_ub = clopper_pearson_upper(a.violations, a.certified);
    a.p_value = binomial_upper_tail(a.violations, a.certified, a.delta);
    a.pass = a.disagreements == 0 && a.p_value >= per_row_alpha;
    failed += a.pass ? 0 : 1;
    disagreements += a.disagreements;
    checked += a.checked;
    certified += a.certified;
    violations += a.violations;
    fallbacks += a.fallbacks;
    calls += a.calls;
  }

  text_table t({"<setting", "<cert", "<scale", "eps", "calls", "certified", "fallback", "viol", "rate ub95",
                "max err/eps", "p90 err/eps", "keys %", "checked", "disagree", "<pass"});
  for (const audit_row& a : rows)
    t.add_row({a.setting, std::string(to_string(a.certificate)), std::string(to_string(a.scale)), strf("%g", a.eps),
               std::to_string(a.calls), std::to_string(a.certified), std::to_string(a.fallbacks),
               std::to_string(a.violations), strf("%.2g", a.rate_ub), strf("%.3f", a.max_ratio),
               strf("%.3f", a.p90_ratio), strf("%.2f", 100 * a.keys_frac), std::to_string(a.checked),
               std::to_string(a.disagreements), a.pass ? "yes" : "NO"});
  std::printf("\n");
  t.print(stdout);

  std::printf("\nCertificate validity by certificate, error scale and epsilon (all settings pooled; delta %g)\n",
              f.delta);
  text_table sum({"<cert", "<scale", "eps", "calls", "certified", "fallback", "violations", "rate ub95", "max err/eps",
                  "median p90 err/eps", "checked", "disagree"});
  for (const config& c : cfgs) {
    std::size_t cl = 0, ce = 0, fb = 0, v = 0, ck = 0, dg = 0;
    double mx = 0;
    std::vector<double> p90s;
    for (const audit_row& a : rows)
      if (a.certificate == c.certificate && a.scale == c.scale && a.eps == c.eps) {
        cl += a.calls, ce += a.certified, fb += a.fallbacks, v += a.violations, ck += a.checked, dg += a.disagreements;
        mx = std::max(mx, a.max_ratio);
        p90s.push_back(a.p90_ratio);
      }
    sum.add_row({std::string(to_string(c.certificate)), std::string(to_string(c.scale)), strf("%g", c.eps),
                 std::to_string(cl), std::to_string(ce), std::to_string(fb), std::to_string(v),
                 strf("%.2g", clopper_pearson_upper(v, ce)), strf("%.3f", mx), strf("%.3f", quantile(p90s, 0.5)),
                 std::to_string(ck), std::to_string(dg)});
  }
  sum.print(stdout);
  std::printf("\ntotal: %zu calls, %zu certified, %zu fell back to exact attention, %zu violations (95%% upper bound on "
              "the rate %.2g), %zu checked against the reference, %zu disagreements; %zu of %zu rows fail\n",
              calls, certified, fallbacks, violations, clopper_pearson_upper(violations, certified), checked,
              disagreements, failed, rows.size());
  std::printf("err/eps = error / (epsilon x scale) over certified calls (a violation is > 1); rate ub95 = exact "
              "(Clopper-Pearson) one-sided 95%% upper bound on violations / certified.\n");

  std::vector<record> recs;
  for (const audit_row& a : rows) recs.push_back(to_record(a));
  if (!f.json.empty()) {
    json_writer j;
    j.begin_object().key("command").value("audit");
    j.key("machine").begin_object();
    machine_fields(j);
    j.end_object();
    j.key("summary").begin_object(true);
    j.key("calls").value(std::uint64_t(calls)).key("certified").value(std::uint64_t(certified));
    j.key("fallbacks").value(std::uint64_t(fallbacks)).key("violations").value(std::uint64_t(violations));
    j.key("violation_rate_ub95").value(clopper_pearson_upper(violations, certified));
    j.key("checked").value(std::uint64_t(checked)).key("disagreements").value(std::uint64_t(disagreements));
    j.key("failed_rows").value(std::uint64_t(failed)).key("pass").value(failed == 0);
    j.end_object();
    finish_json(j, recs, f.json);
  }
  if (!f.csv.empty()) {
    write_csv(f.csv, recs);
  }
  if (failed > 0)
    throw error(strf("audit failed: %zu of %zu rows fail (%zu disagreement(s) with the reference; violations above "
                     "the binomial bound in the rest)",
                     failed, rows.size(), disagreements));
}

}  // namespace

void add_audit_command(CLI::App& app) {
  auto f = std::make_shared<audit_flags>();
  CLI::App* cmd = app.add_subcommand(
      "audit",
      "certificate validity at scale: violations of certified calls per setting x error scale x epsilon, with exact "
      "binomial bounds, and fast path vs reference agreement (docs/accuracy.md)");
  cmd->add_flag("--quick", f->quick, "a run of a minute or two (CI): 8K tokens, 2 KV heads, 3 steps, every call "
                                     "checked against the reference");
  cmd->add_option("--context", f->contexts, "contexts in tokens, comma-separated (default 16K,32K,64K,128K)")
      ->delimiter(',');
  cmd->add_option("--regime", f->regimes, "synthetic regimes, comma-separated (default all ten)")->delimiter(',');
  add_certificate_flag(*cmd, f->certificates);
  cmd->add_option("--scale", f->scales, "error scales: denominator, output_norm, value_scale")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--eps", f->eps, "target errors epsilon")->delimiter(',')->capture_default_str();
  cmd->add_option("--delta", f->delta, "failure probability per call")->capture_default_str();
  cmd->add_option("--kv-heads", f->kv_heads, "KV heads of the synthetic layer (default 8; --quick 2)");
  cmd->add_option("--group", f->group, "query heads per KV head")->capture_default_str();
  cmd->add_option("--head-dim", f->head_dim, "channels per head")->capture_default_str();
  cmd->add_option("--steps", f->steps, "decoding steps per setting (default 8; --quick 3)");
  cmd->add_option("--check-every", f->check_every,
                  "run the reference on every n-th call (default 10; --quick 1 = every call)");
  cmd->add_option("--alpha", f->alpha, "family-wise level of the violation test")->capture_default_str();
  cmd->add_option("--threads", f->threads, "threads (0 = all cores)")->capture_default_str();
  cmd->add_option("--kv", f->kv, "a KV cache as .npy, float16/float32 [2, kv_heads, n_tokens, head_dim]");
  cmd->add_option("--queries", f->queries, "its queries as .npy, float16/float32 [steps, kv_heads, group, head_dim]");
  cmd->add_option("--positions", f->positions,
                  "query positions per call (speculative verification: attend_positions(); position p asks step "
                  "s + p's queries over the cache up to its own token)")
      ->capture_default_str();
  cmd->add_option("--json", f->json, "also write the rows as JSON to this file");
  cmd->add_option("--csv", f->csv, "also write the rows as CSV to this file");
  cmd->add_option("--seed", f->seed, "seed of the synthetic data and the perturbations")->capture_default_str();
  cmd->add_option("--dtype", f->dtypes,
                  "cache formats, comma-separated (f16, bf16, q8_0, q4_0, fp8_e4m3, fp8_e5m2; q8_0/f16 and q4_0/f16 for "
                  "keys and values in two formats): each setting's cache stored in each, checked against exact "
                  "attention over its decoded rows")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--variant", f->variant,
                  "attention variant of every call and of its exact reference: plain, or parts joined by '+': "
                  "softcap:CAP, alibi, sinks, window:W")
      ->capture_default_str();
  cmd->add_flag("--quiet", f->quiet, "no progress indicator on stderr");
  cmd->callback([f] { run_audit(*f); });
}

}  // namespace certattn::bench
