#pragma once
// The basic layers: each one tensor in, one tensor out. Constructors that initialise weights
// take a Generator (null: default_generator()) so a seeded run is reproducible.
#include "nn/module.h"
#include "tensor/generator.h"

namespace pipit {

// y = x W^T + b with W [out, in]. Default init: uniform(+-1/sqrt(in)), as PyTorch.
class Linear final : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true,
         Generator* generator = nullptr);
  Tensor forward(const Tensor& x) override;
  json config() const override;
  Tensor weight, bias;  // bias undefined when disabled

 protected:
  void parameter_tied(const std::string& name, const Tensor& value) override;

 private:
  int64_t in_, out_;
};

// Rows of weight [num, dim] picked by i64 indices. Init: normal(0, 0.02), as GPT-2.
class Embedding final : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim, Generator* generator = nullptr);
  Tensor forward(const Tensor& indices) override;
  json config() const override;
  Tensor weight;

 protected:
  void parameter_tied(const std::string& name, const Tensor& value) override;

 private:
  int64_t num_, dim_;
};

// to = from's rows, then zero rows up to to's: how a layer gets padded rows without drawing
// them, so padding a vocabulary (GptConfig::vocab_multiple) changes no random draw.
void copy_padded_rows(const Tensor& from, const Tensor& to);

// Token embedding plus learned position embedding: i64 tokens [B, T] -> [B, T, width]. The
// token table has `rows` rows (0: vocab_size): more when the vocabulary is padded so a head
// tied to the table has GEMM-friendly sizes (GptConfig::vocab_multiple); ids from vocab_size
// up are never real tokens.
class TokenPosEmbedding final : public Module {
 public:
  TokenPosEmbedding(int64_t vocab_size, int64_t context, int64_t width,
                    Generator* generator = nullptr, int64_t rows = 0);
  Tensor forward(const Tensor& tokens) override;
  // Tokens at the given positions (i64 [B, T], each below the context): generation with a KV
  // cache embeds one new token per row, and left-padded rows count positions from their start.
  Tensor forward(const Tensor& tokens, const Tensor& positions);
  json config() const override;
  int64_t vocab_size() const { return vocab_; }
  int64_t rows() const { return rows_; }
  int64_t context() const { return context_; }

 private:
  int64_t vocab_, rows_, context_, width_;
  std::shared_ptr<Embedding> tokens_, positions_;
};

class LayerNorm final : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5);
  Tensor forward(const Tensor& x) override;
  // For a result that only feeds matrix products: in autocast's dtype inside an AutocastGuard
  // (autograd/nn_ops.h, layer_norm_for_products).
  Tensor forward_for_products(const Tensor& x);
  json config() const override;
  double eps() const { return eps_; }
  Tensor weight, bias;

 private:
  int64_t dim_;
  double eps_;
};

class Dropout final : public Module {
 public:
  explicit Dropout(double p, Generator* generator = nullptr);
  // Registered by address (Module::generators): not copyable.
  Dropout(const Dropout&) = delete;
  Dropout& operator=(const Dropout&) = delete;
  Tensor forward(const Tensor& x) override;
  json config() const override;

 private:
  double p_;
  Generator generator_;  // its own stream, seeded from the constructor's generator
};

class ReLU final : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  json config() const override { return {{"type", "ReLU"}}; }
};

class GELU final : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  json config() const override { return {{"type", "GELU"}}; }
};

class Tanh final : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  json config() const override { return {{"type", "Tanh"}}; }
};

}  // namespace pipit
