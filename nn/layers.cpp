#include "nn/layers.h"

#include <cmath>

#include "autograd/ops.h"
#include "tensor/factory.h"

namespace pipit {

Linear::Linear(int64_t in_features, int64_t out_features, bool use_bias, Generator* generator)
    : in_(in_features), out_(out_features) {
  PIPIT_CHECK(in_features > 0 && out_features > 0, "Linear: sizes must be positive, got ",
              in_features, " -> ", out_features);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  weight = register_parameter(
      "weight", skip_init() ? empty({out_, in_}) : uniform({out_, in_}, -bound, bound, generator));
  if (use_bias) {
    bias = register_parameter(
        "bias", skip_init() ? empty({out_}) : uniform({out_}, -bound, bound, generator));
  }
}

Tensor Linear::forward(const Tensor& x) {
  return linear(x, weight, bias);
}

void Linear::parameter_tied(const std::string& name, const Tensor& value) {
  (name == "weight" ? weight : bias) = value;
}

json Linear::config() const {
  return {{"type", "Linear"}, {"in", in_}, {"out", out_}, {"bias", bias.defined()}};
}

Embedding::Embedding(int64_t num_embeddings, int64_t dim, Generator* generator)
    : num_(num_embeddings), dim_(dim) {
  PIPIT_CHECK(num_embeddings > 0 && dim > 0, "Embedding: sizes must be positive, got ",
              num_embeddings, " x ", dim);
  weight = register_parameter(
      "weight", skip_init() ? empty({num_, dim_}) : normal({num_, dim_}, 0.0, 0.02, generator));
}

Tensor Embedding::forward(const Tensor& indices) {
  return embedding(weight, indices);
}

void Embedding::parameter_tied(const std::string&, const Tensor& value) {
  weight = value;
}

json Embedding::config() const {
  return {{"type", "Embedding"}, {"num", num_}, {"dim", dim_}};
}

void copy_padded_rows(const Tensor& from, const Tensor& to) {
  PIPIT_CHECK(from.dim() >= 1 && to.dim() == from.dim() && to.shape()[0] >= from.shape()[0],
              "copy_padded_rows: ", shape_str(to.shape()), " cannot hold ", shape_str(from.shape()),
              " and padding");
  NoGradGuard no_grad;
  const int64_t rows = from.shape()[0], pad = to.shape()[0] - rows;
  backend(to).copy(from, narrow(to, 0, 0, rows));
  if (pad > 0) backend(to).fill(narrow(to, 0, rows, pad), 0.0);
}

TokenPosEmbedding::TokenPosEmbedding(int64_t vocab_size, int64_t context, int64_t width,
                                     Generator* generator, int64_t rows)
    : vocab_(vocab_size), rows_(rows == 0 ? vocab_size : rows), context_(context), width_(width) {
  PIPIT_CHECK(rows_ >= vocab_, "TokenPosEmbedding: ", rows_, " rows cannot hold a vocabulary of ",
              vocab_);
  // The vocabulary's rows drawn as an unpadded table's are, the padding zero.
  auto tokens = std::make_shared<Embedding>(vocab_, width_, generator);
  if (rows_ > vocab_) {
    std::shared_ptr<Embedding> padded;
    {
      SkipInitGuard skip;
      padded = std::make_shared<Embedding>(rows_, width_);
    }
    copy_padded_rows(tokens->weight, padded->weight);
    tokens = padded;
  }
  tokens_ = register_module("tokens", tokens);
  positions_ =
      register_module("positions", std::make_shared<Embedding>(context_, width_, generator));
}

Tensor TokenPosEmbedding::forward(const Tensor& tokens) {
  PIPIT_CHECK(tokens.dim() == 2 && tokens.dtype() == DType::i64,
              "TokenPosEmbedding: expects I64 tokens [B, T], got ", tokens.dtype(), " ",
              shape_str(tokens.shape()));
  const int64_t T = tokens.shape()[1];
  PIPIT_CHECK(T <= context_, "TokenPosEmbedding: sequence length ", T, " exceeds the context ",
              context_);
  Tensor positions = arange(0, static_cast<double>(T), 1.0, {DType::i64, tokens.device()});
  return tokens_->forward(tokens) + positions_->forward(positions);
}

Tensor TokenPosEmbedding::forward(const Tensor& tokens, const Tensor& positions) {
  PIPIT_CHECK(tokens.dim() == 2 && tokens.dtype() == DType::i64 &&
                  positions.shape() == tokens.shape() && positions.dtype() == DType::i64,
              "TokenPosEmbedding: expects I64 tokens and positions [B, T], got ", tokens.dtype(),
              " ", shape_str(tokens.shape()), " and ", positions.dtype(), " ",
              shape_str(positions.shape()));
  // Embedding checks each position against the context (a position past it is out of range).
  return tokens_->forward(tokens) + positions_->forward(positions);
}

json TokenPosEmbedding::config() const {
  json config = {
      {"type", "TokenPosEmbedding"}, {"vocab", vocab_}, {"context", context_}, {"width", width_}};
  if (rows_ != vocab_) config["rows"] = rows_;
  return config;
}

LayerNorm::LayerNorm(int64_t dim, double eps) : dim_(dim), eps_(eps) {
  PIPIT_CHECK(dim > 0, "LayerNorm: dim must be positive, got ", dim);
  weight = register_parameter("weight", ones({dim}));
  bias = register_parameter("bias", zeros({dim}));
}

Tensor LayerNorm::forward(const Tensor& x) {
  return layer_norm(x, weight, bias, eps_);
}

Tensor LayerNorm::forward_for_products(const Tensor& x) {
  return layer_norm_for_products(x, weight, bias, eps_);
}

json LayerNorm::config() const {
  return {{"type", "LayerNorm"}, {"dim", dim_}, {"eps", eps_}};
}

Dropout::Dropout(double p, Generator* generator) : p_(p) {
  Generator& source = generator ? *generator : default_generator();
  generator_.manual_seed(source.bits(source.reserve(1)));
  PIPIT_CHECK(p >= 0 && p < 1, "Dropout: p must be in [0, 1), got ", p);
  register_generator(generator_);
}

Tensor Dropout::forward(const Tensor& x) {
  return dropout(x, p_, is_training(), &generator_);
}

json Dropout::config() const {
  return {{"type", "Dropout"}, {"p", p_}};
}

Tensor ReLU::forward(const Tensor& x) {
  return relu(x);
}
Tensor GELU::forward(const Tensor& x) {
  return gelu(x);
}
Tensor Tanh::forward(const Tensor& x) {
  return tanh(x);
}

}  // namespace pipit
