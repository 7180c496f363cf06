// Fuzz target: key index build + appends and the certified call, with random shapes
// (tokens, head_dim, group, window, row padding), element types, options, instruction
// sets and values (NaN, Inf, subnormals, huge, tiny). Every call must either throw
// certattn::error exactly when the input is bad, or return finite outputs and finite
// certificate fields that agree with reference_attend (same level, same samples token by
// token, same certificate, outputs within float rounding and inside the values' range).
#include <certattn/attend.hpp>
#include <certattn/reference.hpp>
#include <certattn/exact.hpp>

#include "../support/harness.hpp"
#include "fuzz_common.hpp"

#include <algorithm>
#include <string>

namespace {

using namespace certattn;

bool options_valid(const options& o) {
  try {
    validate(o);
    return true;
  } catch (const certattn::error&) {
    return false;
  }
}

template <storage_element T>
void run(fuzz::reader& r) {
  static constexpr std::size_t kDims[] = {1, 2, 3, 5, 7, 8, 9, 12, 15, 16, 17, 20, 24, 31, 32, 33,
                                          40, 48, 64, 72, 100, 128, 136};
  const std::size_t d = r.pick_from(kDims);
  std::size_t n = 1 + r.u16() % 700;
  if (r.flag()) n = 1 + n % 140;  // small caches often
  const std::size_t stride = d + (r.flag() ? r.pick(9) : 0);
  const std::size_t group = 1 + r.pick(4);

  options opt;
  static constexpr double kEps[] = {0.1, 0.1, 0.05, 0.01, 0.3, 1.0, 1e-4, 1e-300, 1e300, 0.0};
  static constexpr double kDelta[] = {0.05, 0.05, 0.2, 1e-3, 0.9, 1e-300, 4.9e-324, 1.0};
  static constexpr double kScale[] = {0.0, 0.0, 0.0, 1e-30, 1e-3, 0.1, 1.0, 10.0, 1e3, 1e10,
                                      1e25, 1e31, 1e300, -1.0};
  static constexpr int kGrid[] = {2, 2, 1, 3, 4, 8, 64, 0};
  static constexpr int kLevels[] = {32, 32, 0, 1, 5, 16, 64, 254, -1};
  opt.epsilon = r.pick_from(kEps);
  opt.delta = r.pick_from(kDelta);
  opt.softmax_scale = r.pick_from(kScale);
  opt.grid_ratio = r.pick_from(kGrid);
  opt.max_levels = r.pick_from(kLevels);
  opt.scale = error_scale(r.pick(3));
  static constexpr std::size_t kWindows[] = {64, 64, 0, 1, 2, 16, 63, 65};
  opt.window = r.pick_from(kWindows);
  if (r.flag()) opt.window = std::min<std::size_t>(opt.window, n);
  opt.seed = r.u64();
  // Both certificates, from a bit already drawn (the seed corpus keeps its meaning).
  opt.certificate = opt.seed & 1 ? certificate_kind::kClassic : certificate_kind::kTight;
  const noise_key nk{r.u64(), std::uint32_t(r.u16()), std::uint32_t(r.byte())};
  const isa arch = isa(r.pick(3));
  const std::size_t n0 = r.flag() ? n : r.u16() % (n + 1);  // build prefix, then appends

  test::head_cache<T> c(n, d, stride);
  const std::vector<double> kv = fuzz::values(r, n * d), vv = fuzz::values(r, n * d);
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t i = 0; i < d; ++i) {
      c.keys[t * stride + i] = fuzz::store<T>(kv[t * d + i]);
      c.values[t * stride + i] = fuzz::store<T>(vv[t * d + i]);
    }
  const std::vector<double> qd = fuzz::values(r, group * d);
  std::vector<float> q(group * d);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = fuzz::to_float_sat(qd[i]);

  // Which input is bad, found independently of the library.
  std::size_t first_bad_row = n;
  for (std::size_t t = 0; t < n && first_bad_row == n; ++t)
    for (std::size_t i = 0; i < d; ++i)
      if (!std::isfinite(float(c.keys[t * stride + i])) ||
          !std::isfinite(float(c.values[t * stride + i]))) {
        first_bad_row = t;
        break;
      }

  key_index idx(d);
  try {
    idx.build(c.view(n0));
    for (std::size_t t = n0; t < n; ++t) idx.append(c.view(), t);
  } catch (const certattn::error& e) {
    const std::string m = e.what();
    FUZZ_CHECK(first_bad_row < n, "index refused a finite cache: %s", e.what());
    FUZZ_CHECK(m.find("token " + std::to_string(first_bad_row) + " has a NaN or Inf") !=
                   std::string::npos,
               "index error names the wrong token (first bad %zu): %s", first_bad_row, e.what());
    return;
  }
  FUZZ_CHECK(first_bad_row == n, "index accepted a NaN/Inf at token %zu", first_bad_row);
  FUZZ_CHECK(idx.size() == n, "index size %zu, expected %zu", idx.size(), n);

  bool queries_finite = true;
  double worst = 0.0;
  const double scale = std::max(1.0, opt.effective_softmax_scale(d));
  for (std::size_t g = 0; g < group; ++g) {
    double l1 = 0.0;
    for (std::size_t i = 0; i < d; ++i) {
      queries_finite &= std::isfinite(q[g * d + i]);
      l1 += std::fabs(double(q[g * d + i]));
    }
    worst = std::max(worst, l1 * double(idx.max_abs_key()) * scale);
  }
  const bool legal = options_valid(opt) && opt.total_levels() <= 254 && opt.window <= 64 &&
                     queries_finite && worst <= 0x1p100;

  set_isa_cap(arch);
  test::group_run run;
  try {
    run = test::run_group(c.view(), idx, q, group, opt, nk);
  } catch (const certattn::error& e) {
    set_isa_cap(isa::kAvx512Vnni);
    FUZZ_CHECK(!legal, "a legal call threw: %s", e.what());
    return;
  }
  set_isa_cap(isa::kAvx512Vnni);
  FUZZ_CHECK(legal, "an illegal call returned (n %zu, window %zu)", n, opt.window);

  // The output is a convex combination of values (window, heavy and light keys all enter
  // with positive weights): each channel lies within the values' range.
  for (std::size_t g = 0; g < group; ++g) {
    FUZZ_CHECK(test::certificate_finite(run.certs[g]),
               "head %zu: non-finite certificate (bound %g beta %g scale %g D %g)", g,
               run.certs[g].bound, run.certs[g].beta, run.certs[g].scale_value,
               run.certs[g].denominator);
    if (run.certs[g].certified && !run.certs[g].exact)
      FUZZ_CHECK(run.certs[g].bound <= opt.epsilon, "head %zu certified with bound %g > eps %g",
                 g, run.certs[g].bound, opt.epsilon);
    for (std::size_t i = 0; i < d; ++i) {
      double lo = INFINITY, hi = -INFINITY;
      for (std::size_t t = 0; t < n; ++t) {
        const double v = double(float(c.values[t * stride + i]));
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
      const double o = double(run.out[g * d + i]);
      const double slack = 1e-5 * std::max(std::fabs(lo), std::fabs(hi)) + 1e-44;
      FUZZ_CHECK(std::isfinite(o) && o >= lo - slack && o <= hi + slack,
                 "head %zu channel %zu: output %g outside [%g, %g]", g, i, o, lo, hi);
    }
  }
  // Head by head, against the reference of the whole group call (routing decisions
  // depend on the earlier heads). The exact answers run the float dense kernel when their
  // scores lie within +-1024: exact to float accuracy there, so such heads are held to 1e-3.
  std::string diff;
  if (run.stats.bound_violations != 0) diff = "bound violations";
  std::vector<reference_result> refs;
  try {
    refs = test::reference_group(c.key_matrix(n), c.value_matrix(n), idx, q, group, opt, nk);
  } catch (const certattn::error& e) {
    FUZZ_CHECK(false, "the reference threw where the fast path did not: %s", e.what());
  }
  const double vmax = test::max_abs_value(c.value_matrix(n));
  for (std::size_t g = 0; g < group && diff.empty(); ++g) {
    diff = test::compare_head<T>(refs[g], run, g, d, vmax, opt);
    if (diff.empty() || !run.certs[g].exact || run.certs[g].certified) continue;
    const std::vector<float> qg(q.begin() + std::ptrdiff_t(g * d), q.begin() + std::ptrdiff_t((g + 1) * d));
    const auto ex = exact_attention(std::span<const float>(qg), c.key_matrix(n), c.value_matrix(n),
                                    opt.softmax_scale);
    double err = 0.0, norm = 0.0;
    for (std::size_t i = 0; i < d; ++i) {
      err = std::max(err, std::fabs(double(run.out[g * d + i]) - ex.output[i]));
      norm = std::max(norm, std::fabs(ex.output[i]));
    }
    const double den = run.certs[g].denominator * std::exp(run.certs[g].max_score - ex.max_score);
    if (run.certs[g].path == refs[g].cert.path && std::fabs(run.certs[g].max_score) <= 1024.0 &&
        err <= 1e-3 * norm + 1e-6 * vmax + 1e-40 && std::fabs(den - ex.denominator) <= 1e-3 * ex.denominator)
      diff.clear();
    else
      diff = diff + " (fallback error " + std::to_string(err) + ")";
  }
  FUZZ_CHECK(diff.empty(), "differs from the reference (%s, n %zu, d %zu, G %zu, window %zu, %s): %s",
             std::string(to_string(arch)).c_str(), n, d, group, opt.window,
             std::string(to_string(opt.scale)).c_str(), diff.c_str());
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
