// RetroInfer-style (Chen et al., 2025, "wave index"): the pool keys are clustered by
// k-means once per KV head; a query ranks the clusters by q . centroid, reads the keys and
// values of the top clusters exactly (retrieval zone), estimates the next clusters from
// their centroid score, size and value sum, each key taken at its centroid's score
// (estimation zone), and drops the rest. Sinks and window are read exactly.
// Clustering: Lloyd's k-means (4 iterations from random keys) on segments of 8192 pool
// tokens, about 16 keys per cluster, as RetroInfer's segmented index build.
// Grid: retrieval budget on the grid x estimation zone {none, next 10% of clusters, all}.
// Bytes: centroids (fp16) once per group; per estimated cluster its value sum (fp16) and
// size; per retrieved key its id (4 bytes) and rows.
#pragma once

#include "common.hpp"

#include <Eigen/Core>

#include <cstdio>
#include <limits>
#include <numeric>

namespace certattn::bench::baselines {

class retroinfer final : public method {
 public:
  static constexpr std::size_t kSinks = 4;
  static constexpr std::size_t kClusterSize = 16;
  static constexpr std::size_t kSegment = 8192;  // clustered independently, as RetroInfer builds its index
  static constexpr int kIterations = 4;

  std::string family() const override { return "RetroInfer (k-means)"; }
  void configure(const budgets& b, std::size_t n, std::size_t) override {
    budget_ = clamp_unique(b.keys, kSinks + 64 + 1, n);
    zones_ = {0.0, 0.1, 1.0};
  }
  std::size_t configs() const override { return budget_.size() * zones_.size(); }
  std::string config(std::size_t i) const override {
    const double z = zones_[i % zones_.size()];
    char buf[80];
    std::snprintf(buf, sizeof buf, "budget=%zu,estimate=%s", budget_[i / zones_.size()],
                  z == 0.0 ? "none" : z == 1.0 ? "rest" : "next10%");
    return buf;
  }

  void prepare(const head_input& h) override {
    const std::size_t d = h.d;
    first_ = std::min(kSinks, h.n);
    last_ = h.n > h.window ? std::max(first_, h.n - h.window) : first_;
    const std::size_t m = last_ - first_;
    const std::size_t segments = std::max<std::size_t>(1, (m + kSegment - 1) / kSegment);
    std::vector<rowmat> seg_cent(segments);
    std::vector<std::vector<std::uint32_t>> seg_assign(segments);
    auto body = [&](std::size_t sg, std::size_t) {
      const std::size_t t0 = sg * kSegment, len = std::min(kSegment, m - t0);
      if (len == 0) return;
      rng r(mix_seed(h.seed, 0x6b6d65616e73ull + sg));
      kmeans(h, first_ + t0, len, r, seg_cent[sg], seg_assign[sg]);
    };
    if (h.pool != nullptr)
      h.pool->parallel_for(segments, body);
    else
      for (std::size_t sg = 0; sg < segments; ++sg) body(sg, 0);
    // Concatenate the segments' clusters: members (CSR), sizes, value sums.
    std::size_t C = 0;
    for (const rowmat& c : seg_cent) C += std::size_t(c.rows());
    centroids_.resize(static_cast<Eigen::Index>(C), static_cast<Eigen::Index>(d));
    std::vector<std::uint32_t> assign(m);
    std::size_t base = 0;
    for (std::size_t sg = 0; sg < segments; ++sg) {
      if (seg_cent[sg].rows() == 0) continue;
      centroids_.middleRows(static_cast<Eigen::Index>(base), seg_cent[sg].rows()) = seg_cent[sg];
      for (std::size_t i = 0; i < seg_assign[sg].size(); ++i)
        assign[sg * kSegment + i] = std::uint32_t(base + seg_assign[sg][i]);
      base += std::size_t(seg_cent[sg].rows());
    }
    start_.assign(C + 1, 0);
    for (std::uint32_t a : assign) ++start_[a + 1];
    for (std::size_t c = 0; c < C; ++c) start_[c + 1] += start_[c];
    members_.assign(m, 0);
    std::vector<std::size_t> cur(start_.begin(), start_.end() - 1);
    for (std::size_t i = 0; i < m; ++i) members_[cur[assign[i]]++] = std::uint32_t(first_ + i);
    value_sum_.assign(C * d, 0.0);
    for (std::size_t i = 0; i < m; ++i) {
      const half* v = h.value(first_ + i);
      double* s = value_sum_.data() + std::size_t(assign[i]) * d;
      for (std::size_t k = 0; k < d; ++k) s[k] += double(float(v[k]));
    }
  }

  void run(const head_input& h, const call_input& c, scratch& ws, std::span<double> out,
           std::span<config_result> res) const override {
    const std::size_t d = h.d, n = h.n, C = std::size_t(centroids_.rows());
    Eigen::Map<const Eigen::VectorXf> q(c.q, Eigen::Index(d));
    const Eigen::VectorXf sc = centroids_ * q;
    std::vector<std::uint32_t>& ord = ws.idx2;
    ord.resize(C);
    std::iota(ord.begin(), ord.end(), 0u);
    std::sort(ord.begin(), ord.end(), [&](std::uint32_t a, std::uint32_t b) { return sc(a) > sc(b); });

    accum& base = ws.acc;
    base.reset(d);
    for (std::size_t t = 0; t < first_; ++t) base.add(h.value(t), c.w[t]);
    for (std::size_t t = last_; t < n; ++t) base.add(h.value(t), c.w[t]);
    const double fixed = double(first_ + (n - last_));
    const double shared = (h.kv_row_bytes(fixed) + double(C) * double(d) * 2.0) / double(h.group);

    std::size_t taken = 0, rows = 0;  // clusters and keys of the retrieval zone so far
    for (std::size_t bi = 0; bi < budget_.size(); ++bi) {
      const double want = double(budget_[bi]) - fixed;
      while (taken < C && (taken == 0 || double(rows) < want)) {
        const std::uint32_t cl = ord[taken++];
        for (std::size_t k = start_[cl]; k < start_[cl + 1]; ++k, ++rows)
          base.add(h.value(members_[k]), c.w[members_[k]]);
      }
      for (std::size_t zi = 0; zi < zones_.size(); ++zi) {
        const std::size_t est_clusters =
            std::min(C - taken, std::size_t(std::ceil(zones_[zi] * double(C))));
        accum& est = ws.acc2;
        est = base;
        for (std::size_t e = taken; e < taken + est_clusters; ++e) {
          const std::uint32_t cl = ord[e];
          const double size = double(start_[cl + 1] - start_[cl]);
          const double wc = std::exp(h.scale * double(sc(cl)) - c.c);
          est.add_sum(std::span<const double>(value_sum_.data() + std::size_t(cl) * d, d), wc, wc * size);
        }
        const std::size_t j = bi * zones_.size() + zi;
        est.write(out.data() + j * d);
        res[j] = {fixed + double(rows),
                  shared + h.kv_row_bytes(double(rows)) + 4.0 * double(rows) +
                      double(est_clusters) * (double(d) * 2.0 + 4.0)};
      }
    }
  }

 private:
  using rowmat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

  /// Lloyd's k-means on the keys of tokens [t0, t0 + len), ~kClusterSize keys per cluster.
  static void kmeans(const head_input& h, std::size_t t0, std::size_t len, rng& r, rowmat& cent,
                     std::vector<std::uint32_t>& assign) {
    const std::size_t d = h.d, C = std::max<std::size_t>(1, (len + kClusterSize - 1) / kClusterSize);
    rowmat x(static_cast<Eigen::Index>(len), static_cast<Eigen::Index>(d));
    for (std::size_t i = 0; i < len; ++i)
      for (std::size_t k = 0; k < d; ++k)
        x(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(k)) = float(h.key(t0 + i)[k]);
    cent.resize(static_cast<Eigen::Index>(C), static_cast<Eigen::Index>(d));
    for (std::size_t c = 0; c < C; ++c)
      cent.row(static_cast<Eigen::Index>(c)) = x.row(static_cast<Eigen::Index>(r.next() % len));
    assign.assign(len, 0);
    for (int it = 0; it <= kIterations; ++it) {
      const Eigen::VectorXf cn = cent.rowwise().squaredNorm();
      const Eigen::MatrixXf dots = x * cent.transpose();  // [len][C]
      for (std::size_t i = 0; i < len; ++i) {
        float best = std::numeric_limits<float>::infinity();
        std::uint32_t arg = 0;
        for (std::size_t c = 0; c < C; ++c) {
          const float dist = cn(static_cast<Eigen::Index>(c)) -
                             2.0f * dots(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(c));
          if (dist < best) best = dist, arg = std::uint32_t(c);
        }
        assign[i] = arg;
      }
      if (it == kIterations) break;  // the last pass only assigns
      Eigen::MatrixXd sum = Eigen::MatrixXd::Zero(static_cast<Eigen::Index>(C), static_cast<Eigen::Index>(d));
      std::vector<std::size_t> size(C, 0);
      for (std::size_t i = 0; i < len; ++i) {
        sum.row(assign[i]) += x.row(static_cast<Eigen::Index>(i)).cast<double>();
        ++size[assign[i]];
      }
      for (std::size_t c = 0; c < C; ++c) {
        if (size[c] > 0)
          cent.row(static_cast<Eigen::Index>(c)) = (sum.row(static_cast<Eigen::Index>(c)) / double(size[c])).cast<float>();
        else  // an empty cluster restarts at a random key
          cent.row(static_cast<Eigen::Index>(c)) = x.row(static_cast<Eigen::Index>(r.next() % len));
      }
    }
  }

  std::vector<std::size_t> budget_;
  std::vector<double> zones_;
  rowmat centroids_;                    // [C][d]
  std::vector<std::size_t> start_;      // [C + 1]
  std::vector<std::uint32_t> members_;  // tokens by cluster
  std::vector<double> value_sum_;       // [C][d]
  std::size_t first_ = 0, last_ = 0;
};

}  // namespace certattn::bench::baselines
