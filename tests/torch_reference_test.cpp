// pipit against numbers PyTorch computed (tests/make_torch_reference.py writes them; this test
// needs no Python).
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "nn/layers.h"
#include "nn/transformer.h"
#include "optim/optimizer.h"
#include "pipit.h"

using namespace pipit;
using nlohmann::json;

namespace {

const json& cases() {
  static const json data = [] {
    std::ifstream in(PIPIT_TEST_DATA "/torch_reference.json");
    REQUIRE(in);
    return json::parse(in)["cases"];
  }();
  return data;
}

Tensor load(const json& t) {
  return from_vector(t["values"].get<std::vector<float>>(), t["shape"].get<Shape>());
}

// ||actual - expected|| / ||expected|| below 1e-5, as float32 arithmetic allows.
void check_close(const Tensor& actual, const json& expected, const std::string& what) {
  INFO(what);
  REQUIRE(actual.defined());
  REQUIRE(actual.shape() == expected["shape"].get<Shape>());
  std::vector<float> a = actual.to_vector<float>();
  std::vector<float> e = expected["values"].get<std::vector<float>>();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (double(a[i]) - e[i]) * (double(a[i]) - e[i]);
    norm += double(e[i]) * e[i];
  }
  CHECK(std::sqrt(diff) <= 1e-5 * std::sqrt(norm) + 1e-7);
}

Tensor leaf(const json& t) {
  return load(t).requires_grad_();
}

// A layer with a weight and a bias (Linear, LayerNorm) given case `c`'s parameters: its output
// and the gradients of its input and parameters against PyTorch's.
template <typename Layer>
void check_weight_and_bias_layer(Layer& layer, const json& c) {
  layer.load_state_dict({{"weight", load(c["weight"])}, {"bias", load(c["bias"])}});
  Tensor x = leaf(c["x"]);
  Tensor out = layer(x);
  out.backward(load(c["upstream"]));
  check_close(out, c["out"], "out");
  check_close(x.grad(), c["grad_x"], "grad x");
  check_close(layer.weight.grad(), c["grad_weight"], "grad weight");
  check_close(layer.bias.grad(), c["grad_bias"], "grad bias");
}

}  // namespace

TEST_CASE("Linear matches PyTorch", "[torch]") {
  Linear layer(4, 5);
  check_weight_and_bias_layer(layer, cases()["linear"]);
}

TEST_CASE("LayerNorm matches PyTorch", "[torch]") {
  LayerNorm layer(6);
  check_weight_and_bias_layer(layer, cases()["layer_norm"]);
}

TEST_CASE("GELU (tanh approximation) matches PyTorch", "[torch]") {
  const json& c = cases()["gelu"];
  Tensor x = leaf(c["x"]);
  Tensor out = gelu(x);
  out.backward(load(c["upstream"]));
  check_close(out, c["out"], "out");
  check_close(x.grad(), c["grad_x"], "grad x");
}

TEST_CASE("softmax and cross-entropy match PyTorch", "[torch]") {
  const json& c = cases()["cross_entropy"];
  Tensor logits = leaf(c["logits"]);
  Tensor targets =
      from_vector(c["targets"].get<std::vector<int64_t>>(), c["target_shape"].get<Shape>());
  Tensor loss = cross_entropy(logits, targets);
  CHECK(loss.item<double>() == Approx(c["loss"].get<double>()).epsilon(1e-6));
  check_close(softmax(logits, -1), c["softmax"], "softmax");
  loss.backward();
  check_close(logits.grad(), c["grad_logits"], "grad logits");
}

TEST_CASE("CausalSelfAttention matches PyTorch", "[torch]") {
  const json& c = cases()["attention"];
  CausalSelfAttention attention(c["width"], c["heads"]);
  StateDict weights;
  for (const char* name : {"qkv.weight", "qkv.bias", "proj.weight", "proj.bias"}) {
    weights[name] = load(c[name]);
  }
  attention.load_state_dict(weights);
  Tensor x = leaf(c["x"]);
  Tensor out = attention(x);
  out.backward(load(c["upstream"]));
  check_close(out, c["out"], "out");
  check_close(x.grad(), c["grad_x"], "grad x");
  check_close(attention.qkv->weight.grad(), c["grad_qkv.weight"], "grad qkv.weight");
  check_close(attention.qkv->bias.grad(), c["grad_qkv.bias"], "grad qkv.bias");
  check_close(attention.proj->weight.grad(), c["grad_proj.weight"], "grad proj.weight");
  check_close(attention.proj->bias.grad(), c["grad_proj.bias"], "grad proj.bias");
}

TEST_CASE("two AdamW steps match PyTorch", "[torch]") {
  const json& c = cases()["adamw"];
  Tensor p = leaf(c["param"]);
  AdamW optimizer({{"p", p}}, {c["lr"], c["beta1"], c["beta2"], c["eps"], c["weight_decay"]});
  for (size_t step = 0; step < 2; ++step) {
    p.set_grad(load(c["grads"][step]));
    optimizer.step();
    check_close(p, c["after"][step], "after step " + std::to_string(step + 1));
  }
}
