#include "pipeline/pipeline_config.h"

#include "pipeline/schedules/schedule.h"
#include "tensor/device.h"
#include "tensor/error.h"

namespace pipit {

void validate(const PipelineConfig& config) {
  PIPIT_CHECK(config.stages >= 1, "PipelineConfig: stages must be >= 1, got ", config.stages);
  PIPIT_CHECK(config.microbatches >= 1, "PipelineConfig: microbatches must be >= 1, got ",
              config.microbatches);
  PIPIT_CHECK(config.replicas >= 1 && config.replicas <= kMaxReplicas,
              "PipelineConfig: replicas must be in [1, ", kMaxReplicas, "], got ", config.replicas);
  PIPIT_CHECK(config.rank_layout == "stages" || config.rank_layout == "pipelines",
              "PipelineConfig: rank_layout must be \"stages\" or \"pipelines\", got \"",
              config.rank_layout, "\"");
  PIPIT_CHECK(!config.shard_optimizer || config.replicas > 1,
              "PipelineConfig: shard_optimizer shares the optimizer out over the replicas; it "
              "needs replicas > 1, got ",
              config.replicas);
  PIPIT_CHECK(config.chunks_per_stage >= 1, "PipelineConfig: chunks_per_stage must be >= 1, got ",
              config.chunks_per_stage);
  PIPIT_CHECK(config.partition == "uniform" || config.partition == "parameters",
              "PipelineConfig: unknown partition '", config.partition,
              "' (expected uniform or parameters)");
  if (!config.layer_counts.empty()) {
    const size_t chunks = static_cast<size_t>(config.stages) * config.chunks_per_stage;
    PIPIT_CHECK(config.layer_counts.size() == chunks, "PipelineConfig: layer_counts has ",
                config.layer_counts.size(), " entries, but ", config.stages, " stages x ",
                config.chunks_per_stage, " chunks per stage make ", chunks, " chunks");
    for (size_t c = 0; c < chunks; ++c) {
      PIPIT_CHECK(config.layer_counts[c] >= 1, "PipelineConfig: layer_counts[", c, "] is ",
                  config.layer_counts[c], "; every chunk needs at least 1 layer");
    }
  }
  for (size_t s = 0; s < config.slowdown.size(); ++s) {
    PIPIT_CHECK(config.slowdown[s] >= 1 && config.slowdown[s] <= 1000, "PipelineConfig: slowdown[",
                s, "] is ", config.slowdown[s], "; it must be in [1, 1000]");
  }
  PIPIT_CHECK(config.profile_every >= 0, "PipelineConfig: profile_every must be >= 0, got ",
              config.profile_every);
  PIPIT_CHECK(config.max_grad_norm >= 0, "PipelineConfig: max_grad_norm must be >= 0, got ",
              config.max_grad_norm);
  PIPIT_CHECK(config.timeout.count() > 0, "PipelineConfig: timeout must be positive");
  PIPIT_CHECK(config.dtype == "f32" || config.dtype == "bf16" || config.dtype == "f16",
              "PipelineConfig: unknown dtype '", config.dtype, "' (expected f32, bf16 or f16)");
  for (const std::string& device : config.devices) {
    try {
      Device::parse(device);
    } catch (const Error& e) {
      throw Error(std::string("PipelineConfig: devices: ") + e.what());
    }
  }
  // In double: p * m * v can exceed int64, and the bound needs no exact count.
  const double tasks =
      2.0 * config.stages * config.microbatches * config.chunks_per_stage * config.replicas;
  PIPIT_CHECK(tasks <= static_cast<double>(kMaxScheduleTasks), "PipelineConfig: ", config.stages,
              " stages x ", config.microbatches, " microbatches x ", config.chunks_per_stage,
              " chunks per stage x ", config.replicas, " replicas make ", tasks,
              " tasks, more than ", kMaxScheduleTasks);
  PIPIT_CHECK(config.recompute == "none" || config.recompute == "full",
              "PipelineConfig: recompute must be \"none\" or \"full\", got \"", config.recompute,
              "\"");
  // Building the schedule checks the name and the (p, m, v) combination.
  make_schedule(config.schedule, config.stages, config.microbatches, config.chunks_per_stage,
                config.schedule_table, config.max_deferred);
}

}  // namespace pipit
