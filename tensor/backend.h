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
// binary's one mix of dtypes: add of an f32 operand and a half one into f32, the half one
// widened as it is read (a residual joining autocast's activations, with no f32 copy of them).
bool is_widening_add(const Tensor& a, const Tensor& b);
// Throws, naming the dtypes, unless op, a, b and out are that mix.
void check_widening_add(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out);

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

// The ops every backend provides, written once: each entry X(name, (parameters), (arguments))
// is a method `void name(parameters)`; the arguments are the parameters' names, in order, for
// code that forwards a call (cuda::OpTimer), and backend.cpp checks at compile time that they
// match. Backend declares each op pure virtual, and CpuBackend, CudaBackend and cuda::OpTimer
// declare their overrides from this list with PIPIT_BACKEND_OVERRIDE.
//
// Adding an op is one entry here, with its comment, plus its kernels: a definition
// `void CpuBackend::name(...)` in tensor/cpu/*.cpp and `void CudaBackend::name(...)` in
// tensor/cuda/* (OpTimer forwards it by itself). A backend without its definition fails to
// link, naming the method. Comments in the list are /* */: a // comment would swallow the
// lines after it.
#define PIPIT_BACKEND_OPS(X)                                                                       \
  /* dst = src, element by element over any strides, converting dtype. */                          \
  X(copy, (const Tensor& src, const Tensor& dst), (src, dst))                                      \
  X(fill, (const Tensor& out, double value), (out, value))                                         \
  X(arange, (const Tensor& out, double start, double step), (out, start, step))                    \
  /* Uniform in [low, high) and normal(mean, std) from `generator`'s counters. */                  \
  X(uniform, (const Tensor& out, Generator& generator, double low, double high),                   \
    (out, generator, low, high))                                                                   \
  X(normal, (const Tensor& out, Generator& generator, double mean, double std),                    \
    (out, generator, mean, std))                                                                   \
  /* Inverted dropout on contiguous tensors in one pass: element i is kept when the uniform        \
     draw uniform(out) would make for it is >= p; mask = kept / (1 - p), out = in * mask. */       \
  X(dropout,                                                                                       \
    (const Tensor& in, Generator& generator, double p, const Tensor& out, const Tensor& mask),     \
    (in, generator, p, out, mask))                                                                 \
                                                                                                   \
  /* Elementwise. Inputs have out's shape (broadcast inputs arrive as expanded views) and its      \
     dtype (but see is_widening_add). Half inputs compute in f32, each result rounded once (so do  \
     dropout, reduce and argmax). */                                                               \
  X(unary, (UnaryOp op, const Tensor& in, const Tensor& out), (op, in, out))                       \
  X(binary, (BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out), (op, a, b, out))   \
  X(where, (const Tensor& mask, const Tensor& a, const Tensor& b, const Tensor& out),              \
    (mask, a, b, out))                                                                             \
                                                                                                   \
  /* Reduces `in` over `dims` into out, which has in's rank with those dims of size 1. */          \
  X(reduce, (ReduceOp op, const Tensor& in, std::span<const int64_t> dims, const Tensor& out),     \
    (op, in, dims, out))                                                                           \
  X(argmax, (const Tensor& in, int64_t dim, const Tensor& out), (in, dim, out))                    \
                                                                                                   \
  /* out[..., M, N] = a[..., M, K] @ b[..., K, N] (+ out when accumulate); batch dims are          \
     already broadcast. a and b share a dtype; out has it too, or is f32 for f16/bf16 inputs       \
     (products accumulate in f32 either way). */                                                   \
  X(matmul, (const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate),                \
    (a, b, out, accumulate))                                                                       \
  /* Linear's products with their bias work fused (cuBLASLt's epilogues on CUDA), 2-D, dtypes      \
     as for matmul. matmul_bias: out[M, N] = a[M, K] @ b[K, N] + bias[N] (bias contiguous, in      \
     out's dtype), the bias added to the f32 sums before they are rounded once.                    \
     matmul_bias_grad: out = a @ b as matmul, and bias_grad[M] (out's dtype) = a summed over K:    \
     with a a Linear's output gradient transposed, its weight and bias gradients in one read. */   \
  X(matmul_bias, (const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& out),        \
    (a, b, bias, out))                                                                             \
  X(matmul_bias_grad,                                                                              \
    (const Tensor& a, const Tensor& b, const Tensor& out, const Tensor& bias_grad),                \
    (a, b, out, bias_grad))                                                                        \
  /* pre = a @ b + bias as matmul_bias, and out = gelu(pre) (tanh form), both [M, N] in out's      \
     dtype: an MLP's first product and its activation in one pass (on CUDA cuBLASLt computes       \
     gelu from the f32 sum before rounding; the CPU from pre as rounded). */                       \
  X(matmul_bias_gelu,                                                                              \
    (const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& pre, const Tensor& out),  \
    (a, b, bias, pre, out))                                                                        \
  /* out = (a @ b) * gelu'(pre) (tanh form), pre and out [M, N] in out's dtype: the gradient at    \
     an MLP's GELU input from its second product's output gradient a and weight b (on CUDA         \
     cuBLASLt's DGELU epilogue scales the f32 sums before rounding once; the CPU rounds the        \
     product first, as matmul then gelu_backward would). */                                        \
  X(matmul_dgelu, (const Tensor& a, const Tensor& b, const Tensor& pre, const Tensor& out),        \
    (a, b, pre, out))                                                                              \
                                                                                                   \
  X(softmax, (const Tensor& in, int64_t dim, bool log, const Tensor& out), (in, dim, log, out))    \
  X(softmax_backward,                                                                              \
    (const Tensor& grad, const Tensor& out, int64_t dim, bool log, const Tensor& grad_in),         \
    (grad, out, dim, log, grad_in))                                                                \
  /* Causal attention weights in one pass: softmax over the last dim of scale * scores, scores     \
     [..., T, T], where query row i sees keys 0..i and the later keys get weight 0. The            \
     backward is grad_scores = scale * out * (grad - sum(grad * out)) over the row. */             \
  X(causal_softmax, (const Tensor& scores, double scale, const Tensor& out), (scores, scale, out)) \
  X(causal_softmax_backward,                                                                       \
    (const Tensor& grad, const Tensor& out, double scale, const Tensor& grad_scores),              \
    (grad, out, scale, grad_scores))                                                               \
  /* Fused attention of q [B, H, Tq, D] over k and v [B, H, Tk, D] (any strides with unit          \
     stride in D): out = softmax(scale * q k^T) v, where with `causal` query i sees keys           \
     0..i + Tk - Tq (the last query sees every key, as a KV cache needs). The [Tq, Tk] weights     \
     are never held: lse [B, H, Tq] (contiguous; f64 for f64 inputs, else f32) gets each           \
     query's log-sum-exp of its scaled scores, all the backward needs to rebuild them. q, k, v     \
     and out share a dtype. */                                                                     \
  X(attention,                                                                                     \
    (const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool causal,                 \
     const Tensor& out, const Tensor& lse),                                                        \
    (q, k, v, scale, causal, out, lse))                                                            \
  /* Overwrites grad_q, grad_k and grad_v (q's, k's and v's shapes; any strides, unit in D).       \
     Each gradient element is summed in one fixed order: the bits do not depend on timing. */      \
  X(attention_backward,                                                                            \
    (const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, \
     const Tensor& lse, double scale, bool causal, const Tensor& grad_q, const Tensor& grad_k,     \
     const Tensor& grad_v),                                                                        \
    (grad_out, q, k, v, out, lse, scale, causal, grad_q, grad_k, grad_v))                          \
  /* Normalises over the last dim; mean and rstd have the leading dims' numel. weight, bias,       \
     mean, rstd, grad_x, grad_weight and grad_bias have x's dtype; so have out and grad, or for    \
     f32 x either may be f16 or bf16 (a normalised operand of autocast's products: out rounded     \
     once from the f32 result, grad widened as read). The backward's residual, when defined (x's   \
     shape and dtype, contiguous), is a gradient that already waits for x: grad_x = residual +     \
     x's own gradient, the bits of a separate add (grad_x may be residual itself). */              \
  X(layer_norm,                                                                                    \
    (const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& out,     \
     const Tensor& mean, const Tensor& rstd),                                                      \
    (x, weight, bias, eps, out, mean, rstd))                                                       \
  X(layer_norm_backward,                                                                           \
    (const Tensor& grad, const Tensor& x, const Tensor& weight, const Tensor& mean,                \
     const Tensor& rstd, const Tensor& residual, const Tensor& grad_x, const Tensor& grad_weight,  \
     const Tensor& grad_bias),                                                                     \
    (grad, x, weight, mean, rstd, residual, grad_x, grad_weight, grad_bias))                       \
  /* out[i, :] = weight[indices[i], :]; the backward adds rows of grad into grad_weight. */        \
  X(embedding, (const Tensor& weight, const Tensor& indices, const Tensor& out),                   \
    (weight, indices, out))                                                                        \
  X(embedding_backward, (const Tensor& grad, const Tensor& indices, const Tensor& grad_weight),    \
    (grad, indices, grad_weight))                                                                  \
  /* Per-row -log softmax(logits)[target] for logits [N, C] (rows of unit stride, spaced any       \
     distance apart: a narrowed view of padded rows), ignored rows give 0. losses has              \
     accumulate_dtype(logits' dtype): half logits are read as they are, summed in f32. stats,      \
     when defined ([N, 2], losses' dtype, contiguous), gets each row's max and sum of              \
     exp(x - max) as the backward would compute them, so that it need not read the row twice       \
     ((0, 0) on ignored rows). */                                                                  \
  X(cross_entropy,                                                                                 \
    (const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& losses,      \
     const Tensor& stats),                                                                         \
    (logits, targets, ignore_index, losses, stats))                                                \
  /* grad_logits = (softmax(logits) - onehot(target)) * scale, zero on ignored rows, in the        \
     logits' dtype, its rows of unit stride as the logits' are. scale is one element of            \
     accumulate_dtype(logits' dtype) on their device (the loss's gradient over the row count,      \
     computed there: reading it on the host would wait for the device). With stats (as             \
     cross_entropy wrote them) softmax is exp(x - max) / sum from them, else from the row.         \
     grad_logits may be logits itself: each element is read before it is written. */               \
  X(cross_entropy_backward,                                                                        \
    (const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& scale,       \
     const Tensor& stats, const Tensor& grad_logits),                                              \
    (logits, targets, ignore_index, scale, stats, grad_logits))                                    \
                                                                                                   \
  /* Convolution (groups = 1, no bias: autograd adds it) and pooling over [N, C, H, W], as         \
     PyTorch computes them. x [N, C, H, W] * weight [O, C, kh, kw] -> out [N, O, OH, OW]; the      \
     backward ops overwrite grad_x and grad_weight. Max pooling treats padding as -inf and         \
     records in argmax (i64, out's shape) the in-plane offset h * W + w of each window's first     \
     maximum, where its gradient goes; average pooling counts padding in the mean. */              \
  X(conv2d,                                                                                        \
    (const Tensor& x, const Tensor& weight, const Conv2dGeometry& geometry, const Tensor& out),    \
    (x, weight, geometry, out))                                                                    \
  X(conv2d_backward_input,                                                                         \
    (const Tensor& grad_out, const Tensor& weight, const Conv2dGeometry& geometry,                 \
     const Tensor& grad_x),                                                                        \
    (grad_out, weight, geometry, grad_x))                                                          \
  X(conv2d_backward_weight,                                                                        \
    (const Tensor& grad_out, const Tensor& x, const Conv2dGeometry& geometry,                      \
     const Tensor& grad_weight),                                                                   \
    (grad_out, x, geometry, grad_weight))                                                          \
  X(max_pool2d,                                                                                    \
    (const Tensor& x, const Pool2dGeometry& window, const Tensor& out, const Tensor& argmax),      \
    (x, window, out, argmax))                                                                      \
  X(max_pool2d_backward,                                                                           \
    (const Tensor& grad_out, const Tensor& argmax, const Pool2dGeometry& window,                   \
     const Tensor& grad_x),                                                                        \
    (grad_out, argmax, window, grad_x))                                                            \
  X(avg_pool2d, (const Tensor& x, const Pool2dGeometry& window, const Tensor& out),                \
    (x, window, out))                                                                              \
  X(avg_pool2d_backward,                                                                           \
    (const Tensor& grad_out, const Pool2dGeometry& window, const Tensor& grad_x),                  \
    (grad_out, window, grad_x))                                                                    \
                                                                                                   \
  /* Optimizer updates, in place on contiguous tensors. */                                         \
  X(sgd_step,                                                                                      \
    (const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer, double lr,            \
     double momentum, double weight_decay, bool first_step),                                       \
    (param, grad, momentum_buffer, lr, momentum, weight_decay, first_step))                        \
  /* Updates every slot in one pass: one kernel launch on CUDA however many parameters. */         \
  X(adamw_step, (std::span<const AdamWSlot> slots, const AdamWParams& params), (slots, params))

// Declares one op of PIPIT_BACKEND_OPS as an override, in a backend's class:
//   PIPIT_BACKEND_OPS(PIPIT_BACKEND_OVERRIDE)
#define PIPIT_BACKEND_OVERRIDE(name, params, args) void name params override;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::shared_ptr<Storage> allocate(size_t nbytes) = 0;

  // Every op of PIPIT_BACKEND_OPS, pure virtual.
#define PIPIT_BACKEND_PURE(name, params, args) virtual void name params = 0;
  PIPIT_BACKEND_OPS(PIPIT_BACKEND_PURE)
#undef PIPIT_BACKEND_PURE
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
