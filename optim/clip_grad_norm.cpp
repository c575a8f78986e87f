#include <cmath>
#include <map>
#include <string>

#include "autograd/ops.h"
#include "optim/optimizer.h"
#include "tensor/backend.h"

namespace pipit {

double grad_norm_squared(const std::vector<Tensor>& parameters) {
  NoGradGuard no_grad;
  // Summed on each gradient's device and read back once per device: a GPU waits for its
  // queued work once, not once per parameter.
  std::map<std::string, Tensor> totals;
  for (const Tensor& p : parameters) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    Tensor g64 = g.to(DType::f64);
    Tensor& total = totals[g.device().str()];
    total = total.defined() ? total + sum(g64 * g64) : sum(g64 * g64);
  }
  double total = 0;
  for (const auto& [device, sum_on_device] : totals) total += sum_on_device.item<double>();
  return total;
}

void scale_gradients(const std::vector<Tensor>& parameters, double factor) {
  NoGradGuard no_grad;
  for (const Tensor& p : parameters) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    Tensor scale = scalar_like(g, factor);
    backend(g).binary(BinaryOp::mul, g, expand(scale, g.shape()), g);
  }
}

double clip_coefficient(double norm, double max_norm) {
  PIPIT_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be positive, got ", max_norm);
  return norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
}

double clip_grad_norm(const std::vector<Tensor>& parameters, double max_norm) {
  const double norm = std::sqrt(grad_norm_squared(parameters));
  const double coefficient = clip_coefficient(norm, max_norm);
  if (coefficient != 1.0) scale_gradients(parameters, coefficient);
  return norm;
}

}  // namespace pipit
