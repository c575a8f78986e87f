// Checkpoints restore training exactly: weights, optimizer state and data order come back bit
// for bit, so a resumed run equals an uninterrupted one; damaged or foreign files are errors
// that name the file and the key, and a crashed writer never costs the previous checkpoint.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "bitwise.h"
#include "codec/atomic_file.h"
#include "codec/safetensors.h"
#include "f16_overflow.h"
#include "file_faults.h"
#include "loss/loss.h"
#include "nn/builders.h"
#include "nn/registry.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "pipeline/pipeline.h"
#include "pipeline_models.h"
#include "pipit.h"
#include "serialize/checkpoint.h"
#include "serialize/model_io.h"

using namespace pipit;
using nlohmann::json;
using testing::kAdamW;
namespace fs = std::filesystem;

namespace {

const GptConfig kGpt{11, 6, 2, 2, 16, 0.0};
// Past INT64_MAX, so the seed's full unsigned range is exercised.
constexpr uint64_t kDataSeed = 0xfedcba9876543210ull;

// Batches come from `data`, so where it stands is part of what a checkpoint must restore.
void train(Module& model, Optimizer& optimizer, Generator& data, int steps) {
  CrossEntropyLoss loss;
  for (int s = 0; s < steps; ++s) {
    const uint64_t first = data.reserve(2 * 2 * 6);
    std::vector<int64_t> x, y;
    for (uint64_t i = 0; i < 2 * 6; ++i) {
      x.push_back(static_cast<int64_t>(data.bits(first + i) % 11));
      y.push_back(static_cast<int64_t>(data.bits(first + 12 + i) % 11));
    }
    optimizer.zero_grad();
    loss.compute_loss(model.forward(from_vector(x, {2, 6})), from_vector(y, {2, 6})).backward();
    optimizer.step();
  }
}

struct CheckpointedRun {
  std::shared_ptr<Module> model;
  std::unique_ptr<Optimizer> optimizer;
  Generator data{kDataSeed};
};

CheckpointedRun fresh_run() {
  Generator init(21);
  CheckpointedRun run;
  run.model = gpt(kGpt, &init);
  run.optimizer = make_optimizer(kAdamW, run.model->named_parameters());
  return run;
}

StateDict snapshot(const StateDict& state) {
  StateDict copy;
  for (const auto& [name, tensor] : state) copy[name] = tensor.detach().clone();
  return copy;
}

// state_dict() tensors share storage with the live model and optimizer, which further
// training overwrites; a snapshot keeps the values to compare against.
Checkpoint checkpoint_of(const CheckpointedRun& run, int64_t step) {
  return {run.model->config(),
          snapshot(run.model->state_dict()),
          run.optimizer->config(),
          snapshot(run.optimizer->state_dict()),
          step,
          run.data.seed(),
          run.data.offset(),
          {{"epoch", 3}, {"note", "warm"}}};
}

// Rewrites the checkpoint at `path` with `edit` applied to its metadata and tensors.
void tamper(const std::string& path, const std::function<void(json&, StateDict&)>& edit) {
  json metadata;
  StateDict tensors = load_safetensors(path, &metadata);
  edit(metadata, tensors);
  save_safetensors(path, tensors, metadata);
}

}  // namespace

TEST_CASE("a checkpoint round trips every field bit for bit", "[checkpoint]") {
  const testing::TempDir dir("checkpoint_round_trip");
  const std::string path = (dir / "ckpt.safetensors").string();
  CheckpointedRun run = fresh_run();
  train(*run.model, *run.optimizer, run.data, 2);
  const Checkpoint saved = checkpoint_of(run, 2);
  save_checkpoint(path, saved);

  const Checkpoint loaded = load_checkpoint(path);
  CHECK(loaded.model_config == saved.model_config);
  CHECK(loaded.optimizer_config == saved.optimizer_config);
  testing::check_bitwise_equal(loaded.weights, saved.weights);
  testing::check_bitwise_equal(loaded.optimizer_state, saved.optimizer_state);
  CHECK(loaded.optimizer_state.count("step"));
  CHECK(loaded.step == 2);
  CHECK(loaded.rng_seed == kDataSeed);
  CHECK(loaded.rng_offset == run.data.offset());
  CHECK(loaded.extra == saved.extra);
  CHECK(loaded.grad_scaler.is_null());  // no f16 run, none saved

  // The file is plain safetensors: another reader sees the prefixed tensors and the tag.
  json metadata;
  StateDict raw = load_safetensors(path, &metadata);
  CHECK(metadata["format"] == "pipit-checkpoint");
  CHECK(metadata["version"] == "1");
  CHECK(raw.count("model." + saved.weights.begin()->first));
  CHECK(raw.count("optim.step"));
}

TEST_CASE("resuming from a checkpoint equals training without a break", "[checkpoint]") {
  const testing::TempDir dir("checkpoint_resume");
  const std::string path = (dir / "ckpt.safetensors").string();
  CheckpointedRun straight = fresh_run();
  train(*straight.model, *straight.optimizer, straight.data, 4);

  {
    CheckpointedRun first_half = fresh_run();
    train(*first_half.model, *first_half.optimizer, first_half.data, 2);
    save_checkpoint(path, checkpoint_of(first_half, 2));
  }
  const Checkpoint checkpoint = load_checkpoint(path);
  std::shared_ptr<Module> model = build_module(checkpoint.model_config);
  model->load_state_dict(checkpoint.weights);
  auto optimizer = make_optimizer(checkpoint.optimizer_config, model->named_parameters());
  optimizer->load_state_dict(checkpoint.optimizer_state);
  Generator data;
  data.set_state(checkpoint.rng_seed, checkpoint.rng_offset);
  train(*model, *optimizer, data, 2);

  testing::check_bitwise_equal(model->state_dict(), straight.model->state_dict());
  testing::check_bitwise_equal(optimizer->state_dict(), straight.optimizer->state_dict());
  CHECK(data.offset() == straight.data.offset());
}

TEST_CASE("a GradScaler's state round trips and is checked when loaded", "[checkpoint]") {
  GradScaler scaler({.init_scale = 1024, .growth_interval = 3});
  for (bool overflowed : {false, true, false}) scaler.update(overflowed);
  REQUIRE(scaler.get_scale() == 512);
  GradScaler restored;
  restored.load_state_dict(json::parse(scaler.state_dict().dump()));
  CHECK(restored.state_dict() == scaler.state_dict());
  // One clean step was counted before the save: two more make the three that double it.
  restored.update(false);
  CHECK(restored.get_scale() == 512);
  restored.update(false);
  CHECK(restored.get_scale() == 1024);

  const json good = scaler.state_dict();
  auto with = [&](const std::string& key, const json& value) {
    json state = good;
    if (value.is_null()) {
      state.erase(key);
    } else {
      state[key] = value;
    }
    return state;
  };
  GradScaler target;
  CHECK_THROWS_WITH(target.load_state_dict(with("scale", -1.0)), Catch::Contains("init_scale > 0"));
  CHECK_THROWS_WITH(target.load_state_dict(with("scale", "big")), Catch::Contains("'scale'"));
  CHECK_THROWS_WITH(target.load_state_dict(with("growth_tracker", nullptr)),
                    Catch::Contains("'growth_tracker'"));
  CHECK_THROWS_WITH(target.load_state_dict(with("growth_tracker", 3)),
                    Catch::Contains("'growth_tracker' must be in [0, growth_interval)"));
  CHECK_THROWS_WITH(target.load_state_dict(json::array()), Catch::Contains("expected an object"));
  CHECK(target.get_scale() == 65536);  // a refused state changes nothing
}

TEST_CASE("an f16 run resumed from its checkpoint goes on with the loss scale it reached",
          "[checkpoint][autocast]") {
  const testing::TempDir dir("checkpoint_loss_scale");
  const std::string path = (dir / "ckpt.safetensors").string();
  // Ten skipped steps while the scale backs off from 65536 to 64; the runs below train after.
  const nlohmann::json sgd = {{"type", "SGD"}, {"lr", 1e-6}, {"momentum", 0.9}};
  const testing::F16Overflow setup = testing::f16_overflow(sgd);
  const Tensor &input = setup.input, &target = setup.target;
  const PipelineConfig& config = setup.config;
  auto make_model = [&] { return testing::f16_overflow(sgd).model; };
  auto train_steps = [&](Pipeline& pipeline, int steps) {
    for (int s = 0; s < steps; ++s) pipeline.train_step(input, target);
    return pipeline.coordinator().grad_scaler().get_scale();
  };

  auto straight_model = make_model();
  Pipeline straight(straight_model, config);
  const double straight_scale = train_steps(straight, 14);
  REQUIRE(straight_scale == 64);
  {
    auto model = make_model();
    Pipeline first(model, config);
    REQUIRE(train_steps(first, 6) == 1024);
    auto [weights, optimizer] = first.coordinator().fetch_state();
    save_checkpoint(path, {model->config(), weights, config.optimizer, optimizer, 6, 0, 0,
                           json::object(), first.coordinator().grad_scaler().state_dict()});
  }
  auto resume = [&](bool restore_scale) {
    const Checkpoint checkpoint = load_checkpoint(path);
    auto model = std::dynamic_pointer_cast<Sequential>(build_module(checkpoint.model_config));
    REQUIRE(model);
    model->load_state_dict(checkpoint.weights);
    Pipeline pipeline(model, config, Launch::threads(), checkpoint.optimizer_state);
    if (restore_scale) pipeline.coordinator().grad_scaler().load_state_dict(checkpoint.grad_scaler);
    const double scale = train_steps(pipeline, 8);
    return std::pair{snapshot(model->state_dict()), scale};
  };
  const auto [resumed, resumed_scale] = resume(true);
  CHECK(resumed_scale == straight_scale);
  testing::check_bitwise_equal(resumed, straight_model->state_dict());
  // Without the scale the resumed run starts again at 65536 and skips its eight steps.
  const auto [restarted, restarted_scale] = resume(false);
  CHECK(restarted_scale == 256);
  CHECK_FALSE(testing::bitwise_equal(restarted.begin()->second, resumed.begin()->second));
}

TEST_CASE("every truncated checkpoint is an error naming the file", "[checkpoint]") {
  const testing::TempDir dir("checkpoint_truncated");
  const std::string path = (dir / "whole.safetensors").string();
  CheckpointedRun run = fresh_run();
  save_checkpoint(path, checkpoint_of(run, 0));
  const std::string bytes = read_file(path);
  const std::string cut_path = (dir / "cut.safetensors").string();
  constexpr size_t kCuts = 40;
  for (size_t k = 0; k < kCuts; ++k) {
    const size_t n = bytes.size() * k / kCuts;
    INFO("truncated to " << n << " of " << bytes.size() << " bytes");
    std::ofstream(cut_path, std::ios::binary | std::ios::trunc).write(bytes.data(), long(n));
    CHECK_THROWS_WITH(load_checkpoint(cut_path), Catch::Contains("cut.safetensors"));
  }
}

TEST_CASE("a writer that crashed mid-save leaves the previous checkpoint intact", "[checkpoint]") {
  const testing::TempDir dir("checkpoint_crash");
  const std::string path = (dir / "ckpt.safetensors").string();
  CheckpointedRun run = fresh_run();
  train(*run.model, *run.optimizer, run.data, 1);
  const Checkpoint previous = checkpoint_of(run, 1);
  save_checkpoint(path, previous);
  train(*run.model, *run.optimizer, run.data, 1);
  const Checkpoint next = checkpoint_of(run, 2);
  const std::string next_bytes = [&] {
    const std::string scratch = (dir / "scratch.safetensors").string();
    save_checkpoint(scratch, next);
    std::string bytes = read_file(scratch);
    fs::remove(scratch);
    return bytes;
  }();

  // write_file_atomic's temporaries are ".<name>.tmp.<pid>.<n>" beside the target: leave half
  // of the next checkpoint under such names, as writers killed before their rename would (one
  // of another process, one of an earlier process with this pid, one of the old naming).
  const std::string pid = std::to_string(::getpid());
  const std::vector<std::string> stale = {".ckpt.safetensors.tmp." + std::to_string(::getpid() + 1),
                                          ".ckpt.safetensors.tmp." + pid + ".0",
                                          ".ckpt.safetensors.tmp." + pid};
  for (const std::string& name : stale) {
    std::ofstream(dir / name, std::ios::binary)
        .write(next_bytes.data(), long(next_bytes.size() / 2));
    const Checkpoint loaded = load_checkpoint(path);
    CHECK(loaded.step == 1);
    testing::check_bitwise_equal(loaded.weights, previous.weights);
    testing::check_bitwise_equal(loaded.optimizer_state, previous.optimizer_state);
  }
  save_checkpoint(path, next);
  const Checkpoint loaded = load_checkpoint(path);
  CHECK(loaded.step == 2);
  testing::check_bitwise_equal(loaded.weights, next.weights);
  // The save neither left a temporary of its own nor took a leftover for one.
  size_t entries = 0;
  for (const auto& entry : fs::directory_iterator(dir.path)) {
    const std::string name = entry.path().filename().string();
    INFO(name);
    CHECK((name == "ckpt.safetensors" || std::count(stale.begin(), stale.end(), name) == 1));
    ++entries;
  }
  CHECK(entries == 1 + stale.size());
}

TEST_CASE("missing or garbled checkpoint metadata is named in the error", "[checkpoint]") {
  const testing::TempDir dir("checkpoint_metadata");
  const std::string path = (dir / "ckpt.safetensors").string();
  CheckpointedRun run = fresh_run();
  const Checkpoint good = checkpoint_of(run, 0);

  struct Case {
    const char* key;
    std::function<void(json&, StateDict&)> edit;
    const char* fragment;
  };
  const std::vector<Case> cases = {
      {"step", [](json& m, StateDict&) { m.erase("step"); }, "is missing"},
      {"step", [](json& m, StateDict&) { m["step"] = "-3"; }, "must be in [0, "},
      {"step", [](json& m, StateDict&) { m["step"] = "two"; }, "not valid JSON"},
      {"step", [](json& m, StateDict&) { m["step"] = "2.5"; }, "64-bit integer"},
      {"rng_seed", [](json& m, StateDict&) { m["rng_seed"] = "-1"; }, "unsigned"},
      {"rng_offset", [](json& m, StateDict&) { m.erase("rng_offset"); }, "is missing"},
      {"model_config", [](json& m, StateDict&) { m["model_config"] = "{\"type\":"; },
       "not valid JSON"},
      {"model_config", [](json& m, StateDict&) { m["model_config"] = "[1, 2]"; },
       "module config object"},
      {"optimizer_config", [](json& m, StateDict&) { m.erase("optimizer_config"); }, "is missing"},
      {"extra", [](json& m, StateDict&) { m["extra"] = "{]"; }, "not valid JSON"},
      {"grad_scaler", [](json& m, StateDict&) { m["grad_scaler"] = "[65536]"; },
       "GradScaler state object"},
      {"version", [](json& m, StateDict&) { m["version"] = "2"; }, "reads only version 1"},
      {"version", [](json& m, StateDict&) { m.erase("version"); }, "is missing"},
      {"format", [](json& m, StateDict&) { m["format"] = "pipit-stage-package"; },
       "is not a pipit checkpoint"},
      {"stray", [](json&, StateDict& t) { t["stray"] = from_vector<float>({1}); },
       "none of the name prefixes"},
  };
  for (const Case& c : cases) {
    INFO(c.key << ": " << c.fragment);
    save_checkpoint(path, good);
    tamper(path, c.edit);
    CHECK_THROWS_WITH(load_checkpoint(path), Catch::Contains(c.key) &&
                                                 Catch::Contains(c.fragment) &&
                                                 Catch::Contains("ckpt.safetensors"));
  }
}

TEST_CASE("files that are not checkpoints are refused", "[checkpoint]") {
  const testing::TempDir dir("checkpoint_foreign");
  CheckpointedRun run = fresh_run();
  save_model(*run.model, dir.path.string());
  CHECK_THROWS_WITH(
      load_checkpoint((dir / "model.safetensors").string()),
      Catch::Contains("model.safetensors") && Catch::Contains("is not a pipit checkpoint"));
  CHECK_THROWS_WITH(load_checkpoint((dir / "absent.safetensors").string()),
                    Catch::Contains("absent.safetensors"));

  Checkpoint no_model = checkpoint_of(run, 0);
  no_model.model_config = nullptr;
  const std::string path = (dir / "ckpt.safetensors").string();
  CHECK_THROWS_WITH(save_checkpoint(path, no_model),
                    Catch::Contains("model_config") && Catch::Contains("ckpt.safetensors"));
  CHECK_FALSE(fs::exists(path));
}

TEST_CASE("writing and reading a large checkpoint report their bytes as they go", "[checkpoint]") {
  const std::string path = std::filesystem::temp_directory_path().string() + "/pipit_progress_" +
                           std::to_string(getpid()) + ".safetensors";
  Checkpoint checkpoint;
  checkpoint.model_config = {{"type", "Linear"}};
  Generator generator(3);
  checkpoint.weights["w"] = randn({5, 1 << 20}, &generator);  // 20 MiB: three 8 MiB pieces
  std::vector<std::pair<size_t, size_t>> written, read;
  save_checkpoint(path, checkpoint,
                  [&](size_t done, size_t total) { written.emplace_back(done, total); });
  const auto size = static_cast<size_t>(std::filesystem::file_size(path));
  const Checkpoint loaded =
      load_checkpoint(path, [&](size_t done, size_t total) { read.emplace_back(done, total); });
  CHECK(bitwise_equal(loaded.weights.at("w"), checkpoint.weights.at("w")));
  for (const auto* reports : {&written, &read}) {
    REQUIRE(reports->size() == 3);
    CHECK(reports->at(0).first == size_t{8} << 20);
    CHECK(reports->at(1).first == size_t{16} << 20);
    CHECK(reports->back().first == size);
    for (const auto& [done, total] : *reports) CHECK(total == size);
  }
  CHECK(read_file(path, [](size_t, size_t) {}) == read_file(path));
  std::filesystem::remove(path);
}
