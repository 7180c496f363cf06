// SSA-style stratified sampling (Stratified Sparse Attention): a cheap proxy score ranks the
// keys; the top-k by proxy are read exactly, and the residual is Poisson-sampled with
// inclusion probabilities pi_i = min(1, m p_i), p_i proportional to exp(proxy_i), then
// corrected by Horvitz-Thompson weights w_i / pi_i (sampled keys are read exactly, so
// their w_i is known). The window is read exactly as in the certified call.
// The proxy is the certified call's own 4-bit score upper bound (key_index + scan), so the
// metadata bytes are the same 4-bit codes and block scales, read once per group.
// Grid: budget B on the coarse grid x split in {0.25, 0.5, 0.75}: k = split B, m = B - k.
#pragma once

#include "common.hpp"

#include <cstdio>
#include <limits>
#include <numeric>

namespace certattn::bench::baselines {

class ssa final : public method {
 public:
  std::string family() const override { return "SSA (4-bit proxy)"; }
  void configure(const budgets& b, std::size_t n, std::size_t) override {
    cfg_.clear();
    for (std::size_t B : b.coarse)
      for (double split : {0.25, 0.5, 0.75}) {
        const std::size_t k = std::min<std::size_t>(n, std::size_t(std::llround(split * double(B))));
        const double m = double(B) - double(k);
        cfg_.push_back({k, m, split});
      }
  }
  std::size_t configs() const override { return cfg_.size(); }
  std::string config(std::size_t i) const override {
    char buf[64];
    std::snprintf(buf, sizeof buf, "k=%zu,m=%.0f", cfg_[i].k, cfg_[i].m);
    return buf;
  }

  /// 4-bit codes and block scales of the pool, read once per group (as the certified call).
  static double proxy_bytes(const key_index& idx, std::size_t pool) {
    const std::size_t blocks = (pool + key_index::kBlockTokens - 1) / key_index::kBlockTokens;
    return double(blocks) * double(idx.block_code4_bytes() + 3 * idx.padded_dim() * sizeof(float));
  }

  void run(const head_input& h, const call_input& c, scratch& ws, std::span<double> out,
           std::span<config_result> res) const override {
    const std::size_t n = h.n, d = h.d, W = std::min(h.window, n), P = n - W;
    accum& win = ws.acc;
    win.reset(d);
    for (std::size_t t = P; t < n; ++t) win.add(h.value(t), c.w[t]);
    const double shared = (h.kv_row_bytes(double(W)) + proxy_bytes(*h.index, P)) / double(h.group);

    // Pool by decreasing proxy (only the longest top-k prefix needs sorting).
    std::vector<std::uint32_t>& ord = ws.idx2;
    ord.resize(P);
    std::iota(ord.begin(), ord.end(), 0u);
    std::size_t kmax = 0;
    for (const auto& g : cfg_) kmax = std::max(kmax, std::min(g.k, P));
    std::partial_sort(ord.begin(), ord.begin() + std::ptrdiff_t(kmax), ord.end(),
                      [&](std::uint32_t a, std::uint32_t b) { return c.proxy[a] > c.proxy[b]; });
    std::vector<std::uint32_t>& rank = ws.idx;
    rank.assign(P, std::numeric_limits<std::uint32_t>::max());
    for (std::size_t i = 0; i < kmax; ++i) rank[ord[i]] = std::uint32_t(i);
    float umax = -INFINITY;
    for (std::size_t t = 0; t < P; ++t) umax = std::max(umax, c.proxy[t]);
    std::vector<double>& e = ws.a;  // exp(proxy - max)
    e.resize(P);
    double z_total = 0;
    for (std::size_t t = 0; t < P; ++t) z_total += (e[t] = std::exp(double(c.proxy[t]) - double(umax)));
    std::vector<double>& prefix = ws.b;  // proxy mass of the top-i prefix
    prefix.assign(kmax + 1, 0.0);
    for (std::size_t i = 0; i < kmax; ++i) prefix[i + 1] = prefix[i] + e[ord[i]];
    std::vector<float>& u = ws.f;
    u.resize(P);
    rng r(c.seed ^ 0x737361ull);
    for (std::size_t t = 0; t < P; ++t) u[t] = float(r.uniform());

    for (std::size_t j = 0; j < cfg_.size(); ++j) {
      const std::size_t k = std::min(cfg_[j].k, P);
      accum& est = ws.acc2;
      est = win;
      for (std::size_t i = 0; i < k; ++i) est.add(h.value(ord[i]), c.w[ord[i]]);
      const double z_res = std::max(z_total - prefix[k], 0.0);
      std::size_t sampled = 0;
      if (cfg_[j].m > 0 && z_res > 0) {
        const double lam = cfg_[j].m / z_res;
        for (std::size_t t = 0; t < P; ++t) {
          if (rank[t] < k) continue;
          const double pi = std::min(1.0, lam * e[t]);
          if (double(u[t]) >= pi) continue;
          ++sampled;
          est.add(h.value(t), c.w[t] / pi);
        }
      }
      est.write(out.data() + j * d);
      const double own = double(k + sampled);
      res[j] = {double(W) + own, h.kv_row_bytes(own) + shared};
    }
  }

 private:
  struct grid_point {
    std::size_t k;
    double m, split;
  };
  std::vector<grid_point> cfg_;
};

}  // namespace certattn::bench::baselines
