// Compile-time checks of the kv_view concept: what an engine's cache view must provide.
#include <certattn/layout.hpp>

#include <gtest/gtest.h>

namespace {
using namespace certattn;

// An engine's own view: anything with these members works.
struct engine_view {
  using element_type = half;
  std::size_t size() const { return 0; }
  std::size_t head_dim() const { return 0; }
  const half* key(std::size_t) const { return nullptr; }
  const half* value(std::size_t) const { return nullptr; }
};
// Accessors that return mutable pointers (an engine's cache is writable) also work.
struct mutable_view {
  using element_type = half;
  std::size_t size() const { return 0; }
  std::size_t head_dim() const { return 0; }
  half* key(std::size_t) const { return nullptr; }
  half* value(std::size_t) const { return nullptr; }
};
struct no_values {
  using element_type = half;
  std::size_t size() const { return 0; }
  std::size_t head_dim() const { return 0; }
  const half* key(std::size_t) const { return nullptr; }
};
struct wrong_element {  // int8 caches are not an element type the library reads
  using element_type = signed char;
  std::size_t size() const { return 0; }
  std::size_t head_dim() const { return 0; }
  const signed char* key(std::size_t) const { return nullptr; }
  const signed char* value(std::size_t) const { return nullptr; }
};
struct mismatched_pointer {  // rows must be of the element type
  using element_type = half;
  std::size_t size() const { return 0; }
  std::size_t head_dim() const { return 0; }
  const float* key(std::size_t) const { return nullptr; }
  const float* value(std::size_t) const { return nullptr; }
};
struct no_element_type {
  std::size_t size() const { return 0; }
  std::size_t head_dim() const { return 0; }
  const half* key(std::size_t) const { return nullptr; }
  const half* value(std::size_t) const { return nullptr; }
};

static_assert(kv_view<strided_kv<half>>);
static_assert(kv_view<strided_kv<bfloat16>>);
static_assert(kv_view<strided_kv<float>>);
static_assert(kv_view<paged_kv<half>>);
static_assert(kv_view<paged_kv<bfloat16>>);
static_assert(kv_view<paged_kv<float>>);
static_assert(kv_view<engine_view>);
static_assert(kv_view<mutable_view>);
static_assert(!kv_view<no_values>);
static_assert(!kv_view<wrong_element>);
static_assert(!kv_view<mismatched_pointer>);
static_assert(!kv_view<no_element_type>);
static_assert(!kv_view<int>);

TEST(LayoutConcept, AdaptersAddressTheRightRows) {
  // [token][head][dim] with 3 heads of dim 2: head 1 of token 2 starts at (2*3+1)*2.
  std::vector<half> k(3 * 12), v(3 * 12);  // also 3 pages of [3 heads][2 tokens][2 dims]
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = v[i] = half(float(i));
  const auto nhd = nhd_view(k.data(), v.data(), 5, 3, 2, 1);
  EXPECT_EQ(float(nhd.key(2)[0]), float((2 * 3 + 1) * 2));
  const auto hnd = hnd_view(k.data(), v.data(), 4, 5, 3, 2, 2);  // capacity 5
  EXPECT_EQ(float(hnd.value(3)[1]), float((2 * 5 + 3) * 2 + 1));
  const std::int32_t table[] = {2, 0};
  // pages of 2 tokens, HND inside a page: [page][head][token][dim], 3 heads
  const paged_kv<half> pg(k.data(), v.data(), table, 3, 2, 2, 3 * 2 * 2, 2, 1 * 2 * 2);
  EXPECT_EQ(float(pg.key(1)[0]), float(2 * 12 + 1 * 4 + 1 * 2));
  EXPECT_EQ(float(pg.key(2)[1]), float(0 * 12 + 1 * 4 + 0 * 2 + 1));
}

TEST(LayoutConcept, BadAdapterArgumentsThrow) {
  std::vector<half> k(16), v(16);
  EXPECT_THROW(nhd_view(k.data(), v.data(), 2, 2, 4, 2), error);       // head >= kv_heads
  EXPECT_THROW(hnd_view(k.data(), v.data(), 5, 4, 1, 4, 0), error);    // n > capacity
  EXPECT_THROW(strided_kv<half>(k.data(), v.data(), 4, 4, 2, 4), error);  // stride < dim
  const std::int32_t table[] = {0};
  EXPECT_THROW(paged_kv<half>(k.data(), v.data(), table, 5, 4, 4, 16, 4, 0), error);  // table short
  const std::int32_t neg[] = {-1};
  EXPECT_THROW(paged_kv<half>(k.data(), v.data(), neg, 2, 4, 4, 16, 4, 0), error);
}

}  // namespace
