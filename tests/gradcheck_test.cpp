// Finite-difference checks of every differentiable op, in f64, including broadcasting and
// non-contiguous (transposed, sliced, expanded) inputs.
#include <numeric>
#include <thread>

#include "autograd/node.h"
#include "gradcheck.h"

using namespace pipit;
using testing::check_gradients;
using testing::leaves;
using V = std::vector<Tensor>;

TEST_CASE("binary ops with broadcasting", "[gradcheck]") {
  auto in = leaves({{2, 3, 4}, {3, 1}});
  check_gradients([](const V& v) { return v[0] + v[1]; }, in);
  check_gradients([](const V& v) { return v[0] - v[1]; }, in);
  check_gradients([](const V& v) { return v[0] * v[1]; }, in);
  check_gradients([](const V& v) { return v[0] / (v[1] * v[1] + 1.0); }, in);
  check_gradients([](const V& v) { return maximum(v[0], v[1]); }, in);
  check_gradients([](const V& v) { return minimum(v[0], v[1]); }, in);
  auto row = leaves({{2, 3, 4}, {4}});
  check_gradients([](const V& v) { return v[0] * v[1] - v[1]; }, row);
  check_gradients([](const V& v) { return 2.0 - v[0] / 3.0 + 1.5 * v[1]; }, row);
}

TEST_CASE("pow with tensor and scalar exponents", "[gradcheck]") {
  auto in = leaves({{3, 4}, {4}}, 3);
  check_gradients([](const V& v) { return pow(v[0] * v[0] + 0.5, v[1]); }, in);
  check_gradients([](const V& v) { return pow(abs(v[0]) + 0.5, 2.5); }, in);
}

TEST_CASE("unary ops", "[gradcheck]") {
  auto in = leaves({{3, 5}});
  check_gradients([](const V& v) { return neg(v[0]); }, in);
  check_gradients([](const V& v) { return exp(v[0]); }, in);
  check_gradients([](const V& v) { return log(v[0] * v[0] + 0.1); }, in);
  check_gradients([](const V& v) { return sqrt(v[0] * v[0] + 0.1); }, in);
  check_gradients([](const V& v) { return abs(v[0]); }, in);
  check_gradients([](const V& v) { return tanh(v[0]); }, in);
  check_gradients([](const V& v) { return sigmoid(v[0]); }, in);
  check_gradients([](const V& v) { return relu(v[0]); }, in);
  check_gradients([](const V& v) { return gelu(v[0]); }, in);
}

TEST_CASE("elementwise ops on non-contiguous inputs", "[gradcheck]") {
  auto in = leaves({{4, 3}, {3, 4}});
  check_gradients([](const V& v) { return transpose(v[0], 0, 1) * v[1]; }, in);
  check_gradients([](const V& v) { return gelu(slice(v[1], 1, 0, 4, 2)) + 1.0; }, in);
  check_gradients([](const V& v) { return exp(transpose(v[0], 0, 1)) - v[1]; }, in);
}

TEST_CASE("where and masked_fill", "[gradcheck]") {
  auto in = leaves({{3, 4}, {4}});
  check_gradients([](const V& v) { return where(gt(v[0], v[1].detach()), v[0], v[1]); }, in);
  check_gradients(
      [](const V& v) {
        return masked_fill(v[0] * 2.0, lt(v[0].detach(), scalar_like(v[0], 0.0)), 3.0);
      },
      in);
}

TEST_CASE("reductions", "[gradcheck]") {
  auto in = leaves({{2, 3, 4}});
  for (bool keepdim : {false, true}) {
    check_gradients([=](const V& v) { return sum(v[0], {1}, keepdim); }, in);
    check_gradients([=](const V& v) { return sum(v[0], {0, 2}, keepdim); }, in);
    check_gradients([=](const V& v) { return mean(v[0], {-1}, keepdim); }, in);
    check_gradients([=](const V& v) { return max(v[0], {1}, keepdim); }, in);
    check_gradients([=](const V& v) { return min(v[0], {0, 2}, keepdim); }, in);
    check_gradients([=](const V& v) { return var(v[0], {2}, keepdim); }, in);
  }
  check_gradients([](const V& v) { return sum(v[0]); }, in);
  check_gradients([](const V& v) { return var(transpose(v[0], 0, 2), {0, 1}); }, in);
}

TEST_CASE("matmul and linear", "[gradcheck]") {
  check_gradients([](const V& v) { return matmul(v[0], v[1]); }, leaves({{3, 4}, {4, 5}}));
  check_gradients([](const V& v) { return matmul(v[0], transpose(v[1], 0, 1)); },
                  leaves({{3, 4}, {5, 4}}));
  check_gradients([](const V& v) { return matmul(v[0], v[1]); }, leaves({{2, 3, 4}, {2, 4, 2}}));
  check_gradients([](const V& v) { return matmul(v[0], v[1]); }, leaves({{2, 2, 3, 4}, {4, 2}}));
  check_gradients([](const V& v) { return matmul(v[0], v[1]); }, leaves({{2, 1, 3, 4}, {3, 4, 2}}));
  check_gradients([](const V& v) { return matmul(transpose(v[0], -1, -2), v[1]); },
                  leaves({{2, 4, 3}, {2, 4, 2}}));
  check_gradients([](const V& v) { return linear(v[0], v[1], v[2]); },
                  leaves({{2, 3, 4}, {5, 4}, {5}}));
  check_gradients([](const V& v) { return linear(v[0], v[1], Tensor()); },
                  leaves({{3, 4}, {5, 4}}));
}

TEST_CASE("shape ops and views", "[gradcheck]") {
  auto in = leaves({{2, 3, 4}});
  check_gradients([](const V& v) { return reshape(v[0], {6, 4}) * 2.0; }, in);
  check_gradients([](const V& v) { return view(v[0], {4, -1}) * 2.0; }, in);
  check_gradients([](const V& v) { return flatten(v[0], 1) * 2.0; }, in);
  check_gradients([](const V& v) { return reshape(transpose(v[0], 0, 2), {4, 6}) * 1.5; }, in);
  check_gradients([](const V& v) { return permute(v[0], {2, 0, 1}) * 3.0; }, in);
  check_gradients([](const V& v) { return narrow(v[0], 1, 1, 2) * 2.0; }, in);
  check_gradients([](const V& v) { return slice(v[0], 2, 0, 4, 3) * 2.0; }, in);
  check_gradients([](const V& v) { return expand(narrow(v[0], 0, 0, 1), {3, 3, 4}) * 2.0; }, in);
  check_gradients([](const V& v) { return unsqueeze(squeeze(narrow(v[0], 0, 1, 1), 0), 1) * 2.0; },
                  in);
  check_gradients([](const V& v) { return transpose(v[0], 0, 1).contiguous() * 2.0; }, in);
  check_gradients([](const V& v) { return v[0].clone() * v[0]; }, in);
  auto two = leaves({{2, 3}, {2, 3}, {1, 3}});
  check_gradients([](const V& v) { return cat({v[0], v[2], v[1]}, 0); }, two);
  check_gradients([](const V& v) { return stack({v[0], v[1]}, 1); }, two);
  check_gradients([](const V& v) { return split(v[0], 2, 1)[1] * chunk(v[1], 2, 1)[1]; }, two);
}

TEST_CASE("softmax, log_softmax and layer_norm", "[gradcheck]") {
  auto in = leaves({{2, 3, 4}});
  check_gradients([](const V& v) { return softmax(v[0], -1); }, in);
  check_gradients([](const V& v) { return softmax(v[0], 1); }, in);
  check_gradients([](const V& v) { return log_softmax(v[0], 0); }, in);
  check_gradients([](const V& v) { return softmax(transpose(v[0], 1, 2), -1); }, in);
  auto scores = leaves({{2, 3, 5, 5}});
  check_gradients([](const V& v) { return causal_softmax(v[0], 0.7); }, scores);
  check_gradients([](const V& v) { return causal_softmax(transpose(v[0], 2, 3), 1.3); }, scores);
  auto ln = leaves({{2, 3, 5}, {5}, {5}});
  check_gradients([](const V& v) { return layer_norm(v[0], v[1], v[2]); }, ln);
  check_gradients([](const V& v) { return layer_norm(transpose(v[0], 0, 1), v[1], v[2]); }, ln);
}

TEST_CASE("embedding and cross_entropy", "[gradcheck]") {
  Tensor indices = from_vector<int64_t>({1, 3, 1, 0, 3, 3}, {2, 3});
  check_gradients([&](const V& v) { return embedding(v[0], indices); }, leaves({{4, 5}}));
  Tensor targets = from_vector<int64_t>({2, 0, 4, 1}, {4});
  check_gradients([&](const V& v) { return cross_entropy(v[0], targets); }, leaves({{4, 5}}));
  Tensor targets3 = from_vector<int64_t>({2, -100, 4, 1, 0, 3}, {2, 3});
  check_gradients([&](const V& v) { return cross_entropy(v[0], targets3); }, leaves({{2, 3, 5}}));
}

TEST_CASE("dropout with a fixed generator", "[gradcheck]") {
  auto in = leaves({{4, 6}});
  check_gradients(
      [](const V& v) {
        Generator generator(5);  // the same mask on every evaluation
        return dropout(v[0], 0.3, true, &generator);
      },
      in);
}

TEST_CASE("fused dropout keeps exactly where the generator's uniform draws reach p",
          "[gradcheck]") {
  for (DType dtype : {DType::f32, DType::f64}) {
    INFO(dtype);
    Generator data(6);
    // Transposed, so the kernel sees a copy made contiguous in row-major order.
    Tensor x = transpose(randn({7, 9}, &data, {dtype}), 0, 1);
    Generator g1(8), g2(8);
    const Tensor out = dropout(x, 0.4, true, &g1);
    const Tensor keep = ge(rand(x.shape(), &g2, {dtype}), scalar_like(x, 0.4));
    const Tensor want = x * (keep.to(dtype) * (1.0 / 0.6));
    CHECK(out.to_vector<double>() == want.to_vector<double>());
    CHECK(g1.offset() == g2.offset());
    const std::vector<double> kept = keep.to(DType::f64).to_vector<double>();
    const double fraction = std::accumulate(kept.begin(), kept.end(), 0.0) / 63.0;
    CHECK(fraction > 0.3);
    CHECK(fraction < 0.9);
  }
  CHECK_THROWS_WITH(dropout(from_vector<int64_t>({1, 2}), 0.5, true), Catch::Contains("I64"));
}

TEST_CASE("autograd engine semantics", "[gradcheck][autograd]") {
  Tensor x = from_vector<double>({1, 2, 3}).requires_grad_();
  SECTION("a value used twice accumulates both paths") {
    sum(x * x + x).backward();
    CHECK(x.grad().to_vector<double>() == std::vector<double>{3, 5, 7});
  }
  SECTION("gradients accumulate across backward calls until zero_grad") {
    sum(x * 2.0).backward();
    sum(x * 2.0).backward();
    CHECK(x.grad().to_vector<double>() == std::vector<double>{4, 4, 4});
    x.zero_grad();
    CHECK_FALSE(x.grad().defined());
  }
  SECTION("backward(grad) on a non-scalar output") {
    (x * 3.0).backward(from_vector<double>({1, 10, 100}));
    CHECK(x.grad().to_vector<double>() == std::vector<double>{3, 30, 300});
  }
  SECTION("detach cuts the graph") {
    Tensor y = (x * 2.0).detach();
    CHECK_FALSE(y.requires_grad());
    CHECK_THROWS_WITH(sum(y).backward(), Catch::Contains("does not require grad"));
  }
  SECTION("NoGradGuard records nothing, and only on its own thread") {
    {
      NoGradGuard no_grad;
      CHECK_FALSE((x * 2.0).requires_grad());
      bool other_thread_records = false;
      std::thread([&] { other_thread_records = (x * 2.0).requires_grad(); }).join();
      CHECK(other_thread_records);
    }
    CHECK((x * 2.0).requires_grad());
  }
  SECTION("a dtype conversion passes the gradient back in the input's dtype") {
    sum(x.to(DType::f32) * 2.0).backward();
    CHECK(x.grad().dtype() == DType::f64);
    CHECK(x.grad().to_vector<double>() == std::vector<double>{2, 2, 2});
  }
  SECTION("backward without a gradient needs one element") {
    CHECK_THROWS_WITH((x * 2.0).backward(), Catch::Contains("backward(grad)"));
  }
}

namespace {

// Passes `grad` back to its one input; keeps a handle to it when `keep` (as a node holding a
// saved tensor would), else lets go of it as it returns it.
struct HandsOver : Node {
  Tensor grad;
  bool keep = false;
  std::vector<Tensor> apply(const Tensor&) override {
    Tensor out = grad;
    if (!keep) grad = Tensor();
    return {out};
  }
  std::string name() const override { return "HandsOver"; }
};

// w's gradient after a backward through a HandsOver node that passes `given`.
Tensor gradient_handed_over(Tensor given, bool keep) {
  Tensor w = zeros({4}, {DType::f64}).requires_grad_();
  Tensor out = zeros({1}, {DType::f64});
  auto node = detail::make_node<HandsOver>(out, {w});
  node->grad = std::move(given);
  node->keep = keep;
  node.reset();
  out.backward(ones({1}, {DType::f64}));
  return w.grad();
}

}  // namespace

TEST_CASE("a leaf takes its first gradient without a copy only when nothing else holds it",
          "[autograd]") {
  const std::vector<double> values{1, 2, 3, 4};
  SECTION("a fresh gradient is taken as it is") {
    Tensor fresh = from_vector(values);
    const void* address = fresh.raw_data();
    const Tensor grad = gradient_handed_over(std::move(fresh), false);
    CHECK(grad.raw_data() == address);
    CHECK(grad.to_vector<double>() == values);
  }
  SECTION("a gradient another node holds is copied, so writing one leaves the other") {
    const Tensor held = from_vector(values);
    const Tensor grad = gradient_handed_over(held, true);
    CHECK(grad.raw_data() != held.raw_data());
    backend(held).fill(held, 0.0);
    CHECK(grad.to_vector<double>() == values);
  }
  SECTION("a view of larger memory is copied, so the rest is not kept alive") {
    const Tensor grad =
        gradient_handed_over(narrow(from_vector<double>({0, 1, 2, 3, 4}), 0, 1, 4), false);
    CHECK(grad.storage()->nbytes() == 4 * sizeof(double));
    CHECK(grad.to_vector<double>() == values);
  }
  SECTION("the second gradient adds into the first") {
    Tensor w = from_vector(values).requires_grad_();
    sum(w * 2.0).backward();
    sum(w * 3.0).backward();
    CHECK(w.grad().to_vector<double>() == std::vector<double>{5, 5, 5, 5});
  }
}
