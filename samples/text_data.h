#pragma once
// Text for the GPT samples (train_gpt, train_ps): a generated corpus, its character
// vocabulary, token files, and random training windows.
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "autograd/grad_mode.h"
#include "nn/module.h"
#include "pipit.h"
#include "text/token_file.h"

namespace samples {

using pipit::from_vector;
using pipit::Generator;
using pipit::Tensor;

// A small made-up language with real structure (grammar, agreement, punctuation), so the
// demo needs no files and its loss falls visibly.
inline std::string generated_text(size_t length, uint64_t seed) {
  const std::vector<std::string> subjects = {"the cat",  "a dog",        "the old man", "my sister",
                                             "the king", "a small bird", "the sailor"};
  const std::vector<std::string> verbs = {"sees",  "likes",     "follows",
                                          "calls", "remembers", "finds"};
  const std::vector<std::string> objects = {"the sea",    "a red apple", "the tall tower",
                                            "her friend", "the moon",    "a quiet song"};
  const std::vector<std::string> endings = {".", "!", " today.", " again.", " at night."};
  Generator generator(seed);
  auto pick = [&](const std::vector<std::string>& words) {
    return words[generator.bits(generator.reserve(1)) % words.size()];
  };
  std::string text;
  while (text.size() < length) {
    text += pick(subjects) + " " + pick(verbs) + " " + pick(objects) + pick(endings) + "\n";
  }
  return text;
}

// The characters of a text, numbered in byte order.
struct Vocabulary {
  std::vector<char> chars;
  int index_of[256];
  explicit Vocabulary(const std::string& text) {
    bool seen[256] = {};
    for (unsigned char c : text) seen[c] = true;
    for (int c = 0; c < 256; ++c) {
      index_of[c] = -1;
      if (seen[c]) {
        index_of[c] = static_cast<int>(chars.size());
        chars.push_back(static_cast<char>(c));
      }
    }
  }
  std::vector<int64_t> encode(const std::string& text) const {
    std::vector<int64_t> tokens;
    tokens.reserve(text.size());
    for (unsigned char c : text) tokens.push_back(index_of[c]);
    return tokens;
  }
};

// `batch` random windows of context + 1 tokens: inputs are the first context, targets the
// last context.
inline std::pair<Tensor, Tensor> sample_batch(const std::vector<int64_t>& tokens, int64_t batch,
                                              int64_t context, Generator& generator) {
  std::vector<int64_t> x(static_cast<size_t>(batch * context)), y(x.size());
  const uint64_t span = tokens.size() - static_cast<uint64_t>(context) - 1;
  for (int64_t b = 0; b < batch; ++b) {
    uint64_t start = generator.bits(generator.reserve(1)) % span;
    for (int64_t t = 0; t < context; ++t) {
      x[static_cast<size_t>(b * context + t)] = tokens[start + static_cast<uint64_t>(t)];
      y[static_cast<size_t>(b * context + t)] = tokens[start + static_cast<uint64_t>(t) + 1];
    }
  }
  return {from_vector(x, {batch, context}), from_vector(y, {batch, context})};
}

// The ids of a token file (pipit-tokenizer encode), checked against the vocabulary.
inline std::vector<int64_t> read_token_ids(const std::string& path, size_t vocab_size) {
  pipit::text::TokenFileReader reader(path, vocab_size);
  std::vector<int64_t> ids;
  ids.reserve(reader.header().count);
  std::vector<uint32_t> piece(1 << 16);
  while (const size_t n = reader.read(piece))
    ids.insert(ids.end(), piece.begin(), piece.begin() + n);
  return ids;
}

// `length` characters sampled from the model after `first_token`, each from the softmax of the
// logits over the last `context` characters.
inline std::string sample_text(pipit::Module& model, const Vocabulary& vocab, int64_t first_token,
                               int64_t context, int64_t length, Generator& generator) {
  pipit::NoGradGuard no_grad;
  model.eval();
  std::vector<int64_t> tokens = {first_token};
  for (int64_t i = 0; i < length; ++i) {
    size_t begin = tokens.size() > static_cast<size_t>(context) ? tokens.size() - context : 0;
    std::vector<int64_t> window(tokens.begin() + static_cast<int64_t>(begin), tokens.end());
    const int64_t T = static_cast<int64_t>(window.size());
    Tensor logits = model(from_vector(window, {1, T}));
    Tensor last = narrow(logits, 1, T - 1, 1);
    std::vector<float> probs = softmax(reshape(last, {-1}), 0).to_vector<float>();
    double u = generator.uniform(generator.reserve(1)), cumulative = 0;
    int64_t next = static_cast<int64_t>(probs.size()) - 1;
    for (size_t c = 0; c < probs.size(); ++c) {
      cumulative += probs[c];
      if (u < cumulative) {
        next = static_cast<int64_t>(c);
        break;
      }
    }
    tokens.push_back(next);
  }
  model.train();
  std::string text;
  for (int64_t t : tokens) text += vocab.chars[static_cast<size_t>(t)];
  return text;
}

}  // namespace samples
