#pragma once
// OpTimer: where a CUDA run's time goes, op by op. It is a Backend that forwards every call
// to the backend it wraps and, while enabled, records a CUDA event before and after each call
// on the calling thread's current stream. Events are read back only in report(), so timing
// adds no synchronisation between ops and the run keeps its pace.
//
//   cuda::OpTimer timer(backend(device));
//   Backend* previous = set_backend_override(device, &timer);
//   timer.set_enabled(true);
//   ... run ...
//   set_backend_override(device, previous);
//   for (const cuda::OpTime& op : timer.report()) ...
//
// Only outermost calls are timed: a backend op that calls another (matmul copying an operand)
// counts once, under its own name.
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "tensor/backend.h"

namespace pipit {
struct OpLabel;
}

namespace pipit::cuda {

struct OpTime {
  std::string name;  // the Backend method, with its op where it takes one: "binary.mul"
  int64_t calls = 0;
  // Between the events around each call. When the GPU is behind the host this is the op's
  // kernels; when the host is behind, it is the host's time inside the call as well.
  double gpu_ms = 0;
  double host_ms = 0;  // wall time of the calls on the host: launches, checks, allocation
};

class OpTimer final : public Backend {
 public:
  // `inner` must outlive the timer and belong to a CUDA device.
  explicit OpTimer(Backend& inner);
  ~OpTimer() override;
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

  void set_enabled(bool enabled) { enabled_ = enabled; }
  // Waits for the recorded events and returns the totals since the last reset, most gpu_ms
  // first.
  std::vector<OpTime> report();
  void reset();

  Device device() const override { return inner_.device(); }
  std::shared_ptr<Storage> allocate(size_t nbytes) override;
  // Every op of PIPIT_BACKEND_OPS, forwarded to `inner` and timed (op_timer.cpp).
  PIPIT_BACKEND_OPS(PIPIT_BACKEND_OVERRIDE)

 private:
  struct State;
  template <typename Call>
  void timed(const OpLabel& label, Call&& call);

  Backend& inner_;
  std::atomic<bool> enabled_{false};
  std::unique_ptr<State> state_;
};

}  // namespace pipit::cuda
