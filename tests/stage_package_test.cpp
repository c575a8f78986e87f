// A stage package carries one stage of a pipeline through bytes: the chunks a worker rebuilds
// from it compute what the original slices compute, bit for bit, and a bad package is an
// error naming what was wrong.
#include <catch2/catch.hpp>
#include <cstring>
#include <functional>

#include "autograd/grad_mode.h"
#include "bitwise.h"
#include "codec/safetensors.h"
#include "comm/local_communicator.h"
#include "nn/builders.h"
#include "optim/optimizer.h"
#include "pipeline/pipeline.h"
#include "pipeline/remote/stage_package.h"
#include "pipit.h"

using namespace pipit;
using nlohmann::json;

namespace {

// Stage 1 of 3, interleaved with 2 chunks per stage: global chunks 1 and 4 of a 7-layer gpt.
struct Fixture {
  std::shared_ptr<Sequential> model;
  PipelineConfig config{.stages = 3,
                        .microbatches = 3,
                        .chunks_per_stage = 2,
                        .schedule = "interleaved",
                        .recompute = "full"};
  std::vector<LayerRange> ranges;
  std::unique_ptr<Optimizer> optimizer;
  StagePackage package;

  Fixture() {
    Generator init(17);
    model = gpt({11, 6, 4, 2, 16, 0.0}, &init);
    ranges = partition_model(*model, config);
    // A step of the whole model's optimizer, so the package carries real state to filter.
    optimizer = make_optimizer(config.optimizer, model->named_parameters());
    sum(model->forward(tokens())).backward();
    optimizer->step();
    package = make_stage_package(*model, ranges, config, 1, optimizer->state_dict());
    package.peers = {{"0", "127.0.0.1:7001"}, {"1", "127.0.0.1:7002"}, {"2", "127.0.0.1:7003"}};
  }

  static Tensor tokens() {
    std::vector<int64_t> x;
    for (int64_t i = 0; i < 2 * 6; ++i) x.push_back((i * 5 + 1) % 11);
    return from_vector(x, {2, 6});
  }
};

StagePackage through_bytes(const StagePackage& package) {
  return decode_stage_package(encode_stage_package(package), "stage-1.pkg");
}

// The package's bytes with `edit` applied to their metadata.
std::string with_metadata(const StagePackage& package, const std::function<void(json&)>& edit) {
  const std::string bytes = encode_stage_package(package);
  json metadata;
  StateDict tensors = decode_safetensors(bytes.data(), bytes.size(), "edit", &metadata);
  edit(metadata);
  return encode_safetensors(tensors, metadata);
}

}  // namespace

TEST_CASE("a stage package round trips and rebuilds chunks equal to the slices",
          "[stage_package]") {
  Fixture f;
  const StagePackage& sent = f.package;
  REQUIRE(sent.chunk_configs.size() == 2);
  const StagePackage got = through_bytes(sent);
  CHECK(got.stage == 1);
  CHECK(got.stages == 3);
  CHECK(got.chunks_per_stage == 2);
  CHECK(got.schedule == "interleaved");
  CHECK(got.recompute);
  CHECK(got.chunk_configs == sent.chunk_configs);
  CHECK(got.optimizer_config == f.config.optimizer);
  CHECK(got.peers == sent.peers);
  testing::check_bitwise_equal(got.weights, sent.weights);
  testing::check_bitwise_equal(got.optimizer_state, sent.optimizer_state);

  // Only this stage's optimizer entries travel, with the step count.
  const size_t parameters = sent.weights.size();
  CHECK(sent.optimizer_state.size() == 2 * parameters + 1);
  CHECK(sent.optimizer_state.count("step"));
  for (const auto& [name, tensor] : sent.weights)
    CHECK(sent.optimizer_state.count(name + ".exp_avg"));

  const StageSpec spec = build_stage_spec(got);
  REQUIRE(spec.chunks.size() == 2);
  CHECK(spec.stage == 1);
  CHECK(spec.schedule == "interleaved");
  CHECK(spec.recompute);
  StagePackage tabled = sent;
  tabled.schedule = "table";
  tabled.schedule_table = "F0c1 B0c1 # by hand\nF0c4 B0c4\n";
  CHECK(build_stage_spec(through_bytes(tabled)).schedule_table == tabled.schedule_table);
  NoGradGuard no_grad;
  Tensor h = Fixture::tokens();
  for (size_t global = 0; global < f.ranges.size(); ++global) {
    const LayerRange& range = f.ranges[global];
    const Tensor out = f.model->slice(range.begin, range.end)->forward(h);
    if (global % 3 == 1) {
      INFO("global chunk " << global);
      const Sequential& chunk = *spec.chunks[global / 3];
      CHECK(chunk.first_index() == range.begin);
      testing::check_bitwise_equal(chunk.state_dict(),
                                   f.model->slice(range.begin, range.end)->state_dict());
      CHECK(testing::bitwise_equal(spec.chunks[global / 3]->forward(h), out));
    }
    h = out;
  }

  // The documented way to restore the optimizer: the Stage creates it, then loads the state.
  auto hub = LocalHub::create();
  Stage stage(spec, hub->endpoint(1));
  stage.optimizer().load_state_dict(got.optimizer_state);
  testing::check_bitwise_equal(stage.optimizer().state_dict(), sent.optimizer_state);
}

TEST_CASE("bad stage packages are errors naming what is wrong", "[stage_package]") {
  Fixture f;
  const StagePackage& good = f.package;
  const std::string some_weight = good.weights.rbegin()->first;

  SECTION("unknown module type") {
    StagePackage bad = good;
    bad.chunk_configs[1]["layers"][0]["type"] = "Warp";
    CHECK_THROWS_WITH(build_stage_spec(through_bytes(bad)),
                      Catch::Contains("unknown module type 'Warp'") &&
                          Catch::Contains("chunk 1 (global chunk 4)"));
  }
  SECTION("a chunk config that is not a Sequential") {
    StagePackage bad = good;
    bad.chunk_configs[0] = {{"type", "ReLU"}};
    CHECK_THROWS_WITH(build_stage_spec(bad),
                      Catch::Contains("ReLU") && Catch::Contains("not a Sequential"));
  }
  SECTION("a weight with the wrong shape") {
    StagePackage bad = good;
    bad.weights[some_weight] = zeros({3});
    CHECK_THROWS_WITH(build_stage_spec(through_bytes(bad)),
                      Catch::Contains("'" + some_weight + "'") && Catch::Contains("[3]"));
  }
  SECTION("a missing weight") {
    StagePackage bad = good;
    bad.weights.erase(some_weight);
    CHECK_THROWS_WITH(build_stage_spec(through_bytes(bad)),
                      Catch::Contains("missing parameter '" + some_weight + "'"));
  }
  SECTION("a weight of no chunk") {
    StagePackage bad = good;
    bad.weights["0.stray"] = zeros({2});
    CHECK_THROWS_WITH(build_stage_spec(through_bytes(bad)),
                      Catch::Contains("'0.stray'") && Catch::Contains("none of its chunks"));
  }
  SECTION("a stage index outside the pipeline") {
    StagePackage bad = good;
    bad.stage = 3;
    CHECK_THROWS_WITH(build_stage_spec(bad),
                      Catch::Contains("stage 3") && Catch::Contains("outside [0, 3)"));
    CHECK_THROWS_WITH(encode_stage_package(bad), Catch::Contains("stage 3"));
    const std::string bytes = with_metadata(good, [](json& m) { m["stage"] = "-1"; });
    CHECK_THROWS_WITH(decode_stage_package(bytes, "stage-1.pkg"),
                      Catch::Contains("\"stage\"") && Catch::Contains("stage-1.pkg"));
    CHECK_THROWS_WITH(make_stage_package(*f.model, f.ranges, f.config, 3),
                      Catch::Contains("stage 3"));
  }
  SECTION("a package of an older version, or a replica outside the run") {
    // Version 6 added the replica: a version 5 package (an older coordinator's) is refused.
    const std::string old = with_metadata(good, [](json& m) {
      m["version"] = "5";
      m.erase("replica");
      m.erase("replicas");
    });
    CHECK_THROWS_WITH(decode_stage_package(old, "old.pkg"),
                      Catch::Contains("\"version\" is 5, but this build reads only version 6") &&
                          Catch::Contains("old.pkg"));
    const std::string outside = with_metadata(good, [](json& m) {
      m["replicas"] = "2";
      m["replica"] = "2";
    });
    CHECK_THROWS_WITH(decode_stage_package(outside, "replica.pkg"),
                      Catch::Contains("\"replica\"") && Catch::Contains("replica.pkg"));
    StagePackage bad = good;
    bad.replica = 1;
    CHECK_THROWS_WITH(encode_stage_package(bad), Catch::Contains("replica 1 is outside [0, 1)"));
    StagePackage second = good;
    second.replicas = 3;
    second.replica = 2;
    second.shard_optimizer = true;
    const StageSpec spec = build_stage_spec(through_bytes(second));
    CHECK(spec.replica == 2);
    CHECK(spec.replicas == 3);
    CHECK(spec.shard_optimizer);
    CHECK_FALSE(build_stage_spec(through_bytes(good)).shard_optimizer);
  }
  SECTION("a chunk count other than chunks_per_stage") {
    StagePackage bad = good;
    bad.chunk_configs.pop_back();
    CHECK_THROWS_WITH(build_stage_spec(bad),
                      Catch::Contains("1 chunk configs") && Catch::Contains("chunks_per_stage"));
    const std::string bytes = with_metadata(good, [](json& m) { m["chunks_per_stage"] = "3"; });
    CHECK_THROWS_WITH(decode_stage_package(bytes, "stage-1.pkg"),
                      Catch::Contains("\"chunk_configs\"") && Catch::Contains("stage-1.pkg"));
  }
  SECTION("missing or garbled metadata") {
    for (const char* key :
         {"schedule", "schedule_table", "recompute", "max_deferred", "stages", "replica",
          "replicas", "shard_optimizer", "chunk_configs", "peers", "optimizer_config"}) {
      INFO(key);
      const std::string bytes = with_metadata(good, [&](json& m) { m.erase(key); });
      CHECK_THROWS_WITH(decode_stage_package(bytes, "stage-1.pkg"),
                        Catch::Contains(std::string("\"") + key + "\" is missing") &&
                            Catch::Contains("stage-1.pkg"));
    }
    const std::string odd_recompute =
        with_metadata(good, [](json& m) { m["recompute"] = "sometimes"; });
    CHECK_THROWS_WITH(decode_stage_package(odd_recompute, "stage-1.pkg"),
                      Catch::Contains("\"recompute\"") && Catch::Contains("\"sometimes\""));
    const std::string odd_sharding =
        with_metadata(good, [](json& m) { m["shard_optimizer"] = "yes"; });
    CHECK_THROWS_WITH(decode_stage_package(odd_sharding, "stage-1.pkg"),
                      Catch::Contains("\"shard_optimizer\"") && Catch::Contains("\"yes\""));
    const std::string garbled = with_metadata(good, [](json& m) { m["peers"] = "{\"0\":"; });
    CHECK_THROWS_WITH(decode_stage_package(garbled, "stage-1.pkg"),
                      Catch::Contains("\"peers\" is not valid JSON"));
    const std::string foreign = encode_safetensors(good.weights);
    CHECK_THROWS_WITH(decode_stage_package(foreign, "stage-1.pkg"),
                      Catch::Contains("is not a pipit stage package"));
  }
  SECTION("truncated bytes") {
    const std::string bytes = encode_stage_package(good);
    constexpr size_t kCuts = 40;
    for (size_t k = 0; k < kCuts; ++k) {
      const size_t n = bytes.size() * k / kCuts;
      INFO("truncated to " << n << " of " << bytes.size() << " bytes");
      CHECK_THROWS_WITH(decode_stage_package(bytes.substr(0, n), "stage-1.pkg"),
                        Catch::Contains("stage-1.pkg"));
    }
  }
}
