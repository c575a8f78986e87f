#include "pipeline/stage_spec.h"

#include "pipeline/schedules/task.h"

namespace pipit {

StageSpec make_stage_spec(const Sequential& model, const std::vector<LayerRange>& ranges,
                          const PipelineConfig& config, int stage, const StateDict& optimizer_state,
                          int replica) {
  StageSpec spec;
  spec.stage = stage;
  spec.stages = config.stages;
  spec.replica = replica;
  spec.replicas = config.replicas;
  spec.shard_optimizer = config.shard_optimizer && config.replicas > 1;
  spec.chunks_per_stage = config.chunks_per_stage;
  spec.schedule = config.schedule;
  spec.schedule_table = config.schedule_table;
  spec.recompute = config.recompute == "full";
  spec.max_deferred = config.max_deferred;
  spec.optimizer = config.optimizer;
  for (int local = 0; local < config.chunks_per_stage; ++local) {
    const int global = global_chunk(stage, local, config.stages, placement_of(config.schedule));
    const LayerRange& range = ranges.at(static_cast<size_t>(global));
    spec.chunks.push_back(model.untied_slice(range.begin, range.end));
  }
  for (const TiedParameter& tie : tied_parameters(model, ranges, config)) {
    if (tie.source_stage == stage || tie.copy_stage == stage) spec.ties.push_back(tie);
  }
  spec.optimizer_state = optimizer_state;
  if (!config.devices.empty()) {
    spec.device = Device::parse(config.devices[static_cast<size_t>(stage) % config.devices.size()]);
  }
  if (!config.slowdown.empty()) {
    spec.slowdown = config.slowdown[static_cast<size_t>(stage) % config.slowdown.size()];
  }
  spec.compute_dtype = dtype_from_name(config.dtype == "f32"    ? "F32"
                                       : config.dtype == "bf16" ? "BF16"
                                                                : "F16");
  return spec;
}

}  // namespace pipit
