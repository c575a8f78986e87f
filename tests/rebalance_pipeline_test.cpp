// Automatic rebalancing in a running pipeline: a stage slowed on purpose loses layers until
// the fitted cost model finds nothing better, then the partition stays; training is the same
// bit for bit as without rebalancing. In threads and over worker processes.
#include <catch2/catch.hpp>

#include "nn/builders.h"
#include "pipeline/distributed_pipeline.h"
#include "pipeline/pipeline.h"
#include "pipit.h"
#include "worker_process.h"

using namespace pipit;
using pipit::testing::WorkerProcess;

namespace {

struct Batch {
  Tensor input, target;
};

// 16 blocks wide enough that a layer takes well over a sleep's granularity.
std::shared_ptr<Sequential> model() {
  Generator generator(5);
  return gpt({11, 16, 16, 2, 48, 0.0}, &generator);
}

Batch batch() {
  std::vector<int64_t> x, y;
  for (int64_t i = 0; i < 8 * 16; ++i) {
    x.push_back((i * 7) % 11);
    y.push_back((i * 7 + 3) % 11);
  }
  return {from_vector(x, {8, 16}), from_vector(y, {8, 16})};
}

PipelineConfig config(bool rebalance) {
  PipelineConfig c;
  c.stages = 2;
  c.microbatches = 2;
  c.partition = "uniform";
  c.optimizer = {{"type", "AdamW"}, {"lr", 0.01}};
  c.timeout = std::chrono::milliseconds(20000);
  c.rebalance.enabled = rebalance;
  c.rebalance.window = 4;
  c.rebalance.cooldown = 3;
  return c;
}

struct Run {
  std::vector<double> losses;
  std::vector<std::string> remaps;  // the reasons, in order
  std::vector<LayerRange> final_ranges;
  std::string last_verdict;
};

template <typename P>
Run train(P& pipeline, int steps) {
  const Batch b = batch();
  Run run;
  for (int step = 0; step < steps; ++step) {
    run.losses.push_back(pipeline.train_step(b.input, b.target));
    const StepStats& stats = pipeline.coordinator().last_step();
    if (stats.rebalanced) run.remaps.push_back(stats.rebalanced->reason());
    run.last_verdict = stats.rebalance_verdict;
  }
  run.final_ranges = pipeline.chunk_ranges();
  return run;
}

void check_converged(const Run& run, const Run& plain) {
  INFO("remaps:\n"
       << [&] {
            std::string all;
            for (const std::string& r : run.remaps) all += r + "\n";
            return all;
          }());
  INFO("last verdict: " << run.last_verdict);
  // Stage 1, three times slower, ends with fewer layers; the policy moved at most twice (a
  // first move and a correction) and then kept the partition.
  REQUIRE(!run.remaps.empty());
  CHECK(run.remaps.size() <= 2);
  const auto& r = run.final_ranges;
  CHECK(r[1].end - r[1].begin < r[0].end - r[0].begin);
  CHECK(run.last_verdict.rfind("keeping", 0) == 0);
  CHECK(run.losses == plain.losses);
}

}  // namespace

TEST_CASE("rebalancing moves layers off a slowed stage, then keeps the partition", "[rebalance]") {
  Pipeline plain_pipeline(model(), config(false));
  const Run plain = train(plain_pipeline, 30);
  PipelineConfig slowed = config(true);
  slowed.slowdown = {1.0, 3.0};
  auto net = model();
  Pipeline pipeline(net, slowed);
  const Run run = train(pipeline, 30);
  check_converged(run, plain);
  // The user's model holds the modules the stages train.
  CHECK(pipeline.forward(batch().input).to_vector<float>() ==
        Pipeline(net, config(false)).forward(batch().input).to_vector<float>());
}

TEST_CASE("rebalancing across worker processes, one of them slowed", "[rebalance][distributed]") {
  Pipeline plain_pipeline(model(), config(false));
  const Run plain = train(plain_pipeline, 30);
  WorkerProcess fast, slow("", {"--slowdown=3"});
  auto net = model();
  DistributedPipeline pipeline(*net, config(true), {fast.endpoint(), slow.endpoint()});
  INFO(slow.log());
  check_converged(train(pipeline, 30), plain);
}

TEST_CASE("rebalancing needs one chunk per stage", "[rebalance]") {
  PipelineConfig c = config(true);
  c.stages = 2;
  c.chunks_per_stage = 2;
  c.schedule = "interleaved";
  CHECK_THROWS_WITH(Pipeline(model(), c), Catch::Contains("v = 1"));
}
