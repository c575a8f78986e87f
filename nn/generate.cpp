#include "nn/generate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "nn/layers.h"
#include "nn/transformer.h"
#include "tensor/factory.h"

namespace pipit {
namespace {

bool position_wise(const Module& layer) {
  return dynamic_cast<const LayerNorm*>(&layer) || dynamic_cast<const Linear*>(&layer) ||
         dynamic_cast<const Dropout*>(&layer) || dynamic_cast<const GELU*>(&layer) ||
         dynamic_cast<const ReLU*>(&layer) || dynamic_cast<const Tanh*>(&layer);
}

class EvalGuard {
 public:
  explicit EvalGuard(Module& model) : model_(model), was_training_(model.is_training()) {
    model.eval();
  }
  ~EvalGuard() { model_.train(was_training_); }
  EvalGuard(const EvalGuard&) = delete;
  EvalGuard& operator=(const EvalGuard&) = delete;

 private:
  Module& model_;
  bool was_training_;
};

// The next token from one row's logits.
class Sampler {
 public:
  explicit Sampler(const GenerationOptions& options) : options_(options), rng_(options.seed) {
    PIPIT_CHECK(!options.sample || (options.temperature > 0 && std::isfinite(options.temperature)),
                "generate: temperature must be positive, got ", options.temperature);
    PIPIT_CHECK(options.top_k >= 0, "generate: top_k must be >= 0, got ", options.top_k);
    PIPIT_CHECK(options.top_p > 0 && options.top_p <= 1, "generate: top_p must be in (0, 1], got ",
                options.top_p);
  }

  int64_t next(const float* logits, int64_t vocab) {
    if (!options_.sample) return std::max_element(logits, logits + vocab) - logits;
    // Candidates by falling logit (ties by id), cut to top_k, then to top_p of the softmax.
    order_.resize(static_cast<size_t>(vocab));
    std::iota(order_.begin(), order_.end(), int64_t{0});
    std::stable_sort(order_.begin(), order_.end(),
                     [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
    size_t kept = order_.size();
    if (options_.top_k > 0) kept = std::min(kept, static_cast<size_t>(options_.top_k));
    probabilities_.resize(kept);
    const double top = logits[order_[0]] / options_.temperature;
    double total = 0;
    for (size_t i = 0; i < kept; ++i) {
      probabilities_[i] = std::exp(logits[order_[i]] / options_.temperature - top);
      total += probabilities_[i];
    }
    if (options_.top_p < 1) {
      double cumulative = 0;
      size_t i = 0;
      while (i < kept && cumulative < options_.top_p * total) cumulative += probabilities_[i++];
      kept = std::max<size_t>(i, 1);
      total = std::accumulate(probabilities_.begin(), probabilities_.begin() + kept, 0.0);
    }
    // 53 random bits as a double in [0, 1): the same draws on every standard library.
    const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * total;
    double cumulative = 0;
    for (size_t i = 0; i + 1 < kept; ++i) {
      cumulative += probabilities_[i];
      if (u < cumulative) return order_[i];
    }
    return order_[kept - 1];
  }

 private:
  GenerationOptions options_;
  std::mt19937_64 rng_;
  std::vector<int64_t> order_;
  std::vector<double> probabilities_;
};

// Additive attention mask [B, 1, T, start + T] for queries at positions [start, start + T):
// a query sees the keys up to its own position that are not padding. A padding query sees
// itself, so its row stays finite (its output is never used).
Tensor padding_mask(const std::vector<int64_t>& padding, int64_t start, int64_t T,
                    const Tensor& like) {
  const int64_t B = static_cast<int64_t>(padding.size()), keys = start + T;
  std::vector<float> mask(static_cast<size_t>(B * T * keys), 0.0f);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t query = start + t;
      for (int64_t key = 0; key < keys; ++key) {
        const bool visible = key == query || (key < query && key >= padding[size_t(b)]);
        if (!visible) {
          mask[size_t((b * T + t) * keys + key)] = -std::numeric_limits<float>::infinity();
        }
      }
    }
  }
  return from_vector(mask, {B, 1, T, keys}).to(like.dtype()).to(like.device());
}

}  // namespace

CachedLayers::CachedLayers(const Sequential& layers, int64_t batch, int64_t capacity,
                           std::vector<int64_t> padding)
    : padding_(std::move(padding)) {
  PIPIT_CHECK(static_cast<int64_t>(padding_.size()) == batch, "generate: ", padding_.size(),
              " paddings for ", batch, " rows");
  for (const int64_t pad : padding_) padded_ = padded_ || pad > 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    Module* layer = layers[i].get();
    auto* block = dynamic_cast<TransformerBlock*>(layer);
    const bool embedding = i == 0 && dynamic_cast<TokenPosEmbedding*>(layer) != nullptr;
    PIPIT_CHECK(block != nullptr || embedding || position_wise(*layer), "generate: layer ",
                layers.first_index() + i, " is a ", layer->config().value("type", "?"),
                ", which generation cannot run one position at a time");
    layers_.push_back(layer);
    blocks_.push_back(block);
    KvCacheLayer cache;
    if (block) {
      const Tensor weight = block->attn->qkv->weight;
      const int64_t heads = block->attn->heads(), head_dim = weight.shape()[1] / heads;
      // Under autocast attention reads keys and values rounded to the compute dtype: the
      // cache holds them so, rounded once when stored instead of at every step's read.
      const DType compute = weight.dtype() == DType::f32 ? autocast_dtype() : weight.dtype();
      const TensorOptions options{compute, weight.device()};
      cache = {empty({batch, heads, capacity, head_dim}, options),
               empty({batch, heads, capacity, head_dim}, options)};
    }
    caches_.push_back(std::move(cache));
  }
}

Tensor CachedLayers::forward(const Tensor& x, int64_t start) {
  PIPIT_CHECK(x.dim() >= 2 && x.shape()[0] == static_cast<int64_t>(padding_.size()),
              "generate: a step's input is ", shape_str(x.shape()), " for ", padding_.size(),
              " rows");
  const int64_t B = x.shape()[0], T = x.shape()[1];
  Tensor h = x;
  size_t first = 0;
  if (auto* embedding = layers_.empty() ? nullptr : dynamic_cast<TokenPosEmbedding*>(layers_[0])) {
    // Each row counts positions from its first real token, as Hugging Face's left padding does.
    std::vector<int64_t> positions(static_cast<size_t>(B * T));
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < T; ++t) {
        positions[size_t(b * T + t)] = std::max<int64_t>(0, start + t - padding_[size_t(b)]);
      }
    }
    const Device device = embedding->parameters().at(0).device();
    h = embedding->forward(x.to(device), from_vector(positions, {B, T}).to(device));
    first = 1;
  }
  const Tensor mask = padded_ ? padding_mask(padding_, start, T, h) : Tensor();
  for (size_t i = first; i < layers_.size(); ++i) {
    h = blocks_[i] ? blocks_[i]->forward_step(h, caches_[i], start, mask) : layers_[i]->forward(h);
  }
  return h;
}

namespace {

// A whole model on this thread, where its parameters are.
class LocalStepper final : public TokenStepper {
 public:
  explicit LocalStepper(Sequential& model) : model_(model) {
    PIPIT_CHECK(model.size() >= 2 && model.first_index() == 0, "generate: needs a whole GPT ",
                "(TokenPosEmbedding, TransformerBlocks, LayerNorm, Linear head)");
    embedding_ = dynamic_cast<TokenPosEmbedding*>(model[0].get());
    PIPIT_CHECK(embedding_ != nullptr, "generate: layer 0 is a ",
                model[0]->config().value("type", "?"),
                ", not the TokenPosEmbedding a GPT starts with");
  }
  int64_t vocab_size() const override { return embedding_->vocab_size(); }
  int64_t context() const override { return embedding_->context(); }
  void begin(int64_t batch, int64_t capacity, const std::vector<int64_t>& padding) override {
    layers_.emplace(model_, batch, capacity, padding);
  }
  Tensor step(const Tensor& tokens, int64_t start) override {
    return last_logits(layers_->forward(tokens, start), vocab_size());
  }
  void end() override { layers_.reset(); }

 private:
  Sequential& model_;
  TokenPosEmbedding* embedding_ = nullptr;
  std::optional<CachedLayers> layers_;
};

// The longest prompt's length, after checking every prompt and option against the model.
int64_t check_prompts(const std::vector<std::vector<int64_t>>& prompts,
                      const GenerationOptions& options, int64_t vocab, int64_t context) {
  PIPIT_CHECK(!prompts.empty(), "generate: no prompts");
  PIPIT_CHECK(options.max_new_tokens >= 0, "generate: max_new_tokens must be >= 0, got ",
              options.max_new_tokens);
  int64_t longest = 0;
  for (size_t b = 0; b < prompts.size(); ++b) {
    const auto& prompt = prompts[b];
    PIPIT_CHECK(!prompt.empty(), "generate: prompt ", b, " is empty");
    PIPIT_CHECK(static_cast<int64_t>(prompt.size()) <= context, "generate: prompt ", b, " has ",
                prompt.size(), " tokens, more than the model's context of ", context);
    for (size_t t = 0; t < prompt.size(); ++t) {
      PIPIT_CHECK(prompt[t] >= 0 && prompt[t] < vocab, "generate: prompt ", b, " token ", t,
                  " is id ", prompt[t], ", outside the vocabulary of ", vocab);
    }
    longest = std::max(longest, static_cast<int64_t>(prompt.size()));
  }
  PIPIT_CHECK(!options.stop_token || (*options.stop_token >= 0 && *options.stop_token < vocab),
              "generate: stop token ", options.stop_token.value_or(0),
              " is outside the vocabulary of ", vocab);
  return longest;
}

}  // namespace

Tensor last_logits(const Tensor& output, int64_t vocab) {
  PIPIT_CHECK(output.dim() == 3 && output.shape()[2] >= vocab, "generate: the model's output is ",
              shape_str(output.shape()), ", not logits [B, T, ", vocab, "]");
  const int64_t T = output.shape()[1];
  const Tensor last = narrow(narrow(output, 1, T - 1, 1), 2, 0, vocab);
  return squeeze(last, 1).to(Device::cpu()).to(DType::f32).contiguous();
}

std::vector<std::vector<int64_t>> generate(TokenStepper& model,
                                           const std::vector<std::vector<int64_t>>& prompts,
                                           const GenerationOptions& options) {
  Sampler sampler(options);
  const int64_t vocab = model.vocab_size(), context = model.context();
  const int64_t B = static_cast<int64_t>(prompts.size());
  const int64_t longest = check_prompts(prompts, options, vocab, context);
  const int64_t capacity = std::min(context, longest + options.max_new_tokens);
  const int64_t new_tokens = capacity - longest;

  std::vector<int64_t> padding(static_cast<size_t>(B));
  std::vector<int64_t> tokens(static_cast<size_t>(B * longest), 0);
  for (int64_t b = 0; b < B; ++b) {
    const auto& prompt = prompts[size_t(b)];
    padding[size_t(b)] = longest - static_cast<int64_t>(prompt.size());
    std::copy(prompt.begin(), prompt.end(), tokens.begin() + (b + 1) * longest - prompt.size());
  }
  model.begin(B, capacity, padding);
  // On an error the caches are dropped too, best effort: the error in flight is the one to see.
  struct EndOnError {
    TokenStepper& model;
    bool armed = true;
    ~EndOnError() {
      if (!armed) return;
      try {
        model.end();
      } catch (...) {
      }
    }
  } end_on_error{model};

  std::vector<std::vector<int64_t>> out(static_cast<size_t>(B));
  std::vector<bool> finished(static_cast<size_t>(B), false);
  Tensor logits = model.step(from_vector(tokens, {B, longest}), 0);
  for (int64_t n = 0; n < new_tokens; ++n) {
    // A padded vocabulary's extra logits (GptConfig::vocab_multiple) are never drawn.
    PIPIT_CHECK(logits.dim() == 2 && logits.shape()[0] == B && logits.shape()[1] >= vocab,
                "generate: a step returned ", shape_str(logits.shape()), ", not logits [", B, ", ",
                vocab, "]");
    std::vector<int64_t> next(static_cast<size_t>(B), 0);
    bool running = false;
    const float* rows = logits.data<float>();
    const int64_t row_length = logits.shape()[1];
    for (int64_t b = 0; b < B; ++b) {
      next[size_t(b)] = sampler.next(rows + b * row_length, vocab);
      if (finished[size_t(b)]) continue;
      out[size_t(b)].push_back(next[size_t(b)]);
      finished[size_t(b)] = options.stop_token && next[size_t(b)] == *options.stop_token;
      running = running || !finished[size_t(b)];
    }
    if (!running || n + 1 == new_tokens) break;
    logits = model.step(from_vector(next, {B, 1}), longest + n);
  }
  end_on_error.armed = false;
  model.end();
  return out;
}

std::vector<std::vector<int64_t>> generate(Sequential& model,
                                           const std::vector<std::vector<int64_t>>& prompts,
                                           const GenerationOptions& options) {
  LocalStepper stepper(model);
  NoGradGuard no_grad;
  EvalGuard eval(model);
  AutocastGuard autocast(options.dtype);
  CastCache weights_rounded_once;
  return generate(stepper, prompts, options);
}

}  // namespace pipit
