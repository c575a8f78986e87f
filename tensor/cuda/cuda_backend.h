#pragma once
#include "tensor/backend.h"

namespace pipit {

// The CUDA implementation of every raw kernel, one instance per device. Kernels are our own
// except GEMM (cuBLAS); all run on the legacy default stream of the tensor's device, so ops
// are ordered as they are issued and copies back to the host wait for them.
// Methods are defined across tensor/cuda/*: memory, copies and GEMM in cuda_backend.cpp,
// elementwise, random and optimizer kernels in elementwise.cu, reductions and fused nn kernels
// in reduce.cu, convolutions (cuDNN) in conv.cpp, pooling in pool.cu.
class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int index) : index_(index) {}
  Device device() const override { return Device::cuda(index_); }
  std::shared_ptr<Storage> allocate(size_t nbytes) override;
  // Either side may be on the CPU: pipit routes every copy touching a CUDA tensor here.
  void copy(const Tensor& src, const Tensor& dst) override;
  void fill(const Tensor& out, double value) override;
  void arange(const Tensor& out, double start, double step) override;
  void uniform(const Tensor& out, Generator& generator, double low, double high) override;
  void normal(const Tensor& out, Generator& generator, double mean, double std) override;
  void dropout(const Tensor& in, Generator& generator, double p, const Tensor& out,
               const Tensor& mask) override;
  void unary(UnaryOp op, const Tensor& in, const Tensor& out) override;
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) override;
  void where(const Tensor& mask, const Tensor& a, const Tensor& b, const Tensor& out) override;
  void reduce(ReduceOp op, const Tensor& in, std::span<const int64_t> dims,
              const Tensor& out) override;
  void argmax(const Tensor& in, int64_t dim, const Tensor& out) override;
  void matmul(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate) override;
  void softmax(const Tensor& in, int64_t dim, bool log, const Tensor& out) override;
  void softmax_backward(const Tensor& grad, const Tensor& out, int64_t dim, bool log,
                        const Tensor& grad_in) override;
  void causal_softmax(const Tensor& scores, double scale, const Tensor& out) override;
  void causal_softmax_backward(const Tensor& grad, const Tensor& out, double scale,
                               const Tensor& grad_scores) override;
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool causal,
                 const Tensor& out, const Tensor& lse) override;
  void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& out, const Tensor& lse, double scale, bool causal,
                          const Tensor& grad_q, const Tensor& grad_k,
                          const Tensor& grad_v) override;
  void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                  const Tensor& out, const Tensor& mean, const Tensor& rstd) override;
  void layer_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& weight,
                           const Tensor& mean, const Tensor& rstd, const Tensor& grad_x,
                           const Tensor& grad_weight, const Tensor& grad_bias) override;
  void embedding(const Tensor& weight, const Tensor& indices, const Tensor& out) override;
  void embedding_backward(const Tensor& grad, const Tensor& indices,
                          const Tensor& grad_weight) override;
  void cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                     const Tensor& losses) override;
  void cross_entropy_backward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                              const Tensor& scale, const Tensor& grad_logits) override;
  void conv2d(const Tensor& x, const Tensor& weight, const Conv2dGeometry& geometry,
              const Tensor& out) override;
  void conv2d_backward_input(const Tensor& grad_out, const Tensor& weight,
                             const Conv2dGeometry& geometry, const Tensor& grad_x) override;
  void conv2d_backward_weight(const Tensor& grad_out, const Tensor& x,
                              const Conv2dGeometry& geometry, const Tensor& grad_weight) override;
  void max_pool2d(const Tensor& x, const Pool2dGeometry& window, const Tensor& out,
                  const Tensor& argmax) override;
  void max_pool2d_backward(const Tensor& grad_out, const Tensor& argmax,
                           const Pool2dGeometry& window, const Tensor& grad_x) override;
  void avg_pool2d(const Tensor& x, const Pool2dGeometry& window, const Tensor& out) override;
  void avg_pool2d_backward(const Tensor& grad_out, const Pool2dGeometry& window,
                           const Tensor& grad_x) override;
  void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer, double lr,
                double momentum, double weight_decay, bool first_step) override;
  void adamw_step(std::span<const AdamWSlot> slots, const AdamWParams& params) override;

 private:
  int index_;
};

}  // namespace pipit
