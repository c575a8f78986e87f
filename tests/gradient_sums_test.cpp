// Where gradients meet (a residual stream), the engine offers the gradient that already waits to
// the node that computes the other (Node::apply_adding): layer norm's backward writes the sum in
// its own pass, with the bits of the separate add it replaces.
#include <catch2/catch.hpp>

#include "autograd/node.h"
#include "autograd/split_backward.h"
#include "bitwise.h"
#include "nn/builders.h"
#include "pipit.h"
#include "tensor/backend.h"

using namespace pipit;
using pipit::testing::bitwise_equal;

namespace {

// y = 2 h through one node with h twice among its inputs, which adds every gradient it is
// offered: the engine must offer h's waiting gradient once, or the sum would count it twice.
struct TwiceTakingWaiting : Node {
  std::vector<Tensor> apply(const Tensor& g) override { return {g, g}; }
  std::vector<Tensor> apply_adding(const Tensor& g, std::vector<Tensor>& waiting) override {
    std::vector<Tensor> grads;
    for (const Tensor& w : waiting) grads.push_back(w.defined() ? w + g : g);
    return grads;
  }
  std::string name() const override { return "TwiceTakingWaiting"; }
};

Tensor twice(const Tensor& h) {
  Tensor y = h.detach() * 2.0;
  detail::make_node<TwiceTakingWaiting>(y, {h, h});
  return y;
}

}  // namespace

TEST_CASE("a node adds its gradient into the one waiting for its input, offered once",
          "[autograd]") {
  Tensor x = from_vector<float>({1, -2, 3}).requires_grad_();
  Tensor h = x * 3.0;
  // The add's second input runs first (the engine's ready list is a stack): h * 5's gradient
  // waits for h when the twice node runs.
  sum(twice(h) + h * 5.0).backward();
  CHECK(x.grad().to_vector<float>() == std::vector<float>{21, 21, 21});  // (2 + 5) * 3
  CHECK(last_gradient_sums().taken == 1);
  CHECK(last_gradient_sums().separate == 1);  // the second input's share, not offered
}

TEST_CASE("layer norm's backward adds a residual with the bits of a separate add", "[autograd]") {
  Generator g(5);
  for (DType dt : {DType::f32, DType::f64}) {
    INFO(dt);
    const Tensor x = randn({6, 10}, &g).to(dt), w = randn({10}, &g).to(dt),
                 b = randn({10}, &g).to(dt), grad = randn({6, 10}, &g).to(dt),
                 residual = randn({6, 10}, &g).to(dt);
    Backend& cpu = backend(x);
    Tensor out = Tensor::empty({6, 10}, dt), mean = Tensor::empty({6}, dt),
           rstd = Tensor::empty({6}, dt);
    cpu.layer_norm(x, w, b, 1e-5, out, mean, rstd);
    Tensor own = Tensor::empty({6, 10}, dt), summed = Tensor::empty({6, 10}, dt),
           gw = Tensor::empty({10}, dt), gb = Tensor::empty({10}, dt);
    cpu.layer_norm_backward(grad, x, w, mean, rstd, Tensor(), own, gw, gb);
    cpu.layer_norm_backward(grad, x, w, mean, rstd, residual, summed, gw, gb);
    CHECK(bitwise_equal(summed, residual + own));
    Tensor in_place = residual.clone();
    cpu.layer_norm_backward(grad, x, w, mean, rstd, in_place, in_place, gw, gb);
    CHECK(bitwise_equal(in_place, summed));
    CHECK_THROWS_WITH(
        cpu.layer_norm_backward(grad, x, w, mean, rstd, transpose(reshape(residual, {10, 6}), 0, 1),
                                summed, gw, gb),
        Catch::Contains("residual must be contiguous"));
  }
}

TEST_CASE("each block's two layer norms take the residual stream's gradient into their pass",
          "[autograd]") {
  Generator generator(7);
  const GptConfig config{13, 6, 3, 2, 16, 0.0};
  auto model = gpt(config, &generator);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 12; ++i) ids.push_back((i * 5 + 2) % 13);
  const Tensor tokens = from_vector(ids, {2, 6});
  cross_entropy(model->forward(tokens), tokens).backward();
  CHECK(last_gradient_sums().taken == 2 * config.layers);

  // In a split backward's B too, with the same input gradient as a whole backward.
  model->zero_grad();
  Tensor hidden;
  {
    NoGradGuard no_grad;
    hidden = (*model)[0]->forward(tokens);  // the embedding
  }
  auto blocks = model->slice(1, 1 + config.layers);
  Tensor whole_leaf = hidden.detach().requires_grad_(),
         split_leaf = hidden.detach().requires_grad_();
  Tensor whole_out = blocks->forward(whole_leaf);
  const Tensor out_grad = randn(whole_out.shape(), &generator);
  whole_out.backward(out_grad);
  Tensor split_out = blocks->forward(split_leaf);
  DeferredGradients deferred = backward_inputs_first(split_out, out_grad, {split_leaf});
  CHECK(last_gradient_sums().taken == 2 * config.layers);
  CHECK(bitwise_equal(split_leaf.grad(), whole_leaf.grad()));
  deferred.run();
}
