// certattn-bench accuracy: the error of the certified call against the peers' methods at
// equal keys read and at equal bytes read (the paper's Table 1, D.2a and D.2e, Figures 2
// and 3), on synthetic settings (regime x context) or on a user's .npy cache.
//
// Per setting: the certified call runs first (attend_group, epsilon grid, value scale,
// once per certificate of --certificate, each KV head's steps in order so that every step
// passes the previous step's stopping levels as level hints); the first certificate's mean
// keys and bytes read fix the budget grid of the budgeted baselines. Then, per
// KV head, every baseline prepares (page bounds, hash codes, clusters) and every call
// (step x query head) is evaluated against exact attention in double: error / M (value
// scale) and error / ||o|| (output norm). Each family's configurations are summarised by
// mean keys and bytes read and the 90th percentile and maximum of the errors; the
// configuration matched to ours is the one of lowest p90 among those reading at most
// --match (1.1) times our keys (or bytes). docs/accuracy.md describes every baseline.
//
// The cost of the guarantee: at --eps, the certified calls' keys read against those of an
// uncertified central-limit stopping rule on the tight certificate's own sample (same
// perturbations, same estimator), whose errors may exceed eps * M.
#include "baselines/fixed_level.hpp"
#include "baselines/kivi.hpp"
#include "baselines/magicpig.hpp"
#include "baselines/oracle.hpp"
#include "baselines/quest.hpp"
#include "baselines/retroinfer.hpp"
#include "baselines/ssa.hpp"
#include "baselines/streaming.hpp"
#include "baselines/vattention.hpp"
#include "bench_common.hpp"
#include "commands.hpp"
#include "eval_common.hpp"
#include "report.hpp"

#include <certattn/reference.hpp>
#include <certattn/scan.hpp>
#include <certattn/parallel.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <numbers>
#include <numeric>
#include <set>
#include <span>
#include <string>
#include <vector>

namespace certattn::bench {
namespace {

namespace bl = baselines;

struct accuracy_flags {
  bool quick = false;
  std::vector<std::string> contexts;  // default: 16K..128K (quick: 16K, 32K)
  std::vector<std::string> regimes;   // default: all (quick: a subset)
  std::size_t kv_heads = 2, group = 4, head_dim = 128;
  std::size_t calls = 0;  // per setting; 0: 2000 (quick: 128)
  double eps = 0.1;
  std::vector<double> eps_front{0.05, 0.1, 0.2, 0.3};
  double delta = 0.05;
  double clt_z = 0;  // the CLT rule's quantile; 0: the normal 1 - delta/2 quantile
  double match = 1.1;
  std::size_t threads = 0;
  std::vector<std::string> methods;
  std::vector<std::string> certificates{"tight", "classic"};
  std::vector<certificate_kind> kinds;  // parsed from certificates; the first is matched
  std::string kv, queries;
  std::string json, csv, plot;
  std::uint64_t seed = 1;
  bool quiet = false;
};

// kReference: the uncertified central-limit rule, shown beside ours but never matched.
enum class role { kOurs, kAblation, kBaseline, kReference };

constexpr std::size_t kNoRow = std::size_t(-1);

/// The per-call record of one configuration.
struct config_stats {
  std::string family, config;
  role kind = role::kBaseline;
  bool key_matched = true;
  std::vector<float> err_m, err_o, keys, bytes;  // [calls]
  void resize(std::size_t calls) {
    err_m.assign(calls, 0.0f);
    err_o.assign(calls, 0.0f);
    keys.assign(calls, 0.0f);
    bytes.assign(calls, 0.0f);
  }
};

/// One configuration summarised over a setting's calls.
struct summary {
  std::string family, config, setting;
  role kind = role::kBaseline;
  bool key_matched = true;
  double keys_frac = 0, bytes_frac = 0, p90 = 0, max = 0, p90_o = 0, max_o = 0;
  std::size_t calls = 0;
  bool front_keys = false, front_bytes = false;
  std::vector<double> errors;  // sorted err / M (for the tail plot)
};

/// What the certificates of one kind at --eps reported, for the self-checks under the cost
/// table: a certified bound above epsilon would break the guarantee's statement.
struct certificate_check {
  certificate_kind kind = certificate_kind::kTight;
  std::size_t certified = 0, bound_above_eps = 0;
  double max_bound = 0;
};

struct setting_result {
  std::string name;
  std::size_t n = 0, d = 0, calls = 0;
  std::vector<summary> rows;
  std::size_t ours = 0;  // index of ours (the first certificate) at --eps in rows
  std::size_t tight = kNoRow, classic = kNoRow, clt = kNoRow;  // rows at --eps
  std::vector<certificate_check> checks;  // per certificate kind at --eps
  // Calls on which reference_attend() (tight, same hint) stopped at the fast path's
  // level with the same heavy and sampled counts, of those compared.
  std::size_t reference_agree = 0, reference_compared = 0;
  std::size_t clt_exact = 0;  // calls on which the CLT rule stopped at no level (read all n)
};

// ---- the method registry -----------------------------------------------------------------------

const std::vector<std::string> kMethodNames = {"topk", "topp", "streaming", "quest", "vattention",
                                               "ssa", "magicpig", "retroinfer", "kivi", "fixed"};

/// "none" in --methods selects no baseline: the certified rows and the CLT rule only.
bool wanted(const accuracy_flags& f, const std::string& name) {
  return f.methods.empty() || std::find(f.methods.begin(), f.methods.end(), name) != f.methods.end();
}

std::vector<std::unique_ptr<bl::method>> make_methods(const accuracy_flags& f, const options& opt) {
  std::vector<std::unique_ptr<bl::method>> m;
  if (wanted(f, "topk")) m.push_back(std::make_unique<bl::oracle_top_k>());
  if (wanted(f, "topp")) m.push_back(std::make_unique<bl::oracle_top_p>());
  if (wanted(f, "streaming")) m.push_back(std::make_unique<bl::streaming_llm>());
  if (wanted(f, "quest")) m.push_back(std::make_unique<bl::quest>());
  if (wanted(f, "vattention")) m.push_back(std::make_unique<bl::vattention>());
  if (wanted(f, "ssa")) m.push_back(std::make_unique<bl::ssa>());
  if (wanted(f, "magicpig")) m.push_back(std::make_unique<bl::magicpig>());
  if (wanted(f, "retroinfer")) m.push_back(std::make_unique<bl::retroinfer>());
  if (wanted(f, "fixed")) m.push_back(std::make_unique<bl::fixed_level>(opt));
  return m;
}

bl::budgets make_budgets(double ours_keys, double ours_bytes_keys, std::size_t group, std::size_t n) {
  bl::budgets b;
  auto add = [&](std::vector<std::size_t>& v, double x) { v.push_back(std::size_t(std::max(1.0, std::round(x)))); };
  for (double m : {0.125, 0.25, 0.5, 0.75, 0.9, 1.0, 1.5, 2.0, 3.0, 4.0, 8.0}) add(b.keys, m * ours_keys);
  for (double m : {0.25, 0.5, 1.0}) add(b.keys, m * ours_bytes_keys);
  for (double m : {0.5, 1.0}) add(b.shared, m * double(group) * ours_bytes_keys);
  for (double m : {0.25, 0.5, 0.75, 1.0, 2.0, 4.0}) add(b.coarse, m * ours_keys);
  for (double m : {0.5, 1.0}) add(b.coarse, m * ours_bytes_keys);
  b.keys = bl::clamp_unique(b.keys, 1, n);
  b.coarse = bl::clamp_unique(b.coarse, 1, n);
  b.shared.insert(b.shared.end(), b.keys.begin(), b.keys.end());
  b.shared = bl::clamp_unique(b.shared, 1, n);
  return b;
}

// ---- the certified calls ---------------------------------------------------------------------------

/// The certified call of every (certificate, epsilon) slot on every call: out [slots][calls][d],
/// certs [slots][calls], slot = kind * eps.size() + eps index. Each KV head's steps run in
/// order, so that step s passes the levels its group stopped at in step s - 1 as level hints
/// (fixed before step s's perturbations, hence valid); the KV heads run in parallel.
void run_certified(const eval_data& e, const std::vector<key_index>& idx, const options& base,
                   const std::vector<certificate_kind>& kinds, const std::vector<double>& eps_list, thread_pool& pool,
                   std::vector<float>& out, std::vector<certificate>& certs) {
  const std::size_t H = e.heads, G = e.group, S = e.steps, d = e.d, calls = e.calls();
  const std::size_t slots = kinds.size() * eps_list.size();
  out.assign(slots * calls * d, 0.0f);
  certs.assign(slots * calls, {});
  std::vector<attend_workspace> aws;
  for (std::size_t w = 0; w < pool.size(); ++w) aws.emplace_back(G, d, e.n);
  pool.parallel_for(H, [&](std::size_t h, std::size_t w) {
    std::vector<int> hints(G);
    for (std::size_t slot = 0; slot < slots; ++slot) {
      options opt = base;
      opt.certificate = kinds[slot / eps_list.size()];
      opt.epsilon = eps_list[slot % eps_list.size()];
      for (std::size_t s = 0; s < S; ++s) {
        const std::size_t c0 = slot * calls + (s * H + h) * G;
        std::span<const int> level_hints;
        if (s > 0) {
          const std::size_t prev = slot * calls + ((s - 1) * H + h) * G;
          for (std::size_t g = 0; g < G; ++g) hints[g] = certs[prev + g].level;
          level_hints = hints;
        }
        attend_group(std::span<const float>(e.query(s, h, 0), G * d), G, e.view(h), idx[h],
                     noise_key{std::uint64_t(s), 0, std::uint32_t(h)}, opt,
                     std::span<float>(out.data() + c0 * d, G * d), std::span<certificate>(certs.data() + c0, G),
                     aws[w], level_hints);
      }
    }
  });
}

/// Per certificate kind, its certified bounds at epsilon (slot kind * E + e_match); exact
/// fallbacks state no bound.
std::vector<certificate_check> check_certificates(const std::vector<certificate_kind>& kinds, std::size_t E,
                                                  std::size_t e_match, double eps,
                                                  const std::vector<certificate>& certs, std::size_t calls) {
  std::vector<certificate_check> checks;
  for (std::size_t k = 0; k < kinds.size(); ++k) {
    certificate_check c;
    c.kind = kinds[k];
    for (std::size_t ci = 0; ci < calls; ++ci) {
      const certificate& cert = certs[(k * E + e_match) * calls + ci];
      if (!cert.certified || cert.exact) continue;
      ++c.certified;
      c.max_bound = std::max(c.max_bound, cert.bound);
      c.bound_above_eps += !(cert.bound <= eps);
    }
    checks.push_back(c);
  }
  return checks;
}

// ---- the uncertified central-limit rule ----------------------------------------------------------

/// The z with P(Z > z) = p for a standard normal Z, by bisection on erfc (monotone):
/// computed once per setting, so plain bisection to double precision is enough.
double normal_upper_quantile(double p) {
  double lo = -40.0, hi = 40.0;
  for (int it = 0; it < 200; ++it) {
    const double mid = 0.5 * (lo + hi);
    if (0.5 * std::erfc(mid / std::numbers::sqrt2) > p)
      lo = mid;
    else
      hi = mid;
  }
  return 0.5 * (lo + hi);
}

/// The rule's sample-size floor: below it the normal approximation of the HT sum is not
/// trusted (unless the sample holds every light key).
constexpr std::size_t kCltMinSample = 30;

/// The rule's quantile: --clt-z, or the normal 1 - delta/2 quantile. A larger z (e.g. the
/// sqrt(2 ln(2 / delta')) of a dimension-free vector tail) shows what the quantile alone costs.
double clt_quantile(const accuracy_flags& f) { return f.clt_z > 0 ? f.clt_z : normal_upper_quantile(f.delta / 2.0); }

/// Buffers of one call of the rule.
struct clt_scratch {
  std::vector<std::size_t> heavy_start, light_start;   // [levels + 1] bucket offsets
  std::vector<std::uint32_t> heavy_at, light_at;       // pool tokens by the level they enter
  std::vector<std::uint32_t> light;                    // L at the current level
  std::vector<double> num_e, num, o_hat;               // [d]
};

/// Pool tokens t with keep(t), bucketed by level(t) in 0..J (a counting sort):
/// tokens of level j are at[start[j] .. start[j + 1]).
template <class Level, class Keep>
void bucket_by_level(std::size_t pool_end, int J, Level level, Keep keep, std::vector<std::size_t>& start,
                     std::vector<std::uint32_t>& at) {
  start.assign(std::size_t(J) + 2, 0);
  for (std::size_t t = 0; t < pool_end; ++t)
    if (keep(t)) ++start[std::size_t(level(t)) + 1];
  for (std::size_t j = 0; j + 1 < start.size(); ++j) start[j + 1] += start[j];
  at.resize(start.back());
  std::vector<std::size_t> next(start.begin(), start.end() - 1);
  for (std::size_t t = 0; t < pool_end; ++t)
    if (keep(t)) at[next[std::size_t(level(t))]++] = std::uint32_t(t);
}

struct clt_outcome {
  std::size_t keys = 0;  // keys read at the stop (n when no level stops)
  double err = 0;        // ||o^ - o|| (0 when no level stops: exact attention)
  bool exact = true;     // no level stopped
};

/// The uncertified central-limit rule on the tight certificate's sample (ref: reference_attend
/// with the tight options): at the levels j = 0..total_levels() of the certificate's grid
/// (tau_j = 2^(grid_top - j/r) relative to the largest weight, options.hpp), E = window +
/// exact set + heavy_j (exact weights w_t = exp(s_t - c)), L = light keys sampled at j (HT
/// weight tau_j kappa_t, inclusion probability pi_t = w_t / (kappa_t tau_j) < 1);
/// o^ = N^ / D^, M^2 = the weighted mean of ||v||^2, and the
/// HT variance estimate of the linearised ratio V^ = sum_L (1 - pi)(tau kappa)^2 ||v - o^||^2 /
/// D^^2. It stops at the first level with |L| >= 30 (or L = every light key, or the finest
/// level) and z sqrt(V^) <= eps M^: a confidence interval that holds only asymptotically, with no
/// bound on the sampling variance of V^ itself. When the light keys hold almost no mass
/// (peaked attention) L stays below 30 down to the finest level, where the rule stops
/// whatever |L| is.
clt_outcome clt_rule(const reference_result& ref, const exact_call& ex, const half* values, std::size_t n,
                     std::size_t d, const key_index& idx, const options& opt, double z, clt_scratch& sc) {
  const std::size_t pool_end = n - std::min(opt.window, n);
  // sample_level and heavy_level count levels on the certificate's grid (shifted_grid()).
  const int J = opt.total_levels(), top = opt.top_halvings();
  if (ref.max_score != ex.c)
    throw error("internal: reference_attend's max score differs from the bench's exact attention");
  const sampling_design design =
      make_sampling_design(opt, idx.reach_floor(), idx.value_distance_max(pool_end), idx.value_center());
  const std::vector<int>& sl = ref.sample_level;
  const std::vector<int>& hl = ref.heavy_level;
  auto value = [&](std::size_t t, std::size_t i) { return double(float(values[t * d + i])); };

  // E at the start: the window and the exact set (level -1; empty under the tight certificate).
  sc.num_e.assign(d, 0.0);
  double d_e = 0, sq_e = 0;
  std::size_t exact_set = 0, pool_light = 0;
  // num += w v, den += w, sq += w ||v||^2 for token t.
  auto add_weighted = [&](std::size_t t, double w, std::vector<double>& num, double& den, double& sq) {
    double v2 = 0;
    for (std::size_t i = 0; i < d; ++i) {
      const double v = value(t, i);
      num[i] += w * v;
      v2 += v * v;
    }
    den += w;
    sq += w * v2;
  };
  auto add_exact = [&](std::size_t t) { add_weighted(t, ex.w[t], sc.num_e, d_e, sq_e); };
  for (std::size_t t = 0; t < n; ++t) {
    if (t < pool_end && hl[t] >= 0) {
      ++pool_light;  // light at some level before it turns heavy
      continue;
    }
    exact_set += t < pool_end;
    add_exact(t);
  }
  bucket_by_level(
      pool_end, J, [&](std::size_t t) { return hl[t]; }, [&](std::size_t t) { return hl[t] >= 0 && hl[t] <= J; },
      sc.heavy_start, sc.heavy_at);
  bucket_by_level(
      pool_end, J, [&](std::size_t t) { return sl[t]; },
      [&](std::size_t t) { return sl[t] >= 0 && sl[t] <= J && sl[t] < hl[t]; }, sc.light_start, sc.light_at);

  sc.light.clear();
  sc.num.resize(d);
  sc.o_hat.resize(d);
  std::size_t heavy = 0;
  for (int j = 0; j <= J && pool_end > exact_set; ++j) {
    const std::size_t ju = std::size_t(j);
    for (std::size_t k = sc.heavy_start[ju]; k < sc.heavy_start[ju + 1]; ++k) add_exact(sc.heavy_at[k]);
    heavy += sc.heavy_start[ju + 1] - sc.heavy_start[ju];
    std::erase_if(sc.light, [&](std::uint32_t t) { return hl[t] <= j; });
    sc.light.insert(sc.light.end(), sc.light_at.begin() + std::ptrdiff_t(sc.light_start[ju]),
                    sc.light_at.begin() + std::ptrdiff_t(sc.light_start[ju + 1]));

    const double tau = std::ldexp(tau_of(j, opt.grid_ratio), top);
    sc.num = sc.num_e;
    double d_hat = d_e, sq_hat = sq_e;
    for (std::uint32_t t : sc.light)
      add_weighted(t, tau * design.weight(idx.value_distance(t)), sc.num, d_hat, sq_hat);
    for (std::size_t i = 0; i < d; ++i) sc.o_hat[i] = sc.num[i] / d_hat;
    const double m_hat = std::sqrt(sq_hat / d_hat);
    // The finest level stops regardless: peaked heads keep fewer than 30 light keys there,
    // and the certificate stops there too, at worst.
    const bool enough =
        sc.light.size() >= kCltMinSample || sc.light.size() == pool_light - heavy || j == J;
    if (!enough) continue;
    double var = 0;
    for (std::uint32_t t : sc.light) {
      const double a = tau * design.weight(idx.value_distance(t));
      const double pi = std::min(1.0, ex.w[t] / a);
      double dist2 = 0;
      for (std::size_t i = 0; i < d; ++i) {
        const double x = value(t, i) - sc.o_hat[i];
        dist2 += x * x;
      }
      var += (1.0 - pi) * a * a * dist2;
    }
    var /= d_hat * d_hat;
    if (z * std::sqrt(var) <= opt.epsilon * m_hat)
      return {(n - pool_end) + exact_set + heavy + sc.light.size(), distance(sc.o_hat.data(), ex.o), false};
  }
  return {n, 0.0, true};  // no level stopped: exact attention
}

// ---- one setting ---------------------------------------------------------------------------------

/// Tokens by decreasing score (scores rounded to float for the order; ties by token), by an
/// LSD radix sort on the float's bits: the order costs a few passes instead of n log n.
void sort_by_score(std::span<const double> s, std::vector<std::uint64_t>& a, std::vector<std::uint64_t>& b,
                   std::vector<std::uint32_t>& order) {
  const std::size_t n = s.size();
  a.resize(n);
  b.resize(n);
  for (std::size_t t = 0; t < n; ++t) {
    const float f = float(-s[t]);
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // ascending in f
    a[t] = (std::uint64_t(u) << 32) | std::uint64_t(t);
  }
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 32 + 8 * pass;
    std::size_t count[257] = {};
    for (std::uint64_t x : a) ++count[((x >> shift) & 0xFF) + 1];
    for (int i = 0; i < 256; ++i) count[i + 1] += count[i];
    for (std::uint64_t x : a) b[count[(x >> shift) & 0xFF]++] = x;
    a.swap(b);
  }
  order.resize(n);
  for (std::size_t t = 0; t < n; ++t) order[t] = std::uint32_t(a[t] & 0xFFFFFFFFu);
}

/// Per-worker buffers of the per-call loop.
struct worker {
  exact_call ex;
  bl::scratch ws;
  std::vector<std::uint64_t> sorted, sorted2;
  std::vector<std::uint32_t> order;
  std::vector<double> out;  // [configs][d] of one method
  std::vector<bl::config_result> res;
  // 4-bit scan of the group (SSA's proxy)
  std::vector<float> qpad, u, block_max;
  std::vector<std::int8_t> qa;
  std::vector<detail::block_query_prep> prep;
  clt_scratch clt;
};

setting_result evaluate(const eval_data& e, const accuracy_flags& f, thread_pool& pool, progress& prog) {
  const std::size_t n = e.n, d = e.d, H = e.heads, G = e.group, S = e.steps, calls = e.calls();
  options base;
  base.delta = f.delta;
  base.seed = f.seed;
  base.scale = error_scale::kValueScale;
  base.route = routing::kOff;  // the accuracy tables study the sparse path's certificates
  validate_shape(base, n, d);
  const double scale = base.effective_softmax_scale(d);
  auto call_index = [&](std::size_t s, std::size_t h, std::size_t g) { return (s * H + h) * G + g; };

  // Key indexes (the certified call's, also SSA's proxy and the fixed-level exact set).
  std::vector<key_index> idx(H, key_index(d));
  pool.parallel_for(H, [&](std::size_t h, std::size_t) { idx[h].build(e.view(h)); });

  // 1. The certified call of every certificate at every epsilon of the front.
  std::vector<double> eps_list = f.eps_front;
  if (std::find(eps_list.begin(), eps_list.end(), f.eps) == eps_list.end()) eps_list.push_back(f.eps);
  std::sort(eps_list.begin(), eps_list.end());
  const std::size_t E = eps_list.size(), slots = f.kinds.size() * E;
  prog.set_stage(e.name + ": certified calls");
  std::vector<float> ours_out;
  std::vector<certificate> ours_cert;
  run_certified(e, idx, base, f.kinds, eps_list, pool, ours_out, ours_cert);
  const std::size_t e_match = std::size_t(std::find(eps_list.begin(), eps_list.end(), f.eps) - eps_list.begin());
  // The tight certificate's slot at --eps: the CLT rule's level hints and its cross-check.
  const auto tight_at = std::find(f.kinds.begin(), f.kinds.end(), certificate_kind::kTight);
  const std::size_t tight_slot =
      tight_at == f.kinds.end() ? kNoRow : std::size_t(tight_at - f.kinds.begin()) * E + e_match;
  options clt_opt = base;
  clt_opt.certificate = certificate_kind::kTight;
  clt_opt.epsilon = f.eps;
  const double z = clt_quantile(f);
  double k0 = 0, b0 = 0;
  for (std::size_t ci = 0; ci < calls; ++ci) {
    k0 += double(ours_cert[e_match * calls + ci].keys_read);
    b0 += double(ours_cert[e_match * calls + ci].bytes_read);
  }
  k0 /= double(calls);
  b0 /= double(calls);
  const bl::budgets budgets = make_budgets(k0, b0 / (4.0 * double(d)), G, n);

  // 2. The configurations.
  std::vector<std::unique_ptr<bl::method>> methods = make_methods(f, base);
  std::vector<config_stats> stats;
  std::vector<std::size_t> first_config;  // per method, its first index in stats
  for (certificate_kind kind : f.kinds)
    for (std::size_t ei = 0; ei < E; ++ei) {
      config_stats c;
      c.family = "ours (" + std::string(to_string(kind)) + ")";
      c.config = strf("eps=%g", eps_list[ei]);
      c.kind = role::kOurs;
      stats.push_back(std::move(c));
    }
  const std::size_t clt_row = stats.size();
  {
    config_stats c;
    c.family = "clt rule (uncertified)";
    c.config = strf("eps=%g", f.eps);
    c.kind = role::kReference;
    stats.push_back(std::move(c));
  }
  for (auto& m : methods) {
    m->configure(budgets, n, d);
    first_config.push_back(stats.size());
    for (std::size_t i = 0; i < m->configs(); ++i) {
      config_stats c;
      c.family = m->family();
      c.config = m->config(i);
      c.kind = dynamic_cast<bl::fixed_level*>(m.get()) ? role::kAblation : role::kBaseline;
      c.key_matched = m->key_matched();
      stats.push_back(std::move(c));
    }
  }
  const bool use_kivi = wanted(f, "kivi");
  const std::vector<bl::kivi::config> kivi_grid = use_kivi ? bl::kivi::grid() : std::vector<bl::kivi::config>{};
  const std::size_t first_kivi = stats.size();
  for (const auto& kc : kivi_grid) {
    config_stats c;
    c.family = bl::kivi::family();
    c.config = bl::kivi::name(kc);
    c.key_matched = false;
    stats.push_back(std::move(c));
  }
  for (auto& c : stats) c.resize(calls);

  // 3. Per KV head: prepare, then every call.
  std::vector<worker> workers(pool.size());
  const std::size_t dp = (d + 7) / 8 * 8, blocks = (n + key_index::kBlockTokens - 1) / key_index::kBlockTokens;
  for (worker& w : workers) {
    w.qpad.assign(G * dp, 0.0f);
    w.u.assign(G * blocks * key_index::kBlockTokens + 16, 0.0f);
    w.block_max.assign(G * blocks + 1, 0.0f);
    w.qa.assign(scan_query_bytes(G, dp), 0);
    w.prep.assign(G, {});
  }
  std::vector<double> exact_o(calls * d), exact_m(calls), exact_norm(calls);
  std::vector<std::uint8_t> reference_agrees(calls, 0), clt_exact(calls, 0);
  for (std::size_t h = 0; h < H; ++h) {
    prog.set_stage(e.name + strf(": head %zu/%zu, preparing", h + 1, H));
    std::vector<double> key_norm(n);
    for (std::size_t t = 0; t < n; ++t) {
      double a = 0;
      for (std::size_t i = 0; i < d; ++i) a += double(float(e.key_rows(h)[t * d + i])) * double(float(e.key_rows(h)[t * d + i]));
      key_norm[t] = std::sqrt(a);
    }
    bl::head_input hi;
    hi.keys = e.key_rows(h);
    hi.values = e.value_rows(h);
    hi.n = n;
    hi.d = d;
    hi.group = G;
    hi.window = base.window;
    hi.scale = scale;
    hi.key_norm = key_norm;
    hi.index = &idx[h];
    hi.seed = bl::mix_seed(f.seed, h + 1);
    hi.pool = &pool;
    for (auto& m : methods) m->prepare(hi);

    prog.set_stage(e.name + strf(": head %zu/%zu, calls", h + 1, H));
    pool.parallel_for(S, [&](std::size_t s, std::size_t wi) {
      worker& w = workers[wi];
      // SSA's proxy: the 4-bit bounds of the group, one scan.
      const std::size_t pool_end = n - std::min(base.window, n);
      for (std::size_t g = 0; g < G; ++g) {
        std::copy_n(e.query(s, h, g), d, w.qpad.data() + g * dp);
        std::fill(w.qpad.data() + g * dp + d, w.qpad.data() + (g + 1) * dp, 0.0f);
      }
      const std::size_t u_stride = blocks * key_index::kBlockTokens;
      if (pool_end > 0) {
        scan_request r;
        r.index = &idx[h];
        r.queries = w.qpad.data();
        r.nq = G;
        r.softmax_scale = scale;
        r.pool_end = pool_end;
        r.u = w.u.data();
        r.u_stride = u_stride;
        r.block_max = w.block_max.data();
        r.block_stride = blocks;
        r.qa = w.qa.data();
        r.prep = w.prep.data();
        scan_score_bounds(r);
      }
      for (std::size_t g = 0; g < G; ++g) {
        const std::size_t ci = call_index(s, h, g);
        const float* q = e.query(s, h, g);
        exact_attend(q, e.key_rows(h), e.value_rows(h), n, d, scale, w.ex);
        if (s == 0 && g == 0) check_exact(q, e, h, w.ex);
        std::copy(w.ex.o.begin(), w.ex.o.end(), exact_o.begin() + std::ptrdiff_t(ci * d));
        exact_m[ci] = w.ex.M;
        exact_norm[ci] = w.ex.o_norm;
        auto record = [&](config_stats& c, double err, double keys, double bytes) {
          if (!std::isfinite(err)) err = INFINITY;  // a broken estimate counts as the worst
          c.err_m[ci] = float(err / w.ex.M);
          c.err_o[ci] = float(err / w.ex.o_norm);
          c.keys[ci] = float(keys);
          c.bytes[ci] = float(bytes);
        };
        for (std::size_t slot = 0; slot < slots; ++slot) {
          const certificate& cert = ours_cert[slot * calls + ci];
          record(stats[slot], distance(ours_out.data() + (slot * calls + ci) * d, w.ex.o), double(cert.keys_read),
                 double(cert.bytes_read));
        }
        {
          // The CLT rule on the tight certificate's sample, with the hint the certified call
          // had (it changes only the reference's own certificate, compared below).
          const int hint =
              tight_slot != kNoRow && s > 0 ? ours_cert[tight_slot * calls + call_index(s - 1, h, g)].level : -1;
          const reference_result ref = reference_attend(
              std::span<const float>(q, d), e.key_matrix(h), e.value_matrix(h), clt_opt,
              noise_key{std::uint64_t(s), 0, std::uint32_t(h)},
              reference_extras{idx[h].value_center(), idx[h].value_cap(), idx[h].reach_floor(), hint});
          const clt_outcome co = clt_rule(ref, w.ex, e.value_rows(h), n, d, idx[h], clt_opt, z, w.clt);
          record(stats[clt_row], co.err, double(co.keys), double(co.keys * 2 * d * sizeof(half)));
          clt_exact[ci] = co.exact;
          if (tight_slot != kNoRow) {
            const certificate& cert = ours_cert[tight_slot * calls + ci];
            reference_agrees[ci] = ref.cert.level == cert.level && ref.cert.heavy == cert.heavy &&
                                   ref.cert.sampled == cert.sampled;
          }
        }
        sort_by_score(w.ex.s, w.sorted, w.sorted2, w.order);
        double qn = 0;
        for (std::size_t i = 0; i < d; ++i) qn += double(q[i]) * double(q[i]);

        bl::call_input ci_in;
        ci_in.q = q;
        ci_in.q_norm = std::sqrt(qn);
        ci_in.s = w.ex.s;
        ci_in.w = w.ex.w;
        ci_in.c = w.ex.c;
        ci_in.denominator = w.ex.D;
        ci_in.order = w.order;
        ci_in.proxy = std::span<const float>(w.u.data() + g * u_stride, pool_end);
        ci_in.seed = bl::mix_seed(f.seed ^ 0xacc0ull, ci + 1);
        ci_in.noise = noise_key{std::uint64_t(s), 0, std::uint32_t(h)};
        for (std::size_t mi = 0; mi < methods.size(); ++mi) {
          const bl::method& m = *methods[mi];
          const std::size_t K = m.configs();
          w.out.assign(K * d, 0.0);
          w.res.assign(K, {});
          m.run(hi, ci_in, w.ws, w.out, w.res);
          for (std::size_t k = 0; k < K; ++k)
            record(stats[first_config[mi] + k], distance(w.out.data() + k * d, w.ex.o), w.res[k].keys,
                   w.res[k].bytes);
        }
      }
      prog.advance(double(G * n));
    });

    // KIVI: dense attention over each quantized cache, all of the head's calls in batches.
    for (std::size_t ki = 0; ki < kivi_grid.size(); ++ki) {
      prog.set_stage(e.name + strf(": head %zu/%zu, KIVI %s", h + 1, H, bl::kivi::name(kivi_grid[ki]).c_str()));
      bl::kivi kv;
      kv.prepare(hi, kivi_grid[ki]);
      const double bytes = bl::kivi::bytes_per_group(n, d, kivi_grid[ki]) / double(G);
      constexpr std::size_t kBatch = 32;
      const std::size_t head_calls = S * G, batches = (head_calls + kBatch - 1) / kBatch;
      pool.parallel_for(batches, [&](std::size_t b, std::size_t) {
        const std::size_t j0 = b * kBatch, m = std::min(kBatch, head_calls - j0);
        std::vector<const float*> qs(m);
        for (std::size_t j = 0; j < m; ++j) qs[j] = e.query((j0 + j) / G, h, (j0 + j) % G);
        std::vector<double> out(m * d);
        kv.attend(qs, scale, out);
        for (std::size_t j = 0; j < m; ++j) {
          const std::size_t ci = call_index((j0 + j) / G, h, (j0 + j) % G);
          double s2 = 0;
          for (std::size_t i = 0; i < d; ++i) {
            const double t = out[j * d + i] - exact_o[ci * d + i];
            s2 += t * t;
          }
          config_stats& c = stats[first_kivi + ki];
          c.err_m[ci] = float(std::sqrt(s2) / exact_m[ci]);
          c.err_o[ci] = float(std::sqrt(s2) / exact_norm[ci]);
          c.keys[ci] = float(n);
          c.bytes[ci] = float(bytes);
        }
      });
    }
  }

  // 4. Summaries, fronts.
  setting_result out;
  out.name = e.name;
  out.n = n;
  out.d = d;
  out.calls = calls;
  const double dense_per_head = 4.0 * double(n) * double(d) / double(G);
  for (const config_stats& c : stats) {
    summary r;
    r.family = c.family;
    r.config = c.config;
    r.setting = e.name;
    r.kind = c.kind;
    r.key_matched = c.key_matched;
    r.calls = calls;
    double keys = 0, bytes = 0;
    for (std::size_t i = 0; i < calls; ++i) keys += c.keys[i], bytes += c.bytes[i];
    r.keys_frac = keys / double(calls) / double(n);
    r.bytes_frac = bytes / double(calls) / dense_per_head;
    std::vector<double> em(c.err_m.begin(), c.err_m.end()), eo(c.err_o.begin(), c.err_o.end());
    r.p90 = quantile(em, 0.9);
    r.max = *std::max_element(em.begin(), em.end());
    r.p90_o = quantile(eo, 0.9);
    r.max_o = *std::max_element(eo.begin(), eo.end());
    std::sort(em.begin(), em.end());
    r.errors = std::move(em);
    out.rows.push_back(std::move(r));
  }
  out.ours = e_match;
  out.clt = clt_row;
  for (std::size_t k = 0; k < f.kinds.size(); ++k)
    (f.kinds[k] == certificate_kind::kTight ? out.tight : out.classic) = k * E + e_match;
  out.checks = check_certificates(f.kinds, E, e_match, f.eps, ours_cert, calls);
  out.clt_exact = std::size_t(std::count(clt_exact.begin(), clt_exact.end(), 1));
  if (tight_slot != kNoRow) {
    out.reference_compared = calls;
    out.reference_agree = std::size_t(std::count(reference_agrees.begin(), reference_agrees.end(), 1));
  }
  // Pareto fronts per family on (keys, p90, max) and (bytes, p90, max).
  std::map<std::string, std::vector<std::size_t>> by_family;
  for (std::size_t i = 0; i < out.rows.size(); ++i) by_family[out.rows[i].family].push_back(i);
  for (auto& [fam, ids] : by_family) {
    for (std::size_t i : ids) {
      bool dom_k = false, dom_b = false;
      const summary& a = out.rows[i];
      for (std::size_t j : ids) {
        if (i == j) continue;
        const summary& b = out.rows[j];
        const bool le = b.p90 <= a.p90 && b.max <= a.max;
        const bool strict = b.p90 < a.p90 || b.max < a.max;
        if (le && b.keys_frac <= a.keys_frac && (strict || b.keys_frac < a.keys_frac)) dom_k = true;
        if (le && b.bytes_frac <= a.bytes_frac && (strict || b.bytes_frac < a.bytes_frac)) dom_b = true;
      }
      out.rows[i].front_keys = !dom_k;
      out.rows[i].front_bytes = !dom_b;
    }
  }
  return out;
}

// ---- matching and reporting ------------------------------------------------------------------------

/// Per family, the configuration of lowest p90 (then lowest max) within the budget.
std::vector<const summary*> matched(const setting_result& r, bool by_bytes, double match) {
  const summary& ours = r.rows[r.ours];
  std::map<std::string, const summary*> best;
  for (const summary& s : r.rows) {
    if (s.kind == role::kOurs || s.kind == role::kReference) continue;
    if (!by_bytes && !s.key_matched) continue;
    const bool fits = by_bytes ? s.bytes_frac <= match * ours.bytes_frac : s.keys_frac <= match * ours.keys_frac;
    if (!fits) continue;
    const summary*& b = best[s.family];
    if (b == nullptr || s.p90 < b->p90 || (s.p90 == b->p90 && s.max < b->max)) b = &s;
  }
  std::vector<const summary*> v;
  for (auto& [fam, s] : best) v.push_back(s);
  std::sort(v.begin(), v.end(), [](const summary* a, const summary* b) { return a->p90 < b->p90; });
  return v;
}

std::string pct(double x) { return strf(x < 0.01 ? "%.3f%%" : "%.2f%%", 100.0 * x); }
std::string err3(double x) { return strf(x < 0.001 ? "%.5f" : "%.4f", x); }

record to_record(const summary& s, const std::string& matched_as) {
  return {
      {"method", s.family},
      {"config", s.config},
      {"setting", s.setting},
      {"keys_read_frac", s.keys_frac},
      {"bytes_read_frac", s.bytes_frac},
      {"p90_err", s.p90},
      {"max_err", s.max},
      {"p90_err_output", s.p90_o},
      {"max_err_output", s.max_o},
      {"calls", std::uint64_t(s.calls)},
      {"matched", matched_as},
  };
}

struct target_row {
  std::string setting;
  double ours_p90, ours_max, best_p90, best_family_max, lowest_max, p90_ratio, max_ratio;
  std::string best;
};

void write_gnuplot(const std::string& script, const std::vector<std::string>& files) {
  if (!run_gnuplot(script)) return;
  for (const std::string& file : files) {
    std::error_code ec;
    if (std::filesystem::exists(file, ec) && std::filesystem::file_size(file, ec) > 0)
      std::printf("wrote %s\n", file.c_str());
  }
}

std::string safe_name(std::string s) {
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '_';
  return s;
}

void plots(const accuracy_flags& f, const std::vector<setting_result>& results) {
  std::error_code ec;
  std::filesystem::create_directories(f.plot, ec);
  if (ec) throw error("--plot: cannot create directory '" + f.plot + "': " + ec.message());
  std::string script = "set terminal pngcairo size 1000,650 enhanced font 'sans,10'\n";
  std::vector<std::string> files;
  auto q = [](const std::string& s) {
    std::string o = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') o += '\\';
      o += c;
    }
    return o + "\"";
  };
  for (const setting_result& r : results) {
    // Figure 2: p90 error / M against keys read, one Pareto front per family.
    const std::string front = (std::filesystem::path(f.plot) / ("front_" + safe_name(r.name) + ".png")).string();
    files.push_back(front);
    std::map<std::string, std::vector<const summary*>> fam;
    for (const summary& s : r.rows)
      if ((s.front_keys && s.key_matched) || s.kind != role::kBaseline) fam[s.family].push_back(&s);
    std::string cmd, data;
    int style_index = 0;
    for (auto& [name, v] : fam) {
      std::sort(v.begin(), v.end(), [](const summary* a, const summary* b) { return a->keys_frac < b->keys_frac; });
      const role kind = v.front()->kind;
      const bool ours = kind == role::kOurs, abl = kind == role::kAblation, ref = kind == role::kReference;
      // The matched certificate solid, the other dashed; the CLT rule a lone marker.
      const bool matched_ours = name == r.rows[r.ours].family;
      const std::string style = ours ? (matched_ours ? "linespoints lw 3 pt 7 ps 1.5 lc rgb 'black'"
                                                     : "linespoints lw 2 dt 2 pt 6 ps 1.5 lc rgb 'black'")
                                : abl ? "lines dt 2 lw 2 lc rgb 'gray30'"
                                : ref ? "points pt 9 ps 2 lc rgb 'red'"
                                      : strf("linespoints lw 1.5 lc %d pt %d", style_index + 1, style_index % 12 + 1);
      if (!ours && !abl && !ref) ++style_index;
      // The 2-D front (keys, p90): each point lowers the p90 of every cheaper point.
      std::string pts;
      double best = INFINITY;
      for (const summary* s : v)
        if (s->p90 > 0 && (ours || abl || ref || s->p90 < best)) {
          pts += strf("%.9g %.9g\n", s->keys_frac, s->p90);
          best = std::min(best, s->p90);
        }
      if (pts.empty()) continue;
      cmd += (cmd.empty() ? "plot " : ", ") + std::string("'-' using 1:2 with ") + style + " title " + q(name);
      data += pts + "e\n";
    }
    if (!cmd.empty()) {
      script += "reset\nset output " + q(front) + "\nset title " + q("p90 error / M vs keys read, " + r.name) +
                " noenhanced\nset xlabel 'keys read (fraction of context)'\nset ylabel '90th-percentile error / M'\n"
                "set logscale xy\nset format x '%g'\nset format y '%g'\nset grid\nset key outside right noenhanced\n" +
                cmd + "\n" + data + "unset output\n";
    }
    // Figure 3: error tail at matched keys, ours and the three best families; the CLT rule
    // beside ours, since its tail past eps is what the certificate buys.
    const std::string tail = (std::filesystem::path(f.plot) / ("tail_" + safe_name(r.name) + ".png")).string();
    files.push_back(tail);
    std::vector<const summary*> show{&r.rows[r.ours]};
    if (r.clt != kNoRow) show.push_back(&r.rows[r.clt]);
    const std::size_t tail_rows = show.size() + 3;
    const auto m = matched(r, false, f.match);
    for (std::size_t i = 0; i < m.size() && show.size() < tail_rows; ++i)
      if (m[i]->kind == role::kBaseline) show.push_back(m[i]);
    cmd.clear();
    data.clear();
    for (const summary* s : show) {
      std::string pts;
      const std::size_t N = s->errors.size();
      for (std::size_t i = 0; i < N; ++i) {
        if (s->errors[i] <= 0) continue;
        if (i + 1 < N && s->errors[i + 1] == s->errors[i]) continue;
        // fraction of calls with error >= errors[i]
        const std::size_t first = std::size_t(std::lower_bound(s->errors.begin(), s->errors.end(), s->errors[i]) -
                                              s->errors.begin());
        pts += strf("%.9g %.9g\n", s->errors[i], double(N - first) / double(N));
      }
      if (pts.empty()) continue;
      cmd += (cmd.empty() ? "plot " : ", ") + std::string("'-' using 1:2 with steps lw 2 title ") +
             q(s->family + " (" + s->config + ")");
      data += pts + "e\n";
    }
    if (!cmd.empty()) {
      script += "reset\nset output " + q(tail) + "\nset title " +
                q("fraction of calls with error / M >= x at matched keys, " + r.name) +
                " noenhanced\nset xlabel 'error / M'\nset ylabel 'fraction of calls'\nset logscale xy\n"
                "set format x '%g'\nset format y '%g'\nset xrange [1e-4:*]\nset grid\n"
                "set key outside right noenhanced\n" +
                strf("set arrow from %g, graph 0 to %g, graph 1 nohead dt 3 lc rgb 'gray40'\n", f.eps, f.eps) + cmd +
                "\n" + data + "unset output\n";
    }
  }
  write_gnuplot(script, files);
}

// ---- the cost of the guarantee -----------------------------------------------------------------

/// One setting's row of the cost table: keys read per query head and error / (eps M) of the
/// certified calls and the CLT rule at --eps (NaN for a certificate not run).
struct cost_row {
  struct side {
    double keys = NAN, p90 = NAN, max = NAN, above = NAN;  // above: fraction of calls over eps M
  };
  std::string setting;
  side tight, classic, clt;
  double clt_exact = NAN;  // fraction of calls the CLT rule read in full
};

cost_row::side cost_side(const setting_result& r, std::size_t row, double eps) {
  cost_row::side c;
  if (row == kNoRow) return c;
  const summary& s = r.rows[row];
  c.keys = s.keys_frac * double(r.n);
  c.p90 = s.p90 / eps;
  c.max = s.max / eps;
  const auto over = std::upper_bound(s.errors.begin(), s.errors.end(), eps);  // errors are sorted
  c.above = double(s.errors.end() - over) / double(std::max<std::size_t>(s.errors.size(), 1));
  return c;
}

std::vector<cost_row> cost_rows(const accuracy_flags& f, const std::vector<setting_result>& results) {
  std::vector<cost_row> rows;
  for (const setting_result& r : results)
    rows.push_back({r.name, cost_side(r, r.tight, f.eps), cost_side(r, r.classic, f.eps), cost_side(r, r.clt, f.eps),
                    double(r.clt_exact) / double(std::max<std::size_t>(r.calls, 1))});
  return rows;
}

record cost_record(const accuracy_flags& f, const cost_row& c, const setting_result& r) {
  record rec{{"setting", c.setting}, {"eps", f.eps}, {"delta", f.delta}, {"calls", std::uint64_t(r.calls)}};
  auto side = [&](const std::string& name, const cost_row::side& s) {
    rec.push_back({name + "_keys", s.keys});
    rec.push_back({name + "_p90_err_eps", s.p90});
    rec.push_back({name + "_max_err_eps", s.max});
    rec.push_back({name + "_frac_above_eps", s.above});
  };
  side("tight", c.tight);
  side("classic", c.classic);
  side("clt", c.clt);
  rec.push_back({"clt_exact_frac", c.clt_exact});
  rec.push_back({"tight_over_clt", c.tight.keys / c.clt.keys});
  rec.push_back({"classic_over_clt", c.classic.keys / c.clt.keys});
  double tight_bound = NAN, classic_bound = NAN;
  for (const certificate_check& k : r.checks)
    (k.kind == certificate_kind::kTight ? tight_bound : classic_bound) = k.max_bound;
  rec.push_back({"tight_max_bound", tight_bound});
  rec.push_back({"classic_max_bound", classic_bound});
  rec.push_back({"reference_agree_frac", r.reference_compared > 0
                                             ? double(r.reference_agree) / double(r.reference_compared)
                                             : NAN});
  return rec;
}

void print_cost_table(const accuracy_flags& f, const std::vector<setting_result>& results,
                      const std::vector<cost_row>& rows) {
  std::printf("\nCost of the guarantee. Keys read per query head (mean) and error / (eps M) at eps %g, value scale: "
              "the certified calls against an uncertified central-limit rule on the tight certificate's sample "
              "(z = %.3f, at least %zu light keys)\n",
              f.eps, clt_quantile(f), kCltMinSample);
  text_table t({"<setting", "tight keys", "classic keys", "clt keys", "clt exact", "tight/clt", "classic/clt",
                "tight p90", "tight max", "classic p90", "classic max", "clt p90", "clt max", "calls > eps (t/c/clt)"});
  auto num = [](double x, const char* fmt) { return std::isfinite(x) ? strf(fmt, x) : std::string("-"); };
  auto share = [](double x) { return std::isfinite(x) ? strf("%.1f%%", 100.0 * x) : std::string("-"); };
  for (const cost_row& c : rows)
    t.add_row({c.setting, num(c.tight.keys, "%.0f"), num(c.classic.keys, "%.0f"), num(c.clt.keys, "%.0f"),
               share(c.clt_exact), num(c.tight.keys / c.clt.keys, "%.2fx"), num(c.classic.keys / c.clt.keys, "%.2fx"),
               num(c.tight.p90, "%.3f"), num(c.tight.max, "%.3f"), num(c.classic.p90, "%.3f"),
               num(c.classic.max, "%.3f"), num(c.clt.p90, "%.3f"), num(c.clt.max, "%.3f"),
               share(c.tight.above) + " / " + share(c.classic.above) + " / " + share(c.clt.above)});
  t.print(stdout);
  std::printf("error / (eps M) above 1 breaks the target; the certificates allow it in at most a fraction delta = %g "
              "of calls, the CLT rule promises nothing. The rule stops at the first level with at least %zu light "
              "keys (or all of them, or the finest level) whose interval meets eps; clt exact: calls with no pool "
              "to sample, answered exactly.\n",
              f.delta, kCltMinSample);

  // Self-checks: a certified bound above eps, or the reference stopping elsewhere than the
  // fast path on the same sample, would be a library bug.
  std::size_t certified = 0, bound_above = 0, agree = 0, compared = 0;
  double max_bound = 0;
  for (const setting_result& r : results) {
    for (const certificate_check& k : r.checks) {
      certified += k.certified;
      bound_above += k.bound_above_eps;
      max_bound = std::max(max_bound, k.max_bound);
      if (k.bound_above_eps > 0)
        std::printf("CHECK FAILED: %s, %s certificate: %zu of %zu certified bounds exceed eps (max %.4g)\n",
                    r.name.c_str(), std::string(to_string(k.kind)).c_str(), k.bound_above_eps, k.certified,
                    k.max_bound);
    }
    agree += r.reference_agree;
    compared += r.reference_compared;
    if (r.reference_agree != r.reference_compared)
      std::printf("CHECK FAILED: %s: reference_attend (tight) stopped elsewhere than attend_group in %zu of %zu "
                  "calls\n",
                  r.name.c_str(), r.reference_compared - r.reference_agree, r.reference_compared);
  }
  std::printf("checks: %zu certified bounds at eps %g, %zu above eps (max %.4g)", certified, f.eps, bound_above,
              max_bound);
  if (compared > 0)
    std::printf("; reference_attend agreed with attend_group (tight) on level, heavy and sampled in %zu of %zu calls",
                agree, compared);
  std::printf("\n");
}

void report(const accuracy_flags& f, const std::vector<setting_result>& results) {
  // Table 1: ours and the best baseline at matched keys.
  std::printf("\nTable 1. Error / M at matched keys read (ours: attend_group, %s certificate, eps %g, value scale; "
              "baselines read at most %.2gx our keys)\n",
              std::string(to_string(f.kinds.front())).c_str(), f.eps, f.match);
  text_table t1({"<setting", "ours keys", "ours p90", "ours max", "<best baseline", "keys", "p90", "max",
                 "p90 ratio", "max ratio", "<best without SSA", "p90 ratio", "max ratio"});
  std::vector<target_row> targets, targets_no_ssa;
  for (const setting_result& r : results) {
    const summary& o = r.rows[r.ours];
    const auto m = matched(r, false, f.match);
    // With and without SSA: SSA here samples with our own 4-bit bounds as its proxy (the
    // paper's Table D.2f ablation), a stronger proxy than the peers' own.
    auto best_of = [&](bool with_ssa) {
      const summary* best = nullptr;
      double lowest_max = INFINITY;
      for (const summary* s : m) {
        if (s->kind != role::kBaseline || (!with_ssa && s->family == bl::ssa().family())) continue;
        if (best == nullptr) best = s;
        lowest_max = std::min(lowest_max, s->max);
      }
      target_row tr{r.name, o.p90, o.max, INFINITY, INFINITY, lowest_max, INFINITY, INFINITY, "none"};
      if (best != nullptr) {
        tr.best = best->family;
        tr.best_p90 = best->p90;
        tr.best_family_max = best->max;
        tr.p90_ratio = o.p90 > 0 ? best->p90 / o.p90 : INFINITY;
        tr.max_ratio = o.max > 0 ? lowest_max / o.max : INFINITY;
      }
      return std::make_pair(best, tr);
    };
    const auto [best, tr] = best_of(true);
    const auto [best2, tr2] = best_of(false);
    targets.push_back(tr);
    targets_no_ssa.push_back(tr2);
    t1.add_row({r.name, pct(o.keys_frac), err3(o.p90), err3(o.max), best ? best->family : "(none within budget)",
                best ? pct(best->keys_frac) : "", best ? err3(best->p90) : "", best ? err3(best->max) : "",
                best ? strf("%.1fx", tr.p90_ratio) : "", best ? strf("%.1fx", tr.max_ratio) : "",
                best2 ? best2->family : "", best2 ? strf("%.1fx", tr2.p90_ratio) : "",
                best2 ? strf("%.1fx", tr2.max_ratio) : ""});
  }
  t1.print(stdout);
  std::printf("p90 ratio = best baseline's p90 / ours; max ratio = lowest max error of any baseline family at matched "
              "keys / ours.\n");

  // D.2a: the three best families at matched keys.
  std::printf("\nTable D.2a. The three best baseline families at matched keys read (keys / p90 / max of error/M), "
              "and our fixed-level ablation\n");
  text_table t2({"<setting", "<ours", "<1st", "<2nd", "<3rd", "<fixed level (no certificate)"});
  for (const setting_result& r : results) {
    const summary& o = r.rows[r.ours];
    std::vector<std::string> cells{r.name, pct(o.keys_frac) + " / " + err3(o.p90) + " / " + err3(o.max)};
    std::string ablation;
    for (const summary* s : matched(r, false, f.match)) {
      const std::string cell = s->family + " " + pct(s->keys_frac) + ", " + err3(s->p90) + " / " + err3(s->max);
      if (s->kind == role::kAblation)
        ablation = s->config + " " + pct(s->keys_frac) + ", " + err3(s->p90) + " / " + err3(s->max);
      else if (cells.size() < 5)
        cells.push_back(cell);
    }
    cells.resize(5);
    cells.push_back(ablation);
    t2.add_row(cells);
  }
  t2.print(stdout);

  // Matched bytes.
  std::printf("\nError / M at matched bytes read (at most %.2gx our bytes; bytes as a fraction of dense attention's "
              "K and V reads)\n",
              f.match);
  text_table t3({"<setting", "ours bytes", "ours p90", "ours max", "<1st", "<2nd", "<3rd", "p90 ratio", "max ratio"});
  for (const setting_result& r : results) {
    const summary& o = r.rows[r.ours];
    std::vector<std::string> cells{r.name, pct(o.bytes_frac), err3(o.p90), err3(o.max)};
    double best_p90 = INFINITY, lowest_max = INFINITY;
    for (const summary* s : matched(r, true, f.match)) {
      if (s->kind != role::kBaseline) continue;
      best_p90 = std::min(best_p90, s->p90);
      lowest_max = std::min(lowest_max, s->max);
      if (cells.size() < 7)
        cells.push_back(s->family + " " + pct(s->bytes_frac) + ", " + err3(s->p90) + " / " + err3(s->max));
    }
    cells.resize(7);
    cells.push_back(std::isfinite(best_p90) && o.p90 > 0 ? strf("%.2fx", best_p90 / o.p90) : "");
    cells.push_back(std::isfinite(lowest_max) && o.max > 0 ? strf("%.1fx", lowest_max / o.max) : "");
    t3.add_row(cells);
  }
  t3.print(stdout);

  // D.2e: KIVI.
  bool any_kivi = false;
  for (const summary& s : results.front().rows) any_kivi |= s.family == bl::kivi::family();
  if (any_kivi) {
    std::printf("\nTable D.2e. Dense attention over a KIVI-style quantized cache: bytes read / p90 / max error/M, "
                "against ours at eps %g\n",
                f.eps);
    std::vector<std::string> hdr{"<setting", "ours"};
    for (const auto& kc : bl::kivi::grid()) hdr.push_back(bl::kivi::name(kc));
    text_table t4(hdr);
    for (const setting_result& r : results) {
      const summary& o = r.rows[r.ours];
      std::vector<std::string> cells{r.name, pct(o.bytes_frac) + " / " + err3(o.p90) + " / " + err3(o.max)};
      for (const summary& s : r.rows)
        if (s.family == bl::kivi::family())
          cells.push_back(pct(s.bytes_frac) + " / " + err3(s.p90) + " / " + err3(s.max));
      t4.add_row(cells);
    }
    t4.print(stdout);
  }

  // Output-norm errors at matched keys.
  std::printf("\nThe same comparison on the output-norm scale (error / ||o||) at matched keys: p90 / max\n");
  text_table t5({"<setting", "ours", "<best baseline (by p90 error/M)", "its p90 / max"});
  for (const setting_result& r : results) {
    const summary& o = r.rows[r.ours];
    const summary* best = nullptr;
    for (const summary* s : matched(r, false, f.match))
      if (s->kind == role::kBaseline && best == nullptr) best = s;
    t5.add_row({r.name, err3(o.p90_o) + " / " + err3(o.max_o), best ? best->family : "",
                best ? err3(best->p90_o) + " / " + err3(best->max_o) : ""});
  }
  t5.print(stdout);

  // Targets.
  auto print_targets = [](const char* what, const std::vector<target_row>& all) {
    // Settings where no baseline read within the budget (or none ran) do not count.
    std::vector<target_row> tv;
    for (const target_row& t : all)
      if (t.best != "none") tv.push_back(t);
    if (tv.empty()) {
      std::printf("targets at matched keys, %s: no setting has a baseline within the budget\n", what);
      return;
    }
    std::size_t met_p90 = 0, met_max = 0;
    double min_p90 = INFINITY, max_p90 = 0, min_max = INFINITY;
    for (const target_row& t : tv) {
      met_p90 += t.p90_ratio >= 4.0;
      met_max += t.max_ratio >= 10.0;
      min_p90 = std::min(min_p90, t.p90_ratio);
      max_p90 = std::max(max_p90, t.p90_ratio);
      min_max = std::min(min_max, t.max_ratio);
    }
    std::printf("targets at matched keys, %s: p90 ratio >= 4 in %zu of %zu settings (range %.2f - %.2f); max ratio "
                ">= 10 in %zu of %zu settings (lowest %.2f)\n",
                what, met_p90, tv.size(), min_p90, max_p90, met_max, tv.size(), min_max);
  };
  std::printf("\n");
  print_targets("all baselines", targets);
  print_targets("baselines without SSA", targets_no_ssa);

  const std::vector<cost_row> costs = cost_rows(f, results);
  print_cost_table(f, results, costs);
  std::vector<record> cost_recs;
  for (std::size_t i = 0; i < results.size(); ++i) cost_recs.push_back(cost_record(f, costs[i], results[i]));

  std::vector<record> recs;
  for (const setting_result& r : results) {
    for (const summary& s : r.rows)
      if (s.kind == role::kReference)
        recs.push_back(to_record(s, "reference"));
      else if (s.kind == role::kOurs || (s.key_matched ? s.front_keys : s.front_bytes))
        recs.push_back(to_record(s, "front"));
    for (const summary* s : matched(r, false, f.match)) recs.push_back(to_record(*s, "keys"));
    for (const summary* s : matched(r, true, f.match)) recs.push_back(to_record(*s, "bytes"));
  }
  if (!f.json.empty()) {
    json_writer j;
    j.begin_object().key("command").value("accuracy");
    j.key("machine").begin_object();
    machine_fields(j);
    j.end_object();
    j.key("config").begin_object(true);
    j.key("quick").value(f.quick).key("eps").value(f.eps).key("delta").value(f.delta).key("match").value(f.match);
    j.key("kv_heads").value(std::uint64_t(f.kv_heads)).key("group").value(std::uint64_t(f.group));
    j.key("seed").value(std::uint64_t(f.seed));
    std::string kinds;
    for (certificate_kind k : f.kinds) kinds += (kinds.empty() ? "" : ",") + std::string(to_string(k));
    j.key("certificates").value(kinds);
    j.end_object();
    j.key("guarantee_cost").begin_array();
    for (const record& r : cost_recs) j.begin_object(true).fields(r).end_object();
    j.end_array();
    j.key("targets").begin_array();
    for (const target_row& t : targets) {
      const target_row& t2 = targets_no_ssa[std::size_t(&t - targets.data())];
      j.begin_object(true);
      j.key("setting").value(t.setting).key("ours_p90_err").value(t.ours_p90).key("ours_max_err").value(t.ours_max);
      j.key("best_baseline").value(t.best).key("best_p90_err").value(t.best_p90);
      j.key("lowest_max_err").value(t.lowest_max).key("p90_ratio").value(t.p90_ratio).key("max_ratio").value(t.max_ratio);
      j.key("best_baseline_without_ssa").value(t2.best).key("p90_ratio_without_ssa").value(t2.p90_ratio);
      j.key("max_ratio_without_ssa").value(t2.max_ratio);
      j.end_object();
    }
    j.end_array();
    finish_json(j, recs, f.json);
  }
  if (!f.csv.empty()) {
    write_csv(f.csv, recs);
    // One CSV holds one table: the cost table goes beside it.
    const std::filesystem::path p(f.csv);
    const std::string cost_csv = (p.parent_path() / (p.stem().string() + "_guarantee_cost.csv")).string();
    write_csv(cost_csv, cost_recs);
  }
  if (!f.plot.empty()) plots(f, results);
}

// ---- the command ---------------------------------------------------------------------------------

/// --certificate's names, in order (the first is the one matched against the baselines).
std::vector<certificate_kind> parse_certificates(const std::vector<std::string>& names) {
  if (names.empty()) throw error("--certificate: name at least one of tight, classic");
  std::vector<certificate_kind> kinds;
  for (const std::string& name : names) {
    certificate_kind k;
    try {
      k = certificate_kind_from_string(name);
    } catch (const error& x) {
      throw error(std::string("--") + x.what());
    }
    if (std::find(kinds.begin(), kinds.end(), k) != kinds.end())
      throw error("--certificate: '" + name + "' is listed twice");
    kinds.push_back(k);
  }
  return kinds;
}

void run_accuracy(accuracy_flags f) {
  for (const std::string& m : f.methods)
    if (m != "none" && std::find(kMethodNames.begin(), kMethodNames.end(), m) == kMethodNames.end())
      throw error("--methods: unknown method '" + m + "'");
  f.kinds = parse_certificates(f.certificates);
  if (!(f.match >= 1.0)) throw error("--match must be >= 1");
  if (f.kv.empty() != f.queries.empty()) throw error("--kv and --queries go together");
  options probe;
  probe.epsilon = f.eps;
  probe.delta = f.delta;
  validate(probe);
  for (double e : f.eps_front) {
    probe.epsilon = e;
    validate(probe);
  }
  if (f.contexts.empty()) f.contexts = f.quick ? std::vector<std::string>{"16K", "32K"}
                                               : std::vector<std::string>{"16K", "32K", "64K", "128K"};
  if (f.regimes.empty()) {
    if (f.quick)
      f.regimes = {"mixed", "clustered", "needle", "recency"};
    else
      for (synthetic::regime r : synthetic::all_regimes) f.regimes.push_back(std::string(synthetic::to_string(r)));
  }
  const std::size_t calls = f.calls > 0 ? f.calls : f.quick ? 256 : 2000;
  thread_pool pool(f.threads);

  struct plan {
    synthetic::regime regime;
    std::size_t n;
  };
  std::vector<plan> plans;
  if (f.kv.empty()) {
    if (f.kv_heads == 0 || f.group == 0) throw error("--kv-heads and --group must be > 0");
    if (f.head_dim == 0 || f.head_dim % 2) throw error("--head-dim must be even and > 0");
    for (const std::string& r : f.regimes)
      for (const std::string& c : f.contexts) plans.push_back({synthetic::regime_from_string(r), parse_count(c)});
    for (const plan& p : plans)
      if (p.n <= 64) throw error("--context: contexts must exceed the 64-token window");
  }
  const std::size_t steps = (calls + f.kv_heads * f.group - 1) / (f.kv_heads * f.group);
  double total = 0;
  for (const plan& p : plans) total += double(steps * f.kv_heads * f.group * p.n);
  std::printf("accuracy: %s, %zu threads, isa %s\n", f.quick ? "quick" : "full", pool.size(),
              std::string(to_string(active_isa())).c_str());
  std::fflush(stdout);

  std::vector<setting_result> results;
  if (!f.kv.empty()) {
    const eval_data e = npy_data(f.kv, f.queries, f.calls);
    std::printf("setting %s: %zu KV heads x %zu tokens x head_dim %zu, %zu steps x group %zu = %zu calls\n",
                e.name.c_str(), e.heads, e.n, e.d, e.steps, e.group, e.calls());
    if (e.n <= 64) throw error(f.kv + ": the cache must hold more than the 64-token window");
    progress prog("certattn-bench accuracy", double(e.calls() * e.n), !f.quiet);
    results.push_back(evaluate(e, f, pool, prog));
    prog.finish();
  } else {
    std::printf("settings: %zu (regime x context), %zu calls each (%zu steps x %zu KV heads x group %zu), head_dim %zu\n",
                plans.size(), steps * f.kv_heads * f.group, steps, f.kv_heads, f.group, f.head_dim);
    std::fflush(stdout);
    progress prog("certattn-bench accuracy", total, !f.quiet);
    for (const plan& p : plans) {
      prog.set_stage(std::string(synthetic::to_string(p.regime)) + "/" + format_count(p.n) + ": synthetic cache");
      const eval_data e = synthetic_data(p.regime, p.n, f.kv_heads, f.group, f.head_dim, steps, f.seed);
      results.push_back(evaluate(e, f, pool, prog));
    }
    prog.finish();
  }
  report(f, results);
}

}  // namespace

void add_accuracy_command(CLI::App& app) {
  auto f = std::make_shared<accuracy_flags>();
  CLI::App* cmd = app.add_subcommand(
      "accuracy",
      "error of the certified call (tight and classic certificates) vs baselines (oracle top-k/top-p, "
      "StreamingLLM, Quest, vAttention, SSA, MagicPIG, RetroInfer, KIVI, fixed level) at matched keys and bytes "
      "read, and its keys read against an uncertified central-limit stopping rule (docs/accuracy.md)");
  cmd->add_flag("--quick", f->quick, "a run of a few minutes: contexts 16K,32K, 4 regimes, 256 calls per setting");
  cmd->add_option("--context", f->contexts, "contexts in tokens, comma-separated (default 16K,32K,64K,128K)")
      ->delimiter(',');
  std::string regimes;
  for (synthetic::regime r : synthetic::all_regimes)
    regimes += (regimes.empty() ? "" : ", ") + std::string(synthetic::to_string(r));
  cmd->add_option("--regime", f->regimes, "synthetic regimes, comma-separated (default all): " + regimes)
      ->delimiter(',');
  cmd->add_option("--kv-heads", f->kv_heads, "KV heads of the synthetic layer")->capture_default_str();
  cmd->add_option("--group", f->group, "query heads per KV head (GQA group)")->capture_default_str();
  cmd->add_option("--head-dim", f->head_dim, "channels per head")->capture_default_str();
  cmd->add_option("--calls", f->calls, "calls (query heads x steps) per setting; default 2000, --quick 256");
  cmd->add_option("--eps", f->eps, "our target error (value scale) for the matched comparison")->capture_default_str();
  cmd->add_option("--eps-front", f->eps_front, "our epsilons drawn on the Pareto plot")->delimiter(',')->capture_default_str();
  cmd->add_option("--delta", f->delta, "failure probability of our certificates")->capture_default_str();
  cmd->add_option("--clt-z", f->clt_z,
                  "quantile of the uncertified CLT rule (default: the normal 1 - delta/2 quantile, 1.96 at delta 0.05)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--match", f->match, "a baseline is matched when it reads at most this times our keys (bytes)")
      ->capture_default_str();
  cmd->add_option("--threads", f->threads, "threads (0 = all cores)")->capture_default_str();
  cmd->add_option("--methods", f->methods,
                  "baselines to run, comma-separated (default all): topk, topp, streaming, quest, vattention, ssa, "
                  "magicpig, retroinfer, kivi, fixed; none for no baseline")
      ->delimiter(',');
  cmd->add_option("--certificate", f->certificates,
                  "certificates of our call, comma-separated: tight, classic (default both; the first is compared "
                  "with the baselines)")
      ->delimiter(',');
  cmd->add_option("--kv", f->kv, "a KV cache as .npy, float16/float32 [2, kv_heads, n_tokens, head_dim]");
  cmd->add_option("--queries", f->queries, "its queries as .npy, float16/float32 [steps, kv_heads, group, head_dim]");
  cmd->add_option("--json", f->json, "also write the rows as JSON to this file");
  cmd->add_option("--csv", f->csv, "also write the rows as CSV to this file");
  cmd->add_option("--plot", f->plot, "write PNG plots (Pareto fronts, error tails) into this directory (gnuplot)");
  cmd->add_option("--seed", f->seed, "seed of the synthetic data, perturbations and baselines")->capture_default_str();
  cmd->add_flag("--quiet", f->quiet, "no progress indicator on stderr");
  cmd->callback([f] { run_accuracy(*f); });
}

}  // namespace certattn::bench
