#pragma once
// Ballast: `size` weights that cost almost nothing forward and backward (x + 0 * sum(w)),
// whose gradients (zeros of the weights' shape) still travel wherever gradients go: beside
// sleeping layers (sleep_layer.h) they give a benchmark a model's bytes without its compute.
// Registered as "Ballast" (register_ballast_layer) so that a model can be rebuilt from its
// config.
#include "nn/registry.h"
#include "pipit.h"

namespace pipit::support {

class Ballast final : public Module {
 public:
  explicit Ballast(int64_t size) : size_(size) { register_parameter("w", zeros({size})); }
  Tensor forward(const Tensor& x) override { return x + sum(parameters()[0]) * 0.0; }
  json config() const override { return {{"type", "Ballast"}, {"size", size_}}; }

 private:
  int64_t size_;
};

inline void register_ballast_layer() {
  register_module_type(
      "Ballast", [](const json& c) { return std::make_shared<Ballast>(config_int(c, "size")); });
}

}  // namespace pipit::support
