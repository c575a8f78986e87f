// Pipelined training equals sequential gradient accumulation bit for bit, for every schedule,
// with and without activation recomputation;
// stages stash what the schedules promise; failures surface as errors, never as hangs.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "bitwise.h"
#include "loss/loss.h"
#include "nn/builders.h"
#include "optim/optimizer.h"
#include "pipeline/pipeline.h"
#include "pipeline/schedules/schedule.h"
#include "pipeline_models.h"
#include "pipit.h"

using namespace pipit;
using pipit::testing::bitwise_equal;
using pipit::testing::make_gpt;
using pipit::testing::make_mlp;
using pipit::testing::make_model;
using pipit::testing::Model;
using testing::kAdamW;

namespace {

// The model's forward, microbatch by microbatch: what pipelined inference equals bit for bit.
// (A product over the whole batch may round differently from one over a microbatch: oneDNN's
// AVX-512 kernels block differently by row count.)
Tensor forward_by_microbatch(Module& net, const Tensor& input, int microbatches) {
  NoGradGuard no_grad;
  std::vector<Tensor> outputs;
  for (const Tensor& part : chunk(input, microbatches, 0)) outputs.push_back(net.forward(part));
  return cat(outputs, 0);
}

// Sequential gradient accumulation over the same microbatches, on this thread.
std::vector<double> accumulate_sequentially(Model& m, const nlohmann::json& optimizer_config,
                                            int microbatches, int steps) {
  auto optimizer = make_optimizer(optimizer_config, m.net->named_parameters());
  auto loss = make_loss(m.loss);
  std::vector<double> losses;
  const int64_t size = m.input.size(0) / microbatches;
  for (int step = 0; step < steps; ++step) {
    optimizer->zero_grad();
    double total = 0;
    for (int i = 0; i < microbatches; ++i) {
      Tensor x = narrow(m.input, 0, i * size, size), y = narrow(m.target, 0, i * size, size);
      Tensor out = m.net->forward(x);
      total += loss->compute_loss(out, y).item<double>();
      out.backward(loss->compute_gradient(out, y) * (1.0 / microbatches));
    }
    optimizer->step();
    losses.push_back(total / microbatches);
  }
  return losses;
}

struct Combination {
  std::string schedule;
  int p, m, v;
  int max_deferred = 0;
};

std::vector<Combination> valid_combinations() {
  std::vector<Combination> all;
  for (int p : {1, 2, 3, 4}) {
    for (int m : {1, 2, 4, 8}) {
      all.push_back({"gpipe", p, m, 1});
      all.push_back({"1f1b", p, m, 1});
      all.push_back({"zbh1", p, m, 1});
      all.push_back({"zbh2", p, m, 1});
      if (m % p == 0) all.push_back({"interleaved", p, m, 2});
      all.push_back({"zbv", p, m, 2});
    }
  }
  all.push_back({"zbv", 4, 8, 2, 2});
  all.push_back({"zbh1", 3, 4, 1, 1});
  return all;
}

}  // namespace

TEST_CASE("pipelined training equals sequential gradient accumulation bit for bit", "[pipeline]") {
  for (const std::string model_name : {"mlp", "gpt"}) {
    for (const Combination& c : valid_combinations()) {
      for (const std::string recompute : {"none", "full"}) {
        INFO(model_name << " " << c.schedule << " p=" << c.p << " m=" << c.m << " v=" << c.v
                        << " max_deferred " << c.max_deferred << " recompute " << recompute);
        Model reference = make_model(model_name);
        const std::vector<double> expected_losses =
            accumulate_sequentially(reference, kAdamW, c.m, 3);

        Model piped = make_model(model_name);
        PipelineConfig config;
        config.stages = c.p;
        config.microbatches = c.m;
        config.chunks_per_stage = c.v;
        config.schedule = c.schedule;
        config.recompute = recompute;
        config.max_deferred = c.max_deferred;
        config.loss = piped.loss;
        config.optimizer = kAdamW;
        std::vector<double> losses;
        {
          Pipeline pipeline(piped.net, config);
          for (int step = 0; step < 3; ++step) {
            losses.push_back(pipeline.train_step(piped.input, piped.target));
          }
        }
        CHECK(losses == expected_losses);
        StateDict want = reference.net->state_dict(), got = piped.net->state_dict();
        for (const auto& [name, value] : want) {
          INFO(name);
          CHECK(bitwise_equal(got.at(name), value));
        }
      }
    }
  }
}

TEST_CASE("pipelined training matches full-batch training within 1e-5", "[pipeline]") {
  const nlohmann::json sgd = {{"type", "SGD"}, {"lr", 0.1}, {"momentum", 0.9}};
  for (const std::string model_name : {"mlp", "gpt"}) {
    for (const Combination& c : valid_combinations()) {
      INFO(model_name << " " << c.schedule << " p=" << c.p << " m=" << c.m << " v=" << c.v);
      Model full = make_model(model_name);
      auto optimizer = make_optimizer(sgd, full.net->named_parameters());
      auto loss = make_loss(full.loss);
      for (int step = 0; step < 3; ++step) {
        optimizer->zero_grad();
        loss->compute_loss(full.net->forward(full.input), full.target).backward();
        optimizer->step();
      }
      Model piped = make_model(model_name);
      {
        Pipeline pipeline(piped.net, {.stages = c.p,
                                      .microbatches = c.m,
                                      .chunks_per_stage = c.v,
                                      .schedule = c.schedule,
                                      .loss = piped.loss,
                                      .optimizer = sgd});
        for (int step = 0; step < 3; ++step) pipeline.train_step(piped.input, piped.target);
      }
      for (const auto& [name, value] : full.net->state_dict()) {
        INFO(name);
        Tensor got = piped.net->state_dict().at(name);
        const double difference = std::sqrt(sum((got - value) * (got - value)).item<double>());
        const double norm = std::sqrt(sum(value * value).item<double>());
        CHECK(difference <= 1e-5 * norm);
      }
    }
  }
}

TEST_CASE("stages stash at most what their schedule promises", "[pipeline]") {
  for (const Combination& c : valid_combinations()) {
    INFO(c.schedule << " p=" << c.p << " m=" << c.m << " v=" << c.v << " max_deferred "
                    << c.max_deferred);
    Model model = make_gpt();
    Pipeline pipeline(model.net, {.stages = c.p,
                                  .microbatches = c.m,
                                  .chunks_per_stage = c.v,
                                  .schedule = c.schedule,
                                  .max_deferred = c.max_deferred,
                                  .loss = model.loss});
    pipeline.train_step(model.input, model.target);
    const std::vector<int>& peak = pipeline.coordinator().last_step().peak_stashed;
    const ScheduleReport report =
        validate_schedule(make_schedule(c.schedule, c.p, c.m, c.v, "", c.max_deferred), c.p, c.m,
                          c.v, placement_of(c.schedule));
    REQUIRE(peak.size() == static_cast<size_t>(c.p));
    for (int s = 0; s < c.p; ++s) {
      INFO("stage " << s);
      if (c.schedule == "gpipe") CHECK(peak[s] == c.m);
      if (c.schedule == "1f1b") CHECK(peak[s] == std::min(c.p - s, c.m));
      CHECK(peak[s] == report.peak_stashed[s]);
      CHECK(pipeline.coordinator().last_step().peak_deferred[s] == report.peak_deferred[s]);
    }
  }
}

TEST_CASE("pipelined inference returns the model's outputs in order", "[pipeline]") {
  Model model = make_gpt();
  const Tensor expected = forward_by_microbatch(*model.net, model.input, 4);
  Pipeline pipeline(model.net, {.stages = 2,
                                .microbatches = 4,
                                .chunks_per_stage = 2,
                                .schedule = "interleaved",
                                .loss = model.loss});
  const Tensor outputs = pipeline.forward(model.input);
  CHECK(bitwise_equal(outputs, expected));
  {
    NoGradGuard no_grad;
    const Tensor whole_batch = model.net->forward(model.input);
    CHECK(max(abs(outputs - whole_batch)).item<double>() <=
          1e-5 * max(abs(whole_batch)).item<double>());
  }
  // Inference leaves no gradients behind and training afterwards is exactly fresh training.
  for (const Tensor& p : model.net->parameters()) CHECK_FALSE(p.grad().defined());
  Model fresh = make_gpt();
  Pipeline reference(fresh.net, {.stages = 2,
                                 .microbatches = 4,
                                 .chunks_per_stage = 2,
                                 .schedule = "interleaved",
                                 .loss = fresh.loss});
  CHECK(pipeline.train_step(model.input, model.target) ==
        reference.train_step(fresh.input, fresh.target));
  // The same through a V: stage 0 holds the first and the last chunk.
  Pipeline v_shaped(fresh.net, {.stages = 3,
                                .microbatches = 4,
                                .chunks_per_stage = 2,
                                .schedule = "zbv",
                                .loss = fresh.loss});
  const Tensor v_expected = forward_by_microbatch(*fresh.net, fresh.input, 4);
  CHECK(bitwise_equal(v_shaped.forward(fresh.input), v_expected));
}

TEST_CASE("global gradient clipping across stages matches clip_grad_norm", "[pipeline]") {
  const nlohmann::json sgd = {{"type", "SGD"}, {"lr", 0.5}};
  Model full = make_mlp();
  auto optimizer = make_optimizer(sgd, full.net->named_parameters());
  auto loss = make_loss(full.loss);
  loss->compute_loss(full.net->forward(full.input), full.target).backward();
  const double norm = clip_grad_norm(full.net->parameters(), 0.01);
  REQUIRE(norm > 0.01);  // the clip really scales
  optimizer->step();

  Model piped = make_mlp();
  Pipeline pipeline(piped.net, {.stages = 3,
                                .microbatches = 1,
                                .schedule = "1f1b",
                                .loss = piped.loss,
                                .optimizer = sgd,
                                .max_grad_norm = 0.01});
  pipeline.train_step(piped.input, piped.target);
  CHECK(pipeline.coordinator().last_step().grad_norm == Approx(norm).epsilon(1e-6));
  for (const auto& [name, value] : full.net->state_dict()) {
    INFO(name);
    const double difference = max(abs(piped.net->state_dict().at(name) - value)).item<double>();
    CHECK(difference < 1e-6);
  }
}

TEST_CASE("bad pipeline configurations are clear errors", "[pipeline]") {
  Model model = make_mlp();  // 9 layers
  auto build = [&](PipelineConfig config) { Pipeline pipeline(model.net, config); };
  CHECK_THROWS_WITH(
      build({.stages = 5, .microbatches = 5, .chunks_per_stage = 2, .schedule = "interleaved"}),
      Catch::Contains("10") && Catch::Contains("9"));
  CHECK_THROWS_WITH(
      build({.stages = 3, .microbatches = 4, .chunks_per_stage = 2, .schedule = "interleaved"}),
      Catch::Contains("interleaved") && Catch::Contains("multiple"));
  CHECK_THROWS_WITH(
      build({.stages = 2, .microbatches = 4, .chunks_per_stage = 2, .schedule = "1f1b"}),
      Catch::Contains("interleaved"));
  CHECK_THROWS_WITH(build({.stages = 2, .microbatches = 0}), Catch::Contains("microbatches"));
  CHECK_THROWS_WITH(build({.stages = 2, .schedule = "zigzag"}), Catch::Contains("zigzag"));
  CHECK_THROWS_WITH(build({.stages = 2, .partition = "random"}), Catch::Contains("random"));

  Pipeline pipeline(model.net, {.stages = 2, .microbatches = 3});
  CHECK_THROWS_WITH(pipeline.train_step(model.input, model.target),
                    Catch::Contains("8") && Catch::Contains("3 equal microbatches"));
}

namespace {

// Identity that throws (or sleeps) on chosen calls, to fail a stage mid-step.
class FaultyLayer final : public Module {
 public:
  FaultyLayer(int throw_on_call, int sleep_ms)
      : throw_on_call_(throw_on_call), sleep_ms_(sleep_ms) {}
  Tensor forward(const Tensor& x) override {
    if (++calls_ == throw_on_call_) throw Error("FaultyLayer: injected failure");
    if (sleep_ms_ > 0 && calls_ == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms_));
    }
    return x;
  }
  json config() const override { return {{"type", "FaultyLayer"}}; }

 private:
  int throw_on_call_, sleep_ms_, calls_ = 0;
};

}  // namespace

TEST_CASE("a layer that throws mid-step fails train_step with the stage named", "[pipeline]") {
  auto with_layer = [](const Model& model, std::shared_ptr<Module> extra, size_t at) {
    std::vector<std::shared_ptr<Module>> layers;
    for (size_t i = 0; i < model.net->size(); ++i) layers.push_back((*model.net)[i]);
    layers.insert(layers.begin() + static_cast<std::ptrdiff_t>(at), std::move(extra));
    return std::make_shared<Sequential>(layers);
  };
  const PipelineConfig config{.stages = 3,
                              .microbatches = 2,
                              .schedule = "1f1b",
                              .loss = make_mlp().loss,
                              .timeout = std::chrono::milliseconds(5000)};
  Model model = make_mlp();
  auto net = with_layer(model, std::make_shared<FaultyLayer>(3, 0), 6);  // third forward
  Pipeline pipeline(net, config);
  const double first = pipeline.train_step(model.input, model.target);  // calls 1 and 2
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(
      pipeline.train_step(model.input, model.target),
      Catch::Contains("stage 1") && Catch::Contains("injected failure") && Catch::Contains("F0"));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  const double third = pipeline.train_step(model.input, model.target);
  // The stages dropped the failed step without a trace: two steps of a model whose layer
  // never fails give the same losses and weights, bit for bit.
  Model fresh = make_mlp();
  auto reference_net = with_layer(fresh, std::make_shared<FaultyLayer>(0, 0), 6);
  Pipeline reference(reference_net, config);
  CHECK(first == reference.train_step(fresh.input, fresh.target));
  CHECK(third == reference.train_step(fresh.input, fresh.target));
  for (const auto& [name, value] : reference_net->state_dict()) {
    INFO(name);
    CHECK(bitwise_equal(net->state_dict().at(name), value));
  }
}

TEST_CASE("a silent stage fails train_step after the timeout instead of hanging", "[pipeline]") {
  Model model = make_mlp();
  std::vector<std::shared_ptr<Module>> layers;
  for (size_t i = 0; i < model.net->size(); ++i) layers.push_back((*model.net)[i]);
  layers.push_back(std::make_shared<FaultyLayer>(0, 600));
  auto net = std::make_shared<Sequential>(layers);
  Pipeline pipeline(net, {.stages = 2,
                          .microbatches = 2,
                          .schedule = "gpipe",
                          .loss = model.loss,
                          .timeout = std::chrono::milliseconds(150)});
  CHECK_THROWS_WITH(pipeline.train_step(model.input, model.target),
                    Catch::Contains("no stage answered") && Catch::Contains("150 ms"));
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  // The timed-out step left nothing behind: the next one is a fresh model's first step.
  Model fresh = make_mlp();
  Pipeline reference(fresh.net,
                     {.stages = 2, .microbatches = 2, .schedule = "gpipe", .loss = fresh.loss});
  CHECK(pipeline.train_step(model.input, model.target) ==
        reference.train_step(fresh.input, fresh.target));
}

TEST_CASE("the trace has one track per stage and loads as Chrome trace JSON", "[pipeline]") {
  Model model = make_gpt();
  Pipeline pipeline(model.net, {.stages = 4,
                                .microbatches = 4,
                                .chunks_per_stage = 2,
                                .schedule = "interleaved",
                                .loss = model.loss,
                                .trace = true});
  pipeline.train_step(model.input, model.target);
  const Trace& trace = pipeline.coordinator().trace();
  CHECK(trace.events().size() == 4 * 2 * 4 * 2);  // p * v chunks, m microbatches, F and B
  const nlohmann::json doc = nlohmann::json::parse(trace.chrome_json());
  std::set<int> tracks, named;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "X") {
      tracks.insert(e["tid"].get<int>());
      CHECK(e["dur"].get<double>() >= 0);
    }
    if (e["ph"] == "M") named.insert(e["tid"].get<int>());
  }
  CHECK(tracks == std::set<int>{0, 1, 2, 3});
  CHECK(named == tracks);
  const std::string timeline = trace.timeline();
  for (int s = 0; s < 4; ++s)
    CHECK(timeline.find("stage " + std::to_string(s) + " |") != std::string::npos);
  CHECK(timeline.find("B3.7") != std::string::npos);
}
