#include <catch2/catch.hpp>
#include <cmath>
#include <thread>

#include "nn/builders.h"
#include "nn/layers.h"
#include "nn/registry.h"
#include "nn/transformer.h"
#include "pipit.h"

using namespace pipit;

namespace {
const GptConfig kTiny{13, 8, 2, 2, 16, 0.0};
Tensor tokens_2x6() {
  return from_vector<int64_t>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {2, 6});
}
}  // namespace

TEST_CASE("gpt parameters have dotted names and the expected count", "[nn]") {
  auto model = gpt(kTiny);
  StateDict state = model->state_dict();
  for (const char* name : {"0.tokens.weight", "0.positions.weight", "1.attn.qkv.weight",
                           "2.proj.bias", "3.weight", "4.weight", "4.bias"}) {
    CHECK(state.count(name) == 1);
  }
  const int64_t V = 13, T = 8, C = 16, L = 2;
  const int64_t block =
      2 * 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C);
  CHECK(model->parameter_count() == V * C + T * C + L * block + 2 * C + C * V + V);
  CHECK(model->size() == 5);
}

TEST_CASE("load_state_dict checks names and shapes", "[nn]") {
  auto model = mlp({3, 4, 2});
  StateDict state = mlp({3, 4, 2})->state_dict();
  model->load_state_dict(state);
  CHECK(model->state_dict()["0.weight"].to_vector<float>() == state["0.weight"].to_vector<float>());

  StateDict missing = state;
  missing.erase("2.bias");
  CHECK_THROWS_WITH(model->load_state_dict(missing), Catch::Contains("missing parameter '2.bias'"));
  // Non-strict, into a model of other weights: what the state dict has is loaded, what it lacks
  // keeps its value.
  Generator other(2);
  auto partial = mlp({3, 4, 2}, "relu", &other);
  const std::vector<float> kept = partial->state_dict()["2.bias"].to_vector<float>();
  partial->load_state_dict(missing, false);
  const StateDict loaded = partial->state_dict();
  for (const auto& [name, value] : missing) {
    INFO(name);
    CHECK(loaded.at(name).to_vector<float>() == value.to_vector<float>());
  }
  CHECK(loaded.at("2.bias").to_vector<float>() == kept);
  StateDict extra = state;
  extra["9.weight"] = zeros({1});
  CHECK_THROWS_WITH(model->load_state_dict(extra),
                    Catch::Contains("unexpected parameter '9.weight'"));
  StateDict wrong = state;
  wrong["0.weight"] = zeros({3, 4});
  CHECK_THROWS_WITH(model->load_state_dict(wrong),
                    Catch::Contains("'0.weight' has shape [4, 3]") && Catch::Contains("[3, 4]"));
}

TEST_CASE("the registry rebuilds a model from its config", "[nn]") {
  auto model = gpt(kTiny);
  auto rebuilt = build_module(model->config());
  rebuilt->load_state_dict(model->state_dict());
  CHECK(rebuilt->forward(tokens_2x6()).to_vector<float>() ==
        model->forward(tokens_2x6()).to_vector<float>());
  CHECK_THROWS_WITH(build_module({{"type", "Nope"}}),
                    Catch::Contains("unknown module type 'Nope'"));
  CHECK_THROWS_WITH(build_module({{"type", "Linear"}, {"in", 3}, {"bias", true}}),
                    Catch::Contains("Linear") && Catch::Contains("\"out\""));
  CHECK_THROWS_WITH(build_module({{"type", "Linear"}, {"in", "3"}, {"out", 2}, {"bias", true}}),
                    Catch::Contains("\"in\" must be an integer"));
}

TEST_CASE("Sequential::slice shares parameters and keeps names", "[nn]") {
  auto model = gpt(kTiny);
  auto tail = model->slice(2, 5);
  CHECK(tail->first_index() == 2);
  CHECK(tail->state_dict().count("2.attn.qkv.weight") == 1);
  CHECK(tail->state_dict().count("1.attn.qkv.weight") == 0);
  Tensor w = tail->state_dict()["4.weight"];
  CHECK(w.same_storage(model->state_dict()["4.weight"]));
  auto head = model->slice(0, 2);
  Tensor staged = tail->forward(head->forward(tokens_2x6()));
  CHECK(staged.to_vector<float>() == model->forward(tokens_2x6()).to_vector<float>());
  auto rebuilt = build_module(tail->config());
  CHECK(rebuilt->state_dict().count("2.attn.qkv.weight") == 1);
  CHECK_THROWS_WITH(model->slice(3, 9), Catch::Contains("not a range"));
}

TEST_CASE("attention is causal and TokenPosEmbedding checks the context", "[nn]") {
  auto model = gpt(kTiny);
  Tensor a = from_vector<int64_t>({1, 2, 3, 4, 5, 6}, {1, 6});
  Tensor b = from_vector<int64_t>({1, 2, 3, 9, 0, 12}, {1, 6});
  std::vector<float> out_a = narrow(model->forward(a), 1, 0, 3).contiguous().to_vector<float>();
  std::vector<float> out_b = narrow(model->forward(b), 1, 0, 3).contiguous().to_vector<float>();
  CHECK(out_a == out_b);
  CHECK(model->forward(a).to_vector<float>() != model->forward(b).to_vector<float>());
  CHECK_THROWS_WITH(model->forward(zeros({1, 9}, {DType::i64})),
                    Catch::Contains("sequence length 9 exceeds the context 8"));
}

TEST_CASE("causal_softmax is scale, causal mask and softmax in one op", "[nn]") {
  Generator g(31);
  for (const auto& [dtype, tol] : {std::pair{DType::f64, 1e-14}, std::pair{DType::f32, 1e-6}}) {
    for (int64_t T : {1, 7, 40}) {
      INFO(dtype << ", T " << T);
      const Tensor scores = uniform({2, 3, T, T}, -4, 4, &g, {dtype});
      const Tensor grad = uniform({2, 3, T, T}, -1, 1, &g, {dtype});
      const Tensor positions = arange(0, static_cast<double>(T), 1.0, {DType::i64});
      const Tensor future = gt(reshape(positions, {1, T}), reshape(positions, {T, 1}));
      Tensor x_want = scores.clone().requires_grad_(), x_got = scores.clone().requires_grad_();
      const Tensor want = softmax(masked_fill(x_want * 0.35, future, -INFINITY), -1);
      const Tensor got = causal_softmax(x_got, 0.35);
      want.backward(grad);
      got.backward(grad);
      const std::vector<double> w = want.to_vector<double>(), o = got.to_vector<double>();
      const std::vector<double> wg = x_want.grad().to_vector<double>();
      const std::vector<double> og = x_got.grad().to_vector<double>();
      double worst = 0, worst_grad = 0;
      for (size_t i = 0; i < w.size(); ++i) {
        worst = std::max(worst, std::abs(o[i] - w[i]));
        worst_grad = std::max(worst_grad, std::abs(og[i] - wg[i]));
      }
      CHECK(worst <= tol);
      CHECK(worst_grad <= tol);
      // The masked keys are exactly 0, forward and backward.
      for (int64_t i = 0; i < T; ++i) {
        for (int64_t j = i + 1; j < T; ++j) {
          CHECK(o[static_cast<size_t>(i * T + j)] == 0);
          CHECK(og[static_cast<size_t>(i * T + j)] == 0);
        }
      }
    }
  }
  CHECK_THROWS_WITH(causal_softmax(zeros({2, 3, 4}), 1.0),
                    Catch::Contains("expects scores [..., T, T], got [2, 3, 4]"));
}

TEST_CASE("train and eval reach nested dropout", "[nn]") {
  auto model = gpt({13, 8, 1, 2, 16, 0.5});
  model->eval();
  std::vector<float> first = model->forward(tokens_2x6()).to_vector<float>();
  CHECK(model->forward(tokens_2x6()).to_vector<float>() == first);
  model->train();
  CHECK(model->forward(tokens_2x6()).to_vector<float>() != first);
}

TEST_CASE("SkipInitGuard skips weight initialisation on its thread only, and nests", "[nn]") {
  CHECK_FALSE(skip_init());
  {
    SkipInitGuard outer;
    CHECK(skip_init());
    {
      SkipInitGuard inner;
      CHECK(skip_init());
    }
    CHECK(skip_init());
    bool other_thread = true;
    std::thread([&] { other_thread = skip_init(); }).join();
    CHECK_FALSE(other_thread);
    // Built under the guard, a layer draws nothing from its generator.
    Generator generator(3);
    Linear(4, 3, true, &generator);
    CHECK(generator.offset() == 0);
  }
  CHECK_FALSE(skip_init());
}
