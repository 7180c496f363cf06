// Golden digests: the certified call gives the same bits on every platform and
// instruction set. A fixed cache and fixed queries, built from integer arithmetic only (no
// libm, so the data are the same everywhere), go through 48 certified calls (tight and
// classic certificates, 6 steps, 4 query heads); two FNV-1a digests are compared with
// constants recorded on x86-64:
//   * the sample digest: each head's path, level, heavy and sampled counts and its sample
//     (tokens and heavy levels);
//   * the full digest: also beta, the denominator, the maximum score and every output bit.
// The same constants hold for AVX-512 VNNI, AVX2 and the plain kernels (set_isa_cap) and
// for aarch64 NEON under qemu (`bash .ci/test aarch64`). Every head here is answered by a
// certified level, so no dense-kernel float sum (which may differ between instruction sets
// in the last bits) enters the digests. A change that moves one sample or one bit anywhere
// fails this test: if the change is intended, record the new constants.
#include <certattn/certattn.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <span>
#include <vector>

namespace {

using namespace certattn;

struct fnv1a {
  std::uint64_t h = 0xcbf29ce484222325ull;
  void bytes(const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  }
  template <class T>
  void add(const T& x) {
    bytes(&x, sizeof x);
  }
};

struct digests {
  std::uint64_t samples = 0, full = 0;
  std::size_t sampled_heads = 0;
};

digests run_calls() {
  constexpr std::size_t n = 6000, d = 64, G = 4;
  std::uint64_t state = 0x9e3779b97f4a7c15ull;
  auto uniform = [&state] {  // xorshift64*: exact dyadic values in [-1, 1)
    state ^= state >> 12, state ^= state << 25, state ^= state >> 27;
    return double((state * 0x2545f4914f6cdd1dull) >> 11) * 0x1p-52 - 1.0;
  };
  // Keys with a common offset on four channels; one token in 97 with 8x larger values
  // (value outliers for both certificates' value bounds).
  std::vector<half> keys(n * d), values(n * d);
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t i = 0; i < d; ++i) {
      keys[t * d + i] = half(uniform() + (i < 4 ? 0.5 : 0.0));
      values[t * d + i] = half((t % 97 == 0 ? 8.0 : 1.0) * uniform());
    }
  const strided_kv<half> kv(keys.data(), values.data(), n, d, d, d);
  key_index idx(d);
  idx.build(kv);
  attend_workspace ws(G, d, n);
  ws.record_samples(true);
  fnv1a samples, all;
  digests out;
  for (certificate_kind kind : {certificate_kind::kTight, certificate_kind::kClassic})
    for (std::uint64_t step = 0; step < 6; ++step) {
      // Head g looks for one token with gain 2 + 1.5 g: from diffuse to focused.
      std::vector<float> q(G * d), o(G * d);
      for (std::size_t g = 0; g < G; ++g) {
        const std::size_t focus = (step * 977 + g * 1511) % n;
        const double gain = 2.0 + 1.5 * double(g);
        for (std::size_t i = 0; i < d; ++i)
          q[g * d + i] = float(gain * double(float(keys[focus * d + i])) + 0.25 * uniform());
      }
      std::vector<certificate> certs(G);
      options opt;
      opt.certificate = kind;
      opt.route = routing::kOff;
      opt.seed = 7;
      attend_group(std::span<const float>(q), G, kv, idx, noise_key{step, 0, 0}, opt, std::span<float>(o),
                   std::span<certificate>(certs), ws);
      for (std::size_t g = 0; g < G; ++g) {
        const certificate& c = certs[g];
        out.sampled_heads += c.path == answer_path::kSampled;
        samples.add(c.path);
        samples.add(c.level);
        samples.add(c.heavy);
        samples.add(c.sampled);
        for (const attend_workspace::sampled_key& s : ws.samples(g)) {
          samples.add(s.token);
          samples.add(s.heavy_level);
        }
        all.add(c.beta);
        all.add(c.denominator);
        all.add(c.max_score);
      }
      all.bytes(o.data(), o.size() * sizeof(float));
    }
  out.samples = samples.h;
  out.full = all.h ^ samples.h;
  return out;
}

class isa_cap_guard {
 public:
  explicit isa_cap_guard(isa cap) { set_isa_cap(cap); }
  ~isa_cap_guard() { set_isa_cap(isa::kAvx512Vnni); }
};

TEST(Golden, SameBitsOnEveryPlatformAndInstructionSet) {
  constexpr std::uint64_t kSamples = 0xe7ad9b5ca992aaecull;
  constexpr std::uint64_t kFull = 0x9d2cab01ec9aba94ull;
  for (isa cap : {isa::kAvx512Vnni, isa::kAvx2, isa::kScalar}) {
    if (cap > detected_isa()) continue;
    isa_cap_guard guard(cap);
    const digests got = run_calls();
    std::printf("%s: samples %016llx, full %016llx\n", std::string(to_string(active_isa())).c_str(),
                static_cast<unsigned long long>(got.samples), static_cast<unsigned long long>(got.full));
    EXPECT_EQ(got.sampled_heads, 48u) << "every head should be answered by a certified level";
    EXPECT_EQ(got.samples, kSamples) << to_string(active_isa());
    EXPECT_EQ(got.full, kFull) << to_string(active_isa());
  }
}

}  // namespace
