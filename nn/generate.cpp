#include "nn/generate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "nn/layers.h"
#include "nn/transformer.h"
#include "tensor/factory.h"

namespace pipit {
namespace {

// The model's layers as generation runs them: the embedding, then each layer either a
// TransformerBlock (with a KV cache) or a layer that treats every position alone.
struct GptLayers {
  TokenPosEmbedding* embedding = nullptr;
  std::vector<Module*> layers;
  std::vector<TransformerBlock*> blocks;  // nullptr where the layer is position-wise
};

bool position_wise(const Module& layer) {
  return dynamic_cast<const LayerNorm*>(&layer) || dynamic_cast<const Linear*>(&layer) ||
         dynamic_cast<const Dropout*>(&layer) || dynamic_cast<const GELU*>(&layer) ||
         dynamic_cast<const ReLU*>(&layer) || dynamic_cast<const Tanh*>(&layer);
}

GptLayers gpt_layers(const Sequential& model) {
  GptLayers out;
  PIPIT_CHECK(model.size() >= 2 && model.first_index() == 0, "generate: needs a whole GPT model ",
              "(TokenPosEmbedding, TransformerBlocks, LayerNorm, Linear head)");
  out.embedding = dynamic_cast<TokenPosEmbedding*>(model[0].get());
  PIPIT_CHECK(out.embedding != nullptr, "generate: layer 0 is a ",
              model[0]->config().value("type", "?"),
              ", not the TokenPosEmbedding a GPT starts with");
  for (size_t i = 1; i < model.size(); ++i) {
    Module* layer = model[i].get();
    auto* block = dynamic_cast<TransformerBlock*>(layer);
    PIPIT_CHECK(block != nullptr || position_wise(*layer), "generate: layer ", i, " is a ",
                layer->config().value("type", "?"),
                ", which generation cannot run one position at a time");
    out.layers.push_back(layer);
    out.blocks.push_back(block);
  }
  return out;
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

std::vector<std::vector<int64_t>> generate(Sequential& model,
                                           const std::vector<std::vector<int64_t>>& prompts,
                                           const GenerationOptions& options) {
  const GptLayers gpt = gpt_layers(model);
  Sampler sampler(options);
  PIPIT_CHECK(!prompts.empty(), "generate: no prompts");
  PIPIT_CHECK(options.max_new_tokens >= 0, "generate: max_new_tokens must be >= 0, got ",
              options.max_new_tokens);
  const int64_t vocab = gpt.embedding->vocab_size(), context = gpt.embedding->context();
  const int64_t B = static_cast<int64_t>(prompts.size());
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
  if (options.stop_token) {
    PIPIT_CHECK(*options.stop_token >= 0 && *options.stop_token < vocab, "generate: stop token ",
                *options.stop_token, " is outside the vocabulary of ", vocab);
  }
  const int64_t capacity = std::min(context, longest + options.max_new_tokens);
  const int64_t new_tokens = capacity - longest;

  NoGradGuard no_grad;
  EvalGuard eval(model);
  const Tensor reference = model[0]->parameters().at(0);
  const Device device = reference.device();

  std::vector<int64_t> padding(static_cast<size_t>(B));
  bool padded = false;
  std::vector<int64_t> tokens(static_cast<size_t>(B * longest), 0);
  std::vector<int64_t> positions(static_cast<size_t>(B * longest), 0);
  for (int64_t b = 0; b < B; ++b) {
    const auto& prompt = prompts[size_t(b)];
    const int64_t pad = longest - static_cast<int64_t>(prompt.size());
    padding[size_t(b)] = pad;
    padded = padded || pad > 0;
    for (int64_t t = pad; t < longest; ++t) {
      tokens[size_t(b * longest + t)] = prompt[size_t(t - pad)];
      positions[size_t(b * longest + t)] = t - pad;
    }
  }

  std::vector<KvCacheLayer> caches(gpt.blocks.size());
  for (size_t i = 0; i < gpt.blocks.size(); ++i) {
    if (gpt.blocks[i] == nullptr) continue;
    const int64_t heads = gpt.blocks[i]->attn->heads();
    const int64_t head_dim = gpt.blocks[i]->attn->qkv->weight.shape()[1] / heads;
    const TensorOptions cache_options{reference.dtype(), device};
    caches[i] = {empty({B, heads, capacity, head_dim}, cache_options),
                 empty({B, heads, capacity, head_dim}, cache_options)};
  }

  // Runs tokens [B, T] at positions [start, start + T) and returns the last position's logits.
  auto step = [&](const std::vector<int64_t>& ids, const std::vector<int64_t>& at, int64_t start,
                  int64_t T) {
    Tensor h = gpt.embedding->forward(from_vector(ids, {B, T}).to(device),
                                      from_vector(at, {B, T}).to(device));
    const Tensor mask = padded ? padding_mask(padding, start, T, h) : Tensor();
    for (size_t i = 0; i < gpt.layers.size(); ++i) {
      h = gpt.blocks[i] ? gpt.blocks[i]->forward_step(h, caches[i], start, mask)
                        : gpt.layers[i]->forward(h);
    }
    PIPIT_CHECK(h.dim() == 3 && h.shape()[2] == vocab, "generate: the model's output is ",
                shape_str(h.shape()), ", not logits [B, T, ", vocab, "]");
    return squeeze(narrow(h, 1, T - 1, 1), 1).to(Device::cpu()).to(DType::f32).contiguous();
  };

  std::vector<std::vector<int64_t>> out(static_cast<size_t>(B));
  std::vector<bool> finished(static_cast<size_t>(B), false);
  Tensor logits = step(tokens, positions, 0, longest);
  for (int64_t n = 0; n < new_tokens; ++n) {
    std::vector<int64_t> next(static_cast<size_t>(B), 0), at(static_cast<size_t>(B));
    bool running = false;
    const float* rows = logits.data<float>();
    for (int64_t b = 0; b < B; ++b) {
      next[size_t(b)] = sampler.next(rows + b * vocab, vocab);
      at[size_t(b)] = longest + n - padding[size_t(b)];
      if (finished[size_t(b)]) continue;
      out[size_t(b)].push_back(next[size_t(b)]);
      finished[size_t(b)] = options.stop_token && next[size_t(b)] == *options.stop_token;
      running = running || !finished[size_t(b)];
    }
    if (!running || n + 1 == new_tokens) break;
    logits = step(next, at, longest + n, 1);
  }
  return out;
}

}  // namespace pipit
