#pragma once
// Coordinator::Busy, shared by the files that define the Coordinator's calls: one call at a
// time, and a clear error for a second one (a step from another thread during a remap).
#include <atomic>

#include "pipeline/coordinator.h"

namespace pipit {

class Coordinator::Busy {
 public:
  Busy(std::atomic<bool>& busy, const char* what) : busy_(busy) {
    PIPIT_CHECK(!busy_.exchange(true), "pipeline: ", what,
                " was called while another call (a step, a remap or a state fetch) was "
                "still running; the pipeline takes one call at a time, between steps");
  }
  ~Busy() { busy_ = false; }
  Busy(const Busy&) = delete;
  Busy& operator=(const Busy&) = delete;

 private:
  std::atomic<bool>& busy_;
};

}  // namespace pipit
