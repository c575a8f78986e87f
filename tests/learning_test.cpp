// End-to-end learning: the models, losses and optimizers together actually learn.
#include <catch2/catch.hpp>

#include "loss/loss.h"
#include "nn/builders.h"
#include "optim/optimizer.h"
#include "pipit.h"

using namespace pipit;

TEST_CASE("an MLP fits two interleaved spirals above 95% accuracy", "[learning]") {
  Generator generator(11);
  const int64_t n = 400;
  std::vector<float> points;
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t label = i % 2;
    const double r = 0.2 + 2.0 * static_cast<double>(i / 2) / (n / 2);
    const double angle = 2.5 * r + M_PI * static_cast<double>(label);
    points.push_back(static_cast<float>(r * std::cos(angle) +
                                        0.05 * (generator.uniform(generator.reserve(1)) - 0.5)));
    points.push_back(static_cast<float>(r * std::sin(angle)));
    labels.push_back(label);
  }
  Tensor x = from_vector(points, {n, 2}), y = from_vector(labels, {n});
  auto model = mlp({2, 64, 64, 2}, "tanh", &generator);
  AdamW optimizer(model->named_parameters(), {0.01, 0.9, 0.999, 1e-8, 0.0});
  CrossEntropyLoss loss_fn;
  for (int step = 0; step < 400; ++step) {
    optimizer.zero_grad();
    loss_fn.compute_loss(model->forward(x), y).backward();
    optimizer.step();
  }
  NoGradGuard no_grad;
  std::vector<int64_t> predicted = argmax(model->forward(x), 1).to_vector<int64_t>();
  int64_t correct = 0;
  for (int64_t i = 0; i < n; ++i)
    correct += predicted[static_cast<size_t>(i)] == labels[static_cast<size_t>(i)];
  CHECK(static_cast<double>(correct) / n > 0.95);
}

TEST_CASE("a tiny GPT memorises a repeated text", "[learning]") {
  const std::string text = "pipit trains in stages. ";
  std::vector<int64_t> ids;
  for (int r = 0; r < 4; ++r) {
    for (char c : text) ids.push_back(static_cast<unsigned char>(c) % 32);
  }
  const int64_t T = 16, B = 8;
  std::vector<int64_t> x, y;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      x.push_back(ids[static_cast<size_t>(b * 3 + t)]);
      y.push_back(ids[static_cast<size_t>(b * 3 + t + 1)]);
    }
  }
  Tensor inputs = from_vector(x, {B, T}), targets = from_vector(y, {B, T});
  Generator generator(5);
  auto model = gpt({32, T, 2, 2, 32, 0.0}, &generator);
  AdamW optimizer(model->named_parameters(), {0.01, 0.9, 0.99, 1e-8, 0.0});
  CrossEntropyLoss loss_fn;
  double first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    optimizer.zero_grad();
    Tensor loss = loss_fn.compute_loss(model->forward(inputs), targets);
    loss.backward();
    optimizer.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  CHECK(first > 2.5);
  CHECK(last < 0.1);
}
