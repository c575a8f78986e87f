#include "tensor/cuda/op_timer.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>

#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/cuda_device.h"
#include "tensor/op_label.h"

namespace pipit::cuda {

struct OpTimer::State {
  struct Pending {
    std::string name;
    cudaEvent_t start, stop;
    double host_ms;
  };
  std::mutex mutex;
  std::vector<Pending> pending;
  std::map<std::string, OpTime> totals;
  // Events whose times have been read, for reuse: creating one per op would cost more than
  // the small kernels being timed.
  std::vector<cudaEvent_t> spare;

  cudaEvent_t take_event() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!spare.empty()) {
        cudaEvent_t event = spare.back();
        spare.pop_back();
        return event;
      }
    }
    cudaEvent_t event = nullptr;
    PIPIT_CUDA_CHECK("op timer", cudaEventCreate(&event));
    return event;
  }
};

OpTimer::OpTimer(Backend& inner) : inner_(inner), state_(std::make_unique<State>()) {
  PIPIT_CHECK(inner.device().is_cuda(), "OpTimer: wraps a CUDA backend, got ", inner.device());
}

OpTimer::~OpTimer() {
  for (const auto& p : state_->pending) {
    cudaEventDestroy(p.start);
    cudaEventDestroy(p.stop);
  }
  for (cudaEvent_t event : state_->spare) cudaEventDestroy(event);
  cudaGetLastError();  // a destructor cannot report it; it must not stick to the next op
}

template <typename Call>
void OpTimer::timed(const OpLabel& label, Call&& call) {
  if (!enabled_ || timed_depth > 0) return call();
  TimedScope depth;
  const int index = inner_.device().index;
  DeviceGuard guard(index);
  auto stream = static_cast<cudaStream_t>(current_stream_handle(index));
  const cudaEvent_t start = state_->take_event(), stop = state_->take_event();
  PIPIT_CUDA_CHECK("op timer", cudaEventRecord(start, stream));
  const auto host_start = std::chrono::steady_clock::now();
  try {
    call();
  } catch (...) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->spare.insert(state_->spare.end(), {start, stop});
    throw;
  }
  const double host_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - host_start)
          .count();
  PIPIT_CUDA_CHECK("op timer", cudaEventRecord(stop, stream));
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->pending.push_back({label.name(), start, stop, host_ms});
}

std::vector<OpTime> OpTimer::report() {
  DeviceGuard guard(inner_.device().index);
  std::lock_guard<std::mutex> lock(state_->mutex);
  for (const auto& p : state_->pending) {
    PIPIT_CUDA_CHECK("op timer", cudaEventSynchronize(p.stop));
    float ms = 0;
    PIPIT_CUDA_CHECK("op timer", cudaEventElapsedTime(&ms, p.start, p.stop));
    OpTime& total = state_->totals[p.name];
    total.name = p.name;
    total.calls += 1;
    total.gpu_ms += ms;
    total.host_ms += p.host_ms;
    state_->spare.insert(state_->spare.end(), {p.start, p.stop});
  }
  state_->pending.clear();
  std::vector<OpTime> ops;
  for (const auto& [name, total] : state_->totals) ops.push_back(total);
  std::sort(ops.begin(), ops.end(),
            [](const OpTime& a, const OpTime& b) { return a.gpu_ms > b.gpu_ms; });
  return ops;
}

void OpTimer::reset() {
  report();
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->totals.clear();
}

std::shared_ptr<Storage> OpTimer::allocate(size_t nbytes) {
  std::shared_ptr<Storage> storage;
  timed({"allocate"}, [&] { storage = inner_.allocate(nbytes); });
  return storage;
}

#define PIPIT_CUDA_OP_TIMER_FORWARD(name, params, args) \
  PIPIT_OP_TIMER_FORWARD(OpTimer, name, params, args)
PIPIT_BACKEND_OPS(PIPIT_CUDA_OP_TIMER_FORWARD)
#undef PIPIT_CUDA_OP_TIMER_FORWARD

}  // namespace pipit::cuda
