// The attention variants of current open models, as one plain struct that the certified
// call, the dense kernel and the oracles (exact_attention, reference_attend) all take:
//   logit soft-capping (Gemma 2)          s_i = cap tanh(s_i / cap)
//   ALiBi and other linear position bias  s_i += m_h (i - (n - 1)), a slope per query head
//     (BLOOM, MPT, Baichuan)
//   attention sinks (gpt-oss)             a learned logit z_h per query head in the
//                                         softmax's denominator, with no value
//   sliding windows (Mistral, Gemma 2/3,  only the newest W tokens attend
//     gpt-oss)
// The raw score scale q.k_i is modified in that order (soft-cap, then the bias, as
// ggml-cpu's flash attention does), then the sink joins the denominator:
//   o = sum_{i in window} e^{s_i} v_i / (e^{z} + sum_{i in window} e^{s_i}).
// Each keeps the certificate's structure (docs/certificate.md, "Variants"): the sampler
// needs an exact score for every key it reads and an upper bound for every key it does not,
// and both transforms are increasing in the raw score.
#pragma once

#include <certattn/common.hpp>

#include <cmath>
#include <cstddef>
#include <span>
#include <string>

namespace certattn {

/// What attention a call computes beyond plain scaled dot products. The default is plain
/// attention. The spans are the caller's and must outlive the call; their entries are the
/// call's query heads in order (one for reference_attend() and exact_attention(), `group`
/// for attend_group() and the dense kernels).
struct attention_variant {
  /// Largest soft-cap, ALiBi slope magnitude and sink magnitude accepted: far beyond any
  /// model's (Gemma 2: cap 50; BLOOM's slopes are <= 0.5), and small enough that the
  /// float score bounds keep their margin.
  static constexpr double kMaxParameter = 0x1p20;

  double logit_softcap = 0.0;           // 0: off; > 0: s = cap tanh(s / cap)
  std::span<const float> alibi_slopes;  // empty, or m_h per query head: s_i += m_h (i - (n-1))
  std::span<const float> sinks;         // empty, or the sink logit z_h per query head
  std::size_t sliding_window = 0;       // 0: every token; W > 0: tokens [n - W, n) only

  bool plain() const noexcept {
    return logit_softcap == 0.0 && alibi_slopes.empty() && sinks.empty() && sliding_window == 0;
  }
  /// True when scores differ from scale q.k (soft-cap or bias).
  bool modifies_scores() const noexcept { return logit_softcap > 0.0 || !alibi_slopes.empty(); }
  /// The first token that attends, of n: n - W under a sliding window shorter than the cache.
  std::size_t first_token(std::size_t n) const noexcept {
    return sliding_window > 0 && sliding_window < n ? n - sliding_window : 0;
  }
};

/// The variant of one query head, as scalars: what the score of token t is, given its raw
/// score scale q.k_t, in a cache of n tokens.
struct head_variant {
  double cap = 0.0;       // soft-cap, 0 off
  double slope = 0.0;     // position-bias slope, 0 off
  double newest = 0.0;    // n - 1: the bias is slope (t - newest), 0 at the newest token
  bool has_sink = false;
  double sink = 0.0;      // z, when has_sink
  std::size_t first = 0;  // the first token that attends

  /// s_t from the raw score: the same double operations on every path (the fast path, the
  /// reference, exact attention), so that their scores are the same bits.
  double score(double raw, std::size_t t) const noexcept {
    double s = raw;
    if (cap > 0.0) s = cap * std::tanh(s / cap);
    if (slope != 0.0) s += slope * (double(t) - newest);
    return s;
  }
  /// What rounding.hpp's bounds take as their score magnitude S when |raw| <= raw_magnitude:
  /// the raw score's rounding passes through tanh (slope <= 1) unchanged, and the
  /// transforms' own roundings (tanh and its scalings within 4 ulp of cap, the bias
  /// product and sum within 2 ulp of the bias) are covered by 4 cap + 2 |slope| n.
  double score_magnitude(double raw_magnitude) const noexcept {
    return raw_magnitude + 4.0 * cap + 2.0 * std::fabs(slope) * (newest + 1.0 - double(first));
  }
};

/// Head g's variant in a cache of n tokens.
inline head_variant head_variant_of(const attention_variant& v, std::size_t g, std::size_t n) noexcept {
  head_variant h;
  h.cap = v.logit_softcap;
  h.slope = v.alibi_slopes.empty() ? 0.0 : double(v.alibi_slopes[g]);
  h.newest = n > 0 ? double(n - 1) : 0.0;
  h.has_sink = !v.sinks.empty();
  h.sink = h.has_sink ? double(v.sinks[g]) : 0.0;
  h.first = v.first_token(n);
  return h;
}

/// The same variant for heads [g, g + count) only (reference_attend_group() hands each
/// head its own entries).
inline attention_variant head_slice(const attention_variant& v, std::size_t g, std::size_t count = 1) {
  attention_variant s = v;
  if (!v.alibi_slopes.empty()) s.alibi_slopes = v.alibi_slopes.subspan(g, count);
  if (!v.sinks.empty()) s.sinks = v.sinks.subspan(g, count);
  return s;
}

/// Throws certattn::error naming the first bad field; `heads` is the number of query
/// heads the call computes (the spans' length when not empty), `what` how the caller
/// names the struct (e.g. "options.variant").
inline void validate(const attention_variant& v, std::size_t heads, const char* what) {
  const std::string w(what);
  if (!(v.logit_softcap >= 0.0 && v.logit_softcap <= attention_variant::kMaxParameter))
    throw error(w + ".logit_softcap must lie in [0, 2^20] (0 = off), got " +
                std::to_string(v.logit_softcap));
  auto check_span = [&](std::span<const float> s, const char* name) {
    if (s.empty()) return;
    if (s.size() != heads)
      throw error(w + "." + name + " has " + std::to_string(s.size()) +
                  " elements, expected 0 or one per query head = " + std::to_string(heads));
    if (s.data() == nullptr) throw error(w + "." + name + ": null data");
    for (std::size_t i = 0; i < s.size(); ++i)
      if (!(std::fabs(double(s[i])) <= attention_variant::kMaxParameter))
        throw error(w + "." + name + "[" + std::to_string(i) + "] = " + std::to_string(s[i]) +
                    " is not finite or exceeds 2^20 in magnitude");
  };
  check_span(v.alibi_slopes, "alibi_slopes");
  check_span(v.sinks, "sinks");
}

}  // namespace certattn
