#include "ps/staleness_gate.h"

#include <algorithm>

namespace pipit {

int64_t StalenessGate::lead(int worker) const {
  int64_t slowest = clock_.at(static_cast<size_t>(worker));
  for (size_t w = 0; w < clock_.size(); ++w) {
    if (live_[w]) slowest = std::min(slowest, clock_[w]);
  }
  return clock_[static_cast<size_t>(worker)] - slowest;
}

}  // namespace pipit
