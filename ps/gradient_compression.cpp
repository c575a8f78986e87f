#include "ps/gradient_compression.h"

#include "autograd/grad_mode.h"
#include "autograd/ops.h"

namespace pipit {

Tensor GradientCompressor::compress(const std::string& name, const Tensor& gradient) {
  NoGradGuard no_grad;
  auto it = residuals_.find(name);
  const Tensor corrected = it == residuals_.end() ? gradient : gradient + it->second;
  Tensor compressed = corrected.to(DType::bf16);
  Tensor residual = corrected - compressed.to(corrected.dtype());
  residuals_.insert_or_assign(name, residual);
  return compressed;
}

}  // namespace pipit
