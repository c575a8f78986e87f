#pragma once
// Text generation from a GPT-shaped Sequential (TokenPosEmbedding, TransformerBlocks, then
// position-wise layers such as the final LayerNorm and the Linear head: what gpt() and
// load_hf_gpt2 build) with a KV cache: each prompt runs once, then every new token runs alone
// against the keys and values cached for the tokens before it.
//
// The decoding loop (generate) runs over a TokenStepper, which runs the model one step at a
// time; CachedLayers is the step of a run of layers, which a whole model uses alone and each
// pipeline stage uses for its chunks (pipeline/generation/pipelined_generation.h).
#include <cstdint>
#include <optional>
#include <vector>

#include "nn/sequential.h"
#include "nn/transformer.h"

namespace pipit {

struct GenerationOptions {
  int64_t max_new_tokens = 64;
  // false: greedy, the most likely token (the lowest id on ties). true: a draw from the softmax
  // of logits / temperature, kept to the top_k most likely tokens (0: all), then to the
  // smallest set whose probability reaches top_p (1: all), as Hugging Face's generate does.
  bool sample = false;
  double temperature = 1.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;  // the draws of a run depend on this alone
  // A row ends once it produces this token, which is kept as its last.
  std::optional<int64_t> stop_token;
  // The matrix products' dtype: f32, or bf16 / f16 (autocast: f32 sums, half results), each
  // weight rounded once per call. A CPU then reads half the bytes per token: at batch 1 those
  // bytes, not the arithmetic, bound the speed. Whole models only: a pipeline's stages compute
  // in their own compute dtype.
  DType dtype = DType::f32;
};

// A GPT run a step at a time with a KV cache.
class TokenStepper {
 public:
  virtual ~TokenStepper() = default;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t context() const = 0;
  // Caches for `batch` rows of `capacity` positions; row b's first padding[b] are padding.
  virtual void begin(int64_t batch, int64_t capacity, const std::vector<int64_t>& padding) = 0;
  // Tokens i64 [B, T] (CPU) at positions [start, start + T): the last position's logits, f32
  // [B, vocab] on the CPU.
  virtual Tensor step(const Tensor& tokens, int64_t start) = 0;
  virtual void end() = 0;
};

// The cached step of a run of a GPT's layers (a whole model, or a pipeline chunk): layers [0,
// n) of `layers`, each a TokenPosEmbedding (first only), a TransformerBlock (with a cache,
// allocated once here, where the block's parameters are) or a position-wise layer; anything
// else is refused by name.
class CachedLayers {
 public:
  CachedLayers(const Sequential& layers, int64_t batch, int64_t capacity,
               std::vector<int64_t> padding);
  // The layers on x (tokens i64 [B, T] when the first layer is the embedding, else hidden
  // states [B, T, C]) at positions [start, start + T).
  Tensor forward(const Tensor& x, int64_t start);

 private:
  std::vector<Module*> layers_;
  std::vector<TransformerBlock*> blocks_;  // nullptr where the layer is not a block
  std::vector<KvCacheLayer> caches_;
  std::vector<int64_t> padding_;
  bool padded_ = false;
};

// The last position's logits of a step's output [B, T, vocab or more (a padded vocabulary)],
// as f32 [B, vocab] on the CPU.
Tensor last_logits(const Tensor& output, int64_t vocab);

// The new tokens for each prompt. Prompts may differ in length: shorter ones are left-padded
// and their padding masked, so greedy rows get the tokens each would get alone. Stops after
// max_new_tokens, when every row has met the stop token, or when the longest prompt and the
// new tokens fill the context. Prompts are checked first: an empty one, a token outside the
// vocabulary or one longer than the context is refused by index.
std::vector<std::vector<int64_t>> generate(TokenStepper& model,
                                           const std::vector<std::vector<int64_t>>& prompts,
                                           const GenerationOptions& options = {});
// The same on a whole model, where its parameters are, in eval mode without gradients (the
// model's mode is restored after).
std::vector<std::vector<int64_t>> generate(Sequential& model,
                                           const std::vector<std::vector<int64_t>>& prompts,
                                           const GenerationOptions& options = {});

}  // namespace pipit
