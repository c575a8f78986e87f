#pragma once
// StalenessGate: the bookkeeping that keeps bounded-staleness training within its bound.
// A gradient's staleness is the number of updates applied between the worker's read of the
// parameters and the update that includes the gradient. The gate tracks the outstanding
// reads (workers computing from parameters they read, or waiting with a pushed gradient) and
// allows an event only if afterwards every outstanding gradient can still be applied within
// the bound: taken oldest read first, the i-th would join update V + (c + i) / accumulate,
// where V is the current version and c the gradients already summed towards it. Applying the
// oldest outstanding gradient is always allowed, so the gate never deadlocks; a read is
// granted only when it keeps that true, so a worker too far ahead waits for the slow ones.
#include <cstdint>
#include <map>

namespace pipit {

class StalenessGate {
 public:
  // max_staleness < 0: no bound (async).
  StalenessGate(int64_t max_staleness, int64_t accumulate)
      : max_staleness_(max_staleness), accumulate_(accumulate) {}

  // Whether `worker` may read the parameters at `version` now.
  bool may_read(int64_t version, int64_t summed) const;
  // Whether `worker`'s gradient may be summed now, at `version`.
  bool may_apply(int worker, int64_t version, int64_t summed) const;

  void read(int worker, int64_t version) { reads_[worker] = version; }
  // The worker's gradient was applied, or the worker left.
  void forget(int worker) { reads_.erase(worker); }
  // The version `worker` read; it must have an outstanding read.
  int64_t read_version(int worker) const { return reads_.at(worker); }

 private:
  bool feasible(const std::multimap<int64_t, int>& reads, int64_t version, int64_t summed) const;

  int64_t max_staleness_, accumulate_;
  std::map<int, int64_t> reads_;  // worker -> version read
};

}  // namespace pipit
