#include <catch2/catch.hpp>

#include "nn/builders.h"
#include "optim/optimizer.h"
#include "pipit.h"
#include "train/weight_decay.h"

using namespace pipit;

namespace {

GptConfig one_block(bool tied) {
  GptConfig config;
  config.vocab_size = 11;
  config.context = 4;
  config.layers = 1;
  config.heads = 2;
  config.width = 8;
  config.tie_embeddings = tied;
  config.head_bias = !tied;
  return config;
}

// What no_weight_decay must name in one_block(): every bias, both LayerNorms' and the final
// norm's weights, the token and position tables; not the attention's or MLP's or the head's
// matrices.
const std::vector<std::string> kSpared = {"0.positions.weight",
                                          "0.tokens.weight",
                                          "1.attn.proj.bias",
                                          "1.attn.qkv.bias",
                                          "1.ln1.bias",
                                          "1.ln1.weight",
                                          "1.ln2.bias",
                                          "1.ln2.weight",
                                          "1.fc.bias",
                                          "1.proj.bias",
                                          "2.bias",
                                          "2.weight",
                                          "3.bias"};

}  // namespace

TEST_CASE("weight decay spares biases, norms and embeddings, and nothing else", "[optim]") {
  std::vector<std::string> spared = kSpared;
  std::ranges::sort(spared);  // no_weight_decay lists them in name order
  CHECK(no_weight_decay(*gpt(one_block(false))) == spared);
  // The head's matrix, tied to the token table, is spared with it under both names.
  std::vector<std::string> tied = kSpared;
  std::erase(tied, "3.bias");
  tied.push_back("3.weight");
  std::ranges::sort(tied);
  CHECK(no_weight_decay(*gpt(one_block(true))) == tied);
}

TEST_CASE("AdamW decays every parameter but those its no_decay names", "[optim]") {
  // With zero gradients Adam's own step is 0, so a parameter moves by weight decay alone:
  // p * (1 - lr * weight_decay) when decayed, not at all when spared.
  const auto model = gpt(one_block(true));
  const std::vector<std::string> spared = no_weight_decay(*model);
  nlohmann::json config = {{"type", "AdamW"}, {"lr", 0.5}, {"weight_decay", 0.1}};
  config["no_decay"] = spared;
  auto optimizer = make_optimizer(config, model->named_parameters());
  CHECK(optimizer->config()["no_decay"] == config["no_decay"]);
  std::map<std::string, std::vector<float>> before;
  for (auto& [name, p] : model->named_parameters()) {
    before[name] = p.to_vector<float>();
    p.set_grad(zeros_like(p));
  }
  optimizer->step();
  int decayed = 0;
  for (const auto& [name, p] : model->named_parameters()) {
    INFO(name);
    const std::vector<float> after = p.to_vector<float>();
    const bool spare = std::ranges::count(spared, name) > 0;
    for (size_t i = 0; i < after.size(); ++i) {
      const float expected = spare ? before[name][i] : before[name][i] * (1 - 0.5f * 0.1f);
      REQUIRE(after[i] == Approx(expected).epsilon(1e-6).margin(1e-12));
    }
    decayed += spare ? 0 : 1;
  }
  CHECK(decayed == 4);  // qkv, the attention's projection, fc, the MLP's projection
}

TEST_CASE("AdamW's no_decay must list names", "[optim]") {
  const auto model = gpt(one_block(false));
  nlohmann::json config = {{"type", "AdamW"}, {"no_decay", {"1.ln1.bias", 3}}};
  CHECK_THROWS_WITH(make_optimizer(config, model->named_parameters()),
                    Catch::Contains("no_decay: not a name: 3"));
}
