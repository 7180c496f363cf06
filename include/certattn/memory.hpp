// Storage for the large arrays the certified call reads at random places: the index's
// codes and scales, the workspace's per-token arrays, and (for the benches and examples)
// the KV cache itself.
//
// Why huge pages: a certified call reads a few thousand rows scattered over tens of MiB
// per head. With 4 KiB pages nearly every such read also misses the TLB (the 3-4K
// second-level entries of Zen 4 and Zen 5 cover 12-16 MiB) and waits for a page walk that
// costs about as much as the row. With 2 MiB pages the same arrays need a few dozen entries. Measured on the
// bench's cache (docs/fast-path.md, "Huge pages"): the certified call 30% faster, the
// dense kernel, a sequential reader, 4-5%.
//
// How: allocations of at least kHugePageBytes are aligned to 2 MiB and, on Linux, marked
// MADV_HUGEPAGE, so that transparent huge pages back them whether the system's THP mode
// is "always" or "madvise" (with "never" the advice is ignored and they stay 4 KiB pages:
// still correct). Smaller ones are aligned to a cache line, so that no 64-byte vector
// load of them splits two lines.
#pragma once

#include <cstddef>
#include <limits>
#include <new>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace certattn {

namespace detail {
inline constexpr std::size_t kHugePageBytes = std::size_t(2) << 20;
inline constexpr std::size_t kCacheLineBytes = 64;

inline std::size_t large_alignment(std::size_t bytes) noexcept {
  return bytes >= kHugePageBytes ? kHugePageBytes : kCacheLineBytes;
}

/// bytes rounded up to whole huge pages (large) or cache lines (small).
inline std::size_t large_rounded(std::size_t bytes) noexcept {
  const std::size_t a = large_alignment(bytes);
  return (bytes + a - 1) / a * a;
}

inline void* allocate_large(std::size_t bytes) {
  // Beyond any real allocation; keeps the rounding below from wrapping.
  if (bytes > std::numeric_limits<std::size_t>::max() / 4) throw std::bad_alloc();
  const std::size_t a = large_alignment(bytes);
  void* p = ::operator new(large_rounded(bytes), std::align_val_t(a));
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  // Advice only: a failure (THP compiled out, "never") leaves ordinary pages.
  if (a == kHugePageBytes) (void)::madvise(p, large_rounded(bytes), MADV_HUGEPAGE);
#endif
  return p;
}

inline void free_large(void* p, std::size_t bytes) noexcept {
  ::operator delete(p, std::align_val_t(large_alignment(bytes)));
}
}  // namespace detail

/// A std::allocator that puts large arrays on (transparent) huge pages and aligns every
/// array to at least a cache line. Stateless: all instances compare equal.
template <class T>
struct huge_page_allocator {
  using value_type = T;

  huge_page_allocator() noexcept = default;
  template <class U>
  huge_page_allocator(const huge_page_allocator<U>&) noexcept {}

  T* allocate(std::size_t n) {
    if (n > std::numeric_limits<std::size_t>::max() / sizeof(T)) throw std::bad_array_new_length();
    return static_cast<T*>(detail::allocate_large(n * sizeof(T)));
  }
  void deallocate(T* p, std::size_t n) noexcept { detail::free_large(p, n * sizeof(T)); }

  template <class U>
  friend bool operator==(const huge_page_allocator&, const huge_page_allocator<U>&) noexcept {
    return true;
  }
};

/// A std::vector on huge_page_allocator: what the index and the workspace keep their
/// per-token arrays in.
template <class T>
using large_vector = std::vector<T, huge_page_allocator<T>>;

}  // namespace certattn
