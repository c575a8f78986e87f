#pragma once
// Ready-made models, returned as Sequentials so a pipeline can cut them anywhere.
#include <memory>
#include <string>
#include <vector>

#include "nn/sequential.h"
#include "tensor/generator.h"

namespace pipit {

// sizes = {in, hidden..., out}: Linear layers with `activation` ("relu", "gelu", "tanh")
// between them, none after the last.
std::shared_ptr<Sequential> mlp(const std::vector<int64_t>& sizes,
                                const std::string& activation = "relu",
                                Generator* generator = nullptr);

struct GptConfig {
  int64_t vocab_size = 65;
  int64_t context = 64;
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t width = 128;
  double dropout = 0.0;
  double embedding_dropout = 0.0;  // > 0: a Dropout layer after the embedding (GPT-2's embd_pdrop)
  double layer_norm_eps = 1e-5;
  // GPT-2's head: tied to the token embedding (one tensor, Sequential::tie) and without bias.
  bool tie_embeddings = false;
  bool head_bias = true;
  // The head's rows (and the tied token table's) padded up to a multiple of this, as llm.c
  // pads GPT-2's 50257 to 50304: GEMM sizes the tensor cores like. The padded logits are
  // ignored by a CrossEntropyLoss with classes = vocab_size and by generate(); 1: no padding.
  int64_t vocab_multiple = 1;
};

// vocab_size rounded up to a multiple of vocab_multiple: the model's logits per position.
int64_t padded_vocab(const GptConfig& config);

// Sequential{TokenPosEmbedding, [Dropout,] TransformerBlock x layers, LayerNorm,
// Linear(width, padded_vocab)}:
// i64 tokens [B, T] in, logits [B, T, padded_vocab] out. GPT-2 initialisation. With tie_embeddings
// the head's weight is layer 0's "tokens.weight".
std::shared_ptr<Sequential> gpt(const GptConfig& config, Generator* generator = nullptr);

}  // namespace pipit
