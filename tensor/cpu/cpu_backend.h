#pragma once
#include "tensor/backend.h"

namespace pipit {

// The CPU implementation of every raw kernel: OpenMP loops, and GEMM from oneDNN or OpenBLAS
// (cpu_gemm_provider()). Its methods are defined across tensor/cpu/*.cpp, one family of
// kernels per file.
class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::cpu(); }
  std::shared_ptr<Storage> allocate(size_t nbytes) override;
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
};

// Where f32 GEMMs on the CPU go. automatic, when the build has oneDNN (CMake PIPIT_GEMM;
// =ONEDNN makes it oneDNN for every product): oneDNN on CPUs with AVX-512; on others OpenBLAS,
// but oneDNN for small products (up to 2^20 multiply-adds); tensor/cpu/matmul.cpp says why.
// f64 products always go to OpenBLAS. Choosing oneDNN in a build without it throws. Results
// do not depend on the thread count with either.
enum class GemmProvider { automatic, onednn, openblas };
void set_cpu_gemm_provider(GemmProvider provider);
// The provider in use: "oneDNN", "OpenBLAS" or "OpenBLAS, oneDNN for small products".
const char* cpu_gemm_provider();

}  // namespace pipit
