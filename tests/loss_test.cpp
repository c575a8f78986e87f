#include <catch2/catch.hpp>
#include <cmath>

#include "loss/loss.h"
#include "pipit.h"

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

TEST_CASE("losses rebuild from their config", "[loss]") {
  CHECK(make_loss(CrossEntropyLoss(7).config())->config()["ignore_index"] == 7);
  CHECK(make_loss(MSELoss().config())->config()["type"] == "MSELoss");
  CHECK_THROWS_WITH(make_loss({{"type", "Hinge"}}), Catch::Contains("unknown loss type 'Hinge'"));
}
