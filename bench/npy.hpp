// A small reader and writer for NumPy's .npy format (format versions 1.0, 2.0 and 3.0),
// enough to load a KV cache and decode queries dumped from a real model: little-endian
// float16 ('<f2') and float32 ('<f4'), C order. Anything else is rejected with a message
// that says what was found, so a user knows how to re-save the array
// (np.save(path, np.ascontiguousarray(x, dtype=np.float32))).
#pragma once

#include <certattn/common.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace certattn::bench::npy {

/// The element types this reader accepts.
enum class dtype { kF16, kF32 };

inline std::string_view to_string(dtype t) noexcept { return t == dtype::kF16 ? "<f2" : "<f4"; }
inline std::size_t element_size(dtype t) noexcept { return t == dtype::kF16 ? 2 : 4; }

/// An array as stored: its shape, element type and raw little-endian bytes (C order).
struct array {
  std::vector<std::size_t> shape;
  dtype type = dtype::kF32;
  std::vector<std::uint8_t> bytes;

  std::size_t size() const noexcept {
    std::size_t n = 1;
    for (std::size_t s : shape) n *= s;
    return n;
  }
  /// Element i widened to float (exact for both types).
  float at(std::size_t i) const noexcept {
    if (type == dtype::kF32) {
      float f;
      std::memcpy(&f, bytes.data() + 4 * i, 4);
      return f;
    }
    half h;
    static_assert(sizeof(half) == 2);
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    return float(h);
  }
  /// Every element as float.
  std::vector<float> to_float() const {
    std::vector<float> out(size());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = at(i);
    return out;
  }
  /// Every element as fp16: float16 data is copied bit for bit; float32 data is rounded to
  /// nearest and must lie within fp16's range (|x| <= 65504), else certattn::error.
  std::vector<half> to_half(const std::string& what) const {
    std::vector<half> out(size());
    if (type == dtype::kF16) {
      std::memcpy(out.data(), bytes.data(), bytes.size());
      return out;
    }
    for (std::size_t i = 0; i < out.size(); ++i) {
      const float f = at(i);
      if (!std::isfinite(f) || std::fabs(f) > 65504.0f)
        throw error(what + ": element " + std::to_string(i) + " (" + std::to_string(f) +
                    ") is not finite or outside the float16 range; the cache is evaluated in "
                    "fp16 as the certified call reads it");
      out[i] = half(f);
    }
    return out;
  }
};

namespace detail {

inline std::string shape_text(const std::vector<std::size_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) s += ",";
  return s + ")";
}

/// The value of key `key` in the header's Python dict literal, as raw text (a quoted
/// string, True/False, or a parenthesised tuple).
inline std::string dict_value(const std::string& header, const std::string& key, const std::string& path) {
  std::size_t k = header.find("'" + key + "'");
  if (k == std::string::npos) k = header.find("\"" + key + "\"");
  if (k == std::string::npos) throw error(path + ": .npy header lacks '" + key + "': " + header);
  std::size_t p = header.find(':', k);
  if (p == std::string::npos) throw error(path + ": malformed .npy header: " + header);
  ++p;
  while (p < header.size() && std::isspace(static_cast<unsigned char>(header[p]))) ++p;
  if (p >= header.size()) throw error(path + ": malformed .npy header: " + header);
  std::size_t e;
  if (header[p] == '(') {
    e = header.find(')', p);
    if (e == std::string::npos) throw error(path + ": malformed shape in .npy header: " + header);
    ++e;
  } else if (header[p] == '\'' || header[p] == '"') {
    e = header.find(header[p], p + 1);
    if (e == std::string::npos) throw error(path + ": malformed .npy header: " + header);
    ++e;
  } else {
    e = p;
    while (e < header.size() && (std::isalnum(static_cast<unsigned char>(header[e])) || header[e] == '_')) ++e;
  }
  return header.substr(p, e - p);
}

inline std::vector<std::size_t> parse_shape(const std::string& text, const std::string& path) {
  // "(2, 8, 1024, 128)", "(5,)", "()"
  std::vector<std::size_t> shape;
  std::size_t i = 1;
  while (i + 1 < text.size()) {
    while (i < text.size() && (std::isspace(static_cast<unsigned char>(text[i])) || text[i] == ',')) ++i;
    if (i >= text.size() || text[i] == ')') break;
    if (!std::isdigit(static_cast<unsigned char>(text[i])))
      throw error(path + ": unexpected character in .npy shape " + text);
    std::size_t v = 0;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      const std::size_t digit = std::size_t(text[i] - '0');
      if (v > (SIZE_MAX - digit) / 10) throw error(path + ": .npy shape too large: " + text);
      v = v * 10 + digit;
      ++i;
    }
    shape.push_back(v);
  }
  return shape;
}

inline void put_le(std::string& s, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s += char((v >> (8 * i)) & 0xFF);
}

}  // namespace detail

/// Reads a .npy file. Throws certattn::error naming the file and what is wrong.
inline array read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw error("cannot open '" + path + "'");
  char magic[8];
  if (!f.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0)
    throw error(path + ": not a .npy file (no \\x93NUMPY magic)");
  const int major = static_cast<unsigned char>(magic[6]);
  if (major < 1 || major > 3)
    throw error(path + ": unsupported .npy format version " + std::to_string(major));
  std::size_t header_len = 0;
  const int len_bytes = major == 1 ? 2 : 4;
  unsigned char lb[4] = {};
  if (!f.read(reinterpret_cast<char*>(lb), len_bytes)) throw error(path + ": truncated .npy header");
  for (int i = 0; i < len_bytes; ++i) header_len |= std::size_t(lb[i]) << (8 * i);
  if (header_len > (std::size_t(1) << 24)) throw error(path + ": implausible .npy header length");
  std::string header(header_len, '\0');
  if (!f.read(header.data(), std::streamsize(header_len))) throw error(path + ": truncated .npy header");

  array a;
  const std::string descr = detail::dict_value(header, "descr", path);
  if (descr == "'<f4'" || descr == "\"<f4\"")
    a.type = dtype::kF32;
  else if (descr == "'<f2'" || descr == "\"<f2\"")
    a.type = dtype::kF16;
  else
    throw error(path + ": dtype " + descr +
                " is not supported (expected little-endian float16 '<f2' or float32 '<f4'; "
                "bfloat16 caches: save them as float32)");
  const std::string fortran = detail::dict_value(header, "fortran_order", path);
  if (fortran != "False")
    throw error(path + ": fortran_order is " + fortran +
                "; save a C-ordered array (np.ascontiguousarray) instead");
  a.shape = detail::parse_shape(detail::dict_value(header, "shape", path), path);

  std::size_t n = 1;
  for (std::size_t s : a.shape) {
    if (s != 0 && n > SIZE_MAX / 8 / s) throw error(path + ": .npy shape too large");
    n *= s;
  }
  a.bytes.resize(n * element_size(a.type));
  if (!f.read(reinterpret_cast<char*>(a.bytes.data()), std::streamsize(a.bytes.size())))
    throw error(path + ": holds fewer bytes than its shape " + detail::shape_text(a.shape) + " and dtype " +
                std::string(to_string(a.type)) + " need (" + std::to_string(a.bytes.size()) + ")");
  return a;
}

/// Writes raw little-endian elements with a version 1.0 header (version 2.0 when the
/// header would not fit in 65535 bytes), padded so that the data starts at a multiple of 64.
inline void write_raw(const std::string& path, const std::vector<std::size_t>& shape, dtype type,
                      const void* data, std::size_t count) {
  std::size_t n = 1;
  for (std::size_t s : shape) n *= s;
  if (n != count)
    throw error("npy::write '" + path + "': shape " + detail::shape_text(shape) + " holds " + std::to_string(n) +
                " elements, got " + std::to_string(count));
  std::string dict = "{'descr': '" + std::string(to_string(type)) +
                     "', 'fortran_order': False, 'shape': " + detail::shape_text(shape) + ", }";
  int major = 1;
  std::size_t prefix = 10;
  std::size_t total = prefix + dict.size() + 1;
  if (total + 63 > 65535 + prefix) {
    major = 2;
    prefix = 12;
    total = prefix + dict.size() + 1;
  }
  dict += std::string((64 - total % 64) % 64, ' ') + "\n";
  std::string head = "\x93NUMPY";
  head += char(major);
  head += char(0);
  detail::put_le(head, dict.size(), major == 1 ? 2 : 4);
  head += dict;
  std::ofstream f(path, std::ios::binary);
  if (!f) throw error("cannot open '" + path + "' for writing");
  f.write(head.data(), std::streamsize(head.size()));
  f.write(static_cast<const char*>(data), std::streamsize(count * element_size(type)));
  f.close();
  if (!f) throw error("cannot write '" + path + "'");
}

inline void write(const std::string& path, const std::vector<std::size_t>& shape, std::span<const float> data) {
  write_raw(path, shape, dtype::kF32, data.data(), data.size());
}
inline void write(const std::string& path, const std::vector<std::size_t>& shape, std::span<const half> data) {
  static_assert(sizeof(half) == 2);
  write_raw(path, shape, dtype::kF16, data.data(), data.size());
}

}  // namespace certattn::bench::npy
