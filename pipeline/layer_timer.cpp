#include "pipeline/layer_timer.h"

#include <functional>
#include <thread>

#include "autograd/backward_hook.h"
#include "tensor/error.h"

namespace pipit {

LayerTimer::LayerTimer(double slowdown) : slowdown_(slowdown) {
  PIPIT_CHECK(slowdown >= 1.0 && slowdown <= 1000.0, "slowdown must be in [1, 1000], got ",
              slowdown);
}

void LayerTimer::begin_step(bool profile) {
  profile_ = profile;
  layers_.clear();
  running_ = -1;
}

double LayerTimer::stretch(Clock::time_point since) const {
  const auto took = Clock::now() - since;
  if (slowdown_ != 1.0) {
    std::this_thread::sleep_for(
        std::chrono::duration_cast<Clock::duration>(took * (slowdown_ - 1.0)));
  }
  return std::chrono::duration<double, std::micro>(Clock::now() - since).count();
}

Tensor LayerTimer::forward(Sequential& chunk, const Tensor& x, Tensor* first_output) {
  if (!stepwise() && first_output == nullptr) return chunk.forward(x);
  Tensor h = x;
  for (size_t i = 0; i < chunk.size(); ++i) {
    const auto layer = static_cast<int64_t>(chunk.first_index() + i);
    const auto start = Clock::now();
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
  since_ = Clock::now();
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
