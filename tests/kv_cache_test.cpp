// The KV cache (nn/generate.h's CachedLayers) computes what the whole model computes: a
// prompt's step and each later one-token step give the logits of the model's own forward on
// the tokens so far, with attention over every cached position in play. Under bf16 autocast
// the cache holds keys and values as autocast rounds them, and the logits are the model's bit
// for bit; in f32 a one-row product may sum in another order than a seven-row one.
#include <catch2/catch.hpp>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "bitwise.h"
#include "nn/builders.h"
#include "nn/generate.h"
#include "tensor/factory.h"

using namespace pipit;

TEST_CASE("cached steps give the model's own logits, in f32 and in bf16", "[generate]") {
  const std::vector<int64_t> tokens = {3, 17, 4, 9, 22, 1, 8};
  const int64_t prompt = 4, B = 1, vocab = 23;
  for (const uint64_t seed : {41, 42, 43}) {
    Generator g(seed);
    auto model =
        gpt({.vocab_size = vocab, .context = 16, .layers = 2, .heads = 2, .width = 32}, &g);
    model->eval();
    NoGradGuard no_grad;
    // Per dtype, the logits of the prompt's step and of each later step.
    std::vector<std::vector<Tensor>> steps;
    for (const DType dtype : {DType::f32, DType::bf16}) {
      INFO("seed " << seed << ", " << dtype);
      AutocastGuard autocast(dtype);
      CachedLayers cached(*model, B, 16, {0});
      std::vector<Tensor>& got = steps.emplace_back();
      const std::vector<int64_t> head(tokens.begin(), tokens.begin() + prompt);
      got.push_back(last_logits(cached.forward(from_vector(head, {B, prompt}), 0), vocab));
      for (int64_t t = prompt; t < static_cast<int64_t>(tokens.size()); ++t) {
        got.push_back(last_logits(
            cached.forward(from_vector<int64_t>({tokens[size_t(t)]}, {B, 1}), t), vocab));
      }
      for (size_t i = 0; i < got.size(); ++i) {
        const int64_t end = prompt + static_cast<int64_t>(i);
        INFO("tokens [0, " << end << ")");
        const std::vector<int64_t> first(tokens.begin(), tokens.begin() + end);
        const Tensor whole = last_logits(model->forward(from_vector(first, {B, end})), vocab);
        // Measured on an AMD EPYC with oneDNN (2026-11-28): f32 at most 1.1e-7 of the largest
        // logit, bf16 0.
        if (dtype == DType::f32) {
          CHECK(testing::max_abs_difference(got[i], whole) <=
                1e-6 * max(abs(whole)).item<double>());
        } else {
          CHECK(testing::bitwise_equal(got[i], whole));
        }
      }
    }
    // bf16 ran under autocast: its logits are not f32's.
    CHECK_FALSE(testing::bitwise_equal(steps[0].back(), steps[1].back()));
  }
}
