#pragma once
// Loss: what the pipeline coordinator calls on the last stage's output.
// compute_loss returns a 0-dim tensor; compute_gradient returns dL/d(output) in closed form
// (same shape as output), equal to what autograd of compute_loss gives.
#include <memory>
#include <nlohmann/json.hpp>

#include "tensor/tensor.h"

namespace pipit {

class Loss {
 public:
  virtual ~Loss() = default;
  virtual Tensor compute_loss(const Tensor& output, const Tensor& target) const = 0;
  virtual Tensor compute_gradient(const Tensor& output, const Tensor& target) const = 0;
  virtual nlohmann::json config() const = 0;  // {"type": "MSELoss"} ...
};

// Mean of (output - target)^2 over all elements.
class MSELoss final : public Loss {
 public:
  Tensor compute_loss(const Tensor& output, const Tensor& target) const override;
  Tensor compute_gradient(const Tensor& output, const Tensor& target) const override;
  nlohmann::json config() const override;
};

// Logits [N, C] or [B, T, C], i64 targets [N] or [B, T]; mean over non-ignored targets.
class CrossEntropyLoss final : public Loss {
 public:
  // classes: only the first `classes` logits take part (a padded vocabulary); -1: all.
  explicit CrossEntropyLoss(int64_t ignore_index = -100, int64_t classes = -1)
      : ignore_index_(ignore_index), classes_(classes) {}
  Tensor compute_loss(const Tensor& output, const Tensor& target) const override;
  Tensor compute_gradient(const Tensor& output, const Tensor& target) const override;
  nlohmann::json config() const override;

 private:
  int64_t ignore_index_, classes_;
};

// Builds a loss from its config(); unknown types are an error naming the type.
std::unique_ptr<Loss> make_loss(const nlohmann::json& config);

}  // namespace pipit
