#pragma once
// Dynamic loss scaling for f16 mixed precision, as torch.amp.GradScaler. f16 gradients of
// small losses underflow to zero, so the loss is multiplied by a large scale before backward
// and the gradients divided by it before the update. A step whose gradients overflowed (inf or
// NaN) is skipped and the scale halved; after `growth_interval` clean steps it doubles.
//   Tensor loss = ...;
//   scaler.scale(loss).backward();
//   scaler.step(optimizer);  // unscales, steps unless a gradient overflowed
//   scaler.update();
#include <cstdint>
#include <nlohmann/json.hpp>

#include "optim/optimizer.h"

namespace pipit {

struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});
  double get_scale() const { return scale_; }
  Tensor scale(const Tensor& loss) const;
  // Divides the gradients of `optimizer`'s parameters by the scale and, unless one of them is
  // inf or NaN, calls optimizer.step(). Returns whether it stepped.
  bool step(Optimizer& optimizer);
  // Adjusts the scale from the last step(): back off after an overflow, grow after
  // growth_interval clean steps in a row.
  void update();
  // The same, for callers that detected the overflow themselves (a pipeline coordinator,
  // from the stages' gradient norms).
  void update(bool found_inf);

  // The scale, the clean steps counted towards the next growth and the options, as JSON (as
  // torch's GradScaler.state_dict()): a resumed f16 run must go on with the scale it reached.
  nlohmann::json state_dict() const;
  // Restores a state_dict(); an invalid one is an error naming the field.
  void load_state_dict(const nlohmann::json& state);

 private:
  GradScalerOptions options_;
  double scale_;
  int64_t clean_steps_ = 0;
  bool found_inf_ = false;
};

}  // namespace pipit
