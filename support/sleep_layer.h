#pragma once
// SleepLayer: y = x * w, costing `forward_us` forward and twice that backward (half for the
// input gradient, half for the weight gradient) whatever the machine, and without using a core
// while it waits: stages built of them do not compete for cores, so a 2-core machine can time
// pipelines of many stages. Registered as "SleepLayer" (register_sleep_layer) so a remap can
// rebuild it from its config.
#include <chrono>
#include <thread>
#include <vector>

#include <sys/prctl.h>

#include "autograd/node.h"
#include "nn/registry.h"
#include "pipit.h"

namespace pipit::support {

// Backward of y = x * w: the input gradient costs `input_cost`, the weight gradient
// `weight_cost`, each paid only when that gradient is computed, so a split backward (I, then W)
// pays them in the tasks a zero-bubble schedule puts them in. A layer whose input needs no
// gradient (the model's first) pays both with the weight gradient, as before the split.
class SleepBackward final : public Node {
 public:
  Tensor x, w;
  bool input_needs_grad = true;
  std::chrono::microseconds input_cost{0}, weight_cost{0};
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    Tensor grad_x, grad_w;
    if (next[0] || (!input_needs_grad && next[1])) std::this_thread::sleep_for(input_cost);
    if (next[0]) grad_x = grad_output * w;
    if (next[1]) {
      std::this_thread::sleep_for(weight_cost);
      grad_w = reshape(sum(grad_output * x), {1});
    }
    return {grad_x, grad_w};
  }
  std::string name() const override { return "SleepBackward"; }
};

// y = x * w, costing `forward_us` forward and as much again for each of the input and the
// weight gradient.
class SleepLayer final : public Module {
 public:
  explicit SleepLayer(int64_t forward_us) : forward_us_(forward_us) {
    register_parameter("w", ones({1}));
  }
  Tensor forward(const Tensor& x) override {
    // Linux lets sleeps overshoot by 50 us by default; the layer's cost must be what it says.
    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    std::this_thread::sleep_for(std::chrono::microseconds(forward_us_));
    const Tensor w = parameters()[0];
    Tensor out;
    {
      NoGradGuard no_grad;
      out = x * w;
    }
    if (auto node = detail::make_node<SleepBackward>(out, {x, w})) {
      node->x = x.detach();
      node->w = w.detach();
      node->input_needs_grad = x.requires_grad();
      node->input_cost = node->weight_cost = std::chrono::microseconds(forward_us_);
    }
    return out;
  }
  json config() const override { return {{"type", "SleepLayer"}, {"forward_us", forward_us_}}; }

 private:
  int64_t forward_us_;
};

inline void register_sleep_layer() {
  register_module_type("SleepLayer", [](const json& c) {
    return std::make_shared<SleepLayer>(config_int(c, "forward_us"));
  });
}

}  // namespace pipit::support
