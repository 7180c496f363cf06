// Quest (Tang et al., 2024): per page of 16 tokens, the channel-wise minimum and maximum of
// the keys; a query bounds each page's best score by sum_ch max(q_ch min_ch, q_ch max_ch)
// and attends exactly to the tokens of the pages with the largest bounds.
// Grid: pages = ceil(budget / 16), budget on the setting's grid.
// Bytes: the page bounds (2 fp16 rows per page) are read once per group; the selected
// pages' key and value rows per query head.
#pragma once

#include "common.hpp"

#include <numeric>

namespace certattn::bench::baselines {

class quest final : public method {
 public:
  static constexpr std::size_t kPage = 16;

  std::string family() const override { return "Quest"; }
  void configure(const budgets& b, std::size_t n, std::size_t) override {
    const std::size_t pages = (n + kPage - 1) / kPage;
    pages_.clear();
    for (std::size_t k : b.keys) pages_.push_back((k + kPage - 1) / kPage);
    pages_ = clamp_unique(pages_, 1, pages);
  }
  std::size_t configs() const override { return pages_.size(); }
  std::string config(std::size_t i) const override {
    return "page=16,pages=" + std::to_string(pages_[i]);
  }

  void prepare(const head_input& h) override {
    const std::size_t pages = (h.n + kPage - 1) / kPage, d = h.d;
    lo_.assign(pages * d, 0.0f);
    hi_.assign(pages * d, 0.0f);
    for (std::size_t p = 0; p < pages; ++p) {
      float* lo = lo_.data() + p * d;
      float* hi = hi_.data() + p * d;
      std::fill(lo, lo + d, INFINITY);
      std::fill(hi, hi + d, -INFINITY);
      for (std::size_t t = p * kPage; t < std::min(h.n, (p + 1) * kPage); ++t) {
        const half* k = h.key(t);
        for (std::size_t i = 0; i < d; ++i) {
          lo[i] = std::min(lo[i], float(k[i]));
          hi[i] = std::max(hi[i], float(k[i]));
        }
      }
    }
  }

  void run(const head_input& h, const call_input& c, scratch& ws, std::span<double> out,
           std::span<config_result> res) const override {
    const std::size_t pages = (h.n + kPage - 1) / kPage, d = h.d;
    std::vector<double>& bound = ws.a;
    bound.resize(pages);
    for (std::size_t p = 0; p < pages; ++p) {
      const float* lo = lo_.data() + p * d;
      const float* hi = hi_.data() + p * d;
      double u = 0.0;
      for (std::size_t i = 0; i < d; ++i) {
        const double q = c.q[i];
        u += std::max(q * lo[i], q * hi[i]);
      }
      bound[p] = u;
    }
    std::vector<std::uint32_t>& ord = ws.idx2;
    ord.resize(pages);
    std::iota(ord.begin(), ord.end(), 0u);
    const std::size_t most = std::min(pages, pages_.back());
    std::partial_sort(ord.begin(), ord.begin() + std::ptrdiff_t(most), ord.end(),
                      [&](std::uint32_t a, std::uint32_t b) { return bound[a] > bound[b]; });
    accum& acc = ws.acc;
    acc.reset(d);
    std::size_t taken = 0, rows = 0;
    const double meta = double(pages) * 2.0 * double(d) * 2.0 / double(h.group);
    for (std::size_t j = 0; j < pages_.size(); ++j) {
      for (; taken < pages_[j]; ++taken) {
        const std::size_t p = ord[taken];
        for (std::size_t t = p * kPage; t < std::min(h.n, (p + 1) * kPage); ++t, ++rows)
          acc.add(h.value(t), c.w[t]);
      }
      acc.write(out.data() + j * d);
      res[j] = {double(rows), h.kv_row_bytes(double(rows)) + meta};
    }
  }

 private:
  std::vector<std::size_t> pages_;
  std::vector<float> lo_, hi_;  // [pages][d]
};

}  // namespace certattn::bench::baselines
