#include <catch2/catch.hpp>
#include <cmath>

#include "optim/optimizer.h"
#include "pipit.h"

using namespace pipit;

namespace {
const std::vector<double> kStart = {0.5, -1.0, 2.0};
const std::vector<std::vector<double>> kGrads = {
    {0.1, 0.2, -0.3}, {-0.4, 0.0, 0.6}, {0.2, 0.2, 0.2}};

Tensor param() {
  return from_vector<double>(kStart).requires_grad_();
}
}  // namespace

TEST_CASE("SGD with momentum and weight decay follows torch.optim.SGD", "[optim]") {
  Tensor p = param();
  SGD sgd({{"p", p}}, {0.1, 0.9, 0.01});
  std::vector<double> ref = kStart, buf(3);
  for (size_t s = 0; s < kGrads.size(); ++s) {
    p.set_grad(from_vector<double>(kGrads[s]));
    sgd.step();
    for (size_t i = 0; i < 3; ++i) {
      double d = kGrads[s][i] + 0.01 * ref[i];
      buf[i] = s == 0 ? d : 0.9 * buf[i] + d;
      ref[i] -= 0.1 * buf[i];
    }
  }
  std::vector<double> got = p.to_vector<double>();
  for (size_t i = 0; i < 3; ++i) CHECK(got[i] == Approx(ref[i]).epsilon(1e-12));
}

TEST_CASE("AdamW follows torch.optim.AdamW", "[optim]") {
  Tensor p = param();
  AdamW adam({{"p", p}}, {0.01, 0.9, 0.999, 1e-8, 0.1});
  std::vector<double> ref = kStart, m(3), v(3);
  for (size_t s = 0; s < kGrads.size(); ++s) {
    p.set_grad(from_vector<double>(kGrads[s]));
    adam.step();
    const double t = static_cast<double>(s + 1);
    for (size_t i = 0; i < 3; ++i) {
      const double g = kGrads[s][i];
      ref[i] *= 1 - 0.01 * 0.1;
      m[i] = 0.9 * m[i] + 0.1 * g;
      v[i] = 0.999 * v[i] + 0.001 * g * g;
      const double m_hat = m[i] / (1 - std::pow(0.9, t)), v_hat = v[i] / (1 - std::pow(0.999, t));
      ref[i] -= 0.01 * m_hat / (std::sqrt(v_hat) + 1e-8);
    }
  }
  std::vector<double> got = p.to_vector<double>();
  for (size_t i = 0; i < 3; ++i) CHECK(got[i] == Approx(ref[i]).epsilon(1e-10));
}

TEST_CASE("optimizer state round trips: resuming equals never stopping", "[optim]") {
  for (const char* type : {"SGD", "AdamW"}) {
    INFO(type);
    nlohmann::json config = std::string(type) == "SGD"
                                ? nlohmann::json{{"type", "SGD"}, {"lr", 0.1}, {"momentum", 0.9}}
                                : nlohmann::json{{"type", "AdamW"}, {"lr", 0.01}};
    Tensor straight = param();
    auto a = make_optimizer(config, {{"p", straight}});
    Tensor resumed = param();
    auto b = make_optimizer(config, {{"p", resumed}});
    for (size_t s = 0; s < kGrads.size(); ++s) {
      straight.set_grad(from_vector<double>(kGrads[s]));
      a->step();
      if (s == 1) {
        StateDict saved = b->state_dict();
        b = make_optimizer(config, {{"p", resumed}});
        b->load_state_dict(saved);
      }
      resumed.set_grad(from_vector<double>(kGrads[s]));
      b->step();
    }
    CHECK(resumed.to_vector<double>() == straight.to_vector<double>());
    StateDict bad = b->state_dict();
    bad["q.exp_avg"] = zeros({1});
    CHECK_THROWS_AS(b->load_state_dict(bad), Error);
  }
  CHECK_THROWS_WITH(make_optimizer({{"type", "Adam"}}, {}),
                    Catch::Contains("unknown optimizer type 'Adam'"));
  CHECK_THROWS_WITH(make_optimizer({{"type", "SGD"}, {"lr", "fast"}}, {}),
                    Catch::Contains("\"lr\""));
  CHECK_THROWS_WITH(make_optimizer({{"type", "SGD"}, {"nesterov", true}}, {}),
                    Catch::Contains("nesterov"));
}

TEST_CASE("clip_grad_norm scales gradients to the limit", "[optim]") {
  Tensor a = from_vector<float>({0, 0}).requires_grad_(),
         b = from_vector<float>({0}).requires_grad_();
  a.set_grad(from_vector<float>({3, 0}));
  b.set_grad(from_vector<float>({4}));
  CHECK(clip_grad_norm({a, b}, 10.0) == Approx(5.0));
  CHECK(a.grad().to_vector<float>() == std::vector<float>{3, 0});
  CHECK(clip_grad_norm({a, b}, 1.0) == Approx(5.0));
  CHECK(a.grad().to_vector<float>()[0] == Approx(0.6).epsilon(1e-5));
  CHECK(b.grad().to_vector<float>()[0] == Approx(0.8).epsilon(1e-5));
}

TEST_CASE("CosineSchedule warms up then decays to min_lr", "[optim]") {
  CosineSchedule s(1.0, 0.1, 10, 110);
  CHECK(s.lr(0) == Approx(0.1));
  CHECK(s.lr(9) == Approx(1.0));
  CHECK(s.lr(10) == Approx(1.0));
  CHECK(s.lr(60) == Approx(0.55));
  CHECK(s.lr(110) == Approx(0.1));
  CHECK(s.lr(500) == Approx(0.1));
  CHECK_THROWS_AS(CosineSchedule(1.0, 0.1, 20, 10), Error);
}
