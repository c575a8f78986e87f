// Half tensors (bf16, f16): elementwise ops, reductions, dropout and the cross-entropy compute
// on them in f32 and round each result once, on the CPU and on CUDA; mixed floating dtypes
// promote to the wider one inside the graph.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>

#include "bitwise.h"
#include "cuda_testing.h"
#include "loss/loss.h"
#include "pipit.h"

using namespace pipit;
using testing::bitwise_equal;
using namespace testing::cuda_testing;

namespace {

const std::vector<DType> kHalves = {DType::bf16, DType::f16};

// Random values that `dtype` holds exactly.
Tensor half_random(const Shape& shape, DType dtype, Generator& g, double low = -3,
                   double high = 3) {
  return uniform(shape, low, high, &g).to(dtype);
}

// A kernel run on `device` with the inputs there, returning its outputs.
using HalfKernel = std::function<std::vector<Tensor>(Device, const std::vector<Tensor>&)>;

// The kernel on the half inputs must give the bits of the same kernel on the inputs widened
// to f32, rounded once to each output's dtype.
void check_rounded_once(const std::string& what, const std::vector<Tensor>& inputs,
                        const HalfKernel& kernel) {
  INFO(what);
  std::vector<Tensor> wide;
  for (const Tensor& t : inputs) wide.push_back(t.to(DType::f32));
  const std::vector<Tensor> got = kernel(kCpu, inputs), want = kernel(kCpu, wide);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("output " << i);
    CHECK(bitwise_equal(got[i], want[i].to(got[i].dtype())));
  }
}

// CUDA against the CPU on the same half inputs: equal up to one step of the output's dtype,
// where f32 results a few f32 ulps apart round to neighbours.
void check_cuda_matches_cpu(const std::string& what, const std::vector<Tensor>& inputs,
                            const HalfKernel& kernel) {
  INFO(what);
  std::vector<Tensor> on_gpu;
  for (const Tensor& t : inputs) on_gpu.push_back(t.to(kCuda));
  const std::vector<Tensor> want = kernel(kCpu, inputs), got = kernel(kCuda, on_gpu);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("output " << i);
    REQUIRE(got[i].dtype() == want[i].dtype());
    const double step = got[i].dtype() == DType::bf16  ? 1.0 / 128
                        : got[i].dtype() == DType::f16 ? 1.0 / 1024
                                                       : 1e-6;
    const std::vector<double> g = got[i].to_vector<double>(), w = want[i].to_vector<double>();
    size_t bad = 0;
    for (size_t j = 0; j < g.size(); ++j) {
      if (!(std::abs(g[j] - w[j]) <= step * std::max(1.0, std::abs(w[j])))) ++bad;
    }
    CHECK(bad == 0);
  }
}

std::vector<Tensor> run_unary(UnaryOp op, DType out_dtype, Device d,
                              const std::vector<Tensor>& in) {
  const Tensor x = transpose(in[0], 0, 1);  // a strided input
  Tensor out = poisoned(x.shape(), out_dtype, d);
  backend(d).unary(op, x, out);
  return {out};
}

std::vector<Tensor> run_binary(BinaryOp op, DType out_dtype, Device d,
                               const std::vector<Tensor>& in) {
  const Shape shape = {4, 3, 5};
  Tensor out = poisoned(shape, out_dtype, d);
  backend(d).binary(op, expand(in[0], shape), expand(in[1], shape), out);
  return {out};
}

bool is_comparison_op(BinaryOp op) {
  return op == BinaryOp::eq || op == BinaryOp::ne || op == BinaryOp::lt || op == BinaryOp::le ||
         op == BinaryOp::gt || op == BinaryOp::ge;
}

// Every elementwise op and reduction on half inputs, handed to `check`.
void for_each_half_kernel(const std::function<void(const std::string&, const std::vector<Tensor>&,
                                                   const HalfKernel&)>& check) {
  Generator g(31);
  for (DType dt : kHalves) {
    const std::string name = dtype_name(dt);
    for (UnaryOp op : {UnaryOp::neg, UnaryOp::exp, UnaryOp::log, UnaryOp::sqrt, UnaryOp::abs,
                       UnaryOp::tanh, UnaryOp::sigmoid, UnaryOp::relu, UnaryOp::gelu}) {
      const bool positive = op == UnaryOp::log || op == UnaryOp::sqrt;
      check(name + " " + op_name(op), {half_random({6, 33}, dt, g, positive ? 0.1 : -3, 3)},
            [op](Device d, const std::vector<Tensor>& in) {
              return run_unary(op, in[0].dtype(), d, in);
            });
    }
    for (BinaryOp op : {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div, BinaryOp::pow,
                        BinaryOp::maximum, BinaryOp::minimum, BinaryOp::relu_backward,
                        BinaryOp::gelu_backward, BinaryOp::tanh_backward,
                        BinaryOp::sigmoid_backward, BinaryOp::eq, BinaryOp::lt, BinaryOp::ge}) {
      // The second operand broadcast along the outer dims, then along the innermost one,
      // where the two operands' rows step differently.
      for (const Shape& second : {Shape{3, 5}, Shape{3, 1}}) {
        check(name + " " + op_name(op) + " with " + shape_str(second),
              {half_random({4, 1, 5}, dt, g, 0.5, 3), half_random(second, dt, g, 0.5, 3)},
              [op](Device d, const std::vector<Tensor>& in) {
                return run_binary(op, is_comparison_op(op) ? DType::b8 : in[0].dtype(), d, in);
              });
      }
    }
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
      check(name + " reduce " + op_name(op), {half_random({300, 7}, dt, g)},
            [op](Device d, const std::vector<Tensor>& in) {
              Tensor columns = poisoned({1, 7}, in[0].dtype(), d);
              Tensor rows = poisoned({300, 1}, in[0].dtype(), d);
              const int64_t dim0[] = {0}, dim1[] = {1};
              backend(d).reduce(op, in[0], dim0, columns);
              backend(d).reduce(op, in[0], dim1, rows);
              return std::vector<Tensor>{columns, rows};
            });
    }
    check(name + " argmax", {half_random({9, 70}, dt, g)},
          [](Device d, const std::vector<Tensor>& in) {
            Tensor out = poisoned({9}, DType::i64, d);
            backend(d).argmax(in[0], 1, out);
            return std::vector<Tensor>{out};
          });
  }
}

// Dropout on half tensors: the f32 draws, the scale rounded into the mask, and the input times
// that mask rounded once.
std::vector<Tensor> run_dropout(Device d, const Tensor& x) {
  Generator draws(5);
  Tensor out = poisoned(x.shape(), x.dtype(), d), mask = poisoned(x.shape(), x.dtype(), d);
  backend(d).dropout(x, draws, 0.3, out, mask);
  return {out, mask};
}

// The loss and the gradient of a mean cross-entropy over [N, C] logits, one row ignored.
std::vector<Tensor> run_cross_entropy(const Tensor& logits_in, const Tensor& targets) {
  Tensor logits = logits_in.detach().requires_grad_();
  Tensor loss = cross_entropy(logits, targets, 2);
  loss.backward();
  return {loss.detach(), logits.grad()};
}

Tensor ce_targets(int64_t rows, int64_t classes) {
  std::vector<int64_t> t;
  for (int64_t i = 0; i < rows; ++i) t.push_back((i * 13 + 5) % classes);
  t[1] = 2;  // the ignored class
  return from_vector(t, {rows});
}

}  // namespace

TEST_CASE("half tensors: elementwise ops and reductions compute in f32 and round once", "[half]") {
  for_each_half_kernel(check_rounded_once);
}

TEST_CASE("bf16 GELU and its gradient by table give the computed bits for every bf16 value",
          "[half]") {
  // The CPU looks bf16 GELU up in a table built by the f32 row kernels: every input, NaNs and
  // infinities included, against GELU computed in f32 on the widened input and rounded once;
  // the gradient with random bf16 gradients, also through a strided (transposed) view.
  std::vector<float> every(1 << 16);
  for (uint32_t bits = 0; bits < every.size(); ++bits) {
    every[bits] = bfloat16_to_float(static_cast<uint16_t>(bits));
  }
  Generator g(33);
  const Tensor x = from_vector(every, {256, 256}).to(DType::bf16);
  const Tensor grad = uniform({256, 256}, -3, 3, &g).to(DType::bf16);
  Backend& cpu = backend(Device::cpu());
  for (const bool strided : {false, true}) {
    INFO((strided ? "strided" : "contiguous"));
    const Tensor in = strided ? transpose(x, 0, 1) : x;
    const Tensor got = Tensor::empty({256, 256}, DType::bf16), want = Tensor::empty({256, 256});
    cpu.unary(UnaryOp::gelu, in, got);
    cpu.unary(UnaryOp::gelu, in.to(DType::f32), want);
    CHECK(bitwise_equal(got, want.to(DType::bf16)));
    cpu.binary(BinaryOp::gelu_backward, grad, in, got);
    cpu.binary(BinaryOp::gelu_backward, grad.to(DType::f32), in.to(DType::f32), want);
    CHECK(bitwise_equal(got, want.to(DType::bf16)));
  }
}

TEST_CASE("half tensors: dropout keeps f32's draws and rounds the scaled input once", "[half]") {
  Generator g(32);
  for (DType dt : kHalves) {
    INFO(dt);
    const Tensor x = half_random({50, 40}, dt, g);
    const std::vector<Tensor> half = run_dropout(kCpu, x),
                              wide = run_dropout(kCpu, x.to(DType::f32));
    CHECK(bitwise_equal(half[1], wide[1].to(dt)));  // the same elements kept
    CHECK(bitwise_equal(half[0], (x.to(DType::f32) * half[1].to(DType::f32)).to(dt)));
  }
}

TEST_CASE("half tensors: cross-entropy reads half logits, returns an f32 loss, half gradients",
          "[half]") {
  Generator g(33);
  const Tensor targets = ce_targets(6, 37);
  for (DType dt : kHalves) {
    INFO(dt);
    const Tensor logits = half_random({6, 37}, dt, g, -6, 6);
    const std::vector<Tensor> half = run_cross_entropy(logits, targets);
    const std::vector<Tensor> wide = run_cross_entropy(logits.to(DType::f32), targets);
    CHECK(half[0].dtype() == DType::f32);
    CHECK(bitwise_equal(half[0], wide[0]));
    CHECK(half[1].dtype() == dt);
    CHECK(bitwise_equal(half[1], wide[1].to(dt)));
    CrossEntropyLoss loss(2);
    CHECK(bitwise_equal(loss.compute_gradient(logits, targets), half[1]));
  }
}

TEST_CASE("mixed floating dtypes promote to the wider one, gradients in each input's dtype",
          "[half]") {
  Generator g(34);
  const Tensor wide = uniform({3, 4}, -2, 2, &g).requires_grad_();
  const Tensor half = half_random({4}, DType::bf16, g).requires_grad_();
  const Tensor grad = uniform({3, 4}, -2, 2, &g);
  Tensor sum_out = wide + half;
  CHECK(sum_out.dtype() == DType::f32);
  CHECK(bitwise_equal(sum_out, wide.detach() + half.detach().to(DType::f32)));
  Tensor product = half * wide;
  CHECK(product.dtype() == DType::f32);
  sum(sum_out * grad).backward();
  CHECK(wide.grad().dtype() == DType::f32);
  CHECK(bitwise_equal(wide.grad(), grad));
  CHECK(half.grad().dtype() == DType::bf16);
  CHECK(bitwise_equal(half.grad(), sum(grad, {0}).to(DType::bf16)));
  // f16 with bf16 meet in f32; f64 wins over both; integers still refuse to mix.
  CHECK((half + half_random({4}, DType::f16, g)).dtype() == DType::f32);
  CHECK((half + uniform({4}, 0, 1, &g, {DType::f64})).dtype() == DType::f64);
  CHECK_THROWS_WITH(wide + zeros({4}, {DType::i64}), Catch::Contains("dtypes differ"));
}

TEST_CASE("cuda: half elementwise ops, reductions, dropout and cross-entropy match the CPU",
          "[cuda][half]") {
  if (!cuda_ready()) return;
  for_each_half_kernel(check_cuda_matches_cpu);
  Generator g(35);
  for (DType dt : kHalves) {
    check_cuda_matches_cpu(
        std::string("dropout ") + dtype_name(dt), {half_random({50, 40}, dt, g)},
        [](Device d, const std::vector<Tensor>& in) { return run_dropout(d, in[0]); });
    // 1000 classes are read 16 bytes at a time, 1003 one at a time.
    for (const int64_t classes : {1000, 1003}) {
      const Tensor targets = ce_targets(6, classes);
      check_cuda_matches_cpu(std::string("cross-entropy ") + dtype_name(dt),
                             {half_random({6, classes}, dt, g, -6, 6)},
                             [&](Device d, const std::vector<Tensor>& in) {
                               return run_cross_entropy(in[0], targets.to(d));
                             });
    }
  }
}
