// ThreadSanitizer run of what an engine does concurrently in one decode loop:
//  * two threads (a certattn::thread_pool of 2) make certified calls for different query
//    heads of KV head 0, sharing its one key index, each with its own workspace;
//  * meanwhile a third thread plays the engine for KV head 1: it writes the new token's key
//    and value into the shared token-major cache (the rows of head 1 sit between those of
//    head 0), appends it to head 1's index, and makes head 1's certified call.
// Built with -fsanitize=thread (tests/tsan/CMakeLists.txt); a data race aborts the run.
// Afterwards every concurrent result is compared with a serial re-run, bit for bit.
#include <certattn/attend.hpp>
#include <certattn/parallel.hpp>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

namespace {

using namespace certattn;

constexpr std::size_t kHeads = 2, kDim = 64, kGroup = 4, kPrefill = 3000, kAppends = 150,
                      kCap = kPrefill + kAppends, kSteps = 12;

double noise(std::uint64_t a) {
  a = (a ^ (a >> 30)) * 0xbf58476d1ce4e5b9ULL;
  a = (a ^ (a >> 27)) * 0x94d049bb133111ebULL;
  a ^= a >> 31;
  return double(a >> 11) * 0x1p-53 * 2.0 - 1.0;
}

void write_token(std::vector<half>& keys, std::vector<half>& values, std::size_t head,
                 std::size_t t) {
  for (std::size_t i = 0; i < kDim; ++i) {
    const std::size_t at = (t * kHeads + head) * kDim + i;
    keys[at] = half(float(noise(at * 2 + 1) * (i < 4 ? 3.0 : 1.0)));
    values[at] = half(float(noise(at * 2 + 2)));
  }
}

}  // namespace

int main() {
  std::vector<half> keys(kCap * kHeads * kDim), values(keys.size());
  for (std::size_t t = 0; t < kPrefill; ++t)
    for (std::size_t h = 0; h < kHeads; ++h) write_token(keys, values, h, t);

  std::vector<key_index> idx;
  for (std::size_t h = 0; h < kHeads; ++h) {
    idx.emplace_back(kDim);
    idx.back().reserve(kCap);
    idx.back().build(nhd_view(keys.data(), values.data(), kPrefill, kHeads, kDim, h));
  }
  const auto head0 = nhd_view(keys.data(), values.data(), kPrefill, kHeads, kDim, 0);

  std::vector<float> q(2 * kGroup * kDim);  // two halves of head 0's query heads, + head 1's
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = float(2.0 * noise(1000003 + i));
  const std::size_t half_group = kGroup / 2;
  options opt;
  opt.seed = 99;

  // Results: [step][pool item] for head 0, [append] for head 1.
  std::vector<std::vector<float>> out0(kSteps * 2, std::vector<float>(half_group * kDim));
  std::vector<std::vector<certificate>> cert0(kSteps * 2, std::vector<certificate>(half_group));
  std::vector<std::vector<float>> out1(kAppends, std::vector<float>(kGroup * kDim));
  std::vector<std::vector<certificate>> cert1(kAppends, std::vector<certificate>(kGroup));

  std::atomic<bool> started{false};
  std::thread engine([&] {
    attend_workspace ws(kGroup, kDim, kCap);
    started = true;
    for (std::size_t a = 0; a < kAppends; ++a) {
      const std::size_t t = kPrefill + a;
      write_token(keys, values, 1, t);
      const auto head1 = nhd_view(keys.data(), values.data(), t + 1, kHeads, kDim, 1);
      idx[1].append(head1, t);
      attend_group(std::span<const float>(q.data() + kGroup * kDim, kGroup * kDim), kGroup, head1,
                   idx[1], noise_key{t, 0, 1}, opt, std::span<float>(out1[a]),
                   std::span<certificate>(cert1[a]), ws);
    }
  });
  while (!started) std::this_thread::yield();

  thread_pool pool(2);
  std::vector<attend_workspace> ws;
  for (std::size_t w = 0; w < pool.size(); ++w) ws.emplace_back(half_group, kDim, kCap);
  for (std::size_t step = 0; step < kSteps; ++step)
    pool.parallel_for(2, [&](std::size_t part, std::size_t w) {
      attend_group(std::span<const float>(q.data() + part * half_group * kDim, half_group * kDim),
                   half_group, head0, idx[0], noise_key{step, 0, 0}, opt,
                   std::span<float>(out0[step * 2 + part]),
                   std::span<certificate>(cert0[step * 2 + part]), ws[w]);
    });
  engine.join();

  // The same calls, serially: the concurrent ones must have computed the same bits.
  std::size_t mismatches = 0;
  attend_workspace serial0(half_group, kDim, kCap), serial1(kGroup, kDim, kCap);
  std::vector<float> o(kGroup * kDim);
  std::vector<certificate> c(kGroup);
  for (std::size_t step = 0; step < kSteps; ++step)
    for (std::size_t part = 0; part < 2; ++part) {
      attend_group(std::span<const float>(q.data() + part * half_group * kDim, half_group * kDim),
                   half_group, head0, idx[0], noise_key{step, 0, 0}, opt,
                   std::span<float>(o.data(), half_group * kDim),
                   std::span<certificate>(c.data(), half_group), serial0);
      mismatches += std::memcmp(o.data(), out0[step * 2 + part].data(),
                                half_group * kDim * sizeof(float)) != 0;
    }
  key_index replay(kDim);
  replay.build(nhd_view(keys.data(), values.data(), kPrefill, kHeads, kDim, 1));
  for (std::size_t a = 0; a < kAppends; ++a) {
    const std::size_t t = kPrefill + a;
    const auto head1 = nhd_view(keys.data(), values.data(), t + 1, kHeads, kDim, 1);
    replay.append(head1, t);
    attend_group(std::span<const float>(q.data() + kGroup * kDim, kGroup * kDim), kGroup, head1,
                 replay, noise_key{t, 0, 1}, opt, std::span<float>(o), std::span<certificate>(c),
                 serial1);
    mismatches += std::memcmp(o.data(), out1[a].data(), o.size() * sizeof(float)) != 0;
    for (std::size_t g = 0; g < kGroup; ++g) mismatches += c[g].level != cert1[a][g].level;
  }
  std::size_t certified = 0;
  for (const auto& cs : cert0)
    for (const certificate& x : cs) certified += x.certified && !x.exact;
  std::printf("tsan: %zu concurrent calls on head 0 (%zu certified heads), %zu appends + calls "
              "on head 1, %zu mismatches with the serial re-run\n",
              kSteps * 2, certified, kAppends, mismatches);
  return mismatches == 0 ? 0 : 1;
}
