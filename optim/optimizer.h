#pragma once
// Optimizers update named parameters from their accumulated grad(). State (momentum, Adam
// moments, step count) is exposed as a StateDict keyed by parameter name, so checkpoints
// and layer remapping can save and move it: "<param>.momentum_buffer", "<param>.exp_avg",
// "<param>.exp_avg_sq", and "step" (a 0-dim i64 tensor).
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tensor/state_dict.h"
#include "tensor/tensor.h"

namespace pipit {

using NamedParameters = std::vector<std::pair<std::string, Tensor>>;

class Optimizer {
 public:
  explicit Optimizer(NamedParameters parameters) : parameters_(std::move(parameters)) {}
  virtual ~Optimizer() = default;
  // Updates every parameter that has a gradient (parameters without one are skipped).
  virtual void step() = 0;
  void zero_grad();
  virtual double lr() const = 0;
  virtual void set_lr(double lr) = 0;
  virtual StateDict state_dict() const = 0;
  virtual void load_state_dict(const StateDict& state) = 0;
  virtual nlohmann::json config() const = 0;  // {"type": "AdamW", "lr": ..., ...}
  const NamedParameters& parameters() const { return parameters_; }

 protected:
  NamedParameters parameters_;
};

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double weight_decay = 0.0;
};

// SGD with momentum and L2 weight decay, as torch.optim.SGD (dampening 0, no Nesterov).
class SGD final : public Optimizer {
 public:
  SGD(NamedParameters parameters, SGDOptions options);
  void step() override;
  double lr() const override { return options_.lr; }
  void set_lr(double lr) override { options_.lr = lr; }
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;
  nlohmann::json config() const override;

 private:
  SGDOptions options_;
  StateDict momentum_;
  int64_t step_ = 0;
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  // Parameters (by name) that take no weight decay, as GPT-2 trainers spare biases, norms and
  // embeddings (train/weight_decay.h names them for a model).
  std::vector<std::string> no_decay = {};
};

// Adam with decoupled weight decay and bias correction, as torch.optim.AdamW.
class AdamW final : public Optimizer {
 public:
  AdamW(NamedParameters parameters, AdamWOptions options);
  void step() override;
  double lr() const override { return options_.lr; }
  void set_lr(double lr) override { options_.lr = lr; }
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;
  nlohmann::json config() const override;

 private:
  AdamWOptions options_;
  StateDict exp_avg_, exp_avg_sq_;
  int64_t step_ = 0;
};

// The part of an optimizer state dict that belongs to `parameters` (by name): "step" and
// every "<param>.<buffer>" entry of theirs. How one model's state is shared out over stages.
StateDict optimizer_state_for(const StateDict& state, const NamedParameters& parameters);

// Builds an optimizer from its config() over `parameters`; unknown types or fields are errors.
std::unique_ptr<Optimizer> make_optimizer(const nlohmann::json& config, NamedParameters parameters);

// Scales all gradients so their joint L2 norm is at most max_norm; returns the norm before.
double clip_grad_norm(const std::vector<Tensor>& parameters, double max_norm);
// The two halves of clip_grad_norm, for gradients spread over pipeline stages: the sum of
// squares of every gradient (in f64), and scaling every gradient in place.
double grad_norm_squared(const std::vector<Tensor>& parameters);
void scale_gradients(const std::vector<Tensor>& parameters, double factor);
// max_norm / (norm + 1e-6) when norm > max_norm, else 1: the factor clip_grad_norm applies.
double clip_coefficient(double norm, double max_norm);

// lr(step) = max_lr * (step + 1) / warmup_steps during warm-up, then a cosine from max_lr
// down to min_lr, reached at total_steps and kept after.
class CosineSchedule {
 public:
  CosineSchedule(double max_lr, double min_lr, int64_t warmup_steps, int64_t total_steps);
  double lr(int64_t step) const;  // step counts from 0

 private:
  double max_lr_, min_lr_;
  int64_t warmup_steps_, total_steps_;
};

}  // namespace pipit
