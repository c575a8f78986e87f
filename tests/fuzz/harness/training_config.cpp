// The training configuration harness: a PipelineConfig, with its loss and optimizer configs,
// from JSON text. validate() must refuse what cannot run; make_loss and make_optimizer build
// from their configs, and what they build writes a config() that builds the same again.
// PipelineConfig has no JSON reader of its own, so the harness maps fields of the right JSON
// type onto it (a program would parse flags the same way) and skips inputs it cannot map.
#include <limits>
#include <optional>

#include "loss/loss.h"
#include "optim/optimizer.h"
#include "pipeline/pipeline_config.h"
#include "pipeline/schedules/schedule.h"
#include "pipit.h"
#include "tests/fuzz/harness/check.h"

namespace pipit::fuzz {
namespace {

using nlohmann::json;

// The harness's own mapping; nothing here is under test.
std::optional<PipelineConfig> to_config(const json& fields) {
  if (!fields.is_object()) return std::nullopt;
  PipelineConfig config;
  const auto integer = [&](const char* name, int* out) {
    if (!fields.contains(name)) return true;
    const json& value = fields[name];
    if (!value.is_number_integer()) return false;
    if (value.is_number_unsigned()) {
      if (value.get<uint64_t>() > uint64_t(std::numeric_limits<int>::max())) return false;
    } else if (value.get<int64_t>() < std::numeric_limits<int>::min() ||
               value.get<int64_t>() > std::numeric_limits<int>::max()) {
      return false;
    }
    *out = value.get<int>();
    return true;
  };
  const auto text = [&](const char* name, std::string* out) {
    if (!fields.contains(name)) return true;
    if (!fields[name].is_string()) return false;
    *out = fields[name].get<std::string>();
    return true;
  };
  if (!integer("stages", &config.stages) || !integer("microbatches", &config.microbatches) ||
      !integer("chunks_per_stage", &config.chunks_per_stage) ||
      !text("schedule", &config.schedule) || !text("partition", &config.partition) ||
      !text("dtype", &config.dtype) || !text("recompute", &config.recompute) ||
      !text("schedule_table", &config.schedule_table)) {
    return std::nullopt;
  }
  if (fields.contains("loss")) config.loss = fields["loss"];
  if (fields.contains("optimizer")) config.optimizer = fields["optimizer"];
  if (fields.contains("max_grad_norm")) {
    if (!fields["max_grad_norm"].is_number()) return std::nullopt;
    config.max_grad_norm = fields["max_grad_norm"].get<double>();
  }
  if (fields.contains("timeout_ms")) {
    // Non-negative integers parse as unsigned; those past int64 are not a duration.
    const json& timeout = fields["timeout_ms"];
    if (!timeout.is_number_integer() ||
        (timeout.is_number_unsigned() &&
         timeout.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))) {
      return std::nullopt;
    }
    config.timeout = std::chrono::milliseconds(timeout.get<int64_t>());
  }
  if (fields.contains("trace")) {
    if (!fields["trace"].is_boolean()) return std::nullopt;
    config.trace = fields["trace"].get<bool>();
  }
  if (fields.contains("devices")) {
    if (!fields["devices"].is_array()) return std::nullopt;
    for (const json& device : fields["devices"]) {
      if (!device.is_string()) return std::nullopt;
      config.devices.push_back(device.get<std::string>());
    }
  }
  return config;
}

// Whether `config` is small enough to simulate its schedule on every input.
bool small(const PipelineConfig& config) {
  return int64_t{config.stages} * config.microbatches * config.chunks_per_stage <= 4096;
}

}  // namespace

bool fuzz_training_config(const uint8_t* data, size_t size) {
  const json fields = json::parse(data, data + size, nullptr, false);
  if (fields.is_discarded()) return false;
  const std::optional<PipelineConfig> config = to_config(fields);
  if (!config) return false;

  const bool valid = refuses_only_with("validate(PipelineConfig)", [&] { validate(*config); });
  if (valid && small(*config)) {
    // What validate accepts, the stages must be able to run.
    must_not_throw("validate_schedule of a schedule validate() accepts", [&] {
      validate_schedule(make_schedule(config->schedule, config->stages, config->microbatches,
                                      config->chunks_per_stage, config->schedule_table),
                        config->stages, config->microbatches, config->chunks_per_stage);
    });
  }

  std::unique_ptr<Loss> loss;
  refuses_only_with("make_loss", [&] { loss = make_loss(config->loss); });
  if (loss) {
    must_not_throw("make_loss of a loss's config()", [&] {
      require(make_loss(loss->config())->config() == loss->config(),
              "a loss's config() makes a loss with another config");
    });
  }

  Tensor parameter = from_vector<float>({0.5f, -1, 2, 0}, {2, 2}).requires_grad_();
  std::unique_ptr<Optimizer> optimizer;
  refuses_only_with("make_optimizer", [&] {
    optimizer = make_optimizer(config->optimizer, {{"w", parameter}});
  });
  if (optimizer) {
    must_not_throw("make_optimizer of an optimizer's config(), and a step", [&] {
      const json written = optimizer->config();
      require(make_optimizer(written, {{"w", parameter}})->config() == written,
              "an optimizer's config() makes an optimizer with another config: " + written.dump());
      sum(parameter).backward();
      optimizer->step();
    });
  }
  return valid && loss && optimizer;
}

std::vector<std::string> training_config_seeds() {
  const auto seed = [](const PipelineConfig& c) {
    return json{{"stages", c.stages},
                {"microbatches", c.microbatches},
                {"chunks_per_stage", c.chunks_per_stage},
                {"schedule", c.schedule},
                {"schedule_table", c.schedule_table},
                {"recompute", c.recompute},
                {"partition", c.partition},
                {"loss", c.loss},
                {"optimizer", c.optimizer},
                {"max_grad_norm", c.max_grad_norm},
                {"timeout_ms", c.timeout.count()},
                {"trace", c.trace},
                {"devices", c.devices},
                {"dtype", c.dtype}}
        .dump();
  };
  return {seed({}),
          seed({.stages = 2,
                .microbatches = 2,
                .schedule = "table",
                .schedule_table = "F0 F1 I0 W0 I1 W1  # stage 0\nF0 I0 F1 I1 W0 W1\n",
                .recompute = "full"}),
          seed({.stages = 4,
                .microbatches = 8,
                .chunks_per_stage = 2,
                .schedule = "interleaved",
                .partition = "parameters",
                .loss = {{"type", "CrossEntropyLoss"}, {"ignore_index", -1}},
                .optimizer = {{"type", "AdamW"},
                              {"lr", 3e-4},
                              {"beta1", 0.9},
                              {"beta2", 0.95},
                              {"eps", 1e-8},
                              {"weight_decay", 0.1}},
                .max_grad_norm = 1.0,
                .trace = true,
                .devices = {"cpu", "cuda:1"},
                .dtype = "bf16"}),
          seed({.stages = 3,
                .microbatches = 5,
                .schedule = "gpipe",
                .loss = {{"type", "MSELoss"}},
                .optimizer = {{"type", "SGD"}, {"lr", 0.1}, {"momentum", 0.9}, {"weight_decay", 0}},
                .dtype = "f16"})};
}

}  // namespace pipit::fuzz
