#pragma once
// OpTimer: where a CPU run's time goes, op by op. It is a Backend that forwards every call to
// the backend it wraps and, while enabled, adds the call's wall time to its op's total. CPU
// ops finish before they return, so the wall time is the op's (cuda::OpTimer times a GPU's).
//
//   OpTimer timer(backend(Device::cpu()));
//   Backend* previous = set_backend_override(Device::cpu(), &timer);
//   timer.set_enabled(true);
//   ... run ...
//   set_backend_override(Device::cpu(), previous);
//   for (const OpTimer::Op& op : timer.report()) ...
//
// Only outermost calls are timed: a backend op that calls another (matmul copying an operand)
// counts once, under its own name.
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "tensor/backend.h"

namespace pipit {

struct OpLabel;

class OpTimer final : public Backend {
 public:
  struct Op {
    std::string name;  // the Backend method, with its op where it takes one: "binary.mul"
    int64_t calls = 0;
    double ms = 0;
  };

  // `inner` must outlive the timer.
  explicit OpTimer(Backend& inner) : inner_(inner) {}
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

  void set_enabled(bool enabled) { enabled_ = enabled; }
  // The totals since the last reset, most ms first.
  std::vector<Op> report() const;
  void reset();

  Device device() const override { return inner_.device(); }
  std::shared_ptr<Storage> allocate(size_t nbytes) override;
  // Every op of PIPIT_BACKEND_OPS, forwarded to `inner` and timed (op_timer.cpp).
  PIPIT_BACKEND_OPS(PIPIT_BACKEND_OVERRIDE)

 private:
  template <typename Call>
  void timed(const OpLabel& label, Call&& call);

  Backend& inner_;
  std::atomic<bool> enabled_{false};
  mutable std::mutex mutex_;
  std::map<std::string, Op> totals_;
};

}  // namespace pipit
