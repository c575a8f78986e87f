// Faults inside one process: stages obey only the coordinator, a stage whose loop fails says
// so instead of vanishing, a failure during the optimizer step leaves a pipeline that refuses
// to go on, and a stage stuck in a layer cannot hang the pipeline's destructor.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include "comm/local_communicator.h"
#include "forwarding_communicator.h"
#include "nn/builders.h"
#include "pipeline/pipeline.h"
#include "pipeline/protocol/messages.h"
#include "pipeline_models.h"
#include "pipit.h"

using namespace pipit;
using testing::Batch;
using namespace std::chrono_literals;

namespace {

PipelineConfig faults_config(std::chrono::milliseconds timeout = 5000ms) {
  PipelineConfig c;
  c.stages = 3;
  c.microbatches = 2;
  c.schedule = "1f1b";
  c.optimizer = {{"type", "AdamW"}, {"lr", 0.01}};
  c.timeout = timeout;
  return c;
}

bool same_weights(Sequential& a, Sequential& b) {
  for (const auto& [name, value] : a.state_dict()) {
    const Tensor other = b.state_dict().at(name);
    if (std::memcmp(value.contiguous().raw_data(), other.contiguous().raw_data(), value.nbytes()) !=
        0) {
      return false;
    }
  }
  return true;
}

// A stage's communicator with a filter on what it receives: the filter may drop a message
// (nothing), pass it on, or throw.
class FilteringCommunicator final : public testing::ForwardingCommunicator {
 public:
  using Filter = std::function<std::optional<Message>(Message)>;
  FilteringCommunicator(std::shared_ptr<Communicator> inner, Filter filter)
      : ForwardingCommunicator(std::move(inner)), filter_(std::move(filter)) {}
  Message receive() override {
    while (true) {
      if (std::optional<Message> kept = filter_(inner().receive())) return std::move(*kept);
    }
  }
  bool carries_device_tensors() const override { return true; }

 private:
  Filter filter_;
};

// Pipeline's assembly spelled out, so a test can reach the hub and wrap a stage's
// communicator.
struct HandBuiltPipeline {
  std::shared_ptr<LocalHub> hub = LocalHub::create();
  std::vector<std::unique_ptr<Stage>> stages;
  std::vector<std::thread> threads;
  std::unique_ptr<Coordinator> coordinator;

  HandBuiltPipeline(const Sequential& net, const PipelineConfig& c, int wrapped_stage = -1,
                    FilteringCommunicator::Filter filter = {}) {
    const auto ranges = partition_model(net, c);
    for (int s = 0; s < c.stages; ++s) {
      std::shared_ptr<Communicator> comm = hub->endpoint(s);
      if (s == wrapped_stage) comm = std::make_shared<FilteringCommunicator>(comm, filter);
      stages.push_back(std::make_unique<Stage>(make_stage_spec(net, ranges, c, s), comm));
    }
    coordinator = std::make_unique<Coordinator>(hub->endpoint(kCoordinator), c, ranges);
    for (auto& stage : stages) threads.emplace_back([&stage] { stage->run(); });
  }
  ~HandBuiltPipeline() {
    coordinator->shutdown();
    for (std::thread& thread : threads) thread.join();
  }
};

}  // namespace

TEST_CASE("stages ignore commands and data from anyone but their sender", "[pipeline][faults]") {
  const Batch batch = testing::mlp_batch();
  auto reference = testing::small_mlp();
  std::vector<double> expected;
  {
    Pipeline pipeline(reference, faults_config());
    for (int step = 0; step < 2; ++step) {
      expected.push_back(pipeline.train_step(batch.input, batch.target));
    }
  }
  auto net = testing::small_mlp();
  HandBuiltPipeline pipeline(*net, faults_config());
  // Stage 0 tries to shut stage 1 down, start a step there and step its optimizer; the
  // coordinator sends stage 1 an activation only stage 0 produces.
  auto stage0 = pipeline.hub->endpoint(0);
  stage0->send(1, Message(MessageKind::Shutdown, 0));
  stage0->send(2, Message(MessageKind::Shutdown, 0));
  pipeline.hub->endpoint(kCoordinator)
      ->send(1, Message(PipelineKind::Activation, 1, 0, 1, {zeros({4, 12})}));
  std::vector<double> losses;
  for (int step = 0; step < 2; ++step) {
    losses.push_back(pipeline.coordinator->train_step(batch.input, batch.target));
  }
  CHECK(losses == expected);
  CHECK(same_weights(*net, *reference));
}

TEST_CASE("a failure during the optimizer step leaves a pipeline that refuses to go on",
          "[pipeline][faults]") {
  const Batch batch = testing::mlp_batch();
  auto net = testing::small_mlp();
  // Stage 1 loses the OptimizerStep of step 2: stages 0 and 2 apply it, stage 1 does not.
  HandBuiltPipeline pipeline(*net, faults_config(500ms), 1,
                             [](Message m) -> std::optional<Message> {
                               if (m.kind == PipelineKind::OptimizerStep && m.step == 2)
                                 return std::nullopt;
                               return m;
                             });
  Coordinator& coordinator = *pipeline.coordinator;
  coordinator.train_step(batch.input, batch.target);
  CHECK(coordinator.consistent());
  CHECK_THROWS_WITH(coordinator.train_step(batch.input, batch.target),
                    Catch::Contains("step 2 failed during its optimizer step") &&
                        Catch::Contains("stages [0, 2] had applied it") &&
                        Catch::Contains("restore the model from the last checkpoint"));
  CHECK_FALSE(coordinator.consistent());
  CHECK_THROWS_WITH(coordinator.train_step(batch.input, batch.target),
                    Catch::Contains("refuses to go on"));
  CHECK_THROWS_WITH(coordinator.forward(batch.input), Catch::Contains("refuses to go on"));
  CHECK_THROWS_WITH(coordinator.fetch_state(), Catch::Contains("refuses to go on"));
}

TEST_CASE("a stage whose own loop fails reports it instead of ending its thread silently",
          "[pipeline][faults]") {
  const Batch batch = testing::mlp_batch();
  auto net = testing::small_mlp();
  int received = 0;
  HandBuiltPipeline pipeline(*net, faults_config(), 1,
                             [&received](Message m) -> std::optional<Message> {
                               // A failure outside any task: the communicator itself throws on the
                               // stage's thread.
                               if (++received == 3) throw std::runtime_error("inbox corrupted");
                               return m;
                             });
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(pipeline.coordinator->train_step(batch.input, batch.target),
                    Catch::Contains("stage 1 stopped: inbox corrupted"));
  CHECK(std::chrono::steady_clock::now() - start < 4s);
}

namespace {

// Identity that sleeps on its first call: a layer stuck far longer than the pipeline waits.
class StuckLayer final : public Module {
 public:
  Tensor forward(const Tensor& x) override {
    if (calls_++ == 0) std::this_thread::sleep_for(1500ms);
    return x;
  }
  json config() const override { return {{"type", "StuckLayer"}}; }

 private:
  int calls_ = 0;
};

}  // namespace

TEST_CASE("a stage stuck in a layer does not hang the pipeline's destructor",
          "[pipeline][faults]") {
  const Batch batch = testing::mlp_batch();
  auto net = testing::small_mlp();
  net->push_back(std::make_shared<StuckLayer>());
  auto pipeline = std::make_unique<Pipeline>(net, faults_config(200ms));
  CHECK_THROWS_WITH(pipeline->train_step(batch.input, batch.target),
                    Catch::Contains("no stage answered"));
  const auto start = std::chrono::steady_clock::now();
  pipeline.reset();
  CHECK(std::chrono::steady_clock::now() - start < 1000ms);
  std::this_thread::sleep_for(1600ms);  // let the stuck stage finish before its model goes
}

TEST_CASE("a remap that fails before its commit leaves the old partition on every stage",
          "[pipeline][faults][remap]") {
  const Batch batch = testing::mlp_batch();
  auto reference = testing::small_mlp(), net = testing::small_mlp();
  Pipeline plain(reference, faults_config());
  // Stage 1 never gets the layers stage 2 hands it.
  HandBuiltPipeline pipeline(*net, faults_config(500ms), 1,
                             [](Message m) -> std::optional<Message> {
                               if (m.kind == PipelineKind::LayerTransfer) return std::nullopt;
                               return m;
                             });
  Coordinator& coordinator = *pipeline.coordinator;
  CHECK(coordinator.train_step(batch.input, batch.target) ==
        plain.train_step(batch.input, batch.target));
  const std::vector<LayerRange> before = coordinator.chunk_ranges();
  CHECK_THROWS_WITH(coordinator.remap(move_layers(before, 2, 1, 1)),
                    Catch::Contains("no stage answered") && Catch::Contains("during remap") &&
                        Catch::Contains("the stages keep the old partition"));
  CHECK(coordinator.consistent());
  CHECK(coordinator.chunk_ranges() == before);
  for (int s = 0; s < 3; ++s) {
    const auto& chunk = *pipeline.stages[static_cast<size_t>(s)]->spec().chunks[0];
    CHECK(chunk.first_index() == before[static_cast<size_t>(s)].begin);
    CHECK(chunk.size() ==
          before[static_cast<size_t>(s)].end - before[static_cast<size_t>(s)].begin);
  }
  for (int step = 0; step < 2; ++step) {
    CHECK(coordinator.train_step(batch.input, batch.target) ==
          plain.train_step(batch.input, batch.target));
  }
}
