#include "autograd/ops.h"
#include "loss/loss.h"
#include "tensor/backend.h"

namespace pipit {

Tensor CrossEntropyLoss::compute_loss(const Tensor& output, const Tensor& target) const {
  return cross_entropy(output, target, ignore_index_, classes_);
}

// d(mean loss)/d(logits) = (softmax(logits) - onehot(target)) / count, in one fused kernel.
Tensor CrossEntropyLoss::compute_gradient(const Tensor& output, const Tensor& target) const {
  NoGradGuard no_grad;
  const int64_t classes = check_cross_entropy(output, target, classes_);
  const int64_t C = output.shape().back();
  Tensor logits = reshape(output, {-1, C}).contiguous();
  Tensor targets = reshape(target, {-1}).contiguous();
  // 1 / count in f64, rounded once, as a host double would be.
  const Tensor scale =
      (1.0 / cross_entropy_rows(targets, ignore_index_)).to(accumulate_dtype(logits.dtype()));
  const Tensor grad = cross_entropy_gradient(logits, targets, ignore_index_, classes, scale);
  return reshape(grad, output.shape());
}

nlohmann::json CrossEntropyLoss::config() const {
  nlohmann::json config = {{"type", "CrossEntropyLoss"}, {"ignore_index", ignore_index_}};
  if (classes_ != -1) config["classes"] = classes_;
  return config;
}

std::unique_ptr<Loss> make_loss(const nlohmann::json& config) {
  PIPIT_CHECK(config.is_object() && config.contains("type") && config["type"].is_string(),
              "make_loss: config needs a string \"type\", got ", config.dump());
  const std::string type = config["type"];
  if (type == "MSELoss") return std::make_unique<MSELoss>();
  if (type == "CrossEntropyLoss") {
    int64_t ignore_index = -100, classes = -1;
    if (config.contains("ignore_index")) {
      PIPIT_CHECK(config["ignore_index"].is_number_integer(),
                  "make_loss: CrossEntropyLoss field \"ignore_index\" must be an integer");
      ignore_index = config["ignore_index"];
    }
    if (config.contains("classes")) {
      PIPIT_CHECK(config["classes"].is_number_integer() &&
                      (config["classes"] == -1 || config["classes"] >= 1),
                  "make_loss: CrossEntropyLoss field \"classes\" must be -1 (all) or a count >= 1, "
                  "got ",
                  config["classes"].dump());
      classes = config["classes"];
    }
    return std::make_unique<CrossEntropyLoss>(ignore_index, classes);
  }
  throw Error("make_loss: unknown loss type '" + type + "' (expected MSELoss or CrossEntropyLoss)");
}

}  // namespace pipit
