#pragma once
// SleepLayer: y = x * w, costing `forward_us` forward and twice that backward whatever the
// machine, and without using a core while it waits: stages built of them do not compete for
// cores, so a 2-core machine can time pipelines of many stages. Registered as "SleepLayer"
// (register_sleep_layer) so a remap can rebuild it from its config.
#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include <sys/prctl.h>

#include "autograd/function.h"
#include "nn/registry.h"
#include "pipit.h"

namespace pipit::bench {

class SleepBackward final : public Node {
 public:
  std::chrono::microseconds cost{0};
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    std::this_thread::sleep_for(cost);
    return {grad_output};
  }
  std::string name() const override { return "SleepBackward"; }
};

class SleepLayer final : public Module {
 public:
  explicit SleepLayer(int64_t forward_us) : forward_us_(forward_us) {
    register_parameter("w", ones({1}));
  }
  Tensor forward(const Tensor& x) override {
    // Linux lets sleeps overshoot by 50 us by default; the layer's cost must be what it says.
    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    std::this_thread::sleep_for(std::chrono::microseconds(forward_us_));
    Tensor y = x * parameters()[0];
    Tensor out = y.detach();
    if (auto node = detail::make_node<SleepBackward>(out, {y})) {
      node->cost = std::chrono::microseconds(2 * forward_us_);
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

inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0 : values[values.size() / 2];
}

}  // namespace pipit::bench
