// A vocabulary padded for the tensor cores (GptConfig::vocab_multiple): the head gives more
// logits than there are tokens, and the loss, its gradients and generation are those of the
// unpadded model.
#include <catch2/catch.hpp>
#include <filesystem>

#include "bitwise.h"
#include "cuda_testing.h"
#include "file_faults.h"
#include "loss/loss.h"
#include "nn/builders.h"
#include "nn/generate.h"
#include "nn/layers.h"
#include "nn/registry.h"
#include "pipit.h"
#include "serialize/hf_gpt2.h"

using namespace pipit;
using testing::max_abs_difference;

namespace {

constexpr int64_t kVocab = 13;

GptConfig padding_config(int64_t multiple, bool tied) {
  GptConfig config{kVocab, 8, 2, 2, 16, 0.0};
  config.vocab_multiple = multiple;
  config.tie_embeddings = tied;
  config.head_bias = !tied;
  return config;
}

// The padded model with the unpadded one's weights in its real rows.
std::shared_ptr<Sequential> padded_copy(Sequential& plain, int64_t multiple, bool tied) {
  auto padded = gpt(padding_config(multiple, tied));
  NoGradGuard no_grad;
  for (const auto& [name, value] : plain.state_dict()) {
    const Tensor target = padded->state_dict().at(name);
    const Tensor rows = target.shape() == value.shape() ? target : narrow(target, 0, 0, kVocab);
    backend(rows).copy(value, rows);
  }
  return padded;
}

std::pair<Tensor, Tensor> token_pair() {
  std::vector<int64_t> x, y;
  for (int64_t i = 0; i < 3 * 8; ++i) {
    x.push_back((i * 5 + 1) % kVocab);
    y.push_back((i * 7 + 2) % kVocab);
  }
  y[4] = -100;  // an ignored position
  return {from_vector(x, {3, 8}), from_vector(y, {3, 8})};
}

}  // namespace

TEST_CASE("a padded vocabulary leaves the loss and every real gradient as they were", "[nn]") {
  const auto [x, y] = token_pair();
  for (const bool tied : {false, true}) {
    INFO((tied ? "tied" : "untied"));
    Generator g(51);
    auto plain = gpt(padding_config(1, tied), &g);
    auto padded = padded_copy(*plain, 8, tied);
    REQUIRE(padded_vocab(padding_config(8, tied)) == 16);

    const Tensor plain_loss = cross_entropy(plain->forward(x), y);
    const Tensor logits = padded->forward(x);
    REQUIRE(logits.shape() == Shape({3, 8, 16}));
    const Tensor padded_loss = cross_entropy(logits, y, -100, kVocab);
    CHECK(max_abs_difference(padded_loss, plain_loss) <= 1e-6);
    // All 16 columns in the softmax is another loss: the padding must be left out.
    CHECK(max_abs_difference(cross_entropy(logits.detach(), y), plain_loss) > 1e-3);
    plain_loss.backward();
    padded_loss.backward();
    std::map<std::string, Tensor> plain_parameters;
    for (const auto& [name, p] : plain->named_parameters()) plain_parameters[name] = p;
    for (const auto& [name, p] : padded->named_parameters()) {
      INFO(name);
      const Tensor want = plain_parameters.at(name).grad();
      const Tensor got = p.grad();
      if (got.shape() == want.shape()) {
        CHECK(max_abs_difference(got, want) <= 1e-6);
        continue;
      }
      // The head (or the table tied to it): the real rows' gradients, and none for the rest.
      CHECK(max_abs_difference(narrow(got, 0, 0, kVocab), want) <= 1e-6);
      const Tensor padding = narrow(got, 0, kVocab, got.shape()[0] - kVocab);
      CHECK(max_abs_difference(padding, zeros_like(padding)) == 0);
    }
  }
}

TEST_CASE("padding the vocabulary changes no random draw: real rows as unpadded, padding zero",
          "[nn]") {
  for (const bool tied : {false, true}) {
    INFO((tied ? "tied" : "untied"));
    Generator plain_draws(55), padded_draws(55);
    const StateDict plain = gpt(padding_config(1, tied), &plain_draws)->state_dict();
    const StateDict padded = gpt(padding_config(8, tied), &padded_draws)->state_dict();
    // The generator goes on from the same place: a run's later draws (its batches) agree.
    CHECK(padded_draws.offset() == plain_draws.offset());
    REQUIRE(padded.size() == plain.size());
    int grown = 0;
    for (const auto& [name, value] : plain) {
      INFO(name);
      const Tensor got = padded.at(name);
      if (got.shape() == value.shape()) {
        CHECK(testing::bitwise_equal(got, value));
        continue;
      }
      ++grown;
      CHECK(testing::bitwise_equal(narrow(got, 0, 0, kVocab).contiguous(), value));
      const Tensor padding = narrow(got, 0, kVocab, got.shape()[0] - kVocab);
      CHECK(max_abs_difference(padding, zeros_like(padding)) == 0);
    }
    CHECK(grown == (tied ? 1 : 2));  // the tied table, or the head's weight and bias
  }
}

TEST_CASE("CrossEntropyLoss with classes gives the loss and gradient of the first columns",
          "[nn]") {
  Generator g(52);
  const Tensor logits = uniform({6, 10}, -3, 3, &g);
  const Tensor targets = from_vector<int64_t>({0, 6, 2, -100, 5, 1}, {6});
  const CrossEntropyLoss padded(-100, 7), plain;
  const Tensor first = narrow(logits, 1, 0, 7).contiguous();
  CHECK(max_abs_difference(padded.compute_loss(logits, targets),
                           plain.compute_loss(first, targets)) <= 1e-7);
  const Tensor grad = padded.compute_gradient(logits, targets);
  REQUIRE(grad.shape() == logits.shape());
  CHECK(testing::bitwise_equal(narrow(grad, 1, 0, 7).contiguous(),
                               plain.compute_gradient(first, targets)));
  CHECK(max_abs_difference(narrow(grad, 1, 7, 3), zeros({6, 3})) == 0);
  // Its config round-trips; bad counts are refused by name.
  CHECK(make_loss(padded.config())->config() == padded.config());
  CHECK_THROWS_WITH(make_loss({{"type", "CrossEntropyLoss"}, {"classes", 0}}),
                    Catch::Contains("\"classes\""));
  CHECK_THROWS_WITH(cross_entropy(logits, targets, -100, 11), Catch::Contains("classes"));
  // A target among the padding is out of range.
  CHECK_THROWS_WITH(cross_entropy(logits, from_vector<int64_t>({8, 0, 0, 0, 0, 0}, {6}), -100, 7),
                    Catch::Contains("out of range"));
}

TEST_CASE("generation never picks a padded id and matches the unpadded model", "[nn]") {
  Generator g(53);
  auto plain = gpt(padding_config(1, false), &g);
  auto padded = padded_copy(*plain, 8, false);
  {
    // Padded logits that would win every draw if generation read them.
    NoGradGuard no_grad;
    const Tensor bias = padded->state_dict().at(std::to_string(padded->size() - 1) + ".bias");
    backend(bias).fill(narrow(bias, 0, kVocab, 16 - kVocab), 100.0);
  }
  GenerationOptions options;
  options.max_new_tokens = 10;
  const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3}, {4}};
  const auto want = generate(*plain, prompts, options);
  CHECK(generate(*padded, prompts, options) == want);
  options.sample = true;
  options.seed = 7;
  for (const auto& row : generate(*padded, prompts, options)) {
    for (const int64_t id : row) CHECK(id < kVocab);
  }
}

TEST_CASE("a padded model is rebuilt from its config and refused by the GPT-2 writer", "[nn]") {
  auto padded = gpt(padding_config(8, true));
  const auto rebuilt = build_module(padded->config());
  CHECK(rebuilt->config() == padded->config());
  const auto* embedding = dynamic_cast<const TokenPosEmbedding*>((*padded)[0].get());
  REQUIRE(embedding);
  CHECK(embedding->vocab_size() == kVocab);
  CHECK(embedding->rows() == 16);
  const testing::TempDir dir("vocab_padding_hf");
  for (const bool tied : {true, false}) {
    GptConfig config = padding_config(8, tied);
    config.head_bias = false;  // as GPT-2's
    CHECK_THROWS_WITH(save_hf_gpt2(*gpt(config), (dir / "model").string()),
                      Catch::Contains("padded"));
  }
  CHECK_THROWS_WITH(gpt(padding_config(0, false)), Catch::Contains("vocab_multiple"));
}

TEST_CASE("cuda: the cross-entropy of padded logits matches the CPU", "[cuda]") {
  if (!testing::cuda_ready()) return;
  Generator g(54);
  const Tensor targets = from_vector<int64_t>({0, 6, 2, -100, 5, 1}, {6});
  for (const DType dtype : {DType::f32, DType::bf16}) {
    INFO(dtype);
    const Tensor logits = uniform({6, 1000}, -3, 3, &g).to(dtype);
    auto run = [&](Device device) {
      // detach: on the CPU to() returns logits itself, which must stay a plain tensor.
      Tensor x = logits.to(device).detach().requires_grad_();
      Tensor loss = cross_entropy(x, targets.to(device), -100, 997);
      loss.backward();
      return std::pair{loss.to(Device::cpu()), x.grad().to(Device::cpu())};
    };
    const auto [cpu_loss, cpu_grad] = run(testing::kCpu);
    const auto [gpu_loss, gpu_grad] = run(testing::kCuda);
    CHECK(max_abs_difference(gpu_loss, cpu_loss) <= 1e-5);
    // One bf16 step of the largest gradient (1/5 of a row), f32's rounding otherwise.
    CHECK(max_abs_difference(gpu_grad, cpu_grad) <= (dtype == DType::bf16 ? 2e-3 : 1e-6));
    CHECK(max_abs_difference(narrow(gpu_grad, 1, 997, 3), zeros({6, 3})) == 0);
  }
}
