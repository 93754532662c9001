// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: offsets of an element type the wrapper does not accept. CTest checks that the compiler
// stops here with the wrapper's static_assert message (tests/CMakeLists.txt, CppWrapper.RejectsOtherOffsetTypes).
#include <vector>

#include "maxsim/maxsim.hpp"

int main() {
  std::vector<float> tokens(8 * 4);
  std::vector<double> offsets = {0, 4, 8};
  maxsim::DenseSets sets(tokens.data(), 4, offsets);
  return static_cast<int>(sets.n_sets());
}
