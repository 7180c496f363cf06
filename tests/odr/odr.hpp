// The ODR test (tests/odr/): a.cpp and b.cpp both include the umbrella header and
// instantiate the same templates; main.cpp links them together. A non-inline function or
// a variable defined in a header shows up here as a multiple-definition link error, and a
// header whose meaning depends on the translation unit as different results.
#pragma once

#include <cstdint>

namespace odr_test {
// Output of reference_attend on a fixed fp16 cache, summed; same inputs in both TUs.
double reference_checksum_a();
double reference_checksum_b();
// Things each TU gets from the header alone, to compare across TUs.
std::uint64_t perturbation_bits_a(std::uint64_t token);
std::uint64_t perturbation_bits_b(std::uint64_t token);
}  // namespace odr_test
