// KIVI-style quantized dense attention (Liu et al., 2024): keys quantized per channel over
// groups of tokens, values per token over groups of 32 channels, both asymmetric
// (min and step in fp16) with 2, 4 or 8 bits; the newest 128 tokens (and the tokens of an
// unfinished key group) stay in 16 bits. Attention is dense over the dequantized cache.
// It reads every key (quantized), so it is compared at matched bytes only (Table D.2e).
// Bytes per group: codes (bits/8 per element of K and V), the fp16 min and step of every
// key group x channel and value token x channel group, and the 16-bit residual rows.
#pragma once

#include "common.hpp"

#include <Eigen/Core>

#include <cstdio>

namespace certattn::bench::baselines {

class kivi {
 public:
  struct config {
    int bits = 4;
    std::size_t key_group = 128;  // tokens per key quantization group
  };
  static constexpr std::size_t kResidual = 128;
  static constexpr std::size_t kValueGroup = 32;  // channels per value quantization group

  static std::vector<config> grid() {
    std::vector<config> g;
    for (std::size_t kg : {std::size_t(128), std::size_t(32)})
      for (int b : {2, 4, 8}) g.push_back({b, kg});
    return g;
  }
  static std::string family() { return "KIVI (quantized dense)"; }
  static std::string name(const config& c) {
    return std::to_string(c.bits) + "-bit,key-group=" + std::to_string(c.key_group);
  }

  /// Tokens [0, quantized) are quantized, the rest kept in 16 bits.
  static std::size_t quantized_tokens(std::size_t n, const config& c) {
    return n > kResidual ? (n - kResidual) / c.key_group * c.key_group : 0;
  }
  /// Bytes dense attention over this cache reads for one GQA group (all of it, once).
  static double bytes_per_group(std::size_t n, std::size_t d, const config& c) {
    const double Q = double(quantized_tokens(n, c)), D = double(d), b = double(c.bits);
    const double key = Q * D * b / 8.0 + (Q / double(c.key_group)) * D * 4.0;
    const double value = Q * D * b / 8.0 + Q * std::ceil(D / double(kValueGroup)) * 4.0;
    return key + value + (double(n) - Q) * D * 4.0;
  }

  /// Dequantizes one head's cache for one configuration.
  void prepare(const head_input& h, const config& c) {
    const std::size_t n = h.n, d = h.d, Q = quantized_tokens(n, c);
    k_.resize(Eigen::Index(n), Eigen::Index(d));
    v_.resize(Eigen::Index(n), Eigen::Index(d));
    for (std::size_t t = 0; t < n; ++t)
      for (std::size_t i = 0; i < d; ++i) {
        k_(Eigen::Index(t), Eigen::Index(i)) = float(h.key(t)[i]);
        v_(Eigen::Index(t), Eigen::Index(i)) = float(h.value(t)[i]);
      }
    const float levels = float((1 << c.bits) - 1);
    auto quantize = [levels](float* x, std::size_t count, std::size_t stride) {
      float lo = INFINITY, hi = -INFINITY;
      for (std::size_t j = 0; j < count; ++j) lo = std::min(lo, x[j * stride]), hi = std::max(hi, x[j * stride]);
      const float zero = float(half(lo));
      const float step = float(half((hi - lo) / levels));
      for (std::size_t j = 0; j < count; ++j) {
        float& e = x[j * stride];
        const float code = step > 0 ? std::clamp(std::nearbyint((e - zero) / step), 0.0f, levels) : 0.0f;
        e = zero + code * step;
      }
    };
    for (std::size_t g = 0; g < Q; g += c.key_group)
      for (std::size_t i = 0; i < d; ++i) quantize(&k_(Eigen::Index(g), Eigen::Index(i)), c.key_group, d);
    for (std::size_t t = 0; t < Q; ++t)
      for (std::size_t i = 0; i < d; i += kValueGroup)
        quantize(&v_(Eigen::Index(t), Eigen::Index(i)), std::min(kValueGroup, d - i), 1);
  }

  /// Dense attention of `queries` (each [d]) over the dequantized cache; out [m][d].
  void attend(std::span<const float* const> queries, double scale, std::span<double> out) const {
    const Eigen::Index n = k_.rows(), d = k_.cols(), m = Eigen::Index(queries.size());
    Eigen::MatrixXf q(d, m);
    for (Eigen::Index j = 0; j < m; ++j)
      for (Eigen::Index i = 0; i < d; ++i) q(i, j) = queries[std::size_t(j)][i];
    Eigen::MatrixXf s = k_ * q;  // [n][m]
    Eigen::VectorXd den(m);
    for (Eigen::Index j = 0; j < m; ++j) {
      const float mx = s.col(j).maxCoeff();
      double sum = 0;
      for (Eigen::Index t = 0; t < n; ++t) {
        const float e = std::exp(float(scale) * (s(t, j) - mx));
        s(t, j) = e;
        sum += e;
      }
      den(j) = sum;
    }
    const Eigen::MatrixXf o = v_.transpose() * s;  // [d][m]
    for (Eigen::Index j = 0; j < m; ++j)
      for (Eigen::Index i = 0; i < d; ++i) out[std::size_t(j * d + i)] = double(o(i, j)) / den(j);
  }

 private:
  Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> k_, v_;  // [n][d]
};

}  // namespace certattn::bench::baselines
