// What stages measure for rebalancing: per-layer times and bytes on profiled steps, busy time
// per stage on every step; profiling and slowdowns do not change what is computed, and a
// slowdown shows in the slowed stage's busy time.
#include <algorithm>
#include <catch2/catch.hpp>
#include <limits>

#include "autograd/backward_hook.h"
#include "nn/builders.h"
#include "pipeline/pipeline.h"
#include "pipeline_models.h"
#include "pipit.h"
#include "support/sleep_layer.h"

using namespace pipit;
using testing::Batch;

namespace {

PipelineConfig timing_config() {
  PipelineConfig c;
  c.stages = 2;
  c.microbatches = 2;
  c.optimizer = {{"type", "AdamW"}, {"lr", 0.01}};
  return c;
}

}  // namespace

TEST_CASE("backward_hook passes the gradient through unchanged and calls its hook once",
          "[rebalance]") {
  Tensor x = from_vector<float>({1, -2, 3}, {3}).requires_grad_();
  int calls = 0;
  Tensor y = backward_hook(x * 2.0, [&] { ++calls; });
  CHECK(calls == 0);
  sum(y * y).backward();
  CHECK(calls == 1);
  CHECK(x.grad().to_vector<float>() == std::vector<float>{8, -16, 24});
}

TEST_CASE("profiled steps report every layer's times, output bytes and state bytes",
          "[rebalance]") {
  PipelineConfig c = timing_config();
  c.profile_every = 2;
  Pipeline pipeline(testing::small_mlp(), c);
  const Batch b = testing::mlp_batch();
  for (int step = 1; step <= 4; ++step) {
    pipeline.train_step(b.input, b.target);
    const StepStats& stats = pipeline.coordinator().last_step();
    REQUIRE(stats.busy_us.size() == 2);
    CHECK(stats.busy_us[0] > 0);
    CHECK(stats.busy_us[1] > 0);
    // Steps are numbered from 1; every second one is profiled.
    if (step % 2 == 1) {
      CHECK(stats.layers.empty());
      continue;
    }
    REQUIRE(stats.layers.size() == 7);
    for (int64_t l = 0; l < 7; ++l) {
      const LayerTiming& t = stats.layers[static_cast<size_t>(l)];
      INFO("layer " << l);
      CHECK(t.layer == l);
      CHECK(t.forward_us > 0);
      CHECK(t.backward_us > 0);
      // Per microbatch of 4 rows: 12 floats wide, the head 3.
      CHECK(t.output_bytes == (l == 6 ? 4 * 3 * 4 : 4 * 12 * 4));
    }
    // Weights plus AdamW's two moments (after the first step): Linear(12, 12) has 156
    // floats; the Tanh layers have none.
    CHECK(stats.layers[2].state_bytes == 3 * 156 * 4);
    CHECK(stats.layers[0].state_bytes == 3 * (6 * 12 + 12) * 4);
    CHECK(stats.layers[1].state_bytes == 0);
  }
}

TEST_CASE("profiling and slowed stages train exactly as plain stages", "[rebalance]") {
  PipelineConfig slowed = timing_config();
  slowed.profile_every = 1;
  slowed.slowdown = {1.0, 2.0};
  Pipeline plain(testing::small_mlp(), timing_config()), timed(testing::small_mlp(), slowed);
  const Batch b = testing::mlp_batch();
  for (int step = 0; step < 3; ++step) {
    CHECK(timed.train_step(b.input, b.target) == plain.train_step(b.input, b.target));
  }
  CHECK(timed.forward(b.input).to_vector<float>() == plain.forward(b.input).to_vector<float>());
}

TEST_CASE("a slowed stage is busy for about its slowdown times as long", "[rebalance]") {
  // Layers that sleep rather than compute (support/sleep_layer.h): on a loaded machine a
  // computing stage's busy time is mostly its wait for a core, which no slowdown stretches.
  auto make_sleeping_net = [] {
    auto net = std::make_shared<Sequential>();
    for (int i = 0; i < 4; ++i) net->push_back(std::make_shared<support::SleepLayer>(500));
    return net;
  };
  const Batch b = testing::mlp_batch();
  PipelineConfig slowed = timing_config();
  slowed.slowdown = {1.0, 4.0};
  Pipeline plain(make_sleeping_net(), timing_config()), timed(make_sleeping_net(), slowed);
  // Stage 1's least busy step in each: the first warms up, and other threads may delay any.
  double plain_busy = std::numeric_limits<double>::infinity(), timed_busy = plain_busy;
  for (int step = 0; step < 3; ++step) {
    plain.train_step(b.input, b.target);
    timed.train_step(b.input, b.target);
    plain_busy = std::min(plain_busy, plain.coordinator().last_step().busy_us[1]);
    timed_busy = std::min(timed_busy, timed.coordinator().last_step().busy_us[1]);
  }
  INFO("stage 1 busy " << plain_busy << " us plain, " << timed_busy << " us slowed 4x");
  // Stage 1's two layers sleep 6 ms a step (2 microbatches, 0.5 ms forward, 1 ms backward),
  // 24 ms slowed (measured, idle or beside three busy loops on two cores: 6.1 to 6.9 ms plain,
  // 24.6 to 32 ms slowed). At least half the factor, for what a task does besides its layers.
  CHECK(timed_busy >= 2 * plain_busy);
}

TEST_CASE("bad slowdowns and profile intervals are refused by name", "[rebalance]") {
  PipelineConfig c = timing_config();
  c.slowdown = {1.0, 0.5};
  CHECK_THROWS_WITH(Pipeline(testing::small_mlp(), c), Catch::Contains("slowdown[1] is 0.5"));
  c.slowdown = {};
  c.profile_every = -1;
  CHECK_THROWS_WITH(Pipeline(testing::small_mlp(), c),
                    Catch::Contains("profile_every must be >= 0"));
}
