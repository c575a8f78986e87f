#include "ps/staleness_gate.h"

namespace pipit {

bool StalenessGate::feasible(const std::multimap<int64_t, int>& reads, int64_t version,
                             int64_t summed) const {
  if (max_staleness_ < 0) return true;
  int64_t position = 0;
  for (const auto& [read, worker] : reads) {
    if (version + (summed + position) / accumulate_ - read > max_staleness_) return false;
    ++position;
  }
  return true;
}

bool StalenessGate::may_read(int64_t version, int64_t summed) const {
  std::multimap<int64_t, int> reads;
  for (const auto& [worker, read] : reads_) reads.emplace(read, worker);
  reads.emplace(version, -1);
  return feasible(reads, version, summed);
}

bool StalenessGate::may_apply(int worker, int64_t version, int64_t summed) const {
  if (max_staleness_ >= 0 && version - reads_.at(worker) > max_staleness_) return false;
  std::multimap<int64_t, int> others;
  for (const auto& [w, read] : reads_) {
    if (w != worker) others.emplace(read, w);
  }
  const int64_t after = summed + 1;
  return feasible(others, version + after / accumulate_, after % accumulate_);
}

}  // namespace pipit
