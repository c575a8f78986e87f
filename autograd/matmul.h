#pragma once
#include "tensor/tensor.h"

namespace pipit {

// a[..., M, K] @ b[..., K, N] with broadcast batch dims (2-D, 3-D, 4-D, ...).
Tensor matmul(const Tensor& a, const Tensor& b);
// x[..., in] @ weight[out, in]^T + bias[out] (bias may be undefined), as one GEMM.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);
// gelu(linear(x, weight, bias)) (tanh form), the bias and GELU fused into the GEMM where the
// backend can (cuBLASLt's epilogue on CUDA): an MLP's first layer. bias must be defined.
Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias);
// linear(linear_gelu(x, fc_weight, fc_bias), proj_weight, proj_bias): a transformer's MLP, its
// backward one node that takes the GELU's derivative inside the second product's gradient
// (cuBLASLt's DGELU epilogue on CUDA). Both biases must be defined.
Tensor linear_gelu_linear(const Tensor& x, const Tensor& fc_weight, const Tensor& fc_bias,
                          const Tensor& proj_weight, const Tensor& proj_bias);

}  // namespace pipit
