// A small decoder for llama2.c checkpoints (float32, the legacy "version 0" format of
// run.c), with its KV cache in fp16 and the attention of each layer left to the caller:
// forward() writes the token's keys and values into the cache and hands the queries to an
// attention function, so the same model runs with dense attention or with certattn.
#pragma once

#include <certattn/common.hpp>
#include <certattn/layout.hpp>
#include <certattn/memory.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace llama2c {

using certattn::half;

/// The 7-int32 header of a checkpoint.
struct config {
  int dim = 0;         // transformer width
  int hidden_dim = 0;  // FFN width
  int n_layers = 0;
  int n_heads = 0;     // query heads
  int n_kv_heads = 0;  // key/value heads (GQA when < n_heads)
  int vocab_size = 0;  // negative in the file: the classifier is not shared
  int seq_len = 0;     // context length
  bool shared_classifier = true;

  int head_size() const noexcept { return dim / n_heads; }
  int kv_dim() const noexcept { return n_kv_heads * head_size(); }
  int group() const noexcept { return n_heads / n_kv_heads; }  // query heads per KV head
};

/// The weights, in llama2.c order, views into one buffer.
struct weights {
  std::vector<float> buffer;
  const float* token_embedding = nullptr;  // [vocab][dim]
  const float* rms_att = nullptr;          // [layer][dim]
  const float* wq = nullptr;               // [layer][n_heads * head_size][dim]
  const float* wk = nullptr;               // [layer][kv_dim][dim]
  const float* wv = nullptr;               // [layer][kv_dim][dim]
  const float* wo = nullptr;               // [layer][dim][n_heads * head_size]
  const float* rms_ffn = nullptr;          // [layer][dim]
  const float* w1 = nullptr;               // [layer][hidden][dim]
  const float* w2 = nullptr;               // [layer][dim][hidden]
  const float* w3 = nullptr;               // [layer][hidden][dim]
  const float* rms_final = nullptr;        // [dim]
  const float* wcls = nullptr;             // [vocab][dim]
};

struct model {
  config cfg;
  weights w;
};

/// Reads a checkpoint. Throws std::runtime_error when the file is short, the header is
/// implausible or the size does not match the header.
inline model load_model(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw std::runtime_error("cannot open model " + path);
  const std::streamoff bytes = f.tellg();
  f.seekg(0);
  std::int32_t h[7];
  if (bytes < 28 || !f.read(reinterpret_cast<char*>(h), sizeof h))
    throw std::runtime_error(path + ": too short for a llama2.c header");
  model m;
  config& c = m.cfg;
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.n_layers = h[2];
  c.n_heads = h[3];
  c.n_kv_heads = h[4];
  c.shared_classifier = h[5] > 0;
  c.vocab_size = h[5] < 0 ? -h[5] : h[5];
  c.seq_len = h[6];
  auto plausible = [](int x) { return x > 0 && x <= (1 << 20); };
  if (!plausible(c.dim) || !plausible(c.hidden_dim) || !plausible(c.n_layers) ||
      !plausible(c.n_heads) || !plausible(c.n_kv_heads) || !plausible(c.vocab_size) ||
      !plausible(c.seq_len) || c.dim % c.n_heads != 0 || c.n_heads % c.n_kv_heads != 0 ||
      c.head_size() % 2 != 0)
    throw std::runtime_error(path + ": implausible header (not a float32 llama2.c checkpoint?)");

  const std::size_t dim = std::size_t(c.dim), hid = std::size_t(c.hidden_dim),
                    L = std::size_t(c.n_layers), V = std::size_t(c.vocab_size),
                    kv = std::size_t(c.kv_dim()), hs = std::size_t(c.head_size()),
                    T = std::size_t(c.seq_len);
  const std::size_t count = V * dim + L * dim + L * dim * dim + 2 * L * dim * kv + L * dim * dim +
                            L * dim + 3 * L * dim * hid + dim +
                            T * hs /* freq_cis_real + freq_cis_imag, unused */ +
                            (c.shared_classifier ? 0 : V * dim);
  if (std::size_t(bytes) != 28 + count * sizeof(float))
    throw std::runtime_error(path + ": " + std::to_string(bytes) + " bytes, but its header " +
                             "implies " + std::to_string(28 + count * sizeof(float)));
  m.w.buffer.resize(count);
  if (!f.read(reinterpret_cast<char*>(m.w.buffer.data()), std::streamsize(count * sizeof(float))))
    throw std::runtime_error(path + ": read failed");

  const float* p = m.w.buffer.data();
  auto take = [&p](std::size_t n) {
    const float* q = p;
    p += n;
    return q;
  };
  weights& w = m.w;
  w.token_embedding = take(V * dim);
  w.rms_att = take(L * dim);
  w.wq = take(L * dim * dim);
  w.wk = take(L * dim * kv);
  w.wv = take(L * dim * kv);
  w.wo = take(L * dim * dim);
  w.rms_ffn = take(L * dim);
  w.w1 = take(L * dim * hid);
  w.w2 = take(L * hid * dim);
  w.w3 = take(L * dim * hid);
  w.rms_final = take(dim);
  take(T * hs);  // freq_cis_real, freq_cis_imag: RoPE is computed instead
  w.wcls = c.shared_classifier ? w.token_embedding : take(V * dim);
  return m;
}

/// Activations and the KV cache of one sequence, its elements of type Cache: fp16 by
/// default, or a quantized format (certattn/formats.hpp: fp8 codes with a scale of 1, vLLM's
/// default when none is calibrated; ggml's 32-channel blocks). The cache of layer l is
/// token-major, [seq_len][n_kv_heads][row_channels] (llama.cpp's layout), so
/// certattn::nhd_view describes one KV head of it. A head's row is its head_size channels,
/// padded with zeros to whole blocks where the format has blocks wider than the head
/// (stories260K's heads have 8 channels, ggml's blocks 32): a zero channel adds nothing to a
/// score (the queries are padded likewise) and a zero value channel nothing to the output,
/// and a block's scale is set by its largest channel, so the stored keys and values are the
/// ones an unpadded row would hold. The softmax scale stays 1 / sqrt(head_size).
template <certattn::kv_element Cache = half>
struct state {
  using units = certattn::format_traits<Cache>;
  std::vector<float> x, xb, xb2, hb, hb2, q, k, v, att, logits;
  certattn::large_vector<Cache> key_cache, value_cache;  // [layer][seq_len][kv units], huge pages
  std::size_t kv_heads = 0, head_size = 0;
  std::size_t row_channels = 0;  // a head's row: head_size rounded up to whole units of Cache
  std::size_t token_units = 0;   // units of Cache per token row (kv_heads * row_channels)
  std::size_t layer_stride = 0;  // seq_len * token_units
  std::vector<float> row_buffer;  // [row_channels]: one head's row before quantisation

  explicit state(const config& c)
      : x(std::size_t(c.dim)),
        xb(std::size_t(c.dim)),
        xb2(std::size_t(c.dim)),
        hb(std::size_t(c.hidden_dim)),
        hb2(std::size_t(c.hidden_dim)),
        q(std::size_t(c.dim)),
        k(std::size_t(c.kv_dim())),
        v(std::size_t(c.kv_dim())),
        att(std::size_t(c.dim)),
        logits(std::size_t(c.vocab_size)),
        kv_heads(std::size_t(c.n_kv_heads)),
        head_size(std::size_t(c.head_size())),
        row_channels((head_size + units::channels - 1) / units::channels * units::channels),
        token_units(kv_heads * units::units(row_channels)),
        layer_stride(std::size_t(c.seq_len) * token_units),
        row_buffer(row_channels, 0.0f) {
    key_cache.resize(std::size_t(c.n_layers) * layer_stride);
    value_cache.resize(key_cache.size());
  }

  /// Whether a head's row carries zero channels after its head_size ones.
  bool padded() const { return row_channels != head_size; }
  /// The softmax scale of every call over the cache: 1 / sqrt(head_size), or 0 (the calls'
  /// default, 1 / sqrt(head_dim)) where rows are not padded.
  double softmax_scale() const { return padded() ? 1.0 / std::sqrt(double(head_size)) : 0.0; }
  /// Query heads [h0, h0 + count) of q (head_size floats each) as rows of row_channels,
  /// zeros after head_size, into out (which it resizes).
  void pad_queries(std::span<const float> q, std::size_t h0, std::size_t count,
                   std::vector<float>& out) const {
    out.assign(count * row_channels, 0.0f);
    for (std::size_t g = 0; g < count; ++g)
      std::copy_n(q.data() + (h0 + g) * head_size, head_size, out.data() + g * row_channels);
  }

  const Cache* keys(int layer) const { return key_cache.data() + std::size_t(layer) * layer_stride; }
  const Cache* values(int layer) const {
    return value_cache.data() + std::size_t(layer) * layer_stride;
  }
  /// KV head h of layer l over its first n tokens.
  auto view(int layer, std::size_t n, std::size_t h) const {
    const auto kv = certattn::nhd_view(keys(layer), values(layer), n, kv_heads, row_channels, h);
    if constexpr (certattn::fp8_element<Cache>)
      return kv.with_scales({1.0f, 1.0f});
    else
      return kv;
  }
  /// Writes token pos's keys and values (kv_heads * head_size floats each) to layer l.
  void store(int layer, std::size_t pos, const float* key, const float* value) {
    Cache* kd = key_cache.data() + std::size_t(layer) * layer_stride + pos * token_units;
    Cache* vd = value_cache.data() + std::size_t(layer) * layer_stride + pos * token_units;
    if constexpr (certattn::storage_element<Cache>) {
      for (std::size_t i = 0; i < kv_heads * head_size; ++i) {
        kd[i] = Cache(key[i]);
        vd[i] = Cache(value[i]);
      }
    } else {
      const std::size_t u = units::units(row_channels);
      // One head's channels, then zeros to the row's end (row_buffer's tail stays zero).
      auto row = [this](const float* x) {
        std::copy_n(x, head_size, row_buffer.data());
        return row_buffer.data();
      };
      for (std::size_t h = 0; h < kv_heads; ++h) {
        if constexpr (certattn::fp8_element<Cache>) {
          certattn::quantize_row(row(key + h * head_size), row_channels, 1.0f, kd + h * u);
          certattn::quantize_row(row(value + h * head_size), row_channels, 1.0f, vd + h * u);
        } else {
          certattn::quantize_row(row(key + h * head_size), row_channels, kd + h * u);
          certattn::quantize_row(row(value + h * head_size), row_channels, vd + h * u);
        }
      }
    }
  }
};

namespace detail {
/// out[i] = sum_j w[i][j] x[j], w [d][n] row-major (run.c's matmul).
inline void matmul(float* out, const float* x, const float* w, std::size_t n, std::size_t d) {
  for (std::size_t i = 0; i < d; ++i) {
    float s = 0.0f;
    const float* row = w + i * n;
    for (std::size_t j = 0; j < n; ++j) s += row[j] * x[j];
    out[i] = s;
  }
}
inline void rmsnorm(float* out, const float* x, const float* weight, std::size_t n) {
  float ss = 0.0f;
  for (std::size_t j = 0; j < n; ++j) ss += x[j] * x[j];
  ss = 1.0f / std::sqrt(ss / float(n) + 1e-5f);
  for (std::size_t j = 0; j < n; ++j) out[j] = weight[j] * (ss * x[j]);
}
}  // namespace detail

/// One token at position pos: embeds it, and per layer computes q, k, v (RoPE as run.c
/// applies it: adjacent channel pairs, base 10000), stores k and v in the fp16 cache at
/// pos, calls attention(layer, n_tokens = pos + 1, q [n_heads][head_size],
/// out [n_heads][head_size]), then the output projection and the SwiGLU FFN. Returns the
/// logits.
template <class Cache, class Attention>
const std::vector<float>& forward(const model& m, state<Cache>& s, int token, int pos,
                                  Attention&& attention) {
  const config& c = m.cfg;
  const weights& w = m.w;
  const std::size_t dim = std::size_t(c.dim), hid = std::size_t(c.hidden_dim),
                    kv_dim = std::size_t(c.kv_dim()), hs = std::size_t(c.head_size());
  const float* emb = w.token_embedding + std::size_t(token) * dim;
  for (std::size_t i = 0; i < dim; ++i) s.x[i] = emb[i];

  for (int l = 0; l < c.n_layers; ++l) {
    const std::size_t lu = std::size_t(l);
    detail::rmsnorm(s.xb.data(), s.x.data(), w.rms_att + lu * dim, dim);
    detail::matmul(s.q.data(), s.xb.data(), w.wq + lu * dim * dim, dim, dim);
    detail::matmul(s.k.data(), s.xb.data(), w.wk + lu * dim * kv_dim, dim, kv_dim);
    detail::matmul(s.v.data(), s.xb.data(), w.wv + lu * dim * kv_dim, dim, kv_dim);
    for (std::size_t i = 0; i < dim; i += 2) {
      const float freq = 1.0f / std::pow(10000.0f, float(i % hs) / float(hs));
      const float angle = float(pos) * freq;
      const float cr = std::cos(angle), ci = std::sin(angle);
      auto rotate = [&](float* vec) {
        const float v0 = vec[i], v1 = vec[i + 1];
        vec[i] = v0 * cr - v1 * ci;
        vec[i + 1] = v0 * ci + v1 * cr;
      };
      rotate(s.q.data());
      if (i < kv_dim) rotate(s.k.data());
    }
    // The engine's cache (fp16, or quantized): keys and values are rounded once, when written.
    s.store(l, std::size_t(pos), s.k.data(), s.v.data());

    attention(l, std::size_t(pos) + 1, std::span<const float>(s.q), std::span<float>(s.att));

    detail::matmul(s.xb2.data(), s.att.data(), w.wo + lu * dim * dim, dim, dim);
    for (std::size_t i = 0; i < dim; ++i) s.x[i] += s.xb2[i];
    detail::rmsnorm(s.xb.data(), s.x.data(), w.rms_ffn + lu * dim, dim);
    detail::matmul(s.hb.data(), s.xb.data(), w.w1 + lu * dim * hid, dim, hid);
    detail::matmul(s.hb2.data(), s.xb.data(), w.w3 + lu * dim * hid, dim, hid);
    for (std::size_t i = 0; i < hid; ++i) {
      const float a = s.hb[i];
      s.hb[i] = a / (1.0f + std::exp(-a)) * s.hb2[i];  // SiLU(w1 x) * (w3 x)
    }
    detail::matmul(s.xb.data(), s.hb.data(), w.w2 + lu * hid * dim, hid, dim);
    for (std::size_t i = 0; i < dim; ++i) s.x[i] += s.xb[i];
  }
  detail::rmsnorm(s.x.data(), s.x.data(), w.rms_final, dim);
  detail::matmul(s.logits.data(), s.x.data(), w.wcls, dim, std::size_t(c.vocab_size));
  return s.logits;
}

}  // namespace llama2c
