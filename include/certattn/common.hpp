// Shared vocabulary of certattn: the error type for bad caller input, the internal
// assertion macro, the 16-bit element types, and a small strided matrix view.
#pragma once

#include <certattn/float16.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace certattn {

/// Thrown for bad caller input (options, shapes, non-finite data). The message names the
/// offending argument. Never thrown from inside a hot loop: inputs are checked at setup.
struct error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class T>
concept cache_element =
    std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float> ||
    std::is_same_v<T, double>;

/// Element types of a cache the fast path (index, scan, certified call) reads.
template <class T>
concept storage_element =
    std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float>;

template <class T>
inline float to_float(T x) noexcept {
  return static_cast<float>(x);
}
/// Exact widening to double (a double element stays as it is).
template <class T>
inline double to_double(T x) noexcept {
  if constexpr (std::is_same_v<T, double>)
    return x;
  else
    return static_cast<double>(static_cast<float>(x));
}

/// The smallest float >= x (bit arithmetic: no libm call on the scan's hot path).
inline float round_up_to_float(double x) noexcept {
  float f = static_cast<float>(x);
  if (static_cast<double>(f) < x) {
    std::uint32_t b;
    std::memcpy(&b, &f, 4);
    if (f == 0.0f)
      b = 1u;  // the smallest positive subnormal
    else if (f > 0.0f)
      ++b;
    else
      --b;
    std::memcpy(&f, &b, 4);
  }
  return f;
}

namespace detail {
/// A block's 4-bit step st4 >= 0 made divisible by 16 in float: below 2^-122, st4 / 16
/// would be subnormal and could round, so st4 is rounded up to a multiple of 2^-145 there
/// (exact in float, and then st4 / 16 is too). Any st4 at least 16 range / 255 keeps the
/// codes valid; this one differs from the given only for keys below about 1e-36.
inline float nestable_step4(float st4) noexcept {
  if (!(st4 < 0x1p-122f)) return st4;  // (also NaN, which the index never has)
  return static_cast<float>(std::ceil(static_cast<double>(st4) * 0x1p145) * 0x1p-145);
}
/// The 8-bit step of a nested code: st4 / 16, exact for every nestable_step4().
inline float step8_of(float st4) noexcept { return st4 * 0.0625f; }
/// The nested refinement's prepared a8 (arch/refine_kernels.hpp): padded_dim rounded up to
/// whole chunks of 32 channels, and where channel i goes (per chunk, the even channels,
/// then the odd ones).
constexpr std::size_t refine_a_size(std::size_t padded_dim) noexcept {
  return (padded_dim + 31) / 32 * 32;
}
constexpr std::size_t refine_slot(std::size_t i) noexcept {
  return i / 32 * 32 + (i % 2) * 16 + (i % 32) / 2;
}

[[noreturn]] inline void assertion_failed(const char* expr, const char* file, int line) {
  std::fprintf(stderr, "certattn: internal assertion failed: %s (%s:%d)\n", expr, file, line);
  std::abort();
}
}  // namespace detail

}  // namespace certattn

/// Internal invariants (not caller errors). Define CERTATTN_ASSERT before including any
/// certattn header to route failures to your own handler; define CERTATTN_NO_ASSERT to
/// compile the checks out.
#ifndef CERTATTN_ASSERT
#ifdef CERTATTN_NO_ASSERT
#define CERTATTN_ASSERT(expr) ((void)0)
#else
#define CERTATTN_ASSERT(expr) \
  ((expr) ? (void)0 : ::certattn::detail::assertion_failed(#expr, __FILE__, __LINE__))
#endif
#endif

namespace certattn {

/// A read-only row-major matrix with a runtime row stride (in elements), e.g. the keys of
/// one head: rows = tokens, cols = head_dim. The reference estimator takes these.
template <class T>
struct matrix_view {
  const T* data = nullptr;
  std::size_t rows = 0;
  std::size_t cols = 0;
  std::size_t row_stride = 0;  // elements between consecutive rows; 0 means cols

  const T* row(std::size_t i) const noexcept {
    return data + i * (row_stride == 0 ? cols : row_stride);
  }
  T operator()(std::size_t i, std::size_t j) const noexcept { return row(i)[j]; }
};

template <class T>
matrix_view<T> make_matrix_view(const T* data, std::size_t rows, std::size_t cols,
                                std::size_t row_stride = 0) {
  return matrix_view<T>{data, rows, cols, row_stride};
}

}  // namespace certattn
