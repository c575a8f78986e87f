#include <cmath>

#include "autograd/ops.h"
#include "optim/optimizer.h"
#include "tensor/backend.h"

namespace pipit {

double clip_grad_norm(const std::vector<Tensor>& parameters, double max_norm) {
  PIPIT_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be positive, got ", max_norm);
  NoGradGuard no_grad;
  double total = 0;
  for (const Tensor& p : parameters) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    Tensor g64 = g.to(DType::f64);
    total += sum(g64 * g64).item<double>();
  }
  const double norm = std::sqrt(total);
  if (norm > max_norm) {
    for (const Tensor& p : parameters) {
      Tensor g = p.grad();
      if (!g.defined()) continue;
      Tensor scale = scalar_like(g, max_norm / (norm + 1e-6));
      backend(g).binary(BinaryOp::mul, g, expand(scale, g.shape()), g);
    }
  }
  return norm;
}

}  // namespace pipit
