#pragma once
// StageSpec: everything a stage needs to run; a networked worker receives it as a stage
// package (remote/stage_package.h).
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "nn/sequential.h"
#include "pipeline/gradients/tied_parameters.h"
#include "pipeline/partition.h"
#include "pipeline/pipeline_config.h"
#include "tensor/device.h"
#include "tensor/state_dict.h"

namespace pipit {

struct StageSpec {
  int stage = 0;
  int stages = 1;  // p
  // Which copy of the pipeline this stage belongs to, of how many (PipelineConfig::replicas):
  // its endpoint is replica * p + stage, and it sums its gradients with the same stage of
  // every other replica after each step's last backward (gradients/replica_group.h).
  int replica = 0;
  int replicas = 1;
  // ZeRO-1 over the replica group (PipelineConfig::shard_optimizer): the optimizer holds this
  // replica's share of the parameters (ReplicaGroup::shard_owners) and the group gathers the
  // updated ones after each step.
  bool shard_optimizer = false;
  int chunks_per_stage = 1;  // v
  std::string schedule = "1f1b";
  std::string schedule_table;  // for schedule "table"
  // Keep only each chunk's input and run its forward again before the backward.
  bool recompute = false;
  int max_deferred = 0;  // PipelineConfig::max_deferred
  // Local chunk l is global chunk global_chunk(stage, l, p, placement_of(schedule))
  // (pipeline/schedules/task.h): l * p + stage, or with "zbv" stage and then 2p - 1 - stage.
  std::vector<std::shared_ptr<Sequential>> chunks;
  nlohmann::json optimizer;
  // Restored into the optimizer when not empty: "step" and the entries of this stage's
  // parameters ("<param>.<buffer>"); entries of other stages' parameters are ignored, so a
  // whole model's optimizer state (a checkpoint's) can be given to every stage.
  StateDict optimizer_state;
  // Where the chunks and their optimizer live, and the autocast dtype (f32: off) of the
  // stage's thread.
  Device device = Device::cpu();
  DType compute_dtype = DType::f32;
  // > 1: every layer takes this many times as long (pipeline/rebalancing/layer_timer.h), as on a
  // slower machine.
  double slowdown = 1.0;
  // The model's ties that this stage holds a side of (gradients/tied_parameters.h).
  std::vector<TiedParameter> ties;
};

// The spec of stage `stage` of replica `replica`: its chunks as slices of `model` (`ranges`:
// each global chunk's layers), the schedule and optimizer.
StageSpec make_stage_spec(const Sequential& model, const std::vector<LayerRange>& ranges,
                          const PipelineConfig& config, int stage,
                          const StateDict& optimizer_state = {}, int replica = 0);

}  // namespace pipit
