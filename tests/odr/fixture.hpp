// Both translation units of the ODR test build the same cache with this inline helper.
#pragma once

#include <certattn/certattn.hpp>
#include <certattn/reference.hpp>

#include <span>
#include <vector>

namespace odr_test {
inline double reference_checksum() {
  constexpr std::size_t n = 256, d = 16;
  std::vector<float> q(d);
  std::vector<certattn::half> keys(n * d), values(n * d);
  for (std::size_t i = 0; i < d; ++i) q[i] = float(int(i % 5) - 2) * 0.5f;
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t i = 0; i < d; ++i) {
      keys[t * d + i] = certattn::half(float(int((t * 7 + i * 3) % 11) - 5) * 0.25f);
      values[t * d + i] = certattn::half(float(int((t * 5 + i) % 9) - 4) * 0.125f);
    }
  certattn::options opt;
  opt.window = 16;
  opt.epsilon = 0.3;
  opt.seed = 1;
  const auto r = certattn::reference_attend(std::span<const float>(q),
                                            certattn::make_matrix_view(keys.data(), n, d),
                                            certattn::make_matrix_view(values.data(), n, d),
                                            opt, certattn::noise_key{2, 0, 0});
  double sum = 0.0;
  for (double x : r.output) sum += x;
  return sum + double(r.cert.level) + double(r.cert.keys_read);
}
}  // namespace odr_test
