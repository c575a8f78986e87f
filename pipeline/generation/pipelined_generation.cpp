#include "pipeline/generation/pipelined_generation.h"

#include "nn/layers.h"

namespace pipit {
PipelineStepper::PipelineStepper(Coordinator& coordinator, const Sequential& model)
    : coordinator_(coordinator) {
  const auto* embedding =
      model.size() > 0 ? dynamic_cast<const TokenPosEmbedding*>(model[0].get()) : nullptr;
  PIPIT_CHECK(embedding != nullptr && model.first_index() == 0,
              "generate: the pipelined model must be a GPT starting with a TokenPosEmbedding");
  vocab_ = embedding->vocab_size();
  context_ = embedding->context();
}

void PipelineStepper::begin(int64_t batch, int64_t capacity, const std::vector<int64_t>& padding) {
  coordinator_.generate_begin({batch, capacity, padding});
}

Tensor PipelineStepper::step(const Tensor& tokens, int64_t start) {
  return coordinator_.generate_step(tokens, start);
}

void PipelineStepper::end() {
  coordinator_.generate_end();
}

std::vector<std::vector<int64_t>> generate(Coordinator& coordinator, const Sequential& model,
                                           const std::vector<std::vector<int64_t>>& prompts,
                                           const GenerationOptions& options) {
  PIPIT_CHECK(options.dtype == DType::f32, "generate: options.dtype is ", options.dtype,
              "; a pipeline's stages compute in their own compute dtype (leave it F32)");
  PipelineStepper stepper(coordinator, model);
  return generate(stepper, prompts, options);
}

}  // namespace pipit
