#pragma once
// Generation on a pipelined model: each stage keeps the KV caches of the blocks in its chunks
// (nn/generate.h's CachedLayers) and passes every step's activations to the next chunk's stage,
// as training passes activations; the last stage sends the last position's logits to the
// coordinator, which samples and feeds the next tokens back in. The same over threads, TCP
// workers and MPI ranks, and the same tokens as generate() on the whole model.
#include <cstdint>
#include <vector>

#include "nn/generate.h"
#include "pipeline/coordinator.h"

namespace pipit {

// generate() over a pipeline's stages: vocabulary and context from `model`'s TokenPosEmbedding
// (the model the pipeline was built from).
class PipelineStepper final : public TokenStepper {
 public:
  PipelineStepper(Coordinator& coordinator, const Sequential& model);
  int64_t vocab_size() const override { return vocab_; }
  int64_t context() const override { return context_; }
  void begin(int64_t batch, int64_t capacity, const std::vector<int64_t>& padding) override;
  Tensor step(const Tensor& tokens, int64_t start) override;
  void end() override;

 private:
  Coordinator& coordinator_;
  int64_t vocab_ = 0, context_ = 0;
};

std::vector<std::vector<int64_t>> generate(Coordinator& coordinator, const Sequential& model,
                                           const std::vector<std::vector<int64_t>>& prompts,
                                           const GenerationOptions& options = {});

}  // namespace pipit
