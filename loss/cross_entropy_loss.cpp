#include "autograd/ops.h"
#include "loss/loss.h"
#include "tensor/backend.h"

namespace pipit {

Tensor CrossEntropyLoss::compute_loss(const Tensor& output, const Tensor& target) const {
  return cross_entropy(output, target, ignore_index_);
}

// d(mean loss)/d(logits) = (softmax(logits) - onehot(target)) / count, in one fused kernel.
Tensor CrossEntropyLoss::compute_gradient(const Tensor& output, const Tensor& target) const {
  NoGradGuard no_grad;
  PIPIT_CHECK(output.dim() == 2 || output.dim() == 3,
              "CrossEntropyLoss: logits must be [N, C] "
              "or [B, T, C], got ",
              shape_str(output.shape()));
  PIPIT_CHECK(target.dtype() == DType::i64 &&
                  target.shape() == Shape(output.shape().begin(), output.shape().end() - 1),
              "CrossEntropyLoss: targets ", shape_str(target.shape()), " ", target.dtype(),
              " do not match logits ", shape_str(output.shape()),
              " (expected I64 of the "
              "logits' shape without the class dim)");
  const int64_t C = output.shape().back();
  Tensor logits = reshape(output, {-1, C}).contiguous();
  Tensor targets = reshape(target, {-1}).contiguous();
  // 1 / count in f64, rounded once, as a host double would be.
  const Tensor scale =
      (1.0 / cross_entropy_rows(targets, ignore_index_)).to(accumulate_dtype(logits.dtype()));
  Tensor grad = Tensor::empty(logits.shape(), logits.dtype(), logits.device());
  backend(logits).cross_entropy_backward(logits, targets, ignore_index_, scale, grad);
  return reshape(grad, output.shape());
}

nlohmann::json CrossEntropyLoss::config() const {
  return {{"type", "CrossEntropyLoss"}, {"ignore_index", ignore_index_}};
}

std::unique_ptr<Loss> make_loss(const nlohmann::json& config) {
  PIPIT_CHECK(config.is_object() && config.contains("type") && config["type"].is_string(),
              "make_loss: config needs a string \"type\", got ", config.dump());
  const std::string type = config["type"];
  if (type == "MSELoss") return std::make_unique<MSELoss>();
  if (type == "CrossEntropyLoss") {
    int64_t ignore_index = -100;
    if (config.contains("ignore_index")) {
      PIPIT_CHECK(config["ignore_index"].is_number_integer(),
                  "make_loss: CrossEntropyLoss field \"ignore_index\" must be an integer");
      ignore_index = config["ignore_index"];
    }
    return std::make_unique<CrossEntropyLoss>(ignore_index);
  }
  throw Error("make_loss: unknown loss type '" + type + "' (expected MSELoss or CrossEntropyLoss)");
}

}  // namespace pipit
