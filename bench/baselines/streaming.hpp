// StreamingLLM (Xiao et al., 2024): the first tokens (attention sinks) and a window of the
// most recent ones, exact attention over them, everything else dropped. The rows do not
// depend on the query, so a GQA group reads them once (bytes split over the group).
// Grid: 4 sinks + the newest (budget - 4) tokens, budget on the setting's grid (with
// budgets up to G times larger: its rows cost 1/G per head in bytes).
#pragma once

#include "common.hpp"

namespace certattn::bench::baselines {

class streaming_llm final : public method {
 public:
  std::string family() const override { return "StreamingLLM"; }
  void configure(const budgets& b, std::size_t n, std::size_t) override {
    budget_ = clamp_unique(b.shared, kSinks + 1, n);
  }
  std::size_t configs() const override { return budget_.size(); }
  std::string config(std::size_t i) const override {
    return "sinks=" + std::to_string(kSinks) + ",recent=" + std::to_string(budget_[i] - kSinks);
  }

  void run(const head_input& h, const call_input& c, scratch& ws, std::span<double> out,
           std::span<config_result> res) const override {
    accum& acc = ws.acc;
    acc.reset(h.d);
    for (std::size_t t = 0; t < kSinks && t < h.n; ++t) acc.add(h.value(t), c.w[t]);
    std::size_t recent = 0;  // newest tokens added so far
    for (std::size_t j = 0; j < budget_.size(); ++j) {
      const std::size_t want = std::min(budget_[j], h.n) - kSinks;
      for (; recent < want; ++recent) {
        const std::size_t t = h.n - 1 - recent;
        acc.add(h.value(t), c.w[t]);
      }
      acc.write(out.data() + j * h.d);
      const double rows = double(kSinks + recent);
      res[j] = {rows, h.kv_row_bytes(rows) / double(h.group)};
    }
  }

 private:
  static constexpr std::size_t kSinks = 4;
  std::vector<std::size_t> budget_;
};

}  // namespace certattn::bench::baselines
