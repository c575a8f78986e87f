// Automatic rebalancing in a running pipeline: a stage slowed on purpose loses layers until
// the fitted cost model finds nothing clearly better, then the partition stays; training is the
// same bit for bit as without rebalancing. In threads and over worker processes. The layers cost
// sleeps (support/sleep_layer.h), not computation, so a loaded machine (ctest -j) barely moves
// their times and the optimum is known: 12 layers of 1 ms forward and 2 ms backward, stage 1
// slowed 3x, are best cut 9 + 3 (27 ms per microbatch on each stage; 6 + 6 gives 54 ms on
// stage 1, 8 + 4 gives 36 and 10 + 2 gives 30).
#include <algorithm>
#include <catch2/catch.hpp>

#include "distributed_reference.h"
#include "pipeline/pipeline.h"
#include "pipeline_models.h"
#include "pipit.h"
#include "support/sleep_layer.h"

using namespace pipit;
using pipit::testing::test_worker;
using pipit::testing::WorkerProcess;
using testing::Batch;

namespace {

std::shared_ptr<Sequential> model() {
  support::register_sleep_layer();  // a remap rebuilds moved layers from their config
  auto net = std::make_shared<Sequential>();
  for (int i = 0; i < 12; ++i) net->push_back(std::make_shared<support::SleepLayer>(1000));
  return net;
}

Batch sleep_batch() {
  Generator generator(3);
  return {randn({4, 3}, &generator), zeros({4, 3})};
}

PipelineConfig config(bool rebalance) {
  PipelineConfig c;
  c.stages = 2;
  c.microbatches = 2;
  c.partition = "uniform";
  c.loss = {{"type", "MSELoss"}};
  c.optimizer = {{"type", "SGD"}, {"lr", 0.01}};
  c.timeout = std::chrono::milliseconds(20000);
  c.rebalance.enabled = rebalance;
  c.rebalance.window = 4;
  c.rebalance.cooldown = 3;
  return c;
}

struct RebalancedRun {
  std::vector<double> losses;
  std::vector<std::string> remaps;  // the reasons, in order
  int last_remap_step = 0;
  std::vector<LayerRange> final_ranges;
  std::string last_verdict;
};

template <typename P>
RebalancedRun train(P& pipeline, int steps) {
  const Batch b = sleep_batch();
  RebalancedRun run;
  for (int step = 0; step < steps; ++step) {
    run.losses.push_back(pipeline.train_step(b.input, b.target));
    const StepStats& stats = pipeline.coordinator().last_step();
    if (stats.rebalanced) {
      run.remaps.push_back(stats.rebalanced->reason());
      run.last_remap_step = step + 1;
    }
    run.last_verdict = stats.rebalance_verdict;
  }
  run.final_ranges = pipeline.chunk_ranges();
  return run;
}

constexpr int kSteps = 40;

void check_converged(const RebalancedRun& run, const RebalancedRun& plain) {
  INFO("remaps:\n"
       << [&] {
            std::string all;
            for (const std::string& r : run.remaps) all += r + "\n";
            return all;
          }());
  INFO("last verdict: " << run.last_verdict);
  // The policy came within its threshold of the optimum in at most two moves (each after a
  // window of 4 steps and a cooldown of 3), stayed for the last 15 steps, and undid nothing.
  REQUIRE(!run.remaps.empty());
  CHECK(run.remaps.size() <= 2);
  CHECK(run.last_remap_step <= kSteps - 15);
  // Per microbatch, stage 0 takes 3 ms a layer and stage 1 9 ms: 9 + 3 gives 27 ms on both.
  // The policy keeps any partition within its threshold of the best (gain <= 10%): its
  // slowest stage takes at most 27 / 0.9 = 30 ms (10 + 2, at 30 ms, is one; measured
  // speeds on a loaded machine may lead there first).
  const auto& r = run.final_ranges;
  const double slowest = std::max(3.0 * static_cast<double>(r[0].end - r[0].begin),
                                  9.0 * static_cast<double>(r[1].end - r[1].begin));
  CHECK(slowest <= 27.0 / 0.9 + 1e-9);
  CHECK(run.last_verdict.rfind("rebalancing stopped", 0) != 0);
  CHECK_FALSE(run.last_verdict.empty());
  CHECK(run.losses == plain.losses);
}

}  // namespace

TEST_CASE("rebalancing moves layers off a slowed stage, then keeps the partition", "[rebalance]") {
  Pipeline plain_pipeline(model(), config(false));
  const RebalancedRun plain = train(plain_pipeline, kSteps);
  PipelineConfig slowed = config(true);
  slowed.slowdown = {1.0, 3.0};
  auto net = model();
  Pipeline pipeline(net, slowed);
  const RebalancedRun run = train(pipeline, kSteps);
  check_converged(run, plain);
  // The user's model holds the modules the stages train.
  CHECK(pipeline.forward(sleep_batch().input).to_vector<float>() ==
        Pipeline(net, config(false)).forward(sleep_batch().input).to_vector<float>());
}

TEST_CASE(
    "rebalancing with 2 replicas moves the same layers in both, timed on replica 0, with the "
    "optimizer sharded (ZeRO-1) or not",
    "[rebalance][replicas]") {
  PipelineConfig plain_config = config(false);
  plain_config.replicas = 2;
  plain_config.microbatches = 1;
  // Momentum: state that moves with the layers, which sharded replicas must pool first.
  plain_config.optimizer = {{"type", "SGD"}, {"lr", 0.01}, {"momentum", 0.9}};
  Pipeline plain_pipeline(model(), plain_config);
  const RebalancedRun plain = train(plain_pipeline, kSteps);
  PipelineConfig slowed = plain_config;
  slowed.shard_optimizer = GENERATE(false, true);
  INFO("sharded optimizer " << slowed.shard_optimizer);
  slowed.rebalance = config(true).rebalance;
  slowed.slowdown = {1.0, 3.0};
  Pipeline pipeline(model(), slowed);
  const RebalancedRun run = train(pipeline, kSteps);
  check_converged(run, plain);
  for (int stage = 0; stage < 2; ++stage) {
    CHECK(pipeline.stage(2 + stage).spec().chunks[0]->size() ==
          pipeline.stage(stage).spec().chunks[0]->size());
  }
}

TEST_CASE("rebalancing across worker processes, one of them slowed", "[rebalance][distributed]") {
  Pipeline plain_pipeline(model(), config(false));
  const RebalancedRun plain = train(plain_pipeline, kSteps);
  WorkerProcess fast(test_worker()), slow(test_worker("", {"--slowdown=3"}));
  auto net = model();
  Pipeline pipeline(net, config(true), Launch::workers({fast.endpoint(), slow.endpoint()}));
  INFO(slow.log());
  check_converged(train(pipeline, kSteps), plain);
}

TEST_CASE("rebalancing needs one chunk per stage", "[rebalance]") {
  PipelineConfig c = config(true);
  c.stages = 2;
  c.chunks_per_stage = 2;
  c.schedule = "interleaved";
  CHECK_THROWS_WITH(Pipeline(model(), c), Catch::Contains("v = 1"));
}
