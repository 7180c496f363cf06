// The table of docs/robustness.md, checked: every bad or extreme input below is run, its
// outcome captured (the certattn::error message, or a defined result that agrees with the
// reference estimator with finite outputs and certificate fields), and the doc's table
// must list exactly these rows. Regenerate the table after changing a message with
//   CERTATTN_PRINT_ROBUSTNESS=1 ./tests/test_robustness
// and paste the rows between the markers of docs/robustness.md.
#include <certattn/attend.hpp>
#include <certattn/reference.hpp>
#include <certattn/exact.hpp>

#include "support/harness.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace {

using namespace certattn;
using test::gauss;
using test::head_cache;

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

struct robustness_case {
  std::string entry;  // the entry point that sees the input
  std::string input;  // what is wrong or extreme about it
  std::function<std::string()> run;  // returns a defined result's description, or throws
};

/// A small valid setting that each case spoils in one way: 300 fp16 tokens, head_dim 16,
/// G = 2, the default options (window 64) without routing, so that the cases reach the
/// sampled path (300 tokens lie far below the break-even: routing would answer exactly).
struct setting {
  std::size_t n = 300, d = 16, group = 2;
  head_cache<half> cache;
  std::vector<float> q;
  options opt = test::sparse_options();
  noise_key nk{7, 1, 0};
  explicit setting(std::size_t n_ = 300, std::size_t d_ = 16) : n(n_), d(d_) {
    cache = head_cache<half>(
        n, d, [](std::size_t t, std::size_t i) { return gauss(1, t * 100 + i); },
        [](std::size_t t, std::size_t i) { return gauss(2, t * 100 + i); });
    q.resize(group * d);
    for (std::size_t i = 0; i < q.size(); ++i) q[i] = float(1.5 * gauss(3, i));
  }
  key_index index() const {
    key_index idx(d);
    idx.build(cache.view());
    return idx;
  }
  /// The certified call with a workspace of the right size; the defined-result summary.
  std::string attend() const { return attend(index()); }
  std::string attend(const key_index& idx) const {
    const auto r = test::run_group(cache.view(), idx, q, group, opt, nk);
    return summarize(r, idx, cache);
  }
  template <storage_element T>
  std::string summarize(const test::group_run& r, const key_index& idx,
                        const head_cache<T>& kv) const {
    for (float x : r.out)
      if (!std::isfinite(x)) return "UNEXPECTED non-finite output";
    for (const certificate& c : r.certs)
      if (!test::certificate_finite(c)) return "UNEXPECTED non-finite certificate field";
    const std::string diff = test::compare_with_reference(
        kv.key_matrix(n), kv.value_matrix(n), idx, q, group, opt, nk, r);
    if (!diff.empty()) return "UNEXPECTED differs from the reference: " + diff;
    bool all_sampled = true, all_exact_certified = true, all_fallback = true;
    for (const certificate& c : r.certs) {
      all_sampled &= c.certified && !c.exact;
      all_exact_certified &= c.certified && c.exact;
      all_fallback &= !c.certified && c.exact;
    }
    const std::string kind = all_sampled            ? "certified from a sample"
                             : all_exact_certified ? "exact (no pool), certified"
                             : all_fallback        ? "exact-attention fallback (not certified)"
                                                   : "certified or fallback, per head";
    return "defined: " + kind + "; same as the reference";
  }
};

std::vector<robustness_case> cases() {
  std::vector<robustness_case> c;
  auto add = [&](std::string entry, std::string input, std::function<std::string()> f) {
    c.push_back({std::move(entry), std::move(input), std::move(f)});
  };
  auto with_options = [](std::function<void(options&)> spoil) {
    return [spoil] {
      setting s;
      spoil(s.opt);
      return s.attend();
    };
  };

  // ---- options (attend_group validates them first) ----
  const std::string ag = "attend_group";
  add(ag, "options.epsilon = 0", with_options([](options& o) { o.epsilon = 0.0; }));
  add(ag, "options.epsilon = -0.1", with_options([](options& o) { o.epsilon = -0.1; }));
  add(ag, "options.epsilon = NaN", with_options([](options& o) { o.epsilon = kNaN; }));
  add(ag, "options.epsilon = +Inf", with_options([](options& o) { o.epsilon = kInf; }));
  add(ag, "options.delta = 0", with_options([](options& o) { o.delta = 0.0; }));
  add(ag, "options.delta = 1", with_options([](options& o) { o.delta = 1.0; }));
  add(ag, "options.delta = NaN", with_options([](options& o) { o.delta = kNaN; }));
  add(ag, "options.grid_ratio = 0", with_options([](options& o) { o.grid_ratio = 0; }));
  add(ag, "options.grid_ratio = 65", with_options([](options& o) { o.grid_ratio = 65; }));
  add(ag, "options.max_levels = -1", with_options([](options& o) { o.max_levels = -1; }));
  add(ag, "options.max_levels = 4097", with_options([](options& o) { o.max_levels = 4097; }));
  add(ag, "options.softmax_scale = -1", with_options([](options& o) { o.softmax_scale = -1.0; }));
  add(ag, "options.softmax_scale = NaN", with_options([](options& o) { o.softmax_scale = kNaN; }));
  add(ag, "options.softmax_scale = +Inf", with_options([](options& o) { o.softmax_scale = kInf; }));
  add(ag, "options.scale = error_scale(42)",
      with_options([](options& o) { o.scale = static_cast<error_scale>(42); }));
  add(ag, "options.window = 65", with_options([](options& o) { o.window = 65; }));
  add("error_scale_from_string", "\"bogus\"", [] {
    error_scale_from_string("bogus");
    return std::string("UNEXPECTED no error");
  });

  // ---- call arguments ----
  auto call = [](std::function<void(setting&, key_index&, std::vector<float>& q,
                                    std::vector<float>& out, std::vector<certificate>& certs,
                                    std::size_t& group, attend_workspace*& ws)>
                     spoil) {
    return [spoil] {
      setting s;
      key_index idx = s.index();
      std::vector<float> q = s.q, out(s.group * s.d);
      std::vector<certificate> certs(s.group);
      std::size_t group = s.group;
      attend_workspace own(s.group, s.d, s.n);
      attend_workspace* ws = &own;
      spoil(s, idx, q, out, certs, group, ws);
      attend_group(std::span<const float>(q), group, s.cache.view(), idx, s.nk, s.opt,
                   std::span<float>(out), std::span<certificate>(certs), *ws);
      return std::string("UNEXPECTED no error");
    };
  };
  add(ag, "queries of 31 floats for group 2, head_dim 16",
      call([](auto&, auto&, auto& q, auto&, auto&, auto&, auto&) { q.pop_back(); }));
  add(ag, "out of 33 floats",
      call([](auto&, auto&, auto&, auto& out, auto&, auto&, auto&) { out.push_back(0.0f); }));
  add(ag, "certs of 1 for group 2",
      call([](auto&, auto&, auto&, auto&, auto& certs, auto&, auto&) { certs.pop_back(); }));
  add(ag, "group = 0", call([](auto&, auto&, auto& q, auto& out, auto& certs, auto& g, auto&) {
        g = 0;
        q.clear();
        out.clear();
        certs.clear();
      }));
  add(ag, "index of head_dim 8 for a head_dim-16 cache",
      call([](auto&, auto& idx, auto&, auto&, auto&, auto&, auto&) { idx = key_index(8); }));
  add(ag, "index one token behind the cache (append forgotten)",
      call([](auto& s, auto& idx, auto&, auto&, auto&, auto&, auto&) {
        idx = key_index(s.d);
        idx.build(s.cache.view(s.n - 1));
      }));
  static attend_workspace small_tokens(2, 16, 299), small_group(1, 16, 300), other_dim(2, 32, 300),
      few_levels(2, 16, 300, 8);
  add(ag, "workspace sized for 299 tokens, cache of 300",
      call([](auto&, auto&, auto&, auto&, auto&, auto&, auto& ws) { ws = &small_tokens; }));
  add(ag, "workspace sized for group 1, call with group 2",
      call([](auto&, auto&, auto&, auto&, auto&, auto&, auto& ws) { ws = &small_group; }));
  add(ag, "workspace sized for head_dim 32, cache of head_dim 16",
      call([](auto&, auto&, auto&, auto&, auto&, auto&, auto& ws) { ws = &other_dim; }));
  add(ag, "workspace sized for 8 levels, options.max_levels = 32",
      call([](auto&, auto&, auto&, auto&, auto&, auto&, auto& ws) { ws = &few_levels; }));
  add(ag, "cache of 63 tokens, window 64", [] {
    setting s(63);
    return s.attend();
  });
  add(ag, "empty cache (0 tokens)", [] {
    setting s(0);
    return s.attend();
  });
  add("attend_workspace", "group = 0", [] {
    attend_workspace ws(0, 16, 100);
    return std::string("UNEXPECTED no error");
  });
  add("attend_workspace", "head_dim = 0", [] {
    attend_workspace ws(2, 0, 100);
    return std::string("UNEXPECTED no error");
  });
  add("attend_workspace", "max_levels = 255", [] {
    attend_workspace ws(2, 16, 100, 255);
    return std::string("UNEXPECTED no error");
  });

  // ---- key index ----
  const std::string ki = "key_index";
  add(ki, "head_dim = 0", [] {
    key_index idx(0);
    return std::string("UNEXPECTED no error");
  });
  add(ki + "::build", "default-constructed index", [] {
    setting s;
    key_index idx;
    idx.build(s.cache.view());
    return std::string("UNEXPECTED no error");
  });
  add(ki + "::build", "cache of head_dim 16, index of head_dim 12", [] {
    setting s;
    key_index idx(12);
    idx.build(s.cache.view());
    return std::string("UNEXPECTED no error");
  });
  add(ki + "::append", "before build()", [] {
    setting s;
    key_index idx(s.d);
    idx.append(s.cache.view(), 0);
    return std::string("UNEXPECTED no error");
  });
  add(ki + "::append", "position 150 on an index of 100 tokens", [] {
    setting s;
    key_index idx(s.d);
    idx.build(s.cache.view(100));
    idx.append(s.cache.view(), 150);
    return std::string("UNEXPECTED no error");
  });
  add(ki + "::append", "position 100 on a view of 100 tokens", [] {
    setting s;
    key_index idx(s.d);
    idx.build(s.cache.view(100));
    idx.append(s.cache.view(100), 100);
    return std::string("UNEXPECTED no error");
  });
  auto spoiled_cache = [](bool key, std::size_t token, float bad, bool append) {
    return [=] {
      setting s;
      (key ? s.cache.keys : s.cache.values)[token * s.d + 3] = half(bad);
      key_index idx(s.d);
      if (append) {
        idx.build(s.cache.view(token));
        idx.append(s.cache.view(), token);
      } else {
        idx.build(s.cache.view());
      }
      return std::string("UNEXPECTED no error");
    };
  };
  add(ki + "::build", "NaN in the key of token 130", spoiled_cache(true, 130, kNaN, false));
  add(ki + "::build", "+Inf in the value of token 0", spoiled_cache(false, 0, kInf, false));
  add(ki + "::build", "-Inf in the key of token 299 (window)", spoiled_cache(true, 299, -kInf, false));
  add(ki + "::append", "-Inf in the key of the new token 200", spoiled_cache(true, 200, -kInf, true));
  add(ki + "::append", "NaN in the value of the new token 256", spoiled_cache(false, 256, kNaN, true));
  add(ki + "::append", "after a refused append, the token fixed and appended again", [] {
    setting s;
    key_index idx(s.d);
    idx.build(s.cache.view(200));
    s.cache.keys[200 * s.d] = half(kNaN);
    try {
      idx.append(s.cache.view(), 200);
      return std::string("UNEXPECTED no error");
    } catch (const certattn::error&) {
    }
    s.cache.keys[200 * s.d] = half(0.25f);
    for (std::size_t t = 200; t < s.n; ++t) idx.append(s.cache.view(), t);
    return s.attend(idx);
  });
  add(ki + "::build", "refused (NaN at token 250) on a built index: index unchanged", [] {
    setting s;
    key_index idx = s.index();
    auto spoiled = s.cache;
    spoiled.keys[250 * s.d] = half(kNaN);
    try {
      idx.build(spoiled.view());
      return std::string("UNEXPECTED no error");
    } catch (const certattn::error&) {
    }
    return s.attend(idx);
  });

  // ---- queries ----
  auto with_query = [](std::size_t at, float x, double softmax_scale) {
    return [=] {
      setting s;
      s.q[at] = x;
      s.opt.softmax_scale = softmax_scale;
      return s.attend();
    };
  };
  add(ag, "NaN in the query of head 1", with_query(20, kNaN, 0.0));
  add(ag, "+Inf in the query of head 0", with_query(3, kInf, 0.0));
  add(ag, "a query element of 3.4e38 (FLT_MAX)", with_query(5, 3.4e38f, 0.0));
  add(ag, "softmax_scale = 1e31 (scores ~1e32)", with_query(0, 1.0f, 1e31));
  add(ag, "queries ~1e30 with softmax_scale = 1e-30", [] {
    setting s;
    for (float& x : s.q) x *= 1e30f;
    s.opt.softmax_scale = 1e-30;
    return s.attend();
  });

  // ---- layouts ----
  static const std::vector<half> rows(64 * 16, half(0.5f));
  static const std::vector<std::int32_t> table = {0, 1, 2, 3}, bad_table = {0, -1};
  const half* p = rows.data();
  add("strided_kv", "null keys", [p] {
    strided_kv<half>(nullptr, p, 4, 16, 16, 16);
    return std::string("UNEXPECTED no error");
  });
  add("strided_kv", "head_dim = 0", [p] {
    strided_kv<half>(p, p, 4, 0, 16, 16);
    return std::string("UNEXPECTED no error");
  });
  add("strided_kv", "key_stride 8 < head_dim 16", [p] {
    strided_kv<half>(p, p, 4, 16, 8, 16);
    return std::string("UNEXPECTED no error");
  });
  add("strided_kv", "value_stride 0, 4 tokens", [p] {
    strided_kv<half>(p, p, 4, 16, 16, 0);
    return std::string("UNEXPECTED no error");
  });
  add("nhd_view", "head 2 of 2 kv_heads", [p] {
    nhd_view(p, p, 4, 2, 16, 2);
    return std::string("UNEXPECTED no error");
  });
  add("hnd_view", "n_tokens 5 > capacity 4", [p] {
    hnd_view(p, p, 5, 4, 1, 16, 0);
    return std::string("UNEXPECTED no error");
  });
  add("hnd_view", "head 1 of 1 kv_heads", [p] {
    hnd_view(p, p, 4, 4, 1, 16, 1);
    return std::string("UNEXPECTED no error");
  });
  auto paged = [p](std::size_t page_size, std::span<const std::int32_t> tab, std::size_t n,
                   std::size_t d, std::size_t token_stride, bool null_pages) {
    return [=] {
      paged_kv<half>(null_pages ? nullptr : p, p, tab, n, page_size, d, 16 * 16, token_stride, 0);
      return std::string("UNEXPECTED no error");
    };
  };
  add("paged_kv", "page_size = 0", paged(0, table, 4, 16, 16, false));
  add("paged_kv", "block table of 4 pages of 16 for 65 tokens", paged(16, table, 65, 16, 16, false));
  add("paged_kv", "block_table[1] = -1", paged(16, bad_table, 20, 16, 16, false));
  add("paged_kv", "token_stride 8 < head_dim 16", paged(16, table, 20, 16, 8, false));
  add("paged_kv", "null key pages", paged(16, table, 20, 16, 16, true));
  add("paged_kv", "head_dim = 0", paged(16, table, 20, 0, 16, false));

  // ---- reference and exact attention (double precision) ----
  add("reference_attend", "softmax_scale = 1e308 (scores overflow double)", [] {
    setting s;
    s.opt.softmax_scale = 1e308;
    reference_attend(std::span<const float>(s.q.data(), s.d), s.cache.key_matrix(s.n),
                     s.cache.value_matrix(s.n), s.opt, s.nk);
    return std::string("UNEXPECTED no error");
  });
  add("exact_attention", "softmax_scale = 1e308", [] {
    setting s;
    exact_attention(std::span<const float>(s.q.data(), s.d), s.cache.key_matrix(s.n),
                    s.cache.value_matrix(s.n), 1e308);
    return std::string("UNEXPECTED no error");
  });

  // ---- legal extremes: defined results ----
  add(ag, "1 token, window 0", [] {
    setting s(1);
    s.opt.window = 0;
    return s.attend();
  });
  add(ag, "1 token, window 1", [] {
    setting s(1);
    s.opt.window = 1;
    return s.attend();
  });
  add(ag, "64 tokens, window 64 (empty pool)", [] {
    setting s(64);
    return s.attend();
  });
  add(ag, "window 0", [] {
    setting s;
    s.opt.window = 0;
    return s.attend();
  });
  add(ag, "head_dim 1", [] {
    setting s(300, 1);
    return s.attend();
  });
  add(ag, "head_dim 7", [] {
    setting s(300, 7);
    return s.attend();
  });
  add(ag, "head_dim 100", [] {
    setting s(300, 100);
    return s.attend();
  });
  add(ag, "all values zero", [] {
    setting s;
    std::fill(s.cache.values.begin(), s.cache.values.end(), half(0.0f));
    const key_index idx = s.index();
    const auto r = test::run_group(s.cache.view(), idx, s.q, s.group, s.opt, s.nk);
    for (float x : r.out)
      if (x != 0.0f) return std::string("UNEXPECTED output not 0");
    for (const certificate& c : r.certs)
      if (c.bound != 0.0 || c.beta != 0.0) return std::string("UNEXPECTED bound not 0");
    return s.summarize(r, idx, s.cache) + "; output 0, beta and bound 0";
  });
  add(ag, "all keys equal", [] {
    setting s;
    for (std::size_t t = 1; t < s.n; ++t)
      std::copy_n(s.cache.keys.begin(), s.d, s.cache.keys.begin() + std::ptrdiff_t(t * s.d));
    return s.attend();
  });
  add(ag, "all keys zero", [] {
    setting s;
    std::fill(s.cache.keys.begin(), s.cache.keys.end(), half(0.0f));
    return s.attend();
  });
  add(ag, "query all zero", [] {
    setting s;
    std::fill(s.q.begin(), s.q.end(), 0.0f);
    return s.attend();
  });
  add(ag, "softmax_scale = 1e25 (one-hot attention)", with_query(0, 1.0f, 1e25));
  add(ag, "fp16 keys of +-65504", [] {
    setting s;
    for (std::size_t i = 0; i < s.cache.keys.size(); ++i)
      s.cache.keys[i] = half(gauss(9, i) > 0 ? 65504.0f : -65504.0f);
    for (float& x : s.q) x *= 1e-4f;
    return s.attend();
  });
  add(ag, "subnormal fp16 keys and values (~1e-6)", [] {
    setting s;
    for (std::size_t i = 0; i < s.cache.keys.size(); ++i) {
      s.cache.keys[i] = half(float(1e-6 * gauss(10, i)));
      s.cache.values[i] = half(float(1e-7 * gauss(11, i)));
    }
    return s.attend();
  });
  add(ag, "one value 2000x the others (exact set)", [] {
    setting s;
    for (std::size_t i = 0; i < s.d; ++i) s.cache.values[17 * s.d + i] = half(4000.0f);
    return s.attend();
  });
  add(ag, "options.epsilon = 1e300", with_options([](options& o) { o.epsilon = 1e300; }));
  add(ag, "options.epsilon = 1e-300", with_options([](options& o) { o.epsilon = 1e-300; }));
  add(ag, "options.delta = 1e-300", with_options([](options& o) { o.delta = 1e-300; }));
  add(ag, "options.delta = 4.9e-324 (subnormal)",
      with_options([](options& o) { o.delta = std::numeric_limits<double>::denorm_min(); }));
  add(ag, "options.max_levels = 0", with_options([](options& o) { o.max_levels = 0; }));
  add(ag, "options.grid_ratio = 64, max_levels = 254, classic certificate",
      with_options([](options& o) {
        o.grid_ratio = 64;
        o.max_levels = 254;
        o.certificate = certificate_kind::kClassic;
      }));
  add(ag, "options.grid_ratio = 64, max_levels = 254, tight certificate (638 levels)",
      with_options([](options& o) {
        o.grid_ratio = 64;
        o.max_levels = 254;
      }));
  add(ag, "options.grid_top = -1", with_options([](options& o) { o.grid_top = -1; }));
  add(ag, "options.grid_top = 65", with_options([](options& o) { o.grid_top = 65; }));
  add(ag, "options.grid_top = 64, grid_ratio = 1", with_options([](options& o) {
        o.grid_top = 64;
        o.grid_ratio = 1;
      }));
  add(ag, "options.certificate = 7", with_options([](options& o) {
        o.certificate = static_cast<certificate_kind>(7);
      }));
  add(ag, "seed and step = 2^64 - 1", [] {
    setting s;
    s.opt.seed = ~std::uint64_t(0);
    s.nk.step = ~std::uint64_t(0);
    s.nk.kv_head = ~std::uint32_t(0);
    return s.attend();
  });
  add(ag, "workspace larger than needed (group 8, 4096 tokens)", [] {
    setting s;
    key_index idx = s.index();
    attend_workspace ws(8, s.d, 4096);
    ws.record_samples(true);
    test::group_run r;
    r.out.resize(s.group * s.d);
    r.certs.resize(s.group);
    attend_group(std::span<const float>(s.q), s.group, s.cache.view(), idx, s.nk, s.opt,
                 std::span<float>(r.out), std::span<certificate>(r.certs), ws);
    r.stats = ws.last_stats();
    for (std::size_t g = 0; g < s.group; ++g) {
      const auto sm = ws.samples(g);
      r.samples.emplace_back(sm.begin(), sm.end());
    }
    return s.summarize(r, idx, s.cache);
  });
  add(ag, "float values of +-3e38", [] {
    setting s;
    head_cache<float> f(s.n, s.d, [](std::size_t t, std::size_t i) { return gauss(1, t * 100 + i); },
                        [](std::size_t t, std::size_t i) { return gauss(2, t * 100 + i) > 0 ? 3e38 : -3e38; });
    key_index idx(s.d);
    idx.build(f.view());
    return s.summarize(test::run_group(f.view(), idx, s.q, s.group, s.opt, s.nk), idx, f);
  });
  return c;
}

std::string escape_cell(std::string s) {
  std::string out;
  for (char ch : s) {
    if (ch == '|') out += '\\';
    out += ch;
  }
  return out;
}

/// Runs every case; one markdown row each.
std::vector<std::string> table_rows() {
  std::vector<std::string> rows;
  for (const robustness_case& c : cases()) {
    std::string outcome;
    try {
      outcome = c.run();
    } catch (const certattn::error& e) {
      outcome = std::string("`certattn::error`: ") + e.what();
    } catch (const std::exception& e) {
      outcome = std::string("UNEXPECTED exception: ") + e.what();
    }
    rows.push_back("| `" + c.entry + "` | " + escape_cell(c.input) + " | " + escape_cell(outcome) +
                   " |");
  }
  return rows;
}

std::filesystem::path doc_path() {
  return std::filesystem::path(__FILE__).parent_path().parent_path() / "docs" / "robustness.md";
}

TEST(Robustness, EveryInputThrowsOrGivesADefinedResult) {
  const std::vector<std::string> rows = table_rows();
  if (std::getenv("CERTATTN_PRINT_ROBUSTNESS") != nullptr)
    for (const std::string& r : rows) std::printf("%s\n", r.c_str());
  for (const std::string& r : rows) EXPECT_EQ(r.find("UNEXPECTED"), std::string::npos) << r;
}

TEST(Robustness, DocTableListsEveryCaseWithItsOutcome) {
  std::ifstream f(doc_path());
  ASSERT_TRUE(f.good()) << "cannot read " << doc_path();
  std::vector<std::string> doc;
  bool inside = false;
  for (std::string line; std::getline(f, line);) {
    if (line.find("<!-- robustness:begin -->") != std::string::npos) {
      inside = true;
      continue;
    }
    if (line.find("<!-- robustness:end -->") != std::string::npos) break;
    if (inside && line.rfind("| `", 0) == 0) doc.push_back(line);
  }
  const std::vector<std::string> rows = table_rows();
  std::string missing, stale;
  for (const std::string& r : rows)
    if (std::find(doc.begin(), doc.end(), r) == doc.end()) missing += r + "\n";
  for (const std::string& r : doc)
    if (std::find(rows.begin(), rows.end(), r) == rows.end()) stale += r + "\n";
  EXPECT_EQ(missing, "") << "rows the doc lacks (regenerate with CERTATTN_PRINT_ROBUSTNESS=1)";
  EXPECT_EQ(stale, "") << "rows of the doc no case produces";
  EXPECT_EQ(doc.size(), rows.size());
}

}  // namespace
