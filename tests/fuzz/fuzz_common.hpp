// Shared by the fuzz targets: a reader that turns the fuzzer's bytes into shapes, options
// and values (running out of bytes gives zeros, so every input is valid), value
// generators that mix ordinary numbers with the special ones (NaN, +-Inf, subnormals,
// huge, tiny, signed zeros), and FUZZ_CHECK, which aborts so that libFuzzer keeps the input.
#pragma once

#include <certattn/common.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#define FUZZ_CHECK(cond, ...)                                                  \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::fprintf(stderr, "FUZZ_CHECK failed: %s (%s:%d)\n  ", #cond, __FILE__, \
                   __LINE__);                                                  \
      std::fprintf(stderr, __VA_ARGS__);                                       \
      std::fprintf(stderr, "\n");                                              \
      std::abort();                                                            \
    }                                                                          \
  } while (0)

namespace certattn::fuzz {

class reader {
 public:
  reader(const std::uint8_t* data, std::size_t size) : p_(data), n_(size) {}
  std::uint8_t byte() { return i_ < n_ ? p_[i_++] : 0; }
  std::uint32_t u16() { return std::uint32_t(byte()) | std::uint32_t(byte()) << 8; }
  std::uint64_t u64() {
    std::uint64_t x = 0;
    for (int k = 0; k < 8; ++k) x |= std::uint64_t(byte()) << (8 * k);
    return x;
  }
  /// An index in [0, n).
  std::size_t pick(std::size_t n) { return n == 0 ? 0 : byte() % n; }
  template <class T, std::size_t N>
  T pick_from(const T (&table)[N]) {
    return table[pick(N)];
  }
  bool flag() { return byte() & 1; }
  std::size_t remaining() const { return n_ - i_; }

 private:
  const std::uint8_t* p_;
  std::size_t n_, i_ = 0;
};

/// splitmix64: the bulk of the values comes from a stream seeded by the input.
class stream {
 public:
  explicit stream(std::uint64_t seed) : s_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (s_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  /// Roughly normal (sum of four uniforms, centred), cheap.
  double normal() {
    const std::uint64_t r = next();
    double s = 0.0;
    for (int k = 0; k < 4; ++k) s += double((r >> (16 * k)) & 0xFFFF) / 65535.0;
    return (s - 2.0) * 1.7320508;
  }

 private:
  std::uint64_t s_;
};

inline constexpr double kMagnitudes[] = {0.0,  1e-42, 1e-30, 1e-7, 1e-4, 0.01, 0.3, 1.0,
                                         3.0,  30.0,  500.0, 6e4,  1e8,  1e20, 1e30, 1e38};

/// The special values a cache or a query may hold.
inline double special(std::uint8_t kind) {
  switch (kind % 12) {
    case 0: return std::numeric_limits<double>::quiet_NaN();
    case 1: return std::numeric_limits<double>::infinity();
    case 2: return -std::numeric_limits<double>::infinity();
    case 3: return 0.0;
    case 4: return -0.0;
    case 5: return 5.96e-8;    // smallest fp16 subnormal
    case 6: return 1.4e-45;    // smallest float subnormal
    case 7: return 65504.0;    // fp16 max
    case 8: return -65504.0;
    case 9: return 3.0e38;     // near float max
    case 10: return 1e-4;
    default: return 6e4;
  }
}

/// Fills n doubles: a normal stream of a chosen magnitude with an optional constant
/// offset, then up to 15 specials at chosen positions. Everything from the reader.
inline std::vector<double> values(reader& r, std::size_t n) {
  std::vector<double> v(n);
  stream s(r.u64());
  const double mag = r.pick_from(kMagnitudes);
  const double offset = r.flag() ? r.pick_from(kMagnitudes) * (r.flag() ? 1.0 : -1.0) : 0.0;
  const std::uint8_t style = r.byte();
  for (std::size_t i = 0; i < n; ++i) {
    double x = mag * s.normal() + offset;
    if (style & 1) x = std::round(x);       // integers, many ties and zeros
    if ((style & 6) == 2 && (i % 7) == 0) x *= 1000.0;  // outlier channels / tokens
    v[i] = x;
  }
  const std::size_t specials = r.byte() % 16;
  for (std::size_t k = 0; k < specials && n > 0; ++k) {
    const std::size_t at = std::size_t(r.u16()) * 257u % n;
    v[at] = special(r.byte());
  }
  return v;
}

/// Conversion to the storage type; beyond the float range +-Inf (a plain cast would be
/// undefined behaviour there), beyond fp16's as Eigen rounds (to +-Inf).
inline float to_float_sat(double x) {
  if (std::isnan(x)) return std::numeric_limits<float>::quiet_NaN();
  if (x > double(std::numeric_limits<float>::max())) return std::numeric_limits<float>::infinity();
  if (x < -double(std::numeric_limits<float>::max())) return -std::numeric_limits<float>::infinity();
  return float(x);
}
template <class T>
T store(double x) {
  return T(to_float_sat(x));
}

}  // namespace certattn::fuzz
