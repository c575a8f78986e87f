#include "autograd/nn_ops.h"

#include <utility>

#include "autograd/autocast.h"
#include "autograd/elementwise.h"
#include "autograd/node.h"
#include "autograd/reduce.h"
#include "autograd/shape_ops.h"
#include "tensor/backend.h"
#include "tensor/factory.h"
#include "tensor/kernel_layout.h"

namespace pipit {
namespace {

struct SoftmaxBackward : Node {
  Tensor out;
  int64_t dim = 0;
  bool log = false;
  std::vector<Tensor> apply(const Tensor& g) override {
    Tensor grad_in = Tensor::empty(out.shape(), out.dtype(), out.device());
    backend(out).softmax_backward(g, out, dim, log, grad_in);
    return {grad_in};
  }
  std::string name() const override { return log ? "LogSoftmaxBackward" : "SoftmaxBackward"; }
};

// The mask holds 0 or 1 / (1 - p), so the backward is one multiply.
struct DropoutBackward : Node {
  Tensor mask;
  std::vector<Tensor> apply(const Tensor& g) override { return {g * mask}; }
  std::string name() const override { return "DropoutBackward"; }
};

Tensor softmax_op(const Tensor& x_in, int64_t dim, bool log) {
  const Tensor x = autocast_widened(x_in);
  const char* name = log ? "log_softmax" : "softmax";
  PIPIT_CHECK(is_floating(x.dtype()), name, ": needs a floating dtype, got ", x.dtype());
  int64_t d = normalize_dim(dim, x.dim(), name);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (x.numel() > 0) backend(x).softmax(x, d, log, out);
  if (auto node = detail::make_node<SoftmaxBackward>(out, {x})) {
    node->out = out.detach();
    node->dim = d;
    node->log = log;
  }
  return out;
}

struct CausalSoftmaxBackward : Node {
  Tensor out;
  double scale = 1;
  std::vector<Tensor> apply(const Tensor& g) override {
    Tensor grad_scores = Tensor::empty(out.shape(), out.dtype(), out.device());
    backend(out).causal_softmax_backward(g, out, scale, grad_scores);
    return {grad_scores};
  }
  std::string name() const override { return "CausalSoftmaxBackward"; }
};

// g comes in the output's dtype: x's, or autocast's for layer_norm_for_products. x's gradient
// is added into the one that waits for x (a residual stream's, from the block above) as it is
// written.
struct LayerNormBackward : Node {
  Tensor x, weight, mean, rstd;
  std::vector<Tensor> apply(const Tensor& g) override {
    std::vector<Tensor> none(3);
    return apply_adding(g, none);
  }
  std::vector<Tensor> apply_adding(const Tensor& g, std::vector<Tensor>& waiting) override {
    const Tensor residual = waiting[0];
    waiting.assign(3, Tensor());
    if (residual.defined() && fits_layer_norm_residual(residual, x)) waiting[0] = residual;
    Tensor gx = Tensor::empty(x.shape(), x.dtype(), x.device());
    Tensor gw = Tensor::empty(weight.shape(), weight.dtype(), weight.device());
    Tensor gb = Tensor::empty(weight.shape(), weight.dtype(), weight.device());
    backend(x).layer_norm_backward(g, x, weight, mean, rstd, waiting[0], gx, gw, gb);
    return {gx, gw, gb};
  }
  std::string name() const override { return "LayerNormBackward"; }
};

struct EmbeddingBackward : Node {
  Tensor indices;
  Shape weight_shape;
  std::vector<Tensor> apply(const Tensor& g) override {
    Tensor gw = zeros(weight_shape, {g.dtype(), g.device()});
    backend(g).embedding_backward(g, indices, gw);
    return {gw, Tensor()};
  }
  std::string name() const override { return "EmbeddingBackward"; }
};

// The columns of logits [N, C] that take part: all, or the first `classes`.
Tensor taking_part(const Tensor& logits, int64_t classes) {
  NoGradGuard no_grad;
  return classes < logits.shape()[1] ? narrow(logits, 1, 0, classes) : logits;
}

struct CrossEntropyBackward : Node {
  Tensor logits, targets, count, stats;
  Shape logits_shape;
  int64_t ignore_index = -100, classes = 0;
  std::vector<Tensor> apply(const Tensor& g) override {
    PIPIT_CHECK(logits.defined(),
                "cross_entropy: backward through this loss a second time, after its logits' "
                "memory took their gradient (compute the loss again, or hold the logits: "
                "then their memory stays theirs)");
    Tensor scale;
    {
      NoGradGuard no_grad;
      // In f64 then rounded once, as a host double divided by the count would be.
      scale = (g.to(DType::f64) / count).to(accumulate_dtype(logits.dtype()));
    }
    // Where nothing but this node holds the logits, their memory takes their gradient (the
    // kernels read each element before writing it): a language model's [N, vocabulary]
    // logits and their gradient are never both held (GPT-2 small, bf16, batch 8: 0.8 GB).
    const bool only_holder =
        logits.impl_ptr().use_count() == 1 && logits.storage().use_count() == 1;
    const Tensor source = only_holder ? std::exchange(logits, Tensor()) : logits;
    const Tensor grad = cross_entropy_gradient(source, targets, ignore_index, classes, scale, stats,
                                               only_holder ? source : Tensor());
    return {reshape(grad, logits_shape), Tensor()};
  }
  std::string name() const override { return "CrossEntropyBackward"; }
};

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  return softmax_op(x, dim, false);
}
Tensor log_softmax(const Tensor& x, int64_t dim) {
  return softmax_op(x, dim, true);
}

Tensor causal_softmax(const Tensor& scores_in, double scale) {
  const Tensor scores = autocast_widened(scores_in);
  PIPIT_CHECK(is_floating(scores.dtype()), "causal_softmax: needs a floating dtype, got ",
              scores.dtype());
  // The backend checks the shape, empty scores included.
  Tensor out = Tensor::empty(scores.shape(), scores.dtype(), scores.device());
  backend(scores).causal_softmax(scores, scale, out);
  if (auto node = detail::make_node<CausalSoftmaxBackward>(out, {scores})) {
    node->out = out.detach();
    node->scale = scale;
  }
  return out;
}

namespace {

// for_products: the result is rounded to autocast's dtype inside an AutocastGuard.
Tensor layer_norm_into(const Tensor& x_in, const Tensor& weight, const Tensor& bias, double eps,
                       bool for_products) {
  const Tensor x = autocast_widened(x_in);
  PIPIT_CHECK(x.dim() >= 1, "layer_norm: input must have rank >= 1");
  const int64_t C = x.shape().back();
  PIPIT_CHECK(weight.shape() == Shape{C} && bias.shape() == Shape{C}, "layer_norm: weight ",
              shape_str(weight.shape()), " and bias ", shape_str(bias.shape()), " must both be [",
              C, "] for input ", shape_str(x.shape()));
  PIPIT_CHECK(x.dtype() == weight.dtype() && x.dtype() == bias.dtype(),
              "layer_norm: dtypes differ (input ", x.dtype(), ", weight ", weight.dtype(),
              ", bias ", bias.dtype(), ")");
  const int64_t rows = C == 0 ? 0 : x.numel() / C;
  const bool rounded = for_products && x.dtype() == DType::f32 && autocast_dtype() != DType::f32;
  Tensor out = Tensor::empty(x.shape(), rounded ? autocast_dtype() : x.dtype(), x.device());
  Tensor mean = Tensor::empty({rows}, x.dtype(), x.device());
  Tensor rstd = Tensor::empty({rows}, x.dtype(), x.device());
  backend(x).layer_norm(x, weight, bias, eps, out, mean, rstd);
  if (auto node = detail::make_node<LayerNormBackward>(out, {x, weight, bias})) {
    node->x = x.detach();
    node->weight = weight.detach();
    node->mean = mean;
    node->rstd = rstd;
  }
  return out;
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  return layer_norm_into(x, weight, bias, eps, false);
}

Tensor layer_norm_for_products(const Tensor& x, const Tensor& weight, const Tensor& bias,
                               double eps) {
  return layer_norm_into(x, weight, bias, eps, true);
}

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  PIPIT_CHECK(weight.dim() == 2, "embedding: weight must be 2-D, got ", shape_str(weight.shape()));
  PIPIT_CHECK(indices.dtype() == DType::i64, "embedding: indices must be I64, got ",
              indices.dtype());
  Shape shape = indices.shape();
  shape.push_back(weight.shape()[1]);
  Tensor out = Tensor::empty(shape, weight.dtype(), weight.device());
  backend(weight).embedding(weight, indices, out);
  if (auto node = detail::make_node<EmbeddingBackward>(out, {weight, indices})) {
    node->indices = indices.detach();
    node->weight_shape = weight.shape();
  }
  return out;
}

Tensor dropout(const Tensor& x, double p, bool training, Generator* generator) {
  PIPIT_CHECK(p >= 0 && p < 1, "dropout: p must be in [0, 1), got ", p);
  PIPIT_CHECK(is_floating(x.dtype()), "dropout: needs a floating dtype, got ", x.dtype());
  if (!training || p == 0) return x;
  Tensor in = x.detach().contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor mask = Tensor::empty(x.shape(), x.dtype(), x.device());
  backend(x).dropout(in, generator ? *generator : default_generator(), p, out, mask);
  if (auto node = detail::make_node<DropoutBackward>(out, {x})) node->mask = mask;
  return out;
}

Tensor cross_entropy_rows(const Tensor& targets, int64_t ignore_index) {
  NoGradGuard no_grad;
  const Tensor ignored =
      scalar_tensor(static_cast<double>(ignore_index), {DType::i64, targets.device()});
  return sum(ne(targets, ignored).to(DType::i64)).to(DType::f64);
}

int64_t check_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t classes) {
  PIPIT_CHECK(logits.dim() == 2 || logits.dim() == 3,
              "cross_entropy: logits must be [N, C] or [B, T, C], got ", shape_str(logits.shape()));
  PIPIT_CHECK(targets.dtype() == DType::i64, "cross_entropy: targets must be I64, got ",
              targets.dtype());
  const Shape expected(logits.shape().begin(), logits.shape().end() - 1);
  PIPIT_CHECK(targets.shape() == expected, "cross_entropy: targets of shape ",
              shape_str(targets.shape()), " do not match logits of shape ",
              shape_str(logits.shape()), " (expected ", shape_str(expected), ")");
  const int64_t C = logits.shape().back();
  if (classes == -1) return C;
  PIPIT_CHECK(classes >= 1 && classes <= C, "cross_entropy: classes must be -1 (all) or in [1, ", C,
              "] for logits ", shape_str(logits.shape()), ", got ", classes);
  return classes;
}

Tensor cross_entropy_gradient(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                              int64_t classes, const Tensor& scale, const Tensor& stats,
                              const Tensor& into) {
  NoGradGuard no_grad;
  PIPIT_CHECK(!into.defined() || (into.shape() == logits.shape() && into.dtype() == logits.dtype()),
              "cross_entropy_gradient: the gradient's tensor must have the logits' shape ",
              shape_str(logits.shape()), " and dtype ", logits.dtype());
  Tensor grad =
      into.defined() ? into : Tensor::empty(logits.shape(), logits.dtype(), logits.device());
  const int64_t C = logits.shape()[1];
  if (classes < C) backend(grad).fill(narrow(grad, 1, classes, C - classes), 0.0);
  backend(grad).cross_entropy_backward(taking_part(logits, classes), targets, ignore_index, scale,
                                       stats, taking_part(grad, classes));
  return grad;
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                     int64_t classes_in) {
  const int64_t classes = check_cross_entropy(logits, targets, classes_in);
  const int64_t C = logits.shape().back();
  Tensor logits2, targets1;
  {
    NoGradGuard no_grad;
    logits2 = reshape(logits, {-1, C}).contiguous();
    targets1 = reshape(targets, {-1}).contiguous();
  }
  const int64_t N = logits2.shape()[0];
  // Half logits give f32 losses: summed in f32, the logits never widened in memory.
  const DType loss_dtype = accumulate_dtype(logits.dtype());
  Tensor losses = Tensor::empty({N}, loss_dtype, logits.device());
  // Kept for the backward when there is one, which then reads each row once.
  Tensor stats;
  if (is_grad_enabled() && logits.requires_grad()) {
    stats = Tensor::empty({N, 2}, loss_dtype, logits.device());
  }
  backend(logits).cross_entropy(taking_part(logits2, classes), targets1, ignore_index, losses,
                                stats);
  Tensor total = Tensor::empty({}, loss_dtype, logits.device());
  int64_t all[] = {0};
  backend(logits).reduce(ReduceOp::sum, losses, all, total);
  Tensor count, result;
  {
    NoGradGuard no_grad;
    count = cross_entropy_rows(targets1, ignore_index);
    // With every row ignored the mean is 0/0; PyTorch returns NaN there, and so do we.
    result = total * (1.0 / count).to(loss_dtype);
  }
  if (auto node = detail::make_node<CrossEntropyBackward>(result, {logits, targets})) {
    node->logits = logits2.detach();
    node->targets = targets1;
    node->logits_shape = logits.shape();
    node->ignore_index = ignore_index;
    node->classes = classes;
    node->count = count;
    node->stats = stats;
  }
  return result;
}

}  // namespace pipit
