// Convolution (cuDNN) and pooling (pipit's kernels) on CUDA against the CPU backend: the raw
// Backend ops on fresh random inputs with poisoned outputs, conv2d's gradients through
// autograd, and a small CNN trained for a few SGD steps on both devices. Without a CUDA device
// (or without CUDA in the build) each test reports "skipped" through a Catch2 warning.
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "cuda_testing.h"
#include "loss/loss.h"
#include "nn/conv.h"
#include "nn/layers.h"
#include "nn/sequential.h"
#include "optim/optimizer.h"
#include "pipit.h"

using namespace pipit;
using namespace testing::cuda_testing;

namespace {

// |got - want| <= tol * max|want| everywhere. cuDNN's algorithms sum in their own order, so an
// element's error scales with the magnitudes summed into it, which max|want| bounds, not with
// the element itself (a sum that cancels to near zero keeps the rounding of its terms).
void check_close_to_max(const Tensor& got, const Tensor& want, double tol,
                        const std::string& what) {
  INFO(what);
  REQUIRE(got.device() == kCuda);
  REQUIRE(got.shape() == want.shape());
  const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  double scale = 0;
  for (double v : w) scale = std::max(scale, std::abs(v));
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    // !(<=) so that NaN counts as a mismatch.
    if (!(std::abs(g[i] - w[i]) <= tol * scale) && bad++ == 0) first = i;
  }
  INFO("first of " << bad << " mismatches at " << first << ": got " << (g.empty() ? 0 : g[first])
                   << ", want " << (w.empty() ? 0 : w[first]));
  CHECK(bad == 0);
}

// The output shape of a convolution or pool of x with kernel (kh, kw), `channels` deep.
Shape output_shape(const Shape& x, int64_t channels, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                   int64_t ph, int64_t pw, int64_t dh = 1, int64_t dw = 1) {
  return {x[0], channels, (x[2] + 2 * ph - dh * (kh - 1) - 1) / sh + 1,
          (x[3] + 2 * pw - dw * (kw - 1) - 1) / sw + 1};
}

struct ConvCase {
  Shape x, w;
  Conv2dGeometry g;
};

// x, weight, {stride h, w, padding h, w, dilation h, w}.
const std::vector<ConvCase> kConvCases = {
    {{2, 3, 9, 8}, {4, 3, 3, 3}, {1, 1, 0, 0, 1, 1}},
    {{2, 3, 9, 8}, {5, 3, 3, 3}, {2, 2, 1, 1, 1, 1}},       // stride 2, padding
    {{1, 2, 11, 7}, {3, 2, 2, 4}, {2, 1, 1, 2, 2, 1}},      // non-square, dilation
    {{3, 4, 10, 12}, {2, 4, 3, 1}, {1, 3, 0, 0, 1, 2}},     // 3x1 kernel, w-dilation
    {{4, 16, 20, 20}, {32, 16, 3, 3}, {1, 1, 1, 1, 1, 1}},  // wide enough for GEMM algos
    {{2, 8, 17, 15}, {8, 8, 5, 5}, {2, 2, 2, 2, 1, 1}}};    // 5x5, stride 2

}  // namespace

TEST_CASE("cuda: conv2d and its gradients through cuDNN match the CPU", "[cuda][conv]") {
  if (!cuda_ready()) return;
  Generator gen(11);
  for (DType dt : {DType::f32, DType::f64}) {
    for (const ConvCase& c : kConvCases) {
      const Conv2dGeometry& g = c.g;
      const Shape y_shape = output_shape(c.x, c.w[0], c.w[2], c.w[3], g.stride_h, g.stride_w,
                                         g.pad_h, g.pad_w, g.dilation_h, g.dilation_w);
      const Tensor x = random(c.x, dt, gen), w = random(c.w, dt, gen);
      const Tensor gy = random(y_shape, dt, gen);
      auto run = [&](Device d) {
        const Tensor xd = x.to(d), wd = w.to(d), gyd = gy.to(d);
        Tensor y = poisoned(y_shape, dt, d), gx = poisoned(c.x, dt, d), gw = poisoned(c.w, dt, d);
        backend(d).conv2d(xd, wd, g, y);
        backend(d).conv2d_backward_input(gyd, wd, g, gx);
        backend(d).conv2d_backward_weight(gyd, xd, g, gw);
        return std::vector<Tensor>{y, gx, gw};
      };
      const std::vector<Tensor> want = run(kCpu), got = run(kCuda);
      const std::string what = "x " + shape_str(c.x) + " w " + shape_str(c.w);
      check_close_to_max(got[0], want[0], tol_for(dt), what + ": conv2d");
      check_close_to_max(got[1], want[1], tol_for(dt), what + ": grad input");
      check_close_to_max(got[2], want[2], tol_for(dt), what + ": grad weight");
    }
  }
}

TEST_CASE("cuda: conv2d through autograd, with bias and a strided input", "[cuda][conv]") {
  if (!cuda_ready()) return;
  Generator gen(12);
  for (DType dt : {DType::f32, DType::f64}) {
    // Stored [N, C, W, H] and transposed: a non-contiguous input.
    const Tensor x = random({2, 3, 7, 9}, dt, gen), w = random({4, 3, 3, 2}, dt, gen);
    const Tensor b = random({4}, dt, gen), gy = random({2, 4, 5, 5}, dt, gen);
    auto run = [&](Device d) {
      // to() on the tensor's own device returns the tensor itself: detach() makes a fresh leaf,
      // so the CPU run leaves x, w and b as they were for the CUDA run.
      Tensor xd = x.to(d).detach().requires_grad_(), wd = w.to(d).detach().requires_grad_();
      Tensor bd = b.to(d).detach().requires_grad_();
      Tensor y = conv2d(transpose(xd, 2, 3), wd, bd, {2, 1}, {1, 0}, {1, 2});
      y.backward(gy.to(d));
      return std::vector<Tensor>{y.detach(), xd.grad(), wd.grad(), bd.grad()};
    };
    const std::vector<Tensor> want = run(kCpu), got = run(kCuda);
    const char* names[] = {"output", "grad input", "grad weight", "grad bias"};
    for (size_t i = 0; i < want.size(); ++i)
      check_close_to_max(got[i], want[i], tol_for(dt), names[i]);
  }
}

TEST_CASE("cuda: max and average pooling match the CPU", "[cuda][conv]") {
  if (!cuda_ready()) return;
  Generator gen(13);
  const std::vector<Pool2dGeometry> windows = {{2, 2, 2, 2, 0, 0},   // disjoint
                                               {3, 3, 1, 1, 1, 1},   // overlapping, padded
                                               {3, 2, 2, 1, 1, 1},   // non-square
                                               {2, 4, 1, 3, 0, 2}};  // wide, padded in w
  for (DType dt : {DType::f32, DType::f64}) {
    // Integers in [-2, 2]: most windows hold ties, so "first maximum" is exercised.
    std::vector<double> values = random({2, 3, 9, 10}, DType::f64, gen).to_vector<double>();
    for (double& v : values) v = std::round(v);
    const Tensor x = from_vector(values, {2, 3, 9, 10}).to(dt);
    for (const Pool2dGeometry& p : windows) {
      const Shape y_shape = output_shape(x.shape(), 3, p.kernel_h, p.kernel_w, p.stride_h,
                                         p.stride_w, p.pad_h, p.pad_w);
      const Tensor gy = random(y_shape, dt, gen);
      auto run = [&](Device d) {
        const Tensor xd = x.to(d), gyd = gy.to(d);
        Tensor max_y = poisoned(y_shape, dt, d), argmax = poisoned(y_shape, DType::i64, d);
        Tensor max_gx = poisoned(x.shape(), dt, d);
        Tensor avg_y = poisoned(y_shape, dt, d), avg_gx = poisoned(x.shape(), dt, d);
        backend(d).max_pool2d(xd, p, max_y, argmax);
        backend(d).max_pool2d_backward(gyd, argmax, p, max_gx);
        backend(d).avg_pool2d(xd, p, avg_y);
        backend(d).avg_pool2d_backward(gyd, p, avg_gx);
        return std::vector<Tensor>{max_y, argmax, max_gx, avg_y, avg_gx};
      };
      const std::vector<Tensor> want = run(kCpu), got = run(kCuda);
      const std::string what = "window " + std::to_string(p.kernel_h) + "x" +
                               std::to_string(p.kernel_w) + " stride " +
                               std::to_string(p.stride_h) + "," + std::to_string(p.stride_w);
      // Max pooling picks and sums the same elements in the same order: exact.
      check_close_to_max(got[0], want[0], 0, what + ": max_pool2d");
      CHECK(got[1].to_vector<int64_t>() == want[1].to_vector<int64_t>());
      check_close_to_max(got[2], want[2], 0, what + ": max_pool2d backward");
      check_close_to_max(got[3], want[3], tol_for(dt), what + ": avg_pool2d");
      check_close_to_max(got[4], want[4], tol_for(dt), what + ": avg_pool2d backward");
    }
  }
}

TEST_CASE("cuda: a small CNN trains for a few SGD steps as on the CPU", "[cuda][conv]") {
  if (!cuda_ready()) return;
  auto build = [] {
    Generator gen(14);
    return std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
        std::make_shared<Conv2d>(2, 6, 3, 1, 1, true, &gen), std::make_shared<ReLU>(),
        std::make_shared<MaxPool2d>(2, 2),
        std::make_shared<Conv2d>(6, 4, Size2{3, 2}, 2, 1, false, &gen),
        std::make_shared<AvgPool2d>(2, 1, 1), std::make_shared<Flatten>(),
        std::make_shared<Linear>(4 * 4 * 5, 3, true, &gen)});
  };
  Generator data(15);
  const Tensor x = random({8, 2, 12, 12}, DType::f32, data);
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < 8; ++i) labels.push_back(i % 3);
  const Tensor y = from_vector(labels, {8});
  auto train = [&](Device d) {
    auto model = build();
    model->to(d);
    SGD optimizer(model->named_parameters(), {0.05, 0.9, 1e-4});
    CrossEntropyLoss loss_fn;
    const Tensor xd = x.to(d), yd = y.to(d);
    std::vector<double> losses;
    for (int step = 0; step < 5; ++step) {
      optimizer.zero_grad();
      Tensor loss = loss_fn.compute_loss(model->forward(xd), yd);
      losses.push_back(loss.item<double>());
      loss.backward();
      optimizer.step();
    }
    return std::pair{losses, model->parameters()};
  };
  const auto [cpu_losses, cpu_params] = train(kCpu);
  const auto [gpu_losses, gpu_params] = train(kCuda);
  for (size_t s = 0; s < cpu_losses.size(); ++s) {
    CHECK(gpu_losses[s] == Approx(cpu_losses[s]).epsilon(1e-4));
  }
  REQUIRE(gpu_params.size() == cpu_params.size());
  for (size_t i = 0; i < cpu_params.size(); ++i) {
    check_close_to_max(gpu_params[i].detach(), cpu_params[i].detach(), 1e-4,
                       "parameter " + std::to_string(i));
  }
}
