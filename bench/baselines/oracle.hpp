// Oracle selection: exact attention restricted to the keys of largest exact score. Both
// know every exact score for free, so they bound what any selection method can do
// (keys and bytes count only the rows used: a lower bound on a real implementation).
//   oracle top-k: the k keys of largest score, k on the setting's budget grid;
//   oracle top-p: the fewest keys whose attention mass reaches p.
#pragma once

#include "common.hpp"

#include <cstdio>

namespace certattn::bench::baselines {

class oracle_top_k final : public method {
 public:
  std::string family() const override { return "oracle top-k"; }
  void configure(const budgets& b, std::size_t n, std::size_t) override { k_ = clamp_unique(b.keys, 1, n); }
  std::size_t configs() const override { return k_.size(); }
  std::string config(std::size_t i) const override { return "k=" + std::to_string(k_[i]); }

  void run(const head_input& h, const call_input& c, scratch& ws, std::span<double> out,
           std::span<config_result> res) const override {
    accum& acc = ws.acc;
    acc.reset(h.d);
    std::size_t i = 0;
    for (std::size_t j = 0; j < k_.size(); ++j) {
      for (; i < k_[j]; ++i) acc.add(h.value(c.order[i]), c.w[c.order[i]]);
      acc.write(out.data() + j * h.d);
      res[j] = {double(k_[j]), h.kv_row_bytes(double(k_[j]))};
    }
  }

 private:
  std::vector<std::size_t> k_;
};

class oracle_top_p final : public method {
 public:
  std::string family() const override { return "oracle top-p"; }
  void configure(const budgets&, std::size_t, std::size_t) override {
    p_ = {0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 0.9999};
  }
  std::size_t configs() const override { return p_.size(); }
  std::string config(std::size_t i) const override {
    char buf[32];
    std::snprintf(buf, sizeof buf, "p=%g", p_[i]);
    return buf;
  }

  void run(const head_input& h, const call_input& c, scratch& ws, std::span<double> out,
           std::span<config_result> res) const override {
    accum& acc = ws.acc;
    acc.reset(h.d);
    std::size_t i = 0;
    double mass = 0.0;
    for (std::size_t j = 0; j < p_.size(); ++j) {
      const double target = p_[j] * c.denominator;
      while (i < h.n && (i == 0 || mass < target)) {
        const std::uint32_t t = c.order[i++];
        mass += c.w[t];
        acc.add(h.value(t), c.w[t]);
      }
      acc.write(out.data() + j * h.d);
      res[j] = {double(i), h.kv_row_bytes(double(i))};
    }
  }

 private:
  std::vector<double> p_;
};

}  // namespace certattn::bench::baselines
