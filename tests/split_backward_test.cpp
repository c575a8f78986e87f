// Split backward (autograd/split_backward.h): the input-gradient part now and the weight-gradient
// part later add up to exactly what one backward gives, bit for bit.
#include <catch2/catch.hpp>

#include "autograd/accumulation_hook.h"
#include "autograd/split_backward.h"
#include "bitwise.h"
#include "nn/builders.h"
#include "pipit.h"

using namespace pipit;
using pipit::testing::bitwise_equal;

namespace {

struct Chunk {
  std::shared_ptr<Sequential> gpt;
  std::shared_ptr<Sequential> layers;  // the chunk under test
  Tensor input;                        // what the chunk receives: tokens or hidden states
};

// A GPT cut like a pipeline stage: layers [begin, end) of the model, fed by the layers before.
Chunk make_chunk(size_t begin, size_t end) {
  Generator generator(11);
  auto model = gpt(GptConfig{13, 6, 4, 2, 16, 0.0}, &generator);
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < 3 * 6; ++i) tokens.push_back((i * 5 + 2) % 13);
  Tensor input = from_vector(tokens, {3, 6});
  if (begin > 0) {
    NoGradGuard no_grad;
    input = model->slice(0, begin)->forward(input);
  }
  return {model, model->slice(begin, end), input};
}

Tensor leaf_of(const Tensor& input) {
  Tensor leaf = input.detach();
  if (is_floating(leaf.dtype())) leaf.requires_grad_();
  return leaf;
}

Tensor output_grad(const Tensor& output, uint64_t seed) {
  Generator generator(seed);
  return randn(output.shape(), &generator);
}

// Every parameter of `got` has a gradient, bit for bit that of `want`'s same parameter.
void check_same_grads(const Sequential& want, const Sequential& got) {
  const auto w = want.named_parameters(), g = got.named_parameters();
  REQUIRE(w.size() == g.size());
  for (size_t i = 0; i < w.size(); ++i) {
    INFO(w[i].first);
    REQUIRE(g[i].second.grad().defined());
    CHECK(bitwise_equal(w[i].second.grad(), g[i].second.grad()));
  }
}

}  // namespace

TEST_CASE("B then W gives backward's gradients bit for bit", "[autograd]") {
  // A middle chunk (input gradients wanted), the first (token input: all of it is W) and the
  // last (final norm and vocabulary head).
  const std::pair<size_t, size_t> cuts[] = {{2, 4}, {0, 2}, {3, 7}};
  for (const auto& [begin, end] : cuts) {
    INFO("layers " << begin << " to " << end);
    Chunk reference = make_chunk(begin, end), split = make_chunk(begin, end);
    // Two microbatches, as a pipeline stage accumulates them: B0 B1 against I0 I1 W0 W1.
    std::vector<Tensor> reference_input_grads, split_input_grads;
    std::vector<DeferredGradients> deferred;
    for (uint64_t mb = 0; mb < 2; ++mb) {
      Tensor leaf = leaf_of(reference.input);
      Tensor out = reference.layers->forward(leaf);
      out.backward(output_grad(out, mb));
      reference_input_grads.push_back(leaf.grad());

      Tensor split_leaf = leaf_of(split.input);
      Tensor split_out = split.layers->forward(split_leaf);
      deferred.push_back(
          backward_inputs_first(split_out, output_grad(split_out, mb), {split_leaf}));
      split_input_grads.push_back(split_leaf.grad());
    }
    for (size_t mb = 0; mb < 2; ++mb) {
      CHECK(reference_input_grads[mb].defined() == split_input_grads[mb].defined());
      if (reference_input_grads[mb].defined()) {
        CHECK(bitwise_equal(reference_input_grads[mb], split_input_grads[mb]));
      }
    }
    // Nothing reached a parameter yet: the weight gradients are all deferred.
    for (const Tensor& p : split.layers->parameters()) CHECK_FALSE(p.grad().defined());
    for (DeferredGradients& d : deferred) {
      CHECK_FALSE(d.empty());
      d.run();
      CHECK(d.empty());
    }
    check_same_grads(*reference.layers, *split.layers);
  }
}

TEST_CASE("W still runs after the chunk's graph is dropped", "[autograd]") {
  Chunk reference = make_chunk(1, 3), chunk = make_chunk(1, 3);
  Tensor reference_out = reference.layers->forward(leaf_of(reference.input));
  reference_out.backward(output_grad(reference_out, 4));
  DeferredGradients deferred;
  {
    Tensor leaf = leaf_of(chunk.input);
    Tensor out = chunk.layers->forward(leaf);
    deferred = backward_inputs_first(out, output_grad(out, 4), {leaf});
  }
  deferred.run();
  check_same_grads(*reference.layers, *chunk.layers);
}

TEST_CASE("an input computed in the graph gets its gradient in B, its node's work in W",
          "[autograd]") {
  // A pipeline's first chunk: tokens need no gradient, so I stops at the embedding's output and
  // the embedding's weight gradients wait for W with every other weight gradient.
  Chunk reference = make_chunk(0, 3), split = make_chunk(0, 3);
  Tensor out = reference.layers->forward(reference.input);
  out.backward(output_grad(out, 9));

  Tensor embedded = (*split.layers)[0]->forward(split.input);
  Tensor split_out = split.layers->slice(1, split.layers->size())->forward(embedded);
  DeferredGradients deferred =
      backward_inputs_first(split_out, output_grad(split_out, 9), {embedded});
  for (const Tensor& p : split.layers->parameters()) CHECK_FALSE(p.grad().defined());
  deferred.run();
  check_same_grads(*reference.layers, *split.layers);
}

TEST_CASE(
    "AccumulationHook: each leaf is reported once per backward, after its gradient is added, in "
    "a whole backward and in a split one's W",
    "[autograd]") {
  Chunk chunk = make_chunk(1, 3);
  std::map<const AutogradMeta*, std::string> names;
  for (const auto& [name, p] : chunk.layers->named_parameters()) {
    names[p.impl().autograd.get()] = name;
  }
  const Tensor input = leaf_of(chunk.input);
  for (const bool split : {false, true}) {
    INFO((split ? "split" : "whole"));
    chunk.layers->zero_grad();
    const Tensor output = chunk.layers->forward(input);
    const Tensor grad = ones_like(output);
    std::map<std::string, int> reported;
    bool added_before = true;
    DeferredGradients deferred;
    {
      AccumulationHook hook([&](const AutogradMeta& leaf) {
        const auto named = names.find(&leaf);
        if (named == names.end()) return;  // the input leaf
        ++reported[named->second];
        added_before = added_before && leaf.grad && leaf.grad->defined();
      });
      if (split) {
        deferred = backward_inputs_first(output, grad, {input});
        CHECK(reported.empty());  // weight gradients are W's
        deferred.run();
      } else {
        output.backward(grad);
      }
    }
    CHECK(added_before);
    CHECK(reported.size() == names.size());
    for (const auto& [name, count] : reported) {
      INFO(name);
      CHECK(count == 1);
    }
  }
  // Outside the hook's lifetime nothing is reported.
  int after = 0;
  {
    AccumulationHook outer([&](const AutogradMeta&) { ++after; });
    {
      AccumulationHook inner([](const AutogradMeta&) {});
    }
    chunk.layers->forward(input).backward(ones_like(chunk.layers->forward(input)));
  }
  CHECK(after > 0);  // the outer hook is back once the inner one is gone
  const int seen = after;
  chunk.layers->forward(input).backward(ones_like(chunk.layers->forward(input)));
  CHECK(after == seen);
}
