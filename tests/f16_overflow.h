#pragma once
// An f16 pipeline whose first steps overflow, shared by the loss-scaling and checkpoint
// tests: targets far from the outputs give gradients of about 1e3, which overflow f16 (max
// 65504) once multiplied by the initial scale of 65536, so ten steps are skipped while the
// scale backs off to 64. (Bias gradients are f32 sums of the f16 gradients; when they were
// rounded to f16, their sums overflowed too, down to a scale of 16.)
#include <memory>
#include <nlohmann/json.hpp>

#include "nn/builders.h"
#include "pipeline/pipeline_config.h"
#include "pipit.h"

namespace pipit::testing {

struct F16Overflow {
  std::shared_ptr<pipit::Sequential> model;  // the same weights on every call
  pipit::Tensor input, target;
  pipit::PipelineConfig config;  // 2 stages, 2 microbatches, MSE loss, f16
};

inline F16Overflow f16_overflow(const nlohmann::json& optimizer) {
  pipit::Generator g(18);
  F16Overflow run;
  run.model = pipit::mlp({4, 8, 3}, "tanh", &g);
  run.input = pipit::randn({8, 4}, &g);
  run.target = pipit::full({8, 3}, 1e4);
  run.config.stages = 2;
  run.config.microbatches = 2;
  run.config.loss = {{"type", "MSELoss"}};
  run.config.optimizer = optimizer;
  run.config.dtype = "f16";
  return run;
}

}  // namespace pipit::testing
