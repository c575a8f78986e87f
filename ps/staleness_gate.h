#pragma once
// StalenessGate: stale synchronous parallel over steps (Ho et al., 2013), as one shard keeps
// it. A worker's clock is the number of gradients it has pushed to the shard; the gate lets a
// worker read the parameters for its next step only while its clock is at most max_staleness
// ahead of the slowest live worker's. Every worker pushes to every shard once a step, so all
// shards count the same clocks: whatever the number of shards, the slowest worker is never
// held back, and the shards cannot hold each other up.
//
// Between a worker's read and its push, each other worker pushes at most 2 * max_staleness + 1
// gradients: its clock was at least the reader's minus max_staleness at the read, and at most
// the reader's plus max_staleness + 1 at the push. So a gradient's staleness in versions is at
// most ceil(((workers - 1) * (2 * max_staleness + 1)) / accumulate).
#include <cstdint>
#include <vector>

namespace pipit {

class StalenessGate {
 public:
  // max_staleness < 0: no bound (async).
  StalenessGate(int workers, int64_t max_staleness)
      : max_staleness_(max_staleness),
        clock_(static_cast<size_t>(workers), 0),
        live_(static_cast<size_t>(workers), true) {}

  void pushed(int worker) { ++clock_.at(static_cast<size_t>(worker)); }
  // The worker left or was lost: it no longer holds the others back.
  void gone(int worker) { live_.at(static_cast<size_t>(worker)) = false; }
  // How many steps `worker` is ahead of the slowest live worker.
  int64_t lead(int worker) const;
  bool may_read(int worker) const { return max_staleness_ < 0 || lead(worker) <= max_staleness_; }

 private:
  int64_t max_staleness_;
  std::vector<int64_t> clock_;
  std::vector<bool> live_;
};

}  // namespace pipit
