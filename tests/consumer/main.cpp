// Checks that the installed headers and library work from another project.
#include <iostream>

#include "pipit.h"

int main() {
  pipit::Tensor a = pipit::tensor({1, 2, 3});
  pipit::Tensor total = pipit::sum(a * a);
  if (total.item<float>() != 14.0f) {
    std::cerr << "consumer: expected 14, got " << total.item<float>() << "\n";
    return 1;
  }
  std::cout << "consumer: linked against installed pipit, sum of squares = 14\n";
  return 0;
}
