#include "tensor/op_timer.h"

#include <algorithm>
#include <chrono>

#include "tensor/op_label.h"

namespace pipit {

template <typename Call>
void OpTimer::timed(const OpLabel& label, Call&& call) {
  if (!enabled_ || timed_depth > 0) return call();
  TimedScope depth;
  const auto start = std::chrono::steady_clock::now();
  call();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::string name = label.name();
  std::lock_guard<std::mutex> lock(mutex_);
  Op& total = totals_[name];
  total.name = std::move(name);
  total.calls += 1;
  total.ms += ms;
}

std::vector<OpTimer::Op> OpTimer::report() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Op> ops;
  for (const auto& [name, total] : totals_) ops.push_back(total);
  std::sort(ops.begin(), ops.end(), [](const Op& a, const Op& b) { return a.ms > b.ms; });
  return ops;
}

void OpTimer::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  totals_.clear();
}

std::shared_ptr<Storage> OpTimer::allocate(size_t nbytes) {
  std::shared_ptr<Storage> storage;
  timed({"allocate"}, [&] { storage = inner_.allocate(nbytes); });
  return storage;
}

#define PIPIT_HOST_OP_TIMER_FORWARD(name, params, args) \
  PIPIT_OP_TIMER_FORWARD(OpTimer, name, params, args)
PIPIT_BACKEND_OPS(PIPIT_HOST_OP_TIMER_FORWARD)
#undef PIPIT_HOST_OP_TIMER_FORWARD

}  // namespace pipit
