// The ODR test's main: links a.cpp and b.cpp (both include <certattn/certattn.hpp>) and
// checks that the two translation units agree.
#include "odr.hpp"

#include <cstdio>

int main() {
  const double a = odr_test::reference_checksum_a();
  const double b = odr_test::reference_checksum_b();
  if (a != b) {
    std::printf("FAIL: reference checksums differ across translation units: %.17g vs %.17g\n",
                a, b);
    return 1;
  }
  for (unsigned t = 0; t < 16; ++t)
    if (odr_test::perturbation_bits_a(t) != odr_test::perturbation_bits_b(t)) {
      std::printf("FAIL: perturbation bits differ across translation units (token %u)\n", t);
      return 1;
    }
  std::printf("OK: two translation units including <certattn/certattn.hpp> link and agree "
              "(checksum %.17g)\n", a);
  return 0;
}
