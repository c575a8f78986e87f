#pragma once
// Mixed precision. Inside an AutocastGuard(DType::bf16) (or f16) on a thread, every matrix
// product of f32 tensors (matmul, Linear, attention) rounds its operands to that dtype, keeps
// them in that dtype for the backward pass, multiplies with f32 accumulation and returns f32.
// Parameters, their gradients and optimizer state stay f32 (the master copy); layer norm,
// softmax, losses and elementwise ops stay f32. f16's narrow range needs loss scaling
// (optim/grad_scaler.h); bf16 has f32's range and needs none.
#include "tensor/tensor.h"

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

// Inside a CastCache on a thread, autocast rounds each parameter (a leaf that requires grad)
// once and reuses the copy, as torch's autocast caches its weight casts: for loops that run a
// model many times between updates, such as generate(). The parameters must not change while
// the outermost CastCache of the thread is open; it drops the copies when it closes.
class CastCache {
 public:
  CastCache();
  ~CastCache();
  CastCache(const CastCache&) = delete;
  CastCache& operator=(const CastCache&) = delete;
};

// t rounded to `dtype` outside the graph, as autocast hands it to a kernel: t itself when it
// has that dtype, a cached copy for a parameter inside a CastCache, else a fresh copy.
Tensor autocast_operand(const Tensor& t, DType dtype);

}  // namespace pipit
