// Translation unit b of the ODR test: see odr.hpp.
#include <certattn/certattn.hpp>

#include "fixture.hpp"
#include "odr.hpp"

namespace odr_test {
double reference_checksum_b() { return reference_checksum(); }
std::uint64_t perturbation_bits_b(std::uint64_t token) {
  return certattn::perturbation(7, certattn::noise_key{1, 2, 3}).bits(token);
}
}  // namespace odr_test
