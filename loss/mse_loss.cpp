#include "autograd/ops.h"
#include "loss/loss.h"
#include "tensor/backend.h"

namespace pipit {
namespace {
void check_same(const Tensor& output, const Tensor& target) {
  PIPIT_CHECK(output.shape() == target.shape(), "MSELoss: output shape ", shape_str(output.shape()),
              " differs from target shape ", shape_str(target.shape()));
  // Floating dtypes meet in the wider one (an f16 output of autocast against an f32 target).
  PIPIT_CHECK(output.dtype() == target.dtype() ||
                  (is_floating(output.dtype()) && is_floating(target.dtype())),
              "MSELoss: output dtype ", output.dtype(), " differs from target dtype ",
              target.dtype());
}
}  // namespace

Tensor MSELoss::compute_loss(const Tensor& output, const Tensor& target) const {
  check_same(output, target);
  Tensor diff = output - target;
  return mean(diff * diff);
}

Tensor MSELoss::compute_gradient(const Tensor& output, const Tensor& target) const {
  check_same(output, target);
  NoGradGuard no_grad;
  return ((output - target) * (2.0 / static_cast<double>(output.numel()))).to(output.dtype());
}

nlohmann::json MSELoss::config() const {
  return {{"type", "MSELoss"}};
}

}  // namespace pipit
