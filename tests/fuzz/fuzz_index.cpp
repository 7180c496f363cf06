// Fuzz target: the key index under random builds and appends (random split points, tokens
// that widen a block's ranges, huge/tiny/subnormal keys) and the 4-bit score-bound scan.
// Checks the index's invariants directly: every 4-bit code brackets its key
// (lo + st (q) <= k <= lo + st (q + 1), in double), the value radius covers every pool token
// outside the exact set, the exact set is sorted and in range, a refused build or append
// leaves the index unchanged, and the scan's bounds u_t >= s_t for random queries, with
// the same bits on every instruction set.
#include <certattn/exact.hpp>
#include <certattn/index.hpp>
#include <certattn/scan.hpp>

#include "../support/harness.hpp"
#include "fuzz_common.hpp"

#include <algorithm>
#include <cstring>
#include <string>

namespace {

using namespace certattn;

template <storage_element T>
void check_index(const key_index& idx, const test::head_cache<T>& c, std::size_t n) {
  const std::size_t d = c.d;
  FUZZ_CHECK(idx.size() == n, "size %zu != %zu", idx.size(), n);
  FUZZ_CHECK(idx.blocks() == (n + 127) / 128, "blocks");
  for (std::size_t t = 0; t < n; ++t) {
    const std::size_t b = t / key_index::kBlockTokens;
    for (std::size_t i = 0; i < d; ++i) {
      const double k = double(float(c.keys[t * c.stride + i]));
      const double lo = idx.block_lo(b)[i], st = idx.block_step4(b)[i];
      const unsigned q = idx.code4(t, i);
      FUZZ_CHECK(q <= 15, "code %u", q);
      FUZZ_CHECK(lo + st * q <= k && k <= lo + st * (q + 1.0),
                 "token %zu channel %zu: k %.9g outside [%.9g, %.9g] (code %u)", t, i, k,
                 lo + st * q, lo + st * (q + 1.0), q);
    }
  }
  // The exact set: sorted, in range; the radius covers the rest of any pool prefix.
  const auto xs = idx.exact_tokens();
  for (std::size_t i = 0; i < xs.size(); ++i) {
    FUZZ_CHECK(xs[i] < n, "exact token %u >= %zu", xs[i], n);
    FUZZ_CHECK(i == 0 || xs[i - 1] < xs[i], "exact set not increasing");
  }
  const auto center = idx.value_center();
  FUZZ_CHECK(center.size() == d || n == 0, "centre size");
  for (std::size_t pool_end : {n / 3, n / 2, n > 64 ? n - 64 : 0, n}) {
    const double base = idx.value_radius_base(pool_end);
    for (std::size_t t = 0; t < pool_end; ++t) {
      if (std::binary_search(xs.begin(), xs.end(), std::uint32_t(t))) continue;
      double s = 0.0;
      for (std::size_t i = 0; i < d; ++i) {
        const double x = double(float(c.values[t * c.stride + i])) - double(center[i]);
        s += x * x;
      }
      FUZZ_CHECK(std::sqrt(s) <= base, "pool_end %zu token %zu: ||v - g|| %.9g > base %.9g",
                 pool_end, t, std::sqrt(s), base);
    }
  }
  // Value-aware sampling: a finite floor (0 when every finite distance was 0 when it was
  // fixed); every finite distance within the pool maximum and its reach, the others listed
  // as overflow;
  // the float offsets at or above the exact ones.
  const float floor = idx.reach_floor();
  FUZZ_CHECK(floor >= 0.0f && std::isfinite(floor), "reach floor %.9g", double(floor));
  const auto over = idx.overflow_tokens();
  for (std::size_t pool_end : {n / 2, n}) {
    const double dmax = idx.value_distance_max(pool_end);
    for (std::size_t t = 0; t < pool_end; ++t) {
      const float dist = idx.value_distance(t);
      FUZZ_CHECK(std::isfinite(dist) != std::binary_search(over.begin(), over.end(), std::uint32_t(t)),
                 "token %zu: distance %.9g and its overflow listing disagree", t, double(dist));
      if (!std::isfinite(dist)) continue;
      FUZZ_CHECK(double(dist) <= dmax, "token %zu: distance %.9g > pool maximum %.9g", t,
                 double(dist), dmax);
      FUZZ_CHECK(key_reach(dist, floor) >= double(dist), "token %zu: reach below distance", t);
      const double off = sampling_offset(dist, floor);
      const float up = idx.sampling_offsets_upper()[t];
      FUZZ_CHECK((double(up) >= off || (std::isinf(off) && up == kMaxOffsetUpper)) && off >= 0.0,
                 "token %zu: offset bound %.9g below %.9g", t, double(up), off);
    }
  }
}

template <storage_element T>
void check_scan(const key_index& idx, const test::head_cache<T>& c, std::size_t n,
                fuzz::reader& r) {
  const std::size_t d = c.d, dp = idx.padded_dim(), nq = 1 + r.pick(4);
  const std::size_t pool_end = n - std::min<std::size_t>(n, r.pick(70));
  if (pool_end == 0) return;
  static constexpr double kScales[] = {0.0, 1e-3, 1.0, 1e4, 1e12};
  double scale = r.pick_from(kScales);
  if (scale == 0.0) scale = 1.0 / std::sqrt(double(d));
  const std::vector<double> qd = fuzz::values(r, nq * d);
  std::vector<float> q(nq * dp, 0.0f);
  double worst = 0.0;
  for (std::size_t g = 0; g < nq; ++g) {
    double l1 = 0.0;
    for (std::size_t i = 0; i < d; ++i) {
      float x = fuzz::to_float_sat(qd[g * d + i]);
      if (!std::isfinite(x)) x = 1.0f;  // the call refuses these before scanning
      q[g * dp + i] = x;
      l1 += std::fabs(double(x));
    }
    worst = std::max(worst, l1 * double(idx.max_abs_key()) * std::max(1.0, scale));
  }
  if (!(worst <= 0x1p100)) return;  // refused by attend_group before scanning
  const std::size_t blocks = (pool_end + 127) / 128, stride = blocks * 128;
  std::vector<float> u[3];
  for (int a = 0; a < 3; ++a) {
    if (a > int(detected_isa())) continue;
    u[a].assign(nq * stride + 16, 0.0f);
    std::vector<float> block_max(nq * blocks);
    std::vector<std::int8_t> qa(scan_query_bytes(nq, dp));
    std::vector<detail::block_query_prep> prep(nq);
    scan_request req;
    req.index = &idx;
    req.queries = q.data();
    req.nq = nq;
    req.softmax_scale = scale;
    req.pool_end = pool_end;
    req.u = u[a].data();
    req.u_stride = stride;
    req.block_max = block_max.data();
    req.block_stride = blocks;
    req.qa = qa.data();
    req.prep = prep.data();
    scan_score_bounds(req, isa(a));
  }
  for (std::size_t g = 0; g < nq; ++g)
    for (std::size_t t = 0; t < pool_end; ++t) {
      const double s = scale * detail::score_dot(q.data() + g * dp, c.keys.data() + t * c.stride, d);
      const float ub = u[0][g * stride + t];
      FUZZ_CHECK(double(ub) >= s, "query %zu token %zu: bound %.9g < score %.9g", g, t,
                 double(ub), s);
      for (int a = 1; a < 3; ++a)
        if (!u[a].empty())
          FUZZ_CHECK(std::memcmp(&u[a][g * stride + t], &ub, sizeof(float)) == 0,
                     "%s bound %.9g != scalar %.9g (query %zu token %zu)",
                     std::string(to_string(isa(a))).c_str(), double(u[a][g * stride + t]),
                     double(ub), g, t);
    }
}

template <storage_element T>
void run(fuzz::reader& r) {
  static constexpr std::size_t kDims[] = {1, 3, 7, 8, 12, 16, 17, 24, 32, 40, 64, 72, 100, 128};
  const std::size_t d = r.pick_from(kDims);
  const std::size_t n = r.u16() % 600;
  test::head_cache<T> c(n, d, d + (r.flag() ? r.pick(5) : 0));
  const std::vector<double> kv = fuzz::values(r, n * d), vv = fuzz::values(r, n * d);
  // Later tokens may grow (appends that widen a block's ranges and re-encode it).
  const double growth = r.flag() ? 1.0 + double(r.byte()) / 16.0 : 1.0;
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t i = 0; i < d; ++i) {
      const double g = std::pow(growth, double(t % 128) / 32.0);
      c.keys[t * c.stride + i] = fuzz::store<T>(kv[t * d + i] * g);
      c.values[t * c.stride + i] = fuzz::store<T>(vv[t * d + i]);
    }
  std::size_t first_bad = n;
  for (std::size_t t = 0; t < n && first_bad == n; ++t)
    for (std::size_t i = 0; i < d; ++i)
      if (!std::isfinite(float(c.keys[t * c.stride + i])) ||
          !std::isfinite(float(c.values[t * c.stride + i])))
        first_bad = t;

  key_index idx(d);
  const std::size_t n0 = r.u16() % (n + 1);
  try {
    idx.build(c.view(n0));
    FUZZ_CHECK(first_bad >= n0, "build accepted a NaN/Inf at token %zu", first_bad);
  } catch (const certattn::error& e) {
    FUZZ_CHECK(first_bad < n0 && std::string(e.what()).find("token " + std::to_string(first_bad)) !=
                                     std::string::npos,
               "build: %s (first bad token %zu)", e.what(), first_bad);
    return;
  }
  for (std::size_t t = n0; t < n; ++t) {
    try {
      idx.append(c.view(), t);
      FUZZ_CHECK(first_bad != t, "append accepted a NaN/Inf at token %zu", t);
    } catch (const certattn::error& e) {
      FUZZ_CHECK(first_bad == t, "append %zu: %s", t, e.what());
      FUZZ_CHECK(idx.size() == t, "a refused append changed the size");
      check_index(idx, c, t);  // unchanged and still valid
      return;
    }
  }
  check_index(idx, c, n);
  check_scan(idx, c, n, r);
  // A build over everything (the other path to the same tokens) satisfies the same.
  key_index fresh(d);
  fresh.build(c.view());
  check_index(fresh, c, n);
  // Rollback to a point between the build and the end: the codes of a build on the kept
  // prefix, a valid index, and one that grows back to a valid index.
  const std::size_t kept = n0 + (n - n0) / 2;
  idx.truncate(c.view(), kept);
  check_index(idx, c, kept);
  key_index prefix(d);
  prefix.build(c.view(kept));
  const std::size_t dp = idx.padded_dim();
  for (std::size_t b = 0; b < idx.blocks(); ++b) {
    FUZZ_CHECK(std::memcmp(idx.block_codes4(b), prefix.block_codes4(b), idx.block_code4_bytes()) == 0,
               "truncate to %zu: block %zu 4-bit codes differ from a build", kept, b);
    FUZZ_CHECK(std::memcmp(idx.block_lo(b), prefix.block_lo(b), certattn::key_index::kScaleRows * dp * sizeof(float)) == 0,
               "truncate to %zu: block %zu scales differ from a build", kept, b);
  }
  for (std::size_t t = 0; t < kept; ++t)
    FUZZ_CHECK(std::memcmp(idx.codes8_low(t), prefix.codes8_low(t), idx.low8_bytes()) == 0,
               "truncate to %zu: token %zu 8-bit codes differ from a build", kept, t);
  idx.append_range(c.view(), kept, n - kept);
  check_index(idx, c, n);
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
