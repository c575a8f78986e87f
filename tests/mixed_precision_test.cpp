// Mixed precision on the CPU: autocast rounds matmul operands, keeps f32 accumulation and
// returns half activations, the grad scaler unscales and skips overflowing steps, and a pipeline
// trains in bf16 and f16.
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "f16_overflow.h"
#include "graph_names.h"
#include "loss/loss.h"
#include "nn/builders.h"
#include "nn/transformer.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "pipeline/pipeline.h"
#include "pipeline/remote/stage_package.h"
#include "pipit.h"

using namespace pipit;

namespace {

// t rounded to `dtype` and back: the operand autocast multiplies.
Tensor rounded(const Tensor& t, DType dtype) {
  return t.detach().to(dtype).to(DType::f32);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

double max_abs(const Tensor& a) {
  double worst = 0;
  for (double v : a.to_vector<double>()) worst = std::max(worst, std::abs(v));
  return worst;
}

// Deterministic token inputs [batch, context] and next-token-like targets.
std::pair<Tensor, Tensor> token_batch(int64_t vocab, int64_t batch, int64_t context) {
  std::vector<int64_t> x, y;
  for (int64_t i = 0; i < batch * context; ++i) {
    x.push_back((i * 7) % vocab);
    y.push_back((i * 7 + 3) % vocab);
  }
  return {from_vector(x, {batch, context}), from_vector(y, {batch, context})};
}

Tensor mse_loss(const Tensor& out, const Tensor& target) {
  Tensor d = out - target;
  return sum(d * d) * (1.0 / static_cast<double>(d.numel()));
}

// Within 1e-6 of the largest magnitude: the same products, summed by possibly other BLAS
// kernels (a transposed operand may be packed differently).
void check_same_products(const Tensor& got, const Tensor& want) {
  CHECK(got.dtype() == DType::f32);
  CHECK(max_abs_diff(got, want) <= 1e-6 * std::max(1.0, max_abs(want)));
}

// A half result: the f32 product `want` rounded once to got's dtype. Sums that other BLAS
// kernels order differently may round to the neighbouring half value, so one step of the
// dtype (2^-8 relative for bf16, 2^-11 for f16) is allowed; an unrounded or twice-rounded
// result that drifts further fails.
void check_rounded_product(const Tensor& got, const Tensor& want, DType half) {
  CHECK(got.dtype() == half);
  const double step = half == DType::bf16 ? 1.0 / 256 : 1.0 / 2048;
  const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  REQUIRE(g.size() == w.size());
  const std::vector<double> r = rounded(want, half).to_vector<double>();
  size_t exact = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    CHECK(std::abs(g[i] - w[i]) <= step * std::max(1.0, std::abs(w[i])));
    exact += g[i] == r[i];
  }
  CHECK(exact * 10 >= g.size() * 9);  // nearly all exactly the rounded f32 product
}

}  // namespace

TEST_CASE("autocast matmul multiplies rounded operands with f32 accumulation, returns half",
          "[autocast]") {
  for (DType half : {DType::bf16, DType::f16}) {
    INFO("autocast dtype " << half);
    Generator g(11);
    // Batched with a broadcast right operand, the shape attention and Linear produce.
    Tensor a = randn({2, 5, 7}, &g).requires_grad_();
    Tensor b = randn({7, 3}, &g).requires_grad_();
    Tensor grad = randn({2, 5, 3}, &g);
    Tensor out;
    {
      AutocastGuard autocast(half);
      out = matmul(a, b);
    }
    out.backward(grad.to(half));
    const Tensor a_r = rounded(a, half), b_r = rounded(b, half), g_r = rounded(grad, half);
    check_rounded_product(out, matmul(a_r, b_r), half);
    // The f32 inputs' gradients come from the f32 sums, not rounded to half.
    check_same_products(a.grad(), matmul(g_r, transpose(b_r, 0, 1)));
    check_same_products(b.grad(), sum(matmul(transpose(a_r, 1, 2), g_r), {0}));
  }
}

TEST_CASE("autocast takes half activations as they are and gives their gradients in half",
          "[autocast]") {
  Generator g(15);
  Tensor x = randn({4, 6}, &g).to(DType::bf16).requires_grad_();
  Tensor w = randn({5, 6}, &g).requires_grad_();
  Tensor grad = randn({4, 5}, &g);
  Tensor out;
  {
    AutocastGuard autocast(DType::bf16);
    out = linear(x, w, Tensor());
  }
  CHECK(out.dtype() == DType::bf16);
  out.backward(grad.to(DType::bf16));
  const Tensor g_r = rounded(grad, DType::bf16), w_r = rounded(w, DType::bf16);
  check_rounded_product(x.grad(), matmul(g_r, w_r), DType::bf16);
  check_same_products(w.grad(), matmul(transpose(g_r, 0, 1), x.detach().to(DType::f32)));
  // Without autocast, mixing dtypes is an error naming both.
  CHECK_THROWS_WITH(linear(x, w, Tensor()), Catch::Contains("dtypes differ (BF16 and F32)"));
  CHECK_THROWS_WITH(matmul(w, x.detach().to(DType::f64)), Catch::Contains("dtypes differ"));
}

TEST_CASE("autocast linear rounds input, weight and bias, returns half, f32 gradients",
          "[autocast]") {
  Generator g(12);
  Tensor x = randn({4, 6}, &g).requires_grad_();
  Tensor w = randn({5, 6}, &g).requires_grad_();
  Tensor bias = randn({5}, &g).requires_grad_();
  Tensor grad = randn({4, 5}, &g);
  Tensor out;
  {
    AutocastGuard autocast(DType::bf16);
    out = linear(x, w, bias);
  }
  out.backward(grad.to(DType::bf16));
  const Tensor x_r = rounded(x, DType::bf16), w_r = rounded(w, DType::bf16);
  const Tensor g_r = rounded(grad, DType::bf16);
  // The bias joins the output in bf16, as torch's autocast casts it.
  check_rounded_product(out, matmul(x_r, transpose(w_r, 0, 1)) + rounded(bias, DType::bf16),
                        DType::bf16);
  check_same_products(x.grad(), matmul(g_r, w_r));
  check_same_products(w.grad(), matmul(transpose(g_r, 0, 1), x_r));
  // The bias gradient: the bf16 gradient's rows summed in f32 and kept so, read in the same pass
  // as the weight gradient (matmul_bias_grad), not rounded to bf16 on the way.
  CHECK(bias.grad().dtype() == DType::f32);
  CHECK(max_abs_diff(bias.grad(), sum(g_r, {0})) == 0);
  CHECK(max_abs_diff(bias.grad(), rounded(sum(g_r, {0}), DType::bf16)) > 0);
}

TEST_CASE("a residual reads half activations as they are, with the bits of a cast then an add",
          "[autocast]") {
  for (DType half : {DType::bf16, DType::f16}) {
    INFO("half dtype " << half);
    Generator g(16);
    // A residual [2, 3, 8] meeting a sublayer's half output, and a broadcast half bias.
    for (const Shape& b_shape : {Shape{2, 3, 8}, Shape{8}}) {
      Tensor a = randn({2, 3, 8}, &g).requires_grad_();
      Tensor b = randn(b_shape, &g).to(half).requires_grad_();
      const Tensor grad = randn({2, 3, 8}, &g);
      Tensor out = a + b;
      CHECK(out.dtype() == DType::f32);
      CHECK(max_abs_diff(out, a.detach() + b.detach().to(DType::f32)) == 0);
      CHECK(max_abs_diff(b + a, out) == 0);
      out.backward(grad);
      CHECK(max_abs_diff(a.grad(), grad) == 0);
      // The half operand's gradient: the f32 one reduced to its shape, then rounded.
      CHECK(b.grad().dtype() == half);
      CHECK(max_abs_diff(b.grad(), sum_to(grad, b_shape).to(half)) == 0);
    }
  }
  // In a transformer block under autocast nothing is cast inside the graph: the layer norms'
  // results come out in bf16 for their products, and the residual adds read the sublayers' bf16
  // outputs as they are (a cast's CopyBackward would show each).
  Generator g(18);
  TransformerBlock block(16, 2, 0.0, &g);
  Tensor y;
  {
    AutocastGuard autocast(DType::bf16);
    y = block.forward(randn({2, 5, 16}, &g).requires_grad_());
  }
  CHECK(y.dtype() == DType::f32);
  const std::multiset<std::string> names = testing::node_names(y);
  CHECK(names.count("LayerNormBackward") == 2);
  CHECK(names.count("CopyBackward") == 0);
  // The backends take no other mix: mul of f32 and bf16 is refused, naming the dtypes.
  const Tensor f = ones({3}), h = ones({3}).to(DType::bf16);
  CHECK_THROWS_WITH(backend(f).binary(BinaryOp::mul, f, h, Tensor::empty({3}, DType::f32)),
                    Catch::Contains("mul: operands of dtypes F32 and BF16"));
  CHECK(max_abs_diff(f * h, full({3}, 1.0)) == 0);  // autograd's mul casts first
}

TEST_CASE("layer_norm_for_products rounds its result once to autocast's dtype, as a cast would",
          "[autocast]") {
  for (DType half : {DType::bf16, DType::f16}) {
    INFO("autocast dtype " << half);
    Generator g(17);
    const Tensor x0 = randn({3, 4, 16}, &g) * 3.0, w0 = randn({16}, &g), b0 = randn({16}, &g);
    const Tensor grad = randn({3, 4, 16}, &g).to(half);
    auto leaves = [&] {
      return std::vector<Tensor>{x0.detach().requires_grad_(), w0.detach().requires_grad_(),
                                 b0.detach().requires_grad_()};
    };
    // The written-out way: an f32 layer norm, then the cast a product would make.
    std::vector<Tensor> want = leaves();
    const Tensor f32_out = layer_norm(want[0], want[1], want[2]);
    f32_out.to(half).backward(grad);
    std::vector<Tensor> got = leaves();
    Tensor out;
    {
      AutocastGuard autocast(half);
      out = layer_norm_for_products(got[0], got[1], got[2]);
      CHECK(layer_norm(got[0], got[1], got[2]).dtype() == DType::f32);  // torch's autocast's
    }
    CHECK(out.dtype() == half);
    CHECK(max_abs_diff(out, f32_out.to(half)) == 0);
    out.backward(grad);
    for (size_t i = 0; i < got.size(); ++i) {
      CHECK(got[i].grad().dtype() == DType::f32);
      CHECK(max_abs_diff(got[i].grad(), want[i].grad()) == 0);
    }
    // Outside autocast it is layer_norm.
    CHECK(layer_norm_for_products(x0, w0, b0).dtype() == DType::f32);
    CHECK(max_abs_diff(layer_norm_for_products(x0, w0, b0), f32_out) == 0);
  }
}

TEST_CASE("autocast leaves f64 alone, nests and rejects other dtypes", "[autocast]") {
  Generator g(13);
  Tensor a = randn({3, 4}, &g, {DType::f64}), b = randn({4, 2}, &g, {DType::f64});
  const Tensor plain = matmul(a, b);
  CHECK(autocast_dtype() == DType::f32);
  {
    AutocastGuard outer(DType::bf16);
    CHECK(max_abs_diff(matmul(a, b), plain) == 0);
    {
      AutocastGuard inner(DType::f32);
      CHECK(autocast_dtype() == DType::f32);
    }
    CHECK(autocast_dtype() == DType::bf16);
  }
  CHECK(autocast_dtype() == DType::f32);
  CHECK_THROWS_WITH(AutocastGuard(DType::i64), Catch::Contains("I64"));
}

TEST_CASE("a GPT trains under bf16 autocast about as it does in f32", "[autocast]") {
  GptConfig config{13, 8, 2, 2, 16, 0.0};
  // Named variables, not structured bindings: clang 14 cannot capture those in a lambda.
  const auto batch = token_batch(13, 8, 8);
  const Tensor input = batch.first, target = batch.second;
  auto train = [&](DType dtype) {
    Generator g(14);
    auto model = gpt(config, &g);
    AdamW optimizer(model->named_parameters(), {.lr = 0.01});
    std::vector<double> losses;
    for (int step = 0; step < 30; ++step) {
      optimizer.zero_grad();
      AutocastGuard autocast(dtype);
      Tensor loss = cross_entropy(model->forward(input), target);
      loss.backward();
      optimizer.step();
      losses.push_back(loss.item<double>());
    }
    return losses;
  };
  const std::vector<double> full = train(DType::f32), mixed = train(DType::bf16);
  // Measured with bf16 activations between the products (2026-11-27, OpenBLAS with oneDNN for
  // small products): 4.8e-5 apart on the first step, 4.8e-4 after 30 steps, from a loss of
  // 2.59 down to 0.118. The bounds allow three to four times that, for other kernels'
  // summation orders. (With f32 activations the gaps were 5.3e-5 and 2e-4, and bf16
  // conversions that truncated went to 2.2e-4 and 2.1e-3.)
  CHECK(mixed.front() != full.front());
  CHECK(std::abs(mixed.front() - full.front()) < 2e-4);
  CHECK(mixed.back() < 0.5 * mixed.front());
  CHECK(std::abs(mixed.back() - full.back()) < 1.5e-3);
}

TEST_CASE("the grad scaler unscales, skips overflowing steps and adapts its scale", "[autocast]") {
  auto make = [] {
    Generator g(15);
    return mlp({3, 4, 2}, "tanh", &g);
  };
  Generator data(16);
  const Tensor x = randn({5, 3}, &data), y = randn({5, 2}, &data);
  auto plain_model = make(), scaled_model = make();
  SGD plain(plain_model->named_parameters(), {.lr = 0.1});
  SGD scaled(scaled_model->named_parameters(), {.lr = 0.1});
  GradScaler scaler({.init_scale = 1024, .growth_interval = 2});

  // A power of two scales without rounding (far from overflow and underflow): the scaled loss
  // and every gradient are exactly 1024 times the plain ones, and the update exactly the plain
  // one.
  const Tensor plain_loss = mse_loss(plain_model->forward(x), y);
  const Tensor scaled_loss = scaler.scale(mse_loss(scaled_model->forward(x), y));
  CHECK(scaled_loss.item<double>() == 1024 * plain_loss.item<double>());
  plain_loss.backward();
  scaled_loss.backward();
  const auto plain_parameters = plain_model->named_parameters();
  const auto scaled_parameters = scaled_model->named_parameters();
  for (size_t i = 0; i < plain_parameters.size(); ++i) {
    INFO(plain_parameters[i].first);
    CHECK(max_abs_diff(scaled_parameters[i].second.grad(),
                       plain_parameters[i].second.grad() * 1024.0) == 0);
  }
  plain.step();
  CHECK(scaler.step(scaled));
  scaler.update();
  const auto want = plain_model->state_dict();
  for (const auto& [name, value] : scaled_model->state_dict()) {
    INFO(name);
    CHECK(max_abs_diff(value, want.at(name)) == 0);
  }

  // An overflowed gradient: no update, the scale backs off.
  scaled.zero_grad();
  scaler.scale(mse_loss(scaled_model->forward(x), y)).backward();
  Tensor first = scaled_model->named_parameters()[0].second;
  Tensor bad = first.grad().clone();
  backend(bad).fill(bad, std::numeric_limits<double>::infinity());
  first.set_grad(bad);
  const Tensor before = first.detach().clone();
  CHECK_FALSE(scaler.step(scaled));
  scaler.update();
  CHECK(max_abs_diff(first, before) == 0);
  CHECK(scaler.get_scale() == 512);

  // Two clean steps in a row double it.
  for (int i = 0; i < 2; ++i) {
    scaled.zero_grad();
    scaler.scale(mse_loss(scaled_model->forward(x), y)).backward();
    CHECK(scaler.step(scaled));
    scaler.update();
  }
  CHECK(scaler.get_scale() == 1024);
  CHECK_THROWS_WITH(GradScaler({.init_scale = 0}), Catch::Contains("init_scale"));
}

namespace {

// Forwards every op to the CPU backend, counting the copies that round a parameter (an f32
// leaf that requires grad) to bf16: autocast's weight casts.
class WeightCastCounter final : public Backend {
 public:
  std::atomic<int> weight_casts{0};
  Device device() const override { return cpu_.device(); }
  std::shared_ptr<Storage> allocate(size_t nbytes) override { return cpu_.allocate(nbytes); }
#define PIPIT_ARGUMENTS(...) __VA_ARGS__
#define PIPIT_COUNTED_OP(name, params, args) \
  void name params override {                \
    seen(#name, PIPIT_ARGUMENTS args);       \
    cpu_.name args;                          \
  }
  PIPIT_BACKEND_OPS(PIPIT_COUNTED_OP)
#undef PIPIT_COUNTED_OP
#undef PIPIT_ARGUMENTS

 private:
  template <typename... Args>
  void seen(const char*, const Args&...) {}
  void seen(const char* op, const Tensor& src, const Tensor& dst) {
    if (std::strcmp(op, "copy") == 0 && src.dtype() == DType::f32 && dst.dtype() == DType::bf16 &&
        src.requires_grad() && src.is_leaf()) {
      ++weight_casts;
    }
  }
  Backend& cpu_ = backend(Device::cpu());
};

}  // namespace

TEST_CASE("a bf16 pipeline rounds each weight once a step, however many microbatches",
          "[autocast]") {
  const GptConfig config{11, 6, 4, 2, 16, 0.0};
  // Named variables, not structured bindings: clang 14 cannot capture those in a lambda.
  const auto batch = token_batch(11, 8, 6);
  const Tensor& input = batch.first;
  const Tensor& target = batch.second;
  auto casts_in_one_step = [&](int microbatches, const char* recompute) {
    Generator g(19);
    PipelineConfig pipeline_config;
    pipeline_config.stages = 2;
    pipeline_config.microbatches = microbatches;
    pipeline_config.recompute = recompute;
    pipeline_config.dtype = "bf16";
    Pipeline pipeline(gpt(config, &g), pipeline_config);
    pipeline.train_step(input, target);  // the first step builds what the stages keep
    WeightCastCounter counter;
    REQUIRE(set_backend_override(Device::cpu(), &counter) == nullptr);
    pipeline.train_step(input, target);
    set_backend_override(Device::cpu(), nullptr);
    return counter.weight_casts.load();
  };
  // Each Linear's weight and bias, rounded for its products: 4 layers x 4 Linears, and the head.
  const int per_step = 2 * (4 * 4 + 1);
  CHECK(casts_in_one_step(1, "none") == per_step);
  CHECK(casts_in_one_step(4, "none") == per_step);
  CHECK(casts_in_one_step(4, "full") == per_step);
}

TEST_CASE("a bf16 pipeline equals bf16 autocast accumulation on one thread", "[autocast]") {
  GptConfig config{11, 6, 4, 2, 16, 0.0};
  const auto [input, target] = token_batch(11, 8, 6);
  const nlohmann::json adamw = {{"type", "AdamW"}, {"lr", 0.01}};
  Generator g1(17), g2(17);
  auto reference = gpt(config, &g1), piped = gpt(config, &g2);

  auto optimizer = make_optimizer(adamw, reference->named_parameters());
  std::vector<double> want;
  for (int step = 0; step < 3; ++step) {
    optimizer->zero_grad();
    AutocastGuard autocast(DType::bf16);
    double total = 0;
    for (int i = 0; i < 4; ++i) {
      Tensor out = reference->forward(narrow(input, 0, i * 2, 2));
      Tensor t = narrow(target, 0, i * 2, 2);
      total += cross_entropy(out, t).item<double>();
      CrossEntropyLoss loss;
      out.backward(loss.compute_gradient(out, t) * 0.25);
    }
    optimizer->step();
    want.push_back(total / 4);
  }

  PipelineConfig pipeline_config;
  pipeline_config.stages = 2;
  pipeline_config.microbatches = 4;
  pipeline_config.optimizer = adamw;
  pipeline_config.dtype = "bf16";
  Pipeline pipeline(piped, pipeline_config);
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step);
    CHECK(pipeline.train_step(input, target) == want[static_cast<size_t>(step)]);
  }
  const auto expected = reference->state_dict();
  for (const auto& [name, value] : piped->state_dict()) {
    INFO(name);
    CHECK(max_abs_diff(value, expected.at(name)) == 0);
  }
}

TEST_CASE("an f16 pipeline scales the loss, skips overflowing steps and backs off", "[autocast]") {
  const nlohmann::json sgd = {{"type", "SGD"}, {"lr", 1e-6}};
  // Named variables, not structured bindings: clang 14 cannot capture those in a lambda.
  const testing::F16Overflow overflow = testing::f16_overflow(sgd);
  const auto& model = overflow.model;
  const Tensor& input = overflow.input;
  const Tensor& target = overflow.target;
  const PipelineConfig& config = overflow.config;
  // The first update that is not skipped, from plain gradients: the same model's f16 autocast
  // backward on one thread, each microbatch's loss gradient weighted 1/2 and never scaled.
  // The pipeline scales it by 64 and unscales the gradients: powers of two, so exactly.
  const auto reference = testing::f16_overflow(sgd).model;
  {
    auto optimizer = make_optimizer(sgd, reference->named_parameters());
    const auto loss = make_loss(config.loss);
    AutocastGuard autocast(DType::f16);
    for (int i = 0; i < 2; ++i) {
      Tensor out = reference->forward(narrow(input, 0, i * 4, 4));
      out.backward(loss->compute_gradient(out, narrow(target, 0, i * 4, 4)) * 0.5);
    }
    optimizer->step();
  }

  Pipeline pipeline(model, config);
  StateDict initial;  // copies: a state dict shares the parameters' storage
  for (const auto& [name, value] : model->state_dict()) initial[name] = value.clone();
  auto unchanged = [&] {
    for (const auto& [name, value] : model->state_dict()) {
      if (max_abs_diff(value, initial.at(name)) != 0) return false;
    }
    return true;
  };
  double scale = 65536;
  int step = 0;
  for (; step < 30; ++step) {
    pipeline.train_step(input, target);
    const StepStats& stats = pipeline.coordinator().last_step();
    INFO("step " << step);
    CHECK(stats.loss_scale == scale);
    if (!stats.skipped) break;
    CHECK(unchanged());
    scale /= 2;
  }
  CHECK(step == 10);  // ten skipped, 65536 halved down to 64, as tests/f16_overflow.h says
  const auto want = reference->state_dict();
  for (const auto& [name, value] : model->state_dict()) {
    INFO(name);
    CHECK(max_abs_diff(value, want.at(name)) == 0);
  }
  CHECK_FALSE(unchanged());
}

TEST_CASE("devices and dtypes in pipeline configs and stage packages", "[autocast]") {
  CHECK(Device::parse("cpu") == Device::cpu());
  CHECK(Device::parse("cuda") == Device::cuda(0));
  CHECK(Device::parse("cuda:3") == Device::cuda(3));
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "CPU"}) {
    CHECK_THROWS_WITH(Device::parse(bad), Catch::Contains(std::string("\"") + bad + "\""));
  }
  PipelineConfig config;
  config.dtype = "f8";
  CHECK_THROWS_WITH(validate(config), Catch::Contains("dtype 'f8'"));
  config.dtype = "bf16";
  config.devices = {"cpu", "tpu"};
  CHECK_THROWS_WITH(validate(config), Catch::Contains("\"tpu\""));

  config.devices = {"cpu", "cuda:1"};
  Generator g(19);
  auto model = mlp({2, 3, 2}, "relu", &g);
  const auto ranges = partition_model(*model, config);
  StagePackage package = make_stage_package(*model, ranges, config, 1);
  CHECK(package.device == "cuda:1");
  const StagePackage back = decode_stage_package(encode_stage_package(package), "test");
  CHECK(back.device == "cuda:1");
  CHECK(back.compute_dtype == DType::bf16);
  const StageSpec spec = make_stage_spec(*model, ranges, config, 0);
  CHECK(spec.device == Device::cpu());
  CHECK(spec.compute_dtype == DType::bf16);

  // A stage placed on a GPU this machine lacks is an error when the pipeline is built.
  config.devices = {"cuda:" + std::to_string(cuda_device_count())};
  CHECK_THROWS_WITH(Pipeline(model, config), Catch::Contains("cuda:"));
}

TEST_CASE("a CastCache rounds each parameter once and drops the copies when it closes",
          "[autocast]") {
  Generator g(14);
  Tensor w = randn({5, 6}, &g).requires_grad_();
  Tensor x = randn({3, 6}, &g);  // an activation: never cached
  auto scale_in_place = [](Tensor& t, float by) {
    float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] *= by;
  };
  auto bits = [](const Tensor& t) { return t.to_vector<float>(); };
  auto doubled = [](std::vector<float> v, float by) {
    for (float& e : v) e *= by;
    return v;
  };
  NoGradGuard no_grad;
  AutocastGuard autocast(DType::bf16);
  std::vector<float> first;
  {
    CastCache outer;
    first = bits(linear(x, w, {}));
    { CastCache inner; }  // closing a nested cache keeps the outer one's copies
    // Parameters must not change inside a cache; changing one here shows the copy reused.
    scale_in_place(w, 2.0f);
    CHECK(bits(linear(x, w, {})) == first);
    // Scaling by 2 is exact in bf16 and f32, so a fresh rounding of x doubles every bit.
    scale_in_place(x, 2.0f);
    CHECK(bits(linear(x, w, {})) == doubled(first, 2.0f));
  }
  CHECK(bits(linear(x, w, {})) == doubled(first, 4.0f));  // w rounded afresh
  CastCache next;  // starts empty: the closed cache's copy of w is gone
  CHECK(bits(linear(x, w, {})) == doubled(first, 4.0f));
}
