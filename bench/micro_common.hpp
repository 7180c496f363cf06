// Shared fixtures of the certattn-micro benchmarks: a synthetic cache (mixed regime) with
// the key index of every head, built once per shape and kept for the whole run.
#pragma once

#include <certattn/certattn.hpp>
#include <certattn/testing/synthetic.hpp>

#include <map>
#include <memory>
#include <utility>
#include <vector>

namespace certattn::micro {

struct layer_fixture {
  synthetic::kv_cache cache;   // [heads][n][128] fp16, head-major
  std::vector<key_index> idx;  // one per head
  strided_kv<half> view(std::size_t h) const {
    const auto& c = cache.config;
    return hnd_view(cache.keys.data(), cache.values.data(), c.n_tokens, c.n_tokens, c.kv_heads,
                    c.head_dim, h);
  }
};

inline const layer_fixture& layer(std::size_t n, std::size_t heads) {
  static std::map<std::pair<std::size_t, std::size_t>, std::unique_ptr<layer_fixture>> made;
  auto& slot = made[{n, heads}];
  if (!slot) {
    slot = std::make_unique<layer_fixture>();
    synthetic::cache_config cfg;
    cfg.n_tokens = n;
    cfg.kv_heads = heads;
    cfg.kind = synthetic::regime::kMixed;
    slot->cache = synthetic::make_cache(cfg);
    for (std::size_t h = 0; h < heads; ++h) {
      key_index x(cfg.head_dim);
      x.build(slot->view(h));
      slot->idx.push_back(std::move(x));
    }
  }
  return *slot;
}

/// Heads to cycle over so that `bytes_per_head` x heads >= 64 MiB, twice the 32 MiB L3 of
/// the machines we measure on: each call then reads its head from memory, as in a decode
/// step where the other heads and layers have evicted it.
inline std::size_t cold_heads(std::size_t bytes_per_head) {
  const std::size_t target = std::size_t(64) << 20;
  return bytes_per_head >= target ? 1 : (target + bytes_per_head - 1) / bytes_per_head;
}

}  // namespace certattn::micro
