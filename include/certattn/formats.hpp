// The quantized cache formats certattn reads in place, as engines store them at long
// context: llama.cpp's int8 and 4-bit blocks (ggml's block_q8_0 and block_q4_0, bit for bit)
// and vLLM's fp8 elements (e4m3 and e5m2) with a scale per (layer, KV head).
//
// Every stage reads a quantized row through its decoder, which turns it into the floats
// it stands for: those floats are "the cache". Each is exact in float (an int8 or 4-bit
// code times an fp16 scale has at most 18 significant bits; an fp8 value times the view's
// float scale is rounded once, as vLLM's kernels round it), so the index's bounds, the
// exact scores in double and the dense kernel all see the same numbers, and every
// certificate is a statement about attention over them.
#pragma once

#include <certattn/common.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

namespace certattn {

/// ggml's block_q8_0: 32 channels x = d * qs[i], d an fp16 scale. 34 bytes, no padding.
struct block_q8_0 {
  half d;
  std::int8_t qs[32];
};
static_assert(sizeof(block_q8_0) == 34, "block_q8_0 must match ggml's layout");

/// ggml's block_q4_0: 32 channels in 16 bytes, x = d * (q - 8) with q a nibble: channel i
/// (i < 16) is the low nibble of qs[i], channel 16 + i its high nibble. 18 bytes.
struct block_q4_0 {
  half d;
  std::uint8_t qs[16];
};
static_assert(sizeof(block_q4_0) == 18, "block_q4_0 must match ggml's layout");

/// An fp8 E4M3 code as vLLM and torch.float8_e4m3fn store it: bias 7, no infinities,
/// S.1111.111 is NaN, largest 448. The view's scale multiplies it.
struct fp8_e4m3 {
  std::uint8_t bits;
};
/// An fp8 E5M2 code (the high byte of an IEEE binary16): bias 15, with Inf and NaN.
struct fp8_e5m2 {
  std::uint8_t bits;
};

/// Element types stored as codes that a decoder turns into floats.
template <class T>
concept quantized_element = std::is_same_v<T, block_q8_0> || std::is_same_v<T, block_q4_0> ||
                            std::is_same_v<T, fp8_e4m3> || std::is_same_v<T, fp8_e5m2>;

/// The fp8 formats: one code per channel, and a float scale per view (per KV head).
template <class T>
concept fp8_element = std::is_same_v<T, fp8_e4m3> || std::is_same_v<T, fp8_e5m2>;

/// Every element type a kv_view may hold: the ones read directly and the quantized ones.
template <class T>
concept kv_element = storage_element<T> || quantized_element<T>;

/// A cache's element format, as the index records it and the C ABI and the bench name it.
enum class cache_format : std::uint8_t { f16, bf16, f32, q8_0, q4_0, fp8_e4m3, fp8_e5m2 };

inline std::string_view to_string(cache_format f) noexcept {
  switch (f) {
    case cache_format::f16: return "f16";
    case cache_format::bf16: return "bf16";
    case cache_format::f32: return "f32";
    case cache_format::q8_0: return "q8_0";
    case cache_format::q4_0: return "q4_0";
    case cache_format::fp8_e4m3: return "fp8_e4m3";
    case cache_format::fp8_e5m2: return "fp8_e5m2";
  }
  return "?";
}

/// What a format stores per unit: `channels` per unit of type T (32 for a block, else 1).
template <kv_element T>
struct format_traits {
  static constexpr std::size_t channels =
      std::is_same_v<T, block_q8_0> || std::is_same_v<T, block_q4_0> ? 32 : 1;
  static constexpr cache_format format = std::is_same_v<T, half>         ? cache_format::f16
                                         : std::is_same_v<T, bfloat16>   ? cache_format::bf16
                                         : std::is_same_v<T, float>      ? cache_format::f32
                                         : std::is_same_v<T, block_q8_0> ? cache_format::q8_0
                                         : std::is_same_v<T, block_q4_0> ? cache_format::q4_0
                                         : std::is_same_v<T, fp8_e4m3>   ? cache_format::fp8_e4m3
                                                                         : cache_format::fp8_e5m2;
  /// Units of T holding `dim` channels (dim a multiple of `channels`).
  static constexpr std::size_t units(std::size_t dim) noexcept { return dim / channels; }
  /// Bytes of a row of `dim` channels.
  static constexpr std::size_t row_bytes(std::size_t dim) noexcept { return units(dim) * sizeof(T); }
};

/// Throws unless `dim` channels fill whole units of T (a block format's 32): `what` names
/// the argument.
template <kv_element T>
inline void check_row_channels(std::size_t dim, const char* what) {
  constexpr std::size_t c = format_traits<T>::channels;
  if (dim % c != 0)
    throw error(std::string(what) + " (" + std::to_string(dim) + ") must be a multiple of " +
                std::to_string(c) + ": a " + std::string(to_string(format_traits<T>::format)) +
                " row is whole blocks of " + std::to_string(c) + " channels");
}

/// How an error names a row's extent in units of T: "head_dim (128)" for an element
/// format, "a row of 4 blocks (head_dim 128)" for a block format.
template <kv_element T>
inline std::string row_extent(std::size_t dim, const char* what) {
  if (format_traits<T>::channels == 1) return std::string(what) + " (" + std::to_string(dim) + ")";
  return "a row of " + std::to_string(format_traits<T>::units(dim)) + " blocks (" + what + " " +
         std::to_string(dim) + ")";
}

/// Throws unless a view's scale is finite and > 0: `what` names it.
inline float check_cache_scale(float s, const char* what) {
  if (!(s > 0.0f) || !(s <= std::numeric_limits<float>::max()))
    throw error(std::string(what) + " must be finite and > 0, got " + std::to_string(s));
  return s;
}

namespace detail {

/// The value of an E4M3 code (exact in float; NaN for S.1111.111).
constexpr float fp8_e4m3_value(std::uint8_t c) noexcept {
  const unsigned e = (c >> 3) & 0xFu, m = c & 7u;
  float v;
  if (e == 0xF && m == 7)
    v = std::numeric_limits<float>::quiet_NaN();
  else if (e == 0)
    v = float(m) * 0x1p-9f;  // subnormal: m/8 * 2^-6
  else {
    v = float(8 + m) * 0x1p-3f;
    for (unsigned k = 7; k < e; ++k) v *= 2.0f;
    for (unsigned k = e; k < 7; ++k) v *= 0.5f;
  }
  return (c & 0x80u) ? -v : v;
}
inline constexpr auto fp8_e4m3_table = [] {
  std::array<float, 256> t{};
  for (unsigned c = 0; c < 256; ++c) t[c] = fp8_e4m3_value(std::uint8_t(c));
  return t;
}();

/// The value of an E5M2 code: binary16 with the low byte zero (exact; Inf and NaN kept).
constexpr float fp8_e5m2_value(std::uint8_t c) noexcept {
  return half_bits_to_float(std::uint16_t(std::uint16_t(c) << 8));
}

/// Row decoder, scalar and the definition every vector decoder matches bit for bit: the
/// `dim` channels of a row of T as floats. `scale` is the view's (fp8 only; 1 otherwise).
template <quantized_element T>
inline void decode_row_scalar(const T* row, std::size_t dim, float scale, float* out) noexcept {
  if constexpr (std::is_same_v<T, block_q8_0>) {
    for (std::size_t b = 0; b < dim / 32; ++b) {
      const float d = float(row[b].d);
      for (std::size_t i = 0; i < 32; ++i) out[32 * b + i] = d * float(row[b].qs[i]);
    }
  } else if constexpr (std::is_same_v<T, block_q4_0>) {
    for (std::size_t b = 0; b < dim / 32; ++b) {
      const float d = float(row[b].d);
      for (std::size_t i = 0; i < 16; ++i) {
        out[32 * b + i] = d * float(int(row[b].qs[i] & 0xF) - 8);
        out[32 * b + 16 + i] = d * float(int(row[b].qs[i] >> 4) - 8);
      }
    }
  } else if constexpr (std::is_same_v<T, fp8_e4m3>) {
    for (std::size_t i = 0; i < dim; ++i) out[i] = scale * fp8_e4m3_table[row[i].bits];
  } else {
    for (std::size_t i = 0; i < dim; ++i) out[i] = scale * fp8_e5m2_value(row[i].bits);
  }
}

}  // namespace detail

/// Encoders, for tests, benches and engines that fill such a cache from floats: ggml's
/// quantize_row_q8_0 / q4_0 rounding (d = amax / 127, resp. the signed max / -8), and fp8
/// round-to-nearest-even with saturation (e4m3, as vLLM's scaled_fp8_quant) or overflow to
/// Inf (e5m2). Not on any decode path.
inline void quantize_row(const float* x, std::size_t dim, block_q8_0* out) {
  check_row_channels<block_q8_0>(dim, "dim");
  for (std::size_t b = 0; b < dim / 32; ++b) {
    float amax = 0.0f;
    for (std::size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[32 * b + i]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    out[b].d = half(d);
    for (std::size_t i = 0; i < 32; ++i)
      out[b].qs[i] = std::int8_t(std::lround(x[32 * b + i] * id));
  }
}
inline void quantize_row(const float* x, std::size_t dim, block_q4_0* out) {
  check_row_channels<block_q4_0>(dim, "dim");
  for (std::size_t b = 0; b < dim / 32; ++b) {
    float amax = 0.0f, max = 0.0f;
    for (std::size_t i = 0; i < 32; ++i)
      if (std::fabs(x[32 * b + i]) > amax) {
        amax = std::fabs(x[32 * b + i]);
        max = x[32 * b + i];
      }
    const float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    out[b].d = half(d);
    for (std::size_t i = 0; i < 16; ++i) {
      const auto q = [&](float v) {
        return std::uint8_t(std::min(15, int(v * id + 8.5f)));
      };
      out[b].qs[i] = std::uint8_t(q(x[32 * b + i]) | (q(x[32 * b + 16 + i]) << 4));
    }
  }
}
/// fp8 codes of x / scale (scale > 0).
template <fp8_element T>
inline void quantize_row(const float* x, std::size_t dim, float scale, T* out) {
  check_cache_scale(scale, "scale");
  for (std::size_t i = 0; i < dim; ++i) {
    const float v = x[i] / scale;
    if constexpr (std::is_same_v<T, fp8_e5m2>) {
      // binary16 rounding, then the top byte rounded to nearest even on the dropped byte.
      const std::uint16_t h = detail::float_to_half_bits(v);
      const std::uint16_t low = h & 0xFFu, keep = h >> 8;
      const bool up = (h & 0x7C00u) != 0x7C00u && (low > 0x80u || (low == 0x80u && (keep & 1u)));
      out[i].bits = std::uint8_t(keep + (up ? 1u : 0u));
    } else {
      // The nearest of the 254 finite codes (ties to even code), saturating at +-448.
      std::uint8_t best = 0;
      float err = std::numeric_limits<float>::infinity();
      const float a = std::fabs(v);
      for (unsigned c = 0; c < 0x7F; ++c) {
        const float e = std::fabs(detail::fp8_e4m3_table[c] - a);
        if (e < err || (e == err && (c & 1u) == 0u)) {
          err = e;
          best = std::uint8_t(c);
        }
      }
      out[i].bits = std::uint8_t(best | (std::signbit(v) ? 0x80u : 0u));
    }
  }
}

}  // namespace certattn
