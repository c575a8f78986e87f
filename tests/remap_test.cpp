// Layer remapping: training with remaps equals training without them bit for bit, in threads
// and over worker processes; bad remaps are refused by name and change nothing.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <future>
#include <random>
#include <thread>

#include <unistd.h>

#include "bitwise.h"
#include "distributed_reference.h"
#include "nn/builders.h"
#include "nn/registry.h"
#include "pipeline/pipeline.h"
#include "pipeline_models.h"
#include "pipit.h"
#include "serialize/checkpoint.h"

using namespace pipit;
using namespace pipit::testing;

namespace {

// 24 layers: the embedding, 22 blocks, the final LayerNorm and the head make 25; 21 blocks
// make the reference scenario's 24.
std::shared_ptr<Sequential> gpt_of(int64_t blocks) {
  Generator generator(5);
  return gpt({11, 4, blocks, 2, 8, 0.0}, &generator);
}

Batch remap_batch() {
  return gpt_batch(11, 12, 4);
}

PipelineConfig config_for(int p, int m, int v, const std::string& schedule,
                          nlohmann::json optimizer = {{"type", "AdamW"}, {"lr", 0.01}}) {
  PipelineConfig c;
  c.stages = p;
  c.microbatches = m;
  c.chunks_per_stage = v;
  c.schedule = schedule;
  c.optimizer = std::move(optimizer);
  c.timeout = std::chrono::milliseconds(20000);
  return c;
}

void check_same(const StateDict& got, const StateDict& expected) {
  REQUIRE(got.size() == expected.size());
  for (const auto& [name, value] : expected) {
    INFO(name);
    REQUIRE(got.count(name));
    CHECK(bitwise_equal(got.at(name), value));
  }
}

// `got`'s weights and optimizer state, fetched from its stages, are exactly `expected`'s.
void check_same_state(Pipeline& got, Pipeline& expected) {
  const auto [weights, optimizer] = expected.coordinator().fetch_state();
  const auto [got_weights, got_optimizer] = got.coordinator().fetch_state();
  check_same(got_weights, weights);
  check_same(got_optimizer, optimizer);
}

// A random contiguous partition of `layers` into `chunks` non-empty ranges.
std::vector<LayerRange> random_partition(std::mt19937_64& random, size_t layers, size_t chunks) {
  std::vector<size_t> cuts;
  for (size_t l = 1; l < layers; ++l) cuts.push_back(l);
  std::shuffle(cuts.begin(), cuts.end(), random);
  cuts.resize(chunks - 1);
  std::sort(cuts.begin(), cuts.end());
  std::vector<LayerRange> ranges;
  size_t begin = 0;
  for (size_t cut : cuts) {
    ranges.push_back({begin, cut});
    begin = cut;
  }
  ranges.push_back({begin, layers});
  return ranges;
}

}  // namespace

TEST_CASE("the reference scenario: stage 1 hands 3 of its 12 layers to stage 0 mid-training",
          "[remap]") {
  const Batch b = remap_batch();
  for (const std::string schedule : {"gpipe", "1f1b"}) {
    INFO(schedule);
    auto plain_model = gpt_of(21), remapped_model = gpt_of(21);
    REQUIRE(plain_model->size() == 24);
    const PipelineConfig config = config_for(2, 4, 1, schedule);
    Pipeline plain(plain_model, config), remapped(remapped_model, config);
    REQUIRE(remapped.chunk_ranges() == std::vector<LayerRange>{{0, 12}, {12, 24}});
    for (int step = 0; step < 6; ++step) {
      if (step == 3) {
        remapped.move_layers(1, 0, 3);
        CHECK(remapped.chunk_ranges() == std::vector<LayerRange>{{0, 15}, {15, 24}});
        CHECK(remapped.stage(0).spec().chunks[0]->size() == 15);
        CHECK(remapped.stage(1).spec().chunks[0]->first_index() == 15);
        // Weights and optimizer state, moved or not, are exactly the unmoved pipeline's.
        check_same_state(remapped, plain);
      }
      CHECK(remapped.train_step(b.input, b.target) == plain.train_step(b.input, b.target));
    }
    // The model the user holds is the one the stages train, moved layers included.
    check_same(remapped_model->state_dict(), plain_model->state_dict());
  }
}

TEST_CASE("random remap sequences train exactly as no remaps, for every schedule and optimizer",
          "[remap]") {
  const Batch b = remap_batch();
  struct Case {
    std::string schedule;
    int p, m, v;
  };
  const nlohmann::json sgd = {{"type", "SGD"}, {"lr", 0.05}, {"momentum", 0.9}};
  const nlohmann::json adamw = {{"type", "AdamW"}, {"lr", 0.01}, {"weight_decay", 0.1}};
  std::mt19937_64 random(17);
  for (const Case& c : std::vector<Case>{{"gpipe", 3, 4, 1},
                                         {"1f1b", 4, 4, 1},
                                         {"interleaved", 2, 4, 2},
                                         {"interleaved", 3, 3, 2},
                                         {"1f1b", 1, 2, 1}}) {
    for (const nlohmann::json& optimizer : {adamw, sgd}) {
      INFO(c.schedule << " p=" << c.p << " m=" << c.m << " v=" << c.v << " " << optimizer.dump());
      auto plain_model = gpt_of(6), remapped_model = gpt_of(6);
      const PipelineConfig config = config_for(c.p, c.m, c.v, c.schedule, optimizer);
      Pipeline plain(plain_model, config), remapped(remapped_model, config);
      for (int step = 0; step < 5; ++step) {
        const auto ranges =
            random_partition(random, remapped_model->size(), static_cast<size_t>(c.p * c.v));
        INFO("step " << step << ": " << ranges_str(ranges));
        remapped.remap(ranges);
        REQUIRE(remapped.chunk_ranges() == ranges);
        CHECK(remapped.train_step(b.input, b.target) == plain.train_step(b.input, b.target));
      }
      check_same_state(remapped, plain);
    }
  }
}

TEST_CASE("an explicit partition is validated entry by entry", "[remap]") {
  auto model = gpt_of(2);  // 5 layers
  PipelineConfig config = config_for(2, 2, 1, "1f1b");
  config.layer_counts = {2, 3};
  CHECK(Pipeline(model, config).chunk_ranges() == std::vector<LayerRange>{{0, 2}, {2, 5}});
  config.layer_counts = {5, 0};
  CHECK_THROWS_WITH(Pipeline(model, config), Catch::Contains("layer_counts[1] is 0"));
  config.layer_counts = {2, 2};
  CHECK_THROWS_WITH(Pipeline(model, config),
                    Catch::Contains("add up to 4") && Catch::Contains("has 5 layers"));
  config.layer_counts = {2, 2, 1};
  CHECK_THROWS_WITH(Pipeline(model, config), Catch::Contains("layer_counts has 3 entries"));
}

TEST_CASE("invalid remaps are refused by name and change nothing", "[remap]") {
  const Batch b = remap_batch();
  auto plain_model = gpt_of(4), model = gpt_of(4);  // 7 layers
  const PipelineConfig config = config_for(3, 3, 1, "1f1b");
  Pipeline plain(plain_model, config), pipeline(model, config);
  const std::vector<LayerRange> before = pipeline.chunk_ranges();
  CHECK_THROWS_WITH(pipeline.move_layers(0, 2, 1), Catch::Contains("neighbouring chunk"));
  CHECK_THROWS_WITH(pipeline.move_layers(1, 0, before[1].end - before[1].begin),
                    Catch::Contains("chunk 1 holds"));
  CHECK_THROWS_WITH(pipeline.move_layers(1, 0, 0), Catch::Contains("not 0"));
  CHECK_THROWS_WITH(pipeline.move_layers(3, 2, 1), Catch::Contains("not both in [0, 3)"));
  CHECK_THROWS_WITH(pipeline.remap({{0, 3}, {3, 3}, {3, 7}}),
                    Catch::Contains("chunk 1 must start at layer 3 and hold at least one"));
  CHECK_THROWS_WITH(pipeline.remap({{0, 3}, {3, 7}}), Catch::Contains("2 ranges given for 3"));
  CHECK_THROWS_WITH(pipeline.remap({{0, 3}, {3, 5}, {5, 6}}),
                    Catch::Contains("end at layer 6") && Catch::Contains("has 7 layers"));
  CHECK_THROWS_WITH(pipeline.remap({{0, 3}, {4, 5}, {5, 7}}),
                    Catch::Contains("chunk 1 must start at layer 3"));
  CHECK(pipeline.chunk_ranges() == before);
  for (int step = 0; step < 2; ++step) {
    CHECK(pipeline.train_step(b.input, b.target) == plain.train_step(b.input, b.target));
  }
}

TEST_CASE("remapping over worker processes moves layers worker to worker, bit for bit",
          "[remap][distributed]") {
  const Batch b = remap_batch();
  Workers workers = start_workers(3, test_worker());
  std::mt19937_64 random(23);
  for (const auto& [schedule, v] :
       std::vector<std::pair<std::string, int>>{{"1f1b", 1}, {"interleaved", 2}}) {
    INFO(schedule);
    const PipelineConfig config = config_for(3, 3, v, schedule);
    auto plain_model = gpt_of(8), remote_model = gpt_of(8);  // 11 layers
    Pipeline plain(plain_model, config);
    Pipeline remote(remote_model, config, Launch::workers(endpoints(workers)));
    std::string log;
    for (const auto& w : workers) log += w->log();
    INFO(log);
    for (int step = 0; step < 4; ++step) {
      const auto ranges =
          step == 0 ? move_layers(remote.chunk_ranges(), 1, 0, 1)
                    : random_partition(random, remote_model->size(), static_cast<size_t>(3 * v));
      INFO("step " << step << ": " << ranges_str(ranges));
      remote.remap(ranges);
      CHECK(remote.chunk_ranges() == ranges);
      CHECK(remote.train_step(b.input, b.target) == plain.train_step(b.input, b.target));
    }
    check_same_state(remote, plain);
  }
}

TEST_CASE(
    "a worker killed during a remap is named, and the run resumes exactly from its checkpoint",
    "[remap][distributed]") {
  const Batch b = remap_batch();
  PipelineConfig config = config_for(3, 3, 1, "1f1b");
  auto uninterrupted = gpt_of(8);  // 11 layers: 4, 4, 3
  {
    Pipeline pipeline(uninterrupted, config);
    for (int step = 0; step < 4; ++step) {
      if (step == 2) pipeline.move_layers(1, 2, 2);
      pipeline.train_step(b.input, b.target);
    }
  }

  Workers workers = start_workers(3, test_worker());
  TcpOptions tcp;
  tcp.peer_timeout = std::chrono::milliseconds(2000);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("pipit_remap_" + std::to_string(getpid()) + ".safetensors"))
                               .string();
  auto model = gpt_of(8);
  {
    Pipeline pipeline(model, config, Launch::workers(endpoints(workers), tcp));
    for (int step = 0; step < 2; ++step) pipeline.train_step(b.input, b.target);
    auto [weights, optimizer_state] = pipeline.coordinator().fetch_state();
    save_checkpoint(path, {model->config(),
                           weights,
                           config.optimizer,
                           optimizer_state,
                           2,
                           0,
                           0,
                           {{"layer_counts", layer_counts(pipeline.chunk_ranges())}}});
    const std::string victim = workers[2]->endpoint();
    workers[2]->pause();
    std::thread killer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      workers[2]->kill();
    });
    const auto before = pipeline.chunk_ranges();
    CHECK_THROWS_WITH(pipeline.move_layers(1, 2, 2),
                      Catch::Contains("stage 2") && Catch::Contains(victim) &&
                          Catch::Contains("during remap [0, 4) [4, 8) [8, 11) -> [0, 4) [4, 6) "
                                          "[6, 11)") &&
                          Catch::Contains("the stages keep the old partition"));
    killer.join();
    CHECK(pipeline.chunk_ranges() == before);
  }

  workers[2] = std::make_unique<WorkerProcess>(test_worker());
  Checkpoint checkpoint = load_checkpoint(path);
  std::filesystem::remove(path);
  auto resumed = std::dynamic_pointer_cast<Sequential>(build_module(checkpoint.model_config));
  REQUIRE(resumed != nullptr);
  resumed->load_state_dict(checkpoint.weights);
  config.layer_counts = checkpoint.extra.at("layer_counts").get<std::vector<int64_t>>();
  Pipeline pipeline(resumed, config, Launch::workers(endpoints(workers), tcp),
                    checkpoint.optimizer_state);
  for (int64_t step = checkpoint.step; step < 4; ++step) {
    if (step == 2) pipeline.move_layers(1, 2, 2);
    pipeline.train_step(b.input, b.target);
  }
  check_same(pipeline.coordinator().fetch_state().first, uninterrupted->state_dict());
}

namespace {

// Identity that, on its first forward, says so and then waits to be released.
class GateLayer final : public Module {
 public:
  std::promise<void> entered, release;
  Tensor forward(const Tensor& x) override {
    if (calls_++ == 0) {
      entered.set_value();
      release.get_future().wait();
    }
    return x;
  }
  json config() const override { return {{"type", "GateLayer"}}; }

 private:
  int calls_ = 0;
};

}  // namespace

TEST_CASE("a remap requested during a step is refused and changes nothing", "[remap]") {
  const Batch b = remap_batch();
  auto net = gpt_of(2);
  auto gate = std::make_shared<GateLayer>();
  net->push_back(gate);
  // The gate's output feeds nothing trainable: a logits-shaped identity after the head.
  Pipeline pipeline(net, config_for(2, 2, 1, "1f1b"));
  const auto before = pipeline.chunk_ranges();
  auto step =
      std::async(std::launch::async, [&] { return pipeline.train_step(b.input, b.target); });
  gate->entered.get_future().wait();
  CHECK_THROWS_WITH(pipeline.move_layers(1, 0, 1),
                    Catch::Contains("remap was called while another call"));
  gate->release.set_value();
  // The step went on as if nothing had been asked: its loss is a fresh pipeline's.
  auto fresh_net = gpt_of(2);
  auto open_gate = std::make_shared<GateLayer>();
  open_gate->release.set_value();
  fresh_net->push_back(open_gate);
  Pipeline fresh(fresh_net, config_for(2, 2, 1, "1f1b"));
  CHECK(step.get() == fresh.train_step(b.input, b.target));
  CHECK(pipeline.chunk_ranges() == before);
  pipeline.move_layers(1, 0, 1);
  CHECK(pipeline.chunk_ranges() != before);
}
