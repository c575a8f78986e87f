#pragma once
// The small models the pipeline tests train, with a batch of `rows`: an MLP of 9 layers and
// a 2-block GPT, both seeded, so every test builds the same ones.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "loss/loss.h"
#include "nn/builders.h"
#include "pipit.h"

namespace pipit::testing {

struct Model {
  std::shared_ptr<Sequential> net;
  Tensor input, target;
  nlohmann::json loss = {{"type", "CrossEntropyLoss"}};
};

// 9 layers, so p * v = 8 chunks still fit.
inline Model make_mlp(int64_t rows = 8) {
  Generator generator(3);
  Model m{mlp({6, 12, 12, 12, 12, 3}, "tanh", &generator), randn({rows, 6}, &generator), Tensor()};
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < rows; ++i) labels.push_back((i * 5) % 3);
  m.target = from_vector(labels, {rows});
  return m;
}

struct Batch {
  Tensor input, target;
};

// A test's token ids: input i is (i * step) % vocab, target i (i * target_step + target_offset)
// % vocab.
struct TokenSequence {
  int64_t vocab = 11, step = 7, target_step = 7, target_offset = 3;
};

// `batch` rows of `context` tokens of `sequence`.
inline Batch sequence_batch(int64_t batch, int64_t context, const TokenSequence& sequence = {}) {
  std::vector<int64_t> x, y;
  for (int64_t i = 0; i < batch * context; ++i) {
    x.push_back((i * sequence.step) % sequence.vocab);
    y.push_back((i * sequence.target_step + sequence.target_offset) % sequence.vocab);
  }
  return {from_vector(x, {batch, context}), from_vector(y, {batch, context})};
}

// `batch` windows of `context` tokens of a fixed sequence; targets run 3 tokens ahead.
inline Batch gpt_batch(int64_t vocab = 11, int64_t batch = 8, int64_t context = 6) {
  return sequence_batch(batch, context, {.vocab = vocab});
}

inline Model make_gpt(int64_t rows = 8) {
  Generator generator(5);
  const Batch batch = gpt_batch(11, rows, 6);
  return {gpt({11, 6, 6, 2, 16, 0.0}, &generator),
          batch.input,
          batch.target,
          {{"type", "CrossEntropyLoss"}}};
}

inline Model make_model(const std::string& name, int64_t rows = 8) {
  return name == "mlp" ? make_mlp(rows) : make_gpt(rows);
}

inline const nlohmann::json kAdamW = {{"type", "AdamW"}, {"lr", 0.01}, {"weight_decay", 0.1}};

// Linear(6,12) Tanh Linear(12,12) Tanh Linear(12,12) Tanh Linear(12,3): 7 layers, for mlp_batch.
inline std::shared_ptr<Sequential> small_mlp() {
  Generator generator(3);
  return mlp({6, 12, 12, 12, 3}, "tanh", &generator);
}

// 8 rows of 6 features and labels of 3 classes, for an MLP of input width 6.
inline Batch mlp_batch() {
  Generator generator(4);
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < 8; ++i) labels.push_back((i * 5) % 3);
  return {randn({8, 6}, &generator), from_vector(labels, {8})};
}

// The mean over `microbatches` of the model's own eval-mode loss.
inline double eval_mode_loss(Sequential& model, const Batch& batch, int microbatches) {
  NoGradGuard no_grad;
  model.eval();
  const int64_t rows = batch.input.size(0) / microbatches;
  double sum = 0;
  for (int mb = 0; mb < microbatches; ++mb) {
    const Tensor logits = model(narrow(batch.input, 0, mb * rows, rows));
    sum += CrossEntropyLoss()
               .compute_loss(logits, narrow(batch.target, 0, mb * rows, rows))
               .item<double>();
  }
  model.train();
  return sum / microbatches;
}

// Dropout on, so a forward left in training mode would not match the reference.
inline std::shared_ptr<Sequential> dropout_gpt() {
  Generator generator(9);
  return gpt({11, 6, 4, 2, 16, 0.2}, &generator);
}

}  // namespace pipit::testing
