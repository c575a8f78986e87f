#pragma once
// Text generation from a GPT-shaped Sequential (TokenPosEmbedding, TransformerBlocks, then
// position-wise layers such as the final LayerNorm and the Linear head: what gpt() and
// load_hf_gpt2 build) with a KV cache: each prompt runs once, then every new token runs alone
// against the keys and values cached for the tokens before it.
#include <cstdint>
#include <optional>
#include <vector>

#include "nn/sequential.h"

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
};

// The new tokens for each prompt. Prompts may differ in length: shorter ones are left-padded
// and their padding masked, so each row's tokens are those it would get alone. Stops after
// max_new_tokens, when every row has met the stop token, or when the longest prompt and the
// new tokens fill the model's context. Runs where the model's parameters are, in eval mode
// without gradients (the model's mode is restored after). The KV cache is allocated once.
std::vector<std::vector<int64_t>> generate(Sequential& model,
                                           const std::vector<std::vector<int64_t>>& prompts,
                                           const GenerationOptions& options = {});

}  // namespace pipit
