#include "nn/builders.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "nn/layers.h"
#include "nn/transformer.h"
#include "tensor/backend.h"

namespace pipit {
namespace {

std::shared_ptr<Module> activation_layer(const std::string& name) {
  if (name == "relu") return std::make_shared<ReLU>();
  if (name == "gelu") return std::make_shared<GELU>();
  if (name == "tanh") return std::make_shared<Tanh>();
  throw Error("mlp: unknown activation '" + name + "' (expected relu, gelu or tanh)");
}

void fill_normal(const Tensor& t, double std, Generator* generator) {
  if (skip_init()) return;
  NoGradGuard no_grad;
  backend(t).normal(t, generator ? *generator : default_generator(), 0.0, std);
}

void fill_zero(const Tensor& t) {
  if (skip_init()) return;
  NoGradGuard no_grad;
  backend(t).fill(t, 0.0);
}

}  // namespace

std::shared_ptr<Sequential> mlp(const std::vector<int64_t>& sizes, const std::string& activation,
                                Generator* generator) {
  PIPIT_CHECK(sizes.size() >= 2, "mlp: needs at least an input and an output size");
  auto model = std::make_shared<Sequential>();
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    model->push_back(std::make_shared<Linear>(sizes[i], sizes[i + 1], true, generator));
    if (i + 2 < sizes.size()) model->push_back(activation_layer(activation));
  }
  return model;
}

int64_t padded_vocab(const GptConfig& c) {
  PIPIT_CHECK(c.vocab_multiple >= 1 && c.vocab_multiple <= (int64_t{1} << 20),
              "gpt: vocab_multiple must be in [1, 2^20], got ", c.vocab_multiple);
  return (c.vocab_size + c.vocab_multiple - 1) / c.vocab_multiple * c.vocab_multiple;
}

std::shared_ptr<Sequential> gpt(const GptConfig& c, Generator* generator) {
  PIPIT_CHECK(c.vocab_size > 0 && c.context > 0 && c.layers > 0 && c.heads > 0 && c.width > 0,
              "gpt: every size must be positive");
  const int64_t logits = padded_vocab(c);
  auto model = std::make_shared<Sequential>();
  auto embedding = std::make_shared<TokenPosEmbedding>(c.vocab_size, c.context, c.width, generator,
                                                       c.tie_embeddings ? logits : 0);
  model->push_back(embedding);
  if (c.embedding_dropout > 0) {
    model->push_back(std::make_shared<Dropout>(c.embedding_dropout, generator));
  }
  // GPT-2 initialisation: N(0, 0.02) weights, zero biases, and residual projections scaled by
  // 1/sqrt(2 * layers) so the residual stream's variance does not grow with depth.
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.layers));
  for (int64_t i = 0; i < c.layers; ++i) {
    auto block = std::make_shared<TransformerBlock>(c.width, c.heads, c.dropout, generator,
                                                    c.layer_norm_eps);
    for (const auto& linear : {block->attn->qkv, block->fc}) {
      fill_normal(linear->weight, 0.02, generator);
      fill_zero(linear->bias);
    }
    for (const auto& linear : {block->attn->proj, block->proj}) {
      fill_normal(linear->weight, residual_std, generator);
      fill_zero(linear->bias);
    }
    model->push_back(block);
  }
  model->push_back(std::make_shared<LayerNorm>(c.width, c.layer_norm_eps));
  auto head = std::make_shared<Linear>(c.width, c.vocab_size, c.head_bias, generator);
  if (!c.tie_embeddings) {
    fill_normal(head->weight, 0.02, generator);
    if (c.head_bias) fill_zero(head->bias);
  }
  if (logits > c.vocab_size) {
    // Drawn unpadded (so padding changes no draw, a run's batches included), then zero rows
    // appended: the loss and generation never read their logits.
    std::shared_ptr<Linear> padded;
    {
      SkipInitGuard skip;
      padded = std::make_shared<Linear>(c.width, logits, c.head_bias);
    }
    copy_padded_rows(head->weight, padded->weight);
    if (c.head_bias) copy_padded_rows(head->bias, padded->bias);
    head = padded;
  }
  model->push_back(head);
  if (c.tie_embeddings) {
    model->tie(std::to_string(model->size() - 1) + ".weight", "0.tokens.weight");
  }
  return model;
}

}  // namespace pipit
