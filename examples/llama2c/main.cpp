// A llama2.c model whose decode-step attention runs through certattn, compared step by
// step with the same model on dense attention.
//
// Two copies of the model run in lockstep on the same tokens (teacher forcing on the
// certattn run's greedy tokens):
//   certattn run  prefill with exact attention; then one key_index per (layer, KV head)
//                 is built, and each decode step appends the new token to it and calls
//                 attend_group per (layer, KV head) with noise_key{step, layer, kv_head};
//   dense run     exact attention (double precision) at every position.
// Both keep their KV cache in fp16 (or both in the format --kv-cache names), so the
// comparison isolates certattn's sampling error (with a coarse fp8 cache, also the
// rounding of the two runs' slightly different keys: examples/llama2c/README.md).
// At every step the certattn run's argmax is the next token of both runs; the dense
// run's next-token distribution is compared with the certattn run's: greedy-token
// agreement (same argmax) and KL(p_dense || p_certattn).
//
// The model (stories260K), its tokenizer and the prompt text ship in examples/llama2c/data;
// they are the defaults of --model, --tokenizer and --prompt-file.
//
// Exit codes: 0 done, 1 error (a missing file among them, named).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <certattn/certattn.hpp>
#include <certattn/dense.hpp>
#include <certattn/exact.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "model.hpp"
#include "tokenizer.hpp"

namespace {

#ifndef CERTATTN_LLAMA2C_DATA_DIR
#define CERTATTN_LLAMA2C_DATA_DIR "examples/llama2c/data"
#endif
constexpr const char* kDataDir = CERTATTN_LLAMA2C_DATA_DIR;

using certattn::half;
using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

struct settings {
  std::string model_path = std::string(kDataDir) + "/stories260K.bin";
  std::string tokenizer_path = std::string(kDataDir) + "/tok512.bin";
  std::string prompt_path = std::string(kDataDir) + "/pride-and-prejudice.txt";
  std::string json_path;
  std::size_t prompt_offset = 51;  // "It is a truth universally acknowledged, ..."
  std::size_t prompt_tokens = 400;
  std::size_t steps = 24;
  double epsilon = 0.1;
  std::string error_scale = "value_scale";  // or output_norm
  double delta_total = 0.05;                // for the whole generation, split over heads x steps
  double delta = 0.0;                       // per call; 0 = delta_total / (layers * heads * steps)
  std::size_t window = 64;
  std::size_t min_pool = 0;  // certattn only once the pool (cache - window) has this many
  std::string routing = "off";  // options.route: this model's contexts (<= 512 tokens) lie far
                                // below the break-even, where auto answers nearly all exactly
  std::uint64_t seed = 1;
  std::string kv_cache = "f16";  // the element format of both runs' caches
  bool strict = false;
  bool quiet = false;
};

/// A passage of the prompt file: from `offset`, moved forward to the start of a word,
/// whitespace runs (newlines, form feeds) collapsed to one space.
std::string read_passage(const std::string& path, std::size_t offset, std::size_t max_bytes) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw std::runtime_error("cannot open prompt file " + path);
  const std::size_t size = std::size_t(f.tellg());
  if (offset >= size)
    throw std::runtime_error("--prompt-offset " + std::to_string(offset) + " is past the end of " +
                             path + " (" + std::to_string(size) + " bytes)");
  std::string raw(std::min(max_bytes, size - offset), '\0');
  f.seekg(std::streamoff(offset));
  f.read(raw.data(), std::streamsize(raw.size()));
  auto space = [](char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == '\f'; };
  std::size_t i = 0;
  if (offset > 0)  // skip the word (or UTF-8 sequence) the offset may have cut
    while (i < raw.size() && !space(raw[i])) ++i;
  std::string text;
  for (; i < raw.size(); ++i) {
    if (space(raw[i])) {
      if (!text.empty() && text.back() != ' ') text.push_back(' ');
    } else {
      text.push_back(raw[i]);
    }
  }
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text;
}

/// log-softmax in double.
std::vector<double> log_softmax(const std::vector<float>& logits) {
  double mx = -std::numeric_limits<double>::infinity();
  for (float x : logits) mx = std::max(mx, double(x));
  double sum = 0.0;
  for (float x : logits) sum += std::exp(double(x) - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> out(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) out[i] = double(logits[i]) - lse;
  return out;
}

int argmax(const std::vector<float>& v) {
  return int(std::max_element(v.begin(), v.end()) - v.begin());
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(char(c));
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(c));
      out += buf;
    } else {
      out.push_back(char(c));
    }
  }
  return out;
}

/// Exact attention over the first n tokens of one layer's cache (decoded, if quantized),
/// all heads, in double.
template <class Cache>
void exact_layer(const llama2c::config& c, const llama2c::state<Cache>& s, int layer,
                 std::size_t n, std::span<const float> q, std::span<float> out) {
  const std::size_t hs = std::size_t(c.head_size()), G = std::size_t(c.group());
  const std::size_t rc = s.row_channels;
  std::vector<float> qp;  // the group's queries as rows of the cache's width
  for (std::size_t h = 0; h < std::size_t(c.n_kv_heads); ++h) {
    const auto kv = s.view(layer, n, h);
    const certattn::dense_rows<std::remove_cv_t<decltype(kv)>> rows(kv);
    s.pad_queries(q, h * G, G, qp);
    for (std::size_t g = 0; g < G; ++g) {
      const std::size_t qh = h * G + g;  // query heads h*G .. h*G+G-1 share KV head h
      const auto r = certattn::exact_attention(std::span<const float>(qp).subspan(g * rc, rc),
                                               rows.key_matrix(), rows.value_matrix(),
                                               s.softmax_scale());
      for (std::size_t i = 0; i < hs; ++i) out[qh * hs + i] = float(r.output[i]);
    }
  }
}

/// What the certattn run counts over the decode steps.
struct certattn_tally {
  std::size_t calls = 0;        // query-head results from attend_group
  std::size_t certified = 0;    // ... certified
  std::size_t fallbacks = 0;    // ... answered by exact attention: no level certified
  std::size_t routed = 0;       // ... answered exactly by routing (routed, over budget, joined)
  std::size_t short_calls = 0;  // query heads on plain exact attention: cache too short
  std::size_t keys_read = 0;    // sum over attend_group results of certificate.keys_read
  std::size_t keys_total = 0;   // sum of the cache sizes of those results
  std::size_t bytes_read = 0;   // group_stats.bytes_read, summed
  std::size_t dense_bytes = 0;  // group_stats.dense_bytes, summed
  std::size_t violations = 0;   // certified results with error > epsilon * scale
  std::size_t bound_violations = 0;
  double max_error = 0.0;       // max over certified results of ||o^ - o|| / scale
  double max_bound = 0.0;       // max certified bound (relative to its scale)
  double attend_seconds = 0.0;  // attend_group
  double append_seconds = 0.0;  // key_index::append
};

/// The certattn side: an index per (layer, KV head), built after prefill and appended
/// each step, and one attend_group per (layer, KV head) per step.
template <class Cache>
class certattn_attention {
 public:
  certattn_attention(const llama2c::config& c, const llama2c::state<Cache>& s, const settings& cfg)
      : c_(c),
        s_(s),
        hs_(std::size_t(c.head_size())),
        rc_(s.row_channels),
        G_(std::size_t(c.group())),
        ws_(G_, rc_, std::size_t(c.seq_len)),
        out_(G_ * rc_) {
    opt_.epsilon = cfg.epsilon;
    opt_.softmax_scale = s.softmax_scale();  // 1 / sqrt(head_size) over padded rows
    opt_.scale = certattn::error_scale_from_string(cfg.error_scale);
    if (opt_.scale == certattn::error_scale::kDenominator)
      throw std::runtime_error(
          "--error-scale: this example checks outputs; use value_scale or "
          "output_norm");
    opt_.window = cfg.window;
    opt_.seed = cfg.seed;  // fixed before generation
    opt_.route = certattn::routing_from_string(cfg.routing);
    min_tokens_ = cfg.window + cfg.min_pool;
    for (int l = 0; l < c.n_layers; ++l)
      for (int h = 0; h < c.n_kv_heads; ++h) {
        index_.emplace_back(rc_);
        index_.back().reserve(std::size_t(c.seq_len));
      }
    history_.assign(index_.size(), certattn::group_history(G_));
  }
  void set_delta(double delta) { opt_.delta = delta; }
  const certattn::options& options() const { return opt_; }
  std::size_t min_tokens() const { return min_tokens_; }
  const certattn_tally& tally() const { return tally_; }
  std::size_t index_bytes() const {
    std::size_t b = 0;
    for (const auto& idx : index_) b += idx.memory_bytes();
    return b;
  }

  auto view(int layer, std::size_t n, std::size_t h) const { return s_.view(layer, n, h); }

  /// After prefill: index every (layer, KV head) over the n tokens in the cache.
  void build(std::size_t n) {
    for (int l = 0; l < c_.n_layers; ++l)
      for (std::size_t h = 0; h < std::size_t(c_.n_kv_heads); ++h)
        index_[slot(l, h)].build(view(l, n, h));
  }

  void begin_step(std::uint64_t step) { step_ = step; }

  /// The attention of one layer at a decode step; the cache holds n tokens, the newest
  /// (n - 1) just written.
  void operator()(int layer, std::size_t n, std::span<const float> q, std::span<float> out) {
    const auto t0 = clock_type::now();
    for (std::size_t h = 0; h < std::size_t(c_.n_kv_heads); ++h)
      index_[slot(layer, h)].append(view(layer, n, h), n - 1);
    tally_.append_seconds += seconds_since(t0);
    if (n < min_tokens_) {
      // Too short for a pool worth sampling (and n < window is an error for attend_group).
      exact_layer(c_, s_, layer, n, q, out);
      tally_.short_calls += std::size_t(c_.n_heads);
      return;
    }
    for (std::size_t h = 0; h < std::size_t(c_.n_kv_heads); ++h) {
      const auto kv = view(layer, n, h);
      const certattn::noise_key nk{step_, std::uint32_t(layer), std::uint32_t(h)};
      s_.pad_queries(q, h * G_, G_, queries_);  // rows of the cache's width (head_size if unpadded)
      const auto t1 = clock_type::now();
      // The group's history: the level each query head stopped at in the previous step
      // (the tight certificate spends most of delta around it) and, with routing, whether
      // the sparse path lost to the dense kernel.
      certattn::attend_group(queries_, G_, kv, index_[slot(layer, h)], nk, opt_, out_,
                             std::span<certattn::certificate>(certs_.data(), G_), ws_,
                             history_[slot(layer, h)]);
      tally_.attend_seconds += seconds_since(t1);
      for (std::size_t g = 0; g < G_; ++g)
        std::copy_n(out_.data() + g * rc_, hs_, out.data() + (h * G_ + g) * hs_);
      const certattn::group_stats& st = ws_.last_stats();
      tally_.bytes_read += st.bytes_read;
      tally_.dense_bytes += st.dense_bytes;
      tally_.bound_violations += st.bound_violations;
      for (std::size_t g = 0; g < G_; ++g) {
        const certattn::certificate& cert = certs_[g];
        ++tally_.calls;
        tally_.certified += cert.certified;
        tally_.fallbacks += cert.path == certattn::answer_path::kFallback;
        tally_.routed += cert.path == certattn::answer_path::kRouted ||
                         cert.path == certattn::answer_path::kOverBudget ||
                         cert.path == certattn::answer_path::kJoined;
        tally_.keys_read += cert.keys_read;
        tally_.keys_total += n;
        if (!cert.certified || cert.exact) continue;
        // Check the promise against exact attention (untimed; a check, not part of decoding).
        const std::size_t qh = h * G_ + g;
        const auto r = certattn::exact_attention(
            std::span<const float>(queries_).subspan(g * rc_, rc_), kv, opt_.softmax_scale);
        double err2 = 0.0;
        for (std::size_t i = 0; i < hs_; ++i) {
          const double e = double(out[qh * hs_ + i]) - r.output[i];
          err2 += e * e;
        }
        const double rel =
            std::sqrt(err2) /
            (opt_.scale == certattn::error_scale::kOutputNorm ? r.output_norm : r.value_scale);
        tally_.max_error = std::max(tally_.max_error, rel);
        tally_.max_bound = std::max(tally_.max_bound, cert.bound);
        if (rel > opt_.epsilon) ++tally_.violations;
      }
    }
  }

 private:
  std::size_t slot(int layer, std::size_t h) const {
    return std::size_t(layer) * std::size_t(c_.n_kv_heads) + h;
  }
  const llama2c::config& c_;
  const llama2c::state<Cache>& s_;
  std::size_t hs_, rc_, G_, min_tokens_ = 0;
  certattn::options opt_;
  certattn::attend_workspace ws_;
  std::vector<float> queries_, out_;  // one group's queries and outputs, rows of rc_ channels
  std::array<certattn::certificate, 64> certs_{};
  std::vector<certattn::key_index> index_;  // [layer][kv_head]
  std::vector<certattn::group_history> history_;  // [layer][kv_head]
  std::uint64_t step_ = 0;
  certattn_tally tally_;
};

/// The dense side: exact attention in double for the outputs, and certattn::dense_attend
/// (the library's fp32 dense kernel) timed on the same cache as the speed baseline.
template <class Cache>
class dense_attention {
 public:
  dense_attention(const llama2c::config& c, const llama2c::state<Cache>& s)
      : c_(c),
        s_(s),
        G_(std::size_t(c.group())),
        ws_(G_, s.row_channels),
        scratch_(G_ * s.row_channels) {}
  void time_dense(bool on) { timed_ = on; }
  double dense_seconds() const { return seconds_; }

  void operator()(int layer, std::size_t n, std::span<const float> q, std::span<float> out) {
    if (timed_) {
      for (std::size_t h = 0; h < std::size_t(c_.n_kv_heads); ++h) {
        s_.pad_queries(q, h * G_, G_, queries_);
        const auto t0 = clock_type::now();
        certattn::dense_attend(queries_, G_, s_.view(layer, n, h), float(s_.softmax_scale()),
                               std::span<float>(scratch_), ws_);
        seconds_ += seconds_since(t0);
      }
    }
    exact_layer(c_, s_, layer, n, q, out);
  }

 private:
  const llama2c::config& c_;
  const llama2c::state<Cache>& s_;
  std::size_t G_;
  certattn::dense_workspace ws_;
  std::vector<float> queries_, scratch_;
  bool timed_ = false;
  double seconds_ = 0.0;
};

/// The example with the KV cache stored as Cache (--kv-cache).
template <class Cache>
int run_with(const settings& cfg) {
  const std::pair<const char*, const std::string*> files[] = {
      {"--model", &cfg.model_path}, {"--tokenizer", &cfg.tokenizer_path},
      {"--prompt-file", &cfg.prompt_path}};
  for (const auto& [option, path] : files)
    if (!std::filesystem::exists(*path))
      throw std::runtime_error(std::string(option) + ": " + *path + " not found");
  const llama2c::model m = llama2c::load_model(cfg.model_path);
  const llama2c::config& c = m.cfg;
  const llama2c::tokenizer tok(cfg.tokenizer_path, c.vocab_size);
  if (c.group() > 64) throw std::runtime_error("more than 64 query heads per KV head");
  if (cfg.window > 64) throw std::runtime_error("--window must be <= 64");
  if (cfg.prompt_tokens < 2) throw std::runtime_error("--prompt-tokens must be >= 2");

  std::vector<int> prompt =
      tok.encode(read_passage(cfg.prompt_path, cfg.prompt_offset, 8 * cfg.prompt_tokens + 64));
  if (prompt.size() > cfg.prompt_tokens) prompt.resize(cfg.prompt_tokens);
  if (prompt.size() < 2) throw std::runtime_error("the prompt passage is empty");
  const std::size_t P = prompt.size(), T = std::size_t(c.seq_len);
  if (P >= T) throw std::runtime_error("the prompt fills the whole context");
  // Positions 0 .. P-2 are prefill; the decode steps feed positions P-1 .. P-2+steps.
  std::size_t steps = cfg.steps;
  if (P - 1 + steps > T) {
    steps = T - (P - 1);
    std::printf("note: context is %zu positions: %zu prompt tokens leave room for %zu steps\n", T,
                P, steps);
  }
  if (steps == 0) throw std::runtime_error("--steps must be > 0");

  llama2c::state<Cache> sc(c), sd(c);  // certattn run, dense run
  certattn_attention<Cache> cert_attn(c, sc, cfg);
  dense_attention<Cache> dense_attn(c, sd);
  const double heads_x_steps = double(c.n_layers) * double(c.n_heads) * double(steps);
  cert_attn.set_delta(cfg.delta > 0.0 ? cfg.delta : cfg.delta_total / heads_x_steps);
  const certattn::options& opt = cert_attn.options();
  certattn::validate(opt);

  std::printf(
      "model: dim %d, %d layers, %d query heads, %d KV heads (head_dim %d), vocab %d, "
      "context %d\n",
      c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_size(), c.vocab_size, c.seq_len);
  std::printf("prompt: %zu tokens from %s at byte %zu; %zu decode steps\n", P,
              cfg.prompt_path.c_str(), cfg.prompt_offset, steps);
  char delta_origin[96];
  if (cfg.delta > 0.0)
    std::snprintf(delta_origin, sizeof delta_origin, "--delta");
  else
    std::snprintf(delta_origin, sizeof delta_origin,
                  "--delta-total %g / (%d layers x %d heads x %zu steps)", cfg.delta_total,
                  c.n_layers, c.n_heads, steps);
  std::printf(
      "certattn: epsilon %.3g (%s), delta %.3g per call (%s), window %zu, "
      "certified calls once the cache holds >= %zu tokens (exact attention before), "
      "seed %llu\n",
      opt.epsilon, std::string(certattn::to_string(opt.scale)).c_str(), opt.delta, delta_origin,
      opt.window, cert_attn.min_tokens(), static_cast<unsigned long long>(opt.seed));

  // ---- prefill: exact attention in both runs
  auto exact_c = [&](int l, std::size_t n, std::span<const float> q, std::span<float> out) {
    exact_layer(c, sc, l, n, q, out);
  };
  for (std::size_t pos = 0; pos + 1 < P; ++pos) {
    llama2c::forward(m, sc, prompt[pos], int(pos), exact_c);
    llama2c::forward(m, sd, prompt[pos], int(pos), dense_attn);
  }
  cert_attn.build(P - 1);  // the key index of every (layer, KV head), after prefill

  // ---- decode in lockstep
  std::size_t agree = 0;
  double kl_sum = 0.0, kl_max = 0.0;
  std::string text;
  int token = prompt[P - 1];
  if (!cfg.quiet)
    std::printf("%5s %5s %10s %9s %10s %10s %6s  %s\n", "step", "pos", "certified", "fallback",
                "keys read", "KL", "agree", "token");
  dense_attn.time_dense(true);
  for (std::size_t step = 0; step < steps; ++step) {
    const int pos = int(P - 1 + step);
    const certattn_tally before = cert_attn.tally();
    cert_attn.begin_step(step);  // fresh perturbations every step
    const std::vector<float>& lc = llama2c::forward(m, sc, token, pos, cert_attn);
    const std::vector<float>& ld = llama2c::forward(m, sd, token, pos, dense_attn);
    const std::vector<double> pc = log_softmax(lc), pd = log_softmax(ld);
    double kl = 0.0;
    for (std::size_t i = 0; i < pd.size(); ++i) kl += std::exp(pd[i]) * (pd[i] - pc[i]);
    kl = std::max(kl, 0.0);
    kl_sum += kl;
    kl_max = std::max(kl_max, kl);
    const int next = argmax(lc), next_dense = argmax(ld);
    const bool same = next == next_dense;
    agree += same;
    const std::string piece = tok.decode(token, next);
    text += piece;
    std::string note;
    if (!same)  // a near tie, typically: show both choices under the dense distribution
      note = "   (dense: \"" + json_escape(tok.decode(token, next_dense)) +
             "\" p=" + std::to_string(std::exp(pd[std::size_t(next_dense)])) +
             ", this one p=" + std::to_string(std::exp(pd[std::size_t(next)])) + ")";
    if (!cfg.quiet) {
      const certattn_tally& a = cert_attn.tally();
      const std::size_t calls = a.calls - before.calls;
      if (calls == 0)
        std::printf("%5zu %5d %20s %10s %10.2e %6s  \"%s\"%s\n", step, pos, "exact (short cache)",
                    "", kl, same ? "yes" : "NO", json_escape(piece).c_str(), note.c_str());
      else
        std::printf("%5zu %5d %6zu/%-3zu %9zu %9.1f%% %10.2e %6s  \"%s\"%s\n", step, pos,
                    a.certified - before.certified, calls, a.fallbacks - before.fallbacks,
                    100.0 * double(a.keys_read - before.keys_read) /
                        double(a.keys_total - before.keys_total),
                    kl, same ? "yes" : "NO", json_escape(piece).c_str(), note.c_str());
    }
    token = next;
  }

  const certattn_tally& a = cert_attn.tally();
  const double calls = double(a.calls);
  const double certified_frac = a.calls ? double(a.certified) / calls : 0.0;
  const double fallback_frac = a.calls ? double(a.fallbacks) / calls : 0.0;
  const double keys_read_frac = a.keys_total ? double(a.keys_read) / double(a.keys_total) : 1.0;
  const double bytes_read_frac = a.dense_bytes ? double(a.bytes_read) / double(a.dense_bytes) : 1.0;
  const double agreement = double(agree) / double(steps);
  const double mean_kl = kl_sum / double(steps);
  const double us = 1e6 / double(steps);

  std::printf("\ngenerated (greedy, certattn run): %s\n\n", text.c_str());
  std::printf("token agreement %.4f (%zu of %zu steps), KL(dense || certattn) mean %.3g max %.3g\n",
              agreement, agree, steps, mean_kl, kl_max);
  std::printf(
      "attend_group results: %zu, certified %.4f, fell back to exact %.4f, routed to exact %.4f "
      "(routing %s); %zu more on exact attention (cache < %zu tokens)\n",
      a.calls, certified_frac, fallback_frac, a.calls ? double(a.routed) / calls : 0.0,
      std::string(certattn::to_string(opt.route)).c_str(), a.short_calls, cert_attn.min_tokens());
  std::printf(
      "keys read %.4f of the cache per query head; bytes read %.4f of dense (codes "
      "included)\n",
      keys_read_frac, bytes_read_frac);
  std::printf(
      "certified results: max error %.4g x %s (bound max %.3g, epsilon %.3g), %zu above "
      "epsilon, %zu bound violations in the scan\n",
      a.max_error, opt.scale == certattn::error_scale::kOutputNorm ? "|o|" : "M", a.max_bound,
      opt.epsilon, a.violations, a.bound_violations);
  std::printf(
      "attention per step: certattn %.1f us (attend_group %.1f + append %.1f), dense "
      "kernel %.1f us; index %zu bytes (%s KV %zu bytes)\n",
      (a.attend_seconds + a.append_seconds) * us, a.attend_seconds * us, a.append_seconds * us,
      dense_attn.dense_seconds() * us, cert_attn.index_bytes(), cfg.kv_cache.c_str(),
      2 * sc.key_cache.size() * sizeof(Cache));

  if (!cfg.json_path.empty()) {
    std::FILE* f = std::fopen(cfg.json_path.c_str(), "w");
    if (!f) throw std::runtime_error("cannot write " + cfg.json_path);
    std::fprintf(
        f,
        "{\"steps\": %zu, \"token_agreement\": %.6g, \"mean_kl\": %.6g, \"max_kl\": %.6g, "
        "\"certified_frac\": %.6g, \"fallback_frac\": %.6g, \"keys_read_frac\": %.6g,\n"
        " \"bytes_read_frac\": %.6g, \"prompt_tokens\": %zu, \"epsilon\": %.6g, "
        "\"delta_per_call\": %.6g, \"window\": %zu, \"min_tokens_for_certattn\": %zu,\n"
        " \"certattn_calls\": %zu, \"short_context_calls\": %zu, "
        "\"error_scale\": \"%s\", \"max_error_over_scale\": %.6g, \"certificate_violations\": %zu, "
        "\"seed\": %llu, \"kv_cache\": \"%s\",\n"
        " \"attn_us_per_step\": %.6g, \"append_us_per_step\": %.6g, "
        "\"dense_attn_us_per_step\": %.6g,\n"
        " \"text\": \"%s\"}\n",
        steps, agreement, mean_kl, kl_max, certified_frac, fallback_frac, keys_read_frac,
        bytes_read_frac, P, opt.epsilon, opt.delta, opt.window, cert_attn.min_tokens(), a.calls,
        a.short_calls, std::string(certattn::to_string(opt.scale)).c_str(), a.max_error,
        a.violations, static_cast<unsigned long long>(opt.seed), cfg.kv_cache.c_str(),
        (a.attend_seconds + a.append_seconds) * us, a.append_seconds * us,
        dense_attn.dense_seconds() * us, json_escape(text).c_str());
    std::fclose(f);
  }
  if (cfg.strict && (a.violations > 0 || a.bound_violations > 0)) {
    std::printf("--strict: a certified result broke its bound (probability <= delta per call)\n");
    return EXIT_FAILURE;
  }
  return EXIT_SUCCESS;
}

int run(const settings& cfg) {
  if (cfg.kv_cache == "fp8_e4m3") return run_with<certattn::fp8_e4m3>(cfg);
  if (cfg.kv_cache == "fp8_e5m2") return run_with<certattn::fp8_e5m2>(cfg);
  if (cfg.kv_cache == "q8_0") return run_with<certattn::block_q8_0>(cfg);
  if (cfg.kv_cache == "q4_0") return run_with<certattn::block_q4_0>(cfg);
  return run_with<half>(cfg);
}

}  // namespace

int main(int argc, char** argv) {
  settings cfg;
  CLI::App app{"A llama2.c model decoding with certattn, compared with dense attention"};
  app.add_option("--model", cfg.model_path, "llama2.c checkpoint (float32)")
      ->capture_default_str();
  app.add_option("--tokenizer", cfg.tokenizer_path, "llama2.c tokenizer.bin")
      ->capture_default_str();
  app.add_option("--prompt-file", cfg.prompt_path, "text to take the prompt from")
      ->capture_default_str();
  app.add_option("--prompt-offset", cfg.prompt_offset, "byte offset of the passage")
      ->capture_default_str();
  app.add_option("--prompt-tokens", cfg.prompt_tokens, "prompt length in tokens (BOS included)")
      ->capture_default_str();
  app.add_option("--steps", cfg.steps, "decode steps")->capture_default_str();
  app.add_option("--json", cfg.json_path, "write the summary here");
  app.add_option("--epsilon", cfg.epsilon, "target error, relative to the error scale")
      ->capture_default_str();
  app.add_option("--error-scale", cfg.error_scale,
                 "value_scale (||o^ - o|| <= epsilon M) or output_norm (<= epsilon ||o||)")
      ->capture_default_str();
  app.add_option("--delta-total", cfg.delta_total,
                 "failure probability for the whole generation (union bound over "
                 "layers x query heads x steps)")
      ->capture_default_str();
  app.add_option("--delta", cfg.delta, "failure probability per call (overrides --delta-total)");
  app.add_option("--window", cfg.window, "newest tokens read exactly (<= 64)")
      ->capture_default_str();
  app.add_option("--min-pool", cfg.min_pool,
                 "use certattn once the cache holds window + this many tokens")
      ->capture_default_str();
  app.add_option("--routing", cfg.routing,
                 "options.route: off (every call on the sparse path, to see its certificates) or "
                 "auto (exact answers where the sparse path would cost more than dense)")
      ->check(CLI::IsMember({"off", "auto"}))
      ->capture_default_str();
  app.add_option("--seed", cfg.seed, "perturbation seed")->capture_default_str();
  app.add_option("--kv-cache", cfg.kv_cache,
                 "the KV cache's format in both runs: f16; fp8_e4m3 or fp8_e5m2 (vLLM's, scale 1); "
                 "q8_0 or q4_0 (llama.cpp's 32-channel blocks; a narrower head's rows padded with zeros)")
      ->check(CLI::IsMember({"f16", "fp8_e4m3", "fp8_e5m2", "q8_0", "q4_0"}))
      ->capture_default_str();
  app.add_flag("--strict", cfg.strict,
               "exit 1 if a certified result's error exceeds epsilon x scale (a test check)");
  app.add_flag("--quiet", cfg.quiet, "no per-step lines");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(cfg);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "certattn-example-llama2c: %s\n", e.what());
    return EXIT_FAILURE;
  }
}
