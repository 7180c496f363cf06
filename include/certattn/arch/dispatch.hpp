// Which instruction set the kernels run on. Chosen at run time from CPUID, so that one
// binary built for x86-64 also runs on a CPU without AVX-512; tests and benches can force
// a lower level to compare kernels. Kernels for each level live in arch/<level>/ and are
// compiled with function-level target attributes, never with a global -march.
#pragma once

#include <atomic>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif
#include <string_view>

namespace certattn {

enum class isa {
  kScalar,       // the portable kernels (arch/portable.hpp): xsimd batches at the build's
                 // compile-time target, NEON on aarch64; scalar C++ where xsimd has none
  kAvx2,         // AVX2 + FMA + F16C
  kAvx512Vnni,   // AVX-512 F/BW/DQ/VL + VNNI (+ F16C)
};

inline std::string_view to_string(isa a) noexcept {
  switch (a) {
#if defined(__aarch64__) && defined(__ARM_NEON)
    case isa::kScalar: return "neon";
#else
    case isa::kScalar: return "scalar";
#endif
    case isa::kAvx2: return "avx2";
    case isa::kAvx512Vnni: return "avx512_vnni";
  }
  return "?";
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
namespace detail {
/// CPUID + XGETBV rather than __builtin_cpu_supports: clang 14 rejects the "avx512vnni"
/// and "f16c" feature strings, and the OS must also have enabled the register state.
inline isa detect_isa_cpuid() noexcept {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return isa::kScalar;
  auto bit = [](unsigned r, int i) { return ((r >> i) & 1u) != 0; };
  const bool fma = bit(c, 12), osxsave = bit(c, 27), avx = bit(c, 28), f16c = bit(c, 29);
  if (!(osxsave && avx && fma && f16c)) return isa::kScalar;
  unsigned xlo = 0, xhi = 0;
  __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
  (void)xhi;
  if ((xlo & 0x6u) != 0x6u) return isa::kScalar;  // XMM and YMM state
  if (__get_cpuid_max(0, nullptr) < 7) return isa::kScalar;
  __cpuid_count(7, 0, a, b, c, d);
  const bool avx2 = bit(b, 5);
  const bool avx512 = bit(b, 16) && bit(b, 17) && bit(b, 30) && bit(b, 31);  // F DQ BW VL
  const bool vnni = bit(c, 11);
  if (avx512 && vnni && (xlo & 0xE6u) == 0xE6u) return isa::kAvx512Vnni;  // + opmask, ZMM
  return avx2 ? isa::kAvx2 : isa::kScalar;
}
}  // namespace detail
#endif

/// The best level this CPU supports. On aarch64 (and every target but x86-64) that is
/// isa::kScalar, whose portable kernels are compiled for NEON there.
inline isa detected_isa() noexcept {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const isa best = detail::detect_isa_cpuid();
  return best;
#else
  return isa::kScalar;
#endif
}

namespace detail {
inline std::atomic<int>& isa_cap() noexcept {
  static std::atomic<int> cap{int(isa::kAvx512Vnni)};
  return cap;
}
}  // namespace detail

/// Caps the level used by every kernel (process-wide; for tests and benches). A cap above
/// what the CPU supports is ignored.
inline void set_isa_cap(isa cap) noexcept { detail::isa_cap().store(int(cap)); }

/// The level kernels use now: min(detected, cap).
inline isa active_isa() noexcept {
  const int d = int(detected_isa()), c = detail::isa_cap().load(std::memory_order_relaxed);
  return isa(d < c ? d : c);
}

}  // namespace certattn

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif
