// MagicPIG-style LSH sampling (Chen et al., 2025): SimHash with K random hyperplanes per
// table and L tables, fixed per layer; a pool key is sampled when its code equals the
// query's in at least two tables. Its retrieval probability follows from the angle
// theta between q and k: per table p = (1 - theta/pi)^K, overall
// P = P(Binomial(L, p) >= 2). Sampled keys are read exactly (score and angle) and enter
// a self-normalised importance-sampling estimate with weights w_i / P_i; the 4 sinks and
// the window are read exactly.
// Hyperplanes are nested: K-bit codes are prefixes of the 14-bit code of a table, and
// L tables the first L, so the grid K x L costs one hashing pass.
// Bytes: the posting lists read, 4 bytes per (table, colliding key) (a lower bound:
// hash tables and projections are not counted), plus the sampled rows.
#pragma once

#include "common.hpp"

#include <Eigen/Core>

#include <cstdio>

namespace certattn::bench::baselines {

class magicpig final : public method {
 public:
  static constexpr std::size_t kMaxBits = 14;
  static constexpr std::size_t kSinks = 4;

  std::string family() const override { return "MagicPIG (LSH)"; }
  void configure(const budgets&, std::size_t, std::size_t) override {
    bits_ = {8, 10, 12, 14};
    tables_ = {10, 20, 50, 100, 200};
  }
  std::size_t configs() const override { return bits_.size() * tables_.size(); }
  std::string config(std::size_t i) const override {
    return "K=" + std::to_string(bits_[i / tables_.size()]) + ",L=" + std::to_string(tables_[i % tables_.size()]);
  }

  void prepare(const head_input& h) override {
    const std::size_t d = h.d, L = tables_.back(), P = kMaxBits * L;
    rng r(mix_seed(h.seed, 0x6d706967ull));
    planes_.resize(Eigen::Index(d), Eigen::Index(P));
    for (Eigen::Index j = 0; j < planes_.cols(); ++j)
      for (Eigen::Index i = 0; i < planes_.rows(); ++i) planes_(i, j) = float(r.normal());
    first_ = std::min(kSinks, h.n);
    last_ = h.n > h.window ? std::max(first_, h.n - h.window) : first_;
    const std::size_t m = last_ - first_;
    codes_.assign(L * m, 0);
    constexpr std::size_t kChunk = 1024;
    const std::size_t chunks = (m + kChunk - 1) / kChunk;
    auto body = [&](std::size_t ch, std::size_t) {
      const std::size_t t0 = ch * kChunk, rows = std::min(kChunk, m - t0);
      Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> x(static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(d));
      for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t k = 0; k < d; ++k) x(Eigen::Index(i), Eigen::Index(k)) = float(h.key(first_ + t0 + i)[k]);
      const Eigen::MatrixXf y = x * planes_;
      for (std::size_t l = 0; l < L; ++l)
        for (std::size_t i = 0; i < rows; ++i) {
          std::uint16_t code = 0;
          for (std::size_t b = 0; b < kMaxBits; ++b)
            code |= std::uint16_t((y(Eigen::Index(i), Eigen::Index(l * kMaxBits + b)) > 0.0f ? 1u : 0u) << b);
          codes_[l * m + t0 + i] = code;
        }
    };
    if (h.pool != nullptr)
      h.pool->parallel_for(chunks, body);
    else
      for (std::size_t ch = 0; ch < chunks; ++ch) body(ch, 0);
  }

  void run(const head_input& h, const call_input& c, scratch& ws, std::span<double> out,
           std::span<config_result> res) const override {
    const std::size_t d = h.d, n = h.n, L = tables_.back(), m = last_ - first_;
    // The query's codes.
    Eigen::Map<const Eigen::VectorXf> q(c.q, Eigen::Index(d));
    const Eigen::VectorXf y = planes_.transpose() * q;
    std::vector<std::uint16_t> qcode(L);
    for (std::size_t l = 0; l < L; ++l) {
      std::uint16_t code = 0;
      for (std::size_t b = 0; b < kMaxBits; ++b)
        code |= std::uint16_t((y(Eigen::Index(l * kMaxBits + b)) > 0.0f ? 1u : 0u) << b);
      qcode[l] = code;
    }
    // Exact part: sinks and window, shared by the group.
    accum& exact = ws.acc;
    exact.reset(d);
    for (std::size_t t = 0; t < first_; ++t) exact.add(h.value(t), c.w[t]);
    for (std::size_t t = last_; t < n; ++t) exact.add(h.value(t), c.w[t]);
    const double fixed = double(first_ + (n - last_));
    const double shared = h.kv_row_bytes(fixed) / double(h.group);

    std::vector<std::uint16_t>& cnt = ws.cnt;
    for (std::size_t bi = 0; bi < bits_.size(); ++bi) {
      const std::size_t K = bits_[bi];
      const std::uint16_t mask = std::uint16_t((1u << K) - 1u);
      cnt.assign(m, 0);
      std::size_t l = 0;
      double postings = 0;
      for (std::size_t li = 0; li < tables_.size(); ++li) {
        for (; l < tables_[li]; ++l) {
          const std::uint16_t* code = codes_.data() + l * m;
          const std::uint16_t qc = qcode[l] & mask;
          std::uint16_t* ct = cnt.data();
          for (std::size_t i = 0; i < m; ++i) ct[i] = std::uint16_t(ct[i] + ((code[i] & mask) == qc ? 1 : 0));
        }
        const std::size_t Lc = tables_[li];
        accum& est = ws.acc2;
        est = exact;
        std::size_t sampled = 0;
        postings = 0;
        for (std::size_t i = 0; i < m; ++i) {
          postings += cnt[i];
          if (cnt[i] < 2) continue;
          const std::size_t t = first_ + i;
          ++sampled;
          const double denom = c.q_norm * h.key_norm[t];
          const double cosv = denom > 0 ? std::clamp(c.s[t] / h.scale / denom, -1.0, 1.0) : 0.0;
          const double p = std::pow(1.0 - std::acos(cosv) / 3.141592653589793, double(K));
          est.add(h.value(t), c.w[t] / retrieval_probability(p, Lc));
        }
        const std::size_t j = bi * tables_.size() + li;
        est.write(out.data() + j * d);
        res[j] = {fixed + double(sampled), shared + h.kv_row_bytes(double(sampled)) + 4.0 * postings};
      }
    }
  }

  /// P(Binomial(L, p) >= 2), accurate also when it is tiny.
  static double retrieval_probability(double p, std::size_t L) noexcept {
    if (p <= 0) return 0.0;
    if (p >= 1) return 1.0;
    const double Ld = double(L);
    const double qL1 = std::exp((Ld - 1.0) * std::log1p(-p));  // (1-p)^(L-1)
    const double direct = 1.0 - qL1 * (1.0 - p) - Ld * p * qL1;
    if (direct > 1e-6) return direct;
    // Series sum_{j>=2} C(L, j) p^j (1-p)^(L-j).
    double term = 0.5 * Ld * (Ld - 1.0) * p * p * std::exp((Ld - 2.0) * std::log1p(-p));
    double sum = 0.0;
    for (std::size_t j = 2; j <= L && term > 1e-18 * sum; ++j) {
      sum += term;
      term *= (Ld - double(j)) / double(j + 1) * p / (1.0 - p);
    }
    return sum;
  }

 private:
  std::vector<std::size_t> bits_, tables_;
  Eigen::MatrixXf planes_;                 // [d][kMaxBits * L]
  std::vector<std::uint16_t> codes_;       // [L][pool tokens]
  std::size_t first_ = 0, last_ = 0;       // hashed tokens [first_, last_)
};

}  // namespace certattn::bench::baselines
