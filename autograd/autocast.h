#pragma once
// Mixed precision, as torch's autocast. Inside an AutocastGuard(DType::bf16) (or f16) on a
// thread, every matrix product (matmul, Linear, attention) of f32 or bf16 tensors rounds its
// operands to bf16, keeps them so for the backward pass, multiplies with f32 accumulation and
// returns bf16: activations between products stay bf16 (GELU, dropout and the cross-entropy
// read them as they are, computing in f32), and each gradient goes back in its tensor's own
// dtype. Parameters, their gradients and optimizer state stay f32 (the master copy). Softmax
// and layer norm widen bf16 inputs to f32 (layer_norm_for_products, for a result that only
// feeds products, writes it in bf16 at once); adding a bf16 tensor to an f32 one (a residual)
// gives f32, the bf16 one read as it is. f16's narrow range needs loss scaling
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

// Inside an AutocastGuard, a half x widened to f32 inside the graph (its gradient goes back in
// its own dtype); else x. Softmax and layer norm run on it, as torch's autocast runs them in
// f32.
Tensor autocast_widened(const Tensor& x);

// t rounded to `dtype` outside the graph, as autocast hands it to a kernel: t itself when it
// has that dtype, a cached copy for a parameter inside a CastCache, else a fresh copy.
Tensor autocast_operand(const Tensor& t, DType dtype);

}  // namespace pipit
