#pragma once
// Mixed precision. Inside an AutocastGuard(DType::bf16) (or f16) on a thread, every matrix
// product of f32 tensors (matmul, Linear, attention) rounds its operands to that dtype, keeps
// them in that dtype for the backward pass, multiplies with f32 accumulation and returns f32.
// Parameters, their gradients and optimizer state stay f32 (the master copy); layer norm,
// softmax, losses and elementwise ops stay f32. f16's narrow range needs loss scaling
// (optim/grad_scaler.h); bf16 has f32's range and needs none.
#include "tensor/dtype.h"

namespace pipit {

class AutocastGuard {
 public:
  // f32 turns autocast off for the scope; bf16 and f16 turn it on; other dtypes throw.
  explicit AutocastGuard(DType dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  DType previous_;
};

// The calling thread's autocast dtype: f32 when off.
DType autocast_dtype();

}  // namespace pipit
