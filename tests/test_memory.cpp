// huge_page_allocator (memory.hpp): alignment, sizes, and use as a std::vector allocator.
#include <certattn/memory.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <new>
#include <string>

namespace {

using certattn::huge_page_allocator;
using certattn::large_vector;

std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

TEST(HugePageAllocator, SmallArraysAreCacheLineAligned) {
  for (std::size_t n : {1u, 3u, 17u, 1000u, 100000u}) {
    large_vector<std::uint8_t> v(n, 7);
    EXPECT_EQ(address(v.data()) % 64, 0u) << n;
    for (std::uint8_t x : v) ASSERT_EQ(x, 7);
  }
}

TEST(HugePageAllocator, LargeArraysAreHugePageAligned) {
  const std::size_t n = (std::size_t(5) << 20) / sizeof(float) + 3;  // 5 MiB and a bit
  large_vector<float> v(n, 1.5f);
  EXPECT_EQ(address(v.data()) % (std::size_t(2) << 20), 0u);
  v.back() = 2.5f;  // the whole range, rounded up, is ours
  EXPECT_EQ(v.front(), 1.5f);
  EXPECT_EQ(v.back(), 2.5f);
  // Growth reallocates through the same allocator and keeps the contents.
  v.resize(2 * n, 3.5f);
  EXPECT_EQ(address(v.data()) % (std::size_t(2) << 20), 0u);
  EXPECT_EQ(v[n - 1], 2.5f);
  EXPECT_EQ(v[n], 3.5f);
}

TEST(HugePageAllocator, AllInstancesCompareEqual) {
  huge_page_allocator<int> a;
  huge_page_allocator<double> b(a);
  EXPECT_TRUE(a == b);
  large_vector<int> x(10, 1), y(20, 2);
  x.swap(y);  // equal allocators: a pointer swap
  EXPECT_EQ(x.size(), 20u);
  EXPECT_EQ(y[0], 1);
}

TEST(HugePageAllocator, ImpossibleSizesThrowInsteadOfWrapping) {
  huge_page_allocator<double> a;
  EXPECT_THROW((void)a.allocate(std::numeric_limits<std::size_t>::max() / 4),
               std::bad_array_new_length);
  EXPECT_THROW((void)a.allocate(std::numeric_limits<std::size_t>::max() / 16), std::bad_alloc);
}

#if defined(__linux__)
// The VmFlags of the mapping that holds p (/proc/self/smaps), or "" if none is found.
std::string vm_flags_of(const void* p) {
  std::ifstream f("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(f, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find('-')) {
      inside = address(p) >= lo && address(p) < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

// A large array is advised for transparent huge pages: its mapping carries the kernel's
// "hg" flag (MADV_HUGEPAGE), so THP backs it in the "madvise" mode too. Whether the
// kernel then finds free huge pages depends on the machine, not on us; the advice does not.
TEST(HugePageAllocator, LargeArraysAreAdvisedForHugePages) {
  large_vector<std::uint8_t> v(std::size_t(8) << 20);
  const std::string flags = vm_flags_of(v.data());
  if (flags.empty()) GTEST_SKIP() << "no /proc/self/smaps here";
  EXPECT_NE((flags + " ").find(" hg "), std::string::npos) << flags;
  // (No check that small arrays are not advised: malloc may hand out memory of a freed,
  // advised large array again, whose mapping keeps the flag.)
}
#endif

}  // namespace
