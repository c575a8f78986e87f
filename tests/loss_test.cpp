#include <catch2/catch.hpp>
#include <cmath>

#include "bitwise.h"
#include "loss/loss.h"
#include "pipit.h"
#include "tensor/backend.h"
#include "tensor/cpu/cpu_allocator.h"

using namespace pipit;

namespace {
// compute_gradient must equal autograd of compute_loss.
void check_gradient_matches_autograd(const Loss& loss, const Tensor& output, const Tensor& target) {
  Tensor leaf = output.detach().requires_grad_();
  loss.compute_loss(leaf, target).backward();
  std::vector<double> autograd = leaf.grad().to_vector<double>();
  std::vector<double> closed = loss.compute_gradient(output, target).to_vector<double>();
  REQUIRE(closed.size() == autograd.size());
  for (size_t i = 0; i < closed.size(); ++i) CHECK(closed[i] == Approx(autograd[i]).margin(1e-7));
}
}  // namespace

TEST_CASE("MSELoss values and gradient", "[loss]") {
  MSELoss loss;
  Tensor out = from_vector<float>({1, 2, 3, 4}, {2, 2});
  Tensor target = from_vector<float>({0, 2, 5, 3}, {2, 2});
  CHECK(loss.compute_loss(out, target).item<float>() == Approx((1 + 0 + 4 + 1) / 4.0));
  CHECK(loss.compute_gradient(out, target).to_vector<float>() ==
        std::vector<float>{0.5f, 0.0f, -1.0f, 0.5f});
  Generator g(1);
  check_gradient_matches_autograd(loss, randn({3, 5}, &g), randn({3, 5}, &g));
  CHECK_THROWS_WITH(loss.compute_loss(out, zeros({4})),
                    Catch::Contains("MSELoss") && Catch::Contains("[2, 2]"));
}

TEST_CASE("CrossEntropyLoss values and gradient", "[loss]") {
  CrossEntropyLoss loss;
  Tensor logits = from_vector<float>({0, 0, 0, 1, 2, 3}, {2, 3});
  Tensor targets = from_vector<int64_t>({0, 2});
  const double expected =
      (std::log(3.0) + (std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3.0)) / 2;
  CHECK(loss.compute_loss(logits, targets).item<double>() == Approx(expected));
  check_gradient_matches_autograd(loss, logits, targets);
  Generator g(2);
  Tensor logits3 = randn({2, 4, 6}, &g);
  Tensor targets3 = from_vector<int64_t>({0, 5, -100, 2, 3, -100, 1, 4}, {2, 4});
  check_gradient_matches_autograd(loss, logits3, targets3);
  CrossEntropyLoss ignore_three(3);
  check_gradient_matches_autograd(ignore_three, logits3,
                                  from_vector<int64_t>({0, 3, 3, 2, 3, 1, 1, 4}, {2, 4}));
  CHECK_THROWS_WITH(loss.compute_gradient(logits, from_vector<int64_t>({0, 7})),
                    Catch::Contains("target 7"));
  CHECK_THROWS_WITH(loss.compute_loss(logits, from_vector<int64_t>({0, 1, 2})),
                    Catch::Contains("do not match"));
}

TEST_CASE("cross_entropy's backward takes the softmax from the forward's row stats", "[loss]") {
  Generator g(3);
  const Tensor x = randn({5, 40}, &g) * 3.0;
  const Tensor targets = from_vector<int64_t>({0, 39, -100, 7, 7});
  const std::vector<float> xs = x.to_vector<float>();
  // Each row's max and sum of exp(x - max); (0, 0) where the row is ignored.
  Tensor losses = Tensor::empty({5}), stats = Tensor::empty({5, 2});
  backend(x).cross_entropy(x, targets, -100, losses, stats);
  const std::vector<float> st = stats.to_vector<float>();
  for (size_t i = 0; i < 5; ++i) {
    INFO("row " << i);
    if (i == 2) {
      CHECK((st[4] == 0 && st[5] == 0));
      continue;
    }
    float mx = xs[i * 40];
    for (size_t c = 0; c < 40; ++c) mx = std::max(mx, xs[i * 40 + c]);
    double sum = 0;
    for (size_t c = 0; c < 40; ++c) sum += std::exp(double(xs[i * 40 + c]) - mx);
    CHECK(st[2 * i] == mx);
    CHECK(st[2 * i + 1] == Approx(sum).epsilon(1e-6));
  }
  // A sum twice as large halves each softmax term: the backward computes from the stats given.
  const Tensor scale = scalar_tensor(0.5), halved = stats * from_vector<float>({1, 2}, {1, 2});
  Tensor grad = Tensor::empty({5, 40}), from_halved = Tensor::empty({5, 40});
  backend(x).cross_entropy_backward(x, targets, -100, scale, stats, grad);
  backend(x).cross_entropy_backward(x, targets, -100, scale, halved, from_halved);
  const std::vector<float> gs = grad.to_vector<float>(), hs = from_halved.to_vector<float>();
  for (size_t i = 0; i < gs.size(); ++i) {
    const bool target = static_cast<int64_t>(i % 40) == targets.to_vector<int64_t>()[i / 40];
    if (!target) CHECK(hs[i] == gs[i] / 2);
  }
  // Through autograd: logits shifted by ln 2 in place after the forward. Softmax ignores the
  // shift, so a backward that recomputed it would give the plain gradient; one that takes it
  // from the forward's stats sees every exp(x - max) doubled.
  Tensor plain = x.detach().requires_grad_(), shifted = x.clone().requires_grad_();
  cross_entropy(plain, targets).backward();
  Tensor loss = cross_entropy(shifted, targets);
  backend(shifted).copy(x + std::log(2.0), shifted);
  loss.backward();
  const std::vector<float> p = plain.grad().to_vector<float>(),
                           s = shifted.grad().to_vector<float>();
  for (size_t i = 0; i < p.size(); ++i) {
    const bool target = static_cast<int64_t>(i % 40) == targets.to_vector<int64_t>()[i / 40];
    if (!target) CHECK(s[i] == Approx(2 * p[i]).epsilon(1e-5).margin(1e-12));
  }
}

TEST_CASE(
    "cross_entropy's backward writes the gradient into the logits' memory when only it holds them",
    "[loss]") {
  Generator g(4);
  // A head [N, K] x [K, C] with 3 padded classes and an ignored row, f32 and bf16 logits.
  const int64_t N = 64, K = 16, C = 4099, classes = C - 3;
  std::vector<int64_t> t(N);
  for (int64_t i = 0; i < N; ++i) t[i] = i == 5 ? -100 : (i * 977) % classes;
  const Tensor targets = from_vector(t, {N});
  for (const DType dtype : {DType::f32, DType::bf16}) {
    INFO(dtype);
    const Tensor x = randn({N, K}, &g).to(dtype);
    struct Run {
      Tensor weight_grad;
      size_t peak;
      bool again_throws;
    };
    // The logits held by the caller (their memory stays theirs) or only by the loss's node.
    const auto run = [&](bool hold) {
      Generator same(5);
      const Tensor weight = randn({K, C}, &same).to(dtype).requires_grad_();
      const Tensor held_logits = hold ? matmul(x, weight) : Tensor();
      const Tensor loss =
          cross_entropy(hold ? held_logits : matmul(x, weight), targets, -100, classes);
      // The backward's own peak: the forward's (a half product's f32 sums) may be higher.
      reset_cpu_peak_memory();
      const size_t before = cpu_memory_stats().allocated;
      loss.backward();
      Run result{weight.grad().clone(), cpu_memory_stats().peak_allocated - before, false};
      try {
        loss.backward();
      } catch (const Error& e) {
        result.again_throws = true;
        CHECK_THAT(e.what(), Catch::Contains("a second time"));
      }
      return result;
    };
    const Run held = run(true), only_node = run(false);
    CHECK(testing::bitwise_equal(held.weight_grad, only_node.weight_grad));
    // The held logits can be differentiated again, as before; the others are gone.
    CHECK_FALSE(held.again_throws);
    CHECK(only_node.again_throws);
    // No second [N, C] tensor for the gradient.
    const size_t logits_bytes = static_cast<size_t>(N * C) * dtype_size(dtype);
    CHECK(held.peak >= only_node.peak + logits_bytes);
  }
}

TEST_CASE("losses rebuild from their config", "[loss]") {
  CHECK(make_loss(CrossEntropyLoss(7).config())->config()["ignore_index"] == 7);
  CHECK(make_loss(MSELoss().config())->config()["type"] == "MSELoss");
  CHECK_THROWS_WITH(make_loss({{"type", "Hinge"}}), Catch::Contains("unknown loss type 'Hinge'"));
}
