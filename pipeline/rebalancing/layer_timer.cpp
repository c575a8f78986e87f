#include "pipeline/rebalancing/layer_timer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <thread>

#include "autograd/backward_hook.h"
#include "tensor/error.h"

namespace pipit {

namespace {

// Nanoseconds the calling thread has spent runnable but waiting for a core, from Linux's
// /proc/thread-self/schedstat (time on a core, time waiting on a run queue, time slices);
// 0 where the kernel does not keep it.
int64_t runqueue_wait_ns() {
  const int fd = ::open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char text[96];
  const ssize_t n = ::read(fd, text, sizeof text - 1);
  ::close(fd);
  if (n <= 0) return 0;
  text[n] = '\0';
  unsigned long long on_core = 0, waiting = 0;
  if (std::sscanf(text, "%llu %llu", &on_core, &waiting) != 2) return 0;
  return static_cast<int64_t>(waiting);
}

}  // namespace

LayerTimer::LayerTimer(double slowdown) : slowdown_(slowdown) {
  PIPIT_CHECK(slowdown >= 1.0 && slowdown <= 1000.0, "slowdown must be in [1, 1000], got ",
              slowdown);
}

void LayerTimer::begin_step(bool profile) {
  profile_ = profile;
  layers_.clear();
  running_ = -1;
}

LayerTimer::Mark LayerTimer::mark() const {
  return {Clock::now(), slowdown_ != 1.0 ? runqueue_wait_ns() : 0};
}

double LayerTimer::stretch(const Mark& since) const {
  if (slowdown_ != 1.0) {
    const Mark now = mark();
    const auto waited =
        std::chrono::nanoseconds(std::max<int64_t>(now.waited_ns - since.waited_ns, 0));
    const auto worked =
        std::max<Clock::duration>(now.wall - since.wall - waited, Clock::duration{0});
    std::this_thread::sleep_for(
        std::chrono::duration_cast<Clock::duration>(worked * (slowdown_ - 1.0)));
  }
  return std::chrono::duration<double, std::micro>(Clock::now() - since.wall).count();
}

Tensor LayerTimer::forward(Sequential& chunk, const Tensor& x, Tensor* first_output) {
  if (!stepwise() && first_output == nullptr) return chunk.forward(x);
  Tensor h = x;
  for (size_t i = 0; i < chunk.size(); ++i) {
    const auto layer = static_cast<int64_t>(chunk.first_index() + i);
    const Mark start = mark();
    h = chunk[i]->forward(h);
    if (stepwise()) {
      const double took = stretch(start);
      if (profile_) {
        LayerTiming& timing = layers_[layer];
        timing.layer = layer;
        timing.forward_us += took;
        timing.output_bytes = static_cast<double>(h.nbytes());
      }
      if (h.requires_grad()) h = backward_hook(h, [this, layer] { backward_reached(layer); });
    }
    if (i == 0 && first_output != nullptr) *first_output = h;
  }
  return h;
}

void LayerTimer::backward_reached(int64_t layer) {
  if (running_ >= 0) {
    const double took = stretch(since_);
    if (profile_) layers_[running_].backward_us += took;
  }
  running_ = layer;
  since_ = mark();
}

void LayerTimer::timed_backward(Sequential& chunk, const std::function<void()>& run) {
  running_ = -1;
  run();
  // The first layer's backward ends with the call: no hook comes after it.
  if (running_ >= 0 && stepwise()) backward_reached(static_cast<int64_t>(chunk.first_index()) - 1);
  running_ = -1;
}

void LayerTimer::backward(Sequential& chunk, const Tensor& output, const Tensor& grad) {
  timed_backward(chunk, [&] { output.backward(grad); });
}

DeferredGradients LayerTimer::backward_inputs(Sequential& chunk, const Tensor& output,
                                              const Tensor& grad, const Tensor& input) {
  DeferredGradients deferred;
  timed_backward(chunk, [&] { deferred = backward_inputs_first(output, grad, {input}); });
  return deferred;
}

void LayerTimer::weight_gradients(Sequential& chunk, DeferredGradients& deferred) {
  timed_backward(chunk, [&] { deferred.run(); });
}

}  // namespace pipit
