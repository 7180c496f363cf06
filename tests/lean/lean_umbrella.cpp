// The umbrella header is lean: it brings no Eigen, no test oracle, no monitor, no thread
// pool and none of the library's internal macros into the includer. This target links
// certattn::certattn alone (no Eigen on its include path); the checks below fail the build
// if the umbrella pulls in any of them, and main() runs one certified call through it.
#include <certattn/certattn.hpp>

#if defined(EIGEN_WORLD_VERSION) || defined(EIGEN_CORE_H)
#error "<certattn/certattn.hpp> includes Eigen"
#endif
#if defined(CERTATTN_X86) || defined(CERTATTN_TARGET_AVX2) || defined(CERTATTN_TARGET_AVX512) || \
    defined(CERTATTN_ARCH_BEGIN) || defined(CERTATTN_ARCH_END) || defined(CERTATTN_PORTABLE_SIMD) ||  \
    defined(CERTATTN_NO_FP_CONTRACT) || defined(CERTATTN_SCAN_HEADS) || defined(CERTATTN_SCAN_DRIVER)
#error "<certattn/certattn.hpp> leaks an internal macro"
#endif

#include <cstdint>
#include <cstdio>
#include <vector>

namespace certattn {
// Names of the opt-in headers: an alias of the same name compiles only if the umbrella did
// not declare the class.
using thread_pool = int;
using fidelity_monitor = int;
using reference_result = int;
using exact_result = int;
}  // namespace certattn

int main() {
  constexpr std::size_t n = 2048, d = 64, G = 2;
  std::vector<certattn::half> keys(n * d), values(n * d);
  std::uint64_t state = 0x9e3779b97f4a7c15u;
  auto uniform = [&state] {  // xorshift64*, in [-1, 1)
    state ^= state >> 12, state ^= state << 25, state ^= state >> 27;
    return double((state * 0x2545f4914f6cdd1du) >> 11) * 0x1p-52 - 1.0;
  };
  for (std::size_t i = 0; i < n * d; ++i) {
    keys[i] = certattn::half(uniform());
    values[i] = certattn::half(uniform());
  }
  const certattn::strided_kv<certattn::half> kv(keys.data(), values.data(), n, d, d, d);
  certattn::key_index index(d);
  index.build(kv);
  std::vector<float> queries(G * d), out(G * d);
  for (std::size_t i = 0; i < G * d; ++i) queries[i] = 4.0f * float(keys[(100 + 900 * (i / d)) * d + i % d]);
  std::vector<certattn::certificate> certs(G);
  certattn::attend_workspace ws(G, d, n);
  certattn::options opt;
  certattn::attend_group(std::span<const float>(queries), G, kv, index, certattn::noise_key{1, 0, 0}, opt,
                         std::span<float>(out), std::span<certattn::certificate>(certs), ws);
  for (const certattn::certificate& c : certs)
    if (!c.certified || !(c.bound <= opt.epsilon) || c.path != certattn::answer_path::kSampled) {
      std::printf("lean_umbrella: a head was not certified by sampling (bound %g, path %d)\n", c.bound, int(c.path));
      return 1;
    }
  std::printf("lean_umbrella: ok\n");
  return 0;
}
