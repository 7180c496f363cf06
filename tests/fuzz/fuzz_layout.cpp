// Fuzz target: the layout adapters (nhd_view, hnd_view, strided_kv, paged_kv) with random
// strides, head offsets, page sizes and block tables (permuted, repeated pages), and
// random invalid parameters. A constructor must throw certattn::error exactly when a
// parameter is invalid; a valid view must address the rows the layout defines (buffers are
// sized exactly, so ASan sees any read past them), and the index and the certified call
// on the view must give the same bits as on a dense copy of the same head.
#include <certattn/attend.hpp>

#include "../support/harness.hpp"
#include "fuzz_common.hpp"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

namespace {

using namespace certattn;

/// The index, then the call, on the view and on a dense copy: the same bits.
template <storage_element T, class View>
void check_view(const View& view, std::size_t n, std::size_t d, fuzz::reader& r,
                const std::vector<const T*>& key_rows, const std::vector<const T*>& value_rows) {
  FUZZ_CHECK(view.size() == n && view.head_dim() == d, "shape");
  for (std::size_t t = 0; t < n; ++t) {
    FUZZ_CHECK(view.key(t) == key_rows[t], "key row %zu at the wrong address", t);
    FUZZ_CHECK(view.value(t) == value_rows[t], "value row %zu at the wrong address", t);
  }
  test::head_cache<T> dense(n, d);
  for (std::size_t t = 0; t < n; ++t) {
    std::copy_n(view.key(t), d, dense.keys.begin() + std::ptrdiff_t(t * d));
    std::copy_n(view.value(t), d, dense.values.begin() + std::ptrdiff_t(t * d));
  }
  key_index a(d), b(d);
  const std::size_t n0 = r.u16() % (n + 1);
  a.build(view.prefix(n0));
  b.build(dense.view(n0));
  for (std::size_t t = n0; t < n; ++t) {
    a.append(view, t);
    b.append(dense.view(), t);
  }
  FUZZ_CHECK(a.size() == n && b.size() == n, "sizes");
  const std::size_t dp = a.padded_dim();
  for (std::size_t blk = 0; blk < a.blocks(); ++blk) {
    FUZZ_CHECK(std::memcmp(a.block_lo(blk), b.block_lo(blk), certattn::key_index::kScaleRows * dp * sizeof(float)) == 0,
               "block %zu scales differ", blk);
    FUZZ_CHECK(std::memcmp(a.block_codes4(blk), b.block_codes4(blk), a.block_code4_bytes()) == 0,
               "block %zu 4-bit codes differ", blk);
  }
  for (std::size_t t = 0; t < n; ++t)
    FUZZ_CHECK(std::memcmp(a.codes8_low(t), b.codes8_low(t), a.low8_bytes()) == 0, "token %zu 8-bit codes differ", t);
  const auto ca = a.value_center(), cb = b.value_center();
  FUZZ_CHECK(ca.size() == cb.size() && std::equal(ca.begin(), ca.end(), cb.begin()),
             "value centres differ");
  const auto xa = a.exact_tokens(), xb = b.exact_tokens();
  FUZZ_CHECK(xa.size() == xb.size() && std::equal(xa.begin(), xa.end(), xb.begin()),
             "exact sets differ");
  const float cap_a = a.value_cap(), cap_b = b.value_cap();
  FUZZ_CHECK(std::memcmp(&cap_a, &cap_b, sizeof(float)) == 0, "value caps differ");
  const float floor_a = a.reach_floor(), floor_b = b.reach_floor();
  FUZZ_CHECK(std::memcmp(&floor_a, &floor_b, sizeof(float)) == 0, "reach floors differ");
  if (n == 0) return;

  options opt;
  opt.window = std::min<std::size_t>(n, r.pick(65));
  opt.seed = r.u64();
  const std::size_t group = 1 + r.pick(3);
  std::vector<float> q(group * d);
  fuzz::stream s(r.u64());
  for (float& x : q) x = float(2.0 * s.normal());
  const noise_key nk{r.u64(), 0, 0};
  const auto va = test::run_group(view, a, q, group, opt, nk);
  const auto vb = test::run_group(dense.view(), b, q, group, opt, nk);
  FUZZ_CHECK(std::memcmp(va.out.data(), vb.out.data(), va.out.size() * sizeof(float)) == 0,
             "outputs differ between the view and its dense copy");
  for (std::size_t g = 0; g < group; ++g) {
    const certificate &x = va.certs[g], &y = vb.certs[g];
    FUZZ_CHECK(x.level == y.level && x.certified == y.certified && x.exact == y.exact &&
                   x.heavy == y.heavy && x.sampled == y.sampled &&
                   std::memcmp(&x.beta, &y.beta, sizeof(double)) == 0 &&
                   std::memcmp(&x.denominator, &y.denominator, sizeof(double)) == 0 &&
                   x.keys_read == y.keys_read,
               "head %zu: certificates differ between the view and its dense copy", g);
  }
}

template <storage_element T>
void run(fuzz::reader& r) {
  static constexpr std::size_t kDims[] = {1, 4, 7, 8, 16, 20, 32, 64};
  const std::size_t d = r.pick_from(kDims);
  const std::size_t n = r.u16() % 300;
  const std::size_t heads = 1 + r.pick(4);
  std::size_t head = r.pick(heads);
  const int kind = int(r.pick(4));
  const bool spoil = r.pick(4) == 0;  // one parameter made invalid
  const std::uint8_t what = r.byte();
  fuzz::stream s(r.u64());
  auto fill = [&](std::vector<T>& v) {
    for (auto& x : v) x = fuzz::store<T>(s.normal());
  };
  std::vector<const T*> krow(n), vrow(n);

  if (kind == 0 || kind == 1) {  // nhd_view / hnd_view
    const std::size_t capacity = kind == 1 ? n + r.pick(5) : n;
    std::size_t n_view = n;
    if (spoil) {
      if (what % 2 == 0) head = heads + what % 3;
      else if (kind == 1) n_view = capacity + 1 + what % 4;
      else head = heads;
    }
    std::vector<T> k(std::max<std::size_t>(1, capacity * heads * d)),
        v(std::max<std::size_t>(1, capacity * heads * d));
    fill(k);
    fill(v);
    std::optional<strided_kv<T>> view;
    try {
      view = kind == 0 ? nhd_view(k.data(), v.data(), n_view, heads, d, head)
                       : hnd_view(k.data(), v.data(), n_view, capacity, heads, d, head);
    } catch (const certattn::error& e) {
      FUZZ_CHECK(spoil, "a valid %s view threw: %s", kind == 0 ? "nhd" : "hnd", e.what());
      return;
    }
    FUZZ_CHECK(!spoil, "an invalid %s view was accepted", kind == 0 ? "nhd" : "hnd");
    for (std::size_t t = 0; t < n; ++t) {
      const std::size_t off = kind == 0 ? (t * heads + head) * d : (head * capacity + t) * d;
      krow[t] = k.data() + off;
      vrow[t] = v.data() + off;
    }
    check_view<T>(*view, n, d, r, krow, vrow);
  } else if (kind == 2) {  // strided_kv with its own strides
    std::size_t ks = d + r.pick(6), vs = d + r.pick(6);
    bool null_ptr = false;
    if (spoil) {
      if (what % 3 == 0) ks = what % d;
      else if (what % 3 == 1) vs = what % d;
      else null_ptr = true;
    }
    const bool invalid = (n > 1 && (ks < d || vs < d)) || (n > 0 && null_ptr);
    std::vector<T> k(std::max<std::size_t>(1, n == 0 ? 1 : (n - 1) * ks + d)),
        v(std::max<std::size_t>(1, n == 0 ? 1 : (n - 1) * vs + d));
    fill(k);
    fill(v);
    std::optional<strided_kv<T>> view;
    try {
      view.emplace(null_ptr ? nullptr : k.data(), v.data(), n, d, ks, vs);
    } catch (const certattn::error& e) {
      FUZZ_CHECK(invalid, "a valid strided_kv threw: %s", e.what());
      return;
    }
    FUZZ_CHECK(!invalid, "an invalid strided_kv was accepted (ks %zu vs %zu d %zu n %zu)", ks, vs,
               d, n);
    for (std::size_t t = 0; t < n; ++t) {
      krow[t] = k.data() + t * ks;
      vrow[t] = v.data() + t * vs;
    }
    check_view<T>(*view, n, d, r, krow, vrow);
  } else {  // paged_kv
    std::size_t page = 1 + r.pick(33);
    const std::size_t pages_needed = (n + page - 1) / page;
    const std::size_t pool_pages = pages_needed + r.pick(4) + 1;
    // Rows of this head within a page: head_offset + slot * token_stride + [0, d).
    const bool head_major = r.flag();  // FlashInfer HND pages, else vLLM NHD pages
    const std::size_t pad = r.pick(5);
    std::size_t token_stride = head_major ? d + pad : heads * d + pad;
    const std::size_t head_offset = head_major ? head * page * (d + pad) : head * d;
    const std::size_t page_stride =
        (head_major ? heads * page * (d + pad) : page * token_stride) + r.pick(7);
    std::vector<std::int32_t> table(pages_needed + r.pick(3));
    for (std::size_t i = 0; i < table.size(); ++i)
      table[i] = std::int32_t(r.pick(2) ? (i * 7 + 3) % pool_pages : r.pick(pool_pages));
    bool null_ptr = false;
    if (spoil) {
      switch (what % 4) {
        case 0: page = 0; break;
        case 1:
          if (!table.empty()) table[what % table.size()] = -1 - std::int32_t(what % 5);
          break;
        case 2:
          if (!table.empty()) table.resize(table.size() - 1 - what % table.size());
          break;
        default: null_ptr = true; break;
      }
      if (what % 8 == 7) token_stride = what % d;
    }
    bool invalid = page == 0 || (n > 0 && null_ptr) || table.size() * page < n ||
                   (token_stride < d && page > 1);
    for (std::size_t p = 0; !invalid && p * page < n; ++p) invalid = table[p] < 0;
    const std::size_t pool = pool_pages * page_stride + 1;
    std::vector<T> k(pool), v(pool);
    fill(k);
    fill(v);
    std::optional<paged_kv<T>> view;
    try {
      view.emplace(null_ptr ? nullptr : k.data(), v.data(), std::span<const std::int32_t>(table),
                   n, page, d, page_stride, token_stride, head_offset);
    } catch (const certattn::error& e) {
      FUZZ_CHECK(invalid, "a valid paged_kv threw: %s", e.what());
      return;
    }
    FUZZ_CHECK(!invalid, "an invalid paged_kv was accepted");
    for (std::size_t t = 0; t < n; ++t) {
      const std::size_t off =
          std::size_t(table[t / page]) * page_stride + head_offset + (t % page) * token_stride;
      FUZZ_CHECK(off + d <= pool, "the test laid out a row past the pool");
      krow[t] = k.data() + off;
      vrow[t] = v.data() + off;
    }
    check_view<T>(*view, n, d, r, krow, vrow);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  certattn::fuzz::reader r(data, size);
  switch (r.pick(3)) {
    case 0: run<certattn::half>(r); break;
    case 1: run<certattn::bfloat16>(r); break;
    default: run<float>(r); break;
  }
  return 0;
}
