// The program both packaging tests build (find_package and add_subdirectory): a user's
// first contact with the public API. It runs the reference certified estimator on a
// small random fp16 cache, compares its output with exact attention and fails when the
// error exceeds what the certificate promises.
#include <certattn/certattn.hpp>
#include <certattn/reference.hpp>
#include <certattn/exact.hpp>

#include <cmath>
#include <cstdio>
#include <random>
#include <span>
#include <string>
#include <vector>

int main() {
  constexpr std::size_t n = 4096, d = 64;
  std::mt19937_64 rng(20260101);
  std::normal_distribution<float> gauss(0.0f, 1.0f);

  // A cache with a few strong keys over a diffuse background, as real heads have.
  std::vector<float> q(d);
  for (float& x : q) x = gauss(rng);
  std::vector<certattn::half> keys(n * d), values(n * d);
  for (std::size_t t = 0; t < n; ++t) {
    const float boost = (t % 97 == 0) ? 2.5f : 1.0f;
    for (std::size_t i = 0; i < d; ++i) {
      keys[t * d + i] = certattn::half(boost * (0.5f * gauss(rng) + 0.3f * q[i]));
      values[t * d + i] = certattn::half(gauss(rng));
    }
  }
  const auto kv = certattn::make_matrix_view(keys.data(), n, d);
  const auto vv = certattn::make_matrix_view(values.data(), n, d);

  certattn::options opt;
  opt.epsilon = 0.2;
  opt.delta = 0.05;
  opt.scale = certattn::error_scale::kValueScale;
  opt.seed = 42;
  const certattn::noise_key step{/*step=*/7, /*layer=*/3, /*kv_head=*/1};

  const certattn::reference_result est =
      certattn::reference_attend(std::span<const float>(q), kv, vv, opt, step);
  const certattn::exact_result ex = certattn::exact_attention(std::span<const float>(q), kv, vv);

  double err2 = 0.0;
  for (std::size_t i = 0; i < d; ++i) {
    const double diff = est.output[i] - ex.output[i];
    err2 += diff * diff;
  }
  const double err = std::sqrt(err2);
  const double scale = ex.value_scale;  // M: the value scale opt.scale asks for

  const certattn::certificate& c = est.cert;
  std::printf("certificate: certified=%d exact=%d level=%d tau=%.3g bound=%.4f (%s)\n",
              int(c.certified), int(c.exact), c.level, c.tau, c.bound,
              std::string(certattn::to_string(opt.scale)).c_str());
  std::printf("             heavy=%zu sampled=%zu keys_read=%zu/%zu bytes_read=%zu\n", c.heavy,
              c.sampled, c.keys_read, n, c.bytes_read);
  std::printf("observed:    ||o^ - o|| / M = %.5f (epsilon = %.3f)\n", err / scale, opt.epsilon);

  if (!std::isfinite(err) || !(scale > 0.0)) {
    std::printf("FAIL: non-finite output or zero value scale\n");
    return 1;
  }
  // The certificate promises err <= beta <= epsilon * M with probability >= 1 - delta; the
  // inputs and seeds are fixed, so this is deterministic. Exact fallback must be exact.
  const double allowed = c.exact ? 1e-9 * scale : opt.epsilon * scale;
  if (err > allowed) {
    std::printf("FAIL: error %.6g exceeds %.6g\n", err, allowed);
    return 1;
  }
  if (c.certified && !c.exact && err > c.beta) {
    std::printf("FAIL: error %.6g exceeds the certified bound beta = %.6g\n", err, c.beta);
    return 1;
  }
  std::printf("OK\n");
  return 0;
}
