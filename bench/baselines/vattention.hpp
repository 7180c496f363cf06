// vAttention-style (Desai et al., 2025): sinks + window + top-k read exactly, and a uniform
// random sample of the remaining keys with Horvitz-Thompson weights. The sample size comes
// from the central limit theorem: a base sample of ~64 residual keys estimates the spread
// of w_i and of w_i v_i, and the budget b is the size at which a normal approximation
// puts the relative errors of the denominator and of the numerator below eps_v with
// confidence 1 - delta_v (z = 1.96 for delta_v = 0.05). The top-k is the oracle top-k
// (exact scores), as in the paper's "vAttention (oracle)": an upper bound on the method.
// Grid: k on the coarse budget grid x eps_v in {0.05, 0.1, 0.2, 0.4}.
#pragma once

#include "common.hpp"

#include <cstdio>

namespace certattn::bench::baselines {

class vattention final : public method {
 public:
  std::string family() const override { return "vAttention (oracle top-k)"; }
  void configure(const budgets& b, std::size_t n, std::size_t) override {
    const std::size_t fixed = kSinks + 64;
    k_ = clamp_unique(b.coarse, 0, n > fixed ? n - fixed : 0);
    eps_ = {0.05, 0.1, 0.2, 0.4};
  }
  std::size_t configs() const override { return k_.size() * eps_.size(); }
  std::string config(std::size_t i) const override {
    char buf[64];
    std::snprintf(buf, sizeof buf, "k=%zu,eps_v=%g", k_[i / eps_.size()], eps_[i % eps_.size()]);
    return buf;
  }

  void run(const head_input& h, const call_input& c, scratch& ws, std::span<double> out,
           std::span<config_result> res) const override {
    const std::size_t n = h.n, d = h.d, W = std::min(h.window, n);
    std::vector<std::uint8_t>& flag = ws.flag;  // 1: read exactly, 0: residual
    flag.assign(n, 0);
    std::vector<float>& u = ws.f;
    u.resize(n);
    rng r(c.seed ^ 0x76617474ull);
    for (std::size_t t = 0; t < n; ++t) u[t] = float(r.uniform());
    accum& det = ws.acc;
    det.reset(d);
    std::size_t fixed = 0;
    auto take = [&](std::size_t t) {
      flag[t] = 1;
      det.add(h.value(t), c.w[t]);
    };
    for (std::size_t t = 0; t < std::min(kSinks, n); ++t) take(t), ++fixed;
    for (std::size_t t = n - W; t < n; ++t)
      if (!flag[t]) take(t), ++fixed;
    std::vector<double>& m = ws.a;  // base-sample mean of w v
    m.resize(d);
    std::size_t next = 0, topk = 0;
    for (std::size_t ki = 0; ki < k_.size(); ++ki) {
      while (topk < k_[ki] && next < n) {
        const std::uint32_t t = c.order[next++];
        if (!flag[t]) take(t), ++topk;
      }
      const double rsize = double(n - fixed - topk);
      // Base sample: residual keys with u < pi0.
      const double pi0 = rsize > 0 ? std::min(1.0, kBase / rsize) : 1.0;
      double nb = 0, sw = 0, sw2 = 0, sw2v2 = 0;
      std::fill(m.begin(), m.end(), 0.0);
      for (std::size_t t = 0; t < n; ++t) {
        if (flag[t] || u[t] >= pi0) continue;
        const double wt = c.w[t];
        nb += 1;
        sw += wt;
        sw2 += wt * wt;
        sw2v2 += wt * wt * detail::accumulate_row(h.value(t), d, wt, m.data(), active_isa());
      }
      double sigma_w = 0, sigma_n = 0, d_hat = det.den(), n_norm = 0;
      if (nb > 0) {
        const double mw = sw / nb;
        sigma_w = std::sqrt(std::max(0.0, sw2 / nb - mw * mw));
        double mm = 0;
        for (std::size_t i = 0; i < d; ++i) mm += (m[i] / nb) * (m[i] / nb);
        sigma_n = std::sqrt(std::max(0.0, sw2v2 / nb - mm));
        d_hat += rsize * mw;
      }
      // ||N^|| from the exact part plus the base sample's estimate of the residual.
      {
        std::vector<double>& nh = ws.b;
        nh.assign(d, 0.0);
        det.write(nh.data());
        for (std::size_t i = 0; i < d; ++i) {
          const double x = nh[i] * det.den() + (nb > 0 ? rsize * m[i] / nb : 0.0);
          n_norm += x * x;
        }
        n_norm = std::sqrt(n_norm);
      }
      for (std::size_t ei = 0; ei < eps_.size(); ++ei) {
        const double e = eps_[ei];
        double b = kBase;
        if (nb > 0 && d_hat > 0) b = std::max(b, std::pow(kZ * rsize * sigma_w / (e * d_hat), 2.0));
        if (nb > 0 && n_norm > 0) b = std::max(b, std::pow(kZ * rsize * sigma_n / (e * n_norm), 2.0));
        const double pi = rsize > 0 ? std::max(pi0, std::min(1.0, b / rsize)) : 1.0;
        accum& est = ws.acc2;
        est = det;
        std::size_t sampled = 0;
        for (std::size_t t = 0; t < n; ++t) {
          if (flag[t] || u[t] >= pi) continue;
          ++sampled;
          est.add(h.value(t), c.w[t] / pi);
        }
        const std::size_t j = ki * eps_.size() + ei;
        est.write(out.data() + j * d);
        const double own = double(topk + sampled);
        res[j] = {double(fixed) + own, h.kv_row_bytes(own) + h.kv_row_bytes(double(fixed)) / double(h.group)};
      }
    }
  }

 private:
  static constexpr std::size_t kSinks = 4;
  static constexpr double kBase = 64.0;  // expected base-sample size
  static constexpr double kZ = 1.959964;  // delta_v = 0.05, two-sided
  std::vector<std::size_t> k_;
  std::vector<double> eps_;
};

}  // namespace certattn::bench::baselines
