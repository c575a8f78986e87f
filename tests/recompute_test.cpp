// Activation recomputation (PipelineConfig::recompute = "full"): stages keep only each chunk's
// input and run its forward again before the backward, replaying the same dropout masks, so
// training is bit for bit what it is without recomputation, and what sequential gradient
// accumulation gives.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "bitwise.h"
#include "loss/loss.h"
#include "nn/builders.h"
#include "optim/optimizer.h"
#include "pipeline/pipeline.h"
#include "pipeline_models.h"
#include "pipit.h"

using namespace pipit;
using pipit::testing::bitwise_equal;
using testing::Batch;

namespace {

const nlohmann::json kMomentumSgd = {{"type", "SGD"}, {"lr", 0.05}, {"momentum", 0.9}};

// A GPT with dropout, so that a recomputed forward that drew new masks would differ.
std::shared_ptr<Sequential> dropout_gpt() {
  Generator generator(21);
  return gpt(GptConfig{11, 6, 6, 2, 16, 0.2}, &generator);
}

Batch recompute_batch() {
  return testing::sequence_batch(8, 6, {.target_step = 5, .target_offset = 1});
}

StateDict train_sequentially(int microbatches, int steps) {
  auto model = dropout_gpt();
  auto optimizer = make_optimizer(kMomentumSgd, model->named_parameters());
  auto loss = make_loss({{"type", "CrossEntropyLoss"}});
  const Batch b = recompute_batch();
  const int64_t size = b.input.size(0) / microbatches;
  for (int step = 0; step < steps; ++step) {
    optimizer->zero_grad();
    for (int i = 0; i < microbatches; ++i) {
      Tensor x = narrow(b.input, 0, i * size, size), y = narrow(b.target, 0, i * size, size);
      Tensor out = model->forward(x);
      out.backward(loss->compute_gradient(out, y) * (1.0 / microbatches));
    }
    optimizer->step();
  }
  return model->state_dict();
}

}  // namespace

TEST_CASE("recomputed activations train bit for bit as stored ones, dropout included",
          "[pipeline]") {
  const int steps = 2;
  struct Case {
    std::string schedule;
    int p, m, v;
  };
  const Case cases[] = {{"gpipe", 2, 4, 1}, {"1f1b", 4, 4, 1}, {"interleaved", 2, 4, 2},
                        {"zbh1", 4, 8, 1},  {"zbh2", 2, 4, 1}, {"zbh1", 3, 2, 1}};
  for (const Case& c : cases) {
    const StateDict expected = train_sequentially(c.m, steps);
    for (const std::string recompute : {"none", "full"}) {
      INFO(c.schedule << " p=" << c.p << " m=" << c.m << " v=" << c.v << " recompute "
                      << recompute);
      auto model = dropout_gpt();
      {
        Pipeline pipeline(model, {.stages = c.p,
                                  .microbatches = c.m,
                                  .chunks_per_stage = c.v,
                                  .schedule = c.schedule,
                                  .recompute = recompute,
                                  .optimizer = kMomentumSgd});
        const Batch b = recompute_batch();
        for (int step = 0; step < steps; ++step) pipeline.train_step(b.input, b.target);
      }
      for (const auto& [name, value] : expected) {
        INFO(name);
        CHECK(bitwise_equal(model->state_dict().at(name), value));
      }
    }
  }
}

TEST_CASE("the trace shows recomputation before each backward", "[pipeline]") {
  auto model = dropout_gpt();
  Pipeline pipeline(
      model,
      {.stages = 2, .microbatches = 4, .schedule = "zbh1", .recompute = "full", .trace = true});
  const Batch b = recompute_batch();
  pipeline.train_step(b.input, b.target);
  int recomputed = 0, input_grads = 0, weight_grads = 0;
  for (const TraceEvent& e : pipeline.coordinator().trace().events()) {
    recomputed += e.task.phase == Phase::Recompute;
    input_grads += e.task.phase == Phase::InputGrad;
    weight_grads += e.task.phase == Phase::WeightGrad;
  }
  CHECK(recomputed == 2 * 4);  // one per microbatch and stage
  CHECK(input_grads == 2 * 4);
  CHECK(weight_grads == 2 * 4);
  const std::string timeline = pipeline.coordinator().trace().timeline();
  CHECK(timeline.find("R3") != std::string::npos);
  CHECK(timeline.find("W3") != std::string::npos);
  CHECK(pipeline.coordinator().trace().chrome_json().find("\"recompute\"") != std::string::npos);
}

TEST_CASE("an unknown recompute mode is refused by name", "[pipeline]") {
  PipelineConfig config;
  config.recompute = "selective";
  CHECK_THROWS_WITH(validate(config),
                    Catch::Contains("recompute") && Catch::Contains("\"selective\""));
}
