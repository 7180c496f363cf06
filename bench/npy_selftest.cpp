// certattn-npy-selftest DIR: checks bench/npy.hpp (round trips, hand-written headers,
// rejected inputs) and the exact binomial bounds of eval_common.hpp, then writes a small
// synthetic KV cache and its queries into DIR in the layout `accuracy --kv/--queries` and
// `audit --kv/--queries` read (kv_f16.npy, kv_f32.npy, queries.npy), reads them back
// through npy_data() and checks that nothing changed. The ctests then run both commands on
// these files. Exit status 0 when every check passes.
#include "eval_common.hpp"
#include "npy.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

using namespace certattn;
using namespace certattn::bench;

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
    ++failures;
  }
}

template <class F>
void check_throws(F&& f, const std::string& what, const std::string& needle) {
  try {
    f();
    check(false, what + ": no error");
  } catch (const certattn::error& e) {
    check(std::string(e.what()).find(needle) != std::string::npos,
          what + ": message '" + e.what() + "' lacks '" + needle + "'");
  }
}

void write_bytes(const std::string& path, const std::string& header_dict, int major, const std::string& data) {
  std::string h = "\x93NUMPY";
  h += char(major);
  h += char(0);
  std::string dict = header_dict;
  const std::size_t prefix = major == 1 ? 10 : 12;
  dict += std::string((64 - (prefix + dict.size() + 1) % 64) % 64, ' ') + "\n";
  for (int i = 0; i < (major == 1 ? 2 : 4); ++i) h += char((dict.size() >> (8 * i)) & 0xFF);
  std::ofstream f(path, std::ios::binary);
  f << h << dict << data;
}

void npy_tests(const std::string& dir) {
  // Round trips, float32 and float16, several ranks.
  const std::vector<float> v{1.0f, -2.5f, 3.25f, 0.0f, 65504.0f, -1e-3f};
  npy::write(dir + "/rt_f4.npy", {2, 3}, std::span<const float>(v));
  npy::array a = npy::read(dir + "/rt_f4.npy");
  check(a.type == npy::dtype::kF32 && a.shape == std::vector<std::size_t>{2, 3}, "f4 round trip: header");
  check(a.to_float() == v, "f4 round trip: data");
  std::vector<half> hv;
  for (float x : v) hv.push_back(half(x));
  npy::write(dir + "/rt_f2.npy", {6}, std::span<const half>(hv));
  a = npy::read(dir + "/rt_f2.npy");
  check(a.type == npy::dtype::kF16 && a.shape == std::vector<std::size_t>{6}, "f2 round trip: header");
  const std::vector<half> back = a.to_half("rt_f2");
  bool same = back.size() == hv.size();
  for (std::size_t i = 0; same && i < hv.size(); ++i) same = float(back[i]) == float(hv[i]);
  check(same, "f2 round trip: data");
  check(std::filesystem::file_size(dir + "/rt_f2.npy") == 128 + 12, "f2 round trip: header padded to 64 bytes");

  // Hand-written headers: version 2.0, double quotes, a 0-d array, extra spaces.
  std::string one(4, '\0');
  const float x = 7.5f;
  std::memcpy(one.data(), &x, 4);
  write_bytes(dir + "/v2.npy", "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (1, 1,  1), }", 2, one);
  a = npy::read(dir + "/v2.npy");
  check(a.shape == std::vector<std::size_t>{1, 1, 1} && a.at(0) == 7.5f, "version 2.0 header");
  write_bytes(dir + "/scalar.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 1, one);
  a = npy::read(dir + "/scalar.npy");
  check(a.shape.empty() && a.size() == 1 && a.at(0) == 7.5f, "0-d array");

  // Rejections.
  write_bytes(dir + "/be.npy", "{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", 1, one);
  check_throws([&] { npy::read(dir + "/be.npy"); }, "big-endian", "not supported");
  write_bytes(dir + "/f8.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }", 1, one + one);
  check_throws([&] { npy::read(dir + "/f8.npy"); }, "float64", "not supported");
  write_bytes(dir + "/fortran.npy", "{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }", 1, one);
  check_throws([&] { npy::read(dir + "/fortran.npy"); }, "fortran order", "fortran_order");
  write_bytes(dir + "/short.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", 1, one);
  check_throws([&] { npy::read(dir + "/short.npy"); }, "truncated data", "fewer bytes");
  {
    std::ofstream f(dir + "/bad.npy", std::ios::binary);
    f << "not numpy at all";
  }
  check_throws([&] { npy::read(dir + "/bad.npy"); }, "bad magic", "not a .npy");
  check_throws([&] { npy::read(dir + "/missing.npy"); }, "missing file", "cannot open");
  const std::vector<float> big{1e6f};
  npy::write(dir + "/big.npy", {1}, std::span<const float>(big));
  check_throws([&] { npy::read(dir + "/big.npy").to_half("big"); }, "float32 outside fp16", "float16 range");
  check_throws([&] { npy::write(dir + "/x.npy", {2, 2}, std::span<const float>(v)); }, "shape mismatch", "holds");
}

void binomial_tests() {
  // Values from exact binomial sums.
  check(std::fabs(clopper_pearson_upper(1, 100) - 0.0465598) < 1e-6, "Clopper-Pearson 1/100");
  check(std::fabs(clopper_pearson_upper(5, 50) - 0.1988330) < 1e-6, "Clopper-Pearson 5/50");
  check(std::fabs(clopper_pearson_upper(0, 2880) - 0.0010396) < 1e-6, "Clopper-Pearson 0/2880");
  check(clopper_pearson_upper(7, 7) == 1.0, "Clopper-Pearson 7/7");
  check(std::fabs(binomial_upper_tail(3, 100, 0.05) - 0.8817370) < 1e-6, "binomial tail 3/100");
  check(std::fabs(binomial_upper_tail(12, 100, 0.05) - 0.0042742) < 1e-6, "binomial tail 12/100");
  std::vector<double> q{5, 1, 4, 2, 3, 6, 7, 8, 9, 10};
  check(quantile(q, 0.9) == 9.0 && quantile(q, 1.0) == 10.0 && quantile(q, 0.5) == 5.0, "nearest-rank quantile");
}

void cache_files(const std::string& dir) {
  // 2 KV heads x 4096 tokens x head_dim 64, 4 steps x group 4: 32 calls.
  const eval_data e = synthetic_data(synthetic::regime::kMixed, 4096, 2, 4, 64, 4, 7);
  std::vector<half> kv(e.keys.begin(), e.keys.end());
  kv.insert(kv.end(), e.values.begin(), e.values.end());
  npy::write(dir + "/kv_f16.npy", {2, e.heads, e.n, e.d}, std::span<const half>(kv));
  std::vector<float> kvf(kv.size());
  for (std::size_t i = 0; i < kv.size(); ++i) kvf[i] = float(kv[i]);
  npy::write(dir + "/kv_f32.npy", {2, e.heads, e.n, e.d}, std::span<const float>(kvf));
  npy::write(dir + "/queries.npy", {e.steps, e.heads, e.group, e.d}, std::span<const float>(e.queries));

  for (const char* name : {"/kv_f16.npy", "/kv_f32.npy"}) {
    const eval_data r = npy_data(dir + name, dir + "/queries.npy", 0);
    bool same = r.n == e.n && r.d == e.d && r.heads == e.heads && r.group == e.group && r.steps == e.steps &&
                r.queries == e.queries && r.keys.size() == e.keys.size() && r.values.size() == e.values.size();
    for (std::size_t i = 0; same && i < e.keys.size(); ++i)
      same = float(r.keys[i]) == float(e.keys[i]) && float(r.values[i]) == float(e.values[i]);
    check(same, std::string("npy_data reads back the cache written as ") + name);
  }
  const eval_data part = npy_data(dir + "/kv_f16.npy", dir + "/queries.npy", 9);
  check(part.steps == 2, "npy_data: --calls 9 keeps the 2 steps that hold them");
  check_throws([&] { npy_data(dir + "/queries.npy", dir + "/queries.npy", 0); }, "kv shape", "expected shape [2,");
  check_throws([&] { npy_data(dir + "/kv_f16.npy", dir + "/rt_f4.npy", 0); }, "queries shape", "expected shape [steps");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  std::filesystem::create_directories(dir);
  try {
    npy_tests(dir);
    binomial_tests();
    cache_files(dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAIL: unexpected exception: %s\n", e.what());
    return 1;
  }
  if (failures > 0) {
    std::fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  std::printf("npy and binomial checks passed; wrote %s/{kv_f16,kv_f32,queries}.npy\n", dir.c_str());
  return 0;
}
