// Compile-time checks of the kv_view concept: what an engine's cache view must provide.
#include <certattn/layout.hpp>

#include <gtest/gtest.h>

#include <type_traits>
#include <vector>

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
// Keys and values in different formats (q8_0 keys, f16 values): key_type and value_type.
struct engine_mixed_view {
  using key_type = block_q8_0;
  using value_type = half;
  std::size_t size() const { return 0; }
  std::size_t head_dim() const { return 0; }
  const block_q8_0* key(std::size_t) const { return nullptr; }
  const half* value(std::size_t) const { return nullptr; }
};
struct mixed_pointers_swapped {  // value rows must be of value_type
  using key_type = block_q8_0;
  using value_type = half;
  std::size_t size() const { return 0; }
  std::size_t head_dim() const { return 0; }
  const block_q8_0* key(std::size_t) const { return nullptr; }
  const block_q8_0* value(std::size_t) const { return nullptr; }
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
static_assert(kv_view<engine_mixed_view>);
static_assert(!kv_view<mixed_pointers_swapped>);
static_assert(kv_view<strided_kv<block_q8_0, half>>);
static_assert(kv_view<paged_kv<block_q4_0, half>>);
static_assert(std::is_same_v<key_element_t<strided_kv<block_q8_0, half>>, block_q8_0>);
static_assert(std::is_same_v<value_element_t<strided_kv<block_q8_0, half>>, half>);
static_assert(std::is_same_v<strided_kv<half>::element_type, half>);
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

TEST(LayoutConcept, MixedFormatsAddressTheSameRowsInChannels) {
  // q8_0 keys and f16 values in the same paged layout: 2 heads of 64 channels (2 blocks),
  // pages of 4 tokens, NHD inside a page; strides counted in key blocks.
  constexpr std::size_t d = 64, H = 2, page = 4, ku = d / 32;
  std::vector<block_q8_0> k(3 * page * H * ku);
  std::vector<half> v(3 * page * H * d);
  const std::int32_t table[] = {2, 0, 1};
  const paged_kv<block_q8_0, half> pg(k.data(), v.data(), table, 10, page, d, page * H * ku, H * ku,
                                      1 * ku);
  // token 5: page table[1] = 0, slot 1, head 1.
  EXPECT_EQ(pg.key(5), k.data() + (0 * page * H + 1 * H + 1) * ku);
  EXPECT_EQ(pg.value(5), v.data() + (0 * page * H + 1 * H + 1) * d);
  EXPECT_EQ(pg.value(2), v.data() + (2 * page * H + 2 * H + 1) * d);
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
