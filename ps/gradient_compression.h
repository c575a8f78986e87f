#pragma once
// bf16 compression of pushed gradients with error feedback: what rounding to bf16 loses from
// a gradient is added to the next gradient of the same parameter, so nothing is lost for
// good, only late. Halves the bytes of every push.
#include <map>
#include <string>

#include "tensor/tensor.h"

namespace pipit {

class GradientCompressor {
 public:
  // bf16(gradient + residual); the residual becomes what that rounding lost.
  Tensor compress(const std::string& name, const Tensor& gradient);
  const std::map<std::string, Tensor>& residuals() const { return residuals_; }

 private:
  std::map<std::string, Tensor> residuals_;  // f32, one per parameter
};

}  // namespace pipit
