#pragma once
// Stage packages: everything a worker process needs to build its Stage, sent as one
// safetensors blob in the checkpoint layout (serialize/checkpoint.h): tensors "model.<name>"
// and "optim.<name>", the rest as JSON text in "__metadata__", tagged
// {"format": "pipit-stage-package", "version": "6"} (6 added the replica, the replica count
// and optimizer sharding; a worker refuses every other version by number).
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/message.h"
#include "nn/sequential.h"
#include "pipeline/partition.h"
#include "pipeline/pipeline_config.h"
#include "pipeline/stage.h"
#include "tensor/state_dict.h"

namespace pipit {

struct StagePackage {
  int stage = 0, stages = 1, chunks_per_stage = 1;
  int replica = 0,
      replicas = 1;  // PipelineConfig::replicas: the worker is endpoint replica*p + stage
  bool shard_optimizer = false;  // StageSpec::shard_optimizer
  std::string schedule;
  std::string schedule_table;
  bool recompute = false;
  int max_deferred = 0;
  std::vector<nlohmann::json> chunk_configs;  // Sequential::config() of each local chunk
  StateDict weights;                          // the chunks' parameters (full-model names)
  nlohmann::json optimizer_config;
  StateDict optimizer_state;  // this stage's share; empty for a fresh optimizer
  nlohmann::json peers = nlohmann::json::object();  // e.g. {"0": "127.0.0.1:7001"}: opaque here
  std::string device = "cpu";  // where the worker runs the stage: Device::parse form
  DType compute_dtype = DType::f32;
  std::vector<TiedParameter> ties;  // this stage's sides of the model's ties
};

// The package of stage `stage`: its chunks as make_stage_spec cuts them (local chunk l is
// global chunk l * p + stage). `optimizer_state` may be the whole model's (a checkpoint's):
// only "step" and the entries of this stage's parameters ("<param>.<buffer>") are kept. The
// weights share storage with `model` until the package is encoded.
StagePackage make_stage_package(const Sequential& model, const std::vector<LayerRange>& ranges,
                                const PipelineConfig& config, int stage,
                                const StateDict& optimizer_state = {}, int replica = 0);

std::string encode_stage_package(const StagePackage& package);
// Validates the bytes and every metadata key; errors name `source` (a file or connection).
StagePackage decode_stage_package(const std::string& bytes, const std::string& source);

// Rebuilds the chunks with build_module and loads the weights strictly (every weight present,
// shapes equal, none left over); errors name the chunk and the module or weight. The
// optimizer state goes into the spec as it is: the Stage keeps its own parameters' entries.
StageSpec build_stage_spec(const StagePackage& package);

// A package as a StagePackage message (the tensors in the message, names and metadata in
// meta) and back, with every check decode_stage_package makes; the tensors are checked once,
// on their decoded form, not passed through the blob codec.
Message stage_package_message(const StagePackage& package);
StagePackage stage_package_from_message(const Message& message, const std::string& source);

}  // namespace pipit
