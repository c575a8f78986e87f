// conv2d and the pools: forward values against direct nested loops, gradients against finite
// differences, and the image layers in a Sequential that trains and round-trips its config.
#include <catch2/catch.hpp>
#include <limits>

#include "gradcheck.h"
#include "loss/loss.h"
#include "nn/conv.h"
#include "nn/layers.h"
#include "nn/registry.h"
#include "nn/sequential.h"
#include "optim/optimizer.h"

using namespace pipit;
using testing::check_gradients;
using testing::leaves;
using V = std::vector<Tensor>;

namespace {

// Reads x[n, c, h, w] of a contiguous f64 tensor, `outside` beyond its borders.
double at(const std::vector<double>& x, const Shape& s, int64_t n, int64_t c, int64_t h, int64_t w,
          double outside) {
  if (h < 0 || h >= s[2] || w < 0 || w >= s[3]) return outside;
  return x[static_cast<size_t>(((n * s[1] + c) * s[2] + h) * s[3] + w)];
}

std::vector<double> reference_conv(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                   Size2 stride, Size2 padding, Size2 dilation) {
  const Shape xs = x.shape(), ws = weight.shape();
  const std::vector<double> xv = x.to_vector<double>(), wv = weight.to_vector<double>();
  const int64_t OH = (xs[2] + 2 * padding.h - dilation.h * (ws[2] - 1) - 1) / stride.h + 1;
  const int64_t OW = (xs[3] + 2 * padding.w - dilation.w * (ws[3] - 1) - 1) / stride.w + 1;
  std::vector<double> out;
  for (int64_t n = 0; n < xs[0]; ++n)
    for (int64_t o = 0; o < ws[0]; ++o)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double total = bias.defined() ? bias.to_vector<double>()[static_cast<size_t>(o)] : 0.0;
          for (int64_t c = 0; c < xs[1]; ++c)
            for (int64_t i = 0; i < ws[2]; ++i)
              for (int64_t j = 0; j < ws[3]; ++j)
                total += wv[static_cast<size_t>(((o * ws[1] + c) * ws[2] + i) * ws[3] + j)] *
                         at(xv, xs, n, c, oh * stride.h - padding.h + i * dilation.h,
                            ow * stride.w - padding.w + j * dilation.w, 0.0);
          out.push_back(total);
        }
  return out;
}

std::vector<double> reference_pool(const Tensor& x, Size2 kernel, Size2 stride, Size2 padding,
                                   bool max) {
  const Shape xs = x.shape();
  const std::vector<double> xv = x.to_vector<double>();
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> out;
  for (int64_t n = 0; n < xs[0]; ++n)
    for (int64_t c = 0; c < xs[1]; ++c)
      for (int64_t oh = 0; oh < (xs[2] + 2 * padding.h - kernel.h) / stride.h + 1; ++oh)
        for (int64_t ow = 0; ow < (xs[3] + 2 * padding.w - kernel.w) / stride.w + 1; ++ow) {
          double result = max ? -inf : 0.0;
          for (int64_t i = 0; i < kernel.h; ++i)
            for (int64_t j = 0; j < kernel.w; ++j) {
              const double v = at(xv, xs, n, c, oh * stride.h - padding.h + i,
                                  ow * stride.w - padding.w + j, max ? -inf : 0.0);
              result =
                  max ? std::max(result, v) : result + v / static_cast<double>(kernel.h * kernel.w);
            }
          out.push_back(result);
        }
  return out;
}

void check_close(const Tensor& actual, const std::vector<double>& expected) {
  const std::vector<double> values = actual.to_vector<double>();
  REQUIRE(values.size() == expected.size());
  for (size_t i = 0; i < values.size(); ++i) CHECK(values[i] == Approx(expected[i]).margin(1e-12));
}

}  // namespace

TEST_CASE("conv2d matches a direct nested-loop convolution", "[conv]") {
  struct Case {
    Shape x, w;
    Size2 stride, padding, dilation;
  };
  for (const Case& c : {Case{{2, 3, 5, 5}, {4, 3, 3, 3}, 1, 0, 1},
                        Case{{1, 2, 7, 6}, {3, 2, 3, 2}, {2, 1}, {1, 0}, 1},
                        Case{{2, 1, 8, 8}, {2, 1, 3, 3}, 2, 1, 2}}) {
    auto v = leaves({c.x, c.w, {c.w[0]}}, 5);
    check_close(conv2d(v[0], v[1], v[2], c.stride, c.padding, c.dilation),
                reference_conv(v[0], v[1], v[2], c.stride, c.padding, c.dilation));
    check_close(conv2d(v[0], v[1], Tensor(), c.stride, c.padding, c.dilation),
                reference_conv(v[0], v[1], Tensor(), c.stride, c.padding, c.dilation));
  }
  // f32 follows the same path: compare with the f64 result.
  auto v = leaves({{2, 3, 6, 5}, {4, 3, 3, 2}, {4}}, 9);
  std::vector<double> expected = reference_conv(v[0], v[1], v[2], 2, 1, 1);
  std::vector<float> actual =
      conv2d(v[0].to(DType::f32), v[1].to(DType::f32), v[2].to(DType::f32), 2, 1)
          .to_vector<float>();
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < actual.size(); ++i) CHECK(actual[i] == Approx(expected[i]).margin(1e-4));
}

TEST_CASE("pools match direct nested loops", "[conv]") {
  auto v = leaves({{2, 3, 7, 6}}, 4);
  check_close(max_pool2d(v[0], 2, 2), reference_pool(v[0], 2, 2, 0, true));
  check_close(max_pool2d(v[0], {3, 2}, {2, 1}, {1, 1}),
              reference_pool(v[0], {3, 2}, {2, 1}, {1, 1}, true));
  check_close(avg_pool2d(v[0], 2, 2), reference_pool(v[0], 2, 2, 0, false));
  check_close(avg_pool2d(v[0], {3, 2}, {2, 1}, {1, 1}),
              reference_pool(v[0], {3, 2}, {2, 1}, {1, 1}, false));
}

TEST_CASE("conv2d gradients", "[conv][gradcheck]") {
  auto with_bias = leaves({{2, 3, 5, 4}, {4, 3, 3, 3}, {4}});
  check_gradients([](const V& v) { return conv2d(v[0], v[1], v[2]); }, with_bias);
  check_gradients([](const V& v) { return conv2d(v[0], v[1], v[2], 2, 1); }, with_bias);
  auto no_bias = leaves({{2, 2, 6, 5}, {3, 2, 3, 2}});
  check_gradients([](const V& v) { return conv2d(v[0], v[1], Tensor(), {2, 1}, {1, 0}); }, no_bias);
  check_gradients([](const V& v) { return conv2d(v[0], v[1], Tensor(), 1, 1, 2); }, no_bias);
  // A non-contiguous input goes through the same path.
  check_gradients([](const V& v) { return conv2d(transpose(v[0], 2, 3), v[1], Tensor(), 1, 1); },
                  leaves({{1, 2, 5, 6}, {2, 2, 2, 3}}));
}

TEST_CASE("pool gradients", "[conv][gradcheck]") {
  // Distinct values keep every maximum unique, so finite differences do not cross a tie.
  auto in = leaves({{2, 2, 6, 5}}, 3);
  check_gradients([](const V& v) { return max_pool2d(v[0], 2, 2); }, in);
  check_gradients([](const V& v) { return max_pool2d(v[0], {3, 2}, {2, 1}, {1, 1}); }, in);
  check_gradients([](const V& v) { return avg_pool2d(v[0], 2, 2); }, in);
  check_gradients([](const V& v) { return avg_pool2d(v[0], {3, 2}, {2, 1}, {1, 1}); }, in);
}

TEST_CASE("max_pool2d sends a tied window's gradient to its first maximum", "[conv]") {
  Tensor x = ones({1, 1, 2, 2}, {DType::f64}).requires_grad_();
  max_pool2d(x, 2, 2).backward(ones({1, 1, 1, 1}, {DType::f64}));
  CHECK(x.grad().to_vector<double>() == std::vector<double>{1, 0, 0, 0});
}

TEST_CASE("conv2d and pools name the op and shapes in their errors", "[conv]") {
  Tensor x = zeros({1, 3, 4, 4});
  CHECK_THROWS_WITH(conv2d(x, zeros({2, 4, 3, 3}), Tensor()),
                    Catch::Contains("conv2d: input of shape [1, 3, 4, 4] does not match weight of "
                                    "shape [2, 4, 3, 3]"));
  CHECK_THROWS_WITH(conv2d(zeros({3, 4, 4}), zeros({2, 3, 3, 3}), Tensor()),
                    Catch::Contains("conv2d: input must be [N, C, H, W], got [3, 4, 4]"));
  CHECK_THROWS_WITH(conv2d(x, zeros({2, 3, 3, 3}), zeros({3})),
                    Catch::Contains("conv2d: bias of shape [3]"));
  CHECK_THROWS_WITH(conv2d(x, zeros({2, 3, 5, 5}), Tensor()),
                    Catch::Contains("does not fit input"));
  CHECK_THROWS_WITH(max_pool2d(x, 2, 2, 2), Catch::Contains("max_pool2d: padding (2, 2)"));
  CHECK_THROWS_WITH(avg_pool2d(x, 2, 0), Catch::Contains("avg_pool2d: kernel"));
}

TEST_CASE("image layers rebuild from their configs", "[conv]") {
  Generator generator(3);
  auto model = std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Conv2d>(2, 4, Size2{3, 2}, 2, 1, true, &generator),
      std::make_shared<Conv2d>(4, 3, 3, 1, 0, false, &generator), std::make_shared<MaxPool2d>(2, 1),
      std::make_shared<AvgPool2d>(Size2{2, 1}, 1, Size2{1, 0}), std::make_shared<Flatten>()});
  auto rebuilt = build_module(model->config());
  CHECK(rebuilt->config() == model->config());
  rebuilt->load_state_dict(model->state_dict());
  Tensor x = randn({2, 2, 9, 8}, &generator);
  CHECK(rebuilt->forward(x).to_vector<float>() == model->forward(x).to_vector<float>());
  CHECK(model->state_dict().size() == 3);
  CHECK_THROWS_WITH(
      build_module({{"type", "MaxPool2d"}, {"kernel", 2}, {"stride", {2, 2}}, {"padding", {0, 0}}}),
      Catch::Contains("MaxPool2d field \"kernel\" must be [height, width]"));
}

TEST_CASE("a tiny CNN in a Sequential learns with SGD", "[conv]") {
  Generator generator(21);
  Sequential model({std::make_shared<Conv2d>(1, 4, 3, 1, 1, true, &generator),
                    std::make_shared<ReLU>(), std::make_shared<MaxPool2d>(2, 2),
                    std::make_shared<Flatten>(),
                    std::make_shared<Linear>(4 * 4 * 4, 2, true, &generator)});
  // Class 1 images carry a bright vertical bar, class 0 a horizontal one.
  const int64_t n = 16;
  std::vector<float> pixels(static_cast<size_t>(n * 64), 0.0f);
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t label = i % 2, line = (i / 2) % 8;
    for (int64_t k = 0; k < 8; ++k) {
      const int64_t pixel = label ? k * 8 + line : line * 8 + k;
      pixels[static_cast<size_t>(i * 64 + pixel)] = 1.0f;
    }
    labels.push_back(label);
  }
  Tensor x = from_vector(pixels, {n, 1, 8, 8}), y = from_vector(labels, {n});
  SGD optimizer(model.named_parameters(), {0.1, 0.9, 0.0});
  CrossEntropyLoss loss_fn;
  std::vector<double> losses;
  for (int step = 0; step < 20; ++step) {
    optimizer.zero_grad();
    Tensor loss = loss_fn.compute_loss(model.forward(x), y);
    losses.push_back(loss.item<double>());
    loss.backward();
    optimizer.step();
  }
  CHECK(losses.back() < 0.5 * losses.front());
}
