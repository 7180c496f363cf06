// The paper's ablation: our estimator stopped at a fixed level j, without certificates.
// Same perturbations as the certified call of the same query (seed, noise key), same
// window and exact set, same Horvitz-Thompson estimate (ALGORITHM.md) at tau_j; only the
// data-dependent stopping rule is gone. Keys read: window + exact set + |S_j| (what an
// exact candidate generator reads, as the reference estimator reports); bytes add the
// 4-bit scan's codes and scales, as the certified call's certificate counts them.
// Grid: every level j = 0 .. max_levels.
#pragma once

#include "common.hpp"
#include "ssa.hpp"

#include <certattn/options.hpp>
#include <certattn/perturb.hpp>
#include <certattn/sampler.hpp>

namespace certattn::bench::baselines {

class fixed_level final : public method {
 public:
  explicit fixed_level(const options& opt) : opt_(opt) {}
  std::string family() const override { return "ours, fixed level (no certificate)"; }
  void configure(const budgets&, std::size_t, std::size_t) override {}
  std::size_t configs() const override { return std::size_t(opt_.max_levels) + 1; }
  std::string config(std::size_t i) const override { return "level=" + std::to_string(i); }

  void run(const head_input& h, const call_input& c, scratch& ws, std::span<double> out,
           std::span<config_result> res) const override {
    const std::size_t n = h.n, d = h.d, W = std::min(opt_.window, n), P = n - W;
    const int J = opt_.max_levels, r = opt_.grid_ratio;
    std::span<const std::uint32_t> xs = h.index->exact_tokens();
    xs = xs.first(std::size_t(std::lower_bound(xs.begin(), xs.end(), std::uint32_t(P)) - xs.begin()));
    std::vector<std::uint8_t>& in_xs = ws.flag;
    in_xs.assign(P, 0);
    accum& exact = ws.acc;
    exact.reset(d);
    for (std::uint32_t t : xs) in_xs[t] = 1, exact.add(h.value(t), c.w[t]);
    for (std::size_t t = P; t < n; ++t) exact.add(h.value(t), c.w[t]);
    const double fixed = double(W + xs.size());
    const double shared = (h.kv_row_bytes(fixed) + ssa::proxy_bytes(*h.index, P)) / double(h.group);

    // Sampled pool tokens, bucketed by the level at which they enter (counting sort).
    const perturbation pert(opt_.seed, c.noise);
    std::vector<std::uint32_t>& tok = ws.idx;
    std::vector<std::uint32_t>& lev = ws.idx2;  // sample level << 16 | heavy level
    tok.clear();
    lev.clear();
    std::vector<std::size_t> start(std::size_t(J) + 2, 0), heavy_at(std::size_t(J) + 2, 0);
    for (std::size_t t = 0; t < P; ++t) {
      if (in_xs[t]) continue;
      const double x = c.s[t] - c.c;
      const int sl = earliest_level(x + pert.exp1(t), r, J);
      if (sl > J) continue;
      const int hl = earliest_level(x, r, J);
      tok.push_back(std::uint32_t(t));
      lev.push_back(std::uint32_t(sl) << 16 | std::uint32_t(std::min(hl, J + 1)));
      ++start[std::size_t(sl) + 1];
    }
    for (std::size_t j = 1; j < start.size(); ++j) start[j] += start[j - 1];
    std::vector<std::uint32_t> by_level(tok.size());
    {
      std::vector<std::size_t> cur(start.begin(), start.end() - 1);
      for (std::size_t i = 0; i < tok.size(); ++i) by_level[cur[lev[i] >> 16]++] = std::uint32_t(i);
    }
    // Light keys that turn heavy at a later level, by that level.
    std::vector<std::vector<std::uint32_t>> transitions(std::size_t(J) + 1);
    std::vector<double>& light = ws.a;
    light.assign(d, 0.0);
    std::size_t light_count = 0, sampled = 0;
    for (int j = 0; j <= J; ++j) {
      for (std::size_t k = start[std::size_t(j)]; k < start[std::size_t(j) + 1]; ++k) {
        const std::uint32_t i = by_level[k], t = tok[i];
        const int hl = int(lev[i] & 0xFFFF);
        ++sampled;
        if (hl <= j) {
          exact.add(h.value(t), c.w[t]);
        } else {
          ++light_count;
          const half* v = h.value(t);
          for (std::size_t q = 0; q < d; ++q) light[q] += double(float(v[q]));
          if (hl <= J) transitions[std::size_t(hl)].push_back(t);
        }
      }
      for (std::uint32_t t : transitions[std::size_t(j)]) {
        --light_count;
        const half* v = h.value(t);
        for (std::size_t q = 0; q < d; ++q) light[q] -= double(float(v[q]));
        exact.add(v, c.w[t]);
      }
      const double tau = tau_of(j, r);
      accum& est = ws.acc2;
      est = exact;
      est.add_sum(light, tau, tau * double(light_count));
      est.write(out.data() + std::size_t(j) * d);
      res[std::size_t(j)] = {fixed + double(sampled), shared + h.kv_row_bytes(double(sampled))};
    }
  }

 private:
  options opt_;
};

}  // namespace certattn::bench::baselines
