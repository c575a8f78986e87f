#pragma once
// Backend: every raw kernel a device must provide. Kernels write into tensors the caller
// allocated with the right shape and know nothing of gradients. Adding a device means
// implementing this one class; `backend(device)` picks the implementation.
#include <cstdint>
#include <memory>
#include <span>

#include "tensor/generator.h"
#include "tensor/tensor.h"

namespace pipit {

enum class UnaryOp { neg, exp, log, sqrt, abs, tanh, sigmoid, relu, gelu };
// The *_backward ops take (grad, x) and return grad * f'(x); tanh and sigmoid take their
// output y in place of x, as their derivatives are cheapest from it.
enum class BinaryOp {
  add,
  sub,
  mul,
  div,
  pow,
  maximum,
  minimum,
  relu_backward,
  gelu_backward,
  tanh_backward,     // (grad, y = tanh(x))
  sigmoid_backward,  // (grad, y = sigmoid(x))
  eq,
  ne,
  lt,
  le,
  gt,
  ge  // comparisons write b8 masks
};
enum class ReduceOp { sum, max, min };
// "gelu", "relu_backward", "sum": for error messages and profiles.
const char* op_name(UnaryOp op);
const char* op_name(BinaryOp op);
const char* op_name(ReduceOp op);

// One parameter's tensors in an AdamW update: contiguous, one shape, one floating dtype.
struct AdamWSlot {
  Tensor param, grad, exp_avg, exp_avg_sq;
};

// Sliding windows over [N, C, H, W]; output sizes follow from the tensors' shapes.
struct Conv2dGeometry {
  int64_t stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w;
};
struct Pool2dGeometry {
  int64_t kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w;
};

struct AdamWParams {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;  // 1-based, for bias correction
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::shared_ptr<Storage> allocate(size_t nbytes) = 0;

  // dst = src, element by element over any strides, converting dtype.
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;
  virtual void fill(const Tensor& out, double value) = 0;
  virtual void arange(const Tensor& out, double start, double step) = 0;
  // Uniform in [low, high) and normal(mean, std) from `generator`'s counters.
  virtual void uniform(const Tensor& out, Generator& generator, double low, double high) = 0;
  virtual void normal(const Tensor& out, Generator& generator, double mean, double std) = 0;
  // Inverted dropout on contiguous tensors in one pass: element i is kept when the uniform
  // draw uniform(out) would make for it is >= p; mask = kept / (1 - p), out = in * mask.
  virtual void dropout(const Tensor& in, Generator& generator, double p, const Tensor& out,
                       const Tensor& mask) = 0;

  // Elementwise. Inputs have out's shape (broadcast inputs arrive as expanded views).
  virtual void unary(UnaryOp op, const Tensor& in, const Tensor& out) = 0;
  virtual void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  virtual void where(const Tensor& mask, const Tensor& a, const Tensor& b, const Tensor& out) = 0;

  // Reduces `in` over `dims` into out, which has in's rank with those dims of size 1.
  virtual void reduce(ReduceOp op, const Tensor& in, std::span<const int64_t> dims,
                      const Tensor& out) = 0;
  virtual void argmax(const Tensor& in, int64_t dim, const Tensor& out) = 0;

  // out[..., M, N] = a[..., M, K] @ b[..., K, N] (+ out when accumulate); batch dims are
  // already broadcast. a and b share a dtype; out has it too, or is f32 for f16/bf16 inputs
  // (products accumulate in f32 either way).
  virtual void matmul(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate) = 0;

  virtual void softmax(const Tensor& in, int64_t dim, bool log, const Tensor& out) = 0;
  virtual void softmax_backward(const Tensor& grad, const Tensor& out, int64_t dim, bool log,
                                const Tensor& grad_in) = 0;
  // Causal attention weights in one pass: softmax over the last dim of scale * scores, scores
  // [..., T, T], where query row i sees keys 0..i and the later keys get weight 0. The backward
  // is grad_scores = scale * out * (grad - sum(grad * out)) over the row.
  virtual void causal_softmax(const Tensor& scores, double scale, const Tensor& out) = 0;
  virtual void causal_softmax_backward(const Tensor& grad, const Tensor& out, double scale,
                                       const Tensor& grad_scores) = 0;
  // Fused attention of q [B, H, Tq, D] over k and v [B, H, Tk, D] (any strides with unit stride
  // in D): out = softmax(scale * q k^T) v, where with `causal` query i sees keys 0..i + Tk - Tq
  // (the last query sees every key, as a KV cache needs). The [Tq, Tk] weights are never held:
  // lse [B, H, Tq] (contiguous; f64 for f64 inputs, else f32) gets each query's log-sum-exp of
  // its scaled scores, all the backward needs to rebuild them. q, k, v and out share a dtype.
  virtual void attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                         bool causal, const Tensor& out, const Tensor& lse) = 0;
  // Overwrites grad_q, grad_k and grad_v (q's, k's and v's shapes; any strides, unit in D).
  // Each gradient element is summed in one fixed order: the bits do not depend on timing.
  virtual void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& out, const Tensor& lse,
                                  double scale, bool causal, const Tensor& grad_q,
                                  const Tensor& grad_k, const Tensor& grad_v) = 0;
  // Normalises over the last dim; mean and rstd have the leading dims' numel.
  virtual void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                          const Tensor& out, const Tensor& mean, const Tensor& rstd) = 0;
  virtual void layer_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& weight,
                                   const Tensor& mean, const Tensor& rstd, const Tensor& grad_x,
                                   const Tensor& grad_weight, const Tensor& grad_bias) = 0;
  // out[i, :] = weight[indices[i], :]; the backward adds rows of grad into grad_weight.
  virtual void embedding(const Tensor& weight, const Tensor& indices, const Tensor& out) = 0;
  virtual void embedding_backward(const Tensor& grad, const Tensor& indices,
                                  const Tensor& grad_weight) = 0;
  // Per-row -log softmax(logits)[target] for logits [N, C]; ignored rows give 0.
  virtual void cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                             const Tensor& losses) = 0;
  // grad_logits = (softmax(logits) - onehot(target)) * scale, zero on ignored rows. scale is a
  // one-element tensor of the logits' dtype on their device (the loss's gradient over the row
  // count, computed there: reading it on the host would wait for the device).
  virtual void cross_entropy_backward(const Tensor& logits, const Tensor& targets,
                                      int64_t ignore_index, const Tensor& scale,
                                      const Tensor& grad_logits) = 0;

  // Convolution (groups = 1, no bias: autograd adds it) and pooling over [N, C, H, W], as
  // PyTorch computes them. x [N, C, H, W] * weight [O, C, kh, kw] -> out [N, O, OH, OW]; the
  // backward ops overwrite grad_x and grad_weight. Max pooling treats padding as -inf and
  // records in argmax (i64, out's shape) the in-plane offset h * W + w of each window's first
  // maximum, where its gradient goes; average pooling counts padding in the mean.
  virtual void conv2d(const Tensor& x, const Tensor& weight, const Conv2dGeometry& geometry,
                      const Tensor& out) = 0;
  virtual void conv2d_backward_input(const Tensor& grad_out, const Tensor& weight,
                                     const Conv2dGeometry& geometry, const Tensor& grad_x) = 0;
  virtual void conv2d_backward_weight(const Tensor& grad_out, const Tensor& x,
                                      const Conv2dGeometry& geometry,
                                      const Tensor& grad_weight) = 0;
  virtual void max_pool2d(const Tensor& x, const Pool2dGeometry& window, const Tensor& out,
                          const Tensor& argmax) = 0;
  virtual void max_pool2d_backward(const Tensor& grad_out, const Tensor& argmax,
                                   const Pool2dGeometry& window, const Tensor& grad_x) = 0;
  virtual void avg_pool2d(const Tensor& x, const Pool2dGeometry& window, const Tensor& out) = 0;
  virtual void avg_pool2d_backward(const Tensor& grad_out, const Pool2dGeometry& window,
                                   const Tensor& grad_x) = 0;

  // Optimizer updates, in place on contiguous tensors.
  virtual void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
                        double lr, double momentum, double weight_decay, bool first_step) = 0;
  // Updates every slot in one pass: one kernel launch on CUDA however many parameters.
  virtual void adamw_step(std::span<const AdamWSlot> slots, const AdamWParams& params) = 0;
};

Backend& backend(Device device);
// Makes backend(device) return `backend` (null: the device's own again) and returns the
// previous override, for decorators such as cuda::OpTimer. Swap while no other thread is
// running ops on `device`: a call already inside the old backend finishes there.
Backend* set_backend_override(Device device, Backend* backend);
inline Backend& backend(const Tensor& tensor) {
  return backend(tensor.device());
}

}  // namespace pipit
